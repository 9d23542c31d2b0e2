/*
 * worker/inbox: the training thread's inbox. The control thread posts tided's commands as
 * intents (decoded messages) to the intents mailbox; the training thread applies them to
 * its own state at its step boundaries (step.c), when it waits idle, between the steps of
 * an idle rank's plugin job (task.c) and as a job ends, and publishes its step agreement
 * for the control thread's answers, all inside the mailbox's lock. Also the report of a
 * plugin job's attempt, which the inbox sends for a job preempted before it started.
 *
 * Workload: a handful of intents per resize; one lock per step boundary.
 */
#include <stdio.h>
#include <string.h>

#include "core/error.h"
#include "core/log.h"
#include "worker/tide_int.h"

#define SUBSYS "worker"

void tide__task_report(tide_t *t, const char *job, uint32_t attempt, tide_proto_job_state_t st,
                       int code, double prog, const char *why)
{
    tide_msg_t m;
    tide_msg_init(&m, TIDE_MSG_OFFLINE_STATUS);
    m.u.offline_status.worker = tide__ctl_worker_id(t->ctl);
    snprintf(m.u.offline_status.job, sizeof m.u.offline_status.job, "%s", job);
    m.u.offline_status.attempt = attempt > 0 ? attempt : 1;
    m.u.offline_status.state = st;
    m.u.offline_status.exit_code = code < -255 ? -255 : code > 255 ? 255 : code;
    m.u.offline_status.progress = prog < 0 ? 0 : prog > 1 ? 1 : prog;
    snprintf(m.u.offline_status.tail, sizeof m.u.offline_status.tail, "%s", why);
    if (tide__ctl_send(t->ctl, &m) != TIDE_OK)
        TIDE_WARN(SUBSYS, "could not report offline job %s: %s", job, tide_last_error());
}

static int layout_has(const tide_proto_layout_t *l, int32_t rank)
{
    size_t n = (size_t)l->dp * (size_t)l->tp * (size_t)l->pp;
    for (size_t i = 0; i < n; i++)
        if (l->worker[i] == rank)
            return 1;
    return 0;
}

/* A layout tided announced: pending when newer than what runs and what was announced. */
static void on_layout(tide_t *t, tide_msg_t *m)
{
    const tide_proto_layout_msg_t *lm = &m->u.layout;
    int member_new = layout_has(&lm->layout, t->rank);
    int member_old = t->agree.gen == lm->prev.gen && layout_has(&lm->prev, t->rank);
    if (!tide__agree_layout(&t->agree, lm->layout.gen, member_new, member_old))
        return;
    tide_msg_clear(&t->pending);
    t->pending = *m;
    tide_msg_init(m, TIDE_MSG_NONE);
}

static void on_abort(tide_t *t, const tide_proto_abort_t *a)
{
    if (tide__agree_abort(&t->agree, a->gen) == TIDE__ABORT_CLEARED)
        tide_msg_clear(&t->pending);
}

/* A plugin job for this rank: task.c takes it (idle, or into the bubbles). */
static void on_assign(tide_t *t, tide_msg_t *m)
{
    if (t->plugin_ready) { /* the control thread hands one at a time: cannot be */
        TIDE_WARN(SUBSYS, "plugin job %s assigned while %s waits: refused", m->u.offline_assign.job,
                  t->plugin_job);
        tide__task_report(t, m->u.offline_assign.job, m->u.offline_assign.attempt,
                          TIDE_JOB_PREEMPTED, -15, 0, "");
        return;
    }
    snprintf(t->plugin_job, sizeof t->plugin_job, "%s", m->u.offline_assign.job);
    t->plugin = *m;
    tide_msg_init(m, TIDE_MSG_NONE);
    t->plugin_ready = 1;
    t->plugin_grace = -1;
}

/* tided preempts the plugin job: a running one stops at the next chance (task.c); one
   never taken stops here, with nothing to save (tided waits for the report to reuse the
   worker). */
static void on_preempt(tide_t *t, const tide_proto_preempt_t *p)
{
    if (strcmp(t->plugin_job, p->job) != 0)
        return;
    if (!t->plugin_ready) {
        t->plugin_grace = p->grace_ms;
        return;
    }
    uint32_t attempt = t->plugin.u.offline_assign.attempt;
    tide_msg_clear(&t->plugin);
    t->plugin_ready = 0;
    t->plugin_job[0] = '\0';
    t->plugin_grace = -1;
    tide__ctl_plugin_done(t->ctl, p->job);
    tide__task_report(t, p->job, attempt, TIDE_JOB_PREEMPTED, -15, 0, "");
}

void tide__inbox_apply(void *ctx, tide_msg_t *m)
{
    tide_t *t = ctx;
    switch (m->type) {
    case TIDE_MSG_LAYOUT:
        on_layout(t, m);
        break;
    case TIDE_MSG_PREPARE_ACK: /* the control thread acked it (from the published progress) */
        tide__agree_acked(&t->agree, m->u.prepare_ack.gen, (int64_t)m->u.prepare_ack.step);
        break;
    case TIDE_MSG_COMMIT:
        tide__agree_commit(&t->agree, m->u.commit.gen, (int64_t)m->u.commit.step,
                           m->u.commit.recover);
        break;
    case TIDE_MSG_ABORT:
        on_abort(t, &m->u.abort_);
        break;
    case TIDE_MSG_HALT:
        if (t->halt_code == 0 && m->u.halt.code != 0) {
            t->halt_code = m->u.halt.code;
            snprintf(t->halt_why, sizeof t->halt_why, "%s", m->u.halt.reason);
        }
        break;
    case TIDE_MSG_FENCED:
        t->fenced = 1;
        snprintf(t->fence_why, sizeof t->fence_why, "%s", m->u.fenced.reason);
        break;
    case TIDE_MSG_SAVE:
        if (m->u.save.step <= (uint64_t)INT64_MAX)
            tide__ckpt_request(t, &m->u.save);
        break;
    case TIDE_MSG_JOB_END:
        t->job_ended = 1;
        t->end_step = (int64_t)m->u.job_end.step;
        snprintf(t->end_why, sizeof t->end_why, "%s", m->u.job_end.why);
        break;
    case TIDE_MSG_RELEASE:
        if (m->u.release.gen > t->released_gen)
            t->released_gen = m->u.release.gen;
        break;
    case TIDE_MSG_OFFLINE_ASSIGN:
        on_assign(t, m);
        break;
    case TIDE_MSG_PREEMPT:
        on_preempt(t, &m->u.preempt);
        break;
    default:
        break;
    }
}

static void publish(void *ctx)
{
    tide_t *t = ctx;
    tide__progress_set(&t->progress, &t->agree);
}

void tide__drain(tide_t *t)
{
    tide__mailbox_drain(t->intents, tide__inbox_apply, t, publish, t);
}

void tide__drain_last(tide_t *t)
{
    if (t->ctl != NULL)
        tide__ctl_close_proposals(t->ctl);
    if (t->intents != NULL)
        tide__drain(t);
}

typedef struct change_ctx {
    tide_t *t;
    void (*fn)(tide_t *t, void *ctx);
    void *ctx;
} change_ctx;

static void change(void *arg)
{
    change_ctx *x = arg;
    x->fn(x->t, x->ctx);
    tide__progress_set(&x->t->progress, &x->t->agree);
}

void tide__agree_change(tide_t *t, void (*fn)(tide_t *t, void *ctx), void *ctx)
{
    change_ctx x = {t, fn, ctx};
    tide__mailbox_locked(t->intents, change, &x);
}
