/*
 * hostile_bench: a training job's workers heartbeat to tided (failure after 3 missed
 * 100 ms heartbeats) while hostile clients flood it at full speed for --seconds:
 * expensive status requests over a large worker table, malformed messages and
 * multipart messages, never reading a reply. Reports whether any healthy worker was
 * declared failed (the goal: none), the longest gap the harness itself had between
 * heartbeats, what the hostile clients sent, and tided's peak resident memory
 * (VmHWM). Writes bench-out/hostile_bench.json (or --out). Exit status 1 when a
 * healthy worker was declared failed.
 *
 * --endpoint EP --tided-pid PID: flood a tided that runs already (a real training job
 * on it, tests/test_flood_job.sh) instead of starting one with simulated workers; then
 * only what was sent and tided's peak memory are reported (the caller judges the job).
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "benchmarks/bench_out.h"
#include "core/opts.h"
#include "tests/coord_harness.h"

typedef struct shared {
    void *ctx;
    const char *endpoint;
    atomic_int stop;
} shared;

typedef struct job {
    shared *sh;
    int n;
    void **sock;
    int32_t *id;
    uint64_t max_gap_ns;
    long failed_replies; /* errors tided sent a worker (a failed worker is told to register) */
} job;

typedef struct hostile {
    shared *sh;
    int kind; /* 0 status flood, 1 malformed, 2 multipart, 3 multipart amplification */
    long sent;
} hostile;

#define AMP_FRAME_BYTES (256u << 10) /* one buffer every frame of an amplifying message shares */
#define AMP_FRAMES      2048         /* frames of one such message: 512 MiB for its receiver */

/* Sends one frame without blocking (a DEALER whose connection tided cut has no peer until
   it reconnects); 0 when sent, -1 when the run ended first. */
static int send_frame(hostile *h, void *s, zmq_msg_t *m, int more)
{
    while (!atomic_load(&h->sh->stop)) {
        if (zmq_msg_send(m, s, ZMQ_DONTWAIT | (more ? ZMQ_SNDMORE : 0)) >= 0)
            return 0;
        tide_sleep_ms(1);
    }
    return -1;
}

/* One multipart message of AMP_FRAMES frames that all share one buffer: this client holds
   one copy, a receiver that keeps the message until its last frame holds every frame.
   libzmq sends nothing of a message before its last frame, so the receiver gets it as one
   burst at the link's speed; one message per 100 ms keeps this process from queueing
   many of them. */
static int amplify(hostile *h, void *s, zmq_msg_t *frame)
{
    for (int f = 0; f < AMP_FRAMES; f++) {
        zmq_msg_t c;
        zmq_msg_init(&c);
        zmq_msg_copy(&c, frame); /* shares frame's buffer: no copy on this side */
        if (send_frame(h, s, &c, f + 1 < AMP_FRAMES) != 0) {
            zmq_msg_close(&c);
            return -1;
        }
    }
    tide_sleep_ms(100);
    return 0;
}

static void *beat(void *arg)
{
    job *j = arg;
    uint64_t last = tide_now_ns();
    while (!atomic_load(&j->sh->stop)) {
        for (int i = 0; i < j->n; i++) {
            tide_msg_t m;
            coord_mk_heartbeat(&m, j->id[i], 10, 1);
            coord_send(j->sock[i], &m);
            zmq_msg_t in;
            zmq_msg_init(&in);
            while (zmq_msg_recv(&in, j->sock[i], ZMQ_DONTWAIT) >= 0) {
                tide_msg_t r;
                if (tide_proto_decode(zmq_msg_data(&in), zmq_msg_size(&in), &r) == TIDE_OK) {
                    if (r.type == TIDE_MSG_ERROR)
                        j->failed_replies++;
                    tide_msg_clear(&r);
                }
                zmq_msg_close(&in);
                zmq_msg_init(&in);
            }
            zmq_msg_close(&in);
        }
        uint64_t now = tide_now_ns();
        if (now - last > j->max_gap_ns)
            j->max_gap_ns = now - last;
        last = now;
        tide_sleep_ms(50);
    }
    return NULL;
}

