/*
 * Tensor collections: the job's state as named tensors with their partition
 * rules, checked on insertion, and the Megatron-style GPT builder. Workload:
 * up to ~10^5 tensors built once per job; lookups by name through a hash
 * index (O(1)), everything else by index.
 */
#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "reshard/reshard_int.h"

/* Largest tensor we accept, in bytes: keeps every byte offset product far from overflow. */
#define MAX_TENSOR_BYTES (UINT64_C(1) << 56)

size_t tide_dtype_size(tide_dtype dtype)
{
    switch (dtype) {
    case TIDE_F32:
    case TIDE_I32:
        return 4;
    case TIDE_F16:
    case TIDE_BF16:
        return 2;
    case TIDE_F64:
    case TIDE_I64:
        return 8;
    case TIDE_U8:
        return 1;
    }
    return 0;
}

const char *tide_dtype_name(tide_dtype dtype)
{
    switch (dtype) {
    case TIDE_F32:
        return "f32";
    case TIDE_F16:
        return "f16";
    case TIDE_BF16:
        return "bf16";
    case TIDE_F64:
        return "f64";
    case TIDE_I32:
        return "i32";
    case TIDE_I64:
        return "i64";
    case TIDE_U8:
        return "u8";
    }
    return "?";
}

tide_status tide_collection_new(tide_collection_t **out, int num_layers)
{
    if (out == NULL)
        return tide_errorf(TIDE_ERR_INVALID, "tide_collection_new: out is NULL");
    *out = NULL;
    if (num_layers < 0)
        return tide_errorf(TIDE_ERR_INVALID, "a collection needs num_layers >= 0, got %d",
                           num_layers);
    tide_collection_t *c = tide_calloc(1, sizeof *c);
    if (c == NULL)
        return tide_errorf(TIDE_ERR_NOMEM, "out of memory allocating a tensor collection");
    c->num_layers = num_layers;
    *out = c;
    return TIDE_OK;
}

void tide_collection_destroy(tide_collection_t **self_p)
{
    if (self_p == NULL || *self_p == NULL)
        return;
    tide_collection_t *c = *self_p;
    tide_free(c->t);
    tide_free(c->g);
    tide_free(c->hash);
    tide_free(c);
    *self_p = NULL;
}

int tide_collection_num_layers(const tide_collection_t *c)
{
    return c->num_layers;
}

size_t tide_collection_size(const tide_collection_t *c)
{
    return c->n;
}

const tide_tensor_desc *tide_collection_tensor(const tide_collection_t *c, size_t i)
{
    return i < c->n ? &c->t[i] : NULL;
}

uint64_t tide_tensor_bytes(const tide_tensor_desc *t)
{
    uint64_t n = tide_dtype_size(t->dtype);
    for (int k = 0; k < t->ndim && k < TIDE_MAX_DIMS; k++)
        n *= (uint64_t)t->shape[k];
    return n;
}

uint64_t tide_collection_bytes(const tide_collection_t *c)
{
    return c->total_bytes;
}

/* FNV-1a: names are short and the table is rebuilt rarely. */
static uint64_t name_hash(const char *s)
{
    uint64_t h = UINT64_C(1469598103934665603);
    for (; *s; s++) {
        h ^= (unsigned char)*s;
        h *= UINT64_C(1099511628211);
    }
    return h;
}

static long hash_lookup(const tide_collection_t *c, const char *name)
{
    if (c->hash_cap == 0)
        return -1;
    size_t mask = c->hash_cap - 1;
    for (size_t h = (size_t)name_hash(name) & mask;; h = (h + 1) & mask) {
        uint32_t v = c->hash[h];
        if (v == 0)
            return -1;
        if (strcmp(c->t[v - 1].name, name) == 0)
            return (long)(v - 1);
    }
}

static void hash_put(uint32_t *table, size_t cap, const char *name, uint32_t index)
{
    size_t mask = cap - 1;
    size_t h = (size_t)name_hash(name) & mask;
    while (table[h] != 0)
        h = (h + 1) & mask;
    table[h] = index + 1;
}

/* Keeps the load factor under 1/2 for n + 1 entries. */
static tide_status hash_reserve(tide_collection_t *c)
{
    if ((c->n + 1) * 2 <= c->hash_cap)
        return TIDE_OK;
    size_t cap = c->hash_cap ? c->hash_cap * 2 : 64;
    uint32_t *table = tide_calloc(cap, sizeof *table);
    if (table == NULL)
        return tide_errorf(TIDE_ERR_NOMEM, "out of memory growing the tensor name index");
    for (size_t i = 0; i < c->n; i++)
        hash_put(table, cap, c->t[i].name, (uint32_t)i);
    tide_free(c->hash);
    c->hash = table;
    c->hash_cap = cap;
    return TIDE_OK;
}

