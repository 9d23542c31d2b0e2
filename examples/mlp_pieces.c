/*
 * The pieces of the train_mlp forward and backward pass for one tp shard (embedding,
 * one MLP block, final layernorm + head + vocab-parallel cross-entropy) and the
 * communication helpers under them: the allreduce over a tp/dp/pp group and the
 * pipeline exchange, both staging through host memory when the comm needs it.
 *
 * Called by the schedule (mlp_schedule.c) once per micro-batch and layer, and by the
 * tests that check one piece against its reference; calls only the compute backend and
 * the caller's tide_mlp_comm. Main thread; every call blocks until its communication
 * is done.
 */
#include "core/alloc.h"
#include "core/error.h"
#include "examples/mlp_int.h"

/* ---- communication helpers ------------------------------------------------------------------ */

static int group_size(const tide_mlp_t *m, tide_mlp_group g)
{
    return g == TIDE_MLP_GROUP_TP   ? m->layout->tp
           : g == TIDE_MLP_GROUP_DP ? m->layout->dp
                                    : m->layout->pp;
}

static int needs_stage(const tide_mlp_t *m, const tide_mlp_comm *comm)
{
    return m->ops->device != TIDE_MLP_CPU && !comm->device_memory;
}

static tide_status stage_reserve(tide_mlp_t *m, size_t bytes)
{
    if (bytes <= m->stage_bytes)
        return TIDE_OK;
    void *p = tide_realloc(m->stage, bytes);
    if (p == NULL)
        return tide_errorf(TIDE_ERR_NOMEM, "out of memory for %zu bytes of host staging", bytes);
    m->stage = p;
    m->stage_bytes = bytes;
    return TIDE_OK;
}

tide_status tide__mlp_allreduce(tide_mlp_t *m, const tide_mlp_comm *comm, tide_mlp_group g,
                                void *buf, size_t n, tide_dtype dtype, tide_mlp_redop op)
{
    if (group_size(m, g) == 1 || n == 0)
        return TIDE_OK;
    if (!needs_stage(m, comm))
        return comm->allreduce(comm->ctx, g, buf, n, dtype, op);
    size_t bytes = n * tide_dtype_size(dtype);
    TIDE_CHECK(stage_reserve(m, bytes));
    TIDE_CHECK(m->ops->copy(m->stage, buf, bytes, MLP_D2H));
    TIDE_CHECK(comm->allreduce(comm->ctx, g, m->stage, n, dtype, op));
    return m->ops->copy(buf, m->stage, bytes, MLP_H2D);
}

tide_status tide__mlp_exchange(tide_mlp_t *m, const tide_mlp_comm *comm, int send_peer,
                               const float *sbuf, int recv_peer, float *rbuf)
{
    size_t n = (size_t)(m->n * m->h), bytes = n * sizeof(float);
    if (send_peer == 0 && recv_peer == 0)
        return TIDE_OK;
    if (!needs_stage(m, comm))
        return comm->exchange(comm->ctx, send_peer, send_peer ? sbuf : NULL, send_peer ? n : 0,
                              recv_peer, recv_peer ? rbuf : NULL, recv_peer ? n : 0);
    TIDE_CHECK(stage_reserve(m, 2 * bytes));
    float *hs = m->stage, *hr = hs + n;
    if (send_peer)
        TIDE_CHECK(m->ops->copy(hs, sbuf, bytes, MLP_D2H));
    TIDE_CHECK(comm->exchange(comm->ctx, send_peer, send_peer ? hs : NULL, send_peer ? n : 0,
                              recv_peer, recv_peer ? hr : NULL, recv_peer ? n : 0));
    if (recv_peer)
        TIDE_CHECK(m->ops->copy(rbuf, hr, bytes, MLP_H2D));
    return TIDE_OK;
}

/* ---- the pieces -------------------------------------------------------------------------- */

tide_status tide__mlp_embed_fwd(tide_mlp_t *m, const tide_mlp_comm *comm, const int32_t *tok,
                                float *out)
{
    /* Vocab-parallel: each tp rank fills the rows of its tokens, zeros elsewhere; the sum
     * over tp is exact (one non-zero term per element). */
    TIDE_CHECK(m->ops->embed_fwd(m->n, m->h, tok, m->embed, m->vlo, m->vt, out));
    return tide__mlp_allreduce(m, comm, TIDE_MLP_GROUP_TP, out, (size_t)(m->n * m->h), TIDE_F32,
                               TIDE_MLP_SUM);
}

tide_status tide__mlp_embed_bwd(tide_mlp_t *m, const int32_t *tok, const float *dx)
{
    return m->ops->embed_bwd(m->n, m->h, tok, dx, m->vlo, m->vt, m->gembed);
}

tide_status tide__mlp_block_fwd(tide_mlp_t *m, const tide_mlp_comm *comm, const mlp_block *w,
                                mlp_block_act *act, float *out)
{
    const mlp_ops *o = m->ops;
    const int64_t n = m->n, h = m->h, ft = m->ft;
    TIDE_CHECK(o->ln_fwd(n, h, act->x, w->ln_w, w->ln_b, act->y, act->mean, act->rstd));
    /* fc1, column-parallel: this rank's ft output features. */
    TIDE_CHECK(o->gemm(0, 1, n, ft, h, 1.0f, act->y, w->fc1_w, 0.0f, act->a));
    TIDE_CHECK(o->bias_add(n, ft, act->a, w->fc1_b));
    TIDE_CHECK(o->gelu_fwd(n * ft, act->a, act->g));
    /* fc2, row-parallel: partial sums over this rank's ft inputs, summed over tp; the
     * replicated bias is added once, after the sum. */
    TIDE_CHECK(o->gemm(0, 1, n, h, ft, 1.0f, act->g, w->fc2_w, 0.0f, m->s_z));
    TIDE_CHECK(tide__mlp_allreduce(m, comm, TIDE_MLP_GROUP_TP, m->s_z, (size_t)(n * h), TIDE_F32,
                                   TIDE_MLP_SUM));
    TIDE_CHECK(o->bias_add(n, h, m->s_z, w->fc2_b));
    TIDE_CHECK(o->copy(out, act->x, (size_t)(n * h) * sizeof(float), MLP_D2D));
    return o->add(n * h, out, m->s_z);
}

