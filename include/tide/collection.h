/*
 * The tensor collection: a training job's state as named tensors with partition rules,
 * the parallel layout the state is spread over, and the geometry of each rank's shard.
 *
 * A program declares its collection once (tide_collection_new, tide_collection_add per
 * tensor) and passes it to tide_join; the runtime then moves the shards between layouts.
 * Layouts come from the runtime (tide_view.layout) or, for a program's own shard
 * arithmetic (initialising from full tensors, checking a gathered state), from
 * tide_layout_new. Pure C, no I/O, deterministic; every function may be called from any
 * thread on objects no other thread is changing.
 *
 * Units: shapes and element indices in elements; shard sizes in bytes.
 */
#ifndef TIDE_COLLECTION_H
#define TIDE_COLLECTION_H

#include <stddef.h>
#include <stdint.h>

#include <tide/api.h>
#include <tide/status.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- tensors ------------------------------------------------------------------ */

typedef enum tide_dtype {
    TIDE_F32 = 0,
    TIDE_F16 = 1,
    TIDE_BF16 = 2,
    TIDE_F64 = 3,
    TIDE_I32 = 4,
    TIDE_I64 = 5,
    TIDE_U8 = 6,
} tide_dtype;

/* Bytes per element of dtype (0 for an unknown dtype); any thread. */
TIDE_API size_t tide_dtype_size(tide_dtype dtype);

/* Static lower-case name ("f32"), "?" for an unknown dtype; any thread. */
TIDE_API const char *tide_dtype_name(tide_dtype dtype);

#define TIDE_MAX_DIMS 4
#define TIDE_NAME_MAX 96

/* Owning layer of a tensor: a layer index >= 0, or one of these. */
enum {
    TIDE_LAYER_PRE = -1,  /* held by the first pipeline stage (embedding) */
    TIDE_LAYER_POST = -2, /* held by the last pipeline stage (final norm, head) */
    TIDE_LAYER_ALL = -3,  /* held by every stage (step counter, RNG, data cursor) */
};

typedef enum tide_tp_rule {
    TIDE_TP_REPLICATED = 0, /* every tp rank holds the whole tensor */
    TIDE_TP_SPLIT = 1,      /* split along tp_dim into tp contiguous chunks per segment */
} tide_tp_rule;

typedef enum tide_dp_rule {
    TIDE_DP_REPLICATED = 0, /* every dp rank holds its tp shard */
    TIDE_DP_SHARDED = 1,    /* ZeRO-1: dp rank r holds the r-th contiguous range of the
                               flattened tp shard (ranges as even as possible, the first
                               n % dp ranks one element longer) */
} tide_dp_rule;

typedef struct tide_tensor_desc {
    char name[TIDE_NAME_MAX];
    tide_dtype dtype;
    int ndim;                     /* 1..TIDE_MAX_DIMS */
    int64_t shape[TIDE_MAX_DIMS]; /* global shape, row-major */
    int layer;                    /* >= 0, or TIDE_LAYER_PRE/POST/ALL */
    tide_tp_rule tp;
    int tp_dim;      /* split dimension when tp == TIDE_TP_SPLIT */
    int tp_segments; /* fused segments along tp_dim (QKV: 3); >= 1 */
    tide_dp_rule dp;
} tide_tensor_desc;

/* A job's state as named tensors; immutable once built. Opaque. */
typedef struct tide_collection tide_collection_t;

/* Creates an empty collection for a model of num_layers layers; caller owns *out. */
TIDE_API tide_status tide_collection_new(tide_collection_t **out, int num_layers);

/* Appends a copy of desc after checking it (name unique, shape, rule, layer range). */
TIDE_API tide_status tide_collection_add(tide_collection_t *c, const tide_tensor_desc *desc);

/* Frees *self_p and sets it to NULL; NULL is fine. */
TIDE_API void tide_collection_destroy(tide_collection_t **self_p);

/* Number of layers the collection was created with. */
TIDE_API int tide_collection_num_layers(const tide_collection_t *c);

/* Number of tensors. */
TIDE_API size_t tide_collection_size(const tide_collection_t *c);

