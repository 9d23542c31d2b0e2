/*
 * Part of test_collectives_conformance (the collectives conformance suite; its cases run
 * in the order of main() in test_collectives_conformance.c): the reshard executor on
 * random hand-made strided plans and, when reshard/ is built, on random planner plans,
 * with the gathered state bit-identical, progress reported and staging under the cap;
 * the executor's argument and allocation-failure agreement; and its plans again with
 * every message eligible for single copy (and none with TIDE_COLL_CMA=0).
 */
#include <mpi.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "collectives/collectives.h"
#include "collectives/executor.h"
#include "core/alloc.h"
#include "core/clock.h"
#include "core/error.h"
#include "conf_fixture.h"
#include "mpi_test.h"

/* ---- executor: hand-made random plans ------------------------------------------------------ */

typedef struct part {
    int w;
    uint32_t r0, r1, c0, c1;
} part;

typedef struct rplan {
    int T;
    uint32_t rows[8], cols[8];
    part oldp[8][24], newp[8][24];
    int n_old[8], n_new[8];
    tide_xfer items[4096];
    size_t n;
} rplan;

static unsigned char gbyte(int t, uint32_t r, uint32_t c)
{
    uint64_t x = seed ^ ((uint64_t)t << 50) ^ ((uint64_t)r << 25) ^ c;
    x *= 0x9E3779B97F4A7C15ull;
    return (unsigned char)(x >> 56);
}

/* Splits tensor t by rows or columns into parts held by distinct workers, some parts
   replicated on a second worker. */
static void partition(uint64_t *s, rplan *p, int t, int W, part *out, int *n_out)
{
    int by_rows = (int)rng_below(s, 2);
    uint32_t dim = by_rows ? p->rows[t] : p->cols[t];
    int k = 1 + (int)rng_below(s, (uint64_t)(W < (int)dim ? W : (int)dim));
    int unused[64], n_unused = W, n = 0;
    for (int w = 0; w < W; w++)
        unused[w] = w;
    uint32_t at = 0;
    for (int i = 0; i < k; i++) {
        uint32_t end =
            i == k - 1 ? dim : at + 1 + (uint32_t)rng_below(s, dim - at - (uint32_t)(k - i) + 1);
        /* a replica only while enough workers remain for the parts still to place */
        int reps = 1 + (rng_below(s, 3) == 0 && n_unused - 1 > k - i - 1);
        for (int rep = 0; rep < reps; rep++) {
            int j = (int)rng_below(s, (uint64_t)n_unused), w = unused[j];
            unused[j] = unused[--n_unused];
            part q = {w, 0, p->rows[t], 0, p->cols[t]};
            if (by_rows) {
                q.r0 = at;
                q.r1 = end;
            } else {
                q.c0 = at;
                q.c1 = end;
            }
            out[n++] = q;
        }
        at = end;
    }
    *n_out = n;
}

static int cmp_item(const void *a, const void *b)
{
    const tide_xfer *x = a, *y = b;
    if (x->src != y->src)
        return x->src < y->src ? -1 : 1;
    if (x->dst != y->dst)
        return x->dst < y->dst ? -1 : 1;
    if (x->tensor != y->tensor)
        return x->tensor < y->tensor ? -1 : 1;
    return x->dst_off < y->dst_off ? -1 : x->dst_off > y->dst_off;
}

