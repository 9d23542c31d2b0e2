/*
 * Unit tests for libtide's pieces that need no cluster: the mailbox, the step-agreement
 * state machine (directly, then through the control client against a fake tided ROUTER
 * socket speaking proto over ZeroMQ), and the offline command runner with preemption
 * (SIGTERM, grace, SIGKILL, exit codes reported to tided). A few seconds in total.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zmq.h>

#include "core/clock.h"
#include "core/error.h"
#include "proto/proto.h"
#include "worker/tide_int.h"
#include "worker/worker_int.h"

/* ---- mailbox ------------------------------------------------------------------------------ */

Test(mailbox, fifo_timeout_and_close)
{
    tide__mailbox_t *mb = NULL;
    cr_assert_eq(tide__mailbox_new(&mb), TIDE_OK);
    for (int i = 0; i < 3; i++) {
        tide_msg_t m;
        tide_msg_init(&m, TIDE_MSG_PREPARE);
        m.u.prepare.gen = (uint64_t)i + 1;
        cr_assert_eq(tide__mailbox_push(mb, &m), TIDE_OK);
        cr_assert_eq(m.type, TIDE_MSG_NONE, "push moves the message in");
    }
    cr_assert_eq(tide__mailbox_len(mb), 3);
    for (int i = 0; i < 3; i++) {
        tide_msg_t m;
        cr_assert_eq(tide__mailbox_pop(mb, &m, 0), TIDE_OK);
        cr_assert_eq(m.u.prepare.gen, (uint64_t)i + 1, "FIFO order");
    }
    tide_msg_t m;
    uint64_t t0 = tide_now_ns();
    cr_assert_eq(tide__mailbox_pop(mb, &m, 30), TIDE_ERR_TIMEOUT);
    cr_assert_geq(tide_now_ns() - t0, 25000000ull, "waited the timeout");
    tide__mailbox_close(mb);
    cr_assert_eq(tide__mailbox_pop(mb, &m, -1), TIDE_ERR_CLOSED, "closed wakes a forever wait");
    tide_msg_init(&m, TIDE_MSG_OK);
    cr_assert_eq(tide__mailbox_push(mb, &m), TIDE_ERR_CLOSED);
    tide__mailbox_destroy(&mb);
    cr_assert_null(mb);
}

static void *late_push(void *arg)
{
    tide_sleep_ms(40);
    tide_msg_t m;
    tide_msg_init(&m, TIDE_MSG_COMMIT);
    m.u.commit.step = 77;
    tide__mailbox_push(arg, &m);
    return NULL;
}

Test(mailbox, pop_wakes_on_push_from_another_thread)
{
    tide__mailbox_t *mb = NULL;
    cr_assert_eq(tide__mailbox_new(&mb), TIDE_OK);
    pthread_t th;
    pthread_create(&th, NULL, late_push, mb);
    tide_msg_t m;
    cr_assert_eq(tide__mailbox_pop(mb, &m, 5000), TIDE_OK);
    cr_assert_eq(m.type, TIDE_MSG_COMMIT);
    cr_assert_eq(m.u.commit.step, 77);
    pthread_join(th, NULL);
    tide__mailbox_destroy(&mb);
}

/* A message built inside the mailbox's lock (push_with), and a drain that applies every
   queued message and then runs its own step before any later push. */
static int build_commit(void *ctx, tide_msg_t *out)
{
    int *n = ctx;
    if (*n < 0)
        return 0; /* declined: nothing queued */
    tide_msg_init(out, TIDE_MSG_COMMIT);
    out->u.commit.step = (uint64_t)(*n)++;
    return 1;
}

static void count_step(void *ctx, tide_msg_t *m)
{
    int *seen = ctx;
    cr_assert_eq(m->type, TIDE_MSG_COMMIT);
    cr_assert_eq(m->u.commit.step, (uint64_t)*seen, "FIFO order");
    (*seen)++;
}

static void after(void *ctx)
{
    *(int *)ctx = 100;
}

Test(mailbox, push_with_and_drain)
{
    tide__mailbox_t *mb = NULL;
    cr_assert_eq(tide__mailbox_new(&mb), TIDE_OK);
    int n = 0;
    for (int i = 0; i < 3; i++)
        cr_assert_eq(tide__mailbox_push_with(mb, build_commit, &n), TIDE_OK);
    int no = -1;
    cr_assert_eq(tide__mailbox_push_with(mb, build_commit, &no), TIDE_OK);
    cr_assert_eq(tide__mailbox_len(mb), 3, "a declined build queues nothing");
    int seen = 0, then = 0;
    tide__mailbox_drain(mb, count_step, &seen, after, &then);
    cr_assert_eq(seen, 3);
    cr_assert_eq(then, 100, "then runs after the drain");
    cr_assert_eq(tide__mailbox_len(mb), 0);
    uint64_t t0 = tide_now_ns();
    tide__mailbox_wait(mb, 30);
    cr_assert_geq(tide_now_ns() - t0, 25000000ull, "waited the timeout");
    tide__mailbox_destroy(&mb);
}

/* ---- abort words ---------------------------------------------------------------------------- */

Test(gens, abort_and_commit_race_decided_once)
{
    tide__gens_t *gs = NULL;
    cr_assert_eq(tide__gens_new(&gs), TIDE_OK);
    /* tided aborts a pending generation: its word is set, and no commit can follow */
    tide__gen_t *g2 = tide__gens_get(gs, 2);
    cr_assert_not_null(g2);
    cr_assert_eq(*tide__gen_word(g2), 0);
    cr_assert_eq(tide__gens_abort(gs, 2), TIDE__GEN_PENDING, "the state it found");
    cr_assert(tide__gen_aborted(g2));
    cr_assert_eq(tide__gen_switching(g2), 0, "no switch to an aborted generation");
    cr_assert_eq(tide__gen_commit(g2), 0, "nor its commit");
    cr_assert_eq(tide__gens_abort(gs, 2), TIDE__GEN_ABORTED);
    /* the switch commits first: the abort comes too late and says so, leaving the word */
    tide__gen_t *g3 = tide__gens_get(gs, 3);
    cr_assert_eq(tide__gen_switching(g3), 1);
    cr_assert_eq(tide__gens_in_switch(gs), 1, "a switch runs");
    cr_assert_eq(tide__gen_commit(g3), 1);
    cr_assert_eq(tide__gens_in_switch(gs), 0);
    cr_assert_eq(tide__gens_abort(gs, 3), TIDE__GEN_COMMITTED);
    cr_assert_eq(tide__gen_aborted(g3), 0, "a committed generation's groups live on");
    /* a switch that failed: pending again, and tided's abort then takes it */
    tide__gen_t *g4 = tide__gens_get(gs, 4);
    cr_assert_eq(tide__gen_switching(g4), 1);
    tide__gen_switch_failed(g4);
    cr_assert_eq(tide__gens_in_switch(gs), 0);
    cr_assert_eq(tide__gens_state(gs, 4), TIDE__GEN_PENDING);
    cr_assert_eq(tide__gens_abort(gs, 4), TIDE__GEN_PENDING);
    cr_assert_eq(tide__gens_abort(gs, 99), TIDE__GEN_UNKNOWN, "no such word: nothing set");
    /* a step's abort sets the word whatever the state; the words above a generation */
    tide__gens_kill(gs, 3);
    cr_assert(tide__gen_aborted(g3));
    tide__gen_t *g5 = tide__gens_get(gs, 5), *g6 = tide__gens_get(gs, 6);
    tide__gens_kill_above(gs, 5);
    cr_assert(!tide__gen_aborted(g5) && tide__gen_aborted(g6));
    /* retired: no longer listed (a new word for it is fresh), held words live on */
    tide__gens_retire(gs, 6);
    cr_assert_eq(tide__gens_state(gs, 5), TIDE__GEN_UNKNOWN);
    cr_assert_eq(tide__gens_state(gs, 6), TIDE__GEN_PENDING);
    cr_assert(tide__gen_aborted(g3), "a holder keeps its word");
    /* a halt: every word, and every word made later */
    tide__gens_kill_all(gs);
    tide__gen_t *g7 = tide__gens_get(gs, 7);
    cr_assert(tide__gen_aborted(g6) && tide__gen_aborted(g7));
    tide__gen_t *extra = tide__gen_ref(g7);
    tide__gens_destroy(&gs);
    cr_assert_null(gs);
    cr_assert(tide__gen_aborted(extra), "words outlive the registry while held");
    tide__gen_t *all[] = {g2, g3, g4, g5, g6, g7, extra};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        tide__gen_put(&all[i]);
}

