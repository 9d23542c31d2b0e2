/*
 * Unit tests of the checkpoint module (ckpt/ckpt.h) on a small GPT collection with Adam
 * moments, ZeRO-1 and multi-chunk tensors (tests/ckpt_fixture.h): a checkpoint saved under
 * (2, 2, 2) loads bit-identically into other layouts and stages; exactly one copy of the
 * state is written; truncated, bit-flipped and missing files are refused naming the file;
 * a crash injected in the middle of a save (a child process that _exits) leaves the
 * previous checkpoint loadable; retention; the asynchronous saver snapshots. A failed
 * shard stops the publisher at once; a save is bounded in time; the saver never makes its
 * caller wait (tide_ckpt_saver_offer); older formats load; the manifest is a sealed
 * record. What a checkpoint root may hold (links, special files, other users) is tested
 * in test_ckpt_root.c.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <xxhash.h>

#include "ckpt/ckpt.h"
#include "ckpt/ckpt_int.h"
#include "core/alloc.h"
#include "core/clock.h"
#include "proto/proto.h"
#include "tests/ckpt_fixture.h"

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
                                  .timeout_ms = 1000,
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
Test(ckpt, a_failed_shard_stops_the_publisher_at_once)
{
    tide_collection_t *c = model(0);
    void **g = globals(c, 10);
    tide_layout_t *l = layout(c, 1, 2, 1, NULL);
    char dir[4096], p[4200];
    tide_ckpt_step_dir(g_root, 5, dir, sizeof dir);
    cr_assert_eq(mkdir(dir, 0755), 0);
    /* (0, 0, 1) cannot write: a directory holds its shard's name */
    snprintf(p, sizeof p, "%s/shard-p0-d0-t1.bin", dir);
    cr_assert_eq(mkdir(p, 0755), 0);
    void **b = locals(l, c, g, 0, 0, 1);
    cr_assert_eq(tide_ckpt_write_shard(dir, l, c, 0, 0, 1, (const void *const *)b, 55),
                 TIDE_ERR_INVALID);
    free_bufs(c, b);
    b = locals(l, c, g, 0, 0, 0);
    cr_assert_eq(tide_ckpt_write_shard(dir, l, c, 0, 0, 0, (const void *const *)b, 55), TIDE_OK);
    free_bufs(c, b);
    uint64_t t0 = tide_now_ns();
    cr_assert_eq(tide_ckpt_publish(dir, l, c, 5, 55, 60000), TIDE_ERR_IO);
    cr_assert_lt(tide_now_ns() - t0, 10000000000ull, "the publisher waited for a failed shard");
    cr_assert(strstr(tide_last_error(), "(p 0, d 0, t 1) failed") != NULL &&
                  strstr(tide_last_error(), "is a directory") != NULL,
              "%s", tide_last_error());
    tide_ckpt_t *ck = NULL;
    cr_assert_eq(tide_ckpt_open(&ck, dir), TIDE_ERR_NOT_FOUND);
    /* another save of the same step does not take the old note for its own */
    cr_assert_eq(rmdir(p), 0);
    b = locals(l, c, g, 0, 0, 0);
    cr_assert_eq(tide_ckpt_write_shard(dir, l, c, 0, 0, 0, (const void *const *)b, 56), TIDE_OK);
    free_bufs(c, b);
    t0 = tide_now_ns();
    cr_assert_eq(tide_ckpt_publish(dir, l, c, 5, 56, 300), TIDE_ERR_TIMEOUT);
    cr_assert_geq(tide_now_ns() - t0, 300000000ull);
    tide_layout_destroy(&l);
    free_bufs(c, g);
    tide_collection_destroy(&c);
}

typedef struct done_log {
    int calls;
    tide_status last;
    char why[512];
} done_log;

static void on_done(void *ctx, const tide_ckpt_save_req *req, const char *dir, tide_status rc)
{
    (void)req;
    (void)dir;
    done_log *d = ctx;
    d->calls++;
    d->last = rc;
    snprintf(d->why, sizeof d->why, "%s", rc == TIDE_OK ? "" : tide_last_error());
}

