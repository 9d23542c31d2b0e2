/*
 * coordinator/allocations: pools as scheduler allocations (see allocations.h). Three
 * flows, each a small step run again every tick until it is done, so that none waits on
 * anything inside a handler:
 *   grow      tidectl grow -> the provider asks Slurm (child processes, provider.h); the
 *             allocation's pools register and join the job (join.c) -> grow_onto;
 *   grow_onto a pool of an allocation whose ranks all joined -> a switch to more data
 *             parallel replicas over the connected pools and that one (one pool per
 *             switch: a switch connects one launch);
 *   leave     a pool told by its scheduler to give its node back -> its offline work
 *             stopped, then a switch without its ranks (recovery's choice of layout,
 *             tide_policy_recover, over the ranks that stay), which releases it; a pool
 *             never connected is ended directly.
 */
#include "coordinator/allocations.h"

#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "core/clock.h"
#include "core/error.h"
#include "core/log.h"
#include "coordinator/allocs.h"
#include "coordinator/members.h"
#include "coordinator/offline.h"
#include "coordinator/policy.h"
#include "coordinator/provider.h"
#include "coordinator/reconf.h"
#include "coordinator/sender.h"

#define PRUNE_NS 60000000000ull /* forgotten pools' rows go once a minute */
#define RETRY_NS 500000000ull   /* a leave or a grow that must wait is tried again */

/* A pool that asked to leave its job. */
typedef struct leave_req {
    int64_t job;
    char pool[TIDE_COORD_NAME_MAX];
    char reason[256];
    int offline_stopped; /* its offline work was preempted */
    int refused;         /* the event saying it cannot leave was recorded */
    uint64_t next_ns;    /* not tried again before */
} leave_req;

/* A pool the job is not grown onto (no larger layout fits): said once. */
typedef struct quiet_pool {
    int64_t job;
    char pool[TIDE_COORD_NAME_MAX];
} quiet_pool;

struct tide__alloc {
    tide_provider_t prov;
    int slurm; /* a provider of nodes: pools of allocations are grown onto */
    tide_allocs_t *table;
    leave_req *leaves;
    size_t n_leaves, cap_leaves;
    quiet_pool *quiet;
    size_t n_quiet, cap_quiet;
    char (*asked)[TIDE_COORD_NAME_MAX]; /* jobs with a grow asked of the provider */
    size_t n_asked, cap_asked;
    uint64_t next_prune_ns;
    tide_server_t *s; /* for the provider's events */
};

/* Grows *arr (elements of size sz) to hold one more; 0 when out of memory. */
static int room(void **arr, size_t *cap, size_t n, size_t sz)
{
    if (n < *cap)
        return 1;
    size_t c = *cap ? 2 * *cap : 8;
    void *a = tide_realloc(*arr, c * sz);
    if (a == NULL)
        return 0;
    *arr = a;
    *cap = c;
    return 1;
}

static void provider_event(void *ctx, const char *job, const char *kind, const char *detail)
{
    tide__event(ctx, job, kind, "%s", detail);
}

tide_status tide__alloc_open(tide_server_t *s)
{
    tide__alloc *a = tide_calloc(1, sizeof *a);
    if (a == NULL)
        return tide_errorf(TIDE_ERR_NOMEM, "out of memory for the allocations");
    a->s = s;
    tide_status rc = tide_allocs_new(&a->table);
    if (rc == TIDE_OK && s->cfg.provider_slurm) {
        tide_slurm_config sc = {.poll_ms = (uint64_t)s->cfg.slurm_poll_ms,
                                .pending_ms = (uint64_t)s->cfg.slurm_pending_ms,
                                .cmd_ms = 30000};
        snprintf(sc.bin, sizeof sc.bin, "%s", s->cfg.slurm_bin ? s->cfg.slurm_bin : "");
        rc = tide_provider_slurm(&a->prov, &sc, provider_event, s);
        a->slurm = rc == TIDE_OK;
    } else if (rc == TIDE_OK) {
        tide_provider_none(&a->prov);
    }
    s->alloc = a;
    if (rc != TIDE_OK)
        tide__alloc_close(s);
    return rc;
}

