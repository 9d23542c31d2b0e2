/*
 * coordinator/reconf: switching an online job to a new layout (resize, drain,
 * join, release, recovery), tided's side of the protocol in DESIGN.md
 * "Reconfiguration" (see reconf.h). What a failure during a switch leads to
 * (fall back, keep a switched generation, recover) is recovery.c's.
 *
 * Protocol (all `step` values count completed training steps):
 *  1. tided validates and places the new layout, preempts offline work on the
 *     workers it takes, records the intent (job row with the pending
 *     generation G, phase PREPARE) and commits it, then sends every
 *     participant (old members and new ones) `layout` {G, prev = the committed
 *     layout} followed by `prepare` {G, step = tided's guess of the next step}.
 *  2. Each participant answers `prepare_ack` {G, step = steps it has
 *     completed}. Rule for a participant after acking: it may finish at most
 *     ONE more step under the old layout, then waits at the step boundary for
 *     `commit` or `abort`. A worker preempted for the grow acks only once its
 *     offline work has stopped. New-only participants' steps are ignored.
 *  3. When every live participant has acked, tided sets the switch step S =
 *     max(acked steps of old members) + 1 (recovery: S = min, the survivors
 *     having stopped training; a survivor stuck in a step it can complete without
 *     peers, tide_step_can_finish, acks that step as reached and finishes it alone
 *     when S asks), records phase COMMIT with S durably and sends `commit`
 *     {G, S, recover}. Every old member runs until it has completed exactly S
 *     steps (no one can be past S, by the rule in 2), then switches: reshard,
 *     new communicators; the first step under G is step S (none lost, none
 *     repeated). Each participant then sends `done` {G, status}.
 *  4. When every live participant reported done with status 0, tided commits
 *     generation G (job row, worker rows, event) before anything else is
 *     acknowledged; workers not in the new layout become idle (or stay
 *     draining) and are offered offline work.
 *  Failure: a participant that fails (heartbeats, `failure`, restart) or
 *  reports done with an error, or the deadline (--resize-timeout-ms), aborts G
 *  (unless some participant already reported done: see below):
 *  tided sends `abort` {G} and the participants go on with (or return to) the
 *  committed layout from the step they stopped at, discarding partial new state.
 *  If an old member was lost, tided then starts a recovery: a new layout over
 *  the survivors (policy.h), same protocol with the recovery switch rule.
 *  Retransmission: tided resends the current phase's message to live
 *  participants that have not answered, every 2 heartbeat periods and when a
 *  participant registers again; participants must answer duplicates (a prepare
 *  or commit for a generation already acked / done) with the same ack / done.
 *  Generations are never reused: an aborted G is skipped.
 *  After the first done (status 0) of G that worker runs under G and cannot go
 *  back, so G is no longer abandoned: a failing participant (or one silent at
 *  the deadline, which is then declared failed) makes tided commit G over the
 *  live participants and start a recovery from G's layout (prev = G). That
 *  point is durable (the job row's rc_switched).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/clock.h"
#include "core/error.h"
#include "core/log.h"
#include "coordinator/members.h"
#include "coordinator/metrics.h"
#include "coordinator/offline.h"
#include "coordinator/policy.h"
#include "coordinator/reconf.h"
#include "coordinator/sender.h"
#include "proto/proto_reshard.h"

/* ---- sending the phases ---------------------------------------------------------------------- */

/* The join's port name to w, a rank of the joining pool. */
static void send_port(tide_server_t *s, const tide_coord_job_t *j, const tide_coord_worker_t *w)
{
    tide_msg_t m;
    tide_msg_init(&m, TIDE_MSG_JOIN_PORT);
    m.u.join_port.worker = w->id;
    snprintf(m.u.join_port.job, sizeof m.u.join_port.job, "%s", j->name);
    m.u.join_port.gen = j->reconf->gen;
    snprintf(m.u.join_port.port, sizeof m.u.join_port.port, "%s", j->reconf->port);
    tide__send_worker(s, w, &m);
}

void tide__send_release(tide_server_t *s, const tide_coord_job_t *j, const tide_coord_worker_t *w)
{
    int p = tide_coord_job_pool_find(j, w->pool);
    if (p < 0 || !j->pools[p].left)
        return;
    tide_msg_t m;
    tide_msg_init(&m, TIDE_MSG_RELEASE);
    snprintf(m.u.release.job, sizeof m.u.release.job, "%s", j->name);
    m.u.release.gen = j->pools[p].left;
    tide__send_worker(s, w, &m);
}

