/*
 * coordinator/page: the live cluster page served on the metrics address. GET / is
 * page.html (embedded at build time, see CMakeLists.txt), which polls GET /api/cluster:
 * one JSON document made of the very replies tidectl status, jobs and events get
 * (queries.c builds them, tidectl's printers write them), so the page and tidectl never
 * disagree. Event-loop thread only.
 */
/* open_memstream: POSIX 2008 (the build defines _GNU_SOURCE) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "core/version.h"
#include "coordinator/page.h"
#include "coordinator/queries.h"
#include "coordinator/tidectl.h"

#define PAGE_GPUS   4096 /* GPUs drawn at most; the document says how many there are */
#define PAGE_EVENTS 40   /* newest events listed */

/* The document's three parts into f; the rows are freed here. */
static tide_status write_cluster(tide_server_t *s, FILE *f)
{
    tide_proto_status_t q;
    memset(&q, 0, sizeof q);
    q.limit = PAGE_GPUS;
    tide_proto_status_reply_t st;
    memset(&st, 0, sizeof st);
    tide_status rc = tide__status_page(s, &q, &st);
    if (rc != TIDE_OK)
        return rc;
    /* the page has no authentication: workers' rendezvous address is nobody's business */
    st.ompi_server[0] = '\0';
    tide_proto_jobs_reply_t jobs;
    memset(&jobs, 0, sizeof jobs);
    rc = tide__jobs_rows(s, &jobs);
    if (rc != TIDE_OK) {
        tide_free(st.rows);
        return rc;
    }
    tide_proto_events_t eq;
    memset(&eq, 0, sizeof eq);
    eq.limit = PAGE_EVENTS;
    eq.newest = 1;
    tide_proto_events_reply_t evr;
    memset(&evr, 0, sizeof evr);
    tide_store_event_t *ev = NULL;
    size_t n_ev = 0;
    rc = tide__event_rows(s, &eq, &evr, &ev, &n_ev);
    if (rc != TIDE_OK) {
        tide_free(st.rows);
        tide_free(jobs.rows);
        return rc;
    }
    fputs("{\"version\":", f);
    tidectl_json_str(f, tide_build_version());
    fprintf(f, ",\"gpus_total\":%u,\"status\":", st.total);
    tidectl_print_status(f, &st, TIDECTL_JSON); /* its newlines are JSON whitespace */
    fputs(",\"jobs\":", f);
    tidectl_print_jobs(f, &jobs, 1);
    fputs(",\"events\":[", f);
    for (uint32_t i = 0; i < evr.n_rows; i++) {
        /* tidectl prints events as JSON lines; the page wants them as one array */
        tide_proto_events_reply_t one = evr;
        one.rows = &evr.rows[i];
        one.n_rows = 1;
        if (i)
            fputc(',', f);
        tidectl_print_events(f, &one, 1);
    }
    fputs("]}\n", f);
    tide_free(st.rows);
    tide_free(jobs.rows);
    tide_free(evr.rows);
    tide_store_events_free(&ev, n_ev);
    return TIDE_OK;
}

tide_status tide__page_cluster_json(tide_server_t *s, char **out, size_t *len)
{
    char *buf = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&buf, &n);
    if (f == NULL)
        return tide_errorf(TIDE_ERR_NOMEM, "out of memory rendering the cluster page");
    tide_status rc = write_cluster(s, f);
    int bad = ferror(f);
    fclose(f);
    if (rc == TIDE_OK && bad)
        rc = tide_errorf(TIDE_ERR_NOMEM, "out of memory rendering the cluster page");
    if (rc != TIDE_OK) {
        free(buf); /* open_memstream's buffer comes from malloc */
        return rc;
    }
    /* the HTTP layer frees with tide_free: hand it a copy from tide's allocator */
    char *copy = tide_malloc(n + 1);
    if (copy == NULL) {
        free(buf);
        return tide_errorf(TIDE_ERR_NOMEM, "out of memory rendering the cluster page");
    }
    memcpy(copy, buf, n + 1);
    free(buf);
    *out = copy;
    *len = n;
    return TIDE_OK;
}
