/*
 * Unit tests for proto/: every message type round-trips (property test over
 * random values, seed printed and settable with TIDE_TEST_SEED), every class
 * of bad input is refused with TIDE_ERR_PROTOCOL and a detail naming the
 * field, allocation failures during decode/encode leak nothing, and the
 * limits (2^20 workers, string lengths) hold exactly at their edges.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <msgpack.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/alloc.h"
#include "core/error.h"
#include "proto/proto.h"
#include "tests/support/proto_sample.h"

/* ---- helpers ------------------------------------------------------------------------------- */

static uint64_t test_seed(void)
{
    const char *env = getenv("TIDE_TEST_SEED");
    uint64_t seed = env ? strtoull(env, NULL, 0) : (uint64_t)time(NULL) * 2654435761u;
    return seed ? seed : 1;
}

/* Equality of two checkpoint shard records, hashes included. */
static int same_event_fields(const tide_proto_event_fields_t *a, const tide_proto_event_fields_t *b)
{
    if (a->n_workers != b->n_workers ||
        (a->n_workers > 0 && memcmp(a->workers, b->workers, a->n_workers * sizeof *a->workers)))
        return 0;
    tide_proto_event_fields_t x, y;
    memcpy(&x, a, sizeof x);
    memcpy(&y, b, sizeof y);
    x.workers = y.workers = NULL;
    return memcmp(&x, &y, sizeof x) == 0;
}

static int same_shard(const tide_proto_ckpt_shard_t *a, const tide_proto_ckpt_shard_t *b)
{
    return a->p == b->p && a->d == b->d && a->t == b->t && a->bytes == b->bytes &&
           a->n_hashes == b->n_hashes &&
           (a->n_hashes == 0 || memcmp(a->hashes, b->hashes, a->n_hashes * sizeof *a->hashes) == 0);
}

