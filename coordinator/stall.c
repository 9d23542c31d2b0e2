/*
 * coordinator/stall: stalled steps seen and, across hosts, fenced (see stall.h).
 *
 * Why the ranks' own report: a cut data path leaves every heartbeat flowing (the control
 * plane is another route), so liveness sees nothing, and a job's step counter alone cannot
 * tell a hung collective from a program that does long work between steps (evaluation,
 * data loading). A rank knows which: it is inside tide_step_begin..tide_step_end.
 *
 * Which side is kept: tided hears every rank and knows their hosts but not which links
 * work, so it keeps the host holding the most of the job (ties: the host of the lowest
 * job rank) and fences the others; recovery decides from there whether the kept ranks
 * hold the state (else a checkpoint, else the job stalls with its reason).
 */
#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "core/log.h"
#include "coordinator/members.h"
#include "coordinator/recovery.h"
#include "coordinator/stall.h"

#define STALL_HOSTS_MAX 64 /* hosts named one by one in an event; more are counted */

void tide__stall_heartbeat(tide_server_t *s, tide_coord_worker_t *w, double in_step_ms,
                           double step_ms)
{
    uint64_t in_ns = (uint64_t)(in_step_ms * 1e6);
    /* stamped on tided's clock: the rank's own clock and the heartbeat's age cancel out to
       within one heartbeat period */
    w->step_since_ns = in_ns > 0 && in_ns < s->now_ns ? s->now_ns - in_ns : 0;
    if (step_ms > 0)
        w->step_ms_avg = w->step_ms_avg > 0 ? 0.8 * w->step_ms_avg + 0.2 * step_ms : step_ms;
}

/* The members of j, by host: host names (borrowed from the workers) and ranks per host. */
typedef struct hosts {
    const char *name[STALL_HOSTS_MAX];
    int members[STALL_HOSTS_MAX], stuck[STALL_HOSTS_MAX];
    int32_t low[STALL_HOSTS_MAX]; /* the lowest job rank on the host */
    size_t n, more;               /* hosts named, hosts past STALL_HOSTS_MAX */
    double bound_ms;              /* the job's stall bound */
    double longest_ms;            /* the longest step in progress */
    int n_stuck;
} hosts;

static size_t host_of(hosts *h, const char *name, int32_t rank)
{
    size_t i = 0;
    while (i < h->n && strcmp(h->name[i], name) != 0)
        i++;
    if (i == h->n) {
        if (h->n == STALL_HOSTS_MAX) {
            h->more++;
            return STALL_HOSTS_MAX;
        }
        h->name[h->n] = name;
        h->members[h->n] = h->stuck[h->n] = 0;
        h->low[h->n] = rank;
        h->n++;
    }
    if (rank < h->low[i])
        h->low[i] = rank;
    return i;
}

/* The live members of running job j by host, the job's bound, and which are stuck: inside
   a step that has run past half the bound. The event fires once one has run past the
   whole bound (tide__stall_tick); by then a hung collective holds every member, but the
   others entered it a little later or last told their step a heartbeat ago, and a check
   once a second would name only the first (test_multihost_partition saw "h1 (4 ranks, 1
   stalled) and h2 (4 ranks, 0 stalled)" under load). A healthy step never runs half the
   bound: it is at least --stall-factor (10) times the slowest member's recent steps. */
static void survey(tide_server_t *s, const tide_coord_job_t *j, hosts *h)
{
    memset(h, 0, sizeof *h);
    double slowest = 0;
    size_t n = tide_layout_size(j->layout);
    for (size_t i = 0; i < n; i++) {
        const tide_coord_worker_t *w = tide__job_worker(s, j, j->layout->worker[i]);
        if (w != NULL && w->state == TIDE_WS_ONLINE && w->job == j->id && w->step_ms_avg > slowest)
            slowest = w->step_ms_avg;
    }
    h->bound_ms = (double)s->cfg.stall_ms;
    if (slowest * s->cfg.stall_factor > h->bound_ms)
        h->bound_ms = slowest * s->cfg.stall_factor;
    for (size_t i = 0; i < n; i++) {
        const tide_coord_worker_t *w = tide__job_worker(s, j, j->layout->worker[i]);
        if (w == NULL || w->state != TIDE_WS_ONLINE || w->job != j->id)
            continue;
        size_t k = host_of(h, w->host, j->layout->worker[i]);
        double in_ms = w->step_since_ns ? (double)(s->now_ns - w->step_since_ns) / 1e6 : 0;
        int stuck = in_ms > h->bound_ms / 2;
        h->n_stuck += stuck;
        if (in_ms > h->longest_ms)
            h->longest_ms = in_ms;
        if (k < STALL_HOSTS_MAX) {
            h->members[k]++;
            h->stuck[k] += stuck;
        }
    }
}

