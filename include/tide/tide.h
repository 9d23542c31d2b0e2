/*
 * libtide: the worker runtime linked into every rank of an elastic training job.
 *
 * A training program launched with `mpirun` creates one tide_t per rank. The runtime
 * registers the rank with the coordinator (tided), keeps heartbeating from a
 * background thread that owns the ZeroMQ socket (so heartbeats go on while the rank
 * computes), joins an online job, and switches the job's (dp, tp, pp) layout at an
 * agreed step boundary when an operator resizes it (tidectl resize): it reshards the
 * program's registered buffers old -> new through the collectives executor and hands
 * back the communicators of the new layout. Ranks outside the layout wait inside the
 * runtime (running offline work) until a layout includes them.
 *
 * Usage, one rank (every call on the thread that called MPI_Init_thread):
 *
 *   tide_options o; tide_options_init(&o);              // TIDE_* environment defaults
 *   tide_new(&t, &o, MPI_COMM_WORLD);                   // collective over the pool
 *   tide_join(t, &(tide_join_req){"job", coll, dp, tp, pp, micro, 0, rules, n});  // collective
 *   tide_alloc_buffers(t, tide_view_get(t), &bufs);     // from the runtime's memory pool
 *   init them; tide_give_buffers(t, &bufs);             // every rank (idle: NULLs); the
 *                                                       // runtime owns them now
 *   for (;;) {
 *       tide_step_action a;
 *       tide_step_begin(t, &a);                         // idle ranks block in here
 *       if (a == TIDE_STEP_FINISHED) break;             // job ended, or pool released
 *       if (a == TIDE_STEP_RECONFIGURE) {
 *           tide_reshard(t, NULL, NULL);                // rebuilt in place, new comms
 *           point the model at tide_buffers(t) where tide_buffer_moved(t, i); continue;
 *       }
 *       if (view->step == total_steps) { tide_finish(t); break; }
 *       rc = one training step over tide_view_get(t)->tp/dp/pp;
 *       tide_step_end(t, rc);
 *   }
 *   tide_destroy(&t);
 *
 * Memory: with buffers given to the runtime (tide_give_buffers), a switch rebuilds them
 * inside the memory the rank already holds: a shard that does not change keeps its
 * buffer, one that shrinks is rebuilt inside its own buffer, the others come from the
 * runtime's memory pool (blocks freed by earlier switches, prepared ahead when tided
 * announces a layout), and old shards that would not fit are spilled to host memory. A
 * rank's memory during a switch stays within the larger of its old and new state plus
 * the staging cap (tide_reshard_stats says how much it took). Programs that keep their
 * own buffers (tide_set_buffers + tide_reshard with new buffers) hold both layouts at once.
 *
 * Threading: MPI must be initialised with MPI_Init_thread and at least
 * MPI_THREAD_FUNNELED; the runtime's background thread never calls MPI. With
 * MPI_THREAD_MULTIPLE on every rank of the pool, the runtime builds the communicators
 * of an announced resize on its preparation thread while the old layout still trains, so
 * the switch step does not wait for them (tide_reshard_stats.prepared); below it, the
 * switch step builds them (said once in the log). Every tide_* function below is called
 * from the program's main (MPI) thread unless its comment says "any thread".
 *
 * Devices: libtide owns the rank's device. tide_new picks it (tide_options.device, else
 * the rank's index among the ranks on its host) and makes it current on the calling
 * thread; every thread libtide starts (the preparation thread that runs the program's
 * tide_prepare_fn, the offline plugins' steps) does the same before its first CUDA or
 * NCCL call, and the heartbeat thread makes none. CUDA's current device is per
 * thread and a new thread starts on device 0, so a thread the PROGRAM starts that
 * allocates, copies or launches on the GPU must call tide_bind_device (or
 * cudaSetDevice(tide_device(t))) first. Buffers handed to libtide must be of the
 * backend's kind (mpi: host memory, nccl: device memory of tide_device): tide_set_buffers
 * and tide_reshard refuse others with TIDE_ERR_INVALID naming the tensor.
 *
 * Failure: when a peer dies, tided starts a recovery; the background thread aborts
 * the current communicators, so a collective blocked on the dead peer returns
 * TIDE_ERR_ABORTED. The program passes that status to tide_step_end (the step is not
 * counted; the program must not have changed its registered state in a step whose
 * collectives failed) and the next tide_step_begin returns TIDE_STEP_RECONFIGURE.
 * Every survivor must then have completed the same number of steps: a rank whose own
 * collectives all succeeded must not apply its update while another rank may still
 * fail in that step. So update the state only after a last collective that spans the
 * whole layout (train_mlp reduces the loss over dp, pp and then tp after its gradient
 * allreduce); a rank that completed a step the recovery redoes gets TIDE_ERR_STALE.
 * A step is never run again on communicators that failed: tide_step_begin waits for
 * the layout that replaces them, and when none comes within the switch timeout (the
 * collectives failed with every peer alive: a network fault) it returns
 * TIDE_ERR_TIMEOUT. A member that dies while tide_join builds the first layout's
 * communicators ends the build at once: tide_join returns and the first
 * tide_step_begin switches to the recovery. When the dead rank held state that no
 * survivor holds (dp 1, ZeRO-1 moments) and the job saved checkpoints (tide_checkpoint*:
 * the publisher reports each complete one to tided), the recovery loads the last complete
 * checkpoint instead: every member's shards come from its files, and after tide_reshard
 * the view's step is the checkpoint's, so the steps after it run again (take the data
 * position from the step or from registered state, as train_mlp does). A checkpoint that
 * fails its checks on any member makes tide_reshard return TIDE_ERR_ABORTED on all of
 * them, with nothing replaced, and tided tries the one before it.
 */
