/*
 * ckpt_bench: what checkpoints cost, as ratios measured in one run.
 *
 *  1. Training time a checkpoint costs: train_mlp (standalone, tp --ranks over --ranks
 *     ranks) trains the same steps without periodic checkpoints, with synchronous ones
 *     and with asynchronous ones (--ckpt-every); the cost of one checkpoint is the
 *     training loop's extra time divided by the number of saves. Configurations are
 *     interleaved and each is the median of --reps runs. Goal: asynchronous <= 1/10 of
 *     synchronous. An asynchronous save costs tens of ms against loops of seconds that
 *     vary by a few percent from run to run: 19 saves (the default) resolve it, 3 do not. The writer thread of an asynchronous save needs a CPU core the
 *     training does not use, as on a GPU host (training on the devices, host cores
 *     mostly free): by default one rank trains, so one core of a 2-core machine is the
 *     writer's. --ranks 2 there fills both cores with training (MPI spins in its
 *     collectives too), and the writer's hashing and copying then take their time
 *     from the training: that contention is what the ratio shows then.
 *  2. Load into a new layout: a checkpoint of a GPT-like state (--load-mib) saved under
 *     (2, 2, 2) is loaded into (1, 4, 2) and (1, 2, 4; uneven stages), one thread per new
 *     rank as a relaunched job would, and compared with reading the same shard files
 *     sequentially (the disk's own speed), the page cache dropped for those files
 *     (posix_fadvise DONTNEED after fsync) before every measurement. Goal: >= 0.8.
 *
 *  3. Step rate with a full checkpoint disk: a train_mlp --tide job under tided, dp 2 with
 *     ZeRO-1 (each rank writes a shard), paced to --disk-pace-ms a step as a job whose
 *     steps run on devices, saving asynchronously every --disk-every steps, three ways
 *     interleaved, each the median of --disk-reps runs: no saves, saves to a working
 *     disk, and saves where rank 1's checkpoint root is a 2 MiB tmpfs full to the last
 *     byte (rank 1 in a mount namespace of its own: `unshare -m`, so it needs root; the
 *     part prints "skipped" otherwise). Rank 1's shards fail with ENOSPC and the
 *     publisher gives up waiting for them after TIDE_CKPT_TIMEOUT_MS (--disk-timeout-ms).
 *     The rate is steps per second from step start to step start in the job's
 *     --trace-out, as the user sees it (whatever the saves take from the loop included).
 *     Goal: full / working >= 0.90.
 *
 *   build/benchmarks/ckpt_bench [--reps 3] [--steps 100] [--every 5] [--hidden 512] [--ranks 1]
 *                               [--load-hidden 768] [--disk-reps 3] [--disk-steps 120]
 *                               [--disk-every 10] [--disk-only] [--work DIR] [--out PATH]
 * Prints a table and writes bench-out/ckpt_bench.json.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "benchmarks/bench_out.h"
#include "benchmarks/bench_proc.h"
#include "ckpt/ckpt.h"
#include "core/alloc.h"
#include "core/clock.h"
#include "core/error.h"
#include "core/opts.h"
#include "tests/coord_harness.h"

#define PROG "ckpt_bench"

/* Removes a scratch folder (rm -rf), saying so when it cannot. */
static void remove_tree(const char *path)
{
    char cmd[1100];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", path);
    if (system(cmd) != 0)
        fprintf(stderr, "%s: could not remove %s\n", PROG, path);
}

static double median(double *v, int n)
{
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && v[j - 1] > v[j]; j--) {
            double t = v[j];
            v[j] = v[j - 1];
            v[j - 1] = t;
        }
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* ---- 1. training cost ------------------------------------------------------------------ */

typedef struct train_args {
    const char *work;
    long long steps, every, hidden, ffn, layers, ranks;
} train_args;

/* Runs train_mlp in mode 0 (no periodic saves), 1 (synchronous), 2 (asynchronous);
 *loop_s gets its training loop time, *blocked_s what the saves took from it. */
