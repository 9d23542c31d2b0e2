/*
 * tidectl internals shared by its files (not a library API): the settings one run parses,
 * the connection to tided, and the pieces every command uses. tidectl.c holds the command
 * table and tidectl_main; tidectl_queries.c the commands that read (status, jobs, events,
 * logs, top); tidectl_actions.c those that change something (resize, submit, cancel,
 * drain, checkpoint) and keygen; tidectl_conn.c the socket; tidectl_print.c and
 * tidectl_parse.c the text going out and coming in. Arrows point down that list.
 * Main thread only, like tidectl itself.
 */
#ifndef TIDE_TIDECTL_INT_H
#define TIDE_TIDECTL_INT_H

#include <stdint.h>
#include <stdio.h>

#include "coordinator/tidectl.h"
#include "core/error.h"
#include "proto/proto.h"

/* What one run's command line set: global flags, then each command's own. */
typedef struct settings {
    /* global */
    const char *endpoint;
    long long timeout_ms;
    const char *key;
    const char *server_key;
    int json;
    const char *log;
    /* resize */
    long long dp, tp, pp, micro;
    const char *stages;
    int dry_run;
    const char *placement;
    const char *dir; /* checkpoint: the root to save under */
    int allow_tp_across_hosts;
    int wait;          /* block until the switch started commits or aborts */
    long long wait_ms; /* for at most this long */
    /* bounds */
    long long steps;
    /* submit */
    int offline;
    const char *name;
    long long priority;
    const char *mem_cap;
    const char *max_memory;
    long long max_procs;
    const char *plugin;
    int bubbles;
    /* events, timeline */
    const char *since;
    const char *until;
    long long after;
    long long limit;
    long long tail;
    const char *type;
    int follow;
    const char *output;
    /* logs */
    long long attempt;
    int all;
    /* top */
    long long interval_ms;
    long long count;
    /* keygen */
    const char *role;
    int force;
    /* status */
    const char *job;
    int watch; /* status --watch (status -o wide sets `output` above) */
    /* grow */
    long long nodes;
} settings_t;

/* One DEALER socket to tided, with a monitor that tells why a call failed. */
typedef struct conn {
    void *ctx, *sock, *mon;
    const char *endpoint;
    int timeout_ms;
    int curve;
    int connected; /* TCP connection established at least once */
    int refused;   /* a connect attempt failed (nobody listening) */
    int handshake_failed;
    unsigned handshake_event;
} conn_t;

/* Every command: runs with the parsed settings and its positional arguments; returns a
   TIDECTL_EXIT_* code, having printed its result on out or its reason on err. Blocks for
   at most --timeout-ms per request. */
typedef int tidectl__cmd_fn(settings_t *s, int argc, char **argv, FILE *out, FILE *err);
tidectl__cmd_fn tidectl__cmd_status, tidectl__cmd_jobs, tidectl__cmd_logs,
    tidectl__cmd_top;                  /* tidectl_queries.c */
tidectl__cmd_fn tidectl__cmd_events;   /* tidectl_events.c */
tidectl__cmd_fn tidectl__cmd_timeline; /* tidectl_timeline.c */
tidectl__cmd_fn tidectl__cmd_resize, tidectl__cmd_submit, tidectl__cmd_cancel, tidectl__cmd_drain,
    tidectl__cmd_grow, tidectl__cmd_checkpoint, tidectl__cmd_keygen; /* tidectl_actions.c */
tidectl__cmd_fn tidectl__cmd_bounds, tidectl__cmd_priority, tidectl__cmd_pin,
    tidectl__cmd_unpin; /* tidectl_elastic.c */

/* Follows tided's events until generation gen of job commits (prints its downtime and bytes
   moved; 0) or aborts (its reason on err; TIDECTL_EXIT_ABORTED); TIDECTL_EXIT_TIMEOUT after
   s->wait_ms. Blocks. */
int tidectl__wait_switch(settings_t *s, const char *job, uint64_t gen, FILE *out, FILE *err);

