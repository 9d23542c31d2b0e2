/*
 * train_mlp: trains the tide_mlp model (Megatron-style MLP blocks) on the synthetic
 * next-token task. Two modes:
 *
 *   --tide        elastic: every rank joins tided's pool through libtide
 *                 (mpirun -np 8 train_mlp --tide --dp 2 --tp 2 --pp 2); the first
 *                 layout comes from the flags, later ones from `tidectl resize JOB`,
 *                 switched live at an agreed step (state resharded in place, no
 *                 restart, no step lost or repeated); ranks outside the layout wait
 *                 idle inside the runtime (and run offline work) until a layout
 *                 includes them. A rank that dies is recovered from: tided declares
 *                 it failed and the survivors go on in a layout without it (state
 *                 from data-parallel replicas); for that, launch with
 *                 `mpirun --enable-recovery --mca async_mpi_finalize 1` so that Open
 *                 MPI neither ends the job when the rank dies nor waits for it in
 *                 MPI_Finalize. The end of the run then involves only live ranks.
 *   (default)     standalone: one fixed layout over MPI, no tided needed; with
 *                 --ckpt-save / --ckpt-load it stops and resumes a run under another
 *                 layout through per-rank checkpoint files (checkpoint-restart).
 *
 * Worker id = MPI rank (tp fastest, then dp, then pp in the default placement). The
 * first rank of the current layout prints step, loss (the global mean of the batch,
 * identical on every rank), generation, layout and throughput, and appends "step loss"
 * lines to --loss-out and timing records to --trace-out (see trace_step).
 */
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/clock.h"
#include "core/error.h"
#include "core/log.h"
#include "core/opts.h"
#include "core/version.h"
#include "examples/mlp.h"
#include "examples/mlp_ckpt.h"
#include "examples/mlp_mpi.h"
#include "examples/mlp_statefile.h"
#include "examples/mlp_tide.h"

#define SUBSYS "train_mlp"

static int g_rank;

static void die(tide_status rc, const char *what)
{
    fprintf(stderr, "train_mlp: rank %d: %s: %s: %s\n", g_rank, what, tide_strerror(rc),
            tide_last_error());
    fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 2);
    exit(2);
}

#define RUN(expr, what)                                                                            \
    do {                                                                                           \
        tide_status run__rc = (expr);                                                              \
        if (run__rc != TIDE_OK)                                                                    \
            die(run__rc, what);                                                                    \
    } while (0)

static int local_rank(void)
{
    MPI_Comm node;
    int r = 0;
    if (MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node) !=
        MPI_SUCCESS)
        return 0;
    MPI_Comm_rank(node, &r);
    MPI_Comm_free(&node);
    return r;
}

/* Wall-clock time in microseconds: trace records of different processes (a relaunch)
 * are compared, so a monotonic per-process clock would not do. */
static int64_t wall_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

/* ---- output shared by both modes ------------------------------------------------------- */

typedef struct output {
    const char *loss_path, *trace_path;
    FILE *loss, *trace; /* opened for append on first use by the first rank of a layout */
    long long every, steps, pace_ms;
    int prepare; /* --tide: prepare new buffers before the switch step */
    int64_t batch;
    double first, last; /* losses of the first and last step this rank ran */
    int64_t last_step;  /* -1: ran none */
    double timed_s;     /* step seconds, warm-up steps excluded */
    long long timed_steps;
    const char *state_out; /* --state-out: the final full state, written by the first rank */
} output;

/* World rank 0 empties the output files before any step (appends follow). */
static void output_reset(const output *o)
{
    const char *paths[] = {o->loss_path, o->trace_path};
    for (int i = 0; g_rank == 0 && i < 2; i++) {
        if (paths[i] == NULL)
            continue;
        FILE *f = fopen(paths[i], "w");
        if (f == NULL)
            RUN(tide_errorf(TIDE_ERR_IO, "cannot write %s", paths[i]), "output file");
        fclose(f);
    }
}

static FILE *append(FILE **f, const char *path)
{
    if (*f == NULL && path != NULL) {
        *f = fopen(path, "a");
        if (*f == NULL)
            RUN(tide_errorf(TIDE_ERR_IO, "cannot append to %s", path), "output file");
    }
    return *f;
}

/*
 * One completed step on a member. The recorder (the layout's first rank, or with several
 * launches each launch's first member: is_launch_recorder) prints it and appends
 * "step loss" to --loss-out and "step S gen G start_us T0 end_us T1 loss L" to
 * --trace-out (wall clock, so that a relaunched run's records compare).
 */
static void record_step(output *o, int first_rank, uint64_t gen, const char *layout, int64_t step,
                        double loss, double secs, int64_t t0_us, int64_t t1_us, int warm)
{
    if (isnan(loss)) {
        /* finished alone after a peer failed: this rank never saw the batch's loss */
        o->last_step = step;
        return;
    }
    if (o->last_step < 0)
        o->first = loss;
    o->last = loss;
    o->last_step = step;
    if (warm) {
        o->timed_s += secs;
        o->timed_steps++;
    }
    if (!first_rank)
        return;
    FILE *f = append(&o->loss, o->loss_path);
    if (f != NULL) {
        fprintf(f, "%lld %.9g\n", (long long)step, loss);
        fflush(f);
    }
    f = append(&o->trace, o->trace_path);
    if (f != NULL) {
        fprintf(f, "step %lld gen %llu start_us %lld end_us %lld loss %.9g\n", (long long)step,
                (unsigned long long)gen, (long long)t0_us, (long long)t1_us, loss);
        fflush(f);
    }
    if (step % o->every == 0 || step + 1 == o->steps) {
        printf("step %5lld  loss %.6f  gen %llu  layout %s  %.1f samples/s\n", (long long)step,
               loss, (unsigned long long)gen, layout, secs > 0 ? (double)o->batch / secs : 0.0);
        fflush(stdout);
    }
}

