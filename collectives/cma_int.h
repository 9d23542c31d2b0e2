/*
 * The mpi backend's single-copy ("direct") path between processes of one host, with
 * Linux cross-memory attach (process_vm_readv / process_vm_writev). Only collectives/
 * includes this.
 *
 * Why: Open MPI moves a strided MPI datatype through 32 KiB shared-memory fragments
 * (the sender packs, the receiver unpacks: two copies), while a contiguous message
 * gets a single kernel copy. A tensor-parallel reshard sends row-parallel weight
 * columns: the sender's region is strided (runs of a few KiB), the receiver's is
 * contiguous. The kernel pins remote pages per remote iovec (~0.5 us each) but walks
 * local iovecs cheaply, so the process whose region is STRIDED does the copy, with its
 * strided region as local iovecs and the other end's contiguous region as one remote
 * iovec: the sender pushes (process_vm_writev) when only the sender is strided, the
 * receiver pulls (process_vm_readv) when only the receiver is. Both contiguous stays on
 * plain MPI (Open MPI already does one copy), both strided on the MPI vector path.
 *
 * Both ends decide the same protocol without a negotiation round: the caller gives
 * each op the other end's layout (tide_p2p_peer, tide_coll_p2p_start_peers), and
 * the pair's reachability and the size threshold were agreed at communicator creation.
 *
 * Messages of one direct transfer k from a to b (k counts a's direct messages to b):
 *   a -> b  forward descriptor, on the p2p tag in the data message's place (so a
 *           disagreement with a plain message shows up as a size mismatch);
 *   b -> a  reverse descriptor, on tag REV(k);
 *   the copier -> the other end: an acknowledgement (or a nack) once its copy is done.
 * Each descriptor carries its writer's mode, byte count, region layout, its view of
 * the other end's layout, its region's address and a liveness word (address, token).
 * Both ends check both descriptors with the same rule, so they reach the same verdict:
 * a disagreement is TIDE_ERR_PROTOCOL on both ends, and nothing is copied.
 *
 * Safety:
 * - PULL: the receiver only reads the sender's memory. A sender that gives up clears
 *   its liveness word before its caller can reuse the buffer; the receiver reads the
 *   word after copying and discards the bytes when it changed.
 * - PUSH: the sender writes into the receiver's memory, so the receiver's buffer must
 *   not be written once the receiver has given up. A receiver that gives up clears its
 *   liveness word FIRST; the pusher reads that word before every slice (at most
 *   TIDE_CMA_SLICE bytes) and stops with a nack when it changed. A slice already
 *   started may still land, so the abandoning receiver then waits, bounded by
 *   TIDE_CMA_ABANDON_WAIT_MS, for the pusher's ack or nack, or for the pusher process
 *   to be gone; past that bound it logs an error naming the peer and reports the
 *   communicator quarantined (see tide__cma_abandon).
 *
 * Workload: one allgather pair per communicator creation; per message three small
 * MPI messages and a copy of KiBs to GiBs in slices of TIDE_CMA_SLICE bytes, each a few
 * system calls of up to IOV_MAX iovecs.
 */
#ifndef TIDE_COLLECTIVES_CMA_INT_H
#define TIDE_COLLECTIVES_CMA_INT_H

#include <mpi.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "collectives/collectives_int.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Default smallest message that goes by single copy (bytes): below it three small
   messages cost more than the copy they save. */
#define TIDE_CMA_DEFAULT_MIN ((uint64_t)64 << 10)

/* Most bytes one poll copies before it returns to the progress loop (which checks the
   abort flag), so a GiB message never holds a rank for more than a few ms. */
#define TIDE_CMA_SLICE ((uint64_t)16 << 20)

/* Longest an abandoning PUSH receiver waits for the pusher to confirm (ms): well under
   the 1 s within which an aborted operation must return. */
#define TIDE_CMA_ABANDON_WAIT_MS 500

/* Who copies a direct message. */
typedef enum tide_cma_mode {
    TIDE_CMA_NONE = 0, /* plain MPI (contiguous or vector type) */
    TIDE_CMA_PUSH = 1, /* the sender writes (what tide__cma_mode decides) */
    TIDE_CMA_PULL = 2, /* the receiver reads (supported; tide__cma_mode never picks it) */
} tide_cma_mode;

/* A region of one process's memory: bytes bytes, contiguous (run 0) or bytes / run
   runs of run bytes, the k-th at addr + k * stride. */
typedef struct tide_cma_region {
    uint64_t addr, bytes, run, stride;
} tide_cma_region;

/* A descriptor as it travels (see the top of this file). */
typedef struct tide_cma_desc {
    uint64_t magic;                 /* TIDE_CMA_DESC_MAGIC, or TIDE_CMA_NACK_MAGIC */
    uint64_t seq;                   /* k: the writer's count of direct messages a -> b */
    uint64_t mode;                  /* tide_cma_mode the writer decided */
    uint64_t bytes;                 /* the writer's byte count */
    uint64_t addr, run, stride;     /* the writer's region (run 0: contiguous) */
    uint64_t peer_run, peer_stride; /* the writer's view of the other end's layout */
    uint64_t live_addr, token;      /* the writer's liveness word and its value while live */
    uint64_t pad;                   /* travels only when bytes == 88 (see tide__cma_post) */
} tide_cma_desc;

