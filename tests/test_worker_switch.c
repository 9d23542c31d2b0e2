/*
 * Unit tests of the layout switch's phases (worker/switch_int.h) over a recording wrapper
 * of the mpi backend, without tided: a runtime is put together by hand on each process
 * (2 ranks under mpirun), the transaction's port is a recording one (tided's liveness
 * answers, the done and checkpoint reports, the commit point, connecting a pool launched
 * later), and the phases are run one by one:
 *   plain     (dp 2) -> (tp 2): every phase runs; the new shards equal the state bit for
 *             bit, the old layout's groups are gone and the new ones work.
 *   undo      the same switch failed after each phase in turn (and at the commit point,
 *             which tided aborted): the undo leaves the old layout, pool, communicators
 *             (alive and usable) and buffers (bit for bit) as they were, no communicator
 *             leaks, tided hears the failure, and the same switch then succeeds.
 *   inplace   the runtime owns the buffers: a failure before the state moves leaves them
 *             untouched; the switch then rebuilds them in place.
 *   rollback  a recovery from a checkpoint written here: every new shard is the
 *             checkpoint's and the step is its step; a checkpoint of the wrong step fails
 *             on every member, is reported, becomes TIDE_ERR_ABORTED, and the old state
 *             stays whole.
 *   aborted   tided aborts the generation (the control thread sets its abort word) while
 *             one rank waits in the switch communicator's creation for a late peer: the
 *             wait ends at once, the undo restores the old layout, and the generation can
 *             no longer be committed.
 *   streams   the GPU stream rule on a device stand-in (the mpi backend's operations
 *             declared of the device kind, recording the stream of each call and its
 *             thread): the preparation of a resize enqueues nothing on any stream (it
 *             agrees in host memory), and the switch gives every device call no stream
 *             (NULL: the backend's own stream of the calling thread, never CUDA's default
 *             one; test_nccl_streams checks that of nccl), built ahead or not.
 *   dead      a shrink where tided says the member that leaves is gone: its state comes
 *             from the replica, and the switch communicator leaves it out.
 *   join      two processes started as separate pools (job ranks 0 and 1 of a job of 2)
 *             are connected by the port's join (a merge over the launch's world): the
 *             joining rank receives its shards; failed after the pools phase, each rank
 *             is back on its own pool; a rank outside both layouts only connects.
 *   release   (dp 2) -> (dp 1): each side keeps a pool of its own; failed after the pools
 *             phase, both are back on the shared pool.
 * The recording backend counts the communicators alive in the process; a failing check
 * aborts both ranks.
 */
#include <mpi.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <tide/tide.h>

#include "ckpt/ckpt.h"
#include "collectives/collectives.h"
#include "core/alloc.h"
#include "core/clock.h"
#include "core/error.h"
#include "mpi_test.h"
#include "worker/retire.h"
#include "worker/switch_int.h"

#define LAYERS 2
#define JOB    "swtest"

static int g_rank, g_size;
static tide__gens_t *g_gens; /* the generations' abort words (the control thread's side) */

/* ---- the recording backend -------------------------------------------------------------- */

static tide_coll_backend_v1 rec;
static const tide_coll_backend_v1 *under;
static _Atomic int n_live; /* communicators alive in this process (the retirer's thread too) */

static tide_status rec_create(tide_coll_pool_t *pool, const tide_coll_comm_params *p,
                              tide_coll_comm_t **out)
{
    tide_status rc = under->comm_create(pool, p, out);
    if (rc == TIDE_OK && *out != NULL)
        n_live++;
    return rc;
}

static tide_status rec_split(tide_coll_comm_t *parent, int color, int key, const int *members,
                             int n, tide_coll_comm_t **out)
{
    tide_status rc = under->comm_split(parent, color, key, members, n, out);
    if (rc == TIDE_OK && *out != NULL)
        n_live++;
    return rc;
}

static void rec_destroy(tide_coll_comm_t *c)
{
    n_live--;
    under->comm_destroy(c);
}

static void rec_register(void)
{
    MT_OK(tide_coll_backend_find("mpi", &under));
    rec = *under;
    rec.name = "swrec";
    rec.comm_create = rec_create;
    rec.comm_split = rec_split;
    rec.comm_destroy = rec_destroy;
    MT_OK(tide_coll_backend_register(&rec));
}

/* A device stand-in: the mpi backend's operations on host memory, declared of the device
   kind (so that libtide and the collectives take their device paths), with a record of
   the stream every call that takes one was given, on the program's main thread or
   another. A stream libtide names would be a program's (the default one included); NULL
   is the backend's own stream for the calling thread, the rule nccl keeps. */
static tide_coll_backend_v1 dev;
static _Thread_local int is_main;
static int other_calls;          /* any call on another thread than the main one */
static int main_calls, main_own; /* calls on the main thread; given no stream (own) */
static char first_bad[96];

static void on_stream(const char *op, tide_coll_stream_t s)
{
    if (!is_main) {
        if (__atomic_add_fetch(&other_calls, 1, __ATOMIC_RELAXED) == 1)
            snprintf(first_bad, sizeof first_bad, "%s on a thread of libtide's", op);
        return;
    }
    main_calls++;
    if (s != NULL && main_calls - main_own == 1)
        snprintf(first_bad, sizeof first_bad, "%s on a stream libtide does not own (%p)", op, s);
    main_own += s == NULL;
}

static tide_status dev_alloc_on(int device, size_t bytes, void **out)
{
    (void)device;
    return under->mem_alloc(bytes, out);
}

static tide_status dev_zero(int device, void *ptr, size_t bytes)
{
    (void)device;
    memset(ptr, 0, bytes);
    return TIDE_OK;
}

static tide_status dev_p2p_start(tide_coll_comm_t *c, const tide_p2p_op *ops,
                                 const tide_p2p_peer *peers, size_t n, tide_coll_stream_t s,
                                 tide_coll_req_t **out)
{
    on_stream("p2p_start", s);
    return under->p2p_start(c, ops, peers, n, s, out);
}

static tide_status dev_allreduce(tide_coll_comm_t *c, const void *send, void *recv, size_t count,
                                 tide_dtype dt, tide_red_op op, tide_coll_stream_t s)
{
    on_stream("allreduce", s);
    return under->allreduce(c, send, recv, count, dt, op, s);
}

