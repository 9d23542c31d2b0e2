/*
 * The fixture of tided's integration tests (test_coordinator_*.c): each test starts the
 * real binary on a free loopback port with a temporary state file (setup, start,
 * teardown) and talks to it over DEALER sockets as fake workers and as tidectl would.
 * Header-only, like coord_harness.h under it: every test file is its own process and
 * gets its own tided, context and sockets. Test thread only.
 */
#ifndef TIDE_TESTS_TIDED_FIXTURE_H
#define TIDE_TESTS_TIDED_FIXTURE_H

#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <netinet/in.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>

#include "reshard/reshard.h" /* dtype and partition rules of join tensors */
#include "tests/coord_harness.h"

#define POOL "pool-a"

typedef struct fake {
    void *sock;
    int32_t id;
    int rank;
} fake;

static void *ctx;
static coord_proc proc;

/* a failed assertion must not leave sockets that hang teardown (coord_harness.h) */
#define coord_connect(...) coord_tracked(coord_connect(__VA_ARGS__))
#define zmq_close(sock)    coord_close_tracked(sock)

static inline void setup(void)
{
    ctx = zmq_ctx_new();
    cr_assert_eq(coord_tmpdir(&proc), 0);
}

static inline void teardown(void)
{
    coord_stop(&proc, SIGKILL);
    coord_close_all();
    zmq_ctx_destroy(ctx);
    coord_cleanup(&proc);
}

static inline void start(const char *const *extra)
{
    int st = 0;
    cr_assert_eq(coord_start(&proc, TIDED_PATH, extra, &st), 0, "tided did not start (status %d)",
                 st);
}

/* start() with --metrics on a free loopback port; the port. */
static inline int start_with_metrics(void)
{
    int port = coord_free_port();
    cr_assert_gt(port, 0, "no free loopback port");
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
    const char *extra[] = {"--metrics", addr, NULL};
    start(extra);
    return port;
}

static inline void fake_connect(fake *f, int timeout_ms)
{
    f->sock = coord_connect(ctx, proc.endpoint, NULL, NULL, NULL, timeout_ms);
    cr_assert_not_null(f->sock);
}

static inline void fake_register(fake *f, int rank, int size)
{
    tide_msg_t m, r;
    f->rank = rank;
    coord_mk_register(&m, POOL, rank, size, rank < 2 ? "host0" : "host1", rank % 2, 1000 + rank);
    cr_assert_eq(coord_call(f->sock, &m, &r), 0, "no register_ok for rank %d", rank);
    cr_assert_eq(r.type, TIDE_MSG_REGISTER_OK, "got %s", tide_msg_type_name(r.type));
    f->id = r.u.register_ok.worker;
}

static inline void fake_join(fake *f, int dp)
{
    tide_msg_t m;
    tide_msg_init(&m, TIDE_MSG_JOIN);
    m.u.join.worker = f->id;
    snprintf(m.u.join.job, sizeof m.u.join.job, "train");
    m.u.join.total_bytes = 1 << 20;
    m.u.join.num_layers = 4;
    m.u.join.dp = dp;
    m.u.join.tp = 1;
    m.u.join.pp = 1;
    m.u.join.micro_batches = 1;
    cr_assert_eq(coord_send(f->sock, &m), 0);
}

static inline void expect_type(void *sock, tide_msg_type_t t, tide_msg_t *out)
{
    cr_assert_eq(coord_recv_type(sock, t, out), 0, "no '%s' arrived", tide_msg_type_name(t));
}

/* n fakes connect and register (ranks 0..n-1 of one pool) and join "train" at dp, one after
   another: the first dp hold its first layout, the others are told they wait idle. Blocks;
   the test's thread. */
static inline void launch_train(fake *w, int n, int dp)
{
    tide_msg_t r;
    for (int i = 0; i < n; i++) {
        fake_connect(&w[i], 3000);
        fake_register(&w[i], i, n);
        fake_join(&w[i], dp);
    }
    for (int i = 0; i < n; i++) {
        expect_type(w[i].sock, i < dp ? TIDE_MSG_LAYOUT : TIDE_MSG_OK, &r);
        tide_msg_clear(&r);
    }
}

