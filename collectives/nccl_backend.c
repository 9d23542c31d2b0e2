/*
 * The "nccl" collective backend: CUDA device memory, NCCL underneath. Built only when
 * CUDA and NCCL were found (TIDE_HAVE_NCCL).
 *
 * Communicators are non-blocking NCCL communicators (ncclConfig_t.blocking = 0) made
 * with ncclCommInitRankConfig from a unique id that the first member makes once every
 * member has arrived and sends them in the pool handshake (over MPI); splits use
 * ncclCommSplit. Both need NCCL 2.18, checked before the first communicator. Every
 * operation is enqueued on the caller's CUDA stream and then polled to completion (an event query,
 * ncclCommGetAsyncError for remote failures, the abort flag, and the tide__backoff
 * pause), so v1's "complete on return" contract holds and an abort is noticed within a
 * millisecond. Abort from another thread only sets the flag; the owner thread, which
 * is the only one that ever touches the NCCL communicator, then calls ncclCommAbort,
 * which also stops kernels stuck waiting for a dead peer. NCCL has no barrier: it is an
 * allreduce of one int in device scratch.
 *
 * Failures: any asynchronous error ncclCommGetAsyncError reports aborts the
 * communicator at once (ncclCommAbort), because its kernels may be stuck on a dead
 * peer and would hang the next synchronous CUDA call (a cudaFree, a copy). The errors
 * a dead peer causes (ncclRemoteError; ncclSystemError from the socket and IB
 * transports) come back as TIDE_ERR_ABORTED, the status a program's step recovers
 * from, like an abort by the runtime. Creation polls the caller's cancel flag and the
 * deadline, and aborts the half-made communicator when either ends it.
 *
 * Streams: a NULL stream is libtide's own work (the switch, the reshard executor,
 * checkpoints, the runtime's copies), which never runs on CUDA's default stream, where a
 * collective of one thread could wait behind another thread's: it runs on a stream of
 * the calling thread's own for the current device (non-blocking, of the device's greatest
 * priority so that it goes ahead of offline tasks' kernels, made on first use, freed when
 * the thread exits), which first waits, on the device, for the work already queued
 * on the legacy default stream (the program's kernels that wrote the buffers). Every such
 * call completes before it returns (p2p_start: before its request completes), so later
 * default-stream work is ordered by the host.
 *
 * Devices: operations run on the calling thread's current device, which must be the
 * one the communicator was made on (libtide binds every thread it starts). The
 * allocation, zeroing and stream members name their device and leave the thread's
 * current device as it was. Copies avoid cudaMemcpy2DAsync's pitch limit
 * (tide__copy2d_split), so tensors of 2 GiB and more move.
 *
 * Foreign codes (ncclResult_t, cudaError_t) are translated here only, by NCCL_CHECK and
 * CUDA_CHECK, which log file:line and return a tide_status.
 *
 * Workload: one device per process; a few communicators; messages up to GiBs.
 */
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <nccl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
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

/* 1 for the results a dead or unreachable peer causes. ncclSystemError is also what a
   local fault gives (a socket or NIC error, every peer alive); it is mapped all the same,
   because a dead peer seen by the socket and IB transports looks exactly like that. When
   nobody died, no recovery comes for it: libtide does not retry the step on the dead
   communicators (tide_step_end marks them dead, tide_step_begin runs no step on them)
   but waits for tided's next layout for at most the switch timeout, then fails with
   TIDE_ERR_TIMEOUT saying no new layout came; the program exits and tided recovers the
   job around it (worker/tide.c, tests/test_worker_faults.c deadcomm). */
static int tide__nccl_peer_failed(ncclResult_t r)
{
    return r == ncclRemoteError || r == ncclSystemError;
}

