/*
 * train_mlp on libtide: the comm adapter (tide_mlp_comm -> tide_coll_* on the view's
 * communicators), the elastic training loop, and the whole-state gather for checks.
 * See mlp_tide.h for the contracts. Workload: a handful of collectives per
 * micro-batch and step; a layout switch now and then.
 */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "core/clock.h"
#include "core/error.h"
#include "core/log.h"
#include "examples/mlp_mpi.h"
#include "examples/mlp_tide.h"

#define SUBSYS "mlp.tide"

/* ---- the comm adapter ---------------------------------------------------------------------- */

static tide_status a_allreduce(void *ctx, tide_mlp_group group, void *buf, size_t n,
                               tide_dtype dtype, tide_mlp_redop op)
{
    const tide_mlp_tide_comm *c = ctx;
    tide_coll_comm_t *g = group == TIDE_MLP_GROUP_TP   ? c->v->tp
                          : group == TIDE_MLP_GROUP_DP ? c->v->dp
                                                       : c->v->pp;
    if (!c->v->member || g == NULL)
        return tide_errorf(TIDE_ERR_INVALID, "allreduce on a rank outside the layout");
    return tide_coll_allreduce(g, buf, buf, n, dtype,
                               op == TIDE_MLP_MAX ? TIDE_RED_MAX : TIDE_RED_SUM, NULL);
}

/* Messages between two stages go one way per direction (activations forward, gradients
 * backward) in schedule order, so the backend's per-pair FIFO matching is enough. */
static tide_status a_exchange(void *ctx, int send_peer, const float *send_buf, size_t send_n,
                              int recv_peer, float *recv_buf, size_t recv_n)
{
    const tide_mlp_tide_comm *c = ctx;
    const tide_view *v = c->v;
    if (!v->member || v->pp == NULL)
        return tide_errorf(TIDE_ERR_INVALID, "pipeline exchange on a rank outside the layout");
    tide_p2p_op ops[2];
    size_t n = 0;
    if (recv_peer != 0) {
        int src = recv_peer < 0 ? v->pp_prev : v->pp_next;
        if (src < 0)
            return tide_errorf(TIDE_ERR_INVALID, "stage %d has no %s stage to receive from",
                               v->pp_rank, recv_peer < 0 ? "previous" : "next");
        ops[n++] = (tide_p2p_op){TIDE_P2P_RECV, src, recv_buf, recv_n * sizeof(float), 0, 0};
    }
    if (send_peer != 0) {
        int dst = send_peer < 0 ? v->pp_prev : v->pp_next;
        if (dst < 0)
            return tide_errorf(TIDE_ERR_INVALID, "stage %d has no %s stage to send to", v->pp_rank,
                               send_peer < 0 ? "previous" : "next");
        ops[n++] =
            (tide_p2p_op){TIDE_P2P_SEND, dst, (void *)send_buf, send_n * sizeof(float), 0, 0};
    }
    if (n == 0)
        return TIDE_OK;
    /* The wait is a pipeline bubble: libtide may fill it with an offline task's steps. */
    tide_coll_req_t *req = NULL;
    TIDE_CHECK(tide_coll_p2p_start(v->pp, ops, n, NULL, &req));
    tide_status rc = tide_bubble_wait(c->t, v->pp, req);
    tide_coll_req_free(v->pp, &req);
    return rc;
}

static tide_status a_at(void *ctx, int64_t step, tide_mlp_point point)
{
    const tide_mlp_tide_comm *c = ctx;
    if (c->hooks == NULL || c->hooks->at == NULL)
        return TIDE_OK;
    return c->hooks->at(c->hooks->ctx, c->t, c->m, step, point);
}

static void a_can_finish(void *ctx)
{
    const tide_mlp_tide_comm *c = ctx;
    tide_step_can_finish(c->t);
}

