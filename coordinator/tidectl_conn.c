/*
 * tidectl's connection to tided: one ZeroMQ DEALER socket (CURVE when --key is given),
 * one request and one reply at a time. A socket monitor tells "never connected" (exit 3)
 * from "connected, no answer" (4) and sees a rejected CURVE handshake (1) instead of
 * waiting out the timeout.
 */
#include <errno.h>
#include <string.h>
#include <zmq.h>

#include "coordinator/tidectl_int.h"
#include "core/alloc.h"
#include "core/clock.h"

/* ---- connection ------------------------------------------------------------------------------ */

void tidectl__conn_close(conn_t *c)
{
    if (c->mon)
        zmq_close(c->mon);
    if (c->sock)
        zmq_close(c->sock);
    if (c->ctx)
        zmq_ctx_term(c->ctx);
    memset(c, 0, sizeof *c);
}

/* Opens the DEALER socket; returns an exit code (0 or USAGE with a message on err). */
int tidectl__conn_open(conn_t *c, const settings_t *s, FILE *err)
{
    memset(c, 0, sizeof *c);
    c->endpoint = s->endpoint;
    c->timeout_ms = (int)s->timeout_ms;
    char pub[41], secret[41], server[41];
    if ((s->key != NULL) != (s->server_key != NULL)) {
        fprintf(err, "tidectl: CURVE needs both --key (your key pair file) and --server-key "
                     "(tided's server.pub), or neither\n");
        return TIDECTL_EXIT_USAGE;
    }
    if (s->key) {
        if (tidectl_read_key(s->key, pub, secret) != TIDE_OK ||
            tidectl_read_key(s->server_key, server, NULL) != TIDE_OK) {
            fprintf(err, "tidectl: %s\n", tide_last_error());
            return TIDECTL_EXIT_USAGE;
        }
        c->curve = 1;
    }
    c->ctx = zmq_ctx_new();
    c->sock = c->ctx ? zmq_socket(c->ctx, ZMQ_DEALER) : NULL;
    if (c->sock == NULL) {
        fprintf(err, "tidectl: cannot create a ZeroMQ socket: %s\n", zmq_strerror(zmq_errno()));
        tidectl__conn_close(c);
        return TIDECTL_EXIT_LOCAL;
    }
    int zero = 0;
    zmq_setsockopt(c->sock, ZMQ_LINGER, &zero, sizeof zero);
    if (c->curve) {
        if (zmq_setsockopt(c->sock, ZMQ_CURVE_SERVERKEY, server, 41) != 0 ||
            zmq_setsockopt(c->sock, ZMQ_CURVE_PUBLICKEY, pub, 41) != 0 ||
            zmq_setsockopt(c->sock, ZMQ_CURVE_SECRETKEY, secret, 41) != 0) {
            fprintf(err, "tidectl: cannot use the CURVE keys: %s\n", zmq_strerror(zmq_errno()));
            tidectl__conn_close(c);
            return TIDECTL_EXIT_USAGE;
        }
    }
    char mon_ep[64];
    snprintf(mon_ep, sizeof mon_ep, "inproc://tidectl-monitor-%p", (void *)c);
    if (zmq_socket_monitor(
            c->sock, mon_ep,
            ZMQ_EVENT_CONNECTED | ZMQ_EVENT_CONNECT_RETRIED | ZMQ_EVENT_DISCONNECTED |
                ZMQ_EVENT_HANDSHAKE_SUCCEEDED | ZMQ_EVENT_HANDSHAKE_FAILED_AUTH |
                ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL | ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL) == 0) {
        c->mon = zmq_socket(c->ctx, ZMQ_PAIR);
        if (c->mon && zmq_connect(c->mon, mon_ep) != 0) {
            zmq_close(c->mon);
            c->mon = NULL;
        }
    }
    if (zmq_connect(c->sock, s->endpoint) != 0) {
        fprintf(err,
                "tidectl: --endpoint '%s': %s (expected a ZeroMQ endpoint such as "
                "tcp://127.0.0.1:5555)\n",
                s->endpoint, zmq_strerror(zmq_errno()));
        tidectl__conn_close(c);
        return TIDECTL_EXIT_USAGE;
    }
    return TIDECTL_EXIT_OK;
}

