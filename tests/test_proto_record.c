/*
 * Unit tests for proto/'s records, the state file's types (part of test_proto; tests/
 * proto_fixture.h): every record type round-trips through the record calls and is no
 * other type, a checkpoint manifest past the message limit is a record, and each rule of
 * a record is checked naming the field.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "proto/proto.h"
#include "tests/proto_fixture.h"
#include "tests/support/proto_sample.h"

/* ---- records -------------------------------------------------------------------------------- */

/* A manifest of one split tensor saved under (dp 1, tp 2, pp 1): two shards in chunks of 16
   bytes (40 bytes: 3 chunks; 16 bytes: 1 chunk). The arrays are the caller's. */
static tide_msg_t manifest_rec(int *stages, int32_t *workers, tide_proto_tensor_t *tensor,
                               tide_proto_ckpt_shard_t *shards, uint64_t *hashes)
{
    tide_msg_t m;
    tide_msg_init(&m, TIDE_MSG_CKPT_MANIFEST);
    tide_proto_ckpt_manifest_t *x = &m.u.ckpt_manifest;
    x->format = 2;
    x->chunk = 16;
    x->step = 42;
    x->save_id = 7;
    stages[0] = 0;
    stages[1] = 4;
    workers[0] = 0;
    workers[1] = 1;
    x->layout = (tide_proto_layout_t){0, 1, 2, 1, 4, 1, stages, workers};
    *tensor = (tide_proto_tensor_t){"w", 0, 2, {8, 4}, 0, 1, 0, 1, 0};
    x->tensors = tensor;
    x->n_tensors = 1;
    for (int k = 0; k < 4; k++)
        hashes[k] = 0x0102030405060708ull * (uint64_t)(k + 1);
    shards[0] = (tide_proto_ckpt_shard_t){0, 0, 0, 40, hashes, 3};
    shards[1] = (tide_proto_ckpt_shard_t){0, 0, 1, 16, hashes + 3, 1};
    x->shards = shards;
    x->n_shards = 2;
    x->check = 99;
    return m;
}

/* Every record type encodes and decodes through the record calls, which take no other type
   and refuse a record of another type naming both; tided's roles make them no request. */
Test(proto_record, records_round_trip_and_are_nothing_else)
{
    static const tide_msg_type_t recs[] = {
        TIDE_MSG_JOB_LAYOUT, TIDE_MSG_JOB_POOLS,     TIDE_MSG_JOB_FIT,  TIDE_MSG_JOB_CKPTS,
        TIDE_MSG_JOB_ARGV,   TIDE_MSG_CKPT_MANIFEST, TIDE_MSG_CKPT_SUM, TIDE_MSG_EVENT_FIELDS};
    uint64_t rng = 0x5eed;
    tide_proto_buf_t b;
    tide_proto_buf_init(&b);
    for (size_t i = 0; i < sizeof recs / sizeof recs[0]; i++) {
        cr_expect_eq(tide_msg_type_role(recs[i]), TIDE_ROLE_RECORD, "%s",
                     tide_msg_type_name(recs[i]));
        tide_msg_t m, d;
        cr_assert_eq(tide_proto_sample(&m, recs[i], &rng), TIDE_OK, "%s", tide_last_error());
        cr_assert_eq(tide_proto_encode_record(&m, &b), TIDE_OK, "%s", tide_last_error());
        cr_assert_eq(tide_proto_decode_record(b.data, b.len, recs[i], &d), TIDE_OK, "%s",
                     tide_last_error());
        char why[128];
        cr_assert(same_msg(&m, &d, why, sizeof why), "%s: %s", tide_msg_type_name(recs[i]), why);
        tide_msg_clear(&d);
        tide_msg_type_t other = recs[(i + 1) % (sizeof recs / sizeof recs[0])];
        cr_assert_eq(tide_proto_decode_record(b.data, b.len, other, &d), TIDE_ERR_PROTOCOL);
        cr_expect_eq(d.type, TIDE_MSG_NONE);
        char want[96];
        snprintf(want, sizeof want, "the record is a '%s', not a '%s'", tide_msg_type_name(recs[i]),
                 tide_msg_type_name(other));
        cr_expect(strstr(tide_last_error(), want) != NULL, "%s", tide_last_error());
        tide_msg_clear(&m);
    }
    tide_msg_t hb = heartbeat(), d;
    cr_expect_eq(tide_proto_encode_record(&hb, &b), TIDE_ERR_INVALID);
    cr_expect_eq(b.len, 0u);
    size_t len;
    uint8_t *bytes = encode_copy(&hb, &len);
    cr_expect_eq(tide_proto_decode_record(bytes, len, TIDE_MSG_HEARTBEAT, &d), TIDE_ERR_INVALID);
    cr_expect_eq(tide_proto_decode_record(bytes, len, TIDE_MSG_JOB_FIT, &d), TIDE_ERR_PROTOCOL);
    cr_expect(strstr(tide_last_error(), "the record is a 'heartbeat'") != NULL);
    tide_free(bytes);
    tide_proto_buf_destroy(&b);
}

