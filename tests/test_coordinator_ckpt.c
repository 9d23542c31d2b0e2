/*
 * tided's checkpoint requests and reports (tests/tided_fixture.h): `tidectl checkpoint`
 * proposes a step to the job's ranks, decides GO once every member answered below it (or
 * moves past a step a member passed, or fails naming a silent member), and the reports of
 * saved and failed checkpoints become events and the rollback target.
 */
#include "tests/tided_fixture.h"

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

/* Requests asked faster than tided hears of the job's steps (its view stays at step 10
   here) each get a step of their own: after one was agreed, and while another is being
   agreed. Three at one step once reached the ranks' savers at one boundary, and the third
   was refused BUSY though tidectl had acknowledged it. */
Test(tided, checkpoint_requests_in_a_row_get_steps_of_their_own, .init = setup, .fini = teardown)
{
    start(NULL);
    fake w[2];
    tide_msg_t m, r;
    train_on(w, 2, 2);
    for (int i = 0; i < 2; i++) {
        coord_mk_heartbeat(&m, w[i].id, 10, 1);
        cr_assert_eq(coord_send(w[i].sock, &m), 0);
    }
    void *admin[2];
    for (int a = 0; a < 2; a++)
        admin[a] = coord_connect(ctx, proc.endpoint, NULL, NULL, NULL, 3000);
    uint64_t agreed[4] = {0};
    for (int k = 0; k < 2; k++) { /* one after another: each agreed before the next */
        mk_checkpoint(&m, "train", k ? "/ck/b" : "/ck/a");
        cr_assert_eq(coord_send(admin[0], &m), 0);
        uint64_t id = 0;
        expect_save(w, TIDE_PROTO_SAVE_PROPOSE, &id, &agreed[k]);
        for (int i = 0; i < 2; i++)
            ack_save(&w[i], id, agreed[k], 10);
        expect_save(w, TIDE_PROTO_SAVE_GO, &id, &agreed[k]);
        admin_reply(admin[0], &r, TIDE_MSG_OK);
        tide_msg_clear(&r);
    }
    cr_expect_gt(agreed[1], agreed[0], "a second request agreed at step %llu, the first at %llu",
                 (unsigned long long)agreed[1], (unsigned long long)agreed[0]);
    /* two at once, on two connections: neither is agreed when the other is proposed */
    uint64_t id[2] = {0, 0};
    for (int a = 0; a < 2; a++) {
        mk_checkpoint(&m, "train", a ? "/ck/d" : "/ck/c");
        cr_assert_eq(coord_send(admin[a], &m), 0);
        expect_save(w, TIDE_PROTO_SAVE_PROPOSE, &id[a], &agreed[2 + a]);
    }
    for (int a = 0; a < 2; a++)
        for (int i = 0; i < 2; i++)
            ack_save(&w[i], id[a], agreed[2 + a], 10);
    for (int a = 0; a < 2; a++) {
        expect_save(w, TIDE_PROTO_SAVE_GO, &id[a], &agreed[2 + a]);
        admin_reply(admin[a], &r, TIDE_MSG_OK);
        tide_msg_clear(&r);
    }
    for (int k = 0; k < 4; k++)
        for (int l = 0; l < k; l++)
            cr_expect_neq(agreed[k], agreed[l], "requests %d and %d both agreed at step %llu", l, k,
                          (unsigned long long)agreed[k]);
    for (int a = 0; a < 2; a++)
        zmq_close(admin[a]);
}

/* Waits until tided's status lists worker id at `step` (its heartbeat was handled). */
static void wait_worker_step(void *admin, int32_t id, uint64_t step)
{
    for (int k = 0; k < 400; k++) {
        tide_msg_t r;
        status_page(admin, 0, 0, 0, &r);
        int at = 0;
        for (uint32_t i = 0; i < r.u.status_reply.n_rows; i++)
            at |= r.u.status_reply.rows[i].worker == id && r.u.status_reply.rows[i].step == step;
        tide_msg_clear(&r);
        if (at)
            return;
        usleep(10000);
    }
    cr_assert_fail("tided never listed worker %d at step %llu", id, (unsigned long long)step);
}

/* A rank holds TIDE_PROTO_SAVES_MAX requests until their steps: tided agrees no more for
   a job while its ranks hold that many (the operator gets BUSY and nothing reaches the
   ranks) and takes requests again once every member completed the step of one. It once
   acknowledged a ninth to the operator ("saves the checkpoint of step 22") that every
   rank then refused, each failure an event after the acknowledgement. */
Test(tided, checkpoint_requests_past_what_the_ranks_hold_are_refused, .init = setup,
     .fini = teardown)
{
    start(NULL);
    fake w[2];
    tide_msg_t m, r;
    train_on(w, 2, 2);
    void *admin = coord_connect(ctx, proc.endpoint, NULL, NULL, NULL, 3000);
    for (int i = 0; i < 2; i++) {
        coord_mk_heartbeat(&m, w[i].id, 10, 1);
        cr_assert_eq(coord_send(w[i].sock, &m), 0);
        wait_worker_step(admin, w[i].id, 10);
    }
    uint64_t first = 0;
    for (int k = 0; k < TIDE_PROTO_SAVES_MAX; k++) {
        char dir[32];
        snprintf(dir, sizeof dir, "/ck/%d", k);
        mk_checkpoint(&m, "train", dir);
        cr_assert_eq(coord_send(admin, &m), 0);
        uint64_t id = 0, step = 0;
        expect_save(w, TIDE_PROTO_SAVE_PROPOSE, &id, &step);
        for (int i = 0; i < 2; i++)
            ack_save(&w[i], id, step, 10);
        expect_save(w, TIDE_PROTO_SAVE_GO, &id, &step);
        admin_reply(admin, &r, TIDE_MSG_OK);
        tide_msg_clear(&r);
        if (k == 0)
            first = step;
    }
    mk_checkpoint(&m, "train", "/ck/over");
    cr_assert_eq(coord_send(admin, &m), 0);
    admin_reply(admin, &r, TIDE_MSG_ERROR);
    cr_expect_eq(r.u.error.code, TIDE_ERR_BUSY);
    cr_expect(strstr(r.u.error.message, "hold 8 checkpoint requests") != NULL, "%s",
              r.u.error.message);
    tide_msg_clear(&r);
    cr_expect_neq(coord_recv_within(w[0].sock, &r, 300), 0, "a refused request reached a rank");

    /* one member completed the first request's step: the other still holds it */
    coord_mk_heartbeat(&m, w[0].id, first, 1);
    cr_assert_eq(coord_send(w[0].sock, &m), 0);
    wait_worker_step(admin, w[0].id, first);
    mk_checkpoint(&m, "train", "/ck/over");
    cr_assert_eq(coord_send(admin, &m), 0);
    admin_reply(admin, &r, TIDE_MSG_ERROR);
    tide_msg_clear(&r);

    /* both did: a new request is proposed */
    coord_mk_heartbeat(&m, w[1].id, first, 1);
    cr_assert_eq(coord_send(w[1].sock, &m), 0);
    wait_worker_step(admin, w[1].id, first);
    uint64_t id = 0, step = 0;
    mk_checkpoint(&m, "train", "/ck/over");
    cr_assert_eq(coord_send(admin, &m), 0);
    expect_save(w, TIDE_PROTO_SAVE_PROPOSE, &id, &step);
    zmq_close(admin);
}
