/*
 * Checkpoints of the registered buffers (tide_checkpoint, tide_checkpoint_every): at a
 * step boundary the buffers this rank is the one writer of are copied to host staging
 * (device buffers through the backend's copy_host) and a background thread of the
 * checkpoint module writes them, the layout's first member publishing the manifest and
 * pruning; training goes on meanwhile. No communication: the members of a layout agree
 * on the save by calling at the same step (tide_step_end does for periodic saves), and
 * on its id by computing it from what they share (job, generation, step, tided's ids
 * of the layout's workers, which a relaunch does not reuse).
 */
#include <stdio.h>
#include <string.h>

#include "ckpt/ckpt.h"
#include "core/alloc.h"
#include "core/clock.h"
#include "core/error.h"
#include "core/log.h"
#include "worker/tide_int.h"

#define SUBSYS "tide.ckpt"

struct tide__ckpt {
    tide_ckpt_saver_t *saver;
    char root[4096]; /* periodic saves' root ("" when none) */
    int every, keep;
    int64_t last_step;    /* step of the last save submitted, -1 none */
    uint64_t timeout_gen; /* the generation timeout_ms was computed for (+1; 0: none) */
    int timeout_ms;       /* a save's bound in that generation's layout, ms */
};

static tide_status get_state(tide_t *t, struct tide__ckpt **out)
{
    if (t->ckpt == NULL) {
        t->ckpt = tide_calloc(1, sizeof *t->ckpt);
        if (t->ckpt == NULL)
            return tide_errorf(TIDE_ERR_NOMEM, "out of memory for checkpoint state");
        t->ckpt->last_step = -1;
    }
    if (t->ckpt->saver == NULL) {
        TIDE_CHECK(tide_ckpt_saver_new(&t->ckpt->saver));
        /* device snapshots stage in the backend's pinned host memory, kept between saves */
        tide_ckpt_host_mem pinned = {t->be->host_alloc, t->be->host_free};
        if (t->be->host_alloc != NULL)
            TIDE_CHECK(tide_ckpt_saver_set_host_mem(t->ckpt->saver, &pinned));
    }
    *out = t->ckpt;
    return TIDE_OK;
}

static tide_status copy_to_host(void *ctx, size_t i, void *dst, const void *src, uint64_t bytes)
{
    const tide_coll_backend_v1 *be = ctx;
    (void)i;
    return be->copy_host(dst, src, (size_t)bytes, 1, NULL);
}

/* The end of a save (writer thread): the publisher tells tided the checkpoint is complete,
   so that a recovery no survivor can serve rolls back to it; a failed save says why. */
static void report_saved(void *ctx, const tide_ckpt_save_req *req, const char *dir, tide_status rc)
{
    tide_t *t = ctx;
    if (rc == TIDE_OK && !req->publish)
        return;
    tide_proto_saved_t m;
    memset(&m, 0, sizeof m);
    snprintf(m.job, sizeof m.job, "%s", t->job);
    m.step = req->step > 0 ? (uint64_t)req->step : 0;
    snprintf(m.dir, sizeof m.dir, "%s", rc == TIDE_OK ? dir : req->root);
    m.code = rc == TIDE_OK ? 0 : rc < -1000 ? -1000 : (int)rc;
    if (rc != TIDE_OK)
        snprintf(m.reason, sizeof m.reason, "rank %d: %s", t->rank, tide_last_error());
    if (rc == TIDE_OK && strlen(dir) >= sizeof m.dir) {
        TIDE_WARN(SUBSYS,
                  "checkpoint %s: the path is too long to report to tided (%zu bytes "
                  "at most): a recovery cannot roll back to it",
                  dir, sizeof m.dir - 1);
        return;
    }
    tide__ctl_post_saved(t->ctl, &m);
}

/* FNV-1a over bytes, continued from h. */
static uint64_t fnv(uint64_t h, const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t k = 0; k < n; k++)
        h = (h ^ b[k]) * 0x100000001b3ull;
    return h;
}

