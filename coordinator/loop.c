/*
 * coordinator/loop: tided's core (see loop.h): sockets, passes, dispatch, timers, hooks
 * and the batch's transaction. Handlers live in their own modules; server.c registers
 * them.
 *
 * A loop iteration: zmq_poll on the ROUTER socket, the ZAP socket and the registered
 * sources; drain up to BATCH requests or PASS_MS of work; run the tick hooks when a tick
 * is due (failure scan, switch deadlines, retention) and the scheduling hooks when asked
 * (backfill); commit the batch's SQLite transaction; only then send the batch's replies
 * and commands. Heartbeats change only volatile fields: no transaction, no reply.
 *
 * Liveness never depends on how long the loop was busy: a message is stamped with the
 * time it is read (s->now_ns), and the ROUTER queue's last empty time (drained_ns) tells
 * the liveness hook when everything sent before it has been read. No client can starve
 * the others: ZeroMQ reads connections round-robin, and a client whose operator requests
 * used PEER_PASS_MS of handler time in a pass gets its further ones in that pass refused
 * (TIDE_ERR_BUSY, cheap) instead of served, and so does one whose replies queued
 * PEER_PASS_BYTES in that pass. Per-connection queues are bounded (HWM messages each
 * way), so a client that never reads its replies costs tided a bounded amount of memory.
 *
 * Envelope: DEALER clients send [payload] (ROUTER sees [id][payload]); REQ-style
 * clients may add an empty delimiter ([id][][payload]); replies mirror it.
 */
#include <assert.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/clock.h"
#include "core/error.h"
#include "core/log.h"
#include "coordinator/health.h"
#include "coordinator/intake.h"
#include "coordinator/loop.h"
#include "coordinator/allocs.h"
#include "coordinator/outbox.h"

#define BATCH        2048 /* requests per loop iteration before timers and the commit */
#define PASS_MS      50   /* handler time of one pass before timers, the commit and the replies */
#define PEER_PASS_MS 10   /* handler time one client's operator requests may use per pass */
/* Messages queued per connection each way; a client that floods waits in its own queue.
 * ZeroMQ counts messages, not bytes, so this (with ZeroMQ's low-water slack of half of it)
 * times the largest reply is what such a client can hold in tided: 64 status replies of a
 * 200-worker cluster are 2 MB, where 1000 were 30-45 MB. A burst beyond it waits in the
 * outbox's backlog for the client (TIDE__BACKLOG_BYTES), so a client that never reads holds
 * at most 1.5 * HWM * its largest reply + TIDE__BACKLOG_BYTES + PEER_PASS_BYTES in tided. */
#define HWM             64
#define PEER_PASS_BYTES (4u << 20) /* reply bytes one client's requests may queue per pass */
#define PEER_SLOTS      1024       /* clients tracked per pass for the fairness budget */
#define HOOKS_MAX       8          /* hooks of one kind */
#define SOURCES_MAX     4          /* registered poll sources */
#define POLL_ITEMS      64         /* poll items of one iteration, every source included */

typedef struct handler {
    tide__msg_fn fn; /* NULL: nobody handles this type */
    unsigned flags;
} handler;

typedef struct hooks {
    tide__hook_fn fn[HOOKS_MAX];
    int n;
} hooks;

/* Handler time and reply bytes one client used in the current loop pass. */
typedef struct peer_cost {
    uint64_t pass; /* loop pass this slot belongs to; an older pass frees it */
    uint64_t ns;   /* handler time spent on this client's requests in that pass */
    size_t bytes;  /* bytes of replies queued for this client in that pass */
    size_t rid_len;
    unsigned char rid[TIDE_COORD_RID_MAX];
} peer_cost;

typedef struct source {
    tide__poll_fill_fn fill;
    tide__poll_handle_fn handle;
    int at, n; /* its items in this iteration's poll array */
} source;

struct tide__core {
    char endpoint[256];
    void *zctx;
    void *router;
    void *zap; /* REP socket on inproc://zeromq.zap.01 when auth is on */
    tide__intake *intake; /* what each connection's unread bytes cost (NULL: not watched) */
    int intake_at;        /* its monitor's item in this iteration's poll array, or -1 */
    tide__auth auth;
    tide_store_t *store;
    tide_status fatal;  /* a store failure of the batch: it ends degraded (finish_batch) */
    char fail_why[512]; /* that failure's message */
    tide__health health; /* whether the state file takes writes; what is not on it yet */
    int op_change;       /* the request being handled is an operator's change (serve) */
    tide__outbox ob;
    handler handlers[TIDE_MSG__COUNT];
    hooks tick, schedule, load;
    source sources[SOURCES_MAX];
    int n_sources;
    /* timers, monotonic ns */
    uint64_t next_tick_ns;
    int tick_soon;
    uint64_t drained_ns;
    int want_schedule;
    uint64_t next_schedule_ns; /* a scheduling pass then; 0: none asked */
    /* fairness */
    peer_cost *peers; /* PEER_SLOTS entries */
    uint64_t pass_no;
    uint64_t refused_busy;
};