static tide_status dev_allgather(tide_coll_comm_t *c, const void *send, void *recv, size_t bytes,
                                 tide_coll_stream_t s)
{
    on_stream("allgather", s);
    return under->allgather(c, send, recv, bytes, s);
}

static tide_status dev_barrier(tide_coll_comm_t *c, tide_coll_stream_t s)
{
    on_stream("barrier", s);
    return under->barrier(c, s);
}

static tide_status dev_broadcast(tide_coll_comm_t *c, void *buf, size_t bytes, int root,
                                 tide_coll_stream_t s)
{
    on_stream("broadcast", s);
    return under->broadcast(c, buf, bytes, root, s);
}

static tide_status dev_copy2d(void *dst, size_t dp, const void *src, size_t sp, size_t w, size_t h,
                              tide_coll_stream_t s)
{
    on_stream("copy2d", s);
    return under->copy2d(dst, dp, src, sp, w, h, s);
}

static tide_status dev_copy_host(void *dst, const void *src, size_t bytes, int to_host,
                                 tide_coll_stream_t s)
{
    on_stream("copy_host", s);
    return under->copy_host(dst, src, bytes, to_host, s);
}

static tide_status dev_sync(tide_coll_comm_t *c, tide_coll_stream_t s)
{
    on_stream("stream_sync", s);
    return under->stream_sync(c, s);
}

static void dev_register(void)
{
    dev = rec;
    dev.name = "swdev";
    dev.mem_kind = TIDE_MEM_DEVICE;
    dev.mem_alloc_on = dev_alloc_on;
    dev.mem_zero = dev_zero;
    dev.p2p_start = dev_p2p_start;
    dev.allreduce = dev_allreduce;
    dev.allgather = dev_allgather;
    dev.barrier = dev_barrier;
    dev.broadcast = dev_broadcast;
    dev.copy2d = dev_copy2d;
    dev.copy_host = dev_copy_host;
    dev.stream_sync = dev_sync;
    MT_OK(tide_coll_backend_register(&dev));
}

/* A device stand-in whose destroys can be held back (the gate), so that a test sees the
   old layout's communicators outlive the switch that replaced them (retire.h): it
   records which thread binds the device and destroys, and reads each communicator's abort
   state as it goes (its generation word must still be there: ASan would see it freed). */
static tide_coll_backend_v1 ret;
static pthread_mutex_t gate_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t gate_cv = PTHREAD_COND_INITIALIZER;
static int gate_closed, off_main_destroys, off_main_binds, main_destroys, bound_device = -1;

static tide_status ret_bind(int device)
{
    pthread_mutex_lock(&gate_mu);
    if (!is_main) {
        off_main_binds++;
        bound_device = device;
    }
    pthread_mutex_unlock(&gate_mu);
    return TIDE_OK;
}

static void ret_destroy(tide_coll_comm_t *c)
{
    (void)tide_coll_comm_aborted(c); /* reads the word it watches */
    pthread_mutex_lock(&gate_mu);
    if (is_main) {
        main_destroys++;
    } else {
        off_main_destroys++;
        while (gate_closed)
            pthread_cond_wait(&gate_cv, &gate_mu);
    }
    pthread_mutex_unlock(&gate_mu);
    rec_destroy(c);
}

static void ret_register(void)
{
    ret = rec;
    ret.name = "swret";
    ret.device_bind = ret_bind;
    ret.comm_destroy = ret_destroy;
    MT_OK(tide_coll_backend_register(&ret));
}

static void gate(int closed)
{
    pthread_mutex_lock(&gate_mu);
    gate_closed = closed;
    pthread_cond_broadcast(&gate_cv);
    pthread_mutex_unlock(&gate_mu);
}

/* ---- the toy state ------------------------------------------------------------------------ */

/* w split over tp, m sharded over dp unless replicated, step everywhere. */
static tide_collection_t *make_collection(int replicated)
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
    snprintf(d.name, sizeof d.name, "m");
    d.ndim = 1;
    d.shape[0] = 16;
    d.shape[1] = 0;
    d.layer = 1;
    d.tp = TIDE_TP_REPLICATED;
    d.dp = replicated ? TIDE_DP_REPLICATED : TIDE_DP_SHARDED;
    MT_OK(tide_collection_add(c, &d));
    snprintf(d.name, sizeof d.name, "step");
    d.dtype = TIDE_I64;
    d.shape[0] = 1;
    d.layer = TIDE_LAYER_ALL;
    d.dp = TIDE_DP_REPLICATED;
    MT_OK(tide_collection_add(c, &d));
    return c;
}

/* The full tensor i after s steps (malloc'd). */
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

static tide_layout_t *layout(int dp, int tp, int pp, const int32_t *workers)
{
    tide_layout_t *l = NULL;
    MT_OK(tide_layout_new(&l, dp, tp, pp, LAYERS, 1));
    for (size_t i = 0; i < tide_layout_size(l); i++)
        l->worker[i] = workers[i];
    return l;
}

/* ---- a runtime put together by hand ------------------------------------------------------- */

/* A runtime of job rank `rank` of `size` over pool (owned from here), on layout l (copied)
   of generation gen, holding the state after `step` steps; owned: the runtime owns the
   buffers. Builds l's groups: collective over l's members. */
static const char *g_backend = "swrec"; /* the backend rt_new gives a runtime */

