/*
 * tided: the tide coordinator daemon. Settings come from flags with TIDE_*
 * environment defaults and are logged once; then the event loop
 * (coordinator/server.h) runs until SIGINT/SIGTERM. Exit codes: 0 clean stop,
 * 1 runtime failure (state file error, socket error), 2 bad settings.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "core/log.h"
#include "core/opts.h"
#include "coordinator/provider.h"
#include "coordinator/server.h"
#include "coordinator/tidectl.h"

static tide_server_t *running;
static volatile sig_atomic_t stop_asked; /* a signal came, maybe before the loop ran */

static void on_signal(int sig)
{
    (void)sig;
    stop_asked = 1;
    if (running != NULL)
        tide_server_stop(running);
}

struct settings {
    const char *endpoint;
    const char *endpoint_file;
    const char *state;
    const char *metrics;
    const char *ompi_server;
    const char *auth;
    const char *log;
    const char *provider;
    const char *slurm_bin;
    long long slurm_poll_ms;
    long long slurm_pending_ms;
    long long heartbeat_ms;
    long long miss_limit;
    long long resize_timeout_ms;
    long long grace_ms;
    long long max_attempts;
    const char *offline_max_memory;
    long long offline_max_procs;
    uint64_t offline_max_memory_bytes;
    long long retry_backoff_ms;
    long long join_grace_ms;
    long long batch_ms;
    long long retention_ms;
    long long max_client_workers;
    long long status_page;
    long long stall_ms;
    long long stall_factor;
    long long max_client_mb;
    double link_gbps;
    long long elastic_interval_ms;
    double elastic_margin;
    int sync_full;
    int accept_state_loss;
    char state_buf[4096]; /* the default --state under systemd (default_state) */
};

/* The state file when --state and TIDE_STATE are absent: the service's state directory
   (systemd sets $STATE_DIRECTORY from StateDirectory=, a colon-separated list whose first
   entry is ours; dist/tided.service), else the current directory as always. *out points
   to buf or to static text. Main thread. */
static tide_status default_state(char *buf, size_t len, const char **out)
{
    const char *dirs = getenv("STATE_DIRECTORY");
    if (dirs == NULL || dirs[0] == '\0' || dirs[0] == ':') {
        *out = "./tide-state.db";
        return TIDE_OK;
    }
    size_t n = strcspn(dirs, ":");
    int w = snprintf(buf, len, "%.*s/state.db", (int)n, dirs);
    if (w < 0 || (size_t)w >= len)
        return tide_errorf(TIDE_ERR_INVALID, "$STATE_DIRECTORY is longer than a path (%zu bytes)",
                           n);
    *out = buf;
    return TIDE_OK;
}

/* Reads the flags (TIDE_* defaults) into *s, checks and logs them; -1 to go on, else the
 * exit code (help printed: 0; bad settings: 2). */
/* Checks what the option table cannot (log level, provider, sizes, the default state
   file) and applies the log level; -1 when s is good, else the exit code (2). */
static int check_settings(struct settings *s)
{
    tide_log_level level;
    if (tide_log_parse_level(s->log, &level) != TIDE_OK) {
        fprintf(stderr, "tided: %s\n", tide_last_error());
        return 2;
    }
    if (!(s->elastic_margin >= 0 && s->elastic_margin <= 1e6)) {
        fprintf(stderr, "tided: --elastic-margin must be in [0, 1e6]\n");
        return 2;
    }
    int slurm = 0;
    if (tide_provider_parse(s->provider, &slurm) != TIDE_OK) {
        fprintf(stderr, "tided: %s\n", tide_last_error());
        return 2;
    }
    if (tidectl_parse_bytes(s->offline_max_memory, &s->offline_max_memory_bytes) != TIDE_OK) {
        fprintf(stderr, "tided: --offline-max-memory: %s\n", tide_last_error());
        return 2;
    }
    if (!(s->link_gbps > 0)) {
        fprintf(stderr, "tided: --link-gbps must be > 0\n");
        return 2;
    }
    tide_log_set_level(level);
    if (s->state == NULL &&
        default_state(s->state_buf, sizeof s->state_buf, &s->state) != TIDE_OK) {
        fprintf(stderr, "tided: %s\n", tide_last_error());
        return 2;
    }
    return -1;
}

