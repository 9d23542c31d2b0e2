/*
 * worker/ctl_tided: what the control thread does with tided's messages. It owns no
 * training state: each command becomes an intent, a decoded message posted to the
 * training thread's mailbox, which applies it to its step agreement at its next step
 * boundary. What must happen at once happens here, from what the training thread
 * publishes of its steps (tide__progress, read inside the mailbox's lock): a prepare's
 * ack (held while the generation's preparation runs, see prep.h), the abort of a step in
 * progress that a recovery makes useless, the abort of a generation (its word: every
 * communicator built for it ends), a duplicate commit's resent done, and a failure report
 * when tided aborts a generation this rank already switched to.
 *
 * Workload: a handful of messages per resize; the rest are replies routed to the training
 * thread.
 */
#include <stdio.h>
#include <string.h>

#include <zmq.h>

#include "core/clock.h"
#include "core/error.h"
#include "core/log.h"
#include "worker/ctl_int.h"

static int layout_has(const tide_proto_layout_t *l, int32_t rank)
{
    size_t n = (size_t)l->dp * (size_t)l->tp * (size_t)l->pp;
    for (size_t i = 0; i < n; i++)
        if (l->worker[i] == rank)
            return 1;
    return 0;
}

/* 1 when job is the one this rank runs. */
static int my_job(tide__ctl_t *ctl, const char *job)
{
    pthread_mutex_lock(&ctl->mu);
    int mine = strcmp(job, ctl->job) == 0;
    pthread_mutex_unlock(&ctl->mu);
    return mine;
}

static void pend_clear(tide__ctl_t *ctl)
{
    tide_msg_clear(&ctl->pend.layout);
    memset(&ctl->pend, 0, sizeof ctl->pend);
    tide_msg_init(&ctl->pend.layout, TIDE_MSG_NONE);
}

/* The training thread switched to the pending generation (or past it): nothing is pending
   for this thread any more. */
static void pend_sync(tide__ctl_t *ctl)
{
    if (ctl->pend.gen != 0 &&
        __atomic_load_n(&ctl->progress->gen, __ATOMIC_RELAXED) >= ctl->pend.gen)
        pend_clear(ctl);
}

/* A deep copy of a message (through its encoding: one reader, one writer). */
static tide_status copy_msg(const tide_msg_t *m, tide_msg_t *out)
{
    tide_proto_buf_t b;
    tide_proto_buf_init(&b);
    tide_status rc = tide_proto_encode(m, &b);
    if (rc == TIDE_OK)
        rc = tide_proto_decode(b.data, b.len, out);
    tide_proto_buf_destroy(&b);
    return rc;
}

/* ---- layout ----------------------------------------------------------------------------- */

typedef struct layout_ctx {
    tide__ctl_t *ctl;
    tide_msg_t *m;     /* tided's layout message (moved into the intent when accepted) */
    uint64_t replaced; /* the pending generation it replaces (0: none) */
    int accepted;
} layout_ctx;

/* Inside the mailbox's lock: the rule of tide__agree_layout on the training thread's
   published state (a newer generation than it runs and than any announced, and not while
   it runs a switch, even one tided aborted meanwhile: tided resends it). */
static int accept_layout(void *arg, tide_msg_t *out)
{
    layout_ctx *x = arg;
    tide__ctl_t *ctl = x->ctl;
    const tide_proto_layout_msg_t *lm = &x->m->u.layout;
    const tide__progress *pg = ctl->progress;
    uint64_t gen = lm->layout.gen;
    int switching = tide__gens_in_switch(ctl->gens);
    if (gen <= pg->gen || gen <= ctl->seen_gen || switching)
        return 0;
    /* layouts name job ranks: this pool's ranks start at the base tided gives it */
    int32_t me = lm->base + ctl->reg.rank;
    tide_msg_t copy;
    if (copy_msg(x->m, &copy) != TIDE_OK)
        return 0; /* out of memory: as if it never came (tided times the resize out) */
    x->replaced = ctl->pend.gen;
    pend_clear(ctl);
    ctl->pend.gen = gen;
    ctl->pend.member_new = layout_has(&lm->layout, me);
    ctl->pend.p_old = pg->member && pg->gen == lm->prev.gen && layout_has(&lm->prev, me);
    ctl->pend.layout = copy;
    ctl->seen_gen = gen;
    /* the word exists before anyone may build for the generation, so that an abort finds it */
    tide__gen_t *w = tide__gens_get(ctl->gens, gen);
    tide__gen_put(&w);
    *out = *x->m;
    tide_msg_init(x->m, TIDE_MSG_NONE);
    x->accepted = 1;
    return 1;
}