static void make_rplan(uint64_t *s, rplan *p, int W)
{
    memset(p, 0, sizeof *p);
    p->T = 1 + (int)rng_below(s, 4);
    for (int t = 0; t < p->T; t++) {
        p->rows[t] = 1 + (uint32_t)rng_below(s, 12);
        p->cols[t] = 1 + (uint32_t)rng_below(s, 40);
        partition(s, p, t, W, p->oldp[t], &p->n_old[t]);
        partition(s, p, t, W, p->newp[t], &p->n_new[t]);
        /* Every new part takes each overlapping old region from one holder: itself when
           it holds it (a local copy), else a random replica. */
        for (int i = 0; i < p->n_new[t]; i++) {
            part *P = &p->newp[t][i];
            /* old parts are grouped by region: consecutive entries with equal bounds */
            for (int j = 0; j < p->n_old[t];) {
                int e = j;
                while (e < p->n_old[t] && p->oldp[t][e].r0 == p->oldp[t][j].r0 &&
                       p->oldp[t][e].c0 == p->oldp[t][j].c0 &&
                       p->oldp[t][e].r1 == p->oldp[t][j].r1 && p->oldp[t][e].c1 == p->oldp[t][j].c1)
                    e++;
                part *Q = &p->oldp[t][j];
                int src = p->oldp[t][j + (int)rng_below(s, (uint64_t)(e - j))].w;
                for (int q = j; q < e; q++)
                    if (p->oldp[t][q].w == P->w)
                        src = P->w;
                uint32_t r0 = P->r0 > Q->r0 ? P->r0 : Q->r0, r1 = P->r1 < Q->r1 ? P->r1 : Q->r1;
                uint32_t c0 = P->c0 > Q->c0 ? P->c0 : Q->c0, c1 = P->c1 < Q->c1 ? P->c1 : Q->c1;
                if (r0 < r1 && c0 < c1) {
                    uint32_t qw = Q->c1 - Q->c0, pw = P->c1 - P->c0;
                    tide_xfer *it = &p->items[p->n++];
                    it->tensor = (uint32_t)t;
                    it->src = src;
                    it->dst = P->w;
                    it->run = c1 - c0;
                    it->count = r1 - r0;
                    it->src_off = (uint64_t)(r0 - Q->r0) * qw + (c0 - Q->c0);
                    it->src_stride = qw;
                    it->dst_off = (uint64_t)(r0 - P->r0) * pw + (c0 - P->c0);
                    it->dst_stride = pw;
                }
                j = e;
            }
        }
    }
    qsort(p->items, p->n, sizeof p->items[0], cmp_item);
}

struct prog {
    uint64_t last, total;
    int calls, monotonic;
};

static void on_progress(void *ctx, uint64_t done, uint64_t total)
{
    struct prog *p = ctx;
    if (done < p->last || done > total)
        p->monotonic = 0;
    p->last = done;
    p->total = total;
    p->calls++;
}

/* Bytes the executor tests received by single copy (tide_exec_stats.bytes_direct). */
static uint64_t exec_direct;

static void run_rplan(tide_coll_comm_t *c, uint64_t *s, int W, uint64_t cap, uint64_t chunk,
                      uint64_t pack)
{
    static rplan p;
    make_rplan(s, &p, W);
    int *rank_of = malloc(sizeof(int) * (size_t)W);
    for (int w = 0; w < W; w++)
        rank_of[w] = w % np;
    void *oldb[64][8] = {{0}}, *newb[64][8] = {{0}};
    uint64_t olds[64][8] = {{0}}, news[64][8] = {{0}};
    void **ob[64], **nb[64];
    const uint64_t *os[64], *ns[64];
    for (int w = 0; w < W; w++) {
        ob[w] = oldb[w];
        nb[w] = newb[w];
        os[w] = olds[w];
        ns[w] = news[w];
    }
    for (int t = 0; t < p.T; t++) {
        for (int side = 0; side < 2; side++) {
            part *parts = side ? p.newp[t] : p.oldp[t];
            int n = side ? p.n_new[t] : p.n_old[t];
            for (int i = 0; i < n; i++) {
                part *q = &parts[i];
                if (rank_of[q->w] != me)
                    continue;
                uint32_t w = q->c1 - q->c0, h = q->r1 - q->r0;
                unsigned char *hb = malloc((size_t)w * h);
                for (uint32_t r = 0; r < h; r++)
                    for (uint32_t k = 0; k < w; k++)
                        hb[r * w + k] = side ? 0xEE : gbyte(t, q->r0 + r, q->c0 + k);
                void *d = dalloc((size_t)w * h);
                put(d, hb, (size_t)w * h);
                free(hb);
                (side ? newb : oldb)[q->w][t] = d;
                (side ? news : olds)[q->w][t] = (uint64_t)w * h;
            }
        }
    }
    tide_plan_t plan = {.items = p.items, .n = p.n};
    tide_exec_args a = {.plan = &plan,
                        .n_workers = (size_t)W,
                        .n_tensors = (size_t)p.T,
                        .rank_of_worker = rank_of,
                        .old_bufs = (void *const *const *)ob,
                        .new_bufs = (void *const *const *)nb,
                        .old_bytes = os,
                        .new_bytes = ns};
    struct prog pr = {0, 0, 0, 1};
    tide_exec_opts o;
    tide_exec_opts_init(&o);
    o.staging_cap = cap;
    o.max_chunk = chunk;
    o.pack_below = pack; /* small: most items in place, their rounds posted ahead */
    o.progress = on_progress;
    o.progress_ctx = &pr;
    tide_exec_stats st;
    MT_OK(tide_reshard_execute(c, &a, &o, &st));
    MT_ASSERT(st.bytes_direct <= st.bytes_recv, "%llu bytes by single copy of %llu received",
              (unsigned long long)st.bytes_direct, (unsigned long long)st.bytes_recv);
    exec_direct += st.bytes_direct;
    MT_ASSERT(pr.calls >= 1 && pr.monotonic && pr.last == pr.total, "progress %llu/%llu, %d calls",
              (unsigned long long)pr.last, (unsigned long long)pr.total, pr.calls);
    MT_ASSERT(pr.total == st.bytes_local + st.bytes_sent + st.bytes_recv, "progress total");
    MT_ASSERT(st.peak_staging <= cap, "peak staging %llu > cap %llu",
              (unsigned long long)st.peak_staging, (unsigned long long)cap);
    /* Every byte of every new shard equals the global tensor: the state gathered from the
       new shards is bit-identical to the original. */
    for (int t = 0; t < p.T; t++)
        for (int i = 0; i < p.n_new[t]; i++) {
            part *q = &p.newp[t][i];
            if (rank_of[q->w] != me)
                continue;
            uint32_t w = q->c1 - q->c0, h = q->r1 - q->r0;
            unsigned char *hb = malloc((size_t)w * h);
            get(hb, newb[q->w][t], (size_t)w * h);
            for (uint32_t r = 0; r < h; r++)
                for (uint32_t k = 0; k < w; k++)
                    MT_ASSERT(hb[r * w + k] == gbyte(t, q->r0 + r, q->c0 + k),
                              "tensor %d worker %d byte (%u,%u) W=%d cap=%llu chunk=%llu", t, q->w,
                              r, k, W, (unsigned long long)cap, (unsigned long long)chunk);
            free(hb);
        }
    for (int w = 0; w < W; w++)
        for (int t = 0; t < p.T; t++) {
            if (oldb[w][t])
                be->mem_free(oldb[w][t]);
            if (newb[w][t])
                be->mem_free(newb[w][t]);
        }
    free(rank_of);
}