/* The i-th tensor (i < size); borrowed, valid as long as c. */
TIDE_API const tide_tensor_desc *tide_collection_tensor(const tide_collection_t *c, size_t i);

/* Finds a tensor by name; TIDE_ERR_NOT_FOUND when absent. */
TIDE_API tide_status tide_collection_find(const tide_collection_t *c, const char *name,
                                          size_t *index);

/* Global size of a tensor in bytes. */
TIDE_API uint64_t tide_tensor_bytes(const tide_tensor_desc *t);

/* Sum of the global sizes of all tensors, in bytes (one replica of the state). */
TIDE_API uint64_t tide_collection_bytes(const tide_collection_t *c);

/* ---- layouts --------------------------------------------------------------------- */

/*
 * A parallel layout. Fields are public and read-only once validated; change
 * them through the functions below. worker[] maps each coordinate
 * (pp rank p, dp rank d, tp rank t) to a worker id >= 0 at index
 * tide_layout_index(l, p, d, t).
 */
typedef struct tide_layout {
    int dp, tp, pp;
    int num_layers;
    int micro_batches;
    int *stage_start; /* pp + 1 entries: stage s owns layers [stage_start[s], stage_start[s+1]) */
    int32_t *worker;  /* dp * tp * pp entries */
} tide_layout_t;

/* Number of coordinates (dp * tp * pp). */
static inline size_t tide_layout_size(const tide_layout_t *l)
{
    return (size_t)l->dp * (size_t)l->tp * (size_t)l->pp;
}

/* Index of coordinate (p, d, t) in worker[] (tp fastest, then dp, then pp). */
static inline size_t tide_layout_index(const tide_layout_t *l, int p, int d, int t)
{
    return ((size_t)p * (size_t)l->dp + (size_t)d) * (size_t)l->tp + (size_t)t;
}

/*
 * Creates a layout with stages as even as possible (the first num_layers % pp
 * stages one layer longer) and the default rank order: worker id = index
 * (tp fastest, then dp, then pp). Caller owns *out.
 */
TIDE_API tide_status tide_layout_new(tide_layout_t **out, int dp, int tp, int pp, int num_layers,
                                     int micro_batches);

/* Deep copy; caller owns *out. */
TIDE_API tide_status tide_layout_copy(tide_layout_t **out, const tide_layout_t *src);

/* Frees *self_p and sets it to NULL; NULL is fine. */
TIDE_API void tide_layout_destroy(tide_layout_t **self_p);

/* Sets stage boundaries from pp + 1 starts (starts[0] = 0, starts[pp] = num_layers). */
TIDE_API tide_status tide_layout_set_stages(tide_layout_t *l, const int *starts);

/* Parses "0-11,12-23" (inclusive layer ranges, one per stage) into the boundaries. */
TIDE_API tide_status tide_layout_parse_stages(tide_layout_t *l, const char *text);

/* Finds the coordinate of worker; TIDE_ERR_NOT_FOUND when it is not in the layout. O(n). */
TIDE_API tide_status tide_layout_find(const tide_layout_t *l, int32_t worker, int *p, int *d,
                                      int *t);

/* Pipeline stage that owns layer (PRE: 0, POST: pp - 1); -1 for ALL or out of range. */
TIDE_API int tide_layout_stage_of(const tide_layout_t *l, int layer);

/*
 * Checks the layout alone (c NULL) or against a collection: degrees >= 1, stages
 * contiguous with >= 1 layer each, worker ids >= 0 and unique, tp divides every
 * split dimension per segment, layer counts agree. Fails with TIDE_ERR_INVALID
 * and a precise detail ("tp=3 does not divide dimension 0 of layer.4.fc1.weight
 * (size 4096)", "worker 7 appears twice", "stage 2 has no layers").
 */
TIDE_API tide_status tide_layout_validate(const tide_layout_t *l, const tide_collection_t *c);

/* Writes "(dp 2, tp 2, pp 2; stages 0-11,12-23)" into buf; returns buf. */
TIDE_API char *tide_layout_format(const tide_layout_t *l, char *buf, size_t len);

