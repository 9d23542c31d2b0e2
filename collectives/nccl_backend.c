/*
 * The "nccl" collective backend: CUDA device memory, NCCL underneath. Built only when
 * CUDA and NCCL were found (TIDE_HAVE_NCCL).
 *
 * Communicators are non-blocking NCCL communicators (ncclConfig_t.blocking = 0) made
 * with ncclCommInitRankConfig from a unique id that the first member sends to the
 * others in the pool handshake (over MPI); splits use ncclCommSplit. Every operation is
 * enqueued on the caller's CUDA stream and then polled to completion (an event query,
 * ncclCommGetAsyncError for remote failures, the abort flag, and the tide__backoff
 * pause), so v1's "complete on return" contract holds and an abort is noticed within a
 * millisecond. Abort from another thread only sets the flag; the owner thread, which
 * is the only one that ever touches the NCCL communicator, then calls ncclCommAbort,
 * which also stops kernels stuck waiting for a dead peer. NCCL has no barrier: it is an
 * allreduce of one int in device scratch.
 *
 * Foreign codes (ncclResult_t, cudaError_t) are translated here only, by NCCL_CHECK and
 * CUDA_CHECK, which log file:line and return a tide_status.
 *
 * Workload: one device per process; a few communicators; messages up to GiBs.
 */
#include <cuda_runtime_api.h>
#include <nccl.h>
#include <string.h>

#include "collectives/collectives_int.h"
#include "core/alloc.h"
#include "core/clock.h"

static tide_status cuda_error(cudaError_t e, const char *expr, const char *file, int line)
{
    TIDE_ERROR(TIDE_COLL_LOG, "%s:%d: %s failed: %s", file, line, expr, cudaGetErrorString(e));
    tide_status rc = TIDE_ERR_BACKEND;
    if (e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver)
        rc = TIDE_ERR_NO_DEVICE;
    else if (e == cudaErrorMemoryAllocation)
        rc = TIDE_ERR_NOMEM;
    return tide_errorf(rc, "%s failed: %s", expr, cudaGetErrorString(e));
}

static tide_status nccl_error(ncclResult_t r, ncclComm_t nc, const char *expr, const char *file,
                              int line)
{
    const char *last = ncclGetLastError(nc);
    TIDE_ERROR(TIDE_COLL_LOG, "%s:%d: %s failed: %s (%s)", file, line, expr, ncclGetErrorString(r),
               last ? last : "");
    tide_status rc = TIDE_ERR_BACKEND;
    if (r == ncclRemoteError)
        rc = TIDE_ERR_PEER;
    else if (r == ncclInvalidArgument || r == ncclInvalidUsage)
        rc = TIDE_ERR_INVALID;
    return tide_errorf(rc, "%s failed: %s%s%s", expr, ncclGetErrorString(r),
                       last && last[0] ? ": " : "", last ? last : "");
}

