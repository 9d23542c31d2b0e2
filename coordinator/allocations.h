/*
 * coordinator/allocations: a job's pools as scheduler allocations (docs/slurm.md,
 * "Running under Slurm"). tided records the allocation each pool registered from (allocs.h) and shows it
 * (status, jobs); with a provider of nodes (provider.h: --provider slurm) it grows a job
 * by asking for an allocation (`tidectl grow`), grows the job onto each pool of its
 * allocations as the pool joins (one pool per switch), and cancels what an ended job still
 * waits for. Whatever the provider, a pool whose scheduler will take its node back
 * (`leave`, sent by libtide on the scheduler's grace signal) is shrunk out of its job as a
 * planned switch: its offline work stops first, the job's layout moves off it (no recovery,
 * no lost step) and the pool is released. Event-loop thread only.
 */
#ifndef TIDE_COORD_ALLOCATIONS_H
#define TIDE_COORD_ALLOCATIONS_H

#include "coordinator/loop.h"

/* Makes the module's state (s->alloc): the table and the provider cfg names. Before the
 * state is loaded. TIDE_ERR_NOMEM. */
tide_status tide__alloc_open(tide_server_t *s);

/* Frees s->alloc (the provider's children killed); NULL is fine. */
void tide__alloc_close(tide_server_t *s);

/* Load hook: the table read again from the state file. */
void tide__alloc_load(tide_server_t *s);

/* Worker w registered from allocation a: recorded (and an event) when its pool's entry is
 * new or changed. */
void tide__alloc_register(tide_server_t *s, const tide_coord_worker_t *w,
                          const tide_proto_alloc_t *a);

/* The label of w's allocation for a status row ("slurm 12"), "" when none. */
void tide__alloc_label(const tide_server_t *s, const tide_coord_worker_t *w, char *out,
                       size_t len);

/* Online job j's allocations for a jobs row: those its pools run in, with the nodes of
 * its pools there, then what the provider waits for ("slurm 12 h1,h2; slurm 14 pending
 * (Resources)"); "" when none. */
void tide__alloc_job_text(tide_server_t *s, const tide_coord_job_t *j, char *out, size_t len);

/* "grow" from an operator: asks the provider for m->nodes more nodes for the job. */
void tide__on_grow(tide_server_t *s, const tide_msg_t *m, const void *raw, size_t len);

/* "leave" from a worker: its pool is shrunk out of its job (never answered when accepted:
 * the worker's control thread sends it unasked). */
void tide__on_leave(tide_server_t *s, const tide_msg_t *m, const void *raw, size_t len);

/* Tick hook: the provider's commands, pending leaves, growing onto joined allocation pools,
 * ended jobs' requests, and forgetting the allocations of forgotten pools. */
void tide__alloc_tick(tide_server_t *s);

#endif /* TIDE_COORD_ALLOCATIONS_H */
