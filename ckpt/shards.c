/*
 * ckpt/shards: what every part of the checkpoint format agrees on (ckpt_int.h): which
 * coordinate writes which tensors and where their bytes lie in its shard, the shard files'
 * and step directories' names, and the chunk hash. The writer (ckpt.c), the manifest's
 * codecs (manifest.c, manifest_v1.c), the file layer (fs.c) and the loader call in here;
 * nothing here calls back.
 */
#include <inttypes.h>
#include <stdio.h>
#include <xxhash.h>

#include "ckpt/ckpt_int.h"

void tide__ckpt_shard_name(int p, int d, int t, const char *ext, char *buf, size_t len)
{
    snprintf(buf, len, "shard-p%d-d%d-t%d.%s", p, d, t, ext);
}

uint64_t tide__ckpt_hash(const void *buf, uint64_t n)
{
    return (uint64_t)XXH3_64bits(buf, (size_t)n);
}

/* ---- who writes what ------------------------------------------------------------------------ */

int tide_ckpt_saves(const tide_layout_t *l, const tide_collection_t *c, size_t i, int p, int d,
                    int t)
{
    const tide_tensor_desc *desc = tide_collection_tensor(c, i);
    if (desc->dp != TIDE_DP_SHARDED && d != 0)
        return 0;
    if (desc->tp != TIDE_TP_SPLIT && t != 0)
        return 0;
    if (desc->layer == TIDE_LAYER_ALL && p != 0)
        return 0;
    return tide_shard_bytes(l, c, i, p, d, t) > 0;
}

uint64_t tide__ckpt_tensor_offset(const tide_layout_t *l, const tide_collection_t *c, size_t i,
                                  int p, int d, int t)
{
    uint64_t off = 0;
    for (size_t j = 0; j < i; j++)
        if (tide_ckpt_saves(l, c, j, p, d, t))
            off += tide_shard_bytes(l, c, j, p, d, t);
    return off;
}

uint64_t tide_ckpt_shard_size(const tide_layout_t *l, const tide_collection_t *c, int p, int d,
                              int t)
{
    return tide__ckpt_tensor_offset(l, c, tide_collection_size(c), p, d, t);
}

void tide_ckpt_step_dir(const char *root, int64_t step, char *buf, size_t len)
{
    snprintf(buf, len, "%s/step-%012" PRId64, root, step);
}
