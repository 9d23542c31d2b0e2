/*
 * MPI integration test of libtide with the real tided (6 ranks, host memory). Rank 0
 * starts tided (argv[1]) on a free loopback port with a temporary state file; every
 * rank joins a toy job whose tensors hold known values (a pure function of tensor,
 * element and steps completed) under (dp 2, tp 1, pp 2). A controller thread on rank 0
 * sends `resize` like tidectl while steps run: -> (dp 1, tp 2, pp 3) on all 6 ranks ->
 * (dp 2, tp 1, pp 1) (4 ranks go idle) -> (dp 1, tp 2, pp 2) (idle ranks come back).
 * Checked: at each switch every rank's old shards (before) and new shards (after)
 * equal the expected full state at the switch step bit for bit, so the full state is
 * bit-identical across the reshard; every participant switched at the same step; each
 * step ran exactly once on every member of the layout active then (none lost or
 * repeated); the "step" and cursor tensors moved with the job.
 *
 * Device binding: the job runs on "rec", a recording wrapper of the mpi backend that
 * plays a device backend's per-thread rule (CUDA's current device is per thread). Its
 * device_bind records the device on the calling thread; every member that allocates,
 * copies or communicates counts a violation when its thread has not bound the rank's
 * device (tide_device, the rank's index on the host). A tide_prepare_fn allocates the
 * next layout's buffers with tide_alloc_buffers on libtide's preparation thread, and the
 * switches move into them: the test fails if any thread libtide starts touches the
 * backend before binding, as the preparation thread once did. After the third
 * generation every rank gives its buffers to the runtime (tide_give_buffers) and the
 * last two switches rebuild them in place (tide_reshard(t, NULL)), the preparation
 * thread reserving pool memory for them (it must allocate there, bound). Every member
 * the mpi table has, and the device ones a device backend adds (mem_alloc_on, mem_zero),
 * is checked but comm_abort and p2p_direct (any thread, never the device, by contract),
 * on every communicator too: they dispatch through the table they were made with.
 *
 * Communicators at once: the recording backend counts the communicators alive in the
 * process (created or split, not yet destroyed). A switch holds at most the old
 * layout's four groups and the new layout's four (the switch communicator is released
 * once the new all is split off it): every rank's peak must be <= 8, and a rank that is
 * a member of both layouts of some switch reaches it exactly.
 *
 * The runtime's memory calls (tide_mem_alloc, tide_mem_copy, tide_copy_to/from_host) go
 * through the recording backend too, and refuse memory its mem_check says is of another
 * kind. So do the places where the program's buffers enter libtide: tide_set_buffers after
 * the join, and tide_reshard before the first switch (a member's missing table too, and a
 * table passed once the runtime owns the buffers), with TIDE_ERR_INVALID naming the call,
 * the tensor and the backend's reason; a refused tide_reshard leaves its switch pending
 * and the same switch then runs with the right buffers.
 */
#include <mpi.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zmq.h>

#include <tide/tide.h>

#include "collectives/collectives.h" /* a recording wrapper of the mpi backend */
#include "core/clock.h"
#include "core/error.h"
#include "mpi_test.h"
#include "proto/proto.h"
#include "tests/support/scenario.h"

#define LAYERS    6
#define MAX_STEPS 4000
#define MAX_GEN   8
#define JOB       "wtest"

/* The scenario (tests/scenarios/test_worker_mpi.h): the generic columns, then the
   generation after whose switch the runtime owns every rank's buffers. */
typedef struct worker_row {
    mt_row r;
    int give;
} worker_row;

static const worker_row scenarios[] = {
#define ROW(name, ranks, timeout, labels, mpi, first, resizes, kill, ckpt, gen, status, ...)       \
    {{name, ranks, timeout, labels, mpi, first, resizes, kill, ckpt, gen, status}, __VA_ARGS__},
#include "scenarios/test_worker_mpi.h"
#undef ROW
};

static mt_layout g_gen[MAX_GEN]; /* generation g + 1's layout: the first, then the resizes */
static int g_n_gens;             /* the generation the job ends in */
static int g_give;               /* after the switch to it, the runtime owns the buffers */
/* The most communicators a rank holds during a switch: the old layout's all/tp/dp/pp and
   the new layout's (what tide__build_groups promises). */
#define COMM_BOUND 8

/* ---- the recording backend ----------------------------------------------------------- */

static tide_coll_backend_v1 rec;          /* the mpi table with the members below */
static const tide_coll_backend_v1 *under; /* the mpi backend */
static _Thread_local int bound = -1;      /* this thread's "current device" */
static int want_dev = -1;                 /* the first device bound in this process */
static int n_violations, n_bound_threads, n_checked;
static _Thread_local int is_main; /* 1 on the program's main thread */
static int owned_phase;           /* the runtime owns the buffers, no prepare fn is set */
static int n_reserve_allocs;      /* owned phase: allocations on libtide's own threads */
static int n_live, n_peak;        /* communicators alive in this process, and the most */
static int n_comm_ops;            /* operations on communicators the wrapper saw */

static void rec_check(const char *what)
{
    __atomic_add_fetch(&n_checked, 1, __ATOMIC_RELAXED);
    int w = __atomic_load_n(&want_dev, __ATOMIC_RELAXED);
    if (bound >= 0 && bound == w)
        return;
    if (__atomic_add_fetch(&n_violations, 1, __ATOMIC_RELAXED) <= 5)
        fprintf(stderr, "rec backend: %s on a thread bound to device %d (the rank's is %d)\n", what,
                bound, w);
}

static tide_status rec_bind(int device)
{
    int none = -1;
    __atomic_compare_exchange_n(&want_dev, &none, device, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED);
    if (bound < 0)
        __atomic_add_fetch(&n_bound_threads, 1, __ATOMIC_RELAXED);
    bound = device;
    return TIDE_OK;
}

/* A communicator came into being: counts it and keeps the peak. */
static void rec_born(void)
{
    int live = __atomic_add_fetch(&n_live, 1, __ATOMIC_RELAXED);
    int peak = __atomic_load_n(&n_peak, __ATOMIC_RELAXED);
    while (live > peak && !__atomic_compare_exchange_n(&n_peak, &peak, live, 0, __ATOMIC_RELAXED,
                                                       __ATOMIC_RELAXED))
        ;
}

