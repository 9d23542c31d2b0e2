/*
 * coordinator/offline: the offline scheduler (see offline.h). Decisions are policy.h's;
 * this file keeps the books (job and worker states, events, persistence) and sends the
 * assignments and preemptions.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/log.h"
#include "coordinator/offline.h"
#include "coordinator/policy.h"

void tide__offline_requeue(tide_server_t *s, tide_coord_job_t *j, int32_t w_id, int failed,
                           const char *why)
{
    tide_proto_event_fields_t f;
    tide_event_fields_init(&f);
    if (w_id >= 0)
        tide_event_fields_worker(&f, &w_id, tide_coord_worker_get(s->st, w_id));
    tide_event_fields_reason(&f, why);
    j->worker = -1;
    if (failed) {
        j->failures++;
        j->last_failed = w_id;
    }
    if (failed && j->failures >= j->max_attempts) {
        j->state = TIDE_JS_FAILED;
        tide__event_f(s, j->name, "offline_failed", &f, "%s; gave up after %d failed attempts", why,
                      j->failures);
    } else if (failed) {
        int64_t ms = tide_policy_retry_backoff_ms(s->cfg.retry_backoff_ms, j->failures);
        j->state = TIDE_JS_QUEUED;
        j->retry_at_ns = s->now_ns + (uint64_t)ms * 1000000ull;
        tide__reschedule_at(s, j->retry_at_ns);
        tide__event_f(s, j->name, "offline_requeued", &f,
                      "%s; failure %d of %d: retried in %lld ms, on another worker than %d when "
                      "one is free",
                      why, j->failures, j->max_attempts, (long long)ms, w_id);
    } else {
        j->state = TIDE_JS_QUEUED;
        tide__event_f(s, j->name, "offline_requeued", &f,
                      "%s; requeued, not counted as a failure (%d of %d failures)", why,
                      j->failures, j->max_attempts);
    }
    tide__save_job(s, j);
    tide__reschedule(s);
}

void tide__offline_send_preempt(tide_server_t *s, const tide_coord_job_t *oj,
                                const tide_coord_worker_t *w)
{
    tide_msg_t m;
    tide_msg_init(&m, TIDE_MSG_PREEMPT);
    snprintf(m.u.preempt.job, sizeof m.u.preempt.job, "%s", oj->name);
    m.u.preempt.grace_ms = (int)(oj->grace_ms > 600000 ? 600000 : oj->grace_ms);
    tide__send_worker(s, w, &m);
}

void tide__preempt_for(tide_server_t *s, const tide_coord_job_t *j, tide_coord_worker_t *w,
                       uint64_t gen)
{
    tide_coord_job_t *oj = w ? tide_coord_job_get(s->st, w->offline_job) : NULL;
    if (oj == NULL)
        return;
    tide__offline_send_preempt(s, oj, w);
    s->st->counters.preemptions++;
    oj->state = TIDE_JS_QUEUED;
    oj->worker = -1;
    tide_proto_event_fields_t f;
    tide_event_fields_init(&f);
    f.gen = gen;
    tide_event_fields_worker(&f, &w->id, w);
    tide__event_f(s, oj->name, "preempted", &f,
                  "worker %d given to job %s generation %llu; requeued after attempt %d", w->id,
                  j->name, (unsigned long long)gen, oj->attempts);
    tide__save_job(s, oj);
    w->offline_job = 0;
    w->state = TIDE_WS_IDLE;
    tide__reschedule(s); /* the requeued job may go elsewhere, or into bubbles */
}

void tide__offline_bubbles_seen(tide_server_t *s, const tide_coord_worker_t *w, uint64_t bubble)
{
    if (s->bubbles.wait && bubble > 0 && w->state == TIDE_WS_ONLINE && w->offline_job == 0)
        tide__reschedule(s); /* the first bubbles measured here: a waiting job may fit */
}