tide_status tide_checkpoint(tide_t *t, const char *root)
{
    if (t == NULL || root == NULL || root[0] == '\0')
        return tide_errorf(TIDE_ERR_INVALID, "tide_checkpoint: no runtime or directory");
    if (!t->view.member)
        return TIDE_OK;
    if (t->bufs == NULL)
        return tide_errorf(TIDE_ERR_INVALID, "tide_checkpoint: register the buffers first "
                                             "(tide_set_buffers)");
    if (t->agree.in_step) /* the state of a step half done is no step's */
        return tide_errorf(TIDE_ERR_INVALID,
                           "tide_checkpoint: called inside step %lld; call it "
                           "between tide_step_end and tide_step_begin",
                           (long long)t->view.step);
    struct tide__ckpt *k = NULL;
    TIDE_CHECK(get_state(t, &k));
    const tide_layout_t *l = t->layout;
    uint64_t id = fnv(0xcbf29ce484222325ull, t->job, strlen(t->job));
    id = fnv(id, &t->view.generation, sizeof t->view.generation);
    id = fnv(id, &t->view.step, sizeof t->view.step);
    for (size_t w = 0; w < tide_layout_size(l); w++)
        id = fnv(id, &t->coord_ids[l->worker[w]], sizeof t->coord_ids[0]);
    if (k->timeout_gen != t->view.generation + 1) {
        k->timeout_ms = tide_ckpt_timeout_ms(l, t->coll);
        k->timeout_gen = t->view.generation + 1;
    }
    tide_ckpt_save_req req = {
        .root = root,
        .layout = l,
        .coll = t->coll,
        .p = t->view.pp_rank,
        .d = t->view.dp_rank,
        .t = t->view.tp_rank,
        .step = t->view.step,
        .save_id = id,
        .publish = l->worker[0] == t->rank,
        .keep = k->keep,
        .timeout_ms = k->timeout_ms,
        .bufs = t->bufs,
        .copy = t->be->mem_kind == TIDE_MEM_HOST ? NULL : copy_to_host,
        .copy_ctx = (void *)t->be,
        .done = report_saved,
        .done_ctx = t,
    };
    uint64_t t0 = tide_now_ns();
    /* never waits for earlier saves: one that cannot be taken now is reported and skipped */
    tide_status rc = tide_ckpt_saver_offer(k->saver, &req);
    if (rc != TIDE_OK) {
        char msg[600];
        snprintf(msg, sizeof msg, "%s", tide_last_error());
        report_saved(t, &req, root, rc);
        return tide_errorf(rc, "%s", msg);
    }
    k->last_step = t->view.step;
    TIDE_INFO(SUBSYS, "rank %d: checkpoint of step %lld snapshotted in %.1f ms; writing under %s",
              t->rank, (long long)t->view.step, (double)(tide_now_ns() - t0) * 1e-6, root);
    return TIDE_OK;
}

tide_status tide_checkpoint_every(tide_t *t, const char *root, int every, int keep)
{
    if (t == NULL || every < 0 || keep < 0 || (every > 0 && (root == NULL || root[0] == '\0')))
        return tide_errorf(TIDE_ERR_INVALID, "tide_checkpoint_every: needs a root, every >= 0 "
                                             "and keep >= 0");
    if (root != NULL && strlen(root) >= sizeof t->ckpt->root)
        return tide_errorf(TIDE_ERR_INVALID, "checkpoint root too long: %s", root);
    struct tide__ckpt *k = NULL;
    TIDE_CHECK(get_state(t, &k));
    snprintf(k->root, sizeof k->root, "%s", root != NULL ? root : "");
    k->every = every;
    k->keep = keep;
    if (every > 0 && t->view.member) {
        /* the writer's host staging, touched now rather than by the first save's snapshot
           inside the training loop */
        tide_ckpt_save_req req = {.layout = t->layout,
                                  .coll = t->coll,
                                  .p = t->view.pp_rank,
                                  .d = t->view.dp_rank,
                                  .t = t->view.tp_rank};
        TIDE_CHECK(tide_ckpt_saver_reserve(k->saver, &req));
    }
    return TIDE_OK;
}

tide_status tide_checkpoint_wait(tide_t *t)
{
    if (t == NULL)
        return tide_errorf(TIDE_ERR_INVALID, "tide_checkpoint_wait: no runtime");
    if (t->ckpt == NULL || t->ckpt->saver == NULL)
        return TIDE_OK;
    return tide_ckpt_saver_wait(t->ckpt->saver);
}

/* Tells tided that its request for step under root failed with rc (the reason in
   tide_last_error()). */
