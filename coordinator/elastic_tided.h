/*
 * coordinator/elastic_tided: the elastic policy (elastic.h) inside tided. An operator
 * declares an online job's bounds, priority, pin and length ("elastic" from tidectl bounds,
 * priority, pin, unpin); tided then runs the policy whenever capacity may have changed (a
 * scheduling pass: a pool joined, a worker failed or came back, a job ended or a switch
 * committed) and on a timer (rate limits expire), over a view of the cluster built from its
 * worker table: one GPU per (host, device), a job's ranks mapped onto them. Each decision
 * starts as a switch through the path an operator's resize takes (reconf.c), with an event
 * that says why. An operator's resize of a managed job holds it at that size until its
 * bounds are declared again or it is unpinned. Jobs with no bounds are never touched.
 * Event-loop thread only.
 */
#ifndef TIDE_COORD_ELASTIC_TIDED_H
#define TIDE_COORD_ELASTIC_TIDED_H

#include "coordinator/loop.h"

/* "elastic": changes a job's bounds, priority, pin or steps; refused with the reason and
 * nothing changed when the result is not a valid declaration. Admin keys only. */
void tide__on_elastic(tide_server_t *s, const tide_msg_t *m, const void *raw, size_t len);

/* The scheduling pass's hook: one run of the policy, its decisions started. */
void tide__elastic_pass(tide_server_t *s);

/* The tick's hook: a run when the last one is a second old and some job is managed (the
 * policy's rate limits expire with time, not with messages). */
void tide__elastic_tick(tide_server_t *s);

/* An operator's resize of j started: a managed job is held at the operator's size. */
void tide__elastic_operator_resized(tide_server_t *s, tide_coord_job_t *j);

#endif /* TIDE_COORD_ELASTIC_TIDED_H */
