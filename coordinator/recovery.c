/*
 * coordinator/recovery: a lost worker and its job (see recovery.h). The order of the
 * decisions in recover(): a layout over the survivors (tide_policy_recover); whether
 * the survivors still hold every byte it needs (tide_policy_recovery_feasible); when too
 * few workers are left, whether waiting for more could ever help; when no survivor holds
 * the lost state and the job reported a checkpoint, a rollback to it
 * (tide_policy_rollback); else the job stalls.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/clock.h"
#include "core/error.h"
#include "core/log.h"
#include "coordinator/members.h"
#include "coordinator/offline.h"
#include "coordinator/policy.h"
#include "coordinator/reconf.h"
#include "coordinator/recovery.h"
#include "coordinator/sender.h"

static void recover(tide_server_t *s, tide_coord_job_t *j, const char *reason);
static void participant_failed(tide_server_t *s, tide_coord_job_t *j, tide_coord_worker_t *w);
static void fall_back(tide_server_t *s, tide_coord_job_t *j, const char *reason);
static void keep_switched(tide_server_t *s, tide_coord_job_t *j, const char *reason);

/* ---- a worker is lost ------------------------------------------------------------------------ */

int64_t tide__worker_down(tide_server_t *s, tide_coord_worker_t *w, const char *kind,
                          const char *reason)
{
    if (tide_coord_worker_gone(w))
        return 0;
    int left = strcmp(kind, "worker_left") == 0;
    const tide_coord_job_t *held = w->job ? tide_coord_job_get(s->st, w->job) : NULL;
    /* a failure while holding a part of an online job fences this process: the job goes
       on without it, and it is told so when it speaks again instead of rejoining the pool */
    if (!left && held != NULL && held->kind == TIDE_CJOB_ONLINE)
        w->fenced_job = held->id;
    w->state = left ? TIDE_WS_LEFT : TIDE_WS_FAILED;
    w->gone_ms = tide_wall_ms();
    tide_proto_event_fields_t f;
    tide_event_fields_init(&f);
    tide_event_fields_worker(&f, &w->id, w);
    tide_event_fields_reason(&f, reason);
    tide__event_f(s, "", kind, &f, "worker %d (%s rank %d on %s device %d): %s", w->id, w->pool,
                  w->rank, w->host, w->device, reason);
    if (w->offline_job != 0) {
        tide_coord_job_t *oj = tide_coord_job_get(s->st, w->offline_job);
        w->offline_job = 0;
        if (oj != NULL && oj->state == TIDE_JS_ASSIGNED && oj->worker == w->id) {
            char why[160];
            snprintf(why, sizeof why, "attempt %d: worker %d %s", oj->attempts, w->id,
                     strcmp(kind, "worker_left") == 0 ? "left" : "failed");
            tide__offline_requeue(s, oj, w->id, 0, why);
        }
    }
    int64_t jid = w->job;
    w->job = 0;
    tide__save_worker(s, w);
    tide__reschedule(s);
    return jid;
}

void tide__job_lost_worker(tide_server_t *s, tide_coord_job_t *j, tide_coord_worker_t *w,
                           const char *reason)
{
    if (j == NULL || j->kind != TIDE_CJOB_ONLINE)
        return;
    int32_t jr = tide_coord_job_rank(j, w);
    if (jr < 0)
        return;
    if (j->reconf != NULL && tide_reconf_find(j->reconf, jr) >= 0)
        participant_failed(s, j, w);
    else if (j->layout != NULL && tide_coord_layout_has(j->layout, jr))
        recover(s, j, reason);
}

/* A worker of an online job failed inside a burst (tide__failures_begin). */
typedef struct tide__lost {
    int64_t job;
    int32_t worker;
    char *reason; /* tide_malloc'd */
} tide__lost;