void test_executor_random(void)
{
    tide_coll_comm_t *c = world_comm();
    uint64_t s = seed ^ 0x4444;
    for (int iter = 0; iter < 16; iter++) {
        int W = 1 + (int)rng_below(&s, (uint64_t)(2 * np < 24 ? 2 * np : 24));
        uint64_t cap = iter % 3 == 0 ? ((uint64_t)256 << 20) : 64 + rng_below(&s, 16384);
        /* chunks smaller than a row cut runs into pieces; bigger ones pack whole items */
        uint64_t chunk = iter % 4 == 0 ? 0
                         : iter % 2    ? 1 + rng_below(&s, 24)
                                       : 1 + rng_below(&s, 700);
        /* pack_below small: items travel in place (rounds posted ahead, without
           staging) between staged rounds of packed small items */
        uint64_t pack = iter % 3 == 1 ? 1 + (uint64_t)iter * 37 : 0;
        run_rplan(c, &s, W, cap, chunk, pack);
    }
    tide_coll_comm_destroy(&c);
    mt_pass("executor_random_plans");
}

void test_executor_errors(void)
{
    tide_coll_comm_t *c = world_comm();
    int W = np;
    tide_xfer items[2];
    memset(items, 0, sizeof items);
    /* worker w sends 16 bytes of tensor 0 to w+1 */
    unsigned char *hold = calloc(64, 1), *hnew = calloc(64, 1);
    void *oldb = dalloc(64), *newb = dalloc(64);
    void *ob_row[1] = {oldb}, *nb_row[1] = {newb};
    void **ob = calloc((size_t)W, sizeof *ob), **nb = calloc((size_t)W, sizeof *nb);
    ob[me] = ob_row;
    nb[me] = nb_row;
    tide_plan_t plan = {.items = items, .n = 1};
    tide_exec_args a = {.plan = &plan,
                        .n_workers = (size_t)W,
                        .n_tensors = 1,
                        .old_bufs = (void *const *const *)ob,
                        .new_bufs = (void *const *const *)nb};
    items[0] = (tide_xfer){.tensor = 3, .src = 0, .dst = np - 1, .run = 16, .count = 1};
    MT_ASSERT(tide_reshard_execute(c, &a, NULL, NULL) == TIDE_ERR_INVALID, "bad tensor index");
    MT_ASSERT(strstr(tide_last_error(), "tensor 3") != NULL, "detail: %s", tide_last_error());
    items[0].tensor = 0;
    items[0].src = W + 5;
    MT_ASSERT(tide_reshard_execute(c, &a, NULL, NULL) == TIDE_ERR_INVALID, "bad worker");
    /* Only rank 0 lacks the buffer it must send from: it says why, the others learn that
       a peer failed; nobody hangs and nothing moves. */
    items[0].src = 0;
    if (me == 0)
        ob[0] = NULL;
    tide_status rc = tide_reshard_execute(c, &a, NULL, NULL);
    MT_ASSERT(rc == (me == 0  ? TIDE_ERR_INVALID
                     : np > 1 ? TIDE_ERR_PEER
                              : TIDE_ERR_INVALID),
              "missing buffer on rank 0 gives %s here", tide_status_name(rc));
    ob[me] = ob_row;
    /* Out of bounds when sizes are given. */
    uint64_t sz = 64, *szp = &sz;
    const uint64_t *sizes_row[64];
    for (int w = 0; w < W && w < 64; w++)
        sizes_row[w] = szp;
    a.old_bytes = sizes_row;
    a.new_bytes = sizes_row;
    items[0].src_off = 60;
    MT_ASSERT(tide_reshard_execute(c, &a, NULL, NULL) == (me == 0  ? TIDE_ERR_RANGE
                                                          : np > 1 ? TIDE_ERR_PEER
                                                                   : TIDE_ERR_RANGE),
              "region past the end");
    items[0].src_off = 0;
    /* A staging cap too small for the streams. */
    if (np > 1) {
        items[0].count = 4;
        items[0].src_stride = 16;
        items[0].dst_stride = 16;
        items[0].run = 1;
        tide_exec_opts o;
        tide_exec_opts_init(&o);
        o.staging_cap = 1; /* rank 0 and np-1 each have one stream: 1 byte per stream works */
        MT_OK(tide_reshard_execute(c, &a, &o, NULL));
        items[0].run = 16;
        items[0].count = 1;
    }
    /* Allocation failures in the setup: sticky failures from the k-th allocation on fail
       every rank before the agreement, and the communicator stays usable. */
    for (long k = 1; k <= 3; k++) {
        tide_alloc_fail_at(k, 1);
        rc = tide_reshard_execute(c, &a, NULL, NULL);
        tide_alloc_fail_at(0, 0);
        MT_ASSERT(rc == TIDE_ERR_NOMEM, "allocation %ld failing gives %s", k, tide_status_name(rc));
        MT_ASSERT(!tide_coll_comm_aborted(c), "setup failures leave the communicator alive");
    }
    if (np > 1) {
        if (me == 0)
            tide_alloc_fail_at(1, 1);
        rc = tide_reshard_execute(c, &a, NULL, NULL);
        tide_alloc_fail_at(0, 0);
        MT_ASSERT(rc == (me == 0 ? TIDE_ERR_NOMEM : TIDE_ERR_PEER), "one rank out of memory: %s",
                  tide_status_name(rc));
    }
    /* And then it works. */
    for (int i = 0; i < 64; i++)
        hold[i] = (unsigned char)(me * 3 + i);
    put(oldb, hold, 64);
    MT_OK(tide_reshard_execute(c, &a, NULL, NULL));
    if (me == np - 1) {
        get(hnew, newb, 64);
        for (int i = 0; i < 16; i++)
            MT_ASSERT(hnew[i] == (unsigned char)(0 * 3 + i), "moved byte %d", i);
    }
    be->mem_free(oldb);
    be->mem_free(newb);
    free(ob);
    free(nb);
    free(hold);
    free(hnew);
    tide_coll_comm_destroy(&c);
    mt_pass("executor_errors");
}

