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

static const char *const rule_names[] = {"start", "grow", "regrow", "yield", "bounds"};

const char *tide_elastic_rule_name(int32_t rule)
{
    return rule >= 0 && rule < 5 ? rule_names[rule] : "?";
}

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

/* Drops the decisions from index `mark` on. */
static void plan_truncate(tide_elastic_plan *plan, size_t mark)
{
    for (size_t i = mark; i < plan->n; i++) {
        tide_layout_destroy(&plan->d[i].layout);
        tide_free(plan->d[i].preempt);
        tide_free(plan->d[i].gained);
        tide_free(plan->d[i].released);
    }
    plan->n = mark < plan->n ? mark : plan->n;
}

/* ---- the working copy ---------------------------------------------------------------------- */

/* The GPU of job rank `rank`, -1 when it has none. */
int32_t tide__elastic_gpu_of(const run *r, const tide_elastic_job *j, int32_t rank)
{
    if (rank < 0)
        return -1;
    if (j->rank_gpu == NULL)
        return (size_t)rank < r->ng ? rank : -1;
    if ((size_t)rank >= j->n_ranks)
        return -1;
    int32_t g = j->rank_gpu[rank];
    return g >= 0 && (size_t)g < r->ng ? g : -1;
}

size_t tide__elastic_ranks_of(const run *r, const tide_elastic_job *j)
{
    return j->rank_gpu != NULL ? j->n_ranks : r->ng;
}

int tide__elastic_limited(const run *r, size_t j)
{
    const tide_elastic_job *jb = &r->jobs[j];
    return jb->last_change_s >= 0 && r->now - jb->last_change_s < r->cfg->min_interval_s;
}

void tide__elastic_next_epoch(run *r)
{
    if (++r->epoch == 0) {
        memset(r->stamp, 0, r->ng * sizeof *r->stamp);
        r->epoch = 1;
    }
}

/* Adds rank k of job j as a candidate when its GPU is usable (see tide__elastic_build_cands). */
static void add_cand(run *r, size_t j, int32_t k, int members_only)
{
    int32_t g = tide__elastic_gpu_of(r, &r->jobs[j], k);
    if (g < 0 || r->stamp[g] == r->epoch)
        return;
    tide_pw_class cls;
    if (r->owner[g] == (int32_t)j)
        cls = TIDE_PW_MEMBER;
    else if (members_only || r->owner[g] >= 0 ||
             (r->hold_for[g] != HOLD_NONE && r->hold_for[g] != (int32_t)j))
        return;
    else if (r->avail[g] == TIDE_EG_FREE)
        cls = TIDE_PW_IDLE;
    else if (r->avail[g] == TIDE_EG_OFFLINE)
        cls = TIDE_PW_OFFLINE;
    else
        return;
    r->stamp[g] = r->epoch;
    r->cand[r->n_cand] = (tide_policy_worker){
        k, r->gpus[g].host, cls, cls == TIDE_PW_OFFLINE ? r->gpus[g].offline_priority : 0};
    r->cand_gpu[r->n_cand++] = g;
}

/*
 * What job j may use now, as placement candidates: the GPUs of its layout, free GPUs
 * and GPUs running offline work that no other job is kept for (members_only: its layout
 * only). One candidate per GPU: the layout's rank first, then the lowest other rank.
 */
void tide__elastic_build_cands(run *r, size_t j, int members_only)
{
    const tide_elastic_job *jb = &r->jobs[j];
    tide__elastic_next_epoch(r);
    r->n_cand = 0;
    const tide_layout_t *l = r->lay[j];
    for (size_t i = 0; l != NULL && i < tide_layout_size(l); i++)
        add_cand(r, j, l->worker[i], members_only);
    size_t nr = members_only ? 0 : tide__elastic_ranks_of(r, jb);
    for (size_t k = 0; k < nr; k++)
        add_cand(r, j, (int32_t)k, members_only);
}