static int read_settings(struct settings *s, int argc, char **argv)
{
    const tide_opt opts[] = {
        {"endpoint", "TIDE_ENDPOINT", TIDE_OPT_STRING, &s->endpoint, "tcp://127.0.0.1:5555",
         "ZeroMQ endpoint to bind (non-loopback needs --auth; port * picks a free one)", 0, 0},
        {"endpoint-file", "TIDE_ENDPOINT_FILE", TIDE_OPT_STRING, &s->endpoint_file, NULL,
         "write the bound endpoint to this file once every listener (--metrics too) is open", 0, 0},
        {"state", "TIDE_STATE", TIDE_OPT_STRING, &s->state, NULL,
         "SQLite state file (WAL mode); when not given: $STATE_DIRECTORY/state.db under "
         "systemd (StateDirectory=tide: /var/lib/tide/state.db), else ./tide-state.db in the "
         "current directory",
         0, 0},
        {"sync-full", "TIDE_SYNC_FULL", TIDE_OPT_BOOL, &s->sync_full, "1",
         "fsync every commit (survives power loss); --no-sync-full survives tided crashes only", 0,
         0},
        {"accept-state-loss", "TIDE_ACCEPT_STATE_LOSS", TIDE_OPT_BOOL, &s->accept_state_loss, "0",
         "start from a state file that lost acknowledged commits (its write-ahead log missing "
         "or damaged at its end) instead of refusing it; what those commits held is then unknown",
         0, 0},
        {"metrics", "TIDE_METRICS", TIDE_OPT_STRING, &s->metrics, NULL,
         "serve Prometheus metrics (/metrics) and the live cluster page (/) on HOST:PORT (e.g. "
         "127.0.0.1:9400)",
         0, 0},
        {"auth", "TIDE_AUTH", TIDE_OPT_STRING, &s->auth, NULL,
         "directory of CURVE keys and roles (enables CURVE)", 0, 0},
        {"heartbeat-ms", "TIDE_HEARTBEAT_MS", TIDE_OPT_INT, &s->heartbeat_ms, "1000",
         "worker heartbeat period", 10, 600000},
        {"miss-limit", "TIDE_MISS_LIMIT", TIDE_OPT_INT, &s->miss_limit, "3",
         "missed heartbeats before a worker is declared failed", 1, 1000},
        {"resize-timeout-ms", "TIDE_RESIZE_TIMEOUT_MS", TIDE_OPT_INT, &s->resize_timeout_ms,
         "120000", "a layout switch not done by then falls back to the old layout", 100, 86400000},
        {"grace-ms", "TIDE_GRACE_MS", TIDE_OPT_INT, &s->grace_ms, "10000",
         "SIGTERM-to-SIGKILL grace for preempted offline work", 0, 600000},
        {"max-attempts", "TIDE_MAX_ATTEMPTS", TIDE_OPT_INT, &s->max_attempts, "3",
         "failed runs of an offline job before it is marked failed (preemptions and workers "
         "leaving do not count)",
         1, 1000},
        {"offline-max-memory", "TIDE_OFFLINE_MAX_MEMORY", TIDE_OPT_STRING, &s->offline_max_memory,
         "0",
         "host memory an offline command's attempt may use when tidectl submit gives no "
         "--max-memory (512M, 4G, bytes; 0: no limit): a cgroup v2 memory.max when the worker "
         "can make one, else RLIMIT_AS",
         0, 0},
        {"offline-max-procs", "TIDE_OFFLINE_MAX_PROCS", TIDE_OPT_INT, &s->offline_max_procs, "0",
         "processes an offline command's attempt may run when tidectl submit gives no "
         "--max-procs (0: no limit): a cgroup v2 pids.max, else RLIMIT_NPROC (per user, not "
         "binding root)",
         0, TIDE_PROTO_PROCS_MAX},
        {"retry-backoff-ms", "TIDE_RETRY_BACKOFF_MS", TIDE_OPT_INT, &s->retry_backoff_ms, "1000",
         "wait before retrying a failed offline job, doubled per failure up to 60 s; the retry "
         "prefers another worker",
         0, 60000},
        {"join-grace-ms", "TIDE_JOIN_GRACE_MS", TIDE_OPT_INT, &s->join_grace_ms, "30000",
         "a registered worker gets offline work once its job placed its first layout, or after "
         "this long if it joins no job",
         0, 86400000},
        {"batch-ms", "TIDE_BATCH_MS", TIDE_OPT_INT, &s->batch_ms, "2",
         "gather requests for up to this long between loop passes (fewer wakeups under load; "
         "0: wake for every request)",
         0, 100},
        {"retention-ms", "TIDE_RETENTION_MS", TIDE_OPT_INT, &s->retention_ms, "3600000",
         "a worker that left (bye) or failed is forgotten this long after (removed from the "
         "worker table and the state file), once no job refers to it",
         0, 2592000000LL},
        {"max-client-workers", "TIDE_MAX_CLIENT_WORKERS", TIDE_OPT_INT, &s->max_client_workers,
         "65536",
         "live workers one client may register (with --auth: one key; without: one connection), "
         "and the ranks one pool may declare",
         1, 1048576},
        {"status-page", "TIDE_STATUS_PAGE", TIDE_OPT_INT, &s->status_page, "16384",
         "rows of one status reply at most; longer listings come in pages (tidectl follows them)",
         1, 65536},
        {"stall-ms", "TIDE_STALL_MS", TIDE_OPT_INT, &s->stall_ms, "30000",
         "a step a rank has been inside longer than this and than --stall-factor x the job's "
         "recent step time is stalled: a `stalled` event, and a job spread over hosts goes on "
         "on the host holding most of it (0: not watched)",
         0, 86400000},
        {"stall-factor", "TIDE_STALL_FACTOR", TIDE_OPT_INT, &s->stall_factor, "10",
         "see --stall-ms", 1, 100000},
        {"max-client-mb", "TIDE_MAX_CLIENT_MB", TIDE_OPT_INT, &s->max_client_mb, "64",
         "MiB one connection may have sent past its last complete message (or make tided's "
         "memory grow by while it sends one) before it is cut (0: not watched)",
         0, 1048576},
        {"ompi-server", "TIDE_OMPI_SERVER", TIDE_OPT_STRING, &s->ompi_server, NULL,
         "ompi-server URI (e.g. file:/run/ompi.uri) that every pool of a job that grows is "
         "launched with (mpirun --ompi-server); shown by tidectl status",
         0, 0},
        {"provider", "TIDE_PROVIDER", TIDE_OPT_STRING, &s->provider, "none",
         "where a job's nodes come from: none (launches an operator starts), or slurm (tidectl "
         "grow submits the job's batch script again; pools of a job's allocations are grown "
         "onto as they join)",
         0, 0},
        {"slurm-bin", "TIDE_SLURM_BIN", TIDE_OPT_STRING, &s->slurm_bin, NULL,
         "folder of sbatch, scontrol, squeue and scancel (default: PATH)", 0, 0},
        {"slurm-poll-ms", "TIDE_SLURM_POLL_MS", TIDE_OPT_INT, &s->slurm_poll_ms, "2000",
         "how often squeue is asked about allocations tided waits for", 100, 3600000},
        {"slurm-pending-ms", "TIDE_SLURM_PENDING_MS", TIDE_OPT_INT, &s->slurm_pending_ms, "0",
         "an allocation tidectl grow asked for that is still pending after this long is cancelled "
         "(0: it waits as long as Slurm keeps it; a limit it can never pass cancels it at once)",
         0, 604800000LL},
        {"link-gbps", "TIDE_LINK_GBPS", TIDE_OPT_DOUBLE, &s->link_gbps, "80",
         "per-worker link speed (Gbit/s) for --dry-run time estimates", 0, 0},
        {"elastic-interval-ms", "TIDE_ELASTIC_INTERVAL_MS", TIDE_OPT_INT, &s->elastic_interval_ms,
         "300000",
         "least time between two automatic resizes of one job (tidectl bounds); failures' "
         "recoveries do not count",
         0, 86400000},
        {"elastic-margin", "TIDE_ELASTIC_MARGIN", TIDE_OPT_DOUBLE, &s->elastic_margin, "2",
         "an automatic grow needs the time it saves over the job's remaining steps to beat "
         "this many times its predicted downtime",
         0, 0},
        {"log", "TIDE_LOG", TIDE_OPT_STRING, &s->log, "warn", "log level: error, warn, info, debug",
         0, 0},
        {NULL, NULL, 0, NULL, NULL, NULL, 0, 0},
    };
    int code = tide_opts_main(opts, argc, argv, "tided");
    if (code >= 0)
        return code;
    code = check_settings(s);
    if (code >= 0)
        return code;
    tide_opts_log("tided", opts);
    return -1;
}

