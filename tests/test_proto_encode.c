/*
 * Unit tests for proto/'s encoder (part of test_proto; tests/proto_fixture.h): it refuses
 * what the decoder would, its buffer is reused and released; and allocation failures
 * during decode, encode and sampling give TIDE_ERR_NOMEM and leak nothing.
 */
#include <criterion/criterion.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "proto/proto.h"
#include "tests/proto_fixture.h"
#include "tests/support/proto_sample.h"

/* ---- encode side
 * ---------------------------------------------------------------------------------- */

Test(proto_encode, refuses_what_decode_would_refuse)
{
    tide_proto_buf_t b;
    tide_proto_buf_init(&b);
    tide_msg_t m = heartbeat();
    m.u.heartbeat.idle_ms = -0.5;
    cr_expect_eq(tide_proto_encode(&m, &b), TIDE_ERR_INVALID);
    cr_expect(strstr(tide_last_error(), "heartbeat: field 'idle_ms' must be a finite number") !=
              NULL);
    m = heartbeat();
    m.u.heartbeat.worker = -1;
    cr_expect_eq(tide_proto_encode(&m, &b), TIDE_ERR_INVALID);
    tide_msg_t l = layout_msg();
    memset(l.u.layout.job, 'j', sizeof l.u.layout.job); /* no terminator */
    cr_expect_eq(tide_proto_encode(&l, &b), TIDE_ERR_INVALID);
    cr_expect(strstr(tide_last_error(), "not NUL-terminated") != NULL, "%s", tide_last_error());
    l = layout_msg();
    l.u.layout.layout.worker = NULL;
    cr_expect_eq(tide_proto_encode(&l, &b), TIDE_ERR_INVALID);
    cr_expect(strstr(tide_last_error(), "'layout.workers' is NULL") != NULL, "%s",
              tide_last_error());
    tide_msg_t none;
    tide_msg_init(&none, TIDE_MSG_NONE);
    cr_expect_eq(tide_proto_encode(&none, &b), TIDE_ERR_INVALID);
    cr_expect_eq(b.len, 0u);
    tide_proto_buf_destroy(&b);
}

Test(proto_encode, buffer_is_reused_and_released)
{
    tide_proto_buf_t b;
    tide_proto_buf_init(&b);
    tide_msg_t m = heartbeat();
    cr_assert_eq(tide_proto_encode(&m, &b), TIDE_OK);
    size_t first = b.len;
    cr_assert_eq(tide_proto_encode(&m, &b), TIDE_OK);
    cr_expect_eq(b.len, first, "encode replaces the buffer's contents");
    size_t len = 0;
    uint8_t *bytes = tide_proto_buf_release(&b, &len);
    cr_expect_eq(len, first);
    cr_expect_null(b.data);
    tide_free(bytes);
    tide_proto_buf_destroy(&b);
    tide_proto_buf_destroy(&b); /* twice is fine */
}

/* ---- allocation failures
 * ------------------------------------------------------------------------------ */

/* Makes every allocation of decode fail in turn; each must give NOMEM and hold nothing. */
static void decode_under_failures(const tide_msg_t *m)
{
    size_t len;
    uint8_t *bytes = encode_copy(m, &len);
    long k;
    int failed = 0;
    for (k = 1; k < 10000; k++) {
        tide_msg_t d;
        tide_alloc_fail_at(k, 0);
        tide_status rc = tide_proto_decode(bytes, len, &d);
        long hits = tide_alloc_failures();
        tide_alloc_fail_at(0, 0);
        if (hits == 0) {
            cr_assert_eq(rc, TIDE_OK, "%s", tide_last_error());
            tide_msg_clear(&d);
            break;
        }
        cr_assert_eq(rc, TIDE_ERR_NOMEM, "%s: allocation %ld failed but rc=%d (%s)",
                     tide_msg_type_name(m->type), k, rc, tide_last_error());
        cr_assert(strstr(tide_last_error(), "out of memory") != NULL);
        cr_assert_eq(d.type, TIDE_MSG_NONE);
        failed++;
    }
    cr_expect_gt(failed, 0, "%s decode should allocate", tide_msg_type_name(m->type));
    /* sticky: everything fails from the first allocation on */
    tide_msg_t d;
    tide_alloc_fail_at(1, 1);
    cr_expect_eq(tide_proto_decode(bytes, len, &d), TIDE_ERR_NOMEM);
    tide_alloc_fail_at(0, 0);
    tide_free(bytes);
}

