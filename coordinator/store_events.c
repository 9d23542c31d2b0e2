/*
 * coordinator/store_events: the event table of tided's state file (see store.h): each
 * row is a sentence for people and, since the events became structured, an event_fields
 * record (proto.h) with the typed parts tools draw and filter on. Appends happen inside
 * the batch's transaction; queries read with the filters of tide_store_event_query_t.
 * Workload: a few appends per resize, failure or offline change; a query per tidectl
 * events or timeline call (up to TIDE_PROTO_EVENTS_MAX rows). Event-loop thread only.
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include <sqlite3.h>

#include "core/alloc.h"
#include "core/error.h"
#include "core/log.h"
#include "coordinator/store_int.h"

tide_status tide_store_event_fields(tide_store_t *s, int64_t time_ms, const char *job,
                                    const char *kind, const tide_proto_event_fields_t *fields,
                                    const char *detail)
{
    TIDE_CHECK(tide__store_need_txn(s, "event"));
    tide_proto_buf_t buf;
    tide_proto_buf_init(&buf);
    if (fields != NULL) {
        tide_msg_t m;
        tide_msg_init(&m, TIDE_MSG_EVENT_FIELDS);
        m.u.event_fields = *fields; /* borrowed: never cleared */
        /* fields that do not encode are tided's mistake: the event is kept without them
           rather than failing the batch that recorded it */
        if (tide_proto_encode_record(&m, &buf) != TIDE_OK) {
            TIDE_WARN("store", "event %s of job %s stored without its fields: %s", kind,
                      job && job[0] ? job : "-", tide_last_error());
            fields = NULL;
        }
    }
    sqlite3_stmt *st = s->st[TIDE__ST_EVENT];
    sqlite3_bind_int64(st, 1, time_ms);
    sqlite3_bind_text(st, 2, job ? job : "", -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 3, kind, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 4, detail, -1, SQLITE_TRANSIENT);
    if (fields != NULL)
        sqlite3_bind_blob(st, 5, buf.data, (int)buf.len, SQLITE_TRANSIENT);
    else
        sqlite3_bind_null(st, 5);
    TIDE_INFO("event", "%s%s%s: %s", job && job[0] ? job : "", job && job[0] ? " " : "", kind,
              detail);
    tide_status rc = tide__store_step_done(s, TIDE__ST_EVENT, "appending an event");
    tide_proto_buf_destroy(&buf);
    return rc;
}

tide_status tide_store_event(tide_store_t *s, int64_t time_ms, const char *job, const char *kind,
                             const char *fmt, ...)
{
    char detail[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(detail, sizeof detail, fmt, ap);
    va_end(ap);
    return tide_store_event_fields(s, time_ms, job, kind, NULL, detail);
}

/* Decodes a stored event_fields record into f (left empty for none or a damaged one: the
   row's sentence still tells what happened, and a query must not fail on one old row). */
static void read_fields(tide_store_t *s, sqlite3_stmt *q, int col, uint64_t id,
                        tide_proto_event_fields_t *f)
{
    memset(f, 0, sizeof *f);
    f->step = -1;
    const void *blob = sqlite3_column_blob(q, col);
    int len = sqlite3_column_bytes(q, col);
    if (blob == NULL || len <= 0)
        return;
    tide_msg_t m;
    if (tide_proto_decode_record(blob, (size_t)len, TIDE_MSG_EVENT_FIELDS, &m) != TIDE_OK) {
        TIDE_WARN("store",
                  "state file %s: event %llu: its fields are damaged (%s); shown "
                  "without them",
                  s->path, (unsigned long long)id, tide_last_error());
        return;
    }
    *f = m.u.event_fields; /* the row takes the decoded arrays */
}

void tide_store_events_free(tide_store_event_t **rows_p, size_t n)
{
    if (rows_p == NULL || *rows_p == NULL)
        return;
    for (size_t i = 0; i < n; i++)
        tide_free((*rows_p)[i].fields.workers);
    tide_free(*rows_p);
    *rows_p = NULL;
}

tide_status tide_store_query_events(tide_store_t *s, const tide_store_event_query_t *qy,
                                    tide_store_event_t **rows, size_t *n)
{
    *rows = NULL;
    *n = 0;
    uint32_t limit = qy->limit;
    if (limit == 0)
        return TIDE_OK;
    tide_store_event_t *r = tide_calloc(limit, sizeof *r);
    if (r == NULL)
        return tide_errorf(TIDE_ERR_NOMEM, "out of memory reading %u events", limit);
    sqlite3_stmt *q = s->st[qy->newest ? TIDE__ST_EVENTS_NEWEST : TIDE__ST_EVENTS];
    uint64_t since = qy->since_id > INT64_MAX ? INT64_MAX : qy->since_id;
    sqlite3_bind_int64(q, 1, (sqlite3_int64)since);
    sqlite3_bind_int64(q, 2, qy->since_ms);
    sqlite3_bind_int64(q, 3, qy->until_ms);
    sqlite3_bind_text(q, 4, qy->job ? qy->job : "", -1, SQLITE_STATIC);
    sqlite3_bind_text(q, 5, qy->kind ? qy->kind : "", -1, SQLITE_STATIC);
    sqlite3_bind_int64(q, 6, limit);
    size_t k = 0;
    int src = SQLITE_DONE;
    while (k < limit && (src = sqlite3_step(q)) == SQLITE_ROW) {
        r[k].id = (uint64_t)sqlite3_column_int64(q, 0);
        r[k].time_ms = sqlite3_column_int64(q, 1);
        tide__store_copy_text(r[k].job, sizeof r[k].job, sqlite3_column_text(q, 2));
        tide__store_copy_text(r[k].kind, sizeof r[k].kind, sqlite3_column_text(q, 3));
        tide__store_copy_text(r[k].detail, sizeof r[k].detail, sqlite3_column_text(q, 4));
        read_fields(s, q, 5, r[k].id, &r[k].fields);
        k++;
    }
    if (k < limit && src != SQLITE_DONE) {
        tide_status rc = tide__store_db_error(s, src, "reading events");
        sqlite3_reset(q);
        sqlite3_clear_bindings(q);
        tide_store_events_free(&r, k);
        return rc;
    }
    sqlite3_reset(q);
    sqlite3_clear_bindings(q);
    *rows = r;
    *n = k;
    return TIDE_OK;
}

tide_status tide_store_event_count(tide_store_t *s, uint64_t *out)
{
    sqlite3_stmt *q = NULL;
    int src = sqlite3_prepare_v2(s->db, "SELECT count(*) FROM events", -1, &q, NULL);
    if (src == SQLITE_OK)
        src = sqlite3_step(q);
    if (src != SQLITE_ROW) {
        sqlite3_finalize(q);
        return tide__store_db_error(s, src, "counting events");
    }
    *out = (uint64_t)sqlite3_column_int64(q, 0);
    sqlite3_finalize(q);
    return TIDE_OK;
}
