/*
 * proto: the message catalogue (schemas), names, validation, encoding and the
 * byte buffer. Encoding walks the schema tables and packs with msgpack-c's
 * packer into a tide_proto_buf_t grown with tide_realloc (so allocation
 * failures are injectable). Workload: one small message per heartbeat on each
 * worker, ~10^4 encodes/s of replies at most in tided.
 */
#include <ctype.h>
#include <math.h>
#include <msgpack.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "proto/proto_int.h"

_Static_assert(sizeof(int) == 4, "proto stores int fields as 4 bytes");
_Static_assert(sizeof(tide_proto_job_state_t) == sizeof(int), "enums are stored as int");

/* ---- enum names -------------------------------------------------------------------------- */

static const char *const device_kind_names[] = {"cpu", "gpu"};
static const char *const worker_state_names[] = {"idle",   "online",   "offline",
                                                 "failed", "draining", "left"};
static const char *const job_kind_names[] = {"online", "command", "plugin"};
static const char *const job_state_names[] = {"queued",     "running",   "resizing",
                                              "recovering", "preempted", "done",
                                              "failed",     "cancelled", "stalled"};
static const char *const placement_names[] = {"default", "optimal"};
const char *const tide__degree_names[4] = {"dp", "tp", "pp", "dp_micro"}; /* tide_degree */

static const char *enum_name(const char *const *names, int n, int v)
{
    return (v >= 0 && v < n) ? names[v] : "?";
}

const char *tide_proto_device_kind_name(tide_proto_device_kind_t v)
{
    return enum_name(device_kind_names, NELEM(device_kind_names), (int)v);
}

const char *tide_proto_worker_state_name(tide_proto_worker_state_t v)
{
    return enum_name(worker_state_names, NELEM(worker_state_names), (int)v);
}

const char *tide_proto_job_kind_name(tide_proto_job_kind_t v)
{
    return enum_name(job_kind_names, NELEM(job_kind_names), (int)v);
}

const char *tide_proto_job_state_name(tide_proto_job_state_t v)
{
    return enum_name(job_state_names, NELEM(job_state_names), (int)v);
}

const char *tide_proto_placement_name(tide_proto_placement_t v)
{
    return enum_name(placement_names, NELEM(placement_names), (int)v);
}

tide_status tide_proto_placement_parse(const char *s, tide_proto_placement_t *out)
{
    for (int i = 0; s && i < NELEM(placement_names); i++) {
        if (strcmp(s, placement_names[i]) == 0) {
            *out = (tide_proto_placement_t)i;
            return TIDE_OK;
        }
    }
    return tide_errorf(TIDE_ERR_NOT_FOUND, "placement '%s' is not one of: default, optimal",
                       s ? s : "(null)");
}

/* ---- cross-field rules ---------------------------------------------------------------------- */

static tide_status check_degrees(tide__ctx *c, int dp, int tp, int pp)
{
    uint64_t n = (uint64_t)dp * (uint64_t)tp * (uint64_t)pp;
    if (n > TIDE_PROTO_WORKERS_MAX)
        return tide__fail(c, "%sdp*tp*pp = %d*%d*%d = %llu exceeds %u workers", c->path, dp, tp, pp,
                          (unsigned long long)n, TIDE_PROTO_WORKERS_MAX);
    return TIDE_OK;
}

/* Stage boundaries: starts[0] = 0 and strictly increasing (each stage >= 1 layer). */
static tide_status check_stages(tide__ctx *c, const int *s, uint32_t n)
{
    char fn[160];
    if (n == 0)
        return TIDE_OK;
    if (s == NULL)
        return tide__fail(c, "%s is NULL but needs %u entries",
                          tide__field_name(c, "stages", fn, sizeof fn), n);
    if (s[0] != 0)
        return tide__fail(c, "%s must start at layer 0, got %d",
                          tide__field_name(c, "stages", fn, sizeof fn), s[0]);
    for (uint32_t i = 1; i < n; i++)
        if (s[i] <= s[i - 1])
            return tide__fail(c,
                              "%s must be strictly increasing: stage %u has no layers (%d then %d)",
                              tide__field_name(c, "stages", fn, sizeof fn), i - 1, s[i - 1], s[i]);
    return TIDE_OK;
}

static tide_status expect_stages(const void *base, tide__ctx *c, uint32_t *n)
{
    const tide_proto_layout_t *l = base;
    *n = (uint32_t)l->pp + 1;
    return TIDE_OK;
}

static tide_status expect_workers(const void *base, tide__ctx *c, uint32_t *n)
{
    const tide_proto_layout_t *l = base;
    TIDE_CHECK(check_degrees(c, l->dp, l->tp, l->pp));
    *n = (uint32_t)l->dp * (uint32_t)l->tp * (uint32_t)l->pp;
    return TIDE_OK;
}

static tide_status check_layout(const void *base, tide__ctx *c)
{
    const tide_proto_layout_t *l = base;
    char fn[160];
    TIDE_CHECK(check_degrees(c, l->dp, l->tp, l->pp));
    if (l->num_layers < l->pp)
        return tide__fail(c, "%s = %d is fewer than pp = %d stages",
                          tide__field_name(c, "layers", fn, sizeof fn), l->num_layers, l->pp);
    TIDE_CHECK(check_stages(c, l->stage_start, (uint32_t)l->pp + 1));
    if (l->stage_start[l->pp] != l->num_layers)
        return tide__fail(c, "%s must end at layers = %d, got %d",
                          tide__field_name(c, "stages", fn, sizeof fn), l->num_layers,
                          l->stage_start[l->pp]);
    return TIDE_OK;
}

static const tide__field layout_fields[] = {
    F_GEN(tide_proto_layout_t, gen),
    F_DEGREE(tide_proto_layout_t, dp, "dp"),
    F_DEGREE(tide_proto_layout_t, tp, "tp"),
    F_DEGREE(tide_proto_layout_t, pp, "pp"),
    F_INT(tide_proto_layout_t, num_layers, "layers", 1, TIDE_PROTO_LAYERS_MAX),
    F_INT(tide_proto_layout_t, micro_batches, "micro", 1, TIDE_PROTO_MICRO_MAX),
    {.key = "stages",
     .kind = TIDE__K_I32_ARRAY,
     .off = offsetof(tide_proto_layout_t, stage_start),
     .min = 0,
     .max = TIDE_PROTO_LAYERS_MAX,
     .count_off = TIDE__NO_OFF,
     .expect = expect_stages},
    {.key = "workers",
     .kind = TIDE__K_I32_ARRAY,
     .off = offsetof(tide_proto_layout_t, worker),
     .min = 0,
     .max = INT32_MAX,
     .count_off = TIDE__NO_OFF,
     .expect = expect_workers},
};
const tide__schema tide__layout_schema = {layout_fields, NELEM(layout_fields),
                                          sizeof(tide_proto_layout_t), 1, check_layout};

static tide_status check_tensor(const void *base, tide__ctx *c)
{
    const tide_proto_tensor_t *t = base;
    char fn[160];
    if (t->tp_dim >= t->ndim)
        return tide__fail(c, "%s = %d must be below the tensor's %d dimensions",
                          tide__field_name(c, "tp_dim", fn, sizeof fn), t->tp_dim, t->ndim);
    return TIDE_OK;
}

