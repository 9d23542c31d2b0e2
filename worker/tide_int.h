/*
 * worker/tide_int: the runtime object, tide_t, as the training (MPI main) thread owns it:
 * tide.c (lifecycle, memory), job.c (joining a job), step.c (step boundaries, tided's
 * intents), switch*.c (tide_reshard), task.c (offline plugins), ckpt.c (checkpoints).
 * No other thread reads or writes it: the control thread posts intents to its mailbox and
 * sets the generations' abort words; the preparation thread works from a copy of what it
 * needs (prep.h).
 */
#ifndef TIDE_WORKER_TIDE_INT_H
#define TIDE_WORKER_TIDE_INT_H

#include <tide/tide.h>
#include "collectives/pool.h"
#include "worker/groups.h"
#include "worker/prep.h"
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

#define TIDE__SAVES_MAX TIDE_PROTO_SAVES_MAX /* requests of tided a rank keeps pending */
/* A member at the step of a proposal tided has not decided waits this long for it (tided
   decides within TIDE__CKREQ_WAIT_MS of proposing, coordinator/checkpoint.h), ms */
#define TIDE__SAVE_DECIDE_MS 5000

struct tide {
    tide_options opts;
    int rank, size;
    int device; /* the rank's device: opts.device, else its index on the host; bound on
                   this thread by tide_new and on every thread libtide starts */
    tide_coll_pool_t *pool;
    const tide_coll_backend_v1 *be;
    MPI_Comm end_comm; /* tide's own dup of world: pool messages (job end) */
    int multi;         /* every rank of the pool runs MPI_THREAD_MULTIPLE */
    /* the other threads' ends: the control client, the intents it posts, what this thread
       publishes for it, the generations' abort words, the preparation */
    tide__ctl_t *ctl;
    tide__mailbox_t *intents;
    tide__progress progress;
    tide__gens_t *gens;
    tide__prep_t *prep;
    struct tide__retire *retire; /* the replaced layouts' communicators, destroyed off this
                                    thread (retire.h); NULL on a host backend */
    tide__hostbeat_t *host; /* heartbeats through the host's leader, or NULL (owned; the ctl
                               borrows it) */
    int32_t *coord_ids;     /* tided's worker id of each pool rank */
    /* job */
    char job[TIDE_PROTO_NAME_MAX + 1];
    const tide_collection_t *coll;
    size_t n_tensors;
    tide_layout_t *layout; /* current layout (owned) */
    tide_view view;
    /* the step agreement (agree.c), fed by tided's intents at step boundaries, and the
       pending generation's layout message (TIDE_MSG_NONE: none) */
    tide__agree agree;
    tide_msg_t pending;
    tide__gen_t *run_word; /* the running generation's abort word: its groups watch it */
    /* what tided said: the job halted (halt_code, a tide_status), this process fenced, the
       job ended (to an idle rank), this rank's pool released at released_gen */
    int halt_code;
    char halt_why[TIDE_PROTO_TEXT_MAX + 1];
    int fenced;
    char fence_why[TIDE_PROTO_TEXT_MAX + 1];
    int job_ended;
    int64_t end_step;
    char end_why[TIDE_PROTO_TEXT_MAX + 1];
    uint64_t released_gen;
    /* a plugin job tided assigned (task.c takes it), and the grace when preempted (-1) */
    tide_msg_t plugin;
    int plugin_ready;
    char plugin_job[TIDE_PROTO_NAME_MAX + 1];
    int plugin_grace;
    /* the generation being switched to: its intent, taken once at the step boundary that
       answered TIDE_STEP_RECONFIGURE (has_next), its abort word, and this rank's view of
       its layout (next.next) for the program; tide_reshard moves the intent into its
       transaction */
    tide__intent next;
    tide__gen_t *next_word;
    tide_view next_view;
    int has_next;
    tide_layout_t *parked; /* the layout of a switch that failed: a view the program took of
                              it stays readable until the next switch (owned) */
    double switch_wait_ms; /* the last RECONFIGURE's wait at the boundary (stats), ms */
    void **bufs;           /* registered local buffers of the current layout (n_tensors) */
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
    /* the current layout's groups */
    tide_coll_comm_t *c_all, *c_tp, *c_dp, *c_pp;
    struct tide__ckpt *ckpt; /* checkpoint saver and periodic setting (ckpt.c); NULL: none */
    struct {
        char root[TIDE_PROTO_TEXT_MAX + 1];
        int64_t step;
        uint64_t id;       /* tided's request (0: from a tided that proposes nothing) */
        int go;            /* tided decided it (else a proposal waiting for its decision) */
        uint64_t heard_ns; /* monotonic ns this thread took the proposal */
        int waited;        /* tide__ckpt_undecided found it undecided at its step */
    } saves[TIDE__SAVES_MAX]; /* checkpoints tided asked for, in the order asked (ckpt.c) */
    int n_saves;
};

