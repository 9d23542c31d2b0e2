/*
 * coordinator/resize: an operator's resize of an online job. The request is checked
 * against the job, placed by policy.h (tide_policy_place: which workers, which
 * coordinates, what offline work is preempted), estimated from reshard's plan totals
 * (bytes moved, cross-host bytes, the time at --link-gbps; --dry-run stops there) and
 * started as a switch (reconf.c). Admin keys only. Event-loop thread only.
 */
#ifndef TIDE_COORD_RESIZE_H
#define TIDE_COORD_RESIZE_H

#include "coordinator/loop.h"

/* "resize": replies with the placed layout and the plan's estimate; unless a dry run,
 * the switch then starts. */
void tide__on_resize(tide_server_t *s, const tide_msg_t *m, const void *raw, size_t len);

#endif /* TIDE_COORD_RESIZE_H */