/* Drains the monitor socket, updating what is known about the connection. */
static void conn_events(conn_t *c)
{
    while (c->mon) {
        zmq_msg_t f1, f2;
        zmq_msg_init(&f1);
        if (zmq_msg_recv(&f1, c->mon, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&f1);
            return;
        }
        uint16_t ev = 0;
        if (zmq_msg_size(&f1) >= 2)
            memcpy(&ev, zmq_msg_data(&f1), sizeof ev);
        zmq_msg_close(&f1);
        zmq_msg_init(&f2);
        if (zmq_msg_recv(&f2, c->mon, 0) >= 0) /* the endpoint frame */
            zmq_msg_close(&f2);
        switch (ev) {
        case ZMQ_EVENT_CONNECTED:
            c->connected = 1;
            break;
        case ZMQ_EVENT_CONNECT_RETRIED:
            c->refused = 1;
            break;
        case ZMQ_EVENT_HANDSHAKE_FAILED_AUTH:
        case ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL:
        case ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL:
            c->handshake_failed = 1;
            c->handshake_event = ev;
            break;
        default:
            break;
        }
    }
}

static int handshake_exit(const conn_t *c, FILE *err)
{
    if (c->curve)
        fprintf(err,
                "tidectl: refused by tided at %s: the CURVE handshake failed (%s). Is your "
                "key's .pub file in tided's --auth directory, and is --server-key tided's "
                "server.pub?\n",
                c->endpoint,
                c->handshake_event == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH ? "key not allowed"
                                                                      : "protocol error");
    else
        fprintf(err,
                "tidectl: refused by tided at %s: the handshake failed. tided probably "
                "requires CURVE: pass --key NAME.key and --server-key server.pub (see "
                "tidectl keygen --help)\n",
                c->endpoint);
    return TIDECTL_EXIT_REFUSED;
}

/* The deadline passed: says whether tided was never reached (3) or did not answer (4). */
static int deadline_exit(const conn_t *c, FILE *err)
{
    if (c->connected) {
        fprintf(err,
                "tidectl: timed out after %d ms waiting for tided at %s: it accepted the "
                "connection but did not answer (busy or stuck? check its log, or raise "
                "--timeout-ms)\n",
                c->timeout_ms, c->endpoint);
        return TIDECTL_EXIT_TIMEOUT;
    }
    fprintf(err,
            "tidectl: cannot reach tided at %s (%s within %d ms): is tided running? check "
            "--endpoint or TIDE_ENDPOINT\n",
            c->endpoint, c->refused ? "connection refused" : "no connection", c->timeout_ms);
    return TIDECTL_EXIT_UNREACHABLE;
}

/*
 * Queues [empty delimiter][payload], the REQ-compatible envelope tided mirrors back. A
 * DEALER whose handshake already failed has no pipe and refuses the frame (EAGAIN): that
 * happens when the I/O thread runs the whole handshake before this thread sends, so it
 * waits for the monitor's verdict or a pipe, until the deadline, instead of failing.
 */
static int conn_send(conn_t *c, const tide_proto_buf_t *b, uint64_t deadline, FILE *err)
{
    for (;;) {
        if (zmq_send(c->sock, "", 0, ZMQ_SNDMORE | ZMQ_DONTWAIT) >= 0) {
            if (zmq_send(c->sock, b->data, b->len, ZMQ_DONTWAIT) >= 0)
                return TIDECTL_EXIT_OK;
            break;
        }
        if (zmq_errno() != EAGAIN)
            break;
        conn_events(c);
        if (c->handshake_failed)
            return handshake_exit(c, err);
        uint64_t now = tide_now_ns();
        if (now >= deadline)
            return deadline_exit(c, err);
        zmq_pollitem_t items[2] = {{c->sock, 0, ZMQ_POLLOUT, 0}, {c->mon, 0, ZMQ_POLLIN, 0}};
        long wait_ms = (long)((deadline - now + 999999) / 1000000);
        if (zmq_poll(items, c->mon ? 2 : 1, wait_ms) < 0 && zmq_errno() != EINTR)
            break;
    }
    fprintf(err, "tidectl: cannot queue the request: %s\n", zmq_strerror(zmq_errno()));
    return TIDECTL_EXIT_UNREACHABLE;
}

