/*
 * collectives: tide's data plane. One backend interface, a versioned table of
 * function pointers (tide_coll_backend_v1), with an "mpi" backend (host memory,
 * Open MPI) and an "nccl" backend (device memory, built when CUDA/NCCL are found),
 * plus thin tide_coll_* wrappers that check arguments and dispatch. The operations a
 * program calls on its layout's communicators, and their types, are the public part
 * (<tide/comm.h>); pools, communicator creation and the backend table stay here.
 *
 * Workload: a handful of communicators per job (world, tp, dp, pp groups), rebuilt at
 * each layout change; operations from a few bytes (barriers, step agreement) to
 * hundreds of MiB (gradients, reshard traffic). A worker that dies must never hang
 * the survivors: every operation polls an abort flag that another thread (the
 * worker's heartbeat thread) may set with tide_coll_comm_abort.
 *
 * Threading and MPI (both backends bootstrap over MPI):
 * - MPI must be initialised by the caller with MPI_Init_thread and at least
 *   MPI_THREAD_FUNNELED (all MPI calls, tide's and the program's, on the main
 *   thread); MPI_THREAD_MULTIPLE when other threads also call MPI. A program
 *   initialised with MPI_THREAD_SINGLE is refused (tide_coll_pool_new fails with
 *   TIDE_ERR_UNSUPPORTED), because tide's abort is meant to come from another thread.
 * - The operations of one communicator are called from one thread at a time: its
 *   owner, at first the thread that created it. Ownership may pass to another thread
 *   once the owner is done with it and the two synchronise (a mutex, a join): libtide
 *   creates a switch's communicators on its preparation thread and the main thread
 *   uses them (with MPI_THREAD_MULTIPLE; on nccl the new owner binds the same device).
 *   Only tide_coll_comm_abort may be called from any thread at any time; it only sets
 *   an atomic flag and never touches MPI or NCCL.
 *   The thread polling the operation notices it, cancels what it can and returns
 *   TIDE_ERR_ABORTED (within milliseconds; well under the 1 s tide promises).
 * - After an abort, or after any failed operation, the communicator is dead: every
 *   later operation fails with TIDE_ERR_ABORTED; only destroy is allowed. Build a new
 *   one over the survivors (tide_coll_comm_new is collective only over its members).
 *
 * Failure recovery with Open MPI 4.1 (no ULFM): launch with `mpirun --enable-recovery`
 * so that the death of one rank does not kill the job. Open MPI reports nothing for a
 * dead peer (a pending receive from it stays pending, MPI_Test succeeds with flag 0
 * forever), so detection comes from outside (heartbeats, then abort). The survivors
 * then build a new communicator with MPI_Comm_create_group over the pool, which
 * involves only the group's members and works with a dead rank in the pool.
 *
 * Ordering: like MPI and NCCL, all members issue the same sequence of collective
 * operations on a communicator; every v1 operation has completed (buffers readable and
 * reusable) when it returns.
 */
#ifndef TIDE_COLLECTIVES_H
#define TIDE_COLLECTIVES_H

#include <mpi.h>
#include <stddef.h>
#include <stdint.h>

#include <tide/comm.h> /* the operations a program calls, their types */
#include <tide/status.h>
#include "reshard/reshard.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The OTHER end's layout of a p2p op, for tide_coll_p2p_start_peers: the matching op's
   run and stride as in tide_p2p_op (run 0: contiguous), valid when known is 1. Set by
   callers that know the matching op's layout, like the reshard executor, which computes
   both ends from the same plan: with it both ends pick the same transfer protocol
   without a negotiation round (mpi: a single copy by the strided end between processes
   of one host, see mpi_backend.c). Both ends must give it, and consistently: an end
   whose view disagrees with the other's actual layout or size gets TIDE_ERR_PROTOCOL
   (so does the other). known 0 (or no array): the op takes the backend's ordinary path.
   A separate array rather than fields of tide_p2p_op, so that existing positional
   initialisers of tide_p2p_op stay complete. */
