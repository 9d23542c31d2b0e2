/*
 * coordinator/join: a training program's ranks joining their online job (see join.h).
 */
#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "core/clock.h"
#include "core/log.h"
#include "coordinator/elastic.h"
#include "coordinator/join.h"
#include "coordinator/members.h"
#include "coordinator/offline.h"
#include "coordinator/policy.h"
#include "coordinator/sender.h"
#include "proto/proto_reshard.h"

/* "host-a: 6, host-b: 6" for the hosts of the candidates (ranks per host), truncated to
   fit out (len bytes). */
static void host_summary(tide_server_t *s, const tide_coord_job_t *j,
                         const tide_policy_worker *cand, size_t n, char *out, size_t len)
{
    size_t at = 0;
    out[0] = '\0';
    for (int32_t h = 0; at + 1 < len; h++) {
        size_t count = 0;
        const char *name = NULL;
        for (size_t i = 0; i < n; i++)
            if (cand[i].host == h) {
                count++;
                if (name == NULL) {
                    const tide_coord_worker_t *w = tide__job_worker(s, j, cand[i].rank);
                    name = w != NULL ? w->host : "?";
                }
            }
        if (count == 0)
            break;
        int w = snprintf(out + at, len - at, "%s%s: %zu", h ? ", " : "", name, count);
        at += w > 0 ? (size_t)w : 0;
    }
    if (at >= len && len > 4)
        memcpy(out + len - 4, "...", 4);
}

/* Refuses job j's first layout (the reply to the join being handled says why): every rank
 * of its launch joined, and their hosts (the candidates cand) hold only fit of the dp TP
 * groups' replicas inside hosts. The job fails with the reason, which tide_join reports on
 * every rank. */
static void refuse_first(tide_server_t *s, tide_coord_job_t *j, const tide_policy_worker *cand,
                         size_t k, int fit)
{
    char hosts[512];
    host_summary(s, j, cand, k, hosts, sizeof hosts);
    char why[TIDE_PROTO_TEXT_MAX + 1];
    snprintf(why, sizeof why,
             "job %s cannot start: its first layout (dp %d, tp %d, pp %d) needs %d TP groups "
             "of %d workers, each inside one host, and the %zu ranks of pool %s (%s) hold %d "
             "dp of them; a TP group across hosts would run its collectives over the "
             "network, so the job is refused: ask for %s",
             j->name, j->req_dp, j->req_tp, j->req_pp, j->req_dp * j->req_pp, j->req_tp, k,
             j->pools[0].name, hosts, fit,
             fit > 0 ? "a smaller dp, or launch more ranks per host" : "a smaller tp");
    tide__event(s, j->name, "job_refused", "%s", why);
    tide__job_release(s, j, TIDE_JS_FAILED);
    tide__save_job(s, j);
    tide__reply_error(s, TIDE_ERR_NO_DEVICE, "%s", why);
}

/* Job j runs its first layout l (ownership moves in): the offline work on pre[] is
 * preempted, generation 1 committed, its members told their layout. */
void tide__join_start_first(tide_server_t *s, tide_coord_job_t *j, tide_layout_t *l,
                            const int32_t *pre, size_t n_pre)
{
    size_t need = tide_layout_size(l);
    j->layout = l;
    for (size_t i = 0; i < n_pre; i++)
        tide__preempt_for(s, j, tide__job_worker(s, j, pre[i]), 1);
    j->generation = j->gen_issued = 1;
    j->state = TIDE_JS_RUNNING;
    char desc[256];
    tide_proto_event_fields_t f;
    tide_event_fields_init(&f);
    f.gen = 1;
    tide_layout_t *ids = NULL;
    (void)tide__layout_worker_ids(s, j, j->layout, &ids); /* none: the event without them */
    tide_event_fields_layout(&f, j->layout, ids, NULL);
    tide__event_f(s, j->name, "layout", &f, "generation 1: %s on %zu workers",
                  tide_layout_format(j->layout, desc, sizeof desc), need);
    tide_layout_destroy(&ids);
    tide__save_job(s, j);
    for (size_t i = 0; i < need; i++) {
        tide_coord_worker_t *w = tide__job_worker(s, j, j->layout->worker[i]);
        if (w == NULL)
            continue;
        w->state = TIDE_WS_ONLINE;
        w->job = j->id;
        tide__save_worker(s, w);
        tide__send_layout(s, j, w);
    }
}

/*
 * Gives job j its first layout over idle joined workers, when enough have joined
 * (tide_policy_first_layout). Returns 1 after refusing the join being handled (the error
 * is its reply), else 0.
 */
