/*
 * Saving a coordinate's shard, synchronously or on a background thread (see ckpt.h).
 * The asynchronous saver's cost to training is the snapshot: one copy of the saved
 * tensors into host staging that is kept between saves (no allocation, no page faults
 * after the first save); the writes, fsyncs, publishing and pruning run on the thread.
 */
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "ckpt/ckpt_int.h"
#include "core/alloc.h"
#include "core/error.h"
#include "core/log.h"

#define SUBSYS "ckpt"

static tide_status write_publish(const tide_ckpt_save_req *req, const tide_layout_t *l,
                                 const void *const *bufs, const char *dir)
{
    TIDE_CHECK(
        tide_ckpt_write_shard(dir, l, req->coll, req->p, req->d, req->t, bufs, req->save_id));
    if (!req->publish)
        return TIDE_OK;
    TIDE_CHECK(
        tide_ckpt_publish(dir, l, req->coll, req->step, req->save_id, req->publish_timeout_ms));
    if (req->keep > 0)
        TIDE_CHECK(tide_ckpt_prune(req->root, req->keep));
    return TIDE_OK;
}

/* Writes the shard of req from host buffers bufs, then publishes on the publisher, then
   tells req->done. */
static tide_status save_from(const tide_ckpt_save_req *req, const tide_layout_t *l,
                             const void *const *bufs)
{
    char dir[TIDE_CKPT_PATH_MAX];
    tide_ckpt_step_dir(req->root, req->step, dir, sizeof dir);
    tide_status rc = write_publish(req, l, bufs, dir);
    if (req->done != NULL)
        req->done(req->done_ctx, req, dir, rc);
    return rc;
}

static void *host_alloc(const tide_ckpt_host_mem *hm, size_t n)
{
    void *p = NULL;
    if (hm == NULL || hm->alloc == NULL)
        return tide_malloc(n);
    return hm->alloc(n, &p) == TIDE_OK ? p : NULL;
}

static void host_free(const tide_ckpt_host_mem *hm, void *p)
{
    if (hm == NULL || hm->free == NULL)
        tide_free(p);
    else if (p != NULL)
        hm->free(p);
}

/* Grows staging[i] (from hm, NULL: plain) to tensor i's shard of req's coordinate where it
   saves it; touch: writes every new page once (so that later snapshots take no page
   faults). */
static tide_status grow_staging(const tide_ckpt_host_mem *hm, const tide_ckpt_save_req *req,
                                void **staging, uint64_t *cap, int touch)
{
    const tide_collection_t *c = req->coll;
    for (size_t i = 0; i < tide_collection_size(c); i++) {
        if (!tide_ckpt_saves(req->layout, c, i, req->p, req->d, req->t))
            continue;
        uint64_t n = tide_shard_bytes(req->layout, c, i, req->p, req->d, req->t);
        if (cap[i] >= n)
            continue;
        host_free(hm, staging[i]);
        staging[i] = host_alloc(hm, n);
        cap[i] = staging[i] != NULL ? n : 0;
        if (staging[i] == NULL)
            return tide_errorf(TIDE_ERR_NOMEM, "out of memory staging %s for a checkpoint",
                               tide_collection_tensor(c, i)->name);
        if (touch)
            memset(staging[i], 0, n);
    }
    return TIDE_OK;
}

/* Copies the tensors req's coordinate saves into staging[i] (grown from hm as needed). */
static tide_status snapshot(const tide_ckpt_host_mem *hm, const tide_ckpt_save_req *req,
                            void **staging, uint64_t *cap)
{
    const tide_collection_t *c = req->coll;
    TIDE_CHECK(grow_staging(hm, req, staging, cap, 0));
    for (size_t i = 0; i < tide_collection_size(c); i++) {
        if (!tide_ckpt_saves(req->layout, c, i, req->p, req->d, req->t))
            continue;
        uint64_t n = tide_shard_bytes(req->layout, c, i, req->p, req->d, req->t);
        if (req->bufs[i] == NULL)
            return tide_errorf(TIDE_ERR_INVALID, "checkpoint: no buffer for tensor %s",
                               tide_collection_tensor(c, i)->name);
        if (req->copy != NULL)
            TIDE_CHECK(req->copy(req->copy_ctx, i, staging[i], req->bufs[i], n));
        else
            memcpy(staging[i], req->bufs[i], n);
    }
    return TIDE_OK;
}