static void send_phase(tide_server_t *s, tide_coord_job_t *j, tide_coord_worker_t *w)
{
    tide_reconf_t *r = j->reconf;
    tide_msg_t m;
    if (r->phase == TIDE_RP_PREPARE) {
        tide__layout_msg_init(&m, j, w);
        tide_proto_layout_from(&m.u.layout.layout, r->layout, r->gen);
        m.u.layout.has_prev = 1;
        tide_proto_layout_from(&m.u.layout.prev, j->layout, j->generation);
        m.u.layout.recover = r->recover;
        if (r->ckpt[0] != '\0') {
            snprintf(m.u.layout.ckpt, sizeof m.u.layout.ckpt, "%s", r->ckpt);
            m.u.layout.ckpt_step = (uint64_t)r->ckpt_step;
        }
        if (r->join_pool >= 0) { /* borrowed: the message is encoded, never cleared */
            m.u.layout.join_old = r->join_old;
            m.u.layout.n_join_old = (uint32_t)r->n_join_old;
            m.u.layout.join_new = r->join_new;
            m.u.layout.n_join_new = (uint32_t)r->n_join_new;
        }
        if (r->n_leave > 0) { /* borrowed, as above */
            m.u.layout.stay = r->stay;
            m.u.layout.n_stay = (uint32_t)r->n_stay;
            m.u.layout.leave = r->leave;
            m.u.layout.n_leave = (uint32_t)r->n_leave;
        }
        tide__send_worker(s, w, &m);
        tide_msg_init(&m, TIDE_MSG_PREPARE);
        snprintf(m.u.prepare.job, sizeof m.u.prepare.job, "%s", j->name);
        m.u.prepare.gen = r->gen;
        m.u.prepare.step = (uint64_t)(j->step + 1);
    } else {
        tide_msg_init(&m, TIDE_MSG_COMMIT);
        snprintf(m.u.commit.job, sizeof m.u.commit.job, "%s", j->name);
        m.u.commit.gen = r->gen;
        m.u.commit.step = (uint64_t)r->switch_step;
        m.u.commit.recover = r->recover;
    }
    tide__send_worker(s, w, &m);
    if (r->phase == TIDE_RP_COMMIT && r->port[0] != '\0' && w->pool[0] != '\0' &&
        tide_coord_job_pool_find(j, w->pool) == r->join_pool)
        send_port(s, j, w);
}

void tide__reconf_resend(tide_server_t *s, tide_coord_job_t *j, int only_unanswered)
{
    tide_reconf_t *r = j->reconf;
    for (size_t i = 0; i < r->n_parts; i++) {
        if (r->gone[i] || (only_unanswered && r->acked[i]))
            continue;
        tide_coord_worker_t *w = tide__job_worker(s, j, r->parts[i]);
        if (w != NULL)
            send_phase(s, j, w);
    }
    r->resend_ns = tide_now_ns() + 2ull * (uint64_t)s->cfg.heartbeat_ms * 1000000ull;
}

void tide__reconf_resend_to(tide_server_t *s, tide_coord_job_t *j, tide_coord_worker_t *w)
{
    tide_reconf_t *r = j->reconf;
    int32_t jr = tide_coord_job_rank(j, w);
    long i = r && jr >= 0 ? tide_reconf_find(r, jr) : -1;
    if (i < 0 || r->gone[i] || r->acked[i])
        return;
    send_phase(s, j, w);
}

/* ---- start ----------------------------------------------------------------------------------- */

static int cmp_i32(const void *a, const void *b)
{
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return x < y ? -1 : x > y;
}

/*
 * When layout places j on ranks of a pool that joined but is not connected, r becomes
 * the generation that connects it: every live rank of j's connected pools (the side
 * that accepts; all of them, since the connection is collective over them) and every
 * live rank of the joining pool (the side that connects) take part. One pool per
 * generation. Offline work on a connected rank outside the layouts is preempted for
 * the connection (its acks wait for that work to stop).
 */
