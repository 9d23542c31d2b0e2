/*
 * coordinator/health: whether tided's state file takes writes, and what is not on it yet.
 *
 * tided decides in memory and persists each batch in one transaction (store.h). When the
 * file cannot be written (disk full, I/O error), failure detection and recovery must go on:
 * the loop keeps deciding in memory and this object says the state is "degraded" (why,
 * since when), holds the writes that have no copy in the in-memory state (events, offline
 * attempts' reports, pools' allocations: the journal, bounded), and times the next try to
 * write everything back (workers and jobs are written whole from memory; the journal is
 * replayed). While it is healthy the journal holds the current batch's writes only, so a
 * batch that fails keeps them. Part of the core (loop_persist.c is its only writer); loop
 * thread.
 */
#ifndef TIDE_COORD_HEALTH_H
#define TIDE_COORD_HEALTH_H

#include <stddef.h>
#include <stdint.h>

#include <tide/status.h>
#include "coordinator/store.h"
#include "proto/proto.h"

#define TIDE__JOURNAL_MAX 8192      /* writes held while degraded; the oldest go first */
#define TIDE__RETRY_NS    1000000000ull /* ns between tries to persist again */

typedef enum tide__jkind {
    TIDE__J_EVENT = 0,
    TIDE__J_ATTEMPT = 1,
    TIDE__J_ALLOC = 2,     /* put a pool's allocation */
    TIDE__J_ALLOC_DEL = 3, /* delete a pool's allocation */
} tide__jkind;

/* One write waiting for the state file. */
typedef struct tide__jentry {
    tide__jkind kind;
    tide_store_event_t ev;       /* EVENT (owns ev.fields' workers) */
    int has_fields;              /* EVENT: ev.fields were given */
    tide_store_attempt_t *att;   /* ATTEMPT (owned) */
    char pool[TIDE_COORD_NAME_MAX]; /* ALLOC, ALLOC_DEL */
    tide_proto_alloc_t alloc;       /* ALLOC */
} tide__jentry;

typedef struct tide__health {
    int degraded;         /* 1 while the state file cannot be written */
    char why[512];        /* the store's last error while degraded */
    uint64_t since_ns;    /* monotonic ns it became degraded */
    int64_t since_ms;     /* the same, wall clock */
    uint64_t retry_ns;    /* monotonic ns of the next try to persist */
    uint64_t tries;       /* failed tries since it became degraded */
    uint64_t episodes;    /* times it became degraded since tided started */
    tide__jentry *j;      /* ring of pending writes: j[(head + i) % cap], i < n */
    size_t head, n, cap;
    uint64_t dropped;     /* writes the full journal dropped in this degraded period */
} tide__health;

/* Readies caller-owned storage: healthy, empty journal. */
void tide__health_init(tide__health *h);

/* Frees the journal. */
void tide__health_clear(tide__health *h);

/* Holds an event (fields copied, NULL: none) until the next successful commit. */
void tide__health_event(tide__health *h, int64_t time_ms, const char *job, const char *kind,
                        const tide_proto_event_fields_t *f, const char *detail);

/* Holds an attempt report (copied). */
void tide__health_attempt(tide__health *h, const tide_store_attempt_t *a);

/* Holds a pool's allocation a (copied), or its deletion when a is NULL. */
void tide__health_alloc(tide__health *h, const char *pool, const tide_proto_alloc_t *a);

/* Writes the journal, oldest first, into the store's open transaction. Blocks on I/O. */
tide_status tide__health_replay(const tide__health *h, tide_store_t *store);

/* The journal is on disk (its transaction committed): forgets it. */
void tide__health_committed(tide__health *h);

/* The state file failed with `why` at monotonic now_ns / wall now_ms; 1 when this starts
   a degraded period (0 when it already was degraded). Schedules the next try. */
int tide__health_failed(tide__health *h, const char *why, uint64_t now_ns, int64_t now_ms);

/* The state file took everything again: healthy. */
void tide__health_restored(tide__health *h);

/* The held events that q selects (q->since_id is ignored: held events have no id yet), in
   time order, as rows appended to *rows (n in *n, tide_realloc'd; fields copied). */
tide_status tide__health_events(const tide__health *h, const tide_store_event_query_t *q,
                                tide_store_event_t **rows, size_t *n);

#endif /* TIDE_COORD_HEALTH_H */
