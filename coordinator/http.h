/*
 * coordinator/http: the HTTP listener of --metrics HOST:PORT (http.c): /metrics, and the
 * live cluster page (/ and /api/cluster). A poll source of tided's loop; loop thread.
 */
#ifndef TIDE_COORD_HTTP_H
#define TIDE_COORD_HTTP_H

#include "coordinator/loop.h"

/* Opens the listener on "HOST:PORT" (s->metrics) and registers it with the loop. */
tide_status tide__http_open(tide_server_t *s, const char *addr);

/* Closes the listener and its clients; frees s->metrics (NULL is fine). */
void tide__http_close(tide_server_t *s);

#endif /* TIDE_COORD_HTTP_H */
