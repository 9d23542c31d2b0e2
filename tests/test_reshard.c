/*
 * Unit tests for reshard/: collections, layouts and their validation
 * messages, shard geometry, and reshard plans. Plans are checked by property
 * tests over thousands of random (collection, old layout, new layout, worker
 * map, live set) cases against a brute-force byte-level oracle built only
 * from tide_shard_extract/insert, and by hand-checked cases. A failing random
 * case prints its seed; rerun with TIDE_TEST_SEED=<base seed> to reproduce.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "reshard/reshard.h"
#include "tests/support/plan_check.h"

/* ---- helpers -------------------------------------------------------------------------- */

static uint64_t splitmix(uint64_t *s)
{
    uint64_t z = (*s += UINT64_C(0x9e3779b97f4a7c15));
    z = (z ^ (z >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94d049bb133111eb);
    return z ^ (z >> 31);
}

static int rnd(uint64_t *s, int n)
{
    return (int)(splitmix(s) % (uint64_t)n);
}

static tide_tensor_desc mk(const char *name, tide_dtype dt, int ndim, int64_t d0, int64_t d1,
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

static tide_layout_t *layout(int dp, int tp, int pp, int layers)
{
    tide_layout_t *l = NULL;
    cr_assert_eq(tide_layout_new(&l, dp, tp, pp, layers, 1), TIDE_OK, "%s", tide_last_error());
    return l;
}

static int max_worker(const tide_layout_t *a, const tide_layout_t *b)
{
    int m = -1;
    for (size_t i = 0; i < tide_layout_size(a); i++)
        m = a->worker[i] > m ? a->worker[i] : m;
    for (size_t i = 0; i < tide_layout_size(b); i++)
        m = b->worker[i] > m ? b->worker[i] : m;
    return m;
}

/* Global tensors filled with distinct-looking bytes. */
static unsigned char **make_globals(const tide_collection_t *c, uint64_t *seed)
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

static void free_globals(const tide_collection_t *c, unsigned char **g)
{
    for (size_t i = 0; i < tide_collection_size(c); i++)
        free(g[i]);
    free(g);
}

/* Per-worker buffers for layout l: bufs[w][i] (NULL where not held), filled with fill byte. */
static void ***make_bufs(const tide_layout_t *l, const tide_collection_t *c, int nw, int fill)
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

static void free_bufs(void ***b, const tide_collection_t *c, int nw)
{
    for (int w = 0; w < nw; w++) {
        for (size_t i = 0; i < tide_collection_size(c); i++)
            free(b[w][i]);
        free(b[w]);
    }
    free(b);
}

static void coord(const tide_layout_t *l, size_t j, int *p, int *d, int *t)
{
    *t = (int)(j % (size_t)l->tp);
    *d = (int)(j / (size_t)l->tp % (size_t)l->dp);
    *p = (int)(j / ((size_t)l->tp * l->dp));
}

/* Fills every old buffer from the globals (dead workers get garbage), simulates, and checks
 * that every new buffer equals the new layout's shard of the globals. Returns 1 when equal. */
static int simulate_and_compare(const tide_layout_t *o, const tide_layout_t *n,
                                const tide_collection_t *c, const uint8_t *alive, size_t n_alive,
                                const tide_plan_t *plan, uint64_t *seed, char *why, size_t wlen)
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

/* ---- oracle: holder sets byte by byte ------------------------------------------------------- */

typedef struct oracle {
    uint64_t needed; /* bytes destinations need and do not hold */
    int missing;     /* some byte has no live holder */
    char missing_name[TIDE_NAME_MAX];
    double opt; /* exact min over sender choices of the largest send (fractional) */
    int have_opt;
} oracle;

/* Marks (0/1) of the global bytes that coordinate (p, d, t) of l holds. */
static unsigned char *held_marks(const tide_layout_t *l, const tide_collection_t *c, size_t i,
                                 int p, int d, int t)
{
    uint64_t b = tide_tensor_bytes(tide_collection_tensor(c, i));
    unsigned char *m = calloc(1, b ? b : 1);
    uint64_t sz = tide_shard_bytes(l, c, i, p, d, t);
    if (sz > 0) {
        unsigned char *ones = malloc(sz);
        memset(ones, 1, sz);
        tide_shard_insert(l, c, i, p, d, t, ones, m);
        free(ones);
    }
    return m;
}

static void run_oracle(const tide_layout_t *o, const tide_layout_t *n, const tide_collection_t *c,
                       const uint8_t *alive, size_t n_alive, oracle *out)
{
    memset(out, 0, sizeof *out);
    size_t no = tide_layout_size(o), nn = tide_layout_size(n), nt = tide_collection_size(c);
    /* Bit k: the k-th live old coordinate. */
    int bit_of[64], nb = 0;
    for (size_t j = 0; j < no; j++) {
        int32_t w = o->worker[j];
        bit_of[j] = (alive == NULL || ((size_t)w < n_alive && alive[w])) ? nb++ : -1;
    }
    uint64_t *vol = NULL;
    int do_opt = nb <= 14;
    if (do_opt)
        vol = calloc((size_t)1 << nb, sizeof *vol);
    for (size_t i = 0; i < nt; i++) {
        uint64_t b = tide_tensor_bytes(tide_collection_tensor(c, i));
        uint32_t *mask = calloc(b, sizeof *mask);
        uint8_t *any = calloc(b, 1);
        unsigned char *om[64];
        for (size_t j = 0; j < no; j++) {
            int p, d, t;
            coord(o, j, &p, &d, &t);
            om[j] = held_marks(o, c, i, p, d, t);
            for (uint64_t k = 0; k < b; k++)
                if (om[j][k] && bit_of[j] >= 0) {
                    mask[k] |= 1u << bit_of[j];
                    any[k] = 1;
                }
        }
        for (uint64_t k = 0; k < b; k++)
            if (!any[k] && !out->missing) {
                out->missing = 1;
                snprintf(out->missing_name, sizeof out->missing_name, "%s",
                         tide_collection_tensor(c, i)->name);
            }
        for (size_t j = 0; j < nn; j++) {
            int p, d, t;
            coord(n, j, &p, &d, &t);
            unsigned char *need = held_marks(n, c, i, p, d, t);
            /* The destination's own old holdings. */
            long oj = -1;
            for (size_t q = 0; q < no; q++)
                if (o->worker[q] == n->worker[j])
                    oj = (long)q;
            const unsigned char *own = oj >= 0 ? om[oj] : NULL;
            for (uint64_t k = 0; k < b; k++) {
                if (!need[k] || (own != NULL && own[k]))
                    continue;
                out->needed++;
                if (do_opt)
                    vol[mask[k]]++;
            }
            free(need);
        }
        for (size_t j = 0; j < no; j++)
            free(om[j]);
        free(mask);
        free(any);
    }
    if (do_opt && !out->missing) {
        /* f[X] = bytes whose live holders all lie in X; opt = max f[X] / |X|. */
        size_t nsub = (size_t)1 << nb;
        for (int k = 0; k < nb; k++)
            for (size_t x = 0; x < nsub; x++)
                if (x & ((size_t)1 << k))
                    vol[x] += vol[x ^ ((size_t)1 << k)];
        for (size_t x = 1; x < nsub; x++) {
            double r = (double)vol[x] / (double)__builtin_popcountll(x);
            if (r > out->opt)
                out->opt = r;
        }
        out->have_opt = 1;
    }
    free(vol);
}

/* Recomputes the summary's counters from the items. */
static void recount(const tide_plan_t *p, tide_plan_summary *s, int nw)
{
    memset(s, 0, sizeof *s);
    uint64_t *snd = calloc((size_t)nw, sizeof *snd), *rcv = calloc((size_t)nw, sizeof *rcv);
    for (size_t k = 0; k < p->n; k++) {
        const tide_xfer *x = &p->items[k];
        uint64_t b = x->run * x->count;
        if (x->src == x->dst) {
            s->bytes_local += b;
            s->n_copies++;
            continue;
        }
        s->bytes_sent += b;
        s->n_xfers++;
        snd[x->src] += b;
        rcv[x->dst] += b;
        if (k == 0 || p->items[k - 1].src != x->src || p->items[k - 1].dst != x->dst)
            s->messages++;
    }
    for (int w = 0; w < nw; w++) {
        s->max_send = snd[w] > s->max_send ? snd[w] : s->max_send;
        s->max_recv = rcv[w] > s->max_recv ? rcv[w] : s->max_recv;
    }
    free(snd);
    free(rcv);
}

/* ---- random cases --------------------------------------------------------------------------- */

typedef struct rcase {
    tide_collection_t *c;
    tide_layout_t *o, *n;
    uint8_t *alive;
    size_t n_alive;
    int zero; /* some tensor is DP-sharded */
} rcase;

static void random_stages(tide_layout_t *l, uint64_t *s)
{
    int L = l->num_layers, pp = l->pp;
    int *starts = calloc((size_t)pp + 1, sizeof *starts);
    /* pp - 1 distinct cut points in 1..L-1. */
    int *cut = calloc((size_t)L, sizeof *cut);
    for (int k = 0; k < pp - 1;) {
        int x = 1 + rnd(s, L - 1);
        if (!cut[x]) {
            cut[x] = 1;
            k++;
        }
    }
    int at = 1;
    for (int x = 1; x < L; x++)
        if (cut[x])
            starts[at++] = x;
    starts[pp] = L;
    cr_assert_eq(tide_layout_set_stages(l, starts), TIDE_OK, "%s", tide_last_error());
    free(starts);
    free(cut);
}

static void shuffle(int32_t *a, int n, uint64_t *s)
{
    for (int k = n - 1; k > 0; k--) {
        int j = rnd(s, k + 1);
        int32_t t = a[k];
        a[k] = a[j];
        a[j] = t;
    }
}

static tide_layout_t *random_layout(int L, int max_workers, uint64_t *s)
{
    static const int tps[] = {1, 2, 3, 4, 6};
    int dp, tp, pp;
    do {
        dp = 1 + rnd(s, 4);
        tp = tps[rnd(s, 5)];
        pp = 1 + rnd(s, L < 3 ? L : 3);
    } while (dp * tp * pp > max_workers);
    tide_layout_t *l = layout(dp, tp, pp, L);
    if (rnd(s, 2))
        random_stages(l, s);
    return l;
}

static void random_case(uint64_t seed, rcase *rc)
{
    uint64_t s = seed;
    memset(rc, 0, sizeof *rc);
    int L = 1 + rnd(&s, 5);
    int allow_zero = rnd(&s, 5) < 3;
    cr_assert_eq(tide_collection_new(&rc->c, L), TIDE_OK);
    int nt = 1 + rnd(&s, 6);
    for (int k = 0; k < nt; k++) {
        char name[32];
        snprintf(name, sizeof name, "t%d", k);
        tide_tensor_desc t;
        memset(&t, 0, sizeof t);
        snprintf(t.name, sizeof t.name, "%s", name);
        t.dtype = (tide_dtype)rnd(&s, 7);
        t.ndim = 1 + rnd(&s, 3);
        int lr = rnd(&s, L + 3);
        t.layer = lr < L ? lr
                         : (lr == L       ? TIDE_LAYER_PRE
                            : lr == L + 1 ? TIDE_LAYER_POST
                                          : TIDE_LAYER_ALL);
        int split = rnd(&s, 10) < 7;
        t.tp = split ? TIDE_TP_SPLIT : TIDE_TP_REPLICATED;
        t.tp_segments = split ? 1 + rnd(&s, 3) : 1;
        t.tp_dim = rnd(&s, t.ndim);
        for (int d = 0; d < t.ndim; d++)
            t.shape[d] = 1 + rnd(&s, 4);
        if (split)
            t.shape[t.tp_dim] = (int64_t)t.tp_segments * 12 * (1 + rnd(&s, 2));
        t.dp = allow_zero && rnd(&s, 10) < 5 ? TIDE_DP_SHARDED : TIDE_DP_REPLICATED;
        rc->zero |= t.dp == TIDE_DP_SHARDED;
        cr_assert_eq(tide_collection_add(rc->c, &t), TIDE_OK, "%s", tide_last_error());
    }
    rc->o = random_layout(L, 12, &s);
    rc->n = random_layout(L, 12, &s);
    size_t no = tide_layout_size(rc->o), nn = tide_layout_size(rc->n);
    int pool = (int)(no > nn ? no : nn) + rnd(&s, 5);
    int32_t *ids = calloc((size_t)pool, sizeof *ids);
    for (int k = 0; k < pool; k++)
        ids[k] = k;
    int kind = rnd(&s, 4); /* 0: default maps; else random maps over a shared pool */
    if (kind != 0) {
        shuffle(ids, pool, &s);
        memcpy(rc->o->worker, ids, no * sizeof *ids);
        if (rnd(&s, 3) != 0)
            shuffle(ids, pool, &s);
        memcpy(rc->n->worker, ids, nn * sizeof *ids);
    }
    free(ids);
    int amode = rnd(&s, 3);
    if (amode > 0) {
        rc->n_alive = (size_t)pool;
        rc->alive = malloc(rc->n_alive);
        memset(rc->alive, 1, rc->n_alive);
        if (amode == 2) /* kill old-only workers at random */
            for (size_t j = 0; j < no; j++) {
                int32_t w = rc->o->worker[j];
                int in_new = 0;
                for (size_t q = 0; q < nn; q++)
                    in_new |= rc->n->worker[q] == w;
                if (!in_new && rnd(&s, 10) < 5)
                    rc->alive[w] = 0;
            }
    }
}

static void free_case(rcase *rc)
{
    tide_collection_destroy(&rc->c);
    tide_layout_destroy(&rc->o);
    tide_layout_destroy(&rc->n);
    free(rc->alive);
}

static uint64_t base_seed(void)
{
    const char *e = getenv("TIDE_TEST_SEED");
    return e ? strtoull(e, NULL, 0) : UINT64_C(20240601);
}

typedef struct stats {
    double worst_zero_ratio; /* max_send / ceil(opt) over ZeRO cases */
    int cases, no_holder, checked_opt;
} stats;

/* Streams of worker w in the full plan: distinct (src, dst) pairs with bytes, src != dst,
 * that w is part of. */
static uint32_t streams_in_plan(const tide_plan_t *plan, int32_t w)
{
    uint32_t n = 0;
    for (size_t k = 0; k < plan->n; k++) {
        const tide_xfer *x = &plan->items[k];
        if (x->src == x->dst || x->run * x->count == 0 || (x->src != w && x->dst != w))
            continue;
        int seen = 0; /* items are sorted by (src, dst): an earlier item of the pair is adjacent */
        for (size_t j = k; j-- > 0 && plan->items[j].src == x->src && plan->items[j].dst == x->dst;)
            if (plan->items[j].run * plan->items[j].count > 0)
                seen = 1;
        n += !seen;
    }
    return n;
}

/* plan_for's per-worker stream counts (what the executor sizes chunks from) equal the
 * full plan's, for every worker it lists, and it lists every worker of the plan. */
static void check_stream_counts(const tide_plan_t *plan, const tide_plan_t *pf, uint64_t seed)
{
    cr_assert(pf->stream_count != NULL && pf->stream_worker != NULL,
              "seed %llu: plan_for carries no stream counts", (unsigned long long)seed);
    for (size_t k = 0; k < pf->n_stream; k++) {
        int32_t w = pf->stream_worker[k];
        cr_assert(k == 0 || pf->stream_worker[k - 1] < w, "seed %llu: stream workers unsorted",
                  (unsigned long long)seed);
        uint32_t want = streams_in_plan(plan, w);
        cr_assert_eq(pf->stream_count[k], want, "seed %llu: worker %d has %u streams, plan %u",
                     (unsigned long long)seed, (int)w, pf->stream_count[k], want);
    }
    for (size_t k = 0; k < plan->n; k++) {
        const tide_xfer *x = &plan->items[k];
        int found_s = 0, found_d = 0;
        for (size_t j = 0; j < pf->n_stream; j++) {
            found_s |= pf->stream_worker[j] == x->src;
            found_d |= pf->stream_worker[j] == x->dst;
        }
        cr_assert(found_s && found_d, "seed %llu: worker of item %zu not in the stream list",
                  (unsigned long long)seed, k);
    }
}

/* Bytes of the plan's items whose ends are on different known hosts (host_of[w], w < n;
 * -1 unknown): what tide_reshard_plan_totals_hosts must count without the items. */
static uint64_t items_cross_host(const tide_plan_t *plan, const int32_t *host_of, size_t n)
{
    uint64_t bytes = 0;
    for (size_t k = 0; k < plan->n; k++) {
        const tide_xfer *x = &plan->items[k];
        if (x->src == x->dst || (size_t)x->src >= n || (size_t)x->dst >= n)
            continue;
        if (host_of[x->src] >= 0 && host_of[x->dst] >= 0 && host_of[x->src] != host_of[x->dst])
            bytes += x->run * x->count;
    }
    return bytes;
}

/* Cross-host bytes from the totals walk against the items, for a few host maps: hosts of
 * `per` consecutive worker ids, random hosts, and some workers with no known host. */
static void check_cross_host(const tide_layout_t *o, const tide_layout_t *n,
                             const tide_collection_t *c, const uint8_t *alive, size_t n_alive,
                             const tide_plan_t *plan, uint64_t *rng, const char *what)
{
    size_t nw = (size_t)max_worker(o, n) + 1;
    int32_t *host = calloc(nw, sizeof *host);
    cr_assert(host != NULL);
    for (int map = 0; map < 3; map++) {
        int per = 1 + (int)(splitmix(rng) % 8);
        for (size_t w = 0; w < nw; w++)
            host[w] = map == 0   ? (int32_t)(w / (size_t)per)
                      : map == 1 ? (int32_t)(splitmix(rng) % 4)
                                 : (splitmix(rng) % 5 == 0 ? -1 : (int32_t)(w / (size_t)per));
        /* map 2 also leaves the last worker off the map (n_host below nw) */
        size_t n_host = map == 2 ? nw - 1 : nw;
        tide_plan_totals t;
        cr_assert_eq(tide_reshard_plan_totals_hosts(o, n, c, alive, n_alive, host, n_host, &t),
                     TIDE_OK, "%s: %s", what, tide_last_error());
        uint64_t want = items_cross_host(plan, host, n_host);
        cr_assert_eq(t.cross_host, want,
                     "%s, host map %d: totals say %llu bytes cross hosts, "
                     "the plan's items %llu",
                     what, map, (unsigned long long)t.cross_host, (unsigned long long)want);
        cr_assert_eq(t.bytes_sent, plan->summary.bytes_sent, "%s", what);
    }
    free(host);
}

static void check_case(uint64_t seed, stats *st)
{
    rcase rc;
    random_case(seed, &rc);
    char lo[160], ln[160];
    tide_layout_format(rc.o, lo, sizeof lo);
    tide_layout_format(rc.n, ln, sizeof ln);
    oracle orc;
    run_oracle(rc.o, rc.n, rc.c, rc.alive, rc.n_alive, &orc);
    tide_plan_t *plan = NULL;
    tide_status r = tide_reshard_plan(rc.o, rc.n, rc.c, rc.alive, rc.n_alive, &plan);
    st->cases++;
    if (orc.missing) {
        cr_assert_eq(r, TIDE_ERR_NO_HOLDER, "seed %llu (%s -> %s): expected NO_HOLDER, got %s",
                     (unsigned long long)seed, lo, ln, tide_status_name(r));
        cr_assert(strstr(tide_last_error(), "no live worker holds") != NULL, "seed %llu: %s",
                  (unsigned long long)seed, tide_last_error());
        cr_assert_null(plan);
        char detail[512];
        snprintf(detail, sizeof detail, "%s", tide_last_error());
        tide_plan_totals tt;
        cr_assert_eq(tide_reshard_plan_totals(rc.o, rc.n, rc.c, rc.alive, rc.n_alive, &tt),
                     TIDE_ERR_NO_HOLDER, "seed %llu: totals must fail like the plan",
                     (unsigned long long)seed);
        cr_assert_str_eq(tide_last_error(), detail, "seed %llu", (unsigned long long)seed);
        st->no_holder++;
        free_case(&rc);
        return;
    }
    cr_assert_eq(r, TIDE_OK, "seed %llu (%s -> %s): %s", (unsigned long long)seed, lo, ln,
                 tide_last_error());
    cr_assert_eq(tide_plan_validate(rc.o, rc.n, rc.c, rc.alive, rc.n_alive, plan), TIDE_OK,
                 "seed %llu (%s -> %s): validate: %s", (unsigned long long)seed, lo, ln,
                 tide_last_error());
    char why[256] = "";
    cr_assert(
        simulate_and_compare(rc.o, rc.n, rc.c, rc.alive, rc.n_alive, plan, &seed, why, sizeof why),
        "seed %llu (%s -> %s): %s", (unsigned long long)seed, lo, ln, why);
    /* Bytes sent equal the exact lower bound, three ways. */
    uint64_t lb = 0;
    cr_assert_eq(tide_reshard_lower_bound(rc.o, rc.n, rc.c, &lb), TIDE_OK);
    cr_assert_eq(plan->summary.bytes_sent, orc.needed, "seed %llu: sent %llu, oracle %llu",
                 (unsigned long long)seed, (unsigned long long)plan->summary.bytes_sent,
                 (unsigned long long)orc.needed);
    cr_assert_eq(lb, orc.needed, "seed %llu", (unsigned long long)seed);
    cr_assert_eq(plan->summary.lower_bound, orc.needed, "seed %llu", (unsigned long long)seed);
    /* The summary matches the items. */
    int nw = max_worker(rc.o, rc.n) + 1;
    tide_plan_summary s;
    recount(plan, &s, nw);
    const tide_plan_summary *ps = &plan->summary;
    cr_assert(s.bytes_sent == ps->bytes_sent && s.bytes_local == ps->bytes_local &&
                  s.max_send == ps->max_send && s.max_recv == ps->max_recv &&
                  s.messages == ps->messages && s.n_xfers == ps->n_xfers &&
                  s.n_copies == ps->n_copies && ps->n_xfers + ps->n_copies == plan->n,
              "seed %llu: summary does not match the items", (unsigned long long)seed);
    /* The totals-only path agrees with the full plan, field by field. */
    tide_plan_totals tt;
    cr_assert_eq(tide_reshard_plan_totals(rc.o, rc.n, rc.c, rc.alive, rc.n_alive, &tt), TIDE_OK,
                 "seed %llu: %s", (unsigned long long)seed, tide_last_error());
    cr_assert(tt.bytes_sent == ps->bytes_sent && tt.bytes_local == ps->bytes_local &&
                  tt.lower_bound == ps->lower_bound && tt.max_send == ps->max_send &&
                  tt.max_recv == ps->max_recv && tt.balanced_bound == ps->balanced_bound &&
                  tt.messages == ps->messages,
              "seed %llu (%s -> %s): totals (sent %llu local %llu max send %llu max recv %llu "
              "bound %llu messages %llu) differ from the plan's summary (%llu %llu %llu %llu "
              "%llu %llu)",
              (unsigned long long)seed, lo, ln, (unsigned long long)tt.bytes_sent,
              (unsigned long long)tt.bytes_local, (unsigned long long)tt.max_send,
              (unsigned long long)tt.max_recv, (unsigned long long)tt.balanced_bound,
              (unsigned long long)tt.messages, (unsigned long long)ps->bytes_sent,
              (unsigned long long)ps->bytes_local, (unsigned long long)ps->max_send,
              (unsigned long long)ps->max_recv, (unsigned long long)ps->balanced_bound,
              (unsigned long long)ps->messages);
    cr_assert_eq(tt.cross_host, 0, "seed %llu: no host map, no cross-host bytes",
                 (unsigned long long)seed);
    {
        char what[64];
        snprintf(what, sizeof what, "seed %llu", (unsigned long long)seed);
        uint64_t hs = seed;
        check_cross_host(rc.o, rc.n, rc.c, rc.alive, rc.n_alive, plan, &hs, what);
    }
    /* Balance: the bound is a true lower bound, and the plan meets it on DP-replicated state. */
    if (orc.have_opt) {
        st->checked_opt++;
        uint64_t copt = (uint64_t)(orc.opt + 0.999999);
        cr_assert(ps->balanced_bound <= copt, "seed %llu: balanced bound %llu above optimum %.2f",
                  (unsigned long long)seed, (unsigned long long)ps->balanced_bound, orc.opt);
        cr_assert((double)ps->max_send + 1e-9 >= orc.opt, "seed %llu", (unsigned long long)seed);
        if (!rc.zero)
            cr_assert((double)ps->max_send <= 1.05 * (double)ps->balanced_bound,
                      "seed %llu (%s -> %s): max send %llu > 1.05 x balanced bound %llu "
                      "(optimum %.2f)",
                      (unsigned long long)seed, lo, ln, (unsigned long long)ps->max_send,
                      (unsigned long long)ps->balanced_bound, orc.opt);
        else if (copt > 0) {
            double q = (double)ps->max_send / (double)copt;
            st->worst_zero_ratio = q > st->worst_zero_ratio ? q : st->worst_zero_ratio;
        }
    }
    /* plan_for is the filter of the plan: every worker of either layout in one case of 8,
     * two sampled workers otherwise (keeps the suite fast under ASan). */
    uint64_t pick = seed;
    int sweep = seed % 8 == 0;
    for (int q = 0; q < (sweep ? nw : 2); q++) {
        int w = sweep ? q : (int)(splitmix(&pick) % (uint64_t)nw);
        tide_plan_t *pf = NULL;
        cr_assert_eq(tide_reshard_plan_for(rc.o, rc.n, rc.c, rc.alive, rc.n_alive, w, &pf), TIDE_OK,
                     "seed %llu: %s", (unsigned long long)seed, tide_last_error());
        size_t m = 0;
        for (size_t k = 0; k < plan->n; k++) {
            const tide_xfer *x = &plan->items[k];
            if (x->src != w && x->dst != w)
                continue;
            cr_assert(m < pf->n && memcmp(x, &pf->items[m], sizeof *x) == 0,
                      "seed %llu: plan_for(%d) item %zu differs", (unsigned long long)seed, w, m);
            m++;
        }
        cr_assert_eq(m, pf->n, "seed %llu: plan_for(%d) has %zu items, filter %zu",
                     (unsigned long long)seed, w, pf->n, m);
        /* the summary: the whole plan's totals; item counts of this worker's part */
        tide_plan_summary want = plan->summary;
        want.n_xfers = want.n_copies = 0;
        for (size_t k = 0; k < pf->n; k++) {
            if (pf->items[k].src == pf->items[k].dst)
                want.n_copies++;
            else
                want.n_xfers++;
        }
        cr_assert(memcmp(&pf->summary, &want, sizeof pf->summary) == 0,
                  "seed %llu: plan_for summary differs", (unsigned long long)seed);
        check_stream_counts(plan, pf, seed);
        tide_plan_destroy(&pf);
    }
    /* Deterministic. */
    tide_plan_t *again = NULL;
    cr_assert_eq(tide_reshard_plan(rc.o, rc.n, rc.c, rc.alive, rc.n_alive, &again), TIDE_OK);
    cr_assert(again->n == plan->n && (plan->n == 0 || memcmp(again->items, plan->items,
                                                             plan->n * sizeof *plan->items) == 0),
              "seed %llu: not deterministic", (unsigned long long)seed);
    tide_plan_destroy(&again);
    tide_plan_destroy(&plan);
    free_case(&rc);
}

static void run_random(uint64_t first, int count)
{
    stats st = {0};
    uint64_t base = base_seed();
    for (int k = 0; k < count; k++)
        check_case(base + first + (uint64_t)k, &st);
    cr_log_info("random cases %d: %d without a live holder, %d compared with the exact optimum; "
                "worst ZeRO max send / optimum %.3f",
                st.cases, st.no_holder, st.checked_opt, st.worst_zero_ratio);
    cr_expect(st.no_holder > 0 && st.no_holder < st.cases / 2);
}

Test(reshard_random, cases_0_to_999)
{
    run_random(0, 1000);
}

Test(reshard_random, cases_1000_to_1999)
{
    run_random(1000, 1000);
}

Test(reshard_random, cases_2000_to_2999)
{
    run_random(2000, 1000);
}

/*
 * The totals-only path at cluster scale: GPT state (with and without ZeRO-1)
 * over hundreds of workers, random worker maps and lost workers, where every
 * holder node has many senders and quota cuts land mid-destination.
 */
Test(reshard_random, totals_match_the_plan_at_cluster_scale)
{
    uint64_t s = base_seed() ^ UINT64_C(0x70741);
    int planned = 0, lost = 0;
    for (int k = 0; k < 24; k++) {
        tide_model_spec spec = {.layers = 8,
                                .hidden = 48,
                                .heads = 4,
                                .vocab = 96,
                                .attention = 1,
                                .adam = 1,
                                .zero1 = k % 2,
                                .dtype = TIDE_BF16};
        tide_collection_t *c = NULL;
        cr_assert_eq(tide_collection_build_gpt(&c, &spec), TIDE_OK);
        static const int tps[] = {1, 2, 4, 8};
        int otp = tps[rnd(&s, 4)], ntp = tps[rnd(&s, 4)];
        int opp = 1 + rnd(&s, 4), npp = 1 + rnd(&s, 4);
        int odp = 2 + rnd(&s, 24), ndp = 1 + rnd(&s, 24);
        tide_layout_t *o = layout(odp, otp, opp, 8), *n = layout(ndp, ntp, npp, 8);
        int no = (int)tide_layout_size(o), nn = (int)tide_layout_size(n);
        size_t pool = (size_t)(no > nn ? no : nn) + (size_t)rnd(&s, 16);
        int32_t *ids = calloc(pool, sizeof *ids);
        for (size_t j = 0; j < pool; j++)
            ids[j] = (int32_t)j;
        shuffle(ids, (int)pool, &s);
        memcpy(o->worker, ids, (size_t)no * sizeof *ids);
        shuffle(ids, (int)pool, &s);
        memcpy(n->worker, ids, (size_t)nn * sizeof *ids);
        uint8_t *alive = calloc(pool, 1);
        for (size_t j = 0; j < pool; j++) /* lose some workers the new layout does not use */
            alive[j] = rnd(&s, 10) != 0;
        for (int j = 0; j < nn; j++)
            alive[n->worker[j]] = 1;
        tide_plan_t *plan = NULL;
        tide_status r1 = tide_reshard_plan(o, n, c, alive, pool, &plan);
        char detail[512];
        snprintf(detail, sizeof detail, "%s", tide_last_error());
        tide_plan_totals t;
        tide_status r2 = tide_reshard_plan_totals(o, n, c, alive, pool, &t);
        cr_assert_eq(r1, r2, "case %d: plan %s, totals %s", k, tide_status_name(r1),
                     tide_status_name(r2));
        if (r1 != TIDE_OK) {
            cr_assert_str_eq(tide_last_error(), detail);
            lost++;
        } else {
            planned++;
            const tide_plan_summary *ps = &plan->summary;
            cr_assert(t.bytes_sent == ps->bytes_sent && t.bytes_local == ps->bytes_local &&
                          t.lower_bound == ps->lower_bound && t.max_send == ps->max_send &&
                          t.max_recv == ps->max_recv && t.balanced_bound == ps->balanced_bound &&
                          t.messages == ps->messages,
                      "case %d (%d,%d,%d -> %d,%d,%d): totals differ (messages %llu vs %llu, "
                      "max send %llu vs %llu)",
                      k, odp, otp, opp, ndp, ntp, npp, (unsigned long long)t.messages,
                      (unsigned long long)ps->messages, (unsigned long long)t.max_send,
                      (unsigned long long)ps->max_send);
            char what[64];
            snprintf(what, sizeof what, "gpt case %d", k);
            check_cross_host(o, n, c, alive, pool, plan, &s, what);
            /* each worker's own part is the plan filtered to it (sampled workers) */
            for (int q = 0; q < 6; q++) {
                int32_t w = (int32_t)(splitmix(&s) % pool);
                tide_plan_t *pf = NULL;
                cr_assert_eq(tide_reshard_plan_for(o, n, c, alive, pool, w, &pf), TIDE_OK, "%s",
                             tide_last_error());
                size_t m = 0;
                for (size_t x = 0; x < plan->n; x++) {
                    const tide_xfer *it = &plan->items[x];
                    if (it->src != w && it->dst != w)
                        continue;
                    cr_assert(m < pf->n && memcmp(it, &pf->items[m], sizeof *it) == 0,
                              "case %d: plan_for(%d) item %zu differs", k, (int)w, m);
                    m++;
                }
                cr_assert_eq(m, pf->n, "case %d: plan_for(%d)", k, (int)w);
                tide_plan_destroy(&pf);
            }
        }
        tide_plan_destroy(&plan);
        free(ids);
        free(alive);
        tide_layout_destroy(&o);
        tide_layout_destroy(&n);
        tide_collection_destroy(&c);
    }
    cr_log_info("totals at scale: %d plans compared, %d without a live holder", planned, lost);
    cr_expect(planned >= 12, "only %d of 24 cases had a plan", planned);
}

/* ---- hand-checked plans ------------------------------------------------------------------ */

/* Plans, validates, simulates and returns the plan; the caller destroys it. */
static tide_plan_t *checked_plan(const tide_layout_t *o, const tide_layout_t *n,
                                 const tide_collection_t *c, const uint8_t *alive, size_t n_alive)
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

static void expect_item(const tide_plan_t *p, size_t k, uint32_t tensor, int src, int dst,
                        uint64_t src_off, uint64_t dst_off, uint64_t run, uint64_t count,
                        uint64_t src_stride, uint64_t dst_stride)
{
    cr_assert(k < p->n, "item %zu missing (plan has %zu)", k, p->n);
    const tide_xfer *x = &p->items[k];
    cr_expect(x->tensor == tensor && x->src == src && x->dst == dst && x->src_off == src_off &&
                  x->dst_off == dst_off && x->run == run && x->count == count,
              "item %zu: got (t%u %d->%d so %llu do %llu run %llu x %llu), want (t%u %d->%d so "
              "%llu do %llu run %llu x %llu)",
              k, x->tensor, (int)x->src, (int)x->dst, (unsigned long long)x->src_off,
              (unsigned long long)x->dst_off, (unsigned long long)x->run,
              (unsigned long long)x->count, tensor, src, dst, (unsigned long long)src_off,
              (unsigned long long)dst_off, (unsigned long long)run, (unsigned long long)count);
    if (count > 1)
        cr_expect(x->src_stride == src_stride && x->dst_stride == dst_stride,
                  "item %zu: strides %llu/%llu, want %llu/%llu", k,
                  (unsigned long long)x->src_stride, (unsigned long long)x->dst_stride,
                  (unsigned long long)src_stride, (unsigned long long)dst_stride);
}

static tide_collection_t *coll(int layers, const tide_tensor_desc *t, int n)
{
    tide_collection_t *c = NULL;
    cr_assert_eq(tide_collection_new(&c, layers), TIDE_OK);
    for (int k = 0; k < n; k++)
        cr_assert_eq(tide_collection_add(c, &t[k]), TIDE_OK, "%s", tide_last_error());
    return c;
}

Test(reshard_hand, dp_2_to_4_sends_each_replica_once_from_balanced_senders)
{
    tide_tensor_desc t[] = {
        mk("w", TIDE_F32, 2, 8, 4, 0, TIDE_TP_REPLICATED, 0, 1, TIDE_DP_REPLICATED)};
    tide_collection_t *c = coll(1, t, 1);
    tide_layout_t *o = layout(2, 1, 1, 1), *n = layout(4, 1, 1, 1);
    tide_plan_t *p = checked_plan(o, n, c, NULL, 0);
    cr_assert_eq(p->n, 4);
    expect_item(p, 0, 0, 0, 0, 0, 0, 128, 1, 0, 0);
    expect_item(p, 1, 0, 0, 2, 0, 0, 128, 1, 0, 0);
    expect_item(p, 2, 0, 1, 1, 0, 0, 128, 1, 0, 0);
    expect_item(p, 3, 0, 1, 3, 0, 0, 128, 1, 0, 0);
    cr_expect_eq(p->summary.bytes_sent, 256);
    cr_expect_eq(p->summary.bytes_local, 256);
    cr_expect_eq(p->summary.max_send, 128);
    cr_expect_eq(p->summary.balanced_bound, 128);
    cr_expect_eq(p->summary.max_recv, 128);
    cr_expect_eq(p->summary.messages, 2);
    cr_expect_eq(p->summary.n_xfers, 2);
    cr_expect_eq(p->summary.n_copies, 2);
    tide_plan_destroy(&p);
    cr_expect_null(p);
    tide_layout_destroy(&o);
    tide_layout_destroy(&n);
    tide_collection_destroy(&c);
}

Test(reshard_hand, tp_2_to_4_column_and_row_splits)
{
    tide_tensor_desc t[] = {
        mk("col", TIDE_F32, 2, 8, 4, 0, TIDE_TP_SPLIT, 0, 1, TIDE_DP_REPLICATED),
        mk("row", TIDE_F32, 2, 4, 8, 0, TIDE_TP_SPLIT, 1, 1, TIDE_DP_REPLICATED),
    };
    tide_collection_t *c = coll(1, t, 2);
    tide_layout_t *o = layout(1, 2, 1, 1), *n = layout(1, 4, 1, 1);
    tide_plan_t *p = checked_plan(o, n, c, NULL, 0);
    cr_assert_eq(p->n, 8);
    /* col rows: old t0 0-3, t1 4-7; new t' rows 2t'..2t'+1 (32 bytes). */
    expect_item(p, 0, 0, 0, 0, 0, 0, 32, 1, 0, 0);
    /* row cols: local [4, 2] taken from [4, 4]: 4 runs of 8 bytes, strides 16 / 8. */
    expect_item(p, 1, 1, 0, 0, 0, 0, 8, 4, 16, 8);
    expect_item(p, 2, 0, 0, 1, 32, 0, 32, 1, 0, 0);
    expect_item(p, 3, 1, 0, 1, 8, 0, 8, 4, 16, 8);
    expect_item(p, 4, 0, 1, 2, 0, 0, 32, 1, 0, 0);
    expect_item(p, 5, 1, 1, 2, 0, 0, 8, 4, 16, 8);
    expect_item(p, 6, 0, 1, 3, 32, 0, 32, 1, 0, 0);
    expect_item(p, 7, 1, 1, 3, 8, 0, 8, 4, 16, 8);
    cr_expect_eq(p->summary.bytes_sent, 3 * 64);
    cr_expect_eq(p->summary.bytes_local, 64);
    tide_plan_destroy(&p);
    tide_layout_destroy(&o);
    tide_layout_destroy(&n);
    tide_collection_destroy(&c);
}

Test(reshard_hand, tp_4_to_2_gathers_neighbouring_chunks)
{
    tide_tensor_desc t[] = {
        mk("col", TIDE_F32, 2, 8, 4, 0, TIDE_TP_SPLIT, 0, 1, TIDE_DP_REPLICATED),
        mk("row", TIDE_F32, 2, 4, 8, 0, TIDE_TP_SPLIT, 1, 1, TIDE_DP_REPLICATED),
    };
    tide_collection_t *c = coll(1, t, 2);
    tide_layout_t *o = layout(1, 4, 1, 1), *n = layout(1, 2, 1, 1);
    tide_plan_t *p = checked_plan(o, n, c, NULL, 0);
    cr_assert_eq(p->n, 8);
    expect_item(p, 0, 0, 0, 0, 0, 0, 32, 1, 0, 0);
    expect_item(p, 1, 1, 0, 0, 0, 0, 8, 4, 8, 16);
    expect_item(p, 2, 0, 1, 0, 0, 32, 32, 1, 0, 0);
    expect_item(p, 3, 1, 1, 0, 0, 8, 8, 4, 8, 16);
    expect_item(p, 4, 0, 2, 1, 0, 0, 32, 1, 0, 0);
    expect_item(p, 5, 1, 2, 1, 0, 0, 8, 4, 8, 16);
    expect_item(p, 6, 0, 3, 1, 0, 32, 32, 1, 0, 0);
    expect_item(p, 7, 1, 3, 1, 0, 8, 8, 4, 8, 16);
    cr_expect_eq(p->summary.bytes_sent, 3 * 32 + 3 * 32);
    cr_expect_eq(p->summary.messages, 3);
    tide_plan_destroy(&p);
    tide_layout_destroy(&o);
    tide_layout_destroy(&n);
    tide_collection_destroy(&c);
}

Test(reshard_hand, pp_2_to_4_with_uneven_stages)
{
    tide_tensor_desc t[8];
    t[0] =
        mk("emb", TIDE_F32, 1, 4, 0, TIDE_LAYER_PRE, TIDE_TP_REPLICATED, 0, 1, TIDE_DP_REPLICATED);
    for (int i = 0; i < 6; i++) {
        char name[8];
        snprintf(name, sizeof name, "l%d", i);
        t[1 + i] = mk(name, TIDE_F32, 1, 4, 0, i, TIDE_TP_REPLICATED, 0, 1, TIDE_DP_REPLICATED);
    }
    t[7] = mk("head", TIDE_F32, 1, 4, 0, TIDE_LAYER_POST, TIDE_TP_REPLICATED, 0, 1,
              TIDE_DP_REPLICATED);
    tide_collection_t *c = coll(6, t, 8);
    tide_layout_t *o = layout(1, 1, 2, 6), *n = layout(1, 1, 4, 6);
    cr_assert_eq(tide_layout_parse_stages(o, "0-3,4-5"), TIDE_OK, "%s", tide_last_error());
    cr_assert_eq(tide_layout_parse_stages(n, "0-0,1-2,3-4,5-5"), TIDE_OK, "%s", tide_last_error());
    char buf[96];
    cr_expect_str_eq(tide_layout_format(n, buf, sizeof buf), "(dp 1, tp 1, pp 4; stages "
                                                             "0-0,1-2,3-4,5-5)");
    tide_plan_t *p = checked_plan(o, n, c, NULL, 0);
    cr_assert_eq(p->n, 8);
    /* emb and l0 stay on worker 0; l1-l3 leave old stage 0; l4, l5, head leave worker 1. */
    expect_item(p, 0, 0, 0, 0, 0, 0, 16, 1, 0, 0);
    expect_item(p, 1, 1, 0, 0, 0, 0, 16, 1, 0, 0);
    expect_item(p, 2, 2, 0, 1, 0, 0, 16, 1, 0, 0);
    expect_item(p, 3, 3, 0, 1, 0, 0, 16, 1, 0, 0);
    expect_item(p, 4, 4, 0, 2, 0, 0, 16, 1, 0, 0);
    expect_item(p, 5, 5, 1, 2, 0, 0, 16, 1, 0, 0);
    expect_item(p, 6, 6, 1, 3, 0, 0, 16, 1, 0, 0);
    expect_item(p, 7, 7, 1, 3, 0, 0, 16, 1, 0, 0);
    cr_expect_eq(p->summary.bytes_sent, 6 * 16);
    cr_expect_eq(p->summary.max_send, 3 * 16);
    tide_plan_destroy(&p);
    tide_layout_destroy(&o);
    tide_layout_destroy(&n);
    tide_collection_destroy(&c);
}

/* Runs the plan on a qkv whose element e holds the float e; returns worker w's new buffer. */
static float *run_qkv(const tide_layout_t *o, const tide_layout_t *n, const tide_collection_t *c,
                      const tide_plan_t *p, int w)
{
    float global[24];
    for (int e = 0; e < 24; e++)
        global[e] = (float)e;
    int nw = max_worker(o, n) + 1;
    void ***ob = make_bufs(o, c, nw, 0), ***nb = make_bufs(n, c, nw, 0);
    for (size_t j = 0; j < tide_layout_size(o); j++) {
        int pp, d, t;
        coord(o, j, &pp, &d, &t);
        tide_shard_extract(o, c, 0, pp, d, t, global, ob[o->worker[j]][0]);
    }
    tide_plan_simulate(p, (void *const *const *)ob, (void *const *const *)nb);
    float *out = malloc(24 * sizeof *out);
    memcpy(out, nb[w][0], 24 * sizeof *out / (size_t)n->tp);
    free_bufs(ob, c, nw);
    free_bufs(nb, c, nw);
    return out;
}

Test(reshard_hand, fused_qkv_is_split_segment_by_segment)
{
    /* qkv [12, 2]: q rows 0-3, k rows 4-7, v rows 8-11. */
    tide_tensor_desc t[] = {
        mk("qkv", TIDE_F32, 2, 12, 2, 0, TIDE_TP_SPLIT, 0, 3, TIDE_DP_REPLICATED)};
    tide_collection_t *c = coll(1, t, 1);
    tide_layout_t *l1 = layout(1, 1, 1, 1), *l2 = layout(1, 2, 1, 1);

    tide_plan_t *p = checked_plan(l1, l2, c, NULL, 0);
    cr_assert_eq(p->n, 2);
    expect_item(p, 0, 0, 0, 0, 0, 0, 16, 3, 32, 16);  /* q0-1, k4-5, v8-9 */
    expect_item(p, 1, 0, 0, 1, 16, 0, 16, 3, 32, 16); /* q2-3, k6-7, v10-11 */
    float *b = run_qkv(l1, l2, c, p, 1);
    const float want1[12] = {4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23};
    cr_expect_arr_eq(b, want1, sizeof want1);
    free(b);
    tide_plan_destroy(&p);

    p = checked_plan(l2, l1, c, NULL, 0);
    cr_assert_eq(p->n, 2);
    expect_item(p, 0, 0, 0, 0, 0, 0, 16, 3, 16, 32);
    expect_item(p, 1, 0, 1, 0, 0, 16, 16, 3, 16, 32);
    b = run_qkv(l2, l1, c, p, 0);
    for (int e = 0; e < 24; e++)
        cr_expect_eq(b[e], (float)e);
    free(b);
    tide_plan_destroy(&p);

    /* tp 2 -> 3 (4 rows per segment is not divisible by 3: rejected with the segment size). */
    tide_layout_t *l3 = layout(1, 3, 1, 1);
    cr_expect_eq(tide_reshard_plan(l2, l3, c, NULL, 0, &p), TIDE_ERR_INVALID);
    cr_expect_str_eq(tide_last_error(), "new layout: tp=3 does not divide dimension 0 of qkv "
                                        "(size 12: 3 fused segments of 4)");
    tide_layout_destroy(&l1);
    tide_layout_destroy(&l2);
    tide_layout_destroy(&l3);
    tide_collection_destroy(&c);
}

Test(reshard_hand, zero1_ranges_follow_a_dp_change)
{
    tide_tensor_desc t[] = {
        mk("m", TIDE_F32, 1, 10, 0, 0, TIDE_TP_REPLICATED, 0, 1, TIDE_DP_SHARDED)};
    tide_collection_t *c = coll(1, t, 1);
    tide_layout_t *o = layout(2, 1, 1, 1), *n = layout(3, 1, 1, 1);
    /* Old ranges [0,5) [5,10); new [0,4) [4,7) [7,10): the first n % dp ranks are longer. */
    cr_expect_eq(tide_shard_bytes(n, c, 0, 0, 0, 0), 16);
    cr_expect_eq(tide_shard_bytes(n, c, 0, 0, 1, 0), 12);
    cr_expect_eq(tide_shard_bytes(n, c, 0, 0, 2, 0), 12);
    tide_plan_t *p = checked_plan(o, n, c, NULL, 0);
    cr_assert_eq(p->n, 4);
    expect_item(p, 0, 0, 0, 0, 0, 0, 16, 1, 0, 0);
    expect_item(p, 1, 0, 0, 1, 16, 0, 4, 1, 0, 0);
    expect_item(p, 2, 0, 1, 1, 0, 4, 8, 1, 0, 0);
    expect_item(p, 3, 0, 1, 2, 8, 0, 12, 1, 0, 0);
    cr_expect_eq(p->summary.bytes_sent, 16);
    cr_expect_eq(p->summary.bytes_local, 24);
    tide_plan_destroy(&p);
    tide_layout_destroy(&o);
    tide_layout_destroy(&n);
    tide_collection_destroy(&c);
}

Test(reshard_hand, zero1_with_tp_split_uses_head_middle_tail_items)
{
    /* [6, 4] split along dim 1 over tp 2 -> 1, ZeRO over dp 1 -> 2: new rank 0 holds global
     * rows 0-2 of the unsplit tensor; from old t0 ([6,2]) that is 3 runs of 8 bytes. */
    tide_tensor_desc t[] = {mk("z", TIDE_F32, 2, 6, 4, 0, TIDE_TP_SPLIT, 1, 1, TIDE_DP_SHARDED)};
    tide_collection_t *c = coll(1, t, 1);
    tide_layout_t *o = layout(1, 2, 1, 1), *n = layout(2, 1, 1, 1);
    tide_plan_t *p = checked_plan(o, n, c, NULL, 0);
    cr_assert_eq(p->n, 4);
    expect_item(p, 0, 0, 0, 0, 0, 0, 8, 3, 8, 16);
    expect_item(p, 1, 0, 0, 1, 24, 0, 8, 3, 8, 16);
    expect_item(p, 2, 0, 1, 0, 0, 8, 8, 3, 8, 16);
    expect_item(p, 3, 0, 1, 1, 24, 8, 8, 3, 8, 16);
    tide_plan_destroy(&p);
    /* Odd sizes: [5, 4] over dp 3 cuts inside runs (partial head and tail items). */
    tide_tensor_desc t2[] = {mk("z", TIDE_F32, 2, 5, 4, 0, TIDE_TP_SPLIT, 1, 1, TIDE_DP_SHARDED)};
    tide_collection_t *c2 = coll(1, t2, 1);
    tide_layout_t *n3 = layout(3, 1, 1, 1);
    p = checked_plan(o, n3, c2, NULL, 0);
    int partial = 0;
    for (size_t k = 0; k < p->n; k++)
        partial += p->items[k].run == 4; /* one element of a two-element run */
    cr_expect(partial > 0);
    tide_plan_destroy(&p);
    tide_layout_destroy(&o);
    tide_layout_destroy(&n);
    tide_layout_destroy(&n3);
    tide_collection_destroy(&c);
    tide_collection_destroy(&c2);
}

Test(reshard_hand, lost_worker_with_a_replica_is_served_by_the_replica)
{
    tide_tensor_desc t[] = {
        mk("w", TIDE_F32, 1, 4, 0, 0, TIDE_TP_REPLICATED, 0, 1, TIDE_DP_REPLICATED)};
    tide_collection_t *c = coll(1, t, 1);
    tide_layout_t *o = layout(2, 1, 1, 1), *n = layout(2, 1, 1, 1);
    n->worker[0] = 1;
    n->worker[1] = 2;
    uint8_t alive[3] = {0, 1, 1};
    tide_plan_t *p = checked_plan(o, n, c, alive, 3);
    cr_assert_eq(p->n, 2);
    expect_item(p, 0, 0, 1, 1, 0, 0, 16, 1, 0, 0);
    expect_item(p, 1, 0, 1, 2, 0, 0, 16, 1, 0, 0);
    tide_plan_destroy(&p);
    /* A dead worker in the new layout is refused. */
    n->worker[1] = 0;
    cr_expect_eq(tide_reshard_plan(o, n, c, alive, 3, &p), TIDE_ERR_INVALID);
    cr_expect(strstr(tide_last_error(), "worker 0 is in the new layout") != NULL, "%s",
              tide_last_error());
    tide_layout_destroy(&o);
    tide_layout_destroy(&n);
    tide_collection_destroy(&c);
}

Test(reshard_hand, lost_worker_without_a_replica_names_tensor_and_region)
{
    tide_tensor_desc t[] = {
        mk("layer.0.fc1.weight", TIDE_F32, 2, 8, 2, 0, TIDE_TP_SPLIT, 0, 1, TIDE_DP_REPLICATED),
        mk("layer.0.fc1.weight.exp_avg", TIDE_F32, 2, 8, 2, 0, TIDE_TP_REPLICATED, 0, 1,
           TIDE_DP_SHARDED)};
    tide_collection_t *c = coll(1, t, 1);
    tide_layout_t *o = layout(1, 2, 1, 1), *n = layout(1, 2, 1, 1);
    n->worker[1] = 2;
    uint8_t alive[3] = {1, 0, 1};
    tide_plan_t *p = NULL;
    cr_assert_eq(tide_reshard_plan(o, n, c, alive, 3, &p), TIDE_ERR_NO_HOLDER);
    cr_expect_null(p);
    cr_expect_str_eq(tide_last_error(),
                     "no live worker holds tp shard 1 of 2 (dimension 0 indices [4, 8)) of "
                     "layer.0.fc1.weight, needed by worker 2 at (pp 0, dp 0, tp 1); its old "
                     "holders (workers 1) are all dead");
    cr_expect_eq(tide_reshard_plan_for(o, n, c, alive, 3, 2, &p), TIDE_ERR_NO_HOLDER);
    tide_collection_destroy(&c);
    /* ZeRO-1 state: the region is the dead rank's range. */
    c = coll(1, &t[1], 1);
    tide_layout_destroy(&o);
    tide_layout_destroy(&n);
    o = layout(2, 1, 1, 1);
    n = layout(2, 1, 1, 1);
    n->worker[1] = 2;
    cr_assert_eq(tide_reshard_plan(o, n, c, alive, 3, &p), TIDE_ERR_NO_HOLDER);
    cr_expect(strstr(tide_last_error(), "elements [8, 16) (dp rank 1's ZeRO-1 range) of the whole "
                                        "tensor of layer.0.fc1.weight.exp_avg") != NULL,
              "%s", tide_last_error());
    tide_layout_destroy(&o);
    tide_layout_destroy(&n);
    tide_collection_destroy(&c);
}

Test(reshard_hand, identity_resize_copies_everything_locally)
{
    tide_model_spec s = {.layers = 4,
                         .hidden = 8,
                         .heads = 2,
                         .vocab = 16,
                         .attention = 1,
                         .adam = 1,
                         .zero1 = 1,
                         .dtype = TIDE_BF16};
    tide_collection_t *c = NULL;
    cr_assert_eq(tide_collection_build_gpt(&c, &s), TIDE_OK);
    tide_layout_t *o = layout(2, 2, 2, 4);
    tide_plan_t *p = checked_plan(o, o, c, NULL, 0);
    cr_expect_eq(p->summary.bytes_sent, 0);
    cr_expect_eq(p->summary.messages, 0);
    cr_expect_eq(p->summary.n_xfers, 0);
    /* One contiguous copy per held (worker, tensor). */
    size_t held = 0;
    for (size_t j = 0; j < tide_layout_size(o); j++)
        for (size_t i = 0; i < tide_collection_size(c); i++) {
            int pp, d, t;
            coord(o, j, &pp, &d, &t);
            held += tide_shard_bytes(o, c, i, pp, d, t) > 0;
        }
    cr_expect_eq(p->n, held);
    tide_plan_destroy(&p);
    tide_layout_destroy(&o);
    tide_collection_destroy(&c);
}

Test(reshard_hand, gpt_dp_shrink_with_default_map_and_zero1)
{
    /* The bench's shape, small: (4,2,2) -> (3,2,2) under the default rank order. */
    for (int zero = 0; zero < 2; zero++) {
        tide_model_spec s = {.layers = 4,
                             .hidden = 12,
                             .heads = 2,
                             .vocab = 8,
                             .attention = 1,
                             .adam = 1,
                             .zero1 = zero,
                             .dtype = TIDE_F32};
        tide_collection_t *c = NULL;
        cr_assert_eq(tide_collection_build_gpt(&c, &s), TIDE_OK);
        tide_layout_t *o = layout(4, 2, 2, 4), *n = layout(3, 2, 2, 4);
        tide_plan_t *p = checked_plan(o, n, c, NULL, 0);
        cr_expect(p->summary.bytes_sent > 0);
        cr_expect_leq(p->summary.max_send, p->summary.balanced_bound * 105 / 100 + 1);
        tide_plan_destroy(&p);
        tide_layout_destroy(&o);
        tide_layout_destroy(&n);
        tide_collection_destroy(&c);
    }
}

/* ---- layouts ---------------------------------------------------------------------------- */

Test(reshard_layout, defaults_even_stages_and_rank_order)
{
    tide_layout_t *l = layout(2, 4, 3, 8);
    cr_expect_eq(tide_layout_size(l), 24);
    cr_expect_arr_eq(l->stage_start, ((int[]){0, 3, 6, 8}), 4 * sizeof(int));
    for (size_t i = 0; i < 24; i++)
        cr_expect_eq(l->worker[i], (int32_t)i);
    cr_expect_eq(tide_layout_index(l, 1, 1, 2), 14);
    int p, d, t;
    cr_assert_eq(tide_layout_find(l, 14, &p, &d, &t), TIDE_OK);
    cr_expect(p == 1 && d == 1 && t == 2);
    cr_expect_eq(tide_layout_find(l, 99, &p, &d, &t), TIDE_ERR_NOT_FOUND);
    cr_expect_eq(tide_layout_stage_of(l, 5), 1);
    cr_expect_eq(tide_layout_stage_of(l, 6), 2);
    cr_expect_eq(tide_layout_stage_of(l, TIDE_LAYER_PRE), 0);
    cr_expect_eq(tide_layout_stage_of(l, TIDE_LAYER_POST), 2);
    cr_expect_eq(tide_layout_stage_of(l, TIDE_LAYER_ALL), -1);
    cr_expect_eq(tide_layout_stage_of(l, 8), -1);
    char buf[64];
    cr_expect_str_eq(tide_layout_format(l, buf, sizeof buf),
                     "(dp 2, tp 4, pp 3; stages 0-2,3-5,6-7)");
    tide_layout_t *cp = NULL;
    cr_assert_eq(tide_layout_copy(&cp, l), TIDE_OK);
    cr_expect_arr_eq(cp->worker, l->worker, 24 * sizeof(int32_t));
    cr_expect_eq(tide_layout_validate(cp, NULL), TIDE_OK);
    tide_layout_destroy(&cp);
    tide_layout_destroy(&l);
    cr_expect_null(l);
    tide_layout_destroy(&l); /* NULL is fine */
}

Test(reshard_layout, validation_messages_name_the_problem)
{
    tide_tensor_desc t[] = {mk("layer.4.fc1.weight", TIDE_F32, 2, 4096, 1024, 4, TIDE_TP_SPLIT, 0,
                               1, TIDE_DP_REPLICATED)};
    tide_collection_t *c = coll(6, t, 1);
    tide_layout_t *l = layout(1, 3, 1, 6);
    cr_expect_eq(tide_layout_validate(l, c), TIDE_ERR_INVALID);
    cr_expect_str_eq(tide_last_error(),
                     "tp=3 does not divide dimension 0 of layer.4.fc1.weight (size 4096)");
    tide_layout_destroy(&l);

    l = layout(4, 2, 1, 6);
    l->worker[7] = 7;
    l->worker[0] = 7;
    cr_expect_eq(tide_layout_validate(l, NULL), TIDE_ERR_INVALID);
    cr_expect_str_eq(tide_last_error(), "worker 7 appears twice: at (pp 0, dp 0, tp 0) and (pp 0, "
                                        "dp 3, tp 1)");
    l->worker[0] = -2;
    cr_expect_eq(tide_layout_validate(l, NULL), TIDE_ERR_INVALID);
    cr_expect(strstr(tide_last_error(), "negative") != NULL);
    tide_layout_destroy(&l);

    l = layout(1, 1, 3, 6);
    cr_expect_eq(tide_layout_set_stages(l, (int[]){0, 2, 6, 6}), TIDE_ERR_INVALID);
    cr_expect_str_eq(tide_last_error(), "stage 2 has no layers");
    l->stage_start[2] = 6; /* written directly: the validator catches it too */
    cr_expect_eq(tide_layout_validate(l, NULL), TIDE_ERR_INVALID);
    cr_expect_str_eq(tide_last_error(), "stage 2 has no layers");
    l->stage_start[2] = 4;
    cr_expect_eq(tide_layout_validate(l, c), TIDE_OK);
    cr_expect_eq(tide_layout_parse_stages(l, "0-1,3-4,5-5"), TIDE_ERR_INVALID);
    cr_expect(strstr(tide_last_error(), "stage 1 starts at layer 3, expected 2") != NULL, "%s",
              tide_last_error());
    cr_expect_eq(tide_layout_parse_stages(l, "0-5"), TIDE_ERR_INVALID);
    cr_expect(strstr(tide_last_error(), "1 ranges for pp=3") != NULL, "%s", tide_last_error());
    cr_expect_eq(tide_layout_parse_stages(l, "0-1,2-3,4-6"), TIDE_ERR_INVALID);
    cr_expect_eq(tide_layout_parse_stages(l, "0-1,2-3,4-x"), TIDE_ERR_INVALID);
    cr_expect_eq(tide_layout_parse_stages(l, "0-1,2-2,3-5"), TIDE_OK);
    cr_expect_arr_eq(l->stage_start, ((int[]){0, 2, 3, 6}), 4 * sizeof(int));
    tide_layout_destroy(&l);

    l = layout(1, 1, 1, 5);
    cr_expect_eq(tide_layout_validate(l, c), TIDE_ERR_INVALID);
    cr_expect_str_eq(tide_last_error(), "the layout has 5 layers but the collection has 6");
    tide_layout_destroy(&l);

    cr_expect_eq(tide_layout_new(&l, 1, 1, 4, 3, 1), TIDE_ERR_INVALID);
    cr_expect_null(l);
    cr_expect(strstr(tide_last_error(), "pp=4 needs at least 4 layers") != NULL);
    cr_expect_eq(tide_layout_new(&l, 0, 1, 1, 3, 1), TIDE_ERR_INVALID);
    cr_expect_eq(tide_layout_new(&l, 1, 1, 1, 3, 0), TIDE_ERR_INVALID);
    tide_collection_destroy(&c);
}

/* Fit rules: each degree divides its numbers; the first broken rule is named with what it
   counts; malformed rules are refused, not treated as "any layout". */
Test(reshard_layout, fit_rules_name_the_number_a_degree_does_not_divide)
{
    const tide_fit_rule r[] = {
        {TIDE_DEGREE_DP, 4, "the global batch 16 / 4 micro-batches"},
        {TIDE_DEGREE_TP, 64, "the hidden size"},
        {TIDE_DEGREE_TP, 24, ""},
        {TIDE_DEGREE_PP, 6, "the layers, evenly"},
    };
    cr_expect_eq(tide_fit_check(r, 4, 4, 8, 3, 1), TIDE_OK, "%s", tide_last_error());
    cr_expect_eq(tide_fit_check(r, 4, 1, 1, 1, 1), TIDE_OK);
    cr_expect_eq(tide_fit_check(NULL, 0, 3, 5, 7, 1), TIDE_OK, "no rules: any degrees");
    cr_expect_eq(tide_fit_check(r, 4, 3, 1, 1, 1), TIDE_ERR_INVALID);
    cr_expect_str_eq(tide_last_error(),
                     "dp 3 does not divide 4 (the global batch 16 / 4 micro-batches)");
    cr_expect_eq(tide_fit_check(r, 4, 2, 16, 1, 1), TIDE_ERR_INVALID);
    cr_expect_str_eq(tide_last_error(), "tp 16 does not divide 24");
    cr_expect_eq(tide_fit_check(r, 4, 2, 2, 4, 1), TIDE_ERR_INVALID);
    cr_expect_str_eq(tide_last_error(), "pp 4 does not divide 6 (the layers, evenly)");
    cr_expect_eq(tide_fit_check(r, 4, 0, 1, 1, 1), TIDE_ERR_INVALID);

    tide_fit_rule bad = {TIDE_DEGREE_DP, 0, ""};
    cr_expect_eq(tide_fit_check(&bad, 1, 1, 1, 1, 1), TIDE_ERR_INVALID, "n 0 is malformed");
    cr_expect(strstr(tide_last_error(), "below 1") != NULL, "%s", tide_last_error());
    bad = (tide_fit_rule){(tide_degree)4, 4, ""};
    cr_expect_eq(tide_fit_check(&bad, 1, 1, 1, 1, 1), TIDE_ERR_INVALID);
    cr_expect(strstr(tide_last_error(), "not dp, tp, pp or dp_micro") != NULL, "%s",
              tide_last_error());
    cr_expect_eq(tide_fit_check(r, 4, 1, 1, 1, 0), TIDE_ERR_INVALID, "0 micro-batches");
    bad = (tide_fit_rule){TIDE_DEGREE_TP, 4, "two\nlines"};
    cr_expect_eq(tide_fit_check(&bad, 1, 1, 1, 1, 1), TIDE_ERR_INVALID);
    cr_expect(strstr(tide_last_error(), "printable") != NULL, "%s", tide_last_error());
    memset(bad.what, 'x', sizeof bad.what);
    cr_expect_eq(tide_fit_check(&bad, 1, 1, 1, 1, 1), TIDE_ERR_INVALID);
    cr_expect(strstr(tide_last_error(), "not terminated") != NULL, "%s", tide_last_error());
    cr_expect_eq(tide_fit_check(NULL, 2, 1, 1, 1, 1), TIDE_ERR_INVALID);
    cr_expect_eq(tide_fit_check(r, TIDE_FIT_RULES_MAX + 1, 1, 1, 1, 1), TIDE_ERR_INVALID);

    char buf[256];
    cr_expect_str_eq(tide_fit_format(r, 2, buf, sizeof buf),
                     "dp divides 4 (the global batch 16 / 4 micro-batches); tp divides 64 (the "
                     "hidden size)");
    cr_expect_str_eq(tide_fit_format(NULL, 0, buf, sizeof buf), "any layout");
    cr_expect_str_eq(tide_degree_name(TIDE_DEGREE_PP), "pp");
    cr_expect_str_eq(tide_degree_name(TIDE_DEGREE_DP_MICRO), "dp_micro");
}

/* dp_micro: dp times the micro-batch count divides the global batch, whichever count a
   resize gives the job; the refusal says the product. */
Test(reshard_layout, fit_rule_over_dp_and_micro_batches)
{
    const tide_fit_rule r[] = {{TIDE_DEGREE_DP_MICRO, 16, "the global batch"}};
    cr_expect_eq(tide_fit_check(r, 1, 4, 1, 1, 4), TIDE_OK, "%s", tide_last_error());
    cr_expect_eq(tide_fit_check(r, 1, 2, 1, 1, 8), TIDE_OK);
    cr_expect_eq(tide_fit_check(r, 1, 8, 1, 1, 2), TIDE_OK);
    cr_expect_eq(tide_fit_check(r, 1, 4, 1, 1, 8), TIDE_ERR_INVALID, "32 samples of 16");
    cr_expect_str_eq(tide_last_error(),
                     "dp 4 x 8 micro-batches = 32 does not divide 16 (the global batch)");
    cr_expect_eq(tide_fit_check(r, 1, 3, 1, 1, 4), TIDE_ERR_INVALID);
    cr_expect_str_eq(tide_last_error(),
                     "dp 3 x 4 micro-batches = 12 does not divide 16 (the global batch)");
    char buf[128];
    cr_expect_str_eq(tide_fit_format(r, 1, buf, sizeof buf),
                     "dp x micro-batches divides 16 (the global batch)");
}

/* ---- collections and geometry -------------------------------------------------------------- */

Test(reshard_collection, add_checks_every_field)
{
    tide_collection_t *c = NULL;
    cr_assert_eq(tide_collection_new(&c, 2), TIDE_OK);
    tide_tensor_desc ok = mk("a", TIDE_F16, 2, 6, 4, 1, TIDE_TP_SPLIT, 0, 3, TIDE_DP_SHARDED);
    cr_expect_eq(tide_collection_add(c, &ok), TIDE_OK);
    cr_expect_eq(tide_collection_add(c, &ok), TIDE_ERR_EXISTS);
    tide_tensor_desc bad = ok;
    snprintf(bad.name, sizeof bad.name, "b");
    bad.layer = 2;
    cr_expect_eq(tide_collection_add(c, &bad), TIDE_ERR_INVALID);
    cr_expect(strstr(tide_last_error(), "layer 2 is outside") != NULL, "%s", tide_last_error());
    bad = ok;
    snprintf(bad.name, sizeof bad.name, "b");
    bad.tp_segments = 4;
    cr_expect_eq(tide_collection_add(c, &bad), TIDE_ERR_INVALID);
    cr_expect_str_eq(tide_last_error(), "b: 4 segments do not divide dimension 0 (size 6)");
    bad.tp_segments = 1;
    bad.tp_dim = 2;
    cr_expect_eq(tide_collection_add(c, &bad), TIDE_ERR_INVALID);
    bad.tp_dim = 0;
    bad.shape[1] = 0;
    cr_expect_eq(tide_collection_add(c, &bad), TIDE_ERR_INVALID);
    bad.shape[1] = 4;
    bad.dtype = (tide_dtype)42;
    cr_expect_eq(tide_collection_add(c, &bad), TIDE_ERR_INVALID);
    bad.dtype = TIDE_F32;
    bad.ndim = 5;
    cr_expect_eq(tide_collection_add(c, &bad), TIDE_ERR_INVALID);
    bad.ndim = 2;
    bad.name[0] = '\0';
    cr_expect_eq(tide_collection_add(c, &bad), TIDE_ERR_INVALID);
    cr_expect_eq(tide_collection_size(c), 1);
    size_t idx = 9;
    cr_expect_eq(tide_collection_find(c, "a", &idx), TIDE_OK);
    cr_expect_eq(idx, 0);
    cr_expect_eq(tide_collection_find(c, "zz", &idx), TIDE_ERR_NOT_FOUND);
    cr_expect_eq(tide_tensor_bytes(tide_collection_tensor(c, 0)), 48);
    cr_expect_eq(tide_collection_bytes(c), 48);
    cr_expect_eq(tide_collection_num_layers(c), 2);
    cr_expect_eq(tide_dtype_size(TIDE_BF16), 2);
    cr_expect_str_eq(tide_dtype_name(TIDE_I64), "i64");
    cr_expect_str_eq(tide_dtype_name((tide_dtype)99), "?");
    tide_collection_destroy(&c);
    cr_expect_null(c);
}

Test(reshard_collection, many_tensors_are_found_by_name)
{
    tide_collection_t *c = NULL;
    cr_assert_eq(tide_collection_new(&c, 1), TIDE_OK);
    for (int k = 0; k < 5000; k++) {
        char name[32];
        snprintf(name, sizeof name, "t.%d", k);
        tide_tensor_desc t =
            mk(name, TIDE_U8, 1, 3, 0, 0, TIDE_TP_REPLICATED, 0, 1, TIDE_DP_REPLICATED);
        cr_assert_eq(tide_collection_add(c, &t), TIDE_OK);
    }
    for (int k = 0; k < 5000; k += 7) {
        char name[32];
        size_t idx;
        snprintf(name, sizeof name, "t.%d", k);
        cr_assert_eq(tide_collection_find(c, name, &idx), TIDE_OK);
        cr_assert_eq(idx, (size_t)k);
    }
    tide_collection_destroy(&c);
}

Test(reshard_collection, gpt_builder_names_rules_and_size)
{
    tide_model_spec s = {.layers = 2,
                         .hidden = 16,
                         .ffn = 0,
                         .heads = 4,
                         .vocab = 32,
                         .attention = 1,
                         .adam = 1,
                         .zero1 = 1,
                         .dtype = TIDE_F32};
    tide_collection_t *c = NULL;
    cr_assert_eq(tide_collection_build_gpt(&c, &s), TIDE_OK, "%s", tide_last_error());
    /* 12 parameters per block, embed, final_ln x2, head; x3 with Adam; plus step. */
    cr_expect_eq(tide_collection_size(c), (2 * 12 + 4) * 3 + 1);
    uint64_t h = 16, params = 2 * 32 * h + 2 * (12 * h * h + 13 * h) + 2 * h;
    cr_expect_eq(tide_collection_bytes(c), params * 3 * 4 + 8);
    size_t i;
    cr_assert_eq(tide_collection_find(c, "layer.1.qkv.weight", &i), TIDE_OK);
    const tide_tensor_desc *t = tide_collection_tensor(c, i);
    cr_expect(t->tp == TIDE_TP_SPLIT && t->tp_dim == 0 && t->tp_segments == 3 &&
              t->shape[0] == 48 && t->shape[1] == 16 && t->layer == 1 &&
              t->dp == TIDE_DP_REPLICATED);
    const tide_tensor_desc *m = tide_collection_tensor(c, i + 1);
    cr_expect_str_eq(m->name, "layer.1.qkv.weight.exp_avg");
    cr_expect_eq(m->dp, TIDE_DP_SHARDED);
    cr_expect_str_eq(tide_collection_tensor(c, i + 2)->name, "layer.1.qkv.weight.exp_avg_sq");
    cr_assert_eq(tide_collection_find(c, "layer.0.fc2.weight", &i), TIDE_OK);
    t = tide_collection_tensor(c, i);
    cr_expect(t->tp_dim == 1 && t->shape[0] == 16 && t->shape[1] == 64);
    cr_assert_eq(tide_collection_find(c, "embed.weight", &i), TIDE_OK);
    cr_expect_eq(tide_collection_tensor(c, i)->layer, TIDE_LAYER_PRE);
    cr_assert_eq(tide_collection_find(c, "head.weight", &i), TIDE_OK);
    cr_expect_eq(tide_collection_tensor(c, i)->layer, TIDE_LAYER_POST);
    cr_assert_eq(tide_collection_find(c, "step", &i), TIDE_OK);
    cr_expect(tide_collection_tensor(c, i)->layer == TIDE_LAYER_ALL &&
              tide_collection_tensor(c, i)->dtype == TIDE_I64);
    tide_collection_destroy(&c);
    s.attention = 0;
    s.vocab = 0;
    s.adam = 0;
    cr_assert_eq(tide_collection_build_gpt(&c, &s), TIDE_OK);
    cr_expect_eq(tide_collection_size(c), 2 * 6 + 2 + 1);
    cr_expect_eq(tide_collection_find(c, "embed.weight", &i), TIDE_ERR_NOT_FOUND);
    tide_collection_destroy(&c);
    s.heads = 3;
    s.attention = 1;
    cr_expect_eq(tide_collection_build_gpt(&c, &s), TIDE_ERR_INVALID);
    cr_expect_null(c);
}

Test(reshard_geometry, shards_tile_the_tensor_and_round_trip)
{
    tide_tensor_desc t[] = {
        mk("qkv", TIDE_F32, 2, 12, 2, 0, TIDE_TP_SPLIT, 0, 3, TIDE_DP_SHARDED),
        mk("row", TIDE_BF16, 2, 3, 8, 0, TIDE_TP_SPLIT, 1, 1, TIDE_DP_REPLICATED),
    };
    tide_collection_t *c = coll(1, t, 2);
    tide_layout_t *l = layout(3, 2, 1, 1);
    float g[24], back[24];
    for (int e = 0; e < 24; e++)
        g[e] = (float)e;
    memset(back, 0, sizeof back);
    uint64_t total = 0;
    for (int d = 0; d < 3; d++)
        for (int tt = 0; tt < 2; tt++) {
            uint64_t b = tide_shard_bytes(l, c, 0, 0, d, tt);
            total += b;
            float buf[24];
            tide_shard_extract(l, c, 0, 0, d, tt, g, buf);
            tide_shard_insert(l, c, 0, 0, d, tt, buf, back);
        }
    cr_expect_eq(total, sizeof g);
    cr_expect_arr_eq(back, g, sizeof g);
    /* tp rank 1's shard is rows 2-3, 6-7, 10-11; dp rank 0 holds its first 4 of 12 elements. */
    float buf[24];
    tide_shard_extract(l, c, 0, 0, 0, 1, g, buf);
    cr_expect_arr_eq(buf, ((float[]){4, 5, 6, 7}), 4 * sizeof(float));
    cr_expect_eq(tide_shard_bytes(l, c, 1, 0, 2, 1), 3 * 4 * 2);
    cr_expect_eq(tide_shard_bytes(l, c, 1, 1, 0, 0), 0); /* no such stage */
    tide_layout_destroy(&l);
    tide_collection_destroy(&c);
}

/* ---- allocation failures ------------------------------------------------------------------- */

Test(reshard_alloc, every_allocation_failure_is_nomem_without_leaks)
{
    tide_model_spec s = {.layers = 3,
                         .hidden = 8,
                         .heads = 2,
                         .vocab = 8,
                         .attention = 1,
                         .adam = 1,
                         .zero1 = 0, /* DP-replicated: a dead old worker leaves a live replica */
                         .dtype = TIDE_F32};
    tide_collection_t *c = NULL;
    /* Collection builder. */
    int failed = 0;
    for (long n = 1;; n++) {
        tide_alloc_fail_at(n, 0);
        tide_status rc = tide_collection_build_gpt(&c, &s);
        tide_alloc_fail_at(0, 0);
        if (rc == TIDE_OK)
            break;
        cr_assert_eq(rc, TIDE_ERR_NOMEM, "allocation %ld: %s", n, tide_status_name(rc));
        cr_assert_null(c);
        failed++;
    }
    cr_expect(failed > 3);
    tide_layout_t *o = layout(3, 2, 3, 3), *n = layout(2, 2, 2, 3);
    n->worker[0] = 40; /* a fresh worker */
    uint8_t alive[41];
    memset(alive, 1, sizeof alive);
    alive[0] = 0;
    /* Plan, plan_for, lower bound, validation and layout calls. */
    for (int what = 0; what < 5; what++) {
        failed = 0;
        for (long k = 1;; k++) {
            tide_plan_t *p = NULL;
            tide_layout_t *l = NULL;
            uint64_t lb;
            tide_alloc_fail_at(k, what == 4);
            tide_status rc;
            if (what == 0)
                rc = tide_reshard_plan(o, n, c, alive, sizeof alive, &p);
            else if (what == 1)
                rc = tide_reshard_plan_for(o, n, c, alive, sizeof alive, 40, &p);
            else if (what == 2)
                rc = tide_reshard_lower_bound(o, n, c, &lb);
            else if (what == 3)
                rc = tide_layout_copy(&l, o);
            else
                rc = tide_layout_validate(o, c);
            tide_alloc_fail_at(0, 0);
            if (rc == TIDE_OK) {
                tide_plan_destroy(&p);
                tide_layout_destroy(&l);
                break;
            }
            cr_assert_eq(rc, TIDE_ERR_NOMEM, "call %d allocation %ld: %s (%s)", what, k,
                         tide_status_name(rc), tide_last_error());
            cr_assert_null(p);
            cr_assert_null(l);
            failed++;
        }
        cr_expect(failed > 0, "call %d never allocated", what);
    }
    /* The validator under failure too. */
    tide_plan_t *p = NULL;
    cr_assert_eq(tide_reshard_plan(o, n, c, alive, sizeof alive, &p), TIDE_OK);
    for (long k = 1;; k++) {
        tide_alloc_fail_at(k, 0);
        tide_status rc = tide_plan_validate(o, n, c, alive, sizeof alive, p);
        tide_alloc_fail_at(0, 0);
        if (rc == TIDE_OK)
            break;
        cr_assert_eq(rc, TIDE_ERR_NOMEM);
    }
    tide_plan_destroy(&p);
    tide_layout_destroy(&o);
    tide_layout_destroy(&n);
    tide_collection_destroy(&c);
}

Test(reshard_validate, catches_broken_plans)
{
    tide_tensor_desc t[] = {mk("w", TIDE_F32, 2, 8, 4, 0, TIDE_TP_SPLIT, 0, 1, TIDE_DP_REPLICATED)};
    tide_collection_t *c = coll(1, t, 1);
    tide_layout_t *o = layout(2, 2, 1, 1), *n = layout(1, 2, 1, 1);
    n->worker[1] = 2;
    tide_plan_t *p = checked_plan(o, n, c, NULL, 0);
    tide_xfer saved;
    /* Each corruption must be caught. */
    for (int k = 0; k < 6; k++) {
        size_t at = p->n - 1;
        saved = p->items[at];
        tide_xfer *x = &p->items[at];
        if (k == 0)
            x->src_off += 4; /* reads the wrong bytes */
        else if (k == 1)
            x->run -= 4; /* leaves a hole */
        else if (k == 2)
            x->dst = 3; /* not in the new layout */
        else if (k == 3)
            x->dst_off += 1 << 20; /* out of range */
        else if (k == 4)
            x->tensor = 9;
        else
            x->src = 7; /* not an old worker */
        cr_expect_eq(tide_plan_validate(o, n, c, NULL, 0, p), TIDE_ERR_INVALID, "corruption %d", k);
        p->items[at] = saved;
    }
    /* A dead source is refused. */
    uint8_t alive[8] = {1, 1, 1, 1, 1, 1, 1, 1};
    cr_assert(p->items[p->n - 1].src != p->items[p->n - 1].dst);
    alive[p->items[p->n - 1].src] = 0;
    cr_expect_eq(tide_plan_validate(o, n, c, alive, 8, p), TIDE_ERR_INVALID);
    cr_expect(strstr(tide_last_error(), "dead") != NULL, "%s", tide_last_error());
    /* A duplicated item writes bytes twice (and breaks the order). */
    tide_xfer *items = realloc(p->items, (p->n + 1) * sizeof *items);
    p->items = items;
    p->items[p->n] = p->items[p->n - 1];
    p->n++;
    cr_expect_eq(tide_plan_validate(o, n, c, NULL, 0, p), TIDE_ERR_INVALID);
    p->n--;
    cr_expect_eq(tide_plan_validate(o, n, c, NULL, 0, p), TIDE_OK, "%s", tide_last_error());
    tide_plan_destroy(&p);
    tide_layout_destroy(&o);
    tide_layout_destroy(&n);
    tide_collection_destroy(&c);
}
