/*
 * coordinator/checkpoint: what tided knows of an online job's checkpoints (checkpoint.c):
 * the complete ones its first member reports ("saved"), kept so that a recovery no
 * survivor can serve rolls back to the last (recovery.c), and an operator's request for
 * one ("checkpoint", at a step policy.h picks). Event-loop thread only.
 */
#ifndef TIDE_COORD_CHECKPOINT_H
#define TIDE_COORD_CHECKPOINT_H

#include "coordinator/loop.h"

/* "saved" from a worker: a checkpoint of its job completed (recorded for recoveries that
   no survivor can serve) or failed on it (an event). */
void tide__on_saved(tide_server_t *s, const tide_msg_t *m, const void *raw, size_t len);

/* "checkpoint" from tidectl: proposes a step to the job's ranks (policy.h) and answers
   once they agreed on one none of its members had reached (ok naming it), or with an error
   (refused, or no step agreed: see tide__on_save_ack). Refused BUSY while the job's ranks
   hold TIDE_PROTO_SAVES_MAX requests whose steps they have not all completed (a rank would
   refuse the next after the operator was told it is scheduled). The answer comes later,
   from another request's handler or the tick. */
void tide__on_checkpoint(tide_server_t *s, const tide_msg_t *m, const void *raw, size_t len);

/* "save_ack" from a worker: the steps it had completed when it heard a proposal. Once every
   live member answered: GO when none had reached the step, else the request is proposed
   again further on (at most TIDE__CKREQ_ROUNDS times), else it fails. */
void tide__on_save_ack(tide_server_t *s, const tide_msg_t *m, const void *raw, size_t len);

/* Tick hook: a request whose members did not all answer within TIDE__CKREQ_WAIT_MS, or
   whose job stopped training, fails (error answer, checkpoint_failed event, DROP). */
void tide__ckpt_tick(tide_server_t *s);

/* Frees the requests being agreed (their operators get no answer); at tided's end. */
void tide__ckpt_close(tide_server_t *s);

#define TIDE__CKREQ_MAX     8    /* requests being agreed at once, over all jobs */
#define TIDE__CKREQ_ROUNDS  4    /* proposals of one request before it fails */
#define TIDE__CKREQ_WAIT_MS 3000 /* a proposal's answers, at most (tidectl waits 5 s) */

#endif /* TIDE_COORD_CHECKPOINT_H */