#ifndef TIDE_TIDE_H
#define TIDE_TIDE_H

#include <mpi.h>
#include <stddef.h>
#include <stdint.h>

#include <tide/api.h>
#include <tide/collection.h> /* the tensor collection, layouts, shard geometry */
#include <tide/comm.h>       /* the collective calls of a step */
#include <tide/status.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The runtime of one rank. Opaque. */
typedef struct tide tide_t;

/* Settings; tide_options_init fills defaults, then TIDE_* environment variables. */
typedef struct tide_options {
    const char *endpoint;   /* TIDE_ENDPOINT: tided's ZeroMQ endpoint; tcp://127.0.0.1:5555 */
    const char *key_file;   /* TIDE_KEY: CURVE key pair file (tidectl keygen); NULL: no CURVE */
    const char *server_key; /* TIDE_SERVER_KEY: server public key file or 40-char Z85 text */
    const char *pool;       /* TIDE_POOL: pool id; NULL: rank 0 makes one ("host-pid") */
    const char *backend;    /* TIDE_BACKEND: "mpi" (host memory, default) or "nccl" */
    int device;             /* TIDE_DEVICE: local device index; -1: this rank's index on its host */
    uint64_t mem_bytes;     /* TIDE_MEM_BYTES: memory reported to tided, bytes; 0: the GPU's
                               (nccl), or on host memory the host's RAM over its ranks */
    int register_timeout_ms; /* TIDE_REGISTER_TIMEOUT_MS: wait for tided's answers, ms; 10000 */
    int join_timeout_ms;     /* TIDE_JOIN_TIMEOUT_MS: wait for the first layout, ms; 120000 */
    int switch_timeout_ms;   /* TIDE_SWITCH_TIMEOUT_MS: peers to arrive in a switch (and in the
                                first layout's communicators), and a new layout to replace
                                communicators that failed, ms; 120000 */
    uint64_t staging_cap;    /* TIDE_STAGING_CAP: reshard staging memory, bytes; 0: default */
    int mem_strict;          /* TIDE_MEM_STRICT: 1: a switch of given buffers that would hold more
                                than the larger of the rank's old and new state plus the staging cap
                                fails (TIDE_ERR_NOMEM) instead of warning and going over; 0 */
    int heartbeat_aggregate; /* TIDE_HEARTBEAT_AGGREGATE: 1: the ranks of a host send one heartbeat
                                message per period together (through shared memory and the lowest
                                local rank running); 0: each rank sends its own; 1 */
    /* The job's elastic declaration, sent with tide_join (what `tidectl bounds` and `tidectl
       priority` set later): tided's policy grows and shrinks the job between min_gpus and
       max_gpus GPUs (dp x tp x pp) by itself. Applied by the join that makes the job; both
       bounds or neither. */
    int min_gpus; /* TIDE_MIN_GPUS: fewest GPUs, [1, 2^20]; 0: no bounds */
    int max_gpus; /* TIDE_MAX_GPUS: most GPUs, >= min_gpus; 0: no bounds */
    int priority; /* TIDE_PRIORITY: [0, 100], a higher one takes GPUs from lower ones; 0 */
} tide_options;

/* Fills o with the defaults above, overridden by the TIDE_* variables that are set. */
TIDE_API void tide_options_init(tide_options *o);

