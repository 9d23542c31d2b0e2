/*
 * tidectl's elastic commands (bounds, priority, pin, unpin: the "elastic" request) and
 * --wait: following tided's events until a switch it started commits or aborts.
 */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "coordinator/tidectl_int.h"
#include "core/clock.h"

#define WAIT_POLL_MS   100    /* between two looks at the events */
#define WAIT_LOOKBACK  600000 /* ms of history searched for the switch's end (clock skew) */
#define WAIT_PAGE_ROWS 1000   /* events per request */

/* Sends req ("elastic") and prints tided's answer. */
static int send_elastic(settings_t *s, tide_msg_t *req, FILE *out, FILE *err)
{
    tide_msg_t rep;
    int rc = tidectl__call_once(s, req, &rep, TIDE_MSG_OK, err);
    if (rc != TIDECTL_EXIT_OK)
        return rc;
    char name[TIDE_PROTO_NAME_MAX + 2], msg[TIDE_PROTO_TEXT_MAX + 2];
    if (s->json) {
        fputs("{\"job\":", out);
        tidectl__json_str_or_null(out, rep.u.ok.job);
        fputs(",\"message\":", out);
        tidectl_json_str(out, rep.u.ok.message);
        fputs("}\n", out);
    } else {
        fprintf(out, "%s: %s\n",
                tidectl__term_str(rep.u.ok.job, sizeof name - 1, name, sizeof name),
                tidectl__term_str(rep.u.ok.message, sizeof msg - 1, msg, sizeof msg));
    }
    rc = tidectl__wait_started(s, rep.u.ok.job, rep.u.ok.gen, out, err);
    tide_msg_clear(&rep);
    return rc;
}

/* An "elastic" request for JOB changing nothing yet; a usage error for cmd on a bad name. */
static int elastic_req(FILE *err, const char *cmd, const char *job, tide_msg_t *req)
{
    tide_msg_init(req, TIDE_MSG_ELASTIC);
    req->u.elastic.priority = -1;
    req->u.elastic.pin = -1;
    req->u.elastic.steps = -1;
    return tidectl__copy_job(err, cmd, "JOB", job, req->u.elastic.job);
}

/* A decimal integer in [lo, hi] from arg into *v; else a usage error for cmd. */
static int int_arg(FILE *err, const char *cmd, const char *what, const char *arg, long long lo,
                   long long hi, long long *v)
{
    char *end;
    long long x = strtoll(arg, &end, 10);
    if (end == arg || *end != '\0' || x < lo || x > hi)
        return tidectl__usage_error(err, cmd, "%s must be an integer in %lld-%lld, not '%s'", what,
                                    lo, hi, arg);
    *v = x;
    return TIDECTL_EXIT_OK;
}

int tidectl__cmd_bounds(settings_t *s, int argc, char **argv, FILE *out, FILE *err)
{
    (void)argc;
    tide_msg_t req;
    long long lo = 0, hi = 0;
    int rc = elastic_req(err, "bounds", argv[0], &req);
    if (rc == TIDECTL_EXIT_OK)
        rc = int_arg(err, "bounds", "MIN", argv[1], 1, 1 << 20, &lo);
    if (rc == TIDECTL_EXIT_OK)
        rc = int_arg(err, "bounds", "MAX", argv[2], 1, 1 << 20, &hi);
    if (rc != TIDECTL_EXIT_OK)
        return rc;
    req.u.elastic.min_gpus = (int32_t)lo;
    req.u.elastic.max_gpus = (int32_t)hi;
    req.u.elastic.steps = s->steps;
    return send_elastic(s, &req, out, err);
}

int tidectl__cmd_priority(settings_t *s, int argc, char **argv, FILE *out, FILE *err)
{
    (void)argc;
    tide_msg_t req;
    long long p = 0;
    int rc = elastic_req(err, "priority", argv[0], &req);
    if (rc == TIDECTL_EXIT_OK)
        rc = int_arg(err, "priority", "P", argv[1], 0, 100, &p);
    if (rc != TIDECTL_EXIT_OK)
        return rc;
    req.u.elastic.priority = (int32_t)p;
    return send_elastic(s, &req, out, err);
}

static int pin(settings_t *s, const char *cmd, const char *job, int on, FILE *out, FILE *err)
{
    tide_msg_t req;
    int rc = elastic_req(err, cmd, job, &req);
    if (rc != TIDECTL_EXIT_OK)
        return rc;
    req.u.elastic.pin = on;
    return send_elastic(s, &req, out, err);
}

int tidectl__cmd_pin(settings_t *s, int argc, char **argv, FILE *out, FILE *err)
{
    (void)argc;
    return pin(s, "pin", argv[0], 1, out, err);
}

int tidectl__cmd_unpin(settings_t *s, int argc, char **argv, FILE *out, FILE *err)
{
    (void)argc;
    return pin(s, "unpin", argv[0], 0, out, err);
}

/* ---- --wait -------------------------------------------------------------------------------- */

