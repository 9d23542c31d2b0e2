/*
 * worker/prep: the preparation of announced generations, an object with a thread of its
 * own (bound to the rank's device), a job slot fed by the control thread and a result
 * queue the training thread takes from. When tided announces a generation this rank takes
 * part in, the control thread starts its preparation at once, while the old layout still
 * trains: the communicators of the switch built ahead (prebuild.c), the runtime's pool
 * blocks and host spill memory reserved and its shards warmed (when it owns the buffers),
 * and the program's tide_prepare_fn. The control thread holds the generation's ack until
 * it is done or the training thread ended a step meanwhile.
 *
 * What it knows of the runtime is a base (tide__prep_base) the training thread sets
 * whenever it changes; each job copies it at its start. It touches no state of the other
 * threads: tided's abort of the generation reaches what it builds through the
 * generation's abort word (gens.c).
 *
 * Threads: tide__prep_start and tide__prep_ready on the control thread; the rest on the
 * training thread.
 */
#ifndef TIDE_WORKER_PREP_H
#define TIDE_WORKER_PREP_H

#include <tide/tide.h>

#include "collectives/pool.h"
#include "worker/worker_int.h"

typedef struct tide__prep tide__prep_t;

/* What a preparation knows of the runtime. */
typedef struct tide__prep_base {
    int rank, size, device;
    int multi; /* every rank of the pool runs MPI_THREAD_MULTIPLE: communicators may be
                  built on the preparation thread */
    const tide_coll_backend_v1 *be;
    tide_coll_pool_t *pool;        /* borrowed: a switch that replaces it waits for the job */
    const tide_collection_t *coll; /* borrowed; NULL: no job yet (nothing to prepare) */
    size_t n_tensors;
    const tide_layout_t *layout; /* the current layout (copied) */
    void *const *bufs;           /* the current buffers (copied; read when owned) */
    int owned;                   /* the runtime owns the buffers (tide_give_buffers) */
    tide_mem_pool_t *mem;        /* borrowed; thread-safe */
    uint64_t staging_cap;        /* bytes; 0: the executor's default */
    int mem_strict;
    int switch_timeout_ms;
} tide__prep_base;

/* Starts the preparation thread (it binds be's device first); gens borrowed (outlives
   it). Caller owns *out. */
tide_status tide__prep_new(tide__prep_t **out, tide__gens_t *gens);

/* Stops the thread after the job it runs (the caller sets its generation's word first so
   that a build waiting for peers ends), frees what was built ahead; *self_p = NULL. */
void tide__prep_destroy(tide__prep_t **self_p);

/* The runtime as it is now (copied). Training thread. */
tide_status tide__prep_rebase(tide__prep_t *p, const tide__prep_base *b);

/* Prepares generation gen announced by layout message pl (copied), once per generation:
   at once, or after the job of an older generation still running (the newest one waiting
   replaces an older one). A generation aborted before its job starts is skipped. Control
   thread. */
void tide__prep_start(tide__prep_t *p, uint64_t gen, const tide_proto_layout_msg_t *pl);

/* 1 when gen's ack may go out: its job finished (or was skipped), or the training thread
   ended a step since it started (tide__prep_release). Control thread. */
int tide__prep_ready(tide__prep_t *p, uint64_t gen);

/* The training thread ended a step (or the program dropped its prepare function): an ack
   held for the job started last goes out (the job goes on). */
void tide__prep_release(tide__prep_t *p);

/* Waits until no job runs, nor waits to run for a generation up to gen: the participants
   build their communicators together, and a switch must find what its peers found.
   Training thread. */
void tide__prep_wait(tide__prep_t *p, uint64_t gen);

/* The program's preparation (tide_set_prepare): waits for a call of the previous one to
   end first (ctx stays the program's while it runs). NULL: none. Training thread. */
void tide__prep_set_fn(tide__prep_t *p, tide_prepare_fn fn, void *ctx);

/* What was built ahead for exactly generation gen and participants parts (np, sorted),
   handed over (1): the switch communicator *sw, the new layout's groups g[4] and this
   rank's part of the plan, all the caller's; else 0 (nothing taken). Training thread. */
int tide__prep_take(tide__prep_t *p, uint64_t gen, const int *parts, int np, tide_coll_comm_t **sw,
                    tide_coll_comm_t **g, tide_plan_t **plan);

/* Frees what was built ahead unless it is for generation keep (0: frees all), and not
   while it is being built. Training thread: the one that may use them. */
void tide__prep_drop(tide__prep_t *p, uint64_t keep);

/* Sorted job ranks of the participants of a switch from prev to l (l's members and prev's
   members alive[r], alive NULL: all) into parts (size entries); their count, -1 when out
   of memory. Pure. */
int tide__participants(const tide_layout_t *prev, const tide_layout_t *l, const uint8_t *alive,
                       int size, int *parts);

/* ---- prebuild.c: the communicators of a switch built ahead ---- */

/* What was built ahead for one generation. */
typedef struct tide__prebuilt {
    uint64_t gen; /* 0: nothing */
    int *parts;   /* sorted job ranks of the participants */
    int np;
    tide_coll_comm_t *sw;   /* over parts */
    tide_coll_comm_t *g[4]; /* the new layout's all, tp, dp, pp (NULL where not a member) */
    tide_plan_t *plan;      /* this rank's part, every participant alive */
} tide__prebuilt;

/* Frees what b holds and empties it (groups first: split off sw). */
void tide__prebuilt_free(tide__prebuilt *b);

/* On the preparation thread: builds generation gen's switch communicator, the new layout's
   groups and this rank's part of the plan into *out when the switch can use them (a plain
   resize, pl neither a recovery nor connecting or releasing a pool, that this rank takes
   part in, on MPI_THREAD_MULTIPLE), all watching gen's abort word; *out stays empty when
   not, or when any participant failed. Collective over the participants, who all call it
   for gen. */
void tide__prebuild(const tide__prep_base *b, uint64_t gen, const tide_proto_layout_msg_t *pl,
                    const tide__gen_t *word, tide__prebuilt *out);

#endif /* TIDE_WORKER_PREP_H */