/*
 * Sends req and waits for one reply into *rep (owned by the caller afterwards). Returns
 * 0 with any decoded reply (the caller checks for "error"), else an exit code with the
 * reason printed on err.
 */
int tidectl__conn_call(conn_t *c, const tide_msg_t *req, tide_msg_t *rep, FILE *err)
{
    tide_msg_init(rep, TIDE_MSG_NONE);
    tide_proto_buf_t b;
    tide_proto_buf_init(&b);
    if (tide_proto_encode(req, &b) != TIDE_OK) {
        fprintf(err, "tidectl: %s\n", tide_last_error());
        tide_proto_buf_destroy(&b);
        return TIDECTL_EXIT_USAGE;
    }
    uint64_t deadline = tide_now_ns() + (uint64_t)c->timeout_ms * 1000000ull;
    int src = conn_send(c, &b, deadline, err);
    tide_proto_buf_destroy(&b);
    if (src != TIDECTL_EXIT_OK)
        return src;
    for (;;) {
        conn_events(c);
        if (c->handshake_failed)
            return handshake_exit(c, err);
        uint64_t now = tide_now_ns();
        if (now >= deadline)
            break;
        zmq_pollitem_t items[2] = {{c->sock, 0, ZMQ_POLLIN, 0}, {c->mon, 0, ZMQ_POLLIN, 0}};
        long wait_ms = (long)((deadline - now + 999999) / 1000000);
        int rc = zmq_poll(items, c->mon ? 2 : 1, wait_ms);
        if (rc < 0 && zmq_errno() != EINTR) {
            fprintf(err, "tidectl: polling the socket failed: %s\n", zmq_strerror(zmq_errno()));
            return TIDECTL_EXIT_UNREACHABLE;
        }
        if (rc <= 0 || !(items[0].revents & ZMQ_POLLIN))
            continue;
        /* read every frame; the payload is the last one */
        zmq_msg_t last;
        zmq_msg_init(&last);
        int more = 1;
        while (more) {
            zmq_msg_close(&last);
            zmq_msg_init(&last);
            if (zmq_msg_recv(&last, c->sock, 0) < 0)
                break;
            more = zmq_msg_more(&last);
        }
        tide_status drc = tide_proto_decode(zmq_msg_data(&last), zmq_msg_size(&last), rep);
        zmq_msg_close(&last);
        if (drc != TIDE_OK) {
            fprintf(err,
                    "tidectl: tided at %s sent a reply this tidectl cannot read (%s): are "
                    "tidectl and tided the same version?\n",
                    c->endpoint, tide_last_error());
            return TIDECTL_EXIT_REFUSED;
        }
        return TIDECTL_EXIT_OK;
    }
    return deadline_exit(c, err);
}

/* One request, one reply: prints tided's error (exit 1) or hands the reply over. */
int tidectl__call_once(settings_t *s, const tide_msg_t *req, tide_msg_t *rep, tide_msg_type_t want,
                       FILE *err)
{
    conn_t c;
    int rc = tidectl__conn_open(&c, s, err);
    if (rc != TIDECTL_EXIT_OK)
        return rc;
    rc = tidectl__conn_call(&c, req, rep, err);
    tidectl__conn_close(&c);
    if (rc != TIDECTL_EXIT_OK)
        return rc;
    if (rep->type == TIDE_MSG_ERROR) {
        char msg[TIDE_PROTO_TEXT_MAX + 2];
        fprintf(err, "tidectl: tided refused %s: %s (%s)\n", tide_msg_type_name(req->type),
                tidectl__term_str(rep->u.error.message, sizeof msg - 1, msg, sizeof msg),
                tide_status_name((tide_status)rep->u.error.code));
        tide_msg_clear(rep);
        return TIDECTL_EXIT_REFUSED;
    }
    if (rep->type != want) {
        fprintf(err, "tidectl: tided answered %s with '%s', expected '%s'\n",
                tide_msg_type_name(req->type), tide_msg_type_name(rep->type),
                tide_msg_type_name(want));
        tide_msg_clear(rep);
        return TIDECTL_EXIT_REFUSED;
    }
    return TIDECTL_EXIT_OK;
}

