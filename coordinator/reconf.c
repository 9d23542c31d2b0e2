/*
 * coordinator/reconf: switching an online job to a new layout (resize, drain,
 * recovery), tided's side of the protocol in DESIGN.md "Reconfiguration".
 *
 * Protocol (all `step` values count completed training steps):
 *  1. tided validates and places the new layout, preempts offline work on the
 *     workers it takes, records the intent (job row with the pending
 *     generation G, phase PREPARE) and commits it, then sends every
 *     participant (old members and new ones) `layout` {G, prev = the committed
 *     layout} followed by `prepare` {G, step = tided's guess of the next step}.
 *  2. Each participant answers `prepare_ack` {G, step = steps it has
 *     completed}. Rule for a participant after acking: it may finish at most
 *     ONE more step under the old layout, then waits at the step boundary for
 *     `commit` or `abort`. A worker preempted for the grow acks only once its
 *     offline work has stopped. New-only participants' steps are ignored.
 *  3. When every live participant has acked, tided sets the switch step S =
 *     max(acked steps of old members) + 1 (recovery: S = min, the survivors
 *     having stopped training; a survivor stuck in a step it can complete without
 *     peers, tide_step_can_finish, acks that step as reached and finishes it alone
 *     when S asks), records phase COMMIT with S durably and sends `commit`
 *     {G, S, recover}. Every old member runs until it has completed exactly S
 *     steps (no one can be past S, by the rule in 2), then switches: reshard,
 *     new communicators; the first step under G is step S (none lost, none
 *     repeated). Each participant then sends `done` {G, status}.
 *  4. When every live participant reported done with status 0, tided commits
 *     generation G (job row, worker rows, event) before anything else is
 *     acknowledged; workers not in the new layout become idle (or stay
 *     draining) and are offered offline work.
 *  Failure: a participant that fails (heartbeats, `failure`, restart) or
 *  reports done with an error, or the deadline (--resize-timeout-ms), aborts G
 *  (unless some participant already reported done: see below):
 *  tided sends `abort` {G} and the participants go on with (or return to) the
 *  committed layout from the step they stopped at, discarding partial new state.
 *  If an old member was lost, tided then starts a recovery: a new layout over
 *  the survivors (policy.h), same protocol with the recovery switch rule.
 *  Retransmission: tided resends the current phase's message to live
 *  participants that have not answered, every 2 heartbeat periods and when a
 *  participant registers again; participants must answer duplicates (a prepare
 *  or commit for a generation already acked / done) with the same ack / done.
 *  Generations are never reused: an aborted G is skipped.
 *  After the first done (status 0) of G that worker runs under G and cannot go
 *  back, so G is no longer abandoned: a failing participant (or one silent at
 *  the deadline, which is then declared failed) makes tided commit G over the
 *  live participants and start a recovery from G's layout (prev = G). That
 *  point is durable (the job row's rc_switched).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/clock.h"
#include "core/error.h"
#include "core/log.h"
#include "coordinator/policy.h"
#include "coordinator/server_int.h"
#include "reshard/reshard.h"

typedef struct host_ref {
    const char *host;
    size_t idx;
} host_ref;

static int cmp_host_ref(const void *a, const void *b)
{
    return strcmp(((const host_ref *)a)->host, ((const host_ref *)b)->host);
}

tide_status tide__candidates(tide_server_t *s, const tide_coord_job_t *j, int32_t exclude_id,
                             int joining, tide_policy_worker **out, size_t *n_out)
{
    tide_coord_state_t *st = s->st;
    *out = NULL;
    *n_out = 0;
    /* the job's launches' ranks, through the (pool, rank) index: a decision costs the job's
       size, not the worker table's */
    size_t cap = 1;
    for (int p = 0; p < j->n_pools; p++)
        cap += (size_t)j->pools[p].size;
    int32_t world = tide_coord_job_world(j, 0);
    tide_policy_worker *c = tide_malloc(cap * sizeof *c);
    host_ref *h = tide_malloc(cap * sizeof *h);
    uint8_t *member = tide_calloc(world > 0 ? (size_t)world : 1, 1); /* job rank in the layout */
    if (c == NULL || h == NULL || member == NULL) {
        tide_free(c);
        tide_free(h);
        tide_free(member);
        return tide_errorf(TIDE_ERR_NOMEM, "out of memory listing candidate workers");
    }
    for (size_t i = 0; j->layout != NULL && i < tide_layout_size(j->layout); i++)
        if (j->layout->worker[i] >= 0 && j->layout->worker[i] < world)
            member[j->layout->worker[i]] = 1;
    size_t n = 0;
    for (int p = 0; p < j->n_pools; p++) {
        if (j->pools[p].left || (!j->pools[p].connected && !joining))
            continue; /* a pool that left: its launch has exited or is exiting */
        for (int32_t rank = 0; rank < j->pools[p].size; rank++) {
            const tide_coord_worker_t *w = tide_coord_worker_find(st, j->pools[p].name, rank);
            if (w == NULL || w->id == exclude_id)
                continue;
            if (tide_coord_worker_gone(w) || w->state == TIDE_WS_DRAINING)
                continue;
            int32_t jr = j->pools[p].base + w->rank;
            tide_policy_worker pw = {jr, 0, TIDE_PW_IDLE, 0};
            if (w->state == TIDE_WS_ONLINE && w->job == j->id && jr < world && member[jr]) {
                pw.cls = TIDE_PW_MEMBER;
            } else if (w->joined != j->id) {
                continue; /* runs another program: cannot take a coordinate of this job */
            } else if (w->state == TIDE_WS_IDLE && (w->job == 0 || w->job == j->id)) {
                pw.cls = TIDE_PW_IDLE;
            } else if (w->state == TIDE_WS_OFFLINE && w->offline_job != 0) {
                const tide_coord_job_t *oj = tide_coord_job_get(st, w->offline_job);
                pw.cls = TIDE_PW_OFFLINE;
                pw.priority = oj ? oj->priority : 0;
            } else {
                continue;
            }
            h[n] = (host_ref){w->host, n};
            c[n++] = pw;
        }
    }
    tide_free(member);
    qsort(h, n, sizeof *h, cmp_host_ref);
    int32_t host = -1;
    for (size_t i = 0; i < n; i++) {
        if (i == 0 || strcmp(h[i].host, h[i - 1].host) != 0)
            host++;
        c[h[i].idx].host = host;
    }
    tide_free(h);
    *out = c;
    *n_out = n;
    return TIDE_OK;
}

/* ---- the job's tensors: placement and --dry-run estimates ---------------------------------- */