/* 1 when row ends generation gen of job: its commit ("resized", "recovered", "rolled_back")
   or its abort ("resize_aborted"), known by the event's typed fields, not its wording. */
static int ends(const tide_proto_event_row_t *row, const char *job, uint64_t gen)
{
    static const char *const kinds[] = {"resized", "recovered", "rolled_back", "resize_aborted"};
    if (strcmp(row->job, job) != 0 || row->fields.gen != gen)
        return 0;
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++)
        if (strcmp(row->kind, kinds[i]) == 0)
            return 1;
    return 0;
}

/* Prints the end of the switch (downtime, bytes) from its event's typed fields; the exit
   code. */
static int print_end(settings_t *s, const tide_proto_event_row_t *row, uint64_t gen, FILE *out,
                     FILE *err)
{
    const tide_proto_event_fields_t *f = &row->fields;
    char why[TIDE_PROTO_TEXT_MAX + 2];
    if (strcmp(row->kind, "resize_aborted") == 0) {
        tidectl__term_str(f->reason[0] ? f->reason : row->detail, sizeof why - 1, why, sizeof why);
        fprintf(err, "tidectl: generation %" PRIu64 " aborted: %s\n", gen, why);
        return TIDECTL_EXIT_ABORTED;
    }
    long long step = f->step;
    if (s->json) {
        fprintf(out,
                "{\"generation\":%" PRIu64 ",\"committed\":true,\"kind\":\"%s\",\"step\":%lld,"
                "\"ms\":%.1f,\"downtime_ms\":%.1f,\"bytes_moved\":%llu,\"event\":",
                gen, row->kind, step, f->ms, f->downtime_ms, (unsigned long long)f->bytes);
        tidectl_json_str(out, row->detail);
        fputs("}\n", out);
    } else {
        fprintf(out,
                "generation %" PRIu64 " committed after step %lld: downtime %.1f ms (the longest "
                "worker switch), %.1f ms from start to commit, %llu bytes moved\n",
                gen, step, f->downtime_ms, f->ms, (unsigned long long)f->bytes);
    }
    return TIDECTL_EXIT_OK;
}

int tidectl__wait_started(settings_t *s, const char *job, uint64_t gen, FILE *out, FILE *err)
{
    if (!s->wait)
        return TIDECTL_EXIT_OK;
    if (gen == 0) {
        if (!s->json)
            fprintf(out, "no switch started: nothing to wait for\n");
        return TIDECTL_EXIT_OK;
    }
    fflush(out);
    return tidectl__wait_switch(s, job, gen, out, err);
}

/* The progress line of a wait on a terminal (stderr): the time waited and the job's last
   event, rewritten in place; nothing when stderr is not a terminal. */
typedef struct progress {
    int on;
    uint64_t t0;
    char last[48];
} progress;

static void progress_show(progress *p, const char *what, FILE *err)
{
    if (!p->on)
        return;
    fprintf(err, "\r\033[Ktidectl: waiting for %s: %.1f s%s%s", what,
            (double)(tide_now_ns() - p->t0) / 1e9, p->last[0] ? ", last event " : "", p->last);
    fflush(err);
}

static void progress_end(progress *p, FILE *err)
{
    if (p->on)
        fputs("\r\033[K", err);
}

/* What a wait waits for: the job, its words for messages, and the row that ends it. */
typedef struct waiter {
    const char *job;
    char what[TIDE_PROTO_NAME_MAX + 64]; /* "generation 3 of mlp" */
    uint64_t gen;                        /* the switch waited for (wait_switch) */
    /* -1 when row does not end the wait; else the exit code, its end printed */
    int (*end)(settings_t *s, const struct waiter *w, const tide_proto_event_row_t *row, FILE *out,
               FILE *err);
} waiter;

/* Follows tided's events after event since_id (0: the last WAIT_LOOKBACK ms) until w's end
   or s->wait_ms. Blocks. */