#define CUDA_CHECK(expr)                                                                           \
    do {                                                                                           \
        cudaError_t tide__ce = (expr);                                                             \
        if (TIDE_UNLIKELY(tide__ce != cudaSuccess))                                                \
            return cuda_error(tide__ce, #expr, __FILE__, __LINE__);                                \
    } while (0)

/* ncclInProgress is not an error on a non-blocking communicator: the caller settles it. */
#define NCCL_CHECK(expr, nc)                                                                       \
    do {                                                                                           \
        ncclResult_t tide__nr = (expr);                                                            \
        if (TIDE_UNLIKELY(tide__nr != ncclSuccess && tide__nr != ncclInProgress))                  \
            return nccl_error(tide__nr, (nc), #expr, __FILE__, __LINE__);                          \
    } while (0)

typedef struct nccl_comm {
    ncclComm_t nc;
    cudaEvent_t ev; /* completion of the last enqueued operation */
    int *scratch;   /* one device int for the barrier */
    int has_ev;
} nccl_comm;

typedef struct nccl_req {
    cudaEvent_t ev;
} nccl_req;

static nccl_comm *impl(tide_coll_comm_t *c)
{
    return c->impl;
}

/* Owner thread only: tears the NCCL communicator down after an abort. */
static void hard_abort(tide_coll_comm_t *c)
{
    nccl_comm *m = impl(c);
    if (m->nc != NULL) {
        ncclResult_t r = ncclCommAbort(m->nc);
        if (r != ncclSuccess && r != ncclInProgress)
            TIDE_WARN(TIDE_COLL_LOG, "ncclCommAbort: %s", ncclGetErrorString(r));
        m->nc = NULL;
    }
    tide__comm_kill(c);
}

static tide_status aborted_error(tide_coll_comm_t *c)
{
    hard_abort(c);
    return tide_errorf(TIDE_ERR_ABORTED,
                       "communicator aborted while rank %d of %d was waiting on its peers", c->rank,
                       c->size);
}

/* Checks the communicator's asynchronous state; *busy = 1 while ncclInProgress. */
static tide_status async_state(ncclComm_t nc, int *busy)
{
    ncclResult_t ae = ncclSuccess;
    NCCL_CHECK(ncclCommGetAsyncError(nc, &ae), nc);
    *busy = ae == ncclInProgress;
    if (ae != ncclSuccess && ae != ncclInProgress)
        return nccl_error(ae, nc, "asynchronous NCCL operation", __FILE__, __LINE__);
    return TIDE_OK;
}

/* Waits until a non-blocking call has settled (init, split, enqueue, finalize). c may be
   NULL during creation; deadline_ns 0 means none. */
static tide_status settle(tide_coll_comm_t *c, ncclComm_t nc, uint64_t deadline_ns)
{
    tide__backoff bo;
    tide__backoff_init(&bo);
    for (;;) {
        int busy = 0;
        TIDE_CHECK(async_state(nc, &busy));
        if (!busy)
            return TIDE_OK;
        if (c != NULL && tide__comm_is_aborted(c))
            return aborted_error(c);
        if (deadline_ns && tide_now_ns() > deadline_ns)
            return tide_errorf(TIDE_ERR_TIMEOUT, "NCCL communicator setup timed out");
        tide__backoff_pause(&bo);
    }
}

/* Polls ev until the work before it on its stream has finished. */
static tide_status wait_event(tide_coll_comm_t *c, cudaEvent_t ev)
{
    tide__backoff bo;
    tide__backoff_init(&bo);
    for (;;) {
        cudaError_t e = cudaEventQuery(ev);
        if (e == cudaSuccess)
            return TIDE_OK;
        if (e != cudaErrorNotReady)
            return cuda_error(e, "cudaEventQuery", __FILE__, __LINE__);
        if (tide__comm_is_aborted(c))
            return aborted_error(c);
        int busy = 0;
        TIDE_CHECK(async_state(impl(c)->nc, &busy));
        tide__backoff_pause(&bo);
    }
}

/* After enqueueing on stream: settles the call, then waits for the stream to get there. */
static tide_status complete(tide_coll_comm_t *c, ncclResult_t r, const char *what,
                            tide_coll_stream_t stream)
{
    nccl_comm *m = impl(c);
    if (r != ncclSuccess && r != ncclInProgress)
        return nccl_error(r, m->nc, what, __FILE__, __LINE__);
    if (r == ncclInProgress)
        TIDE_CHECK(settle(c, m->nc, 0));
    CUDA_CHECK(cudaEventRecord(m->ev, (cudaStream_t)stream));
    return wait_event(c, m->ev);
}

static ncclDataType_t nccl_type(tide_dtype d)
{
    switch (d) {
    case TIDE_F32:
        return ncclFloat32;
    case TIDE_F64:
        return ncclFloat64;
    case TIDE_BF16:
        return ncclBfloat16;
    case TIDE_I32:
        return ncclInt32;
    default:
        return ncclInt64;
    }
}

/* ---- communicators ---------------------------------------------------------------------- */

static void nccl_destroy(tide_coll_comm_t *c);

static tide_status alloc_comm(tide_coll_pool_t *pool, const int *members, int n, int tag,
                              uint32_t timeout_ms, tide_coll_comm_t **out)
{
    tide_coll_comm_t *c = NULL;
    tide_status rc = TIDE_OK;
    TIDE_CHECK(tide__comm_alloc(&tide__coll_nccl_backend, pool, members, n, tag, timeout_ms, &c));
    nccl_comm *m = tide_calloc(1, sizeof *m);
    TIDE_CHECK_ALLOC_GOTO(m, rc, fail);
    c->impl = m;
    cudaError_t e = cudaMalloc((void **)&m->scratch, sizeof(int));
    if (e != cudaSuccess) {
        rc = cuda_error(e, "cudaMalloc(scratch)", __FILE__, __LINE__);
        goto fail;
    }
    e = cudaEventCreateWithFlags(&m->ev, cudaEventDisableTiming);
    if (e != cudaSuccess) {
        rc = cuda_error(e, "cudaEventCreateWithFlags", __FILE__, __LINE__);
        goto fail;
    }
    m->has_ev = 1;
    *out = c;
    return TIDE_OK;
fail:
    nccl_destroy(c);
    return rc;
}

static tide_status nccl_create(tide_coll_pool_t *pool, const tide_coll_comm_params *p,
                               tide_coll_comm_t **out)
{
    tide_coll_comm_t *c = NULL;
    tide_status rc = TIDE_OK;
    TIDE_CHECK(alloc_comm(pool, p->members, p->n_members, p->tag, p->timeout_ms, &c));
    nccl_comm *m = impl(c);
    ncclUniqueId id;
    memset(&id, 0, sizeof id);
    _Static_assert(sizeof id <= TIDE_COLL_HANDSHAKE_PAYLOAD, "unique id fits the handshake");
    if (c->rank == 0) {
        ncclResult_t r = ncclGetUniqueId(&id);
        if (r != ncclSuccess) {
            rc = nccl_error(r, NULL, "ncclGetUniqueId", __FILE__, __LINE__);
            goto fail;
        }
    }
    TIDE_CHECK_GOTO(
        tide__pool_handshake(pool, p->members, p->n_members, p->tag, p->timeout_ms, &id, sizeof id),
        rc, fail);
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    ncclResult_t r = ncclCommInitRankConfig(&m->nc, c->size, id, c->rank, &cfg);
    if (r != ncclSuccess && r != ncclInProgress) {
        rc = nccl_error(r, m->nc, "ncclCommInitRankConfig", __FILE__, __LINE__);
        goto fail;
    }
    uint64_t ms = p->timeout_ms ? p->timeout_ms : TIDE_COLL_DEFAULT_TIMEOUT_MS;
    TIDE_CHECK_GOTO(settle(NULL, m->nc, tide_now_ns() + ms * 1000000ull), rc, fail);
    *out = c;
    return TIDE_OK;
fail:
    if (m->nc) {
        ncclCommAbort(m->nc);
        m->nc = NULL;
    }
    nccl_destroy(c);
    return rc;
}

static tide_status nccl_split(tide_coll_comm_t *parent, int color, int key, const int *members,
                              int n, tide_coll_comm_t **out)
{
    *out = NULL;
    tide_coll_comm_t *c = NULL;
    tide_status rc = TIDE_OK;
    if (color >= 0)
        TIDE_CHECK(alloc_comm(parent->pool, members, n, parent->tag, parent->timeout_ms, &c));
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    ncclComm_t nc = NULL;
    /* Every parent rank calls it, NOCOLOR ones included. */
    ncclResult_t r =
        ncclCommSplit(impl(parent)->nc, color >= 0 ? color : NCCL_SPLIT_NOCOLOR, key, &nc, &cfg);
    if (r != ncclSuccess && r != ncclInProgress) {
        rc = nccl_error(r, impl(parent)->nc, "ncclCommSplit", __FILE__, __LINE__);
        goto fail;
    }
    TIDE_CHECK_GOTO(settle(parent, impl(parent)->nc, 0), rc, fail);
    if (color < 0)
        return TIDE_OK;
    impl(c)->nc = nc;
    if (nc == NULL)
        TIDE_FAIL_GOTO(rc, fail, TIDE_ERR_BACKEND, "ncclCommSplit gave no communicator");
    TIDE_CHECK_GOTO(settle(parent, nc, 0), rc, fail);
    int got = -1, count = -1;
    ncclCommUserRank(nc, &got);
    ncclCommCount(nc, &count);
    if (got != c->rank || count != c->size)
        TIDE_FAIL_GOTO(rc, fail, TIDE_ERR_INTERNAL,
                       "ncclCommSplit gave rank %d of %d where tide expected %d of %d", got, count,
                       c->rank, c->size);
    *out = c;
    return TIDE_OK;
fail:
    if (c)
        tide__comm_kill(c);
    nccl_destroy(c);
    return rc;
}

static void nccl_destroy(tide_coll_comm_t *c)
{
    if (c == NULL)
        return;
    nccl_comm *m = impl(c);
    if (m != NULL) {
        if (m->nc != NULL) {
            if (tide__comm_is_aborted(c)) {
                hard_abort(c);
            } else {
                /* Flush, bounded: a peer that never finalizes must not hang us. */
                ncclResult_t r = ncclCommFinalize(m->nc);
                if ((r != ncclSuccess && r != ncclInProgress) ||
                    settle(NULL, m->nc, tide_now_ns() + 5000ull * 1000000ull) != TIDE_OK) {
                    TIDE_WARN(TIDE_COLL_LOG, "NCCL finalize did not complete; aborting");
                    hard_abort(c);
                } else {
                    ncclCommDestroy(m->nc);
                    m->nc = NULL;
                }
            }
        }
        if (m->has_ev)
            cudaEventDestroy(m->ev);
        if (m->scratch)
            cudaFree(m->scratch);
        tide_free(m);
    }
    tide__comm_free(c);
}

static void nccl_abort(tide_coll_comm_t *c)
{
    (void)c; /* the owner thread calls ncclCommAbort when it sees the flag */
}

/* ---- operations --------------------------------------------------------------------------- */

static tide_status enqueue_p2p(tide_coll_comm_t *c, const tide_p2p_op *ops, size_t n,
                               tide_coll_stream_t stream)
{
    nccl_comm *m = impl(c);
    cudaStream_t s = (cudaStream_t)stream;
    NCCL_CHECK(ncclGroupStart(), m->nc);
    for (size_t i = 0; i < n; i++) {
        ncclResult_t r = ops[i].kind == TIDE_P2P_SEND
                             ? ncclSend(ops[i].buf, ops[i].bytes, ncclInt8, ops[i].peer, m->nc, s)
                             : ncclRecv(ops[i].buf, ops[i].bytes, ncclInt8, ops[i].peer, m->nc, s);
        if (r != ncclSuccess && r != ncclInProgress) {
            ncclGroupEnd();
            return nccl_error(r, m->nc, "ncclSend/ncclRecv", __FILE__, __LINE__);
        }
    }
    ncclResult_t r = ncclGroupEnd();
    if (r != ncclSuccess && r != ncclInProgress)
        return nccl_error(r, m->nc, "ncclGroupEnd", __FILE__, __LINE__);
    if (r == ncclInProgress)
        TIDE_CHECK(settle(c, m->nc, 0));
    return TIDE_OK;
}

static tide_status nccl_p2p_start(tide_coll_comm_t *c, const tide_p2p_op *ops,
                                  const tide_p2p_peer *peers, size_t n, tide_coll_stream_t stream,
                                  tide_coll_req_t **out)
{
    (void)peers; /* NCCL picks its own transport */
    nccl_req *q = tide_calloc(1, sizeof *q);
    if (q == NULL)
        return tide_errorf(TIDE_ERR_NOMEM, "out of memory for a p2p batch");
    cudaError_t e = cudaEventCreateWithFlags(&q->ev, cudaEventDisableTiming);
    if (e != cudaSuccess) {
        tide_free(q);
        return cuda_error(e, "cudaEventCreateWithFlags", __FILE__, __LINE__);
    }
    tide_status rc = enqueue_p2p(c, ops, n, stream);
    if (rc == TIDE_OK) {
        e = cudaEventRecord(q->ev, (cudaStream_t)stream);
        if (e != cudaSuccess)
            rc = cuda_error(e, "cudaEventRecord", __FILE__, __LINE__);
    }
    if (rc != TIDE_OK) {
        cudaEventDestroy(q->ev);
        tide_free(q);
        return rc;
    }
    *out = (tide_coll_req_t *)q;
    return TIDE_OK;
}

static tide_status nccl_req_test(tide_coll_comm_t *c, tide_coll_req_t *req, int *done)
{
    if (tide__comm_is_aborted(c))
        return aborted_error(c);
    cudaError_t e = cudaEventQuery(((nccl_req *)req)->ev);
    if (e == cudaSuccess) {
        *done = 1;
        return TIDE_OK;
    }
    if (e != cudaErrorNotReady)
        return cuda_error(e, "cudaEventQuery", __FILE__, __LINE__);
    int busy = 0;
    return async_state(impl(c)->nc, &busy);
}

static tide_status nccl_req_wait(tide_coll_comm_t *c, tide_coll_req_t *req)
{
    return wait_event(c, ((nccl_req *)req)->ev);
}

static void nccl_req_free(tide_coll_comm_t *c, tide_coll_req_t *req)
{
    (void)c;
    cudaEventDestroy(((nccl_req *)req)->ev);
    tide_free(req);
}

static ncclRedOp_t nccl_op(tide_red_op op)
{
    return op == TIDE_RED_MAX ? ncclMax : ncclSum;
}

static tide_status nccl_allreduce(tide_coll_comm_t *c, const void *send, void *recv, size_t count,
                                  tide_dtype dtype, tide_red_op op, tide_coll_stream_t stream)
{
    return complete(c,
                    ncclAllReduce(send, recv, count, nccl_type(dtype), nccl_op(op), impl(c)->nc,
                                  (cudaStream_t)stream),
                    "ncclAllReduce", stream);
}

static tide_status nccl_broadcast(tide_coll_comm_t *c, void *buf, size_t bytes, int root,
                                  tide_coll_stream_t stream)
{
    return complete(
        c, ncclBroadcast(buf, buf, bytes, ncclInt8, root, impl(c)->nc, (cudaStream_t)stream),
        "ncclBroadcast", stream);
}

static tide_status nccl_allgather(tide_coll_comm_t *c, const void *send, void *recv, size_t bytes,
                                  tide_coll_stream_t stream)
{
    return complete(c,
                    ncclAllGather(send, recv, bytes, ncclInt8, impl(c)->nc, (cudaStream_t)stream),
                    "ncclAllGather", stream);
}

static tide_status nccl_reduce_scatter(tide_coll_comm_t *c, const void *send, void *recv,
                                       size_t count, tide_dtype dtype, tide_red_op op,
                                       tide_coll_stream_t stream)
{
    return complete(c,
                    ncclReduceScatter(send, recv, count, nccl_type(dtype), nccl_op(op), impl(c)->nc,
                                      (cudaStream_t)stream),
                    "ncclReduceScatter", stream);
}

static tide_status nccl_barrier(tide_coll_comm_t *c, tide_coll_stream_t stream)
{
    nccl_comm *m = impl(c);
    return complete(
        c,
        ncclAllReduce(m->scratch, m->scratch, 1, ncclInt32, ncclSum, m->nc, (cudaStream_t)stream),
        "ncclAllReduce(barrier)", stream);
}

/* ---- memory ----------------------------------------------------------------------------- */

static tide_status dev_alloc(size_t bytes, void **out)
{
    *out = NULL;
    CUDA_CHECK(cudaMalloc(out, bytes ? bytes : 1));
    return TIDE_OK;
}

static void dev_free(void *p)
{
    if (p)
        cudaFree(p);
}

static tide_status pinned_alloc(size_t bytes, void **out)
{
    *out = NULL;
    CUDA_CHECK(cudaMallocHost(out, bytes ? bytes : 1));
    return TIDE_OK;
}

static void pinned_free(void *p)
{
    if (p)
        cudaFreeHost(p);
}

static tide_status dev_copy2d(void *dst, size_t dpitch, const void *src, size_t spitch,
                              size_t width, size_t height, tide_coll_stream_t stream)
{
    if (width == 0 || height == 0)
        return TIDE_OK;
    CUDA_CHECK(cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, height, cudaMemcpyDefault,
                                 (cudaStream_t)stream));
    return TIDE_OK;
}

static tide_status dev_copy_host(void *dst, const void *src, size_t bytes, int to_host,
                                 tide_coll_stream_t stream)
{
    if (bytes == 0)
        return TIDE_OK;
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes,
                               to_host ? cudaMemcpyDeviceToHost : cudaMemcpyHostToDevice,
                               (cudaStream_t)stream));
    CUDA_CHECK(cudaStreamSynchronize((cudaStream_t)stream));
    return TIDE_OK;
}

