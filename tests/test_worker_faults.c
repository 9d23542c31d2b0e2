/*
 * MPI integration test of libtide's failure paths around communicators, with the real
 * tided (100 ms heartbeats, failure after 15 missed) and a fault-injecting wrapper of the
 * mpi backend ("faults"). Usage, under `mpirun --enable-recovery`:
 *   test_worker_faults TIDED SCENARIO
 * SCENARIO a row of tests/scenarios/test_worker_faults.h (--list prints them): its ranks,
 * first layout, resizes, victim (rank 2 below), the generation and status it ends in, and
 * the fault, one of:
 *   join      3 ranks join a job (dp 3); rank 2 dies as it starts building the first
 *             layout's communicators, while the others wait for it in the handshake.
 *             tided's recovery must end that wait (tide_join honours the control
 *             thread's abort): tide_join returns well before the switch timeout (60 s),
 *             and the survivors switch to the recovery layout at step 0 and train.
 *   build     3 ranks, (dp 3) -> (dp 1, tp 3): rank 2 dies in the switch right after the
 *             new all was split off the switch communicator, while the survivors release
 *             that communicator. The recording backend holds each survivor inside that
 *             release until an abort reaches one of its communicators (at most 10 s): an
 *             abort that finds neither the switch communicator nor the new all (the race
 *             commit dc11ad9 fixed by publishing the new all in the same hold of the lock)
 *             never comes, and the survivors' next split then waits for the dead rank
 *             forever (its allgather of colours over the new all). Checked: the
 *             survivors' tide_reshard fails with TIDE_ERR_ABORTED within 25 s (a watchdog
 *             fails the test after 40 s), and the job recovers from (dp 3) and trains.
 *   nofinish  3 ranks, a job of dp 2 (one rank idle): the members stop after step 6 without
 *             tide_finish (an error path of the program) and only destroy their runtimes
 *             (bye). The idle rank must not wait forever: tided ends the job on the first
 *             member's bye and tells the idle rank, whose tide_step_begin returns
 *             TIDE_STEP_FINISHED within 15 s.
 *   deadcomm  2 ranks (dp 2): every rank's allreduce of step 3 fails with TIDE_ERR_ABORTED
 *             (what nccl reports for ncclSystemError) while nobody died. No recovery ever
 *             comes: the step must not be retried on the dead communicators (it would be,
 *             forever), and tide_step_begin must give up after the switch timeout (3 s)
 *             with TIDE_ERR_TIMEOUT saying why.
 *   prepdie   3 ranks on MPI_THREAD_MULTIPLE, (dp 3) -> (dp 1, tp 3): rank 2 dies as its
 *             preparation thread starts building the new layout's communicators ahead of
 *             the switch, while the others' preparation threads wait for it in the
 *             handshake (it asks for the resize from inside a step and stays there, so its
 *             ack, and the commit, never come however slow the machine). tided aborts the
 *             generation and recovers over the survivors: the abort must end their builds
 *             (no switch step may wait for a build, the watchdog fails any tide_step_begin
 *             or tide_reshard past 40 s), and they switch to the recovery (built at its
 *             switch step, as a recovery is) and train.
 *   prepabort 3 ranks on MPI_THREAD_MULTIPLE, (dp 3) -> (dp 1, tp 3) while rank 1 stalls in
 *             a step for 8 s; tided (resize timeout 4 s) aborts the generation after every
 *             rank built its communicators ahead (5 of them: the switch's, all, tp, dp,
 *             pp). Nothing may be left of them once the ranks go on in (dp 3): every
 *             rank holds exactly the old layout's 4 communicators a few steps later (the
 *             ASan build checks that nothing leaks). A second resize to the same layout
 *             then switches with communicators built ahead (stats.prepared) within the same 4 s: a
 *             loaded machine builds the 5 ahead in 1.5 s, and the second switch needs it.
 *   trim      3 ranks, the runtime owning the buffers, (dp 3) -> (dp 2): the rank that
 *             leaves gives its pool memory back to the system at the end of its switch,
 *             which must come after its done (tided commits the generation only once
 *             every participant reported, and freeing GiBs takes a while): the wrapper
 *             holds the rank's first free of that trim until tided says the generation
 *             is committed (at most 10 s), which it can only be once the done went out.
 * The state is a toy collection whose values are a function of tensor, element and steps
 * completed; every switch is checked bit for bit before and after. A failed check kills
 * every rank (MPI_Abort does not end the others under --enable-recovery).
 */
#include <mpi.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <tide/tide.h>

#include "collectives/collectives.h" /* the fault-injecting wrapper of the mpi backend */
#include "coord_harness.h"
#include "core/clock.h"
#include "core/error.h"
#include "mpi_test.h"
#include "tests/support/scenario.h"

#define JOB       "faults"
#define LAYERS    2
#define FAIL_STEP 3 /* deadcomm: the step whose allreduce fails; build: the resize */
#define MAX_STEPS 400

#define STALL_MS    8000 /* prepabort: rank 1's stalled step, well past the resize timeout */
#define NOFINISH_AT 6    /* nofinish: the members stop after this many steps */

