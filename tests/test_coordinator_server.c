/*
 * Integration tests for tided: each test starts the real binary on a free
 * loopback port with a temporary state file and talks to it over DEALER
 * sockets as fake workers and as tidectl would: registration, first layout,
 * offline backfill and preemption, the resize protocol (prepare / ack / commit
 * / done), kill -9 and restart in the middle of a switch, failure detection and
 * recovery, malformed input, CURVE authentication (roles, worker ids bound to
 * the key that registered them), job end on bye, a generation kept after a
 * participant switched, --dry-run bytes under the chosen map and the default
 * rank order, and the Prometheus text scraped over HTTP. A few seconds in all.
 */
#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <netinet/in.h>
#include <string.h>
#include <sys/socket.h>

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

static void setup(void)
{
    ctx = zmq_ctx_new();
    cr_assert_eq(coord_tmpdir(&proc), 0);
}

static void teardown(void)
{
    coord_stop(&proc, SIGKILL);
    coord_close_all();
    zmq_ctx_destroy(ctx);
    coord_cleanup(&proc);
}

static void start(const char *const *extra)
{
    int st = 0;
    cr_assert_eq(coord_start(&proc, TIDED_PATH, extra, &st), 0, "tided did not start (status %d)",
                 st);
}

static void fake_connect(fake *f, int timeout_ms)
{
    f->sock = coord_connect(ctx, proc.endpoint, NULL, NULL, NULL, timeout_ms);
    cr_assert_not_null(f->sock);
}

static void fake_register(fake *f, int rank, int size)
{
    tide_msg_t m, r;
    f->rank = rank;
    coord_mk_register(&m, POOL, rank, size, rank < 2 ? "host0" : "host1", rank % 2, 1000 + rank);
    cr_assert_eq(coord_call(f->sock, &m, &r), 0, "no register_ok for rank %d", rank);
    cr_assert_eq(r.type, TIDE_MSG_REGISTER_OK, "got %s", tide_msg_type_name(r.type));
    f->id = r.u.register_ok.worker;
}

static void fake_join(fake *f, int dp)
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

static void expect_type(void *sock, tide_msg_type_t t, tide_msg_t *out)
{
    cr_assert_eq(coord_recv_type(sock, t, out), 0, "no '%s' arrived", tide_msg_type_name(t));
}

/* Joins job "train" (dp 1) and waits for its first layout: f trains and every worker that
   joins after it is spare. Joins sent back to back on separate sockets reach tided in
   either order, and the first one processed takes the layout. */
static void join_first(fake *f)
{
    tide_msg_t r;
    fake_join(f, 1);
    expect_type(f->sock, TIDE_MSG_LAYOUT, &r);
    cr_assert_eq(r.u.layout.layout.dp, 1);
    tide_msg_clear(&r);
}

static void admin_call(void *sock, tide_msg_t *req, tide_msg_t *reply, tide_msg_type_t want)
{
    cr_assert_eq(coord_call(sock, req, reply), 0, "no reply to '%s'",
                 tide_msg_type_name(req->type));
    cr_assert_eq(reply->type, want, "'%s' got '%s': %s", tide_msg_type_name(req->type),
                 tide_msg_type_name(reply->type),
                 reply->type == TIDE_MSG_ERROR ? reply->u.error.message : "");
}

static const tide_proto_job_row_t *find_job(const tide_msg_t *jobs, const char *name)
{
    for (uint32_t i = 0; i < jobs->u.jobs_reply.n_rows; i++)
        if (strcmp(jobs->u.jobs_reply.rows[i].name, name) == 0)
            return &jobs->u.jobs_reply.rows[i];
    return NULL;
}

static void mk_resize(tide_msg_t *m, int dp, int dry)
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
static void ack_prepare(fake *f, uint64_t gen, uint64_t step)
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
static void commit_done(fake *f, uint64_t gen, uint64_t bytes)
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
static tide_proto_job_row_t wait_job(void *admin, int (*pred)(const tide_proto_job_row_t *))
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

/* Number of events of kind (all events since the start). */
static int count_events(void *admin, const char *kind)
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
static int find_event(void *admin, const char *kind, const char *text, char *out, size_t cap)
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
static int event_detail(void *admin, const char *kind, char *out, size_t cap)
{
    return find_event(admin, kind, "", out, cap);
}

/* 1 when an event of kind has a detail holding text. */
static int event_with(void *admin, const char *kind, const char *text)
{
    return find_event(admin, kind, text, NULL, 0);
}

Test(tided, resize_offline_preemption_and_kill9_restart_mid_switch, .init = setup, .fini = teardown)
{
    start(NULL);
    fake w[4];
    tide_msg_t m, r;
    for (int i = 0; i < 4; i++) {
        fake_connect(&w[i], 5000);
        fake_register(&w[i], i, 4);
    }
    /* ranks 0 and 1 hold the first layout (generation 1); 2 and 3, joining after it was
       placed (joins on separate sockets reach tided in either order), wait idle */
    for (int i = 0; i < 2; i++)
        fake_join(&w[i], 2);
    for (int i = 0; i < 2; i++) {
        expect_type(w[i].sock, TIDE_MSG_LAYOUT, &r);
        cr_assert_eq(r.u.layout.layout.gen, 1);
        cr_assert_eq(r.u.layout.layout.dp, 2);
        cr_assert_eq(r.u.layout.has_prev, 0);
        tide_msg_clear(&r);
    }
    for (int i = 2; i < 4; i++) {
        fake_join(&w[i], 2);
        expect_type(w[i].sock, TIDE_MSG_OK, &r);
        tide_msg_clear(&r);
    }
    void *admin = coord_connect(ctx, proc.endpoint, NULL, NULL, NULL, 5000);
    /* offline work goes to the lowest idle worker */
    tide_msg_init(&m, TIDE_MSG_SUBMIT);
    snprintf(m.u.submit.name, sizeof m.u.submit.name, "eval");
    m.u.submit.kind = TIDE_JOB_COMMAND;
    char *argv[2] = {"sleep", "100"};
    m.u.submit.argv = argv;
    m.u.submit.argc = 2;
    m.u.submit.priority = 3;
    admin_call(admin, &m, &r, TIDE_MSG_OK);
    tide_msg_clear(&r);
    expect_type(w[2].sock, TIDE_MSG_OFFLINE_ASSIGN, &r);
    cr_assert_str_eq(r.u.offline_assign.job, "eval");
    cr_assert_eq(r.u.offline_assign.attempt, 1);
    cr_assert_str_eq(r.u.offline_assign.argv[0], "sleep");
    tide_msg_clear(&r);

    /* a dry run changes nothing */
    mk_resize(&m, 4, 1);
    admin_call(admin, &m, &r, TIDE_MSG_RESIZE_REPLY);
    cr_assert_eq(r.u.resize_reply.dry_run, 1);
    cr_assert_eq(r.u.resize_reply.layout.dp, 4);
    cr_assert_eq(r.u.resize_reply.preempted, 1);
    tide_msg_clear(&r);
    /* a resize the pool cannot hold is refused with a reason */
    mk_resize(&m, 5, 0);
    admin_call(admin, &m, &r, TIDE_MSG_ERROR);
    cr_assert_eq(r.u.error.code, TIDE_ERR_NO_DEVICE);
    cr_assert(strstr(r.u.error.message, "needs 5 workers") != NULL, "%s", r.u.error.message);
    tide_msg_clear(&r);

    mk_resize(&m, 4, 0);
    admin_call(admin, &m, &r, TIDE_MSG_RESIZE_REPLY);
    cr_assert_eq(r.u.resize_reply.layout.gen, 2);
    tide_msg_clear(&r);
    /* the grow takes worker 2 away from its offline work first */
    expect_type(w[2].sock, TIDE_MSG_PREEMPT, &r);
    cr_assert_str_eq(r.u.preempt.job, "eval");
    tide_msg_clear(&r);
    const uint64_t acked[4] = {10, 11, 0, 0};
    for (int i = 0; i < 4; i++) {
        expect_type(w[i].sock, TIDE_MSG_LAYOUT, &r);
        cr_assert_eq(r.u.layout.layout.gen, 2);
        cr_assert_eq(r.u.layout.has_prev, 1);
        cr_assert_eq(r.u.layout.prev.gen, 1);
        cr_assert_eq(r.u.layout.recover, 0, "a resize is announced as no recovery");
        tide_msg_clear(&r);
        expect_type(w[i].sock, TIDE_MSG_PREPARE, &r);
        cr_assert_eq(r.u.prepare.gen, 2);
        tide_msg_clear(&r);
        tide_msg_init(&m, TIDE_MSG_PREPARE_ACK);
        m.u.prepare_ack.worker = w[i].id;
        snprintf(m.u.prepare_ack.job, sizeof m.u.prepare_ack.job, "train");
        m.u.prepare_ack.gen = 2;
        m.u.prepare_ack.step = acked[i];
        cr_assert_eq(coord_send(w[i].sock, &m), 0);
    }
    for (int i = 0; i < 4; i++) {
        expect_type(w[i].sock, TIDE_MSG_COMMIT, &r);
        cr_assert_eq(r.u.commit.step, 12, "switch step = max(old members' steps) + 1");
        tide_msg_clear(&r);
    }

    /* kill -9 in the middle of the switch, then restart on the same state file */
    coord_stop(&proc, SIGKILL);
    for (int i = 0; i < 4; i++)
        zmq_close(w[i].sock);
    zmq_close(admin);
    start(NULL);
    for (int i = 0; i < 4; i++) {
        int32_t before = w[i].id;
        fake_connect(&w[i], 5000);
        fake_register(&w[i], i, 4);
        cr_assert_eq(w[i].id, before, "a re-registering worker keeps its id");
        /* the pending commit is sent again; the worker answers done */
        expect_type(w[i].sock, TIDE_MSG_COMMIT, &r);
        cr_assert_eq(r.u.commit.gen, 2);
        cr_assert_eq(r.u.commit.step, 12);
        tide_msg_clear(&r);
        tide_msg_init(&m, TIDE_MSG_DONE);
        m.u.done.worker = w[i].id;
        snprintf(m.u.done.job, sizeof m.u.done.job, "train");
        m.u.done.gen = 2;
        m.u.done.bytes_moved = 100;
        cr_assert_eq(coord_send(w[i].sock, &m), 0);
    }
    admin = coord_connect(ctx, proc.endpoint, NULL, NULL, NULL, 5000);
    const tide_proto_job_row_t *row = NULL;
    for (int tries = 0; tries < 100; tries++) {
        tide_msg_init(&m, TIDE_MSG_JOBS);
        admin_call(admin, &m, &r, TIDE_MSG_JOBS_REPLY);
        row = find_job(&r, "train");
        cr_assert_not_null(row);
        if (row->gen == 2)
            break;
        tide_msg_clear(&r);
        tide_sleep_ms(20);
    }
    cr_assert_eq(row->gen, 2, "generation 2 committed after the restart");
    cr_assert_eq(row->dp, 4);
    cr_assert_eq(row->state, TIDE_JOB_RUNNING);
    cr_assert_eq(row->step, 12);
    const tide_proto_job_row_t *ev = find_job(&r, "eval");
    cr_assert_eq(ev->state, TIDE_JOB_PREEMPTED, "the preempted offline job waits requeued");
    cr_assert_eq(ev->attempts, 1);
    tide_msg_clear(&r);
    tide_msg_init(&m, TIDE_MSG_STATUS);
    admin_call(admin, &m, &r, TIDE_MSG_STATUS_REPLY);
    cr_assert_eq(r.u.status_reply.n_rows, 4);
    for (uint32_t i = 0; i < 4; i++) {
        cr_assert_eq(r.u.status_reply.rows[i].state, TIDE_WORKER_ONLINE);
        cr_assert_str_eq(r.u.status_reply.rows[i].job, "train");
        cr_assert_geq(r.u.status_reply.rows[i].dp_rank, 0);
    }
    tide_msg_clear(&r);
    /* the history survived the crash and records the whole switch */
    tide_msg_init(&m, TIDE_MSG_EVENTS);
    m.u.events.limit = 1000;
    admin_call(admin, &m, &r, TIDE_MSG_EVENTS_REPLY);
    const char *want[] = {"job_created", "layout",         "submitted",   "offline_assigned",
                          "preempted",   "resize_started", "switch_step", "resized"};
    for (size_t k = 0; k < sizeof want / sizeof *want; k++) {
        int found = 0;
        for (uint32_t i = 0; i < r.u.events_reply.n_rows; i++)
            found |= strcmp(r.u.events_reply.rows[i].kind, want[k]) == 0;
        cr_assert(found, "event '%s' missing after restart", want[k]);
    }
    tide_msg_clear(&r);
    for (int i = 0; i < 4; i++)
        zmq_close(w[i].sock);
    zmq_close(admin);
}

Test(tided, missed_heartbeats_trigger_recovery_over_survivors, .init = setup, .fini = teardown)
{
    const char *extra[] = {"--heartbeat-ms", "100", "--miss-limit", "3", NULL};
    start(extra);
    fake w[3];
    tide_msg_t m, r;
    for (int i = 0; i < 3; i++) {
        fake_connect(&w[i], 3000);
        fake_register(&w[i], i, 3);
        fake_join(&w[i], 3);
    }
    for (int i = 0; i < 3; i++) {
        expect_type(w[i].sock, TIDE_MSG_LAYOUT, &r);
        cr_assert_eq(r.u.layout.layout.dp, 3);
        tide_msg_clear(&r);
    }
    int ms = 50;
    zmq_setsockopt(w[0].sock, ZMQ_RCVTIMEO, &ms, sizeof ms);
    /* ranks 0 and 1 keep heartbeating, rank 2 goes silent */
    int got = 0;
    for (int t = 0; t < 60 && !got; t++) {
        for (int i = 0; i < 2; i++) {
            coord_mk_heartbeat(&m, w[i].id, 5, 1);
            coord_send(w[i].sock, &m);
        }
        if (coord_recv(w[0].sock, &r) == 0) {
            if (r.type == TIDE_MSG_LAYOUT && r.u.layout.layout.gen == 2) {
                got = 1;
                cr_assert_eq(r.u.layout.layout.dp, 2, "recovery keeps the survivors only");
                cr_assert_eq(r.u.layout.recover, 1,
                             "a recovery is announced as one (workers build nothing ahead)");
                for (int k = 0; k < 2; k++)
                    cr_assert_neq(r.u.layout.layout.worker[k], 2);
            }
            tide_msg_clear(&r);
        }
    }
    cr_assert(got, "no recovery layout after rank 2 stopped heartbeating");
    void *admin = coord_connect(ctx, proc.endpoint, NULL, NULL, NULL, 3000);
    tide_msg_init(&m, TIDE_MSG_JOBS);
    admin_call(admin, &m, &r, TIDE_MSG_JOBS_REPLY);
    cr_assert_eq(find_job(&r, "train")->state, TIDE_JOB_RECOVERING);
    tide_msg_clear(&r);
    tide_msg_init(&m, TIDE_MSG_STATUS);
    admin_call(admin, &m, &r, TIDE_MSG_STATUS_REPLY);
    for (uint32_t i = 0; i < r.u.status_reply.n_rows; i++)
        if (r.u.status_reply.rows[i].worker == w[2].id)
            cr_assert_eq(r.u.status_reply.rows[i].state, TIDE_WORKER_FAILED);
    tide_msg_clear(&r);
    /* the failed member comes back (it was only stopped): it is told it was fenced, never
       to register again, and registering again as the same process changes nothing */
    coord_mk_heartbeat(&m, w[2].id, 5, 1);
    cr_assert_eq(coord_call(w[2].sock, &m, &r), 0);
    cr_assert_eq(r.type, TIDE_MSG_FENCED, "got %s", tide_msg_type_name(r.type));
    cr_assert_eq(r.u.fenced.worker, w[2].id);
    cr_assert_str_eq(r.u.fenced.job, "train");
    cr_assert(strstr(r.u.fenced.reason, "must exit") != NULL, "%s", r.u.fenced.reason);
    tide_msg_clear(&r);
    coord_mk_register(&m, POOL, 2, 3, "host1", 0, 1002); /* fake_register's pid for rank 2 */
    cr_assert_eq(coord_call(w[2].sock, &m, &r), 0);
    cr_assert_eq(r.type, TIDE_MSG_FENCED, "the same process may not rejoin: got %s",
                 tide_msg_type_name(r.type));
    tide_msg_clear(&r);
    tide_msg_init(&m, TIDE_MSG_OFFLINE_STATUS); /* nor report anything */
    m.u.offline_status.worker = w[2].id;
    snprintf(m.u.offline_status.job, sizeof m.u.offline_status.job, "x");
    m.u.offline_status.attempt = 1;
    cr_assert_eq(coord_call(w[2].sock, &m, &r), 0);
    cr_assert_eq(r.type, TIDE_MSG_FENCED, "got %s", tide_msg_type_name(r.type));
    tide_msg_clear(&r);
    tide_msg_init(&m, TIDE_MSG_STATUS);
    admin_call(admin, &m, &r, TIDE_MSG_STATUS_REPLY);
    int listed = 0;
    for (uint32_t i = 0; i < r.u.status_reply.n_rows; i++)
        if (r.u.status_reply.rows[i].worker == w[2].id) {
            listed = 1;
            cr_assert_eq(r.u.status_reply.rows[i].state, TIDE_WORKER_FAILED,
                         "a fenced worker stays failed, never idle");
        }
    cr_assert(listed);
    tide_msg_clear(&r);
    tide_msg_init(&m, TIDE_MSG_EVENTS);
    m.u.events.limit = 1000;
    admin_call(admin, &m, &r, TIDE_MSG_EVENTS_REPLY);
    int fenced_ev = 0, back_ev = 0;
    for (uint32_t i = 0; i < r.u.events_reply.n_rows; i++) {
        fenced_ev += strcmp(r.u.events_reply.rows[i].kind, "worker_fenced") == 0;
        back_ev += strcmp(r.u.events_reply.rows[i].kind, "worker_back") == 0;
    }
    cr_assert_eq(fenced_ev, 1, "one worker_fenced event, however often it speaks");
    cr_assert_eq(back_ev, 0);
    tide_msg_clear(&r);
    /* a new process on the rank (another pid: a relaunch) is a fresh idle worker */
    coord_mk_register(&m, POOL, 2, 3, "host1", 0, 7002);
    cr_assert_eq(coord_call(w[2].sock, &m, &r), 0);
    cr_assert_eq(r.type, TIDE_MSG_REGISTER_OK, "got %s", tide_msg_type_name(r.type));
    cr_assert_eq(r.u.register_ok.fail_ms, 300, "the failure timeout is heartbeat x miss limit");
    tide_msg_clear(&r);
    for (int i = 0; i < 3; i++)
        zmq_close(w[i].sock);
    zmq_close(admin);
}