/* Applies tided's "save" (training thread, with its intents): a proposal is queued, GO
   marks it decided (or queues it), DROP forgets it; a request queued already is not queued
   twice; on a member, one past TIDE__SAVES_MAX pending is reported failed to tided (never
   dropped silently), on an idle rank the oldest gives way (the members answer). */
void tide__ckpt_request(tide_t *t, const tide_proto_save_t *m);

/* 1 while a member is at the step of a proposal tided has not decided yet (its answer said
   it had not reached the step, so tided may decide GO): tide_step_end applies tided's
   messages until it is decided, at most TIDE__SAVE_DECIDE_MS after this rank heard it
   (then it is reported failed and forgotten: tided restarted, or lost it). Main thread. */
int tide__ckpt_undecided(tide_t *t);

/* TIDE_OK when buf (bytes of tensor i) is memory of the rank's backend; otherwise
   TIDE_ERR_INVALID naming who, the tensor and both kinds. Any thread. */
tide_status tide__check_buf(const tide_t *t, const char *who, size_t i, const void *buf,
                            uint64_t bytes);
/* ckpt.c: a periodic checkpoint when one is due (end of a counted step; main thread). */
void tide__ckpt_step_end(tide_t *t);

/* A switch committed at the boundary of `step`: the requests of that step and before,
   which only a rank idle until now still holds, are forgotten (main thread). */
void tide__ckpt_switched(tide_t *t, int64_t step);

/* A rollback switch loaded the checkpoint of `step`: periodic saves of the steps after it
   are taken again (lock held or not; main thread). */
void tide__ckpt_rolled_back(tide_t *t, int64_t step);

/* ckpt.c: waits for the save being written, then frees the checkpoint state. */
void tide__ckpt_destroy(tide_t *t);

/* ---- inbox.c: tided's intents ---- */

/* Applies one intent (tided's decoded command) to t's state (ctx: t); a tide__mailbox_drain
   apply function. Training thread, inside the intents mailbox's lock. */
void tide__inbox_apply(void *ctx, tide_msg_t *msg);

/* Applies every intent the control thread posted to this thread's state, in order, and
   publishes the agreement's progress. Training thread. */
void tide__drain(tide_t *t);

/* The rank ran its last step: the checkpoint requests tided sent until now are applied
   (tide__ckpt_destroy reports those the job ended before), and proposals read after it go
   unanswered, so none is agreed that this rank would neither take nor report. Training
   thread, once, before tide__ckpt_destroy. */
void tide__drain_last(tide_t *t);

/* Runs fn(t, ctx) inside the intents mailbox's lock, then publishes the agreement's
   progress: every change of t->agree the control thread answers from goes through it.
   Training thread. */
void tide__agree_change(tide_t *t, void (*fn)(tide_t *t, void *ctx), void *ctx);

/* What the preparation knows of the runtime, from t (prep.h). */
void tide__prep_base_of(const tide_t *t, tide__prep_base *b);

/* The preparation hears of the runtime as it is now (a job joined, a switch committed,
   the buffers given); a failure is logged (it prepares from what it knew). */
void tide__rebase(tide_t *t);

/* Runs an assigned offline plugin job (tide_task.h) while this rank is idle: steps it
   until done, preemption, or a switch that includes this rank. No-op when none. Main
   thread. */
void tide__run_plugin(tide_t *t);

/* Reports an offline plugin job's attempt to tided (state, exit code, progress 0..1, and
   why it failed: the attempt's output for tidectl logs, "" when none). Main thread. */
void tide__task_report(tide_t *t, const char *job, uint32_t attempt, tide_proto_job_state_t st,
                       int code, double prog, const char *why);

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
   *cancel is set (tided aborted the switch); on failure the connecting thread is
   abandoned and nothing changes. Needs MPI_THREAD_MULTIPLE. Blocks; main thread. */
tide_status tide__join_connect(tide_t *t, const tide__join_req *jr, const int *cancel,
                               tide__join_result *out);

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
   timeout or until *cancel is set (tided aborted the switch). Main thread. */
tide_status tide__leave_split(tide_t *t, const tide__leave_req *lr, const int *cancel,
                              tide__join_result *out);

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
