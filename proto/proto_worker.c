/*
 * proto: the schemas of what workers and tided say to each other (proto.h, "worker <->
 * tided"): registration and heartbeats, joins and layouts, the switch (prepare, commit,
 * abort, halt), checkpoints, liveness and failures, offline work. Their table below is one
 * line per type; tide__msg_schema (proto.c) looks a type up here first. Workload: the hot
 * path, a heartbeat per worker per interval (~10^4 messages/s in tided).
 */
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "proto/proto_int.h"

/* A scheduler's allocation: none (every field empty) or Slurm's, with its job id. */
static tide_status check_alloc(const void *base, tide__ctx *c)
{
    const tide_proto_alloc_t *a = base;
    char fn[160];
    if (a->sched[0] == '\0') {
        if (a->id[0] || a->nodes[0] || a->node[0] || a->gpus[0] || a->partition[0] || a->restarts)
            return tide__fail(c, "%s is empty (no scheduler) but other fields are set",
                              tide__field_name(c, "sched", fn, sizeof fn));
        return TIDE_OK;
    }
    if (strcmp(a->sched, "slurm") != 0)
        return tide__fail(c, "%s = '%s' is not one of: \"\", slurm",
                          tide__field_name(c, "sched", fn, sizeof fn), a->sched);
    size_t n = strlen(a->id);
    int ok = n > 0 && a->id[0] != '_';
    for (size_t i = 0; ok && i < n; i++)
        ok = (a->id[i] >= '0' && a->id[i] <= '9') || a->id[i] == '_';
    if (!ok)
        return tide__fail(c, "%s = '%s' is no Slurm job id (digits and '_')",
                          tide__field_name(c, "id", fn, sizeof fn), a->id);
    return TIDE_OK;
}

static const tide__field alloc_fields[] = {
    F_STR(tide_proto_alloc_t, sched, "sched", TIDE__CS_NAME, 0),
    F_STR(tide_proto_alloc_t, id, "id", TIDE__CS_NAME, 0),
    F_STR(tide_proto_alloc_t, nodes, "nodes", TIDE__CS_HOST, 0),
    F_STR(tide_proto_alloc_t, node, "node", TIDE__CS_HOST, 0),
    F_STR(tide_proto_alloc_t, gpus, "gpus", TIDE__CS_HOST, 0),
    F_STR(tide_proto_alloc_t, partition, "partition", TIDE__CS_HOST, 0),
    F_INT(tide_proto_alloc_t, restarts, "restarts", 0, INT32_MAX),
};
static const tide__schema alloc_schema = {alloc_fields, NELEM(alloc_fields),
                                          sizeof(tide_proto_alloc_t), 0, check_alloc};

static tide_status check_register(const void *base, tide__ctx *c)
{
    const tide_proto_register_t *m = base;
    if (m->rank >= m->size)
        return tide__fail(c, "field 'rank' = %d must be below field 'size' = %d", m->rank, m->size);
    return TIDE_OK;
}

static const tide__field register_fields[] = {
    F_STR(tide_proto_register_t, pool, "pool", TIDE__CS_NAME, 1),
    F_INT(tide_proto_register_t, rank, "rank", 0, TIDE_PROTO_WORKERS_MAX - 1),
    F_INT(tide_proto_register_t, size, "size", 1, TIDE_PROTO_WORKERS_MAX),
    F_STR(tide_proto_register_t, host, "host", TIDE__CS_HOST, 1),
    F_INT(tide_proto_register_t, device, "device", 0, TIDE_PROTO_DEVICE_MAX),
    F_U64(tide_proto_register_t, mem_bytes, "mem"),
    F_ENUM(tide_proto_register_t, kind, "kind", tide__device_kind_names),
    F_INT(tide_proto_register_t, pid, "pid", 1, INT32_MAX),
    {.key = "alloc",
     .kind = TIDE__K_STRUCT,
     .off = offsetof(tide_proto_register_t, alloc),
     .count_off = TIDE__NO_OFF,
     .sub = &alloc_schema},
};

