/*
 * The reshard executor: runs a reshard/ plan over a tide communicator, moving each
 * worker's old local shards into its new local shards.
 *
 * Order of work on each rank: the transfers are packed per peer rank into one byte
 * stream per (sender, receiver) pair in plan order, cut into rounds of at most the
 * chunk size; round k posts chunk k of every stream of the rank as one grouped p2p
 * batch, so transfers to and from different peers are in flight together. Rounds are
 * posted in order; one that stages bytes on this rank waits for the staging slot of
 * round k - 2 (k - 1 when the cap allows one slot), one whose messages all move in
 * place goes out at once (up to 64 rounds ahead). Inside a round an item of at least
 * pack_below bytes is its own message, moved in place when it is contiguous, or strided
 * in place when the backend has TIDE_COLL_CAP_STRIDED (mpi: an MPI vector type, or a
 * single copy by the strided end between processes of one host); smaller items, and
 * strided ones elsewhere (nccl), are gathered into a staging buffer and scattered back
 * on the receiver (cudaMemcpy2DAsync on device memory). Every message carries the other
 * end's layout (tide_p2p_peer), which both ends compute from the same plan and
 * chunking, so the backend picks the same protocol at both. The plan's local copies (src == dst)
 * are issued first in plan order, in 4 MiB slices while the first rounds are in flight,
 * so that they overlap the network instead of delaying it.
 *
 * Staging memory: every stream owns its staging slots, so no stream ever waits for
 * another's memory (no deadlock whatever the plan). Rank q's chunk size is
 *     c_q = min(max_chunk, staging_cap / (depth_q * streams_q))
 * and a pair uses min(c_src, c_dst), computed by both ends from the same plan; hence
 * peak staging <= staging_cap on every rank. Because of that, every rank must pass
 * either the same full plan (tide_reshard_plan) or its own part of it
 * (tide_reshard_plan_for, whose stream counts give every rank's streams_q), and the
 * same staging_cap and max_chunk; the mpi backend detects a disagreement on sizes
 * (TIDE_ERR_PROTOCOL) instead of corrupting memory.
 *
 * Memory: staging slots come from opts->pool when given (reused across calls); in-place
 * mode (tide_exec_in_place) also builds one worker's new shards from its old ones inside
 * that pool, so that a rank's peak stays bounded.
 *
 * Workload: plans of up to ~10^5 items per rank and GiBs of state; setup is
 * O(items log items), the data moves at close to the backend's point-to-point rate.
 */
#ifndef TIDE_COLLECTIVES_EXECUTOR_H
#define TIDE_COLLECTIVES_EXECUTOR_H

#include <stdint.h>

#include "collectives/collectives.h"
#include "collectives/pool.h"
#include "reshard/reshard.h"