static void assign(tide_server_t *s, tide_coord_job_t *j, tide_coord_worker_t *w)
{
    j->state = TIDE_JS_ASSIGNED;
    j->attempts++;
    j->worker = w->id;
    w->offline_job = j->id;
    if (w->state == TIDE_WS_IDLE)
        w->state = TIDE_WS_OFFLINE;
    tide_proto_event_fields_t f;
    tide_event_fields_init(&f);
    tide_event_fields_worker(&f, &w->id, w);
    f.bubbles = w->state == TIDE_WS_ONLINE;
    tide__event_f(s, j->name, "offline_assigned", &f, "attempt %d on worker %d (%s device %d)%s",
                  j->attempts, w->id, w->host, w->device,
                  f.bubbles ? " inside pipeline bubbles" : "");
    tide__save_job(s, j);
    tide__save_worker(s, w);
    tide_msg_t m;
    tide_msg_init(&m, TIDE_MSG_OFFLINE_ASSIGN);
    tide_proto_offline_assign_t *a = &m.u.offline_assign;
    snprintf(a->job, sizeof a->job, "%s", j->name);
    a->kind = j->okind == TIDE_OFFLINE_PLUGIN ? TIDE_JOB_PLUGIN : TIDE_JOB_COMMAND;
    snprintf(a->plugin, sizeof a->plugin, "%s", j->plugin);
    a->argv = j->argv;
    a->argc = j->argc;
    a->priority = j->priority;
    a->mem_cap = j->mem_cap;
    a->bubbles = j->bubbles;
    a->attempt = (uint32_t)j->attempts;
    a->grace_ms = (int)(j->grace_ms > 600000 ? 600000 : j->grace_ms < 0 ? 0 : j->grace_ms);
    a->max_memory = j->max_memory;
    a->max_procs = j->max_procs > TIDE_PROTO_PROCS_MAX ? TIDE_PROTO_PROCS_MAX : j->max_procs;
    tide__send_worker(s, w, &m);
}

/* A pool's ranks register and join their job a moment apart: between the two, and until
   the job placed its first layout, they are not offered offline work (the job would
   have to preempt it to start). A worker that joins no job gets it after join_grace_ms. */
static int ready_for_offline(tide_server_t *s, const tide_coord_worker_t *w, uint64_t *wake_ns)
{
    if (w->joined != 0) {
        const tide_coord_job_t *j = tide_coord_job_get(s->st, w->joined);
        /* a rank of a pool released from its job is finishing: its program exits */
        int p =
            j != NULL && j->kind == TIDE_CJOB_ONLINE ? tide_coord_job_pool_find(j, w->pool) : -1;
        if (p >= 0 && j->pools[p].left && j->state != TIDE_JS_DONE &&
            j->state != TIDE_JS_CANCELLED && j->state != TIDE_JS_FAILED)
            return 0;
        return j == NULL || j->layout != NULL || j->state == TIDE_JS_DONE ||
               j->state == TIDE_JS_CANCELLED || j->state == TIDE_JS_FAILED;
    }
    uint64_t grace = (uint64_t)(s->cfg.join_grace_ms > 0 ? s->cfg.join_grace_ms : 0) * 1000000ull;
    if (w->registered_ns == 0 || s->now_ns >= w->registered_ns + grace)
        return 1;
    uint64_t at = w->registered_ns + grace;
    if (*wake_ns == 0 || at < *wake_ns)
        *wake_ns = at;
    return 0;
}

/* A GPU (host, device) that a member of online job `job` holds. */
typedef struct held_gpu {
    const char *host;
    int32_t device;
    int64_t job;
} held_gpu;

static int cmp_held(const void *a, const void *b)
{
    const held_gpu *x = a, *y = b;
    int c = strcmp(x->host, y->host);
    return c != 0 ? c : (x->device > y->device) - (x->device < y->device);
}

/* The GPUs members of online jobs hold, sorted, into *out (caller frees); NULL and 0 when
   out of memory (nothing is then held back). */
static size_t held_gpus(const tide_coord_state_t *st, held_gpu **out)
{
    size_t n = 0;
    *out = tide_malloc((st->n_workers ? st->n_workers : 1) * sizeof **out);
    for (size_t i = 0; *out != NULL && i < st->n_workers; i++) {
        const tide_coord_worker_t *o = &st->workers[i];
        if (o->pool[0] != '\0' && o->job != 0 && !tide_coord_worker_gone(o))
            (*out)[n++] = (held_gpu){o->host, o->device, o->job};
    }
    if (n > 1)
        qsort(*out, n, sizeof **out, cmp_held);
    return n;
}

/*
 * 1 when idle worker w, a rank of a job it joined, sits on a GPU a member of another job
 * holds: a job's launch keeps its ranks when the job yields their GPUs to a higher-priority
 * job launched there (elastic rule yield), and those GPUs are not idle.
 */
static int gpu_taken(const held_gpu *h, size_t n, const tide_coord_worker_t *w)
{
    if (w->joined == 0 || n == 0)
        return 0;
    held_gpu key = {w->host, w->device, 0};
    const held_gpu *p = bsearch(&key, h, n, sizeof *h, cmp_held);
    if (p == NULL)
        return 0;
    while (p > h && cmp_held(p - 1, &key) == 0)
        p--;
    for (; p < h + n && cmp_held(p, &key) == 0; p++)
        if (p->job != w->joined)
            return 1;
    return 0;
}

