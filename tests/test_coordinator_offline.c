/*
 * tided's offline work (tests/tided_fixture.h): nothing is handed out before a job's first
 * layout, only failures use up an offline job's attempts and retries back off to other
 * workers, `tidectl logs` shows each attempt's output, and a job's limits reach the
 * worker and its event.
 */
#include "tests/tided_fixture.h"

Test(tided, no_offline_work_between_registration_and_the_first_layout, .init = setup,
     .fini = teardown)
{
    start(NULL);
    void *admin = coord_connect(ctx, proc.endpoint, NULL, NULL, NULL, 5000);
    tide_msg_t r;
    submit_sleep(admin, "eval", 0);
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
    submit_sleep(admin, "eval", 0);
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