static tide_status check_desc(const tide_collection_t *c, const tide_tensor_desc *d, tide__tgeom *g)
{
    size_t len = strnlen(d->name, TIDE_NAME_MAX);
    if (len == 0)
        return tide_errorf(TIDE_ERR_INVALID, "tensor name is empty");
    if (len == TIDE_NAME_MAX)
        return tide_errorf(TIDE_ERR_INVALID,
                           "tensor name \"%.40s...\" is not terminated within %d "
                           "bytes",
                           d->name, TIDE_NAME_MAX);
    const char *name = d->name;
    size_t es = tide_dtype_size(d->dtype);
    if (es == 0)
        return tide_errorf(TIDE_ERR_INVALID, "%s: unknown dtype %d", name, (int)d->dtype);
    if (d->ndim < 1 || d->ndim > TIDE_MAX_DIMS)
        return tide_errorf(TIDE_ERR_INVALID, "%s: ndim %d is outside 1..%d", name, d->ndim,
                           TIDE_MAX_DIMS);
    uint64_t numel = 1;
    for (int k = 0; k < d->ndim; k++) {
        if (d->shape[k] < 1)
            return tide_errorf(TIDE_ERR_INVALID, "%s: dimension %d has size %lld (must be >= 1)",
                               name, k, (long long)d->shape[k]);
        if ((uint64_t)d->shape[k] > MAX_TENSOR_BYTES / es / numel)
            return tide_errorf(TIDE_ERR_RANGE, "%s: more than 2^56 bytes", name);
        numel *= (uint64_t)d->shape[k];
    }
    if (d->layer < TIDE_LAYER_ALL || d->layer >= c->num_layers)
        return tide_errorf(TIDE_ERR_INVALID,
                           "%s: layer %d is outside 0..%d (or PRE/POST/ALL) for a %d-layer model",
                           name, d->layer, c->num_layers - 1, c->num_layers);
    if (d->dp != TIDE_DP_REPLICATED && d->dp != TIDE_DP_SHARDED)
        return tide_errorf(TIDE_ERR_INVALID, "%s: unknown dp rule %d", name, (int)d->dp);
    g->numel = numel;
    g->es = (uint32_t)es;
    if (d->tp == TIDE_TP_REPLICATED) {
        g->a = 1;
        g->d = 1;
        g->b = numel;
        g->s = 1;
        return TIDE_OK;
    }
    if (d->tp != TIDE_TP_SPLIT)
        return tide_errorf(TIDE_ERR_INVALID, "%s: unknown tp rule %d", name, (int)d->tp);
    if (d->tp_dim < 0 || d->tp_dim >= d->ndim)
        return tide_errorf(TIDE_ERR_INVALID, "%s: tp_dim %d is outside 0..%d", name, d->tp_dim,
                           d->ndim - 1);
    if (d->tp_segments < 1)
        return tide_errorf(TIDE_ERR_INVALID, "%s: tp_segments is %d (must be >= 1)", name,
                           d->tp_segments);
    if (d->shape[d->tp_dim] % d->tp_segments != 0)
        return tide_errorf(TIDE_ERR_INVALID,
                           "%s: %d segments do not divide dimension %d (size %lld)", name,
                           d->tp_segments, d->tp_dim, (long long)d->shape[d->tp_dim]);
    g->a = 1;
    for (int k = 0; k < d->tp_dim; k++)
        g->a *= (uint64_t)d->shape[k];
    g->d = (uint64_t)d->shape[d->tp_dim];
    g->b = numel / g->a / g->d;
    g->s = (uint32_t)d->tp_segments;
    return TIDE_OK;
}

