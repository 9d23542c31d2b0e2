/*
 * resize_bench: the downtime of changing a training job's layout live (libtide: agree on
 * a step, reshard in place, new communicators) versus the checkpoint-restart way (stop,
 * write per-rank checkpoint files, relaunch with mpirun under the new layout, read the
 * checkpoint back), for the same train_mlp model state (>= 1 GiB of parameters and Adam
 * moments by default), measured in one run on this machine.
 *
 *   live     tided + `mpirun -np NP train_mlp --tide` in the old layout; once it has run
 *            --steps-before steps, a resize to the new layout (proto, like tidectl);
 *            it runs on to --steps-before + --steps-after + 2 steps.
 *   restart  `mpirun train_mlp` in the old layout up to the same switch step with
 *            --ckpt-save, then `mpirun train_mlp` in the new layout with --ckpt-load
 *            to the same last step.
 * Downtime = wall-clock gap between the end of the last step in the old layout and the
 * start of the first step in the new one (train_mlp --trace-out records, CLOCK_REALTIME
 * microseconds, taken by the first rank of each layout). Throughput = steps per second
 * over the warm steps before and after the change (the first step of a process or a
 * layout, which pays for page faults, excluded). Also checked: the loss of every step
 * after the change agrees between the two ways (relative 1e-5). The two ways alternate
 * --runs times (default 3) and each way's median downtime is reported (the machine's
 * load varies from run to run).
 * Goals: live downtime <= 1/30 of checkpoint-restart; each rank's extra memory in the
 * switch <= 1.1 x the staging cap + what its new shards needed beyond its old ones. The
 * memory bound is on libtide's pool: device memory on nccl (spills go to pinned host
 * memory, reported apart), host memory on mpi, where a spill is host memory too, so there
 * the extra counted is the pool's peak extra plus the host spill. The machine's speed of
 * first touches of fresh memory decides much of both ways' cost and is printed with the
 * downtimes. Files:
 * bench-out/resize_bench.json
 * (--out), checkpoint and logs under --work (removed unless --keep).
 */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "benchmarks/bench_out.h"
#include "core/error.h"
#include "core/log.h"
#include "core/opts.h"
#include "benchmarks/bench_proc.h"
#include "tests/coord_harness.h"

#define MAX_STEPS 4096
#define JOB       "resize-bench"

static pid_t spawn_logged(char *const *argv, const char *log)
{
    return bench_spawn_logged("resize_bench", argv, log);
}

static int reap(pid_t pid, const char *what, const char *log, int64_t *exit_us)
{
    return bench_reap("resize_bench", pid, what, log, exit_us);
}

typedef struct settings {
    const char *tided, *train, *mpirun, *out, *work, *from, *to, *placement, *single_copy;
    long long np, layers, hidden, ffn, vocab, seq, batch, micro, before, after, runs;
    int keep, prepare, grow;
} settings;

/* One rank's part of the live switch (train_mlp's rank_switch records), ms. */
enum { PH_WAIT, PH_ALLOC, PH_SYNC, PH_PLAN, PH_MOVE, PH_GROUPS, PH_TEARDOWN, PH_ADOPT, PH_N };
static const char *const ph_name[PH_N] = {"wait_commit", "alloc",     "sync_peers", "plan",
                                          "move",        "new_comms", "teardown",   "adopt_free"};
#define MAX_RANKS 64
typedef struct rank_rec {
    int rank, member, prepared;
    double ph[PH_N];
    double reshard, prepare; /* tide_reshard total; the preparation ahead (overlapped) */
    unsigned long long sent, recv, local;
    /* memory of the switch (bytes): shards before/after, staging cap, the most pool memory
       it took over what it held, what the new shards needed beyond the old, spilled to
       host, newly taken from the system */
    unsigned long long state_old, state_new, cap, peak_extra, no_room, spilled, fresh;
    double join;      /* connecting a launch that joined (--grow), ms; part of sync_peers' stage */
    char backend[16]; /* the collectives backend the rank ran ("" when the trace says none) */
} rank_rec;

/* One run's trace: per step its start/end (wall us) and loss; the switch step if any. */
typedef struct trace {
    int64_t start[MAX_STEPS], end[MAX_STEPS];
    double loss[MAX_STEPS];
    int64_t last;        /* largest step seen, -1 none */
    int64_t switch_step; /* live: first step of generation 2, -1 none */
    double switch_ms;    /* live: the first rank's tide_reshard total */
    rank_rec ranks[MAX_RANKS];
    int n_ranks;
} trace;

static int parse_layout(const char *s, int *dp, int *tp, int *pp)
{
    return sscanf(s, "%d,%d,%d", dp, tp, pp) == 3 && *dp >= 1 && *tp >= 1 && *pp >= 1 ? 0 : -1;
}

/* mpirun -np np train_mlp MODEL --steps .. --dp .. --tp .. --pp .. into c; with
   connect, the launch names --grow's ompi-server (launches of a job that grows). */
static void mpi_cmd(bench_cmd *c, const settings *s, int connect, int np, int dp, int tp, int pp,
                    int64_t steps)
{
    bench_mpirun(c, s->mpirun, np);
    if (connect) {             /* the job's launches connect through it (--grow) */
        static char uri[1100]; /* the same for every launch */
        snprintf(uri, sizeof uri, "file:%s/ompi.uri", s->work);
        bench_add(c, "--ompi-server");
        bench_add(c, uri);
    }
    bench_add(c, s->train);
    bench_addf(c, "--layers", s->layers);
    bench_addf(c, "--hidden", s->hidden);
    bench_addf(c, "--ffn", s->ffn);
    bench_addf(c, "--vocab", s->vocab);
    bench_addf(c, "--seq", s->seq);
    bench_addf(c, "--global-batch", s->batch);
    bench_addf(c, "--micro-batches", s->micro);
    bench_addf(c, "--steps", steps);
    bench_addf(c, "--dp", dp);
    bench_addf(c, "--tp", tp);
    bench_addf(c, "--pp", pp);
    bench_addf(c, "--print-every", 1);
}

