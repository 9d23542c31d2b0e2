/*
 * test_ckpt_staging: the asynchronous saver's host staging made from the memory it is given
 * (tide_ckpt_saver_set_host_mem; libtide gives the nccl backend's pinned memory, so that
 * device snapshots copy at full speed), kept between saves:
 *   - every staging buffer comes from the given allocator, one per saved tensor, made once
 *     (at reserve) and reused by three saves, each snapshot copied into it; each is freed
 *     with the given free, at destroy, and nothing else is;
 *   - the checkpoint written from that staging loads back bit for bit;
 *   - an allocator that fails makes the snapshot fail with TIDE_ERR_NOMEM, and nothing is
 *     written; an allocator without its free is refused.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ckpt/ckpt.h"
#include "core/error.h"

#define MAX_LIVE 1024

static int g_allocs, g_frees, g_fail;
static void *g_live[MAX_LIVE]; /* blocks the allocator handed out and free has not taken */

static tide_status counting_alloc(size_t bytes, void **out)
{
    if (g_fail)
        return tide_errorf(TIDE_ERR_NOMEM, "the test's allocator fails on purpose");
    *out = malloc(bytes);
    for (int i = 0; i < MAX_LIVE; i++)
        if (g_live[i] == NULL) {
            g_live[i] = *out;
            break;
        }
    g_allocs++;
    return TIDE_OK;
}

static void counting_free(void *p)
{
    int found = 0;
    for (int i = 0; i < MAX_LIVE; i++)
        if (g_live[i] == p && p != NULL) {
            g_live[i] = NULL;
            found = 1;
        }
    cr_assert(found, "free was given a block the allocator did not make");
    g_frees++;
    free(p);
}

/* A copy that records where it wrote (the staging). */
static tide_status copy_fn(void *ctx, size_t i, void *dst, const void *src, uint64_t bytes)
{
    void **seen = ctx;
    cr_assert(seen[i] == NULL || seen[i] == dst, "tensor %zu was snapshotted into new staging", i);
    seen[i] = dst;
    int made_here = 0;
    for (int k = 0; k < MAX_LIVE; k++)
        made_here |= g_live[k] == dst;
    cr_assert(made_here, "tensor %zu's staging is not from the given allocator", i);
    memcpy(dst, src, bytes);
    return TIDE_OK;
}

static tide_collection_t *model(void)
{
    tide_model_spec s = {.layers = 2,
                         .hidden = 32,
                         .ffn = 64,
                         .heads = 2,
                         .vocab = 128,
                         .attention = 1,
                         .adam = 1,
                         .dtype = TIDE_F32};
    tide_collection_t *c = NULL;
    cr_assert_eq(tide_collection_build_gpt(&c, &s), TIDE_OK, "%s", tide_last_error());
    return c;
}