static int train_once(const train_args *a, int mode, int rep, double *loop_s, double *blocked_s)
{
    char root[1024], log[1024];
    snprintf(root, sizeof root, "%s/train-%d-%d", a->work, mode, rep);
    snprintf(log, sizeof log, "%s/train-%d-%d.log", a->work, mode, rep);
    bench_cmd c;
    bench_mpirun(&c, MPIRUN_PATH, (int)a->ranks);
    bench_add(&c, TRAIN_MLP_PATH);
    bench_addf(&c, "--tp", a->ranks);
    bench_addf(&c, "--layers", a->layers);
    bench_addf(&c, "--hidden", a->hidden);
    bench_addf(&c, "--ffn", a->ffn);
    bench_addf(&c, "--seq", 8);
    bench_addf(&c, "--global-batch", 8);
    bench_addf(&c, "--micro-batches", 1);
    bench_addf(&c, "--steps", a->steps);
    bench_addf(&c, "--print-every", 1000000);
    bench_add(&c, "--ckpt-save");
    bench_add(&c, root);
    bench_addf(&c, "--ckpt-every", mode == 0 ? 0 : a->every);
    bench_addf(&c, "--ckpt-keep", 1);
    bench_add(&c, mode == 2 ? "--ckpt-async" : "--no-ckpt-async");
    pid_t pid = bench_spawn_logged(PROG, c.argv, log);
    if (pid < 0 || bench_reap(PROG, pid, "train_mlp", log, NULL) != 0)
        return -1;
    FILE *f = fopen(log, "r");
    char line[1024];
    int got = 0;
    while (f != NULL && fgets(line, sizeof line, f) != NULL) {
        const char *p = strstr(line, "training loop ");
        if (p != NULL && sscanf(p, "training loop %lf", loop_s) == 1)
            got |= 1;
        p = strstr(line, "periodic saves");
        if (p != NULL) {
            const char *q = strstr(p, "took ");
            if (q != NULL && sscanf(q, "took %lf", blocked_s) == 1)
                got |= 2;
        }
    }
    if (f != NULL)
        fclose(f);
    if (got != 3) {
        fprintf(stderr, "%s: no timing lines in %s\n", PROG, log);
        return -1;
    }
    remove_tree(root);
    return 0;
}

/* ---- 2. load throughput ------------------------------------------------------------------ */

/* Drops the page cache of every shard file of ck (they were fsynced when written). */
static void drop_cache(const tide_ckpt_t *ck)
{
    for (size_t k = 0; k < tide_ckpt_num_shards(ck); k++) {
        int p, d, t;
        uint64_t b;
        const char *file;
        tide_ckpt_shard_info(ck, k, &p, &d, &t, &b, &file);
        char path[4200];
        snprintf(path, sizeof path, "%s/%s", tide_ckpt_dir(ck), file);
        int fd = open(path, O_RDONLY);
        if (fd >= 0) {
            (void)posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
            close(fd);
        }
    }
}

/* Reads every shard file of ck sequentially (8 MiB reads); returns seconds. */
static double seq_read(const tide_ckpt_t *ck, uint64_t *bytes)
{
    size_t cap = 8u << 20;
    char *buf = tide_malloc(cap);
    *bytes = 0;
    uint64_t t0 = tide_now_ns();
    for (size_t k = 0; buf != NULL && k < tide_ckpt_num_shards(ck); k++) {
        int p, d, t;
        uint64_t b;
        const char *file;
        tide_ckpt_shard_info(ck, k, &p, &d, &t, &b, &file);
        char path[4200];
        snprintf(path, sizeof path, "%s/%s", tide_ckpt_dir(ck), file);
        int fd = open(path, O_RDONLY);
        if (fd < 0)
            continue;
        (void)posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
        ssize_t n;
        while ((n = read(fd, buf, cap)) > 0)
            *bytes += (uint64_t)n;
        close(fd);
    }
    double s = (double)(tide_now_ns() - t0) * 1e-9;
    tide_free(buf);
    return s;
}

typedef struct loader {
    const tide_ckpt_t *ck;
    const tide_layout_t *l;
    int p, d, t;
    void **bufs;
    tide_ckpt_load_stats st;
    tide_status rc;
    char err[512];
} loader;

static void *load_main(void *arg)
{
    loader *w = arg;
    w->rc = tide_ckpt_load(w->ck, w->l, w->p, w->d, w->t, w->bufs, &w->st);
    if (w->rc != TIDE_OK)
        snprintf(w->err, sizeof w->err, "%s", tide_last_error());
    return NULL;
}

/* Loads every coordinate of l in parallel (one thread each) into pre-touched buffers;
   returns seconds, *bytes the bytes delivered. */
static double parallel_load(const tide_ckpt_t *ck, const tide_layout_t *l, loader *w,
                            uint64_t *bytes)
{
    size_t n = tide_layout_size(l);
    pthread_t *th = tide_calloc(n, sizeof *th);
    *bytes = 0;
    uint64_t t0 = tide_now_ns();
    for (size_t k = 0; k < n; k++)
        pthread_create(&th[k], NULL, load_main, &w[k]);
    for (size_t k = 0; k < n; k++)
        pthread_join(th[k], NULL);
    double s = (double)(tide_now_ns() - t0) * 1e-9;
    for (size_t k = 0; k < n; k++) {
        if (w[k].rc != TIDE_OK) {
            fprintf(stderr, "%s: load failed: %s\n", PROG, w[k].err);
            s = -1;
        }
        *bytes += w[k].st.bytes_needed;
    }
    tide_free(th);
    (void)ck;
    return s;
}

