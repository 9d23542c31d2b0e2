/*
 * Saving a coordinate's shard, synchronously or on a background thread (see ckpt.h).
 * The asynchronous saver's cost to training is the snapshot: one copy of the saved
 * tensors into host staging that is kept between saves (no allocation, no page faults
 * after the first save); the writes, fsyncs, publishing and pruning run on the thread.
 * Two staging slots: a save submitted while the previous one is still being written is
 * snapshotted into the other and queued behind it, so one slow save costs the training
 * loop nothing; a save that finds both busy is refused at once (tide_ckpt_saver_offer)
 * rather than waited for. Every save is bounded in time (its timeout_ms), so a full or
 * stuck disk fails saves, never the job.
 */
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ckpt/ckpt_int.h"
#include "core/alloc.h"
#include "core/clock.h"
#include "core/error.h"
#include "core/log.h"

#define SUBSYS               "ckpt"
#define SLOTS                2
#define TIMEOUT_BASE_MS      60000 /* the default bound of a save, plus its size at ... */
#define TIMEOUT_BYTES_PER_MS 16384 /* ... 16 MB/s: a disk slower than that fails saves */

/* ---- the time bound ---------------------------------------------------------------------- */

static int g_env_timeout_ms; /* TIDE_CKPT_TIMEOUT_MS, 0: unset */

static void read_env_timeout(void)
{
    const char *v = getenv("TIDE_CKPT_TIMEOUT_MS");
    if (v == NULL || v[0] == '\0')
        return;
    char *end = NULL;
    long long x = strtoll(v, &end, 10);
    if (end == v || *end != '\0' || x <= 0 || x > INT_MAX) {
        TIDE_WARN(SUBSYS, "ignoring TIDE_CKPT_TIMEOUT_MS=%s: not a positive number of ms", v);
        return;
    }
    g_env_timeout_ms = (int)x;
    TIDE_INFO(SUBSYS, "TIDE_CKPT_TIMEOUT_MS=%d: a checkpoint save not done in %d ms fails",
              g_env_timeout_ms, g_env_timeout_ms);
}

int tide_ckpt_timeout_ms(const tide_layout_t *l, const tide_collection_t *c)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, read_env_timeout);
    if (g_env_timeout_ms > 0)
        return g_env_timeout_ms;
    uint64_t largest = 0;
    for (int p = 0; p < l->pp; p++)
        for (int d = 0; d < l->dp; d++)
            for (int t = 0; t < l->tp; t++) {
                uint64_t b = tide_ckpt_shard_size(l, c, p, d, t);
                largest = b > largest ? b : largest;
            }
    uint64_t ms = TIMEOUT_BASE_MS + largest / TIMEOUT_BYTES_PER_MS;
    return ms > INT_MAX ? INT_MAX : (int)ms;
}

/* ---- one save ---------------------------------------------------------------------------- */

/* Writes the shard of req from bufs into ROOT/step-N and, on the publisher, publishes and
   prunes. Pruning is housekeeping: its failure is logged, the save stands. */
