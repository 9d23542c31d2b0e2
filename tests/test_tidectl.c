/*
 * Unit tests for tidectl (coordinator/tidectl.c built with TIDECTL_NO_MAIN):
 * argument parsing and table/JSON formatting as pure functions, then the whole
 * CLI against a fake tided -- a ZeroMQ ROUTER on a free loopback port in a
 * thread that checks each request and answers with a canned reply (or not at
 * all, or over CURVE, or with a ZAP handler that refuses the key). Checks the
 * exit codes scripts rely on: 0 ok, 1 refused, 2 usage, 3 unreachable, 4 timeout.
 */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zmq.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include "coordinator/tidectl.h"
#include "coordinator/tidectl_int.h"
#include "core/alloc.h"
#include "core/clock.h"
#include "core/error.h"
#include "proto/proto.h"

/* ---- capture of tidectl_main's output
 * ------------------------------------------------------------ */

typedef struct run {
    int rc;
    char *out, *err;
    size_t out_len, err_len;
} run_t;

/* Runs tidectl with a NULL-terminated argument list (argv[0] added). */
static run_t run_cli(const char *first, ...)
{
    char *argv[64];
    int argc = 0;
    argv[argc++] = "tidectl";
    va_list ap;
    va_start(ap, first);
    for (const char *a = first; a != NULL && argc < 63; a = va_arg(ap, const char *))
        argv[argc++] = (char *)a;
    va_end(ap);
    argv[argc] = NULL;
    run_t r = {0};
    FILE *out = open_memstream(&r.out, &r.out_len);
    FILE *err = open_memstream(&r.err, &r.err_len);
    r.rc = tidectl_main(argc, argv, out, err);
    fclose(out);
    fclose(err);
    return r;
}

static void run_free(run_t *r)
{
    free(r->out);
    free(r->err);
}

/* ---- the fake tided
 * ---------------------------------------------------------------------------------- */

typedef enum { FAKE_REPLY, FAKE_SILENT } fake_mode;

typedef struct fake {
    void *ctx, *router, *zap;
    char endpoint[128];
    fake_mode mode;
    int zap_deny;
    /* builds the reply for a request; runs on the fake's thread */
    void (*answer)(const tide_msg_t *req, tide_msg_t *rep, struct fake *f);
    tide_msg_t last; /* last request, decoded (owned) */
    int requests;    /* number of requests received */
    int bad_frames;  /* requests not in the [id][""][payload] envelope */
    atomic_int stop;
    pthread_t thread;
} fake_t;

static void answer_zap(fake_t *f)
{
    zmq_msg_t fr[8];
    int n = 0, more = 1;
    while (more && n < 8) {
        zmq_msg_init(&fr[n]);
        if (zmq_msg_recv(&fr[n], f->zap, 0) < 0)
            return;
        more = zmq_msg_more(&fr[n]);
        n++;
    }
    zmq_send(f->zap, "1.0", 3, ZMQ_SNDMORE);
    zmq_send(f->zap, zmq_msg_data(&fr[1]), zmq_msg_size(&fr[1]), ZMQ_SNDMORE);
    zmq_send(f->zap, f->zap_deny ? "400" : "200", 3, ZMQ_SNDMORE);
    zmq_send(f->zap, f->zap_deny ? "denied" : "OK", f->zap_deny ? 6 : 2, ZMQ_SNDMORE);
    zmq_send(f->zap, "admin:test", 10, ZMQ_SNDMORE);
    zmq_send(f->zap, "", 0, 0);
    for (int i = 0; i < n; i++)
        zmq_msg_close(&fr[i]);
}

static void *fake_main(void *arg)
{
    fake_t *f = arg;
    while (!atomic_load(&f->stop)) {
        zmq_pollitem_t items[2] = {{f->router, 0, ZMQ_POLLIN, 0}, {f->zap, 0, ZMQ_POLLIN, 0}};
        if (zmq_poll(items, f->zap ? 2 : 1, 20) <= 0)
            continue;
        if (f->zap && (items[1].revents & ZMQ_POLLIN))
            answer_zap(f);
        if (!(items[0].revents & ZMQ_POLLIN))
            continue;
        zmq_msg_t fr[4];
        int n = 0, more = 1;
        while (more) {
            zmq_msg_t tmp;
            zmq_msg_init(&tmp);
            zmq_msg_recv(&tmp, f->router, 0);
            more = zmq_msg_more(&tmp);
            if (n < 4)
                fr[n++] = tmp;
            else
                zmq_msg_close(&tmp);
        }
        f->requests++;
        if (n != 3 || zmq_msg_size(&fr[1]) != 0)
            f->bad_frames++;
        tide_msg_clear(&f->last);
        tide_msg_t rep;
        tide_msg_init(&rep, TIDE_MSG_NONE);
        if (tide_proto_decode(zmq_msg_data(&fr[n - 1]), zmq_msg_size(&fr[n - 1]), &f->last) !=
            TIDE_OK) {
            tide_msg_init(&rep, TIDE_MSG_ERROR);
            rep.u.error.code = TIDE_ERR_PROTOCOL;
            snprintf(rep.u.error.message, sizeof rep.u.error.message, "%s", tide_last_error());
        } else {
            f->answer(&f->last, &rep, f);
        }
        if (f->mode == FAKE_REPLY) {
            tide_proto_buf_t b;
            tide_proto_buf_init(&b);
            if (tide_proto_encode(&rep, &b) == TIDE_OK) {
                zmq_send(f->router, zmq_msg_data(&fr[0]), zmq_msg_size(&fr[0]), ZMQ_SNDMORE);
                zmq_send(f->router, "", 0, ZMQ_SNDMORE);
                zmq_send(f->router, b.data, b.len, 0);
            }
            tide_proto_buf_destroy(&b);
        }
        tide_msg_clear(&rep);
        for (int i = 0; i < n; i++)
            zmq_msg_close(&fr[i]);
    }
    return NULL;
}

/* Starts a fake tided on a free loopback port; server_secret non-NULL turns CURVE on. */
static void fake_start(fake_t *f, fake_mode mode,
                       void (*answer)(const tide_msg_t *, tide_msg_t *, fake_t *),
                       const char *server_secret, int with_zap, int zap_deny)
{
    memset(f, 0, sizeof *f);
    tide_msg_init(&f->last, TIDE_MSG_NONE);
    f->mode = mode;
    f->answer = answer;
    f->zap_deny = zap_deny;
    f->ctx = zmq_ctx_new();
    if (with_zap) {
        f->zap = zmq_socket(f->ctx, ZMQ_REP);
        cr_assert_eq(zmq_bind(f->zap, "inproc://zeromq.zap.01"), 0);
    }
    f->router = zmq_socket(f->ctx, ZMQ_ROUTER);
    int zero = 0, one = 1;
    zmq_setsockopt(f->router, ZMQ_LINGER, &zero, sizeof zero);
    if (server_secret) {
        zmq_setsockopt(f->router, ZMQ_CURVE_SERVER, &one, sizeof one);
        cr_assert_eq(zmq_setsockopt(f->router, ZMQ_CURVE_SECRETKEY, server_secret, 41), 0);
    }
    cr_assert_eq(zmq_bind(f->router, "tcp://127.0.0.1:*"), 0);
    size_t len = sizeof f->endpoint;
    zmq_getsockopt(f->router, ZMQ_LAST_ENDPOINT, f->endpoint, &len);
    pthread_create(&f->thread, NULL, fake_main, f);
}

static void fake_stop(fake_t *f)
{
    atomic_store(&f->stop, 1);
    pthread_join(f->thread, NULL);
    if (f->zap)
        zmq_close(f->zap);
    zmq_close(f->router);
    zmq_ctx_term(f->ctx);
    tide_msg_clear(&f->last);
}

/* ---- canned answers
 * ------------------------------------------------------------------------------------ */