/* Deep equality of two messages; writes the first difference into why. */
static int same_msg(const tide_msg_t *a, const tide_msg_t *b, char *why, size_t len)
{
    tide_msg_t x = *a, y = *b;
    if (a->type != b->type) {
        snprintf(why, len, "type %d vs %d", a->type, b->type);
        return 0;
    }
#define SAME_ARR(pa, pb, n, what)                                                                  \
    do {                                                                                           \
        if ((n) > 0 && memcmp((pa), (pb), (size_t)(n) * sizeof *(pa)) != 0) {                      \
            snprintf(why, len, "%s differ", what);                                                 \
            return 0;                                                                              \
        }                                                                                          \
    } while (0)
#define SAME_LAYOUT(la, lb, lx, ly)                                                                \
    do {                                                                                           \
        SAME_ARR((la).stage_start, (lb).stage_start, (la).pp + 1, "stages");                       \
        SAME_ARR((la).worker, (lb).worker, (la).dp *(la).tp *(la).pp, "workers");                  \
        (lx).stage_start = (ly).stage_start = NULL;                                                \
        (lx).worker = (ly).worker = NULL;                                                          \
    } while (0)
    switch (a->type) {
    case TIDE_MSG_JOIN:
        if (a->u.join.n_tensors != b->u.join.n_tensors)
            return snprintf(why, len, "tensor counts differ"), 0;
        SAME_ARR(a->u.join.tensors, b->u.join.tensors, a->u.join.n_tensors, "tensors");
        x.u.join.tensors = y.u.join.tensors = NULL;
        if (a->u.join.n_fit != b->u.join.n_fit)
            return snprintf(why, len, "fit rule counts differ"), 0;
        SAME_ARR(a->u.join.fit, b->u.join.fit, a->u.join.n_fit, "fit rules");
        x.u.join.fit = y.u.join.fit = NULL;
        break;
    case TIDE_MSG_LAYOUT:
        if (a->u.layout.layout.pp != b->u.layout.layout.pp ||
            a->u.layout.layout.dp != b->u.layout.layout.dp ||
            a->u.layout.layout.tp != b->u.layout.layout.tp)
            return snprintf(why, len, "degrees differ"), 0;
        SAME_LAYOUT(a->u.layout.layout, b->u.layout.layout, x.u.layout.layout, y.u.layout.layout);
        if (a->u.layout.has_prev != b->u.layout.has_prev)
            return snprintf(why, len, "has_prev differs"), 0;
        if (a->u.layout.has_prev) {
            if (a->u.layout.prev.pp != b->u.layout.prev.pp ||
                a->u.layout.prev.dp != b->u.layout.prev.dp ||
                a->u.layout.prev.tp != b->u.layout.prev.tp)
                return snprintf(why, len, "prev degrees differ"), 0;
            SAME_LAYOUT(a->u.layout.prev, b->u.layout.prev, x.u.layout.prev, y.u.layout.prev);
        }
        if (a->u.layout.n_join_old != b->u.layout.n_join_old ||
            a->u.layout.n_join_new != b->u.layout.n_join_new)
            return snprintf(why, len, "join sizes differ"), 0;
        SAME_ARR(a->u.layout.join_old, b->u.layout.join_old, a->u.layout.n_join_old, "join_old");
        SAME_ARR(a->u.layout.join_new, b->u.layout.join_new, a->u.layout.n_join_new, "join_new");
        x.u.layout.join_old = y.u.layout.join_old = NULL;
        x.u.layout.join_new = y.u.layout.join_new = NULL;
        if (a->u.layout.n_stay != b->u.layout.n_stay || a->u.layout.n_leave != b->u.layout.n_leave)
            return snprintf(why, len, "release sizes differ"), 0;
        SAME_ARR(a->u.layout.stay, b->u.layout.stay, a->u.layout.n_stay, "stay");
        SAME_ARR(a->u.layout.leave, b->u.layout.leave, a->u.layout.n_leave, "leave");
        x.u.layout.stay = y.u.layout.stay = NULL;
        x.u.layout.leave = y.u.layout.leave = NULL;
        break;
    case TIDE_MSG_RESIZE_REPLY:
        if (a->u.resize_reply.layout.pp != b->u.resize_reply.layout.pp ||
            a->u.resize_reply.layout.dp != b->u.resize_reply.layout.dp ||
            a->u.resize_reply.layout.tp != b->u.resize_reply.layout.tp)
            return snprintf(why, len, "degrees differ"), 0;
        SAME_LAYOUT(a->u.resize_reply.layout, b->u.resize_reply.layout, x.u.resize_reply.layout,
                    y.u.resize_reply.layout);
        break;
    case TIDE_MSG_JOB_LAYOUT:
        if (a->u.job_layout.layout.pp != b->u.job_layout.layout.pp ||
            a->u.job_layout.layout.dp != b->u.job_layout.layout.dp ||
            a->u.job_layout.layout.tp != b->u.job_layout.layout.tp)
            return snprintf(why, len, "degrees differ"), 0;
        SAME_LAYOUT(a->u.job_layout.layout, b->u.job_layout.layout, x.u.job_layout.layout,
                    y.u.job_layout.layout);
        break;
    case TIDE_MSG_JOB_POOLS:
        if (a->u.job_pools.n_pools != b->u.job_pools.n_pools)
            return snprintf(why, len, "pool counts differ"), 0;
        SAME_ARR(a->u.job_pools.pools, b->u.job_pools.pools, a->u.job_pools.n_pools, "pools");
        x.u.job_pools.pools = y.u.job_pools.pools = NULL;
        break;
    case TIDE_MSG_JOB_FIT:
        if (a->u.job_fit.n_fit != b->u.job_fit.n_fit)
            return snprintf(why, len, "fit rule counts differ"), 0;
        SAME_ARR(a->u.job_fit.fit, b->u.job_fit.fit, a->u.job_fit.n_fit, "fit rules");
        x.u.job_fit.fit = y.u.job_fit.fit = NULL;
        break;
    case TIDE_MSG_JOB_CKPTS:
        if (a->u.job_ckpts.n_ckpts != b->u.job_ckpts.n_ckpts)
            return snprintf(why, len, "checkpoint counts differ"), 0;
        SAME_ARR(a->u.job_ckpts.ckpts, b->u.job_ckpts.ckpts, a->u.job_ckpts.n_ckpts, "checkpoints");
        x.u.job_ckpts.ckpts = y.u.job_ckpts.ckpts = NULL;
        break;
    case TIDE_MSG_JOB_ARGV:
        if (a->u.job_argv.argc != b->u.job_argv.argc)
            return snprintf(why, len, "argc differs"), 0;
        for (uint32_t i = 0; i < a->u.job_argv.argc; i++)
            if (strcmp(a->u.job_argv.argv[i], b->u.job_argv.argv[i]) != 0)
                return snprintf(why, len, "argv[%u] differs", i), 0;
        x.u.job_argv.argv = y.u.job_argv.argv = NULL;
        break;
    case TIDE_MSG_CKPT_MANIFEST: {
        const tide_proto_ckpt_manifest_t *ma = &a->u.ckpt_manifest, *mb = &b->u.ckpt_manifest;
        if (ma->layout.pp != mb->layout.pp || ma->layout.dp != mb->layout.dp ||
            ma->layout.tp != mb->layout.tp)
            return snprintf(why, len, "degrees differ"), 0;
        SAME_LAYOUT(ma->layout, mb->layout, x.u.ckpt_manifest.layout, y.u.ckpt_manifest.layout);
        if (ma->n_tensors != mb->n_tensors || ma->n_shards != mb->n_shards)
            return snprintf(why, len, "tensor or shard counts differ"), 0;
        SAME_ARR(ma->tensors, mb->tensors, ma->n_tensors, "tensors");
        for (uint32_t i = 0; i < ma->n_shards; i++)
            if (!same_shard(&ma->shards[i], &mb->shards[i]))
                return snprintf(why, len, "shards[%u] differs", i), 0;
        x.u.ckpt_manifest.tensors = y.u.ckpt_manifest.tensors = NULL;
        x.u.ckpt_manifest.shards = y.u.ckpt_manifest.shards = NULL;
        break;
    }
    case TIDE_MSG_CKPT_SUM:
        if (!same_shard(&a->u.ckpt_sum.shard, &b->u.ckpt_sum.shard))
            return snprintf(why, len, "shards differ"), 0;
        x.u.ckpt_sum.shard.hashes = y.u.ckpt_sum.shard.hashes = NULL;
        break;
    case TIDE_MSG_OFFLINE_ASSIGN:
    case TIDE_MSG_SUBMIT: {
        char **av = a->type == TIDE_MSG_SUBMIT ? a->u.submit.argv : a->u.offline_assign.argv;
        char **bv = b->type == TIDE_MSG_SUBMIT ? b->u.submit.argv : b->u.offline_assign.argv;
        uint32_t an = a->type == TIDE_MSG_SUBMIT ? a->u.submit.argc : a->u.offline_assign.argc;
        uint32_t bn = b->type == TIDE_MSG_SUBMIT ? b->u.submit.argc : b->u.offline_assign.argc;
        if (an != bn)
            return snprintf(why, len, "argc %u vs %u", an, bn), 0;
        for (uint32_t i = 0; i < an; i++)
            if (strcmp(av[i], bv[i]) != 0)
                return snprintf(why, len, "argv[%u] differs", i), 0;
        if (a->type == TIDE_MSG_SUBMIT)
            x.u.submit.argv = y.u.submit.argv = NULL;
        else
            x.u.offline_assign.argv = y.u.offline_assign.argv = NULL;
        break;
    }
    case TIDE_MSG_STATUS_REPLY:
        if (a->u.status_reply.n_rows != b->u.status_reply.n_rows)
            return snprintf(why, len, "row counts differ"), 0;
        SAME_ARR(a->u.status_reply.rows, b->u.status_reply.rows, a->u.status_reply.n_rows,
                 "status rows");
        x.u.status_reply.rows = y.u.status_reply.rows = NULL;
        break;
    case TIDE_MSG_HOST_HEARTBEAT:
        if (a->u.host_heartbeat.n_beats != b->u.host_heartbeat.n_beats)
            return snprintf(why, len, "heartbeat counts differ"), 0;
        SAME_ARR(a->u.host_heartbeat.beats, b->u.host_heartbeat.beats, a->u.host_heartbeat.n_beats,
                 "heartbeats");
        x.u.host_heartbeat.beats = y.u.host_heartbeat.beats = NULL;
        break;
    case TIDE_MSG_LIVENESS:
        if (a->u.liveness.n_ranks != b->u.liveness.n_ranks)
            return snprintf(why, len, "rank counts differ"), 0;
        SAME_ARR(a->u.liveness.ranks, b->u.liveness.ranks, a->u.liveness.n_ranks, "ranks");
        x.u.liveness.ranks = y.u.liveness.ranks = NULL;
        break;
    case TIDE_MSG_LIVENESS_REPLY:
        if (a->u.liveness_reply.n_ranks != b->u.liveness_reply.n_ranks ||
            a->u.liveness_reply.n_alive != b->u.liveness_reply.n_alive)
            return snprintf(why, len, "rank counts differ"), 0;
        SAME_ARR(a->u.liveness_reply.ranks, b->u.liveness_reply.ranks, a->u.liveness_reply.n_ranks,
                 "ranks");
        SAME_ARR(a->u.liveness_reply.alive, b->u.liveness_reply.alive, a->u.liveness_reply.n_alive,
                 "alive");
        x.u.liveness_reply.ranks = y.u.liveness_reply.ranks = NULL;
        x.u.liveness_reply.alive = y.u.liveness_reply.alive = NULL;
        break;
    case TIDE_MSG_JOBS_REPLY:
        if (a->u.jobs_reply.n_rows != b->u.jobs_reply.n_rows)
            return snprintf(why, len, "row counts differ"), 0;
        SAME_ARR(a->u.jobs_reply.rows, b->u.jobs_reply.rows, a->u.jobs_reply.n_rows, "job rows");
        x.u.jobs_reply.rows = y.u.jobs_reply.rows = NULL;
        break;
    case TIDE_MSG_EVENTS_REPLY:
        if (a->u.events_reply.n_rows != b->u.events_reply.n_rows)
            return snprintf(why, len, "row counts differ"), 0;
        for (uint32_t i = 0; i < a->u.events_reply.n_rows; i++) {
            tide_proto_event_row_t ra = a->u.events_reply.rows[i], rb = b->u.events_reply.rows[i];
            if (!same_event_fields(&ra.fields, &rb.fields))
                return snprintf(why, len, "event rows[%u].fields differ", i), 0;
            ra.fields.workers = rb.fields.workers = NULL;
            if (memcmp(&ra, &rb, sizeof ra) != 0)
                return snprintf(why, len, "event rows[%u] differ", i), 0;
        }
        x.u.events_reply.rows = y.u.events_reply.rows = NULL;
        break;
    case TIDE_MSG_EVENT_FIELDS:
        if (!same_event_fields(&a->u.event_fields, &b->u.event_fields))
            return snprintf(why, len, "event fields differ"), 0;
        x.u.event_fields.workers = y.u.event_fields.workers = NULL;
        break;
    case TIDE_MSG_LOGS_REPLY:
        if (a->u.logs_reply.n_rows != b->u.logs_reply.n_rows)
            return snprintf(why, len, "row counts differ"), 0;
        SAME_ARR(a->u.logs_reply.rows, b->u.logs_reply.rows, a->u.logs_reply.n_rows,
                 "attempt rows");
        x.u.logs_reply.rows = y.u.logs_reply.rows = NULL;
        break;
    case TIDE_MSG_RESIZE:
        if (a->u.resize.n_stages != b->u.resize.n_stages)
            return snprintf(why, len, "stage counts differ"), 0;
        SAME_ARR(a->u.resize.stage_start, b->u.resize.stage_start, a->u.resize.n_stages, "stages");
        x.u.resize.stage_start = y.u.resize.stage_start = NULL;
        break;
    default:
        break;
    }
#undef SAME_ARR
#undef SAME_LAYOUT
    if (memcmp(&x, &y, sizeof x) != 0) {
        snprintf(why, len, "scalar fields differ");
        return 0;
    }
    return 1;
}

