/*
 * coordinator/loop: tided's core. One thread, one ZeroMQ ROUTER socket for workers and
 * tidectl, the ZAP socket for CURVE, and whatever other sources registered (metrics).
 * The core reads requests, checks their role, keeps one client from starving the others,
 * dispatches each by message type to the handler registered for it, runs the timers and
 * hooks, commits the batch's SQLite transaction and only then sends the batch's replies
 * and commands. It knows nothing of what a message means: handler modules (workers.c,
 * join.c, operators.c, resize.c, queries.c, reconf.c, recovery.c, checkpoint.c) do,
 * through the narrow interface below; server.c wires them together.
 *
 * A handler module calls only what this header declares to answer, to send, to record
 * an event and to persist: it never touches a socket, the outbox or the store's
 * transaction. Every call here is for the event-loop thread only and never blocks.
 */
#ifndef TIDE_COORD_LOOP_H
#define TIDE_COORD_LOOP_H

#include <signal.h>
#include <stddef.h>
#include <stdint.h>

#include <zmq.h>

#include "core/error.h"
#include "coordinator/auth.h"
#include "coordinator/server.h"
#include "coordinator/event_fields.h"
#include "coordinator/health.h"
#include "coordinator/state.h"
#include "coordinator/store.h"
#include "proto/proto.h"

/* The request being handled: who sent it and where its reply goes. */
typedef struct tide__request {
    unsigned char rid[TIDE_COORD_RID_MAX]; /* ZeroMQ routing id of the sender's connection */
    size_t rid_len;
    int delim;       /* its envelope has an empty delimiter frame */
    tide__role role; /* the sender key's role (ADMIN for every client without --auth) */
    char who[96];    /* "admin:alice" / "worker:pool3" / "a loopback client", for logs and
                        key ownership */
} tide__request;

typedef struct tide__core tide__core;       /* the core's own (loop_int.h): sockets, outbox,
                                               store, timers */
typedef struct tide__metrics tide__metrics; /* http.c's own: the HTTP listener */
typedef struct tide__alloc tide__alloc;     /* allocations.c's own: pools' allocations, the
                                               provider of nodes, pending leaves */

/* What the handler modules share. Fields are read and written on the loop thread only. */
struct tide_server {
    tide_server_config cfg;     /* settings; read-only after tide_server_new */
    tide_coord_state_t *st;     /* the cluster: handlers change it, then persist (tide__save_*) */
    int auth_on;                /* CURVE keys are checked: worker ids belong to keys */
    uint64_t now_ns;            /* monotonic ns: when the request was read (in hooks: the pass's
                                   time); handlers judge time by it */
    tide__request req;          /* the request being handled (meaningless in hooks) */
    volatile sig_atomic_t stop; /* tide_server_stop: the loop returns */
    tide__core *core;           /* the core's files only (loop*.c) */
    /* state each module keeps between requests; the module named writes it */
    struct {
        uint64_t bubble_ns; /* ns of pipeline bubbles workers reported (workers.c) */
        uint64_t filled_ns; /* ns of them offline task steps used, worker-measured (workers.c) */
        int wait;           /* a --bubbles plugin job waits for a worker with measured bubbles
                               (offline.c) */
    } bubbles;
    struct {
        uint64_t last_scan_ns;   /* when the failure scan last ran */
        uint64_t grace_until_ns; /* tided itself was stalled: no worker is failed before this */
        int scan_more;           /* the scan stopped at its outbox budget: scan again soon */
        uint64_t next_forget_ns; /* next retention pass over departed workers */
        size_t forget_at;        /* where that pass goes on in the worker table */
    } live;                      /* liveness.c */
    struct {
        uint64_t next_ns; /* next check of running jobs for stalled steps */
    } stall;              /* stall.c */
    struct {
        int depth;              /* tide__failures_begin minus end: > 0, failures wait */
        struct tide__lost *lost; /* the online jobs' workers failed meanwhile */
        size_t n, cap;
    } burst;                    /* recovery.c */
    struct {
        uint64_t last_pass_ns; /* when the policy last ran */
        char failed[160];      /* why its last run failed ("": it did not), told once */
    } elastic;                 /* elastic_tided.c */
    struct tide__ckreqs *ckreqs; /* checkpoint.c: operators' requests being agreed; NULL: none yet */
    tide__metrics *metrics;      /* http.c; NULL without --metrics */
    tide__alloc *alloc;          /* allocations.c */
};