Test(tided, malformed_input_gets_errors_while_others_are_served, .init = setup, .fini = teardown)
{
    start(NULL);
    void *bad = coord_connect(ctx, proc.endpoint, NULL, NULL, NULL, 3000);
    void *good = coord_connect(ctx, proc.endpoint, NULL, NULL, NULL, 3000);
    tide_msg_t m, r;
    tide_proto_buf_t b;
    tide_proto_buf_init(&b);
    tide_msg_init(&m, TIDE_MSG_EVENTS);
    m.u.events.limit = 10;
    cr_assert_eq(tide_proto_encode(&m, &b), TIDE_OK);
    struct {
        const void *data;
        size_t len;
    } cases[] = {
        {"\x01\x02\x03garbage", 10},
        {b.data, b.len - 1},  /* truncated */
        {b.data, 0},          /* empty */
        {"\x81\xa1v\x01", 4}, /* {v: 1}: no type */
    };
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        cr_assert_eq(coord_send_raw(bad, cases[k].data, cases[k].len), 0);
        cr_assert_eq(coord_recv(bad, &r), 0, "case %zu: no reply", k);
        cr_assert_eq(r.type, TIDE_MSG_ERROR);
        cr_assert_eq(r.u.error.code, TIDE_ERR_PROTOCOL, "case %zu: code %d", k, r.u.error.code);
        cr_assert_gt(strlen(r.u.error.message), 5);
        tide_msg_clear(&r);
        /* the other client is served in between */
        tide_msg_init(&m, TIDE_MSG_STATUS);
        admin_call(good, &m, &r, TIDE_MSG_STATUS_REPLY);
        tide_msg_clear(&r);
    }
    /* trailing garbage after a valid message */
    uint8_t *tail = malloc(b.len + 1);
    memcpy(tail, b.data, b.len);
    tail[b.len] = 0xc0;
    coord_send_raw(bad, tail, b.len + 1);
    free(tail);
    cr_assert_eq(coord_recv(bad, &r), 0);
    cr_assert_eq(r.u.error.code, TIDE_ERR_PROTOCOL);
    tide_msg_clear(&r);
    /* two payload frames */
    zmq_send(bad, b.data, b.len, ZMQ_SNDMORE);
    zmq_send(bad, b.data, b.len, 0);
    cr_assert_eq(coord_recv(bad, &r), 0);
    cr_assert_eq(r.u.error.code, TIDE_ERR_PROTOCOL);
    tide_msg_clear(&r);
    /* a message only tided may send */
    tide_msg_init(&m, TIDE_MSG_OK);
    cr_assert_eq(coord_call(bad, &m, &r), 0);
    cr_assert_eq(r.u.error.code, TIDE_ERR_PROTOCOL);
    tide_msg_clear(&r);
    /* a record (what tided stores) sent as a request */
    tide_msg_init(&m, TIDE_MSG_JOB_FIT);
    cr_assert_eq(tide_proto_encode_record(&m, &b), TIDE_OK);
    cr_assert_eq(coord_send_raw(bad, b.data, b.len), 0);
    cr_assert_eq(coord_recv(bad, &r), 0);
    cr_assert_eq(r.type, TIDE_MSG_ERROR);
    cr_assert_eq(r.u.error.code, TIDE_ERR_PROTOCOL);
    cr_assert(strstr(r.u.error.message, "a stored record, never a request") != NULL, "%s",
              r.u.error.message);
    tide_msg_clear(&r);
    /* a heartbeat from a worker nobody registered */
    coord_mk_heartbeat(&m, 77, 1, 1);
    cr_assert_eq(coord_call(bad, &m, &r), 0);
    cr_assert_eq(r.u.error.code, TIDE_ERR_NOT_FOUND);
    tide_msg_clear(&r);
    tide_proto_buf_destroy(&b);
    tide_msg_init(&m, TIDE_MSG_EVENTS);
    m.u.events.limit = 10;
    admin_call(bad, &m, &r, TIDE_MSG_EVENTS_REPLY);
    tide_msg_clear(&r);
    cr_assert_eq(waitpid(proc.pid, NULL, WNOHANG), 0, "tided must still run");
    zmq_close(bad);
    zmq_close(good);
}

static void write_key(const char *dir, const char *name, const char *pub, const char *sec,
                      const char *role)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f);
    fprintf(f, "# test key\npublic = %s\n", pub);
    if (sec)
        fprintf(f, "secret = %s\n", sec);
    if (role)
        fprintf(f, "role = %s\n", role);
    fclose(f);
}

Test(tided, curve_roles_and_unknown_keys, .init = setup, .fini = teardown)
{
    char sp[41], ss[41], ap[41], as[41], wp[41], ws[41], xp[41], xs[41], vp[41], vs[41];
    char rp[41], rs[41];
    cr_assert_eq(zmq_curve_keypair(sp, ss), 0);
    zmq_curve_keypair(rp, rs);
    write_key(proc.dir, "r.pub", rp, NULL, "reader");
    zmq_curve_keypair(ap, as);
    zmq_curve_keypair(wp, ws);
    zmq_curve_keypair(xp, xs);
    zmq_curve_keypair(vp, vs);
    write_key(proc.dir, "w2.pub", vp, NULL, "worker");
    write_key(proc.dir, "server.key", sp, ss, NULL);
    write_key(proc.dir, "admin.pub", ap, NULL, "admin");
    write_key(proc.dir, "w.pub", wp, NULL, "worker");
    write_key(proc.dir, "stranger.key", xp, xs, "admin"); /* a .key, not allowed */
    const char *extra[] = {"--auth", proc.dir, NULL};
    start(extra);
    tide_msg_t m, r;
    void *admin = coord_connect(ctx, proc.endpoint, ap, as, sp, 3000);
    void *worker = coord_connect(ctx, proc.endpoint, wp, ws, sp, 3000);
    void *stranger = coord_connect(ctx, proc.endpoint, xp, xs, sp, 700);
    tide_msg_init(&m, TIDE_MSG_STATUS);
    admin_call(admin, &m, &r, TIDE_MSG_STATUS_REPLY);
    tide_msg_clear(&r);
    coord_mk_register(&m, POOL, 0, 1, "host0", 0, 42);
    admin_call(worker, &m, &r, TIDE_MSG_REGISTER_OK);
    int32_t id0 = r.u.register_ok.worker;
    tide_msg_clear(&r);
    /* another worker key may not speak for that worker id, nor take its (pool, rank) over */
    void *other = coord_connect(ctx, proc.endpoint, vp, vs, sp, 3000);
    coord_mk_heartbeat(&m, id0, 5, 1);
    admin_call(other, &m, &r, TIDE_MSG_ERROR);
    cr_assert_eq(r.u.error.code, TIDE_ERR_DENIED);
    tide_msg_clear(&r);
    tide_msg_init(&m, TIDE_MSG_BYE);
    m.u.bye.worker = id0;
    admin_call(other, &m, &r, TIDE_MSG_ERROR);
    cr_assert_eq(r.u.error.code, TIDE_ERR_DENIED);
    tide_msg_clear(&r);
    coord_mk_register(&m, POOL, 0, 1, "host9", 0, 43);
    admin_call(other, &m, &r, TIDE_MSG_ERROR);
    cr_assert_eq(r.u.error.code, TIDE_ERR_DENIED);
    tide_msg_clear(&r);
    /* ... nor add ranks to the pool that key registered */
    coord_mk_register(&m, POOL, 1, 2, "host9", 0, 44);
    admin_call(other, &m, &r, TIDE_MSG_ERROR);
    cr_assert_eq(r.u.error.code, TIDE_ERR_DENIED);
    cr_assert(strstr(r.u.error.message, "registered with another key"), "%s", r.u.error.message);
    tide_msg_clear(&r);
    /* a reader key reads status and jobs, and may neither register nor act */
    void *reader = coord_connect(ctx, proc.endpoint, rp, rs, sp, 3000);
    tide_msg_init(&m, TIDE_MSG_JOBS);
    admin_call(reader, &m, &r, TIDE_MSG_JOBS_REPLY);
    tide_msg_clear(&r);
    coord_mk_register(&m, "reader-pool", 0, 1, "host8", 0, 45);
    admin_call(reader, &m, &r, TIDE_MSG_ERROR);
    cr_assert_eq(r.u.error.code, TIDE_ERR_DENIED);
    cr_assert(strstr(r.u.error.message, "needs a worker or admin key"), "%s", r.u.error.message);
    tide_msg_clear(&r);
    coord_mk_heartbeat(&m, id0, 7, 1);
    admin_call(reader, &m, &r, TIDE_MSG_ERROR);
    cr_assert_eq(r.u.error.code, TIDE_ERR_DENIED);
    tide_msg_clear(&r);
    tide_msg_init(&m, TIDE_MSG_DRAIN);
    m.u.drain.worker = id0;
    admin_call(reader, &m, &r, TIDE_MSG_ERROR);
    cr_assert_eq(r.u.error.code, TIDE_ERR_DENIED);
    cr_assert(strstr(r.u.error.message, "needs an admin key"), "%s", r.u.error.message);
    tide_msg_clear(&r);
    zmq_close(reader);
    /* every key may read status and jobs (libtide learns failed peers from status) ... */
    tide_msg_init(&m, TIDE_MSG_STATUS);
    admin_call(other, &m, &r, TIDE_MSG_STATUS_REPLY);
    cr_assert_eq(r.u.status_reply.n_rows, 1);
    cr_assert_eq(r.u.status_reply.rows[0].state, TIDE_WORKER_IDLE, "the bye was not acted on");
    cr_assert_eq(r.u.status_reply.rows[0].step, 0, "the heartbeat was not acted on");
    cr_assert_str_eq(r.u.status_reply.rows[0].host, "host0", "the register was not acted on");
    tide_msg_clear(&r);
    tide_msg_init(&m, TIDE_MSG_JOBS);
    admin_call(worker, &m, &r, TIDE_MSG_JOBS_REPLY);
    tide_msg_clear(&r);
    /* ... but the event history is for admins */
    tide_msg_init(&m, TIDE_MSG_EVENTS);
    m.u.events.limit = 10;
    admin_call(worker, &m, &r, TIDE_MSG_ERROR);
    cr_assert_eq(r.u.error.code, TIDE_ERR_DENIED);
    tide_msg_clear(&r);
    /* the owner's own heartbeat counts */
    coord_mk_heartbeat(&m, id0, 9, 1);
    cr_assert_eq(coord_send(worker, &m), 0);
    for (int tries = 0; tries < 100; tries++) {
        tide_msg_init(&m, TIDE_MSG_STATUS);
        admin_call(worker, &m, &r, TIDE_MSG_STATUS_REPLY);
        uint64_t step = r.u.status_reply.rows[0].step;
        tide_msg_clear(&r);
        if (step == 9)
            break;
        cr_assert_lt(tries, 99, "the owner's heartbeat was not taken");
        tide_sleep_ms(10);
    }
    zmq_close(other);
    /* a worker key may not resize or submit: refused, nothing done */
    tide_msg_init(&m, TIDE_MSG_DRAIN);
    m.u.drain.worker = 0;
    admin_call(worker, &m, &r, TIDE_MSG_ERROR);
    cr_assert_eq(r.u.error.code, TIDE_ERR_DENIED);
    tide_msg_clear(&r);
    tide_msg_init(&m, TIDE_MSG_STATUS);
    admin_call(admin, &m, &r, TIDE_MSG_STATUS_REPLY);
    cr_assert_eq(r.u.status_reply.n_rows, 1);
    cr_assert_eq(r.u.status_reply.rows[0].state, TIDE_WORKER_IDLE, "the drain was not acted on");
    tide_msg_clear(&r);
    /* a key that is not in the directory never gets an answer */
    tide_msg_init(&m, TIDE_MSG_STATUS);
    coord_send(stranger, &m);
    cr_assert_neq(coord_recv(stranger, &r), 0, "an unknown key was served");
    /* plain (non-CURVE) clients are refused too */
    void *plain = coord_connect(ctx, proc.endpoint, NULL, NULL, NULL, 700);
    coord_send(plain, &m);
    cr_assert_neq(coord_recv(plain, &r), 0, "a plain client was served");
    admin_call(admin, &m, &r, TIDE_MSG_STATUS_REPLY);
    tide_msg_clear(&r);
    zmq_close(admin);
    zmq_close(worker);
    zmq_close(stranger);
    zmq_close(plain);
}

Test(tided, non_loopback_bind_without_auth_is_refused, .init = setup, .fini = teardown)
{
    const char *extra[] = {"--endpoint", "tcp://0.0.0.0:*", NULL};
    int st = 0;
    cr_assert_neq(coord_start(&proc, TIDED_PATH, extra, &st), 0);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 2, "status %d", st);
}

static int is_done(const tide_proto_job_row_t *r)
{
    return r->state == TIDE_JOB_DONE;
}

static int is_stalled(const tide_proto_job_row_t *r)
{
    return r->state == TIDE_JOB_STALLED;
}

static int is_running_again(const tide_proto_job_row_t *r)
{
    return r->state == TIDE_JOB_RUNNING && r->step == 8;
}

/* f's heartbeat: step steps done, the next one running for in_step_ms. */
static void heartbeat_in_step(fake *f, uint64_t step, double in_step_ms)
{
    tide_msg_t m;
    coord_mk_heartbeat(&m, f->id, step, 1);
    m.u.heartbeat.in_step_ms = in_step_ms;
    cr_assert_eq(coord_send(f->sock, &m), 0);
}

/* Rank 0's heartbeat says step 8 has run 5 s on one host, past the stall bound
   (max(--stall-ms, 10 x the 100 ms step time) = 1 s), rank 1's 700 ms (it entered the
   hung step later, or told it earlier): the stalled event names both ranks inside it, and
   the jobs listing says "stalled", not running (nothing to fence on one host, so no
   recovery); a step done ends the stall. */
Test(tided, a_stalled_step_lists_the_job_stalled_until_a_step_completes, .init = setup,
     .fini = teardown)
{
    const char *extra[] = {"--stall-ms", "500", NULL};
    start(extra);
    fake w[2];
    tide_msg_t r;
    for (int i = 0; i < 2; i++) {
        fake_connect(&w[i], 3000);
        fake_register(&w[i], i, 2);
        fake_join(&w[i], 2);
    }
    for (int i = 0; i < 2; i++) {
        expect_type(w[i].sock, TIDE_MSG_LAYOUT, &r);
        tide_msg_clear(&r);
    }
    void *admin = coord_connect(ctx, proc.endpoint, NULL, NULL, NULL, 3000);
    tide_proto_job_row_t row;
    for (int tries = 0; tries < 150; tries++) { /* the stall check runs once a second */
        for (int i = 0; i < 2; i++)
            heartbeat_in_step(&w[i], 7, i == 0 ? 5000 : 700);
        tide_sleep_ms(100);
        tide_msg_t m;
        tide_msg_init(&m, TIDE_MSG_JOBS);
        admin_call(admin, &m, &r, TIDE_MSG_JOBS_REPLY);
        row = *find_job(&r, "train");
        tide_msg_clear(&r);
        if (is_stalled(&row))
            break;
    }
    cr_assert_eq(row.state, TIDE_JOB_STALLED, "the job is listed '%s'",
                 tide_proto_job_state_name(row.state));
    cr_assert_eq(count_events(admin, "stalled"), 1);
    char detail[1024];
    cr_assert(event_detail(admin, "stalled", detail, sizeof detail));
    cr_assert(strstr(detail, "with 2 ranks inside it") != NULL &&
                  strstr(detail, "(2 ranks, 2 stalled)") != NULL,
              "both ranks inside the hung step are named: %s", detail);
    cr_assert_eq(count_events(admin, "recovery_started"), 0, "one host: nothing fenced");
    for (int i = 0; i < 2; i++)
        heartbeat_in_step(&w[i], 8, 0);
    row = wait_job(admin, is_running_again);
    cr_assert_eq(row.state, TIDE_JOB_RUNNING, "a step done ends the stall");
    for (int i = 0; i < 2; i++)
        zmq_close(w[i].sock);
    zmq_close(admin);
}

Test(tided, bye_without_a_pending_switch_ends_the_job, .init = setup, .fini = teardown)
{
    start(NULL);
    fake w[3];
    tide_msg_t m, r;
    for (int i = 0; i < 3; i++) {
        fake_connect(&w[i], 3000);
        fake_register(&w[i], i, 3);
        fake_join(&w[i], 2);
    }
    for (int i = 0; i < 2; i++) {
        expect_type(w[i].sock, TIDE_MSG_LAYOUT, &r);
        tide_msg_clear(&r);
    }
    expect_type(w[2].sock, TIDE_MSG_OK, &r);
    tide_msg_clear(&r);
    void *admin = coord_connect(ctx, proc.endpoint, NULL, NULL, NULL, 3000);
    /* the program finished: rank 0 says bye first, after 17 steps that no heartbeat told */
    tide_msg_init(&m, TIDE_MSG_BYE);
    m.u.bye.worker = w[0].id;
    m.u.bye.step = 17;
    admin_call(w[0].sock, &m, &r, TIDE_MSG_OK);
    tide_msg_clear(&r);
    tide_proto_job_row_t row = wait_job(admin, is_done);
    cr_assert_eq(row.state, TIDE_JOB_DONE, "state %d", row.state);
    cr_assert_eq(row.gen, 1, "no recovery generation");
    cr_assert_eq(row.step, 17, "the job's last step is the bye's: %lld", (long long)row.step);
    cr_assert_eq(count_events(admin, "job_ended"), 1);
    char detail[1024];
    cr_assert(event_detail(admin, "job_ended", detail, sizeof detail));
    cr_assert(strstr(detail, "ends at step 17 ") != NULL, "job_ended: %s", detail);
    /* the idle rank of the job hears that it ended, and at which step */
    expect_type(w[2].sock, TIDE_MSG_JOB_END, &r);
    cr_assert_str_eq(r.u.job_end.job, "train");
    cr_assert_eq(r.u.job_end.step, 17u);
    cr_assert(strstr(r.u.job_end.why, "left with no switch pending: the job ends at step 17 ") !=
                  NULL,
              "the idle rank is told why: %s", r.u.job_end.why);
    tide_msg_clear(&r);
    cr_assert_eq(count_events(admin, "recovery_started"), 0);
    cr_assert_eq(count_events(admin, "stalled"), 0);
    /* rank 1 (a member) is idle and holds no job; rank 0 left */
    tide_msg_init(&m, TIDE_MSG_STATUS);
    admin_call(admin, &m, &r, TIDE_MSG_STATUS_REPLY);
    for (uint32_t i = 0; i < r.u.status_reply.n_rows; i++) {
        const tide_proto_gpu_row_t *g = &r.u.status_reply.rows[i];
        cr_assert_str_eq(g->job, "", "worker %d still shows job %s", g->worker, g->job);
        if (g->worker == w[1].id) {
            cr_assert_eq(g->state, TIDE_WORKER_IDLE);
            /* which process the row is: its launch, its rank there, its pid on host0 */
            cr_assert_str_eq(g->pool, POOL);
            cr_assert_eq(g->pool_rank, 1);
            cr_assert_eq(g->pid, 1001);
            cr_assert_str_eq(g->host, "host0");
        }
    }
    tide_msg_clear(&r);
    /* no layout or prepare reaches the survivor: the next message it sees is its bye's ok */
    tide_msg_init(&m, TIDE_MSG_BYE);
    m.u.bye.worker = w[1].id;
    admin_call(w[1].sock, &m, &r, TIDE_MSG_OK);
    tide_msg_clear(&r);
    cr_assert_eq(count_events(admin, "worker_left"), 2, "later byes are plain leaves");
    cr_assert_eq(count_events(admin, "recovery_started"), 0);
    /* an ended job cannot be resized */
    mk_resize(&m, 1, 1);
    admin_call(admin, &m, &r, TIDE_MSG_ERROR);
    cr_assert(strstr(r.u.error.message, "has ended") != NULL, "%s", r.u.error.message);
    tide_msg_clear(&r);
    for (int i = 0; i < 3; i++)
        zmq_close(w[i].sock);
    zmq_close(admin);
}

