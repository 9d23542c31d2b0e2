/*
 * Unit tests for placement (tide_reshard_place): on small clusters the chosen
 * map's bytes equal the minimum over every valid map (an exhaustive search
 * done as a dynamic program over sets of used workers, from byte-level holder
 * marks that never touch the planner); shrinking DP sends nothing, growing it
 * sends one replica per new replica, (16, 8, 8) -> (12, 8, 8) sends nothing;
 * TP groups stay inside a host when one can hold them; random cases are valid
 * and never worse than the default rank order. Seeds print on failure
 * (TIDE_TEST_SEED=<base> reruns them).
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/clock.h"
#include "core/error.h"
#include "reshard/reshard.h"

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

static uint64_t base_seed(void)
{
    const char *e = getenv("TIDE_TEST_SEED");
    return e ? strtoull(e, NULL, 0) : UINT64_C(77001);
}

static void coord(const tide_layout_t *l, size_t j, int *p, int *d, int *t)
{
    *t = (int)(j % (size_t)l->tp);
    *d = (int)(j / (size_t)l->tp % (size_t)l->dp);
    *p = (int)(j / ((size_t)l->tp * l->dp));
}

static uint64_t bytes_of(const tide_layout_t *o, const tide_layout_t *n, const tide_collection_t *c)
{
    uint64_t b = 0;
    cr_assert_eq(tide_reshard_lower_bound(o, n, c, &b), TIDE_OK, "%s", tide_last_error());
    return b;
}

/* Marks of the global bytes coordinate (p, d, t) of l holds of tensor i. */
static unsigned char *marks(const tide_layout_t *l, const tide_collection_t *c, size_t i, int p,
                            int d, int t)
{
    uint64_t b = tide_tensor_bytes(tide_collection_tensor(c, i));
    unsigned char *m = calloc(1, b);
    uint64_t sz = tide_shard_bytes(l, c, i, p, d, t);
    if (sz) {
        unsigned char *ones = malloc(sz);
        memset(ones, 1, sz);
        tide_shard_insert(l, c, i, p, d, t, ones, m);
        free(ones);
    }
    return m;
}

/* gain[w][k]: bytes worker w (index into avail) already holds of new coordinate k. */
static uint64_t *oracle_gains(const tide_layout_t *o, const tide_layout_t *n,
                              const tide_collection_t *c, const tide_place_worker *avail, int na,
                              uint64_t *need_total)
{
    size_t nn = tide_layout_size(n), nt = tide_collection_size(c);
    uint64_t *g = calloc((size_t)na * nn, sizeof *g);
    *need_total = 0;
    for (size_t k = 0; k < nn; k++) {
        int p, d, t;
        coord(n, k, &p, &d, &t);
        for (size_t i = 0; i < nt; i++) {
            uint64_t b = tide_tensor_bytes(tide_collection_tensor(c, i));
            unsigned char *need = marks(n, c, i, p, d, t);
            for (uint64_t x = 0; x < b; x++)
                *need_total += need[x];
            for (int w = 0; w < na; w++) {
                int op, od, ot;
                if (o == NULL || tide_layout_find(o, avail[w].id, &op, &od, &ot) != TIDE_OK)
                    continue;
                unsigned char *own = marks(o, c, i, op, od, ot);
                for (uint64_t x = 0; x < b; x++)
                    g[(size_t)w * nn + k] += need[x] && own[x];
                free(own);
            }
            free(need);
        }
    }
    return g;
}

/*
 * The exhaustive optimum: coordinates are filled in index order (tp fastest),
 * each by an unused worker; with host_rule, every member of a TP group shares
 * the host of the group's tp rank 0. memo over (used set, host of the open
 * group) covers every valid map. Returns the largest total gain.
 */
typedef struct search {
    const uint64_t *g;
    const tide_place_worker *w;
    int na, nn, tp, host_rule, nhost;
    int64_t *memo; /* [1 << na][nhost + 1], -1 unknown */
} search;

