/*
 * worker/switch: tide_reshard, one rank's part of a layout switch, as a transaction
 * (switch_int.h): the generation's intent is taken once, the phases run in order
 * (switch_phases.c), and a failure runs the undo log backwards so that the rank goes on
 * in its old layout. Also the runtime's port of a switch: what it asks of tided through
 * the control client (liveness, done, checkpoint reports) and the agreement state it
 * commits in. Workload: once per resize; the data movement dominates.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/clock.h"
#include "core/error.h"
#include "core/log.h"
#include "worker/switch_int.h"

#define SUBSYS "worker"

/* ---- the runtime's port: tided through the control client --------------------------- */

/* Waits for tided's answer to the liveness request for ask[n] (sent by the caller) until
   deadline (monotonic ns); stale replies (an earlier switch's) are dropped. */
static tide_status liveness_reply(tide_t *t, const int32_t *ask, uint32_t n, uint64_t deadline,
                                  tide_msg_t *r)
{
    for (;;) {
        uint64_t now = tide_now_ns();
        if (now >= deadline)
            return tide_errorf(TIDE_ERR_TIMEOUT,
                               "tided did not answer a liveness request within %d ms (needed to "
                               "know which old members are alive)",
                               t->opts.register_timeout_ms);
        tide_status rc = tide__ctl_reply(t->ctl, r, (int)((deadline - now) / 1000000ull) + 1);
        if (rc == TIDE_ERR_TIMEOUT)
            continue;
        TIDE_CHECK(rc);
        if (r->type == TIDE_MSG_LIVENESS_REPLY && strcmp(r->u.liveness_reply.job, t->job) == 0 &&
            r->u.liveness_reply.n_ranks == n &&
            memcmp(r->u.liveness_reply.ranks, ask, n * sizeof *ask) == 0)
            return TIDE_OK;
        if (r->type == TIDE_MSG_ERROR) {
            rc = tide_errorf(TIDE_ERR_DENIED, "tided refused a liveness request: %s",
                             r->u.error.message);
            tide_msg_clear(r);
            return rc;
        }
        tide_msg_clear(r);
    }
}

/* tided answers for exactly the ranks asked: the decision never rests on a listing that
   could be cut, however many workers the cluster has. */
static tide_status rt_liveness(void *ctx, const int32_t *ranks, uint32_t n, uint8_t *alive)
{
    tide_t *t = ctx;
    tide_msg_t m;
    while (tide__ctl_reply(t->ctl, &m, 0) == TIDE_OK)
        tide_msg_clear(&m);
    tide_msg_init(&m, TIDE_MSG_LIVENESS);
    m.u.liveness.worker = tide__ctl_worker_id(t->ctl);
    snprintf(m.u.liveness.job, sizeof m.u.liveness.job, "%s", t->job);
    m.u.liveness.ranks = (int32_t *)ranks; /* borrowed: m is never cleared */
    m.u.liveness.n_ranks = n;
    TIDE_CHECK(tide__ctl_send(t->ctl, &m));
    uint64_t deadline = tide_now_ns() + (uint64_t)t->opts.register_timeout_ms * 1000000ull;
    tide_msg_t r;
    tide_msg_init(&r, TIDE_MSG_NONE);
    TIDE_CHECK(liveness_reply(t, ranks, n, deadline, &r));
    for (uint32_t i = 0; i < n; i++)
        alive[i] = r.u.liveness_reply.alive[i] != 0;
    tide_msg_clear(&r);
    return TIDE_OK;
}

static tide_status rt_join(void *ctx, const tide__join_req *jr, const int *cancel,
                           tide__join_result *out)
{
    return tide__join_connect(ctx, jr, cancel, out);
}

static void rt_done(void *ctx, uint64_t gen, tide_status rc, uint64_t bytes, double ms)
{
    tide_t *t = ctx;
    tide_msg_t m;
    tide_msg_init(&m, TIDE_MSG_DONE);
    m.u.done.worker = tide__ctl_worker_id(t->ctl);
    snprintf(m.u.done.job, sizeof m.u.done.job, "%s", t->job);
    m.u.done.gen = gen;
    m.u.done.status = rc < -1000 ? -1000 : (int)rc;
    m.u.done.bytes_moved = bytes;
    m.u.done.ms = ms < 0 ? 0 : ms;
    if (tide__ctl_send(t->ctl, &m) != TIDE_OK)
        TIDE_WARN(SUBSYS, "could not report done: %s", tide_last_error());
}

static void rt_load_failed(void *ctx, const tide_proto_saved_t *m)
{
    tide_t *t = ctx;
    tide__ctl_post_saved(t->ctl, m);
}

typedef struct switched_ctx {
    int rollback;
    int64_t rb_step, step;
    int64_t at; /* the boundary switched at (before a rollback's step) */
} switched_ctx;

static void switched(tide_t *t, void *ctx)
{
    switched_ctx *x = ctx;
    x->at = t->agree.p_switch;
    tide__agree_switched(&t->agree);
    if (x->rollback)
        t->agree.completed = x->rb_step; /* the state is the checkpoint's: so is the step */
    x->step = t->agree.completed;
}

/* The generation's word decides the race with tided's abort of it: committed first, the
   abort comes too late (the control thread reports the failure); aborted first, the
   switch fails here with nothing changed. */