static int is_recovering(const tide_proto_job_row_t *r)
{
    return r->gen == 2 && r->state == TIDE_JOB_RECOVERING;
}

Test(tided, failure_after_a_done_keeps_the_generation_and_recovers_from_it, .init = setup,
     .fini = teardown)
{
    start(NULL);
    fake w[3];
    tide_msg_t m, r;
    for (int i = 0; i < 3; i++) {
        fake_connect(&w[i], 3000);
        fake_register(&w[i], i, 3);
        fake_join(&w[i], 2);
    }
    for (int i = 0; i < 2; i++) {
        expect_type(w[i].sock, TIDE_MSG_LAYOUT, &r);
        tide_msg_clear(&r);
    }
    expect_type(w[2].sock, TIDE_MSG_OK, &r);
    tide_msg_clear(&r);
    void *admin = coord_connect(ctx, proc.endpoint, NULL, NULL, NULL, 3000);
    mk_resize(&m, 3, 0);
    admin_call(admin, &m, &r, TIDE_MSG_RESIZE_REPLY);
    tide_msg_clear(&r);
    for (int i = 0; i < 3; i++)
        ack_prepare(&w[i], 2, 7);
    commit_done(&w[0], 2, 10); /* rank 0 runs under generation 2 from here */
    expect_type(w[2].sock, TIDE_MSG_COMMIT, &r);
    tide_msg_clear(&r);
    tide_sleep_ms(100); /* let tided take the done before the failure */
    /* rank 2 (new in generation 2) fails before its done */
    tide_msg_init(&m, TIDE_MSG_FAILURE);
    m.u.failure.worker = w[2].id;
    snprintf(m.u.failure.job, sizeof m.u.failure.job, "train");
    m.u.failure.gen = 2;
    m.u.failure.code = TIDE_ERR_PEER;
    snprintf(m.u.failure.reason, sizeof m.u.failure.reason, "device lost");
    admin_call(w[2].sock, &m, &r, TIDE_MSG_OK);
    tide_msg_clear(&r);
    /* rank 0 gets no abort of 2: the next switch starts from generation 2 */
    tide_msg_t first;
    cr_assert_eq(coord_recv(w[0].sock, &first), 0, "no message after the failure");
    cr_assert_eq(first.type, TIDE_MSG_LAYOUT, "got '%s'", tide_msg_type_name(first.type));
    cr_assert_eq(first.u.layout.layout.gen, 3);
    cr_assert_eq(first.u.layout.has_prev, 1);
    cr_assert_eq(first.u.layout.prev.gen, 2, "the recovery starts from generation 2");
    cr_assert_eq(first.u.layout.prev.dp, 3);
    cr_assert_eq(first.u.layout.layout.dp, 2, "recovery over the two survivors");
    cr_assert_eq(first.u.layout.recover, 1, "announced as a recovery");
    tide_msg_clear(&first);
    tide_proto_job_row_t row = wait_job(admin, is_recovering);
    cr_assert_eq(row.gen, 2, "generation 2 is committed");
    cr_assert_eq(row.state, TIDE_JOB_RECOVERING);
    cr_assert_eq(count_events(admin, "switch_kept"), 1);
    cr_assert_eq(count_events(admin, "resize_aborted"), 0);
    cr_assert_eq(count_events(admin, "recovery_started"), 1);
    for (int i = 0; i < 3; i++)
        zmq_close(w[i].sock);
    zmq_close(admin);
}

/* A worker of POOL on its own host name. */
static void fake_register_on(fake *f, int rank, int size, const char *host)
{
    tide_msg_t m, r;
    f->rank = rank;
    coord_mk_register(&m, POOL, rank, size, host, 0, 2000 + rank);
    cr_assert_eq(coord_call(f->sock, &m, &r), 0, "no register_ok for rank %d", rank);
    cr_assert_eq(r.type, TIDE_MSG_REGISTER_OK, "got %s", tide_msg_type_name(r.type));
    f->id = r.u.register_ok.worker;
}

#define TLAYERS 4
#define TBYTES  (64 * 64 * 4) /* one f32 [64, 64] tensor per layer */

Test(tided, dry_run_compares_the_chosen_map_with_the_rank_order, .init = setup, .fini = teardown)
{
    start(NULL);
    /* ranks 0 and 1 on host a, 2 and 3 on host b: the first layout gives each host one
     * stage (both replicas of it), so ranks 0 and 1 hold the same stage */
    const char *hosts[4] = {"host-a", "host-a", "host-b", "host-b"};
    fake w[4];
    tide_msg_t m, r;
    tide_proto_tensor_t tensors[TLAYERS];
    memset(tensors, 0, sizeof tensors);
    for (int i = 0; i < TLAYERS; i++) {
        snprintf(tensors[i].name, sizeof tensors[i].name, "layer.%d.w", i);
        tensors[i].dtype = TIDE_F32;
        tensors[i].ndim = 2;
        tensors[i].shape[0] = tensors[i].shape[1] = 64;
        tensors[i].layer = i;
        tensors[i].tp = TIDE_TP_SPLIT;
        tensors[i].tp_dim = 0;
        tensors[i].tp_segments = 1;
        tensors[i].dp = TIDE_DP_REPLICATED;
    }
    for (int i = 0; i < 4; i++) {
        fake_connect(&w[i], 3000);
        fake_register_on(&w[i], i, 4, hosts[i]);
        tide_msg_init(&m, TIDE_MSG_JOIN);
        m.u.join.worker = w[i].id;
        snprintf(m.u.join.job, sizeof m.u.join.job, "train");
        m.u.join.total_bytes = TLAYERS * TBYTES;
        m.u.join.num_layers = TLAYERS;
        m.u.join.dp = 2;
        m.u.join.tp = 1;
        m.u.join.pp = 2;
        m.u.join.micro_batches = 2;
        m.u.join.tensors = tensors;
        m.u.join.n_tensors = TLAYERS;
        cr_assert_eq(coord_send(w[i].sock, &m), 0);
    }
    int stage_of[4] = {-1, -1, -1, -1};
    for (int i = 0; i < 4; i++) {
        expect_type(w[i].sock, TIDE_MSG_LAYOUT, &r);
        const tide_proto_layout_t *l = &r.u.layout.layout;
        for (int k = 0; k < 4; k++)
            stage_of[l->worker[k]] = k / 2; /* index = p * dp + d with tp 1 */
        tide_msg_clear(&r);
    }
    cr_assert_eq(stage_of[0], stage_of[1], "ranks 0 and 1 share a stage: %d %d %d %d", stage_of[0],
                 stage_of[1], stage_of[2], stage_of[3]);
    cr_assert_neq(stage_of[0], stage_of[2]);
    void *admin = coord_connect(ctx, proc.endpoint, NULL, NULL, NULL, 3000);
    /* DP shrink (dp 2 -> 1, pp 2): the chosen map keeps one replica in place, 0 bytes; the
     * rank order gives stages to ranks 0 and 1, so one of them receives a whole stage */
    tide_msg_init(&m, TIDE_MSG_RESIZE);
    snprintf(m.u.resize.job, sizeof m.u.resize.job, "train");
    m.u.resize.dp = 1;
    m.u.resize.tp = 1;
    m.u.resize.pp = 2;
    m.u.resize.dry_run = 1;
    m.u.resize.placement = TIDE_PLACEMENT_OPTIMAL;
    admin_call(admin, &m, &r, TIDE_MSG_RESIZE_REPLY);
    const tide_proto_resize_reply_t *x = &r.u.resize_reply;
    cr_assert_eq(x->bytes_sent, 0, "a DP shrink under the chosen map sends %llu bytes",
                 (unsigned long long)x->bytes_sent);
    cr_assert_eq(x->bytes_default, 2 * TBYTES, "rank order re-homes one stage (2 layers): %llu",
                 (unsigned long long)x->bytes_default);
    cr_assert_eq(x->bytes_local, TLAYERS * TBYTES, "the kept replica's state stays local: %llu",
                 (unsigned long long)x->bytes_local);
    for (int p = 0; p < 2; p++)
        cr_assert_eq(stage_of[x->layout.worker[p]], p, "stage %d went to rank %d", p,
                     x->layout.worker[p]);
    tide_msg_clear(&r);
    /* --placement default uses the rank order, and says what it costs */
    m.u.resize.placement = TIDE_PLACEMENT_DEFAULT;
    admin_call(admin, &m, &r, TIDE_MSG_RESIZE_REPLY);
    cr_assert_eq(r.u.resize_reply.bytes_sent, 2 * TBYTES);
    cr_assert_eq(r.u.resize_reply.layout.worker[0], 0);
    cr_assert_eq(r.u.resize_reply.layout.worker[1], 1);
    tide_msg_clear(&r);
    /* a tp the tensors cannot be split by is refused with reshard's reason */
    m.u.resize.placement = TIDE_PLACEMENT_OPTIMAL;
    m.u.resize.dp = 1;
    m.u.resize.tp = 3;
    m.u.resize.pp = 1;
    admin_call(admin, &m, &r, TIDE_MSG_ERROR);
    cr_assert(strstr(r.u.error.message, "does not divide") != NULL, "%s", r.u.error.message);
    tide_msg_clear(&r);
    /* tp 4 on hosts of 2: a TP group would span hosts; refused with the room, unless the
     * resize allows it (tidectl resize --allow-tp-across-hosts) */
    m.u.resize.tp = 4;
    admin_call(admin, &m, &r, TIDE_MSG_ERROR);
    cr_assert(strstr(r.u.error.message, "needs 1 TP groups of 4 workers, each inside one host") !=
                      NULL &&
                  strstr(r.u.error.message, "room for 0") != NULL,
              "%s", r.u.error.message);
    tide_msg_clear(&r);
    m.u.resize.tp_across_hosts = 1;
    admin_call(admin, &m, &r, TIDE_MSG_RESIZE_REPLY);
    cr_assert_eq(r.u.resize_reply.layout.tp, 4);
    tide_msg_clear(&r);
    for (int i = 0; i < 4; i++)
        zmq_close(w[i].sock);
    zmq_close(admin);
}

/* GET /metrics over plain TCP; the body into buf (NUL-terminated); returns its length. */
static size_t scrape(int port, char *buf, size_t cap)
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
static double sample(const char *text, const char *name)
{
    size_t k = strlen(name);
    for (const char *p = text; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL)
        if (strncmp(p, name, k) == 0 && p[k] == ' ')
            return strtod(p + k + 1, NULL);
    cr_assert_fail("metric %s missing from:\n%s", name, text);
    return -1;
}

static int is_gen2_running(const tide_proto_job_row_t *r)
{
    return r->gen == 2 && r->state == TIDE_JOB_RUNNING;
}

/*
 * One worker identity: ranks registered in reverse (rank r gets worker id 3 - r, never
 * its rank), so every reply, drain and metric that named a worker by its pool rank
 * instead of tided's id would fail here.
 */
Test(tided, workers_are_named_by_tided_id_everywhere, .init = setup, .fini = teardown)
{
    int port = coord_free_port();
    cr_assert_gt(port, 0, "no free loopback port");
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
    const char *extra[] = {"--metrics", addr, NULL};
    start(extra);
    fake w[4];
    tide_msg_t m, r;
    for (int i = 3; i >= 0; i--) {
        fake_connect(&w[i], 3000);
        fake_register(&w[i], i, 4);
        cr_assert_eq(w[i].id, 3 - i, "rank %d registered as worker %d", i, (int)w[i].id);
    }
    for (int i = 0; i < 4; i++)
        fake_join(&w[i], 4);
    for (int i = 0; i < 4; i++) {
        expect_type(w[i].sock, TIDE_MSG_LAYOUT, &r);
        tide_msg_clear(&r);
    }
    void *admin = coord_connect(ctx, proc.endpoint, NULL, NULL, NULL, 3000);
    /* the resize reply names the new layout's members by worker id; the layout sent to the
       workers holds their pool ranks */
    mk_resize(&m, 2, 0);
    admin_call(admin, &m, &r, TIDE_MSG_RESIZE_REPLY);
    int32_t shown[2] = {r.u.resize_reply.layout.worker[0], r.u.resize_reply.layout.worker[1]};
    tide_msg_clear(&r);
    expect_type(w[0].sock, TIDE_MSG_LAYOUT, &r);
    cr_assert_eq(r.u.layout.layout.gen, 2);
    int32_t ranks[2] = {r.u.layout.layout.worker[0], r.u.layout.layout.worker[1]};
    tide_msg_clear(&r);
    for (int k = 0; k < 2; k++)
        cr_assert_eq(shown[k], 3 - ranks[k],
                     "member %d: the resize reply says worker %d; it is pool rank %d = worker %d",
                     k, (int)shown[k], (int)ranks[k], 3 - (int)ranks[k]);
    for (int i = 0; i < 4; i++)
        ack_prepare(&w[i], 2, 4);
    for (int i = 0; i < 4; i++)
        commit_done(&w[i], 2, 0);
    wait_job(admin, is_gen2_running);
    /* metrics: one series per worker under its id, with its pool rank, host and device */
    static char text[1 << 16];
    scrape(port, text, sizeof text);
    for (int i = 0; i < 4; i++) {
        char name[256];
        snprintf(name, sizeof name,
                 "tide_worker_info{worker=\"%d\",pool=\"" POOL "\",rank=\"%d\",host=\"%s\","
                 "device=\"%d\",kind=\"gpu\"}",
                 3 - i, i, i < 2 ? "host0" : "host1", i % 2);
        cr_assert_eq(sample(text, name), 1);
        int member = i == ranks[0] || i == ranks[1];
        snprintf(name, sizeof name, "tide_worker_state{worker=\"%d\",state=\"%s\",job=\"%s\"}",
                 3 - i, member ? "online" : "idle", member ? "train" : "");
        cr_assert_eq(sample(text, name), 1);
    }
    /* drain takes the worker id: the job moves off pool rank ranks[0], not off rank shown[0] */
    tide_msg_init(&m, TIDE_MSG_DRAIN);
    m.u.drain.worker = shown[0];
    admin_call(admin, &m, &r, TIDE_MSG_OK);
    tide_msg_clear(&r);
    expect_type(w[ranks[1]].sock, TIDE_MSG_LAYOUT, &r);
    cr_assert_eq(r.u.layout.layout.gen, 3);
    size_t n = (size_t)r.u.layout.layout.dp * r.u.layout.layout.tp * r.u.layout.layout.pp;
    for (size_t k = 0; k < n; k++)
        cr_assert_neq(r.u.layout.layout.worker[k], ranks[0],
                      "drain of worker %d left its pool rank %d in the layout", (int)shown[0],
                      (int)ranks[0]);
    tide_msg_clear(&r);
    tide_msg_init(&m, TIDE_MSG_STATUS);
    admin_call(admin, &m, &r, TIDE_MSG_STATUS_REPLY);
    int draining = -1;
    for (uint32_t i = 0; i < r.u.status_reply.n_rows; i++)
        if (r.u.status_reply.rows[i].state == TIDE_WORKER_DRAINING)
            draining = r.u.status_reply.rows[i].worker;
    tide_msg_clear(&r);
    cr_assert_eq(draining, shown[0], "status shows worker %d draining, not %d", draining,
                 (int)shown[0]);
    zmq_close(admin);
    for (int i = 0; i < 4; i++)
        zmq_close(w[i].sock);
}

