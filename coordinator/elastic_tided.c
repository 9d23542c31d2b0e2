/*
 * coordinator/elastic_tided: the elastic policy run by tided (see elastic_tided.h). A run
 * costs O(workers log workers) for the GPU view plus the policy's own cost; it happens only
 * while some job is managed, so a cluster without bounds pays nothing.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "core/log.h"
#include "coordinator/elastic.h"
#include "coordinator/elastic_tided.h"
#include "coordinator/event_fields.h"
#include "coordinator/join.h"
#include "coordinator/members.h"
#include "coordinator/reconf.h"

#define PASS_EVERY_NS 1000000000ull /* the timer's run, at most once a second */

/* A GPU's state as its workers make it, strongest first (one held worker holds it). */
enum { V_DOWN = 0, V_FREE = 1, V_OFFLINE = 2, V_HELD = 3 };

/* The cluster as the policy sees it, built from the worker table. */
typedef struct view {
    tide_elastic_gpu *gpu;
    size_t n_gpu;
    int32_t *worker_gpu; /* per worker id: its GPU, -1 for an empty slot */
    int32_t *gpu_worker; /* per GPU: a worker on it (its host and device name the GPU) */
    tide_elastic_job *jobs;
    tide_coord_job_t **job; /* the coordinator's job of each entry of jobs */
    int32_t **rank_gpu;     /* per entry: its ranks' GPUs (owned) */
    tide_collection_t **coll;
    size_t n_jobs;
} view;

static void view_clear(view *v)
{
    for (size_t i = 0; i < v->n_jobs; i++) {
        tide_free(v->rank_gpu[i]);
        tide_collection_destroy(&v->coll[i]);
    }
    tide_free(v->gpu);
    tide_free(v->worker_gpu);
    tide_free(v->gpu_worker);
    tide_free(v->jobs);
    tide_free(v->job);
    tide_free(v->rank_gpu);
    tide_free(v->coll);
    memset(v, 0, sizeof *v);
}

/* The job online j is managed: bounds declared, not ended, and a layout, or every rank
   of its launch joined while its first layout waits for the policy (a START). */
static int managed(const tide_coord_job_t *j)
{
    if (j->kind != TIDE_CJOB_ONLINE || j->el_max <= 0 || j->state == TIDE_JS_DONE ||
        j->state == TIDE_JS_CANCELLED)
        return 0;
    if (j->layout != NULL)
        return 1;
    return j->el_first_waits && j->state == TIDE_JS_QUEUED && j->n_pools == 1 &&
           j->joins >= j->pools[0].size;
}

/* A worker's GPU as a sort key: workers on one (host, device) share it. */
typedef struct gpu_key {
    const char *host;
    int32_t device;
    int32_t id; /* worker id */
} gpu_key;

static int cmp_gpu_key(const void *a, const void *b)
{
    const gpu_key *x = a, *y = b;
    int c = strcmp(x->host, y->host);
    if (c != 0)
        return c;
    return (x->device > y->device) - (x->device < y->device);
}

/* What worker w makes of its GPU (V_*), and whether it belongs to a pool that is joining. */
static int worker_view(tide_server_t *s, const tide_coord_worker_t *w, int *joining,
                       int32_t *off_prio)
{
    *joining = 0;
    if (tide_coord_worker_gone(w))
        return V_DOWN;
    if (w->state == TIDE_WS_ONLINE || w->state == TIDE_WS_DRAINING || w->job != 0)
        return V_HELD;
    if (w->state == TIDE_WS_OFFLINE) {
        const tide_coord_job_t *oj = tide_coord_job_get(s->st, w->offline_job);
        *off_prio = oj ? oj->priority : 0;
        return V_OFFLINE;
    }
    const tide_coord_job_t *j = w->joined ? tide_coord_job_get(s->st, w->joined) : NULL;
    int p = j ? tide_coord_job_pool_find(j, w->pool) : -1;
    *joining = p >= 0 && !j->pools[p].connected && !j->pools[p].left;
    return V_FREE;
}