/* Encodes m into a fresh heap copy (the caller frees); asserts success. */
static uint8_t *encode_copy(const tide_msg_t *m, size_t *len)
{
    tide_proto_buf_t b;
    tide_proto_buf_init(&b);
    tide_status rc = tide_proto_encode(m, &b);
    cr_assert_eq(rc, TIDE_OK, "encode %s: %s", tide_msg_type_name(m->type), tide_last_error());
    return tide_proto_buf_release(&b, len);
}

/* Decodes and expects a protocol error whose detail contains want. */
static void expect_refused(const void *data, size_t len, const char *want)
{
    tide_msg_t m;
    memset(&m, 0xab, sizeof m); /* decode must not rely on an initialised out */
    tide_status rc = tide_proto_decode(data, len, &m);
    cr_assert_eq(rc, TIDE_ERR_PROTOCOL, "expected refusal containing \"%s\", got rc=%d (%s)", want,
                 rc, tide_last_error());
    cr_assert_eq(m.type, TIDE_MSG_NONE, "a refused message must hold nothing");
    cr_assert(strstr(tide_last_error(), want) != NULL, "detail \"%s\" lacks \"%s\"",
              tide_last_error(), want);
}

/* ---- raw msgpack editing: build invalid variants of a valid message ------------------------- */

