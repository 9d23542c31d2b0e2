/*
 * coordinator/queries: what tidectl and libtide read: status pages, jobs, events and
 * offline attempts' logs (queries.c). Event-loop thread only; nothing here changes state.
 */
#ifndef TIDE_COORD_QUERIES_H
#define TIDE_COORD_QUERIES_H

#include "coordinator/loop.h"
#include "coordinator/store.h"

/* The status reply q asks for into *out (out->rows: caller frees with tide_free); fails
 * NOT_FOUND for an unknown job, NOMEM. Shared by tidectl status and the cluster page. */
tide_status tide__status_page(tide_server_t *s, const tide_proto_status_t *q,
                              tide_proto_status_reply_t *out);

/* Every job's row (at most a message's worth) into *out (out->rows: caller frees). */
tide_status tide__jobs_rows(tide_server_t *s, tide_proto_jobs_reply_t *out);

/* The events q asks for into *out; out->rows borrow typed fields from *ev, so the caller
 * frees out->rows with tide_free, then *ev with tide_store_events_free(ev, *n). */
tide_status tide__event_rows(tide_server_t *s, const tide_proto_events_t *q,
                             tide_proto_events_reply_t *out, tide_store_event_t **ev, size_t *n);

/* "status": one page of the worker table (or of one job's workers), with coordinates. */
void tide__on_status(tide_server_t *s, const tide_msg_t *m, const void *raw, size_t len);

/* "jobs": every job's row (at most a message's worth). */
void tide__on_jobs(tide_server_t *s, const tide_msg_t *m, const void *raw, size_t len);

/* "events": the event history from an id or a time. */
void tide__on_events(tide_server_t *s, const tide_msg_t *m, const void *raw, size_t len);

/* "logs": the reports of an offline job's attempts. */
void tide__on_logs(tide_server_t *s, const tide_msg_t *m, const void *raw, size_t len);

#endif /* TIDE_COORD_QUERIES_H */