/* ---- agreement state machine --------------------------------------------------------------- */

static void run_steps(tide__agree *a, int n)
{
    for (int i = 0; i < n; i++) {
        cr_assert_eq(tide__agree_begin(a), TIDE__BEGIN_RUN);
        cr_assert_eq(tide__agree_end(a, 1), 0);
    }
}

Test(agree, resize_waits_one_step_after_ack_then_switches_at_S)
{
    tide__agree a;
    tide__agree_init(&a, 0);
    tide__agree_first(&a, 1, 1);
    run_steps(&a, 5);
    cr_assert_eq(tide__agree_layout(&a, 2, 1, 1), 1);
    int64_t ack = -1;
    cr_assert_eq(tide__agree_prepare(&a, 2, &ack), 1);
    cr_assert_eq(ack, 5, "ack reports the completed steps");
    run_steps(&a, 1); /* one more step is allowed */
    cr_assert_eq(tide__agree_begin(&a), TIDE__BEGIN_WAIT, "then it waits for the commit");
    int64_t again = -1;
    cr_assert_eq(tide__agree_prepare(&a, 2, &again), 1, "a duplicate prepare is answered");
    cr_assert_eq(again, 5, "with the same step");
    /* another rank acked 6, so S = 7: this rank runs step 6 then switches */
    cr_assert_eq(tide__agree_commit(&a, 2, 7, 0), TIDE__COMMIT_OK);
    run_steps(&a, 1);
    cr_assert_eq(tide__agree_begin(&a), TIDE__BEGIN_SWITCH);
    cr_assert_eq(tide__agree_begin(&a), TIDE__BEGIN_WAIT, "only one switch");
    tide__agree_switched(&a);
    cr_assert_eq(a.gen, 2);
    cr_assert_eq(a.completed, 7);
    cr_assert_eq(tide__agree_commit(&a, 2, 7, 0), TIDE__COMMIT_DUP, "late commit: resend done");
    cr_assert_eq(tide__agree_abort(&a, 2), TIDE__ABORT_SWITCHED);
    run_steps(&a, 1);
}

Test(agree, recovery_abandons_the_step_in_progress)
{
    tide__agree a;
    tide__agree_init(&a, 10);
    tide__agree_first(&a, 3, 1);
    cr_assert_eq(tide__agree_begin(&a), TIDE__BEGIN_RUN); /* step 10 hangs on a dead peer */
    cr_assert_eq(tide__agree_layout(&a, 4, 1, 1), 1);
    int64_t ack;
    cr_assert_eq(tide__agree_prepare(&a, 4, &ack), 1);
    cr_assert_eq(ack, 10);
    cr_assert_eq(tide__agree_commit(&a, 4, 10, 1), TIDE__COMMIT_ABORT_STEP);
    cr_assert_eq(tide__agree_end(&a, 0), 0, "the aborted step is not counted");
    cr_assert_eq(a.completed, 10);
    cr_assert_eq(tide__agree_begin(&a), TIDE__BEGIN_SWITCH);
}

/* A member dies while tide_join builds the first layout's communicators: the recovery's
   commit tells the control thread to abandon the build (else it waits for the dead
   member until the switch timeout), and the rank, with no communicators, switches. */
Test(agree, a_recovery_abandons_the_first_layouts_build)
{
    tide__agree a;
    tide__agree_init(&a, 5);
    tide__agree_first(&a, 1, 1);
    a.building = 1;
    cr_assert_eq(tide__agree_layout(&a, 2, 1, 1), 1);
    int64_t ack;
    cr_assert_eq(tide__agree_prepare(&a, 2, &ack), 1);
    cr_assert_eq(ack, 5);
    cr_assert_eq(tide__agree_commit(&a, 2, 5, 1), TIDE__COMMIT_ABORT_BUILD);
    a.building = 0;
    a.groups_dead = 1; /* tide_join: the build was abandoned */
    cr_assert_eq(tide__agree_begin(&a), TIDE__BEGIN_SWITCH, "the recovery's switch, no step");
    tide__agree_switched(&a);
    cr_assert_eq(a.groups_dead, 0, "the switch brought communicators");
    cr_assert_eq(tide__agree_begin(&a), TIDE__BEGIN_RUN);
}

/* Only a recovery from the layout being built abandons it: a resize announced meanwhile
   waits for it, and a rank outside the old layout builds nothing. */
Test(agree, only_a_recovery_abandons_the_build)
{
    tide__agree a;
    tide__agree_init(&a, 0);
    tide__agree_first(&a, 1, 1);
    a.building = 1;
    cr_assert_eq(tide__agree_layout(&a, 2, 1, 1), 1);
    int64_t ack;
    cr_assert_eq(tide__agree_prepare(&a, 2, &ack), 1);
    cr_assert_eq(tide__agree_commit(&a, 2, 0, 0), TIDE__COMMIT_OK, "a resize");
    tide__agree b;
    tide__agree_init(&b, 0);
    tide__agree_first(&b, 1, 0);
    b.building = 0;
    cr_assert_eq(tide__agree_layout(&b, 2, 1, 0), 1);
    cr_assert_eq(tide__agree_prepare(&b, 2, &ack), 1);
    cr_assert_eq(tide__agree_commit(&b, 2, 0, 1), TIDE__COMMIT_OK, "not in the old layout");
}

/* A step that failed on dead communicators (nccl's socket error with every peer alive)
   is not retried on them: the rank waits at the boundary until a new layout switches
   it to new ones (libtide bounds that wait: tide_step_begin). */
Test(agree, dead_groups_run_no_step_until_a_switch)
{
    tide__agree a;
    tide__agree_init(&a, 0);
    tide__agree_first(&a, 1, 1);
    run_steps(&a, 3);
    cr_assert_eq(tide__agree_begin(&a), TIDE__BEGIN_RUN);
    cr_assert_eq(tide__agree_end(&a, 0), 0);
    a.groups_dead = 1;
    for (int i = 0; i < 3; i++)
        cr_assert_eq(tide__agree_begin(&a), TIDE__BEGIN_WAIT, "a step on dead communicators");
    cr_assert_eq(tide__agree_layout(&a, 2, 1, 1), 1);
    int64_t ack;
    cr_assert_eq(tide__agree_prepare(&a, 2, &ack), 1);
    cr_assert_eq(ack, 3);
    cr_assert_eq(tide__agree_begin(&a), TIDE__BEGIN_WAIT, "announced, not committed");
    cr_assert_eq(tide__agree_commit(&a, 2, 3, 1), TIDE__COMMIT_OK);
    cr_assert_eq(tide__agree_begin(&a), TIDE__BEGIN_SWITCH);
    tide__agree_switched(&a);
    cr_assert_eq(tide__agree_begin(&a), TIDE__BEGIN_RUN, "new communicators: steps again");
}

Test(agree, idle_rank_waits_for_commit_and_abort_clears)
{
    tide__agree a;
    tide__agree_init(&a, 0);
    tide__agree_first(&a, 1, 0);
    cr_assert_eq(tide__agree_begin(&a), TIDE__BEGIN_WAIT, "outside the layout: idle");
    cr_assert_eq(tide__agree_layout(&a, 2, 1, 0), 1);
    int64_t ack;
    cr_assert_eq(tide__agree_prepare(&a, 2, &ack), 1);
    cr_assert_eq(tide__agree_begin(&a), TIDE__BEGIN_WAIT);
    cr_assert_eq(tide__agree_abort(&a, 2), TIDE__ABORT_CLEARED);
    cr_assert_eq(a.p_gen, 0);
    cr_assert_eq(tide__agree_commit(&a, 2, 9, 0), TIDE__COMMIT_IGNORED, "aborted: ignored");
    cr_assert_eq(tide__agree_layout(&a, 2, 1, 0), 0, "an older generation is refused");
    cr_assert_eq(tide__agree_layout(&a, 3, 1, 0), 1);
    cr_assert_eq(tide__agree_prepare(&a, 3, &ack), 1);
    cr_assert_eq(tide__agree_commit(&a, 3, 9, 0), TIDE__COMMIT_OK);
    cr_assert_eq(tide__agree_begin(&a), TIDE__BEGIN_SWITCH);
    cr_assert_eq(tide__agree_abort(&a, 3), TIDE__ABORT_SWITCHING, "abort during the switch");
    tide__agree_switch_failed(&a);
    cr_assert_eq(a.p_gen, 0, "aborted while switching, then failed: nothing is pending");
    cr_assert_eq(a.gen, 1, "the old generation goes on");
    cr_assert_eq(tide__agree_begin(&a), TIDE__BEGIN_WAIT, "still idle");
    cr_assert_eq(tide__agree_layout(&a, 4, 1, 0), 1, "the next generation is taken");
    cr_assert_eq(tide__agree_prepare(&a, 4, &ack), 1);
    cr_assert_eq(tide__agree_commit(&a, 4, 9, 0), TIDE__COMMIT_OK);
    cr_assert_eq(tide__agree_begin(&a), TIDE__BEGIN_SWITCH);
    tide__agree_switched(&a);
    cr_assert_eq(a.completed, 9, "joins at the switch step");
    cr_assert_eq(a.member, 1);
}