static void request_failed(tide_t *t, int64_t step, const char *root, tide_status rc)
{
    tide_ckpt_save_req req = {.root = root, .step = step};
    report_saved(t, &req, root, rc);
}

static int find_request(const tide_t *t, uint64_t id)
{
    for (int i = 0; i < t->n_saves; i++)
        if (id != 0 && t->saves[i].id == id)
            return i;
    return -1;
}

static void remove_request(tide_t *t, int i)
{
    memmove(&t->saves[i], &t->saves[i + 1], (size_t)(t->n_saves - i - 1) * sizeof t->saves[0]);
    t->n_saves--;
}

void tide__ckpt_request(tide_t *t, const tide_proto_save_t *m)
{
    int64_t step = (int64_t)m->step;
    int i = find_request(t, m->id);
    if (m->phase == TIDE_PROTO_SAVE_DROP) {
        if (i >= 0)
            remove_request(t, i);
        return;
    }
    int go = m->phase == TIDE_PROTO_SAVE_GO || m->id == 0;
    if (i >= 0) { /* a decision, or a proposal resent */
        t->saves[i].go |= go;
        if (go)
            TIDE_INFO(SUBSYS, "rank %d saves the checkpoint of step %lld under %s", t->rank,
                      (long long)step, m->dir);
        return;
    }
    for (int k = 0; k < t->n_saves; k++)
        if (t->saves[k].step == step && strcmp(t->saves[k].root, m->dir) == 0 && t->saves[k].go &&
            go)
            return; /* asked again (tided resends nothing, but an operator may) */
    if (t->n_saves == TIDE__SAVES_MAX && !t->view.member) {
        /* an idle rank keeps requests only in case a resize makes it a member by their
           steps; the members answer for the job, so the oldest gives way silently */
        TIDE_INFO(SUBSYS, "idle rank %d forgets the checkpoint request of step %lld", t->rank,
                  (long long)t->saves[0].step);
        remove_request(t, 0);
    }
    if (t->n_saves == TIDE__SAVES_MAX) {
        tide_errorf(TIDE_ERR_BUSY,
                    "rank %d has %d checkpoint requests pending already: ask again once one "
                    "is saved",
                    t->rank, TIDE__SAVES_MAX);
        request_failed(t, step, m->dir, TIDE_ERR_BUSY);
        return;
    }
    if (go)
        TIDE_INFO(SUBSYS, "tided asks for a checkpoint of step %lld under %s", (long long)step,
                  m->dir);
    snprintf(t->saves[t->n_saves].root, sizeof t->saves[0].root, "%s", m->dir);
    t->saves[t->n_saves].step = step;
    t->saves[t->n_saves].id = m->id;
    t->saves[t->n_saves].go = go;
    t->saves[t->n_saves].heard_ns = tide_now_ns();
    t->saves[t->n_saves].waited = 0;
    t->n_saves++;
}

/* Request i, due at this step: taken (once per root), or reported missed when this rank
   has passed its step already. A proposal passed before tided decided it is forgotten:
   this rank's answer came too late for it, so tided proposes again or gives it up. */
static void take_request(tide_t *t, int64_t step, const char *root, int go)
{
    if (!go) {
        TIDE_INFO(SUBSYS, "rank %d: the proposal of step %lld was not decided before it: dropped",
                  t->rank, (long long)step);
        return;
    }
    if (t->view.step == step) {
        if (t->ckpt != NULL && t->ckpt->last_step == step && strcmp(t->ckpt->root, root) == 0)
            return; /* the periodic save (or an earlier request) of this step took it already */
        if (tide_checkpoint(t, root) != TIDE_OK)
            TIDE_ERROR(SUBSYS, "rank %d: requested checkpoint of step %lld not taken: %s", t->rank,
                       (long long)step, tide_last_error());
        return;
    }
    tide_errorf(TIDE_ERR_STALE,
                "rank %d heard of the request at step %lld, after the step it asked for: ask "
                "again (tidectl checkpoint)",
                t->rank, (long long)t->view.step);
    request_failed(t, step, root, TIDE_ERR_STALE);
}