tide_status tide__job_collection(const tide_coord_job_t *j, tide_collection_t **out)
{
    *out = NULL;
    if (j->join_blob == NULL)
        return TIDE_OK;
    tide_msg_t jm;
    tide_status rc = tide_proto_decode(j->join_blob, j->join_len, &jm);
    if (rc != TIDE_OK)
        return tide_errorf(rc, "job %s: its stored join message does not decode: %s", j->name,
                           tide_last_error());
    tide_collection_t *c = NULL;
    if (jm.type != TIDE_MSG_JOIN || jm.u.join.n_tensors == 0)
        goto out;
    TIDE_CHECK_GOTO(tide_collection_new(&c, jm.u.join.num_layers), rc, out);
    for (uint32_t i = 0; i < jm.u.join.n_tensors; i++) {
        const tide_proto_tensor_t *t = &jm.u.join.tensors[i];
        tide_tensor_desc d;
        memset(&d, 0, sizeof d);
        snprintf(d.name, sizeof d.name, "%s", t->name);
        d.dtype = (tide_dtype)t->dtype;
        d.ndim = t->ndim;
        memcpy(d.shape, t->shape, sizeof d.shape);
        d.layer = t->layer;
        d.tp = (tide_tp_rule)t->tp;
        d.tp_dim = t->tp_dim;
        d.tp_segments = t->tp_segments;
        d.dp = (tide_dp_rule)t->dp;
        TIDE_CHECK_GOTO(tide_collection_add(c, &d), rc, out);
    }
    *out = c;
    c = NULL;
out:
    tide_collection_destroy(&c);
    tide_msg_clear(&jm);
    return rc;
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

/* ---- sending the phases ---------------------------------------------------------------------- */

/* The join's port name to w, a rank of the joining pool. */
static void send_port(tide_server_t *s, const tide_coord_job_t *j, const tide_coord_worker_t *w)
{
    tide_msg_t m;
    tide_msg_init(&m, TIDE_MSG_JOIN_PORT);
    m.u.join_port.worker = w->id;
    snprintf(m.u.join_port.job, sizeof m.u.join_port.job, "%s", j->name);
    m.u.join_port.gen = j->reconf->gen;
    snprintf(m.u.join_port.port, sizeof m.u.join_port.port, "%s", j->reconf->port);
    tide__send_worker(s, w, &m);
}

void tide__send_release(tide_server_t *s, const tide_coord_job_t *j, const tide_coord_worker_t *w)
{
    int p = tide_coord_job_pool_find(j, w->pool);
    if (p < 0 || !j->pools[p].left)
        return;
    tide_msg_t m;
    tide_msg_init(&m, TIDE_MSG_RELEASE);
    snprintf(m.u.release.job, sizeof m.u.release.job, "%s", j->name);
    m.u.release.gen = j->pools[p].left;
    tide__send_worker(s, w, &m);
}

static void send_phase(tide_server_t *s, tide_coord_job_t *j, tide_coord_worker_t *w)
{
    tide_reconf_t *r = j->reconf;
    tide_msg_t m;
    if (r->phase == TIDE_RP_PREPARE) {
        tide__layout_msg_init(&m, j, w);
        tide__proto_layout(&m.u.layout.layout, r->layout, r->gen);
        m.u.layout.has_prev = 1;
        tide__proto_layout(&m.u.layout.prev, j->layout, j->generation);
        m.u.layout.recover = r->recover;
        if (r->ckpt[0] != '\0') {
            snprintf(m.u.layout.ckpt, sizeof m.u.layout.ckpt, "%s", r->ckpt);
            m.u.layout.ckpt_step = (uint64_t)r->ckpt_step;
        }
        if (r->join_pool >= 0) { /* borrowed: the message is encoded, never cleared */
            m.u.layout.join_old = r->join_old;
            m.u.layout.n_join_old = (uint32_t)r->n_join_old;
            m.u.layout.join_new = r->join_new;
            m.u.layout.n_join_new = (uint32_t)r->n_join_new;
        }
        if (r->n_leave > 0) { /* borrowed, as above */
            m.u.layout.stay = r->stay;
            m.u.layout.n_stay = (uint32_t)r->n_stay;
            m.u.layout.leave = r->leave;
            m.u.layout.n_leave = (uint32_t)r->n_leave;
        }
        tide__send_worker(s, w, &m);
        tide_msg_init(&m, TIDE_MSG_PREPARE);
        snprintf(m.u.prepare.job, sizeof m.u.prepare.job, "%s", j->name);
        m.u.prepare.gen = r->gen;
        m.u.prepare.step = (uint64_t)(j->step + 1);
    } else {
        tide_msg_init(&m, TIDE_MSG_COMMIT);
        snprintf(m.u.commit.job, sizeof m.u.commit.job, "%s", j->name);
        m.u.commit.gen = r->gen;
        m.u.commit.step = (uint64_t)r->switch_step;
        m.u.commit.recover = r->recover;
    }
    tide__send_worker(s, w, &m);
    if (r->phase == TIDE_RP_COMMIT && r->port[0] != '\0' && w->pool[0] != '\0' &&
        tide_coord_job_pool_find(j, w->pool) == r->join_pool)
        send_port(s, j, w);
}

static void send_all(tide_server_t *s, tide_coord_job_t *j, int only_unacked)
{
    tide_reconf_t *r = j->reconf;
    for (size_t i = 0; i < r->n_parts; i++) {
        if (r->gone[i] || (only_unacked && r->acked[i]))
            continue;
        tide_coord_worker_t *w = tide__job_worker(s, j, r->parts[i]);
        if (w != NULL)
            send_phase(s, j, w);
    }
    r->resend_ns = tide_now_ns() + 2ull * (uint64_t)s->cfg.heartbeat_ms * 1000000ull;
}

void tide__reconf_resend_to(tide_server_t *s, tide_coord_job_t *j, tide_coord_worker_t *w)
{
    tide_reconf_t *r = j->reconf;
    int32_t jr = tide_coord_job_rank(j, w);
    long i = r && jr >= 0 ? tide_reconf_find(r, jr) : -1;
    if (i < 0 || r->gone[i] || r->acked[i])
        return;
    send_phase(s, j, w);
}

/* ---- start ----------------------------------------------------------------------------------- */

static int cmp_i32(const void *a, const void *b)
{
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return x < y ? -1 : x > y;
}

/*
 * When layout places j on ranks of a pool that joined but is not connected, r becomes
 * the generation that connects it: every live rank of j's connected pools (the side
 * that accepts; all of them, since the connection is collective over them) and every
 * live rank of the joining pool (the side that connects) take part. One pool per
 * generation. Offline work on a connected rank outside the layouts is preempted for
 * the connection (its acks wait for that work to stop).
 */
static tide_status setup_join(tide_server_t *s, tide_coord_job_t *j, tide_reconf_t *r)
{
    int jp = -1;
    for (size_t i = 0; i < tide_layout_size(r->layout); i++) {
        int32_t rk = 0;
        int p = tide_coord_job_locate(j, r->layout->worker[i], &rk);
        if (p >= 0 && j->pools[p].left)
            return tide_errorf(TIDE_ERR_INVALID,
                               "the layout places job %s on job rank %d of pool %s, which left the "
                               "job at generation %llu",
                               j->name, r->layout->worker[i], j->pools[p].name,
                               (unsigned long long)j->pools[p].left);
        if (p < 0 || j->pools[p].connected)
            continue;
        if (jp >= 0 && p != jp)
            return tide_errorf(TIDE_ERR_INVALID,
                               "the layout places job %s on pools %s and %s, neither connected "
                               "yet: connect one pool per resize",
                               j->name, j->pools[jp].name, j->pools[p].name);
        jp = p;
    }
    if (jp < 0)
        return TIDE_OK;
    tide_coord_state_t *st = s->st;
    int32_t *o = tide_malloc((st->n_workers ? st->n_workers : 1) * sizeof *o);
    int32_t *n = tide_malloc((st->n_workers ? st->n_workers : 1) * sizeof *n);
    size_t no = 0, nn = 0;
    tide_status rc = TIDE_OK;
    if (o == NULL || n == NULL) {
        rc = tide_errorf(TIDE_ERR_NOMEM, "out of memory listing the ranks of a join");
        goto out;
    }
    for (size_t i = 0; i < st->n_workers; i++) {
        tide_coord_worker_t *w = &st->workers[i];
        int p = w->pool[0] != '\0' ? tide_coord_job_pool_find(j, w->pool) : -1;
        if (p < 0 || (p != jp && !j->pools[p].connected) || w->joined != j->id ||
            tide_coord_worker_gone(w))
            continue;
        int32_t jr = j->pools[p].base + w->rank;
        if (p == jp)
            n[nn++] = jr;
        else
            o[no++] = jr;
    }
    qsort(o, no, sizeof *o, cmp_i32);
    qsort(n, nn, sizeof *n, cmp_i32);
    if (no == 0)
        TIDE_FAIL_GOTO(rc, out, TIDE_ERR_INVALID, "job %s has no live rank to connect pool %s to",
                       j->name, j->pools[jp].name);
    for (size_t i = 0; i < tide_layout_size(r->layout); i++) {
        int32_t x = r->layout->worker[i], rk = 0;
        if (tide_coord_job_locate(j, x, &rk) == jp && !bsearch(&x, n, nn, sizeof *n, cmp_i32))
            TIDE_FAIL_GOTO(rc, out, TIDE_ERR_INVALID,
                           "job rank %d of pool %s has not joined job %s", x, j->pools[jp].name,
                           j->name);
    }
    TIDE_CHECK_GOTO(tide_reconf_set_join(r, jp, o, no, n, nn), rc, out);
    for (size_t i = 0; i < no; i++) {
        tide_coord_worker_t *w = tide__job_worker(s, j, o[i]);
        if (w != NULL && w->state == TIDE_WS_OFFLINE)
            tide__preempt_for(s, j, w, r->gen);
    }
out:
    tide_free(o);
    tide_free(n);
    return rc;
}

/* 1 when pool p of j holds a coordinate of layout l. */
static int pool_in_layout(const tide_coord_job_t *j, int p, const tide_layout_t *l)
{
    for (size_t i = 0; i < tide_layout_size(l); i++) {
        int32_t rk = 0;
        if (tide_coord_job_locate(j, l->worker[i], &rk) == p)
            return 1;
    }
    return 0;
}

tide_status tide__reconf_setup_leave(tide_server_t *s, tide_coord_job_t *j)
{
    tide_reconf_t *r = j->reconf;
    /* A recovery keeps every pool: it runs on whatever survived, and a pool left out of
       it may be what the job grows back onto. A join connects one pool per generation
       and releases none: its connected side is collective over every connected pool. */
    if (r == NULL || r->recover || r->join_pool >= 0)
        return TIDE_OK;
    uint32_t mask = 0;
    for (int p = 0; p < j->n_pools; p++)
        if (j->pools[p].connected && !j->pools[p].left && !pool_in_layout(j, p, r->layout))
            mask |= 1u << p;
    if (mask == 0)
        return TIDE_OK;
    tide_coord_state_t *st = s->st;
    int32_t *stay = tide_malloc((st->n_workers ? st->n_workers : 1) * sizeof *stay);
    int32_t *leave = tide_malloc((st->n_workers ? st->n_workers : 1) * sizeof *leave);
    size_t ns = 0, nl = 0;
    tide_status rc = TIDE_OK;
    if (stay == NULL || leave == NULL)
        TIDE_FAIL_GOTO(rc, out, TIDE_ERR_NOMEM, "out of memory listing the ranks of a release");
    for (size_t i = 0; i < st->n_workers; i++) {
        tide_coord_worker_t *w = &st->workers[i];
        int p = w->pool[0] != '\0' ? tide_coord_job_pool_find(j, w->pool) : -1;
        if (p < 0 || !j->pools[p].connected || j->pools[p].left || w->joined != j->id ||
            tide_coord_worker_gone(w))
            continue;
        int32_t jr = j->pools[p].base + w->rank;
        if (mask & (1u << p))
            leave[nl++] = jr;
        else
            stay[ns++] = jr;
    }
    /* released pools none of whose ranks lives (a lost host) have nobody to tell: they
       stay as they are, like any dead rank of the job */
    if (nl == 0)
        goto out;
    qsort(stay, ns, sizeof *stay, cmp_i32);
    qsort(leave, nl, sizeof *leave, cmp_i32);
    for (size_t i = 0; i < tide_layout_size(r->layout); i++)
        if (!bsearch(&r->layout->worker[i], stay, ns, sizeof *stay, cmp_i32))
            TIDE_FAIL_GOTO(rc, out, TIDE_ERR_INVALID,
                           "job rank %d of job %s's new layout is not a live rank of a connected "
                           "pool",
                           r->layout->worker[i], j->name);
    TIDE_CHECK_GOTO(tide_reconf_set_leave(r, mask, stay, ns, leave, nl), rc, out);
    /* every live rank of the job takes part (each side makes a communicator of its own):
       offline work on an idle one is preempted for it (its ack waits for that) */
    for (size_t i = 0; i < ns + nl; i++) {
        tide_coord_worker_t *w = tide__job_worker(s, j, i < ns ? stay[i] : leave[i - ns]);
        if (w != NULL && w->state == TIDE_WS_OFFLINE)
            tide__preempt_for(s, j, w, r->gen);
    }
out:
    tide_free(stay);
    tide_free(leave);
    return rc;
}

/* The names of the pools in mask (bit p: j's pool p), comma-separated, into buf. */
static const char *pool_names(const tide_coord_job_t *j, uint32_t mask, char *buf, size_t len)
{
    size_t k = 0;
    buf[0] = '\0';
    for (int p = 0; p < j->n_pools && k < len; p++)
        if (mask & (1u << p))
            k += (size_t)snprintf(buf + k, len - k, "%s%s", k ? ", " : "", j->pools[p].name);
    return buf;
}

tide_status tide__reconf_start(tide_server_t *s, tide_coord_job_t *j, tide_layout_t *layout,
                               const int32_t *preempt, size_t n_preempt, int recover,
                               const char *reason, const tide_coord_ckpt *ckpt)
{
    tide_reconf_t *r = NULL;
    uint64_t gen = j->gen_issued + 1;
    TIDE_CHECK(tide_reconf_new(&r, j->layout, layout, gen, recover));
    if (ckpt != NULL) {
        snprintf(r->ckpt, sizeof r->ckpt, "%s", ckpt->dir);
        r->ckpt_step = ckpt->step;
    }
    tide_status rc = setup_join(s, j, r);
    if (rc == TIDE_OK) {
        j->reconf = r; /* setup_leave reads it; nothing is sent before the end */
        rc = tide__reconf_setup_leave(s, j);
        j->reconf = NULL;
    }
    if (rc != TIDE_OK) {
        tide_reconf_destroy(&r);
        return rc;
    }
    uint64_t now = tide_now_ns();
    j->gen_issued = gen;
    r->started_ms = tide_wall_ms();
    r->started_ns = now;
    r->deadline_ns = now + (uint64_t)s->cfg.resize_timeout_ms * 1000000ull;
    snprintf(r->reason, sizeof r->reason, "%s", reason);
    for (size_t i = 0; i < r->n_parts; i++) {
        tide_coord_worker_t *w = tide__job_worker(s, j, r->parts[i]);
        r->gone[i] = w == NULL || tide_coord_worker_gone(w);
    }
    j->reconf = r;
    j->state = TIDE_JS_RESIZING;
    for (size_t i = 0; i < n_preempt; i++)
        tide__preempt_for(s, j, tide__job_worker(s, j, preempt[i]), gen);
    /* reserve new-only participants so backfill leaves them alone */
    for (size_t i = 0; i < r->n_parts; i++) {
        if (r->old_member[i] || r->gone[i])
            continue;
        if (r->join_pool >= 0 && !tide_coord_layout_has(r->layout, r->parts[i]))
            continue; /* takes part in the join only */
        tide_coord_worker_t *w = tide__job_worker(s, j, r->parts[i]);
        if (w != NULL && w->state == TIDE_WS_IDLE) {
            w->job = j->id;
            tide__save_worker(s, w);
        }
    }
    char from[200], to[200];
    tide__event(s, j->name, recover ? "recovery_started" : "resize_started",
                "generation %llu: %s -> %s (%s); %zu participants, %zu offline jobs preempted",
                (unsigned long long)gen, tide_layout_format(j->layout, from, sizeof from),
                tide_layout_format(r->layout, to, sizeof to), reason, r->n_parts, n_preempt);
    if (r->join_pool >= 0) {
        const tide_coord_job_pool *jp = &j->pools[r->join_pool];
        tide__event(s, j->name, "join_started",
                    "generation %llu connects pool %s (%zu ranks) to the job's %zu ranks "
                    "(MPI accept/connect: every pool's mpirun needs --ompi-server%s%s)",
                    (unsigned long long)gen, jp->name, r->n_join_new, r->n_join_old,
                    s->cfg.ompi_server ? " " : "", s->cfg.ompi_server ? s->cfg.ompi_server : "");
    }
    if (r->n_leave > 0) {
        char names[400];
        tide__event(s, j->name, "release_started",
                    "generation %llu holds no rank of pool(s) %s: their %zu live ranks leave the "
                    "job once it commits, and its %zu other live ranks drop their connection to "
                    "them at the switch",
                    (unsigned long long)gen, pool_names(j, r->leave_pools, names, sizeof names),
                    r->n_leave, r->n_stay);
    }
    tide__save_job(s, j);
    send_all(s, j, 0);
    return TIDE_OK;
}

void tide__handle_resize(tide_server_t *s, const tide_proto_resize_t *m)
{
    tide_coord_job_t *j = tide_coord_job_by_name(s->st, m->job);
    if (j == NULL || j->kind != TIDE_CJOB_ONLINE) {
        tide__reply_error(s, TIDE_ERR_NOT_FOUND, "no online job named %s (tidectl jobs lists them)",
                          m->job);
        return;
    }
    if (j->state == TIDE_JS_DONE) {
        tide__reply_error(s, TIDE_ERR_INVALID,
                          "job %s has ended (its training program said bye); nothing to resize",
                          j->name);
        return;
    }
    if (j->layout == NULL) {
        tide__reply_error(s, TIDE_ERR_BUSY,
                          "job %s has no layout yet: its workers are still joining", j->name);
        return;
    }
    if (j->reconf != NULL) {
        tide__reply_error(s, TIDE_ERR_BUSY,
                          "job %s is already switching to generation %llu (%s); wait for it to "
                          "finish (tidectl jobs)",
                          j->name, (unsigned long long)j->reconf->gen, j->reconf->reason);
        return;
    }
    tide_resize_req req = {m->dp,
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
            return;
        }
        req.stage_start = m->stage_start;
    } else if (m->pp == j->layout->pp) {
        req.stage_start = j->layout->stage_start; /* pp stays: so do its stages */
    }
    tide_policy_worker *cand = NULL;
    size_t n = 0, n_pre = 0, n_pre_d = 0;
    int32_t *pre = NULL, *pre_d = NULL;
    tide_layout_t *l = NULL, *dflt = NULL;
    tide_collection_t *c = NULL;
    tide_status rc = tide__job_collection(j, &c);
    if (rc == TIDE_OK)
        rc = tide__candidates(s, j, -1, 1, &cand, &n);
    if (rc == TIDE_OK) {
        pre = tide_malloc((n ? n : 1) * sizeof *pre);
        rc = pre ? tide_policy_place(j->layout, c, &req, cand, n, &l, pre, &n_pre)
                 : tide_errorf(TIDE_ERR_NOMEM, "out of memory placing the resize");
    }
    if (rc == TIDE_OK && m->dry_run && c != NULL) {
        /* the plain rank order over the same kind of workers, for comparison */
        tide_resize_req plain = req;
        plain.plain = 1;
        pre_d = tide_malloc((n ? n : 1) * sizeof *pre_d);
        if (pre_d == NULL ||
            tide_policy_place(j->layout, c, &plain, cand, n, &dflt, pre_d, &n_pre_d) != TIDE_OK)
            TIDE_INFO("reconf", "job %s: no default-order layout to compare: %s", j->name,
                      pre_d ? tide_last_error() : "out of memory");
    }
    tide_free(cand);
    tide_free(pre_d);
    if (rc != TIDE_OK) {
        tide_free(pre);
        tide_collection_destroy(&c);
        tide__reply_error(s, rc, "cannot resize %s: %s", j->name, tide_last_error());
        return;
    }
    tide_msg_t reply;
    tide_msg_init(&reply, TIDE_MSG_RESIZE_REPLY);
    tide_proto_resize_reply_t *rr = &reply.u.resize_reply;
    snprintf(rr->job, sizeof rr->job, "%s", j->name);
    rr->dry_run = m->dry_run;
    rr->preempted = (uint32_t)n_pre;
    plan_estimate(s, j, c, l, dflt, rr);
    tide_layout_destroy(&dflt);
    tide_collection_destroy(&c);
    uint64_t gen = j->gen_issued + 1;
    /* the operator sees the members as tided's worker ids (tidectl status), not pool ranks */
    tide_layout_t *shown = NULL;
    rc = tide__layout_worker_ids(s, j, l, &shown);
    if (rc != TIDE_OK) {
        tide_layout_destroy(&l);
        tide_free(pre);
        tide__reply_error(s, rc, "cannot resize %s: %s", j->name, tide_last_error());
        return;
    }
    tide__proto_layout(&rr->layout, shown, gen);
    if (m->dry_run) {
        tide__reply(s, &reply);
        tide_layout_destroy(&shown);
        tide_layout_destroy(&l);
        tide_free(pre);
        return;
    }
    uint64_t planned = rr->bytes_sent;
    tide__reply(s, &reply); /* encoded now: shown is still alive */
    tide_layout_destroy(&shown);
    char why[128];
    snprintf(why, sizeof why, "resize by %s", s->who);
    rc = tide__reconf_start(s, j, l, pre, n_pre, 0, why, NULL);
    tide_free(pre);
    if (rc != TIDE_OK) {
        TIDE_ERROR("reconf", "job %s: %s", j->name, tide_last_error());
        return;
    }
    j->reconf->planned_bytes = planned;
}

