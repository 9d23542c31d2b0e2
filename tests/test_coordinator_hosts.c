/*
 * tided and hosts (tests/tided_fixture.h): host heartbeats count each rank and keep each
 * route, one job's status lists only its workers, a first layout that cannot fit inside
 * hosts is refused, and a lost host is one recovery.
 */
#include "tests/tided_fixture.h"

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
    submit_sleep(admin, "eval", 0);
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
    tide_msg_t r;
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
    submit_sleep(admin, "eval", 0);
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

/* Two ranks of host1 stop, but the last message of one came 60 ms after the other's (its
   own heartbeat after the host's beat: a rank's report does that): a scan runs every 25 ms
   here, so it finds them silent past the timeout in two scans. They still fail in one
   burst and the job recovers once, while host1's two live ranks, heard all along, stay.
   The timeout is 4 s, so host-mates fail together within 400 ms (10% of it): the 60 ms
   this test sleeps may overshoot by 340 ms on a loaded machine (with a 1 s timeout, an
   overshoot of 40 ms in a landing CI made the gap a real one of two failures). */
Test(tided, a_hosts_members_silent_a_little_apart_are_one_recovery, .init = setup, .fini = teardown)
{
    const char *extra[] = {"--heartbeat-ms", "100", "--miss-limit", "40", NULL};
    start(extra);
    fake w[6];
    tide_msg_t r;
    for (int i = 0; i < 6; i++) {
        fake_connect(&w[i], 3000);
        fake_register(&w[i], i, 6); /* ranks 2..5 on host1 */
        fake_join(&w[i], 6);
    }
    for (int i = 0; i < 6; i++) {
        expect_type(w[i].sock, TIDE_MSG_LAYOUT, &r);
        cr_assert_eq(r.u.layout.layout.dp, 6);
        tide_msg_clear(&r);
    }
    int32_t pair[2] = {w[2].id, w[3].id};
    uint64_t beat_ns = tide_now_ns();
    host_heartbeat(&w[2], pair, 2);
    usleep(60 * 1000);
    heartbeat(&w[3]); /* its last word, 60 ms after the host's */
    unsigned gap_ms = (unsigned)((tide_now_ns() - beat_ns) / 1000000u);
    int ms = 50;
    zmq_setsockopt(w[0].sock, ZMQ_RCVTIMEO, &ms, sizeof ms);
    int got = 0;
    for (int t = 0; t < 200 && !got; t++) {
        for (int i = 0; i < 6; i++)
            if (i != 2 && i != 3)
                heartbeat(&w[i]);
        if (coord_recv(w[0].sock, &r) != 0)
            continue;
        if (r.type == TIDE_MSG_LAYOUT && r.u.layout.recover) {
            got = 1;
            cr_assert_eq(r.u.layout.layout.dp, 4,
                         "recovery over the four live ranks, not %d (last words %u ms apart)",
                         r.u.layout.layout.dp, gap_ms);
        }
        tide_msg_clear(&r);
    }
    cr_assert(got, "no recovery layout after two ranks of host1 went silent");
    for (int t = 0; t < 6; t++) { /* a second scan's verdict would come now */
        for (int i = 0; i < 6; i++)
            if (i != 2 && i != 3)
                heartbeat(&w[i]);
        usleep(50 * 1000);
    }
    void *admin = coord_connect(ctx, proc.endpoint, NULL, NULL, NULL, 3000);
    cr_assert_eq(count_events(admin, "worker_failed"), 2, "host1's live ranks stay");
    cr_assert_eq(count_events(admin, "recovery_started"), 1, "two ranks of a host, one recovery");
    cr_assert_eq(count_events(admin, "resize_aborted"), 0);
    char detail[1024], both[64], mate[96];
    cr_assert(event_detail(admin, "recovery_started", detail, sizeof detail));
    snprintf(both, sizeof both, "workers %d, %d failed at once", w[2].id, w[3].id);
    cr_assert(strstr(detail, both) != NULL, "recovery_started: %s", detail);
    snprintf(mate, sizeof mate, "on host host1 where worker %d failed at the same time", w[2].id);
    cr_assert(event_with(admin, "worker_failed", mate), "worker %d's verdict names its host-mate",
              w[3].id);
    for (int i = 0; i < 6; i++)
        zmq_close(w[i].sock);
    zmq_close(admin);
}
