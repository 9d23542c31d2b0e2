/*
 * coordinator/liveness: failure detection and retention (see liveness.h).
 */
#include <stdio.h>
#include <string.h>

#include "core/clock.h"
#include "core/log.h"
#include "coordinator/liveness.h"
#include "coordinator/members.h"
#include "coordinator/recovery.h"

#define FORGET_SLICE   8192u       /* worker slots the retention pass looks at per second */
#define SCAN_OUT_BYTES (64u << 20) /* outbox bytes past which the failure scan waits a pass */
#define MATES_MAX      64u         /* (job, host) pairs a scan fails host-mates for */

/* The (job, host) pairs a scan failed a member of: each is looked at once. */
typedef struct mates {
    int64_t job[MATES_MAX];
    const char *host[MATES_MAX];
    size_t n;
} mates;

/* The members of job jid on w's host that are silent for at least `near` fail with w, in
 * the same burst: a host's workers stop together, but their last messages can lie a
 * heartbeat or more apart (one rank's own report after the host's beat), and a member
 * found silent a scan later would abort the recovery the others started (ci60,
 * test_multihost_lost: two recoveries and an abort for one host). O(members) once per job
 * and host in a scan; past MATES_MAX pairs (a whole cluster silent) the scans alone
 * decide. */
static void fail_host_mates(tide_server_t *s, mates *seen, const tide_coord_worker_t *w,
                            int64_t jid, uint64_t now, uint64_t near)
{
    tide_coord_job_t *j = jid != 0 ? tide_coord_job_get(s->st, jid) : NULL;
    if (j == NULL || j->kind != TIDE_CJOB_ONLINE || j->layout == NULL || seen->n == MATES_MAX)
        return;
    for (size_t i = 0; i < seen->n; i++)
        if (seen->job[i] == jid && strcmp(seen->host[i], w->host) == 0)
            return;
    seen->job[seen->n] = jid;
    seen->host[seen->n++] = w->host;
    for (size_t i = 0; i < tide_layout_size(j->layout); i++) {
        tide_coord_worker_t *m = tide__job_worker(s, j, j->layout->worker[i]);
        if (m == NULL || m == w || tide_coord_worker_gone(m) || strcmp(m->host, w->host) != 0 ||
            now <= m->last_seen_ns || now - m->last_seen_ns < near)
            continue;
        char why[160];
        snprintf(why, sizeof why,
                 "no message for %llu ms, on host %.64s where worker %d failed at the same time",
                 (unsigned long long)((now - m->last_seen_ns) / 1000000ull), w->host, w->id);
        tide__worker_failed(s, m, why);
    }
}

/* Declares failed the workers silent for miss_limit heartbeats at now: read off the front
 * of the seen list (workers by last message), so a scan costs the expired workers, not
 * the worker table (10^5 workers scanned four times a second were most of tided's idle
 * CPU). Each failure of a job's member starts a recovery that sends its layout to every
 * participant: when a whole cluster goes silent, one pass would queue failures x members
 * messages (gigabytes at 10^5 workers). So a pass fails workers only while its outbox
 * holds less than SCAN_OUT_BYTES and sets scan_more: the next pass, right after this
 * one's messages went out, goes on. The pass is one burst of failures (recovery.h): the
 * recoveries start at its end, one per job. A failed member's host-mates in its job that
 * are nearly as silent fail in the same burst (fail_host_mates). */
static void scan_failures(tide_server_t *s, uint64_t now)
{
    uint64_t hb = (uint64_t)s->cfg.heartbeat_ms * 1000000ull;
    uint64_t limit = hb * (uint64_t)(s->cfg.miss_limit > 0 ? s->cfg.miss_limit : 1);
    uint64_t near = limit - limit / 10; /* 90%: a host-mate of a failed worker fails too */
    int32_t ids[16];
    size_t n = sizeof ids / sizeof ids[0];
    mates seen = {.n = 0};
    s->live.scan_more = 0;
    /* one burst: a host's workers go silent together, and each job recovers once from all
       of them at the end, not once per worker (each aborting the one before) */
    tide__failures_begin(s);
    while (n == sizeof ids / sizeof ids[0]) {
        if (tide__outbox_bytes(s) >= SCAN_OUT_BYTES) {
            s->live.scan_more = 1;
            break;
        }
        n = tide_coord_workers_expired(s->st, now, limit, ids, sizeof ids / sizeof ids[0]);
        for (size_t i = 0; i < n; i++) {
            tide_coord_worker_t *w = &s->st->workers[ids[i]];
            char why[128];
            snprintf(why, sizeof why, "no message for %llu ms (%d heartbeats of %lld ms missed)",
                     (unsigned long long)((now - w->last_seen_ns) / 1000000ull), s->cfg.miss_limit,
                     (long long)s->cfg.heartbeat_ms);
            int64_t jid = w->job;
            tide__worker_failed(s, w, why);
            fail_host_mates(s, &seen, w, jid, now, near);
        }
    }
    tide__failures_end(s);
}