static tide_status check_register_ok(const void *base, tide__ctx *c)
{
    const tide_proto_register_ok_t *m = base;
    if (m->fail_ms < m->heartbeat_ms)
        return tide__fail(c, "field 'fail_ms' = %d must be at least field 'heartbeat_ms' = %d",
                          m->fail_ms, m->heartbeat_ms);
    return TIDE_OK;
}

static const tide__field register_ok_fields[] = {
    F_WORKER(tide_proto_register_ok_t, worker),
    F_INT(tide_proto_register_ok_t, heartbeat_ms, "heartbeat_ms", 10, 600000),
    F_INT(tide_proto_register_ok_t, fail_ms, "fail_ms", 10, INT32_MAX),
};

static const tide__field heartbeat_fields[] = {
    F_WORKER(tide_proto_heartbeat_t, worker),
    F_U64(tide_proto_heartbeat_t, step, "step"),
    F_GEN(tide_proto_heartbeat_t, gen),
    F_MS(tide_proto_heartbeat_t, idle_ms, "idle_ms"),
    F_MS(tide_proto_heartbeat_t, bubble_ms, "bubble_ms"),
    F_MS(tide_proto_heartbeat_t, filled_ms, "filled_ms"),
    F_MS(tide_proto_heartbeat_t, step_ms, "step_ms"),
    F_MS_OPT(tide_proto_heartbeat_t, in_step_ms, "in_step_ms"),
};

static const tide__schema heartbeat_schema = {heartbeat_fields, NELEM(heartbeat_fields),
                                              sizeof(tide_proto_heartbeat_t), 0, NULL};

/* One entry per rank, in worker order, the sender's among them: a duplicated or missing
   leader entry would count or skip a rank's liveness. */
static tide_status check_host_heartbeat(const void *base, tide__ctx *c)
{
    const tide_proto_host_heartbeat_t *m = base;
    int own = 0;
    if (m->n_beats == 0)
        return tide__fail(c, "field 'beats' must hold at least the sender's own heartbeat");
    for (uint32_t i = 0; i < m->n_beats; i++) {
        if (i > 0 && m->beats[i].worker <= m->beats[i - 1].worker)
            return tide__fail(c,
                              "field 'beats' must be in strictly increasing worker order "
                              "(beats[%u].worker = %d after %d)",
                              i, m->beats[i].worker, m->beats[i - 1].worker);
        own |= m->beats[i].worker == m->worker;
    }
    if (!own)
        return tide__fail(c, "field 'beats' lacks the sender's own heartbeat (worker %d)",
                          m->worker);
    return TIDE_OK;
}

static const tide__field host_heartbeat_fields[] = {
    F_WORKER(tide_proto_host_heartbeat_t, worker),
    {.key = "beats",
     .kind = TIDE__K_STRUCT_ARRAY,
     .off = offsetof(tide_proto_host_heartbeat_t, beats),
     .count_off = offsetof(tide_proto_host_heartbeat_t, n_beats),
     .cmin = 1,
     .cmax = TIDE_PROTO_HOST_BEATS_MAX,
     .sub = &heartbeat_schema},
};

static const tide__field bye_fields[] = {
    F_WORKER(tide_proto_bye_t, worker),
    F_U64(tide_proto_bye_t, step, "step"),
};

static tide_status check_join(const void *base, tide__ctx *c)
{
    const tide_proto_join_t *m = base;
    TIDE_CHECK(tide__check_degrees(c, m->dp, m->tp, m->pp));
    if (m->pp > m->num_layers)
        return tide__fail(c, "field 'pp' = %d exceeds field 'layers' = %d", m->pp, m->num_layers);
    if ((m->min_gpus == 0) != (m->max_gpus == 0))
        return tide__fail(
            c, "fields 'min' = %d and 'max' = %d must both be 0 (no bounds) or both be set",
            m->min_gpus, m->max_gpus);
    for (uint32_t i = 0; i < m->n_tensors; i++)
        if (m->tensors[i].layer >= m->num_layers)
            return tide__fail(c, "field 'tensors[%u].layer' = %d must be below layers = %d", i,
                              m->tensors[i].layer, m->num_layers);
    return TIDE_OK;
}

