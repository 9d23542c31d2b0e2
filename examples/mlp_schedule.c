/*
 * The train_mlp training step: the 1F1B pipeline schedule over the pieces of
 * mlp_pieces.c, the loss reduction over the whole layout, the data-parallel gradient
 * allreduce and the Adam update (ZeRO-1 sharing included), and the comm for a worker
 * alone (tide_mlp_comm_self, which tide_mlp_finish_step completes a step over).
 *
 * Workload: one call of tide_mlp_step per training step from the main thread (the
 * program's loop, mlp_tide.c's elastic loop, the tests); all communication goes
 * through the caller's tide_mlp_comm. Memory: nothing beyond what the model holds
 * (mlp_model.c sizes the in-flight activations and the scratch).
 */
#include <math.h>
#include <string.h>

#include "core/error.h"
#include "examples/mlp_int.h"

/* ---- a comm for one worker --------------------------------------------------------------- */

static tide_status self_allreduce(void *ctx, tide_mlp_group group, void *buf, size_t n,
                                  tide_dtype dtype, tide_mlp_redop op)
{
    return tide_errorf(TIDE_ERR_INTERNAL, "self comm: allreduce over group %d of size > 1",
                       (int)group);
}

static tide_status self_exchange(void *ctx, int send_peer, const float *send_buf, size_t send_n,
                                 int recv_peer, float *recv_buf, size_t recv_n)
{
    return tide_errorf(TIDE_ERR_INTERNAL, "self comm: pipeline exchange with pp = 1");
}

void tide_mlp_comm_self(tide_mlp_comm *out)
{
    memset(out, 0, sizeof *out);
    out->device_memory = 1; /* nothing is ever sent, so no staging either */
    out->allreduce = self_allreduce;
    out->exchange = self_exchange;
}

/* ---- the schedule ------------------------------------------------------------------------- */

/* Generates micro-batch mb of this dp rank into the slot (tokens, targets as needed). */
static tide_status load_batch(tide_mlp_t *m, int mb, mlp_slot *slot)
{
    if (!m->first && !m->last)
        return TIDE_OK;
    int64_t per_dp = m->cfg.global_batch / m->layout->dp;
    int64_t k0 = m->cursor + (int64_t)m->d * per_dp + (int64_t)mb * m->mb;
    for (int64_t s = 0; s < m->mb; s++)
        tide__mlp_sample(&m->cfg, k0 + s, m->host_tok + s * m->cfg.seq,
                         m->host_tgt + s * m->cfg.seq);
    size_t bytes = (size_t)m->n * sizeof(int32_t);
    if (m->first)
        TIDE_CHECK(m->ops->copy(slot->tok, m->host_tok, bytes, MLP_H2D));
    if (m->last)
        TIDE_CHECK(m->ops->copy(slot->tgt, m->host_tgt, bytes, MLP_H2D));
    return TIDE_OK;
}

/* Forward of micro-batch mb whose input is in place (first stage: generated here). */
static tide_status fwd(tide_mlp_t *m, const tide_mlp_comm *comm, int mb, double *loss_sum)
{
    mlp_slot *sl = &m->slots[mb % m->nslots];
    TIDE_CHECK(load_batch(m, mb, sl));
    if (m->first)
        TIDE_CHECK(tide__mlp_embed_fwd(m, comm, sl->tok, sl->act[0].x));
    for (int j = 0; j < m->nlayers; j++) {
        float *out = j + 1 < m->nlayers ? sl->act[j + 1].x : sl->out;
        TIDE_CHECK(tide__mlp_block_fwd(m, comm, &m->blk[j], &sl->act[j], out));
    }
    if (m->last)
        TIDE_CHECK(tide__mlp_head_fwd(m, comm, sl, loss_sum));
    return TIDE_OK;
}

/* Backward of micro-batch mb; the incoming gradient is in s_d0 (not last stage). Sets
 * *gx to the gradient of the stage input (s_d0 or s_d1). */
static tide_status bwd(tide_mlp_t *m, const tide_mlp_comm *comm, int mb, float **gx)
{
    mlp_slot *sl = &m->slots[mb % m->nslots];
    float *cur = m->s_d0, *other = m->s_d1;
    if (m->last) {
        TIDE_CHECK(tide__mlp_head_bwd(m, comm, sl, m->s_d1));
        cur = m->s_d1;
        other = m->s_d0;
    }
    for (int j = m->nlayers - 1; j >= 0; j--) {
        TIDE_CHECK(tide__mlp_block_bwd(m, comm, &m->blk[j], &sl->act[j], cur, &m->gblk[j], other));
        float *tmp = cur;
        cur = other;
        other = tmp;
    }
    if (m->first)
        TIDE_CHECK(tide__mlp_embed_bwd(m, sl->tok, cur));
    *gx = cur;
    return TIDE_OK;
}

