/*
 * test_nccl_streams: the nccl backend's stream rules and its NCCL version check, with no
 * GPU. The CUDA runtime calls those paths make are defined here, a stand-in that records
 * them (tide_collectives is a static library, so its references bind to these definitions
 * rather than libcudart's), with a device whose priorities range from 0 (least) to -5
 * (greatest), as an H200's do.
 *   - an offline task's stream (tide_coll_stream_new_low, what worker/task.c hands a task
 *     in tide_task_env.stream): the device's least priority, non-blocking, made on the
 *     device asked for, the thread's current device left as it was;
 *   - libtide's own work (a NULL stream): never the default stream but a non-blocking
 *     stream of the thread's own, of the greatest priority, which first waits for what
 *     the legacy default stream holds (an event recorded there); the same stream for the
 *     same thread and device (so that a copy and the sync after it agree), another for
 *     another thread or device; a stream the caller names is used as given;
 *   - the version check: NCCL 2.18 and newer pass; older fail naming the version (both
 *     encodings of NCCL_VERSION_CODE) and the library's file.
 */
#include <criterion/criterion.h>
#include <cuda_runtime_api.h>
#include <pthread.h>
#include <string.h>

#include "collectives/collectives_int.h"

/* ---- the stand-in ------------------------------------------------------------------------ */

#define LEAST    0
#define GREATEST (-5)

struct CUstream_st {
    unsigned flags;
    int priority;
    int device;
};
struct CUevent_st {
    cudaStream_t recorded_on;
};

static __thread int g_device; /* the calling thread's current device */
static cudaStream_t g_copy_on, g_synced, g_waiter;
static cudaEvent_t g_waited;
static int g_wait_after_record; /* the last wait was for an event recorded on legacy */

cudaError_t cudaGetDevice(int *device)
{
    *device = g_device;
    return cudaSuccess;
}

cudaError_t cudaSetDevice(int device)
{
    g_device = device;
    return cudaSuccess;
}

cudaError_t cudaDeviceGetStreamPriorityRange(int *least, int *greatest)
{
    *least = LEAST;
    *greatest = GREATEST;
    return cudaSuccess;
}

cudaError_t cudaStreamCreateWithPriority(cudaStream_t *s, unsigned int flags, int priority)
{
    *s = calloc(1, sizeof **s);
    (*s)->flags = flags;
    (*s)->priority = priority;
    (*s)->device = g_device;
    return cudaSuccess;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned int flags)
{
    return cudaStreamCreateWithPriority(s, flags, LEAST);
}

cudaError_t cudaStreamDestroy(cudaStream_t s)
{
    free(s);
    return cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned int flags)
{
    (void)flags;
    *e = calloc(1, sizeof **e);
    return cudaSuccess;
}

cudaError_t cudaEventDestroy(cudaEvent_t e)
{
    free(e);
    return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s)
{
    e->recorded_on = s;
    return cudaSuccess;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned int flags)
{
    (void)flags;
    g_waiter = s;
    g_waited = e;
    g_wait_after_record = e->recorded_on == cudaStreamLegacy;
    return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind,
                            cudaStream_t s)
{
    (void)kind;
    memcpy(dst, src, n);
    g_copy_on = s;
    return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t s)
{
    g_synced = s;
    return cudaSuccess;
}

const char *cudaGetErrorString(cudaError_t e)
{
    (void)e;
    return "stand-in error";
}

/* ---- the tests ------------------------------------------------------------------------- */

static const tide_coll_backend_v1 *nccl(void)
{
    const tide_coll_backend_v1 *be = NULL;
    cr_assert_eq(tide_coll_backend_find("nccl", &be), TIDE_OK);
    return be;
}

Test(nccl_streams, offline_task_stream_has_the_least_priority)
{
    g_device = 1;
    tide_coll_stream_t s = NULL;
    cr_assert_eq(tide_coll_stream_new_low(nccl(), 3, &s), TIDE_OK);
    struct CUstream_st *st = s;
    cr_assert_not_null(st);
    cr_expect_eq(st->priority, LEAST, "a task's stream has priority %d, not the least (%d)",
                 st->priority, LEAST);
    cr_expect_eq(st->flags, cudaStreamNonBlocking);
    cr_expect_eq(st->device, 3, "made on device %d, not the one asked for", st->device);
    cr_expect_eq(g_device, 1, "the thread's device changed to %d", g_device);
    tide_coll_stream_free(nccl(), s);
}

