/*
 * coordinator/loop internals shared by the core's own files only: loop.c (registration,
 * timers, the loop itself), loop_serve.c (a request read, checked, budgeted and dispatched;
 * the replies), loop_persist.c (the batch's writes, its commit, the degraded mode) and
 * loop_bind.c (the sockets and the endpoint file). Handler modules include loop.h, never
 * this. Everything here is for the event-loop thread (loop_bind.c: the startup thread,
 * before the loop runs).
 */
#ifndef TIDE_COORD_LOOP_INT_H
#define TIDE_COORD_LOOP_INT_H

#include <stddef.h>
#include <stdint.h>

#include "coordinator/intake.h"
#include "coordinator/loop.h"
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
    tide_status fatal;  /* a store failure of the batch: it ends degraded (loop_persist.c) */
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

/* Receives and handles one request; 0 when none was waiting. Its frames are read and
 * closed here; it never waits on the socket (ZeroMQ hands a message over whole). Called by
 * the loop's read pass (loop_serve.c). */
int tide__core_recv_one(tide_server_t *s);

/* Commits the batch, then sends its replies; a failed commit leaves tided degraded. Called
 * by the loop at each pass's end and once when it stops; blocks while the state file
 * commits (loop_persist.c). */
void tide__core_finish_batch(tide_server_t *s);

/* While degraded, once per TIDE__RETRY_NS (or now when force): writes the in-memory truth
 * back in one transaction; healthy again when it commits. Blocks while it writes
 * (loop_persist.c). */
void tide__core_try_persist(tide_server_t *s, int force);

#endif /* TIDE_COORD_LOOP_INT_H */
