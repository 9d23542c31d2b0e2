/*
 * coordinator/operators: an operator's submit, cancel and drain (see operators.h).
 */
#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "core/clock.h"
#include "core/error.h"
#include "coordinator/members.h"
#include "coordinator/offline.h"
#include "coordinator/operators.h"
#include "coordinator/policy.h"
#include "coordinator/reconf.h"

/* 1 when a program name is NULL, empty or only whitespace: no exec can start it, and each
   attempt would fail and burn one of the job's retries. */
static int blank(const char *prog)
{
    if (prog == NULL)
        return 1;
    while (*prog == ' ' || (*prog >= '\t' && *prog <= '\r'))
        prog++;
    return *prog == '\0';
}

static void handle_submit(tide_server_t *s, const tide_proto_submit_t *m)
{
    if (tide_coord_job_by_name(s->st, m->name) != NULL) {
        tide__reply_error(s, TIDE_ERR_EXISTS,
                          "a job named %s exists (tidectl jobs); pick another "
                          "name",
                          m->name);
        return;
    }
    if (m->kind == TIDE_JOB_ONLINE) {
        tide__reply_error(s, TIDE_ERR_INVALID,
                          "online jobs start when their training program joins; submit queues "
                          "offline work (kind command or plugin)");
        return;
    }
    if (m->kind == TIDE_JOB_COMMAND && (m->argc == 0 || blank(m->argv[0]))) {
        tide__reply_error(s, TIDE_ERR_INVALID,
                          "offline job %s has an empty command: give the program and its "
                          "arguments (tidectl submit --offline -- PROGRAM ARGS...)",
                          m->name);
        return;
    }
    if (m->kind == TIDE_JOB_PLUGIN && (m->max_memory != 0 || m->max_procs != 0)) {
        tide__reply_error(s, TIDE_ERR_INVALID,
                          "offline job %s: a memory or process limit applies to a command job; "
                          "a plugin runs inside the worker's own process",
                          m->name);
        return;
    }
    tide_coord_job_t *j = NULL;
    tide_status rc = tide_coord_job_add(s->st, 0, TIDE_CJOB_OFFLINE, &j);
    if (rc != TIDE_OK) {
        tide__reply_error(s, rc, "%s", tide_last_error());
        return;
    }
    snprintf(j->name, sizeof j->name, "%s", m->name);
    j->state = TIDE_JS_QUEUED;
    j->created_ms = tide_wall_ms();
    j->priority = m->priority;
    j->okind = m->kind == TIDE_JOB_PLUGIN ? TIDE_OFFLINE_PLUGIN : TIDE_OFFLINE_COMMAND;
    snprintf(j->plugin, sizeof j->plugin, "%s", m->plugin);
    j->mem_cap = m->mem_cap;
    j->bubbles = m->bubbles;
    j->max_attempts = s->cfg.max_attempts;
    j->grace_ms = s->cfg.grace_ms;
    if (j->okind == TIDE_OFFLINE_COMMAND) {
        /* a plugin runs inside the worker's process: these limits are a command's */
        j->max_memory = m->max_memory ? m->max_memory : s->cfg.offline_max_memory;
        j->max_procs = m->max_procs ? m->max_procs : s->cfg.offline_max_procs;
    }
    j->argv = tide_calloc(m->argc ? m->argc : 1, sizeof *j->argv);
    for (uint32_t i = 0; j->argv != NULL && i < m->argc; i++) {
        j->argv[i] = tide_strdup(m->argv[i]);
        if (j->argv[i] == NULL)
            break;
        j->argc++;
    }
    if (j->argv == NULL || j->argc != m->argc) {
        /* the half-built job stays out of the queue and the store */
        j->state = TIDE_JS_FAILED;
        tide__reply_error(s, TIDE_ERR_NOMEM, "out of memory queueing job %s", m->name);
        return;
    }
    char limits[96] = "";
    if (j->max_memory != 0 || j->max_procs != 0)
        snprintf(limits, sizeof limits, ", limits: memory %llu bytes, %u processes (0: none)",
                 (unsigned long long)j->max_memory, j->max_procs);
    tide__event(s, j->name, "submitted", "%s job, priority %d%s%s: %s%s%s",
                tide_proto_job_kind_name(m->kind), j->priority, j->bubbles ? ", bubbles" : "",
                limits, j->plugin, j->plugin[0] ? " " : "", j->argc ? j->argv[0] : "");
    tide__save_job(s, j);
    tide__reply_ok(s, j->name, "queued offline job %s with priority %d", j->name, j->priority);
    tide__reschedule(s);
}