/* Keeps w's failure for the burst's end; 0 when there is no memory for it. */
static int burst_keep(tide_server_t *s, int64_t jid, const tide_coord_worker_t *w,
                      const char *reason)
{
    if (s->burst.n == s->burst.cap) {
        size_t cap = s->burst.cap ? 2 * s->burst.cap : 16;
        tide__lost *v = tide_reallocarray(s->burst.lost, cap, sizeof *v);
        if (v == NULL)
            return 0;
        s->burst.lost = v;
        s->burst.cap = cap;
    }
    char *why = tide_strdup(reason);
    if (why == NULL)
        return 0;
    s->burst.lost[s->burst.n++] = (tide__lost){jid, w->id, why};
    return 1;
}

void tide__worker_failed(tide_server_t *s, tide_coord_worker_t *w, const char *reason)
{
    if (tide_coord_worker_gone(w))
        return;
    int64_t jid = tide__worker_down(s, w, "worker_failed", reason);
    if (jid != 0 && s->burst.depth > 0 && burst_keep(s, jid, w, reason))
        return;
    tide__job_lost_worker(s, jid ? tide_coord_job_get(s->st, jid) : NULL, w, reason);
}

void tide__failures_begin(tide_server_t *s)
{
    s->burst.depth++;
}

/* Job j lost the workers of v[0..n) at once (n >= 2): its pending switch falls back (or is
 * kept, when participants switched) once, or j recovers once, without all of them. */
static void lost_together(tide_server_t *s, tide_coord_job_t *j, const tide__lost *v, size_t n)
{
    char ids[160], why[TIDE_RECONF_REASON_MAX];
    size_t at = 0;
    int parts = 0, members = 0;
    ids[0] = '\0';
    for (size_t i = 0; i < n; i++) {
        tide_coord_worker_t *w = tide_coord_worker_get(s->st, v[i].worker);
        int32_t jr = w != NULL ? tide_coord_job_rank(j, w) : -1;
        if (jr < 0)
            continue;
        long k = j->reconf != NULL ? tide_reconf_find(j->reconf, jr) : -1;
        if (k >= 0) {
            j->reconf->gone[k] = 1;
            parts++;
        } else if (j->layout != NULL && tide_coord_layout_has(j->layout, jr)) {
            members++;
        } else {
            continue;
        }
        if (at < sizeof ids - 16)
            at += (size_t)snprintf(ids + at, sizeof ids - at, "%s%d", at ? ", " : "", w->id);
    }
    if (parts > 0) {
        snprintf(why, sizeof why, "participant workers %s failed during the switch", ids);
        if (j->reconf->phase == TIDE_RP_COMMIT && j->reconf->switched)
            keep_switched(s, j, why);
        else
            fall_back(s, j, why);
    } else if (members > 0) {
        snprintf(why, sizeof why, "workers %s failed at once: %s", ids, v[0].reason);
        recover(s, j, why);
    }
}

void tide__failures_end(tide_server_t *s)
{
    if (--s->burst.depth > 0)
        return;
    tide__lost *v = s->burst.lost;
    size_t n = s->burst.n;
    s->burst.lost = NULL;
    s->burst.n = s->burst.cap = 0;
    /* grouped by job in place, keeping the order of failures inside a job */
    for (size_t i = 0; i < n;) {
        size_t end = i + 1;
        for (size_t k = i + 1; k < n; k++)
            if (v[k].job == v[i].job) {
                tide__lost t = v[k];
                memmove(&v[end + 1], &v[end], (k - end) * sizeof *v);
                v[end++] = t;
            }
        tide_coord_job_t *j = tide_coord_job_get(s->st, v[i].job);
        tide_coord_worker_t *w = tide_coord_worker_get(s->st, v[i].worker);
        if (end - i == 1 && w != NULL)
            tide__job_lost_worker(s, j, w, v[i].reason); /* exactly as outside a burst */
        else if (j != NULL && j->kind == TIDE_CJOB_ONLINE)
            lost_together(s, j, &v[i], end - i);
        i = end;
    }
    for (size_t i = 0; i < n; i++)
        tide_free(v[i].reason);
    tide_free(v);
}