typedef struct tide_p2p_peer {
    size_t run, stride;
    int known;
} tide_p2p_peer;

/* Backend capability bits (tide_coll_backend_v1.caps). */
#define TIDE_COLL_CAP_BF16    (1u << 0) /* allreduce / reduce-scatter on TIDE_BF16 */
#define TIDE_COLL_CAP_SPLIT   (1u << 1) /* comm_split is implemented natively */
#define TIDE_COLL_CAP_STRIDED (1u << 2) /* p2p ops may be strided (tide_p2p_op.run) */

/* A worker pool: the processes of one mpirun launch, over an MPI communicator. */
typedef struct tide_coll_pool tide_coll_pool_t;

/* Parameters of tide_coll_comm_new. */
typedef struct tide_coll_comm_params {
    const int *members;  /* pool ranks, in the order of the new ranks; caller is one of them */
    int n_members;       /* >= 1 */
    int tag;             /* 0..16383; every member passes the same value, and a retried
                            creation over the same members should use a new one (the
                            job's generation modulo 16384 is a good choice) */
    uint32_t timeout_ms; /* fail with TIDE_ERR_TIMEOUT if some member has not arrived
                            by then (ms); 0: 30000 */
    const int *cancel;   /* NULL, or a flag another thread may set (with __atomic_store_n
                            or atomic_store) to end the creation early with
                            TIDE_ERR_ABORTED: a member that died costs milliseconds, not the
                            timeout. Read while the call runs only. */
    const int *watch;    /* NULL, or an abort word for the communicator's whole life: once
                            another thread sets it (nonzero), the communicator and every
                            communicator split off it count as aborted, as if
                            tide_coll_comm_abort had been called on each (a split in
                            progress ends too). It must outlive them all. libtide passes one
                            word per generation, so that its control thread aborts a
                            generation's communicators without holding pointers to them. */
} tide_coll_comm_params;

#define TIDE_COLL_BACKEND_VERSION 1

/*
 * The backend interface, version 1. A backend fills one static instance; callers get
 * it from tide_coll_backend_find. "Blocks" means the call waits for remote peers and
 * returns TIDE_ERR_ABORTED promptly once the communicator is aborted. "Caller's
 * thread" means the thread that owns the communicator (see the top of this file).
 * Every buffer is of the backend's mem_kind unless stated otherwise. The tide_coll_*
 * wrappers below validate arguments and the abort state before calling these, so a
 * backend may assume valid arguments and a live communicator on entry.
 */