/* ---- executor: reshard planner plans --------------------------------------------------------- */

#ifdef TIDE_TEST_HAVE_RESHARD
static void random_layout(uint64_t *s, int max_workers, int layers, tide_layout_t **out)
{
    static const int choices[][3] = {{1, 1, 1}, {2, 1, 1}, {1, 2, 1}, {1, 1, 2}, {2, 2, 1},
                                     {2, 1, 2}, {1, 2, 2}, {4, 1, 1}, {1, 4, 1}, {1, 1, 4},
                                     {2, 2, 2}, {1, 4, 2}, {4, 2, 1}, {2, 4, 1}};
    for (;;) {
        const int *d = choices[rng_below(s, sizeof choices / sizeof choices[0])];
        if (d[0] * d[1] * d[2] > max_workers)
            continue;
        MT_OK(tide_layout_new(out, d[0], d[1], d[2], layers, 1));
        /* random placement over worker ids 0..max_workers-1 */
        int ids[64];
        for (int i = 0; i < max_workers; i++)
            ids[i] = i;
        for (int i = max_workers - 1; i > 0; i--) {
            int j = (int)rng_below(s, (uint64_t)i + 1), t = ids[i];
            ids[i] = ids[j];
            ids[j] = t;
        }
        for (size_t i = 0; i < tide_layout_size(*out); i++)
            (*out)->worker[i] = ids[i];
        return;
    }
}

