/*
 * examples/mlp_statefile: a run's whole final state in one file, so that two runs (one
 * resized or recovered, one never resized) can be compared tensor by tensor after the
 * fact. train_mlp --state-out writes it; mlp_state_diff compares two. Format (one reader,
 * one writer, here): the text line "tide-mlp-state 1", the line "tensors N", then per
 * collection tensor the line "tensor NAME DTYPE BYTES HASH" (DTYPE: tide_dtype number,
 * HASH: 16 hex digits of a 64-bit FNV-1a hash of the bytes) followed by BYTES raw bytes
 * (host order). Workload: test-sized models (the writer holds the whole state).
 */
#ifndef TIDE_EXAMPLES_MLP_STATEFILE_H
#define TIDE_EXAMPLES_MLP_STATEFILE_H

#include <stddef.h>
#include <stdint.h>

#include <tide/status.h>
#include "reshard/reshard.h"

#ifdef __cplusplus
extern "C" {
#endif

/* 64-bit hash of n bytes (FNV-1a with a final mix); never 0. Any thread. */
uint64_t tide_mlp_state_hash(const void *p, uint64_t n);

/* Writes full (one buffer per tensor of c, the whole tensor, as tide_mlp_gather gives)
 * to path, replacing it (written to path.tmp, then renamed). Blocking. */
tide_status tide_mlp_state_write(const char *path, const tide_collection_t *c, void *const *full);

/* What tide_mlp_state_compare found. */
typedef struct tide_mlp_state_diff {
    size_t tensors;   /* compared */
    size_t identical; /* bit-identical */
    double worst_rel; /* largest ||a - b|| / ||b|| of a float tensor (0 when all equal) */
    char worst[128];  /* the tensor it was found in ("" when none differs) */
    double worst_abs; /* largest |a - b| of one element over all float tensors */
} tide_mlp_state_diff;

/*
 * Compares state files a and b: the same tensors (names, dtypes, sizes, order) or
 * TIDE_ERR_INVALID naming the first difference; integer tensors must be equal
 * (TIDE_ERR_INVALID naming it); float tensors differ by at most rtol in relative L2 norm
 * (TIDE_ERR_RANGE naming the worst one otherwise). *out is filled either way when the
 * files could be read. A truncated file or a hash that does not match its bytes is
 * TIDE_ERR_IO.
 */
tide_status tide_mlp_state_compare(const char *a, const char *b, double rtol,
                                   tide_mlp_state_diff *out);

#ifdef __cplusplus
}
#endif

#endif /* TIDE_EXAMPLES_MLP_STATEFILE_H */
