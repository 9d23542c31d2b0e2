/*
 * coordinator/elastic: the elastic policy (see elastic.h). One run walks the jobs from
 * the highest priority down over a working copy of who holds which GPU: each job's
 * decision changes the copy, so a lower-priority job only sees what the higher ones
 * left. A grow that needs GPUs of lower-priority jobs shrinks them first ("yields",
 * tentative), and all of it is undone when the grow does not pay for its downtime.
 * Placement is tide_policy_place's; the downtime estimate is the reshard plan's
 * totals, as tided's --dry-run computes them.
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "core/sort.h"
#include "coordinator/elastic_int.h"

tide_elastic_cfg tide_elastic_cfg_default(void)
{
    return (tide_elastic_cfg){.min_interval_s = 300.0,
                              .gain_margin = 2.0,
                              .switch_s = 2.0,
                              .link_bytes_per_s = 25e9,
                              .scaling = 0.9};
}

/* ---- declarations ------------------------------------------------------------------------ */

tide_status tide_elastic_check(const tide_elastic_job *job, int *lo, int *hi)
{
    const tide_elastic_job *j = job;
    if (j->priority < TIDE_ELASTIC_PRIORITY_MIN || j->priority > TIDE_ELASTIC_PRIORITY_MAX)
        return tide_errorf(TIDE_ERR_INVALID, "priority %d is out of range %d-%d", j->priority,
                           TIDE_ELASTIC_PRIORITY_MIN, TIDE_ELASTIC_PRIORITY_MAX);
    if (j->min_gpus < 1)
        return tide_errorf(TIDE_ERR_INVALID, "min %d GPUs is below 1", j->min_gpus);
    if (j->min_gpus > j->max_gpus)
        return tide_errorf(TIDE_ERR_INVALID, "min %d GPUs is above max %d", j->min_gpus,
                           j->max_gpus);
    if (j->tp < 1 || j->pp < 1 || j->micro < 1 || j->num_layers < 1)
        return tide_errorf(TIDE_ERR_INVALID,
                           "tp %d, pp %d, %d micro-batches and %d layers must each be >= 1", j->tp,
                           j->pp, j->micro, j->num_layers);
    long g = (long)j->tp * j->pp;
    long dlo = (j->min_gpus + g - 1) / g, dhi = j->max_gpus / g;
    if (dhi < dlo)
        return tide_errorf(TIDE_ERR_INVALID,
                           "no layout of %d-%d GPUs exists: a replica is tp %d x pp %d = %ld GPUs",
                           j->min_gpus, j->max_gpus, j->tp, j->pp, g);
    int first = 0, last = 0;
    for (long d = dlo; d <= dhi; d++)
        if (tide_fit_check(j->fit, j->n_fit, (int)d, j->tp, j->pp, j->micro) == TIDE_OK) {
            first = first ? first : (int)d;
            last = (int)d;
        }
    if (first == 0) {
        /* the reason of the smallest dp in range: the rule every size breaks, or a bad rule */
        tide_fit_check(j->fit, j->n_fit, (int)dlo, j->tp, j->pp, j->micro);
        return tide_errorf(TIDE_ERR_INVALID,
                           "no layout of %d-%d GPUs fits the program's rules (dp %ld-%ld of tp "
                           "%d x pp %d, %d micro-batches): %s",
                           j->min_gpus, j->max_gpus, dlo, dhi, j->tp, j->pp, j->micro,
                           tide_last_error());
    }
    if (lo != NULL)
        *lo = first;
    if (hi != NULL)
        *hi = last;
    return TIDE_OK;
}

void tide_elastic_plan_clear(tide_elastic_plan *plan)
{
    for (size_t i = 0; i < plan->n; i++) {
        tide_layout_destroy(&plan->d[i].layout);
        tide_free(plan->d[i].preempt);
        tide_free(plan->d[i].gained);
        tide_free(plan->d[i].released);
    }
    tide_free(plan->d);
    memset(plan, 0, sizeof *plan);
}

/* Time j saves over its remaining steps going from dp `from` to `to` (a larger dp gives
   `scaling` of the linear speed-up); INFINITY when its steps or step time are unknown. */