static tide_status setup_join(tide_server_t *s, tide_coord_job_t *j, tide_reconf_t *r)
{
    int jp = -1;
    for (size_t i = 0; i < tide_layout_size(r->layout); i++) {
        int32_t rk = 0;
        int p = tide_coord_job_locate(j, r->layout->worker[i], &rk);
        if (p >= 0 && j->pools[p].left)
            return tide_errorf(TIDE_ERR_INVALID,
                               "the layout places job %s on job rank %d of pool %s, which left the "
                               "job at generation %llu",
                               j->name, r->layout->worker[i], j->pools[p].name,
                               (unsigned long long)j->pools[p].left);
        if (p < 0 || j->pools[p].connected)
            continue;
        if (jp >= 0 && p != jp)
            return tide_errorf(TIDE_ERR_INVALID,
                               "the layout places job %s on pools %s and %s, neither connected "
                               "yet: connect one pool per resize",
                               j->name, j->pools[jp].name, j->pools[p].name);
        jp = p;
    }
    if (jp < 0)
        return TIDE_OK;
    tide_coord_state_t *st = s->st;
    int32_t *o = tide_malloc((st->n_workers ? st->n_workers : 1) * sizeof *o);
    int32_t *n = tide_malloc((st->n_workers ? st->n_workers : 1) * sizeof *n);
    size_t no = 0, nn = 0;
    tide_status rc = TIDE_OK;
    if (o == NULL || n == NULL) {
        rc = tide_errorf(TIDE_ERR_NOMEM, "out of memory listing the ranks of a join");
        goto out;
    }
    for (size_t i = 0; i < st->n_workers; i++) {
        tide_coord_worker_t *w = &st->workers[i];
        int p = w->pool[0] != '\0' ? tide_coord_job_pool_find(j, w->pool) : -1;
        if (p < 0 || (p != jp && !j->pools[p].connected) || w->joined != j->id ||
            tide_coord_worker_gone(w))
            continue;
        int32_t jr = j->pools[p].base + w->rank;
        if (p == jp)
            n[nn++] = jr;
        else
            o[no++] = jr;
    }
    qsort(o, no, sizeof *o, cmp_i32);
    qsort(n, nn, sizeof *n, cmp_i32);
    if (no == 0)
        TIDE_FAIL_GOTO(rc, out, TIDE_ERR_INVALID, "job %s has no live rank to connect pool %s to",
                       j->name, j->pools[jp].name);
    for (size_t i = 0; i < tide_layout_size(r->layout); i++) {
        int32_t x = r->layout->worker[i], rk = 0;
        if (tide_coord_job_locate(j, x, &rk) == jp && !bsearch(&x, n, nn, sizeof *n, cmp_i32))
            TIDE_FAIL_GOTO(rc, out, TIDE_ERR_INVALID,
                           "job rank %d of pool %s has not joined job %s", x, j->pools[jp].name,
                           j->name);
    }
    TIDE_CHECK_GOTO(tide_reconf_set_join(r, jp, o, no, n, nn), rc, out);
    for (size_t i = 0; i < no; i++) {
        tide_coord_worker_t *w = tide__job_worker(s, j, o[i]);
        if (w != NULL && w->state == TIDE_WS_OFFLINE)
            tide__preempt_for(s, j, w, r->gen);
    }
out:
    tide_free(o);
    tide_free(n);
    return rc;
}

/* 1 when pool p of j holds a coordinate of layout l. */
static int pool_in_layout(const tide_coord_job_t *j, int p, const tide_layout_t *l)
{
    for (size_t i = 0; i < tide_layout_size(l); i++) {
        int32_t rk = 0;
        if (tide_coord_job_locate(j, l->worker[i], &rk) == p)
            return 1;
    }
    return 0;
}