static const tide__field tensor_fields[] = {
    /* a collection's own rules (reshard's tide_collection_add): any name, any segment count
       that divides the split dimension; the checkpoint manifest holds any collection */
    F_STR(tide_proto_tensor_t, name, "name", TIDE__CS_TEXT, 1),
    F_INT(tide_proto_tensor_t, dtype, "dtype", 0, 6),
    {.key = "shape",
     .kind = TIDE__K_I64_FIXED,
     .off = offsetof(tide_proto_tensor_t, shape),
     .size = TIDE_PROTO_DIMS_MAX,
     .min = 1,
     .max = INT64_MAX,
     .count_off = offsetof(tide_proto_tensor_t, ndim),
     .cmin = 1,
     .cmax = TIDE_PROTO_DIMS_MAX},
    F_INT(tide_proto_tensor_t, layer, "layer", -3, TIDE_PROTO_LAYERS_MAX - 1),
    F_INT(tide_proto_tensor_t, tp, "tp", 0, 1),
    F_INT(tide_proto_tensor_t, tp_dim, "tp_dim", 0, TIDE_PROTO_DIMS_MAX - 1),
    F_INT(tide_proto_tensor_t, tp_segments, "seg", 1, INT32_MAX),
    F_INT(tide_proto_tensor_t, dp, "dp", 0, 1),
};
const tide__schema tide__tensor_schema = {tensor_fields, NELEM(tensor_fields),
                                          sizeof(tide_proto_tensor_t), 0, check_tensor};

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

/* ---- worker <-> tided schemas ------------------------------------------------------------------
 */

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
    F_ENUM(tide_proto_register_t, kind, "kind", device_kind_names),
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

static const tide__field fit_fields[] = {
    F_ENUM(tide_proto_fit_t, degree, "degree", tide__degree_names),
    F_INT(tide_proto_fit_t, n, "n", 1, TIDE_PROTO_FIT_N_MAX),
    F_STR(tide_proto_fit_t, what, "what", TIDE__CS_LINE, 0),
};
const tide__schema tide__fit_schema = {fit_fields, NELEM(fit_fields), sizeof(tide_proto_fit_t), 0,
                                       NULL};

