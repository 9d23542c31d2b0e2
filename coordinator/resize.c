/*
 * coordinator/resize: an operator's resize (see resize.h). The estimate is the plan's
 * totals only (bytes, cross-host bytes, the busiest worker): the items (every transfer of
 * every worker) are the workers' business, and building them here cost a resize of a job
 * on many hosts seconds.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "core/log.h"
#include "coordinator/elastic_tided.h"
#include "coordinator/members.h"
#include "coordinator/policy.h"
#include "coordinator/reconf.h"
#include "coordinator/resize.h"
#include "proto/proto_reshard.h"
#include "reshard/reshard.h"

typedef struct host_ref {
    const char *host;
    size_t idx;
} host_ref;

static int cmp_host_ref(const void *a, const void *b)
{
    return strcmp(((const host_ref *)a)->host, ((const host_ref *)b)->host);
}

/*
 * The host of every job rank of layouts a and b, as indices (host_of[rank]; -1 where no
 * worker is registered): what reshard counts cross-host bytes with. *n: one past the
 * largest rank. Caller frees *out.
 */
static tide_status rank_hosts(tide_server_t *s, const tide_coord_job_t *j, const tide_layout_t *a,
                              const tide_layout_t *b, int32_t **out, size_t *n)
{
    size_t na = tide_layout_size(a), nb = tide_layout_size(b), top = 0;
    for (size_t i = 0; i < na; i++)
        top = (size_t)a->worker[i] + 1 > top ? (size_t)a->worker[i] + 1 : top;
    for (size_t i = 0; i < nb; i++)
        top = (size_t)b->worker[i] + 1 > top ? (size_t)b->worker[i] + 1 : top;
    int32_t *host = tide_malloc((top ? top : 1) * sizeof *host);
    host_ref *h = tide_malloc((na + nb ? na + nb : 1) * sizeof *h);
    if (host == NULL || h == NULL) {
        tide_free(host);
        tide_free(h);
        return tide_errorf(TIDE_ERR_NOMEM, "out of memory mapping %zu ranks to hosts", top);
    }
    size_t k = 0;
    for (size_t i = 0; i < top; i++)
        host[i] = -1;
    for (size_t i = 0; i < na + nb; i++) {
        int32_t r = i < na ? a->worker[i] : b->worker[i - na];
        if (host[r] != -1)
            continue;
        host[r] = -2; /* seen */
        const tide_coord_worker_t *w = tide__job_worker(s, j, r);
        if (w != NULL)
            h[k++] = (host_ref){w->host, (size_t)r};
    }
    for (size_t i = 0; i < top; i++)
        host[i] = -1;
    qsort(h, k, sizeof *h, cmp_host_ref);
    int32_t id = -1;
    for (size_t i = 0; i < k; i++) {
        if (i == 0 || strcmp(h[i].host, h[i - 1].host) != 0)
            id++;
        host[h[i].idx] = id;
    }
    tide_free(h);
    *out = host;
    *n = top;
    return TIDE_OK;
}

/* Bytes the plan from j's layout to nl sends (*sent) and the part of them that crosses
 * hosts (*cross), with its summary into r when non-NULL. The totals only, cross-host bytes
 * included: the items (every transfer of every worker) are the workers' business, and
 * building them here cost a resize of a job on many hosts seconds. */
static tide_status plan_bytes(tide_server_t *s, const tide_coord_job_t *j,
                              const tide_collection_t *c, const tide_layout_t *nl, uint64_t *sent,
                              uint64_t *cross, tide_proto_resize_reply_t *r)
{
    tide_plan_totals t;
    int32_t *host = NULL;
    size_t n_host = 0;
    TIDE_CHECK(rank_hosts(s, j, j->layout, nl, &host, &n_host));
    tide_status rc = tide_reshard_plan_totals_hosts(j->layout, nl, c, NULL, 0, host, n_host, &t);
    tide_free(host);
    if (rc != TIDE_OK)
        return rc;
    *sent = t.bytes_sent;
    *cross = t.cross_host;
    if (r != NULL) {
        r->bytes_sent = t.bytes_sent;
        r->bytes_local = t.bytes_local;
        r->max_send = t.max_send;
        r->messages = t.messages;
        uint64_t busiest = t.max_send > t.max_recv ? t.max_send : t.max_recv;
        r->est_ms =
            s->cfg.link_bytes_per_s > 0 ? 1000.0 * (double)busiest / s->cfg.link_bytes_per_s : 0.0;
    }
    return TIDE_OK;
}