tide_status tide__reconf_setup_leave(tide_server_t *s, tide_coord_job_t *j)
{
    tide_reconf_t *r = j->reconf;
    /* A recovery keeps every pool: it runs on whatever survived, and a pool left out of
       it may be what the job grows back onto. A join connects one pool per generation
       and releases none: its connected side is collective over every connected pool. */
    if (r == NULL || r->recover || r->join_pool >= 0)
        return TIDE_OK;
    /* A job that yields GPUs to a higher priority keeps its launches too: their ranks wait
       idle and the job grows back onto them when the GPUs are free again. */
    if (j->el_keep_pools)
        return TIDE_OK;
    uint32_t mask = 0;
    for (int p = 0; p < j->n_pools; p++)
        if (j->pools[p].connected && !j->pools[p].left && !pool_in_layout(j, p, r->layout))
            mask |= 1u << p;
    if (mask == 0)
        return TIDE_OK;
    tide_coord_state_t *st = s->st;
    int32_t *stay = tide_malloc((st->n_workers ? st->n_workers : 1) * sizeof *stay);
    int32_t *leave = tide_malloc((st->n_workers ? st->n_workers : 1) * sizeof *leave);
    size_t ns = 0, nl = 0;
    tide_status rc = TIDE_OK;
    if (stay == NULL || leave == NULL)
        TIDE_FAIL_GOTO(rc, out, TIDE_ERR_NOMEM, "out of memory listing the ranks of a release");
    for (size_t i = 0; i < st->n_workers; i++) {
        tide_coord_worker_t *w = &st->workers[i];
        int p = w->pool[0] != '\0' ? tide_coord_job_pool_find(j, w->pool) : -1;
        if (p < 0 || !j->pools[p].connected || j->pools[p].left || w->joined != j->id ||
            tide_coord_worker_gone(w))
            continue;
        int32_t jr = j->pools[p].base + w->rank;
        if (mask & (1u << p))
            leave[nl++] = jr;
        else
            stay[ns++] = jr;
    }
    /* released pools none of whose ranks lives (a lost host) have nobody to tell: they
       stay as they are, like any dead rank of the job */
    if (nl == 0)
        goto out;
    qsort(stay, ns, sizeof *stay, cmp_i32);
    qsort(leave, nl, sizeof *leave, cmp_i32);
    for (size_t i = 0; i < tide_layout_size(r->layout); i++)
        if (!bsearch(&r->layout->worker[i], stay, ns, sizeof *stay, cmp_i32))
            TIDE_FAIL_GOTO(rc, out, TIDE_ERR_INVALID,
                           "job rank %d of job %s's new layout is not a live rank of a connected "
                           "pool",
                           r->layout->worker[i], j->name);
    TIDE_CHECK_GOTO(tide_reconf_set_leave(r, mask, stay, ns, leave, nl), rc, out);
    /* every live rank of the job takes part (each side makes a communicator of its own):
       offline work on an idle one is preempted for it (its ack waits for that) */
    for (size_t i = 0; i < ns + nl; i++) {
        tide_coord_worker_t *w = tide__job_worker(s, j, i < ns ? stay[i] : leave[i - ns]);
        if (w != NULL && w->state == TIDE_WS_OFFLINE)
            tide__preempt_for(s, j, w, r->gen);
    }
out:
    tide_free(stay);
    tide_free(leave);
    return rc;
}

/* The names of the pools in mask (bit p: j's pool p), comma-separated, into buf. */
static const char *pool_names(const tide_coord_job_t *j, uint32_t mask, char *buf, size_t len)
{
    size_t k = 0;
    buf[0] = '\0';
    for (int p = 0; p < j->n_pools && k < len; p++)
        if (mask & (1u << p))
            k += (size_t)snprintf(buf + k, len - k, "%s%s", k ? ", " : "", j->pools[p].name);
    return buf;
}