/* ---- progress -------------------------------------------------------------------------------- */

/* The job and participant index of a worker's report; NULL after an error reply. */
static tide_coord_job_t *report_job(tide_server_t *s, tide_coord_worker_t *w, const char *name,
                                    uint64_t gen, long *idx, const char *what)
{
    tide_coord_job_t *j = tide_coord_job_by_name(s->st, name);
    if (j == NULL || j->kind != TIDE_CJOB_ONLINE) {
        tide__reply_error(s, TIDE_ERR_NOT_FOUND, "%s: no online job named %s", what, name);
        return NULL;
    }
    tide_reconf_t *r = j->reconf;
    if (r == NULL || r->gen != gen) {
        tide__reply_error(s, TIDE_ERR_STALE,
                          "%s: generation %llu of job %s is not pending (committed %llu%s)", what,
                          (unsigned long long)gen, j->name, (unsigned long long)j->generation,
                          r ? ", another one is" : "");
        return NULL;
    }
    int32_t jr = tide_coord_job_rank(j, w);
    *idx = jr >= 0 ? tide_reconf_find(r, jr) : -1;
    if (*idx < 0) {
        tide__reply_error(s, TIDE_ERR_INVALID,
                          "%s: worker %d does not take part in generation %llu of job %s", what,
                          w->id, (unsigned long long)gen, j->name);
        return NULL;
    }
    return j;
}

