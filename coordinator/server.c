/*
 * coordinator/server: tided's single-threaded event loop and the handlers of
 * worker and tidectl requests (see server.h). Reconfigurations live in
 * reconf.c, metrics in metrics.c, CURVE key handling in auth.c.
 *
 * A loop iteration: zmq_poll on the ROUTER socket, the ZAP socket and the
 * metrics sockets; drain up to BATCH requests or PASS_MS of work; run due timers (failure scan,
 * reconfiguration retransmits and deadlines) and the backfill pass; commit the
 * batch's SQLite transaction; only then send the batch's replies and commands.
 * Heartbeats change only volatile fields: no transaction, no reply.
 *
 * Liveness never depends on how long the loop was busy: a message is stamped
 * with the time it is read, and a worker is judged at the last time the queue
 * was seen empty (drained_ns), when everything it sent before has been read. When
 * tided itself did not run on time (its failure scan overdue by more than a heartbeat
 * period: CPU starvation, a slow disk commit, a paused VM), messages may still sit in
 * ZeroMQ's I/O thread or the kernel; it gives every worker one more failure timeout
 * instead of judging them by its own lateness. No
 * client can starve the others: ZeroMQ reads connections round-robin, and a
 * client whose operator requests used PEER_PASS_MS of handler time in a pass
 * gets its further ones in that pass refused (TIDE_ERR_BUSY, cheap) instead of
 * served, and so does one whose replies queued PEER_PASS_BYTES in that pass. Per-connection
 * queues are bounded (HWM messages each way), so a client that never reads its replies
 * costs tided a bounded amount of memory.
 *
 * Envelope: DEALER clients send [payload] (ROUTER sees [id][payload]); REQ-style
 * clients may add an empty delimiter ([id][][payload]); replies mirror it.
 */
#include <math.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/clock.h"
#include "core/error.h"
#include "core/log.h"
#include "coordinator/policy.h"
#include "coordinator/server_int.h"

#define BATCH        2048 /* requests per loop iteration before timers and the commit */
#define PASS_MS      50   /* handler time of one pass before timers, the commit and the replies */
#define PEER_PASS_MS 10   /* handler time one client's operator requests may use per pass */
/* Messages queued per connection each way; a client that floods waits in its own queue.
 * ZeroMQ counts messages, not bytes, so this
 * (with ZeroMQ's low-water slack of half of it) times the largest reply is what such a
 * client can hold in tided: 64 status replies of a 200-worker cluster are 2 MB, where
 * 1000 were 30-45 MB. A burst beyond it waits in tided's backlog for the client
 * (TIDE__BACKLOG_BYTES), so a client that never reads holds at most
 * 1.5 * HWM * its largest reply + TIDE__BACKLOG_BYTES + PEER_PASS_BYTES in tided. */
#define HWM             64
#define PEER_PASS_BYTES (4u << 20)  /* reply bytes one client's requests may queue per pass */
#define FORGET_SLICE    8192u       /* worker slots the retention pass looks at per second */
#define SCAN_OUT_BYTES  (64u << 20) /* outbox bytes past which the failure scan waits a pass */

static uint64_t now_ns_cached;

void tide_server_config_defaults(tide_server_config *cfg)
{
    memset(cfg, 0, sizeof *cfg);
    cfg->endpoint = "tcp://127.0.0.1:5555";
    cfg->state_path = "./tide-state.db";
    cfg->heartbeat_ms = 1000;
    cfg->miss_limit = 3;
    cfg->sync_full = 1;
    cfg->resize_timeout_ms = 120000;
    cfg->grace_ms = 10000;
    cfg->link_bytes_per_s = 10e9;
    cfg->max_attempts = 3;
    cfg->retry_backoff_ms = 1000;
    cfg->join_grace_ms = 30000;
    cfg->batch_ms = 2;
    cfg->retention_ms = 3600000;
    cfg->max_client_workers = 65536;
    cfg->status_page = 16384; /* 16384 rows of the longest names stay far below a message's
                                 32 MiB */
}

/* ---- outbox ------------------------------------------------------------------------------ */

static void push_out(tide_server_t *s, const unsigned char *rid, size_t rid_len, int delim,
                     int reply, const tide_msg_t *msg)
{
    if (rid_len == 0)
        return; /* never connected since tided started: the retransmit timer covers it */
    tide_status rc = tide_proto_encode(msg, &s->buf);
    if (rc != TIDE_OK) {
        TIDE_ERROR("server", "cannot encode '%s': %s", tide_msg_type_name(msg->type),
                   tide_last_error());
        return;
    }
    if (s->n_out == s->cap_out) {
        size_t cap = s->cap_out ? s->cap_out * 2 : 256;
        tide__out *o = tide_reallocarray(s->out, cap, sizeof *o);
        if (o == NULL) {
            TIDE_ERROR("server", "out of memory queueing a '%s'", tide_msg_type_name(msg->type));
            return;
        }
        s->out = o;
        s->cap_out = cap;
    }
    tide__out *o = &s->out[s->n_out++];
    memcpy(o->rid, rid, rid_len);
    o->rid_len = rid_len;
    o->delim = delim;
    o->reply = reply;
    o->data = tide_proto_buf_release(&s->buf, &o->len);
    s->out_bytes += o->len;
}

void tide__send_worker(tide_server_t *s, const tide_coord_worker_t *w, const tide_msg_t *msg)
{
    push_out(s, w->rid, w->rid_len, w->delim, 0, msg);
}

void tide__reply(tide_server_t *s, const tide_msg_t *msg)
{
    push_out(s, s->rid, s->rid_len, s->delim, 1, msg);
}

tide_status tide__reply_error(tide_server_t *s, tide_status code, const char *fmt, ...)
{
    tide_msg_t m;
    tide_msg_init(&m, TIDE_MSG_ERROR);
    m.u.error.code = code < 0 ? code : TIDE_ERR_INTERNAL;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m.u.error.message, sizeof m.u.error.message, fmt, ap);
    va_end(ap);
    TIDE_INFO_LIMITED("server", "refused a request from %s: %s", s->who, m.u.error.message);
    tide__reply(s, &m);
    return code;
}

static void reply_ok(tide_server_t *s, const char *job, const char *fmt, ...) TIDE_PRINTF(3, 4);

static void reply_ok(tide_server_t *s, const char *job, const char *fmt, ...)
{
    tide_msg_t m;
    tide_msg_init(&m, TIDE_MSG_OK);
    snprintf(m.u.ok.job, sizeof m.u.ok.job, "%s", job ? job : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m.u.ok.message, sizeof m.u.ok.message, fmt, ap);
    va_end(ap);
    tide__reply(s, &m);
}