/* grow --wait: follows the job's events after event since_id until a switch to more workers
   commits (its downtime and bytes; 0) or aborts, or what tided asked of its provider ends
   without one (refused, skipped, cancelled: the reason on err; both TIDECTL_EXIT_ABORTED);
   TIDECTL_EXIT_TIMEOUT after s->wait_ms. Blocks. */
int tidectl__wait_grow(settings_t *s, const char *job, uint64_t since_id, FILE *out, FILE *err);

/* The id of tided's newest event (0: none yet) into *id, for a wait that must not take an
   older event for its end. Blocks for one request. */
int tidectl__newest_event(settings_t *s, uint64_t *id, FILE *err);

/* --wait after a request tided answered with ok: follows the switch it started (gen; 0:
   none, said on out) with tidectl__wait_switch; TIDECTL_EXIT_OK at once without --wait.
   Blocks. */
int tidectl__wait_started(settings_t *s, const char *job, uint64_t gen, FILE *out, FILE *err);

/* ---- connection (tidectl_conn.c) ------------------------------------------------------------- */

/* Opens the DEALER socket to s->endpoint (CURVE with s->key); an exit code, the reason
   printed on err. Close with tidectl__conn_close either way. */
int tidectl__conn_open(conn_t *c, const settings_t *s, FILE *err);

/* Closes c's sockets and context; safe on a zeroed or closed c. */
void tidectl__conn_close(conn_t *c);

/* Sends req, waits up to c's timeout for one reply into *rep (the caller clears it): 0 with
   any decoded reply (an error reply included), else an exit code with the reason on err. */
int tidectl__conn_call(conn_t *c, const tide_msg_t *req, tide_msg_t *rep, FILE *err);

/* One request on a connection of its own: tided's error printed (exit 1), a reply other
   than want refused, else the reply in *rep (the caller clears it). */
int tidectl__call_once(settings_t *s, const tide_msg_t *req, tide_msg_t *rep, tide_msg_type_t want,
                       FILE *err);

/* The whole worker table (all: with those that left; job: only its workers, NULL or ""
   for all) into *out, page after page as tided cuts them; the caller clears *out. */
int tidectl__fetch_status(conn_t *c, int all, const char *job, tide_msg_t *out, FILE *err);

/* ---- text out (tidectl_print.c) -------------------------------------------------------------- */

/* s for a terminal into buf: control bytes become '?', at most max chars (then '~');
   returns buf. */
const char *tidectl__term_str(const char *s, size_t max, char *buf, size_t len);

/* ms since the epoch as local "YYYY-MM-DD HH:MM:SS.mmm" into buf; returns buf. */
const char *tidectl__fmt_time(int64_t ms, char *buf, size_t len);

/* One event as one JSON object on one line: its sentence and the typed fields that apply. */
void tidectl__event_json(FILE *out, const tide_proto_event_row_t *e);

/* s as a JSON string, or null when s is empty. */
void tidectl__json_str_or_null(FILE *out, const char *s);

/* The status and jobs replies as JSON values (no newline): top's NDJSON lines. */
void tidectl__status_json(FILE *out, const tide_proto_status_reply_t *r);
void tidectl__jobs_json(FILE *out, const tide_proto_jobs_reply_t *r);

/* ---- text in (tidectl_parse.c) --------------------------------------------------------------- */

/* Prints "tidectl CMD: <message> (see tidectl CMD --help)" on err; TIDECTL_EXIT_USAGE. */
int tidectl__usage_error(FILE *err, const char *cmd, const char *fmt, ...) TIDE_PRINTF(3, 4);

/* Copies job name `name` (what: the flag or argument it came from) into dst (room for
   TIDE_PROTO_NAME_MAX + 1) when it is a valid name; else a usage error for cmd. */
int tidectl__copy_job(FILE *err, const char *cmd, const char *what, const char *name, char *dst);

#endif /* TIDE_TIDECTL_INT_H */
