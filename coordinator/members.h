/*
 * coordinator/members: who holds what in an online job, shared by the handler modules:
 * the worker of a job rank, the job's live members, the candidate workers a decision
 * (policy.h) chooses from, the job's tensors, its layout as a message, and releasing what
 * an ended job holds. Event-loop thread only; costs are the job's size (through the
 * (pool, rank) index), not the worker table's, unless said otherwise.
 */
#ifndef TIDE_COORD_MEMBERS_H
#define TIDE_COORD_MEMBERS_H

#include "coordinator/loop.h"
#include "coordinator/policy.h"

/* The worker holding job rank `rank` of job j (through its pools), or NULL. */
tide_coord_worker_t *tide__job_worker(tide_server_t *s, const tide_coord_job_t *j, int32_t rank);

/* Members of online job j still alive (held by it and not failed). O(worker table). */
size_t tide__live_members(const tide_server_t *s, const tide_coord_job_t *j);

/* A copy of layout l of job j (pool ranks) naming each member by tided's worker id
 * instead, the id operators see (tidectl, events, metrics): for display and for messages
 * that name workers. Caller destroys *out. TIDE_ERR_NOT_FOUND when a rank of l has no
 * registered worker. */
tide_status tide__layout_worker_ids(tide_server_t *s, const tide_coord_job_t *j,
                                    const tide_layout_t *l, tide_layout_t **out);

/* Starts a layout message of job j for worker w: job, w's pool base and the job's ranks
   (layout and prev left for the caller). */
void tide__layout_msg_init(tide_msg_t *m, const tide_coord_job_t *j, const tide_coord_worker_t *w);

/* Sends w the job's committed layout (no previous one). */
void tide__send_layout(tide_server_t *s, const tide_coord_job_t *j, const tide_coord_worker_t *w);

/* Fills candidate workers for j (members alive, idle and offline joined workers), their
   ranks the job ranks; joining: also the ranks of pools that joined j but are not yet
   connected (a resize may connect one; recovery never does). Caller owns *out. */
tide_status tide__candidates(tide_server_t *s, const tide_coord_job_t *j, int joining,
                             tide_policy_worker **out, size_t *n);

/*
 * The tensors job j joined with, rebuilt from its stored join message;
 * *out = NULL when it joined without tensors. Caller owns *out.
 */
tide_status tide__job_collection(const tide_coord_job_t *j, tide_collection_t **out);

/* Releases what online job j still holds (a pending reconfiguration, its workers) as it
 * ends in state `to`; asks for a scheduling pass. O(worker table). */
void tide__job_release(tide_server_t *s, tide_coord_job_t *j, tide_jstate to);

#endif /* TIDE_COORD_MEMBERS_H */