void tide_mlp_tide_comm_init(tide_mlp_tide_comm *c, tide_t *t)
{
    memset(c, 0, sizeof *c);
    c->t = t;
    c->v = tide_view_get(t);
    c->comm.ctx = c;
    c->comm.device_memory = tide_buffer_kind(t) == TIDE_MEM_DEVICE;
    c->comm.allreduce = a_allreduce;
    c->comm.exchange = a_exchange;
    c->comm.at = a_at;
    c->comm.can_finish = a_can_finish;
}

/* The adapter of the elastic loop: hooks->at reaches the caller. */
static void loop_comm_init(tide_mlp_tide_comm *c, tide_t *t, const tide_mlp_t *m,
                           const tide_mlp_tide_hooks *h)
{
    tide_mlp_tide_comm_init(c, t);
    c->hooks = h;
    c->m = m;
}

/* ---- the elastic loop ---------------------------------------------------------------------- */

/* New buffers prepared ahead for an announced generation (tide_set_prepare), on
   libtide's preparation thread. mu guards gen/bufs/ms and the model while it adopts
   buffers (the preparation of a later generation may run then). */
typedef struct prepared {
    pthread_mutex_t mu;
    tide_mlp_t *m; /* the preparation reads only its config, collection and allocator */
    int32_t me;
    int host; /* host memory: first-touch the pages */
    uint64_t gen;
    void **bufs;
    double ms;
    /* the old layout's buffers, freed on a thread of ours after a switch (host memory) */
    pthread_t reaper;
    int reaping; /* reaper started, not joined */
} prepared;

static void *reap_main(void *arg)
{
    tide_mlp_garbage *g = arg;
    tide_mlp_garbage_free(&g);
    return NULL;
}

static void reap_join(prepared *p)
{
    if (p->reaping) {
        pthread_join(p->reaper, NULL);
        p->reaping = 0;
    }
}

/* Frees the old buffers: on a thread while the new layout's first step runs (host
   memory; freeing GiBs takes ~0.1 s), else now. */
static void reap(prepared *p, tide_mlp_garbage *g)
{
    reap_join(p);
    if (g == NULL)
        return;
    if (p->host && pthread_create(&p->reaper, NULL, reap_main, g) == 0) {
        p->reaping = 1;
        return;
    }
    tide_mlp_garbage_free(&g);
}

static tide_status prepare_buffers(void *ctx, const tide_view *pv)
{
    prepared *p = ctx;
    uint64_t t0 = tide_now_ns();
    void **nb = NULL, **stale = NULL;
    pthread_mutex_lock(&p->mu);
    stale = p->bufs; /* from a generation that was aborted */
    p->bufs = NULL;
    p->gen = 0;
    const tide_collection_t *coll = tide_mlp_collection(p->m);
    tide_status rc = tide_mlp_alloc_buffers(p->m, pv->layout, p->me, &nb);
    tide_mlp_free_buffers(p->m, &stale);
    pthread_mutex_unlock(&p->mu);
    TIDE_CHECK(rc);
    for (size_t i = 0; p->host && i < tide_collection_size(coll); i++) {
        uint64_t bytes =
            tide_shard_bytes(pv->layout, coll, i, pv->pp_rank, pv->dp_rank, pv->tp_rank);
        if (nb[i] != NULL)
            memset(nb[i], 0, (size_t)bytes); /* first touch: the page faults happen now */
    }
    pthread_mutex_lock(&p->mu);
    p->bufs = nb;
    p->gen = pv->generation;
    p->ms = (double)(tide_now_ns() - t0) / 1e6;
    pthread_mutex_unlock(&p->mu);
    return TIDE_OK;
}

