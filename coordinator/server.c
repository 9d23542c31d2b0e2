/*
 * coordinator/server: tided assembled (see server.h). The core loop (loop.c) knows no
 * message's meaning; this file registers, in one table, the handler module of each
 * message type, and the hooks of the modules that keep time or react to the state: the
 * whole of tided's wiring in one place. Adding a message is a row here and a handler in
 * the module of whoever speaks it.
 *
 * Who handles what (a module registers the messages whose handling it owns):
 *   workers.c     register, heartbeats, bye, failure, bubble, liveness, offline_status
 *   join.c        join (job creation, first layout)
 *   reconf.c      prepare_ack, join_port (the switch protocol)
 *   recovery.c    done (a switch's success, or a failure to recover from)
 *   checkpoint.c  saved, checkpoint
 *   queries.c     status, jobs, events, logs
 *   operators.c   submit, cancel, drain
 *   resize.c      resize
 *   allocations.c grow, leave (pools as scheduler allocations)
 * and the hooks: liveness.c (failure scan, retention), recovery.c (switch deadlines,
 * stalled jobs), offline.c (backfill), reconf.c and liveness.c (state reloaded),
 * allocations.c (leaves, growing onto joined allocations, the provider's commands),
 * metrics.c (its HTTP listener).
 */
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "core/log.h"
#include "coordinator/allocations.h"
#include "coordinator/checkpoint.h"
#include "coordinator/elastic_tided.h"
#include "coordinator/join.h"
#include "coordinator/liveness.h"
#include "coordinator/loop.h"
#include "coordinator/http.h"
#include "coordinator/metrics.h"
#include "coordinator/offline.h"
#include "coordinator/operators.h"
#include "coordinator/queries.h"
#include "coordinator/reconf.h"
#include "coordinator/recovery.h"
#include "coordinator/resize.h"
#include "coordinator/stall.h"
#include "coordinator/workers.h"

/* READONLY: served while the state file cannot be written; BEAT: a heartbeat message. */
#define RO   TIDE__H_READONLY
#define BEAT TIDE__H_BEAT

static const struct {
    tide_msg_type_t type;
    tide__msg_fn fn;
    unsigned flags;
} handlers[] = {
    /* workers about themselves */
    {TIDE_MSG_REGISTER, tide__on_register, 0},
    {TIDE_MSG_HEARTBEAT, tide__on_heartbeat, RO | BEAT},
    {TIDE_MSG_HOST_HEARTBEAT, tide__on_host_heartbeat, RO | BEAT},
    {TIDE_MSG_BYE, tide__on_bye, 0},
    {TIDE_MSG_FAILURE, tide__on_failure, 0},
    {TIDE_MSG_BUBBLE, tide__on_bubble, 0},
    {TIDE_MSG_LIVENESS, tide__on_liveness, RO},
    {TIDE_MSG_OFFLINE_STATUS, tide__on_offline_status, 0},
    {TIDE_MSG_JOIN, tide__on_join, 0},
    {TIDE_MSG_LEAVE, tide__on_leave, 0},
    /* workers in a switch */
    {TIDE_MSG_PREPARE_ACK, tide__on_prepare_ack, 0},
    {TIDE_MSG_DONE, tide__on_done, 0},
    {TIDE_MSG_JOIN_PORT, tide__on_join_port, 0},
    {TIDE_MSG_SAVED, tide__on_saved, 0},
    {TIDE_MSG_SAVE_ACK, tide__on_save_ack, 0},
    /* operators: reads */
    {TIDE_MSG_STATUS, tide__on_status, RO},
    {TIDE_MSG_JOBS, tide__on_jobs, RO},
    {TIDE_MSG_EVENTS, tide__on_events, RO},
    {TIDE_MSG_LOGS, tide__on_logs, RO},
    /* operators: changes */
    {TIDE_MSG_RESIZE, tide__on_resize, 0},
    {TIDE_MSG_SUBMIT, tide__on_submit, 0},
    {TIDE_MSG_CANCEL, tide__on_cancel, 0},
    {TIDE_MSG_DRAIN, tide__on_drain, 0},
    {TIDE_MSG_ELASTIC, tide__on_elastic, 0},
    {TIDE_MSG_CHECKPOINT, tide__on_checkpoint, 0},
    {TIDE_MSG_GROW, tide__on_grow, 0},
};