tide_status tide_collection_add(tide_collection_t *c, const tide_tensor_desc *desc)
{
    if (c == NULL || desc == NULL)
        return tide_errorf(TIDE_ERR_INVALID, "tide_collection_add: NULL argument");
    tide__tgeom g;
    TIDE_CHECK(check_desc(c, desc, &g));
    if (hash_lookup(c, desc->name) >= 0)
        return tide_errorf(TIDE_ERR_EXISTS, "tensor %s is already in the collection", desc->name);
    if (c->n >= UINT32_MAX - 1)
        return tide_errorf(TIDE_ERR_RANGE, "a collection holds at most 2^32 - 2 tensors");
    if (c->n == c->cap) {
        size_t cap = c->cap ? c->cap * 2 : 64;
        tide_tensor_desc *t = tide_reallocarray(c->t, cap, sizeof *t);
        if (t == NULL)
            return tide_errorf(TIDE_ERR_NOMEM, "out of memory growing a collection to %zu tensors",
                               cap);
        c->t = t;
        tide__tgeom *ng = tide_reallocarray(c->g, cap, sizeof *ng);
        if (ng == NULL)
            return tide_errorf(TIDE_ERR_NOMEM, "out of memory growing a collection to %zu tensors",
                               cap);
        c->g = ng;
        c->cap = cap;
    }
    TIDE_CHECK(hash_reserve(c));
    tide_tensor_desc *t = &c->t[c->n];
    *t = *desc;
    /* Normalise fields the rule ignores so that equal tensors compare equal. */
    if (t->tp == TIDE_TP_REPLICATED) {
        t->tp_dim = 0;
        t->tp_segments = 1;
    }
    for (int k = t->ndim; k < TIDE_MAX_DIMS; k++)
        t->shape[k] = 0;
    size_t nl = strnlen(t->name, TIDE_NAME_MAX);
    memset(t->name + nl, 0, TIDE_NAME_MAX - nl);
    c->g[c->n] = g;
    hash_put(c->hash, c->hash_cap, t->name, (uint32_t)c->n);
    c->n++;
    c->total_bytes += g.numel * g.es;
    return TIDE_OK;
}

tide_status tide_collection_find(const tide_collection_t *c, const char *name, size_t *index)
{
    if (c == NULL || name == NULL)
        return tide_errorf(TIDE_ERR_INVALID, "tide_collection_find: NULL argument");
    long i = hash_lookup(c, name);
    if (i < 0)
        return tide_errorf(TIDE_ERR_NOT_FOUND, "no tensor named %s", name);
    if (index != NULL)
        *index = (size_t)i;
    return TIDE_OK;
}

/* ---- GPT builder ------------------------------------------------------------------- */

typedef struct gpt_builder {
    tide_collection_t *c;
    const tide_model_spec *spec;
} gpt_builder;

/* Adds a parameter and, with Adam, its two moments right after it. */
static tide_status add_param(gpt_builder *b, const char *name, int layer, int ndim, int64_t d0,
                             int64_t d1, tide_tp_rule tp, int tp_dim, int segments)
{
    tide_tensor_desc t;
    memset(&t, 0, sizeof t);
    if (snprintf(t.name, sizeof t.name, "%s", name) >= (int)sizeof t.name)
        return tide_errorf(TIDE_ERR_RANGE, "tensor name %s is too long", name);
    t.dtype = b->spec->dtype;
    t.ndim = ndim;
    t.shape[0] = d0;
    t.shape[1] = d1;
    t.layer = layer;
    t.tp = tp;
    t.tp_dim = tp_dim;
    t.tp_segments = segments;
    t.dp = TIDE_DP_REPLICATED;
    TIDE_CHECK(tide_collection_add(b->c, &t));
    if (!b->spec->adam)
        return TIDE_OK;
    static const char *const moments[2] = {"exp_avg", "exp_avg_sq"};
    for (int m = 0; m < 2; m++) {
        tide_tensor_desc mt = t;
        if (snprintf(mt.name, sizeof mt.name, "%s.%s", name, moments[m]) >= (int)sizeof mt.name)
            return tide_errorf(TIDE_ERR_RANGE, "tensor name %s.%s is too long", name, moments[m]);
        mt.dp = b->spec->zero1 ? TIDE_DP_SHARDED : TIDE_DP_REPLICATED;
        TIDE_CHECK(tide_collection_add(b->c, &mt));
    }
    return TIDE_OK;
}

static tide_status add_block(gpt_builder *b, int i)
{
    const tide_model_spec *s = b->spec;
    int64_t h = s->hidden, f = s->ffn ? s->ffn : 4 * s->hidden;
    char n[TIDE_NAME_MAX];
#define P(suffix) (snprintf(n, sizeof n, "layer.%d." suffix, i), n)
    if (s->attention) {
        TIDE_CHECK(add_param(b, P("ln1.weight"), i, 1, h, 0, TIDE_TP_REPLICATED, 0, 1));
        TIDE_CHECK(add_param(b, P("ln1.bias"), i, 1, h, 0, TIDE_TP_REPLICATED, 0, 1));
        TIDE_CHECK(add_param(b, P("qkv.weight"), i, 2, 3 * h, h, TIDE_TP_SPLIT, 0, 3));
        TIDE_CHECK(add_param(b, P("qkv.bias"), i, 1, 3 * h, 0, TIDE_TP_SPLIT, 0, 3));
        TIDE_CHECK(add_param(b, P("proj.weight"), i, 2, h, h, TIDE_TP_SPLIT, 1, 1));
        TIDE_CHECK(add_param(b, P("proj.bias"), i, 1, h, 0, TIDE_TP_REPLICATED, 0, 1));
    }
    TIDE_CHECK(add_param(b, P("ln2.weight"), i, 1, h, 0, TIDE_TP_REPLICATED, 0, 1));
    TIDE_CHECK(add_param(b, P("ln2.bias"), i, 1, h, 0, TIDE_TP_REPLICATED, 0, 1));
    TIDE_CHECK(add_param(b, P("fc1.weight"), i, 2, f, h, TIDE_TP_SPLIT, 0, 1));
    TIDE_CHECK(add_param(b, P("fc1.bias"), i, 1, f, 0, TIDE_TP_SPLIT, 0, 1));
    TIDE_CHECK(add_param(b, P("fc2.weight"), i, 2, h, f, TIDE_TP_SPLIT, 1, 1));
    TIDE_CHECK(add_param(b, P("fc2.bias"), i, 1, h, 0, TIDE_TP_REPLICATED, 0, 1));
#undef P
    return TIDE_OK;
}

