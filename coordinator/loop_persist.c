/*
 * coordinator/loop_persist: the batch's transaction (see loop_int.h). Handler modules save
 * and record through loop.h (tide__save_*, tide__event*): each write joins the batch's one
 * SQLite transaction, and the health journal keeps what memory holds that the file must
 * get. The loop calls tide__core_finish_batch at each pass's end: the commit, or, when a
 * write or the commit failed, the degraded mode: the batch rolled back, memory deciding
 * alone, operators' changes refused, and tide__core_try_persist writing the whole
 * in-memory truth back once the file takes writes again. Event-loop thread only.
 */
#include <stdarg.h>
#include <stdio.h>

#include "core/clock.h"
#include "core/error.h"
#include "core/log.h"
#include "coordinator/allocs.h"
#include "coordinator/health.h"
#include "coordinator/loop_int.h"
#include "coordinator/outbox.h"

/* ---- durable changes ------------------------------------------------------------------------- */

/* Notes the batch's first store failure (tide_last_error says why). */
static void store_failed(tide__core *c, tide_status rc)
{
    if (c->fatal != TIDE_OK)
        return;
    c->fatal = rc;
    snprintf(c->fail_why, sizeof c->fail_why, "%s", tide_last_error());
    TIDE_ERROR("store", "%s", c->fail_why);
}

/* 1 when this batch's writes go to the store: it is healthy and the batch has not failed
 * (otherwise memory alone holds the change, written back when the file takes it). */
static int store_ready(tide__core *c)
{
    if (c->fatal != TIDE_OK || c->health.degraded)
        return 0;
    tide_status rc = tide_store_begin(c->store);
    if (rc != TIDE_OK) {
        store_failed(c, rc);
        return 0;
    }
    return 1;
}

static void store_result(tide__core *c, tide_status rc)
{
    if (rc != TIDE_OK)
        store_failed(c, rc);
}

void tide__save_worker(tide_server_t *s, const tide_coord_worker_t *w)
{
    if (store_ready(s->core))
        store_result(s->core, tide_store_put_worker(s->core->store, w));
}

void tide__save_job(tide_server_t *s, const tide_coord_job_t *j)
{
    if (store_ready(s->core))
        store_result(s->core, tide_store_put_job(s->core->store, j));
}

void tide__save_attempt(tide_server_t *s, const tide_store_attempt_t *a)
{
    tide__health_attempt(&s->core->health, a);
    if (store_ready(s->core))
        store_result(s->core, tide_store_put_attempt(s->core->store, a));
}

void tide__save_alloc(tide_server_t *s, const char *pool, const tide_proto_alloc_t *a)
{
    tide__health_alloc(&s->core->health, pool, a);
    if (store_ready(s->core))
        store_result(s->core, tide_store_put_alloc(s->core->store, pool, a));
}

void tide__save_alloc_removed(tide_server_t *s, const char *pool)
{
    tide__health_alloc(&s->core->health, pool, NULL);
    if (store_ready(s->core))
        store_result(s->core, tide_store_del_alloc(s->core->store, pool));
}

void tide__save_worker_removed(tide_server_t *s, int32_t id)
{
    if (store_ready(s->core))
        store_result(s->core, tide_store_del_worker(s->core->store, id, s->st->next_worker_id));
}

/* The one writer of events: a sentence, and the typed fields when there are some. */
static void event_v(tide_server_t *s, const char *job, const char *kind,
                    const tide_proto_event_fields_t *f, const char *fmt, va_list ap)
    TIDE_PRINTF(5, 0);
static void event_v(tide_server_t *s, const char *job, const char *kind,
                    const tide_proto_event_fields_t *f, const char *fmt, va_list ap)
{
    char detail[1024];
    vsnprintf(detail, sizeof detail, fmt, ap);
    int64_t now_ms = tide_wall_ms();
    tide__health_event(&s->core->health, now_ms, job, kind, f, detail);
    if (store_ready(s->core))
        store_result(s->core,
                     tide_store_event_fields(s->core->store, now_ms, job, kind, f, detail));
}

void tide__event(tide_server_t *s, const char *job, const char *kind, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    event_v(s, job, kind, NULL, fmt, ap);
    va_end(ap);
}

void tide__event_f(tide_server_t *s, const char *job, const char *kind,
                   const tide_proto_event_fields_t *f, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    event_v(s, job, kind, f, fmt, ap);
    va_end(ap);
}

tide_store_t *tide__store(tide_server_t *s)
{
    return s->core->store;
}

const tide__health *tide__health_of(const tide_server_t *s)
{
    return &s->core->health;
}