tide_status tide__reconf_start(tide_server_t *s, tide_coord_job_t *j, tide_layout_t *layout,
                               const int32_t *preempt, size_t n_preempt, int recover,
                               const char *reason, const tide_coord_ckpt *ckpt)
{
    tide_reconf_t *r = NULL;
    uint64_t gen = j->gen_issued + 1;
    TIDE_CHECK(tide_reconf_new(&r, j->layout, layout, gen, recover));
    if (ckpt != NULL) {
        snprintf(r->ckpt, sizeof r->ckpt, "%s", ckpt->dir);
        r->ckpt_step = ckpt->step;
    }
    tide_status rc = setup_join(s, j, r);
    if (rc == TIDE_OK) {
        j->reconf = r; /* setup_leave reads it; nothing is sent before the end */
        rc = tide__reconf_setup_leave(s, j);
        j->reconf = NULL;
    }
    if (rc != TIDE_OK) {
        tide_reconf_destroy(&r);
        return rc;
    }
    uint64_t now = tide_now_ns();
    j->gen_issued = gen;
    r->started_ms = tide_wall_ms();
    r->started_ns = now;
    r->deadline_ns = now + (uint64_t)s->cfg.resize_timeout_ms * 1000000ull;
    snprintf(r->reason, sizeof r->reason, "%s", reason);
    for (size_t i = 0; i < r->n_parts; i++) {
        tide_coord_worker_t *w = tide__job_worker(s, j, r->parts[i]);
        r->gone[i] = w == NULL || tide_coord_worker_gone(w);
    }
    j->reconf = r;
    j->state = TIDE_JS_RESIZING;
    for (size_t i = 0; i < n_preempt; i++)
        tide__preempt_for(s, j, tide__job_worker(s, j, preempt[i]), gen);
    /* reserve new-only participants so backfill leaves them alone */
    for (size_t i = 0; i < r->n_parts; i++) {
        if (r->old_member[i] || r->gone[i])
            continue;
        if (r->join_pool >= 0 && !tide_coord_layout_has(r->layout, r->parts[i]))
            continue; /* takes part in the join only */
        tide_coord_worker_t *w = tide__job_worker(s, j, r->parts[i]);
        if (w != NULL && w->state == TIDE_WS_IDLE) {
            w->job = j->id;
            tide__save_worker(s, w);
        }
    }
    char from[200], to[200];
    tide_proto_event_fields_t f;
    tide_event_fields_init(&f);
    f.gen = gen;
    tide_layout_t *ids = NULL;
    (void)tide__layout_worker_ids(s, j, r->layout, &ids); /* none: the event without them */
    tide_event_fields_layout(&f, r->layout, ids, j->layout);
    tide_event_fields_reason(&f, reason);
    tide__event_f(s, j->name, recover ? "recovery_started" : "resize_started", &f,
                  "generation %llu: %s -> %s (%s); %zu participants, %zu offline jobs preempted",
                  (unsigned long long)gen, tide_layout_format(j->layout, from, sizeof from),
                  tide_layout_format(r->layout, to, sizeof to), reason, r->n_parts, n_preempt);
    tide_layout_destroy(&ids);
    if (r->join_pool >= 0) {
        const tide_coord_job_pool *jp = &j->pools[r->join_pool];
        tide__event(s, j->name, "join_started",
                    "generation %llu connects pool %s (%zu ranks) to the job's %zu ranks "
                    "(MPI accept/connect: every pool's mpirun needs --ompi-server%s%s)",
                    (unsigned long long)gen, jp->name, r->n_join_new, r->n_join_old,
                    s->cfg.ompi_server ? " " : "", s->cfg.ompi_server ? s->cfg.ompi_server : "");
    }
    if (r->n_leave > 0) {
        char names[400];
        tide__event(s, j->name, "release_started",
                    "generation %llu holds no rank of pool(s) %s: their %zu live ranks leave the "
                    "job once it commits, and its %zu other live ranks drop their connection to "
                    "them at the switch",
                    (unsigned long long)gen, pool_names(j, r->leave_pools, names, sizeof names),
                    r->n_leave, r->n_stay);
    }
    tide__save_job(s, j);
    tide__reconf_resend(s, j, 0);
    return TIDE_OK;
}

/* ---- progress -------------------------------------------------------------------------------- */

tide_coord_job_t *tide__reconf_report(tide_server_t *s, tide_coord_worker_t *w, const char *name,
                                      uint64_t gen, long *idx, const char *what)
{
    tide_coord_job_t *j = tide_coord_job_by_name(s->st, name);
    if (j == NULL || j->kind != TIDE_CJOB_ONLINE) {
        tide__reply_error(s, TIDE_ERR_NOT_FOUND, "%s: no online job named %s", what, name);
        return NULL;
    }
    tide_reconf_t *r = j->reconf;
    if (r == NULL || r->gen != gen) {
        tide__reply_error(s, TIDE_ERR_STALE,
                          "%s: generation %llu of job %s is not pending (committed %llu%s)", what,
                          (unsigned long long)gen, j->name, (unsigned long long)j->generation,
                          r ? ", another one is" : "");
        return NULL;
    }
    int32_t jr = tide_coord_job_rank(j, w);
    *idx = jr >= 0 ? tide_reconf_find(r, jr) : -1;
    if (*idx < 0) {
        tide__reply_error(s, TIDE_ERR_INVALID,
                          "%s: worker %d does not take part in generation %llu of job %s", what,
                          w->id, (unsigned long long)gen, j->name);
        return NULL;
    }
    return j;
}