/* The fault of a scenario: what the wrapper injects, and the checks that follow. */
enum {
    FAULT_JOIN,
    FAULT_BUILD,
    FAULT_DEADCOMM,
    FAULT_PREPDIE,
    FAULT_PREPABORT,
    FAULT_TRIM,
    FAULT_NOFINISH
};

/* A scenario: the generic columns, then the fault (tests/scenarios/test_worker_faults.h). */
typedef struct faults_row {
    mt_row r;
    int fault;
} faults_row;

static const faults_row scenarios[] = {
#define ROW(name, ranks, timeout, labels, mpi, first, resizes, kill, ckpt, gen, status, ...)       \
    {{name, ranks, timeout, labels, mpi, first, resizes, kill, ckpt, gen, status}, __VA_ARGS__},
#include "scenarios/test_worker_faults.h"
#undef ROW
};

static const faults_row *g_row;
static mt_scenario g_sc;  /* its layouts and kill */
static int g_mode;        /* its fault (FAULT_*) */
static int g_victim = -1; /* the pool rank that dies, or -1 */
static int g_rank;
static _Thread_local int g_is_main; /* the program's main thread */

/* ---- failing checks end every rank -------------------------------------------------------- */

static int g_pids[16], g_npids;

static void fail_all(void)
{
    fflush(stderr);
    fflush(stdout);
    int me = (int)getpid();
    for (int i = 0; i < g_npids; i++)
        if (g_pids[i] > 0 && g_pids[i] != me)
            kill(g_pids[i], SIGKILL);
    _exit(1);
}

#undef MT_FAIL
#define MT_FAIL(...)                                                                               \
    do {                                                                                           \
        fprintf(stderr, "[rank %d] %s:%d: FAILED: ", g_rank, __FILE__, __LINE__);                  \
        fprintf(stderr, __VA_ARGS__);                                                              \
        fputc('\n', stderr);                                                                       \
        fail_all();                                                                                \
    } while (0)

/* ---- the fault-injecting backend ---------------------------------------------------------- */

static tide_coll_backend_v1 fb;
static const tide_coll_backend_v1 *under;
static int g_creates;             /* comm_create calls of this process */
static int g_in_switch, g_splits; /* build: inside tide_reshard; splits there */
static int g_switch_destroys;     /* build: destroys there after the first split */
static int g_aborts;              /* comm_abort calls (atomic: libtide's control thread) */
static int g_fail_allreduce;      /* deadcomm: the next allreduce fails */
static int g_live;                /* communicators alive in this process (atomic) */
static int g_prep_made;           /* made on a thread of libtide's, not the main one (atomic) */
static int g_prep_tries;          /* creations begun there (atomic) */
static int g_leaving;             /* trim: this rank leaves in the running switch */
static int g_trim_seen = -1;      /* trim: tided committed while the trim's first free waited */
static char g_endpoint[256];      /* tided's */

static void born(tide_status rc, tide_coll_comm_t *const *out)
{
    if (rc != TIDE_OK || *out == NULL)
        return;
    __atomic_add_fetch(&g_live, 1, __ATOMIC_RELAXED);
    if (!g_is_main)
        __atomic_add_fetch(&g_prep_made, 1, __ATOMIC_RELAXED);
}

static tide_status fb_create(tide_coll_pool_t *pool, const tide_coll_comm_params *p,
                             tide_coll_comm_t **out)
{
    if (g_mode == FAULT_JOIN && g_rank == g_victim && g_creates++ == 0) {
        fprintf(stderr, "[rank %d] dies before building the first layout's communicators\n",
                g_rank);
        _exit(0);
    }
    if (!g_is_main)
        __atomic_add_fetch(&g_prep_tries, 1, __ATOMIC_RELAXED);
    if (g_mode == FAULT_PREPDIE && g_rank == g_victim && !g_is_main) {
        fprintf(stderr, "[rank %d] dies as it builds the new layout's communicators ahead\n",
                g_rank);
        _exit(0);
    }
    tide_status rc = under->comm_create(pool, p, out);
    born(rc, out);
    return rc;
}

static tide_status fb_split(tide_coll_comm_t *parent, int color, int key, const int *members, int n,
                            tide_coll_comm_t **out)
{
    if (g_in_switch)
        g_splits++;
    tide_status rc = under->comm_split(parent, color, key, members, n, out);
    born(rc, out);
    return rc;
}

/* An abort of a switch reached its communicators (c, the switch communicator being
   released now, or one before): directly, or through the abort word they watch. */
static int g_switch_aborted;
static int switch_aborted(const tide_coll_comm_t *c)
{
    if (tide_coll_comm_aborted(c))
        g_switch_aborted = 1;
    return __atomic_load_n(&g_aborts, __ATOMIC_RELAXED) != 0 || g_switch_aborted;
}

/* In the switch of build mode, the first destroy after the first split is build_groups
   releasing the switch communicator, the new all just split off it. */
