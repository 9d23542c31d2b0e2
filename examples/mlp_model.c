/*
 * The train_mlp model: its tensor collection, the per-worker state in reshard shard
 * geometry, the pieces of the forward and backward pass for one tp shard, and the 1F1B
 * pipeline schedule with data-parallel gradient allreduce and Adam.
 *
 * Workload: one call of tide_mlp_step per training step from the main thread; all
 * communication goes through the caller's tide_mlp_comm. Memory per worker: its state
 * (parameters, two moments, one gradient per local parameter) plus the activations of
 * at most min(micro-batches, pp - stage) micro-batches in flight.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "core/alloc.h"
#include "core/error.h"
#include "core/log.h"
#include "examples/mlp_int.h"

#define SUBSYS "mlp"

/* ---- configuration and collection ----------------------------------------------------- */

void tide_mlp_config_default(tide_mlp_config *cfg)
{
    memset(cfg, 0, sizeof *cfg);
    cfg->layers = 4;
    cfg->hidden = 64;
    cfg->ffn = 256;
    cfg->vocab = 64;
    cfg->seq = 16;
    cfg->global_batch = 32;
    cfg->seed = 1234;
    cfg->lr = 3e-3;
    cfg->beta1 = 0.9;
    cfg->beta2 = 0.999;
    cfg->eps = 1e-8;
    cfg->zero1 = 0;
}

tide_status tide_mlp_config_check(const tide_mlp_config *cfg)
{
    if (cfg->layers < 1 || cfg->layers > 100000)
        return tide_errorf(TIDE_ERR_INVALID, "layers=%d: need 1..100000", cfg->layers);
    if (cfg->hidden < 1 || cfg->ffn < 1 || cfg->seq < 1 || cfg->global_batch < 1)
        return tide_errorf(TIDE_ERR_INVALID,
                           "hidden=%lld ffn=%lld seq=%lld global-batch=%lld: all must be >= 1",
                           (long long)cfg->hidden, (long long)cfg->ffn, (long long)cfg->seq,
                           (long long)cfg->global_batch);
    if (cfg->vocab < 2 || cfg->vocab > INT32_MAX)
        return tide_errorf(TIDE_ERR_INVALID, "vocab=%lld: need 2..%d", (long long)cfg->vocab,
                           INT32_MAX);
    if (!(cfg->lr > 0.0) || !(cfg->beta1 >= 0.0 && cfg->beta1 < 1.0) ||
        !(cfg->beta2 >= 0.0 && cfg->beta2 < 1.0) || !(cfg->eps > 0.0))
        return tide_errorf(TIDE_ERR_INVALID,
                           "Adam settings lr=%g beta1=%g beta2=%g eps=%g: need lr > 0, betas in "
                           "[0, 1), eps > 0",
                           cfg->lr, cfg->beta1, cfg->beta2, cfg->eps);
    return TIDE_OK;
}

tide_status tide_mlp_device_parse(const char *text, tide_mlp_device *out)
{
    if (text != NULL && strcasecmp(text, "cpu") == 0) {
        *out = TIDE_MLP_CPU;
        return TIDE_OK;
    }
    if (text != NULL && strcasecmp(text, "cuda") == 0) {
        *out = TIDE_MLP_CUDA;
        return TIDE_OK;
    }
    return tide_errorf(TIDE_ERR_INVALID, "device '%s': expected cpu or cuda",
                       text ? text : "(null)");
}

static tide_status add_tensor(tide_collection_t *c, const char *name, tide_dtype dtype, int ndim,
                              int64_t s0, int64_t s1, int layer, tide_tp_rule tp, int tp_dim,
                              tide_dp_rule dp)
{
    tide_tensor_desc d;
    memset(&d, 0, sizeof d);
    if (snprintf(d.name, sizeof d.name, "%s", name) >= (int)sizeof d.name)
        return tide_errorf(TIDE_ERR_INVALID, "tensor name %s too long", name);
    d.dtype = dtype;
    d.ndim = ndim;
    d.shape[0] = s0;
    d.shape[1] = s1;
    d.layer = layer;
    d.tp = tp;
    d.tp_dim = tp_dim;
    d.tp_segments = 1;
    d.dp = dp;
    return tide_collection_add(c, &d);
}

