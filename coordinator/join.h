/*
 * coordinator/join: a training program's ranks joining their online job. The first
 * launch's join creates the job (or runs it again under an ended job's name) and, once
 * enough ranks joined, places its first layout (policy.h's tide_policy_first_layout); a
 * pool launched later joins as idle ranks that a resize connects (reconf.c). Event-loop
 * thread only.
 */
#ifndef TIDE_COORD_JOIN_H
#define TIDE_COORD_JOIN_H

#include "coordinator/loop.h"

/* "join" from a worker: its program runs the online job m->job; raw/len the message as
 * received (the job keeps the first launch's, its tensors). */
void tide__on_join(tide_server_t *s, const tide_msg_t *m, const void *raw, size_t len);

#endif /* TIDE_COORD_JOIN_H */