static const tide__field join_fields[] = {
    F_WORKER(tide_proto_join_t, worker),
    F_JOB(tide_proto_join_t, job),
    F_U64(tide_proto_join_t, total_bytes, "total_bytes"),
    F_INT(tide_proto_join_t, num_layers, "layers", 1, TIDE_PROTO_LAYERS_MAX),
    F_DEGREE(tide_proto_join_t, dp, "dp"),
    F_DEGREE(tide_proto_join_t, tp, "tp"),
    F_DEGREE(tide_proto_join_t, pp, "pp"),
    F_INT(tide_proto_join_t, micro_batches, "micro", 1, TIDE_PROTO_MICRO_MAX),
    {.key = "tensors",
     .kind = TIDE__K_STRUCT_ARRAY,
     .off = offsetof(tide_proto_join_t, tensors),
     .count_off = offsetof(tide_proto_join_t, n_tensors),
     .cmax = TIDE_PROTO_TENSORS_MAX,
     .sub = &tide__tensor_schema},
    {.key = "fit",
     .kind = TIDE__K_STRUCT_ARRAY,
     .off = offsetof(tide_proto_join_t, fit),
     .count_off = offsetof(tide_proto_join_t, n_fit),
     .cmax = TIDE_PROTO_FIT_MAX,
     .sub = &tide__fit_schema},
    F_INT_OPT(tide_proto_join_t, min_gpus, "min", 0, 1 << 20),
    F_INT_OPT(tide_proto_join_t, max_gpus, "max", 0, 1 << 20),
    F_INT_OPT(tide_proto_join_t, priority, "priority", 0, 100),
};

static int cmp_i32(const void *a, const void *b)
{
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return x < y ? -1 : x > y;
}

static tide_status check_ranks(tide__ctx *c, const char *key, const int32_t *r, uint32_t n,
                               int32_t world)
{
    for (uint32_t i = 0; i < n; i++) {
        if (r[i] >= world)
            return tide__fail(c, "field '%s[%u]' = %d must be below field 'world' = %d", key, i,
                              r[i], world);
        if (i > 0 && r[i] <= r[i - 1])
            return tide__fail(c, "field '%s' must be strictly increasing", key);
    }
    return TIDE_OK;
}