tide_status tide__mlp_block_bwd(tide_mlp_t *m, const tide_mlp_comm *comm, const mlp_block *w,
                                const mlp_block_act *act, const float *dout, mlp_block *gw,
                                float *dx)
{
    const mlp_ops *o = m->ops;
    const int64_t n = m->n, h = m->h, ft = m->ft;
    /* dout is identical on every tp rank, so replicated parameters get identical
     * gradients without a tp reduction. */
    TIDE_CHECK(o->bias_grad(n, h, dout, gw->fc2_b));
    TIDE_CHECK(o->gemm(1, 0, h, ft, n, 1.0f, dout, act->g, 1.0f, gw->fc2_w));
    TIDE_CHECK(o->gemm(0, 0, n, ft, h, 1.0f, dout, w->fc2_w, 0.0f, m->s_da));
    TIDE_CHECK(o->gelu_bwd(n * ft, act->a, m->s_da));
    TIDE_CHECK(o->bias_grad(n, ft, m->s_da, gw->fc1_b));
    TIDE_CHECK(o->gemm(1, 0, ft, h, n, 1.0f, m->s_da, act->y, 1.0f, gw->fc1_w));
    /* The layernorm output fed every tp rank's fc1 slice: its gradient is the sum. */
    TIDE_CHECK(o->gemm(0, 0, n, h, ft, 1.0f, m->s_da, w->fc1_w, 0.0f, m->s_dy));
    TIDE_CHECK(tide__mlp_allreduce(m, comm, TIDE_MLP_GROUP_TP, m->s_dy, (size_t)(n * h), TIDE_F32,
                                   TIDE_MLP_SUM));
    TIDE_CHECK(
        o->ln_bwd(n, h, act->x, w->ln_w, act->mean, act->rstd, m->s_dy, dx, gw->ln_w, gw->ln_b));
    return o->add(n * h, dx, dout); /* the residual */
}

tide_status tide__mlp_head_fwd(tide_mlp_t *m, const tide_mlp_comm *comm, mlp_slot *slot,
                               double *loss_sum)
{
    const mlp_ops *o = m->ops;
    const int64_t n = m->n, h = m->h, vt = m->vt;
    float *mx = m->s_stats, *sz = m->s_stats + n;
    TIDE_CHECK(o->ln_fwd(n, h, slot->out, m->fln_w, m->fln_b, slot->yf, slot->meanf, slot->rstdf));
    TIDE_CHECK(o->gemm(0, 1, n, vt, h, 1.0f, slot->yf, m->head, 0.0f, slot->logits));
    /* Vocab-parallel cross-entropy: global row max, then global sum of exponentials
     * and the target logit (held by exactly one tp rank). */
    TIDE_CHECK(o->xent_max(n, vt, slot->logits, mx));
    TIDE_CHECK(
        tide__mlp_allreduce(m, comm, TIDE_MLP_GROUP_TP, mx, (size_t)n, TIDE_F32, TIDE_MLP_MAX));
    TIDE_CHECK(o->xent_sum(n, vt, slot->logits, slot->tgt, m->vlo, mx, sz));
    TIDE_CHECK(tide__mlp_allreduce(m, comm, TIDE_MLP_GROUP_TP, sz, (size_t)(2 * n), TIDE_F32,
                                   TIDE_MLP_SUM));
    /* The loss is the mean over every token of the global batch. */
    float scale = (float)(1.0 / ((double)m->cfg.global_batch * (double)m->cfg.seq));
    TIDE_CHECK(o->xent_grad(n, vt, slot->logits, slot->tgt, m->vlo, mx, sz, scale, m->s_rowloss));
    TIDE_CHECK(o->copy(m->host_rowloss, m->s_rowloss, (size_t)n * sizeof(float), MLP_D2H));
    double s = 0.0;
    for (int64_t r = 0; r < n; r++)
        s += m->host_rowloss[r];
    *loss_sum += s;
    return TIDE_OK;
}

tide_status tide__mlp_head_bwd(tide_mlp_t *m, const tide_mlp_comm *comm, mlp_slot *slot, float *dx)
{
    const mlp_ops *o = m->ops;
    const int64_t n = m->n, h = m->h, vt = m->vt;
    TIDE_CHECK(o->gemm(1, 0, vt, h, n, 1.0f, slot->logits, slot->yf, 1.0f, m->ghead));
    TIDE_CHECK(o->gemm(0, 0, n, h, vt, 1.0f, slot->logits, m->head, 0.0f, m->s_dy));
    TIDE_CHECK(tide__mlp_allreduce(m, comm, TIDE_MLP_GROUP_TP, m->s_dy, (size_t)(n * h), TIDE_F32,
                                   TIDE_MLP_SUM));
    return o->ln_bwd(n, h, slot->out, m->fln_w, slot->meanf, slot->rstdf, m->s_dy, dx, m->gfln_w,
                     m->gfln_b);
}