static int all_acked(const tide_reconf_t *r)
{
    for (size_t i = 0; i < r->n_parts; i++)
        if (!r->gone[i] && !r->acked[i])
            return 0;
    return 1;
}

void tide__handle_prepare_ack(tide_server_t *s, tide_coord_worker_t *w,
                              const tide_proto_prepare_ack_t *m)
{
    long i;
    tide_coord_job_t *j = report_job(s, w, m->job, m->gen, &i, "prepare_ack");
    if (j == NULL)
        return;
    tide_reconf_t *r = j->reconf;
    if (r->phase != TIDE_RP_PREPARE) {
        send_phase(s, j, w); /* a late duplicate: it missed the commit */
        return;
    }
    r->acked[i] = 1;
    r->ack_step[i] = m->step > INT64_MAX ? INT64_MAX : (int64_t)m->step;
    if (!all_acked(r))
        return;
    uint8_t *counts = tide_malloc(r->n_parts ? r->n_parts : 1);
    if (counts == NULL) {
        tide__reconf_abort(s, j, "out of memory choosing the switch step");
        return;
    }
    for (size_t k = 0; k < r->n_parts; k++)
        counts[k] = r->old_member[k] && !r->gone[k];
    int64_t step = tide_policy_switch_step(r->ack_step, counts, r->n_parts, r->recover);
    tide_free(counts);
    if (step < 0)
        step = j->step; /* no old member left: the new layout starts from the job's step */
    r->switch_step = step;
    r->phase = TIDE_RP_COMMIT;
    memset(r->acked, 0, r->n_parts);
    tide__event(s, j->name, "switch_step", "generation %llu switches after step %lld",
                (unsigned long long)r->gen, (long long)step);
    tide__save_job(s, j);
    send_all(s, j, 0);
}