typedef struct tide_coll_backend_v1 {
    int version;            /* TIDE_COLL_BACKEND_VERSION */
    const char *name;       /* "mpi", "nccl" */
    tide_mem_kind mem_kind; /* where buffers must live */
    unsigned caps;          /* TIDE_COLL_CAP_* */

    /* Creates a communicator over params->members. Blocks (collective over the
       members only, bounded by params->timeout_ms); caller's thread. */
    tide_status (*comm_create)(tide_coll_pool_t *pool, const tide_coll_comm_params *params,
                               tide_coll_comm_t **out);
    /* Splits parent by colour (colour < 0: no new communicator, *out = NULL). The
       wrapper has already allgathered (colour, key) over parent: members (n_members,
       NULL/0 for colour < 0) are the pool ranks of the caller's new communicator in
       new-rank order, sorted by (key, parent rank). A backend may split natively
       (ncclCommSplit) but must produce that order. Called by every rank of parent.
       Blocks, collective over parent; caller's thread. */
    tide_status (*comm_split)(tide_coll_comm_t *parent, int color, int key, const int *members,
                              int n_members, tide_coll_comm_t **out);
    /* Releases the communicator; after an abort it releases only local resources.
       Does not wait for peers, beyond a bounded flush (nccl: ncclCommFinalize for at
       most 5 s, then ncclCommAbort); caller's thread. */
    void (*comm_destroy)(tide_coll_comm_t *comm);
    /* Backend hook run by tide_coll_comm_abort after the flag is set. Never blocks,
       any thread, async-signal-unsafe calls forbidden: it must not touch MPI/NCCL. */
    void (*comm_abort)(tide_coll_comm_t *comm);

    /* Posts a batch of sends and receives together; peers is NULL or [n] (the other
       end's layout of each op; a backend may ignore it). Does not block; caller's
       thread. Buffers must stay untouched until the request completes. */
    tide_status (*p2p_start)(tide_coll_comm_t *comm, const tide_p2p_op *ops,
                             const tide_p2p_peer *peers, size_t n, tide_coll_stream_t stream,
                             tide_coll_req_t **out);
    /* Tests a batch: *done = 1 when every op has completed (receives are then readable).
       Does not block; caller's thread. */
    tide_status (*req_test)(tide_coll_comm_t *comm, tide_coll_req_t *req, int *done);
    /* Waits for a batch. Blocks; caller's thread. */
    tide_status (*req_wait)(tide_coll_comm_t *comm, tide_coll_req_t *req);
    /* Frees a request (completed, or abandoned after an abort). Caller's thread. */
    void (*req_free)(tide_coll_comm_t *comm, tide_coll_req_t *req);

    /* recv[i] = op over ranks of send[i], i < count; send == recv is in place.
       Blocks; caller's thread. */
    tide_status (*allreduce)(tide_coll_comm_t *comm, const void *send, void *recv, size_t count,
                             tide_dtype dtype, tide_red_op op, tide_coll_stream_t stream);
    /* buf (bytes) of root copied to every rank. Blocks; caller's thread. */
    tide_status (*broadcast)(tide_coll_comm_t *comm, void *buf, size_t bytes, int root,
                             tide_coll_stream_t stream);
    /* recv[r * bytes ..] = send of rank r (recv holds size * bytes); send may be
       recv + rank * bytes (in place). Blocks; caller's thread. */
    tide_status (*allgather)(tide_coll_comm_t *comm, const void *send, void *recv, size_t bytes,
                             tide_coll_stream_t stream);
    /* recv[i] = op over ranks of send[rank * count + i] (send holds size * count).
       Blocks; caller's thread. */
    tide_status (*reduce_scatter)(tide_coll_comm_t *comm, const void *send, void *recv,
                                  size_t count, tide_dtype dtype, tide_red_op op,
                                  tide_coll_stream_t stream);
    /* Returns once every member has entered. Blocks; caller's thread. */
    tide_status (*barrier)(tide_coll_comm_t *comm, tide_coll_stream_t stream);

    /* Memory of mem_kind for staging (executor). Does not block on peers; any thread. */
    tide_status (*mem_alloc)(size_t bytes, void **out);
    /* Frees mem_alloc memory; NULL is fine; any thread. */
    void (*mem_free)(void *ptr);
    /* Copies height rows of width bytes from src (row pitch spitch) to dst (pitch
       dpitch), both of mem_kind, ordered on stream. Does not block on peers. */
    tide_status (*copy2d)(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                          size_t height, tide_coll_stream_t stream);
    /* Copies bytes between host memory and mem_kind memory (to_host selects the
       direction); returns when done. Caller's thread. */
    tide_status (*copy_host)(void *dst, const void *src, size_t bytes, int to_host,
                             tide_coll_stream_t stream);
    /* Waits until the work queued on stream has finished (checks the abort flag of comm
       when not NULL). On a comm already aborted it waits for nothing: it does the owner
       thread's half of the abort (nccl: ncclCommAbort, which ends kernels stuck on
       peers) and returns TIDE_ERR_ABORTED; the executor calls it so after a failure,
       before the synchronous device work of its cleanup. Blocks; caller's thread. */
    tide_status (*stream_sync)(tide_coll_comm_t *comm, tide_coll_stream_t stream);

    /* Optional (NULL where a backend has no single-copy path). 1 when p2p messages
       between the caller and comm rank peer may move by a single copy between the two
       processes' buffers (mpi: both on one host, the kernel lets them read each other's
       memory, TIDE_COLL_CMA not 0 at either end; agreed at creation, so both ends get
       the same answer; never for the caller itself). Which messages do also depends on
       their size and layouts (see tide_p2p_peer). Never blocks; any thread. */
    int (*p2p_direct)(const tide_coll_comm_t *comm, int peer);
    /* Optional. Bytes this rank has received on comm by single copy so far (statistics
       and tests: 0 proves the path unused). Caller's thread. */
    uint64_t (*direct_bytes)(const tide_coll_comm_t *comm);

    /* Device members. All optional (NULL: a host-memory backend, where the wrappers
       below do the host equivalent). A device backend's other members work on the
       calling thread's current device, so every thread that calls them binds its
       device first (device_bind); these name the device explicitly instead. */
    /* Makes device the calling thread's current device (nccl: cudaSetDevice). Never
       blocks; the calling thread. */
    tide_status (*device_bind)(int device);
    /* mem_alloc on device, whatever the calling thread's current device (left as it
       was). Does not block on peers; any thread. */
    tide_status (*mem_alloc_on)(int device, size_t bytes, void **out);
    /* Zero-fills bytes at ptr (memory of device) without a host buffer; returns when
       done. Any thread. */
    tide_status (*mem_zero)(int device, void *ptr, size_t bytes);
    /* TIDE_OK when [ptr, ptr + bytes) can be this backend's memory; TIDE_ERR_INVALID
       naming what (a tensor, "send buffer") otherwise: a device pointer handed to a
       host backend, host memory to a device one. Never blocks; any thread. */
    tide_status (*mem_check)(const void *ptr, size_t bytes, const char *what);
    /* A new stream on device with the lowest priority the device offers, for work that
       must yield to training (offline plugins). Any thread; free with stream_free. */
    tide_status (*stream_new_low)(int device, tide_coll_stream_t *out);
    void (*stream_free)(tide_coll_stream_t stream);
    /* Optional (NULL: plain host memory, tide_malloc). Host memory the backend's copies
       move fastest to and from (nccl: pinned, cudaMallocHost), where the memory pool
       spills shards that do not fit during a switch. Does not block on peers; any
       thread. host_free frees it; NULL is fine. */
    tide_status (*host_alloc)(size_t bytes, void **out);
    void (*host_free)(void *ptr);
    /* Optional (NULL: a host-memory backend). The memory of device in bytes (nccl:
       cudaMemGetInfo's total there), what the worker reports to tided. Any thread. */
    tide_status (*mem_total)(int device, uint64_t *bytes);
} tide_coll_backend_v1;