/* The model adopted the new layout: checks, log, the after_switch hook. */
static tide_status after_switch(tide_t *t, tide_mlp_t *m, const tide_mlp_tide_hooks *h,
                                const tide_mlp_switch_stats *st, int32_t me)
{
    const tide_view *v = tide_view_get(t);
    if (v->member && tide_mlp_step_count(m) != v->step)
        return tide_errorf(TIDE_ERR_INTERNAL,
                           "after the switch to generation %llu the model's step tensor says "
                           "%lld, the runtime %lld",
                           (unsigned long long)v->generation, (long long)tide_mlp_step_count(m),
                           (long long)v->step);
    TIDE_INFO(SUBSYS,
              "rank %d: generation %llu from step %lld (%s): sent %llu B, received %llu B, "
              "%.1f ms",
              me, (unsigned long long)v->generation, (long long)v->step,
              v->member ? "member" : "idle", (unsigned long long)st->rs.bytes_sent,
              (unsigned long long)st->rs.bytes_recv, st->rs.total_ms);
    if (h->after_switch != NULL)
        TIDE_CHECK(h->after_switch(h->ctx, t, m, st));
    return TIDE_OK;
}

/* TIDE_STEP_RECONFIGURE: new buffers, reshard old -> new, adopt, hooks. */
static tide_status switch_layout(tide_t *t, tide_mlp_t *m, const tide_mlp_tide_hooks *h,
                                 prepared *pre)
{
    tide_status rc = TIDE_OK;
    int32_t me = tide_pool_rank(t);
    const tide_view *nv = tide_view_next(t);
    if (nv == NULL)
        return tide_errorf(TIDE_ERR_INTERNAL, "reconfigure without a next layout");
    if (h->before_switch != NULL)
        TIDE_CHECK(h->before_switch(h->ctx, t, m));
    void **nb = NULL;
    tide_mlp_switch_stats st;
    memset(&st, 0, sizeof st);
    uint64_t t0 = tide_now_ns();
    void **stale = NULL;
    pthread_mutex_lock(&pre->mu);
    if (pre->bufs != NULL && pre->gen == nv->generation) {
        nb = pre->bufs; /* allocated and first-touched while the last steps ran */
        st.prepared = 1;
        st.prepare_ms = pre->ms;
    } else {
        stale = pre->bufs; /* prepared for another generation */
    }
    pre->bufs = NULL;
    pre->gen = 0;
    pthread_mutex_unlock(&pre->mu);
    tide_mlp_free_buffers(m, &stale);
    if (tide_buffers(t) != NULL) {
        /* the runtime owns the state: it rebuilds it in place, the model follows */
        st.alloc_ms = 0;
        TIDE_CHECK(tide_reshard(t, NULL, &st.rs));
        st.prepared = st.rs.prepared; /* the runtime prepared it (communicators, plan, pool) */
        const tide_view *v = tide_view_get(t);
        t0 = tide_now_ns();
        size_t moved = 0, n = tide_collection_size(tide_mlp_collection(m));
        for (size_t i = 0; i < n; i++)
            moved += (size_t)tide_buffer_moved(t, i);
        pthread_mutex_lock(&pre->mu);
        rc = tide_mlp_adopt_borrowed(m, v->layout, me, v->member ? tide_buffers(t) : NULL);
        pthread_mutex_unlock(&pre->mu);
        TIDE_CHECK(rc);
        st.adopt_ms = (double)(tide_now_ns() - t0) / 1e6;
        TIDE_INFO(SUBSYS,
                  "rank %d: generation %llu in place: %zu of %zu buffers moved, peak extra "
                  "memory %llu B (staging cap %llu B, %llu B had no room), %llu B spilled",
                  me, (unsigned long long)v->generation, moved, n,
                  (unsigned long long)st.rs.peak_extra, (unsigned long long)st.rs.staging_cap,
                  (unsigned long long)st.rs.no_room, (unsigned long long)st.rs.bytes_spilled);
        return after_switch(t, m, h, &st, me);
    }
    /* a rank leaving gets a table of NULLs: nothing to hold, and adopt makes it idle */
    if (nb == NULL)
        TIDE_CHECK(tide_mlp_alloc_buffers(m, nv->layout, me, &nb));
    st.alloc_ms = (double)(tide_now_ns() - t0) / 1e6;
    TIDE_CHECK_GOTO(tide_reshard(t, nb, &st.rs), rc, out);
    t0 = tide_now_ns();
    tide_mlp_garbage *old = NULL;
    pthread_mutex_lock(&pre->mu);
    rc = tide_mlp_adopt_defer(m, tide_view_get(t)->layout, me, &nb, &old);
    pthread_mutex_unlock(&pre->mu);
    TIDE_CHECK_GOTO(rc, rc, out);
    reap(pre, old);
    st.adopt_ms = (double)(tide_now_ns() - t0) / 1e6;
    rc = after_switch(t, m, h, &st, me);
out:
    tide_mlp_free_buffers(m, &nb); /* NULL after adopt */
    return rc;
}