/*
 * Joins the pool: checks MPI's thread level, builds the collectives pool over world
 * (duplicated), agrees on a pool id, registers with tided (rank, host, device,
 * memory) and starts the heartbeat thread. Collective over world; blocks until every
 * rank is registered. Fails with TIDE_ERR_TIMEOUT and a hint when tided does not
 * answer within register_timeout_ms. Caller owns *out.
 */
TIDE_API tide_status tide_new(tide_t **out, const tide_options *opts, MPI_Comm world);

/*
 * Leaves: stops offline work and the heartbeat thread, says bye to tided, frees the
 * communicators. Never blocks on peers. The program's buffers stay the program's.
 * Sets *self_p to NULL; NULL is fine.
 */
TIDE_API void tide_destroy(tide_t **self_p);

/* This rank's worker id: the id tided gave it at registration, kept in tided's state
   file (so the same across tided restarts) and the one operators see: the WORKER column
   of `tidectl status`, the id `tidectl drain` takes, events, metrics and the workers of
   `tidectl resize`. Not an index into a layout (that is tide_pool_rank). -1 for NULL.
   Any thread. */
TIDE_API int32_t tide_worker_id(const tide_t *t);

/* This rank's job rank: the ids a layout's worker map holds (tide_view.layout->worker[]).
   Its rank in the world given to tide_new, plus, when its launch joined a running job
   (see "Growing a job" in docs/multihost.md), the job ranks of the launches before it. -1 for
   NULL. Any thread. */
TIDE_API int tide_pool_rank(const tide_t *t);

/* tided's worker id (tide_worker_id) of pool rank rank, as registered by tide_new;
   -1 when t is NULL or rank is not in [0, tide_pool_size). Any thread. */
TIDE_API int32_t tide_pool_worker_id(const tide_t *t, int rank);

/* Number of ranks in the pool. Any thread. */
TIDE_API int tide_pool_size(const tide_t *t);

/* An MPI communicator over every process connected to this rank's job: the launch's own
   world at first, and after a pool launched later joined the job, the processes of all
   its connected launches (so MPI_COMM_WORLD no longer names them all). Borrowed: it is
   replaced when a pool joins, so read it again after each TIDE_STEP_RECONFIGURE.
   Main thread. */
TIDE_API MPI_Comm tide_world(const tide_t *t);

/* The rank in tide_world(t) of worker w (a job rank, as layouts name workers), or -1 when
   no connected process holds it. Main thread. */
TIDE_API int tide_world_rank(const tide_t *t, int32_t w);

/* Name of the collectives backend in use ("mpi", "nccl"); static; "" for NULL. Any
   thread. */
TIDE_API const char *tide_backend_name(const tide_t *t);

/* Where the runtime's buffers live (TIDE_MEM_HOST on mpi, TIDE_MEM_DEVICE: the rank's GPU
   on nccl): the state buffers given to it and the buffers of the collective calls.
   TIDE_MEM_HOST for NULL. Any thread. */
TIDE_API tide_mem_kind tide_buffer_kind(const tide_t *t);

/* The rank's device index (local to its host), chosen by tide_new; -1 for NULL. Any
   thread. */
TIDE_API int tide_device(const tide_t *t);

/* Makes the rank's device current on the calling thread (cudaSetDevice for the nccl
   backend; nothing for mpi). Call it first on every thread of the program that uses the
   GPU, other than the one that called tide_new. Any thread. */
TIDE_API tide_status tide_bind_device(const tide_t *t);

/* ---- joining an online job ------------------------------------------------------------ */

typedef struct tide_join_req {
    const char *job;                     /* job name: [A-Za-z0-9._:-], 1..127 chars */
    const tide_collection_t *collection; /* the job's state; borrowed, must outlive t */
    int dp, tp, pp;                      /* requested first layout */
    int micro_batches;                   /* micro-batches per step of each dp rank (its
                                            pipeline), not of the whole job (>= 1); a
                                            resize may change it (view->layout says) */
    int64_t start_step;                  /* steps already completed (0, or a checkpoint's) */
    const tide_fit_rule *fit;            /* what layouts the program can run (collection.h): each
                                            degree must divide the n of every rule for it; borrowed
                                            for the call. NULL: any layout the collection allows */
    int n_fit;                           /* rules in fit, [0, TIDE_FIT_RULES_MAX] */
} tide_join_req;

