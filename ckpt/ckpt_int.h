/*
 * ckpt internals shared by the format (ckpt.c), the loader (load.c) and the saver
 * (saver.c): file helpers that name the file in every error, and the opened checkpoint.
 */
#ifndef TIDE_CKPT_INT_H
#define TIDE_CKPT_INT_H

#include <stdint.h>

#include "ckpt/ckpt.h"

#define TIDE_CKPT_PATH_MAX 4096

/* One shard file of a checkpoint, as the manifest records it. */
typedef struct tide__ckpt_shard {
    int p, d, t;
    uint64_t bytes;
    uint32_t n_chunks;
    uint64_t *hash; /* n_chunks XXH3-64s, chunk k = bytes [k * chunk, (k + 1) * chunk) */
    char file[64];  /* "shard-p0-d0-t0.bin" */
} tide__ckpt_shard;

struct tide_ckpt {
    char dir[TIDE_CKPT_PATH_MAX];
    int64_t step;
    uint64_t save_id;
    uint32_t chunk;
    tide_collection_t *coll;
    tide_layout_t *layout;
    size_t n_shards;
    tide__ckpt_shard *shards;
    int *shard_of; /* layout index -> shard index, or -1 when it saved nothing */
};

/* Shard file name of coordinate (p, d, t) into buf. */
void tide__ckpt_shard_name(int p, int d, int t, const char *ext, char *buf, size_t len);

/* Opens path (flags as open(2)) or fails naming it (TIDE_ERR_NOT_FOUND / TIDE_ERR_IO). */
tide_status tide__ckpt_open_file(const char *path, int flags, int *fd);

/* Writes n bytes or fails naming path. */
tide_status tide__ckpt_write_all(int fd, const void *buf, uint64_t n, const char *path);

/* Reads n bytes at off or fails naming path (a short file: TIDE_ERR_INVALID, truncated). */
tide_status tide__ckpt_read_at(int fd, void *buf, uint64_t n, uint64_t off, const char *path);

/* fsync of the directory dir (its entries reach the disk). */
tide_status tide__ckpt_fsync_dir(const char *dir);

/* XXH3-64 (libxxhash) of n bytes. */
uint64_t tide__ckpt_hash(const void *buf, uint64_t n);

/* Offset of tensor i inside coordinate (p, d, t)'s shard file (sum of the saved tensors
   before it). */
uint64_t tide__ckpt_tensor_offset(const tide_layout_t *l, const tide_collection_t *c, size_t i,
                                  int p, int d, int t);

/* Test hook: TIDE_CKPT_FAULT="shards:K" ends the process (_exit 86) once it has
   written K shards, "manifest" just before the manifest is renamed into place. */
void tide__ckpt_fault(const char *point);

#endif /* TIDE_CKPT_INT_H */
