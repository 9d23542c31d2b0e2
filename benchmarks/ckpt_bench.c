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
 *   build/benchmarks/ckpt_bench [--reps 3] [--steps 100] [--every 5] [--hidden 512] [--ranks 1]
 *                               [--load-hidden 768] [--work DIR] [--out PATH]
 * Prints a table and writes bench-out/ckpt_bench.json.
 */
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "benchmarks/bench_out.h"
#include "benchmarks/bench_proc.h"
#include "ckpt/ckpt.h"
#include "core/alloc.h"
#include "core/clock.h"
#include "core/error.h"
#include "core/opts.h"

#define PROG "ckpt_bench"

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
    char cmd[1100];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    if (system(cmd) != 0)
        fprintf(stderr, "%s: could not remove %s\n", PROG, root);
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

int main(int argc, char **argv)
{
    long long reps, steps, every, hidden, load_hidden, ranks;
    int keep_work = 0;
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
        fprintf(f, "  }\n}\n");
        fclose(f);
        printf("numbers written to %s\n", out);
    }
    tide_ckpt_close(&ck);
    tide_collection_destroy(&c);
    for (int m = 0; m < 3; m++) {
        tide_free(loop[m]);
        tide_free(blocked[m]);
    }
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", work);
    if (!keep_work && system(cmd) != 0)
        fprintf(stderr, "%s: could not remove %s\n", PROG, work);
    return 0;
}