static void commit_generation(tide_server_t *s, tide_coord_job_t *j)
{
    tide_reconf_t *r = j->reconf;
    for (size_t i = 0; i < r->n_parts; i++) {
        if (r->gone[i])
            continue;
        tide_coord_worker_t *w = tide__job_worker(s, j, r->parts[i]);
        if (w == NULL)
            continue;
        if (tide_coord_layout_has(r->layout, r->parts[i])) {
            w->state = TIDE_WS_ONLINE;
            w->job = j->id;
        } else {
            w->job = 0;
            if (w->state != TIDE_WS_DRAINING)
                w->state = TIDE_WS_IDLE;
        }
        tide__save_worker(s, w);
    }
    uint64_t dur = tide_now_ns() - r->started_ns;
    tide_coord_counters *c = &s->st->counters;
    c->resizes_committed++;
    c->resize_ns_sum += dur;
    if (dur > c->resize_ns_max)
        c->resize_ns_max = dur;
    c->bytes_resharded += r->bytes_moved > r->planned_bytes ? r->bytes_moved : r->planned_bytes;
    if (r->join_pool >= 0 && r->join_pool < j->n_pools) {
        tide_coord_job_pool *jp = &j->pools[r->join_pool];
        jp->connected = 1;
        tide__event(s, j->name, "pool_connected",
                    "generation %llu connected pool %s (job ranks %d..%d) to the job's %zu "
                    "ranks",
                    (unsigned long long)r->gen, jp->name, jp->base, jp->base + jp->size - 1,
                    r->n_join_old);
    }
    for (int p = 0; r->leave_pools != 0 && p < j->n_pools; p++) {
        if (!(r->leave_pools & (1u << p)))
            continue;
        tide_coord_job_pool *jp = &j->pools[p];
        jp->connected = 0;
        jp->left = r->gen;
        tide__event(s, j->name, "pool_left",
                    "generation %llu released pool %s (job ranks %d..%d): its launch left the "
                    "job and may exit",
                    (unsigned long long)r->gen, jp->name, jp->base, jp->base + jp->size - 1);
    }
    /* every participant reported done: no rank still waits on a released one's part of
       the switch, so they may finish now */
    for (size_t i = 0; i < r->n_leave; i++) {
        tide_coord_worker_t *w = tide__job_worker(s, j, r->leave[i]);
        if (w != NULL && !tide_coord_worker_gone(w))
            tide__send_release(s, j, w);
    }
    tide_layout_destroy(&j->layout);
    j->layout = r->layout;
    r->layout = NULL;
    j->generation = r->gen;
    char desc[200];
    if (r->ckpt[0] != '\0') {
        /* the state went back to the checkpoint: so did the job's step */
        j->step = r->ckpt_step;
        tide__event(s, j->name, "rolled_back",
                    "generation %llu committed: %s from the checkpoint of step %lld (%s); steps "
                    "lost: %lld (the job had completed %lld), %.1f ms (%s)",
                    (unsigned long long)j->generation,
                    tide_layout_format(j->layout, desc, sizeof desc), (long long)r->ckpt_step,
                    r->ckpt, (long long)(r->switch_step - r->ckpt_step), (long long)r->switch_step,
                    (double)dur / 1e6, r->reason);
    } else {
        if (r->switch_step > j->step)
            j->step = r->switch_step;
        tide__event(s, j->name, r->recover ? "recovered" : "resized",
                    "generation %llu committed: %s from step %lld, %.1f ms, %llu bytes moved (%s)",
                    (unsigned long long)j->generation,
                    tide_layout_format(j->layout, desc, sizeof desc), (long long)r->switch_step,
                    (double)dur / 1e6, (unsigned long long)r->bytes_moved, r->reason);
    }
    tide_reconf_destroy(&j->reconf);
    j->state = TIDE_JS_RUNNING;
    tide__save_job(s, j);
    s->want_backfill = 1;
}