/* ---- backends and pools -------------------------------------------------------- */

/* Finds a backend by name ("mpi", "nccl"); TIDE_ERR_NOT_FOUND with the list of built
   backends otherwise. The table is static; any thread. */
tide_status tide_coll_backend_find(const char *name, const tide_coll_backend_v1 **out);

/* Names of the built backends, comma-separated ("mpi,nccl"); static string. */
const char *tide_coll_backend_names(void);

/* Adds be (static storage, version TIDE_COLL_BACKEND_VERSION, a name no other backend
   has) to the backends tide_coll_backend_find knows: a transport linked with tide's
   static libraries (libtide.so exports none of this header), or a test's wrapper of a
   built one. At most 4. Call it before any thread uses the table (main thread, before
   tide_new). Communicators made through be (tide_coll_comm_new, and splits of them)
   dispatch every later call through be, so a wrapper sees them all. */
tide_status tide_coll_backend_register(const tide_coll_backend_v1 *be);

/* Makes device the calling thread's current device for backend be (nccl:
   cudaSetDevice); TIDE_OK and nothing else for a host backend. Any thread. */
tide_status tide_coll_device_bind(const tide_coll_backend_v1 *be, int device);

/* Allocates bytes of be's memory on device (host backends: host memory); caller frees
   it with be->mem_free. Any thread. */