static loader *make_loaders(const tide_ckpt_t *ck, const tide_layout_t *l)
{
    const tide_collection_t *c = tide_ckpt_collection(ck);
    size_t n = tide_layout_size(l), nt = tide_collection_size(c);
    loader *w = tide_calloc(n, sizeof *w);
    for (int p = 0; p < l->pp; p++)
        for (int d = 0; d < l->dp; d++)
            for (int t = 0; t < l->tp; t++) {
                loader *x = &w[tide_layout_index(l, p, d, t)];
                *x = (loader){ck, l, p, d, t, tide_calloc(nt, sizeof(void *)), {0, 0, 0}, 0, ""};
                for (size_t i = 0; i < nt; i++) {
                    uint64_t b = tide_shard_bytes(l, c, i, p, d, t);
                    if (b > 0) {
                        x->bufs[i] = tide_malloc(b);
                        memset(x->bufs[i], 1, b); /* no page faults while timed */
                    }
                }
            }
    return w;
}

static void free_loaders(const tide_ckpt_t *ck, const tide_layout_t *l, loader *w)
{
    size_t nt = tide_collection_size(tide_ckpt_collection(ck));
    for (size_t k = 0; k < tide_layout_size(l); k++) {
        for (size_t i = 0; i < nt; i++)
            tide_free(w[k].bufs[i]);
        tide_free(w[k].bufs);
    }
    tide_free(w);
}

/* Writes a checkpoint of a GPT-like state under (2, 2, 2) into root; its dir into dir. */
static int make_checkpoint(const char *root, long long hidden, tide_collection_t **cout, char *dir,
                           size_t len)
{
    tide_model_spec s = {.layers = 8,
                         .hidden = hidden,
                         .ffn = 4 * hidden,
                         .heads = 8,
                         .vocab = 8 * hidden,
                         .attention = 1,
                         .adam = 1,
                         .zero1 = 0,
                         .dtype = TIDE_F32};
    tide_collection_t *c = NULL;
    tide_layout_t *l = NULL;
    if (tide_collection_build_gpt(&c, &s) != TIDE_OK ||
        tide_layout_new(&l, 2, 2, 2, s.layers, 4) != TIDE_OK ||
        tide_layout_validate(l, c) != TIDE_OK) {
        fprintf(stderr, "%s: model: %s\n", PROG, tide_last_error());
        return -1;
    }
    tide_ckpt_step_dir(root, 100, dir, len);
    size_t nt = tide_collection_size(c);
    int rc = 0;
    for (int p = 0; p < 2 && rc == 0; p++)
        for (int t = 0; t < 2 && rc == 0; t++) {
            void **b = tide_calloc(nt, sizeof *b);
            for (size_t i = 0; i < nt; i++) {
                uint64_t n = tide_shard_bytes(l, c, i, p, 0, t);
                if (n == 0)
                    continue;
                b[i] = tide_malloc(n);
                float *f = b[i];
                for (uint64_t k = 0; k < n / 4; k++)
                    f[k] = (float)((k * 2654435761u + i) % 1000003) * 1e-6f;
            }
            if (tide_ckpt_write_shard(dir, l, c, p, 0, t, (const void *const *)b, 7) != TIDE_OK)
                rc = -1;
            for (size_t i = 0; i < nt; i++)
                tide_free(b[i]);
            tide_free(b);
        }
    if (rc == 0 && tide_ckpt_publish(dir, l, c, 100, 7, 1000) != TIDE_OK)
        rc = -1;
    if (rc != 0)
        fprintf(stderr, "%s: writing the checkpoint: %s\n", PROG, tide_last_error());
    tide_layout_destroy(&l);
    *cout = c;
    return rc;
}

/* ---- 3. step rate with a full checkpoint disk ----------------------------------------- */

typedef struct disk_args {
    const char *work, *endpoint, *wrap;
    long long steps, every, hidden, pace_ms, timeout_ms;
} disk_args;

enum { DISK_NONE, DISK_OK, DISK_FULL, DISK_MODES };
static const char *const disk_mode_name[DISK_MODES] = {"none", "working", "full"};

/* Writes the rank wrapper: rank 1 runs in a mount namespace of its own where a 2 MiB
   tmpfs full to the last byte lies over the checkpoint root ($CKB_FULL_ROOT, set for the
   full-disk runs only); every rank of every mode goes through it alike. */
