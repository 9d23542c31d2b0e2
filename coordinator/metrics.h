/*
 * coordinator/metrics: Prometheus text exposition over a minimal HTTP/1.0 listener
 * (--metrics HOST:PORT), a poll source of tided's loop (metrics.c). Event-loop thread.
 */
#ifndef TIDE_COORD_METRICS_H
#define TIDE_COORD_METRICS_H

#include "coordinator/loop.h"

/* Opens the listener on "HOST:PORT" (s->metrics) and registers it with the loop. */
tide_status tide__metrics_open(tide_server_t *s, const char *addr);

/* Renders the Prometheus text into a tide_malloc'd string (caller frees *out). */
tide_status tide__metrics_render(tide_server_t *s, char **out, size_t *len);

/* Closes the listener and its clients; frees s->metrics (NULL is fine). */
void tide__metrics_close(tide_server_t *s);

/* Counts a committed resize of dur ns in the duration histogram's bucket. Loop thread. */
void tide__metrics_resize_observe(tide_coord_counters *c, uint64_t dur_ns);

#endif /* TIDE_COORD_METRICS_H */
