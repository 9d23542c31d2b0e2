/*
 * Unit tests for proto/'s decoder against hostile input (part of test_proto; tests/
 * proto_fixture.h): every class of bad input (the envelope, truncations, nesting bombs,
 * wrong types, numbers out of range, layout shapes, strings, arrays over their limits,
 * liveness, status pages, host heartbeats, nested rows) is refused with TIDE_ERR_PROTOCOL
 * and a detail naming the field, holding nothing.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <msgpack.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "proto/proto.h"
#include "tests/proto_fixture.h"
#include "tests/support/proto_sample.h"

/* ---- refusals: envelope ---------------------------------------------------------------------- */

Test(proto_refuse, the_example_from_the_issue)
{
    tide_msg_t m = heartbeat();
    refuse_edit(&m, OP_SET, "step", VSTR("12"),
                "heartbeat: field 'step' must be a non-negative integer (got a string)");
    refuse_edit(&m, OP_SET, "step", VINT(-1),
                "heartbeat: field 'step' must be a non-negative integer, got -1");
}

Test(proto_refuse, version_and_type)
{
    tide_msg_t m = heartbeat();
    refuse_edit(&m, OP_SET, "v", VUINT(2),
                "unsupported schema version v=2 (this build speaks v=1)");
    refuse_edit(&m, OP_SET, "v", VSTR("1"), "field 'v' must be the integer 1 (got a string)");
    refuse_edit(&m, OP_DROP, "v", VNIL, "missing field 'v'");
    refuse_edit(&m, OP_DUP, "v", VNIL, "message: duplicated field 'v'");
    refuse_edit(&m, OP_SET, "type", VSTR("heartbeats"), "message: unknown type 'heartbeats'");
    refuse_edit(&m, OP_SET, "type", VSTR("none"), "unknown type 'none'");
    refuse_edit(&m, OP_SET, "type", VUINT(3), "field 'type' must be a string (got an integer)");
    refuse_edit(&m, OP_DROP, "type", VNIL, "missing field 'type'");
    refuse_edit(&m, OP_DUP, "type", VNIL, "duplicated field 'type'");
    /* a control character in a type name is not echoed raw into logs */
    refuse_edit(&m, OP_SET, "type", VSTR("x\ny"), "unknown type 'x?y'");
}

Test(proto_refuse, missing_unknown_and_duplicated_fields)
{
    tide_msg_t m = heartbeat();
    refuse_edit(&m, OP_DROP, "gen", VNIL, "heartbeat: missing field 'gen'");
    refuse_edit(&m, OP_ADD, "color", VSTR("blue"),
                "heartbeat: unknown field 'color' (schema v1 has no such field)");
    refuse_edit(&m, OP_DUP, "step", VNIL, "heartbeat: duplicated field 'step'");
    tide_msg_t l = layout_msg();
    refuse_edit(&l, OP_DROP, "layout.micro", VNIL, "layout: missing field 'layout.micro'");
    refuse_edit(&l, OP_ADD, "layout.extra", VUINT(1), "layout: unknown field 'layout.extra'");
}

Test(proto_refuse, not_a_map_bad_keys_and_raw_bytes)
{
    const uint8_t arr[] = {0x92, 0x01, 0x02};
    expect_refused(arr, sizeof arr, "message: the top level must be a map");
    const uint8_t intkey[] = {0x81, 0x01, 0x02};
    expect_refused(intkey, sizeof intkey, "map keys must be strings (got an integer");
    const uint8_t c1[] = {0x81, 0xa1, 'v', 0xc1};
    expect_refused(c1, sizeof c1, "byte 0xc1 at offset 3 is not valid msgpack");
    expect_refused("x", 0, "message: empty input");
    const uint8_t empty_map[] = {0x80};
    expect_refused(empty_map, sizeof empty_map, "missing field 'v'");
    /* bigger than the limit: refused before a single byte is read */
    expect_refused(empty_map, (size_t)TIDE_PROTO_MAX_MSG_BYTES + 1, "exceed the");
}

Test(proto_refuse, trailing_garbage)
{
    tide_msg_t m = heartbeat();
    size_t len;
    uint8_t *bytes = encode_copy(&m, &len);
    uint8_t *more = malloc(len + 3);
    memcpy(more, bytes, len);
    more[len] = 0xc0;
    expect_refused(more, len + 1, "message: 1 trailing bytes after the message map");
    memcpy(more + len, bytes, 3);
    expect_refused(more, len + 3, "3 trailing bytes");
    free(more);
    tide_free(bytes);
}

