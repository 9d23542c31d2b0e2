/*
 * worker internals (libtide): the pieces of the runtime that need no cluster, each
 * unit-tested on its own, and the control client that ties them together.
 *
 *   mailbox   a mutex/condvar FIFO of decoded messages (background -> main thread)
 *   agree     the step-agreement state machine of one rank (pure, no I/O)
 *   child     the offline command runner (its keeper: cgroup or subreaper, capped
 *             output, SIGTERM, grace, SIGKILL)
 *   gens      one abort word per generation (what the threads truly share)
 *   progress  the copy of its step agreement the training thread publishes
 *   ctl       the control client: a background thread that owns the ZeroMQ DEALER
 *             socket (registration, heartbeats, commands from tided, offline work)
 *             and posts tided's commands to the training thread as intents
 *
 * Workload: one ctl per rank; a heartbeat per second, a handful of control messages
 * per resize; the training thread takes the intents mailbox's lock a few times per step.
 */
#ifndef TIDE_WORKER_INT_H
#define TIDE_WORKER_INT_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include <tide/status.h>
#include "collectives/collectives.h"
#include "proto/proto.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- mailbox ---------------------------------------------------------------------- */

typedef struct tide__mailbox tide__mailbox_t;

/* Creates an empty open mailbox; caller owns *out. */
tide_status tide__mailbox_new(tide__mailbox_t **out);

/* Frees the mailbox and the messages still queued; sets *self_p to NULL; NULL is fine. */
void tide__mailbox_destroy(tide__mailbox_t **self_p);

/* Moves *msg to the tail (msg is left TIDE_MSG_NONE); TIDE_ERR_CLOSED once closed,
   TIDE_ERR_NOMEM (msg untouched). Never blocks; any thread. */
tide_status tide__mailbox_push(tide__mailbox_t *mb, tide_msg_t *msg);

/* Takes the head into *out (caller clears it), waiting up to timeout_ms (< 0: forever).
   TIDE_ERR_TIMEOUT when none came, TIDE_ERR_CLOSED when closed and empty. Any thread. */
tide_status tide__mailbox_pop(tide__mailbox_t *mb, tide_msg_t *out, int timeout_ms);

/* Closes: waiters wake with TIDE_ERR_CLOSED once the queue is empty. Any thread. */
void tide__mailbox_close(tide__mailbox_t *mb);

/* Messages queued now. Any thread. */
size_t tide__mailbox_len(tide__mailbox_t *mb);

/* Builds a message into *out inside the mailbox's lock and queues it when build returns 1
   (0: nothing queued): an answer decided on state another thread publishes under the same
   lock (tide__progress). TIDE_ERR_NOMEM with nothing built. Any thread. */
typedef int (*tide__mailbox_build_fn)(void *ctx, tide_msg_t *out);
tide_status tide__mailbox_push_with(tide__mailbox_t *mb, tide__mailbox_build_fn build, void *ctx);

/* Inside the lock: takes every queued message, oldest first, into apply(apply_ctx, msg)
   (which may take it, leaving TIDE_MSG_NONE; what it leaves is cleared), then runs
   then(then_ctx) (then NULL: none), before any later push. Never blocks but on the lock.
   Any thread (one consumer). */
typedef void (*tide__mailbox_apply_fn)(void *ctx, tide_msg_t *msg);
void tide__mailbox_drain(tide__mailbox_t *mb, tide__mailbox_apply_fn apply, void *apply_ctx,
                         void (*then)(void *), void *then_ctx);

/* Waits up to timeout_ms for a message (or the close), taking none. Any thread. */
void tide__mailbox_wait(tide__mailbox_t *mb, int timeout_ms);

/* Runs fn(ctx) inside the mailbox's lock (state the other side reads there). */
void tide__mailbox_locked(tide__mailbox_t *mb, void (*fn)(void *ctx), void *ctx);

/* ---- step agreement (one rank's view of the reconfiguration protocol) -------------- */