/* Joins job "train" (dp 1) and waits for its first layout: f trains and every worker that
   joins after it is spare. Joins sent back to back on separate sockets reach tided in
   either order, and the first one processed takes the layout. */
static inline void join_first(fake *f)
{
    tide_msg_t r;
    fake_join(f, 1);
    expect_type(f->sock, TIDE_MSG_LAYOUT, &r);
    cr_assert_eq(r.u.layout.layout.dp, 1);
    tide_msg_clear(&r);
}

static inline void admin_call(void *sock, tide_msg_t *req, tide_msg_t *reply, tide_msg_type_t want)
{
    cr_assert_eq(coord_call(sock, req, reply), 0, "no reply to '%s'",
                 tide_msg_type_name(req->type));
    cr_assert_eq(reply->type, want, "'%s' got '%s': %s", tide_msg_type_name(req->type),
                 tide_msg_type_name(reply->type),
                 reply->type == TIDE_MSG_ERROR ? reply->u.error.message : "");
}

static inline const tide_proto_job_row_t *find_job(const tide_msg_t *jobs, const char *name)
{
    for (uint32_t i = 0; i < jobs->u.jobs_reply.n_rows; i++)
        if (strcmp(jobs->u.jobs_reply.rows[i].name, name) == 0)
            return &jobs->u.jobs_reply.rows[i];
    return NULL;
}

static inline void mk_resize(tide_msg_t *m, int dp, int dry)
{
    tide_msg_init(m, TIDE_MSG_RESIZE);
    snprintf(m->u.resize.job, sizeof m->u.resize.job, "train");
    m->u.resize.dp = dp;
    m->u.resize.tp = 1;
    m->u.resize.pp = 1;
    m->u.resize.dry_run = dry;
    m->u.resize.placement = TIDE_PLACEMENT_OPTIMAL;
}

/* Sends prepare_ack (step) for gen from f after its layout + prepare arrive. */
static inline void ack_prepare(fake *f, uint64_t gen, uint64_t step)
{
    tide_msg_t m, r;
    expect_type(f->sock, TIDE_MSG_PREPARE, &r);
    cr_assert_eq(r.u.prepare.gen, gen);
    tide_msg_clear(&r);
    tide_msg_init(&m, TIDE_MSG_PREPARE_ACK);
    m.u.prepare_ack.worker = f->id;
    snprintf(m.u.prepare_ack.job, sizeof m.u.prepare_ack.job, "train");
    m.u.prepare_ack.gen = gen;
    m.u.prepare_ack.step = step;
    cr_assert_eq(coord_send(f->sock, &m), 0);
}

/* Waits for commit of gen on f and answers done (status 0, bytes moved). */
static inline void commit_done(fake *f, uint64_t gen, uint64_t bytes)
{
    tide_msg_t m, r;
    expect_type(f->sock, TIDE_MSG_COMMIT, &r);
    cr_assert_eq(r.u.commit.gen, gen);
    tide_msg_clear(&r);
    tide_msg_init(&m, TIDE_MSG_DONE);
    m.u.done.worker = f->id;
    snprintf(m.u.done.job, sizeof m.u.done.job, "train");
    m.u.done.gen = gen;
    m.u.done.bytes_moved = bytes;
    cr_assert_eq(coord_send(f->sock, &m), 0);
}

/* The job row of "train" once pred holds (polled for up to 2 s). */
static inline tide_proto_job_row_t wait_job(void *admin, int (*pred)(const tide_proto_job_row_t *))
{
    tide_msg_t m, r;
    tide_proto_job_row_t row;
    memset(&row, 0, sizeof row);
    for (int tries = 0; tries < 100; tries++) {
        tide_msg_init(&m, TIDE_MSG_JOBS);
        admin_call(admin, &m, &r, TIDE_MSG_JOBS_REPLY);
        const tide_proto_job_row_t *x = find_job(&r, "train");
        cr_assert_not_null(x);
        row = *x;
        tide_msg_clear(&r);
        if (pred(&row))
            break;
        tide_sleep_ms(20);
    }
    return row;
}