static int write_wrapper(const char *path)
{
    FILE *f = fopen(path, "w");
    if (f == NULL) {
        perror(PROG ": the rank wrapper");
        return -1;
    }
    fputs("#!/bin/sh\n"
          "if [ -n \"${CKB_FULL_ROOT:-}\" ] && [ \"${OMPI_COMM_WORLD_RANK:-}\" = 1 ]; then\n"
          "  exec unshare -m --propagation private sh -c 'mount -t tmpfs -o size=2m "
          "ckpt-bench-full \"$0\" || exit 99\n"
          "    dd if=/dev/zero of=\"$0/fill\" bs=64k > /dev/null 2>&1\n"
          "    exec \"$@\"' \"$CKB_FULL_ROOT\" \"$@\"\n"
          "fi\n"
          "exec \"$@\"\n",
          f);
    fclose(f);
    return chmod(path, 0755);
}

/* Whether this process may mount a tmpfs in a mount namespace of its own (root, and
   mounts not refused by a container); *why gets the reason when not. */
static int can_mount_tmpfs(const char *work, const char **why)
{
    if (geteuid() != 0) {
        *why = "not root";
        return 0;
    }
    char cmd[1200];
    snprintf(cmd, sizeof cmd,
             "mkdir -p '%s/probe' && unshare -m --propagation private sh -c "
             "'mount -t tmpfs -o size=64k ckpt-bench-probe \"%s/probe\"' > /dev/null 2>&1",
             work, work);
    if (system(cmd) != 0) {
        *why = "unshare -m with a tmpfs mount was refused";
        return 0;
    }
    return 1;
}

/* Steps per second from step start to step start in a --trace-out file, over the steps
   from `skip` on (the first ones pay for warm-up): what the user sees, saves included. */
static double trace_rate(const char *path, long long skip, long long *n_out)
{
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return -1;
    char line[512];
    long long step, gen, n = 0;
    long long t0, t1, first = -1, last = -1;
    while (fgets(line, sizeof line, f) != NULL) {
        if (sscanf(line, "step %lld gen %lld start_us %lld end_us %lld", &step, &gen, &t0, &t1) !=
                4 ||
            step < skip)
            continue;
        if (first < 0)
            first = t0;
        last = t0;
        n++;
    }
    fclose(f);
    *n_out = n;
    return n > 1 && last > first ? (double)(n - 1) / ((double)(last - first) * 1e-6) : -1;
}

/* Whether a full-disk run's log shows why it exited non-zero: its saves failed, as
   reported at the end (tide_checkpoint_wait), after its steps were trained. */
static int failed_on_disk(const char *log)
{
    FILE *f = fopen(log, "r");
    char line[2048];
    int yes = 0;
    while (f != NULL && !yes && fgets(line, sizeof line, f) != NULL)
        yes = strstr(line, "No space left on device") != NULL ||
              strstr(line, "was not written within") != NULL;
    if (f != NULL)
        fclose(f);
    return yes;
}

/* One --tide job of a->steps steps, dp 2 with ZeRO-1 (each rank writes a shard), paced
   to a->pace_ms a step, in mode DISK_*; *rate gets its steps/s. */
