/*
 * coordinator/server internals shared by server.c, reconf.c, metrics.c and
 * auth.c: the server object and the helpers handlers use. Event-loop thread
 * only.
 */
#ifndef TIDE_COORD_SERVER_INT_H
#define TIDE_COORD_SERVER_INT_H

#include <signal.h>
#include <stddef.h>
#include <stdint.h>

#include <zmq.h>

#include "coordinator/policy.h"
#include "coordinator/server.h"
#include "coordinator/state.h"
#include "coordinator/store.h"
#include "proto/proto.h"

#define TIDE__METRICS_CLIENTS 16
#define TIDE__METRICS_REQ_MAX 4096       /* bytes of one HTTP request head */
#define TIDE__PEER_SLOTS      1024       /* clients tracked per pass for the fairness budget */
#define TIDE__BACKLOG_PEERS   64         /* clients whose full queues tided holds messages for */
#define TIDE__BACKLOG_BYTES   (4u << 20) /* bytes held for one such client */

typedef enum tide__role {
    TIDE__ROLE_NONE = 0,
    TIDE__ROLE_WORKER = 1,
    TIDE__ROLE_ADMIN = 2,
    TIDE__ROLE_READER = 3, /* status and jobs only; values match core/keyfile.h's tide_key_role */
} tide__role;

/* An allowed client key (from DIR/<name>.pub). */
typedef struct tide__key {
    uint8_t pub[32];
    char name[72];
    tide__role role;
} tide__key;

typedef struct tide__auth {
    char server_public[41];
    char server_secret[41];
    tide__key *keys;
    size_t n_keys;
} tide__auth;