Test(agree, member_whose_switch_fails_after_an_abort_runs_the_old_generation)
{
    /* a join that timed out or was aborted by tided leaves the job on its layout */
    tide__agree a;
    tide__agree_init(&a, 5);
    tide__agree_first(&a, 1, 1);
    cr_assert_eq(tide__agree_begin(&a), TIDE__BEGIN_RUN);
    cr_assert_eq(tide__agree_layout(&a, 2, 1, 1), 1);
    int64_t ack;
    cr_assert_eq(tide__agree_prepare(&a, 2, &ack), 1);
    cr_assert_eq(ack, 5);
    cr_assert_eq(tide__agree_end(&a, 1), 0);
    cr_assert_eq(tide__agree_commit(&a, 2, 6, 0), TIDE__COMMIT_OK);
    cr_assert_eq(tide__agree_begin(&a), TIDE__BEGIN_SWITCH);
    /* the switch fails first (its own deadline), tided's abort comes after */
    tide__agree_switch_failed(&a);
    cr_assert_eq(tide__agree_begin(&a), TIDE__BEGIN_WAIT, "failed: waits for tided");
    cr_assert_eq(tide__agree_abort(&a, 2), TIDE__ABORT_CLEARED);
    cr_assert_eq(tide__agree_begin(&a), TIDE__BEGIN_RUN, "then trains on generation 1");
    cr_assert_eq(a.gen, 1);
    cr_assert_eq(tide__agree_end(&a, 1), 0);
    /* tided's abort first (while switching), then the switch fails */
    cr_assert_eq(tide__agree_layout(&a, 3, 1, 1), 1);
    cr_assert_eq(tide__agree_prepare(&a, 3, &ack), 1);
    cr_assert_eq(tide__agree_end(&a, 1), -1, "no step is running");
    cr_assert_eq(tide__agree_commit(&a, 3, 7, 0), TIDE__COMMIT_OK);
    cr_assert_eq(tide__agree_begin(&a), TIDE__BEGIN_SWITCH);
    cr_assert_eq(tide__agree_abort(&a, 3), TIDE__ABORT_SWITCHING);
    tide__agree_switch_failed(&a);
    cr_assert_eq(tide__agree_begin(&a), TIDE__BEGIN_RUN, "no abort left to wait for");
    cr_assert_eq(a.gen, 1);
    cr_assert_eq(a.completed, 7);
}

/* A rank in step 10 of generation 3 that marked the step can_finish, then got the
   layout and prepare of generation 4; *ack: what it acked. */
static void in_can_finish_step(tide__agree *a, int64_t *ack)
{
    tide__agree_init(a, 10);
    tide__agree_first(a, 3, 1);
    cr_assert_eq(tide__agree_begin(a), TIDE__BEGIN_RUN);
    tide__agree_can_finish(a);
    cr_assert_eq(tide__agree_layout(a, 4, 1, 1), 1);
    cr_assert_eq(tide__agree_prepare(a, 4, ack), 1);
}

/* A peer died inside the last reduction of step 10, after this rank could finish the
   step alone; others completed it. The recovery switches after step 10 (S = 11): this
   rank's reduction is abandoned, it finishes the step alone, then switches. */
Test(agree, recovery_has_a_rank_stuck_after_can_finish_finish_its_step)
{
    tide__agree a;
    int64_t ack;
    in_can_finish_step(&a, &ack);
    cr_assert_eq(ack, 11, "the step in progress can be completed: ack one more");
    cr_assert_eq(tide__agree_commit(&a, 4, 11, 1), TIDE__COMMIT_ABORT_STEP,
                 "its last reduction waits for the dead peer: abandon it");
    cr_assert_eq(tide__agree_end(&a, 0), 0);
    cr_assert_eq(a.completed, 10);
    cr_assert_eq(tide__agree_begin(&a), TIDE__BEGIN_FINISH);
    cr_assert_eq(tide__agree_end(&a, 1), 0);
    cr_assert_eq(a.completed, 11);
    cr_assert_eq(tide__agree_begin(&a), TIDE__BEGIN_SWITCH);
}

/* The same rank when the recovery switches before that step (another survivor could not
   get as far): the step is dropped and redone under the new layout. */
Test(agree, a_can_finish_step_is_dropped_when_the_recovery_switches_before_it)
{
    tide__agree a;
    int64_t ack;
    in_can_finish_step(&a, &ack);
    cr_assert_eq(tide__agree_commit(&a, 4, 10, 1), TIDE__COMMIT_ABORT_STEP);
    cr_assert_eq(tide__agree_end(&a, 0), 0);
    cr_assert_eq(tide__agree_begin(&a), TIDE__BEGIN_SWITCH);
    tide__agree_switched(&a);
    cr_assert_eq(a.completed, 10);
    cr_assert_eq(tide__agree_begin(&a), TIDE__BEGIN_RUN, "step 10 again, new layout");
}

/* A step that failed after can_finish before any commit waits for it; a resize (not a
   recovery) never abandons a step that may still end at S. */
Test(agree, a_failed_can_finish_step_waits_and_resizes_leave_it_alone)
{
    tide__agree a;
    int64_t ack;
    in_can_finish_step(&a, &ack);
    cr_assert_eq(tide__agree_end(&a, 0), 0);
    cr_assert_eq(tide__agree_begin(&a), TIDE__BEGIN_WAIT, "the commit decides");
    cr_assert_eq(tide__agree_commit(&a, 4, 11, 1), TIDE__COMMIT_OK);
    cr_assert_eq(tide__agree_begin(&a), TIDE__BEGIN_FINISH);

    tide__agree b;
    in_can_finish_step(&b, &ack);
    cr_assert_eq(tide__agree_commit(&b, 4, 11, 0), TIDE__COMMIT_OK, "a resize: the step ends");
    cr_assert_eq(tide__agree_end(&b, 1), 0);
    cr_assert_eq(tide__agree_begin(&b), TIDE__BEGIN_SWITCH);
}

Test(agree, stale_rank_past_the_switch_step)
{
    tide__agree a;
    tide__agree_init(&a, 0);
    tide__agree_first(&a, 1, 1);
    run_steps(&a, 4);
    cr_assert_eq(tide__agree_layout(&a, 2, 1, 1), 1);
    int64_t ack;
    cr_assert_eq(tide__agree_prepare(&a, 2, &ack), 1);
    run_steps(&a, 1);
    cr_assert_eq(tide__agree_commit(&a, 2, 3, 1), TIDE__COMMIT_OK); /* recovery: min = 3 */
    cr_assert_eq(tide__agree_begin(&a), TIDE__BEGIN_STALE);
    cr_assert_eq(tide__agree_end(&a, 1), -1, "no step begun");
}

/* ---- control client against a fake tided ---------------------------------------------------- */

typedef struct fake {
    void *ctx, *router;
    char endpoint[128];
    unsigned char rid[256];
    size_t rid_len;
} fake;