void tide__liveness_tick(tide_server_t *s)
{
    uint64_t now = s->now_ns, hb = (uint64_t)s->cfg.heartbeat_ms * 1000000ull;
    if (s->live.last_scan_ns != 0 && now - s->live.last_scan_ns > tide__tick_ns(s) + hb) {
        s->live.grace_until_ns = now + hb * (uint64_t)s->cfg.miss_limit;
        TIDE_WARN_LIMITED("server",
                          "tided did not run for %llu ms (starved of CPU or blocked on "
                          "disk): workers get %lld ms more before any is declared "
                          "failed",
                          (unsigned long long)((now - s->live.last_scan_ns) / 1000000ull),
                          (long long)s->cfg.heartbeat_ms * s->cfg.miss_limit);
    }
    s->live.last_scan_ns = now;
    if (now >= s->live.grace_until_ns)
        scan_failures(s, tide__drained_ns(s));
    /* failures left for the next pass: once this one's messages went out */
    if (s->live.scan_more)
        tide__tick_soon(s);
}

/* 1 while a job still refers to w: it holds or runs something, it is in the layout or the
 * pending switch of an online job that has not ended, or it was fenced from one (a process
 * that comes back must still be told so), or an assigned offline job names it. */
static int worker_referenced(const tide_server_t *s, const tide_coord_worker_t *w)
{
    if (w->job != 0 || w->offline_job != 0)
        return 1;
    for (size_t i = 0; i < s->st->n_jobs; i++) {
        const tide_coord_job_t *j = s->st->jobs[i];
        if (j->state == TIDE_JS_DONE || j->state == TIDE_JS_CANCELLED)
            continue;
        if (j->kind == TIDE_CJOB_OFFLINE) {
            if (j->state == TIDE_JS_ASSIGNED && j->worker == w->id)
                return 1;
            continue;
        }
        if (j->state == TIDE_JS_FAILED)
            continue;
        if (w->fenced_job == j->id)
            return 1;
        int32_t jr = tide_coord_job_rank(j, w);
        if (jr < 0)
            continue;
        if (j->layout != NULL && tide_coord_layout_has(j->layout, jr))
            return 1;
        if (j->reconf != NULL && tide_reconf_find(j->reconf, jr) >= 0)
            return 1;
    }
    return 0;
}

/*
 * Forgets the workers that left or failed more than the retention period ago and that no
 * job refers to any more: their slots and state file rows go, their ids are never handed
 * out again. Without this the table (and every status reply) grows with every launch.
 * Runs every second over the next FORGET_SLICE slots only (a cursor goes round the
 * table): retention is minutes to hours, and a pass over 10^5 workers every second
 * would be tided's largest steady cost.
 */
static void forget_workers(tide_server_t *s)
{
    int64_t now_ms = tide_wall_ms();
    size_t forgotten = 0, n = s->st->n_workers;
    size_t slice = n < FORGET_SLICE ? n : FORGET_SLICE;
    for (size_t k = 0; k < slice; k++) {
        size_t i = s->live.forget_at++ % n;
        tide_coord_worker_t *w = &s->st->workers[i];
        if (w->pool[0] == '\0' || !tide_coord_worker_gone(w) ||
            now_ms - w->gone_ms < s->cfg.retention_ms || worker_referenced(s, w))
            continue;
        int32_t id = w->id;
        TIDE_DEBUG("server", "forgetting worker %d (%s rank %d, %s since %lld ms)", id, w->pool,
                   w->rank, tide_wstate_name(w->state), (long long)(now_ms - w->gone_ms));
        tide_coord_worker_remove(s->st, id);
        tide__save_worker_removed(s, id);
        forgotten++;
        if (s->st->n_workers == 0)
            break; /* the table shrank to nothing under the cursor */
    }
    if (forgotten > 0) {
        TIDE_INFO("server", "forgot %zu workers that left or failed more than %lld ms ago",
                  forgotten, (long long)s->cfg.retention_ms);
        tide__event(s, "", "workers_forgotten",
                    "%zu workers that left or failed more than %lld ms ago (and that no job "
                    "refers to) were removed from the worker table",
                    forgotten, (long long)s->cfg.retention_ms);
    }
}

void tide__retention_tick(tide_server_t *s)
{
    if (s->now_ns < s->live.next_forget_ns)
        return;
    forget_workers(s);
    s->live.next_forget_ns = s->now_ns + 1000000000ull; /* ms-scale retention needs no finer
                                                           scan */
}

void tide__liveness_reload(tide_server_t *s)
{
    uint64_t now = s->now_ns;
    int64_t wall = tide_wall_ms();
    for (size_t i = 0; i < s->st->n_workers; i++) {
        tide_coord_worker_t *w = &s->st->workers[i];
        if (w->pool[0] != '\0')
            tide_coord_worker_seen(s->st, w, now);
        w->last_hb_ns = now;
        tide_coord_job_t *jj =
            w->joined && !tide_coord_worker_gone(w) ? tide_coord_job_get(s->st, w->joined) : NULL;
        if (jj != NULL)
            jj->joins++;
        if (w->pool[0] != '\0' && tide_coord_worker_gone(w) && w->gone_ms == 0)
            w->gone_ms = wall; /* a state file from before gone_ms: retention starts now */
    }
}