Test(nccl_streams, own_work_never_runs_on_the_default_stream)
{
    g_device = 0;
    char a[8] = "abcdefg", b[8] = "";
    g_copy_on = NULL;
    cr_assert_eq(nccl()->copy_host(b, a, sizeof a, 1, NULL), TIDE_OK);
    cr_expect_str_eq(b, "abcdefg");
    cudaStream_t s = g_copy_on;
    cr_assert(s != NULL && s != cudaStreamLegacy && s != cudaStreamPerThread,
              "a NULL stream ran on a default stream (%p)", (void *)s);
    cr_expect_eq(s->flags, cudaStreamNonBlocking);
    cr_expect_eq(s->priority, GREATEST, "libtide's stream has priority %d, not the greatest (%d)",
                 s->priority, GREATEST);
    cr_expect(g_waiter == s && g_wait_after_record,
              "the stream did not first wait for the legacy default stream's work");
    cr_expect_eq(g_synced, s, "the copy was synchronised on another stream");
    /* the same thread and device: the same stream, so that a sync covers the copy */
    g_synced = NULL;
    cr_assert_eq(nccl()->stream_sync(NULL, NULL), TIDE_OK);
    cr_expect_eq(g_synced, s, "stream_sync(NULL) waited on another stream than the copy's");
    /* another device of the thread: another stream */
    g_device = 2;
    cr_assert_eq(nccl()->copy_host(b, a, sizeof a, 1, NULL), TIDE_OK);
    cr_expect(g_copy_on != s && g_copy_on->device == 2, "device 2 shares device 0's stream");
    /* a stream the caller names is used as given, with no added wait */
    struct CUstream_st mine = {cudaStreamNonBlocking, LEAST, 2};
    g_waiter = NULL;
    cr_assert_eq(nccl()->copy_host(b, a, sizeof a, 0, &mine), TIDE_OK);
    cr_expect_eq(g_copy_on, &mine);
    cr_expect_null(g_waiter);
}

static void *copy_once(void *arg)
{
    char a[4] = "xyz", b[4];
    g_device = 0;
    *(tide_status *)arg = nccl()->copy_host(b, a, sizeof a, 1, NULL);
    return g_copy_on;
}

Test(nccl_streams, each_thread_has_its_own_stream)
{
    g_device = 0;
    char a[4] = "xyz", b[4];
    cr_assert_eq(nccl()->copy_host(b, a, sizeof a, 1, NULL), TIDE_OK);
    cudaStream_t mine = g_copy_on;
    pthread_t th;
    tide_status rc = TIDE_ERR_INTERNAL;
    void *theirs = NULL;
    cr_assert_eq(pthread_create(&th, NULL, copy_once, &rc), 0);
    pthread_join(th, &theirs);
    cr_assert_eq(rc, TIDE_OK);
    cr_expect(theirs != NULL && theirs != (void *)mine,
              "two threads share one stream: one's collective could wait behind the other's");
}

Test(nccl_streams, version_check)
{
    cr_expect_eq(tide__nccl_version_check(22809, "/x/libnccl.so.2"), TIDE_OK);
    cr_expect_eq(tide__nccl_version_check(21800, "/x/libnccl.so.2"), TIDE_OK);
    cr_expect_eq(tide__nccl_version_check(21703, "/x/libnccl.so.2"), TIDE_ERR_UNSUPPORTED);
    cr_expect(strstr(tide_last_error(), "NCCL 2.17.3 is loaded (/x/libnccl.so.2)") != NULL &&
                  strstr(tide_last_error(), "2.18 or newer") != NULL,
              "message: %s", tide_last_error());
    cr_expect_eq(tide__nccl_version_check(2708, "/y/libnccl.so.2"), TIDE_ERR_UNSUPPORTED);
    cr_expect(strstr(tide_last_error(), "NCCL 2.7.8 is loaded (/y/libnccl.so.2)") != NULL,
              "message: %s", tide_last_error());
}
