/*
 * coordinator/queries: what tidectl (and libtide, for status) reads: pages of the worker
 * table, the jobs, the event history and offline attempts' logs. Nothing here changes
 * the state; each is served while the state file cannot be written, logs aside.
 * Event-loop thread only.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/clock.h"
#include "core/error.h"
#include "coordinator/allocations.h"
#include "coordinator/members.h"
#include "coordinator/queries.h"

static tide_proto_job_state_t job_state_wire(const tide_coord_job_t *j)
{
    switch (j->state) {
    case TIDE_JS_RUNNING:
        /* stall.c told a stalled step (on one host: nothing fenced, no recovery): stalled
           until a step completes or a new generation starts, as stall.c re-arms */
        if (j->kind == TIDE_CJOB_ONLINE && j->stall_told && j->stall_gen == j->generation &&
            j->stall_step == j->step)
            return TIDE_JOB_STALLED;
        return TIDE_JOB_RUNNING;
    case TIDE_JS_RESIZING:
        return (j->reconf && j->reconf->recover) ? TIDE_JOB_RECOVERING : TIDE_JOB_RESIZING;
    case TIDE_JS_STALLED:
        return TIDE_JOB_STALLED; /* what the stalled event said: waiting, not recovering */
    case TIDE_JS_QUEUED:
        return (j->kind == TIDE_CJOB_OFFLINE && j->attempts > 0) ? TIDE_JOB_PREEMPTED
                                                                 : TIDE_JOB_QUEUED;
    case TIDE_JS_ASSIGNED:
        return TIDE_JOB_RUNNING;
    case TIDE_JS_DONE:
        return TIDE_JOB_DONE;
    case TIDE_JS_FAILED:
        return TIDE_JOB_FAILED;
    case TIDE_JS_CANCELLED:
        return TIDE_JOB_CANCELLED;
    }
    return TIDE_JOB_FAILED;
}

/* Copies src into dst[cap] (truncating, NUL-terminated): the status reply copies three
 * names per worker, 10^4 workers a request, where snprintf's formatting showed up. */
static void copy_name(char *dst, size_t cap, const char *src)
{
    size_t n = strnlen(src, cap - 1);
    memcpy(dst, src, n);
    dst[n] = '\0';
}

/* 1 when status lists w: a registered worker, and one that left only when asked for all. */
static int listed(const tide_coord_worker_t *w, int all)
{
    return w->pool[0] != '\0' && (all || w->state != TIDE_WS_LEFT);
}

