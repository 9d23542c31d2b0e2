/*
 * coordinator/policy: tided's decisions as pure functions of their inputs (no
 * I/O, no clock reads: time comes in as arguments, so tests drive them with a
 * fake clock). Resize validation and placement, a job's first layout, recovery
 * layouts after failures (from replicas, or from a checkpoint) and whether the
 * survivors still hold the state, drain plans, backfilling idle workers with
 * offline work by priority, which worker's bubbles take a plugin, retry backoff,
 * preemption for online grows, the switch step of a reconfiguration and the step
 * of a requested checkpoint. The coordinator (tided) and benchmarks/cluster_sim
 * both decide through these. (Failure detection is the state's seen list:
 * tide_coord_workers_expired, driven by coordinator/liveness.c.)
 *
 * Workload: called on the event loop for each resize, failure or idle change;
 * pools of up to ~10^4 workers; everything here is O(n log n) in the pool size.
 */
#ifndef TIDE_COORD_POLICY_H
#define TIDE_COORD_POLICY_H

#include <stddef.h>
#include <stdint.h>

#include <tide/status.h>
#include "coordinator/state.h"
#include "reshard/reshard.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What a candidate worker is doing now; lower classes are taken first. */
typedef enum tide_pw_class {
    TIDE_PW_MEMBER = 0,  /* holds a coordinate of the job's current layout (alive) */
    TIDE_PW_IDLE = 1,    /* idle in the job's pool */
    TIDE_PW_OFFLINE = 2, /* runs offline work that would be preempted */
} tide_pw_class;

typedef struct tide_policy_worker {
    int32_t rank; /* pool rank: the id layouts use */
    int32_t host; /* host index; equal values mean the same host */
    tide_pw_class cls;
    int32_t priority; /* OFFLINE: priority of the work that would be preempted */
} tide_policy_worker;

typedef struct tide_resize_req {
    int dp, tp, pp;
    int num_layers;
    int micro_batches;
    const int *stage_start; /* pp + 1 starts, or NULL: the old stages when pp is unchanged,
                               else stages as even as possible */
    int plain; /* 1: `--placement default`: the plain rank order over the workers chosen by
                  preference, no byte minimisation */
    int tp_across_hosts;      /* 1: the job allows a TP group to span hosts; 0 (default): every
                                 TP group inside one host, or TIDE_ERR_NO_DEVICE */
    const tide_fit_rule *fit; /* the job's fit rules (what its program can run), borrowed;
                                 NULL: any layout */
    size_t n_fit;             /* rules in fit */
} tide_resize_req;

/*
 * The TP-inside-host rule: the largest dp <= want whose dp * pp TP groups of
 * tp workers fit in the candidates' hosts (a host of k candidates holds
 * k / tp groups), 0 when not even dp 1 fits. tp <= 1 constrains nothing
 * (returns want). O(n log n). Pure.
 */
int tide_policy_tp_fit_dp(const tide_policy_worker *cand, size_t n, int tp, int pp, int want);

/*
 * Chooses the workers and the map of a new layout for req from candidates and
 * writes the ranks whose offline work must be preempted into preempt[] (room
 * for n entries) and their count into *n_preempt. Workers: every member of
 * old and every idle candidate is offered; workers running offline work only
 * when those are too few, the lowest priorities first. Map: reshard's
 * tide_reshard_place over the offered workers and coll (the job's tensors, or
 * NULL: a stand-in with one TP-split tensor per layer): fewest bytes sent,
 * TP groups inside hosts unless req->tp_across_hosts (offline workers are
 * also offered when members and idle workers lack whole hosts; still too few:
 * TIDE_ERR_NO_DEVICE naming the room), pipeline neighbours close, old roles kept at equal
 * bytes (dropping replicas moves nothing; a recovery refills only lost
 * coordinates). req->plain: the first dp*tp*pp offered workers in preference
 * order (members, idle, offline; each by rank) mapped in rank order
 * (tide_reshard_place_default). old may be NULL (first layout).
 * A layout the job's program cannot run (req->fit, tide_fit_check) is
 * TIDE_ERR_INVALID naming the rule ("dp 3 does not divide 4 (the global batch
 * 16 / 4 micro-batches)"), whatever the candidates;
 * TIDE_ERR_NO_DEVICE with a detail when too few candidates exist; a collection
 * the new tp does not divide fails with reshard's detail. Caller owns *out
 * (tide_layout_destroy). Pure.
 */