/*
 * The rules (coordinator/reconf.c): on `prepare` G the rank acks its completed steps
 * C0 at once; afterwards it may complete at most one more step (C0 + 1) and then waits
 * at the boundary for `commit` G {S} or `abort` G. With S: an old member runs until it
 * has completed exactly S steps, then switches. A recovery's S may equal the steps of a
 * rank stuck inside step S + 1 (a peer died): that step is abandoned (its collectives
 * are aborted) and the rank switches from S. A rank outside the old layout waits for
 * the commit and switches at once.
 * Finishing alone: a rank whose step got past every collective its state depends on
 * marks the step can_finish (tide_step_can_finish). If the step then fails (its last
 * reduction was aborted: a peer died), the rank can still complete it without peers,
 * so it acks one step more than it completed; when a recovery's S is that step, the
 * rank first finishes it (FINISH), then switches; when S is lower, the step is dropped.
 * Survivors that completed the step and survivors stuck in its last reduction thus
 * agree on S instead of some being past it.
 */
typedef enum tide__begin {
    TIDE__BEGIN_RUN = 0,    /* run the next step */
    TIDE__BEGIN_WAIT = 1,   /* wait for a command (boundary reached, or idle) */
    TIDE__BEGIN_SWITCH = 2, /* switch to the pending generation now */
    TIDE__BEGIN_STALE = 3,  /* this rank is past the switch step: it cannot follow */
    TIDE__BEGIN_FINISH = 4, /* complete the failed, can_finish step without peers */
} tide__begin;

typedef enum tide__commit_result {
    TIDE__COMMIT_OK = 0,          /* recorded */
    TIDE__COMMIT_ABORT_STEP = 1,  /* recorded; the step in progress must be abandoned */
    TIDE__COMMIT_DUP = 2,         /* already switched to this generation: resend done */
    TIDE__COMMIT_IGNORED = 3,     /* unknown or stale generation */
    TIDE__COMMIT_ABORT_BUILD = 4, /* recorded; the first layout's communicators, still being
                                     built (tide_join), can never be: abandon the build */
} tide__commit_result;

typedef enum tide__abort_result {
    TIDE__ABORT_CLEARED = 0,   /* the pending generation was dropped before its switch */
    TIDE__ABORT_SWITCHING = 1, /* the switch is running: abort its communicators */
    TIDE__ABORT_SWITCHED = 2,  /* already switched: cannot fall back */
    TIDE__ABORT_IGNORED = 3,   /* unknown generation */
} tide__abort_result;

typedef struct tide__agree {
    uint64_t gen;          /* generation this rank runs (0: none yet) */
    int member;            /* holds a coordinate of gen's layout */
    int64_t completed;     /* steps completed */
    int in_step;           /* between a RUN (or FINISH) begin and its end */
    int can_finish;        /* the step in progress can be completed without peers */
    int deferred;          /* the last step failed after can_finish: it may be finished */
    uint64_t switched_gen; /* the last generation switched to (duplicate commits) */
    uint64_t seen_gen;     /* the newest generation ever announced (never reused) */
    /* pending generation (p_gen 0: none) */
    uint64_t p_gen;
    int p_member;     /* in the new layout */
    int p_old;        /* holds a coordinate of the layout the switch starts from */
    int p_acked;      /* prepare_ack sent */
    int64_t p_ack;    /* completed steps reported in the ack */
    int p_committed;  /* commit received */
    int64_t p_switch; /* the switch step S */
    int p_switching;  /* the main thread runs the switch */
    int p_failed;     /* the switch failed: wait for abort or a newer generation */
    int p_aborted;    /* tided aborted it while the switch ran: its failure ends it */
    int building;     /* tide_join builds the first layout's communicators */
    int groups_dead;  /* the running layout's communicators failed (or their build was
                         abandoned): no step can run on them until a switch replaces them */
} tide__agree;

/* Starts with no generation and start_step steps completed. */
void tide__agree_init(tide__agree *a, int64_t start_step);

/* Installs gen as the running generation (the first layout). */
void tide__agree_first(tide__agree *a, uint64_t gen, int member);

/* A `layout` for gen arrived: 1 when it becomes the pending generation (newer than
   both the running and the pending one), 0 when stale or a duplicate. member_new: this
   rank is in the new layout; member_old: in its prev layout (and runs prev's gen). */
int tide__agree_layout(tide__agree *a, uint64_t gen, int member_new, int member_old);

/* A `prepare` for gen: 1 with *ack_step to send (also for duplicates), 0 to ignore. */
int tide__agree_prepare(tide__agree *a, uint64_t gen, int64_t *ack_step);

/* A `commit` for gen with switch step `step`; recover: a recovery (the old layout's
   collectives cannot complete, so a step in progress is abandoned even when it would
   end at S, and so is a build of the first layout's communicators: ABORT_BUILD). */