static tide_status rec_create(tide_coll_pool_t *pool, const tide_coll_comm_params *p,
                              tide_coll_comm_t **out)
{
    rec_check("comm_create");
    tide_status rc = under->comm_create(pool, p, out);
    if (rc == TIDE_OK && *out != NULL)
        rec_born();
    return rc;
}

static tide_status rec_split(tide_coll_comm_t *parent, int color, int key, const int *members,
                             int n, tide_coll_comm_t **out)
{
    rec_check("comm_split");
    tide_status rc = under->comm_split(parent, color, key, members, n, out);
    if (rc == TIDE_OK && *out != NULL)
        rec_born();
    return rc;
}

static void rec_destroy(tide_coll_comm_t *c)
{
    rec_check("comm_destroy");
    __atomic_sub_fetch(&n_live, 1, __ATOMIC_RELAXED);
    under->comm_destroy(c);
}

static tide_status rec_req_test(tide_coll_comm_t *c, tide_coll_req_t *req, int *done)
{
    rec_check("req_test");
    return under->req_test(c, req, done);
}

static tide_status rec_req_wait(tide_coll_comm_t *c, tide_coll_req_t *req)
{
    rec_check("req_wait");
    return under->req_wait(c, req);
}

static void rec_req_free(tide_coll_comm_t *c, tide_coll_req_t *req)
{
    rec_check("req_free");
    under->req_free(c, req);
}

static tide_status rec_broadcast(tide_coll_comm_t *c, void *buf, size_t bytes, int root,
                                 tide_coll_stream_t s)
{
    rec_check("broadcast");
    return under->broadcast(c, buf, bytes, root, s);
}

static tide_status rec_reduce_scatter(tide_coll_comm_t *c, const void *send, void *recv,
                                      size_t count, tide_dtype dt, tide_red_op op,
                                      tide_coll_stream_t s)
{
    rec_check("reduce_scatter");
    return under->reduce_scatter(c, send, recv, count, dt, op, s);
}

static uint64_t rec_direct_bytes(const tide_coll_comm_t *c)
{
    rec_check("direct_bytes");
    return under->direct_bytes(c);
}

static void rec_free(void *ptr)
{
    rec_check("mem_free");
    under->mem_free(ptr);
}

/* Memory the "device" refuses as not its kind (as nccl refuses host memory): what the
   program's tide_mem_copy and tide_copy_*, tide_set_buffers and tide_reshard must refuse
   before using it. Larger than any shard of the toy job, so that a check that is missing
   shows as a call that succeeds, not as memory overwritten. */
static unsigned char foreign[4096];

static tide_status rec_mem_check(const void *ptr, size_t bytes, const char *what)
{
    rec_check("mem_check");
    const unsigned char *p = ptr;
    if (p + bytes > foreign && p < foreign + sizeof foreign)
        return tide_errorf(TIDE_ERR_INVALID,
                           "%s (%zu bytes at %p) is host memory, but the rec backend moves device "
                           "memory",
                           what, bytes, ptr);
    return under->mem_check(ptr, bytes, what);
}

static tide_status rec_p2p_start(tide_coll_comm_t *c, const tide_p2p_op *ops,
                                 const tide_p2p_peer *peers, size_t n, tide_coll_stream_t s,
                                 tide_coll_req_t **out)
{
    rec_check("p2p_start");
    __atomic_add_fetch(&n_comm_ops, 1, __ATOMIC_RELAXED);
    return under->p2p_start(c, ops, peers, n, s, out);
}

static tide_status rec_allreduce(tide_coll_comm_t *c, const void *send, void *recv, size_t count,
                                 tide_dtype dt, tide_red_op op, tide_coll_stream_t s)
{
    rec_check("allreduce");
    __atomic_add_fetch(&n_comm_ops, 1, __ATOMIC_RELAXED);
    return under->allreduce(c, send, recv, count, dt, op, s);
}

static tide_status rec_allgather(tide_coll_comm_t *c, const void *send, void *recv, size_t bytes,
                                 tide_coll_stream_t s)
{
    rec_check("allgather");
    __atomic_add_fetch(&n_comm_ops, 1, __ATOMIC_RELAXED);
    return under->allgather(c, send, recv, bytes, s);
}

static tide_status rec_barrier(tide_coll_comm_t *c, tide_coll_stream_t s)
{
    rec_check("barrier");
    __atomic_add_fetch(&n_comm_ops, 1, __ATOMIC_RELAXED);
    return under->barrier(c, s);
}

static tide_status rec_alloc(size_t bytes, void **out)
{
    rec_check("mem_alloc");
    return under->mem_alloc(bytes, out);
}

static tide_status rec_alloc_on(int device, size_t bytes, void **out)
{
    rec_check("mem_alloc_on");
    if (!is_main && __atomic_load_n(&owned_phase, __ATOMIC_RELAXED))
        __atomic_add_fetch(&n_reserve_allocs, 1, __ATOMIC_RELAXED);
    if (device != __atomic_load_n(&want_dev, __ATOMIC_RELAXED))
        rec_check("mem_alloc_on another device");
    return under->mem_alloc(bytes, out);
}

static tide_status rec_zero(int device, void *ptr, size_t bytes)
{
    rec_check("mem_zero");
    (void)device;
    memset(ptr, 0, bytes);
    return TIDE_OK;
}

static tide_status rec_copy2d(void *dst, size_t dp, const void *src, size_t sp, size_t w, size_t h,
                              tide_coll_stream_t s)
{
    rec_check("copy2d");
    return under->copy2d(dst, dp, src, sp, w, h, s);
}

static tide_status rec_copy_host(void *dst, const void *src, size_t bytes, int to_host,
                                 tide_coll_stream_t s)
{
    rec_check("copy_host");
    return under->copy_host(dst, src, bytes, to_host, s);
}

