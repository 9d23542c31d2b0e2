/*
 * proto: the message catalogue. A type's schema lives in the room of whoever speaks it:
 * proto_worker.c (workers and tided), proto_tidectl.c (tidectl and tided), proto_record.c
 * (what tide writes to a disk); tide__msg_schema finds it, and every codec path (encode,
 * decode, validate, clear) starts there. Here too: the sub-schemas several rooms share
 * (layout, tensor, fit rule, event fields), the cross-field rules they share, and who may
 * send each type. Workload: one lookup per message, ~10^4/s in tided.
 */
#include "core/error.h"
#include "proto/proto_int.h"

_Static_assert(sizeof(int) == 4, "proto stores int fields as 4 bytes");
_Static_assert(sizeof(tide_proto_job_state_t) == sizeof(int), "enums are stored as int");

/* ---- cross-field rules several schemas share ------------------------------------------------- */

tide_status tide__check_degrees(tide__ctx *c, int dp, int tp, int pp)
{
    uint64_t n = (uint64_t)dp * (uint64_t)tp * (uint64_t)pp;
    if (n > TIDE_PROTO_WORKERS_MAX)
        return tide__fail(c, "%sdp*tp*pp = %d*%d*%d = %llu exceeds %u workers", c->path, dp, tp, pp,
                          (unsigned long long)n, TIDE_PROTO_WORKERS_MAX);
    return TIDE_OK;
}

/* Stage boundaries: starts[0] = 0 and strictly increasing (each stage >= 1 layer). */
tide_status tide__check_stages(tide__ctx *c, const int *s, uint32_t n)
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

/* Offline work: command jobs carry argv and no plugin; plugin jobs carry a plugin name. */
tide_status tide__check_offline(tide__ctx *c, tide_proto_job_kind_t kind, const char *plugin,
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

/* ---- sub-schemas several messages and records hold ------------------------------------------- */

static tide_status expect_stages(const void *base, tide__ctx *c, uint32_t *n)
{
    const tide_proto_layout_t *l = base;
    *n = (uint32_t)l->pp + 1;
    return TIDE_OK;
}

static tide_status expect_workers(const void *base, tide__ctx *c, uint32_t *n)
{
    const tide_proto_layout_t *l = base;
    TIDE_CHECK(tide__check_degrees(c, l->dp, l->tp, l->pp));
    *n = (uint32_t)l->dp * (uint32_t)l->tp * (uint32_t)l->pp;
    return TIDE_OK;
}

static tide_status check_layout(const void *base, tide__ctx *c)
{
    const tide_proto_layout_t *l = base;
    char fn[160];
    TIDE_CHECK(tide__check_degrees(c, l->dp, l->tp, l->pp));
    if (l->num_layers < l->pp)
        return tide__fail(c, "%s = %d is fewer than pp = %d stages",
                          tide__field_name(c, "layers", fn, sizeof fn), l->num_layers, l->pp);
    TIDE_CHECK(tide__check_stages(c, l->stage_start, (uint32_t)l->pp + 1));
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

static const tide__field fit_fields[] = {
    F_ENUM(tide_proto_fit_t, degree, "degree", tide__degree_names),
    F_INT(tide_proto_fit_t, n, "n", 1, TIDE_PROTO_FIT_N_MAX),
    F_STR(tide_proto_fit_t, what, "what", TIDE__CS_LINE, 0),
};
const tide__schema tide__fit_schema = {fit_fields, NELEM(fit_fields), sizeof(tide_proto_fit_t), 0,
                                       NULL};

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

/* ---- the catalogue --------------------------------------------------------------------------- */

const tide__schema *tide__msg_schema(tide_msg_type_t type)
{
    if ((int)type <= (int)TIDE_MSG_NONE || (int)type >= (int)TIDE_MSG__COUNT)
        return NULL;
    if (tide__worker_schemas[type].size != 0)
        return &tide__worker_schemas[type];
    if (tide__tidectl_schemas[type].size != 0)
        return &tide__tidectl_schemas[type];
    return tide__record_schema(type);
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
