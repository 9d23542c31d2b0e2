/*
 * worker/tide_int: the tide_t object shared by tide.c (API, steps, join), switch.c
 * (tide_reshard) and task.c (offline plugins). Main thread only, except the
 * communicator pointers, which the background thread's abort callback reads with
 * ctl's lock held (so they are changed only with that lock held).
 */
#ifndef TIDE_WORKER_TIDE_INT_H
#define TIDE_WORKER_TIDE_INT_H

#include <tide/tide.h>
#include "collectives/pool.h"
#include "worker/worker_int.h"

/*
 * Maps the host heartbeat segment of the ranks of node (a communicator of the ranks of
 * one host): collective over node. *out = NULL (and TIDE_OK) when aggregation is off:
 * enable is 0 on some rank, the host has more ranks than a host heartbeat carries, or
 * the segment cannot be made or mapped (logged). TIDE_ERR_BACKEND when MPI fails.
 */
tide_status tide__hostbeat_open(MPI_Comm node, int enable, tide__hostbeat_t **out);

/* Slots of per-wait window estimates per step (waits beyond it are never filled). */
#define TIDE__BUBBLE_SLOTS 256

struct tide {
    tide_options opts;
    int rank, size;
    int device; /* the rank's device: opts.device, else its index on the host; bound on
                   this thread by tide_new and on every thread libtide starts */
    tide_coll_pool_t *pool;
    const tide_coll_backend_v1 *be;
    MPI_Comm end_comm; /* tide's own dup of world: pool messages (job end) */
    tide__ctl_t *ctl;
    tide__hostbeat_t *host; /* heartbeats through the host's leader, or NULL (owned; the ctl
                               borrows it) */
    int32_t *coord_ids;     /* tided's worker id of each pool rank */
    /* job */
    char job[TIDE_PROTO_NAME_MAX + 1];
    const tide_collection_t *coll;
    size_t n_tensors;
    tide_layout_t *layout; /* current layout (owned) */
    tide_view view;
    tide_layout_t *next_layout; /* pending layout during a switch (owned) */
    tide_view next_view;
    int has_next;
    double switch_wait_ms; /* the last RECONFIGURE's wait at the boundary (stats), ms */
    /* the program's preparation of announced layouts (tide_set_prepare) */
    tide_prepare_fn prep_fn; /* fixed while ctl's preparation thread runs */
    void *prep_ctx;
    void **bufs; /* registered local buffers of the current layout (n_tensors) */
    /* the memory pool the state buffers and staging come from; owned: the runtime owns
       bufs (tide_give_buffers) and rebuilds them in place; moved: per tensor, its buffer
       changed address in the last switch */
    tide_mem_pool_t *mem;
    int owned;
    uint8_t *moved;
    int finished;
    int fence_logged;            /* tide_step_begin said once that this rank was fenced */
    uint64_t step_t0, bubble_t0; /* monotonic ns */
    /* pipeline bubbles (task.c): the offline task filling them, the index of the next
       wait in this step, the learned length of each wait (ms; 0 = unknown) for the
       generation win_gen, and the totals */
    struct tide__task *btask;
    size_t bubble_k;
    uint64_t win_gen;
    double win_ms[TIDE__BUBBLE_SLOTS];
    tide_bubble_stats bstats;
    /* communicators: changed under ctl's lock */
    tide_coll_comm_t *c_all, *c_tp, *c_dp, *c_pp; /* current layout */
    tide_coll_comm_t *c_switch;                   /* participants of the running switch */
    int switch_cancel; /* set (__atomic) by an abort of the switch: ends a creation that
                          has no communicator to abort yet */
    tide_coll_comm_t *n_all, *n_tp, *n_dp, *n_pp; /* new layout's, while being built */
    struct tide__ckpt *ckpt; /* checkpoint saver and periodic setting (ckpt.c); NULL: none */
};

/* TIDE_OK when buf (bytes of tensor i) is memory of the rank's backend; otherwise
   TIDE_ERR_INVALID naming who, the tensor and both kinds. Any thread. */
tide_status tide__check_buf(const tide_t *t, const char *who, size_t i, const void *buf,
                            uint64_t bytes);
/* ckpt.c: a periodic checkpoint when one is due (end of a counted step; main thread). */
void tide__ckpt_step_end(tide_t *t);

/* ckpt.c: waits for the save being written, then frees the checkpoint state. */
void tide__ckpt_destroy(tide_t *t);

/* Destroys n communicators (NULL entries fine) and nulls them. */
void tide__destroy_comms(tide_coll_comm_t **c, size_t n);

/* The communicator tag of generation gen's k-th creation (0: the switch's participants,
   1-4: the layout's all/tp/dp/pp groups, 5: a join, 7: a release's pools); the same on
   every rank. */
