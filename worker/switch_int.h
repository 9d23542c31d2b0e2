/*
 * worker/switch_int: a layout switch as a transaction (switch.c, switch_phases.c).
 *
 * tide_reshard takes the generation's intent once, by value (tide__intent: the old and
 * new layouts, the pools it connects or releases, the checkpoint it rolls back to), then
 * runs its phases in order: pools (connect a pool launched later, or release whole
 * pools), participants (who takes part, who died), communicator (over the participants,
 * built ahead or made here), state (move the old shards, or restore them from a
 * checkpoint), groups (the new layout's communicators), commit (the runtime takes the
 * new layout, buffers and step; the old ones are released; tided hears `done`). Every
 * acquisition a phase makes that the old layout would not survive is pushed on the
 * transaction's undo log; on a failure the log runs backwards, so the rank is back in
 * its old layout with its old pool, communicators and buffers, and tided hears the
 * failure.
 *
 * What a switch needs from outside the runtime (tided's liveness answers, the done and
 * checkpoint reports, the agreement state of the generation, connecting a pool launched
 * later) goes through a tide__switch_port: the runtime's talks to the control client, a
 * test's records and decides. Every phase is an internal function so that a test can run
 * the phases one by one over a loopback or recording backend and fail between any two.
 *
 * Threads: the training (MPI) thread only.
 */
#ifndef TIDE_WORKER_SWITCH_INT_H
#define TIDE_WORKER_SWITCH_INT_H

#include "collectives/executor.h"
#include "worker/tide_int.h"

/* What a switch asks of the world outside the runtime. Every member is called on the
   training thread, with ctx. */
typedef struct tide__switch_port {
    void *ctx;
    /* alive[i] = whether tided still counts job rank ranks[i] (n of them, sorted, distinct)
       in the job; blocks up to the registration timeout. */
    tide_status (*liveness)(void *ctx, const int32_t *ranks, uint32_t n, uint8_t *alive);
    /* Connects this rank's side of a join (tide__join_connect for the runtime), ended early
       when *cancel is set. */
    tide_status (*join)(void *ctx, const tide__join_req *jr, const int *cancel,
                        tide__join_result *out);
    /* Tells tided how generation gen's switch ended on this rank. */
    void (*done)(void *ctx, uint64_t gen, tide_status rc, uint64_t bytes_moved, double ms);
    /* Tells tided that this rank could not load checkpoint m->dir (m->code, m->reason). */
    void (*load_failed)(void *ctx, const tide_proto_saved_t *m);
    /* The commit point: when generation gen is still the one switching, runs
       install(arg) (the new communicators take the old ones' places), marks gen switched
       and returns TIDE_OK with *step, the steps completed from now on (rb_step when
       rollback), all atomically with respect to the control thread's aborts; else
       TIDE_ERR_ABORTED with nothing changed (tided aborted it meanwhile). */
    tide_status (*commit)(void *ctx, uint64_t gen, int rollback, int64_t rb_step,
                          void (*install)(void *arg), void *arg, int64_t *step);
    /* The switch to gen failed: the agreement waits for tided's abort (or has it). */
    void (*failed)(void *ctx, uint64_t gen);
    /* The runtime took the new layout and buffers, the old layout's communicators are gone
       (before tided hears done): the new generation's word is the running one, and the
       preparation prepares from them from now on. */
    void (*adopted)(void *ctx);
} tide__switch_port;

/* The runtime's port: the control client of t (tide_reshard's). */
void tide__switch_port_runtime(tide_t *t, tide__switch_port *out);

/* One undo of the log: reverses one acquisition of tx. */
typedef struct tide__switch tide__switch;
typedef void (*tide__undo_fn)(tide__switch *tx);

#define TIDE__UNDO_MAX 8

typedef struct tide__switch {
    tide_t *t;
    tide__switch_port port;
    tide__intent in;
    tide__gen_t *word; /* in.gen's abort word (borrowed): every communicator of the switch
                          watches it (the retirer takes a reference of its own) */
    int committed;
    tide_view nv;          /* this rank's place in in.next */
    void *const *new_bufs; /* the program's new buffers (NULL: none, or in place) */
    int in_place;          /* the runtime owns the buffers: rebuilt inside its pool */
    uint64_t t0;           /* monotonic ns at the start */
    /* pools: the job's pool, job-end communicator, ids and size before a join or release
       (the commit frees them, the undo puts them back) */
    int joined, released;
    tide_coll_pool_t *old_pool;
    MPI_Comm old_end;
    int32_t *old_ids;
    int old_size;
    int32_t *side_ids; /* a release: this side's coordinator ids (t->coord_ids at commit) */
    /* participants */
    size_t nw; /* job ranks */
    uint8_t *alive;
    int *parts, *rank_of;
    int np, lost, bystander;
    /* communicators: the switch's, and the new layout's groups */
    tide_coll_comm_t *sw, *g[4];
    int prepared;
    tide_coll_comm_t *old_c[5]; /* at the commit: the old groups and the switch's */
    /* state */
    tide_plan_t *plan;
    tide_exec_stats es;
    void **rb_fresh; /* a rollback in place: the checkpoint's shards, then the old ones */
    uint64_t rb_read;
    tide_reshard_stats st;
    /* the undo log: acquisitions the old layout would not survive, in order */
    tide__undo_fn undo[TIDE__UNDO_MAX];
    int n_undo;
} tide__switch;

/* Starts transaction tx of t for intent *in (moved in: *in is left cleared), whose
   generation's abort word is word (borrowed for the transaction), with port, and the
   program's new buffers (checked by the caller). Never fails. */
void tide__switch_begin(tide__switch *tx, tide_t *t, tide__intent *in, tide__gen_t *word,
                        const tide__switch_port *port, void *const *new_bufs);

/* The phases, in order. Each returns TIDE_OK or the failure (its detail set); a
   bystander of a join or release skips communicator, state and groups. */
tide_status tide__switch_pools(tide__switch *tx);
tide_status tide__switch_participants(tide__switch *tx);
tide_status tide__switch_communicator(tide__switch *tx);
tide_status tide__switch_state(tide__switch *tx);
tide_status tide__switch_groups(tide__switch *tx);
tide_status tide__switch_commit(tide__switch *tx);

/* Records fn as the undo of an acquisition just made. */
void tide__switch_log(tide__switch *tx, tide__undo_fn fn);

/* The failure path: runs the undo log backwards, tells the agreement and tided, and
   returns the status the program sees (a rollback's unusable checkpoint becomes
   TIDE_ERR_ABORTED: tided tries the one before it). rc: the phase's failure. */
tide_status tide__switch_undo(tide__switch *tx, tide_status rc);

/* Frees what the transaction still holds (its scratch, the intent); *stats (may be NULL)
   gets its statistics when it committed. */
void tide__switch_end(tide__switch *tx, tide_reshard_stats *stats);

#endif /* TIDE_WORKER_SWITCH_INT_H */