/*
 * 1F1B (PipeDream-flush, Megatron's non-interleaved schedule): stage p runs
 * min(pp - p - 1, M) warm-up forwards, then alternates one forward and one backward,
 * then drains the remaining backwards. Paired transfers (send forward + receive
 * backward, send backward + receive forward) go through one exchange so that
 * neighbours never wait on each other's sends.
 */
static tide_status run_schedule(tide_mlp_t *m, const tide_mlp_comm *comm, double *loss_sum)
{
    const int M = m->micro, pp = m->layout->pp;
    const int next = m->last ? 0 : 1, prev = m->first ? 0 : -1;
    int warm = pp - m->p - 1 < M ? pp - m->p - 1 : M;
    int rest = M - warm;
    int f = 0, b = 0; /* next micro-batch to run forward / backward */
    float *gx = NULL;
    for (int i = 0; i < warm; i++, f++) {
        mlp_slot *sl = &m->slots[f % m->nslots];
        TIDE_CHECK(tide__mlp_exchange(m, comm, 0, NULL, prev, sl->act[0].x));
        TIDE_CHECK(fwd(m, comm, f, loss_sum));
        TIDE_CHECK(tide__mlp_exchange(m, comm, next, sl->out, 0, NULL));
    }
    if (rest > 0)
        TIDE_CHECK(tide__mlp_exchange(m, comm, 0, NULL, prev, m->slots[f % m->nslots].act[0].x));
    for (int i = 0; i < rest; i++, f++, b++) {
        mlp_slot *sl = &m->slots[f % m->nslots];
        TIDE_CHECK(fwd(m, comm, f, loss_sum));
        TIDE_CHECK(tide__mlp_exchange(m, comm, next, sl->out, next, m->s_d0));
        TIDE_CHECK(bwd(m, comm, b, &gx));
        if (i + 1 == rest)
            TIDE_CHECK(tide__mlp_exchange(m, comm, prev, gx, 0, NULL));
        else
            TIDE_CHECK(tide__mlp_exchange(m, comm, prev, gx, prev,
                                          m->slots[(f + 1) % m->nslots].act[0].x));
    }
    for (int i = 0; i < warm; i++, b++) {
        TIDE_CHECK(tide__mlp_exchange(m, comm, 0, NULL, next, m->s_d0));
        TIDE_CHECK(bwd(m, comm, b, &gx));
        TIDE_CHECK(tide__mlp_exchange(m, comm, prev, gx, 0, NULL));
    }
    return TIDE_OK;
}

/* Forward and backward through the schedule; *local gets this worker's loss terms. */
static tide_status run_forward_backward(tide_mlp_t *m, const tide_mlp_comm *comm, double *local)
{
    *local = 0.0;
    if (!m->active)
        return tide_errorf(TIDE_ERR_INVALID, "worker is idle: it holds no part of the layout");
    TIDE_CHECK(m->ops->zero(m->grads, (size_t)m->grad_elems * sizeof(float)));
    return run_schedule(m, comm, local);
}

static tide_status at_point(const tide_mlp_t *m, const tide_mlp_comm *comm, tide_mlp_point p)
{
    return comm->at != NULL ? comm->at(comm->ctx, m->step, p) : TIDE_OK;
}

/* The batch's global mean loss from every worker's local terms. Only the last stage has
 * loss terms and its tp ranks hold the same sum, so the sum over dp and then over
 * stages (zeros elsewhere) is the global sum; the max over tp then changes nothing but
 * makes the reduction span the whole layout (see tide_mlp_step). */
static tide_status reduce_loss(tide_mlp_t *m, const tide_mlp_comm *comm, double local, double *loss)
{
    double v = m->last ? local : 0.0;
    TIDE_CHECK(m->ops->copy(m->s_loss, &v, sizeof v, MLP_H2D));
    TIDE_CHECK(
        tide__mlp_allreduce(m, comm, TIDE_MLP_GROUP_DP, m->s_loss, 1, TIDE_F64, TIDE_MLP_SUM));
    TIDE_CHECK(at_point(m, comm, TIDE_MLP_AT_LOSS));
    TIDE_CHECK(
        tide__mlp_allreduce(m, comm, TIDE_MLP_GROUP_PP, m->s_loss, 1, TIDE_F64, TIDE_MLP_SUM));
    TIDE_CHECK(
        tide__mlp_allreduce(m, comm, TIDE_MLP_GROUP_TP, m->s_loss, 1, TIDE_F64, TIDE_MLP_MAX));
    TIDE_CHECK(m->ops->copy(&v, m->s_loss, sizeof v, MLP_D2H));
    *loss = v / ((double)m->cfg.global_batch * (double)m->cfg.seq);
    return TIDE_OK;
}

tide_status tide_mlp_forward_backward(tide_mlp_t *m, const tide_mlp_comm *comm, double *loss)
{
    double local = 0.0;
    *loss = 0.0;
    TIDE_CHECK(run_forward_backward(m, comm, &local));
    return reduce_loss(m, comm, local, loss);
}

