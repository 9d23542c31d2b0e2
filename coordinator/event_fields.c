/*
 * coordinator/event_fields: the typed fields of tided's events (see event_fields.h).
 */
#include <string.h>

#include "coordinator/event_fields.h"

void tide_event_fields_init(tide_proto_event_fields_t *f)
{
    memset(f, 0, sizeof *f);
    f->step = -1;
}

void tide_event_fields_layout(tide_proto_event_fields_t *f, const tide_layout_t *to,
                              const tide_layout_t *ids, const tide_layout_t *from)
{
    if (to != NULL) {
        f->dp = to->dp;
        f->tp = to->tp;
        f->pp = to->pp;
    }
    if (ids != NULL && to != NULL && tide_layout_size(ids) == tide_layout_size(to)) {
        f->workers = ids->worker;
        f->n_workers = (uint32_t)tide_layout_size(ids);
    }
    if (from != NULL) {
        f->from_dp = from->dp;
        f->from_tp = from->tp;
        f->from_pp = from->pp;
    }
}

void tide_event_fields_worker(tide_proto_event_fields_t *f, const int32_t *id,
                              const tide_coord_worker_t *w)
{
    f->workers = (int32_t *)id; /* the encoder only reads it */
    f->n_workers = 1;
    if (w != NULL) {
        size_t i = 0;
        /* a host name is printable ASCII without spaces (proto's host charset) */
        for (; w->host[i] != '\0' && i < sizeof f->host - 1; i++)
            f->host[i] = w->host[i] > ' ' && w->host[i] < 0x7f ? w->host[i] : '?';
        f->host[i] = '\0';
    }
}

void tide_event_fields_reason(tide_proto_event_fields_t *f, const char *why)
{
    size_t i = 0;
    for (; why != NULL && why[i] != '\0' && i < sizeof f->reason - 1; i++)
        f->reason[i] = why[i] >= ' ' && why[i] < 0x7f ? why[i] : '?';
    f->reason[i] = '\0';
}