/*
 * Asks tided to run this rank in online job req->job and waits for the job's first
 * layout (tided places it over the joined ranks; ranks it leaves out become idle).
 * Collective over the pool: every rank calls it with the same request. Returns once
 * every rank knows the first layout; tide_view_get then says whether this rank is a
 * member. Members then fill their buffers (fresh or from a checkpoint) and register
 * them with tide_set_buffers before the first step. The pool that starts the job needs
 * dp * tp * pp ranks (tided refuses the join otherwise); a pool launched later for a
 * running job joins it idle whatever its size, and dp, tp and pp are then not used.
 *
 * The fit rules are the job's for its whole life (tided keeps them in its state file):
 * `tidectl resize` to a layout that breaks one is refused with the rule, and a
 * recovery or drain picks the largest dp that keeps them all (leaving the other
 * survivors idle, for offline work), so the program never gets a layout it cannot run.
 * A request whose own first layout breaks them fails with TIDE_ERR_INVALID naming the
 * rule, before tided is asked.
 *
 * The join that makes the job declares its elastic bounds and priority
 * (tide_options.min_gpus, max_gpus, priority); a pool launched later for a running job
 * changes neither, and `tidectl bounds`, `priority` and `pin` change them afterwards.
 * Bounds no layout of the job can meet (tp x pp GPUs a replica, the fit rules) fail the
 * join with TIDE_ERR_INVALID and tided's reason ("min 12 GPUs is above max 8"), and no
 * job is made. Declare every number the program splits by a degree:
 * what the collection shows (tp dividing split dimensions, pp up to the layers, stages
 * covering them) is checked for every layout anyway.
 */
TIDE_API tide_status tide_join(tide_t *t, const tide_join_req *req);

/* What this rank is in a layout. Filled by the runtime; read-only for the program. */
typedef struct tide_view {
    uint64_t generation;           /* layout generation (1 = the first layout) */
    const tide_layout_t *layout;   /* borrowed; valid until the next tide_reshard */
    int member;                    /* 1 when this rank holds a coordinate of layout */
    int pp_rank, dp_rank, tp_rank; /* its coordinate; -1 when not a member */
    int64_t step;                  /* steps completed: the next step to run has this index */
    /* Communicators of the layout (NULL when not a member; NULL in tide_view_next).
       Owned by the runtime, replaced by tide_reshard; use them from the main thread. */
    tide_coll_comm_t *all; /* every member, rank = layout index order */
    tide_coll_comm_t *tp;  /* same (pp, dp): rank = tp_rank */
    tide_coll_comm_t *dp;  /* same (pp, tp): rank = dp_rank */
    tide_coll_comm_t *pp;  /* same (dp, tp): rank = pp_rank */
    int pp_prev, pp_next;  /* ranks in pp of the neighbouring stages, -1 at the ends */
} tide_view;

/* The current layout and this rank's place in it (member 0 when idle); borrowed. */
TIDE_API const tide_view *tide_view_get(const tide_t *t);

/*
 * After tide_step_begin returned TIDE_STEP_RECONFIGURE: the layout being switched to
 * and this rank's place in it (communicators NULL: they exist after tide_reshard);
 * borrowed. NULL at any other time.
 */
TIDE_API const tide_view *tide_view_next(const tide_t *t);

/*
 * Hands this rank's buffers of the current layout to the runtime: *bufs_p from
 * tide_alloc_buffers for tide_view_get(t) (NULL table entries where not held), filled
 * with the state. The runtime owns the buffers and the table from now on (*bufs_p is
 * set to NULL); tide_buffers gives them, and tide_reshard(t, NULL, ...) rebuilds them in
 * place at each switch. They are freed by tide_destroy. On failure nothing changes.
 * Main thread.
 */
TIDE_API tide_status tide_give_buffers(tide_t *t, void ***bufs_p);

/* The buffers of the current layout the runtime owns (tide_give_buffers), one per
   collection tensor, NULL where not held (all NULL on an idle rank); NULL when the
   runtime owns none. Borrowed: valid until the next tide_reshard. Main thread. */
TIDE_API void *const *tide_buffers(const tide_t *t);

/* 1 when tensor i's buffer changed address in the last tide_reshard (the program must
   take tide_buffers(t)[i] again), 0 when it stayed (its bytes may still have changed:
   a shard that shrank was rebuilt inside it). Main thread. */
TIDE_API int tide_buffer_moved(const tide_t *t, size_t i);

/*
 * Registers this rank's local buffers of the current layout: bufs[i] for collection
 * tensor i, exactly tide_shard_bytes(layout, collection, i, p, d, t) bytes in the
 * backend's memory kind, NULL where the rank holds nothing. The array is copied; the
 * buffers stay the program's and must live until the next switch.
 */