static int try_first_layout(tide_server_t *s, tide_coord_job_t *j)
{
    tide_policy_worker *cand = NULL;
    size_t n = 0, n_pre = 0;
    int32_t *pre = NULL;
    tide_layout_t *l = NULL;
    tide_collection_t *coll = NULL;
    tide_policy_first verdict = TIDE_FIRST_WAIT;
    int fit = 0;
    size_t need = (size_t)j->req_dp * (size_t)j->req_tp * (size_t)j->req_pp;
    if ((size_t)j->joins < need)
        return 0; /* too few joined yet: no list of the pool's ranks on every join */
    if (tide__candidates(s, j, 0, &cand, &n) != TIDE_OK) {
        TIDE_ERROR("server", "job %s: %s", j->name, tide_last_error());
        return 0;
    }
    pre = tide_malloc((n ? n : 1) * sizeof *pre);
    if (pre == NULL)
        goto out;
    tide_resize_req req = {j->req_dp, j->req_tp, j->req_pp, j->num_layers, j->req_micro,
                           NULL,      0,         0,         j->fit,        (size_t)j->n_fit};
    tide_status rc = tide__job_collection(j, &coll);
    if (rc == TIDE_OK)
        rc = tide_policy_first_layout(coll, &req, cand, &n, j->pools[0].size, &l, pre, &n_pre,
                                      &verdict, &fit);
    if (rc != TIDE_OK)
        tide__event(s, j->name, "job_waiting", "no first layout: %s", tide_last_error());
    else if (verdict == TIDE_FIRST_REFUSE)
        refuse_first(s, j, cand, n, fit);
    else if (verdict == TIDE_FIRST_PLACED)
        tide__join_start_first(s, j, l, pre, n_pre);
    if (verdict == TIDE_FIRST_PLACED)
        l = NULL;
out:
    tide_layout_destroy(&l);
    tide_collection_destroy(&coll);
    tide_free(pre);
    tide_free(cand);
    return verdict == TIDE_FIRST_REFUSE;
}

/* A join's first layout against its own fit rules; TIDE_ERR_INVALID naming the rule. */
static tide_status join_fits(const tide_proto_join_t *m)
{
    tide_fit_rule fit[TIDE_FIT_RULES_MAX];
    tide_proto_fit_to(fit, m->fit, m->n_fit); /* the decoder bounded n_fit */
    if (tide_fit_check(fit, m->n_fit, m->dp, m->tp, m->pp, m->micro_batches) != TIDE_OK)
        return tide_errorf(TIDE_ERR_INVALID,
                           "its first layout (dp %d, tp %d, pp %d) is not one its program can "
                           "run: %s",
                           m->dp, m->tp, m->pp, tide_last_error());
    return TIDE_OK;
}

/* The elastic declaration join m makes at launch, checked as tidectl bounds checks one
   (tide_elastic_check); TIDE_OK when it declares no bounds (a priority alone is in range:
   the decoder saw to it). */
static tide_status join_bounds_ok(const tide_proto_join_t *m)
{
    if (m->max_gpus == 0)
        return TIDE_OK;
    tide_fit_rule fit[TIDE_FIT_RULES_MAX];
    tide_proto_fit_to(fit, m->fit, m->n_fit);
    tide_elastic_job e;
    memset(&e, 0, sizeof e);
    e.priority = m->priority;
    e.min_gpus = m->min_gpus;
    e.max_gpus = m->max_gpus;
    e.tp = m->tp;
    e.pp = m->pp;
    e.micro = m->micro_batches;
    e.num_layers = m->num_layers;
    e.fit = fit;
    e.n_fit = m->n_fit;
    if (tide_elastic_check(&e, NULL, NULL) != TIDE_OK)
        return tide_errorf(TIDE_ERR_INVALID, "its bounds %d-%d GPUs: %s", m->min_gpus, m->max_gpus,
                           tide_last_error());
    return TIDE_OK;
}

/* 1 when job j (bounds declared, no layout yet) must wait for the elastic policy to place
 * its first layout (elastic_tided.c, rule START, with yields of lower priorities): worker
 * w, which just joined it, or one before it sits on a GPU a member of another job holds.
 * Sets j->el_first_waits. */