static tide_status check_spec(const tide_model_spec *s)
{
    if (s->layers < 0)
        return tide_errorf(TIDE_ERR_INVALID, "model spec: layers is %d (must be >= 0)", s->layers);
    if (s->hidden < 1)
        return tide_errorf(TIDE_ERR_INVALID, "model spec: hidden is %lld (must be >= 1)",
                           (long long)s->hidden);
    if (s->ffn < 0)
        return tide_errorf(TIDE_ERR_INVALID, "model spec: ffn is %lld (must be >= 0)",
                           (long long)s->ffn);
    if (s->vocab < 0)
        return tide_errorf(TIDE_ERR_INVALID, "model spec: vocab is %lld (must be >= 0)",
                           (long long)s->vocab);
    if (s->attention && (s->heads < 1 || s->hidden % s->heads != 0))
        return tide_errorf(TIDE_ERR_INVALID,
                           "model spec: heads=%lld must be >= 1 and divide hidden=%lld",
                           (long long)s->heads, (long long)s->hidden);
    if (tide_dtype_size(s->dtype) == 0)
        return tide_errorf(TIDE_ERR_INVALID, "model spec: unknown dtype %d", (int)s->dtype);
    /* Keeps 4 * hidden and 3 * hidden far from int64 overflow. */
    if (s->hidden > (INT64_C(1) << 40) || s->ffn > (INT64_C(1) << 40) ||
        s->vocab > (INT64_C(1) << 40))
        return tide_errorf(TIDE_ERR_RANGE, "model spec: dimensions above 2^40");
    return TIDE_OK;
}

tide_status tide_collection_build_gpt(tide_collection_t **out, const tide_model_spec *spec)
{
    if (out == NULL || spec == NULL)
        return tide_errorf(TIDE_ERR_INVALID, "tide_collection_build_gpt: NULL argument");
    *out = NULL;
    TIDE_CHECK(check_spec(spec));
    tide_status rc = TIDE_OK;
    gpt_builder b = {NULL, spec};
    TIDE_CHECK(tide_collection_new(&b.c, spec->layers));
    int64_t h = spec->hidden;
    if (spec->vocab > 0)
        TIDE_CHECK_GOTO(
            add_param(&b, "embed.weight", TIDE_LAYER_PRE, 2, spec->vocab, h, TIDE_TP_SPLIT, 0, 1),
            rc, fail);
    for (int i = 0; i < spec->layers; i++)
        TIDE_CHECK_GOTO(add_block(&b, i), rc, fail);
    TIDE_CHECK_GOTO(
        add_param(&b, "final_ln.weight", TIDE_LAYER_POST, 1, h, 0, TIDE_TP_REPLICATED, 0, 1), rc,
        fail);
    TIDE_CHECK_GOTO(
        add_param(&b, "final_ln.bias", TIDE_LAYER_POST, 1, h, 0, TIDE_TP_REPLICATED, 0, 1), rc,
        fail);
    if (spec->vocab > 0)
        TIDE_CHECK_GOTO(
            add_param(&b, "head.weight", TIDE_LAYER_POST, 2, spec->vocab, h, TIDE_TP_SPLIT, 0, 1),
            rc, fail);
    tide_tensor_desc step;
    memset(&step, 0, sizeof step);
    snprintf(step.name, sizeof step.name, "step");
    step.dtype = TIDE_I64;
    step.ndim = 1;
    step.shape[0] = 1;
    step.layer = TIDE_LAYER_ALL;
    step.tp = TIDE_TP_REPLICATED;
    step.tp_segments = 1;
    step.dp = TIDE_DP_REPLICATED;
    TIDE_CHECK_GOTO(tide_collection_add(b.c, &step), rc, fail);
    *out = b.c;
    return TIDE_OK;
fail:
    tide_collection_destroy(&b.c);
    return rc;
}
