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

/* Job j runs its first layout l (job ranks; ownership moves in): the offline work on the
 * job ranks pre[0..n_pre) is preempted, generation 1 committed, its members told. */
void tide__join_start_first(tide_server_t *s, tide_coord_job_t *j, tide_layout_t *l,
                            const int32_t *pre, size_t n_pre);

#endif /* TIDE_COORD_JOIN_H */
