/*
 * Unit tests of libtide's pieces that need neither a cluster nor a socket: the mailbox, the
 * generations' abort words, the step-agreement state machine, the bubble-filling decisions
 * and an offline command's CUDA_VISIBLE_DEVICES. The control client against a fake tided is
 * tested in test_worker_ctl.c, the offline command runner in test_worker_child.c.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

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
