/*
 * bubble_bench: how much of a pipeline's bubble time offline work fills, and what that
 * costs the online job, measured in one run on this machine.
 *
 *   plain    tided + `mpirun -np NP train_mlp --tide --pp PP` (1F1B over --micro-batches),
 *            no offline work;
 *   filled   the same, with NP offline plugin jobs (examples/task_matmul, steps of
 *            --task-rows rows of an --task-n matrix product) queued with --bubbles
 *            before the job starts, so that tided gives one to each of the pipeline's
 *            workers (a job runs on one worker) and libtide runs its steps inside their
 *            bubbles (tide_bubble_wait).
 * The two alternate --runs times (fresh tided each); each reports train_mlp's steps/s
 * over its warm steps and, from its summary, the members' bubble time and the part that
 * task steps filled. Results (medians): filled share = filled ms / bubble ms of the
 * filled runs (goal >= 0.8), slowdown = 1 - steps/s filled / steps/s plain of each
 * plain and filled pair, run back to back (goal <= 0.02). The first steps of a filled run go
 * unfilled (tided hands the jobs out once heartbeats show bubbles, and each wait's length is
 * learned from earlier steps) and count against the share: more --steps, closer to the steady state
 * of a long job. On a machine with fewer cores than ranks the ranks share cores and an idle rank's
 * core is not really idle: run it with NP <= cores. Numbers go to --out
 * (bench-out/bubble_bench.json).
 */
#include <math.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "benchmarks/bench_out.h"
#include "benchmarks/bench_proc.h"
#include "core/clock.h"
#include "core/opts.h"
#include "tests/coord_harness.h"

#define PROG     "bubble_bench"
#define JOB      "bubble-bench"
#define MAX_RUNS 50

typedef struct settings {
    const char *tided, *train, *mpirun, *plugin_dir, *out, *work;
    long long np, pp, layers, hidden, ffn, vocab, seq, batch, micro, steps, runs, task_n, task_rows;
} settings;

typedef struct sample {
    double sps;       /* steps per second over warm steps */
    double bubble_ms; /* members' bubble time */
    double filled_ms; /* part filled by task steps */
    double task_steps;
} sample;

/* Queues plugin job `fill-k` that fills bubbles; 0 on success. */
static int submit(void *sock, const settings *s, int k)
{
    char n[32], rows[32];
    snprintf(n, sizeof n, "%lld", s->task_n);
    snprintf(rows, sizeof rows, "%lld", s->task_rows);
    char *argv[] = {"--n", n, "--rounds", "1000000", "--rows", rows};
    tide_msg_t q, r;
    tide_msg_init(&q, TIDE_MSG_SUBMIT);
    tide_proto_submit_t *m = &q.u.submit;
    snprintf(m->name, sizeof m->name, "fill-%d", k);
    m->kind = TIDE_JOB_PLUGIN;
    snprintf(m->plugin, sizeof m->plugin, "tide_task_matmul");
    m->argv = argv; /* borrowed: q is not cleared */
    m->argc = sizeof argv / sizeof argv[0];
    m->bubbles = 1;
    int rc = coord_call(sock, &q, &r) == 0 && r.type == TIDE_MSG_OK ? 0 : -1;
    if (rc != 0)
        fprintf(stderr, PROG ": submit refused: %s\n",
                r.type == TIDE_MSG_ERROR ? r.u.error.message : "no reply");
    tide_msg_clear(&r);
    return rc;
}

/* Reads train_mlp's summary lines from its log into *o; 0 when the steps/s line is there. */
static int parse_log(const char *path, sample *o)
{
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return -1;
    char line[1024];
    int found = 0;
    while (fgets(line, sizeof line, f) != NULL) {
        const char *p = strstr(line, " steps/s (mean over warm steps)");
        if (strncmp(line, "train_mlp: ", 11) == 0 && p != NULL) {
            const char *q = p;
            while (q > line && q[-1] != ' ')
                q--;
            o->sps = atof(q);
            found = 1;
        }
        int ranks;
        if (sscanf(line,
                   "train_mlp: pipeline bubbles %lf ms on %d ranks; offline task steps filled %lf "
                   "ms of them (%*f%%, %lf steps)",
                   &o->bubble_ms, &ranks, &o->filled_ms, &o->task_steps) == 4)
            continue;
    }
    fclose(f);
    return found ? 0 : -1;
}