static void fb_destroy(tide_coll_comm_t *c)
{
    __atomic_sub_fetch(&g_live, 1, __ATOMIC_RELAXED);
    if (g_mode == FAULT_BUILD && g_in_switch && g_splits == 1 && g_switch_destroys++ == 0) {
        if (g_rank == g_victim) {
            fprintf(stderr, "[rank %d] dies while the switch's groups are built\n", g_rank);
            _exit(0);
        }
        /* hold the survivor here until an abort of the switch reaches its communicators
           (through the generation's abort word they watch, or a direct abort); one that
           found none of them never comes */
        uint64_t until = tide_now_ns() + 10ull * 1000000000ull;
        while (!switch_aborted(c) && tide_now_ns() < until)
            tide_sleep_ms(5);
        if (!switch_aborted(c))
            fprintf(stderr, "[rank %d] no abort reached the switch's communicators in 10 s\n",
                    g_rank);
    }
    under->comm_destroy(c);
}

static void job_gen(uint64_t *gen, int *running);

/* trim: the leaving rank's first free of memory in its switch (its pool's trim) waits for
   tided's commit of the generation, which needs this rank's done */
static void fb_mem_free(void *ptr)
{
    if (g_mode == FAULT_TRIM && g_in_switch && g_leaving && g_trim_seen < 0) {
        g_trim_seen = 0;
        uint64_t until = tide_now_ns() + 10ull * 1000000000ull;
        while (tide_now_ns() < until && !g_trim_seen) {
            uint64_t gen = 0;
            int running = 0;
            job_gen(&gen, &running);
            g_trim_seen = gen == (uint64_t)g_row->r.gen && running;
            if (!g_trim_seen)
                tide_sleep_ms(20);
        }
    }
    under->mem_free(ptr);
}

static void fb_abort(tide_coll_comm_t *c)
{
    __atomic_add_fetch(&g_aborts, 1, __ATOMIC_RELAXED);
    under->comm_abort(c);
}

static tide_status fb_allreduce(tide_coll_comm_t *c, const void *send, void *recv, size_t count,
                                tide_dtype dt, tide_red_op op, tide_coll_stream_t s)
{
    if (g_fail_allreduce) {
        g_fail_allreduce = 0;
        return tide_errorf(TIDE_ERR_ABORTED,
                           "injected: ncclSystemError (a socket error) with every peer alive");
    }
    return under->allreduce(c, send, recv, count, dt, op, s);
}

static void fb_register(void)
{
    MT_OK(tide_coll_backend_find("mpi", &under));
    fb = *under;
    fb.name = "faults";
    fb.comm_create = fb_create;
    fb.comm_split = fb_split;
    fb.comm_destroy = fb_destroy;
    fb.comm_abort = fb_abort;
    fb.allreduce = fb_allreduce;
    fb.mem_free = fb_mem_free;
    MT_OK(tide_coll_backend_register(&fb));
}

/* ---- watchdog: a switch that hangs fails the test, not ctest's timeout ----------------------- */

static uint64_t g_switch_t0; /* monotonic ns when the running tide_reshard began; 0: none */
static uint64_t g_begin_t0;  /* the same for tide_step_begin */

static void *watchdog(void *arg)
{
    (void)arg;
    for (;;) {
        tide_sleep_ms(100);
        uint64_t t0 = __atomic_load_n(&g_switch_t0, __ATOMIC_RELAXED);
        if (t0 != 0 && tide_now_ns() - t0 > 40ull * 1000000000ull)
            MT_FAIL("tide_reshard has run for 40 s: a participant died while the new "
                    "layout's groups were built, and nothing ended the wait for it");
        t0 = __atomic_load_n(&g_begin_t0, __ATOMIC_RELAXED);
        if (t0 != 0 && tide_now_ns() - t0 > 40ull * 1000000000ull)
            MT_FAIL("tide_step_begin has waited for 40 s (a switch step waiting for a build of "
                    "communicators ahead that waits for a dead participant?)");
    }
    return NULL;
}

/* ---- the toy state --------------------------------------------------------------------------- */

static tide_collection_t *make_collection(void)
{
    tide_collection_t *c = NULL;
    MT_OK(tide_collection_new(&c, LAYERS));
    tide_tensor_desc d;
    memset(&d, 0, sizeof d);
    snprintf(d.name, sizeof d.name, "w");
    d.dtype = TIDE_F32;
    d.ndim = 2;
    d.shape[0] = 12;
    d.shape[1] = 4;
    d.layer = 0;
    d.tp = TIDE_TP_SPLIT;
    d.tp_segments = 1;
    d.dp = TIDE_DP_REPLICATED;
    MT_OK(tide_collection_add(c, &d));
    snprintf(d.name, sizeof d.name, "v");
    d.ndim = 1;
    d.shape[0] = 8;
    d.shape[1] = 0;
    d.layer = 1;
    d.tp = TIDE_TP_REPLICATED;
    MT_OK(tide_collection_add(c, &d));
    snprintf(d.name, sizeof d.name, "step");
    d.dtype = TIDE_I64;
    d.shape[0] = 1;
    d.layer = TIDE_LAYER_ALL;
    MT_OK(tide_collection_add(c, &d));
    return c;
}

/* The full tensor i after s completed steps (malloc'd). */
static void *expected_full(const tide_collection_t *c, size_t i, int64_t s)
{
    const tide_tensor_desc *d = tide_collection_tensor(c, i);
    uint64_t bytes = tide_tensor_bytes(d);
    void *b = malloc(bytes);
    if (d->dtype == TIDE_I64) {
        ((int64_t *)b)[0] = s;
        return b;
    }
    float *f = b;
    for (size_t k = 0; k < bytes / 4; k++)
        f[k] = (float)(i * 100 + k) + (float)s;
    return b;
}