Test(tided, metrics_are_served_as_prometheus_text, .init = setup, .fini = teardown)
{
    int port = coord_free_port();
    cr_assert_gt(port, 0, "no free loopback port");
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
    const char *extra[] = {"--metrics", addr, NULL};
    start(extra);
    fake w[3];
    tide_msg_t m, r;
    for (int i = 0; i < 3; i++) {
        fake_connect(&w[i], 3000);
        fake_register(&w[i], i, 3);
        fake_join(&w[i], 2);
    }
    for (int i = 0; i < 2; i++) {
        expect_type(w[i].sock, TIDE_MSG_LAYOUT, &r);
        tide_msg_clear(&r);
    }
    expect_type(w[2].sock, TIDE_MSG_OK, &r);
    tide_msg_clear(&r);
    void *admin = coord_connect(ctx, proc.endpoint, NULL, NULL, NULL, 3000);
    tide_msg_init(&m, TIDE_MSG_SUBMIT);
    snprintf(m.u.submit.name, sizeof m.u.submit.name, "eval");
    m.u.submit.kind = TIDE_JOB_COMMAND;
    char *argv[2] = {"sleep", "100"};
    m.u.submit.argv = argv;
    m.u.submit.argc = 2;
    admin_call(admin, &m, &r, TIDE_MSG_OK);
    tide_msg_clear(&r);
    expect_type(w[2].sock, TIDE_MSG_OFFLINE_ASSIGN, &r);
    tide_msg_clear(&r);
    static char text[1 << 16];
    scrape(port, text, sizeof text);
    cr_assert_eq(sample(text, "tide_gpus{state=\"online\"}"), 2);
    cr_assert_eq(sample(text, "tide_gpus{state=\"offline\"}"), 1);
    cr_assert_eq(sample(text, "tide_gpus{state=\"idle\"}"), 0);
    cr_assert_eq(sample(text, "tide_preemptions_total"), 0);
    /* grow onto the worker running offline work: one preemption, one committed switch */
    mk_resize(&m, 3, 0);
    admin_call(admin, &m, &r, TIDE_MSG_RESIZE_REPLY);
    tide_msg_clear(&r);
    for (int i = 0; i < 3; i++)
        ack_prepare(&w[i], 2, 4);
    for (int i = 0; i < 3; i++)
        commit_done(&w[i], 2, 1000 * (uint64_t)(i + 1));
    cr_assert_eq(wait_job(admin, is_gen2_running).gen, 2);
    scrape(port, text, sizeof text);
    cr_assert_eq(sample(text, "tide_gpus{state=\"online\"}"), 3);
    cr_assert_eq(sample(text, "tide_gpus{state=\"offline\"}"), 0);
    cr_assert_eq(sample(text, "tide_gpus{state=\"failed\"}"), 0);
    cr_assert_eq(sample(text, "tide_jobs{kind=\"online\",state=\"running\"}"), 1);
    cr_assert_eq(sample(text, "tide_jobs{kind=\"offline\",state=\"queued\"}"), 1);
    cr_assert_eq(sample(text, "tide_job_generation{job=\"train\"}"), 2);
    cr_assert_eq(sample(text, "tide_resizes_total{result=\"committed\"}"), 1);
    cr_assert_eq(sample(text, "tide_resize_duration_seconds_count"), 1);
    double dur = sample(text, "tide_resize_duration_seconds_sum");
    cr_assert(dur > 0 && dur < 10, "resize duration %f s", dur);
    cr_assert_eq(sample(text, "tide_resharded_bytes_total"), 6000, "bytes the workers moved");
    /* the duration is a histogram: cumulative buckets up to +Inf, which is the count */
    cr_assert_eq(sample(text, "tide_resize_duration_seconds_bucket{le=\"+Inf\"}"), 1);
    cr_assert_eq(sample(text, "tide_resize_duration_seconds_bucket{le=\"300\"}"), 1);
    cr_assert_eq(sample(text, "tide_resize_duration_seconds_bucket{le=\"10\"}"), 1,
                 "a resize of %f s", dur);
    double prev = 0;
    int buckets = 0;
    for (const char *p = strstr(text, "tide_resize_duration_seconds_bucket{"); p != NULL;
         p = strstr(p + 1, "tide_resize_duration_seconds_bucket{")) {
        double v = strtod(strchr(p, ' ') + 1, NULL);
        cr_assert_geq(v, prev, "buckets are cumulative: %.40s", p);
        prev = v;
        buckets++;
    }
    cr_assert_geq(buckets, 5);
    cr_assert_eq(sample(text, "tide_preemptions_total"), 1);
    cr_assert_geq(sample(text, "tide_heartbeats_total"), 0);
    /* the exposition format: every sample's family was declared by # TYPE before it */
    char fam[128][96];
    int nfam = 0;
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        if (strncmp(line, "# TYPE ", 7) == 0) {
            cr_assert_lt(nfam, 128);
            char type[32] = "";
            sscanf(line + 7, "%95s %31s", fam[nfam], type);
            /* Prometheus naming: a counter ends in _total, a unit is the name's suffix
               (before _total), never in its middle */
            const char *f = fam[nfam++];
            size_t fl = strlen(f);
            if (strcmp(type, "counter") == 0)
                cr_assert(fl > 6 && strcmp(f + fl - 6, "_total") == 0, "counter %s", f);
            for (const char *unit = "_seconds"; unit; unit = unit[1] == 's' ? "_bytes" : NULL) {
                const char *at = strstr(f, unit);
                size_t ul = strlen(unit);
                cr_assert(at == NULL || at[ul] == '\0' || strcmp(at + ul, "_total") == 0,
                          "%s: the unit %s is not the name's suffix", f, unit);
            }
            continue;
        }
        if (line[0] == '#')
            continue;
        char name[160];
        double v;
        cr_assert_eq(sscanf(line, "%159s %lf", name, &v), 2, "bad sample line '%s'", line);
        name[strcspn(name, "{")] = '\0';
        int declared = 0;
        for (int f = 0; f < nfam; f++) {
            size_t k = strlen(fam[f]);
            declared |= strncmp(name, fam[f], k) == 0 &&
                        (name[k] == '\0' || strcmp(name + k, "_sum") == 0 ||
                         strcmp(name + k, "_count") == 0 || strcmp(name + k, "_bucket") == 0);
        }
        cr_assert(declared, "sample %s has no # TYPE line", name);
    }
    cr_assert_gt(nfam, 8);
    for (int i = 0; i < 3; i++)
        zmq_close(w[i].sock);
    zmq_close(admin);
}

/* Workers of a freshly launched job register first and join a moment later; offline
   work queued meanwhile must not go to them: the job would have to preempt it to start.
   Once the first layout is placed, the ranks it left spare get the work. */
Test(tided, no_offline_work_between_registration_and_the_first_layout, .init = setup,
     .fini = teardown)
{
    start(NULL);
    void *admin = coord_connect(ctx, proc.endpoint, NULL, NULL, NULL, 5000);
    tide_msg_t m, r;
    tide_msg_init(&m, TIDE_MSG_SUBMIT);
    snprintf(m.u.submit.name, sizeof m.u.submit.name, "eval");
    m.u.submit.kind = TIDE_JOB_COMMAND;
    char *argv[2] = {"sleep", "100"};
    m.u.submit.argv = argv;
    m.u.submit.argc = 2;
    admin_call(admin, &m, &r, TIDE_MSG_OK);
    tide_msg_clear(&r);
    fake w[4];
    for (int i = 0; i < 4; i++) {
        fake_connect(&w[i], 400);
        fake_register(&w[i], i, 4);
    }
    /* registered, not joined: nothing is assigned (each socket times out in 400 ms) */
    for (int i = 0; i < 4; i++) {
        cr_assert_neq(coord_recv_type(w[i].sock, TIDE_MSG_OFFLINE_ASSIGN, &r), 0,
                      "rank %d was given offline work before its job's first layout", i);
    }
    /* joined, but the job (dp 3) waits for a third rank: still nothing */
    fake_join(&w[3], 3);
    fake_join(&w[0], 3);
    for (int i = 0; i < 4; i += 3) {
        cr_assert_eq(coord_recv(w[i].sock, &r), 0);
        cr_assert_eq(r.type, TIDE_MSG_OK, "rank %d: %s", i, tide_msg_type_name(r.type));
        tide_msg_clear(&r);
    }
    cr_assert_neq(coord_recv_type(w[3].sock, TIDE_MSG_OFFLINE_ASSIGN, &r), 0,
                  "a rank was given offline work while its job waited for its ranks");
    fake_join(&w[1], 3);
    fake_join(&w[2], 3);
    /* the first layout takes three ranks with nothing to preempt; the fourth is spare and
       gets the work */
    int set = 5000, spare = -1;
    for (int i = 0; i < 4; i++) {
        zmq_setsockopt(w[i].sock, ZMQ_RCVTIMEO, &set, sizeof set);
        cr_assert_eq(coord_recv(w[i].sock, &r), 0);
        cr_assert(r.type == TIDE_MSG_LAYOUT || r.type == TIDE_MSG_OK, "rank %d got %s first", i,
                  tide_msg_type_name(r.type));
        if (r.type == TIDE_MSG_LAYOUT)
            cr_assert_eq(r.u.layout.layout.gen, 1);
        else
            spare = i;
        tide_msg_clear(&r);
    }
    cr_assert_geq(spare, 0);
    expect_type(w[spare].sock, TIDE_MSG_OFFLINE_ASSIGN, &r);
    cr_assert_str_eq(r.u.offline_assign.job, "eval");
    cr_assert_eq(r.u.offline_assign.attempt, 1);
    tide_msg_clear(&r);
    cr_assert_eq(count_events(admin, "preempted"), 0, "nothing had to be preempted");
    zmq_close(admin);
    for (int i = 0; i < 4; i++)
        zmq_close(w[i].sock);
}

/* The report worker f sends about attempt of job: state, exit code, log path and tail. */
static void report_attempt(fake *f, const char *job, uint32_t attempt, tide_proto_job_state_t st,
                           int code, const char *log, const char *tail)
{
    tide_msg_t m;
    tide_msg_init(&m, TIDE_MSG_OFFLINE_STATUS);
    m.u.offline_status.worker = f->id;
    snprintf(m.u.offline_status.job, sizeof m.u.offline_status.job, "%s", job);
    m.u.offline_status.attempt = attempt;
    m.u.offline_status.state = st;
    m.u.offline_status.exit_code = code;
    snprintf(m.u.offline_status.log, sizeof m.u.offline_status.log, "%s", log);
    snprintf(m.u.offline_status.tail, sizeof m.u.offline_status.tail, "%s", tail);
    cr_assert_eq(coord_send(f->sock, &m), 0);
}

/* The next offline_assign among the spare workers w[from..to): its index, *attempt, *ms. */
static int next_assign(fake *w, int from, int to, uint32_t *attempt, int timeout_ms)
{
    uint64_t deadline = tide_now_ns() + (uint64_t)timeout_ms * 1000000ull;
    while (tide_now_ns() < deadline) {
        for (int i = from; i < to; i++) {
            zmq_pollitem_t it = {w[i].sock, 0, ZMQ_POLLIN, 0};
            if (zmq_poll(&it, 1, 5) <= 0)
                continue;
            tide_msg_t r;
            cr_assert_eq(coord_recv(w[i].sock, &r), 0);
            int hit = r.type == TIDE_MSG_OFFLINE_ASSIGN;
            if (hit)
                *attempt = r.u.offline_assign.attempt;
            tide_msg_clear(&r);
            if (hit)
                return i;
        }
    }
    return -1;
}

/*
 * Requeue semantics: a preemption or the worker leaving does not use up an attempt and
 * is retried at once; a failed attempt counts, is retried after a backoff on another
 * worker than the one it failed on, and max_attempts failures end the job.
 */
Test(tided, only_failures_use_up_attempts_and_retries_back_off_elsewhere, .init = setup,
     .fini = teardown)
{
    const char *extra[] = {"--max-attempts", "2", "--retry-backoff-ms", "600", "--heartbeat-ms",
                           "10000",          NULL};
    start(extra);
    fake w[5];
    tide_msg_t m, r;
    for (int i = 0; i < 5; i++) {
        fake_connect(&w[i], 5000);
        fake_register(&w[i], i, 5);
    }
    for (int i = 0; i < 5; i++)
        fake_join(&w[i], 2); /* ranks 0, 1 train; 2, 3, 4 are spare */
    for (int i = 0; i < 5; i++) {
        expect_type(w[i].sock, i < 2 ? TIDE_MSG_LAYOUT : TIDE_MSG_OK, &r);
        tide_msg_clear(&r);
    }
    void *admin = coord_connect(ctx, proc.endpoint, NULL, NULL, NULL, 5000);
    tide_msg_init(&m, TIDE_MSG_SUBMIT);
    snprintf(m.u.submit.name, sizeof m.u.submit.name, "eval");
    m.u.submit.kind = TIDE_JOB_COMMAND;
    char *argv[2] = {"sleep", "100"};
    m.u.submit.argv = argv;
    m.u.submit.argc = 2;
    admin_call(admin, &m, &r, TIDE_MSG_OK);
    tide_msg_clear(&r);
    uint32_t att = 0;
    cr_assert_eq(next_assign(w, 2, 5, &att, 3000), 2);
    cr_assert_eq(att, 1);
    /* attempt 1 preempted: not a failure, retried at once (the same worker may take it) */
    uint64_t t0 = tide_now_ns();
    report_attempt(&w[2], "eval", 1, TIDE_JOB_PREEMPTED, -15, "/tmp/x.1.log", "");
    int k = next_assign(w, 2, 5, &att, 3000);
    cr_assert_eq(k, 2);
    cr_assert_eq(att, 2);
    cr_assert_lt((tide_now_ns() - t0) / 1000000ull, 500, "no backoff after a preemption");
    /* attempt 2: its worker leaves (bye): not a failure either */
    tide_msg_init(&m, TIDE_MSG_BYE);
    m.u.bye.worker = w[2].id;
    cr_assert_eq(coord_send(w[2].sock, &m), 0);
    t0 = tide_now_ns();
    k = next_assign(w, 3, 5, &att, 3000);
    cr_assert_eq(k, 3);
    cr_assert_eq(att, 3);
    cr_assert_lt((tide_now_ns() - t0) / 1000000ull, 500, "no backoff after a worker left");
    tide_msg_init(&m, TIDE_MSG_JOBS);
    admin_call(admin, &m, &r, TIDE_MSG_JOBS_REPLY);
    cr_assert_eq(find_job(&r, "eval")->state, TIDE_JOB_RUNNING,
                 "two interruptions used up none of its 2 attempts");
    tide_msg_clear(&r);
    /* attempt 3 fails: retried after the backoff, on worker 4 rather than 3 */
    t0 = tide_now_ns();
    report_attempt(&w[3], "eval", 3, TIDE_JOB_FAILED, 1, "/tmp/x.3.log", "boom\n");
    k = next_assign(w, 3, 5, &att, 5000);
    uint64_t ms = (tide_now_ns() - t0) / 1000000ull;
    cr_assert_eq(k, 4, "the retry went to worker index %d, the one it failed on", k);
    cr_assert_eq(att, 4);
    cr_assert_geq(ms, 550, "retried after %llu ms, before the backoff", (unsigned long long)ms);
    /* a late report of an old attempt changes nothing */
    report_attempt(&w[3], "eval", 1, TIDE_JOB_FAILED, 9, "", "");
    /* attempt 4 fails: the second failure ends the job */
    report_attempt(&w[4], "eval", 4, TIDE_JOB_FAILED, 2, "/tmp/x.4.log", "boom again\n");
    for (int tries = 0; tries < 100; tries++) {
        tide_msg_init(&m, TIDE_MSG_JOBS);
        admin_call(admin, &m, &r, TIDE_MSG_JOBS_REPLY);
        int failed = find_job(&r, "eval")->state == TIDE_JOB_FAILED;
        if (failed)
            break;
        tide_msg_clear(&r);
        tide_sleep_ms(20);
    }
    const tide_proto_job_row_t *ev = find_job(&r, "eval");
    cr_assert_eq(ev->state, TIDE_JOB_FAILED, "two failures of max 2: failed, not %s",
                 tide_proto_job_state_name(ev->state));
    cr_assert_eq(ev->attempts, 4);
    tide_msg_clear(&r);
    cr_assert_eq(count_events(admin, "offline_failed"), 1);
    /* the event says why, from the last line the attempt wrote (a loader's error, say) */
    char detail[1024];
    cr_assert(event_detail(admin, "offline_failed", detail, sizeof detail));
    cr_expect(strstr(detail, "attempt 4 on worker ") != NULL &&
                  strstr(detail, "ended failed (exit code 2): boom again; gave up") != NULL,
              "%s", detail);
    cr_assert_neq(next_assign(w, 3, 5, &att, 800), 3, "a failed job is not run again");
    zmq_close(admin);
    for (int i = 0; i < 5; i++)
        zmq_close(w[i].sock);
}

/* Runs tidectl with args against this test's tided; its stdout in out. */
static int tidectl(char *out, size_t cap, const char *const *args)
{
    return coord_tidectl(TIDECTL_PATH, proc.endpoint, args, out, cap);
}

/* tidectl logs: each attempt's output as its worker reported it. On the worker's host the
   whole file; elsewhere the tail tided keeps, and where the file is. */
