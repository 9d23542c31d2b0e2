/*
 * The reshard planner: which bytes go from which worker to which worker when
 * a job's state moves from one layout to another.
 *
 * Workload: ~10^3..10^5 tensors, a few thousand workers; planning a 175B GPT
 * over 1,024 workers must take tens of milliseconds on one core, and every
 * worker plans the same thing, so the algorithm is linear in its output:
 *
 *  1. Walk every destination (new workers in id order) and every tensor its
 *     stage holds (ascending). The intersection of the new shard with each old
 *     shard it overlaps is a strided "sequence" (K runs, one per [A, D, B]
 *     block; see reshard_int.h) cut to a byte range by the ZeRO-1 dp ranges:
 *     1..3 plan items. Each such piece is either held by the destination
 *     (local copy) or must be sent by a member of its *holder node*: the live
 *     old workers at (stage or all stages, dp rank or all, tp rank or all).
 *     Holder nodes are few ((pp+1)(dp+1)(tp+1)), so volumes are summed per node.
 *  2. Balance: water-fill each node's volume onto its members' send loads,
 *     smallest nodes first, then re-pour each node given the others until
 *     nothing changes (block coordinate descent). Without ZeRO-sharded
 *     tensors the nodes form a laminar family and the first pass is optimal;
 *     in general a fixed point is optimal for the splittable min-max problem.
 *  3. Walk again and cut each node's stream of pieces (in destination order)
 *     at its senders' quotas, so each sender serves a contiguous run of
 *     destinations (few messages). Items are counted per source, then written
 *     straight into their sorted place: the walk order is (dst, tensor,
 *     dst_off), so a stable bucket by src gives (src, dst, tensor, dst_off).
 *
 * Nothing here is quadratic in workers: the cost is O(items + workers * 8)
 * plus small sorts of node members.
 *
 * Files: this one holds the entry points the workers call (tide_reshard_plan,
 * tide_reshard_plan_for) and the planner's thread-local peak counter;
 * plan_totals.c the totals the coordinator and placement call; plan_init.c the
 * planner's life cycle; plan_pieces.c what a destination needs (phase 1 and 3's
 * pieces); plan_walk.c the walks (phases 1 and 3); plan_balance.c phase 2. Their
 * shared state is in plan_int.h.
 */
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "reshard/plan_int.h"

/* Volume walk, balancing and the per-rank counters shared by plan and plan_for. */
static tide_status plan_prepare(planner *pl)
{
    tide_status rc = TIDE_OK;
    TIDE_CHECK(tide__plan_walk_volume(pl));
    TIDE_CHECK(tide__plan_balance(pl));
    pl->send = pl_calloc(pl, pl->nr, sizeof *pl->send);
    TIDE_CHECK_ALLOC_GOTO(pl->send, rc, out);
    pl->recv = pl_calloc(pl, pl->nr, sizeof *pl->recv);
    TIDE_CHECK_ALLOC_GOTO(pl->recv, rc, out);
    pl->last_dst = pl_calloc(pl, pl->nr, sizeof *pl->last_dst);
    TIDE_CHECK_ALLOC_GOTO(pl->last_dst, rc, out);
out:
    return rc;
}

/* Fills the summary's bounds and maxima once the counting walk is done. */
static tide_status plan_finish_summary(planner *pl)
{
    tide_plan_summary *s = &pl->sum;
    s->lower_bound = pl->bytes_needed;
    for (uint32_t r = 0; r < pl->nr; r++) {
        if (pl->send[r] > s->max_send)
            s->max_send = pl->send[r];
        if (pl->recv[r] > s->max_recv)
            s->max_recv = pl->recv[r];
    }
    if (s->bytes_sent != pl->bytes_needed || s->bytes_local != pl->bytes_local)
        return tide_errorf(
            TIDE_ERR_INTERNAL, "reshard plan: sent %llu / local %llu bytes, expected %llu / %llu",
            (unsigned long long)s->bytes_sent, (unsigned long long)s->bytes_local,
            (unsigned long long)pl->bytes_needed, (unsigned long long)pl->bytes_local);
    return tide__plan_balanced_bound(pl, &s->balanced_bound);
}