static void on_layout(tide__ctl_t *ctl, tide_msg_t *m)
{
    tide_proto_layout_msg_t *lm = &m->u.layout;
    if (!my_job(ctl, lm->job)) {
        TIDE_WARN(SUBSYS, "ignored a layout for job %s (this rank runs another)", lm->job);
        return;
    }
    if (!lm->has_prev) {
        if (__atomic_load_n(&ctl->progress->gen, __ATOMIC_RELAXED) == 0)
            tide__ctl_to_main(ctl, m); /* tide_join is waiting for it */
        return;
    }
    pend_sync(ctl);
    uint64_t gen = lm->layout.gen;
    int dp = lm->layout.dp, tp = lm->layout.tp, pp = lm->layout.pp;
    layout_ctx x = {ctl, m, 0, 0};
    tide__mailbox_push_with(ctl->intents, accept_layout, &x);
    /* what was built ahead for a generation this one replaces is given up */
    if (x.replaced != 0)
        tide__gens_abort(ctl->gens, x.replaced);
    if (x.accepted)
        TIDE_INFO(SUBSYS, "generation %llu pending (%d x %d x %d)", (unsigned long long)gen, dp, tp,
                  pp);
}

/* ---- prepare ---------------------------------------------------------------------------- */

/* Inside the mailbox's lock: the ack reports the steps the training thread has completed
   or can complete alone, and it learns of the ack before it begins another step. */
static int record_ack(void *arg, tide_msg_t *out)
{
    tide__ctl_t *ctl = arg;
    ctl->pend.acked = 1;
    ctl->pend.ack = tide__progress_reachable(ctl->progress);
    tide_msg_init(out, TIDE_MSG_PREPARE_ACK);
    out->u.prepare_ack.gen = ctl->pend.gen;
    out->u.prepare_ack.step = ctl->pend.ack > 0 ? (uint64_t)ctl->pend.ack : 0;
    return 1;
}

/* Acks the pending generation (again, for a duplicate prepare: the same step). */
static void ack_now(tide__ctl_t *ctl)
{
    if (!ctl->pend.acked)
        tide__mailbox_push_with(ctl->intents, record_ack, ctl);
    if (ctl->child.pid > 0) {
        /* tided preempts our offline work for this grow: ack once it has stopped */
        ctl->deferred_ack_gen = ctl->pend.gen;
        return;
    }
    tide__ctl_send_ack(ctl, ctl->pend.gen, ctl->pend.ack);
}

static void on_prepare(tide__ctl_t *ctl, const tide_proto_prepare_t *p)
{
    pend_sync(ctl);
    if (!my_job(ctl, p->job) || p->gen != ctl->pend.gen || ctl->pend.gen == 0) {
        TIDE_INFO(SUBSYS, "ignored prepare for generation %llu of %s", (unsigned long long)p->gen,
                  p->job);
        return;
    }
    int part = ctl->pend.member_new || ctl->pend.p_old;
    if (part && !ctl->pend.acked && ctl->prep != NULL) {
        /* This rank prepares the new layout (communicators, memory, the program's
           function) on the preparation thread while its steps go on; the ack, which bounds
           the steps left, waits for that, or for the end of the step running now. */
        tide__prep_start(ctl->prep, p->gen, &ctl->pend.layout.u.layout);
        if (!tide__prep_ready(ctl->prep, p->gen)) {
            if (!ctl->pend.held)
                TIDE_INFO(SUBSYS, "generation %llu: preparing before the ack",
                          (unsigned long long)p->gen);
            ctl->pend.held = 1;
            return;
        }
    }
    ctl->pend.held = 0;
    ack_now(ctl);
}

int tide__ctl_holding(const tide__ctl_t *ctl)
{
    return ctl->pend.held;
}

void tide__ctl_prep_tick(tide__ctl_t *ctl)
{
    if (!ctl->pend.held)
        return;
    pend_sync(ctl);
    if (ctl->pend.gen == 0 || !tide__prep_ready(ctl->prep, ctl->pend.gen))
        return;
    ctl->pend.held = 0;
    ack_now(ctl);
}

/* ---- commit and abort ------------------------------------------------------------------- */

typedef struct commit_ctx {
    tide__ctl_t *ctl;
    tide_msg_t *m; /* moved into the intent when posted */
    int abort_step, abort_build;
    uint64_t running;
} commit_ctx;