/*
 * Fills r's plan summary for the switch of j to nl and, in bytes_default, the
 * bytes the plain rank order (dflt) would send. Nothing when the job joined
 * without tensors (no collection).
 */
static void plan_estimate(tide_server_t *s, const tide_coord_job_t *j, const tide_collection_t *c,
                          const tide_layout_t *nl, const tide_layout_t *dflt,
                          tide_proto_resize_reply_t *r)
{
    uint64_t sent = 0, cross = 0;
    if (j->layout == NULL || c == NULL)
        return;
    if (plan_bytes(s, j, c, nl, &sent, &cross, r) != TIDE_OK) {
        TIDE_INFO("reconf", "job %s: no plan estimate: %s", j->name, tide_last_error());
        return;
    }
    r->bytes_default = sent;
    r->cross_host = r->cross_host_default = cross;
    if (dflt != NULL && plan_bytes(s, j, c, dflt, &sent, &cross, NULL) == TIDE_OK) {
        r->bytes_default = sent;
        r->cross_host_default = cross;
    }
}

/* The online job m resizes, when it can now; NULL after an error reply. */
static tide_coord_job_t *resizable_job(tide_server_t *s, const tide_proto_resize_t *m)
{
    tide_coord_job_t *j = tide_coord_job_by_name(s->st, m->job);
    if (j == NULL || j->kind != TIDE_CJOB_ONLINE) {
        tide__reply_error(s, TIDE_ERR_NOT_FOUND, "no online job named %s (tidectl jobs lists them)",
                          m->job);
        return NULL;
    }
    if (j->state == TIDE_JS_DONE) {
        tide__reply_error(s, TIDE_ERR_INVALID,
                          "job %s has ended (its training program said bye); nothing to resize",
                          j->name);
        return NULL;
    }
    if (j->layout == NULL) {
        tide__reply_error(s, TIDE_ERR_BUSY,
                          "job %s has no layout yet: its workers are still joining", j->name);
        return NULL;
    }
    if (j->reconf != NULL) {
        tide__reply_error(s, TIDE_ERR_BUSY,
                          "job %s is already switching to generation %llu (%s); wait for it to "
                          "finish (tidectl jobs)",
                          j->name, (unsigned long long)j->reconf->gen, j->reconf->reason);
        return NULL;
    }
    return j;
}

/* m as policy.h's request over job j (stages borrowed from m or j); 0 after an error
 * reply. */
static int resize_req(tide_server_t *s, const tide_coord_job_t *j, const tide_proto_resize_t *m,
                      tide_resize_req *req)
{
    *req = (tide_resize_req){m->dp,
                             m->tp,
                             m->pp,
                             j->layout->num_layers,
                             m->micro_batches > 0 ? m->micro_batches : j->layout->micro_batches,
                             NULL,
                             m->placement == TIDE_PLACEMENT_DEFAULT,
                             m->tp_across_hosts,
                             j->fit,
                             (size_t)j->n_fit};
    if (m->n_stages != 0) {
        if (m->n_stages != (uint32_t)m->pp + 1 || m->stage_start[m->pp] != j->layout->num_layers) {
            tide__reply_error(s, TIDE_ERR_INVALID,
                              "stages must give pp + 1 = %d boundaries ending at the model's %d "
                              "layers",
                              m->pp + 1, j->layout->num_layers);
            return 0;
        }
        req->stage_start = m->stage_start;
    } else if (m->pp == j->layout->pp) {
        req->stage_start = j->layout->stage_start; /* pp stays: so do its stages */
    }
    return 1;
}

/* A resize as placed: its layout (job ranks), the ranks whose offline work it preempts,
 * the job's tensors and, for a dry run, the plain rank order's layout to compare. */
