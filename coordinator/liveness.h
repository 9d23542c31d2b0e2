/*
 * coordinator/liveness: which workers tided still hears from. A worker silent for
 * miss_limit heartbeat periods is declared failed (recovery.c takes it from there), judged
 * at the time the ROUTER queue was last seen empty, never by tided's own lateness: when
 * tided itself did not run on time, every worker gets one more failure timeout. Workers
 * that left or failed are forgotten after the retention period once no job refers to
 * them. Event-loop thread only.
 */
#ifndef TIDE_COORD_LIVENESS_H
#define TIDE_COORD_LIVENESS_H

#include "coordinator/loop.h"

/* Tick hook: declares failed the workers silent past the failure timeout. */
void tide__liveness_tick(tide_server_t *s);

/* Tick hook: forgets, once a second, a slice of the workers gone past the retention
 * period that no job refers to (their rows leave the state file). */
void tide__retention_tick(tide_server_t *s);

/* Load hook: gives the loaded workers one failure timeout to be heard from, rebuilds the
 * jobs' join counts and starts the retention clock of workers gone before it was kept. */
void tide__liveness_reload(tide_server_t *s);

#endif /* TIDE_COORD_LIVENESS_H */
