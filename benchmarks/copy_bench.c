/*
 * copy_bench: what one byte costs on this machine in each way the mpi backend can move
 * host memory between two processes of one host, and what that allows reshard_bench's
 * ratios to reach when the copies, not the links, are the limit.
 *
 * Run: `build/benchmarks/copy_bench [--mib 64] [--reps 7]`. A forked peer process
 * holds its buffers; this process copies --mib MiB to or from them, for rows ("runs")
 * of 1 KiB to 64 KiB at twice their size apart (a tensor-parallel split of a row-major
 * weight in two) and for one contiguous range:
 *   memcpy         contiguous copy inside this process (the ceiling of any copy);
 *   pack           the same rows gathered into contiguous memory inside this process;
 *   kernel contig  process_vm_readv of a contiguous range: what Open MPI's shared-memory
 *                  transport does for a large contiguous message (plain MPI, and the
 *                  reshard_bench baseline);
 *   kernel push    process_vm_writev from strided rows here into a contiguous range of
 *                  the peer: the executor's single copy when the sender is strided;
 *   kernel pull    process_vm_readv from strided rows of the peer into a contiguous
 *                  range here (the kernel pins pages per remote row).
 * Each figure is the median GB/s over --reps. "ceiling" is the best reshard_bench
 * r_net a plan can reach when half its bytes travel strided (TP 2->4 of an MLP: the
 * column-split weights and their moments) and the cores are all busy (8 ranks on 2
 * cores): the executor's single copies against the baseline's contiguous ones,
 *   ceiling = 1 / (0.5 + 0.5 * contig / push).
 * With idle cores the copies of a pair's two ends run at once and the ceiling does not
 * apply. Numbers go to --out (default bench-out/copy_bench.json).
 *
 * Memory: 3 x --mib MiB here and 2 x --mib MiB in the peer.
 */
#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include "benchmarks/bench_out.h"
#include "core/clock.h"
#include "core/opts.h"

enum { W_MEMCPY, W_PACK, W_CONTIG, W_PUSH, W_PULL, W_COUNT };
static const char *const w_names[W_COUNT] = {"memcpy", "pack", "kernel_contig", "kernel_push",
                                             "kernel_pull"};

/* Row sizes measured (bytes); 0 is the contiguous range. */
static const size_t runs[] = {1024, 2368, 4096, 4736, 16384, 65536};
#define N_RUNS (sizeof runs / sizeof runs[0])

/* Most iovecs one system call takes (IOV_MAX on Linux). */
#define IOVS 1024

typedef struct ctx {
    pid_t peer;
    char *src, *dst, *pack;    /* here: strided rows, contiguous target, packing target */
    char *peer_src, *peer_dst; /* the peer's strided rows and contiguous range (same
                                  addresses as ours: the peer is a fork) */
    size_t bytes;
    struct iovec iov[IOVS];
} ctx;

