/*
 * libtide's control client against a fake tided (tests/ctl_fixture.h): registration and its
 * timeout, heartbeats, the prepare/ack/commit exchange at step boundaries, fencing (tided's
 * "fenced" answer, and a rank stopped past its lease fencing itself), and the checkpoint
 * requests a rank holds, answers and reports. A few seconds in total.
 */
#include <criterion/criterion.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zmq.h>

#include "tests/ctl_fixture.h"

/* ---- registration, heartbeats and the switch exchange ------------------------------------- */

Test(ctl, register_heartbeat_prepare_commit_against_fake_tided)
{
    fake f;
    fake_open(&f);
    tide__ctl_t *ctl = start_ctl(&f);
    tide__ctl_set_job(ctl, "jobA");
    /* the training thread: the first layout, two steps */
    trainer_boundary(first_member);
    for (int i = 0; i < 2; i++) {
        trainer_boundary(do_begin);
        cr_assert_eq(tr_begin, TIDE__BEGIN_RUN);
        trainer_boundary(do_end);
    }

    /* heartbeats flow from the background thread with the step and generation */
    tide_msg_t hb;
    fake_expect(&f, TIDE_MSG_HEARTBEAT, &hb, 3000);
    cr_assert_eq(hb.u.heartbeat.worker, 42);
    for (int i = 0; i < 5 && hb.u.heartbeat.step != 2; i++) {
        tide_msg_clear(&hb);
        fake_expect(&f, TIDE_MSG_HEARTBEAT, &hb, 3000);
    }
    cr_assert_eq(hb.u.heartbeat.step, 2);
    cr_assert_eq(hb.u.heartbeat.gen, 1);
    tide_msg_clear(&hb);

    /* layout + prepare: acked at once with the completed steps */
    int32_t w_old[1] = {3}, w_new[2] = {3, 1};
    int s_old[2], s_new[2];
    tide_msg_t m;
    tide_msg_init(&m, TIDE_MSG_LAYOUT);
    snprintf(m.u.layout.job, sizeof m.u.layout.job, "jobA");
    set_layout(&m.u.layout.layout, 2, 2, w_new, s_new);
    m.u.layout.has_prev = 1;
    set_layout(&m.u.layout.prev, 1, 1, w_old, s_old);
    m.u.layout.world = 4; /* one launch of 4 ranks: job ranks are its ranks */
    fake_send(&f, &m);
    tide_msg_init(&m, TIDE_MSG_PREPARE);
    snprintf(m.u.prepare.job, sizeof m.u.prepare.job, "jobA");
    m.u.prepare.gen = 2;
    m.u.prepare.step = 3;
    fake_send(&f, &m);
    tide_msg_t ack;
    fake_expect(&f, TIDE_MSG_PREPARE_ACK, &ack, 3000);
    cr_assert_eq(ack.u.prepare_ack.gen, 2);
    cr_assert_eq(ack.u.prepare_ack.step, 2);
    cr_assert_eq(ack.u.prepare_ack.worker, 42);
    cr_assert_str_eq(ack.u.prepare_ack.job, "jobA");
    tide_msg_clear(&ack);

    /* the training thread hears of the layout and the ack at its boundary: one more step,
       then it must wait for the commit */
    trainer_boundary(do_begin);
    cr_assert_eq(tr_begin, TIDE__BEGIN_RUN);
    trainer_boundary(do_end);
    trainer_boundary(do_begin);
    cr_assert_eq(tr_begin, TIDE__BEGIN_WAIT);
    cr_assert_eq(tr.pending.type, TIDE_MSG_LAYOUT, "the layout came as an intent");
    cr_assert_eq(tr.pending.u.layout.layout.dp, 2);
    tide_msg_init(&m, TIDE_MSG_COMMIT);
    snprintf(m.u.commit.job, sizeof m.u.commit.job, "jobA");
    m.u.commit.gen = 2;
    m.u.commit.step = 3;
    fake_send(&f, &m);
    uint64_t deadline = tide_now_ns() + 3000000000ull;
    while (tr_begin == TIDE__BEGIN_WAIT && tide_now_ns() < deadline) {
        tide__mailbox_wait(tr.intents, 20);
        trainer_boundary(do_begin);
    }
    cr_assert_eq(tr_begin, TIDE__BEGIN_SWITCH, "the commit at step 3 releases the switch");

    /* done goes out; a duplicate commit makes the worker send it again */
    trainer_boundary(do_switched);
    tide_msg_init(&m, TIDE_MSG_DONE);
    m.u.done.worker = 42;
    snprintf(m.u.done.job, sizeof m.u.done.job, "jobA");
    m.u.done.gen = 2;
    m.u.done.bytes_moved = 123;
    cr_assert_eq(tide__ctl_send(ctl, &m), TIDE_OK);
    tide_msg_t done;
    fake_expect(&f, TIDE_MSG_DONE, &done, 3000);
    cr_assert_eq(done.u.done.bytes_moved, 123);
    tide_msg_clear(&done);
    tide_msg_init(&m, TIDE_MSG_COMMIT);
    snprintf(m.u.commit.job, sizeof m.u.commit.job, "jobA");
    m.u.commit.gen = 2;
    m.u.commit.step = 3;
    fake_send(&f, &m);
    fake_expect(&f, TIDE_MSG_DONE, &done, 3000);
    cr_assert_eq(done.u.done.gen, 2);
    tide_msg_clear(&done);

    /* an error saying tided lost us makes the worker register again */
    tide_msg_init(&m, TIDE_MSG_ERROR);
    m.u.error.code = TIDE_ERR_NOT_FOUND;
    snprintf(m.u.error.message, sizeof m.u.error.message, "unknown worker 42: register first");
    fake_send(&f, &m);
    tide_msg_t reg;
    fake_expect(&f, TIDE_MSG_REGISTER, &reg, 3000);
    tide_msg_clear(&reg);

    tide__ctl_destroy(&ctl, 1);
    tide_msg_t bye;
    fake_expect(&f, TIDE_MSG_BYE, &bye, 3000);
    cr_assert_eq(bye.u.bye.worker, 42);
    tide_msg_clear(&bye);
    trainer_close();
    fake_close(&f);
}

