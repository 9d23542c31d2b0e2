/*
 * tided: the tide coordinator daemon. This is the entry point: settings come
 * from flags with TIDE_* environment defaults, are logged once, then the event
 * loop runs until SIGINT/SIGTERM.
 */
#include <stdio.h>
#include <stdlib.h>

#include "core/error.h"
#include "core/log.h"
#include "core/opts.h"

struct settings {
    const char *endpoint;
    const char *state;
    const char *metrics;
    const char *auth;
    const char *log;
    long long heartbeat_ms;
    long long miss_limit;
};

int main(int argc, char **argv)
{
    struct settings s = {0};
    const tide_opt opts[] = {
        {"endpoint", "TIDE_ENDPOINT", TIDE_OPT_STRING, &s.endpoint, "tcp://127.0.0.1:5555",
         "ZeroMQ endpoint to bind (non-loopback needs --auth)", 0, 0},
        {"state", "TIDE_STATE", TIDE_OPT_STRING, &s.state, "./tide-state.db",
         "SQLite state file (WAL mode)", 0, 0},
        {"metrics", "TIDE_METRICS", TIDE_OPT_STRING, &s.metrics, NULL,
         "serve Prometheus metrics on HOST:PORT", 0, 0},
        {"auth", "TIDE_AUTH", TIDE_OPT_STRING, &s.auth, NULL,
         "directory of CURVE keys and roles (enables CURVE)", 0, 0},
        {"heartbeat-ms", "TIDE_HEARTBEAT_MS", TIDE_OPT_INT, &s.heartbeat_ms, "1000",
         "worker heartbeat period", 10, 600000},
        {"miss-limit", "TIDE_MISS_LIMIT", TIDE_OPT_INT, &s.miss_limit, "3",
         "missed heartbeats before a worker is declared failed", 1, 1000},
        {"log", "TIDE_LOG", TIDE_OPT_STRING, &s.log, "warn", "log level: error, warn, info, debug",
         0, 0},
        {NULL, NULL, 0, NULL, NULL, NULL, 0, 0},
    };
    int help = 0;
    tide_status rc = tide_opts_parse(opts, argc, argv, NULL, &help);
    if (rc != TIDE_OK) {
        fprintf(stderr, "tided: %s\n", tide_last_error());
        return 2;
    }
    if (help) {
        tide_opts_usage(stdout, "tided", "[options]", opts);
        return 0;
    }
    fprintf(stderr, "tided: the coordinator event loop is not part of this build yet\n");
    return 1;
}