/* 1 when a switch that failed with rc (tided aborted it, or it timed out: a pool that
   was joining died) left this rank on generation g0 with every buffer where it was, so
   training goes on under the old layout; a failure after state moved ends the rank. */
static int switch_failed_cleanly(const tide_t *t, const tide_mlp_t *m, tide_status rc, uint64_t g0)
{
    if (rc != TIDE_ERR_ABORTED && rc != TIDE_ERR_TIMEOUT)
        return 0;
    if (tide_view_get(t)->generation != g0)
        return 0;
    size_t n = tide_collection_size(tide_mlp_collection(m));
    for (size_t i = 0; i < n; i++)
        if (tide_buffer_moved(t, i))
            return 0;
    return 1;
}

static tide_status loop(tide_t *t, tide_mlp_t *m, const tide_mlp_tide_hooks *h, prepared *pre)
{
    tide_mlp_tide_comm comm;
    loop_comm_init(&comm, t, m, h);
    for (;;) {
        tide_step_action a;
        TIDE_CHECK(tide_step_begin(t, &a));
        if (a == TIDE_STEP_FINISHED)
            return TIDE_OK;
        if (a == TIDE_STEP_RECONFIGURE) {
            uint64_t g0 = tide_view_get(t)->generation;
            tide_status rc = switch_layout(t, m, h, pre);
            if (rc != TIDE_OK && !switch_failed_cleanly(t, m, rc, g0))
                return rc;
            if (rc != TIDE_OK)
                TIDE_WARN(SUBSYS,
                          "rank %d: the switch failed before moving anything (%s); "
                          "generation %llu goes on",
                          tide_pool_rank(t), tide_last_error(), (unsigned long long)g0);
            loop_comm_init(&comm, t, m, h);
            continue;
        }
        const tide_view *v = tide_view_get(t);
        if (a == TIDE_STEP_FINISH) {
            /* the step failed in its last reduction (a peer died) after this rank's update
               needed no peer: the recovery has it finish the step alone */
            int64_t step = v->step;
            tide_status rc = tide_mlp_finish_step(m);
            TIDE_CHECK(tide_step_end(t, rc));
            TIDE_CHECK(rc);
            TIDE_WARN(SUBSYS, "step %lld finished alone after a peer failed (loss unknown here)",
                      (long long)step);
            if (h->on_step != NULL)
                TIDE_CHECK(h->on_step(h->ctx, t, m, step, NAN, 0.0));
            continue;
        }
        if (h->done != NULL && h->done(h->ctx, v))
            return tide_finish(t); /* releases the idle ranks */
        int64_t step = v->step;
        if (tide_mlp_step_count(m) != step)
            return tide_errorf(TIDE_ERR_INTERNAL,
                               "runtime runs step %lld but the model has completed %lld",
                               (long long)step, (long long)tide_mlp_step_count(m));
        double loss = 0.0;
        uint64_t t0 = tide_now_ns();
        tide_status rc = tide_mlp_step(m, &comm.comm, &loss);
        double secs = (double)(tide_now_ns() - t0) * 1e-9;
        TIDE_CHECK(tide_step_end(t, rc));
        if (rc == TIDE_ERR_ABORTED) {
            /* a peer failed: the step is not counted; the next begin switches */
            TIDE_WARN(SUBSYS, "step %lld aborted: %s", (long long)step, tide_last_error());
            continue;
        }
        TIDE_CHECK(rc);
        if (h->on_step != NULL)
            TIDE_CHECK(h->on_step(h->ctx, t, m, step, loss, secs));
    }
}

