/*
 * proto <-> reshard: proto's layout, tensor and fit-rule structs to and from reshard's
 * tide_layout_t, tide_collection_t and tide_fit_rule, the one copy of each conversion for
 * whoever encodes or decodes them (tided's state, the checkpoint manifest, joins). Pure;
 * any thread on distinct objects.
 */
#ifndef TIDE_PROTO_RESHARD_H
#define TIDE_PROTO_RESHARD_H

#include <stdint.h>

#include <tide/status.h>
#include "proto/proto.h"
#include "reshard/reshard.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Fills *out with l's shape and generation gen; its stages and workers point into l
   (borrowed: valid while l is and unchanged). Never fails. */
void tide_proto_layout_from(tide_proto_layout_t *out, const tide_layout_t *l, uint64_t gen);

/* A new layout with pl's shape, stages and workers, checked alone (tide_layout_validate
   without a collection); TIDE_ERR_INVALID naming the broken rule. Caller owns *out. */
tide_status tide_proto_layout_to(const tide_proto_layout_t *pl, tide_layout_t **out);

/* c's tensors, in order, as a tide_malloc'd array of *n (caller frees; NULL when c has none);
   TIDE_ERR_RANGE beyond TIDE_PROTO_TENSORS_MAX, TIDE_ERR_NOMEM. */
tide_status tide_proto_tensors_from(const tide_collection_t *c, tide_proto_tensor_t **out,
                                    uint32_t *n);

/* A new collection of num_layers layers holding t[0, n) in order; the collection's own
   checks (tide_collection_add) name the first tensor they refuse. Caller owns *out. */
tide_status tide_proto_tensors_to(const tide_proto_tensor_t *t, uint32_t n, int num_layers,
                                  tide_collection_t **out);

/* n rules of r into out (room for n). Never fails. */
void tide_proto_fit_from(tide_proto_fit_t *out, const tide_fit_rule *r, uint32_t n);

/* n rules of f into out (room for n; n <= TIDE_FIT_RULES_MAX). Never fails. */
void tide_proto_fit_to(tide_fit_rule *out, const tide_proto_fit_t *f, uint32_t n);

#ifdef __cplusplus
}
#endif

#endif /* TIDE_PROTO_RESHARD_H */