tide_status tide_coll_mem_alloc(const tide_coll_backend_v1 *be, int device, size_t bytes,
                                void **out);

/* Zero-fills bytes of be's memory at ptr on device, on the device itself (no host
   staging); returns when done. Any thread. */
tide_status tide_coll_mem_zero(const tide_coll_backend_v1 *be, int device, void *ptr, size_t bytes);

/* TIDE_OK when ptr can be be's kind of memory; TIDE_ERR_INVALID with a message naming
   what and both kinds otherwise (see mem_check). Never blocks; any thread. */
tide_status tide_coll_mem_check(const tide_coll_backend_v1 *be, const void *ptr, size_t bytes,
                                const char *what);

/* A low-priority stream on device for background work (NULL for host backends); free
   it with tide_coll_stream_free. Any thread. */
tide_status tide_coll_stream_new_low(const tide_coll_backend_v1 *be, int device,
                                     tide_coll_stream_t *out);

/* Frees a stream from tide_coll_stream_new_low; NULL is fine. Any thread. */
void tide_coll_stream_free(const tide_coll_backend_v1 *be, tide_coll_stream_t stream);

/* True when dtype is one of the reduction dtypes backend be supports. */
int tide_coll_backend_has_dtype(const tide_coll_backend_v1 *be, tide_dtype dtype);

/* Creates a pool over world (typically MPI_COMM_WORLD; it is duplicated, so tide's
   traffic never matches the program's). Collective over world: call it once at start,
   while every rank is alive. Main thread; caller owns *out. */
tide_status tide_coll_pool_new(tide_coll_pool_t **out, MPI_Comm world);

/* Frees *self_p and sets it to NULL; NULL is fine. Local only (never blocks). */
void tide_coll_pool_destroy(tide_coll_pool_t **self_p);

/* This process's rank in the pool. */
int tide_coll_pool_rank(const tide_coll_pool_t *pool);

/* Number of processes in the pool. */
int tide_coll_pool_size(const tide_coll_pool_t *pool);

/* Creates a pool of `size` pool ranks over comm (duplicated), whose process c holds pool
   rank prank[c]; pool ranks no process of comm holds are unreachable (members of a job
   that died before its pool joined another). Used when separately launched pools are
   connected into one (MPI_Intercomm_merge): pool ranks stay the job's ranks. Collective
   over comm; main thread (or the one thread calling MPI); caller owns *out. */
tide_status tide_coll_pool_new_ranked(tide_coll_pool_t **out, MPI_Comm comm, const int *prank,
                                      int size);

/* Creates a pool over the processes of pool that hold pool ranks members[0..n) (sorted,
   distinct, the caller's among them), each keeping its pool rank; the pool's other ranks
   are unreachable in it. Used when a launch leaves a job: each side keeps a pool of its
   own and drops the other's processes. Collective over the members only (the others may
   be dead or doing the same over theirs); bounded by timeout_ms (0: the default) and by
   *cancel (NULL: none). tag in [0, TIDE_COLL_MAX_TAG], the same on every member and
   unused by other creations over pool at the time. Caller owns *out. */
tide_status tide_coll_pool_subset(tide_coll_pool_t **out, tide_coll_pool_t *pool,
                                  const int *members, int n, int tag, uint32_t timeout_ms,
                                  const int *cancel);

/* Every member's `bytes` of mine, in member order, into all (n * bytes), in host memory
   over the pool's MPI communicator, never on a device: members[0] gathers the parts and
   sends the table back. For agreements that must not interleave with a device's
   collectives (a thread of its own while the training thread's run). members: sorted pool
   ranks, the caller's among them; tag in [0, TIDE_COLL_MAX_TAG], the same on every member
   and used by no other creation over pool at the time. Collective over the members only;
   bounded by timeout_ms (0: the default) and *cancel (NULL: none). */