static int disk_once(const disk_args *a, int mode, int rep, double *rate)
{
    char root[1024], log[1024], trace[1024], job[64];
    snprintf(root, sizeof root, "%s/disk-%d-%d", a->work, mode, rep);
    snprintf(log, sizeof log, "%s/disk-%d-%d.log", a->work, mode, rep);
    snprintf(trace, sizeof trace, "%s/disk-%d-%d.trace", a->work, mode, rep);
    snprintf(job, sizeof job, "ckpt-bench-%s-%d", disk_mode_name[mode], rep);
    mkdir(root, 0755);
    bench_cmd c;
    bench_mpirun(&c, MPIRUN_PATH, 2);
    bench_add(&c, "-x");
    bench_add(&c, "CKB_FULL_ROOT");
    bench_add(&c, "-x");
    bench_add(&c, "TIDE_CKPT_TIMEOUT_MS");
    bench_add(&c, a->wrap);
    bench_add(&c, TRAIN_MLP_PATH);
    bench_add(&c, "--tide");
    bench_add(&c, "--endpoint");
    bench_add(&c, a->endpoint);
    bench_add(&c, "--job");
    bench_add(&c, job);
    bench_addf(&c, "--dp", 2);
    bench_add(&c, "--zero1");
    bench_addf(&c, "--layers", 4);
    bench_addf(&c, "--hidden", a->hidden);
    bench_addf(&c, "--ffn", 2 * a->hidden);
    bench_addf(&c, "--seq", 8);
    bench_addf(&c, "--global-batch", 16);
    bench_addf(&c, "--micro-batches", 2);
    bench_addf(&c, "--steps", a->steps);
    bench_addf(&c, "--pace-ms", a->pace_ms);
    bench_addf(&c, "--print-every", 1000000);
    bench_add(&c, "--trace-out");
    bench_add(&c, trace);
    if (mode != DISK_NONE) {
        bench_add(&c, "--ckpt-save");
        bench_add(&c, root);
        bench_addf(&c, "--ckpt-every", a->every);
        bench_addf(&c, "--ckpt-keep", 2);
    }
    char tmo[32];
    snprintf(tmo, sizeof tmo, "%lld", a->timeout_ms);
    setenv("TIDE_CKPT_TIMEOUT_MS", tmo, 1);
    setenv("CKB_FULL_ROOT", mode == DISK_FULL ? root : "", 1);
    pid_t pid = bench_spawn_logged(PROG, c.argv, log);
    unsetenv("CKB_FULL_ROOT");
    unsetenv("TIDE_CKPT_TIMEOUT_MS");
    if (pid < 0)
        return -1;
    int st = 0;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {
    }
    int ok = WIFEXITED(st) && WEXITSTATUS(st) == 0;
    long long n = 0;
    *rate = trace_rate(trace, 5, &n);
    if (!ok && mode == DISK_FULL && n >= a->steps - 5 && failed_on_disk(log))
        ok = 1; /* trained every step; the failed saves reported at the end */
    if (!ok || *rate <= 0) {
        fprintf(stderr, "%s: the %s-disk run failed (status %d, %lld steps traced); the end of %s:\n",
                PROG, disk_mode_name[mode], st, n, log);
        char cmd[1200];
        snprintf(cmd, sizeof cmd, "tail -15 '%s' >&2", log);
        if (system(cmd) != 0)
            fprintf(stderr, "(could not show %s)\n", log);
        return -1;
    }
    remove_tree(root);
    return 0;
}

typedef struct disk_result {
    const char *skipped; /* why part 3 did not run (NULL: it ran) */
    double rate[DISK_MODES]; /* median steps/s */
    double ratio;            /* full / working */
} disk_result;

/* Part 3: tided, then the three modes interleaved a->reps times (so that the machine's
   load weighs on each alike); medians into *r. */