/* Inside the mailbox's lock: a step in progress that would complete past S can never count
   (a peer died) and its collectives must be abandoned; so must a recovery's step that can
   only end alone, and a build of the first layout's communicators that waits for a dead
   member. The training thread hears the commit before it begins another step. */
static int record_commit(void *arg, tide_msg_t *out)
{
    commit_ctx *x = arg;
    tide__ctl_t *ctl = x->ctl;
    const tide_proto_commit_t *c = &x->m->u.commit;
    const tide__progress *pg = ctl->progress;
    if (ctl->pend.committed)
        return 0; /* a duplicate before the switch: nothing new */
    ctl->pend.committed = 1;
    int64_t s = (int64_t)c->step;
    int old = ctl->pend.p_old;
    x->running = pg->gen;
    x->abort_step =
        old && pg->in_step &&
        (pg->completed >= s || (c->recover && pg->can_finish && pg->completed + 1 == s));
    x->abort_build = c->recover && old && pg->building;
    *out = *x->m;
    tide_msg_init(x->m, TIDE_MSG_NONE);
    return 1;
}

static void on_commit(tide__ctl_t *ctl, tide_msg_t *m)
{
    const tide_proto_commit_t *c = &m->u.commit;
    uint64_t gen = c->gen, step = c->step;
    pend_sync(ctl);
    int mine = my_job(ctl, c->job);
    if (mine && gen != 0 && gen == __atomic_load_n(&ctl->progress->gen, __ATOMIC_RELAXED)) {
        /* switched to it already: tided missed the done */
        pthread_mutex_lock(&ctl->mu);
        if (ctl->done_gen == gen && ctl->done_bytes != NULL)
            zmq_send(ctl->dealer, ctl->done_bytes, ctl->done_len, ZMQ_DONTWAIT);
        pthread_mutex_unlock(&ctl->mu);
        TIDE_INFO(SUBSYS, "commit generation %llu again: done resent", (unsigned long long)gen);
        return;
    }
    if (!mine || gen != ctl->pend.gen || gen == 0 || !ctl->pend.acked) {
        TIDE_INFO(SUBSYS, "ignored commit of generation %llu", (unsigned long long)gen);
        return;
    }
    commit_ctx x = {ctl, m, 0, 0, 0};
    tide__mailbox_push_with(ctl->intents, record_commit, &x);
    if (x.abort_step) {
        TIDE_WARN(SUBSYS,
                  "generation %llu switches after step %llu, inside the step this rank runs: a "
                  "peer failed; aborting the step's communicators",
                  (unsigned long long)gen, (unsigned long long)step);
        tide__gens_kill(ctl->gens, x.running);
    }
    if (x.abort_build) {
        TIDE_WARN(SUBSYS,
                  "recovery generation %llu while the first layout's communicators are built: "
                  "a member failed; abandoning them",
                  (unsigned long long)gen);
        tide__gens_kill(ctl->gens, x.running);
    }
    TIDE_INFO(SUBSYS, "commit generation %llu at step %llu", (unsigned long long)gen,
              (unsigned long long)step);
}

typedef struct abort_ctx {
    tide__ctl_t *ctl;
    tide_msg_t *m; /* moved into the intent when posted */
    tide__gen_state was;
} abort_ctx;

/* Inside the mailbox's lock, so that the training thread never decides to switch to a
   generation whose abort it has not heard of: the generation's word is set (unless it
   was switched to first), and the training thread hears of it. */
static int record_abort(void *arg, tide_msg_t *out)
{
    abort_ctx *x = arg;
    tide__ctl_t *ctl = x->ctl;
    uint64_t gen = x->m->u.abort_.gen;
    x->was = tide__gens_abort(ctl->gens, gen);
    if (gen != ctl->pend.gen || gen == 0)
        return 0;
    pend_clear(ctl);
    *out = *x->m;
    tide_msg_init(x->m, TIDE_MSG_NONE);
    return 1;
}

/* tided gave up a generation this rank switched to: its old state is gone, so it cannot go
   back; tided recovers the job around it. */
static void say_switched(tide__ctl_t *ctl, const tide_proto_abort_t *a)
{
    tide_msg_t f;
    tide_msg_init(&f, TIDE_MSG_FAILURE);
    pthread_mutex_lock(&ctl->mu);
    f.u.failure.worker = ctl->worker_id;
    pthread_mutex_unlock(&ctl->mu);
    snprintf(f.u.failure.job, sizeof f.u.failure.job, "%s", a->job);
    f.u.failure.gen = a->gen;
    f.u.failure.code = TIDE_ERR_STALE;
    snprintf(f.u.failure.reason, sizeof f.u.failure.reason,
             "generation %llu was aborted after this worker switched to it; its old state "
             "is gone",
             (unsigned long long)a->gen);
    tide__ctl_send_now(ctl, &f);
}