static tide_status check_join(const void *base, tide__ctx *c)
{
    const tide_proto_join_t *m = base;
    TIDE_CHECK(check_degrees(c, m->dp, m->tp, m->pp));
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

/* Offline work: command jobs carry argv and no plugin; plugin jobs carry a plugin name. */
static tide_status check_offline(tide__ctx *c, tide_proto_job_kind_t kind, const char *plugin,
                                 uint32_t argc)
{
    if (kind == TIDE_JOB_ONLINE)
        return tide__fail(c, "field 'kind' must be \"command\" or \"plugin\", got \"online\"");
    if (kind == TIDE_JOB_COMMAND && argc == 0)
        return tide__fail(c, "field 'argv' must hold the command to run (at least 1 entry)");
    if (kind == TIDE_JOB_COMMAND && plugin[0] != '\0')
        return tide__fail(c, "field 'plugin' must be \"\" for a command job");
    if (kind == TIDE_JOB_PLUGIN && plugin[0] == '\0')
        return tide__fail(c, "field 'plugin' must name the task plugin of a plugin job");
    return TIDE_OK;
}

static tide_status check_offline_assign(const void *base, tide__ctx *c)
{
    const tide_proto_offline_assign_t *m = base;
    return check_offline(c, m->kind, m->plugin, m->argc);
}

static const tide__field offline_assign_fields[] = {
    F_JOB(tide_proto_offline_assign_t, job),
    F_ENUM(tide_proto_offline_assign_t, kind, "kind", job_kind_names),
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
    F_ENUM(tide_proto_offline_status_t, state, "state", job_state_names),
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

/* ---- tidectl <-> tided schemas -----------------------------------------------------------------
 */

static const tide__field gpu_row_fields[] = {
    F_WORKER(tide_proto_gpu_row_t, worker),
    F_STR(tide_proto_gpu_row_t, host, "host", TIDE__CS_HOST, 1),
    F_INT(tide_proto_gpu_row_t, pid, "pid", 0, INT32_MAX),
    F_STR(tide_proto_gpu_row_t, pool, "pool", TIDE__CS_NAME, 0),
    F_INT(tide_proto_gpu_row_t, pool_rank, "pool_rank", 0, TIDE_PROTO_WORKERS_MAX - 1),
    F_INT(tide_proto_gpu_row_t, device, "device", 0, TIDE_PROTO_DEVICE_MAX),
    F_ENUM(tide_proto_gpu_row_t, kind, "kind", device_kind_names),
    F_ENUM(tide_proto_gpu_row_t, state, "state", worker_state_names),
    F_U64(tide_proto_gpu_row_t, mem_bytes, "mem"),
    F_JOB_EMPTY(tide_proto_gpu_row_t, job),
    F_INT(tide_proto_gpu_row_t, stage, "stage", -1, TIDE_PROTO_DEGREE_MAX - 1),
    F_INT(tide_proto_gpu_row_t, dp_rank, "dp_rank", -1, TIDE_PROTO_DEGREE_MAX - 1),
    F_INT(tide_proto_gpu_row_t, tp_rank, "tp_rank", -1, TIDE_PROTO_DEGREE_MAX - 1),
    F_U64(tide_proto_gpu_row_t, step, "step"),
    F_DBL(tide_proto_gpu_row_t, bubble_pct, "bubble_pct", 0.0, 100.0),
    F_STR(tide_proto_gpu_row_t, offline, "offline", TIDE__CS_NAME, 0),
    F_INT(tide_proto_gpu_row_t, last_seen_ms, "last_seen_ms", 0, INT64_MAX),
    F_STR(tide_proto_gpu_row_t, alloc, "alloc", TIDE__CS_LINE, 0),
};
static const tide__schema gpu_row_schema = {gpu_row_fields, NELEM(gpu_row_fields),
                                            sizeof(tide_proto_gpu_row_t), 0, NULL};

static const tide__field status_fields[] = {
    F_INT(tide_proto_status_t, from, "from", 0, INT32_MAX),
    F_INT(tide_proto_status_t, limit, "limit", 0, TIDE_PROTO_ROWS_MAX),
    F_BOOL(tide_proto_status_t, all, "all"),
    F_JOB_EMPTY(tide_proto_status_t, job),
};

/* A page says where the next one starts and never holds more than the listing: a client
   following `next` always makes progress and knows when it has everything. */
static tide_status check_status_reply(const void *base, tide__ctx *c)
{
    const tide_proto_status_reply_t *m = base;
    if (m->n_rows > m->total)
        return tide__fail(c, "field 'rows' has %u entries, more than field 'total' = %u", m->n_rows,
                          m->total);
    if (m->next >= 0 && m->n_rows == 0)
        return tide__fail(c, "field 'next' = %d announces another page after an empty one",
                          m->next);
    for (uint32_t i = 0; i < m->n_rows; i++) {
        if (i > 0 && m->rows[i].worker <= m->rows[i - 1].worker)
            return tide__fail(c,
                              "field 'rows' must be in increasing worker order (rows[%u]."
                              "worker = %d after %d)",
                              i, m->rows[i].worker, m->rows[i - 1].worker);
        if (m->next >= 0 && m->rows[i].worker >= m->next)
            return tide__fail(c,
                              "field 'next' = %d must be above every row's worker (rows[%u]."
                              "worker = %d)",
                              m->next, i, m->rows[i].worker);
    }
    return TIDE_OK;
}

static const tide__field status_reply_fields[] = {
    F_INT(tide_proto_status_reply_t, time_ms, "time_ms", 0, INT64_MAX),
    F_TEXT(tide_proto_status_reply_t, ompi_server, "ompi_server"),
    {.key = "rows",
     .kind = TIDE__K_STRUCT_ARRAY,
     .off = offsetof(tide_proto_status_reply_t, rows),
     .count_off = offsetof(tide_proto_status_reply_t, n_rows),
     .cmax = TIDE_PROTO_ROWS_MAX,
     .sub = &gpu_row_schema},
    F_INT(tide_proto_status_reply_t, total, "total", 0, INT32_MAX),
    F_INT(tide_proto_status_reply_t, next, "next", -1, INT32_MAX),
    F_MS_OPT(tide_proto_status_reply_t, state_degraded_ms, "state_degraded_ms"),
};

static const tide__field job_row_fields[] = {
    F_STR(tide_proto_job_row_t, name, "name", TIDE__CS_NAME, 1),
    F_ENUM(tide_proto_job_row_t, kind, "kind", job_kind_names),
    F_ENUM(tide_proto_job_row_t, state, "state", job_state_names),
    F_GEN(tide_proto_job_row_t, gen),
    F_INT(tide_proto_job_row_t, dp, "dp", 0, TIDE_PROTO_DEGREE_MAX),
    F_INT(tide_proto_job_row_t, tp, "tp", 0, TIDE_PROTO_DEGREE_MAX),
    F_INT(tide_proto_job_row_t, pp, "pp", 0, TIDE_PROTO_DEGREE_MAX),
    F_INT(tide_proto_job_row_t, workers, "workers", 0, TIDE_PROTO_WORKERS_MAX),
    F_U64(tide_proto_job_row_t, step, "step"),
    F_DBL(tide_proto_job_row_t, throughput, "throughput", 0.0, 1e12),
    F_INT(tide_proto_job_row_t, priority, "priority", -1000, 1000),
    F_INT(tide_proto_job_row_t, attempts, "attempts", 0, UINT32_MAX),
    F_STR(tide_proto_job_row_t, allocs, "allocs", TIDE__CS_LINE, 0),
    F_INT_OPT(tide_proto_job_row_t, min_gpus, "min", 0, 1 << 20),
    F_INT_OPT(tide_proto_job_row_t, max_gpus, "max", 0, 1 << 20),
    F_INT_OPT(tide_proto_job_row_t, hold, "hold", 0, 2),
};
static const tide__schema job_row_schema = {job_row_fields, NELEM(job_row_fields),
                                            sizeof(tide_proto_job_row_t), 0, NULL};

static const tide__field jobs_reply_fields[] = {
    {.key = "rows",
     .kind = TIDE__K_STRUCT_ARRAY,
     .off = offsetof(tide_proto_jobs_reply_t, rows),
     .count_off = offsetof(tide_proto_jobs_reply_t, n_rows),
     .cmax = TIDE_PROTO_ROWS_MAX,
     .sub = &job_row_schema},
};

static tide_status check_resize(const void *base, tide__ctx *c)
{
    const tide_proto_resize_t *m = base;
    TIDE_CHECK(check_degrees(c, m->dp, m->tp, m->pp));
    if (m->n_stages != 0 && m->n_stages != (uint32_t)m->pp + 1)
        return tide__fail(c, "field 'stages' must be empty or hold pp + 1 = %d boundaries, got %u",
                          m->pp + 1, m->n_stages);
    return check_stages(c, m->stage_start, m->n_stages);
}

static const tide__field resize_fields[] = {
    F_JOB(tide_proto_resize_t, job),
    F_DEGREE(tide_proto_resize_t, dp, "dp"),
    F_DEGREE(tide_proto_resize_t, tp, "tp"),
    F_DEGREE(tide_proto_resize_t, pp, "pp"),
    {.key = "stages",
     .kind = TIDE__K_I32_ARRAY,
     .off = offsetof(tide_proto_resize_t, stage_start),
     .min = 0,
     .max = TIDE_PROTO_LAYERS_MAX,
     .count_off = offsetof(tide_proto_resize_t, n_stages),
     .cmax = TIDE_PROTO_DEGREE_MAX + 1},
    F_BOOL(tide_proto_resize_t, dry_run, "dry_run"),
    F_ENUM(tide_proto_resize_t, placement, "placement", placement_names),
    F_BOOL(tide_proto_resize_t, tp_across_hosts, "tp_across_hosts"),
    F_INT(tide_proto_resize_t, micro_batches, "micro", 0, TIDE_PROTO_MICRO_MAX),
};

static const tide__field resize_reply_fields[] = {
    F_JOB(tide_proto_resize_reply_t, job),
    F_BOOL(tide_proto_resize_reply_t, dry_run, "dry_run"),
    {.key = "layout",
     .kind = TIDE__K_STRUCT,
     .off = offsetof(tide_proto_resize_reply_t, layout),
     .count_off = TIDE__NO_OFF,
     .sub = &tide__layout_schema},
    F_U64(tide_proto_resize_reply_t, bytes_sent, "bytes_sent"),
    F_U64(tide_proto_resize_reply_t, bytes_local, "bytes_local"),
    F_U64(tide_proto_resize_reply_t, max_send, "max_send"),
    F_U64(tide_proto_resize_reply_t, messages, "messages"),
    F_MS(tide_proto_resize_reply_t, est_ms, "est_ms"),
    F_INT(tide_proto_resize_reply_t, preempted, "preempted", 0, UINT32_MAX),
    F_U64(tide_proto_resize_reply_t, bytes_default, "bytes_default"),
    F_U64(tide_proto_resize_reply_t, cross_host, "cross_host"),
    F_U64(tide_proto_resize_reply_t, cross_host_default, "cross_host_default"),
};

static tide_status check_submit(const void *base, tide__ctx *c)
{
    const tide_proto_submit_t *m = base;
    return check_offline(c, m->kind, m->plugin, m->argc);
}

static const tide__field submit_fields[] = {
    F_STR(tide_proto_submit_t, name, "name", TIDE__CS_NAME, 1),
    F_ENUM(tide_proto_submit_t, kind, "kind", job_kind_names),
    F_STR(tide_proto_submit_t, plugin, "plugin", TIDE__CS_NAME, 0),
    ARGV_FIELD(tide_proto_submit_t),
    F_INT(tide_proto_submit_t, priority, "priority", -1000, 1000),
    F_U64(tide_proto_submit_t, mem_cap, "mem_cap"),
    F_BOOL(tide_proto_submit_t, bubbles, "bubbles"),
    F_INT_OPT(tide_proto_submit_t, max_memory, "max_memory", 0, UINT64_MAX),
    F_INT_OPT(tide_proto_submit_t, max_procs, "max_procs", 0, TIDE_PROTO_PROCS_MAX),
};

static const tide__field cancel_fields[] = {F_JOB(tide_proto_cancel_t, job)};
static const tide__field drain_fields[] = {F_WORKER(tide_proto_drain_t, worker)};

static tide_status check_elastic(const void *base, tide__ctx *c)
{
    const tide_proto_elastic_t *m = base;
    if ((m->min_gpus == 0) != (m->max_gpus == 0))
        return tide__fail(c, "fields 'min' and 'max' are both 0 (unchanged) or both set");
    return TIDE_OK;
}

static const tide__field elastic_fields[] = {
    F_JOB(tide_proto_elastic_t, job),
    F_INT(tide_proto_elastic_t, min_gpus, "min", 0, 1 << 20),
    F_INT(tide_proto_elastic_t, max_gpus, "max", 0, 1 << 20),
    F_INT(tide_proto_elastic_t, priority, "priority", -1, 100),
    F_INT(tide_proto_elastic_t, pin, "pin", -1, 1),
    F_INT(tide_proto_elastic_t, steps, "steps", -1, INT64_MAX),
};

static const tide__field grow_fields[] = {
    F_JOB(tide_proto_grow_t, job),
    F_INT(tide_proto_grow_t, nodes, "nodes", 1, 4096),
};

static tide_status check_checkpoint(const void *base, tide__ctx *c)
{
    const tide_proto_checkpoint_t *m = base;
    if (m->dir[0] != '\0' && m->dir[0] != '/')
        return tide__fail(c, "field 'dir' must be an absolute path (or empty: the job's root)");
    return TIDE_OK;
}

static const tide__field checkpoint_fields[] = {
    F_JOB(tide_proto_checkpoint_t, job),
    F_TEXT(tide_proto_checkpoint_t, dir, "dir"),
};

/* A kind filter is a kind name that may hold the glob characters '*' and '?'. */
static tide_status check_events(const void *base, tide__ctx *c)
{
    const tide_proto_events_t *m = base;
    for (const char *k = m->kind; *k; k++)
        if (!(isalnum((unsigned char)*k) || strchr("._:-*?", *k) != NULL))
            return tide__fail(c,
                              "field 'kind' may hold only [A-Za-z0-9._:-] and the globs "
                              "'*' and '?', got '%c'",
                              *k);
    if (m->until_ms != 0 && m->until_ms <= m->since_ms)
        return tide__fail(c, "field 'until_ms' = %lld must be after 'since_ms' = %lld (or 0)",
                          (long long)m->until_ms, (long long)m->since_ms);
    return TIDE_OK;
}

static const tide__field events_fields[] = {
    F_U64(tide_proto_events_t, since_id, "since_id"),
    F_INT(tide_proto_events_t, since_ms, "since_ms", 0, INT64_MAX),
    F_INT(tide_proto_events_t, until_ms, "until_ms", 0, INT64_MAX),
    F_INT(tide_proto_events_t, limit, "limit", 1, TIDE_PROTO_EVENTS_MAX),
    F_JOB_EMPTY(tide_proto_events_t, job),
    F_STR(tide_proto_events_t, kind, "kind", TIDE__CS_HOST, 0),
    F_BOOL(tide_proto_events_t, newest, "newest"),
};

static tide_status check_event_fields(const void *base, tide__ctx *c)
{
    const tide_proto_event_fields_t *m = base;
    if ((m->dp == 0) != (m->tp == 0) || (m->dp == 0) != (m->pp == 0))
        return tide__fail(c, "fields '%sdp', 'tp' and 'pp' must all be 0 or all be set", c->path);
    if ((m->from_dp == 0) != (m->from_tp == 0) || (m->from_dp == 0) != (m->from_pp == 0))
        return tide__fail(c,
                          "fields '%sfrom_dp', 'from_tp' and 'from_pp' must all be 0 or all "
                          "be set",
                          c->path);
    return TIDE_OK;
}

static const tide__field event_fields_fields[] = {
    F_U64(tide_proto_event_fields_t, gen, "gen"),
    F_INT(tide_proto_event_fields_t, dp, "dp", 0, TIDE_PROTO_DEGREE_MAX),
    F_INT(tide_proto_event_fields_t, tp, "tp", 0, TIDE_PROTO_DEGREE_MAX),
    F_INT(tide_proto_event_fields_t, pp, "pp", 0, TIDE_PROTO_DEGREE_MAX),
    F_INT(tide_proto_event_fields_t, from_dp, "from_dp", 0, TIDE_PROTO_DEGREE_MAX),
    F_INT(tide_proto_event_fields_t, from_tp, "from_tp", 0, TIDE_PROTO_DEGREE_MAX),
    F_INT(tide_proto_event_fields_t, from_pp, "from_pp", 0, TIDE_PROTO_DEGREE_MAX),
    {.key = "workers",
     .kind = TIDE__K_I32_ARRAY,
     .off = offsetof(tide_proto_event_fields_t, workers),
     .min = 0,
     .max = INT32_MAX,
     .count_off = offsetof(tide_proto_event_fields_t, n_workers),
     .cmax = TIDE_PROTO_WORKERS_MAX},
    F_STR(tide_proto_event_fields_t, host, "host", TIDE__CS_HOST, 0),
    F_INT(tide_proto_event_fields_t, step, "step", -1, INT64_MAX),
    F_INT(tide_proto_event_fields_t, steps_lost, "steps_lost", 0, INT64_MAX),
    F_U64(tide_proto_event_fields_t, bytes, "bytes"),
    F_MS(tide_proto_event_fields_t, ms, "ms"),
    F_BOOL(tide_proto_event_fields_t, bubbles, "bubbles"),
    F_STR(tide_proto_event_fields_t, reason, "reason", TIDE__CS_LINE, 0),
    F_MS_OPT(tide_proto_event_fields_t, downtime_ms, "downtime_ms"),
};
const tide__schema tide__event_fields_schema = {event_fields_fields, NELEM(event_fields_fields),
                                                sizeof(tide_proto_event_fields_t), 1,
                                                check_event_fields};

static const tide__field event_row_fields[] = {
    F_U64(tide_proto_event_row_t, id, "id"),
    F_INT(tide_proto_event_row_t, time_ms, "time_ms", 0, INT64_MAX),
    F_JOB_EMPTY(tide_proto_event_row_t, job),
    F_STR(tide_proto_event_row_t, kind, "kind", TIDE__CS_NAME, 1),
    F_TEXT(tide_proto_event_row_t, detail, "detail"),
    {.key = "fields",
     .kind = TIDE__K_STRUCT,
     .off = offsetof(tide_proto_event_row_t, fields),
     .count_off = TIDE__NO_OFF,
     .sub = &tide__event_fields_schema},
};
static const tide__schema event_row_schema = {event_row_fields, NELEM(event_row_fields),
                                              sizeof(tide_proto_event_row_t), 1, NULL};

static const tide__field events_reply_fields[] = {
    {.key = "rows",
     .kind = TIDE__K_STRUCT_ARRAY,
     .off = offsetof(tide_proto_events_reply_t, rows),
     .count_off = offsetof(tide_proto_events_reply_t, n_rows),
     .cmax = TIDE_PROTO_EVENTS_MAX,
     .sub = &event_row_schema},
};

static const tide__field logs_fields[] = {
    F_JOB(tide_proto_logs_t, job),
    F_INT(tide_proto_logs_t, attempt, "attempt", 0, UINT32_MAX),
};

static const tide__field attempt_row_fields[] = {
    F_INT(tide_proto_attempt_row_t, attempt, "attempt", 1, UINT32_MAX),
    F_WORKER(tide_proto_attempt_row_t, worker),
    F_STR(tide_proto_attempt_row_t, host, "host", TIDE__CS_HOST, 0),
    F_TEXT(tide_proto_attempt_row_t, log, "log"),
    F_ENUM(tide_proto_attempt_row_t, state, "state", job_state_names),
    F_INT(tide_proto_attempt_row_t, exit_code, "exit_code", -255, 255),
    F_INT(tide_proto_attempt_row_t, time_ms, "time_ms", 0, INT64_MAX),
    F_TEXT(tide_proto_attempt_row_t, tail, "tail"),
};
static const tide__schema attempt_row_schema = {attempt_row_fields, NELEM(attempt_row_fields),
                                                sizeof(tide_proto_attempt_row_t), 0, NULL};

static const tide__field logs_reply_fields[] = {
    F_JOB(tide_proto_logs_reply_t, job),
    {.key = "rows",
     .kind = TIDE__K_STRUCT_ARRAY,
     .off = offsetof(tide_proto_logs_reply_t, rows),
     .count_off = offsetof(tide_proto_logs_reply_t, n_rows),
     .cmax = TIDE_PROTO_ATTEMPTS_MAX,
     .sub = &attempt_row_schema},
};

static const tide__field ok_fields[] = {
    F_JOB_EMPTY(tide_proto_ok_t, job),
    F_TEXT(tide_proto_ok_t, message, "message"),
    F_INT_OPT(tide_proto_ok_t, gen, "gen", 0, UINT64_MAX),
};

static const tide__field error_fields[] = {
    F_INT(tide_proto_error_t, code, "code", -1000, -1),
    F_TEXT(tide_proto_error_t, message, "message"),
};

/* ---- the catalogue ----------------------------------------------------------------------------
 */

static const tide__schema msg_schemas[TIDE_MSG__COUNT] = {
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
    [TIDE_MSG_STATUS] = SCHEMA(status_fields, tide_proto_status_t, 0, NULL),
    [TIDE_MSG_STATUS_REPLY] =
        SCHEMA(status_reply_fields, tide_proto_status_reply_t, 1, check_status_reply),
    [TIDE_MSG_JOBS] = {NULL, 0, sizeof(tide_proto_empty_t), 0, NULL},
    [TIDE_MSG_JOBS_REPLY] = SCHEMA(jobs_reply_fields, tide_proto_jobs_reply_t, 1, NULL),
    [TIDE_MSG_RESIZE] = SCHEMA(resize_fields, tide_proto_resize_t, 1, check_resize),
    [TIDE_MSG_RESIZE_REPLY] = SCHEMA(resize_reply_fields, tide_proto_resize_reply_t, 1, NULL),
    [TIDE_MSG_SUBMIT] = SCHEMA(submit_fields, tide_proto_submit_t, 1, check_submit),
    [TIDE_MSG_CANCEL] = SCHEMA(cancel_fields, tide_proto_cancel_t, 0, NULL),
    [TIDE_MSG_DRAIN] = SCHEMA(drain_fields, tide_proto_drain_t, 0, NULL),
    [TIDE_MSG_ELASTIC] = SCHEMA(elastic_fields, tide_proto_elastic_t, 0, check_elastic),
    [TIDE_MSG_GROW] = SCHEMA(grow_fields, tide_proto_grow_t, 0, NULL),
    [TIDE_MSG_CHECKPOINT] = SCHEMA(checkpoint_fields, tide_proto_checkpoint_t, 0, check_checkpoint),
    [TIDE_MSG_EVENTS] = SCHEMA(events_fields, tide_proto_events_t, 0, check_events),
    [TIDE_MSG_EVENTS_REPLY] = SCHEMA(events_reply_fields, tide_proto_events_reply_t, 1, NULL),
    [TIDE_MSG_LOGS] = SCHEMA(logs_fields, tide_proto_logs_t, 0, NULL),
    [TIDE_MSG_LOGS_REPLY] = SCHEMA(logs_reply_fields, tide_proto_logs_reply_t, 1, NULL),
    [TIDE_MSG_OK] = SCHEMA(ok_fields, tide_proto_ok_t, 0, NULL),
    [TIDE_MSG_ERROR] = SCHEMA(error_fields, tide_proto_error_t, 0, NULL),
};

const tide__schema *tide__msg_schema(tide_msg_type_t type)
{
    if ((int)type <= (int)TIDE_MSG_NONE || (int)type >= (int)TIDE_MSG__COUNT)
        return NULL;
    if (msg_schemas[type].size == 0)
        return tide__record_schema(type);
    return &msg_schemas[type];
}

static const char *const msg_names[TIDE_MSG__COUNT] = {[TIDE_MSG_NONE] = "none",
#define TIDE__MSG_NAME(e, name, member) [TIDE_MSG_##e] = name,
                                                       TIDE_MSG_TYPE_MAP(TIDE__MSG_NAME)
#undef TIDE__MSG_NAME
};

const char *tide_msg_type_name(tide_msg_type_t type)
{
    if ((int)type < 0 || (int)type >= (int)TIDE_MSG__COUNT)
        return "?";
    return msg_names[type];
}

tide_status tide_msg_type_parse(const char *name, tide_msg_type_t *out)
{
    for (int t = TIDE_MSG_NONE + 1; name && t < TIDE_MSG__COUNT; t++) {
        if (strcmp(name, msg_names[t]) == 0) {
            *out = (tide_msg_type_t)t;
            return TIDE_OK;
        }
    }
    return tide_errorf(TIDE_ERR_NOT_FOUND, "unknown message type '%s'", name ? name : "(null)");
}

tide_msg_role_t tide_msg_type_role(tide_msg_type_t type)
{
    switch (type) {
    case TIDE_MSG_REGISTER:
    case TIDE_MSG_HEARTBEAT:
    case TIDE_MSG_HOST_HEARTBEAT:
    case TIDE_MSG_BYE:
    case TIDE_MSG_JOIN:
    case TIDE_MSG_JOIN_PORT:
    case TIDE_MSG_PREPARE_ACK:
    case TIDE_MSG_DONE:
    case TIDE_MSG_SAVED:
    case TIDE_MSG_SAVE_ACK:
    case TIDE_MSG_FAILURE:
    case TIDE_MSG_LEAVE:
    case TIDE_MSG_OFFLINE_STATUS:
    case TIDE_MSG_BUBBLE:
    case TIDE_MSG_LIVENESS: /* a switch's exact question about its own job's ranks */
        return TIDE_ROLE_WORKER;
    case TIDE_MSG_STATUS:
    case TIDE_MSG_JOBS:
        return TIDE_ROLE_READER;
    case TIDE_MSG_RESIZE:
    case TIDE_MSG_SUBMIT:
    case TIDE_MSG_CANCEL:
    case TIDE_MSG_DRAIN:
    case TIDE_MSG_ELASTIC:
    case TIDE_MSG_GROW:
    case TIDE_MSG_CHECKPOINT:
    case TIDE_MSG_EVENTS:
    case TIDE_MSG_LOGS: /* a command's output may hold anything: admins only */
        return TIDE_ROLE_ADMIN;
    case TIDE_MSG_JOB_LAYOUT:
    case TIDE_MSG_JOB_POOLS:
    case TIDE_MSG_JOB_FIT:
    case TIDE_MSG_JOB_CKPTS:
    case TIDE_MSG_JOB_ARGV:
    case TIDE_MSG_CKPT_MANIFEST:
    case TIDE_MSG_CKPT_SUM:
    case TIDE_MSG_EVENT_FIELDS:
        return TIDE_ROLE_RECORD;
    default:
        return TIDE_ROLE_COORDINATOR;
    }
}

/* ---- validate (encode side) --------------------------------------------------------------------
 */

/* The field's name for an error message, formatted only when one is needed: this runs for every
 * field of every message. */
#define fn (tide__field_name(c, f->key, fnbuf, sizeof fnbuf))

/* A field of one value (int, double, bool, string, enum, nested struct). */
static tide_status validate_scalar(const tide__field *f, const void *base, tide__ctx *c)
{
    char fnbuf[160], want[96];
    const char *p = (const char *)base + f->off;
    switch (f->kind) {
    case TIDE__K_INT: {
        int neg;
        int64_t i;
        uint64_t u;
        tide__int_load(f, base, &neg, &i, &u);
        if (!tide__int_in_range(f, neg, i, u))
            return tide__fail(c, "%s must be %s, got %s%llu", fn,
                              tide__int_expect(f, want, sizeof want), neg ? "-" : "",
                              neg ? (unsigned long long)(-(i + 1)) + 1ull : (unsigned long long)u);
        return TIDE_OK;
    }
    case TIDE__K_DOUBLE: {
        double d;
        memcpy(&d, p, sizeof d);
        if (!isfinite(d) || d < f->dmin || d > f->dmax)
            return tide__fail(c, "%s must be a finite number in [%g, %g], got %g", fn, f->dmin,
                              f->dmax, d);
        return TIDE_OK;
    }
    case TIDE__K_BOOL: {
        int v;
        memcpy(&v, p, sizeof v);
        if (v != 0 && v != 1)
            return tide__fail(c, "%s must be a boolean (0 or 1), got %d", fn, v);
        return TIDE_OK;
    }
    case TIDE__K_STR: {
        size_t n = strnlen(p, f->size);
        if (n == f->size)
            return tide__fail(c, "%s is not NUL-terminated within %zu bytes", fn, f->size);
        return tide__check_str(c, f, p, n, f->size - 1, f->key);
    }
    case TIDE__K_ENUM: {
        int v;
        memcpy(&v, p, sizeof v);
        if (v < 0 || v >= f->n_names)
            return tide__fail(c, "%s has no wire name for value %d", fn, v);
        return TIDE_OK;
    }
    case TIDE__K_STRUCT: {
        if (f->flags & TIDE__F_NULLABLE) {
            int has;
            memcpy(&has, (const char *)base + f->has_off, sizeof has);
            if (!has)
                return TIDE_OK;
        }
        size_t plen = strlen(c->path);
        snprintf(c->path + plen, sizeof c->path - plen, "%s.", f->key);
        tide_status rc = tide__validate_struct(f->sub, p, c);
        c->path[plen] = '\0';
        return rc;
    }
    default:
        return tide__fail(c, "%s has an unknown kind", fn);
    }
}

/* An array's count within its limit and its pointer set when it has entries; *out: the
 * pointer (borrowed). */
static tide_status array_head(const tide__field *f, const void *base, uint32_t n, const void **out,
                              tide__ctx *c)
{
    char fnbuf[160];
    memcpy(out, (const char *)base + f->off, sizeof *out);
    if (n > f->cmax)
        return tide__fail(c, "%s has %u entries, more than the limit of %u", fn, n, f->cmax);
    if (n > 0 && *out == NULL)
        return tide__fail(c, "%s is NULL but needs %u entries", fn, n);
    return TIDE_OK;
}

/* A field of several values (int32s, fixed int64s, strings, uint64 bins, structs). */
static tide_status validate_array(const tide__field *f, const void *base, tide__ctx *c)
{
    char fnbuf[160], want[96];
    uint32_t n = 0;
    const void *v;
    switch (f->kind) {
    case TIDE__K_I32_ARRAY: {
        if (f->expect)
            TIDE_CHECK(f->expect(base, c, &n));
        else
            n = tide__load_count(base, f->count_off);
        if (f->count_off != TIDE__NO_OFF) {
            TIDE_CHECK(array_head(f, base, n, &v, c));
        } else { /* a count another field sets (expect) has no limit of its own */
            memcpy(&v, (const char *)base + f->off, sizeof v);
            if (n > 0 && v == NULL)
                return tide__fail(c, "%s is NULL but needs %u entries", fn, n);
        }
        const int32_t *a = v;
        for (uint32_t k = 0; k < n; k++) {
            if (!tide__int_in_range(f, a[k] < 0, a[k], a[k] < 0 ? 0 : (uint64_t)a[k]))
                return tide__fail(c, "%s[%u] must be %s, got %d", fn, k,
                                  tide__int_expect(f, want, sizeof want), a[k]);
        }
        return TIDE_OK;
    }
    case TIDE__K_I64_FIXED: {
        n = tide__load_count(base, f->count_off);
        if (n < f->cmin || n > f->cmax)
            return tide__fail(c, "%s must have %u to %u entries, got %u", fn, f->cmin, f->cmax, n);
        const int64_t *a = (const int64_t *)(const void *)((const char *)base + f->off);
        for (uint32_t k = 0; k < n; k++)
            if (a[k] < f->min)
                return tide__fail(c, "%s[%u] must be %s, got %lld", fn, k,
                                  tide__int_expect(f, want, sizeof want), (long long)a[k]);
        return TIDE_OK;
    }
    case TIDE__K_STR_ARRAY: {
        n = tide__load_count(base, f->count_off);
        TIDE_CHECK(array_head(f, base, n, &v, c));
        char *const *a = v;
        for (uint32_t k = 0; k < n; k++) {
            char key[48];
            snprintf(key, sizeof key, "%s[%u]", f->key, k);
            if (a[k] == NULL)
                return tide__fail(c, "field '%s%s' is NULL", c->path, key);
            TIDE_CHECK(tide__check_str(c, f, a[k], strnlen(a[k], f->size + 1), f->size, key));
        }
        return TIDE_OK;
    }
    case TIDE__K_U64_BIN:
        return array_head(f, base, tide__load_count(base, f->count_off), &v, c);
    case TIDE__K_STRUCT_ARRAY: {
        n = tide__load_count(base, f->count_off);
        TIDE_CHECK(array_head(f, base, n, &v, c));
        const char *a = v;
        size_t plen = strlen(c->path);
        tide_status rc = TIDE_OK;
        for (uint32_t k = 0; k < n && rc == TIDE_OK; k++) {
            tide__path_index(c, plen, f->key, k);
            rc = tide__validate_struct(f->sub, a + (size_t)k * f->sub->size, c);
        }
        c->path[plen] = '\0';
        return rc;
    }
    default:
        return tide__fail(c, "%s has an unknown kind", fn);
    }
}

static tide_status validate_field(const tide__field *f, const void *base, tide__ctx *c)
{
    switch (f->kind) {
    case TIDE__K_I32_ARRAY:
    case TIDE__K_I64_FIXED:
    case TIDE__K_STR_ARRAY:
    case TIDE__K_U64_BIN:
    case TIDE__K_STRUCT_ARRAY:
        return validate_array(f, base, c);
    default:
        return validate_scalar(f, base, c);
    }
}
#undef fn

tide_status tide__validate_struct(const tide__schema *s, const void *base, tide__ctx *c)
{
    for (size_t k = 0; k < s->n_fields; k++)
        TIDE_CHECK(validate_field(&s->fields[k], base, c));
    if (s->check)
        TIDE_CHECK(s->check(base, c));
    return TIDE_OK;
}

tide_status tide_msg_validate(const tide_msg_t *msg)
{
    if (msg == NULL)
        return tide_errorf(TIDE_ERR_INVALID, "message is NULL");
    const tide__schema *s = tide__msg_schema(msg->type);
    if (s == NULL)
        return tide_errorf(TIDE_ERR_INVALID, "message has no valid type (%d)", (int)msg->type);
    tide__ctx c = {TIDE_ERR_INVALID, tide_msg_type_name(msg->type), ""};
    return tide__validate_struct(s, &msg->u, &c);
}

/* ---- init / clear -------------------------------------------------------------------------------
 */

void tide__free_struct(const tide__schema *s, void *base)
{
    if (!s->owns)
        return;
    for (size_t k = 0; k < s->n_fields; k++) {
        const tide__field *f = &s->fields[k];
        char *p = (char *)base + f->off;
        switch (f->kind) {
        case TIDE__K_I32_ARRAY: {
            void *a;
            memcpy(&a, p, sizeof a);
            tide_free(a);
            a = NULL;
            memcpy(p, &a, sizeof a);
            if (f->count_off != TIDE__NO_OFF)
                tide__store_count(base, f->count_off, 0);
            break;
        }
        case TIDE__K_U64_BIN: {
            void *a;
            memcpy(&a, p, sizeof a);
            tide_free(a);
            a = NULL;
            memcpy(p, &a, sizeof a);
            tide__store_count(base, f->count_off, 0);
            break;
        }
        case TIDE__K_STR_ARRAY: {
            char **a;
            memcpy(&a, p, sizeof a);
            uint32_t n = tide__load_count(base, f->count_off);
            for (uint32_t i = 0; a && i < n; i++)
                tide_free(a[i]);
            tide_free(a);
            a = NULL;
            memcpy(p, &a, sizeof a);
            tide__store_count(base, f->count_off, 0);
            break;
        }
        case TIDE__K_STRUCT:
            tide__free_struct(f->sub, p);
            break;
        case TIDE__K_STRUCT_ARRAY: {
            char *a;
            memcpy(&a, p, sizeof a);
            uint32_t n = tide__load_count(base, f->count_off);
            for (uint32_t i = 0; a && f->sub->owns && i < n; i++)
                tide__free_struct(f->sub, a + (size_t)i * f->sub->size);
            tide_free(a);
            a = NULL;
            memcpy(p, &a, sizeof a);
            tide__store_count(base, f->count_off, 0);
            break;
        }
        default:
            break;
        }
    }
}

void tide_msg_init(tide_msg_t *msg, tide_msg_type_t type)
{
    memset(msg, 0, sizeof *msg);
    msg->type = type;
}

void tide_msg_clear(tide_msg_t *msg)
{
    if (msg == NULL)
        return;
    const tide__schema *s = tide__msg_schema(msg->type);
    if (s)
        tide__free_struct(s, &msg->u);
    tide_msg_init(msg, TIDE_MSG_NONE);
}

/* ---- buffer ------------------------------------------------------------------------------------
 */

void tide_proto_buf_init(tide_proto_buf_t *buf)
{
    buf->data = NULL;
    buf->len = 0;
    buf->cap = 0;
}

void tide_proto_buf_destroy(tide_proto_buf_t *buf)
{
    if (buf == NULL)
        return;
    tide_free(buf->data);
    tide_proto_buf_init(buf);
}

uint8_t *tide_proto_buf_release(tide_proto_buf_t *buf, size_t *len)
{
    uint8_t *d = buf->data;
    if (len)
        *len = buf->len;
    tide_proto_buf_init(buf);
    return d;
}

/* msgpack_packer write callback: appends, doubling capacity; -1 on allocation failure. */
static int buf_write(void *data, const char *src, size_t n)
{
    tide_proto_buf_t *b = data;
    if (n > SIZE_MAX - b->len)
        return -1;
    if (b->len + n > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n)
            cap = cap > SIZE_MAX / 2 ? b->len + n : cap * 2;
        uint8_t *d = tide_realloc(b->data, cap);
        if (d == NULL)
            return -1;
        b->data = d;
        b->cap = cap;
    }
    memcpy(b->data + b->len, src, n);
    b->len += n;
    return 0;
}

/* ---- encode ------------------------------------------------------------------------------------
 */

static int pack_str(msgpack_packer *pk, const char *s, size_t n)
{
    if (msgpack_pack_str(pk, n) != 0)
        return -1;
    return msgpack_pack_str_body(pk, s, n);
}

static int pack_key(msgpack_packer *pk, const char *key)
{
    return pack_str(pk, key, strlen(key));
}

static int encode_struct(const tide__schema *s, const void *base, msgpack_packer *pk, int top,
                         const char *type_name);

/* A field of several values: an array, or uint64s as one bin. 0, or -1 when the packer failed. */
static int encode_array(const tide__field *f, const void *base, msgpack_packer *pk)
{
    const char *p = (const char *)base + f->off;
    switch (f->kind) {
    case TIDE__K_I32_ARRAY: {
        uint32_t n;
        if (f->expect) {
            tide__ctx c = {TIDE_ERR_INVALID, "", ""};
            if (f->expect(base, &c, &n) != TIDE_OK) /* validated before: cannot fail */
                return -1;
        } else {
            n = tide__load_count(base, f->count_off);
        }
        const int32_t *a;
        memcpy(&a, p, sizeof a);
        if (msgpack_pack_array(pk, n) != 0)
            return -1;
        for (uint32_t k = 0; k < n; k++)
            if (msgpack_pack_int32(pk, a[k]) != 0)
                return -1;
        return 0;
    }
    case TIDE__K_I64_FIXED: {
        uint32_t n = tide__load_count(base, f->count_off);
        const int64_t *a = (const int64_t *)(const void *)p;
        if (msgpack_pack_array(pk, n) != 0)
            return -1;
        for (uint32_t k = 0; k < n; k++)
            if (msgpack_pack_int64(pk, a[k]) != 0)
                return -1;
        return 0;
    }
    case TIDE__K_STR_ARRAY: {
        uint32_t n = tide__load_count(base, f->count_off);
        char *const *a;
        memcpy(&a, p, sizeof a);
        if (msgpack_pack_array(pk, n) != 0)
            return -1;
        for (uint32_t k = 0; k < n; k++)
            if (pack_str(pk, a[k], strlen(a[k])) != 0)
                return -1;
        return 0;
    }
    case TIDE__K_U64_BIN: {
        uint32_t n = tide__load_count(base, f->count_off);
        const uint64_t *a;
        memcpy(&a, p, sizeof a);
        if (msgpack_pack_bin(pk, (size_t)n * 8) != 0)
            return -1;
        uint8_t le[512];
        for (uint32_t k = 0; k < n;) {
            size_t m = 0;
            for (; k < n && m < sizeof le; k++, m += 8)
                for (int b = 0; b < 8; b++)
                    le[m + (size_t)b] = (uint8_t)(a[k] >> (8 * b));
            if (msgpack_pack_bin_body(pk, le, m) != 0)
                return -1;
        }
        return 0;
    }
    case TIDE__K_STRUCT_ARRAY: {
        uint32_t n = tide__load_count(base, f->count_off);
        const char *a;
        memcpy(&a, p, sizeof a);
        if (msgpack_pack_array(pk, n) != 0)
            return -1;
        for (uint32_t k = 0; k < n; k++)
            if (encode_struct(f->sub, a + (size_t)k * f->sub->size, pk, 0, NULL) != 0)
                return -1;
        return 0;
    }
    default:
        return -1;
    }
}

static int encode_field(const tide__field *f, const void *base, msgpack_packer *pk)
{
    const char *p = (const char *)base + f->off;
    switch (f->kind) {
    case TIDE__K_INT: {
        int neg;
        int64_t i;
        uint64_t u;
        tide__int_load(f, base, &neg, &i, &u);
        return neg ? msgpack_pack_int64(pk, i) : msgpack_pack_uint64(pk, u);
    }
    case TIDE__K_DOUBLE: {
        double d;
        memcpy(&d, p, sizeof d);
        return msgpack_pack_double(pk, d);
    }
    case TIDE__K_BOOL: {
        int v;
        memcpy(&v, p, sizeof v);
        return v ? msgpack_pack_true(pk) : msgpack_pack_false(pk);
    }
    case TIDE__K_STR:
        return pack_str(pk, p, strlen(p));
    case TIDE__K_ENUM: {
        int v;
        memcpy(&v, p, sizeof v);
        return pack_key(pk, f->names[v]);
    }
    case TIDE__K_STRUCT:
        if (f->flags & TIDE__F_NULLABLE) {
            int has;
            memcpy(&has, (const char *)base + f->has_off, sizeof has);
            if (!has)
                return msgpack_pack_nil(pk);
        }
        return encode_struct(f->sub, p, pk, 0, NULL);
    default:
        return encode_array(f, base, pk);
    }
}

/* 1 when field f of base is optional and 0: it is left out (peers of before it decode the
   message, and a heartbeat stays small). Optional fields are doubles or integers. */
static int left_out(const tide__field *f, const void *base)
{
    if (!(f->flags & TIDE__F_OPTIONAL))
        return 0;
    const char *p = (const char *)base + f->off;
    if (f->kind == TIDE__K_DOUBLE) {
        double v;
        memcpy(&v, p, sizeof v);
        return v == 0.0;
    }
    static const char zero[sizeof(uint64_t)];
    return f->size <= sizeof zero && memcmp(p, zero, f->size) == 0;
}

static int encode_struct(const tide__schema *s, const void *base, msgpack_packer *pk, int top,
                         const char *type_name)
{
    size_t n = s->n_fields;
    for (size_t k = 0; k < s->n_fields; k++)
        n -= (size_t)left_out(&s->fields[k], base);
    if (msgpack_pack_map(pk, n + (top ? 2 : 0)) != 0)
        return -1;
    if (top) {
        if (pack_key(pk, "v") != 0 || msgpack_pack_uint64(pk, TIDE_PROTO_VERSION) != 0 ||
            pack_key(pk, "type") != 0 || pack_key(pk, type_name) != 0)
            return -1;
    }
    for (size_t k = 0; k < s->n_fields; k++) {
        if (left_out(&s->fields[k], base))
            continue;
        if (pack_key(pk, s->fields[k].key) != 0 || encode_field(&s->fields[k], base, pk) != 0)
            return -1;
    }
    return 0;
}

tide_status tide_proto_attempt_log_path(char *out, size_t n, const char *dir, const char *job,
                                        uint32_t attempt, int pid)
{
    int w = snprintf(out, n, "%s/%s.%u.%d.log", dir, job, attempt, pid);
    if (w < 0 || (size_t)w >= n)
        return tide_errorf(TIDE_ERR_RANGE, "the log path of attempt %u of %s under %s is too long",
                           attempt, job, dir);
    return TIDE_OK;
}

int tide_proto_attempt_log_ok(const char *path, const char *job, uint32_t attempt)
{
    if (path == NULL || job == NULL || path[0] != '/')
        return 0;
    /* no "." or ".." component anywhere: the file is where the path says */
    for (const char *c = path; *c != '\0';) {
        while (*c == '/')
            c++;
        size_t len = strcspn(c, "/");
        if ((len == 1 && c[0] == '.') || (len == 2 && c[0] == '.' && c[1] == '.'))
            return 0;
        c += len;
    }
    const char *base = strrchr(path, '/') + 1;
    char want[TIDE_PROTO_NAME_MAX + 32];
    int w = snprintf(want, sizeof want, "%s.%u.", job, attempt);
    if (w < 0 || (size_t)w >= sizeof want || strncmp(base, want, (size_t)w) != 0)
        return 0;
    const char *pid = base + w;
    size_t digits = strspn(pid, "0123456789");
    return digits > 0 && digits <= 10 && strcmp(pid + digits, ".log") == 0;
}

/* Encodes msg into buf if it validates and its encoding has at most limit bytes. */
static tide_status encode_limited(const tide_msg_t *msg, tide_proto_buf_t *buf, size_t limit)
{
    buf->len = 0;
    TIDE_CHECK(tide_msg_validate(msg));
    msgpack_packer pk;
    msgpack_packer_init(&pk, buf, buf_write);
    if (encode_struct(tide__msg_schema(msg->type), &msg->u, &pk, 1,
                      tide_msg_type_name(msg->type)) != 0) {
        buf->len = 0;
        return tide_errorf(TIDE_ERR_NOMEM, "out of memory encoding a %s message",
                           tide_msg_type_name(msg->type));
    }
    if (buf->len > limit) {
        size_t n = buf->len;
        buf->len = 0;
        return tide_errorf(TIDE_ERR_INVALID,
                           "%s: encoded message is %zu bytes, over the %zu-byte limit",
                           tide_msg_type_name(msg->type), n, limit);
    }
    return TIDE_OK;
}

tide_status tide_proto_encode(const tide_msg_t *msg, tide_proto_buf_t *buf)
{
    return encode_limited(msg, buf, TIDE_PROTO_MAX_MSG_BYTES);
}

tide_status tide_proto_encode_record(const tide_msg_t *msg, tide_proto_buf_t *buf)
{
    buf->len = 0;
    if (msg == NULL || tide_msg_type_role(msg->type) != TIDE_ROLE_RECORD)
        return tide_errorf(TIDE_ERR_INVALID, "a '%s' message is no record",
                           msg ? tide_msg_type_name(msg->type) : "(null)");
    return encode_limited(msg, buf, TIDE_PROTO_RECORD_MAX_BYTES);
}