static int disk_part(disk_args *a, long long reps, disk_result *r)
{
    memset(r, 0, sizeof *r);
    char wrap[1024];
    snprintf(wrap, sizeof wrap, "%s/rank-wrap.sh", a->work);
    a->wrap = wrap;
    if (!can_mount_tmpfs(a->work, &r->skipped))
        return 0;
    if (write_wrapper(wrap) != 0)
        return -1;
    coord_proc cp;
    const char *const flags[] = {"--heartbeat-ms", "100", "--miss-limit", "50", NULL};
    /* tided's log (its warnings about a starved CPU on a busy machine) into a file */
    char tlog[1024];
    snprintf(tlog, sizeof tlog, "%s/tided.log", a->work);
    fflush(stderr);
    int saved = dup(2), lfd = open(tlog, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (lfd >= 0)
        dup2(lfd, 2);
    int started = coord_tmpdir(&cp) == 0 && coord_start(&cp, TIDED_PATH, flags, NULL) == 0;
    if (saved >= 0) {
        dup2(saved, 2);
        close(saved);
    }
    if (lfd >= 0)
        close(lfd);
    if (!started) {
        fprintf(stderr, "%s: tided did not start (%s; its log: %s)\n", PROG, TIDED_PATH, tlog);
        return -1;
    }
    a->endpoint = cp.endpoint;
    double *v[DISK_MODES];
    for (int m = 0; m < DISK_MODES; m++)
        v[m] = tide_calloc((size_t)reps, sizeof(double));
    int rc = 0;
    for (long long k = 0; k < reps && rc == 0; k++)
        for (int m = 0; m < DISK_MODES && rc == 0; m++)
            rc = disk_once(a, m, (int)k, &v[m][k]);
    for (int m = 0; m < DISK_MODES; m++) {
        if (rc == 0)
            r->rate[m] = median(v[m], (int)reps);
        tide_free(v[m]);
    }
    r->ratio = r->rate[DISK_OK] > 0 ? r->rate[DISK_FULL] / r->rate[DISK_OK] : 0;
    coord_stop(&cp, SIGTERM);
    coord_cleanup(&cp);
    return rc;
}

static void disk_print(const disk_args *a, const disk_result *r)
{
    printf("\n%-44s %12s\n", "step rate, a full checkpoint disk", "steps/s");
    if (r->skipped != NULL) {
        printf("skipped: needs root for a tmpfs (%s)\n", r->skipped);
        return;
    }
    printf("%-44s %12.2f\n", "no checkpoints", r->rate[DISK_NONE]);
    printf("%-44s %12.2f\n", "saves to a working disk", r->rate[DISK_OK]);
    printf("%-44s %12.2f\n", "saves to a full disk (rank 1's)", r->rate[DISK_FULL]);
    printf("%-44s %12.3f  (goal >= 0.90: %s)\n", "full / working", r->ratio,
           r->ratio >= 0.90 ? "met" : "missed");
    printf("train_mlp --tide dp 2 --zero1, hidden %lld, paced to %lld ms (%.0f steps/s), %lld "
           "steps, a save every %lld, TIDE_CKPT_TIMEOUT_MS=%lld\n",
           a->hidden, a->pace_ms, 1000.0 / (double)a->pace_ms, a->steps, a->every, a->timeout_ms);
}

static void disk_json(FILE *f, const disk_args *a, long long reps, const disk_result *r)
{
    if (r->skipped != NULL) {
        fprintf(f, "  \"disk\": {\"skipped\": \"needs root for a tmpfs: %s\"}", r->skipped);
        return;
    }
    fprintf(f,
            "  \"disk\": {\"ranks\": 2, \"hidden\": %lld, \"steps\": %lld, \"every\": %lld, "
            "\"pace_ms\": %lld, \"timeout_ms\": %lld, \"reps\": %lld,\n    \"steps_per_s_none\": "
            "%.4f, \"steps_per_s_working\": %.4f, \"steps_per_s_full\": %.4f,\n    "
            "\"full_over_working\": %.4f, \"goal\": 0.90, \"goal_met\": %s}",
            a->hidden, a->steps, a->every, a->pace_ms, a->timeout_ms, reps, r->rate[DISK_NONE],
            r->rate[DISK_OK], r->rate[DISK_FULL], r->ratio, r->ratio >= 0.90 ? "true" : "false");
}

/* --disk-only: part 3 alone, its table and a results file holding it; removes rm_work
   (NULL: keeps it). Returns the exit code. */
static int disk_alone(disk_args *a, long long reps, const char *out, const char *rm_work)
{
    disk_result r;
    printf("%s: step rate with a full checkpoint disk, %lld reps; %ld cores\n", PROG, reps,
           sysconf(_SC_NPROCESSORS_ONLN));
    fflush(stdout);
    if (disk_part(a, reps, &r) != 0)
        return 1;
    disk_print(a, &r);
    FILE *f = bench_out_open(PROG, out);
    if (f != NULL) {
        fprintf(f, "{\n  \"bench\": \"ckpt_bench\",\n");
        disk_json(f, a, reps, &r);
        fprintf(f, "\n}\n");
        fclose(f);
        printf("numbers written to %s\n", out);
    }
    if (rm_work != NULL)
        remove_tree(rm_work);
    return f != NULL ? 0 : 1;
}

int main(int argc, char **argv)
{
    long long reps, steps, every, hidden, load_hidden, ranks, disk_reps;
    int keep_work = 0, disk_only = 0;
    disk_args da = {NULL, NULL, NULL, 0, 0, 0, 0, 0};
    const char *work = NULL, *out = NULL;
    const tide_opt opts[] = {
        {"reps", NULL, TIDE_OPT_INT, &reps, "3", "runs per configuration (median)", 1, 100},
        {"steps", NULL, TIDE_OPT_INT, &steps, "100", "training steps per run", 2, 1 << 20},
        {"every", NULL, TIDE_OPT_INT, &every, "5", "steps between checkpoints", 1, 1 << 20},
        {"hidden", NULL, TIDE_OPT_INT, &hidden, "512", "train_mlp width (ffn = 4x)", 8, 1 << 16},
        {"ranks", NULL, TIDE_OPT_INT, &ranks, "1",
         "training ranks (tp) in part 1; keep one core free for the writer thread", 1, 64},
        {"load-hidden", NULL, TIDE_OPT_INT, &load_hidden, "768",
         "width of the GPT state loaded in part 2 (768: ~0.9 GiB with Adam)", 8, 1 << 16},
        {"work", NULL, TIDE_OPT_STRING, &work, NULL, "scratch folder (default: a new /var/tmp one)",
         0, 0},
        {"out", NULL, TIDE_OPT_STRING, &out, "bench-out/ckpt_bench.json", "results file", 0, 0},
        {"keep-work", NULL, TIDE_OPT_BOOL, &keep_work, "0", "keep the scratch folder", 0, 0},
        {"disk-reps", NULL, TIDE_OPT_INT, &disk_reps, "3", "part 3: runs per mode (median)", 1, 100},
        {"disk-steps", NULL, TIDE_OPT_INT, &da.steps, "120", "part 3: steps per run", 20, 1 << 20},
        {"disk-every", NULL, TIDE_OPT_INT, &da.every, "10", "part 3: steps between saves", 1,
         1 << 20},
        {"disk-hidden", NULL, TIDE_OPT_INT, &da.hidden, "128", "part 3: train_mlp width", 8,
         1 << 16},
        {"disk-pace-ms", NULL, TIDE_OPT_INT, &da.pace_ms, "25", "part 3: ms a step (--pace-ms)", 1,
         10000},
        {"disk-timeout-ms", NULL, TIDE_OPT_INT, &da.timeout_ms, "2000",
         "part 3: TIDE_CKPT_TIMEOUT_MS, the bound of a save", 1, 1 << 30},
        {"disk-only", NULL, TIDE_OPT_BOOL, &disk_only, "0", "run part 3 alone", 0, 0},
        {NULL, NULL, 0, NULL, NULL, NULL, 0, 0},
    };
    int code = tide_opts_main(opts, argc, argv, PROG);
    if (code >= 0)
        return code;
    char wbuf[256];
    if (work == NULL) {
        snprintf(wbuf, sizeof wbuf, "/var/tmp/ckpt_bench-XXXXXX");
        if (mkdtemp(wbuf) == NULL) {
            perror(PROG ": mkdtemp");
            return 1;
        }
        work = wbuf;
    } else
        mkdir(work, 0755);

    da.work = work;
    if (disk_only)
        return disk_alone(&da, disk_reps, out, keep_work ? NULL : work);

    /* 1. training cost */
    train_args ta = {work, steps, every, hidden, 4 * hidden, 8, ranks};
    int saves = (int)((steps - 1) / every);
    double *loop[3], *blocked[3];
    for (int m = 0; m < 3; m++) {
        loop[m] = tide_calloc((size_t)reps, sizeof(double));
        blocked[m] = tide_calloc((size_t)reps, sizeof(double));
    }
    printf("%s: training cost: train_mlp tp %lld, 8 layers, hidden %lld, %lld steps, a checkpoint "
           "every %lld (%d saves), %lld reps; %ld cores\n",
           PROG, ranks, hidden, steps, every, saves, reps, sysconf(_SC_NPROCESSORS_ONLN));
    fflush(stdout);
    for (int r = 0; r < reps; r++)
        for (int m = 0; m < 3; m++)
            if (train_once(&ta, m, r, &loop[m][r], &blocked[m][r]) != 0)
                return 1;
    double l0 = median(loop[0], (int)reps), l1 = median(loop[1], (int)reps),
           l2 = median(loop[2], (int)reps);
    double b1 = median(blocked[1], (int)reps), b2 = median(blocked[2], (int)reps);
    double cost_sync = (l1 - l0) / saves, cost_async = (l2 - l0) / saves;
    double ratio = cost_sync > 0 ? cost_async / cost_sync : 0;
    double blocked_ratio = b1 > 0 ? b2 / b1 : 0;

    /* 2. load throughput */
    char root[600], dir[1024];
    snprintf(root, sizeof root, "%s/load", work);
    tide_collection_t *c = NULL;
    if (make_checkpoint(root, load_hidden, &c, dir, sizeof dir) != 0)
        return 1;
    tide_ckpt_t *ck = NULL;
    if (tide_ckpt_open(&ck, dir) != TIDE_OK) {
        fprintf(stderr, "%s: %s\n", PROG, tide_last_error());
        return 1;
    }
    const struct {
        int dp, tp, pp;
        const char *stages;
    } to[] = {{1, 4, 2, NULL}, {1, 2, 4, "0-1,2-4,5-5,6-7"}};
    double seq_gbs[2], load_gbs[2];
    uint64_t state = tide_collection_bytes(c);
    for (int k = 0; k < 2; k++) {
        tide_layout_t *l = NULL;
        if (tide_layout_new(&l, to[k].dp, to[k].tp, to[k].pp, 8, 4) != TIDE_OK ||
            (to[k].stages != NULL && tide_layout_parse_stages(l, to[k].stages) != TIDE_OK)) {
            fprintf(stderr, "%s: layout: %s\n", PROG, tide_last_error());
            return 1;
        }
        loader *w = make_loaders(ck, l);
        double sv[3], lv[3];
        for (int r = 0; r < 3; r++) {
            uint64_t sb = 0, lb = 0;
            drop_cache(ck);
            double ss = seq_read(ck, &sb);
            drop_cache(ck);
            double ls = parallel_load(ck, l, w, &lb);
            if (ls < 0 || lb < state) {
                fprintf(stderr, "%s: the load delivered %llu bytes of %llu\n", PROG,
                        (unsigned long long)lb, (unsigned long long)state);
                return 1;
            }
            /* unique state bytes per second (tp-replicated tensors reach every tp rank,
               so more bytes are delivered than the files hold) */
            sv[r] = (double)sb / ss / 1e9;
            lv[r] = (double)state / ls / 1e9;
        }
        seq_gbs[k] = median(sv, 3);
        load_gbs[k] = median(lv, 3);
        free_loaders(ck, l, w);
        tide_layout_destroy(&l);
    }

    /* 3. step rate with a full checkpoint disk */
    disk_result dr;
    if (disk_part(&da, disk_reps, &dr) != 0)
        return 1;

    printf("\n%-44s %12s %12s\n", "training cost per checkpoint", "loop s", "per ckpt ms");
    printf("%-44s %12.3f %12s\n", "no checkpoints", l0, "-");
    printf("%-44s %12.3f %12.1f\n", "synchronous saves", l1, cost_sync * 1e3);
    printf("%-44s %12.3f %12.1f\n", "asynchronous saves", l2, cost_async * 1e3);
    printf("%-44s %25.3f  (goal <= 0.1)\n", "async / sync", ratio);
    printf("%-44s %12.1f %12.1f\n", "time blocked in save calls: sync / async ms", b1 * 1e3 / saves,
           b2 * 1e3 / saves);
    printf("\n%-44s %12s %12s %8s\n", "load of a (2,2,2) checkpoint, page cache dropped",
           "seq GB/s", "load GB/s", "ratio");
    for (int k = 0; k < 2; k++) {
        char name[64];
        snprintf(name, sizeof name, "into (%d, %d, %d)%s, %d threads", to[k].dp, to[k].tp, to[k].pp,
                 to[k].stages ? " uneven" : "", to[k].dp * to[k].tp * to[k].pp);
        printf("%-44s %12.2f %12.2f %8.2f\n", name, seq_gbs[k], load_gbs[k],
               load_gbs[k] / seq_gbs[k]);
    }
    printf("state %.0f MiB; goal: load / seq >= 0.8\n", (double)state / 1048576.0);
    disk_print(&da, &dr);

    FILE *f = bench_out_open(PROG, out);
    if (f != NULL) {
        fprintf(f,
                "{\n  \"bench\": \"ckpt_bench\",\n  \"train\": {\"ranks\": %lld, \"hidden\": %lld, "
                "\"steps\": %lld, "
                "\"every\": %lld, \"saves\": %d, \"reps\": %lld,\n    \"loop_s_none\": %.6f, "
                "\"loop_s_sync\": %.6f, \"loop_s_async\": %.6f,\n    \"cost_ms_sync\": %.3f, "
                "\"cost_ms_async\": %.3f, \"async_over_sync\": %.4f,\n    \"blocked_ms_sync\": "
                "%.3f, \"blocked_ms_async\": %.3f, \"blocked_async_over_sync\": %.4f},\n"
                "  \"load\": {\"state_bytes\": %llu,\n",
                ranks, hidden, steps, every, saves, reps, l0, l1, l2, cost_sync * 1e3,
                cost_async * 1e3, ratio, b1 * 1e3 / saves, b2 * 1e3 / saves, blocked_ratio,
                (unsigned long long)state);
        for (int k = 0; k < 2; k++)
            fprintf(f,
                    "    \"into_%d_%d_%d\": {\"seq_gbs\": %.4f, \"load_gbs\": %.4f, \"ratio\": "
                    "%.4f}%s\n",
                    to[k].dp, to[k].tp, to[k].pp, seq_gbs[k], load_gbs[k], load_gbs[k] / seq_gbs[k],
                    k == 0 ? "," : "");
        fprintf(f, "  },\n");
        disk_json(f, &da, disk_reps, &dr);
        fprintf(f, "\n}\n");
        fclose(f);
        printf("numbers written to %s\n", out);
    }
    tide_ckpt_close(&ck);
    tide_collection_destroy(&c);
    for (int m = 0; m < 3; m++) {
        tide_free(loop[m]);
        tide_free(blocked[m]);
    }
    if (!keep_work)
        remove_tree(work);
    return 0;
}
