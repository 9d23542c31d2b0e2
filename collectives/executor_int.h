/*
 * The reshard executor's working state, shared by its three files only: executor.c (the
 * entry points, message layouts, staging slots and the rounds), executor_streams.c (the
 * setup: from the plan to per-peer streams of chunks) and executor_inplace.c (in-place
 * mode: classes, spills, the shrinks' rows and the undo). Nothing here is for other
 * files, inside collectives/ or out. Every function runs on the thread that called
 * tide_reshard_execute (or tide_exec_plan_spills) and works on that call's exec.
 */
#ifndef TIDE_COLLECTIVES_EXECUTOR_INT_H
#define TIDE_COLLECTIVES_EXECUTOR_INT_H

#include <stddef.h>
#include <stdint.h>

#include "collectives/collectives_int.h"
#include "collectives/executor.h"

#define TIDE_EXEC_LOG "exec"

/* One message of a stream. Round k of a stream is its k-th chunk of at most
   chunk_size bytes; a chunk of several whole items goes as several messages (each big
   item alone, so it can be sent or received in place; runs of small items packed
   together), so a message never mixes a big item with others. */
typedef struct chunk {
    size_t pos;        /* first item (index into the stream's item list) */
    size_t n_items;    /* items touched */
    uint64_t off;      /* byte offset inside the first item */
    uint64_t len;      /* bytes */
    size_t round;      /* chunk number of the stream */
    uint64_t slot_off; /* offset inside the round's staging slot, when staged */
} chunk;

typedef struct stream {
    int peer;      /* communicator rank at the other end */
    int send;      /* 1: this rank sends, 0: receives */
    size_t *items; /* plan item indices, plan order (points into exec.item_idx) */
    size_t n_items;
    uint64_t bytes; /* total */
    uint64_t chunk_size;
    chunk *chunks; /* messages, in round order */
    size_t n_chunks;
    size_t n_rounds;
    size_t next_post, next_done; /* message cursors */
    void *slot[2];               /* staging, backend memory kind */
    uint64_t slot_bytes;
} stream;

typedef struct exec {
    tide_coll_comm_t *comm;
    const tide_coll_backend_v1 *be;
    const tide_exec_args *a;
    tide_coll_stream_t cstream;
    int me, n;
    uint64_t cap, max_chunk;
    uint64_t pack_below;    /* items smaller than this share messages (bytes) */
    int depth;              /* staged rounds in flight on this rank (1 or 2: staging slots) */
    size_t n_rounds;        /* rounds of this rank: the most of any of its streams */
    uint8_t *staged;        /* [n_rounds] 1: the round moves bytes through staging here */
    tide_coll_req_t **reqs; /* [n_rounds] the batch of each round in flight */
    uint64_t *chunk_of;     /* [n] chunk size of each rank (0: no streams) */
    stream *streams;
    size_t n_streams;
    size_t *item_idx;      /* backing store for streams[].items */
    tide_p2p_op *ops;      /* one entry per message of this rank, sized before data moves */
    tide_p2p_peer *peers;  /* [like ops] the other end's layout of each message */
    size_t lc_item;        /* local copies: next plan item */
    uint64_t lc_off;       /* and byte offset inside it */
    uint64_t staging;      /* bytes currently allocated */
    tide_mem_pool_t *pool; /* staging from here when not NULL */
    tide_exec_stats st;
    /* in-place mode (args->in_place): a copy of args whose rows for the rebuilt worker
       point at what the executor chose */
    tide_exec_in_place *ip;
    int ip_checked; /* the rebuilt worker's new buffers exist: tide__exec_validate checks them */
    tide_exec_args la;
    void **old_tab, **new_tab; /* [n_workers] rows (void *const * cast away) */
    void **ip_old, **ip_new;   /* [n_tensors] the worker's rows: sources, destinations */
    uint8_t *cls;              /* [n_tensors] IP_* */
    void **spill;              /* [n_tensors] host copy of a spilled old shard */
    struct ip_row *rows;       /* the shrink-in-place copies, per tensor in address order */
    size_t *row_at;            /* [n_tensors + 1] first row of each tensor */
} exec;

/* What in-place mode does with a tensor of the rebuilt worker (exec.cls). */
enum { IP_NONE = 0, IP_KEEP, IP_SHRINK, IP_REBUILD, IP_LEAVE };

