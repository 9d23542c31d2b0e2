/*
 * The train_mlp model's configuration and tensor collection: defaults and checks of
 * tide_mlp_config, the device name, and the collection (each parameter followed by its
 * two Adam moments, then the step and data counters) that reshard/reshard.h shards.
 *
 * Called by the program and the tests before a model exists (to parse flags, to build
 * the collection a layout is planned against) and by tide_mlp_new; calls nothing else
 * in examples/. No state of their own; any thread.
 */
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "core/error.h"
#include "examples/mlp_int.h"

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