static void *flood(void *arg)
{
    hostile *h = arg;
    void *s = coord_connect(h->sh->ctx, h->sh->endpoint, NULL, NULL, NULL, 1000);
    int zero = 0;
    zmq_setsockopt(s, ZMQ_SNDHWM, &zero, sizeof zero); /* as fast as tided takes them */
    zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof zero);
    tide_proto_buf_t enc;
    tide_proto_buf_init(&enc);
    tide_msg_t m;
    tide_msg_init(&m, TIDE_MSG_STATUS);
    tide_proto_encode(&m, &enc);
    static const char junk[] = "\x93\x01\x02garbage-garbage-garbage";
    zmq_msg_t frame;
    zmq_msg_init_size(&frame, AMP_FRAME_BYTES);
    memset(zmq_msg_data(&frame), 0x5a, AMP_FRAME_BYTES);
    while (!atomic_load(&h->sh->stop)) {
        int rc;
        if (h->kind == 3) {
            rc = amplify(h, s, &frame);
        } else if (h->kind == 0) {
            rc = zmq_send(s, enc.data, enc.len, ZMQ_DONTWAIT);
        } else if (h->kind == 1) {
            rc = zmq_send(s, junk, sizeof junk - 1, ZMQ_DONTWAIT);
        } else {
            for (int f = 0; f < 63; f++)
                zmq_send(s, junk, sizeof junk - 1, ZMQ_SNDMORE);
            rc = zmq_send(s, junk, sizeof junk - 1, ZMQ_DONTWAIT);
        }
        if (rc >= 0)
            h->sent++;
        else
            tide_sleep_ms(1);
    }
    zmq_msg_close(&frame);
    tide_proto_buf_destroy(&enc);
    zmq_close(s);
    return NULL;
}

/* Registers table idle workers over one connection (a large status reply); returns it. */
static void *register_table(void *ctx, const char *endpoint, long long table)
{
    tide_msg_t m, r;
    void *bulk = coord_connect(ctx, endpoint, NULL, NULL, NULL, 5000);
    for (long long i = 0; i < table; i += 100) {
        long long n = table - i < 100 ? table - i : 100;
        for (long long k = i; k < i + n; k++) {
            coord_mk_register(&m, "bulk", (int)k, (int)table, "hostx", (int)(k % 8), 5000);
            coord_send(bulk, &m);
        }
        for (long long k = 0; k < n; k++)
            if (coord_recv(bulk, &r) == 0)
                tide_msg_clear(&r);
    }
    return bulk;
}

/* Floods hsh's tided from nh connections (status, malformed, multipart in turn) for
   seconds; *out gets what each sent (caller frees). The hostile clients have a ZeroMQ
   context (I/O thread) of their own, as separate processes would: a job's heartbeats
   from this process must not wait behind their sends. */
static long long g_amplify = 1; /* --amplify: connections of kind 3, besides the nh */

static void run_floods(shared *hsh, int *nh_io, long long seconds, hostile **out)
{
    int nh = *nh_io + (int)g_amplify;
    hostile *h = calloc((size_t)nh, sizeof *h);
    pthread_t *ht = calloc((size_t)nh, sizeof *ht);
    for (int i = 0; i < nh; i++) {
        h[i].sh = hsh;
        h[i].kind = i < *nh_io ? i % 3 : 3;
        pthread_create(&ht[i], NULL, flood, &h[i]);
    }
    tide_sleep_ms((uint64_t)seconds * 1000);
    atomic_store(&hsh->stop, 1);
    for (int i = 0; i < nh; i++)
        pthread_join(ht[i], NULL);
    free(ht);
    *out = h;
    *nh_io = nh;
}

static long proc_kib(pid_t pid, const char *key)
{
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "r");
    long kib = 0;
    if (f == NULL)
        return 0;
    size_t kl = strlen(key);
    while (fgets(line, sizeof line, f) != NULL)
        if (strncmp(line, key, kl) == 0)
            kib = strtol(line + kl, NULL, 10);
    fclose(f);
    return kib;
}

/* --endpoint mode: floods a running tided; prints and writes what was sent and its peak
   memory. 0, or 1 when tided did not answer afterwards. */
