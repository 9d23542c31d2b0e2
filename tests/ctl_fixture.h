/*
 * The fixture of libtide's control-client tests (test_worker_ctl.c, test_worker_child.c):
 * a fake tided (one ROUTER socket on a free loopback port that decodes what the rank sends
 * and answers as the test says) and the training thread's side of the client (the intents
 * it drains, the progress it publishes, its step agreement), as the runtime keeps them.
 * Header-only, like tided_fixture.h: each test runs in its own process (Criterion), so the
 * one trainer `tr` is per test. Test thread only, but fake_register, which runs on a thread
 * of its own while the client registers.
 */
#ifndef TIDE_TESTS_CTL_FIXTURE_H
#define TIDE_TESTS_CTL_FIXTURE_H

#include <criterion/criterion.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include <zmq.h>

#include "core/clock.h"
#include "core/error.h"
#include "proto/proto.h"
#include "worker/tide_int.h"
#include "worker/worker_int.h"

typedef struct fake {
    void *ctx, *router;
    char endpoint[128];
    unsigned char rid[256];
    size_t rid_len;
} fake;

static inline void fake_open(fake *f)
{
    memset(f, 0, sizeof *f);
    f->ctx = zmq_ctx_new();
    f->router = zmq_socket(f->ctx, ZMQ_ROUTER);
    int linger = 0;
    zmq_setsockopt(f->router, ZMQ_LINGER, &linger, sizeof linger);
    cr_assert_eq(zmq_bind(f->router, "tcp://127.0.0.1:*"), 0);
    size_t len = sizeof f->endpoint;
    zmq_getsockopt(f->router, ZMQ_LAST_ENDPOINT, f->endpoint, &len);
}

static inline void fake_close(fake *f)
{
    zmq_close(f->router);
    zmq_ctx_term(f->ctx);
}

/* Receives one message within poll_ms into *m, its sender becoming the one fake_send
   answers: 1 when it decoded, -1 when it did not (tide_last_error says why), 0 when none
   came. */
static inline int fake_recv(fake *f, int poll_ms, tide_msg_t *m)
{
    zmq_pollitem_t it = {f->router, 0, ZMQ_POLLIN, 0};
    if (zmq_poll(&it, 1, poll_ms) <= 0)
        return 0;
    zmq_msg_t id, body;
    zmq_msg_init(&id);
    zmq_msg_init(&body);
    zmq_msg_recv(&id, f->router, 0);
    zmq_msg_recv(&body, f->router, 0);
    f->rid_len = zmq_msg_size(&id);
    memcpy(f->rid, zmq_msg_data(&id), f->rid_len);
    tide_status rc = tide_proto_decode(zmq_msg_data(&body), zmq_msg_size(&body), m);
    zmq_msg_close(&id);
    zmq_msg_close(&body);
    return rc == TIDE_OK ? 1 : -1;
}

/* Receives the next message of type `want` into *out (others, heartbeats included, are
   skipped); fails the test when the rank sends a malformed one or none within timeout_ms. */
static inline void fake_expect(fake *f, tide_msg_type_t want, tide_msg_t *out, int timeout_ms)
{
    uint64_t deadline = tide_now_ns() + (uint64_t)timeout_ms * 1000000ull;
    while (tide_now_ns() < deadline) {
        tide_msg_t m;
        int got = fake_recv(f, 20, &m);
        if (got == 0)
            continue;
        cr_assert_eq(got, 1, "worker sent a malformed message: %s", tide_last_error());
        if (m.type == want) {
            *out = m;
            return;
        }
        tide_msg_clear(&m);
    }
    cr_assert_fail("no '%s' from the worker within %d ms", tide_msg_type_name(want), timeout_ms);
}

/* 1 when a message of type t reaches the fake within ms (others, malformed ones too,
   skipped). */