static void output_close(output *o)
{
    if (o->loss != NULL)
        fclose(o->loss);
    if (o->trace != NULL)
        fclose(o->trace);
    o->loss = o->trace = NULL;
}

static void pace(const output *o, double secs)
{
    double left_ms = (double)o->pace_ms - secs * 1000.0;
    if (left_ms > 0)
        tide_sleep_ms((uint64_t)left_ms);
}

/*
 * After the run, collective over comm (the ranks that ran steps to the end): the last
 * step and its loss must be the same on every rank that ran it. comm's rank 0 prints
 * the summary; returns the exit code (the same on every rank of comm).
 */
static int summarize(output *o, int generations, MPI_Comm comm)
{
    int me = 0;
    MPI_Comm_rank(comm, &me);
    long long last = o->last_step, mx = -1;
    MPI_Allreduce(&last, &mx, 1, MPI_LONG_LONG, MPI_MAX, comm);
    int ran_last = mx >= 0 && last == mx;
    double lo = ran_last ? o->last : INFINITY, hi = ran_last ? o->last : -INFINITY;
    MPI_Allreduce(MPI_IN_PLACE, &lo, 1, MPI_DOUBLE, MPI_MIN, comm);
    MPI_Allreduce(MPI_IN_PLACE, &hi, 1, MPI_DOUBLE, MPI_MAX, comm);
    double sum[2] = {o->timed_s, (double)o->timed_steps}, tot[2] = {0, 0};
    MPI_Allreduce(sum, tot, 2, MPI_DOUBLE, MPI_SUM, comm);
    int code = mx >= 0 && lo != hi ? 1 : 0;
    if (me == 0 && mx >= 0) {
        printf("train_mlp: %lld steps done in %d generation%s; final loss %.6f, identical on every "
               "rank of the last layout: %s; %.2f steps/s (mean over warm steps)\n",
               mx + 1, generations, generations == 1 ? "" : "s", lo, lo == hi ? "yes" : "NO",
               tot[0] > 0 ? tot[1] / tot[0] : 0.0);
        fflush(stdout);
    }
    output_close(o);
    return code;
}

/* ---- checkpoints ------------------------------------------------------------------------ */

/* --ckpt-save ROOT, --ckpt-every, --ckpt-keep, --ckpt-async, --resume DIR. */
typedef struct ckpt_cfg {
    const char *root;   /* save under this root (NULL: no saves) */
    const char *resume; /* resume from the newest complete checkpoint under this (or NULL) */
    long long every;    /* also save after every this many steps (0: only at the end) */
    long long keep;     /* checkpoints kept under root */
    int async;          /* periodic saves on a background thread */
    uint64_t nonce;     /* this run's, the same on every rank: save ids of its saves */
    tide_ckpt_saver_t *saver;
    int saves;
    double blocked_s; /* training time the periodic saves took from the loop */
} ckpt_cfg;

static tide_mlp_ckpt_opts ckpt_opts(const ckpt_cfg *k, int64_t step)
{
    tide_mlp_ckpt_opts o = {k->nonce ^ ((uint64_t)step * 0x9e3779b97f4a7c15ull), (int)k->keep, 0};
    return o;
}

/* A periodic save after `done` steps (main thread; every rank of the layout). */
static void ckpt_periodic(ckpt_cfg *k, const tide_mlp_t *m, int32_t me, int64_t done, int64_t total)
{
    if (k->root == NULL || k->every <= 0 || done % k->every != 0 || done >= total)
        return;
    uint64_t t0 = tide_now_ns();
    tide_mlp_ckpt_opts o = ckpt_opts(k, done);
    if (k->async) {
        if (k->saver == NULL)
            RUN(tide_ckpt_saver_new(&k->saver), "checkpoint saver");
        RUN(tide_mlp_ckpt_save_async(k->saver, m, me, k->root, &o), "periodic checkpoint");
    } else
        RUN(tide_mlp_ckpt_save(m, me, k->root, &o), "periodic checkpoint");
    k->blocked_s += (double)(tide_now_ns() - t0) * 1e-9;
    k->saves++;
}

/*
 * --resume: every rank loads its part of the newest complete checkpoint; ranks read
 * different files, so they agree on whether all succeeded, and fall back together to
 * the checkpoint before a damaged one. Collective over MPI_COMM_WORLD. Returns the step.
 */