/* Per-communicator state, agreed at creation and identical at both ends of a pair. */
typedef struct tide__cma_comm {
    int rank, size;
    uint8_t *direct;       /* [size] 1: direct messages with rank r are possible */
    int32_t *pid;          /* [size] process ids */
    uint64_t *send_seq;    /* [size] direct messages posted to rank r so far */
    uint64_t *recv_seq;    /* [size] and from rank r */
    uint64_t min_bytes;    /* smallest direct message (bytes): the largest member's setting */
    uint64_t token_base;   /* mixed into every liveness token */
    uint64_t direct_bytes; /* bytes this rank received by single copy so far */
    tide_cma_desc *nack;   /* [size] buffers of stray nacks (tide__cma_stray) */
    void *scratch;         /* creation scratch, allocated before any message */
} tide__cma_comm;

/* One direct message of a batch, either end. Lives in an array the batch allocates
   before posting (MPI reads and writes the descriptors in place). */
typedef struct tide__cma_xfer {
    int send, peer, mode, copier, state;
    int no_push;           /* receiver: the verdict failed, so the pusher never writes */
    uint64_t seq, copied;  /* copied: bytes done by the copier */
    tide_cma_region local; /* this rank's region */
    tide_cma_desc mine, theirs;
    uint64_t ack_out[2], ack_in[2]; /* {seq, status (0 ok)} */
    MPI_Request req[3];             /* 0: my descriptor, 1: theirs, 2: the acknowledgement */
    _Atomic uint64_t live;          /* mine.token while the peer may touch our region, then 0 */
} tide__cma_xfer;

/* Allocates cc's arrays for a size-member communicator (before any message, so that
   an allocation failure is the same on every member). Caller's thread. */
tide_status tide__cma_comm_init(tide__cma_comm *cc, int rank, int size);

/* Frees what tide__cma_comm_init allocated; safe on a zeroed or half-built cc. */
void tide__cma_comm_fini(tide__cma_comm *cc);

/*
 * The agreement, right after the MPI communicator exists: every member publishes host,
 * pid, settings (TIDE_COLL_CMA: 0 disables single copy; TIDE_COLL_CMA_MIN: smallest
 * direct message in bytes, default TIDE_CMA_DEFAULT_MIN; both read at each creation)
 * and a probe word; each probes its same-host peers with process_vm_readv; a second
 * allgather makes the pairs (both directions readable, both enabled) and the threshold
 * (the largest setting) the same on every member. Blocks, collective over c; caller's
 * thread.
 */
tide_status tide__cma_agree(tide__cma_comm *cc, tide_coll_comm_t *c);

/* The protocol for op (posted by this rank with kind send or receive; peer: the other
   end's layout or NULL), identical at both ends: NONE unless the pair agreed, the peer
   layout is known, bytes >= the threshold, and exactly one end is strided. Never
   blocks. */
tide_cma_mode tide__cma_mode(const tide__cma_comm *cc, const tide_p2p_op *op,
                             const tide_p2p_peer *peer);

/* Posts this rank's half of a direct message into x (the descriptor exchange, and the
   acknowledgement receive where this end does not copy); data_tag is the tag plain
   messages of the batch use. Does not block; caller's thread. */
tide_status tide__cma_post(tide__cma_comm *cc, MPI_Comm comm, int data_tag, tide__cma_xfer *x,
                           const tide_p2p_op *op, const tide_p2p_peer *peer, tide_cma_mode mode);

/* Advances x without blocking: tests its requests, checks the descriptors, copies up
   to *budget bytes (decremented) when this end copies. *progress grows when anything
   moved. x->state is TIDE_CMA_X_DONE once complete. An error leaves x for
   tide__cma_abandon. Caller's thread. */
tide_status tide__cma_step(tide__cma_comm *cc, MPI_Comm comm, tide__cma_xfer *x, uint64_t *budget,
                           int *progress);

#define TIDE_CMA_X_DONE 4

/* 1 when x needs no work from this rank any more: complete, or waiting for the peer's
   copy to finish (its acknowledgement). Never blocks. */
int tide__cma_idle(const tide__cma_xfer *x);

/* Gives up on n direct messages (abort or error): clears every liveness word first,
   nacks the messages this end was to copy, waits (bounded) for pushers that may still
   be writing into this rank's receive buffers, and cancels or abandons the requests.
   Sets *quarantine when a pusher could not be confirmed stopped (logged, naming the
   peer), and returns 1 when xs must never be freed (MPI or a peer may still touch it).
   Blocks at most TIDE_CMA_ABANDON_WAIT_MS plus MPI's cancellation wait; caller's thread. */
int tide__cma_abandon(tide__cma_comm *cc, MPI_Comm comm, tide__cma_xfer *xs, int n,
                      int *quarantine);

/* Called when a plain receive from peer got a descriptor's size where it expected other
   bytes (or was truncated): that peer sent a direct message where this rank expected a
   plain one, and waits for a reverse descriptor; this sends it a nack (best effort) so
   that it fails too instead of waiting for an abort. Caller's thread. */
void tide__cma_stray(tide__cma_comm *cc, MPI_Comm comm, int peer);

/* Keeps p (heap memory that MPI or a peer may still write: abandoned descriptors,
   quarantined scratch) allocated for the life of the process, and reachable, so that
   leak checkers do not report the deliberate leak. NULL is fine; any thread. */
void tide__cma_bury(void *p);

/* 1 when a message of got bytes from peer may be a stray direct descriptor. */
int tide__cma_maybe_stray(const tide__cma_comm *cc, int peer, size_t got);

#ifdef __cplusplus
}
#endif

#endif /* TIDE_COLLECTIVES_CMA_INT_H */