static tide_status dev_sync(tide_coll_comm_t *c, tide_coll_stream_t stream)
{
    if (c == NULL) {
        CUDA_CHECK(cudaStreamSynchronize((cudaStream_t)stream));
        return TIDE_OK;
    }
    if (tide__comm_is_aborted(c))
        return aborted_error(c);
    CUDA_CHECK(cudaEventRecord(impl(c)->ev, (cudaStream_t)stream));
    return wait_event(c, impl(c)->ev);
}

const tide_coll_backend_v1 tide__coll_nccl_backend = {
    .version = TIDE_COLL_BACKEND_VERSION,
    .name = "nccl",
    .mem_kind = TIDE_MEM_DEVICE,
    .caps = TIDE_COLL_CAP_BF16 | TIDE_COLL_CAP_SPLIT,
    .comm_create = nccl_create,
    .comm_split = nccl_split,
    .comm_destroy = nccl_destroy,
    .comm_abort = nccl_abort,
    .p2p_start = nccl_p2p_start,
    .req_test = nccl_req_test,
    .req_wait = nccl_req_wait,
    .req_free = nccl_req_free,
    .allreduce = nccl_allreduce,
    .broadcast = nccl_broadcast,
    .allgather = nccl_allgather,
    .reduce_scatter = nccl_reduce_scatter,
    .barrier = nccl_barrier,
    .mem_alloc = dev_alloc,
    .mem_free = dev_free,
    .copy2d = dev_copy2d,
    .copy_host = dev_copy_host,
    .stream_sync = dev_sync,
    .host_alloc = pinned_alloc,
    .host_free = pinned_free,
};
