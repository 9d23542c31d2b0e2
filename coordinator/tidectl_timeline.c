/*
 * tidectl timeline: reads a job's history from tided (every event since --since, page by
 * page, and the worker table for hosts and devices) and writes its picture
 * (coordinator/timeline.h) as SVG to -o FILE or stdout, or as a Chrome trace (Perfetto)
 * when FILE ends in .json. Workload: a few requests of up to
 * TIDE_PROTO_EVENTS_MAX events each.
 */
#include <errno.h>
#include <string.h>

#include "coordinator/tidectl_int.h"
#include "coordinator/timeline.h"
#include "core/alloc.h"
#include "core/clock.h"

typedef struct events {
    tide_proto_event_row_t *rows; /* owned, each row's workers too */
    size_t n, cap;
} events_t;

static void events_free(events_t *e)
{
    for (size_t i = 0; i < e->n; i++)
        tide_free(e->rows[i].fields.workers);
    tide_free(e->rows);
}

/* Moves rep's rows to the end of e (rep keeps none of their arrays); 0 when out of memory. */
static int take_rows(events_t *e, tide_proto_events_reply_t *rep)
{
    if (e->n + rep->n_rows > e->cap) {
        size_t nc = (e->n + rep->n_rows) * 2;
        void *p = tide_realloc(e->rows, nc * sizeof *e->rows);
        if (p == NULL)
            return 0;
        e->rows = p;
        e->cap = nc;
    }
    memcpy(e->rows + e->n, rep->rows, rep->n_rows * sizeof *rep->rows);
    e->n += rep->n_rows;
    for (uint32_t i = 0; i < rep->n_rows; i++)
        rep->rows[i].fields.workers = NULL;
    return 1;
}

/* Every event from since_ms on, oldest first, into e. */
static int fetch_events(conn_t *c, int64_t since_ms, events_t *e, FILE *err)
{
    tide_msg_t req;
    tide_msg_init(&req, TIDE_MSG_EVENTS);
    req.u.events.since_ms = since_ms;
    req.u.events.limit = TIDE_PROTO_EVENTS_MAX;
    for (;;) {
        tide_msg_t rep;
        int rc = tidectl__conn_call(c, &req, &rep, err);
        if (rc != TIDECTL_EXIT_OK)
            return rc;
        if (rep.type != TIDE_MSG_EVENTS_REPLY) {
            fprintf(err, "tidectl timeline: tided: %s\n",
                    rep.type == TIDE_MSG_ERROR ? rep.u.error.message : "an unexpected reply");
            tide_msg_clear(&rep);
            return TIDECTL_EXIT_REFUSED;
        }
        uint32_t got = rep.u.events_reply.n_rows;
        if (got > 0)
            req.u.events.since_id = rep.u.events_reply.rows[got - 1].id;
        int ok = take_rows(e, &rep.u.events_reply);
        tide_msg_clear(&rep);
        if (!ok) {
            fprintf(err, "tidectl timeline: out of memory reading the events\n");
            return TIDECTL_EXIT_LOCAL;
        }
        if (got < TIDE_PROTO_EVENTS_MAX)
            return TIDECTL_EXIT_OK;
    }
}

/* Builds the picture and writes it to s->output (or out). */
static int draw(settings_t *s, const char *job, const events_t *e,
                const tide_proto_status_reply_t *st, FILE *out, FILE *err)
{
    tide_timeline_t *t = NULL;
    if (tide_timeline_build(&t, job, e->rows, e->n, st->rows, st->n_rows,
                            st->time_ms > 0 ? st->time_ms : tide_wall_ms()) != TIDE_OK) {
        fprintf(err, "tidectl timeline: %s\n", tide_last_error());
        return TIDECTL_EXIT_REFUSED;
    }
    FILE *f = s->output ? fopen(s->output, "w") : out;
    if (f == NULL) {
        fprintf(err, "tidectl timeline: cannot write %s: %s\n", s->output, strerror(errno));
        tide_timeline_destroy(&t);
        return TIDECTL_EXIT_LOCAL;
    }
    /* FILE.json: the same data as a Chrome trace, for Perfetto */
    size_t n = s->output ? strlen(s->output) : 0;
    int trace = n > 5 && strcmp(s->output + n - 5, ".json") == 0;
    tide_status rc = trace ? tide_timeline_trace(t, f) : tide_timeline_svg(t, f);
    if (f != out && fclose(f) != 0 && rc == TIDE_OK)
        rc = tide_errorf(TIDE_ERR_IO, "closing %s: %s", s->output, strerror(errno));
    if (rc != TIDE_OK) {
        fprintf(err, "tidectl timeline: %s\n", tide_last_error());
        tide_timeline_destroy(&t);
        return TIDECTL_EXIT_LOCAL;
    }
    if (s->output) {
        size_t nr, ns, nm;
        tide_timeline_counts(t, &nr, &ns, &nm);
        fprintf(out, "wrote %s: job %s, %zu GPUs, %zu segments, %zu marks\n", s->output, job, nr,
                ns, nm);
    }
    tide_timeline_destroy(&t);
    return TIDECTL_EXIT_OK;
}

int tidectl__cmd_timeline(settings_t *s, int argc, char **argv, FILE *out, FILE *err)
{
    (void)argc;
    char job[TIDE_PROTO_NAME_MAX + 1];
    int rc = tidectl__copy_job(err, "timeline", "JOB", argv[0], job);
    if (rc != TIDECTL_EXIT_OK)
        return rc;
    int64_t since = 0;
    if (s->since && tidectl_parse_since(s->since, tide_wall_ms(), &since) != TIDE_OK)
        return tidectl__usage_error(err, "timeline", "%s", tide_last_error());
    conn_t c;
    rc = tidectl__conn_open(&c, s, err);
    events_t e = {0};
    tide_msg_t st;
    tide_msg_init(&st, TIDE_MSG_STATUS_REPLY);
    if (rc == TIDECTL_EXIT_OK)
        rc = fetch_events(&c, since, &e, err);
    if (rc == TIDECTL_EXIT_OK)
        rc = tidectl__fetch_status(&c, 1, NULL, &st, err);
    tidectl__conn_close(&c);
    if (rc == TIDECTL_EXIT_OK)
        rc = draw(s, job, &e, &st.u.status_reply, out, err);
    tide_msg_clear(&st);
    events_free(&e);
    return rc;
}