/* ---- traces ------------------------------------------------------------------------------ */

static int read_trace(const char *path, trace *t)
{
    memset(t, 0, sizeof *t);
    t->last = -1;
    t->switch_step = -1;
    for (int i = 0; i < MAX_STEPS; i++)
        t->start[i] = t->end[i] = -1;
    FILE *f = fopen(path, "r");
    if (f == NULL) {
        fprintf(stderr, "resize_bench: no trace %s\n", path);
        return -1;
    }
    char line[512];
    while (fgets(line, sizeof line, f) != NULL) {
        long long s, g, a, b, at;
        double l, ms, mv;
        if (sscanf(line, "step %lld gen %lld start_us %lld end_us %lld loss %lf", &s, &g, &a, &b,
                   &l) == 5 &&
            s >= 0 && s < MAX_STEPS) {
            t->start[s] = a;
            t->end[s] = b;
            t->loss[s] = l;
            t->last = s > t->last ? s : t->last;
        } else if (strncmp(line, "rank_switch gen 2 ", 18) == 0 && t->n_ranks < MAX_RANKS) {
            rank_rec *r = &t->ranks[t->n_ranks];
            double *p = r->ph;
            if (sscanf(line,
                       "rank_switch gen %lld rank %d member %d wait %lf alloc %lf sync %lf plan "
                       "%lf move %lf groups %lf teardown %lf reshard %lf adopt %lf prepared %d "
                       "prepare %lf sent %llu recv %llu local %llu",
                       &g, &r->rank, &r->member, &p[PH_WAIT], &p[PH_ALLOC], &p[PH_SYNC],
                       &p[PH_PLAN], &p[PH_MOVE], &p[PH_GROUPS], &p[PH_TEARDOWN], &r->reshard,
                       &p[PH_ADOPT], &r->prepared, &r->prepare, &r->sent, &r->recv,
                       &r->local) == 17) {
                const char *m = strstr(line, " state_old ");
                if (m == NULL ||
                    sscanf(m,
                           " state_old %llu state_new %llu cap %llu peak_extra %llu no_room %llu "
                           "spilled %llu fresh %llu",
                           &r->state_old, &r->state_new, &r->cap, &r->peak_extra, &r->no_room,
                           &r->spilled, &r->fresh) != 7)
                    memset(&r->state_old, 0, 7 * sizeof r->state_old);
                const char *jn = strstr(line, " join ");
                r->join = jn != NULL ? atof(jn + 6) : 0.0;
                const char *bk = strstr(line, " backend ");
                r->backend[0] = '\0';
                if (bk != NULL && sscanf(bk, " backend %15s", r->backend) != 1)
                    r->backend[0] = '\0';
                t->n_ranks++;
            }
        } else if (sscanf(line, "switch gen %lld step %lld total_ms %lf move_ms %lf at_us %lld", &g,
                          &s, &ms, &mv, &at) == 5 &&
                   g == 2) {
            t->switch_step = s;
            t->switch_ms = ms;
        }
    }
    fclose(f);
    return 0;
}

/* Steps per second over steps (from, to] (end to end, gaps between steps included). */
static double rate(const trace *t, int64_t from, int64_t to)
{
    if (to <= from || t->end[from] < 0 || t->end[to] < 0)
        return 0.0;
    return (double)(to - from) / ((double)(t->end[to] - t->end[from]) * 1e-6);
}

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23 /* Linux 5.14 */
#endif

/* GB/s of first touches of a fresh 256 MiB mapping: written page by page (a fault per
   page: what a program's new buffers cost), or populated by the kernel in one call and
   then written once a page (what tide's memory pool does: on a VM whose host backs memory
   lazily, populating alone leaves each page's first write slow; 0 when the kernel cannot
   populate). */
static double first_touch_gbs(int populate)
{
    size_t n = (size_t)256 << 20;
    char *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        return 0.0;
    struct timespec a, b;
    int ok = 1;
    clock_gettime(CLOCK_MONOTONIC, &a);
    if (populate) {
        ok = madvise(p, n, MADV_POPULATE_WRITE) == 0;
        for (size_t i = 0; ok && i < n; i += 4096)
            ((volatile char *)p)[i] = 1;
    } else {
        memset(p, 1, n);
    }
    __asm__ volatile("" : : "r"(p) : "memory"); /* the writes happen before the clock */
    clock_gettime(CLOCK_MONOTONIC, &b);
    munmap(p, n);
    double s = (double)(b.tv_sec - a.tv_sec) + (double)(b.tv_nsec - a.tv_nsec) * 1e-9;
    return ok && s > 0 ? (double)n / s / 1e9 : 0.0;
}

/* ---- tided ---------------------------------------------------------------------------------- */

/* Current generation and step of the job (-1 when unknown). */
static void job_state(void *sock, uint64_t *gen, int64_t *step, int *running)
{
    *gen = 0;
    *step = -1;
    *running = 0;
    tide_msg_t q, r;
    tide_msg_init(&q, TIDE_MSG_JOBS);
    if (coord_call(sock, &q, &r) != 0)
        return;
    for (uint32_t i = 0; r.type == TIDE_MSG_JOBS_REPLY && i < r.u.jobs_reply.n_rows; i++) {
        const tide_proto_job_row_t *row = &r.u.jobs_reply.rows[i];
        if (strcmp(row->name, JOB) == 0) {
            *gen = row->gen;
            *step = (int64_t)row->step;
            *running = row->state == TIDE_JOB_RUNNING;
        }
    }
    tide_msg_clear(&r);
}

