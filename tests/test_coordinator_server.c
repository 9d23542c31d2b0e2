/*
 * Integration tests for tided (tests/tided_fixture.h: the real binary, fake workers and
 * tidectl over DEALER sockets): registration, first layout, offline backfill and
 * preemption, the resize protocol (prepare / ack / commit / done), kill -9 and restart
 * in the middle of a switch, failure detection and recovery, malformed input, job end on
 * bye, a generation kept after a participant switched, --dry-run bytes under the chosen
 * map and the default rank order, and workers named by tided's id everywhere. The other
 * parts of tided have files of their own: test_coordinator_offline.c (offline attempts,
 * logs, limits), _workers.c (the worker table, liveness, fit rules, pools), _hosts.c
 * (host heartbeats, one job's status, placement inside hosts, a lost host), _ckpt.c
 * (checkpoint requests and reports), _auth.c (CURVE roles and keys), _metrics.c (the
 * Prometheus text).
 */
#include "tests/tided_fixture.h"

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
    submit_sleep(admin, "eval", 3);
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
    launch_train(w, 2, 2);
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
    launch_train(w, 3, 2);
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
    launch_train(w, 3, 2);
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

/*
 * One worker identity: ranks registered in reverse (rank r gets worker id 3 - r, never
 * its rank), so every reply, drain and metric that named a worker by its pool rank
 * instead of tided's id would fail here.
 */
Test(tided, workers_are_named_by_tided_id_everywhere, .init = setup, .fini = teardown)
{
    int port = start_with_metrics();
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
