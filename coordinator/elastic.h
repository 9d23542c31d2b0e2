/*
 * coordinator/elastic: the elastic policy, tided's automatic grow / shrink / share
 * decisions as one pure function of the cluster (no I/O, no clock reads: time comes
 * in as an argument, so tests and cluster_sim drive it with a fake clock).
 *
 * Each online job declares the range it can run in (minimum and maximum GPUs, with
 * its fit rules) and a priority. A run of the policy looks at every job and every
 * GPU and decides, highest priority first:
 *   - a job with no layout starts at the largest dp its bounds and the free GPUs
 *     allow (at least its minimum, else it waits);
 *   - a job below its maximum grows onto idle or joining GPUs, then onto GPUs that
 *     run offline work (offline work yields first), then onto GPUs of lower-priority
 *     jobs, which shrink ("yield") but never below their minimum;
 *   - a job above its maximum (its bounds were lowered) shrinks to it;
 *   - a grow toward the size failures shrank a job from is a re-grow: it happens as
 *     soon as the capacity is back, under the same rate limit as any other grow.
 * Rate limits: a job is changed by the policy at most once per min_interval_s (its
 * failures' recoveries are not policy changes and do not count; a job with no layout
 * starts whenever it can; a lowered maximum applies at once), and it grows only
 * when the time the grow saves over its remaining steps beats gain_margin times the
 * predicted downtime (the dry-run estimate: the reshard plan's busiest worker over the
 * link, plus a fixed switch cost), the downtime of the jobs that yield to it weighed by
 * their GPUs against its own (GPU-seconds lost against GPU-seconds gained). A pinned job, a job an operator resized (the
 * operator's size is in force), and a job inside a reconfiguration are never touched.
 * Capacity a rate-limited higher-priority job could take is held back from lower
 * ones in the same run, so that they do not grow only to yield it soon after.
 *
 * The policy keeps tp and pp of every job and changes dp; placement is
 * tide_policy_place's (TP groups inside hosts, fit rules, fewest bytes moved).
 * Every decision carries its reason as data (rule, GPUs taken and released by
 * source, the estimate) and as text, for its event.
 *
 * Workload: tided runs it when GPUs become idle, join, fail or a job ends; up to
 * ~10^4 GPUs and ~10^2 jobs; cost O(jobs x GPUs) plus one placement and one plan
 * estimate per job that changes (goal: under 100 ms p99 at 10,000 GPUs).
 */
#ifndef TIDE_COORD_ELASTIC_H
#define TIDE_COORD_ELASTIC_H

#include <stddef.h>
#include <stdint.h>

#include <tide/status.h>
#include "reshard/reshard.h"

