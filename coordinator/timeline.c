/*
 * coordinator/timeline: a job's history as rows, segments and marks, and its SVG (see
 * timeline.h). Building replays the events in order: a layout event opens one segment
 * per worker of its map (closing the previous generation's), a failure closes the
 * worker's segment and opens a failed one, an offline assignment on one of the job's
 * GPUs opens a backfill (or bubble) segment that its job's end, preemption or requeue
 * closes.
 */
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "coordinator/timeline_int.h"

const char *const tide__timeline_seg_class[4] = {"online", "offline", "bubble", "failed"};
const char *const tide__timeline_mark_class[7] = {"resize",     "recovery", "rollback", "abort",
                                                  "checkpoint", "failure",  "stall"};

/* Grows *arr (n used of *cap, elements of size) by one; 0 when out of memory. */
static int grow(void **arr, size_t *cap, size_t n, size_t size)
{
    if (n < *cap)
        return 1;
    size_t nc = *cap ? *cap * 2 : 16;
    void *p = tide_realloc(*arr, nc * size);
    if (p == NULL)
        return 0;
    *arr = p;
    *cap = nc;
    return 1;
}

static long find_row(const tide_timeline_t *t, int32_t worker)
{
    for (size_t i = 0; i < t->n_rows; i++)
        if (t->rows[i].worker == worker)
            return (long)i;
    return -1;
}

static long add_row(tide_timeline_t *t, int32_t worker, const tide_proto_gpu_row_t *gpus,
                    size_t n_gpus, const char *host)
{
    long r = find_row(t, worker);
    if (r >= 0)
        return r;
    if (!grow((void **)&t->rows, &t->cap_rows, t->n_rows, sizeof *t->rows))
        return -1;
    row_t *w = &t->rows[t->n_rows];
    w->worker = worker;
    w->device = -1;
    snprintf(w->host, sizeof w->host, "%s", host ? host : "");
    for (size_t i = 0; i < n_gpus; i++)
        if (gpus[i].worker == worker) {
            snprintf(w->host, sizeof w->host, "%s", gpus[i].host);
            w->device = gpus[i].device;
        }
    return (long)t->n_rows++;
}

static seg_t *open_seg(tide_timeline_t *t, size_t row, int kind, int64_t at)
{
    if (!grow((void **)&t->segs, &t->cap_segs, t->n_segs, sizeof *t->segs))
        return NULL;
    seg_t *s = &t->segs[t->n_segs++];
    memset(s, 0, sizeof *s);
    s->row = row;
    s->kind = kind;
    s->t0 = at;
    s->t1 = -1;
    return s;
}

/* Closes at `at` the open segments of row (any row: (size_t)-1) of kind (-1: any) and of
   offline job `job` (NULL: any). */
static void close_segs(tide_timeline_t *t, size_t row, int kind, const char *job, int64_t at)
{
    for (size_t i = 0; i < t->n_segs; i++) {
        seg_t *s = &t->segs[i];
        if (s->t1 >= 0 || (row != (size_t)-1 && s->row != row) || (kind >= 0 && s->kind != kind))
            continue;
        if (job != NULL && strcmp(s->job, job) != 0)
            continue;
        s->t1 = at < s->t0 ? s->t0 : at;
    }
}

static mark_t *add_mark(tide_timeline_t *t, int kind, int64_t t0, int64_t t1)
{
    if (!grow((void **)&t->marks, &t->cap_marks, t->n_marks, sizeof *t->marks))
        return NULL;
    mark_t *m = &t->marks[t->n_marks++];
    memset(m, 0, sizeof *m);
    m->kind = kind;
    m->t0 = t0;
    m->t1 = t1;
    m->worker = -1;
    m->step = -1;
    return m;
}

/* A layout event of the job: the new generation's segments, one per worker of its map. */
static tide_status apply_layout(tide_timeline_t *t, const tide_proto_event_row_t *e,
                                const tide_proto_gpu_row_t *gpus, size_t n_gpus)
{
    const tide_proto_event_fields_t *f = &e->fields;
    close_segs(t, (size_t)-1, SEG_ONLINE, NULL, e->time_ms);
    if (f->dp <= 0 || f->n_workers != (uint32_t)(f->dp * f->tp * f->pp))
        return TIDE_OK; /* an event from before events had fields: nothing to draw */
    for (uint32_t i = 0; i < f->n_workers; i++) {
        long r = add_row(t, f->workers[i], gpus, n_gpus, NULL);
        if (r < 0)
            return tide_errorf(TIDE_ERR_NOMEM, "out of memory drawing the timeline");
        close_segs(t, (size_t)r, SEG_FAILED, NULL, e->time_ms); /* it is back */
        seg_t *s = open_seg(t, (size_t)r, SEG_ONLINE, e->time_ms);
        if (s == NULL)
            return tide_errorf(TIDE_ERR_NOMEM, "out of memory drawing the timeline");
        s->gen = f->gen;
        s->t = (int)(i % (uint32_t)f->tp);
        s->d = (int)((i / (uint32_t)f->tp) % (uint32_t)f->dp);
        s->p = (int)(i / (uint32_t)(f->tp * f->dp));
    }
    return TIDE_OK;
}