/* An admin submits offline command job name (`sleep 100`) at priority, and tided accepts it.
   Blocks for the answer; the test's thread. */
static inline void submit_sleep(void *admin, const char *name, int32_t priority)
{
    tide_msg_t m, r;
    tide_msg_init(&m, TIDE_MSG_SUBMIT);
    snprintf(m.u.submit.name, sizeof m.u.submit.name, "%s", name);
    m.u.submit.kind = TIDE_JOB_COMMAND;
    char *argv[2] = {"sleep", "100"};
    m.u.submit.argv = argv;
    m.u.submit.argc = 2;
    m.u.submit.priority = priority;
    admin_call(admin, &m, &r, TIDE_MSG_OK);
    tide_msg_clear(&r);
}

/* Number of events of kind (all events since the start). */
static inline int count_events(void *admin, const char *kind)
{
    tide_msg_t m, r;
    tide_msg_init(&m, TIDE_MSG_EVENTS);
    m.u.events.limit = 1000;
    admin_call(admin, &m, &r, TIDE_MSG_EVENTS_REPLY);
    int n = 0;
    for (uint32_t i = 0; i < r.u.events_reply.n_rows; i++)
        n += strcmp(r.u.events_reply.rows[i].kind, kind) == 0;
    tide_msg_clear(&r);
    return n;
}

/* The first event of kind whose detail holds text ("" for any): its detail into out
   (NULL: not wanted); 0 when none. */
static inline int find_event(void *admin, const char *kind, const char *text, char *out, size_t cap)
{
    tide_msg_t m, r;
    tide_msg_init(&m, TIDE_MSG_EVENTS);
    m.u.events.limit = 1000;
    admin_call(admin, &m, &r, TIDE_MSG_EVENTS_REPLY);
    int found = 0;
    for (uint32_t i = 0; i < r.u.events_reply.n_rows && !found; i++) {
        const tide_proto_event_row_t *e = &r.u.events_reply.rows[i];
        found = strcmp(e->kind, kind) == 0 && strstr(e->detail, text) != NULL;
        if (found && out != NULL)
            snprintf(out, cap, "%s", e->detail);
    }
    tide_msg_clear(&r);
    return found;
}

/* The first event of kind (its detail into out), 0 when none. */
static inline int event_detail(void *admin, const char *kind, char *out, size_t cap)
{
    return find_event(admin, kind, "", out, cap);
}

/* 1 when an event of kind has a detail holding text. */
static inline int event_with(void *admin, const char *kind, const char *text)
{
    return find_event(admin, kind, text, NULL, 0);
}

/* GET /metrics over plain TCP; the body into buf (NUL-terminated); returns its length. */
static inline size_t scrape(int port, char *buf, size_t cap)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa;
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_port = htons((uint16_t)port);
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    struct timeval tv = {3, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    cr_assert_eq(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0, "cannot connect to metrics");
    const char *req = "GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n";
    cr_assert_eq(send(fd, req, strlen(req), 0), (ssize_t)strlen(req));
    size_t n = 0;
    for (;;) {
        ssize_t k = recv(fd, buf + n, cap - 1 - n, 0);
        if (k <= 0)
            break;
        n += (size_t)k;
    }
    close(fd);
    buf[n] = '\0';
    cr_assert(strncmp(buf, "HTTP/1.", 7) == 0 && strstr(buf, " 200") != NULL, "%.200s", buf);
    cr_assert(strstr(buf, "text/plain") != NULL, "Prometheus text content type: %.300s", buf);
    char *body = strstr(buf, "\r\n\r\n");
    cr_assert_not_null(body);
    body += 4;
    size_t len = n - (size_t)(body - buf);
    memmove(buf, body, len + 1);
    return len;
}

/* The value of the sample line "name" (exact, labels included); fails when absent. */
static inline double sample(const char *text, const char *name)
{
    size_t k = strlen(name);
    for (const char *p = text; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL)
        if (strncmp(p, name, k) == 0 && p[k] == ' ')
            return strtod(p + k + 1, NULL);
    cr_assert_fail("metric %s missing from:\n%s", name, text);
    return -1;
}