/* --grow: the ompi-server both launches name (stopped at exit). */
static pid_t g_ompi_server = -1;

static void stop_ompi_server(void)
{
    if (g_ompi_server > 0) {
        kill(g_ompi_server, SIGTERM);
        waitpid(g_ompi_server, NULL, 0);
        g_ompi_server = -1;
    }
}

static int start_ompi_server(const char *work)
{
    static char uri[1100], log[1100];
    snprintf(uri, sizeof uri, "%s/ompi.uri", work);
    snprintf(log, sizeof log, "%s/ompi-server.log", work);
    char *const argv[] = {"ompi-server", "--no-daemonize", "-r", uri, NULL};
    g_ompi_server = spawn_logged(argv, log);
    if (g_ompi_server < 0)
        return -1;
    atexit(stop_ompi_server);
    for (int i = 0; i < 200; i++) {
        struct stat st;
        if (stat(uri, &st) == 0 && st.st_size > 0)
            return 0;
        tide_sleep_ms(25);
    }
    fprintf(stderr, "resize_bench: ompi-server did not start; see %s\n", log);
    return -1;
}

/* Workers tided lists idle (the ranks of a launch that joined the job, before the grow). */
static int idle_workers(void *sock)
{
    tide_msg_t q, r;
    tide_msg_init(&q, TIDE_MSG_STATUS);
    if (coord_call(sock, &q, &r) != 0)
        return -1;
    int n = 0;
    for (uint32_t i = 0; r.type == TIDE_MSG_STATUS_REPLY && i < r.u.status_reply.n_rows; i++)
        n += r.u.status_reply.rows[i].state == TIDE_WORKER_IDLE;
    tide_msg_clear(&r);
    return n;
}

static int resize(void *sock, int dp, int tp, int pp, int optimal)
{
    tide_msg_t q, r;
    tide_msg_init(&q, TIDE_MSG_RESIZE);
    snprintf(q.u.resize.job, sizeof q.u.resize.job, JOB);
    q.u.resize.dp = dp;
    q.u.resize.tp = tp;
    q.u.resize.pp = pp;
    q.u.resize.placement = optimal ? TIDE_PLACEMENT_OPTIMAL : TIDE_PLACEMENT_DEFAULT;
    int rc = coord_call(sock, &q, &r) == 0 && r.type == TIDE_MSG_RESIZE_REPLY ? 0 : -1;
    if (rc != 0)
        fprintf(stderr, "resize_bench: resize refused: %s\n",
                r.type == TIDE_MSG_ERROR ? r.u.error.message : "no reply");
    tide_msg_clear(&r);
    return rc;
}

/* ---- the two ways ---------------------------------------------------------------------------- */

typedef struct result {
    int64_t switch_step, last_step;
    double downtime_ms, before_sps, after_sps, reshard_ms; /* reshard_ms: live only */
    double stop_ms, restart_ms;                            /* restart only */
} result;

