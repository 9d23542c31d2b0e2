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

/* What the preparation of an announced generation built ahead of its switch step
   (prebuild.c): its switch communicator over the participants, the new layout's groups
   split off it, and this rank's part of the plan; keyed by generation and participants,
   so that the switch uses them only for the generation and participant set they were
   made for. The pointers change under ctl's lock (the abort callback reads them). */
typedef struct tide__prebuilt {
    uint64_t gen; /* 0: nothing built (or being built) */
    int building; /* the preparation thread is making them: only it touches them */
    int *parts;   /* sorted job ranks of the participants */
    int np;
    tide_coll_comm_t *sw;   /* over parts (tag tide__gen_tag(gen, TIDE__TAG_PREBUILT)) */
    tide_coll_comm_t *g[4]; /* the new layout's all, tp, dp, pp (NULL where not a member) */
    tide_plan_t *plan;      /* this rank's part, every participant alive */
    double ms;              /* the build took, ms */
} tide__prebuilt;

/* tide__gen_tag's k of the switch communicator built ahead: a tag of its own, so that no
   message of a build that was abandoned matches one made at a switch step. */
#define TIDE__TAG_PREBUILT 6

/* A generation's intent, by value: what tided announced for the switch to it, copied once
   at the step boundary that decides the switch, so that nothing the control thread
   receives later changes it (switch_int.h runs it). */
typedef struct tide__intent {
    uint64_t gen;
    tide_layout_t *prev; /* the layout the switch starts from (owned) */
    tide_layout_t *next; /* the layout it switches to (owned) */
    int old_member;      /* this rank holds a coordinate of prev and runs its generation */
    /* a join: the job's ranks once connected, both sides (owned; n_join_new 0: none) */
    int32_t world;
    int32_t *join_old, *join_new;
    uint32_t n_join_old, n_join_new;
    /* a release: the ranks that stay and those whose launches leave (owned; n_leave 0:
       none) */
    int32_t *stay, *leave;
    uint32_t n_stay, n_leave;
    /* a rollback: the checkpoint every member's shards come from ("" otherwise) */
    char ckpt[TIDE_PROTO_TEXT_MAX + 1];
    int64_t ckpt_step;
} tide__intent;

/* Fills *in from generation gen's layout message pl (copied). On failure (out of memory,
   a layout tide_layout_new refuses) *in is cleared but for gen. Pure; any thread. */
tide_status tide__intent_from_msg(tide__intent *in, uint64_t gen, const tide_proto_layout_msg_t *pl,
                                  int old_member);

/* Frees what the intent owns and zeroes it; safe on a zeroed intent. Any thread. */
void tide__intent_clear(tide__intent *in);

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
    /* the generation being switched to: its intent, taken once at the step boundary that
       answered TIDE_STEP_RECONFIGURE (has_next), and this rank's view of its layout
       (next.next) for the program; tide_reshard moves the intent into its transaction */
    tide__intent next;
    tide_view next_view;
    int has_next;
    tide_layout_t *parked; /* the layout of a switch that failed: a view the program took of
                              it stays readable until the next switch (owned) */
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
    /* communicators of an announced generation built while the old layout trains
       (prebuild.c); multi: every rank of the pool runs MPI_THREAD_MULTIPLE, which building
       them on the preparation thread needs; prep_cancel (__atomic): the generation being
       built ahead was aborted or replaced, or the rank leaves: ends the build */
    tide__prebuilt pre;
    int multi;
    int prep_cancel;
    int prebuild_said; /* the log said once why nothing is built ahead */
    /* the program's preparation function runs (tide_set_prepare waits for it) */
    pthread_mutex_t prep_mu;
    pthread_cond_t prep_cv;
    int prep_fn_busy;
    struct tide__ckpt *ckpt; /* checkpoint saver and periodic setting (ckpt.c); NULL: none */
    char save_root[TIDE_PROTO_TEXT_MAX + 1]; /* a checkpoint tided asked for: its root, */
    int64_t save_step;                       /* and step (-1: none pending) */
};

/* TIDE_OK when buf (bytes of tensor i) is memory of the rank's backend; otherwise
   TIDE_ERR_INVALID naming who, the tensor and both kinds. Any thread. */