/* ---- registration ---------------------------------------------------------------------------- */

void tide__on_message(tide_server_t *s, tide_msg_type_t type, tide__msg_fn fn, unsigned flags)
{
    assert(type > TIDE_MSG_NONE && type < TIDE_MSG__COUNT && s->core->handlers[type].fn == NULL);
    s->core->handlers[type] = (handler){fn, flags};
}

static void add_hook(hooks *h, tide__hook_fn fn)
{
    assert(h->n < HOOKS_MAX);
    h->fn[h->n++] = fn;
}

static void run_hooks(tide_server_t *s, const hooks *h)
{
    for (int i = 0; i < h->n; i++)
        h->fn[i](s);
}

void tide__on_tick(tide_server_t *s, tide__hook_fn fn)
{
    add_hook(&s->core->tick, fn);
}

void tide__on_schedule(tide_server_t *s, tide__hook_fn fn)
{
    add_hook(&s->core->schedule, fn);
}

void tide__on_load(tide_server_t *s, tide__hook_fn fn)
{
    add_hook(&s->core->load, fn);
}

void tide__on_poll(tide_server_t *s, tide__poll_fill_fn fill, tide__poll_handle_fn handle)
{
    assert(s->core->n_sources < SOURCES_MAX);
    s->core->sources[s->core->n_sources++] = (source){fill, handle, 0, 0};
}

/* ---- answering and sending ------------------------------------------------------------------- */

void tide__send_worker(tide_server_t *s, const tide_coord_worker_t *w, const tide_msg_t *msg)
{
    tide__outbox_push(&s->core->ob, w->rid, w->rid_len, w->delim, 0, msg);
}

void tide__reply(tide_server_t *s, const tide_msg_t *msg)
{
    /* an error changed nothing: it stays what it says if the batch cannot be saved */
    int change = s->core->op_change && msg->type != TIDE_MSG_ERROR;
    tide__outbox_push(&s->core->ob, s->req.rid, s->req.rid_len, s->req.delim,
                      change ? TIDE__OUT_CHANGE : TIDE__OUT_REPLY, msg);
}

void tide__reply_to(tide_server_t *s, const tide__request *to, const tide_msg_t *msg)
{
    tide__outbox_push(&s->core->ob, to->rid, to->rid_len, to->delim, TIDE__OUT_REPLY, msg);
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
    TIDE_INFO_LIMITED("server", "refused a request from %s: %s", s->req.who, m.u.error.message);
    tide__reply(s, &m);
    return code;
}

static void reply_ok_v(tide_server_t *s, const char *job, uint64_t gen, const char *fmt,
                       va_list ap)
{
    tide_msg_t m;
    tide_msg_init(&m, TIDE_MSG_OK);
    snprintf(m.u.ok.job, sizeof m.u.ok.job, "%s", job ? job : "");
    vsnprintf(m.u.ok.message, sizeof m.u.ok.message, fmt, ap);
    m.u.ok.gen = gen;
    tide__reply(s, &m);
}

void tide__reply_ok(tide_server_t *s, const char *job, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    reply_ok_v(s, job, 0, fmt, ap);
    va_end(ap);
}

void tide__reply_ok_gen(tide_server_t *s, const char *job, uint64_t gen, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    reply_ok_v(s, job, gen, fmt, ap);
    va_end(ap);
}

/* ---- durable changes ------------------------------------------------------------------------- */

/* Notes the batch's first store failure (tide_last_error says why). */
static void store_failed(tide__core *c, tide_status rc)
{
    if (c->fatal != TIDE_OK)
        return;
    c->fatal = rc;
    snprintf(c->fail_why, sizeof c->fail_why, "%s", tide_last_error());
    TIDE_ERROR("store", "%s", c->fail_why);
}

/* 1 when this batch's writes go to the store: it is healthy and the batch has not failed
 * (otherwise memory alone holds the change, written back when the file takes it). */
static int store_ready(tide__core *c)
{
    if (c->fatal != TIDE_OK || c->health.degraded)
        return 0;
    tide_status rc = tide_store_begin(c->store);
    if (rc != TIDE_OK) {
        store_failed(c, rc);
        return 0;
    }
    return 1;
}

static void store_result(tide__core *c, tide_status rc)
{
    if (rc != TIDE_OK)
        store_failed(c, rc);
}

void tide__save_worker(tide_server_t *s, const tide_coord_worker_t *w)
{
    if (store_ready(s->core))
        store_result(s->core, tide_store_put_worker(s->core->store, w));
}