Test(proto_refuse, every_truncation_of_every_type)
{
    uint64_t rng = test_seed();
    for (int t = TIDE_MSG_NONE + 1; t < TIDE_MSG__COUNT; t++) {
        tide_msg_t m;
        cr_assert_eq(tide_proto_sample(&m, (tide_msg_type_t)t, &rng), TIDE_OK);
        size_t len;
        uint8_t *bytes = encode_copy(&m, &len);
        for (size_t cut = 1; cut < len; cut += 1 + cut / 64) {
            /* an exact-size heap copy so that ASan sees any read past the end */
            uint8_t *p = malloc(cut);
            memcpy(p, bytes, cut);
            expect_refused(p, cut, "truncated");
            free(p);
        }
        tide_free(bytes);
        tide_msg_clear(&m);
    }
}

Test(proto_refuse, nesting_bombs_and_huge_counts)
{
    /* 100 nested arrays under a key: refused by depth, not by a crash */
    uint8_t deep[128];
    size_t n = 0;
    deep[n++] = 0x81;
    deep[n++] = 0xa1;
    deep[n++] = 'x';
    for (int i = 0; i < 100; i++)
        deep[n++] = 0x91;
    deep[n++] = 0x00;
    expect_refused(deep, n, "nesting deeper than 8 levels");
    /* an array32 declaring 4 billion entries in 6 bytes: no giant allocation, just truncation */
    const uint8_t bomb[] = {0x81, 0xa1, 'x', 0xdd, 0xff, 0xff, 0xff, 0xff, 0x00};
    expect_refused(bomb, sizeof bomb, "truncated");
    const uint8_t mapbomb[] = {0xdf, 0xff, 0xff, 0xff, 0xff, 0xa1, 'v', 0x01};
    expect_refused(mapbomb, sizeof mapbomb, "truncated");
    const uint8_t strbomb[] = {0x81, 0xdb, 0xff, 0xff, 0xff, 0xff, 'a'};
    expect_refused(strbomb, sizeof strbomb, "truncated");
}

/* ---- refusals: field types and ranges ----------------------------------------------------------
 */

Test(proto_refuse, wrong_types)
{
    tide_msg_t m = heartbeat();
    refuse_edit(&m, OP_SET, "worker", VDBL(3.0),
                "heartbeat: field 'worker' must be an integer in [0, 2147483647] (got a float)");
    refuse_edit(&m, OP_SET, "idle_ms", VSTR("1"), "field 'idle_ms' must be a number");
    refuse_edit(&m, OP_SET, "idle_ms", VNIL, "(got nil)");
    tide_msg_t l = layout_msg();
    refuse_edit(&l, OP_SET, "job", VBIN("llm"),
                "layout: field 'job' must be a string (got binary)");
    refuse_edit(&l, OP_SET, "layout", VUINT(1), "field 'layout' must be a map (got an integer)");
    refuse_edit(&l, OP_SET, "prev", VUINT(1), "field 'prev' must be a map or nil");
    refuse_edit(&l, OP_SET, "layout.stages", VSTR("0-11"), "must be an array of integers");
}

Test(proto_refuse, out_of_range_numbers)
{
    tide_msg_t m = heartbeat();
    refuse_edit(&m, OP_SET, "worker", VUINT(1ull << 31),
                "field 'worker' must be an integer in [0, 2147483647], got 2147483648");
    refuse_edit(&m, OP_SET, "idle_ms", VDBL(-1.0), "field 'idle_ms' must be a finite number");
    refuse_edit(&m, OP_SET, "idle_ms", VDBL(NAN), "field 'idle_ms' must be a finite number");
    refuse_edit(&m, OP_SET, "idle_ms", VDBL(INFINITY), "must be a finite number");
    tide_msg_t l = layout_msg();
    refuse_edit(&l, OP_SET, "layout.dp", VUINT(0),
                "layout: field 'layout.dp' must be an integer in [1, 65536], got 0");
    refuse_edit(&l, OP_SET, "layout.tp", VUINT(65537), "got 65537");
    refuse_edit(&l, OP_SET, "layout.micro", VINT(-3), "got -3");
}