/* A parameter followed by its two Adam moments (same shape and tp rule). */
static tide_status add_param(tide_collection_t *c, const tide_mlp_config *cfg, const char *name,
                             int ndim, int64_t s0, int64_t s1, int layer, tide_tp_rule tp,
                             int tp_dim)
{
    char mname[TIDE_NAME_MAX];
    tide_dp_rule mdp = cfg->zero1 ? TIDE_DP_SHARDED : TIDE_DP_REPLICATED;
    TIDE_CHECK(add_tensor(c, name, TIDE_F32, ndim, s0, s1, layer, tp, tp_dim, TIDE_DP_REPLICATED));
    snprintf(mname, sizeof mname, "%s.exp_avg", name);
    TIDE_CHECK(add_tensor(c, mname, TIDE_F32, ndim, s0, s1, layer, tp, tp_dim, mdp));
    snprintf(mname, sizeof mname, "%s.exp_avg_sq", name);
    TIDE_CHECK(add_tensor(c, mname, TIDE_F32, ndim, s0, s1, layer, tp, tp_dim, mdp));
    return TIDE_OK;
}

static tide_status build_collection(const tide_mlp_config *cfg, tide_collection_t *c)
{
    const int64_t h = cfg->hidden, f = cfg->ffn, v = cfg->vocab;
    char name[TIDE_NAME_MAX];
    TIDE_CHECK(add_param(c, cfg, "embed.weight", 2, v, h, TIDE_LAYER_PRE, TIDE_TP_SPLIT, 0));
    for (int i = 0; i < cfg->layers; i++) {
        snprintf(name, sizeof name, "layer.%d.ln2.weight", i);
        TIDE_CHECK(add_param(c, cfg, name, 1, h, 0, i, TIDE_TP_REPLICATED, 0));
        snprintf(name, sizeof name, "layer.%d.ln2.bias", i);
        TIDE_CHECK(add_param(c, cfg, name, 1, h, 0, i, TIDE_TP_REPLICATED, 0));
        snprintf(name, sizeof name, "layer.%d.fc1.weight", i);
        TIDE_CHECK(add_param(c, cfg, name, 2, f, h, i, TIDE_TP_SPLIT, 0));
        snprintf(name, sizeof name, "layer.%d.fc1.bias", i);
        TIDE_CHECK(add_param(c, cfg, name, 1, f, 0, i, TIDE_TP_SPLIT, 0));
        snprintf(name, sizeof name, "layer.%d.fc2.weight", i);
        TIDE_CHECK(add_param(c, cfg, name, 2, h, f, i, TIDE_TP_SPLIT, 1));
        snprintf(name, sizeof name, "layer.%d.fc2.bias", i);
        TIDE_CHECK(add_param(c, cfg, name, 1, h, 0, i, TIDE_TP_REPLICATED, 0));
    }
    TIDE_CHECK(
        add_param(c, cfg, "final_ln.weight", 1, h, 0, TIDE_LAYER_POST, TIDE_TP_REPLICATED, 0));
    TIDE_CHECK(add_param(c, cfg, "final_ln.bias", 1, h, 0, TIDE_LAYER_POST, TIDE_TP_REPLICATED, 0));
    TIDE_CHECK(add_param(c, cfg, "head.weight", 2, v, h, TIDE_LAYER_POST, TIDE_TP_SPLIT, 0));
    TIDE_CHECK(add_tensor(c, "step", TIDE_I64, 1, 1, 0, TIDE_LAYER_ALL, TIDE_TP_REPLICATED, 0,
                          TIDE_DP_REPLICATED));
    TIDE_CHECK(add_tensor(c, "data.cursor", TIDE_I64, 1, 1, 0, TIDE_LAYER_ALL, TIDE_TP_REPLICATED,
                          0, TIDE_DP_REPLICATED));
    return TIDE_OK;
}

tide_status tide_mlp_collection_new(const tide_mlp_config *cfg, tide_collection_t **out)
{
    *out = NULL;
    TIDE_CHECK(tide_mlp_config_check(cfg));
    tide_collection_t *c = NULL;
    TIDE_CHECK(tide_collection_new(&c, cfg->layers));
    tide_status rc = build_collection(cfg, c);
    if (rc != TIDE_OK) {
        tide_collection_destroy(&c);
        return rc;
    }
    *out = c;
    return TIDE_OK;
}

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

/* ---- state ------------------------------------------------------------------------------ */

static int is_moment(const char *name)
{
    size_t n = strlen(name);
    return (n > 8 && strcmp(name + n - 8, ".exp_avg") == 0) ||
           (n > 11 && strcmp(name + n - 11, ".exp_avg_sq") == 0);
}

long tide__mlp_param_of(const tide_mlp_t *m, size_t tensor_index)
{
    for (size_t k = 0; k < m->nparams; k++)
        if (m->params[k].index == tensor_index)
            return (long)k;
    return -1;
}