static int all_acked(const tide_reconf_t *r)
{
    for (size_t i = 0; i < r->n_parts; i++)
        if (!r->gone[i] && !r->acked[i])
            return 0;
    return 1;
}

void tide__on_prepare_ack(tide_server_t *s, const tide_msg_t *msg, const void *raw, size_t len)
{
    (void)raw;
    (void)len;
    const tide_proto_prepare_ack_t *m = &msg->u.prepare_ack;
    tide_coord_worker_t *w = tide__sender(s, m->worker, msg->type);
    long i;
    tide_coord_job_t *j = w ? tide__reconf_report(s, w, m->job, m->gen, &i, "prepare_ack") : NULL;
    if (j == NULL)
        return;
    tide_reconf_t *r = j->reconf;
    if (r->phase != TIDE_RP_PREPARE) {
        send_phase(s, j, w); /* a late duplicate: it missed the commit */
        return;
    }
    r->acked[i] = 1;
    r->ack_step[i] = m->step > INT64_MAX ? INT64_MAX : (int64_t)m->step;
    if (!all_acked(r))
        return;
    int64_t step =
        tide_policy_switch_step(r->ack_step, r->old_member, r->gone, r->n_parts, r->recover);
    if (step < 0)
        step = j->step; /* no old member left: the new layout starts from the job's step */
    r->switch_step = step;
    r->phase = TIDE_RP_COMMIT;
    memset(r->acked, 0, r->n_parts);
    tide__event(s, j->name, "switch_step", "generation %llu switches after step %lld",
                (unsigned long long)r->gen, (long long)step);
    tide__save_job(s, j);
    tide__reconf_resend(s, j, 0);
}

/* The event of j's pending reconfiguration committing after dur ns, while j->layout is
   still the layout before it. */
static void commit_event(tide_server_t *s, const tide_coord_job_t *j, uint64_t dur)
{
    const tide_reconf_t *r = j->reconf;
    char desc[200];
    tide_proto_event_fields_t f;
    tide_event_fields_init(&f);
    f.gen = r->gen;
    tide_layout_t *ids = NULL;
    (void)tide__layout_worker_ids(s, j, r->layout, &ids); /* none: the event without them */
    tide_event_fields_layout(&f, r->layout, ids, j->layout);
    tide_event_fields_reason(&f, r->reason);
    f.ms = (double)dur / 1e6;
    f.step = r->switch_step;
    tide_layout_format(r->layout, desc, sizeof desc);
    if (r->ckpt[0] != '\0') {
        f.step = r->ckpt_step;
        f.steps_lost = r->switch_step > r->ckpt_step ? r->switch_step - r->ckpt_step : 0;
        tide__event_f(s, j->name, "rolled_back", &f,
                      "generation %llu committed: %s from the checkpoint of step %lld (%s); steps "
                      "lost: %lld (the job had completed %lld), %.1f ms (%s)",
                      (unsigned long long)r->gen, desc, (long long)r->ckpt_step, r->ckpt,
                      (long long)(r->switch_step - r->ckpt_step), (long long)r->switch_step, f.ms,
                      r->reason);
    } else {
        f.bytes = r->bytes_moved;
        f.downtime_ms = r->switch_ms_max;
        tide__event_f(
            s, j->name, r->recover ? "recovered" : "resized", &f,
            "generation %llu committed: %s from step %lld, %.1f ms, %llu bytes moved, longest "
            "worker switch %.1f ms (%s)",
            (unsigned long long)r->gen, desc, (long long)r->switch_step, f.ms,
            (unsigned long long)r->bytes_moved, r->switch_ms_max, r->reason);
    }
    tide_layout_destroy(&ids);
}

