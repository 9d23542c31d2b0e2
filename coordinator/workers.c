/*
 * coordinator/workers: workers' messages about themselves (see workers.h).
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "core/clock.h"
#include "core/log.h"
#include "coordinator/allocations.h"
#include "coordinator/members.h"
#include "coordinator/offline.h"
#include "coordinator/reconf.h"
#include "coordinator/recovery.h"
#include "coordinator/sender.h"
#include "coordinator/stall.h"
#include "coordinator/workers.h"

/* ---- register -------------------------------------------------------------------------------- */

/* With --auth, the key owning a pool (every member has one owner), or NULL when the pool
 * has no keyed member yet. Rank 0 answers in O(1) in the usual case; else a scan. */
static const char *pool_owner(tide_server_t *s, const char *pool)
{
    tide_coord_worker_t *w = tide_coord_worker_find(s->st, pool, 0);
    if (w != NULL && w->owner[0] != '\0')
        return w->owner;
    for (size_t i = 0; i < s->st->n_workers; i++) {
        w = &s->st->workers[i];
        if (w->owner[0] != '\0' && strcmp(w->pool, pool) == 0)
            return w->owner;
    }
    return NULL;
}

/* Live workers the requesting client holds registered: with --auth those of its key,
 * else those whose last message came over its connection. */
static size_t client_workers(tide_server_t *s)
{
    size_t n = 0;
    for (size_t i = 0; i < s->st->n_workers; i++) {
        const tide_coord_worker_t *w = &s->st->workers[i];
        if (w->pool[0] == '\0' || tide_coord_worker_gone(w))
            continue;
        if (s->auth_on
                ? strcmp(w->owner, s->req.who) == 0
                : w->rid_len == s->req.rid_len && memcmp(w->rid, s->req.rid, s->req.rid_len) == 0)
            n++;
    }
    return n;
}

/* 1 (after replying the refusal) when m may not register: another key's (pool, rank) or
 * pool, the same fenced process again, or past the per-pool or per-client limit. w: the
 * worker already on (pool, rank), or NULL. */
static int register_refused(tide_server_t *s, const tide_proto_register_t *m,
                            tide_coord_worker_t *w)
{
    if (w != NULL && w->owner[0] != '\0' && !tide__may_speak(s, w, TIDE_MSG_REGISTER))
        return 1; /* another key registered this (pool, rank): it may not take the id over */
    if (w != NULL && tide__is_fenced(w) && w->pid == m->pid) {
        tide__tell_fenced(s, w); /* the same process, back after its job went on without it */
        return 1;
    }
    int cap = s->cfg.max_client_workers;
    if (cap > 0 && m->size > cap) {
        tide__reply_error(s, TIDE_ERR_RANGE,
                          "pool %s declares %d ranks, more than the %d one pool may register "
                          "(tided --max-client-workers)",
                          m->pool, m->size, cap);
        return 1;
    }
    /* a table of fewer slots than the limit cannot hold a client at it: no scan of the whole
       table for each of 10^5 registrations */
    if (cap > 0 && (w == NULL || tide_coord_worker_gone(w)) && s->st->n_workers >= (size_t)cap &&
        client_workers(s) >= (size_t)cap) {
        s->st->counters.denied++;
        TIDE_WARN_LIMITED("server",
                          "refused rank %d of pool %s from %s: it already holds %d "
                          "registered workers",
                          m->rank, m->pool, s->req.who, cap);
        tide__reply_error(s, TIDE_ERR_RANGE,
                          "%s already holds %d registered workers, the most one client may "
                          "(tided --max-client-workers): register each rank from its own "
                          "process, or raise the limit",
                          s->auth_on ? s->req.who : "this connection", cap);
        return 1;
    }
    const char *owner = s->auth_on && w == NULL ? pool_owner(s, m->pool) : NULL;
    if (owner != NULL && strcmp(owner, s->req.who) != 0) {
        s->st->counters.denied++;
        TIDE_WARN("auth", "refused rank %d of pool %s from %s: the pool belongs to %s", m->rank,
                  m->pool, s->req.who, owner);
        tide__reply_error(s, TIDE_ERR_DENIED,
                          "pool %s was registered with another key; %s may add ranks only to "
                          "its own pools",
                          m->pool, s->req.who);
        return 1;
    }
    return 0;
}

