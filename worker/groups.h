/*
 * worker/groups: a layout's communicators and this rank's view of a layout. The groups
 * of a layout (all, and tp, dp, pp split off it) are built at a job's start (job.c), at a
 * switch (switch_phases.c) and ahead of one (prebuild.c), always in the same order with
 * the same tags on every member, each watching the generation's abort word (gens.c), so
 * that tided's abort reaches a build in progress without anyone holding the pointers.
 * Also the generation tags and the conversion of tided's layouts. Pure but for the
 * communicators it makes; any one thread at a time.
 */
#ifndef TIDE_WORKER_GROUPS_H
#define TIDE_WORKER_GROUPS_H

#include <tide/tide.h>

#include "collectives/collectives.h"
#include "worker/worker_int.h"

/* tide__gen_tag's k of the switch communicator built ahead: a tag of its own, so that no
   message of a build that was abandoned matches one made at a switch step; and of the
   participants' agreement that every one of them has the whole set. */
#define TIDE__TAG_PREBUILT       6
#define TIDE__TAG_PREBUILT_AGREE 2

/* The pool tag of generation gen's k-th use (0: the switch's participants, 1: the layout's
   all made over the pool, 2: the agreement on what was built ahead, 5: a join, 6: the
   switch's communicator built ahead, 7: a release's pools; splits derive theirs from their
   parent's); the same on every rank. */
int tide__gen_tag(uint64_t gen, int k);

/* Fills v for worker me in layout l (NULL: no layout); communicators NULL. */
void tide__fill_view(tide_view *v, uint64_t gen, const tide_layout_t *l, int32_t me, int64_t step);

/* Converts a proto layout into a reshard layout; caller owns *out. */
tide_status tide__layout_from_proto(const tide_proto_layout_t *pl, tide_layout_t **out);

/* Destroys n communicators (NULL entries fine) and nulls them. */
void tide__destroy_comms(tide_coll_comm_t **c, size_t n);

/* Where a generation's groups are made: the backend and pool, the creation timeout, and
   the generation's abort word (cancel and watch of every communicator made). */
typedef struct tide__group_ctx {
    const tide_coll_backend_v1 *be;
    tide_coll_pool_t *pool;
    uint32_t timeout_ms;
    const int *word;
} tide__group_ctx;

/* Creates layout l's groups that this rank belongs to (its place in l: v, whose
   generation tags them): all split off *parent_p (every rank of the parent calls it; the
   parent is destroyed once all exists, unless keep_parent), or with parent_p NULL made over
   the pool among l's members only (only they call it: a job's first layout, or a
   release's over the pool that stays); then tp, dp and pp split off all. out[4] = {all,
   tp, dp, pp}, NULL where not a member; on failure all NULL (what was made is destroyed).
   TIDE_ERR_ABORTED when the word was set while they were made. Blocks until the members
   arrive (the timeout, or the word). */
tide_status tide__build_groups(const tide__group_ctx *gc, const tide_layout_t *l,
                               const tide_view *v, tide_coll_comm_t **parent_p, int keep_parent,
                               tide_coll_comm_t **out);

#endif /* TIDE_WORKER_GROUPS_H */
