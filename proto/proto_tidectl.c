/*
 * proto: the schemas of tidectl's requests and tided's replies (proto.h, "tidectl <->
 * tided"): status and job listings, resize, submit, cancel, drain, elastic bounds, grow,
 * checkpoint, events and logs, and the ok / error replies any request gets. Their table
 * below is one line per type; tide__msg_schema (proto.c) looks a type up here after
 * proto_worker.c's. Workload: a few requests per operator command; a status or events reply
 * may hold thousands of rows.
 */
#include <ctype.h>
#include <string.h>

#include "core/error.h"
#include "proto/proto_int.h"

static const tide__field gpu_row_fields[] = {
    F_WORKER(tide_proto_gpu_row_t, worker),
    F_STR(tide_proto_gpu_row_t, host, "host", TIDE__CS_HOST, 1),
    F_INT(tide_proto_gpu_row_t, pid, "pid", 0, INT32_MAX),
    F_STR(tide_proto_gpu_row_t, pool, "pool", TIDE__CS_NAME, 0),
    F_INT(tide_proto_gpu_row_t, pool_rank, "pool_rank", 0, TIDE_PROTO_WORKERS_MAX - 1),
    F_INT(tide_proto_gpu_row_t, device, "device", 0, TIDE_PROTO_DEVICE_MAX),
    F_ENUM(tide_proto_gpu_row_t, kind, "kind", tide__device_kind_names),
    F_ENUM(tide_proto_gpu_row_t, state, "state", tide__worker_state_names),
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
    F_ENUM(tide_proto_job_row_t, kind, "kind", tide__job_kind_names),
    F_ENUM(tide_proto_job_row_t, state, "state", tide__job_state_names),
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
    TIDE_CHECK(tide__check_degrees(c, m->dp, m->tp, m->pp));
    if (m->n_stages != 0 && m->n_stages != (uint32_t)m->pp + 1)
        return tide__fail(c, "field 'stages' must be empty or hold pp + 1 = %d boundaries, got %u",
                          m->pp + 1, m->n_stages);
    return tide__check_stages(c, m->stage_start, m->n_stages);
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
    F_ENUM(tide_proto_resize_t, placement, "placement", tide__placement_names),
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
    return tide__check_offline(c, m->kind, m->plugin, m->argc);
}

static const tide__field submit_fields[] = {
    F_STR(tide_proto_submit_t, name, "name", TIDE__CS_NAME, 1),
    F_ENUM(tide_proto_submit_t, kind, "kind", tide__job_kind_names),
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
    F_ENUM(tide_proto_attempt_row_t, state, "state", tide__job_state_names),
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

/* ---- the table: one line per type ------------------------------------------------------------ */

const tide__schema tide__tidectl_schemas[TIDE_MSG__COUNT] = {
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