int tide__gen_tag(uint64_t gen, int k);

/* Creates layout l's groups that this rank belongs to: all split off *parent_p (every
   rank of the parent calls it; the parent is destroyed once all exists, and unpublished
   from c_switch), or with parent_p NULL made over the pool among l's members only (only
   they call it: a job's first layout, or a release's over the pool that stays); then tp, dp and pp
   split off all. Each is published in n_* as soon as it exists, so an abort of the switch reaches
   it; the caller takes them out of n_* (tide__unpublish_new, ctl's lock held) when it commits them;
   on failure they are destroyed and unpublished here. Non-members get NULLs. out[4] = {all, tp, dp,
   pp}. Blocks until the members arrive (switch timeout, or an abort); main thread. */
tide_status tide__build_groups(tide_t *t, const tide_layout_t *l, uint64_t gen,
                               tide_coll_comm_t **parent_p, int member, int p, int d, int tt,
                               tide_coll_comm_t **out);

/* Clears n_*; ctl's lock held. */
void tide__unpublish_new(tide_t *t);

/* Fills v for worker me in layout l (NULL: no layout); communicators NULL. */
void tide__fill_view(tide_view *v, uint64_t gen, const tide_layout_t *l, int32_t me, int64_t step);

/* Converts a proto layout into a reshard layout; caller owns *out. */
tide_status tide__layout_from_proto(const tide_proto_layout_t *pl, tide_layout_t **out);

/* Runs an assigned offline plugin job (tide_task.h) while this rank is idle: steps it
   until done, preemption, or a switch that includes this rank. No-op when none. Main
   thread. */
void tide__run_plugin(tide_t *t);

/* A loaded offline plugin job (task.c). */
typedef struct tide__task tide__task;

/* Ends a loaded job: with preempted, saves its blob and reports it preempted (tided
   requeues it); then fini, unload, free; *k_p = NULL. No-op on NULL. Main thread. */
void tide__task_stop(tide_t *t, tide__task **k_p, int preempted);

/* At a step boundary: stops the bubble task when tided preempted it or this rank left
   the layout, loads a newly assigned one when this rank is a member, and restarts the
   wait count of the step. Main thread. */
void tide__bubble_boundary(tide_t *t);

/* How many task steps a bubble wait runs before it tests its transfer again, given the
   wait's expected length (ms, 0: not learned yet), the time it has waited so far (ms)
   and the task's estimated step time (ms): 0 means stop filling this wait. Pure; any
   thread. */
uint64_t tide__bubble_batch(double expect_ms, double elapsed_ms, double est_ms);

/* A generation that connects a pool launched later (join.c): job ranks of both sides. */
typedef struct tide__join_req {
    uint64_t gen;
    int32_t world;            /* job ranks once connected */
    const int32_t *old_ranks; /* the connected side taking part, sorted */
    uint32_t n_old;
    const int32_t *new_ranks; /* the joining pool's ranks, sorted */
    uint32_t n_new;
} tide__join_req;

/* What a join hands over: the pool over every connected process (numbered by job rank),
   a duplicate of its communicator for job-end messages, and each job rank's coordinator
   id (-1 where no process holds it). All owned by the caller. */
typedef struct tide__join_result {
    tide_coll_pool_t *pool;
    MPI_Comm end_comm;
    int32_t *ids; /* [world] */
} tide__join_result;

/* Connects this rank's side of generation jr->gen's join to the other (MPI accept or
   connect through tided's relayed port, then merge) within the switch timeout or until
   tided aborts the switch; on failure the connecting thread is abandoned and nothing
   changes. Needs MPI_THREAD_MULTIPLE. Blocks; main thread. */
tide_status tide__join_connect(tide_t *t, const tide__join_req *jr, tide__join_result *out);

/* A generation that releases whole pools (leave.c): the live job ranks of both sides. */
typedef struct tide__leave_req {
    uint64_t gen;
    const int32_t *stay; /* ranks of the launches that stay connected, sorted */
    uint32_t n_stay;
    const int32_t *leave; /* ranks of the launches released, sorted */
    uint32_t n_leave;
} tide__leave_req;

/* Makes this rank's side of generation lr->gen's release (stay or leave) into a pool of
   its own: a pool over that side's processes only (numbered by job rank), a duplicate of
   its communicator for job-end messages, and the coordinator ids of that side (-1
   elsewhere), in *out (the caller's). Collective over the side; within the switch
   timeout or until tided aborts the switch. Main thread. */
tide_status tide__leave_split(tide_t *t, const tide__leave_req *lr, tide__join_result *out);

#endif /* TIDE_WORKER_TIDE_INT_H */
