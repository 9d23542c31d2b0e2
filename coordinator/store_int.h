/*
 * coordinator/store internals shared by store.c (the file, transactions, workers, events,
 * attempts) and store_jobs.c (a job's row and its records, schema-1 rows): the open store
 * and the helpers that name the state file in every error. Single thread, like store.h.
 */
#ifndef TIDE_COORD_STORE_INT_H
#define TIDE_COORD_STORE_INT_H

#include <sqlite3.h>

#include "coordinator/store.h"

/* Prepared statements, one per kind of write or read done often. */
enum {
    TIDE__ST_WORKER,
    TIDE__ST_DEL_WORKER,
    TIDE__ST_NEXT_ID,
    TIDE__ST_JOB,
    TIDE__ST_EVENT,
    TIDE__ST_EVENTS,
    TIDE__ST_EVENTS_NEWEST,
    TIDE__ST_ATTEMPT,
    TIDE__ST_ATTEMPTS,
    TIDE__ST_BEGIN,
    TIDE__ST_COMMIT,
    TIDE__ST_ROLLBACK,
    TIDE__ST_SEQ, /* the commit count (store_seq.c) */
    TIDE__ST_COUNT
};

struct tide_store {
    sqlite3 *db;
    sqlite3_stmt *st[TIDE__ST_COUNT];
    int in_txn;
    int schema;    /* the file's state schema: 2, or 1 until tide_store_load migrates it */
    int ev_fields; /* the event table has its fields column (tide_store_load adds it) */
    int el_table;  /* the file has the job_elastic table (store_jobs.c) */
    char path[512];
    int sync_full;     /* synchronous=FULL: the sidecar is fdatasync'd too */
    int64_t seq;       /* commits the file holds (meta 'commit_seq'; store_seq.c) */
    int seq_fd;        /* the sidecar "<path>.seq" (-1: not open yet) */
    char seq_path[530];
};

/* "state file P: what: sqlite's message", with BUSY / NOMEM / IO from code. */
tide_status tide__store_db_error(tide_store_t *s, int code, const char *what);

/* Steps statement `which` to its end, resets it and clears its bindings. */
tide_status tide__store_step_done(tide_store_t *s, int which, const char *what);

/* TIDE_ERR_INTERNAL unless a transaction is open (every write needs one). */
tide_status tide__store_need_txn(tide_store_t *s, const char *what);

/* Adds the event table's fields column to a file written before events had fields (one
   transaction), and prepares the event statements again; no-op when it has it. */
tide_status tide__store_add_event_fields(tide_store_t *s);

/* Copies a column's text (NULL: "") into dst of cap bytes, truncating. */
void tide__store_copy_text(char *dst, size_t cap, const unsigned char *src);

/* Refuses an existing file (existed) that lost acknowledged commits, unless accept_loss:
   its sidecar counts more commits than it holds, or it is marked in use and its WAL did not
   exist (wal_existed 0) when tided came to it. Reads only; needs the file open. */
tide_status tide__store_seq_check(tide_store_t *s, int existed, int wal_existed, int accept_loss);

/* Marks the file in use in the database file itself and opens the sidecar (writes); run
   by the first tide_store_begin. */
tide_status tide__store_seq_start(tide_store_t *s);

/* Counts the open transaction's commit (in it); tide__store_seq_committed once it is on
   disk writes the sidecar. */
tide_status tide__store_seq_bump(tide_store_t *s);
void tide__store_seq_committed(tide_store_t *s);

/* Closes the sidecar and marks a clean stop (no transaction open). */
void tide__store_seq_close(tide_store_t *s);

/* Loads every worker into st (tide_store_load, store_jobs.c, then loads the jobs). */
tide_status tide__store_load_workers(tide_store_t *s, tide_coord_state_t *st);

#endif /* TIDE_COORD_STORE_INT_H */
