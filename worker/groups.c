/*
 * worker/groups: a layout's communicators (groups.h), views and tags. Workload: a handful
 * of communicator creations per switch.
 */
#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "worker/groups.h"

void tide__destroy_comms(tide_coll_comm_t **c, size_t n)
{
    for (size_t i = 0; i < n; i++)
        tide_coll_comm_destroy(&c[i]);
}

int tide__gen_tag(uint64_t gen, int k)
{
    return (int)((gen * 8 + (uint64_t)k) % 16384);
}

tide_status tide__build_groups(const tide__group_ctx *gc, const tide_layout_t *l,
                               const tide_view *v, tide_coll_comm_t **parent_p, int keep_parent,
                               tide_coll_comm_t **out)
{
    out[0] = out[1] = out[2] = out[3] = NULL;
    uint64_t gen = v->generation;
    int member = v->member, p = v->pp_rank, d = v->dp_rank, tt = v->tp_rank;
    tide_status rc = TIDE_OK;
    int *members = NULL;
    int split = parent_p != NULL && *parent_p != NULL;
    if (split) {
        /* every rank of the parent takes part; ranks outside l get nothing */
        int key = member ? (int)tide_layout_index(l, p, d, tt) : 0;
        TIDE_CHECK_GOTO(tide_coll_comm_split(*parent_p, member ? 0 : -1, key, &out[0]), rc, fail);
        /* the parent's work is done: release it now, so that at most the old layout's
           four, the new all and its splits exist at once */
        if (!keep_parent)
            tide_coll_comm_destroy(parent_p);
    } else if (member) {
        /* no parent (the first layout, or a release's): all over the pool, among its
           members only */
        size_t n = tide_layout_size(l);
        members = tide_malloc(n * sizeof *members);
        TIDE_CHECK_ALLOC_GOTO(members, rc, fail);
        for (size_t i = 0; i < n; i++)
            members[i] = l->worker[i];
        /* the control thread's abort of the generation (a recovery because a member died,
           a halt, the abort of a release's switch) ends the handshake at once, not after
           the timeout */
        tide_coll_comm_params cp = {members,        (int)n,   tide__gen_tag(gen, 1),
                                    gc->timeout_ms, gc->word, gc->word};
        TIDE_CHECK_GOTO(tide_coll_comm_new(&out[0], gc->be, gc->pool, &cp), rc, fail);
    }
    tide_free(members);
    members = NULL;
    if (!member)
        return TIDE_OK;
    /* tp, dp and pp split off all (ncclCommSplit for nccl: no bootstrap of their own).
       Colour: the coordinates the group shares; key: the rank inside it. Every member
       of all splits three times, in the same order. */
    const int color[3] = {p * l->dp + d, p * l->tp + tt, d * l->tp + tt};
    const int key[3] = {tt, d, p};
    for (int k = 0; k < 3; k++)
        TIDE_CHECK_GOTO(tide_coll_comm_split(out[0], color[k], key[k], &out[k + 1]), rc, fail);
    /* an abort after the last split: say so here rather than hand back groups that fail
       their first operation */
    if (gc->word != NULL && __atomic_load_n(gc->word, __ATOMIC_ACQUIRE))
        TIDE_FAIL_GOTO(rc, fail, TIDE_ERR_ABORTED,
                       "generation %llu was aborted while its groups were built",
                       (unsigned long long)gen);
    return TIDE_OK;
fail:
    tide_free(members);
    tide__destroy_comms(out, 4);
    return rc;
}

void tide__fill_view(tide_view *v, uint64_t gen, const tide_layout_t *l, int32_t me, int64_t step)
{
    memset(v, 0, sizeof *v);
    v->generation = gen;
    v->layout = l;
    v->step = step;
    v->pp_rank = v->dp_rank = v->tp_rank = -1;
    v->pp_prev = v->pp_next = -1;
    if (l != NULL && tide_layout_find(l, me, &v->pp_rank, &v->dp_rank, &v->tp_rank) == TIDE_OK) {
        v->member = 1;
        v->pp_prev = v->pp_rank > 0 ? v->pp_rank - 1 : -1;
        v->pp_next = v->pp_rank + 1 < l->pp ? v->pp_rank + 1 : -1;
    } else {
        v->pp_rank = v->dp_rank = v->tp_rank = -1;
    }
    tide_error_clear();
}

tide_status tide__layout_from_proto(const tide_proto_layout_t *pl, tide_layout_t **out)
{
    tide_layout_t *l = NULL;
    TIDE_CHECK(tide_layout_new(&l, pl->dp, pl->tp, pl->pp, pl->num_layers, pl->micro_batches));
    tide_status rc = tide_layout_set_stages(l, pl->stage_start);
    if (rc != TIDE_OK) {
        tide_layout_destroy(&l);
        return rc;
    }
    memcpy(l->worker, pl->worker, tide_layout_size(l) * sizeof *l->worker);
    *out = l;
    return TIDE_OK;
}