static void answer_status(const tide_msg_t *req, tide_msg_t *rep, fake_t *f)
{
    if (req->type == TIDE_MSG_JOBS) {
        tide_msg_init(rep, TIDE_MSG_JOBS_REPLY);
        rep->u.jobs_reply.n_rows = 2;
        rep->u.jobs_reply.rows = tide_calloc(2, sizeof(tide_proto_job_row_t));
        tide_proto_job_row_t *j = rep->u.jobs_reply.rows;
        strcpy(j[0].name, "llm");
        j[0].kind = TIDE_JOB_ONLINE;
        j[0].state = TIDE_JOB_RUNNING;
        j[0].gen = 3;
        j[0].dp = 2;
        j[0].tp = 1;
        j[0].pp = 2;
        j[0].workers = 4;
        j[0].step = 1200;
        j[0].throughput = 3.25;
        j[0].priority = 7;
        j[0].min_gpus = 4;
        j[0].max_gpus = 12;
        j[0].hold = 1;
        strcpy(j[1].name, "sweep");
        j[1].kind = TIDE_JOB_COMMAND;
        j[1].state = TIDE_JOB_QUEUED;
        j[1].priority = -5;
        j[1].attempts = 2;
        return;
    }
    tide_msg_init(rep, TIDE_MSG_STATUS_REPLY);
    rep->u.status_reply.time_ms = 1700000001000;
    rep->u.status_reply.n_rows = 2;
    rep->u.status_reply.rows = tide_calloc(2, sizeof(tide_proto_gpu_row_t));
    tide_proto_gpu_row_t *g = rep->u.status_reply.rows;
    g[0].worker = 0;
    strcpy(g[0].host, "node-a");
    g[0].pid = 4242;
    strcpy(g[0].pool, "launch-7");
    g[0].pool_rank = 1;
    g[0].kind = TIDE_DEVICE_GPU;
    g[0].state = TIDE_WORKER_ONLINE;
    g[0].mem_bytes = 80ull << 30;
    strcpy(g[0].job, "llm");
    g[0].stage = 1;
    g[0].dp_rank = 0;
    g[0].tp_rank = 0;
    g[0].step = 1200;
    g[0].bubble_pct = 12.5;
    g[0].last_seen_ms = 1700000000600;
    g[1].worker = 17;
    strcpy(g[1].host, "a-much-longer-host-name.example");
    g[1].pool_rank = 3; /* pid 0 and pool "": tided does not know them */
    g[1].device = 3;
    g[1].kind = TIDE_DEVICE_GPU;
    g[1].state = TIDE_WORKER_IDLE;
    g[1].mem_bytes = 40ull << 30;
    g[1].stage = g[1].dp_rank = g[1].tp_rank = -1;
    strcpy(g[1].offline, "sweep");
    g[1].last_seen_ms = 1700000000900;
    rep->u.status_reply.total = 2;
    rep->u.status_reply.next = -1;
}

/* A worker table of 7 rows (ids 0, 3, 6, ... 18; the last one left) that the fake hands
   out 2 rows a page from the request's `from`: tidectl must follow the pages. */
static void answer_status_paged(const tide_msg_t *req, tide_msg_t *rep, fake_t *f)
{
    (void)f;
    const tide_proto_status_t *q = &req->u.status;
    int n_all = q->all ? 7 : 6;
    tide_msg_init(rep, TIDE_MSG_STATUS_REPLY);
    tide_proto_status_reply_t *x = &rep->u.status_reply;
    x->time_ms = 1700000001000;
    x->total = (uint32_t)n_all;
    x->next = -1;
    x->rows = tide_calloc(2, sizeof *x->rows);
    for (int k = 0; k < n_all; k++) {
        int32_t id = 3 * k;
        if (id < q->from)
            continue;
        if (x->n_rows == 2) {
            x->next = id;
            break;
        }
        tide_proto_gpu_row_t *g = &x->rows[x->n_rows++];
        g->worker = id;
        snprintf(g->host, sizeof g->host, "page-host-%d", (int)id);
        g->kind = TIDE_DEVICE_CPU;
        g->state = k == 6 ? TIDE_WORKER_LEFT : TIDE_WORKER_IDLE;
        g->stage = g->dp_rank = g->tp_rank = -1;
    }
}

static void answer_resize(const tide_msg_t *req, tide_msg_t *rep, fake_t *f)
{
    const tide_proto_resize_t *r = &req->u.resize;
    tide_msg_init(rep, TIDE_MSG_RESIZE_REPLY);
    tide_proto_resize_reply_t *x = &rep->u.resize_reply;
    strcpy(x->job, r->job);
    x->dry_run = r->dry_run;
    x->layout.gen = 4;
    x->layout.dp = r->dp;
    x->layout.tp = r->tp;
    x->layout.pp = r->pp;
    x->layout.num_layers = 24;
    x->layout.micro_batches = 8;
    x->layout.stage_start = tide_malloc(((size_t)r->pp + 1) * sizeof(int));
    for (int s = 0; s <= r->pp; s++)
        x->layout.stage_start[s] = r->n_stages ? r->stage_start[s] : s * 24 / r->pp;
    size_t n = (size_t)r->dp * (size_t)r->tp * (size_t)r->pp;
    x->layout.worker = tide_malloc(n * sizeof(int32_t));
    for (size_t i = 0; i < n; i++)
        x->layout.worker[i] = (int32_t)i;
    x->bytes_sent = 3ull << 30;
    x->bytes_default = 27ull << 30;
    x->bytes_local = 1ull << 30;
    x->max_send = 512ull << 20;
    x->messages = 12;
    x->est_ms = 1800;
    x->preempted = 1;
}

static void answer_ok(const tide_msg_t *req, tide_msg_t *rep, fake_t *f)
{
    tide_msg_init(rep, TIDE_MSG_OK);
    if (req->type == TIDE_MSG_SUBMIT)
        strcpy(rep->u.ok.job, req->u.submit.name);
    snprintf(rep->u.ok.message, sizeof rep->u.ok.message, "%s accepted",
             tide_msg_type_name(req->type));
}

static void answer_error(const tide_msg_t *req, tide_msg_t *rep, fake_t *f)
{
    tide_msg_init(rep, TIDE_MSG_ERROR);
    rep->u.error.code = TIDE_ERR_NOT_FOUND;
    strcpy(rep->u.error.message, "no job 'ghost': see tidectl jobs");
}

static void answer_events(const tide_msg_t *req, tide_msg_t *rep, fake_t *f)
{
    tide_msg_init(rep, TIDE_MSG_EVENTS_REPLY);
    rep->u.events_reply.n_rows = 2;
    rep->u.events_reply.rows = tide_calloc(2, sizeof(tide_proto_event_row_t));
    tide_proto_event_row_t *e = rep->u.events_reply.rows;
    e[0].id = 41;
    e[0].time_ms = 1700000000000;
    strcpy(e[0].kind, "worker_failed");
    strcpy(e[0].detail, "worker 3 missed 3 heartbeats\nline2");
    e[1].id = 42;
    e[1].time_ms = 1700000000500;
    strcpy(e[1].job, "llm");
    strcpy(e[1].kind, "resize");
    strcpy(e[1].detail, "dp 2 -> 4 \"fast\"");
    e[0].fields.step = e[1].fields.step = -1;
    e[1].fields.gen = 7;
    e[1].fields.dp = 4, e[1].fields.tp = 1, e[1].fields.pp = 1;
    e[1].fields.workers = tide_calloc(4, sizeof(int32_t));
    for (int i = 0; i < 4; i++)
        e[1].fields.workers[i] = 10 + i;
    e[1].fields.n_workers = 4;
    e[1].fields.ms = 8.25;
}

/* ---- pure pieces
 * ---------------------------------------------------------------------------------------- */