static tide_t *rt_new(tide_coll_pool_t *pool, int rank, int size, const tide_collection_t *coll,
                      const tide_layout_t *l, uint64_t gen, int64_t step, int owned)
{
    tide_t *t = tide_calloc(1, sizeof *t);
    MT_ASSERT(t != NULL, "out of memory");
    tide_options_init(&t->opts);
    t->opts.switch_timeout_ms = 20000;
    t->opts.register_timeout_ms = 5000;
    t->plugin_grace = -1;
    tide_msg_init(&t->pending, TIDE_MSG_NONE);
    tide_msg_init(&t->plugin, TIDE_MSG_NONE);
    t->pool = pool;
    t->rank = rank;
    t->size = size;
    MT_ASSERT(MPI_Comm_dup(tide_coll_pool_comm(pool), &t->end_comm) == MPI_SUCCESS, "dup");
    MT_OK(tide_coll_backend_find(g_backend, &t->be));
    t->coord_ids = tide_calloc((size_t)size, sizeof *t->coord_ids);
    for (int r = 0; r < size; r++)
        t->coord_ids[r] = tide_coll_pool_comm_rank(pool, r) >= 0 ? 100 + r : -1;
    snprintf(t->job, sizeof t->job, "%s", JOB);
    t->coll = coll;
    t->n_tensors = tide_collection_size(coll);
    MT_OK(tide_layout_copy(&t->layout, l));
    tide__fill_view(&t->view, gen, t->layout, rank, step);
    MT_OK(tide_mem_pool_new(&t->mem, t->be, 0));
    t->moved = tide_calloc(t->n_tensors, 1);
    void **b = NULL;
    MT_OK(tide_alloc_buffers(t, &t->view, &b));
    t->bufs = b;
    shards(coll, &t->view, t->bufs, step, 1, "");
    t->owned = owned;
    t->run_word = tide__gens_get(g_gens, gen);
    if (t->view.member) {
        tide_coll_comm_t *g[4];
        tide__group_ctx gc = {t->be, t->pool, 20000, tide__gen_word(t->run_word)};
        MT_OK(tide__build_groups(&gc, t->layout, &t->view, NULL, 0, g));
        t->c_all = g[0];
        t->c_tp = g[1];
        t->c_dp = g[2];
        t->c_pp = g[3];
    }
    return t;
}

/* The runtime's buffers after it: the program's are freed here unless the runtime owns
   them (tide_destroy frees those). */
static void rt_destroy(tide_t **t_p)
{
    tide_t *t = *t_p;
    if (!t->owned)
        for (size_t i = 0; i < t->n_tensors; i++)
            tide__free_buffer(t, t->bufs[i]);
    if (!t->owned)
        memset(t->bufs, 0, t->n_tensors * sizeof *t->bufs);
    tide_destroy(t_p);
}

/* An allreduce over the current all: the groups work. */
static void groups_work(tide_t *t, const char *when)
{
    if (!t->view.member)
        return;
    int32_t one = 1, sum = 0;
    MT_OK(tide_coll_allreduce(t->c_all, &one, &sum, 1, TIDE_I32, TIDE_RED_SUM, NULL));
    MT_ASSERT(sum == (int32_t)tide_layout_size(t->layout), "%s: allreduce over all gave %d", when,
              (int)sum);
}

/* ---- the recording port ------------------------------------------------------------------ */

typedef struct port_rec {
    tide_t *t;
    int gone[8];  /* job ranks tided reports gone */
    int liveness; /* questions asked */
    int dones;    /* done reports */
    tide_status done_rc;
    uint64_t done_gen;
    int loads_failed;
    int commits, fails;
    int refuse_commit; /* tided aborted the generation while this rank switched */
    int64_t completed; /* the agreement's steps completed */
    int joins, adopted;
} port_rec;

static tide_status p_liveness(void *ctx, const int32_t *ranks, uint32_t n, uint8_t *alive)
{
    port_rec *p = ctx;
    p->liveness++;
    for (uint32_t i = 0; i < n; i++) {
        MT_ASSERT(i == 0 || ranks[i] > ranks[i - 1], "liveness asks sorted, distinct ranks");
        alive[i] = !p->gone[ranks[i]];
    }
    return TIDE_OK;
}

/* The two launches connect: one pool over both processes, numbered by job rank. */
static tide_status p_join(void *ctx, const tide__join_req *jr, const int *cancel,
                          tide__join_result *out)
{
    (void)cancel;
    port_rec *p = ctx;
    p->joins++;
    int prank[2] = {0, 1};
    MT_OK(tide_coll_pool_new_ranked(&out->pool, MPI_COMM_WORLD, prank, jr->world));
    MT_ASSERT(MPI_Comm_dup(MPI_COMM_WORLD, &out->end_comm) == MPI_SUCCESS, "dup");
    out->ids = tide_calloc((size_t)jr->world, sizeof *out->ids);
    for (int32_t r = 0; r < jr->world; r++)
        out->ids[r] = 100 + r;
    return TIDE_OK;
}

static void p_done(void *ctx, uint64_t gen, tide_status rc, uint64_t bytes, double ms)
{
    (void)bytes;
    (void)ms;
    port_rec *p = ctx;
    p->dones++;
    p->done_gen = gen;
    p->done_rc = rc;
}

static void p_load_failed(void *ctx, const tide_proto_saved_t *m)
{
    port_rec *p = ctx;
    MT_ASSERT(m->code != 0 && m->reason[0] != '\0' && strcmp(m->job, JOB) == 0,
              "a failed load names its code and reason");
    p->loads_failed++;
}

static tide_status p_commit(void *ctx, uint64_t gen, int rollback, int64_t rb_step,
                            void (*install)(void *arg), void *arg, int64_t *step)
{
    port_rec *p = ctx;
    if (p->refuse_commit)
        return tide_errorf(TIDE_ERR_ABORTED, "tided aborted generation %llu (test)",
                           (unsigned long long)gen);
    install(arg);
    p->commits++;
    if (rollback)
        p->completed = rb_step;
    *step = p->completed;
    return TIDE_OK;
}

static void p_failed(void *ctx, uint64_t gen)
{
    (void)gen;
    port_rec *p = ctx;
    p->fails++;
}

static void p_adopted(void *ctx)
{
    port_rec *p = ctx;
    p->adopted++;
}

static tide__switch_port port_of(port_rec *p)
{
    tide__switch_port port = {p,        p_liveness, p_join,   p_done, p_load_failed,
                              p_commit, p_failed,   p_adopted};
    return port;
}

/* ---- running a switch --------------------------------------------------------------------- */

typedef tide_status (*phase_fn)(tide__switch *tx);
static const phase_fn phases[] = {tide__switch_pools,        tide__switch_participants,
                                  tide__switch_communicator, tide__switch_state,
                                  tide__switch_groups,       tide__switch_commit};
static const char *const phase_names[] = {"pools", "participants", "communicator",
                                          "state", "groups",       "commit"};
#define N_PHASES 6

/* The intent of generation gen from prev to next (copied). */
static tide__intent intent(uint64_t gen, const tide_layout_t *prev, const tide_layout_t *next,
                           int old_member)
{
    tide__intent in;
    memset(&in, 0, sizeof in);
    in.gen = gen;
    MT_OK(tide_layout_copy(&in.prev, prev));
    MT_OK(tide_layout_copy(&in.next, next));
    in.old_member = old_member;
    return in;
}

