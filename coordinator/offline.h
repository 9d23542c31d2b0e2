/*
 * coordinator/offline: the offline scheduler. Queued offline work goes to idle workers by
 * priority (policy.h's tide_policy_assign), --bubbles plugin work into the pipeline
 * bubbles of online workers (tide_policy_bubble_pick); work is preempted when an online
 * job takes its worker, and requeued when it stops, its worker leaves, or it fails (then
 * with a backoff, at most max_attempts times). Submitting and cancelling are operators'
 * requests (operators.c); attempts' reports are workers' (workers.c). Event-loop thread.
 */
#ifndef TIDE_COORD_OFFLINE_H
#define TIDE_COORD_OFFLINE_H

#include "coordinator/loop.h"

/*
 * Offline job j leaves its worker w_id. failed: the attempt's own failure (the command
 * exited nonzero or could not start): it counts against max_attempts, and the retry
 * waits its backoff and prefers another worker. Otherwise (preempted, the worker left,
 * failed or drains) the job is requeued as it was: no attempt is used up.
 */
void tide__offline_requeue(tide_server_t *s, tide_coord_job_t *j, int32_t w_id, int failed,
                           const char *why);

/* Tells w to stop offline job oj (SIGTERM, its grace, then SIGKILL). */
void tide__offline_send_preempt(tide_server_t *s, const tide_coord_job_t *oj,
                                const tide_coord_worker_t *w);

/* Worker w (of job j's pool; NULL is fine) is given to j's generation gen: the offline
   job it runs, if any, is preempted (the worker is told) and requeued, and w is idle in
   tided's books at once. */
void tide__preempt_for(tide_server_t *s, const tide_coord_job_t *j, tide_coord_worker_t *w,
                       uint64_t gen);

/* Online worker w reported bubble ns of bubbles: a --bubbles job waiting for measured
 * bubbles may fit now. */
void tide__offline_bubbles_seen(tide_server_t *s, const tide_coord_worker_t *w, uint64_t bubble);

/* Scheduling hook: offers idle workers to queued offline work by priority, then bubbles
 * to plugins. */
void tide__offline_backfill(tide_server_t *s);

#endif /* TIDE_COORD_OFFLINE_H */
