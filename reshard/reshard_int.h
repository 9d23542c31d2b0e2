/*
 * reshard internals shared by the module's sources (collection.c, layout.c,
 * geometry.c, plan*.c, place.c, fit.c). Nothing here is for other modules;
 * benchmarks and tests may read the planner's memory counter, and the plan checker of
 * the tests (tests/support/plan_check.c) reads the geometry.
 *
 * Geometry model used everywhere: a tensor is viewed as [A, D, B] around its
 * tp dimension (A: product of the dimensions before it, D: its size, B: product
 * of the dimensions after it). D is made of S fused segments; tp rank t holds,
 * for each of the A * S (a, s) pairs, a chunk of c = D / (S * tp) indices along
 * D, so its tp shard is K = A * S blocks of L = c * B contiguous elements, both
 * in the global tensor and in the local buffer. A tp-replicated tensor is the
 * special case A = D = S = 1, B = numel, tp = 1.
 */
#ifndef TIDE_RESHARD_INT_H
#define TIDE_RESHARD_INT_H

#include <stddef.h>
#include <stdint.h>

#include "reshard/reshard.h"

/* Per-tensor geometry, derived once when the tensor is added. */
typedef struct tide__tgeom {
    uint64_t numel; /* elements of the global tensor */
    uint64_t a;     /* product of the dimensions before tp_dim (1 when replicated) */
    uint64_t d;     /* size of tp_dim (1 when replicated) */
    uint64_t b;     /* product of the dimensions after tp_dim (numel when replicated) */
    uint32_t s;     /* fused segments along tp_dim (1 when replicated) */
    uint32_t es;    /* bytes per element */
} tide__tgeom;

struct tide_collection {
    int num_layers;
    size_t n, cap;
    tide_tensor_desc *t; /* n descriptors, in insertion order */
    tide__tgeom *g;      /* n geometries, parallel to t */
    uint32_t *hash;      /* open addressing: index + 1, 0 = empty; hash_cap is a power of 2 */
    size_t hash_cap;
    uint64_t total_bytes;
};

/* Shard view of one tensor at one coordinate: the tp chunk and, if DP-sharded, the dp range. */
typedef struct tide__shard {
    uint64_t k;      /* blocks in the tp shard (A * S) */
    uint64_t c;      /* tp-dim indices per block chunk */
    uint64_t l;      /* elements per block (c * B) */
    uint64_t first;  /* first tp-dim index of this rank's chunk inside each segment */
    uint64_t n;      /* elements of the tp shard (K * L) */
    uint64_t lo, hi; /* the range of the tp shard held locally, in elements */
} tide__shard;

/* Effective tp degree of tensor t under a layout's tp (1 for a replicated tensor). */
static inline uint64_t tide__tp_eff(const tide_tensor_desc *t, int tp)
{
    return t->tp == TIDE_TP_SPLIT ? (uint64_t)tp : 1u;
}

/* ZeRO-1 range of dp rank r over n elements: the first n % dp ranks one element longer. */
static inline void tide__zero_range(uint64_t n, uint64_t dp, uint64_t r, uint64_t *start,
                                    uint64_t *len)
{
    uint64_t base = n / dp, extra = n % dp;
    *len = base + (r < extra ? 1u : 0u);
    *start = r * base + (r < extra ? r : extra);
}

/* The dp rank whose ZeRO-1 range over n elements holds element u (u < n). */
static inline uint64_t tide__zero_owner(uint64_t n, uint64_t dp, uint64_t u)
{
    uint64_t base = n / dp, extra = n % dp;
    uint64_t head = extra * (base + 1);
    if (u < head)
        return u / (base + 1);
    return extra + (u - head) / base; /* base > 0 here: u < n = head + (dp - extra) * base */
}

/*
 * Fills *sh for tensor i at (tp rank t of tp, dp rank d of dp); tp and dp are the
 * layout's degrees (tp is reduced to 1 for a replicated tensor inside).
 */
void tide__shard_of(const tide_collection_t *c, size_t i, int tp, int t, int dp, int d,
                    tide__shard *sh);

/* Global element index of tp-shard element e (e < sh->n) of tensor g. */
static inline uint64_t tide__shard_global(const tide__tgeom *g, const tide__shard *sh, uint64_t e)
{
    uint64_t k = e / sh->l, o = e % sh->l;
    uint64_t a = k / g->s, s = k % g->s;
    return (a * g->d + s * (g->d / g->s) + sh->first) * g->b + o;
}

/* Stage of layout l holding a tensor of layer (0 for PRE, pp - 1 for POST, -1 for ALL). */
int tide__stage_of(const tide_layout_t *l, int layer);

/* True when stage p of l holds a tensor of this layer. */
static inline int tide__stage_holds(const tide_layout_t *l, int p, int layer)
{
    return layer == TIDE_LAYER_ALL || tide__stage_of(l, layer) == p;
}

/* Coordinates of layout index idx. */
static inline void tide__coord(const tide_layout_t *l, size_t idx, int *p, int *d, int *t)
{
    *t = (int)(idx % (size_t)l->tp);
    idx /= (size_t)l->tp;
    *d = (int)(idx % (size_t)l->dp);
    *p = (int)(idx / (size_t)l->dp);
}

/*
 * A sorted index of a layout's worker ids: ids[k] ascending, pos[k] the layout
 * index holding ids[k]. Built by tide__worker_index_new; freed with tide_free
 * on the struct's arrays through tide__worker_index_free.
 */
typedef struct tide__worker_index {
    int32_t *ids;
    uint32_t *pos;
    size_t n;
} tide__worker_index;

/* Builds the sorted index of l's workers; fails on a duplicate id (TIDE_ERR_INVALID). */
tide_status tide__worker_index_new(const tide_layout_t *l, tide__worker_index *ix);

/* Frees the index's arrays; safe on a zeroed struct. */
void tide__worker_index_free(tide__worker_index *ix);

/* Layout index of worker id, or -1 when absent. O(log n). */
long tide__worker_index_find(const tide__worker_index *ix, int32_t id);

/* Whether worker id is alive under (alive, n_alive); NULL alive means every worker. */
static inline int tide__is_alive(const uint8_t *alive, size_t n_alive, int32_t id)
{
    if (alive == NULL)
        return 1;
    return id >= 0 && (size_t)id < n_alive && alive[id] != 0;
}

/*
 * Bytes of tensor i held both by an old coordinate (tp rank ot of otp, dp rank
 * od of odp) and a new one (nt of ntp, nd of ndp), stages aside. O(1).
 */
uint64_t tide__overlap_bytes(const tide_collection_t *c, size_t i, int otp, int odp, int ot, int od,
                             int ntp, int ndp, int nt, int nd);

/*
 * Bytes the planner allocated (and held at once: it frees only at the end)
 * during the calling thread's last tide_reshard_plan / tide_reshard_plan_for /
 * tide_reshard_place call, including the returned plan or layout. For
 * benchmarks; any thread, reads its own counter.
 */
uint64_t tide__reshard_peak_bytes(void);

/* Internal: sets the calling thread's peak counter (the planner and placement call it). */
void tide__reshard_set_peak(uint64_t bytes);

#endif /* TIDE_RESHARD_INT_H */