Test(ctl, register_times_out_with_a_hint)
{
    fake f;
    fake_open(&f); /* never answers */
    tide__ctl_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.endpoint = f.endpoint;
    snprintf(cfg.reg.pool, sizeof cfg.reg.pool, "p");
    cfg.reg.size = 1;
    snprintf(cfg.reg.host, sizeof cfg.reg.host, "h");
    cfg.reg.pid = 1;
    cfg.register_timeout_ms = 200;
    trainer_open();
    cfg.intents = tr.intents;
    cfg.progress = &tr.progress;
    cfg.gens = tr.gens;
    tide__ctl_t *ctl = NULL;
    cr_assert_eq(tide__ctl_new(&ctl, &cfg), TIDE_ERR_TIMEOUT);
    cr_assert_null(ctl);
    cr_assert(strstr(tide_last_error(), "TIDE_ENDPOINT") != NULL, "%s", tide_last_error());
    cfg.endpoint = "nonsense://x";
    cr_assert_eq(tide__ctl_new(&ctl, &cfg), TIDE_ERR_INVALID);
    trainer_close();
    fake_close(&f);
}

/* ---- fencing: tided's word, or the rank's own lease --------------------------------------- */

/* 1 once the control thread said the rank is fenced (waits up to ms), its reason into
   why: a fenced intent for the training thread. */
static int wait_fenced(char *why, size_t len, int ms)
{
    uint64_t deadline = tide_now_ns() + (uint64_t)ms * 1000000ull;
    trainer_boundary(NULL);
    while (!tr.fenced && tide_now_ns() < deadline) {
        tide__mailbox_wait(tr.intents, 20);
        trainer_boundary(NULL);
    }
    snprintf(why, len, "%s", tr.fence_why);
    return tr.fenced;
}