/* One GPU per (host, device) of the workers tided knows, each worker's GPU noted. */
static tide_status build_gpus(tide_server_t *s, view *v)
{
    tide_coord_state_t *st = s->st;
    size_t n = 0, cap = st->n_workers ? st->n_workers : 1;
    gpu_key *k = tide_malloc(cap * sizeof *k);
    v->worker_gpu = tide_malloc(cap * sizeof *v->worker_gpu);
    v->gpu = tide_calloc(cap, sizeof *v->gpu);
    v->gpu_worker = tide_malloc(cap * sizeof *v->gpu_worker);
    if (k == NULL || v->worker_gpu == NULL || v->gpu == NULL || v->gpu_worker == NULL) {
        tide_free(k);
        return tide_errorf(TIDE_ERR_NOMEM, "out of memory viewing %zu workers", st->n_workers);
    }
    for (size_t i = 0; i < st->n_workers; i++) {
        v->worker_gpu[i] = -1;
        if (st->workers[i].pool[0] != '\0')
            k[n++] = (gpu_key){st->workers[i].host, st->workers[i].device, (int32_t)i};
    }
    qsort(k, n, sizeof *k, cmp_gpu_key);
    int32_t host = -1;
    int strongest = V_DOWN;
    for (size_t i = 0; i < n; i++) {
        int new_host = i == 0 || strcmp(k[i].host, k[i - 1].host) != 0;
        if (new_host || k[i].device != k[i - 1].device) {
            host += new_host;
            v->gpu_worker[v->n_gpu] = k[i].id;
            v->gpu[v->n_gpu++] = (tide_elastic_gpu){host, TIDE_EG_DOWN, 0, 0};
            strongest = V_DOWN;
        }
        tide_elastic_gpu *g = &v->gpu[v->n_gpu - 1];
        int joining = 0;
        int32_t prio = 0;
        int how = worker_view(s, &st->workers[k[i].id], &joining, &prio);
        if (how > strongest) {
            static const int32_t as[] = {TIDE_EG_DOWN, TIDE_EG_FREE, TIDE_EG_OFFLINE, TIDE_EG_HELD};
            strongest = how;
            g->state = as[how];
            g->offline_priority = prio;
        }
        g->joining |= joining;
        v->worker_gpu[k[i].id] = (int32_t)(v->n_gpu - 1);
    }
    tide_free(k);
    return TIDE_OK;
}

/*
 * Notes what the policy cannot see by itself: a committed generation it did not issue that
 * made the job smaller is a recovery (an operator's resize holds the job anyway), so the
 * size before it is the one to grow back to.
 */
static void note_recoveries(tide_coord_job_t *j)
{
    if (j->layout == NULL || j->generation == j->el_seen_gen)
        return;
    int dp = j->layout->dp;
    if (j->el_seen_gen != 0 && j->generation != j->el_gen && dp < j->el_seen_dp &&
        j->el_seen_dp > j->el_failed_from)
        j->el_failed_from = j->el_seen_dp;
    if (dp >= j->el_failed_from)
        j->el_failed_from = 0;
    j->el_seen_gen = j->generation;
    j->el_seen_dp = dp;
}

#define RATE_SAMPLE_NS 2000000000ull /* a step-time sample spans at least this */

/*
 * Samples j's speed as its user sees it: wall time between step boundaries (what the
 * heartbeats' step time leaves out: waits, pacing, the data loader), averaged over the
 * last samples of at least RATE_SAMPLE_NS each.
 */
static void sample_speed(tide_coord_job_t *j, uint64_t now_ns)
{
    if (j->el_obs_ns == 0 || j->step < j->el_obs_step) {
        j->el_obs_ns = now_ns;
        j->el_obs_step = j->step;
        return;
    }
    if (now_ns - j->el_obs_ns < RATE_SAMPLE_NS || j->step == j->el_obs_step)
        return;
    double s = (double)(now_ns - j->el_obs_ns) / 1e9 / (double)(j->step - j->el_obs_step);
    j->el_step_s = j->el_step_s > 0 ? 0.5 * j->el_step_s + 0.5 * s : s;
    j->el_obs_ns = now_ns;
    j->el_obs_step = j->step;
}