void tide__save_job(tide_server_t *s, const tide_coord_job_t *j)
{
    if (store_ready(s->core))
        store_result(s->core, tide_store_put_job(s->core->store, j));
}

void tide__save_attempt(tide_server_t *s, const tide_store_attempt_t *a)
{
    tide__health_attempt(&s->core->health, a);
    if (store_ready(s->core))
        store_result(s->core, tide_store_put_attempt(s->core->store, a));
}

void tide__save_alloc(tide_server_t *s, const char *pool, const tide_proto_alloc_t *a)
{
    tide__health_alloc(&s->core->health, pool, a);
    if (store_ready(s->core))
        store_result(s->core, tide_store_put_alloc(s->core->store, pool, a));
}

void tide__save_alloc_removed(tide_server_t *s, const char *pool)
{
    tide__health_alloc(&s->core->health, pool, NULL);
    if (store_ready(s->core))
        store_result(s->core, tide_store_del_alloc(s->core->store, pool));
}

void tide__save_worker_removed(tide_server_t *s, int32_t id)
{
    if (store_ready(s->core))
        store_result(s->core, tide_store_del_worker(s->core->store, id, s->st->next_worker_id));
}

/* The one writer of events: a sentence, and the typed fields when there are some. */
static void event_v(tide_server_t *s, const char *job, const char *kind,
                    const tide_proto_event_fields_t *f, const char *fmt, va_list ap)
    TIDE_PRINTF(5, 0);
static void event_v(tide_server_t *s, const char *job, const char *kind,
                    const tide_proto_event_fields_t *f, const char *fmt, va_list ap)
{
    char detail[1024];
    vsnprintf(detail, sizeof detail, fmt, ap);
    int64_t now_ms = tide_wall_ms();
    tide__health_event(&s->core->health, now_ms, job, kind, f, detail);
    if (store_ready(s->core))
        store_result(s->core,
                     tide_store_event_fields(s->core->store, now_ms, job, kind, f, detail));
}

void tide__event(tide_server_t *s, const char *job, const char *kind, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    event_v(s, job, kind, NULL, fmt, ap);
    va_end(ap);
}

void tide__event_f(tide_server_t *s, const char *job, const char *kind,
                   const tide_proto_event_fields_t *f, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    event_v(s, job, kind, f, fmt, ap);
    va_end(ap);
}

tide_store_t *tide__store(tide_server_t *s)
{
    return s->core->store;
}

const tide__health *tide__health_of(const tide_server_t *s)
{
    return &s->core->health;
}

/* ---- timers ---------------------------------------------------------------------------------- */

void tide__reschedule(tide_server_t *s)
{
    s->core->want_schedule = 1;
}

void tide__reschedule_at(tide_server_t *s, uint64_t at_ns)
{
    tide__core *c = s->core;
    if (at_ns == 0)
        return; /* no time: nothing to wait for */
    if (c->next_schedule_ns == 0 || at_ns < c->next_schedule_ns)
        c->next_schedule_ns = at_ns;
}

void tide__tick_soon(tide_server_t *s)
{
    s->core->tick_soon = 1;
}

uint64_t tide__tick_ns(const tide_server_t *s)
{
    uint64_t every = (uint64_t)s->cfg.heartbeat_ms * 1000000ull / 4;
    return every < 20000000ull ? 20000000ull : every;
}

uint64_t tide__drained_ns(const tide_server_t *s)
{
    return s->core->drained_ns;
}

size_t tide__outbox_bytes(const tide_server_t *s)
{
    return s->core->ob.bytes;
}

void tide__loop_stats_get(const tide_server_t *s, tide__loop_stats *out)
{
    out->refused_busy = s->core->refused_busy;
    out->dropped_out = s->core->ob.dropped;
    out->n_backlog = s->core->ob.n_backlog;
}

/* ---- dispatch -------------------------------------------------------------------------------- */

static const handler *handler_of(const tide__core *c, tide_msg_type_t type)
{
    if (type <= TIDE_MSG_NONE || type >= TIDE_MSG__COUNT || c->handlers[type].fn == NULL)
        return NULL;
    return &c->handlers[type];
}

static void dispatch(tide_server_t *s, const tide_msg_t *m, const void *raw, size_t len)
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
    if (!tide__auth_allows(s->req.role, need)) {
        const char *key = need == TIDE_ROLE_ADMIN ? "an admin" : "a worker or admin";
        s->st->counters.denied++;
        TIDE_WARN_LIMITED("auth", "refused '%s' from %s: it needs %s key",
                          tide_msg_type_name(m->type), s->req.who, key);
        tide__reply_error(s, TIDE_ERR_DENIED, "'%s' needs %s key; %s may only %s",
                          tide_msg_type_name(m->type), key, s->req.who,
                          s->req.role == TIDE__ROLE_WORKER
                              ? "register, report and read status and jobs"
                              : "read status and jobs");
        return;
    }
    const handler *h = handler_of(s->core, m->type);
    if (h != NULL && (h->flags & TIDE__H_BEAT))
        s->st->counters.heartbeat_msgs++;
    else
        s->st->counters.requests++;
    if (h == NULL) {
        tide__reply_error(s, TIDE_ERR_PROTOCOL, "unexpected message '%s'",
                          tide_msg_type_name(m->type));
        return;
    }
    h->fn(s, m, raw, len);
}