/* Whether this worker's Adam update covers only part of some parameters (ZeRO-1 over
 * dp > 1): the update is then shared by one more allreduce. */
static int sharded_update(const tide_mlp_t *m)
{
    for (size_t k = 0; k < m->nparams; k++)
        if (m->params[k].n > 0 && m->params[k].cnt != m->params[k].n)
            return m->layout->dp > 1;
    return 0;
}

/* Adam on the local shards from the summed gradients, then (ZeRO-1) the sharing of the
 * updated ranges, and the step and data counters. */
static tide_status apply_update(tide_mlp_t *m, const tide_mlp_comm *comm)
{
    const mlp_ops *o = m->ops;
    int64_t t = m->step + 1;
    float bc1 = (float)(1.0 - pow(m->cfg.beta1, (double)t));
    float bc2 = (float)(1.0 - pow(m->cfg.beta2, (double)t));
    m->grads_ready = -1;
    for (size_t k = 0; k < m->nparams; k++) {
        mlp_param *pr = &m->params[k];
        if (pr->n == 0)
            continue;
        float *p = m->buf[pr->index];
        float *mom1 = m->buf[pr->index + 1], *mom2 = m->buf[pr->index + 2];
        TIDE_CHECK(o->adam(pr->cnt, p + pr->lo, pr->grad + pr->lo, mom1, mom2, (float)m->cfg.lr,
                           (float)m->cfg.beta1, (float)m->cfg.beta2, (float)m->cfg.eps, bc1, bc2));
    }
    if (sharded_update(m)) {
        /* ZeRO-1: each dp rank updated its range; share the new values through the
         * gradient arena (zeros outside the own range, so the sum is exact). */
        TIDE_CHECK(o->zero(m->grads, (size_t)m->grad_elems * sizeof(float)));
        for (size_t k = 0; k < m->nparams; k++) {
            mlp_param *pr = &m->params[k];
            if (pr->cnt > 0)
                TIDE_CHECK(o->copy(pr->grad + pr->lo, (float *)m->buf[pr->index] + pr->lo,
                                   (size_t)pr->cnt * sizeof(float), MLP_D2D));
        }
        TIDE_CHECK(tide__mlp_allreduce(m, comm, TIDE_MLP_GROUP_DP, m->grads, (size_t)m->grad_elems,
                                       TIDE_F32, TIDE_MLP_SUM));
        for (size_t k = 0; k < m->nparams; k++) {
            mlp_param *pr = &m->params[k];
            if (pr->n > 0)
                TIDE_CHECK(
                    o->copy(m->buf[pr->index], pr->grad, (size_t)pr->n * sizeof(float), MLP_D2D));
        }
    }
    m->step = t;
    m->cursor += m->cfg.global_batch;
    TIDE_CHECK(tide__mlp_store_counters(m));
    return o->sync();
}

tide_status tide_mlp_step(tide_mlp_t *m, const tide_mlp_comm *comm, double *loss)
{
    double local = 0.0;
    *loss = 0.0;
    m->grads_ready = -1;
    TIDE_CHECK(run_forward_backward(m, comm, &local));
    TIDE_CHECK(at_point(m, comm, TIDE_MLP_AT_GRADS));
    /* Gradients are already scaled to the global mean: the dp sum completes them. */
    TIDE_CHECK(tide__mlp_allreduce(m, comm, TIDE_MLP_GROUP_DP, m->grads, (size_t)m->grad_elems,
                                   TIDE_F32, TIDE_MLP_SUM));
    /* This worker's update now needs no peer (unless ZeRO-1 shares it afterwards). */
    if (!sharded_update(m)) {
        m->grads_ready = m->step;
        if (comm->can_finish != NULL)
            comm->can_finish(comm->ctx);
    }
    /* The loss reduction comes after the gradient allreduce and spans every worker, so a
     * worker gets past it only once every worker of the layout holds its summed
     * gradients: if one dies before that, no survivor has changed its state, and the step
     * is redone over the survivors. If one dies inside it, the survivors that got past
     * it complete the step and those stuck in it can complete it alone
     * (tide_mlp_finish_step): either way every survivor agrees on the step. */
    TIDE_CHECK(reduce_loss(m, comm, local, loss));
    return apply_update(m, comm);
}

tide_status tide_mlp_finish_step(tide_mlp_t *m)
{
    if (m->grads_ready != m->step || m->step < 0)
        return tide_errorf(TIDE_ERR_INVALID,
                           "tide_mlp_finish_step: step %lld has no summed gradients to apply "
                           "(its gradient allreduce did not complete, or ZeRO-1 shards the "
                           "update)",
                           (long long)m->step);
    tide_mlp_comm self;
    tide_mlp_comm_self(&self);
    return apply_update(m, &self);
}