/* The largest dp <= want the candidates hold, TP groups inside hosts, that the job's
   program runs; 0 when none. */
int tide__elastic_feasible(const run *r, size_t j, int want)
{
    const tide_elastic_job *jb = &r->jobs[j];
    long by_count = (long)r->n_cand / ((long)jb->tp * jb->pp);
    int d = want < by_count ? want : (int)by_count;
    if (d <= 0)
        return 0;
    d = tide_policy_tp_fit_dp(r->cand, r->n_cand, jb->tp, jb->pp, d);
    return d > 0 ? tide_policy_fit_dp(jb->fit, jb->n_fit, jb->tp, jb->pp, jb->micro, d) : 0;
}

static int cmp_host(const void *a, const void *b)
{
    const host_key *x = a, *y = b;
    return (x->host > y->host) - (x->host < y->host);
}

int tide__elastic_cmp_score(const void *a, const void *b)
{
    const host_key *x = a, *y = b;
    if (x->score != y->score)
        return x->score > y->score ? -1 : 1;
    if (x->host != y->host)
        return (x->host > y->host) - (x->host < y->host);
    return (x->tie > y->tie) - (x->tie < y->tie);
}

/* Sets each key's score to `base` x the count of keys on its host plus its own score
   (keys sorted by host in tide__elastic_place). */
void tide__elastic_score_by_host(host_key *k, size_t n, int64_t base)
{
    qsort(k, n, sizeof *k, cmp_host);
    for (size_t i = 0, run_start = 0; i < n; i++)
        if (i + 1 == n || k[i + 1].host != k[i].host) {
            for (size_t m = run_start; m <= i; m++)
                k[m].score += base * (int64_t)(i + 1 - run_start);
            run_start = i + 1;
        }
}

/*
 * Placement's cost grows with the workers it is offered: keeps the members and, of the
 * others, the ones a layout of dp takes first (idle before offline work, cheapest offline
 * work first, hosts with the most usable GPUs first: whole TP groups), a few hosts more
 * than needed. Leaves the list whole when the trimmed one would not hold dp.
 */
static tide_status trim_cands(run *r, size_t j, int dp)
{
    const tide_elastic_job *jb = &r->jobs[j];
    size_t need = (size_t)dp * (size_t)jb->tp * (size_t)jb->pp, slack = 4 * (size_t)jb->tp + 16;
    if (r->n_cand <= 2 * need + slack)
        return TIDE_OK;
    host_key *k = tide_malloc(r->n_cand * sizeof *k);
    tide_policy_worker *keep = tide_malloc(r->n_cand * sizeof *keep);
    int32_t *keep_gpu = tide_malloc(r->n_cand * sizeof *keep_gpu);
    if (k == NULL || keep == NULL || keep_gpu == NULL) {
        tide_free(k);
        tide_free(keep);
        tide_free(keep_gpu);
        return tide_errorf(TIDE_ERR_NOMEM, "out of memory choosing GPUs for job %lld",
                           (long long)jb->id);
    }
    size_t n = 0, members = 0;
    for (size_t i = 0; i < r->n_cand; i++) {
        if (r->cand[i].cls == TIDE_PW_MEMBER) {
            keep[members] = r->cand[i];
            keep_gpu[members++] = r->cand_gpu[i];
            continue;
        }
        /* idle (class 1) far above offline (class 2), then cheap offline work first */
        int64_t cls = r->cand[i].cls == TIDE_PW_IDLE ? 2 : 1;
        k[n++] = (host_key){(int32_t)i, r->cand[i].host, cls << 40,
                            ((int64_t)r->cand[i].priority << 32) + r->cand[i].rank};
    }
    tide__elastic_score_by_host(k, n, 1);
    qsort(k, n, sizeof *k, tide__elastic_cmp_score);
    size_t take = need + slack > members ? need + slack - members : 0, kept = members;
    for (size_t i = 0; i < n && (i < take || (i > 0 && k[i].host == k[i - 1].host)); i++) {
        keep[kept] = r->cand[k[i].idx];
        keep_gpu[kept++] = r->cand_gpu[k[i].idx];
    }
    size_t n_all = r->n_cand;
    tide_policy_worker *all = r->cand;
    r->cand = keep;
    r->n_cand = kept;
    if (tide__elastic_feasible(r, j, dp) >= dp) {
        memcpy(all, keep, kept * sizeof *keep);
        memcpy(r->cand_gpu, keep_gpu, kept * sizeof *keep_gpu);
    } else {
        r->n_cand = n_all;
    }
    r->cand = all;
    tide_free(k);
    tide_free(keep);
    tide_free(keep_gpu);
    return TIDE_OK;
}