TIDE_API tide_status tide_set_buffers(tide_t *t, void *const *bufs);

/* ---- steps ----------------------------------------------------------------------------- */

typedef enum tide_step_action {
    TIDE_STEP_RUN = 0,         /* run step tide_view_get(t)->step, then tide_step_end */
    TIDE_STEP_RECONFIGURE = 1, /* switch now: tide_view_next, then tide_reshard */
    TIDE_STEP_FINISHED = 2,    /* the job ended (tide_finish on its members), or it
                                  released this rank's whole pool: stop */
    TIDE_STEP_FINISH = 3,      /* complete step tide_view_get(t)->step, which failed after
                                  tide_step_can_finish, without any collective (apply the
                                  update it had computed), then tide_step_end */
} tide_step_action;

/*
 * Step boundary. A member normally gets TIDE_STEP_RUN at once; while a resize is
 * being agreed it may wait here (at most about one step of its peers) and gets
 * TIDE_STEP_RECONFIGURE exactly when it has completed the agreed switch step. A rank
 * outside the layout blocks here, idle (offline work runs meanwhile), until a layout
 * includes it (TIDE_STEP_RECONFIGURE) or the job ends (TIDE_STEP_FINISHED). A pool
 * launched later that a resize left wholly out of the job (every rank of that mpirun
 * idle) is released: once that generation is committed its ranks get TIDE_STEP_FINISHED
 * too, already disconnected from the job's other launches, so the program finishes
 * (tide_finish, tide_destroy, MPI_Finalize) and its mpirun exits while the job trains on.
 * Errors: TIDE_ERR_STALE when this rank cannot follow (it ran past a recovery's switch
 * step), TIDE_ERR_CLOSED when tided dropped it, and the status tided halted the job with
 * (TIDE_ERR_NO_HOLDER: a dead rank's state had no live replica and the job reported no
 * checkpoint to roll back to; the detail says what was lost) once tided gave up on the
 * job; the program should then exit.
 */
TIDE_API tide_status tide_step_begin(tide_t *t, tide_step_action *action);

/*
 * Ends the step begun last: step_rc TIDE_OK counts it (view->step advances); any other
 * status (a collective aborted by a peer failure) discards it. Returns TIDE_OK, or
 * TIDE_ERR_INVALID when no step was begun.
 */
TIDE_API tide_status tide_step_end(tide_t *t, tide_status step_rc);

/*
 * Inside a step: from here on this rank could complete the step without any peer (every
 * collective its update depends on is done; what is left is the update and a last
 * reduction that exists to hold every rank back until all got this far). If the step
 * then fails because a peer died, the recovery may ask this rank to finish it
 * (tide_step_begin returns TIDE_STEP_FINISH) rather than redo it: that is what keeps
 * survivors that completed the step and survivors stuck in its last reduction on one
 * switch step. Do not call it when the update needs another collective (ZeRO-1's
 * sharded update). No-op outside a step. Never blocks; main thread.
 */
TIDE_API void tide_step_can_finish(tide_t *t);

/* Time spent waiting on pipeline neighbours inside a step (bubbles), reported to tided.
   For waits the runtime may fill with offline work, use tide_bubble_wait instead. Main
   thread; never block. */
TIDE_API void tide_bubble_begin(tide_t *t);
TIDE_API void tide_bubble_end(tide_t *t);

/*
 * Waits for a pipeline transfer (req, from tide_coll_p2p_start on comm, usually the
 * view's pp communicator) and counts the wait as bubble time. While it waits, it runs
 * steps of the offline task that tided assigned to this rank's bubbles (`tidectl
 * submit --offline --plugin P --bubbles`), one at a time and only while the task's
 * estimated step time fits in the time this wait is expected to leave (a step of at most
 * 2% of the expected wait runs for as long as the transfer is pending, so a wait longer
 * than expected is filled too, delayed by at most that much); the expectation
 * is learned per wait of the step (the k-th call since tide_step_begin) from earlier
 * steps of the same layout, so the first steps of a layout fill nothing. Such a task is
 * loaded, preempted and finished at step boundaries (tide_step_end), never inside a
 * step. Returns the transfer's status (req is completed, not freed). Blocks until the
 * transfer completes; main thread.
 */
TIDE_API tide_status tide_bubble_wait(tide_t *t, tide_coll_comm_t *comm, tide_coll_req_t *req);