tide_status tide_mlp_tide_train(tide_t *t, tide_mlp_t *m, const tide_mlp_tide_hooks *hooks)
{
    static const tide_mlp_tide_hooks none;
    const tide_mlp_tide_hooks *h = hooks != NULL ? hooks : &none;
    prepared pre;
    memset(&pre, 0, sizeof pre);
    pthread_mutex_init(&pre.mu, NULL);
    pre.m = m;
    pre.me = tide_pool_rank(t);
    pre.host = tide_buffer_kind(t) == TIDE_MEM_HOST;
    /* buffers the runtime owns are prepared by the runtime (its pool) */
    tide_status rc = h->no_prepare || tide_buffers(t) != NULL
                         ? TIDE_OK
                         : tide_set_prepare(t, prepare_buffers, &pre);
    if (rc == TIDE_OK)
        rc = loop(t, m, h, &pre);
    tide_set_prepare(t, NULL, NULL); /* waits for a running preparation: pre is ours again */
    tide_mlp_free_buffers(m, &pre.bufs);
    reap_join(&pre);
    pthread_mutex_destroy(&pre.mu);
    return rc;
}

tide_status tide_mlp_tide_fit(const tide_mlp_config *cfg, int micro_batches, tide_fit_rule *out,
                              int *n_out)
{
    *n_out = 0;
    if (micro_batches < 1 || cfg->global_batch % micro_batches != 0)
        return tide_errorf(TIDE_ERR_INVALID,
                           "the global batch %lld does not split into %d micro-batches",
                           (long long)cfg->global_batch, micro_batches);
    memset(out, 0, TIDE_MLP_FIT_RULES * sizeof *out);
    /* dp x micro-batches, not dp alone: a resize may change the micro-batch count */
    out[0].degree = TIDE_DEGREE_DP_MICRO;
    out[0].n = cfg->global_batch;
    snprintf(out[0].what, sizeof out[0].what, "the global batch");
    out[1].degree = TIDE_DEGREE_TP;
    out[1].n = cfg->ffn;
    snprintf(out[1].what, sizeof out[1].what, "the FFN width");
    out[2].degree = TIDE_DEGREE_TP;
    out[2].n = cfg->vocab;
    snprintf(out[2].what, sizeof out[2].what, "the vocabulary");
    *n_out = TIDE_MLP_FIT_RULES;
    return TIDE_OK;
}

tide_status tide_mlp_tide_give(tide_t *t, tide_mlp_t *m)
{
    const tide_view *v = tide_view_get(t);
    const tide_collection_t *c = tide_mlp_collection(m);
    void **b = NULL;
    tide_status rc = TIDE_OK;
    TIDE_CHECK(tide_alloc_buffers(t, v, &b));
    for (size_t i = 0; i < tide_collection_size(c) && v->member; i++) {
        uint64_t bytes = 0;
        void *src = tide_mlp_buffer(m, i, &bytes);
        if (b[i] != NULL && bytes > 0)
            TIDE_CHECK_GOTO(tide_mem_copy(t, b[i], src, (size_t)bytes), rc, fail);
    }
    TIDE_CHECK_GOTO(tide_give_buffers(t, &b), rc, fail);
    return tide_mlp_adopt_borrowed(m, v->layout, tide_pool_rank(t),
                                   v->member ? tide_buffers(t) : NULL);
fail:
    tide_free_buffers(t, &b);
    return rc;
}