Test(tidectl_parse, stages)
{
    int *s;
    uint32_t n;
    cr_assert_eq(tidectl_parse_stages("0-11,12-23", &s, &n), TIDE_OK, "%s", tide_last_error());
    cr_expect_eq(n, 3u);
    cr_expect(s[0] == 0 && s[1] == 12 && s[2] == 24);
    tide_free(s);
    cr_assert_eq(tidectl_parse_stages("0-3,4,5-9", &s, &n), TIDE_OK);
    cr_expect(n == 4 && s[1] == 4 && s[2] == 5 && s[3] == 10);
    tide_free(s);
    cr_expect_eq(tidectl_parse_stages("1-5", &s, &n), TIDE_ERR_INVALID);
    cr_expect(strstr(tide_last_error(), "stage 0 starts at layer 1 but must start at 0"));
    cr_expect_eq(tidectl_parse_stages("0-5,7-9", &s, &n), TIDE_ERR_INVALID);
    cr_expect(strstr(tide_last_error(), "stage 1 starts at layer 7 but must start at 6"));
    cr_expect_eq(tidectl_parse_stages("0-5,", &s, &n), TIDE_ERR_INVALID);
    cr_expect_eq(tidectl_parse_stages("0-x", &s, &n), TIDE_ERR_INVALID);
    cr_expect_eq(tidectl_parse_stages("", &s, &n), TIDE_ERR_INVALID);
    cr_expect_eq(tidectl_parse_stages("0-5,6-3", &s, &n), TIDE_ERR_INVALID);
    cr_expect_null(s);
}

Test(tidectl_parse, since)
{
    int64_t now = 1700000000000, v;
    cr_assert_eq(tidectl_parse_since("10m", now, &v), TIDE_OK);
    cr_expect_eq(v, now - 600000);
    cr_assert_eq(tidectl_parse_since("90s", now, &v), TIDE_OK);
    cr_expect_eq(v, now - 90000);
    cr_assert_eq(tidectl_parse_since("1d", now, &v), TIDE_OK);
    cr_expect_eq(v, now - 86400000);
    cr_assert_eq(tidectl_parse_since("2024-05-01T12:00:00Z", now, &v), TIDE_OK);
    cr_expect_eq(v, 1714564800000);
    cr_assert_eq(tidectl_parse_since("2024-05-01 12:00Z", now, &v), TIDE_OK);
    cr_expect_eq(v, 1714564800000);
    cr_assert_eq(tidectl_parse_since("1699999999000", now, &v), TIDE_OK);
    cr_expect_eq(v, 1699999999000);
    cr_expect_eq(tidectl_parse_since("yesterday", now, &v), TIDE_ERR_INVALID);
    cr_expect(strstr(tide_last_error(), "--since 'yesterday'"));
    cr_expect_eq(tidectl_parse_since("2024-13-01", now, &v), TIDE_ERR_INVALID);
}

Test(tidectl_parse, bytes_and_formatting)
{
    uint64_t b;
    cr_assert_eq(tidectl_parse_bytes("16G", &b), TIDE_OK);
    cr_expect_eq(b, 16ull << 30);
    cr_assert_eq(tidectl_parse_bytes("512MiB", &b), TIDE_OK);
    cr_expect_eq(b, 512ull << 20);
    cr_assert_eq(tidectl_parse_bytes("1.5K", &b), TIDE_OK);
    cr_expect_eq(b, 1536u);
    cr_assert_eq(tidectl_parse_bytes("1000", &b), TIDE_OK);
    cr_expect_eq(b, 1000u);
    cr_expect_eq(tidectl_parse_bytes("16Q", &b), TIDE_ERR_INVALID);
    cr_expect_eq(tidectl_parse_bytes("-1G", &b), TIDE_ERR_INVALID);
    cr_expect_eq(tidectl_parse_bytes("lots", &b), TIDE_ERR_INVALID);
    char buf[32];
    cr_expect_str_eq(tidectl_fmt_bytes(512, buf, sizeof buf), "512 B");
    cr_expect_str_eq(tidectl_fmt_bytes(3ull << 30, buf, sizeof buf), "3.00 GiB");
    cr_expect_str_eq(tidectl_fmt_bytes(1536, buf, sizeof buf), "1.50 KiB");
}

Test(tidectl_format, json_strings_are_escaped_and_valid_utf8)
{
    char *s;
    size_t len;
    FILE *f = open_memstream(&s, &len);
    tidectl_json_str(f, "a\"b\\c\nd\te\x01 caf\xc3\xa9 bad\xff end");
    fclose(f);
    cr_expect_str_eq(s, "\"a\\\"b\\\\c\\nd\\te\\u0001 caf\xc3\xa9 bad\\ufffd end\"");
    free(s);
}

/* Column start of needle in the line that contains it. */
static long col_of(const char *text, const char *needle)
{
    const char *p = strstr(text, needle);
    if (p == NULL)
        return -1;
    const char *line = p;
    while (line > text && line[-1] != '\n')
        line--;
    return (long)(p - line);
}

Test(tidectl_format, status_table_is_aligned)
{
    tide_msg_t rep, req;
    tide_msg_init(&req, TIDE_MSG_STATUS);
    answer_status(&req, &rep, NULL);
    char *s;
    size_t len;
    FILE *f = open_memstream(&s, &len);
    tidectl_print_status(f, &rep.u.status_reply, 0);
    fclose(f);
    cr_expect(strstr(s, "2 GPUs: 1 online, 0 offline work, 1 idle, 0 draining, 0 failed"), "%s", s);
    /* left-aligned columns start where their header starts */
    cr_expect_eq(col_of(s, "STATE"), col_of(s, "online  "), "%s", s);
    cr_expect_eq(col_of(s, "STATE"), col_of(s, "idle  "), "%s", s);
    cr_expect_eq(col_of(s, "HOST"), col_of(s, "node-a"), "%s", s);
    cr_expect_eq(col_of(s, "ROLE"), col_of(s, "pp1/dp0/tp0"), "%s", s);
    cr_expect_eq(col_of(s, "OFFLINE"), col_of(s, "sweep"), "%s", s);
    cr_expect(strstr(s, "80.00 GiB"), "%s", s);
    cr_expect(strstr(s, "400 ms ago"), "%s", s);
    cr_expect(strstr(s, "12.5"), "%s", s);
    /* no line ends in blanks */
    cr_expect_null(strstr(s, " \n"), "%s", s);
    free(s);
    f = open_memstream(&s, &len);
    tidectl_print_status(f, &rep.u.status_reply, 1);
    fclose(f);
    cr_expect(strstr(s, "{\"time_ms\":1700000001000,\"ompi_server\":\"\",\"gpus\":[{\"worker\":0,"
                        "\"host\":\"node-a\""),
              "%s", s);
    cr_expect(strstr(s, "\"job\":null"), "%s", s);
    cr_expect(strstr(s, "\"offline\":\"sweep\""), "%s", s);
    cr_expect_eq(s[len - 1], '\n');
    free(s);
    tide_msg_clear(&rep);
}

/* -o wide: the columns that say which process a row is (pool, rank in it, pid on HOST),
   after the usual ones, aligned like them; the plain table stays as it was. JSON always
   carries them. */