/* The worker of m's (pool, rank) as this process: added when new, back to idle when it was
 * gone, failed first when another process held it (whatever it held is gone). NULL after
 * an error reply. */
static tide_coord_worker_t *register_process(tide_server_t *s, const tide_proto_register_t *m,
                                             tide_coord_worker_t *w)
{
    if (w == NULL) {
        tide_status rc = tide_coord_worker_add(s->st, -1, m->pool, m->rank, &w);
        if (rc != TIDE_OK) {
            tide__reply_error(s, rc, "cannot register %s/%d: %s", m->pool, m->rank,
                              tide_last_error());
            return NULL;
        }
        w->pid = m->pid;
        w->registered_ns = s->now_ns;
        tide__event(s, "", "worker_registered", "worker %d: %s rank %d/%d on %s %s %d (%llu bytes)",
                    w->id, m->pool, m->rank, m->size, m->host, tide_proto_device_kind_name(m->kind),
                    m->device, (unsigned long long)m->mem_bytes);
    } else if (tide_coord_worker_gone(w)) {
        /* a new process on the rank (or the same one, when it held no online job) */
        int was_left = w->state == TIDE_WS_LEFT;
        w->state = TIDE_WS_IDLE;
        w->job = 0;
        w->offline_job = 0;
        w->joined = 0;
        w->gone_ms = 0;
        w->fenced_job = 0;
        w->fence_told = 0;
        w->pid = m->pid;
        w->registered_ns = s->now_ns;
        tide__event(s, "", "worker_back",
                    "worker %d (%s rank %d, pid %d) registered again after %s", w->id, m->pool,
                    m->rank, m->pid, was_left ? "leaving" : "failing");
    } else if (w->pid != m->pid) {
        /* A new process on the same rank: whatever the old one held is gone. */
        char why[128];
        snprintf(why, sizeof why, "process restarted (pid %d -> %d)", w->pid, m->pid);
        tide__touch(s, w);
        tide__worker_failed(s, w, why);
        w->state = TIDE_WS_IDLE;
        w->joined = 0;
        w->gone_ms = 0;
        w->fenced_job = 0; /* the process that held the job is gone; this one holds nothing */
        w->pid = m->pid;
        w->registered_ns = s->now_ns;
    } else {
        TIDE_INFO("server", "worker %d (%s rank %d) registered again (%s)", w->id, m->pool, m->rank,
                  tide_wstate_name(w->state));
    }
    return w;
}

void tide__on_register(tide_server_t *s, const tide_msg_t *msg, const void *raw, size_t len)
{
    (void)raw;
    (void)len;
    const tide_proto_register_t *m = &msg->u.reg;
    tide_coord_worker_t *w = tide_coord_worker_find(s->st, m->pool, m->rank);
    if (register_refused(s, m, w) || (w = register_process(s, m, w)) == NULL)
        return;
    snprintf(w->host, sizeof w->host, "%s", m->host);
    w->device = m->device;
    w->memory = m->mem_bytes;
    w->kind = (int32_t)m->kind;
    w->pool_size = m->size;
    w->last_hb_ns = s->now_ns;
    if (s->auth_on)
        snprintf(w->owner, sizeof w->owner, "%s", s->req.who);
    tide__touch(s, w);
    tide__save_worker(s, w);
    tide__alloc_register(s, w, &m->alloc);
    tide_msg_t r;
    tide_msg_init(&r, TIDE_MSG_REGISTER_OK);
    r.u.register_ok.worker = w->id;
    r.u.register_ok.heartbeat_ms = (int)s->cfg.heartbeat_ms;
    int64_t fail_ms = s->cfg.heartbeat_ms * (int64_t)s->cfg.miss_limit;
    r.u.register_ok.fail_ms = (int)(fail_ms > INT32_MAX ? INT32_MAX : fail_ms);
    tide__reply(s, &r);
    /* a participant of a pending switch gets its part again (tided may have restarted) */
    tide_coord_job_t *j = w->job ? tide_coord_job_get(s->st, w->job) : NULL;
    if (j != NULL && j->reconf != NULL)
        tide__reconf_resend_to(s, j, w);
    /* a rank of a pool that left its job: the release again (tided may have restarted
       before that rank heard it) */
    tide_coord_job_t *jj = w->joined ? tide_coord_job_get(s->st, w->joined) : NULL;
    if (jj != NULL && jj->kind == TIDE_CJOB_ONLINE)
        tide__send_release(s, jj, w);
    tide__reschedule(s);
}