static double gain_s(const run *r, size_t j, int from, int to)
{
    const tide_elastic_job *jb = &r->jobs[j];
    if (jb->steps_left <= 0 || jb->step_s <= 0 || from <= 0)
        return INFINITY;
    double speed = 1.0 + ((double)to / from - 1.0) * r->cfg->scaling;
    return (double)jb->steps_left * (jb->step_s - jb->step_s / speed);
}

/* ---- one job's decision -------------------------------------------------------------------- */

/* The dp j reaches now with every source (yields appended from plan index `mark` on),
   placed; *nl NULL when it cannot reach beyond where it is. */
static tide_status reach(run *r, size_t j, tide_layout_t **nl, int32_t *pre, size_t *n_pre)
{
    int cur = r->cur[j], want = r->hi[j];
    *nl = NULL;
    tide__elastic_build_cands(r, j, 0);
    int fd = tide__elastic_feasible(r, j, want);
    if (fd < want)
        TIDE_CHECK(tide__elastic_take_from_lower(r, j, want, &fd));
    if (fd < (cur > 0 ? cur + 1 : r->lo[j]))
        return TIDE_OK;
    TIDE_CHECK(tide__elastic_trim_cands(r, j, fd));
    if (tide__elastic_place(r, j, fd, r->cand, r->n_cand, nl, pre, n_pre) != TIDE_OK)
        *nl = NULL; /* what the candidates hold on paper and placement disagree: no change */
    return TIDE_OK;
}

/* Starts or grows j toward its maximum, when a grow saves more than it costs. */
static tide_status grow(run *r, size_t j)
{
    const tide_elastic_job *jb = &r->jobs[j];
    size_t mark = r->plan->n, n_pre = 0;
    tide_layout_t *nl = NULL;
    tide_elastic_decision est, *d = NULL;
    int32_t *pre = tide_malloc(r->ng * sizeof *pre);
    tide_status rc = TIDE_OK;
    TIDE_CHECK_ALLOC_GOTO(pre, rc, out);
    TIDE_CHECK_GOTO(reach(r, j, &nl, pre, &n_pre), rc, out);
    if (nl == NULL)
        goto undo;
    memset(&est, 0, sizeof est);
    tide__elastic_estimate(r, j, nl, &est);
    /* the yields' downtime weighs by their GPUs against the grown job's: GPU-seconds lost
       against GPU-seconds gained */
    double down = est.downtime_s, gain = gain_s(r, j, r->cur[j], nl->dp);
    for (size_t i = mark; i < r->plan->n; i++)
        down += r->plan->d[i].downtime_s * (double)tide_layout_size(r->plan->d[i].layout) /
                (double)tide_layout_size(nl);
    if (jb->layout != NULL && gain <= r->cfg->gain_margin * down)
        goto undo;
    int32_t rule = jb->layout == NULL               ? TIDE_ELASTIC_START
                   : jb->failed_from_dp > r->cur[j] ? TIDE_ELASTIC_REGROW
                                                    : TIDE_ELASTIC_GROW;
    int waits = r->plan->n > mark;
    TIDE_CHECK_GOTO(tide__elastic_emit(r, j, rule, &nl, pre, n_pre, &d), rc, out);
    d->waits = waits;
    d->downtime_s = est.downtime_s;
    d->bytes_sent = est.bytes_sent;
    d->max_send = est.max_send;
    d->gain_s = isinf(gain) ? -1.0 : gain;
    tide__elastic_why_head(r, j, d);
    tide__elastic_why_add(d, ": +%zu GPUs (", d->n_gained);
    tide__elastic_why_hosts(r, d, d->gained, d->n_gained);
    tide__elastic_why_add(
        d, "; %zu idle, %zu joining, %zu offline work preempted, %zu from lower priorities)",
        d->from_idle, d->from_joining, d->from_offline, d->from_jobs);
    if (jb->layout != NULL && isinf(gain))
        tide__elastic_why_add(d, "; est. %.2f s down (%llu bytes), remaining steps unknown",
                              d->downtime_s, (unsigned long long)d->bytes_sent);
    else if (jb->layout != NULL)
        tide__elastic_why_add(d, "; est. %.2f s down (%llu bytes) vs %.0f s saved over %lld steps",
                              d->downtime_s, (unsigned long long)d->bytes_sent, gain,
                              (long long)jb->steps_left);
    goto out;
undo:
    tide__elastic_undo_yields(r, mark);
out:
    tide_layout_destroy(&nl);
    tide_free(pre);
    return rc;
}