/* ---- registration (server.c, before the loop runs) --------------------------------------- */

/* A message handler: m is decoded and its sender's role already allowed; raw/len are the
 * encoded message (borrowed for the call). Replies through tide__reply*. */
typedef void (*tide__msg_fn)(tide_server_t *s, const tide_msg_t *m, const void *raw, size_t len);

/* A hook: runs on the loop thread between requests (s->req is meaningless there). */
typedef void (*tide__hook_fn)(tide_server_t *s);

/* Extra poll sources (metrics): fill returns how many of items[0..max) it filled; handle
 * gets them back with their revents after the batch was sent. */
typedef int (*tide__poll_fill_fn)(tide_server_t *s, zmq_pollitem_t *items, int max);
typedef void (*tide__poll_handle_fn)(tide_server_t *s, const zmq_pollitem_t *items, int n);

enum {
    TIDE__H_READONLY = 1, /* an operator's read: served while the state file cannot be written
                             (an operator's request without it is a change, then refused) */
    TIDE__H_BEAT = 2,     /* counted as a heartbeat message, not as a request */
};

/* Routes messages of `type` to fn (flags: TIDE__H_*). One handler per type; a type nobody
 * registered is answered "unexpected message". */
void tide__on_message(tide_server_t *s, tide_msg_type_t type, tide__msg_fn fn, unsigned flags);

/* Runs fn every tick (a quarter heartbeat period, at least 20 ms), in registration order,
 * also while the state file cannot be written (decisions then live in memory). */
void tide__on_tick(tide_server_t *s, tide__hook_fn fn);

/* Runs fn in the scheduling pass: after a batch in which a handler called tide__reschedule
 * (or a time given to tide__reschedule_at came), in registration order, before the commit. */
void tide__on_schedule(tide_server_t *s, tide__hook_fn fn);

/* Runs fn after the state was loaded from the state file at start, in registration order. */
void tide__on_load(tide_server_t *s, tide__hook_fn fn);

/* Polls the source's items next to the ROUTER socket. */
void tide__on_poll(tide_server_t *s, tide__poll_fill_fn fill, tide__poll_handle_fn handle);

/* ---- answering and sending ------------------------------------------------------------------- */

/* Queues msg as the reply to the request being handled (sent after the batch commits). */
void tide__reply(tide_server_t *s, const tide_msg_t *msg);

/* Queues msg as the answer to an earlier request, whose sender *to was copied from s->req
 * when it was handled (dropped when that connection is gone). */
void tide__reply_to(tide_server_t *s, const tide__request *to, const tide_msg_t *msg);

/* Queues an error reply {code, message} for the request being handled; returns code. */
tide_status tide__reply_error(tide_server_t *s, tide_status code, const char *fmt, ...)
    TIDE_PRINTF(3, 4);

/* Queues an ok reply naming job ("" for none) with a message. */
void tide__reply_ok(tide_server_t *s, const char *job, const char *fmt, ...) TIDE_PRINTF(3, 4);

/* tide__reply_ok naming the generation of the switch the request started (tidectl --wait
 * follows it to its commit or abort). */
void tide__reply_ok_gen(tide_server_t *s, const char *job, uint64_t gen, const char *fmt, ...)
    TIDE_PRINTF(4, 5);

/* Queues msg for worker w's current connection (dropped when it has none: senders
 * retransmit). */
void tide__send_worker(tide_server_t *s, const tide_coord_worker_t *w, const tide_msg_t *msg);