static void fake_open(fake *f)
{
    memset(f, 0, sizeof *f);
    f->ctx = zmq_ctx_new();
    f->router = zmq_socket(f->ctx, ZMQ_ROUTER);
    int linger = 0;
    zmq_setsockopt(f->router, ZMQ_LINGER, &linger, sizeof linger);
    cr_assert_eq(zmq_bind(f->router, "tcp://127.0.0.1:*"), 0);
    size_t len = sizeof f->endpoint;
    zmq_getsockopt(f->router, ZMQ_LAST_ENDPOINT, f->endpoint, &len);
}

static void fake_close(fake *f)
{
    zmq_close(f->router);
    zmq_ctx_term(f->ctx);
}

/* Receives the next message of type `want` (others, heartbeats included, are skipped and
   counted into *skipped when given); fails after timeout_ms. */
static void fake_expect(fake *f, tide_msg_type_t want, tide_msg_t *out, int timeout_ms)
{
    uint64_t deadline = tide_now_ns() + (uint64_t)timeout_ms * 1000000ull;
    while (tide_now_ns() < deadline) {
        zmq_pollitem_t it = {f->router, 0, ZMQ_POLLIN, 0};
        if (zmq_poll(&it, 1, 20) <= 0)
            continue;
        zmq_msg_t id, body;
        zmq_msg_init(&id);
        zmq_msg_init(&body);
        zmq_msg_recv(&id, f->router, 0);
        zmq_msg_recv(&body, f->router, 0);
        f->rid_len = zmq_msg_size(&id);
        memcpy(f->rid, zmq_msg_data(&id), f->rid_len);
        tide_msg_t m;
        tide_status rc = tide_proto_decode(zmq_msg_data(&body), zmq_msg_size(&body), &m);
        zmq_msg_close(&id);
        zmq_msg_close(&body);
        cr_assert_eq(rc, TIDE_OK, "worker sent a malformed message: %s", tide_last_error());
        if (m.type == want) {
            *out = m;
            return;
        }
        tide_msg_clear(&m);
    }
    cr_assert_fail("no '%s' from the worker within %d ms", tide_msg_type_name(want), timeout_ms);
}

static void fake_send(fake *f, const tide_msg_t *m)
{
    tide_proto_buf_t b;
    tide_proto_buf_init(&b);
    cr_assert_eq(tide_proto_encode(m, &b), TIDE_OK, "%s", tide_last_error());
    zmq_send(f->router, f->rid, f->rid_len, ZMQ_SNDMORE);
    zmq_send(f->router, b.data, b.len, 0);
    tide_proto_buf_destroy(&b);
}

typedef struct reg_arg {
    fake *f;
    int hb_ms;
    int fail_ms; /* tided's failure timeout, the worker's lease */
} reg_arg;

static void *fake_register(void *arg)
{
    reg_arg *ra = arg;
    tide_msg_t m;
    fake_expect(ra->f, TIDE_MSG_REGISTER, &m, 5000);
    cr_assert_eq(m.u.reg.rank, 3);
    cr_assert_str_eq(m.u.reg.pool, "pool-a");
    tide_msg_clear(&m);
    tide_msg_init(&m, TIDE_MSG_REGISTER_OK);
    m.u.register_ok.worker = 42;
    m.u.register_ok.heartbeat_ms = ra->hb_ms;
    m.u.register_ok.fail_ms = ra->fail_ms;
    fake_send(ra->f, &m);
    return NULL;
}

/* The training thread's side of the control client: the intents it drains, the progress
   it publishes, the generations' abort words, and its own step agreement and pending
   layout, as the runtime keeps them (step.c). One per process: Criterion runs each test
   in its own. */
static struct trainer {
    tide__mailbox_t *intents;
    tide__progress progress;
    tide__gens_t *gens;
    tide__agree a;
    tide_msg_t pending;
    char fence_why[TIDE_PROTO_TEXT_MAX + 1];
    int fenced;
} tr;

static void trainer_open(void)
{
    memset(&tr, 0, sizeof tr);
    cr_assert_eq(tide__mailbox_new(&tr.intents), TIDE_OK);
    cr_assert_eq(tide__gens_new(&tr.gens), TIDE_OK);
    tide__agree_init(&tr.a, 0);
    tide_msg_init(&tr.pending, TIDE_MSG_NONE);
}

static void trainer_close(void)
{
    tide_msg_clear(&tr.pending);
    tide__mailbox_destroy(&tr.intents);
    tide__gens_destroy(&tr.gens);
}

static int has_rank(const tide_proto_layout_t *l, int32_t r)
{
    for (int i = 0; i < l->dp * l->tp * l->pp; i++)
        if (l->worker[i] == r)
            return 1;
    return 0;
}

/* The runtime's application of an intent to its agreement (step.c), for job rank 3. */
static void trainer_apply(void *ctx, tide_msg_t *m)
{
    (void)ctx;
    if (m->type == TIDE_MSG_LAYOUT &&
        tide__agree_layout(&tr.a, m->u.layout.layout.gen, has_rank(&m->u.layout.layout, 3),
                           tr.a.gen == m->u.layout.prev.gen && has_rank(&m->u.layout.prev, 3))) {
        tide_msg_clear(&tr.pending);
        tr.pending = *m;
        tide_msg_init(m, TIDE_MSG_NONE);
    } else if (m->type == TIDE_MSG_PREPARE_ACK) {
        tide__agree_acked(&tr.a, m->u.prepare_ack.gen, (int64_t)m->u.prepare_ack.step);
    } else if (m->type == TIDE_MSG_COMMIT) {
        tide__agree_commit(&tr.a, m->u.commit.gen, (int64_t)m->u.commit.step, m->u.commit.recover);
    } else if (m->type == TIDE_MSG_ABORT) {
        tide__agree_abort(&tr.a, m->u.abort_.gen);
    } else if (m->type == TIDE_MSG_FENCED) {
        tr.fenced = 1;
        snprintf(tr.fence_why, sizeof tr.fence_why, "%s", m->u.fenced.reason);
    }
}

static void trainer_publish(void *ctx)
{
    (void)ctx;
    tide__progress_set(&tr.progress, &tr.a);
}

/* A boundary: the intents applied, then fn (may be NULL) on the agreement, published. */
typedef void (*trainer_fn)(void);
static trainer_fn tr_fn;
static void trainer_then(void *ctx)
{
    if (tr_fn != NULL)
        tr_fn();
    trainer_publish(ctx);
}

static void trainer_boundary(trainer_fn fn)
{
    tr_fn = fn;
    tide__mailbox_drain(tr.intents, trainer_apply, NULL, trainer_then, NULL);
    tr_fn = NULL;
}

static tide__begin tr_begin;
static void do_begin(void)
{
    tr_begin = tide__agree_begin(&tr.a);
}
static void do_end(void)
{
    tide__agree_end(&tr.a, 1);
}

/* A control client registered with f as a worker of the given kind on local device, with
   tided's failure timeout fail_ms (the lease). */
static tide__ctl_t *start_ctl_with(fake *f, int kind, int device, int fail_ms)
{
    trainer_open();
    tide__ctl_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.endpoint = f->endpoint;
    snprintf(cfg.reg.pool, sizeof cfg.reg.pool, "pool-a");
    cfg.reg.rank = 3;
    cfg.reg.size = 4;
    snprintf(cfg.reg.host, sizeof cfg.reg.host, "hostx");
    cfg.reg.device = device;
    cfg.reg.kind = kind;
    cfg.reg.mem_bytes = 1 << 20;
    cfg.reg.pid = (int)getpid();
    cfg.register_timeout_ms = 5000;
    cfg.intents = tr.intents;
    cfg.progress = &tr.progress;
    cfg.gens = tr.gens;
    reg_arg ra = {f, 50, fail_ms};
    pthread_t th;
    pthread_create(&th, NULL, fake_register, &ra);
    tide__ctl_t *ctl = NULL;
    tide_status rc = tide__ctl_new(&ctl, &cfg);
    pthread_join(th, NULL);
    cr_assert_eq(rc, TIDE_OK, "%s", tide_last_error());
    cr_assert_eq(tide__ctl_worker_id(ctl), 42);
    return ctl;
}

/* A control client registered with a fake tided whose failure timeout is a minute: no
   lease runs out in a test that does not mean it to. */
static tide__ctl_t *start_ctl_on(fake *f, int kind, int device)
{
    return start_ctl_with(f, kind, device, 60000);
}

static tide__ctl_t *start_ctl_lease(fake *f, int fail_ms)
{
    return start_ctl_with(f, TIDE_DEVICE_CPU, 0, fail_ms);
}