/* This rank's bubbles since tide_new. */
typedef struct tide_bubble_stats {
    uint64_t windows;    /* tide_bubble_wait calls */
    double bubble_ms;    /* time spent in them, ms */
    double filled_ms;    /* part of it spent in offline task steps, ms */
    uint64_t task_steps; /* task steps run inside bubbles */
    char task[128];      /* the offline job filling the bubbles now ("" when none) */
} tide_bubble_stats;

/* Copies this rank's bubble statistics into *out. Main thread. */
TIDE_API void tide_bubble_stats_get(const tide_t *t, tide_bubble_stats *out);

/* ---- switching layouts ----------------------------------------------------------------- */

typedef struct tide_reshard_stats {
    uint64_t bytes_sent;  /* bytes this rank sent */
    uint64_t bytes_recv;  /* bytes this rank received */
    uint64_t bytes_local; /* bytes copied locally */
    double plan_ms;       /* planning, ms */
    double move_ms;       /* data movement, ms */
    double comm_ms;       /* communicator setup, ms (sync_ms + groups_ms) */
    double total_ms;      /* the whole switch (tide_reshard), ms */
    /* the breakdown of the downtime (ms) */
    double wait_ms;     /* in the tide_step_begin that returned RECONFIGURE: at the step
                           boundary waiting for tided's commit (on a rank that joins from idle:
                           its idle wait) */
    double sync_ms;     /* the switch communicator: waiting for the other participants to
                           reach the switch, and its handshake */
    double groups_ms;   /* the new layout's communicators (all, tp, dp, pp) */
    double teardown_ms; /* the old layout's communicators destroyed, done reported */
    int prepared;       /* 1 when the switch communicator, the new layout's groups and the plan
                           were made during the preparation, while the old layout trained
                           (a resize with every participant alive, on MPI_THREAD_MULTIPLE;
                           not a recovery, nor a join): groups_ms and plan_ms are then
                           ~0, and sync_ms is only the wait for the other participants */
    /* memory of a switch of given buffers (tide_give_buffers), bytes */
    uint64_t state_old, state_new; /* this rank's shards before and after */
    uint64_t staging_cap;          /* the staging cap in effect */
    uint64_t mem_limit;            /* max(held, state_new) + staging_cap; held: the pool memory
                                      its old shards take (state_old, page-rounded) */
    uint64_t peak_extra;           /* most pool memory in use during the switch over what was in
                                      use when it began (new shards and staging) */
    uint64_t no_room;              /* what the new shards needed beyond the old ones that left:
                                      max(0, state_new - state_old) */
    uint64_t bytes_kept;           /* new shards that kept their buffers */
    uint64_t bytes_shrunk;         /* new shards rebuilt inside their old buffers */
    uint64_t bytes_rebuilt;        /* new shards in pool blocks */
    uint64_t bytes_spilled;        /* old shards spilled to host memory */
    uint64_t fresh_bytes;          /* pool memory newly taken from the system during the switch */
    double join_ms; /* connecting a pool launched later to the job (MPI accept/connect and
                       merge), ms; 0 when the switch connected none */
} tide_reshard_stats;

/*
 * Performs the switch announced by TIDE_STEP_RECONFIGURE: computes the reshard plan,
 * moves the registered buffers' state into new_bufs (tensor i: tide_shard_bytes under
 * tide_view_next's layout and coordinate, NULL where not held; new_bufs may be NULL
 * when this rank is not in the new layout), builds the new communicators, reports to
 * tided. On success new_bufs become the registered buffers (the old ones are the
 * program's to free) and tide_view_get describes the new layout; a rank that left is
 * idle and its next tide_step_begin waits. On failure (a peer died, tided aborted the
 * switch) the old layout, buffers and communicators stay registered where they are
 * intact and the status says why. The program's own mistakes (a member passing no table,
 * a NULL buffer where it holds bytes, memory of the wrong kind, a table while the runtime
 * owns the buffers) are refused with TIDE_ERR_INVALID before anything starts: the switch
 * stays pending and the call may be repeated with the right buffers. Blocks; collective
 * over the switch's participants.
 */
TIDE_API tide_status tide_reshard(tide_t *t, void *const *new_bufs, tide_reshard_stats *stats);
/* With buffers given to the runtime (tide_give_buffers), pass new_bufs NULL: the runtime
 * rebuilds them in place for the new layout (see "Memory" at the top; a rank that joins
 * gets pool buffers, one that leaves gives its memory back to the system); afterwards
 * tide_buffers and tide_buffer_moved say where the new shards are. On failure the old
 * shards stay registered (a spilled one back in a pool block, marked moved). */