/*
 * The whole worker table (all: with the workers that left; job: only that job's workers,
 * NULL or "" for every worker) into *out, one status page
 * after another as tided cuts them (a STATUS_REPLY holding every row; the caller clears
 * it). The pages follow tided's `next` cursor, which only grows, so this ends; a worker
 * that registers or goes meanwhile may be missed or seen, never doubled.
 */
int tidectl__fetch_status(conn_t *c, int all, const char *job, tide_msg_t *out, FILE *err)
{
    tide_msg_init(out, TIDE_MSG_STATUS_REPLY);
    tide_proto_status_reply_t *acc = &out->u.status_reply;
    size_t cap = 0;
    int32_t from = 0;
    for (;;) {
        tide_msg_t req, rep;
        tide_msg_init(&req, TIDE_MSG_STATUS);
        req.u.status.from = from;
        req.u.status.all = all;
        snprintf(req.u.status.job, sizeof req.u.status.job, "%s", job ? job : "");
        int rc = tidectl__conn_call(c, &req, &rep, err);
        if (rc == TIDECTL_EXIT_OK && rep.type != TIDE_MSG_STATUS_REPLY) {
            char msg[TIDE_PROTO_TEXT_MAX + 2];
            if (rep.type == TIDE_MSG_ERROR)
                fprintf(err, "tidectl: tided refused status: %s (%s)\n",
                        tidectl__term_str(rep.u.error.message, sizeof msg - 1, msg, sizeof msg),
                        tide_status_name((tide_status)rep.u.error.code));
            else
                fprintf(err, "tidectl: tided answered status with '%s'\n",
                        tide_msg_type_name(rep.type));
            tide_msg_clear(&rep);
            rc = TIDECTL_EXIT_REFUSED;
        }
        if (rc != TIDECTL_EXIT_OK) {
            tide_msg_clear(out);
            return rc;
        }
        const tide_proto_status_reply_t *pg = &rep.u.status_reply;
        if (acc->n_rows + (size_t)pg->n_rows > cap) {
            size_t ncap = cap ? cap : 256;
            while (ncap < acc->n_rows + (size_t)pg->n_rows)
                ncap *= 2;
            tide_proto_gpu_row_t *r = tide_reallocarray(acc->rows, ncap, sizeof *r);
            if (r == NULL) {
                fprintf(err, "tidectl: out of memory listing %zu workers\n",
                        acc->n_rows + (size_t)pg->n_rows);
                tide_msg_clear(&rep);
                tide_msg_clear(out);
                return TIDECTL_EXIT_LOCAL;
            }
            acc->rows = r;
            cap = ncap;
        }
        if (pg->n_rows > 0)
            memcpy(acc->rows + acc->n_rows, pg->rows, pg->n_rows * sizeof *pg->rows);
        acc->n_rows += pg->n_rows;
        acc->time_ms = pg->time_ms;
        acc->total = pg->total;
        memcpy(acc->ompi_server, pg->ompi_server, sizeof acc->ompi_server);
        acc->state_degraded_ms = pg->state_degraded_ms;
        int32_t next = pg->next;
        tide_msg_clear(&rep);
        if (next < 0)
            break;
        if (next <= from) { /* proto checks next > every row; a page always moves on */
            fprintf(err, "tidectl: tided's status page did not move on (next %d after %d)\n", next,
                    from);
            tide_msg_clear(out);
            return TIDECTL_EXIT_REFUSED;
        }
        from = next;
    }
    acc->next = -1;
    return TIDECTL_EXIT_OK;
}
