/*
 * Unit tests of the checkpoint module (ckpt/ckpt.h) on a small GPT collection with Adam
 * moments, ZeRO-1 and multi-chunk tensors: a checkpoint saved under (2, 2, 2) loads
 * bit-identically into other layouts and stages; exactly one copy of the state is
 * written; truncated, bit-flipped and missing files are refused naming the file; a
 * crash injected in the middle of a save (a child process that _exits) leaves the
 * previous checkpoint loadable; retention; the asynchronous saver snapshots.
 */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ckpt/ckpt.h"
#include "core/alloc.h"

static tide_collection_t *model(int zero1)
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

static tide_layout_t *layout(const tide_collection_t *c, int dp, int tp, int pp, const char *stages)
{
    tide_layout_t *l = NULL;
    cr_assert_eq(tide_layout_new(&l, dp, tp, pp, tide_collection_num_layers(c), 4), TIDE_OK);
    if (stages != NULL)
        cr_assert_eq(tide_layout_parse_stages(l, stages), TIDE_OK, "%s", tide_last_error());
    cr_assert_eq(tide_layout_validate(l, c), TIDE_OK, "%s", tide_last_error());
    return l;
}

/* Global tensors of deterministic pseudo-random bytes, salted. */
static void **globals(const tide_collection_t *c, uint32_t salt)
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

static void free_bufs(const tide_collection_t *c, void **b)
{
    for (size_t i = 0; b != NULL && i < tide_collection_size(c); i++)
        free(b[i]);
    free(b);
}

/* Coordinate (p, d, t)'s local shards of the global tensors. */
static void **locals(const tide_layout_t *l, const tide_collection_t *c, void **g, int p, int d,
                     int t)
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
static void save(const char *root, const tide_layout_t *l, const tide_collection_t *c, void **g,
                 int64_t step)
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
static void expect_loads(const char *dir, const tide_layout_t *l, const tide_collection_t *c,
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

static void make_root(void)
{
    snprintf(g_root, sizeof g_root, "/tmp/tide-test-ckpt-XXXXXX");
    cr_assert_not_null(mkdtemp(g_root));
}

static void rm_root(void)
{
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_root);
    cr_assert_eq(system(cmd), 0);
}

TestSuite(ckpt, .init = make_root, .fini = rm_root);

static void round_trip(int zero1)
{
    tide_collection_t *c = model(zero1);
    void **g = globals(c, 1);
    tide_layout_t *l = layout(c, 2, 2, 2, NULL);
    save(g_root, l, c, g, 6);
    char dir[4096];
    int64_t step = 0;
    cr_assert_eq(tide_ckpt_find(g_root, INT64_MAX, dir, sizeof dir, &step), TIDE_OK);
    cr_assert_eq(step, 6);
    tide_ckpt_t *ck = NULL;
    cr_assert_eq(tide_ckpt_open(&ck, dir), TIDE_OK, "%s", tide_last_error());
    cr_assert_eq(tide_ckpt_verify(ck), TIDE_OK, "%s", tide_last_error());
    /* one copy of every byte: dp replicas, tp-replicated and every-stage tensors once */
    uint64_t written = 0;
    for (size_t k = 0; k < tide_ckpt_num_shards(ck); k++) {
        int p, d, t;
        uint64_t b;
        const char *f;
        tide_ckpt_shard_info(ck, k, &p, &d, &t, &b, &f);
        cr_assert(zero1 || d == 0, "dp rank %d wrote %s without ZeRO-1", d, f);
        written += b;
    }
    cr_assert_eq(written, tide_collection_bytes(c), "wrote %llu bytes for %llu of state",
                 (unsigned long long)written, (unsigned long long)tide_collection_bytes(c));
    tide_ckpt_close(&ck);
    const struct {
        int dp, tp, pp;
        const char *stages;
    } to[] = {{1, 4, 2, NULL},          {4, 1, 2, NULL}, {1, 2, 4, "0-0,1-1,2-2,3-3"},
              {1, 2, 3, "0-1,2-2,3-3"}, {1, 1, 1, NULL}, {2, 2, 2, NULL},
              {8, 1, 1, NULL}};
    for (size_t k = 0; k < sizeof to / sizeof to[0]; k++) {
        tide_layout_t *nl = layout(c, to[k].dp, to[k].tp, to[k].pp, to[k].stages);
        expect_loads(dir, nl, c, g);
        tide_layout_destroy(&nl);
    }
    tide_layout_destroy(&l);
    free_bufs(c, g);
    tide_collection_destroy(&c);
}

