/*
 * Writes the version-1 fixtures of tests/data with the code of the commit that adds them
 * (the last one whose tided stored layouts, pool lists, fit rules and checkpoint lists as
 * text and whose checkpoints carried the hand-written binary MANIFEST):
 *   state-v1.db        a tided state file written through coordinator/store.c
 *   ckpt-v1/step-000000000042/   a checkpoint written through ckpt/ckpt.c: a small GPT
 *                      with Adam moments and ZeRO-1, saved under (dp 2, tp 2, pp 2)
 * Not built by CMake: later commits change the writers, so this program can only make
 * the old formats at that commit. Build there with
 *   gcc -std=c11 -I. -Iinclude tests/data/make_v1_fixtures.c build/coordinator/libtide_coord.a \
 *       build/ckpt/libtide_ckpt.a build/proto/libtide_proto.a build/reshard/libtide_reshard.a \
 *       build/core/libtide_core.a -lsqlite3 -lmsgpackc -lzmq -lxxhash -lm -lpthread
 * and run it in tests/data. The tests that read the fixtures state what they hold.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ckpt/ckpt.h"
#include "core/alloc.h"
#include "coordinator/state.h"
#include "coordinator/store.h"
#include "proto/proto.h"

#define CHECK(x)                                                                                   \
    do {                                                                                           \
        if ((x) != TIDE_OK) {                                                                      \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, tide_last_error());         \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

static tide_layout_t *mk_layout(int dp, int tp, int pp, int layers, int micro, const char *stages,
                                const int32_t *workers)
{
    tide_layout_t *l = NULL;
    CHECK(tide_layout_new(&l, dp, tp, pp, layers, micro));
    if (stages)
        CHECK(tide_layout_parse_stages(l, stages));
    for (size_t i = 0; workers && i < tide_layout_size(l); i++)
        l->worker[i] = workers[i];
    return l;
}

static void join_blob(tide_coord_job_t *j)
{
    tide_msg_t m;
    tide_msg_init(&m, TIDE_MSG_JOIN);
    tide_proto_join_t *jn = &m.u.join;
    snprintf(jn->job, sizeof jn->job, "train");
    jn->total_bytes = 3 * 4096;
    jn->num_layers = 6;
    jn->dp = 2;
    jn->tp = 1;
    jn->pp = 2;
    jn->micro_batches = 4;
    tide_proto_tensor_t ts[2] = {
        {"embed.weight", 0, 2, {64, 16}, -1, 1, 0, 1, 0},
        {"layer.0.fc1.weight", 0, 2, {32, 16}, 0, 1, 0, 1, 1},
    };
    jn->tensors = ts;
    jn->n_tensors = 2;
    tide_proto_fit_t fit[1] = {{0, 4, "the global batch 16 / 4 micro-batches"}};
    jn->fit = fit;
    jn->n_fit = 1;
    tide_proto_buf_t b;
    tide_proto_buf_init(&b);
    CHECK(tide_proto_encode(&m, &b));
    j->join_blob = tide_proto_buf_release(&b, &j->join_len);
}

static void make_state(const char *path)
{
    unlink(path);
    tide_store_t *s = NULL;
    tide_coord_state_t *st = NULL;
    CHECK(tide_store_open(&s, path, 1));
    CHECK(tide_coord_state_new(&st));
    CHECK(tide_store_begin(s));
    /* workers: pool-a ranks 0..3, pool-b ranks 0..1 (rank 1 forgotten), pool-c rank 0 */
    static const struct {
        const char *pool;
        int rank, size;
        tide_wstate state;
    } ws[] = {{"pool-a", 0, 4, TIDE_WS_ONLINE}, {"pool-a", 1, 4, TIDE_WS_ONLINE},
              {"pool-a", 2, 4, TIDE_WS_ONLINE}, {"pool-a", 3, 4, TIDE_WS_FAILED},
              {"pool-b", 0, 2, TIDE_WS_LEFT},   {"pool-b", 1, 2, TIDE_WS_IDLE},
              {"pool-c", 0, 2, TIDE_WS_OFFLINE}};
    for (size_t i = 0; i < sizeof ws / sizeof ws[0]; i++) {
        tide_coord_worker_t *w = NULL;
        CHECK(tide_coord_worker_add(st, -1, ws[i].pool, ws[i].rank, &w));
        w->pool_size = ws[i].size;
        snprintf(w->host, sizeof w->host, "node-%zu", i / 2);
        w->device = (int32_t)(i % 2);
        w->memory = (uint64_t)(i + 1) << 34;
        w->kind = 1;
        w->pid = 1000 + (int32_t)i;
        w->state = ws[i].state;
        w->job = ws[i].state == TIDE_WS_ONLINE ? 1 : 0;
        w->joined = w->job;
        w->offline_job = ws[i].state == TIDE_WS_OFFLINE ? 4 : 0;
        snprintf(w->owner, sizeof w->owner, "worker:key%zu", i % 3);
        w->gone_ms = tide_coord_worker_gone(w) ? 1700000000000 + (int64_t)i : 0;
        w->fenced_job = ws[i].state == TIDE_WS_FAILED ? 1 : 0;
        CHECK(tide_store_put_worker(s, w));
    }
    tide_coord_worker_remove(st, 5);
    CHECK(tide_store_del_worker(s, 5, st->next_worker_id));

    /* job 1 "train": three pools (one left at generation 7), a committed layout, a pending
       recovery that rolls back to a checkpoint, three checkpoints, three fit rules */
    tide_coord_job_t *j = NULL;
    CHECK(tide_coord_job_add(st, 0, TIDE_CJOB_ONLINE, &j));
    snprintf(j->name, sizeof j->name, "train");
    j->state = TIDE_JS_RESIZING;
    j->created_ms = 1700000000123;
    CHECK(tide_coord_job_add_pool(j, "pool-a", 4, 1));
    CHECK(tide_coord_job_add_pool(j, "pool-b", 2, 0));
    CHECK(tide_coord_job_add_pool(j, "pool-c", 2, 0));
    j->pools[1].left = 7;
    static const int32_t w4[] = {0, 1, 2, 3}, w2[] = {0, 1};
    j->layout = mk_layout(2, 1, 2, 6, 4, "0-1,2-5", w4);
    j->generation = 9;
    j->gen_issued = 10;
    j->step = 123;
    j->req_dp = 2;
    j->req_tp = 1;
    j->req_pp = 2;
    j->req_micro = 4;
    j->num_layers = 6;
    j->total_bytes = 3 * 4096;
    join_blob(j);
    j->fit[0] = (tide_fit_rule){TIDE_DEGREE_DP_MICRO, 16, "the global batch"};
    j->fit[1] = (tide_fit_rule){TIDE_DEGREE_TP, 8, "attention heads"};
    j->fit[2] = (tide_fit_rule){TIDE_DEGREE_PP, INT64_C(1) << 62, ""};
    j->n_fit = 3;
    CHECK(tide_coord_job_add_ckpt(j, 60, "/ck/train/step-000000000060"));
    CHECK(tide_coord_job_add_ckpt(j, 80, "/ck/train/step-000000000080"));
    CHECK(tide_coord_job_add_ckpt(j, 100, "/ck/train with space/step-000000000100"));
    CHECK(tide_reconf_new(&j->reconf, j->layout, mk_layout(1, 1, 2, 6, 8, "0-2,3-5", w2), 10, 1));
    j->reconf->phase = TIDE_RP_COMMIT;
    j->reconf->switch_step = 100;
    j->reconf->switched = 1;
    j->reconf->started_ms = 1700000000999;
    snprintf(j->reconf->reason, sizeof j->reconf->reason,
             "recovery: worker 3 failed; dp 1 instead of 2");
    snprintf(j->reconf->ckpt, sizeof j->reconf->ckpt, "/ck/train with space/step-000000000100");
    j->reconf->ckpt_step = 100;
    CHECK(tide_store_put_job(s, j));

    /* job 2 "waiting": online, queued for joins; no layout, no rules, no checkpoints */
    tide_coord_job_t *q = NULL;
    CHECK(tide_coord_job_add(st, 0, TIDE_CJOB_ONLINE, &q));
    snprintf(q->name, sizeof q->name, "waiting");
    q->state = TIDE_JS_QUEUED;
    CHECK(tide_coord_job_add_pool(q, "pool-d", 8, 1));
    CHECK(tide_store_put_job(s, q));

    /* job 3 "scan": an offline plugin without arguments */
    tide_coord_job_t *p = NULL;
    CHECK(tide_coord_job_add(st, 0, TIDE_CJOB_OFFLINE, &p));
    snprintf(p->name, sizeof p->name, "scan");
    p->state = TIDE_JS_QUEUED;
    p->okind = TIDE_OFFLINE_PLUGIN;
    snprintf(p->plugin, sizeof p->plugin, "tide_scan");
    p->priority = 2;
    CHECK(tide_store_put_job(s, p));

    /* job 4 "eval": an offline command running on worker 6, one failed attempt before */
    tide_coord_job_t *o = NULL;
    CHECK(tide_coord_job_add(st, 0, TIDE_CJOB_OFFLINE, &o));
    snprintf(o->name, sizeof o->name, "eval");
    o->state = TIDE_JS_ASSIGNED;
    static const char *const argv[] = {"python3", "eval.py", "--data=a b", ""};
    o->argv = tide_calloc(4, sizeof *o->argv);
    for (int i = 0; i < 4; i++)
        o->argv[i] = tide_strdup(argv[i]);
    o->argc = 4;
    o->priority = -4;
    o->mem_cap = 1ull << 33;
    o->bubbles = 1;
    o->attempts = 2;
    o->failures = 1;
    o->max_attempts = 5;
    o->worker = 6;
    o->grace_ms = 2500;
    CHECK(tide_store_put_job(s, o));
    tide_store_attempt_t a = {.job = 4, .attempt = 1, .worker = 6, .state = 6, .exit_code = 3};
    snprintf(a.host, sizeof a.host, "node-3");
    snprintf(a.log, sizeof a.log, "/var/log/tide/eval.1.4242.log");
    snprintf(a.tail, sizeof a.tail, "Traceback: boom\n");
    a.time_ms = 1700000001000;
    CHECK(tide_store_put_attempt(s, &a));
    CHECK(tide_store_event(s, 1700000000500, "train", "resize_started", "to dp %d", 1));
    CHECK(tide_store_event(s, 1700000000600, "", "worker_failed", "worker %d", 3));
    CHECK(tide_store_commit(s));
    tide_store_close(&s);
    tide_coord_state_destroy(&st);
}