static void on_abort(tide__ctl_t *ctl, tide_msg_t *m)
{
    tide_proto_abort_t a = m->u.abort_; /* m goes to the training thread */
    TIDE_WARN(SUBSYS, "tided aborted generation %llu of %s: %s", (unsigned long long)a.gen, a.job,
              a.reason);
    if (!my_job(ctl, a.job))
        return;
    pend_sync(ctl);
    abort_ctx x = {ctl, m, TIDE__GEN_UNKNOWN};
    tide__mailbox_push_with(ctl->intents, record_abort, &x);
    if (x.was == TIDE__GEN_COMMITTED &&
        a.gen == __atomic_load_n(&ctl->progress->gen, __ATOMIC_RELAXED))
        say_switched(ctl, &a);
}

/* ---- what the training thread takes at its boundaries ----------------------------------- */

/* tided says the job cannot go on: every wait of the program ends with the reason, and
   collectives blocked on a dead peer end (every generation's word). */
static void on_halt(tide__ctl_t *ctl, tide_msg_t *m)
{
    const tide_proto_halt_t *h = &m->u.halt;
    pthread_mutex_lock(&ctl->mu);
    int mine = strcmp(h->job, ctl->job) == 0 && !ctl->halted;
    ctl->halted |= mine;
    pthread_mutex_unlock(&ctl->mu);
    if (!mine)
        return;
    TIDE_ERROR(SUBSYS, "tided halted job %s at generation %llu: %s", h->job,
               (unsigned long long)h->gen, h->reason);
    tide__gens_kill_all(ctl->gens);
    tide__mailbox_push(ctl->intents, m);
}

/* A message the training thread takes as it is (the job's end, the release of this rank's
   pool) when it is this rank's job's. */
static void pass_on(tide__ctl_t *ctl, tide_msg_t *m, const char *job)
{
    if (my_job(ctl, job))
        tide__mailbox_push(ctl->intents, m);
}

/* ---- checkpoint requests ---------------------------------------------------------------- */

typedef struct save_ctx {
    tide__ctl_t *ctl;
    tide_msg_t *m;
    int64_t done;
    int member;
    int closed; /* the training thread drained for the last time: no answer */
} save_ctx;

/* Inside the mailbox's lock: the proposal is queued for the training thread, which checks
   its requests at each boundary after the steps it has completed now (tide__ckpt_step_end
   runs after the drain of tide_step_end). */
static int queue_proposal(void *arg, tide_msg_t *out)
{
    save_ctx *x = arg;
    if (x->ctl->proposals_closed) {
        x->closed = 1;
        return 0;
    }
    x->done = __atomic_load_n(&x->ctl->progress->completed, __ATOMIC_RELAXED);
    x->member = x->ctl->progress->member;
    *out = *x->m;
    tide_msg_init(x->m, TIDE_MSG_NONE);
    return 1;
}

/* tided's checkpoint request: a proposal is answered at once with the steps completed
   (tided agrees on a step no member has reached); a decision goes to the training thread. */
static void on_save(tide__ctl_t *ctl, tide_msg_t *m)
{
    if (!my_job(ctl, m->u.save.job))
        return;
    if (m->u.save.phase != TIDE_PROTO_SAVE_PROPOSE || m->u.save.id == 0) {
        tide__mailbox_push(ctl->intents, m);
        return;
    }
    uint64_t id = m->u.save.id, step = m->u.save.step;
    save_ctx x = {ctl, m, 0, 0, 0};
    if (tide__mailbox_push_with(ctl->intents, queue_proposal, &x) != TIDE_OK)
        return; /* out of memory: no answer, and tided gives the request up */
    if (x.closed) {
        TIDE_INFO(SUBSYS, "the rank is leaving: checkpoint proposal %llu (step %llu) unanswered",
                  (unsigned long long)id, (unsigned long long)step);
        return;
    }
    tide__ctl_send_save_ack(ctl, id, step, x.done, x.member);
}

static void close_proposals(void *arg)
{
    ((tide__ctl_t *)arg)->proposals_closed = 1;
}

void tide__ctl_close_proposals(tide__ctl_t *ctl)
{
    tide__mailbox_locked(ctl->intents, close_proposals, ctl);
}

