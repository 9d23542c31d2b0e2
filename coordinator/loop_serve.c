/*
 * coordinator/loop_serve: the core's request path (see loop_int.h). The loop's read pass
 * calls tide__core_recv_one: a request's frames are read and stamped, its sender and role
 * identified, its client's budget of the pass charged, and it is dispatched to the handler
 * registered for its type. Handler modules call the rest (loop.h): the replies and commands
 * they queue for the batch. Event-loop thread only.
 *
 * No client can starve the others: ZeroMQ reads connections round-robin, and a client
 * whose operator requests used PEER_PASS_MS of handler time in a pass gets its further
 * ones in that pass refused (TIDE_ERR_BUSY, cheap) instead of served, and so does one
 * whose replies queued PEER_PASS_BYTES in that pass. Per-connection queues are bounded
 * (HWM messages each way), so a client that never reads its replies costs tided a bounded
 * amount of memory.
 *
 * Envelope: DEALER clients send [payload] (ROUTER sees [id][payload]); REQ-style
 * clients may add an empty delimiter ([id][][payload]); replies mirror it.
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "core/clock.h"
#include "core/error.h"
#include "core/log.h"
#include "coordinator/intake.h"
#include "coordinator/loop_int.h"
#include "coordinator/outbox.h"

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

int tide__core_recv_one(tide_server_t *s)
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
