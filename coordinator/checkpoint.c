/*
 * coordinator/checkpoint: what tided knows of an online job's checkpoints. The layout's
 * first member reports each complete checkpoint ("saved"); tided keeps the newest few
 * (durably, with the job) so that a recovery whose lost state no survivor holds rolls the
 * job back to the last one (recovery.c) instead of halting it. `tidectl checkpoint JOB`
 * has the members save at a step none of them has reached yet and no other request of the
 * job holds (a rank's saver takes two saves of one boundary at most), agreed in two phases
 * ("save" PROPOSE, "save_ack" from every rank with the steps it had completed, then GO, or
 * a new proposal further on): tided's own view of the job's step comes from heartbeats
 * and lags it, by more than the margin it adds when the machine is loaded or the job's
 * speed is not known yet. A job's ranks hold at most TIDE_PROTO_SAVES_MAX requests until
 * their steps, so tided counts those it agreed that a member has not completed and refuses
 * the operator past that bound rather than acknowledge a save a rank would refuse. Event
 * loop thread; O(members) per answer, O(agreed x members) per request.
 */
#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "core/log.h"
#include "coordinator/checkpoint.h"
#include "coordinator/members.h"
#include "coordinator/policy.h"
#include "coordinator/sender.h"

void tide__on_saved(tide_server_t *s, const tide_msg_t *msg, const void *raw, size_t len)
{
    (void)raw;
    (void)len;
    const tide_proto_saved_t *m = &msg->u.saved;
    tide_coord_worker_t *w = tide__sender(s, m->worker, msg->type);
    if (w == NULL)
        return;
    tide_coord_job_t *j = tide_coord_job_by_name(s->st, m->job);
    /* w->joined: a rank reports the requests its job ended before after the job released it */
    if (j == NULL || j->kind != TIDE_CJOB_ONLINE || (w->job != j->id && w->joined != j->id)) {
        tide__reply_error(s, TIDE_ERR_NOT_FOUND, "saved: worker %d runs no online job named %s",
                          w->id, m->job);
        return;
    }
    if (m->code != 0) {
        tide__event(s, j->name, "checkpoint_failed",
                    "the checkpoint of step %llu under %.400s failed on worker %d: %s: %.400s",
                    (unsigned long long)m->step, m->dir, w->id, tide_strerror((tide_status)m->code),
                    m->reason);
        return;
    }
    if (m->step > (uint64_t)INT64_MAX ||
        tide_coord_job_add_ckpt(j, (int64_t)m->step, m->dir) != TIDE_OK) {
        tide__reply_error(s, TIDE_ERR_INVALID, "saved: %s",
                          m->step > (uint64_t)INT64_MAX ? "step out of range" : tide_last_error());
        return;
    }
    tide_proto_event_fields_t f;
    tide_event_fields_init(&f);
    f.gen = j->generation;
    f.step = (int64_t)m->step;
    tide_event_fields_worker(&f, &w->id, w);
    tide__event_f(s, j->name, "checkpoint_saved", &f, "step %llu saved in %.900s by worker %d",
                  (unsigned long long)m->step, m->dir, w->id);
    tide__save_job(s, j);
}

/* The root j's newest checkpoint lies under (its directory's parent) into out; 0 when j
   reported none. */
static int last_root(const tide_coord_job_t *j, char *out, size_t len)
{
    if (j->n_ckpts == 0)
        return 0;
    snprintf(out, len, "%s", j->ckpts[j->n_ckpts - 1].dir);
    char *slash = strrchr(out, '/');
    if (slash == NULL || slash == out)
        return 0;
    *slash = '\0';
    return 1;
}

/* ---- operators' requests, agreed with the ranks ----------------------------------------- */

/* One request being agreed. In memory only: a tided restart forgets it (its operator's
   tidectl times out), and the ranks give up a proposal nobody decided (worker/ckpt.c). */
typedef struct ckreq {
    uint64_t id;  /* the proposal's id (a new one per proposal) */
    uint64_t job; /* the job's id */
    char root[TIDE_COORD_CKPT_DIR_MAX];
    int64_t step;         /* proposed */
    int round;            /* proposals so far */
    uint64_t deadline_ns; /* the members' answers, at most */
    tide__request to;     /* tidectl's connection */
    size_t n;             /* members asked */
    int32_t *member;      /* their worker ids */
    int64_t *done;        /* steps each had completed when it heard; -1: no answer yet */
} ckreq;

