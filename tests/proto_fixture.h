/*
 * The fixture of proto/'s unit tests (test_proto.c, test_proto_refuse.c, test_proto_encode.c,
 * test_proto_record.c, one executable: test_proto): a seed for the random messages (printed,
 * settable with TIDE_TEST_SEED), deep equality of two messages, encoding to a heap copy, a
 * decode expected to be refused, editing the msgpack of a valid message into an invalid one,
 * and the fixed valid messages (a heartbeat, a layout). Header-only, like ctl_fixture.h:
 * Criterion runs each test in its own process. Test thread only.
 */
#ifndef TIDE_TESTS_PROTO_FIXTURE_H
#define TIDE_TESTS_PROTO_FIXTURE_H

#include <criterion/criterion.h>
#include <msgpack.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/alloc.h"
#include "core/error.h"
#include "proto/proto.h"

/* ---- helpers ------------------------------------------------------------------------------- */

static inline uint64_t test_seed(void)
{
    const char *env = getenv("TIDE_TEST_SEED");
    uint64_t seed = env ? strtoull(env, NULL, 0) : (uint64_t)time(NULL) * 2654435761u;
    return seed ? seed : 1;
}

/* Equality of two checkpoint shard records, hashes included. */
static inline int same_event_fields(const tide_proto_event_fields_t *a,
                                    const tide_proto_event_fields_t *b)
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

static inline int same_shard(const tide_proto_ckpt_shard_t *a, const tide_proto_ckpt_shard_t *b)
{
    return a->p == b->p && a->d == b->d && a->t == b->t && a->bytes == b->bytes &&
           a->n_hashes == b->n_hashes &&
           (a->n_hashes == 0 || memcmp(a->hashes, b->hashes, a->n_hashes * sizeof *a->hashes) == 0);
}

/* Deep equality of two messages; writes the first difference into why. */
static inline int same_msg(const tide_msg_t *a, const tide_msg_t *b, char *why, size_t len)
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
static inline uint8_t *encode_copy(const tide_msg_t *m, size_t *len)
{
    tide_proto_buf_t b;
    tide_proto_buf_init(&b);
    tide_status rc = tide_proto_encode(m, &b);
    cr_assert_eq(rc, TIDE_OK, "encode %s: %s", tide_msg_type_name(m->type), tide_last_error());
    return tide_proto_buf_release(&b, len);
}

/* Decodes and expects a protocol error whose detail contains want. */
static inline void expect_refused(const void *data, size_t len, const char *want)
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

static inline void pack_val(msgpack_packer *pk, const val_t *v)
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

static inline void pack_cstr(msgpack_packer *pk, const char *s)
{
    msgpack_pack_str(pk, strlen(s));
    msgpack_pack_str_body(pk, s, strlen(s));
}

/* Copies o, applying op at path ("layout.stages", "rows.2.host"). */
static inline void repack(msgpack_packer *pk, const msgpack_object *o, const char *path, op_t op,
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
static inline void refuse_edit(const tide_msg_t *m, op_t op, const char *path, val_t v,
                               const char *want)
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

static inline tide_msg_t heartbeat(void)
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
static inline tide_msg_t layout_msg(void)
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

#endif /* TIDE_TESTS_PROTO_FIXTURE_H */