Test(proto_refuse, layout_shape)
{
    tide_msg_t l = layout_msg();
    const int64_t bad_start[] = {1, 12, 24};
    refuse_edit(&l, OP_SET, "layout.stages", VIARR(bad_start, 3),
                "field 'layout.stages' must start at layer 0, got 1");
    const int64_t empty_stage[] = {0, 0, 24};
    refuse_edit(&l, OP_SET, "layout.stages", VIARR(empty_stage, 3),
                "must be strictly increasing: stage 0 has no layers");
    const int64_t short_end[] = {0, 12, 23};
    refuse_edit(&l, OP_SET, "layout.stages", VIARR(short_end, 3), "must end at layers = 24");
    const int64_t two[] = {0, 24};
    refuse_edit(&l, OP_SET, "layout.stages", VIARR(two, 2),
                "field 'layout.stages' must have 3 entries, got 2");
    const int64_t three_workers[] = {1, 2, 3};
    refuse_edit(&l, OP_SET, "layout.workers", VIARR(three_workers, 3),
                "must have 4 entries, got 3");
    const int64_t neg_worker[] = {1, 2, -3, 4};
    refuse_edit(&l, OP_SET, "layout.workers", VIARR(neg_worker, 4),
                "field 'layout.workers[2]' must be an integer in [0, 2147483647], got -3");
    refuse_edit(&l, OP_SET, "layout.dp", VUINT(65536),
                "field 'layout.workers' must have 131072 entries, got 4");
    tide_msg_t r;
    tide_msg_init(&r, TIDE_MSG_RESIZE);
    strcpy(r.u.resize.job, "llm");
    r.u.resize.dp = 1;
    r.u.resize.tp = 32;
    r.u.resize.pp = 1;
    refuse_edit(&r, OP_SET, "dp", VUINT(65536),
                "resize: dp*tp*pp = 65536*32*1 = 2097152 exceeds 1048576 workers");
    const int64_t bad_resize_stages[] = {0, 5, 3};
    r.u.resize.pp = 2;
    refuse_edit(&r, OP_SET, "stages", VIARR(bad_resize_stages, 3),
                "resize: field 'stages' must be strictly increasing: stage 1 has no layers");
    refuse_edit(&r, OP_SET, "stages", VIARR(bad_resize_stages, 2),
                "field 'stages' must be empty or hold pp + 1 = 3 boundaries, got 2");
    refuse_edit(&r, OP_SET, "placement", VSTR("best"),
                "field 'placement' must be one of \"default\", \"optimal\", got \"best\"");
    refuse_edit(&l, OP_SET, "layout.layers", VUINT(1),
                "field 'layout.layers' = 1 is fewer than pp");
}

Test(proto_refuse, strings)
{
    tide_msg_t l = layout_msg();
    char long_name[200];
    memset(long_name, 'a', sizeof long_name);
    refuse_edit(&l, OP_SET, "job", VSTRN(long_name, 128),
                "field 'job' is 128 bytes, longer than the limit of 127");
    refuse_edit(&l, OP_SET, "job", VSTR(""), "field 'job' must not be empty");
    refuse_edit(&l, OP_SET, "job", VSTRN("ab\0cd", 5), "field 'job' must not contain a NUL byte");
    refuse_edit(&l, OP_SET, "job", VSTR("my job"),
                "field 'job' may hold only letters, digits and . _ - : (byte 2 is 0x20)");
    tide_msg_t e;
    tide_msg_init(&e, TIDE_MSG_ERROR);
    e.u.error.code = TIDE_ERR_DENIED;
    strcpy(e.u.error.message, "no");
    refuse_edit(&e, OP_SET, "message", VSTRN("a\0b", 3), "field 'message' must not contain a NUL");
    char text[1100];
    memset(text, 'x', sizeof text);
    refuse_edit(&e, OP_SET, "message", VSTRN(text, 1024), "longer than the limit of 1023");
    refuse_edit(&e, OP_SET, "code", VINT(0), "field 'code' must be an integer in [-1000, -1]");
    tide_msg_t r;
    tide_msg_init(&r, TIDE_MSG_REGISTER);
    strcpy(r.u.reg.pool, "p1");
    r.u.reg.rank = 0;
    r.u.reg.size = 2;
    strcpy(r.u.reg.host, "node-1");
    r.u.reg.pid = 99;
    refuse_edit(&r, OP_SET, "host", VSTR("a b"), "printable ASCII without spaces");
    refuse_edit(&r, OP_SET, "kind", VSTR("tpu"),
                "register: field 'kind' must be one of \"cpu\", \"gpu\", got \"tpu\"");
    refuse_edit(&r, OP_SET, "rank", VUINT(2), "field 'rank' = 2 must be below field 'size' = 2");
}