static size_t index_of(const tide_mlp_t *m, const char *name)
{
    size_t i = 0;
    /* Names come from build_collection, so a miss is a programming error. */
    if (tide_collection_find(m->coll, name, &i) != TIDE_OK) {
        TIDE_ERROR(SUBSYS, "internal: tensor %s missing from the collection", name);
        return 0;
    }
    return i;
}

static float *pbuf(const tide_mlp_t *m, const char *name)
{
    return (float *)m->buf[index_of(m, name)];
}

static float *gbuf(const tide_mlp_t *m, const char *name)
{
    long k = tide__mlp_param_of(m, index_of(m, name));
    return k < 0 ? NULL : m->params[k].grad;
}

static float *take(float **cur, int64_t n)
{
    float *p = *cur;
    *cur += n;
    return p;
}

/* Frees everything that depends on the layout; keeps cfg, coll, ops, params table. */
/* Old big buffers kept for a later release (tide_mlp_adopt_defer). */
struct tide_mlp_garbage {
    const mlp_ops *ops;
    size_t n, cap;
    void **p;
};

/* Releases p now, or hands it to g (which has room: ntensors + 3 entries). */
static void drop(const mlp_ops *ops, tide_mlp_garbage *g, void *p)
{
    if (p == NULL)
        return;
    if (g != NULL && g->n < g->cap)
        g->p[g->n++] = p;
    else
        ops->release(p);
}

/* Frees what m holds; the big buffers go to g when not NULL. */
static void teardown_into(tide_mlp_t *m, tide_mlp_garbage *g)
{
    const mlp_ops *ops = m->ops;
    if (m->buf != NULL && !m->borrowed)
        for (size_t i = 0; i < m->ntensors; i++)
            drop(ops, g, m->buf[i]);
    tide_free(m->buf);
    m->buf = NULL;
    tide_free(m->bytes);
    m->bytes = NULL;
    drop(ops, g, m->grads);
    m->grads = NULL;
    for (size_t k = 0; k < m->nparams; k++)
        m->params[k].grad = NULL;
    tide_free(m->blk);
    tide_free(m->gblk);
    m->blk = m->gblk = NULL;
    if (m->slots != NULL)
        for (int s = 0; s < m->nslots; s++)
            tide_free(m->slots[s].act);
    tide_free(m->slots);
    m->slots = NULL;
    drop(ops, g, m->slot_arena);
    m->slot_arena = NULL;
    drop(ops, g, m->scratch);
    m->scratch = NULL;
    tide_free(m->host_rowloss);
    tide_free(m->host_tok);
    tide_free(m->host_tgt);
    m->host_rowloss = NULL;
    m->host_tok = m->host_tgt = NULL;
    tide_layout_destroy(&m->layout);
    m->active = 0;
}

static void teardown(tide_mlp_t *m)
{
    teardown_into(m, NULL);
}

/* Checks the layout for this model beyond the collection rules. */
static tide_status check_layout(const tide_mlp_t *m, const tide_layout_t *l)
{
    TIDE_CHECK(tide_layout_validate(l, m->coll));
    int64_t per = (int64_t)l->dp * l->micro_batches;
    if (m->cfg.global_batch % per != 0)
        return tide_errorf(TIDE_ERR_INVALID,
                           "global batch %lld is not divisible by dp %d x micro-batches %d",
                           (long long)m->cfg.global_batch, l->dp, l->micro_batches);
    return TIDE_OK;
}

static tide_status coord_of(const tide_layout_t *l, int32_t worker, int *p, int *d, int *t,
                            int *found)
{
    tide_status rc = tide_layout_find(l, worker, p, d, t);
    *found = rc == TIDE_OK;
    if (rc == TIDE_ERR_NOT_FOUND) {
        tide_error_clear();
        return TIDE_OK;
    }
    return rc;
}

/*
 * Sets up m (torn down or fresh) for worker in l, adopting bufs (collection-sized array
 * of local buffers; NULL: allocate zero-filled ones). On failure the caller tears down;
 * entries of bufs stay the caller's until success (m->buf copies the pointers, and
 * tide_mlp_adopt clears them before tearing a failed setup down).
 */
