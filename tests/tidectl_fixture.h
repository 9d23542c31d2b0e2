/*
 * The fixture of tidectl's unit tests (test_tidectl.c, test_tidectl_cli.c,
 * test_tidectl_keys.c; one executable, test_tidectl): tidectl_main run with its output
 * captured, a fake tided (a ZeroMQ ROUTER on a free loopback port in a thread that
 * decodes each request and answers with a canned reply, or not at all, or over CURVE, or
 * with a ZAP handler that refuses the key) and the canned replies more than one file uses.
 * Header-only, like ctl_fixture.h: Criterion runs each test in its own process. Test
 * thread only, but the fake's answer functions, which run on the fake's thread.
 */
#ifndef TIDE_TESTS_TIDECTL_FIXTURE_H
#define TIDE_TESTS_TIDECTL_FIXTURE_H

#include <criterion/criterion.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "coordinator/tidectl.h"
#include "coordinator/tidectl_int.h"
#include "core/alloc.h"
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
static inline run_t run_cli(const char *first, ...)
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

static inline void run_free(run_t *r)
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

static inline void answer_zap(fake_t *f)
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

static inline void *fake_main(void *arg)
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
static inline void fake_start(fake_t *f, fake_mode mode,
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

static inline void fake_stop(fake_t *f)
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

static inline void answer_status(const tide_msg_t *req, tide_msg_t *rep, fake_t *f)
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

static inline void answer_events(const tide_msg_t *req, tide_msg_t *rep, fake_t *f)
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

/* Column start of needle in the line that contains it. */
static inline long col_of(const char *text, const char *needle)
{
    const char *p = strstr(text, needle);
    if (p == NULL)
        return -1;
    const char *line = p;
    while (line > text && line[-1] != '\n')
        line--;
    return (long)(p - line);
}

#endif
