/*
 * coordinator/page: the live cluster page tided serves beside /metrics (page.c, page.html).
 * Event-loop thread only.
 */
#ifndef TIDE_COORD_PAGE_H
#define TIDE_COORD_PAGE_H

#include <stddef.h>

#include "coordinator/loop.h"

/* page.html, embedded at build time (page_html.c, generated): static storage. */
extern const unsigned char tide__page_html[];
extern const size_t tide__page_html_len;

/* GET /api/cluster's JSON into *out (tide_malloc'd, caller frees; *len bytes, NUL after):
 * the workers (at most 4096; gpus_total says how many), the jobs and the newest events, as
 * tidectl status, jobs and events --json print them. No key, token or endpoint in it. */
tide_status tide__page_cluster_json(tide_server_t *s, char **out, size_t *len);

#endif /* TIDE_COORD_PAGE_H */