/* Fills (fill) or checks bufs against view v's shards of the state after s steps. */
static void shards(const tide_collection_t *c, const tide_view *v, void *const *bufs, int64_t s,
                   int fill, const char *when)
{
    for (size_t i = 0; v->member && i < tide_collection_size(c); i++) {
        uint64_t n = tide_shard_bytes(v->layout, c, i, v->pp_rank, v->dp_rank, v->tp_rank);
        if (n == 0)
            continue;
        void *full = expected_full(c, i, s), *want = malloc(n);
        tide_shard_extract(v->layout, c, i, v->pp_rank, v->dp_rank, v->tp_rank, full, want);
        if (fill)
            memcpy(bufs[i], want, n);
        else
            MT_ASSERT(memcmp(bufs[i], want, n) == 0,
                      "%s: tensor %s differs from the state after %lld steps", when,
                      tide_collection_tensor(c, i)->name, (long long)s);
        free(want);
        free(full);
    }
}

/* One training step on the local shards: s -> s + 1. */
static void apply_step(const tide_collection_t *c, const tide_view *v, void *const *bufs)
{
    for (size_t i = 0; i < tide_collection_size(c); i++) {
        uint64_t n = tide_shard_bytes(v->layout, c, i, v->pp_rank, v->dp_rank, v->tp_rank);
        if (n == 0)
            continue;
        if (tide_collection_tensor(c, i)->dtype == TIDE_I64) {
            ((int64_t *)bufs[i])[0]++;
            continue;
        }
        float *f = bufs[i];
        for (size_t k = 0; k < n / 4; k++)
            f[k] += 1.0f;
    }
}

/* ---- tided --------------------------------------------------------------------------------- */

static coord_proc g_coord;

static void resize(const char *endpoint, const mt_layout *l)
{
    void *ctx = zmq_ctx_new();
    void *s = coord_connect(ctx, endpoint, NULL, NULL, NULL, 10000);
    tide_msg_t q, r;
    tide_msg_init(&q, TIDE_MSG_RESIZE);
    snprintf(q.u.resize.job, sizeof q.u.resize.job, JOB);
    q.u.resize.dp = l->dp;
    q.u.resize.tp = l->tp;
    q.u.resize.pp = l->pp;
    q.u.resize.placement = TIDE_PLACEMENT_DEFAULT;
    MT_ASSERT(s != NULL && coord_call(s, &q, &r) == 0 && r.type == TIDE_MSG_RESIZE_REPLY,
              "resize refused: %s", r.type == TIDE_MSG_ERROR ? r.u.error.message : "no reply");
    tide_msg_clear(&r);
    zmq_close(s);
    zmq_ctx_term(ctx);
}

/* The job's generation in tided and whether it runs (committed, no switch pending). */
static void job_gen(uint64_t *gen, int *running)
{
    *gen = 0;
    *running = 0;
    void *ctx = zmq_ctx_new();
    void *s = coord_connect(ctx, g_endpoint, NULL, NULL, NULL, 10000);
    tide_msg_t q, r;
    tide_msg_init(&q, TIDE_MSG_JOBS);
    tide_msg_init(&r, TIDE_MSG_NONE);
    if (s != NULL && coord_call(s, &q, &r) == 0 && r.type == TIDE_MSG_JOBS_REPLY)
        for (uint32_t i = 0; i < r.u.jobs_reply.n_rows; i++)
            if (strcmp(r.u.jobs_reply.rows[i].name, JOB) == 0) {
                *gen = r.u.jobs_reply.rows[i].gen;
                *running = r.u.jobs_reply.rows[i].state == TIDE_JOB_RUNNING;
            }
    tide_msg_clear(&r);
    if (s != NULL)
        zmq_close(s);
    zmq_ctx_term(ctx);
}

/* ---- the test ------------------------------------------------------------------------------- */

typedef struct result {
    int64_t switches;   /* switches that succeeded */
    int64_t last_gen;   /* the generation switched to last */
    int64_t switch_at;  /* its switch step */
    int64_t aborted;    /* switches that failed (build: the one the victim died in) */
    int64_t steps;      /* steps this rank completed */
    int64_t join_ms;    /* tide_join */
    int64_t gave_up_ms; /* deadcomm: from the failed step's end to tide_step_begin's error;
                           nofinish: the idle rank's wait for TIDE_STEP_FINISHED */
    int64_t prepared;   /* switches that took communicators built ahead */
    int64_t live_after; /* prepabort: communicators alive after the aborted generation */
    int64_t prep_made;  /* prepabort: made on libtide's preparation thread before it */
    int64_t prep_tries; /* creations begun there in all */
    int64_t trim_seen;  /* trim: the leaving rank saw the commit while its trim waited (1),
                           did not (0); -1 on the others */
} result;
#define RESULT_N 12

/* TIDE_STEP_RECONFIGURE: the switch to the next layout, its shards checked before and
   after; *bufs become the new layout's (unless the runtime owns them). */