void tide__reconf_commit(tide_server_t *s, tide_coord_job_t *j)
{
    tide_reconf_t *r = j->reconf;
    for (size_t i = 0; i < r->n_parts; i++) {
        if (r->gone[i])
            continue;
        tide_coord_worker_t *w = tide__job_worker(s, j, r->parts[i]);
        if (w == NULL)
            continue;
        if (tide_coord_layout_has(r->layout, r->parts[i])) {
            w->state = TIDE_WS_ONLINE;
            w->job = j->id;
        } else {
            w->job = 0;
            if (w->state != TIDE_WS_DRAINING)
                w->state = TIDE_WS_IDLE;
        }
        tide__save_worker(s, w);
    }
    uint64_t dur = tide_now_ns() - r->started_ns;
    tide_coord_counters *c = &s->st->counters;
    c->resizes_committed++;
    c->resize_ns_sum += dur;
    if (dur > c->resize_ns_max)
        c->resize_ns_max = dur;
    tide__metrics_resize_observe(c, dur);
    c->bytes_resharded += r->bytes_moved > r->planned_bytes ? r->bytes_moved : r->planned_bytes;
    if (r->join_pool >= 0 && r->join_pool < j->n_pools) {
        tide_coord_job_pool *jp = &j->pools[r->join_pool];
        jp->connected = 1;
        tide__event(s, j->name, "pool_connected",
                    "generation %llu connected pool %s (job ranks %d..%d) to the job's %zu "
                    "ranks",
                    (unsigned long long)r->gen, jp->name, jp->base, jp->base + jp->size - 1,
                    r->n_join_old);
    }
    for (int p = 0; r->leave_pools != 0 && p < j->n_pools; p++) {
        if (!(r->leave_pools & (1u << p)))
            continue;
        tide_coord_job_pool *jp = &j->pools[p];
        jp->connected = 0;
        jp->left = r->gen;
        tide__event(s, j->name, "pool_left",
                    "generation %llu released pool %s (job ranks %d..%d): its launch left the "
                    "job and may exit",
                    (unsigned long long)r->gen, jp->name, jp->base, jp->base + jp->size - 1);
    }
    /* every participant reported done: no rank still waits on a released one's part of
       the switch, so they may finish now */
    for (size_t i = 0; i < r->n_leave; i++) {
        tide_coord_worker_t *w = tide__job_worker(s, j, r->leave[i]);
        if (w != NULL && !tide_coord_worker_gone(w))
            tide__send_release(s, j, w);
    }
    commit_event(s, j, dur);
    tide_layout_destroy(&j->layout);
    j->layout = r->layout;
    r->layout = NULL;
    j->generation = r->gen;
    if (r->ckpt[0] != '\0')
        j->step = r->ckpt_step; /* the state went back to the checkpoint: so did the step */
    else if (r->switch_step > j->step)
        j->step = r->switch_step;
    tide_reconf_destroy(&j->reconf);
    j->state = TIDE_JS_RUNNING;
    tide__save_job(s, j);
    tide__reschedule(s);
}

void tide__reconf_done(tide_server_t *s, tide_coord_job_t *j, long idx, uint64_t bytes,
                       double ms)
{
    tide_reconf_t *r = j->reconf;
    if (!r->acked[idx]) {
        r->bytes_moved += bytes;
        if (ms > r->switch_ms_max)
            r->switch_ms_max = ms;
    }
    r->acked[idx] = 1;
    if (all_acked(r)) {
        tide__reconf_commit(s, j);
    } else if (!r->switched) {
        /* from now on G cannot be abandoned: this worker's old state is gone (durable, so
         * that a restarted tided keeps to it too) */
        r->switched = 1;
        tide__save_job(s, j);
    }
}

