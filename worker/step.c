/*
 * worker/step: the training thread's step boundaries. The thread owns its step agreement
 * (agree.c); at each boundary it drains the intents the control thread posted (tided's
 * decoded commands: layout, prepare_ack, commit, abort, halt, fenced, save, job_end,
 * release, and a plugin job's assignment and preemption), applies them, decides (run the
 * step, finish one alone, switch, wait, stop) and publishes its progress, all inside the
 * intents mailbox's lock, so that the control thread's answers to tided and the steps they
 * describe are ordered. Idle ranks wait here for work or the job's end.
 *
 * Workload: one lock, a drain and a few comparisons per step boundary.
 */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/clock.h"
#include "core/error.h"
#include "core/log.h"
#include "worker/tide_int.h"

#define SUBSYS  "worker"
#define TAG_END 7101 /* pool message: the job ended (tide_finish) */

/* ---- step boundaries -------------------------------------------------------------------- */

/* An idle rank: was the job ended by its members (tide_finish), or this rank's pool
   released from it? */
static int job_ended(tide_t *t)
{
    /* tided releases a pool once the generation that left it out is committed, so no
       peer still waits on this rank's part of that switch: the launch may exit */
    if (t->released_gen != 0 && t->released_gen <= t->view.generation) {
        TIDE_INFO(SUBSYS,
                  "job %s: generation %llu released this rank's pool (its launch left the "
                  "job); rank %d finishes",
                  t->job, (unsigned long long)t->released_gen, t->rank);
        return 1;
    }
    if (t->job_ended) {
        /* tided's word: a member stopped without tide_finish (or the members that could
           release this rank cannot reach it, or are gone) */
        TIDE_INFO(SUBSYS, "job %s ended at step %lld: tided says %s; idle rank %d released", t->job,
                  (long long)t->end_step, t->end_why[0] ? t->end_why : "so", t->rank);
        return 1;
    }
    int flag = 0;
    MPI_Status st;
    if (MPI_Iprobe(MPI_ANY_SOURCE, TAG_END, t->end_comm, &flag, &st) != MPI_SUCCESS || !flag)
        return 0;
    int64_t step = 0;
    MPI_Recv(&step, 1, MPI_INT64_T, st.MPI_SOURCE, TAG_END, t->end_comm, MPI_STATUS_IGNORE);
    TIDE_INFO(SUBSYS, "job %s ended at step %lld; idle rank %d released", t->job, (long long)step,
              t->rank);
    return 1;
}

/* What the boundary decided, inside the mailbox's lock after the intents were applied. */
typedef struct begin_ctx {
    tide_t *t;
    tide__begin d;
    int stop; /* fenced or halted: no decision */
} begin_ctx;

static void decide(void *arg)
{
    begin_ctx *x = arg;
    tide_t *t = x->t;
    tide__agree *a = &t->agree;
    x->stop = t->fenced || t->halt_code != 0;
    if (!x->stop) {
        x->d = tide__agree_begin(a);
        if (x->d == TIDE__BEGIN_SWITCH) {
            /* the commit point of the generation: tided's abort of it and this switch are
               decided by its word's state from here */
            tide__gen_put(&t->next_word);
            t->next_word = tide__gens_get(t->gens, a->p_gen);
            if (t->next_word == NULL || !tide__gen_switching(t->next_word)) {
                tide__agree_switch_failed(a);
                x->d = TIDE__BEGIN_WAIT;
            }
        }
    }
    tide__progress_set(&t->progress, a);
}

static void switch_failed(tide_t *t, void *ctx)
{
    (void)ctx;
    tide__agree_switch_failed(&t->agree);
    tide__gen_switch_failed(t->next_word);
}

/* At the step boundary that decided the switch: takes the pending generation's intent by
   value (tide_reshard runs it) and this rank's view of its layout. */
