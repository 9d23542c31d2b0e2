/*
 * coord_bench: tided under N simulated workers (default 1,000 and 10,000)
 * heartbeating at 1 Hz from a few client processes. Reports tided's CPU use
 * (utime + stime from /proc/<pid>/stat over a fixed window, as a fraction of
 * one core; goal < 0.25 at 10,000) and the latency of `tidectl status`
 * (a status request answered with one row per worker, decoded like tidectl
 * does) p50/p99 under that load, next to the same latency measured in the same
 * run before the heartbeats start (baseline).
 *
 * Honesty: by default every simulated worker has its own DEALER socket and TCP
 * connection (as real workers do), each client process multiplexing N/P of
 * them; registrations come from each socket, so tided sees N connections and N
 * routing ids, and heartbeats are spread evenly over each second. --shared
 * instead sends all of a process's workers over one socket (fewer connections:
 * cheaper for tided's I/O thread, shown for comparison only).
 */
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "benchmarks/bench_out.h"
#include "core/error.h"
#include "core/log.h"
#include "core/opts.h"
#include "tests/coord_harness.h"

typedef struct result {
    long workers;
    double cpu_core;           /* fraction of one core over the window */
    double base_p50, base_p99; /* ms, status latency before the load */
    double p50, p99;           /* ms, under load */
    long status_calls;
    long failed_after; /* workers tided declared failed (must be 0) */
} result;

static long ticks_of(pid_t pid)
{
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return -1;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    char *p = strrchr(buf, ')'); /* comm may hold spaces */
    if (p == NULL)
        return -1;
    unsigned long ut = 0, st = 0;
    /* after ')': state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime stime
     */
    if (sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut, &st) != 2)
        return -1;
    return (long)(ut + st);
}