/* Runs the phases of a switch of t to in; stop >= 0: the phases before phase `stop` run,
   then the switch fails there with `inject`. Returns what tide_reshard would. */
static tide_status run_switch(tide_t *t, tide__intent *in, port_rec *p, void *const *new_bufs,
                              int stop, tide_status inject, tide_reshard_stats *st)
{
    tide__switch_port port = port_of(p);
    tide__switch tx;
    t->has_next = 1;
    tide__gen_t *word = tide__gens_get(g_gens, in->gen);
    tide__switch_begin(&tx, t, in, word, &port, new_bufs);
    tide_status rc = TIDE_OK;
    for (int k = 0; k < N_PHASES && rc == TIDE_OK; k++) {
        if (k == stop) {
            rc = tide_errorf(inject, "injected before phase %s", phase_names[k]);
            break;
        }
        rc = phases[k](&tx);
    }
    if (rc != TIDE_OK)
        rc = tide__switch_undo(&tx, rc);
    tide__switch_end(&tx, rc == TIDE_OK ? st : NULL);
    if (rc == TIDE_OK) { /* the runtime's port keeps the new generation's word for its groups */
        tide__gen_put(&t->run_word);
        t->run_word = word;
    } else {
        tide__gen_put(&word);
    }
    return rc;
}

/* New buffers for in's layout on this rank (the program's, not the runtime's). */
static void **new_buffers(tide_t *t, const tide_layout_t *next, uint64_t gen)
{
    tide_view v;
    tide__fill_view(&v, gen, next, t->rank, 0);
    void **b = NULL;
    MT_OK(tide_alloc_buffers(t, &v, &b));
    return b;
}

/* After a switch to the program's buffers nb: the buffers it replaced (old, one per
   tensor) go back, and nb's table goes (the runtime holds its buffers now). */
static void free_replaced(const tide_t *t, void *const *old, void **nb)
{
    for (size_t i = 0; i < t->n_tensors; i++)
        tide__free_buffer(t, old[i]);
    tide_free(nb);
}

/* What a failed switch must leave: the old layout (the same object, the same contents),
   pool, communicators (the same, alive, working) and buffers (the same, bit for bit). */
typedef struct snapshot {
    const tide_layout_t *layout;
    int32_t workers[8];
    tide_coll_pool_t *pool;
    MPI_Comm end_comm;
    int size, live;
    tide_coll_comm_t *c[4];
    void *bufs[8];
} snapshot;

static snapshot snap(const tide_t *t)
{
    snapshot s;
    memset(&s, 0, sizeof s);
    s.layout = t->layout;
    memcpy(s.workers, t->layout->worker, tide_layout_size(t->layout) * sizeof *s.workers);
    s.pool = t->pool;
    s.end_comm = t->end_comm;
    s.size = t->size;
    s.live = n_live;
    s.c[0] = t->c_all;
    s.c[1] = t->c_tp;
    s.c[2] = t->c_dp;
    s.c[3] = t->c_pp;
    memcpy(s.bufs, t->bufs, t->n_tensors * sizeof *t->bufs);
    return s;
}

static void check_intact(tide_t *t, const snapshot *s, int64_t step, const char *when)
{
    MT_ASSERT(t->layout == s->layout &&
                  memcmp(t->layout->worker, s->workers,
                         tide_layout_size(t->layout) * sizeof *s->workers) == 0,
              "%s: the layout changed", when);
    MT_ASSERT(t->pool == s->pool && t->end_comm == s->end_comm && t->size == s->size,
              "%s: the pool changed", when);
    const tide_coll_comm_t *c[4] = {t->c_all, t->c_tp, t->c_dp, t->c_pp};
    for (int k = 0; k < 4; k++)
        MT_ASSERT(c[k] == s->c[k] && (c[k] == NULL || !tide_coll_comm_aborted(c[k])),
                  "%s: group %d changed or died", when, k);
    MT_ASSERT(n_live == s->live, "%s: %d communicators alive, %d before", when, n_live, s->live);
    MT_ASSERT(memcmp(t->bufs, s->bufs, t->n_tensors * sizeof *t->bufs) == 0,
              "%s: the buffers changed", when);
    MT_ASSERT(!t->has_next, "%s: the switch is still pending in the runtime", when);
    shards(t->coll, &t->view, t->bufs, step, 0, when);
    groups_work(t, when);
}

static tide_coll_pool_t *world_pool(void)
{
    tide_coll_pool_t *p = NULL;
    MT_OK(tide_coll_pool_new(&p, MPI_COMM_WORLD));
    return p;
}

/* ---- the tests ---------------------------------------------------------------------------- */

static const int32_t W01[2] = {0, 1}, W0[1] = {0};

static void test_plain(const tide_collection_t *coll)
{
    tide_layout_t *dp2 = layout(2, 1, 1, W01), *tp2 = layout(1, 2, 1, W01);
    tide_t *t = rt_new(world_pool(), g_rank, g_size, coll, dp2, 1, 5, 0);
    port_rec p = {.t = t, .completed = 5};
    void **nb = new_buffers(t, tp2, 2), *old[8];
    memcpy(old, t->bufs, t->n_tensors * sizeof *old);
    tide__intent in = intent(2, dp2, tp2, 1);
    tide_reshard_stats st;
    MT_OK(run_switch(t, &in, &p, nb, -1, TIDE_OK, &st));
    MT_ASSERT(p.commits == 1 && p.fails == 0 && p.dones == 1 && p.done_rc == TIDE_OK &&
                  p.done_gen == 2 && p.liveness == 0,
              "plain: commit %d, fails %d, dones %d (rc %d), liveness %d", p.commits, p.fails,
              p.dones, (int)p.done_rc, p.liveness);
    MT_ASSERT(t->view.generation == 2 && t->view.step == 5 && t->view.member &&
                  t->view.tp_rank == g_rank,
              "plain: the view is not the new layout's");
    MT_ASSERT(t->bufs[0] == nb[0], "plain: the new buffers are the runtime's");
    shards(coll, &t->view, t->bufs, 5, 0, "plain: after the switch");
    MT_ASSERT(n_live == 4, "plain: %d communicators alive after the switch (4 expected)", n_live);
    MT_ASSERT(st.total_ms > 0 && st.bytes_sent + st.bytes_local > 0, "plain: no statistics");
    groups_work(t, "plain: after the switch");
    free_replaced(t, old, nb);
    rt_destroy(&t);
    MT_ASSERT(n_live == 0, "plain: %d communicators leaked", n_live);
    tide_layout_destroy(&dp2);
    tide_layout_destroy(&tp2);
}