tide_status tide_policy_place(const tide_layout_t *old, const tide_collection_t *coll,
                              const tide_resize_req *req, const tide_policy_worker *cand, size_t n,
                              tide_layout_t **out, int32_t *preempt, size_t *n_preempt);

/*
 * Recovery after losing workers: candidates hold the surviving members, idle
 * and offline workers of the pool. Keeps the old degrees when enough
 * candidates exist (replacing lost coordinates), else the largest dp with the
 * same tp and pp that the candidates hold, whose TP groups fit inside hosts
 * (tide_policy_tp_fit_dp) and that the job's program can run (fit, n_fit: its
 * rules; NULL: any); the remaining workers stay free for offline work. Placed
 * like tide_policy_place (coll as there). TIDE_ERR_NO_DEVICE when not even dp
 * 1 fits; TIDE_ERR_INVALID when the old tp or pp break the rules (no dp helps).
 * When dp shrinks, why (why_len bytes; may be NULL) gets the reasons and what
 * is left idle, for the event ("dp 2 instead of 4: the 3 available workers
 * hold at most dp 3; dp 3 does not divide 4 (the global batch 16 / 4
 * micro-batches); 1 worker left idle for offline work"), else "".
 * Caller owns *out. Pure.
 */
tide_status tide_policy_recover(const tide_layout_t *old, const tide_collection_t *coll,
                                const tide_fit_rule *fit, size_t n_fit,
                                const tide_policy_worker *cand, size_t n, tide_layout_t **out,
                                int32_t *preempt, size_t *n_preempt, char *why, size_t why_len);

/*
 * The fit rules' part of a dp choice: the largest dp <= want that the job's
 * program can run with tp, pp and micro micro-batches (tide_fit_check), 0 when none (then tp or pp
 * themselves break a rule). want <= 0 gives 0. Pure.
 */
int tide_policy_fit_dp(const tide_fit_rule *fit, size_t n_fit, int tp, int pp, int micro, int want);

/* One queued offline job as the backfill policy sees it. */
typedef struct tide_policy_offline {
    int64_t job;
    int32_t priority; /* higher first; ties by lower job id (submission order) */
    uint64_t mem_cap; /* bytes of device memory the job needs; 0 = no cap */
    int32_t avoid;    /* worker its last attempt failed on (taken only when no other
                         fits), -1 when none */
} tide_policy_offline;

/* An idle worker offered to offline work. */
typedef struct tide_policy_idle {
    int32_t worker;  /* coordinator worker id */
    uint64_t memory; /* bytes of device memory; 0 = unknown (fits any cap) */
} tide_policy_idle;

typedef struct tide_policy_assignment {
    int64_t job;
    int32_t worker; /* coordinator worker id */
} tide_policy_assignment;

/*
 * Pairs queued offline jobs (highest priority first) with idle workers: each
 * job takes the lowest-id idle worker whose memory holds its mem_cap, other
 * than the one its last attempt failed on unless no other fits; a job that
 * fits on no idle worker waits and does not hold back lower-priority jobs that
 * fit. Writes the pairs to out (room for min(nq, ni)) and their count to
 * *n_out. Pure.
 */
tide_status tide_policy_assign(const tide_policy_offline *queued, size_t nq,
                               const tide_policy_idle *idle, size_t ni, tide_policy_assignment *out,
                               size_t *n_out);

/*
 * The step at which a reconfiguration switches, from the completed-step counts
 * participants reported in prepare_ack (only the counts of old members not gone
 * matter; gone may be NULL: none):
 * normal: max + 1 (each participant may finish at most one more step after its
 * ack, so no one has passed it); recovery: min (survivors stopped training,
 * the job resumes from the state every survivor has). -1 when no old member
 * reported. Pure.
 */
int64_t tide_policy_switch_step(const int64_t *steps, const uint8_t *old_member,
                                const uint8_t *gone, size_t n, int recover);

/*
 * A drain: the layout old without the worker of rank `drained`, chosen from the other
 * candidates by recovery's rules (tide_policy_recover: the same degrees when another
 * worker can take the coordinate, else the largest dp the rest hold and the program can
 * run). Outputs as tide_policy_recover. Pure.
 */