/* One client process: registers its workers, waits for "go", heartbeats until killed. */
static void client(const char *endpoint, int first, int count, int shared, int go_fd, int ready_fd,
                   int report_fd)
{
    void *ctx = zmq_ctx_new();
    zmq_ctx_set(ctx, ZMQ_MAX_SOCKETS, count + 16);
    int nsock = shared ? 1 : count;
    void **sock = calloc((size_t)nsock, sizeof *sock);
    int32_t *id = calloc((size_t)count, sizeof *id);
    for (int i = 0; i < nsock; i++)
        sock[i] = coord_connect(ctx, endpoint, NULL, NULL, NULL, 30000);
    /* register in windows of 256 outstanding requests */
    for (int base = 0; base < count; base += 256) {
        int end = base + 256 < count ? base + 256 : count;
        for (int i = base; i < end; i++) {
            tide_msg_t m;
            char host[32];
            snprintf(host, sizeof host, "node%05d", (first + i) / 8);
            coord_mk_register(&m, "bench", first + i, 1 << 20, host, (first + i) % 8,
                              (int)getpid());
            coord_send(sock[shared ? 0 : i], &m);
        }
        for (int i = base; i < end; i++) {
            tide_msg_t r;
            if (coord_recv(sock[shared ? 0 : i], &r) != 0 || r.type != TIDE_MSG_REGISTER_OK) {
                /* the parent sees the closed pipe and stops everything */
                fprintf(stderr, "coord_bench: registration %d failed\n", first + i);
                _exit(1);
            }
            /* shared: replies come in order on the one socket */
            id[i] = r.u.register_ok.worker;
            tide_msg_clear(&r);
        }
    }
    char c = 1;
    if (write(ready_fd, &c, 1) != 1 || read(go_fd, &c, 1) != 1)
        _exit(1);
    /* heartbeats at 1 Hz per worker, spread evenly over the second */
    tide_proto_buf_t b;
    tide_proto_buf_init(&b);
    uint64_t t0 = tide_now_ns();
    long sent = 0; /* heartbeats handed to ZeroMQ */
    uint64_t period = 1000000000ull;
    for (uint64_t round = 0;; round++) {
        for (int i = 0; i < count; i++) {
            uint64_t due = t0 + round * period + (uint64_t)i * period / (uint64_t)count;
            uint64_t now = tide_now_ns();
            if (due > now + 1000000ull)
                tide_sleep_ms((due - now) / 1000000ull);
            tide_msg_t m;
            coord_mk_heartbeat(&m, id[i], round, 0);
            m.u.heartbeat.step_ms = 0;
            m.u.heartbeat.bubble_ms = 0;
            m.u.heartbeat.idle_ms = 1000;
            if (tide_proto_encode(&m, &b) == TIDE_OK &&
                zmq_send(sock[shared ? 0 : i], b.data, b.len, ZMQ_DONTWAIT) >= 0)
                sent++;
        }
        (void)report_fd;
    }
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double pct(double *v, long n, double p)
{
    if (n == 0)
        return NAN;
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    long k = (long)ceil(p * (double)n) - 1;
    return v[k < 0 ? 0 : k];
}

/* Status round trips for ms milliseconds at `hz`; latencies (ms) into lat. */
static long status_loop(void *sock, long ms, int hz, double *lat, long cap, long *failed)
{
    long n = 0;
    uint64_t end = tide_now_ns() + (uint64_t)ms * 1000000ull;
    while (tide_now_ns() < end && n < cap) {
        tide_msg_t m, r;
        tide_msg_init(&m, TIDE_MSG_STATUS);
        uint64_t a = tide_now_ns();
        if (coord_call(sock, &m, &r) != 0 || r.type != TIDE_MSG_STATUS_REPLY) {
            fprintf(stderr, "coord_bench: status failed\n");
            return -1;
        }
        lat[n++] = (double)(tide_now_ns() - a) / 1e6;
        if (failed) {
            *failed = 0;
            for (uint32_t i = 0; i < r.u.status_reply.n_rows; i++) {
                const tide_proto_gpu_row_t *row = &r.u.status_reply.rows[i];
                *failed += row->state == TIDE_WORKER_FAILED ||
                           r.u.status_reply.time_ms - row->last_seen_ms > 3000;
            }
        }
        tide_msg_clear(&r);
        tide_sleep_ms(1000 / (uint64_t)hz);
    }
    return n;
}

static int run_one(const char *tided, long workers, int clients, int shared, long window_ms,
                   result *res)
{
    coord_proc p;
    memset(res, 0, sizeof *res);
    res->workers = workers;
    if (coord_tmpdir(&p) != 0)
        return -1;
    /* a long miss limit: workers registered early stay alive through the baseline phase;
     * liveness under load is checked from last_seen instead (stale rows) */
    /* every simulated rank declares a pool of 2^20 (one pool, ids from many clients): above
     * the default --max-client-workers, which bounds what one real client registers */
    const char *extra[] = {"--heartbeat-ms", "1000", "--miss-limit", "60", "--max-client-workers",
                           "1048576",        NULL};
    if (coord_start(&p, tided, extra, NULL) != 0) {
        fprintf(stderr, "coord_bench: tided did not start\n");
        return -1;
    }
    int go[2], ready[2], rep[2];
    if (pipe(go) || pipe(ready) || pipe(rep))
        return -1;
    pid_t *kids = calloc((size_t)clients, sizeof *kids);
    for (int c = 0; c < clients; c++) {
        int first = (int)(workers * c / clients), last = (int)(workers * (c + 1) / clients);
        kids[c] = fork();
        if (kids[c] == 0) {
            close(go[1]);
            close(ready[0]);
            close(rep[0]);
            client(p.endpoint, first, last - first, shared, go[0], ready[1], rep[1]);
            _exit(0);
        }
    }
    close(go[0]);
    close(ready[1]);
    close(rep[1]);
    for (int c = 0; c < clients; c++) {
        char ch;
        if (read(ready[0], &ch, 1) != 1) {
            fprintf(stderr, "coord_bench: a client failed to register\n");
            for (int k = 0; k < clients; k++)
                kill(kids[k], SIGKILL);
            coord_stop(&p, SIGKILL);
            coord_cleanup(&p);
            return -1;
        }
    }
    void *ctx = zmq_ctx_new();
    void *ctl = coord_connect(ctx, p.endpoint, NULL, NULL, NULL, 10000);
    long cap = 100000;
    double *lat = calloc((size_t)cap, sizeof *lat);
    long nb = status_loop(ctl, 2000, 10, lat, cap, NULL);
    res->base_p50 = pct(lat, nb, 0.50);
    res->base_p99 = pct(lat, nb, 0.99);
    char g[64] = {0};
    if (write(go[1], g, (size_t)clients) != clients)
        return -1;
    tide_sleep_ms(2500); /* warm-up: every worker has sent heartbeats */
    long t_a = ticks_of(p.pid);
    uint64_t w_a = tide_now_ns();
    long n = status_loop(ctl, window_ms, 5, lat, cap, &res->failed_after);
    long t_b = ticks_of(p.pid);
    uint64_t w_b = tide_now_ns();
    double secs = (double)(w_b - w_a) / 1e9;
    res->cpu_core = (double)(t_b - t_a) / (double)sysconf(_SC_CLK_TCK) / secs;
    res->p50 = pct(lat, n, 0.50);
    res->p99 = pct(lat, n, 0.99);
    res->status_calls = n;
    for (int c = 0; c < clients; c++)
        kill(kids[c], SIGKILL);
    for (int c = 0; c < clients; c++)
        waitpid(kids[c], NULL, 0);
    free(lat);
    free(kids);
    zmq_close(ctl);
    zmq_ctx_destroy(ctx);
    coord_stop(&p, SIGTERM);
    coord_cleanup(&p);
    close(go[1]);
    close(ready[0]);
    close(rep[0]);
    return 0;
}

int main(int argc, char **argv)
{
    const char *out = NULL, *tided = NULL, *sizes = NULL;
    long long clients = 4, window_ms = 10000;
    int shared = 0;
    const tide_opt opts[] = {
        {"tided", "TIDE_TIDED", TIDE_OPT_STRING, &tided, TIDED_PATH, "tided binary", 0, 0},
        {"workers", NULL, TIDE_OPT_STRING, &sizes, "1000,10000", "comma-separated worker counts", 0,
         0},
        {"clients", NULL, TIDE_OPT_INT, &clients, "4", "client processes", 1, 64},
        {"window-ms", NULL, TIDE_OPT_INT, &window_ms, "10000", "CPU measurement window", 1000,
         600000},
        {"shared", NULL, TIDE_OPT_BOOL, &shared, "0",
         "one socket per client process instead of one per worker", 0, 0},
        {"out", NULL, TIDE_OPT_STRING, &out, "bench-out/coord_bench.json", "results file", 0, 0},
        {NULL, NULL, 0, NULL, NULL, NULL, 0, 0},
    };
    int code = tide_opts_main(opts, argc, argv, "coord_bench");
    if (code >= 0)
        return code;
    signal(SIGPIPE, SIG_IGN);
    result res[8];
    int nres = 0;
    char list[256];
    snprintf(list, sizeof list, "%s", sizes);
    for (char *tok = strtok(list, ","); tok && nres < 8; tok = strtok(NULL, ",")) {
        long n = strtol(tok, NULL, 10);
        if (n < 1 || n > 100000) {
            fprintf(stderr, "coord_bench: --workers %s: counts must be in [1, 100000]\n", tok);
            return 2;
        }
        if (run_one(tided, n, (int)clients, shared, window_ms, &res[nres]) != 0)
            return 1;
        nres++;
    }
    printf("coord_bench: %lld client processes, %s, heartbeats at 1 Hz, window %lld ms\n", clients,
           shared ? "one shared socket per process" : "one socket per worker", window_ms);
    printf("%8s %12s %10s %14s %14s %10s %10s %7s\n", "workers", "tided_cpu", "goal<0.25",
           "base_p50/p99", "load_p50/p99", "p99_ratio", "stale", "calls");
    for (int i = 0; i < nres; i++)
        printf("%8ld %11.1f%% %10s %6.2f/%6.2f %6.2f/%6.2f %10.2f %10ld %7ld\n", res[i].workers,
               100 * res[i].cpu_core, res[i].cpu_core < 0.25 ? "yes" : "NO", res[i].base_p50,
               res[i].base_p99, res[i].p50, res[i].p99, res[i].p99 / res[i].base_p99,
               res[i].failed_after, res[i].status_calls);
    FILE *f = bench_out_open("coord_bench", out);
    if (f == NULL)
        return 1;
    fprintf(f,
            "{\"bench\":\"coord_bench\",\"clients\":%lld,\"shared\":%d,\"window_ms\":%lld,"
            "\"runs\":[",
            clients, shared, window_ms);
    for (int i = 0; i < nres; i++)
        fprintf(f,
                "%s{\"workers\":%ld,\"tided_cpu_core\":%.4f,\"status_base_p50_ms\":%.3f,"
                "\"status_base_p99_ms\":%.3f,\"status_p50_ms\":%.3f,\"status_p99_ms\":%.3f,"
                "\"status_calls\":%ld,\"failed_workers\":%ld}",
                i ? "," : "", res[i].workers, res[i].cpu_core, res[i].base_p50, res[i].base_p99,
                res[i].p50, res[i].p99, res[i].status_calls, res[i].failed_after);
    fprintf(f, "]}\n");
    fclose(f);
    printf("wrote %s\n", out);
    return 0;
}
