/*
 * The fixture of the reshard unit tests (test_reshard.c, test_reshard_hand.c,
 * test_reshard_layout.c, test_reshard_alloc.c: one executable, test_reshard): a seeded
 * generator, tensor descriptions, layouts and collections made in one call, shard buffers
 * and their simulation, a plan's byte-level comparison against the global tensors, and a
 * plan planned, validated and simulated (checked_plan). Header-only, like ctl_fixture.h:
 * Criterion runs each test in its own process.
 */
#ifndef TIDE_TESTS_RESHARD_FIXTURE_H
#define TIDE_TESTS_RESHARD_FIXTURE_H

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "reshard/reshard.h"
#include "tests/support/plan_check.h"

static inline uint64_t splitmix(uint64_t *s)
{
    uint64_t z = (*s += UINT64_C(0x9e3779b97f4a7c15));
    z = (z ^ (z >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94d049bb133111eb);
    return z ^ (z >> 31);
}
static inline tide_tensor_desc mk(const char *name, tide_dtype dt, int ndim, int64_t d0, int64_t d1,
                                  int layer, tide_tp_rule tp, int tp_dim, int segs, tide_dp_rule dp)
{
    tide_tensor_desc t;
    memset(&t, 0, sizeof t);
    snprintf(t.name, sizeof t.name, "%s", name);
    t.dtype = dt;
    t.ndim = ndim;
    t.shape[0] = d0;
    t.shape[1] = d1;
    t.layer = layer;
    t.tp = tp;
    t.tp_dim = tp_dim;
    t.tp_segments = segs;
    t.dp = dp;
    return t;
}

static inline tide_layout_t *layout(int dp, int tp, int pp, int layers)
{
    tide_layout_t *l = NULL;
    cr_assert_eq(tide_layout_new(&l, dp, tp, pp, layers, 1), TIDE_OK, "%s", tide_last_error());
    return l;
}

static inline int max_worker(const tide_layout_t *a, const tide_layout_t *b)
{
    int m = -1;
    for (size_t i = 0; i < tide_layout_size(a); i++)
        m = a->worker[i] > m ? a->worker[i] : m;
    for (size_t i = 0; i < tide_layout_size(b); i++)
        m = b->worker[i] > m ? b->worker[i] : m;
    return m;
}

/* Global tensors filled with distinct-looking bytes. */
static inline unsigned char **make_globals(const tide_collection_t *c, uint64_t *seed)
{
    size_t n = tide_collection_size(c);
    unsigned char **g = calloc(n, sizeof *g);
    for (size_t i = 0; i < n; i++) {
        uint64_t b = tide_tensor_bytes(tide_collection_tensor(c, i));
        g[i] = malloc(b);
        for (uint64_t k = 0; k < b; k++)
            g[i][k] = (unsigned char)(splitmix(seed) >> 56);
    }
    return g;
}

static inline void free_globals(const tide_collection_t *c, unsigned char **g)
{
    for (size_t i = 0; i < tide_collection_size(c); i++)
        free(g[i]);
    free(g);
}

/* Per-worker buffers for layout l: bufs[w][i] (NULL where not held), filled with fill byte. */
static inline void ***make_bufs(const tide_layout_t *l, const tide_collection_t *c, int nw,
                                int fill)
{
    size_t nt = tide_collection_size(c);
    void ***b = calloc((size_t)nw, sizeof *b);
    for (int w = 0; w < nw; w++)
        b[w] = calloc(nt, sizeof *b[w]);
    for (size_t j = 0; j < tide_layout_size(l); j++) {
        int p = (int)(j / ((size_t)l->dp * l->tp)), d = (int)(j / l->tp % l->dp),
            t = (int)(j % l->tp);
        int32_t w = l->worker[j];
        for (size_t i = 0; i < nt; i++) {
            uint64_t sz = tide_shard_bytes(l, c, i, p, d, t);
            if (sz == 0)
                continue;
            b[w][i] = malloc(sz);
            memset(b[w][i], fill, sz);
        }
    }
    return b;
}

static inline void free_bufs(void ***b, const tide_collection_t *c, int nw)
{
    for (int w = 0; w < nw; w++) {
        for (size_t i = 0; i < tide_collection_size(c); i++)
            free(b[w][i]);
        free(b[w]);
    }
    free(b);
}

static inline void coord(const tide_layout_t *l, size_t j, int *p, int *d, int *t)
{
    *t = (int)(j % (size_t)l->tp);
    *d = (int)(j / (size_t)l->tp % (size_t)l->dp);
    *p = (int)(j / ((size_t)l->tp * l->dp));
}

/* Fills every old buffer from the globals (dead workers get garbage), simulates, and checks
 * that every new buffer equals the new layout's shard of the globals. Returns 1 when equal. */
static inline int simulate_and_compare(const tide_layout_t *o, const tide_layout_t *n,
                                       const tide_collection_t *c, const uint8_t *alive,
                                       size_t n_alive, const tide_plan_t *plan, uint64_t *seed,
                                       char *why, size_t wlen)
{
    int nw = max_worker(o, n) + 1;
    unsigned char **g = make_globals(c, seed);
    void ***ob = make_bufs(o, c, nw, 0xEE), ***nb = make_bufs(n, c, nw, 0xCD);
    size_t nt = tide_collection_size(c);
    for (size_t j = 0; j < tide_layout_size(o); j++) {
        int p, d, t;
        coord(o, j, &p, &d, &t);
        int32_t w = o->worker[j];
        int live = alive == NULL || ((size_t)w < n_alive && alive[w]);
        for (size_t i = 0; i < nt && live; i++)
            if (ob[w][i] != NULL)
                tide_shard_extract(o, c, i, p, d, t, g[i], ob[w][i]);
    }
    tide_plan_simulate(plan, (void *const *const *)ob, (void *const *const *)nb);
    int ok = 1;
    for (size_t j = 0; j < tide_layout_size(n) && ok; j++) {
        int p, d, t;
        coord(n, j, &p, &d, &t);
        int32_t w = n->worker[j];
        for (size_t i = 0; i < nt && ok; i++) {
            uint64_t sz = tide_shard_bytes(n, c, i, p, d, t);
            if (sz == 0)
                continue;
            unsigned char *want = malloc(sz);
            tide_shard_extract(n, c, i, p, d, t, g[i], want);
            if (memcmp(want, nb[w][i], sz) != 0) {
                ok = 0;
                snprintf(why, wlen, "worker %d's new %s differs", (int)w,
                         tide_collection_tensor(c, i)->name);
            }
            free(want);
        }
    }
    /* The gathered state is the original: insert every new shard into fresh globals. */
    for (size_t i = 0; i < nt && ok; i++) {
        uint64_t b = tide_tensor_bytes(tide_collection_tensor(c, i));
        unsigned char *back = calloc(1, b), *seen = calloc(1, b);
        unsigned char *ones = malloc(b);
        memset(ones, 1, b);
        for (size_t j = 0; j < tide_layout_size(n); j++) {
            int p, d, t;
            coord(n, j, &p, &d, &t);
            if (nb[n->worker[j]][i] == NULL)
                continue;
            tide_shard_insert(n, c, i, p, d, t, nb[n->worker[j]][i], back);
            tide_shard_insert(n, c, i, p, d, t, ones, seen);
        }
        for (uint64_t k = 0; k < b && ok; k++)
            if (!seen[k] || back[k] != g[i][k]) {
                ok = 0;
                snprintf(why, wlen, "gathered %s differs at byte %llu",
                         tide_collection_tensor(c, i)->name, (unsigned long long)k);
            }
        free(back);
        free(seen);
        free(ones);
    }
    free_bufs(ob, c, nw);
    free_bufs(nb, c, nw);
    free_globals(c, g);
    return ok;
}

/* Plans, validates, simulates and returns the plan; the caller destroys it. */
static inline tide_plan_t *checked_plan(const tide_layout_t *o, const tide_layout_t *n,
                                        const tide_collection_t *c, const uint8_t *alive,
                                        size_t n_alive)
{
    tide_plan_t *p = NULL;
    cr_assert_eq(tide_reshard_plan(o, n, c, alive, n_alive, &p), TIDE_OK, "%s", tide_last_error());
    cr_assert_eq(tide_plan_validate(o, n, c, alive, n_alive, p), TIDE_OK, "%s", tide_last_error());
    uint64_t seed = 7;
    char why[256] = "";
    cr_assert(simulate_and_compare(o, n, c, alive, n_alive, p, &seed, why, sizeof why), "%s", why);
    uint64_t lb;
    cr_assert_eq(tide_reshard_lower_bound(o, n, c, &lb), TIDE_OK);
    cr_assert_eq(p->summary.bytes_sent, lb);
    return p;
}
static inline tide_collection_t *coll(int layers, const tide_tensor_desc *t, int n)
{
    tide_collection_t *c = NULL;
    cr_assert_eq(tide_collection_new(&c, layers), TIDE_OK);
    for (int k = 0; k < n; k++)
        cr_assert_eq(tide_collection_add(c, &t[k]), TIDE_OK, "%s", tide_last_error());
    return c;
}

#endif /* TIDE_TESTS_RESHARD_FIXTURE_H */
