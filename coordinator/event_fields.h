/*
 * coordinator/event_fields: fills the typed fields of an event (proto.h's
 * tide_proto_event_fields_t) from tided's structures, for tide__event_f. Pure functions:
 * no socket, no store; any thread.
 */
#ifndef TIDE_COORD_EVENT_FIELDS_H
#define TIDE_COORD_EVENT_FIELDS_H

#include <stdint.h>

#include "coordinator/state.h"
#include "proto/proto.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Empties f: no generation, layout, workers, step or reason. */
void tide_event_fields_init(tide_proto_event_fields_t *f);

/* Sets f's layout after (to) and before (from; either may be NULL): degrees, and the
   workers as ids's map in coordinate order: to with tided's worker ids in place of job
   ranks (tide__layout_worker_ids; NULL: no workers). f borrows ids's map: use f while ids
   lives. */
void tide_event_fields_layout(tide_proto_event_fields_t *f, const tide_layout_t *to,
                              const tide_layout_t *ids, const tide_layout_t *from);

/* Sets f's one worker (*id, borrowed: keep it alive while f is used) and w's host. */
void tide_event_fields_worker(tide_proto_event_fields_t *f, const int32_t *id,
                              const tide_coord_worker_t *w);

/* Copies why into f's reason as one printable ASCII line (others become '?', a longer
   text is cut at TIDE_PROTO_REASON_MAX chars). */
void tide_event_fields_reason(tide_proto_event_fields_t *f, const char *why);

#ifdef __cplusplus
}
#endif

#endif /* TIDE_COORD_EVENT_FIELDS_H */