static tide_status check_layout_msg(const void *base, tide__ctx *c)
{
    const tide_proto_layout_msg_t *m = base;
    if (m->base >= m->world)
        return tide__fail(c, "field 'base' = %d must be below field 'world' = %d", m->base,
                          m->world);
    TIDE_CHECK(check_ranks(c, "join_old", m->join_old, m->n_join_old, m->world));
    TIDE_CHECK(check_ranks(c, "join_new", m->join_new, m->n_join_new, m->world));
    if ((m->n_join_old == 0) != (m->n_join_new == 0))
        return tide__fail(c, "fields 'join_old' and 'join_new' must be both empty or both given");
    if (m->n_join_new > 0 && !m->has_prev)
        return tide__fail(c, "a join needs field 'prev' (a job's first layout connects nothing)");
    for (uint32_t i = 0, k = 0; i < m->n_join_new; i++) {
        while (k < m->n_join_old && m->join_old[k] < m->join_new[i])
            k++;
        if (k < m->n_join_old && m->join_old[k] == m->join_new[i])
            return tide__fail(c, "job rank %d is on both sides of the join", m->join_new[i]);
    }
    TIDE_CHECK(check_ranks(c, "stay", m->stay, m->n_stay, m->world));
    TIDE_CHECK(check_ranks(c, "leave", m->leave, m->n_leave, m->world));
    if ((m->n_stay == 0) != (m->n_leave == 0))
        return tide__fail(c, "fields 'stay' and 'leave' must be both empty or both given");
    if (m->n_leave > 0 && m->n_join_new > 0)
        return tide__fail(c, "a generation either connects a pool ('join_new') or releases pools "
                             "('leave'), not both");
    if (m->n_leave > 0 && !m->has_prev)
        return tide__fail(c,
                          "a release needs field 'prev' (a job's first layout releases nothing)");
    for (uint32_t i = 0, k = 0; i < m->n_leave; i++) {
        while (k < m->n_stay && m->stay[k] < m->leave[i])
            k++;
        if (k < m->n_stay && m->stay[k] == m->leave[i])
            return tide__fail(c, "job rank %d both stays and leaves", m->leave[i]);
    }
    /* the new layout runs on the launches that stay: its ranks are among them */
    size_t nl = (size_t)m->layout.dp * (size_t)m->layout.tp * (size_t)m->layout.pp;
    for (size_t i = 0; m->n_leave > 0 && m->layout.worker != NULL && i < nl; i++)
        if (bsearch(&m->layout.worker[i], m->stay, m->n_stay, sizeof *m->stay, cmp_i32) == NULL)
            return tide__fail(c, "job rank %d of field 'layout' is not in field 'stay'",
                              m->layout.worker[i]);
    if (m->ckpt[0] != '\0' && (!m->has_prev || !m->recover))
        return tide__fail(c, "field 'ckpt' is given only with 'prev' and 'recover' (a recovery "
                             "that rolls back to a checkpoint)");
    if (m->ckpt[0] == '\0' && m->ckpt_step != 0)
        return tide__fail(c, "field 'ckpt_step' must be 0 when field 'ckpt' is empty");
    if (!m->has_prev)
        return TIDE_OK;
    if (m->prev.gen >= m->layout.gen)
        return tide__fail(c, "field 'prev.gen' = %llu must be below field 'layout.gen' = %llu",
                          (unsigned long long)m->prev.gen, (unsigned long long)m->layout.gen);
    if (m->prev.num_layers != m->layout.num_layers)
        return tide__fail(c, "field 'prev.layers' = %d differs from field 'layout.layers' = %d",
                          m->prev.num_layers, m->layout.num_layers);
    return TIDE_OK;
}

static const tide__field layout_msg_fields[] = {
    F_JOB(tide_proto_layout_msg_t, job),
    {.key = "layout",
     .kind = TIDE__K_STRUCT,
     .off = offsetof(tide_proto_layout_msg_t, layout),
     .count_off = TIDE__NO_OFF,
     .sub = &tide__layout_schema},
    {.key = "prev",
     .kind = TIDE__K_STRUCT,
     .flags = TIDE__F_NULLABLE,
     .off = offsetof(tide_proto_layout_msg_t, prev),
     .count_off = TIDE__NO_OFF,
     .sub = &tide__layout_schema,
     .has_off = offsetof(tide_proto_layout_msg_t, has_prev)},
    F_INT(tide_proto_layout_msg_t, base, "base", 0, TIDE_PROTO_WORKERS_MAX - 1),
    F_INT(tide_proto_layout_msg_t, world, "world", 1, TIDE_PROTO_WORKERS_MAX),
    {.key = "join_old",
     .kind = TIDE__K_I32_ARRAY,
     .off = offsetof(tide_proto_layout_msg_t, join_old),
     .min = 0,
     .max = TIDE_PROTO_WORKERS_MAX - 1,
     .count_off = offsetof(tide_proto_layout_msg_t, n_join_old),
     .cmax = TIDE_PROTO_WORKERS_MAX},
    {.key = "join_new",
     .kind = TIDE__K_I32_ARRAY,
     .off = offsetof(tide_proto_layout_msg_t, join_new),
     .min = 0,
     .max = TIDE_PROTO_WORKERS_MAX - 1,
     .count_off = offsetof(tide_proto_layout_msg_t, n_join_new),
     .cmax = TIDE_PROTO_WORKERS_MAX},
    {.key = "stay",
     .kind = TIDE__K_I32_ARRAY,
     .off = offsetof(tide_proto_layout_msg_t, stay),
     .min = 0,
     .max = TIDE_PROTO_WORKERS_MAX - 1,
     .count_off = offsetof(tide_proto_layout_msg_t, n_stay),
     .cmax = TIDE_PROTO_WORKERS_MAX},
    {.key = "leave",
     .kind = TIDE__K_I32_ARRAY,
     .off = offsetof(tide_proto_layout_msg_t, leave),
     .min = 0,
     .max = TIDE_PROTO_WORKERS_MAX - 1,
     .count_off = offsetof(tide_proto_layout_msg_t, n_leave),
     .cmax = TIDE_PROTO_WORKERS_MAX},
    F_BOOL(tide_proto_layout_msg_t, recover, "recover"),
    F_TEXT(tide_proto_layout_msg_t, ckpt, "ckpt"),
    F_U64(tide_proto_layout_msg_t, ckpt_step, "ckpt_step"),
};