static tide_status take_next(tide_t *t)
{
    const tide__agree *a = &t->agree;
    if (t->pending.type != TIDE_MSG_LAYOUT)
        return tide_errorf(TIDE_ERR_INTERNAL, "switch to generation %llu without its layout",
                           (unsigned long long)a->p_gen);
    const tide_proto_layout_msg_t *pl = &t->pending.u.layout;
    uint64_t gen = pl->layout.gen;
    tide__intent_clear(&t->next);
    TIDE_CHECK(tide__intent_from_msg(&t->next, gen, pl, a->p_old));
    tide_layout_destroy(&t->parked);
    tide__fill_view(&t->next_view, gen, t->next.next, t->rank, a->p_switch);
    t->has_next = 1;
    return TIDE_OK;
}

/* The generation the preparation may keep what it built ahead for. */
static uint64_t pending_gen(const tide_t *t)
{
    return t->agree.p_gen != 0 && !t->agree.p_failed ? t->agree.p_gen : 0;
}

/* An idle rank's turn at the boundary: the job's end, offline plugin work. 1 when the
   job ended (*action FINISHED). */
static int idle_turn(tide_t *t, tide_step_action *action)
{
    if (job_ended(t)) {
        t->finished = 1;
        *action = TIDE_STEP_FINISHED;
        return 1;
    }
    if (t->btask != NULL)
        tide__task_stop(t, &t->btask, 1); /* out of the layout: no more bubbles */
    tide__run_plugin(t);
    return 0;
}

/* The layout's communicators failed (tide_step_end). When a peer died, tided's recovery
   comes within its failure timeout and switches this rank. When none did (nccl maps its
   socket and IB errors to ABORTED: a flaky link or NIC looks like a dead peer), none ever
   comes: the rank gives up after the switch timeout rather than wait forever, and tided
   recovers the job around it once its heartbeats stop. */
static tide_status dead_groups_wait(tide_t *t, uint64_t idle_from)
{
    uint64_t bound = (uint64_t)t->opts.switch_timeout_ms * 1000000ull;
    if (tide_now_ns() - idle_from < bound)
        return TIDE_OK;
    return tide_errorf(TIDE_ERR_TIMEOUT,
                       "rank %d: generation %llu's communicators failed at step %lld and no "
                       "new layout replaced them within %d ms (TIDE_SWITCH_TIMEOUT_MS): tided "
                       "knows of no dead peer, so the failure was not a lost worker (a network "
                       "or device fault?); this rank gives up",
                       t->rank, (unsigned long long)t->agree.gen, (long long)t->agree.completed,
                       t->opts.switch_timeout_ms);
}

/* Acts on the boundary's decision d; 1 when tide_step_begin returns (*rc, *action). */
static int act(tide_t *t, tide__begin d, uint64_t begin_ns, tide_step_action *action,
               tide_status *rc)
{
    tide__agree *a = &t->agree;
    if (d == TIDE__BEGIN_RUN || d == TIDE__BEGIN_FINISH) {
        t->view.step = a->completed;
        t->step_t0 = tide_now_ns();
        __atomic_store_n(&t->progress.step_since_ns, t->step_t0, __ATOMIC_RELAXED);
        *action = d == TIDE__BEGIN_RUN ? TIDE_STEP_RUN : TIDE_STEP_FINISH;
        if (d == TIDE__BEGIN_RUN)
            t->bubble_k = 0;
        return 1;
    }
    if (d == TIDE__BEGIN_SWITCH) {
        tide__prep_wait(t->prep, a->p_gen); /* the preparation comes first */
        *rc = take_next(t);
        if (*rc != TIDE_OK) {
            tide__agree_change(t, switch_failed, NULL);
            return 1;
        }
        t->switch_wait_ms = (double)(tide_now_ns() - begin_ns) / 1e6;
        *action = TIDE_STEP_RECONFIGURE;
        return 1;
    }
    if (d == TIDE__BEGIN_STALE) {
        *rc = tide_errorf(TIDE_ERR_STALE,
                          "rank %d completed %lld steps, past generation %llu's switch step "
                          "%lld (a recovery rolled the job back; this rank cannot follow)",
                          t->rank, (long long)a->completed, (unsigned long long)a->p_gen,
                          (long long)a->p_switch);
        return 1;
    }
    return 0;
}

