/*
 * train_mlp on libtide: the tide_mlp_comm adapter over the communicators of a libtide
 * view (tp / dp groups, pipeline neighbours), the elastic training loop (step, switch
 * layouts live, go idle, come back, finish) shared by train_mlp --tide and the tests,
 * and a whole-state gather over a view's communicator for checks.
 *
 * Workload: one tide_t per rank, the model's state in host memory (mpi backend) or
 * device memory (nccl backend); one step at a time from the main thread; a layout
 * switch every few minutes at most. Everything here runs on the thread that called
 * MPI_Init_thread.
 */
#ifndef TIDE_EXAMPLES_MLP_TIDE_H
#define TIDE_EXAMPLES_MLP_TIDE_H

#include <tide/tide.h>

#include "examples/mlp.h"

#ifdef __cplusplus
extern "C" {
#endif

/* tide_mlp_comm over the communicators of t's current view. */
typedef struct tide_mlp_tide_comm {
    tide_mlp_comm comm; /* what tide_mlp_step takes; ctx points at this struct */
    tide_t *t;          /* borrowed */
    const tide_view *v; /* borrowed: tide_view_get(t) when built */
    const struct tide_mlp_tide_hooks *hooks; /* borrowed, may be NULL: at */
    const tide_mlp_t *m;                     /* borrowed: the model hooks are given */
} tide_mlp_tide_comm;

/*
 * Fills c with callbacks over tide_view_get(t): allreduce on v->tp / v->dp / v->pp,
 * the pipeline exchange as one grouped send/receive on v->pp with v->pp_prev /
 * v->pp_next (timed as a pipeline bubble). Rebuild it after every tide_reshard (the
 * view's communicators are replaced). On a rank outside the layout every call fails
 * with TIDE_ERR_INVALID. Never blocks; main thread.
 */
void tide_mlp_tide_comm_init(tide_mlp_tide_comm *c, tide_t *t);

/* What the elastic loop measured around one switch on this rank. */
typedef struct tide_mlp_switch_stats {
    tide_reshard_stats rs; /* tide_reshard's (data movement, communicators, waits) */
    double alloc_ms;       /* new buffers allocated at the switch, ms (~0 when prepared) */
    double adopt_ms;       /* the model adopted the new buffers and freed the old, ms */
    int prepared;          /* the new buffers were allocated and first-touched before the
                              switch step (tide_set_prepare), overlapping steps; with buffers
                              the runtime owns: tide_reshard_stats.prepared */
    double prepare_ms;     /* how long that preparation took on its thread, ms */
} tide_mlp_switch_stats;

/*
 * Callbacks of the elastic loop; every member may be NULL. A callback returning an
 * error stops tide_mlp_tide_train with that status.
 */
typedef struct tide_mlp_tide_hooks {
    void *ctx;
    /* A member completed (and counted) step `step`; loss is the batch's global mean, NaN
       when this member finished the step alone after a peer died in its last reduction
       (TIDE_STEP_FINISH). */
    tide_status (*on_step)(void *ctx, tide_t *t, const tide_mlp_t *m, int64_t step, double loss,
                           double seconds);
    /* A switch was announced (tide_view_next(t) is the new layout); the old layout,
       buffers and communicators are still in place. Called on every participant. */
    tide_status (*before_switch)(void *ctx, tide_t *t, const tide_mlp_t *m);
    /* The switch is done: tide_view_get(t) and the model describe the new layout. */
    tide_status (*after_switch)(void *ctx, tide_t *t, const tide_mlp_t *m,
                                const tide_mlp_switch_stats *stats);
    /* Before step v->step on a member: nonzero ends the job (tide_finish). Every member
       of the layout must give the same answer for the same step. NULL: never. */
    int (*done)(void *ctx, const tide_view *v);
    /* 1: allocate the new buffers at the switch step instead of preparing them ahead
       (tide_set_prepare; for comparisons). */
    int no_prepare;
    /* On a member inside step `step` (the count completed before it), at a point of
       tide_mlp_step (tide_mlp_comm.at). */
    tide_status (*at)(void *ctx, tide_t *t, const tide_mlp_t *m, int64_t step,
                      tide_mlp_point point);
} tide_mlp_tide_hooks;

/*
 * The elastic training loop of one rank, after tide_join and, on a member, the model's
 * state filled and registered (tide_set_buffers(t, tide_mlp_buffers(m))). Runs steps
 * while this rank is a member; on TIDE_STEP_RECONFIGURE allocates the model's buffers
 * for tide_view_next, reshards into them, adopts them (the old buffers are freed) and
 * rebuilds the comm; waits inside the runtime while idle. Unless hooks->no_prepare, it
 * registers a tide_set_prepare function that allocates and first-touches the buffers of
 * an announced layout on libtide's helper thread while steps go on, and switches into
 * those (a switch then moves data without page faults). Returns TIDE_OK when the job
 * ended: on members when hooks->done said so for every member (tide_finish releases
 * the idle ranks), on idle ranks when they were released. A step whose collectives
 * were aborted (a peer failed) is not counted and the loop goes on with the recovery
 * layout; a failed switch (tide_reshard's status) or a failed hook is returned. Before tide_destroy
 * the program should wait for every rank of the pool (MPI_Barrier on the world it gave tide_new),
 * so that no rank says bye to tided while a peer still runs its last step. Blocks; main thread.
 */
tide_status tide_mlp_tide_train(tide_t *t, tide_mlp_t *m, const tide_mlp_tide_hooks *hooks);

#define TIDE_MLP_FIT_RULES 3 /* rules tide_mlp_tide_fit writes at most */

/*
 * What the model can run, as libtide's fit rules for tide_join_req.fit, from its config:
 * dp x micro-batches divides global_batch (every dp rank takes an equal share of the
 * batch in equal micro-batches, whatever count a resize gives the job); tp divides the
 * FFN width and the vocabulary (fc1 and the
 * vocab-parallel embedding and head are split over tp; named here so that a refusal
 * names them). Writes at most TIDE_MLP_FIT_RULES rules into out and their count into
 * *n_out. TIDE_ERR_INVALID when micro_batches (the first layout's) does not divide the
 * global batch (no dp can run it). Pure.
 */
tide_status tide_mlp_tide_fit(const tide_mlp_config *cfg, int micro_batches, tide_fit_rule *out,
                              int *n_out);

/*
 * Hands the model's state to the runtime (after tide_join, on every rank of the pool,
 * with the state filled on members): copies it into buffers from tide_alloc_buffers,
 * gives those to the runtime (tide_give_buffers) and makes the model use them
 * (tide_mlp_adopt_borrowed), so that tide_mlp_tide_train's switches rebuild the state
 * in place, in the memory the rank already holds. Blocks; main thread.
 */
tide_status tide_mlp_tide_give(tide_t *t, tide_mlp_t *m);

/*
 * Gathers the full state of the model's current layout over v->all (v =
 * tide_view_get(t), a member) to the layout's first member: there *full_out gets one
 * host buffer per collection tensor holding the whole tensor (free with
 * tide_mlp_full_free from mlp_mpi.h), elsewhere NULL. When the replicas of a shard
 * (dp replicas, tp-replicated tensors) are not bit-identical to the copy gathered,
 * fails with TIDE_ERR_INTERNAL naming the tensor and coordinate. Collective over the
 * layout's members; blocking; for checks and small models (the root holds it all).
 */
tide_status tide_mlp_tide_gather(const tide_t *t, const tide_mlp_t *m, const tide_view *v,
                                 void ***full_out);

#ifdef __cplusplus
}
#endif

#endif /* TIDE_EXAMPLES_MLP_TIDE_H */