/* A request agreed (GO sent) at a step a live member of its job may not have completed:
   every rank holds it until it completes that step (worker/ckpt.c), and a rank holds
   TIDE_PROTO_SAVES_MAX requests at most, those being agreed included. */
typedef struct ckagreed {
    uint64_t job;
    int64_t step;
} ckagreed;

struct tide__ckreqs {
    ckreq q[TIDE__CKREQ_MAX];
    size_t n;
    uint64_t next_id;
    ckagreed *agreed; /* n_agreed of cap_agreed; forgotten once reached (forget_reached) */
    size_t n_agreed, cap_agreed;
};

static void ckreq_free(ckreq *r)
{
    tide_free(r->member);
    tide_free(r->done);
    memset(r, 0, sizeof *r);
}

/* Removes request i (its arrays freed). */
static void ckreq_remove(tide_server_t *s, size_t i)
{
    struct tide__ckreqs *c = s->ckreqs;
    ckreq_free(&c->q[i]);
    c->q[i] = c->q[--c->n];
    memset(&c->q[c->n], 0, sizeof c->q[c->n]);
}

/* Sends "save" {phase, r} to every live rank of job j: a resize may make any of them a
   member by the request's step. */
static void send_save(tide_server_t *s, const tide_coord_job_t *j, const ckreq *r, uint32_t phase)
{
    tide_msg_t sm;
    tide_msg_init(&sm, TIDE_MSG_SAVE);
    snprintf(sm.u.save.job, sizeof sm.u.save.job, "%s", j->name);
    snprintf(sm.u.save.dir, sizeof sm.u.save.dir, "%s", r->root);
    sm.u.save.step = (uint64_t)r->step;
    sm.u.save.id = r->id;
    sm.u.save.phase = phase;
    for (size_t k = 0; k < s->st->n_workers; k++) {
        const tide_coord_worker_t *w = &s->st->workers[k];
        if (w->pool[0] != '\0' && w->joined == j->id && !tide_coord_worker_gone(w))
            tide__send_worker(s, w, &sm);
    }
}

/* The furthest step tided heard of from j's members, how many live members it has and
   (slowest, may be NULL) the fewest steps one of them completed (j->step when none). */
static int64_t furthest_step(tide_server_t *s, const tide_coord_job_t *j, size_t *members,
                             int64_t *slowest)
{
    int64_t step = j->step, least = INT64_MAX;
    size_t n = 0;
    for (size_t i = 0; j->layout != NULL && i < tide_layout_size(j->layout); i++) {
        const tide_coord_worker_t *w = tide__job_worker(s, j, j->layout->worker[i]);
        if (w != NULL && !tide_coord_worker_gone(w) && w->job == j->id) {
            n++;
            if (w->step > step)
                step = w->step;
            if (w->step < least)
                least = w->step;
        }
    }
    if (members != NULL)
        *members = n;
    if (slowest != NULL)
        *slowest = n > 0 ? least : j->step;
    return step;
}

/* Forgets the agreed requests every live member of their job completed the step of (as
   far as heartbeats tell: late, so never too early), and those of jobs no longer
   training. */
static void forget_reached(tide_server_t *s)
{
    struct tide__ckreqs *c = s->ckreqs;
    for (size_t i = 0; i < c->n_agreed;) {
        const tide_coord_job_t *j = tide_coord_job_get(s->st, c->agreed[i].job);
        int64_t slowest = 0;
        int live = j != NULL && j->kind == TIDE_CJOB_ONLINE && j->layout != NULL &&
                   (j->state == TIDE_JS_RUNNING || j->state == TIDE_JS_RESIZING ||
                    j->state == TIDE_JS_STALLED);
        if (live)
            furthest_step(s, j, NULL, &slowest);
        if (!live || slowest >= c->agreed[i].step)
            c->agreed[i] = c->agreed[--c->n_agreed];
        else
            i++;
    }
}

/* The requests of j its ranks may hold now: those being agreed and those agreed at a step
   not all its members completed. */
static size_t held(tide_server_t *s, const tide_coord_job_t *j)
{
    forget_reached(s);
    const struct tide__ckreqs *c = s->ckreqs;
    size_t n = 0;
    for (size_t i = 0; i < c->n; i++)
        n += c->q[i].job == (uint64_t)j->id;
    for (size_t i = 0; i < c->n_agreed; i++)
        n += c->agreed[i].job == (uint64_t)j->id;
    return n;
}