static void config_of(const struct settings *s, tide_server_config *cfg)
{
    tide_server_config_defaults(cfg);
    cfg->endpoint = s->endpoint;
    cfg->endpoint_file = s->endpoint_file;
    cfg->state_path = s->state;
    cfg->metrics = s->metrics;
    cfg->ompi_server = s->ompi_server;
    cfg->auth_dir = s->auth;
    cfg->heartbeat_ms = s->heartbeat_ms;
    cfg->miss_limit = (int)s->miss_limit;
    cfg->sync_full = s->sync_full;
    cfg->accept_state_loss = s->accept_state_loss;
    cfg->resize_timeout_ms = s->resize_timeout_ms;
    cfg->grace_ms = s->grace_ms;
    cfg->max_attempts = (int)s->max_attempts;
    cfg->offline_max_memory = s->offline_max_memory_bytes;
    cfg->offline_max_procs = (uint32_t)s->offline_max_procs;
    cfg->retry_backoff_ms = s->retry_backoff_ms;
    cfg->join_grace_ms = s->join_grace_ms;
    cfg->batch_ms = s->batch_ms;
    cfg->retention_ms = s->retention_ms;
    cfg->max_client_workers = (int)s->max_client_workers;
    cfg->status_page = (int)s->status_page;
    cfg->stall_ms = s->stall_ms;
    cfg->stall_factor = (int)s->stall_factor;
    cfg->max_client_mb = s->max_client_mb;
    cfg->link_bytes_per_s = s->link_gbps * 1e9 / 8.0;
    cfg->elastic_interval_ms = s->elastic_interval_ms;
    cfg->elastic_margin = s->elastic_margin;
    (void)tide_provider_parse(s->provider, &cfg->provider_slurm); /* checked by read_settings */
    cfg->slurm_bin = s->slurm_bin;
    cfg->slurm_poll_ms = s->slurm_poll_ms;
    cfg->slurm_pending_ms = s->slurm_pending_ms;
}

