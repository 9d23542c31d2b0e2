/*
 * The train_mlp model's state: the per-worker buffers of the collection tensors in
 * reshard shard geometry, the gradient arena, the views of one stage's layers and the
 * activations of the micro-batches in flight; its lifecycle (new, init, destroy), the
 * access to single tensors, and the adoption of a new layout's buffers after a reshard.
 * This is the file to read for what makes the model elastic; the collection is in
 * mlp_config.c, the pieces of the pass in mlp_pieces.c, the 1F1B step in
 * mlp_schedule.c.
 *
 * Called by the program, mlp_mpi.c and mlp_tide.c (reshard), mlp_ckpt.c (checkpoints)
 * and the tests, from the main thread. Memory per worker: its state (parameters, two
 * moments, one gradient per local parameter) plus the activations of at most
 * min(micro-batches, pp - stage) micro-batches in flight.
 */
#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "core/log.h"
#include "examples/mlp_int.h"

#define SUBSYS "mlp"

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

/* Frees everything that depends on the layout (keeps cfg, coll, ops, the params table);
 * the big buffers go to g when not NULL. */
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

/* Setup, phase 1: where worker sits in l and the sizes of its shard of the model. */
static void setup_geometry(tide_mlp_t *m, const tide_layout_t *l)
{
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
}

/* Setup, phase 2: each tensor's local buffer, adopted from bufs or allocated zero-filled. */
static tide_status setup_tensors(tide_mlp_t *m, const tide_layout_t *l, void **bufs)
{
    for (size_t i = 0; i < m->ntensors; i++) {
        m->bytes[i] = tide_shard_bytes(l, m->coll, i, m->p, m->d, m->t);
        if (bufs != NULL) {
            m->buf[i] = bufs[i];
            if ((bufs[i] == NULL) != (m->bytes[i] == 0))
                return tide_errorf(TIDE_ERR_INVALID,
                                   "adopted buffer of %s does not match the layout",
                                   tide_collection_tensor(m->coll, i)->name);
        } else {
            TIDE_CHECK(m->ops->alloc(m->bytes[i], &m->buf[i]));
        }
    }
    return TIDE_OK;
}

/* Setup, phase 3: the gradients, one arena so that the dp allreduce is one call. */
static tide_status setup_grads(tide_mlp_t *m, const tide_layout_t *l)
{
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
    TIDE_CHECK(m->ops->alloc((size_t)total * sizeof(float), &g));
    m->grads = g;
    float *cur = m->grads;
    for (size_t k = 0; k < m->nparams; k++)
        m->params[k].grad = m->params[k].n ? take(&cur, m->params[k].n) : NULL;
    return TIDE_OK;
}

/* Setup, phase 4: the named views into the parameter and gradient buffers. */
static tide_status setup_views(tide_mlp_t *m)
{
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
    return TIDE_OK;
}

/* Setup, phase 5: the activations of the micro-batches in flight (1F1B keeps at most
 * pp - p), one arena cut into slots. */
static tide_status setup_slots(tide_mlp_t *m, const tide_layout_t *l)
{
    const int64_t n = m->n, h = m->h, ft = m->ft, vt = m->vt;
    m->nslots = m->micro < l->pp - m->p ? m->micro : l->pp - m->p;
    int64_t per_layer = 2 * n * h + 2 * n + 2 * n * ft;
    int64_t per_slot = 2 * n /* tok, tgt (int32 stored in f32 slots) */ +
                       (int64_t)m->nlayers * per_layer + n * h +
                       (m->last ? n * h + 2 * n + n * vt : 0);
    void *arena = NULL;
    TIDE_CHECK(m->ops->alloc((size_t)(per_slot * m->nslots) * sizeof(float), &arena));
    m->slot_arena = arena;
    m->slots = tide_calloc((size_t)m->nslots, sizeof *m->slots);
    if (m->slots == NULL)
        return tide_errorf(TIDE_ERR_NOMEM, "out of memory for pipeline slots");
    float *cur = m->slot_arena;
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
    return TIDE_OK;
}

/* Setup, phase 6: the step's scratch (the f64 loss cell first so that it is 8-byte
 * aligned) and the host copies of a batch. */
static tide_status setup_scratch(tide_mlp_t *m)
{
    const int64_t n = m->n, h = m->h, ft = m->ft;
    int64_t scratch = 2 /* f64 loss */ + 4 * n * h + n * ft + 3 * n + n;
    void *arena = NULL;
    TIDE_CHECK(m->ops->alloc((size_t)scratch * sizeof(float), &arena));
    m->scratch = arena;
    float *cur = arena;
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

/*
 * Sets up m (torn down or fresh) for worker in l, adopting bufs (collection-sized array
 * of local buffers; NULL: allocate zero-filled ones). On failure the caller tears down;
 * entries of bufs stay the caller's until success (m->buf copies the pointers, and
 * tide_mlp_adopt clears them before tearing a failed setup down). A worker outside l
 * gets the tensor table only (inactive).
 */
static tide_status setup(tide_mlp_t *m, const tide_layout_t *l, int32_t worker, void **bufs)
{
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
    setup_geometry(m, l);
    TIDE_CHECK(setup_tensors(m, l, bufs));
    TIDE_CHECK(setup_grads(m, l));
    TIDE_CHECK(setup_views(m));
    TIDE_CHECK(setup_slots(m, l));
    return setup_scratch(m);
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

tide_status tide__mlp_store_counters(tide_mlp_t *m)
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
    TIDE_CHECK_GOTO(tide__mlp_store_counters(m), rc, out);
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