/* The host kept: the most members, ties to the lowest job rank. */
static size_t keeper(const hosts *h)
{
    size_t best = 0;
    for (size_t i = 1; i < h->n; i++)
        if (h->members[i] > h->members[best] ||
            (h->members[i] == h->members[best] && h->low[i] < h->low[best]))
            best = i;
    return best;
}

/* "h1 (4 ranks, 4 stalled) and h2 (4 ranks, 4 stalled)" into buf. */
static void name_hosts(const hosts *h, char *buf, size_t cap)
{
    size_t at = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < h->n && at < cap; i++) {
        int k = snprintf(buf + at, cap - at, "%s%s (%d ranks, %d stalled)",
                         i == 0                          ? ""
                         : i + 1 == h->n && h->more == 0 ? " and "
                                                         : ", ",
                         h->name[i], h->members[i], h->stuck[i]);
        at += k > 0 ? (size_t)k : 0;
    }
    if (h->more > 0 && at < cap)
        snprintf(buf + at, cap - at, " and %zu more hosts", h->more);
}

/* Fails j's members on every host but h->name[keep] (they are fenced by it), each with
   why; j recovers once, after all of them. */
static void fence_others(tide_server_t *s, tide_coord_job_t *j, const hosts *h, size_t keep,
                         const char *why)
{
    int64_t id = j->id;
    size_t n = tide_layout_size(j->layout);
    int32_t *ranks = tide_calloc(n > 0 ? n : 1, sizeof *ranks);
    size_t m = 0;
    if (ranks == NULL) {
        TIDE_ERROR("server", "job %s: no memory to fence its stalled hosts; it stays stalled",
                   j->name);
        return;
    }
    for (size_t i = 0; i < n; i++) {
        const tide_coord_worker_t *w = tide__job_worker(s, j, j->layout->worker[i]);
        if (w != NULL && w->state == TIDE_WS_ONLINE && w->job == id &&
            strcmp(w->host, h->name[keep]) != 0)
            ranks[m++] = j->layout->worker[i];
    }
    /* one burst: the job recovers once, from all the fenced ranks (recovery.h) */
    tide__failures_begin(s);
    for (size_t i = 0; i < m; i++) {
        tide_coord_job_t *jj = tide_coord_job_get(s->st, id);
        tide_coord_worker_t *w = jj != NULL ? tide__job_worker(s, jj, ranks[i]) : NULL;
        if (w != NULL && w->job == id)
            tide__worker_failed(s, w, why);
    }
    tide__failures_end(s);
    tide_free(ranks);
}

/* Reports running job j's stalled step and, across hosts, fences all but the kept host. */
static void stalled(tide_server_t *s, tide_coord_job_t *j, const hosts *h)
{
    char where[600], why[TIDE_PROTO_TEXT_MAX + 1];
    name_hosts(h, where, sizeof where);
    j->stall_told = 1;
    j->stall_gen = j->generation;
    j->stall_step = j->step;
    if (h->n + h->more < 2) {
        tide__event(s, j->name, "stalled",
                    "step %lld has run %.0f ms, past the stall bound of %.0f ms, with %d ranks "
                    "inside it while every rank reaches tided; all on %s: nothing to fence (a "
                    "rank's program or device hangs, or a link inside the host)",
                    (long long)j->step + 1, h->longest_ms, h->bound_ms, h->n_stuck, where);
        return;
    }
    size_t keep = keeper(h);
    tide__event(s, j->name, "stalled",
                "step %lld has run %.0f ms, past the stall bound of %.0f ms, with %d ranks inside "
                "it while every rank reaches tided: hosts %s cannot reach each other; the job "
                "goes on on %s (the most of it), the other hosts' ranks are fenced",
                (long long)j->step + 1, h->longest_ms, h->bound_ms, h->n_stuck, where,
                h->name[keep]);
    snprintf(why, sizeof why,
             "fenced: job %s's step %lld stalled %.0f ms (bound %.0f ms) across hosts %s; the "
             "job goes on on %s",
             j->name, (long long)j->step + 1, h->longest_ms, h->bound_ms, where, h->name[keep]);
    fence_others(s, j, h, keep, why);
}

void tide__stall_tick(tide_server_t *s)
{
    if (s->cfg.stall_ms <= 0 || s->now_ns < s->stall.next_ns)
        return;
    s->stall.next_ns = s->now_ns + 1000000000ull; /* bounds are tens of seconds */
    for (size_t i = 0; i < s->st->n_jobs; i++) {
        tide_coord_job_t *j = s->st->jobs[i];
        if (j->kind != TIDE_CJOB_ONLINE || j->state != TIDE_JS_RUNNING || j->reconf != NULL ||
            j->layout == NULL)
            continue;
        if (j->stall_told && j->stall_gen == j->generation && j->stall_step == j->step)
            continue; /* told; a step done or a new generation re-arms it */
        hosts h;
        survey(s, j, &h);
        if (h.longest_ms > h.bound_ms)
            stalled(s, j, &h);
    }
}