tide__commit_result tide__agree_commit(tide__agree *a, uint64_t gen, int64_t step, int recover);

/* The step in progress can be completed without peers from now on (see above). */
void tide__agree_can_finish(tide__agree *a);

/* An `abort` for gen. */
tide__abort_result tide__agree_abort(tide__agree *a, uint64_t gen);

/* The decision at a step boundary; RUN and FINISH mark the step begun, SWITCH marks
   switching. With groups_dead set it never says RUN: a step on dead communicators
   fails at once, and would be retried for as long as no new generation comes. */
tide__begin tide__agree_begin(tide__agree *a);

/* The step begun last ended: ok counts it. Returns 0, or -1 when no step was begun. */
int tide__agree_end(tide__agree *a, int ok);

/* The switch succeeded: the pending generation runs from its switch step (with its new
   communicators: groups_dead is cleared). */
void tide__agree_switched(tide__agree *a);

/* The switch failed: wait for tided's abort (or a newer generation); when the abort
   came while it ran, nothing is pending any more and the old generation goes on. */
void tide__agree_switch_failed(tide__agree *a);

/* ---- abort words: one per generation (gens.c) ------------------------------------------ */

/* The switch state of a generation: announced (PENDING), being switched to by the training
   thread (SWITCHING), switched to (COMMITTED: tided's abort can no longer reach it), or
   aborted by tided (ABORTED: its word is set). */
typedef enum tide__gen_state {
    TIDE__GEN_PENDING = 0,
    TIDE__GEN_SWITCHING = 1,
    TIDE__GEN_COMMITTED = 2,
    TIDE__GEN_ABORTED = 3,
    TIDE__GEN_UNKNOWN = -1, /* no word of that generation in the registry */
} tide__gen_state;

typedef struct tide__gens tide__gens_t; /* the registry */
typedef struct tide__gen tide__gen_t;   /* one generation's word */

/* An empty registry; caller owns *out. Destroy drops the registry's references (words
   still held elsewhere live on until put). */
tide_status tide__gens_new(tide__gens_t **out);
void tide__gens_destroy(tide__gens_t **self_p);

/* Generation gen's word, made (and listed) when absent, with a reference for the caller
   (tide__gen_put); NULL when out of memory. Any thread. */
tide__gen_t *tide__gens_get(tide__gens_t *gs, uint64_t gen);

/* Another reference to g (NULL fine); drops one and nulls *g_p. Any thread. */
tide__gen_t *tide__gen_ref(tide__gen_t *g);
void tide__gen_put(tide__gen_t **g_p);

uint64_t tide__gen_id(const tide__gen_t *g);

/* The abort word, for tide_coll_comm_params.cancel and .watch (NULL for NULL): valid while
   the caller holds g. */
const int *tide__gen_word(const tide__gen_t *g);

/* 1 once g's word is set. Any thread. */
int tide__gen_aborted(const tide__gen_t *g);

tide__gen_state tide__gen_get_state(const tide__gen_t *g);

/* Training thread. switching: PENDING -> SWITCHING (0 when tided aborted it first), and
   its switch runs from now on; switch_failed: back to PENDING (tided's abort then clears
   it), the switch over; commit: -> COMMITTED unless tided aborted it first (0), the switch
   over. */
int tide__gen_switching(tide__gen_t *g);
void tide__gen_switch_failed(tide__gen_t *g);
int tide__gen_commit(tide__gen_t *g);

/* Control thread: tided aborted gen. Unless it was committed (or aborted) already, its
   state becomes ABORTED and its word is set. Returns the state it found (UNKNOWN: no such
   word listed). */
tide__gen_state tide__gens_abort(tide__gens_t *gs, uint64_t gen);

/* 1 while the training thread runs a switch (from tide__gen_switching to its failure or
   commit), whether tided aborted it or not: a newer layout waits (tided resends it). */
int tide__gens_in_switch(tide__gens_t *gs);

/* gen's state (UNKNOWN when not listed). Any thread. */
tide__gen_state tide__gens_state(tide__gens_t *gs, uint64_t gen);

/* Sets gen's word whatever its state: the communicators of a running generation whose step
   must be abandoned (a recovery), or whose build can never complete. Any thread. */
void tide__gens_kill(tide__gens_t *gs, uint64_t gen);

/* Sets every word, and every word made from now on (a halt, a fence). */
void tide__gens_kill_all(tide__gens_t *gs);

/* Sets the words of the generations above gen (the runtime ends: a build ahead of a
   switch must not wait for peers). */
