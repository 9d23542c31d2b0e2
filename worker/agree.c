/*
 * worker/agree: one rank's step-agreement state machine for the reconfiguration
 * protocol of coordinator/reconf.c (prepare -> ack -> commit {S} -> switch after
 * exactly S completed steps -> done). Pure: no locks, no I/O. The training thread owns
 * its state and applies tided's decoded messages to it as it drains them (step.c); it
 * publishes a copy (tide__progress) from which the control thread answers tided at once.
 * The unit tests call it directly. Workload: O(1) per call.
 */
#include <string.h>

#include "worker/worker_int.h"

static void clear_pending(tide__agree *a)
{
    a->p_gen = 0;
    a->p_member = a->p_old = a->p_acked = a->p_committed = 0;
    a->p_switching = a->p_failed = a->p_aborted = 0;
    a->p_ack = a->p_switch = 0;
}

void tide__agree_init(tide__agree *a, int64_t start_step)
{
    memset(a, 0, sizeof *a);
    a->completed = start_step;
}

void tide__agree_first(tide__agree *a, uint64_t gen, int member)
{
    a->gen = gen;
    a->member = member;
    a->switched_gen = gen;
    a->seen_gen = gen;
}

int tide__agree_layout(tide__agree *a, uint64_t gen, int member_new, int member_old)
{
    if (gen <= a->gen || gen <= a->seen_gen)
        return 0;
    if (a->p_switching)
        return 0; /* the main thread runs the switch of p_gen; tided aborts it first */
    clear_pending(a);
    a->seen_gen = gen;
    a->p_gen = gen;
    a->p_member = member_new;
    a->p_old = member_old && a->member;
    return 1;
}

/* Steps this rank has completed or can complete without peers. */
static int64_t reachable(const tide__agree *a)
{
    return a->completed + ((a->in_step && a->can_finish) || (!a->in_step && a->deferred));
}

int tide__agree_prepare(tide__agree *a, uint64_t gen, int64_t *ack_step)
{
    if (gen != a->p_gen || a->p_gen == 0)
        return 0;
    if (!a->p_acked) {
        a->p_acked = 1;
        a->p_ack = reachable(a);
    }
    *ack_step = a->p_ack;
    return 1;
}

tide__commit_result tide__agree_commit(tide__agree *a, uint64_t gen, int64_t step, int recover)
{
    if (gen != 0 && gen == a->switched_gen && gen == a->gen)
        return TIDE__COMMIT_DUP;
    if (gen != a->p_gen || a->p_gen == 0 || !a->p_acked)
        return TIDE__COMMIT_IGNORED;
    if (a->p_committed)
        return TIDE__COMMIT_OK; /* duplicate while we have not switched yet */
    a->p_committed = 1;
    a->p_switch = step;
    /* A step in progress that would complete past S can never count: a peer died
       (recovery) and its collectives must be abandoned. */
    if (a->p_old && a->in_step && a->completed >= step)
        return TIDE__COMMIT_ABORT_STEP;
    /* A recovery that switches at the end of this step: the step can only end alone
       (its last reduction waits for the dead peer), so abandon it and finish it. */
    if (recover && a->p_old && a->in_step && a->can_finish && a->completed + 1 == step)
        return TIDE__COMMIT_ABORT_STEP;
    /* A recovery from the first layout while tide_join still builds its communicators: a
       member died, so the build waits on it in vain (until the switch timeout). Abandoned,
       the rank switches from its start step like the other survivors. */
    if (recover && a->p_old && a->building)
        return TIDE__COMMIT_ABORT_BUILD;
    return TIDE__COMMIT_OK;
}

void tide__agree_can_finish(tide__agree *a)
{
    if (a->in_step)
        a->can_finish = 1;
}