static void shard_bufs(const tide_layout_t *l, const tide_collection_t *col, unsigned char **global,
                       const int *rank_of, int fill_from_global, void ***bufs, uint64_t **bytes)
{
    size_t T = tide_collection_size(col);
    for (int p = 0; p < l->pp; p++)
        for (int d = 0; d < l->dp; d++)
            for (int t = 0; t < l->tp; t++) {
                int w = l->worker[tide_layout_index(l, p, d, t)];
                if (rank_of[w] != me)
                    continue;
                for (size_t i = 0; i < T; i++) {
                    uint64_t b = tide_shard_bytes(l, col, i, p, d, t);
                    if (b == 0)
                        continue;
                    unsigned char *h = malloc(b);
                    if (fill_from_global)
                        tide_shard_extract(l, col, i, p, d, t, global[i], h);
                    else
                        memset(h, 0xEE, b);
                    bufs[w][i] = dalloc(b);
                    put(bufs[w][i], h, b);
                    bytes[w][i] = b;
                    free(h);
                }
            }
}

void test_executor_reshard(void)
{
    tide_coll_comm_t *c = world_comm();
    uint64_t s = seed ^ 0x5555;
    int max_workers = np * 2 < 8 ? np * 2 : 8;
    for (int iter = 0; iter < 6; iter++) {
        tide_model_spec spec = {.layers = 4,
                                .hidden = 8,
                                .ffn = 16,
                                .heads = 2,
                                .vocab = 16,
                                .attention = (int)rng_below(&s, 2),
                                .adam = 1,
                                .zero1 = (int)rng_below(&s, 2),
                                .dtype = TIDE_F32};
        tide_collection_t *col = NULL;
        MT_OK(tide_collection_build_gpt(&col, &spec));
        tide_layout_t *ol = NULL, *nl = NULL;
        random_layout(&s, max_workers, spec.layers, &ol);
        random_layout(&s, max_workers, spec.layers, &nl);
        tide_plan_t *plan = NULL;
        MT_OK(tide_reshard_plan(ol, nl, col, NULL, 0, &plan));
        size_t T = tide_collection_size(col);
        unsigned char **global = calloc(T, sizeof *global);
        for (size_t i = 0; i < T; i++) {
            uint64_t b = tide_tensor_bytes(tide_collection_tensor(col, i));
            global[i] = malloc(b);
            for (uint64_t k = 0; k < b; k++)
                global[i][k] = gbyte((int)i + iter * 1000, 0, (uint32_t)k);
        }
        int W = max_workers;
        int rank_of[64];
        for (int w = 0; w < W; w++)
            rank_of[w] = w % np;
        void ***ob = calloc((unsigned)W, sizeof *ob), ***nb = calloc((unsigned)W, sizeof *nb);
        uint64_t **os = calloc((unsigned)W, sizeof *os), **ns = calloc((unsigned)W, sizeof *ns);
        for (int w = 0; w < W; w++) {
            ob[w] = calloc(T, sizeof **ob);
            nb[w] = calloc(T, sizeof **nb);
            os[w] = calloc(T, sizeof **os);
            ns[w] = calloc(T, sizeof **ns);
        }
        shard_bufs(ol, col, global, rank_of, 1, ob, os);
        shard_bufs(nl, col, global, rank_of, 0, nb, ns);
        tide_exec_args a = {.plan = plan,
                            .n_workers = (size_t)W,
                            .n_tensors = T,
                            .rank_of_worker = rank_of,
                            .old_bufs = (void *const *const *)ob,
                            .new_bufs = (void *const *const *)nb,
                            .old_bytes = (const uint64_t *const *)os,
                            .new_bytes = (const uint64_t *const *)ns};
        tide_exec_opts o;
        tide_exec_opts_init(&o);
        o.staging_cap = 512 + rng_below(&s, 8192);
        o.max_chunk = 1 + rng_below(&s, 1024);
        o.pack_below = iter % 2 ? 1 + (uint64_t)iter * 100 : 0; /* in place and staged mixed */
        tide_exec_stats st;
        MT_OK(tide_reshard_execute(c, &a, &o, &st));
        exec_direct += st.bytes_direct;
        MT_ASSERT(st.peak_staging <= o.staging_cap, "staging %llu > cap",
                  (unsigned long long)st.peak_staging);
        /* The new shards are exactly the new layout's shards of the original state. */
        for (int p = 0; p < nl->pp; p++)
            for (int d = 0; d < nl->dp; d++)
                for (int t = 0; t < nl->tp; t++) {
                    int w = nl->worker[tide_layout_index(nl, p, d, t)];
                    if (rank_of[w] != me)
                        continue;
                    for (size_t i = 0; i < T; i++) {
                        uint64_t b = ns[w][i];
                        if (b == 0)
                            continue;
                        unsigned char *want = malloc(b), *got = malloc(b);
                        tide_shard_extract(nl, col, i, p, d, t, global[i], want);
                        get(got, nb[w][i], b);
                        MT_ASSERT(memcmp(want, got, b) == 0, "iter %d tensor %s worker %d", iter,
                                  tide_collection_tensor(col, i)->name, w);
                        free(want);
                        free(got);
                    }
                }
        uint64_t sent = st.bytes_sent, all = 0;
        MPI_Allreduce(&sent, &all, 1, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD);
        MT_ASSERT(all == plan->summary.bytes_sent, "bytes sent %llu, plan says %llu",
                  (unsigned long long)all, (unsigned long long)plan->summary.bytes_sent);
        for (int w = 0; w < W; w++) {
            for (size_t i = 0; i < T; i++) {
                if (ob[w][i])
                    be->mem_free(ob[w][i]);
                if (nb[w][i])
                    be->mem_free(nb[w][i]);
            }
            free(ob[w]);
            free(nb[w]);
            free(os[w]);
            free(ns[w]);
        }
        free(ob);
        free(nb);
        free(os);
        free(ns);
        for (size_t i = 0; i < T; i++)
            free(global[i]);
        free(global);
        tide_plan_destroy(&plan);
        tide_layout_destroy(&ol);
        tide_layout_destroy(&nl);
        tide_collection_destroy(&col);
    }
    tide_coll_comm_destroy(&c);
    mt_pass("executor_reshard_plans");
}
#endif