static double seconds(void)
{
    return (double)tide_now_ns() * 1e-9;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* The whole of one process_vm_* call, retried on a short count: 0 or -1 (errno). */
static int vm_copy(pid_t pid, int write, struct iovec *l, size_t nl, struct iovec *r, size_t nr,
                   size_t want)
{
    ssize_t got =
        write ? process_vm_writev(pid, l, nl, r, nr, 0) : process_vm_readv(pid, l, nl, r, nr, 0);
    if (got < 0)
        return -1;
    if ((size_t)got != want) {
        errno = EIO;
        return -1;
    }
    return 0;
}

/* One timed pass of way w with rows of run bytes (0: contiguous); seconds, or -1. */
static double pass(ctx *c, int w, size_t run)
{
    size_t rows = run ? c->bytes / run : 1, stride = 2 * run;
    double t0 = seconds();
    switch (w) {
    case W_MEMCPY:
        memcpy(c->dst, c->src, c->bytes);
        break;
    case W_PACK:
        for (size_t r = 0; r < rows; r++)
            memcpy(c->pack + r * run, c->src + r * stride, run);
        break;
    case W_CONTIG: {
        struct iovec l = {c->dst, c->bytes}, r = {c->peer_dst, c->bytes};
        if (vm_copy(c->peer, 0, &l, 1, &r, 1, c->bytes) != 0)
            return -1;
        break;
    }
    case W_PUSH:
    case W_PULL:
        for (size_t r = 0; r < rows; r += IOVS) {
            size_t n = rows - r < IOVS ? rows - r : IOVS;
            char *base = w == W_PUSH ? c->src : c->peer_src;
            for (size_t i = 0; i < n; i++)
                c->iov[i] = (struct iovec){base + (r + i) * stride, run};
            if (w == W_PUSH) {
                struct iovec far = {c->peer_dst + r * run, n * run};
                if (vm_copy(c->peer, 1, c->iov, n, &far, 1, n * run) != 0)
                    return -1;
            } else {
                struct iovec near = {c->dst + r * run, n * run};
                if (vm_copy(c->peer, 0, &near, 1, c->iov, n, n * run) != 0)
                    return -1;
            }
        }
        break;
    default:
        return -1;
    }
    return seconds() - t0;
}

/* Median GB/s of way w at run over reps passes (after one warm-up), or -1. */
static double rate(ctx *c, int w, size_t run, int reps, double *samples)
{
    size_t rows = run ? c->bytes / run : 1;
    double gb = (double)(run ? rows * run : c->bytes) * 1e-9;
    if (pass(c, w, run) < 0)
        return -1;
    for (int k = 0; k < reps; k++) {
        double t = pass(c, w, run);
        if (t < 0)
            return -1;
        samples[k] = gb / t;
    }
    qsort(samples, (size_t)reps, sizeof *samples, cmp_double);
    return reps % 2 ? samples[reps / 2] : (samples[reps / 2 - 1] + samples[reps / 2]) / 2;
}

/* The best r_net of a plan with half its bytes in rows of runs[i] when the cores are all
   busy: the executor's single copies against the baseline's contiguous ones. */
static double ceiling(double res[N_RUNS + 1][W_COUNT], size_t i)
{
    return 1.0 / (0.5 + 0.5 * res[N_RUNS][W_CONTIG] / res[i][W_PUSH]);
}

/* 0 when the numbers are in path. */
static int write_json(const char *path, long long mib, double res[N_RUNS + 1][W_COUNT])
{
    FILE *f = bench_out_open("copy_bench", path);
    if (f == NULL)
        return -1;
    fprintf(f, "{\n  \"benchmark\": \"copy_bench\",\n  \"mib\": %lld,\n  \"rows\": [\n", mib);
    for (size_t i = 0; i <= N_RUNS; i++) {
        fprintf(f, "    {\"run_bytes\": %zu", i < N_RUNS ? runs[i] : (size_t)0);
        for (int w = 0; w < W_COUNT; w++)
            if (res[i][w] >= 0)
                fprintf(f, ", \"%s_gbs\": %.3f", w_names[w], res[i][w]);
        if (i < N_RUNS)
            fprintf(f, ", \"ceiling\": %.3f", ceiling(res, i));
        fprintf(f, "}%s\n", i < N_RUNS ? "," : "");
    }
    fprintf(f, "  ]\n}\n");
    return fclose(f) == 0 ? 0 : -1;
}

int main(int argc, char **argv)
{
    long long mib = 64, reps = 7;
    const char *out = "bench-out/copy_bench.json";
    tide_opt opts[] = {
        {"mib", "TIDE_BENCH_MIB", TIDE_OPT_INT, &mib, "64", "bytes per copy (MiB)", 1, 4096},
        {"reps", "TIDE_BENCH_REPS", TIDE_OPT_INT, &reps, "7", "timed passes (median)", 1, 1000},
        {"out", "TIDE_BENCH_OUT", TIDE_OPT_STRING, &out, "bench-out/copy_bench.json",
         "where the numbers go (JSON)", 0, 0},
        {NULL, NULL, 0, NULL, NULL, NULL, 0, 0},
    };
    int code = tide_opts_main(opts, argc, argv, "copy_bench");
    if (code >= 0)
        return code;
    ctx c;
    memset(&c, 0, sizeof c);
    c.bytes = (size_t)mib << 20;
    /* strided rows span twice the bytes; every buffer touched before the fork so that
       the peer's copies are its own pages once it writes them */
    c.src = malloc(2 * c.bytes);
    c.dst = malloc(c.bytes);
    c.pack = malloc(c.bytes);
    double *samples = malloc((size_t)reps * sizeof *samples);
    if (!c.src || !c.dst || !c.pack || !samples) {
        fprintf(stderr, "copy_bench: out of memory for %lld MiB buffers (lower --mib)\n", mib);
        return 1;
    }
    memset(c.src, 0x5a, 2 * c.bytes);
    memset(c.dst, 0, c.bytes);
    memset(c.pack, 0, c.bytes);
    int ready[2];
    if (pipe(ready) != 0) {
        perror("copy_bench: pipe");
        return 1;
    }
    pid_t pid = fork();
    if (pid < 0) {
        perror("copy_bench: fork");
        return 1;
    }
    if (pid == 0) {
        /* The peer: make its pages its own (copy-on-write after fork), say so, and
           wait to be killed. */
        memset(c.src, 0xa5, 2 * c.bytes);
        memset(c.dst, 1, c.bytes);
        char b = 1;
        if (write(ready[1], &b, 1) != 1)
            _exit(1);
        for (;;)
            pause();
    }
    char b = 0;
    if (read(ready[0], &b, 1) != 1) {
        fprintf(stderr, "copy_bench: the peer process did not start\n");
        kill(pid, SIGKILL);
        return 1;
    }
    c.peer = pid;
    c.peer_src = c.src;
    c.peer_dst = c.dst;

    double res[N_RUNS + 1][W_COUNT];
    int failed = 0;
    for (size_t i = 0; i <= N_RUNS && !failed; i++)
        for (int w = 0; w < W_COUNT; w++) {
            size_t run = i < N_RUNS ? runs[i] : 0;
            res[i][w] = -1;
            if ((run == 0) != (w == W_MEMCPY || w == W_CONTIG))
                continue; /* contiguous ways once, strided ways per run */
            res[i][w] = rate(&c, w, run, (int)reps, samples);
            if (res[i][w] < 0) {
                fprintf(stderr,
                        "copy_bench: %s failed: %s (cross-memory attach needs ptrace "
                        "permission over the peer, e.g. kernel.yama.ptrace_scope <= 1)\n",
                        w_names[w], strerror(errno));
                failed = 1;
                break;
            }
        }
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    if (failed)
        return 1;

    double contig = res[N_RUNS][W_CONTIG];
    printf("copy_bench: %lld MiB per copy, median of %lld passes (GB/s)\n", mib, reps);
    printf("memcpy %.2f, kernel contig %.2f (plain MPI's single copy)\n", res[N_RUNS][W_MEMCPY],
           contig);
    printf("%10s %8s %12s %12s %12s\n", "run bytes", "pack", "kernel push", "kernel pull",
           "ceiling");
    for (size_t i = 0; i < N_RUNS; i++)
        printf("%10zu %8.2f %12.2f %12.2f %12.2f\n", runs[i], res[i][W_PACK], res[i][W_PUSH],
               res[i][W_PULL], ceiling(res, i));
    int wrote = write_json(out, mib, res) == 0;
    if (wrote)
        printf("numbers written to %s\n", out);
    free(samples);
    free(c.src);
    free(c.dst);
    free(c.pack);
    return wrote ? 0 : 1;
}
