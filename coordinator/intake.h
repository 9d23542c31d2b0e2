/*
 * coordinator/intake: what one client's unread bytes cost tided. libzmq keeps a message's
 * frames until its last one arrives and limits only each frame's size, so one client
 * sending many frames of one buffer (shared on its side: it holds one copy) made tided
 * hold gigabytes. tided cannot see inside libzmq's queues, but it sees each TCP
 * connection: the bytes its kernel received from it (TCP_INFO) since the client's last
 * message tided read are what libzmq holds for it. A connection past --max-client-mb of
 * them, or one whose unfinished message saw tided's resident memory grow by that much
 * (frames of a few bytes cost libzmq 64 each), or one that sent a message of more than
 * TIDE__INTAKE_FRAMES_MAX frames, is cut (shutdown: libzmq drops its unfinished message
 * and the client reconnects). Event-loop thread only; a sweep costs one getsockopt per
 * open connection, and runs when tided's resident memory grew or every 5 s.
 */
#ifndef TIDE_COORD_INTAKE_H
#define TIDE_COORD_INTAKE_H

#include <stdint.h>

#include "core/error.h"

#define TIDE__INTAKE_FRAMES_MAX 1024 /* frames of one message: tide's messages have 1 to 3 */

typedef struct tide__intake tide__intake;

/* Watches router's connections (a monitor socket in zctx); limit: bytes one connection may
   have sent past its last message read (0: not watched, *out NULL). Caller destroys. */
tide_status tide__intake_new(tide__intake **out, void *zctx, void *router, uint64_t limit);

/* Closes the monitor, frees *self_p and sets it NULL; NULL is fine. */
void tide__intake_destroy(tide__intake **self_p);

/* The monitor socket to poll for connection events (NULL: none). */
void *tide__intake_socket(const tide__intake *in);

/* Takes the waiting connection events (accepted, closed). Never blocks. */
void tide__intake_events(tide__intake *in);

/* A message was read from connection fd (ZMQ_SRCFD) with `frames` frames. */
void tide__intake_read(tide__intake *in, int fd, int frames);

/* Checks every connection against the limit (at most once per 20 ms) and cuts the ones
   past it; returns how many it cut. */
uint64_t tide__intake_check(tide__intake *in, uint64_t now_ns);

/* Connections cut since tided started. */
uint64_t tide__intake_cut(const tide__intake *in);

#endif /* TIDE_COORD_INTAKE_H */