/* The cost slot of the request's client in this pass (claimed when free); NULL when the
 * table is crowded, and that client is then not limited. */
static peer_cost *peer_cost_of(tide_server_t *s)
{
    tide__core *c = s->core;
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < s->req.rid_len; i++)
        h = (h ^ s->req.rid[i]) * 1099511628211ull;
    for (size_t k = 0; k < 8; k++) {
        peer_cost *p = &c->peers[(h + k) & (PEER_SLOTS - 1)];
        if (p->pass != c->pass_no) {
            p->pass = c->pass_no;
            p->ns = 0;
            p->bytes = 0;
            p->rid_len = s->req.rid_len;
            memcpy(p->rid, s->req.rid, s->req.rid_len);
            return p;
        }
        if (p->rid_len == s->req.rid_len && memcmp(p->rid, s->req.rid, s->req.rid_len) == 0)
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

static void serve_budgeted(tide_server_t *s, const tide_msg_t *m, const void *raw, size_t len);

/* An operator's request that changes what a restart must find (resize, submit, bounds...):
 * acknowledged only once it is on disk, so refused while the state file takes nothing. */
static int is_operator_change(const handler *h, tide_msg_type_t t)
{
    return tide_msg_type_role(t) == TIDE_ROLE_ADMIN &&
           (h == NULL || !(h->flags & TIDE__H_READONLY));
}

/* Dispatches m unless it is an operator's change the state file cannot take now, or its
 * client already used its budget of this pass. Workers are always served: liveness and
 * recovery never wait for the disk. */
static void serve(tide_server_t *s, const tide_msg_t *m, const void *raw, size_t len)
{
    tide__core *c = s->core;
    const handler *h = handler_of(c, m->type);
    int change = is_operator_change(h, m->type);
    if (change && c->health.degraded) {
        tide__reply_error(s, TIDE_ERR_IO,
                          "tided cannot persist its state: %s; nothing was changed. Try again "
                          "when the file system of %s has room (tidectl status says when tided "
                          "persists again); running jobs keep training and failures are still "
                          "recovered",
                          c->health.why, s->cfg.state_path);
        return;
    }
    c->op_change = change;
    serve_budgeted(s, m, raw, len);
    c->op_change = 0;
}

/* serve's second half: operator requests within their client's budget of this pass. */
static void serve_budgeted(tide_server_t *s, const tide_msg_t *m, const void *raw, size_t len)
{
    tide__core *c = s->core;
    if (!is_operator_request(m->type)) {
        dispatch(s, m, raw, len);
        return;
    }
    peer_cost *p = peer_cost_of(s);
    if (p != NULL &&
        (p->ns >= (uint64_t)PEER_PASS_MS * 1000000ull || p->bytes >= PEER_PASS_BYTES)) {
        c->refused_busy++;
        tide__reply_error(s, TIDE_ERR_BUSY,
                          "tided is still serving this client's earlier requests: send one "
                          "request at a time, or retry");
        return;
    }
    uint64_t t0 = s->now_ns;
    size_t bytes0 = c->ob.bytes;
    dispatch(s, m, raw, len);
    if (p != NULL) {
        p->ns += tide_now_ns() - t0;
        p->bytes += c->ob.bytes - bytes0;
    }
}

/* ---- receiving ------------------------------------------------------------------------------- */

/* Reads one message's frames (the first 3 into f, the rest counted in *extra); 0 when
 * none was waiting. Stamps s->now_ns when the first frame is read. */
static int read_frames(tide_server_t *s, zmq_msg_t f[3], int *nf_out, int *extra_out)
{
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
        int r = zmq_msg_recv(dst, s->core->router, nf == 0 ? ZMQ_DONTWAIT : 0);
        if (r >= 0 && nf == 0)
            s->now_ns = tide_now_ns(); /* stamped when read, not when the pass began */
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
    *nf_out = nf;
    *extra_out = extra;
    return 1;
}

/* Fills s->req from the message's frames; returns its payload frame, or NULL when the
 * envelope is not one tided answers with a decoded message. */
static zmq_msg_t *identify(tide_server_t *s, zmq_msg_t f[3], int nf, int extra)
{
    tide__request *q = &s->req;
    q->rid_len = zmq_msg_size(&f[0]);
    if (q->rid_len > sizeof q->rid)
        q->rid_len = sizeof q->rid;
    memcpy(q->rid, zmq_msg_data(&f[0]), q->rid_len);
    zmq_msg_t *payload = NULL;
    q->delim = 0;
    if (nf == 2 && !extra) {
        payload = &f[1];
    } else if (nf == 3 && !extra && zmq_msg_size(&f[1]) == 0) {
        payload = &f[2];
        q->delim = 1;
    }
    if (s->auth_on) {
        const char *uid = zmq_msg_gets(&f[nf - 1], "User-Id");
        q->role = tide__auth_role(uid);
        snprintf(q->who, sizeof q->who, "%s", uid ? uid : "unknown key");
    } else {
        q->role = TIDE__ROLE_ADMIN;
        snprintf(q->who, sizeof q->who, "a loopback client");
    }
    return payload;
}

/* Receives and handles one request; 0 when none was waiting. */
static int recv_one(tide_server_t *s)
{
    zmq_msg_t f[3];
    int nf = 0, extra = 0;
    if (!read_frames(s, f, &nf, &extra))
        return 0;
    tide__intake_read(s->core->intake, zmq_msg_get(&f[nf - 1], ZMQ_SRCFD), nf + extra);
    zmq_msg_t *payload = identify(s, f, nf, extra);
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
            TIDE_WARN_LIMITED("server", "malformed message from %s (%zu bytes): %s", s->req.who,
                              zmq_msg_size(payload), detail);
            tide__reply_error(s, rc == TIDE_ERR_NOMEM ? TIDE_ERR_NOMEM : TIDE_ERR_PROTOCOL, "%s",
                              detail);
        } else {
            serve(s, &m, zmq_msg_data(payload), zmq_msg_size(payload));
            tide_msg_clear(&m);
        }
    }
    for (int i = 0; i < 3; i++)
        zmq_msg_close(&f[i]);
    return 1;
}

