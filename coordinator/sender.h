/*
 * coordinator/sender: the worker behind a worker's message. With --auth a worker id
 * belongs to the key that registered it; a process tided gave up on while it held part of
 * an online job is fenced (told so, never taken back); every other message renews the
 * worker's liveness and route. Used by every handler of worker messages. Event-loop
 * thread only.
 */
#ifndef TIDE_COORD_SENDER_H
#define TIDE_COORD_SENDER_H

#include "coordinator/loop.h"

/* The sending worker by id, checked against the sender's key and touched; NULL after an
 * error (or fenced) reply. */
tide_coord_worker_t *tide__sender(tide_server_t *s, int32_t id, tide_msg_type_t type);

/* 1 when the request's key may speak for w (always without --auth); else replies the
 * refusal and returns 0. */
int tide__may_speak(tide_server_t *s, const tide_coord_worker_t *w, tide_msg_type_t type);

/* 1 when w is a process tided gave up on while it held a part of an online job that then
 * went on without it: it may still hold that generation's communicators. */
int tide__is_fenced(const tide_coord_worker_t *w);

/* Answers a message of fenced worker w with "fenced" (never with a request to register
 * again); the first time in this tided process, an event says so. */
void tide__tell_fenced(tide_server_t *s, tide_coord_worker_t *w);

/* Marks w seen now and routes its messages to the request's connection. */
void tide__touch(tide_server_t *s, tide_coord_worker_t *w);

#endif /* TIDE_COORD_SENDER_H */