static const tide__field release_fields[] = {
    F_JOB(tide_proto_release_t, job),
    F_GEN(tide_proto_release_t, gen),
};

static const tide__field job_end_fields[] = {
    F_JOB(tide_proto_job_end_t, job),
    F_U64(tide_proto_job_end_t, step, "step"),
    F_TEXT(tide_proto_job_end_t, why, "why"),
};

static const tide__field join_port_fields[] = {
    F_WORKER(tide_proto_join_port_t, worker),
    F_JOB(tide_proto_join_port_t, job),
    F_GEN(tide_proto_join_port_t, gen),
    F_STR(tide_proto_join_port_t, port, "port", TIDE__CS_TEXT, 1),
};

static const tide__field prepare_fields[] = {
    F_JOB(tide_proto_prepare_t, job),
    F_GEN(tide_proto_prepare_t, gen),
    F_U64(tide_proto_prepare_t, step, "step"),
};

static const tide__field prepare_ack_fields[] = {
    F_WORKER(tide_proto_prepare_ack_t, worker),
    F_JOB(tide_proto_prepare_ack_t, job),
    F_GEN(tide_proto_prepare_ack_t, gen),
    F_U64(tide_proto_prepare_ack_t, step, "step"),
};

static const tide__field commit_fields[] = {
    F_JOB(tide_proto_commit_t, job),
    F_GEN(tide_proto_commit_t, gen),
    F_U64(tide_proto_commit_t, step, "step"),
    F_BOOL(tide_proto_commit_t, recover, "recover"),
};

static const tide__field halt_fields[] = {
    F_JOB(tide_proto_halt_t, job),
    F_GEN(tide_proto_halt_t, gen),
    F_INT(tide_proto_halt_t, code, "code", -1000, -1),
    F_TEXT(tide_proto_halt_t, reason, "reason"),
};

static const tide__field save_fields[] = {
    F_JOB(tide_proto_save_t, job),
    F_STR(tide_proto_save_t, dir, "dir", TIDE__CS_TEXT, 1),
    F_U64(tide_proto_save_t, step, "step"),
    F_INT_OPT(tide_proto_save_t, id, "id", 0, UINT64_MAX),
    F_INT_OPT(tide_proto_save_t, phase, "phase", TIDE_PROTO_SAVE_PROPOSE, TIDE_PROTO_SAVE_DROP),
};

static const tide__field save_ack_fields[] = {
    F_WORKER(tide_proto_save_ack_t, worker),
    F_JOB(tide_proto_save_ack_t, job),
    F_INT(tide_proto_save_ack_t, id, "id", 1, UINT64_MAX),
    F_U64(tide_proto_save_ack_t, step, "step"),
    F_U64(tide_proto_save_ack_t, done, "done"),
    F_BOOL(tide_proto_save_ack_t, member, "member"),
};

