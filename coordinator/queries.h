/*
 * coordinator/queries: what tidectl and libtide read: status pages, jobs, events and
 * offline attempts' logs (queries.c). Event-loop thread only; nothing here changes state.
 */
#ifndef TIDE_COORD_QUERIES_H
#define TIDE_COORD_QUERIES_H

#include "coordinator/loop.h"

/* "status": one page of the worker table (or of one job's workers), with coordinates. */
void tide__on_status(tide_server_t *s, const tide_msg_t *m, const void *raw, size_t len);

/* "jobs": every job's row (at most a message's worth). */
void tide__on_jobs(tide_server_t *s, const tide_msg_t *m, const void *raw, size_t len);

/* "events": the event history from an id or a time. */
void tide__on_events(tide_server_t *s, const tide_msg_t *m, const void *raw, size_t len);

/* "logs": the reports of an offline job's attempts. */
void tide__on_logs(tide_server_t *s, const tide_msg_t *m, const void *raw, size_t len);

#endif /* TIDE_COORD_QUERIES_H */
