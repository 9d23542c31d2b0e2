/*
 * proto: names, the strings people and peers read: each message type's wire name, the
 * enums' wire strings (the schemas in proto_worker.c and proto_tidectl.c encode enums with
 * them), and the file name of an offline attempt's log. Printers (tidectl, tided's log and
 * events) call in here, as do the encoder and decoder for a type's name. Workload: a few
 * lookups per message or printed row; pure, any thread.
 */
#include <stdio.h>
#include <string.h>

#include "core/error.h"
#include "proto/proto_int.h"

/* ---- enum names ------------------------------------------------------------------------------ */

/* Defines the wire names of an enum whose last value is `last`, one per value: the size
   proto_int.h declares. A list one short would otherwise build, with a NULL name at its end. */
#define WIRE_NAMES(var, last, ...)                                                                 \
    _Static_assert(sizeof((const char *const[]){__VA_ARGS__}) ==                                   \
                       ((size_t)(last) + 1) * sizeof(const char *),                                \
                   #var " needs one name per value");                                              \
    const char *const var[] = {__VA_ARGS__}

WIRE_NAMES(tide__device_kind_names, TIDE_DEVICE_GPU, "cpu", "gpu");
WIRE_NAMES(tide__worker_state_names, TIDE_WORKER_LEFT, "idle", "online", "offline", "failed",
           "draining", "left");
WIRE_NAMES(tide__job_kind_names, TIDE_JOB_PLUGIN, "online", "command", "plugin");
WIRE_NAMES(tide__job_state_names, TIDE_JOB_STALLED, "queued", "running", "resizing", "recovering",
           "preempted", "done", "failed", "cancelled", "stalled");
WIRE_NAMES(tide__placement_names, TIDE_PLACEMENT_OPTIMAL, "default", "optimal");
WIRE_NAMES(tide__degree_names, 3, "dp", "tp", "pp", "dp_micro"); /* tide_degree */

static const char *enum_name(const char *const *names, int n, int v)
{
    return (v >= 0 && v < n) ? names[v] : "?";
}

const char *tide_proto_device_kind_name(tide_proto_device_kind_t v)
{
    return enum_name(tide__device_kind_names, NELEM(tide__device_kind_names), (int)v);
}

const char *tide_proto_worker_state_name(tide_proto_worker_state_t v)
{
    return enum_name(tide__worker_state_names, NELEM(tide__worker_state_names), (int)v);
}

const char *tide_proto_job_kind_name(tide_proto_job_kind_t v)
{
    return enum_name(tide__job_kind_names, NELEM(tide__job_kind_names), (int)v);
}

const char *tide_proto_job_state_name(tide_proto_job_state_t v)
{
    return enum_name(tide__job_state_names, NELEM(tide__job_state_names), (int)v);
}

const char *tide_proto_placement_name(tide_proto_placement_t v)
{
    return enum_name(tide__placement_names, NELEM(tide__placement_names), (int)v);
}

tide_status tide_proto_placement_parse(const char *s, tide_proto_placement_t *out)
{
    for (int i = 0; s && i < NELEM(tide__placement_names); i++) {
        if (strcmp(s, tide__placement_names[i]) == 0) {
            *out = (tide_proto_placement_t)i;
            return TIDE_OK;
        }
    }
    return tide_errorf(TIDE_ERR_NOT_FOUND, "placement '%s' is not one of: default, optimal",
                       s ? s : "(null)");
}

/* ---- message type names ---------------------------------------------------------------------- */

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

/* ---- an offline attempt's log file ----------------------------------------------------------- */

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
