/*
 * proto <-> reshard conversions (proto_reshard.h). Field by field, no encoding: the bytes
 * on a wire or a disk are the codec's business alone (proto_encode.c, proto_decode.c).
 * Workload: one conversion per stored or loaded layout, join or checkpoint manifest.
 */
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "proto/proto_reshard.h"

_Static_assert(TIDE_PROTO_TENSOR_NAME_MAX + 1 == TIDE_NAME_MAX &&
                   TIDE_PROTO_DIMS_MAX == TIDE_MAX_DIMS,
               "a proto tensor holds every tensor name and shape reshard takes");
_Static_assert(TIDE_PROTO_FIT_MAX == TIDE_FIT_RULES_MAX &&
                   TIDE_PROTO_FIT_WHAT_MAX + 1 == TIDE_FIT_WHAT_MAX,
               "proto carries every fit rule reshard takes");

void tide_proto_layout_from(tide_proto_layout_t *out, const tide_layout_t *l, uint64_t gen)
{
    out->gen = gen;
    out->dp = l->dp;
    out->tp = l->tp;
    out->pp = l->pp;
    out->num_layers = l->num_layers;
    out->micro_batches = l->micro_batches;
    out->stage_start = l->stage_start;
    out->worker = l->worker;
}

tide_status tide_proto_layout_to(const tide_proto_layout_t *pl, tide_layout_t **out)
{
    *out = NULL;
    tide_layout_t *l = NULL;
    TIDE_CHECK(tide_layout_new(&l, pl->dp, pl->tp, pl->pp, pl->num_layers, pl->micro_batches));
    tide_status rc = tide_layout_set_stages(l, pl->stage_start);
    if (rc == TIDE_OK) {
        memcpy(l->worker, pl->worker, tide_layout_size(l) * sizeof *l->worker);
        rc = tide_layout_validate(l, NULL);
    }
    if (rc != TIDE_OK) {
        tide_layout_destroy(&l);
        return rc;
    }
    *out = l;
    return TIDE_OK;
}

tide_status tide_proto_tensors_from(const tide_collection_t *c, tide_proto_tensor_t **out,
                                    uint32_t *n)
{
    *out = NULL;
    *n = 0;
    size_t count = tide_collection_size(c);
    if (count > TIDE_PROTO_TENSORS_MAX)
        return tide_errorf(TIDE_ERR_RANGE, "the collection has %zu tensors; proto carries %u",
                           count, TIDE_PROTO_TENSORS_MAX);
    if (count == 0)
        return TIDE_OK;
    tide_proto_tensor_t *ts = tide_calloc(count, sizeof *ts);
    if (ts == NULL)
        return tide_errorf(TIDE_ERR_NOMEM, "out of memory describing %zu tensors", count);
    for (size_t i = 0; i < count; i++) {
        const tide_tensor_desc *d = tide_collection_tensor(c, i);
        memcpy(ts[i].name, d->name, sizeof ts[i].name); /* NUL-terminated, zero-padded */
        ts[i].dtype = (int)d->dtype;
        ts[i].ndim = d->ndim;
        memcpy(ts[i].shape, d->shape, sizeof ts[i].shape);
        ts[i].layer = d->layer;
        ts[i].tp = (int)d->tp;
        ts[i].tp_dim = d->tp == TIDE_TP_SPLIT ? d->tp_dim : 0;
        ts[i].tp_segments = d->tp_segments;
        ts[i].dp = (int)d->dp;
    }
    *out = ts;
    *n = (uint32_t)count;
    return TIDE_OK;
}

tide_status tide_proto_tensors_to(const tide_proto_tensor_t *t, uint32_t n, int num_layers,
                                  tide_collection_t **out)
{
    *out = NULL;
    tide_collection_t *c = NULL;
    TIDE_CHECK(tide_collection_new(&c, num_layers));
    for (uint32_t i = 0; i < n; i++) {
        tide_tensor_desc d;
        memset(&d, 0, sizeof d);
        memcpy(d.name, t[i].name, sizeof d.name);
        d.dtype = (tide_dtype)t[i].dtype;
        d.ndim = t[i].ndim;
        memcpy(d.shape, t[i].shape, sizeof d.shape);
        d.layer = t[i].layer;
        d.tp = (tide_tp_rule)t[i].tp;
        d.tp_dim = t[i].tp_dim;
        d.tp_segments = t[i].tp_segments;
        d.dp = (tide_dp_rule)t[i].dp;
        tide_status rc = tide_collection_add(c, &d); /* its detail names the tensor */
        if (rc != TIDE_OK) {
            tide_collection_destroy(&c);
            return rc;
        }
    }
    *out = c;
    return TIDE_OK;
}

void tide_proto_fit_from(tide_proto_fit_t *out, const tide_fit_rule *r, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++) {
        out[i].degree = (int)r[i].degree;
        out[i].n = r[i].n;
        memcpy(out[i].what, r[i].what, sizeof out[i].what);
    }
}

void tide_proto_fit_to(tide_fit_rule *out, const tide_proto_fit_t *f, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++) {
        memset(&out[i], 0, sizeof out[i]);
        out[i].degree = (tide_degree)f[i].degree;
        out[i].n = f[i].n;
        memcpy(out[i].what, f[i].what, sizeof out[i].what);
    }
}