tide_status tide__check_buf(const tide_t *t, const char *who, size_t i, const void *buf,
                            uint64_t bytes);
/* ckpt.c: a periodic checkpoint when one is due (end of a counted step; main thread). */
void tide__ckpt_step_end(tide_t *t);

/* ckpt.c: waits for the save being written, then frees the checkpoint state. */
/* A rollback switch loaded the checkpoint of `step`: periodic saves of the steps after it
   are taken again (lock held or not; main thread). */
void tide__ckpt_rolled_back(tide_t *t, int64_t step);

void tide__ckpt_destroy(tide_t *t);

/* ctl's lock (the one the abort callback runs under), when the runtime has a control
   client; none without one (a test's runtime: nothing can abort it then). */
void tide__lock(tide_t *t);
void tide__unlock(tide_t *t);

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

/* Publishes group k (0 all, 1 tp, 2 dp, 3 pp) of the layout being switched to in n_*, so
   that an abort of the switch reaches it (one that came already aborts it now); ctl's
   lock held. */
void tide__publish_new_locked(tide_t *t, int k, tide_coll_comm_t *c);

/* ---- communicators built ahead (prebuild.c) ---- */

/* Sorted job ranks of the participants of a switch from prev to l (l's members and prev's
   members alive[r], alive NULL: all) into parts (size entries); their count. Pure. */
int tide__participants(const tide_layout_t *prev, const tide_layout_t *l, const uint8_t *alive,
                       int size, int *parts);

/* On the preparation thread: builds generation gen's switch communicator, the new
   layout's groups and this rank's part of the plan into t->pre, when the switch can use
   them: a plain resize (pl not a recovery, connecting no pool) that this rank takes part
   in, every rank of the pool on MPI_THREAD_MULTIPLE. Ends early (nothing kept) when
   t->prep_cancel is set. Collective over the participants, who all call it for gen. */
void tide__prebuild(tide_t *t, uint64_t gen, const tide_proto_layout_msg_t *pl);

/* The abort callback's part (ctl's lock held, background thread): ends a build in
   progress (prep_cancel, and the communicators it published are aborted); a build that
   is complete is left whole for the main thread to free (tide__prebuilt_drop). */
void tide__prebuilt_cancel_locked(tide_t *t);

/* Main thread: frees what was built ahead (all), or only when its generation is no
   longer the pending one (aborted, replaced); never while the preparation thread builds.
   Takes ctl's lock (none once ctl is gone). */
void tide__prebuilt_drop(tide_t *t, int all);

/* Main thread, ctl's lock held, at generation gen's switch over parts (np): hands over
   what was built ahead when it was made for exactly that generation and those
   participants (1; t->pre emptied, *plan owned by the caller, sw and g[4] theirs), else 0
   (what was built ahead stays, for tide__prebuilt_drop). */
int tide__prebuilt_take_locked(tide_t *t, uint64_t gen, const int *parts, int np,
                               tide_coll_comm_t **sw, tide_coll_comm_t **g, tide_plan_t **plan);

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

/* ---- rollback.c: a recovery from a checkpoint ---- */

/* Fills bufs (tensor i: coordinate (p, d, tt) of nl's shard, the backend's memory kind, NULL
   where not held) from the checkpoint in dir, which must be of step `step` and t's
   collection; *bytes_read: bytes read from its files. Errors name the file. Main thread;
   blocking file I/O. */
tide_status tide__rollback_load(tide_t *t, const char *dir, int64_t step, const tide_layout_t *nl,
                                int p, int d, int tt, void *const *bufs, uint64_t *bytes_read);

/* Collective over sw: TIDE_OK when every participant's `mine` is TIDE_OK; else this rank's
   own failure, or TIDE_ERR_INVALID when another's load failed; a failed collective's
   status. Main thread; blocks. */
tide_status tide__rollback_agree(tide_t *t, tide_coll_comm_t *sw, tide_status mine);

/* Returns one buffer of the runtime's (a pool block, or the backend's) to where it came
   from; NULL is fine. Any thread. */
void tide__free_buffer(const tide_t *t, void *buf);

#endif /* TIDE_WORKER_TIDE_INT_H */
