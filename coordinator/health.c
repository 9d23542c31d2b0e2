/*
 * coordinator/health: the state file's health and the journal of writes not on it yet
 * (health.h). A few entries per batch while healthy (cleared at each commit); while
 * degraded up to TIDE__JOURNAL_MAX, the oldest dropped first and counted.
 */
#include "coordinator/health.h"

#include <fnmatch.h>
#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "core/log.h"
#include "coordinator/allocs.h"
#include "coordinator/event_fields.h"

void tide__health_init(tide__health *h)
{
    memset(h, 0, sizeof *h);
}

static void entry_free(tide__jentry *e)
{
    tide_free(e->ev.fields.workers);
    tide_free(e->att);
    memset(e, 0, sizeof *e);
}

static tide__jentry *at(const tide__health *h, size_t i)
{
    return &h->j[(h->head + i) % h->cap];
}

void tide__health_committed(tide__health *h)
{
    for (size_t i = 0; i < h->n; i++)
        entry_free(at(h, i));
    h->head = 0;
    h->n = 0;
}

void tide__health_clear(tide__health *h)
{
    tide__health_committed(h);
    tide_free(h->j);
    memset(h, 0, sizeof *h);
}

/* A fresh slot at the journal's end; when full, the oldest entry makes room (counted).
   NULL only when memory for the journal itself cannot be had. */
static tide__jentry *push(tide__health *h)
{
    if (h->n == h->cap && h->cap < TIDE__JOURNAL_MAX) {
        size_t cap = h->cap ? h->cap * 2 : 64;
        tide__jentry *j = tide_calloc(cap, sizeof *j);
        if (j == NULL) {
            TIDE_WARN_LIMITED("store", "out of memory holding a write for the state file");
            return NULL;
        }
        for (size_t i = 0; i < h->n; i++)
            j[i] = *at(h, i);
        tide_free(h->j);
        h->j = j;
        h->cap = cap;
        h->head = 0;
    }
    if (h->n == h->cap) {
        entry_free(at(h, 0));
        h->head = (h->head + 1) % h->cap;
        h->n--;
        h->dropped++;
    }
    tide__jentry *e = at(h, h->n++);
    memset(e, 0, sizeof *e);
    return e;
}

void tide__health_event(tide__health *h, int64_t time_ms, const char *job, const char *kind,
                        const tide_proto_event_fields_t *f, const char *detail)
{
    tide__jentry *e = push(h);
    if (e == NULL)
        return;
    e->kind = TIDE__J_EVENT;
    e->ev.time_ms = time_ms;
    snprintf(e->ev.job, sizeof e->ev.job, "%s", job ? job : "");
    snprintf(e->ev.kind, sizeof e->ev.kind, "%s", kind);
    snprintf(e->ev.detail, sizeof e->ev.detail, "%s", detail);
    tide_event_fields_init(&e->ev.fields);
    if (f == NULL)
        return;
    e->has_fields = 1;
    e->ev.fields = *f;
    e->ev.fields.workers = NULL;
    e->ev.fields.n_workers = 0;
    if (f->n_workers > 0) {
        e->ev.fields.workers = tide_malloc(f->n_workers * sizeof *f->workers);
        if (e->ev.fields.workers != NULL) { /* without them the sentence still says who */
            memcpy(e->ev.fields.workers, f->workers, f->n_workers * sizeof *f->workers);
            e->ev.fields.n_workers = f->n_workers;
        }
    }
}

void tide__health_attempt(tide__health *h, const tide_store_attempt_t *a)
{
    tide_store_attempt_t *copy = tide_malloc(sizeof *copy);
    tide__jentry *e = copy != NULL ? push(h) : NULL;
    if (e == NULL) {
        tide_free(copy);
        return;
    }
    *copy = *a;
    e->kind = TIDE__J_ATTEMPT;
    e->att = copy;
}

void tide__health_alloc(tide__health *h, const char *pool, const tide_proto_alloc_t *a)
{
    tide__jentry *e = push(h);
    if (e == NULL)
        return;
    e->kind = a != NULL ? TIDE__J_ALLOC : TIDE__J_ALLOC_DEL;
    snprintf(e->pool, sizeof e->pool, "%s", pool);
    if (a != NULL)
        e->alloc = *a;
}

tide_status tide__health_replay(const tide__health *h, tide_store_t *store)
{
    for (size_t i = 0; i < h->n; i++) {
        const tide__jentry *e = at(h, i);
        switch (e->kind) {
        case TIDE__J_EVENT: {
            const tide_proto_event_fields_t *f = e->has_fields ? &e->ev.fields : NULL;
            TIDE_CHECK(tide_store_event_fields(store, e->ev.time_ms, e->ev.job, e->ev.kind, f,
                                               e->ev.detail));
            break;
        }
        case TIDE__J_ATTEMPT:
            TIDE_CHECK(tide_store_put_attempt(store, e->att));
            break;
        case TIDE__J_ALLOC:
            TIDE_CHECK(tide_store_put_alloc(store, e->pool, &e->alloc));
            break;
        case TIDE__J_ALLOC_DEL:
            TIDE_CHECK(tide_store_del_alloc(store, e->pool));
            break;
        }
    }
    return TIDE_OK;
}

int tide__health_failed(tide__health *h, const char *why, uint64_t now_ns, int64_t now_ms)
{
    snprintf(h->why, sizeof h->why, "%s", why);
    h->retry_ns = now_ns + TIDE__RETRY_NS;
    if (h->degraded) {
        h->tries++;
        return 0;
    }
    h->degraded = 1;
    h->since_ns = now_ns;
    h->since_ms = now_ms;
    h->tries = 0;
    h->dropped = 0;
    h->episodes++;
    return 1;
}

void tide__health_restored(tide__health *h)
{
    h->degraded = 0;
    h->why[0] = '\0';
    h->retry_ns = 0;
    h->tries = 0;
}

static int selects(const tide_store_event_query_t *q, const tide_store_event_t *ev)
{
    if (ev->time_ms < q->since_ms || (q->until_ms != 0 && ev->time_ms >= q->until_ms))
        return 0;
    if (q->job != NULL && q->job[0] != '\0' && strcmp(q->job, ev->job) != 0)
        return 0;
    return q->kind == NULL || q->kind[0] == '\0' || fnmatch(q->kind, ev->kind, 0) == 0;
}

tide_status tide__health_events(const tide__health *h, const tide_store_event_query_t *q,
                                tide_store_event_t **rows, size_t *n)
{
    for (size_t i = 0; i < h->n; i++) {
        const tide__jentry *e = at(h, i);
        if (e->kind != TIDE__J_EVENT || !selects(q, &e->ev))
            continue;
        tide_store_event_t *r = tide_reallocarray(*rows, *n + 1, sizeof *r);
        if (r == NULL)
            return tide_errorf(TIDE_ERR_NOMEM, "out of memory reading held events");
        *rows = r;
        tide_store_event_t *dst = &r[*n];
        *dst = e->ev;
        dst->fields.workers = NULL;
        dst->fields.n_workers = 0;
        if (e->ev.fields.n_workers > 0) {
            size_t bytes = e->ev.fields.n_workers * sizeof *dst->fields.workers;
            dst->fields.workers = tide_malloc(bytes);
            if (dst->fields.workers == NULL)
                return tide_errorf(TIDE_ERR_NOMEM, "out of memory reading held events");
            memcpy(dst->fields.workers, e->ev.fields.workers, bytes);
            dst->fields.n_workers = e->ev.fields.n_workers;
        }
        (*n)++;
    }
    return TIDE_OK;
}
