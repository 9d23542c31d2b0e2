/*
 * coordinator/recovery: what tided does when a worker is lost. The worker is marked down
 * (its offline work requeued, its process fenced from an online job that goes on without
 * it); its job then either falls back from a switch it was part of, keeps a generation
 * some participants already switched to, or recovers: a new layout over the survivors
 * (policy.h's tide_policy_recover), or, when no survivor holds part of the state, a
 * rollback to the job's last checkpoint (tide_policy_rollback); with neither, the job
 * stalls (and its survivors are halted when the state is lost for good). The switch
 * itself is reconf.c's; detecting the loss is liveness.c's (heartbeats), workers.c's
 * (bye, failure, a restarted process) and this file's tick (switch deadlines).
 * Event-loop thread only.
 */
#ifndef TIDE_COORD_RECOVERY_H
#define TIDE_COORD_RECOVERY_H

#include "coordinator/loop.h"

/*
 * Marks w gone with an event of kind ("worker_failed", "worker_left"), requeues its
 * offline work and clears its job, without touching that job's layout or switch; returns
 * the online job id it held (0: none). The caller deals with the job
 * (tide__job_lost_worker).
 */
int64_t tide__worker_down(tide_server_t *s, tide_coord_worker_t *w, const char *kind,
                          const char *reason);

/* Worker w, which held a coordinate of or took part in j's switch, is gone (j NULL or not
 * online: nothing): the switch it took part in fails over, or j recovers without it. */
void tide__job_lost_worker(tide_server_t *s, tide_coord_job_t *j, tide_coord_worker_t *w,
                           const char *reason);

/* Makes a worker leave whatever it does and marks it failed (reason for the event):
 * tide__worker_down, then tide__job_lost_worker. */
void tide__worker_failed(tide_server_t *s, tide_coord_worker_t *w, const char *reason);

/* A burst of failures (a host's workers silent together, a partition's side fenced):
 * from tide__failures_begin to the matching tide__failures_end, tide__worker_failed marks
 * workers failed at once but leaves their jobs alone; at the end each job recovers (or
 * falls back) once, from all its losses. Nests; loop thread. */
void tide__failures_begin(tide_server_t *s);
void tide__failures_end(tide_server_t *s);

/* "done" from a participant of a switch: success counts toward the commit (reconf.c); a
 * participant that could not switch makes the switch fall back, or fails (when others
 * switched already); a checkpoint that would not load is dropped and the next one tried. */
void tide__on_done(tide_server_t *s, const tide_msg_t *m, const void *raw, size_t len);

/* Tick hook: a switch past its deadline falls back (or, once switched, its silent
 * participants are failed and it is kept); others get their retransmissions. */
void tide__recovery_tick(tide_server_t *s);

/* Scheduling hook: stalled jobs try to recover again (workers changed). */
void tide__recovery_retry_stalled(tide_server_t *s);

#endif /* TIDE_COORD_RECOVERY_H */