Test(tided, tidectl_logs_shows_each_attempts_output, .init = setup, .fini = teardown)
{
    const char *extra[] = {"--heartbeat-ms", "10000", NULL};
    start(extra);
    char here[256] = "";
    gethostname(here, sizeof here - 1);
    fake a, b;
    tide_msg_t m, r;
    fake_connect(&a, 5000);
    fake_connect(&b, 5000);
    /* a runs on this host, b on another one; both join a job that placed its layout */
    coord_mk_register(&m, "pool-l", 0, 3, here, 0, 4000);
    cr_assert_eq(coord_call(a.sock, &m, &r), 0);
    a.id = r.u.register_ok.worker;
    coord_mk_register(&m, "pool-l", 1, 3, "far-away-host", 0, 4001);
    cr_assert_eq(coord_call(b.sock, &m, &r), 0);
    b.id = r.u.register_ok.worker;
    fake t;
    fake_connect(&t, 5000);
    coord_mk_register(&m, "pool-l", 2, 3, here, 1, 4002);
    cr_assert_eq(coord_call(t.sock, &m, &r), 0);
    t.id = r.u.register_ok.worker;
    join_first(&t);
    fake_join(&a, 1);
    fake_join(&b, 1);
    char out[65536];
    const char *sub[] = {"submit", "--offline", "--name", "ev", "--", "sh", "-c", "x", NULL};
    cr_assert_eq(tidectl(out, sizeof out, sub), 0, "%s", out);
    const char *none[] = {"logs", "ev", NULL};
    cr_assert_eq(tidectl(out, sizeof out, none), 0);
    cr_expect(strstr(out, "ev has not run yet") != NULL, "%s", out);
    /* whichever spare worker took attempt 1 reports it from this host with a real file */
    fake *f[2] = {&a, &b};
    int first = -1;
    uint32_t att = 0;
    for (int tries = 0; tries < 200 && first < 0; tries++)
        for (int i = 0; i < 2 && first < 0; i++) {
            zmq_pollitem_t it = {f[i]->sock, 0, ZMQ_POLLIN, 0};
            if (zmq_poll(&it, 1, 10) > 0 && coord_recv(f[i]->sock, &r) == 0) {
                if (r.type == TIDE_MSG_OFFLINE_ASSIGN) {
                    first = i;
                    att = r.u.offline_assign.attempt;
                }
                tide_msg_clear(&r);
            }
        }
    cr_assert_eq(first, 0, "the lowest idle worker (a) takes attempt 1");
    char path[400], secret[400];
    snprintf(path, sizeof path, "%s/ev.1.4000.log", proc.dir);
    /* a worker-role client names another file as its log: tided keeps no such path, and
       tidectl follows no symbolic link to one, so an operator's tidectl never prints it */
    snprintf(secret, sizeof secret, "%s/secret.key", proc.dir);
    FILE *lf = fopen(secret, "w");
    cr_assert_not_null(lf);
    fputs("TOP-SECRET\n", lf);
    fclose(lf);
    report_attempt(&a, "ev", att, TIDE_JOB_RUNNING, 0, secret, "");
    cr_assert_eq(coord_recv_type(a.sock, TIDE_MSG_OK, &r), 0);
    tide_msg_clear(&r);
    cr_assert_eq(tidectl(out, sizeof out, none), 0);
    cr_expect(strstr(out, "TOP-SECRET") == NULL && strstr(out, "log (none)") != NULL,
              "a path that is no attempt log is not kept: %s", out);
    cr_assert_eq(symlink(secret, path), 0);
    report_attempt(&a, "ev", att, TIDE_JOB_RUNNING, 0, path, "");
    cr_assert_eq(coord_recv_type(a.sock, TIDE_MSG_OK, &r), 0);
    tide_msg_clear(&r);
    cr_assert_eq(tidectl(out, sizeof out, none), 0);
    cr_expect(strstr(out, "TOP-SECRET") == NULL, "no symbolic link is followed: %s", out);
    cr_assert_eq(unlink(path), 0);
    lf = fopen(path, "w");
    cr_assert_not_null(lf);
    fputs("whole-file line 1\nwhole-file line 2\n", lf);
    fclose(lf);
    report_attempt(&a, "ev", att, TIDE_JOB_RUNNING, 0, path, "");
    cr_assert_eq(coord_recv_type(a.sock, TIDE_MSG_OK, &r), 0);
    tide_msg_clear(&r);
    cr_assert_eq(tidectl(out, sizeof out, none), 0);
    cr_expect(strstr(out, "attempt 1 on worker") != NULL && strstr(out, "running") != NULL, "%s",
              out);
    cr_expect(strstr(out, "whole-file line 2") != NULL, "on its host: the file itself: %s", out);
    /* it fails; attempt 2 runs on b, on another host, and ends there */
    report_attempt(&a, "ev", 1, TIDE_JOB_FAILED, 3, path, "line 2\n");
    cr_assert_eq(coord_recv_type(b.sock, TIDE_MSG_OFFLINE_ASSIGN, &r), 0);
    cr_assert_eq(r.u.offline_assign.attempt, 2);
    tide_msg_clear(&r);
    report_attempt(&b, "ev", 2, TIDE_JOB_DONE, 0, "/var/tmp/ev.2.4001.log", "the remote tail\n");
    cr_assert_eq(coord_recv_type(b.sock, TIDE_MSG_OK, &r), 0);
    tide_msg_clear(&r);
    cr_assert_eq(tidectl(out, sizeof out, none), 0);
    cr_expect(strstr(out, "attempt 2 on worker") != NULL && strstr(out, "done") != NULL, "%s", out);
    cr_expect(strstr(out, "the remote tail") != NULL, "%s", out);
    cr_expect(strstr(out, "/var/tmp/ev.2.4001.log on far-away-host") != NULL, "says where: %s",
              out);
    cr_expect(strstr(out, "whole-file") == NULL, "the latest attempt only by default: %s", out);
    const char *one[] = {"logs", "ev", "--attempt", "1", NULL};
    cr_assert_eq(tidectl(out, sizeof out, one), 0);
    cr_expect(strstr(out, "failed, exit code 3") != NULL, "%s", out);
    cr_expect(strstr(out, "whole-file line 1") != NULL, "%s", out);
    const char *all[] = {"logs", "ev", "--all", "--json", NULL};
    cr_assert_eq(tidectl(out, sizeof out, all), 0);
    cr_expect(strstr(out, "\"attempt\":1") != NULL && strstr(out, "\"attempt\":2") != NULL, "%s",
              out);
    const char *missing[] = {"logs", "ev", "--attempt", "7", NULL};
    cr_expect_eq(tidectl(out, sizeof out, missing), 1, "no attempt 7: refused");
    const char *nojob[] = {"logs", "nope", NULL};
    cr_expect_eq(tidectl(out, sizeof out, nojob), 1);
    zmq_close(a.sock);
    zmq_close(b.sock);
    zmq_close(t.sock);
}

/* An offline command's limits: tidectl's --max-procs and tided's --offline-max-memory
   default travel in the assignment; the failure the keeper blames on a limit (its log's
   last line) is what the attempt's event and tidectl logs say; a bad default stops tided. */
Test(tided, offline_limits_reach_the_worker_and_the_event, .init = setup, .fini = teardown)
{
    const char *bad[] = {"--offline-max-memory", "lots", NULL};
    int st = 0;
    cr_assert_neq(coord_start(&proc, TIDED_PATH, bad, &st), 0);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 2, "status %d", st);
    const char *extra[] = {"--heartbeat-ms", "10000", "--offline-max-memory", "1G", NULL};
    start(extra);
    char here[256] = "";
    gethostname(here, sizeof here - 1);
    fake a, t;
    tide_msg_t m, r;
    fake_connect(&t, 5000);
    fake_connect(&a,
                 20000); /* the assignment comes after a tidectl run: slow on a loaded machine */
    coord_mk_register(&m, "pool-m", 0, 2, here, 0, 4100);
    cr_assert_eq(coord_call(t.sock, &m, &r), 0);
    t.id = r.u.register_ok.worker;
    coord_mk_register(&m, "pool-m", 1, 2, here, 1, 4101);
    cr_assert_eq(coord_call(a.sock, &m, &r), 0);
    a.id = r.u.register_ok.worker;
    join_first(&t);
    fake_join(&a, 1);
    char out[65536];
    const char *plugin[] = {"submit", "--offline", "--plugin", "p", "--max-procs", "3", NULL};
    cr_assert_eq(tidectl(out, sizeof out, plugin), 2, "refused by tidectl: %s", out);
    const char *sub[] = {"submit", "--offline", "--name", "hog", "--max-procs", "20",
                         "--",     "sh",        "-c",     "x",   NULL};
    cr_assert_eq(tidectl(out, sizeof out, sub), 0, "%s", out);
    cr_assert_eq(coord_recv_type(a.sock, TIDE_MSG_OFFLINE_ASSIGN, &r), 0);
    cr_expect_eq(r.u.offline_assign.max_memory, 1ull << 30, "tided's default");
    cr_expect_eq(r.u.offline_assign.max_procs, 20u, "the submit's own");
    uint32_t att = r.u.offline_assign.attempt;
    tide_msg_clear(&r);
    const char *why = "[tide: the command failed (exit 1) under memory limit 1024 MiB (RLIMIT_AS: "
                      "an allocation beyond it fails); its own last words above say whether a "
                      "limit refused it]\n";
    report_attempt(&a, "hog", att, TIDE_JOB_FAILED, 1, "", why);
    cr_assert_eq(coord_recv_type(a.sock, TIDE_MSG_OK, &r), 0);
    tide_msg_clear(&r);
    const char *logs[] = {"logs", "hog", NULL};
    cr_assert_eq(tidectl(out, sizeof out, logs), 0);
    cr_expect(strstr(out, "memory limit 1024 MiB (RLIMIT_AS") != NULL, "%s", out);
    const char *events[] = {"events", "--json", NULL};
    cr_assert_eq(tidectl(out, sizeof out, events), 0);
    const char *ev = strstr(out, "\"kind\":\"offline_requeued\"");
    cr_assert_not_null(ev, "%s", out);
    cr_expect(strstr(out, "memory limit 1024 MiB (RLIMIT_AS") != NULL, "the event says: %s", out);
    zmq_close(a.sock);
    zmq_close(t.sock);
}

/* ---- the worker table: left, retention, pages, the register cap, liveness ---------------- */

/* One status page from `from` (limit rows, 0: tided's page), with or without the workers
   that left; the reply is the caller's. */
static void status_page(void *sock, int32_t from, uint32_t limit, int all, tide_msg_t *r)
{
    tide_msg_t m;
    tide_msg_init(&m, TIDE_MSG_STATUS);
    m.u.status.from = from;
    m.u.status.limit = limit;
    m.u.status.all = all;
    admin_call(sock, &m, r, TIDE_MSG_STATUS_REPLY);
}

/* The state status lists for worker id (following every page), or -1 when unlisted. */
static int listed_state(void *sock, int32_t id, int all)
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

static void heartbeat(fake *f)
{
    tide_msg_t m;
    coord_mk_heartbeat(&m, f->id, 5, 1);
    cr_assert_eq(coord_send(f->sock, &m), 0);
}

/* A worker that said bye is "left": hidden from status (unless all), not counted as
   failed, and forgotten after --retention-ms together with workers that failed, unless a
   job still refers to them (a member fenced from a running job stays); a forgotten id is
   never handed out again, across a restart too. */
Test(tided, left_workers_are_hidden_and_forgotten_after_retention, .init = setup, .fini = teardown)
{
    int port = coord_free_port();
    cr_assert_gt(port, 0, "no free loopback port");
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
    const char *extra[] = {"--heartbeat-ms",
                           "100",
                           "--miss-limit",
                           "3",
                           "--retention-ms",
                           "800",
                           "--metrics",
                           addr,
                           NULL};
    start(extra);
    fake w[4];
    tide_msg_t m, r;
    for (int i = 0; i < 4; i++) {
        fake_connect(&w[i], 3000);
        fake_register(&w[i], i, 4);
    }
    fake_join(&w[0], 2);
    fake_join(&w[1], 2);
    for (int i = 0; i < 2; i++) {
        expect_type(w[i].sock, TIDE_MSG_LAYOUT, &r);
        tide_msg_clear(&r);
    }
    void *admin = coord_connect(ctx, proc.endpoint, NULL, NULL, NULL, 3000);
    /* w3 leaves: left, hidden, not failed */
    tide_msg_init(&m, TIDE_MSG_BYE);
    m.u.bye.worker = w[3].id;
    admin_call(w[3].sock, &m, &r, TIDE_MSG_OK);
    tide_msg_clear(&r);
    cr_assert_eq(listed_state(admin, w[3].id, 0), -1, "a worker that left is hidden");
    cr_assert_eq(listed_state(admin, w[3].id, 1), TIDE_WORKER_LEFT, "--all lists it as left");
    static char text[1 << 16];
    scrape(port, text, sizeof text);
    cr_assert_eq(sample(text, "tide_gpus{state=\"left\"}"), 1);
    cr_assert_eq(sample(text, "tide_gpus{state=\"failed\"}"), 0, "leaving is not failing");
    coord_mk_heartbeat(&m, w[3].id, 0, 0);
    admin_call(w[3].sock, &m, &r, TIDE_MSG_ERROR);
    cr_assert(strstr(r.u.error.message, "said bye") != NULL, "%s", r.u.error.message);
    tide_msg_clear(&r);
    /* w2 (idle) and w1 (a member) go silent and fail; w0 survives and takes the recovery */
    int zero = 20;
    zmq_setsockopt(w[0].sock, ZMQ_RCVTIMEO, &zero, sizeof zero);
    int recovered = 0;
    uint64_t t0 = tide_now_ns();
    while (!recovered && tide_now_ns() - t0 < 5000000000ull) {
        heartbeat(&w[0]);
        if (coord_recv(w[0].sock, &r) != 0)
            continue;
        if (r.type == TIDE_MSG_PREPARE && r.u.prepare.gen == 2) {
            tide_msg_init(&m, TIDE_MSG_PREPARE_ACK);
            m.u.prepare_ack.worker = w[0].id;
            snprintf(m.u.prepare_ack.job, sizeof m.u.prepare_ack.job, "train");
            m.u.prepare_ack.gen = 2;
            m.u.prepare_ack.step = 5;
            cr_assert_eq(coord_send(w[0].sock, &m), 0);
        }
        if (r.type == TIDE_MSG_COMMIT && r.u.commit.gen == 2) {
            tide_msg_init(&m, TIDE_MSG_DONE);
            m.u.done.worker = w[0].id;
            snprintf(m.u.done.job, sizeof m.u.done.job, "train");
            m.u.done.gen = 2;
            cr_assert_eq(coord_send(w[0].sock, &m), 0);
            recovered = 1;
        }
        tide_msg_clear(&r);
    }
    cr_assert(recovered, "no recovery of train without w1");
    /* past the retention: w3 (left) and w2 (failed, idle) are forgotten; w1 stays, as the
       job it was fenced from still runs */
    int gone = 0;
    t0 = tide_now_ns();
    while (!gone && tide_now_ns() - t0 < 6000000000ull) {
        heartbeat(&w[0]);
        tide_sleep_ms(50);
        gone = listed_state(admin, w[3].id, 1) == -1 && listed_state(admin, w[2].id, 1) == -1;
    }
    cr_assert(gone, "w2 and w3 not forgotten %d ms after the retention of 800 ms",
              (int)((tide_now_ns() - t0) / 1000000));
    cr_assert_eq(listed_state(admin, w[1].id, 1), TIDE_WORKER_FAILED,
                 "a member fenced from a running job is kept while the job runs");
    cr_assert_eq(listed_state(admin, w[0].id, 0), TIDE_WORKER_ONLINE);
    cr_assert_geq(count_events(admin, "workers_forgotten"), 1);
    coord_mk_heartbeat(&m, w[2].id, 0, 0);
    admin_call(w[2].sock, &m, &r, TIDE_MSG_ERROR);
    cr_assert_eq(r.u.error.code, TIDE_ERR_NOT_FOUND, "%s", r.u.error.message);
    tide_msg_clear(&r);
    zmq_close(admin);
    /* the state file forgot them too; a new worker never gets a forgotten id */
    coord_stop(&proc, SIGKILL);
    start(extra);
    admin = coord_connect(ctx, proc.endpoint, NULL, NULL, NULL, 3000);
    cr_assert_eq(listed_state(admin, w[2].id, 1), -1);
    cr_assert_eq(listed_state(admin, w[3].id, 1), -1);
    cr_assert_eq(listed_state(admin, w[1].id, 1), TIDE_WORKER_FAILED);
    fake nw;
    fake_connect(&nw, 3000);
    coord_mk_register(&m, "pool-b", 0, 1, "host9", 0, 9000);
    admin_call(nw.sock, &m, &r, TIDE_MSG_REGISTER_OK);
    int32_t top = w[0].id;
    for (int i = 1; i < 4; i++)
        top = w[i].id > top ? w[i].id : top;
    cr_assert_gt(r.u.register_ok.worker, top, "id %d reused (ids handed out up to %d)",
                 r.u.register_ok.worker, top);
    tide_msg_clear(&r);
    zmq_close(nw.sock);
    zmq_close(admin);
    for (int i = 0; i < 4; i++)
        zmq_close(w[i].sock);
}

/* A listing longer than one reply comes in pages (--status-page rows each), each naming
   where the next starts and the total: nothing is cut, and tidectl shows every row. */
Test(tided, status_comes_in_pages_and_is_never_cut, .init = setup, .fini = teardown)
{
    const char *extra[] = {"--status-page", "3", NULL};
    start(extra);
    enum { N = 8 };
    fake w[N];
    tide_msg_t m, r;
    for (int i = 0; i < N; i++) {
        fake_connect(&w[i], 3000);
        fake_register(&w[i], i, N);
    }
    tide_msg_init(&m, TIDE_MSG_BYE);
    m.u.bye.worker = w[5].id;
    admin_call(w[5].sock, &m, &r, TIDE_MSG_OK);
    tide_msg_clear(&r);
    void *admin = coord_connect(ctx, proc.endpoint, NULL, NULL, NULL, 3000);
    for (int all = 0; all < 2; all++) {
        int seen[N] = {0}, pages = 0, rows = 0;
        int32_t from = 0;
        do {
            status_page(admin, from, 0, all, &r);
            const tide_proto_status_reply_t *p = &r.u.status_reply;
            cr_assert_eq(p->total, all ? N : N - 1, "total %u", p->total);
            cr_assert_leq(p->n_rows, 3u, "a page holds at most --status-page rows");
            for (uint32_t i = 0; i < p->n_rows; i++)
                for (int k = 0; k < N; k++)
                    seen[k] += p->rows[i].worker == w[k].id;
            rows += (int)p->n_rows;
            pages++;
            from = p->next;
            tide_msg_clear(&r);
        } while (from >= 0 && pages < 10);
        cr_assert_eq(rows, all ? N : N - 1);
        cr_assert_eq(pages, all ? 3 : 3);
        for (int k = 0; k < N; k++)
            cr_assert_eq(seen[k], (k == 5 && !all) ? 0 : 1, "worker %d seen %d times", w[k].id,
                         seen[k]);
    }
    /* a smaller limit of the reader's own */
    status_page(admin, 0, 2, 0, &r);
    cr_assert_eq(r.u.status_reply.n_rows, 2);
    cr_assert_eq(r.u.status_reply.next, w[2].id);
    tide_msg_clear(&r);
    /* tidectl follows the pages */
    static char out[1 << 16];
    const char *json[] = {"--json", "status", NULL};
    cr_assert_eq(tidectl(out, sizeof out, json), 0, "%s", out);
    for (int k = 0; k < N; k++) {
        char want[32];
        snprintf(want, sizeof want, "\"worker\":%d,", w[k].id);
        cr_assert_eq(strstr(out, want) != NULL, k != 5, "worker %d in tidectl status: %s", w[k].id,
                     out);
    }
    const char *all[] = {"status", "--all", NULL};
    cr_assert_eq(tidectl(out, sizeof out, all), 0, "%s", out);
    cr_assert(strstr(out, "8 GPUs: 0 online, 0 offline work, 7 idle, 0 draining, 0 failed, 1 left"),
              "%s", out);
    zmq_close(admin);
    for (int i = 0; i < N; i++)
        zmq_close(w[i].sock);
}

/* One client may hold --max-client-workers live workers, and one pool may declare as many
   ranks; past that registration is refused with the reason. */
