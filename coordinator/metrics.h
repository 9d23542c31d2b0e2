/*
 * coordinator/metrics: the Prometheus text exposition (metrics.c), served by http.c on
 * --metrics HOST:PORT. Event-loop thread.
 */
#ifndef TIDE_COORD_METRICS_H
#define TIDE_COORD_METRICS_H

#include "coordinator/loop.h"

/* Renders the Prometheus text into a tide_malloc'd string (caller frees *out). */
tide_status tide__metrics_render(tide_server_t *s, char **out, size_t *len);

/* Counts a committed resize of dur ns in the duration histogram's bucket. Loop thread. */
void tide__metrics_resize_observe(tide_coord_counters *c, uint64_t dur_ns);

#endif /* TIDE_COORD_METRICS_H */