/* ---- gather for checks ------------------------------------------------------------------- */

/* The copy of each byte the root keeps: tp-split shards from every tp rank, else tp rank
 * 0; dp-sharded ranges from every dp rank, else dp rank 0. The others must equal it. */
static int canonical(const tide_tensor_desc *td, int d, int t)
{
    return (td->tp == TIDE_TP_SPLIT || t == 0) && (td->dp == TIDE_DP_SHARDED || d == 0);
}

/* Bytes of all of coordinate (p, d, t)'s local shards, packed in collection order. */
static uint64_t packed_bytes(const tide_layout_t *l, const tide_collection_t *c, int p, int d,
                             int t)
{
    uint64_t n = 0;
    for (size_t i = 0; i < tide_collection_size(c); i++)
        n += tide_shard_bytes(l, c, i, p, d, t);
    return n;
}

/* Receives (root) or sends (others) one coordinate's packed shards over v->all, staging
 * through the runtime's memory when that is not host memory. */
static tide_status move_packed(const tide_t *t, const tide_view *v, tide_p2p_kind kind, int peer,
                               uint8_t *host, uint64_t n)
{
    if (tide_buffer_kind(t) == TIDE_MEM_HOST || n == 0) {
        tide_p2p_op op = {kind, peer, host, (size_t)n, 0, 0};
        return tide_coll_group_p2p(v->all, &op, 1, NULL);
    }
    void *dev = NULL;
    tide_status rc = TIDE_OK;
    TIDE_CHECK(tide_mem_alloc(t, (size_t)n, &dev));
    if (kind == TIDE_P2P_SEND)
        TIDE_CHECK_GOTO(tide_copy_from_host(t, dev, host, (size_t)n), rc, out);
    tide_p2p_op op = {kind, peer, dev, (size_t)n, 0, 0};
    TIDE_CHECK_GOTO(tide_coll_group_p2p(v->all, &op, 1, NULL), rc, out);
    if (kind == TIDE_P2P_RECV)
        TIDE_CHECK_GOTO(tide_copy_to_host(t, host, dev, (size_t)n), rc, out);
out:
    tide_mem_free(t, dev);
    return rc;
}

/* This rank's local shards, packed in collection order, into host memory. */
static tide_status pack_local(const tide_mlp_t *m, const tide_view *v, uint8_t **out, uint64_t *n)
{
    const tide_collection_t *c = tide_mlp_collection(m);
    const tide_layout_t *l = tide_mlp_layout(m);
    *n = packed_bytes(l, c, v->pp_rank, v->dp_rank, v->tp_rank);
    *out = tide_malloc(*n ? *n : 1);
    if (*out == NULL)
        return tide_errorf(TIDE_ERR_NOMEM, "out of memory packing %llu bytes of state",
                           (unsigned long long)*n);
    uint64_t off = 0;
    for (size_t i = 0; i < tide_collection_size(c); i++) {
        uint64_t b = tide_shard_bytes(l, c, i, v->pp_rank, v->dp_rank, v->tp_rank);
        tide_status rc = b > 0 ? tide_mlp_read(m, i, *out + off, b) : TIDE_OK;
        if (rc != TIDE_OK) {
            tide_free(*out);
            *out = NULL;
            return rc;
        }
        off += b;
    }
    return TIDE_OK;
}

