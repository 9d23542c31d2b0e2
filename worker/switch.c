/*
 * worker/switch: tide_reshard, one rank's part of a layout switch. Every participant
 * (the new layout's members and the old layout's live members) takes one communicator
 * over all participants and its own part of the plan (reshard/), both built during the
 * preparation when they could be (prebuild.c), else made here; runs the plan through the
 * collectives executor from the registered old buffers into the program's new ones (or,
 * when the runtime owns the buffers, rebuilds them in place inside its memory pool,
 * within the larger of the rank's old and new state plus the staging cap); takes the new
 * layout's groups (built ahead, or split off the switch communicator here), and reports
 * `done` to tided. Workload: once per resize; the data movement dominates.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "collectives/executor.h"
#include "core/alloc.h"
#include "core/clock.h"
#include "core/error.h"
#include "core/log.h"
#include "worker/tide_int.h"

#define SUBSYS "worker"

static int cmp_i32(const void *a, const void *b)
{
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return x < y ? -1 : x > y;
}

/* Marks the old members that leave the layout and that tided reports gone (failed, left,
   or no longer in the job) as not alive; *lost = 1 when there is one. Only needed when
   some old member is not in the new layout (shrink or recovery). tided answers for exactly
   the ranks asked (a liveness request): the decision never rests on a listing that could
   be cut, however many workers the cluster has. */
static tide_status find_dead(tide_t *t, const tide_layout_t *prev, const tide_layout_t *nl,
                             int rollback, uint8_t *alive, int *lost)
{
    *lost = 0;
    size_t n_prev = tide_layout_size(prev);
    int32_t *ask = tide_malloc((n_prev ? n_prev : 1) * sizeof *ask);
    if (ask == NULL)
        return tide_errorf(TIDE_ERR_NOMEM, "out of memory listing the old members");
    uint32_t n = 0;
    for (size_t i = 0; i < n_prev; i++) {
        int32_t r = prev->worker[i];
        int p, d, tt;
        if (r < 0 || r >= t->size || tide_layout_find(nl, r, &p, &d, &tt) == TIDE_OK)
            continue;
        ask[n++] = r;
    }
    tide_error_clear();
    qsort(ask, n, sizeof *ask, cmp_i32);
    uint32_t k = 0;
    for (uint32_t i = 0; i < n; i++)
        if (k == 0 || ask[i] != ask[k - 1])
            ask[k++] = ask[i];
    n = k;
    if (n == 0) {
        tide_free(ask);
        return TIDE_OK;
    }
    tide_msg_t m;
    while (tide__ctl_reply(t->ctl, &m, 0) == TIDE_OK)
        tide_msg_clear(&m);
    tide_msg_init(&m, TIDE_MSG_LIVENESS);
    m.u.liveness.worker = tide__ctl_worker_id(t->ctl);
    snprintf(m.u.liveness.job, sizeof m.u.liveness.job, "%s", t->job);
    m.u.liveness.ranks = ask;
    m.u.liveness.n_ranks = n;
    tide_status rc = tide__ctl_send(t->ctl, &m); /* m borrows ask: never cleared */
    uint64_t deadline = tide_now_ns() + (uint64_t)t->opts.register_timeout_ms * 1000000ull;
    tide_msg_t r;
    tide_msg_init(&r, TIDE_MSG_NONE);
    while (rc == TIDE_OK) {
        uint64_t now = tide_now_ns();
        if (now >= deadline) {
            rc = tide_errorf(TIDE_ERR_TIMEOUT,
                             "tided did not answer a liveness request within %d ms (needed to "
                             "know which old members are alive)",
                             t->opts.register_timeout_ms);
            break;
        }
        rc = tide__ctl_reply(t->ctl, &r, (int)((deadline - now) / 1000000ull) + 1);
        if (rc == TIDE_ERR_TIMEOUT) {
            rc = TIDE_OK;
            continue;
        }
        if (rc != TIDE_OK)
            break;
        if (r.type == TIDE_MSG_LIVENESS_REPLY && strcmp(r.u.liveness_reply.job, t->job) == 0 &&
            r.u.liveness_reply.n_ranks == n &&
            memcmp(r.u.liveness_reply.ranks, ask, n * sizeof *ask) == 0)
            break;
        if (r.type == TIDE_MSG_ERROR) {
            rc = tide_errorf(TIDE_ERR_DENIED, "tided refused a liveness request: %s",
                             r.u.error.message);
            break;
        }
        tide_msg_clear(&r); /* a stale reply (an earlier switch's) */
    }
    for (uint32_t i = 0; rc == TIDE_OK && i < n; i++) {
        if (r.u.liveness_reply.alive[i])
            continue;
        alive[ask[i]] = 0;
        *lost = 1;
        TIDE_WARN(SUBSYS, "generation switch: old member rank %d is gone; its state comes from %s",
                  ask[i], rollback ? "the checkpoint" : "replicas");
    }
    tide_msg_clear(&r);
    tide_free(ask);
    return rc;
}