tide_status tide_ckpt_save(const tide_ckpt_save_req *req)
{
    if (req == NULL || req->root == NULL || req->layout == NULL || req->coll == NULL ||
        req->bufs == NULL)
        return tide_errorf(TIDE_ERR_INVALID, "tide_ckpt_save: incomplete request");
    if (req->copy == NULL)
        return save_from(req, req->layout, (const void *const *)req->bufs);
    size_t n = tide_collection_size(req->coll);
    void **staging = tide_calloc(n ? n : 1, sizeof *staging);
    uint64_t *cap = tide_calloc(n ? n : 1, sizeof *cap);
    tide_status rc = TIDE_OK;
    TIDE_CHECK_ALLOC_GOTO(staging, rc, out);
    TIDE_CHECK_ALLOC_GOTO(cap, rc, out);
    TIDE_CHECK_GOTO(snapshot(NULL, req, staging, cap), rc, out);
    TIDE_CHECK_GOTO(save_from(req, req->layout, (const void *const *)staging), rc, out);
out:
    for (size_t i = 0; staging != NULL && i < n; i++)
        tide_free(staging[i]);
    tide_free(staging);
    tide_free(cap);
    return rc;
}

/* ---- the background saver ------------------------------------------------------------- */

struct tide_ckpt_saver {
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int busy, stop;
    tide_status last;       /* status of the last finished save */
    char last_err[512];     /* its detail, re-raised on the caller's thread */
    tide_ckpt_save_req req; /* the pending save (root and layout owned) */
    char root[TIDE_CKPT_PATH_MAX];
    tide_layout_t *layout;
    const tide_collection_t *coll;
    void **staging;
    uint64_t *cap;
    size_t n;
    tide_ckpt_host_mem mem; /* where staging comes from */
};