Test(proto_refuse, arrays_over_their_limits)
{
    tide_msg_t s;
    tide_msg_init(&s, TIDE_MSG_SUBMIT);
    strcpy(s.u.submit.name, "sweep");
    s.u.submit.kind = TIDE_JOB_COMMAND;
    char *argv[] = {"python", "train.py"};
    s.u.submit.argv = argv;
    s.u.submit.argc = 2;
    size_t len;
    uint8_t *bytes = encode_copy(&s, &len);
    tide_free(bytes);

    /* 257 argv entries */
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_map(&pk, 9);
    pack_cstr(&pk, "v");
    msgpack_pack_uint64(&pk, 1);
    pack_cstr(&pk, "type");
    pack_cstr(&pk, "submit");
    pack_cstr(&pk, "name");
    pack_cstr(&pk, "sweep");
    pack_cstr(&pk, "kind");
    pack_cstr(&pk, "command");
    pack_cstr(&pk, "plugin");
    pack_cstr(&pk, "");
    pack_cstr(&pk, "argv");
    msgpack_pack_array(&pk, 257);
    for (int i = 0; i < 257; i++)
        pack_cstr(&pk, "x");
    pack_cstr(&pk, "priority");
    msgpack_pack_int64(&pk, 0);
    pack_cstr(&pk, "mem_cap");
    msgpack_pack_uint64(&pk, 0);
    pack_cstr(&pk, "bubbles");
    msgpack_pack_false(&pk);
    expect_refused(sb.data, sb.size,
                   "submit: field 'argv' has 257 entries, more than the limit of 256");
    msgpack_sbuffer_destroy(&sb);

    char big[4100];
    memset(big, 'y', sizeof big);
    refuse_edit(&s, OP_SET, "argv.1", VSTRN(big, 4096), "field 'argv[1]' is 4096 bytes");
    refuse_edit(&s, OP_SET, "argv.0", VUINT(1),
                "field 'argv[0]' must be a string (got an integer)");
    refuse_edit(&s, OP_SET, "argv", VIARR(NULL, 0),
                "submit: field 'argv' must hold the command to run");
    refuse_edit(&s, OP_SET, "kind", VSTR("online"),
                "field 'kind' must be \"command\" or \"plugin\"");
    refuse_edit(&s, OP_SET, "plugin", VSTR("p"), "field 'plugin' must be \"\" for a command job");
}

/* liveness: ranks 1..2^20 job ranks, strictly increasing; its reply echoes them with one
   0/1 per rank. A request that could match no reply, or a reply that could be misread as
   another rank's answer, is refused. */