static tide__ctl_t *start_ctl(fake *f)
{
    return start_ctl_on(f, TIDE_DEVICE_CPU, 0);
}

static void set_layout(tide_proto_layout_t *l, uint64_t gen, int dp, int32_t *workers, int *stages)
{
    memset(l, 0, sizeof *l);
    l->gen = gen;
    l->dp = dp;
    l->tp = 1;
    l->pp = 1;
    l->num_layers = 2;
    l->micro_batches = 1;
    stages[0] = 0;
    stages[1] = 2;
    l->stage_start = stages;
    l->worker = workers;
}

static void first_member(void)
{
    tide__agree_first(&tr.a, 1, 1);
}

static void do_switched(void)
{
    tide__agree_switched(&tr.a);
}

static void first_idle(void)
{
    tide__agree_first(&tr.a, 1, 0);
}

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

/* ---- offline command runner ---------------------------------------------------------------- */

static int wait_child(tide__child *c, int timeout_ms)
{
    uint64_t deadline = tide_now_ns() + (uint64_t)timeout_ms * 1000000ull;
    int code = 9999;
    while (!tide__child_poll(c, tide_now_ns(), &code)) {
        cr_assert_lt(tide_now_ns(), deadline, "child still running after %d ms", timeout_ms);
        tide_sleep_ms(5);
    }
    return code;
}

/* A fresh directory for one test's logs and marker files. */
static void tmp_dir(char *out, size_t len)
{
    snprintf(out, len, "/tmp/tide-child-XXXXXX");
    cr_assert_not_null(mkdtemp(out));
}

static tide__child_cfg child_cfg(const char *job, char **argv, uint32_t argc, const char *log,
                                 int grace_ms, const char *cgroup)
{
    tide__child_cfg c = {job, argv, argc, NULL, 0, log, 1 << 20, grace_ms, cgroup, 0, 0};
    return c;
}

/* The whole file at path (NUL-terminated, tide_malloc'd; "" when missing). */
static char *slurp(const char *path)
{
    FILE *f = fopen(path, "r");
    char *buf = calloc(1, 1 << 21);
    cr_assert_not_null(buf);
    if (f != NULL) {
        size_t n = fread(buf, 1, (1 << 21) - 1, f);
        buf[n] = '\0';
        fclose(f);
    }
    return buf;
}

/* The pid written in the file at path, waiting for it up to 3 s. */
static pid_t read_pid(const char *path)
{
    for (int i = 0; i < 300; i++) {
        char *s = slurp(path);
        long v = atol(s);
        free(s);
        if (v > 0)
            return (pid_t)v;
        tide_sleep_ms(10);
    }
    cr_assert_fail("no pid in %s", path);
    return -1;
}

/* True when pid is gone (or a zombie nobody reaped yet). */
static int gone(pid_t pid)
{
    if (kill(pid, 0) != 0)
        return 1;
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return 1;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    const char *p = strrchr(buf, ')');
    return p != NULL && (p[2] == 'Z' || p[2] == 'X');
}

static int gone_within(pid_t pid, int ms)
{
    for (int i = 0; i < ms / 10; i++) {
        if (gone(pid))
            return 1;
        tide_sleep_ms(10);
    }
    return gone(pid);
}

Test(child, exit_codes_env_and_no_mpi_variables)
{
    char dir[64], log[128];
    tmp_dir(dir, sizeof dir);
    snprintf(log, sizeof log, "%s/a.log", dir);
    /* the worker is an MPI rank: its runtime's variables must not reach the command,
       which may use MPI itself */
    setenv("OMPI_COMM_WORLD_RANK", "3", 1);
    setenv("OMPI_MCA_ess", "pmi", 1);
    setenv("PMIX_RANK", "3", 1);
    setenv("PMIX_NAMESPACE", "prterun-x-1@1", 1);
    setenv("PMI_RANK", "3", 1);
    setenv("OPAL_PREFIX", "/nowhere", 1);
    setenv("TIDE_KEEP_ME", "yes", 1);
    tide__child c;
    char *argv[] = {"/bin/sh", "-c",
                    "test \"$TIDE_OFFLINE_JOB\" = j1 || exit 1; test \"$TIDE_KEEP_ME\" = yes || "
                    "exit 2; env | grep -E '^(OMPI_|PMIX_|PMI_|OPAL_)' && exit 4; "
                    "if command -v mpirun >/dev/null; then mpirun --allow-run-as-root "
                    "--oversubscribe -np 1 /bin/echo mpi-ok || exit 5; fi; exit 3"};
    char *env[] = {"TIDE_OFFLINE_JOB=j1"};
    tide__child_cfg cfg = child_cfg("j1", argv, 3, log, 1000, NULL);
    cfg.env = env;
    cfg.n_env = 1;
    cr_assert_eq(tide__child_spawn(&c, &cfg), TIDE_OK, "%s", tide_last_error());
    int code = wait_child(&c, 20000);
    char *out = slurp(log);
    cr_assert_eq(code, 3, "exit status %d; output: %s", code, out);
    free(out);
    char *ok[] = {"true"};
    cfg = child_cfg("j2", ok, 1, log, 1000, NULL);
    cr_assert_eq(tide__child_spawn(&c, &cfg), TIDE_OK);
    cr_assert_eq(wait_child(&c, 5000), 0);
    /* a program that cannot start: 127, and the reason in the attempt's log */
    char *bad[] = {"/nonexistent/tide-no-such-program"};
    cfg = child_cfg("j3", bad, 1, log, 1000, NULL);
    cr_assert_eq(tide__child_spawn(&c, &cfg), TIDE_OK);
    cr_assert_eq(wait_child(&c, 5000), 127);
    out = slurp(log);
    cr_assert(strstr(out, "cannot start /nonexistent/tide-no-such-program") != NULL, "%s", out);
    free(out);
    cfg = child_cfg("j4", bad, 0, log, 1000, NULL);
    cr_assert_eq(tide__child_spawn(&c, &cfg), TIDE_ERR_INVALID);
    cr_expect_eq(tide__offline_env_keep("OMPI_COMM_WORLD_SIZE=2"), 0);
    cr_expect_eq(tide__offline_env_keep("PMIX_SERVER_URI41=x"), 0);
    cr_expect_eq(tide__offline_env_keep("PMI_FD=3"), 0);
    cr_expect_eq(tide__offline_env_keep("MPI_LOCALRANKID=0"), 0);
    cr_expect_eq(tide__offline_env_keep("PATH=/bin"), 1);
    cr_expect_eq(tide__offline_env_keep("MPI_LOCALRANKIDX=0"), 1);
    cr_expect_eq(tide__offline_env_keep("CUDA_VISIBLE_DEVICES=1"), 1);
}

/* Whether process pid ignores signal sig (its SigIgn mask in /proc). */
static int ignores(int pid, int sig)
{
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%d/status", pid);
    FILE *f = fopen(path, "r");
    unsigned long long mask = 0;
    while (f != NULL && fgets(line, sizeof line, f) != NULL)
        if (sscanf(line, "SigIgn: %llx", &mask) == 1)
            break;
    if (f != NULL)
        fclose(f);
    return (mask & (1ull << (sig - 1))) != 0;
}

/* Whether a child of process pid (the offline supervisor: its child is the command)
   ignores signal sig within ms. */
static int wait_child_ignores(int pid, int sig, int ms)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/task/%d/children", pid, pid);
    for (int waited = 0; waited < ms; waited += 10) {
        FILE *f = fopen(path, "r");
        int child = 0, found = 0;
        while (f != NULL && !found && fscanf(f, "%d", &child) == 1)
            found = ignores(child, sig);
        if (f != NULL)
            fclose(f);
        if (found)
            return 1;
        tide_sleep_ms(10);
    }
    return 0;
}