void tide__handle_done(tide_server_t *s, tide_coord_worker_t *w, const tide_proto_done_t *m)
{
    long i;
    tide_coord_job_t *j = report_job(s, w, m->job, m->gen, &i, "done");
    if (j == NULL)
        return;
    tide_reconf_t *r = j->reconf;
    if (r->phase != TIDE_RP_COMMIT) {
        tide__reply_error(s, TIDE_ERR_PROTOCOL,
                          "done for generation %llu of job %s before its commit",
                          (unsigned long long)m->gen, j->name);
        return;
    }
    if (m->status == TIDE_ERR_INVALID && r->ckpt[0] != '\0' && !r->switched) {
        /* the members agree on whether the checkpoint loaded (a damaged shard fails them
           all): it is never used again, and the recovery tries the one before it */
        char why[TIDE_PROTO_TEXT_MAX + 1];
        snprintf(why, sizeof why,
                 "the checkpoint of step %lld (%.800s) could not be loaded (worker %d: %s; its "
                 "log names the file)",
                 (long long)r->ckpt_step, r->ckpt, w->id, tide_strerror((tide_status)m->status));
        tide__event(s, j->name, "checkpoint_refused", "%s", why);
        tide_coord_job_drop_ckpt(j, r->ckpt_step);
        tide__reconf_abort(s, j, why);
        return;
    }
    if (m->status != 0) {
        char why[200];
        snprintf(why, sizeof why, "worker %d could not switch: %s", w->id,
                 tide_strerror((tide_status)m->status));
        if (r->switched) /* others run under G already: this one's state is lost, not G */
            tide__worker_failed(s, w, why);
        else
            tide__reconf_abort(s, j, why);
        return;
    }
    if (!r->acked[i])
        r->bytes_moved += m->bytes_moved;
    r->acked[i] = 1;
    if (all_acked(r)) {
        commit_generation(s, j);
    } else if (!r->switched) {
        /* from now on G cannot be abandoned: this worker's old state is gone (durable, so
         * that a restarted tided keeps to it too) */
        r->switched = 1;
        tide__save_job(s, j);
    }
}

/* ---- fallback and recovery ------------------------------------------------------------------ */

static int lost_old_member(tide_server_t *s, const tide_coord_job_t *j)
{
    if (j->layout == NULL)
        return 0;
    for (size_t i = 0; i < tide_layout_size(j->layout); i++) {
        const tide_coord_worker_t *w = tide__job_worker(s, j, j->layout->worker[i]);
        if (w == NULL || tide_coord_worker_gone(w) || w->job != j->id)
            return 1;
    }
    return 0;
}

static void abort_only(tide_server_t *s, tide_coord_job_t *j, const char *reason)
{
    tide_reconf_t *r = j->reconf;
    if (r == NULL)
        return;
    tide_msg_t m;
    tide_msg_init(&m, TIDE_MSG_ABORT);
    snprintf(m.u.abort_.job, sizeof m.u.abort_.job, "%s", j->name);
    m.u.abort_.gen = r->gen;
    snprintf(m.u.abort_.reason, sizeof m.u.abort_.reason, "%s", reason);
    for (size_t i = 0; i < r->n_parts; i++) {
        tide_coord_worker_t *w = tide__job_worker(s, j, r->parts[i]);
        if (w == NULL || r->gone[i])
            continue;
        tide__send_worker(s, w, &m);
        if (!r->old_member[i] && w->job == j->id && w->state != TIDE_WS_ONLINE) {
            w->job = 0; /* reserved for the abandoned layout: free again */
            tide__save_worker(s, w);
        }
    }
    s->st->counters.resizes_aborted++;
    if (r->join_pool >= 0 && r->join_pool < j->n_pools)
        tide__event(s, j->name, "resize_aborted",
                    "generation %llu abandoned: %s; pool %s stays unconnected and generation %llu "
                    "goes on",
                    (unsigned long long)r->gen, reason, j->pools[r->join_pool].name,
                    (unsigned long long)j->generation);
    else
        tide__event(s, j->name, "resize_aborted",
                    "generation %llu abandoned: %s; generation %llu stays",
                    (unsigned long long)r->gen, reason, (unsigned long long)j->generation);
    tide_reconf_destroy(&j->reconf);
    j->state = TIDE_JS_RUNNING;
    tide__save_job(s, j);
    s->want_backfill = 1;
}

void tide__reconf_abort(tide_server_t *s, tide_coord_job_t *j, const char *reason)
{
    abort_only(s, j, reason);
    if (lost_old_member(s, j))
        tide__recover(s, j, reason);
}

/*
 * A participant of G failed after another had reported done: G cannot be
 * abandoned (that worker switched), so G is committed over the live
 * participants and, when it lost members, a recovery starts from it.
 */
static void keep_switched(tide_server_t *s, tide_coord_job_t *j, const char *reason)
{
    tide_reconf_t *r = j->reconf;
    size_t done = 0;
    for (size_t i = 0; i < r->n_parts; i++)
        done += r->acked[i] && !r->gone[i];
    tide__event(s, j->name, "switch_kept",
                "generation %llu kept although %s: participants had switched to it (%zu done "
                "since tided started); the job recovers from it",
                (unsigned long long)r->gen, reason, done);
    commit_generation(s, j);
    if (lost_old_member(s, j))
        tide__recover(s, j, reason);
}

/*
 * Whether every byte of j's state that recovery layout l needs still has a live holder
 * (the plan the workers will compute, over the same live set find_dead derives from
 * tided's status: a worker failed or no longer in the job is dead). A job whose lost
 * state had no replica (dp 1, pp stages on a lost host, ZeRO-1 moments) cannot be
 * recovered from replicas; starting that switch anyway makes every participant fail its
 * plan, abort, and tided recover again, endlessly. TIDE_ERR_NO_HOLDER with the plan's
 * detail then. With l NULL: whether any layout could be rebuilt, however many workers
 * joined (the old layout with each dead member replaced by a new worker).
 */