/* ---- fallback -------------------------------------------------------------------------------- */

static int lost_old_member(tide_server_t *s, const tide_coord_job_t *j)
{
    if (j->layout == NULL)
        return 0;
    for (size_t i = 0; i < tide_layout_size(j->layout); i++) {
        const tide_coord_worker_t *w = tide__job_worker(s, j, j->layout->worker[i]);
        if (w == NULL || tide_coord_worker_gone(w) || w->job != j->id)
            return 1;
    }
    return 0;
}

/* Abandons j's pending switch and, when it lost an old member meanwhile, recovers. */
static void fall_back(tide_server_t *s, tide_coord_job_t *j, const char *reason)
{
    tide__reconf_abandon(s, j, reason);
    if (lost_old_member(s, j))
        recover(s, j, reason);
}

/*
 * A participant of G failed after another had reported done: G cannot be
 * abandoned (that worker switched), so G is committed over the live
 * participants and, when it lost members, a recovery starts from it.
 */
static void keep_switched(tide_server_t *s, tide_coord_job_t *j, const char *reason)
{
    tide_reconf_t *r = j->reconf;
    size_t done = 0;
    for (size_t i = 0; i < r->n_parts; i++)
        done += r->acked[i] && !r->gone[i];
    tide__event(s, j->name, "switch_kept",
                "generation %llu kept although %s: participants had switched to it (%zu done "
                "since tided started); the job recovers from it",
                (unsigned long long)r->gen, reason, done);
    tide__reconf_commit(s, j);
    if (lost_old_member(s, j))
        recover(s, j, reason);
}

/*
 * tide_policy_recovery_feasible for j's layout and recovery layout l (NULL: any layout,
 * however many workers join), a worker failed or no longer in the job counting as dead
 * (the live set the workers derive from tided's status). Planned over tided's worker ids
 * (a relabelling: the same plan), so that the reason a recovery is impossible names
 * workers as tidectl status does. Starting a switch the survivors cannot serve would make
 * every participant fail its plan, abort, and tided recover again, endlessly.
 */
static tide_status recovery_feasible(tide_server_t *s, const tide_coord_job_t *j,
                                     const tide_collection_t *c, const tide_layout_t *l)
{
    tide_layout_t *old_ids = NULL, *new_ids = NULL;
    size_t n = tide_layout_size(j->layout);
    uint8_t *dead = tide_malloc(n ? n : 1);
    tide_status rc =
        dead != NULL
            ? tide__layout_worker_ids(s, j, j->layout, &old_ids)
            : tide_errorf(TIDE_ERR_NOMEM, "out of memory checking the recovery of %s", j->name);
    if (rc == TIDE_OK && l != NULL)
        rc = tide__layout_worker_ids(s, j, l, &new_ids);
    for (size_t i = 0; rc == TIDE_OK && i < n; i++) {
        const tide_coord_worker_t *w = tide__job_worker(s, j, j->layout->worker[i]);
        dead[i] = w == NULL || tide_coord_worker_gone(w) || w->job != j->id;
    }
    if (rc == TIDE_OK)
        rc = tide_policy_recovery_feasible(old_ids, dead, new_ids, c);
    tide_free(dead);
    tide_layout_destroy(&old_ids);
    tide_layout_destroy(&new_ids);
    return rc;
}

/* Tells every live member of j's layout that the job cannot go on (halt). */
static void halt_members(tide_server_t *s, const tide_coord_job_t *j, tide_status code,
                         const char *why)
{
    tide_msg_t m;
    tide_msg_init(&m, TIDE_MSG_HALT);
    snprintf(m.u.halt.job, sizeof m.u.halt.job, "%s", j->name);
    m.u.halt.gen = j->generation;
    m.u.halt.code = code < 0 && code >= -1000 ? (int)code : (int)TIDE_ERR_INTERNAL;
    snprintf(m.u.halt.reason, sizeof m.u.halt.reason, "%s", why);
    for (size_t i = 0; i < tide_layout_size(j->layout); i++) {
        tide_coord_worker_t *w = tide__job_worker(s, j, j->layout->worker[i]);
        if (w != NULL && !tide_coord_worker_gone(w) && w->job == j->id)
            tide__send_worker(s, w, &m);
    }
}