Test(ckpt, loads_into_any_layout)
{
    round_trip(0);
}

Test(ckpt, loads_into_any_layout_zero1)
{
    round_trip(1);
}

/* Rewrites byte off of file path with its complement. */
static void flip(const char *path, off_t off)
{
    int fd = open(path, O_RDWR);
    cr_assert_geq(fd, 0, "open %s", path);
    unsigned char b;
    cr_assert_eq(pread(fd, &b, 1, off), 1);
    b = (unsigned char)~b;
    cr_assert_eq(pwrite(fd, &b, 1, off), 1);
    close(fd);
}

static tide_status load_all(const char *dir, const tide_layout_t *l, const tide_collection_t *c)
{
    tide_ckpt_t *ck = NULL;
    tide_status rc = tide_ckpt_open(&ck, dir);
    if (rc != TIDE_OK)
        return rc;
    size_t n = tide_collection_size(c);
    void **b = calloc(n, sizeof *b);
    for (size_t i = 0; i < n; i++) {
        uint64_t sz = tide_shard_bytes(l, c, i, 0, 0, 0);
        b[i] = sz ? malloc(sz) : NULL;
    }
    rc = tide_ckpt_load(ck, l, 0, 0, 0, b, NULL);
    free_bufs(c, b);
    tide_ckpt_close(&ck);
    return rc;
}

Test(ckpt, refuses_damaged_files_naming_them)
{
    tide_collection_t *c = model(1);
    void **g = globals(c, 2);
    tide_layout_t *l = layout(c, 2, 2, 2, NULL), *one = layout(c, 1, 1, 1, NULL);
    save(g_root, l, c, g, 3);
    char dir[4096], path[4200], man[4200];
    tide_ckpt_step_dir(g_root, 3, dir, sizeof dir);
    cr_assert_eq(load_all(dir, one, c), TIDE_OK, "%s", tide_last_error());

    /* a bit flipped in a shard: verify and load both name the file */
    snprintf(path, sizeof path, "%s/shard-p0-d0-t1.bin", dir);
    flip(path, 1000);
    tide_ckpt_t *ck = NULL;
    cr_assert_eq(tide_ckpt_open(&ck, dir), TIDE_OK);
    tide_status rc = tide_ckpt_verify(ck);
    cr_assert_eq(rc, TIDE_ERR_INVALID);
    cr_assert(strstr(tide_last_error(), "shard-p0-d0-t1.bin") != NULL &&
                  strstr(tide_last_error(), "corrupted") != NULL,
              "%s", tide_last_error());
    tide_ckpt_close(&ck);
    rc = load_all(dir, one, c);
    cr_assert_eq(rc, TIDE_ERR_INVALID);
    cr_assert(strstr(tide_last_error(), "shard-p0-d0-t1.bin") != NULL, "%s", tide_last_error());
    flip(path, 1000);
    cr_assert_eq(load_all(dir, one, c), TIDE_OK, "%s", tide_last_error());

    /* a truncated shard */
    snprintf(path, sizeof path, "%s/shard-p1-d1-t0.bin", dir);
    struct stat st;
    cr_assert_eq(stat(path, &st), 0);
    cr_assert_eq(truncate(path, st.st_size / 2), 0);
    rc = load_all(dir, one, c);
    cr_assert_eq(rc, TIDE_ERR_INVALID);
    cr_assert(strstr(tide_last_error(), "shard-p1-d1-t0.bin") != NULL &&
                  strstr(tide_last_error(), "truncated") != NULL,
              "%s", tide_last_error());

    /* a missing shard */
    cr_assert_eq(unlink(path), 0);
    rc = load_all(dir, one, c);
    cr_assert_eq(rc, TIDE_ERR_NOT_FOUND);
    cr_assert(strstr(tide_last_error(), "shard-p1-d1-t0.bin") != NULL, "%s", tide_last_error());

    /* the manifest: a flipped byte, then a truncation */
    snprintf(man, sizeof man, "%s/MANIFEST", dir);
    flip(man, 40);
    rc = tide_ckpt_open(&ck, dir);
    cr_assert_eq(rc, TIDE_ERR_INVALID);
    cr_assert(strstr(tide_last_error(), man) != NULL, "%s", tide_last_error());
    flip(man, 40);
    cr_assert_eq(tide_ckpt_open(&ck, dir), TIDE_OK);
    tide_ckpt_close(&ck);
    cr_assert_eq(stat(man, &st), 0);
    cr_assert_eq(truncate(man, st.st_size - 9), 0);
    rc = tide_ckpt_open(&ck, dir);
    cr_assert_eq(rc, TIDE_ERR_INVALID);
    cr_assert(strstr(tide_last_error(), man) != NULL, "%s", tide_last_error());

    /* a checkpoint of another model */
    save(g_root, l, c, g, 4);
    tide_ckpt_step_dir(g_root, 4, dir, sizeof dir);
    cr_assert_eq(tide_ckpt_open(&ck, dir), TIDE_OK);
    tide_collection_t *other = model(0);
    rc = tide_ckpt_check_collection(ck, other);
    cr_assert_eq(rc, TIDE_ERR_INVALID);
    cr_assert(strstr(tide_last_error(), "exp_avg") != NULL, "%s", tide_last_error());
    tide_collection_destroy(&other);
    tide_ckpt_close(&ck);

    tide_layout_destroy(&l);
    tide_layout_destroy(&one);
    free_bufs(c, g);
    tide_collection_destroy(&c);
}