Test(tidectl_format, status_wide_maps_rows_to_processes)
{
    tide_msg_t rep, req;
    tide_msg_init(&req, TIDE_MSG_STATUS);
    answer_status(&req, &rep, NULL);
    char *s;
    size_t len;
    FILE *f = open_memstream(&s, &len);
    tidectl_print_status(f, &rep.u.status_reply, TIDECTL_WIDE);
    fclose(f);
    cr_expect_eq(col_of(s, "HOST"), col_of(s, "node-a"), "%s", s);
    cr_expect_eq(col_of(s, "POOL"), col_of(s, "launch-7"), "%s", s);
    cr_expect_gt(col_of(s, "POOL"), col_of(s, "SEEN"), "after the usual columns: %s", s);
    cr_expect_eq(col_of(s, "PID") + (long)strlen("PID"), col_of(s, "4242") + 4,
                 "numbers right-aligned under their header:\n%s", s);
    /* the second row: rank 3 of no known pool, no known pid */
    const char *row2 = strstr(s, "a-much-longer-host-name.example");
    cr_assert_not_null(row2, "%s", s);
    char line[512];
    snprintf(line, sizeof line, "%.*s", (int)strcspn(row2, "\n"), row2);
    const char *last[3] = {"", "", ""}; /* its POOL, RANK and PID cells */
    for (char *tok = strtok(line, " "); tok != NULL; tok = strtok(NULL, " ")) {
        last[0] = last[1];
        last[1] = last[2];
        last[2] = tok;
    }
    cr_expect(strcmp(last[0], "-") == 0 && strcmp(last[1], "3") == 0 && strcmp(last[2], "-") == 0,
              "POOL RANK PID of the second row: '%s' '%s' '%s'", last[0], last[1], last[2]);
    cr_expect_null(strstr(s, " \n"), "%s", s);
    free(s);
    f = open_memstream(&s, &len);
    tidectl_print_status(f, &rep.u.status_reply, TIDECTL_TABLE);
    fclose(f);
    cr_expect_null(strstr(s, "PID"), "the plain table has no PID column: %s", s);
    cr_expect_null(strstr(s, "launch-7"), "%s", s);
    free(s);
    f = open_memstream(&s, &len);
    tidectl_print_status(f, &rep.u.status_reply, TIDECTL_JSON);
    fclose(f);
    /* the keys that came first stay first, in their order (scripts grep for them) */
    cr_expect(strstr(s, "{\"worker\":0,\"host\":\"node-a\",\"device\":0,"), "%s", s);
    cr_expect(strstr(s, "\"pid\":4242,\"pool\":\"launch-7\",\"pool_rank\":1,\"alloc\":null}"), "%s",
              s);
    cr_expect(strstr(s, "\"pid\":0,\"pool\":null,\"pool_rank\":3,\"alloc\":null}"), "%s", s);
    free(s);
    tide_msg_clear(&rep);
}

Test(tidectl_format, allocations_get_a_column_only_when_there_are_some)
{
    tide_msg_t rep, req;
    tide_msg_init(&req, TIDE_MSG_STATUS);
    answer_status(&req, &rep, NULL);
    strcpy(rep.u.status_reply.rows[0].alloc, "slurm 12");
    char *s;
    size_t len;
    FILE *f = open_memstream(&s, &len);
    tidectl_print_status(f, &rep.u.status_reply, TIDECTL_TABLE);
    fclose(f);
    cr_expect_eq(col_of(s, "ALLOC"), col_of(s, "slurm 12"), "%s", s);
    cr_expect_null(strstr(s, " \n"), "%s", s);
    free(s);
    f = open_memstream(&s, &len);
    tidectl_print_status(f, &rep.u.status_reply, TIDECTL_JSON);
    fclose(f);
    cr_expect(strstr(s, "\"alloc\":\"slurm 12\"}") && strstr(s, "\"alloc\":null}"), "%s", s);
    free(s);
    tide_msg_clear(&rep);
    tide_msg_init(&req, TIDE_MSG_JOBS);
    answer_status(&req, &rep, NULL);
    f = open_memstream(&s, &len);
    tidectl_print_jobs(f, &rep.u.jobs_reply, 0);
    fclose(f);
    cr_expect_null(strstr(s, "ALLOCATIONS"), "a column for nothing: %s", s);
    free(s);
    strcpy(rep.u.jobs_reply.rows[0].allocs, "slurm 12 h[1-2]; slurm 14 pending (Resources)");
    f = open_memstream(&s, &len);
    tidectl_print_jobs(f, &rep.u.jobs_reply, 0);
    fclose(f);
    cr_expect_eq(col_of(s, "ALLOCATIONS"), col_of(s, "slurm 12 h[1-2]; slurm 14 pending"), "%s", s);
    free(s);
    f = open_memstream(&s, &len);
    tidectl_print_jobs(f, &rep.u.jobs_reply, 1);
    fclose(f);
    cr_expect(strstr(s, "\"allocs\":\"slurm 12 h[1-2]; slurm 14 pending (Resources)\"}"), "%s", s);
    free(s);
    tide_msg_clear(&rep);
}

Test(tidectl_format, events_keep_details_on_one_line)
{
    tide_msg_t rep;
    answer_events(NULL, &rep, NULL);
    char *s;
    size_t len;
    FILE *f = open_memstream(&s, &len);
    tidectl_print_events(f, &rep.u.events_reply, 0);
    fclose(f);
    cr_expect(strstr(s, "worker 3 missed 3 heartbeats?line2"), "%s", s);
    cr_expect_eq(col_of(s, "KIND"), col_of(s, "worker_failed"), "%s", s);
    cr_expect_eq(col_of(s, "KIND"), col_of(s, "resize"), "%s", s);
    free(s);
    f = open_memstream(&s, &len);
    tidectl_print_events(f, &rep.u.events_reply, 1);
    fclose(f);
    cr_expect(strstr(s, "\"detail\":\"dp 2 -> 4 \\\"fast\\\"\""), "%s", s);
    cr_expect(strstr(s, "\"job\":null"), "%s", s);
    free(s);
    tide_msg_clear(&rep);
}

/* ---- usage errors: exit 2, nothing sent
 * ---------------------------------------------------------------- */

static void expect_usage(run_t r, const char *want)
{
    cr_expect_eq(r.rc, TIDECTL_EXIT_USAGE, "rc %d, err: %s", r.rc, r.err);
    cr_expect(strstr(r.err, want) != NULL, "stderr \"%s\" lacks \"%s\"", r.err, want);
    run_free(&r);
}

Test(tidectl_cli, usage_errors_exit_2)
{
    expect_usage(run_cli(NULL), "usage: tidectl");
    expect_usage(run_cli("frob", NULL), "unknown command 'frob'");
    expect_usage(run_cli("resize", "llm", NULL), "give the new layout with --dp");
    expect_usage(run_cli("resize", "--dp", "2", "--tp", "1", "--pp", "1", NULL),
                 "usage: tidectl resize JOB");
    expect_usage(run_cli("resize", "llm", "--dp", "0", "--tp", "1", "--pp", "1", NULL),
                 "--dp: 0 is outside [1, 65536]");
    expect_usage(
        run_cli("resize", "llm", "--dp", "2", "--tp", "1", "--pp", "2", "--stages", "0-11", NULL),
        "--stages gives 1 stages but --pp is 2");
    expect_usage(run_cli("resize", "my job", "--dp", "1", "--tp", "1", "--pp", "1", NULL),
                 "may hold only letters");
    expect_usage(run_cli("resize", "llm", "--dp", "2", "--tp", "1", "--pp", "1", "--placement",
                         "best", NULL),
                 "placement 'best' is not one of: default, optimal");
    expect_usage(run_cli("drain", "gpu3", NULL), "WORKER must be a worker id");
    expect_usage(run_cli("grow", NULL), "usage: tidectl grow JOB");
    expect_usage(run_cli("grow", "llm", "--nodes", "0", NULL), "--nodes: 0 is outside [1, 4096]");
    expect_usage(run_cli("checkpoint", NULL), "usage: tidectl checkpoint JOB");
    expect_usage(run_cli("checkpoint", "llm", "--dir", "", NULL), "--dir must be a path of 1 to");
    expect_usage(run_cli("status", "extra", NULL), "takes no arguments");
    expect_usage(run_cli("status", "--frob", NULL), "unknown option '--frob'");
    expect_usage(run_cli("status", "-o", "tall", NULL), "-o/--output takes 'wide', not 'tall'");
    expect_usage(run_cli("status", "--count", "2", NULL), "--count needs --watch");
    expect_usage(run_cli("submit", "--", "python", NULL), "add --offline");
    expect_usage(run_cli("submit", "--offline", NULL), "give the command after '--'");
    expect_usage(run_cli("submit", "--offline", "--mem-cap", "lots", "--", "x", NULL),
                 "--mem-cap 'lots' is not a byte count");
    expect_usage(run_cli("submit", "--offline", "--max-memory", "lots", "--", "x", NULL),
                 "--max-memory 'lots' is not a byte count");
    expect_usage(run_cli("submit", "--offline", "--max-memory", "100K", "--", "x", NULL),
                 "--max-memory 100K is under 1 MiB");
    expect_usage(run_cli("submit", "--offline", "--max-procs", "-1", "--", "x", NULL),
                 "--max-procs");
    expect_usage(run_cli("submit", "--offline", "--max-procs", "many", "--", "x", NULL),
                 "--max-procs");
    expect_usage(run_cli("submit", "--offline", "--plugin", "p", "--max-procs", "4", NULL),
                 "a plugin runs inside the worker's own process");
    expect_usage(run_cli("events", "--since", "later", NULL), "--since 'later'");
    expect_usage(run_cli("--key", "/nonexistent.key", "status", NULL), "both --key");
    expect_usage(
        run_cli("--key", "/nonexistent.key", "--server-key", "/nonexistent.pub", "status", NULL),
        "cannot read key file /nonexistent.key");
    expect_usage(run_cli("--endpoint", "nowhere", "status", NULL), "--endpoint 'nowhere'");
    expect_usage(run_cli("--timeout-ms", "0", "status", NULL), "--timeout-ms");
}

