/*
 * coordinator/allocs: which scheduler allocation each pool (mpirun launch) runs in, as its
 * workers reported at registration ("pools are allocations"). Only pools launched inside
 * an allocation have an entry. tided keeps the table in memory (a hash by pool name, so a
 * status listing costs one lookup per row) and in its state file (table pool_allocs),
 * so that a restarted tided still knows where each launch runs.
 *
 * Workload: one entry per launch inside Slurm (thousands at most), written at a pool's
 * first registration, read per status row and per job row. Loop thread only.
 */
#ifndef TIDE_COORD_ALLOCS_H
#define TIDE_COORD_ALLOCS_H

#include <stddef.h>

#include <tide/status.h>
#include "coordinator/store.h"
#include "proto/proto.h"

typedef struct tide_allocs tide_allocs_t;

/* An empty table; caller owns *out. TIDE_ERR_NOMEM. */
tide_status tide_allocs_new(tide_allocs_t **out);

/* Frees *self_p and sets it to NULL; NULL is fine. */
void tide_allocs_destroy(tide_allocs_t **self_p);

/* Records pool's allocation a (copied; a->sched "" removes the entry). TIDE_ERR_NOMEM. */
tide_status tide_allocs_put(tide_allocs_t *t, const char *pool, const tide_proto_alloc_t *a);

/* Pool's allocation, or NULL when it runs in none. Valid until the next put or remove. */
const tide_proto_alloc_t *tide_allocs_get(const tide_allocs_t *t, const char *pool);

/* Forgets pool's entry; no-op when it has none. */
void tide_allocs_remove(tide_allocs_t *t, const char *pool);

/* Entries in the table. */
size_t tide_allocs_count(const tide_allocs_t *t);

/* Calls fn(ctx, pool, alloc) for every entry, in no particular order; fn must not change
 * the table. */
void tide_allocs_each(const tide_allocs_t *t,
                      void (*fn)(void *ctx, const char *pool, const tide_proto_alloc_t *a),
                      void *ctx);

/* "slurm 12" for a (sched and id), into out (len bytes); "" for NULL or no scheduler. */
void tide_alloc_label(const tide_proto_alloc_t *a, char *out, size_t len);

/* ---- the state file (store.h's file; each write needs its open transaction) ---------------- */

/* Writes (insert or replace) pool's allocation. */
tide_status tide_store_put_alloc(tide_store_t *s, const char *pool, const tide_proto_alloc_t *a);

/* Deletes pool's row (none: no-op). */
tide_status tide_store_del_alloc(tide_store_t *s, const char *pool);

/* Loads every stored row into t (which may hold entries: rows replace them). A row the
 * protocol would refuse (a file edited by hand) is skipped with a warning. Blocks on I/O. */
tide_status tide_store_load_allocs(tide_store_t *s, tide_allocs_t *t);

#endif /* TIDE_COORD_ALLOCS_H */