/* ---- the connection --------------------------------------------------------------------- */

static void on_registered(tide__ctl_t *ctl, const tide_proto_register_ok_t *r)
{
    pthread_mutex_lock(&ctl->mu);
    int fenced = ctl->fenced;
    if (!fenced) {
        ctl->worker_id = r->worker;
        ctl->registered = 1;
        ctl->ever_registered = 1;
        ctl->hb_ms = ctl->hb_fixed_ms > 0 ? ctl->hb_fixed_ms : r->heartbeat_ms;
        ctl->fail_ms = r->fail_ms;
    }
    pthread_cond_broadcast(&ctl->cv);
    pthread_mutex_unlock(&ctl->mu);
    if (fenced)
        return;
    TIDE_INFO(SUBSYS, "registered as worker %d (heartbeat %d ms, failure after %d ms)", r->worker,
              r->heartbeat_ms, r->fail_ms);
    /* tided counts from this message: so does the lease */
    ctl->last_hb_ns = tide_now_ns();
    ctl->self_ns = ctl->last_hb_ns; /* its own message: covered from here */
    tide_coll_lease_set(ctl->last_hb_ns + (uint64_t)r->fail_ms * 1000000ull);
    ctl->next_hb_ns = tide_now_ns();
}

static void on_error(tide__ctl_t *ctl, tide_msg_t *m)
{
    pthread_mutex_lock(&ctl->mu);
    int said_bye = ctl->bye, fenced = ctl->fenced;
    pthread_mutex_unlock(&ctl->mu);
    if ((m->u.error.code == TIDE_ERR_NOT_FOUND || m->u.error.code == TIDE_ERR_STALE) &&
        strstr(m->u.error.message, "register") != NULL && !fenced && !said_bye) {
        /* tided lost us (new state file) or declared us failed: register again */
        TIDE_WARN(SUBSYS, "tided: %s; registering again", m->u.error.message);
        pthread_mutex_lock(&ctl->mu);
        ctl->registered = 0;
        pthread_mutex_unlock(&ctl->mu);
        tide__ctl_register(ctl);
    } else {
        TIDE_INFO(SUBSYS, "tided error %d: %s", m->u.error.code, m->u.error.message);
    }
    tide__ctl_to_main(ctl, m);
}

void tide__ctl_on_tided(tide__ctl_t *ctl, tide_msg_t *m)
{
    switch (m->type) {
    case TIDE_MSG_REGISTER_OK:
        on_registered(ctl, &m->u.register_ok);
        break;
    case TIDE_MSG_FENCED: {
        char why[TIDE_PROTO_TEXT_MAX + 64];
        snprintf(why, sizeof why, "tided fenced worker %d: %s", m->u.fenced.worker,
                 m->u.fenced.reason);
        tide__ctl_fence(ctl, why, 0);
        break;
    }
    case TIDE_MSG_LAYOUT:
        on_layout(ctl, m);
        break;
    case TIDE_MSG_PREPARE:
        on_prepare(ctl, &m->u.prepare);
        break;
    case TIDE_MSG_COMMIT:
        on_commit(ctl, m);
        break;
    case TIDE_MSG_ABORT:
        on_abort(ctl, m);
        break;
    case TIDE_MSG_HALT:
        on_halt(ctl, m);
        break;
    case TIDE_MSG_SAVE:
        on_save(ctl, m);
        break;
    case TIDE_MSG_JOB_END:
        pass_on(ctl, m, m->u.job_end.job);
        break;
    case TIDE_MSG_RELEASE:
        pass_on(ctl, m, m->u.release.job);
        break;
    case TIDE_MSG_JOIN_PORT:
        if (my_job(ctl, m->u.join_port.job))
            tide__ctl_to_main(ctl, m); /* the join at the switch waits for it */
        break;
    case TIDE_MSG_OFFLINE_ASSIGN:
        tide__ctl_on_assign(ctl, m);
        break;
    case TIDE_MSG_PREEMPT:
        tide__ctl_on_preempt(ctl, m);
        break;
    case TIDE_MSG_ERROR:
        on_error(ctl, m);
        break;
    case TIDE_MSG_LIVENESS_REPLY:
    case TIDE_MSG_OK:
    case TIDE_MSG_STATUS_REPLY:
        tide__ctl_to_main(ctl, m);
        break;
    default:
        TIDE_WARN(SUBSYS, "unexpected '%s' from tided", tide_msg_type_name(m->type));
        break;
    }
}