void tide__gens_kill_above(tide__gens_t *gs, uint64_t gen);

/* The registry lets go of the words of generations below `below` (nothing can abort them
   any more: the training thread switched past them); holders keep theirs. */
void tide__gens_retire(tide__gens_t *gs, uint64_t below);

/* ---- progress: what the training thread publishes of its steps (agree.c) --------------- */

/*
 * The training thread owns its step agreement (tide__agree); the control thread answers
 * tided at once from this copy of it: a prepare's ack (the steps it has completed or can
 * complete alone), a recovery's abort of a step in progress, and its heartbeats. The
 * training thread writes it inside the intents mailbox's lock, and the control thread
 * reads it there when it decides and posts an answer (tide__mailbox_push_with), so that
 * an answer and the step it describes are ordered: no step begins between the two. The
 * heartbeat counters are added and taken atomically, any time.
 */
typedef struct tide__progress {
    int64_t completed;
    uint64_t gen; /* the generation it runs */
    int member, in_step, can_finish, deferred, building;
    uint64_t idle_ns, bubble_ns, filled_ns, step_ns; /* since the last heartbeat (__atomic) */
    uint32_t steps;
    uint64_t step_since_ns; /* monotonic ns the step in progress began, 0 outside a step
                               (__atomic): how long a collective has hung, for tided */
} tide__progress;

/* Copies a's state into p (the mailbox's lock held; training thread). */
void tide__progress_set(tide__progress *p, const tide__agree *a);

/* Steps completed or completable alone, as tide__agree_prepare counts them (lock held). */
int64_t tide__progress_reachable(const tide__progress *p);

/* A prepare's ack went out for gen with step (the control thread's answer): the training
   thread records it as tide__agree_prepare would have. 1 when gen is pending. */
int tide__agree_acked(tide__agree *a, uint64_t gen, int64_t step);

/* ---- offline command runner ------------------------------------------------------------ */

#define TIDE__SHIM_NAME       "tide-offline-run" /* the attempt's keeper (offline_run.c) */
#define TIDE__KEEPER_SLACK_MS 3000 /* after the grace: the keeper's time to end the attempt */
#define TIDE__LOG_CAP_DEFAULT (16ull << 20) /* bytes of an attempt's output kept */

typedef struct tide__child {
    pid_t pid; /* the keeper's; 0: none */
    char job[TIDE_PROTO_NAME_MAX + 1];
    char log[1024];           /* the attempt's output file */
    char cgroup[1024];        /* the attempt's cgroup v2 directory ("" when none) */
    int grace_ms;             /* SIGTERM -> SIGKILL when the worker stops it on its own */
    int preempted;            /* SIGTERM sent (a preemption, or the worker leaving) */
    int killed;               /* the grace ended: SIGKILL asked of the keeper */
    uint64_t kill_at_ns;      /* monotonic: SIGKILL when still alive then (0: not scheduled) */
    uint64_t hard_kill_at_ns; /* monotonic: the keeper itself is killed (0: not scheduled) */
} tide__child;

typedef struct tide__child_cfg {
    const char *job;
    char *const *argv; /* the command; argv[argc] need not be NULL */
    uint32_t argc;
    char *const *env; /* "NAME=value" entries added to (or replacing) the environment */
    size_t n_env;
    const char *log_path; /* stdout and stderr of the attempt (created, truncated) */
    uint64_t log_cap;     /* bytes of output kept; the rest is discarded after a marker */
    int grace_ms;         /* SIGTERM -> SIGKILL when the worker dies */
    const char *cgroup;   /* cgroup v2 directory to create for the attempt, or NULL */
    uint64_t max_memory;  /* host memory of the attempt, bytes; 0: no limit */
    uint32_t max_procs;   /* processes of the attempt; 0: no limit */
} tide__child_cfg;

/* Starts cfg's command through its keeper (TIDE__SHIM_NAME, found by tide__offline_shim)
   in a process group and, with cfg->cgroup, a cgroup of its own; the environment is the
   worker's without the MPI runtime's variables (tide__offline_env_keep), plus cfg->env.
   TIDE_ERR_INVALID for an empty command, TIDE_ERR_NOT_FOUND without a keeper, TIDE_ERR_IO
   when it cannot start. A command that cannot be started ends with exit code 127 (the
   reason in the log). Any thread; c is then polled by that thread only. */