/* ---- the batch's end: commit, or degraded ------------------------------------------------- */

/*
 * The batch's writes failed (disk full, I/O error): its transaction is rolled back but
 * memory keeps every decision (workers failed, recoveries started: their commands go out),
 * the journal keeps its events, and tided is degraded until try_persist writes the whole
 * in-memory truth back. An operator's change of this batch is in force in memory but not
 * on disk, so its acknowledgement is replaced by an error that says so.
 */
static void enter_degraded(tide_server_t *s)
{
    tide__core *c = s->core;
    tide_store_rollback(c->store);
    c->fatal = TIDE_OK;
    if (!tide__health_failed(&c->health, c->fail_why, s->now_ns, tide_wall_ms()))
        return;
    tide_proto_event_fields_t f;
    tide_event_fields_init(&f);
    tide_event_fields_reason(&f, c->fail_why);
    tide__event_f(s, "", "state_degraded", &f,
                  "tided cannot persist its state to %s: %s; it goes on deciding in memory "
                  "(failures are still detected and recovered), refuses operators' changes, "
                  "and writes everything back when the file takes writes again",
                  s->cfg.state_path, c->fail_why);
    tide_msg_t err;
    tide_msg_init(&err, TIDE_MSG_ERROR);
    err.u.error.code = TIDE_ERR_IO;
    snprintf(err.u.error.message, sizeof err.u.error.message,
             "tided cannot persist its state: %s. This change is in force while tided runs but "
             "is not on disk: a tided restart before the file system of %s has room loses it",
             c->fail_why, s->cfg.state_path);
    tide__outbox_refuse_changes(&c->ob, &err);
    TIDE_ERROR("store",
               "the state file cannot be written (%s): tided is degraded; it keeps deciding in "
               "memory and retries every %llu ms",
               c->fail_why, (unsigned long long)(TIDE__RETRY_NS / 1000000ull));
}

/* Writes every worker and job as memory holds them, then the journal, in the open
 * transaction: what a restart must find. */
static tide_status write_back(tide_server_t *s)
{
    tide__core *c = s->core;
    tide_coord_state_t *st = s->st;
    for (size_t i = 0; i < st->n_workers; i++) {
        const tide_coord_worker_t *w = tide_coord_worker_get(st, (int32_t)i);
        TIDE_CHECK(w != NULL ? tide_store_put_worker(c->store, w)
                             : tide_store_del_worker(c->store, (int32_t)i, st->next_worker_id));
    }
    for (size_t i = 0; i < st->n_jobs; i++)
        TIDE_CHECK(tide_store_put_job(c->store, st->jobs[i]));
    TIDE_CHECK(tide__health_replay(&c->health, c->store));
    double secs = (double)(s->now_ns - c->health.since_ns) / 1e9;
    char detail[1024];
    snprintf(detail, sizeof detail,
             "tided persists its state to %s again after %.1f s: %zu workers, %zu jobs and "
             "%zu held writes written back%s",
             s->cfg.state_path, secs, st->n_workers, st->n_jobs, c->health.n,
             c->health.dropped ? " (the oldest held writes were dropped: the journal was full)"
                               : "");
    return tide_store_event_fields(c->store, tide_wall_ms(), "", "state_restored", NULL, detail);
}