static int run_live(const settings *s, const int *from, const int *to, trace *t, result *r)
{
    coord_proc cp;
    /* frequent heartbeats: the job's step (when to resize) is known within 200 ms */
    const char *const flags[] = {"--heartbeat-ms", "200", "--miss-limit", "50", NULL};
    if (coord_tmpdir(&cp) != 0 || coord_start(&cp, s->tided, flags, NULL) != 0) {
        fprintf(stderr, "resize_bench: tided did not start (%s)\n", s->tided);
        return -1;
    }
    char log[1024], tr[1024];
    snprintf(log, sizeof log, "%s/live.log", s->work);
    snprintf(tr, sizeof tr, "%s/live.trace", s->work);
    int64_t total = s->before + s->after + 2;
    bench_cmd c;
    mpi_cmd(&c, s, s->grow, (int)s->np, from[0], from[1], from[2], total);
    bench_add(&c, "--tide");
    bench_add(&c, s->prepare ? "--prepare-switch=1" : "--prepare-switch=0");
    bench_add(&c, "--endpoint");
    bench_add(&c, cp.endpoint);
    bench_add(&c, "--job");
    bench_add(&c, JOB);
    bench_add(&c, "--trace-out");
    bench_add(&c, tr);
    int rc = -1;
    void *ctx = zmq_ctx_new();
    void *sock = coord_connect(ctx, cp.endpoint, NULL, NULL, NULL, 10000);
    pid_t pid = spawn_logged(c.argv, log), pid2 = -1;
    if (pid < 0 || sock == NULL)
        goto out;
    int n_new = to[0] * to[1] * to[2] - from[0] * from[1] * from[2];
    if (s->grow) {
        /* a second launch of the program joins the running job; the resize places the job
           on both (tided connects them at the switch). It names the job's first layout,
           which only the launch that started the job must hold: it may be smaller. */
        char log2[1100], tr2[1100];
        snprintf(log2, sizeof log2, "%s/grow.log", s->work);
        snprintf(tr2, sizeof tr2, "%s/grow.trace", s->work);
        bench_cmd c2;
        mpi_cmd(&c2, s, 1, n_new, from[0], from[1], from[2], total);
        const char *tail[] = {"--tide", "--endpoint",  cp.endpoint, "--job",
                              JOB,      "--trace-out", tr2};
        for (size_t i = 0; i < sizeof tail / sizeof tail[0]; i++)
            bench_add(&c2, tail[i]);
        bench_add(&c2, s->prepare ? "--prepare-switch=1" : "--prepare-switch=0");
        int64_t t0 = bench_wall_us();
        for (;;) { /* the job runs its first layout before the other launch joins it */
            uint64_t gen;
            int64_t step;
            int running;
            job_state(sock, &gen, &step, &running);
            if (gen == 1 && running)
                break;
            if (bench_wall_us() - t0 > 120000000) {
                fprintf(stderr, "resize_bench: the job did not start; see %s\n", log);
                goto out;
            }
            tide_sleep_ms(20);
        }
        pid2 = spawn_logged(c2.argv, log2);
        if (pid2 < 0)
            goto out;
        while (idle_workers(sock) < n_new) {
            if (bench_wall_us() - t0 > 120000000) {
                fprintf(stderr,
                        "resize_bench: the joining launch's %d ranks did not join; see %s\n", n_new,
                        log2);
                goto out;
            }
            tide_sleep_ms(20);
        }
    }
    /* resize once the first layout has run --steps-before steps */
    int sent = 0;
    while (!sent) {
        uint64_t gen;
        int64_t step;
        int running;
        job_state(sock, &gen, &step, &running);
        if (gen == 1 && running && step >= s->before) {
            if (resize(sock, to[0], to[1], to[2], strcmp(s->placement, "optimal") == 0) != 0)
                break;
            sent = 1;
        }
        int st;
        if (waitpid(pid, &st, WNOHANG) == pid) {
            fprintf(stderr, "resize_bench: the live run ended before the resize; see %s\n", log);
            pid = -1;
            goto out;
        }
        tide_sleep_ms(20);
    }
    if (reap(pid, "the live run", log, NULL) != 0 || !sent) {
        pid = -1;
        goto out;
    }
    pid = -1;
    if (pid2 > 0) {
        char log2[1100];
        snprintf(log2, sizeof log2, "%s/grow.log", s->work);
        int bad = reap(pid2, "the joining launch", log2, NULL) != 0;
        pid2 = -1;
        if (bad)
            goto out;
    }
    if (read_trace(tr, t) != 0)
        goto out;
    if (s->grow) { /* the joining launch's ranks: their part of the switch too */
        static trace t2;
        char tr2[1100];
        snprintf(tr2, sizeof tr2, "%s/grow.trace", s->work);
        if (read_trace(tr2, &t2) == 0)
            for (int i = 0; i < t2.n_ranks && t->n_ranks < MAX_RANKS; i++)
                t->ranks[t->n_ranks++] = t2.ranks[i];
    }
    int64_t k = t->switch_step;
    if (k < 2 || t->last != total - 1 || k + 2 > t->last || t->end[k - 1] < 0 || t->start[k] < 0) {
        fprintf(stderr,
                "resize_bench: the live run switched at step %lld of %lld; not measurable\n",
                (long long)k, (long long)total);
        goto out;
    }
    r->switch_step = k;
    r->last_step = t->last;
    r->downtime_ms = (double)(t->start[k] - t->end[k - 1]) * 1e-3;
    r->before_sps = rate(t, 0, k - 1);
    r->after_sps = rate(t, k, t->last);
    r->reshard_ms = t->switch_ms;
    rc = 0;
out:
    if (pid > 0) {
        kill(pid, SIGTERM);
        waitpid(pid, NULL, 0);
    }
    if (pid2 > 0) {
        kill(pid2, SIGTERM);
        waitpid(pid2, NULL, 0);
    }
    if (sock != NULL)
        zmq_close(sock);
    zmq_ctx_term(ctx);
    coord_stop(&cp, SIGTERM);
    coord_cleanup(&cp);
    return rc;
}

static int run_restart(const settings *s, const int *from, const int *to, int64_t switch_step,
                       int64_t last_step, trace *ta, trace *tb, result *r)
{
    char log_a[1024], log_b[1024], tr_a[1024], tr_b[1024], ckpt[1024];
    snprintf(log_a, sizeof log_a, "%s/stop.log", s->work);
    snprintf(log_b, sizeof log_b, "%s/restart.log", s->work);
    snprintf(tr_a, sizeof tr_a, "%s/stop.trace", s->work);
    snprintf(tr_b, sizeof tr_b, "%s/restart.trace", s->work);
    snprintf(ckpt, sizeof ckpt, "%s/ckpt", s->work);
    bench_cmd c;
    /* the stopped job: the old layout up to the live run's switch step, then save */
    /* the checkpoint-restart baseline connects no launches: no --ompi-server */
    mpi_cmd(&c, s, 0, from[0] * from[1] * from[2], from[0], from[1], from[2], switch_step);
    bench_add(&c, "--ckpt-save");
    bench_add(&c, ckpt);
    bench_add(&c, "--trace-out");
    bench_add(&c, tr_a);
    pid_t pid = spawn_logged(c.argv, log_a);
    int64_t exit_a = 0, spawn_b = 0;
    if (pid < 0 || reap(pid, "the run before the checkpoint", log_a, &exit_a) != 0)
        return -1;
    /* the relaunch: the new layout from the checkpoint to the same last step */
    mpi_cmd(&c, s, 0, to[0] * to[1] * to[2], to[0], to[1], to[2], last_step + 1);
    bench_add(&c, "--ckpt-load");
    bench_add(&c, ckpt);
    bench_add(&c, "--trace-out");
    bench_add(&c, tr_b);
    spawn_b = bench_wall_us();
    pid = spawn_logged(c.argv, log_b);
    if (pid < 0 || reap(pid, "the relaunch from the checkpoint", log_b, NULL) != 0)
        return -1;
    if (read_trace(tr_a, ta) != 0 || read_trace(tr_b, tb) != 0)
        return -1;
    int64_t k = switch_step;
    if (ta->last != k - 1 || tb->start[k] < 0 || tb->last != last_step) {
        fprintf(stderr, "resize_bench: checkpoint runs covered steps 0..%lld and ..%lld\n",
                (long long)ta->last, (long long)tb->last);
        return -1;
    }
    r->switch_step = k;
    r->last_step = last_step;
    r->downtime_ms = (double)(tb->start[k] - ta->end[k - 1]) * 1e-3;
    r->stop_ms = (double)(exit_a - ta->end[k - 1]) * 1e-3;
    r->restart_ms = (double)(tb->start[k] - spawn_b) * 1e-3;
    r->before_sps = rate(ta, 0, k - 1);
    r->after_sps = rate(tb, k, last_step);
    return 0;
}