/* A reply or command waiting for the batch's commit. */
typedef struct tide__out {
    unsigned char rid[TIDE_COORD_RID_MAX];
    size_t rid_len;
    int delim;
    int reply;     /* the answer to a request (else a command tided sends on its own) */
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

/* Handler time and reply bytes one client used in the current loop pass (fairness and
 * memory, see server.c). */
typedef struct tide__peer_cost {
    uint64_t pass; /* loop pass this slot belongs to; an older pass frees it */
    uint64_t ns;   /* handler time spent on this client's requests in that pass */
    size_t bytes;  /* bytes of replies queued for this client in that pass */
    size_t rid_len;
    unsigned char rid[TIDE_COORD_RID_MAX];
} tide__peer_cost;

typedef struct tide__http {
    int fd; /* -1: slot free */
    char req[TIDE__METRICS_REQ_MAX];
    size_t req_len;
    char *resp; /* tide_malloc'd response being written */
    size_t resp_len, resp_at;
    uint64_t started_ns;
} tide__http;

struct tide_server {
    tide_server_config cfg;
    char endpoint[256];
    void *zctx;
    void *router;
    void *zap; /* REP socket on inproc://zeromq.zap.01 when auth is on */
    tide__auth auth;
    int auth_on;
    tide_store_t *store;
    tide_coord_state_t *st;
    volatile sig_atomic_t stop;
    tide_status fatal;  /* a store failure of the batch: nothing of it is sent (see readonly) */
    char readonly[512]; /* non-empty: the state file failed; only reads are served, why */
    tide_proto_buf_t buf;
    tide__out *out;
    size_t n_out, cap_out;
    size_t out_bytes; /* encoded bytes in out[] (the batch's messages not yet sent) */
    int scan_more;    /* the failure scan stopped at its outbox budget: scan again next pass */
    tide__backlog backlog[TIDE__BACKLOG_PEERS]; /* backlog[0..n_backlog) are in use */
    size_t n_backlog;
    uint64_t dropped_out; /* messages dropped: peer gone, or its queue and backlog full */
    /* the request being handled */
    unsigned char rid[TIDE_COORD_RID_MAX];
    size_t rid_len;
    int delim;
    tide__role role;
    char who[96]; /* "admin:alice" / "worker:pool3" / "loopback" for logs */
    /* timers, monotonic ns */
    uint64_t next_scan_ns;
    uint64_t drained_ns;     /* last time the ROUTER queue was seen empty: every message sent
                                before it has been read (liveness is judged at this time) */
    uint64_t last_scan_ns;   /* when the failure scan last ran */
    uint64_t grace_until_ns; /* tided itself was stalled: no worker is failed before this */
    uint64_t next_forget_ns; /* next pass over workers past their retention */
    size_t forget_at;        /* where that pass goes on in the worker table */
    /* fairness: handler time per client in the current pass */
    tide__peer_cost *peers; /* TIDE__PEER_SLOTS entries */
    uint64_t pass_no;
    uint64_t refused_busy; /* requests refused because their client used its pass budget */
    int want_backfill;
    uint64_t next_backfill_ns; /* monotonic: a backfill then (a retry's backoff or a join
                                  grace ends); 0: none pending */
    int bubble_wait;           /* a --bubbles plugin job waits for a worker with measured bubbles */
    /* metrics */
    int http_fd;
    tide__http http[TIDE__METRICS_CLIENTS];
    uint64_t bubble_ns_total; /* ns of pipeline bubbles reported */
    uint64_t filled_ns_total; /* ns of bubbles that offline task steps used (workers measure) */
    uint64_t events_total;
};

/* ---- server.c helpers ---------------------------------------------------------------------- */

/* Queues msg for the worker's current connection (dropped when it has none). */
void tide__send_worker(tide_server_t *s, const tide_coord_worker_t *w, const tide_msg_t *msg);

/* Queues msg as the reply to the request being handled. */
void tide__reply(tide_server_t *s, const tide_msg_t *msg);

/* Queues an error reply {code, message} for the request being handled; returns code. */
tide_status tide__reply_error(tide_server_t *s, tide_status code, const char *fmt, ...)
    TIDE_PRINTF(3, 4);

/* Saves w in the open transaction (opening one); a failure becomes s->fatal. */
void tide__save_worker(tide_server_t *s, const tide_coord_worker_t *w);

/* Saves j likewise. */
void tide__save_job(tide_server_t *s, const tide_coord_job_t *j);

/* Appends an event likewise. */
void tide__event(tide_server_t *s, const char *job, const char *kind, const char *fmt, ...)
    TIDE_PRINTF(4, 5);

/* The worker holding job rank `rank` of job j (through its pools), or NULL. */
tide_coord_worker_t *tide__job_worker(tide_server_t *s, const tide_coord_job_t *j, int32_t rank);

/* A copy of layout l of job j (pool ranks) naming each member by tided's worker id
 * instead, the id operators see (tidectl, events, metrics): for display and for messages
 * that name workers. Caller destroys *out. TIDE_ERR_NOT_FOUND when a rank of l has no
 * registered worker. Event loop thread. */
tide_status tide__layout_worker_ids(tide_server_t *s, const tide_coord_job_t *j,
                                    const tide_layout_t *l, tide_layout_t **out);

/* Fills a proto layout from a layout (arrays borrowed: do not tide_msg_clear). */
void tide__proto_layout(tide_proto_layout_t *out, const tide_layout_t *l, uint64_t gen);

/* Starts a layout message of job j for worker w: job, w's pool base and the job's ranks
   (layout and prev left for the caller). */
void tide__layout_msg_init(tide_msg_t *m, const tide_coord_job_t *j, const tide_coord_worker_t *w);

/* Makes a worker leave whatever it does and marks it failed (reason for the event). */
void tide__worker_failed(tide_server_t *s, tide_coord_worker_t *w, const char *reason);

/*
 * The first half of tide__worker_failed: marks w failed with an event of kind
 * ("worker_failed", "worker_left"), requeues its offline work and clears its
 * job, without touching that job's layout or switch; returns the online job
 * id it held (0: none). The caller deals with the job.
 */
int64_t tide__worker_down(tide_server_t *s, tide_coord_worker_t *w, const char *kind,
                          const char *reason);

/* ---- reconf.c ----------------------------------------------------------------------------- */

/* Handles "resize" (admin). */
void tide__handle_resize(tide_server_t *s, const tide_proto_resize_t *m);

/* Handles "prepare_ack" and "done" from worker w. */
void tide__handle_prepare_ack(tide_server_t *s, tide_coord_worker_t *w,
                              const tide_proto_prepare_ack_t *m);
void tide__handle_done(tide_server_t *s, tide_coord_worker_t *w, const tide_proto_done_t *m);

/* Handles "join_port" from the accepting side's first rank of a join: relays the port
   name to the joining pool's ranks. */
void tide__handle_join_port(tide_server_t *s, tide_coord_worker_t *w,
                            const tide_proto_join_port_t *m);

/*
 * Starts a reconfiguration of j to layout (ownership moves in): preempts the
 * offline work on the ranks in preempt[], records the intent, sends layout +
 * prepare to every participant. ckpt: a recovery that rolls back to this checkpoint
 * (copied; its members load it instead of resharding from the old layout), else NULL.
 */
tide_status tide__reconf_start(tide_server_t *s, tide_coord_job_t *j, tide_layout_t *layout,
                               const int32_t *preempt, size_t n_preempt, int recover,
                               const char *reason, const tide_coord_ckpt *ckpt);

/* "saved" from a worker: a checkpoint of its job completed (recorded for recoveries that
   no survivor can serve) or failed on it (an event). */
void tide__handle_saved(tide_server_t *s, tide_coord_worker_t *w, const tide_proto_saved_t *m);

/* "checkpoint" from tidectl: asks the members of the job's layout to save at a step they
   have not reached yet; replies ok naming it, or an error. */
void tide__handle_checkpoint(tide_server_t *s, const tide_proto_checkpoint_t *m);

/* Makes j's pending reconfiguration release the connected pools its layout holds no rank
   of (not for a recovery or a join): every live rank of the job's connected pools takes
   part, listed on the side that stays or the side that leaves (tide_reconf_set_leave).
   TIDE_ERR_INVALID when a rank of the new layout is no live rank of a connected pool. */
tide_status tide__reconf_setup_leave(tide_server_t *s, tide_coord_job_t *j);

/* Tells worker w of a pool of j that left the job (at generation pools[p].left) that it
   is released: its program may finish. */
void tide__send_release(tide_server_t *s, const tide_coord_job_t *j, const tide_coord_worker_t *w);

/* Abandons j's pending reconfiguration (abort to participants) and falls back. */
void tide__reconf_abort(tide_server_t *s, tide_coord_job_t *j, const char *reason);

/* Recovers j after losing members: a new layout over survivors, or stalls the job. */
void tide__recover(tide_server_t *s, tide_coord_job_t *j, const char *reason);

/* Worker w (of job j's pool; NULL is fine) is given to j's generation gen: the offline
   job it runs, if any, is preempted (the worker is told) and requeued, and w is idle in
   tided's books at once. Loop thread. */
void tide__preempt_for(tide_server_t *s, const tide_coord_job_t *j, tide_coord_worker_t *w,
                       uint64_t gen);

/* A participant of j's pending reconfiguration failed. */
void tide__reconf_participant_failed(tide_server_t *s, tide_coord_job_t *j, tide_coord_worker_t *w);

/* Retransmissions and deadlines of pending reconfigurations; tries stalled jobs. */
void tide__reconf_tick(tide_server_t *s, uint64_t now_ns);

/* Sends the current phase's messages to participant w of j (register/resend). */
void tide__reconf_resend_to(tide_server_t *s, tide_coord_job_t *j, tide_coord_worker_t *w);

/*
 * The tensors job j joined with, rebuilt from its stored join message;
 * *out = NULL when it joined without tensors. Caller owns *out.
 */
tide_status tide__job_collection(const tide_coord_job_t *j, tide_collection_t **out);

/* Fills candidate workers for j (members alive, idle and offline joined workers), their
   ranks the job ranks; joining: also the ranks of pools that joined j but are not yet
   connected (a resize may connect one; recovery never does). Caller owns *out. */
tide_status tide__candidates(tide_server_t *s, const tide_coord_job_t *j, int32_t exclude_id,
                             int joining, tide_policy_worker **out, size_t *n);

/* ---- metrics.c ----------------------------------------------------------------------------- */

/* Opens the HTTP listener on "HOST:PORT" (s->http_fd). */
tide_status tide__metrics_open(tide_server_t *s, const char *addr);

/* Number of poll items the metrics part needs now, and fills them (POLLIN/POLLOUT). */
int tide__metrics_poll_items(tide_server_t *s, zmq_pollitem_t *items, int max);

/* Handles readiness of the metrics poll items filled last. */
void tide__metrics_handle(tide_server_t *s, const zmq_pollitem_t *items, int n);

/* Renders the Prometheus text into a tide_malloc'd string. */
tide_status tide__metrics_render(tide_server_t *s, char **out, size_t *len);

/* Closes the listener and clients. */
void tide__metrics_close(tide_server_t *s);

/* ---- auth.c -------------------------------------------------------------------------------- */

/* Loads DIR/server.key and every DIR/<name>.pub. */
tide_status tide__auth_load(tide__auth *a, const char *dir);

/* Frees the key table. */
void tide__auth_free(tide__auth *a);

/* Answers one ZAP request waiting on the REP socket. */
void tide__auth_zap(tide_server_t *s);

/* Role from a message's User-Id metadata ("admin:NAME" / "worker:NAME" / "reader:NAME"). */
tide__role tide__auth_role(const char *user_id);

/* 1 when a key of role may send a message that needs `need` (proto.h's role table). */
int tide__auth_allows(tide__role role, int need);

#endif /* TIDE_COORD_SERVER_INT_H */