/* Sends o's frames; 0, or the errno of the first frame (EAGAIN: its queue is full). */
static int send_frames(tide_server_t *s, const tide__out *o)
{
    if (zmq_send(s->router, o->rid, o->rid_len, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0)
        return errno;
    /* the later frames of a message whose first frame went in cannot be refused */
    if (o->delim)
        zmq_send(s->router, "", 0, ZMQ_SNDMORE | ZMQ_DONTWAIT);
    zmq_send(s->router, o->data, o->len, ZMQ_DONTWAIT);
    return 0;
}

static tide__backlog *backlog_find(tide_server_t *s, const unsigned char *rid, size_t rid_len)
{
    for (size_t i = 0; i < s->n_backlog; i++)
        if (s->backlog[i].rid_len == rid_len && memcmp(s->backlog[i].rid, rid, rid_len) == 0)
            return &s->backlog[i];
    return NULL;
}

/* Frees what b holds and removes it from the table. */
static void backlog_remove(tide_server_t *s, tide__backlog *b)
{
    for (size_t i = b->head; i < b->n; i++) {
        tide_free(b->msgs[i].data);
        s->dropped_out++;
    }
    tide_free(b->msgs);
    *b = s->backlog[--s->n_backlog];
}

/* Takes o (and its data) into b, or drops it when b is full; NULL b drops it too. */
static void backlog_push(tide_server_t *s, tide__backlog *b, tide__out *o)
{
    if (b != NULL && b->bytes + o->len <= TIDE__BACKLOG_BYTES) {
        if (b->n == b->cap) {
            size_t cap = b->cap ? b->cap * 2 : 16;
            tide__out *m = tide_reallocarray(b->msgs, cap, sizeof *m);
            if (m != NULL) {
                b->msgs = m;
                b->cap = cap;
            }
        }
        if (b->n < b->cap) {
            b->msgs[b->n++] = *o;
            b->bytes += o->len;
            return;
        }
    }
    TIDE_WARN_LIMITED("server",
                      "dropped a %zu-byte message for a client that does not read "
                      "its replies (its queue and tided's backlog for it are full)",
                      o->len);
    tide_free(o->data);
    s->dropped_out++;
}

/* Sends what waits in backlogs, oldest first, until a client's queue is full again. */
static void drain_backlogs(tide_server_t *s)
{
    for (size_t i = 0; i < s->n_backlog;) {
        tide__backlog *b = &s->backlog[i];
        int r = 0;
        while (b->head < b->n && (r = send_frames(s, &b->msgs[b->head])) == 0) {
            b->bytes -= b->msgs[b->head].len;
            tide_free(b->msgs[b->head].data);
            b->head++;
        }
        if (r == EAGAIN) {
            if (b->head > 0) { /* keep the array; move the waiting ones to its front */
                memmove(b->msgs, b->msgs + b->head, (b->n - b->head) * sizeof *b->msgs);
                b->n -= b->head;
                b->head = 0;
            }
            i++;
            continue;
        }
        backlog_remove(s, b); /* drained, or the client is gone */
    }
}

/*
 * Sends the batch's messages. A client's ZeroMQ queue holds HWM messages; past that,
 * ROUTER_MANDATORY makes ZeroMQ say so instead of dropping, and the rest wait in
 * tided's backlog for that client, bounded in bytes, so a burst of replies to a client
 * that pipelines requests is delivered and one that never reads costs a bounded amount.
 */
static void flush_out(tide_server_t *s)
{
    drain_backlogs(s);
    for (size_t i = 0; i < s->n_out; i++) {
        tide__out *o = &s->out[i];
        tide__backlog *b = backlog_find(s, o->rid, o->rid_len);
        if (b == NULL) {
            int r = send_frames(s, o);
            if (r == 0) {
                tide_free(o->data);
                continue;
            }
            if (r != EAGAIN) { /* the client is gone: senders retransmit */
                tide_free(o->data);
                s->dropped_out++;
                continue;
            }
            if (s->n_backlog < TIDE__BACKLOG_PEERS) {
                b = &s->backlog[s->n_backlog++];
                memset(b, 0, sizeof *b);
                memcpy(b->rid, o->rid, o->rid_len);
                b->rid_len = o->rid_len;
            }
        }
        backlog_push(s, b, o);
    }
    s->n_out = 0;
    s->out_bytes = 0;
}

static void drop_out(tide_server_t *s)
{
    for (size_t i = 0; i < s->n_out; i++)
        tide_free(s->out[i].data);
    s->n_out = 0;
    s->out_bytes = 0;
    while (s->n_backlog > 0)
        backlog_remove(s, &s->backlog[0]);
}

/* ---- durable changes ----------------------------------------------------------------------- */

static int store_ready(tide_server_t *s)
{
    if (s->fatal != TIDE_OK)
        return 0;
    tide_status rc = tide_store_begin(s->store);
    if (rc != TIDE_OK) {
        s->fatal = rc;
        TIDE_ERROR("store", "%s", tide_last_error());
        return 0;
    }
    return 1;
}

static void store_result(tide_server_t *s, tide_status rc)
{
    if (rc != TIDE_OK && s->fatal == TIDE_OK) {
        s->fatal = rc;
        TIDE_ERROR("store", "%s", tide_last_error());
    }
}

void tide__save_worker(tide_server_t *s, const tide_coord_worker_t *w)
{
    if (store_ready(s))
        store_result(s, tide_store_put_worker(s->store, w));
}

void tide__save_job(tide_server_t *s, const tide_coord_job_t *j)
{
    if (store_ready(s))
        store_result(s, tide_store_put_job(s->store, j));
}

void tide__event(tide_server_t *s, const char *job, const char *kind, const char *fmt, ...)
{
    char detail[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(detail, sizeof detail, fmt, ap);
    va_end(ap);
    s->events_total++;
    if (store_ready(s))
        store_result(s, tide_store_event(s->store, tide_wall_ms(), job, kind, "%s", detail));
}

/* ---- helpers ------------------------------------------------------------------------------ */

tide_coord_worker_t *tide__job_worker(tide_server_t *s, const tide_coord_job_t *j, int32_t rank)
{
    int32_t r = 0;
    int p = tide_coord_job_locate(j, rank, &r);
    return p < 0 ? NULL : tide_coord_worker_find(s->st, j->pools[p].name, r);
}

void tide__layout_msg_init(tide_msg_t *m, const tide_coord_job_t *j, const tide_coord_worker_t *w)
{
    tide_msg_init(m, TIDE_MSG_LAYOUT);
    snprintf(m->u.layout.job, sizeof m->u.layout.job, "%s", j->name);
    int p = tide_coord_job_pool_find(j, w->pool);
    m->u.layout.base = p >= 0 ? j->pools[p].base : 0;
    m->u.layout.world = tide_coord_job_world(j, 0);
    if (m->u.layout.world < 1)
        m->u.layout.world = 1;
}

tide_status tide__layout_worker_ids(tide_server_t *s, const tide_coord_job_t *j,
                                    const tide_layout_t *l, tide_layout_t **out)
{
    *out = NULL;
    tide_layout_t *c = NULL;
    TIDE_CHECK(tide_layout_copy(&c, l));
    for (size_t i = 0; i < tide_layout_size(c); i++) {
        const tide_coord_worker_t *w = tide__job_worker(s, j, c->worker[i]);
        if (w == NULL) {
            int32_t rank = c->worker[i];
            tide_layout_destroy(&c);
            return tide_errorf(TIDE_ERR_NOT_FOUND,
                               "job %s: job rank %d holds a coordinate but no registered "
                               "worker holds it",
                               j->name, (int)rank);
        }
        c->worker[i] = w->id;
    }
    *out = c;
    return TIDE_OK;
}

void tide__proto_layout(tide_proto_layout_t *out, const tide_layout_t *l, uint64_t gen)
{
    out->gen = gen;
    out->dp = l->dp;
    out->tp = l->tp;
    out->pp = l->pp;
    out->num_layers = l->num_layers;
    out->micro_batches = l->micro_batches;
    out->stage_start = l->stage_start;
    out->worker = l->worker;
}

static void touch(tide_server_t *s, tide_coord_worker_t *w)
{
    tide_coord_worker_seen(s->st, w, now_ns_cached);
    if (w->rid_len != s->rid_len || memcmp(w->rid, s->rid, s->rid_len) != 0) {
        memcpy(w->rid, s->rid, s->rid_len);
        w->rid_len = s->rid_len;
    }
    w->delim = s->delim;
}

/*
 * With --auth, a worker id belongs to the key that registered it: another key
 * (even a worker key of the same pool name) may not speak for it. Refused and
 * logged; nothing in the message is acted on. 1 when allowed.
 */
static int may_speak(tide_server_t *s, const tide_coord_worker_t *w, tide_msg_type_t type)
{
    if (!s->auth_on || strcmp(w->owner, s->who) == 0)
        return 1;
    s->st->counters.denied++;
    if (w->owner[0] == '\0') {
        /* state written by a tided without --auth: the worker binds its key by registering */
        tide__reply_error(s, TIDE_ERR_NOT_FOUND,
                          "worker %d is not bound to a key yet: register again", w->id);
        return 0;
    }
    TIDE_WARN_LIMITED("auth", "refused '%s' for worker %d from %s: that worker id belongs to %s",
                      tide_msg_type_name(type), w->id, s->who, w->owner);
    tide__reply_error(s, TIDE_ERR_DENIED,
                      "worker %d was registered with another key; %s may only speak for the "
                      "workers it registered",
                      w->id, s->who);
    return 0;
}

/* 1 when w is a process tided gave up on while it held a part of an online job that then
 * went on without it: it may still hold that generation's communicators. */
static int is_fenced(const tide_coord_worker_t *w)
{
    return w->state == TIDE_WS_FAILED && w->fenced_job != 0;
}

/*
 * Answers a message of fenced worker w with "fenced" (never with a request to register
 * again, which would put a process that still holds the old generation's communicators
 * back into the pool as idle). The first time in this tided process, an event says so.
 */
static void tell_fenced(tide_server_t *s, tide_coord_worker_t *w)
{
    const tide_coord_job_t *j = tide_coord_job_get(s->st, w->fenced_job);
    tide_msg_t m;
    tide_msg_init(&m, TIDE_MSG_FENCED);
    m.u.fenced.worker = w->id;
    snprintf(m.u.fenced.job, sizeof m.u.fenced.job, "%s", j != NULL ? j->name : "");
    m.u.fenced.gen = j != NULL ? j->generation : 0;
    snprintf(m.u.fenced.reason, sizeof m.u.fenced.reason,
             "worker %d (%s rank %d) was declared failed while it held a part of job %s, which "
             "went on without it (generation %llu now): this process must not touch its old "
             "peers again and must exit; a new process on its rank may register",
             w->id, w->pool, w->rank, j != NULL ? j->name : "?",
             (unsigned long long)(j != NULL ? j->generation : 0));
    tide__reply(s, &m);
    if (!w->fence_told) {
        w->fence_told = 1;
        tide__event(s, j != NULL ? j->name : "", "worker_fenced",
                    "worker %d (%s rank %d, pid %d) spoke again after job %s went on without it: "
                    "told it was fenced; it stays failed",
                    w->id, w->pool, w->rank, w->pid, j != NULL ? j->name : "?");
    }
}

/* The sending worker by id, checked against the sender's key and touched; NULL after an
 * error (or fenced) reply. */
static tide_coord_worker_t *sender(tide_server_t *s, int32_t id, tide_msg_type_t type)
{
    tide_coord_worker_t *w = tide_coord_worker_get(s->st, id);
    if (w == NULL) {
        tide__reply_error(s, TIDE_ERR_NOT_FOUND,
                          "unknown worker %d: register first (tided may have a new state file)",
                          id);
        return NULL;
    }
    if (!may_speak(s, w, type))
        return NULL;
    if (is_fenced(w)) {
        tell_fenced(s, w);
        return NULL;
    }
    touch(s, w);
    return w;
}

static void send_layout(tide_server_t *s, const tide_coord_job_t *j, const tide_coord_worker_t *w)
{
    tide_msg_t m;
    tide__layout_msg_init(&m, j, w);
    tide__proto_layout(&m.u.layout.layout, j->layout, j->generation);
    m.u.layout.has_prev = 0;
    tide__send_worker(s, w, &m);
}

/* Backoff before the retry after the n-th failure: base * 2^(n-1), at most 60 s (ms). */
static int64_t retry_backoff_ms(const tide_server_t *s, int32_t failures)
{
    int64_t ms = s->cfg.retry_backoff_ms;
    for (int32_t i = 1; i < failures && ms < 60000; i++)
        ms *= 2;
    return ms > 60000 ? 60000 : ms;
}

/*
 * Offline job j leaves its worker w_id. failed: the attempt's own failure (the command
 * exited nonzero or could not start): it counts against max_attempts, and the retry
 * waits its backoff and prefers another worker. Otherwise (preempted, the worker left,
 * failed or drains) the job is requeued as it was: no attempt is used up.
 */
static void requeue(tide_server_t *s, tide_coord_job_t *j, int32_t w_id, int failed,
                    const char *why)
{
    j->worker = -1;
    if (failed) {
        j->failures++;
        j->last_failed = w_id;
    }
    if (failed && j->failures >= j->max_attempts) {
        j->state = TIDE_JS_FAILED;
        tide__event(s, j->name, "offline_failed", "%s; gave up after %d failed attempts", why,
                    j->failures);
    } else if (failed) {
        int64_t ms = retry_backoff_ms(s, j->failures);
        j->state = TIDE_JS_QUEUED;
        j->retry_at_ns = now_ns_cached + (uint64_t)ms * 1000000ull;
        if (s->next_backfill_ns == 0 || j->retry_at_ns < s->next_backfill_ns)
            s->next_backfill_ns = j->retry_at_ns;
        tide__event(s, j->name, "offline_requeued",
                    "%s; failure %d of %d: retried in %lld ms, on another worker than %d when "
                    "one is free",
                    why, j->failures, j->max_attempts, (long long)ms, w_id);
    } else {
        j->state = TIDE_JS_QUEUED;
        tide__event(s, j->name, "offline_requeued",
                    "%s; requeued, not counted as a failure (%d of %d failures)", why, j->failures,
                    j->max_attempts);
    }
    tide__save_job(s, j);
    s->want_backfill = 1;
}

int64_t tide__worker_down(tide_server_t *s, tide_coord_worker_t *w, const char *kind,
                          const char *reason)
{
    if (tide_coord_worker_gone(w))
        return 0;
    int left = strcmp(kind, "worker_left") == 0;
    const tide_coord_job_t *held = w->job ? tide_coord_job_get(s->st, w->job) : NULL;
    /* a failure while holding a part of an online job fences this process: the job goes
       on without it, and it is told so when it speaks again instead of rejoining the pool */
    if (!left && held != NULL && held->kind == TIDE_CJOB_ONLINE)
        w->fenced_job = held->id;
    w->state = left ? TIDE_WS_LEFT : TIDE_WS_FAILED;
    w->gone_ms = tide_wall_ms();
    tide__event(s, "", kind, "worker %d (%s rank %d on %s device %d): %s", w->id, w->pool, w->rank,
                w->host, w->device, reason);
    if (w->offline_job != 0) {
        tide_coord_job_t *oj = tide_coord_job_get(s->st, w->offline_job);
        w->offline_job = 0;
        if (oj != NULL && oj->state == TIDE_JS_ASSIGNED && oj->worker == w->id) {
            char why[160];
            snprintf(why, sizeof why, "attempt %d: worker %d %s", oj->attempts, w->id,
                     strcmp(kind, "worker_left") == 0 ? "left" : "failed");
            requeue(s, oj, w->id, 0, why);
        }
    }
    int64_t jid = w->job;
    w->job = 0;
    tide__save_worker(s, w);
    s->want_backfill = 1;
    return jid;
}

/* Worker w, which held a coordinate of or took part in j's switch, is gone. */
static void job_lost_worker(tide_server_t *s, tide_coord_job_t *j, tide_coord_worker_t *w,
                            const char *reason)
{
    if (j == NULL || j->kind != TIDE_CJOB_ONLINE)
        return;
    int32_t jr = tide_coord_job_rank(j, w);
    if (jr < 0)
        return;
    if (j->reconf != NULL && tide_reconf_find(j->reconf, jr) >= 0)
        tide__reconf_participant_failed(s, j, w);
    else if (j->layout != NULL && tide_coord_layout_has(j->layout, jr))
        tide__recover(s, j, reason);
}

void tide__worker_failed(tide_server_t *s, tide_coord_worker_t *w, const char *reason)
{
    if (tide_coord_worker_gone(w))
        return;
    int64_t jid = tide__worker_down(s, w, "worker_failed", reason);
    job_lost_worker(s, jid ? tide_coord_job_get(s->st, jid) : NULL, w, reason);
}

/*
 * Online job j ends (its program finished: a member said bye with no switch
 * pending): state done, members idle, no recovery. Byes of its other ranks are
 * then plain leaves.
 */
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
    s->want_backfill = 1;
}

/* ---- worker requests ---------------------------------------------------------------------- */

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
        if (s->auth_on ? strcmp(w->owner, s->who) == 0
                       : w->rid_len == s->rid_len && memcmp(w->rid, s->rid, s->rid_len) == 0)
            n++;
    }
    return n;
}

static void handle_register(tide_server_t *s, const tide_proto_register_t *m)
{
    tide_coord_worker_t *w = tide_coord_worker_find(s->st, m->pool, m->rank);
    if (w != NULL && w->owner[0] != '\0' && !may_speak(s, w, TIDE_MSG_REGISTER))
        return; /* another key registered this (pool, rank): it may not take the id over */
    if (w != NULL && is_fenced(w) && w->pid == m->pid) {
        tell_fenced(s, w); /* the same process, back after its job went on without it */
        return;
    }
    int cap = s->cfg.max_client_workers;
    if (cap > 0 && m->size > cap) {
        tide__reply_error(s, TIDE_ERR_RANGE,
                          "pool %s declares %d ranks, more than the %d one pool may register "
                          "(tided --max-client-workers)",
                          m->pool, m->size, cap);
        return;
    }
    /* a table of fewer slots than the limit cannot hold a client at it: no scan of the whole
       table for each of 10^5 registrations */
    if (cap > 0 && (w == NULL || tide_coord_worker_gone(w)) && s->st->n_workers >= (size_t)cap &&
        client_workers(s) >= (size_t)cap) {
        s->st->counters.denied++;
        TIDE_WARN_LIMITED("server",
                          "refused rank %d of pool %s from %s: it already holds %d "
                          "registered workers",
                          m->rank, m->pool, s->who, cap);
        tide__reply_error(s, TIDE_ERR_RANGE,
                          "%s already holds %d registered workers, the most one client may "
                          "(tided --max-client-workers): register each rank from its own "
                          "process, or raise the limit",
                          s->auth_on ? s->who : "this connection", cap);
        return;
    }
    const char *owner = s->auth_on && w == NULL ? pool_owner(s, m->pool) : NULL;
    if (owner != NULL && strcmp(owner, s->who) != 0) {
        s->st->counters.denied++;
        TIDE_WARN("auth", "refused rank %d of pool %s from %s: the pool belongs to %s", m->rank,
                  m->pool, s->who, owner);
        tide__reply_error(s, TIDE_ERR_DENIED,
                          "pool %s was registered with another key; %s may add ranks only to "
                          "its own pools",
                          m->pool, s->who);
        return;
    }
    if (w == NULL) {
        tide_status rc = tide_coord_worker_add(s->st, -1, m->pool, m->rank, &w);
        if (rc != TIDE_OK) {
            tide__reply_error(s, rc, "cannot register %s/%d: %s", m->pool, m->rank,
                              tide_last_error());
            return;
        }
        w->pid = m->pid;
        w->registered_ns = now_ns_cached;
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
        w->registered_ns = now_ns_cached;
        tide__event(s, "", "worker_back",
                    "worker %d (%s rank %d, pid %d) registered again after %s", w->id, m->pool,
                    m->rank, m->pid, was_left ? "leaving" : "failing");
    } else if (w->pid != m->pid) {
        /* A new process on the same rank: whatever the old one held is gone. */
        char why[128];
        snprintf(why, sizeof why, "process restarted (pid %d -> %d)", w->pid, m->pid);
        touch(s, w);
        tide__worker_failed(s, w, why);
        w->state = TIDE_WS_IDLE;
        w->joined = 0;
        w->gone_ms = 0;
        w->fenced_job = 0; /* the process that held the job is gone; this one holds nothing */
        w->pid = m->pid;
        w->registered_ns = now_ns_cached;
    } else {
        TIDE_INFO("server", "worker %d (%s rank %d) registered again (%s)", w->id, m->pool, m->rank,
                  tide_wstate_name(w->state));
    }
    snprintf(w->host, sizeof w->host, "%s", m->host);
    w->device = m->device;
    w->memory = m->mem_bytes;
    w->kind = (int32_t)m->kind;
    w->pool_size = m->size;
    w->last_hb_ns = now_ns_cached;
    if (s->auth_on)
        snprintf(w->owner, sizeof w->owner, "%s", s->who);
    touch(s, w);
    tide__save_worker(s, w);
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
    s->want_backfill = 1;
}