static void reconfigure(tide_t *t, const tide_collection_t *coll, int owned, void ***bufs,
                        result *res)
{
    const tide_view *nv = tide_view_next(t);
    const tide_view *v = tide_view_get(t);
    int64_t s = nv->step;
    uint64_t g = nv->generation;
    if (v->member)
        shards(coll, v, owned ? tide_buffers(t) : *bufs, s, 0, "before the switch");
    void **nb = NULL;
    if (!owned)
        MT_OK(tide_alloc_buffers(t, nv, &nb));
    g_leaving = v->member && !nv->member;
    uint64_t t0 = tide_now_ns();
    g_in_switch = 1;
    g_splits = g_switch_destroys = 0;
    __atomic_store_n(&g_switch_t0, t0, __ATOMIC_RELAXED);
    tide_reshard_stats st;
    memset(&st, 0, sizeof st);
    tide_status rc = tide_reshard(t, owned ? NULL : nb, &st);
    __atomic_store_n(&g_switch_t0, 0, __ATOMIC_RELAXED);
    g_in_switch = 0;
    double secs = (double)(tide_now_ns() - t0) / 1e9;
    if (rc != TIDE_OK) {
        MT_ASSERT(g_mode == FAULT_BUILD && g == 2, "the switch to generation %llu failed: %s (%s)",
                  (unsigned long long)g, tide_status_name(rc), tide_last_error());
        MT_ASSERT(rc == TIDE_ERR_ABORTED && secs < 25.0,
                  "a switch whose participant died while its groups were built must "
                  "fail with TIDE_ERR_ABORTED once tided aborts it; it gave %s after "
                  "%.1f s (switch timeout 60 s): %s",
                  tide_status_name(rc), secs, tide_last_error());
        res->aborted++;
        tide_free_buffers(t, &nb);
        return;
    }
    v = tide_view_get(t);
    MT_ASSERT(v->generation == g && v->step == s, "view after the switch");
    if (v->member)
        shards(coll, v, owned ? tide_buffers(t) : nb, s, 0, "after the switch");
    tide_free_buffers(t, bufs);
    *bufs = nb;
    if (g_leaving)
        res->trim_seen = g_trim_seen;
    res->prepared += st.prepared;
    res->switches++;
    res->last_gen = (int64_t)g;
    res->switch_at = s;
}

/* The scenario's faults of step s on generation v: the resizes it asks for, the victim's
   stall, the failed allreduce. */
static void step_faults(const char *endpoint, const tide_view *v, int64_t s, result *res,
                        int *resized, int *faulted)
{
    int resizes = g_mode == FAULT_BUILD || g_mode == FAULT_PREPDIE || g_mode == FAULT_PREPABORT;
    /* prepdie: the victim asks, from inside the step it then stays in, so that tided's
       prepare can reach it only there; asked by another rank, it could reach the victim
       before the end of its step before, which releases the held ack, and on a loaded
       machine the commit then comes before its build ahead begins (build's case) */
    int resizer = g_mode == FAULT_PREPDIE ? g_victim : 0;
    if (resizes && g_rank == resizer && !*resized && v->generation == 1 && s == FAIL_STEP) {
        resize(endpoint, &g_sc.resize[0]);
        *resized = 1;
    }
    if (g_mode == FAULT_TRIM && g_rank == 0 && !*resized && s == FAIL_STEP) {
        resize(endpoint, &g_sc.resize[0]); /* one rank leaves */
        *resized = 1;
    }
    if (g_mode == FAULT_PREPDIE && v->generation == 1 && s == FAIL_STEP && g_rank == g_victim) {
        /* it stays inside this step (why: at its resize above) until its preparation
           thread dies building ahead */
        tide_sleep_ms(30000);
        MT_FAIL("rank %d: no build ahead began within 30 s of the resize", g_rank);
    }
    if (g_mode == FAULT_PREPABORT && v->generation == 1 && s == FAIL_STEP && g_rank == 1) {
        /* the ack goes out once the build ahead is done, but the step (and the others'
           in its allreduce) ends only after tided's resize deadline: it aborts */
        tide_sleep_ms(STALL_MS);
    }
    if (g_mode == FAULT_PREPABORT && v->generation == 1 && s == FAIL_STEP + 3) {
        /* the aborted generation's communicators built ahead are gone by now */
        res->live_after = __atomic_load_n(&g_live, __ATOMIC_RELAXED);
        res->prep_made = __atomic_load_n(&g_prep_made, __ATOMIC_RELAXED);
    }
    if (g_mode == FAULT_PREPABORT && g_rank == 0 && *resized == 1 && v->generation == 1 &&
        s == FAIL_STEP + 5) {
        resize(endpoint, &g_sc.resize[1]); /* the same again: switches, built ahead */
        *resized = 2;
    }
    if (g_mode == FAULT_DEADCOMM && s == FAIL_STEP && !*faulted)
        g_fail_allreduce = *faulted = 1;
}