/* Queued offline jobs ready to run now into q (room for every job); their count. The
 * earliest retry still backing off goes into *wake. */
static size_t queued_jobs(tide_server_t *s, tide_policy_offline *q, uint64_t *wake)
{
    size_t nq = 0;
    for (size_t i = 0; i < s->st->n_jobs; i++) {
        const tide_coord_job_t *j = s->st->jobs[i];
        if (j->kind != TIDE_CJOB_OFFLINE || j->state != TIDE_JS_QUEUED)
            continue;
        if (j->retry_at_ns > s->now_ns) {
            if (*wake == 0 || j->retry_at_ns < *wake)
                *wake = j->retry_at_ns; /* backing off after a failure */
            continue;
        }
        if (q != NULL)
            q[nq] = (tide_policy_offline){j->id, j->priority, j->mem_cap, j->last_failed};
        nq++;
    }
    return nq;
}

/* Gives --bubbles plugin work to the online workers whose measured bubbles are largest;
 * notes when such work waits for a worker with bubbles (s->bubbles.wait). */
static void fill_bubbles(tide_server_t *s)
{
    tide_coord_state_t *st = s->st;
    tide_policy_bubbles *cand = NULL;
    s->bubbles.wait = 0;
    for (size_t i = 0; i < st->n_jobs; i++) {
        tide_coord_job_t *j = st->jobs[i];
        if (j->kind != TIDE_CJOB_OFFLINE || j->state != TIDE_JS_QUEUED || !j->bubbles ||
            j->okind != TIDE_OFFLINE_PLUGIN || j->retry_at_ns > s->now_ns)
            continue;
        if (cand == NULL)
            cand = tide_malloc((st->n_workers ? st->n_workers : 1) * sizeof *cand);
        if (cand == NULL) {
            TIDE_WARN_LIMITED("offline", "out of memory choosing a worker's bubbles for %s",
                              j->name);
            break;
        }
        size_t n = 0;
        for (size_t k = 0; k < st->n_workers; k++) {
            const tide_coord_worker_t *w = &st->workers[k];
            if (w->state == TIDE_WS_ONLINE && w->offline_job == 0 && w->rid_len > 0)
                cand[n++] = (tide_policy_bubbles){(int32_t)k, w->bubble_ns, w->busy_ns};
        }
        long pick = tide_policy_bubble_pick(cand, n);
        if (pick < 0) {
            s->bubbles.wait = 1; /* retried when a worker reports bubbles */
            break;
        }
        assign(s, j, &st->workers[cand[pick].worker]);
    }
    tide_free(cand);
}

void tide__offline_backfill(tide_server_t *s)
{
    tide_coord_state_t *st = s->st;
    size_t ni = 0, n_pairs = 0, n_held = 0;
    held_gpu *held = NULL;
    int looked = 0; /* held: built once, for the first joined rank that may take work */
    uint64_t wake = 0;
    size_t nq = queued_jobs(s, NULL, &wake);
    if (nq == 0) {
        tide__reschedule_at(s, wake);
        return;
    }
    tide_policy_offline *q = tide_malloc(nq * sizeof *q);
    tide_policy_idle *idle = tide_malloc((st->n_workers ? st->n_workers : 1) * sizeof *idle);
    tide_policy_assignment *pairs = tide_malloc(nq * sizeof *pairs);
    if (q == NULL || idle == NULL || pairs == NULL)
        goto out;
    nq = queued_jobs(s, q, &wake);
    for (size_t i = 0; i < st->n_workers; i++) {
        const tide_coord_worker_t *w = &st->workers[i];
        /* connected since tided started, holding nothing, not reserved by a resize, past
           the moment between registering and its job's first layout, on a GPU no other
           job's member holds */
        if (!w->pool[0] || w->state != TIDE_WS_IDLE || w->job != 0 || w->offline_job != 0 ||
            w->rid_len == 0 || !ready_for_offline(s, w, &wake))
            continue;
        if (!looked && w->joined != 0) {
            n_held = held_gpus(st, &held);
            looked = 1;
        }
        if (!gpu_taken(held, n_held, w))
            idle[ni++] = (tide_policy_idle){w->id, w->memory};
    }
    tide__reschedule_at(s, wake);
    if (tide_policy_assign(q, nq, idle, ni, pairs, &n_pairs) != TIDE_OK)
        goto out;
    for (size_t i = 0; i < n_pairs; i++)
        assign(s, tide_coord_job_get(st, pairs[i].job), &st->workers[pairs[i].worker]);
    fill_bubbles(s);
out:
    tide_free(q);
    tide_free(idle);
    tide_free(pairs);
    tide_free(held);
}