/* ---- the batch's end: commit, or degraded ------------------------------------------------- */

/*
 * The batch's writes failed (disk full, I/O error): its transaction is rolled back but
 * memory keeps every decision (workers failed, recoveries started: their commands go out),
 * the journal keeps its events, and tided is degraded until tide__core_try_persist writes the whole
 * in-memory truth back. An operator's change of this batch is in force in memory but not
 * on disk, so its acknowledgement is replaced by an error that says so.
 */
static void enter_degraded(tide_server_t *s)
{
    tide__core *c = s->core;
    tide_store_rollback(c->store);
    c->fatal = TIDE_OK;
    if (!tide__health_failed(&c->health, c->fail_why, s->now_ns, tide_wall_ms()))
        return;
    tide_proto_event_fields_t f;
    tide_event_fields_init(&f);
    tide_event_fields_reason(&f, c->fail_why);
    tide__event_f(s, "", "state_degraded", &f,
                  "tided cannot persist its state to %s: %s; it goes on deciding in memory "
                  "(failures are still detected and recovered), refuses operators' changes, "
                  "and writes everything back when the file takes writes again",
                  s->cfg.state_path, c->fail_why);
    tide_msg_t err;
    tide_msg_init(&err, TIDE_MSG_ERROR);
    err.u.error.code = TIDE_ERR_IO;
    snprintf(err.u.error.message, sizeof err.u.error.message,
             "tided cannot persist its state: %s. This change is in force while tided runs but "
             "is not on disk: a tided restart before the file system of %s has room loses it",
             c->fail_why, s->cfg.state_path);
    tide__outbox_refuse_changes(&c->ob, &err);
    TIDE_ERROR("store",
               "the state file cannot be written (%s): tided is degraded; it keeps deciding in "
               "memory and retries every %llu ms",
               c->fail_why, (unsigned long long)(TIDE__RETRY_NS / 1000000ull));
}

/* Writes every worker and job as memory holds them, then the journal, in the open
 * transaction: what a restart must find. */
static tide_status write_back(tide_server_t *s)
{
    tide__core *c = s->core;
    tide_coord_state_t *st = s->st;
    for (size_t i = 0; i < st->n_workers; i++) {
        const tide_coord_worker_t *w = tide_coord_worker_get(st, (int32_t)i);
        TIDE_CHECK(w != NULL ? tide_store_put_worker(c->store, w)
                             : tide_store_del_worker(c->store, (int32_t)i, st->next_worker_id));
    }
    for (size_t i = 0; i < st->n_jobs; i++)
        TIDE_CHECK(tide_store_put_job(c->store, st->jobs[i]));
    TIDE_CHECK(tide__health_replay(&c->health, c->store));
    double secs = (double)(s->now_ns - c->health.since_ns) / 1e9;
    char detail[1024];
    snprintf(detail, sizeof detail,
             "tided persists its state to %s again after %.1f s: %zu workers, %zu jobs and "
             "%zu held writes written back%s",
             s->cfg.state_path, secs, st->n_workers, st->n_jobs, c->health.n,
             c->health.dropped ? " (the oldest held writes were dropped: the journal was full)"
                               : "");
    return tide_store_event_fields(c->store, tide_wall_ms(), "", "state_restored", NULL, detail);
}

void tide__core_try_persist(tide_server_t *s, int force)
{
    tide__core *c = s->core;
    if (!c->health.degraded || (!force && s->now_ns < c->health.retry_ns))
        return;
    tide_status rc = tide_store_begin(c->store);
    if (rc == TIDE_OK)
        rc = write_back(s);
    if (rc == TIDE_OK)
        rc = tide_store_commit(c->store);
    if (rc != TIDE_OK) {
        char why[512];
        snprintf(why, sizeof why, "%s", tide_last_error());
        tide_store_rollback(c->store);
        tide__health_failed(&c->health, why, s->now_ns, tide_wall_ms());
        TIDE_WARN_LIMITED("store", "still cannot persist the state: %s", why);
        return;
    }
    TIDE_INFO("store", "the state file takes writes again: tided's state is persisted");
    tide__health_committed(&c->health);
    tide__health_restored(&c->health);
}

void tide__core_finish_batch(tide_server_t *s)
{
    tide__core *c = s->core;
    if (c->fatal == TIDE_OK && !c->health.degraded) {
        tide_status rc = tide_store_commit(c->store);
        if (rc != TIDE_OK)
            store_failed(c, rc);
        else
            tide__health_committed(&c->health);
    }
    if (c->fatal != TIDE_OK)
        enter_degraded(s);
    tide__outbox_flush(&c->ob);
    tide__core_try_persist(s, 0);
}