tide_status tide_reshard_plan(const tide_layout_t *old_l, const tide_layout_t *new_l,
                              const tide_collection_t *c, const uint8_t *alive, size_t n_alive,
                              tide_plan_t **out)
{
    if (out == NULL)
        return tide_errorf(TIDE_ERR_INVALID, "tide_reshard_plan: out is NULL");
    *out = NULL;
    planner pl;
    tide_status rc = tide__planner_init(&pl, old_l, new_l, c, alive, n_alive, 1);
    if (rc != TIDE_OK)
        return rc;
    tide_plan_t *plan = NULL;
    TIDE_CHECK_GOTO(plan_prepare(&pl), rc, fail);
    pl.cnt = pl_calloc(&pl, pl.nr, sizeof *pl.cnt);
    TIDE_CHECK_ALLOC_GOTO(pl.cnt, rc, fail);
    TIDE_CHECK_GOTO(tide__plan_walk(&pl, M_COUNT), rc, fail);
    TIDE_CHECK_GOTO(plan_finish_summary(&pl), rc, fail);

    /* Bucket starts per source rank, then the sorted write. */
    size_t n = 0;
    for (uint32_t r = 0; r < pl.nr; r++) {
        size_t k = pl.cnt[r];
        pl.cnt[r] = n;
        n += k;
    }
    plan = tide_calloc(1, sizeof *plan);
    TIDE_CHECK_ALLOC_GOTO(plan, rc, fail);
    plan->items = tide_calloc(n, sizeof *plan->items);
    TIDE_CHECK_ALLOC_GOTO(plan->items, rc, fail);
    pl.mem_bytes += sizeof *plan + (uint64_t)(n ? n : 1) * sizeof *plan->items;
    pl.out = plan->items;
    reset_cursors(&pl);
    TIDE_CHECK_GOTO(tide__plan_walk(&pl, M_WRITE), rc, fail);
    pl.out = NULL;
    plan->n = n;
    plan->summary = pl.sum;
    tide__reshard_set_peak(pl.mem_bytes);
    tide__planner_clear(&pl);
    *out = plan;
    return TIDE_OK;
fail:
    pl.out = NULL;
    tide__reshard_set_peak(pl.mem_bytes);
    tide__planner_clear(&pl);
    tide_plan_destroy(&plan);
    return rc;
}

static int cmp_xfer(const void *a, const void *b)
{
    const tide_xfer *x = a, *y = b;
    if (x->src != y->src)
        return x->src < y->src ? -1 : 1;
    if (x->dst != y->dst)
        return x->dst < y->dst ? -1 : 1;
    if (x->tensor != y->tensor)
        return x->tensor < y->tensor ? -1 : 1;
    return (x->dst_off > y->dst_off) - (x->dst_off < y->dst_off);
}

/* plan_for's summary: the whole plan's totals t, with n_xfers / n_copies counting the kept
 * items. */
static void collect_summary(planner *pl, const tide_plan_totals *t)
{
    pl->sum.bytes_sent = pl->sum.lower_bound = pl->bytes_needed;
    pl->sum.bytes_local = pl->bytes_local;
    pl->sum.max_send = t->max_send;
    pl->sum.max_recv = t->max_recv;
    pl->sum.balanced_bound = t->balanced_bound;
    pl->sum.messages = t->messages;
    pl->sum.n_xfers = pl->sum.n_copies = 0; /* counted over the kept items below */
    for (size_t k = 0; k < pl->out_n; k++) {
        if (pl->out[k].src == pl->out[k].dst)
            pl->sum.n_copies++;
        else
            pl->sum.n_xfers++;
    }
}