static void handle_cancel(tide_server_t *s, const tide_proto_cancel_t *m)
{
    tide_coord_job_t *j = tide_coord_job_by_name(s->st, m->job);
    if (j == NULL) {
        tide__reply_error(s, TIDE_ERR_NOT_FOUND, "no job named %s (tidectl jobs lists them)",
                          m->job);
        return;
    }
    if (j->kind == TIDE_CJOB_ONLINE && j->state != TIDE_JS_DONE && j->state != TIDE_JS_CANCELLED) {
        size_t live = tide__live_members(s, j);
        if (live > 0) {
            tide__reply_error(s, TIDE_ERR_UNSUPPORTED,
                              "%s is an online training job with %zu live ranks: stop its "
                              "mpirun to end it; cancel stops offline work and online jobs "
                              "whose ranks are all gone",
                              j->name, live);
            return;
        }
        tide__job_release(s, j, TIDE_JS_CANCELLED);
        tide__event(s, j->name, "cancelled", "cancelled by %s: none of its ranks was alive",
                    s->req.who);
        tide__save_job(s, j);
        tide__reply_ok(s, j->name,
                       "cancelled %s (none of its ranks was alive); a new launch may use "
                       "its name",
                       j->name);
        return;
    }
    if (j->state == TIDE_JS_DONE || j->state == TIDE_JS_FAILED || j->state == TIDE_JS_CANCELLED) {
        tide__reply_error(s, TIDE_ERR_INVALID, "job %s has already ended (%s)", j->name,
                          tide_jstate_name(j->state));
        return;
    }
    if (j->state == TIDE_JS_ASSIGNED) {
        tide_coord_worker_t *w = tide_coord_worker_get(s->st, j->worker);
        if (w != NULL)
            tide__offline_send_preempt(s, j,
                                       w); /* the worker stays busy until it reports the stop */
    }
    j->state = TIDE_JS_CANCELLED;
    tide__event(s, j->name, "cancelled", "cancelled by %s", s->req.who);
    tide__save_job(s, j);
    tide__reply_ok(s, j->name, "cancelled %s", j->name);
}

/* Drains w, a member of j's committed layout: j switches to the layout policy.h plans
 * without it (tide_policy_drain). Replies. */
static void drain_member(tide_server_t *s, tide_coord_worker_t *w, tide_coord_job_t *j)
{
    tide_policy_worker *cand = NULL;
    size_t n = 0, n_pre = 0;
    tide_layout_t *l = NULL;
    tide_collection_t *coll = NULL;
    char shrink[TIDE_PROTO_TEXT_MAX + 1] = "";
    tide_status rc = tide__job_collection(j, &coll);
    if (rc == TIDE_OK)
        rc = tide__candidates(s, j, 0, &cand, &n);
    int32_t *pre = rc == TIDE_OK ? tide_malloc((n ? n : 1) * sizeof *pre) : NULL;
    if (rc == TIDE_OK && pre == NULL)
        rc = tide_errorf(TIDE_ERR_NOMEM, "out of memory planning the drain");
    if (rc == TIDE_OK)
        rc = tide_policy_drain(j->layout, coll, j->fit, (size_t)j->n_fit, cand, n,
                               tide_coord_job_rank(j, w), &l, pre, &n_pre, shrink, sizeof shrink);
    tide_free(cand);
    tide_collection_destroy(&coll);
    if (rc != TIDE_OK) {
        tide_free(pre);
        tide__reply_error(s, rc, "draining worker %d would leave job %s without a layout: %s",
                          w->id, j->name, tide_last_error());
        return;
    }
    w->state = TIDE_WS_DRAINING;
    tide__save_worker(s, w);
    char why[TIDE_RECONF_REASON_MAX];
    snprintf(why, sizeof why, "drain worker %d%s%s", w->id, shrink[0] ? "; " : "", shrink);
    rc = tide__reconf_start(s, j, l, pre, n_pre, 0, why, NULL);
    tide_free(pre);
    if (rc != TIDE_OK) {
        tide__reply_error(s, rc, "%s", tide_last_error());
        return;
    }
    tide__event(s, j->name, "drain", "worker %d drains: job %s moves off it", w->id, j->name);
    tide__reply_ok_gen(s, j->name, j->gen_issued,
                       "worker %d draining; job %s switches to generation %llu without it", w->id,
                       j->name, (unsigned long long)j->gen_issued);
}

