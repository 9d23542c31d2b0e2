/*
 * The MPI implementation of tide_mlp_comm for train_mlp (host memory), and whole-state
 * gather/scatter through one root rank (checkpoints, tests, relayout by
 * checkpoint-restart). Worker id = rank in the given world communicator.
 *
 * Workload: one communicator set per layout, rebuilt on every layout change (the
 * splits are collective over world); transfers of activation-sized messages per
 * micro-batch, one gradient allreduce per step.
 */
#ifndef TIDE_EXAMPLES_MLP_MPI_H
#define TIDE_EXAMPLES_MLP_MPI_H

#include <mpi.h>

#include "examples/mlp.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tide_mlp_mpi tide_mlp_mpi_t;

/*
 * Splits world into the tp, dp and pp groups of layout l for the calling rank (worker
 * id = world rank). Collective over world: every rank calls it, including ranks that l
 * leaves idle (they get a comm whose calls fail). Errors on the new communicators are
 * returned, not fatal. Caller owns *out.
 */
tide_status tide_mlp_mpi_new(tide_mlp_mpi_t **out, MPI_Comm world, const tide_layout_t *l);

/* Frees the communicators (collective over each group) and sets *self_p to NULL. */
void tide_mlp_mpi_destroy(tide_mlp_mpi_t **self_p);

/* The callback table (borrowed, valid as long as self). */
const tide_mlp_comm *tide_mlp_mpi_comm(const tide_mlp_mpi_t *self);

/*
 * Gathers the full state of m's current layout to root: on root *full_out gets one
 * host buffer per collection tensor holding the whole tensor (free with
 * tide_mlp_full_free); elsewhere NULL. Collective over world; blocking.
 */
tide_status tide_mlp_gather(const tide_mlp_t *m, MPI_Comm world, int root, void ***full_out);

/* Scatters full tensors held by root (ignored elsewhere) into every worker's local
 * buffers of m's current layout, step and cursor included. Collective over world. */
tide_status tide_mlp_scatter(tide_mlp_t *m, MPI_Comm world, int root, void *const *full);

/* Frees a gather result of collection c and sets *full_p to NULL; NULL is fine. */
void tide_mlp_full_free(const tide_collection_t *c, void ***full_p);

/*
 * Moves m to new_l the checkpoint-restart way: gather to root, new buffers, scatter
 * (the baseline a live reshard is compared to). The caller rebuilds its comm for
 * new_l. Collective over world.
 */
tide_status tide_mlp_relayout_via_root(tide_mlp_t *m, MPI_Comm world, int root,
                                       const tide_layout_t *new_l);

#ifdef __cplusplus
}
#endif

#endif /* TIDE_EXAMPLES_MLP_MPI_H */