/* Registers every handler and hook; the order of hooks of one kind is the order they run. */
static void wire(tide_server_t *s)
{
    for (size_t i = 0; i < sizeof handlers / sizeof handlers[0]; i++)
        tide__on_message(s, handlers[i].type, handlers[i].fn, handlers[i].flags);
    /* state (re)loaded: workers first, then the switches that name them */
    tide__on_load(s, tide__liveness_reload);
    tide__on_load(s, tide__reconf_reload);
    tide__on_load(s, tide__alloc_load);
    /* every tick: who went silent, then the switches waiting on them, then retention */
    tide__on_tick(s, tide__liveness_tick);
    tide__on_tick(s, tide__recovery_tick);
    tide__on_tick(s, tide__retention_tick);
    tide__on_tick(s, tide__stall_tick);
    tide__on_tick(s, tide__elastic_tick);
    tide__on_tick(s, tide__ckpt_tick);
    /* then allocations: leaves, growing onto joined pools, the provider's commands */
    tide__on_tick(s, tide__alloc_tick);
    /* a scheduling pass: stalled jobs take what they can before offline work does */
    tide__on_schedule(s, tide__recovery_retry_stalled);
    tide__on_schedule(s, tide__elastic_pass); /* online jobs take GPUs before offline work */
    tide__on_schedule(s, tide__offline_backfill);
}

void tide_server_config_defaults(tide_server_config *cfg)
{
    memset(cfg, 0, sizeof *cfg);
    cfg->endpoint = "tcp://127.0.0.1:5555";
    cfg->state_path = "./tide-state.db";
    cfg->heartbeat_ms = 1000;
    cfg->miss_limit = 3;
    cfg->sync_full = 1;
    cfg->resize_timeout_ms = 120000;
    cfg->grace_ms = 10000;
    cfg->link_bytes_per_s = 10e9;
    cfg->elastic_interval_ms = 300000;
    cfg->elastic_margin = 2.0;
    cfg->max_attempts = 3;
    cfg->retry_backoff_ms = 1000;
    cfg->join_grace_ms = 30000;
    cfg->batch_ms = 2;
    cfg->retention_ms = 3600000;
    cfg->max_client_workers = 65536;
    cfg->stall_ms = 30000; /* a cut link seen well inside a minute, a slow step not */
    cfg->stall_factor = 10;
    cfg->max_client_mb = 64; /* above a 32 MiB frame and its framing */
    cfg->status_page = 16384; /* 16384 rows of the longest names stay far below a message's
                                 32 MiB */
    cfg->slurm_poll_ms = 2000;
}

static int endpoint_is_local(const char *ep)
{
    if (strncmp(ep, "ipc://", 6) == 0 || strncmp(ep, "inproc://", 9) == 0)
        return 1;
    if (strncmp(ep, "tcp://", 6) != 0)
        return 0;
    const char *host = ep + 6;
    const char *colon = strrchr(host, ':');
    size_t len = colon ? (size_t)(colon - host) : strlen(host);
    if (strchr(host, ';') != NULL && strchr(host, ';') < host + len)
        return 0; /* source;destination syntax: not a plain bind address */
    if (len >= 2 && host[0] == '[' && host[len - 1] == ']') {
        host++;
        len -= 2;
    }
    if (len == 9 && strncmp(host, "localhost", 9) == 0)
        return 1;
    if (len == 3 && strncmp(host, "::1", 3) == 0)
        return 1;
    if (len >= 4 && strncmp(host, "127.", 4) == 0) {
        for (size_t i = 4; i < len; i++)
            if (!((host[i] >= '0' && host[i] <= '9') || host[i] == '.'))
                return 0;
        return 1;
    }
    return 0;
}

