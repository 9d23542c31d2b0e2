/*
 * coordinator/elastic_int: what the elastic policy's files share (elastic.c: a run, one
 * job's decision; elastic_yield.c: lower priorities giving GPUs to a higher one;
 * elastic_run.c: the working copy and what both use). Nothing outside coordinator/elastic*.c includes it.
 */
#ifndef TIDE_COORD_ELASTIC_INT_H
#define TIDE_COORD_ELASTIC_INT_H

#include "core/error.h"
#include "coordinator/elastic.h"
#include "coordinator/policy.h"

#define HOLD_NONE    (-1) /* hold_for: anyone may take the GPU */
#define HOLD_PENDING (-2) /* hold_for: released by a change of this run, free once it commits */

/* A run's working state. */
typedef struct tide__elastic_run {
    const tide_elastic_cfg *cfg;
    const tide_elastic_job *jobs;
    size_t nj;
    const tide_elastic_gpu *gpus;
    size_t ng;
    double now;
    tide_elastic_plan *plan;
    int32_t *owner;    /* per GPU: index of the job whose layout holds it, -1 none */
    int32_t *avail;    /* per GPU: working tide_elastic_gpu_state */
    int32_t *hold_for; /* per GPU: HOLD_NONE, HOLD_PENDING, or the job index it is kept for */
    int32_t *from_job; /* per GPU: job that yielded it in this run (-1: none) */
    uint32_t *stamp;   /* per GPU: dedup of candidates, epoch-marked */
    uint32_t epoch;
    int *lo, *hi, *cur;        /* per job: dp bounds and dp after this run's decisions (0: none) */
    const tide_layout_t **lay; /* per job: its layout after this run's decisions so far */
    uint8_t *frozen;           /* per job: pinned, operator-held, busy, or a member GPU down */
    uint8_t *changed;          /* per job: 1 decided in this run, 2 yielded (and may yield more) */
    size_t base;               /* the plan's first decision of this run */
    size_t *order;             /* jobs, highest priority first */
    tide_policy_worker *cand;  /* candidates of the job being decided */
    int32_t *cand_gpu;         /* GPU of each candidate */
    size_t n_cand;
} run;

/* Sorting record for trimming and for choosing what a yielding job gives up. */
typedef struct host_key {
    int32_t idx; /* candidate or member index */
    int32_t host;
    int64_t score; /* larger first */
    int64_t tie;   /* then smaller first */
} host_key;

/* Drops the decisions of plan from index mark on. */
void tide__elastic_plan_truncate(tide_elastic_plan *plan, size_t mark);
/* Trims j's candidates to those a layout of dp takes first (a few hosts more than needed). */
tide_status tide__elastic_trim_cands(run *r, size_t j, int dp);
/* The GPU of job rank `rank` of job j, -1 when it has none. */
int32_t tide__elastic_gpu_of(const run *r, const tide_elastic_job *j, int32_t rank);
/* Ranks job j has (its rank_gpu's entries, or every GPU). */
size_t tide__elastic_ranks_of(const run *r, const tide_elastic_job *j);
/* 1 when job j changed less than the interval ago. */
int tide__elastic_limited(const run *r, size_t j);
/* A fresh stamp epoch (r->stamp marks are then all stale). */
void tide__elastic_next_epoch(run *r);
/* j's candidates into r->cand / r->cand_gpu: its layout's GPUs, free GPUs and offline work
   nobody else is kept for (members_only: its layout's GPUs only). */
void tide__elastic_build_cands(run *r, size_t j, int members_only);
/* The largest dp <= want j's candidates hold (TP groups inside hosts, fit rules), 0: none. */
int tide__elastic_feasible(const run *r, size_t j, int want);
/* Sets each key's score to base x the keys on its host plus its own (sorts by host). */
void tide__elastic_score_by_host(host_key *k, size_t n, int64_t base);
/* qsort order: score descending, then host, then tie ascending. */
int tide__elastic_cmp_score(const void *a, const void *b);
/* Places j at dp over cand[0..n) with tide_policy_place; caller owns *out. */
tide_status tide__elastic_place(const run *r, size_t j, int dp, const tide_policy_worker *cand,
                                size_t n, tide_layout_t **out, int32_t *pre, size_t *n_pre);
/* The dry-run estimate of j's switch to nl into d's downtime_s, bytes_sent, max_send. */
void tide__elastic_estimate(const run *r, size_t j, const tide_layout_t *nl,
                            tide_elastic_decision *d);
/* Records j's change to *nl (taken over) and applies it to the working copy. */
tide_status tide__elastic_emit(run *r, size_t j, int32_t rule, tide_layout_t **nl,
                               const int32_t *pre, size_t n_pre, tide_elastic_decision **out);
/* Undoes the yields from plan index mark on. */
void tide__elastic_undo_yields(run *r, size_t mark);
/* Appends to d->why: printf text; a GPU list by host; the "rule dp a -> b (...)" head. */
void tide__elastic_why_add(tide_elastic_decision *d, const char *fmt, ...) TIDE_PRINTF(2, 3);
void tide__elastic_why_hosts(const run *r, tide_elastic_decision *d, const int32_t *g, size_t n);
void tide__elastic_why_head(const run *r, size_t j, tide_elastic_decision *d);
/* Takes GPUs for j (short of dp want; *fd reachable now) from lower priorities
   (elastic_yield.c); raises *fd. */
tide_status tide__elastic_take_from_lower(run *r, size_t j, int want, int *fd);

#endif /* TIDE_COORD_ELASTIC_INT_H */
