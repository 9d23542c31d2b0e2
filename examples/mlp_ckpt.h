/*
 * Checkpoints of train_mlp's state in tide's checkpoint format (ckpt/ckpt.h): every
 * rank of a layout that is the one writer of some bytes writes its shard file, the
 * layout's first rank publishes the manifest once all shards are on disk; a relaunched
 * job under any other (dp, tp, pp, stages) reads back, on every rank, exactly the chunks
 * of the shard files that make up its new shards (the reshard plan from the saved layout,
 * with the files as the old holders). Saves are synchronous, or asynchronous through a
 * tide_ckpt_saver (snapshot at the step boundary, written while training goes on).
 * This is also the checkpoint-restart baseline that live resharding is measured against
 * (benchmarks/resize_bench).
 *
 * Workload: a save every N steps or at the end of a run and one load at the start of
 * the next, a few MiB to a few GiB per rank.
 */
#ifndef TIDE_EXAMPLES_MLP_CKPT_H
#define TIDE_EXAMPLES_MLP_CKPT_H

#include "ckpt/ckpt.h"
#include "examples/mlp.h"

#ifdef __cplusplus
extern "C" {
#endif

/* How a save is done; zero-filled means the defaults. */
typedef struct tide_mlp_ckpt_opts {
    uint64_t save_id; /* the same on every rank of one save; 0: derived from the step */
    int keep;         /* complete checkpoints kept under the root; 0: all */
    int timeout_ms;   /* the save's bound, ms (see tide_ckpt_save_req); 0: tide_ckpt_timeout_ms */
} tide_mlp_ckpt_opts;

/*
 * Saves worker's part of m's current state as ROOT/step-<step> (root created when
 * missing); the layout's first worker publishes it (waiting for every other writer's
 * shard) and prunes old checkpoints. An idle worker writes nothing. No communication;
 * blocking file I/O; every worker of the layout must call it. o NULL: defaults.
 */
tide_status tide_mlp_ckpt_save(const tide_mlp_t *m, int32_t worker, const char *root,
                               const tide_mlp_ckpt_opts *o);

/*
 * The same save, asynchronous: snapshots worker's saved tensors into s's staging (device
 * buffers copied to host) and returns; s's thread writes and publishes. Waits first if
 * s is still writing the previous save. Main thread.
 */
tide_status tide_mlp_ckpt_save_async(tide_ckpt_saver_t *s, const tide_mlp_t *m, int32_t worker,
                                     const char *root, const tide_mlp_ckpt_opts *o);

/*
 * Fills worker's local buffers of m's current layout (any layout of the same model) from
 * the newest complete checkpoint under dir with a step < before (INT64_MAX: the newest;
 * dir may also be one checkpoint's directory), step counter and data cursor included;
 * *loaded gets its step (may be NULL). Fails naming the file: TIDE_ERR_NOT_FOUND (no
 * checkpoint, a missing shard), TIDE_ERR_INVALID (truncated or corrupted file, a
 * checkpoint of another model). Ranks read different files, so a job agrees on
 * failures before falling back to an older checkpoint (train_mlp does). No
 * communication.
 */
/* Prepares s's host staging for worker's saves of m (tide_ckpt_saver_reserve), before
   the training loop; nothing when worker is not in m's layout. Main thread. */
tide_status tide_mlp_ckpt_reserve(tide_ckpt_saver_t *s, const tide_mlp_t *m, int32_t worker);

tide_status tide_mlp_ckpt_load(tide_mlp_t *m, int32_t worker, const char *dir, int64_t before,
                               int64_t *loaded);

#ifdef __cplusplus
}
#endif

#endif /* TIDE_EXAMPLES_MLP_CKPT_H */