/* Places job j at dp over cand[0..n) (tide_policy_place: TP groups inside hosts, its fit
   rules, fewest bytes moved). */
tide_status tide__elastic_place(const run *r, size_t j, int dp, const tide_policy_worker *cand,
                                size_t n, tide_layout_t **out, int32_t *pre, size_t *n_pre)
{
    const tide_elastic_job *jb = &r->jobs[j];
    tide_resize_req req = {dp,   jb->tp, jb->pp, jb->num_layers, jb->micro,
                           NULL, 0,      0,      jb->fit,        jb->n_fit};
    return tide_policy_place(r->lay[j], jb->coll, &req, cand, n, out, pre, n_pre);
}

/*
 * The dry-run estimate of j's switch to nl: the reshard plan's totals on its tensors, or,
 * without them, one replica's shards (state_bytes / (tp pp)) sent to each new replica by
 * the old ones in turn. Downtime: the busiest worker's bytes over the link plus the
 * fixed switch cost.
 */
void tide__elastic_estimate(const run *r, size_t j, const tide_layout_t *nl,
                            tide_elastic_decision *d)
{
    const tide_elastic_job *jb = &r->jobs[j];
    const tide_layout_t *ol = r->lay[j];
    uint64_t busiest = 0;
    d->bytes_sent = d->max_send = 0;
    d->downtime_s = 0;
    if (ol == NULL)
        return;
    tide_plan_totals t;
    if (jb->coll != NULL && tide_reshard_plan_totals(ol, nl, jb->coll, NULL, 0, &t) == TIDE_OK) {
        d->bytes_sent = t.bytes_sent;
        d->max_send = t.max_send;
        busiest = t.max_send > t.max_recv ? t.max_send : t.max_recv;
    } else if (nl->dp > ol->dp) {
        uint64_t add = (uint64_t)(nl->dp - ol->dp), old = (uint64_t)ol->dp;
        uint64_t shard = jb->state_bytes / ((uint64_t)jb->tp * (uint64_t)jb->pp);
        d->bytes_sent = jb->state_bytes * add;
        d->max_send = shard * ((add + old - 1) / old);
        busiest = d->max_send > shard ? d->max_send : shard;
    }
    d->downtime_s = r->cfg->switch_s + (double)busiest / r->cfg->link_bytes_per_s;
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

/* ---- decisions ----------------------------------------------------------------------------- */

/* Appends printf text to d->why, never past its end. */
void tide__elastic_why_add(tide_elastic_decision *d, const char *fmt, ...)
{
    size_t at = strlen(d->why);
    if (at + 1 >= sizeof d->why)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(d->why + at, sizeof d->why - at, fmt, ap);
    va_end(ap);
}

/* Appends "4 on host 1, 4 on host 2 (+3 hosts)" for the sorted GPUs g[0..n). */
void tide__elastic_why_hosts(const run *r, tide_elastic_decision *d, const int32_t *g, size_t n)
{
    int32_t *h = tide_malloc((n ? n : 1) * sizeof *h);
    if (h == NULL)
        return;
    for (size_t i = 0; i < n; i++)
        h[i] = r->gpus[g[i]].host;
    tide_sort_i32(h, n);
    size_t shown = 0, hosts = 0;
    for (size_t i = 0, start = 0; i < n; i++)
        if (i + 1 == n || h[i + 1] != h[i]) {
            if (shown < 4)
                tide__elastic_why_add(d, "%s%zu on host %d", shown ? ", " : "", i + 1 - start,
                                      h[i]),
                    shown++;
            hosts++;
            start = i + 1;
        }
    if (hosts > shown)
        tide__elastic_why_add(d, " (+%zu hosts)", hosts - shown);
    tide_free(h);
}

/* Room for one more decision, zeroed; NULL when out of memory. */
static tide_elastic_decision *plan_push(tide_elastic_plan *p)
{
    if (p->n == p->cap) {
        size_t cap = p->cap ? 2 * p->cap : 8;
        tide_elastic_decision *d = tide_realloc(p->d, cap * sizeof *d);
        if (d == NULL)
            return NULL;
        p->d = d;
        p->cap = cap;
    }
    tide_elastic_decision *d = &p->d[p->n++];
    memset(d, 0, sizeof *d);
    d->for_job = -1;
    return d;
}

/* The sorted GPUs of layout l of job j. */
static tide_status layout_gpus(const run *r, size_t j, const tide_layout_t *l, int32_t **out,
                               size_t *n)
{
    size_t m = l != NULL ? tide_layout_size(l) : 0;
    *out = tide_malloc((m ? m : 1) * sizeof **out);
    if (*out == NULL)
        return tide_errorf(TIDE_ERR_NOMEM, "out of memory listing a layout's GPUs");
    for (size_t i = 0; i < m; i++)
        (*out)[i] = tide__elastic_gpu_of(r, &r->jobs[j], l->worker[i]);
    tide_sort_i32(*out, m);
    *n = m;
    return TIDE_OK;
}

/* a[0..na) minus b[0..nb), both sorted, into out (room for na); returns the count. */
static size_t set_minus(const int32_t *a, size_t na, const int32_t *b, size_t nb, int32_t *out)
{
    size_t n = 0, k = 0;
    for (size_t i = 0; i < na; i++) {
        while (k < nb && b[k] < a[i])
            k++;
        if (k == nb || b[k] != a[i])
            out[n++] = a[i];
    }
    return n;
}

/*
 * Records j's change to *nl (taken over) with its gained and released GPUs by source,
 * and applies it to the working copy: gained GPUs are j's, released ones are free once
 * the change commits (HOLD_PENDING; a yield sets them to its beneficiary).
 */
tide_status tide__elastic_emit(run *r, size_t j, int32_t rule, tide_layout_t **nl,
                               const int32_t *pre, size_t n_pre, tide_elastic_decision **out)
{
    int32_t *nw = NULL, *ow = NULL;
    size_t nn = 0, on = 0;
    tide_status rc = TIDE_OK;
    TIDE_CHECK_GOTO(layout_gpus(r, j, *nl, &nw, &nn), rc, out);
    TIDE_CHECK_GOTO(layout_gpus(r, j, r->lay[j], &ow, &on), rc, out);
    tide_elastic_decision *d = plan_push(r->plan);
    TIDE_CHECK_ALLOC_GOTO(d, rc, out);
    d->job = r->jobs[j].id;
    d->index = j;
    d->rule = rule;
    d->old_dp = r->cur[j];
    d->new_dp = (*nl)->dp;
    d->layout = *nl;
    *nl = NULL;
    d->preempt = tide_malloc((n_pre ? n_pre : 1) * sizeof *d->preempt);
    d->gained = tide_malloc((nn ? nn : 1) * sizeof *d->gained);
    d->released = tide_malloc((on ? on : 1) * sizeof *d->released);
    if (d->preempt == NULL || d->gained == NULL || d->released == NULL) {
        plan_truncate(r->plan, r->plan->n - 1);
        TIDE_FAIL_GOTO(rc, out, TIDE_ERR_NOMEM, "out of memory recording a decision");
    }
    if (n_pre > 0)
        memcpy(d->preempt, pre, n_pre * sizeof *pre);
    d->n_preempt = n_pre;
    d->n_gained = set_minus(nw, nn, ow, on, d->gained);
    d->n_released = set_minus(ow, on, nw, nn, d->released);
    for (size_t i = 0; i < d->n_gained; i++) {
        int32_t g = d->gained[i];
        d->from_jobs += r->from_job[g] >= 0;
        d->from_offline += r->from_job[g] < 0 && r->avail[g] == TIDE_EG_OFFLINE;
        d->from_joining += r->from_job[g] < 0 && r->avail[g] == TIDE_EG_FREE && r->gpus[g].joining;
        d->from_idle += r->from_job[g] < 0 && r->avail[g] == TIDE_EG_FREE && !r->gpus[g].joining;
        r->owner[g] = (int32_t)j;
        r->avail[g] = TIDE_EG_HELD;
        r->hold_for[g] = HOLD_NONE;
    }
    for (size_t i = 0; i < d->n_released; i++) {
        int32_t g = d->released[i];
        r->owner[g] = -1;
        r->avail[g] = TIDE_EG_FREE;
        r->hold_for[g] = HOLD_PENDING;
    }
    r->changed[j] = rule == TIDE_ELASTIC_YIELD ? 2 : 1;
    r->lay[j] = d->layout;
    r->cur[j] = d->new_dp;
    *out = d;
out:
    tide_free(nw);
    tide_free(ow);
    return rc;
}

/* Job k's layout, dp and mark after the decisions of this run still in the plan. */
static void restore_job(run *r, size_t k)
{
    r->lay[k] = r->jobs[k].layout;
    r->changed[k] = 0;
    for (size_t i = r->base; i < r->plan->n; i++)
        if (r->plan->d[i].index == k) {
            r->lay[k] = r->plan->d[i].layout;
            r->changed[k] = r->plan->d[i].rule == TIDE_ELASTIC_YIELD ? 2 : 1;
        }
    r->cur[k] = r->lay[k] != NULL ? r->lay[k]->dp : 0;
}

/* Undoes the yields recorded from plan index `mark` on, the latest first: their GPUs are
   their jobs' again. */
void tide__elastic_undo_yields(run *r, size_t mark)
{
    for (size_t i = r->plan->n; i-- > mark;) {
        const tide_elastic_decision *d = &r->plan->d[i];
        for (size_t k = 0; k < d->n_released; k++) {
            int32_t g = d->released[k];
            r->owner[g] = (int32_t)d->index;
            r->avail[g] = TIDE_EG_HELD;
            r->hold_for[g] = HOLD_NONE;
            r->from_job[g] = -1;
        }
    }
    size_t n = r->plan->n;
    r->plan->n = mark; /* restore_job reads the decisions that stay */
    for (size_t i = mark; i < n; i++)
        restore_job(r, r->plan->d[i].index);
    r->plan->n = n;
    plan_truncate(r->plan, mark);
}

/* "dp 1 -> 2 (4 -> 8 GPUs, bounds 4-12)" */
void tide__elastic_why_head(const run *r, size_t j, tide_elastic_decision *d)
{
    const tide_elastic_job *jb = &r->jobs[j];
    long g = (long)jb->tp * jb->pp;
    tide__elastic_why_add(d, "%s dp %d -> %d (%ld -> %ld GPUs, bounds %d-%d, priority %d)",
                          tide_elastic_rule_name(d->rule), d->old_dp, d->new_dp, d->old_dp * g,
                          d->new_dp * g, jb->min_gpus, jb->max_gpus, jb->priority);
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
    TIDE_CHECK(trim_cands(r, j, fd));
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
        plan_truncate(plan, base);
    run_free(&r);
    return rc;
}