tide_status tide_reshard_plan_for(const tide_layout_t *old_l, const tide_layout_t *new_l,
                                  const tide_collection_t *c, const uint8_t *alive, size_t n_alive,
                                  int32_t worker, tide_plan_t **out)
{
    if (out == NULL)
        return tide_errorf(TIDE_ERR_INVALID, "tide_reshard_plan_for: out is NULL");
    *out = NULL;
    planner pl;
    tide_status rc = tide__planner_init(&pl, old_l, new_l, c, alive, n_alive, 1);
    if (rc != TIDE_OK)
        return rc;
    tide_plan_t *plan = NULL;
    uint32_t *streams = NULL;
    int32_t *stream_worker = NULL;
    TIDE_CHECK_GOTO(plan_prepare(&pl), rc, fail);
    /* the totals first (they move the node cursors), then only this worker's part */
    tide_plan_totals t;
    memset(&t, 0, sizeof t);
    streams = pl_calloc(&pl, pl.nr ? pl.nr : 1, sizeof *streams);
    TIDE_CHECK_ALLOC_GOTO(streams, rc, fail);
    TIDE_CHECK_GOTO(tide__plan_walk_totals(&pl, &t.messages, &t.max_recv, streams, NULL), rc, fail);
    for (uint32_t r = 0; r < pl.nr; r++)
        t.max_send = pl.load[r] > t.max_send ? pl.load[r] : t.max_send;
    TIDE_CHECK_GOTO(tide__plan_balanced_bound(&pl, &t.balanced_bound), rc, fail);
    reset_cursors(&pl);
    pl.sk_dv = pl_calloc(&pl, pl.n_nodes, sizeof *pl.sk_dv);
    TIDE_CHECK_ALLOC_GOTO(pl.sk_dv, rc, fail);
    pl.sk_touched = pl_calloc(&pl, pl.n_nodes, sizeof *pl.sk_touched);
    TIDE_CHECK_ALLOC_GOTO(pl.sk_touched, rc, fail);
    pl.filter = worker;
    TIDE_CHECK_GOTO(tide__plan_walk(&pl, M_COLLECT), rc, fail);
    collect_summary(&pl, &t);
    /* Items where worker is the source come out sorted; those it receives need ordering. */
    if (pl.out_n > 1)
        qsort(pl.out, pl.out_n, sizeof *pl.out, cmp_xfer);
    plan = tide_calloc(1, sizeof *plan);
    TIDE_CHECK_ALLOC_GOTO(plan, rc, fail);
    pl.mem_bytes += sizeof *plan;
    plan->items = pl.out;
    plan->n = pl.out_n;
    plan->summary = pl.sum;
    pl.out = NULL;
    stream_worker = pl_calloc(&pl, pl.nr ? pl.nr : 1, sizeof *stream_worker);
    TIDE_CHECK_ALLOC_GOTO(stream_worker, rc, fail);
    for (uint32_t r = 0; r < pl.nr; r++)
        stream_worker[r] = pl.ids[r];
    plan->stream_worker = stream_worker;
    plan->stream_count = streams;
    plan->n_stream = pl.nr;
    tide__reshard_set_peak(pl.mem_bytes);
    tide__planner_clear(&pl);
    *out = plan;
    return TIDE_OK;
fail:
    tide__reshard_set_peak(pl.mem_bytes);
    tide__planner_clear(&pl);
    if (plan == NULL || plan->stream_count != streams) {
        tide_free(streams);
        tide_free(stream_worker);
    }
    tide_plan_destroy(&plan);
    return rc;
}

void tide_plan_destroy(tide_plan_t **self_p)
{
    if (self_p == NULL || *self_p == NULL)
        return;
    tide_free((*self_p)->items);
    tide_free((*self_p)->stream_worker);
    tide_free((*self_p)->stream_count);
    tide_free(*self_p);
    *self_p = NULL;
}