tide_status tide_mlp_tide_gather(const tide_t *rt, const tide_mlp_t *m, const tide_view *v,
                                 void ***full_out)
{
    tide_status rc = TIDE_OK;
    const tide_collection_t *c = tide_mlp_collection(m);
    const tide_layout_t *l = tide_mlp_layout(m);
    size_t n = tide_collection_size(c), ranks = tide_layout_size(l);
    void **full = NULL;
    uint8_t **packed = NULL, *tmp = NULL;
    *full_out = NULL;
    if (!v->member || v->all == NULL || !tide_mlp_active(m))
        return tide_errorf(TIDE_ERR_INVALID, "gather on a rank outside the layout");
    if (l->dp != v->layout->dp || l->tp != v->layout->tp || l->pp != v->layout->pp ||
        tide_coll_comm_size(v->all) != (int)ranks)
        return tide_errorf(TIDE_ERR_INVALID,
                           "gather: the model and the view disagree on the layout");
    int me = tide_coll_comm_rank(v->all);
    if (me != 0) {
        uint64_t nb = 0;
        TIDE_CHECK(pack_local(m, v, &tmp, &nb));
        rc = move_packed(rt, v, TIDE_P2P_SEND, 0, tmp, nb);
        tide_free(tmp);
        return rc;
    }
    packed = tide_calloc(ranks, sizeof *packed);
    full = tide_calloc(n, sizeof *full);
    TIDE_CHECK_ALLOC_GOTO(packed, rc, out);
    TIDE_CHECK_ALLOC_GOTO(full, rc, out);
    for (size_t i = 0; i < n; i++) {
        full[i] = tide_calloc(1, tide_tensor_bytes(tide_collection_tensor(c, i)));
        TIDE_CHECK_ALLOC_GOTO(full[i], rc, out);
    }
    /* every coordinate's packed shards, in v->all rank order (= layout index order) */
    for (int p = 0; p < l->pp; p++)
        for (int d = 0; d < l->dp; d++)
            for (int t = 0; t < l->tp; t++) {
                size_t r = tide_layout_index(l, p, d, t);
                uint64_t nb = packed_bytes(l, c, p, d, t);
                if (r == 0) {
                    TIDE_CHECK_GOTO(pack_local(m, v, &packed[r], &nb), rc, out);
                    continue;
                }
                packed[r] = tide_malloc(nb ? nb : 1);
                TIDE_CHECK_ALLOC_GOTO(packed[r], rc, out);
                TIDE_CHECK_GOTO(move_packed(rt, v, TIDE_P2P_RECV, (int)r, packed[r], nb), rc, out);
            }
    /* pass 0 assembles the canonical copies, pass 1 checks every other replica */
    for (int pass = 0; pass < 2; pass++)
        for (int p = 0; p < l->pp; p++)
            for (int d = 0; d < l->dp; d++)
                for (int t = 0; t < l->tp; t++) {
                    const uint8_t *src = packed[tide_layout_index(l, p, d, t)];
                    uint64_t off = 0;
                    for (size_t i = 0; i < n; i++) {
                        const tide_tensor_desc *td = tide_collection_tensor(c, i);
                        uint64_t b = tide_shard_bytes(l, c, i, p, d, t);
                        int canon = canonical(td, d, t);
                        if (b > 0 && pass == 0 && canon)
                            tide_shard_insert(l, c, i, p, d, t, src + off, full[i]);
                        if (b > 0 && pass == 1 && !canon) {
                            tmp = tide_malloc(b);
                            TIDE_CHECK_ALLOC_GOTO(tmp, rc, out);
                            tide_shard_extract(l, c, i, p, d, t, full[i], tmp);
                            int same = memcmp(tmp, src + off, b) == 0;
                            tide_free(tmp);
                            tmp = NULL;
                            if (!same)
                                TIDE_FAIL_GOTO(rc, out, TIDE_ERR_INTERNAL,
                                               "replica of %s at (pp %d, dp %d, tp %d) differs "
                                               "from the gathered copy",
                                               td->name, p, d, t);
                        }
                        off += b;
                    }
                }
    *full_out = full;
    full = NULL;
out:
    for (size_t r = 0; packed != NULL && r < ranks; r++)
        tide_free(packed[r]);
    tide_free(packed);
    tide_free(tmp);
    tide_mlp_full_free(c, &full);
    return rc;
}