/* SIGINT and SIGTERM stop the loop; SIGPIPE and SIGXFSZ are errors of the call, not death. */
static void catch_signals(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    signal(SIGXFSZ, SIG_IGN); /* a file size limit is a write error (read-only mode), not death */
}

int main(int argc, char **argv)
{
    struct settings s = {0};
    int code = read_settings(&s, argc, argv);
    if (code >= 0)
        return code;
    tide_server_config cfg;
    config_of(&s, &cfg);

    /* a decision at 10^4 workers allocates and frees tens of MB: keep them for the next
       one instead of faulting fresh pages in each time */
    tide_alloc_retain(256u << 20);
    /* before the endpoint file appears (tide_server_new writes it): a SIGTERM sent as soon
       as it exists must stop tided cleanly, its state file closed, not kill it */
    catch_signals();
    tide_server_t *srv = NULL;
    tide_status rc = tide_server_new(&srv, &cfg);
    if (rc != TIDE_OK) {
        fprintf(stderr, "tided: %s\n", tide_last_error());
        return rc == TIDE_ERR_DENIED || rc == TIDE_ERR_INVALID || rc == TIDE_ERR_RANGE ? 2 : 1;
    }
    running = srv;
    if (stop_asked) /* signalled while it started */
        tide_server_stop(srv);
    rc = tide_server_run(srv);
    if (rc != TIDE_OK)
        fprintf(stderr, "tided: %s\n", tide_last_error());
    running = NULL;
    tide_server_destroy(&srv);
    return rc == TIDE_OK ? 0 : 1;
}