Test(child, preempt_sigterm_then_sigkill_after_grace)
{
    char dir[64], log[128];
    tmp_dir(dir, sizeof dir);
    snprintf(log, sizeof log, "%s/p.log", dir);
    tide__child c;
    char *polite[] = {"sleep", "30"};
    tide__child_cfg cfg = child_cfg("p", polite, 2, log, 1000, NULL);
    cr_assert_eq(tide__child_spawn(&c, &cfg), TIDE_OK);
    tide_sleep_ms(50);
    tide__child_preempt(&c, 2000, tide_now_ns());
    cr_assert_eq(wait_child(&c, 1500), -SIGTERM, "a polite child dies of SIGTERM at once");

    /* a child that ignores SIGTERM is killed when the grace period ends, with its group */
    char *stubborn[] = {"/bin/sh", "-c", "trap '' TERM; sleep 30 & wait; sleep 30"};
    cfg = child_cfg("s", stubborn, 3, log, 1000, NULL);
    cr_assert_eq(tide__child_spawn(&c, &cfg), TIDE_OK);
    /* the shell installed its trap (a fixed 100 ms was too short for a loaded ASan run) */
    cr_assert(wait_child_ignores(c.pid, SIGTERM, 10000), "the shell never ignored SIGTERM");
    uint64_t t0 = tide_now_ns();
    tide__child_preempt(&c, 300, t0);
    int code = wait_child(&c, 3000);
    uint64_t ms = (tide_now_ns() - t0) / 1000000ull;
    cr_assert_eq(code, -SIGKILL, "code %d", code);
    cr_assert_geq(ms, 280, "SIGKILL only after the grace period (%llu ms)", (unsigned long long)ms);
    cr_assert_lt(ms, 2000);
}

/* A command whose grandchild leaves its process group and session (setsid), ignoring
   SIGTERM: preempted, nothing of it survives; the grandchild got SIGTERM first. */
static void setsid_grandchild_does_not_survive(const char *cgroup)
{
    char dir[64], log[128], script[600];
    tmp_dir(dir, sizeof dir);
    snprintf(log, sizeof log, "%s/g.log", dir);
    snprintf(script, sizeof script,
             "setsid /bin/sh -c 'trap \"echo term >> %s/gc.term\" TERM; echo $$ > %s/gc.pid; "
             "while :; do sleep 0.05; done' & echo $$ > %s/c.pid; wait",
             dir, dir, dir);
    char *argv[] = {"/bin/sh", "-c", script};
    tide__child c;
    tide__child_cfg cfg = child_cfg("g", argv, 3, log, 1000, cgroup);
    cr_assert_eq(tide__child_spawn(&c, &cfg), TIDE_OK, "%s", tide_last_error());
    char path[160];
    snprintf(path, sizeof path, "%s/gc.pid", dir);
    pid_t gc = read_pid(path);
    snprintf(path, sizeof path, "%s/c.pid", dir);
    pid_t ch = read_pid(path);
    cr_assert_neq(getsid(gc), getsid(ch), "the grandchild runs in a session of its own");
    tide__child_preempt(&c, 400, tide_now_ns());
    wait_child(&c, 5000);
    cr_assert(gone_within(gc, 2000), "the setsid grandchild %d survived the preemption", (int)gc);
    cr_assert(gone(ch));
    snprintf(path, sizeof path, "%s/gc.term", dir);
    char *t = slurp(path);
    cr_expect(strstr(t, "term") != NULL, "the grandchild got SIGTERM before SIGKILL");
    free(t);
    if (cgroup != NULL) {
        struct stat sb;
        cr_expect_neq(stat(cgroup, &sb), 0, "the attempt's cgroup %s is removed", cgroup);
    }
}

Test(child, setsid_grandchild_does_not_survive_preemption_subreaper)
{
    setsid_grandchild_does_not_survive(NULL);
}

Test(child, setsid_grandchild_does_not_survive_preemption_cgroup)
{
    char parent[1024], why[512];
    if (!tide__offline_cgroup_parent(parent, sizeof parent, why, sizeof why)) {
        cr_skip_test("no writable cgroup v2 here: %s", why);
        return;
    }
    char cg[1200];
    snprintf(cg, sizeof cg, "%s/tide-test-%d", parent, (int)getpid());
    setsid_grandchild_does_not_survive(cg);
}

/* The worker dies (SIGKILL, no chance to clean up): its command gets SIGTERM, the grace,
   and nothing of it survives, so tided may run the job elsewhere without two copies. */
Test(child, nothing_survives_the_workers_death)
{
    char dir[64], log[128], script[700];
    tmp_dir(dir, sizeof dir);
    snprintf(log, sizeof log, "%s/d.log", dir);
    snprintf(script, sizeof script,
             "trap 'echo term > %s/c.term; exit 0' TERM; setsid /bin/sh -c 'trap \"\" TERM; "
             "echo $$ > %s/gc.pid; while :; do sleep 0.05; done' & echo $$ > %s/c.pid; "
             "while :; do sleep 0.05; done",
             dir, dir, dir);
    char parent[1024], why[512], cg[1200] = "";
    if (tide__offline_cgroup_parent(parent, sizeof parent, why, sizeof why))
        snprintf(cg, sizeof cg, "%s/tide-test-%d", parent, (int)getpid());
    pid_t worker = fork();
    cr_assert_geq(worker, 0);
    if (worker == 0) {
        char *argv[] = {"/bin/sh", "-c", script};
        tide__child c;
        tide__child_cfg cfg = child_cfg("d", argv, 3, log, 300, cg[0] ? cg : NULL);
        if (tide__child_spawn(&c, &cfg) != TIDE_OK)
            _exit(1);
        for (;;)
            pause();
    }
    char path[160];
    snprintf(path, sizeof path, "%s/gc.pid", dir);
    pid_t gc = read_pid(path);
    snprintf(path, sizeof path, "%s/c.pid", dir);
    pid_t ch = read_pid(path);
    kill(worker, SIGKILL);
    int st;
    waitpid(worker, &st, 0);
    cr_assert(gone_within(ch, 3000), "the command %d outlived its worker", (int)ch);
    cr_assert(gone_within(gc, 3000), "the setsid grandchild %d outlived the worker", (int)gc);
    snprintf(path, sizeof path, "%s/c.term", dir);
    char *t = slurp(path);
    cr_expect(strstr(t, "term") != NULL, "the command got SIGTERM, not only SIGKILL");
    free(t);
    t = slurp(log);
    cr_expect(strstr(t, "the worker is gone") != NULL, "%s", t);
    free(t);
}

/* Output goes to the attempt's file, capped: past the cap, a marker and nothing more. */
Test(child, output_is_kept_per_attempt_with_a_cap)
{
    char dir[64], log[128];
    tmp_dir(dir, sizeof dir);
    snprintf(log, sizeof log, "%s/o.log", dir);
    char *argv[] = {"/bin/sh", "-c",
                    "echo first-line; echo to-stderr >&2; i=0; while [ $i -lt 3000 ]; do "
                    "echo 0123456789012345678901234567890123456789; i=$((i+1)); done; "
                    "echo last-line"};
    tide__child c;
    tide__child_cfg cfg = child_cfg("o", argv, 3, log, 1000, NULL);
    cfg.log_cap = 10000;
    cr_assert_eq(tide__child_spawn(&c, &cfg), TIDE_OK);
    cr_assert_eq(wait_child(&c, 10000), 0);
    char *out = slurp(log);
    size_t n = strlen(out);
    cr_assert(strstr(out, "first-line\n") == out, "%.80s", out);
    cr_assert(strstr(out, "to-stderr") != NULL, "stderr is in the same file");
    cr_assert(strstr(out, "output cap of 10000 bytes reached") != NULL, "%s", out + 9900);
    cr_assert(strstr(out, "last-line") == NULL, "nothing past the cap is kept");
    cr_assert_lt(n, 10000 + 300, "the file holds %zu bytes", n);
    cr_assert(strstr(out, "bytes of output discarded in all") != NULL);
    free(out);
}

static void send_assign(fake *f, const char *job, char **argv, uint32_t argc, int grace_ms)
{
    tide_msg_t m;
    tide_msg_init(&m, TIDE_MSG_OFFLINE_ASSIGN);
    snprintf(m.u.offline_assign.job, sizeof m.u.offline_assign.job, "%s", job);
    m.u.offline_assign.kind = TIDE_JOB_COMMAND;
    m.u.offline_assign.argv = argv;
    m.u.offline_assign.argc = argc;
    m.u.offline_assign.attempt = 2;
    m.u.offline_assign.grace_ms = grace_ms;
    fake_send(f, &m);
}