tide_status tide_policy_drain(const tide_layout_t *old, const tide_collection_t *coll,
                              const tide_fit_rule *fit, size_t n_fit,
                              const tide_policy_worker *cand, size_t n, int32_t drained,
                              tide_layout_t **out, int32_t *preempt, size_t *n_preempt, char *why,
                              size_t why_len);

/* What tide_policy_first_layout decided. */
typedef enum tide_policy_first {
    TIDE_FIRST_WAIT = 0,   /* too few idle ranks yet (or no layout fits them): wait for joins */
    TIDE_FIRST_PLACED = 1, /* *out holds the first layout */
    TIDE_FIRST_REFUSE = 2, /* every rank of the launch joined, and their hosts cannot hold the
                              layout's TP groups each inside one host: *fit_dp replicas at most */
} tide_policy_first;

/*
 * A job's first layout (req) over the ranks of its launch: cand is compacted in place to
 * the idle candidates and those running offline work (preempted for the job), *n to their
 * count. Too few: TIDE_FIRST_WAIT. As many as the launch has (launch_size) and their hosts
 * cannot hold req->dp replicas of TP groups inside hosts: TIDE_FIRST_REFUSE (more ranks
 * never come, and a TP group across hosts runs its collectives over the network). Else
 * placed like tide_policy_place (old NULL): TIDE_FIRST_PLACED, or placement's error with
 * TIDE_FIRST_WAIT. Caller owns *out. Pure.
 */
tide_status tide_policy_first_layout(const tide_collection_t *coll, const tide_resize_req *req,
                                     tide_policy_worker *cand, size_t *n, int32_t launch_size,
                                     tide_layout_t **out, int32_t *preempt, size_t *n_preempt,
                                     tide_policy_first *verdict, int *fit_dp);

/*
 * A layout for a rollback to a checkpoint when the candidates cannot hold old's tp and
 * pp: the checkpoint loads into any degrees, so the largest job (then the widest tp, then
 * the most stages) the candidates can run and the program allows (fit), tp a divisor of
 * old's. Outputs like tide_policy_recover; why gets what changed. TIDE_ERR_NO_DEVICE when
 * none fits (at most 256 placements are tried). Pure.
 */
tide_status tide_policy_rollback(const tide_layout_t *old, const tide_collection_t *coll,
                                 const tide_fit_rule *fit, size_t n_fit,
                                 const tide_policy_worker *cand, size_t n, tide_layout_t **out,
                                 int32_t *preempt, size_t *n_preempt, char *why, size_t why_len);

/*
 * Whether every byte of the state a recovery layout needs still has a live holder: the
 * plan the workers will compute (tide_reshard_plan_totals) from old, whose coordinate i
 * lost its worker where dead[i], to `to` (both naming workers by the same ids). With to
 * NULL: whether any layout could be rebuilt, however many workers join (old with each dead
 * coordinate given a new worker). A job whose lost state had no replica (dp 1, pp stages
 * on a lost host, ZeRO-1 moments) cannot be recovered from replicas: TIDE_ERR_NO_HOLDER
 * with the plan's detail (naming the dead worker a new one would replace). Pure.
 */
tide_status tide_policy_recovery_feasible(const tide_layout_t *old, const uint8_t *dead,
                                          const tide_layout_t *to, const tide_collection_t *coll);

/* An online worker that could run a --bubbles plugin job inside its pipeline bubbles. */
typedef struct tide_policy_bubbles {
    int32_t worker;     /* coordinator worker id */
    uint64_t bubble_ns; /* bubble time it reported, cumulative */
    uint64_t busy_ns;   /* step time it reported, cumulative */
} tide_policy_bubbles;

/* Index of the worker whose measured bubble share (bubble / busy time) is largest, the
 * first on ties; -1 when none has measured both. Pure. */
long tide_policy_bubble_pick(const tide_policy_bubbles *w, size_t n);

/* Wait before an offline job's retry after its failures-th failure: base_ms doubled per
 * earlier failure, at most 60 s (ms). Pure. */
int64_t tide_policy_retry_backoff_ms(int64_t base_ms, int32_t failures);

/* The step a requested checkpoint is taken at: one no member has reached, the furthest
 * one reported (furthest) plus the steps the members may run before the request reaches
 * them (a few heartbeat periods at steps_per_s). Pure. */
int64_t tide_policy_ckpt_step(int64_t furthest, double steps_per_s, int64_t heartbeat_ms);

#ifdef __cplusplus
}
#endif

#endif /* TIDE_COORD_POLICY_H */
