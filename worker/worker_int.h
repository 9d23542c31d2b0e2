/*
 * worker internals (libtide): the pieces of the runtime that need no cluster, each
 * unit-tested on its own, and the control client that ties them together.
 *
 *   mailbox   a mutex/condvar FIFO of decoded messages (background -> main thread)
 *   agree     the step-agreement state machine of one rank (pure, no I/O)
 *   child     the offline command runner (its keeper: cgroup or subreaper, capped
 *             output, SIGTERM, grace, SIGKILL)
 *   ctl       the control client: a background thread that owns the ZeroMQ DEALER
 *             socket (registration, heartbeats, commands from tided, offline work)
 *             and the state the main thread consults at step boundaries
 *
 * Workload: one ctl per rank; a heartbeat per second, a handful of control messages
 * per resize; the main thread takes ctl's mutex a few times per training step.
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
    uint32_t steps; /* steps the step_ns covers */
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

typedef struct tide__ctl tide__ctl_t;

typedef struct tide__ctl_config {
    const char *endpoint;      /* tided's endpoint */
    const char *key_file;      /* CURVE client key pair file, or NULL */
    const char *server_key;    /* server public key (file or Z85), with key_file */
    tide_proto_register_t reg; /* what to register as */
    int register_timeout_ms;   /* wait for register_ok */
    int heartbeat_ms;          /* 0: what tided says in register_ok */
    tide__hostbeat_t *host;    /* the host's heartbeat slots (borrowed; outlives the ctl), or
                                  NULL: this rank sends its own heartbeats */
} tide__ctl_config;

/* Callback the background thread runs to abort communicators (with ctl's lock held;
   it must only call tide_coll_comm_abort and set flags). which: 0 the step's, 1 the
   switch's (and what is being built ahead), 2 what is being built ahead for a pending
   generation that was aborted or replaced. */
typedef void (*tide__abort_fn)(void *ctx, int which);

/* Connects, starts the background thread and registers (blocks until register_ok or
   the timeout). Caller owns *out; main thread. */
tide_status tide__ctl_new(tide__ctl_t **out, const tide__ctl_config *cfg);

/* Stops offline work and the thread; sends bye when say_bye. *self_p = NULL. */
void tide__ctl_destroy(tide__ctl_t **self_p, int say_bye);

/* Coordinator worker id from register_ok. Any thread. */
int32_t tide__ctl_worker_id(tide__ctl_t *ctl);

/* Encodes msg and hands it to the background thread for sending. Main thread. */
tide_status tide__ctl_send(tide__ctl_t *ctl, const tide_msg_t *msg);

/* Waits for the next reply (ok, error, status_reply, liveness_reply, or a layout for the
   job named in the last join) routed to the main thread; TIDE_ERR_TIMEOUT. Main thread. */
tide_status tide__ctl_reply(tide__ctl_t *ctl, tide_msg_t *out, int timeout_ms);

/* 1 (and the job's last step in *step, tided's reason in why[0..why_len); both may be
   NULL) once tided said the job ended (job_end, sent to its idle ranks), else 0. Any
   thread; takes ctl's lock. */
int tide__ctl_job_ended(tide__ctl_t *ctl, int64_t *step, char *why, size_t why_len);

/* The generation whose commit released this rank's pool from the job (release), or 0.
   Any thread; takes ctl's lock. */
uint64_t tide__ctl_released(tide__ctl_t *ctl);

/* 1 with the MPI port name of generation gen's join (relayed by tided) copied into port
   (len bytes), 0 while none came. Any thread. */
int tide__ctl_join_port(tide__ctl_t *ctl, uint64_t gen, char *port, size_t len);

/* Sets the abort callback. */
void tide__ctl_set_abort(tide__ctl_t *ctl, tide__abort_fn fn, void *ctx);

/* Job this rank runs (for routing and reports); start_step steps completed. */
void tide__ctl_set_job(tide__ctl_t *ctl, const char *job, int64_t start_step);

/* Locks / unlocks ctl's state mutex (the main thread's view of agreement state). */
void tide__ctl_lock(tide__ctl_t *ctl);
void tide__ctl_unlock(tide__ctl_t *ctl);

/* With the lock held: the agreement state. */
tide__agree *tide__ctl_agree(tide__ctl_t *ctl);