tide__abort_result tide__agree_abort(tide__agree *a, uint64_t gen)
{
    if (gen != 0 && gen == a->gen && gen == a->switched_gen && gen != a->p_gen)
        return TIDE__ABORT_SWITCHED;
    if (gen != a->p_gen || a->p_gen == 0)
        return TIDE__ABORT_IGNORED;
    if (a->p_switching) {
        a->p_aborted = 1; /* the switch fails with it, and then nothing is pending */
        return TIDE__ABORT_SWITCHING;
    }
    clear_pending(a);
    return TIDE__ABORT_CLEARED;
}

tide__begin tide__agree_begin(tide__agree *a)
{
    if (a->p_gen != 0 && !a->p_failed && !a->p_switching) {
        if (a->p_committed) {
            if (!a->p_old) {
                a->p_switching = 1; /* joins from idle: nothing to finish first */
                return TIDE__BEGIN_SWITCH;
            }
            if (a->deferred && a->completed + 1 == a->p_switch) {
                a->deferred = 0;
                a->in_step = 1;
                return TIDE__BEGIN_FINISH;
            }
            if (a->completed == a->p_switch) {
                a->deferred = 0; /* the failed step is redone under the new layout */
                a->p_switching = 1;
                return TIDE__BEGIN_SWITCH;
            }
            if (a->completed > a->p_switch)
                return TIDE__BEGIN_STALE;
        } else if (a->p_acked && a->p_old && a->completed >= a->p_ack + 1) {
            return TIDE__BEGIN_WAIT; /* the one extra step is done: wait for commit */
        } else if (a->deferred) {
            return TIDE__BEGIN_WAIT; /* the commit says whether to finish or redo it */
        }
    }
    if (a->p_gen != 0 && (a->p_failed || a->p_switching))
        return TIDE__BEGIN_WAIT;
    if (!a->member || a->groups_dead)
        return TIDE__BEGIN_WAIT; /* idle, or nothing to run a step on: a new layout first */
    a->deferred = 0;             /* no recovery wants it finished: it is redone */
    a->in_step = 1;
    return TIDE__BEGIN_RUN;
}

int tide__agree_end(tide__agree *a, int ok)
{
    if (!a->in_step)
        return -1;
    a->in_step = 0;
    a->deferred = !ok && a->can_finish;
    a->can_finish = 0;
    if (ok)
        a->completed++;
    return 0;
}

void tide__agree_switched(tide__agree *a)
{
    a->gen = a->p_gen;
    a->switched_gen = a->p_gen;
    a->member = a->p_member;
    a->completed = a->p_switch;
    a->in_step = 0;
    a->can_finish = a->deferred = 0;
    a->groups_dead = 0;
    clear_pending(a);
}

void tide__agree_switch_failed(tide__agree *a)
{
    if (a->p_aborted) { /* tided abandoned it already: the old generation goes on */
        clear_pending(a);
        return;
    }
    a->p_switching = 0;
    a->p_failed = 1;
}

int tide__agree_acked(tide__agree *a, uint64_t gen, int64_t step)
{
    if (gen != a->p_gen || a->p_gen == 0)
        return 0;
    if (!a->p_acked) {
        a->p_acked = 1;
        a->p_ack = step;
    }
    return 1;
}

/* ---- progress (the training thread's published copy) ------------------------------------- */

void tide__progress_set(tide__progress *p, const tide__agree *a)
{
    __atomic_store_n(&p->completed, a->completed, __ATOMIC_RELAXED);
    __atomic_store_n(&p->gen, a->gen, __ATOMIC_RELAXED);
    p->member = a->member;
    p->in_step = a->in_step;
    p->can_finish = a->can_finish;
    p->deferred = a->deferred;
    p->building = a->building;
}

int64_t tide__progress_reachable(const tide__progress *p)
{
    tide__agree a;
    memset(&a, 0, sizeof a);
    a.completed = p->completed;
    a.in_step = p->in_step;
    a.can_finish = p->can_finish;
    a.deferred = p->deferred;
    return reachable(&a);
}