static tide_status rec_sync(tide_coll_comm_t *c, tide_coll_stream_t s)
{
    rec_check("stream_sync");
    return under->stream_sync(c, s);
}

static void rec_register(void)
{
    MT_OK(tide_coll_backend_find("mpi", &under));
    rec = *under;
    rec.name = "rec";
    rec.device_bind = rec_bind;
    rec.comm_create = rec_create;
    rec.comm_split = rec_split;
    rec.comm_destroy = rec_destroy;
    rec.p2p_start = rec_p2p_start;
    rec.req_test = rec_req_test;
    rec.req_wait = rec_req_wait;
    rec.req_free = rec_req_free;
    rec.allreduce = rec_allreduce;
    rec.broadcast = rec_broadcast;
    rec.allgather = rec_allgather;
    rec.reduce_scatter = rec_reduce_scatter;
    rec.barrier = rec_barrier;
    rec.direct_bytes = rec_direct_bytes;
    rec.mem_check = rec_mem_check;
    rec.mem_free = rec_free;
    rec.mem_alloc = rec_alloc;
    rec.mem_alloc_on = rec_alloc_on;
    rec.mem_zero = rec_zero;
    rec.copy2d = rec_copy2d;
    rec.copy_host = rec_copy_host;
    rec.stream_sync = rec_sync;
    MT_OK(tide_coll_backend_register(&rec));
}

/* The runtime's memory calls (tide.h, "memory of the runtime's kind") on the backend in
   use: a round trip host -> backend -> backend -> host, and the refusals. */
static void check_memory_calls(const tide_t *t)
{
    MT_ASSERT(strcmp(tide_backend_name(t), "rec") == 0, "backend name '%s', want rec",
              tide_backend_name(t));
    MT_ASSERT(tide_buffer_kind(t) == TIDE_MEM_HOST, "rec keeps host memory");
    MT_ASSERT(strcmp(tide_backend_name(NULL), "") == 0 && tide_buffer_kind(NULL) == TIDE_MEM_HOST,
              "NULL runtime: empty name, host kind");
    enum { N = 4096 };
    unsigned char in[N], out[N];
    for (int i = 0; i < N; i++)
        in[i] = (unsigned char)(i * 7 + 3);
    memset(out, 0, sizeof out);
    void *a = NULL, *b = NULL;
    MT_OK(tide_mem_alloc(t, N, &a));
    MT_OK(tide_mem_alloc(t, N, &b));
    MT_OK(tide_copy_from_host(t, a, in, N));
    MT_OK(tide_mem_copy(t, b, a, N));
    MT_OK(tide_copy_to_host(t, out, b, N));
    MT_ASSERT(memcmp(in, out, N) == 0, "host -> backend -> backend -> host changed the bytes");
    MT_OK(tide_mem_copy(t, b, NULL, 0)); /* 0 bytes: nothing to copy, nothing to check */
    tide_status rc = tide_mem_copy(t, b, NULL, 8);
    MT_ASSERT(rc == TIDE_ERR_INVALID && strstr(tide_last_error(), "NULL source") != NULL,
              "NULL source: %s (%s)", tide_status_name(rc), tide_last_error());
    rc = tide_mem_copy(t, foreign, a, sizeof foreign);
    MT_ASSERT(rc == TIDE_ERR_INVALID && strstr(tide_last_error(), "the destination") != NULL,
              "memory of another kind as the destination: %s (%s)", tide_status_name(rc),
              tide_last_error());
    rc = tide_copy_to_host(t, out, foreign, sizeof foreign);
    MT_ASSERT(rc == TIDE_ERR_INVALID && strstr(tide_last_error(), "the source") != NULL,
              "memory of another kind as the source: %s (%s)", tide_status_name(rc),
              tide_last_error());
    MT_OK(tide_copy_to_host(t, foreign, a, sizeof foreign)); /* the host side is not checked */
    rc = tide_copy_from_host(NULL, a, in, 8);
    MT_ASSERT(rc == TIDE_ERR_INVALID, "NULL runtime: %s", tide_status_name(rc));
    MT_ASSERT(tide_mem_alloc(t, 8, NULL) == TIDE_ERR_INVALID, "NULL out refused");
    tide_mem_free(t, a);
    tide_mem_free(t, b);
    tide_mem_free(t, NULL);
}

/* ---- buffers of the wrong kind where they enter libtide ---------------------------------- */

/* The first tensor a rank holds bytes of under view v (the view's rank must be a member). */
static size_t first_held(const tide_collection_t *c, const tide_view *v)
{
    for (size_t i = 0; i < tide_collection_size(c); i++)
        if (tide_shard_bytes(v->layout, c, i, v->pp_rank, v->dp_rank, v->tp_rank) > 0)
            return i;
    MT_ASSERT(0, "a member holds no tensor");
    return 0;
}

/* A copy of the n-entry table bufs with entry i replaced by memory of another kind. */
static void **with_foreign(void *const *bufs, size_t n, size_t i)
{
    void **b = malloc(n * sizeof *b);
    memcpy(b, bufs, n * sizeof *b);
    b[i] = foreign;
    return b;
}

/* who must have refused a buffer of tensor `tensor` of another kind, saying who, which
   tensor and why (the backend's reason). */
static void expect_refused(tide_status rc, const char *who, const char *tensor)
{
    MT_ASSERT(rc == TIDE_ERR_INVALID, "%s took memory of another kind for tensor %s: %s", who,
              tensor, tide_status_name(rc));
    char want[200];
    snprintf(want, sizeof want, "%s: tensor %s (", who, tensor);
    const char *e = tide_last_error();
    MT_ASSERT(strstr(e, want) != NULL &&
                  strstr(e, "is host memory, but the rec backend moves device memory") != NULL,
              "%s: the refusal does not say what and why: %s", who, e);
}

/* Before the switch to nv's generation runs: tide_reshard refuses a member's missing
   table and a table holding memory of another kind before anything starts, and the switch
   stays pending for the call with the right buffers. */
