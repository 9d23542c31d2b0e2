/*
 * tided's worker table and what it lets a job run (tests/tided_fixture.h): workers that
 * left are hidden and forgotten after retention, status comes in pages and is never cut,
 * a client registers a bounded number of workers, liveness answers exactly the ranks
 * asked, layouts the program cannot run are refused (and never recovered to), and a
 * joined pool left out of a resize is released.
 */
#include "tests/tided_fixture.h"

/* ---- the worker table: left, retention, pages, the register cap, liveness ---------------- */

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
    submit_sleep(admin, "eval", 3);
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