/* Recovers j after losing members: a new layout over survivors, or stalls the job. */
/* A recovery being planned: what recover() hands from one phase to the next. */
typedef struct recovery {
    tide_layout_t *l; /* the layout over the survivors, owned */
    int32_t *pre;     /* offline workers it preempts, owned */
    size_t n_pre;
    const tide_coord_ckpt *ck;            /* the checkpoint it loads; NULL: from replicas */
    char shrink[TIDE_PROTO_TEXT_MAX + 1]; /* why it holds fewer replicas */
    char lost[TIDE_PROTO_TEXT_MAX + 1];   /* what no survivor holds any more, when that is why */
} recovery;

/* Too few workers for a layout (the error is pending): waiting for more helps only when
   the survivors still hold all of the state (a pipeline stage lost with its host does not);
   else a rollback to j's checkpoint, where the survivors may run other degrees. */
static tide_status too_few(tide_server_t *s, const tide_coord_job_t *j, const tide_collection_t *c,
                           const tide_policy_worker *cand, size_t n, recovery *r)
{
    char wait_why[TIDE_PROTO_TEXT_MAX + 1];
    snprintf(wait_why, sizeof wait_why, "%s", tide_last_error());
    if (recovery_feasible(s, j, c, NULL) != TIDE_ERR_NO_HOLDER)
        return tide_errorf(TIDE_ERR_NO_DEVICE, "%s", wait_why);
    snprintf(r->lost, sizeof r->lost, "%s", tide_last_error());
    if (j->n_ckpts > 0 &&
        tide_policy_rollback(j->layout, c, j->fit, (size_t)j->n_fit, cand, n, &r->l, r->pre,
                             &r->n_pre, r->shrink, sizeof r->shrink) != TIDE_OK)
        return tide_errorf(TIDE_ERR_NO_DEVICE,
                           "%s; no layout the survivors can run holds the checkpoint's state "
                           "either (%s)",
                           wait_why, tide_last_error());
    return tide_errorf(TIDE_ERR_NO_HOLDER, "%s", r->lost);
}

/* The layout over j's survivors (tide_policy_recover) and whether they hold every byte it
   needs; the fallbacks of too_few. TIDE_ERR_NO_HOLDER with r->l set: load a checkpoint. */
static tide_status plan(tide_server_t *s, const tide_coord_job_t *j, recovery *r)
{
    tide_policy_worker *cand = NULL;
    size_t n = 0;
    tide_collection_t *c = NULL;
    tide_status rc = tide__job_collection(j, &c);
    if (rc == TIDE_OK)
        rc = tide__candidates(s, j, 1, &cand, &n);
    if (rc == TIDE_OK) {
        r->pre = tide_malloc((n ? n : 1) * sizeof *r->pre);
        rc = r->pre ? tide_policy_recover(j->layout, c, j->fit, (size_t)j->n_fit, cand, n, &r->l,
                                          r->pre, &r->n_pre, r->shrink, sizeof r->shrink)
                    : tide_errorf(TIDE_ERR_NOMEM, "out of memory planning a recovery");
    }
    if (rc == TIDE_OK && c != NULL)
        rc = recovery_feasible(s, j, c, r->l);
    if (rc == TIDE_ERR_NO_HOLDER)
        snprintf(r->lost, sizeof r->lost, "%s", tide_last_error());
    if (rc == TIDE_ERR_NO_DEVICE && c != NULL)
        rc = too_few(s, j, c, cand, n, r);
    tide_free(cand);
    tide_collection_destroy(&c);
    return rc;
}