static tide_status recovery_feasible(tide_server_t *s, const tide_coord_job_t *j,
                                     const tide_collection_t *c, const tide_layout_t *l)
{
    /* planned over tided's worker ids (a relabelling: the same plan), so that the reason a
       recovery is impossible names workers as tidectl status does */
    tide_layout_t *old_ids = NULL, *new_ids = NULL;
    tide_status rc = tide__layout_worker_ids(s, j, j->layout, &old_ids);
    if (rc == TIDE_OK)
        rc = l != NULL ? tide__layout_worker_ids(s, j, l, &new_ids)
                       : tide_layout_copy(&new_ids, old_ids);
    size_t n = 0;
    for (size_t i = 0; rc == TIDE_OK && i < tide_layout_size(old_ids); i++)
        if ((size_t)old_ids->worker[i] + 1 > n)
            n = (size_t)old_ids->worker[i] + 1;
    for (size_t i = 0; rc == TIDE_OK && i < tide_layout_size(new_ids); i++)
        if ((size_t)new_ids->worker[i] + 1 > n)
            n = (size_t)new_ids->worker[i] + 1;
    size_t fresh = n; /* ids past every worker's: the stand-ins of the dead (l NULL) */
    if (rc == TIDE_OK && l == NULL)
        n += tide_layout_size(old_ids);
    uint8_t *alive = rc == TIDE_OK ? tide_malloc(n ? n : 1) : NULL;
    if (rc == TIDE_OK && alive == NULL)
        rc = tide_errorf(TIDE_ERR_NOMEM, "out of memory checking the recovery of %s", j->name);
    if (rc != TIDE_OK) {
        tide_layout_destroy(&old_ids);
        tide_layout_destroy(&new_ids);
        return rc;
    }
    memset(alive, 1, n);
    size_t first_fresh = fresh;
    for (size_t i = 0; i < tide_layout_size(j->layout); i++) {
        const tide_coord_worker_t *w = tide__job_worker(s, j, j->layout->worker[i]);
        if (w == NULL || tide_coord_worker_gone(w) || w->job != j->id) {
            alive[old_ids->worker[i]] = 0;
            if (l == NULL)
                new_ids->worker[i] = (int32_t)fresh++;
        }
    }
    tide_plan_totals t;
    rc = tide_reshard_plan_totals(old_ids, new_ids, c, alive, n, &t);
    char why[TIDE_PROTO_TEXT_MAX + 1];
    snprintf(why, sizeof why, "%s", rc != TIDE_OK ? tide_last_error() : "");
    if (rc != TIDE_OK && l == NULL) {
        /* the plan names a stand-in's id as the worker that needs the bytes: name the dead
           worker it replaces instead */
        char *at = strstr(why, "needed by worker ");
        long id = at != NULL ? strtol(at + 17, NULL, 10) : -1;
        for (size_t i = 0; id >= (long)first_fresh && i < tide_layout_size(new_ids); i++)
            if (new_ids->worker[i] == id) {
                char rest[TIDE_PROTO_TEXT_MAX + 1];
                const char *tail = at + 17;
                while (*tail >= '0' && *tail <= '9')
                    tail++;
                snprintf(rest, sizeof rest, "%s", tail);
                snprintf(at, sizeof why - (size_t)(at - why),
                         "needed by any worker that replaces worker %d%s", (int)old_ids->worker[i],
                         rest);
                break;
            }
    }
    tide_free(alive);
    tide_layout_destroy(&old_ids);
    tide_layout_destroy(&new_ids);
    if (rc != TIDE_OK)
        return tide_errorf(rc,
                           "its state cannot be rebuilt from the survivors%s: %s; restart it "
                           "from a checkpoint",
                           l == NULL ? ", however many workers join" : "", why);
    return TIDE_OK;
}

/* Tells every live member of j's layout that the job cannot go on (halt). */
static void halt_members(tide_server_t *s, const tide_coord_job_t *j, tide_status code,
                         const char *why)
{
    tide_msg_t m;
    tide_msg_init(&m, TIDE_MSG_HALT);
    snprintf(m.u.halt.job, sizeof m.u.halt.job, "%s", j->name);
    m.u.halt.gen = j->generation;
    m.u.halt.code = code < 0 && code >= -1000 ? (int)code : (int)TIDE_ERR_INTERNAL;
    snprintf(m.u.halt.reason, sizeof m.u.halt.reason, "%s", why);
    for (size_t i = 0; i < tide_layout_size(j->layout); i++) {
        tide_coord_worker_t *w = tide__job_worker(s, j, j->layout->worker[i]);
        if (w != NULL && !tide_coord_worker_gone(w) && w->job == j->id)
            tide__send_worker(s, w, &m);
    }
}

void tide__preempt_for(tide_server_t *s, const tide_coord_job_t *j, tide_coord_worker_t *w,
                       uint64_t gen)
{
    tide_coord_job_t *oj = w ? tide_coord_job_get(s->st, w->offline_job) : NULL;
    if (oj == NULL)
        return;
    tide_msg_t m;
    tide_msg_init(&m, TIDE_MSG_PREEMPT);
    snprintf(m.u.preempt.job, sizeof m.u.preempt.job, "%s", oj->name);
    m.u.preempt.grace_ms = (int)(oj->grace_ms > 600000 ? 600000 : oj->grace_ms);
    tide__send_worker(s, w, &m);
    s->st->counters.preemptions++;
    oj->state = TIDE_JS_QUEUED;
    oj->worker = -1;
    tide__event(s, oj->name, "preempted",
                "worker %d given to job %s generation %llu; requeued after attempt %d", w->id,
                j->name, (unsigned long long)gen, oj->attempts);
    tide__save_job(s, oj);
    w->offline_job = 0;
    w->state = TIDE_WS_IDLE;
    s->want_backfill = 1; /* the requeued job may go elsewhere, or into bubbles */
}

/*
 * A layout for a rollback when the survivors cannot hold the old tp and pp: the checkpoint
 * loads into any degrees, so the largest job (then the widest tp, then the most stages)
 * the candidates can run and the program allows, tp a divisor of the old one. Like
 * tide_policy_recover's outputs; why gets what changed. Pure but for the error detail.
 */
static tide_status rollback_layout(const tide_coord_job_t *j, const tide_collection_t *c,
                                   const tide_policy_worker *cand, size_t n, tide_layout_t **out,
                                   int32_t *pre, size_t *n_pre, char *why, size_t why_len)
{
    const tide_layout_t *old = j->layout;
    int tries = 256; /* placements attempted at most (each O(n log n)) */
    for (int size = (int)(n < (size_t)INT32_MAX ? n : INT32_MAX); size >= 1 && tries > 0; size--)
        for (int tp = old->tp; tp >= 1 && tries > 0; tp--) {
            if (old->tp % tp != 0 || size % tp != 0)
                continue;
            for (int pp = old->pp; pp >= 1 && tries > 0; pp--) {
                int dp = (size / tp) / pp;
                if ((size / tp) % pp != 0 || tide_fit_check(j->fit, (size_t)j->n_fit, dp, tp, pp,
                                                            old->micro_batches) != TIDE_OK)
                    continue;
                tide_resize_req req = {dp,   tp, pp, old->num_layers, old->micro_batches,
                                       NULL, 0,  0,  j->fit,          (size_t)j->n_fit};
                tries--;
                if (tide_policy_place(old, c, &req, cand, n, out, pre, n_pre) != TIDE_OK)
                    continue;
                snprintf(why, why_len,
                         "(dp %d, tp %d, pp %d) instead of (dp %d, tp %d, pp %d): the %zu "
                         "available workers hold no more",
                         dp, tp, pp, old->dp, old->tp, old->pp, n);
                tide_error_clear();
                return TIDE_OK;
            }
        }
    return tide_errorf(TIDE_ERR_NO_DEVICE, "%zu candidate workers", n);
}