static tide_status write_publish(const tide_ckpt_save_req *req, const tide_layout_t *l,
                                 const void *const *bufs, const char *dir)
{
    if (!req->publish && tide_ckpt_shard_size(l, req->coll, req->p, req->d, req->t) == 0)
        return TIDE_OK; /* nothing to write: not even a directory */
    tide__ckpt_bound b = tide__ckpt_bound_in(req->timeout_ms);
    char name[64];
    snprintf(name, sizeof name, "step-%012" PRId64, req->step);
    int root = -1, fd = -1;
    TIDE_CHECK(tide__ckpt_open_root(req->root, 1, &root));
    tide_status rc = tide__ckpt_open_sub(root, req->root, name, 1, 1, &fd);
    if (rc == TIDE_OK)
        rc = tide__ckpt_write_shard_at(fd, dir, l, req->coll, req->p, req->d, req->t, bufs,
                                       req->save_id, b);
    if (rc == TIDE_OK && req->publish)
        rc = tide__ckpt_publish_at(fd, dir, l, req->coll, req->step, req->save_id, b);
    if (rc == TIDE_OK && req->publish && req->keep > 0 &&
        tide__ckpt_prune_at(root, req->root, req->keep) != TIDE_OK)
        TIDE_WARN(SUBSYS, "checkpoint %s is published, but pruning %s failed: %s", dir, req->root,
                  tide_last_error());
    if (fd >= 0)
        close(fd);
    close(root);
    return rc;
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

enum { FREE, FILLING, QUEUED, WRITING };

/* One save's staging and request. FREE and FILLING slots belong to the submitting thread,
   QUEUED and WRITING ones to the writer thread; state changes under the saver's lock. */
typedef struct slot {
    int state;
    uint64_t seq;           /* submission order */
    uint64_t since_ns;      /* when it was queued */
    tide_ckpt_save_req req; /* root and layout owned */
    char root[TIDE_CKPT_PATH_MAX];
    tide_layout_t *layout;
    const tide_collection_t *coll;
    void **staging;
    uint64_t *cap;
    size_t n;
    const tide_ckpt_host_mem *mem; /* the saver's: where staging comes from */
} slot;

struct tide_ckpt_saver {
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int stop;
    uint64_t seq;
    tide_status last;   /* status of the last finished save */
    char last_err[512]; /* its detail, re-raised on the caller's thread */
    slot slots[SLOTS];
    tide_ckpt_host_mem mem; /* where staging comes from (both NULL: tide_malloc) */
};

/* The oldest queued slot, or NULL. Under s->mu. */
static slot *next_queued(tide_ckpt_saver_t *s)
{
    slot *q = NULL;
    for (int k = 0; k < SLOTS; k++)
        if (s->slots[k].state == QUEUED && (q == NULL || s->slots[k].seq < q->seq))
            q = &s->slots[k];
    return q;
}

static int any_busy(const tide_ckpt_saver_t *s)
{
    for (int k = 0; k < SLOTS; k++)
        if (s->slots[k].state != FREE)
            return 1;
    return 0;
}

static slot *free_slot(tide_ckpt_saver_t *s)
{
    for (int k = 0; k < SLOTS; k++)
        if (s->slots[k].state == FREE)
            return &s->slots[k];
    return NULL;
}

static void *saver_main(void *arg)
{
    tide_ckpt_saver_t *s = arg;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        slot *q = next_queued(s);
        while (q == NULL && !s->stop) {
            pthread_cond_wait(&s->cv, &s->mu);
            q = next_queued(s);
        }
        if (q == NULL)
            break;
        q->state = WRITING;
        tide_ckpt_save_req req = q->req;
        pthread_mutex_unlock(&s->mu);
        tide_status rc = save_from(&req, q->layout, (const void *const *)q->staging);
        pthread_mutex_lock(&s->mu);
        s->last = rc;
        snprintf(s->last_err, sizeof s->last_err, "%s", rc == TIDE_OK ? "" : tide_last_error());
        if (rc != TIDE_OK)
            TIDE_ERROR(SUBSYS, "asynchronous checkpoint of step %lld failed: %s",
                       (long long)req.step, s->last_err);
        q->state = FREE;
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
    for (int k = 0; k < SLOTS; k++)
        s->slots[k].mem = &s->mem;
    if (pthread_create(&s->thread, NULL, saver_main, s) != 0) {
        pthread_mutex_destroy(&s->mu);
        pthread_cond_destroy(&s->cv);
        tide_free(s);
        return tide_errorf(TIDE_ERR_INTERNAL, "cannot start the checkpoint writer thread");
    }
    *out = s;
    return TIDE_OK;
}

/* Waits under s->mu until no save is in flight; returns the last status (detail restored). */
static tide_status wait_locked(tide_ckpt_saver_t *s)
{
    while (any_busy(s))
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
    int b = any_busy(s);
    pthread_mutex_unlock(&s->mu);
    return b;
}

/* Makes q's staging table fit req's collection (q FREE or FILLING: the caller's). */
static tide_status fit_staging(slot *q, const tide_ckpt_save_req *req)
{
    size_t n = tide_collection_size(req->coll);
    if (q->coll == req->coll && q->n == n)
        return TIDE_OK;
    for (size_t i = 0; i < q->n; i++)
        host_free(q->mem, q->staging[i]);
    tide_free(q->staging);
    tide_free(q->cap);
    q->staging = tide_calloc(n ? n : 1, sizeof *q->staging);
    q->cap = tide_calloc(n ? n : 1, sizeof *q->cap);
    q->n = q->staging && q->cap ? n : 0;
    q->coll = req->coll;
    if (q->staging == NULL || q->cap == NULL)
        return tide_errorf(TIDE_ERR_NOMEM, "out of memory for checkpoint staging");
    return TIDE_OK;
}

tide_status tide_ckpt_saver_set_host_mem(tide_ckpt_saver_t *s, const tide_ckpt_host_mem *mem)
{
    if (s == NULL || (mem != NULL && (mem->alloc == NULL) != (mem->free == NULL)))
        return tide_errorf(TIDE_ERR_INVALID, "tide_ckpt_saver_set_host_mem: no saver, or an "
                                             "allocator without its free (or the reverse)");
    pthread_mutex_lock(&s->mu);
    while (any_busy(s)) /* the thread writes from the staging of queued slots */
        pthread_cond_wait(&s->cv, &s->mu);
    pthread_mutex_unlock(&s->mu);
    for (int k = 0; k < SLOTS; k++) {
        slot *q = &s->slots[k];
        for (size_t i = 0; i < q->n; i++) {
            host_free(&s->mem, q->staging[i]);
            q->staging[i] = NULL;
            q->cap[i] = 0;
        }
    }
    s->mem = mem != NULL ? *mem : (tide_ckpt_host_mem){NULL, NULL};
    return TIDE_OK;
}

tide_status tide_ckpt_saver_reserve(tide_ckpt_saver_t *s, const tide_ckpt_save_req *req)
{
    if (s == NULL || req == NULL || req->layout == NULL || req->coll == NULL)
        return tide_errorf(TIDE_ERR_INVALID, "tide_ckpt_saver_reserve: incomplete request");
    slot *q = &s->slots[0];
    pthread_mutex_lock(&s->mu);
    while (q->state != FREE)
        pthread_cond_wait(&s->cv, &s->mu);
    q->state = FILLING;
    pthread_mutex_unlock(&s->mu);
    tide_status rc = fit_staging(q, req);
    if (rc == TIDE_OK)
        rc = grow_staging(q->mem, req, q->staging, q->cap, 1);
    pthread_mutex_lock(&s->mu);
    q->state = FREE;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    return rc;
}

/* Snapshots req into slot q (FILLING, the caller's) and queues it, or frees it on failure. */
static tide_status fill_and_queue(tide_ckpt_saver_t *s, slot *q, const tide_ckpt_save_req *req)
{
    tide_status rc = fit_staging(q, req);
    if (rc == TIDE_OK) {
        tide_layout_destroy(&q->layout);
        rc = tide_layout_copy(&q->layout, req->layout);
    }
    if (rc == TIDE_OK)
        rc = snapshot(q->mem, req, q->staging, q->cap);
    pthread_mutex_lock(&s->mu);
    if (rc == TIDE_OK) {
        q->req = *req;
        snprintf(q->root, sizeof q->root, "%s", req->root);
        q->req.root = q->root;
        q->req.layout = q->layout;
        q->req.bufs = NULL; /* the thread writes from staging */
        q->req.copy = NULL;
        q->seq = ++s->seq;
        q->since_ns = tide_now_ns();
        q->state = QUEUED;
    } else
        q->state = FREE;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    return rc;
}

static tide_status check_req(const tide_ckpt_saver_t *s, const tide_ckpt_save_req *req)
{
    if (s == NULL || req == NULL || req->root == NULL || req->layout == NULL || req->coll == NULL ||
        req->bufs == NULL)
        return tide_errorf(TIDE_ERR_INVALID, "checkpoint saver: incomplete request");
    if (strlen(req->root) >= sizeof s->slots[0].root)
        return tide_errorf(TIDE_ERR_INVALID, "checkpoint root too long: %s", req->root);
    return TIDE_OK;
}

tide_status tide_ckpt_saver_submit(tide_ckpt_saver_t *s, const tide_ckpt_save_req *req)
{
    TIDE_CHECK(check_req(s, req));
    pthread_mutex_lock(&s->mu);
    slot *q = free_slot(s);
    if (q == NULL)
        TIDE_WARN(SUBSYS, "checkpoint of step %lld waits for an earlier one to be written",
                  (long long)req->step);
    while ((q = free_slot(s)) == NULL)
        pthread_cond_wait(&s->cv, &s->mu);
    tide_status rc = s->last == TIDE_OK ? TIDE_OK : tide_errorf(s->last, "%s", s->last_err);
    s->last = TIDE_OK;
    q->state = rc == TIDE_OK ? FILLING : FREE;
    pthread_mutex_unlock(&s->mu);
    if (rc != TIDE_OK)
        return rc;
    return fill_and_queue(s, q, req);
}

tide_status tide_ckpt_saver_offer(tide_ckpt_saver_t *s, const tide_ckpt_save_req *req)
{
    TIDE_CHECK(check_req(s, req));
    pthread_mutex_lock(&s->mu);
    slot *q = free_slot(s);
    if (q == NULL) {
        /* both slots hold saves: the one being written and the one queued behind it */
        const slot *w = s->slots[0].seq < s->slots[1].seq ? &s->slots[0] : &s->slots[1];
        const slot *o = w == &s->slots[0] ? &s->slots[1] : &s->slots[0];
        tide_status rc = tide_errorf(
            TIDE_ERR_BUSY,
            "checkpoint of step %lld skipped: the save of step %lld (submitted %.0f ms ago) is "
            "still being written and that of step %lld waits behind it",
            (long long)req->step, (long long)w->req.step,
            (double)(tide_now_ns() - w->since_ns) * 1e-6, (long long)o->req.step);
        pthread_mutex_unlock(&s->mu);
        return rc;
    }
    q->state = FILLING;
    pthread_mutex_unlock(&s->mu);
    return fill_and_queue(s, q, req);
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
    for (int k = 0; k < SLOTS; k++) {
        slot *q = &s->slots[k];
        for (size_t i = 0; i < q->n; i++)
            host_free(q->mem, q->staging[i]);
        tide_free(q->staging);
        tide_free(q->cap);
        tide_layout_destroy(&q->layout);
    }
    tide_free(s);
    *self_p = NULL;
}