static tide_status setup(tide_mlp_t *m, const tide_layout_t *l, int32_t worker, void **bufs)
{
    tide_status rc;
    const mlp_ops *ops = m->ops;
    TIDE_CHECK(check_layout(m, l));
    TIDE_CHECK(tide_layout_copy(&m->layout, l));
    int found = 0;
    TIDE_CHECK(coord_of(l, worker, &m->p, &m->d, &m->t, &found));
    m->buf = tide_calloc(m->ntensors, sizeof *m->buf);
    m->bytes = tide_calloc(m->ntensors, sizeof *m->bytes);
    if (m->buf == NULL || m->bytes == NULL)
        return tide_errorf(TIDE_ERR_NOMEM, "out of memory for the tensor table");
    if (!found) {
        m->active = 0;
        return TIDE_OK;
    }
    m->active = 1;
    m->first = m->p == 0;
    m->last = m->p == l->pp - 1;
    m->layer0 = l->stage_start[m->p];
    m->nlayers = l->stage_start[m->p + 1] - m->layer0;
    m->h = m->cfg.hidden;
    m->ft = m->cfg.ffn / l->tp;
    m->vt = m->cfg.vocab / l->tp;
    m->vlo = (int64_t)m->t * m->vt;
    m->micro = l->micro_batches;
    m->mb = m->cfg.global_batch / ((int64_t)l->dp * l->micro_batches);
    m->n = m->mb * m->cfg.seq;

    for (size_t i = 0; i < m->ntensors; i++) {
        m->bytes[i] = tide_shard_bytes(l, m->coll, i, m->p, m->d, m->t);
        if (bufs != NULL) {
            m->buf[i] = bufs[i];
            if ((bufs[i] == NULL) != (m->bytes[i] == 0))
                return tide_errorf(TIDE_ERR_INVALID,
                                   "adopted buffer of %s does not match the layout",
                                   tide_collection_tensor(m->coll, i)->name);
        } else {
            rc = ops->alloc(m->bytes[i], &m->buf[i]);
            if (rc != TIDE_OK)
                return rc;
        }
    }

    /* Gradients: one arena so that the dp allreduce is one call. */
    int64_t total = 0;
    for (size_t k = 0; k < m->nparams; k++) {
        mlp_param *pr = &m->params[k];
        pr->n = (int64_t)(m->bytes[pr->index] / sizeof(float));
        pr->lo = 0;
        pr->cnt = pr->n;
        if (pr->n > 0 && tide_collection_tensor(m->coll, pr->index + 1)->dp == TIDE_DP_SHARDED) {
            int64_t dp = l->dp, base = pr->n / dp, extra = pr->n % dp;
            pr->lo = m->d * base + (m->d < extra ? m->d : extra);
            pr->cnt = (int64_t)(m->bytes[pr->index + 1] / sizeof(float));
        }
        total += pr->n;
    }
    m->grad_elems = total;
    void *g = NULL;
    TIDE_CHECK(ops->alloc((size_t)total * sizeof(float), &g));
    m->grads = g;
    float *cur = m->grads;
    for (size_t k = 0; k < m->nparams; k++)
        m->params[k].grad = m->params[k].n ? take(&cur, m->params[k].n) : NULL;

    /* Views. */
    char name[TIDE_NAME_MAX];
    m->blk = tide_calloc((size_t)m->nlayers, sizeof *m->blk);
    m->gblk = tide_calloc((size_t)m->nlayers, sizeof *m->gblk);
    if (m->blk == NULL || m->gblk == NULL)
        return tide_errorf(TIDE_ERR_NOMEM, "out of memory for layer views");
    for (int j = 0; j < m->nlayers; j++) {
        int li = m->layer0 + j;
#define VIEW(field, suffix)                                                                        \
    snprintf(name, sizeof name, "layer.%d." suffix, li);                                           \
    m->blk[j].field = pbuf(m, name);                                                               \
    m->gblk[j].field = gbuf(m, name)
        VIEW(ln_w, "ln2.weight");
        VIEW(ln_b, "ln2.bias");
        VIEW(fc1_w, "fc1.weight");
        VIEW(fc1_b, "fc1.bias");
        VIEW(fc2_w, "fc2.weight");
        VIEW(fc2_b, "fc2.bias");
#undef VIEW
    }
    m->embed = pbuf(m, "embed.weight");
    m->gembed = gbuf(m, "embed.weight");
    m->fln_w = pbuf(m, "final_ln.weight");
    m->fln_b = pbuf(m, "final_ln.bias");
    m->gfln_w = gbuf(m, "final_ln.weight");
    m->gfln_b = gbuf(m, "final_ln.bias");
    m->head = pbuf(m, "head.weight");
    m->ghead = gbuf(m, "head.weight");

    /* Activations of the micro-batches in flight: 1F1B keeps at most pp - p. */
    const int64_t n = m->n, h = m->h, ft = m->ft, vt = m->vt;
    m->nslots = m->micro < l->pp - m->p ? m->micro : l->pp - m->p;
    int64_t per_layer = 2 * n * h + 2 * n + 2 * n * ft;
    int64_t per_slot = 2 * n /* tok, tgt (int32 stored in f32 slots) */ +
                       (int64_t)m->nlayers * per_layer + n * h +
                       (m->last ? n * h + 2 * n + n * vt : 0);
    void *arena = NULL;
    TIDE_CHECK(ops->alloc((size_t)(per_slot * m->nslots) * sizeof(float), &arena));
    m->slot_arena = arena;
    m->slots = tide_calloc((size_t)m->nslots, sizeof *m->slots);
    if (m->slots == NULL)
        return tide_errorf(TIDE_ERR_NOMEM, "out of memory for pipeline slots");
    cur = m->slot_arena;
    for (int s = 0; s < m->nslots; s++) {
        mlp_slot *sl = &m->slots[s];
        sl->tok = (int32_t *)(void *)take(&cur, n);
        sl->tgt = (int32_t *)(void *)take(&cur, n);
        sl->act = tide_calloc((size_t)m->nlayers, sizeof *sl->act);
        if (sl->act == NULL)
            return tide_errorf(TIDE_ERR_NOMEM, "out of memory for pipeline slots");
        for (int j = 0; j < m->nlayers; j++) {
            mlp_block_act *a = &sl->act[j];
            a->x = take(&cur, n * h);
            a->y = take(&cur, n * h);
            a->mean = take(&cur, n);
            a->rstd = take(&cur, n);
            a->a = take(&cur, n * ft);
            a->g = take(&cur, n * ft);
        }
        sl->out = take(&cur, n * h);
        if (m->last) {
            sl->yf = take(&cur, n * h);
            sl->meanf = take(&cur, n);
            sl->rstdf = take(&cur, n);
            sl->logits = take(&cur, n * vt);
        }
    }

    /* Scratch; the f64 loss cell first so that it is 8-byte aligned. */
    int64_t scratch = 2 /* f64 loss */ + 4 * n * h + n * ft + 3 * n + n;
    TIDE_CHECK(ops->alloc((size_t)scratch * sizeof(float), &arena));
    m->scratch = arena;
    cur = arena;
    m->s_loss = (double *)(void *)take(&cur, 2);
    m->s_z = take(&cur, n * h);
    m->s_d0 = take(&cur, n * h);
    m->s_d1 = take(&cur, n * h);
    m->s_dy = take(&cur, n * h);
    m->s_da = take(&cur, n * ft);
    m->s_stats = take(&cur, 3 * n);
    m->s_rowloss = take(&cur, n);
    m->host_rowloss = tide_calloc((size_t)n, sizeof(float));
    m->host_tok = tide_calloc((size_t)n, sizeof(int32_t));
    m->host_tgt = tide_calloc((size_t)n, sizeof(int32_t));
    if (m->host_rowloss == NULL || m->host_tok == NULL || m->host_tgt == NULL)
        return tide_errorf(TIDE_ERR_NOMEM, "out of memory for host batch buffers");
    return TIDE_OK;
}