int tide__ckpt_undecided(tide_t *t)
{
    if (!t->view.member)
        return 0;
    for (int i = 0; i < t->n_saves; i++) {
        if (t->saves[i].go || t->saves[i].step != t->view.step)
            continue;
        uint64_t until = t->saves[i].heard_ns + (uint64_t)TIDE__SAVE_DECIDE_MS * 1000000ull;
        if (tide_now_ns() >= until || t->fenced || t->halt_code != 0) {
            tide_errorf(TIDE_ERR_TIMEOUT,
                        "rank %d reached step %lld and tided had not decided the checkpoint "
                        "proposed for it within %d ms: not taken",
                        t->rank, (long long)t->saves[i].step, TIDE__SAVE_DECIDE_MS);
            TIDE_WARN(SUBSYS, "%s", tide_last_error());
            request_failed(t, t->saves[i].step, t->saves[i].root, TIDE_ERR_TIMEOUT);
            remove_request(t, i--);
            continue;
        }
        if (!t->saves[i].waited++)
            TIDE_INFO(SUBSYS, "rank %d waits at step %lld for tided's decision on a checkpoint",
                      t->rank, (long long)t->saves[i].step);
        return 1;
    }
    return 0;
}

/* The checkpoints tided asked for (tidectl checkpoint) that are due: each taken at its step,
   in the order asked; one this rank has passed already is reported as missed (tide_step_end
   waited for tided's decisions on those of this step first, tide__ckpt_undecided). */
static void requested_save(tide_t *t)
{
    if (!t->view.member)
        return;
    for (;;) {
        int i = 0;
        while (i < t->n_saves && t->view.step < t->saves[i].step)
            i++;
        if (i == t->n_saves)
            return;
        char root[sizeof t->saves[0].root];
        memcpy(root, t->saves[i].root, sizeof root);
        int64_t step = t->saves[i].step;
        int go = t->saves[i].go;
        remove_request(t, i);
        take_request(t, step, root, go);
    }
}

/* The requests still pending when the rank leaves: the job ended before their steps. The
   layout's first member says so for all (tided gets one event per request). */
static void requests_unreached(tide_t *t)
{
    int first = t->layout != NULL && tide_layout_size(t->layout) > 0 &&
                t->layout->worker[0] == t->rank && t->ctl != NULL;
    for (int i = 0; first && i < t->n_saves; i++) {
        tide_errorf(TIDE_ERR_STALE,
                    "the job ended at step %lld, before step %lld: the checkpoint was not taken",
                    (long long)t->view.step, (long long)t->saves[i].step);
        request_failed(t, t->saves[i].step, t->saves[i].root, TIDE_ERR_STALE);
    }
    t->n_saves = 0;
}

void tide__ckpt_step_end(tide_t *t)
{
    requested_save(t);
    struct tide__ckpt *k = t->ckpt;
    if (k == NULL || k->every <= 0 || !t->view.member || t->view.step <= 0 ||
        t->view.step % k->every != 0 || t->view.step == k->last_step)
        return;
    /* a failed save must not stop training: it is logged, and tide_checkpoint_wait says */
    if (tide_checkpoint(t, k->root) != TIDE_OK)
        TIDE_ERROR(SUBSYS, "rank %d: periodic checkpoint of step %lld not taken: %s", t->rank,
                   (long long)t->view.step, tide_last_error());
}

void tide__ckpt_switched(tide_t *t, int64_t step)
{
    /* a member took (or reported) every request up to the boundary at its step ends; what
       is left of them was an idle rank's, decided by the members of then */
    for (int i = 0; i < t->n_saves; i++)
        if (t->saves[i].step <= step) {
            TIDE_INFO(SUBSYS,
                      "rank %d switches at step %lld: the checkpoint request of step %lld was "
                      "the members' of then",
                      t->rank, (long long)step, (long long)t->saves[i].step);
            remove_request(t, i--);
        }
}

void tide__ckpt_rolled_back(tide_t *t, int64_t step)
{
    /* the steps after it run again, and their periodic saves with them; the one of `step`
       is what was loaded */
    if (t->ckpt != NULL)
        t->ckpt->last_step = step;
}

void tide__ckpt_destroy(tide_t *t)
{
    requests_unreached(t);
    if (t->ckpt == NULL)
        return;
    if (t->ckpt->saver != NULL && tide_ckpt_saver_wait(t->ckpt->saver) != TIDE_OK)
        TIDE_ERROR(SUBSYS, "rank %d: the last checkpoint failed: %s", t->rank, tide_last_error());
    tide_ckpt_saver_destroy(&t->ckpt->saver);
    tide_free(t->ckpt);
    t->ckpt = NULL;
}