/* Saves step `step` in a child process that dies at the fault point; returns its status. */
static int crashing_save(const tide_layout_t *l, const tide_collection_t *c, void **g, int64_t step,
                         const char *fault)
{
    fflush(NULL);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        setenv("TIDE_CKPT_FAULT", fault, 1);
        char dir[4096];
        tide_ckpt_step_dir(g_root, step, dir, sizeof dir);
        for (int p = 0; p < l->pp; p++)
            for (int d = 0; d < l->dp; d++)
                for (int t = 0; t < l->tp; t++) {
                    void **b = locals(l, c, g, p, d, t);
                    if (tide_ckpt_write_shard(dir, l, c, p, d, t, (const void *const *)b, 99) !=
                        TIDE_OK)
                        _exit(3);
                    free_bufs(c, b);
                }
        _exit(tide_ckpt_publish(dir, l, c, step, 99, 1000) == TIDE_OK ? 0 : 4);
    }
    int status = 0;
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

Test(ckpt, crash_during_save_keeps_the_previous_checkpoint)
{
    tide_collection_t *c = model(1);
    void **g = globals(c, 3), *g2 = NULL;
    tide_layout_t *l = layout(c, 2, 2, 2, NULL), *nl = layout(c, 1, 4, 2, NULL);
    save(g_root, l, c, g, 10);
    void **later = globals(c, 4);
    const char *faults[] = {"shards:1", "shards:5", "manifest"};
    for (size_t k = 0; k < 3; k++) {
        cr_assert_eq(crashing_save(l, c, later, 20, faults[k]), 86, "fault %s", faults[k]);
        char dir[4096];
        int64_t step = 0;
        cr_assert_eq(tide_ckpt_find(g_root, INT64_MAX, dir, sizeof dir, &step), TIDE_OK);
        cr_assert_eq(step, 10, "after a crash at %s the newest complete checkpoint is step %lld",
                     faults[k], (long long)step);
        expect_loads(dir, nl, c, g);
        char half[4096];
        tide_ckpt_step_dir(g_root, 20, half, sizeof half);
        tide_ckpt_t *ck = NULL;
        cr_assert_eq(tide_ckpt_open(&ck, half), TIDE_ERR_NOT_FOUND);
    }
    /* the same save, not interrupted, publishes over the crashed attempt's files */
    cr_assert_eq(crashing_save(l, c, later, 20, "none"), 0);
    char dir[4096];
    int64_t step = 0;
    cr_assert_eq(tide_ckpt_find(g_root, INT64_MAX, dir, sizeof dir, &step), TIDE_OK);
    cr_assert_eq(step, 20);
    expect_loads(dir, nl, c, later);
    /* the one before it, explicitly */
    cr_assert_eq(tide_ckpt_find(g_root, 20, dir, sizeof dir, &step), TIDE_OK);
    cr_assert_eq(step, 10);
    (void)g2;
    free_bufs(c, later);
    tide_layout_destroy(&l);
    tide_layout_destroy(&nl);
    free_bufs(c, g);
    tide_collection_destroy(&c);
}