static inline int is_gen2_running(const tide_proto_job_row_t *r)
{
    return r->gen == 2 && r->state == TIDE_JOB_RUNNING;
}

/* Runs tidectl with args against this test's tided; its stdout in out. */
static inline int tidectl(char *out, size_t cap, const char *const *args)
{
    return coord_tidectl(TIDECTL_PATH, proc.endpoint, args, out, cap);
}

/* One status page from `from` (limit rows, 0: tided's page), with or without the workers
   that left; the reply is the caller's. */
static inline void status_page(void *sock, int32_t from, uint32_t limit, int all, tide_msg_t *r)
{
    tide_msg_t m;
    tide_msg_init(&m, TIDE_MSG_STATUS);
    m.u.status.from = from;
    m.u.status.limit = limit;
    m.u.status.all = all;
    admin_call(sock, &m, r, TIDE_MSG_STATUS_REPLY);
}

/* The state status lists for worker id (following every page), or -1 when unlisted. */
static inline int listed_state(void *sock, int32_t id, int all)
{
    int state = -1;
    int32_t from = 0;
    do {
        tide_msg_t r;
        status_page(sock, from, 0, all, &r);
        for (uint32_t i = 0; i < r.u.status_reply.n_rows; i++)
            if (r.u.status_reply.rows[i].worker == id)
                state = (int)r.u.status_reply.rows[i].state;
        from = r.u.status_reply.next;
        tide_msg_clear(&r);
    } while (from >= 0);
    return state;
}

static inline void heartbeat(fake *f)
{
    tide_msg_t m;
    coord_mk_heartbeat(&m, f->id, 5, 1);
    cr_assert_eq(coord_send(f->sock, &m), 0);
}

/* Joins job `job` of layers 4 as f with (dp, tp 1, pp 1), micro-batches and fit rules. */
static inline void fake_join_fit(fake *f, const char *job, int dp, int micro, tide_proto_fit_t *fit,
                                 uint32_t n_fit)
{
    tide_msg_t m;
    tide_msg_init(&m, TIDE_MSG_JOIN);
    m.u.join.worker = f->id;
    snprintf(m.u.join.job, sizeof m.u.join.job, "%s", job);
    m.u.join.total_bytes = 1 << 20;
    m.u.join.num_layers = 4;
    m.u.join.dp = dp;
    m.u.join.tp = 1;
    m.u.join.pp = 1;
    m.u.join.micro_batches = micro;
    m.u.join.fit = fit;
    m.u.join.n_fit = n_fit;
    cr_assert_eq(coord_send(f->sock, &m), 0);
}

/* Rank `rank` of pool `pool` (size ranks) on host registers as f. */
static inline void fake_register_in(fake *f, const char *pool, int rank, int size, const char *host)
{
    tide_msg_t m, r;
    f->rank = rank;
    coord_mk_register(&m, pool, rank, size, host, rank, 2000 + rank);
    cr_assert_eq(coord_call(f->sock, &m, &r), 0, "no register_ok for %s rank %d", pool, rank);
    cr_assert_eq(r.type, TIDE_MSG_REGISTER_OK, "got %s", tide_msg_type_name(r.type));
    f->id = r.u.register_ok.worker;
}

/* A host heartbeat from f (the leader) carrying the heartbeats of the workers in ids. */
static inline void host_heartbeat(fake *f, const int32_t *ids, int n)
{
    tide_proto_heartbeat_t beats[8];
    memset(beats, 0, sizeof beats);
    for (int i = 0; i < n; i++) {
        beats[i].worker = ids[i];
        beats[i].step = 5;
        beats[i].gen = 0;
        beats[i].step_ms = 100;
    }
    tide_msg_t m;
    tide_msg_init(&m, TIDE_MSG_HOST_HEARTBEAT);
    m.u.host_heartbeat.worker = f->id;
    m.u.host_heartbeat.beats = beats;
    m.u.host_heartbeat.n_beats = (uint32_t)n;
    cr_assert_eq(coord_send(f->sock, &m), 0);
}
#endif