/* The switch (dp 2) -> (tp 2) fails before phase `stop` (N_PHASES: at the commit point,
   tided having aborted it), is undone, then runs again and succeeds. */
static void undo_once(const tide_collection_t *coll, int stop, int owned)
{
    tide_layout_t *dp2 = layout(2, 1, 1, W01), *tp2 = layout(1, 2, 1, W01);
    tide_t *t = rt_new(world_pool(), g_rank, g_size, coll, dp2, 1, 7, owned);
    port_rec p = {.t = t, .completed = 7};
    char when[96];
    snprintf(when, sizeof when, "%s undo before %s", owned ? "in place" : "given buffers",
             stop < N_PHASES ? phase_names[stop] : "the commit's end");
    snapshot s = snap(t);
    void **nb = owned ? NULL : new_buffers(t, tp2, 2);
    tide__intent in = intent(2, dp2, tp2, 1);
    p.refuse_commit = stop == N_PHASES;
    tide_status rc =
        run_switch(t, &in, &p, nb, stop < N_PHASES ? stop : -1, TIDE_ERR_TIMEOUT, NULL);
    tide_status want = stop == N_PHASES ? TIDE_ERR_ABORTED : TIDE_ERR_TIMEOUT;
    MT_ASSERT(rc == want, "%s: %s (%s), want %s", when, tide_strerror(rc), tide_last_error(),
              tide_strerror(want));
    MT_ASSERT(p.fails == 1 && p.dones == 1 && p.done_rc == want && p.commits == 0,
              "%s: fails %d, dones %d (rc %d), commits %d", when, p.fails, p.dones, (int)p.done_rc,
              p.commits);
    check_intact(t, &s, 7, when);
    /* the old layout goes on, and the same switch then goes through */
    p.refuse_commit = 0;
    in = intent(2, dp2, tp2, 1);
    MT_OK(run_switch(t, &in, &p, nb, -1, TIDE_OK, NULL));
    shards(coll, &t->view, t->bufs, 7, 0, when);
    groups_work(t, when);
    if (!owned)
        for (size_t i = 0; i < t->n_tensors; i++)
            tide__free_buffer(t, s.bufs[i]);
    tide_free(nb);
    rt_destroy(&t);
    MT_ASSERT(n_live == 0, "%s: %d communicators leaked", when, n_live);
    tide_layout_destroy(&dp2);
    tide_layout_destroy(&tp2);
}

static void test_undo(const tide_collection_t *coll)
{
    for (int stop = 0; stop <= N_PHASES; stop++)
        undo_once(coll, stop, 0);
    /* in place, the state phase rebuilds the old buffers: failures before it only */
    for (int stop = 0; stop <= 3; stop++)
        undo_once(coll, stop, 1);
}

typedef struct raiser {
    uint64_t gen;
    int ms;
} raiser;

static void *raise_later(void *arg)
{
    raiser *r = arg;
    usleep((useconds_t)r->ms * 1000);
    tide__gens_abort(g_gens, r->gen); /* as the control thread on tided's abort */
    return NULL;
}

/* tided aborts the generation while its switch communicator is being made: rank 1 waits
   in the creation for rank 0, which is late; each process's control thread aborts the
   generation (its word) after 300 ms: that ends rank 1's wait at once, rank 0's creation
   (begun after the abort) fails at once, and the undo leaves both in the old layout. The
   commit of an aborted generation fails too. */
static void test_aborted(const tide_collection_t *coll)
{
    tide_layout_t *dp2 = layout(2, 1, 1, W01), *tp2 = layout(1, 2, 1, W01);
    tide_t *t = rt_new(world_pool(), g_rank, g_size, coll, dp2, 1, 3, 0);
    port_rec p = {.t = t, .completed = 3};
    snapshot s = snap(t);
    void **nb = new_buffers(t, tp2, 50);
    tide__intent in = intent(50, dp2, tp2, 1);
    tide__gen_t *word = tide__gens_get(g_gens, 50);
    tide__switch_port port = port_of(&p);
    tide__switch tx;
    t->has_next = 1;
    tide__switch_begin(&tx, t, &in, word, &port, nb);
    MT_OK(tide__switch_pools(&tx));
    MT_OK(tide__switch_participants(&tx));
    raiser r = {50, 300};
    pthread_t th;
    pthread_create(&th, NULL, raise_later, &r); /* each process's control thread */
    if (g_rank == 0)
        usleep(600 * 1000); /* late: rank 1 waits for it in the handshake */
    uint64_t t0 = tide_now_ns();
    tide_status rc = tide__switch_communicator(&tx);
    double ms = (double)(tide_now_ns() - t0) / 1e6;
    pthread_join(th, NULL);
    MT_ASSERT(rc == TIDE_ERR_ABORTED, "aborted: the creation returned %s (%s)", tide_strerror(rc),
              tide_last_error());
    MT_ASSERT(ms < 1500, "aborted: the creation ended %.0f ms after it began", ms);
    MT_ASSERT(tide__gen_get_state(word) == TIDE__GEN_ABORTED && tide__gen_aborted(word),
              "aborted: the word");
    rc = tide__switch_undo(&tx, rc);
    tide__switch_end(&tx, NULL);
    MT_ASSERT(rc == TIDE_ERR_ABORTED && p.fails == 1 && p.done_rc == TIDE_ERR_ABORTED,
              "aborted: the failure");
    check_intact(t, &s, 3, "aborted while its communicator was made");
    MT_ASSERT(!tide__gen_commit(word), "an aborted generation cannot be committed");
    tide__gen_put(&word);
    for (size_t i = 0; i < t->n_tensors; i++)
        tide__free_buffer(t, nb[i]);
    tide_free(nb);
    rt_destroy(&t);
    MT_ASSERT(n_live == 0, "aborted: %d communicators leaked", n_live);
    tide_layout_destroy(&dp2);
    tide_layout_destroy(&tp2);
}