/* One row of a shrink in place: run bytes from src to dst (offsets, dst <= src). */
typedef struct ip_row {
    uint64_t src, dst, run;
} ip_row;

/* The communicator rank that runs worker w. */
static inline int rank_of(const exec *x, int32_t w)
{
    return x->a->rank_of_worker ? x->a->rank_of_worker[w] : (int)w;
}

/* The bytes plan item it moves. */
static inline uint64_t item_bytes(const tide_xfer *it)
{
    return it->run * it->count;
}

/* ---- setup (executor_streams.c) ------------------------------------------------------- */

/* Checks the plan against the communicator and this rank's buffers: indices in range,
   buffers present, regions within their sizes when given; the rebuilt worker's new side
   only once x->ip_checked. TIDE_OK, else the first problem with a message. Reads only; caller's
   thread. */
tide_status tide__exec_validate(exec *x);

/* Chunk size of every rank from its number of streams (see executor.h): fills
   x->chunk_of (x->n entries, the caller's), and x->depth and x->st.peers for this rank.
   Every rank computes every rank's size alike. Local; caller's thread. */
tide_status tide__exec_chunk_sizes(exec *x);

/* This rank's streams, one per (peer, direction) with its items in plan order, each cut
   into rounds and messages at min(chunk_of[me], chunk_of[peer]), as the peer cuts its
   end; sizes x->ops and x->peers for every message, so nothing is allocated once data
   moves. Needs x->chunk_of; what it allocates stays in x (executor.c's release frees).
   Local; caller's thread. */
tide_status tide__exec_build_streams(exec *x);

/* ---- in-place mode (executor_inplace.c) ----------------------------------------------- */

/* Checks args->in_place, allocates the per-tensor tables and points x->a at a copy of args
   whose rows for the rebuilt worker are x->ip_old and x->ip_new (tide__exec_ip_release
   frees). Local; caller's thread. */
tide_status tide__exec_ip_setup(exec *x, const tide_exec_args *args);

/* Decides what happens to each tensor of the rebuilt worker (IP_*), and lays out the rows
   of the shrinks (x->rows, x->row_at: tide__exec_ip_release frees). Only plan data and
   sizes decide. Local; caller's thread. */
tide_status tide__exec_ip_classify(exec *x);

/* The old shards to spill so that the new shards and the staging (staging_need bytes) fit
   under the limit: leaving shards (rebuilt or no longer held), largest first, then shards
   that would shrink in place, largest gain first (a shrinking shard gives its tail back
   only once every byte of it has been sent, so until then it holds its whole old block;
   spilled, that block serves the switch at once and the new shard is rebuilt in a block of
   its own). order gets them (n_tensors entries), *n_order how many; *in_use and *need
   what the pool will hold and take after those spills. Reads the pool, changes nothing:
   the switch and its preparation (tide_exec_plan_spills) choose alike. Caller's thread. */
tide_status tide__exec_ip_choose(const exec *x, uint64_t staging_need, size_t *order,
                                 size_t *n_order, uint64_t *in_use_out, uint64_t *need_out);

/* Makes room for the new shards and the staging (staging_need bytes) under the limit by
   spilling what tide__exec_ip_choose picks (a shrinking shard spilled is rebuilt instead),
   then takes the new blocks from the pool (tide__exec_ip_finish or tide__exec_ip_undo
   gives them back). Blocks while the spills copy to the host; caller's thread. */
tide_status tide__exec_ip_prepare(exec *x, uint64_t staging_need);

/* After every transfer: the shrinks (rows in address order; on a device, evenly strided
   runs of rows in one pitched copy each), then the old blocks that left go back to the
   pool and the spills to the host; bufs become the new shards. Blocks until the copies
   are done; caller's thread. */
tide_status tide__exec_ip_finish(exec *x);

/* After a failure: new blocks back to the pool, spilled shards copied back into pool
   blocks (moved), so bufs hold the old shards again; a spill that cannot come back is
   logged and its bufs entry left NULL. Blocks while the copies run; caller's thread. */
void tide__exec_ip_undo(exec *x);

/* Frees the tables of tide__exec_ip_setup and tide__exec_ip_classify (pool blocks and
   spills are tide__exec_ip_finish's or tide__exec_ip_undo's); fine on a zeroed x or after
   a setup that failed halfway. Caller's thread. */
void tide__exec_ip_release(exec *x);

#endif /* TIDE_COLLECTIVES_EXECUTOR_INT_H */