/* j's declaration for the policy (tp, pp and the rest from its layout); nothing owned. */
static tide_elastic_job declared(const tide_coord_job_t *j, const tide_layout_t *l)
{
    tide_elastic_job e;
    memset(&e, 0, sizeof e);
    e.id = j->id;
    e.priority = j->priority;
    e.min_gpus = j->el_min;
    e.max_gpus = j->el_max;
    e.tp = l ? l->tp : (j->req_tp > 0 ? j->req_tp : 1);
    e.pp = l ? l->pp : (j->req_pp > 0 ? j->req_pp : 1);
    e.micro = l ? l->micro_batches : (j->req_micro > 0 ? j->req_micro : 1);
    e.num_layers = l ? l->num_layers : (j->num_layers > 0 ? j->num_layers : 1);
    e.fit = j->fit;
    e.n_fit = (size_t)j->n_fit;
    e.state_bytes = j->total_bytes;
    return e;
}

/*
 * Marks in whole[p] each pool p of j that may be placed on: a connected one, or one that is
 * joining and whose every rank joined j (its connection is collective over all its ranks;
 * a launch of several ranks per host joins a rank at a time, and its ranks register before
 * they join).
 */
static void whole_pools(tide_server_t *s, const tide_coord_job_t *j, uint8_t *whole)
{
    int32_t joined[TIDE_COORD_JOB_POOLS_MAX] = {0};
    int any = 0;
    for (int p = 0; p < j->n_pools; p++) {
        whole[p] = (uint8_t)(j->pools[p].connected != 0);
        any |= !whole[p];
    }
    for (size_t i = 0; any && i < s->st->n_workers; i++) {
        const tide_coord_worker_t *w = &s->st->workers[i];
        int p = w->pool[0] != '\0' && w->joined == j->id ? tide_coord_job_pool_find(j, w->pool)
                                                          : -1;
        if (p >= 0 && !tide_coord_worker_gone(w))
            joined[p]++;
    }
    for (int p = 0; any && p < j->n_pools; p++)
        whole[p] |= (uint8_t)(joined[p] >= j->pools[p].size);
}