/* A checkpoint of many TiB has a manifest past the 32 MiB message limit: a record of up to
   256 MiB, the chunk hashes 8 bytes each. */
Test(proto_record, a_manifest_past_the_message_limit_is_a_record)
{
    int stages[2];
    int32_t workers[2];
    tide_proto_tensor_t tensor;
    tide_proto_ckpt_shard_t shards[2];
    uint64_t small[4];
    tide_msg_t m = manifest_rec(stages, workers, &tensor, shards, small);
    uint32_t n = 4500000; /* 36 MB of hashes */
    uint64_t *hashes = malloc(n * sizeof *hashes);
    for (uint32_t k = 0; k < n; k++)
        hashes[k] = (uint64_t)k * 0x9e3779b97f4a7c15ull;
    m.u.ckpt_manifest.chunk = 1;
    shards[0] = (tide_proto_ckpt_shard_t){0, 0, 0, n, hashes, n};
    shards[1] = (tide_proto_ckpt_shard_t){0, 0, 1, 1, hashes, 1};
    tide_proto_buf_t b;
    tide_proto_buf_init(&b);
    cr_assert_eq(tide_proto_encode(&m, &b), TIDE_ERR_INVALID);
    cr_expect(strstr(tide_last_error(), "over the 33554432-byte limit") != NULL, "%s",
              tide_last_error());
    cr_assert_eq(tide_proto_encode_record(&m, &b), TIDE_OK, "%s", tide_last_error());
    cr_expect_lt(b.len, (size_t)n * 8 + 1024, "8 bytes a hash");
    tide_msg_t d;
    cr_assert_eq(tide_proto_decode(b.data, b.len, &d), TIDE_ERR_PROTOCOL);
    cr_assert_eq(tide_proto_decode_record(b.data, b.len, TIDE_MSG_CKPT_MANIFEST, &d), TIDE_OK, "%s",
                 tide_last_error());
    cr_assert_eq(d.u.ckpt_manifest.shards[0].n_hashes, n);
    cr_assert(memcmp(d.u.ckpt_manifest.shards[0].hashes, hashes, (size_t)n * 8) == 0);
    tide_msg_clear(&d);
    tide_proto_buf_destroy(&b);
    free(hashes);
}