Test(ctl, offline_command_reported_and_preempted)
{
    char dir[64];
    tmp_dir(dir, sizeof dir);
    setenv("TIDE_LOG_DIR", dir, 1);
    fake f;
    fake_open(&f);
    tide__ctl_t *ctl = start_ctl(&f);
    char *argv1[] = {"/bin/sh", "-c", "echo said-something; exit 5"};
    send_assign(&f, "off1", argv1, 3, 1000);
    tide_msg_t st;
    fake_expect(&f, TIDE_MSG_OFFLINE_STATUS, &st, 3000);
    cr_assert_eq(st.u.offline_status.state, TIDE_JOB_RUNNING);
    cr_assert_eq(st.u.offline_status.attempt, 2);
    char want[160];
    snprintf(want, sizeof want, "%s/off1.2.%d.log", dir, (int)getpid());
    cr_assert_str_eq(st.u.offline_status.log, want, "one file per job, attempt and worker");
    tide_msg_clear(&st);
    fake_expect(&f, TIDE_MSG_OFFLINE_STATUS, &st, 3000);
    cr_assert_str_eq(st.u.offline_status.job, "off1");
    cr_assert_eq(st.u.offline_status.state, TIDE_JOB_FAILED);
    cr_assert_eq(st.u.offline_status.exit_code, 5);
    cr_assert_str_eq(st.u.offline_status.tail, "said-something\n", "the end reports the output");
    tide_msg_clear(&st);

    char *argv2[] = {"/bin/sh", "-c", "trap '' TERM; while :; do sleep 1; done"};
    send_assign(&f, "off2", argv2, 3, 1000);
    fake_expect(&f, TIDE_MSG_OFFLINE_STATUS, &st, 3000);
    cr_assert_eq(st.u.offline_status.state, TIDE_JOB_RUNNING);
    tide_msg_clear(&st);
    char job[64];
    int pid = tide__ctl_offline_pid(ctl, job, sizeof job);
    cr_assert_gt(pid, 0);
    cr_assert_str_eq(job, "off2");
    /* running is reported at the spawn: on a loaded machine the shell may not have run
       its trap yet, and a SIGTERM then would end it before the test's point */
    cr_assert(wait_child_ignores(pid, SIGTERM, 10000), "the command never ignored SIGTERM");
    tide_msg_t m;
    tide_msg_init(&m, TIDE_MSG_PREEMPT);
    snprintf(m.u.preempt.job, sizeof m.u.preempt.job, "off2");
    m.u.preempt.grace_ms = 200;
    fake_send(&f, &m);
    fake_expect(&f, TIDE_MSG_OFFLINE_STATUS, &st, 3000);
    cr_assert_eq(st.u.offline_status.state, TIDE_JOB_PREEMPTED);
    cr_assert_eq(st.u.offline_status.exit_code, -SIGKILL, "ignored SIGTERM: killed after grace");
    tide_msg_clear(&st);
    cr_assert_eq(tide__ctl_offline_pid(ctl, NULL, 0), 0);
    tide__ctl_destroy(&ctl, 0);
    trainer_close();
    fake_close(&f);
}

/* The assignment's max_memory reaches the attempt through the worker: a command allocating
   past it fails, and the report's tail (what tided's event and tidectl logs show) names the
   limit last. */
Test(ctl, offline_command_past_its_memory_limit_is_reported)
{
    char dir[64];
    tmp_dir(dir, sizeof dir);
    setenv("TIDE_LOG_DIR", dir, 1);
    setenv("TIDE_OFFLINE_CGROUP", "0", 1); /* the rlimit path, wherever this runs */
    fake f;
    fake_open(&f);
    tide__ctl_t *ctl = start_ctl(&f);
    char *argv[] = {"awk", "BEGIN{s=\"x\"; while (length(s) < 67108864) s = s s; print \"grew\"}"};
    tide_msg_t m;
    tide_msg_init(&m, TIDE_MSG_OFFLINE_ASSIGN);
    snprintf(m.u.offline_assign.job, sizeof m.u.offline_assign.job, "hog");
    m.u.offline_assign.kind = TIDE_JOB_COMMAND;
    m.u.offline_assign.argv = argv;
    m.u.offline_assign.argc = 2;
    m.u.offline_assign.attempt = 1;
    m.u.offline_assign.grace_ms = 1000;
    m.u.offline_assign.max_memory = 32ull << 20;
    fake_send(&f, &m);
    tide_msg_t st;
    fake_expect(&f, TIDE_MSG_OFFLINE_STATUS, &st, 3000);
    cr_assert_eq(st.u.offline_status.state, TIDE_JOB_RUNNING);
    tide_msg_clear(&st);
    fake_expect(&f, TIDE_MSG_OFFLINE_STATUS, &st, 30000);
    const char *tail = st.u.offline_status.tail;
    cr_assert_eq(st.u.offline_status.state, TIDE_JOB_FAILED, "%s", tail);
    cr_expect(strstr(tail, "grew") == NULL, "%s", tail);
    const char *last = strstr(tail, "[tide: the command failed");
    cr_assert_not_null(last, "%s", tail);
    cr_expect(strstr(last, "memory limit 32 MiB (RLIMIT_AS") != NULL, "%s", last);
    tide_msg_clear(&st);
    unsetenv("TIDE_OFFLINE_CGROUP");
    tide__ctl_destroy(&ctl, 0);
    trainer_close();
    fake_close(&f);
}

/* What an offline command of a worker on local device 2 sees (CUDA_VISIBLE_DEVICES=4,5,6,7
   in the worker's environment), as its output's tail reports it. */
static char *command_sees(int kind)
{
    fake f;
    fake_open(&f);
    tide__ctl_t *ctl = start_ctl_on(&f, kind, 2);
    char *argv[] = {"/bin/sh", "-c", "echo \"dev=$TIDE_OFFLINE_DEVICE vis=$CUDA_VISIBLE_DEVICES\""};
    send_assign(&f, "sees", argv, 3, 1000);
    tide_msg_t st;
    fake_expect(&f, TIDE_MSG_OFFLINE_STATUS, &st, 3000);
    cr_assert_eq(st.u.offline_status.state, TIDE_JOB_RUNNING);
    tide_msg_clear(&st);
    fake_expect(&f, TIDE_MSG_OFFLINE_STATUS, &st, 3000);
    cr_assert_eq(st.u.offline_status.state, TIDE_JOB_DONE, "%s", st.u.offline_status.tail);
    char *tail = strdup(st.u.offline_status.tail);
    tide_msg_clear(&st);
    tide__ctl_destroy(&ctl, 0);
    trainer_close();
    fake_close(&f);
    return tail;
}

/* The device index a command gets and the devices it sees agree: on a GPU worker it sees
   only the worker's GPU (the worker's device 2 is physical GPU 6 here), as its device 0,
   and TIDE_OFFLINE_DEVICE says 0; a CPU worker's command gets the worker's index and the
   worker's own CUDA_VISIBLE_DEVICES. */
Test(ctl, offline_command_device_index_matches_what_it_sees)
{
    char dir[64];
    tmp_dir(dir, sizeof dir);
    setenv("TIDE_LOG_DIR", dir, 1);
    setenv("CUDA_VISIBLE_DEVICES", "4,5,6,7", 1);
    char *gpu = command_sees(TIDE_DEVICE_GPU);
    cr_expect_str_eq(gpu, "dev=0 vis=6\n");
    free(gpu);
    char *cpu = command_sees(TIDE_DEVICE_CPU);
    cr_expect_str_eq(cpu, "dev=2 vis=4,5,6,7\n");
    free(cpu);
}

/* A worker that leaves while its command runs gives the command SIGTERM and the job's
   grace (not SIGKILL at once), reports it preempted (not failed), then says bye. */