Test(tidectl_cli, help_exits_0)
{
    run_t r = run_cli("--help", NULL);
    cr_expect_eq(r.rc, 0);
    cr_expect(strstr(r.out, "exit codes: 0 ok; 1 refused by tided"), "%s", r.out);
    run_free(&r);
    r = run_cli("resize", "--help", NULL);
    cr_expect_eq(r.rc, 0);
    cr_expect(strstr(r.out, "--placement"), "%s", r.out);
    run_free(&r);
}

/* ---- against the fake tided
 * --------------------------------------------------------------------------- */

Test(tidectl_cli, status_and_jobs)
{
    fake_t f;
    fake_start(&f, FAKE_REPLY, answer_status, NULL, 0, 0);
    run_t r = run_cli("--endpoint", f.endpoint, "status", NULL);
    cr_expect_eq(r.rc, 0, "%s", r.err);
    cr_expect(strstr(r.out, "a-much-longer-host-name.example"), "%s", r.out);
    cr_expect_eq(f.last.type, TIDE_MSG_STATUS);
    run_free(&r);
    r = run_cli("jobs", "--json", "--endpoint", f.endpoint, NULL);
    cr_expect_eq(r.rc, 0, "%s", r.err);
    cr_expect(
        strstr(r.out, "{\"jobs\":[{\"name\":\"llm\",\"kind\":\"online\",\"state\":\"running\""),
        "%s", r.out);
    run_free(&r);
    r = run_cli("jobs", "--endpoint", f.endpoint, NULL);
    cr_expect(strstr(r.out, "dp2 tp1 pp2"), "%s", r.out);
    cr_expect_eq(col_of(r.out, "PRIORITY") + (long)strlen("PRIORITY"), col_of(r.out, "-5") + 2,
                 "numbers right-aligned under their header:\n%s", r.out);
    /* an online job's elastic declaration: its priority and bounds, and why the policy
       leaves it alone */
    cr_expect_eq(col_of(r.out, "PRIORITY") + (long)strlen("PRIORITY"), col_of(r.out, " 7 ") + 2,
                 "%s", r.out);
    cr_expect_eq(col_of(r.out, "BOUNDS"), col_of(r.out, "4-12 pinned"), "%s", r.out);
    run_free(&r);
    r = run_cli("jobs", "--json", "--endpoint", f.endpoint, NULL);
    cr_expect(strstr(r.out, "\"priority\":7,\"attempts\":0,\"min_gpus\":4,\"max_gpus\":12,"
                            "\"hold\":\"pinned\",\"allocs\":null}"),
              "%s", r.out);
    run_free(&r);
    fake_stop(&f);
    cr_expect_eq(f.bad_frames, 0, "requests use the [\"\"][payload] envelope");
}

Test(tidectl_cli, status_follows_every_page_and_all_lists_the_workers_that_left)
{
    fake_t f;
    fake_start(&f, FAKE_REPLY, answer_status_paged, NULL, 0, 0);
    run_t r = run_cli("--endpoint", f.endpoint, "--json", "status", NULL);
    cr_expect_eq(r.rc, 0, "%s", r.err);
    for (int k = 0; k < 6; k++) {
        char want[48];
        snprintf(want, sizeof want, "\"worker\":%d,", 3 * k);
        cr_expect(strstr(r.out, want) != NULL, "row of worker %d missing:\n%s", 3 * k, r.out);
    }
    cr_expect_null(strstr(r.out, "\"left\""), "%s", r.out);
    cr_expect_eq(f.last.u.status.all, 0);
    cr_expect_eq(f.last.u.status.from, 12, "the last page starts at the id tided named");
    run_free(&r);
    r = run_cli("--endpoint", f.endpoint, "status", "--all", NULL);
    cr_expect_eq(r.rc, 0, "%s", r.err);
    cr_expect(strstr(r.out, "7 GPUs: 0 online, 0 offline work, 6 idle, 0 draining, 0 failed, "
                            "1 left"),
              "%s", r.out);
    cr_expect(strstr(r.out, "page-host-18"), "%s", r.out);
    cr_expect_eq(f.last.u.status.all, 1);
    run_free(&r);
    fake_stop(&f);
}

Test(tidectl_cli, resize_dry_run_sends_the_layout_and_prints_the_plan)
{
    fake_t f;
    fake_start(&f, FAKE_REPLY, answer_resize, NULL, 0, 0);
    run_t r = run_cli("--endpoint", f.endpoint, "resize", "llm", "--dp", "2", "--tp", "2", "--pp",
                      "2", "--stages", "0-9,10-23", "--dry-run", "--placement", "optimal", NULL);
    cr_expect_eq(r.rc, 0, "%s", r.err);
    cr_assert_eq(f.last.type, TIDE_MSG_RESIZE);
    const tide_proto_resize_t *q = &f.last.u.resize;
    cr_expect_str_eq(q->job, "llm");
    cr_expect(q->dp == 2 && q->tp == 2 && q->pp == 2 && q->dry_run == 1);
    cr_expect_eq(q->placement, TIDE_PLACEMENT_OPTIMAL);
    cr_expect(q->n_stages == 3 && q->stage_start[1] == 10 && q->stage_start[2] == 24);
    cr_expect(strstr(r.out, "dry run for llm (nothing changed): generation 4"), "%s", r.out);
    cr_expect(strstr(r.out, "stages 0-9,10-23"), "%s", r.out);
    cr_expect(strstr(r.out, "bytes sent    3.00 GiB over the network in 12 messages"), "%s", r.out);
    cr_expect(strstr(r.out, "rank order    27.00 GiB with the default rank order"), "%s", r.out);
    cr_expect(strstr(r.out, "largest send  512.00 MiB"), "%s", r.out);
    cr_expect(strstr(r.out, "estimated     1.8 s"), "%s", r.out);
    run_free(&r);
    r = run_cli("--endpoint", f.endpoint, "--json", "resize", "llm", "--dp", "1", "--tp", "1",
                "--pp", "1", NULL);
    cr_expect_eq(r.rc, 0, "%s", r.err);
    cr_expect(strstr(r.out, "\"dry_run\":false,\"generation\":4"), "%s", r.out);
    cr_expect(strstr(r.out, "\"bytes_sent\":3221225472,\"bytes_default\":28991029248"), "%s",
              r.out);
    cr_expect(strstr(r.out, "rank order") == NULL, "not a dry run: no comparison");
    cr_expect_eq(f.last.u.resize.n_stages, 0u, "no --stages: tided splits evenly");
    cr_expect_eq(f.last.u.resize.tp_across_hosts, 0, "TP groups inside hosts by default");
    run_free(&r);
    r = run_cli("--endpoint", f.endpoint, "resize", "llm", "--dp", "1", "--tp", "2", "--pp", "1",
                "--allow-tp-across-hosts", NULL);
    cr_expect_eq(r.rc, 0, "%s", r.err);
    cr_expect_eq(f.last.u.resize.tp_across_hosts, 1);
    run_free(&r);
    fake_stop(&f);
}