Test(ckpt_staging, pinned_like_staging_is_made_once_and_reused)
{
    char root[] = "/tmp/tide-ckpt-staging-XXXXXX";
    cr_assert_not_null(mkdtemp(root));
    tide_collection_t *c = model();
    size_t n = tide_collection_size(c);
    tide_layout_t *l = NULL;
    cr_assert_eq(tide_layout_new(&l, 1, 1, 1, tide_collection_num_layers(c), 4), TIDE_OK);
    void **bufs = calloc(n, sizeof *bufs);
    void **seen = calloc(n, sizeof *seen);
    for (size_t i = 0; i < n; i++) {
        uint64_t b = tide_shard_bytes(l, c, i, 0, 0, 0);
        bufs[i] = malloc(b);
        memset(bufs[i], (int)(i * 7 + 1), b);
    }
    tide_ckpt_saver_t *s = NULL;
    cr_assert_eq(tide_ckpt_saver_new(&s), TIDE_OK);
    tide_ckpt_host_mem bad = {counting_alloc, NULL};
    cr_expect_eq(tide_ckpt_saver_set_host_mem(s, &bad), TIDE_ERR_INVALID);
    tide_ckpt_host_mem mem = {counting_alloc, counting_free};
    cr_assert_eq(tide_ckpt_saver_set_host_mem(s, &mem), TIDE_OK);
    tide_ckpt_save_req req = {.root = root,
                              .layout = l,
                              .coll = c,
                              .publish = 1,
                              .keep = 1,
                              .timeout_ms = 1000,
                              .bufs = bufs,
                              .copy = copy_fn,
                              .copy_ctx = seen};
    cr_assert_eq(tide_ckpt_saver_reserve(s, &req), TIDE_OK, "%s", tide_last_error());
    int after_reserve = g_allocs;
    cr_expect_gt(after_reserve, 0, "reserve made no staging from the allocator");
    for (int64_t step = 1; step <= 3; step++) {
        req.step = step;
        req.save_id = (uint64_t)step;
        cr_assert_eq(tide_ckpt_saver_submit(s, &req), TIDE_OK, "%s", tide_last_error());
        /* each save written before the next: the steady state, where the reserved slot is
           reused (a save queued behind a slow one takes the second slot's staging) */
        cr_assert_eq(tide_ckpt_saver_wait(s), TIDE_OK, "%s", tide_last_error());
    }
    cr_assert_eq(tide_ckpt_saver_wait(s), TIDE_OK, "%s", tide_last_error());
    cr_expect_eq(g_allocs, after_reserve, "saves made %d more staging buffers",
                 g_allocs - after_reserve);
    cr_expect_eq(g_frees, 0);
    /* what was written from that staging loads back */
    char dir[4096];
    int64_t step = 0;
    cr_assert_eq(tide_ckpt_find(root, INT64_MAX, dir, sizeof dir, &step), TIDE_OK);
    cr_expect_eq(step, 3);
    tide_ckpt_t *ck = NULL;
    cr_assert_eq(tide_ckpt_open(&ck, dir), TIDE_OK, "%s", tide_last_error());
    void **back = calloc(n, sizeof *back);
    for (size_t i = 0; i < n; i++)
        back[i] = calloc(1, tide_shard_bytes(l, c, i, 0, 0, 0));
    tide_ckpt_load_stats st;
    cr_assert_eq(tide_ckpt_load(ck, l, 0, 0, 0, back, &st), TIDE_OK, "%s", tide_last_error());
    for (size_t i = 0; i < n; i++)
        cr_expect_eq(memcmp(back[i], bufs[i], tide_shard_bytes(l, c, i, 0, 0, 0)), 0,
                     "tensor %zu differs", i);
    tide_ckpt_close(&ck);
    tide_ckpt_saver_destroy(&s);
    cr_expect_eq(g_frees, g_allocs, "%d staging buffers made, %d freed", g_allocs, g_frees);
    for (size_t i = 0; i < n; i++) {
        free(bufs[i]);
        free(back[i]);
    }
    free(bufs);
    free(back);
    free(seen);
    tide_layout_destroy(&l);
    tide_collection_destroy(&c);
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf %s", root);
    cr_expect_eq(system(cmd), 0);
}

Test(ckpt_staging, a_failing_allocator_fails_the_snapshot)
{
    char root[] = "/tmp/tide-ckpt-staging-XXXXXX";
    cr_assert_not_null(mkdtemp(root));
    tide_collection_t *c = model();
    size_t n = tide_collection_size(c);
    tide_layout_t *l = NULL;
    cr_assert_eq(tide_layout_new(&l, 1, 1, 1, tide_collection_num_layers(c), 4), TIDE_OK);
    void **bufs = calloc(n, sizeof *bufs);
    void **seen = calloc(n, sizeof *seen);
    for (size_t i = 0; i < n; i++)
        bufs[i] = calloc(1, tide_shard_bytes(l, c, i, 0, 0, 0));
    tide_ckpt_saver_t *s = NULL;
    cr_assert_eq(tide_ckpt_saver_new(&s), TIDE_OK);
    tide_ckpt_host_mem mem = {counting_alloc, counting_free};
    cr_assert_eq(tide_ckpt_saver_set_host_mem(s, &mem), TIDE_OK);
    g_fail = 1;
    tide_ckpt_save_req req = {.root = root,
                              .layout = l,
                              .coll = c,
                              .step = 1,
                              .save_id = 1,
                              .publish = 1,
                              .keep = 1,
                              .timeout_ms = 1000,
                              .bufs = bufs,
                              .copy = copy_fn,
                              .copy_ctx = seen};
    cr_expect_eq(tide_ckpt_saver_submit(s, &req), TIDE_ERR_NOMEM);
    char dir[4096];
    int64_t step = 0;
    cr_expect_neq(tide_ckpt_find(root, INT64_MAX, dir, sizeof dir, &step), TIDE_OK,
                  "a checkpoint was written without staging");
    tide_ckpt_saver_destroy(&s);
    for (size_t i = 0; i < n; i++)
        free(bufs[i]);
    free(bufs);
    free(seen);
    tide_layout_destroy(&l);
    tide_collection_destroy(&c);
    rmdir(root);
}
