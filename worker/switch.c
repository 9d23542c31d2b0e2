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

/* ---- the intent ---------------------------------------------------------------------- */

static int32_t *dup_ranks(const int32_t *a, uint32_t n)
{
    int32_t *c = tide_malloc((n ? n : 1) * sizeof *c);
    if (c != NULL && n > 0)
        memcpy(c, a, n * sizeof *c);
    return c;
}

tide_status tide__intent_from_msg(tide__intent *in, uint64_t gen, const tide_proto_layout_msg_t *pl,
                                  int old_member)
{
    memset(in, 0, sizeof *in);
    tide_status rc = tide__layout_from_proto(&pl->prev, &in->prev);
    if (rc == TIDE_OK)
        rc = tide__layout_from_proto(&pl->layout, &in->next);
    if (rc == TIDE_OK && pl->n_join_new > 0) {
        in->world = pl->world;
        in->n_join_old = pl->n_join_old;
        in->n_join_new = pl->n_join_new;
        in->join_old = dup_ranks(pl->join_old, pl->n_join_old);
        in->join_new = dup_ranks(pl->join_new, pl->n_join_new);
        if (in->join_old == NULL || in->join_new == NULL)
            rc = tide_errorf(TIDE_ERR_NOMEM, "out of memory for generation %llu's join",
                             (unsigned long long)gen);
    }
    if (rc == TIDE_OK && pl->n_leave > 0) {
        in->n_stay = pl->n_stay;
        in->n_leave = pl->n_leave;
        in->stay = dup_ranks(pl->stay, pl->n_stay);
        in->leave = dup_ranks(pl->leave, pl->n_leave);
        if (in->stay == NULL || in->leave == NULL)
            rc = tide_errorf(TIDE_ERR_NOMEM, "out of memory for generation %llu's release",
                             (unsigned long long)gen);
    }
    if (rc != TIDE_OK) {
        tide__intent_clear(in);
        in->gen = gen;
        return rc;
    }
    in->gen = gen;
    in->old_member = old_member;
    snprintf(in->ckpt, sizeof in->ckpt, "%s", pl->ckpt);
    in->ckpt_step = in->ckpt[0] != '\0' ? (int64_t)pl->ckpt_step : 0;
    return TIDE_OK;
}

void tide__intent_clear(tide__intent *in)
{
    tide_layout_destroy(&in->prev);
    tide_layout_destroy(&in->next);
    tide_free(in->join_old);
    tide_free(in->join_new);
    tide_free(in->stay);
    tide_free(in->leave);
    memset(in, 0, sizeof *in);
}

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

static tide_status rt_join(void *ctx, const tide__join_req *jr, tide__join_result *out)
{
    return tide__join_connect(ctx, jr, out);
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

/* Under ctl's lock, so that the control thread's aborts see either the switching
   generation with its new groups published, or the switched one with them installed. */
static tide_status rt_commit(void *ctx, uint64_t gen, int rollback, int64_t rb_step,
                             void (*install)(void *arg), void *arg, int64_t *step)
{
    tide_t *t = ctx;
    tide__ctl_lock(t->ctl);
    tide__agree *a = tide__ctl_agree(t->ctl);
    if (a->p_gen != gen || !a->p_switching) {
        tide__ctl_unlock(t->ctl);
        return tide_errorf(TIDE_ERR_ABORTED,
                           "tided aborted generation %llu while this rank switched",
                           (unsigned long long)gen);
    }
    install(arg);
    tide__agree_switched(a);
    if (rollback) {
        a->completed = rb_step; /* the state is the checkpoint's: so is the step */
        tide__ckpt_rolled_back(t, rb_step);
    }
    *step = a->completed;
    tide__ctl_unlock(t->ctl);
    return TIDE_OK;
}

static void rt_failed(void *ctx, uint64_t gen)
{
    tide_t *t = ctx;
    tide__ctl_lock(t->ctl);
    tide__agree *a = tide__ctl_agree(t->ctl);
    if (a->p_gen == gen)
        tide__agree_switch_failed(a);
    tide__ctl_unlock(t->ctl);
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
}

/* ---- the transaction ------------------------------------------------------------------ */

void tide__switch_begin(tide__switch *tx, tide_t *t, tide__intent *in,
                        const tide__switch_port *port, void *const *new_bufs)
{
    memset(tx, 0, sizeof *tx);
    tx->t = t;
    tx->port = *port;
    tx->in = *in;
    memset(in, 0, sizeof *in);
    tide__fill_view(&tx->nv, tx->in.gen, tx->in.next, t->rank, 0);
    tx->new_bufs = new_bufs;
    tx->in_place = new_bufs == NULL && t->owned;
    tx->t0 = tide_now_ns();
    tx->old_end = MPI_COMM_NULL;
    if (t->moved != NULL) /* tide_buffer_moved reports this switch, failed or not */
        memset(t->moved, 0, t->n_tensors);
}

void tide__switch_log(tide__switch *tx, tide__undo_fn fn)
{
    /* the phases push at most one entry per acquisition kind: a full log is a bug */
    if (tx->n_undo >= TIDE__UNDO_MAX) {
        TIDE_ERROR(SUBSYS, "switch undo log full (%d entries): an acquisition was logged twice",
                   tx->n_undo);
        abort();
    }
    tx->undo[tx->n_undo++] = fn;
}

tide_status tide__switch_undo(tide__switch *tx, tide_status rc)
{
    tide_t *t = tx->t;
    uint64_t gen = tx->in.gen;
    char detail[512];
    snprintf(detail, sizeof detail, "%s", tide_last_error());
    TIDE_WARN(SUBSYS, "rank %d could not switch to generation %llu: %s: %s", t->rank,
              (unsigned long long)gen, tide_strerror(rc), detail);
    while (tx->n_undo > 0)
        tx->undo[--tx->n_undo](tx);
    tx->port.failed(tx->port.ctx, gen);
    t->has_next = 0;
    tx->port.done(tx->port.ctx, gen, rc, 0, (double)(tide_now_ns() - tx->t0) / 1e6);
    if (t->owned)
        tide_mem_pool_spill_release(t->mem);
    if (tx->in.ckpt[0] != '\0' && rc == TIDE_ERR_INVALID)
        /* tided abandons the generation and rolls back to the checkpoint before this one:
           for the program, an aborted switch like any other (nothing moved) */
        return tide_errorf(TIDE_ERR_ABORTED,
                           "generation %llu abandoned: %s (tided tries the checkpoint before it)",
                           (unsigned long long)gen, detail);
    return tide_errorf(rc, "%s", detail);
}

void tide__switch_end(tide__switch *tx, tide_reshard_stats *stats)
{
    if (stats != NULL)
        *stats = tx->st;
    /* the old shards after a rollback in place, or the unused new ones */
    tide_free_buffers(tx->t, &tx->rb_fresh);
    tide_free(tx->side_ids);
    tide_free(tx->alive);
    tide_free(tx->parts);
    tide_free(tx->rank_of);
    tide_plan_destroy(&tx->plan);
    if (!tx->committed) {
        /* the program may still read the new layout through the next view it took */
        tide_layout_destroy(&tx->t->parked);
        tx->t->parked = tx->in.next;
        tx->in.next = NULL;
    }
    tide__intent_clear(&tx->in);
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
    tide__switch_begin(&tx, t, &t->next, &port, new_bufs); /* the intent, taken by value */
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