static tide_status check_saved(const void *base, tide__ctx *c)
{
    const tide_proto_saved_t *m = base;
    if (m->code == 0 && m->reason[0] != '\0')
        return tide__fail(c, "field 'reason' must be empty when field 'code' is 0");
    return TIDE_OK;
}

static const tide__field saved_fields[] = {
    F_WORKER(tide_proto_saved_t, worker),
    F_JOB(tide_proto_saved_t, job),
    F_U64(tide_proto_saved_t, step, "step"),
    F_STR(tide_proto_saved_t, dir, "dir", TIDE__CS_TEXT, 1),
    F_INT(tide_proto_saved_t, code, "code", -1000, 0),
    F_TEXT(tide_proto_saved_t, reason, "reason"),
};

static const tide__field abort_fields[] = {
    F_JOB(tide_proto_abort_t, job),
    F_GEN(tide_proto_abort_t, gen),
    F_TEXT(tide_proto_abort_t, reason, "reason"),
};

static const tide__field done_fields[] = {
    F_WORKER(tide_proto_done_t, worker),
    F_JOB(tide_proto_done_t, job),
    F_GEN(tide_proto_done_t, gen),
    F_INT(tide_proto_done_t, status, "status", -1000, 0),
    F_U64(tide_proto_done_t, bytes_moved, "bytes"),
    F_MS(tide_proto_done_t, ms, "ms"),
};

static const tide__field fenced_fields[] = {
    F_WORKER(tide_proto_fenced_t, worker),
    F_JOB_EMPTY(tide_proto_fenced_t, job),
    F_GEN(tide_proto_fenced_t, gen),
    F_TEXT(tide_proto_fenced_t, reason, "reason"),
};

/* Liveness ranks: 1..2^20 job ranks, strictly increasing (each asked once). */
static tide_status check_liveness_ranks(tide__ctx *c, const int32_t *r, uint32_t n)
{
    if (n == 0)
        return tide__fail(c, "field 'ranks' must name at least one job rank");
    for (uint32_t i = 1; i < n; i++)
        if (r[i] <= r[i - 1])
            return tide__fail(c,
                              "field 'ranks' must be strictly increasing (ranks[%u] = %d "
                              "after %d)",
                              i, r[i], r[i - 1]);
    return TIDE_OK;
}

static tide_status check_liveness(const void *base, tide__ctx *c)
{
    const tide_proto_liveness_t *m = base;
    return check_liveness_ranks(c, m->ranks, m->n_ranks);
}

static tide_status check_liveness_reply(const void *base, tide__ctx *c)
{
    const tide_proto_liveness_reply_t *m = base;
    TIDE_CHECK(check_liveness_ranks(c, m->ranks, m->n_ranks));
    if (m->n_alive != m->n_ranks)
        return tide__fail(c, "field 'alive' has %u entries where field 'ranks' has %u", m->n_alive,
                          m->n_ranks);
    return TIDE_OK;
}

#define RANKS_FIELD(T)                                                                             \
    {                                                                                              \
        .key = "ranks", .kind = TIDE__K_I32_ARRAY, .off = offsetof(T, ranks), .min = 0,            \
        .max = TIDE_PROTO_WORKERS_MAX - 1, .count_off = offsetof(T, n_ranks),                      \
        .cmax = TIDE_PROTO_WORKERS_MAX                                                             \
    }

static const tide__field liveness_fields[] = {
    F_WORKER(tide_proto_liveness_t, worker),
    F_JOB(tide_proto_liveness_t, job),
    RANKS_FIELD(tide_proto_liveness_t),
};