Test(ckpt, the_saver_never_makes_its_caller_wait)
{
    tide_collection_t *c = model(0);
    void **g = globals(c, 11);
    tide_layout_t *l = layout(c, 1, 2, 1, NULL);
    tide_ckpt_saver_t *s = NULL;
    cr_assert_eq(tide_ckpt_saver_new(&s), TIDE_OK);
    void **b = locals(l, c, g, 0, 0, 0);
    done_log log = {0, TIDE_OK, ""};
    /* the publisher of (1, 2, 1) waits for a shard nobody writes: each save holds the
       thread for its bound */
    tide_ckpt_save_req req = {.root = g_root,
                              .layout = l,
                              .coll = c,
                              .publish = 1,
                              .timeout_ms = 1500,
                              .bufs = b,
                              .done = on_done,
                              .done_ctx = &log};
    uint64_t t0 = tide_now_ns();
    for (int64_t step = 1; step <= 2; step++) {
        req.step = step;
        req.save_id = (uint64_t)step;
        cr_assert_eq(tide_ckpt_saver_offer(s, &req), TIDE_OK, "%s", tide_last_error());
    }
    req.step = 3;
    req.save_id = 3;
    cr_assert_eq(tide_ckpt_saver_offer(s, &req), TIDE_ERR_BUSY);
    cr_assert(strstr(tide_last_error(), "step 3 skipped") != NULL &&
                  strstr(tide_last_error(), "step 1") != NULL,
              "%s", tide_last_error());
    /* well under one save's bound: nothing waited for a save to end (however loaded the
       machine) */
    cr_assert_lt(tide_now_ns() - t0, 1000000000ull, "offering three saves took %llu ms",
                 (unsigned long long)((tide_now_ns() - t0) / 1000000));
    cr_assert_eq(tide_ckpt_saver_wait(s), TIDE_ERR_TIMEOUT);
    uint64_t took = tide_now_ns() - t0;
    cr_assert(took >= 3000000000ull && took < 15000000000ull, "two bounded saves took %llu ms",
              (unsigned long long)(took / 1000000));
    cr_assert_eq(log.calls, 2);
    cr_assert(strstr(log.why, "not written within 1500 ms") != NULL, "%s", log.why);
    /* the next save is taken as usual */
    req.step = 4;
    req.save_id = 4;
    cr_assert_eq(tide_ckpt_saver_offer(s, &req), TIDE_OK, "%s", tide_last_error());
    tide_ckpt_saver_destroy(&s);
    cr_assert_eq(log.calls, 3);
    free_bufs(c, b);
    tide_layout_destroy(&l);
    free_bufs(c, g);
    tide_collection_destroy(&c);
}

/* The collection and state of tests/data/ckpt-v1 (tests/data/make_v1_fixtures.c). */
static tide_collection_t *fixture_model(void)
{
    tide_model_spec s = {.layers = 2,
                         .hidden = 16,
                         .ffn = 32,
                         .heads = 2,
                         .vocab = 64,
                         .attention = 1,
                         .adam = 1,
                         .zero1 = 1,
                         .dtype = TIDE_F32};
    tide_collection_t *c = NULL;
    cr_assert_eq(tide_collection_build_gpt(&c, &s), TIDE_OK, "%s", tide_last_error());
    return c;
}

/* A checkpoint an earlier tide wrote (format 1: the hand-written binary MANIFEST) opens,
   verifies and loads bit-identically into other layouts. */
Test(ckpt, a_checkpoint_of_format_1_still_loads)
{
    const char *dir = TIDE_TEST_DATA "/ckpt-v1/step-000000000042";
    tide_collection_t *c = fixture_model();
    void **g = globals(c, 42);
    tide_ckpt_t *ck = NULL;
    cr_assert_eq(tide_ckpt_open(&ck, dir), TIDE_OK, "%s", tide_last_error());
    cr_assert_eq(tide_ckpt_step(ck), 42);
    const tide_layout_t *saved = tide_ckpt_layout(ck);
    cr_assert(saved->dp == 2 && saved->tp == 2 && saved->pp == 2);
    cr_assert_eq(tide_ckpt_num_shards(ck), 8);
    cr_assert_eq(tide_ckpt_verify(ck), TIDE_OK, "%s", tide_last_error());
    tide_ckpt_close(&ck);
    const struct {
        int dp, tp, pp;
    } to[] = {{1, 1, 1}, {2, 2, 2}, {4, 1, 2}, {1, 2, 1}};
    for (size_t k = 0; k < sizeof to / sizeof to[0]; k++) {
        tide_layout_t *nl = layout(c, to[k].dp, to[k].tp, to[k].pp, NULL);
        expect_loads(dir, nl, c, g);
        tide_layout_destroy(&nl);
    }
    free_bufs(c, g);
    tide_collection_destroy(&c);
}

