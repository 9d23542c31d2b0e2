/*
 * coordinator/state: tided's in-memory picture of the cluster: pools of
 * workers (one per device), online jobs (layout, generation, step, pending
 * reconfiguration) and offline jobs (priority, kind, attempts), plus the
 * counters that metrics export. Only the event loop thread touches it; the
 * store (store.h) mirrors the durable part into SQLite.
 *
 * Workload: up to ~10^4 workers and ~10^2 jobs; lookups by worker id are O(1)
 * (ids are dense, assigned at first registration and stable across restarts),
 * by (pool, rank) through a hash, jobs by linear scan.
 */
#ifndef TIDE_COORD_STATE_H
#define TIDE_COORD_STATE_H

#include <stddef.h>
#include <stdint.h>

#include <tide/status.h>
#include "reshard/reshard.h"

#ifdef __cplusplus
extern "C" {
#endif

#define TIDE_COORD_NAME_MAX  128 /* proto: 127 chars + NUL */
#define TIDE_COORD_HOST_MAX  256 /* proto: 255 chars + NUL */
#define TIDE_COORD_RID_MAX   256 /* ZeroMQ routing ids are at most 255 bytes */
#define TIDE_COORD_OWNER_MAX 96  /* "worker:" + a key name */

typedef enum tide_wstate {
    TIDE_WS_IDLE = 0,    /* registered, holds nothing, may be offered offline work */
    TIDE_WS_ONLINE = 1,  /* holds a coordinate of an online job's layout */
    TIDE_WS_OFFLINE = 2, /* runs an offline job */
    TIDE_WS_FAILED = 3,  /* missed its heartbeats (or reported a failure); a new process on its
                            rank returns it to idle; the same process comes back idle only
                            when it held no online job (else it is fenced: see fenced_job) */
    TIDE_WS_DRAINING =
        4,            /* an operator drained it: never offered work again until it re-registers */
    TIDE_WS_LEFT = 5, /* said bye: not a failure; hidden from status, forgotten after the
                         retention period */
} tide_wstate;

typedef enum tide_job_kind {
    TIDE_CJOB_ONLINE = 0,
    TIDE_CJOB_OFFLINE = 1,
} tide_job_kind;

typedef enum tide_jstate {
    TIDE_JS_RUNNING = 0,   /* online: training under its committed layout */
    TIDE_JS_RESIZING = 1,  /* online: a reconfiguration is pending */
    TIDE_JS_STALLED = 2,   /* online: lost workers and no layout fits the survivors */
    TIDE_JS_QUEUED = 3,    /* offline: waiting for an idle worker; online: for enough joins */
    TIDE_JS_ASSIGNED = 4,  /* offline: sent to a worker, running there */
    TIDE_JS_DONE = 5,      /* offline: finished successfully */
    TIDE_JS_FAILED = 6,    /* offline: failed max_attempts times */
    TIDE_JS_CANCELLED = 7, /* any: cancelled by an operator */
} tide_jstate;

typedef enum tide_offline_kind {
    TIDE_OFFLINE_COMMAND = 0, /* a child process on the worker's device */
    TIDE_OFFLINE_PLUGIN = 1,  /* an in-process tide_task.h plugin */
} tide_offline_kind;

/* Phase of a pending reconfiguration; see coordinator/reconf.h for the protocol. */
typedef enum tide_rphase {
    TIDE_RP_PREPARE = 0, /* collecting prepare_ack (current steps) from every participant */
    TIDE_RP_COMMIT = 1,  /* switch step decided and sent; collecting done reports */
} tide_rphase;

typedef struct tide_coord_worker {
    /* durable (mirrored in the store) */
    int32_t id;                     /* dense coordinator id, stable */
    char pool[TIDE_COORD_NAME_MAX]; /* worker pool (one mpirun launch) */
    int32_t rank;                   /* MPI rank in the pool: the id layouts use */
    char host[TIDE_COORD_HOST_MAX];
    int32_t device;  /* local device index; -1: host-memory worker */
    uint64_t memory; /* bytes of device memory */
    tide_wstate state;
    int64_t job;         /* online job holding it (0: none) */
    int64_t offline_job; /* offline job running on it (0: none) */
    int64_t joined;      /* online job whose program this process runs (0: none) */
    int32_t pool_size;   /* ranks in its pool */
    int32_t kind;        /* 0 cpu, 1 gpu (proto's device kind) */
    int32_t pid;
    char owner[TIDE_COORD_OWNER_MAX]; /* with --auth: the key that registered it ("worker:NAME");
                                         only that key may speak for this worker id */
    int64_t gone_ms;    /* wall ms when it failed or left (0 while alive): the retention clock */
    int64_t fenced_job; /* the online job it held a coordinate of (or took part in a switch of)
                           when it failed (0: none): that job goes on without it, so this
                           process is told it was fenced whenever it speaks again */
    /* volatile: rebuilt from heartbeats after a restart */
    uint64_t last_seen_ns;                 /* monotonic ns of the last message from it */
    int64_t step;                          /* steps the worker reported completed */
    uint64_t generation;                   /* generation it reported running */
    uint64_t bubble_ns;                    /* idle (bubble) time it reported, cumulative */
    uint64_t filled_ns;                    /* part of bubble_ns used by offline work, cumulative */
    uint64_t busy_ns;                      /* step time it reported, cumulative */
    double bubble_recent;                  /* share of its recent heartbeat intervals spent in
                                              bubbles, [0, 1] (moving average; decays while
                                              it takes no steps) */
    unsigned char rid[TIDE_COORD_RID_MAX]; /* routing id of its current connection */
    size_t rid_len;                        /* 0: no connection since tided started */
    int delim;                             /* its envelope has an empty delimiter frame */
    uint64_t last_hb_ns;                   /* monotonic ns of its previous heartbeat */
    uint64_t registered_ns; /* monotonic ns of its registration with this tided process
                               (0: before a restart) */
    int fence_told;         /* the worker_fenced event was recorded (once per tided process) */
    int32_t seen_prev, seen_next; /* 1 + id of its neighbours in the state's seen list, 0: none */
    int in_seen;                  /* on the seen list (see tide_coord_worker_seen) */
    uint64_t step_since_ns;       /* tided's monotonic ns its step in progress began (from
                                     its heartbeat; 0: outside a step), for stall.c */
    double step_ms_avg;           /* its recent step time, ms (moving average; 0: none yet) */
} tide_coord_worker_t;

#define TIDE_RECONF_REASON_MAX 640 /* bytes of a reconfiguration's reason, NUL included */

/* Pending reconfiguration of an online job (owned by the job). */
#define TIDE_COORD_CKPT_DIR_MAX 1024 /* bytes of a checkpoint directory (= proto text + 1) */
#define TIDE_COORD_CKPTS_MAX    8    /* complete checkpoints a job remembers (newest last) */

/* A complete checkpoint of an online job, as its publisher reported it ("saved"). */
typedef struct tide_coord_ckpt {
    int64_t step;
    char dir[TIDE_COORD_CKPT_DIR_MAX]; /* ROOT/step-<012 step> on the workers' file system */
} tide_coord_ckpt;

typedef struct tide_reconf {
    uint64_t gen; /* generation being installed */
    int recover;  /* 1: after a failure (switch step = min of reports) */
    tide_rphase phase;
    int64_t switch_step; /* COMMIT: steps completed under the old layout; new layout starts here */
    int switched;        /* COMMIT: some participant reported done: G can no longer be abandoned */
    tide_layout_t *layout; /* new layout (owned) */
    int32_t *parts;        /* participant ranks: old members (alive) then new-only ones, sorted */
    size_t n_parts;
    uint8_t *acked;       /* per participant: prepare_ack (PREPARE) or done (COMMIT) seen */
    int64_t *ack_step;    /* per participant: completed steps it reported in prepare_ack */
    uint8_t *old_member;  /* per participant: holds a coordinate of the old layout */
    uint8_t *gone;        /* per participant: failed; never waited for */
    int64_t started_ms;   /* wall clock when requested */
    uint64_t started_ns;  /* monotonic, for the duration metric (reset on reload) */
    uint64_t deadline_ns; /* monotonic: abort (fallback) when passed */
    uint64_t resend_ns;   /* monotonic: next retransmission of the phase message */
    char reason[TIDE_RECONF_REASON_MAX]; /* "resize by admin", "recovery: worker 7 failed; dp 2
                                            instead of 4: ..." */
    uint64_t planned_bytes;              /* bytes the reshard plan sends (0 when not estimated) */
    int join_pool;     /* index in the job's pools of the pool this generation connects,
                          -1 when none (not stored: a join tided restarts in is aborted) */
    int32_t *join_old; /* job ranks of the connected side taking part, sorted (owned) */
    size_t n_join_old;
    int32_t *join_new; /* job ranks of the joining pool taking part, sorted (owned) */
    size_t n_join_new;
    char port[1024];      /* the connected side's MPI port name, once sent ("" before) */
    uint32_t leave_pools; /* bit p: the job's pool p is released by this generation (its
                             launch leaves the job); 0 when none (not stored: recomputed
                             when tided restarts) */
    int32_t *stay;        /* live job ranks of the connected pools that stay, sorted (owned) */
    size_t n_stay;
    int32_t *leave; /* live job ranks of the released pools, sorted (owned) */
    size_t n_leave;
    uint64_t bytes_moved; /* bytes participants reported sending */
    double switch_ms_max; /* longest switch a participant reported (its training pause), ms */
    /* a recovery whose lost state no survivor holds: every member loads the job's last
       complete checkpoint (its directory, "" for any other generation) */
    char ckpt[TIDE_COORD_CKPT_DIR_MAX];
    int64_t ckpt_step; /* that checkpoint's step: the new layout's first step */
} tide_reconf_t;

#define TIDE_COORD_JOB_POOLS_MAX 16 /* pools (mpirun launches) one online job may span */

/* A pool of an online job: its ranks are job ranks [base, base + size). */
typedef struct tide_coord_job_pool {
    char name[TIDE_COORD_NAME_MAX];
    int32_t base;  /* job rank of its rank 0 */
    int32_t size;  /* ranks in the pool */
    int connected; /* shares the job's communicators: the launching pool, or a pool that
                      joined later once the generation connecting it committed */
    uint64_t left; /* the committed generation that released the pool (its launch left the
                      job: never placed or connected again); 0 while it has not left */
} tide_coord_job_pool;

/* Why the elastic policy leaves an online job alone (tide_coord_job_t.el_hold). */
enum {
    TIDE_EL_FREE = 0,     /* the policy may change it (within its bounds) */
    TIDE_EL_PINNED = 1,   /* tidectl pin: never touched until unpinned */
    TIDE_EL_OPERATOR = 2, /* an operator's resize is in force until tidectl bounds or unpin */
};

typedef struct tide_coord_job {
    int64_t id;
    char name[TIDE_COORD_NAME_MAX];
    tide_job_kind kind;
    tide_jstate state;
    int64_t created_ms;
    /* online */
    tide_coord_job_pool pools[TIDE_COORD_JOB_POOLS_MAX]; /* [0]: the launching pool */
    int n_pools;
    tide_layout_t *layout; /* committed layout (owned); worker ids are job ranks */
    uint64_t generation;   /* committed generation */
    uint64_t gen_issued;   /* largest generation ever issued (aborted ones are never reused) */
    int64_t step;          /* steps completed, from heartbeats */
    double throughput;     /* steps per wall-clock second between step boundaries (workers.c) */
    uint64_t speed_t0_ns;  /* volatile: start of the window throughput is measured over, */
    int64_t speed_step0;   /* and the job's step then */
    int req_dp, req_tp, req_pp, req_micro; /* initial layout asked for by join */
    int num_layers;                        /* layers of the model (from join) */
    uint64_t total_bytes;                  /* one replica of the job's state, bytes (from join) */
    uint8_t *join_blob;                    /* the first join message as received (tensors), owned */
    size_t join_len;
    tide_fit_rule fit[TIDE_FIT_RULES_MAX]; /* what layouts its program can run (from join) */
    int n_fit;                             /* rules in fit; 0: any layout the collection allows */
    tide_coord_ckpt *ckpts; /* complete checkpoints reported, oldest first (owned; NULL: none) */
    int n_ckpts;            /* entries in ckpts, [0, TIDE_COORD_CKPTS_MAX] */
    int64_t ckpt_agreed;    /* volatile: the furthest step a checkpoint request was agreed at
                               (checkpoint.c): the next one is asked at a step of its own */
    tide_reconf_t *reconf;  /* pending reconfiguration or NULL */
    int stall_told;         /* volatile: a stalled step was reported (stall.c), at... */
    uint64_t stall_gen;     /* ...this generation */
    int64_t stall_step;     /* ...and this step: reported once until either moves */
    int32_t joins;          /* volatile: workers that joined it, counted as they join (recounted at
                               load): its first layout is not tried before enough did */
    /* online, elastic (coordinator/elastic.h; priority below is its priority too) */
    int32_t el_min, el_max; /* bounds in GPUs; 0/0: the policy does not manage the job */
    int32_t el_hold;        /* TIDE_EL_* : why the policy leaves it alone */
    int64_t el_steps;       /* steps it runs in all (tidectl bounds --steps), 0: unknown */
    uint64_t el_last_ns;    /* volatile: monotonic ns of the policy's last change, 0: none */
    uint64_t el_gen;        /* volatile: the generation the policy's change issued, 0: none */
    uint64_t el_seen_gen;   /* volatile: the committed generation the policy last looked at */
    int32_t el_seen_dp;     /* volatile: its dp then */
    int32_t el_failed_from; /* volatile: dp before recoveries shrank it, 0: none */
    int32_t el_first_waits; /* volatile: 1 while its first layout waits for the policy (GPUs of
                               its ranks held by other jobs when they joined) */
    int32_t el_keep_pools;  /* volatile: 1 while the policy starts a yield: the switch releases
                               no pool (reconf.c), its idle ranks are what the job grows back onto */
    double el_step_s;       /* volatile: wall seconds per step between step boundaries as tided
                               saw them (switches included), 0: not measured yet */
    int64_t el_obs_step;    /* volatile: the step and the monotonic ns of the last sample */
    uint64_t el_obs_ns;
    /* offline */
    int32_t priority; /* higher runs first */
    tide_offline_kind okind;
    char plugin[TIDE_COORD_NAME_MAX]; /* plugin name ("" for commands) */
    char **argv; /* command line or plugin arguments (owned, each entry owned) */
    uint32_t argc;
    uint64_t mem_cap;     /* bytes, 0 = no cap */
    int bubbles;          /* may run inside pipeline bubbles */
    int32_t attempts;     /* times started (the attempt number of the latest run) */
    int32_t failures;     /* attempts that failed (the command's own failure: a nonzero exit,
                             or it could not start); preemptions, the worker leaving or
                             failing are not counted */
    int32_t max_attempts; /* give up after this many failures */
    int32_t worker;       /* coordinator worker id running it, -1 when none */
    int64_t grace_ms;     /* SIGTERM -> SIGKILL grace on preemption */
    uint64_t max_memory;  /* host memory of a command's attempt, bytes; 0: no limit */
    uint32_t max_procs;   /* processes of a command's attempt; 0: no limit */
    /* offline, volatile (a restart forgets them) */
    int32_t last_failed;  /* worker of the last failed attempt (tried last), -1 when none */
    uint64_t retry_at_ns; /* monotonic: not offered to a worker before (backoff), 0: now */
} tide_coord_job_t;

/* Buckets of the resize duration histogram; their bounds are in coordinator/metrics.c. */
#define TIDE_COORD_RESIZE_BUCKETS 12

/* Counters exported as metrics; monotonically increasing unless noted. */
typedef struct tide_coord_counters {
    uint64_t resizes_committed;
    uint64_t resizes_aborted;
    uint64_t recoveries;
    uint64_t resize_ns_sum;   /* ns, summed over committed resizes */
    uint64_t resize_ns_max;   /* ns, largest single resize */
    uint64_t resize_le[TIDE_COORD_RESIZE_BUCKETS]; /* committed resizes per duration bucket
                                                      (not cumulative; beyond the last: none) */
    uint64_t bytes_resharded; /* bytes, planned bytes_sent of committed resizes */
    uint64_t preemptions;
    uint64_t requests;
    uint64_t bad_requests;
    uint64_t denied;
    uint64_t heartbeats;     /* one per worker heartbeat, also those inside host heartbeats */
    uint64_t heartbeat_msgs; /* messages carrying heartbeats (heartbeat, host_heartbeat) */
    uint64_t clients_cut;    /* connections cut for what libzmq held of them (intake.c) */
} tide_coord_counters;

typedef struct tide_coord_state {
    tide_coord_worker_t *workers; /* index = worker id; a forgotten worker's slot is zeroed */
    size_t n_workers, cap_workers;
    int32_t next_worker_id; /* the id the next new worker gets: ids are never reused, so a
                               process tided forgot can never speak for a newer worker */
    tide_coord_job_t **jobs;
    size_t n_jobs, cap_jobs;
    int64_t next_job_id;
    int32_t *hash; /* open addressing over (pool, rank): worker id or -1 */
    size_t hash_cap;
    int32_t seen_head, seen_tail; /* 1 + id of the least / most recently seen worker, 0: none:
                                     workers in last_seen_ns order, so the failure scan reads
                                     only the expired ones, not the whole table */
    tide_coord_counters counters;
} tide_coord_state_t;

/* Static lower-case names ("idle", "online", ...); "?" when out of range; any thread. */
const char *tide_wstate_name(tide_wstate s);
const char *tide_jstate_name(tide_jstate s);

/* Creates an empty state; caller owns *out. */
tide_status tide_coord_state_new(tide_coord_state_t **out);

/* Frees *self_p (workers, jobs, layouts) and sets it to NULL; NULL is fine. */
void tide_coord_state_destroy(tide_coord_state_t **self_p);

/* Worker with (pool, rank), or NULL. O(1). */
tide_coord_worker_t *tide_coord_worker_find(tide_coord_state_t *st, const char *pool, int32_t rank);

/* w sent a message at monotonic time now: sets last_seen_ns and moves w to the end of the
   seen list (O(1) when now does not go back). Loop thread. */
void tide_coord_worker_seen(tide_coord_state_t *st, tide_coord_worker_t *w, uint64_t now);

/*
 * Failure detection over the seen list: writes into out (room for max) the ids of
 * registered workers, not failed or gone, whose last message is more than limit ns
 * older than now, oldest first, and takes them off the list (the caller declares them
 * failed; a message from one puts it back). Gone and forgotten workers met on the way
 * leave the list. O(workers returned), not O(workers): the scan stops at the first
 * worker seen recently.
 */
size_t tide_coord_workers_expired(tide_coord_state_t *st, uint64_t now, uint64_t limit,
                                  int32_t *out, size_t max);

/* Worker by coordinator id, or NULL when out of range or forgotten. */
tide_coord_worker_t *tide_coord_worker_get(tide_coord_state_t *st, int32_t id);

/* 1 when w failed or left: it holds nothing and is waited for by nobody. */
int tide_coord_worker_gone(const tide_coord_worker_t *w);

/* Forgets worker id: its slot is zeroed and (pool, rank) may register anew (with a new
   id; this one is never handed out again). No-op for an unknown id. */
void tide_coord_worker_remove(tide_coord_state_t *st, int32_t id);

/*
 * Adds a worker with the next id (next_worker_id; or id when >= 0, used by reload) for
 * (pool, rank); TIDE_ERR_EXISTS when that pair is known. The returned
 * pointer is valid until the next add (the array may move).
 */
tide_status tide_coord_worker_add(tide_coord_state_t *st, int32_t id, const char *pool,
                                  int32_t rank, tide_coord_worker_t **out);

/* Job by id or NULL. */
tide_coord_job_t *tide_coord_job_get(tide_coord_state_t *st, int64_t id);

/* Job by name (names are unique over all jobs) or NULL. */
tide_coord_job_t *tide_coord_job_by_name(tide_coord_state_t *st, const char *name);

/*
 * Adds a zeroed job with id (or the next id when id <= 0) and kind; the state
 * owns it. Stable pointer until tide_coord_job_remove.
 */
tide_status tide_coord_job_add(tide_coord_state_t *st, int64_t id, tide_job_kind kind,
                               tide_coord_job_t **out);

/*
 * New pending reconfiguration to layout (ownership moves in, also on failure)
 * at generation gen; participants are the ranks of old (when non-NULL) and of
 * layout, sorted, with old_member set for the former. Caller owns *out.
 */
tide_status tide_reconf_new(tide_reconf_t **out, const tide_layout_t *old, tide_layout_t *layout,
                            uint64_t gen, int recover);

/* Makes r the generation that connects job pool `pool`: old (n_old, sorted job ranks of
   the connected side) and new (n_new, the joining pool's) take part besides the layouts'
   participants. Copies both lists. */
tide_status tide_reconf_set_join(tide_reconf_t *r, int pool, const int32_t *old, size_t n_old,
                                 const int32_t *new_ranks, size_t n_new);

/* Makes r the generation that releases the job's pools in mask `pools` (bit p: pool p):
   stay (n_stay, sorted live job ranks of the connected pools that stay) and leave
   (n_leave, the released pools') take part besides the layouts' participants. Copies
   both lists. */
tide_status tide_reconf_set_leave(tide_reconf_t *r, uint32_t pools, const int32_t *stay,
                                  size_t n_stay, const int32_t *leave, size_t n_leave);

/* ---- a job's pools ----------------------------------------------------------------------- */

/* Index of pool `name` among j's pools, or -1. */
int tide_coord_job_pool_find(const tide_coord_job_t *j, const char *name);

/* w's job rank in j (its pool's base plus its rank), or -1 when its pool is not j's. */
int32_t tide_coord_job_rank(const tide_coord_job_t *j, const tide_coord_worker_t *w);

/* The pool index of job rank jrank (its rank in that pool in *rank), or -1. */
int tide_coord_job_locate(const tide_coord_job_t *j, int32_t jrank, int32_t *rank);

/* Job ranks of j: one past the last rank of its last pool (connected_only: of its
   connected pools). */
int32_t tide_coord_job_world(const tide_coord_job_t *j, int connected_only);

/* Appends pool `name` of `size` ranks after j's last pool; TIDE_ERR_RANGE when j spans
   TIDE_COORD_JOB_POOLS_MAX pools or the job ranks would pass the protocol's limit. */
tide_status tide_coord_job_add_pool(tide_coord_job_t *j, const char *name, int32_t size,
                                    int connected);

/* Records a complete checkpoint of j (step, dir): replaces one of the same step, keeps
   the newest TIDE_COORD_CKPTS_MAX by step. TIDE_ERR_NOMEM, or TIDE_ERR_INVALID for a dir
   that does not fit or holds a tab or newline. */
tide_status tide_coord_job_add_ckpt(tide_coord_job_t *j, int64_t step, const char *dir);

/* Forgets j's checkpoint of step `step` (one that failed to load); no-op when unknown. */
void tide_coord_job_drop_ckpt(tide_coord_job_t *j, int64_t step);

/* Index of rank among r's participants, or -1. O(log n). */
long tide_reconf_find(const tide_reconf_t *r, int32_t rank);

/* Frees a reconfiguration and sets *self_p to NULL; NULL is fine. */
void tide_reconf_destroy(tide_reconf_t **self_p);

/* ---- layouts (reshard's tide_layout_t: created with tide_layout_new, freed with
 *      tide_layout_destroy, checked with tide_layout_validate) ---------------------- */

/* True when rank appears in the layout. O(n). */
int tide_coord_layout_has(const tide_layout_t *l, int32_t rank);

#ifdef __cplusplus
}
#endif

#endif /* TIDE_COORD_STATE_H */