/* ---- what a program can run -------------------------------------------------------- */

/* The parallel degree a fit rule constrains. */
typedef enum tide_degree {
    TIDE_DEGREE_DP = 0,
    TIDE_DEGREE_TP = 1,
    TIDE_DEGREE_PP = 2,
    TIDE_DEGREE_DP_MICRO = 3, /* dp x micro-batches: what splits the global batch */
} tide_degree;

#define TIDE_FIT_WHAT_MAX  96 /* bytes of tide_fit_rule.what, NUL included */
#define TIDE_FIT_RULES_MAX 32 /* rules one program may declare */

/*
 * One limit of the program on its layouts: the degree must divide n. A program splits
 * things by its degrees and can only split them evenly, e.g. a global batch of B samples
 * in M micro-batches per dp rank: {TIDE_DEGREE_DP_MICRO, B, "the global batch"} (dp x M
 * must divide B, whatever M a resize chooses); attention heads, hidden and FFN widths
 * split over tp: one {TIDE_DEGREE_TP, size, "..."} each. The collection's own limits need no rule (tp divides
 * every split dimension; pp is at most the layers and stages cover them all): every
 * layout is checked against those anyway.
 */
typedef struct tide_fit_rule {
    tide_degree degree;           /* which degree must divide n */
    int64_t n;                    /* >= 1 */
    char what[TIDE_FIT_WHAT_MAX]; /* what n counts, for refusals ("the global batch 16 / 4
                                     micro-batches"); printable ASCII, may be "" */
} tide_fit_rule;

/* Static lower-case name of a degree ("dp", "tp", "pp", "dp_micro"), "?" when out of range;
   any thread. */
TIDE_API const char *tide_degree_name(tide_degree degree);

/*
 * Checks the degrees (dp, tp, pp) and the micro-batch count against rules[0..n): TIDE_OK
 * when each degree (dp_micro: dp x micro) divides the n of every rule for it, else
 * TIDE_ERR_INVALID naming the first rule broken: "dp 3 does not divide 4 (...)", "dp 3 x 4
 * micro-batches = 12 does not divide 16 (the global batch)". Malformed rules (more than
 * TIDE_FIT_RULES_MAX, an unknown degree, n < 1, what not a printable string) and degrees
 * below 1 are TIDE_ERR_INVALID too. rules may be NULL when n is 0. Pure.
 */
TIDE_API tide_status tide_fit_check(const tide_fit_rule *rules, size_t n, int dp, int tp, int pp,
                                    int micro);

/* Writes the rules as text ("dp x micro-batches divides 16 (the global batch); tp divides 64
   (the hidden size)"; "any layout" when n is 0) into buf; returns buf. */
TIDE_API char *tide_fit_format(const tide_fit_rule *rules, size_t n, char *buf, size_t len);

/* ---- shard geometry -------------------------------------------------------------- */

/*
 * Bytes of tensor i held at coordinate (p, d, t) of layout l: the local buffer
 * is the tp shard (for a split tensor: each segment's chunk, segments in order,
 * row-major over the shard shape), then, when DP-sharded, only this dp rank's
 * contiguous range of it. 0 when the stage does not hold the tensor.
 */
TIDE_API uint64_t tide_shard_bytes(const tide_layout_t *l, const tide_collection_t *c, size_t i,
                                   int p, int d, int t);

/* Copies coordinate (p, d, t)'s local shard of tensor i out of the full tensor (host
   memory, tide_shard_bytes of local). */
TIDE_API void tide_shard_extract(const tide_layout_t *l, const tide_collection_t *c, size_t i,
                                 int p, int d, int t, const void *global, void *local);

/* Writes coordinate (p, d, t)'s local shard of tensor i into the full tensor (host memory). */
TIDE_API void tide_shard_insert(const tide_layout_t *l, const tide_collection_t *c, size_t i, int p,
                                int d, int t, const void *local, void *global);

#ifdef __cplusplus
}
#endif

#endif /* TIDE_COLLECTION_H */