/* Fills view entry k from managed job j: its declaration, its ranks' GPUs, its state. */
static tide_status add_job(tide_server_t *s, view *v, size_t k, tide_coord_job_t *j)
{
    note_recoveries(j);
    uint8_t whole[TIDE_COORD_JOB_POOLS_MAX];
    whole_pools(s, j, whole);
    tide_elastic_job *e = &v->jobs[k];
    *e = declared(j, j->layout);
    int32_t world = tide_coord_job_world(j, 0);
    int32_t *rg = tide_malloc((world > 0 ? (size_t)world : 1) * sizeof *rg);
    v->rank_gpu[k] = rg;
    if (rg == NULL)
        return tide_errorf(TIDE_ERR_NOMEM, "out of memory mapping job %s's ranks", j->name);
    for (int32_t r = 0; r < world; r++) {
        int32_t pr = 0;
        int p = tide_coord_job_locate(j, r, &pr);
        const tide_coord_worker_t *w =
            p >= 0 && !j->pools[p].left && whole[p] ? tide__job_worker(s, j, r) : NULL;
        /* a rank whose process is gone or drained can take nothing, though its GPU may be
           free again (a new launch on a host that came back); -2: not yet known a member */
        int usable = w != NULL && !tide_coord_worker_gone(w) && w->state != TIDE_WS_DRAINING;
        rg[r] = w == NULL ? -1 : usable ? v->worker_gpu[w->id] : -2 - v->worker_gpu[w->id];
    }
    /* the layout's members keep their GPU whatever their state: the policy must know what
       the job holds (a job with a member gone is recovering, and left alone) */
    for (size_t i = 0; j->layout != NULL && i < tide_layout_size(j->layout); i++) {
        int32_t r = j->layout->worker[i];
        if (r >= 0 && r < world && rg[r] <= -2)
            rg[r] = -2 - rg[r];
    }
    for (int32_t r = 0; r < world; r++)
        rg[r] = rg[r] <= -2 ? -1 : rg[r];
    TIDE_CHECK(tide__job_collection(j, &v->coll[k]));
    e->layout = j->layout;
    e->coll = v->coll[k];
    e->rank_gpu = rg;
    e->n_ranks = (size_t)world;
    e->steps_left = j->el_steps > 0 ? (j->el_steps > j->step ? j->el_steps - j->step : 1) : 0;
    sample_speed(j, s->now_ns);
    e->step_s = j->el_step_s; /* unknown at first: no gain check until it is measured */
    e->last_change_s = j->el_last_ns ? (double)j->el_last_ns / 1e9 : -1.0;
    e->failed_from_dp = j->el_failed_from;
    e->pinned = j->el_hold == TIDE_EL_PINNED;
    e->operator_hold = j->el_hold == TIDE_EL_OPERATOR;
    e->busy = j->reconf != NULL || (j->layout != NULL && j->state != TIDE_JS_RUNNING);
    v->job[k] = j;
    v->n_jobs = k + 1;
    return TIDE_OK;
}

/* The whole view; n_managed: the managed jobs (> 0). */
static tide_status build_view(tide_server_t *s, size_t n_managed, view *v)
{
    memset(v, 0, sizeof *v);
    v->jobs = tide_calloc(n_managed, sizeof *v->jobs);
    v->job = tide_calloc(n_managed, sizeof *v->job);
    v->rank_gpu = tide_calloc(n_managed, sizeof *v->rank_gpu);
    v->coll = tide_calloc(n_managed, sizeof *v->coll);
    if (v->jobs == NULL || v->job == NULL || v->rank_gpu == NULL || v->coll == NULL)
        return tide_errorf(TIDE_ERR_NOMEM, "out of memory viewing %zu jobs", n_managed);
    TIDE_CHECK(build_gpus(s, v));
    size_t k = 0;
    for (size_t i = 0; i < s->st->n_jobs && k < n_managed; i++)
        if (managed(s->st->jobs[i]))
            TIDE_CHECK(add_job(s, v, k++, s->st->jobs[i]));
    return TIDE_OK;
}

/* GPUs g[0..n) as "host:dev,dev host:dev" (ascending ids: a host's GPUs are adjacent) into
   out; "none" when n is 0. */
static void gpu_names(tide_server_t *s, const view *v, const int32_t *g, size_t n, char *out,
                      size_t cap)
{
    size_t k = 0;
    out[0] = '\0';
    for (size_t i = 0; i < n && k + 1 < cap; i++) {
        const tide_coord_worker_t *w = &s->st->workers[v->gpu_worker[g[i]]];
        const tide_coord_worker_t *p = i ? &s->st->workers[v->gpu_worker[g[i - 1]]] : NULL;
        int same = p != NULL && strcmp(p->host, w->host) == 0;
        int m = same ? snprintf(out + k, cap - k, ",%d", w->device)
                     : snprintf(out + k, cap - k, "%s%s:%d", i ? " " : "", w->host, w->device);
        k += m > 0 ? (size_t)m : 0;
    }
    if (n == 0)
        snprintf(out, cap, "none");
}

