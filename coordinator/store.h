/*
 * coordinator/store: tided's durable state in one SQLite file (WAL mode):
 * workers, jobs (with any pending reconfiguration) and an append-only event
 * table (time, job, kind, detail). tided applies a batch of requests to the
 * in-memory state inside one transaction and commits it before sending any
 * reply of that batch (group commit), so every acknowledged change is on disk.
 * On start the state is reloaded from the file. A job's structured parts (pools,
 * layouts, fit rules, checkpoints, command line) are proto records (proto.h,
 * "records"), one BLOB column each: state schema 2. A file of schema 1 (an older
 * tided's, those parts as text) is read and migrated by tide_store_load.
 *
 * Workload: a few writes per resize, registration or offline-job change; no
 * writes for heartbeats. The file is opened in exclusive locking mode, so a
 * second tided on the same file is refused. Single thread.
 */
#ifndef TIDE_COORD_STORE_H
#define TIDE_COORD_STORE_H

#include <stddef.h>
#include <stdint.h>

#include <tide/status.h>
#include "core/error.h"
#include "coordinator/state.h"
#include "proto/proto.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tide_store tide_store_t;

/* One row of the event table. */
typedef struct tide_store_event {
    uint64_t id;     /* increasing */
    int64_t time_ms; /* wall clock, ms since the Unix epoch */
    char job[TIDE_COORD_NAME_MAX];
    char kind[TIDE_COORD_NAME_MAX];
    char detail[1024];
    tide_proto_event_fields_t fields; /* owned (workers); all empty for an older event */
} tide_store_event_t;

/* Which events tide_store_query_events reads (0 or "" for no filter on that part). */
typedef struct tide_store_event_query {
    uint64_t since_id; /* id > since_id */
    int64_t since_ms;  /* time_ms >= since_ms */
    int64_t until_ms;  /* time_ms < until_ms, 0: no end */
    const char *job;   /* this job only, "" or NULL: any */
    const char *kind;  /* kinds matching this glob ("resize*"), "" or NULL: any */
    uint32_t limit;    /* at most this many */
    int newest;        /* 1: the newest `limit`, newest first; 0: the oldest, oldest first */
} tide_store_event_query_t;

/* One attempt of an offline command job, as its worker last reported it. */
typedef struct tide_store_attempt {
    int64_t job;     /* job id */
    int32_t attempt; /* >= 1 */
    int32_t worker;  /* coordinator worker id */
    char host[TIDE_COORD_HOST_MAX];
    char log[1024]; /* the output file's path on host, "" when none */
    int state;      /* proto's tide_proto_job_state_t */
    int exit_code;
    int64_t time_ms; /* wall clock of the report */
    char tail[8192]; /* the output's last bytes, "" while it runs */
} tide_store_attempt_t;

/*
 * Opens (creating if needed) the state file at path in WAL mode; sync_full
 * selects synchronous=FULL (durable across power loss) over NORMAL (durable
 * across a tided crash). TIDE_ERR_BUSY when another process holds the file.
 * Caller owns *out. Blocks on file I/O.
 */
tide_status tide_store_open(tide_store_t **out, const char *path, int sync_full);

/* tide_store_open; accept_loss 1 starts from a file that lost acknowledged commits (its
   WAL missing or damaged at its end: store_seq.c) with a warning instead of refusing it. */
tide_status tide_store_open_ex(tide_store_t **out, const char *path, int sync_full,
                               int accept_loss);

/* Closes the file (rolling back an open transaction) and sets *self_p to NULL; NULL is fine. */
void tide_store_close(tide_store_t **self_p);

/* Starts a transaction unless one is open; cheap when one is. */
tide_status tide_store_begin(tide_store_t *s);

/* True when a transaction is open. */
int tide_store_in_txn(const tide_store_t *s);

/* Commits the open transaction (no-op without one). Blocks on fsync per sync mode. */
tide_status tide_store_commit(tide_store_t *s);

/* Rolls back the open transaction (no-op without one). */
void tide_store_rollback(tide_store_t *s);

/* Writes (insert or replace) worker w's durable fields; needs an open transaction. */
tide_status tide_store_put_worker(tide_store_t *s, const tide_coord_worker_t *w);

/* Deletes worker id's row and records next_id, the first id never handed out (so that a
   restart never reuses a forgotten worker's id); needs an open transaction. */
tide_status tide_store_del_worker(tide_store_t *s, int32_t id, int32_t next_id);

/* Writes job j (and its pending reconfiguration, or none); needs an open transaction, and
   a file of schema 1 loaded (migrated) first (else TIDE_ERR_INTERNAL). */
tide_status tide_store_put_job(tide_store_t *s, const tide_coord_job_t *j);

/* Appends one event at time_ms; job may be "" for cluster events; needs a transaction. */
tide_status tide_store_event(tide_store_t *s, int64_t time_ms, const char *job, const char *kind,
                             const char *fmt, ...) TIDE_PRINTF(5, 6);

/* tide_store_event with typed fields (NULL: none), stored as an event_fields record beside
   the sentence `detail`; needs a transaction. */
tide_status tide_store_event_fields(tide_store_t *s, int64_t time_ms, const char *job,
                                    const char *kind, const tide_proto_event_fields_t *fields,
                                    const char *detail);

/*
 * Loads every worker and job into st (which must be empty). Volatile fields
 * start at zero; callers set last_seen_ns. Pending reconfigurations come back
 * with their phase and switch step; acknowledgements are collected again. A
 * file of schema 1 is then rewritten in records (one transaction; nothing is
 * written when loading fails). Damaged stored data: TIDE_ERR_PROTOCOL naming
 * the job and the part. Blocks on file I/O.
 */
tide_status tide_store_load(tide_store_t *s, tide_coord_state_t *st);

/*
 * The events q selects, in q's order; *rows is tide_malloc'd and owns each row's fields
 * (free with tide_store_events_free). An event whose stored fields do not decode comes
 * back with empty fields (its sentence still says what happened). Blocks on file I/O.
 */
tide_status tide_store_query_events(tide_store_t *s, const tide_store_event_query_t *q,
                                    tide_store_event_t **rows, size_t *n);

/* Frees rows of tide_store_query_events and sets *rows_p to NULL; NULL is fine. */
void tide_store_events_free(tide_store_event_t **rows_p, size_t n);

/* Writes (insert or replace) one attempt's report; needs an open transaction. */
tide_status tide_store_put_attempt(tide_store_t *s, const tide_store_attempt_t *a);

/*
 * The attempts of job (all when attempt is 0, else that one), the latest `limit` of them,
 * oldest first; *rows is tide_malloc'd (caller frees with tide_free).
 */
tide_status tide_store_attempts(tide_store_t *s, int64_t job, int32_t attempt, uint32_t limit,
                                tide_store_attempt_t **rows, size_t *n);

/* Number of events stored. */
tide_status tide_store_event_count(tide_store_t *s, uint64_t *out);

#ifdef __cplusplus
}
#endif

#endif /* TIDE_COORD_STORE_H */