static int first_waits(tide_server_t *s, tide_coord_job_t *j, const tide_coord_worker_t *w)
{
    if (j->el_max <= 0 || j->layout != NULL)
        return 0;
    const tide_coord_state_t *st = s->st;
    for (size_t i = 0; !j->el_first_waits && i < st->n_workers; i++) {
        const tide_coord_worker_t *o = &st->workers[i];
        /* another job's member on the same GPU: the policy decides who runs there */
        j->el_first_waits = o->pool[0] != '\0' && o->job != 0 && o->job != j->id &&
                            !tide_coord_worker_gone(o) && o->device == w->device &&
                            strcmp(o->host, w->host) == 0;
    }
    return j->el_first_waits;
}

/* Applies the bounds and priority join m declares to job j, which it just made (or runs
   again with none of its own): what tidectl bounds and priority would set, and their
   event. A job's later joins change nothing (tidectl's changes stand). */
static void declare_at_launch(tide_server_t *s, tide_coord_job_t *j, const tide_coord_worker_t *w,
                              const tide_proto_join_t *m)
{
    if (m->max_gpus == 0 && m->priority == 0)
        return;
    if (m->max_gpus > 0) {
        j->el_min = m->min_gpus;
        j->el_max = m->max_gpus;
        j->el_hold = TIDE_EL_FREE;
    }
    j->priority = m->priority;
    tide__event(s, j->name, "elastic_bounds",
                "bounds %d-%d GPUs, priority %d, free, %lld steps in all (0: unknown), declared "
                "at launch by pool %s",
                j->el_min, j->el_max, j->priority, (long long)j->el_steps, w->pool);
}

static void keep_join(tide_coord_job_t *j, const tide_proto_join_t *m, const void *raw, size_t len)
{
    j->req_dp = m->dp;
    j->req_tp = m->tp;
    j->req_pp = m->pp;
    j->req_micro = m->micro_batches;
    j->num_layers = m->num_layers;
    j->total_bytes = m->total_bytes;
    tide_proto_fit_to(j->fit, m->fit, m->n_fit);
    j->n_fit = (int)m->n_fit;
    tide_free(j->join_blob);
    j->join_blob = tide_malloc(len);
    j->join_len = 0;
    if (j->join_blob != NULL) {
        memcpy(j->join_blob, raw, len);
        j->join_len = len;
    }
}

/* 1 when join m describes the same model as job j's first join (layers and tensors). */
static int same_model(const tide_coord_job_t *j, const tide_proto_join_t *m)
{
    if (j->join_blob == NULL)
        return 1;
    tide_msg_t jm;
    if (tide_proto_decode(j->join_blob, j->join_len, &jm) != TIDE_OK)
        return 0;
    const tide_proto_join_t *o = &jm.u.join;
    int same = jm.type == TIDE_MSG_JOIN && o->num_layers == m->num_layers &&
               o->n_tensors == m->n_tensors && o->total_bytes == m->total_bytes &&
               o->n_fit == m->n_fit;
    for (uint32_t i = 0; same && i < m->n_fit; i++) /* the same program: the same limits */
        same = o->fit[i].degree == m->fit[i].degree && o->fit[i].n == m->fit[i].n &&
               strcmp(o->fit[i].what, m->fit[i].what) == 0;
    for (uint32_t i = 0; same && i < m->n_tensors; i++) {
        const tide_proto_tensor_t *a = &o->tensors[i], *b = &m->tensors[i];
        same = strcmp(a->name, b->name) == 0 && a->dtype == b->dtype && a->ndim == b->ndim &&
               memcmp(a->shape, b->shape, sizeof a->shape) == 0 && a->layer == b->layer &&
               a->tp == b->tp && a->tp_dim == b->tp_dim && a->tp_segments == b->tp_segments &&
               a->dp == b->dp;
    }
    tide_msg_clear(&jm);
    tide_error_clear();
    return same;
}

/* 1 (after replying the error) when w's pool cannot start job m: its first layout is
   malformed or needs more ranks than the pool has. Only the launch that starts a job is
   held to its layout; a pool launched later joins whatever the job runs, at any size. */
static int refuse_first_layout(tide_server_t *s, const tide_coord_worker_t *w,
                               const tide_proto_join_t *m)
{
    tide_layout_t *probe = NULL;
    tide_status rc = tide_layout_new(&probe, m->dp, m->tp, m->pp, m->num_layers, m->micro_batches);
    tide_layout_destroy(&probe);
    if (rc == TIDE_OK)
        rc = join_fits(m); /* the program's own rules, before a job is made of it */
    if (rc == TIDE_OK)
        rc = join_bounds_ok(m);
    if (rc != TIDE_OK) {
        tide__reply_error(s, rc, "job %s cannot start: %s", m->job, tide_last_error());
        return 1;
    }
    long long need = (long long)m->dp * m->tp * m->pp;
    if (need > w->pool_size) {
        tide__reply_error(s, TIDE_ERR_INVALID,
                          "job %s asks for dp %d x tp %d x pp %d = %lld workers; pool %s has %d "
                          "ranks (a pool launched later joins a running job at any size)",
                          m->job, m->dp, m->tp, m->pp, need, w->pool, w->pool_size);
        return 1;
    }
    return 0;
}