/* Starts decision d over job j as a switch, with its event. */
static void start(tide_server_t *s, const view *v, tide_coord_job_t *j, tide_elastic_decision *d)
{
    char took[160], gave[160];
    gpu_names(s, v, d->gained, d->n_gained, took, sizeof took);
    gpu_names(s, v, d->released, d->n_released, gave, sizeof gave);
    char reason[128];
    snprintf(reason, sizeof reason, "elastic %s dp %d -> %d", tide_elastic_rule_name(d->rule),
             d->old_dp, d->new_dp);
    tide_layout_t *l = d->layout;
    d->layout = NULL; /* the switch owns it, or freed it */
    tide_proto_event_fields_t f;
    tide_event_fields_init(&f);
    tide_event_fields_reason(&f, tide_elastic_rule_name(d->rule));
    if (j->layout == NULL) { /* START: the first layout, as a join would have placed it */
        tide_event_fields_layout(&f, l, NULL, NULL);
        j->el_first_waits = 0;
        tide__join_start_first(s, j, l, d->preempt, d->n_preempt);
        j->el_last_ns = s->now_ns;
        j->el_gen = f.gen = j->generation;
        tide__event_f(s, j->name, "elastic", &f, "generation %llu: %s; takes %s, gives up %s",
                      (unsigned long long)j->el_gen, d->why, took, gave);
        return;
    }
    j->el_keep_pools = d->rule == TIDE_ELASTIC_YIELD;
    tide_status rc = tide__reconf_start(s, j, l, d->preempt, d->n_preempt, 0, reason, NULL);
    j->el_keep_pools = 0;
    if (rc != TIDE_OK) {
        tide__event(s, j->name, "elastic_failed", "%s not started: %s (decided: %s)", reason,
                    tide_last_error(), d->why);
        return;
    }
    j->el_last_ns = s->now_ns;
    j->el_gen = j->reconf->gen;
    j->reconf->planned_bytes = d->bytes_sent;
    f.gen = j->el_gen;
    tide_event_fields_layout(&f, j->reconf->layout, NULL, j->layout);
    tide__event_f(s, j->name, "elastic", &f, "generation %llu: %s; takes %s, gives up %s",
                  (unsigned long long)j->el_gen, d->why, took, gave);
}

void tide__elastic_pass(tide_server_t *s)
{
    size_t n = 0;
    for (size_t i = 0; i < s->st->n_jobs; i++)
        n += (size_t)managed(s->st->jobs[i]);
    s->elastic.last_pass_ns = s->now_ns;
    if (n == 0)
        return;
    view v;
    tide_elastic_plan plan = {0};
    tide_elastic_cfg cfg = tide_elastic_cfg_default();
    cfg.min_interval_s = (double)s->cfg.elastic_interval_ms / 1e3;
    cfg.gain_margin = s->cfg.elastic_margin;
    cfg.link_bytes_per_s = s->cfg.link_bytes_per_s > 0 ? s->cfg.link_bytes_per_s : 1e9;
    tide_status rc = build_view(s, n, &v);
    if (rc == TIDE_OK)
        rc = tide_elastic_decide(&cfg, v.jobs, v.n_jobs, v.gpu, v.n_gpu,
                                 (double)s->now_ns / 1e9, &plan);
    if (rc != TIDE_OK && strncmp(s->elastic.failed, tide_last_error(),
                                 sizeof s->elastic.failed - 1) != 0) {
        /* an event once per reason, not once a second */
        snprintf(s->elastic.failed, sizeof s->elastic.failed, "%s", tide_last_error());
        tide__event(s, "", "elastic_failed", "the policy cannot run: %s", s->elastic.failed);
    }
    if (rc == TIDE_OK)
        s->elastic.failed[0] = '\0';
    for (size_t i = 0; rc == TIDE_OK && i < plan.n; i++) {
        tide_elastic_decision *d = &plan.d[i];
        /* a grow that waits for yields starts in the pass after they committed */
        if (!d->waits && v.job[d->index]->reconf == NULL)
            start(s, &v, v.job[d->index], d);
    }
    tide_elastic_plan_clear(&plan);
    view_clear(&v);
}

void tide__elastic_tick(tide_server_t *s)
{
    if (s->now_ns - s->elastic.last_pass_ns >= PASS_EVERY_NS)
        tide__elastic_pass(s);
}