/* The global tensors of test_ckpt.c's globals(c, salt): deterministic bytes, salted. */
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

static void make_ckpt(const char *root)
{
    tide_model_spec spec = {.layers = 2,
                            .hidden = 16,
                            .ffn = 32,
                            .heads = 2,
                            .vocab = 64,
                            .attention = 1,
                            .adam = 1,
                            .zero1 = 1,
                            .dtype = TIDE_F32};
    tide_collection_t *c = NULL;
    CHECK(tide_collection_build_gpt(&c, &spec));
    tide_layout_t *l = mk_layout(2, 2, 2, tide_collection_num_layers(c), 4, NULL, NULL);
    CHECK(tide_layout_validate(l, c));
    void **g = globals(c, 42);
    char dir[4096];
    tide_ckpt_step_dir(root, 42, dir, sizeof dir);
    size_t n = tide_collection_size(c);
    for (int p = 0; p < l->pp; p++)
        for (int d = 0; d < l->dp; d++)
            for (int t = 0; t < l->tp; t++) {
                void **b = calloc(n, sizeof *b);
                for (size_t i = 0; i < n; i++) {
                    uint64_t sz = tide_shard_bytes(l, c, i, p, d, t);
                    if (sz == 0)
                        continue;
                    b[i] = malloc(sz);
                    tide_shard_extract(l, c, i, p, d, t, g[i], b[i]);
                }
                CHECK(tide_ckpt_write_shard(dir, l, c, p, d, t, (const void *const *)b, 4242));
                for (size_t i = 0; i < n; i++)
                    free(b[i]);
                free(b);
            }
    CHECK(tide_ckpt_publish(dir, l, c, 42, 4242, 1000));
    for (size_t i = 0; i < n; i++)
        free(g[i]);
    free(g);
    tide_layout_destroy(&l);
    tide_collection_destroy(&c);
}

int main(void)
{
    make_state("state-v1.db");
    make_ckpt("ckpt-v1");
    printf("wrote state-v1.db and ckpt-v1/\n");
    return 0;
}