/* ---- lifecycle ---------------------------------------------------------------------------- */

tide_status tide_mlp_new(tide_mlp_t **out, const tide_mlp_config *cfg, const tide_layout_t *l,
                         int32_t worker, tide_mlp_device device)
{
    tide_status rc = TIDE_OK;
    *out = NULL;
    TIDE_CHECK(tide_mlp_config_check(cfg));
    tide_mlp_t *m = tide_calloc(1, sizeof *m);
    TIDE_CHECK_ALLOC_GOTO(m, rc, fail);
    m->cfg = *cfg;
    m->grads_ready = -1;
    m->ops = &tide__mlp_host_ops; /* until the real backend is known: teardown needs one */
    const mlp_ops *ops = NULL;
    TIDE_CHECK_GOTO(tide__mlp_ops_for(device, &ops), rc, fail);
    m->ops = ops;
    if (device == TIDE_MLP_CPU)
        tide__mlp_host_single_thread();
    TIDE_CHECK_GOTO(tide_mlp_collection_new(cfg, &m->coll), rc, fail);
    m->ntensors = tide_collection_size(m->coll);
    m->params = tide_calloc(m->ntensors, sizeof *m->params);
    TIDE_CHECK_ALLOC_GOTO(m->params, rc, fail);
    for (size_t i = 0; i < m->ntensors; i++) {
        const tide_tensor_desc *td = tide_collection_tensor(m->coll, i);
        if (td->dtype == TIDE_F32 && !is_moment(td->name))
            m->params[m->nparams++].index = i;
    }
    TIDE_CHECK_GOTO(setup(m, l, worker, NULL), rc, fail);
    *out = m;
    return TIDE_OK;
fail:
    tide_mlp_destroy(&m);
    return rc;
}