/* ---- heartbeats ------------------------------------------------------------------------------ */

/* j's speed as its user sees it: steps per wall-clock second between step boundaries, what
 * the program does between steps (data loading, logging, pacing) included, measured over
 * windows of at least two heartbeat periods as j's furthest step advances. The workers' own
 * step_ms counts only time inside steps: 100-400 times the real speed for a loop that
 * loads data, and `tidectl checkpoint` picked steps the job never reached from it. */
static void job_speed(tide_server_t *s, tide_coord_job_t *j)
{
    uint64_t window = 2ull * (uint64_t)s->cfg.heartbeat_ms * 1000000ull;
    if (j->speed_t0_ns == 0 || j->step < j->speed_step0) { /* a rollback restarts it */
        j->speed_t0_ns = s->now_ns;
        j->speed_step0 = j->step;
        return;
    }
    if (s->now_ns - j->speed_t0_ns < window)
        return;
    double rate = (double)(j->step - j->speed_step0) * 1e9 / (double)(s->now_ns - j->speed_t0_ns);
    j->throughput = j->throughput > 0 ? 0.5 * j->throughput + 0.5 * rate : rate;
    j->speed_t0_ns = s->now_ns;
    j->speed_step0 = j->step;
}

/* What a heartbeat of live worker w reports: steps, generation, bubble and busy time. */
static void apply_heartbeat(tide_server_t *s, tide_coord_worker_t *w,
                            const tide_proto_heartbeat_t *m)
{
    s->st->counters.heartbeats++;
    uint64_t interval = s->now_ns - w->last_hb_ns;
    uint64_t cap = (uint64_t)s->cfg.heartbeat_ms * 1000000ull * 4;
    if (interval > cap)
        interval = cap;
    w->last_hb_ns = s->now_ns;
    w->step = (int64_t)(m->step > INT64_MAX ? INT64_MAX : m->step);
    w->generation = m->gen;
    uint64_t bubble = (uint64_t)(m->bubble_ms * 1e6);
    w->bubble_ns += bubble;
    s->bubbles.bubble_ns += bubble;
    if (m->step_ms > 0)
        w->busy_ns += interval;
    /* what tidectl status shows: the last few intervals, not the worker's whole life */
    double share = interval > 0 ? (double)bubble / (double)interval : 0.0;
    share = share > 1.0 ? 1.0 : share;
    w->bubble_recent =
        m->step_ms > 0 ? 0.7 * w->bubble_recent + 0.3 * share : 0.7 * w->bubble_recent;
    /* the part of the bubbles that offline task steps used, as the worker measured it */
    uint64_t filled = (uint64_t)(fmin(m->filled_ms, m->bubble_ms) * 1e6);
    s->bubbles.filled_ns += filled;
    w->filled_ns += filled;
    tide__offline_bubbles_seen(s, w, bubble);
    if (w->state == TIDE_WS_ONLINE && w->job != 0) {
        tide_coord_job_t *j = tide_coord_job_get(s->st, w->job);
        if (j != NULL && m->gen == j->generation && w->step > j->step)
            j->step = w->step;
        if (j != NULL)
            job_speed(s, j);
        if (j != NULL)
            tide__stall_heartbeat(s, w, m->in_step_ms, m->step_ms);
    }
}

/* The answer a heartbeat of a worker tided gave up on gets ("register again", or
   "fenced"), as a message for that worker. */
static void gone_answer(const tide_coord_worker_t *w, int32_t id, tide_msg_t *out)
{
    tide_msg_init(out, TIDE_MSG_ERROR);
    out->u.error.code = w ? TIDE_ERR_STALE : TIDE_ERR_NOT_FOUND;
    snprintf(out->u.error.message, sizeof out->u.error.message, "worker %d is %s: register again",
             id,
             w == NULL                  ? "unknown"
             : w->state == TIDE_WS_LEFT ? "gone (it said bye)"
                                        : "marked failed (missed heartbeats)");
}