#ifdef __cplusplus
extern "C" {
#endif

#define TIDE_EXEC_DEFAULT_STAGING_CAP ((uint64_t)256 << 20) /* bytes */
#define TIDE_EXEC_DEFAULT_MAX_CHUNK   ((uint64_t)32 << 20)  /* bytes */
#define TIDE_EXEC_MAX_CHUNK_LIMIT     ((uint64_t)1 << 30)   /* bytes */
#define TIDE_EXEC_DEFAULT_PACK_BELOW  ((uint64_t)64 << 10)  /* bytes */

/* Called on the executing thread after the local copies and after each round. */
typedef void (*tide_exec_progress_fn)(void *ctx, uint64_t bytes_done, uint64_t bytes_total);

typedef struct tide_exec_args {
    const tide_plan_t *plan;             /* the full plan, or this rank's worker's plan_for */
    size_t n_workers;                    /* > every worker id in the plan */
    size_t n_tensors;                    /* > every tensor index in the plan */
    const int *rank_of_worker;           /* [n_workers]: communicator rank running each worker
                                            (several workers may share a rank: transfers between
                                            them go through the backend's self send/recv); -1 for
                                            none; NULL: worker w is rank w */
    void *const *const *old_bufs;        /* [n_workers][n_tensors] old local shards of this rank's
                                            workers (backend memory kind); NULL elsewhere */
    void *const *const *new_bufs;        /* [n_workers][n_tensors] new local shards, written */
    const uint64_t *const *old_bytes;    /* optional sizes (bytes) of old_bufs for bounds
                                            checks; NULL: trusted */
    const uint64_t *const *new_bytes;    /* optional sizes (bytes) of new_bufs */
    struct tide_exec_in_place *in_place; /* optional: rebuild one worker's shards in place */
} tide_exec_args;

/*
 * In-place mode: the new shards of worker `worker` (hosted by this rank) are not given
 * but made from its old ones, inside pool, so that the rank's memory stays bounded:
 *   - a tensor whose new shard is its old shard keeps its buffer (no copy, no allocation);
 *   - a tensor whose new shard is made only of bytes of its old shard, each at the same
 *     or a lower offset (a tensor-parallel or ZeRO shard that shrinks), is rebuilt inside
 *     its old buffer once every byte of it has been sent, row by row in address order,
 *     so no byte is overwritten before it has been read (host memory: the freed tail
 *     goes back to the system; device memory: rows must not overlap, else it is rebuilt);
 *   - any other tensor gets a new pool block, and its old buffer goes back to the pool
 *     once the transfers are done.
 * Before any byte moves, when the pool's blocks in use plus the new blocks plus the
 * staging would pass `limit`, old shards that leave (rebuilt or no longer held) are
 * spilled to host memory (pinned on a GPU), largest first, and their blocks serve the
 * new shards; the transfers then read the host copies. If that is not enough, shards that
 * would shrink in place (and free their tails only at the end) are spilled too and
 * rebuilt in new blocks, largest gain first. A rank's peak is thus at most
 * limit; the runtime sets it to the larger of its old and new state plus the staging
 * cap. If even spilling cannot make it fit, strict fails the call (TIDE_ERR_NOMEM, on
 * every rank before any byte moves) and a soft limit warns and goes over. The pool's limit
 * is the call's only: the one it had before is back when the call returns.
 * args->new_bufs[worker] is ignored (may be NULL). On failure bufs still hold the old
 * shards (a spilled one copied back into a pool block: moved says so).
 */
typedef struct tide_exec_in_place {
    tide_mem_pool_t *pool;     /* every buffer of bufs is a block of it; staging from it too */
    int32_t worker;            /* the worker rebuilt; its old_bufs row is ignored: bufs is */
    void **bufs;               /* [n_tensors] in: old shards (NULL: not held); out: new ones */
    const uint64_t *old_bytes; /* [n_tensors] old shard sizes (bytes) */
    const uint64_t *new_bytes; /* [n_tensors] new shard sizes (bytes) */
    uint8_t *moved;            /* [n_tensors] out: 1 where bufs[i] changed address */
    uint64_t limit;            /* bytes the pool may hold in use during the call; 0: none */
    int strict;                /* 1: fail rather than pass limit */
} tide_exec_in_place;

typedef struct tide_exec_opts {
    uint64_t staging_cap; /* bytes; 0: TIDE_EXEC_DEFAULT_STAGING_CAP (env TIDE_STAGING_CAP
                             in programs that use tide_opts) */
    uint64_t max_chunk;   /* bytes per round and stream, <= 1 GiB; 0: default 32 MiB */
    uint64_t pack_below;  /* items smaller than this are packed together into one message
                             (fewer messages, one copy more); bigger ones travel alone and
                             in place when contiguous. Bytes; 0: default 64 KiB */
    /* staging_cap, max_chunk and pack_below must be equal on every rank */
    tide_exec_progress_fn progress; /* may be NULL */
    void *progress_ctx;
    tide_coll_stream_t stream; /* nccl: the CUDA stream for packing and transfers */
    tide_mem_pool_t *pool;     /* staging slots from here; NULL: the backend's mem_alloc
                                  (in-place mode: args->in_place->pool) */
} tide_exec_opts;

typedef struct tide_exec_stats {
    uint64_t bytes_sent;   /* transfers this rank sent (self transfers included) */
    uint64_t bytes_recv;   /* transfers this rank received */
    uint64_t bytes_local;  /* local copies */
    uint64_t bytes_staged; /* bytes sent or received through staging (not in place) */
    uint64_t bytes_direct; /* bytes received by single copy straight from the sender's
                              buffer (backends with direct_bytes, see collectives.h);
                              measured by the backend, so 0 proves the path unused */
    uint64_t peak_staging; /* most staging memory held at once (bytes), <= staging_cap */
    uint64_t staging_cap;  /* the cap in effect */
    uint64_t chunk_bytes;  /* this rank's chunk size c_q */
    uint64_t messages;     /* chunks sent */
    uint64_t rounds;       /* p2p batches posted */
    int peers;             /* streams (send + receive) of this rank */
    double seconds;        /* wall time of the whole call */
    /* in-place mode (bytes of the rebuilt worker's shards) */
    uint64_t bytes_kept;    /* new shards that kept their buffer untouched */
    uint64_t bytes_shrunk;  /* new shards rebuilt inside their old buffer */
    uint64_t bytes_rebuilt; /* new shards in new pool blocks */
    uint64_t bytes_spilled; /* old shards spilled to host memory */
    uint64_t pool_start;    /* pool memory in use when the call began */
    uint64_t peak_extra;    /* the pool's most memory in use during the call minus
                               pool_start (staging included) */
    uint64_t fresh_bytes;   /* pool blocks newly taken from the system during the call */
} tide_exec_stats;

/* Fills opts with the defaults (cap 256 MiB, chunk 32 MiB, no callback, NULL stream). */
void tide_exec_opts_init(tide_exec_opts *opts);

/*
 * Runs the plan for the workers hosted by this rank. Collective over comm: every rank
 * calls it with the same plan, even one with nothing to move. Argument problems found
 * on any rank (bad worker or tensor index, missing buffer, out-of-bounds region, cap too
 * small) make every rank return an error before any byte moves: TIDE_ERR_INVALID (or
 * the local cause) with a detail on the rank that found it, TIDE_ERR_PEER on the others.
 * On success new_bufs hold their new shards; stats (may be NULL) describe the run.
 * Blocks; the communicator's owner thread; aborting comm stops it with
 * TIDE_ERR_ABORTED (new buffers then partially written).
 */
tide_status tide_reshard_execute(tide_coll_comm_t *comm, const tide_exec_args *args,
                                 const tide_exec_opts *opts, tide_exec_stats *stats);

/*
 * The old shards an in-place run of args (args->in_place with the pool, buffers, sizes and
 * limit the call will have) would spill to host memory, chosen as the call chooses them,
 * without moving or allocating anything: sizes[i] (n_tensors entries) is tensor i's old
 * shard bytes when it would be spilled, else 0. be, n_ranks and rank: the call's
 * communicator's backend, size and this rank's place in it. So that the spill memory can
 * be prepared ahead of a switch (tide_mem_pool_spill_reserve). Local; any thread.
 */
tide_status tide_exec_plan_spills(const tide_coll_backend_v1 *be, int n_ranks, int rank,
                                  const tide_exec_args *args, const tide_exec_opts *opts,
                                  uint64_t *sizes);

#ifdef __cplusplus
}
#endif

#endif /* TIDE_COLLECTIVES_EXECUTOR_H */
