/*
 * coordinator/workers: the messages workers send about themselves: register, heartbeats
 * (their own, or their host leader's for every rank of a host), bye, failure, bubble
 * measurements, liveness queries of their job's ranks and the reports of offline
 * attempts. A training program joining its job is join.c's; a switch's acks and dones
 * are reconf.c's and recovery.c's; checkpoints' checkpoint.c's. Event-loop thread only.
 */
#ifndef TIDE_COORD_WORKERS_H
#define TIDE_COORD_WORKERS_H

#include "coordinator/loop.h"

/* "register": a new worker, one back after leaving or failing, or a new process on a
 * known rank (whatever the old one held fails). Refused past the per-client limit or for a
 * pool or worker id of another key. */
void tide__on_register(tide_server_t *s, const tide_msg_t *m, const void *raw, size_t len);

/* "heartbeat": liveness, steps, generation, bubble and busy time; no reply unless the
 * worker is unknown, gone or fenced. */
void tide__on_heartbeat(tide_server_t *s, const tide_msg_t *m, const void *raw, size_t len);

/* "host_heartbeat": each entry counts as that rank's own heartbeat. */
void tide__on_host_heartbeat(tide_server_t *s, const tide_msg_t *m, const void *raw, size_t len);

/* "bye": the worker leaves; a member leaving with no switch pending ends its job. */
void tide__on_bye(tide_server_t *s, const tide_msg_t *m, const void *raw, size_t len);

/* "failure": the worker reports its own failure. */
void tide__on_failure(tide_server_t *s, const tide_msg_t *m, const void *raw, size_t len);

/* "bubble": a worker's measured bubble windows (logged). */
void tide__on_bubble(tide_server_t *s, const tide_msg_t *m, const void *raw, size_t len);

/* "liveness": which of the asked ranks of a job are alive members now. */
void tide__on_liveness(tide_server_t *s, const tide_msg_t *m, const void *raw, size_t len);

/* "offline_status": an offline attempt runs, ended, failed or was stopped. */
void tide__on_offline_status(tide_server_t *s, const tide_msg_t *m, const void *raw, size_t len);

#endif /* TIDE_COORD_WORKERS_H */
