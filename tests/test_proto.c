/*
 * Unit tests for proto/, its round trips (the rest of test_proto: test_proto_refuse.c,
 * test_proto_encode.c, test_proto_record.c): every message type round-trips (property test
 * over random values, seed printed and settable with TIDE_TEST_SEED), then each message
 * with optional or bounded fields (heartbeat, offline limits, layouts with a previous
 * generation, joins and releases of pools, fit rules, checkpoints, a Slurm allocation)
 * exactly, the limits (2^20 workers) at their edges, and their bad forms refused; the
 * message types' names and roles, and the attempt-log path.
 */
#include <criterion/criterion.h>
#include <msgpack.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "proto/proto.h"
#include "tests/proto_fixture.h"
#include "tests/support/proto_sample.h"

/* ---- round trips --------------------------------------------------------------------------------
 */

Test(proto_roundtrip, every_type_with_random_values)
{
    uint64_t seed = test_seed();
    fprintf(stderr, "proto_roundtrip: seed=%llu (TIDE_TEST_SEED=%llu reproduces)\n",
            (unsigned long long)seed, (unsigned long long)seed);
    uint64_t rng = seed;
    tide_proto_buf_t b1, b2;
    tide_proto_buf_init(&b1);
    tide_proto_buf_init(&b2);
    for (int t = TIDE_MSG_NONE + 1; t < TIDE_MSG__COUNT; t++) {
        for (int it = 0; it < 150; it++) {
            uint64_t case_seed = rng;
            tide_msg_t m, d;
            cr_assert_eq(tide_proto_sample(&m, (tide_msg_type_t)t, &rng), TIDE_OK, "%s",
                         tide_last_error());
            tide_status rc = tide_proto_encode(&m, &b1);
            cr_assert_eq(rc, TIDE_OK, "seed %llu type %s it %d: encode: %s",
                         (unsigned long long)seed, tide_msg_type_name(t), it, tide_last_error());
            rc = tide_proto_decode(b1.data, b1.len, &d);
            cr_assert_eq(rc, TIDE_OK, "seed %llu (case %llu) type %s it %d: decode: %s",
                         (unsigned long long)seed, (unsigned long long)case_seed,
                         tide_msg_type_name(t), it, tide_last_error());
            char why[128];
            cr_assert(same_msg(&m, &d, why, sizeof why),
                      "seed %llu (case %llu) type %s it %d: round trip changed the message: %s",
                      (unsigned long long)seed, (unsigned long long)case_seed,
                      tide_msg_type_name(t), it, why);
            /* the encoding is canonical: re-encoding the decoded message gives the same bytes */
            cr_assert_eq(tide_proto_encode(&d, &b2), TIDE_OK);
            cr_assert(b1.len == b2.len && memcmp(b1.data, b2.data, b1.len) == 0,
                      "seed %llu type %s: re-encoding differs", (unsigned long long)seed,
                      tide_msg_type_name(t));
            tide_msg_clear(&m);
            tide_msg_clear(&d);
            cr_assert_eq(d.type, TIDE_MSG_NONE);
        }
    }
    tide_proto_buf_destroy(&b1);
    tide_proto_buf_destroy(&b2);
}

Test(proto_roundtrip, heartbeat_is_small_and_exact)
{
    tide_msg_t m = heartbeat(), d;
    size_t len;
    uint8_t *bytes = encode_copy(&m, &len);
    cr_expect_lt(len, 128u, "a heartbeat should stay small on the wire (%zu bytes)", len);
    cr_assert_eq(tide_proto_decode(bytes, len, &d), TIDE_OK, "%s", tide_last_error());
    cr_expect_eq(d.type, TIDE_MSG_HEARTBEAT);
    cr_expect_eq(d.u.heartbeat.worker, 7);
    cr_expect_eq(d.u.heartbeat.step, 1234u);
    cr_expect_eq(d.u.heartbeat.gen, 3u);
    cr_expect_eq(d.u.heartbeat.bubble_ms, 20.25);
    cr_expect_eq(d.u.heartbeat.filled_ms, 17.5);
    tide_free(bytes);
}

/* in_step_ms (a step in progress, for stall detection) is optional: left out when 0, so a
   heartbeat of a peer that does not send it decodes (as 0), and carried exactly when set. */
Test(proto_roundtrip, heartbeat_in_step_is_optional)
{
    tide_msg_t m = heartbeat(), d;
    size_t len;
    uint8_t *bytes = encode_copy(&m, &len);
    cr_expect(memmem(bytes, len, "in_step_ms", 10) == NULL, "0 is not sent");
    cr_assert_eq(tide_proto_decode(bytes, len, &d), TIDE_OK, "%s", tide_last_error());
    cr_expect_eq(d.u.heartbeat.in_step_ms, 0.0);
    tide_free(bytes);
    m.u.heartbeat.in_step_ms = 42000.5;
    bytes = encode_copy(&m, &len);
    cr_expect(memmem(bytes, len, "in_step_ms", 10) != NULL);
    cr_assert_eq(tide_proto_decode(bytes, len, &d), TIDE_OK, "%s", tide_last_error());
    cr_expect_eq(d.u.heartbeat.in_step_ms, 42000.5);
    cr_expect_eq(d.u.heartbeat.step_ms, 310.0);
    tide_free(bytes);
    m.u.heartbeat.in_step_ms = -1.0;
    tide_proto_buf_t b;
    tide_proto_buf_init(&b);
    cr_expect_neq(tide_proto_encode(&m, &b), TIDE_OK, "a negative duration is refused");
    tide_proto_buf_destroy(&b);
}