tide_status tide__child_spawn(tide__child *c, const tide__child_cfg *cfg);

/* 0 when the environment entry "NAME=value" is an MPI runtime's (OMPI_*, PMIX_*, PMI_*,
   OPAL_*, ...), which an offline command must not inherit; 1 otherwise. Pure. */
int tide__offline_env_keep(const char *entry);

/* The keeper's path: $TIDE_OFFLINE_SHIM, else beside libtide.so (lib/tide/) or the
   build tree's worker/; TIDE_ERR_NOT_FOUND naming what was tried. Any thread. */
tide_status tide__offline_shim(char *out, size_t len);

/* Whether attempts can have a cgroup v2 of their own: 1 and the directory to make them
   in (this process's cgroup, or $TIDE_OFFLINE_CGROUP when it is a path), else 0 and why
   (no cgroup2 mount, not writable, TIDE_OFFLINE_CGROUP=0). Probes the file system once
   per call (mkdir/rmdir); any thread. */
int tide__offline_cgroup_parent(char *out, size_t len, char *why, size_t why_len);

/* The CUDA_VISIBLE_DEVICES value that shows a child only local device index device,
   given the worker's own value parent (NULL or "": every device visible): the entry at
   that index of parent's list (an index or a UUID), else the index itself. Writes it to
   out (len bytes); TIDE_ERR_RANGE when parent lists fewer devices. Pure; any thread. */
tide_status tide__cuda_visible(const char *parent, int device, char *out, size_t len);

/* SIGTERM to the attempt; SIGKILL after grace_ms (sent from tide__child_poll). */
void tide__child_preempt(tide__child *c, int grace_ms, uint64_t now_ns);

/* Reaps without blocking: 1 when the attempt ended (*exit_code: status, or -signal),
   0 while it runs; sends the scheduled SIGKILL when due. */
int tide__child_poll(tide__child *c, uint64_t now_ns, int *exit_code);

/* Stops the attempt as a preemption would (SIGTERM, grace_ms, SIGKILL) and waits for it
   to end (blocks up to grace_ms plus the keeper's slack); its exit code. */
int tide__child_stop(tide__child *c, int grace_ms);

/* ---- host heartbeats (hostbeat.c) ------------------------------------------------------- */

/* The ranks of a pool on one host, sharing one slot each in a shared-memory segment. */
typedef struct tide__hostbeat tide__hostbeat_t;

/* One rank's heartbeat as its control thread publishes it: counters since its previous
   publish (ns), the step and generation now. */
typedef struct tide__beat {
    int32_t worker; /* tided's worker id */
    uint64_t step, gen;
    uint64_t idle_ns, bubble_ns, filled_ns, step_ns;
    uint32_t steps;      /* steps the step_ns covers */
    uint64_t in_step_ns; /* how long the step in progress has run (0: none) */
} tide__beat;

/* Takes this rank's slot off the host (the leader stops carrying it), unmaps, frees
 *self_p and sets it to NULL; NULL is fine. Never blocks, no MPI. */
void tide__hostbeat_close(tide__hostbeat_t **self_p);

/* Ranks on the host, and this rank's index among them (its slot). */
int tide__hostbeat_ranks(const tide__hostbeat_t *h);
int tide__hostbeat_me(const tide__hostbeat_t *h);

/* Publishes this rank's heartbeat b in its slot at monotonic time now: adds the
   counters, sets step and generation, advances the sequence and marks the slot active.
   Only this rank's control thread calls it. */
void tide__hostbeat_publish(tide__hostbeat_t *h, const tide__beat *b, uint64_t now);

/* Marks this rank's slot inactive (fenced, not registered, leaving): no leader carries it
   and it is no leader. */
void tide__hostbeat_inactive(tide__hostbeat_t *h);

/* The host's leader: the lowest index whose slot is active, names a worker and was
   published less than stale_ns before now; -1 when none. */
int tide__hostbeat_leader(const tide__hostbeat_t *h, uint64_t now, uint64_t stale_ns);

/* Leader: takes the heartbeats of the active slots published since the last heartbeat
   sent for them into beats (room for tide__hostbeat_ranks), in worker order, with each
   one's sequence (seqs) and slot index (slots); their count. Their counters are taken:
   call tide__hostbeat_sent for each once the message is sent. */
size_t tide__hostbeat_collect(tide__hostbeat_t *h, tide_proto_heartbeat_t *beats, uint64_t *seqs,
                              int *slots);