static int cmp_i32_asc(const void *a, const void *b)
{
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

static int cmp_row_worker(const void *key, const void *row)
{
    int32_t x = *(const int32_t *)key, y = ((const tide_proto_gpu_row_t *)row)->worker;
    return (x > y) - (x < y);
}

/*
 * The worker ids of job j, ascending, into *out (caller frees): an online job's are the
 * ranks of its launches that have not left it (through the (pool, rank) index: O(the
 * job's ranks), whatever the size of the table), an offline job's the worker running it.
 */
static tide_status job_worker_ids(tide_server_t *s, const tide_coord_job_t *j, int32_t **out,
                                  size_t *n)
{
    size_t cap = 1;
    for (int p = 0; j->kind == TIDE_CJOB_ONLINE && p < j->n_pools; p++)
        cap += j->pools[p].left ? 0 : (size_t)j->pools[p].size;
    int32_t *ids = tide_malloc(cap * sizeof *ids);
    if (ids == NULL)
        return tide_errorf(TIDE_ERR_NOMEM, "out of memory listing job %s's %zu workers", j->name,
                           cap);
    size_t k = 0;
    if (j->kind == TIDE_CJOB_ONLINE) {
        for (int p = 0; p < j->n_pools; p++) {
            if (j->pools[p].left)
                continue;
            for (int32_t r = 0; r < j->pools[p].size; r++) {
                const tide_coord_worker_t *w = tide_coord_worker_find(s->st, j->pools[p].name, r);
                if (w != NULL)
                    ids[k++] = w->id;
            }
        }
    } else if (j->worker >= 0 && tide_coord_worker_get(s->st, j->worker) != NULL) {
        ids[k++] = j->worker;
    }
    qsort(ids, k, sizeof *ids, cmp_i32_asc);
    *out = ids;
    *n = k;
    return TIDE_OK;
}

/* A status listing: the workers it walks (every worker, or one job's) and its page. */
typedef struct listing {
    const tide_coord_job_t *job; /* the filter's job, or NULL */
    int32_t *ids;                /* the job's worker ids, ascending; NULL: every worker */
    size_t n_iter;               /* workers walked */
    size_t page;                 /* rows of the page at most */
} listing;

static const tide_coord_worker_t *listing_at(const tide_server_t *s, const listing *ls, size_t k)
{
    return &s->st->workers[ls->ids != NULL ? (size_t)ls->ids[k] : k];
}

/* The listing q asks for (ls->ids is the caller's to free). */
static tide_status listing_of(tide_server_t *s, const tide_proto_status_t *q, listing *ls)
{
    memset(ls, 0, sizeof *ls);
    ls->n_iter = s->st->n_workers;
    if (q->job[0] != '\0') {
        ls->job = tide_coord_job_by_name(s->st, q->job);
        if (ls->job == NULL)
            return tide_errorf(TIDE_ERR_NOT_FOUND, "no job named %s", q->job);
        tide_status rc = job_worker_ids(s, ls->job, &ls->ids, &ls->n_iter);
        if (rc != TIDE_OK)
            return rc;
    }
    ls->page = s->cfg.status_page > 0 ? (size_t)s->cfg.status_page : TIDE_PROTO_ROWS_MAX;
    if (ls->page > TIDE_PROTO_ROWS_MAX)
        ls->page = TIDE_PROTO_ROWS_MAX;
    if (q->limit > 0 && q->limit < ls->page)
        ls->page = q->limit;
    return TIDE_OK;
}

/* Fills r with w's row (its coordinates left at -1). */
static void status_row(tide_server_t *s, const tide_coord_worker_t *w, int64_t wall,
                       tide_proto_gpu_row_t *r)
{
    r->worker = w->id;
    copy_name(r->host, sizeof r->host, w->host[0] ? w->host : "?");
    r->pid = w->pid > 0 ? w->pid : 0;
    copy_name(r->pool, sizeof r->pool, w->pool);
    r->pool_rank = w->rank;
    r->device = w->device < 0 ? 0 : w->device;
    r->kind = w->kind ? TIDE_DEVICE_GPU : TIDE_DEVICE_CPU;
    r->state = (tide_proto_worker_state_t)w->state;
    r->mem_bytes = w->memory;
    r->stage = r->dp_rank = r->tp_rank = -1;
    r->step = w->step > 0 ? (uint64_t)w->step : 0;
    r->bubble_pct = 100.0 * w->bubble_recent;
    uint64_t ago_ns = s->now_ns > w->last_seen_ns ? s->now_ns - w->last_seen_ns : 0;
    r->last_seen_ms = w->last_seen_ns ? wall - (int64_t)(ago_ns / 1000000ull) : 0;
    const tide_coord_job_t *oj = w->offline_job ? tide_coord_job_get(s->st, w->offline_job) : NULL;
    if (oj != NULL)
        copy_name(r->offline, sizeof r->offline, oj->name);
    const tide_coord_job_t *j = w->job ? tide_coord_job_get(s->st, w->job) : NULL;
    if (j != NULL)
        copy_name(r->job, sizeof r->job, j->name);
    tide__alloc_label(s, w, r->alloc, sizeof r->alloc);
}

/* Sets the (stage, dp, tp) coordinates of the rows[0..k) that hold some in an online job's
 * layout (only the listing's job, when it has one): the rows are in worker order, so each
 * member finds its row by search. */
static void status_coordinates(tide_server_t *s, const listing *ls, tide_proto_gpu_row_t *rows,
                               size_t k)
{
    for (size_t i = 0; i < s->st->n_jobs && k > 0; i++) {
        const tide_coord_job_t *j = s->st->jobs[i];
        if (j->kind != TIDE_CJOB_ONLINE || j->layout == NULL || (ls->job != NULL && j != ls->job))
            continue;
        const tide_layout_t *l = j->layout;
        for (int p = 0; p < l->pp; p++)
            for (int d = 0; d < l->dp; d++)
                for (int t = 0; t < l->tp; t++) {
                    tide_coord_worker_t *w =
                        tide__job_worker(s, j, l->worker[tide_layout_index(l, p, d, t)]);
                    if (w == NULL || w->job != j->id)
                        continue;
                    tide_proto_gpu_row_t *r =
                        bsearch(&w->id, rows, k, sizeof *rows, cmp_row_worker);
                    if (r == NULL)
                        continue;
                    r->stage = p;
                    r->dp_rank = d;
                    r->tp_rank = t;
                }
    }
}

/*
 * One page of the worker table: the listed workers with id >= q->from, in id order, at
 * most min(q->limit, --status-page) of them, with the listing's total and where the next
 * page starts. Nothing is ever cut silently: a reader follows `next` until it is -1.
 * With q->job, only that job's workers (job_worker_ids): the page costs the job's size,
 * not the cluster's.
 */
static void handle_status(tide_server_t *s, const tide_proto_status_t *q)
{
    tide_msg_t m;
    tide_msg_init(&m, TIDE_MSG_STATUS_REPLY);
    tide_status rc = tide__status_page(s, q, &m.u.status_reply);
    if (rc != TIDE_OK) {
        tide__reply_error(s, rc, "%s", tide_last_error());
        return;
    }
    tide__reply(s, &m);
    tide_free(m.u.status_reply.rows);
}

tide_status tide__status_page(tide_server_t *s, const tide_proto_status_t *q,
                              tide_proto_status_reply_t *out)
{
    listing ls;
    tide_status rc = listing_of(s, q, &ls);
    if (rc != TIDE_OK)
        return rc;
    out->time_ms = tide_wall_ms();
    snprintf(out->ompi_server, sizeof out->ompi_server, "%s",
             s->cfg.ompi_server ? s->cfg.ompi_server : "");
    const tide__health *h = tide__health_of(s);
    if (h->degraded) /* never 0 while degraded: 0 says healthy */
        out->state_degraded_ms = (double)(tide_now_ns() - h->since_ns) / 1e6 + 1e-3;
    size_t total = 0, n = 0;
    for (size_t k = 0; k < ls.n_iter; k++) {
        const tide_coord_worker_t *w = listing_at(s, &ls, k);
        if (!listed(w, q->all))
            continue;
        total++;
        n += w->id >= q->from && n < ls.page;
    }
    tide_proto_gpu_row_t *rows = tide_calloc(n ? n : 1, sizeof *rows);
    if (rows == NULL) {
        tide_free(ls.ids);
        return tide_errorf(TIDE_ERR_NOMEM, "out of memory building a status page of %zu workers",
                           n);
    }
    size_t k = 0;
    int32_t next = -1;
    int64_t wall = tide_wall_ms();
    for (size_t x = 0; x < ls.n_iter; x++) {
        const tide_coord_worker_t *w = listing_at(s, &ls, x);
        if (w->id < q->from || !listed(w, q->all))
            continue;
        if (k >= n) {
            if (next < 0)
                next = w->id; /* the first listed worker past this page */
            continue;
        }
        status_row(s, w, wall, &rows[k++]);
    }
    status_coordinates(s, &ls, rows, k);
    out->rows = rows;
    out->n_rows = (uint32_t)k;
    out->total = (uint32_t)total;
    out->next = next;
    tide_free(ls.ids);
    return TIDE_OK;
}

static void handle_jobs(tide_server_t *s)
{
    tide_msg_t m;
    tide_msg_init(&m, TIDE_MSG_JOBS_REPLY);
    tide_status rc = tide__jobs_rows(s, &m.u.jobs_reply);
    if (rc != TIDE_OK) {
        tide__reply_error(s, rc, "%s", tide_last_error());
        return;
    }
    tide__reply(s, &m);
    tide_free(m.u.jobs_reply.rows);
}

tide_status tide__jobs_rows(tide_server_t *s, tide_proto_jobs_reply_t *out)
{
    tide_coord_state_t *st = s->st;
    size_t n = st->n_jobs > TIDE_PROTO_ROWS_MAX ? TIDE_PROTO_ROWS_MAX : st->n_jobs;
    tide_proto_job_row_t *rows = tide_calloc(n ? n : 1, sizeof *rows);
    if (rows == NULL)
        return tide_errorf(TIDE_ERR_NOMEM, "out of memory listing %zu jobs", n);
    for (size_t i = 0; i < n; i++) {
        const tide_coord_job_t *j = st->jobs[i];
        tide_proto_job_row_t *r = &rows[i];
        snprintf(r->name, sizeof r->name, "%s", j->name);
        r->state = job_state_wire(j);
        r->priority = j->priority;
        if (j->kind == TIDE_CJOB_ONLINE) {
            r->kind = TIDE_JOB_ONLINE;
            r->gen = j->generation;
            if (j->layout) {
                r->dp = j->layout->dp;
                r->tp = j->layout->tp;
                r->pp = j->layout->pp;
                r->workers = (uint32_t)tide_layout_size(j->layout);
            }
            r->step = j->step > 0 ? (uint64_t)j->step : 0;
            r->throughput = j->throughput;
            r->min_gpus = j->el_min;
            r->max_gpus = j->el_max;
            r->hold = j->el_hold;
            tide__alloc_job_text(s, j, r->allocs, sizeof r->allocs);
        } else {
            r->kind = j->okind == TIDE_OFFLINE_PLUGIN ? TIDE_JOB_PLUGIN : TIDE_JOB_COMMAND;
            r->workers = j->state == TIDE_JS_ASSIGNED ? 1 : 0;
            r->attempts = (uint32_t)j->attempts;
        }
    }
    out->rows = rows;
    out->n_rows = (uint32_t)n;
    return TIDE_OK;
}

/* Moves row src (its fields' workers too) to dst. */
static void move_event(tide_store_event_t *dst, tide_store_event_t *src)
{
    *dst = *src;
    src->fields.workers = NULL;
    src->fields.n_workers = 0;
}

/* While the state file takes no writes, the events since then are held in memory (with no
 * id yet): they are newer than every stored one, so they come last oldest first, first
 * newest first, within q's limit. A follower (since_id) sees them once they are stored. */
static tide_status add_held_events(tide_server_t *s, const tide_store_event_query_t *q,
                                   tide_store_event_t **ev, size_t *n)
{
    const tide__health *h = tide__health_of(s);
    if (!h->degraded || q->since_id != 0)
        return TIDE_OK;
    tide_store_event_t *held = NULL;
    size_t n_held = 0;
    tide_status rc = tide__health_events(h, q, &held, &n_held);
    size_t limit = q->limit, take, keep; /* held rows and stored rows in the answer */
    if (q->newest) {
        take = n_held < limit ? n_held : limit;
        keep = *n < limit - take ? *n : limit - take;
    } else {
        keep = *n < limit ? *n : limit;
        take = n_held < limit - keep ? n_held : limit - keep;
    }
    tide_store_event_t *all = rc == TIDE_OK ? tide_calloc(keep + take + 1, sizeof *all) : NULL;
    if (rc == TIDE_OK && all == NULL)
        rc = tide_errorf(TIDE_ERR_NOMEM, "out of memory listing %zu events", keep + take);
    if (rc != TIDE_OK) {
        tide_store_events_free(&held, n_held);
        return rc;
    }
    size_t k = 0;
    if (q->newest) /* the newest held ones, newest first, then the stored ones */
        for (size_t i = 0; i < take; i++)
            move_event(&all[k++], &held[n_held - 1 - i]);
    for (size_t i = 0; i < keep; i++)
        move_event(&all[k++], &(*ev)[i]);
    if (!q->newest) /* the stored ones, then the oldest held ones */
        for (size_t i = 0; i < take; i++)
            move_event(&all[k++], &held[i]);
    tide_store_events_free(&held, n_held);
    tide_store_events_free(ev, *n);
    *ev = all;
    *n = k;
    return TIDE_OK;
}

static void handle_events(tide_server_t *s, const tide_proto_events_t *q)
{
    tide_msg_t m;
    tide_msg_init(&m, TIDE_MSG_EVENTS_REPLY);
    tide_store_event_t *ev = NULL;
    size_t n = 0;
    tide_status rc = tide__event_rows(s, q, &m.u.events_reply, &ev, &n);
    if (rc != TIDE_OK) {
        tide__reply_error(s, rc, "%s", tide_last_error());
        return;
    }
    tide__reply(s, &m);
    tide_free(m.u.events_reply.rows);
    tide_store_events_free(&ev, n);
}

tide_status tide__event_rows(tide_server_t *s, const tide_proto_events_t *q,
                             tide_proto_events_reply_t *out, tide_store_event_t **ev, size_t *n)
{
    *ev = NULL;
    *n = 0;
    tide_store_event_query_t sq = {.since_id = q->since_id,
                                   .since_ms = q->since_ms,
                                   .until_ms = q->until_ms,
                                   .job = q->job,
                                   .kind = q->kind,
                                   .limit = q->limit,
                                   .newest = q->newest};
    tide_status rc = tide_store_query_events(tide__store(s), &sq, ev, n);
    if (rc == TIDE_OK)
        rc = add_held_events(s, &sq, ev, n);
    if (rc != TIDE_OK) {
        tide_store_events_free(ev, *n);
        *n = 0;
        return rc;
    }
    tide_proto_event_row_t *rows = tide_calloc(*n ? *n : 1, sizeof *rows);
    if (rows == NULL) {
        size_t k = *n;
        tide_store_events_free(ev, k);
        *n = 0;
        return tide_errorf(TIDE_ERR_NOMEM, "out of memory listing %zu events", k);
    }
    for (size_t i = 0; i < *n; i++) {
        const tide_store_event_t *e = &(*ev)[i];
        rows[i].id = e->id;
        rows[i].time_ms = e->time_ms;
        snprintf(rows[i].job, sizeof rows[i].job, "%s", e->job);
        snprintf(rows[i].kind, sizeof rows[i].kind, "%s", e->kind);
        snprintf(rows[i].detail, sizeof rows[i].detail, "%s", e->detail);
        rows[i].fields = e->fields; /* borrowed from *ev until the caller frees it */
    }
    out->rows = rows;
    out->n_rows = (uint32_t)*n;
    return TIDE_OK;
}

static void handle_logs(tide_server_t *s, const tide_proto_logs_t *q)
{
    const tide_coord_job_t *j = tide_coord_job_by_name(s->st, q->job);
    if (j == NULL || j->kind != TIDE_CJOB_OFFLINE) {
        tide__reply_error(s, TIDE_ERR_NOT_FOUND,
                          "no offline job named %s (tidectl jobs lists them)", q->job);
        return;
    }
    tide_store_attempt_t *at = NULL;
    size_t n = 0;
    tide_status rc = tide_store_attempts(tide__store(s), j->id, (int32_t)q->attempt,
                                         TIDE_PROTO_ATTEMPTS_MAX, &at, &n);
    if (rc != TIDE_OK) {
        tide__reply_error(s, rc, "%s", tide_last_error());
        return;
    }
    if (q->attempt != 0 && n == 0) {
        tide_free(at);
        tide__reply_error(s, TIDE_ERR_NOT_FOUND,
                          "job %s has no report of attempt %u (it ran %d attempts)", j->name,
                          q->attempt, j->attempts);
        return;
    }
    tide_proto_attempt_row_t *rows = tide_calloc(n ? n : 1, sizeof *rows);
    if (rows == NULL) {
        tide_free(at);
        tide__reply_error(s, TIDE_ERR_NOMEM, "out of memory listing %zu attempts", n);
        return;
    }
    for (size_t i = 0; i < n; i++) {
        rows[i].attempt = (uint32_t)at[i].attempt;
        rows[i].worker = at[i].worker;
        snprintf(rows[i].host, sizeof rows[i].host, "%s", at[i].host);
        snprintf(rows[i].log, sizeof rows[i].log, "%s", at[i].log);
        rows[i].state = at[i].state >= 0 && at[i].state <= TIDE_JOB_CANCELLED
                            ? (tide_proto_job_state_t)at[i].state
                            : TIDE_JOB_FAILED;
        rows[i].exit_code = at[i].exit_code;
        rows[i].time_ms = at[i].time_ms > 0 ? at[i].time_ms : 0;
        snprintf(rows[i].tail, sizeof rows[i].tail, "%s", at[i].tail);
    }
    tide_msg_t m;
    tide_msg_init(&m, TIDE_MSG_LOGS_REPLY);
    snprintf(m.u.logs_reply.job, sizeof m.u.logs_reply.job, "%s", j->name);
    m.u.logs_reply.rows = rows;
    m.u.logs_reply.n_rows = (uint32_t)n;
    tide__reply(s, &m);
    tide_free(rows);
    tide_free(at);
}

void tide__on_status(tide_server_t *s, const tide_msg_t *m, const void *raw, size_t len)
{
    (void)raw;
    (void)len;
    handle_status(s, &m->u.status);
}

void tide__on_jobs(tide_server_t *s, const tide_msg_t *m, const void *raw, size_t len)
{
    (void)m;
    (void)raw;
    (void)len;
    handle_jobs(s);
}

void tide__on_events(tide_server_t *s, const tide_msg_t *m, const void *raw, size_t len)
{
    (void)raw;
    (void)len;
    handle_events(s, &m->u.events);
}

void tide__on_logs(tide_server_t *s, const tide_msg_t *m, const void *raw, size_t len)
{
    (void)raw;
    (void)len;
    handle_logs(s, &m->u.logs);
}