Test(tided, a_client_registers_a_bounded_number_of_workers, .init = setup, .fini = teardown)
{
    const char *extra[] = {"--max-client-workers", "3", NULL};
    start(extra);
    void *greedy = coord_connect(ctx, proc.endpoint, NULL, NULL, NULL, 3000);
    tide_msg_t m, r;
    int32_t ids[3];
    for (int i = 0; i < 3; i++) {
        coord_mk_register(&m, "p", i, 3, "host0", i, 100 + i);
        admin_call(greedy, &m, &r, TIDE_MSG_REGISTER_OK);
        ids[i] = r.u.register_ok.worker;
        tide_msg_clear(&r);
    }
    coord_mk_register(&m, "q", 0, 3, "host0", 3, 200);
    admin_call(greedy, &m, &r, TIDE_MSG_ERROR);
    cr_assert_eq(r.u.error.code, TIDE_ERR_RANGE);
    cr_assert(strstr(r.u.error.message, "--max-client-workers") != NULL, "%s", r.u.error.message);
    tide_msg_clear(&r);
    /* the same worker registering again is no new one */
    coord_mk_register(&m, "p", 1, 3, "host0", 1, 101);
    admin_call(greedy, &m, &r, TIDE_MSG_REGISTER_OK);
    cr_assert_eq(r.u.register_ok.worker, ids[1]);
    tide_msg_clear(&r);
    /* a pool may not declare more ranks than that */
    void *other = coord_connect(ctx, proc.endpoint, NULL, NULL, NULL, 3000);
    coord_mk_register(&m, "big", 0, 4, "host1", 0, 300);
    admin_call(other, &m, &r, TIDE_MSG_ERROR);
    cr_assert_eq(r.u.error.code, TIDE_ERR_RANGE);
    cr_assert(strstr(r.u.error.message, "declares 4 ranks") != NULL, "%s", r.u.error.message);
    tide_msg_clear(&r);
    /* another client is not held to the first one's count */
    coord_mk_register(&m, "q", 0, 3, "host1", 0, 301);
    admin_call(other, &m, &r, TIDE_MSG_REGISTER_OK);
    tide_msg_clear(&r);
    /* a worker that left frees its place */
    tide_msg_init(&m, TIDE_MSG_BYE);
    m.u.bye.worker = ids[0];
    admin_call(greedy, &m, &r, TIDE_MSG_OK);
    tide_msg_clear(&r);
    coord_mk_register(&m, "q", 1, 3, "host0", 3, 201);
    admin_call(greedy, &m, &r, TIDE_MSG_REGISTER_OK);
    tide_msg_clear(&r);
    tide_msg_init(&m, TIDE_MSG_STATUS);
    admin_call(other, &m, &r, TIDE_MSG_STATUS_REPLY);
    cr_assert_eq(r.u.status_reply.total, 4, "3 live workers of greedy's and 1 of the other's");
    tide_msg_clear(&r);
    zmq_close(greedy);
    zmq_close(other);
}

static int liveness(fake *f, const char *job, const int32_t *ranks, uint32_t n, int32_t *alive)
{
    tide_msg_t m, r;
    tide_msg_init(&m, TIDE_MSG_LIVENESS);
    m.u.liveness.worker = f->id;
    snprintf(m.u.liveness.job, sizeof m.u.liveness.job, "%s", job);
    m.u.liveness.ranks = (int32_t *)ranks;
    m.u.liveness.n_ranks = n;
    cr_assert_eq(coord_send(f->sock, &m), 0);
    for (;;) {
        cr_assert_eq(coord_recv(f->sock, &r), 0, "no liveness reply");
        if (r.type == TIDE_MSG_LIVENESS_REPLY || r.type == TIDE_MSG_ERROR)
            break;
        tide_msg_clear(&r);
    }
    int code = 0;
    if (r.type == TIDE_MSG_ERROR) {
        code = r.u.error.code;
    } else {
        cr_assert_eq(r.u.liveness_reply.n_ranks, n);
        cr_assert_eq(memcmp(r.u.liveness_reply.ranks, ranks, n * sizeof *ranks), 0);
        memcpy(alive, r.u.liveness_reply.alive, n * sizeof *alive);
    }
    tide_msg_clear(&r);
    return code;
}

/* What a switch decides about old members comes from an exact question about exactly
   those job ranks, not from a status listing: with one row per status page, liveness still
   answers for every rank asked. */
Test(tided, liveness_answers_exactly_the_ranks_asked, .init = setup, .fini = teardown)
{
    const char *extra[] = {
        "--heartbeat-ms", "100", "--miss-limit", "3", "--status-page", "1", NULL};
    start(extra);
    fake w[3];
    tide_msg_t r;
    for (int i = 0; i < 3; i++) {
        fake_connect(&w[i], 3000);
        fake_register(&w[i], i, 3);
    }
    fake_join(&w[0], 2);
    fake_join(&w[1], 2);
    for (int i = 0; i < 2; i++) {
        expect_type(w[i].sock, TIDE_MSG_LAYOUT, &r);
        tide_msg_clear(&r);
    }
    const int32_t ranks[] = {0, 1, 2, 7};
    int32_t alive[4];
    cr_assert_eq(liveness(&w[0], "train", ranks, 4, alive), 0);
    cr_assert(alive[0] == 1 && alive[1] == 1, "the members are alive");
    cr_assert(alive[2] == 0, "rank 2 holds no part of the job");
    cr_assert(alive[3] == 0, "no worker holds job rank 7");
    cr_assert_eq(liveness(&w[0], "nope", ranks, 4, alive), TIDE_ERR_NOT_FOUND);
    /* rank 1 goes silent: while the recovery is pending, it is reported gone */
    int ms = 20;
    zmq_setsockopt(w[0].sock, ZMQ_RCVTIMEO, &ms, sizeof ms);
    int pending = 0;
    uint64_t t0 = tide_now_ns();
    while (!pending && tide_now_ns() - t0 < 5000000000ull) {
        heartbeat(&w[0]);
        heartbeat(&w[2]);
        if (coord_recv(w[0].sock, &r) == 0) {
            pending = r.type == TIDE_MSG_PREPARE;
            tide_msg_clear(&r);
        }
    }
    cr_assert(pending, "no recovery after rank 1 went silent");
    cr_assert_eq(liveness(&w[0], "train", ranks, 2, alive), 0);
    cr_assert(alive[0] == 1 && alive[1] == 0, "rank 0 alive, rank 1 gone: got %d %d", alive[0],
              alive[1]);
    /* the same answer whatever page status shows */
    void *admin = coord_connect(ctx, proc.endpoint, NULL, NULL, NULL, 3000);
    status_page(admin, 0, 0, 0, &r);
    cr_assert_eq(r.u.status_reply.n_rows, 1);
    cr_assert_eq(r.u.status_reply.total, 3);
    tide_msg_clear(&r);
    zmq_close(admin);
    for (int i = 0; i < 3; i++)
        zmq_close(w[i].sock);
}