/* tided's layout message of generation gen from prev to next (its arrays borrowed). */
static void proto_layout(tide_proto_layout_t *out, uint64_t gen, const tide_layout_t *l)
{
    memset(out, 0, sizeof *out);
    out->gen = gen;
    out->dp = l->dp;
    out->tp = l->tp;
    out->pp = l->pp;
    out->num_layers = l->num_layers;
    out->micro_batches = l->micro_batches;
    out->stage_start = l->stage_start;
    out->worker = l->worker;
}

/* The streams rule (issue 27), on the device stand-in: the preparation of a resize (its
   own thread, while the old layout would train) builds the switch's communicators and
   agrees that every participant has them without enqueueing anything on any stream (no
   device collective that could interleave with the training thread's), and the switch
   then takes them and does all of its device work on the backend's own stream of its
   thread, naming none; so does a switch that builds its groups at the switch step. */
static void test_streams(const tide_collection_t *coll)
{
    tide_layout_t *dp2 = layout(2, 1, 1, W01), *tp2 = layout(1, 2, 1, W01);
    g_backend = "swdev";
    tide_t *t = rt_new(world_pool(), g_rank, g_size, coll, dp2, 1, 4, 0);
    t->multi = 1; /* MPI_THREAD_MULTIPLE everywhere: built ahead */
    MT_OK(tide__prep_new(&t->prep, g_gens));
    tide__rebase(t);
    tide_msg_t lm;
    tide_msg_init(&lm, TIDE_MSG_LAYOUT);
    snprintf(lm.u.layout.job, sizeof lm.u.layout.job, "%s", JOB);
    lm.u.layout.has_prev = 1;
    lm.u.layout.world = g_size;
    proto_layout(&lm.u.layout.layout, 60, tp2);
    proto_layout(&lm.u.layout.prev, 1, dp2);
    main_calls = main_own = 0;
    __atomic_store_n(&other_calls, 0, __ATOMIC_RELAXED);
    tide__prep_start(t->prep, 60, &lm.u.layout);
    tide__prep_wait(t->prep, 60);
    MT_ASSERT(__atomic_load_n(&other_calls, __ATOMIC_RELAXED) == 0,
              "the preparation enqueued device work: %s", first_bad);
    port_rec p = {.t = t, .completed = 4};
    void **nb = new_buffers(t, tp2, 60), *old[8];
    memcpy(old, t->bufs, t->n_tensors * sizeof *old);
    tide__intent in = intent(60, dp2, tp2, 1);
    tide_reshard_stats st;
    MT_OK(run_switch(t, &in, &p, nb, -1, TIDE_OK, &st));
    MT_ASSERT(st.prepared, "the switch took what the preparation built");
    shards(coll, &t->view, t->bufs, 4, 0, "streams: after the prepared switch");
    MT_ASSERT(main_calls > 0 && main_own == main_calls,
              "the switch's device work ran on libtide's own stream (%d of %d calls; %s)", main_own,
              main_calls, first_bad);
    /* back, built at the switch step: the groups' splits agree in host memory */
    free_replaced(t, old, nb);
    nb = new_buffers(t, dp2, 61);
    memcpy(old, t->bufs, t->n_tensors * sizeof *old);
    t->multi = 0;
    tide__rebase(t);
    main_calls = main_own = 0;
    in = intent(61, tp2, dp2, 1);
    MT_OK(run_switch(t, &in, &p, nb, -1, TIDE_OK, &st));
    MT_ASSERT(!st.prepared, "built at the switch step");
    shards(coll, &t->view, t->bufs, 4, 0, "streams: after the switch");
    MT_ASSERT(main_calls > 0 && main_own == main_calls,
              "the switch's device work ran on libtide's own stream (%d of %d; %s)", main_own,
              main_calls, first_bad);
    MT_ASSERT(__atomic_load_n(&other_calls, __ATOMIC_RELAXED) == 0, "%s", first_bad);
    free_replaced(t, old, nb);
    rt_destroy(&t);
    g_backend = "swrec";
    MT_ASSERT(n_live == 0, "streams: %d communicators leaked", n_live);
    tide_layout_destroy(&dp2);
    tide_layout_destroy(&tp2);
}

/* Writes the state after `step` steps of layout l as a checkpoint under root; its dir. */
static void write_ckpt(tide_t *t, const char *root, int64_t step, char *dir, size_t len)
{
    void **b = NULL;
    MT_OK(tide_alloc_buffers(t, &t->view, &b));
    shards(t->coll, &t->view, b, step, 1, "");
    tide_ckpt_save_req req;
    memset(&req, 0, sizeof req);
    req.root = root;
    req.layout = t->layout;
    req.coll = t->coll;
    req.p = t->view.pp_rank;
    req.d = t->view.dp_rank;
    req.t = t->view.tp_rank;
    req.step = step;
    req.save_id = 4242;
    req.publish = g_rank == 0;
    req.timeout_ms = 20000;
    req.bufs = b;
    MT_OK(tide_ckpt_save(&req));
    tide_free_buffers(t, &b);
    MPI_Barrier(MPI_COMM_WORLD);
    int64_t found = 0;
    MT_OK(tide_ckpt_find(root, INT64_MAX, dir, len, &found));
    MT_ASSERT(found == step, "checkpoint of step %lld found as %lld", (long long)step,
              (long long)found);
}