/*
 * j may not change yet (its interval): holds back the free and offline GPUs it could grow
 * onto, whole TP groups per host, so that lower priorities do not grow onto them only to
 * yield them when j's interval ends. Offline work keeps running on them meanwhile.
 */
static tide_status hold_back(run *r, size_t j)
{
    const tide_elastic_job *jb = &r->jobs[j];
    tide__elastic_build_cands(r, j, 0);
    int fd = tide__elastic_feasible(r, j, r->hi[j]);
    if (fd <= r->cur[j])
        return TIDE_OK;
    host_key *k = tide_malloc((r->n_cand ? r->n_cand : 1) * sizeof *k);
    if (k == NULL)
        return tide_errorf(TIDE_ERR_NOMEM, "out of memory holding GPUs back for job %lld",
                           (long long)jb->id);
    size_t n = 0;
    for (size_t i = 0; i < r->n_cand; i++)
        if (r->cand[i].cls != TIDE_PW_MEMBER)
            k[n++] = (host_key){(int32_t)i, r->cand[i].host, 0, r->cand[i].cls};
    tide__elastic_score_by_host(k, n, 1);
    qsort(k, n, sizeof *k, tide__elastic_cmp_score);
    long need = (long)(fd - r->cur[j]) * jb->tp * jb->pp;
    for (size_t i = 0, start = 0; i < n && need > 0; i++) {
        if (i + 1 < n && k[i + 1].host == k[i].host)
            continue;
        /* host k[start..i]: its whole TP groups */
        size_t take = (i + 1 - start) / (size_t)jb->tp * (size_t)jb->tp;
        for (size_t x = start; x < start + take && need > 0; x++, need--)
            r->hold_for[r->cand_gpu[k[x].idx]] = (int32_t)j;
        start = i + 1;
    }
    tide_free(k);
    return TIDE_OK;
}

/* j is above its (lowered) maximum: shrinks to the largest dp within it, over its GPUs. */
static tide_status to_bounds(run *r, size_t j)
{
    size_t n_pre = 0;
    tide_layout_t *nl = NULL;
    tide_elastic_decision *d = NULL;
    tide__elastic_build_cands(r, j, 1);
    int fd = tide__elastic_feasible(r, j, r->hi[j]);
    if (fd < r->lo[j])
        return TIDE_OK; /* its own GPUs hold no layout in its bounds: recovery's business */
    int32_t *pre = tide_malloc((r->n_cand ? r->n_cand : 1) * sizeof *pre);
    if (pre == NULL)
        return tide_errorf(TIDE_ERR_NOMEM, "out of memory shrinking job %lld",
                           (long long)r->jobs[j].id);
    tide_status rc = TIDE_OK;
    if (tide__elastic_place(r, j, fd, r->cand, r->n_cand, &nl, pre, &n_pre) == TIDE_OK) {
        rc = tide__elastic_emit(r, j, TIDE_ELASTIC_BOUNDS, &nl, pre, n_pre, &d);
        if (rc == TIDE_OK) {
            tide__elastic_estimate(r, j, d->layout, d);
            tide__elastic_why_head(r, j, d);
            tide__elastic_why_add(d, ": -%zu GPUs (", d->n_released);
            tide__elastic_why_hosts(r, d, d->released, d->n_released);
            tide__elastic_why_add(d, "); est. %.2f s down (%llu bytes)", d->downtime_s,
                                  (unsigned long long)d->bytes_sent);
        }
    }
    tide_layout_destroy(&nl);
    tide_free(pre);
    return rc;
}

/* ---- a run ------------------------------------------------------------------------------------
 */

