/*
 * ckpt/manifest: the reader of format 1, the hand-written binary MANIFEST tide wrote
 * before the manifest became a proto record (tide__ckpt_manifest_decode_v1, manifest.h).
 * Kept so that those checkpoints still load; nothing writes it any more. Explicit
 * little-endian whatever the host:
 *   "TIDECKPT", u32 version (1), u32 chunk, i64 step, u64 save_id,
 *   i32 num_layers, u32 n_tensors, per tensor: name[96], u32 dtype, u32 ndim,
 *   i64 shape[4], i32 layer, u32 tp, u32 tp_dim, u32 tp_segments, u32 dp;
 *   i32 dp, tp, pp, micro_batches, i32 stage_start[pp + 1];
 *   u32 n_shards, per shard: i32 p, d, t, u64 bytes, u32 n_chunks, u64 hash[n_chunks];
 *   u64 XXH3-64 of all before.
 */
#include <string.h>

#include "ckpt/manifest.h"
#include "core/alloc.h"
#include "core/error.h"

typedef struct dec {
    const uint8_t *buf;
    size_t len, off;
    int short_read;
} dec;

static int get(dec *x, void *dst, size_t n)
{
    if (x->short_read || x->len - x->off < n) {
        x->short_read = 1;
        memset(dst, 0, n);
        return 0;
    }
    memcpy(dst, x->buf + x->off, n);
    x->off += n;
    return 1;
}

static uint32_t get_u32(dec *x)
{
    uint8_t b[4];
    get(x, b, 4);
    uint32_t v = 0;
    for (int k = 0; k < 4; k++)
        v |= (uint32_t)b[k] << (8 * k);
    return v;
}

static uint64_t get_u64(dec *x)
{
    uint8_t b[8];
    get(x, b, 8);
    uint64_t v = 0;
    for (int k = 0; k < 8; k++)
        v |= (uint64_t)b[k] << (8 * k);
    return v;
}

static int32_t get_i32(dec *x)
{
    return (int32_t)get_u32(x);
}

/* The header's version and the trailing checksum, then the chunk size, step and save. */
static tide_status header(tide_ckpt_t *ck, dec *x, const char *path)
{
    char magic[8];
    get(x, magic, 8);
    uint32_t version = get_u32(x);
    if (x->short_read)
        return tide_errorf(TIDE_ERR_INVALID, "%s is not a tide checkpoint manifest", path);
    if (version != 1)
        return tide_errorf(TIDE_ERR_INVALID,
                           "%s is format version %u; this tide reads versions 1 and %d", path,
                           version, TIDE_CKPT_VERSION);
    uint64_t stored = 0;
    for (int k = 0; x->len >= 8 + 4 + 8 && k < 8; k++)
        stored |= (uint64_t)x->buf[x->len - 8 + (size_t)k] << (8 * k);
    if (x->len < 8 + 4 + 8 || tide__ckpt_hash(x->buf, x->len - 8) != stored)
        return tide_errorf(TIDE_ERR_INVALID,
                           "%s is corrupted or truncated (its checksum does not match)", path);
    x->len -= 8;
    ck->format = 1;
    ck->chunk = get_u32(x);
    ck->step = (int64_t)get_u64(x);
    ck->save_id = get_u64(x);
    if (ck->chunk == 0 || ck->chunk > (1u << 30))
        return tide_errorf(TIDE_ERR_INVALID, "%s: bad chunk size %u", path, ck->chunk);
    return TIDE_OK;
}