void tide__alloc_close(tide_server_t *s)
{
    tide__alloc *a = s->alloc;
    if (a == NULL)
        return;
    if (a->prov.ops != NULL)
        a->prov.ops->destroy(a->prov.self);
    tide_allocs_destroy(&a->table);
    tide_free(a->leaves);
    tide_free(a->quiet);
    tide_free(a->asked);
    tide_free(a);
    s->alloc = NULL;
}

void tide__alloc_load(tide_server_t *s)
{
    tide__alloc *a = s->alloc;
    tide_allocs_t *fresh = NULL;
    if (tide_allocs_new(&fresh) != TIDE_OK ||
        tide_store_load_allocs(tide__store(s), fresh) != TIDE_OK) {
        TIDE_WARN("alloc", "pools' allocations not read: %s", tide_last_error());
        tide_allocs_destroy(&fresh);
        return;
    }
    tide_allocs_destroy(&a->table);
    a->table = fresh;
}

/* ---- what pools run in ------------------------------------------------------------------------ */

void tide__alloc_register(tide_server_t *s, const tide_coord_worker_t *w,
                          const tide_proto_alloc_t *al)
{
    tide__alloc *a = s->alloc;
    const tide_proto_alloc_t *had = tide_allocs_get(a->table, w->pool);
    if (al->sched[0] == '\0' || (had != NULL && memcmp(had, al, sizeof *al) == 0))
        return;
    if (tide_allocs_put(a->table, w->pool, al) != TIDE_OK) {
        TIDE_WARN("alloc", "pool %s: %s", w->pool, tide_last_error());
        return;
    }
    tide__save_alloc(s, w->pool, al);
    tide__event(s, "", "pool_allocation",
                "pool %s runs in %s job %s (nodes %s, this launch on %s, partition %s%s%s%s)",
                w->pool, al->sched, al->id, al->nodes[0] ? al->nodes : "?",
                al->node[0] ? al->node : w->host, al->partition[0] ? al->partition : "?",
                al->gpus[0] ? ", GPUs " : "", al->gpus,
                al->restarts ? ", requeued before" : "");
}

void tide__alloc_label(const tide_server_t *s, const tide_coord_worker_t *w, char *out,
                       size_t len)
{
    tide_alloc_label(tide_allocs_get(s->alloc->table, w->pool), out, len);
}

/* Appends ", NODE" (or "slurm ID NODE" for the allocation's first pool) of pool p of j. */
static size_t job_text_pool(const tide__alloc *a, const tide_coord_job_t *j, int p, char *out,
                            size_t len, size_t at)
{
    const tide_proto_alloc_t *al = tide_allocs_get(a->table, j->pools[p].name);
    if (al == NULL || j->pools[p].left || at + 1 >= len)
        return at;
    for (int q = 0; q < p; q++) { /* listed with an earlier pool of the same allocation */
        const tide_proto_alloc_t *o = tide_allocs_get(a->table, j->pools[q].name);
        if (o != NULL && !j->pools[q].left && strcmp(o->id, al->id) == 0)
            return at;
    }
    int n = snprintf(out + at, len - at, "%s%s %s ", at ? "; " : "", al->sched, al->id);
    at = n > 0 ? at + (size_t)n : at;
    int first = 1;
    for (int q = p; q < j->n_pools && at + 1 < len; q++) {
        const tide_proto_alloc_t *o = tide_allocs_get(a->table, j->pools[q].name);
        if (o == NULL || j->pools[q].left || strcmp(o->id, al->id) != 0)
            continue;
        n = snprintf(out + at, len - at, "%s%s", first ? "" : ",", o->node[0] ? o->node : "?");
        at = n > 0 ? at + (size_t)n : at;
        first = 0;
    }
    return at < len ? at : len - 1;
}

void tide__alloc_job_text(tide_server_t *s, const tide_coord_job_t *j, char *out, size_t len)
{
    tide__alloc *a = s->alloc;
    size_t at = 0;
    out[0] = '\0';
    for (int p = 0; p < j->n_pools; p++)
        at = job_text_pool(a, j, p, out, len, at);
    char waits[512];
    a->prov.ops->describe(a->prov.self, j->name, waits, sizeof waits);
    if (waits[0] != '\0' && at + 1 < len)
        snprintf(out + at, len - at, "%s%s", at ? "; " : "", waits);
}