typedef enum { V_STR, V_UINT, V_INT, V_DBL, V_NIL, V_BOOL, V_BIN, V_IARR } vkind;
typedef struct val {
    vkind k;
    const char *s;
    size_t slen;
    uint64_t u;
    int64_t i;
    double d;
    const int64_t *arr;
    size_t n;
} val_t;

#define VSTR(x)       ((val_t){.k = V_STR, .s = (x), .slen = strlen(x)})
#define VSTRN(x, len) ((val_t){.k = V_STR, .s = (x), .slen = (len)})
#define VUINT(x)      ((val_t){.k = V_UINT, .u = (x)})
#define VINT(x)       ((val_t){.k = V_INT, .i = (x)})
#define VDBL(x)       ((val_t){.k = V_DBL, .d = (x)})
#define VNIL          ((val_t){.k = V_NIL})
#define VBOOL(x)      ((val_t){.k = V_BOOL, .u = (x)})
#define VBIN(x)       ((val_t){.k = V_BIN, .s = (x), .slen = strlen(x)})
#define VIARR(a, cnt) ((val_t){.k = V_IARR, .arr = (a), .n = (cnt)})

typedef enum { OP_SET, OP_DROP, OP_ADD, OP_DUP } op_t;

static void pack_val(msgpack_packer *pk, const val_t *v)
{
    switch (v->k) {
    case V_STR:
        msgpack_pack_str(pk, v->slen);
        msgpack_pack_str_body(pk, v->s, v->slen);
        break;
    case V_BIN:
        msgpack_pack_bin(pk, v->slen);
        msgpack_pack_bin_body(pk, v->s, v->slen);
        break;
    case V_UINT:
        msgpack_pack_uint64(pk, v->u);
        break;
    case V_INT:
        msgpack_pack_int64(pk, v->i);
        break;
    case V_DBL:
        msgpack_pack_double(pk, v->d);
        break;
    case V_NIL:
        msgpack_pack_nil(pk);
        break;
    case V_BOOL:
        v->u ? msgpack_pack_true(pk) : msgpack_pack_false(pk);
        break;
    case V_IARR:
        msgpack_pack_array(pk, v->n);
        for (size_t k = 0; k < v->n; k++)
            msgpack_pack_int64(pk, v->arr[k]);
        break;
    }
}