static void *saver_main(void *arg)
{
    tide_ckpt_saver_t *s = arg;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        while (!s->busy && !s->stop)
            pthread_cond_wait(&s->cv, &s->mu);
        if (!s->busy && s->stop)
            break;
        tide_ckpt_save_req req = s->req;
        pthread_mutex_unlock(&s->mu);
        tide_status rc = save_from(&req, s->layout, (const void *const *)s->staging);
        pthread_mutex_lock(&s->mu);
        s->last = rc;
        snprintf(s->last_err, sizeof s->last_err, "%s", rc == TIDE_OK ? "" : tide_last_error());
        if (rc != TIDE_OK)
            TIDE_ERROR(SUBSYS, "asynchronous checkpoint of step %lld failed: %s",
                       (long long)req.step, s->last_err);
        s->busy = 0;
        pthread_cond_broadcast(&s->cv);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

tide_status tide_ckpt_saver_new(tide_ckpt_saver_t **out)
{
    if (out == NULL)
        return tide_errorf(TIDE_ERR_INVALID, "tide_ckpt_saver_new: out is NULL");
    tide_ckpt_saver_t *s = tide_calloc(1, sizeof *s);
    if (s == NULL)
        return tide_errorf(TIDE_ERR_NOMEM, "out of memory for the checkpoint saver");
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    if (pthread_create(&s->thread, NULL, saver_main, s) != 0) {
        pthread_mutex_destroy(&s->mu);
        pthread_cond_destroy(&s->cv);
        tide_free(s);
        return tide_errorf(TIDE_ERR_INTERNAL, "cannot start the checkpoint writer thread");
    }
    *out = s;
    return TIDE_OK;
}

/* Waits under s->mu until no save is pending; returns the last status (detail restored). */
static tide_status wait_locked(tide_ckpt_saver_t *s)
{
    while (s->busy)
        pthread_cond_wait(&s->cv, &s->mu);
    if (s->last != TIDE_OK)
        return tide_errorf(s->last, "%s", s->last_err);
    return TIDE_OK;
}

tide_status tide_ckpt_saver_wait(tide_ckpt_saver_t *s)
{
    pthread_mutex_lock(&s->mu);
    tide_status rc = wait_locked(s);
    pthread_mutex_unlock(&s->mu);
    return rc;
}

int tide_ckpt_saver_busy(tide_ckpt_saver_t *s)
{
    pthread_mutex_lock(&s->mu);
    int b = s->busy;
    pthread_mutex_unlock(&s->mu);
    return b;
}

/* Makes s's staging table fit req's collection (the thread idle). */
static tide_status fit_staging(tide_ckpt_saver_t *s, const tide_ckpt_save_req *req)
{
    size_t n = tide_collection_size(req->coll);
    if (s->coll == req->coll && s->n == n)
        return TIDE_OK;
    for (size_t i = 0; i < s->n; i++)
        host_free(&s->mem, s->staging[i]);
    tide_free(s->staging);
    tide_free(s->cap);
    s->staging = tide_calloc(n ? n : 1, sizeof *s->staging);
    s->cap = tide_calloc(n ? n : 1, sizeof *s->cap);
    s->n = s->staging && s->cap ? n : 0;
    s->coll = req->coll;
    if (s->staging == NULL || s->cap == NULL)
        return tide_errorf(TIDE_ERR_NOMEM, "out of memory for checkpoint staging");
    return TIDE_OK;
}

tide_status tide_ckpt_saver_reserve(tide_ckpt_saver_t *s, const tide_ckpt_save_req *req)
{
    if (s == NULL || req == NULL || req->layout == NULL || req->coll == NULL)
        return tide_errorf(TIDE_ERR_INVALID, "tide_ckpt_saver_reserve: incomplete request");
    pthread_mutex_lock(&s->mu);
    tide_status rc = wait_locked(s);
    pthread_mutex_unlock(&s->mu);
    if (rc != TIDE_OK)
        return rc;
    TIDE_CHECK(fit_staging(s, req));
    return grow_staging(&s->mem, req, s->staging, s->cap, 1);
}

tide_status tide_ckpt_saver_set_host_mem(tide_ckpt_saver_t *s, const tide_ckpt_host_mem *mem)
{
    if (s == NULL || (mem != NULL && (mem->alloc == NULL) != (mem->free == NULL)))
        return tide_errorf(TIDE_ERR_INVALID, "tide_ckpt_saver_set_host_mem: no saver, or an "
                                             "allocator without its free (or the reverse)");
    pthread_mutex_lock(&s->mu);
    while (s->busy) /* the thread writes from the staging */
        pthread_cond_wait(&s->cv, &s->mu);
    pthread_mutex_unlock(&s->mu);
    for (size_t i = 0; i < s->n; i++) {
        host_free(&s->mem, s->staging[i]);
        s->staging[i] = NULL;
        s->cap[i] = 0;
    }
    s->mem = mem != NULL ? *mem : (tide_ckpt_host_mem){NULL, NULL};
    return TIDE_OK;
}

tide_status tide_ckpt_saver_submit(tide_ckpt_saver_t *s, const tide_ckpt_save_req *req)
{
    if (s == NULL || req == NULL || req->root == NULL || req->layout == NULL || req->coll == NULL ||
        req->bufs == NULL)
        return tide_errorf(TIDE_ERR_INVALID, "tide_ckpt_saver_submit: incomplete request");
    if (strlen(req->root) >= sizeof s->root)
        return tide_errorf(TIDE_ERR_INVALID, "checkpoint root too long: %s", req->root);
    pthread_mutex_lock(&s->mu);
    if (s->busy)
        TIDE_WARN(SUBSYS, "checkpoint of step %lld waits for the previous one to be written",
                  (long long)req->step);
    tide_status rc = wait_locked(s);
    s->last = TIDE_OK;
    pthread_mutex_unlock(&s->mu);
    if (rc != TIDE_OK)
        return rc;
    /* the thread is idle: its state is ours until busy is set */
    TIDE_CHECK(fit_staging(s, req));
    tide_layout_destroy(&s->layout);
    TIDE_CHECK(tide_layout_copy(&s->layout, req->layout));
    TIDE_CHECK(snapshot(&s->mem, req, s->staging, s->cap));
    pthread_mutex_lock(&s->mu);
    s->req = *req;
    snprintf(s->root, sizeof s->root, "%s", req->root);
    s->req.root = s->root;
    s->req.layout = s->layout;
    s->req.bufs = NULL; /* the thread writes from staging */
    s->req.copy = NULL;
    s->busy = 1;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    return TIDE_OK;
}

void tide_ckpt_saver_destroy(tide_ckpt_saver_t **self_p)
{
    if (self_p == NULL || *self_p == NULL)
        return;
    tide_ckpt_saver_t *s = *self_p;
    pthread_mutex_lock(&s->mu);
    s->stop = 1;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    pthread_join(s->thread, NULL);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    for (size_t i = 0; i < s->n; i++)
        host_free(&s->mem, s->staging[i]);
    tide_free(s->staging);
    tide_free(s->cap);
    tide_layout_destroy(&s->layout);
    tide_free(s);
    *self_p = NULL;
}