#ifdef __cplusplus
extern "C" {
#endif

#define TIDE_ELASTIC_PRIORITY_MIN 0   /* lowest online priority a job may declare */
#define TIDE_ELASTIC_PRIORITY_MAX 100 /* highest */
#define TIDE_ELASTIC_WHY_MAX      512 /* bytes of a decision's text, NUL included */

/* What a GPU is doing as the policy sees it. */
typedef enum tide_elastic_gpu_state {
    TIDE_EG_FREE = 0,    /* up and idle: no job holds it, no offline work runs on it */
    TIDE_EG_OFFLINE = 1, /* runs offline work (preempted when an online job takes it) */
    TIDE_EG_HELD = 2,    /* held: by the job whose layout maps a rank to it, or by work the
                            policy does not manage when no job's layout does */
    TIDE_EG_DOWN = 3,    /* failed, unreachable or drained */
} tide_elastic_gpu_state;

/* One GPU of the cluster; its index in the array is its id. */
typedef struct tide_elastic_gpu {
    int32_t host;             /* host index, >= 0; equal values mean the same host */
    int32_t state;            /* tide_elastic_gpu_state */
    int32_t offline_priority; /* OFFLINE: priority of the offline work on it */
    int32_t joining;          /* 1: it just joined (a pool launched, a host came back) */
} tide_elastic_gpu;

/* One online job as the policy sees it. Pointers are borrowed for the call. */
typedef struct tide_elastic_job {
    int64_t id;
    int32_t priority;              /* TIDE_ELASTIC_PRIORITY_MIN..MAX; higher wins */
    int32_t min_gpus, max_gpus;    /* bounds: dp * tp * pp stays inside [min, max] */
    int tp, pp, micro, num_layers; /* the job's other degrees, micro-batches and layers */
    const tide_fit_rule *fit;      /* what its program can run (may be NULL) */
    size_t n_fit;                  /* rules in fit */
    const tide_layout_t *layout;   /* current layout, worker ids are job ranks; NULL: the
                                      job has not started */
    const tide_collection_t *coll; /* its tensors, for placement and the estimate (NULL:
                                      a stand-in and state_bytes) */
    uint64_t state_bytes;          /* one replica of its state (bytes), when coll is NULL */
    const int32_t *rank_gpu;       /* GPU of each job rank (n_ranks entries, -1: none);
                                      NULL: rank r is GPU r, any GPU */
    size_t n_ranks;
    int64_t steps_left;     /* steps to go; <= 0: unknown (the gain is not checked) */
    double step_s;          /* seconds per step at its current layout; <= 0: unknown */
    double last_change_s;   /* time of its last policy change; < 0: none */
    int32_t failed_from_dp; /* dp before failures shrank it, 0: none */
    int32_t pinned;         /* 1: the policy never changes it */
    int32_t operator_hold;  /* 1: an operator's resize is in force */
    int32_t busy;           /* 1: inside a reconfiguration or recovery */
} tide_elastic_job;

/* The policy's settings (tide_elastic_cfg_default gives tided's defaults). */
typedef struct tide_elastic_cfg {
    double min_interval_s;   /* least time between two policy changes of one job (s) */
    double gain_margin;      /* a grow needs saved time > margin x predicted downtime */
    double switch_s;         /* fixed cost of a switch: agreement, communicators (s) */
    double link_bytes_per_s; /* per-worker reshard bandwidth (bytes/s), > 0 */
    double scaling;          /* share of linear speed-up a larger dp gives, (0, 1] */
} tide_elastic_cfg;

typedef enum tide_elastic_rule {
    TIDE_ELASTIC_START = 0,  /* the job's first layout, within its bounds */
    TIDE_ELASTIC_GROW = 1,   /* toward its maximum onto idle, joining or offline GPUs */
    TIDE_ELASTIC_REGROW = 2, /* back toward the size failures shrank it from */
    TIDE_ELASTIC_YIELD = 3,  /* shrinks so that a higher-priority job gets GPUs */
    TIDE_ELASTIC_BOUNDS = 4, /* shrinks to its (lowered) maximum */
} tide_elastic_rule;

/* One change the policy decided, with its reason. */
typedef struct tide_elastic_decision {
    int64_t job;           /* the job's id */
    size_t index;          /* its index in the jobs array */
    int32_t rule;          /* tide_elastic_rule */
    int old_dp, new_dp;    /* old_dp 0 for START */
    tide_layout_t *layout; /* the new layout (owned; worker ids are job ranks) */
    int32_t *preempt;      /* job ranks whose GPU runs offline work to preempt (owned) */
    size_t n_preempt;
    int32_t *gained; /* GPUs it takes, ascending (owned) */
    size_t n_gained;
    int32_t *released; /* GPUs it gives up, ascending (owned) */
    size_t n_released;
    size_t from_idle, from_joining, from_offline, from_jobs; /* gained, by source */
    int64_t for_job;                /* YIELD: the job the GPUs go to; else -1 */
    int32_t waits;                  /* 1: start only after the plan's earlier YIELDs committed */
    double downtime_s;              /* predicted downtime (0 for START) */
    double gain_s;                  /* predicted time saved over the remaining steps (grows) */
    uint64_t bytes_sent, max_send;  /* the plan estimate behind downtime_s */
    char why[TIDE_ELASTIC_WHY_MAX]; /* the reason as text for the event */
} tide_elastic_decision;

/*
 * A run's decisions, in the order to start them: yields before the grow they serve; a job
 * that yields to several higher jobs has one YIELD per beneficiary in a row, each from the
 * layout of the one before (old_dp is the previous one's new_dp).
 */
typedef struct tide_elastic_plan {
    tide_elastic_decision *d;
    size_t n;
    size_t cap;
} tide_elastic_plan;

/* Static lower-case name of a rule ("start", "grow", ...), "?" when out of range. */
const char *tide_elastic_rule_name(int32_t rule);

/* tided's defaults: 300 s apart, margin 2, switch 2 s, 25 GB/s, scaling 0.9. Pure. */
tide_elastic_cfg tide_elastic_cfg_default(void);

/*
 * Checks a job's declaration: priority in range, 1 <= min_gpus <= max_gpus, tp, pp,
 * micro and layers >= 1, well-formed fit rules, and some dp with min <= dp*tp*pp <= max
 * that the fit rules allow. TIDE_ERR_INVALID naming what is wrong ("min 12 GPUs is above
 * max 8", "no layout of 4-6 GPUs fits: tp 2 x pp 2 = 4 GPUs per replica, and dp 1 breaks
 * a rule: ..."), else TIDE_OK with the dp range into *lo, *hi (either may be NULL). Pure.
 */
tide_status tide_elastic_check(const tide_elastic_job *job, int *lo, int *hi);

/*
 * One run of the policy at time now_s over jobs[0..n_jobs) and gpus[0..n_gpus): appends
 * its decisions to *plan (caller-owned storage, tide_elastic_plan_clear frees them).
 * TIDE_ERR_INVALID when a job's declaration is bad (tide_elastic_check's reason, with
 * the job), a layout maps a rank to no GPU or to a GPU another job's layout holds, or
 * cfg is out of range; nothing is appended then. TIDE_ERR_NOMEM on allocation failure.
 * Pure; any thread.
 */
tide_status tide_elastic_decide(const tide_elastic_cfg *cfg, const tide_elastic_job *jobs,
                                size_t n_jobs, const tide_elastic_gpu *gpus, size_t n_gpus,
                                double now_s, tide_elastic_plan *plan);

/* Frees every decision of plan and empties it; safe on an empty plan. */
void tide_elastic_plan_clear(tide_elastic_plan *plan);

#ifdef __cplusplus
}
#endif

#endif /* TIDE_COORD_ELASTIC_H */
