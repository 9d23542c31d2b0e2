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

/* "checkpoint" from tidectl: asks the members of the job's layout to save at a step they
   have not reached yet; replies ok naming it, or an error. */
void tide__on_checkpoint(tide_server_t *s, const tide_msg_t *m, const void *raw, size_t len);

#endif /* TIDE_COORD_CHECKPOINT_H */