Test(proto_refuse, liveness_and_its_reply)
{
    int32_t ranks[3] = {1, 4, 9}, alive[3] = {1, 0, 1};
    tide_msg_t q;
    tide_msg_init(&q, TIDE_MSG_LIVENESS);
    q.u.liveness.worker = 3;
    strcpy(q.u.liveness.job, "llm");
    q.u.liveness.ranks = ranks;
    q.u.liveness.n_ranks = 3;
    tide_msg_t r;
    tide_msg_init(&r, TIDE_MSG_LIVENESS_REPLY);
    strcpy(r.u.liveness_reply.job, "llm");
    r.u.liveness_reply.ranks = ranks;
    r.u.liveness_reply.n_ranks = 3;
    r.u.liveness_reply.alive = alive;
    r.u.liveness_reply.n_alive = 3;
    const int64_t none[1] = {0};
    refuse_edit(&q, OP_SET, "ranks", VIARR(none, 0), "field 'ranks' must name at least one");
    const int64_t unsorted[3] = {4, 1, 9};
    refuse_edit(&q, OP_SET, "ranks", VIARR(unsorted, 3), "must be strictly increasing");
    const int64_t twice[3] = {1, 4, 4};
    refuse_edit(&q, OP_SET, "ranks", VIARR(twice, 3), "must be strictly increasing");
    const int64_t too_big[1] = {1 << 20};
    refuse_edit(&q, OP_SET, "ranks", VIARR(too_big, 1),
                "field 'ranks[0]' must be an integer in [0, 1048575], got 1048576");
    refuse_edit(&q, OP_DROP, "job", VNIL, "missing field 'job'");
    refuse_edit(&q, OP_ADD, "gen", VUINT(1), "unknown field 'gen'");
    const int64_t two[2] = {1, 0};
    refuse_edit(&r, OP_SET, "alive", VIARR(two, 2),
                "field 'alive' has 2 entries where field 'ranks' has 3");
    const int64_t not_bool[3] = {1, 2, 0};
    refuse_edit(&r, OP_SET, "alive", VIARR(not_bool, 3),
                "field 'alive[1]' must be an integer in [0, 1], got 2");
    refuse_edit(&r, OP_SET, "alive", VSTR("yes"), "field 'alive' must be an array of integers");
    /* the encoder refuses what the decoder would */
    tide_proto_buf_t b;
    tide_proto_buf_init(&b);
    r.u.liveness_reply.n_alive = 2;
    cr_expect_eq(tide_proto_encode(&r, &b), TIDE_ERR_INVALID);
    q.u.liveness.n_ranks = 0;
    cr_expect_eq(tide_proto_encode(&q, &b), TIDE_ERR_INVALID);
    tide_proto_buf_destroy(&b);
}

/* status pages: a reply never holds more rows than its total, its rows come in worker
   order below the next page's start, and a page that announces another one is not empty
   (a reader that follows `next` always ends). The request's limit stays within a reply. */
Test(proto_refuse, status_pages)
{
    tide_proto_gpu_row_t rows[2];
    memset(rows, 0, sizeof rows);
    for (int i = 0; i < 2; i++) {
        rows[i].worker = 10 + 5 * i;
        strcpy(rows[i].host, "h");
        rows[i].stage = rows[i].dp_rank = rows[i].tp_rank = -1;
    }
    tide_msg_t m;
    tide_msg_init(&m, TIDE_MSG_STATUS_REPLY);
    m.u.status_reply.rows = rows;
    m.u.status_reply.n_rows = 2;
    m.u.status_reply.total = 9;
    m.u.status_reply.next = 16;
    refuse_edit(&m, OP_SET, "total", VUINT(1),
                "field 'rows' has 2 entries, more than field "
                "'total' = 1");
    refuse_edit(&m, OP_SET, "next", VINT(15),
                "field 'next' = 15 must be above every row's "
                "worker (rows[1].worker = 15)");
    refuse_edit(&m, OP_SET, "next", VINT(-2), "field 'next' must be an integer in [-1, ");
    refuse_edit(&m, OP_DROP, "total", VNIL, "missing field 'total'");
    refuse_edit(&m, OP_SET, "rows.1.worker", VUINT(3), "must be in increasing worker order");
    tide_msg_t e;
    tide_msg_init(&e, TIDE_MSG_STATUS_REPLY);
    e.u.status_reply.total = 4;
    e.u.status_reply.next = -1;
    refuse_edit(&e, OP_SET, "next", VINT(7), "announces another page after an empty one");
    tide_msg_t q;
    tide_msg_init(&q, TIDE_MSG_STATUS);
    refuse_edit(&q, OP_SET, "limit", VUINT(65537),
                "field 'limit' must be an integer in [0, "
                "65536], got 65537");
    refuse_edit(&q, OP_SET, "from", VINT(-1), "field 'from' must be an integer in [0, ");
    refuse_edit(&q, OP_SET, "all", VUINT(1), "field 'all' must be");
    refuse_edit(&q, OP_DROP, "from", VNIL, "missing field 'from'");
    /* the job filter: "" or a job name, and never absent */
    refuse_edit(&q, OP_DROP, "job", VNIL, "missing field 'job'");
    refuse_edit(&q, OP_SET, "job", VSTR("two words"), "field 'job'");
    refuse_edit(&q, OP_SET, "job", VUINT(3), "field 'job' must be a string");
    char long_name[TIDE_PROTO_NAME_MAX + 2];
    memset(long_name, 'j', sizeof long_name - 1);
    long_name[sizeof long_name - 1] = '\0';
    refuse_edit(&q, OP_SET, "job", VSTR(long_name), "field 'job'");
    strcpy(q.u.status.job, "llm.v2:a-b_c");
    {
        size_t len;
        uint8_t *bytes = encode_copy(&q, &len);
        tide_msg_t d;
        cr_assert_eq(tide_proto_decode(bytes, len, &d), TIDE_OK, "%s", tide_last_error());
        cr_expect_str_eq(d.u.status.job, "llm.v2:a-b_c");
        tide_msg_clear(&d);
        tide_free(bytes);
    }
    tide_msg_t ok;
    tide_msg_init(&ok, TIDE_MSG_REGISTER_OK);
    ok.u.register_ok.worker = 1;
    ok.u.register_ok.heartbeat_ms = 1000;
    ok.u.register_ok.fail_ms = 3000;
    refuse_edit(&ok, OP_SET, "fail_ms", VUINT(999),
                "field 'fail_ms' = 999 must be at least field 'heartbeat_ms' = 1000");
    refuse_edit(&ok, OP_DROP, "fail_ms", VNIL, "missing field 'fail_ms'");
    tide_msg_t f;
    tide_msg_init(&f, TIDE_MSG_FENCED);
    f.u.fenced.worker = 4;
    strcpy(f.u.fenced.job, "llm");
    refuse_edit(&f, OP_SET, "job", VSTR("no spaces"), "field 'job'");
    refuse_edit(&f, OP_DROP, "reason", VNIL, "missing field 'reason'");
    cr_expect_eq(tide_msg_type_role(TIDE_MSG_LIVENESS), TIDE_ROLE_WORKER);
    cr_expect_eq(tide_msg_type_role(TIDE_MSG_FENCED), TIDE_ROLE_COORDINATOR);
    cr_expect_str_eq(tide_proto_worker_state_name(TIDE_WORKER_LEFT), "left");
}