/* An offline job's host limits (max_memory, max_procs) are optional: left out when 0, so a
   submit or an assignment from a peer of before them decodes (no limit), and carried
   exactly when set; a process count beyond pid_max's is refused. */
Test(proto_roundtrip, offline_limits_are_optional)
{
    static char *argv[] = {"sleep", "1"};
    tide_msg_t m, d;
    tide_msg_init(&m, TIDE_MSG_SUBMIT);
    snprintf(m.u.submit.name, sizeof m.u.submit.name, "sweep");
    m.u.submit.kind = TIDE_JOB_COMMAND;
    m.u.submit.argv = argv;
    m.u.submit.argc = 2;
    size_t len;
    uint8_t *bytes = encode_copy(&m, &len);
    cr_expect(memmem(bytes, len, "max_memory", 10) == NULL, "0 is not sent");
    cr_expect(memmem(bytes, len, "max_procs", 9) == NULL, "0 is not sent");
    cr_assert_eq(tide_proto_decode(bytes, len, &d), TIDE_OK, "%s", tide_last_error());
    cr_expect(d.u.submit.max_memory == 0 && d.u.submit.max_procs == 0);
    tide_msg_clear(&d);
    tide_free(bytes);
    m.u.submit.max_memory = 256ull << 20;
    m.u.submit.max_procs = 20;
    bytes = encode_copy(&m, &len);
    cr_assert_eq(tide_proto_decode(bytes, len, &d), TIDE_OK, "%s", tide_last_error());
    cr_expect(d.u.submit.max_memory == 256ull << 20 && d.u.submit.max_procs == 20);
    tide_msg_clear(&d);
    tide_free(bytes);
    m.u.submit.max_procs = TIDE_PROTO_PROCS_MAX + 1;
    tide_proto_buf_t b;
    tide_proto_buf_init(&b);
    cr_expect_neq(tide_proto_encode(&m, &b), TIDE_OK, "a process count beyond pid_max's");
    tide_proto_buf_destroy(&b);
}

/* The previous generation of layout_msg(): gen 4, dp 2 over 24 layers on the given
   arrays (the caller's: no clear). */
static tide_proto_layout_t prev_layout(int *stages, int32_t *workers)
{
    return (tide_proto_layout_t){.gen = 4,
                                 .dp = 2,
                                 .tp = 1,
                                 .pp = 1,
                                 .num_layers = 24,
                                 .micro_batches = 8,
                                 .stage_start = stages,
                                 .worker = workers};
}

Test(proto_roundtrip, layout_with_previous_generation)
{
    tide_msg_t m = layout_msg(), d;
    int prev_stages[2] = {0, 24};
    int32_t prev_workers[2] = {10, 11};
    m.u.layout.has_prev = 1;
    m.u.layout.prev = prev_layout(prev_stages, prev_workers);
    size_t len;
    uint8_t *bytes = encode_copy(&m, &len);
    cr_assert_eq(tide_proto_decode(bytes, len, &d), TIDE_OK, "%s", tide_last_error());
    cr_expect_eq(d.u.layout.has_prev, 1);
    cr_expect_eq(d.u.layout.prev.gen, 4u);
    cr_expect_eq(d.u.layout.prev.worker[1], 11);
    cr_expect_eq(d.u.layout.layout.stage_start[1], 12);
    cr_expect_eq(d.u.layout.layout.worker[3], 13);
    tide_msg_clear(&d);
    tide_free(bytes);
}

