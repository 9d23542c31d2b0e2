/*
 * worker/retire: communicators of a layout that was replaced, destroyed on a thread of
 * their own, bound to the rank's device, while training goes on with the new layout.
 *
 * On a device backend, destroying a communicator is slow: the first H200 run measured
 * 500-1000 ms for the old layout's NCCL communicators at a switch (resize_bench's
 * teardown), all of it training downtime when the switch destroyed them itself. Nothing
 * uses them after the commit, so a switch hands them here (switch_phases.c) and returns.
 * At most TIDE__RETIRE_MAX wait at once: a switch that would add more waits until the
 * thread caught up, so a storm of switches never holds many layouts' device buffers.
 * Host backends destroy their communicators in microseconds and do not use this.
 */
#ifndef TIDE_WORKER_RETIRE_H
#define TIDE_WORKER_RETIRE_H

#include <stddef.h>

#include "collectives/collectives.h"
#include "worker/worker_int.h"

#define TIDE__RETIRE_MAX 16

typedef struct tide__retire tide__retire_t;

/* A retirer for communicators of backend be on device (its thread starts at the first
   hand-over) into *out, owned by the caller (tide__retire_destroy); TIDE_ERR_NOMEM and
   *out NULL when out of memory (callers then destroy inline). Any thread. */
tide_status tide__retire_new(tide__retire_t **out, const tide_coll_backend_v1 *be, int device);

/* Takes the n communicators of c that are not NULL (nulling them) and destroys them on the
   retirer's thread, in order; words[i] is the generation word c[i] watches (NULL: none),
   of which the retirer holds a reference until c[i] is gone. Blocks only while
   TIDE__RETIRE_MAX already wait; destroys inline when r is NULL or its thread cannot
   start. The owner's thread. */
void tide__retire_give(tide__retire_t *r, tide_coll_comm_t **c, tide__gen_t *const *words,
                       size_t n);

/* Blocks until every communicator handed over is destroyed. The owner's thread. */
void tide__retire_wait(tide__retire_t *r);

/* Waits as tide__retire_wait, stops the thread and frees r; *r_p NULL after. NULL fine.
   The owner's thread. */
void tide__retire_destroy(tide__retire_t **r_p);

#endif