static inline int fake_sees(fake *f, tide_msg_type_t t, int ms)
{
    uint64_t deadline = tide_now_ns() + (uint64_t)ms * 1000000ull;
    while (tide_now_ns() < deadline) {
        tide_msg_t m;
        if (fake_recv(f, 20, &m) != 1)
            continue;
        int hit = m.type == t;
        tide_msg_clear(&m);
        if (hit)
            return 1;
    }
    return 0;
}

static inline void fake_send(fake *f, const tide_msg_t *m)
{
    tide_proto_buf_t b;
    tide_proto_buf_init(&b);
    cr_assert_eq(tide_proto_encode(m, &b), TIDE_OK, "%s", tide_last_error());
    zmq_send(f->router, f->rid, f->rid_len, ZMQ_SNDMORE);
    zmq_send(f->router, b.data, b.len, 0);
    tide_proto_buf_destroy(&b);
}

typedef struct reg_arg {
    fake *f;
    int hb_ms;
    int fail_ms; /* tided's failure timeout, the worker's lease */
} reg_arg;

static inline void *fake_register(void *arg)
{
    reg_arg *ra = arg;
    tide_msg_t m;
    fake_expect(ra->f, TIDE_MSG_REGISTER, &m, 5000);
    cr_assert_eq(m.u.reg.rank, 3);
    cr_assert_str_eq(m.u.reg.pool, "pool-a");
    tide_msg_clear(&m);
    tide_msg_init(&m, TIDE_MSG_REGISTER_OK);
    m.u.register_ok.worker = 42;
    m.u.register_ok.heartbeat_ms = ra->hb_ms;
    m.u.register_ok.fail_ms = ra->fail_ms;
    fake_send(ra->f, &m);
    return NULL;
}

/* The training thread's side of the control client: the intents it drains, the progress
   it publishes, the generations' abort words, and its own step agreement and pending
   layout, as the runtime keeps them (step.c). One per process: Criterion runs each test
   in its own. */
static struct trainer {
    tide__mailbox_t *intents;
    tide__progress progress;
    tide__gens_t *gens;
    tide__agree a;
    tide_msg_t pending;
    char fence_why[TIDE_PROTO_TEXT_MAX + 1];
    int fenced;
} tr;

static inline void trainer_open(void)
{
    memset(&tr, 0, sizeof tr);
    cr_assert_eq(tide__mailbox_new(&tr.intents), TIDE_OK);
    cr_assert_eq(tide__gens_new(&tr.gens), TIDE_OK);
    tide__agree_init(&tr.a, 0);
    tide_msg_init(&tr.pending, TIDE_MSG_NONE);
}

static inline void trainer_close(void)
{
    tide_msg_clear(&tr.pending);
    tide__mailbox_destroy(&tr.intents);
    tide__gens_destroy(&tr.gens);
}

static inline int has_rank(const tide_proto_layout_t *l, int32_t r)
{
    for (int i = 0; i < l->dp * l->tp * l->pp; i++)
        if (l->worker[i] == r)
            return 1;
    return 0;
}

/* The runtime's application of an intent to its agreement (step.c), for job rank 3. */
static inline void trainer_apply(void *ctx, tide_msg_t *m)
{
    (void)ctx;
    if (m->type == TIDE_MSG_LAYOUT &&
        tide__agree_layout(&tr.a, m->u.layout.layout.gen, has_rank(&m->u.layout.layout, 3),
                           tr.a.gen == m->u.layout.prev.gen && has_rank(&m->u.layout.prev, 3))) {
        tide_msg_clear(&tr.pending);
        tr.pending = *m;
        tide_msg_init(m, TIDE_MSG_NONE);
    } else if (m->type == TIDE_MSG_PREPARE_ACK) {
        tide__agree_acked(&tr.a, m->u.prepare_ack.gen, (int64_t)m->u.prepare_ack.step);
    } else if (m->type == TIDE_MSG_COMMIT) {
        tide__agree_commit(&tr.a, m->u.commit.gen, (int64_t)m->u.commit.step, m->u.commit.recover);
    } else if (m->type == TIDE_MSG_ABORT) {
        tide__agree_abort(&tr.a, m->u.abort_.gen);
    } else if (m->type == TIDE_MSG_FENCED) {
        tr.fenced = 1;
        snprintf(tr.fence_why, sizeof tr.fence_why, "%s", m->u.fenced.reason);
    }
}

