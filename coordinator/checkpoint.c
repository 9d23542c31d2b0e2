/*
 * coordinator/checkpoint: what tided knows of an online job's checkpoints. The layout's
 * first member reports each complete checkpoint ("saved"); tided keeps the newest few
 * (durably, with the job) so that a recovery whose lost state no survivor holds rolls the
 * job back to the last one (recovery.c) instead of halting it. `tidectl checkpoint JOB`
 * asks the members to save at a step none of them has reached yet ("save"). Event loop
 * thread; O(1) per message but the save request (O(members)).
 */
#include <stdio.h>
#include <string.h>

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
    /* a step no member has reached (policy.h): from the furthest one heard of */
    int64_t step = j->step;
    size_t members = 0;
    for (size_t i = 0; i < tide_layout_size(j->layout); i++) {
        const tide_coord_worker_t *w = tide__job_worker(s, j, j->layout->worker[i]);
        if (w != NULL && !tide_coord_worker_gone(w) && w->job == j->id) {
            members++;
            if (w->step > step)
                step = w->step;
        }
    }
    step = tide_policy_ckpt_step(step, j->throughput, s->cfg.heartbeat_ms);
    tide_msg_t sm;
    tide_msg_init(&sm, TIDE_MSG_SAVE);
    snprintf(sm.u.save.job, sizeof sm.u.save.job, "%s", j->name);
    snprintf(sm.u.save.dir, sizeof sm.u.save.dir, "%s", root);
    sm.u.save.step = (uint64_t)step;
    /* every live worker of the job: a resize may make any of them a member by then */
    for (size_t k = 0; k < s->st->n_workers; k++) {
        const tide_coord_worker_t *w = &s->st->workers[k];
        if (w->pool[0] != '\0' && w->joined == j->id && !tide_coord_worker_gone(w))
            tide__send_worker(s, w, &sm);
    }
    tide__event(s, j->name, "checkpoint_requested",
                "a checkpoint of step %lld under %.900s asked of its %zu members", (long long)step,
                root, members);
    tide__reply_ok(s, j->name,
                   "job %s saves the checkpoint of step %lld under %.700s (about %.1f s from now); "
                   "`tidectl events` says checkpoint_saved when it is complete",
                   j->name, (long long)step, root,
                   j->throughput > 0 ? (double)(step - j->step) / j->throughput : 0.0);
}