Test(tidectl_cli, submit_passes_argv_after_double_dash)
{
    fake_t f;
    fake_start(&f, FAKE_REPLY, answer_ok, NULL, 0, 0);
    run_t r =
        run_cli("--endpoint", f.endpoint, "submit", "--offline", "--name", "sweep-1", "--priority",
                "-5", "--mem-cap", "16G", "--max-memory", "512M", "--max-procs", "20", "--",
                "python", "train.py", "--lr", "3e-4", "-v", NULL);
    cr_expect_eq(r.rc, 0, "%s", r.err);
    cr_assert_eq(f.last.type, TIDE_MSG_SUBMIT);
    const tide_proto_submit_t *m = &f.last.u.submit;
    cr_expect_str_eq(m->name, "sweep-1");
    cr_expect_eq(m->kind, TIDE_JOB_COMMAND);
    cr_expect_eq(m->priority, -5);
    cr_expect_eq(m->mem_cap, 16ull << 30);
    cr_expect(m->max_memory == 512ull << 20 && m->max_procs == 20, "the attempt's limits");
    cr_assert_eq(m->argc, 5u);
    cr_expect_str_eq(m->argv[0], "python");
    cr_expect_str_eq(m->argv[2], "--lr");
    cr_expect_str_eq(m->argv[4], "-v");
    cr_expect(strstr(r.out, "submitted offline job sweep-1: submit accepted"), "%s", r.out);
    run_free(&r);
    /* default name: the command's base name */
    r = run_cli("--endpoint", f.endpoint, "submit", "--offline", "--", "/usr/bin/stress-ng", NULL);
    cr_expect_eq(r.rc, 0, "%s", r.err);
    cr_expect_eq(strncmp(f.last.u.submit.name, "stress-ng-", 10), 0, "%s", f.last.u.submit.name);
    cr_expect(f.last.u.submit.max_memory == 0 && f.last.u.submit.max_procs == 0,
              "no limits given: tided's defaults apply");
    run_free(&r);
    /* a relative root is made absolute here: the workers resolve nothing */
    r = run_cli("--endpoint", f.endpoint, "checkpoint", "llm", "--dir", "ck/llm", NULL);
    cr_expect_eq(r.rc, 0, "%s", r.err);
    cr_assert_eq(f.last.type, TIDE_MSG_CHECKPOINT);
    cr_expect_str_eq(f.last.u.checkpoint.job, "llm");
    char cwd[512], want[600];
    cr_assert_not_null(getcwd(cwd, sizeof cwd));
    snprintf(want, sizeof want, "%s/ck/llm", cwd);
    cr_expect_str_eq(f.last.u.checkpoint.dir, want);
    run_free(&r);
    r = run_cli("--endpoint", f.endpoint, "checkpoint", "llm", NULL);
    cr_expect_eq(r.rc, 0, "%s", r.err);
    cr_expect_str_eq(f.last.u.checkpoint.dir, "", "no --dir: the job's own root");
    run_free(&r);
    r = run_cli("--endpoint", f.endpoint, "drain", "17", NULL);
    cr_expect_eq(r.rc, 0, "%s", r.err);
    cr_expect_eq(f.last.type, TIDE_MSG_DRAIN);
    cr_expect_eq(f.last.u.drain.worker, 17);
    cr_expect(strstr(r.out, "drain accepted"), "%s", r.out);
    run_free(&r);
    fake_stop(&f);
}

Test(tidectl_cli, refusal_exits_1_with_tideds_message)
{
    fake_t f;
    fake_start(&f, FAKE_REPLY, answer_error, NULL, 0, 0);
    run_t r = run_cli("--endpoint", f.endpoint, "cancel", "ghost", NULL);
    cr_expect_eq(r.rc, TIDECTL_EXIT_REFUSED);
    cr_expect(strstr(r.err, "tided refused cancel: no job 'ghost': see tidectl jobs "
                            "(TIDE_ERR_NOT_FOUND)"),
              "%s", r.err);
    cr_expect_str_eq(f.last.u.cancel.job, "ghost");
    cr_expect_eq(r.out_len, 0u);
    run_free(&r);
    fake_stop(&f);
}

Test(tidectl_cli, events_since_is_sent_as_wall_clock_ms)
{
    fake_t f;
    fake_start(&f, FAKE_REPLY, answer_events, NULL, 0, 0);
    int64_t before = tide_wall_ms();
    run_t r = run_cli("--endpoint", f.endpoint, "events", "--since", "10m", "--after", "40",
                      "--limit", "5", NULL);
    int64_t after = tide_wall_ms();
    cr_expect_eq(r.rc, 0, "%s", r.err);
    cr_assert_eq(f.last.type, TIDE_MSG_EVENTS);
    cr_expect(f.last.u.events.since_ms >= before - 600000 &&
              f.last.u.events.since_ms <= after - 600000);
    cr_expect_eq(f.last.u.events.since_id, 40u);
    cr_expect_eq(f.last.u.events.limit, 5u);
    cr_expect(strstr(r.out, "worker_failed"), "%s", r.out);
    run_free(&r);
    fake_stop(&f);
}

/* The filters go to tided as typed fields; the table is newest first (tided's order), the
   JSON one object per line, oldest first, with the typed fields that apply. */
Test(tidectl_cli, events_filters_are_sent_and_json_is_lines_oldest_first)
{
    fake_t f;
    fake_start(&f, FAKE_REPLY, answer_events, NULL, 0, 0);
    run_t r =
        run_cli("--endpoint", f.endpoint, "--json", "events", "--job", "llm", "--type", "resize*",
                "--since", "1700000000000", "--until", "1700000001000", "--tail", "7", NULL);
    cr_expect_eq(r.rc, 0, "%s", r.err);
    cr_assert_eq(f.last.type, TIDE_MSG_EVENTS);
    cr_expect_str_eq(f.last.u.events.job, "llm");
    cr_expect_str_eq(f.last.u.events.kind, "resize*");
    cr_expect_eq(f.last.u.events.since_ms, 1700000000000);
    cr_expect_eq(f.last.u.events.until_ms, 1700000001000);
    cr_expect_eq(f.last.u.events.limit, 7u);
    cr_expect(f.last.u.events.newest);
    /* the fake answers rows 41, 42 as if newest first: printed 42 then 41, one per line */
    const char *a = strstr(r.out, "{\"id\":42,");
    const char *b = strstr(r.out, "{\"id\":41,");
    cr_expect(a != NULL && b != NULL && a < b, "%s", r.out);
    cr_expect(strstr(r.out, "\"gen\":7,\"dp\":4,\"tp\":1,\"pp\":1,\"workers\":[10,11,12,13]"), "%s",
              r.out);
    cr_expect(strstr(r.out, "\"ms\":8.250}\n"), "%s", r.out);
    cr_expect(b[-1] == '\n', "one object per line: %s", r.out);
    run_free(&r);
    fake_stop(&f);
    expect_usage(run_cli("events", "--type", "resize started", NULL), "--type 'resize started'");
    expect_usage(run_cli("events", "--since", "1700000001000", "--until", "1700000000000", NULL),
                 "--until must be later");
}