/* What a heartbeat of live worker w reports: steps, generation, bubble and busy time. */
static void apply_heartbeat(tide_server_t *s, tide_coord_worker_t *w,
                            const tide_proto_heartbeat_t *m)
{
    s->st->counters.heartbeats++;
    uint64_t interval = now_ns_cached - w->last_hb_ns;
    uint64_t cap = (uint64_t)s->cfg.heartbeat_ms * 1000000ull * 4;
    if (interval > cap)
        interval = cap;
    w->last_hb_ns = now_ns_cached;
    w->step = (int64_t)(m->step > INT64_MAX ? INT64_MAX : m->step);
    w->generation = m->gen;
    uint64_t bubble = (uint64_t)(m->bubble_ms * 1e6);
    w->bubble_ns += bubble;
    s->bubble_ns_total += bubble;
    if (m->step_ms > 0)
        w->busy_ns += interval;
    /* what tidectl status shows: the last few intervals, not the worker's whole life */
    double share = interval > 0 ? (double)bubble / (double)interval : 0.0;
    share = share > 1.0 ? 1.0 : share;
    w->bubble_recent =
        m->step_ms > 0 ? 0.7 * w->bubble_recent + 0.3 * share : 0.7 * w->bubble_recent;
    /* the part of the bubbles that offline task steps used, as the worker measured it */
    uint64_t filled = (uint64_t)(fmin(m->filled_ms, m->bubble_ms) * 1e6);
    s->filled_ns_total += filled;
    w->filled_ns += filled;
    if (s->bubble_wait && bubble > 0 && w->state == TIDE_WS_ONLINE && w->offline_job == 0)
        s->want_backfill = 1; /* the first bubbles measured here: a waiting job may fit */
    if (w->state == TIDE_WS_ONLINE && w->job != 0) {
        tide_coord_job_t *j = tide_coord_job_get(s->st, w->job);
        if (j != NULL && m->gen == j->generation && w->step > j->step)
            j->step = w->step;
        if (j != NULL && m->step_ms > 0)
            j->throughput = 1000.0 / m->step_ms;
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
    if (w != NULL && tide_coord_worker_gone(w) && !may_speak(s, w, TIDE_MSG_HEARTBEAT))
        return;
    if (w != NULL && is_fenced(w)) {
        tell_fenced(s, w);
        return;
    }
    if (w == NULL || tide_coord_worker_gone(w)) {
        tide_msg_t e;
        gone_answer(w, m->worker, &e);
        tide__reply(s, &e);
        return;
    }
    if (!may_speak(s, w, TIDE_MSG_HEARTBEAT))
        return;
    touch(s, w);
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
static void handle_host_heartbeat(tide_server_t *s, const tide_proto_host_heartbeat_t *m)
{
    for (uint32_t i = 0; i < m->n_beats; i++) {
        const tide_proto_heartbeat_t *b = &m->beats[i];
        if (b->worker == m->worker) {
            handle_heartbeat(s, b);
            continue;
        }
        tide_coord_worker_t *w = tide_coord_worker_get(s->st, b->worker);
        if (w != NULL && s->auth_on && strcmp(w->owner, s->who) != 0) {
            s->st->counters.denied++;
            TIDE_WARN_LIMITED("auth",
                              "host heartbeat from %s names worker %d, which belongs to %s: "
                              "entry skipped",
                              s->who, b->worker, w->owner[0] ? w->owner : "no key yet");
            continue;
        }
        if (w == NULL) {
            TIDE_WARN_LIMITED("server", "host heartbeat from %s names unknown worker %d", s->who,
                              b->worker);
            continue;
        }
        if (is_fenced(w) || tide_coord_worker_gone(w)) {
            /* its own heartbeat would have been answered: answer it where it listens */
            tide_msg_t e;
            if (is_fenced(w)) {
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
        tide_coord_worker_seen(s->st, w, now_ns_cached);
        apply_heartbeat(s, w, b);
    }
}

static void handle_bye(tide_server_t *s, const tide_proto_bye_t *m)
{
    tide_coord_worker_t *w = sender(s, m->worker, TIDE_MSG_BYE);
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
    job_lost_worker(s, jid ? tide_coord_job_get(s->st, jid) : NULL, w, "left (bye)");
    reply_ok(s, "", "worker %d removed", w->id);
}

static void handle_failure(tide_server_t *s, const tide_proto_failure_t *m)
{
    tide_coord_worker_t *w = sender(s, m->worker, TIDE_MSG_FAILURE);
    if (w == NULL)
        return;
    char why[1200];
    snprintf(why, sizeof why, "reported failure %s (%s)%s%s", tide_status_name(m->code), m->reason,
             m->job[0] ? " in job " : "", m->job);
    tide__worker_failed(s, w, why);
    reply_ok(s, m->job, "failure recorded");
}

static void release_job(tide_server_t *s, tide_coord_job_t *j, tide_jstate to);

/* "host-a: 6, host-b: 6" for the hosts of the candidates (ranks per host), truncated to
   fit out (len bytes). */
static void host_summary(tide_server_t *s, const tide_coord_job_t *j,
                         const tide_policy_worker *cand, size_t n, char *out, size_t len)
{
    size_t at = 0;
    out[0] = '\0';
    for (int32_t h = 0; at + 1 < len; h++) {
        size_t count = 0;
        const char *name = NULL;
        for (size_t i = 0; i < n; i++)
            if (cand[i].host == h) {
                count++;
                if (name == NULL) {
                    const tide_coord_worker_t *w = tide__job_worker(s, j, cand[i].rank);
                    name = w != NULL ? w->host : "?";
                }
            }
        if (count == 0)
            break;
        int w = snprintf(out + at, len - at, "%s%s: %zu", h ? ", " : "", name, count);
        at += w > 0 ? (size_t)w : 0;
    }
    if (at >= len && len > 4)
        memcpy(out + len - 4, "...", 4);
}

/*
 * Gives job j its first layout over idle joined workers, when enough have joined. Returns
 * 1 after refusing the join being handled (the error is its reply): every rank of the
 * launch joined, and their hosts cannot hold the first layout's TP groups each inside one
 * host. More ranks will never come, and a TP group across hosts runs its per-layer
 * collectives over the network, so the job is failed with the reason (which tide_join
 * reports on every rank) instead of waiting for ever. Else 0.
 */
static int try_first_layout(tide_server_t *s, tide_coord_job_t *j)
{
    tide_policy_worker *cand = NULL;
    size_t n = 0, n_pre = 0;
    int32_t *pre = NULL;
    tide_layout_t *l = NULL;
    tide_collection_t *coll = NULL;
    int refused = 0;
    size_t need = (size_t)j->req_dp * (size_t)j->req_tp * (size_t)j->req_pp;
    if ((size_t)j->joins < need)
        return 0; /* too few joined yet: no list of the pool's ranks on every join */
    if (tide__candidates(s, j, -1, 0, &cand, &n) != TIDE_OK) {
        TIDE_ERROR("server", "job %s: %s", j->name, tide_last_error());
        return 0;
    }
    /* The job's own ranks start it: idle ones first, and those that were given offline
       work between registering and joining (backfill is quick) are preempted for it, or
       the job would wait for that work to end. */
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (cand[i].cls == TIDE_PW_IDLE || cand[i].cls == TIDE_PW_OFFLINE)
            cand[k++] = cand[i];
    if (k < need)
        goto out;
    int fit = tide_policy_tp_fit_dp(cand, k, j->req_tp, j->req_pp, j->req_dp);
    if (fit < j->req_dp && k >= (size_t)j->pools[0].size) {
        char hosts[512];
        host_summary(s, j, cand, k, hosts, sizeof hosts);
        char why[TIDE_PROTO_TEXT_MAX + 1];
        snprintf(why, sizeof why,
                 "job %s cannot start: its first layout (dp %d, tp %d, pp %d) needs %d TP groups "
                 "of %d workers, each inside one host, and the %zu ranks of pool %s (%s) hold %d "
                 "dp of them; a TP group across hosts would run its collectives over the "
                 "network, so the job is refused: ask for %s",
                 j->name, j->req_dp, j->req_tp, j->req_pp, j->req_dp * j->req_pp, j->req_tp, k,
                 j->pools[0].name, hosts, fit,
                 fit > 0 ? "a smaller dp, or launch more ranks per host" : "a smaller tp");
        tide__event(s, j->name, "job_refused", "%s", why);
        release_job(s, j, TIDE_JS_FAILED);
        tide__save_job(s, j);
        tide__reply_error(s, TIDE_ERR_NO_DEVICE, "%s", why);
        refused = 1;
        goto out;
    }
    pre = tide_malloc((k ? k : 1) * sizeof *pre);
    if (pre == NULL)
        goto out;
    tide_resize_req req = {j->req_dp, j->req_tp, j->req_pp, j->num_layers, j->req_micro,
                           NULL,      0,         0,         j->fit,        (size_t)j->n_fit};
    tide_status rc = tide__job_collection(j, &coll);
    if (rc == TIDE_OK)
        rc = tide_policy_place(NULL, coll, &req, cand, k, &l, pre, &n_pre);
    if (rc != TIDE_OK) {
        tide__event(s, j->name, "job_waiting", "no first layout: %s", tide_last_error());
        goto out;
    }
    j->layout = l;
    l = NULL;
    for (size_t i = 0; i < n_pre; i++)
        tide__preempt_for(s, j, tide__job_worker(s, j, pre[i]), 1);
    j->generation = j->gen_issued = 1;
    j->state = TIDE_JS_RUNNING;
    char desc[256];
    tide__event(s, j->name, "layout", "generation 1: %s on %zu workers",
                tide_layout_format(j->layout, desc, sizeof desc), need);
    tide__save_job(s, j);
    for (size_t i = 0; i < need; i++) {
        tide_coord_worker_t *w = tide__job_worker(s, j, j->layout->worker[i]);
        if (w == NULL)
            continue;
        w->state = TIDE_WS_ONLINE;
        w->job = j->id;
        tide__save_worker(s, w);
        send_layout(s, j, w);
    }
out:
    tide_layout_destroy(&l);
    tide_collection_destroy(&coll);
    tide_free(pre);
    tide_free(cand);
    return refused;
}

/* Keeps the first join message of job j (its tensors) and the layout it asks for. */
/* Members of online job j still alive (held by it and not failed). */
static size_t live_members(const tide_server_t *s, const tide_coord_job_t *j)
{
    size_t n = 0;
    for (size_t i = 0; i < s->st->n_workers; i++) {
        const tide_coord_worker_t *w = &s->st->workers[i];
        n += w->pool[0] != '\0' && w->job == j->id && !tide_coord_worker_gone(w);
    }
    return n;
}

/* Releases what online job j still holds (a pending reconfiguration, its workers) as it
 * ends in state `to`. */
static void release_job(tide_server_t *s, tide_coord_job_t *j, tide_jstate to)
{
    tide_reconf_destroy(&j->reconf);
    for (size_t i = 0; i < s->st->n_workers; i++) {
        tide_coord_worker_t *w = &s->st->workers[i];
        if (w->pool[0] == '\0' || w->job != j->id)
            continue;
        w->job = 0;
        if (w->state == TIDE_WS_ONLINE)
            w->state = TIDE_WS_IDLE;
        tide__save_worker(s, w);
    }
    j->state = to;
    s->want_backfill = 1;
}

/* The join's fit rules as reshard's tide_fit_rule into out (room for TIDE_FIT_RULES_MAX);
   their count. The decoder bounded them. */
static int fit_from_join(const tide_proto_join_t *m, tide_fit_rule *out)
{
    _Static_assert(TIDE_PROTO_FIT_MAX == TIDE_FIT_RULES_MAX &&
                       TIDE_PROTO_FIT_WHAT_MAX + 1 == TIDE_FIT_WHAT_MAX,
                   "a job keeps every fit rule a join carries");
    for (uint32_t i = 0; i < m->n_fit; i++) {
        memset(&out[i], 0, sizeof out[i]);
        out[i].degree = (tide_degree)m->fit[i].degree;
        out[i].n = m->fit[i].n;
        memcpy(out[i].what, m->fit[i].what, sizeof out[i].what);
    }
    return (int)m->n_fit;
}

/* A join's first layout against its own fit rules; TIDE_ERR_INVALID naming the rule. */
static tide_status join_fits(const tide_proto_join_t *m)
{
    tide_fit_rule fit[TIDE_FIT_RULES_MAX];
    int n = fit_from_join(m, fit);
    if (tide_fit_check(fit, (size_t)n, m->dp, m->tp, m->pp, m->micro_batches) != TIDE_OK)
        return tide_errorf(TIDE_ERR_INVALID,
                           "its first layout (dp %d, tp %d, pp %d) is not one its program can "
                           "run: %s",
                           m->dp, m->tp, m->pp, tide_last_error());
    return TIDE_OK;
}

static void keep_join(tide_coord_job_t *j, const tide_proto_join_t *m, const void *raw, size_t len)
{
    j->req_dp = m->dp;
    j->req_tp = m->tp;
    j->req_pp = m->pp;
    j->req_micro = m->micro_batches;
    j->num_layers = m->num_layers;
    j->total_bytes = m->total_bytes;
    j->n_fit = fit_from_join(m, j->fit);
    tide_free(j->join_blob);
    j->join_blob = tide_malloc(len);
    j->join_len = 0;
    if (j->join_blob != NULL) {
        memcpy(j->join_blob, raw, len);
        j->join_len = len;
    }
}

/* 1 when join m describes the same model as job j's first join (layers and tensors). */
static int same_model(const tide_coord_job_t *j, const tide_proto_join_t *m)
{
    if (j->join_blob == NULL)
        return 1;
    tide_msg_t jm;
    if (tide_proto_decode(j->join_blob, j->join_len, &jm) != TIDE_OK)
        return 0;
    const tide_proto_join_t *o = &jm.u.join;
    int same = jm.type == TIDE_MSG_JOIN && o->num_layers == m->num_layers &&
               o->n_tensors == m->n_tensors && o->total_bytes == m->total_bytes &&
               o->n_fit == m->n_fit;
    for (uint32_t i = 0; same && i < m->n_fit; i++) /* the same program: the same limits */
        same = o->fit[i].degree == m->fit[i].degree && o->fit[i].n == m->fit[i].n &&
               strcmp(o->fit[i].what, m->fit[i].what) == 0;
    for (uint32_t i = 0; same && i < m->n_tensors; i++) {
        const tide_proto_tensor_t *a = &o->tensors[i], *b = &m->tensors[i];
        same = strcmp(a->name, b->name) == 0 && a->dtype == b->dtype && a->ndim == b->ndim &&
               memcmp(a->shape, b->shape, sizeof a->shape) == 0 && a->layer == b->layer &&
               a->tp == b->tp && a->tp_dim == b->tp_dim && a->tp_segments == b->tp_segments &&
               a->dp == b->dp;
    }
    tide_msg_clear(&jm);
    tide_error_clear();
    return same;
}

/* 1 (after replying the error) when w's pool cannot start job m: its first layout is
   malformed or needs more ranks than the pool has. Only the launch that starts a job is
   held to its layout; a pool launched later joins whatever the job runs, at any size. */
static int refuse_first_layout(tide_server_t *s, const tide_coord_worker_t *w,
                               const tide_proto_join_t *m)
{
    tide_layout_t *probe = NULL;
    tide_status rc = tide_layout_new(&probe, m->dp, m->tp, m->pp, m->num_layers, m->micro_batches);
    tide_layout_destroy(&probe);
    if (rc == TIDE_OK)
        rc = join_fits(m); /* the program's own rules, before a job is made of it */
    if (rc != TIDE_OK) {
        tide__reply_error(s, rc, "job %s cannot start: %s", m->job, tide_last_error());
        return 1;
    }
    long long need = (long long)m->dp * m->tp * m->pp;
    if (need > w->pool_size) {
        tide__reply_error(s, TIDE_ERR_INVALID,
                          "job %s asks for dp %d x tp %d x pp %d = %lld workers; pool %s has %d "
                          "ranks (a pool launched later joins a running job at any size)",
                          m->job, m->dp, m->tp, m->pp, need, w->pool, w->pool_size);
        return 1;
    }
    return 0;
}

static void handle_join(tide_server_t *s, const tide_proto_join_t *m, const void *raw, size_t len)
{
    tide_coord_worker_t *w = sender(s, m->worker, TIDE_MSG_JOIN);
    if (w == NULL)
        return;
    tide_coord_job_t *j = tide_coord_job_by_name(s->st, m->job);
    if (j == NULL) {
        if (refuse_first_layout(s, w, m))
            return;
        tide_status rc = tide_coord_job_add(s->st, 0, TIDE_CJOB_ONLINE, &j);
        if (rc != TIDE_OK) {
            tide__reply_error(s, rc, "%s", tide_last_error());
            return;
        }
        snprintf(j->name, sizeof j->name, "%s", m->job);
        j->n_pools = 0;
        rc = tide_coord_job_add_pool(j, w->pool, w->pool_size, 1);
        if (rc != TIDE_OK) {
            tide__reply_error(s, rc, "%s", tide_last_error());
            return;
        }
        j->state = TIDE_JS_QUEUED;
        j->created_ms = tide_wall_ms();
        keep_join(j, m, raw, len);
        char fit[TIDE_FIT_RULES_MAX * (TIDE_FIT_WHAT_MAX + 32)];
        tide__event(s, j->name, "job_created",
                    "online job in pool %s: %d layers, %llu bytes of state, %u tensors, first "
                    "layout (dp %d, tp %d, pp %d); fit: %s",
                    w->pool, j->num_layers, (unsigned long long)j->total_bytes, m->n_tensors, m->dp,
                    m->tp, m->pp, tide_fit_format(j->fit, (size_t)j->n_fit, fit, sizeof fit));
        tide__save_job(s, j);
    } else if (j->kind != TIDE_CJOB_ONLINE) {
        tide__reply_error(s, TIDE_ERR_EXISTS, "job name %s belongs to an offline job", m->job);
        return;
    } else if (j->state == TIDE_JS_DONE || j->state == TIDE_JS_CANCELLED ||
               j->state == TIDE_JS_FAILED ||
               (tide_coord_job_pool_find(j, w->pool) < 0 && live_members(s, j) == 0)) {
        /* the job ended (or was refused), or every rank of its launch is gone (it could only
           wait forever): a new run of the program under the same name starts it again */
        if (j->state != TIDE_JS_DONE && j->state != TIDE_JS_CANCELLED &&
            j->state != TIDE_JS_FAILED) {
            tide__event(s, j->name, "job_ended",
                        "every rank of pool %s is gone (job was %s): pool %s relaunches it",
                        j->pools[0].name, tide_jstate_name(j->state), w->pool);
            release_job(s, j, TIDE_JS_DONE);
        }
        if (refuse_first_layout(s, w, m))
            return;
        tide_layout_destroy(&j->layout);
        j->n_pools = 0;
        tide_status rc = tide_coord_job_add_pool(j, w->pool, w->pool_size, 1);
        if (rc != TIDE_OK) {
            tide__reply_error(s, rc, "%s", tide_last_error());
            return;
        }
        j->state = TIDE_JS_QUEUED;
        j->generation = j->gen_issued = 0;
        j->step = 0;
        j->joins = 0;
        j->throughput = 0;
        keep_join(j, m, raw, len);
        char fit[TIDE_FIT_RULES_MAX * (TIDE_FIT_WHAT_MAX + 32)];
        tide__event(s, j->name, "job_created",
                    "online job %s runs again in pool %s: %d layers, %u tensors, first layout "
                    "(dp %d, tp %d, pp %d); fit: %s",
                    j->name, w->pool, j->num_layers, m->n_tensors, m->dp, m->tp, m->pp,
                    tide_fit_format(j->fit, (size_t)j->n_fit, fit, sizeof fit));
        tide__save_job(s, j);
    } else if (tide_coord_job_pool_find(j, w->pool) < 0) {
        /* a pool launched later for a running job: its ranks join as idle ranks of the
           job, connected to its communicators by the resize that first places them */
        if (j->layout == NULL) {
            tide__reply_error(s, TIDE_ERR_BUSY,
                              "job %s is still placing its first layout in pool %s; pool %s can "
                              "join it once it runs",
                              m->job, j->pools[0].name, w->pool);
            return;
        }
        if (!same_model(j, m)) {
            tide__reply_error(s, TIDE_ERR_INVALID,
                              "pool %s joins job %s with another model (its tensors or fit "
                              "rules differ from the job's): launch the same program",
                              w->pool, m->job);
            return;
        }
        tide_status rc = tide_coord_job_add_pool(j, w->pool, w->pool_size, 0);
        if (rc != TIDE_OK) {
            tide__reply_error(s, rc, "pool %s cannot join job %s: %s", w->pool, m->job,
                              tide_last_error());
            return;
        }
        const tide_coord_job_pool *jp = &j->pools[j->n_pools - 1];
        tide__event(s, j->name, "pool_joined",
                    "pool %s (%d ranks, host %s) joined as job ranks %d..%d; a resize places "
                    "the job on them",
                    jp->name, jp->size, w->host, jp->base, jp->base + jp->size - 1);
        tide__save_job(s, j);
    }
    if (w->joined != j->id) {
        w->joined = j->id;
        j->joins++;
        tide__save_worker(s, w);
    }
    if (j->layout == NULL) {
        if (try_first_layout(s, j))
            return; /* refused: the reply says why */
        if (j->layout == NULL)
            reply_ok(s, j->name, "joined job %s; waiting for %d workers to join", j->name,
                     j->req_dp * j->req_tp * j->req_pp);
        else if (!(w->state == TIDE_WS_ONLINE && w->job == j->id))
            reply_ok(s, j->name, "joined job %s; not in its first layout: waiting idle", j->name);
        return;
    }
    if (w->state == TIDE_WS_ONLINE && w->job == j->id) {
        send_layout(s, j, w); /* a member joining again (after a tided restart) */
        return;
    }
    int jp = tide_coord_job_pool_find(j, w->pool);
    if (jp > 0 && !j->pools[jp].connected) {
        /* a joining pool's rank starts idle at the job's generation, knowing its job rank */
        send_layout(s, j, w);
        s->want_backfill = 1;
        return;
    }
    reply_ok(s, j->name, "joined job %s; not in its layout: waiting idle for a resize", j->name);
    s->want_backfill = 1;
}

/* Records what worker w reported of attempt m->attempt of j (tidectl logs reads it). */
static void save_attempt(tide_server_t *s, const tide_coord_job_t *j, const tide_coord_worker_t *w,
                         const tide_proto_offline_status_t *m)
{
    if (!store_ready(s))
        return;
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
    store_result(s, tide_store_put_attempt(s->store, a));
    tide_free(a);
}

static void handle_offline_status(tide_server_t *s, const tide_proto_offline_status_t *m)
{
    tide_coord_worker_t *w = sender(s, m->worker, TIDE_MSG_OFFLINE_STATUS);
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
        reply_ok(s, j->name, "%s", "");
        return;
    }
    if (w->offline_job == j->id && (current || !runs_here)) {
        w->offline_job = 0;
        if (w->state == TIDE_WS_OFFLINE)
            w->state = TIDE_WS_IDLE;
        tide__save_worker(s, w);
        s->want_backfill = 1;
    }
    if (!current) {
        reply_ok(s, j->name, "%s", "");
        return;
    }
    if (j->state == TIDE_JS_ASSIGNED && j->worker == w->id) {
        char why[160];
        if (m->state == TIDE_JOB_DONE) {
            j->state = TIDE_JS_DONE;
            j->worker = -1;
            tide__event(s, j->name, "offline_done", "finished on worker %d (attempt %d)", w->id,
                        j->attempts);
            tide__save_job(s, j);
        } else {
            snprintf(why, sizeof why, "attempt %d on worker %d ended %s (exit code %d)",
                     j->attempts, w->id, tide_proto_job_state_name(m->state), m->exit_code);
            requeue(s, j, w->id, m->state == TIDE_JOB_FAILED, why);
        }
    }
    reply_ok(s, j->name, "%s", "");
}

static void handle_bubble(tide_server_t *s, const tide_proto_bubble_t *m)
{
    tide_coord_worker_t *w = sender(s, m->worker, TIDE_MSG_BUBBLE);
    if (w != NULL)
        TIDE_DEBUG("server", "worker %d: %u bubble windows per step, mean %.3f ms, max %.3f ms",
                   w->id, m->windows, m->mean_ms, m->max_ms);
}

/* ---- tidectl requests ---------------------------------------------------------------------- */

static tide_proto_job_state_t job_state_wire(const tide_coord_job_t *j)
{
    switch (j->state) {
    case TIDE_JS_RUNNING:
        return TIDE_JOB_RUNNING;
    case TIDE_JS_RESIZING:
        return (j->reconf && j->reconf->recover) ? TIDE_JOB_RECOVERING : TIDE_JOB_RESIZING;
    case TIDE_JS_STALLED:
        return TIDE_JOB_RECOVERING;
    case TIDE_JS_QUEUED:
        return (j->kind == TIDE_CJOB_OFFLINE && j->attempts > 0) ? TIDE_JOB_PREEMPTED
                                                                 : TIDE_JOB_QUEUED;
    case TIDE_JS_ASSIGNED:
        return TIDE_JOB_RUNNING;
    case TIDE_JS_DONE:
        return TIDE_JOB_DONE;
    case TIDE_JS_FAILED:
        return TIDE_JOB_FAILED;
    case TIDE_JS_CANCELLED:
        return TIDE_JOB_CANCELLED;
    }
    return TIDE_JOB_FAILED;
}

/* Copies src into dst[cap] (truncating, NUL-terminated): the status reply copies three
 * names per worker, 10^4 workers a request, where snprintf's formatting showed up. */
static void copy_name(char *dst, size_t cap, const char *src)
{
    size_t n = strnlen(src, cap - 1);
    memcpy(dst, src, n);
    dst[n] = '\0';
}

/* 1 when status lists w: a registered worker, and one that left only when asked for all. */
static int listed(const tide_coord_worker_t *w, int all)
{
    return w->pool[0] != '\0' && (all || w->state != TIDE_WS_LEFT);
}

static int cmp_i32_asc(const void *a, const void *b)
{
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

static int cmp_row_worker(const void *key, const void *row)
{
    int32_t x = *(const int32_t *)key, y = ((const tide_proto_gpu_row_t *)row)->worker;
    return (x > y) - (x < y);
}

/*
 * The worker ids of job j, ascending, into *out (caller frees): an online job's are the
 * ranks of its launches that have not left it (through the (pool, rank) index: O(the
 * job's ranks), whatever the size of the table), an offline job's the worker running it.
 */
static tide_status job_worker_ids(tide_server_t *s, const tide_coord_job_t *j, int32_t **out,
                                  size_t *n)
{
    size_t cap = 1;
    for (int p = 0; j->kind == TIDE_CJOB_ONLINE && p < j->n_pools; p++)
        cap += j->pools[p].left ? 0 : (size_t)j->pools[p].size;
    int32_t *ids = tide_malloc(cap * sizeof *ids);
    if (ids == NULL)
        return tide_errorf(TIDE_ERR_NOMEM, "out of memory listing job %s's %zu workers", j->name,
                           cap);
    size_t k = 0;
    if (j->kind == TIDE_CJOB_ONLINE) {
        for (int p = 0; p < j->n_pools; p++) {
            if (j->pools[p].left)
                continue;
            for (int32_t r = 0; r < j->pools[p].size; r++) {
                const tide_coord_worker_t *w = tide_coord_worker_find(s->st, j->pools[p].name, r);
                if (w != NULL)
                    ids[k++] = w->id;
            }
        }
    } else if (j->worker >= 0 && tide_coord_worker_get(s->st, j->worker) != NULL) {
        ids[k++] = j->worker;
    }
    qsort(ids, k, sizeof *ids, cmp_i32_asc);
    *out = ids;
    *n = k;
    return TIDE_OK;
}

/*
 * One page of the worker table: the listed workers with id >= q->from, in id order, at
 * most min(q->limit, --status-page) of them, with the listing's total and where the next
 * page starts. Nothing is ever cut silently: a reader follows `next` until it is -1.
 * With q->job, only that job's workers (job_worker_ids): the page costs the job's size,
 * not the cluster's.
 */
static void handle_status(tide_server_t *s, const tide_proto_status_t *q)
{
    tide_coord_state_t *st = s->st;
    const tide_coord_job_t *fj = NULL;
    int32_t *ids = NULL; /* the filter's workers, ascending; NULL: every worker */
    size_t n_ids = 0;
    if (q->job[0] != '\0') {
        fj = tide_coord_job_by_name(st, q->job);
        if (fj == NULL) {
            tide__reply_error(s, TIDE_ERR_NOT_FOUND, "no job named %s", q->job);
            return;
        }
        if (job_worker_ids(s, fj, &ids, &n_ids) != TIDE_OK) {
            tide__reply_error(s, TIDE_ERR_NOMEM, "%s", tide_last_error());
            return;
        }
    }
    size_t n_iter = ids != NULL ? n_ids : st->n_workers;
#define AT(k) (&st->workers[ids != NULL ? (size_t)ids[k] : (k)])
    tide_msg_t m;
    tide_msg_init(&m, TIDE_MSG_STATUS_REPLY);
    m.u.status_reply.time_ms = tide_wall_ms();
    snprintf(m.u.status_reply.ompi_server, sizeof m.u.status_reply.ompi_server, "%s",
             s->cfg.ompi_server ? s->cfg.ompi_server : "");
    size_t page = s->cfg.status_page > 0 ? (size_t)s->cfg.status_page : TIDE_PROTO_ROWS_MAX;
    if (page > TIDE_PROTO_ROWS_MAX)
        page = TIDE_PROTO_ROWS_MAX;
    if (q->limit > 0 && q->limit < page)
        page = q->limit;
    size_t total = 0, n = 0;
    for (size_t k = 0; k < n_iter; k++) {
        const tide_coord_worker_t *w = AT(k);
        if (!listed(w, q->all))
            continue;
        total++;
        n += w->id >= q->from && n < page;
    }
    tide_proto_gpu_row_t *rows = tide_calloc(n ? n : 1, sizeof *rows);
    if (rows == NULL) {
        tide_free(ids);
        tide__reply_error(s, TIDE_ERR_NOMEM, "out of memory building a status page of %zu workers",
                          n);
        return;
    }
    size_t k = 0;
    int32_t next = -1;
    int64_t wall = tide_wall_ms();
    for (size_t x = 0; x < n_iter; x++) {
        const tide_coord_worker_t *w = AT(x);
        if (w->id < q->from || !listed(w, q->all))
            continue;
        if (k >= n) {
            if (next < 0)
                next = w->id; /* the first listed worker past this page */
            continue;
        }
        tide_proto_gpu_row_t *r = &rows[k++];
        r->worker = w->id;
        copy_name(r->host, sizeof r->host, w->host[0] ? w->host : "?");
        r->device = w->device < 0 ? 0 : w->device;
        r->kind = w->kind ? TIDE_DEVICE_GPU : TIDE_DEVICE_CPU;
        r->state = (tide_proto_worker_state_t)w->state;
        r->mem_bytes = w->memory;
        r->stage = r->dp_rank = r->tp_rank = -1;
        r->step = w->step > 0 ? (uint64_t)w->step : 0;
        r->bubble_pct = 100.0 * w->bubble_recent;
        uint64_t ago_ns = now_ns_cached > w->last_seen_ns ? now_ns_cached - w->last_seen_ns : 0;
        r->last_seen_ms = w->last_seen_ns ? wall - (int64_t)(ago_ns / 1000000ull) : 0;
        const tide_coord_job_t *oj = w->offline_job ? tide_coord_job_get(st, w->offline_job) : NULL;
        if (oj != NULL)
            copy_name(r->offline, sizeof r->offline, oj->name);
        const tide_coord_job_t *j = w->job ? tide_coord_job_get(st, w->job) : NULL;
        if (j != NULL)
            copy_name(r->job, sizeof r->job, j->name);
    }
#undef AT
    /* coordinates: the rows are in worker order, so each member finds its row by search */
    for (size_t i = 0; i < st->n_jobs && k > 0; i++) {
        const tide_coord_job_t *j = st->jobs[i];
        if (j->kind != TIDE_CJOB_ONLINE || j->layout == NULL || (fj != NULL && j != fj))
            continue;
        const tide_layout_t *l = j->layout;
        for (int p = 0; p < l->pp; p++)
            for (int d = 0; d < l->dp; d++)
                for (int t = 0; t < l->tp; t++) {
                    tide_coord_worker_t *w =
                        tide__job_worker(s, j, l->worker[tide_layout_index(l, p, d, t)]);
                    if (w == NULL || w->job != j->id)
                        continue;
                    tide_proto_gpu_row_t *r =
                        bsearch(&w->id, rows, k, sizeof *rows, cmp_row_worker);
                    if (r == NULL)
                        continue;
                    r->stage = p;
                    r->dp_rank = d;
                    r->tp_rank = t;
                }
    }
    m.u.status_reply.rows = rows;
    m.u.status_reply.n_rows = (uint32_t)k;
    m.u.status_reply.total = (uint32_t)total;
    m.u.status_reply.next = next;
    tide__reply(s, &m);
    tide_free(rows);
    tide_free(ids);
}

/*
 * Which of job m->job's ranks m->ranks are alive members now: held by a worker that is
 * neither failed nor gone and still holds a part of the job. A switch decides from this
 * which old members' state it must take from replicas, so the answer is exact for exactly
 * the ranks asked, whatever the size of the worker table.
 */
static void handle_liveness(tide_server_t *s, const tide_proto_liveness_t *m)
{
    if (sender(s, m->worker, TIDE_MSG_LIVENESS) == NULL)
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

static void handle_jobs(tide_server_t *s)
{
    tide_coord_state_t *st = s->st;
    tide_msg_t m;
    tide_msg_init(&m, TIDE_MSG_JOBS_REPLY);
    size_t n = st->n_jobs > TIDE_PROTO_ROWS_MAX ? TIDE_PROTO_ROWS_MAX : st->n_jobs;
    tide_proto_job_row_t *rows = tide_calloc(n ? n : 1, sizeof *rows);
    if (rows == NULL) {
        tide__reply_error(s, TIDE_ERR_NOMEM, "out of memory listing %zu jobs", n);
        return;
    }
    for (size_t i = 0; i < n; i++) {
        const tide_coord_job_t *j = st->jobs[i];
        tide_proto_job_row_t *r = &rows[i];
        snprintf(r->name, sizeof r->name, "%s", j->name);
        r->state = job_state_wire(j);
        r->priority = j->priority;
        if (j->kind == TIDE_CJOB_ONLINE) {
            r->kind = TIDE_JOB_ONLINE;
            r->gen = j->generation;
            if (j->layout) {
                r->dp = j->layout->dp;
                r->tp = j->layout->tp;
                r->pp = j->layout->pp;
                r->workers = (uint32_t)tide_layout_size(j->layout);
            }
            r->step = j->step > 0 ? (uint64_t)j->step : 0;
            r->throughput = j->throughput;
        } else {
            r->kind = j->okind == TIDE_OFFLINE_PLUGIN ? TIDE_JOB_PLUGIN : TIDE_JOB_COMMAND;
            r->workers = j->state == TIDE_JS_ASSIGNED ? 1 : 0;
            r->attempts = (uint32_t)j->attempts;
        }
    }
    m.u.jobs_reply.rows = rows;
    m.u.jobs_reply.n_rows = (uint32_t)n;
    tide__reply(s, &m);
    tide_free(rows);
}

static void handle_events(tide_server_t *s, const tide_proto_events_t *q)
{
    tide_store_event_t *ev = NULL;
    size_t n = 0;
    tide_status rc = tide_store_events(s->store, q->since_id, q->since_ms, q->limit, &ev, &n);
    if (rc != TIDE_OK) {
        tide__reply_error(s, rc, "%s", tide_last_error());
        return;
    }
    tide_msg_t m;
    tide_msg_init(&m, TIDE_MSG_EVENTS_REPLY);
    tide_proto_event_row_t *rows = tide_calloc(n ? n : 1, sizeof *rows);
    if (rows == NULL) {
        tide_free(ev);
        tide__reply_error(s, TIDE_ERR_NOMEM, "out of memory listing %zu events", n);
        return;
    }
    for (size_t i = 0; i < n; i++) {
        rows[i].id = ev[i].id;
        rows[i].time_ms = ev[i].time_ms;
        snprintf(rows[i].job, sizeof rows[i].job, "%s", ev[i].job);
        snprintf(rows[i].kind, sizeof rows[i].kind, "%s", ev[i].kind);
        snprintf(rows[i].detail, sizeof rows[i].detail, "%s", ev[i].detail);
    }
    m.u.events_reply.rows = rows;
    m.u.events_reply.n_rows = (uint32_t)n;
    tide__reply(s, &m);
    tide_free(rows);
    tide_free(ev);
}

static void handle_logs(tide_server_t *s, const tide_proto_logs_t *q)
{
    const tide_coord_job_t *j = tide_coord_job_by_name(s->st, q->job);
    if (j == NULL || j->kind != TIDE_CJOB_OFFLINE) {
        tide__reply_error(s, TIDE_ERR_NOT_FOUND,
                          "no offline job named %s (tidectl jobs lists them)", q->job);
        return;
    }
    tide_store_attempt_t *at = NULL;
    size_t n = 0;
    tide_status rc =
        tide_store_attempts(s->store, j->id, (int32_t)q->attempt, TIDE_PROTO_ATTEMPTS_MAX, &at, &n);
    if (rc != TIDE_OK) {
        tide__reply_error(s, rc, "%s", tide_last_error());
        return;
    }
    if (q->attempt != 0 && n == 0) {
        tide_free(at);
        tide__reply_error(s, TIDE_ERR_NOT_FOUND,
                          "job %s has no report of attempt %u (it ran %d attempts)", j->name,
                          q->attempt, j->attempts);
        return;
    }
    tide_proto_attempt_row_t *rows = tide_calloc(n ? n : 1, sizeof *rows);
    if (rows == NULL) {
        tide_free(at);
        tide__reply_error(s, TIDE_ERR_NOMEM, "out of memory listing %zu attempts", n);
        return;
    }
    for (size_t i = 0; i < n; i++) {
        rows[i].attempt = (uint32_t)at[i].attempt;
        rows[i].worker = at[i].worker;
        snprintf(rows[i].host, sizeof rows[i].host, "%s", at[i].host);
        snprintf(rows[i].log, sizeof rows[i].log, "%s", at[i].log);
        rows[i].state = at[i].state >= 0 && at[i].state <= TIDE_JOB_CANCELLED
                            ? (tide_proto_job_state_t)at[i].state
                            : TIDE_JOB_FAILED;
        rows[i].exit_code = at[i].exit_code;
        rows[i].time_ms = at[i].time_ms > 0 ? at[i].time_ms : 0;
        snprintf(rows[i].tail, sizeof rows[i].tail, "%s", at[i].tail);
    }
    tide_msg_t m;
    tide_msg_init(&m, TIDE_MSG_LOGS_REPLY);
    snprintf(m.u.logs_reply.job, sizeof m.u.logs_reply.job, "%s", j->name);
    m.u.logs_reply.rows = rows;
    m.u.logs_reply.n_rows = (uint32_t)n;
    tide__reply(s, &m);
    tide_free(rows);
    tide_free(at);
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
    if (m->kind == TIDE_JOB_COMMAND &&
        (m->argc == 0 || m->argv[0] == NULL || m->argv[0][0] == '\0')) {
        tide__reply_error(s, TIDE_ERR_INVALID,
                          "offline job %s has an empty command: give the program and its "
                          "arguments (tidectl submit --offline -- PROGRAM ARGS...)",
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
    tide__event(s, j->name, "submitted", "%s job, priority %d%s: %s%s%s",
                tide_proto_job_kind_name(m->kind), j->priority, j->bubbles ? ", bubbles" : "",
                j->plugin, j->plugin[0] ? " " : "", j->argc ? j->argv[0] : "");
    tide__save_job(s, j);
    reply_ok(s, j->name, "queued offline job %s with priority %d", j->name, j->priority);
    s->want_backfill = 1;
}

static void send_preempt(tide_server_t *s, const tide_coord_job_t *oj, const tide_coord_worker_t *w)
{
    tide_msg_t m;
    tide_msg_init(&m, TIDE_MSG_PREEMPT);
    snprintf(m.u.preempt.job, sizeof m.u.preempt.job, "%s", oj->name);
    m.u.preempt.grace_ms = (int)(oj->grace_ms > 600000 ? 600000 : oj->grace_ms);
    tide__send_worker(s, w, &m);
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
        size_t live = live_members(s, j);
        if (live > 0) {
            tide__reply_error(s, TIDE_ERR_UNSUPPORTED,
                              "%s is an online training job with %zu live ranks: stop its "
                              "mpirun to end it; cancel stops offline work and online jobs "
                              "whose ranks are all gone",
                              j->name, live);
            return;
        }
        release_job(s, j, TIDE_JS_CANCELLED);
        tide__event(s, j->name, "cancelled", "cancelled by %s: none of its ranks was alive",
                    s->who);
        tide__save_job(s, j);
        reply_ok(s, j->name,
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
            send_preempt(s, j, w); /* the worker stays busy until it reports the stop */
    }
    j->state = TIDE_JS_CANCELLED;
    tide__event(s, j->name, "cancelled", "cancelled by %s", s->who);
    tide__save_job(s, j);
    reply_ok(s, j->name, "cancelled %s", j->name);
}

static void handle_drain(tide_server_t *s, const tide_proto_drain_t *m)
{
    tide_coord_worker_t *w = tide_coord_worker_get(s->st, m->worker);
    if (w == NULL) {
        tide__reply_error(s, TIDE_ERR_NOT_FOUND, "no worker %d (tidectl status lists them)",
                          m->worker);
        return;
    }
    switch (w->state) {
    case TIDE_WS_FAILED:
    case TIDE_WS_LEFT:
        tide__reply_error(s, TIDE_ERR_INVALID, "worker %d has %s: nothing to drain", w->id,
                          w->state == TIDE_WS_LEFT ? "left" : "failed");
        return;
    case TIDE_WS_DRAINING:
        reply_ok(s, "", "worker %d is already draining", w->id);
        return;
    case TIDE_WS_IDLE:
        if (w->job != 0) {
            tide__reply_error(s, TIDE_ERR_BUSY,
                              "worker %d is joining a job's resize; drain it when that ends",
                              w->id);
            return;
        }
        break;
    case TIDE_WS_OFFLINE: {
        tide_coord_job_t *oj = tide_coord_job_get(s->st, w->offline_job);
        if (oj != NULL && oj->state == TIDE_JS_ASSIGNED && oj->worker == w->id) {
            send_preempt(s, oj, w);
            s->st->counters.preemptions++;
            requeue(s, oj, w->id, 0, "its worker is draining");
        }
        break;
    }
    case TIDE_WS_ONLINE: {
        tide_coord_job_t *j = tide_coord_job_get(s->st, w->job);
        if (j != NULL && j->reconf != NULL) {
            tide__reply_error(s, TIDE_ERR_BUSY,
                              "job %s is switching generations; drain worker %d when it ends",
                              j->name, w->id);
            return;
        }
        if (j != NULL && j->layout != NULL) {
            tide_policy_worker *cand = NULL;
            size_t n = 0, n_pre = 0;
            tide_layout_t *l = NULL;
            tide_collection_t *coll = NULL;
            char shrink[TIDE_PROTO_TEXT_MAX + 1] = "";
            tide_status rc = tide__job_collection(j, &coll);
            if (rc == TIDE_OK)
                rc = tide__candidates(s, j, w->id, 0, &cand, &n);
            int32_t *pre = rc == TIDE_OK ? tide_malloc((n ? n : 1) * sizeof *pre) : NULL;
            if (rc == TIDE_OK && pre == NULL)
                rc = tide_errorf(TIDE_ERR_NOMEM, "out of memory planning the drain");
            if (rc == TIDE_OK)
                rc = tide_policy_recover(j->layout, coll, j->fit, (size_t)j->n_fit, cand, n, &l,
                                         pre, &n_pre, shrink, sizeof shrink);
            tide_free(cand);
            tide_collection_destroy(&coll);
            if (rc != TIDE_OK) {
                tide_free(pre);
                tide__reply_error(s, rc,
                                  "draining worker %d would leave job %s without a layout: %s",
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
            tide__event(s, j->name, "drain", "worker %d drains: job %s moves off it", w->id,
                        j->name);
            reply_ok(s, j->name,
                     "worker %d draining; job %s switches to generation %llu without it", w->id,
                     j->name, (unsigned long long)j->gen_issued);
            return;
        }
        break;
    }
    }
    w->state = TIDE_WS_DRAINING;
    tide__event(s, "", "drain", "worker %d drained by %s", w->id, s->who);
    tide__save_worker(s, w);
    reply_ok(s, "", "worker %d draining: it takes no new work", w->id);
}

/* ---- backfill ------------------------------------------------------------------------------ */

static void assign(tide_server_t *s, tide_coord_job_t *j, tide_coord_worker_t *w)
{
    j->state = TIDE_JS_ASSIGNED;
    j->attempts++;
    j->worker = w->id;
    w->offline_job = j->id;
    if (w->state == TIDE_WS_IDLE)
        w->state = TIDE_WS_OFFLINE;
    tide__event(s, j->name, "offline_assigned", "attempt %d on worker %d (%s device %d)%s",
                j->attempts, w->id, w->host, w->device,
                w->state == TIDE_WS_ONLINE ? " inside pipeline bubbles" : "");
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
    if (w->registered_ns == 0 || now_ns_cached >= w->registered_ns + grace)
        return 1;
    uint64_t at = w->registered_ns + grace;
    if (*wake_ns == 0 || at < *wake_ns)
        *wake_ns = at;
    return 0;
}

/* Offers idle workers to queued offline work by priority, then bubbles to plugins. */
static void backfill(tide_server_t *s)
{
    tide_coord_state_t *st = s->st;
    s->want_backfill = 0;
    s->next_backfill_ns = 0;
    for (size_t i = 0; i < st->n_jobs; i++)
        if (st->jobs[i]->kind == TIDE_CJOB_ONLINE && st->jobs[i]->state == TIDE_JS_STALLED)
            tide__recover(s, st->jobs[i], "retrying after workers changed");
    size_t nq = 0, ni = 0, n_pairs = 0;
    uint64_t wake = 0;
    for (size_t i = 0; i < st->n_jobs; i++) {
        tide_coord_job_t *j = st->jobs[i];
        if (j->kind != TIDE_CJOB_OFFLINE || j->state != TIDE_JS_QUEUED)
            continue;
        if (j->retry_at_ns > now_ns_cached) {
            if (wake == 0 || j->retry_at_ns < wake)
                wake = j->retry_at_ns; /* backing off after a failure */
            continue;
        }
        nq++;
    }
    if (nq == 0) {
        s->next_backfill_ns = wake;
        return;
    }
    tide_policy_offline *q = tide_malloc(nq * sizeof *q);
    tide_policy_idle *idle = tide_malloc((st->n_workers ? st->n_workers : 1) * sizeof *idle);
    tide_policy_assignment *pairs = tide_malloc(nq * sizeof *pairs);
    if (q == NULL || idle == NULL || pairs == NULL)
        goto out;
    nq = 0;
    for (size_t i = 0; i < st->n_jobs; i++) {
        const tide_coord_job_t *j = st->jobs[i];
        if (j->kind == TIDE_CJOB_OFFLINE && j->state == TIDE_JS_QUEUED &&
            j->retry_at_ns <= now_ns_cached)
            q[nq++] = (tide_policy_offline){j->id, j->priority, j->mem_cap, j->last_failed};
    }
    for (size_t i = 0; i < st->n_workers; i++) {
        const tide_coord_worker_t *w = &st->workers[i];
        /* connected since tided started, holding nothing, not reserved by a resize, and
           past the moment between registering and its job's first layout */
        if (w->pool[0] && w->state == TIDE_WS_IDLE && w->job == 0 && w->offline_job == 0 &&
            w->rid_len > 0 && ready_for_offline(s, w, &wake))
            idle[ni++] = (tide_policy_idle){w->id, w->memory};
    }
    s->next_backfill_ns = wake;
    if (tide_policy_assign(q, nq, idle, ni, pairs, &n_pairs) != TIDE_OK)
        goto out;
    for (size_t i = 0; i < n_pairs; i++)
        assign(s, tide_coord_job_get(st, pairs[i].job), &st->workers[pairs[i].worker]);
    /* plugin work that may run inside pipeline bubbles goes to online workers that have them */
    s->bubble_wait = 0;
    for (size_t i = 0; i < st->n_jobs; i++) {
        tide_coord_job_t *j = st->jobs[i];
        if (j->kind != TIDE_CJOB_OFFLINE || j->state != TIDE_JS_QUEUED || !j->bubbles ||
            j->okind != TIDE_OFFLINE_PLUGIN || j->retry_at_ns > now_ns_cached)
            continue;
        tide_coord_worker_t *best = NULL;
        for (size_t k = 0; k < st->n_workers; k++) {
            tide_coord_worker_t *w = &st->workers[k];
            if (w->state != TIDE_WS_ONLINE || w->offline_job != 0 || w->rid_len == 0 ||
                w->bubble_ns == 0 || w->busy_ns == 0)
                continue;
            if (best == NULL || (double)w->bubble_ns / (double)w->busy_ns >
                                    (double)best->bubble_ns / (double)best->busy_ns)
                best = w;
        }
        if (best == NULL) {
            s->bubble_wait = 1; /* retried when a worker reports bubbles */
            break;
        }
        assign(s, j, best);
    }
out:
    tide_free(q);
    tide_free(idle);
    tide_free(pairs);
}

/* ---- dispatch ------------------------------------------------------------------------------ */

static void dispatch(tide_server_t *s, tide_msg_t *m, const void *raw, size_t len)
{
    /* roles: tide_msg_type_role (proto.h) is the one table; READER requests (status, jobs)
     * are open to every known key because libtide reads status to learn failed peers */
    tide_msg_role_t need = tide_msg_type_role(m->type);
    if (need == TIDE_ROLE_COORDINATOR || need == TIDE_ROLE_RECORD) {
        s->st->counters.bad_requests++;
        tide__reply_error(s, TIDE_ERR_PROTOCOL, "'%s' is %s", tide_msg_type_name(m->type),
                          need == TIDE_ROLE_RECORD ? "a stored record, never a request"
                                                   : "sent by tided, not to it");
        return;
    }
    if (!tide__auth_allows(s->role, need)) {
        const char *key = need == TIDE_ROLE_ADMIN ? "an admin" : "a worker or admin";
        s->st->counters.denied++;
        TIDE_WARN_LIMITED("auth", "refused '%s' from %s: it needs %s key",
                          tide_msg_type_name(m->type), s->who, key);
        tide__reply_error(s, TIDE_ERR_DENIED, "'%s' needs %s key; %s may only %s",
                          tide_msg_type_name(m->type), key, s->who,
                          s->role == TIDE__ROLE_WORKER ? "register, report and read status and jobs"
                                                       : "read status and jobs");
        return;
    }
    if (m->type != TIDE_MSG_HEARTBEAT && m->type != TIDE_MSG_HOST_HEARTBEAT)
        s->st->counters.requests++;
    else
        s->st->counters.heartbeat_msgs++;
    switch (m->type) {
    case TIDE_MSG_REGISTER:
        handle_register(s, &m->u.reg);
        break;
    case TIDE_MSG_HEARTBEAT:
        handle_heartbeat(s, &m->u.heartbeat);
        break;
    case TIDE_MSG_HOST_HEARTBEAT:
        handle_host_heartbeat(s, &m->u.host_heartbeat);
        break;
    case TIDE_MSG_BYE:
        handle_bye(s, &m->u.bye);
        break;
    case TIDE_MSG_JOIN:
        handle_join(s, &m->u.join, raw, len);
        break;
    case TIDE_MSG_PREPARE_ACK: {
        tide_coord_worker_t *w = sender(s, m->u.prepare_ack.worker, m->type);
        if (w != NULL)
            tide__handle_prepare_ack(s, w, &m->u.prepare_ack);
        break;
    }
    case TIDE_MSG_DONE: {
        tide_coord_worker_t *w = sender(s, m->u.done.worker, m->type);
        if (w != NULL)
            tide__handle_done(s, w, &m->u.done);
        break;
    }
    case TIDE_MSG_JOIN_PORT: {
        tide_coord_worker_t *w = sender(s, m->u.join_port.worker, m->type);
        if (w != NULL)
            tide__handle_join_port(s, w, &m->u.join_port);
        break;
    }
    case TIDE_MSG_SAVED: {
        tide_coord_worker_t *w = sender(s, m->u.saved.worker, m->type);
        if (w != NULL)
            tide__handle_saved(s, w, &m->u.saved);
        break;
    }
    case TIDE_MSG_FAILURE:
        handle_failure(s, &m->u.failure);
        break;
    case TIDE_MSG_OFFLINE_STATUS:
        handle_offline_status(s, &m->u.offline_status);
        break;
    case TIDE_MSG_BUBBLE:
        handle_bubble(s, &m->u.bubble);
        break;
    case TIDE_MSG_STATUS:
        handle_status(s, &m->u.status);
        break;
    case TIDE_MSG_LIVENESS:
        handle_liveness(s, &m->u.liveness);
        break;
    case TIDE_MSG_JOBS:
        handle_jobs(s);
        break;
    case TIDE_MSG_RESIZE:
        tide__handle_resize(s, &m->u.resize);
        break;
    case TIDE_MSG_SUBMIT:
        handle_submit(s, &m->u.submit);
        break;
    case TIDE_MSG_CANCEL:
        handle_cancel(s, &m->u.cancel);
        break;
    case TIDE_MSG_DRAIN:
        handle_drain(s, &m->u.drain);
        break;
    case TIDE_MSG_CHECKPOINT:
        tide__handle_checkpoint(s, &m->u.checkpoint);
        break;
    case TIDE_MSG_EVENTS:
        handle_events(s, &m->u.events);
        break;
    case TIDE_MSG_LOGS:
        handle_logs(s, &m->u.logs);
        break;
    default:
        tide__reply_error(s, TIDE_ERR_PROTOCOL, "unexpected message '%s'",
                          tide_msg_type_name(m->type));
        break;
    }
}

/* The cost slot of the request's client in this pass (claimed when free); NULL when the
 * table is crowded, and that client is then not limited. */
static tide__peer_cost *peer_cost(tide_server_t *s)
{
    if (s->peers == NULL)
        return NULL;
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < s->rid_len; i++)
        h = (h ^ s->rid[i]) * 1099511628211ull;
    for (size_t k = 0; k < 8; k++) {
        tide__peer_cost *p = &s->peers[(h + k) & (TIDE__PEER_SLOTS - 1)];
        if (p->pass != s->pass_no) {
            p->pass = s->pass_no;
            p->ns = 0;
            p->bytes = 0;
            p->rid_len = s->rid_len;
            memcpy(p->rid, s->rid, s->rid_len);
            return p;
        }
        if (p->rid_len == s->rid_len && memcmp(p->rid, s->rid, s->rid_len) == 0)
            return p;
    }
    return NULL;
}

/* Operator requests are the ones a client may repeat at will and that cost tided real
 * work; worker messages are small and protocol-critical, never refused. */
static int is_operator_request(tide_msg_type_t t)
{
    tide_msg_role_t role = tide_msg_type_role(t);
    return role == TIDE_ROLE_ADMIN || role == TIDE_ROLE_READER;
}

/* Dispatches m unless its client already used its budget of this pass. */
static void dispatch_fair(tide_server_t *s, tide_msg_t *m, const void *raw, size_t len)
{
    if (s->readonly[0] != '\0' && m->type != TIDE_MSG_STATUS && m->type != TIDE_MSG_JOBS &&
        m->type != TIDE_MSG_EVENTS && m->type != TIDE_MSG_HEARTBEAT &&
        m->type != TIDE_MSG_HOST_HEARTBEAT && m->type != TIDE_MSG_LIVENESS) {
        tide__reply_error(s, TIDE_ERR_IO,
                          "tided cannot save changes to its state file (%s): it serves status, "
                          "jobs and events only. Free disk space or fix the file system, then "
                          "restart tided; running jobs keep training",
                          s->readonly);
        return;
    }
    if (!is_operator_request(m->type)) {
        dispatch(s, m, raw, len);
        return;
    }
    tide__peer_cost *p = peer_cost(s);
    if (p != NULL &&
        (p->ns >= (uint64_t)PEER_PASS_MS * 1000000ull || p->bytes >= PEER_PASS_BYTES)) {
        s->refused_busy++;
        tide__reply_error(s, TIDE_ERR_BUSY,
                          "tided is still serving this client's earlier requests: send one "
                          "request at a time, or retry");
        return;
    }
    uint64_t t0 = now_ns_cached;
    size_t out0 = s->n_out;
    dispatch(s, m, raw, len);
    if (p != NULL) {
        p->ns += tide_now_ns() - t0;
        for (size_t i = out0; i < s->n_out; i++)
            p->bytes += s->out[i].len;
    }
}

/* Receives and handles one request; 0 when none was waiting. */
static int recv_one(tide_server_t *s)
{
    zmq_msg_t f[3];
    int nf = 0, more = 1, extra = 0;
    for (int i = 0; i < 3; i++)
        zmq_msg_init(&f[i]);
    while (more) {
        zmq_msg_t *dst = nf < 3 ? &f[nf] : NULL;
        zmq_msg_t sink;
        if (dst == NULL) {
            zmq_msg_init(&sink);
            dst = &sink;
        }
        int r = zmq_msg_recv(dst, s->router, nf == 0 ? ZMQ_DONTWAIT : 0);
        if (r >= 0 && nf == 0)
            now_ns_cached = tide_now_ns(); /* stamped when read, not when the pass began */
        if (r < 0) {
            if (dst != &f[nf])
                zmq_msg_close(dst);
            for (int i = 0; i < 3; i++)
                zmq_msg_close(&f[i]);
            return 0;
        }
        more = zmq_msg_more(dst);
        if (dst != &f[nf]) {
            zmq_msg_close(dst);
            extra++;
        } else {
            nf++;
        }
    }
    s->rid_len = zmq_msg_size(&f[0]);
    if (s->rid_len > sizeof s->rid)
        s->rid_len = sizeof s->rid;
    memcpy(s->rid, zmq_msg_data(&f[0]), s->rid_len);
    zmq_msg_t *payload = NULL;
    s->delim = 0;
    if (nf == 2 && !extra) {
        payload = &f[1];
    } else if (nf == 3 && !extra && zmq_msg_size(&f[1]) == 0) {
        payload = &f[2];
        s->delim = 1;
    }
    if (s->auth_on) {
        const char *uid = zmq_msg_gets(&f[nf - 1], "User-Id");
        s->role = tide__auth_role(uid);
        snprintf(s->who, sizeof s->who, "%s", uid ? uid : "unknown key");
    } else {
        s->role = TIDE__ROLE_ADMIN;
        snprintf(s->who, sizeof s->who, "a loopback client");
    }
    if (payload == NULL) {
        s->st->counters.bad_requests++;
        tide__reply_error(s, TIDE_ERR_PROTOCOL,
                          "expected one message frame (optionally after an empty delimiter), got "
                          "%d frames",
                          nf - 1 + extra);
    } else {
        tide_msg_t m;
        tide_status rc = tide_proto_decode(zmq_msg_data(payload), zmq_msg_size(payload), &m);
        if (rc != TIDE_OK) {
            s->st->counters.bad_requests++;
            char detail[512];
            snprintf(detail, sizeof detail, "%s", tide_last_error());
            TIDE_WARN_LIMITED("server", "malformed message from %s (%zu bytes): %s", s->who,
                              zmq_msg_size(payload), detail);
            tide__reply_error(s, rc == TIDE_ERR_NOMEM ? TIDE_ERR_NOMEM : TIDE_ERR_PROTOCOL, "%s",
                              detail);
        } else {
            dispatch_fair(s, &m, zmq_msg_data(payload), zmq_msg_size(payload));
            tide_msg_clear(&m);
        }
    }
    for (int i = 0; i < 3; i++)
        zmq_msg_close(&f[i]);
    return 1;
}

/* ---- lifecycle ------------------------------------------------------------------------------ */

static int endpoint_is_local(const char *ep)
{
    if (strncmp(ep, "ipc://", 6) == 0 || strncmp(ep, "inproc://", 9) == 0)
        return 1;
    if (strncmp(ep, "tcp://", 6) != 0)
        return 0;
    const char *host = ep + 6;
    const char *colon = strrchr(host, ':');
    size_t len = colon ? (size_t)(colon - host) : strlen(host);
    if (strchr(host, ';') != NULL && strchr(host, ';') < host + len)
        return 0; /* source;destination syntax: not a plain bind address */
    if (len >= 2 && host[0] == '[' && host[len - 1] == ']') {
        host++;
        len -= 2;
    }
    if (len == 9 && strncmp(host, "localhost", 9) == 0)
        return 1;
    if (len == 3 && strncmp(host, "::1", 3) == 0)
        return 1;
    if (len >= 4 && strncmp(host, "127.", 4) == 0) {
        for (size_t i = 4; i < len; i++)
            if (!((host[i] >= '0' && host[i] <= '9') || host[i] == '.'))
                return 0;
        return 1;
    }
    return 0;
}

static tide_status write_endpoint_file(const char *path, const char *ep)
{
    char tmp[1024];
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());
    FILE *f = fopen(tmp, "w");
    if (f == NULL)
        return tide_errorf(TIDE_ERR_IO, "cannot write --endpoint-file %s: %s", path,
                           strerror(errno));
    fprintf(f, "%s\n", ep);
    int bad = fclose(f) != 0;
    if (bad || rename(tmp, path) != 0) {
        unlink(tmp);
        return tide_errorf(TIDE_ERR_IO, "cannot write --endpoint-file %s: %s", path,
                           strerror(errno));
    }
    return TIDE_OK;
}

static size_t after_load(tide_server_t *s, uint64_t now);

tide_status tide_server_new(tide_server_t **out, const tide_server_config *cfg)
{
    tide_status rc = TIDE_OK;
    tide_server_t *s = tide_calloc(1, sizeof *s);
    if (s == NULL)
        return tide_errorf(TIDE_ERR_NOMEM, "out of memory starting tided");
    s->cfg = *cfg;
    s->http_fd = -1;
    for (int i = 0; i < TIDE__METRICS_CLIENTS; i++)
        s->http[i].fd = -1;
    tide_proto_buf_init(&s->buf);
    if (cfg->endpoint == NULL || cfg->state_path == NULL)
        TIDE_FAIL_GOTO(rc, fail, TIDE_ERR_INVALID, "tided needs an endpoint and a state file");
    if (cfg->heartbeat_ms < 10 || cfg->miss_limit < 1)
        TIDE_FAIL_GOTO(rc, fail, TIDE_ERR_RANGE,
                       "heartbeat period must be >= 10 ms and the miss limit >= 1");
    if (cfg->retention_ms < 0 || cfg->max_client_workers < 1 || cfg->status_page < 1 ||
        cfg->status_page > (int)TIDE_PROTO_ROWS_MAX)
        TIDE_FAIL_GOTO(rc, fail, TIDE_ERR_RANGE,
                       "retention must be >= 0 ms, the per-client worker limit >= 1 and the "
                       "status page 1..%u rows",
                       TIDE_PROTO_ROWS_MAX);
    int with_auth = cfg->auth_dir != NULL && cfg->auth_dir[0] != '\0';
    if (!with_auth && !endpoint_is_local(cfg->endpoint))
        TIDE_FAIL_GOTO(rc, fail, TIDE_ERR_DENIED,
                       "refusing to bind %s without authentication: a non-loopback endpoint "
                       "needs --auth DIR (create keys with 'tidectl keygen')",
                       cfg->endpoint);
    TIDE_CHECK_GOTO(tide_coord_state_new(&s->st), rc, fail);
    TIDE_CHECK_GOTO(tide_store_open(&s->store, cfg->state_path, cfg->sync_full), rc, fail);
    TIDE_CHECK_GOTO(tide_store_load(s->store, s->st), rc, fail);
    uint64_t now = tide_now_ns();
    now_ns_cached = now;
    size_t pending = after_load(s, now);
    TIDE_INFO("server", "state %s: %zu workers, %zu jobs, %zu pending reconfigurations",
              cfg->state_path, s->st->n_workers, s->st->n_jobs, pending);

    s->zctx = zmq_ctx_new();
    if (s->zctx == NULL)
        TIDE_FAIL_GOTO(rc, fail, TIDE_ERR_IO, "zmq_ctx_new: %s", zmq_strerror(errno));
    if (with_auth) {
        TIDE_CHECK_GOTO(tide__auth_load(&s->auth, cfg->auth_dir), rc, fail);
        s->zap = zmq_socket(s->zctx, ZMQ_REP);
        int linger = 0;
        zmq_setsockopt(s->zap, ZMQ_LINGER, &linger, sizeof linger);
        if (s->zap == NULL || zmq_bind(s->zap, "inproc://zeromq.zap.01") != 0)
            TIDE_FAIL_GOTO(rc, fail, TIDE_ERR_IO, "cannot start the ZAP handler: %s",
                           zmq_strerror(errno));
        s->auth_on = 1;
    }
    s->router = zmq_socket(s->zctx, ZMQ_ROUTER);
    if (s->router == NULL)
        TIDE_FAIL_GOTO(rc, fail, TIDE_ERR_IO, "zmq_socket: %s", zmq_strerror(errno));
    int linger = 0, hwm = HWM;
    int64_t maxmsg = (int64_t)TIDE_PROTO_MAX_MSG_BYTES + 1024;
    zmq_setsockopt(s->router, ZMQ_LINGER, &linger, sizeof linger);
    zmq_setsockopt(s->router, ZMQ_SNDHWM, &hwm, sizeof hwm);
    zmq_setsockopt(s->router, ZMQ_RCVHWM, &hwm, sizeof hwm);
    zmq_setsockopt(s->router, ZMQ_MAXMSGSIZE, &maxmsg, sizeof maxmsg);
    int mandatory = 1; /* a full queue says EAGAIN instead of dropping: see flush_out */
    zmq_setsockopt(s->router, ZMQ_ROUTER_MANDATORY, &mandatory, sizeof mandatory);
    if (s->auth_on) {
        int one = 1;
        zmq_setsockopt(s->router, ZMQ_ZAP_DOMAIN, "tide", 4);
        zmq_setsockopt(s->router, ZMQ_CURVE_SERVER, &one, sizeof one);
        if (zmq_setsockopt(s->router, ZMQ_CURVE_SECRETKEY, s->auth.server_secret, 41) != 0)
            TIDE_FAIL_GOTO(rc, fail, TIDE_ERR_INVALID,
                           "server.key in %s holds an invalid secret key: %s", cfg->auth_dir,
                           zmq_strerror(errno));
    }
    if (zmq_bind(s->router, cfg->endpoint) != 0)
        TIDE_FAIL_GOTO(rc, fail, TIDE_ERR_IO,
                       "cannot bind %s: %s (is another tided running? pick another --endpoint)",
                       cfg->endpoint, zmq_strerror(errno));
    size_t eplen = sizeof s->endpoint;
    if (zmq_getsockopt(s->router, ZMQ_LAST_ENDPOINT, s->endpoint, &eplen) != 0)
        snprintf(s->endpoint, sizeof s->endpoint, "%s", cfg->endpoint);
    if (cfg->endpoint_file != NULL && cfg->endpoint_file[0] != '\0')
        TIDE_CHECK_GOTO(write_endpoint_file(cfg->endpoint_file, s->endpoint), rc, fail);
    if (cfg->metrics != NULL && cfg->metrics[0] != '\0')
        TIDE_CHECK_GOTO(tide__metrics_open(s, cfg->metrics), rc, fail);
    s->next_scan_ns = now;
    s->drained_ns = now;
    s->want_backfill = 1;
    s->peers = tide_calloc(TIDE__PEER_SLOTS, sizeof *s->peers);
    if (s->peers == NULL)
        TIDE_FAIL_GOTO(rc, fail, TIDE_ERR_NOMEM, "out of memory starting tided");
    TIDE_INFO("server", "listening on %s%s", s->endpoint, s->auth_on ? " (CURVE)" : "");
    *out = s;
    return TIDE_OK;
fail:
    tide_server_destroy(&s);
    return rc;
}

const char *tide_server_endpoint(const tide_server_t *s)
{
    return s->endpoint;
}

void tide_server_stop(tide_server_t *s)
{
    s->stop = 1;
}

/* Gives the reloaded (or first loaded) state one failure timeout to hear from its
 * workers and its pending reconfigurations their full deadline. */
static size_t after_load(tide_server_t *s, uint64_t now)
{
    int64_t wall = tide_wall_ms();
    for (size_t i = 0; i < s->st->n_workers; i++) {
        tide_coord_worker_t *w = &s->st->workers[i];
        if (w->pool[0] != '\0')
            tide_coord_worker_seen(s->st, w, now);
        w->last_hb_ns = now;
        tide_coord_job_t *jj =
            w->joined && !tide_coord_worker_gone(w) ? tide_coord_job_get(s->st, w->joined) : NULL;
        if (jj != NULL)
            jj->joins++;
        if (w->pool[0] != '\0' && tide_coord_worker_gone(w) && w->gone_ms == 0)
            w->gone_ms = wall; /* a state file from before gone_ms: retention starts now */
    }
    size_t pending = 0;
    for (size_t i = 0; i < s->st->n_jobs; i++) {
        tide_coord_job_t *j = s->st->jobs[i];
        tide_reconf_t *r = j->reconf;
        if (r == NULL)
            continue;
        pending++;
        r->started_ns = now;
        r->deadline_ns = now + (uint64_t)s->cfg.resize_timeout_ms * 1000000ull;
        r->resend_ns = now;
        /* a release's ranks are not stored either: listed again from the pools, and one
           that no rank switched yet abandoned at once like a join */
        int release = 0;
        if (tide__reconf_setup_leave(s, j) != TIDE_OK) {
            TIDE_WARN("server", "job %s: generation %llu's release cannot be listed again: %s",
                      j->name, (unsigned long long)r->gen, tide_last_error());
            release = 1;
        }
        release |= r->n_leave > 0;
        if (release && !r->switched)
            r->deadline_ns = now;
        for (size_t k = 0; k < r->n_parts; k++) {
            tide_coord_worker_t *w = tide__job_worker(s, j, r->parts[k]);
            r->gone[k] = w == NULL || tide_coord_worker_gone(w);
        }
        /* a join's ranks and port are not stored: one that no rank switched yet is
           abandoned at once (the job stays on its layout; the resize can be repeated) */
        for (size_t k = 0; !r->switched && k < tide_layout_size(r->layout); k++) {
            int32_t rk = 0;
            int p = tide_coord_job_locate(j, r->layout->worker[k], &rk);
            if (p >= 0 && !j->pools[p].connected)
                r->deadline_ns = now;
        }
    }
    return pending;
}

/*
 * The state file failed (disk full, I/O error): the batch is rolled back, the
 * memory state reloaded from what is saved, each request of the batch answered
 * with the error, and tided goes on serving reads only (never acknowledging a
 * change it could not save) until it is restarted.
 */
static void enter_readonly(tide_server_t *s)
{
    snprintf(s->readonly, sizeof s->readonly, "%s", tide_last_error());
    tide_store_rollback(s->store);
    tide_coord_state_t *fresh = NULL;
    if (tide_coord_state_new(&fresh) != TIDE_OK || tide_store_load(s->store, fresh) != TIDE_OK) {
        tide_coord_state_destroy(&fresh);
        drop_out(s);
        return; /* s->fatal stays set: the loop ends */
    }
    /* connections survive the reload: replies to later reads need no re-register */
    for (size_t i = 0; i < fresh->n_workers && i < s->st->n_workers; i++) {
        tide_coord_worker_t *nw = &fresh->workers[i], *ow = &s->st->workers[i];
        if (nw->id == ow->id) {
            memcpy(nw->rid, ow->rid, ow->rid_len);
            nw->rid_len = ow->rid_len;
            nw->delim = ow->delim;
        }
    }
    tide_coord_state_destroy(&s->st);
    s->st = fresh;
    after_load(s, now_ns_cached);
    tide_msg_t err;
    tide_msg_init(&err, TIDE_MSG_ERROR);
    err.u.error.code = TIDE_ERR_IO;
    snprintf(err.u.error.message, sizeof err.u.error.message,
             "tided could not save this change (%s); nothing of it was applied. tided now "
             "serves status, jobs and events only: free disk space or fix the state file's "
             "file system, then restart tided",
             s->readonly);
    size_t n = s->n_out, k = 0;
    for (size_t i = 0; i < n; i++) {
        tide__out o = s->out[i];
        tide_free(o.data);
        if (!o.reply)
            continue; /* commands of a change that did not happen */
        if (tide_proto_encode(&err, &s->buf) != TIDE_OK)
            continue;
        o.data = tide_proto_buf_release(&s->buf, &o.len);
        s->out[k++] = o;
    }
    s->n_out = k;
    s->fatal = TIDE_OK;
    TIDE_ERROR("store",
               "the state file cannot be written (%s): the last batch was rolled back and "
               "tided serves reads only until it is restarted",
               s->readonly);
}

/* Commits the batch, then sends its replies; a failed commit sends only errors. */
static void finish_batch(tide_server_t *s)
{
    if (s->readonly[0] != '\0') {
        flush_out(s);
        return;
    }
    if (s->fatal == TIDE_OK) {
        tide_status rc = tide_store_commit(s->store);
        if (rc != TIDE_OK)
            s->fatal = rc;
    }
    if (s->fatal != TIDE_OK) {
        enter_readonly(s);
        if (s->fatal != TIDE_OK)
            return;
    }
    flush_out(s);
}

/* 1 while a job still refers to w: it holds or runs something, it is in the layout or the
 * pending switch of an online job that has not ended, or it was fenced from one (a process
 * that comes back must still be told so), or an assigned offline job names it. */
static int worker_referenced(const tide_server_t *s, const tide_coord_worker_t *w)
{
    if (w->job != 0 || w->offline_job != 0)
        return 1;
    for (size_t i = 0; i < s->st->n_jobs; i++) {
        const tide_coord_job_t *j = s->st->jobs[i];
        if (j->state == TIDE_JS_DONE || j->state == TIDE_JS_CANCELLED)
            continue;
        if (j->kind == TIDE_CJOB_OFFLINE) {
            if (j->state == TIDE_JS_ASSIGNED && j->worker == w->id)
                return 1;
            continue;
        }
        if (j->state == TIDE_JS_FAILED)
            continue;
        if (w->fenced_job == j->id)
            return 1;
        int32_t jr = tide_coord_job_rank(j, w);
        if (jr < 0)
            continue;
        if (j->layout != NULL && tide_coord_layout_has(j->layout, jr))
            return 1;
        if (j->reconf != NULL && tide_reconf_find(j->reconf, jr) >= 0)
            return 1;
    }
    return 0;
}

/*
 * Forgets the workers that left or failed more than the retention period ago and that no
 * job refers to any more: their slots and state file rows go, their ids are never handed
 * out again. Without this the table (and every status reply) grows with every launch.
 * Runs every second over the next FORGET_SLICE slots only (a cursor goes round the
 * table): retention is minutes to hours, and a pass over 10^5 workers every second
 * would be tided's largest steady cost.
 */
static void forget_workers(tide_server_t *s)
{
    int64_t now_ms = tide_wall_ms();
    size_t forgotten = 0, n = s->st->n_workers;
    size_t slice = n < FORGET_SLICE ? n : FORGET_SLICE;
    for (size_t k = 0; k < slice; k++) {
        size_t i = s->forget_at++ % n;
        tide_coord_worker_t *w = &s->st->workers[i];
        if (w->pool[0] == '\0' || !tide_coord_worker_gone(w) ||
            now_ms - w->gone_ms < s->cfg.retention_ms || worker_referenced(s, w))
            continue;
        int32_t id = w->id;
        TIDE_DEBUG("server", "forgetting worker %d (%s rank %d, %s since %lld ms)", id, w->pool,
                   w->rank, tide_wstate_name(w->state), (long long)(now_ms - w->gone_ms));
        tide_coord_worker_remove(s->st, id);
        if (store_ready(s))
            store_result(s, tide_store_del_worker(s->store, id, s->st->next_worker_id));
        forgotten++;
        if (s->st->n_workers == 0)
            break; /* the table shrank to nothing under the cursor */
    }
    if (forgotten > 0) {
        TIDE_INFO("server", "forgot %zu workers that left or failed more than %lld ms ago",
                  forgotten, (long long)s->cfg.retention_ms);
        tide__event(s, "", "workers_forgotten",
                    "%zu workers that left or failed more than %lld ms ago (and that no job "
                    "refers to) were removed from the worker table",
                    forgotten, (long long)s->cfg.retention_ms);
    }
}

/* Declares failed the workers silent for miss_limit heartbeats at now: read off the front
 * of the seen list (workers by last message), so a scan costs the expired workers, not
 * the worker table (10^5 workers scanned four times a second were most of tided's idle
 * CPU). Each failure of a job's member starts a recovery that sends its layout to every
 * participant: when a whole cluster goes silent, one pass would queue failures x members
 * messages (gigabytes at 10^5 workers). So a pass fails workers only while its outbox
 * holds less than SCAN_OUT_BYTES and sets scan_more: the next pass, right after this
 * one's messages went out, goes on. */
static void scan_failures(tide_server_t *s, uint64_t now)
{
    uint64_t hb = (uint64_t)s->cfg.heartbeat_ms * 1000000ull;
    uint64_t limit = hb * (uint64_t)(s->cfg.miss_limit > 0 ? s->cfg.miss_limit : 1);
    int32_t ids[16];
    size_t n = sizeof ids / sizeof ids[0];
    s->scan_more = 0;
    while (n == sizeof ids / sizeof ids[0]) {
        if (s->out_bytes >= SCAN_OUT_BYTES) {
            s->scan_more = 1;
            return;
        }
        n = tide_coord_workers_expired(s->st, now, limit, ids, sizeof ids / sizeof ids[0]);
        for (size_t i = 0; i < n; i++) {
            tide_coord_worker_t *w = &s->st->workers[ids[i]];
            char why[128];
            snprintf(why, sizeof why, "no message for %llu ms (%d heartbeats of %lld ms missed)",
                     (unsigned long long)((now - w->last_seen_ns) / 1000000ull), s->cfg.miss_limit,
                     (long long)s->cfg.heartbeat_ms);
            tide__worker_failed(s, w, why);
        }
    }
}

tide_status tide_server_run(tide_server_t *s)
{
    zmq_pollitem_t items[2 + TIDE__METRICS_CLIENTS + 1];
    uint64_t scan_every = (uint64_t)s->cfg.heartbeat_ms * 1000000ull / 4;
    if (scan_every < 20000000ull)
        scan_every = 20000000ull;
    uint64_t batch_ns = (uint64_t)(s->cfg.batch_ms > 0 ? s->cfg.batch_ms : 0) * 1000000ull;
    uint64_t pass_ns = 0; /* start of the previous pass that handled requests */
    int full = 0;         /* it stopped at BATCH requests or PASS_MS: more are waiting */
    while (!s->stop && s->fatal == TIDE_OK) {
        /* Gather: ZeroMQ signals the loop once per wakeup, not per message, so waiting a
         * moment after a pass lets a second's 10^4 heartbeats arrive in ~500 passes instead
         * of 10^4 wakeups (context switches and eventfd writes dominated tided's CPU). */
        if (batch_ns > 0 && pass_ns != 0 && !full && !s->want_backfill) {
            uint64_t now = tide_now_ns();
            if (now - pass_ns < batch_ns)
                tide_sleep_ms((batch_ns - (now - pass_ns) + 999999ull) / 1000000ull);
        }
        int n = 0;
        items[n++] = (zmq_pollitem_t){s->router, 0, ZMQ_POLLIN, 0};
        int zap_at = -1;
        if (s->zap) {
            zap_at = n;
            items[n++] = (zmq_pollitem_t){s->zap, 0, ZMQ_POLLIN, 0};
        }
        int m_at = n;
        n += tide__metrics_poll_items(s, items + n, (int)(sizeof items / sizeof items[0]) - n);
        uint64_t now = tide_now_ns();
        long timeout = s->next_scan_ns > now ? (long)((s->next_scan_ns - now) / 1000000ull) + 1 : 0;
        if (s->want_backfill)
            timeout = 0;
        else if (s->n_backlog > 0 && timeout > 2)
            timeout = 2; /* a client's full queue may have room again: see flush_out */
        int r = zmq_poll(items, n, timeout);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            return tide_errorf(TIDE_ERR_IO, "zmq_poll: %s", zmq_strerror(errno));
        }
        now_ns_cached = tide_now_ns();
        if (zap_at >= 0 && (items[zap_at].revents & ZMQ_POLLIN))
            tide__auth_zap(s);
        int handled = 0;
        s->pass_no++;
        uint64_t pass_end = now_ns_cached + (uint64_t)PASS_MS * 1000000ull;
        if (items[0].revents & ZMQ_POLLIN) {
            for (;;) {
                uint64_t before = tide_now_ns();
                if (handled >= BATCH || s->fatal != TIDE_OK || before >= pass_end)
                    break;
                if (!recv_one(s)) {
                    s->drained_ns = before;
                    break;
                }
                handled++;
            }
        } else {
            s->drained_ns = now_ns_cached;
        }
        full = handled > 0 && s->drained_ns < now_ns_cached;
        pass_ns = handled > 0 ? now_ns_cached : 0;
        now_ns_cached = tide_now_ns();
        if (s->readonly[0] != '\0') {
            s->want_backfill = 0; /* no decision can be saved: none is taken */
            s->next_scan_ns = now_ns_cached + scan_every;
        }
        if (now_ns_cached >= s->next_scan_ns) {
            uint64_t hb = (uint64_t)s->cfg.heartbeat_ms * 1000000ull;
            if (s->last_scan_ns != 0 && now_ns_cached - s->last_scan_ns > scan_every + hb) {
                s->grace_until_ns = now_ns_cached + hb * (uint64_t)s->cfg.miss_limit;
                TIDE_WARN_LIMITED(
                    "server",
                    "tided did not run for %llu ms (starved of CPU or blocked on "
                    "disk): workers get %lld ms more before any is declared "
                    "failed",
                    (unsigned long long)((now_ns_cached - s->last_scan_ns) / 1000000ull),
                    (long long)s->cfg.heartbeat_ms * s->cfg.miss_limit);
            }
            s->last_scan_ns = now_ns_cached;
            if (now_ns_cached >= s->grace_until_ns)
                scan_failures(s, s->drained_ns);
            tide__reconf_tick(s, now_ns_cached);
            if (now_ns_cached >= s->next_forget_ns) {
                forget_workers(s);
                s->next_forget_ns = now_ns_cached + 1000000000ull; /* ms-scale retention
                                                                       needs no finer scan */
            }
            if (s->next_backfill_ns != 0 && now_ns_cached >= s->next_backfill_ns)
                s->want_backfill = 1; /* a retry's backoff or a join grace ended */
            /* failures left for the next pass (scan_failures): once this one's messages
               went out */
            s->next_scan_ns = s->scan_more ? now_ns_cached : now_ns_cached + scan_every;
        }
        if (s->want_backfill && s->fatal == TIDE_OK)
            backfill(s);
        finish_batch(s);
        tide__metrics_handle(s, items + m_at, n - m_at);
    }
    if (s->fatal == TIDE_OK)
        finish_batch(s);
    TIDE_INFO("server", "stopped%s", s->fatal ? " after a state file error" : "");
    if (s->fatal == TIDE_OK && s->readonly[0] != '\0')
        return tide_errorf(TIDE_ERR_IO, "stopped in read-only mode: %s", s->readonly);
    return s->fatal;
}

void tide_server_destroy(tide_server_t **self_p)
{
    if (self_p == NULL || *self_p == NULL)
        return;
    tide_server_t *s = *self_p;
    drop_out(s);
    tide_free(s->out);
    tide_free(s->peers);
    tide__metrics_close(s);
    if (s->router)
        zmq_close(s->router);
    if (s->zap)
        zmq_close(s->zap);
    if (s->zctx)
        zmq_ctx_term(s->zctx);
    tide__auth_free(&s->auth);
    tide_store_close(&s->store);
    tide_coord_state_destroy(&s->st);
    tide_proto_buf_destroy(&s->buf);
    tide_free(s);
    *self_p = NULL;
}