static int64_t ckpt_resume(const ckpt_cfg *k, tide_mlp_t *m)
{
    int64_t before = INT64_MAX;
    for (;;) {
        char path[4096];
        int64_t step = 0;
        RUN(tide_ckpt_find(k->resume, before, path, sizeof path, &step), "--resume");
        tide_status rc = tide_mlp_ckpt_load(m, g_rank, path, INT64_MAX, NULL);
        int bad = rc != TIDE_OK, any = 0;
        if (bad) {
            fprintf(stderr, "train_mlp: rank %d: checkpoint refused: %s: %s\n", g_rank,
                    tide_strerror(rc), tide_last_error());
            fflush(stderr);
        }
        MPI_Allreduce(&bad, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
        if (!any) {
            if (g_rank == 0) {
                printf("train_mlp: resumed at step %lld from %s\n", (long long)step, path);
                fflush(stdout);
            }
            return step;
        }
        if (g_rank == 0) {
            printf("train_mlp: checkpoint %s (step %lld) cannot be loaded; trying the one "
                   "before it\n",
                   path, (long long)step);
            fflush(stdout);
        }
        before = step;
    }
}

/* The final save (synchronous, after any periodic one is written) and the report. */
static void ckpt_final(ckpt_cfg *k, const tide_mlp_t *m, int32_t me, int first_rank)
{
    if (k->saver != NULL) {
        RUN(tide_ckpt_saver_wait(k->saver), "periodic checkpoint");
        tide_ckpt_saver_destroy(&k->saver);
    }
    if (k->root == NULL)
        return;
    uint64_t t0 = tide_now_ns();
    int64_t step = tide_mlp_active(m) ? tide_mlp_step_count(m) : 0;
    tide_mlp_ckpt_opts o = ckpt_opts(k, step);
    RUN(tide_mlp_ckpt_save(m, me, k->root, &o), "--ckpt-save");
    if (first_rank) {
        printf("train_mlp: checkpoint of step %lld written under %s in %.0f ms (this rank); "
               "%d periodic saves (%s) took %.3f s from the training loop\n",
               (long long)step, k->root, (double)(tide_now_ns() - t0) * 1e-6, k->saves,
               k->async ? "asynchronous" : "synchronous", k->blocked_s);
        fflush(stdout);
    }
}

/* The first rank: writes the gathered full state to --state-out and frees it. */
static void write_state(const output *o, const tide_collection_t *c, void **full)
{
    RUN(tide_mlp_state_write(o->state_out, c, full), "--state-out");
    printf("train_mlp: final state (%zu tensors) written to %s\n", tide_collection_size(c),
           o->state_out);
    fflush(stdout);
    tide_mlp_full_free(c, &full);
}

/* ---- standalone: one layout over MPI ------------------------------------------------------ */

static int run_standalone(const tide_mlp_config *cfg, tide_layout_t *layout, tide_mlp_device dev,
                          output *o, ckpt_cfg *ck)
{
    tide_mlp_t *model = NULL;
    tide_mlp_mpi_t *mpi = NULL;
    RUN(tide_mlp_new(&model, cfg, layout, g_rank, dev), "model");
    int64_t from = 0;
    if (ck->resume != NULL)
        from = ckpt_resume(ck, model);
    else
        RUN(tide_mlp_init(model), "model init");
    if (ck->root != NULL && ck->every > 0 && ck->async) {
        /* the writer's staging, touched before the loop: no save takes page faults from it */
        RUN(tide_ckpt_saver_new(&ck->saver), "checkpoint saver");
        RUN(tide_mlp_ckpt_reserve(ck->saver, model, g_rank), "checkpoint staging");
    }
    RUN(tide_mlp_mpi_new(&mpi, MPI_COMM_WORLD, layout), "MPI groups");
    char lbuf[256];
    tide_layout_format(layout, lbuf, sizeof lbuf);
    int active = tide_mlp_active(model);
    int first_rank = layout->worker[0] == g_rank;
    uint64_t loop0 = tide_now_ns();
    for (int64_t s = from; s < o->steps && active; s++) {
        double loss = 0.0;
        int64_t t0 = wall_us();
        uint64_t n0 = tide_now_ns();
        RUN(tide_mlp_step(model, tide_mlp_mpi_comm(mpi), &loss), "step");
        double dt = (double)(tide_now_ns() - n0) * 1e-9;
        /* the first step of a process pays for page faults and warm-up */
        record_step(o, first_rank, 0, lbuf, s, loss, dt, t0, wall_us(), s > from);
        pace(o, dt);
        ckpt_periodic(ck, model, g_rank, s + 1, o->steps);
    }
    double loop_s = (double)(tide_now_ns() - loop0) * 1e-9;
    if (first_rank && ck->root != NULL) {
        printf("train_mlp: training loop %.6f s for %lld steps\n", loop_s,
               (long long)(o->steps - from));
        fflush(stdout);
    }
    ckpt_final(ck, model, g_rank, first_rank);
    if (o->state_out != NULL) {
        void **full = NULL;
        RUN(tide_mlp_gather(model, MPI_COMM_WORLD, layout->worker[0], &full), "--state-out");
        if (full != NULL)
            write_state(o, tide_mlp_collection(model), full);
    }
    int code = summarize(o, 1, MPI_COMM_WORLD);
    tide_mlp_mpi_destroy(&mpi);
    tide_mlp_destroy(&model);
    return code;
}

/* ---- elastic: libtide ------------------------------------------------------------------------ */

typedef struct elastic {
    output *o;
    int64_t steps;
    int generations;
    int fresh; /* a switch happened since this rank's last step */
} elastic;

static int is_first_rank(tide_t *t)
{
    const tide_view *v = tide_view_get(t);
    return v->member && v->layout->worker[0] == tide_pool_rank(t);
}

/* Whether this rank records the steps of its launch (mpirun): the first of the layout's
   workers that this launch holds. One launch: the layout's first rank. After a job grew
   onto a later launch, each launch records the steps its members ran, so that a step
   survives in some launch's --loss-out when the host of the layout's first rank dies
   before writing it. */
static int is_launch_recorder(tide_t *t)
{
    const tide_view *v = tide_view_get(t);
    if (!v->member)
        return 0;
    int world = 1, me = tide_pool_rank(t);
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    int base = me - g_rank;
    size_t n = tide_layout_size(v->layout);
    for (size_t i = 0; i < n; i++) {
        int32_t w = v->layout->worker[i];
        if (w >= base && w < base + world)
            return w == me;
    }
    return 0;
}

static tide_status e_on_step(void *ctx, tide_t *t, const tide_mlp_t *m, int64_t step, double loss,
                             double secs)
{
    elastic *e = ctx;
    const tide_view *v = tide_view_get(t);
    char lbuf[256];
    tide_layout_format(v->layout, lbuf, sizeof lbuf);
    int64_t now = wall_us();
    /* the first step on new buffers pays for their page faults */
    int warm = !e->fresh && e->o->last_step == step - 1;
    e->fresh = 0;
    record_step(e->o, is_launch_recorder(t), v->generation, lbuf, step, loss, secs,
                now - (int64_t)(secs * 1e6), now, warm);
    pace(e->o, secs);
    return TIDE_OK;
}

static tide_status e_after_switch(void *ctx, tide_t *t, const tide_mlp_t *m,
                                  const tide_mlp_switch_stats *sw)
{
    elastic *e = ctx;
    const tide_view *v = tide_view_get(t);
    const tide_reshard_stats *st = &sw->rs;
    e->generations++;
    e->fresh = 1;
    /* every rank: where its part of the downtime went (ms), for resize_bench */
    FILE *rf = append(&e->o->trace, e->o->trace_path);
    if (rf != NULL) {
        fprintf(rf,
                "rank_switch gen %llu rank %d member %d wait %.3f alloc %.3f sync %.3f plan %.3f "
                "move %.3f groups %.3f teardown %.3f reshard %.3f adopt %.3f prepared %d "
                "prepare %.3f sent %llu recv %llu local %llu state_old %llu state_new %llu cap "
                "%llu peak_extra %llu no_room %llu spilled %llu fresh %llu join %.3f backend %s\n",
                (unsigned long long)v->generation, tide_pool_rank(t), v->member, st->wait_ms,
                sw->alloc_ms, st->sync_ms, st->plan_ms, st->move_ms, st->groups_ms, st->teardown_ms,
                st->total_ms, sw->adopt_ms, sw->prepared, sw->prepare_ms,
                (unsigned long long)st->bytes_sent, (unsigned long long)st->bytes_recv,
                (unsigned long long)st->bytes_local, (unsigned long long)st->state_old,
                (unsigned long long)st->state_new, (unsigned long long)st->staging_cap,
                (unsigned long long)st->peak_extra, (unsigned long long)st->no_room,
                (unsigned long long)st->bytes_spilled, (unsigned long long)st->fresh_bytes,
                st->join_ms, tide_backend_name(t));
        fflush(rf);
    }
    if (!is_first_rank(t))
        return TIDE_OK;
    char lbuf[256];
    tide_layout_format(v->layout, lbuf, sizeof lbuf);
    printf("train_mlp: generation %llu from step %lld: layout %s; switch %.1f ms (plan %.1f, move "
           "%.1f, comms %.1f), this rank sent %.2f MiB, received %.2f MiB, copied %.2f MiB\n",
           (unsigned long long)v->generation, (long long)v->step, lbuf, st->total_ms, st->plan_ms,
           st->move_ms, st->comm_ms, (double)st->bytes_sent / 1048576.0,
           (double)st->bytes_recv / 1048576.0, (double)st->bytes_local / 1048576.0);
    fflush(stdout);
    FILE *f = append(&e->o->trace, e->o->trace_path);
    if (f != NULL) {
        fprintf(f, "switch gen %llu step %lld total_ms %.3f move_ms %.3f at_us %lld\n",
                (unsigned long long)v->generation, (long long)v->step, st->total_ms, st->move_ms,
                (long long)wall_us());
        fflush(f);
    }
    return TIDE_OK;
}

static int e_done(void *ctx, const tide_view *v)
{
    const elastic *e = ctx;
    return v->step >= e->steps;
}

/*
 * An MPI communicator over the members of t's current layout, in layout order, created
 * among them only (MPI_Comm_create_group over tide_world: the job's processes, which span
 * several launches once a pool joined), so that ranks that died or left never take part;
 * MPI_COMM_NULL on a rank outside the layout.
 */
static tide_status members_comm(tide_t *t, MPI_Comm *out)
{
    const tide_view *v = tide_view_get(t);
    *out = MPI_COMM_NULL;
    if (!v->member)
        return TIDE_OK;
    size_t n = tide_layout_size(v->layout);
    int *ranks = malloc(n * sizeof *ranks);
    if (ranks == NULL)
        return tide_errorf(TIDE_ERR_NOMEM, "out of memory listing %zu members", n);
    for (size_t i = 0; i < n; i++)
        ranks[i] = tide_world_rank(t, v->layout->worker[i]);
    MPI_Group world, group;
    MPI_Comm_group(tide_world(t), &world);
    int rc = MPI_Group_incl(world, (int)n, ranks, &group);
    if (rc == MPI_SUCCESS) {
        rc = MPI_Comm_create_group(tide_world(t), group, 7201, out);
        MPI_Group_free(&group);
    }
    MPI_Group_free(&world);
    free(ranks);
    return rc == MPI_SUCCESS ? TIDE_OK
                             : tide_errorf(TIDE_ERR_BACKEND,
                                           "MPI_Comm_create_group over the %zu "
                                           "members of the last layout failed",
                                           n);
}

/* Collective over comm (the last layout's members): comm's rank 0 prints the members'
   pipeline bubble time and the part of it that offline task steps filled. */
static void summarize_bubbles(const tide_t *t, MPI_Comm comm)
{
    tide_bubble_stats bs;
    tide_bubble_stats_get(t, &bs);
    double mine[3] = {bs.bubble_ms, bs.filled_ms, (double)bs.task_steps}, tot[3] = {0, 0, 0};
    int me = 0, n = 0;
    MPI_Comm_rank(comm, &me);
    MPI_Comm_size(comm, &n);
    MPI_Reduce(mine, tot, 3, MPI_DOUBLE, MPI_SUM, 0, comm);
    if (me == 0 && tot[0] > 0) {
        printf("train_mlp: pipeline bubbles %.1f ms on %d ranks; offline task steps filled %.1f "
               "ms of them (%.1f%%, %.0f steps)\n",
               tot[0], n, tot[1], 100.0 * tot[1] / tot[0], tot[2]);
        fflush(stdout);
    }
}

/* --tide: the job's name and what it declares at launch (tide_options). */
typedef struct job_decl {
    const char *name;
    int min_gpus, max_gpus, priority; /* 0: none */
} job_decl;

static int run_tide(const tide_mlp_config *cfg, const char *endpoint, const job_decl *jd, int dp,
                    int tp, int pp, int micro, tide_mlp_device dev, output *o, const ckpt_cfg *ck)
{
    const char *job = jd->name;
    tide_options opt;
    tide_options_init(&opt);
    if (endpoint != NULL)
        opt.endpoint = endpoint;
    opt.min_gpus = jd->min_gpus; /* the flags' defaults are the same TIDE_* variables */
    opt.max_gpus = jd->max_gpus;
    opt.priority = jd->priority;
    if (dev == TIDE_MLP_CUDA && getenv("TIDE_BACKEND") == NULL)
        opt.backend = "nccl"; /* device buffers need the device backend */
    tide_collection_t *coll = NULL;
    RUN(tide_mlp_collection_new(cfg, &coll), "model collection");
    tide_t *t = NULL;
    RUN(tide_new(&t, &opt, MPI_COMM_WORLD), "tide_new (is tided running? --endpoint)");
    {
        /* every rank: the id an operator sees for it (tidectl status, drain, events) */
        char host[256] = "?";
        gethostname(host, sizeof host);
        host[sizeof host - 1] = '\0';
        printf("train_mlp: pool rank %d is worker %d on host %s device %d\n", tide_pool_rank(t),
               (int)tide_worker_id(t), host, tide_device(t));
        fflush(stdout);
    }
    char resume[4096];
    int64_t start = 0;
    if (ck->resume != NULL)
        RUN(tide_ckpt_find(ck->resume, INT64_MAX, resume, sizeof resume, &start), "--resume");
    /* what the model can run: tided then refuses a resize to anything else and recovers
       only to layouts it can (losing a rank of dp 4 with a batch of 16 in 4 micro-batches
       gives dp 2, not dp 3) */
    tide_fit_rule fit[TIDE_MLP_FIT_RULES];
    int n_fit = 0;
    RUN(tide_mlp_tide_fit(cfg, micro, fit, &n_fit), "model limits");
    tide_join_req jr = {job, coll, dp, tp, pp, micro, start, fit, n_fit};
    RUN(tide_join(t, &jr), "tide_join");
    const tide_view *v = tide_view_get(t);
    int32_t me = tide_pool_rank(t);
    tide_mlp_t *model = NULL;
    RUN(tide_mlp_new(&model, cfg, v->layout, me, dev), "model");
    if (v->member) {
        if (ck->resume != NULL) {
            RUN(tide_mlp_ckpt_load(model, me, resume, INT64_MAX, NULL), "--resume");
            if (v->layout->worker[0] == me) {
                printf("train_mlp: resumed at step %lld from %s\n", (long long)start, resume);
                fflush(stdout);
            }
        } else
            RUN(tide_mlp_init(model), "model init");
    }
    /* the runtime owns the state from here: switches rebuild it in place */
    RUN(tide_mlp_tide_give(t, model), "tide_give_buffers");
    if (is_first_rank(t)) {
        char lbuf[256];
        tide_layout_format(v->layout, lbuf, sizeof lbuf);
        printf("train_mlp: joined job %s at %s: generation %llu, layout %s, %d ranks (%d idle)\n",
               job, opt.endpoint, (unsigned long long)v->generation, lbuf, tide_pool_size(t),
               tide_pool_size(t) - (int)tide_layout_size(v->layout));
        fflush(stdout);
    }
    if (ck->root != NULL && ck->every > 0) /* libtide snapshots at tide_step_end */
        RUN(tide_checkpoint_every(t, ck->root, (int)ck->every, (int)ck->keep), "--ckpt-every");
    elastic e = {o, o->steps, 1, 1};
    tide_mlp_tide_hooks h = {&e, e_on_step, NULL, e_after_switch, e_done, !o->prepare, NULL};
    RUN(tide_mlp_tide_train(t, model, &h), "training");
    /* After a recovery MPI_COMM_WORLD still names the dead rank, and a collective over it
       would wait for that rank forever: the end of the run is agreed among the last
       layout's members only. Idle ranks (released by tide_finish) ran no final step. */
    MPI_Comm members = MPI_COMM_NULL;
    RUN(members_comm(t, &members), "communicator of the last layout");
    int code = 0;
    if (o->state_out != NULL && v->member) {
        void **full = NULL; /* the last layout's members: the survivors after a recovery */
        RUN(tide_mlp_tide_gather(t, model, v, &full), "--state-out");
        if (full != NULL)
            write_state(o, tide_mlp_collection(model), full);
    }
    if (members != MPI_COMM_NULL) {
        code = summarize(o, e.generations, members);
        summarize_bubbles(t, members);
    } else
        output_close(o);
    RUN(tide_checkpoint_wait(t), "periodic checkpoint");
    /* a periodic save of the last step already holds it (never rewrite a checkpoint) */
    if (ck->root != NULL && tide_mlp_active(model) &&
        (ck->every <= 0 || tide_mlp_step_count(model) % ck->every != 0)) {
        /* one save id over the last layout, which may span launches whose nonces differ
           (a pool that joined the job): its first member's */
        ckpt_cfg k = *ck;
        if (members != MPI_COMM_NULL)
            MPI_Bcast(&k.nonce, 1, MPI_UINT64_T, 0, members);
        tide_mlp_ckpt_opts so = ckpt_opts(&k, tide_mlp_step_count(model));
        RUN(tide_mlp_ckpt_save(model, me, ck->root, &so), "--ckpt-save");
    }
    /* every member is out of the runtime before one says bye (its bye ends the job) */
    if (members != MPI_COMM_NULL) {
        MPI_Barrier(members);
        MPI_Comm_free(&members);
    }
    tide_destroy(&t);
    tide_mlp_destroy(&model);
    tide_collection_destroy(&coll);
    return code;
}

int main(int argc, char **argv)
{
    int prov = 0;
    /* MULTIPLE: a job that grows onto a pool launched later connects the pools on a
       thread of libtide's (worker/join.c); otherwise only the main thread calls MPI */
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &prov);
    int size = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);

    tide_mlp_config cfg;
    tide_mlp_config_default(&cfg);
    long long layers, hidden, ffn, vocab, seq, batch, micro, steps, seed, dp, tp, pp, every,
        pace_ms;
    double lr;
    long long ckpt_every, ckpt_keep, min_gpus, max_gpus, priority;
    int zero1 = 0, tide = 0, prepare = 1, ckpt_async = 1;
    const char *stages = NULL, *device = NULL, *loss_out = NULL, *log_level = NULL,
               *trace_out = NULL, *state_out = NULL, *endpoint = NULL, *job = NULL,
               *ckpt_save = NULL, *ckpt_load = NULL;
    const tide_opt opts[] = {
        {"tide", "TIDE_MLP_TIDE", TIDE_OPT_BOOL, &tide, "0",
         "elastic mode: join tided through libtide (resize with tidectl)", 0, 0},
        {"endpoint", "TIDE_ENDPOINT", TIDE_OPT_STRING, &endpoint, NULL,
         "--tide: tided's endpoint (default tcp://127.0.0.1:5555)", 0, 0},
        {"job", "TIDE_MLP_JOB", TIDE_OPT_STRING, &job, "train_mlp", "--tide: online job name", 0,
         0},
        {"min-gpus", "TIDE_MIN_GPUS", TIDE_OPT_INT, &min_gpus, "0",
         "--tide: the fewest GPUs the job runs on; with --max-gpus, tided grows and shrinks it "
         "between them by itself (tidectl bounds; 0: no bounds)",
         0, 1 << 20},
        {"max-gpus", "TIDE_MAX_GPUS", TIDE_OPT_INT, &max_gpus, "0",
         "--tide: the most GPUs the job takes (0: no bounds)", 0, 1 << 20},
        {"priority", "TIDE_PRIORITY", TIDE_OPT_INT, &priority, "0",
         "--tide: the job's priority; a higher one takes GPUs from lower ones", 0, 100},
        {"layers", "TIDE_MLP_LAYERS", TIDE_OPT_INT, &layers, "4", "MLP blocks", 1, 100000},
        {"hidden", "TIDE_MLP_HIDDEN", TIDE_OPT_INT, &hidden, "64", "model width", 1, 1 << 20},
        {"ffn", "TIDE_MLP_FFN", TIDE_OPT_INT, &ffn, "256", "fc1 output width", 1, 1 << 22},
        {"vocab", "TIDE_MLP_VOCAB", TIDE_OPT_INT, &vocab, "64", "tokens", 2, 1 << 24},
        {"seq", "TIDE_MLP_SEQ", TIDE_OPT_INT, &seq, "16", "tokens per sample", 1, 1 << 20},
        {"global-batch", "TIDE_MLP_GLOBAL_BATCH", TIDE_OPT_INT, &batch, "32",
         "samples per step over all dp ranks", 1, 1 << 24},
        {"micro-batches", "TIDE_MLP_MICRO_BATCHES", TIDE_OPT_INT, &micro, "4",
         "micro-batches per step and dp rank", 1, 1 << 20},
        {"steps", "TIDE_MLP_STEPS", TIDE_OPT_INT, &steps, "30",
         "train until this many steps are done", 0, 1 << 30},
        {"lr", "TIDE_MLP_LR", TIDE_OPT_DOUBLE, &lr, "0.003", "Adam learning rate", 0, 0},
        {"seed", "TIDE_MLP_SEED", TIDE_OPT_INT, &seed, "1234", "model, task and data seed", 0,
         INT64_MAX},
        {"dp", "TIDE_MLP_DP", TIDE_OPT_INT, &dp, "1", "data-parallel degree (--tide: first)", 1,
         1 << 16},
        {"tp", "TIDE_MLP_TP", TIDE_OPT_INT, &tp, "1", "tensor-parallel degree (--tide: first)", 1,
         1 << 16},
        {"pp", "TIDE_MLP_PP", TIDE_OPT_INT, &pp, "1", "pipeline stages (--tide: first)", 1,
         1 << 16},
        {"stages", "TIDE_MLP_STAGES", TIDE_OPT_STRING, &stages, NULL,
         "layer ranges per stage, e.g. 0-2,3-3 (default: even; standalone only)", 0, 0},
        {"zero1", "TIDE_MLP_ZERO1", TIDE_OPT_BOOL, &zero1, "0",
         "shard Adam moments over dp (ZeRO-1)", 0, 0},
        {"device", "TIDE_MLP_DEVICE", TIDE_OPT_STRING, &device, "cpu", "cpu or cuda", 0, 0},
        {"print-every", "TIDE_MLP_PRINT_EVERY", TIDE_OPT_INT, &every, "1",
         "print every N steps (and the last)", 1, 1 << 30},
        {"pace-ms", "TIDE_MLP_PACE_MS", TIDE_OPT_INT, &pace_ms, "0",
         "sleep so that a step takes at least this long (ms; demos)", 0, 1 << 20},
        {"loss-out", "TIDE_MLP_LOSS_OUT", TIDE_OPT_STRING, &loss_out, NULL,
         "write 'step loss' lines here (first rank of the layout in each launch)", 0, 0},
        {"trace-out", "TIDE_MLP_TRACE_OUT", TIDE_OPT_STRING, &trace_out, NULL,
         "write step and switch timing records here (wall clock, us)", 0, 0},
        {"state-out", "TIDE_MLP_STATE_OUT", TIDE_OPT_STRING, &state_out, NULL,
         "after the last step, write the whole state here (first rank; compare two runs "
         "with mlp_state_diff)",
         0, 0},
        {"ckpt-save", "TIDE_MLP_CKPT_SAVE", TIDE_OPT_STRING, &ckpt_save, NULL,
         "after the last step, save a checkpoint under this root (ROOT/step-N)", 0, 0},
        {"ckpt-every", "TIDE_CKPT_EVERY", TIDE_OPT_INT, &ckpt_every, "0",
         "also save under --ckpt-save after every N steps (0: only at the end)", 0, 1 << 30},
        {"ckpt-keep", "TIDE_CKPT_KEEP", TIDE_OPT_INT, &ckpt_keep, "3",
         "complete checkpoints kept under --ckpt-save (older ones pruned; 0: all)", 0, 1 << 20},
        {"ckpt-async", "TIDE_CKPT_ASYNC", TIDE_OPT_BOOL, &ckpt_async, "1",
         "periodic saves written on a background thread while training goes on", 0, 0},
        {"resume", "TIDE_MLP_RESUME", TIDE_OPT_STRING, &ckpt_load, NULL,
         "resume from the newest complete checkpoint under this root or directory (any "
         "layout; a damaged one falls back to the one before)",
         0, 0},
        {"ckpt-load", NULL, TIDE_OPT_STRING, &ckpt_load, NULL, "same as --resume", 0, 0},
        {"prepare-switch", "TIDE_MLP_PREPARE_SWITCH", TIDE_OPT_BOOL, &prepare, "1",
         "--tide: allocate and first-touch the next layout's buffers while steps run "
         "(tide_set_prepare); 0: at the switch step",
         0, 0},
        {"log", "TIDE_LOG", TIDE_OPT_STRING, &log_level, NULL, "error, warn, info, debug", 0, 0},
        {NULL, NULL, 0, NULL, NULL, NULL, 0, 0},
    };
    int help = 0, npos = 0;
    tide_status rc = tide_opts_parse(opts, argc, argv, &npos, &help);
    if (rc == TIDE_OK && npos > 0)
        rc = tide_errorf(TIDE_ERR_INVALID, "unexpected argument '%s'", argv[1]);
    if (rc == TIDE_OK && log_level != NULL) {
        tide_log_level lv;
        rc = tide_log_parse_level(log_level, &lv);
        if (rc == TIDE_OK)
            tide_log_set_level(lv);
        else
            rc = tide_errorf(TIDE_ERR_INVALID, "--log '%s': expected error, warn, info, debug",
                             log_level);
    }
    if (rc == TIDE_OK && tide && stages != NULL)
        rc = tide_errorf(TIDE_ERR_INVALID, "--stages with --tide: the first layout splits the "
                                           "layers evenly; give uneven stages to `tidectl resize "
                                           "--stages`");
    if (rc == TIDE_OK && ckpt_every > 0 && ckpt_save == NULL)
        rc = tide_errorf(TIDE_ERR_INVALID, "--ckpt-every needs --ckpt-save ROOT");
    if (rc != TIDE_OK || help) {
        if (g_rank == 0 && rc == TIDE_OK && help == TIDE_OPTS_VERSION)
            tide_version_print(stdout, "train_mlp");
        else if (g_rank == 0) {
            if (rc != TIDE_OK)
                fprintf(stderr, "train_mlp: %s\n", tide_last_error());
            tide_opts_usage(rc != TIDE_OK ? stderr : stdout, "train_mlp",
                            "[--tide] [--dp N --tp N --pp N] [options]  (under mpirun)", opts);
        }
        MPI_Finalize();
        return rc != TIDE_OK ? 2 : 0;
    }
    if (g_rank == 0)
        tide_opts_log(SUBSYS, opts);

    cfg.layers = (int)layers;
    cfg.hidden = hidden;
    cfg.ffn = ffn;
    cfg.vocab = vocab;
    cfg.seq = seq;
    cfg.global_batch = batch;
    cfg.seed = (uint64_t)seed;
    cfg.lr = lr;
    cfg.zero1 = zero1;
    tide_mlp_device dev;
    RUN(tide_mlp_device_parse(device, &dev), "--device");
    RUN(tide_mlp_config_check(&cfg), "model flags");
    /* --tide: tided holds the launch that starts the job to its layout; a launch that
       joins the running job later (a grow onto new hosts) may be smaller than it */
    if (!tide && (long long)size < dp * tp * pp) {
        RUN(tide_errorf(TIDE_ERR_INVALID,
                        "layout dp %lld x tp %lld x pp %lld needs %lld ranks; "
                        "mpirun started %d",
                        dp, tp, pp, dp * tp * pp, size),
            "layout");
    }
    /* the layout is checked against the model here, before tided sees it */
    tide_layout_t *layout = NULL;
    RUN(tide_layout_new(&layout, (int)dp, (int)tp, (int)pp, cfg.layers, (int)micro), "layout");
    if (stages != NULL)
        RUN(tide_layout_parse_stages(layout, stages), "--stages");
    tide_collection_t *coll = NULL;
    RUN(tide_mlp_collection_new(&cfg, &coll), "model");
    RUN(tide_layout_validate(layout, coll), "layout");
    if (cfg.global_batch % (dp * micro) != 0)
        RUN(tide_errorf(TIDE_ERR_INVALID,
                        "--global-batch %lld is not divisible by dp %lld x --micro-batches %lld",
                        batch, dp, micro),
            "layout");
    RUN(tide_mlp_select_device(dev, local_rank()), "--device");

    if (g_rank == 0) {
        char lbuf[256];
        printf(
            "train_mlp: %s mode, %d layers, hidden %lld, ffn %lld, vocab %lld, seq %lld, global "
            "batch %lld, %lld micro-batches, state %.2f MiB, device %s, %s layout %s, %d ranks\n",
            tide ? "elastic (tide)" : "standalone", cfg.layers, hidden, ffn, vocab, seq, batch,
            micro, (double)tide_collection_bytes(coll) / (1024.0 * 1024.0), device,
            tide ? "first" : "fixed", tide_layout_format(layout, lbuf, sizeof lbuf), size);
        fflush(stdout);
    }
    tide_collection_destroy(&coll);

    output o;
    memset(&o, 0, sizeof o);
    o.loss_path = loss_out;
    o.trace_path = trace_out;
    o.state_out = state_out;
    o.every = every;
    o.steps = steps;
    o.pace_ms = pace_ms;
    o.prepare = prepare;
    o.batch = batch;
    o.last_step = -1;
    output_reset(&o);
    MPI_Barrier(MPI_COMM_WORLD);

    ckpt_cfg ck = {ckpt_save, ckpt_load, ckpt_every, ckpt_keep, ckpt_async, 0, NULL, 0, 0.0};
    ck.nonce = tide_now_ns() ^ (uint64_t)getpid() << 20; /* a crashed run's files are not ours */
    MPI_Bcast(&ck.nonce, 1, MPI_UINT64_T, 0, MPI_COMM_WORLD);
    job_decl jd = {job, (int)min_gpus, (int)max_gpus, (int)priority};
    int code =
        tide ? run_tide(&cfg, endpoint, &jd, (int)dp, (int)tp, (int)pp, (int)micro, dev, &o, &ck)
             : run_standalone(&cfg, layout, dev, &o, &ck);
    if (!tide) /* --tide: ranks may have died; members agreed on code in summarize */
        MPI_Bcast(&code, 1, MPI_INT, 0, MPI_COMM_WORLD);
    tide_layout_destroy(&layout);
    MPI_Finalize();
    return code;
}