Test(tidectl_cli, top_refreshes_count_times)
{
    fake_t f;
    fake_start(&f, FAKE_REPLY, answer_status, NULL, 0, 0);
    run_t r = run_cli("--endpoint", f.endpoint, "top", "--count", "3", "--interval", "50", NULL);
    cr_expect_eq(r.rc, 0, "%s", r.err);
    int frames = 0;
    for (const char *p = r.out; (p = strstr(p, "tide top")) != NULL; p++)
        frames++;
    cr_expect_eq(frames, 3, "%s", r.out);
    run_free(&r);
    fake_stop(&f);
    cr_expect_eq(f.requests, 6, "status + jobs per refresh");
    fake_start(&f, FAKE_REPLY, answer_status, NULL, 0, 0);
    r = run_cli("--endpoint", f.endpoint, "top", "--count", "2", "--interval", "50", "--json",
                NULL);
    cr_expect_eq(r.rc, 0, "%s", r.err);
    int lines = 0;
    for (const char *p = r.out; *p; p++)
        lines += *p == '\n';
    cr_expect_eq(lines, 2, "one JSON document per line:\n%s", r.out);
    cr_expect_eq(strncmp(r.out, "{\"status\":{\"time_ms\":", 21), 0, "%s", r.out);
    run_free(&r);
    fake_stop(&f);
}

/* status -o wide asks tided once and prints the process columns; --watch redraws every
   --interval ms, --count times here, one JSON line per refresh with --json. */
Test(tidectl_cli, status_wide_and_watch)
{
    fake_t f;
    fake_start(&f, FAKE_REPLY, answer_status, NULL, 0, 0);
    run_t r = run_cli("--endpoint", f.endpoint, "status", "-o", "wide", NULL);
    cr_expect_eq(r.rc, 0, "%s", r.err);
    cr_expect(strstr(r.out, "PID") && strstr(r.out, "4242") && strstr(r.out, "launch-7"), "%s",
              r.out);
    run_free(&r);
    r = run_cli("--endpoint", f.endpoint, "status", "--output=wide", NULL);
    cr_expect(r.rc == 0 && strstr(r.out, "4242"), "%s%s", r.out, r.err);
    run_free(&r);
    fake_stop(&f);
    cr_expect_eq(f.requests, 2);
    fake_start(&f, FAKE_REPLY, answer_status, NULL, 0, 0);
    r = run_cli("--endpoint", f.endpoint, "status", "--watch", "--count", "3", "--interval", "50",
                NULL);
    cr_expect_eq(r.rc, 0, "%s", r.err);
    int frames = 0;
    for (const char *p = r.out; (p = strstr(p, "tidectl status  ")) != NULL; p++)
        frames++;
    cr_expect_eq(frames, 3, "%s", r.out);
    int tables = 0;
    for (const char *p = r.out; (p = strstr(p, "2 GPUs: ")) != NULL; p++)
        tables++;
    cr_expect_eq(tables, 3, "%s", r.out);
    run_free(&r);
    fake_stop(&f);
    cr_expect_eq(f.requests, 3, "one status request per refresh");
    fake_start(&f, FAKE_REPLY, answer_status, NULL, 0, 0);
    r = run_cli("--endpoint", f.endpoint, "--json", "status", "--watch", "--count", "2",
                "--interval", "50", NULL);
    cr_expect_eq(r.rc, 0, "%s", r.err);
    int lines = 0;
    for (const char *p = r.out; *p; p++)
        lines += *p == '\n';
    cr_expect_eq(lines, 2, "one JSON document per line:\n%s", r.out);
    cr_expect_eq(strncmp(r.out, "{\"time_ms\":", 11), 0, "%s", r.out);
    run_free(&r);
    fake_stop(&f);
}

Test(tidectl_cli, silent_tided_times_out_with_exit_4)
{
    fake_t f;
    fake_start(&f, FAKE_SILENT, answer_ok, NULL, 0, 0);
    uint64_t t0 = tide_now_ns();
    run_t r = run_cli("--endpoint", f.endpoint, "--timeout-ms", "300", "status", NULL);
    double ms = (double)(tide_now_ns() - t0) / 1e6;
    cr_expect_eq(r.rc, TIDECTL_EXIT_TIMEOUT, "%s", r.err);
    cr_expect(strstr(r.err, "timed out after 300 ms"), "%s", r.err);
    cr_expect(ms >= 290 && ms < 3000, "took %.0f ms", ms);
    run_free(&r);
    fake_stop(&f);
}

Test(tidectl_cli, nobody_listening_exits_3)
{
    /* a port that was free a moment ago */
    void *ctx = zmq_ctx_new(), *s = zmq_socket(ctx, ZMQ_ROUTER);
    zmq_bind(s, "tcp://127.0.0.1:*");
    char ep[128];
    size_t len = sizeof ep;
    zmq_getsockopt(s, ZMQ_LAST_ENDPOINT, ep, &len);
    zmq_close(s);
    zmq_ctx_term(ctx);
    run_t r = run_cli("--endpoint", ep, "--timeout-ms", "300", "jobs", NULL);
    cr_expect_eq(r.rc, TIDECTL_EXIT_UNREACHABLE, "%s", r.err);
    cr_expect(strstr(r.err, "cannot reach tided at"), "%s", r.err);
    cr_expect(strstr(r.err, "is tided running?"), "%s", r.err);
    run_free(&r);
}

/* ---- keys and CURVE
 * ---------------------------------------------------------------------------------------- */

static char keydir[64];

static void make_keys(void)
{
    snprintf(keydir, sizeof keydir, "/tmp/tidectl-test-%d", (int)getpid());
    run_t r = run_cli("keygen", keydir, "--role", "server", NULL);
    cr_assert_eq(r.rc, 0, "%s", r.err);
    run_free(&r);
    r = run_cli("keygen", keydir, "--name", "ops", NULL);
    cr_assert_eq(r.rc, 0, "%s", r.err);
    run_free(&r);
}

static void remove_keys(void)
{
    const char *names[] = {"server.key", "server.pub", "ops.key", "ops.pub"};
    char path[128];
    for (int i = 0; i < 4; i++) {
        snprintf(path, sizeof path, "%s/%s", keydir, names[i]);
        unlink(path);
    }
    rmdir(keydir);
}

Test(tidectl_keys, keygen_writes_the_agreed_format)
{
    make_keys();
    char path[128], pub[41], secret[41], pub2[41];
    struct stat st;
    snprintf(path, sizeof path, "%s/ops.key", keydir);
    cr_assert_eq(stat(path, &st), 0);
    cr_expect_eq(st.st_mode & 0777, 0600u, "the secret key file is private");
    cr_assert_eq(tidectl_read_key(path, pub, secret), TIDE_OK, "%s", tide_last_error());
    /* the secret really belongs to the public key */
    char derived[41];
    cr_assert_eq(zmq_curve_public(derived, secret), 0);
    cr_expect_str_eq(derived, pub);
    FILE *f = fopen(path, "r");
    char text[512] = "";
    size_t n = fread(text, 1, sizeof text - 1, f);
    text[n] = '\0';
    fclose(f);
    cr_expect(strstr(text, "role = admin\n"), "%s", text);
    snprintf(path, sizeof path, "%s/ops.pub", keydir);
    cr_assert_eq(stat(path, &st), 0);
    cr_expect_eq(st.st_mode & 0777, 0644u);
    cr_assert_eq(tidectl_read_key(path, pub2, NULL), TIDE_OK);
    cr_expect_str_eq(pub2, pub);
    /* a pub file is not a key pair */
    cr_expect_eq(tidectl_read_key(path, pub2, secret), TIDE_ERR_INVALID);
    cr_expect(strstr(tide_last_error(), "no 'secret = ...' line"));
    /* the Z85 text itself works as --server-key */
    cr_assert_eq(tidectl_read_key(pub, pub2, NULL), TIDE_OK);
    cr_expect_str_eq(pub2, pub);
    /* no silent overwrite; --force replaces with a new key */
    run_t r = run_cli("keygen", keydir, "--name", "ops", NULL);
    cr_expect_eq(r.rc, TIDECTL_EXIT_USAGE);
    cr_expect(strstr(r.err, "pass --force"), "%s", r.err);
    run_free(&r);
    /* --force replaces a symlink planted at a key's path, never writes through it */
    char victim[128];
    snprintf(victim, sizeof victim, "%s/victim", keydir);
    FILE *vf = fopen(victim, "w");
    fputs("precious\n", vf);
    fclose(vf);
    snprintf(path, sizeof path, "%s/ops.key", keydir);
    unlink(path);
    cr_assert_eq(symlink(victim, path), 0);
    r = run_cli("keygen", keydir, "--name", "ops", "--force", "--json", NULL);
    cr_expect_eq(r.rc, 0, "%s", r.err);
    cr_assert_eq(lstat(path, &st), 0);
    cr_expect(S_ISREG(st.st_mode) && (st.st_mode & 0777) == 0600, "the link was replaced");
    vf = fopen(victim, "r");
    char vtext[32] = "";
    cr_assert(fgets(vtext, sizeof vtext, vf) != NULL);
    fclose(vf);
    cr_expect_str_eq(vtext, "precious\n", "keygen --force wrote through a symlink");
    unlink(victim);
    cr_expect(strstr(r.out, "\"role\":\"admin\",\"name\":\"ops\""), "%s", r.out);
    run_free(&r);
    snprintf(path, sizeof path, "%s/ops.key", keydir);
    cr_assert_eq(tidectl_read_key(path, pub2, secret), TIDE_OK);
    cr_expect_str_neq(pub2, pub);
    r = run_cli("keygen", keydir, "--role", "root", NULL);
    cr_expect_eq(r.rc, TIDECTL_EXIT_USAGE);
    cr_expect(strstr(r.err, "admin, worker, reader or server"), "%s", r.err);
    run_free(&r);
    remove_keys();
}