/* Fenced or halted: the step may not run, and the program hears why. */
static tide_status stopped(tide_t *t)
{
    if (t->fenced) {
        /* the job goes on without this rank: it must leave, touching no peer */
        if (!t->fence_logged)
            TIDE_ERROR(SUBSYS,
                       "rank %d of job %s was fenced and must exit now without further "
                       "communication: %s",
                       t->rank, t->job, t->fence_why);
        t->fence_logged = 1;
        return tide_errorf(TIDE_ERR_STALE,
                           "rank %d of job %s was fenced (the job went on without it): %s", t->rank,
                           t->job, t->fence_why);
    }
    return tide_errorf((tide_status)t->halt_code, "tided halted job %s: %s", t->job, t->halt_why);
}

tide_status tide_step_begin(tide_t *t, tide_step_action *action)
{
    if (t == NULL || action == NULL || t->job[0] == '\0')
        return tide_errorf(TIDE_ERR_INVALID, "tide_step_begin: join a job first");
    if (t->finished) {
        *action = TIDE_STEP_FINISHED;
        return TIDE_OK;
    }
    uint64_t idle_from = 0, begin_ns = tide_now_ns();
    tide_status rc = TIDE_OK;
    for (;;) {
        begin_ctx x = {t, TIDE__BEGIN_WAIT, 0};
        tide__mailbox_drain(t->intents, tide__inbox_apply, t, decide, &x);
        /* what was built ahead for a generation that was aborted or replaced is freed
           here, on the thread that may use it */
        tide__prep_drop(t->prep, pending_gen(t));
        if (x.stop) {
            rc = stopped(t);
            break;
        }
        if (act(t, x.d, begin_ns, action, &rc))
            break;
        /* WAIT: at the boundary for a commit, or idle outside the layout */
        if (idle_from == 0)
            idle_from = tide_now_ns();
        if (t->agree.member && t->agree.groups_dead &&
            (rc = dead_groups_wait(t, idle_from)) != TIDE_OK)
            break;
        if (!t->agree.member && t->agree.p_gen == 0 && idle_turn(t, action))
            break;
        tide__mailbox_wait(t->intents, 20);
    }
    if (idle_from != 0)
        __atomic_add_fetch(&t->progress.idle_ns, tide_now_ns() - idle_from, __ATOMIC_RELAXED);
    return rc;
}

/* 1 when a member's step communicators are gone or dead (aborted, or an operation on
   them failed): no step can run on them. */
static int step_groups_dead(const tide_t *t)
{
    if (!t->view.member)
        return 0;
    const tide_coll_comm_t *c[] = {t->c_all, t->c_tp, t->c_dp, t->c_pp};
    for (size_t i = 0; i < 4; i++)
        if (tide_coll_comm_aborted(c[i])) /* NULL counts: never built */
            return 1;
    return 0;
}

typedef struct end_ctx {
    tide_t *t;
    tide_status step_rc;
    int r;
} end_ctx;

/* A step that failed on a dead communicator is not retried on it (it would fail at once,
   for as long as no new layout comes): tide_step_begin waits for one. */
static void end_step(void *arg)
{
    end_ctx *x = arg;
    tide_t *t = x->t;
    x->r = tide__agree_end(&t->agree, x->step_rc == TIDE_OK);
    if (x->r == 0 && x->step_rc != TIDE_OK && step_groups_dead(t))
        t->agree.groups_dead = 1;
    t->view.step = t->agree.completed;
    tide__progress_set(&t->progress, &t->agree);
}

tide_status tide_step_end(tide_t *t, tide_status step_rc)
{
    if (t == NULL || t->ctl == NULL)
        return tide_errorf(TIDE_ERR_INVALID, "tide_step_end: no runtime");
    __atomic_store_n(&t->progress.step_since_ns, 0, __ATOMIC_RELAXED);
    end_ctx x = {t, step_rc, 0};
    tide__mailbox_drain(t->intents, tide__inbox_apply, t, end_step, &x);
    if (x.r != 0)
        return tide_errorf(TIDE_ERR_INVALID, "tide_step_end without tide_step_begin");
    tide__prep_release(t->prep); /* a held ack goes out by the end of a step */
    tide__bubble_boundary(t);
    if (step_rc == TIDE_OK) {
        __atomic_add_fetch(&t->progress.step_ns, tide_now_ns() - t->step_t0, __ATOMIC_RELAXED);
        __atomic_add_fetch(&t->progress.steps, 1, __ATOMIC_RELAXED);
        while (tide__ckpt_undecided(t)) { /* a checkpoint proposed for this boundary */
            tide__mailbox_wait(t->intents, 20);
            tide__drain(t);
        }
        tide__ckpt_step_end(t);
    } else {
        TIDE_WARN(SUBSYS, "rank %d: step %lld failed (%s); not counted", t->rank,
                  (long long)t->view.step, tide_strerror(step_rc));
    }
    return TIDE_OK;
}

