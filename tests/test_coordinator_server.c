/*
 * Integration tests for tided: each test starts the real binary on a free
 * loopback port with a temporary state file and talks to it over DEALER
 * sockets as fake workers and as tidectl would: registration, first layout,
 * offline backfill and preemption, the resize protocol (prepare / ack / commit
 * / done), kill -9 and restart in the middle of a switch, failure detection and
 * recovery, malformed input, CURVE authentication. A few seconds in all.
 */
#include <criterion/criterion.h>
#include <string.h>

#include "tests/coord_harness.h"

#define POOL "pool-a"

typedef struct fake {
    void *sock;
    int32_t id;
    int rank;
} fake;

static void *ctx;
static coord_proc proc;

static void setup(void)
{
    ctx = zmq_ctx_new();
    cr_assert_eq(coord_tmpdir(&proc), 0);
}

static void teardown(void)
{
    coord_stop(&proc, SIGKILL);
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

Test(tided, resize_offline_preemption_and_kill9_restart_mid_switch, .init = setup, .fini = teardown)
{
    start(NULL);
    fake w[4];
    tide_msg_t m, r;
    for (int i = 0; i < 4; i++) {
        fake_connect(&w[i], 5000);
        fake_register(&w[i], i, 4);
    }
    for (int i = 0; i < 4; i++)
        fake_join(&w[i], 2);
    /* ranks 0 and 1 hold the first layout (generation 1); 2 and 3 wait idle */
    for (int i = 0; i < 2; i++) {
        expect_type(w[i].sock, TIDE_MSG_LAYOUT, &r);
        cr_assert_eq(r.u.layout.layout.gen, 1);
        cr_assert_eq(r.u.layout.layout.dp, 2);
        cr_assert_eq(r.u.layout.has_prev, 0);
        tide_msg_clear(&r);
    }
    for (int i = 2; i < 4; i++) {
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
    /* a heartbeat from the failed worker is told to register again */
    coord_mk_heartbeat(&m, w[2].id, 5, 1);
    cr_assert_eq(coord_call(w[2].sock, &m, &r), 0);
    cr_assert_eq(r.type, TIDE_MSG_ERROR);
    cr_assert_eq(r.u.error.code, TIDE_ERR_STALE);
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
    char sp[41], ss[41], ap[41], as[41], wp[41], ws[41], xp[41], xs[41];
    cr_assert_eq(zmq_curve_keypair(sp, ss), 0);
    zmq_curve_keypair(ap, as);
    zmq_curve_keypair(wp, ws);
    zmq_curve_keypair(xp, xs);
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
    tide_msg_clear(&r);
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
