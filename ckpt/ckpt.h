/*
 * ckpt: tide's checkpoint format, its crash-safe writer, its strict reader, loading into
 * any layout, and an asynchronous saver. Pure file I/O plus the reshard planner; no MPI.
 *
 * A checkpoint root holds one directory per saved step, ROOT/step-<012 step>/:
 *   shard-p<P>-d<D>-t<T>.bin  the tensors coordinate (P, D, T) of the saved layout is the
 *                             one writer of (see tide_ckpt_saves), raw, in collection
 *                             order, each exactly tide_shard_bytes long
 *   MANIFEST                  the collection (every tensor's desc), the layout (degrees,
 *                             stages), the step, each shard's size and one XXH3-64 hash
 *                             (libxxhash) per chunk of it: one proto record ("ckpt_manifest",
 *                             ckpt/manifest.h) sealed with a hash of its own; format 1's
 *                             binary MANIFEST (earlier tides) is still read
 * A checkpoint is complete exactly when MANIFEST exists: shards are written and fsynced
 * first (each writer then drops a small shard-*.sum with its sizes and checksums, renamed
 * into place), the publisher waits for every .sum, then writes MANIFEST.tmp, fsyncs it,
 * renames it to MANIFEST and fsyncs the directory. A crash at any moment leaves the
 * previous complete checkpoint, or the new one, never a half-written one that looks
 * complete. Only one copy of each byte is written: dp replicas, tp-replicated tensors
 * and every-stage tensors are written by one coordinate each.
 *
 * Everything under a root is reached from a directory descriptor with no link followed:
 * links, FIFOs and devices where tide expects its files are refused naming them, pruning
 * removes only this user's directories holding only tide's files, and a root other users
 * may write to is named in a warning. A save is bounded in time (timeout_ms): a full,
 * failing or stuck disk fails that save, which is reported, never the job.
 *
 * Loading: the saved layout is the old layout of a reshard plan whose holders are the
 * shard files; a rank of any new (dp, tp, pp, stages) reads exactly the chunks that
 * hold its bytes (chunks of 1 MiB, each checked against its hash before use).
 *
 * Workload: a save every few minutes to hours, MiB to GiB per rank, sequential writes;
 * one load per restart, mostly sequential reads. Units: bytes, ms.
 */
#ifndef TIDE_CKPT_H
#define TIDE_CKPT_H

#include <stdint.h>

#include <tide/status.h>
#include "reshard/reshard.h"