/* Sorting record of the run's order: highest priority first, then the oldest (lowest id). */
typedef struct order_key {
    int32_t priority;
    int64_t id;
    size_t idx;
} order_key;

static int cmp_order(const void *a, const void *b)
{
    const order_key *x = a, *y = b;
    if (x->priority != y->priority)
        return x->priority > y->priority ? -1 : 1;
    return (x->id > y->id) - (x->id < y->id);
}

/* Reads the jobs into the working copy: bounds, current dp, who holds which GPU. */
static tide_status load_jobs(run *r)
{
    for (size_t j = 0; j < r->nj; j++) {
        const tide_elastic_job *jb = &r->jobs[j];
        if (tide_elastic_check(jb, &r->lo[j], &r->hi[j]) != TIDE_OK)
            return tide_errorf(TIDE_ERR_INVALID, "job %lld: %s", (long long)jb->id,
                               tide_last_error());
        r->frozen[j] = jb->pinned || jb->operator_hold || jb->busy;
        const tide_layout_t *l = jb->layout;
        if (l == NULL)
            continue;
        if (l->tp != jb->tp || l->pp != jb->pp || l->num_layers != jb->num_layers ||
            l->micro_batches != jb->micro)
            return tide_errorf(TIDE_ERR_INVALID,
                               "job %lld: its layout (tp %d, pp %d, %d layers, %d micro-batches) "
                               "is not the declared tp %d, pp %d, %d layers, %d micro-batches",
                               (long long)jb->id, l->tp, l->pp, l->num_layers, l->micro_batches,
                               jb->tp, jb->pp, jb->num_layers, jb->micro);
        r->cur[j] = l->dp;
        r->lay[j] = l;
        for (size_t i = 0; i < tide_layout_size(l); i++) {
            int32_t g = tide__elastic_gpu_of(r, jb, l->worker[i]);
            if (g < 0)
                return tide_errorf(TIDE_ERR_INVALID, "job %lld: rank %d of its layout has no GPU",
                                   (long long)jb->id, l->worker[i]);
            if (r->owner[g] >= 0)
                return tide_errorf(TIDE_ERR_INVALID,
                                   "GPU %d is in the layouts of job %lld and job %lld", g,
                                   (long long)r->jobs[r->owner[g]].id, (long long)jb->id);
            r->owner[g] = (int32_t)j;
            r->frozen[j] |= r->gpus[g].state == TIDE_EG_DOWN; /* recovery's business */
        }
    }
    for (size_t g = 0; g < r->ng; g++)
        r->avail[g] = r->owner[g] >= 0 ? TIDE_EG_HELD : r->gpus[g].state;
    return TIDE_OK;
}

static tide_status check_inputs(const tide_elastic_cfg *cfg, const tide_elastic_gpu *gpus,
                                size_t n_gpus)
{
    if (!(cfg->min_interval_s >= 0) || !(cfg->gain_margin >= 0) || !(cfg->switch_s >= 0) ||
        !(cfg->link_bytes_per_s > 0) || !(cfg->scaling > 0 && cfg->scaling <= 1))
        return tide_errorf(TIDE_ERR_INVALID,
                           "elastic settings out of range: interval %g s, margin %g, switch %g s "
                           "(each >= 0), link %g bytes/s (> 0), scaling %g (in (0, 1])",
                           cfg->min_interval_s, cfg->gain_margin, cfg->switch_s,
                           cfg->link_bytes_per_s, cfg->scaling);
    if (n_gpus > INT32_MAX)
        return tide_errorf(TIDE_ERR_INVALID, "%zu GPUs; at most %d", n_gpus, INT32_MAX);
    for (size_t g = 0; g < n_gpus; g++)
        if (gpus[g].host < 0 || gpus[g].state < TIDE_EG_FREE || gpus[g].state > TIDE_EG_DOWN)
            return tide_errorf(TIDE_ERR_INVALID, "GPU %zu: host %d or state %d is out of range", g,
                               gpus[g].host, gpus[g].state);
    return TIDE_OK;
}