/*
 * Allocates zero-filled local buffers for this rank's coordinate in view v (from
 * tide_view_get or tide_view_next) in the backend's memory kind, from the runtime's
 * memory pool; *out gets tide_collection_size entries, NULL where not held (all NULL
 * when not a member). Device memory is allocated and zeroed on the rank's device
 * (tide_device) whatever the calling thread's current device, so a tide_prepare_fn may
 * call it. Free with tide_free_buffers (back to the pool), or hand them to the runtime
 * with tide_give_buffers. Any thread.
 */
TIDE_API tide_status tide_alloc_buffers(const tide_t *t, const tide_view *v, void ***out);

/* Frees buffers from tide_alloc_buffers and sets *bufs_p to NULL; NULL is fine. */
TIDE_API void tide_free_buffers(const tide_t *t, void ***bufs_p);

/* Prepares this rank for a switch; see tide_set_prepare. pending: the announced layout
   and this rank's place in it (communicators NULL; valid during the call). */
typedef tide_status (*tide_prepare_fn)(void *ctx, const tide_view *pending);

/*
 * Lets the program prepare a switch before its switch step, off the critical path: when
 * tided announces a layout that includes this rank, the runtime calls fn(ctx, pending)
 * once on a helper thread of its own (started at the next tide_step_end or, on an idle
 * rank, inside tide_step_begin) while the program goes on running steps in the old
 * layout. It acks tided's prepare when fn has returned or this rank has ended its
 * current step, whichever comes first, so the agreed switch step usually comes after the
 * preparation (the switch may come a step later) and never waits more than a step for it.
 * Typical use: allocate the new buffers and first-touch them, so that the switch moves
 * data into memory that takes no page faults. fn runs with the rank's device already
 * current on its thread, after the runtime's own preparation of the generation (its
 * communicators, see "Threading"). tide_set_prepare waits while fn runs. fn must be
 * thread-safe against the program's steps and must not call MPI or tide_* other than
 * tide_alloc_buffers, tide_free_buffers, tide_device and tide_bind_device. The generation
 * may still be aborted (the program then frees what it prepared). tide_step_begin returns
 * TIDE_STEP_RECONFIGURE for a generation only after its fn returned. An error from fn is
 * logged and only skips the preparation. fn NULL: none (the default). Main thread.
 */
TIDE_API tide_status tide_set_prepare(tide_t *t, tide_prepare_fn fn, void *ctx);

/*
 * The job is over (call on every member after its last step): releases the pool's
 * idle ranks (their tide_step_begin returns TIDE_STEP_FINISHED). Does not wait.
 */
TIDE_API tide_status tide_finish(tide_t *t);

/* ---- memory of the runtime's kind ------------------------------------------------------ */

/* Allocates bytes of tide_buffer_kind memory (on the rank's device for nccl, whatever the
   calling thread's current device); not zeroed. Free with tide_mem_free. Any thread. */
TIDE_API tide_status tide_mem_alloc(const tide_t *t, size_t bytes, void **out);

/* Frees memory from tide_mem_alloc; NULL is fine. Any thread. */
TIDE_API void tide_mem_free(const tide_t *t, void *ptr);

/* Copies bytes from src to dst, both tide_buffer_kind memory (not overlapping); returns
   when the copy is done. TIDE_ERR_INVALID when either is of the wrong kind. Main thread
   (or one that called tide_bind_device). */
TIDE_API tide_status tide_mem_copy(const tide_t *t, void *dst, const void *src, size_t bytes);

/* Copies bytes from src (tide_buffer_kind memory) to host memory; returns when done. Main
   thread (or one that called tide_bind_device). */
TIDE_API tide_status tide_copy_to_host(const tide_t *t, void *host, const void *src, size_t bytes);

/* Copies bytes from host memory to dst (tide_buffer_kind memory); returns when done. Main
   thread (or one that called tide_bind_device). */
TIDE_API tide_status tide_copy_from_host(const tide_t *t, void *dst, const void *host,
                                         size_t bytes);

/* ---- checkpoints ------------------------------------------------------------------------ */