static int run_one(const settings *s, int filled, int k, sample *o)
{
    memset(o, 0, sizeof *o);
    coord_proc cp;
    const char *const flags[] = {"--heartbeat-ms", "100", "--miss-limit", "100", NULL};
    if (coord_tmpdir(&cp) != 0 || coord_start(&cp, s->tided, flags, NULL) != 0) {
        fprintf(stderr, PROG ": tided did not start (%s)\n", s->tided);
        return -1;
    }
    int rc = -1;
    void *ctx = zmq_ctx_new();
    void *sock = coord_connect(ctx, cp.endpoint, NULL, NULL, NULL, 10000);
    if (sock == NULL)
        goto out;
    for (int i = 0; filled && i < (int)s->np; i++)
        if (submit(sock, s, i) != 0)
            goto out;
    char log[1024];
    snprintf(log, sizeof log, "%s/%s-%d.log", s->work, filled ? "filled" : "plain", k);
    bench_cmd c;
    bench_mpirun(&c, s->mpirun, (int)s->np);
    bench_add(&c, s->train);
    bench_add(&c, "--tide");
    bench_add(&c, "--endpoint");
    bench_add(&c, cp.endpoint);
    bench_add(&c, "--job");
    bench_add(&c, JOB);
    bench_addf(&c, "--pp", s->pp);
    bench_addf(&c, "--layers", s->layers);
    bench_addf(&c, "--hidden", s->hidden);
    bench_addf(&c, "--ffn", s->ffn);
    bench_addf(&c, "--vocab", s->vocab);
    bench_addf(&c, "--seq", s->seq);
    bench_addf(&c, "--global-batch", s->batch);
    bench_addf(&c, "--micro-batches", s->micro);
    bench_addf(&c, "--steps", s->steps);
    bench_addf(&c, "--print-every", s->steps);
    pid_t pid = bench_spawn_logged(PROG, c.argv, log);
    if (pid < 0 || bench_reap(PROG, pid, filled ? "the filled run" : "the plain run", log, NULL))
        goto out;
    if (parse_log(log, o) != 0) {
        fprintf(stderr, PROG ": no steps/s in %s\n", log);
        goto out;
    }
    if (filled && o->task_steps <= 0) {
        fprintf(stderr, PROG ": the offline job took no step inside the bubbles (see %s)\n", log);
        goto out;
    }
    unlink(log);
    rc = 0;
out:
    if (sock != NULL)
        zmq_close(sock);
    zmq_ctx_term(ctx);
    coord_stop(&cp, SIGTERM);
    coord_cleanup(&cp);
    return rc;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Median of x[0..n) (sorts x). */
static double median_of(double *x, int n)
{
    qsort(x, (size_t)n, sizeof *x, cmp_double);
    return n % 2 ? x[n / 2] : 0.5 * (x[n / 2 - 1] + x[n / 2]);
}

/* Median over the runs of one field of sample. */
static double median(const sample *v, int n, size_t field)
{
    double x[MAX_RUNS];
    for (int i = 0; i < n; i++)
        x[i] = *(const double *)((const char *)&v[i] + field);
    return median_of(x, n);
}

int main(int argc, char **argv)
{
    settings s;
    memset(&s, 0, sizeof s);
    tide_opt opts[] = {
        {"tided", "TIDE_TIDED", TIDE_OPT_STRING, &s.tided, TIDED_PATH, "tided binary", 0, 0},
        {"train", NULL, TIDE_OPT_STRING, &s.train, TRAIN_MLP_PATH, "train_mlp binary", 0, 0},
        {"mpirun", NULL, TIDE_OPT_STRING, &s.mpirun, MPIRUN_PATH, "mpirun", 0, 0},
        {"plugin-dir", "TIDE_PLUGIN_DIR", TIDE_OPT_STRING, &s.plugin_dir, PLUGIN_DIR,
         "directory of libtide_task_matmul.so", 0, 0},
        {"np", NULL, TIDE_OPT_INT, &s.np, "2", "ranks (keep <= cores)", 1, 64},
        {"pp", NULL, TIDE_OPT_INT, &s.pp, "2", "pipeline stages (np / pp data replicas)", 1, 64},
        {"layers", NULL, TIDE_OPT_INT, &s.layers, "8", "model: MLP blocks", 1, 1000},
        {"hidden", NULL, TIDE_OPT_INT, &s.hidden, "256", "model: width", 8, 1 << 16},
        {"ffn", NULL, TIDE_OPT_INT, &s.ffn, "1024", "model: fc1 width", 8, 1 << 18},
        {"vocab", NULL, TIDE_OPT_INT, &s.vocab, "256", "model: tokens", 2, 1 << 20},
        {"seq", NULL, TIDE_OPT_INT, &s.seq, "16", "model: tokens per sample", 1, 4096},
        {"global-batch", NULL, TIDE_OPT_INT, &s.batch, "32", "samples per step", 1, 1 << 20},
        {"micro-batches", NULL, TIDE_OPT_INT, &s.micro, "4", "micro-batches per step", 1, 4096},
        {"steps", NULL, TIDE_OPT_INT, &s.steps, "80", "steps per run", 4, 100000},
        {"task-n", NULL, TIDE_OPT_INT, &s.task_n, "128", "offline task: matrix size", 8, 8192},
        {"task-rows", NULL, TIDE_OPT_INT, &s.task_rows, "2", "offline task: rows per step", 1,
         8192},
        {"runs", NULL, TIDE_OPT_INT, &s.runs, "3", "plain and filled pairs, alternated", 1,
         MAX_RUNS},
        {"work", NULL, TIDE_OPT_STRING, &s.work, "bench-out/bubble_bench.d", "logs", 0, 0},
        {"out", NULL, TIDE_OPT_STRING, &s.out, "bench-out/bubble_bench.json", "results file", 0, 0},
        {NULL, NULL, 0, NULL, NULL, NULL, 0, 0},
    };
    int code = tide_opts_main(opts, argc, argv, PROG);
    if (code >= 0)
        return code;
    if (s.np % s.pp != 0 || s.batch % ((s.np / s.pp) * s.micro) != 0) {
        fprintf(stderr, PROG ": --pp must divide --np, and np/pp x --micro-batches must divide "
                             "--global-batch\n");
        return 2;
    }
    signal(SIGPIPE, SIG_IGN);
    setenv("TIDE_PLUGIN_DIR", s.plugin_dir, 1);
    setenv("OMPI_MCA_btl", "self,vader,tcp", 0);
    setenv("OMPI_MCA_mpi_yield_when_idle", "1", 0);
    mkdir("bench-out", 0755);
    mkdir(s.work, 0755);
    char task_dir[1100];
    snprintf(task_dir, sizeof task_dir, "%s", s.work);
    setenv("TIDE_TASK_DIR", task_dir, 1); /* the cancelled job's blob lands here */
    printf(PROG ": %lld ranks, pp %lld, %lld micro-batches, model %lld layers x hidden %lld; "
                "offline task: %lld x %lld matrix, %lld rows per step\n",
           s.np, s.pp, s.micro, s.layers, s.hidden, s.task_n, s.task_n, s.task_rows);
    fflush(stdout);

    static sample plain[MAX_RUNS], filled[MAX_RUNS];
    for (int k = 0; k < s.runs; k++) {
        /* alternate which goes first, so that a drift of the machine hits both alike */
        for (int w = 0; w < 2; w++) {
            int f = (w + k) % 2;
            if (run_one(&s, f, k, f ? &filled[k] : &plain[k]) != 0)
                return 1;
        }
        printf(PROG ": run %d/%lld: plain %.2f steps/s; filled %.2f steps/s, %.1f of %.1f ms of "
                    "bubbles filled\n",
               k + 1, s.runs, plain[k].sps, filled[k].sps, filled[k].filled_ms,
               filled[k].bubble_ms);
        fflush(stdout);
    }
    int n = (int)s.runs;
    double sps_plain = median(plain, n, offsetof(sample, sps));
    double sps_filled = median(filled, n, offsetof(sample, sps));
    double share[MAX_RUNS];
    for (int k = 0; k < n; k++)
        share[k] = filled[k].bubble_ms > 0 ? filled[k].filled_ms / filled[k].bubble_ms : 0;
    double fill = median_of(share, n);
    /* each pair ran back to back: the median of the pairs' slowdowns cancels the drift
       of the machine's speed between pairs (10% over a few minutes on a shared VM) */
    double pair_slow[MAX_RUNS];
    for (int k = 0; k < n; k++)
        pair_slow[k] = plain[k].sps > 0 ? 1.0 - filled[k].sps / plain[k].sps : 0;
    double slowdown = median_of(pair_slow, n);
    double bubble_plain = median(plain, n, offsetof(sample, bubble_ms));

    printf("\n%-10s %10s %12s %12s %12s\n", "run", "steps/s", "bubble_ms", "filled_ms",
           "task_steps");
    printf("%-10s %10.2f %12.1f %12s %12s\n", "plain", sps_plain, bubble_plain, "-", "-");
    printf("%-10s %10.2f %12.1f %12.1f %12.0f\n", "filled", sps_filled,
           median(filled, n, offsetof(sample, bubble_ms)),
           median(filled, n, offsetof(sample, filled_ms)),
           median(filled, n, offsetof(sample, task_steps)));
    printf("filled share of bubble time %.3f (goal >= 0.8: %s); online slowdown %.4f (goal <= "
           "0.02: %s); medians of %d runs\n",
           fill, fill >= 0.8 ? "met" : "NOT met", slowdown, slowdown <= 0.02 ? "met" : "NOT met",
           n);

    FILE *f = bench_out_open(PROG, s.out);
    if (f == NULL)
        return 1;
    fprintf(f,
            "{\"bench\":\"bubble_bench\",\"np\":%lld,\"pp\":%lld,\"micro_batches\":%lld,"
            "\"layers\":%lld,\"hidden\":%lld,\"steps\":%lld,\"runs\":%d,\"task_n\":%lld,"
            "\"task_rows\":%lld,\"steps_per_s_plain\":%.4f,\"steps_per_s_filled\":%.4f,"
            "\"slowdown\":%.5f,\"goal_slowdown\":0.02,\"filled_share\":%.5f,"
            "\"goal_filled_share\":0.8,\"bubble_ms_plain\":%.3f,\"runs_detail\":[",
            s.np, s.pp, s.micro, s.layers, s.hidden, s.steps, n, s.task_n, s.task_rows, sps_plain,
            sps_filled, slowdown, fill, bubble_plain);
    for (int k = 0; k < n; k++)
        fprintf(f,
                "%s{\"plain_sps\":%.4f,\"filled_sps\":%.4f,\"bubble_ms\":%.3f,\"filled_ms\":%.3f,"
                "\"task_steps\":%.0f}",
                k ? "," : "", plain[k].sps, filled[k].sps, filled[k].bubble_ms, filled[k].filled_ms,
                filled[k].task_steps);
    fprintf(f, "]}\n");
    fclose(f);
    printf("wrote %s\n", s.out);
    for (int i = 0; i < (int)s.np; i++) {
        char blob[1200];
        snprintf(blob, sizeof blob, "%s/fill-%d.ckpt", s.work, i);
        unlink(blob);
    }
    rmdir(s.work);
    return 0;
}