/* ---- tidectl grow ----------------------------------------------------------------------------- */

/* The allocation of j's first pool still in the job that runs in one, or NULL. */
static const tide_proto_alloc_t *job_alloc(const tide__alloc *a, const tide_coord_job_t *j)
{
    for (int p = 0; p < j->n_pools; p++) {
        const tide_proto_alloc_t *al = tide_allocs_get(a->table, j->pools[p].name);
        if (al != NULL && !j->pools[p].left)
            return al;
    }
    return NULL;
}

/* Remembers that job asked the provider for nodes (its end cancels what still waits). */
static void asked(tide__alloc *a, const char *job)
{
    for (size_t i = 0; i < a->n_asked; i++)
        if (strcmp(a->asked[i], job) == 0)
            return;
    if (!room((void **)&a->asked, &a->cap_asked, a->n_asked, sizeof *a->asked))
        return;
    snprintf(a->asked[a->n_asked++], sizeof a->asked[0], "%s", job);
}

void tide__on_grow(tide_server_t *s, const tide_msg_t *msg, const void *raw, size_t len)
{
    (void)raw;
    (void)len;
    const tide_proto_grow_t *m = &msg->u.grow;
    tide__alloc *a = s->alloc;
    tide_coord_job_t *j = tide_coord_job_by_name(s->st, m->job);
    if (j == NULL || j->kind != TIDE_CJOB_ONLINE) {
        tide__reply_error(s, TIDE_ERR_NOT_FOUND, "no online job named %s (tidectl jobs lists them)",
                          m->job);
        return;
    }
    if (j->state == TIDE_JS_DONE || j->state == TIDE_JS_FAILED || j->state == TIDE_JS_CANCELLED) {
        tide__reply_error(s, TIDE_ERR_INVALID, "job %s has ended (%s): nothing to grow", j->name,
                          tide_jstate_name(j->state));
        return;
    }
    const tide_proto_alloc_t *al = job_alloc(a, j);
    char why[1024];
    if (al == NULL && a->slurm) {
        tide__reply_error(s, TIDE_ERR_INVALID,
                          "job %s runs in no Slurm allocation (its pools registered none): launch "
                          "it with sbatch to grow it by allocations (docs/slurm.md)",
                          j->name);
        return;
    }
    tide_status rc = a->prov.ops->grow(a->prov.self, j->name, al ? al->id : "0", m->nodes, why,
                                       sizeof why);
    if (rc != TIDE_OK) {
        tide__reply_error(s, rc, "%s", why);
        return;
    }
    asked(a, j->name);
    tide__event(s, j->name, "grow_requested", "%d more node%s for job %s asked of %s by %s",
                m->nodes, m->nodes == 1 ? "" : "s", j->name, a->prov.ops->name, s->req.who);
    tide__reply_ok(s, j->name, "%s", why);
}

/* ---- growing onto an allocation's pool --------------------------------------------------------- */

/* 1 when every rank of j's pool p registered, lives and joined j, idle or running offline
 * work (which the switch preempts). */
static int pool_ready(tide_server_t *s, const tide_coord_job_t *j, int p)
{
    for (int32_t r = 0; r < j->pools[p].size; r++) {
        const tide_coord_worker_t *w = tide_coord_worker_find(s->st, j->pools[p].name, r);
        if (w == NULL || tide_coord_worker_gone(w) || w->joined != j->id ||
            (w->state != TIDE_WS_IDLE && w->state != TIDE_WS_OFFLINE) ||
            (w->job != 0 && w->job != j->id))
            return 0;
    }
    return 1;
}

static int is_quiet(const tide__alloc *a, const tide_coord_job_t *j, const char *pool)
{
    for (size_t i = 0; i < a->n_quiet; i++)
        if (a->quiet[i].job == j->id && strcmp(a->quiet[i].pool, pool) == 0)
            return 1;
    return 0;
}