static void can_finish(tide_t *t, void *ctx)
{
    (void)ctx;
    tide__agree_can_finish(&t->agree);
}

void tide_step_can_finish(tide_t *t)
{
    if (t != NULL && t->intents != NULL)
        tide__agree_change(t, can_finish, NULL);
}

void tide_bubble_begin(tide_t *t)
{
    if (t != NULL)
        t->bubble_t0 = tide_now_ns();
}

void tide_bubble_end(tide_t *t)
{
    if (t != NULL && t->bubble_t0 != 0) {
        uint64_t ns = tide_now_ns() - t->bubble_t0;
        __atomic_add_fetch(&t->progress.bubble_ns, ns, __ATOMIC_RELAXED);
        t->bstats.windows++;
        t->bstats.bubble_ms += (double)ns / 1e6;
        t->bubble_t0 = 0;
    }
}

tide_status tide_finish(tide_t *t)
{
    if (t == NULL || t->layout == NULL)
        return tide_errorf(TIDE_ERR_INVALID, "tide_finish: join a job first");
    tide__drain(t);
    if (t->fenced) /* its idle ranks are the job's, which goes on: nothing to release */
        return tide_errorf(TIDE_ERR_STALE, "tide_finish: rank %d was fenced: %s", t->rank,
                           t->fence_why);
    t->finished = 1;
    if (!t->view.member || t->layout->worker[0] != t->rank)
        return TIDE_OK;
    /* the send buffer outlives an abandoned request: MPI may still read it later */
    static int64_t end_step;
    end_step = t->view.step;
    MPI_Request *reqs = tide_malloc((size_t)t->size * sizeof *reqs);
    int *who = tide_malloc((size_t)t->size * sizeof *who);
    if (reqs == NULL || who == NULL) {
        tide_free(reqs);
        tide_free(who);
        return tide_errorf(TIDE_ERR_NOMEM, "out of memory releasing the idle ranks");
    }
    int n = 0;
    for (int r = 0; r < t->size; r++) {
        int p, d, tt;
        /* end_comm holds the processes of the pool's communicator, in its order */
        int c = tide_coll_pool_comm_rank(t->pool, r);
        if (c < 0 || tide_layout_find(t->layout, r, &p, &d, &tt) == TIDE_OK)
            continue;
        if (MPI_Isend(&end_step, 1, MPI_INT64_T, c, TAG_END, t->end_comm, &reqs[n]) != MPI_SUCCESS)
            TIDE_WARN(SUBSYS, "could not release idle rank %d", r);
        else
            who[n++] = r;
    }
    /* an idle rank that died (a pool that left) never takes its message: not waited for
       past a bound, or the job's end would hang on it */
    uint64_t deadline = tide_now_ns() + 2000ull * 1000000ull;
    int all = n == 0;
    while (!all && tide_now_ns() < deadline) {
        if (MPI_Testall(n, reqs, &all, MPI_STATUSES_IGNORE) != MPI_SUCCESS)
            break;
        if (!all)
            usleep(1000);
    }
    for (int i = 0; !all && i < n; i++) {
        int done = 0;
        if (reqs[i] != MPI_REQUEST_NULL &&
            MPI_Test(&reqs[i], &done, MPI_STATUS_IGNORE) == MPI_SUCCESS && !done) {
            TIDE_WARN(SUBSYS, "idle rank %d did not take the job's end within 2 s (gone?)", who[i]);
            MPI_Request_free(&reqs[i]);
        }
    }
    tide_free(reqs);
    tide_free(who);
    tide_error_clear();
    return TIDE_OK;
}
