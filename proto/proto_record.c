/*
 * proto: the schemas of the records, what tide writes to a disk rather than a socket
 * (proto.h, "records"): a job's layout, pools, fit rules, checkpoints and command line in
 * tided's state file, and a checkpoint's manifest and shard checksums. They reuse the
 * message schemas of the concepts they hold (layout, tensor, fit rule), so a layout is
 * encoded and checked the same way on the wire and on disk. Workload: a few records per
 * job change in tided; one manifest per checkpoint (up to TIDE_PROTO_RECORD_MAX_BYTES).
 */
#include <stdio.h>

#include "proto/proto_int.h"

static const tide__field job_layout_fields[] = {
    {.key = "layout",
     .kind = TIDE__K_STRUCT,
     .off = offsetof(tide_proto_job_layout_t, layout),
     .count_off = TIDE__NO_OFF,
     .sub = &tide__layout_schema},
};

/* A released pool is no longer connected: the two cannot both hold. */
static tide_status check_job_pool(const void *base, tide__ctx *c)
{
    const tide_proto_job_pool_t *p = base;
    if (p->left != 0 && p->connected)
        return tide__fail(c,
                          "field '%sconnected' must be false: the pool left the job at "
                          "generation %llu",
                          c->path, (unsigned long long)p->left);
    return TIDE_OK;
}

static const tide__field job_pool_fields[] = {
    F_STR(tide_proto_job_pool_t, name, "name", TIDE__CS_NAME, 1),
    F_INT(tide_proto_job_pool_t, size, "size", 1, TIDE_PROTO_WORKERS_MAX),
    F_BOOL(tide_proto_job_pool_t, connected, "connected"),
    F_U64(tide_proto_job_pool_t, left, "left"),
};
static const tide__schema job_pool_schema = {job_pool_fields, NELEM(job_pool_fields),
                                             sizeof(tide_proto_job_pool_t), 0, check_job_pool};

static tide_status check_job_pools(const void *base, tide__ctx *c)
{
    const tide_proto_job_pools_t *m = base;
    uint64_t ranks = 0;
    for (uint32_t i = 0; i < m->n_pools; i++)
        ranks += (uint64_t)m->pools[i].size;
    if (ranks > TIDE_PROTO_WORKERS_MAX)
        return tide__fail(c, "the pools hold %llu job ranks, more than the limit of %u",
                          (unsigned long long)ranks, TIDE_PROTO_WORKERS_MAX);
    return TIDE_OK;
}

static const tide__field job_pools_fields[] = {
    {.key = "pools",
     .kind = TIDE__K_STRUCT_ARRAY,
     .off = offsetof(tide_proto_job_pools_t, pools),
     .count_off = offsetof(tide_proto_job_pools_t, n_pools),
     .cmax = TIDE_PROTO_JOB_POOLS_MAX,
     .sub = &job_pool_schema},
};

static const tide__field job_fit_fields[] = {
    {.key = "fit",
     .kind = TIDE__K_STRUCT_ARRAY,
     .off = offsetof(tide_proto_job_fit_t, fit),
     .count_off = offsetof(tide_proto_job_fit_t, n_fit),
     .cmax = TIDE_PROTO_FIT_MAX,
     .sub = &tide__fit_schema},
};

static const tide__field ckpt_ref_fields[] = {
    F_INT(tide_proto_ckpt_ref_t, step, "step", 0, INT64_MAX),
    F_STR(tide_proto_ckpt_ref_t, dir, "dir", TIDE__CS_TEXT, 1),
};
static const tide__schema ckpt_ref_schema = {ckpt_ref_fields, NELEM(ckpt_ref_fields),
                                             sizeof(tide_proto_ckpt_ref_t), 0, NULL};

static tide_status check_job_ckpts(const void *base, tide__ctx *c)
{
    const tide_proto_job_ckpts_t *m = base;
    for (uint32_t i = 1; i < m->n_ckpts; i++)
        if (m->ckpts[i].step <= m->ckpts[i - 1].step)
            return tide__fail(c,
                              "field 'ckpts' must be in strictly increasing step order "
                              "(ckpts[%u].step = %lld after %lld)",
                              i, (long long)m->ckpts[i].step, (long long)m->ckpts[i - 1].step);
    return TIDE_OK;
}