/* tided's "fenced" answer: the rank's communicators are aborted, its lease expires at once
   (no further MPI call), it stops heartbeating and never registers again. */
Test(ctl, tideds_fenced_answer_aborts_and_silences_the_rank)
{
    fake f;
    fake_open(&f);
    tide__ctl_t *ctl = start_ctl(&f);
    tide__ctl_set_job(ctl, "jobA");
    trainer_boundary(first_member);
    /* the running generation's word (its groups watch it) and one announced later */
    tide__gen_t *run = tide__gens_get(tr.gens, 1), *later = tide__gens_get(tr.gens, 2);
    tide_msg_t m;
    fake_expect(&f, TIDE_MSG_HEARTBEAT, &m, 3000);
    tide_msg_clear(&m);
    cr_assert_eq(tide_coll_lease_expired(), 0, "a heartbeating rank holds its lease");
    tide_msg_init(&m, TIDE_MSG_FENCED);
    m.u.fenced.worker = 42;
    snprintf(m.u.fenced.job, sizeof m.u.fenced.job, "jobA");
    m.u.fenced.gen = 2;
    snprintf(m.u.fenced.reason, sizeof m.u.fenced.reason, "went on without it");
    fake_send(&f, &m);
    char why[TIDE_PROTO_TEXT_MAX + 1];
    cr_assert(wait_fenced(why, sizeof why, 3000), "the fenced answer was not taken");
    cr_assert(strstr(why, "tided fenced worker 42: went on without it") != NULL, "%s", why);
    cr_assert(tide__gen_aborted(run) && tide__gen_aborted(later),
              "the step's and a switch's communicators are aborted (their words)");
    tide__gen_put(&run);
    tide__gen_put(&later);
    cr_assert_eq(tide_coll_lease_expired(), 1, "no further call into MPI");
    /* nothing more: no heartbeat, and no registration even when asked */
    tide_msg_init(&m, TIDE_MSG_ERROR);
    m.u.error.code = TIDE_ERR_STALE;
    snprintf(m.u.error.message, sizeof m.u.error.message, "worker 42 is failed: register again");
    fake_send(&f, &m);
    cr_assert_eq(fake_sees(&f, TIDE_MSG_HEARTBEAT, 400), 0, "a fenced rank heartbeats");
    cr_assert_eq(fake_sees(&f, TIDE_MSG_REGISTER, 1200), 0, "a fenced rank registers again");
    tide__ctl_destroy(&ctl, 0);
    tide_coll_lease_set(0);
    trainer_close();
    fake_close(&f);
}

/* Sends the parent SIGSTOP after 100 ms and SIGCONT stop_ms later, then exits. */
static pid_t stop_me(int stop_ms)
{
    pid_t parent = getpid();
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        usleep(100 * 1000);
        kill(parent, SIGSTOP);
        usleep((useconds_t)stop_ms * 1000);
        kill(parent, SIGCONT);
        _exit(0);
    }
    return pid;
}

/* A member stopped past tided's failure timeout fences itself when it resumes, before
   tided says anything: its lease has run out (no MPI call may follow), its communicators
   are aborted, and it reports the failure so that the job recovers without it. A rank
   stopped as long outside any layout only renews its lease. */