static void check_reshard_refusals(tide_t *t, const tide_collection_t *c, const tide_view *nv,
                                   void **nb)
{
    if (!nv->member)
        return; /* a rank that leaves passes no buffers */
    uint64_t g = nv->generation;
    tide_status rc = tide_reshard(t, NULL, NULL);
    MT_ASSERT(rc == TIDE_ERR_INVALID && strstr(tide_last_error(), "pass its new buffers") != NULL,
              "a member's tide_reshard without buffers: %s (%s)", tide_status_name(rc),
              tide_last_error());
    size_t i = first_held(c, nv);
    void **bad = with_foreign(nb, tide_collection_size(c), i);
    expect_refused(tide_reshard(t, bad, NULL), "tide_reshard", tide_collection_tensor(c, i)->name);
    free(bad);
    MT_ASSERT(tide_view_next(t) == nv && nv->generation == g && tide_view_get(t)->generation < g,
              "a refused tide_reshard must leave the switch to generation %llu pending",
              (unsigned long long)g);
}

/* The program's preparation (tide_set_prepare): the next layout's buffers, allocated on
   libtide's preparation thread. */
typedef struct prepared {
    pthread_mutex_t mu;
    tide_t *t;
    uint64_t gen;
    void **bufs;
    int used; /* switches that moved into prepared buffers */
} prepared;

static tide_status prepare(void *ctx, const tide_view *pending)
{
    prepared *p = ctx;
    void **b = NULL;
    tide_status rc = tide_alloc_buffers(p->t, pending, &b);
    if (rc != TIDE_OK)
        return rc;
    pthread_mutex_lock(&p->mu);
    tide_free_buffers(p->t, &p->bufs); /* an aborted generation's */
    p->bufs = b;
    p->gen = pending->generation;
    pthread_mutex_unlock(&p->mu);
    return TIDE_OK;
}

/* ---- the toy state --------------------------------------------------------------------- */

static tide_collection_t *make_collection(void)
{
    tide_collection_t *c = NULL;
    MT_OK(tide_collection_new(&c, LAYERS));
    tide_tensor_desc d;
#define ADD(nm, dt, nd, s0, s1, ly, tpr, tdim, seg, dpr)                                           \
    do {                                                                                           \
        memset(&d, 0, sizeof d);                                                                   \
        snprintf(d.name, sizeof d.name, "%s", nm);                                                 \
        d.dtype = dt;                                                                              \
        d.ndim = nd;                                                                               \
        d.shape[0] = s0;                                                                           \
        d.shape[1] = s1;                                                                           \
        d.layer = ly;                                                                              \
        d.tp = tpr;                                                                                \
        d.tp_dim = tdim;                                                                           \
        d.tp_segments = seg;                                                                       \
        d.dp = dpr;                                                                                \
        MT_OK(tide_collection_add(c, &d));                                                         \
    } while (0)
    ADD("embed", TIDE_F32, 2, 12, 8, TIDE_LAYER_PRE, TIDE_TP_SPLIT, 0, 1, TIDE_DP_REPLICATED);
    for (int i = 0; i < LAYERS; i++) {
        char n[64];
        snprintf(n, sizeof n, "layer.%d.qkv", i);
        ADD(n, TIDE_F32, 2, 24, 8, i, TIDE_TP_SPLIT, 0, 3, TIDE_DP_REPLICATED);
        snprintf(n, sizeof n, "layer.%d.fc2", i);
        ADD(n, TIDE_F32, 2, 8, 16, i, TIDE_TP_SPLIT, 1, 1, TIDE_DP_REPLICATED);
        snprintf(n, sizeof n, "layer.%d.bias", i);
        ADD(n, TIDE_F32, 1, 8, 0, i, TIDE_TP_REPLICATED, 0, 1, TIDE_DP_REPLICATED);
        snprintf(n, sizeof n, "layer.%d.qkv.exp_avg", i);
        ADD(n, TIDE_F32, 2, 24, 8, i, TIDE_TP_SPLIT, 0, 3, TIDE_DP_SHARDED);
    }
    ADD("head", TIDE_F32, 2, 12, 8, TIDE_LAYER_POST, TIDE_TP_SPLIT, 0, 1, TIDE_DP_REPLICATED);
    ADD("step", TIDE_I64, 1, 1, 0, TIDE_LAYER_ALL, TIDE_TP_REPLICATED, 0, 1, TIDE_DP_REPLICATED);
    ADD("cursor", TIDE_I64, 1, 2, 0, TIDE_LAYER_ALL, TIDE_TP_REPLICATED, 0, 1, TIDE_DP_REPLICATED);
#undef ADD
    return c;
}

static uint64_t rng_of(int64_t s)
{
    uint64_t x = (uint64_t)s * 0x9E3779B97F4A7C15ull + 0x1234567ull;
    x ^= x >> 29;
    return x * 0xBF58476D1CE4E5B9ull;
}

/* The full tensor i after s completed steps, into a malloc'd buffer. */
static void *expected_full(const tide_collection_t *c, size_t i, int64_t s)
{
    const tide_tensor_desc *d = tide_collection_tensor(c, i);
    uint64_t bytes = tide_tensor_bytes(d);
    void *b = malloc(bytes);
    size_t n = bytes / tide_dtype_size(d->dtype);
    if (d->dtype == TIDE_F32) {
        float *f = b;
        for (size_t k = 0; k < n; k++)
            f[k] = (float)((i * 131 + k * 7) % 1000) + (float)(s * (s + 1) / 2);
    } else if (strcmp(d->name, "step") == 0) {
        ((int64_t *)b)[0] = s;
    } else {
        ((int64_t *)b)[0] = s * 32;
        ((int64_t *)b)[1] = (int64_t)rng_of(s);
    }
    return b;
}

/* Asserts that bufs hold worker (p, d, t)'s shards of the state after s steps. */
static void check_shards(const tide_collection_t *c, const tide_layout_t *l, int p, int d, int t,
                         void *const *bufs, int64_t s, const char *when)
{
    for (size_t i = 0; i < tide_collection_size(c); i++) {
        uint64_t n = tide_shard_bytes(l, c, i, p, d, t);
        if (n == 0)
            continue;
        void *full = expected_full(c, i, s);
        void *want = malloc(n);
        tide_shard_extract(l, c, i, p, d, t, full, want);
        MT_ASSERT(bufs[i] != NULL && memcmp(want, bufs[i], n) == 0,
                  "%s: tensor %s (%llu bytes) at (%d,%d,%d) differs from the state after %lld "
                  "steps",
                  when, tide_collection_tensor(c, i)->name, (unsigned long long)n, p, d, t,
                  (long long)s);
        free(want);
        free(full);
    }
}