/* This rank sends its own heartbeat (no leader covers it): takes its slot's heartbeat
   into *b (its sequence in *seq); 0 when its slot cannot be read right now. */
int tide__hostbeat_own(tide__hostbeat_t *h, tide_proto_heartbeat_t *b, uint64_t *seq);

/* A heartbeat carrying slot i's sequence seq was sent at monotonic time now. */
void tide__hostbeat_sent(tide__hostbeat_t *h, int i, uint64_t seq, uint64_t now);

/* Monotonic ns at which the last heartbeat carrying this rank's was sent (by a leader or
   itself), 0 when none: when its lease runs from. */
uint64_t tide__hostbeat_covered(const tide__hostbeat_t *h);

/* ---- control client ------------------------------------------------------------------- */

/*
 * The control client (ctl.c, ctl_tided.c, ctl_offline.c) owns the socket to tided and
 * answers it; it owns no state of the training thread. It posts tided's commands to the
 * training thread as intents (decoded messages: layout, prepare_ack, commit, abort, halt,
 * fenced, save, job_end, release, offline_assign and preempt of a plugin job) in the
 * intents mailbox, sets generations' abort words, starts the preparation, and reads the
 * training thread's progress; the training thread sends through it and reads the replies
 * to its own requests.
 */
typedef struct tide__ctl tide__ctl_t;
struct tide__prep;

typedef struct tide__ctl_config {
    const char *endpoint;      /* tided's endpoint */
    const char *key_file;      /* CURVE client key pair file, or NULL */
    const char *server_key;    /* server public key (file or Z85), with key_file */
    tide_proto_register_t reg; /* what to register as */
    int register_timeout_ms;   /* wait for register_ok */
    int heartbeat_ms;          /* 0: what tided says in register_ok */
    tide__hostbeat_t *host;    /* the host's heartbeat slots (borrowed; outlives the ctl), or
                                  NULL: this rank sends its own heartbeats */
    /* the runtime's, borrowed (they outlive the ctl) */
    tide__mailbox_t *intents;
    tide__progress *progress;
    tide__gens_t *gens;
    struct tide__prep *prep; /* NULL: acks are never held for a preparation */
} tide__ctl_config;

/* Connects, starts the background thread and registers (blocks until register_ok or
   the timeout). Caller owns *out; main thread. */
tide_status tide__ctl_new(tide__ctl_t **out, const tide__ctl_config *cfg);

/* Stops offline work and the thread; sends bye when say_bye. *self_p = NULL. */
void tide__ctl_destroy(tide__ctl_t **self_p, int say_bye);

/* The training thread drains tided's intents for the last time after this: checkpoint
   proposals read from now on are neither queued nor answered (the rank will not reach
   their steps; tided gives them up when it leaves). Training thread, before that drain. */
void tide__ctl_close_proposals(tide__ctl_t *ctl);

/* Coordinator worker id from register_ok. Any thread. */
int32_t tide__ctl_worker_id(tide__ctl_t *ctl);

/* Encodes msg and hands it to the background thread for sending, in order. Main thread. */
tide_status tide__ctl_send(tide__ctl_t *ctl, const tide_msg_t *msg);

/* Waits for the next reply to the main thread's requests (ok, error, status_reply,
   liveness_reply, join_port, or the first layout of the job named in the last join);
   TIDE_ERR_TIMEOUT. Main thread. */
tide_status tide__ctl_reply(tide__ctl_t *ctl, tide_msg_t *out, int timeout_ms);

/* The job this rank runs (tided's messages for other jobs are ignored). Main thread. */
void tide__ctl_set_job(tide__ctl_t *ctl, const char *job);

/* Queues a "saved" report (worker id filled in here) for the background thread to send at
   its next wake-up (within a heartbeat period), in order; when 16 wait already, the oldest
   is dropped. Any thread. */
void tide__ctl_post_saved(tide__ctl_t *ctl, const tide_proto_saved_t *m);

/* The training thread ended plugin job `job` (or never started it): its slot is free for
   the next assignment. Call it before reporting the end to tided, which may assign the
   next job at once. Any thread. */
void tide__ctl_plugin_done(tide__ctl_t *ctl, const char *job);

/* The offline command job running now ("" when none) and its pid; for tests. */
int tide__ctl_offline_pid(tide__ctl_t *ctl, char *job, size_t len);

#ifdef __cplusplus
}
#endif

#endif /* TIDE_WORKER_INT_H */