/* 1 when drain request for w was answered here (refused, or a member's switch started);
 * 0 when w only needs marking draining. */
static int drain_answered(tide_server_t *s, tide_coord_worker_t *w)
{
    switch (w->state) {
    case TIDE_WS_FAILED:
    case TIDE_WS_LEFT:
        tide__reply_error(s, TIDE_ERR_INVALID, "worker %d has %s: nothing to drain", w->id,
                          w->state == TIDE_WS_LEFT ? "left" : "failed");
        return 1;
    case TIDE_WS_DRAINING:
        tide__reply_ok(s, "", "worker %d is already draining", w->id);
        return 1;
    case TIDE_WS_IDLE:
        if (w->job == 0)
            return 0;
        tide__reply_error(s, TIDE_ERR_BUSY,
                          "worker %d is joining a job's resize; drain it when that ends", w->id);
        return 1;
    case TIDE_WS_OFFLINE: {
        tide_coord_job_t *oj = tide_coord_job_get(s->st, w->offline_job);
        if (oj != NULL && oj->state == TIDE_JS_ASSIGNED && oj->worker == w->id) {
            tide__offline_send_preempt(s, oj, w);
            s->st->counters.preemptions++;
            tide__offline_requeue(s, oj, w->id, 0, "its worker is draining");
        }
        return 0;
    }
    case TIDE_WS_ONLINE: {
        tide_coord_job_t *j = tide_coord_job_get(s->st, w->job);
        if (j != NULL && j->reconf != NULL) {
            tide__reply_error(s, TIDE_ERR_BUSY,
                              "job %s is switching generations; drain worker %d when it ends",
                              j->name, w->id);
            return 1;
        }
        if (j == NULL || j->layout == NULL)
            return 0;
        drain_member(s, w, j);
        return 1;
    }
    }
    return 0;
}

static void handle_drain(tide_server_t *s, const tide_proto_drain_t *m)
{
    tide_coord_worker_t *w = tide_coord_worker_get(s->st, m->worker);
    if (w == NULL) {
        tide__reply_error(s, TIDE_ERR_NOT_FOUND, "no worker %d (tidectl status lists them)",
                          m->worker);
        return;
    }
    if (drain_answered(s, w))
        return;
    w->state = TIDE_WS_DRAINING;
    tide__event(s, "", "drain", "worker %d drained by %s", w->id, s->req.who);
    tide__save_worker(s, w);
    tide__reply_ok(s, "", "worker %d draining: it takes no new work", w->id);
}

void tide__on_submit(tide_server_t *s, const tide_msg_t *m, const void *raw, size_t len)
{
    (void)raw;
    (void)len;
    handle_submit(s, &m->u.submit);
}

void tide__on_cancel(tide_server_t *s, const tide_msg_t *m, const void *raw, size_t len)
{
    (void)raw;
    (void)len;
    handle_cancel(s, &m->u.cancel);
}

void tide__on_drain(tide_server_t *s, const tide_msg_t *m, const void *raw, size_t len)
{
    (void)raw;
    (void)len;
    handle_drain(s, &m->u.drain);
}