void tide_mlp_destroy(tide_mlp_t **self_p)
{
    if (self_p == NULL || *self_p == NULL)
        return;
    tide_mlp_t *m = *self_p;
    if (m->params != NULL)
        teardown(m);
    tide_free(m->params);
    tide_collection_destroy(&m->coll);
    tide_free(m->stage);
    tide_free(m);
    *self_p = NULL;
}

int tide_mlp_active(const tide_mlp_t *m)
{
    return m->active;
}

const tide_layout_t *tide_mlp_layout(const tide_mlp_t *m)
{
    return m->layout;
}

tide_status tide_mlp_coord(const tide_mlp_t *m, int *p, int *d, int *t)
{
    if (!m->active)
        return tide_errorf(TIDE_ERR_NOT_FOUND, "worker is idle (not in the layout)");
    *p = m->p;
    *d = m->d;
    *t = m->t;
    return TIDE_OK;
}

const tide_collection_t *tide_mlp_collection(const tide_mlp_t *m)
{
    return m->coll;
}

int64_t tide_mlp_step_count(const tide_mlp_t *m)
{
    return m->step;
}

void *tide_mlp_buffer(const tide_mlp_t *m, size_t i, uint64_t *bytes)
{
    if (i >= m->ntensors || m->buf == NULL) {
        *bytes = 0;
        return NULL;
    }
    *bytes = m->bytes[i];
    return m->buf[i];
}

void *const *tide_mlp_buffers(const tide_mlp_t *m)
{
    return m->buf;
}

static tide_status check_tensor(const tide_mlp_t *m, size_t i, uint64_t bytes)
{
    if (i >= m->ntensors)
        return tide_errorf(TIDE_ERR_RANGE, "tensor index %zu >= %zu", i, m->ntensors);
    if (m->buf == NULL || bytes != m->bytes[i])
        return tide_errorf(TIDE_ERR_INVALID, "%s: %llu bytes requested, the local shard has %llu",
                           tide_collection_tensor(m->coll, i)->name, (unsigned long long)bytes,
                           (unsigned long long)(m->buf ? m->bytes[i] : 0));
    return TIDE_OK;
}

tide_status tide_mlp_read(const tide_mlp_t *m, size_t i, void *dst, uint64_t bytes)
{
    TIDE_CHECK(check_tensor(m, i, bytes));
    return m->ops->copy(dst, m->buf[i], bytes, MLP_D2H);
}

tide_status tide_mlp_write(tide_mlp_t *m, size_t i, const void *src, uint64_t bytes)
{
    TIDE_CHECK(check_tensor(m, i, bytes));
    TIDE_CHECK(m->ops->copy(m->buf[i], src, bytes, MLP_H2D));
    const char *name = tide_collection_tensor(m->coll, i)->name;
    if (bytes == sizeof(int64_t) && strcmp(name, "step") == 0) {
        memcpy(&m->step, src, sizeof m->step);
        m->grads_ready = -1;
    } else if (bytes == sizeof(int64_t) && strcmp(name, "data.cursor") == 0)
        memcpy(&m->cursor, src, sizeof m->cursor);
    return TIDE_OK;
}

tide_status tide_mlp_read_grad(const tide_mlp_t *m, size_t i, float *dst, uint64_t bytes)
{
    long k = i < m->ntensors ? tide__mlp_param_of(m, i) : -1;
    if (k < 0)
        return tide_errorf(TIDE_ERR_INVALID, "tensor %zu is not a parameter", i);
    if (m->params[k].n == 0 || bytes != (uint64_t)m->params[k].n * sizeof(float))
        return tide_errorf(TIDE_ERR_INVALID,
                           "%s: gradient has %lld elements here, %llu bytes "
                           "requested",
                           tide_collection_tensor(m->coll, i)->name, (long long)m->params[k].n,
                           (unsigned long long)bytes);
    return m->ops->copy(dst, m->params[k].grad, bytes, MLP_D2H);
}

/* Writes the step and cursor mirrors into their tensors. */
static tide_status store_counters(tide_mlp_t *m)
{
    size_t is = index_of(m, "step"), ic = index_of(m, "data.cursor");
    TIDE_CHECK(m->ops->copy(m->buf[is], &m->step, sizeof m->step, MLP_H2D));
    TIDE_CHECK(m->ops->copy(m->buf[ic], &m->cursor, sizeof m->cursor, MLP_H2D));
    return TIDE_OK;
}

