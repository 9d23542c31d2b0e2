/*
 * coord_bench: tided under N simulated workers (default 1,000, 10,000 and 100,000)
 * heartbeating at 1 Hz from a few client processes, every worker a rank of a job
 * (--job-size ranks each: a pool that joined its job, tp 8 inside each host of 8, running
 * its first layout). Reports tided's CPU use (utime + stime from /proc/<pid>/stat over a
 * fixed window of heartbeats and `tidectl status --job` at 10 Hz, as a fraction of one
 * core; goals: < 0.25 at 10,000 workers with one heartbeat message per worker, < 1 at
 * 100,000 with host heartbeats), the latency of `tidectl status --job` (one job's workers;
 * goal p99 < 50 ms at 100,000) over that window, and then that of `tidectl status` (the
 * whole table's first page, up to tided's --status-page rows, decoded like tidectl does)
 * under the same heartbeats, p50/p99, next to the same latencies measured in the same run
 * before the heartbeats start (baseline).
 *
 * Honesty: by default every simulated worker has its own DEALER socket and TCP
 * connection (as real workers do), each client process multiplexing N/P of them;
 * registrations and joins come from each socket, so tided sees N connections and N
 * routing ids, and heartbeats are spread evenly over each second. From --hosts-from
 * workers on (default 100,000) the workers heartbeat as libtide does by default: the 8
 * ranks of a simulated host send one host_heartbeat per second over one connection (the
 * host's leader's; registration and joins come over it too, so tided sees one connection
 * per host). --shared sends all of a process's workers over one socket (fewer
 * connections: cheaper for tided's I/O thread, shown for comparison only).
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

#define GPUS_PER_HOST 8

typedef struct result {
    long workers;
    int hosts;                         /* 1: host heartbeats (one message per host per second) */
    double msgs_per_s;                 /* heartbeat messages tided receives per second */
    double cpu_core;                   /* fraction of one core over the window */
    double base_p50, base_p99;         /* ms, status page latency before the load */
    double p50, p99;                   /* ms, under load */
    double job_base_p50, job_base_p99; /* ms, status --job before the load */
    double job_p50, job_p99;           /* ms, under load */
    long status_calls, job_calls;
    long failed_after; /* workers tided declared failed or saw nothing from lately (must be 0) */
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

typedef struct client_cfg {
    const char *endpoint;
    int first, count; /* workers [first, first + count) */
    int shared;       /* one socket for all */
    int hosts;        /* one socket and one host heartbeat per GPUS_PER_HOST workers */
    int job_size;     /* ranks of each job's pool */
} client_cfg;

/* Socket of worker i (0-based within the client). */
static int sock_of(const client_cfg *c, int i)
{
    return c->shared ? 0 : c->hosts ? i / GPUS_PER_HOST : i;
}

/* Drops whatever tided sent on sock; counts the layouts of job generation 1. */
static int drain(void *sock)
{
    int layouts = 0;
    for (;;) {
        zmq_msg_t f;
        zmq_msg_init(&f);
        if (zmq_msg_recv(&f, sock, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&f);
            return layouts;
        }
        tide_msg_t m;
        if (tide_proto_decode(zmq_msg_data(&f), zmq_msg_size(&f), &m) == TIDE_OK) {
            layouts += m.type == TIDE_MSG_LAYOUT;
            if (m.type == TIDE_MSG_ERROR)
                fprintf(stderr, "coord_bench: tided: %s\n", m.u.error.message);
            tide_msg_clear(&m);
        }
        zmq_msg_close(&f);
    }
}

/* Sends unit u's heartbeat (one worker's, or one host's for its workers) for `round`. */
static void beat_unit(const client_cfg *c, void **sock, const int32_t *id, int u, uint64_t round,
                      tide_proto_buf_t *b)
{
    int per = c->hosts ? GPUS_PER_HOST : 1;
    int lo = u * per, hi = lo + per < c->count ? lo + per : c->count;
    tide_proto_heartbeat_t beats[GPUS_PER_HOST];
    for (int i = lo; i < hi; i++) {
        tide_proto_heartbeat_t *x = &beats[i - lo];
        memset(x, 0, sizeof *x);
        x->worker = id[i];
        x->step = round;
        x->gen = 1;
        x->step_ms = 400;
        x->bubble_ms = 20;
    }
    tide_msg_t m;
    if (c->hosts) {
        tide_msg_init(&m, TIDE_MSG_HOST_HEARTBEAT);
        m.u.host_heartbeat.worker = id[lo]; /* the host's leader: its lowest rank */
        m.u.host_heartbeat.beats = beats;
        m.u.host_heartbeat.n_beats = (uint32_t)(hi - lo);
    } else {
        tide_msg_init(&m, TIDE_MSG_HEARTBEAT);
        m.u.heartbeat = beats[0];
    }
    if (tide_proto_encode(&m, b) == TIDE_OK)
        zmq_send(sock[sock_of(c, lo)], b->data, b->len, ZMQ_DONTWAIT);
}