static void server_secret(char *secret)
{
    char path[128], pub[41];
    snprintf(path, sizeof path, "%s/server.key", keydir);
    cr_assert_eq(tidectl_read_key(path, pub, secret), TIDE_OK, "%s", tide_last_error());
}

Test(tidectl_keys, curve_client_talks_to_a_curve_server)
{
    make_keys();
    char secret[41], key[128], spub[128];
    server_secret(secret);
    snprintf(key, sizeof key, "%s/ops.key", keydir);
    snprintf(spub, sizeof spub, "%s/server.pub", keydir);
    fake_t f;
    fake_start(&f, FAKE_REPLY, answer_status, secret, 1, 0);
    run_t r = run_cli("--endpoint", f.endpoint, "--key", key, "--server-key", spub, "status", NULL);
    cr_expect_eq(r.rc, 0, "%s", r.err);
    cr_expect(strstr(r.out, "node-a"), "%s", r.out);
    run_free(&r);
    fake_stop(&f);
    remove_keys();
}

Test(tidectl_keys, key_refused_by_zap_exits_1_quickly)
{
    make_keys();
    char secret[41], key[128], spub[128];
    server_secret(secret);
    snprintf(key, sizeof key, "%s/ops.key", keydir);
    snprintf(spub, sizeof spub, "%s/server.pub", keydir);
    fake_t f;
    fake_start(&f, FAKE_REPLY, answer_status, secret, 1, 1);
    uint64_t t0 = tide_now_ns();
    run_t r = run_cli("--endpoint", f.endpoint, "--timeout-ms", "3000", "--key", key,
                      "--server-key", spub, "status", NULL);
    double ms = (double)(tide_now_ns() - t0) / 1e6;
    cr_expect_eq(r.rc, TIDECTL_EXIT_REFUSED, "%s", r.err);
    cr_expect(strstr(r.err, "CURVE handshake failed"), "%s", r.err);
    cr_expect_lt(ms, 2500.0, "a refused key is reported without waiting out the timeout");
    cr_expect_eq(f.requests, 0, "nothing reached the fake tided");
    run_free(&r);
    fake_stop(&f);
    remove_keys();
}

/* A stand-in CURVE server that greets at once and never hangs up, so the client itself
 * finds the mechanism mismatch (ZMTP greeting: signature, version 3.0, "CURVE", server). */
typedef struct {
    int listen_fd;
    pthread_t thread;
    char endpoint[64];
} greeter_t;

static void *greeter_main(void *arg)
{
    greeter_t *g = arg;
    int fd = accept(g->listen_fd, NULL, NULL);
    if (fd < 0)
        return NULL;
    unsigned char greeting[64] = {0xff, 0,   0,   0,   0,   0,   0, 0, 1, /* signature */
                                  0x7f, 3,   0,                          /* version 3.0 */
                                  'C',  'U', 'R', 'V', 'E'};
    greeting[32] = 1; /* as-server */
    if (write(fd, greeting, sizeof greeting) != (ssize_t)sizeof greeting) {
        close(fd);
        return NULL;
    }
    char sink[256];
    while (read(fd, sink, sizeof sink) > 0) /* until the client closes */
        ;
    close(fd);
    return NULL;
}

static void greeter_start(greeter_t *g)
{
    g->listen_fd = socket(AF_INET, SOCK_STREAM, 0);
    cr_assert_geq(g->listen_fd, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    cr_assert_eq(bind(g->listen_fd, (struct sockaddr *)&a, sizeof a), 0);
    cr_assert_eq(listen(g->listen_fd, 1), 0);
    socklen_t len = sizeof a;
    getsockname(g->listen_fd, (struct sockaddr *)&a, &len);
    snprintf(g->endpoint, sizeof g->endpoint, "tcp://127.0.0.1:%d", ntohs(a.sin_port));
    pthread_create(&g->thread, NULL, greeter_main, g);
}

static void greeter_stop(greeter_t *g)
{
    pthread_join(g->thread, NULL);
    close(g->listen_fd);
}

/* Under load the I/O thread can run the whole failed handshake before tidectl sends: the
 * socket then has no pipe and refuses the request frame, which must still read as "use
 * keys", not as an unreachable tided (a loaded CI run printed "cannot queue the request"). */
Test(tidectl_keys, handshake_failed_before_the_send_is_still_told_to_use_keys)
{
    greeter_t g;
    greeter_start(&g);
    settings_t s = {.endpoint = g.endpoint, .timeout_ms = 3000};
    char *text = NULL;
    size_t len = 0;
    FILE *err = open_memstream(&text, &len);
    conn_t c;
    cr_assert_eq(tidectl__conn_open(&c, &s, err), TIDECTL_EXIT_OK);
    /* the handshake fails meanwhile; each ZMQ_EVENTS query lets the socket take one more
     * round of the teardown (term request, term, pipe gone), as a descheduled tidectl's
     * first zmq_send can on a loaded machine */
    for (int i = 0; i < 4; i++) {
        usleep(100 * 1000);
        int events;
        size_t elen = sizeof events;
        zmq_getsockopt(c.sock, ZMQ_EVENTS, &events, &elen);
    }
    tide_msg_t req, rep;
    tide_msg_init(&req, TIDE_MSG_STATUS);
    uint64_t t0 = tide_now_ns();
    int rc = tidectl__conn_call(&c, &req, &rep, err);
    double ms = (double)(tide_now_ns() - t0) / 1e6;
    tide_msg_clear(&req);
    tide_msg_clear(&rep);
    tidectl__conn_close(&c);
    fclose(err);
    cr_expect_eq(rc, TIDECTL_EXIT_REFUSED, "%s", text);
    cr_expect(strstr(text, "requires CURVE"), "%s", text);
    cr_expect_lt(ms, 2500.0, "the failed handshake is reported without waiting out the timeout");
    free(text);
    greeter_stop(&g);
}

Test(tidectl_keys, plain_client_to_curve_server_is_told_to_use_keys)
{
    make_keys();
    char secret[41];
    server_secret(secret);
    fake_t f;
    fake_start(&f, FAKE_REPLY, answer_status, secret, 0, 0);
    run_t r = run_cli("--endpoint", f.endpoint, "--timeout-ms", "1000", "status", NULL);
    cr_expect_eq(r.rc, TIDECTL_EXIT_REFUSED, "%s", r.err);
    cr_expect(strstr(r.err, "requires CURVE"), "%s", r.err);
    run_free(&r);
    fake_stop(&f);
    remove_keys();
}