static tide_status load_counters(tide_mlp_t *m)
{
    size_t is = index_of(m, "step"), ic = index_of(m, "data.cursor");
    TIDE_CHECK(m->ops->copy(&m->step, m->buf[is], sizeof m->step, MLP_D2H));
    TIDE_CHECK(m->ops->copy(&m->cursor, m->buf[ic], sizeof m->cursor, MLP_D2H));
    m->grads_ready = -1;
    return TIDE_OK;
}

tide_status tide_mlp_init(tide_mlp_t *m)
{
    tide_status rc = TIDE_OK;
    float *full = NULL, *local = NULL;
    m->step = 0;
    m->cursor = 0;
    m->grads_ready = -1;
    if (!m->active)
        return TIDE_OK;
    for (size_t i = 0; i < m->ntensors; i++) {
        const tide_tensor_desc *td = tide_collection_tensor(m->coll, i);
        if (m->bytes[i] == 0 || td->dtype != TIDE_F32)
            continue;
        /* Generate the whole tensor and cut this worker's shard out of it, so that the
         * values never depend on the layout. */
        uint64_t gb = tide_tensor_bytes(td), ge = gb / sizeof(float);
        full = tide_malloc(gb);
        local = tide_malloc(m->bytes[i]);
        TIDE_CHECK_ALLOC_GOTO(full, rc, out);
        TIDE_CHECK_ALLOC_GOTO(local, rc, out);
        for (uint64_t e = 0; e < ge; e++)
            full[e] = tide__mlp_init_value(&m->cfg, td->name, (int64_t)e);
        tide_shard_extract(m->layout, m->coll, i, m->p, m->d, m->t, full, local);
        TIDE_CHECK_GOTO(m->ops->copy(m->buf[i], local, m->bytes[i], MLP_H2D), rc, out);
        tide_free(full);
        tide_free(local);
        full = local = NULL;
    }
    TIDE_CHECK_GOTO(store_counters(m), rc, out);
    TIDE_CHECK_GOTO(m->ops->sync(), rc, out);
out:
    tide_free(full);
    tide_free(local);
    return rc;
}

tide_status tide_mlp_alloc_buffers(const tide_mlp_t *m, const tide_layout_t *new_l, int32_t worker,
                                   void ***bufs_out)
{
    tide_status rc = TIDE_OK;
    *bufs_out = NULL;
    int p = 0, d = 0, t = 0, found = 0;
    TIDE_CHECK(check_layout(m, new_l));
    TIDE_CHECK(coord_of(new_l, worker, &p, &d, &t, &found));
    void **bufs = tide_calloc(m->ntensors, sizeof *bufs);
    if (bufs == NULL)
        return tide_errorf(TIDE_ERR_NOMEM, "out of memory for the buffer table");
    for (size_t i = 0; found && i < m->ntensors; i++)
        TIDE_CHECK_GOTO(m->ops->alloc(tide_shard_bytes(new_l, m->coll, i, p, d, t), &bufs[i]), rc,
                        fail);
    *bufs_out = bufs;
    return TIDE_OK;
fail:
    tide_mlp_free_buffers(m, &bufs);
    return rc;
}

void tide_mlp_free_buffers(const tide_mlp_t *m, void ***bufs_p)
{
    if (bufs_p == NULL || *bufs_p == NULL)
        return;
    for (size_t i = 0; i < m->ntensors; i++)
        m->ops->release((*bufs_p)[i]);
    tide_free(*bufs_p);
    *bufs_p = NULL;
}

void tide_mlp_garbage_free(tide_mlp_garbage **g_p)
{
    if (g_p == NULL || *g_p == NULL)
        return;
    tide_mlp_garbage *g = *g_p;
    for (size_t i = 0; i < g->n; i++)
        g->ops->release(g->p[i]);
    tide_free(g->p);
    tide_free(g);
    *g_p = NULL;
}

tide_status tide_mlp_adopt(tide_mlp_t *m, const tide_layout_t *new_l, int32_t worker,
                           void ***bufs_p)
{
    return tide_mlp_adopt_defer(m, new_l, worker, bufs_p, NULL);
}

static tide_status adopt(tide_mlp_t *m, const tide_layout_t *new_l, int32_t worker, void **bufs,
                         tide_mlp_garbage **garbage, int borrowed);

tide_status tide_mlp_adopt_defer(tide_mlp_t *m, const tide_layout_t *new_l, int32_t worker,
                                 void ***bufs_p, tide_mlp_garbage **garbage)
{
    TIDE_CHECK(adopt(m, new_l, worker, *bufs_p, garbage, 0));
    tide_free(*bufs_p);
    *bufs_p = NULL;
    return TIDE_OK;
}

