/*
 * tidectl events: the event history, filtered by job, kind and time, newest first as a
 * table or oldest first as JSON lines, and --follow to keep printing new events. The
 * filters run in tided (coordinator/store_events.c); this file builds the request and
 * prints. Workload: one request, or one every FOLLOW_MS while following.
 */
#include <string.h>
#include <unistd.h>

#include "coordinator/tidectl_int.h"
#include "core/clock.h"

#define FOLLOW_MS 500 /* ms between two polls of --follow */

/* The request s's flags ask for (newest first); a usage error's exit code on err. */
static int build_request(settings_t *s, tide_msg_t *req, FILE *err)
{
    tide_msg_init(req, TIDE_MSG_EVENTS);
    tide_proto_events_t *q = &req->u.events;
    q->since_id = (uint64_t)s->after;
    q->limit = (uint32_t)(s->tail > 0 ? s->tail : s->limit);
    q->newest = 1;
    int64_t now = tide_wall_ms();
    if (s->since && tidectl_parse_since(s->since, now, &q->since_ms) != TIDE_OK)
        return tidectl__usage_error(err, "events", "%s", tide_last_error());
    if (s->until && tidectl_parse_since(s->until, now, &q->until_ms) != TIDE_OK)
        return tidectl__usage_error(err, "events", "--until: %s", tide_last_error());
    if (s->until && q->until_ms <= q->since_ms)
        return tidectl__usage_error(err, "events", "--until must be later than --since");
    if (s->job) {
        int rc = tidectl__copy_job(err, "events", "--job", s->job, q->job);
        if (rc != TIDECTL_EXIT_OK)
            return rc;
    }
    if (s->type) {
        size_t n = strlen(s->type);
        if (n == 0 || n > TIDE_PROTO_NAME_MAX ||
            strspn(s->type, "abcdefghijklmnopqrstuvwxyz"
                            "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
                            "0123456789._:-*?") != n)
            return tidectl__usage_error(err, "events",
                                        "--type '%s' is not an event kind (letters, digits, "
                                        "._:- and the globs * ?, at most %d)",
                                        s->type, TIDE_PROTO_NAME_MAX);
        memcpy(q->kind, s->type, n + 1);
    }
    return TIDECTL_EXIT_OK;
}

/* One event on one line (--follow's text form). */
static void print_line(FILE *out, const tide_proto_event_row_t *e)
{
    char when[40], job[64], kind[64], detail[TIDE_PROTO_TEXT_MAX + 2];
    tidectl__fmt_time(e->time_ms, when, sizeof when);
    tidectl__term_str(e->job[0] ? e->job : "-", 24, job, sizeof job);
    tidectl__term_str(e->kind, 24, kind, sizeof kind);
    tidectl__term_str(e->detail, sizeof detail - 1, detail, sizeof detail);
    fprintf(out, "%llu  %s  %s  %s  %s\n", (unsigned long long)e->id, when, job, kind, detail);
}

/* Prints rows [0, n) from the last to the first (oldest first: the reply is newest first
   or, following, rows in order when in_order); returns the largest id printed or last. */
static uint64_t print_rows(FILE *out, const tide_proto_events_reply_t *r, int json, int in_order,
                           uint64_t last)
{
    for (uint32_t k = 0; k < r->n_rows; k++) {
        const tide_proto_event_row_t *e = &r->rows[in_order ? k : r->n_rows - 1 - k];
        if (json)
            tidectl__event_json(out, e);
        else
            print_line(out, e);
        if (e->id > last)
            last = e->id;
    }
    fflush(out);
    return last;
}

/* --follow: polls for events after id `last` until tided fails to answer. */
static int follow(settings_t *s, conn_t *c, tide_msg_t *req, uint64_t last, FILE *out, FILE *err)
{
    req->u.events.newest = 0;
    req->u.events.limit = TIDE_PROTO_EVENTS_MAX;
    for (;;) {
        usleep(FOLLOW_MS * 1000);
        req->u.events.since_id = last;
        tide_msg_t rep;
        int rc = tidectl__conn_call(c, req, &rep, err);
        if (rc != TIDECTL_EXIT_OK)
            return rc;
        if (rep.type != TIDE_MSG_EVENTS_REPLY) {
            fprintf(err, "tidectl events: tided: %s\n",
                    rep.type == TIDE_MSG_ERROR ? rep.u.error.message : "an unexpected reply");
            tide_msg_clear(&rep);
            return TIDECTL_EXIT_REFUSED;
        }
        last = print_rows(out, &rep.u.events_reply, s->json, 1, last);
        tide_msg_clear(&rep);
    }
}

int tidectl__cmd_events(settings_t *s, int argc, char **argv, FILE *out, FILE *err)
{
    (void)argc;
    (void)argv;
    tide_msg_t req, rep;
    int rc = build_request(s, &req, err);
    if (rc != TIDECTL_EXIT_OK)
        return rc;
    conn_t c;
    rc = tidectl__conn_open(&c, s, err);
    if (rc == TIDECTL_EXIT_OK)
        rc = tidectl__conn_call(&c, &req, &rep, err);
    if (rc == TIDECTL_EXIT_OK && rep.type != TIDE_MSG_EVENTS_REPLY) {
        fprintf(err, "tidectl events: tided: %s\n",
                rep.type == TIDE_MSG_ERROR ? rep.u.error.message : "an unexpected reply");
        tide_msg_clear(&rep);
        rc = TIDECTL_EXIT_REFUSED;
    }
    if (rc != TIDECTL_EXIT_OK) {
        tidectl__conn_close(&c);
        return rc;
    }
    uint64_t last = s->after > 0 ? (uint64_t)s->after : 0;
    if (s->follow || s->json)
        last = print_rows(out, &rep.u.events_reply, s->json, 0, last);
    else
        tidectl_print_events(out, &rep.u.events_reply, 0);
    tide_msg_clear(&rep);
    if (s->follow)
        rc = follow(s, &c, &req, last, out, err);
    tidectl__conn_close(&c);
    return rc;
}