void tide__recover(tide_server_t *s, tide_coord_job_t *j, const char *reason)
{
    if (j->reconf != NULL)
        abort_only(s, j, reason);
    if (j->layout == NULL)
        return;
    tide_policy_worker *cand = NULL;
    size_t n = 0, n_pre = 0;
    int32_t *pre = NULL;
    tide_layout_t *l = NULL;
    tide_collection_t *c = NULL;
    char shrink[TIDE_PROTO_TEXT_MAX + 1] = ""; /* why the recovery holds fewer replicas */
    tide_status rc = tide__job_collection(j, &c);
    if (rc == TIDE_OK)
        rc = tide__candidates(s, j, -1, 1, &cand, &n);
    if (rc == TIDE_OK) {
        pre = tide_malloc((n ? n : 1) * sizeof *pre);
        rc = pre ? tide_policy_recover(j->layout, c, j->fit, (size_t)j->n_fit, cand, n, &l, pre,
                                       &n_pre, shrink, sizeof shrink)
                 : tide_errorf(TIDE_ERR_NOMEM, "out of memory planning a recovery");
    }
    if (rc == TIDE_OK && c != NULL)
        rc = recovery_feasible(s, j, c, l);
    /* what no survivor holds any more, when that is why (for the events) */
    char lost[TIDE_PROTO_TEXT_MAX + 1] = "";
    if (rc == TIDE_ERR_NO_HOLDER)
        snprintf(lost, sizeof lost, "%s", tide_last_error());
    if (rc == TIDE_ERR_NO_DEVICE && c != NULL) {
        /* too few workers for a layout: waiting for more helps only when the survivors
           still hold all of the state (a pipeline stage lost with its host does not) */
        char wait_why[TIDE_PROTO_TEXT_MAX + 1];
        snprintf(wait_why, sizeof wait_why, "%s", tide_last_error());
        if (recovery_feasible(s, j, c, NULL) == TIDE_ERR_NO_HOLDER) {
            rc = TIDE_ERR_NO_HOLDER;
            snprintf(lost, sizeof lost, "%s", tide_last_error());
            /* lost whatever joins: from a checkpoint, the survivors may run other degrees */
            if (j->n_ckpts > 0 &&
                rollback_layout(j, c, cand, n, &l, pre, &n_pre, shrink, sizeof shrink) != TIDE_OK)
                rc = tide_errorf(TIDE_ERR_NO_DEVICE,
                                 "%s; no layout the survivors can run holds "
                                 "the checkpoint's state either (%s)",
                                 wait_why, tide_last_error());
        } else {
            tide_errorf(rc, "%s", wait_why);
        }
    }
    tide_free(cand);
    tide_collection_destroy(&c);
    const tide_coord_ckpt *ck = NULL; /* the checkpoint a recovery with no holder loads */
    if (rc == TIDE_ERR_NO_HOLDER && j->n_ckpts > 0 && l != NULL) {
        ck = &j->ckpts[j->n_ckpts - 1];
        char *advice = strstr(lost, "; restart it from a checkpoint");
        if (advice != NULL)
            *advice = '\0';
        const char *what = strstr(lost, "no live worker"); /* the plan's own words */
        if (what != NULL)
            memmove(lost, what, strlen(what) + 1);
        tide_error_clear();
        rc = TIDE_OK;
    }
    if (rc != TIDE_OK) {
        tide_free(pre);
        tide_layout_destroy(&l);
        if (j->state != TIDE_JS_STALLED) {
            char detail[TIDE_PROTO_TEXT_MAX + 1];
            snprintf(detail, sizeof detail, "%s", tide_last_error());
            j->state = TIDE_JS_STALLED;
            tide__event(s, j->name, "stalled", "%s: %s", reason, detail);
            tide__save_job(s, j);
            /* Lost state never comes back (more workers would not help): the survivors
               are told to stop instead of waiting for an operator. */
            if (rc == TIDE_ERR_NO_HOLDER)
                halt_members(s, j, rc, detail);
        }
        return;
    }
    char why[TIDE_RECONF_REASON_MAX];
    if (ck != NULL)
        snprintf(why, sizeof why,
                 "recovery: %s; from the checkpoint of step %lld (%.200s; the survivors holding "
                 "no copy of the lost state: %.200s)%s%.120s",
                 reason, (long long)ck->step, ck->dir, lost, shrink[0] ? "; " : "", shrink);
    else
        snprintf(why, sizeof why, "recovery: %s%s%s", reason, shrink[0] ? "; " : "", shrink);
    s->st->counters.recoveries++;
    rc = tide__reconf_start(s, j, l, pre, n_pre, 1, why, ck);
    tide_free(pre);
    if (rc != TIDE_OK)
        TIDE_ERROR("reconf", "job %s: %s", j->name, tide_last_error());
}

void tide__reconf_participant_failed(tide_server_t *s, tide_coord_job_t *j, tide_coord_worker_t *w)
{
    tide_reconf_t *r = j->reconf;
    int32_t jr = tide_coord_job_rank(j, w);
    long i = jr >= 0 ? tide_reconf_find(r, jr) : -1;
    if (i < 0)
        return;
    r->gone[i] = 1;
    char why[120];
    snprintf(why, sizeof why, "participant worker %d failed during the switch", w->id);
    if (r->phase == TIDE_RP_COMMIT && r->switched)
        keep_switched(s, j, why);
    else
        tide__reconf_abort(s, j, why);
}

void tide__reconf_tick(tide_server_t *s, uint64_t now_ns)
{
    for (size_t k = 0; k < s->st->n_jobs; k++) {
        tide_coord_job_t *j = s->st->jobs[k];
        tide_reconf_t *r = j->reconf;
        if (r == NULL)
            continue;
        if (now_ns >= r->deadline_ns) {
            char why[300];
            size_t at =
                (size_t)snprintf(why, sizeof why, "timed out after %lld ms waiting for worker",
                                 (long long)s->cfg.resize_timeout_ms);
            for (size_t i = 0; i < r->n_parts && at < sizeof why - 16; i++)
                if (!r->gone[i] && !r->acked[i]) {
                    const tide_coord_worker_t *w = tide__job_worker(s, j, r->parts[i]);
                    at += (size_t)snprintf(why + at, sizeof why - at, " %d",
                                           w != NULL ? (int)w->id : -1);
                }
            if (r->phase == TIDE_RP_COMMIT && r->switched) {
                /* G stays: the silent participants are failed first, then one recovery */
                for (size_t i = 0; i < r->n_parts; i++) {
                    if (r->gone[i] || r->acked[i])
                        continue;
                    r->gone[i] = 1;
                    tide_coord_worker_t *w = tide__job_worker(s, j, r->parts[i]);
                    if (w != NULL)
                        tide__worker_down(s, w, "worker_failed", why);
                }
                keep_switched(s, j, why);
            } else {
                tide__reconf_abort(s, j, why);
            }
        } else if (now_ns >= r->resend_ns) {
            send_all(s, j, 1);
        }
    }
}

void tide__handle_join_port(tide_server_t *s, tide_coord_worker_t *w,
                            const tide_proto_join_port_t *m)
{
    long i;
    tide_coord_job_t *j = report_job(s, w, m->job, m->gen, &i, "join_port");
    if (j == NULL)
        return;
    tide_reconf_t *r = j->reconf;
    if (r->join_pool < 0 || r->n_join_old == 0 || r->parts[i] != r->join_old[0]) {
        tide__reply_error(s, TIDE_ERR_INVALID,
                          "join_port: generation %llu of job %s connects no pool through worker %d",
                          (unsigned long long)m->gen, j->name, w->id);
        return;
    }
    snprintf(r->port, sizeof r->port, "%s", m->port);
    for (size_t k = 0; k < r->n_join_new; k++) {
        tide_coord_worker_t *x = tide__job_worker(s, j, r->join_new[k]);
        long xi = tide_reconf_find(r, r->join_new[k]);
        if (x != NULL && xi >= 0 && !r->gone[xi])
            send_port(s, j, x);
    }
    TIDE_INFO("reconf", "job %s generation %llu: port of the join relayed to %zu ranks of pool %s",
              j->name, (unsigned long long)r->gen, r->n_join_new, j->pools[r->join_pool].name);
}