#ifdef __cplusplus
extern "C" {
#endif

#define TIDE_CKPT_VERSION     2 /* the format written; 1 (a binary MANIFEST) is still read */
#define TIDE_CKPT_CHUNK_BYTES (1u << 20) /* bytes per checksum chunk of a shard */

/* 1 when coordinate (p, d, t) of l is the one writer of tensor i: it holds bytes of it,
   and it is dp rank 0 (unless the tensor is ZeRO-1 sharded), tp rank 0 (unless split
   over tp) and stage 0 (when every stage holds the tensor). Any thread. */
int tide_ckpt_saves(const tide_layout_t *l, const tide_collection_t *c, size_t i, int p, int d,
                    int t);

/* Bytes coordinate (p, d, t) writes (0: it writes no file). Any thread. */
uint64_t tide_ckpt_shard_size(const tide_layout_t *l, const tide_collection_t *c, int p, int d,
                              int t);

/* Writes ROOT/step-<012 step> into buf (len bytes). */
void tide_ckpt_step_dir(const char *root, int64_t step, char *buf, size_t len);

/* ---- writing ------------------------------------------------------------------------- */

/*
 * Writes coordinate (p, d, t)'s shard of a checkpoint into dir (created when missing, with
 * its parents; dir itself must be a directory of this user, never a link):
 * bufs[i] is its local buffer of tensor i in host memory (tide_shard_bytes long; only
 * the tensors it saves are read; NULL elsewhere is fine), fsyncs it, then renames its
 * checksum file into place. save_id tells this save's files from a crashed earlier
 * attempt at the same step (same value on every writer of one save). Writes nothing
 * when the coordinate saves nothing. A failed write removes its partial shard and leaves
 * a note (shard-*.failed) so that the publisher stops waiting for it. Blocking file I/O;
 * any thread.
 */
tide_status tide_ckpt_write_shard(const char *dir, const tide_layout_t *l,
                                  const tide_collection_t *c, int p, int d, int t,
                                  const void *const *bufs, uint64_t save_id);

/*
 * Publishes the checkpoint in dir once every coordinate of l that saves something has
 * written its shard with save_id (waits up to timeout_ms for them, polling the
 * directory; <= 0: one look): writes the manifest crash-safely (temp, fsync, rename, fsync
 * dir). Fails with TIDE_ERR_TIMEOUT naming a missing shard, or at once with the reason a
 * writer noted for its failed shard; the directory then stays incomplete and is never
 * loaded. Blocking; any thread; exactly one process per save calls it.
 */
tide_status tide_ckpt_publish(const char *dir, const tide_layout_t *l, const tide_collection_t *c,
                              int64_t step, uint64_t save_id, int timeout_ms);

/*
 * Keeps the newest `keep` complete checkpoints under root (keep >= 1) and removes older
 * ones, and incomplete step directories older than the newest complete one (a newer
 * incomplete one may be a save in progress). Removes only what tide wrote: a step
 * directory that is a link, another user's, or holds anything but tide's files as this
 * user's regular files is left alone with a warning. Blocking; any thread.
 */
tide_status tide_ckpt_prune(const char *root, int keep);

/*
 * Finds the newest complete checkpoint under root with step < before (INT64_MAX: any):
 * its directory into path (len bytes) and its step, read from its manifest, into *step.
 * root may itself be a checkpoint directory (it has a MANIFEST): then that one. Step
 * directories are taken newest first by name; links are not followed, and one whose
 * manifest cannot be read is skipped with a warning (the reason in the error when none is
 * left); a name that disagrees with its manifest is warned of and the manifest's step
 * used. TIDE_ERR_NOT_FOUND when none. Blocking file I/O; any thread.
 */
tide_status tide_ckpt_find(const char *root, int64_t before, char *path, size_t len, int64_t *step);

/* ---- reading ---------------------------------------------------------------------------- */

/* An opened checkpoint: its manifest, parsed and checked. Opaque. */
typedef struct tide_ckpt tide_ckpt_t;

/*
 * Opens the checkpoint in dir and reads its manifest strictly: magic, version, its own
 * checksum, a valid collection and layout, and one shard record per writing coordinate
 * with the size that layout implies. Errors name the file: TIDE_ERR_NOT_FOUND (no
 * MANIFEST: incomplete or not a checkpoint), TIDE_ERR_INVALID (truncated, corrupted,
 * another version, or a link or special file where a file is expected: refused without
 * blocking). dir is kept open: verify and load read the shards of this very directory.
 * A dir whose last component is named step-N is tide's: it must not be a link. Shards
 * are not read here (tide_ckpt_verify). Caller owns *out.
 */
tide_status tide_ckpt_open(tide_ckpt_t **out, const char *dir);

/* Frees *self_p and sets it to NULL; NULL is fine. */
void tide_ckpt_close(tide_ckpt_t **self_p);

/* The checkpoint's format version (1: written by a tide before the manifest was a proto
   record; TIDE_CKPT_VERSION: this tide's). */
int tide_ckpt_format(const tide_ckpt_t *ck);

/* The saved step, collection and layout; borrowed, valid as long as ck. */
int64_t tide_ckpt_step(const tide_ckpt_t *ck);
const tide_collection_t *tide_ckpt_collection(const tide_ckpt_t *ck);
const tide_layout_t *tide_ckpt_layout(const tide_ckpt_t *ck);
const char *tide_ckpt_dir(const tide_ckpt_t *ck);

/* Number of shard files and shard k's coordinate, size and file name (borrowed). */
size_t tide_ckpt_num_shards(const tide_ckpt_t *ck);
void tide_ckpt_shard_info(const tide_ckpt_t *ck, size_t k, int *p, int *d, int *t, uint64_t *bytes,
                          const char **file);

/*
 * Reads every shard whole and checks its size and every chunk's hash. TIDE_ERR_INVALID
 * (or TIDE_ERR_NOT_FOUND for a missing file) naming the file and the chunk otherwise.
 * Blocking file I/O.
 */
tide_status tide_ckpt_verify(const tide_ckpt_t *ck);

/* Told the bytes checked so far of all shards' total, after every chunk (a GiB shard is
   many calls); on the verifying thread, between reads. */
typedef void (*tide_ckpt_progress_fn)(void *arg, uint64_t done, uint64_t total);

/* tide_ckpt_verify, calling progress (when not NULL) with arg as it goes. */
tide_status tide_ckpt_verify_progress(const tide_ckpt_t *ck, tide_ckpt_progress_fn progress,
                                      void *arg);

/*
 * Checks that c describes the same tensors as the checkpoint (names, dtypes, shapes,
 * rules, layers); TIDE_ERR_INVALID naming the first difference otherwise.
 */
tide_status tide_ckpt_check_collection(const tide_ckpt_t *ck, const tide_collection_t *c);

/* What a load read. */
typedef struct tide_ckpt_load_stats {
    uint64_t bytes_needed; /* bytes of the destination buffers filled */
    uint64_t bytes_read;   /* bytes read from shard files (whole chunks) */
    uint64_t files;        /* shard files opened */
} tide_ckpt_load_stats;

/*
 * Fills coordinate (p, d, t) of layout l (any degrees and stages of the checkpoint's
 * collection; worker ids do not matter) from the checkpoint: bufs[i] is the host buffer
 * of tensor i, tide_shard_bytes(l, ...) long, or NULL to skip the tensor. Reads only the
 * chunks that hold the needed bytes and checks each chunk's hash before using it: a
 * truncated or corrupted shard fails with TIDE_ERR_INVALID naming the file, and nothing
 * of it is trusted. No communication: every rank of a job loads its own part in
 * parallel. stats may be NULL. Blocking file I/O; any thread.
 */
tide_status tide_ckpt_load(const tide_ckpt_t *ck, const tide_layout_t *l, int p, int d, int t,
                           void *const *bufs, tide_ckpt_load_stats *stats);

/* ---- asynchronous saves ----------------------------------------------------------------- */

/* Copies tensor i's local buffer src (host or device memory), bytes long, into host
   memory. */
typedef tide_status (*tide_ckpt_copy_fn)(void *ctx, size_t i, void *host_dst, const void *src,
                                         uint64_t bytes);

/* One coordinate's save: what tide_ckpt_saver_submit snapshots and writes. */
typedef struct tide_ckpt_save_req {
    const char *root;              /* checkpoint root; the step's directory goes under it */
    const tide_layout_t *layout;   /* copied */
    const tide_collection_t *coll; /* borrowed: must outlive the saver */
    int p, d, t;                   /* this coordinate */
    int64_t step;                  /* steps completed by the state */
    uint64_t save_id;              /* the same on every writer of this save */
    int publish;                   /* 1 on exactly one writer: publishes (and prunes) */
    int keep;                      /* publisher: checkpoints kept (>= 1; 0: all) */
    int timeout_ms;    /* the save's bound, ms: writing this shard and, on the publisher, waiting
                          for the others'; later, it fails with TIDE_ERR_TIMEOUT (<= 0: none;
                          tide_ckpt_timeout_ms is the default) */
    void *const *bufs; /* tensor i's local buffer (NULL where not held) */
    tide_ckpt_copy_fn copy; /* NULL: memcpy (host buffers) */
    void *copy_ctx;
    /* Called once the save ended (the shard written and, on the publisher, the checkpoint
       published), with its status (its detail in tide_last_error) and the step's directory;
       on the writer thread of a saver, the caller's for tide_ckpt_save. NULL: none. */
    void (*done)(void *ctx, const struct tide_ckpt_save_req *req, const char *dir, tide_status rc);
    void *done_ctx;
} tide_ckpt_save_req;

/*
 * The default bound of a save of layout l (ms): TIDE_CKPT_TIMEOUT_MS when set (read once,
 * logged), else 60 s plus 1 ms per 16 KiB of the largest shard (a disk slower than 16 MB/s
 * fails saves). Any thread.
 */
int tide_ckpt_timeout_ms(const tide_layout_t *l, const tide_collection_t *c);

/* A background writer thread with reusable host staging (two save slots). Opaque. */
typedef struct tide_ckpt_saver tide_ckpt_saver_t;

/* Starts the writer thread; caller owns *out. */
tide_status tide_ckpt_saver_new(tide_ckpt_saver_t **out);

/*
 * Snapshots req's buffers into a free staging slot of the saver (the saved tensors only,
 * with req->copy), queues it and returns; the thread then writes the shard and, on the
 * publisher, publishes and prunes, one save after the other. When both slots hold saves,
 * waits for one to be written first; if the last save written failed, that failure is
 * returned and nothing is submitted. The caller may change its buffers as soon as this
 * returns. One caller thread.
 */
tide_status tide_ckpt_saver_submit(tide_ckpt_saver_t *s, const tide_ckpt_save_req *req);

/*
 * As tide_ckpt_saver_submit, but never waits: when both slots hold saves (one being
 * written, one queued behind it), fails at once with TIDE_ERR_BUSY naming them and
 * submits nothing. Earlier failures are not returned (req->done hears of each save).
 * Allocates the second slot's staging the first time it is needed. One caller thread.
 */
tide_status tide_ckpt_saver_offer(tide_ckpt_saver_t *s, const tide_ckpt_save_req *req);

/*
 * Allocates and first-touches the host staging of the first slot for saves of req's
 * coordinate (layout, collection and coordinate are read; bufs may be NULL) ahead of the
 * first one, so that no save's snapshot takes page faults from the training loop. Waits
 * for that slot's save to be written first. One caller thread (the submitting one).
 */
tide_status tide_ckpt_saver_reserve(tide_ckpt_saver_t *s, const tide_ckpt_save_req *req);

/* Where a saver's host staging comes from (both NULL: tide_malloc / tide_free). */
typedef struct tide_ckpt_host_mem {
    tide_status (*alloc)(size_t bytes, void **out);
    void (*free)(void *ptr);
} tide_ckpt_host_mem;

/*
 * Makes s's staging from mem (copied; NULL: plain host memory, the default), such as
 * pinned memory, which device snapshots copy into at full speed; staging made before is
 * freed, and the next save or reserve makes it anew. Waits for queued and written saves
 * first. One caller thread (the submitting one).
 */
tide_status tide_ckpt_saver_set_host_mem(tide_ckpt_saver_t *s, const tide_ckpt_host_mem *mem);

/* Waits until nothing is queued or being written; returns the last save's status. */
tide_status tide_ckpt_saver_wait(tide_ckpt_saver_t *s);

/* 1 while a save is being written. Any thread. */
int tide_ckpt_saver_busy(tide_ckpt_saver_t *s);

/* Waits for the queued saves, stops the thread, frees *self_p, sets it to NULL. */
void tide_ckpt_saver_destroy(tide_ckpt_saver_t **self_p);

/*
 * The same save done synchronously on the calling thread (no staging copy when copy is
 * NULL). Blocking.
 */
tide_status tide_ckpt_save(const tide_ckpt_save_req *req);

#ifdef __cplusplus
}
#endif

#endif /* TIDE_CKPT_H */