/*
 * Saves the registered buffers as the checkpoint of step tide_view_get(t)->step under
 * root (root/step-<012 step>/: one shard file per coordinate that is the one writer of
 * some bytes, and a manifest the layout's first member publishes once every shard is on
 * disk; docs/checkpoints.md, installed as share/doc/tide/docs/checkpoints.md). Call it on
 * every member at the same step boundary: after tide_step_end, before the next
 * tide_step_begin, or after a tide_step_begin that returned TIDE_STEP_RECONFIGURE and
 * before tide_reshard (the old layout's state at the switch step); inside a step it fails
 * with TIDE_ERR_INVALID. Idle ranks return at once. It copies
 * this rank's part to host staging (device buffers too) and returns: a background thread
 * writes it while training goes on, and the buffers may change right away. It never
 * waits for the disk: a save taken while the previous one is still being written queues
 * behind it, and when two are in flight it fails at once with TIDE_ERR_BUSY. A save that
 * is not on disk within TIDE_CKPT_TIMEOUT_MS (default 60 s plus 1 ms per 16 KiB of the
 * largest shard) fails. Each failed or skipped save is reported to tided (a
 * checkpoint_failed event naming the rank and the error) and is never loaded. No
 * communication. A job restarted under any (dp, tp, pp, stages) loads it (tide-ckpt,
 * tide_checkpoint_load below).
 */
TIDE_API tide_status tide_checkpoint(tide_t *t, const char *root);

/*
 * Periodic checkpoints: from now on tide_step_end of every every-th step (0: none) calls
 * tide_checkpoint(t, root); the publisher keeps the newest keep complete checkpoints
 * (0: all) and removes older ones. On a member, allocates and touches the host staging
 * of its saves now, so that no save takes page faults inside the training loop. A
 * periodic save that fails is logged, reported to tided (a checkpoint_failed event) and
 * by tide_checkpoint_wait; training goes on. Main thread.
 */
TIDE_API tide_status tide_checkpoint_every(tide_t *t, const char *root, int every, int keep);

/* Waits until this rank's checkpoint being written (if any) is on disk (and, on the
   publisher, published); returns the last save's status. Main thread. */
TIDE_API tide_status tide_checkpoint_wait(tide_t *t);

/*
 * Finds the newest complete checkpoint under path (a checkpoint root, or one step's
 * directory ROOT/step-N): its directory into dir (len bytes) and its step, read from its
 * manifest, into *step, the start_step to join with when resuming from it; a step
 * directory whose manifest cannot be read is skipped with a warning. Links are not
 * followed. TIDE_ERR_NOT_FOUND when path holds none. Blocking file I/O; any thread.
 */
TIDE_API tide_status tide_checkpoint_find(const char *path, char *dir, size_t len, int64_t *step);

/*
 * Loads a checkpoint saved under any (dp, tp, pp, stages) into this rank's buffers of the
 * current layout: path as for tide_checkpoint_find (the newest complete one there), bufs[i]
 * tensor i's buffer of the backend's memory kind (tide_shard_bytes of the current view,
 * NULL where not held: tide_alloc_buffers gives such a table), filled before the program
 * registers them (tide_set_buffers or tide_give_buffers). The job must be at the
 * checkpoint's step (tide_join_req.start_step) and the collection the saved one; each rank
 * reads only the chunks of its own shards, each checked against its hash: a damaged file
 * fails with TIDE_ERR_INVALID naming it, and buffers may then hold part of it. Idle ranks
 * return at once. No communication; blocking file I/O; main thread.
 */
TIDE_API tide_status tide_checkpoint_load(tide_t *t, const char *path, void *const *bufs);

/* ---- for language bindings ------------------------------------------------------------ */

/*
 * The layout of the public structs as this library was compiled: sizeof(type) for a
 * type name of include/tide/ ("tide_view", "tide_options", "tide_join_req",
 * "tide_fit_rule", "tide_layout_t", "tide_tensor_desc", "tide_p2p_op",
 * "tide_reshard_stats", "tide_bubble_stats"); 0 for a name it does not know. A binding that mirrors
 * these structs by hand compares its copies with these before any other call, so that a library and
 * a binding of different versions fail with a message instead of corrupting memory. Any thread.
 */
TIDE_API size_t tide_abi_sizeof(const char *type);

/* offsetof(type, field) for a field of one of the types above; (size_t)-1 for an unknown
   type or field. Any thread. */
TIDE_API size_t tide_abi_offsetof(const char *type, const char *field);

/* The number of fields the library knows of type (those tide_abi_offsetof answers for), 0
   for an unknown type: a mirror lacking a trailing field that padding hides from
   tide_abi_sizeof is caught by its count. Any thread. */
TIDE_API size_t tide_abi_nfields(const char *type);

#ifdef __cplusplus
}
#endif

#endif /* TIDE_TIDE_H */