static int flood_running(const char *endpoint, pid_t pid, long long table, long long seconds,
                         long long per_kind, const char *out)
{
    void *ctx = zmq_ctx_new();
    void *bulk = register_table(ctx, endpoint, table);
    long rss_before = pid > 0 ? proc_kib(pid, "VmRSS:") : 0;
    int nh = (int)per_kind * 3;
    shared hsh = {.ctx = zmq_ctx_new(), .endpoint = endpoint};
    hostile *h = NULL;
    run_floods(&hsh, &nh, seconds, &h);
    /* tided still answers, once it worked through what was queued */
    void *admin = coord_connect(ctx, endpoint, NULL, NULL, NULL, 30000);
    tide_msg_t m, r;
    tide_msg_init(&m, TIDE_MSG_JOBS);
    int answered = coord_call(admin, &m, &r) == 0;
    if (answered)
        tide_msg_clear(&r);
    long peak = pid > 0 ? proc_kib(pid, "VmHWM:") : 0;
    long sent[4] = {0, 0, 0, 0};
    for (int i = 0; i < nh; i++)
        sent[h[i].kind] += h[i].sent;
    printf("hostile_bench: %d hostile connections for %lld s against the tided at %s\n", nh,
           seconds, endpoint);
    printf("%-34s %12s\n", "measure", "value");
    printf("%-34s %12ld\n", "status requests sent", sent[0]);
    printf("%-34s %12ld\n", "malformed messages sent", sent[1]);
    printf("%-34s %12ld\n", "64-frame multipart messages sent", sent[2]);
    printf("%-34s %12ld\n", "512 MiB one-buffer multiparts sent", sent[3]);
    printf("%-34s %12ld\n", "tided RSS before flood (KiB)", rss_before);
    printf("%-34s %12ld\n", "tided peak RSS (KiB)", peak);
    printf("%-34s %12s\n", "tided answered after the flood", answered ? "yes" : "NO");
    FILE *f = bench_out_open("hostile_bench", out);
    if (f != NULL) {
        fprintf(f,
                "{\"bench\":\"hostile_bench\",\"mode\":\"running\",\"table\":%lld,"
                "\"hostile_connections\":%d,\"seconds\":%lld,\"status_sent\":%ld,"
                "\"malformed_sent\":%ld,\"multipart_sent\":%ld,\"amplifying_sent\":%ld,\"tided_rss_before_kib\":%ld,"
                "\"tided_peak_rss_kib\":%ld,\"answered\":%d}\n",
                table, nh, seconds, sent[0], sent[1], sent[2], sent[3], rss_before, peak, answered);
        fclose(f);
        printf("wrote %s\n", out);
    }
    zmq_close(admin);
    zmq_close(bulk);
    zmq_ctx_term(ctx);
    zmq_ctx_term(hsh.ctx);
    free(h);
    return answered ? 0 : 1;
}