static void run(tide_t *t, const tide_collection_t *coll, const char *endpoint, result *res)
{
    const tide_view *v = tide_view_get(t);
    void **bufs = NULL;
    MT_OK(tide_alloc_buffers(t, v, &bufs));
    if (v->member) {
        shards(coll, v, bufs, v->step, 1, "");
        MT_OK(tide_set_buffers(t, bufs));
    }
    int owned = g_mode == FAULT_TRIM; /* the runtime owns the buffers, rebuilt in place */
    if (owned)
        MT_OK(tide_give_buffers(t, &bufs));
    int resized = 0, faulted = 0;
    int64_t final_gen = g_row->r.gen;
    for (int iter = 0; iter < 100000; iter++) {
        tide_step_action a;
        uint64_t tb = tide_now_ns();
        __atomic_store_n(&g_begin_t0, tb, __ATOMIC_RELAXED);
        tide_status rc = tide_step_begin(t, &a);
        __atomic_store_n(&g_begin_t0, 0, __ATOMIC_RELAXED);
        if (faulted) {
            /* deadcomm: no recovery comes; the rank gives up, bounded, and says why */
            res->gave_up_ms = (int64_t)((tide_now_ns() - tb) / 1000000ull);
            if (rc == TIDE_OK && a == TIDE_STEP_RUN)
                MT_FAIL("after a collective failed with every peer alive, tide_step_begin "
                        "hands the step out again, to run on the dead communicators: it fails "
                        "at once, and is retried for as long as no new layout comes (forever)");
            MT_ASSERT(rc == g_row->r.status && strstr(tide_last_error(), "no new layout") &&
                          strstr(tide_last_error(), "communicators failed"),
                      "after a collective failed with every peer alive, tide_step_begin gave %s "
                      "(%s)",
                      tide_status_name(rc), tide_last_error());
            break;
        }
        MT_OK(rc);
        if (a == TIDE_STEP_FINISHED) {
            res->gave_up_ms = (int64_t)((tide_now_ns() - tb) / 1000000ull);
            break;
        }
        if (a == TIDE_STEP_RECONFIGURE) {
            reconfigure(t, coll, owned, &bufs, res);
            continue;
        }
        v = tide_view_get(t);
        int64_t s = v->step;
        MT_ASSERT(s < MAX_STEPS, "the job did not get to its end within %d steps", MAX_STEPS);
        if (g_mode == FAULT_NOFINISH && s >= NOFINISH_AT)
            break; /* no tide_finish: the caller destroys the runtime */
        if (res->last_gen == final_gen && s >= res->switch_at + 3) {
            MT_OK(tide_finish(t));
            break;
        }
        step_faults(endpoint, v, s, res, &resized, &faulted);
        double mine = (double)s, hi = 0;
        rc = tide_coll_allreduce(v->all, &mine, &hi, 1, TIDE_F64, TIDE_RED_MAX, NULL);
        /* build: the steps after the failed switch run on the old layout, the dead rank's
           too, until the recovery aborts them */
        /* prepdie: the steps that wait for the dead rank, until the recovery aborts them */
        MT_ASSERT(rc == TIDE_OK || faulted ||
                      ((res->aborted > 0 || g_mode == FAULT_PREPDIE) && rc == TIDE_ERR_ABORTED),
                  "step %lld: %s (%s)", (long long)s, tide_status_name(rc), tide_last_error());
        MT_ASSERT(rc != TIDE_OK || hi == mine, "members run different steps");
        if (rc == TIDE_OK) /* a step whose collectives failed changes no state */
            apply_step(coll, v, owned ? tide_buffers(t) : bufs);
        tide_sleep_ms(10);
        MT_OK(tide_step_end(t, rc));
        if (rc == TIDE_OK)
            res->steps++;
    }
    tide_free_buffers(t, &bufs);
}

/* Sets the scenario from its row: its layouts, its victim (the kill's rank, at the
   backend call its fault names); 0, or -1 with the reason on stderr. */
static int plan_scenario(const mt_row *row)
{
    static const char *const kill_at[FAULT_NOFINISH + 1] = {
        [FAULT_JOIN] = "create", [FAULT_BUILD] = "split", [FAULT_PREPDIE] = "prepare"};
    g_row = (const faults_row *)(const void *)row;
    g_mode = g_row->fault;
    const char *why = NULL;
    if (mt_scenario_parse(row, &g_sc) != TIDE_OK)
        why = tide_last_error();
    else if (g_mode < 0 || g_mode > FAULT_NOFINISH || !g_sc.has_first)
        why = "an unknown fault, or no first layout";
    else if (strcmp(g_sc.kill.when, kill_at[g_mode] ? kill_at[g_mode] : "") != 0 ||
             (g_sc.kill.when[0] != '\0' && g_sc.kill.rank < 0))
        why = "the kill must name the fault's backend call (create, split, prepare) and a rank";
    else if (g_sc.n_resizes <
             (g_mode == FAULT_PREPABORT                                                  ? 2
              : g_mode == FAULT_BUILD || g_mode == FAULT_PREPDIE || g_mode == FAULT_TRIM ? 1
                                                                                         : 0))
        why = "the fault needs more resizes";
    else if ((g_mode == FAULT_DEADCOMM) != (row->status != TIDE_OK))
        why = "deadcomm ends in an error (what tide_step_begin gives up with), the others in "
              "TIDE_OK";
    if (why != NULL) {
        fprintf(stderr, "test_worker_faults: scenario %s: %s\n", row->name, why);
        return -1;
    }
    g_victim = g_sc.kill.rank;
    return 0;
}