static void handle_heartbeat(tide_server_t *s, const tide_proto_heartbeat_t *m)
{
    tide_coord_worker_t *w = tide_coord_worker_get(s->st, m->worker);
    if (w != NULL && tide_coord_worker_gone(w) && !tide__may_speak(s, w, TIDE_MSG_HEARTBEAT))
        return;
    if (w != NULL && tide__is_fenced(w)) {
        tide__tell_fenced(s, w);
        return;
    }
    if (w == NULL || tide_coord_worker_gone(w)) {
        tide_msg_t e;
        gone_answer(w, m->worker, &e);
        tide__reply(s, &e);
        return;
    }
    if (!tide__may_speak(s, w, TIDE_MSG_HEARTBEAT))
        return;
    tide__touch(s, w);
    apply_heartbeat(s, w, m);
}

/*
 * The heartbeats of the ranks of one host, sent by its leader: each entry counts exactly
 * as that rank's own heartbeat (liveness, accounting, refusals). The leader's own entry is
 * its heartbeat, answered on its connection. Another rank's is not the leader's to
 * answer: its route stays its own socket's (tided keeps sending it layouts there), and
 * what its own heartbeat would have been told (register again, fenced) goes to that
 * socket; an entry of a worker of another key (with --auth) is refused and skipped.
 */
void tide__on_host_heartbeat(tide_server_t *s, const tide_msg_t *msg, const void *raw, size_t len)
{
    (void)raw;
    (void)len;
    const tide_proto_host_heartbeat_t *m = &msg->u.host_heartbeat;
    for (uint32_t i = 0; i < m->n_beats; i++) {
        const tide_proto_heartbeat_t *b = &m->beats[i];
        if (b->worker == m->worker) {
            handle_heartbeat(s, b);
            continue;
        }
        tide_coord_worker_t *w = tide_coord_worker_get(s->st, b->worker);
        if (w != NULL && s->auth_on && strcmp(w->owner, s->req.who) != 0) {
            s->st->counters.denied++;
            TIDE_WARN_LIMITED("auth",
                              "host heartbeat from %s names worker %d, which belongs to %s: "
                              "entry skipped",
                              s->req.who, b->worker, w->owner[0] ? w->owner : "no key yet");
            continue;
        }
        if (w == NULL) {
            TIDE_WARN_LIMITED("server", "host heartbeat from %s names unknown worker %d",
                              s->req.who, b->worker);
            continue;
        }
        if (tide__is_fenced(w) || tide_coord_worker_gone(w)) {
            /* its own heartbeat would have been answered: answer it where it listens */
            tide_msg_t e;
            if (tide__is_fenced(w)) {
                const tide_coord_job_t *j = tide_coord_job_get(s->st, w->fenced_job);
                tide_msg_init(&e, TIDE_MSG_FENCED);
                e.u.fenced.worker = w->id;
                snprintf(e.u.fenced.job, sizeof e.u.fenced.job, "%s", j != NULL ? j->name : "");
                e.u.fenced.gen = j != NULL ? j->generation : 0;
                snprintf(e.u.fenced.reason, sizeof e.u.fenced.reason,
                         "worker %d (%s rank %d) was declared failed while it held a part of "
                         "job %s, which went on without it: this process must not touch its "
                         "old peers again and must exit",
                         w->id, w->pool, w->rank, j != NULL ? j->name : "?");
            } else {
                gone_answer(w, b->worker, &e);
            }
            tide__send_worker(s, w, &e);
            continue;
        }
        /* alive: renewed without taking its route (the leader's socket is not its own) */
        tide_coord_worker_seen(s->st, w, s->now_ns);
        apply_heartbeat(s, w, b);
    }
}

void tide__on_heartbeat(tide_server_t *s, const tide_msg_t *m, const void *raw, size_t len)
{
    (void)raw;
    (void)len;
    handle_heartbeat(s, &m->u.heartbeat);
}

/* ---- leaving --------------------------------------------------------------------------------- */

/* Tells the live ranks that joined j but hold none of its coordinates that it ended: a
   pool that never got connected (or whose peers cannot reach it) stops waiting. */
