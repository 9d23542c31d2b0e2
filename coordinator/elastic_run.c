/*
 * coordinator/elastic_run: the pieces of a policy run that elastic.c (one job's decision,
 * the run) and elastic_yield.c (lower priorities giving GPUs up) both use: the working
 * copy's queries, candidates and placement, the estimate, recording a decision and undoing
 * yields, the decision's text. It calls nothing in the other two files, so that they call
 * it one way.
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

/* Drops the decisions from index `mark` on. */
void tide__elastic_plan_truncate(tide_elastic_plan *plan, size_t mark)
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
tide_status tide__elastic_trim_cands(run *r, size_t j, int dp)
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
        tide__elastic_plan_truncate(r->plan, r->plan->n - 1);
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
    tide__elastic_plan_truncate(r->plan, mark);
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