static void pack_cstr(msgpack_packer *pk, const char *s)
{
    msgpack_pack_str(pk, strlen(s));
    msgpack_pack_str_body(pk, s, strlen(s));
}

/* Copies o, applying op at path ("layout.stages", "rows.2.host"). */
static void repack(msgpack_packer *pk, const msgpack_object *o, const char *path, op_t op,
                   const val_t *v)
{
    char head[64];
    const char *dot = strchr(path, '.');
    size_t hl = dot ? (size_t)(dot - path) : strlen(path);
    memcpy(head, path, hl);
    head[hl] = '\0';
    const char *rest = dot ? dot + 1 : "";
    int here = *rest == '\0';
    if (o->type == MSGPACK_OBJECT_MAP) {
        uint32_t n = o->via.map.size;
        if (here && op == OP_DROP)
            n--;
        if (here && (op == OP_ADD || op == OP_DUP))
            n++;
        msgpack_pack_map(pk, n);
        for (uint32_t k = 0; k < o->via.map.size; k++) {
            const msgpack_object_kv *kv = &o->via.map.ptr[k];
            int match = kv->key.type == MSGPACK_OBJECT_STR && kv->key.via.str.size == hl &&
                        memcmp(kv->key.via.str.ptr, head, hl) == 0;
            if (match && !here) {
                msgpack_pack_object(pk, kv->key);
                repack(pk, &kv->val, rest, op, v);
            } else if (match && op == OP_SET) {
                msgpack_pack_object(pk, kv->key);
                pack_val(pk, v);
            } else if (match && op == OP_DROP) {
                /* left out */
            } else if (match && op == OP_DUP) {
                msgpack_pack_object(pk, kv->key);
                msgpack_pack_object(pk, kv->val);
                msgpack_pack_object(pk, kv->key);
                msgpack_pack_object(pk, kv->val);
            } else {
                msgpack_pack_object(pk, kv->key);
                msgpack_pack_object(pk, kv->val);
            }
        }
        if (here && op == OP_ADD) {
            pack_cstr(pk, head);
            pack_val(pk, v);
        }
    } else if (o->type == MSGPACK_OBJECT_ARRAY) {
        uint32_t idx = (uint32_t)atoi(head);
        msgpack_pack_array(pk, o->via.array.size);
        for (uint32_t k = 0; k < o->via.array.size; k++) {
            if (k == idx && here)
                pack_val(pk, v);
            else if (k == idx)
                repack(pk, &o->via.array.ptr[k], rest, op, v);
            else
                msgpack_pack_object(pk, o->via.array.ptr[k]);
        }
    } else {
        msgpack_pack_object(pk, *o);
    }
}