static const tide__field job_ckpts_fields[] = {
    {.key = "ckpts",
     .kind = TIDE__K_STRUCT_ARRAY,
     .off = offsetof(tide_proto_job_ckpts_t, ckpts),
     .count_off = offsetof(tide_proto_job_ckpts_t, n_ckpts),
     .cmax = TIDE_PROTO_CKPTS_MAX,
     .sub = &ckpt_ref_schema},
};

static const tide__field job_argv_fields[] = {ARGV_FIELD(tide_proto_job_argv_t)};

static const tide__field ckpt_shard_fields[] = {
    F_INT(tide_proto_ckpt_shard_t, p, "p", 0, TIDE_PROTO_DEGREE_MAX - 1),
    F_INT(tide_proto_ckpt_shard_t, d, "d", 0, TIDE_PROTO_DEGREE_MAX - 1),
    F_INT(tide_proto_ckpt_shard_t, t, "t", 0, TIDE_PROTO_DEGREE_MAX - 1),
    F_INT(tide_proto_ckpt_shard_t, bytes, "bytes", 1, UINT64_MAX),
    {.key = "hashes",
     .kind = TIDE__K_U64_BIN,
     .off = offsetof(tide_proto_ckpt_shard_t, hashes),
     .count_off = offsetof(tide_proto_ckpt_shard_t, n_hashes),
     .cmax = TIDE_PROTO_HASHES_MAX},
};
static const tide__schema ckpt_shard_schema = {ckpt_shard_fields, NELEM(ckpt_shard_fields),
                                               sizeof(tide_proto_ckpt_shard_t), 1, NULL};

/* A shard of `bytes` bytes has one hash per chunk, the last one possibly short. */
static tide_status check_shard_hashes(tide__ctx *c, const tide_proto_ckpt_shard_t *s,
                                      uint32_t chunk, const char *where)
{
    uint64_t want = s->bytes / chunk + (s->bytes % chunk != 0);
    if (s->n_hashes != want)
        return tide__fail(c,
                          "field '%shashes' holds %u chunk hashes; %llu bytes in chunks of %u "
                          "need %llu",
                          where, s->n_hashes, (unsigned long long)s->bytes, chunk,
                          (unsigned long long)want);
    return TIDE_OK;
}

static tide_status check_ckpt_manifest(const void *base, tide__ctx *c)
{
    const tide_proto_ckpt_manifest_t *m = base;
    const tide_proto_layout_t *l = &m->layout;
    for (uint32_t i = 0; i < m->n_tensors; i++)
        if (m->tensors[i].layer >= l->num_layers)
            return tide__fail(c, "field 'tensors[%u].layer' = %d must be below layout.layers = %d",
                              i, m->tensors[i].layer, l->num_layers);
    uint64_t prev = 0;
    for (uint32_t i = 0; i < m->n_shards; i++) {
        const tide_proto_ckpt_shard_t *s = &m->shards[i];
        char where[32];
        snprintf(where, sizeof where, "shards[%u].", i);
        if (s->p >= l->pp || s->d >= l->dp || s->t >= l->tp)
            return tide__fail(c,
                              "field 'shards[%u]' = (p %d, d %d, t %d) is outside the layout "
                              "(pp %d, dp %d, tp %d)",
                              i, s->p, s->d, s->t, l->pp, l->dp, l->tp);
        uint64_t at = ((uint64_t)s->p * (uint64_t)l->dp + (uint64_t)s->d) * (uint64_t)l->tp +
                      (uint64_t)s->t + 1;
        if (at <= prev)
            return tide__fail(c,
                              "field 'shards' must be in strictly increasing (p, d, t) order "
                              "(shards[%u] is not)",
                              i);
        prev = at;
        TIDE_CHECK(check_shard_hashes(c, s, m->chunk, where));
    }
    return TIDE_OK;
}

