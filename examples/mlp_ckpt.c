/*
 * train_mlp's checkpoints on tide's checkpoint module (see mlp_ckpt.h): the model's
 * buffers are the coordinate's local shards; device buffers go through tide_mlp_read /
 * tide_mlp_write.
 */
#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "core/log.h"
#include "examples/mlp_ckpt.h"

#define SUBSYS "mlp.ckpt"

static tide_status read_tensor(void *ctx, size_t i, void *dst, const void *src, uint64_t bytes)
{
    (void)src;
    return tide_mlp_read(ctx, i, dst, bytes);
}

/* The save request of worker's coordinate; 0 with *idle set when worker is not in it. */
static tide_status request(const tide_mlp_t *m, int32_t worker, const char *root,
                           const tide_mlp_ckpt_opts *o, tide_ckpt_save_req *req, int *idle)
{
    *idle = 0;
    if (m == NULL || root == NULL || root[0] == '\0')
        return tide_errorf(TIDE_ERR_INVALID, "checkpoint save: no model or directory");
    if (!tide_mlp_active(m)) {
        *idle = 1;
        return TIDE_OK;
    }
    const tide_layout_t *l = tide_mlp_layout(m);
    int p = 0, d = 0, t = 0;
    TIDE_CHECK(tide_layout_find(l, worker, &p, &d, &t));
    int64_t step = tide_mlp_step_count(m);
    memset(req, 0, sizeof *req);
    req->root = root;
    req->layout = l;
    req->coll = tide_mlp_collection(m);
    req->p = p;
    req->d = d;
    req->t = t;
    req->step = step;
    req->save_id =
        o != NULL && o->save_id != 0 ? o->save_id : 0x9e3779b97f4a7c15ull ^ (uint64_t)step;
    req->publish = l->worker[0] == worker;
    req->keep = o != NULL ? o->keep : 0;
    req->timeout_ms =
        o != NULL && o->timeout_ms > 0 ? o->timeout_ms : tide_ckpt_timeout_ms(l, req->coll);
    req->bufs = tide_mlp_buffers(m);
    req->copy = read_tensor;
    req->copy_ctx = (void *)m; /* read_tensor only reads through it */
    return TIDE_OK;
}

tide_status tide_mlp_ckpt_save(const tide_mlp_t *m, int32_t worker, const char *root,
                               const tide_mlp_ckpt_opts *o)
{
    tide_ckpt_save_req req;
    int idle = 0;
    TIDE_CHECK(request(m, worker, root, o, &req, &idle));
    if (idle)
        return TIDE_OK;
    return tide_ckpt_save(&req);
}

tide_status tide_mlp_ckpt_save_async(tide_ckpt_saver_t *s, const tide_mlp_t *m, int32_t worker,
                                     const char *root, const tide_mlp_ckpt_opts *o)
{
    tide_ckpt_save_req req;
    int idle = 0;
    TIDE_CHECK(request(m, worker, root, o, &req, &idle));
    if (idle)
        return TIDE_OK;
    return tide_ckpt_saver_submit(s, &req);
}

tide_status tide_mlp_ckpt_reserve(tide_ckpt_saver_t *s, const tide_mlp_t *m, int32_t worker)
{
    tide_ckpt_save_req req;
    int idle = 0;
    TIDE_CHECK(request(m, worker, "-", NULL, &req, &idle));
    if (idle)
        return TIDE_OK;
    return tide_ckpt_saver_reserve(s, &req);
}

tide_status tide_mlp_ckpt_load(tide_mlp_t *m, int32_t worker, const char *dir, int64_t before,
                               int64_t *loaded)
{
    if (m == NULL || dir == NULL || dir[0] == '\0')
        return tide_errorf(TIDE_ERR_INVALID, "checkpoint load: no model or directory");
    if (!tide_mlp_active(m))
        return TIDE_OK;
    const tide_collection_t *c = tide_mlp_collection(m);
    const tide_layout_t *l = tide_mlp_layout(m);
    size_t n = tide_collection_size(c);
    char path[4096];
    int64_t step = 0;
    int p = 0, d = 0, t = 0;
    TIDE_CHECK(tide_layout_find(l, worker, &p, &d, &t));
    TIDE_CHECK(tide_ckpt_find(dir, before, path, sizeof path, &step));
    tide_status rc = TIDE_OK;
    tide_ckpt_t *ck = NULL;
    void **host = tide_calloc(n ? n : 1, sizeof *host);
    TIDE_CHECK_ALLOC_GOTO(host, rc, out);
    TIDE_CHECK_GOTO(tide_ckpt_open(&ck, path), rc, out);
    rc = tide_ckpt_check_collection(ck, c);
    if (rc != TIDE_OK)
        TIDE_FAIL_GOTO(rc, out, rc, "%s (same --layers/--hidden/--ffn/--vocab/--zero1?)",
                       tide_last_error());
    for (size_t i = 0; i < n; i++) {
        uint64_t b = 0;
        (void)tide_mlp_buffer(m, i, &b);
        if (b == 0)
            continue;
        host[i] = tide_malloc(b);
        TIDE_CHECK_ALLOC_GOTO(host[i], rc, out);
    }
    tide_ckpt_load_stats st;
    TIDE_CHECK_GOTO(tide_ckpt_load(ck, l, p, d, t, host, &st), rc, out);
    for (size_t i = 0; i < n; i++) {
        uint64_t b = 0;
        (void)tide_mlp_buffer(m, i, &b);
        if (b > 0)
            TIDE_CHECK_GOTO(tide_mlp_write(m, i, host[i], b), rc, out);
    }
    if (tide_mlp_step_count(m) != step)
        TIDE_FAIL_GOTO(rc, out, TIDE_ERR_INVALID,
                       "checkpoint %s: its manifest says step %lld, its step tensor %lld", path,
                       (long long)step, (long long)tide_mlp_step_count(m));
    if (loaded != NULL)
        *loaded = step;
    TIDE_INFO(SUBSYS, "worker %d: loaded step %lld from %s (%llu bytes from %llu files)",
              (int)worker, (long long)step, path, (unsigned long long)st.bytes_read,
              (unsigned long long)st.files);
out:
    for (size_t i = 0; host != NULL && i < n; i++)
        tide_free(host[i]);
    tide_free(host);
    tide_ckpt_close(&ck);
    return rc;
}
