/*
 * coordinator/outbox: a batch's messages, held until its commit, and the backlogs of
 * clients whose ZeroMQ queue is full (see outbox.h). A client's queue holds the loop's
 * HWM messages; past that, ROUTER_MANDATORY makes ZeroMQ say so instead of dropping, and
 * the rest wait here for that client, bounded in bytes, so a burst of replies to a client
 * that pipelines requests is delivered and one that never reads costs a bounded amount.
 */
#include <errno.h>
#include <string.h>

#include <zmq.h>

#include "core/alloc.h"
#include "core/error.h"
#include "core/log.h"
#include "coordinator/outbox.h"

void tide__outbox_init(tide__outbox *ob)
{
    memset(ob, 0, sizeof *ob);
    tide_proto_buf_init(&ob->buf);
}

void tide__outbox_clear(tide__outbox *ob)
{
    tide__outbox_drop(ob);
    tide_free(ob->out);
    tide_proto_buf_destroy(&ob->buf);
    memset(ob, 0, sizeof *ob);
}

void tide__outbox_push(tide__outbox *ob, const unsigned char *rid, size_t rid_len, int delim,
                       int reply, const tide_msg_t *msg)
{
    if (rid_len == 0)
        return; /* never connected since tided started: the retransmit timer covers it */
    tide_status rc = tide_proto_encode(msg, &ob->buf);
    if (rc != TIDE_OK) {
        TIDE_ERROR("server", "cannot encode '%s': %s", tide_msg_type_name(msg->type),
                   tide_last_error());
        return;
    }
    if (ob->n_out == ob->cap_out) {
        size_t cap = ob->cap_out ? ob->cap_out * 2 : 256;
        tide__out *o = tide_reallocarray(ob->out, cap, sizeof *o);
        if (o == NULL) {
            TIDE_ERROR("server", "out of memory queueing a '%s'", tide_msg_type_name(msg->type));
            return;
        }
        ob->out = o;
        ob->cap_out = cap;
    }
    tide__out *o = &ob->out[ob->n_out++];
    memcpy(o->rid, rid, rid_len);
    o->rid_len = rid_len;
    o->delim = delim;
    o->reply = reply;
    o->data = tide_proto_buf_release(&ob->buf, &o->len);
    ob->bytes += o->len;
}

/* Sends o's frames; 0, or the errno of the first frame (EAGAIN: its queue is full). */
static int send_frames(tide__outbox *ob, const tide__out *o)
{
    if (zmq_send(ob->router, o->rid, o->rid_len, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0)
        return errno;
    /* the later frames of a message whose first frame went in cannot be refused */
    if (o->delim)
        zmq_send(ob->router, "", 0, ZMQ_SNDMORE | ZMQ_DONTWAIT);
    zmq_send(ob->router, o->data, o->len, ZMQ_DONTWAIT);
    return 0;
}

static tide__backlog *backlog_find(tide__outbox *ob, const unsigned char *rid, size_t rid_len)
{
    for (size_t i = 0; i < ob->n_backlog; i++)
        if (ob->backlog[i].rid_len == rid_len && memcmp(ob->backlog[i].rid, rid, rid_len) == 0)
            return &ob->backlog[i];
    return NULL;
}

/* Frees what b holds and removes it from the table. */
static void backlog_remove(tide__outbox *ob, tide__backlog *b)
{
    for (size_t i = b->head; i < b->n; i++) {
        tide_free(b->msgs[i].data);
        ob->dropped++;
    }
    tide_free(b->msgs);
    *b = ob->backlog[--ob->n_backlog];
}

/* Takes o (and its data) into b, or drops it when b is full; NULL b drops it too. */
static void backlog_push(tide__outbox *ob, tide__backlog *b, tide__out *o)
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
    ob->dropped++;
}

/* Sends what waits in backlogs, oldest first, until a client's queue is full again. */
static void drain_backlogs(tide__outbox *ob)
{
    for (size_t i = 0; i < ob->n_backlog;) {
        tide__backlog *b = &ob->backlog[i];
        int r = 0;
        while (b->head < b->n && (r = send_frames(ob, &b->msgs[b->head])) == 0) {
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
        backlog_remove(ob, b); /* drained, or the client is gone */
    }
}

void tide__outbox_flush(tide__outbox *ob)
{
    drain_backlogs(ob);
    for (size_t i = 0; i < ob->n_out; i++) {
        tide__out *o = &ob->out[i];
        tide__backlog *b = backlog_find(ob, o->rid, o->rid_len);
        if (b == NULL) {
            int r = send_frames(ob, o);
            if (r == 0) {
                tide_free(o->data);
                continue;
            }
            if (r != EAGAIN) { /* the client is gone: senders retransmit */
                tide_free(o->data);
                ob->dropped++;
                continue;
            }
            if (ob->n_backlog < TIDE__BACKLOG_PEERS) {
                b = &ob->backlog[ob->n_backlog++];
                memset(b, 0, sizeof *b);
                memcpy(b->rid, o->rid, o->rid_len);
                b->rid_len = o->rid_len;
            }
        }
        backlog_push(ob, b, o);
    }
    ob->n_out = 0;
    ob->bytes = 0;
}

void tide__outbox_drop(tide__outbox *ob)
{
    for (size_t i = 0; i < ob->n_out; i++)
        tide_free(ob->out[i].data);
    ob->n_out = 0;
    ob->bytes = 0;
    while (ob->n_backlog > 0)
        backlog_remove(ob, &ob->backlog[0]);
}

void tide__outbox_replies_to(tide__outbox *ob, const tide_msg_t *err)
{
    size_t n = ob->n_out, k = 0;
    ob->bytes = 0;
    for (size_t i = 0; i < n; i++) {
        tide__out o = ob->out[i];
        tide_free(o.data);
        if (!o.reply)
            continue; /* commands of a change that did not happen */
        if (tide_proto_encode(err, &ob->buf) != TIDE_OK)
            continue;
        o.data = tide_proto_buf_release(&ob->buf, &o.len);
        ob->bytes += o.len;
        ob->out[k++] = o;
    }
    ob->n_out = k;
}

void tide__outbox_refuse_changes(tide__outbox *ob, const tide_msg_t *err)
{
    for (size_t i = 0; i < ob->n_out; i++) {
        tide__out *o = &ob->out[i];
        if (o->reply != TIDE__OUT_CHANGE || tide_proto_encode(err, &ob->buf) != TIDE_OK)
            continue;
        ob->bytes -= o->len;
        tide_free(o->data);
        o->data = tide_proto_buf_release(&ob->buf, &o->len);
        ob->bytes += o->len;
    }
}