/* One training step on the local shards: step s -> s + 1. */
static void apply_step(const tide_collection_t *c, void *const *bufs, const tide_view *v, int64_t s)
{
    for (size_t i = 0; i < tide_collection_size(c); i++) {
        uint64_t n = tide_shard_bytes(v->layout, c, i, v->pp_rank, v->dp_rank, v->tp_rank);
        if (n == 0)
            continue;
        const tide_tensor_desc *d = tide_collection_tensor(c, i);
        if (d->dtype == TIDE_F32) {
            float *f = bufs[i];
            for (size_t k = 0; k < n / 4; k++)
                f[k] += (float)(s + 1);
        } else if (strcmp(d->name, "step") == 0) {
            MT_ASSERT(((int64_t *)bufs[i])[0] == s, "step tensor %lld at step %lld",
                      (long long)((int64_t *)bufs[i])[0], (long long)s);
            ((int64_t *)bufs[i])[0] = s + 1;
        } else {
            ((int64_t *)bufs[i])[0] += 32;
            ((int64_t *)bufs[i])[1] = (int64_t)rng_of(s + 1);
        }
    }
}

/* ---- tided and the controller (rank 0) ---------------------------------------------------- */

static pid_t tided_pid;
static char tmpdir[256];

static void start_tided(const char *exe)
{
    snprintf(tmpdir, sizeof tmpdir, "/tmp/tide-wtest-XXXXXX");
    if (mkdtemp(tmpdir) == NULL) {
        perror("mkdtemp");
        exit(1);
    }
    char state[300], epf[300];
    snprintf(state, sizeof state, "%s/state.db", tmpdir);
    snprintf(epf, sizeof epf, "%s/endpoint", tmpdir);
    tided_pid = fork();
    if (tided_pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL); /* never outlive the test */
        execl(exe, exe, "--endpoint", "tcp://127.0.0.1:*", "--endpoint-file", epf, "--state", state,
              "--heartbeat-ms", "100", "--miss-limit", "100", "--sync-full=0",
              "--resize-timeout-ms", "60000", (char *)NULL);
        perror("exec tided");
        _exit(127);
    }
}