#define CHECK_FIELD(T) F_U64(T, check, "check")

static const tide__field ckpt_manifest_fields[] = {
    F_INT(tide_proto_ckpt_manifest_t, format, "format", 2, 65535),
    F_INT(tide_proto_ckpt_manifest_t, chunk, "chunk", 1, TIDE_PROTO_CHUNK_MAX),
    F_INT(tide_proto_ckpt_manifest_t, step, "step", 0, INT64_MAX),
    F_U64(tide_proto_ckpt_manifest_t, save_id, "save_id"),
    {.key = "layout",
     .kind = TIDE__K_STRUCT,
     .off = offsetof(tide_proto_ckpt_manifest_t, layout),
     .count_off = TIDE__NO_OFF,
     .sub = &tide__layout_schema},
    {.key = "tensors",
     .kind = TIDE__K_STRUCT_ARRAY,
     .off = offsetof(tide_proto_ckpt_manifest_t, tensors),
     .count_off = offsetof(tide_proto_ckpt_manifest_t, n_tensors),
     .cmax = TIDE_PROTO_TENSORS_MAX,
     .sub = &tide__tensor_schema},
    {.key = "shards",
     .kind = TIDE__K_STRUCT_ARRAY,
     .off = offsetof(tide_proto_ckpt_manifest_t, shards),
     .count_off = offsetof(tide_proto_ckpt_manifest_t, n_shards),
     .cmax = TIDE_PROTO_WORKERS_MAX,
     .sub = &ckpt_shard_schema},
    CHECK_FIELD(tide_proto_ckpt_manifest_t),
};

static tide_status check_ckpt_sum(const void *base, tide__ctx *c)
{
    const tide_proto_ckpt_sum_t *m = base;
    return check_shard_hashes(c, &m->shard, m->chunk, "shard.");
}

static const tide__field ckpt_sum_fields[] = {
    F_U64(tide_proto_ckpt_sum_t, save_id, "save_id"),
    F_INT(tide_proto_ckpt_sum_t, chunk, "chunk", 1, TIDE_PROTO_CHUNK_MAX),
    {.key = "shard",
     .kind = TIDE__K_STRUCT,
     .off = offsetof(tide_proto_ckpt_sum_t, shard),
     .count_off = TIDE__NO_OFF,
     .sub = &ckpt_shard_schema},
    CHECK_FIELD(tide_proto_ckpt_sum_t),
};

static const tide__schema record_schemas[TIDE_MSG__COUNT] = {
    [TIDE_MSG_JOB_LAYOUT] = SCHEMA(job_layout_fields, tide_proto_job_layout_t, 1, NULL),
    [TIDE_MSG_JOB_POOLS] = SCHEMA(job_pools_fields, tide_proto_job_pools_t, 1, check_job_pools),
    [TIDE_MSG_JOB_FIT] = SCHEMA(job_fit_fields, tide_proto_job_fit_t, 1, NULL),
    [TIDE_MSG_JOB_CKPTS] = SCHEMA(job_ckpts_fields, tide_proto_job_ckpts_t, 1, check_job_ckpts),
    [TIDE_MSG_JOB_ARGV] = SCHEMA(job_argv_fields, tide_proto_job_argv_t, 1, NULL),
    [TIDE_MSG_CKPT_MANIFEST] =
        SCHEMA(ckpt_manifest_fields, tide_proto_ckpt_manifest_t, 1, check_ckpt_manifest),
    [TIDE_MSG_CKPT_SUM] = SCHEMA(ckpt_sum_fields, tide_proto_ckpt_sum_t, 1, check_ckpt_sum),
};

const tide__schema *tide__record_schema(tide_msg_type_t type)
{
    if (type == TIDE_MSG_EVENT_FIELDS) /* shared with the events reply's rows (proto.c) */
        return &tide__event_fields_schema;
    if ((int)type <= (int)TIDE_MSG_NONE || (int)type >= (int)TIDE_MSG__COUNT ||
        record_schemas[type].size == 0)
        return NULL;
    return &record_schemas[type];
}
