/*
 * coordinator/outbox: the messages a batch of tided's loop queues (replies and commands),
 * held until the batch's transaction commits, then sent over the ROUTER socket; and the
 * per-client backlogs that hold what a client's full ZeroMQ queue cannot take yet. Part
 * of the core (loop.c, loop_serve.c and loop_persist.c are its only users). Event-loop
 * thread only.
 */
#ifndef TIDE_COORD_OUTBOX_H
#define TIDE_COORD_OUTBOX_H

#include <stddef.h>
#include <stdint.h>

#include "coordinator/state.h"
#include "proto/proto.h"

#define TIDE__BACKLOG_PEERS 64         /* clients whose full queues tided holds messages for */
#define TIDE__BACKLOG_BYTES (4u << 20) /* bytes held for one such client */

/* What an outbox entry is. */
enum {
    TIDE__OUT_COMMAND = 0, /* a command tided sends on its own */
    TIDE__OUT_REPLY = 1,   /* the answer to a request */
    TIDE__OUT_CHANGE = 2,  /* the answer to an operator's change (acknowledged once on disk) */
};

/* A reply or command waiting for the batch's commit. */
typedef struct tide__out {
    unsigned char rid[TIDE_COORD_RID_MAX];
    size_t rid_len;
    int delim;
    int reply;     /* TIDE__OUT_*: the answer to a request, or a command tided sends */
    uint8_t *data; /* encoded message (tide_malloc) */
    size_t len;
} tide__out;

/* Messages for one client whose ZeroMQ queue was full, kept in order (and within
 * TIDE__BACKLOG_BYTES) until it drains; what does not fit is dropped, as a vanished peer's. */
typedef struct tide__backlog {
    unsigned char rid[TIDE_COORD_RID_MAX];
    size_t rid_len;
    tide__out *msgs; /* msgs[head..n) wait, oldest first */
    size_t head, n, cap;
    size_t bytes; /* encoded bytes waiting */
} tide__backlog;

typedef struct tide__outbox {
    void *router; /* the ROUTER socket (ROUTER_MANDATORY set), borrowed; NULL before the bind */
    tide_proto_buf_t buf;
    tide__out *out;
    size_t n_out, cap_out;
    size_t bytes; /* encoded bytes in out[] (the batch's messages not yet sent) */
    tide__backlog backlog[TIDE__BACKLOG_PEERS]; /* backlog[0..n_backlog) are in use */
    size_t n_backlog;
    uint64_t dropped; /* messages dropped: peer gone, or its queue and backlog full */
} tide__outbox;

/* Readies caller-owned storage (nothing queued). */
void tide__outbox_init(tide__outbox *o);

/* Drops what is queued and frees o's storage. */
void tide__outbox_clear(tide__outbox *o);

/* Encodes msg and queues it for the connection rid (reply: the answer to a request). A
 * message for a connection never seen (rid_len 0) is not queued: its retransmit covers it. */
void tide__outbox_push(tide__outbox *o, const unsigned char *rid, size_t rid_len, int delim,
                       int reply, const tide_msg_t *msg);

/* Sends what waits in backlogs, then the batch's messages; what a full queue refuses goes
 * to that client's backlog. Never blocks. */
void tide__outbox_flush(tide__outbox *o);

/* Drops the batch's messages and every backlog (a batch whose change was not saved). */
void tide__outbox_drop(tide__outbox *o);

/* Replaces the batch's replies by err and drops its commands (they belong to a change that
 * did not happen). */
void tide__outbox_replies_to(tide__outbox *o, const tide_msg_t *err);

/* Replaces the batch's answers to operators' changes (TIDE__OUT_CHANGE) by err; replies to
 * workers and commands stay (the batch's decisions hold in memory). */
void tide__outbox_refuse_changes(tide__outbox *o, const tide_msg_t *err);

#endif /* TIDE_COORD_OUTBOX_H */
