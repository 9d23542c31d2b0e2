/*
 * collectives internals: the structures behind the opaque handles, the polling
 * backoff every blocking operation uses, host reductions, the pool handshake that
 * precedes communicator creation, and MPI_CHECK. Only collectives/ includes this.
 */
#ifndef TIDE_COLLECTIVES_INT_H
#define TIDE_COLLECTIVES_INT_H

#include <stdatomic.h>
#include <stdint.h>

#include "collectives/collectives.h"
#include "core/error.h"
#include "core/log.h"

#ifdef __cplusplus
extern "C" {
#endif

#define TIDE_COLL_LOG "coll"

/* Default creation timeout when tide_coll_comm_params.timeout_ms is 0. */
#define TIDE_COLL_DEFAULT_TIMEOUT_MS 30000u

/* Largest tag a caller may pass; tags 2t and 2t+1 are used on the pool communicator. */
#define TIDE_COLL_MAX_TAG 16383

struct tide_coll_pool {
    MPI_Comm comm;  /* private duplicate of the world given to tide_coll_pool_new */
    int rank, size; /* this process's pool rank; pool ranks (reachable or not) */
    int *crank;     /* [size]: comm rank of each pool rank, -1 when it is not in comm (a
                       pool that joined others: see tide_coll_pool_new_ranked); NULL:
                       pool rank == comm rank */
};

/* The rank in pool->comm of pool rank r, or -1 when r is not reachable there. */
static inline int tide__pool_crank(const tide_coll_pool_t *pool, int r)
{
    if (r < 0 || r >= pool->size)
        return -1;
    return pool->crank ? pool->crank[r] : r;
}

struct tide_coll_comm {
    const tide_coll_backend_v1 *be;
    tide_coll_pool_t *pool; /* borrowed: the pool outlives its communicators */
    int rank, size;
    int *members;        /* [size] pool ranks */
    int tag;             /* creation tag; splits derive theirs from it */
    unsigned split_seq;  /* splits so far (same on every member) */
    uint32_t timeout_ms; /* creation timeout, reused by splits */
    atomic_int aborted;  /* set by tide_coll_comm_abort from any thread */
    const int *watch;    /* the creator's abort word (tide_coll_comm_params.watch), inherited
                            by splits; NULL: none */
    void *impl;          /* backend state */
};

/* Allocates the common part of a communicator (members copied); impl left NULL. */
tide_status tide__comm_alloc(const tide_coll_backend_v1 *be, tide_coll_pool_t *pool,
                             const int *members, int n, int tag, uint32_t timeout_ms,
                             tide_coll_comm_t **out);

/* Frees what tide__comm_alloc allocated; NULL is fine. */
void tide__comm_free(tide_coll_comm_t *comm);

/* Marks comm dead (used when an operation fails); any thread. */
static inline void tide__comm_kill(tide_coll_comm_t *comm)
{
    atomic_store(&comm->aborted, 1);
}

static inline int tide__comm_is_aborted(tide_coll_comm_t *comm)
{
    return comm != NULL &&
           (atomic_load_explicit(&comm->aborted, memory_order_relaxed) != 0 ||
            (comm->watch != NULL && __atomic_load_n(comm->watch, __ATOMIC_RELAXED)) ||
            tide_coll_lease_expired());
}

/*
 * Polling backoff. Blocking operations poll their requests in a loop; between polls
 * they call tide__backoff_pause. For the first second after the last completion a
 * pause is a sched_yield, as Open MPI's own blocking calls do with
 * mpi_yield_when_idle: a large message over shared memory or TCP only moves while
 * both ends keep polling, so sleeping there would cut bandwidth several times over.
 * After a second without any completion (a dead or very late peer) the pause grows
 * from 10 us to 1 ms, so a rank waiting on a dead peer costs little CPU and still
 * notices an abort within about 1 ms.
 */
#define TIDE_COLL_YIELD_WINDOW_NS (1000ull * 1000 * 1000)

typedef struct tide__backoff {
    uint64_t last_progress_ns;
    uint64_t sleep_ns;
    unsigned spins;
} tide__backoff;

void tide__backoff_init(tide__backoff *b);
void tide__backoff_progress(tide__backoff *b);
void tide__backoff_pause(tide__backoff *b);

/* Size in bytes of a reduction dtype (f32, f64, bf16, i32, i64); 0 for the others. */
size_t tide__red_dtype_size(tide_dtype dtype);

/* inout[i] = inout[i] op in[i] for i < count, on host memory. */
void tide__reduce_host(void *inout, const void *in, size_t count, tide_dtype dtype, tide_red_op op);

/* bf16 <-> f32 with round-to-nearest-even (NaN stays NaN). */
float tide__bf16_to_f32(uint16_t v);
uint16_t tide__f32_to_bf16(float f);

/*
 * Rendezvous of the members of a new communicator over the pool, before any
 * collective creation call: every member sends "arrived" to members[0], which
 * answers "go" with payload (payload_len bytes, up to 128) once all have arrived.
 * Non-root members receive the payload into payload. Bounded by timeout_ms
 * (TIDE_ERR_TIMEOUT naming the missing ranks) and by cancel (TIDE_ERR_ABORTED once set). Members
 * must agree on the member list (checked by hash: TIDE_ERR_PROTOCOL) and tag. Caller's thread.
 */
#define TIDE_COLL_HANDSHAKE_PAYLOAD 128
tide_status tide__pool_handshake(tide_coll_pool_t *pool, const int *members, int n, int tag,
                                 uint32_t timeout_ms, const int *cancel, void *payload,
                                 size_t payload_len);

/* Makes the handshake's payload (payload_len bytes at payload) on members[0]. */
typedef tide_status (*tide__handshake_make_fn)(void *ctx, void *payload, size_t payload_len);

/* What a handshake is: tide__pool_handshake's arguments and two more. */
typedef struct tide__handshake {
    const int *members;
    int n, tag;
    uint32_t timeout_ms;
    const int *cancel, *cancel2; /* either ends it (each may be NULL): a split's parent may be
                                    aborted directly or through the word it watches */
    tide__handshake_make_fn make; /* NULL: members[0]'s payload as given */
    void *make_ctx;
} tide__handshake;

/*
 * tide__pool_handshake of h, ended by either of its flags, whose payload members[0] makes
 * with h->make(h->make_ctx, ...) when make is set, only once every member has arrived (and
 * not at all when one never does, the handshake then failing as above); make is ignored
 * elsewhere. When make fails, members[0] returns its status and every other member
 * TIDE_ERR_BACKEND naming members[0]. Caller's thread.
 */
tide_status tide__pool_handshake_run(tide_coll_pool_t *pool, const tide__handshake *h,
                                     void *payload, size_t payload_len);

/* Every member's `bytes` of mine, in member order, into all (n * bytes), over the pool's
   MPI communicator in host memory: members[0] gathers the parts and sends the table back.
   MPI tag 2 * tag; bounded by timeout_ms and the two cancel flags (each may be NULL).
   Collective over members; caller's thread. */
tide_status tide__pool_allgather(tide_coll_pool_t *pool, const int *members, int n, int tag,
                                 uint32_t timeout_ms, const int *cancel, const int *cancel2,
                                 const void *mine, size_t bytes, void *all);

/* 1 when cancel (a tide_coll_comm_params.cancel flag, may be NULL) is set. Any thread. */
static inline int tide__cancelled(const int *cancel)
{
    return cancel != NULL && __atomic_load_n(cancel, __ATOMIC_RELAXED) != 0;
}

/*
 * Gives up on MPI requests after an abort or timeout: cancels each active one, waits
 * up to 50 ms for the cancellations, then frees what is left (MPI keeps those alive in
 * the background). Returns how many were still active when freed. Once the lease ran
 * out it makes no MPI call at all (cancelling and testing progress the engine) and
 * returns n: the requests stay as they are. Caller's thread.
 */
int tide__mpi_abandon(MPI_Request *reqs, int n);

/* Translates an MPI error code into TIDE_ERR_BACKEND with its message and logs file:line. */
tide_status tide__mpi_error(int err, const char *expr, const char *file, int line);

#define MPI_CHECK(expr)                                                                            \
    do {                                                                                           \
        int tide__mpirc = (expr);                                                                  \
        if (TIDE_UNLIKELY(tide__mpirc != MPI_SUCCESS))                                             \
            return tide__mpi_error(tide__mpirc, #expr, __FILE__, __LINE__);                        \
    } while (0)

#define MPI_CHECK_GOTO(expr, rc, label)                                                            \
    do {                                                                                           \
        int tide__mpirc = (expr);                                                                  \
        if (TIDE_UNLIKELY(tide__mpirc != MPI_SUCCESS)) {                                           \
            (rc) = tide__mpi_error(tide__mpirc, #expr, __FILE__, __LINE__);                        \
            goto label;                                                                            \
        }                                                                                          \
    } while (0)

/*
 * 2D copies without a pitch limit. cudaMemcpy2DAsync refuses pitches above the device's
 * maximum (cudaDevAttrMaxPitch, 2 GiB - 1 on current GPUs), and a contiguous tensor of
 * 2 GiB or more arrives as one row of that pitch. tide__copy2d_choose picks: FLAT, one
 * contiguous copy (one row, or rows back to back at both ends); 2D, one pitched copy
 * (both pitches within max_pitch); ROWS, one contiguous copy per row (a pitch beyond the
 * limit, which only rows of GiBs have, so they are few). tide__copy2d_split carries the
 * choice out through the two callbacks. Pure; any thread.
 */
typedef enum tide__copy2d_mode {
    TIDE__COPY_FLAT = 0,
    TIDE__COPY_2D = 1,
    TIDE__COPY_ROWS = 2,
} tide__copy2d_mode;

typedef struct tide__copy2d_fns {
    tide_status (*flat)(void *ctx, void *dst, const void *src, size_t bytes);
    tide_status (*rect)(void *ctx, void *dst, size_t dpitch, const void *src, size_t spitch,
                        size_t width, size_t height);
} tide__copy2d_fns;

tide__copy2d_mode tide__copy2d_choose(size_t dpitch, size_t spitch, size_t width, size_t height,
                                      size_t max_pitch);
tide_status tide__copy2d_split(void *dst, size_t dpitch, const void *src, size_t spitch,
                               size_t width, size_t height, size_t max_pitch,
                               const tide__copy2d_fns *fns, void *ctx);

/* The built-in backends. */
extern const tide_coll_backend_v1 tide__coll_mpi_backend;
#if defined(TIDE_HAVE_NCCL)
extern const tide_coll_backend_v1 tide__coll_nccl_backend;

/* TIDE_OK when NCCL_VERSION_CODE code (ncclGetVersion's) is at least 2.18, which the nccl
   backend needs; else TIDE_ERR_UNSUPPORTED naming the version and where (the library's
   file) it was loaded from. Pure; any thread. */
tide_status tide__nccl_version_check(int code, const char *where);
#endif

#ifdef __cplusplus
}
#endif

#endif /* TIDE_COLLECTIVES_INT_H */