/* The collection, then the layout's degrees and stages (worker ids: the coordinates'). */
static tide_status collection_and_layout(tide_ckpt_t *ck, dec *x, const char *path)
{
    int32_t num_layers = get_i32(x);
    uint32_t n_tensors = get_u32(x);
    if (x->short_read || num_layers < 0 || n_tensors > x->len / 64)
        return tide_errorf(TIDE_ERR_INVALID, "%s: bad collection header", path);
    TIDE_CHECK(tide_collection_new(&ck->coll, num_layers));
    for (uint32_t i = 0; i < n_tensors; i++) {
        tide_tensor_desc t;
        memset(&t, 0, sizeof t);
        get(x, t.name, sizeof t.name);
        t.name[TIDE_NAME_MAX - 1] = '\0';
        t.dtype = (tide_dtype)get_u32(x);
        t.ndim = get_i32(x);
        for (int k = 0; k < TIDE_MAX_DIMS; k++)
            t.shape[k] = (int64_t)get_u64(x);
        t.layer = get_i32(x);
        t.tp = (tide_tp_rule)get_u32(x);
        t.tp_dim = get_i32(x);
        t.tp_segments = get_i32(x);
        t.dp = (tide_dp_rule)get_u32(x);
        if (x->short_read)
            return tide_errorf(TIDE_ERR_INVALID, "%s is truncated in tensor %u", path, i);
        if (tide_collection_add(ck->coll, &t) != TIDE_OK)
            return tide_errorf(TIDE_ERR_INVALID, "%s: tensor %u: %s", path, i, tide_last_error());
    }
    int32_t deg[4];
    for (int k = 0; k < 4; k++)
        deg[k] = get_i32(x);
    if (x->short_read || deg[0] < 1 || deg[1] < 1 || deg[2] < 1 || deg[3] < 1 ||
        deg[0] > (1 << 16) || deg[1] > (1 << 16) || deg[2] > (1 << 16) ||
        (int64_t)deg[0] * deg[1] * deg[2] > (1 << 20))
        return tide_errorf(TIDE_ERR_INVALID, "%s: bad layout degrees", path);
    TIDE_CHECK(tide_layout_new(&ck->layout, deg[0], deg[1], deg[2], num_layers, deg[3]));
    int *starts = tide_calloc((size_t)deg[2] + 1, sizeof *starts);
    if (starts == NULL)
        return tide_errorf(TIDE_ERR_NOMEM, "out of memory reading %s", path);
    for (int s = 0; s <= deg[2]; s++)
        starts[s] = get_i32(x);
    tide_status rc = x->short_read ? TIDE_ERR_INVALID : tide_layout_set_stages(ck->layout, starts);
    tide_free(starts);
    if (rc != TIDE_OK)
        return tide_errorf(TIDE_ERR_INVALID, "%s: bad stages", path);
    return TIDE_OK;
}

/* The shard records: counts bounded by the file before anything is allocated. */
static tide_status shards(tide_ckpt_t *ck, dec *x, const char *path)
{
    uint32_t n_shards = get_u32(x);
    if (x->short_read || n_shards > tide_layout_size(ck->layout))
        return tide_errorf(TIDE_ERR_INVALID, "%s: bad shard count %u", path, n_shards);
    ck->shards = tide_calloc(n_shards ? n_shards : 1, sizeof *ck->shards);
    if (ck->shards == NULL)
        return tide_errorf(TIDE_ERR_NOMEM, "out of memory reading %s", path);
    for (uint32_t k = 0; k < n_shards; k++) {
        tide__ckpt_shard *s = &ck->shards[k];
        s->p = get_i32(x);
        s->d = get_i32(x);
        s->t = get_i32(x);
        s->bytes = get_u64(x);
        s->n_chunks = get_u32(x);
        if (x->short_read)
            return tide_errorf(TIDE_ERR_INVALID, "%s: bad shard record %u", path, k);
        if ((uint64_t)s->n_chunks * 8 > x->len - x->off)
            return tide_errorf(TIDE_ERR_INVALID, "%s is truncated in shard %u", path, k);
        s->hash = tide_calloc(s->n_chunks ? s->n_chunks : 1, sizeof *s->hash);
        if (s->hash == NULL)
            return tide_errorf(TIDE_ERR_NOMEM, "out of memory reading %s", path);
        ck->n_shards++;
        for (uint32_t j = 0; j < s->n_chunks; j++)
            s->hash[j] = get_u64(x);
    }
    if (x->off != x->len || x->short_read)
        return tide_errorf(TIDE_ERR_INVALID, "%s: %zu unexpected bytes after the shards", path,
                           x->len - x->off);
    return TIDE_OK;
}

tide_status tide__ckpt_manifest_decode_v1(tide_ckpt_t *ck, const uint8_t *b, size_t len,
                                          const char *path)
{
    dec x = {b, len, 0, 0};
    TIDE_CHECK(header(ck, &x, path));
    TIDE_CHECK(collection_and_layout(ck, &x, path));
    return shards(ck, &x, path);
}