/* The executor's plans again with every message eligible for single copy
   (TIDE_COLL_CMA_MIN=1): the same bit-identical checks, now through the direct path
   wherever one end of a message is strided and the other not; and with TIDE_COLL_CMA=0
   nothing goes that way. */
void test_executor_direct(void)
{
    if (strcmp(be->name, "mpi") != 0 || np < 2)
        return;
    cma_env("TIDE_COLL_CMA_MIN", "1");
    tide_coll_comm_t *c = world_comm();
    int any = check_agreement(c, 0);
    tide_coll_comm_destroy(&c);
    exec_direct = 0;
    test_executor_random();
#ifdef TIDE_TEST_HAVE_RESHARD
    test_executor_reshard();
#endif
    uint64_t all = 0;
    MPI_Allreduce(&exec_direct, &all, 1, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD);
    uint64_t used = all;
    if (any)
        MT_ASSERT(all > 0, "single copy agreed but never used by the executor's plans");
    else if (me == 0)
        printf("NOTE: no single-copy peers here; executor results checked only\n");
    cma_env("TIDE_COLL_CMA", "0");
    exec_direct = 0;
    test_executor_random();
    MPI_Allreduce(&exec_direct, &all, 1, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD);
    MT_ASSERT(all == 0, "single copy used with TIDE_COLL_CMA=0");
    cma_env("TIDE_COLL_CMA", NULL);
    cma_env("TIDE_COLL_CMA_MIN", NULL);
    if (me == 0)
        printf("executor_direct: passed (%llu bytes of the executor's plans by single copy)\n",
               (unsigned long long)used);
}