Test(ckpt, retention_and_publish_timeout)
{
    tide_collection_t *c = model(0);
    void **g = globals(c, 5);
    tide_layout_t *l = layout(c, 1, 2, 1, NULL);
    for (int64_t s = 1; s <= 4; s++)
        save(g_root, l, c, g, s);
    /* an incomplete save newer than all (in progress) is left alone */
    char dir[4096];
    tide_ckpt_step_dir(g_root, 5, dir, sizeof dir);
    void **b = locals(l, c, g, 0, 0, 0);
    cr_assert_eq(tide_ckpt_write_shard(dir, l, c, 0, 0, 0, (const void *const *)b, 5), TIDE_OK);
    free_bufs(c, b);
    tide_status rc = tide_ckpt_publish(dir, l, c, 5, 5, 50);
    cr_assert_eq(rc, TIDE_ERR_TIMEOUT);
    cr_assert(strstr(tide_last_error(), "shard-p0-d0-t1.sum") != NULL, "%s", tide_last_error());
    cr_assert_eq(tide_ckpt_prune(g_root, 2), TIDE_OK, "%s", tide_last_error());
    struct stat st;
    for (int64_t s = 1; s <= 5; s++) {
        tide_ckpt_step_dir(g_root, s, dir, sizeof dir);
        int exists = stat(dir, &st) == 0;
        cr_assert_eq(exists, s >= 3, "step %lld: exists %d", (long long)s, exists);
    }
    cr_assert_eq(tide_ckpt_prune(g_root, 0), TIDE_ERR_INVALID);
    tide_layout_destroy(&l);
    free_bufs(c, g);
    tide_collection_destroy(&c);
}

static tide_status copy_fn(void *ctx, size_t i, void *dst, const void *src, uint64_t n)
{
    (void)i;
    (*(int *)ctx)++;
    memcpy(dst, src, n);
    return TIDE_OK;
}

Test(ckpt, async_saver_snapshots_then_writes)
{
    tide_collection_t *c = model(1);
    void **g = globals(c, 6);
    tide_layout_t *l = layout(c, 1, 1, 1, NULL);
    tide_ckpt_saver_t *s = NULL;
    cr_assert_eq(tide_ckpt_saver_new(&s), TIDE_OK);
    int copies = 0;
    for (int64_t step = 1; step <= 3; step++) {
        void **b = locals(l, c, g, 0, 0, 0);
        tide_ckpt_save_req req = {.root = g_root,
                                  .layout = l,
                                  .coll = c,
                                  .step = step,
                                  .save_id = (uint64_t)step,
                                  .publish = 1,
                                  .keep = 2,
                                  .publish_timeout_ms = 1000,
                                  .bufs = b,
                                  .copy = copy_fn,
                                  .copy_ctx = &copies};
        cr_assert_eq(tide_ckpt_saver_submit(s, &req), TIDE_OK, "%s", tide_last_error());
        /* training goes on: the buffers change right away */
        for (size_t i = 0; i < tide_collection_size(c); i++)
            memset(b[i], 0xee, tide_shard_bytes(l, c, i, 0, 0, 0));
        free_bufs(c, b);
    }
    cr_assert_eq(tide_ckpt_saver_wait(s), TIDE_OK, "%s", tide_last_error());
    cr_assert_eq(copies, 3 * (int)tide_collection_size(c));
    char dir[4096];
    int64_t step = 0;
    cr_assert_eq(tide_ckpt_find(g_root, INT64_MAX, dir, sizeof dir, &step), TIDE_OK);
    cr_assert_eq(step, 3);
    tide_layout_t *nl = layout(c, 2, 2, 2, NULL);
    expect_loads(dir, nl, c, g);
    /* a failing save is reported by the next wait */
    void **b = locals(l, c, g, 0, 0, 0);
    tide_ckpt_save_req bad = {.root = "/proc/no-such-dir",
                              .layout = l,
                              .coll = c,
                              .step = 4,
                              .save_id = 4,
                              .publish = 1,
                              .bufs = b};
    cr_assert_eq(tide_ckpt_saver_submit(s, &bad), TIDE_OK);
    cr_assert_eq(tide_ckpt_saver_wait(s), TIDE_ERR_IO);
    cr_assert(strstr(tide_last_error(), "/proc/no-such-dir") != NULL, "%s", tide_last_error());
    free_bufs(c, b);
    tide_ckpt_saver_destroy(&s);
    cr_assert_null(s);
    tide_layout_destroy(&nl);
    tide_layout_destroy(&l);
    free_bufs(c, g);
    tide_collection_destroy(&c);
}
