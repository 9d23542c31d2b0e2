/*
 * worker/switch_phases: the phases of a layout switch (switch_int.h), in the order
 * tide_reshard runs them. Every participant (the new layout's members and the old
 * layout's live members) takes one communicator over all participants and its own part of
 * the plan (reshard/), both built during the preparation when they could be (prebuild.c),
 * else made here; runs the plan through the collectives executor from the registered old
 * buffers into the program's new ones (or, when the runtime owns the buffers, rebuilds them
 * in place inside its memory pool, within the larger of the rank's old and new state plus
 * the staging cap), or restores every new shard from a checkpoint (rollback.c); takes the
 * new layout's groups (built ahead, or split off the switch communicator here), and
 * commits. Each acquisition the old layout would not survive is logged with its undo.
 *
 * Workload: once per resize; the data movement dominates.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/clock.h"
#include "core/error.h"
#include "core/log.h"
#include "worker/retire.h"
#include "worker/switch_int.h"

#define SUBSYS "worker"

static double ms_since(uint64_t t0)
{
    return (double)(tide_now_ns() - t0) / 1e6;
}

/* ---- the transaction ------------------------------------------------------------------ */

void tide__switch_begin(tide__switch *tx, tide_t *t, tide__intent *in, tide__gen_t *word,
                        const tide__switch_port *port, void *const *new_bufs)
{
    memset(tx, 0, sizeof *tx);
    tx->t = t;
    tx->word = word;
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

/* ---- pools: connect a pool launched later, or release whole pools ------------------- */

/* Back to the pool, job-end communicator, ids and size the old layout's groups live on. */
static void undo_pools(tide__switch *tx)
{
    tide_t *t = tx->t;
    tide_coll_pool_destroy(&t->pool);
    MPI_Comm_free(&t->end_comm);
    t->pool = tx->old_pool;
    t->end_comm = tx->old_end;
    tx->old_pool = NULL;
    tx->old_end = MPI_COMM_NULL;
    if (tx->joined) {
        tide_free(t->coord_ids);
        t->coord_ids = tx->old_ids;
        t->size = tx->old_size;
        tx->old_ids = NULL;
    }
    tx->joined = tx->released = 0;
}

/* One communicator over both pools first: the switch's groups are made over it. */
static tide_status connect_pool(tide__switch *tx)
{
    tide_t *t = tx->t;
    const tide__intent *in = &tx->in;
    tide__join_req jr = {in->gen,        in->world,    in->join_old,
                         in->n_join_old, in->join_new, in->n_join_new};
    tide__join_result res = {NULL, MPI_COMM_NULL, NULL};
    uint64_t t0 = tide_now_ns();
    TIDE_CHECK(tx->port.join(tx->port.ctx, &jr, tide__gen_word(tx->word), &res));
    tx->old_pool = t->pool;
    tx->old_end = t->end_comm;
    tx->old_ids = t->coord_ids;
    tx->old_size = t->size;
    t->pool = res.pool;
    t->end_comm = res.end_comm;
    t->coord_ids = res.ids;
    t->size = in->world;
    tx->joined = 1;
    tide__switch_log(tx, undo_pools);
    tx->st.join_ms = ms_since(t0);
    return TIDE_OK;
}

/* Each side's own pool from here; the shared one (old_pool) still carries the switch,
   whose senders may be on the side that leaves. */
static tide_status release_pools(tide__switch *tx)
{
    tide_t *t = tx->t;
    const tide__intent *in = &tx->in;
    tide__leave_req lr = {in->gen, in->stay, in->n_stay, in->leave, in->n_leave};
    tide__join_result res = {NULL, MPI_COMM_NULL, NULL};
    uint64_t t0 = tide_now_ns();
    TIDE_CHECK(tide__leave_split(t, &lr, tide__gen_word(tx->word), &res));
    tx->old_pool = t->pool;
    tx->old_end = t->end_comm;
    t->pool = res.pool;
    t->end_comm = res.end_comm;
    tx->side_ids = res.ids;
    tx->released = 1;
    tide__switch_log(tx, undo_pools);
    tx->st.sync_ms += ms_since(t0);
    return TIDE_OK;
}

/* The pool the switch's communicator is made over: the shared one in a release. */
static tide_coll_pool_t *switch_pool(const tide__switch *tx)
{
    return tx->released ? tx->old_pool : tx->t->pool;
}

tide_status tide__switch_pools(tide__switch *tx)
{
    tide_t *t = tx->t;
    const tide__intent *in = &tx->in;
    if (in->n_join_new > 0)
        TIDE_CHECK(connect_pool(tx));
    TIDE_CHECK(tide_layout_validate(in->next, t->coll));
    TIDE_CHECK(tide_layout_validate(in->prev, t->coll));
    for (size_t i = 0; i < tide_layout_size(in->next); i++) {
        int32_t w = in->next->worker[i];
        if (w >= t->size || tide_coll_pool_comm_rank(t->pool, w) < 0)
            return tide_errorf(TIDE_ERR_INVALID,
                               "generation %llu names job rank %d, which no process connected "
                               "to this rank holds (job ranks: %d)",
                               (unsigned long long)in->gen, w, t->size);
    }
    if (in->n_leave > 0)
        TIDE_CHECK(release_pools(tx));
    return TIDE_OK;
}

/* ---- participants ------------------------------------------------------------------- */

static int cmp_i32(const void *a, const void *b)
{
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return x < y ? -1 : x > y;
}

/* Marks the old members that leave the layout and that tided reports gone (failed, left,
   or no longer in the job) as not alive; lost = 1 when there is one. Only old members
   outside the new layout are asked about (a shrink or a recovery). */
static tide_status find_dead(tide__switch *tx)
{
    tide_t *t = tx->t;
    const tide_layout_t *prev = tx->in.prev, *nl = tx->in.next;
    size_t n_prev = tide_layout_size(prev);
    int32_t *ask = tide_malloc((n_prev ? n_prev : 1) * sizeof *ask);
    uint8_t *alv = tide_malloc(n_prev ? n_prev : 1);
    tide_status rc = TIDE_OK;
    if (ask == NULL || alv == NULL)
        TIDE_FAIL_GOTO(rc, out, TIDE_ERR_NOMEM, "out of memory listing the old members");
    uint32_t n = 0;
    for (size_t i = 0; i < n_prev; i++) {
        int32_t r = prev->worker[i];
        int p, d, tt;
        if (r >= 0 && r < t->size && tide_layout_find(nl, r, &p, &d, &tt) != TIDE_OK)
            ask[n++] = r;
    }
    tide_error_clear();
    qsort(ask, n, sizeof *ask, cmp_i32);
    uint32_t k = 0;
    for (uint32_t i = 0; i < n; i++)
        if (k == 0 || ask[i] != ask[k - 1])
            ask[k++] = ask[i];
    if (k > 0)
        TIDE_CHECK_GOTO(tx->port.liveness(tx->port.ctx, ask, k, alv), rc, out);
    for (uint32_t i = 0; i < k; i++) {
        if (alv[i])
            continue;
        tx->alive[ask[i]] = 0;
        tx->lost = 1;
        TIDE_WARN(SUBSYS, "generation switch: old member rank %d is gone; its state comes from %s",
                  ask[i], tx->in.ckpt[0] ? "the checkpoint" : "replicas");
    }
out:
    tide_free(ask);
    tide_free(alv);
    return rc;
}

tide_status tide__switch_participants(tide__switch *tx)
{
    tide_t *t = tx->t;
    tx->nw = (size_t)t->size;
    tx->alive = tide_malloc(tx->nw);
    tx->parts = tide_malloc(tx->nw * sizeof *tx->parts);
    tx->rank_of = tide_malloc(tx->nw * sizeof *tx->rank_of);
    if (tx->alive == NULL || tx->parts == NULL || tx->rank_of == NULL)
        return tide_errorf(TIDE_ERR_NOMEM, "out of memory listing the participants");
    memset(tx->alive, 1, tx->nw);
    TIDE_CHECK(find_dead(tx));
    /* the new layout's members and the old one's live members */
    tx->np = tide__participants(tx->in.prev, tx->in.next, tx->alive, t->size, tx->parts);
    if (tx->np < 0)
        return tide_errorf(TIDE_ERR_NOMEM, "out of memory listing the participants");
    for (size_t r = 0; r < tx->nw; r++)
        tx->rank_of[r] = -1;
    for (int k = 0; k < tx->np; k++)
        tx->rank_of[tx->parts[k]] = k;
    /* a rank outside both layouts takes part in a join or a release only: it stays idle
       (connected, or on its own side) */
    tx->bystander = tx->rank_of[t->rank] < 0;
    if (tx->bystander && !tx->joined && tx->in.n_leave == 0)
        return tide_errorf(TIDE_ERR_INTERNAL, "rank %d switches but takes no part", t->rank);
    return TIDE_OK;
}

/* ---- the switch communicator -------------------------------------------------------- */

static void undo_switch_comm(tide__switch *tx)
{
    tide_coll_comm_destroy(&tx->sw);
}

static void undo_groups(tide__switch *tx)
{
    tide__destroy_comms(tx->g, 4);
}

/* What the preparation built for exactly this generation and these participants, taken
   (they watch the generation's word: tided's abort of the switch reaches them). A release
   builds its groups over the staying side's own pool at the switch, never ahead; a
   rollback's participants are decided here. 1 when taken. */
static int take_prebuilt(tide__switch *tx)
{
    tide_t *t = tx->t;
    if (t->prep == NULL || tx->released || tx->in.ckpt[0] != '\0')
        return 0;
    return tide__prep_take(t->prep, tx->in.gen, tx->parts, tx->np, &tx->sw, tx->g, &tx->plan);
}

tide_status tide__switch_communicator(tide__switch *tx)
{
    if (tx->bystander)
        return TIDE_OK;
    tide_t *t = tx->t;
    uint64_t t0 = tide_now_ns();
    tx->prepared = take_prebuilt(tx);
    if (tx->prepared) {
        tide__switch_log(tx, undo_switch_comm);
        tide__switch_log(tx, undo_groups);
        /* the wait for the other participants to reach the switch, which a creation here
           would have included: kept apart from the data movement */
        TIDE_CHECK(tide_coll_barrier(tx->sw, NULL));
    } else {
        if (t->prep != NULL)
            tide__prep_drop(t->prep, 0); /* for another generation or participant set */
        const int *word = tide__gen_word(tx->word);
        tide_coll_comm_params cp = {
            tx->parts, tx->np, tide__gen_tag(tx->in.gen, 0), (uint32_t)t->opts.switch_timeout_ms,
            word,      word};
        TIDE_CHECK(tide_coll_comm_new(&tx->sw, t->be, switch_pool(tx), &cp));
        tide__switch_log(tx, undo_switch_comm);
    }
    tx->st.sync_ms += ms_since(t0);
    tx->st.prepared = tx->prepared;
    return TIDE_OK;
}

/* ---- state: move the old shards ----------------------------------------------------- */

/* The executor's tables: this rank's old and new buffers and their sizes, one row per job
   rank (only this rank's filled). */
typedef struct rows {
    void **old_rows, **new_rows;
    uint64_t **ob, **nb;
    uint64_t *my_ob, *my_nb;
} rows;

static void rows_free(rows *r)
{
    tide_free(r->old_rows);
    tide_free(r->new_rows);
    tide_free(r->ob);
    tide_free(r->nb);
    tide_free(r->my_ob);
    tide_free(r->my_nb);
}

static tide_status rows_fill(tide__switch *tx, rows *r)
{
    tide_t *t = tx->t;
    size_t nt = t->n_tensors ? t->n_tensors : 1;
    r->old_rows = tide_calloc(tx->nw, sizeof *r->old_rows);
    r->new_rows = tide_calloc(tx->nw, sizeof *r->new_rows);
    r->ob = tide_calloc(tx->nw, sizeof *r->ob);
    r->nb = tide_calloc(tx->nw, sizeof *r->nb);
    r->my_ob = tide_calloc(nt, sizeof *r->my_ob);
    r->my_nb = tide_calloc(nt, sizeof *r->my_nb);
    if (!r->old_rows || !r->new_rows || !r->ob || !r->nb || !r->my_ob || !r->my_nb)
        return tide_errorf(TIDE_ERR_NOMEM, "out of memory for the executor's tables");
    int op, od, ot;
    if (tx->in.old_member && tide_layout_find(tx->in.prev, t->rank, &op, &od, &ot) == TIDE_OK) {
        for (size_t i = 0; i < t->n_tensors; i++) {
            r->my_ob[i] = tide_shard_bytes(tx->in.prev, t->coll, i, op, od, ot);
            if (r->my_ob[i] > 0 && t->bufs[i] == NULL)
                return tide_errorf(TIDE_ERR_INVALID,
                                   "tensor %s has no registered buffer on rank %d (call "
                                   "tide_set_buffers after filling the state)",
                                   tide_collection_tensor(t->coll, i)->name, t->rank);
        }
        /* in place, the old buffers are handed over: the executor rebuilds t->bufs */
        r->old_rows[t->rank] = tx->in_place ? NULL : t->bufs;
    }
    tide_error_clear();
    r->ob[t->rank] = r->my_ob;
    const tide_view *nv = &tx->nv;
    for (size_t i = 0; nv->member && i < t->n_tensors; i++)
        r->my_nb[i] =
            tide_shard_bytes(tx->in.next, t->coll, i, nv->pp_rank, nv->dp_rank, nv->tp_rank);
    /* new_bufs passed the program's check; in place, the runtime's own pool memory */
    if (nv->member && !tx->in_place)
        r->new_rows[t->rank] = (void *)tx->new_bufs;
    r->nb[t->rank] = r->my_nb;
    return TIDE_OK;
}

/* The memory bound of the switch: what the rank holds counts block capacities
   (page-rounded shrinks, a reused block a little larger than its shard), so the bound is
   on that, not the bare shard bytes. */
static void mem_bound(tide__switch *tx, const rows *r)
{
    tide_t *t = tx->t;
    tide_reshard_stats *st = &tx->st;
    uint64_t cap = t->opts.staging_cap ? t->opts.staging_cap : TIDE_EXEC_DEFAULT_STAGING_CAP;
    for (size_t i = 0; i < t->n_tensors; i++) {
        st->state_old += r->my_ob[i];
        st->state_new += r->my_nb[i];
    }
    st->staging_cap = cap;
    tide_mem_pool_stats ps;
    tide_mem_pool_stats_get(t->mem, &ps);
    uint64_t held = ps.in_use > st->state_old ? ps.in_use : st->state_old;
    st->mem_limit = (held > st->state_new ? held : st->state_new) + cap;
    st->no_room = st->state_new > st->state_old ? st->state_new - st->state_old : 0;
}

static tide_status move(tide__switch *tx)
{
    tide_t *t = tx->t;
    uint64_t t0 = tide_now_ns();
    /* this rank's part only: O(its items), not the whole job's (milliseconds at 10^4) */
    if (tx->plan == NULL)
        TIDE_CHECK(tide_reshard_plan_for(tx->in.prev, tx->in.next, t->coll, tx->alive, tx->nw,
                                         t->rank, &tx->plan));
    tx->st.plan_ms = ms_since(t0);
    rows r;
    memset(&r, 0, sizeof r);
    tide_status rc = rows_fill(tx, &r);
    if (rc != TIDE_OK) {
        rows_free(&r);
        return rc;
    }
    mem_bound(tx, &r);
    tide_exec_in_place ip = {t->mem,  t->rank,  t->bufs,          r.my_ob,
                             r.my_nb, t->moved, tx->st.mem_limit, t->opts.mem_strict};
    tide_exec_args ea = {tx->plan,
                         tx->nw,
                         t->n_tensors,
                         tx->rank_of,
                         (void *const *const *)r.old_rows,
                         (void *const *const *)r.new_rows,
                         (const uint64_t *const *)r.ob,
                         (const uint64_t *const *)r.nb,
                         tx->in_place ? &ip : NULL};
    tide_exec_opts eo;
    tide_exec_opts_init(&eo);
    eo.staging_cap = t->opts.staging_cap;
    eo.pool = t->mem;
    uint64_t tm = tide_now_ns();
    rc = tide_reshard_execute(tx->sw, &ea, &eo, &tx->es);
    rows_free(&r);
    TIDE_CHECK(rc);
    tx->st.move_ms = ms_since(tm);
    tide_mem_pool_stats ps;
    tide_mem_pool_stats_get(t->mem, &ps);
    if (tx->in_place && ps.spill_fresh > 0) /* a recovery or join, or a failed preparation */
        TIDE_INFO(SUBSYS,
                  "rank %d: generation %llu spilled %llu bytes into host memory allocated at "
                  "the switch step (%llu prepared ahead)",
                  t->rank, (unsigned long long)tx->in.gen, (unsigned long long)ps.spill_fresh,
                  (unsigned long long)ps.spill_reused);
    return TIDE_OK;
}

/* ---- state: restore from a checkpoint ----------------------------------------------- */

/* The operator learns which file from tided's events, not only from this rank's log. */
static void say_load_failed(tide__switch *tx, tide_status mine)
{
    tide_proto_saved_t m;
    memset(&m, 0, sizeof m);
    snprintf(m.job, sizeof m.job, "%s", tx->t->job);
    m.step = tx->in.ckpt_step > 0 ? (uint64_t)tx->in.ckpt_step : 0;
    snprintf(m.dir, sizeof m.dir, "%s", tx->in.ckpt);
    m.code = (int)mine;
    snprintf(m.reason, sizeof m.reason, "%s", tide_last_error());
    tx->port.load_failed(tx->port.ctx, &m);
}

/* Every byte from the checkpoint, none from the old layout: a member fills its new
   buffers (in place: fresh pool buffers, the old shards stay until the commit); then every
   participant agrees whether all members did. */
static tide_status restore(tide__switch *tx)
{
    tide_t *t = tx->t;
    const tide_view *nv = &tx->nv;
    uint64_t t0 = tide_now_ns();
    tide_status mine = TIDE_OK;
    if (nv->member) {
        void *const *dst = tx->new_bufs;
        if (tx->in_place) {
            mine = tide_alloc_buffers(t, nv, &tx->rb_fresh);
            dst = tx->rb_fresh;
        }
        if (mine == TIDE_OK) {
            mine = tide__rollback_load(t, tx->in.ckpt, tx->in.ckpt_step, tx->in.next, nv->pp_rank,
                                       nv->dp_rank, nv->tp_rank, dst, &tx->rb_read);
            if (mine != TIDE_OK) /* the checkpoint's fault: tided tries the one before */
                mine = tide_errorf(TIDE_ERR_INVALID, "rank %d cannot load checkpoint %s: %s",
                                   t->rank, tx->in.ckpt, tide_last_error());
        }
        if (mine != TIDE_OK) {
            TIDE_ERROR(SUBSYS, "%s", tide_last_error());
            say_load_failed(tx, mine);
        }
    }
    TIDE_CHECK(tide__rollback_agree(t, tx->sw, mine));
    tx->st.move_ms = ms_since(t0);
    tx->st.bytes_local = tx->rb_read;
    return TIDE_OK;
}

tide_status tide__switch_state(tide__switch *tx)
{
    if (tx->bystander)
        return TIDE_OK;
    return tx->in.ckpt[0] != '\0' ? restore(tx) : move(tx);
}

/* ---- the new layout's groups -------------------------------------------------------- */

tide_status tide__switch_groups(tide__switch *tx)
{
    if (tx->bystander)
        return TIDE_OK;
    tide_t *t = tx->t;
    uint64_t t0 = tide_now_ns();
    tide__group_ctx gc = {t->be, t->pool, (uint32_t)t->opts.switch_timeout_ms,
                          tide__gen_word(tx->word)};
    if (tx->released) {
        /* over the launches that stay (t->pool), not split off sw: no communicator of the
           job may name a process of a launch that leaves */
        tide_coll_comm_destroy(&tx->sw);
        TIDE_CHECK(tide__build_groups(&gc, tx->in.next, &tx->nv, NULL, 0, tx->g));
        tide__switch_log(tx, undo_groups);
    } else if (!tx->prepared) {
        /* split off sw, which build_groups releases once the new all exists; built ahead,
           they exist already (sw goes with the old layout's groups at the commit) */
        TIDE_CHECK(tide__build_groups(&gc, tx->in.next, &tx->nv, &tx->sw, 0, tx->g));
        tide__switch_log(tx, undo_groups);
    }
    tx->st.groups_ms = ms_since(t0);
    tx->st.comm_ms = tx->st.sync_ms + tx->st.groups_ms;
    return TIDE_OK;
}

/* ---- commit ------------------------------------------------------------------------- */

/* The new groups take the old ones' places (run inside the port's commit, once the
   generation's word is committed); the old ones and the switch communicator are kept in
   tx->old_c for the teardown. */
static void install(void *arg)
{
    tide__switch *tx = arg;
    tide_t *t = tx->t;
    tide_coll_comm_t **cur[4] = {&t->c_all, &t->c_tp, &t->c_dp, &t->c_pp};
    for (int k = 0; k < 4; k++) {
        tx->old_c[k] = *cur[k];
        *cur[k] = tx->g[k];
        tx->g[k] = NULL;
    }
    tx->old_c[4] = tx->sw;
    tx->sw = NULL;
}

/* The old layout's communicators and, after a join or release, the pool they lived on. */
static void teardown(tide__switch *tx)
{
    tide_t *t = tx->t;
    /* The old layout's groups that lost a member are never freed in MPI: that member may
       only be stopped, and its late messages must land in a communicator nobody reads,
       not in one of the new generation that reused a freed context id. */
    for (int i = 0; tx->lost && i < 4; i++)
        if (tx->old_c[i] != NULL)
            tide_coll_comm_abort(tx->old_c[i]);
    if (t->retire != NULL && !tx->lost && !tx->joined && !tx->released) {
        /* nothing uses them after the commit: destroyed while training goes on. The old
           groups watch the old generation's word, the switch communicator the new one's */
        tide__gen_t *words[5] = {t->run_word, t->run_word, t->run_word, t->run_word, tx->word};
        tide__retire_give(t->retire, tx->old_c, words, 5);
    } else {
        /* aborted ones go at once (their kernels may wait on the dead member), and the
           pool below outlives every communicator made over it */
        tide__retire_wait(t->retire);
        tide__destroy_comms(tx->old_c, 5);
    }
    if (tx->joined || tx->released) { /* the old layout's groups are gone: so can their pool */
        tide_coll_pool_destroy(&tx->old_pool);
        MPI_Comm_free(&tx->old_end);
    }
    if (tx->joined) {
        tide_free(tx->old_ids);
        tx->old_ids = NULL;
    }
    if (tx->released) { /* the other side's ranks are unreachable from here on */
        tide_free(t->coord_ids);
        t->coord_ids = tx->side_ids;
        tx->side_ids = NULL;
    }
}

/* The runtime takes the new layout, view and buffers. */
static void adopt(tide__switch *tx, int64_t step)
{
    tide_t *t = tx->t;
    /* the layout the program's next view showed becomes the current one (pointers it took
       from that view stay valid) */
    tide_layout_destroy(&t->layout);
    t->layout = tx->in.next;
    tx->in.next = NULL;
    t->has_next = 0;
    tide__fill_view(&t->view, tx->in.gen, t->layout, t->rank, step);
    t->view.all = t->c_all;
    t->view.tp = t->c_tp;
    t->view.dp = t->c_dp;
    t->view.pp = t->c_pp;
    for (size_t i = 0; !tx->in_place && i < t->n_tensors; i++)
        t->bufs[i] = t->view.member ? tx->new_bufs[i] : NULL;
    if (tx->in_place && tx->in.ckpt[0] != '\0') {
        /* the old shards go back to the pool; the checkpoint's take their places */
        for (size_t i = 0; i < t->n_tensors; i++) {
            void *old_buf = t->bufs[i];
            t->bufs[i] = tx->rb_fresh != NULL ? tx->rb_fresh[i] : NULL;
            if (tx->rb_fresh != NULL)
                tx->rb_fresh[i] = old_buf;
            else
                tide__free_buffer(t, old_buf);
            if (t->moved != NULL)
                t->moved[i] = 1;
        }
    }
}

static void fill_stats(tide__switch *tx)
{
    tide_reshard_stats *st = &tx->st;
    const tide_exec_stats *es = &tx->es;
    st->bytes_sent = es->bytes_sent;
    st->peak_extra = es->peak_extra;
    st->bytes_kept = es->bytes_kept;
    st->bytes_shrunk = es->bytes_shrunk;
    st->bytes_rebuilt = es->bytes_rebuilt;
    st->bytes_spilled = es->bytes_spilled;
    st->fresh_bytes = es->fresh_bytes;
    st->bytes_recv = es->bytes_recv;
    if (tx->in.ckpt[0] == '\0')
        st->bytes_local = es->bytes_local;
    st->wait_ms = tx->t->switch_wait_ms;
}

tide_status tide__switch_commit(tide__switch *tx)
{
    tide_t *t = tx->t;
    int64_t step = 0;
    TIDE_CHECK(tx->port.commit(tx->port.ctx, tx->in.gen, tx->in.ckpt[0] != '\0', tx->in.ckpt_step,
                               install, tx, &step));
    tx->n_undo = 0; /* the point of no return: what the log held is the new layout's now */
    uint64_t td = tide_now_ns();
    teardown(tx);
    adopt(tx, step);
    tx->port.adopted(tx->port.ctx);
    fill_stats(tx);
    tx->port.done(tx->port.ctx, tx->in.gen, TIDE_OK, tx->es.bytes_sent, ms_since(tx->t0));
    tx->st.teardown_ms = ms_since(td);
    /* a rank that left gives its memory back to the system: offline work on its device
       needs it; a later layout that takes it back prepares blocks ahead (reserve_pool).
       After its done: tided commits the generation once every participant reported, and
       freeing GiBs (unmapping, cudaFree) must not hold the job's commit back. */
    if (tx->in_place && !t->view.member)
        tide_mem_pool_trim(t->mem);
    /* the host spill blocks (prepared ahead) are freed by the pool's thread: cudaFreeHost
       waits for the device */
    if (tx->in_place)
        tide_mem_pool_spill_release(t->mem);
    tx->st.total_ms = ms_since(tx->t0);
    char desc[160];
    const tide_exec_stats *es = &tx->es;
    TIDE_INFO(SUBSYS,
              "rank %d switched to generation %llu %s at step %lld in %.1f ms (%llu "
              "bytes sent in %llu messages over %llu rounds, %llu received by single copy, "
              "%llu through staging; move %.1f ms)%s%s%s",
              t->rank, (unsigned long long)tx->in.gen,
              tide_layout_format(t->layout, desc, sizeof desc), (long long)step, tx->st.total_ms,
              (unsigned long long)es->bytes_sent, (unsigned long long)es->messages,
              (unsigned long long)es->rounds, (unsigned long long)es->bytes_direct,
              (unsigned long long)es->bytes_staged, tx->st.move_ms,
              tx->in.ckpt[0] ? "; state rolled back to checkpoint " : "", tx->in.ckpt,
              t->view.member ? "" : "; now idle");
    tx->committed = 1;
    return TIDE_OK;
}