/* host heartbeats: the heartbeats of a host's ranks, each a full heartbeat map, in worker
   order, the sender's among them; anything else is refused, and the encoder refuses it too. */
Test(proto_refuse, host_heartbeats)
{
    tide_proto_heartbeat_t beats[3];
    memset(beats, 0, sizeof beats);
    for (int i = 0; i < 3; i++) {
        beats[i].worker = 20 + 3 * i;
        beats[i].step = 100 + (uint64_t)i;
        beats[i].gen = 2;
        beats[i].bubble_ms = 1.5 * i;
        beats[i].step_ms = 250;
    }
    tide_msg_t m;
    tide_msg_init(&m, TIDE_MSG_HOST_HEARTBEAT);
    m.u.host_heartbeat.worker = 23;
    m.u.host_heartbeat.beats = beats;
    m.u.host_heartbeat.n_beats = 3;
    size_t len;
    uint8_t *bytes = encode_copy(&m, &len);
    tide_msg_t d;
    cr_assert_eq(tide_proto_decode(bytes, len, &d), TIDE_OK, "%s", tide_last_error());
    char why[128] = "";
    cr_assert(same_msg(&m, &d, why, sizeof why), "round trip: %s", why);
    tide_msg_clear(&d);
    tide_free(bytes);
    cr_expect_eq(tide_msg_type_role(TIDE_MSG_HOST_HEARTBEAT), TIDE_ROLE_WORKER);

    refuse_edit(&m, OP_SET, "beats.2.worker", VUINT(23),
                "strictly increasing worker order "
                "(beats[2].worker = 23 after 23)");
    refuse_edit(&m, OP_SET, "beats.0.worker", VUINT(30), "strictly increasing worker order");
    refuse_edit(&m, OP_SET, "worker", VUINT(21), "lacks the sender's own heartbeat (worker 21)");
    refuse_edit(&m, OP_SET, "beats", VIARR(NULL, 0), "at least the sender's own heartbeat");
    refuse_edit(&m, OP_SET, "beats.1.step", VINT(-1), "field 'beats[1].step'");
    refuse_edit(&m, OP_SET, "beats.1.bubble_ms", VDBL(-2.0), "field 'beats[1].bubble_ms'");
    refuse_edit(&m, OP_DROP, "beats.0.gen", VNIL, "missing field 'beats[0].gen'");
    refuse_edit(&m, OP_ADD, "beats.2.extra", VUINT(1), "unknown field");
    refuse_edit(&m, OP_SET, "beats.1", VUINT(5), "field 'beats[1]' must be a map");
    refuse_edit(&m, OP_SET, "beats", VSTR("all"), "field 'beats'");
    refuse_edit(&m, OP_DROP, "beats", VNIL, "missing field 'beats'");
    refuse_edit(&m, OP_ADD, "step", VUINT(1), "unknown field 'step'");

    /* one more than a host's ranks may be is refused */
    size_t n = TIDE_PROTO_HOST_BEATS_MAX + 1;
    tide_proto_heartbeat_t *many = calloc(n, sizeof *many);
    cr_assert(many != NULL);
    for (size_t i = 0; i < n; i++)
        many[i].worker = (int32_t)i;
    m.u.host_heartbeat.worker = 0;
    m.u.host_heartbeat.beats = many;
    m.u.host_heartbeat.n_beats = (uint32_t)(n - 1);
    bytes = encode_copy(&m, &len); /* the limit itself is fine */
    cr_assert_eq(tide_proto_decode(bytes, len, &d), TIDE_OK, "%s", tide_last_error());
    tide_msg_clear(&d);
    tide_free(bytes);
    tide_proto_buf_t b;
    tide_proto_buf_init(&b);
    m.u.host_heartbeat.n_beats = (uint32_t)n;
    cr_expect_eq(tide_proto_encode(&m, &b), TIDE_ERR_INVALID);
    /* the encoder refuses what the decoder would */
    m.u.host_heartbeat.n_beats = 3;
    m.u.host_heartbeat.beats = beats;
    m.u.host_heartbeat.worker = 99;
    cr_expect_eq(tide_proto_encode(&m, &b), TIDE_ERR_INVALID);
    m.u.host_heartbeat.worker = 23;
    beats[2].worker = 20;
    cr_expect_eq(tide_proto_encode(&m, &b), TIDE_ERR_INVALID);
    m.u.host_heartbeat.n_beats = 0;
    cr_expect_eq(tide_proto_encode(&m, &b), TIDE_ERR_INVALID);
    tide_proto_buf_destroy(&b);
    /* the decoder's limit, checked on the wire too (the encoder would not make it) */
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_map(&pk, 4);
    pack_cstr(&pk, "v");
    msgpack_pack_int(&pk, TIDE_PROTO_VERSION);
    pack_cstr(&pk, "type");
    pack_cstr(&pk, "host_heartbeat");
    pack_cstr(&pk, "worker");
    msgpack_pack_int(&pk, 0);
    pack_cstr(&pk, "beats");
    msgpack_pack_array(&pk, (uint32_t)n);
    for (size_t i = 0; i < n; i++) {
        msgpack_pack_map(&pk, 7);
        pack_cstr(&pk, "worker");
        msgpack_pack_uint64(&pk, i);
        const char *keys[] = {"step", "gen", "idle_ms", "bubble_ms", "filled_ms", "step_ms"};
        for (int k = 0; k < 6; k++) {
            pack_cstr(&pk, keys[k]);
            msgpack_pack_uint64(&pk, 0);
        }
    }
    expect_refused(sb.data, sb.size, "field 'beats' has 1025 entries, more than the limit of 1024");
    msgpack_sbuffer_destroy(&sb);
    free(many);
}

Test(proto_refuse, nested_rows_name_their_index)
{
    uint64_t rng = 12345;
    tide_msg_t m;
    tide_msg_init(&m, TIDE_MSG_NONE);
    do {
        tide_msg_clear(&m);
        tide_proto_sample(&m, TIDE_MSG_STATUS_REPLY, &rng);
    } while (m.u.status_reply.n_rows < 3);
    refuse_edit(&m, OP_SET, "rows.2.host", VUINT(5),
                "status_reply: field 'rows[2].host' must be a string (got an integer)");
    refuse_edit(&m, OP_SET, "rows.1.state", VSTR("sleeping"),
                "field 'rows[1].state' must be one of");
    refuse_edit(&m, OP_DROP, "rows.0.bubble_pct", VNIL, "missing field 'rows[0].bubble_pct'");
    refuse_edit(&m, OP_SET, "rows.0", VUINT(1), "field 'rows[0]' must be a map (got an integer)");
    refuse_edit(&m, OP_SET, "rows.0.bubble_pct", VDBL(100.5),
                "must be a finite number in [0, 100]");
    tide_msg_clear(&m);
}