/* Pool `pool` of j is not grown onto: says why, once. */
static void quiet(tide_server_t *s, const tide_coord_job_t *j, const char *pool, const char *why)
{
    tide__alloc *a = s->alloc;
    if (room((void **)&a->quiet, &a->cap_quiet, a->n_quiet, sizeof *a->quiet)) {
        a->quiet[a->n_quiet].job = j->id;
        snprintf(a->quiet[a->n_quiet++].pool, sizeof a->quiet[0].pool, "%s", pool);
    }
    tide__event(s, j->name, "grow_skipped",
                "pool %s joined job %s but the job is not grown onto it: %s (tidectl resize "
                "places it by hand)",
                pool, j->name, why);
}

/* 1 when pool `pool` of job id asked to leave. */
static int leaving(const tide__alloc *a, int64_t job, const char *pool)
{
    for (size_t i = 0; i < a->n_leaves; i++)
        if (a->leaves[i].job == job && strcmp(a->leaves[i].pool, pool) == 0)
            return 1;
    return 0;
}

/* The largest dp above j's that the connected ranks and pool p's can hold and j's program
 * runs (its tp, pp and micro-batches kept), or 0. */
static int grown_dp(const tide_coord_job_t *j, int p)
{
    const tide_layout_t *l = j->layout;
    int per = l->tp * l->pp;
    int64_t ranks = (int64_t)tide_layout_size(l) + j->pools[p].size;
    for (int64_t d = ranks / per; d > l->dp; d--)
        if (d <= TIDE_PROTO_DEGREE_MAX &&
            tide_fit_check(j->fit, (size_t)j->n_fit, (int)d, l->tp, l->pp, l->micro_batches) ==
                TIDE_OK)
            return (int)d;
    return 0;
}

/* Candidates for growing j onto pool p: the connected pools' and p's ranks (a switch
 * connects one launch). Caller frees *out. */
static tide_status grow_candidates(tide_server_t *s, const tide_coord_job_t *j, int p,
                                   tide_policy_worker **out, size_t *n)
{
    TIDE_CHECK(tide__candidates(s, j, 1, out, n));
    size_t k = 0;
    for (size_t i = 0; i < *n; i++) {
        int32_t rank;
        int q = tide_coord_job_locate(j, (*out)[i].rank, &rank);
        if (q == p || (q >= 0 && j->pools[q].connected))
            (*out)[k++] = (*out)[i];
    }
    *n = k;
    return TIDE_OK;
}

/* Starts the switch of j onto pool p (an allocation's, al): dp grown by what it holds. */
static void grow_onto(tide_server_t *s, tide_coord_job_t *j, int p, const tide_proto_alloc_t *al)
{
    const tide_layout_t *old = j->layout;
    int dp = grown_dp(j, p);
    char why[TIDE_RECONF_REASON_MAX];
    if (dp == 0) {
        char rules[512];
        snprintf(why, sizeof why, "no more data-parallel replicas fit (%s)",
                 tide_fit_format(j->fit, (size_t)j->n_fit, rules, sizeof rules));
        quiet(s, j, j->pools[p].name, why);
        return;
    }
    tide_resize_req req = {dp,   old->tp, old->pp, old->num_layers, old->micro_batches,
                           NULL, 0,       0,       j->fit,          (size_t)j->n_fit};
    req.stage_start = old->stage_start;
    tide_policy_worker *cand = NULL;
    size_t n = 0, n_pre = 0;
    tide_collection_t *coll = NULL;
    tide_layout_t *l = NULL;
    int32_t *pre = NULL;
    tide_status rc = tide__job_collection(j, &coll);
    if (rc == TIDE_OK)
        rc = grow_candidates(s, j, p, &cand, &n);
    if (rc == TIDE_OK && (pre = tide_malloc((n ? n : 1) * sizeof *pre)) == NULL)
        rc = tide_errorf(TIDE_ERR_NOMEM, "out of memory growing job %s", j->name);
    if (rc == TIDE_OK)
        rc = tide_policy_place(old, coll, &req, cand, n, &l, pre, &n_pre);
    tide_free(cand);
    tide_collection_destroy(&coll);
    if (rc == TIDE_OK) {
        snprintf(why, sizeof why, "grow onto pool %s of %s job %s on %s: dp %d -> %d",
                 j->pools[p].name, al->sched, al->id, al->node[0] ? al->node : "?", old->dp, dp);
        rc = tide__reconf_start(s, j, l, pre, n_pre, 0, why, NULL);
        l = NULL; /* the switch owns it */
    }
    tide_layout_destroy(&l);
    tide_free(pre);
    if (rc != TIDE_OK)
        quiet(s, j, j->pools[p].name, tide_last_error());
}