Test(proto_alloc, decode_failures_leak_nothing)
{
    tide_msg_type_t types[] = {TIDE_MSG_JOIN,         TIDE_MSG_LAYOUT,
                               TIDE_MSG_SUBMIT,       TIDE_MSG_OFFLINE_ASSIGN,
                               TIDE_MSG_STATUS_REPLY, TIDE_MSG_JOBS_REPLY,
                               TIDE_MSG_EVENTS_REPLY, TIDE_MSG_RESIZE,
                               TIDE_MSG_RESIZE_REPLY, TIDE_MSG_HOST_HEARTBEAT};
    uint64_t rng = 777;
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
        /* pick a sample that owns at least two arrays or entries */
        tide_msg_t m;
        for (;;) {
            cr_assert_eq(tide_proto_sample(&m, types[i], &rng), TIDE_OK);
            int big = (m.type == TIDE_MSG_JOIN && m.u.join.n_tensors >= 2) ||
                      (m.type == TIDE_MSG_LAYOUT && m.u.layout.has_prev) ||
                      (m.type == TIDE_MSG_SUBMIT && m.u.submit.argc >= 2) ||
                      (m.type == TIDE_MSG_OFFLINE_ASSIGN && m.u.offline_assign.argc >= 2) ||
                      (m.type == TIDE_MSG_STATUS_REPLY && m.u.status_reply.n_rows >= 2) ||
                      (m.type == TIDE_MSG_JOBS_REPLY && m.u.jobs_reply.n_rows >= 2) ||
                      (m.type == TIDE_MSG_EVENTS_REPLY && m.u.events_reply.n_rows >= 2) ||
                      (m.type == TIDE_MSG_RESIZE && m.u.resize.n_stages >= 2) ||
                      (m.type == TIDE_MSG_HOST_HEARTBEAT && m.u.host_heartbeat.n_beats >= 2) ||
                      m.type == TIDE_MSG_RESIZE_REPLY;
            if (big)
                break;
            tide_msg_clear(&m);
        }
        decode_under_failures(&m);
        tide_msg_clear(&m);
    }
}

Test(proto_alloc, encode_and_sample_failures)
{
    uint64_t rng = 99;
    tide_msg_t m;
    tide_msg_init(&m, TIDE_MSG_NONE);
    do {
        tide_msg_clear(&m);
        tide_proto_sample(&m, TIDE_MSG_STATUS_REPLY, &rng);
    } while (m.u.status_reply.n_rows < 4); /* > 256 bytes: the buffer must grow */
    long k;
    for (k = 1; k < 100; k++) {
        tide_proto_buf_t b;
        tide_proto_buf_init(&b);
        tide_alloc_fail_at(k, 0);
        tide_status rc = tide_proto_encode(&m, &b);
        long hits = tide_alloc_failures();
        tide_alloc_fail_at(0, 0);
        tide_proto_buf_destroy(&b);
        if (hits == 0) {
            cr_expect_eq(rc, TIDE_OK);
            break;
        }
        cr_expect_eq(rc, TIDE_ERR_NOMEM, "allocation %ld", k);
    }
    cr_expect_gt(k, 2, "encoding grew the buffer more than once");
    tide_msg_clear(&m);
    for (k = 1; k < 100; k++) {
        tide_alloc_fail_at(k, 0);
        uint64_t r2 = 5;
        tide_status rc = tide_proto_sample(&m, TIDE_MSG_SUBMIT, &r2);
        long hits = tide_alloc_failures();
        tide_alloc_fail_at(0, 0);
        if (hits == 0) {
            cr_expect_eq(rc, TIDE_OK);
            tide_msg_clear(&m);
            break;
        }
        cr_expect_eq(rc, TIDE_ERR_NOMEM);
        cr_expect_eq(m.type, TIDE_MSG_NONE);
    }
}
