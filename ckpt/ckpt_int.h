/*
 * ckpt internals shared by the format (ckpt.c), the loader (load.c), the saver (saver.c),
 * the root's listing (root.c) and file access (fs.c): file helpers that follow no link
 * under a checkpoint root and name the file in every error, and the opened checkpoint.
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
    int fd; /* dir, opened once: every shard is read from this directory */
    int format; /* the manifest's format version */
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

/* A save's time bound: a save not done by until_ns fails (TIDE_ERR_TIMEOUT); ms, the bound it
   came from, is for messages. ms 0: no bound. */
typedef struct tide__ckpt_bound {
    uint64_t until_ns;
    int ms;
} tide__ckpt_bound;

/* The bound of timeout_ms from now (<= 0: none). */
tide__ckpt_bound tide__ckpt_bound_in(int timeout_ms);

/* ---- fs.c: files under a checkpoint root, reached with no link followed -------------------- */

/* strerror(e) and e's symbolic name ("No space left on device (ENOSPC)"); thread-local. */
const char *tide__ckpt_strerror(int e);

/* 1 with *step when name is a step directory's ("step-<digits>"). */
int tide__ckpt_step_name(const char *name, int64_t *step);

/* 1 when name is one tide writes inside a step directory: MANIFEST, shard files, their
   checksum files, failure notes and the temporaries of these. */
int tide__ckpt_known_name(const char *name);

/* Opens the directory path, the only path resolved by name (links in it followed: the
   caller chose it); create: made with its parents when missing. Warns once per directory
   when other users may change its entries. Caller closes *fd. */
tide_status tide__ckpt_open_root(const char *path, int create, int *fd);

/* Opens directory name inside parent (whose path is path, for messages) with no link
   followed; create: made first (0755) when missing; mine: it must belong to this user
   (TIDE_ERR_DENIED otherwise). A link or non-directory: TIDE_ERR_INVALID naming it. */
tide_status tide__ckpt_open_sub(int parent, const char *path, const char *name, int create,
                                int mine, int *fd);

/* Opens checkpoint directory dir. create (writing): its parent is a root (made when
   missing) and dir is opened as tide__ckpt_open_sub(create, mine). Reading: a last
   component named step-N is tide's (no link followed); any other path is the caller's. */
tide_status tide__ckpt_open_ckdir(const char *dir, int create, int *fd);

/* Opens name in dir (path: dir's, for messages) for reading: a regular file reached with no
   link followed; a link, FIFO, device, socket or directory is refused (TIDE_ERR_INVALID)
   naming it, without blocking. TIDE_ERR_NOT_FOUND when absent. */
tide_status tide__ckpt_open_read(int dir, const char *path, const char *name, int *fd);

/* Creates name in dir afresh for writing: the entry of that name is unlinked first (a link
   itself, never its target), then a new file is created exclusively, no link followed. */
tide_status tide__ckpt_create(int dir, const char *path, const char *name, int *fd);

/* Removes entry name of dir (a link itself, never its target); absent is fine. */
tide_status tide__ckpt_remove(int dir, const char *path, const char *name);

/* fsync of directory dir (its entries reach the disk); path for messages. */
tide_status tide__ckpt_fsync_dir(int dir, const char *path);

/* Reads regular file name of dir whole (at most max bytes) into *out (caller frees). */
tide_status tide__ckpt_read_whole(int dir, const char *path, const char *name, size_t max,
                                  uint8_t **out, size_t *len);

/* Writes buf to name in dir through name.tmp: create, write, fsync, (fault point), rename,
   fsync of dir. */
tide_status tide__ckpt_write_atomic(int dir, const char *path, const char *name, const void *buf,
                                    size_t n, const char *fault);

/* ---- ckpt.c ------------------------------------------------------------------------------ */

/* Writes n bytes or fails naming path. */
tide_status tide__ckpt_write_all(int fd, const void *buf, uint64_t n, const char *path);

/* Reads n bytes at off or fails naming path (a short file: TIDE_ERR_INVALID, truncated). */
tide_status tide__ckpt_read_at(int fd, void *buf, uint64_t n, uint64_t off, const char *path);

/* tide_ckpt_write_shard into the open directory dir (path: its path); fails by b.until_ns.
   On failure its partial shard is removed and a failure note left for the publisher. */
tide_status tide__ckpt_write_shard_at(int dir, const char *path, const tide_layout_t *l,
                                      const tide_collection_t *c, int p, int d, int t,
                                      const void *const *bufs, uint64_t save_id,
                                      tide__ckpt_bound b);

/* tide_ckpt_publish into the open directory dir; waits for the shards until b.until_ns. */
tide_status tide__ckpt_publish_at(int dir, const char *path, const tide_layout_t *l,
                                  const tide_collection_t *c, int64_t step, uint64_t save_id,
                                  tide__ckpt_bound b);

/* tide_ckpt_prune of the open root dir (path: its path). */
tide_status tide__ckpt_prune_at(int root, const char *path, int keep);

/* XXH3-64 (libxxhash) of n bytes. */
uint64_t tide__ckpt_hash(const void *buf, uint64_t n);

/* Offset of tensor i inside coordinate (p, d, t)'s shard file (sum of the saved tensors
   before it). */
uint64_t tide__ckpt_tensor_offset(const tide_layout_t *l, const tide_collection_t *c, size_t i,
                                  int p, int d, int t);

/* The save's fault points (core/fault.h): "shard" each time a shard is complete on disk,
   "manifest" just before the manifest is renamed into place. Inert unless a test hook is
   installed (tests/support/faults.c: TIDE_CKPT_FAULT="shards:K" or "manifest"). */
void tide__ckpt_fault(const char *point);

#endif /* TIDE_CKPT_INT_H */