tide_status tide_coll_pool_allgather(tide_coll_pool_t *pool, const int *members, int n, int tag,
                                     uint32_t timeout_ms, const int *cancel, const void *mine,
                                     size_t bytes, void *all);

/* The pool's private communicator (borrowed; for connecting pools). Any thread. */
MPI_Comm tide_coll_pool_comm(const tide_coll_pool_t *pool);

/* The rank in tide_coll_pool_comm(pool) of the process holding pool rank r, or -1 when
   none does. Any thread. */
int tide_coll_pool_comm_rank(const tide_coll_pool_t *pool, int r);

/* ---- communicators ------------------------------------------------------------- */

/* Creates a communicator of backend be over params->members (validated: in range,
   unique, caller included). Blocks, collective over the members only; caller's thread
   becomes the owner. Caller owns *out. */
tide_status tide_coll_comm_new(tide_coll_comm_t **out, const tide_coll_backend_v1 *be,
                               tide_coll_pool_t *pool, const tide_coll_comm_params *params);

/* Splits parent by colour; colour < 0 takes part but gets *out = NULL. Blocks,
   collective over parent. Caller owns *out. */
tide_status tide_coll_comm_split(tide_coll_comm_t *parent, int color, int key,
                                 tide_coll_comm_t **out);

/* Frees *self_p and sets it to NULL; NULL is fine. Never blocks on peers. */
void tide_coll_comm_destroy(tide_coll_comm_t **self_p);

/* Aborts comm: every operation blocked on it returns TIDE_ERR_ABORTED promptly, and
   every later one fails at once. Any thread, never blocks, idempotent. */
void tide_coll_comm_abort(tide_coll_comm_t *comm);

/* 1 once comm has been aborted (or an operation on it failed, its watch word was set, or
   the process's lease ran out); any thread. */
int tide_coll_comm_aborted(const tide_coll_comm_t *comm);

/* Pool rank of comm rank r (r < size); -1 when out of range. */
int tide_coll_comm_pool_rank(const tide_coll_comm_t *comm, int r);

/* The backend comm was created with. */
const tide_coll_backend_v1 *tide_coll_comm_backend(const tide_coll_comm_t *comm);

/* ---- lease: a process that was given up must not touch its peers ---------------- */

/*
 * Fences this process's communication by time. Once the monotonic clock (tide_now_ns)
 * passes until_ns, every communicator of every pool counts as aborted: operations and
 * creations fail with TIDE_ERR_ABORTED, and what they leave behind is abandoned without
 * another call into MPI or NCCL, because the process may have been declared failed while
 * it was stopped and its peers gave up its messages (any further progress could deliver
 * into buffers they have reused). 0, the default, means no lease. The worker runtime
 * renews it with each heartbeat, to the failure timeout after it; any thread.
 */
void tide_coll_lease_set(uint64_t until_ns);

/* 1 once a lease was set and has run out. Any thread, never blocks. */
int tide_coll_lease_expired(void);

/* ---- operations (see the table above for the contract of each) ----------------- */

/* The operations a program calls (allreduce, broadcast, allgather, reduce-scatter,
   barrier, p2p_start, group_p2p, req_test/wait/free, comm_rank/size) are declared in
   <tide/comm.h>. */

/* tide_coll_p2p_start with peers ([n], or NULL) giving the other end's layout of each op
   (see tide_p2p_peer). Does not block; owner thread. */
tide_status tide_coll_p2p_start_peers(tide_coll_comm_t *comm, const tide_p2p_op *ops,
                                      const tide_p2p_peer *peers, size_t n,
                                      tide_coll_stream_t stream, tide_coll_req_t **out);

#ifdef __cplusplus
}
#endif

#endif /* TIDE_COLLECTIVES_H */