/* Each rule of a record is checked, naming the field. */
Test(proto_record, bad_records_name_the_field)
{
    int stages[2];
    int32_t workers[2];
    tide_proto_tensor_t tensor;
    tide_proto_ckpt_shard_t shards[2];
    uint64_t hashes[4];
    tide_msg_t man = manifest_rec(stages, workers, &tensor, shards, hashes);
    refuse_edit(&man, OP_SET, "format", VUINT(1),
                "field 'format' must be an integer in [2, 65535]");
    refuse_edit(&man, OP_SET, "chunk", VUINT(0), "field 'chunk' must be an integer in [1, ");
    refuse_edit(&man, OP_SET, "shards.0.hashes", VUINT(3), "must be binary");
    refuse_edit(&man, OP_SET, "shards.0.hashes", VBIN("1234567"),
                "has 7 bytes, not a whole number of 8-byte entries");
    refuse_edit(&man, OP_SET, "shards.0.hashes", VBIN("0123456789abcdef"),
                "field 'shards[0].hashes' holds 2 chunk hashes; 40 bytes in chunks of 16 need 3");
    refuse_edit(&man, OP_SET, "shards.0.bytes", VUINT(0), "field 'shards[0].bytes'");
    refuse_edit(&man, OP_SET, "shards.1.t", VUINT(2), "is outside the layout");
    refuse_edit(&man, OP_SET, "shards.1.t", VUINT(0), "strictly increasing (p, d, t) order");
    refuse_edit(&man, OP_SET, "tensors.0.layer", VUINT(4), "must be below layout.layers = 4");
    refuse_edit(&man, OP_DROP, "check", VNIL, "missing field 'check'");

    tide_proto_job_pool_t pools[2] = {{"pool-a", 4, 1, 0}, {"pool-b", 2, 0, 7}};
    tide_msg_t jp;
    tide_msg_init(&jp, TIDE_MSG_JOB_POOLS);
    jp.u.job_pools.pools = pools;
    jp.u.job_pools.n_pools = 2;
    refuse_edit(&jp, OP_SET, "pools.1.connected", VBOOL(1),
                "field 'pools[1].connected' must be false: the pool left the job at generation 7");
    refuse_edit(&jp, OP_SET, "pools.0.size", VUINT(1u << 20),
                "the pools hold 1048578 job ranks, more than the limit of 1048576");
    refuse_edit(&jp, OP_SET, "pools.0.name", VSTR("my pool"), "may hold only letters");
    refuse_edit(&jp, OP_SET, "pools.0.size", VUINT(0), "field 'pools[0].size'");

    tide_proto_ckpt_ref_t refs[2] = {{10, "/ck/a"}, {20, "/ck/b"}};
    tide_msg_t jc;
    tide_msg_init(&jc, TIDE_MSG_JOB_CKPTS);
    jc.u.job_ckpts.ckpts = refs;
    jc.u.job_ckpts.n_ckpts = 2;
    refuse_edit(&jc, OP_SET, "ckpts.1.step", VUINT(10),
                "strictly increasing step order (ckpts[1].step = 10 after 10)");
    refuse_edit(&jc, OP_SET, "ckpts.0.step", VINT(-1), "must be a non-negative integer");
    refuse_edit(&jc, OP_SET, "ckpts.0.dir", VSTR(""), "field 'ckpts[0].dir' must not be empty");

    tide_proto_fit_t fit[1] = {{3, 16, "the global batch"}};
    tide_msg_t jf;
    tide_msg_init(&jf, TIDE_MSG_JOB_FIT);
    jf.u.job_fit.fit = fit;
    jf.u.job_fit.n_fit = 1;
    refuse_edit(&jf, OP_SET, "fit.0.degree", VSTR("ep"), "must be one of");
    refuse_edit(&jf, OP_SET, "fit.0.n", VUINT(0), "field 'fit[0].n'");
    refuse_edit(&jf, OP_SET, "fit.0.what", VSTR("a\tb"), "printable ASCII");

    char *argv[2] = {"sh", ""};
    tide_msg_t ja;
    tide_msg_init(&ja, TIDE_MSG_JOB_ARGV);
    ja.u.job_argv.argv = argv;
    ja.u.job_argv.argc = 2;
    refuse_edit(&ja, OP_SET, "argv", VSTRN("a\0b", 3), "must be an array of strings");
}