/* ---- events and persistence (the batch's transaction; a failure is the batch's) -------------- */

/* Appends an event (job "" for none) to the state file's history. */
void tide__event(tide_server_t *s, const char *job, const char *kind, const char *fmt, ...)
    TIDE_PRINTF(4, 5);

/* tide__event with typed fields (borrowed; NULL: none) besides the sentence. */
void tide__event_f(tide_server_t *s, const char *job, const char *kind,
                   const tide_proto_event_fields_t *f, const char *fmt, ...) TIDE_PRINTF(5, 6);

/* Saves w's durable fields. */
void tide__save_worker(tide_server_t *s, const tide_coord_worker_t *w);

/* Saves j's durable fields. */
void tide__save_job(tide_server_t *s, const tide_coord_job_t *j);

/* Records the report of an offline attempt (a is copied). */
void tide__save_attempt(tide_server_t *s, const tide_store_attempt_t *a);

/* Deletes the row of worker id, which was just removed from the state. */
void tide__save_worker_removed(tide_server_t *s, int32_t id);

/* Saves pool's scheduler allocation a (allocs.h). */
void tide__save_alloc(tide_server_t *s, const char *pool, const tide_proto_alloc_t *a);

/* Deletes pool's allocation row. */
void tide__save_alloc_removed(tide_server_t *s, const char *pool);

/* The state file, for reads only (events, attempt logs): changes go through tide__save_*. */
tide_store_t *tide__store(tide_server_t *s);

/* Whether the state file takes writes (degraded, why, since) and the writes it holds. */
const tide__health *tide__health_of(const tide_server_t *s);

/* ---- timers and passes ----------------------------------------------------------------------- */

/* Asks for a scheduling pass after this batch (idle workers or queued work changed). */
void tide__reschedule(tide_server_t *s);

/* Asks for a scheduling pass at monotonic time at_ns (the earliest asked wins; 0: none). */
void tide__reschedule_at(tide_server_t *s, uint64_t at_ns);

/* Runs the next tick right after this pass's messages went out, not a period later. */
void tide__tick_soon(tide_server_t *s);

/* ns between ticks. */
uint64_t tide__tick_ns(const tide_server_t *s);

/* Monotonic ns when the ROUTER queue was last seen empty: every message sent before it
 * has been read, so liveness is judged at this time. */
uint64_t tide__drained_ns(const tide_server_t *s);

/* Encoded bytes queued in this batch and not yet sent. */
size_t tide__outbox_bytes(const tide_server_t *s);

/* The core's own counters, for metrics. */
typedef struct tide__loop_stats {
    uint64_t refused_busy; /* requests refused because their client used its pass budget */
    uint64_t dropped_out;  /* messages dropped: peer gone, or its queue and backlog full */
    size_t n_backlog;      /* clients whose replies wait in tided's backlog */
} tide__loop_stats;

void tide__loop_stats_get(const tide_server_t *s, tide__loop_stats *out);

/* ---- lifecycle (server.c) -------------------------------------------------------------------- */

/* Allocates the core (s->core); nothing is opened yet. */
tide_status tide__core_new(tide_server_t *s);

/* Opens the state file, loads the state into s->st and runs the load hooks. */
tide_status tide__core_load(tide_server_t *s);

/* Loads the keys (auth_dir), binds the ROUTER socket. */
tide_status tide__core_bind(tide_server_t *s);

/* Writes the endpoint file (cfg.endpoint_file, when set): called once every listener is
   open, since scripts and tests take the file as "tided serves". Startup thread. */
tide_status tide__core_announce(tide_server_t *s);

/* The endpoint bound (port resolved); valid as long as s. */
const char *tide__core_endpoint(const tide_server_t *s);

/* Runs the loop until s->stop or a state file failure it cannot survive. */
tide_status tide__core_run(tide_server_t *s);

/* Closes sockets and the state file and frees the core; NULL s->core is fine. */
void tide__core_destroy(tide_server_t *s);

#endif /* TIDE_COORD_LOOP_H */
