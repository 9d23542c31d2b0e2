/*
 * Distributed checkpoints of train_mlp's state on local files: every rank writes its
 * own shards (DIR/rank-<worker>.ckpt), the first rank of the layout also the layout
 * (DIR/layout.ckpt); a relaunched job under any other layout reads back, on every
 * rank, exactly the byte ranges of the old ranks' files that make up its new shards
 * (the reshard plan from the saved layout to the new one, with files as the old
 * holders). This is the checkpoint-restart baseline that live resharding is measured
 * against (benchmarks/resize_bench), and a way to stop and resume a run.
 *
 * Workload: one save at the end of a run and one load at the start of the next, a few
 * MiB to a few GiB per rank, sequential writes and mostly sequential reads. No fsync:
 * the files survive a process restart (page cache), not a power loss.
 */
#ifndef TIDE_EXAMPLES_MLP_CKPT_H
#define TIDE_EXAMPLES_MLP_CKPT_H

#include "examples/mlp.h"

#ifdef __cplusplus
extern "C" {
#endif

/*
 * Writes worker's local shards of m's current layout to dir/rank-<worker>.ckpt (dir is
 * created when missing) and, on the layout's first worker, the layout to
 * dir/layout.ckpt. An idle worker writes nothing. No communication; blocking file I/O;
 * every worker of the layout must call it for the checkpoint to be complete.
 */
tide_status tide_mlp_ckpt_save(const tide_mlp_t *m, int32_t worker, const char *dir);

/*
 * Fills worker's local buffers of m's current layout (any layout of the same model)
 * from the checkpoint in dir, step counter and data cursor included. Fails with
 * TIDE_ERR_NOT_FOUND / TIDE_ERR_IO naming the file when a file is missing or short,
 * TIDE_ERR_INVALID when the checkpoint is of another model. No communication.
 */
tide_status tide_mlp_ckpt_load(tide_mlp_t *m, int32_t worker, const char *dir);

#ifdef __cplusplus
}
#endif

#endif /* TIDE_EXAMPLES_MLP_CKPT_H */
