/*
 * coordinator/sender: who a worker's message comes from (see sender.h).
 */
#include <stdio.h>
#include <string.h>

#include "core/log.h"
#include "coordinator/sender.h"

void tide__touch(tide_server_t *s, tide_coord_worker_t *w)
{
    tide_coord_worker_seen(s->st, w, s->now_ns);
    if (w->rid_len != s->req.rid_len || memcmp(w->rid, s->req.rid, s->req.rid_len) != 0) {
        memcpy(w->rid, s->req.rid, s->req.rid_len);
        w->rid_len = s->req.rid_len;
    }
    w->delim = s->req.delim;
}

/*
 * With --auth, a worker id belongs to the key that registered it: another key
 * (even a worker key of the same pool name) may not speak for it. Refused and
 * logged; nothing in the message is acted on.
 */
int tide__may_speak(tide_server_t *s, const tide_coord_worker_t *w, tide_msg_type_t type)
{
    if (!s->auth_on || strcmp(w->owner, s->req.who) == 0)
        return 1;
    s->st->counters.denied++;
    if (w->owner[0] == '\0') {
        /* state written by a tided without --auth: the worker binds its key by registering */
        tide__reply_error(s, TIDE_ERR_NOT_FOUND,
                          "worker %d is not bound to a key yet: register again", w->id);
        return 0;
    }
    TIDE_WARN_LIMITED("auth", "refused '%s' for worker %d from %s: that worker id belongs to %s",
                      tide_msg_type_name(type), w->id, s->req.who, w->owner);
    tide__reply_error(s, TIDE_ERR_DENIED,
                      "worker %d was registered with another key; %s may only speak for the "
                      "workers it registered",
                      w->id, s->req.who);
    return 0;
}

int tide__is_fenced(const tide_coord_worker_t *w)
{
    return w->state == TIDE_WS_FAILED && w->fenced_job != 0;
}

void tide__tell_fenced(tide_server_t *s, tide_coord_worker_t *w)
{
    const tide_coord_job_t *j = tide_coord_job_get(s->st, w->fenced_job);
    tide_msg_t m;
    tide_msg_init(&m, TIDE_MSG_FENCED);
    m.u.fenced.worker = w->id;
    snprintf(m.u.fenced.job, sizeof m.u.fenced.job, "%s", j != NULL ? j->name : "");
    m.u.fenced.gen = j != NULL ? j->generation : 0;
    snprintf(m.u.fenced.reason, sizeof m.u.fenced.reason,
             "worker %d (%s rank %d) was declared failed while it held a part of job %s, which "
             "went on without it (generation %llu now): this process must not touch its old "
             "peers again and must exit; a new process on its rank may register",
             w->id, w->pool, w->rank, j != NULL ? j->name : "?",
             (unsigned long long)(j != NULL ? j->generation : 0));
    tide__reply(s, &m);
    if (!w->fence_told) {
        w->fence_told = 1;
        tide__event(s, j != NULL ? j->name : "", "worker_fenced",
                    "worker %d (%s rank %d, pid %d) spoke again after job %s went on without it: "
                    "told it was fenced; it stays failed",
                    w->id, w->pool, w->rank, w->pid, j != NULL ? j->name : "?");
    }
}

tide_coord_worker_t *tide__sender(tide_server_t *s, int32_t id, tide_msg_type_t type)
{
    tide_coord_worker_t *w = tide_coord_worker_get(s->st, id);
    if (w == NULL) {
        tide__reply_error(s, TIDE_ERR_NOT_FOUND,
                          "unknown worker %d: register first (tided may have a new state file)",
                          id);
        return NULL;
    }
    if (!tide__may_speak(s, w, type))
        return NULL;
    if (tide__is_fenced(w)) {
        tide__tell_fenced(s, w);
        return NULL;
    }
    tide__touch(s, w);
    return w;
}
