/*
 * The fixture of the checkpoint module's unit tests (test_ckpt.c, test_ckpt_root.c): a
 * small GPT collection with Adam moments (ZeRO-1 or not), deterministic global state, each
 * coordinate's shards cut from it, a synchronous save of it under a layout and a check that
 * every coordinate of a layout loads it back bit-identically; and a fresh checkpoint root
 * per test (g_root, the `ckpt` suite's init and fini). Header-only, like tided_fixture.h:
 * Criterion runs each test in its own process. Test thread only.
 */
#ifndef TIDE_TESTS_CKPT_FIXTURE_H
#define TIDE_TESTS_CKPT_FIXTURE_H

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

#include "ckpt/ckpt.h"
#include "ckpt/ckpt_int.h"
#include "core/alloc.h"
#include "proto/proto.h"

static inline tide_collection_t *model(int zero1)
{
    tide_model_spec s = {.layers = 4,
                         .hidden = 64,
                         .ffn = 128,
                         .heads = 4,
                         .vocab = 8192,
                         .attention = 1,
                         .adam = 1,
                         .zero1 = zero1,
                         .dtype = TIDE_F32};
    tide_collection_t *c = NULL;
    cr_assert_eq(tide_collection_build_gpt(&c, &s), TIDE_OK, "%s", tide_last_error());
    return c;
}

static inline tide_layout_t *layout(const tide_collection_t *c, int dp, int tp, int pp,
                                    const char *stages)
{
    tide_layout_t *l = NULL;
    cr_assert_eq(tide_layout_new(&l, dp, tp, pp, tide_collection_num_layers(c), 4), TIDE_OK);
    if (stages != NULL)
        cr_assert_eq(tide_layout_parse_stages(l, stages), TIDE_OK, "%s", tide_last_error());
    cr_assert_eq(tide_layout_validate(l, c), TIDE_OK, "%s", tide_last_error());
    return l;
}

/* Global tensors of deterministic pseudo-random bytes, salted. */
static inline void **globals(const tide_collection_t *c, uint32_t salt)
{
    size_t n = tide_collection_size(c);
    void **g = calloc(n, sizeof *g);
    uint32_t x = 2463534242u ^ salt;
    for (size_t i = 0; i < n; i++) {
        uint64_t b = tide_tensor_bytes(tide_collection_tensor(c, i));
        uint8_t *p = malloc(b);
        for (uint64_t k = 0; k < b; k++) {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            p[k] = (uint8_t)x;
        }
        g[i] = p;
    }
    return g;
}

static inline void free_bufs(const tide_collection_t *c, void **b)
{
    for (size_t i = 0; b != NULL && i < tide_collection_size(c); i++)
        free(b[i]);
    free(b);
}

/* Coordinate (p, d, t)'s local shards of the global tensors. */
static inline void **locals(const tide_layout_t *l, const tide_collection_t *c, void **g, int p,
                            int d, int t)
{
    size_t n = tide_collection_size(c);
    void **b = calloc(n, sizeof *b);
    for (size_t i = 0; i < n; i++) {
        uint64_t sz = tide_shard_bytes(l, c, i, p, d, t);
        if (sz == 0)
            continue;
        b[i] = malloc(sz);
        tide_shard_extract(l, c, i, p, d, t, g[i], b[i]);
    }
    return b;
}

/* Saves the global state under layout l as step `step` of root, synchronously. */
static inline void save(const char *root, const tide_layout_t *l, const tide_collection_t *c,
                        void **g, int64_t step)
{
    char dir[4096];
    tide_ckpt_step_dir(root, step, dir, sizeof dir);
    for (int p = 0; p < l->pp; p++)
        for (int d = 0; d < l->dp; d++)
            for (int t = 0; t < l->tp; t++) {
                void **b = locals(l, c, g, p, d, t);
                cr_assert_eq(tide_ckpt_write_shard(dir, l, c, p, d, t, (const void *const *)b,
                                                   (uint64_t)step * 7 + 1),
                             TIDE_OK, "%s", tide_last_error());
                free_bufs(c, b);
            }
    cr_assert_eq(tide_ckpt_publish(dir, l, c, step, (uint64_t)step * 7 + 1, 1000), TIDE_OK, "%s",
                 tide_last_error());
}

/* Loads every coordinate of l from dir and compares with the global state. */
static inline void expect_loads(const char *dir, const tide_layout_t *l, const tide_collection_t *c,
                                void **g)
{
    tide_ckpt_t *ck = NULL;
    cr_assert_eq(tide_ckpt_open(&ck, dir), TIDE_OK, "%s", tide_last_error());
    cr_assert_eq(tide_ckpt_check_collection(ck, c), TIDE_OK, "%s", tide_last_error());
    size_t n = tide_collection_size(c);
    for (int p = 0; p < l->pp; p++)
        for (int d = 0; d < l->dp; d++)
            for (int t = 0; t < l->tp; t++) {
                void **want = locals(l, c, g, p, d, t);
                void **got = calloc(n, sizeof *got);
                uint64_t need = 0;
                for (size_t i = 0; i < n; i++)
                    if (want[i] != NULL) {
                        uint64_t b = tide_shard_bytes(l, c, i, p, d, t);
                        got[i] = calloc(1, b);
                        need += b;
                    }
                tide_ckpt_load_stats st;
                cr_assert_eq(tide_ckpt_load(ck, l, p, d, t, got, &st), TIDE_OK, "%s",
                             tide_last_error());
                cr_assert_eq(st.bytes_needed, need, "(%d,%d,%d) needed %llu, filled %llu", p, d, t,
                             (unsigned long long)need, (unsigned long long)st.bytes_needed);
                for (size_t i = 0; i < n; i++)
                    if (want[i] != NULL)
                        cr_assert(memcmp(want[i], got[i], tide_shard_bytes(l, c, i, p, d, t)) == 0,
                                  "(%d,%d,%d) tensor %s differs", p, d, t,
                                  tide_collection_tensor(c, i)->name);
                free_bufs(c, want);
                free_bufs(c, got);
            }
    tide_ckpt_close(&ck);
}

static char g_root[256];

static inline void make_root(void)
{
    snprintf(g_root, sizeof g_root, "/tmp/tide-test-ckpt-XXXXXX");
    cr_assert_not_null(mkdtemp(g_root));
}

static inline void rm_root(void)
{
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_root);
    cr_assert_eq(system(cmd), 0);
}

TestSuite(ckpt, .init = make_root, .fini = rm_root);

#endif /* TIDE_TESTS_CKPT_FIXTURE_H */