static int64_t best_from(search *s, uint32_t used, int k, int host)
{
    if (k == s->nn)
        return 0;
    int hk = host < 0 ? s->nhost : host;
    int64_t *m = &s->memo[(size_t)used * (size_t)(s->nhost + 1) + (size_t)hk];
    if (*m >= 0)
        return *m;
    int64_t best = INT64_MIN;
    int t = k % s->tp;
    for (int w = 0; w < s->na; w++) {
        if (used & (1u << w))
            continue;
        if (s->host_rule && t > 0 && s->w[w].host != host)
            continue;
        int nh = t == 0 ? s->w[w].host : host;
        if (t == s->tp - 1)
            nh = -1;
        int64_t r = best_from(s, used | (1u << w), k + 1, nh);
        if (r == INT64_MIN)
            continue;
        r += (int64_t)s->g[(size_t)w * (size_t)s->nn + (size_t)k];
        best = r > best ? r : best;
    }
    *m = best;
    return best;
}

/* Whether hosts have room for every TP group (the rule placement must then obey). */
static int hosts_hold_all(const tide_place_worker *w, int na, int tp, int groups)
{
    int per[64] = {0}, slots = 0;
    for (int k = 0; k < na; k++)
        per[w[k].host]++;
    for (int h = 0; h < 64; h++)
        slots += per[h] / tp;
    return tp > 1 && slots >= groups;
}

/* Every TP group inside one host. */
static int groups_in_hosts(const tide_layout_t *n, const tide_place_worker *w, int na)
{
    for (size_t k = 0; k < tide_layout_size(n); k += (size_t)n->tp) {
        int host = -1;
        for (int t = 0; t < n->tp; t++)
            for (int x = 0; x < na; x++)
                if (w[x].id == n->worker[k + (size_t)t]) {
                    if (host >= 0 && w[x].host != host)
                        return 0;
                    host = w[x].host;
                }
    }
    return 1;
}

/* Every worker of n is one of the available ones. */
static int uses_only(const tide_layout_t *n, const tide_place_worker *w, int na)
{
    for (size_t k = 0; k < tide_layout_size(n); k++) {
        int found = 0;
        for (int x = 0; x < na; x++)
            found |= w[x].id == n->worker[k];
        if (!found)
            return 0;
    }
    return 1;
}