/* Remembers that j's ranks hold a request agreed at step. TIDE_ERR_NOMEM. */
static tide_status remember_agreed(tide_server_t *s, const tide_coord_job_t *j, int64_t step)
{
    struct tide__ckreqs *c = s->ckreqs;
    if (c->n_agreed == c->cap_agreed) {
        size_t cap = c->cap_agreed ? 2 * c->cap_agreed : TIDE_PROTO_SAVES_MAX;
        ckagreed *a = tide_reallocarray(c->agreed, cap, sizeof *a);
        if (a == NULL)
            return tide_errorf(TIDE_ERR_NOMEM, "no memory to track %zu agreed checkpoints", cap);
        c->agreed = a;
        c->cap_agreed = cap;
    }
    c->agreed[c->n_agreed++] = (ckagreed){.job = (uint64_t)j->id, .step = step};
    return TIDE_OK;
}

/* The furthest step another request of j was agreed at or is proposed at: two requests at
   one step would both reach a rank's saver at one boundary, and it holds two saves at once
   (the one being written and one behind it), so a third of that step would be refused. */
static int64_t step_taken(const tide_server_t *s, const tide_coord_job_t *j, const ckreq *r)
{
    int64_t taken = j->ckpt_agreed;
    const struct tide__ckreqs *c = s->ckreqs;
    for (size_t i = 0; i < c->n; i++)
        if (&c->q[i] != r && c->q[i].job == (uint64_t)j->id && c->q[i].step > taken)
            taken = c->q[i].step;
    return taken;
}

/* Proposes r (a new id) at a step past `from`, past what tided heard of and past the steps
   of j's other requests: the members of j's layout are asked for their answers again.
   TIDE_ERR_NOMEM with nothing sent. */
static tide_status propose(tide_server_t *s, const tide_coord_job_t *j, ckreq *r, int64_t from)
{
    size_t n = 0;
    int64_t furthest = furthest_step(s, j, &n, NULL);
    int32_t *member = tide_calloc(n ? n : 1, sizeof *member);
    int64_t *done = tide_calloc(n ? n : 1, sizeof *done);
    if (member == NULL || done == NULL) {
        tide_free(member);
        tide_free(done);
        return tide_errorf(TIDE_ERR_NOMEM, "no memory for a checkpoint request of %zu members", n);
    }
    size_t k = 0;
    for (size_t i = 0; i < tide_layout_size(j->layout) && k < n; i++) {
        const tide_coord_worker_t *w = tide__job_worker(s, j, j->layout->worker[i]);
        if (w != NULL && !tide_coord_worker_gone(w) && w->job == j->id) {
            member[k] = w->id;
            done[k++] = -1;
        }
    }
    tide_free(r->member);
    tide_free(r->done);
    r->member = member;
    r->done = done;
    r->n = k;
    r->id = ++s->ckreqs->next_id;
    r->round++;
    r->step = tide_policy_ckpt_step(from > furthest ? from : furthest, j->throughput,
                                    s->cfg.heartbeat_ms);
    int64_t taken = step_taken(s, j, r);
    if (r->step <= taken)
        r->step = taken + 1;
    r->deadline_ns = s->now_ns + (uint64_t)TIDE__CKREQ_WAIT_MS * 1000000ull;
    send_save(s, j, r, TIDE_PROTO_SAVE_PROPOSE);
    TIDE_INFO("ckpt",
              "job %s: checkpoint request %llu proposes step %lld to %zu members (round %d)",
              j->name, (unsigned long long)r->id, (long long)r->step, r->n, r->round);
    return TIDE_OK;
}

/* Request i fails: its operator gets the reason, the ranks drop it, an event says so. */
static void fail_request(tide_server_t *s, size_t i, tide_coord_job_t *j, tide_status code,
                         const char *why)
{
    ckreq *r = &s->ckreqs->q[i];
    tide_msg_t m;
    tide_msg_init(&m, TIDE_MSG_ERROR);
    m.u.error.code = code;
    snprintf(m.u.error.message, sizeof m.u.error.message, "%s", why);
    tide__reply_to(s, &r->to, &m);
    if (j != NULL) {
        send_save(s, j, r, TIDE_PROTO_SAVE_DROP);
        tide__event(s, j->name, "checkpoint_failed",
                    "the requested checkpoint under %.400s was not taken: %.600s", r->root, why);
    }
    ckreq_remove(s, i);
}