int main(int argc, char **argv)
{
    const mt_row *row = NULL;
    if (MT_ROWS_SELECT(argc, argv, 2, scenarios, &row))
        return 0; /* --list */
    if (row == NULL || plan_scenario(row) != 0) {
        fprintf(stderr, "usage: test_worker_faults TIDED SCENARIO\n");
        return 2;
    }
    g_is_main = 1;
    int prep_mode = g_mode == FAULT_PREPDIE || g_mode == FAULT_PREPABORT;
    const char *rank_env = getenv("OMPI_COMM_WORLD_RANK");
    int is_root = rank_env != NULL && strcmp(rank_env, "0") == 0;
    if (is_root) { /* before MPI_Init: fork is safe here */
        /* prepabort: the resize's deadline passes while rank 1 stalls */
        const char *flags[] = {"--heartbeat-ms",
                               "100",
                               "--miss-limit",
                               "15",
                               "--resize-timeout-ms",
                               g_mode == FAULT_PREPABORT ? "4000" : "30000",
                               NULL};
        if (coord_tmpdir(&g_coord) != 0 || coord_start(&g_coord, argv[1], flags, NULL) != 0)
            g_coord.endpoint[0] = '\0';
    }
    int prov = 0, size = 0;
    /* the prepare modes: communicators are built ahead only on MPI_THREAD_MULTIPLE */
    MPI_Init_thread(&argc, &argv, prep_mode ? MPI_THREAD_MULTIPLE : MPI_THREAD_FUNNELED, &prov);
    MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    int want_np = row->ranks;
    MT_ASSERT(size == want_np, "run scenario %s with %d ranks, not %d", argv[2], want_np, size);
    int mypid = (int)getpid();
    MPI_Allgather(&mypid, 1, MPI_INT, g_pids, 1, MPI_INT, MPI_COMM_WORLD);
    g_npids = size;
    char endpoint[256] = "";
    if (g_rank == 0)
        snprintf(endpoint, sizeof endpoint, "%s", g_coord.endpoint);
    MPI_Bcast(endpoint, sizeof endpoint, MPI_CHAR, 0, MPI_COMM_WORLD);
    MT_ASSERT(endpoint[0] != '\0', "tided did not start");
    snprintf(g_endpoint, sizeof g_endpoint, "%s", endpoint);

    fb_register();
    pthread_t wd;
    pthread_create(&wd, NULL, watchdog, NULL);
    pthread_detach(wd);
    tide_options o;
    tide_options_init(&o);
    o.endpoint = endpoint;
    o.backend = "faults";
    o.register_timeout_ms = 20000;
    /* long, so that a wait the fixes end early shows; deadcomm: the bound it gives up at */
    o.switch_timeout_ms = g_mode == FAULT_DEADCOMM ? 3000 : 60000;
    tide_t *t = NULL;
    MT_OK(tide_new(&t, &o, MPI_COMM_WORLD));
    tide_collection_t *coll = make_collection();
    const mt_layout *l0 = &g_sc.first;
    tide_join_req jr = {JOB, coll, l0->dp, l0->tp, l0->pp, 1, 0, NULL, 0};
    result res;
    memset(&res, 0, sizeof res);
    res.trim_seen = -1;
    uint64_t t0 = tide_now_ns();
    MT_OK(tide_join(t, &jr));
    res.join_ms = (int64_t)((tide_now_ns() - t0) / 1000000ull);
    MT_ASSERT(g_rank != g_victim || g_mode != FAULT_JOIN, "the victim survived its join");
    MT_ASSERT(!prep_mode || prov == MPI_THREAD_MULTIPLE, "MPI gives thread level %d", prov);
    if (g_mode == FAULT_JOIN)
        MT_ASSERT(res.join_ms < 20000,
                  "tide_join took %lld ms: a member died while the first layout's "
                  "communicators were built, and the build waited for it (switch timeout "
                  "60 s) instead of ending with tided's recovery",
                  (long long)res.join_ms);
    run(t, coll, endpoint, &res);
    if (g_mode == FAULT_NOFINISH)
        tide_destroy(&t); /* the members' bye, before anything waits for the idle rank */
    MT_ASSERT(g_rank != g_victim, "the victim is still alive");
    res.prep_tries = __atomic_load_n(&g_prep_tries, __ATOMIC_RELAXED);

    /* only the survivors from here (MPI_COMM_WORLD still names the dead rank) */
    MPI_Comm surv = MPI_COMM_NULL;
    if (g_victim < 0) {
        MPI_Comm_dup(MPI_COMM_WORLD, &surv);
    } else {
        MPI_Group wg, sg;
        int victim = g_victim;
        MPI_Comm_group(MPI_COMM_WORLD, &wg);
        MPI_Group_excl(wg, 1, &victim, &sg);
        MT_ASSERT(MPI_Comm_create_group(MPI_COMM_WORLD, sg, 4711, &surv) == MPI_SUCCESS,
                  "communicator of the survivors");
        MPI_Group_free(&sg);
        MPI_Group_free(&wg);
    }
    int64_t lo[RESULT_N], hi[RESULT_N];
    _Static_assert(sizeof(result) == RESULT_N * sizeof(int64_t), "result is RESULT_N int64_t");
    MPI_Allreduce(&res, lo, RESULT_N, MPI_INT64_T, MPI_MIN, surv);
    MPI_Allreduce(&res, hi, RESULT_N, MPI_INT64_T, MPI_MAX, surv);
    if (g_mode == FAULT_JOIN) {
        MT_ASSERT(lo[0] == 1 && hi[0] == 1 && lo[1] == 2 && lo[2] == 0 && hi[2] == 0,
                  "every survivor switched once, to the recovery (generation 2) at step 0");
        MT_ASSERT(lo[4] >= 3, "the survivors trained after the recovery");
    } else if (g_mode == FAULT_BUILD) {
        MT_ASSERT(lo[3] == 1 && hi[3] == 1, "every survivor's switch to generation 2 failed once");
        MT_ASSERT(lo[0] == 1 && lo[1] == 3 && hi[1] == 3 && lo[2] == hi[2],
                  "every survivor then switched to the recovery (generation 3) at one step");
    } else if (g_mode == FAULT_NOFINISH) {
        /* two members ran the steps, the idle rank none, and it was released in time */
        MT_ASSERT(lo[4] == 0 && hi[4] == NOFINISH_AT, "steps %lld..%lld", (long long)lo[4],
                  (long long)hi[4]);
        int64_t waited = res.steps == 0 ? res.gave_up_ms : 0, most = 0;
        MPI_Allreduce(&waited, &most, 1, MPI_INT64_T, MPI_MAX, surv);
        MT_ASSERT(res.steps != 0 || res.gave_up_ms > 0, "the idle rank was never released");
        MT_ASSERT(most < 15000,
                  "the idle rank waited %lld ms for the end of a job whose members stopped "
                  "without tide_finish",
                  (long long)most);
    } else if (g_mode == FAULT_PREPDIE) {
        MT_ASSERT(lo[10] >= 1, "a survivor's preparation thread never began a build ahead");
        MT_ASSERT(lo[3] == 0 && hi[3] == 0 && hi[7] == 0,
                  "no switch step ran for the generation whose build ahead lost a member, and "
                  "the recovery's communicators were built at its switch step");
        MT_ASSERT(lo[0] == 1 && lo[1] == 3 && hi[1] == 3 && lo[2] == hi[2],
                  "every survivor switched once, to the recovery (generation 3), at one step");
        MT_ASSERT(lo[4] >= FAIL_STEP + 3, "the survivors trained after the recovery");
    } else if (g_mode == FAULT_TRIM) {
        MT_ASSERT(hi[11] == 1,
                  "the leaving rank freed its pool before reporting done: tided did not commit "
                  "the generation while its trim waited (seen %lld)",
                  (long long)hi[11]);
        MT_ASSERT(lo[3] == 0 && lo[1] == 2 && hi[1] == 2 && lo[2] == hi[2],
                  "every rank switched to generation 2 at one step");
    } else if (g_mode == FAULT_PREPABORT) {
        MT_ASSERT(lo[9] >= 5,
                  "every rank built the aborted generation's communicators ahead (5: the "
                  "switch's, all, tp, dp, pp): at least %lld made on the preparation thread",
                  (long long)lo[9]);
        MT_ASSERT(lo[8] == 4 && hi[8] == 4,
                  "after tided aborted the generation, ranks held %lld..%lld communicators: "
                  "the old layout's 4 and nothing built ahead for the aborted one",
                  (long long)lo[8], (long long)hi[8]);
        MT_ASSERT(lo[3] == 0 && hi[3] == 0, "no switch failed (the aborted one never started)");
        MT_ASSERT(lo[0] == 1 && lo[1] == 3 && hi[1] == 3 && lo[2] == hi[2],
                  "every rank switched once, to the second resize (generation 3), at one step");
        MT_ASSERT(lo[7] == 1,
                  "the second resize switched with communicators built ahead on every rank");
    } else {
        MT_ASSERT(lo[4] == FAIL_STEP && hi[4] == FAIL_STEP, "steps before the failure");
        MT_ASSERT(lo[6] >= 2500 && hi[6] < 20000,
                  "tide_step_begin gave up after %lld..%lld ms (switch timeout 3000 ms)",
                  (long long)lo[6], (long long)hi[6]);
    }
    if (g_rank == 0) {
        printf("%s: tide_join %lld..%lld ms, switches %lld (%lld built ahead), failed switches "
               "%lld, last generation %lld at step %lld, gave up after %lld ms\n",
               argv[2], (long long)lo[5], (long long)hi[5], (long long)lo[0], (long long)lo[7],
               (long long)lo[3], (long long)lo[1], (long long)lo[2], (long long)lo[6]);
        printf("test_worker_faults: passed\n");
        fflush(stdout);
    }
    tide_destroy(&t);
    tide_collection_destroy(&coll);
    MPI_Comm_free(&surv);
    MPI_Finalize();
    if (is_root) {
        coord_stop(&g_coord, SIGTERM);
        coord_cleanup(&g_coord);
    }
    return 0;
}