/* Joins job `job` of layers 4 as f with (dp, tp 1, pp 1), micro-batches and fit rules. */
static void fake_join_fit(fake *f, const char *job, int dp, int micro, tide_proto_fit_t *fit,
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

static int is_gen2_idle3(const tide_proto_job_row_t *r)
{
    return r->gen == 2 && r->state == TIDE_JOB_RUNNING;
}

#define DP3_REASON "dp 3 does not divide 4 (the global batch 16 / 4 micro-batches)"

/*
 * A job that declared it can run only dp dividing 4 (a global batch of 16 in 4 micro-
 * batches): a resize to dp 3, dry or not, through the protocol and through tidectl, is
 * refused with that reason and changes nothing; the rule is in the state file, so after
 * kill -9 and a restart it still holds; a join whose own first layout breaks its rules is
 * refused; and when one of its 4 workers fails, the recovery takes dp 2 (not the dp 3 the
 * 3 survivors would hold, which the program cannot run), leaves the third survivor idle
 * and says so in its events.
 */
Test(tided, layouts_the_program_cannot_run_are_refused_and_never_recovered_to, .init = setup,
     .fini = teardown)
{
    const char *extra[] = {"--heartbeat-ms", "10000", NULL};
    start(extra);
    tide_proto_fit_t fit[2] = {{0, 4, "the global batch 16 / 4 micro-batches"},
                               {1, 64, "the hidden size"}};
    fake w[4];
    tide_msg_t m, r;
    for (int i = 0; i < 4; i++) {
        fake_connect(&w[i], 5000);
        fake_register(&w[i], i, 4);
    }
    for (int i = 0; i < 4; i++)
        fake_join_fit(&w[i], "train", 4, 4, fit, 2);
    for (int i = 0; i < 4; i++) {
        expect_type(w[i].sock, TIDE_MSG_LAYOUT, &r);
        cr_assert_eq(r.u.layout.layout.dp, 4);
        tide_msg_clear(&r);
    }
    void *admin = coord_connect(ctx, proc.endpoint, NULL, NULL, NULL, 5000);
    char detail[1024];
    cr_assert(event_detail(admin, "job_created", detail, sizeof detail));
    cr_expect(strstr(detail, "fit: dp divides 4 (the global batch 16 / 4 micro-batches); tp "
                             "divides 64 (the hidden size)") != NULL,
              "%s", detail);

    /* a job whose own first layout breaks its rules does not start */
    fake o;
    fake_connect(&o, 5000);
    coord_mk_register(&m, "pool-b", 0, 3, "host9", 0, 4242);
    cr_assert_eq(coord_call(o.sock, &m, &r), 0);
    o.id = r.u.register_ok.worker;
    tide_msg_clear(&r);
    fake_join_fit(&o, "other", 3, 4, fit, 2);
    expect_type(o.sock, TIDE_MSG_ERROR, &r);
    cr_expect(strstr(r.u.error.message,
                     "job other cannot start: its first layout (dp 3, tp 1, "
                     "pp 1) is not one its program can run: " DP3_REASON) != NULL,
              "%s", r.u.error.message);
    tide_msg_clear(&r);

    for (int dry = 1; dry >= 0; dry--) {
        mk_resize(&m, 3, dry);
        admin_call(admin, &m, &r, TIDE_MSG_ERROR);
        cr_assert_eq(r.u.error.code, TIDE_ERR_INVALID);
        cr_expect(strstr(r.u.error.message,
                         "cannot resize train: (dp 3, tp 1, pp 1; 4 micro-batches) is not "
                         "a layout the job's program can run: " DP3_REASON) != NULL,
                  "%s", r.u.error.message);
        tide_msg_clear(&r);
    }
    char out[8192];
    const char *dp3[] = {"resize", "train", "--dp", "3", NULL};
    const char *dp3_dry[] = {"resize", "train", "--dp", "3", "--dry-run", NULL};
    cr_assert_eq(coord_tidectl_io(TIDECTL_PATH, proc.endpoint, dp3, out, sizeof out, 1), 1,
                 "tidectl resize --dp 3 must exit 1: %s", out);
    cr_expect(strstr(out, DP3_REASON) != NULL, "%s", out);
    cr_assert_eq(coord_tidectl_io(TIDECTL_PATH, proc.endpoint, dp3_dry, out, sizeof out, 1), 1,
                 "%s", out);
    cr_expect(strstr(out, DP3_REASON) != NULL, "%s", out);
    const char *tp3[] = {"resize", "train", "--dp", "1", "--tp", "3", NULL};
    cr_assert_eq(coord_tidectl_io(TIDECTL_PATH, proc.endpoint, tp3, out, sizeof out, 1), 1);
    cr_expect(strstr(out, "tp 3 does not divide 64 (the hidden size)") != NULL, "%s", out);
    /* nothing changed */
    tide_msg_init(&m, TIDE_MSG_JOBS);
    admin_call(admin, &m, &r, TIDE_MSG_JOBS_REPLY);
    const tide_proto_job_row_t *row = find_job(&r, "train");
    cr_assert(row->gen == 1 && row->dp == 4 && row->state == TIDE_JOB_RUNNING, "gen %llu dp %d",
              (unsigned long long)row->gen, row->dp);
    tide_msg_clear(&r);
    cr_assert_eq(count_events(admin, "resize_started"), 0);
    /* what the rules allow still goes (a dry run: changes nothing) */
    mk_resize(&m, 2, 1);
    admin_call(admin, &m, &r, TIDE_MSG_RESIZE_REPLY);
    cr_assert_eq(r.u.resize_reply.layout.dp, 2);
    tide_msg_clear(&r);

    /* kill -9 and restart: the rules come back from the state file */
    coord_stop(&proc, SIGKILL);
    for (int i = 0; i < 4; i++)
        zmq_close(w[i].sock);
    zmq_close(o.sock);
    zmq_close(admin);
    start(extra);
    for (int i = 0; i < 4; i++) {
        fake_connect(&w[i], 5000);
        fake_register(&w[i], i, 4);
    }
    admin = coord_connect(ctx, proc.endpoint, NULL, NULL, NULL, 5000);
    mk_resize(&m, 3, 1);
    admin_call(admin, &m, &r, TIDE_MSG_ERROR);
    cr_expect(strstr(r.u.error.message, DP3_REASON) != NULL, "after a restart: %s",
              r.u.error.message);
    tide_msg_clear(&r);
    cr_assert_eq(coord_tidectl_io(TIDECTL_PATH, proc.endpoint, dp3, out, sizeof out, 1), 1, "%s",
                 out);
    cr_expect(strstr(out, DP3_REASON) != NULL, "%s", out);

    /* worker 3 fails: 3 survivors, dp 3 is out: dp 2 and one survivor left idle */
    tide_msg_init(&m, TIDE_MSG_FAILURE);
    m.u.failure.worker = w[3].id;
    snprintf(m.u.failure.job, sizeof m.u.failure.job, "train");
    m.u.failure.gen = 1;
    m.u.failure.code = TIDE_ERR_BACKEND;
    snprintf(m.u.failure.reason, sizeof m.u.failure.reason, "GPU fell off the bus");
    cr_assert_eq(coord_call(w[3].sock, &m, &r), 0);
    tide_msg_clear(&r);
    int in_layout = 0;
    for (int i = 0; i < 3; i++) {
        expect_type(w[i].sock, TIDE_MSG_LAYOUT, &r);
        cr_assert_eq(r.u.layout.layout.gen, 2);
        cr_assert_eq(r.u.layout.layout.dp, 2, "the recovery holds dp %d", r.u.layout.layout.dp);
        for (int k = 0; k < 2; k++)
            in_layout += r.u.layout.layout.worker[k] == i;
        tide_msg_clear(&r);
        expect_type(w[i].sock, TIDE_MSG_PREPARE, &r);
        tide_msg_clear(&r);
        tide_msg_init(&m, TIDE_MSG_PREPARE_ACK);
        m.u.prepare_ack.worker = w[i].id;
        snprintf(m.u.prepare_ack.job, sizeof m.u.prepare_ack.job, "train");
        m.u.prepare_ack.gen = 2;
        m.u.prepare_ack.step = 7;
        cr_assert_eq(coord_send(w[i].sock, &m), 0);
    }
    cr_assert_eq(in_layout, 2, "two of the three survivors hold the recovery layout");
    for (int i = 0; i < 3; i++)
        commit_done(&w[i], 2, 0);
    tide_proto_job_row_t jr = wait_job(admin, is_gen2_idle3);
    cr_assert(jr.gen == 2 && jr.dp == 2 && jr.state == TIDE_JOB_RUNNING, "gen %llu dp %d",
              (unsigned long long)jr.gen, jr.dp);
    cr_assert(event_detail(admin, "recovery_started", detail, sizeof detail));
    cr_expect(strstr(detail, "dp 2 instead of 4") != NULL &&
                  strstr(detail, "the job's program cannot run dp 3: " DP3_REASON) != NULL &&
                  strstr(detail, "1 worker left idle for offline work") != NULL,
              "%s", detail);
    cr_assert(event_detail(admin, "recovered", detail, sizeof detail));
    cr_expect(strstr(detail, "dp 2 instead of 4") != NULL, "%s", detail);
    /* the survivor left out is idle, free for offline work */
    tide_msg_init(&m, TIDE_MSG_STATUS);
    admin_call(admin, &m, &r, TIDE_MSG_STATUS_REPLY);
    int idle = 0;
    for (uint32_t i = 0; i < r.u.status_reply.n_rows; i++)
        idle += r.u.status_reply.rows[i].state == TIDE_WORKER_IDLE &&
                r.u.status_reply.rows[i].worker != o.id;
    cr_expect_eq(idle, 1, "one survivor idle");
    tide_msg_clear(&r);
    for (int i = 0; i < 4; i++)
        zmq_close(w[i].sock);
    zmq_close(admin);
}

static int is_gen3_running(const tide_proto_job_row_t *r)
{
    return r->gen == 3 && r->state == TIDE_JOB_RUNNING;
}

/* Rank `rank` of pool `pool` (size ranks) on host registers as f. */
static void fake_register_in(fake *f, const char *pool, int rank, int size, const char *host)
{
    tide_msg_t m, r;
    f->rank = rank;
    coord_mk_register(&m, pool, rank, size, host, rank, 2000 + rank);
    cr_assert_eq(coord_call(f->sock, &m, &r), 0, "no register_ok for %s rank %d", pool, rank);
    cr_assert_eq(r.type, TIDE_MSG_REGISTER_OK, "got %s", tide_msg_type_name(r.type));
    f->id = r.u.register_ok.worker;
}

/* Every fake gets generation gen's layout (checked by the caller through check) and
   prepare, acks steps[i], then gets the commit and reports done. */
static void switch_all(fake *w, int n, uint64_t gen, const uint64_t *steps,
                       void (*check)(const tide_proto_layout_msg_t *, int))
{
    tide_msg_t r;
    for (int i = 0; i < n; i++) {
        expect_type(w[i].sock, TIDE_MSG_LAYOUT, &r);
        cr_assert_eq(r.u.layout.layout.gen, gen);
        check(&r.u.layout, i);
        tide_msg_clear(&r);
        ack_prepare(&w[i], gen, steps[i]);
    }
    for (int i = 0; i < n; i++)
        commit_done(&w[i], gen, 0);
}

static void check_join(const tide_proto_layout_msg_t *l, int i)
{
    cr_assert_eq(l->n_join_old, 2u, "fake %d", i);
    cr_assert_eq(l->n_join_new, 2u, "fake %d", i);
    cr_assert_eq(l->n_leave, 0u, "a join releases nothing");
}

static void check_release(const tide_proto_layout_msg_t *l, int i)
{
    /* dp 2 keeps the first pool's roles: the joined pool (job ranks 2, 3) leaves */
    cr_assert_eq(l->layout.dp, 2);
    cr_assert(l->layout.worker[0] < 2 && l->layout.worker[1] < 2, "fake %d: layout on %d, %d", i,
              l->layout.worker[0], l->layout.worker[1]);
    cr_assert_eq(l->n_join_new, 0u);
    cr_assert_eq(l->n_stay, 2u, "fake %d", i);
    cr_assert_eq(l->n_leave, 2u, "fake %d", i);
    cr_assert(l->stay[0] == 0 && l->stay[1] == 1 && l->leave[0] == 2 && l->leave[1] == 3,
              "fake %d: stay %d,%d leave %d,%d", i, l->stay[0], l->stay[1], l->leave[0],
              l->leave[1]);
}

Test(tided, a_joined_pool_left_out_of_a_resize_is_released, .init = setup, .fini = teardown)
{
    start(NULL);
    fake w[4]; /* 0, 1: the launching pool; 2, 3: a pool launched later */
    tide_msg_t m, r;
    for (int i = 0; i < 4; i++) {
        fake_connect(&w[i], 5000);
        fake_register_in(&w[i], i < 2 ? "pool-a" : "pool-b", i % 2, 2, i < 2 ? "host0" : "host1");
    }
    for (int i = 0; i < 2; i++)
        fake_join(&w[i], 2);
    for (int i = 0; i < 2; i++) {
        expect_type(w[i].sock, TIDE_MSG_LAYOUT, &r);
        tide_msg_clear(&r);
    }
    /* the later pool joins the running job: idle, job ranks 2 and 3 */
    for (int i = 2; i < 4; i++) {
        fake_join(&w[i], 2);
        expect_type(w[i].sock, TIDE_MSG_LAYOUT, &r);
        cr_assert_eq(r.u.layout.base, 2);
        tide_msg_clear(&r);
    }
    void *admin = coord_connect(ctx, proc.endpoint, NULL, NULL, NULL, 5000);
    /* the grow connects it */
    mk_resize(&m, 4, 0);
    admin_call(admin, &m, &r, TIDE_MSG_RESIZE_REPLY);
    tide_msg_clear(&r);
    const uint64_t at10[4] = {10, 10, 0, 0}, at20[4] = {20, 20, 20, 20};
    switch_all(w, 4, 2, at10, check_join);
    wait_job(admin, is_gen2_running);
    cr_assert_eq(count_events(admin, "pool_connected"), 1);
    /* the shrink holds no rank of it: it leaves, both sides told who stays and who goes */
    mk_resize(&m, 2, 0);
    admin_call(admin, &m, &r, TIDE_MSG_RESIZE_REPLY);
    tide_msg_clear(&r);
    switch_all(w, 4, 3, at20, check_release);
    tide_proto_job_row_t row = wait_job(admin, is_gen3_running);
    cr_assert_eq(row.gen, 3);
    cr_assert_eq(row.dp, 2);
    /* once committed, the released ranks (only they) hear it, fenced by the generation */
    for (int i = 2; i < 4; i++) {
        expect_type(w[i].sock, TIDE_MSG_RELEASE, &r);
        cr_assert_str_eq(r.u.release.job, "train");
        cr_assert_eq(r.u.release.gen, 3);
        tide_msg_clear(&r);
    }
    cr_assert_eq(count_events(admin, "release_started"), 1);
    cr_assert_eq(count_events(admin, "pool_left"), 1);
    /* its ranks are finishing: no offline work goes to them */
    tide_msg_init(&m, TIDE_MSG_SUBMIT);
    snprintf(m.u.submit.name, sizeof m.u.submit.name, "eval");
    m.u.submit.kind = TIDE_JOB_COMMAND;
    char *argv[2] = {"sleep", "100"};
    m.u.submit.argv = argv;
    m.u.submit.argc = 2;
    m.u.submit.priority = 3;
    admin_call(admin, &m, &r, TIDE_MSG_OK);
    tide_msg_clear(&r);
    tide_sleep_ms(300);
    tide_msg_init(&m, TIDE_MSG_JOBS);
    admin_call(admin, &m, &r, TIDE_MSG_JOBS_REPLY);
    const tide_proto_job_row_t *ev = find_job(&r, "eval");
    cr_assert_not_null(ev);
    cr_assert_eq(ev->state, TIDE_JOB_QUEUED, "offline work went to a released rank (state %d)",
                 ev->state);
    tide_msg_clear(&r);
    /* a pool that left is never placed again: dp 4 has only the first pool's 2 workers */
    mk_resize(&m, 4, 0);
    admin_call(admin, &m, &r, TIDE_MSG_ERROR);
    cr_assert_eq(r.u.error.code, TIDE_ERR_NO_DEVICE, "%s", r.u.error.message);
    tide_msg_clear(&r);
    /* the release survives a restart of tided: a released rank registering again hears it */
    coord_stop(&proc, SIGKILL);
    for (int i = 0; i < 4; i++)
        zmq_close(w[i].sock);
    zmq_close(admin);
    start(NULL);
    fake_connect(&w[2], 5000);
    fake_register_in(&w[2], "pool-b", 0, 2, "host1");
    expect_type(w[2].sock, TIDE_MSG_RELEASE, &r);
    cr_assert_eq(r.u.release.gen, 3);
    tide_msg_clear(&r);
    /* the job runs on: a rank of the first pool gets no release */
    fake_connect(&w[0], 5000);
    fake_register_in(&w[0], "pool-a", 0, 2, "host0");
    admin = coord_connect(ctx, proc.endpoint, NULL, NULL, NULL, 5000);
    row = wait_job(admin, is_gen3_running);
    cr_assert_eq(row.state, TIDE_JOB_RUNNING);
    cr_assert_neq(coord_recv_type(w[0].sock, TIDE_MSG_RELEASE, &r), 0,
                  "a rank of a pool that stays was released");
    zmq_close(w[0].sock);
    zmq_close(w[2].sock);
    zmq_close(admin);
}

Test(tided, only_the_launch_that_starts_a_job_must_hold_its_first_layout, .init = setup,
     .fini = teardown)
{
    start(NULL);
    fake w[3];
    tide_msg_t r;
    fake_connect(&w[0], 5000);
    fake_register_in(&w[0], "solo", 0, 1, "host0");
    /* one rank cannot start a job of dp 2: refused with the sizes, not left waiting */
    fake_join(&w[0], 2);
    expect_type(w[0].sock, TIDE_MSG_ERROR, &r);
    cr_assert_eq(r.u.error.code, TIDE_ERR_INVALID);
    cr_assert(strstr(r.u.error.message, "= 2 workers; pool solo has 1 ranks") != NULL, "%s",
              r.u.error.message);
    tide_msg_clear(&r);
    /* a job started by a launch of 2; a launch of 1 joins it later, idle, asking the same */
    for (int i = 1; i < 3; i++) {
        fake_connect(&w[i], 5000);
        fake_register_in(&w[i], "pool-a", i - 1, 2, "host1");
        fake_join(&w[i], 2);
    }
    for (int i = 1; i < 3; i++) {
        expect_type(w[i].sock, TIDE_MSG_LAYOUT, &r);
        tide_msg_clear(&r);
    }
    fake_join(&w[0], 2);
    expect_type(w[0].sock, TIDE_MSG_LAYOUT, &r);
    cr_assert_eq(r.u.layout.base, 2, "the late launch is job rank 2");
    cr_assert_eq(r.u.layout.world, 3);
    tide_msg_clear(&r);
    for (int i = 0; i < 3; i++)
        zmq_close(w[i].sock);
}

/* ---- host heartbeats, one job's status, first layouts that cannot fit --------------------- */

/* 1 when no message of type t arrives on sock within ms (others are dropped). */
static int no_message(void *sock, tide_msg_type_t t, int ms)
{
    uint64_t until = tide_now_ns() + (uint64_t)ms * 1000000ull;
    for (uint64_t now = tide_now_ns(); now < until; now = tide_now_ns()) {
        zmq_pollitem_t it = {sock, 0, ZMQ_POLLIN, 0};
        if (zmq_poll(&it, 1, (long)((until - now) / 1000000ull) + 1) <= 0)
            continue;
        tide_msg_t r;
        if (coord_recv(sock, &r) != 0)
            continue;
        int hit = r.type == t;
        tide_msg_clear(&r);
        if (hit)
            return 0;
    }
    return 1;
}

/* A host heartbeat from f (the leader) carrying the heartbeats of the workers in ids. */
static void host_heartbeat(fake *f, const int32_t *ids, int n)
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

/* Ranks of a host heartbeat through one leader: each listed rank counts as a heartbeat
   (tide_heartbeats_total) of one message (tide_heartbeat_messages_total) and stays alive
   on those alone; a rank left out fails by timeout; a failed rank listed again is told to
   register on its own socket, not the leader's; and a listed rank keeps its own route
   (tided's offline assignment reaches it, not the leader). */
Test(tided, host_heartbeats_count_each_rank_and_keep_each_route, .init = setup, .fini = teardown)
{
    int port = coord_free_port();
    cr_assert_gt(port, 0, "no free loopback port");
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
    const char *extra[] = {"--heartbeat-ms",
                           "100",
                           "--miss-limit",
                           "5",
                           "--metrics",
                           addr,
                           "--join-grace-ms",
                           "0",
                           NULL};
    start(extra);
    fake w[4];
    tide_msg_t m, r;
    for (int i = 0; i < 4; i++) {
        fake_connect(&w[i], 3000);
        fake_register_in(&w[i], "host-pool", i, 4, "hostA");
    }
    void *admin = coord_connect(ctx, proc.endpoint, NULL, NULL, NULL, 3000);
    static char text[1 << 16];
    scrape(port, text, sizeof text);
    double hb0 = sample(text, "tide_heartbeats_total");
    double msg0 = sample(text, "tide_heartbeat_messages_total");
    /* 2 s of host heartbeats (the failure timeout is 1 s) naming ranks 0, 1 and 3 */
    int32_t three[3] = {w[0].id, w[1].id, w[3].id};
    int sent = 0;
    for (uint64_t until = tide_now_ns() + 2000000000ull; tide_now_ns() < until; sent++) {
        host_heartbeat(&w[0], three, 3);
        tide_sleep_ms(100);
    }
    tide_sleep_ms(150);
    cr_assert_eq(listed_state(admin, w[0].id, 0), TIDE_WORKER_IDLE);
    cr_assert_eq(listed_state(admin, w[1].id, 0), TIDE_WORKER_IDLE,
                 "a rank listed in host heartbeats was failed");
    cr_assert_eq(listed_state(admin, w[3].id, 0), TIDE_WORKER_IDLE);
    cr_assert_eq(listed_state(admin, w[2].id, 0), TIDE_WORKER_FAILED,
                 "a rank left out of the host heartbeats is not failed by timeout");
    scrape(port, text, sizeof text);
    cr_assert_eq(sample(text, "tide_heartbeat_messages_total") - msg0, sent,
                 "one message per host heartbeat");
    cr_assert_eq(sample(text, "tide_heartbeats_total") - hb0, 3.0 * sent,
                 "three heartbeats per host heartbeat");
    /* the failed rank listed again: the answer goes to its own socket */
    int32_t all[4] = {w[0].id, w[1].id, w[2].id, w[3].id};
    host_heartbeat(&w[0], all, 4);
    expect_type(w[2].sock, TIDE_MSG_ERROR, &r);
    cr_assert(strstr(r.u.error.message, "register again") != NULL, "%s", r.u.error.message);
    tide_msg_clear(&r);
    cr_assert(no_message(w[0].sock, TIDE_MSG_ERROR, 200),
              "the leader got the answer meant for another rank");
    host_heartbeat(&w[0], three, 3);
    /* rank 1 keeps its own route: with rank 0 drained, offline work goes to rank 1's socket */
    tide_msg_init(&m, TIDE_MSG_DRAIN);
    m.u.drain.worker = w[0].id;
    admin_call(admin, &m, &r, TIDE_MSG_OK);
    tide_msg_clear(&r);
    host_heartbeat(&w[0], three, 3);
    tide_msg_init(&m, TIDE_MSG_SUBMIT);
    snprintf(m.u.submit.name, sizeof m.u.submit.name, "eval");
    m.u.submit.kind = TIDE_JOB_COMMAND;
    char *argv[2] = {"sleep", "100"};
    m.u.submit.argv = argv;
    m.u.submit.argc = 2;
    admin_call(admin, &m, &r, TIDE_MSG_OK);
    tide_msg_clear(&r);
    expect_type(w[1].sock, TIDE_MSG_OFFLINE_ASSIGN, &r);
    tide_msg_clear(&r);
    /* strictness on the wire reaches tided too: a malformed one is answered, not acted on */
    tide_proto_heartbeat_t dup[2];
    memset(dup, 0, sizeof dup);
    dup[0].worker = dup[1].worker = w[0].id;
    tide_proto_buf_t b;
    tide_proto_buf_init(&b);
    tide_msg_init(&m, TIDE_MSG_HOST_HEARTBEAT);
    m.u.host_heartbeat.worker = w[0].id;
    m.u.host_heartbeat.beats = dup;
    m.u.host_heartbeat.n_beats = 2;
    cr_assert_eq(tide_proto_encode(&m, &b), TIDE_ERR_INVALID); /* the encoder refuses it */
    tide_proto_buf_destroy(&b);
    zmq_close(admin);
    for (int i = 0; i < 4; i++)
        zmq_close(w[i].sock);
}

/* One status page of job `job`'s workers (from, limit as status_page); the reply is the
   caller's. */
static void job_status_page(void *sock, const char *job, int32_t from, tide_msg_t *r,
                            tide_msg_type_t want)
{
    tide_msg_t m;
    tide_msg_init(&m, TIDE_MSG_STATUS);
    m.u.status.from = from;
    snprintf(m.u.status.job, sizeof m.u.status.job, "%s", job);
    admin_call(sock, &m, r, want);
}

/* status --job: only that job's workers (an online job's launch ranks with their
   coordinates, an offline job's worker), paged like the whole table; an unknown job is an
   error; tidectl status --job prints them. */
Test(tided, status_of_one_job_lists_only_its_workers, .init = setup, .fini = teardown)
{
    const char *extra[] = {"--status-page", "2", "--join-grace-ms", "0", NULL};
    start(extra);
    fake a[3], b[2], c;
    tide_msg_t m, r;
    for (int i = 0; i < 3; i++) {
        fake_connect(&a[i], 3000);
        fake_register_in(&a[i], "pool-a", i, 3, "host0");
    }
    for (int i = 0; i < 2; i++) {
        fake_connect(&b[i], 3000);
        fake_register_in(&b[i], "pool-b", i, 2, "host1");
    }
    fake_connect(&c, 3000);
    fake_register_in(&c, "pool-c", 0, 1, "host2");
    for (int i = 0; i < 3; i++)
        fake_join_fit(&a[i], "ja", 3, 1, NULL, 0);
    for (int i = 0; i < 2; i++)
        fake_join_fit(&b[i], "jb", 2, 1, NULL, 0);
    for (int i = 0; i < 3; i++) {
        expect_type(a[i].sock, TIDE_MSG_LAYOUT, &r);
        tide_msg_clear(&r);
    }
    for (int i = 0; i < 2; i++) {
        expect_type(b[i].sock, TIDE_MSG_LAYOUT, &r);
        tide_msg_clear(&r);
    }
    void *admin = coord_connect(ctx, proc.endpoint, NULL, NULL, NULL, 3000);
    tide_msg_init(&m, TIDE_MSG_SUBMIT);
    snprintf(m.u.submit.name, sizeof m.u.submit.name, "eval");
    m.u.submit.kind = TIDE_JOB_COMMAND;
    char *argv[2] = {"sleep", "100"};
    m.u.submit.argv = argv;
    m.u.submit.argc = 2;
    admin_call(admin, &m, &r, TIDE_MSG_OK);
    tide_msg_clear(&r);
    expect_type(c.sock, TIDE_MSG_OFFLINE_ASSIGN, &r);
    tide_msg_clear(&r);
    /* job ja: its three workers over two pages, each with its coordinate */
    int seen[3] = {0}, pages = 0, dps = 0;
    int32_t from = 0;
    do {
        job_status_page(admin, "ja", from, &r, TIDE_MSG_STATUS_REPLY);
        const tide_proto_status_reply_t *p = &r.u.status_reply;
        cr_assert_eq(p->total, 3, "job ja has 3 workers, status says %u", p->total);
        cr_assert_leq(p->n_rows, 2u);
        for (uint32_t i = 0; i < p->n_rows; i++) {
            int mine = 0;
            for (int k = 0; k < 3; k++)
                if (p->rows[i].worker == a[k].id) {
                    seen[k]++;
                    mine = 1;
                }
            cr_assert(mine, "worker %d is not job ja's", p->rows[i].worker);
            cr_assert_str_eq(p->rows[i].job, "ja");
            cr_assert_eq(p->rows[i].stage, 0);
            dps |= 1 << p->rows[i].dp_rank;
        }
        pages++;
        from = p->next;
        tide_msg_clear(&r);
    } while (from >= 0 && pages < 5);
    cr_assert_eq(pages, 2);
    cr_assert(seen[0] == 1 && seen[1] == 1 && seen[2] == 1);
    cr_assert_eq(dps, 7, "dp ranks 0, 1 and 2 shown");
    /* job jb, and the offline job's one worker */
    job_status_page(admin, "jb", 0, &r, TIDE_MSG_STATUS_REPLY);
    cr_assert_eq(r.u.status_reply.total, 2);
    cr_assert(r.u.status_reply.rows[0].worker == b[0].id &&
              r.u.status_reply.rows[1].worker == b[1].id);
    tide_msg_clear(&r);
    job_status_page(admin, "eval", 0, &r, TIDE_MSG_STATUS_REPLY);
    cr_assert_eq(r.u.status_reply.total, 1);
    cr_assert_eq(r.u.status_reply.rows[0].worker, c.id);
    cr_assert_str_eq(r.u.status_reply.rows[0].offline, "eval");
    tide_msg_clear(&r);
    job_status_page(admin, "nope", 0, &r, TIDE_MSG_ERROR);
    cr_assert_eq(r.u.error.code, TIDE_ERR_NOT_FOUND);
    cr_assert(strstr(r.u.error.message, "no job named nope") != NULL, "%s", r.u.error.message);
    tide_msg_clear(&r);
    /* tidectl */
    static char out[1 << 16];
    const char *st[] = {"status", "--job", "jb", NULL};
    cr_assert_eq(tidectl(out, sizeof out, st), 0, "%s", out);
    cr_assert(strstr(out, "2 GPUs: 2 online") != NULL, "%s", out);
    const char *js[] = {"--json", "status", "--job", "ja", NULL};
    cr_assert_eq(tidectl(out, sizeof out, js), 0, "%s", out);
    for (int k = 0; k < 3; k++) {
        char want[32];
        snprintf(want, sizeof want, "\"worker\":%d,", a[k].id);
        cr_assert(strstr(out, want) != NULL, "worker %d missing: %s", a[k].id, out);
    }
    for (int k = 0; k < 2; k++) {
        char want[32];
        snprintf(want, sizeof want, "\"worker\":%d,", b[k].id);
        cr_assert(strstr(out, want) == NULL, "job jb's worker %d listed for ja: %s", b[k].id, out);
    }
    const char *bad[] = {"status", "--job", "two words", NULL};
    cr_assert_neq(tidectl(out, sizeof out, bad), 0, "a malformed job name was sent");
    const char *none[] = {"status", "--job", "nope", NULL};
    cr_assert_neq(tidectl(out, sizeof out, none), 0, "status of an unknown job succeeded");
    zmq_close(admin);
    for (int i = 0; i < 3; i++)
        zmq_close(a[i].sock);
    for (int i = 0; i < 2; i++)
        zmq_close(b[i].sock);
    zmq_close(c.sock);
}

/* Rank f joins job `job` asking for (dp, tp, 1). */
static void fake_join_tp(fake *f, const char *job, int dp, int tp)
{
    tide_msg_t m;
    tide_msg_init(&m, TIDE_MSG_JOIN);
    m.u.join.worker = f->id;
    snprintf(m.u.join.job, sizeof m.u.join.job, "%s", job);
    m.u.join.total_bytes = 1 << 20;
    m.u.join.num_layers = 4;
    m.u.join.dp = dp;
    m.u.join.tp = tp;
    m.u.join.pp = 1;
    m.u.join.micro_batches = 1;
    cr_assert_eq(coord_send(f->sock, &m), 0);
}

static int is_failed(const tide_proto_job_row_t *r)
{
    return r->state == TIDE_JOB_FAILED;
}

/* A first layout whose TP groups the launch's hosts cannot hold (8 ranks on two hosts of
   4, tp 8) is refused once every rank joined, with the reason, and the job is failed: it
   never waits for ranks that cannot come. The same launch on one host starts. */
Test(tided, a_first_layout_that_cannot_fit_inside_hosts_is_refused, .init = setup, .fini = teardown)
{
    start(NULL);
    fake w[8];
    tide_msg_t r;
    for (int i = 0; i < 8; i++) {
        fake_connect(&w[i], 3000);
        fake_register_in(&w[i], "split", i, 8, i < 4 ? "hostA" : "hostB");
    }
    for (int i = 0; i < 8; i++) {
        fake_join_tp(&w[i], "wide", 1, 8);
        if (i < 7) { /* the ranks still to come could change the picture: wait */
            expect_type(w[i].sock, TIDE_MSG_OK, &r);
            tide_msg_clear(&r);
        }
    }
    expect_type(w[7].sock, TIDE_MSG_ERROR, &r);
    cr_assert_eq(r.u.error.code, TIDE_ERR_NO_DEVICE, "%s", r.u.error.message);
    cr_assert(strstr(r.u.error.message, "job wide cannot start") != NULL &&
                  strstr(r.u.error.message, "hostA: 4") != NULL &&
                  strstr(r.u.error.message, "hostB: 4") != NULL &&
                  strstr(r.u.error.message, "a smaller tp") != NULL,
              "%s", r.u.error.message);
    tide_msg_clear(&r);
    void *admin = coord_connect(ctx, proc.endpoint, NULL, NULL, NULL, 3000);
    tide_msg_t m;
    tide_msg_init(&m, TIDE_MSG_JOBS);
    admin_call(admin, &m, &r, TIDE_MSG_JOBS_REPLY);
    const tide_proto_job_row_t *row = find_job(&r, "wide");
    cr_assert(row != NULL && is_failed(row), "job wide is not failed");
    tide_msg_clear(&r);
    cr_assert_eq(count_events(admin, "job_refused"), 1);
    cr_assert_eq(count_events(admin, "job_waiting"), 0);
    for (int i = 0; i < 8; i++)
        cr_assert(no_message(w[i].sock, TIDE_MSG_LAYOUT, i == 0 ? 300 : 10), "rank %d got a layout",
                  i);
    /* one host of 8 holds the group: the same job name starts from a new launch */
    fake v[8];
    for (int i = 0; i < 8; i++) {
        fake_connect(&v[i], 3000);
        fake_register_in(&v[i], "whole", i, 8, "hostC");
    }
    for (int i = 0; i < 8; i++)
        fake_join_tp(&v[i], "wide", 1, 8);
    for (int i = 0; i < 8; i++) {
        expect_type(v[i].sock, TIDE_MSG_LAYOUT, &r);
        tide_msg_clear(&r);
    }
    zmq_close(admin);
    for (int i = 0; i < 8; i++) {
        zmq_close(w[i].sock);
        zmq_close(v[i].sock);
    }
}

/* Sends a "saved" report from f (code 0: complete in dir). */
static void report_saved(fake *f, uint64_t step, const char *dir, int code, const char *why)
{
    tide_msg_t m;
    tide_msg_init(&m, TIDE_MSG_SAVED);
    m.u.saved.worker = f->id;
    snprintf(m.u.saved.job, sizeof m.u.saved.job, "train");
    m.u.saved.step = step;
    snprintf(m.u.saved.dir, sizeof m.u.saved.dir, "%s", dir);
    m.u.saved.code = code;
    snprintf(m.u.saved.reason, sizeof m.u.saved.reason, "%s", why);
    cr_assert_eq(coord_send(f->sock, &m), 0);
}

/* f heard checkpoint proposal id (of step) of job "train" with done steps completed. */
static void ack_save(fake *f, uint64_t id, uint64_t step, uint64_t done)
{
    tide_msg_t m;
    tide_msg_init(&m, TIDE_MSG_SAVE_ACK);
    m.u.save_ack.worker = f->id;
    snprintf(m.u.save_ack.job, sizeof m.u.save_ack.job, "train");
    m.u.save_ack.id = id;
    m.u.save_ack.step = step;
    m.u.save_ack.done = done;
    m.u.save_ack.member = 1;
    cr_assert_eq(coord_send(f->sock, &m), 0);
}

/* The answer to the request sent on admin before (tided answers a checkpoint request once
   its ranks agreed). */
static void admin_reply(void *admin, tide_msg_t *r, tide_msg_type_t want)
{
    cr_assert_eq(coord_recv(admin, r), 0, "no answer");
    cr_assert_eq(r->type, want, "got '%s': %s", tide_msg_type_name(r->type),
                 r->type == TIDE_MSG_ERROR ? r->u.error.message : "");
}

static void mk_checkpoint(tide_msg_t *m, const char *job, const char *dir)
{
    tide_msg_init(m, TIDE_MSG_CHECKPOINT);
    snprintf(m->u.checkpoint.job, sizeof m->u.checkpoint.job, "%s", job);
    snprintf(m->u.checkpoint.dir, sizeof m->u.checkpoint.dir, "%s", dir);
}

/* n fake workers register; the first dp join "train" (dp, 1, 1) and get its first layout. */
static void train_on(fake *w, int n, int dp)
{
    tide_msg_t r;
    for (int i = 0; i < n; i++) {
        fake_connect(&w[i], 3000);
        fake_register(&w[i], i, n);
    }
    for (int i = 0; i < dp; i++)
        fake_join(&w[i], dp);
    for (int i = 0; i < dp; i++) {
        expect_type(w[i].sock, TIDE_MSG_LAYOUT, &r);
        tide_msg_clear(&r);
    }
}

/* `tidectl checkpoint` asks the job's workers for a save at a step ahead of the furthest
   one heard of, under the root given or the one its last checkpoint went to; reports of
   complete checkpoints are kept (and survive a restart of tided), failures become events,
   and a worker outside the job cannot report one. */
Test(tided, checkpoint_requests_and_reports, .init = setup, .fini = teardown)
{
    start(NULL);
    fake w[3];
    tide_msg_t m, r;
    train_on(w, 3, 2);
    void *admin = coord_connect(ctx, proc.endpoint, NULL, NULL, NULL, 3000);
    mk_checkpoint(&m, "nope", "/ck");
    admin_call(admin, &m, &r, TIDE_MSG_ERROR);
    cr_expect(strstr(r.u.error.message, "no online job named nope") != NULL, "%s",
              r.u.error.message);
    mk_checkpoint(&m, "train", "");
    admin_call(admin, &m, &r, TIDE_MSG_ERROR);
    cr_expect(strstr(r.u.error.message, "pass --dir ROOT") != NULL, "%s", r.u.error.message);
    /* the job's speed is its steps over wall time (10 steps in at least 600 ms here), not
       the time inside steps its workers report (1 ms: 1000 steps/s, 4,000 steps ahead) */
    for (int k = 0; k < 3; k++) {
        for (int i = 0; i < 2; i++) {
            coord_mk_heartbeat(&m, w[i].id, 10 + 5 * (uint64_t)k + (uint64_t)i, 1);
            m.u.heartbeat.step_ms = 1.0;
            cr_assert_eq(coord_send(w[i].sock, &m), 0);
        }
        tide_sleep_ms(k < 2 ? 300 : 100);
    }
    mk_checkpoint(&m, "train", "/ck/train");
    cr_assert_eq(coord_send(admin, &m), 0);
    /* the furthest step heard of (21), 2 more, and what 4 heartbeat periods (1 s) hold at
       that speed: at most 10 steps in 600 ms since the first heartbeat that moved */
    uint64_t id = 0, want = 0;
    for (int i = 0; i < 2; i++) {
        expect_type(w[i].sock, TIDE_MSG_SAVE, &r);
        cr_expect_eq(r.u.save.phase, TIDE_PROTO_SAVE_PROPOSE);
        cr_expect_str_eq(r.u.save.dir, "/ck/train");
        cr_expect(r.u.save.step >= 23 && r.u.save.step <= 23 + 17, "want a step in [23, 40]: %llu",
                  (unsigned long long)r.u.save.step);
        id = r.u.save.id;
        want = r.u.save.step;
        tide_msg_clear(&r);
    }
    cr_assert_neq(id, 0);
    /* no answer before every member said it had not reached the step */
    cr_assert_eq(coord_recv_within(admin, &r, 200), -1, "tided answered before the members did");
    for (int i = 0; i < 2; i++)
        ack_save(&w[i], id, want, 21);
    admin_reply(admin, &r, TIDE_MSG_OK);
    char text[64];
    snprintf(text, sizeof text, "checkpoint of step %llu under /ck/train (about ",
             (unsigned long long)want);
    cr_expect(strstr(r.u.ok.message, text) != NULL, "want step %llu: %s", (unsigned long long)want,
              r.u.ok.message);
    tide_msg_clear(&r);
    for (int i = 0; i < 2; i++) {
        expect_type(w[i].sock, TIDE_MSG_SAVE, &r);
        cr_expect_eq(r.u.save.phase, TIDE_PROTO_SAVE_GO);
        cr_expect_eq(r.u.save.id, id);
        cr_expect_eq(r.u.save.step, want);
        tide_msg_clear(&r);
    }
    /* the worker outside the job is refused; a failed save is an event */
    report_saved(&w[2], 53, "/ck/train/step-000000000053", 0, "");
    expect_type(w[2].sock, TIDE_MSG_ERROR, &r);
    cr_expect(strstr(r.u.error.message, "runs no online job named train") != NULL, "%s",
              r.u.error.message);
    report_saved(&w[1], 53, "/ck/train", TIDE_ERR_IO, "disk full");
    report_saved(&w[0], 53, "/ck/train/step-000000000053", 0, "");
    char detail[TIDE_PROTO_TEXT_MAX + 1] = "";
    for (int t = 0; t < 100 && !event_detail(admin, "checkpoint_saved", detail, sizeof detail); t++)
        tide_sleep_ms(20);
    cr_expect(strstr(detail, "step 53 saved in /ck/train/step-000000000053") != NULL, "%s", detail);
    cr_assert(event_detail(admin, "checkpoint_failed", detail, sizeof detail));
    cr_expect(strstr(detail, "disk full") != NULL, "%s", detail);
    /* the root is known now, also to a tided restarted on the same state */
    coord_stop(&proc, SIGKILL);
    zmq_close(admin);
    for (int i = 0; i < 3; i++)
        zmq_close(w[i].sock);
    start(NULL);
    /* its members (gone with their sockets) never answer the proposal: tided answers
       within 3 s (TIDE__CKREQ_WAIT_MS) */
    admin = coord_connect(ctx, proc.endpoint, NULL, NULL, NULL, 6000);
    mk_checkpoint(&m, "train", "");
    cr_assert_eq(coord_call(admin, &m, &r), 0);
    cr_assert_eq(r.type, TIDE_MSG_ERROR);
    /* not "pass --dir": the job kept its root, which the failure names */
    cr_expect(strstr(r.u.error.message, "did not answer the checkpoint proposal") != NULL ||
                  strstr(r.u.error.message, "not training") != NULL ||
                  strstr(r.u.error.message, "stopped training") != NULL,
              "%s", r.u.error.message);
    if (strstr(r.u.error.message, "did not answer") != NULL)
        cr_expect(event_with(admin, "checkpoint_failed", "under /ck/train was not taken"));
    tide_msg_clear(&r);
    zmq_close(admin);
}

/* Expects proposal `phase` of a checkpoint on both members; its id and step. */
static void expect_save(fake *w, uint32_t phase, uint64_t *id, uint64_t *step)
{
    tide_msg_t r;
    for (int i = 0; i < 2; i++) {
        expect_type(w[i].sock, TIDE_MSG_SAVE, &r);
        cr_assert_eq(r.u.save.phase, phase, "worker %d: phase %u, want %u", i, r.u.save.phase,
                     phase);
        if (i > 0 || *id == 0) {
            cr_assert(i == 0 || r.u.save.id == *id);
            *id = r.u.save.id;
            *step = r.u.save.step;
        }
        cr_assert(r.u.save.id == *id && r.u.save.step == *step);
        tide_msg_clear(&r);
    }
}

/* tided's view of a job's step comes from heartbeats and lags it (here: step 3, while a
   member has completed 40): the step it proposes first was passed, so it proposes again
   past the furthest member, and the operator learns the step they agreed on. A member that
   never answers makes the request fail within TIDE__CKREQ_WAIT_MS, with an event. */
Test(tided, checkpoint_request_moves_past_a_step_a_member_passed, .init = setup, .fini = teardown)
{
    start(NULL);
    fake w[2];
    tide_msg_t m, r;
    train_on(w, 2, 2);
    for (int i = 0; i < 2; i++) {
        coord_mk_heartbeat(&m, w[i].id, 3, 1);
        cr_assert_eq(coord_send(w[i].sock, &m), 0);
    }
    void *admin = coord_connect(ctx, proc.endpoint, NULL, NULL, NULL, 3000);
    mk_checkpoint(&m, "train", "/ck/train");
    cr_assert_eq(coord_send(admin, &m), 0);
    uint64_t id1 = 0, s1 = 0;
    expect_save(w, TIDE_PROTO_SAVE_PROPOSE, &id1, &s1);
    cr_assert_lt(s1, 40);
    ack_save(&w[0], id1, s1, 3);
    ack_save(&w[1], id1, s1, 40);
    expect_save(w, TIDE_PROTO_SAVE_DROP, &id1, &s1);
    uint64_t id2 = 0, s2 = 0;
    expect_save(w, TIDE_PROTO_SAVE_PROPOSE, &id2, &s2);
    cr_assert(id2 != id1 && s2 > 40, "proposal %llu of step %llu after a member completed 40",
              (unsigned long long)id2, (unsigned long long)s2);
    ack_save(&w[0], id1, s1, 41); /* an answer to the dropped proposal changes nothing */
    ack_save(&w[0], id2, s2, 41);
    ack_save(&w[1], id2, s2, 41);
    expect_save(w, TIDE_PROTO_SAVE_GO, &id2, &s2);
    admin_reply(admin, &r, TIDE_MSG_OK);
    char text[64];
    snprintf(text, sizeof text, "saves the checkpoint of step %llu ", (unsigned long long)s2);
    cr_expect(strstr(r.u.ok.message, text) != NULL, "want step %llu: %s", (unsigned long long)s2,
              r.u.ok.message);
    tide_msg_clear(&r);

    /* worker 1 silent: the request fails, the ranks drop it, an event says why */
    cr_assert_eq(coord_send(admin, &m), 0);
    uint64_t id3 = 0, s3 = 0;
    expect_save(w, TIDE_PROTO_SAVE_PROPOSE, &id3, &s3);
    ack_save(&w[0], id3, s3, 42);
    for (int k = 0; k < 10; k++) { /* heartbeats: worker 1 stays alive, only mute */
        for (int i = 0; i < 2; i++) {
            coord_mk_heartbeat(&m, w[i].id, 42, 1);
            cr_assert_eq(coord_send(w[i].sock, &m), 0);
        }
        if (coord_recv_within(admin, &r, 500) == 0)
            break;
    }
    cr_assert_eq(r.type, TIDE_MSG_ERROR, "a request with a mute member: %s",
                 tide_msg_type_name(r.type));
    char who[64];
    snprintf(who, sizeof who, "worker %d of job train did not answer", w[1].id);
    cr_expect(strstr(r.u.error.message, who) != NULL, "%s", r.u.error.message);
    tide_msg_clear(&r);
    expect_save(w, TIDE_PROTO_SAVE_DROP, &id3, &s3);
    cr_expect(event_with(admin, "checkpoint_failed", who), "no checkpoint_failed naming %s", who);
    zmq_close(admin);
}

/* A host lost with both its members of a dp 4 job: their last heartbeats came in one host
   heartbeat, so they go silent together. One failure is one recovery: a single
   recovery_started over the two survivors, no switch started and aborted in between. */
Test(tided, a_lost_host_is_one_recovery, .init = setup, .fini = teardown)
{
    const char *extra[] = {"--heartbeat-ms", "100", "--miss-limit", "3", NULL};
    start(extra);
    fake w[4];
    tide_msg_t r;
    for (int i = 0; i < 4; i++) {
        fake_connect(&w[i], 3000);
        fake_register(&w[i], i, 4); /* ranks 2 and 3 on host1 */
        fake_join(&w[i], 4);
    }
    for (int i = 0; i < 4; i++) {
        expect_type(w[i].sock, TIDE_MSG_LAYOUT, &r);
        cr_assert_eq(r.u.layout.layout.dp, 4);
        tide_msg_clear(&r);
    }
    int32_t host1[2] = {w[2].id, w[3].id};
    host_heartbeat(&w[2], host1, 2);
    int ms = 50;
    zmq_setsockopt(w[0].sock, ZMQ_RCVTIMEO, &ms, sizeof ms);
    int got = 0;
    for (int t = 0; t < 100 && !got; t++) {
        heartbeat(&w[0]);
        heartbeat(&w[1]);
        if (coord_recv(w[0].sock, &r) != 0)
            continue;
        if (r.type == TIDE_MSG_LAYOUT && r.u.layout.recover) {
            got = 1;
            cr_assert_eq(r.u.layout.layout.dp, 2, "recovery over the two survivors");
        }
        tide_msg_clear(&r);
    }
    cr_assert(got, "no recovery layout after host1 went silent");
    void *admin = coord_connect(ctx, proc.endpoint, NULL, NULL, NULL, 3000);
    cr_assert_eq(count_events(admin, "worker_failed"), 2);
    cr_assert_eq(count_events(admin, "recovery_started"), 1, "one host lost, one recovery");
    cr_assert_eq(count_events(admin, "resize_aborted"), 0);
    char detail[1024];
    cr_assert(event_detail(admin, "recovery_started", detail, sizeof detail));
    char both[64];
    snprintf(both, sizeof both, "workers %d, %d failed at once", w[2].id, w[3].id);
    cr_assert(strstr(detail, both) != NULL, "recovery_started: %s", detail);
    for (int i = 0; i < 4; i++)
        zmq_close(w[i].sock);
    zmq_close(admin);
}
