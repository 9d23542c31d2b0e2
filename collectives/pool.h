/*
 * pool: a cache of backend memory blocks (host memory for mpi, device memory for nccl)
 * that a rank's state buffers and reshard staging come from and go back to, so that a
 * layout switch reuses memory the job already holds instead of asking the system for
 * fresh memory (whose first touch is slow: page faults on host memory, cudaMalloc on a
 * GPU), and a budget that bounds what the pool holds during a switch.
 *
 * Accounting: a block counts its capacity (what was asked of the system). in_use is the
 * capacity of the blocks handed out, cached that of the free ones kept; held = in_use +
 * cached is what the pool takes from the system. With a limit set, the pool never holds
 * more than the limit: it gives cached blocks back to the system before it allocates,
 * and an allocation that cannot fit fails with TIDE_ERR_NOMEM (strict) or goes over it
 * with a warning (soft). Host spill memory (pinned on a GPU) is counted apart, and kept
 * apart: spill blocks are prepared ahead of a switch (tide_mem_pool_spill_reserve), taken
 * and given back during it, and freed after it by a thread of the pool's
 * (tide_mem_pool_spill_release), so that neither the allocation nor the free of pinned
 * memory (cudaMallocHost, cudaFreeHost: milliseconds per GiB, device-wide waits) lies on
 * a switch's critical path.
 *
 * Workload: tens of blocks per rank (one per tensor shard, a few staging slots); a
 * switch every few minutes. Every function may be called from any thread (one mutex).
 */
#ifndef TIDE_COLLECTIVES_POOL_H
#define TIDE_COLLECTIVES_POOL_H

#include <stddef.h>
#include <stdint.h>

#include "collectives/collectives.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tide_mem_pool tide_mem_pool_t;

typedef struct tide_mem_pool_stats {
    uint64_t in_use;       /* capacity of the blocks handed out (bytes) */
    uint64_t cached;       /* capacity of the free blocks kept (bytes) */
    uint64_t peak_in_use;  /* most in_use since the last tide_mem_pool_mark (bytes) */
    uint64_t peak_held;    /* most in_use + cached since the mark (bytes) */
    uint64_t spill;        /* host spill memory holding spilled shards now (bytes) */
    uint64_t peak_spill;   /* most spill since the mark (bytes) */
    uint64_t spill_cached; /* host spill blocks kept for the next spills (bytes) */
    uint64_t spill_fresh;  /* spill memory allocated by spills since the mark (bytes) */
    uint64_t spill_reused; /* spill memory served from kept blocks since the mark (bytes) */
    uint64_t fresh;        /* bytes allocated from the system since the mark */
    uint64_t reused;       /* bytes served from cached blocks since the mark */
    uint64_t limit;        /* the limit in effect (bytes; 0: none) */
    int strict;            /* 1: allocations over the limit fail */
} tide_mem_pool_stats;

/* Creates an empty pool over backend be's memory of device (allocated there by name,
   whatever the calling thread's device; freed with mem_free), and host_alloc / host_free
   for spills (plain host memory when the backend has none). Caller owns *out. */
tide_status tide_mem_pool_new(tide_mem_pool_t **out, const tide_coll_backend_v1 *be, int device);

/* Frees the cached blocks and the pool and sets *self_p to NULL; NULL is fine. Blocks
   still handed out are freed too (their owners must be done with them). */
void tide_mem_pool_destroy(tide_mem_pool_t **self_p);

/* The backend the pool allocates from. */
const tide_coll_backend_v1 *tide_mem_pool_backend(const tide_mem_pool_t *p);

/* A block of at least bytes (its contents undefined): the smallest cached block that
   fits without wasting more than a sixteenth of it, else a fresh one (after giving cached
   blocks back to the system when the limit needs it). TIDE_ERR_NOMEM when the backend
   fails, or when strict and in_use would pass the limit. */
tide_status tide_mem_pool_alloc(tide_mem_pool_t *p, size_t bytes, void **out);

/* Gives a block of this pool back to the cache; NULL is fine. */
void tide_mem_pool_free(tide_mem_pool_t *p, void *ptr);

/* 1 when ptr is a block of this pool handed out now (its start, not inside it). */
int tide_mem_pool_owns(tide_mem_pool_t *p, const void *ptr);

/* Capacity of block ptr (0 when not a block of this pool). */
uint64_t tide_mem_pool_capacity(tide_mem_pool_t *p, const void *ptr);

/* Host memory makes the block smaller in place (realloc; the address does not change,
   the tail goes back to the system); device memory keeps its capacity. No-op when
   bytes >= the capacity. */
void tide_mem_pool_shrink(tide_mem_pool_t *p, void *ptr, size_t bytes);

/* Host memory for a spilled shard (pinned on a GPU), counted as spill: the smallest kept
   spill block that fits (prepared ahead), else a fresh one. TIDE_ERR_NOMEM when it cannot
   be had. tide_mem_pool_spill_free gives it back to the kept blocks (nothing is freed). */
tide_status tide_mem_pool_spill_alloc(tide_mem_pool_t *p, size_t bytes, void **out);
void tide_mem_pool_spill_free(tide_mem_pool_t *p, void *ptr, size_t bytes);

/* Prepares spill blocks of the given sizes (n entries, 0s skipped) that the kept ones do
   not cover yet (allocated and first-touched now: pinned on a GPU), so that a later switch
   spills without allocating. Blocking (slow); any thread. */
tide_status tide_mem_pool_spill_reserve(tide_mem_pool_t *p, const uint64_t *sizes, size_t n);

/* Hands every kept spill block not in use to a thread of the pool's that frees it (bound
   to the pool's device), and returns at once: the end of a switch calls it. Waits only
   for the previous round's thread. Any thread but one at a time. */
void tide_mem_pool_spill_release(tide_mem_pool_t *p);

/* Sets the limit on in_use + cached (bytes; 0: none) and whether passing it fails
   (strict) or only warns; gives cached blocks back to the system above it. */
void tide_mem_pool_set_limit(tide_mem_pool_t *p, uint64_t limit, int strict);

/* Has the kernel read bytes of host memory at ptr once (a no-op for device pools), so
   that single-copy transfers out of it run at memory speed on a VM that shadows page
   tables (see pool.c). Blocks; any thread; the memory must stay mapped meanwhile. */
void tide_mem_pool_warm(const tide_mem_pool_t *p, const void *ptr, size_t bytes);

/* Allocates and first-touches cached blocks of the given sizes (n entries, 0s skipped)
   that are not cached yet, while in_use + cached stays within room bytes over in_use
   (room 0: no bound); so that a later switch finds them without page faults. */
tide_status tide_mem_pool_reserve(tide_mem_pool_t *p, const uint64_t *sizes, size_t n,
                                  uint64_t room);

/* Gives every cached block back to the system. */
void tide_mem_pool_trim(tide_mem_pool_t *p);

/* Starts a new measuring window: peaks := current values, fresh = reused = 0. */
void tide_mem_pool_mark(tide_mem_pool_t *p);

/* Copies the counters into *out. */
void tide_mem_pool_stats_get(tide_mem_pool_t *p, tide_mem_pool_stats *out);

#ifdef __cplusplus
}
#endif

#endif /* TIDE_COLLECTIVES_POOL_H */