static void test_rollback(const tide_collection_t *coll, const char *root)
{
    tide_layout_t *dp2 = layout(2, 1, 1, W01), *tp2 = layout(1, 2, 1, W01);
    for (int owned = 0; owned <= 1; owned++) {
        tide_t *t = rt_new(world_pool(), g_rank, g_size, coll, dp2, 1, 3, owned);
        char dir[1024];
        write_ckpt(t, root, 3, dir, sizeof dir);
        /* the job trained on: the checkpoint is behind the live state */
        shards(coll, &t->view, t->bufs, 9, 1, "");
        port_rec p = {.t = t, .completed = 9};
        snapshot s = snap(t);
        /* a checkpoint that does not hold the step tided named fails on every member */
        void **nb = owned ? NULL : new_buffers(t, tp2, 2);
        tide__intent in = intent(2, dp2, tp2, 1);
        snprintf(in.ckpt, sizeof in.ckpt, "%s", dir);
        in.ckpt_step = 4;
        tide_status rc = run_switch(t, &in, &p, nb, -1, TIDE_OK, NULL);
        MT_ASSERT(rc == TIDE_ERR_ABORTED && strstr(tide_last_error(), "checkpoint before") != NULL,
                  "rollback of a wrong step: %s (%s)", tide_strerror(rc), tide_last_error());
        MT_ASSERT(p.loads_failed == 1 && p.done_rc == TIDE_ERR_INVALID && p.fails == 1,
                  "rollback of a wrong step: loads failed %d, done %d, fails %d", p.loads_failed,
                  (int)p.done_rc, p.fails);
        check_intact(t, &s, 9, "rollback of a wrong step");
        /* the right one: every shard from the checkpoint, and its step */
        in = intent(3, dp2, tp2, 1);
        snprintf(in.ckpt, sizeof in.ckpt, "%s", dir);
        in.ckpt_step = 3;
        MT_OK(run_switch(t, &in, &p, nb, -1, TIDE_OK, NULL));
        MT_ASSERT(t->view.step == 3 && t->view.generation == 3,
                  "rollback: step %lld, want the checkpoint's 3", (long long)t->view.step);
        shards(coll, &t->view, t->bufs, 3, 0, "rollback: after the switch");
        for (size_t i = 0; owned && i < t->n_tensors; i++)
            MT_ASSERT(!t->moved || t->moved[i], "rollback in place: tensor %zu not marked moved",
                      i);
        if (!owned)
            for (size_t i = 0; i < t->n_tensors; i++)
                tide__free_buffer(t, s.bufs[i]);
        tide_free(nb);
        rt_destroy(&t);
        MT_ASSERT(n_live == 0, "rollback: %d communicators leaked", n_live);
        MPI_Barrier(MPI_COMM_WORLD);
        if (g_rank == 0) {
            char cmd[1100];
            snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
            MT_ASSERT(system(cmd) == 0, "cannot remove %s", dir);
        }
        MPI_Barrier(MPI_COMM_WORLD);
    }
    tide_layout_destroy(&dp2);
    tide_layout_destroy(&tp2);
}

/* (dp 2) -> (dp 1) on rank 0 while tided says rank 1 is gone: rank 0 alone switches, from
   its replica (rank 1 takes no part: it stands for the dead). */
static void test_dead(const tide_collection_t *unused)
{
    (void)unused;
    tide_collection_t *coll = make_collection(1); /* rank 0 holds every byte */
    tide_layout_t *dp2 = layout(2, 1, 1, W01), *one = layout(1, 1, 1, W0);
    tide_t *t = rt_new(world_pool(), g_rank, g_size, coll, dp2, 1, 2, 0);
    if (g_rank == 0) {
        port_rec p = {.t = t, .completed = 2};
        p.gone[1] = 1;
        void **nb = new_buffers(t, one, 2);
        void *old[8];
        memcpy(old, t->bufs, t->n_tensors * sizeof *old);
        tide__intent in = intent(2, dp2, one, 1);
        MT_OK(run_switch(t, &in, &p, nb, -1, TIDE_OK, NULL));
        MT_ASSERT(p.liveness == 1, "dead: tided was asked %d times", p.liveness);
        shards(coll, &t->view, t->bufs, 2, 0, "dead: after the switch");
        free_replaced(t, old, nb);
    }
    rt_destroy(&t);
    tide_layout_destroy(&dp2);
    tide_layout_destroy(&one);
    tide_collection_destroy(&coll);
}

/* Two launches: job rank r on a pool of its own process; rank 1 joins rank 0's job.
   stop >= 0: fails before that phase. bystander: the new layout keeps rank 0 alone. */
static void join_once(const tide_collection_t *coll, int stop, int bystander)
{
    tide_layout_t *one = layout(1, 1, 1, W0), *dp2 = layout(2, 1, 1, W01);
    const tide_layout_t *next = bystander ? one : dp2;
    int prank[1] = {g_rank};
    tide_coll_pool_t *own = NULL;
    MT_OK(tide_coll_pool_new_ranked(&own, MPI_COMM_SELF, prank, g_rank == 0 ? 1 : 2));
    tide_t *t = rt_new(own, g_rank, g_rank == 0 ? 1 : 2, coll, one, 1, 4, 0);
    port_rec p = {.t = t, .completed = 4};
    snapshot s = snap(t);
    void **nb = new_buffers(t, next, 2);
    tide__intent in = intent(2, one, next, g_rank == 0);
    in.world = 2;
    in.n_join_old = in.n_join_new = 1;
    in.join_old = tide_calloc(1, sizeof *in.join_old);
    in.join_new = tide_calloc(1, sizeof *in.join_new);
    in.join_old[0] = 0;
    in.join_new[0] = 1;
    tide_status rc = run_switch(t, &in, &p, nb, stop, TIDE_ERR_TIMEOUT, NULL);
    if (stop >= 0) {
        MT_ASSERT(rc == TIDE_ERR_TIMEOUT && p.joins == (stop > 0), "join undo: %s",
                  tide_strerror(rc));
        check_intact(t, &s, 4, "join undone");
        tide_coll_pool_t *same = t->pool;
        MT_ASSERT(tide_coll_pool_comm_rank(same, 1 - g_rank) < 0,
                  "join undone: the other launch is still reachable");
    } else {
        MT_OK(rc);
        MT_ASSERT(t->size == 2 && tide_coll_pool_comm_rank(t->pool, 1 - g_rank) >= 0 &&
                      t->coord_ids[1 - g_rank] == 100 + (1 - g_rank),
                  "join: not connected");
        shards(coll, &t->view, t->bufs, 4, 0, "join: after the switch");
        MT_ASSERT(bystander ? (g_rank == 1) == !t->view.member : t->view.member,
                  "join: membership");
        for (size_t i = 0; i < t->n_tensors; i++)
            tide__free_buffer(t, s.bufs[i]);
    }
    tide_free(nb);
    rt_destroy(&t);
    MT_ASSERT(n_live == 0, "join: %d communicators leaked", n_live);
    tide_layout_destroy(&one);
    tide_layout_destroy(&dp2);
}

static void test_join(const tide_collection_t *coll)
{
    join_once(coll, -1, 0);
    join_once(coll, 1, 0); /* the pools connected, then it failed */
    join_once(coll, 2, 0);
    join_once(coll, -1, 1);
}