/* No survivor holds what was lost, but a layout was found: it loads j's newest checkpoint.
   r->lost keeps the plan's own words for the event, without its advice to restart. */
static void from_checkpoint(const tide_coord_job_t *j, recovery *r)
{
    r->ck = &j->ckpts[j->n_ckpts - 1];
    char *advice = strstr(r->lost, "; restart it from a checkpoint");
    if (advice != NULL)
        *advice = '\0';
    const char *what = strstr(r->lost, "no live worker");
    if (what != NULL)
        memmove(r->lost, what, strlen(what) + 1);
    tide_error_clear();
}

/* No recovery (rc, its error pending): j stalls, once. */
static void stall(tide_server_t *s, tide_coord_job_t *j, const char *reason, tide_status rc)
{
    if (j->state == TIDE_JS_STALLED)
        return;
    char detail[TIDE_PROTO_TEXT_MAX + 1];
    snprintf(detail, sizeof detail, "%s", tide_last_error());
    j->state = TIDE_JS_STALLED;
    tide_proto_event_fields_t f;
    tide_event_fields_init(&f);
    f.gen = j->generation;
    tide_event_fields_reason(&f, reason);
    tide__event_f(s, j->name, "stalled", &f, "%s: %s", reason, detail);
    tide__save_job(s, j);
    /* Lost state never comes back (more workers would not help): the survivors are told to
       stop instead of waiting for an operator. */
    if (rc == TIDE_ERR_NO_HOLDER)
        halt_members(s, j, rc, detail);
}

/* Plans a recovery of j after `reason` (policy.c decides), then stalls j or starts the
   recovery switch (reconf.c). */
static void recover(tide_server_t *s, tide_coord_job_t *j, const char *reason)
{
    if (j->reconf != NULL)
        tide__reconf_abandon(s, j, reason);
    if (j->layout == NULL)
        return;
    recovery r;
    memset(&r, 0, sizeof r);
    tide_status rc = plan(s, j, &r);
    if (rc == TIDE_ERR_NO_HOLDER && j->n_ckpts > 0 && r.l != NULL) {
        from_checkpoint(j, &r);
        rc = TIDE_OK;
    }
    if (rc != TIDE_OK) {
        stall(s, j, reason, rc);
    } else {
        char why[TIDE_RECONF_REASON_MAX];
        const char *sep = r.shrink[0] ? "; " : "";
        if (r.ck != NULL)
            snprintf(why, sizeof why,
                     "recovery: %s; from the checkpoint of step %lld (%.200s; the survivors "
                     "holding no copy of the lost state: %.200s)%s%.120s",
                     reason, (long long)r.ck->step, r.ck->dir, r.lost, sep, r.shrink);
        else
            snprintf(why, sizeof why, "recovery: %s%s%.400s", reason, sep, r.shrink);
        s->st->counters.recoveries++;
        if (tide__reconf_start(s, j, r.l, r.pre, r.n_pre, 1, why, r.ck) != TIDE_OK)
            TIDE_ERROR("reconf", "job %s: %s", j->name, tide_last_error());
        r.l = NULL; /* tide__reconf_start took it */
    }
    tide_free(r.pre);
    tide_layout_destroy(&r.l);
}

/* A participant of j's pending reconfiguration failed. */
static void participant_failed(tide_server_t *s, tide_coord_job_t *j, tide_coord_worker_t *w)
{
    tide_reconf_t *r = j->reconf;
    int32_t jr = tide_coord_job_rank(j, w);
    long i = jr >= 0 ? tide_reconf_find(r, jr) : -1;
    if (i < 0)
        return;
    r->gone[i] = 1;
    char why[120];
    snprintf(why, sizeof why, "participant worker %d failed during the switch", w->id);
    if (r->phase == TIDE_RP_COMMIT && r->switched)
        keep_switched(s, j, why);
    else
        fall_back(s, j, why);
}