/* A new online job m->job, launched by w's pool; NULL after an error reply. */
static tide_coord_job_t *new_job(tide_server_t *s, const tide_coord_worker_t *w,
                                 const tide_proto_join_t *m, const void *raw, size_t len)
{
    tide_coord_job_t *j = NULL;
    if (refuse_first_layout(s, w, m))
        return NULL;
    tide_status rc = tide_coord_job_add(s->st, 0, TIDE_CJOB_ONLINE, &j);
    if (rc != TIDE_OK) {
        tide__reply_error(s, rc, "%s", tide_last_error());
        return NULL;
    }
    snprintf(j->name, sizeof j->name, "%s", m->job);
    j->n_pools = 0;
    rc = tide_coord_job_add_pool(j, w->pool, w->pool_size, 1);
    if (rc != TIDE_OK) {
        tide__reply_error(s, rc, "%s", tide_last_error());
        return NULL;
    }
    j->state = TIDE_JS_QUEUED;
    j->created_ms = tide_wall_ms();
    keep_join(j, m, raw, len);
    char fit[TIDE_FIT_RULES_MAX * (TIDE_FIT_WHAT_MAX + 32)];
    tide__event(s, j->name, "job_created",
                "online job in pool %s: %d layers, %llu bytes of state, %u tensors, first "
                "layout (dp %d, tp %d, pp %d); fit: %s",
                w->pool, j->num_layers, (unsigned long long)j->total_bytes, m->n_tensors, m->dp,
                m->tp, m->pp, tide_fit_format(j->fit, (size_t)j->n_fit, fit, sizeof fit));
    declare_at_launch(s, j, w, m);
    tide__save_job(s, j);
    return j;
}

/* Online job j ended (or was refused), or every rank of its launch is gone (it could only
 * wait forever): a new run of the program under the same name, in w's pool, starts it
 * again. NULL after an error reply. */
static tide_coord_job_t *relaunch(tide_server_t *s, tide_coord_job_t *j,
                                  const tide_coord_worker_t *w, const tide_proto_join_t *m,
                                  const void *raw, size_t len)
{
    if (j->state != TIDE_JS_DONE && j->state != TIDE_JS_CANCELLED && j->state != TIDE_JS_FAILED) {
        tide__event(s, j->name, "job_ended",
                    "every rank of pool %s is gone (job was %s): pool %s relaunches it",
                    j->pools[0].name, tide_jstate_name(j->state), w->pool);
        tide__job_release(s, j, TIDE_JS_DONE);
    }
    if (refuse_first_layout(s, w, m))
        return NULL;
    tide_layout_destroy(&j->layout);
    j->n_pools = 0;
    tide_status rc = tide_coord_job_add_pool(j, w->pool, w->pool_size, 1);
    if (rc != TIDE_OK) {
        tide__reply_error(s, rc, "%s", tide_last_error());
        return NULL;
    }
    j->state = TIDE_JS_QUEUED;
    j->generation = j->gen_issued = 0;
    j->step = 0;
    j->joins = 0;
    j->throughput = 0;
    j->speed_t0_ns = 0;
    keep_join(j, m, raw, len);
    char fit[TIDE_FIT_RULES_MAX * (TIDE_FIT_WHAT_MAX + 32)];
    tide__event(s, j->name, "job_created",
                "online job %s runs again in pool %s: %d layers, %u tensors, first layout "
                "(dp %d, tp %d, pp %d); fit: %s",
                j->name, w->pool, j->num_layers, m->n_tensors, m->dp, m->tp, m->pp,
                tide_fit_format(j->fit, (size_t)j->n_fit, fit, sizeof fit));
    if (j->el_max == 0) /* bounds an operator gave the job before stand */
        declare_at_launch(s, j, w, m);
    tide__save_job(s, j);
    return j;
}

/* w's pool, launched later for running job j, joins it: its ranks are idle ranks of the
 * job, connected to its communicators by the resize that first places them. 0 after an
 * error reply. */