static void tell_idle_job_end(tide_server_t *s, const tide_coord_job_t *j, const char *why)
{
    tide_msg_t m;
    tide_msg_init(&m, TIDE_MSG_JOB_END);
    snprintf(m.u.job_end.job, sizeof m.u.job_end.job, "%s", j->name);
    snprintf(m.u.job_end.why, sizeof m.u.job_end.why, "%s", why);
    m.u.job_end.step = j->step > 0 ? (uint64_t)j->step : 0;
    int32_t world = tide_coord_job_world(j, 0);
    uint8_t *member = tide_calloc(world > 0 ? (size_t)world : 1, 1);
    if (member == NULL) {
        TIDE_WARN("server", "job %s: out of memory telling its idle ranks it ended", j->name);
        return;
    }
    for (size_t i = 0; j->layout != NULL && i < tide_layout_size(j->layout); i++)
        if (j->layout->worker[i] >= 0 && j->layout->worker[i] < world)
            member[j->layout->worker[i]] = 1;
    for (size_t i = 0; i < s->st->n_workers; i++) {
        tide_coord_worker_t *w = &s->st->workers[i];
        if (w->pool[0] == '\0' || w->joined != j->id || tide_coord_worker_gone(w))
            continue;
        int32_t jr = tide_coord_job_rank(j, w);
        if (jr >= 0 && jr < world && member[jr])
            continue; /* members end the job themselves */
        tide__send_worker(s, w, &m);
    }
    tide_free(member);
}

/*
 * Online job j ends (its program finished: a member said bye with no switch
 * pending): state done, members idle, no recovery. Byes of its other ranks are
 * then plain leaves.
 */
static void end_job(tide_server_t *s, tide_coord_job_t *j, const tide_coord_worker_t *by)
{
    size_t freed = 0;
    for (size_t i = 0; i < tide_layout_size(j->layout); i++) {
        tide_coord_worker_t *w = tide__job_worker(s, j, j->layout->worker[i]);
        if (w == NULL || w->job != j->id)
            continue;
        w->job = 0;
        if (w->state == TIDE_WS_ONLINE)
            w->state = TIDE_WS_IDLE;
        tide__save_worker(s, w);
        freed++;
    }
    tide_jstate was = j->state;
    j->state = TIDE_JS_DONE;
    char why[512];
    snprintf(why, sizeof why,
             "worker %d (rank %d) left with no switch pending: the job ends at step %lld under "
             "generation %llu%s; %zu workers released",
             by->id, by->rank, (long long)j->step, (unsigned long long)j->generation,
             was == TIDE_JS_STALLED ? " (it was stalled)" : "", freed);
    tide__event(s, j->name, "job_ended", "%s", why);
    tide__save_job(s, j);
    tell_idle_job_end(s, j, why);
    tide__reschedule(s);
}

void tide__on_bye(tide_server_t *s, const tide_msg_t *msg, const void *raw, size_t len)
{
    (void)raw;
    (void)len;
    const tide_proto_bye_t *m = &msg->u.bye;
    tide_coord_worker_t *w = tide__sender(s, m->worker, TIDE_MSG_BYE);
    if (w == NULL)
        return;
    tide_coord_job_t *j = w->job ? tide_coord_job_get(s->st, w->job) : NULL;
    int member = j != NULL && j->kind == TIDE_CJOB_ONLINE && j->layout != NULL &&
                 w->state == TIDE_WS_ONLINE &&
                 tide_coord_layout_has(j->layout, tide_coord_job_rank(j, w));
    /* a member's last step is the job's (its last heartbeat may be a period older) */
    if (member && m->step > (uint64_t)j->step && m->step <= (uint64_t)INT64_MAX)
        j->step = (int64_t)m->step;
    if (member && j->reconf == NULL && (j->state == TIDE_JS_RUNNING || j->state == TIDE_JS_STALLED))
        end_job(s, j, w); /* the training program finished; w->job is 0 now */
    int64_t jid = tide__worker_down(s, w, "worker_left", "left (bye)");
    /* a bye in the middle of a switch is a failure of that participant */
    tide__job_lost_worker(s, jid ? tide_coord_job_get(s->st, jid) : NULL, w, "left (bye)");
    tide__reply_ok(s, "", "worker %d removed", w->id);
}