/* Reads file path whole (malloc'd; caller frees). */
static uint8_t *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f, "%s", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *b = malloc((size_t)n + 1);
    cr_assert_eq(fread(b, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    *len = (size_t)n;
    return b;
}

static void spill(const char *path, const void *b, size_t len)
{
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f, "%s", path);
    cr_assert_eq(fwrite(b, 1, len, f), len);
    cr_assert_eq(fclose(f), 0);
}

/* The MANIFEST this tide writes is one sealed "ckpt_manifest" record of format 2: the
   proto decoder reads it; a byte of it flipped is refused naming the file; a
   manifest of a later format is refused naming its version, and one of format 1 is
   told apart (tide_ckpt_format). */
Test(ckpt, the_manifest_is_a_sealed_record)
{
    tide_collection_t *c = fixture_model();
    void **g = globals(c, 5);
    tide_layout_t *l = layout(c, 2, 1, 2, NULL);
    save(g_root, l, c, g, 9);
    char dir[4096], man[4200];
    tide_ckpt_step_dir(g_root, 9, dir, sizeof dir);
    snprintf(man, sizeof man, "%s/MANIFEST", dir);
    size_t len = 0;
    uint8_t *bytes = slurp(man, &len);
    tide_msg_t m;
    cr_assert_eq(tide_proto_decode_record(bytes, len, TIDE_MSG_CKPT_MANIFEST, &m), TIDE_OK, "%s",
                 tide_last_error());
    cr_assert_eq(m.u.ckpt_manifest.format, (uint32_t)TIDE_CKPT_VERSION);
    cr_assert_eq(m.u.ckpt_manifest.step, 9);
    cr_assert_eq(m.u.ckpt_manifest.n_tensors, tide_collection_size(c));
    cr_assert_eq(m.u.ckpt_manifest.n_shards, 4);
    tide_ckpt_t *ck = NULL;
    cr_assert_eq(tide_ckpt_open(&ck, dir), TIDE_OK, "%s", tide_last_error());
    cr_assert_eq(tide_ckpt_format(ck), TIDE_CKPT_VERSION);
    tide_ckpt_close(&ck);
    cr_assert_eq(tide_ckpt_open(&ck, TIDE_TEST_DATA "/ckpt-v1/step-000000000042"), TIDE_OK);
    cr_assert_eq(tide_ckpt_format(ck), 1);
    tide_ckpt_close(&ck);

    /* every byte of the head and of the tail (the seal), every 13th between */
    for (size_t off = 0; off < len; off += off < 64 || off + 64 >= len ? 1 : 13) {
        bytes[off] ^= 0x10;
        spill(man, bytes, len);
        bytes[off] ^= 0x10;
        tide_status rc = tide_ckpt_open(&ck, dir);
        cr_assert_eq(rc, TIDE_ERR_INVALID, "byte %zu flipped was accepted", off);
        cr_assert(strstr(tide_last_error(), man) != NULL, "%s", tide_last_error());
    }

    /* format 3, sealed as this tide seals: refused by its version */
    m.u.ckpt_manifest.format = 3;
    m.u.ckpt_manifest.check = 0;
    tide_proto_buf_t b;
    tide_proto_buf_init(&b);
    cr_assert_eq(tide_proto_encode_record(&m, &b), TIDE_OK);
    m.u.ckpt_manifest.check = XXH3_64bits(b.data, b.len);
    cr_assert_eq(tide_proto_encode_record(&m, &b), TIDE_OK);
    spill(man, b.data, b.len);
    cr_assert_eq(tide_ckpt_open(&ck, dir), TIDE_ERR_INVALID);
    cr_assert(strstr(tide_last_error(), "format version 3; this tide reads versions 1 and 2") !=
                  NULL,
              "%s", tide_last_error());
    spill(man, bytes, len);
    expect_loads(dir, l, c, g);
    tide_proto_buf_destroy(&b);
    tide_msg_clear(&m);
    free(bytes);
    tide_layout_destroy(&l);
    free_bufs(c, g);
    tide_collection_destroy(&c);
}
