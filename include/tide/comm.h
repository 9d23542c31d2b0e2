/*
 * The collective calls a training step makes on the communicators of its layout
 * (tide_view's all / tp / dp / pp, owned by the runtime): allreduce, broadcast,
 * allgather, reduce-scatter, barrier, and grouped point-to-point transfers between
 * pipeline neighbours.
 *
 * Buffers are of the runtime's memory kind (tide_buffer_kind: host memory on the mpi
 * backend, memory of the rank's GPU on nccl). Every operation has completed (buffers
 * readable and reusable) when it returns, except tide_coll_p2p_start, whose request the
 * caller waits for (tide_coll_req_wait, or tide_bubble_wait to count the wait as a
 * pipeline bubble) and frees.
 *
 * Threading: a communicator is used from the thread that called tide_new (the main MPI
 * thread). Ordering: as in MPI and NCCL, all members issue the same sequence of
 * collective operations on a communicator.
 *
 * Failure: when a peer dies, the runtime aborts the communicators; an operation blocked
 * on the dead peer returns TIDE_ERR_ABORTED within milliseconds, and every later one on
 * that communicator fails at once. Pass the status to tide_step_end: the runtime rebuilds
 * the communicators of the recovery layout (see tide.h, "Failure").
 */
#ifndef TIDE_COMM_H
#define TIDE_COMM_H

#include <stddef.h>
#include <stdint.h>

#include <tide/api.h>
#include <tide/collection.h> /* tide_dtype */
#include <tide/status.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Where buffers live. */
typedef enum tide_mem_kind {
    TIDE_MEM_HOST = 0,   /* ordinary host memory (mpi) */
    TIDE_MEM_DEVICE = 1, /* CUDA device memory of the rank's device (nccl) */
} tide_mem_kind;

/* Reduction operators. */
typedef enum tide_red_op {
    TIDE_RED_SUM = 0,
    TIDE_RED_MAX = 1,
} tide_red_op;

/* One entry of a grouped point-to-point batch. */
typedef enum tide_p2p_kind {
    TIDE_P2P_SEND = 0,
    TIDE_P2P_RECV = 1,
} tide_p2p_kind;

typedef struct tide_p2p_op {
    tide_p2p_kind kind;
    int peer;     /* communicator rank; may be the caller's own rank (self send/recv) */
    void *buf;    /* read for a send, written for a receive */
    size_t bytes; /* may be 0; a send and its matching receive must agree */
    size_t run;   /* 0: buf holds bytes contiguous bytes. Otherwise bytes / run runs of run
                     bytes, the k-th at buf + k * stride (stride >= run); either end may be
                     strided, the other not. Backends that move only contiguous buffers
                     (nccl) refuse strided ops with TIDE_ERR_UNSUPPORTED */
    size_t stride;
} tide_p2p_op;

/* A communicator over some ranks of a layout. Opaque; owned by the runtime. */
typedef struct tide_coll_comm tide_coll_comm_t;

/* An in-flight grouped point-to-point batch (tide_coll_p2p_start). Opaque. */
typedef struct tide_coll_req tide_coll_req_t;

/* Stream handle: a cudaStream_t on nccl, used as given; NULL is the calling thread's own
   stream there (non-blocking, never CUDA's default stream, first ordered after what the
   default stream holds). Ignored on mpi. */
typedef void *tide_coll_stream_t;

/* This process's rank in comm; -1 for NULL. Any thread. */
TIDE_API int tide_coll_comm_rank(const tide_coll_comm_t *comm);

/* Number of ranks in comm; 0 for NULL. Any thread. */
TIDE_API int tide_coll_comm_size(const tide_coll_comm_t *comm);

/* 1 when comm's allreduce and reduce-scatter take dtype (f32, f64, i32, i64; bf16 where
   the backend has it), 0 otherwise or for NULL. Any thread. */
TIDE_API int tide_coll_comm_has_dtype(const tide_coll_comm_t *comm, tide_dtype dtype);

/* recv[i] = op over every rank's send[i], i < count elements of dtype; send == recv is in
   place. Blocks. */
TIDE_API tide_status tide_coll_allreduce(tide_coll_comm_t *comm, const void *send, void *recv,
                                         size_t count, tide_dtype dtype, tide_red_op op,
                                         tide_coll_stream_t stream);

/* buf (bytes) of rank root copied to every rank. Blocks. */
TIDE_API tide_status tide_coll_broadcast(tide_coll_comm_t *comm, void *buf, size_t bytes, int root,
                                         tide_coll_stream_t stream);

/* recv[r * bytes ..] = send of rank r (recv holds size * bytes); send may be
   recv + rank * bytes (in place). Blocks. */
TIDE_API tide_status tide_coll_allgather(tide_coll_comm_t *comm, const void *send, void *recv,
                                         size_t bytes, tide_coll_stream_t stream);

/* recv[i] = op over every rank's send[rank * count + i] (send holds size * count elements).
   Blocks. */
TIDE_API tide_status tide_coll_reduce_scatter(tide_coll_comm_t *comm, const void *send, void *recv,
                                              size_t count, tide_dtype dtype, tide_red_op op,
                                              tide_coll_stream_t stream);

/* Returns once every rank of comm has entered. Blocks. */
TIDE_API tide_status tide_coll_barrier(tide_coll_comm_t *comm, tide_coll_stream_t stream);

/* Posts a batch of n sends and receives together; the caller waits for *out
   (tide_coll_req_wait or tide_bubble_wait) and frees it. The buffers stay untouched until
   then. Does not block. */
TIDE_API tide_status tide_coll_p2p_start(tide_coll_comm_t *comm, const tide_p2p_op *ops, size_t n,
                                         tide_coll_stream_t stream, tide_coll_req_t **out);

/* Posts a batch and waits for it. Blocks. */
TIDE_API tide_status tide_coll_group_p2p(tide_coll_comm_t *comm, const tide_p2p_op *ops, size_t n,
                                         tide_coll_stream_t stream);

/* *done = 1 once every op of req has completed (receives readable). Does not block. */
TIDE_API tide_status tide_coll_req_test(tide_coll_comm_t *comm, tide_coll_req_t *req, int *done);

/* Waits for every op of req. Blocks. */
TIDE_API tide_status tide_coll_req_wait(tide_coll_comm_t *comm, tide_coll_req_t *req);

/* Frees *req_p (completed, or abandoned after a failure) and sets it to NULL; NULL is
   fine. */
TIDE_API void tide_coll_req_free(tide_coll_comm_t *comm, tide_coll_req_t **req_p);

#ifdef __cplusplus
}
#endif

#endif /* TIDE_COMM_H */