static void run_free(run *r)
{
    tide_free(r->owner);
    tide_free(r->avail);
    tide_free(r->hold_for);
    tide_free(r->from_job);
    tide_free(r->stamp);
    tide_free(r->lo);
    tide_free(r->hi);
    tide_free(r->cur);
    tide_free((void *)r->lay);
    tide_free(r->frozen);
    tide_free(r->changed);
    tide_free(r->order);
    tide_free(r->cand);
    tide_free(r->cand_gpu);
}

static tide_status run_alloc(run *r)
{
    size_t ng = r->ng ? r->ng : 1, nj = r->nj ? r->nj : 1;
    r->owner = tide_malloc(ng * sizeof *r->owner);
    r->avail = tide_malloc(ng * sizeof *r->avail);
    r->hold_for = tide_malloc(ng * sizeof *r->hold_for);
    r->from_job = tide_malloc(ng * sizeof *r->from_job);
    r->stamp = tide_calloc(ng, sizeof *r->stamp);
    r->lo = tide_calloc(nj, sizeof *r->lo);
    r->hi = tide_calloc(nj, sizeof *r->hi);
    r->cur = tide_calloc(nj, sizeof *r->cur);
    r->lay = tide_calloc(nj, sizeof *r->lay);
    r->frozen = tide_calloc(nj, 1);
    r->changed = tide_calloc(nj, 1);
    r->order = tide_malloc(nj * sizeof *r->order);
    r->cand = tide_malloc(ng * sizeof *r->cand);
    r->cand_gpu = tide_malloc(ng * sizeof *r->cand_gpu);
    if (!r->owner || !r->avail || !r->hold_for || !r->from_job || !r->stamp || !r->lo || !r->hi ||
        !r->cur || !r->lay || !r->frozen || !r->changed || !r->order || !r->cand || !r->cand_gpu)
        return tide_errorf(TIDE_ERR_NOMEM, "out of memory for a policy run over %zu GPUs", r->ng);
    for (size_t g = 0; g < r->ng; g++) {
        r->owner[g] = -1;
        r->hold_for[g] = HOLD_NONE;
        r->from_job[g] = -1;
    }
    order_key *k = tide_malloc(nj * sizeof *k);
    if (k == NULL)
        return tide_errorf(TIDE_ERR_NOMEM, "out of memory ordering %zu jobs", r->nj);
    for (size_t j = 0; j < r->nj; j++)
        k[j] = (order_key){r->jobs[j].priority, r->jobs[j].id, j};
    qsort(k, r->nj, sizeof *k, cmp_order);
    for (size_t j = 0; j < r->nj; j++)
        r->order[j] = k[j].idx;
    tide_free(k);
    return TIDE_OK;
}

tide_status tide_elastic_decide(const tide_elastic_cfg *cfg, const tide_elastic_job *jobs,
                                size_t n_jobs, const tide_elastic_gpu *gpus, size_t n_gpus,
                                double now_s, tide_elastic_plan *plan)
{
    TIDE_CHECK(check_inputs(cfg, gpus, n_gpus));
    run r = {.cfg = cfg,
             .jobs = jobs,
             .nj = n_jobs,
             .gpus = gpus,
             .ng = n_gpus,
             .now = now_s,
             .plan = plan};
    size_t base = plan->n;
    r.base = base;
    tide_status rc = TIDE_OK;
    TIDE_CHECK_GOTO(run_alloc(&r), rc, out);
    TIDE_CHECK_GOTO(load_jobs(&r), rc, out);
    for (size_t oi = 0; oi < n_jobs; oi++) {
        size_t j = r.order[oi];
        if (r.frozen[j] || r.changed[j])
            continue;
        if (jobs[j].layout != NULL && r.cur[j] > r.hi[j])
            rc = to_bounds(&r, j);
        else if (jobs[j].layout != NULL && r.cur[j] < r.hi[j] && tide__elastic_limited(&r, j))
            rc = hold_back(&r, j);
        else if (jobs[j].layout == NULL || r.cur[j] < r.hi[j])
            rc = grow(&r, j);
        if (rc != TIDE_OK)
            goto out;
    }
out:
    if (rc != TIDE_OK)
        tide__elastic_plan_truncate(plan, base);
    run_free(&r);
    return rc;
}