typedef struct placement {
    tide_layout_t *l, *dflt;
    int32_t *pre;
    size_t n_pre;
    tide_collection_t *c;
} placement;

static void placement_clear(placement *p)
{
    tide_layout_destroy(&p->l);
    tide_layout_destroy(&p->dflt);
    tide_free(p->pre);
    tide_collection_destroy(&p->c);
    memset(p, 0, sizeof *p);
}

/* Places req over j's candidates (dry_run: the plain rank order too, for comparison). */
static tide_status place(tide_server_t *s, const tide_coord_job_t *j, const tide_resize_req *req,
                         int dry_run, placement *p)
{
    tide_policy_worker *cand = NULL;
    size_t n = 0, n_pre_d = 0;
    int32_t *pre_d = NULL;
    memset(p, 0, sizeof *p);
    tide_status rc = tide__job_collection(j, &p->c);
    if (rc == TIDE_OK)
        rc = tide__candidates(s, j, 1, &cand, &n);
    if (rc == TIDE_OK) {
        p->pre = tide_malloc((n ? n : 1) * sizeof *p->pre);
        rc = p->pre ? tide_policy_place(j->layout, p->c, req, cand, n, &p->l, p->pre, &p->n_pre)
                    : tide_errorf(TIDE_ERR_NOMEM, "out of memory placing the resize");
    }
    if (rc == TIDE_OK && dry_run && p->c != NULL) {
        tide_resize_req plain = *req;
        plain.plain = 1;
        pre_d = tide_malloc((n ? n : 1) * sizeof *pre_d);
        if (pre_d == NULL || tide_policy_place(j->layout, p->c, &plain, cand, n, &p->dflt, pre_d,
                                               &n_pre_d) != TIDE_OK)
            TIDE_INFO("reconf", "job %s: no default-order layout to compare: %s", j->name,
                      pre_d ? tide_last_error() : "out of memory");
    }
    tide_free(cand);
    tide_free(pre_d);
    return rc;
}

void tide__on_resize(tide_server_t *s, const tide_msg_t *msg, const void *raw, size_t len)
{
    (void)raw;
    (void)len;
    const tide_proto_resize_t *m = &msg->u.resize;
    tide_resize_req req;
    placement p;
    tide_coord_job_t *j = resizable_job(s, m);
    if (j == NULL || !resize_req(s, j, m, &req))
        return;
    tide_status rc = place(s, j, &req, m->dry_run, &p);
    tide_msg_t reply;
    tide_msg_init(&reply, TIDE_MSG_RESIZE_REPLY);
    tide_proto_resize_reply_t *rr = &reply.u.resize_reply;
    snprintf(rr->job, sizeof rr->job, "%s", j->name);
    rr->dry_run = m->dry_run;
    rr->preempted = (uint32_t)p.n_pre;
    if (rc == TIDE_OK)
        plan_estimate(s, j, p.c, p.l, p.dflt, rr);
    /* the operator sees the members as tided's worker ids (tidectl status), not pool ranks */
    tide_layout_t *shown = NULL;
    if (rc == TIDE_OK)
        rc = tide__layout_worker_ids(s, j, p.l, &shown);
    if (rc != TIDE_OK) {
        placement_clear(&p);
        tide__reply_error(s, rc, "cannot resize %s: %s", j->name, tide_last_error());
        return;
    }
    tide_proto_layout_from(&rr->layout, shown, j->gen_issued + 1);
    tide__reply(s, &reply); /* encoded now: shown is still alive */
    tide_layout_destroy(&shown);
    if (m->dry_run) {
        placement_clear(&p);
        return;
    }
    char why[128];
    snprintf(why, sizeof why, "resize by %s", s->req.who);
    rc = tide__reconf_start(s, j, p.l, p.pre, p.n_pre, 0, why, NULL);
    p.l = NULL; /* the switch owns it, or freed it */
    placement_clear(&p);
    if (rc != TIDE_OK) {
        TIDE_ERROR("reconf", "job %s: %s", j->name, tide_last_error());
        return;
    }
    j->reconf->planned_bytes = rr->bytes_sent;
    tide__elastic_operator_resized(s, j);
}