void tide__recovery_tick(tide_server_t *s)
{
    uint64_t now_ns = s->now_ns;
    for (size_t k = 0; k < s->st->n_jobs; k++) {
        tide_coord_job_t *j = s->st->jobs[k];
        tide_reconf_t *r = j->reconf;
        if (r == NULL)
            continue;
        if (now_ns >= r->deadline_ns) {
            char why[300];
            size_t at =
                (size_t)snprintf(why, sizeof why, "timed out after %lld ms waiting for worker",
                                 (long long)s->cfg.resize_timeout_ms);
            for (size_t i = 0; i < r->n_parts && at < sizeof why - 16; i++)
                if (!r->gone[i] && !r->acked[i]) {
                    const tide_coord_worker_t *w = tide__job_worker(s, j, r->parts[i]);
                    at += (size_t)snprintf(why + at, sizeof why - at, " %d",
                                           w != NULL ? (int)w->id : -1);
                }
            if (r->phase == TIDE_RP_COMMIT && r->switched) {
                /* G stays: the silent participants are failed first, then one recovery */
                for (size_t i = 0; i < r->n_parts; i++) {
                    if (r->gone[i] || r->acked[i])
                        continue;
                    r->gone[i] = 1;
                    tide_coord_worker_t *w = tide__job_worker(s, j, r->parts[i]);
                    if (w != NULL)
                        tide__worker_down(s, w, "worker_failed", why);
                }
                keep_switched(s, j, why);
            } else {
                fall_back(s, j, why);
            }
        } else if (now_ns >= r->resend_ns) {
            tide__reconf_resend(s, j, 1);
        }
    }
}

void tide__on_done(tide_server_t *s, const tide_msg_t *msg, const void *raw, size_t len)
{
    (void)raw;
    (void)len;
    const tide_proto_done_t *m = &msg->u.done;
    tide_coord_worker_t *w = tide__sender(s, m->worker, msg->type);
    long i;
    tide_coord_job_t *j = w ? tide__reconf_report(s, w, m->job, m->gen, &i, "done") : NULL;
    if (j == NULL)
        return;
    tide_reconf_t *r = j->reconf;
    if (r->phase != TIDE_RP_COMMIT) {
        tide__reply_error(s, TIDE_ERR_PROTOCOL,
                          "done for generation %llu of job %s before its commit",
                          (unsigned long long)m->gen, j->name);
        return;
    }
    if (m->status == TIDE_ERR_INVALID && r->ckpt[0] != '\0' && !r->switched) {
        /* the members agree on whether the checkpoint loaded (a damaged shard fails them
           all): it is never used again, and the recovery tries the one before it */
        char why[TIDE_PROTO_TEXT_MAX + 1];
        snprintf(why, sizeof why,
                 "the checkpoint of step %lld (%.800s) could not be loaded (worker %d: %s; its "
                 "log names the file)",
                 (long long)r->ckpt_step, r->ckpt, w->id, tide_strerror((tide_status)m->status));
        tide__event(s, j->name, "checkpoint_refused", "%s", why);
        tide_coord_job_drop_ckpt(j, r->ckpt_step);
        fall_back(s, j, why);
        return;
    }
    if (m->status != 0) {
        char why[200];
        snprintf(why, sizeof why, "worker %d could not switch: %s", w->id,
                 tide_strerror((tide_status)m->status));
        if (r->switched) /* others run under G already: this one's state is lost, not G */
            tide__worker_failed(s, w, why);
        else
            fall_back(s, j, why);
        return;
    }
    tide__reconf_done(s, j, i, m->bytes_moved, m->ms);
}

void tide__recovery_retry_stalled(tide_server_t *s)
{
    for (size_t i = 0; i < s->st->n_jobs; i++)
        if (s->st->jobs[i]->kind == TIDE_CJOB_ONLINE && s->st->jobs[i]->state == TIDE_JS_STALLED)
            recover(s, s->st->jobs[i], "retrying after workers changed");
}