static int add_pool(tide_server_t *s, tide_coord_job_t *j, const tide_coord_worker_t *w,
                    const tide_proto_join_t *m)
{
    if (j->layout == NULL) {
        tide__reply_error(s, TIDE_ERR_BUSY,
                          "job %s is still placing its first layout in pool %s; pool %s can "
                          "join it once it runs",
                          m->job, j->pools[0].name, w->pool);
        return 0;
    }
    if (!same_model(j, m)) {
        tide__reply_error(s, TIDE_ERR_INVALID,
                          "pool %s joins job %s with another model (its tensors or fit "
                          "rules differ from the job's): launch the same program",
                          w->pool, m->job);
        return 0;
    }
    tide_status rc = tide_coord_job_add_pool(j, w->pool, w->pool_size, 0);
    if (rc != TIDE_OK) {
        tide__reply_error(s, rc, "pool %s cannot join job %s: %s", w->pool, m->job,
                          tide_last_error());
        return 0;
    }
    const tide_coord_job_pool *jp = &j->pools[j->n_pools - 1];
    tide__event(s, j->name, "pool_joined",
                "pool %s (%d ranks, host %s) joined as job ranks %d..%d; a resize places "
                "the job on them",
                jp->name, jp->size, w->host, jp->base, jp->base + jp->size - 1);
    tide__save_job(s, j);
    return 1;
}

/* The online job w joins with m: found, created, run again or joined by a new pool; NULL
 * after an error reply. */
static tide_coord_job_t *job_to_join(tide_server_t *s, const tide_coord_worker_t *w,
                                     const tide_proto_join_t *m, const void *raw, size_t len)
{
    tide_coord_job_t *j = tide_coord_job_by_name(s->st, m->job);
    if (j == NULL)
        return new_job(s, w, m, raw, len);
    if (j->kind != TIDE_CJOB_ONLINE) {
        tide__reply_error(s, TIDE_ERR_EXISTS, "job name %s belongs to an offline job", m->job);
        return NULL;
    }
    if (j->state == TIDE_JS_DONE || j->state == TIDE_JS_CANCELLED || j->state == TIDE_JS_FAILED ||
        (tide_coord_job_pool_find(j, w->pool) < 0 && tide__live_members(s, j) == 0))
        return relaunch(s, j, w, m, raw, len);
    if (tide_coord_job_pool_find(j, w->pool) < 0 && !add_pool(s, j, w, m))
        return NULL;
    return j;
}

void tide__on_join(tide_server_t *s, const tide_msg_t *msg, const void *raw, size_t len)
{
    const tide_proto_join_t *m = &msg->u.join;
    tide_coord_worker_t *w = tide__sender(s, m->worker, TIDE_MSG_JOIN);
    tide_coord_job_t *j = w != NULL ? job_to_join(s, w, m, raw, len) : NULL;
    if (j == NULL)
        return;
    if (w->joined != j->id) {
        w->joined = j->id;
        j->joins++;
        tide__save_worker(s, w);
    }
    if (j->layout == NULL && first_waits(s, j, w)) {
        /* GPUs of its ranks run a job of its own or lower priority: the elastic policy
           places it when they are given up (elastic_tided.c) */
        tide__reply_ok(s, j->name,
                       "joined job %s; the GPUs of its ranks are held by other jobs: its "
                       "first layout waits for the elastic policy",
                       j->name);
        tide__reschedule(s);
        return;
    }
    if (j->layout == NULL) {
        if (try_first_layout(s, j))
            return; /* refused: the reply says why */
        if (j->layout == NULL)
            tide__reply_ok(s, j->name, "joined job %s; waiting for %d workers to join", j->name,
                           j->req_dp * j->req_tp * j->req_pp);
        else if (!(w->state == TIDE_WS_ONLINE && w->job == j->id))
            tide__reply_ok(s, j->name, "joined job %s; not in its first layout: waiting idle",
                           j->name);
        return;
    }
    if (w->state == TIDE_WS_ONLINE && w->job == j->id) {
        tide__send_layout(s, j, w); /* a member joining again (after a tided restart) */
        return;
    }
    int jp = tide_coord_job_pool_find(j, w->pool);
    if (jp > 0 && !j->pools[jp].connected) {
        /* a joining pool's rank starts idle at the job's generation, knowing its job rank */
        tide__send_layout(s, j, w);
        tide__reschedule(s);
        return;
    }
    tide__reply_ok(s, j->name, "joined job %s; not in its layout: waiting idle for a resize",
                   j->name);
    tide__reschedule(s);
}
