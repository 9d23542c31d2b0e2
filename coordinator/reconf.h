/*
 * coordinator/reconf: the switch of an online job to a new layout (resize, drain, join,
 * release, recovery), tided's side of the protocol in reconf.c's header comment: the
 * intent recorded, the layout and prepare sent, the switch step chosen from the acks, the
 * commit, the generation committed when every participant is done, or abandoned. What
 * starts a switch is decided elsewhere (resize.c, operators.c, recovery.c through
 * policy.h); what a failure during one means is recovery.c's. Event-loop thread only.
 */
#ifndef TIDE_COORD_RECONF_H
#define TIDE_COORD_RECONF_H

#include "coordinator/loop.h"

/*
 * Starts a reconfiguration of j to layout (ownership moves in): preempts the
 * offline work on the ranks in preempt[], records the intent, sends layout +
 * prepare to every participant. ckpt: a recovery that rolls back to this checkpoint
 * (copied; its members load it instead of resharding from the old layout), else NULL.
 */
tide_status tide__reconf_start(tide_server_t *s, tide_coord_job_t *j, tide_layout_t *layout,
                               const int32_t *preempt, size_t n_preempt, int recover,
                               const char *reason, const tide_coord_ckpt *ckpt);

/* Makes j's pending reconfiguration release the connected pools its layout holds no rank
   of (not for a recovery or a join): every live rank of the job's connected pools takes
   part, listed on the side that stays or the side that leaves (tide_reconf_set_leave).
   TIDE_ERR_INVALID when a rank of the new layout is no live rank of a connected pool. */
tide_status tide__reconf_setup_leave(tide_server_t *s, tide_coord_job_t *j);

/* The job and participant index (*idx) of worker w's report `what` about generation gen
   of job `name`; NULL after an error reply (no such job, generation not pending, w no
   participant). */
tide_coord_job_t *tide__reconf_report(tide_server_t *s, tide_coord_worker_t *w, const char *name,
                                      uint64_t gen, long *idx, const char *what);

/* Participant idx of j's pending reconfiguration reported done (in the commit phase) and
   sent bytes: when every live participant is done, the generation is committed; else,
   from now on, it can no longer be abandoned. */
void tide__reconf_done(tide_server_t *s, tide_coord_job_t *j, long idx, uint64_t bytes,
                       double ms);

/* Commits j's pending generation over its live participants (workers, pools, layout,
   step, event); no reconfiguration is pending after. */
void tide__reconf_commit(tide_server_t *s, tide_coord_job_t *j);

/* Abandons j's pending reconfiguration (abort to its participants, reserved workers freed,
   event): j stays on its committed layout. Whether j then recovers is recovery.c's. */
void tide__reconf_abandon(tide_server_t *s, tide_coord_job_t *j, const char *reason);

/* Resends the current phase's message to the live participants of j's pending
   reconfiguration that have not answered (all of them: only_unanswered 0). */
void tide__reconf_resend(tide_server_t *s, tide_coord_job_t *j, int only_unanswered);

/* Sends the current phase's messages to participant w of j (register/resend). */
void tide__reconf_resend_to(tide_server_t *s, tide_coord_job_t *j, tide_coord_worker_t *w);

/* Tells worker w of a pool of j that left the job (at generation pools[p].left) that it
   is released: its program may finish. */
void tide__send_release(tide_server_t *s, const tide_coord_job_t *j, const tide_coord_worker_t *w);

/* "prepare_ack" from a participant: counted; when every live participant acked, the
   switch step is chosen (policy.h) and the commit sent. */
void tide__on_prepare_ack(tide_server_t *s, const tide_msg_t *m, const void *raw, size_t len);

/* "join_port" from the accepting side's first rank of a join: relays the port name to the
   joining pool's ranks. */
void tide__on_join_port(tide_server_t *s, const tide_msg_t *m, const void *raw, size_t len);

/* Load hook: a pending reconfiguration read from the state file gets its full deadline,
   its participants' liveness and, when what was not stored (a join's ranks, a release's
   lists) cannot be rebuilt, an immediate deadline. */
void tide__reconf_reload(tide_server_t *s);

#endif /* TIDE_COORD_RECONF_H */