static tide_status nccl_error(ncclResult_t r, ncclComm_t nc, const char *expr, const char *file,
                              int line)
{
    const char *last = ncclGetLastError(nc);
    TIDE_ERROR(TIDE_COLL_LOG, "%s:%d: %s failed: %s (%s)", file, line, expr, ncclGetErrorString(r),
               last ? last : "");
    tide_status rc = TIDE_ERR_BACKEND;
    if (tide__nccl_peer_failed(r))
        rc = TIDE_ERR_ABORTED; /* what a step recovers from (see the top of the file) */
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

/* ---- the NCCL version ------------------------------------------------------------------ */

/* 2.18 is the oldest NCCL with everything used here: non-blocking communicator creation
   (ncclConfig_t, 2.14) and ncclCommSplit (2.18). */
#define TIDE_NCCL_MIN_VERSION 21800

tide_status tide__nccl_version_check(int code, const char *where)
{
    if (code >= TIDE_NCCL_MIN_VERSION)
        return TIDE_OK;
    /* NCCL_VERSION_CODE: X*10000 + Y*100 + Z since 2.9, X*1000 + Y*100 + Z before */
    int wide = code >= 10000;
    int major = wide ? code / 10000 : code / 1000;
    int minor = wide ? code / 100 % 100 : code / 100 % 10;
    return tide_errorf(TIDE_ERR_UNSUPPORTED,
                       "NCCL %d.%d.%d is loaded (%s), but tide's nccl backend needs NCCL 2.18 or "
                       "newer (non-blocking communicator creation and ncclCommSplit): put a "
                       "newer libnccl.so.2 first on the loader's path (LD_LIBRARY_PATH; the "
                       "nvidia-nccl-cu13 wheel carries one)",
                       major, minor, code % 100, where);
}

/* Once per process, before the first communicator: the loaded NCCL is new enough. */
static tide_status check_version(void)
{
    static int ok; /* 1 once checked */
    if (__atomic_load_n(&ok, __ATOMIC_ACQUIRE))
        return TIDE_OK;
    int code = 0;
    ncclResult_t r = ncclGetVersion(&code);
    if (r != ncclSuccess)
        return nccl_error(r, NULL, "ncclGetVersion", __FILE__, __LINE__);
    Dl_info info;
    const char *where = "libnccl.so.2";
    void *fn = dlsym(RTLD_DEFAULT, "ncclGetVersion");
    if (fn != NULL && dladdr(fn, &info) != 0 && info.dli_fname != NULL)
        where = info.dli_fname;
    TIDE_CHECK(tide__nccl_version_check(code, where));
    if (!__atomic_exchange_n(&ok, 1, __ATOMIC_ACQ_REL))
        TIDE_INFO(TIDE_COLL_LOG, "NCCL %d.%d.%d from %s", code / 10000, code / 100 % 100,
                  code % 100, where);
    return TIDE_OK;
}

/* ---- libtide's own streams -------------------------------------------------------------- */

#define OWN_STREAMS 8 /* devices one thread may work on */

typedef struct own_streams {
    int n;
    struct {
        int device;
        cudaStream_t s;
        cudaEvent_t dep; /* recorded on the legacy default stream, waited for on s */
    } v[OWN_STREAMS];
} own_streams;

static pthread_key_t g_own_key;
static pthread_once_t g_own_once = PTHREAD_ONCE_INIT;
static int g_own_key_ok;

/* At the exit of a thread that used its own streams. */
static void own_free(void *p)
{
    own_streams *o = p;
    for (int i = 0; i < o->n; i++) {
        cudaEventDestroy(o->v[i].dep);
        cudaStreamDestroy(o->v[i].s);
    }
    tide_free(o);
}

static void own_key_init(void)
{
    g_own_key_ok = pthread_key_create(&g_own_key, own_free) == 0;
}

/* The calling thread's own stream on its current device (made on first use). */
static tide_status own_stream_here(cudaStream_t *out, cudaEvent_t *dep)
{
    pthread_once(&g_own_once, own_key_init);
    if (!g_own_key_ok)
        return tide_errorf(TIDE_ERR_NOMEM, "no thread key for the nccl backend's streams");
    int dev = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    own_streams *o = pthread_getspecific(g_own_key);
    for (int i = 0; o != NULL && i < o->n; i++)
        if (o->v[i].device == dev) {
            *out = o->v[i].s;
            *dep = o->v[i].dep;
            return TIDE_OK;
        }
    if (o == NULL) {
        o = tide_calloc(1, sizeof *o);
        if (o == NULL || pthread_setspecific(g_own_key, o) != 0) {
            tide_free(o);
            return tide_errorf(TIDE_ERR_NOMEM, "out of memory for a thread's CUDA stream");
        }
    }
    if (o->n == OWN_STREAMS)
        return tide_errorf(TIDE_ERR_RANGE, "a thread of libtide used more than %d devices",
                           OWN_STREAMS);
    /* the greatest priority: libtide's collectives and copies go ahead of offline tasks'
       kernels, which run at the least (stream_low_here) */
    int least = 0, greatest = 0;
    CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    cudaStream_t s = NULL;
    cudaEvent_t e = NULL;
    CUDA_CHECK(cudaStreamCreateWithPriority(&s, cudaStreamNonBlocking, greatest));
    cudaError_t err = cudaEventCreateWithFlags(&e, cudaEventDisableTiming);
    if (err != cudaSuccess) {
        cudaStreamDestroy(s);
        return cuda_error(err, "cudaEventCreateWithFlags", __FILE__, __LINE__);
    }
    o->v[o->n].device = dev;
    o->v[o->n].s = s;
    o->v[o->n].dep = e;
    o->n++;
    *out = s;
    *dep = e;
    return TIDE_OK;
}

/* The stream an operation given stream runs on: stream itself, or for NULL the calling
   thread's own one, made to wait for what the legacy default stream holds so far. */
static tide_status pick(tide_coll_stream_t stream, cudaStream_t *out)
{
    if (stream != NULL) {
        *out = (cudaStream_t)stream;
        return TIDE_OK;
    }
    cudaEvent_t dep = NULL;
    TIDE_CHECK(own_stream_here(out, &dep));
    CUDA_CHECK(cudaEventRecord(dep, cudaStreamLegacy));
    CUDA_CHECK(cudaStreamWaitEvent(*out, dep, 0));
    return TIDE_OK;
}

typedef struct nccl_comm {
    ncclComm_t nc;
    cudaEvent_t ev; /* completion of the last enqueued operation */
    int *scratch;   /* one device int for the barrier */
    int has_ev;
    int device; /* the device it was made on (the creating thread's current device) */
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

/* Checks nc's asynchronous state; *busy = 1 while ncclInProgress. On an error c, when
   nc is c's NCCL communicator, is aborted at once (hard_abort); a communicator being
   made (c NULL, or nc a split's child) is left to its creator, which aborts it. */
static tide_status async_state(tide_coll_comm_t *c, ncclComm_t nc, int *busy)
{
    ncclResult_t ae = ncclSuccess;
    ncclResult_t r = ncclCommGetAsyncError(nc, &ae);
    if (r != ncclSuccess)
        ae = r;
    *busy = ae == ncclInProgress;
    if (ae == ncclSuccess || ae == ncclInProgress)
        return TIDE_OK;
    tide_status rc = nccl_error(ae, nc, "asynchronous NCCL operation", __FILE__, __LINE__);
    char detail[512];
    snprintf(detail, sizeof detail, "%s", tide_last_error());
    if (c == NULL || impl(c)->nc != nc)
        return rc;
    hard_abort(c);
    return tide_errorf(rc, "%s (communicator aborted)", detail);
}

/* Waits until a non-blocking call on nc has settled (init, split, enqueue, finalize).
   c (may be NULL) is the communicator the call belongs to, whose abort flag ends the
   wait; cancel (may be NULL) is a creation's cancel flag; deadline_ns 0 means none.
   A creation (c NULL, or nc not c's) that fails leaves nc for the caller to abort. */
static tide_status settle(tide_coll_comm_t *c, ncclComm_t nc, const int *cancel,
                          uint64_t deadline_ns)
{
    tide__backoff bo;
    tide__backoff_init(&bo);
    for (;;) {
        int busy = 0;
        TIDE_CHECK(async_state(c, nc, &busy));
        if (!busy)
            return TIDE_OK;
        if (c != NULL && tide__comm_is_aborted(c))
            return impl(c)->nc == nc ? aborted_error(c)
                                     : tide_errorf(TIDE_ERR_ABORTED, "NCCL communicator setup "
                                                                     "was aborted");
        if (tide__cancelled(cancel))
            return tide_errorf(TIDE_ERR_ABORTED, "NCCL communicator setup was cancelled");
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
        TIDE_CHECK(async_state(c, impl(c)->nc, &busy));
        tide__backoff_pause(&bo);
    }
}

/* A call on c's communicator failed: a dead peer aborts it (its kernels may be stuck). */
static tide_status failed(tide_coll_comm_t *c, ncclResult_t r, const char *what)
{
    tide_status rc = nccl_error(r, impl(c)->nc, what, __FILE__, __LINE__);
    if (rc == TIDE_ERR_ABORTED) {
        char detail[512];
        snprintf(detail, sizeof detail, "%s", tide_last_error());
        hard_abort(c);
        return tide_errorf(rc, "%s (communicator aborted)", detail);
    }
    return rc;
}

/* After enqueueing on s: settles the call, then waits for the stream to get there. */
static tide_status complete(tide_coll_comm_t *c, ncclResult_t r, const char *what, cudaStream_t s)
{
    nccl_comm *m = impl(c);
    if (r != ncclSuccess && r != ncclInProgress)
        return failed(c, r, what);
    if (r == ncclInProgress)
        TIDE_CHECK(settle(c, m->nc, NULL, 0));
    CUDA_CHECK(cudaEventRecord(m->ev, s));
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
    cudaError_t e = cudaGetDevice(&m->device);
    if (e != cudaSuccess) {
        rc = cuda_error(e, "cudaGetDevice", __FILE__, __LINE__);
        goto fail;
    }
    e = cudaMalloc((void **)&m->scratch, sizeof(int));
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

/* Rank 0's unique id, made once every member arrived (tide__pool_handshake_make). */
static tide_status make_unique_id(void *ctx, void *payload, size_t len)
{
    (void)len;
    ncclResult_t r = ncclGetUniqueId((ncclUniqueId *)payload);
    if (r != ncclSuccess)
        return nccl_error(r, NULL, "ncclGetUniqueId", __FILE__, __LINE__);
    *(int *)ctx = 1;
    return TIDE_OK;
}

/*
 * ncclGetUniqueId starts NCCL's bootstrap root, a detached thread that ends only once every
 * rank of the id has checked in, or one checks in with another rank count. When rank 0's
 * creation fails after making the id, the others never all come, and it would wait for the
 * life of the process: a one-rank init on the same id ends it either way (it completes the
 * root's job when first to check in, else it is the mismatch), and is then torn down.
 * Keeps the caller's error message.
 */
static void end_bootstrap_root(const ncclUniqueId *id)
{
    char detail[512];
    snprintf(detail, sizeof detail, "%s", tide_last_error());
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0; /* a mismatch leaves it waiting for an answer that never comes */
    ncclComm_t nc = NULL;
    ncclResult_t r = ncclCommInitRankConfig(&nc, 1, *id, 0, &cfg);
    if ((r == ncclSuccess || r == ncclInProgress) &&
        settle(NULL, nc, NULL, tide_now_ns() + 2000ull * 1000000ull) == TIDE_OK)
        ncclCommDestroy(nc);
    else if (nc != NULL)
        ncclCommAbort(nc);
    (void)tide_errorf(TIDE_ERR_BACKEND, "%s", detail); /* the message only: rc stays the caller's */
}

static tide_status nccl_create(tide_coll_pool_t *pool, const tide_coll_comm_params *p,
                               tide_coll_comm_t **out)
{
    tide_coll_comm_t *c = NULL;
    tide_status rc = TIDE_OK;
    TIDE_CHECK(check_version());
    TIDE_CHECK(alloc_comm(pool, p->members, p->n_members, p->tag, p->timeout_ms, &c));
    nccl_comm *m = impl(c);
    ncclUniqueId id;
    memset(&id, 0, sizeof id);
    _Static_assert(sizeof id <= TIDE_COLL_HANDSHAKE_PAYLOAD, "unique id fits the handshake");
    int made = 0; /* rank 0 made the id: NCCL's bootstrap root thread runs */
    ncclComm_t nc = NULL;
    tide__handshake h = {p->members, p->n_members,  p->tag,         p->timeout_ms,
                         p->cancel,  NULL,          make_unique_id, &made};
    TIDE_CHECK_GOTO(tide__pool_handshake_run(pool, &h, &id, sizeof id), rc, fail);
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0; /* so that the wait below can watch the cancel flag and the deadline */
    ncclResult_t r = ncclCommInitRankConfig(&nc, c->size, id, c->rank, &cfg);
    if (r != ncclSuccess && r != ncclInProgress) {
        rc = nccl_error(r, nc, "ncclCommInitRankConfig", __FILE__, __LINE__);
        goto fail_nc;
    }
    uint64_t ms = p->timeout_ms ? p->timeout_ms : TIDE_COLL_DEFAULT_TIMEOUT_MS;
    TIDE_CHECK_GOTO(settle(NULL, nc, p->cancel, tide_now_ns() + ms * 1000000ull), rc, fail_nc);
    m->nc = nc;
    *out = c;
    return TIDE_OK;
fail_nc:
    if (nc != NULL)
        ncclCommAbort(nc);
fail:
    if (made)
        end_bootstrap_root(&id);
    tide__comm_kill(c); /* destroy must not wait on a communicator that never formed */
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
    cfg.blocking = 0; /* the waits below watch the parent's abort flag */
    ncclComm_t nc = NULL;
    /* The whole split, both waits, is bounded by the parent's abort state (its flag, or
       the abort word it watches: libtide's generation word, which an abort of the switch
       sets) and by one deadline, the creation timeout, as tide_coll_comm_new is. */
    uint64_t ms = parent->timeout_ms ? parent->timeout_ms : TIDE_COLL_DEFAULT_TIMEOUT_MS;
    uint64_t deadline = tide_now_ns() + ms * 1000000ull;
    /* Every parent rank calls it, NOCOLOR ones included. */
    ncclResult_t r =
        ncclCommSplit(impl(parent)->nc, color >= 0 ? color : NCCL_SPLIT_NOCOLOR, key, &nc, &cfg);
    if (r != ncclSuccess && r != ncclInProgress) {
        rc = failed(parent, r, "ncclCommSplit");
        goto fail;
    }
    rc = settle(parent, impl(parent)->nc, NULL, deadline);
    if (rc != TIDE_OK) {
        /* the parent is stuck inside the split (a member never came): nothing more can
           run on it, and its destroy must not wait for a flush */
        if (impl(parent)->nc != NULL)
            hard_abort(parent);
        goto fail_nc;
    }
    if (color < 0)
        return TIDE_OK;
    if (nc == NULL)
        TIDE_FAIL_GOTO(rc, fail, TIDE_ERR_BACKEND, "ncclCommSplit gave no communicator");
    TIDE_CHECK_GOTO(settle(parent, nc, NULL, deadline), rc, fail_nc);
    impl(c)->nc = nc;
    int got = -1, count = -1;
    ncclCommUserRank(nc, &got);
    ncclCommCount(nc, &count);
    if (got != c->rank || count != c->size)
        TIDE_FAIL_GOTO(rc, fail, TIDE_ERR_INTERNAL,
                       "ncclCommSplit gave rank %d of %d where tide expected %d of %d", got, count,
                       c->rank, c->size);
    *out = c;
    return TIDE_OK;
fail_nc:
    if (nc != NULL)
        ncclCommAbort(nc);
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
                if (r != ncclSuccess && r != ncclInProgress) {
                    TIDE_WARN(TIDE_COLL_LOG, "NCCL finalize failed; aborting");
                    hard_abort(c);
                } else if (settle(c, m->nc, NULL, tide_now_ns() + 5000ull * 1000000ull) !=
                           TIDE_OK) {
                    /* async_state aborted it on an NCCL error; a timeout is ours to end */
                    TIDE_WARN(TIDE_COLL_LOG, "NCCL finalize did not complete; aborting");
                    if (m->nc != NULL)
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
                               cudaStream_t s)
{
    nccl_comm *m = impl(c);
    NCCL_CHECK(ncclGroupStart(), m->nc);
    for (size_t i = 0; i < n; i++) {
        ncclResult_t r = ops[i].kind == TIDE_P2P_SEND
                             ? ncclSend(ops[i].buf, ops[i].bytes, ncclInt8, ops[i].peer, m->nc, s)
                             : ncclRecv(ops[i].buf, ops[i].bytes, ncclInt8, ops[i].peer, m->nc, s);
        if (r != ncclSuccess && r != ncclInProgress) {
            ncclGroupEnd();
            return failed(c, r, "ncclSend/ncclRecv");
        }
    }
    ncclResult_t r = ncclGroupEnd();
    if (r != ncclSuccess && r != ncclInProgress)
        return failed(c, r, "ncclGroupEnd");
    if (r == ncclInProgress)
        TIDE_CHECK(settle(c, m->nc, NULL, 0));
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
    cudaStream_t s = NULL;
    tide_status rc = pick(stream, &s);
    if (rc == TIDE_OK)
        rc = enqueue_p2p(c, ops, n, s);
    if (rc == TIDE_OK) {
        e = cudaEventRecord(q->ev, s);
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
    return async_state(c, impl(c)->nc, &busy);
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
    cudaStream_t s = NULL;
    TIDE_CHECK(pick(stream, &s));
    return complete(c,
                    ncclAllReduce(send, recv, count, nccl_type(dtype), nccl_op(op), impl(c)->nc, s),
                    "ncclAllReduce", s);
}

static tide_status nccl_broadcast(tide_coll_comm_t *c, void *buf, size_t bytes, int root,
                                  tide_coll_stream_t stream)
{
    cudaStream_t s = NULL;
    TIDE_CHECK(pick(stream, &s));
    return complete(c, ncclBroadcast(buf, buf, bytes, ncclInt8, root, impl(c)->nc, s),
                    "ncclBroadcast", s);
}

static tide_status nccl_allgather(tide_coll_comm_t *c, const void *send, void *recv, size_t bytes,
                                  tide_coll_stream_t stream)
{
    cudaStream_t s = NULL;
    TIDE_CHECK(pick(stream, &s));
    return complete(c, ncclAllGather(send, recv, bytes, ncclInt8, impl(c)->nc, s), "ncclAllGather",
                    s);
}

static tide_status nccl_reduce_scatter(tide_coll_comm_t *c, const void *send, void *recv,
                                       size_t count, tide_dtype dtype, tide_red_op op,
                                       tide_coll_stream_t stream)
{
    cudaStream_t s = NULL;
    TIDE_CHECK(pick(stream, &s));
    return complete(
        c, ncclReduceScatter(send, recv, count, nccl_type(dtype), nccl_op(op), impl(c)->nc, s),
        "ncclReduceScatter", s);
}

static tide_status nccl_barrier(tide_coll_comm_t *c, tide_coll_stream_t stream)
{
    nccl_comm *m = impl(c);
    cudaStream_t s = NULL;
    TIDE_CHECK(pick(stream, &s));
    return complete(c, ncclAllReduce(m->scratch, m->scratch, 1, ncclInt32, ncclSum, m->nc, s),
                    "ncclAllReduce(barrier)", s);
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

static tide_status copy_flat(void *ctx, void *dst, const void *src, size_t bytes)
{
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, (cudaStream_t)ctx));
    return TIDE_OK;
}

static tide_status copy_rect(void *ctx, void *dst, size_t dpitch, const void *src, size_t spitch,
                             size_t width, size_t height)
{
    CUDA_CHECK(cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, height, cudaMemcpyDefault,
                                 (cudaStream_t)ctx));
    return TIDE_OK;
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
    int dev = 0, max_pitch = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&max_pitch, cudaDevAttrMaxPitch, dev));
    cudaStream_t s = NULL;
    TIDE_CHECK(pick(stream, &s));
    static const tide__copy2d_fns fns = {copy_flat, copy_rect};
    return tide__copy2d_split(dst, dpitch, src, spitch, width, height, (size_t)max_pitch, &fns, s);
}

/* Runs the statement with device current on the calling thread, then puts the thread's
   current device back; sets rc. */
#define ON_DEVICE(device, rc, stmt)                                                                \
    do {                                                                                           \
        int tide__prev = -1;                                                                       \
        cudaError_t tide__e = cudaGetDevice(&tide__prev);                                          \
        if (tide__e == cudaSuccess && tide__prev != (device))                                      \
            tide__e = cudaSetDevice(device);                                                       \
        if (tide__e != cudaSuccess) {                                                              \
            (rc) = cuda_error(tide__e, "cudaSetDevice", __FILE__, __LINE__);                       \
            break;                                                                                 \
        }                                                                                          \
        (rc) = (stmt);                                                                             \
        if (tide__prev != (device))                                                                \
            cudaSetDevice(tide__prev);                                                             \
    } while (0)

static tide_status dev_bind(int device)
{
    CUDA_CHECK(cudaSetDevice(device));
    return TIDE_OK;
}

static tide_status dev_alloc_on(int device, size_t bytes, void **out)
{
    tide_status rc = TIDE_OK;
    ON_DEVICE(device, rc, dev_alloc(bytes, out));
    return rc;
}

static tide_status zero_here(void *ptr, size_t bytes)
{
    /* a stream of its own: no wait for the training work on the other streams */
    cudaStream_t s = NULL;
    CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    cudaError_t e = cudaMemsetAsync(ptr, 0, bytes, s);
    if (e == cudaSuccess)
        e = cudaStreamSynchronize(s);
    cudaStreamDestroy(s);
    if (e != cudaSuccess)
        return cuda_error(e, "cudaMemsetAsync", __FILE__, __LINE__);
    return TIDE_OK;
}

static tide_status dev_zero(int device, void *ptr, size_t bytes)
{
    tide_status rc = TIDE_OK;
    ON_DEVICE(device, rc, zero_here(ptr, bytes));
    return rc;
}

static tide_status total_here(uint64_t *bytes)
{
    size_t free_b = 0, total_b = 0;
    CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
    *bytes = (uint64_t)total_b;
    return TIDE_OK;
}

static tide_status dev_mem_total(int device, uint64_t *bytes)
{
    tide_status rc = TIDE_OK;
    ON_DEVICE(device, rc, total_here(bytes));
    return rc;
}

static tide_status dev_check(const void *ptr, size_t bytes, const char *what)
{
    struct cudaPointerAttributes a;
    memset(&a, 0, sizeof a);
    cudaError_t e = cudaPointerGetAttributes(&a, ptr);
    if (e != cudaSuccess) {
        cudaGetLastError(); /* older drivers say "invalid value" for plain host memory */
        a.type = cudaMemoryTypeUnregistered;
    }
    if (a.type != cudaMemoryTypeDevice && a.type != cudaMemoryTypeManaged)
        return tide_errorf(TIDE_ERR_INVALID,
                           "%s (%zu bytes at %p) is host memory, but the nccl backend moves "
                           "device memory: allocate it with cudaMalloc or tide_alloc_buffers",
                           what, bytes, ptr);
    int dev = -1;
    if (a.type == cudaMemoryTypeDevice && cudaGetDevice(&dev) == cudaSuccess && a.device != dev)
        return tide_errorf(TIDE_ERR_INVALID,
                           "%s (%zu bytes at %p) is memory of GPU %d, but this thread's device "
                           "is GPU %d: allocate it on the rank's device (tide_device)",
                           what, bytes, ptr, a.device, dev);
    return TIDE_OK;
}

static tide_status stream_low_here(tide_coll_stream_t *out)
{
    int least = 0, greatest = 0;
    CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    cudaStream_t s = NULL;
    /* "least" is the lowest priority. On NVIDIA GPUs it is 0, the default stream's too: the
       scheduler prefers libtide's own streams (the greatest, own_stream_here) to it */
    CUDA_CHECK(cudaStreamCreateWithPriority(&s, cudaStreamNonBlocking, least));
    *out = s;
    return TIDE_OK;
}

static tide_status dev_stream_new_low(int device, tide_coll_stream_t *out)
{
    tide_status rc = TIDE_OK;
    ON_DEVICE(device, rc, stream_low_here(out));
    return rc;
}

static void dev_stream_free(tide_coll_stream_t stream)
{
    if (stream != NULL)
        cudaStreamDestroy((cudaStream_t)stream);
}

static tide_status dev_copy_host(void *dst, const void *src, size_t bytes, int to_host,
                                 tide_coll_stream_t stream)
{
    if (bytes == 0)
        return TIDE_OK;
    cudaStream_t s = NULL;
    TIDE_CHECK(pick(stream, &s));
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes,
                               to_host ? cudaMemcpyDeviceToHost : cudaMemcpyHostToDevice, s));
    CUDA_CHECK(cudaStreamSynchronize(s));
    return TIDE_OK;
}

static tide_status dev_sync(tide_coll_comm_t *c, tide_coll_stream_t stream)
{
    cudaStream_t s = NULL;
    TIDE_CHECK(pick(stream, &s));
    if (c == NULL) {
        CUDA_CHECK(cudaStreamSynchronize(s));
        return TIDE_OK;
    }
    if (tide__comm_is_aborted(c))
        return aborted_error(c);
    CUDA_CHECK(cudaEventRecord(impl(c)->ev, s));
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
    .device_bind = dev_bind,
    .mem_alloc_on = dev_alloc_on,
    .mem_zero = dev_zero,
    .mem_check = dev_check,
    .stream_new_low = dev_stream_new_low,
    .stream_free = dev_stream_free,
    .host_alloc = pinned_alloc,
    .host_free = pinned_free,
    .mem_total = dev_mem_total,
};