void tide__on_failure(tide_server_t *s, const tide_msg_t *msg, const void *raw, size_t len)
{
    (void)raw;
    (void)len;
    const tide_proto_failure_t *m = &msg->u.failure;
    tide_coord_worker_t *w = tide__sender(s, m->worker, TIDE_MSG_FAILURE);
    if (w == NULL)
        return;
    char why[1200];
    snprintf(why, sizeof why, "reported failure %s (%s)%s%s", tide_status_name(m->code), m->reason,
             m->job[0] ? " in job " : "", m->job);
    tide__worker_failed(s, w, why);
    tide__reply_ok(s, m->job, "failure recorded");
}

/* ---- reports and queries --------------------------------------------------------------------- */

/* Records what worker w reported of attempt m->attempt of j (tidectl logs reads it). */
static void save_attempt(tide_server_t *s, const tide_coord_job_t *j, const tide_coord_worker_t *w,
                         const tide_proto_offline_status_t *m)
{
    tide_store_attempt_t *a = tide_calloc(1, sizeof *a);
    if (a == NULL) {
        TIDE_WARN_LIMITED("server", "out of memory recording attempt %u of %s", m->attempt,
                          j->name);
        return;
    }
    a->job = j->id;
    a->attempt = (int32_t)m->attempt;
    a->worker = w->id;
    snprintf(a->host, sizeof a->host, "%s", w->host);
    /* only a path of the attempt-log form for this job and attempt: tidectl logs prints
       the file on that host, and a worker-role client must not choose which */
    if (tide_proto_attempt_log_ok(m->log, j->name, m->attempt))
        snprintf(a->log, sizeof a->log, "%s", m->log);
    else if (m->log[0] != '\0')
        TIDE_WARN_LIMITED("server",
                          "worker %d reported '%s' as the log of attempt %u of %s: not an "
                          "attempt log's path, not kept",
                          w->id, m->log, m->attempt, j->name);
    a->state = (int)m->state;
    a->exit_code = m->exit_code;
    a->time_ms = tide_wall_ms();
    snprintf(a->tail, sizeof a->tail, "%s", m->tail);
    tide__save_attempt(s, a);
    tide_free(a);
}

/* The last line of an attempt's output that says something, as one line of printable
   text (other bytes as '?', cut at len - 1): why a failed attempt failed, for its event
   (a loader's or exec's error is the last thing the attempt wrote). 0 when none. */
static int last_line(const char *tail, char *out, size_t len)
{
    size_t end = strlen(tail);
    while (end > 0 && (unsigned char)tail[end - 1] <= ' ')
        end--;
    size_t start = end;
    while (start > 0 && tail[start - 1] != '\n')
        start--;
    size_t n = 0;
    for (size_t i = start; i < end && n + 1 < len; i++) {
        unsigned char c = (unsigned char)tail[i];
        out[n++] = c >= ' ' && c < 0x7f ? (char)c : '?';
    }
    out[n] = '\0';
    return n > 0;
}