static const tide__field liveness_reply_fields[] = {
    F_JOB(tide_proto_liveness_reply_t, job),
    RANKS_FIELD(tide_proto_liveness_reply_t),
    {.key = "alive",
     .kind = TIDE__K_I32_ARRAY,
     .off = offsetof(tide_proto_liveness_reply_t, alive),
     .min = 0,
     .max = 1,
     .count_off = offsetof(tide_proto_liveness_reply_t, n_alive),
     .cmax = TIDE_PROTO_WORKERS_MAX},
};

static const tide__field failure_fields[] = {
    F_WORKER(tide_proto_failure_t, worker),
    F_JOB_EMPTY(tide_proto_failure_t, job),
    F_GEN(tide_proto_failure_t, gen),
    F_INT(tide_proto_failure_t, code, "code", -1000, 0),
    F_TEXT(tide_proto_failure_t, reason, "reason"),
};

static const tide__field leave_fields[] = {
    F_WORKER(tide_proto_leave_t, worker),
    F_TEXT(tide_proto_leave_t, reason, "reason"),
};

static tide_status check_offline_assign(const void *base, tide__ctx *c)
{
    const tide_proto_offline_assign_t *m = base;
    return tide__check_offline(c, m->kind, m->plugin, m->argc);
}

static const tide__field offline_assign_fields[] = {
    F_JOB(tide_proto_offline_assign_t, job),
    F_ENUM(tide_proto_offline_assign_t, kind, "kind", tide__job_kind_names),
    F_STR(tide_proto_offline_assign_t, plugin, "plugin", TIDE__CS_NAME, 0),
    ARGV_FIELD(tide_proto_offline_assign_t),
    F_INT(tide_proto_offline_assign_t, priority, "priority", -1000, 1000),
    F_U64(tide_proto_offline_assign_t, mem_cap, "mem_cap"),
    F_BOOL(tide_proto_offline_assign_t, bubbles, "bubbles"),
    F_INT(tide_proto_offline_assign_t, attempt, "attempt", 1, UINT32_MAX),
    F_INT(tide_proto_offline_assign_t, grace_ms, "grace_ms", 0, 600000),
    F_INT_OPT(tide_proto_offline_assign_t, max_memory, "max_memory", 0, UINT64_MAX),
    F_INT_OPT(tide_proto_offline_assign_t, max_procs, "max_procs", 0, TIDE_PROTO_PROCS_MAX),
};

static const tide__field preempt_fields[] = {
    F_JOB(tide_proto_preempt_t, job),
    F_INT(tide_proto_preempt_t, grace_ms, "grace_ms", 0, 600000),
};

static const tide__field offline_status_fields[] = {
    F_WORKER(tide_proto_offline_status_t, worker),
    F_JOB(tide_proto_offline_status_t, job),
    F_INT(tide_proto_offline_status_t, attempt, "attempt", 1, UINT32_MAX),
    F_ENUM(tide_proto_offline_status_t, state, "state", tide__job_state_names),
    F_INT(tide_proto_offline_status_t, exit_code, "exit_code", -255, 255),
    F_DBL(tide_proto_offline_status_t, progress, "progress", 0.0, 1.0),
    F_TEXT(tide_proto_offline_status_t, log, "log"),
    F_TEXT(tide_proto_offline_status_t, tail, "tail"),
};

static const tide__field bubble_fields[] = {
    F_WORKER(tide_proto_bubble_t, worker),
    F_JOB(tide_proto_bubble_t, job),
    F_GEN(tide_proto_bubble_t, gen),
    F_INT(tide_proto_bubble_t, steps, "steps", 1, UINT32_MAX),
    F_INT(tide_proto_bubble_t, windows, "windows", 0, UINT32_MAX),
    F_MS(tide_proto_bubble_t, total_ms, "total_ms"),
    F_MS(tide_proto_bubble_t, mean_ms, "mean_ms"),
    F_MS(tide_proto_bubble_t, max_ms, "max_ms"),
};

/* ---- the table: one line per type ------------------------------------------------------------ */