static tide_collection_t *small_collection(uint64_t *s, int layers, int zero)
{
    tide_collection_t *c = NULL;
    cr_assert_eq(tide_collection_new(&c, layers), TIDE_OK);
    int nt = 1 + rnd(s, 4);
    for (int k = 0; k < nt; k++) {
        tide_tensor_desc t;
        memset(&t, 0, sizeof t);
        snprintf(t.name, sizeof t.name, "t%d", k);
        t.dtype = rnd(s, 2) ? TIDE_F32 : TIDE_F16;
        t.ndim = 1 + rnd(s, 2);
        int lr = rnd(s, layers + 3);
        t.layer = lr < layers
                      ? lr
                      : (lr == layers ? TIDE_LAYER_PRE
                                      : (lr == layers + 1 ? TIDE_LAYER_POST : TIDE_LAYER_ALL));
        t.tp = rnd(s, 4) ? TIDE_TP_SPLIT : TIDE_TP_REPLICATED;
        t.tp_segments = t.tp == TIDE_TP_SPLIT ? 1 + rnd(s, 2) : 1;
        t.tp_dim = rnd(s, t.ndim);
        for (int d = 0; d < t.ndim; d++)
            t.shape[d] = 1 + rnd(s, 3);
        if (t.tp == TIDE_TP_SPLIT)
            t.shape[t.tp_dim] = (int64_t)t.tp_segments * 4 * (1 + rnd(s, 2));
        t.dp = zero && rnd(s, 2) ? TIDE_DP_SHARDED : TIDE_DP_REPLICATED;
        cr_assert_eq(tide_collection_add(c, &t), TIDE_OK, "%s", tide_last_error());
    }
    return c;
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

typedef struct pcase {
    tide_collection_t *c;
    tide_layout_t *o;
    tide_place_worker w[16];
    int na;
    tide_place_request rq;
} pcase;

/* A small random case: old layout over a pool, available = some old workers and idle ones. */
static void random_pcase(uint64_t seed, int max_avail, int zero, pcase *pc)
{
    uint64_t s = seed;
    memset(pc, 0, sizeof *pc);
    int layers = 1 + rnd(&s, 4);
    pc->c = small_collection(&s, layers, zero);
    static const int tps[] = {1, 2, 4};
    int dp, tp, pp;
    do {
        dp = 1 + rnd(&s, 3);
        tp = tps[rnd(&s, 3)];
        pp = 1 + rnd(&s, layers < 3 ? layers : 3);
    } while (dp * tp * pp > max_avail);
    cr_assert_eq(tide_layout_new(&pc->o, dp, tp, pp, layers, 1), TIDE_OK);
    int no = dp * tp * pp, pool = 20;
    int32_t ids[20];
    for (int k = 0; k < pool; k++)
        ids[k] = k;
    if (rnd(&s, 2))
        shuffle(ids, pool, &s);
    memcpy(pc->o->worker, ids, (size_t)no * sizeof *ids);
    /* New degrees. */
    int ndp, ntp, npp;
    do {
        ndp = 1 + rnd(&s, 3);
        ntp = tps[rnd(&s, 3)];
        npp = 1 + rnd(&s, layers < 3 ? layers : 3);
    } while (ndp * ntp * npp > max_avail);
    int need = ndp * ntp * npp;
    /* Available: a random subset of old workers (some lost) plus idle ones, up to max_avail. */
    int na = need + rnd(&s, max_avail - need + 1);
    shuffle(ids, pool, &s);
    pc->na = na;
    int host_size = 1 + rnd(&s, 4);
    for (int k = 0; k < na; k++) {
        pc->w[k].id = ids[k];
        pc->w[k].host = rnd(&s, 3) ? ids[k] / host_size : rnd(&s, 4);
    }
    pc->rq.dp = ndp;
    pc->rq.tp = ntp;
    pc->rq.pp = npp;
    pc->rq.micro_batches = 1;
    pc->rq.workers = pc->w;
    pc->rq.n_workers = (size_t)na;
    pc->rq.tp_across_hosts = rnd(&s, 5) == 0;
}

static void free_pcase(pcase *pc)
{
    tide_collection_destroy(&pc->c);
    tide_layout_destroy(&pc->o);
}

/* Default rank order over the available workers sorted by id. */
static tide_layout_t *default_map(const pcase *pc)
{
    tide_place_worker sorted[16];
    memcpy(sorted, pc->w, (size_t)pc->na * sizeof *sorted);
    for (int a = 0; a < pc->na; a++)
        for (int b = a + 1; b < pc->na; b++)
            if (sorted[b].id < sorted[a].id) {
                tide_place_worker t = sorted[a];
                sorted[a] = sorted[b];
                sorted[b] = t;
            }
    tide_place_request rq = pc->rq;
    rq.workers = sorted;
    tide_layout_t *l = NULL;
    cr_assert_eq(tide_reshard_place_default(pc->c, &rq, &l), TIDE_OK, "%s", tide_last_error());
    return l;
}

/*
 * The host rule applies (tp > 1, not allowed across hosts) and the hosts lack
 * room: placement must refuse with the counts, never split a group. Returns
 * whether the case was such a refusal (checked here).
 */
static int refused_without_room(const pcase *pc, tide_status rc, const tide_layout_t *n,
                                uint64_t seed)
{
    int groups = pc->rq.dp * pc->rq.pp;
    if (pc->rq.tp_across_hosts || pc->rq.tp == 1 ||
        hosts_hold_all(pc->w, pc->na, pc->rq.tp, groups))
        return 0;
    cr_assert_eq(rc, TIDE_ERR_NO_DEVICE, "seed %llu: no room for %d TP groups, got %s",
                 (unsigned long long)seed, groups, tide_status_name(rc));
    cr_assert_null(n);
    char want[64];
    snprintf(want, sizeof want, "needs %d TP groups of %d workers", groups, pc->rq.tp);
    cr_assert(strstr(tide_last_error(), want) != NULL &&
                  strstr(tide_last_error(), "allow TP groups across hosts") != NULL,
              "seed %llu: %s", (unsigned long long)seed, tide_last_error());
    return 1;
}

static void exhaustive_case(uint64_t seed, int max_avail, int *checked)
{
    pcase pc;
    random_pcase(seed, max_avail, 0, &pc);
    tide_layout_t *n = NULL;
    tide_status rc = tide_reshard_place(pc.o, pc.c, &pc.rq, &n);
    if (refused_without_room(&pc, rc, n, seed)) {
        free_pcase(&pc);
        return;
    }
    cr_assert_eq(rc, TIDE_OK, "seed %llu: %s", (unsigned long long)seed, tide_last_error());
    cr_assert_eq(tide_layout_validate(n, pc.c), TIDE_OK, "seed %llu", (unsigned long long)seed);
    cr_assert(uses_only(n, pc.w, pc.na), "seed %llu: uses an unavailable worker",
              (unsigned long long)seed);
    int rule = !pc.rq.tp_across_hosts && hosts_hold_all(pc.w, pc.na, pc.rq.tp, pc.rq.dp * pc.rq.pp);
    if (rule)
        cr_assert(groups_in_hosts(n, pc.w, pc.na), "seed %llu: a TP group spans hosts",
                  (unsigned long long)seed);
    /* Exhaustive optimum over valid maps. */
    uint64_t need = 0;
    uint64_t *g = oracle_gains(pc.o, n, pc.c, pc.w, pc.na, &need);
    int nhost = 0;
    for (int k = 0; k < pc.na; k++)
        nhost = pc.w[k].host + 1 > nhost ? pc.w[k].host + 1 : nhost;
    search s = {g, pc.w, pc.na, (int)tide_layout_size(n), pc.rq.tp, rule, nhost, NULL};
    size_t cells = ((size_t)1 << pc.na) * (size_t)(nhost + 1);
    s.memo = malloc(cells * sizeof *s.memo);
    memset(s.memo, 0xff, cells * sizeof *s.memo);
    int64_t best = best_from(&s, 0, 0, -1);
    cr_assert(best >= 0, "seed %llu: no valid map found", (unsigned long long)seed);
    uint64_t got = bytes_of(pc.o, n, pc.c);
    cr_assert_eq(got, need - (uint64_t)best,
                 "seed %llu: placement sends %llu bytes, the exhaustive minimum is %llu "
                 "((dp %d, tp %d, pp %d), %d workers, host rule %d)",
                 (unsigned long long)seed, (unsigned long long)got,
                 (unsigned long long)(need - (uint64_t)best), pc.rq.dp, pc.rq.tp, pc.rq.pp, pc.na,
                 rule);
    /* Never worse than the default rank order whenever that order is itself valid. */
    tide_layout_t *d = default_map(&pc);
    if (!rule || groups_in_hosts(d, pc.w, pc.na))
        cr_assert_leq(got, bytes_of(pc.o, d, pc.c), "seed %llu", (unsigned long long)seed);
    (*checked)++;
    free(s.memo);
    free(g);
    tide_layout_destroy(&d);
    tide_layout_destroy(&n);
    free_pcase(&pc);
}

Test(place, equals_exhaustive_minimum_up_to_12_workers)
{
    int checked = 0;
    for (int k = 0; k < 300; k++)
        exhaustive_case(base_seed() + (uint64_t)k, 12, &checked);
    cr_log_info("%d small cases matched the exhaustive minimum", checked);
}

Test(place, equals_exhaustive_minimum_at_16_workers)
{
    int checked = 0;
    for (int k = 0; k < 12; k++)
        exhaustive_case(base_seed() + 5000 + (uint64_t)k, 16, &checked);
}

Test(place, random_zero1_cases_are_valid_and_never_worse_than_default)
{
    for (int k = 0; k < 300; k++) {
        uint64_t seed = base_seed() + 9000 + (uint64_t)k;
        pcase pc;
        random_pcase(seed, 16, 1, &pc);
        tide_layout_t *n = NULL, *d = default_map(&pc);
        tide_status rc = tide_reshard_place(pc.o, pc.c, &pc.rq, &n);
        if (refused_without_room(&pc, rc, n, seed)) {
            tide_layout_destroy(&d);
            free_pcase(&pc);
            continue;
        }
        cr_assert_eq(rc, TIDE_OK, "seed %llu: %s", (unsigned long long)seed, tide_last_error());
        cr_assert_eq(tide_layout_validate(n, pc.c), TIDE_OK);
        cr_assert(uses_only(n, pc.w, pc.na));
        int rule =
            !pc.rq.tp_across_hosts && hosts_hold_all(pc.w, pc.na, pc.rq.tp, pc.rq.dp * pc.rq.pp);
        if (rule)
            cr_assert(groups_in_hosts(n, pc.w, pc.na), "seed %llu", (unsigned long long)seed);
        if (!rule || groups_in_hosts(d, pc.w, pc.na))
            cr_assert_leq(bytes_of(pc.o, n, pc.c), bytes_of(pc.o, d, pc.c),
                          "seed %llu: (dp %d, tp %d, pp %d) -> (dp %d, tp %d, pp %d), %d workers, "
                          "rule %d",
                          (unsigned long long)seed, pc.o->dp, pc.o->tp, pc.o->pp, pc.rq.dp,
                          pc.rq.tp, pc.rq.pp, pc.na, rule);
        tide_layout_destroy(&n);
        tide_layout_destroy(&d);
        free_pcase(&pc);
    }
}

/* ---- large structured cases ------------------------------------------------------------------ */

static tide_collection_t *gpt(int layers, int64_t hidden, int zero)
{
    tide_model_spec s = {.layers = layers,
                         .hidden = hidden,
                         .heads = 8,
                         .vocab = 64,
                         .attention = 1,
                         .adam = 1,
                         .zero1 = zero,
                         .dtype = TIDE_BF16};
    tide_collection_t *c = NULL;
    cr_assert_eq(tide_collection_build_gpt(&c, &s), TIDE_OK, "%s", tide_last_error());
    return c;
}

/* Workers 0..n-1 on hosts of host_size, as given to placement. */
static tide_place_worker *cluster(int n, int host_size)
{
    tide_place_worker *w = calloc((size_t)n, sizeof *w);
    for (int k = 0; k < n; k++) {
        w[k].id = k;
        w[k].host = k / host_size;
    }
    return w;
}

static tide_layout_t *place(const tide_layout_t *o, const tide_collection_t *c, int dp, int tp,
                            int pp, const tide_place_worker *w, int n)
{
    tide_place_request rq = {dp, tp, pp, 1, NULL, w, (size_t)n, 0};
    tide_layout_t *l = NULL;
    cr_assert_eq(tide_reshard_place(o, c, &rq, &l), TIDE_OK, "%s", tide_last_error());
    cr_assert_eq(tide_layout_validate(l, c), TIDE_OK);
    return l;
}

Test(place, gpt_16_8_8_to_12_8_8_sends_nothing)
{
    tide_collection_t *c = gpt(16, 64, 0);
    tide_layout_t *o = NULL, *d = NULL;
    cr_assert_eq(tide_layout_new(&o, 16, 8, 8, 16, 16), TIDE_OK);
    tide_place_worker *w = cluster(1024, 8);
    uint64_t t0 = tide_now_ns();
    tide_layout_t *n = place(o, c, 12, 8, 8, w, 1024);
    double ms = (double)(tide_now_ns() - t0) / 1e6;
    cr_expect_eq(bytes_of(o, n, c), 0);
    cr_assert(groups_in_hosts(n, w, 1024));
    cr_assert_eq(tide_layout_new(&d, 12, 8, 8, 16, 16), TIDE_OK);
    cr_expect_gt(bytes_of(o, d, c), 4 * tide_collection_bytes(c)); /* the default re-homes stages */
    cr_log_info("(16,8,8)@1024 -> (12,8,8): placed in %.1f ms", ms);
    free(w);
    tide_layout_destroy(&o);
    tide_layout_destroy(&n);
    tide_layout_destroy(&d);
    tide_collection_destroy(&c);
}

/* One new dp replica needs every shard of one dp rank of the new layout. */
static uint64_t replica_bytes(const tide_layout_t *n, const tide_collection_t *c)
{
    uint64_t b = 0;
    for (int p = 0; p < n->pp; p++)
        for (int t = 0; t < n->tp; t++)
            for (size_t i = 0; i < tide_collection_size(c); i++)
                b += tide_shard_bytes(n, c, i, p, 0, t);
    return b;
}

Test(place, shrinking_dp_sends_nothing_and_growing_sends_one_replica_per_new_replica)
{
    uint64_t s = base_seed() + 31;
    for (int k = 0; k < 40; k++) {
        int tp = 1 << rnd(&s, 3), pp = 1 + rnd(&s, 4), dp = 2 + rnd(&s, 4);
        int host = tp << rnd(&s, 3); /* whole TP groups per host: the rule always holds */
        tide_collection_t *c = gpt(4 + 4 * rnd(&s, 2), 32, 0);
        tide_layout_t *o = NULL;
        cr_assert_eq(tide_layout_new(&o, dp, tp, pp, tide_collection_num_layers(c), 1), TIDE_OK);
        if (rnd(&s, 2)) { /* a scrambled old map: whole TP groups (host-aligned) permuted */
            int ng = dp * pp;
            int32_t *perm = calloc((size_t)ng, sizeof *perm);
            for (int g = 0; g < ng; g++)
                perm[g] = g;
            shuffle(perm, ng, &s);
            for (int g = 0; g < ng; g++)
                for (int t = 0; t < tp; t++)
                    o->worker[g * tp + t] = perm[g] * tp + t;
            free(perm);
        }
        int total = (dp + 3) * tp * pp;
        tide_place_worker *w = cluster(total, host);
        /* Shrink: all old workers available. */
        int ndp = 1 + rnd(&s, dp - 1);
        tide_layout_t *n = place(o, c, ndp, tp, pp, w, dp * tp * pp);
        cr_expect_eq(bytes_of(o, n, c), 0, "case %d: shrinking dp %d -> %d sent bytes", k, dp, ndp);
        tide_layout_destroy(&n);
        /* Grow with idle workers. */
        int gdp = dp + 1 + rnd(&s, 3);
        n = place(o, c, gdp, tp, pp, w, total);
        cr_expect_eq(bytes_of(o, n, c), (uint64_t)(gdp - dp) * replica_bytes(n, c),
                     "case %d: growing dp %d -> %d (tp %d, pp %d, hosts of %d)", k, dp, gdp, tp, pp,
                     host);
        tide_layout_destroy(&n);
        free(w);
        tide_layout_destroy(&o);
        tide_collection_destroy(&c);
    }
}

Test(place, keeps_old_roles_and_neighbours_when_nothing_changes)
{
    tide_collection_t *c = gpt(8, 32, 1);
    tide_layout_t *o = NULL;
    cr_assert_eq(tide_layout_new(&o, 4, 2, 4, 8, 4), TIDE_OK);
    tide_place_worker *w = cluster(48, 4);
    tide_layout_t *n = place(o, c, 4, 2, 4, w, 48);
    cr_expect_arr_eq(n->worker, o->worker, tide_layout_size(o) * sizeof *o->worker);
    tide_layout_destroy(&n);
    /* Losing worker 5: an idle worker of its host takes its place, everyone else stays. */
    w[5].id = 100;
    n = place(o, c, 4, 2, 4, w, 48);
    cr_expect(groups_in_hosts(n, w, 48));
    size_t kept = 0;
    for (size_t k = 0; k < tide_layout_size(o); k++)
        kept += n->worker[k] == o->worker[k];
    cr_expect_eq(kept, tide_layout_size(o) - 1);
    cr_expect_eq(n->worker[5], 100);
    tide_layout_destroy(&n);
    free(w);
    tide_layout_destroy(&o);
    tide_collection_destroy(&c);
}

Test(place, tp_groups_stay_inside_hosts_and_errors_are_clear)
{
    tide_collection_t *c = gpt(4, 32, 0);
    tide_layout_t *o = NULL, *n = NULL;
    cr_assert_eq(tide_layout_new(&o, 2, 2, 2, 4, 1), TIDE_OK);
    /* Hosts of 3: a TP group of 2 fits once per host; 4 groups need 4 hosts. */
    tide_place_worker w[12];
    for (int k = 0; k < 12; k++) {
        w[k].id = k;
        w[k].host = k / 3;
    }
    n = place(o, c, 2, 2, 2, w, 12);
    cr_expect(groups_in_hosts(n, w, 12));
    tide_layout_destroy(&n);
    tide_place_request rq = {2, 2, 2, 1, NULL, w, 7, 0};
    cr_expect_eq(tide_reshard_place(o, c, &rq, &n), TIDE_ERR_INVALID);
    cr_expect(strstr(tide_last_error(), "needs 8 workers, 7 are available") != NULL, "%s",
              tide_last_error());
    w[3].id = 2;
    rq.n_workers = 12;
    cr_expect_eq(tide_reshard_place(o, c, &rq, &n), TIDE_ERR_INVALID);
    cr_expect(strstr(tide_last_error(), "worker 2 is listed twice") != NULL, "%s",
              tide_last_error());
    w[3].id = 3;
    rq.tp = 3;
    cr_expect_eq(tide_reshard_place(o, c, &rq, &n), TIDE_ERR_INVALID);
    cr_expect(strstr(tide_last_error(), "tp=3 does not divide") != NULL, "%s", tide_last_error());
    rq.tp = 2;
    cr_expect_null(n);
    /* Hosts of 3 have room for one group of 2 each: 7 hosts' worth of groups does not fit
     * in 12 workers on 4 hosts, and placement refuses rather than split a group. */
    rq.dp = 4;
    rq.pp = 1;
    rq.n_workers = 12;
    cr_expect_eq(tide_reshard_place(NULL, c, &rq, &n), TIDE_OK, "%s", tide_last_error());
    tide_layout_destroy(&n);
    rq.dp = 5;
    cr_expect_eq(tide_reshard_place(NULL, c, &rq, &n), TIDE_ERR_NO_DEVICE);
    cr_expect(strstr(tide_last_error(), "needs 5 TP groups of 2 workers, each inside one host; "
                                        "the hosts of the 12 available workers have room for 4") !=
                  NULL,
              "%s", tide_last_error());
    cr_expect_null(n);
    rq.tp_across_hosts = 1; /* the job allowed it */
    cr_expect_eq(tide_reshard_place(NULL, c, &rq, &n), TIDE_OK, "%s", tide_last_error());
    tide_layout_destroy(&n);
    rq.tp_across_hosts = 0;
    rq.dp = 2;
    rq.pp = 2;
    /* A fresh job (no old layout). */
    cr_assert_eq(tide_reshard_place(NULL, c, &rq, &n), TIDE_OK, "%s", tide_last_error());
    cr_expect(groups_in_hosts(n, w, 12));
    tide_layout_destroy(&n);
    tide_layout_destroy(&o);
    tide_collection_destroy(&c);
}

Test(place, allocation_failures_are_nomem_without_leaks)
{
    tide_collection_t *c = gpt(4, 32, 1);
    tide_layout_t *o = NULL;
    cr_assert_eq(tide_layout_new(&o, 4, 2, 2, 4, 1), TIDE_OK);
    tide_place_worker *w = cluster(24, 4);
    for (int variant = 0; variant < 3; variant++) {
        tide_place_request rq = {variant == 2 ? 3 : 2, variant == 1 ? 1 : 2, 2, 1, NULL, w, 24, 0};
        int failed = 0;
        for (long k = 1;; k++) {
            tide_layout_t *n = NULL;
            tide_alloc_fail_at(k, 0);
            tide_status rc = tide_reshard_place(o, c, &rq, &n);
            tide_alloc_fail_at(0, 0);
            if (rc == TIDE_OK) {
                tide_layout_destroy(&n);
                break;
            }
            cr_assert_eq(rc, TIDE_ERR_NOMEM, "variant %d allocation %ld: %s", variant, k,
                         tide_last_error());
            cr_assert_null(n);
            failed++;
        }
        cr_expect(failed > 5);
    }
    free(w);
    tide_layout_destroy(&o);
    tide_collection_destroy(&c);
}