/* cfg's settings in range; a non-loopback endpoint only with keys. */
static tide_status check_config(const tide_server_config *cfg)
{
    if (cfg->endpoint == NULL || cfg->state_path == NULL)
        return tide_errorf(TIDE_ERR_INVALID, "tided needs an endpoint and a state file");
    if (cfg->heartbeat_ms < 10 || cfg->miss_limit < 1)
        return tide_errorf(TIDE_ERR_RANGE,
                           "heartbeat period must be >= 10 ms and the miss limit >= 1");
    if (cfg->retention_ms < 0 || cfg->max_client_workers < 1 || cfg->status_page < 1 ||
        cfg->status_page > (int)TIDE_PROTO_ROWS_MAX)
        return tide_errorf(TIDE_ERR_RANGE,
                           "retention must be >= 0 ms, the per-client worker limit >= 1 and the "
                           "status page 1..%u rows",
                           TIDE_PROTO_ROWS_MAX);
    int with_auth = cfg->auth_dir != NULL && cfg->auth_dir[0] != '\0';
    if (!with_auth && !endpoint_is_local(cfg->endpoint))
        return tide_errorf(TIDE_ERR_DENIED,
                           "refusing to bind %s without authentication: a non-loopback endpoint "
                           "needs --auth DIR (create keys with 'tidectl keygen')",
                           cfg->endpoint);
    return TIDE_OK;
}

tide_status tide_server_new(tide_server_t **out, const tide_server_config *cfg)
{
    tide_status rc = TIDE_OK;
    tide_server_t *s = tide_calloc(1, sizeof *s);
    if (s == NULL)
        return tide_errorf(TIDE_ERR_NOMEM, "out of memory starting tided");
    s->cfg = *cfg;
    TIDE_CHECK_GOTO(check_config(cfg), rc, fail);
    TIDE_CHECK_GOTO(tide__core_new(s), rc, fail);
    TIDE_CHECK_GOTO(tide__alloc_open(s), rc, fail);
    wire(s);
    TIDE_CHECK_GOTO(tide__core_load(s), rc, fail);
    size_t pending = 0;
    for (size_t i = 0; i < s->st->n_jobs; i++)
        pending += s->st->jobs[i]->reconf != NULL;
    TIDE_INFO("server", "state %s: %zu workers, %zu jobs, %zu pending reconfigurations",
              cfg->state_path, s->st->n_workers, s->st->n_jobs, pending);
    TIDE_CHECK_GOTO(tide__core_bind(s), rc, fail);
    if (cfg->metrics != NULL && cfg->metrics[0] != '\0')
        TIDE_CHECK_GOTO(tide__http_open(s, cfg->metrics), rc, fail);
    TIDE_CHECK_GOTO(tide__core_announce(s), rc, fail); /* last: the file says tided serves */
    TIDE_INFO("server", "listening on %s%s", tide__core_endpoint(s), s->auth_on ? " (CURVE)" : "");
    *out = s;
    return TIDE_OK;
fail:
    tide_server_destroy(&s);
    return rc;
}

tide_status tide_server_run(tide_server_t *s)
{
    return tide__core_run(s);
}

void tide_server_stop(tide_server_t *s)
{
    s->stop = 1;
}

const char *tide_server_endpoint(const tide_server_t *s)
{
    return tide__core_endpoint(s);
}

void tide_server_destroy(tide_server_t **self_p)
{
    if (self_p == NULL || *self_p == NULL)
        return;
    tide_server_t *s = *self_p;
    tide__http_close(s);
    tide__alloc_close(s);
    tide__ckpt_close(s);
    tide__core_destroy(s);
    tide_coord_state_destroy(&s->st);
    tide_free(s);
    *self_p = NULL;
}