static tide_status rt_commit(void *ctx, uint64_t gen, int rollback, int64_t rb_step,
                             void (*install)(void *arg), void *arg, int64_t *step)
{
    tide_t *t = ctx;
    if (t->next_word == NULL || !tide__gen_commit(t->next_word))
        return tide_errorf(TIDE_ERR_ABORTED,
                           "tided aborted generation %llu while this rank switched",
                           (unsigned long long)gen);
    install(arg);
    switched_ctx x = {rollback, rb_step, 0, 0};
    tide__agree_change(t, switched, &x);
    tide__ckpt_switched(t, x.at);
    if (rollback)
        tide__ckpt_rolled_back(t, rb_step);
    *step = x.step;
    return TIDE_OK;
}

static void switch_failed(tide_t *t, void *ctx)
{
    uint64_t gen = *(const uint64_t *)ctx;
    if (t->agree.p_gen == gen)
        tide__agree_switch_failed(&t->agree);
}

static void rt_failed(void *ctx, uint64_t gen)
{
    tide_t *t = ctx;
    tide__agree_change(t, switch_failed, &gen);
    if (t->next_word != NULL)
        tide__gen_switch_failed(t->next_word);
}

/* After the teardown: the old groups are gone, so is the need for their generation's word
   (nothing can abort an older generation any more); the new one's is the running one. */
static void rt_adopted(void *ctx)
{
    tide_t *t = ctx;
    tide__gen_put(&t->run_word);
    t->run_word = t->next_word;
    t->next_word = NULL;
    tide__gens_retire(t->gens, t->agree.gen);
    tide__rebase(t);
}

void tide__switch_port_runtime(tide_t *t, tide__switch_port *out)
{
    out->ctx = t;
    out->liveness = rt_liveness;
    out->join = rt_join;
    out->done = rt_done;
    out->load_failed = rt_load_failed;
    out->commit = rt_commit;
    out->failed = rt_failed;
    out->adopted = rt_adopted;
}

/* The program's buffers for the new layout, checked before anything starts: a mistake of
   the program (a missing table or buffer, memory of the wrong kind) is refused with nothing
   done, no peer waited for and nothing reported, so the switch stays pending and the call
   may be repeated with the right buffers. Checked later, it would fail the whole switch
   for every participant after its handshake. A layout that does not fit the collection
   is not the program's mistake: it is left to the switch itself, which fails on it. */
static tide_status check_new_bufs(const tide_t *t, void *const *new_bufs)
{
    const tide_view *nv = &t->next_view;
    const tide_layout_t *nl = t->next.next;
    if (new_bufs != NULL && t->owned)
        return tide_errorf(
            TIDE_ERR_INVALID,
            "tide_reshard: the runtime owns this rank's buffers (tide_give_buffers): "
            "pass NULL and it rebuilds them in place");
    if (!nv->member || t->owned || tide_layout_validate(nl, t->coll) != TIDE_OK) {
        tide_error_clear();
        return TIDE_OK;
    }
    if (new_bufs == NULL)
        return tide_errorf(TIDE_ERR_INVALID,
                           "tide_reshard: this rank is in the new layout: pass its new buffers "
                           "(or give the runtime its buffers: tide_give_buffers)");
    for (size_t i = 0; i < t->n_tensors; i++) {
        uint64_t n = tide_shard_bytes(nl, t->coll, i, nv->pp_rank, nv->dp_rank, nv->tp_rank);
        if (n > 0 && new_bufs[i] == NULL)
            return tide_errorf(TIDE_ERR_INVALID,
                               "tide_reshard: new buffer of tensor %s (%llu bytes) is NULL",
                               tide_collection_tensor(t->coll, i)->name, (unsigned long long)n);
        TIDE_CHECK(tide__check_buf(t, "tide_reshard", i, new_bufs[i], n));
    }
    return TIDE_OK;
}

tide_status tide_reshard(tide_t *t, void *const *new_bufs, tide_reshard_stats *stats)
{
    if (t == NULL || !t->has_next)
        return tide_errorf(TIDE_ERR_INVALID, "tide_reshard: call it after tide_step_begin "
                                             "returned TIDE_STEP_RECONFIGURE");
    TIDE_CHECK(check_new_bufs(t, new_bufs));
    tide__switch_port port;
    tide__switch_port_runtime(t, &port);
    tide__switch tx;
    tide__switch_begin(&tx, t, &t->next, t->next_word, &port, new_bufs); /* taken by value */
    tide_status rc = tide__switch_pools(&tx); /* connect a pool launched later, or release */
    if (rc == TIDE_OK)
        rc = tide__switch_participants(&tx); /* who takes part; which old members died */
    if (rc == TIDE_OK)
        rc = tide__switch_communicator(&tx); /* over the participants: built ahead, or now */
    if (rc == TIDE_OK)
        rc = tide__switch_state(&tx); /* move the old shards, or restore a checkpoint's */
    if (rc == TIDE_OK)
        rc = tide__switch_groups(&tx); /* the new layout's all, tp, dp, pp */
    if (rc == TIDE_OK)
        rc = tide__switch_commit(&tx); /* the point of no return, then the old is freed */
    if (rc != TIDE_OK)
        rc = tide__switch_undo(&tx, rc);
    tide__switch_end(&tx, rc == TIDE_OK ? stats : NULL);
    return rc;
}