Test(ctl, leaving_gives_the_command_sigterm_and_its_grace)
{
    char dir[64], script[300];
    tmp_dir(dir, sizeof dir);
    setenv("TIDE_LOG_DIR", dir, 1);
    snprintf(script, sizeof script,
             "trap 'sleep 0.3; echo cleaned-up > %s/term; exit 0' TERM; while :; do sleep "
             "0.05; done",
             dir);
    fake f;
    fake_open(&f);
    tide__ctl_t *ctl = start_ctl(&f);
    char *argv[] = {"/bin/sh", "-c", script};
    send_assign(&f, "leave", argv, 3, 5000);
    tide_msg_t st;
    fake_expect(&f, TIDE_MSG_OFFLINE_STATUS, &st, 3000);
    cr_assert_eq(st.u.offline_status.state, TIDE_JOB_RUNNING);
    tide_msg_clear(&st);
    tide_sleep_ms(150);
    uint64_t t0 = tide_now_ns();
    tide__ctl_destroy(&ctl, 1);
    trainer_close();
    uint64_t ms = (tide_now_ns() - t0) / 1000000ull;
    fake_expect(&f, TIDE_MSG_OFFLINE_STATUS, &st, 3000);
    cr_assert_eq(st.u.offline_status.state, TIDE_JOB_PREEMPTED);
    cr_assert_eq(st.u.offline_status.exit_code, 0, "it ended on its own after SIGTERM, got %d",
                 st.u.offline_status.exit_code);
    tide_msg_clear(&st);
    tide_msg_t bye;
    fake_expect(&f, TIDE_MSG_BYE, &bye, 3000);
    tide_msg_clear(&bye);
    char path[128];
    snprintf(path, sizeof path, "%s/term", dir);
    char *t = slurp(path);
    cr_assert(strstr(t, "cleaned-up") != NULL, "the command had its grace to clean up");
    free(t);
    cr_assert_geq(ms, 250, "destroy waited for the command (%llu ms)", (unsigned long long)ms);
    cr_assert_lt(ms, 4000, "and not for the whole grace (%llu ms)", (unsigned long long)ms);
    fake_close(&f);
}

/* ---- bubble filling decisions ------------------------------------------------------------- */

/* A wait whose length is not learned yet, or a task without an estimate, is not filled. */
Test(bubble, nothing_runs_without_an_expected_wait_or_an_estimate)
{
    cr_expect_eq(tide__bubble_batch(0.0, 0.0, 0.001), 0);
    cr_expect_eq(tide__bubble_batch(5.0, 0.0, INFINITY), 0);
    cr_expect_eq(tide__bubble_batch(5.0, 0.0, NAN), 0);
    cr_expect_eq(tide__bubble_batch(5.0, 0.0, -1.0), 0);
}

/* A step that is long against the wait runs only while it fits in 70% of what the wait
   is expected to leave, one at a time. */
Test(bubble, a_long_step_runs_alone_and_only_while_it_fits)
{
    cr_expect_eq(tide__bubble_batch(10.0, 0.0, 3.0), 1);  /* 3 <= 0.7 * 10 */
    cr_expect_eq(tide__bubble_batch(10.0, 5.0, 3.0), 1);  /* 3 <= 0.7 * 5 */
    cr_expect_eq(tide__bubble_batch(10.0, 6.0, 3.0), 0);  /* 3 > 0.7 * 4, and > 2% of 10 */
    cr_expect_eq(tide__bubble_batch(10.0, 12.0, 3.0), 0); /* past the expected end */
}

/* Randomised: tiny steps keep running past the expected end of the wait (the transfer is
   still pending, and a step costs at most 2% of the wait), in batches that never last
   longer than 50 us nor 2% of the expected wait, and never fewer than one step. */
Test(bubble, tiny_steps_fill_long_waits_in_bounded_batches)
{
    uint64_t x = 0x2545f4914f6cdd1dull;
    for (int i = 0; i < 20000; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        double expect = 0.01 + (double)(x % 100000) / 1000.0; /* 0.01 .. 100 ms */
        double elapsed = expect * (double)((x >> 20) % 300) / 100.0;
        double est = expect * (double)((x >> 40) % 1000) / 20000.0; /* 0 .. 5% of it */
        uint64_t n = tide__bubble_batch(expect, elapsed, est);
        int tiny = est <= 0.02 * expect;
        int fits = est <= 0.7 * (expect - elapsed);
        cr_assert_eq(n > 0, tiny || fits, "expect %g elapsed %g est %g: %llu steps", expect,
                     elapsed, est, (unsigned long long)n);
        if (n > 1) {
            double batch = (double)n * est;
            cr_assert(batch <= 0.05 + 1e-12 && batch <= 0.02 * expect + 1e-12,
                      "expect %g est %g: a batch of %llu steps lasts %g ms", expect, est,
                      (unsigned long long)n, batch);
            cr_assert((double)(n + 1) * est > fmin(0.05, 0.02 * expect) || n == 4096,
                      "expect %g est %g: %llu steps leave room for another", expect, est,
                      (unsigned long long)n);
        }
    }
}

Test(offline, cuda_visible_devices_of_a_child)
{
    char out[64];
    cr_expect_eq(tide__cuda_visible(NULL, 3, out, sizeof out), TIDE_OK);
    cr_expect_str_eq(out, "3");
    cr_expect_eq(tide__cuda_visible("", 0, out, sizeof out), TIDE_OK);
    cr_expect_str_eq(out, "0");
    /* the worker sees physical GPUs 4-7: its local device 1 is GPU 5 */
    cr_expect_eq(tide__cuda_visible("4,5,6,7", 1, out, sizeof out), TIDE_OK);
    cr_expect_str_eq(out, "5");
    cr_expect_eq(tide__cuda_visible("4,5,6,7", 3, out, sizeof out), TIDE_OK);
    cr_expect_str_eq(out, "7");
    cr_expect_eq(tide__cuda_visible("GPU-aa,GPU-bb", 1, out, sizeof out), TIDE_OK);
    cr_expect_str_eq(out, "GPU-bb");
    cr_expect_eq(tide__cuda_visible("4,5", 2, out, sizeof out), TIDE_ERR_RANGE);
    cr_expect(strstr(tide_last_error(), "CUDA_VISIBLE_DEVICES=4,5") != NULL);
    cr_expect_eq(tide__cuda_visible("4,5", -1, out, sizeof out), TIDE_ERR_INVALID);
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

/* 1 when a message of type t reaches the fake within ms (others skipped). */
static int fake_sees(fake *f, tide_msg_type_t t, int ms)
{
    uint64_t deadline = tide_now_ns() + (uint64_t)ms * 1000000ull;
    while (tide_now_ns() < deadline) {
        zmq_pollitem_t it = {f->router, 0, ZMQ_POLLIN, 0};
        if (zmq_poll(&it, 1, 20) <= 0)
            continue;
        zmq_msg_t id, body;
        zmq_msg_init(&id);
        zmq_msg_init(&body);
        zmq_msg_recv(&id, f->router, 0);
        zmq_msg_recv(&body, f->router, 0);
        tide_msg_t m;
        int hit = tide_proto_decode(zmq_msg_data(&body), zmq_msg_size(&body), &m) == TIDE_OK &&
                  m.type == t;
        if (m.type != TIDE_MSG_NONE)
            tide_msg_clear(&m);
        zmq_msg_close(&id);
        zmq_msg_close(&body);
        if (hit)
            return 1;
    }
    return 0;
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

/* ---- checkpoint requests on an idle rank ------------------------------------------------------
 */

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
    fake_open(&f);
    tide_t *t = calloc(1, sizeof *t);
    cr_assert_not_null(t);
    t->ctl = start_ctl(&f);
    t->rank = 3;
    snprintf(t->job, sizeof t->job, "jobA");
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
    tide__ctl_destroy(&t->ctl, 0);
    free(t);
    trainer_close();
    fake_close(&f);
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
    fake_open(&f);
    tide_t *t = calloc(1, sizeof *t);
    cr_assert_not_null(t);
    t->ctl = start_ctl(&f);
    tide__ctl_set_job(t->ctl, "jobA");
    t->intents = tr.intents;
    t->rank = 3;
    snprintf(t->job, sizeof t->job, "jobA");
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
    cr_assert(strstr(m.u.saved.reason, "the job ended at step 100, before step 106") != NULL,
              "%s", m.u.saved.reason);
    tide_msg_clear(&m);

    send_proposal(&f, 8, 107);
    cr_assert_eq(fake_sees(&f, TIDE_MSG_SAVE_ACK, 500), 0,
                 "a leaving rank answered a proposal it will neither take nor report");
    tide_msg_t left;
    cr_assert_neq(tide__mailbox_pop(tr.intents, &left, 0), TIDE_OK, "nothing queued after it");
    tide__ctl_destroy(&t->ctl, 0);
    tide_layout_destroy(&t->layout);
    free(t);
    trainer_close();
    fake_close(&f);
}