void tide__elastic_operator_resized(tide_server_t *s, tide_coord_job_t *j)
{
    if (j->el_max <= 0 || j->el_hold != TIDE_EL_FREE)
        return;
    j->el_hold = TIDE_EL_OPERATOR;
    tide__save_job(s, j);
    tide__event(s, j->name, "elastic_hold",
                "an operator's resize is in force: the policy leaves the job alone until "
                "tidectl bounds or unpin");
}

/* ---- tidectl bounds / priority / pin / unpin --------------------------------------------- */

/* What m makes of j's declaration into *e (nothing of j changed); 0 after an error reply. */
static int updated(tide_server_t *s, const tide_coord_job_t *j, const tide_proto_elastic_t *m,
                   tide_elastic_job *e, int32_t *hold)
{
    *e = declared(j, j->layout);
    if (m->min_gpus > 0) {
        e->min_gpus = m->min_gpus;
        e->max_gpus = m->max_gpus;
    }
    if (m->priority >= 0)
        e->priority = m->priority;
    *hold = j->el_hold;
    if (m->pin >= 0)
        *hold = m->pin ? TIDE_EL_PINNED : TIDE_EL_FREE;
    else if (m->min_gpus > 0 && *hold == TIDE_EL_OPERATOR)
        *hold = TIDE_EL_FREE; /* declaring bounds hands the job back to the policy */
    if (e->max_gpus == 0)
        return 1; /* not managed: the policy never reads the rest */
    if (tide_elastic_check(e, NULL, NULL) != TIDE_OK) {
        tide__reply_error(s, TIDE_ERR_INVALID, "job %s: %s; nothing changed", j->name,
                          tide_last_error());
        return 0;
    }
    return 1;
}

void tide__on_elastic(tide_server_t *s, const tide_msg_t *msg, const void *raw, size_t len)
{
    (void)raw;
    (void)len;
    const tide_proto_elastic_t *m = &msg->u.elastic;
    tide_coord_job_t *j = tide_coord_job_by_name(s->st, m->job);
    if (j == NULL || j->kind != TIDE_CJOB_ONLINE) {
        tide__reply_error(s, TIDE_ERR_NOT_FOUND, "no online job named %s (tidectl jobs lists them)",
                          m->job);
        return;
    }
    if (j->state == TIDE_JS_DONE || j->state == TIDE_JS_CANCELLED) {
        tide__reply_error(s, TIDE_ERR_INVALID, "job %s has ended; nothing to change", j->name);
        return;
    }
    tide_elastic_job e;
    int32_t hold;
    if (!updated(s, j, m, &e, &hold))
        return;
    j->el_min = e.min_gpus;
    j->el_max = e.max_gpus;
    j->priority = e.priority;
    j->el_hold = hold;
    if (m->steps >= 0)
        j->el_steps = m->steps;
    tide__save_job(s, j);
    static const char *const holds[] = {"free", "pinned", "held by an operator's resize"};
    tide__event(s, j->name, "elastic_bounds",
                "bounds %d-%d GPUs, priority %d, %s, %lld steps in all (0: unknown), by %s",
                j->el_min, j->el_max, j->priority, holds[j->el_hold], (long long)j->el_steps,
                s->req.who);
    /* the policy's answer now, so that the reply names the switch it starts (--wait) */
    uint64_t before = j->gen_issued;
    tide__elastic_pass(s);
    uint64_t gen = j->reconf != NULL && j->gen_issued > before ? j->gen_issued : 0;
    char started[96] = "";
    if (gen != 0)
        snprintf(started, sizeof started, "; the policy starts generation %llu",
                 (unsigned long long)gen);
    tide__reply_ok_gen(s, j->name, gen, "bounds %d-%d GPUs, priority %d, %s%s", j->el_min,
                       j->el_max, j->priority, holds[j->el_hold], started);
    tide__reschedule(s);
}