static void report_done(tide_t *t, uint64_t gen, tide_status rc, uint64_t bytes, double ms)
{
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

/* A rollback's state (tide__rollback_load): a member fills its new buffers from the checkpoint
   (in place: fresh pool buffers into *fresh, the old shards stay until the commit); then every
   participant agrees whether all members did. */
static tide_status rollback_state(tide_t *t, tide_coll_comm_t *sw, void *const *new_bufs,
                                  int in_place, const char *dir, int64_t step, void ***fresh,
                                  uint64_t *bytes_read)
{
    const tide_view *nv = &t->next_view;
    tide_status mine = TIDE_OK;
    if (nv->member) {
        void *const *dst = new_bufs;
        if (in_place) {
            mine = tide_alloc_buffers(t, nv, fresh);
            dst = *fresh;
        }
        if (mine == TIDE_OK) {
            mine = tide__rollback_load(t, dir, step, t->next_layout, nv->pp_rank, nv->dp_rank,
                                       nv->tp_rank, dst, bytes_read);
            if (mine != TIDE_OK) /* the checkpoint's fault: tided tries the one before */
                mine = tide_errorf(TIDE_ERR_INVALID, "rank %d cannot load checkpoint %s: %s",
                                   t->rank, dir, tide_last_error());
        }
        if (mine != TIDE_OK) {
            TIDE_ERROR(SUBSYS, "%s", tide_last_error());
            /* the operator learns which file from tided's events, not only from this log */
            tide_proto_saved_t m;
            memset(&m, 0, sizeof m);
            snprintf(m.job, sizeof m.job, "%s", t->job);
            m.step = step > 0 ? (uint64_t)step : 0;
            snprintf(m.dir, sizeof m.dir, "%s", dir);
            m.code = (int)mine;
            snprintf(m.reason, sizeof m.reason, "%s", tide_last_error());
            tide__ctl_post_saved(t->ctl, &m);
        }
    }
    return tide__rollback_agree(t, sw, mine);
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
    const tide_layout_t *nl = t->next_layout;
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
    uint64_t t0 = tide_now_ns();
    tide_status rc = TIDE_OK;
    tide_layout_t *prev = NULL;
    tide_plan_t *plan = NULL;
    uint8_t *alive = NULL;
    int *parts = NULL, *rank_of = NULL;
    void **old_rows = NULL, **new_rows = NULL;
    uint64_t **ob = NULL, **nb = NULL;
    uint64_t *my_ob = NULL, *my_nb = NULL;
    tide_coll_comm_t *sw = NULL, *g[4] = {NULL, NULL, NULL, NULL};
    /* a join (join.c): both sides' job ranks, what it hands over, and what it replaced */
    tide__join_req jreq;
    memset(&jreq, 0, sizeof jreq);
    tide__join_result jres = {NULL, MPI_COMM_NULL, NULL};
    int32_t *j_old = NULL, *j_new = NULL, *old_ids = NULL;
    tide_coll_pool_t *old_pool = NULL;
    MPI_Comm old_end = MPI_COMM_NULL;
    int old_size = 0, joined = 0, bystander = 0, lost = 0;
    /* a release (leave.c): both sides' job ranks, and this side's ids for the commit */
    tide__leave_req lreq;
    memset(&lreq, 0, sizeof lreq);
    int32_t *l_stay = NULL, *l_leave = NULL, *side_ids = NULL;
    int released = 0; /* t->pool is this side's own; old_pool the shared one */
    /* a recovery that rolls back to a checkpoint (its directory, "" otherwise) */
    char rb_dir[TIDE_PROTO_TEXT_MAX + 1] = "";
    int64_t rb_step = 0;
    void **rb_fresh = NULL;
    uint64_t rb_read = 0;
    tide_exec_stats es;
    memset(&es, 0, sizeof es);
    tide_reshard_stats st;
    memset(&st, 0, sizeof st);

    const tide_view *nv = &t->next_view;
    const tide_layout_t *nl = t->next_layout;
    uint64_t gen = nv->generation;
    tide__ctl_lock(t->ctl);
    tide__agree *a = tide__ctl_agree(t->ctl);
    int old_member = a->p_old;
    /* an abort of this switch sets it from now on; one that came already (also while the
       step boundary waited for the preparation) leaves it set */
    __atomic_store_n(&t->switch_cancel, !(a->p_gen == gen && a->p_switching && !a->p_aborted),
                     __ATOMIC_RELAXED);
    const tide_proto_layout_msg_t *pl = tide__ctl_pending_layout(t->ctl);
    rc = pl ? tide__layout_from_proto(&pl->prev, &prev)
            : tide_errorf(TIDE_ERR_INTERNAL, "pending layout vanished");
    if (rc == TIDE_OK && pl->ckpt[0] != '\0') {
        snprintf(rb_dir, sizeof rb_dir, "%s", pl->ckpt);
        rb_step = (int64_t)pl->ckpt_step;
    }
    if (rc == TIDE_OK && pl->n_join_new > 0) { /* this generation connects a pool */
        jreq.gen = gen;
        jreq.world = pl->world;
        jreq.n_old = pl->n_join_old;
        jreq.n_new = pl->n_join_new;
        j_old = tide_malloc((size_t)pl->n_join_old * sizeof *j_old);
        j_new = tide_malloc((size_t)pl->n_join_new * sizeof *j_new);
        if (j_old == NULL || j_new == NULL) {
            rc = tide_errorf(TIDE_ERR_NOMEM, "out of memory for generation %llu's join",
                             (unsigned long long)gen);
        } else {
            memcpy(j_old, pl->join_old, (size_t)pl->n_join_old * sizeof *j_old);
            memcpy(j_new, pl->join_new, (size_t)pl->n_join_new * sizeof *j_new);
            jreq.old_ranks = j_old;
            jreq.new_ranks = j_new;
        }
    }
    if (rc == TIDE_OK && pl->n_leave > 0) { /* this generation releases whole pools */
        lreq.gen = gen;
        lreq.n_stay = pl->n_stay;
        lreq.n_leave = pl->n_leave;
        l_stay = tide_malloc((size_t)pl->n_stay * sizeof *l_stay);
        l_leave = tide_malloc((size_t)pl->n_leave * sizeof *l_leave);
        if (l_stay == NULL || l_leave == NULL) {
            rc = tide_errorf(TIDE_ERR_NOMEM, "out of memory for generation %llu's release",
                             (unsigned long long)gen);
        } else {
            memcpy(l_stay, pl->stay, (size_t)pl->n_stay * sizeof *l_stay);
            memcpy(l_leave, pl->leave, (size_t)pl->n_leave * sizeof *l_leave);
            lreq.stay = l_stay;
            lreq.leave = l_leave;
        }
    }
    tide__ctl_unlock(t->ctl);
    TIDE_CHECK_GOTO(rc, rc, fail);
    if (j_new != NULL) {
        /* one communicator over both pools first: the switch's groups are made over it */
        uint64_t tj = tide_now_ns();
        TIDE_CHECK_GOTO(tide__join_connect(t, &jreq, &jres), rc, fail);
        old_pool = t->pool;
        old_end = t->end_comm;
        old_ids = t->coord_ids;
        old_size = t->size;
        t->pool = jres.pool;
        t->end_comm = jres.end_comm;
        t->coord_ids = jres.ids;
        t->size = jreq.world;
        jres.pool = NULL;
        jres.ids = NULL;
        jres.end_comm = MPI_COMM_NULL;
        joined = 1;
        st.join_ms = (double)(tide_now_ns() - tj) / 1e6;
    }
    int in_place = new_bufs == NULL && t->owned;
    if (t->moved != NULL) /* tide_buffer_moved reports this switch, failed or not */
        memset(t->moved, 0, t->n_tensors);
    TIDE_CHECK_GOTO(tide_layout_validate(nl, t->coll), rc, fail);
    TIDE_CHECK_GOTO(tide_layout_validate(prev, t->coll), rc, fail);
    for (size_t i = 0; i < tide_layout_size(nl); i++)
        if (nl->worker[i] >= t->size || tide_coll_pool_comm_rank(t->pool, nl->worker[i]) < 0)
            TIDE_FAIL_GOTO(rc, fail, TIDE_ERR_INVALID,
                           "generation %llu names job rank %d, which no process connected to "
                           "this rank holds (job ranks: %d)",
                           (unsigned long long)gen, nl->worker[i], t->size);

    /* participants: the new layout's members and the old one's live members */
    size_t nw = (size_t)t->size;
    alive = tide_calloc(nw, 1);
    parts = tide_malloc(nw * sizeof *parts);
    rank_of = tide_malloc(nw * sizeof *rank_of);
    TIDE_CHECK_ALLOC_GOTO(alive, rc, fail);
    TIDE_CHECK_ALLOC_GOTO(parts, rc, fail);
    TIDE_CHECK_ALLOC_GOTO(rank_of, rc, fail);
    memset(alive, 1, nw);
    TIDE_CHECK_GOTO(find_dead(t, prev, nl, rb_dir[0] != '\0', alive, &lost), rc, fail);
    int np = tide__participants(prev, nl, alive, t->size, parts);
    if (np < 0)
        TIDE_FAIL_GOTO(rc, fail, TIDE_ERR_NOMEM, "out of memory listing the participants");
    for (size_t r = 0; r < nw; r++)
        rank_of[r] = -1;
    for (int k = 0; k < np; k++)
        rank_of[parts[k]] = k;
    if (rank_of[t->rank] < 0 && !joined && l_leave == NULL)
        TIDE_FAIL_GOTO(rc, fail, TIDE_ERR_INTERNAL, "rank %d switches but takes no part", t->rank);
    if (l_leave != NULL) {
        /* each side's own pool now; the shared one (old_pool) still carries the reshard,
           whose senders may be on the side that leaves */
        tide__join_result lres = {NULL, MPI_COMM_NULL, NULL};
        uint64_t tl = tide_now_ns();
        TIDE_CHECK_GOTO(tide__leave_split(t, &lreq, &lres), rc, fail);
        old_pool = t->pool;
        old_end = t->end_comm;
        t->pool = lres.pool;
        t->end_comm = lres.end_comm;
        side_ids = lres.ids;
        released = 1;
        st.sync_ms += (double)(tide_now_ns() - tl) / 1e6;
    }
    /* a rank outside both layouts took part in the join or the release only: it stays
       idle (connected, or on its own side) */
    bystander = rank_of[t->rank] < 0;
    if (bystander)
        goto commit;

    uint64_t tc = tide_now_ns();
    /* built during the preparation, for exactly this generation and these participants:
       taken, published as this switch's (so that its abort reaches them). A release builds
       its groups over the staying side's own pool at the switch, never ahead. */
    tide__ctl_lock(t->ctl);
    int prepared =
        !released && !rb_dir[0] && tide__prebuilt_take_locked(t, gen, parts, np, &sw, g, &plan);
    if (prepared) {
        t->c_switch = sw;
        if (__atomic_load_n(&t->switch_cancel, __ATOMIC_RELAXED))
            tide_coll_comm_abort(sw);
        for (int k = 0; k < 4; k++)
            tide__publish_new_locked(t, k, g[k]);
    }
    tide__ctl_unlock(t->ctl);
    if (!prepared) {
        tide__prebuilt_drop(t, 1); /* for another generation or participant set: useless */
        tide_coll_comm_params cp = {parts, np, tide__gen_tag(gen, 0),
                                    (uint32_t)t->opts.switch_timeout_ms, &t->switch_cancel};
        TIDE_CHECK_GOTO(tide_coll_comm_new(&sw, t->be, released ? old_pool : t->pool, &cp), rc,
                        fail);
        tide__ctl_lock(t->ctl);
        t->c_switch = sw;
        tide__ctl_unlock(t->ctl);
    } else {
        /* the wait for the other participants to reach the switch, which a creation here
           would have included: kept apart from the data movement */
        TIDE_CHECK_GOTO(tide_coll_barrier(sw, NULL), rc, fail);
    }
    st.sync_ms += (double)(tide_now_ns() - tc) / 1e6;
    st.prepared = prepared;
    if (rb_dir[0] != '\0') { /* every byte from the checkpoint, none from the old layout */
        uint64_t tm = tide_now_ns();
        TIDE_CHECK_GOTO(rollback_state(t, sw, new_bufs, new_bufs == NULL && t->owned, rb_dir,
                                       rb_step, &rb_fresh, &rb_read),
                        rc, fail);
        st.move_ms = (double)(tide_now_ns() - tm) / 1e6;
        st.bytes_local = rb_read;
        goto groups;
    }

    uint64_t tp0 = tide_now_ns();
    /* this rank's part only: O(its items), not the whole job's (milliseconds at 10^4) */
    if (plan == NULL)
        TIDE_CHECK_GOTO(tide_reshard_plan_for(prev, nl, t->coll, alive, nw, t->rank, &plan), rc,
                        fail);
    st.plan_ms = (double)(tide_now_ns() - tp0) / 1e6;

    old_rows = tide_calloc(nw, sizeof *old_rows);
    new_rows = tide_calloc(nw, sizeof *new_rows);
    ob = tide_calloc(nw, sizeof *ob);
    nb = tide_calloc(nw, sizeof *nb);
    my_ob = tide_calloc(t->n_tensors ? t->n_tensors : 1, sizeof *my_ob);
    my_nb = tide_calloc(t->n_tensors ? t->n_tensors : 1, sizeof *my_nb);
    TIDE_CHECK_ALLOC_GOTO(old_rows, rc, fail);
    TIDE_CHECK_ALLOC_GOTO(new_rows, rc, fail);
    TIDE_CHECK_ALLOC_GOTO(ob, rc, fail);
    TIDE_CHECK_ALLOC_GOTO(nb, rc, fail);
    TIDE_CHECK_ALLOC_GOTO(my_ob, rc, fail);
    TIDE_CHECK_ALLOC_GOTO(my_nb, rc, fail);
    int op, od, ot;
    if (old_member && tide_layout_find(prev, t->rank, &op, &od, &ot) == TIDE_OK) {
        for (size_t i = 0; i < t->n_tensors; i++) {
            my_ob[i] = tide_shard_bytes(prev, t->coll, i, op, od, ot);
            if (my_ob[i] > 0 && t->bufs[i] == NULL)
                TIDE_FAIL_GOTO(rc, fail, TIDE_ERR_INVALID,
                               "tensor %s has no registered buffer on rank %d (call "
                               "tide_set_buffers after filling the state)",
                               tide_collection_tensor(t->coll, i)->name, t->rank);
        }
        old_rows[t->rank] = t->bufs;
    }
    tide_error_clear();
    ob[t->rank] = my_ob;
    if (nv->member) {
        for (size_t i = 0; i < t->n_tensors; i++)
            my_nb[i] = tide_shard_bytes(nl, t->coll, i, nv->pp_rank, nv->dp_rank, nv->tp_rank);
        /* new_bufs passed check_new_bufs; in place, the runtime's own pool memory */
        if (!in_place)
            new_rows[t->rank] = (void *)new_bufs;
    }
    nb[t->rank] = my_nb;
    tide_exec_in_place ip;
    memset(&ip, 0, sizeof ip);
    uint64_t cap = t->opts.staging_cap ? t->opts.staging_cap : TIDE_EXEC_DEFAULT_STAGING_CAP;
    for (size_t i = 0; i < t->n_tensors; i++) {
        st.state_old += my_ob[i];
        st.state_new += my_nb[i];
    }
    st.staging_cap = cap;
    /* what the rank holds counts block capacities (page-rounded shrinks, a reused block a
       little larger than its shard): the bound is on that, not the bare shard bytes */
    tide_mem_pool_stats ps;
    tide_mem_pool_stats_get(t->mem, &ps);
    uint64_t held = ps.in_use > st.state_old ? ps.in_use : st.state_old;
    st.mem_limit = (held > st.state_new ? held : st.state_new) + cap;
    st.no_room = st.state_new > st.state_old ? st.state_new - st.state_old : 0;
    if (in_place) {
        /* the old buffers, handed over: the executor rebuilds t->bufs in place */
        old_rows[t->rank] = NULL;
        ip.pool = t->mem;
        ip.worker = t->rank;
        ip.bufs = t->bufs;
        ip.old_bytes = my_ob;
        ip.new_bytes = my_nb;
        ip.moved = t->moved;
        ip.limit = st.mem_limit;
        ip.strict = t->opts.mem_strict;
    }
    tide_exec_args ea = {plan,
                         nw,
                         t->n_tensors,
                         rank_of,
                         (void *const *const *)old_rows,
                         (void *const *const *)new_rows,
                         (const uint64_t *const *)ob,
                         (const uint64_t *const *)nb,
                         in_place ? &ip : NULL};
    tide_exec_opts eo;
    tide_exec_opts_init(&eo);
    eo.staging_cap = t->opts.staging_cap;
    eo.pool = t->mem;
    uint64_t tm = tide_now_ns();
    TIDE_CHECK_GOTO(tide_reshard_execute(sw, &ea, &eo, &es), rc, fail);
    st.move_ms = (double)(tide_now_ns() - tm) / 1e6;
    if (in_place) {
        tide_mem_pool_stats_get(t->mem, &ps);
        if (ps.spill_fresh > 0) /* a recovery or join, or a preparation that failed */
            TIDE_INFO(SUBSYS,
                      "rank %d: generation %llu spilled %llu bytes into host memory allocated at "
                      "the switch step (%llu prepared ahead)",
                      t->rank, (unsigned long long)gen, (unsigned long long)ps.spill_fresh,
                      (unsigned long long)ps.spill_reused);
    }

groups:
    tc = tide_now_ns();
    if (released) {
        /* the new layout's groups over the launches that stay (t->pool), not split off sw:
           no communicator of the job may name a process of a launch that leaves */
        tide__ctl_lock(t->ctl);
        if (t->c_switch == sw)
            t->c_switch = NULL;
        tide__ctl_unlock(t->ctl);
        tide_coll_comm_destroy(&sw);
        TIDE_CHECK_GOTO(tide__build_groups(t, nl, gen, NULL, nv->member, nv->pp_rank, nv->dp_rank,
                                           nv->tp_rank, g),
                        rc, fail);
    } else if (!prepared) {
        /* split off sw, which build_groups releases once the new all exists; built ahead,
           they exist already (sw goes with the old layout's groups at the commit) */
        TIDE_CHECK_GOTO(tide__build_groups(t, nl, gen, &sw, nv->member, nv->pp_rank, nv->dp_rank,
                                           nv->tp_rank, g),
                        rc, fail);
    }
    st.groups_ms = (double)(tide_now_ns() - tc) / 1e6;
    st.comm_ms = st.sync_ms + st.groups_ms;

commit:;
    /* commit locally: new comms, layout, buffers and step */
    tide_coll_comm_t *old[5];
    tide__ctl_lock(t->ctl);
    a = tide__ctl_agree(t->ctl);
    if (a->p_gen != gen || !a->p_switching) {
        tide__ctl_unlock(t->ctl);
        TIDE_FAIL_GOTO(rc, fail, TIDE_ERR_ABORTED,
                       "tided aborted generation %llu while this rank switched",
                       (unsigned long long)gen);
    }
    old[0] = t->c_all;
    old[1] = t->c_tp;
    old[2] = t->c_dp;
    old[3] = t->c_pp;
    old[4] = sw;
    t->c_all = g[0];
    t->c_tp = g[1];
    t->c_dp = g[2];
    t->c_pp = g[3];
    t->c_switch = NULL;
    tide__unpublish_new(t);
    tide__agree_switched(a);
    if (rb_dir[0] != '\0') {
        a->completed = rb_step; /* the state is the checkpoint's: so is the step */
        tide__ckpt_rolled_back(t, rb_step);
    }
    int64_t step = a->completed;
    tide__ctl_unlock(t->ctl);
    sw = NULL;
    uint64_t td = tide_now_ns();
    /* The old layout's groups that lost a member are never freed in MPI: that member may
       only be stopped, and its late messages must land in a communicator nobody reads,
       not in one of the new generation that reused a freed context id. */
    for (int i = 0; lost && i < 4; i++)
        if (old[i] != NULL)
            tide_coll_comm_abort(old[i]);
    for (int i = 0; i < 5; i++)
        tide_coll_comm_destroy(&old[i]);
    if (joined || released) { /* the old layout's groups are gone: so can their pool be */
        tide_coll_pool_destroy(&old_pool);
        MPI_Comm_free(&old_end);
    }
    if (joined) {
        tide_free(old_ids);
        old_ids = NULL;
    }
    if (released) { /* the other side's ranks are unreachable from here on */
        tide_free(t->coord_ids);
        t->coord_ids = side_ids;
        side_ids = NULL;
    }
    tide_layout_destroy(&t->layout);
    t->layout = t->next_layout;
    t->next_layout = NULL;
    t->has_next = 0;
    tide__fill_view(&t->view, gen, t->layout, t->rank, step);
    t->view.all = t->c_all;
    t->view.tp = t->c_tp;
    t->view.dp = t->c_dp;
    t->view.pp = t->c_pp;
    for (size_t i = 0; !in_place && i < t->n_tensors; i++)
        t->bufs[i] = t->view.member ? new_bufs[i] : NULL;
    if (in_place && rb_dir[0] != '\0') {
        /* the old shards go back to the pool; the checkpoint's take their places */
        for (size_t i = 0; i < t->n_tensors; i++) {
            void *old_buf = t->bufs[i];
            t->bufs[i] = rb_fresh != NULL ? rb_fresh[i] : NULL;
            if (rb_fresh != NULL)
                rb_fresh[i] = old_buf;
            else
                tide__free_buffer(t, old_buf);
            if (t->moved != NULL)
                t->moved[i] = 1;
        }
    }
    st.bytes_sent = es.bytes_sent;
    st.peak_extra = es.peak_extra;
    st.bytes_kept = es.bytes_kept;
    st.bytes_shrunk = es.bytes_shrunk;
    st.bytes_rebuilt = es.bytes_rebuilt;
    st.bytes_spilled = es.bytes_spilled;
    st.fresh_bytes = es.fresh_bytes;
    st.bytes_recv = es.bytes_recv;
    st.bytes_local = es.bytes_local;
    st.wait_ms = t->switch_wait_ms;
    report_done(t, gen, TIDE_OK, es.bytes_sent, (double)(tide_now_ns() - t0) / 1e6);
    st.teardown_ms = (double)(tide_now_ns() - td) / 1e6;
    /* a rank that left gives its memory back to the system: offline work on its device
       needs it; a later layout that takes it back prepares blocks ahead (reserve_pool).
       After its done: tided commits the generation once every participant reported, and
       freeing GiBs (unmapping, cudaFree) must not hold the job's commit back. */
    if (in_place && !t->view.member)
        tide_mem_pool_trim(t->mem);
    /* the host spill blocks (prepared ahead) are freed by the pool's thread: cudaFreeHost
       waits for the device */
    if (in_place)
        tide_mem_pool_spill_release(t->mem);
    st.total_ms = (double)(tide_now_ns() - t0) / 1e6;
    char desc[160];
    TIDE_INFO(SUBSYS,
              "rank %d switched to generation %llu %s at step %lld in %.1f ms (%llu "
              "bytes sent in %llu messages over %llu rounds, %llu received by single copy, "
              "%llu through staging; move %.1f ms)%s%s%s",
              t->rank, (unsigned long long)gen, tide_layout_format(t->layout, desc, sizeof desc),
              (long long)step, st.total_ms, (unsigned long long)es.bytes_sent,
              (unsigned long long)es.messages, (unsigned long long)es.rounds,
              (unsigned long long)es.bytes_direct, (unsigned long long)es.bytes_staged, st.move_ms,
              rb_dir[0] ? "; state rolled back to checkpoint " : "", rb_dir,
              t->view.member ? "" : "; now idle");
    if (stats)
        *stats = st;
    goto out;

fail:
    TIDE_WARN(SUBSYS, "rank %d could not switch to generation %llu: %s: %s", t->rank,
              (unsigned long long)gen, tide_strerror(rc), tide_last_error());
    {
        char detail[512];
        snprintf(detail, sizeof detail, "%s", tide_last_error());
        tide__ctl_lock(t->ctl);
        t->c_switch = NULL;
        tide__unpublish_new(t);
        tide__agree *fa = tide__ctl_agree(t->ctl);
        if (fa->p_gen == gen)
            tide__agree_switch_failed(fa);
        tide__ctl_unlock(t->ctl);
        tide__destroy_comms(g, 4);
        tide_coll_comm_destroy(&sw);
        if (joined || released) { /* back to the pool the old layout's groups live on */
            tide_coll_pool_destroy(&t->pool);
            MPI_Comm_free(&t->end_comm);
            t->pool = old_pool;
            t->end_comm = old_end;
        }
        if (joined) {
            tide_free(t->coord_ids);
            t->coord_ids = old_ids;
            t->size = old_size;
            old_ids = NULL;
        }
        t->has_next = 0;
        report_done(t, gen, rc, 0, (double)(tide_now_ns() - t0) / 1e6);
        if (t->owned)
            tide_mem_pool_spill_release(t->mem);
        if (rb_dir[0] != '\0' && rc == TIDE_ERR_INVALID) {
            /* tided abandons the generation and rolls back to the checkpoint before this
               one: for the program, an aborted switch like any other (nothing moved) */
            rc = TIDE_ERR_ABORTED;
            tide_errorf(rc, "generation %llu abandoned: %s (tided tries the checkpoint before it)",
                        (unsigned long long)gen, detail);
        } else {
            tide_errorf(rc, "%s", detail);
        }
    }
out:
    tide_free_buffers(t, &rb_fresh); /* the old shards after a rollback, or the unused new */
    tide_free(j_old);
    tide_free(j_new);
    tide_free(l_stay);
    tide_free(l_leave);
    tide_free(side_ids);
    tide_layout_destroy(&prev);
    tide_plan_destroy(&plan);
    tide_free(alive);
    tide_free(parts);
    tide_free(rank_of);
    tide_free(old_rows);
    tide_free(new_rows);
    tide_free(ob);
    tide_free(nb);
    tide_free(my_ob);
    tide_free(my_nb);
    return rc;
}