static void stop_tided(void)
{
    if (tided_pid > 0) {
        kill(tided_pid, SIGTERM);
        int st;
        waitpid(tided_pid, &st, 0);
        tided_pid = 0;
    }
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    if (tmpdir[0] != '\0' && system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", tmpdir);
}

typedef struct ctl_state {
    char endpoint[256];
    volatile int error;
    char why[1200];
    volatile int sent;
} ctl_state;

static int request(void *sock, const tide_msg_t *req, tide_msg_t *rep)
{
    tide_proto_buf_t b;
    tide_proto_buf_init(&b);
    if (tide_proto_encode(req, &b) != TIDE_OK)
        return -1;
    zmq_send(sock, b.data, b.len, 0);
    tide_proto_buf_destroy(&b);
    zmq_pollitem_t it = {sock, 0, ZMQ_POLLIN, 0};
    if (zmq_poll(&it, 1, 10000) <= 0)
        return -1;
    zmq_msg_t f;
    zmq_msg_init(&f);
    zmq_msg_recv(&f, sock, 0);
    int rc = tide_proto_decode(zmq_msg_data(&f), zmq_msg_size(&f), rep) == TIDE_OK ? 0 : -1;
    zmq_msg_close(&f);
    return rc;
}

/* Sends resize k once the job runs generation k at step >= at. */
static void *controller(void *arg)
{
    ctl_state *cs = arg;
    void *ctx = zmq_ctx_new(), *s = zmq_socket(ctx, ZMQ_DEALER);
    int linger = 0;
    zmq_setsockopt(s, ZMQ_LINGER, &linger, sizeof linger);
    zmq_connect(s, cs->endpoint);
    int next = 1;
    int64_t last_switch = 0;
    uint64_t deadline = tide_now_ns() + 90ull * 1000000000ull;
    while (next < g_n_gens && tide_now_ns() < deadline && !cs->error) {
        tide_msg_t q, r;
        tide_msg_init(&q, TIDE_MSG_JOBS);
        if (request(s, &q, &r) != 0) {
            snprintf(cs->why, sizeof cs->why, "no jobs reply from tided");
            cs->error = 1;
            break;
        }
        int go = 0;
        for (uint32_t i = 0; r.type == TIDE_MSG_JOBS_REPLY && i < r.u.jobs_reply.n_rows; i++) {
            const tide_proto_job_row_t *row = &r.u.jobs_reply.rows[i];
            if (strcmp(row->name, JOB) != 0)
                continue;
            if (row->gen == (uint64_t)next && row->state == TIDE_JOB_RUNNING) {
                if (last_switch < 0)
                    last_switch = (int64_t)row->step;
                go = (int64_t)row->step >= last_switch + 4;
            }
        }
        tide_msg_clear(&r);
        if (!go) {
            tide_sleep_ms(30);
            continue;
        }
        tide_msg_init(&q, TIDE_MSG_RESIZE);
        snprintf(q.u.resize.job, sizeof q.u.resize.job, JOB);
        q.u.resize.dp = g_gen[next].dp;
        q.u.resize.tp = g_gen[next].tp;
        q.u.resize.pp = g_gen[next].pp;
        q.u.resize.placement = TIDE_PLACEMENT_DEFAULT;
        if (request(s, &q, &r) != 0 || r.type != TIDE_MSG_RESIZE_REPLY) {
            snprintf(cs->why, sizeof cs->why, "resize %d refused: %s", next,
                     r.type == TIDE_MSG_ERROR ? r.u.error.message : "no reply");
            cs->error = 1;
            tide_msg_clear(&r);
            break;
        }
        tide_msg_clear(&r);
        next++;
        cs->sent = next - 1;
        last_switch = -1;
    }
    zmq_close(s);
    zmq_ctx_term(ctx);
    return NULL;
}

/*
 * One worker identity: every rank's tide_worker_id is tided's id of it, the id
 * tide_pool_worker_id gives every rank for it, and the row of `tidectl status` with that
 * id is this rank's device (its index on the host = its rank here). Collective.
 */
static void check_worker_ids(tide_t *t, const char *endpoint, int rank, int size)
{
    int32_t me = tide_worker_id(t), ids[16];
    MT_ASSERT(size <= 16 && me >= 0, "rank %d: worker id %d", rank, (int)me);
    MPI_Allgather(&me, 1, MPI_INT32_T, ids, 1, MPI_INT32_T, MPI_COMM_WORLD);
    for (int r = 0; r < size; r++) {
        MT_ASSERT(tide_pool_worker_id(t, r) == ids[r],
                  "rank %d: tide_pool_worker_id(%d) = %d, but that rank's tide_worker_id is %d",
                  rank, r, (int)tide_pool_worker_id(t, r), (int)ids[r]);
        for (int q = 0; q < r; q++)
            MT_ASSERT(ids[q] != ids[r], "ranks %d and %d share worker id %d", q, r, (int)ids[r]);
    }
    MT_ASSERT(tide_pool_worker_id(t, -1) == -1 && tide_pool_worker_id(t, size) == -1 &&
                  tide_pool_worker_id(NULL, 0) == -1 && tide_worker_id(NULL) == -1 &&
                  tide_pool_rank(NULL) == -1,
              "out-of-range ranks and NULL give -1");
    if (rank != 0)
        return;
    void *ctx = zmq_ctx_new(), *s = zmq_socket(ctx, ZMQ_DEALER);
    int linger = 0;
    zmq_setsockopt(s, ZMQ_LINGER, &linger, sizeof linger);
    zmq_connect(s, endpoint);
    tide_msg_t q, r;
    tide_msg_init(&q, TIDE_MSG_STATUS);
    MT_ASSERT(request(s, &q, &r) == 0 && r.type == TIDE_MSG_STATUS_REPLY, "no status reply");
    for (int k = 0; k < size; k++) {
        const tide_proto_gpu_row_t *row = NULL;
        for (uint32_t i = 0; i < r.u.status_reply.n_rows; i++)
            if (r.u.status_reply.rows[i].worker == ids[k])
                row = &r.u.status_reply.rows[i];
        MT_ASSERT(row != NULL, "tidectl status has no worker %d (rank %d's tide_worker_id)",
                  (int)ids[k], k);
        MT_ASSERT(row->device == k, "status: worker %d on device %d; rank %d runs on device %d",
                  (int)ids[k], row->device, k, k);
    }
    tide_msg_clear(&r);
    zmq_close(s);
    zmq_ctx_term(ctx);
}

/* ---- the test ---------------------------------------------------------------------------- */

int main(int argc, char **argv)
{
    const char *rank_env = getenv("OMPI_COMM_WORLD_RANK");
    int is_root = rank_env != NULL && strcmp(rank_env, "0") == 0;
    const mt_row *row = NULL;
    if (MT_ROWS_SELECT(argc, argv, 2, scenarios, &row))
        return 0; /* --list */
    mt_scenario sc;
    if (argc < 2 || row == NULL || mt_scenario_parse(row, &sc) != TIDE_OK || !sc.has_first ||
        row->gen != sc.n_resizes + 1 || row->gen >= MAX_GEN) {
        fprintf(stderr, "usage: test_worker_mpi PATH_TO_TIDED (its scenario: a first layout "
                        "and resizes, ending in generation 1 + resizes)\n");
        return 2;
    }
    g_n_gens = row->gen;
    g_give = ((const worker_row *)(const void *)row)->give;
    g_gen[0] = sc.first;
    memcpy(&g_gen[1], sc.resize, (size_t)sc.n_resizes * sizeof sc.resize[0]);
    if (is_root)
        start_tided(argv[1]); /* before MPI_Init: fork is safe here */
    is_main = 1;
    int prov = 0;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &prov);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    MT_ASSERT(size == row->ranks, "run with %d ranks, not %d", row->ranks, size);

    ctl_state cs;
    memset(&cs, 0, sizeof cs);
    if (rank == 0) {
        char epf[300];
        snprintf(epf, sizeof epf, "%s/endpoint", tmpdir);
        for (int i = 0; i < 500 && cs.endpoint[0] == '\0'; i++) {
            FILE *f = fopen(epf, "r");
            if (f != NULL) {
                if (fgets(cs.endpoint, sizeof cs.endpoint, f) == NULL)
                    cs.endpoint[0] = '\0';
                fclose(f);
                cs.endpoint[strcspn(cs.endpoint, "\n")] = '\0';
            }
            if (cs.endpoint[0] == '\0')
                tide_sleep_ms(20);
        }
    }
    MPI_Bcast(cs.endpoint, sizeof cs.endpoint, MPI_CHAR, 0, MPI_COMM_WORLD);
    MT_ASSERT(cs.endpoint[0] != '\0', "tided did not write its endpoint");

    tide_options o;
    tide_options_init(&o);
    o.endpoint = cs.endpoint;
    o.register_timeout_ms = 20000;
    rec_register();
    o.backend = "rec";
    o.device = -1; /* the rank's index on the host: its rank, as mpirun runs them on one */
    tide_t *t = NULL;
    MT_OK(tide_new(&t, &o, MPI_COMM_WORLD));
    MT_ASSERT(tide_pool_rank(t) == rank, "pool rank %d, MPI rank %d", tide_pool_rank(t), rank);
    check_worker_ids(t, cs.endpoint, rank, size);
    MT_ASSERT(tide_device(t) == rank && want_dev == rank,
              "rank %d: device %d chosen, %d bound; want the rank's index on the host", rank,
              tide_device(t), want_dev);
    MT_ASSERT(bound == rank, "tide_new binds the device on the calling thread");
    check_memory_calls(t);
    prepared pre;
    memset(&pre, 0, sizeof pre);
    pthread_mutex_init(&pre.mu, NULL);
    pre.t = t;
    MT_OK(tide_set_prepare(t, prepare, &pre));
    tide_collection_t *coll = make_collection();
    tide_join_req jr = {JOB, coll, g_gen[0].dp, g_gen[0].tp, g_gen[0].pp, 2, 0, NULL, 0};
    MT_OK(tide_join(t, &jr));
    const tide_view *v = tide_view_get(t);
    MT_ASSERT(v->generation == 1, "first generation is 1, got %llu",
              (unsigned long long)v->generation);
    MT_ASSERT(v->layout->dp == 2 && v->layout->tp == 1 && v->layout->pp == 2,
              "first layout as requested");
    int members0 = 0, m = v->member;
    MPI_Allreduce(&m, &members0, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    MT_ASSERT(members0 == 4, "4 members in the first layout, %d", members0);

    void **bufs = NULL;
    MT_OK(tide_alloc_buffers(t, v, &bufs));
    if (v->member) {
        for (size_t i = 0; i < tide_collection_size(coll); i++) {
            uint64_t n = tide_shard_bytes(v->layout, coll, i, v->pp_rank, v->dp_rank, v->tp_rank);
            if (n == 0)
                continue;
            void *full = expected_full(coll, i, 0);
            tide_shard_extract(v->layout, coll, i, v->pp_rank, v->dp_rank, v->tp_rank, full,
                               bufs[i]);
            free(full);
        }
        size_t i = first_held(coll, v);
        void **bad = with_foreign(bufs, tide_collection_size(coll), i);
        expect_refused(tide_set_buffers(t, bad), "tide_set_buffers",
                       tide_collection_tensor(coll, i)->name);
        free(bad);
        MT_OK(tide_set_buffers(t, bufs));
    }
    pthread_t th;
    if (rank == 0)
        pthread_create(&th, NULL, controller, &cs);

    static int ran[MAX_STEPS];
    int64_t switch_at[MAX_GEN], gen_size[MAX_GEN];
    for (int g = 0; g < MAX_GEN; g++) {
        switch_at[g] = -1;
        gen_size[g] = 0;
    }
    switch_at[1] = 0;
    gen_size[1] = 4;
    int64_t final_at = -1;
    int owned = 0; /* the runtime owns the buffers (tide_give_buffers) */
    for (;;) {
        tide_step_action a;
        MT_OK(tide_step_begin(t, &a));
        if (a == TIDE_STEP_FINISHED)
            break;
        if (a == TIDE_STEP_RECONFIGURE) {
            const tide_view *nv = tide_view_next(t);
            v = tide_view_get(t);
            int64_t s = nv->step;
            uint64_t g = nv->generation;
            MT_ASSERT(g < MAX_GEN, "generation %llu", (unsigned long long)g);
            gen_size[g] = (int64_t)tide_layout_size(nv->layout);
            if (owned) {
                /* runtime-owned: rebuilt in place, the preparation thread having reserved
                   the pool's blocks for the growth */
                if (v->member)
                    check_shards(coll, v->layout, v->pp_rank, v->dp_rank, v->tp_rank,
                                 tide_buffers(t), s, "before the in-place switch");
                if (g == (uint64_t)g_give + 1) {
                    tide_status rc = tide_reshard(t, tide_buffers(t), NULL);
                    MT_ASSERT(rc == TIDE_ERR_INVALID &&
                                  strstr(tide_last_error(), "the runtime owns") != NULL,
                              "a table passed while the runtime owns the buffers: %s (%s)",
                              tide_status_name(rc), tide_last_error());
                }
                tide_reshard_stats st;
                MT_OK(tide_reshard(t, NULL, &st));
                MT_ASSERT(!st.prepared, "communicators built ahead below MPI_THREAD_MULTIPLE");
                v = tide_view_get(t);
                MT_ASSERT(v->generation == g && v->step == s, "view after the switch");
                if (v->member)
                    check_shards(coll, v->layout, v->pp_rank, v->dp_rank, v->tp_rank,
                                 tide_buffers(t), s, "after the in-place switch");
                switch_at[g] = s;
                if (g == (uint64_t)g_n_gens)
                    final_at = s;
                continue;
            }
            if (v->member)
                check_shards(coll, v->layout, v->pp_rank, v->dp_rank, v->tp_rank, bufs, s,
                             "before the switch");
            void **nb = NULL;
            pthread_mutex_lock(&pre.mu);
            if (pre.gen == g && pre.bufs != NULL) {
                nb = pre.bufs;
                pre.bufs = NULL;
                pre.used++;
            }
            pthread_mutex_unlock(&pre.mu);
            if (nb == NULL)
                MT_OK(tide_alloc_buffers(t, nv, &nb));
            if (g == 2)
                check_reshard_refusals(t, coll, nv, nb);
            tide_reshard_stats st;
            MT_OK(tide_reshard(t, nb, &st));
            /* MPI_THREAD_FUNNELED: no thread but this one may call MPI, so the switch
               step builds the communicators (and the bound below counts them) */
            MT_ASSERT(!st.prepared, "communicators built ahead below MPI_THREAD_MULTIPLE");
            v = tide_view_get(t);
            MT_ASSERT(v->generation == g && v->step == s, "view after the switch");
            if (v->member)
                check_shards(coll, v->layout, v->pp_rank, v->dp_rank, v->tp_rank, nb, s,
                             "after the switch");
            tide_free_buffers(t, &bufs);
            bufs = nb;
            switch_at[g] = s;
            if (g == (uint64_t)g_n_gens)
                final_at = s;
            if (g == (uint64_t)g_give) {
                /* from now on the runtime owns the buffers; the program prepares nothing,
                   so every allocation on libtide's threads is its pool reservation */
                MT_OK(tide_set_prepare(t, NULL, NULL));
                pthread_mutex_lock(&pre.mu);
                tide_free_buffers(t, &pre.bufs);
                pthread_mutex_unlock(&pre.mu);
                __atomic_store_n(&owned_phase, 1, __ATOMIC_RELAXED);
                MT_OK(tide_give_buffers(t, &bufs));
                MT_ASSERT(bufs == NULL && tide_buffers(t) != NULL,
                          "tide_give_buffers takes the table");
                owned = 1;
            }
            continue;
        }
        v = tide_view_get(t);
        int64_t s = v->step;
        MT_ASSERT(s < MAX_STEPS, "the resizes did not finish within %d steps", MAX_STEPS);
        if (final_at >= 0 && s >= final_at + 4) {
            MT_OK(tide_finish(t));
            break;
        }
        apply_step(coll, owned ? tide_buffers(t) : bufs, v, s);
        ran[s]++;
        /* a collective per step over the layout: members agree on the step index */
        double mine = (double)s, lo = 0, hi = 0;
        MT_OK(tide_coll_allreduce(v->all, &mine, &hi, 1, TIDE_F64, TIDE_RED_MAX, NULL));
        double neg = -mine;
        MT_OK(tide_coll_allreduce(v->all, &neg, &lo, 1, TIDE_F64, TIDE_RED_MAX, NULL));
        MT_ASSERT(hi == mine && -lo == mine, "members run different steps: %g..%g", -lo, hi);
        tide_sleep_ms(15);
        MT_OK(tide_step_end(t, TIDE_OK));
    }
    if (rank == 0) {
        pthread_join(th, NULL);
        MT_ASSERT(!cs.error, "controller: %s", cs.why);
        MT_ASSERT(cs.sent == g_n_gens - 1, "controller sent %d resizes", cs.sent);
    }
    /* every participant switched at one agreed step */
    int64_t lo[MAX_GEN], hi[MAX_GEN], sz[MAX_GEN], tmp[MAX_GEN];
    for (int g = 0; g < MAX_GEN; g++)
        tmp[g] = switch_at[g] < 0 ? INT64_MAX : switch_at[g];
    MPI_Allreduce(tmp, lo, MAX_GEN, MPI_INT64_T, MPI_MIN, MPI_COMM_WORLD);
    MPI_Allreduce(switch_at, hi, MAX_GEN, MPI_INT64_T, MPI_MAX, MPI_COMM_WORLD);
    MPI_Allreduce(gen_size, sz, MAX_GEN, MPI_INT64_T, MPI_MAX, MPI_COMM_WORLD);
    for (int g = 1; g <= g_n_gens; g++)
        MT_ASSERT(hi[g] >= 0 && lo[g] == hi[g],
                  "generation %d: switch steps differ between ranks (%lld..%lld)", g,
                  (long long)lo[g], (long long)hi[g]);
    /* each step ran once on every member of the layout active then */
    static int total[MAX_STEPS];
    MPI_Allreduce(ran, total, MAX_STEPS, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    int64_t end = hi[g_n_gens] + 4;
    for (int64_t k = 0; k < MAX_STEPS; k++) {
        int g = 0;
        for (int x = 1; x <= g_n_gens; x++)
            if (hi[x] <= k)
                g = x;
        int want = k < end ? (int)sz[g] : 0;
        MT_ASSERT(total[k] == want, "step %lld ran %d times, want %d (generation %d)", (long long)k,
                  total[k], want, g);
    }
    if (rank == 0)
        printf("switch steps: gen2 %lld, gen3 %lld, gen4 %lld, gen5 %lld; %lld steps\n",
               (long long)hi[2], (long long)hi[3], (long long)hi[4], (long long)hi[5],
               (long long)end);
    /* device binding: no thread touched the backend unbound, and the preparation thread
       did (it moved the switches' buffers) */
    MT_OK(tide_set_prepare(t, NULL, NULL)); /* waits for a running preparation */
    int counts[4] = {__atomic_load_n(&n_violations, __ATOMIC_RELAXED), pre.used,
                     __atomic_load_n(&n_bound_threads, __ATOMIC_RELAXED) > 1,
                     __atomic_load_n(&n_reserve_allocs, __ATOMIC_RELAXED)},
        sums[4];
    MPI_Allreduce(counts, sums, 4, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    MT_ASSERT(sums[0] == 0, "%d backend calls on threads without the rank's device bound", sums[0]);
    MT_ASSERT(sums[1] > 0 && sums[2] > 0,
              "no switch moved into buffers of the preparation thread (%d used, %d ranks bound "
              "a second thread)",
              sums[1], sums[2]);
    MT_ASSERT(sums[3] > 0,
              "the preparation thread reserved no pool memory for the runtime-owned switches");
    MT_ASSERT(n_checked > 0 && __atomic_load_n(&n_comm_ops, __ATOMIC_RELAXED) > 0,
              "the recording backend saw no operations on its communicators (%d calls)", n_checked);
    if (rank == 0)
        printf("device binding: %d switches into prepared buffers, %d ranks bound a second "
               "thread, %d pool reservations there, no unbound backend call\n",
               sums[1], sums[2], sums[3]);
    /* communicators at once: within the bound on every rank, and the bound is reached */
    int peak = __atomic_load_n(&n_peak, __ATOMIC_RELAXED), peak_max = 0;
    MPI_Allreduce(&peak, &peak_max, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    MT_ASSERT(peak <= COMM_BOUND, "rank %d held %d communicators at once (bound %d)", rank, peak,
              COMM_BOUND);
    MT_ASSERT(peak_max == COMM_BOUND,
              "no rank held the old and new layouts' groups at once (most %d): the count is "
              "not measuring switches",
              peak_max);
    if (rank == 0)
        printf("communicators: at most %d alive at once on any rank (bound %d)\n", peak_max,
               COMM_BOUND);
    tide_free_buffers(t, &pre.bufs);
    tide_free_buffers(t, &bufs);
    tide_destroy(&t);
    MT_ASSERT(__atomic_load_n(&n_live, __ATOMIC_RELAXED) == 0,
              "rank %d: %d communicators outlived tide_destroy", rank, n_live);
    tide_collection_destroy(&coll);
    mt_pass("test_worker_mpi");
    MPI_Finalize();
    if (is_root)
        stop_tided();
    return 0;
}