/* Every live member answered request i: GO when none had reached its step (the operator
   gets the step), else a new proposal past the furthest, or the request fails. 1 when it
   left the list. */
static int decide(tide_server_t *s, size_t i, tide_coord_job_t *j)
{
    ckreq *r = &s->ckreqs->q[i];
    int64_t furthest = -1;
    int32_t who = -1;
    for (size_t k = 0; k < r->n; k++)
        if (r->done[k] > furthest) {
            furthest = r->done[k];
            who = r->member[k];
        }
    if (furthest >= r->step) {
        char why[512];
        snprintf(why, sizeof why,
                 "worker %d had completed %lld steps when it heard of step %lld (proposal %d "
                 "of %d)",
                 who, (long long)furthest, (long long)r->step, r->round, TIDE__CKREQ_ROUNDS);
        TIDE_INFO("ckpt", "job %s: %s", j->name, why);
        send_save(s, j, r, TIDE_PROTO_SAVE_DROP);
        if (r->round < TIDE__CKREQ_ROUNDS && propose(s, j, r, furthest) == TIDE_OK)
            return 0;
        char full[sizeof why + 256];
        snprintf(full, sizeof full,
                 "job %.64s's ranks passed every step proposed for the checkpoint (its steps "
                 "outrun tided's messages): %s; ask again",
                 j->name, why);
        fail_request(s, i, j, TIDE_ERR_BUSY, full);
        return 1;
    }
    if (remember_agreed(s, j, r->step) != TIDE_OK) {
        fail_request(s, i, j, TIDE_ERR_NOMEM, tide_last_error());
        return 1;
    }
    send_save(s, j, r, TIDE_PROTO_SAVE_GO);
    if (r->step > j->ckpt_agreed)
        j->ckpt_agreed = r->step;
    tide__event(s, j->name, "checkpoint_requested",
                "a checkpoint of step %lld under %.900s asked of its %zu members",
                (long long)r->step, r->root, r->n);
    tide_msg_t m;
    tide_msg_init(&m, TIDE_MSG_OK);
    snprintf(m.u.ok.job, sizeof m.u.ok.job, "%s", j->name);
    snprintf(m.u.ok.message, sizeof m.u.ok.message,
             "job %s saves the checkpoint of step %lld under %.700s (about %.1f s from now); "
             "`tidectl events` says checkpoint_saved when it is complete",
             j->name, (long long)r->step, r->root,
             j->throughput > 0 ? (double)(r->step - j->step) / j->throughput : 0.0);
    tide__reply_to(s, &r->to, &m);
    ckreq_remove(s, i);
    return 1;
}

/* Request i: decided when every live member answered; failed when its job stopped training
   or, at its deadline (deadline != 0), when a live member is still silent. 1 when it is
   gone from the list. */
static int settle(tide_server_t *s, size_t i, int deadline)
{
    ckreq *r = &s->ckreqs->q[i];
    tide_coord_job_t *j = tide_coord_job_get(s->st, r->job);
    if (j == NULL || j->kind != TIDE_CJOB_ONLINE || j->layout == NULL ||
        (j->state != TIDE_JS_RUNNING && j->state != TIDE_JS_RESIZING)) {
        fail_request(s, i, j, TIDE_ERR_STALE,
                     "the job stopped training before its ranks agreed on a step: nothing saved");
        return 1;
    }
    int32_t silent = -1;
    for (size_t k = 0; k < r->n && silent < 0; k++) {
        const tide_coord_worker_t *w = tide_coord_worker_get(s->st, r->member[k]);
        if (r->done[k] < 0 && w != NULL && !tide_coord_worker_gone(w))
            silent = r->member[k];
    }
    if (silent < 0)
        return decide(s, i, j);
    if (!deadline)
        return 0;
    char why[256];
    snprintf(why, sizeof why,
             "worker %d of job %s did not answer the checkpoint proposal within %d ms: nothing "
             "saved; ask again",
             silent, j->name, TIDE__CKREQ_WAIT_MS);
    fail_request(s, i, j, TIDE_ERR_TIMEOUT, why);
    return 1;
}