/* Grows online job j onto the first of its allocation pools that is ready, if any. */
static void grow_job(tide_server_t *s, tide_coord_job_t *j)
{
    tide__alloc *a = s->alloc;
    if (j->kind != TIDE_CJOB_ONLINE || j->state != TIDE_JS_RUNNING || j->layout == NULL ||
        j->reconf != NULL)
        return;
    for (int p = 0; p < j->n_pools; p++) {
        const tide_coord_job_pool *jp = &j->pools[p];
        if (jp->connected || jp->left || leaving(a, j->id, jp->name) || is_quiet(a, j, jp->name))
            continue;
        const tide_proto_alloc_t *al = tide_allocs_get(a->table, jp->name);
        if (al == NULL || !pool_ready(s, j, p))
            continue;
        grow_onto(s, j, p, al);
        return; /* one launch per switch */
    }
}

/* ---- leaving --------------------------------------------------------------------------------- */

void tide__on_leave(tide_server_t *s, const tide_msg_t *msg, const void *raw, size_t len)
{
    (void)raw;
    (void)len;
    const tide_proto_leave_t *m = &msg->u.leave;
    tide__alloc *a = s->alloc;
    tide_coord_worker_t *w = tide__sender(s, m->worker, TIDE_MSG_LEAVE);
    if (w == NULL)
        return;
    int64_t jid = w->joined ? w->joined : w->job;
    tide_coord_job_t *j = jid ? tide_coord_job_get(s->st, jid) : NULL;
    if (j == NULL || j->kind != TIDE_CJOB_ONLINE || tide_coord_job_pool_find(j, w->pool) < 0) {
        TIDE_INFO("alloc", "worker %d asks to leave, but runs no online job: nothing to do", w->id);
        return;
    }
    if (leaving(a, j->id, w->pool)) /* every rank of the pool says so: once counts */
        return;
    if (!room((void **)&a->leaves, &a->cap_leaves, a->n_leaves, sizeof *a->leaves)) {
        TIDE_WARN("alloc", "out of memory recording pool %s's leave", w->pool);
        return;
    }
    leave_req *q = &a->leaves[a->n_leaves++];
    memset(q, 0, sizeof *q);
    q->job = j->id;
    snprintf(q->pool, sizeof q->pool, "%s", w->pool);
    snprintf(q->reason, sizeof q->reason, "%.255s", m->reason);
    const tide_proto_alloc_t *al = tide_allocs_get(a->table, w->pool);
    char where[400] = "";
    if (al != NULL)
        snprintf(where, sizeof where, " (%s job %s on %.255s)", al->sched, al->id,
                 al->node[0] ? al->node : w->host);
    tide__event(s, j->name, "leave_requested",
                "pool %s%s must give its node back: %s; job %s shrinks off it as a planned switch",
                w->pool, where, m->reason, j->name);
    if (al != NULL)
        a->prov.ops->watch(a->prov.self, j->name, al->id); /* say when it comes back */
    tide__tick_soon(s);
}

/* Stops the offline work on j's pool p (its GPUs go back to the scheduler). */
static void stop_offline(tide_server_t *s, const tide_coord_job_t *j, int p)
{
    for (int32_t r = 0; r < j->pools[p].size; r++) {
        tide_coord_worker_t *w = tide_coord_worker_find(s->st, j->pools[p].name, r);
        tide_coord_job_t *oj = w && w->offline_job ? tide_coord_job_get(s->st, w->offline_job)
                                                   : NULL;
        if (oj == NULL || oj->state != TIDE_JS_ASSIGNED || oj->worker != w->id)
            continue;
        tide__offline_send_preempt(s, oj, w);
        s->st->counters.preemptions++;
        tide__offline_requeue(s, oj, w->id, 0, "its worker's node is being taken back");
        tide__event(s, j->name, "offline_stopped",
                    "offline job %s stopped on worker %d: pool %s leaves job %s", oj->name, w->id,
                    j->pools[p].name, j->name);
    }
}