/* (dp 2) -> (dp 1): rank 1's launch leaves. stop >= 0: fails before that phase. */
static void release_once(const tide_collection_t *coll, int stop)
{
    tide_layout_t *dp2 = layout(2, 1, 1, W01), *one = layout(1, 1, 1, W0);
    tide_t *t = rt_new(world_pool(), g_rank, g_size, coll, dp2, 1, 6, 0);
    port_rec p = {.t = t, .completed = 6};
    snapshot s = snap(t);
    void **nb = new_buffers(t, one, 2);
    tide__intent in = intent(2, dp2, one, 1);
    in.n_stay = in.n_leave = 1;
    in.stay = tide_calloc(1, sizeof *in.stay);
    in.leave = tide_calloc(1, sizeof *in.leave);
    in.stay[0] = 0;
    in.leave[0] = 1;
    tide_status rc = run_switch(t, &in, &p, nb, stop, TIDE_ERR_TIMEOUT, NULL);
    if (stop >= 0) {
        MT_ASSERT(rc == TIDE_ERR_TIMEOUT, "release undo: %s", tide_strerror(rc));
        check_intact(t, &s, 6, "release undone");
        MT_ASSERT(tide_coll_pool_comm_rank(t->pool, 1 - g_rank) >= 0,
                  "release undone: the other side is unreachable");
    } else {
        MT_OK(rc);
        MT_ASSERT(tide_coll_pool_comm_rank(t->pool, 1 - g_rank) < 0 &&
                      t->coord_ids[1 - g_rank] == -1 && t->coord_ids[g_rank] == 100 + g_rank,
                  "release: the other side is still reachable");
        shards(coll, &t->view, t->bufs, 6, 0, "release: after the switch");
        MT_ASSERT(t->view.member == (g_rank == 0), "release: membership");
        for (size_t i = 0; i < t->n_tensors; i++)
            tide__free_buffer(t, s.bufs[i]);
    }
    tide_free(nb);
    rt_destroy(&t);
    MT_ASSERT(n_live == 0, "release: %d communicators leaked", n_live);
    tide_layout_destroy(&dp2);
    tide_layout_destroy(&one);
}

static void test_release(const tide_collection_t *coll)
{
    release_once(coll, -1);
    release_once(coll, 1);
    release_once(coll, 3);
}

/* On a device backend the old layout's communicators are destroyed on the retirer's
   thread (bound to the rank's device) after the switch returned: with their destroys held
   back, the switch commits, the new groups work, and the 4 old groups are still alive
   (the switch communicator went when the new all was split off it; built ahead, it would
   go with the old groups); let go, they are destroyed off the training thread, and
   nothing leaks when the runtime ends. A switch that replaces nothing it
   could retire (join, release, a dead member) destroys inline as before (the other
   tests, whose backend is a host one). */
static void test_retire(const tide_collection_t *coll)
{
    tide_layout_t *dp2 = layout(2, 1, 1, W01), *tp2 = layout(1, 2, 1, W01);
    g_backend = "swret";
    tide_t *t = rt_new(world_pool(), g_rank, g_size, coll, dp2, 1, 5, 0);
    g_backend = "swrec";
    MT_OK(tide__retire_new(&t->retire, t->be, 3));
    port_rec p = {.t = t, .completed = 5};
    void **nb = new_buffers(t, tp2, 2), *old[8];
    memcpy(old, t->bufs, t->n_tensors * sizeof *old);
    tide__intent in = intent(2, dp2, tp2, 1);
    tide_reshard_stats st;
    gate(1);
    MT_OK(run_switch(t, &in, &p, nb, -1, TIDE_OK, &st));
    MT_ASSERT(p.commits == 1 && t->view.generation == 2, "retire: the switch did not commit");
    MT_ASSERT(n_live == 8,
              "retire: %d communicators alive while the old ones are held back (4 new + 4 "
              "old expected)",
              (int)n_live);
    shards(coll, &t->view, t->bufs, 5, 0, "retire: after the switch");
    groups_work(t, "retire: while the old groups are being destroyed");
    gate(0);
    tide__retire_wait(t->retire);
    MT_ASSERT(n_live == 4, "retire: %d communicators alive once retired (4 expected)", (int)n_live);
    MT_ASSERT(off_main_destroys == 4 && main_destroys == 1,
              "retire: %d destroys on the retirer's thread, %d on the training thread (4, 1)",
              off_main_destroys, main_destroys);
    MT_ASSERT(off_main_binds == 1 && bound_device == 3,
              "retire: the retirer bound device %d %d times (3, once)", bound_device,
              off_main_binds);
    free_replaced(t, old, nb);
    rt_destroy(&t);
    MT_ASSERT(n_live == 0, "retire: %d communicators leaked", (int)n_live);
    tide_layout_destroy(&dp2);
    tide_layout_destroy(&tp2);
}

int main(int argc, char **argv)
{
    int level = 0;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &level);
    MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &g_size);
    MT_ASSERT(g_size == 2, "run with 2 ranks");
    MT_OK(tide__gens_new(&g_gens));
    rec_register();
    dev_register();
    ret_register();
    is_main = 1;
    tide_collection_t *coll = make_collection(0);
    char root[256];
    snprintf(root, sizeof root, "%s/tide-swtest-%d", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp",
             (int)getppid());
    struct {
        const char *name;
        void (*run)(const tide_collection_t *);
    } tests[] = {{"plain", test_plain},     {"undo", test_undo},    {"aborted", test_aborted},
                 {"streams", test_streams}, {"dead", test_dead},    {"join", test_join},
                 {"release", test_release}, {"retire", test_retire}};
    const char *only = argc > 1 ? argv[1] : NULL;
    for (size_t i = 0; i < sizeof tests / sizeof tests[0]; i++) {
        if (only != NULL && strcmp(only, tests[i].name) != 0)
            continue;
        tests[i].run(coll);
        mt_pass(tests[i].name);
    }
    if (only == NULL || strcmp(only, "rollback") == 0) {
        test_rollback(coll, root);
        mt_pass("rollback");
    }
    if (g_rank == 0) {
        char cmd[300];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
        if (system(cmd) != 0)
            fprintf(stderr, "could not remove %s\n", root);
    }
    tide_collection_destroy(&coll);
    tide__gens_destroy(&g_gens);
    mt_pass("test_worker_switch");
    MPI_Finalize();
    return 0;
}