const tide__schema tide__worker_schemas[TIDE_MSG__COUNT] = {
    [TIDE_MSG_REGISTER] = SCHEMA(register_fields, tide_proto_register_t, 0, check_register),
    [TIDE_MSG_REGISTER_OK] =
        SCHEMA(register_ok_fields, tide_proto_register_ok_t, 0, check_register_ok),
    [TIDE_MSG_HEARTBEAT] = SCHEMA(heartbeat_fields, tide_proto_heartbeat_t, 0, NULL),
    [TIDE_MSG_HOST_HEARTBEAT] =
        SCHEMA(host_heartbeat_fields, tide_proto_host_heartbeat_t, 1, check_host_heartbeat),
    [TIDE_MSG_BYE] = SCHEMA(bye_fields, tide_proto_bye_t, 0, NULL),
    [TIDE_MSG_JOIN] = SCHEMA(join_fields, tide_proto_join_t, 1, check_join),
    [TIDE_MSG_LAYOUT] = SCHEMA(layout_msg_fields, tide_proto_layout_msg_t, 1, check_layout_msg),
    [TIDE_MSG_JOIN_PORT] = SCHEMA(join_port_fields, tide_proto_join_port_t, 0, NULL),
    [TIDE_MSG_JOB_END] = SCHEMA(job_end_fields, tide_proto_job_end_t, 0, NULL),
    [TIDE_MSG_RELEASE] = SCHEMA(release_fields, tide_proto_release_t, 0, NULL),
    [TIDE_MSG_PREPARE] = SCHEMA(prepare_fields, tide_proto_prepare_t, 0, NULL),
    [TIDE_MSG_PREPARE_ACK] = SCHEMA(prepare_ack_fields, tide_proto_prepare_ack_t, 0, NULL),
    [TIDE_MSG_COMMIT] = SCHEMA(commit_fields, tide_proto_commit_t, 0, NULL),
    [TIDE_MSG_ABORT] = SCHEMA(abort_fields, tide_proto_abort_t, 0, NULL),
    [TIDE_MSG_HALT] = SCHEMA(halt_fields, tide_proto_halt_t, 0, NULL),
    [TIDE_MSG_SAVE] = SCHEMA(save_fields, tide_proto_save_t, 0, NULL),
    [TIDE_MSG_SAVED] = SCHEMA(saved_fields, tide_proto_saved_t, 0, check_saved),
    [TIDE_MSG_SAVE_ACK] = SCHEMA(save_ack_fields, tide_proto_save_ack_t, 0, NULL),
    [TIDE_MSG_DONE] = SCHEMA(done_fields, tide_proto_done_t, 0, NULL),
    [TIDE_MSG_FENCED] = SCHEMA(fenced_fields, tide_proto_fenced_t, 0, NULL),
    [TIDE_MSG_LIVENESS] = SCHEMA(liveness_fields, tide_proto_liveness_t, 1, check_liveness),
    [TIDE_MSG_LIVENESS_REPLY] =
        SCHEMA(liveness_reply_fields, tide_proto_liveness_reply_t, 1, check_liveness_reply),
    [TIDE_MSG_FAILURE] = SCHEMA(failure_fields, tide_proto_failure_t, 0, NULL),
    [TIDE_MSG_LEAVE] = SCHEMA(leave_fields, tide_proto_leave_t, 0, NULL),
    [TIDE_MSG_OFFLINE_ASSIGN] =
        SCHEMA(offline_assign_fields, tide_proto_offline_assign_t, 1, check_offline_assign),
    [TIDE_MSG_PREEMPT] = SCHEMA(preempt_fields, tide_proto_preempt_t, 0, NULL),
    [TIDE_MSG_OFFLINE_STATUS] = SCHEMA(offline_status_fields, tide_proto_offline_status_t, 0, NULL),
    [TIDE_MSG_BUBBLE] = SCHEMA(bubble_fields, tide_proto_bubble_t, 0, NULL),
};