tide_status tide_mlp_adopt_borrowed(tide_mlp_t *m, const tide_layout_t *new_l, int32_t worker,
                                    void *const *bufs)
{
    void **copy = tide_calloc(m->ntensors ? m->ntensors : 1, sizeof *copy);
    if (copy == NULL)
        return tide_errorf(TIDE_ERR_NOMEM, "out of memory for the buffer table");
    if (bufs != NULL)
        memcpy(copy, bufs, m->ntensors * sizeof *copy);
    tide_status rc = adopt(m, new_l, worker, copy, NULL, 1);
    tide_free(copy);
    return rc;
}

static tide_status adopt(tide_mlp_t *m, const tide_layout_t *new_l, int32_t worker, void **bufs,
                         tide_mlp_garbage **garbage, int borrowed)
{
    tide_mlp_garbage *g = NULL;
    if (garbage != NULL) {
        *garbage = NULL;
        g = tide_calloc(1, sizeof *g);
        if (g != NULL)
            g->p = tide_calloc(m->ntensors + 3, sizeof *g->p);
        if (g == NULL || g->p == NULL) {
            tide_free(g);
            return tide_errorf(TIDE_ERR_NOMEM, "out of memory for the old buffer list");
        }
        g->ops = m->ops;
        g->cap = m->ntensors + 3;
    }
    tide_mlp_t next;
    memset(&next, 0, sizeof next);
    next.grads_ready = -1; /* the new layout's buffers hold no gradients */
    next.cfg = m->cfg;
    next.coll = m->coll;
    next.ops = m->ops;
    next.ntensors = m->ntensors;
    next.nparams = m->nparams;
    next.params = tide_calloc(m->nparams ? m->nparams : 1, sizeof *next.params);
    if (next.params == NULL) {
        tide_mlp_garbage_free(&g);
        return tide_errorf(TIDE_ERR_NOMEM, "out of memory for the parameter table");
    }
    for (size_t k = 0; k < m->nparams; k++)
        next.params[k].index = m->params[k].index;
    next.borrowed = borrowed;
    tide_status rc = setup(&next, new_l, worker, bufs);
    if (rc == TIDE_OK && next.active)
        rc = load_counters(&next);
    if (rc != TIDE_OK) {
        if (next.buf != NULL) /* the caller keeps its buffers */
            memset(next.buf, 0, m->ntensors * sizeof *next.buf);
        teardown(&next);
        tide_free(next.params);
        tide_mlp_garbage_free(&g);
        return rc;
    }
    teardown_into(m, g);
    if (garbage != NULL)
        *garbage = g;
    tide_free(m->params);
    void *stage = m->stage;
    size_t stage_bytes = m->stage_bytes;
    *m = next;
    m->stage = stage;
    m->stage_bytes = stage_bytes;
    return TIDE_OK;
}

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

/* Pipeline exchange (see tide_mlp_comm.exchange); sides with peer 0 are skipped. */
static tide_status exchange(tide_mlp_t *m, const tide_mlp_comm *comm, int send_peer,
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
        TIDE_CHECK(exchange(m, comm, 0, NULL, prev, sl->act[0].x));
        TIDE_CHECK(fwd(m, comm, f, loss_sum));
        TIDE_CHECK(exchange(m, comm, next, sl->out, 0, NULL));
    }
    if (rest > 0)
        TIDE_CHECK(exchange(m, comm, 0, NULL, prev, m->slots[f % m->nslots].act[0].x));
    for (int i = 0; i < rest; i++, f++, b++) {
        mlp_slot *sl = &m->slots[f % m->nslots];
        TIDE_CHECK(fwd(m, comm, f, loss_sum));
        TIDE_CHECK(exchange(m, comm, next, sl->out, next, m->s_d0));
        TIDE_CHECK(bwd(m, comm, b, &gx));
        if (i + 1 == rest)
            TIDE_CHECK(exchange(m, comm, prev, gx, 0, NULL));
        else
            TIDE_CHECK(exchange(m, comm, prev, gx, prev, m->slots[(f + 1) % m->nslots].act[0].x));
    }
    for (int i = 0; i < warm; i++, b++) {
        TIDE_CHECK(exchange(m, comm, 0, NULL, next, m->s_d0));
        TIDE_CHECK(bwd(m, comm, b, &gx));
        TIDE_CHECK(exchange(m, comm, prev, gx, 0, NULL));
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
    TIDE_CHECK(store_counters(m));
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