/* One client process: registers its workers, joins them to their jobs and waits for the
 * jobs' first layouts (heartbeating meanwhile, as libtide's control thread does from its
 * registration on), says ready, waits for "go", heartbeats until killed. */
static void client(const client_cfg *c, int go_fd, int ready_fd)
{
    void *ctx = zmq_ctx_new();
    int nsock = c->shared  ? 1
                : c->hosts ? (c->count + GPUS_PER_HOST - 1) / GPUS_PER_HOST
                           : c->count;
    zmq_ctx_set(ctx, ZMQ_MAX_SOCKETS, nsock + 16);
    void **sock = calloc((size_t)nsock, sizeof *sock);
    int32_t *id = calloc((size_t)c->count, sizeof *id);
    int *want = calloc((size_t)nsock, sizeof *want), *got = calloc((size_t)nsock, sizeof *got);
    for (int i = 0; i < nsock; i++)
        sock[i] = coord_connect(ctx, c->endpoint, NULL, NULL, NULL, 60000);
    /* register in windows of 256 outstanding requests; replies come in order per socket */
    for (int base = 0; base < c->count; base += 256) {
        int end = base + 256 < c->count ? base + 256 : c->count;
        for (int i = base; i < end; i++) {
            int w = c->first + i;
            tide_msg_t m;
            char host[32], pool[32];
            snprintf(host, sizeof host, "node%05d", w / GPUS_PER_HOST);
            snprintf(pool, sizeof pool, "job%05d", w / c->job_size);
            coord_mk_register(&m, pool, w % c->job_size, c->job_size, host, w % GPUS_PER_HOST,
                              (int)getpid());
            coord_send(sock[sock_of(c, i)], &m);
        }
        for (int i = base; i < end; i++) {
            tide_msg_t r;
            if (coord_recv(sock[sock_of(c, i)], &r) != 0 || r.type != TIDE_MSG_REGISTER_OK) {
                /* the parent sees the closed pipe and stops everything */
                fprintf(stderr, "coord_bench: registration %d failed\n", c->first + i);
                _exit(1);
            }
            id[i] = r.u.register_ok.worker;
            tide_msg_clear(&r);
        }
    }
    /* join: every worker runs its job's program; the last of a job's joins places it */
    for (int i = 0; i < c->count; i++) {
        int w = c->first + i;
        tide_msg_t m;
        tide_msg_init(&m, TIDE_MSG_JOIN);
        m.u.join.worker = id[i];
        snprintf(m.u.join.job, sizeof m.u.join.job, "job%05d", w / c->job_size);
        m.u.join.total_bytes = 1ull << 30;
        m.u.join.num_layers = 32;
        m.u.join.dp = c->job_size / GPUS_PER_HOST;
        m.u.join.tp = GPUS_PER_HOST;
        m.u.join.pp = 1;
        m.u.join.micro_batches = 1;
        coord_send(sock[sock_of(c, i)], &m);
        want[sock_of(c, i)]++;
    }
    /* every worker gets its job's first layout once all of the job's ranks joined (other
       clients' too); the workers heartbeat meanwhile, once a second */
    tide_proto_buf_t b;
    tide_proto_buf_init(&b);
    int per = c->hosts ? GPUS_PER_HOST : 1;
    int units = (c->count + per - 1) / per; /* heartbeat messages per second from this client */
    uint64_t deadline = tide_now_ns() + 600ull * 1000000000ull, next_beat = 0;
    for (int done = 0; done < nsock;) {
        uint64_t now = tide_now_ns();
        if (now > deadline) {
            fprintf(stderr, "coord_bench: the jobs' first layouts did not all come\n");
            _exit(1);
        }
        if (now >= next_beat) {
            for (int u = 0; u < units; u++)
                beat_unit(c, sock, id, u, 0, &b);
            next_beat = now + 1000000000ull;
        }
        done = 0;
        for (int k = 0; k < nsock; k++) {
            got[k] += drain(sock[k]);
            done += got[k] >= want[k];
        }
        tide_sleep_ms(5);
    }
    char ch = 1;
    if (write(ready_fd, &ch, 1) != 1 || read(go_fd, &ch, 1) != 1)
        _exit(1);
    /* heartbeats at 1 Hz per worker (or per host), spread evenly over the second */
    uint64_t t0 = tide_now_ns();
    uint64_t period = 1000000000ull;
    for (uint64_t round = 1;; round++) {
        for (int u = 0; u < units; u++) {
            uint64_t due = t0 + round * period + (uint64_t)u * period / (uint64_t)units;
            uint64_t now = tide_now_ns();
            if (due > now + 1000000ull)
                tide_sleep_ms((due - now) / 1000000ull);
            beat_unit(c, sock, id, u, round, &b);
            if ((round & 7) == 0)
                drain(sock[sock_of(c, u * per)]); /* nothing is expected; no queue fills */
        }
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

/* One status round trip (job: "" for the whole table's first page, else that job's
 * workers); its latency (ms) into *ms and the reply's rows into *rows; -1 on failure. */
static int status_once(void *sock, const char *job, double *ms, long *rows)
{
    tide_msg_t m, r;
    tide_msg_init(&m, TIDE_MSG_STATUS);
    snprintf(m.u.status.job, sizeof m.u.status.job, "%s", job);
    uint64_t a = tide_now_ns();
    if (coord_call(sock, &m, &r) != 0 || r.type != TIDE_MSG_STATUS_REPLY) {
        fprintf(stderr, "coord_bench: status%s%s failed\n", job[0] ? " --job " : "", job);
        return -1;
    }
    *ms = (double)(tide_now_ns() - a) / 1e6;
    *rows = r.u.status_reply.n_rows;
    tide_msg_clear(&r);
    return 0;
}

/* Status round trips for ms milliseconds at `hz`: of a random job's workers (jobs > 0),
 * else of the whole table's first page; latencies (ms) into lat. */
static int status_loop(void *sock, long ms, int hz, int jobs, double *lat, long *n, long cap)
{
    uint64_t end = tide_now_ns() + (uint64_t)ms * 1000000ull;
    uint64_t x = 88172645463325252ull;
    *n = 0;
    while (tide_now_ns() < end && *n < cap) {
        long rows;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        char job[32] = "";
        if (jobs > 0)
            snprintf(job, sizeof job, "job%05d", (int)(x % (uint64_t)jobs));
        if (status_once(sock, job, &lat[*n], &rows) != 0)
            return -1;
        (*n)++;
        tide_sleep_ms(1000 / (uint64_t)hz);
    }
    return 0;
}

/* Workers that are failed, or whose last heartbeat is older than 3 s, over every page. */
static long stale_workers(void *sock)
{
    long bad = 0;
    int32_t from = 0;
    do {
        tide_msg_t m, r;
        tide_msg_init(&m, TIDE_MSG_STATUS);
        m.u.status.from = from;
        if (coord_call(sock, &m, &r) != 0 || r.type != TIDE_MSG_STATUS_REPLY)
            return -1;
        for (uint32_t i = 0; i < r.u.status_reply.n_rows; i++) {
            const tide_proto_gpu_row_t *row = &r.u.status_reply.rows[i];
            bad += row->state == TIDE_WORKER_FAILED ||
                   r.u.status_reply.time_ms - row->last_seen_ms > 3000;
        }
        from = r.u.status_reply.next;
        tide_msg_clear(&r);
    } while (from >= 0);
    return bad;
}

static int run_one(const char *tided, long workers, int clients, int shared, int hosts,
                   int job_size, long window_ms, result *res)
{
    coord_proc p;
    memset(res, 0, sizeof *res);
    res->workers = workers;
    res->hosts = hosts;
    res->msgs_per_s = hosts ? (double)workers / GPUS_PER_HOST : (double)workers;
    if (coord_tmpdir(&p) != 0)
        return -1;
    /* a long miss limit: workers registered early stay alive through the baseline phase;
     * liveness under load is checked from last_seen instead (stale rows). Many ranks per
     * connection: above the default --max-client-workers, which bounds what one real
     * client registers */
    const char *extra[] = {"--heartbeat-ms", "1000", "--miss-limit", "60", "--max-client-workers",
                           "1048576",        NULL};
    if (coord_start(&p, tided, extra, NULL) != 0) {
        fprintf(stderr, "coord_bench: tided did not start\n");
        return -1;
    }
    int go[2], ready[2];
    if (pipe(go) || pipe(ready))
        return -1;
    pid_t *kids = calloc((size_t)clients, sizeof *kids);
    uint64_t setup0 = tide_now_ns();
    for (int c = 0; c < clients; c++) {
        /* whole hosts per client */
        long nh = workers / GPUS_PER_HOST;
        int first = (int)(nh * c / clients) * GPUS_PER_HOST,
            last = (int)(nh * (c + 1) / clients) * GPUS_PER_HOST;
        kids[c] = fork();
        if (kids[c] == 0) {
            close(go[1]);
            close(ready[0]);
            client_cfg cc = {p.endpoint, first, last - first, shared, hosts, job_size};
            client(&cc, go[0], ready[1]);
            _exit(0);
        }
    }
    close(go[0]);
    close(ready[1]);
    for (int c = 0; c < clients; c++) {
        char ch;
        if (read(ready[0], &ch, 1) != 1) {
            fprintf(stderr, "coord_bench: a client failed to register or join\n");
            for (int k = 0; k < clients; k++)
                kill(kids[k], SIGKILL);
            coord_stop(&p, SIGKILL);
            coord_cleanup(&p);
            return -1;
        }
    }
    fprintf(stderr, "coord_bench: %ld workers registered, joined and placed in %.1f s\n", workers,
            (double)(tide_now_ns() - setup0) / 1e9);
    void *ctx = zmq_ctx_new();
    void *ctl = coord_connect(ctx, p.endpoint, NULL, NULL, NULL, 30000);
    long cap = 100000, nj = 0, na = 0;
    double *jl = calloc((size_t)cap, sizeof *jl), *al = calloc((size_t)cap, sizeof *al);
    int jobs = (int)(workers / job_size);
    if (status_loop(ctl, 2000, 10, jobs, jl, &nj, cap) != 0 ||
        status_loop(ctl, 2000, 5, 0, al, &na, cap) != 0)
        return -1;
    res->job_base_p50 = pct(jl, nj, 0.50);
    res->job_base_p99 = pct(jl, nj, 0.99);
    res->base_p50 = pct(al, na, 0.50);
    res->base_p99 = pct(al, na, 0.99);
    char g[64] = {0};
    if (write(go[1], g, (size_t)clients) != clients)
        return -1;
    tide_sleep_ms(2500); /* warm-up: every worker has sent heartbeats */
    /* the window: heartbeats and status --job at 10 Hz (tided's CPU over it) */
    long t_a = ticks_of(p.pid);
    uint64_t w_a = tide_now_ns();
    if (status_loop(ctl, window_ms, 10, jobs, jl, &nj, cap) != 0)
        return -1;
    long t_b = ticks_of(p.pid);
    uint64_t w_b = tide_now_ns();
    double secs = (double)(w_b - w_a) / 1e9;
    res->cpu_core = (double)(t_b - t_a) / (double)sysconf(_SC_CLK_TCK) / secs;
    res->job_p50 = pct(jl, nj, 0.50);
    res->job_p99 = pct(jl, nj, 0.99);
    res->job_calls = nj;
    /* then the whole table's first page under the same heartbeats (apart: one such page
       of 16,384 rows costs tided 100+ ms, which every request behind it waits for) */
    if (status_loop(ctl, 5000, 2, 0, al, &na, cap) != 0)
        return -1;
    res->p50 = pct(al, na, 0.50);
    res->p99 = pct(al, na, 0.99);
    res->status_calls = na;
    res->failed_after = stale_workers(ctl);
    for (int c = 0; c < clients; c++)
        kill(kids[c], SIGKILL);
    for (int c = 0; c < clients; c++)
        waitpid(kids[c], NULL, 0);
    free(jl);
    free(al);
    free(kids);
    zmq_close(ctl);
    zmq_ctx_destroy(ctx);
    coord_stop(&p, SIGTERM);
    coord_cleanup(&p);
    close(go[1]);
    close(ready[0]);
    return 0;
}

int main(int argc, char **argv)
{
    const char *out = NULL, *tided = NULL, *sizes = NULL;
    long long clients = 4, window_ms = 10000, hosts_from = 100000, job_size = 1000;
    int shared = 0;
    const tide_opt opts[] = {
        {"tided", "TIDE_TIDED", TIDE_OPT_STRING, &tided, TIDED_PATH, "tided binary", 0, 0},
        {"workers", NULL, TIDE_OPT_STRING, &sizes, "1000,10000,100000",
         "comma-separated worker counts (multiples of the job size)", 0, 0},
        {"hosts-from", NULL, TIDE_OPT_INT, &hosts_from, "100000",
         "from this many workers on, host heartbeats (8 workers a host, one message each)", 1,
         1000000},
        {"job-size", NULL, TIDE_OPT_INT, &job_size, "1000",
         "workers per job (a multiple of 8: tp 8 inside each host)", 8, 100000},
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
    if (job_size % GPUS_PER_HOST != 0) {
        fprintf(stderr, "coord_bench: --job-size must be a multiple of %d\n", GPUS_PER_HOST);
        return 2;
    }
    signal(SIGPIPE, SIG_IGN);
    result res[8];
    int nres = 0;
    char list[256];
    snprintf(list, sizeof list, "%s", sizes);
    for (char *tok = strtok(list, ","); tok && nres < 8; tok = strtok(NULL, ",")) {
        long n = strtol(tok, NULL, 10);
        if (n < job_size || n > 200000 || n % job_size != 0) {
            fprintf(stderr,
                    "coord_bench: --workers %s: counts must be multiples of the job size %lld, "
                    "at most 200000\n",
                    tok, job_size);
            return 2;
        }
        if (run_one(tided, n, (int)clients, shared, n >= hosts_from, (int)job_size, window_ms,
                    &res[nres]) != 0)
            return 1;
        nres++;
    }
    printf("coord_bench: %lld client processes, %s, heartbeats at 1 Hz, jobs of %lld workers, "
           "window %lld ms\n",
           clients, shared ? "one shared socket per process" : "one socket per worker (or host)",
           job_size, window_ms);
    printf("%8s %6s %9s %10s %8s %15s %15s %15s %15s %7s %6s\n", "workers", "beats", "msgs/s",
           "tided_cpu", "goal", "status_base", "status_load", "job_base", "job_load", "stale",
           "calls");
    for (int i = 0; i < nres; i++) {
        double goal = res[i].hosts ? 1.0 : 0.25;
        printf("%8ld %6s %9.0f %9.1f%% %4s%.2f %6.2f/%7.2f %6.2f/%7.2f %6.2f/%7.2f %6.2f/%7.2f "
               "%7ld %6ld\n",
               res[i].workers, res[i].hosts ? "host" : "own", res[i].msgs_per_s,
               100 * res[i].cpu_core, res[i].cpu_core < goal ? "ok <" : "NO <", goal,
               res[i].base_p50, res[i].base_p99, res[i].p50, res[i].p99, res[i].job_base_p50,
               res[i].job_base_p99, res[i].job_p50, res[i].job_p99, res[i].failed_after,
               res[i].job_calls);
    }
    printf("(latencies in ms, p50/p99; job: status --job of one job's %lld workers at 10 Hz, "
           "goal p99 < 50 ms at 100,000; status: the whole table's first page at 2 Hz)\n",
           job_size);
    FILE *f = bench_out_open("coord_bench", out);
    if (f == NULL)
        return 1;
    fprintf(f,
            "{\"bench\":\"coord_bench\",\"clients\":%lld,\"shared\":%d,\"window_ms\":%lld,"
            "\"job_size\":%lld,\"runs\":[",
            clients, shared, window_ms, job_size);
    for (int i = 0; i < nres; i++)
        fprintf(f,
                "%s{\"workers\":%ld,\"host_heartbeats\":%d,\"heartbeat_msgs_per_s\":%.0f,"
                "\"tided_cpu_core\":%.4f,\"status_base_p50_ms\":%.3f,"
                "\"status_base_p99_ms\":%.3f,\"status_p50_ms\":%.3f,\"status_p99_ms\":%.3f,"
                "\"status_calls\":%ld,\"job_status_base_p50_ms\":%.3f,"
                "\"job_status_base_p99_ms\":%.3f,\"job_status_p50_ms\":%.3f,"
                "\"job_status_p99_ms\":%.3f,\"job_status_calls\":%ld,\"failed_workers\":%ld}",
                i ? "," : "", res[i].workers, res[i].hosts, res[i].msgs_per_s, res[i].cpu_core,
                res[i].base_p50, res[i].base_p99, res[i].p50, res[i].p99, res[i].status_calls,
                res[i].job_base_p50, res[i].job_base_p99, res[i].job_p50, res[i].job_p99,
                res[i].job_calls, res[i].failed_after);
    fprintf(f, "]}\n");
    fclose(f);
    printf("wrote %s\n", out);
    return 0;
}