void tide__on_offline_status(tide_server_t *s, const tide_msg_t *msg, const void *raw, size_t len)
{
    (void)raw;
    (void)len;
    const tide_proto_offline_status_t *m = &msg->u.offline_status;
    tide_coord_worker_t *w = tide__sender(s, m->worker, TIDE_MSG_OFFLINE_STATUS);
    if (w == NULL)
        return;
    tide_coord_job_t *j = tide_coord_job_by_name(s->st, m->job);
    if (j == NULL || j->kind != TIDE_CJOB_OFFLINE) {
        tide__reply_error(s, TIDE_ERR_NOT_FOUND, "no offline job named %s", m->job);
        return;
    }
    switch (m->state) {
    case TIDE_JOB_RUNNING:
    case TIDE_JOB_DONE:
    case TIDE_JOB_FAILED:
    case TIDE_JOB_PREEMPTED:
    case TIDE_JOB_CANCELLED:
        break;
    default:
        tide__reply_error(s, TIDE_ERR_INVALID,
                          "offline_status state must be running, done, failed, preempted or "
                          "cancelled, not %s",
                          tide_proto_job_state_name(m->state));
        return;
    }
    /* A report of an earlier attempt (settled already: requeued when it was preempted or
       its worker drained) is recorded for tidectl logs and frees the worker, nothing more. */
    int current = m->attempt == (uint32_t)j->attempts;
    int runs_here = j->state == TIDE_JS_ASSIGNED && j->worker == w->id;
    save_attempt(s, j, w, m);
    if (m->state == TIDE_JOB_RUNNING) {
        tide__reply_ok(s, j->name, "%s", "");
        return;
    }
    if (w->offline_job == j->id && (current || !runs_here)) {
        w->offline_job = 0;
        if (w->state == TIDE_WS_OFFLINE)
            w->state = TIDE_WS_IDLE;
        tide__save_worker(s, w);
        tide__reschedule(s);
    }
    if (!current) {
        tide__reply_ok(s, j->name, "%s", "");
        return;
    }
    if (j->state == TIDE_JS_ASSIGNED && j->worker == w->id) {
        char why[600], last[320];
        if (m->state == TIDE_JOB_DONE) {
            j->state = TIDE_JS_DONE;
            j->worker = -1;
            tide_proto_event_fields_t f;
            tide_event_fields_init(&f);
            tide_event_fields_worker(&f, &w->id, w);
            tide__event_f(s, j->name, "offline_done", &f, "finished on worker %d (attempt %d)",
                          w->id, j->attempts);
            tide__save_job(s, j);
        } else {
            last[0] = '\0';
            int said = m->state == TIDE_JOB_FAILED && last_line(m->tail, last, sizeof last);
            snprintf(why, sizeof why, "attempt %d on worker %d ended %s (exit code %d)%s%s",
                     j->attempts, w->id, tide_proto_job_state_name(m->state), m->exit_code,
                     said ? ": " : "", last);
            tide__offline_requeue(s, j, w->id, m->state == TIDE_JOB_FAILED, why);
        }
    }
    tide__reply_ok(s, j->name, "%s", "");
}

void tide__on_bubble(tide_server_t *s, const tide_msg_t *msg, const void *raw, size_t len)
{
    (void)raw;
    (void)len;
    const tide_proto_bubble_t *m = &msg->u.bubble;
    tide_coord_worker_t *w = tide__sender(s, m->worker, TIDE_MSG_BUBBLE);
    if (w != NULL)
        TIDE_DEBUG("server", "worker %d: %u bubble windows per step, mean %.3f ms, max %.3f ms",
                   w->id, m->windows, m->mean_ms, m->max_ms);
}

/*
 * Which of job m->job's ranks m->ranks are alive members now: held by a worker that is
 * neither failed nor gone and still holds a part of the job. A switch decides from this
 * which old members' state it must take from replicas, so the answer is exact for exactly
 * the ranks asked, whatever the size of the worker table.
 */
void tide__on_liveness(tide_server_t *s, const tide_msg_t *msg, const void *raw, size_t len)
{
    (void)raw;
    (void)len;
    const tide_proto_liveness_t *m = &msg->u.liveness;
    if (tide__sender(s, m->worker, TIDE_MSG_LIVENESS) == NULL)
        return;
    tide_coord_job_t *j = tide_coord_job_by_name(s->st, m->job);
    if (j == NULL || j->kind != TIDE_CJOB_ONLINE) {
        tide__reply_error(s, TIDE_ERR_NOT_FOUND, "no online job named %s", m->job);
        return;
    }
    int32_t *alive = tide_malloc(m->n_ranks * sizeof *alive);
    if (alive == NULL) {
        tide__reply_error(s, TIDE_ERR_NOMEM,
                          "out of memory answering a liveness request of %u "
                          "ranks",
                          m->n_ranks);
        return;
    }
    for (uint32_t i = 0; i < m->n_ranks; i++) {
        const tide_coord_worker_t *w = tide__job_worker(s, j, m->ranks[i]);
        alive[i] = w != NULL && !tide_coord_worker_gone(w) && w->job == j->id;
    }
    tide_msg_t r;
    tide_msg_init(&r, TIDE_MSG_LIVENESS_REPLY);
    snprintf(r.u.liveness_reply.job, sizeof r.u.liveness_reply.job, "%s", j->name);
    r.u.liveness_reply.ranks = m->ranks; /* borrowed: encoded before the request is freed */
    r.u.liveness_reply.n_ranks = m->n_ranks;
    r.u.liveness_reply.alive = alive;
    r.u.liveness_reply.n_alive = m->n_ranks;
    tide__reply(s, &r);
    tide_free(alive);
}