/* Ends j's pool p, never connected: its idle ranks are told the job ended for them. */
static void end_unconnected(tide_server_t *s, tide_coord_job_t *j, int p, const leave_req *q)
{
    j->pools[p].left = j->generation ? j->generation : 1;
    tide__save_job(s, j);
    tide_msg_t m;
    tide_msg_init(&m, TIDE_MSG_JOB_END);
    snprintf(m.u.job_end.job, sizeof m.u.job_end.job, "%s", j->name);
    snprintf(m.u.job_end.why, sizeof m.u.job_end.why, "its launch leaves job %s: %s", j->name,
             q->reason);
    m.u.job_end.step = j->step > 0 ? (uint64_t)j->step : 0;
    for (int32_t r = 0; r < j->pools[p].size; r++) {
        tide_coord_worker_t *w = tide_coord_worker_find(s->st, j->pools[p].name, r);
        if (w != NULL && !tide_coord_worker_gone(w))
            tide__send_worker(s, w, &m);
    }
    tide__event(s, j->name, "pool_left",
                "pool %s, never placed, leaves job %s before its node is taken back", q->pool,
                j->name);
}

/* The switch of j off its pool p: recovery's layout over the ranks that stay. */
static tide_status leave_switch(tide_server_t *s, tide_coord_job_t *j, int p, const leave_req *q,
                                char *why, size_t why_len)
{
    tide_policy_worker *cand = NULL;
    size_t n = 0, n_pre = 0;
    tide_collection_t *coll = NULL;
    tide_layout_t *l = NULL;
    int32_t *pre = NULL;
    tide_status rc = tide__job_collection(j, &coll);
    if (rc == TIDE_OK)
        rc = tide__candidates(s, j, 0, &cand, &n);
    size_t k = 0;
    for (size_t i = 0; rc == TIDE_OK && i < n; i++) {
        int32_t rank;
        if (tide_coord_job_locate(j, cand[i].rank, &rank) != p)
            cand[k++] = cand[i];
    }
    if (rc == TIDE_OK && (pre = tide_malloc((k ? k : 1) * sizeof *pre)) == NULL)
        rc = tide_errorf(TIDE_ERR_NOMEM, "out of memory shrinking job %s", j->name);
    why[0] = '\0';
    if (rc == TIDE_OK)
        rc = tide_policy_recover(j->layout, coll, j->fit, (size_t)j->n_fit, cand, k, &l, pre,
                                 &n_pre, why, why_len);
    tide_free(cand);
    tide_collection_destroy(&coll);
    if (rc == TIDE_OK) {
        char reason[TIDE_RECONF_REASON_MAX];
        snprintf(reason, sizeof reason, "leave: pool %.127s gives its node back (%.160s)%s%.250s",
                 q->pool, q->reason, why[0] ? "; " : "", why);
        rc = tide__reconf_start(s, j, l, pre, n_pre, 0, reason, NULL);
        l = NULL;
    }
    tide_layout_destroy(&l);
    tide_free(pre);
    return rc;
}

/* 1 when some rank of j's pool p is still alive. */
static int pool_alive(tide_server_t *s, const tide_coord_job_t *j, int p)
{
    for (int32_t r = 0; r < j->pools[p].size; r++) {
        const tide_coord_worker_t *w = tide_coord_worker_find(s->st, j->pools[p].name, r);
        if (w != NULL && !tide_coord_worker_gone(w))
            return 1;
    }
    return 0;
}