/* The mark of a committed (or abandoned) reconfiguration, from its start to e. */
static tide_status reconf_mark(tide_timeline_t *t, const tide_proto_event_row_t *e, int kind)
{
    const tide_proto_event_fields_t *f = &e->fields;
    int64_t t0 =
        t->pending_t >= 0 && t->pending_gen == f->gen ? t->pending_t : e->time_ms - (int64_t)f->ms;
    t->pending_t = -1;
    mark_t *m = add_mark(t, kind, t0 < t->start ? t->start : t0, e->time_ms);
    if (m == NULL)
        return tide_errorf(TIDE_ERR_NOMEM, "out of memory drawing the timeline");
    m->gen = f->gen;
    m->ms = f->ms;
    int k = snprintf(m->text, sizeof m->text, "%s: generation %llu",
                     tide__timeline_mark_class[kind], (unsigned long long)f->gen);
    if (f->dp > 0 && kind != MK_ABORT)
        k += snprintf(m->text + k, sizeof m->text - (size_t)k, ", dp %d tp %d pp %d", f->dp, f->tp,
                      f->pp);
    if (f->ms > 0)
        k += snprintf(m->text + k, sizeof m->text - (size_t)k, ", %.0f ms", f->ms);
    if (f->steps_lost > 0)
        snprintf(m->text + k, sizeof m->text - (size_t)k, ", %lld steps lost",
                 (long long)f->steps_lost);
    return TIDE_OK;
}

/* One event of the job itself. */
static tide_status job_event(tide_timeline_t *t, const tide_proto_event_row_t *e,
                             const tide_proto_gpu_row_t *gpus, size_t n_gpus)
{
    const char *k = e->kind;
    int64_t at = e->time_ms;
    if (strcmp(k, "layout") == 0)
        return apply_layout(t, e, gpus, n_gpus);
    if (strcmp(k, "resize_started") == 0 || strcmp(k, "recovery_started") == 0) {
        t->pending_t = at;
        t->pending_gen = e->fields.gen;
        return TIDE_OK;
    }
    int kind = strcmp(k, "resized") == 0          ? MK_RESIZE
               : strcmp(k, "recovered") == 0      ? MK_RECOVERY
               : strcmp(k, "rolled_back") == 0    ? MK_ROLLBACK
               : strcmp(k, "resize_aborted") == 0 ? MK_ABORT
                                                  : -1;
    if (kind >= 0) {
        TIDE_CHECK(reconf_mark(t, e, kind));
        return kind == MK_ABORT ? TIDE_OK : apply_layout(t, e, gpus, n_gpus);
    }
    if (strcmp(k, "checkpoint_saved") == 0 || strcmp(k, "stalled") == 0) {
        int ck = k[0] == 'c';
        mark_t *m = add_mark(t, ck ? MK_CHECKPOINT : MK_STALL, at, at);
        if (m == NULL)
            return tide_errorf(TIDE_ERR_NOMEM, "out of memory drawing the timeline");
        m->step = e->fields.step;
        m->gen = e->fields.gen;
        if (ck)
            snprintf(m->text, sizeof m->text, "checkpoint of step %lld", (long long)m->step);
        else
            snprintf(m->text, sizeof m->text, "stalled: %.150s", e->fields.reason);
        return TIDE_OK;
    }
    if (strcmp(k, "job_ended") == 0 || strcmp(k, "cancelled") == 0) {
        close_segs(t, (size_t)-1, SEG_ONLINE, NULL, at);
        if (at < t->end)
            t->end = at;
        t->ended = 1;
    }
    return TIDE_OK;
}

/* An event of another job or of the cluster: failures of the job's GPUs, offline work
   on them. */
