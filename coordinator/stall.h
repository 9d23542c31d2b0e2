/*
 * coordinator/stall: jobs whose steps stop advancing while every rank still reaches tided
 * (a data path cut between hosts, a collective that never completes). Each rank reports in
 * its heartbeat how long the step it is inside has run; a step past the job's stall bound
 * (the larger of --stall-ms and --stall-factor x the slowest member's recent step time)
 * gives a `stalled` event naming the ranks and their hosts. A job spread over hosts is then
 * recovered on the host holding the most of it: the other hosts' members are failed (and
 * so fenced), and recovery (recovery.c) goes on over the survivors, or rolls back, or
 * stalls the job with its reason. Event-loop thread only; a check costs the running
 * jobs' members, once a second.
 */
#ifndef TIDE_COORD_STALL_H
#define TIDE_COORD_STALL_H

#include "coordinator/loop.h"

/* Heartbeat hook: what a member's heartbeat says of its step in progress and its recent
   step time (in_step_ms 0: outside a step). */
void tide__stall_heartbeat(tide_server_t *s, tide_coord_worker_t *w, double in_step_ms,
                           double step_ms);

/* Tick hook: reports (once per job, generation and step) a stalled running job, and fences
   all but its largest host when it spans several. */
void tide__stall_tick(tide_server_t *s);

#endif /* TIDE_COORD_STALL_H */