Test(ctl, a_member_stopped_past_its_lease_fences_itself)
{
    fake f;
    fake_open(&f);
    tide__ctl_t *ctl = start_ctl_lease(&f, 300);
    tide__ctl_set_job(ctl, "jobA");
    trainer_boundary(first_idle); /* idle first: outside the layout */
    tide__gen_t *run = tide__gens_get(tr.gens, 1);
    pid_t helper = stop_me(600);
    waitpid(helper, NULL, 0); /* returns once we were stopped and resumed */
    tide_msg_t m;
    fake_expect(&f, TIDE_MSG_HEARTBEAT, &m, 3000); /* it goes on heartbeating */
    tide_msg_clear(&m);
    char why[TIDE_PROTO_TEXT_MAX + 1];
    cr_assert_eq(wait_fenced(why, sizeof why, 300), 0, "an idle rank fenced itself: %s", why);
    cr_assert_eq(tide_coll_lease_expired(), 0);
    /* now a member */
    trainer_boundary(first_member);
    fake_expect(&f, TIDE_MSG_HEARTBEAT, &m, 3000);
    tide_msg_clear(&m);
    helper = stop_me(600);
    waitpid(helper, NULL, 0);
    cr_assert_eq(tide_coll_lease_expired(), 1,
                 "past its lease before the heartbeat thread even runs again");
    fake_expect(&f, TIDE_MSG_FAILURE, &m, 3000);
    cr_assert_eq(m.u.failure.worker, 42);
    cr_assert_eq(m.u.failure.code, TIDE_ERR_STALE);
    cr_assert_str_eq(m.u.failure.job, "jobA");
    cr_assert(strstr(m.u.failure.reason, "past tided's failure timeout of 300 ms") != NULL, "%s",
              m.u.failure.reason);
    tide_msg_clear(&m);
    cr_assert(wait_fenced(why, sizeof why, 3000));
    cr_assert(strstr(why, "sent no heartbeat for") != NULL, "%s", why);
    cr_assert(tide__gen_aborted(run), "the step's communicators are aborted (their word)");
    tide__gen_put(&run);
    cr_assert_eq(fake_sees(&f, TIDE_MSG_HEARTBEAT, 300), 0, "a fenced rank heartbeats");
    tide__ctl_destroy(&ctl, 0);
    tide_coll_lease_set(0);
    trainer_close();
    fake_close(&f);
}

/* ---- checkpoint requests on a rank ------------------------------------------------------- */

/* Rank 3 of job "jobA" as far as its checkpoint requests go: a tide_t holding its rank, its
   job and a control client registered with a fake tided opened into f (close_rank ends
   them). */
static tide_t *ckpt_rank(fake *f)
{
    fake_open(f);
    tide_t *t = calloc(1, sizeof *t);
    cr_assert_not_null(t);
    t->ctl = start_ctl(f);
    t->rank = 3;
    snprintf(t->job, sizeof t->job, "jobA");
    return t;
}

/* Ends what ckpt_rank started, with the layout a test gave the rank, then the trainer and f. */
static void close_rank(tide_t *t, fake *f)
{
    tide__ctl_destroy(&t->ctl, 0);
    tide_layout_destroy(&t->layout);
    free(t);
    trainer_close();
    fake_close(f);
}

/* tided's decided request (GO) of a checkpoint of `step`, as the training thread applies it. */
static void save_go(tide_t *t, uint64_t id, int64_t step)
{
    tide_proto_save_t m;
    memset(&m, 0, sizeof m);
    snprintf(m.job, sizeof m.job, "jobA");
    snprintf(m.dir, sizeof m.dir, "/ckpt");
    m.step = (uint64_t)step;
    m.id = id;
    m.phase = TIDE_PROTO_SAVE_GO;
    tide__ckpt_request(t, &m);
}

/* tided sends its checkpoint requests to every rank of the job, idle ones too (a resize may
   make them members by the request's step). An idle rank keeps what it hears without
   complaint, and once a switch makes it a member, the requests whose steps the members of
   then took are forgotten, not reported as missed: tided would turn such a report into a
   checkpoint_failed event for a checkpoint the job took. A member reports one it missed. */