/* Encodes m, edits it and expects the decoder to refuse it with want in the detail. */
static void refuse_edit(const tide_msg_t *m, op_t op, const char *path, val_t v, const char *want)
{
    size_t len;
    uint8_t *bytes = encode_copy(m, &len);
    msgpack_unpacked u;
    msgpack_unpacked_init(&u);
    size_t off = 0;
    cr_assert_eq(msgpack_unpack_next(&u, (const char *)bytes, len, &off), MSGPACK_UNPACK_SUCCESS);
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    repack(&pk, &u.data, path, op, &v);
    expect_refused(sb.data, sb.size, want);
    msgpack_sbuffer_destroy(&sb);
    msgpack_unpacked_destroy(&u);
    tide_free(bytes);
}

/* ---- fixed valid messages -----------------------------------------------------------------------
 */

static tide_msg_t heartbeat(void)
{
    tide_msg_t m;
    tide_msg_init(&m, TIDE_MSG_HEARTBEAT);
    m.u.heartbeat.worker = 7;
    m.u.heartbeat.step = 1234;
    m.u.heartbeat.gen = 3;
    m.u.heartbeat.idle_ms = 1.5;
    m.u.heartbeat.bubble_ms = 20.25;
    m.u.heartbeat.filled_ms = 17.5;
    m.u.heartbeat.step_ms = 310.0;
    return m;
}

static int stages4[3] = {0, 12, 24};
static int32_t workers4[4] = {10, 11, 12, 13};

/* layout job "llm", gen 5: dp 2, tp 1, pp 2 over 24 layers; caller's arrays (no clear). */
static tide_msg_t layout_msg(void)
{
    tide_msg_t m;
    tide_msg_init(&m, TIDE_MSG_LAYOUT);
    strcpy(m.u.layout.job, "llm");
    tide_proto_layout_t *l = &m.u.layout.layout;
    l->gen = 5;
    l->dp = 2;
    l->tp = 1;
    l->pp = 2;
    l->num_layers = 24;
    l->micro_batches = 8;
    l->stage_start = stages4;
    l->worker = workers4;
    m.u.layout.has_prev = 0;
    m.u.layout.world = 4;
    return m;
}

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
