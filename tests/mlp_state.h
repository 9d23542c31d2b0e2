/*
 * State fingerprints for the MPI tests of train_mlp under libtide: the whole state of a
 * layout, gathered to its first member, hashed tensor by tensor, so that two moments of
 * a run (before and after a switch or a recovery) compare bit for bit without keeping
 * both copies. Header-only, static functions. Workload: small test models.
 */
#ifndef TIDE_TESTS_MLP_STATE_H
#define TIDE_TESTS_MLP_STATE_H

#include <stdint.h>

#include "examples/mlp_mpi.h"
#include "examples/mlp_tide.h"

/* 64-bit hash of a buffer (FNV-1a over bytes, with a final mix); never 0, which callers
   use for "not recorded". */
static inline uint64_t mlp_hash_bytes(const void *p, uint64_t n)
{
    const unsigned char *b = p;
    uint64_t h = 0xcbf29ce484222325ull ^ n;
    for (uint64_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 0x100000001b3ull;
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    return h | 1;
}

/* Gathers m's whole state over the members of view v of runtime t (tide_mlp_tide_gather); on the
   layout's first member out[i] gets the hash of collection tensor i, elsewhere out is
   left alone. Collective over v's members; blocking; main thread. */
static inline tide_status mlp_state_hashes(const tide_t *t, const tide_mlp_t *m, const tide_view *v,
                                           uint64_t *out)
{
    void **full = NULL;
    tide_status rc = tide_mlp_tide_gather(t, m, v, &full);
    if (rc != TIDE_OK || full == NULL)
        return rc;
    const tide_collection_t *c = tide_mlp_collection(m);
    for (size_t i = 0; i < tide_collection_size(c); i++)
        out[i] = mlp_hash_bytes(full[i], tide_tensor_bytes(tide_collection_tensor(c, i)));
    tide_mlp_full_free(c, &full);
    return TIDE_OK;
}

#endif /* TIDE_TESTS_MLP_STATE_H */