static int follow(settings_t *s, const waiter *w, uint64_t since_id, FILE *out, FILE *err)
{
    progress pr = {.on = isatty(fileno(err)) && !s->json, .t0 = tide_now_ns()};
    conn_t c;
    int rc = tidectl__conn_open(&c, s, err);
    int64_t since_ms = since_id ? 0 : tide_wall_ms() - WAIT_LOOKBACK;
    uint64_t deadline = tide_now_ns() + (uint64_t)s->wait_ms * 1000000ull;
    if (rc == TIDECTL_EXIT_OK)
        progress_show(&pr, w->what, err);
    while (rc == TIDECTL_EXIT_OK) {
        tide_msg_t req, rep;
        tide_msg_init(&req, TIDE_MSG_EVENTS);
        req.u.events.since_id = since_id;
        req.u.events.since_ms = since_ms > 0 ? since_ms : 0;
        req.u.events.limit = WAIT_PAGE_ROWS;
        tide_msg_init(&rep, TIDE_MSG_NONE);
        rc = tidectl__conn_call(&c, &req, &rep, err);
        if (rc == TIDECTL_EXIT_OK && rep.type != TIDE_MSG_EVENTS_REPLY) {
            progress_end(&pr, err);
            fprintf(err, "tidectl: waiting for %s: %s\n", w->what,
                    rep.type == TIDE_MSG_ERROR ? rep.u.error.message : "unexpected reply");
            rc = TIDECTL_EXIT_REFUSED;
        }
        const tide_proto_events_reply_t *er = &rep.u.events_reply;
        for (uint32_t i = 0; rc == TIDECTL_EXIT_OK && i < er->n_rows; i++) {
            since_id = er->rows[i].id;
            if (strcmp(er->rows[i].job, w->job) != 0)
                continue;
            snprintf(pr.last, sizeof pr.last, "%.47s", er->rows[i].kind);
            progress_end(&pr, err);
            int end = w->end(s, w, &er->rows[i], out, err);
            if (end >= 0) {
                tide_msg_clear(&rep);
                tidectl__conn_close(&c);
                return end;
            }
        }
        int full = rc == TIDECTL_EXIT_OK && er->n_rows == WAIT_PAGE_ROWS;
        tide_msg_clear(&rep);
        if (rc == TIDECTL_EXIT_OK && !full && tide_now_ns() > deadline) {
            progress_end(&pr, err);
            fprintf(err,
                    "tidectl: %s did not end within %lld ms (tidectl events shows where it is)\n",
                    w->what, s->wait_ms);
            rc = TIDECTL_EXIT_TIMEOUT;
        } else if (rc == TIDECTL_EXIT_OK && !full) {
            progress_show(&pr, w->what, err);
            tide_sleep_ms(WAIT_POLL_MS);
        }
    }
    progress_end(&pr, err);
    tidectl__conn_close(&c);
    return rc;
}

static int switch_end(settings_t *s, const waiter *w, const tide_proto_event_row_t *row, FILE *out,
                      FILE *err)
{
    return ends(row, w->job, w->gen) ? print_end(s, row, w->gen, out, err) : -1;
}

int tidectl__wait_switch(settings_t *s, const char *job, uint64_t gen, FILE *out, FILE *err)
{
    waiter w = {.job = job, .gen = gen, .end = switch_end};
    snprintf(w.what, sizeof w.what, "generation %" PRIu64 " of %s", gen, job);
    return follow(s, &w, 0, out, err);
}

/* ---- grow --wait ----------------------------------------------------------------------------- */

static int workers_of(int dp, int tp, int pp)
{
    return dp * (tp > 0 ? tp : 1) * (pp > 0 ? pp : 1);
}

/* A grow ends when a switch of the job to more workers commits or aborts, or when what
   tided asked of its provider ends without one (refused, skipped, cancelled, ended). */
static int grow_end(settings_t *s, const waiter *w, const tide_proto_event_row_t *row, FILE *out,
                    FILE *err)
{
    static const char *const failed[] = {"grow_refused", "grow_skipped", "allocation_cancelled",
                                         "allocation_ended"};
    const tide_proto_event_fields_t *f = &row->fields;
    int grows = workers_of(f->dp, f->tp, f->pp) > workers_of(f->from_dp, f->from_tp, f->from_pp);
    if ((strcmp(row->kind, "resized") == 0 || strcmp(row->kind, "resize_aborted") == 0) && grows)
        return print_end(s, row, f->gen, out, err);
    for (size_t i = 0; i < sizeof failed / sizeof failed[0]; i++) {
        if (strcmp(row->kind, failed[i]) != 0)
            continue;
        char why[TIDE_PROTO_TEXT_MAX + 2];
        tidectl__term_str(f->reason[0] ? f->reason : row->detail, sizeof why - 1, why, sizeof why);
        fprintf(err, "tidectl: %s ended without growing (%s): %s\n", w->what, row->kind, why);
        return TIDECTL_EXIT_ABORTED;
    }
    return -1;
}

int tidectl__wait_grow(settings_t *s, const char *job, uint64_t since_id, FILE *out, FILE *err)
{
    waiter w = {.job = job, .end = grow_end};
    snprintf(w.what, sizeof w.what, "the grow of %s", job);
    fflush(out);
    return follow(s, &w, since_id, out, err);
}

int tidectl__newest_event(settings_t *s, uint64_t *id, FILE *err)
{
    tide_msg_t req, rep;
    tide_msg_init(&req, TIDE_MSG_EVENTS);
    req.u.events.newest = 1;
    req.u.events.limit = 1;
    int rc = tidectl__call_once(s, &req, &rep, TIDE_MSG_EVENTS_REPLY, err);
    if (rc != TIDECTL_EXIT_OK)
        return rc;
    *id = rep.u.events_reply.n_rows > 0 ? rep.u.events_reply.rows[0].id : 0;
    tide_msg_clear(&rep);
    return TIDECTL_EXIT_OK;
}
