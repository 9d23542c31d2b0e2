/*
 * coordinator/server: tided, what its program (tided.c) and tests start. One ZeroMQ
 * ROUTER socket for workers and tidectl, a ZAP handler for CURVE when --auth is given, a
 * tiny HTTP listener for Prometheus metrics, and timers (failure detection,
 * reconfiguration retransmission and deadlines), all on one thread driven by zmq_poll
 * (the core: loop.c; the handler modules it dispatches to are wired in server.c). Every
 * batch of requests is applied to the in-memory state inside one SQLite transaction that
 * commits before any reply of the batch is sent.
 *
 * Workload: ~10^4 heartbeats per second (no reply, no disk write, gathered into
 * batches of --batch-ms so the loop wakes ~500 times a second, not 10^4), occasional
 * admin requests, rare reconfigurations.
 */
#ifndef TIDE_COORD_SERVER_H
#define TIDE_COORD_SERVER_H

#include <stdint.h>

#include <tide/status.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tide_server tide_server_t;

typedef struct tide_server_config {
    const char *endpoint;      /* ZeroMQ endpoint to bind, e.g. tcp://127.0.0.1:5555 */
    const char *endpoint_file; /* if set, the bound endpoint is written there (for port *) */
    const char *state_path;    /* SQLite state file */
    const char *metrics;       /* HOST:PORT for Prometheus text, or NULL/"" for none */
    const char *auth_dir; /* CURVE key directory (core/keyfile.h; docs/operator.md "Key files"), or NULL */
    int64_t heartbeat_ms; /* expected worker heartbeat period, ms */
    int miss_limit;       /* missed heartbeats before a worker is failed */
    int sync_full;        /* SQLite synchronous=FULL (else NORMAL) */
    int accept_state_loss; /* start from a state file that lost acknowledged commits */
    int64_t resize_timeout_ms; /* a reconfiguration not done by then falls back, ms */
    int64_t grace_ms;          /* SIGTERM -> SIGKILL grace given to preempted offline work, ms */
    double link_bytes_per_s;   /* per-worker link speed assumed by --dry-run estimates */
    int max_attempts;          /* failed offline attempts before the job is marked failed */
    uint64_t offline_max_memory; /* host memory of an offline command's attempt when its submit
                                    gives none, bytes; 0: no limit */
    uint32_t offline_max_procs;  /* processes of an offline command's attempt when its submit
                                    gives none; 0: no limit */
    int64_t retry_backoff_ms;  /* a failed attempt's retry waits this, doubled per failure
                                  (at most 60 s), ms */
    int64_t join_grace_ms;     /* a worker that registered and joined no job is offered
                                  offline work after this long, ms */
    const char *ompi_server;   /* the ompi-server URI pools that join a running job must be
                                  launched with (mpirun --ompi-server), or NULL; shown by status */
    int64_t batch_ms;       /* min time between loop passes that did not fill a batch, ms: requests
                               arriving meanwhile are handled together (one wakeup, not one each) */
    int64_t retention_ms;   /* a worker that left (bye) or failed is forgotten this long after,
                               once no job refers to it (its row leaves the state file), ms */
    int max_client_workers; /* live workers one client may have registered (with auth: one
                               key; without: one connection), and the ranks one pool may
                               declare */
    int status_page;        /* rows of one status reply at most (tidectl follows the pages) */
    int64_t stall_ms;       /* a step a rank has been inside longer than this (and than
                               stall_factor x the job's recent step time) is stalled, ms;
                               0: not watched */
    int stall_factor;       /* see stall_ms */
    int64_t max_client_mb;  /* MiB one connection may have sent past its last message read
                               (libzmq holds them); 0: not watched */
    int64_t elastic_interval_ms; /* least time between two policy changes of one job, ms */
    double elastic_margin;       /* a policy grow saves more than this x its downtime */
    int provider_slurm;     /* nodes come from Slurm (--provider slurm): grow submits
                               allocations, pools of allocations are grown onto */
    const char *slurm_bin;  /* folder of sbatch, scontrol, squeue, scancel; NULL: PATH */
    int64_t slurm_poll_ms;  /* how often an awaited allocation is asked about, ms */
    int64_t slurm_pending_ms; /* an allocation still pending after this long is cancelled
                                 (0: it waits as long as Slurm keeps it), ms */
} tide_server_config;

/* Fills cfg with the defaults tided documents. */
void tide_server_config_defaults(tide_server_config *cfg);

/*
 * Opens the state file (reloading state), loads keys, binds the sockets.
 * Refuses a non-loopback endpoint without auth_dir. Caller owns *out.
 */
tide_status tide_server_new(tide_server_t **out, const tide_server_config *cfg);

/* Runs the event loop until tide_server_stop; main thread. */
tide_status tide_server_run(tide_server_t *s);

/* Asks the loop to return; async-signal-safe (one store). */
void tide_server_stop(tide_server_t *s);

/* The endpoint actually bound (port resolved); valid as long as s. */
const char *tide_server_endpoint(const tide_server_t *s);

/* Closes sockets and the state file; frees *self_p and sets it to NULL; NULL is fine. */
void tide_server_destroy(tide_server_t **self_p);

#ifdef __cplusplus
}
#endif

#endif /* TIDE_COORD_SERVER_H */