static inline void trainer_publish(void *ctx)
{
    (void)ctx;
    tide__progress_set(&tr.progress, &tr.a);
}

/* A boundary: the intents applied, then fn (may be NULL) on the agreement, published. */
typedef void (*trainer_fn)(void);
static trainer_fn tr_fn;
static inline void trainer_then(void *ctx)
{
    if (tr_fn != NULL)
        tr_fn();
    trainer_publish(ctx);
}

static inline void trainer_boundary(trainer_fn fn)
{
    tr_fn = fn;
    tide__mailbox_drain(tr.intents, trainer_apply, NULL, trainer_then, NULL);
    tr_fn = NULL;
}

static tide__begin tr_begin;
static inline void do_begin(void)
{
    tr_begin = tide__agree_begin(&tr.a);
}
static inline void do_end(void)
{
    tide__agree_end(&tr.a, 1);
}

/* A control client registered with f as a worker of the given kind on local device, with
   tided's failure timeout fail_ms (the lease). */
static inline tide__ctl_t *start_ctl_with(fake *f, int kind, int device, int fail_ms)
{
    trainer_open();
    tide__ctl_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.endpoint = f->endpoint;
    snprintf(cfg.reg.pool, sizeof cfg.reg.pool, "pool-a");
    cfg.reg.rank = 3;
    cfg.reg.size = 4;
    snprintf(cfg.reg.host, sizeof cfg.reg.host, "hostx");
    cfg.reg.device = device;
    cfg.reg.kind = kind;
    cfg.reg.mem_bytes = 1 << 20;
    cfg.reg.pid = (int)getpid();
    cfg.register_timeout_ms = 5000;
    cfg.intents = tr.intents;
    cfg.progress = &tr.progress;
    cfg.gens = tr.gens;
    reg_arg ra = {f, 50, fail_ms};
    pthread_t th;
    pthread_create(&th, NULL, fake_register, &ra);
    tide__ctl_t *ctl = NULL;
    tide_status rc = tide__ctl_new(&ctl, &cfg);
    pthread_join(th, NULL);
    cr_assert_eq(rc, TIDE_OK, "%s", tide_last_error());
    cr_assert_eq(tide__ctl_worker_id(ctl), 42);
    return ctl;
}

/* A control client registered with a fake tided whose failure timeout is a minute: no
   lease runs out in a test that does not mean it to. */
static inline tide__ctl_t *start_ctl_on(fake *f, int kind, int device)
{
    return start_ctl_with(f, kind, device, 60000);
}

static inline tide__ctl_t *start_ctl_lease(fake *f, int fail_ms)
{
    return start_ctl_with(f, TIDE_DEVICE_CPU, 0, fail_ms);
}

static inline tide__ctl_t *start_ctl(fake *f)
{
    return start_ctl_on(f, TIDE_DEVICE_CPU, 0);
}

static inline void set_layout(tide_proto_layout_t *l, uint64_t gen, int dp, int32_t *workers,
                              int *stages)
{
    memset(l, 0, sizeof *l);
    l->gen = gen;
    l->dp = dp;
    l->tp = 1;
    l->pp = 1;
    l->num_layers = 2;
    l->micro_batches = 1;
    stages[0] = 0;
    stages[1] = 2;
    l->stage_start = stages;
    l->worker = workers;
}

static inline void first_member(void)
{
    tide__agree_first(&tr.a, 1, 1);
}

static inline void do_switched(void)
{
    tide__agree_switched(&tr.a);
}

static inline void first_idle(void)
{
    tide__agree_first(&tr.a, 1, 0);
}

#endif /* TIDE_TESTS_CTL_FIXTURE_H */