static void rm_rf(const char *path)
{
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", path);
    if (system(cmd) != 0)
        fprintf(stderr, "resize_bench: could not remove %s\n", path);
}

/* Index of the run whose downtime is the median of n (the lower one for even n). */
static int median_run(const result *r, int n)
{
    int best = 0;
    for (int i = 0; i < n; i++) {
        int below = 0, same_before = 0;
        for (int j = 0; j < n; j++) {
            below += r[j].downtime_ms < r[i].downtime_ms;
            same_before += j < i && r[j].downtime_ms == r[i].downtime_ms;
        }
        if (below + same_before == (n - 1) / 2)
            best = i;
    }
    return best;
}

int main(int argc, char **argv)
{
    settings s;
    memset(&s, 0, sizeof s);
    const tide_opt opts[] = {
        {"tided", "TIDE_TIDED", TIDE_OPT_STRING, &s.tided, TIDED_PATH, "tided binary", 0, 0},
        {"train", NULL, TIDE_OPT_STRING, &s.train, TRAIN_MLP_PATH, "train_mlp binary", 0, 0},
        {"mpirun", NULL, TIDE_OPT_STRING, &s.mpirun, MPIRUN_PATH, "mpirun", 0, 0},
        {"np", NULL, TIDE_OPT_INT, &s.np, "8", "ranks of the live job's pool", 1, 1024},
        {"from", NULL, TIDE_OPT_STRING, &s.from, "1,2,2", "old layout dp,tp,pp", 0, 0},
        {"to", NULL, TIDE_OPT_STRING, &s.to, "1,4,2", "new layout dp,tp,pp", 0, 0},
        {"placement", NULL, TIDE_OPT_STRING, &s.placement, "optimal",
         "live resize placement, as tidectl's --placement: optimal (fewest bytes moved; "
         "tidectl's default) or default (plain rank order)",
         0, 0},
        {"single-copy", NULL, TIDE_OPT_STRING, &s.single_copy, "cma",
         "Open MPI shared-memory single-copy mechanism (cma; none where ptrace is not allowed)", 0,
         0},
        {"layers", NULL, TIDE_OPT_INT, &s.layers, "12", "model: MLP blocks", 1, 10000},
        {"hidden", NULL, TIDE_OPT_INT, &s.hidden, "1024", "model: width", 1, 1 << 20},
        {"ffn", NULL, TIDE_OPT_INT, &s.ffn, "4096", "model: fc1 width", 1, 1 << 22},
        {"vocab", NULL, TIDE_OPT_INT, &s.vocab, "1024", "model: tokens", 2, 1 << 24},
        {"seq", NULL, TIDE_OPT_INT, &s.seq, "8", "model: tokens per sample", 1, 1 << 20},
        {"global-batch", NULL, TIDE_OPT_INT, &s.batch, "4", "samples per step", 1, 1 << 24},
        {"micro-batches", NULL, TIDE_OPT_INT, &s.micro, "2", "micro-batches per step", 1, 1 << 20},
        {"steps-before", NULL, TIDE_OPT_INT, &s.before, "4", "steps before the change", 2, 1000},
        {"steps-after", NULL, TIDE_OPT_INT, &s.after, "4", "steps after the change", 2, 1000},
        {"work", NULL, TIDE_OPT_STRING, &s.work, "bench-out/resize_bench.d",
         "checkpoint, traces and logs", 0, 0},
        {"keep", NULL, TIDE_OPT_BOOL, &s.keep, "0", "keep --work afterwards", 0, 0},
        {"prepare", NULL, TIDE_OPT_BOOL, &s.prepare, "1",
         "live: new buffers allocated and first-touched before the switch step "
         "(train_mlp --prepare-switch); 0: at the switch",
         0, 0},
        {"grow", NULL, TIDE_OPT_BOOL, &s.grow, "0",
         "live: the job starts on --from's ranks and grows onto a second launch of the "
         "program (the rest of --to's ranks) that joins it while it trains (ompi-server "
         "started here); checkpoint-restart relaunches onto --to's ranks",
         0, 0},
        {"runs", NULL, TIDE_OPT_INT, &s.runs, "3",
         "live and checkpoint-restart pairs, alternated; medians are reported", 1, 50},
        {"out", NULL, TIDE_OPT_STRING, &s.out, "bench-out/resize_bench.json", "results file", 0, 0},
        {NULL, NULL, 0, NULL, NULL, NULL, 0, 0},
    };
    int code = tide_opts_main(opts, argc, argv, "resize_bench");
    if (code >= 0)
        return code;
    int from[3], to[3];
    if (parse_layout(s.from, &from[0], &from[1], &from[2]) != 0 ||
        parse_layout(s.to, &to[0], &to[1], &to[2]) != 0) {
        fprintf(stderr, "resize_bench: --from / --to take dp,tp,pp (e.g. 1,2,2)\n");
        return 2;
    }
    if (strcmp(s.placement, "default") != 0 && strcmp(s.placement, "optimal") != 0) {
        fprintf(stderr, "resize_bench: --placement takes default or optimal, not %s\n",
                s.placement);
        return 2;
    }
    if (from[0] * from[1] * from[2] > s.np || to[0] * to[1] * to[2] > s.np) {
        fprintf(stderr, "resize_bench: --np %lld is smaller than a layout\n", s.np);
        return 2;
    }
    for (int k = 0; k < 2; k++) {
        const int *l = k ? to : from;
        if (s.batch % ((long long)l[0] * s.micro) != 0) {
            fprintf(stderr,
                    "resize_bench: --global-batch %lld is not divisible by %s's dp %d x "
                    "--micro-batches %lld\n",
                    s.batch, k ? "--to" : "--from", l[0], s.micro);
            return 2;
        }
    }
    if (s.grow && to[0] * to[1] * to[2] <= from[0] * from[1] * from[2]) {
        fprintf(stderr, "resize_bench: --grow needs a --to layout larger than --from\n");
        return 2;
    }
    if (s.grow) /* the job's first launch holds exactly --from's ranks */
        s.np = from[0] * from[1] * from[2];
    signal(SIGPIPE, SIG_IGN);
    /* Shared memory and yield when idle, as tide's tests use on one machine. Tests turn
       Open MPI's single-copy (CMA) transfers off because some sandboxes forbid
       process_vm_readv; a deployment keeps them on, so the benchmark does by default. The
       checkpoint-restart baseline moves no state over MPI and is not affected. */
    setenv("OMPI_MCA_btl", "self,vader,tcp", 0);
    setenv("OMPI_MCA_btl_vader_single_copy_mechanism", s.single_copy, 1);
    setenv("OMPI_MCA_mpi_yield_when_idle", "1", 0);
    setenv("OMPI_MCA_rmaps_base_oversubscribe", "1", 0);
    bench_make_parent(s.work);
    rm_rf(s.work);
    if (mkdir(s.work, 0755) != 0) {
        fprintf(stderr, "resize_bench: cannot create %s: %s\n", s.work, strerror(errno));
        return 1;
    }
    if (s.grow && start_ompi_server(s.work) != 0)
        return 1;
    /* model size, as train_mlp counts it: per parameter itself and two Adam moments */
    double params = (double)s.layers * (2.0 * (double)s.hidden * (double)s.ffn + (double)s.ffn +
                                        3.0 * (double)s.hidden) +
                    2.0 * (double)s.vocab * (double)s.hidden + 2.0 * (double)s.hidden;
    double state_gib = params * 12.0 / (1024.0 * 1024.0 * 1024.0);
    printf("resize_bench: model %lld layers, hidden %lld, ffn %lld, vocab %lld: %.0fM parameters, "
           "state %.2f GiB (params + Adam moments); (dp %d, tp %d, pp %d) -> (dp %d, tp %d, pp "
           "%d), placement %s; %lld ranks; MPI single copy %s\n",
           s.layers, s.hidden, s.ffn, s.vocab, params / 1e6, state_gib, from[0], from[1], from[2],
           to[0], to[1], to[2], s.placement, s.np, s.single_copy);
    fflush(stdout);

    /* what decides both ways' cost on a fresh VM: how fast fresh memory is first touched */
    double touch_gbs = first_touch_gbs(0), populate_gbs = first_touch_gbs(1);
    printf("resize_bench: memory first-touch speed %.2f GB/s page by page, %.2f GB/s populated "
           "by the kernel in one call and written once a page (tide's pool; 256 MiB of fresh "
           "pages)\n",
           touch_gbs, populate_gbs);
    fflush(stdout);

    static trace tl, ta, tb;
    result live, rst, lives[50], rsts[50];
    static rank_rec run_ranks[50][MAX_RANKS]; /* each live run's ranks */
    int run_nranks[50];
    double worst = 0.0;
    for (long long run = 0; run < s.runs; run++) {
        memset(&lives[run], 0, sizeof lives[run]);
        memset(&rsts[run], 0, sizeof rsts[run]);
        printf("resize_bench: run %lld/%lld: live ...\n", run + 1, s.runs);
        fflush(stdout);
        if (run_live(&s, from, to, &tl, &lives[run]) != 0)
            return 1;
        memcpy(run_ranks[run], tl.ranks, sizeof tl.ranks);
        run_nranks[run] = tl.n_ranks;
        printf("resize_bench: run %lld/%lld: checkpoint-restart ...\n", run + 1, s.runs);
        fflush(stdout);
        if (run_restart(&s, from, to, lives[run].switch_step, lives[run].last_step, &ta, &tb,
                        &rsts[run]) != 0)
            return 1;
        /* both ways continue the same training */
        for (int64_t k = 0; k <= lives[run].last_step; k++) {
            double ref = k < lives[run].switch_step ? ta.loss[k] : tb.loss[k];
            worst = fmax(worst, fabs(tl.loss[k] - ref) / fabs(ref));
        }
        printf("resize_bench: run %lld/%lld: live %.1f ms, checkpoint-restart %.1f ms (1/%.1f)\n",
               run + 1, s.runs, lives[run].downtime_ms, rsts[run].downtime_ms,
               lives[run].downtime_ms > 0 ? rsts[run].downtime_ms / lives[run].downtime_ms : 0.0);
    }
    /* Each way's run of median downtime stands for it (the machine's load varies from
       run to run; both ways are alternated so that it hits them alike). */
    live = lives[median_run(lives, (int)s.runs)];
    rst = rsts[median_run(rsts, (int)s.runs)];
    double ratio = rst.downtime_ms > 0 ? live.downtime_ms / rst.downtime_ms : 0.0;
    int mrun = median_run(lives, (int)s.runs);
    const rank_rec *rr = run_ranks[mrun];
    int nr = run_nranks[mrun];
    const char *backend = nr > 0 && rr[0].backend[0] != '\0' ? rr[0].backend : "mpi";
    int host_mem = strcmp(backend, "nccl") != 0;

    printf("\ndowntime (medians of %lld runs; the gap between the last step of the old layout "
           "and the first of the new, on the first rank):\n",
           s.runs);
    printf("  %-20s %12s %12s %15s %15s\n", "way", "downtime_ms", "switch_step", "steps/s_before",
           "steps/s_after");
    printf("  %-20s %12.1f %12lld %15.3f %15.3f\n", "live (tide)", live.downtime_ms,
           (long long)live.switch_step, live.before_sps, live.after_sps);
    printf("  %-20s %12.1f %12lld %15.3f %15.3f\n", "checkpoint-restart", rst.downtime_ms,
           (long long)rst.switch_step, rst.before_sps, rst.after_sps);
    printf("  machine: fresh memory first-touched at %.2f GB/s page by page, %.2f GB/s populated "
           "and written once a page (the relaunch and any fresh buffer pay it)\n",
           touch_gbs, populate_gbs);
    printf("  live: tide_reshard %.1f ms on the first rank; restart: save + exit %.1f ms, "
           "relaunch + load %.1f ms\n",
           live.reshard_ms, rst.stop_ms, rst.restart_ms);

    /* the split of the median live run: the slowest rank per phase among the old layout's
       members, whose last step ends the old layout (a rank joining from idle waits and syncs
       while they still train: not downtime) */
    double mx[PH_N], mx_reshard = 0.0;
    int all_prepared = nr > 0;
    for (int p = 0; p < PH_N; p++)
        mx[p] = 0.0;
    for (int i = 0; i < nr; i++) {
        all_prepared &= rr[i].prepared;
        if (rr[i].state_old == 0)
            continue;
        for (int p = 0; p < PH_N; p++)
            mx[p] = fmax(mx[p], rr[i].ph[p]);
        mx_reshard = fmax(mx_reshard, rr[i].reshard);
    }
    double comms = mx[PH_SYNC] + mx[PH_GROUPS];
    printf("  live split, slowest old member per phase (ms): wait %.1f, plan %.1f, move %.1f, "
           "comms %.1f (sync with the other participants %.1f + new groups %.1f), alloc %.1f, "
           "teardown %.1f, adopt %.1f, tide_reshard %.1f; communicators and plan built ahead "
           "on %s\n",
           mx[PH_WAIT], mx[PH_PLAN], mx[PH_MOVE], comms, mx[PH_SYNC], mx[PH_GROUPS], mx[PH_ALLOC],
           mx[PH_TEARDOWN], mx[PH_ADOPT], mx_reshard,
           all_prepared ? "every rank" : "not every rank");
    /* a grow onto a new launch pays for connecting it too (the goal: 1/10) */
    double goal = s.grow ? 10.0 : 30.0;
    printf("downtime goal: live%s <= 1/%.0f of checkpoint-restart: %.1f ms vs %.1f ms = 1/%.1f: "
           "%s (first-touch %.2f GB/s); losses of the two ways agree to %.1e (relative)\n",
           s.grow ? " (join of a new launch + reshard)" : "", goal, live.downtime_ms,
           rst.downtime_ms, ratio > 0 ? 1.0 / ratio : 0.0,
           ratio > 0 && ratio <= 1.0 / goal ? "met" : "NOT met", touch_gbs, worst);

    /* where each rank's part of the live downtime went */
    printf("\nlive switch per rank, median run (ms; wait: at the step boundary for tided's commit, "
           "on a rank joining from idle its idle wait, not downtime; sync: waiting for the other "
           "participants; groups: the new layout's communicators, 0 when built ahead; prepare: "
           "the program's own preparation, overlapping steps):\n");
    printf("%5s %6s", "rank", "role");
    for (int p = 0; p < PH_N; p++)
        printf(" %11s", ph_name[p]);
    printf(" %9s %8s %8s %9s %9s %9s %8s\n", "reshard", "prepared", "prepare", "sent_MiB",
           "recv_MiB", "local_MiB", "join");
    for (int i = 0; i < nr; i++) {
        const rank_rec *r = &rr[i];
        const char *role = r->state_old > 0 ? (r->member ? "stays" : "leaves") : "joins";
        printf("%5d %6s", r->rank, role);
        for (int p = 0; p < PH_N; p++)
            printf(" %11.1f", r->ph[p]);
        printf(" %9.1f %8d %8.1f %9.1f %9.1f %9.1f %8.1f\n", r->reshard, r->prepared, r->prepare,
               (double)r->sent / 1048576.0, (double)r->recv / 1048576.0,
               (double)r->local / 1048576.0, r->join);
    }

    /* memory: each rank's extra against the staging cap plus what the new shards needed
       beyond the old ones (goal: <= 1.1 x cap + no_room) */
    printf("\nlive switch memory per rank, median run (MiB). Backend %s: ", backend);
    if (host_mem)
        printf("libtide's pool is host memory and so is a spill, so the goal counts the pool's "
               "peak extra plus the host spill.\n");
    else
        printf("libtide's pool is device memory and the goal is about it; spills go to pinned "
               "host memory, reported apart.\n");
    printf("  pool_extra: the most pool memory the switch held over what the rank held when it "
           "began (new shards, staging); host_spill: old shards spilled to host memory; no_room: "
           "new state beyond the old; fresh: pool memory newly taken from the system\n");
    printf("%5s %6s %10s %10s %8s %9s %11s %11s %10s %10s %9s %5s\n", "rank", "role", "state_old",
           "state_new", "cap", "no_room", "pool_extra", "host_spill", "counted", "bound", "fresh",
           "goal");
    int mem_ok = 1, n_ok = 0;
    double worst_share = 0.0;
    for (int i = 0; i < nr; i++) {
        const rank_rec *r = &rr[i];
        const char *role = r->state_old > 0 ? (r->member ? "stays" : "leaves") : "joins";
        double counted = (double)r->peak_extra + (host_mem ? (double)r->spilled : 0.0);
        double bound = 1.1 * (double)r->cap + (double)r->no_room;
        int ok = counted <= bound;
        mem_ok &= ok;
        n_ok += ok;
        worst_share = fmax(worst_share, bound > 0 ? counted / bound : 0.0);
        printf("%5d %6s %10.1f %10.1f %8.1f %9.1f %11.1f %11.1f %10.1f %10.1f %9.1f %5s\n", r->rank,
               role, (double)r->state_old / 1048576.0, (double)r->state_new / 1048576.0,
               (double)r->cap / 1048576.0, (double)r->no_room / 1048576.0,
               (double)r->peak_extra / 1048576.0, (double)r->spilled / 1048576.0,
               counted / 1048576.0, bound / 1048576.0, (double)r->fresh / 1048576.0,
               ok ? "met" : "NOT");
    }
    printf("memory goal: per rank %s <= 1.1 x staging cap + no_room: %s on %d of %d ranks (the "
           "worst at %.0f%% of its bound)\n",
           host_mem ? "pool extra + host spill" : "pool (device) extra", mem_ok ? "met" : "NOT met",
           n_ok, nr, 100.0 * worst_share);

    FILE *f = bench_out_open("resize_bench", s.out);
    if (f == NULL)
        return 1;
    fprintf(
        f,
        "{\"bench\":\"resize_bench\",\"state_gib\":%.4f,\"params\":%.0f,\"from\":[%d,%d,%d],"
        "\"to\":[%d,%d,%d],\"placement\":\"%s\",\"np\":%lld,\"switch_step\":%lld,\"last_step\":"
        "%lld,"
        "\"live\":{\"downtime_ms\":%.3f,\"reshard_ms\":%.3f,\"steps_per_s_before\":%.4f,"
        "\"steps_per_s_after\":%.4f},"
        "\"restart\":{\"downtime_ms\":%.3f,\"save_exit_ms\":%.3f,\"relaunch_load_ms\":%.3f,"
        "\"steps_per_s_before\":%.4f,\"steps_per_s_after\":%.4f},"
        "\"ratio\":%.6f,\"goal_ratio\":%.4f,\"grow\":%d,\"loss_max_rel_diff\":%.3e,\"prepare\":%d,"
        "\"first_touch_gbs\":%.3f,\"populate_gbs\":%.3f,\"mem_goal_met\":%d,"
        "\"backend\":\"%s\",\"mem_goal_counts\":\"%s\",\"runs\":%lld,\"live_runs_ms\":[",
        state_gib, params, from[0], from[1], from[2], to[0], to[1], to[2], s.placement, s.np,
        (long long)live.switch_step, (long long)live.last_step, live.downtime_ms, live.reshard_ms,
        live.before_sps, live.after_sps, rst.downtime_ms, rst.stop_ms, rst.restart_ms,
        rst.before_sps, rst.after_sps, ratio, s.grow ? 0.1 : 1.0 / 30.0, s.grow, worst, s.prepare,
        touch_gbs, populate_gbs, mem_ok, backend,
        host_mem ? "pool_peak_extra+host_spill" : "pool_peak_extra", s.runs);
    for (long long i = 0; i < s.runs; i++)
        fprintf(f, "%s%.3f", i ? "," : "", lives[i].downtime_ms);
    fprintf(f, "],\"restart_runs_ms\":[");
    for (long long i = 0; i < s.runs; i++)
        fprintf(f, "%s%.3f", i ? "," : "", rsts[i].downtime_ms);
    fprintf(f, "],\"live_ranks_run\":%d,\"live_ranks\":[", mrun);
    for (int i = 0; i < nr; i++) {
        const rank_rec *r = &rr[i];
        fprintf(f, "%s{\"rank\":%d,\"member\":%d", i ? "," : "", r->rank, r->member);
        for (int p = 0; p < PH_N; p++)
            fprintf(f, ",\"%s_ms\":%.3f", ph_name[p], r->ph[p]);
        fprintf(f,
                ",\"reshard_ms\":%.3f,\"prepared\":%d,\"prepare_ms\":%.3f,\"sent\":%llu,"
                "\"recv\":%llu,\"local\":%llu,\"state_old\":%llu,\"state_new\":%llu,"
                "\"staging_cap\":%llu,\"peak_extra\":%llu,\"no_room\":%llu,\"spilled\":%llu,"
                "\"fresh\":%llu,\"mem_counted\":%llu}",
                r->reshard, r->prepared, r->prepare, r->sent, r->recv, r->local, r->state_old,
                r->state_new, r->cap, r->peak_extra, r->no_room, r->spilled, r->fresh,
                r->peak_extra + (host_mem ? r->spilled : 0ull));
    }
    fprintf(f, "]}\n");
    fclose(f);
    printf("wrote %s\n", s.out);
    if (!s.keep)
        rm_rf(s.work);
    return 0;
}