int main(int argc, char **argv)
{
    const char *out = NULL, *tided = NULL, *endpoint = NULL;
    long long workers = 8, table = 2000, seconds = 10, per_kind = 2, tided_pid = 0;
    const tide_opt opts[] = {
        {"tided", "TIDE_TIDED", TIDE_OPT_STRING, &tided, TIDED_PATH, "tided binary", 0, 0},
        {"workers", NULL, TIDE_OPT_INT, &workers, "8", "workers of the training job", 1, 256},
        {"table", NULL, TIDE_OPT_INT, &table, "2000", "other workers in tided's table", 0, 60000},
        {"seconds", NULL, TIDE_OPT_INT, &seconds, "10", "flood duration", 1, 600},
        {"clients", NULL, TIDE_OPT_INT, &per_kind, "2", "hostile connections per kind", 1, 64},
        {"amplify", NULL, TIDE_OPT_INT, &g_amplify, "1",
         "connections sending 512 MiB multipart messages of one shared 256 KiB frame (memory "
         "amplification: the sender holds one copy)",
         0, 16},
        {"out", NULL, TIDE_OPT_STRING, &out, "bench-out/hostile_bench.json", "results file", 0, 0},
        {"endpoint", NULL, TIDE_OPT_STRING, &endpoint, NULL,
         "flood this running tided (with --tided-pid) instead of starting one", 0, 0},
        {"tided-pid", NULL, TIDE_OPT_INT, &tided_pid, "0",
         "the running tided's pid, for its memory (with --endpoint)", 0, 1 << 30},
        {NULL, NULL, 0, NULL, NULL, NULL, 0, 0},
    };
    int code = tide_opts_main(opts, argc, argv, "hostile_bench");
    if (code >= 0)
        return code;
    if (endpoint != NULL)
        return flood_running(endpoint, (pid_t)tided_pid, table, seconds, per_kind, out);
    coord_proc p;
    if (coord_tmpdir(&p) != 0)
        return 1;
    const char *extra[] = {"--heartbeat-ms", "100", "--miss-limit", "3", NULL};
    int st = 0;
    if (coord_start(&p, tided, extra, &st) != 0) {
        fprintf(stderr, "hostile_bench: tided did not start (status %d)\n", st);
        return 1;
    }
    shared sh = {.ctx = zmq_ctx_new(), .endpoint = p.endpoint};
    job j = {.sh = &sh, .n = (int)workers};
    j.sock = calloc((size_t)workers, sizeof *j.sock);
    j.id = calloc((size_t)workers, sizeof *j.id);
    tide_msg_t m, r;
    for (int i = 0; i < j.n; i++) {
        j.sock[i] = coord_connect(sh.ctx, p.endpoint, NULL, NULL, NULL, 5000);
        coord_mk_register(&m, "job", i, j.n, "host0", i % 8, 1000 + i);
        if (coord_call(j.sock[i], &m, &r) != 0 || r.type != TIDE_MSG_REGISTER_OK) {
            fprintf(stderr, "hostile_bench: register failed\n");
            return 1;
        }
        j.id[i] = r.u.register_ok.worker;
        tide_msg_init(&m, TIDE_MSG_JOIN);
        m.u.join.worker = j.id[i];
        snprintf(m.u.join.job, sizeof m.u.join.job, "train");
        m.u.join.total_bytes = 1 << 20;
        m.u.join.num_layers = 4;
        m.u.join.dp = j.n;
        m.u.join.tp = m.u.join.pp = m.u.join.micro_batches = 1;
        coord_send(j.sock[i], &m);
    }
    for (int i = 0; i < j.n; i++) {
        if (coord_recv_type(j.sock[i], TIDE_MSG_LAYOUT, &r) != 0) {
            fprintf(stderr, "hostile_bench: no first layout\n");
            return 1;
        }
        tide_msg_clear(&r);
    }
    pthread_t bt;
    pthread_create(&bt, NULL, beat, &j);
    void *bulk = register_table(sh.ctx, p.endpoint, table);
    long rss_before = proc_kib(p.pid, "VmRSS:");
    int nh = (int)per_kind * 3;
    shared hsh = {.ctx = zmq_ctx_new(), .endpoint = p.endpoint};
    hostile *h = NULL;
    run_floods(&hsh, &nh, seconds, &h);
    tide_sleep_ms(1000); /* heartbeats go on while tided drains what was queued */
    atomic_store(&sh.stop, 1);
    pthread_join(bt, NULL);
    void *admin = coord_connect(sh.ctx, p.endpoint, NULL, NULL, NULL, 30000);
    long failed = 0;
    tide_msg_init(&m, TIDE_MSG_STATUS);
    if (coord_call(admin, &m, &r) != 0 || r.type != TIDE_MSG_STATUS_REPLY) {
        fprintf(stderr, "hostile_bench: tided did not answer after the flood\n");
        return 1;
    }
    for (uint32_t i = 0; i < r.u.status_reply.n_rows; i++)
        for (int k = 0; k < j.n; k++)
            if (r.u.status_reply.rows[i].worker == j.id[k] &&
                r.u.status_reply.rows[i].state == TIDE_WORKER_FAILED)
                failed++;
    tide_msg_clear(&r);
    long peak = proc_kib(p.pid, "VmHWM:");
    long sent[4] = {0, 0, 0, 0};
    for (int i = 0; i < nh; i++)
        sent[h[i].kind] += h[i].sent;
    printf("hostile_bench: %d job workers (failure after 300 ms of silence), %lld other "
           "workers, %d hostile connections for %lld s\n",
           j.n, table, nh, seconds);
    printf("%-34s %12s\n", "measure", "value");
    printf("%-34s %12ld\n", "status requests sent", sent[0]);
    printf("%-34s %12ld\n", "malformed messages sent", sent[1]);
    printf("%-34s %12ld\n", "64-frame multipart messages sent", sent[2]);
    printf("%-34s %12ld\n", "512 MiB one-buffer multiparts sent", sent[3]);
    printf("%-34s %12ld\n", "healthy workers declared failed", failed);
    printf("%-34s %12ld\n", "errors sent to job workers", j.failed_replies);
    printf("%-34s %12.0f\n", "harness max heartbeat gap (ms)", j.max_gap_ns / 1e6);
    printf("%-34s %12ld\n", "tided RSS before flood (KiB)", rss_before);
    printf("%-34s %12ld\n", "tided peak RSS (KiB)", peak);
    FILE *f = bench_out_open("hostile_bench", out);
    if (f != NULL) {
        fprintf(f,
                "{\"bench\":\"hostile_bench\",\"job_workers\":%d,\"table\":%lld,"
                "\"hostile_connections\":%d,\"seconds\":%lld,\"status_sent\":%ld,"
                "\"malformed_sent\":%ld,\"multipart_sent\":%ld,\"amplifying_sent\":%ld,\"healthy_failed\":%ld,"
                "\"worker_errors\":%ld,\"harness_max_gap_ms\":%.1f,\"tided_rss_before_kib\":%ld,"
                "\"tided_peak_rss_kib\":%ld}\n",
                j.n, table, nh, seconds, sent[0], sent[1], sent[2], sent[3], failed, j.failed_replies,
                j.max_gap_ns / 1e6, rss_before, peak);
        fclose(f);
        printf("wrote %s\n", out);
    }
    zmq_close(admin);
    zmq_close(bulk);
    for (int i = 0; i < j.n; i++)
        zmq_close(j.sock[i]);
    coord_stop(&p, SIGTERM);
    coord_cleanup(&p);
    zmq_ctx_term(sh.ctx);
    zmq_ctx_term(hsh.ctx);
    free(j.sock);
    free(j.id);
    free(h);
    return failed == 0 && j.failed_replies == 0 ? 0 : 1;
}