void tide__reconf_abandon(tide_server_t *s, tide_coord_job_t *j, const char *reason)
{
    tide_reconf_t *r = j->reconf;
    if (r == NULL)
        return;
    tide_msg_t m;
    tide_msg_init(&m, TIDE_MSG_ABORT);
    snprintf(m.u.abort_.job, sizeof m.u.abort_.job, "%s", j->name);
    m.u.abort_.gen = r->gen;
    snprintf(m.u.abort_.reason, sizeof m.u.abort_.reason, "%s", reason);
    for (size_t i = 0; i < r->n_parts; i++) {
        tide_coord_worker_t *w = tide__job_worker(s, j, r->parts[i]);
        if (w == NULL || r->gone[i])
            continue;
        tide__send_worker(s, w, &m);
        if (!r->old_member[i] && w->job == j->id && w->state != TIDE_WS_ONLINE) {
            w->job = 0; /* reserved for the abandoned layout: free again */
            tide__save_worker(s, w);
        }
    }
    s->st->counters.resizes_aborted++;
    tide_proto_event_fields_t f;
    tide_event_fields_init(&f);
    f.gen = r->gen;
    tide_event_fields_layout(&f, r->layout, NULL, j->layout);
    tide_event_fields_reason(&f, reason);
    if (r->join_pool >= 0 && r->join_pool < j->n_pools)
        tide__event_f(s, j->name, "resize_aborted", &f,
                      "generation %llu abandoned: %s; pool %s stays unconnected and generation "
                      "%llu goes on",
                      (unsigned long long)r->gen, reason, j->pools[r->join_pool].name,
                      (unsigned long long)j->generation);
    else
        tide__event_f(s, j->name, "resize_aborted", &f,
                      "generation %llu abandoned: %s; generation %llu stays",
                      (unsigned long long)r->gen, reason, (unsigned long long)j->generation);
    tide_reconf_destroy(&j->reconf);
    j->state = TIDE_JS_RUNNING;
    tide__save_job(s, j);
    tide__reschedule(s);
}

void tide__on_join_port(tide_server_t *s, const tide_msg_t *msg, const void *raw, size_t len)
{
    (void)raw;
    (void)len;
    const tide_proto_join_port_t *m = &msg->u.join_port;
    tide_coord_worker_t *w = tide__sender(s, m->worker, msg->type);
    long i;
    tide_coord_job_t *j = w ? tide__reconf_report(s, w, m->job, m->gen, &i, "join_port") : NULL;
    if (j == NULL)
        return;
    tide_reconf_t *r = j->reconf;
    if (r->join_pool < 0 || r->n_join_old == 0 || r->parts[i] != r->join_old[0]) {
        tide__reply_error(s, TIDE_ERR_INVALID,
                          "join_port: generation %llu of job %s connects no pool through worker %d",
                          (unsigned long long)m->gen, j->name, w->id);
        return;
    }
    snprintf(r->port, sizeof r->port, "%s", m->port);
    for (size_t k = 0; k < r->n_join_new; k++) {
        tide_coord_worker_t *x = tide__job_worker(s, j, r->join_new[k]);
        long xi = tide_reconf_find(r, r->join_new[k]);
        if (x != NULL && xi >= 0 && !r->gone[xi])
            send_port(s, j, x);
    }
    TIDE_INFO("reconf", "job %s generation %llu: port of the join relayed to %zu ranks of pool %s",
              j->name, (unsigned long long)r->gen, r->n_join_new, j->pools[r->join_pool].name);
}

void tide__reconf_reload(tide_server_t *s)
{
    uint64_t now = s->now_ns;
    for (size_t i = 0; i < s->st->n_jobs; i++) {
        tide_coord_job_t *j = s->st->jobs[i];
        tide_reconf_t *r = j->reconf;
        if (r == NULL)
            continue;
        r->started_ns = now;
        r->deadline_ns = now + (uint64_t)s->cfg.resize_timeout_ms * 1000000ull;
        r->resend_ns = now;
        /* a release's ranks are not stored either: listed again from the pools, and one
           that no rank switched yet abandoned at once like a join */
        int release = 0;
        if (tide__reconf_setup_leave(s, j) != TIDE_OK) {
            TIDE_WARN("server", "job %s: generation %llu's release cannot be listed again: %s",
                      j->name, (unsigned long long)r->gen, tide_last_error());
            release = 1;
        }
        release |= r->n_leave > 0;
        if (release && !r->switched)
            r->deadline_ns = now;
        for (size_t k = 0; k < r->n_parts; k++) {
            tide_coord_worker_t *w = tide__job_worker(s, j, r->parts[k]);
            r->gone[k] = w == NULL || tide_coord_worker_gone(w);
        }
        /* a join's ranks and port are not stored: one that no rank switched yet is
           abandoned at once (the job stays on its layout; the resize can be repeated) */
        for (size_t k = 0; !r->switched && k < tide_layout_size(r->layout); k++) {
            int32_t rk = 0;
            int p = tide_coord_job_locate(j, r->layout->worker[k], &rk);
            if (p >= 0 && !j->pools[p].connected)
                r->deadline_ns = now;
        }
    }
}
