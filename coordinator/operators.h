/*
 * coordinator/operators: what an operator asks to change with tidectl, resizes aside
 * (resize.c) and checkpoints aside (checkpoint.c): submit and cancel offline work (the
 * offline scheduler, offline.c, runs it), cancel an online job whose ranks are all gone,
 * drain a worker (a job on it moves off by a switch planned by policy.h's
 * tide_policy_drain). Admin keys only (proto.h's role table). Event-loop thread only.
 */
#ifndef TIDE_COORD_OPERATORS_H
#define TIDE_COORD_OPERATORS_H

#include "coordinator/loop.h"

/* "submit": queues an offline job (command or plugin). */
void tide__on_submit(tide_server_t *s, const tide_msg_t *m, const void *raw, size_t len);

/* "cancel": stops offline work, or forgets an online job none of whose ranks lives. */
void tide__on_cancel(tide_server_t *s, const tide_msg_t *m, const void *raw, size_t len);

/* "drain": the worker takes no new work; what it runs moves off it. */
void tide__on_drain(tide_server_t *s, const tide_msg_t *m, const void *raw, size_t len);

#endif /* TIDE_COORD_OPERATORS_H */