Test(proto_roundtrip, join_of_a_later_pool_and_its_bad_forms)
{
    /* job ranks 0..11 connected, 12..13 joining; the layout takes 10, 11, 12, 13 */
    tide_msg_t m = layout_msg(), d;
    int prev_stages[2] = {0, 24};
    int32_t prev_workers[2] = {10, 11}, old_side[3] = {0, 10, 11}, new_side[2] = {12, 13};
    int32_t grown[4] = {10, 11, 12, 13};
    m.u.layout.layout.worker = grown;
    m.u.layout.has_prev = 1;
    m.u.layout.prev = prev_layout(prev_stages, prev_workers);
    m.u.layout.base = 12;
    m.u.layout.world = 14;
    m.u.layout.join_old = old_side;
    m.u.layout.n_join_old = 3;
    m.u.layout.join_new = new_side;
    m.u.layout.n_join_new = 2;
    size_t len;
    uint8_t *bytes = encode_copy(&m, &len);
    cr_assert_eq(tide_proto_decode(bytes, len, &d), TIDE_OK, "%s", tide_last_error());
    cr_expect_eq(d.u.layout.base, 12);
    cr_expect_eq(d.u.layout.world, 14);
    cr_assert_eq(d.u.layout.n_join_old, 3u);
    cr_assert_eq(d.u.layout.n_join_new, 2u);
    cr_expect_eq(d.u.layout.join_old[2], 11);
    cr_expect_eq(d.u.layout.join_new[1], 13);
    tide_msg_clear(&d);
    tide_free(bytes);
    /* each bad form is refused with the reason, on encode and on decode */
    struct {
        int32_t base, world;
        int32_t o[3], n[2];
        uint32_t no, nn;
        const char *why;
    } bad[] = {
        {14, 14, {0, 10, 11}, {12, 13}, 3, 2, "field 'base' = 14 must be below field 'world'"},
        {0, 13, {0, 10, 11}, {12, 13}, 3, 2, "field 'join_new[1]' = 13 must be below"},
        {0, 14, {0, 11, 10}, {12, 13}, 3, 2, "field 'join_old' must be strictly increasing"},
        {0, 14, {0, 10, 12}, {12, 13}, 3, 2, "job rank 12 is on both sides of the join"},
        {0, 14, {0, 10, 11}, {12, 13}, 3, 0, "must be both empty or both given"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        tide_msg_t b = m;
        b.u.layout.base = bad[i].base;
        b.u.layout.world = bad[i].world;
        b.u.layout.join_old = bad[i].o;
        b.u.layout.n_join_old = bad[i].no;
        b.u.layout.join_new = bad[i].n;
        b.u.layout.n_join_new = bad[i].nn;
        tide_proto_buf_t buf;
        tide_proto_buf_init(&buf);
        cr_expect_neq(tide_proto_encode(&b, &buf), TIDE_OK, "case %zu encoded", i);
        cr_expect(strstr(tide_last_error(), bad[i].why) != NULL, "case %zu: %s", i,
                  tide_last_error());
        tide_proto_buf_destroy(&buf);
    }
    /* a first layout cannot connect anything */
    tide_msg_t f = m;
    f.u.layout.has_prev = 0;
    tide_proto_buf_t buf;
    tide_proto_buf_init(&buf);
    cr_expect_neq(tide_proto_encode(&f, &buf), TIDE_OK);
    cr_expect(strstr(tide_last_error(), "a join needs field 'prev'") != NULL, "%s",
              tide_last_error());
    tide_proto_buf_destroy(&buf);
}

/* join "llm" of worker 3: 24 layers, dp 4 x tp 2 x pp 1, no tensors, fit rules (borrowed). */
static tide_msg_t join_msg(tide_proto_fit_t *fit, uint32_t n_fit)
{
    tide_msg_t m;
    tide_msg_init(&m, TIDE_MSG_JOIN);
    m.u.join.worker = 3;
    strcpy(m.u.join.job, "llm");
    m.u.join.total_bytes = 1 << 20;
    m.u.join.num_layers = 24;
    m.u.join.dp = 4;
    m.u.join.tp = 2;
    m.u.join.pp = 1;
    m.u.join.micro_batches = 4;
    m.u.join.fit = fit;
    m.u.join.n_fit = n_fit;
    return m;
}

/* Bounds and priority declared at launch are optional: a join without them (a worker of
   before them) is the bytes it was and decodes as none; with them they travel exactly;
   one bound without the other, or out of range, is refused. */
Test(proto_roundtrip, join_bounds_and_priority_are_optional)
{
    tide_msg_t m = join_msg(NULL, 0), d;
    size_t len;
    uint8_t *bytes = encode_copy(&m, &len);
    cr_expect(memmem(bytes, len, "priority", 8) == NULL, "0 is not sent");
    cr_expect(memmem(bytes, len, "\xa3max", 4) == NULL, "0 is not sent");
    cr_assert_eq(tide_proto_decode(bytes, len, &d), TIDE_OK, "%s", tide_last_error());
    cr_expect_eq(d.u.join.min_gpus, 0);
    cr_expect_eq(d.u.join.max_gpus, 0);
    cr_expect_eq(d.u.join.priority, 0);
    tide_msg_clear(&d);
    tide_free(bytes);
    m.u.join.min_gpus = 4;
    m.u.join.max_gpus = 12;
    m.u.join.priority = 100;
    bytes = encode_copy(&m, &len);
    cr_assert_eq(tide_proto_decode(bytes, len, &d), TIDE_OK, "%s", tide_last_error());
    char why[128];
    cr_assert(same_msg(&m, &d, why, sizeof why), "%s", why);
    cr_expect_eq(d.u.join.min_gpus, 4);
    cr_expect_eq(d.u.join.max_gpus, 12);
    cr_expect_eq(d.u.join.priority, 100);
    tide_msg_clear(&d);
    tide_free(bytes);
    struct {
        int32_t min, max, prio;
        const char *why;
    } bad[] = {
        {4, 0, 0, "fields 'min' = 4 and 'max' = 0 must both be 0 (no bounds) or both be set"},
        {0, 4, 0, "fields 'min' = 0 and 'max' = 4 must both be 0 (no bounds) or both be set"},
        {1, 4, 101, "priority"},
        {-1, 4, 0, "min"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        tide_msg_t b = join_msg(NULL, 0);
        b.u.join.min_gpus = bad[i].min;
        b.u.join.max_gpus = bad[i].max;
        b.u.join.priority = bad[i].prio;
        tide_proto_buf_t buf;
        tide_proto_buf_init(&buf);
        cr_expect_neq(tide_proto_encode(&b, &buf), TIDE_OK, "case %zu encoded", i);
        cr_expect(strstr(tide_last_error(), bad[i].why) != NULL, "case %zu: %s", i,
                  tide_last_error());
        tide_proto_buf_destroy(&buf);
    }
}

/* What a program can run travels with its join, exactly, and nothing malformed passes:
   the rules decide which layouts tided refuses, so a damaged rule must not read as a
   weaker one. */
Test(proto_roundtrip, join_fit_rules_and_their_bad_forms)
{
    tide_proto_fit_t fit[3] = {{0, 4, "the global batch 16 / 4 micro-batches"},
                               {1, 64, "the hidden size"},
                               {2, INT64_C(1) << 62, ""}};
    tide_msg_t m = join_msg(fit, 3);
    size_t len;
    uint8_t *bytes = encode_copy(&m, &len);
    tide_msg_t d;
    cr_assert_eq(tide_proto_decode(bytes, len, &d), TIDE_OK, "%s", tide_last_error());
    char why[128];
    cr_assert(same_msg(&m, &d, why, sizeof why), "%s", why);
    cr_expect_str_eq(d.u.join.fit[0].what, "the global batch 16 / 4 micro-batches");
    cr_expect_eq(d.u.join.fit[2].n, INT64_C(1) << 62);
    tide_msg_clear(&d);
    tide_free(bytes);

    tide_msg_t none = join_msg(NULL, 0); /* a program that declared nothing: "fit": [] */
    bytes = encode_copy(&none, &len);
    cr_assert_eq(tide_proto_decode(bytes, len, &d), TIDE_OK, "%s", tide_last_error());
    cr_expect_eq(d.u.join.n_fit, 0u);
    tide_msg_clear(&d);
    tide_free(bytes);

    refuse_edit(&m, OP_DROP, "fit", VNIL, "join: missing field 'fit'");
    refuse_edit(&m, OP_SET, "fit", VUINT(4), "field 'fit' must be an array");
    refuse_edit(&m, OP_SET, "fit.0", VUINT(4), "field 'fit[0]' must be a map (got an integer)");
    refuse_edit(
        &m, OP_SET, "fit.1.degree", VSTR("ep"),
        "field 'fit[1].degree' must be one of \"dp\", \"tp\", \"pp\", \"dp_micro\", got \"ep\"");
    refuse_edit(&m, OP_SET, "fit.0.n", VUINT(0), "field 'fit[0].n' must be an integer in [1, ");
    refuse_edit(&m, OP_SET, "fit.0.n", VINT(-16), "got -16");
    refuse_edit(&m, OP_SET, "fit.2.n", VUINT((UINT64_C(1) << 62) + 1), "field 'fit[2].n'");
    refuse_edit(&m, OP_SET, "fit.0.n", VSTR("16"), "field 'fit[0].n' must be an integer");
    refuse_edit(&m, OP_SET, "fit.0.what", VSTR("two\nlines"),
                "field 'fit[0].what' may hold only printable ASCII (byte 3 is 0x0a)");
    char long_what[100];
    memset(long_what, 'w', sizeof long_what);
    refuse_edit(&m, OP_SET, "fit.0.what", VSTRN(long_what, 96),
                "field 'fit[0].what' is 96 bytes, longer than the limit of 95");
    refuse_edit(&m, OP_DROP, "fit.1.what", VNIL, "missing field 'fit[1].what'");
    refuse_edit(&m, OP_ADD, "fit.1.why", VSTR("x"), "unknown field");
    refuse_edit(&m, OP_DUP, "fit.0.n", VNIL, "duplicate");

    /* one rule more than the limit */
    tide_proto_fit_t many[TIDE_PROTO_FIT_MAX + 1];
    memset(many, 0, sizeof many);
    for (int i = 0; i <= TIDE_PROTO_FIT_MAX; i++)
        many[i] = (tide_proto_fit_t){0, 8, ""};
    tide_msg_t ok = join_msg(many, TIDE_PROTO_FIT_MAX);
    bytes = encode_copy(&ok, &len);
    cr_assert_eq(tide_proto_decode(bytes, len, &d), TIDE_OK, "%s", tide_last_error());
    tide_msg_clear(&d);
    tide_free(bytes);
    tide_msg_t over = join_msg(many, TIDE_PROTO_FIT_MAX + 1);
    tide_proto_buf_t b;
    tide_proto_buf_init(&b);
    cr_expect_eq(tide_proto_encode(&over, &b), TIDE_ERR_INVALID, "encode refuses 33 rules");
    cr_expect(strstr(tide_last_error(), "field 'fit' has 33 entries, more than the limit of 32") !=
                  NULL,
              "%s", tide_last_error());
    /* nor does encode send a rule decode would refuse */
    tide_proto_fit_t bad = {5, 4, ""};
    tide_msg_t bm = join_msg(&bad, 1);
    cr_expect_eq(tide_proto_encode(&bm, &b), TIDE_ERR_INVALID);
    bad = (tide_proto_fit_t){0, 0, ""};
    cr_expect_eq(tide_proto_encode(&bm, &b), TIDE_ERR_INVALID);
    tide_proto_buf_destroy(&b);
}

/* A join a tided stored before joins carried "fit" is brought to today's schema with no
   rules, and nothing else is forgiven. */
Test(proto_roundtrip, join_from_before_fit_rules_is_upgraded)
{
    tide_proto_fit_t fit[1] = {{0, 4, "the batch"}};
    tide_msg_t m = join_msg(fit, 1);
    size_t len;
    uint8_t *bytes = encode_copy(&m, &len);
    /* the old form: the same map without "fit" */
    msgpack_unpacked u;
    msgpack_unpacked_init(&u);
    size_t off = 0;
    cr_assert_eq(msgpack_unpack_next(&u, (const char *)bytes, len, &off), MSGPACK_UNPACK_SUCCESS);
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    val_t nil = VNIL;
    repack(&pk, &u.data, "fit", OP_DROP, &nil);
    expect_refused(sb.data, sb.size, "join: missing field 'fit'");
    uint8_t *up = NULL;
    size_t up_len = 0;
    cr_assert_eq(tide_proto_join_upgrade(sb.data, sb.size, &up, &up_len), TIDE_OK, "%s",
                 tide_last_error());
    tide_msg_t d;
    cr_assert_eq(tide_proto_decode(up, up_len, &d), TIDE_OK, "%s", tide_last_error());
    cr_expect_eq(d.u.join.n_fit, 0u, "an old join declared no rules");
    m.u.join.fit = NULL;
    m.u.join.n_fit = 0;
    char why[128];
    cr_assert(same_msg(&m, &d, why, sizeof why), "%s", why);
    tide_msg_clear(&d);
    tide_free(up);
    /* one that has "fit" is copied unchanged */
    cr_assert_eq(tide_proto_join_upgrade(bytes, len, &up, &up_len), TIDE_OK);
    cr_expect(up_len == len && memcmp(up, bytes, len) == 0);
    tide_free(up);
    /* anything else wrong stays wrong */
    msgpack_sbuffer_clear(&sb);
    msgpack_unpacked_destroy(&u);
    msgpack_unpacked_init(&u);
    off = 0;
    cr_assert_eq(msgpack_unpack_next(&u, (const char *)bytes, len, &off), MSGPACK_UNPACK_SUCCESS);
    msgpack_sbuffer bad;
    msgpack_sbuffer_init(&bad);
    msgpack_packer_init(&pk, &bad, msgpack_sbuffer_write);
    repack(&pk, &u.data, "tensors", OP_DROP, &nil);
    cr_expect_eq(tide_proto_join_upgrade(bad.data, bad.size, &up, &up_len), TIDE_ERR_PROTOCOL);
    cr_expect(strstr(tide_last_error(), "missing field 'tensors'") != NULL, "%s",
              tide_last_error());
    cr_expect_null(up);
    cr_expect_eq(tide_proto_join_upgrade("\x01", 1, &up, &up_len), TIDE_ERR_PROTOCOL);
    tide_msg_t hb = heartbeat();
    uint8_t *hbytes = encode_copy(&hb, &len);
    cr_expect_eq(tide_proto_join_upgrade(hbytes, len, &up, &up_len), TIDE_ERR_PROTOCOL,
                 "a heartbeat is no join");
    tide_free(hbytes);
    msgpack_sbuffer_destroy(&bad);
    msgpack_sbuffer_destroy(&sb);
    msgpack_unpacked_destroy(&u);
    tide_free(bytes);
}

Test(proto_roundtrip, release_of_a_pool_and_its_bad_forms)
{
    /* job ranks 0..13 over three launches; the layout keeps 10..13, the launch of ranks
       2..3 leaves (rank 3 died: only 2 is listed) */
    tide_msg_t m = layout_msg(), d;
    int prev_stages[2] = {0, 24};
    int32_t prev_workers[2] = {2, 11}, stay[5] = {0, 10, 11, 12, 13}, leave[1] = {2};
    m.u.layout.has_prev = 1;
    m.u.layout.prev = prev_layout(prev_stages, prev_workers);
    m.u.layout.world = 14;
    m.u.layout.stay = stay;
    m.u.layout.n_stay = 5;
    m.u.layout.leave = leave;
    m.u.layout.n_leave = 1;
    size_t len;
    uint8_t *bytes = encode_copy(&m, &len);
    cr_assert_eq(tide_proto_decode(bytes, len, &d), TIDE_OK, "%s", tide_last_error());
    cr_assert_eq(d.u.layout.n_stay, 5u);
    cr_assert_eq(d.u.layout.n_leave, 1u);
    cr_expect_eq(d.u.layout.stay[4], 13);
    cr_expect_eq(d.u.layout.leave[0], 2);
    tide_msg_clear(&d);
    tide_free(bytes);
    struct {
        int32_t world;
        int32_t s[5], l[2];
        uint32_t ns, nl;
        int join;
        const char *why;
    } bad[] = {
        {14, {0, 10, 11, 12, 13}, {2, 14}, 5, 2, 0, "field 'leave[1]' = 14 must be below"},
        {14, {0, 11, 10, 12, 13}, {2}, 5, 1, 0, "field 'stay' must be strictly increasing"},
        {14, {0, 10, 11, 12, 13}, {3, 2}, 5, 2, 0, "field 'leave' must be strictly increasing"},
        {14, {0, 10, 11, 12, 13}, {2}, 5, 0, 0, "'stay' and 'leave' must be both empty"},
        {14, {0, 2, 11, 12, 13}, {2}, 5, 1, 0, "job rank 2 both stays and leaves"},
        {14, {0, 2, 11, 12, 13}, {10}, 5, 1, 0, "job rank 10 of field 'layout' is not in"},
        {14, {0, 10, 11, 12, 13}, {2}, 5, 1, 1, "either connects a pool"},
    };
    int32_t jo[1] = {0}, jn[1] = {1};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        tide_msg_t b = m;
        b.u.layout.world = bad[i].world;
        b.u.layout.stay = bad[i].s;
        b.u.layout.n_stay = bad[i].ns;
        b.u.layout.leave = bad[i].l;
        b.u.layout.n_leave = bad[i].nl;
        if (bad[i].join) {
            b.u.layout.join_old = jo;
            b.u.layout.n_join_old = 1;
            b.u.layout.join_new = jn;
            b.u.layout.n_join_new = 1;
        }
        tide_proto_buf_t buf;
        tide_proto_buf_init(&buf);
        cr_expect_neq(tide_proto_encode(&b, &buf), TIDE_OK, "case %zu encoded", i);
        cr_expect(strstr(tide_last_error(), bad[i].why) != NULL, "case %zu: %s", i,
                  tide_last_error());
        tide_proto_buf_destroy(&buf);
    }
    tide_msg_t f = m;
    f.u.layout.has_prev = 0;
    tide_proto_buf_t buf;
    tide_proto_buf_init(&buf);
    cr_expect_neq(tide_proto_encode(&f, &buf), TIDE_OK);
    cr_expect(strstr(tide_last_error(), "a release needs field 'prev'") != NULL, "%s",
              tide_last_error());
    tide_proto_buf_destroy(&buf);
    /* the message that tells a released pool's ranks, fenced by the generation */
    tide_msg_t r;
    tide_msg_init(&r, TIDE_MSG_RELEASE);
    strcpy(r.u.release.job, "llm");
    r.u.release.gen = 6;
    bytes = encode_copy(&r, &len);
    cr_assert_eq(tide_proto_decode(bytes, len, &d), TIDE_OK, "%s", tide_last_error());
    cr_expect_eq(d.type, TIDE_MSG_RELEASE);
    cr_expect_str_eq(d.u.release.job, "llm");
    cr_expect_eq(d.u.release.gen, 6u);
    cr_expect_eq(tide_msg_type_role(TIDE_MSG_RELEASE), TIDE_ROLE_COORDINATOR);
    tide_msg_clear(&d);
    tide_free(bytes);
}

/* Encodes m and expects a refusal naming want. */
static void expect_encode_refused(const tide_msg_t *m, const char *want)
{
    tide_proto_buf_t buf;
    tide_proto_buf_init(&buf);
    cr_expect_neq(tide_proto_encode(m, &buf), TIDE_OK, "encoded although: %s", want);
    cr_expect(strstr(tide_last_error(), want) != NULL, "want '%s', got: %s", want,
              tide_last_error());
    tide_proto_buf_destroy(&buf);
}

Test(proto_roundtrip, checkpoint_messages_and_their_bad_forms)
{
    /* a recovery that rolls back to a checkpoint names it in its layout message */
    tide_msg_t m = layout_msg(), d;
    int prev_stages[2] = {0, 24};
    int32_t prev_workers[2] = {2, 11};
    m.u.layout.has_prev = 1;
    m.u.layout.prev = prev_layout(prev_stages, prev_workers);
    m.u.layout.recover = 1;
    strcpy(m.u.layout.ckpt, "/ckpt/llm/step-000000000040");
    m.u.layout.ckpt_step = 40;
    size_t len;
    uint8_t *bytes = encode_copy(&m, &len);
    cr_assert_eq(tide_proto_decode(bytes, len, &d), TIDE_OK, "%s", tide_last_error());
    cr_expect_str_eq(d.u.layout.ckpt, "/ckpt/llm/step-000000000040");
    cr_expect_eq(d.u.layout.ckpt_step, 40u);
    tide_msg_clear(&d);
    tide_free(bytes);
    tide_msg_t b = m;
    b.u.layout.recover = 0; /* a plain resize never loads a checkpoint */
    expect_encode_refused(&b, "field 'ckpt' is given only with 'prev' and 'recover'");
    b = m;
    b.u.layout.ckpt[0] = '\0';
    expect_encode_refused(&b, "field 'ckpt_step' must be 0");

    /* tidectl asks, tided relays, the publisher reports */
    tide_msg_t c;
    tide_msg_init(&c, TIDE_MSG_CHECKPOINT);
    strcpy(c.u.checkpoint.job, "llm");
    strcpy(c.u.checkpoint.dir, "ckpt/llm");
    expect_encode_refused(&c, "field 'dir' must be an absolute path");
    c.u.checkpoint.dir[0] = '\0'; /* the job's own root */
    bytes = encode_copy(&c, &len);
    cr_assert_eq(tide_proto_decode(bytes, len, &d), TIDE_OK, "%s", tide_last_error());
    cr_expect_str_eq(d.u.checkpoint.job, "llm");
    tide_free(bytes);
    tide_msg_t sv;
    tide_msg_init(&sv, TIDE_MSG_SAVE);
    strcpy(sv.u.save.job, "llm");
    sv.u.save.step = 75;
    expect_encode_refused(&sv, "save: field 'dir'");
    strcpy(sv.u.save.dir, "/ckpt/llm");
    bytes = encode_copy(&sv, &len);
    cr_assert_eq(tide_proto_decode(bytes, len, &d), TIDE_OK, "%s", tide_last_error());
    cr_expect_eq(d.u.save.step, 75u);
    tide_free(bytes);
    tide_msg_t ok;
    tide_msg_init(&ok, TIDE_MSG_SAVED);
    ok.u.saved.worker = 3;
    strcpy(ok.u.saved.job, "llm");
    ok.u.saved.step = 75;
    strcpy(ok.u.saved.dir, "/ckpt/llm/step-000000000075");
    strcpy(ok.u.saved.reason, "disk full");
    expect_encode_refused(&ok, "field 'reason' must be empty when field 'code' is 0");
    ok.u.saved.code = TIDE_ERR_IO;
    bytes = encode_copy(&ok, &len);
    cr_assert_eq(tide_proto_decode(bytes, len, &d), TIDE_OK, "%s", tide_last_error());
    cr_expect_eq(d.u.saved.code, (int)TIDE_ERR_IO);
    cr_expect_str_eq(d.u.saved.reason, "disk full");
    tide_free(bytes);
    cr_expect_eq(tide_msg_type_role(TIDE_MSG_CHECKPOINT), TIDE_ROLE_ADMIN);
    cr_expect_eq(tide_msg_type_role(TIDE_MSG_SAVED), TIDE_ROLE_WORKER);
    cr_expect_eq(tide_msg_type_role(TIDE_MSG_SAVE), TIDE_ROLE_COORDINATOR);
}

Test(proto_roundtrip, largest_layout_is_accepted_and_one_more_worker_is_not)
{
    /* dp * tp * pp = 2^20 exactly */
    tide_msg_t m;
    tide_msg_init(&m, TIDE_MSG_RESIZE_REPLY);
    strcpy(m.u.resize_reply.job, "big");
    tide_proto_layout_t *l = &m.u.resize_reply.layout;
    l->gen = 1;
    l->dp = 65536;
    l->tp = 16;
    l->pp = 1;
    l->num_layers = 1;
    l->micro_batches = 1;
    int st[2] = {0, 1};
    l->stage_start = st;
    size_t n = (size_t)1 << 20;
    l->worker = malloc(n * sizeof(int32_t));
    for (size_t i = 0; i < n; i++)
        l->worker[i] = (int32_t)i;
    size_t len;
    uint8_t *bytes = encode_copy(&m, &len);
    tide_msg_t d;
    cr_assert_eq(tide_proto_decode(bytes, len, &d), TIDE_OK, "%s", tide_last_error());
    cr_expect_eq(d.u.resize_reply.layout.worker[n - 1], (int32_t)(n - 1));
    tide_msg_clear(&d);
    tide_free(bytes);

    l->tp = 32; /* 2^21 workers */
    tide_proto_buf_t b;
    tide_proto_buf_init(&b);
    cr_expect_eq(tide_proto_encode(&m, &b), TIDE_ERR_INVALID);
    cr_expect(strstr(tide_last_error(), "exceeds 1048576 workers") != NULL, "%s",
              tide_last_error());
    cr_expect_eq(b.len, 0u);
    tide_proto_buf_destroy(&b);
    free(l->worker);
}

Test(proto_roundtrip, integers_may_be_sent_for_doubles)
{
    tide_msg_t m = heartbeat();
    size_t len;
    uint8_t *bytes = encode_copy(&m, &len);
    msgpack_unpacked u;
    msgpack_unpacked_init(&u);
    size_t off = 0;
    msgpack_unpack_next(&u, (const char *)bytes, len, &off);
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    val_t v = VUINT(42);
    repack(&pk, &u.data, "step_ms", OP_SET, &v);
    tide_msg_t d;
    cr_assert_eq(tide_proto_decode(sb.data, sb.size, &d), TIDE_OK, "%s", tide_last_error());
    cr_expect_eq(d.u.heartbeat.step_ms, 42.0);
    msgpack_sbuffer_destroy(&sb);
    msgpack_unpacked_destroy(&u);
    tide_free(bytes);
}

Test(proto_roundtrip, a_launch_in_a_slurm_allocation_and_the_bad_forms)
{
    tide_msg_t r, d;
    tide_msg_init(&r, TIDE_MSG_REGISTER);
    strcpy(r.u.reg.pool, "p1");
    r.u.reg.size = 2;
    strcpy(r.u.reg.host, "h3");
    r.u.reg.pid = 99;
    strcpy(r.u.reg.alloc.sched, "slurm");
    strcpy(r.u.reg.alloc.id, "1234_5");
    strcpy(r.u.reg.alloc.nodes, "h[1-3],gpu[01-04]");
    strcpy(r.u.reg.alloc.node, "h3");
    strcpy(r.u.reg.alloc.gpus, "0,1");
    strcpy(r.u.reg.alloc.partition, "low");
    r.u.reg.alloc.restarts = 2;
    size_t len;
    uint8_t *bytes = encode_copy(&r, &len);
    cr_assert_eq(tide_proto_decode(bytes, len, &d), TIDE_OK, "%s", tide_last_error());
    cr_expect_str_eq(d.u.reg.alloc.id, "1234_5");
    cr_expect_str_eq(d.u.reg.alloc.nodes, "h[1-3],gpu[01-04]");
    cr_expect_eq(d.u.reg.alloc.restarts, 2);
    tide_msg_clear(&d);
    tide_free(bytes);
    refuse_edit(&r, OP_SET, "alloc.sched", VSTR("pbs"), "field 'alloc.sched' = 'pbs' is not one of");
    refuse_edit(&r, OP_SET, "alloc.id", VSTR("12a"), "field 'alloc.id' = '12a' is no Slurm job id");
    refuse_edit(&r, OP_SET, "alloc.id", VSTR(""), "is no Slurm job id");
    refuse_edit(&r, OP_SET, "alloc.nodes", VSTR("h1 h2"), "printable ASCII without spaces");
    refuse_edit(&r, OP_SET, "alloc.restarts", VINT(-1), "field 'alloc.restarts'");
    refuse_edit(&r, OP_SET, "alloc.sched", VSTR(""),
                "field 'alloc.sched' is empty (no scheduler) but other fields are set");
    refuse_edit(&r, OP_DROP, "alloc", VINT(0), "missing field 'alloc'");
    /* no scheduler: every field empty */
    memset(&r.u.reg.alloc, 0, sizeof r.u.reg.alloc);
    bytes = encode_copy(&r, &len);
    cr_assert_eq(tide_proto_decode(bytes, len, &d), TIDE_OK, "%s", tide_last_error());
    cr_expect_str_eq(d.u.reg.alloc.sched, "");
    tide_msg_clear(&d);
    tide_free(bytes);
    /* grow and leave */
    tide_msg_t g;
    tide_msg_init(&g, TIDE_MSG_GROW);
    strcpy(g.u.grow.job, "mlp");
    g.u.grow.nodes = 1;
    cr_expect_eq(tide_msg_type_role(TIDE_MSG_GROW), TIDE_ROLE_ADMIN);
    cr_expect_eq(tide_msg_type_role(TIDE_MSG_LEAVE), TIDE_ROLE_WORKER);
    refuse_edit(&g, OP_SET, "nodes", VINT(0), "field 'nodes' must be an integer in [1, 4096]");
    refuse_edit(&g, OP_SET, "nodes", VINT(4097), "field 'nodes' must be an integer in [1, 4096]");
}

/* ---- names and roles
 * ----------------------------------------------------------------------------------- */

Test(proto_names, types_parse_back_and_have_roles)
{
    for (int t = TIDE_MSG_NONE + 1; t < TIDE_MSG__COUNT; t++) {
        tide_msg_type_t back;
        cr_assert_eq(tide_msg_type_parse(tide_msg_type_name(t), &back), TIDE_OK);
        cr_expect_eq(back, t);
    }
    tide_msg_type_t x;
    cr_expect_eq(tide_msg_type_parse("nope", &x), TIDE_ERR_NOT_FOUND);
    cr_expect_eq(tide_msg_type_role(TIDE_MSG_HEARTBEAT), TIDE_ROLE_WORKER);
    cr_expect_eq(tide_msg_type_role(TIDE_MSG_REGISTER), TIDE_ROLE_WORKER);
    cr_expect_eq(tide_msg_type_role(TIDE_MSG_RESIZE), TIDE_ROLE_ADMIN);
    cr_expect_eq(tide_msg_type_role(TIDE_MSG_STATUS), TIDE_ROLE_READER);
    cr_expect_eq(tide_msg_type_role(TIDE_MSG_EVENTS), TIDE_ROLE_ADMIN);
    cr_expect_eq(tide_msg_type_role(TIDE_MSG_LAYOUT), TIDE_ROLE_COORDINATOR);
    cr_expect_eq(tide_msg_type_role(TIDE_MSG_ERROR), TIDE_ROLE_COORDINATOR);
    cr_expect_str_eq(tide_proto_worker_state_name(TIDE_WORKER_DRAINING), "draining");
    cr_expect_str_eq(tide_proto_job_state_name((tide_proto_job_state_t)99), "?");
    tide_proto_placement_t p;
    cr_expect_eq(tide_proto_placement_parse("optimal", &p), TIDE_OK);
    cr_expect_eq(p, TIDE_PLACEMENT_OPTIMAL);
    cr_expect_eq(tide_proto_placement_parse("best", &p), TIDE_ERR_NOT_FOUND);
    cr_expect(strstr(tide_last_error(), "default, optimal") != NULL);
}

/* The attempt-log path: the worker's writer and tided's and tidectl's check agree, and
   nothing else passes the check. */
Test(proto, attempt_log_paths)
{
    char p[256];
    cr_assert_eq(tide_proto_attempt_log_path(p, sizeof p, "/tmp/tide-logs-0", "sweep", 3, 4242),
                 TIDE_OK);
    cr_assert_str_eq(p, "/tmp/tide-logs-0/sweep.3.4242.log");
    cr_assert(tide_proto_attempt_log_ok(p, "sweep", 3));
    cr_assert(!tide_proto_attempt_log_ok(p, "sweep", 4), "another attempt");
    cr_assert(!tide_proto_attempt_log_ok(p, "swee", 3), "another job");
    cr_assert(!tide_proto_attempt_log_ok(p, "sweep.3", 3));
    const char *bad[] = {"",
                         "sweep.3.1.log",
                         "relative/sweep.3.1.log",
                         "/etc/passwd",
                         "/root/.tide/admin.key",
                         "/tmp/sweep.3..log",
                         "/tmp/sweep.3.12a.log",
                         "/tmp/sweep.3.1.log.bak",
                         "/tmp/sweep.3.12345678901.log",
                         "/tmp/../etc/sweep.3.1.log",
                         "/tmp/./sweep.3.1.log",
                         "/tmp/x/../sweep.3.1.log",
                         NULL};
    for (int i = 0; bad[i] != NULL; i++)
        cr_expect(!tide_proto_attempt_log_ok(bad[i], "sweep", 3), "'%s' passed", bad[i]);
    cr_assert(tide_proto_attempt_log_ok("//tmp//sweep.3.1.log", "sweep", 3));
    cr_assert(!tide_proto_attempt_log_ok(NULL, "sweep", 3));
    cr_assert_eq(tide_proto_attempt_log_path(p, 16, "/tmp/tide-logs-0", "sweep", 3, 1),
                 TIDE_ERR_RANGE);
}