Test(ckpt_requests, an_idle_rank_promoted_past_a_request_reports_nothing)
{
    fake f;
    tide_t *t = ckpt_rank(&f);
    t->view.member = 0;
    for (int i = 0; i < TIDE__SAVES_MAX + 3; i++) /* more than a member may hold */
        save_go(t, 100 + (uint64_t)i, 2 + i);
    save_go(t, 200, 40);
    cr_assert_eq(t->n_saves, TIDE__SAVES_MAX, "an idle rank keeps the newest requests");
    tide__ckpt_switched(t, 9); /* promoted at the boundary of step 9 */
    cr_assert_eq(t->n_saves, 4, "the requests past the switch stay: steps 10, 11, 12, 40");
    cr_assert_eq(t->saves[0].step, 10, "%lld", (long long)t->saves[0].step);
    t->view.member = 1;
    t->view.step = 10; /* its first step end as a member takes step 10's (no buffers here) */
    tide__ckpt_step_end(t);
    cr_assert_eq(t->n_saves, 3);
    t->n_saves = 0;
    /* a member that hears of a request after its step reports it; this is the first
       report tided gets (the control thread sends them in order) */
    save_go(t, 300, 7);
    tide__ckpt_step_end(t);
    tide_msg_t m;
    fake_expect(&f, TIDE_MSG_SAVED, &m, 3000);
    cr_assert_eq(m.u.saved.step, 7, "tided heard of step %llu first",
                 (unsigned long long)m.u.saved.step);
    cr_assert_eq(m.u.saved.code, TIDE_ERR_STALE);
    cr_assert(strstr(m.u.saved.reason, "after the step it asked for") != NULL, "%s",
              m.u.saved.reason);
    tide_msg_clear(&m);
    close_rank(t, &f);
}

/* tided's checkpoint proposal of `step` (id), as the fake sends it. */
static void send_proposal(fake *f, uint64_t id, uint64_t step)
{
    tide_msg_t m;
    tide_msg_init(&m, TIDE_MSG_SAVE);
    snprintf(m.u.save.job, sizeof m.u.save.job, "jobA");
    snprintf(m.u.save.dir, sizeof m.u.save.dir, "/ckpt-late");
    m.u.save.step = step;
    m.u.save.id = id;
    m.u.save.phase = TIDE_PROTO_SAVE_PROPOSE;
    fake_send(f, &m);
}

/* A request that reaches a job's first member after its last step's drain (test_job_speed
   once lost one so, under load): the control thread answered it, so tided agreed its step,
   and the rank must say the job ended first when it leaves. A proposal read after that last
   drain goes unanswered: tided gives it up when the rank leaves, instead of agreeing a step
   nobody will take or report. */
Test(ckpt_requests, a_request_heard_after_the_last_step_is_reported_when_the_rank_leaves)
{
    fake f;
    tide_t *t = ckpt_rank(&f);
    tide__ctl_set_job(t->ctl, "jobA");
    t->intents = tr.intents;
    cr_assert_eq(tide_layout_new(&t->layout, 2, 1, 1, 2, 1), TIDE_OK);
    t->layout->worker[0] = 3; /* the layout's first member: it speaks for the job */
    t->view.member = 1;
    t->view.step = 100;
    tide__agree_first(&tr.a, 1, 1);
    tr.a.completed = 100;
    tide__progress_set(&tr.progress, &tr.a);

    send_proposal(&f, 7, 106);
    tide_msg_t m;
    fake_expect(&f, TIDE_MSG_SAVE_ACK, &m, 3000);
    cr_assert_eq(m.u.save_ack.id, 7);
    cr_assert_eq(m.u.save_ack.done, 100, "the rank had completed 100 steps");
    tide_msg_clear(&m);
    /* what tide_destroy does first: the last drain, then the requests left are reported */
    tide__drain_last(t);
    cr_assert_eq(t->n_saves, 1, "the answered proposal is heard");
    tide__ckpt_destroy(t);
    fake_expect(&f, TIDE_MSG_SAVED, &m, 3000);
    cr_assert_eq(m.u.saved.step, 106);
    cr_assert_eq(m.u.saved.code, TIDE_ERR_STALE);
    cr_assert(strstr(m.u.saved.reason, "the job ended at step 100, before step 106") != NULL, "%s",
              m.u.saved.reason);
    tide_msg_clear(&m);

    send_proposal(&f, 8, 107);
    cr_assert_eq(fake_sees(&f, TIDE_MSG_SAVE_ACK, 500), 0,
                 "a leaving rank answered a proposal it will neither take nor report");
    tide_msg_t left;
    cr_assert_neq(tide__mailbox_pop(tr.intents, &left, 0), TIDE_OK, "nothing queued after it");
    close_rank(t, &f);
}