/* While degraded, once per TIDE__RETRY_NS (or now when force): writes the in-memory truth
 * back in one transaction; healthy again when it commits. */
static void try_persist(tide_server_t *s, int force)
{
    tide__core *c = s->core;
    if (!c->health.degraded || (!force && s->now_ns < c->health.retry_ns))
        return;
    tide_status rc = tide_store_begin(c->store);
    if (rc == TIDE_OK)
        rc = write_back(s);
    if (rc == TIDE_OK)
        rc = tide_store_commit(c->store);
    if (rc != TIDE_OK) {
        char why[512];
        snprintf(why, sizeof why, "%s", tide_last_error());
        tide_store_rollback(c->store);
        tide__health_failed(&c->health, why, s->now_ns, tide_wall_ms());
        TIDE_WARN_LIMITED("store", "still cannot persist the state: %s", why);
        return;
    }
    TIDE_INFO("store", "the state file takes writes again: tided's state is persisted");
    tide__health_committed(&c->health);
    tide__health_restored(&c->health);
}

/* Commits the batch, then sends its replies; a failed commit leaves tided degraded. */
static void finish_batch(tide_server_t *s)
{
    tide__core *c = s->core;
    if (c->fatal == TIDE_OK && !c->health.degraded) {
        tide_status rc = tide_store_commit(c->store);
        if (rc != TIDE_OK)
            store_failed(c, rc);
        else
            tide__health_committed(&c->health);
    }
    if (c->fatal != TIDE_OK)
        enter_degraded(s);
    tide__outbox_flush(&c->ob);
    try_persist(s, 0);
}

/* ---- lifecycle ------------------------------------------------------------------------------- */

tide_status tide__core_new(tide_server_t *s)
{
    tide__core *c = tide_calloc(1, sizeof *c);
    if (c != NULL)
        c->peers = tide_calloc(PEER_SLOTS, sizeof *c->peers);
    if (c == NULL || c->peers == NULL) {
        tide_free(c);
        return tide_errorf(TIDE_ERR_NOMEM, "out of memory starting tided");
    }
    tide__outbox_init(&c->ob);
    tide__health_init(&c->health);
    s->core = c;
    return TIDE_OK;
}