static tide_status other_event(tide_timeline_t *t, const tide_proto_event_row_t *e)
{
    const tide_proto_event_fields_t *f = &e->fields;
    long r = f->n_workers > 0 ? find_row(t, f->workers[0]) : -1;
    const char *k = e->kind;
    if (strcmp(k, "worker_failed") == 0 || strcmp(k, "worker_left") == 0) {
        if (r < 0)
            return TIDE_OK;
        close_segs(t, (size_t)r, -1, NULL, e->time_ms);
        if (k[7] == 'l')
            return TIDE_OK; /* left: nothing more to draw on it */
        mark_t *m = add_mark(t, MK_FAILURE, e->time_ms, e->time_ms);
        if (m == NULL || open_seg(t, (size_t)r, SEG_FAILED, e->time_ms) == NULL)
            return tide_errorf(TIDE_ERR_NOMEM, "out of memory drawing the timeline");
        m->worker = f->workers[0];
        snprintf(m->text, sizeof m->text, "worker %d failed: %.150s", m->worker, f->reason);
        return TIDE_OK;
    }
    if (strcmp(k, "offline_assigned") == 0) {
        if (r < 0)
            return TIDE_OK;
        seg_t *s = open_seg(t, (size_t)r, f->bubbles ? SEG_BUBBLE : SEG_OFFLINE, e->time_ms);
        if (s == NULL)
            return tide_errorf(TIDE_ERR_NOMEM, "out of memory drawing the timeline");
        snprintf(s->job, sizeof s->job, "%s", e->job);
        return TIDE_OK;
    }
    if (strcmp(k, "offline_done") == 0 || strcmp(k, "preempted") == 0 ||
        strcmp(k, "offline_requeued") == 0 || strcmp(k, "offline_failed") == 0 ||
        strcmp(k, "cancelled") == 0) {
        close_segs(t, (size_t)-1, SEG_OFFLINE, e->job, e->time_ms);
        close_segs(t, (size_t)-1, SEG_BUBBLE, e->job, e->time_ms);
    }
    return TIDE_OK;
}

static int cmp_rows(const void *a, const void *b)
{
    const row_t *x = a, *y = b;
    if ((x->host[0] == '\0') != (y->host[0] == '\0'))
        return x->host[0] == '\0' ? 1 : -1; /* workers tided forgot: last */
    int c = strcmp(x->host, y->host);
    if (c != 0)
        return c;
    if (x->device != y->device)
        return x->device < y->device ? -1 : 1;
    return (x->worker > y->worker) - (x->worker < y->worker);
}

/* Sorts the rows by host and device, keeping the segments pointing at their rows. */
static tide_status sort_rows(tide_timeline_t *t)
{
    row_t *old = tide_malloc((t->n_rows ? t->n_rows : 1) * sizeof *old);
    if (old == NULL)
        return tide_errorf(TIDE_ERR_NOMEM, "out of memory drawing the timeline");
    memcpy(old, t->rows, t->n_rows * sizeof *old);
    qsort(t->rows, t->n_rows, sizeof *t->rows, cmp_rows);
    for (size_t i = 0; i < t->n_segs; i++)
        t->segs[i].row = (size_t)find_row(t, old[t->segs[i].row].worker);
    tide_free(old);
    return TIDE_OK;
}

static int job_started(const tide_proto_event_row_t *e, const char *job)
{
    return strcmp(e->job, job) == 0 &&
           (strcmp(e->kind, "layout") == 0 || strcmp(e->kind, "job_created") == 0);
}

tide_status tide_timeline_build(tide_timeline_t **out, const char *job,
                                const tide_proto_event_row_t *ev, size_t n,
                                const tide_proto_gpu_row_t *gpus, size_t n_gpus, int64_t end_ms)
{
    *out = NULL;
    tide_timeline_t *t = tide_calloc(1, sizeof *t);
    if (t == NULL)
        return tide_errorf(TIDE_ERR_NOMEM, "out of memory drawing the timeline");
    snprintf(t->job, sizeof t->job, "%s", job);
    t->start = -1;
    t->end = end_ms;
    t->pending_t = -1;
    tide_status rc = TIDE_OK;
    for (size_t i = 0; i < n && rc == TIDE_OK && !t->ended; i++) {
        if (t->start < 0 && !job_started(&ev[i], job))
            continue;
        if (t->start < 0)
            t->start = ev[i].time_ms;
        rc = strcmp(ev[i].job, job) == 0 ? job_event(t, &ev[i], gpus, n_gpus)
                                         : other_event(t, &ev[i]);
    }
    if (rc == TIDE_OK && t->n_rows == 0)
        rc = tide_errorf(TIDE_ERR_NOT_FOUND,
                         "no layout of job %s in the events read (tidectl events --job %s "
                         "lists them; an older --since may reach back to its start)",
                         job, job);
    if (rc == TIDE_OK) {
        if (t->end <= t->start)
            t->end = t->start + 1;
        close_segs(t, (size_t)-1, -1, NULL, t->end);
        rc = sort_rows(t);
    }
    if (rc != TIDE_OK) {
        tide_timeline_destroy(&t);
        return rc;
    }
    *out = t;
    return TIDE_OK;
}

void tide_timeline_counts(const tide_timeline_t *t, size_t *rows, size_t *segs, size_t *marks)
{
    *rows = t->n_rows;
    *segs = t->n_segs;
    *marks = t->n_marks;
}

void tide_timeline_destroy(tide_timeline_t **self_p)
{
    if (self_p == NULL || *self_p == NULL)
        return;
    tide_timeline_t *t = *self_p;
    tide_free(t->rows);
    tide_free(t->segs);
    tide_free(t->marks);
    tide_free(t);
    *self_p = NULL;
}