/* With the lock held: the pending generation's layout message, or NULL. */
const tide_proto_layout_msg_t *tide__ctl_pending_layout(tide__ctl_t *ctl);

/* With the lock held: waits on ctl's condition up to timeout_ms (state changes wake it). */
void tide__ctl_wait(tide__ctl_t *ctl, int timeout_ms);

/* Accounting for heartbeats: idle time (ns), bubble time (ns) and the part of it that
   offline task steps filled (ns), one step's time (ns). Any thread. */
void tide__ctl_add_idle(tide__ctl_t *ctl, uint64_t ns);
void tide__ctl_add_bubble(tide__ctl_t *ctl, uint64_t ns, uint64_t filled_ns);
void tide__ctl_add_step(tide__ctl_t *ctl, uint64_t ns);

/* Offline plugin work handed to the main thread (kind plugin): 1 and *out (owned by the
   caller) when one is waiting (bubbles_only: only a job that may run inside pipeline
   bubbles). With the lock held. */
int tide__ctl_take_plugin(tide__ctl_t *ctl, int bubbles_only, tide_msg_t *out);

/* With the lock held: 1 and tided's pending checkpoint request (root into dir, len bytes;
   its step) when one came since the last call, which takes it; else 0. */
int tide__ctl_take_save(tide__ctl_t *ctl, char *dir, size_t len, int64_t *step);

/* Queues a "saved" report (worker id filled in here) for the background thread to send at
   its next wake-up (within a heartbeat period), in order; when 16 wait already, the oldest
   is dropped. Any thread; takes the lock. */
void tide__ctl_post_saved(tide__ctl_t *ctl, const tide_proto_saved_t *m);

/* With the lock held: the tide_status tided halted the job with (its reason copied into
   why), or 0 while it goes on. */
int tide__ctl_halted(tide__ctl_t *ctl, char *why, size_t len);

/* With the lock held: 1 (its reason copied into why, may be NULL) once this process was
   fenced: tided said the job went on without it, or its lease ran out (no heartbeat for
   tided's failure timeout while it held a part of a job); else 0. A fenced process must
   touch none of its old peers again and exit. */
int tide__ctl_fenced(tide__ctl_t *ctl, char *why, size_t len);

/* With the lock held: grace (ms) when plugin job `job` must stop, else -1. */
int tide__ctl_plugin_preempted(tide__ctl_t *ctl, const char *job);

/* With the lock held: plugin job `job` ended on the main thread; its slot is free for
   the next assignment (a later job's slot is left alone). Call it before reporting the
   end to tided, which may assign the next job at once. */
void tide__ctl_plugin_finished(tide__ctl_t *ctl, const char *job);

/* Prepares this rank for generation gen announced by layout message pl (a copy, borrowed
   for the call); runs on ctl's preparation thread, never with ctl's lock held. */
typedef void (*tide__prepare_fn)(void *ctx, uint64_t gen, const tide_proto_layout_msg_t *pl);

/* Sets the preparation (NULL: none; a held ack is released). While set, the ack of a
   `prepare` for a generation this rank takes part in (its new layout includes the rank,
   or its old one does) is held: the background thread runs fn(ctx, gen, layout) on a
   thread of its own at once and acks when fn returned or the main thread ended a step
   (tide__ctl_prepare_release), whichever comes first. fn is started for every such
   generation that is still pending, also when the ack went out first (a preparation of
   an earlier generation was still ending): the participants build communicators in it
   together. Waits for a running fn first. Main thread. */
void tide__ctl_set_prepare(tide__ctl_t *ctl, tide__prepare_fn fn, void *ctx);

/* The main thread ended a step: a held ack goes out now (the preparation goes on). */
void tide__ctl_prepare_release(tide__ctl_t *ctl);

/* With the lock held: waits until no preparation runs, nor is still to start for the
   pending generation. */
void tide__ctl_prepare_wait(tide__ctl_t *ctl);

/* The offline command job running now ("" when none) and its pid; for tests. */
int tide__ctl_offline_pid(tide__ctl_t *ctl, char *job, size_t len);

#ifdef __cplusplus
}
#endif

#endif /* TIDE_WORKER_INT_H */
