/*
 * worker/ctl_out: what the control thread sends, shared by its parts (ctl.c, ctl_tided.c,
 * ctl_offline.c): messages to tided, replies and intents to the training thread, a
 * registration, an ack, and the fence of a process that was given up.
 *
 * Workload: a few messages per heartbeat period.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include <zmq.h>

#include "core/clock.h"
#include "core/error.h"
#include "core/log.h"
#include "worker/ctl_int.h"

/* Encodes and sends m to tided without blocking; 1 when handed to ZeroMQ. */
int tide__ctl_send_now(tide__ctl_t *ctl, const tide_msg_t *m)
{
    if (tide_proto_encode(m, &ctl->buf) != TIDE_OK) {
        TIDE_ERROR(SUBSYS, "cannot encode '%s': %s", tide_msg_type_name(m->type),
                   tide_last_error());
        return 0;
    }
    if (zmq_send(ctl->dealer, ctl->buf.data, ctl->buf.len, ZMQ_DONTWAIT) < 0) {
        TIDE_WARN(SUBSYS, "dropped a '%s' to tided: %s", tide_msg_type_name(m->type),
                  zmq_strerror(errno));
        return 0;
    }
    return 1;
}

void tide__ctl_register(tide__ctl_t *ctl)
{
    pthread_mutex_lock(&ctl->mu);
    int fenced = ctl->fenced;
    pthread_mutex_unlock(&ctl->mu);
    ctl->next_reg_ns = tide_now_ns() + REGISTER_RETRY_MS * 1000000ull;
    if (fenced)
        return; /* a fenced process never rejoins the pool */
    tide_msg_t m;
    tide_msg_init(&m, TIDE_MSG_REGISTER);
    m.u.reg = ctl->reg;
    tide__ctl_send_now(ctl, &m);
    ctl->next_reg_ns = tide_now_ns() + REGISTER_RETRY_MS * 1000000ull;
}

int tide__ctl_is_fenced(tide__ctl_t *ctl)
{
    pthread_mutex_lock(&ctl->mu);
    int f = ctl->fenced;
    pthread_mutex_unlock(&ctl->mu);
    return f;
}

/* The training thread hears it as an intent (its next tide_step_begin fails with why). */
static int post_fenced(void *ctx, tide_msg_t *out)
{
    const char *why = ctx;
    tide_msg_init(out, TIDE_MSG_FENCED);
    snprintf(out->u.fenced.reason, sizeof out->u.fenced.reason, "%s", why);
    return 1;
}

/*
 * This process was given up: by tided (its "fenced" answer) or by its own lease (it sent
 * no heartbeat for tided's whole failure timeout, so tided may have declared it failed
 * and its peers abandoned it). From now on its communicators count as aborted (the lease
 * is set in the past: see tide_coll_lease_set), every generation's abort word is set (the
 * step's and the switch's operations end), and the program's next tide_step_begin fails
 * with why. tell: also report
 * the failure to tided, so that a job it did not fail yet recovers without this rank.
 */
void tide__ctl_fence(tide__ctl_t *ctl, const char *why, int tell)
{
    tide_msg_t f;
    tide_msg_init(&f, TIDE_MSG_FAILURE);
    pthread_mutex_lock(&ctl->mu);
    if (ctl->fenced) {
        pthread_mutex_unlock(&ctl->mu);
        return;
    }
    ctl->fenced = 1;
    snprintf(ctl->fence_reason, sizeof ctl->fence_reason, "%s", why);
    tide_coll_lease_set(1); /* expired: not one more call into MPI or NCCL */
    if (ctl->host != NULL)
        tide__hostbeat_inactive(ctl->host); /* no leader speaks for it any more */
    tide__gens_kill_all(ctl->gens);
    f.u.failure.worker = ctl->worker_id;
    snprintf(f.u.failure.job, sizeof f.u.failure.job, "%s", ctl->job);
    f.u.failure.gen = __atomic_load_n(&ctl->progress->gen, __ATOMIC_RELAXED);
    pthread_cond_broadcast(&ctl->cv);
    pthread_mutex_unlock(&ctl->mu);
    TIDE_ERROR(SUBSYS, "fenced: %s", why);
    tide__mailbox_push_with(ctl->intents, post_fenced, (void *)why);
    if (ctl->child.pid > 0) /* tided runs its offline job elsewhere now: never two copies */
        tide__child_preempt(&ctl->child, ctl->child.grace_ms, tide_now_ns());
    if (tell) {
        f.u.failure.code = TIDE_ERR_STALE;
        snprintf(f.u.failure.reason, sizeof f.u.failure.reason, "%s", why);
        tide__ctl_send_now(ctl, &f);
    }
}

void tide__ctl_to_main(tide__ctl_t *ctl, tide_msg_t *m)
{
    while (tide__mailbox_len(ctl->replies) >= REPLIES_MAX) {
        tide_msg_t old;
        if (tide__mailbox_pop(ctl->replies, &old, 0) != TIDE_OK)
            break;
        tide_msg_clear(&old);
    }
    if (tide__mailbox_push(ctl->replies, m) != TIDE_OK)
        tide_msg_clear(m);
}

/* This rank's worker id and job, as an answer to tided names them. */
static void sender_fields(tide__ctl_t *ctl, int32_t *worker, char *job, size_t cap)
{
    pthread_mutex_lock(&ctl->mu);
    *worker = ctl->worker_id;
    snprintf(job, cap, "%s", ctl->job);
    pthread_mutex_unlock(&ctl->mu);
}

void tide__ctl_send_ack(tide__ctl_t *ctl, uint64_t gen, int64_t step)
{
    tide_msg_t m;
    tide_msg_init(&m, TIDE_MSG_PREPARE_ACK);
    sender_fields(ctl, &m.u.prepare_ack.worker, m.u.prepare_ack.job, sizeof m.u.prepare_ack.job);
    m.u.prepare_ack.gen = gen;
    m.u.prepare_ack.step = step > 0 ? (uint64_t)step : 0;
    tide__ctl_send_now(ctl, &m);
    TIDE_INFO(SUBSYS, "prepare_ack generation %llu at step %lld", (unsigned long long)gen,
              (long long)step);
}

void tide__ctl_send_save_ack(tide__ctl_t *ctl, uint64_t id, uint64_t step, int64_t done, int member)
{
    tide_msg_t m;
    tide_msg_init(&m, TIDE_MSG_SAVE_ACK);
    sender_fields(ctl, &m.u.save_ack.worker, m.u.save_ack.job, sizeof m.u.save_ack.job);
    m.u.save_ack.id = id;
    m.u.save_ack.step = step;
    m.u.save_ack.done = done > 0 ? (uint64_t)done : 0;
    m.u.save_ack.member = member;
    tide__ctl_send_now(ctl, &m);
}