/* One step of leave request q; 1 when it is done with. */
static int leave_step(tide_server_t *s, leave_req *q)
{
    tide_coord_job_t *j = tide_coord_job_get(s->st, q->job);
    int p = j != NULL ? tide_coord_job_pool_find(j, q->pool) : -1;
    if (p < 0 || j->state == TIDE_JS_DONE || j->state == TIDE_JS_FAILED ||
        j->state == TIDE_JS_CANCELLED || j->pools[p].left)
        return 1; /* released (the commit said pool_left), or nothing left to leave */
    if (!q->offline_stopped) {
        stop_offline(s, j, p);
        q->offline_stopped = 1;
    }
    if (j->reconf != NULL || s->now_ns < q->next_ns)
        return 0; /* after the switch in flight (a join of this pool connects it first) */
    if (!pool_alive(s, j, p)) { /* lost before it could leave: recovery took it out */
        tide__event(s, j->name, "leave_lost",
                    "pool %s was lost before it could leave job %s (%s); recovery handled it",
                    q->pool, j->name, q->reason);
        return 1;
    }
    if (!j->pools[p].connected) {
        end_unconnected(s, j, p, q);
        return 1;
    }
    if (j->layout == NULL)
        return 0;
    char why[TIDE_PROTO_TEXT_MAX + 1];
    tide_status rc = leave_switch(s, j, p, q, why, sizeof why);
    if (rc == TIDE_OK)
        return 0; /* done once the commit releases the pool */
    q->next_ns = s->now_ns + 4 * RETRY_NS;
    if (!q->refused)
        tide__event(s, j->name, "leave_refused",
                    "pool %s cannot leave job %s live: %s; the job loses its ranks there when "
                    "the node is taken back",
                    q->pool, j->name, tide_last_error());
    q->refused = 1;
    return 0;
}

/* ---- the tick ---------------------------------------------------------------------------------- */

static void leaves_tick(tide_server_t *s)
{
    tide__alloc *a = s->alloc;
    for (size_t i = 0; i < a->n_leaves;) {
        if (leave_step(s, &a->leaves[i]))
            a->leaves[i] = a->leaves[--a->n_leaves];
        else
            i++;
    }
}

/* Jobs that asked for nodes and ended: what they still wait for is cancelled. */
static void asked_tick(tide_server_t *s)
{
    tide__alloc *a = s->alloc;
    for (size_t i = 0; i < a->n_asked;) {
        const tide_coord_job_t *j = tide_coord_job_by_name(s->st, a->asked[i]);
        if (j != NULL && j->state != TIDE_JS_DONE && j->state != TIDE_JS_FAILED &&
            j->state != TIDE_JS_CANCELLED) {
            i++;
            continue;
        }
        a->prov.ops->job_ended(a->prov.self, a->asked[i]);
        memcpy(a->asked[i], a->asked[--a->n_asked], sizeof a->asked[0]);
    }
}

typedef struct prune_ctx {
    tide_server_t *s;
    const tide_allocs_t *live;
} prune_ctx;

static void drop_dead(void *ctx, const char *pool, const tide_proto_alloc_t *al)
{
    prune_ctx *c = ctx;
    (void)al;
    if (tide_allocs_get(c->live, pool) == NULL)
        tide__save_alloc_removed(c->s, pool);
}

/* Forgets the rows of pools none of whose workers tided still knows (retention forgot
 * them): the table becomes the live pools' entries. O(workers + pools). */
static void prune(tide_server_t *s)
{
    tide__alloc *a = s->alloc;
    tide_allocs_t *live = NULL;
    if (tide_allocs_count(a->table) == 0 || tide_allocs_new(&live) != TIDE_OK)
        return;
    for (size_t i = 0; i < s->st->n_workers; i++) {
        const tide_coord_worker_t *w = &s->st->workers[i];
        const tide_proto_alloc_t *al = w->pool[0] ? tide_allocs_get(a->table, w->pool) : NULL;
        if (al != NULL && tide_allocs_get(live, w->pool) == NULL &&
            tide_allocs_put(live, w->pool, al) != TIDE_OK) {
            tide_allocs_destroy(&live); /* out of memory: forget nothing */
            return;
        }
    }
    if (tide_allocs_count(live) < tide_allocs_count(a->table)) {
        prune_ctx c = {s, live};
        tide_allocs_each(a->table, drop_dead, &c);
        tide_allocs_destroy(&a->table);
        a->table = live;
        live = NULL;
    }
    tide_allocs_destroy(&live);
}

void tide__alloc_tick(tide_server_t *s)
{
    tide__alloc *a = s->alloc;
    a->prov.ops->tick(a->prov.self, s->now_ns);
    leaves_tick(s);
    asked_tick(s);
    if (a->slurm)
        for (size_t i = 0; i < s->st->n_jobs; i++)
            grow_job(s, s->st->jobs[i]);
    if (s->now_ns >= a->next_prune_ns) {
        a->next_prune_ns = s->now_ns + PRUNE_NS;
        prune(s);
    }
}