void tide__on_save_ack(tide_server_t *s, const tide_msg_t *msg, const void *raw, size_t len)
{
    (void)raw;
    (void)len;
    const tide_proto_save_ack_t *m = &msg->u.save_ack;
    tide_coord_worker_t *w = tide__sender(s, m->worker, msg->type);
    if (w == NULL)
        return;
    struct tide__ckreqs *c = s->ckreqs;
    for (size_t i = 0; c != NULL && i < c->n; i++) {
        ckreq *r = &c->q[i];
        if (r->id != m->id)
            continue;
        for (size_t k = 0; k < r->n; k++)
            if (r->member[k] == w->id)
                r->done[k] = m->done > (uint64_t)INT64_MAX ? INT64_MAX : (int64_t)m->done;
        settle(s, i, 0);
        return;
    }
    /* an answer to a proposal decided already (a new one, or the deadline): nothing to do */
}

void tide__ckpt_tick(tide_server_t *s)
{
    struct tide__ckreqs *c = s->ckreqs;
    for (size_t i = 0; c != NULL && i < c->n;) {
        if (!settle(s, i, s->now_ns >= c->q[i].deadline_ns))
            i++;
    }
}

void tide__ckpt_close(tide_server_t *s)
{
    if (s->ckreqs == NULL)
        return;
    for (size_t i = 0; i < s->ckreqs->n; i++)
        ckreq_free(&s->ckreqs->q[i]);
    tide_free(s->ckreqs->agreed);
    tide_free(s->ckreqs);
    s->ckreqs = NULL;
}

void tide__on_checkpoint(tide_server_t *s, const tide_msg_t *msg, const void *raw, size_t len)
{
    (void)raw;
    (void)len;
    const tide_proto_checkpoint_t *m = &msg->u.checkpoint;
    tide_coord_job_t *j = tide_coord_job_by_name(s->st, m->job);
    if (j == NULL || j->kind != TIDE_CJOB_ONLINE) {
        tide__reply_error(s, TIDE_ERR_NOT_FOUND, "no online job named %s (tidectl jobs lists them)",
                          m->job);
        return;
    }
    if (j->layout == NULL || (j->state != TIDE_JS_RUNNING && j->state != TIDE_JS_RESIZING)) {
        tide__reply_error(s, TIDE_ERR_BUSY, "job %s is not training now (%s): nothing to save",
                          j->name, j->layout == NULL ? "no layout yet" : "stalled or ended");
        return;
    }
    char root[TIDE_COORD_CKPT_DIR_MAX];
    if (m->dir[0] != '\0')
        snprintf(root, sizeof root, "%s", m->dir);
    else if (!last_root(j, root, sizeof root)) {
        tide__reply_error(s, TIDE_ERR_INVALID,
                          "job %s has reported no checkpoint yet, so tided knows no directory "
                          "for it: pass --dir ROOT (a directory every worker can write)",
                          j->name);
        return;
    }
    if (s->ckreqs == NULL && (s->ckreqs = tide_calloc(1, sizeof *s->ckreqs)) == NULL) {
        tide__reply_error(s, TIDE_ERR_NOMEM, "no memory for a checkpoint request");
        return;
    }
    struct tide__ckreqs *c = s->ckreqs;
    if (c->n == TIDE__CKREQ_MAX) {
        tide__reply_error(s, TIDE_ERR_BUSY,
                          "%d checkpoint requests are being agreed with their jobs' ranks "
                          "already: ask again in a few seconds",
                          TIDE__CKREQ_MAX);
        return;
    }
    size_t pending = held(s, j);
    if (pending >= TIDE_PROTO_SAVES_MAX) {
        tide__reply_error(s, TIDE_ERR_BUSY,
                          "job %s's ranks hold %zu checkpoint requests for steps they have not "
                          "completed already (%d at most): ask again once one is saved "
                          "(`tidectl events` says checkpoint_saved)",
                          j->name, pending, TIDE_PROTO_SAVES_MAX);
        return;
    }
    ckreq *r = &c->q[c->n];
    memset(r, 0, sizeof *r);
    r->job = j->id;
    snprintf(r->root, sizeof r->root, "%s", root);
    r->to = s->req;
    if (propose(s, j, r, -1) != TIDE_OK) {
        tide__reply_error(s, TIDE_ERR_NOMEM, "%s", tide_last_error());
        return;
    }
    c->n++;
    tide__tick_soon(s); /* a job without live members is decided at once */
}
