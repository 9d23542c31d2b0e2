/*
 * Unit tests for reshard/, one executable (test_reshard) in four sources. This one: reshard
 * plans checked by property tests over thousands of random (collection, old layout, new
 * layout, worker map, live set) cases against a brute-force byte-level oracle built only
 * from tide_shard_extract/insert. A failing random case prints its seed; rerun with
 * TIDE_TEST_SEED=<base seed> to reproduce. The others: test_reshard_hand.c (hand-checked
 * plans, the plan validator), test_reshard_layout.c (layouts and their validation
 * messages, collections, shard geometry), test_reshard_alloc.c (allocation failures);
 * tests/reshard_fixture.h holds what they share.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "reshard/reshard.h"
#include "tests/support/plan_check.h"
#include "tests/reshard_fixture.h"

/* ---- helpers -------------------------------------------------------------------------- */

static int rnd(uint64_t *s, int n)
{
    return (int)(splitmix(s) % (uint64_t)n);
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