tide_status tide__core_load(tide_server_t *s)
{
    tide__core *c = s->core;
    TIDE_CHECK(tide_coord_state_new(&s->st));
    TIDE_CHECK(tide_store_open_ex(&c->store, s->cfg.state_path, s->cfg.sync_full,
                                  s->cfg.accept_state_loss));
    TIDE_CHECK(tide_store_load(c->store, s->st));
    s->now_ns = tide_now_ns();
    run_hooks(s, &c->load);
    c->next_tick_ns = s->now_ns;
    c->drained_ns = s->now_ns;
    c->want_schedule = 1;
    return TIDE_OK;
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

/* The ZAP handler's REP socket, when cfg asks for keys. */
static tide_status open_zap(tide_server_t *s)
{
    tide__core *c = s->core;
    TIDE_CHECK(tide__auth_load(&c->auth, s->cfg.auth_dir));
    c->zap = zmq_socket(c->zctx, ZMQ_REP);
    int linger = 0;
    zmq_setsockopt(c->zap, ZMQ_LINGER, &linger, sizeof linger);
    if (c->zap == NULL || zmq_bind(c->zap, "inproc://zeromq.zap.01") != 0)
        return tide_errorf(TIDE_ERR_IO, "cannot start the ZAP handler: %s", zmq_strerror(errno));
    s->auth_on = 1;
    return TIDE_OK;
}

/* The ROUTER socket with its limits (and CURVE when auth is on), not bound yet. */
static tide_status open_router(tide_server_t *s)
{
    tide__core *c = s->core;
    c->router = zmq_socket(c->zctx, ZMQ_ROUTER);
    if (c->router == NULL)
        return tide_errorf(TIDE_ERR_IO, "zmq_socket: %s", zmq_strerror(errno));
    int linger = 0, hwm = HWM;
    int64_t maxmsg = (int64_t)TIDE_PROTO_MAX_MSG_BYTES + 1024;
    zmq_setsockopt(c->router, ZMQ_LINGER, &linger, sizeof linger);
    zmq_setsockopt(c->router, ZMQ_SNDHWM, &hwm, sizeof hwm);
    zmq_setsockopt(c->router, ZMQ_RCVHWM, &hwm, sizeof hwm);
    zmq_setsockopt(c->router, ZMQ_MAXMSGSIZE, &maxmsg, sizeof maxmsg);
    int mandatory = 1; /* a full queue says EAGAIN instead of dropping: see outbox.c */
    zmq_setsockopt(c->router, ZMQ_ROUTER_MANDATORY, &mandatory, sizeof mandatory);
    c->ob.router = c->router;
    if (!s->auth_on)
        return TIDE_OK;
    int one = 1;
    zmq_setsockopt(c->router, ZMQ_ZAP_DOMAIN, "tide", 4);
    zmq_setsockopt(c->router, ZMQ_CURVE_SERVER, &one, sizeof one);
    if (zmq_setsockopt(c->router, ZMQ_CURVE_SECRETKEY, c->auth.server_secret, 41) != 0)
        return tide_errorf(TIDE_ERR_INVALID, "server.key in %s holds an invalid secret key: %s",
                           s->cfg.auth_dir, zmq_strerror(errno));
    return TIDE_OK;
}

tide_status tide__core_bind(tide_server_t *s)
{
    tide__core *c = s->core;
    const tide_server_config *cfg = &s->cfg;
    c->zctx = zmq_ctx_new();
    if (c->zctx == NULL)
        return tide_errorf(TIDE_ERR_IO, "zmq_ctx_new: %s", zmq_strerror(errno));
    if (cfg->auth_dir != NULL && cfg->auth_dir[0] != '\0')
        TIDE_CHECK(open_zap(s));
    TIDE_CHECK(open_router(s));
    if (zmq_bind(c->router, cfg->endpoint) != 0)
        return tide_errorf(TIDE_ERR_IO,
                           "cannot bind %s: %s (is another tided running? pick another --endpoint)",
                           cfg->endpoint, zmq_strerror(errno));
    /* before the endpoint file says where to connect: every connection is watched */
    TIDE_CHECK(tide__intake_new(&c->intake, c->zctx, c->router,
                                (uint64_t)(cfg->max_client_mb > 0 ? cfg->max_client_mb : 0) << 20));
    size_t eplen = sizeof c->endpoint;
    if (zmq_getsockopt(c->router, ZMQ_LAST_ENDPOINT, c->endpoint, &eplen) != 0)
        snprintf(c->endpoint, sizeof c->endpoint, "%s", cfg->endpoint);
    return TIDE_OK;
}

tide_status tide__core_announce(tide_server_t *s)
{
    const char *path = s->cfg.endpoint_file;
    if (path == NULL || path[0] == '\0')
        return TIDE_OK;
    return write_endpoint_file(path, s->core->endpoint);
}

const char *tide__core_endpoint(const tide_server_t *s)
{
    return s->core->endpoint;
}

void tide__core_destroy(tide_server_t *s)
{
    tide__core *c = s->core;
    if (c == NULL)
        return;
    tide__outbox_clear(&c->ob);
    tide__health_clear(&c->health);
    tide_free(c->peers);
    tide__intake_destroy(&c->intake);
    if (c->router)
        zmq_close(c->router);
    if (c->zap)
        zmq_close(c->zap);
    if (c->zctx)
        zmq_ctx_term(c->zctx);
    tide__auth_free(&c->auth);
    tide_store_close(&c->store);
    tide_free(c);
    s->core = NULL;
}

/* ---- the loop -------------------------------------------------------------------------------- */

/* Gathers: ZeroMQ signals the loop once per wakeup, not per message, so waiting a moment
 * after a pass lets a second's 10^4 heartbeats arrive in ~500 passes instead of 10^4
 * wakeups (context switches and eventfd writes dominated tided's CPU). */
static void gather(tide_server_t *s, uint64_t pass_ns, int full)
{
    uint64_t batch_ns = (uint64_t)(s->cfg.batch_ms > 0 ? s->cfg.batch_ms : 0) * 1000000ull;
    if (batch_ns == 0 || pass_ns == 0 || full || s->core->want_schedule)
        return;
    uint64_t now = tide_now_ns();
    if (now - pass_ns < batch_ns)
        tide_sleep_ms((batch_ns - (now - pass_ns) + 999999ull) / 1000000ull);
}

/* Fills the iteration's poll items: [0] the ROUTER socket, then ZAP (*zap_at, -1 without
 * it), then each source's; returns their count. */
static int poll_items(tide_server_t *s, zmq_pollitem_t *items, int *zap_at)
{
    tide__core *c = s->core;
    int n = 0;
    items[n++] = (zmq_pollitem_t){c->router, 0, ZMQ_POLLIN, 0};
    *zap_at = -1;
    if (c->zap) {
        *zap_at = n;
        items[n++] = (zmq_pollitem_t){c->zap, 0, ZMQ_POLLIN, 0};
    }
    c->intake_at = -1;
    if (tide__intake_socket(c->intake) != NULL) {
        c->intake_at = n;
        items[n++] = (zmq_pollitem_t){tide__intake_socket(c->intake), 0, ZMQ_POLLIN, 0};
    }
    for (int i = 0; i < c->n_sources; i++) {
        source *src = &c->sources[i];
        src->at = n;
        src->n = src->fill(s, items + n, POLL_ITEMS - n);
        n += src->n;
    }
    return n;
}

static long poll_timeout(const tide__core *c)
{
    uint64_t now = tide_now_ns();
    long timeout = c->next_tick_ns > now ? (long)((c->next_tick_ns - now) / 1000000ull) + 1 : 0;
    if (c->want_schedule)
        return 0;
    if (c->ob.n_backlog > 0 && timeout > 2)
        return 2; /* a client's full queue may have room again: see outbox.c */
    if (c->intake != NULL && timeout > 20)
        return 20; /* an unfinished message wakes nothing: its connection is checked anyway */
    return timeout;
}

/* Handles up to BATCH requests or PASS_MS of them; returns how many. Notes when the
 * ROUTER queue was seen empty (drained_ns). */
static int read_pass(tide_server_t *s, int readable)
{
    tide__core *c = s->core;
    int handled = 0;
    c->pass_no++;
    if (!readable) {
        c->drained_ns = s->now_ns;
        return 0;
    }
    uint64_t pass_end = s->now_ns + (uint64_t)PASS_MS * 1000000ull;
    for (;;) {
        uint64_t before = tide_now_ns();
        if (handled >= BATCH || c->fatal != TIDE_OK || before >= pass_end)
            break;
        if (!recv_one(s)) {
            c->drained_ns = before;
            break;
        }
        handled++;
    }
    return handled;
}

/* Runs the tick hooks when a tick is due (never while nothing can be saved). */
static void run_ticks(tide_server_t *s)
{
    tide__core *c = s->core;
    uint64_t every = tide__tick_ns(s);
    if (s->now_ns < c->next_tick_ns)
        return;
    c->tick_soon = 0;
    run_hooks(s, &c->tick);
    if (c->next_schedule_ns != 0 && s->now_ns >= c->next_schedule_ns)
        c->want_schedule = 1; /* a time given to tide__reschedule_at came */
    c->next_tick_ns = c->tick_soon ? s->now_ns : s->now_ns + every;
}

static void run_schedule(tide_server_t *s)
{
    tide__core *c = s->core;
    c->want_schedule = 0;
    c->next_schedule_ns = 0;
    run_hooks(s, &c->schedule);
}

tide_status tide__core_run(tide_server_t *s)
{
    tide__core *c = s->core;
    zmq_pollitem_t items[POLL_ITEMS];
    uint64_t pass_ns = 0; /* the last request's time in the previous pass that handled some */
    int full = 0;         /* it stopped at BATCH requests or PASS_MS: more are waiting */
    while (!s->stop && c->fatal == TIDE_OK) {
        gather(s, pass_ns, full);
        int zap_at = -1;
        int n = poll_items(s, items, &zap_at);
        int r = zmq_poll(items, n, poll_timeout(c));
        if (r < 0) {
            if (errno == EINTR)
                continue;
            return tide_errorf(TIDE_ERR_IO, "zmq_poll: %s", zmq_strerror(errno));
        }
        s->now_ns = tide_now_ns();
        if (zap_at >= 0 && (items[zap_at].revents & ZMQ_POLLIN))
            tide__auth_zap(c->zap, &c->auth, &s->st->counters.denied);
        if (c->intake_at >= 0 && (items[c->intake_at].revents & ZMQ_POLLIN))
            tide__intake_events(c->intake);
        int handled = read_pass(s, items[0].revents & ZMQ_POLLIN);
        full = handled > 0 && c->drained_ns < s->now_ns;
        pass_ns = handled > 0 ? s->now_ns : 0;
        s->now_ns = tide_now_ns();
        run_ticks(s);
        s->st->counters.clients_cut += tide__intake_check(c->intake, s->now_ns);
        if (c->want_schedule && c->fatal == TIDE_OK)
            run_schedule(s);
        finish_batch(s);
        for (int i = 0; i < c->n_sources; i++)
            c->sources[i].handle(s, items + c->sources[i].at, c->sources[i].n);
    }
    finish_batch(s);
    try_persist(s, 1); /* a last try: what a restart finds */
    if (c->health.degraded) {
        TIDE_ERROR("server", "stopped degraded: changes since the state file failed (%s) are "
                             "not on disk", c->health.why);
        return tide_errorf(TIDE_ERR_IO, "stopped with its state not persisted: %s",
                           c->health.why);
    }
    TIDE_INFO("server", "stopped");
    return TIDE_OK;
}
