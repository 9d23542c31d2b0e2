/*
 * worker/groups: a layout's communicators and this rank's view of a layout. The groups
 * of a layout (all, and tp, dp, pp split off it) are built at a job's start (tide_join),
 * at a switch (switch_phases.c) and ahead of one (prebuild.c), always in the same order
 * with the same tags on every member; each is published as soon as it exists, so that an
 * abort from the control thread reaches a build in progress. Also the generation tags
 * and the conversion of tided's layouts.
 *
 * Workload: a handful of communicator creations per switch.
 */
#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "worker/tide_int.h"

void tide__lock(tide_t *t)
{
    if (t->ctl != NULL)
        tide__ctl_lock(t->ctl);
}

void tide__unlock(tide_t *t)
{
    if (t->ctl != NULL)
        tide__ctl_unlock(t->ctl);
}

void tide__destroy_comms(tide_coll_comm_t **c, size_t n)
{
    for (size_t i = 0; i < n; i++)
        tide_coll_comm_destroy(&c[i]);
}

int tide__gen_tag(uint64_t gen, int k)
{
    return (int)((gen * 8 + (uint64_t)k) % 16384);
}

/* Publishes group k (0 all, 1 tp, 2 dp, 3 pp) of the layout being built, so that an
   abort of the switch (abort_cb) reaches it while the others are made; ctl's lock held.
   An abort that came before it was published (switch_cancel, set under the same lock)
   found nothing to end: it is aborted here, so the next split fails at once instead of
   waiting on peers that gave up. */
void tide__publish_new_locked(tide_t *t, int k, tide_coll_comm_t *c)
{
    tide_coll_comm_t **slot[4] = {&t->n_all, &t->n_tp, &t->n_dp, &t->n_pp};
    *slot[k] = c;
    if (c != NULL && __atomic_load_n(&t->switch_cancel, __ATOMIC_RELAXED))
        tide_coll_comm_abort(c);
}

static void publish_new(tide_t *t, int k, tide_coll_comm_t *c)
{
    tide__lock(t);
    tide__publish_new_locked(t, k, c);
    tide__unlock(t);
}

void tide__unpublish_new(tide_t *t)
{
    t->n_all = t->n_tp = t->n_dp = t->n_pp = NULL;
}

tide_status tide__build_groups(tide_t *t, const tide_layout_t *l, uint64_t gen,
                               tide_coll_comm_t **parent_p, int member, int p, int d, int tt,
                               tide_coll_comm_t **out)
{
    out[0] = out[1] = out[2] = out[3] = NULL;
    tide_status rc = TIDE_OK;
    int *members = NULL;
    int split = parent_p != NULL && *parent_p != NULL;
    if (split) {
        /* every rank of the parent takes part; ranks outside l get nothing */
        int key = member ? (int)tide_layout_index(l, p, d, tt) : 0;
        TIDE_CHECK_GOTO(tide_coll_comm_split(*parent_p, member ? 0 : -1, key, &out[0]), rc, fail);
        /* the parent's work is done: release it now, so that at most the old layout's
           four, the new all and its splits exist at once. The new all is published in
           the same hold of the lock that unpublishes the parent, so an abort of the
           switch always finds one of them (or is seen by publish_new_locked). */
        tide__lock(t);
        if (t->c_switch == *parent_p)
            t->c_switch = NULL;
        if (out[0] != NULL)
            tide__publish_new_locked(t, 0, out[0]);
        tide__unlock(t);
        tide_coll_comm_destroy(parent_p);
    } else if (member) {
        /* no parent (the first layout, or a release's): all over the pool, among its
           members only */
        size_t n = tide_layout_size(l);
        members = tide_malloc(n * sizeof *members);
        TIDE_CHECK_ALLOC_GOTO(members, rc, fail);
        for (size_t i = 0; i < n; i++)
            members[i] = l->worker[i];
        /* the control thread's abort of the build (switch_cancel: a recovery because a
           member died, a halt, or the abort of a release's switch) ends the handshake at
           once, not after the timeout */
        tide_coll_comm_params cp = {members, (int)n, tide__gen_tag(gen, 1),
                                    (uint32_t)t->opts.switch_timeout_ms, &t->switch_cancel};
        TIDE_CHECK_GOTO(tide_coll_comm_new(&out[0], t->be, t->pool, &cp), rc, fail);
    }
    if (!member) {
        tide_free(members);
        return TIDE_OK;
    }
    if (!split)
        publish_new(t, 0, out[0]); /* a split's was published with the parent's release */
    /* tp, dp and pp split off all (ncclCommSplit for nccl: no bootstrap of their own).
       Colour: the coordinates the group shares; key: the rank inside it. Every member
       of all splits three times, in the same order. */
    const int color[3] = {p * l->dp + d, p * l->tp + tt, d * l->tp + tt};
    const int key[3] = {tt, d, p};
    for (int k = 0; k < 3; k++) {
        TIDE_CHECK_GOTO(tide_coll_comm_split(out[0], color[k], key[k], &out[k + 1]), rc, fail);
        publish_new(t, k + 1, out[k + 1]);
    }
    /* an abort of the switch after the last split aborted what was published: say so
       here rather than hand back groups that fail their first operation */
    if (__atomic_load_n(&t->switch_cancel, __ATOMIC_RELAXED))
        TIDE_FAIL_GOTO(rc, fail, TIDE_ERR_ABORTED,
                       "the switch to generation %llu was aborted while its groups were built",
                       (unsigned long long)gen);
    tide_free(members);
    return TIDE_OK;
fail:
    tide_free(members);
    tide__lock(t);
    tide__unpublish_new(t);
    tide__unlock(t);
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
