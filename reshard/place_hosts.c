/*
 * Placement, regime 2: a TP group must sit inside one host, so hosts take whole groups
 * ("slots" of tp workers). Hosts with the same workers' old classes are interchangeable
 * (host classes); a host's value for a set of groups is an exact assignment of its
 * workers to their roles (Hungarian, cached per class and set). Every host has at most
 * one slot: transportation from host classes to stages (min-cost flow); several slots:
 * exact dynamic programming over hosts when the demand space is small, else a greedy
 * start refined by slot exchanges. Workload: up to a few thousand workers on hosts of ~8
 * GPUs, once per placement decision.
 */
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "reshard/assign.h"
#include "reshard/place_int.h"

#define NEG_INF         INT64_MIN
#define DP_MAX_CELLS    (1u << 21) /* states x hosts of the exact small-case program */
#define EXCHANGE_ROUNDS 256

/* ---- host values ----------------------------------------------------------------------------- */

/*
 * Value of host h holding the groups of counts[] (per stage): the best
 * assignment of its workers to the roles (p', t') of every group. When
 * assign is given, it receives, per worker of the host, the role or -1.
 */
static tide_status host_value(placer *pl, size_t h, const int *counts, int64_t *value, int *assign)
{
    int hw = (int)(pl->hoff[h + 1] - pl->hoff[h]);
    int rows = 0;
    for (int q = 0; q < pl->npp; q++)
        rows += counts[q] * pl->ntp;
    if (assign)
        for (int k = 0; k < hw; k++)
            assign[k] = -1;
    if (rows == 0) {
        *value = 0;
        return TIDE_OK;
    }
    if (rows > hw)
        return tide_errorf(TIDE_ERR_INTERNAL, "placement: host %zu given %d roles for %d workers",
                           h, rows, hw);
    tide_status rc = TIDE_OK;
    int64_t *g = tide_calloc((size_t)rows * (size_t)hw, sizeof *g);
    int *role = tide_calloc((size_t)rows, sizeof *role), *a = tide_calloc((size_t)rows, sizeof *a);
    if (g == NULL || role == NULL || a == NULL) {
        rc = tide_errorf(TIDE_ERR_NOMEM, "out of memory valuing a host");
        goto out;
    }
    int r = 0;
    for (int q = 0; q < pl->npp; q++)
        for (int k = 0; k < counts[q]; k++)
            for (int t = 0; t < pl->ntp; t++)
                role[r++] = q * pl->ntp + t;
    for (r = 0; r < rows; r++)
        for (int k = 0; k < hw; k++)
            g[(size_t)r * (size_t)hw + (size_t)k] =
                gain(pl, &pl->w[pl->hoff[h] + (size_t)k], role[r]);
    TIDE_CHECK_GOTO(tide__assign_max(g, rows, hw, a, value), rc, out);
    if (assign)
        for (r = 0; r < rows; r++)
            assign[a[r]] = role[r];
out:
    tide_free(g);
    tide_free(role);
    tide_free(a);
    return rc;
}

/* Config key: up to 8 groups with stages < 255, as sorted bytes; 0 when not encodable. */
static uint64_t cfg_key(const placer *pl, int cls, const int *counts)
{
    uint64_t key = 0;
    int n = 0;
    for (int q = 0; q < pl->npp; q++)
        for (int k = 0; k < counts[q]; k++) {
            if (n == 7 || q >= 255)
                return 0;
            key = (key << 8) | (uint64_t)(q + 1);
            n++;
        }
    return (key << 8 | (uint64_t)n) ^ ((uint64_t)(cls + 1) << 40) ^ (UINT64_C(1) << 63);
}

/* host_value through a cache keyed by (host class, config). */
static tide_status class_value(placer *pl, size_t h, const int *counts, int64_t *value)
{
    uint64_t key = cfg_key(pl, pl->hclass[h], counts);
    if (key == 0)
        return host_value(pl, (size_t)pl->hrep[pl->hclass[h]], counts, value, NULL);
    if ((pl->cache_n + 1) * 2 > pl->cache_cap) {
        size_t cap = pl->cache_cap ? pl->cache_cap * 2 : 1024;
        cache_ent *grown = pc_calloc(pl, cap, sizeof *grown);
        if (grown == NULL)
            return tide_errorf(TIDE_ERR_NOMEM, "out of memory growing the placement cache");
        for (size_t k = 0; k < pl->cache_cap; k++) {
            if (pl->cache[k].key == 0)
                continue;
            size_t at = (size_t)(pl->cache[k].key * UINT64_C(0x9e3779b97f4a7c15) >> 20) & (cap - 1);
            while (grown[at].key != 0)
                at = (at + 1) & (cap - 1);
            grown[at] = pl->cache[k];
        }
        tide_free(pl->cache);
        pl->cache = grown;
        pl->cache_cap = cap;
    }
    size_t at = (size_t)(key * UINT64_C(0x9e3779b97f4a7c15) >> 20) & (pl->cache_cap - 1);
    while (pl->cache[at].key != 0) {
        if (pl->cache[at].key == key) {
            *value = pl->cache[at].value;
            return TIDE_OK;
        }
        at = (at + 1) & (pl->cache_cap - 1);
    }
    TIDE_CHECK(host_value(pl, (size_t)pl->hrep[pl->hclass[h]], counts, value, NULL));
    pl->cache[at].key = key;
    pl->cache[at].value = *value;
    pl->cache_n++;
    return TIDE_OK;
}

/* ---- regime 2: hosts take whole TP groups -------------------------------------------------------
 */

static _Thread_local const placer *sort_pl; /* qsort has no context argument */

/* Hosts compare by (slots, size, sorted old classes): equal signatures are interchangeable. */
static int host_sig_cmp(const placer *pl, size_t x, size_t y)
{
    if (pl->slots[x] != pl->slots[y])
        return pl->slots[x] < pl->slots[y] ? -1 : 1;
    size_t nx = pl->hoff[x + 1] - pl->hoff[x], ny = pl->hoff[y + 1] - pl->hoff[y];
    if (nx != ny)
        return nx < ny ? -1 : 1;
    for (size_t k = 0; k < nx; k++) {
        int a = pl->hsig[pl->hoff[x] + k], b = pl->hsig[pl->hoff[y] + k];
        if (a != b)
            return a < b ? -1 : 1;
    }
    return 0;
}

static int cmp_host(const void *a, const void *b)
{
    size_t x = *(const size_t *)a, y = *(const size_t *)b;
    int r = host_sig_cmp(sort_pl, x, y);
    return r != 0 ? r : (x > y) - (x < y);
}

static int cmp_int(const void *a, const void *b)
{
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

static tide_status host_classes(placer *pl)
{
    pl->hsig = pc_calloc(pl, pl->nw, sizeof *pl->hsig);
    size_t *order = pc_calloc(pl, pl->nh, sizeof *order);
    pl->hclass = pc_calloc(pl, pl->nh, sizeof *pl->hclass);
    pl->hrep = pc_calloc(pl, pl->nh, sizeof *pl->hrep);
    if (pl->hsig == NULL || order == NULL || pl->hclass == NULL || pl->hrep == NULL) {
        tide_free(order);
        return tide_errorf(TIDE_ERR_NOMEM, "out of memory classifying hosts");
    }
    for (size_t x = 0; x < pl->nw; x++)
        pl->hsig[x] = pl->w[x].op < 0 ? -1 : pl->w[x].op * pl->otp + pl->w[x].ot;
    for (size_t h = 0; h < pl->nh; h++) {
        qsort(pl->hsig + pl->hoff[h], pl->hoff[h + 1] - pl->hoff[h], sizeof *pl->hsig, cmp_int);
        order[h] = h;
    }
    sort_pl = pl;
    qsort(order, pl->nh, sizeof *order, cmp_host);
    pl->nhcls = 0;
    for (size_t k = 0; k < pl->nh; k++) {
        size_t h = order[k];
        if (k == 0 || host_sig_cmp(pl, order[k - 1], h) != 0)
            pl->hrep[pl->nhcls++] = (int)h;
        pl->hclass[h] = pl->nhcls - 1;
    }
    tide_free(order);
    return TIDE_OK;
}

/* Every host takes at most one group: transportation from host classes to stages. */
static tide_status slots_by_flow(placer *pl)
{
    tide_status rc = TIDE_OK;
    int nc = pl->nhcls, s = nc + pl->npp, t = s + 1;
    int64_t *count = pc_calloc(pl, (size_t)nc, sizeof *count);
    int *edge = pc_calloc(pl, (size_t)nc * (size_t)pl->npp, sizeof *edge);
    int *one = pc_calloc(pl, (size_t)pl->npp, sizeof *one);
    tide__flow f;
    memset(&f, 0, sizeof f);
    if (count == NULL || edge == NULL || one == NULL) {
        rc = tide_errorf(TIDE_ERR_NOMEM, "out of memory placing groups on hosts");
        goto out;
    }
    for (size_t h = 0; h < pl->nh; h++)
        count[pl->hclass[h]] += pl->slots[h] > 0;
    TIDE_CHECK_GOTO(tide__flow_init(&f, t + 1, nc * pl->npp + nc + pl->npp), rc, out);
    for (int k = 0; k < nc; k++)
        if (count[k] > 0)
            tide__flow_edge(&f, s, k, count[k], 0);
    for (int k = 0; k < nc; k++) {
        if (count[k] == 0)
            continue;
        for (int q = 0; q < pl->npp; q++) {
            int64_t v;
            one[q] = 1;
            TIDE_CHECK_GOTO(class_value(pl, (size_t)pl->hrep[k], one, &v), rc, out);
            one[q] = 0;
            edge[k * pl->npp + q] = tide__flow_edge(&f, k, nc + q, count[k], -v);
        }
    }
    for (int q = 0; q < pl->npp; q++)
        tide__flow_edge(&f, nc + q, t, pl->ndp, 0);
    int64_t got = 0;
    TIDE_CHECK_GOTO(tide__flow_run(&f, s, t, pl->groups, &got), rc, out);
    if (got != pl->groups)
        TIDE_FAIL_GOTO(rc, out, TIDE_ERR_INTERNAL, "placement: host flow %lld of %d",
                       (long long)got, pl->groups);
    /* Hosts of a class take its stages in host order; a host whose own old stage is among
     * them keeps it (ties towards old roles). */
    for (size_t h = 0; h < pl->nh; h++) {
        if (pl->slots[h] == 0)
            continue;
        int k = pl->hclass[h];
        int pick = -1;
        int own = pl->w[pl->hoff[h]].op;
        if (own >= 0 && own < pl->npp && f.cap[edge[k * pl->npp + own] ^ 1] > 0)
            pick = own;
        for (int q = 0; q < pl->npp && pick < 0; q++)
            if (f.cap[edge[k * pl->npp + q] ^ 1] > 0)
                pick = q;
        if (pick >= 0) {
            f.cap[edge[k * pl->npp + pick] ^ 1]--;
            pl->cfg[h * (size_t)pl->npp + (size_t)pick] = 1;
        }
    }
out:
    tide__flow_clear(&f);
    tide_free(count);
    tide_free(edge);
    tide_free(one);
    return rc;
}

/* Enumerates multisets of stages of size <= slots as count vectors (k per row). */
static int enum_cfgs(int npp, int slots, int *out, int cap)
{
    int n = 0;
    /* Iterative odometer over non-increasing stage sequences of each length. */
    for (int len = 0; len <= slots; len++) {
        int seq[16];
        if (len > 16)
            return -1;
        for (int k = 0; k < len; k++)
            seq[k] = 0;
        for (;;) {
            if (n == cap)
                return -1;
            memset(&out[(size_t)n * (size_t)npp], 0, (size_t)npp * sizeof *out);
            for (int k = 0; k < len; k++)
                out[(size_t)n * (size_t)npp + (size_t)seq[k]]++;
            n++;
            int k = len - 1;
            while (k >= 0 && seq[k] == npp - 1)
                k--;
            if (k < 0)
                break;
            seq[k]++;
            for (int j = k + 1; j < len; j++)
                seq[j] = seq[k];
        }
    }
    return n;
}

/* The exact program's tables: configurations (multisets of stages a host may take, as
   count vectors), their values per host class, and the best value per (host, state). */
typedef struct dprog {
    uint64_t radix, states; /* state: groups still needed per stage, mixed radix dp + 1 */
    int maxs, ncfg;
    int *cfgs;       /* [ncfg][npp] */
    uint64_t *delta; /* [ncfg]: what a configuration takes off a state */
    int64_t *val;    /* [nhcls][ncfg]: value, NEG_INF where it does not fit the class's slots */
    int64_t *best;   /* [nh + 1][states]: best value after hosts 0..h-1 */
    int32_t *from;   /* [nh + 1][states]: the configuration that reached it */
    int *digits;     /* [npp]: scratch */
} dprog;

static void dprog_clear(dprog *d)
{
    tide_free(d->cfgs);
    tide_free(d->best);
    tide_free(d->from);
    tide_free(d->val);
    tide_free(d->delta);
    tide_free(d->digits);
}

/* Whether the program fits DP_MAX_CELLS (states x hosts) and 16 slots a host. */
static int dprog_small(const placer *pl, dprog *d)
{
    d->radix = (uint64_t)pl->ndp + 1;
    d->states = 1;
    for (int q = 0; q < pl->npp; q++) {
        d->states *= d->radix;
        if (d->states > DP_MAX_CELLS)
            return 0;
    }
    d->maxs = 0;
    for (size_t h = 0; h < pl->nh; h++)
        d->maxs = pl->slots[h] > d->maxs ? pl->slots[h] : d->maxs;
    return d->maxs <= 16 && d->states * (pl->nh + 1) <= DP_MAX_CELLS;
}

/* The configurations, what each takes off a state, and their values per host class;
   d->ncfg stays 0 (not attempted) when there are too many configurations. */
static tide_status dprog_tables(placer *pl, dprog *d)
{
    int cap = 4096;
    d->cfgs = pc_calloc(pl, (size_t)cap * (size_t)pl->npp, sizeof *d->cfgs);
    d->best = pc_calloc(pl, (size_t)(d->states * (pl->nh + 1)), sizeof *d->best);
    d->from = pc_calloc(pl, (size_t)(d->states * (pl->nh + 1)), sizeof *d->from);
    d->digits = pc_calloc(pl, (size_t)pl->npp, sizeof *d->digits);
    if (!d->cfgs || !d->best || !d->from || !d->digits)
        return tide_errorf(TIDE_ERR_NOMEM, "out of memory in the placement program");
    int ncfg = enum_cfgs(pl->npp, d->maxs, d->cfgs, cap);
    if (ncfg < 0)
        return TIDE_OK; /* too many configurations: not attempted */
    d->val = pc_calloc(pl, (size_t)ncfg * (size_t)pl->nhcls, sizeof *d->val);
    d->delta = pc_calloc(pl, (size_t)ncfg, sizeof *d->delta);
    if (!d->val || !d->delta)
        return tide_errorf(TIDE_ERR_NOMEM, "out of memory in the placement program");
    for (int k = 0; k < ncfg; k++) {
        uint64_t x = 0, m = 1;
        for (int q = 0; q < pl->npp; q++, m *= d->radix)
            x += (uint64_t)d->cfgs[(size_t)k * (size_t)pl->npp + (size_t)q] * m;
        d->delta[k] = x;
    }
    /* Values per (host class, config) that fits the class's slots. */
    for (int hc = 0; hc < pl->nhcls; hc++) {
        size_t h = (size_t)pl->hrep[hc];
        for (int k = 0; k < ncfg; k++) {
            int size = 0;
            for (int q = 0; q < pl->npp; q++)
                size += d->cfgs[(size_t)k * (size_t)pl->npp + (size_t)q];
            int64_t *v = &d->val[(size_t)hc * (size_t)ncfg + (size_t)k];
            if (size > pl->slots[h]) {
                *v = NEG_INF;
                continue;
            }
            TIDE_CHECK(class_value(pl, h, &d->cfgs[(size_t)k * (size_t)pl->npp], v));
        }
    }
    d->ncfg = ncfg;
    return TIDE_OK;
}

/* Host h's step of the program: every configuration that fits each reachable state. */
static void dprog_host(const placer *pl, dprog *d, size_t h)
{
    int hc = pl->hclass[h], ncfg = d->ncfg;
    for (uint64_t st = 0; st < d->states; st++) {
        int64_t b = d->best[h * d->states + st];
        if (b == NEG_INF)
            continue;
        uint64_t rem = st;
        for (int q = 0; q < pl->npp; q++) {
            d->digits[q] = (int)(rem % d->radix);
            rem /= d->radix;
        }
        for (int k = 0; k < ncfg; k++) {
            int64_t v = d->val[(size_t)hc * (size_t)ncfg + (size_t)k];
            if (v == NEG_INF)
                continue;
            int fits = 1;
            for (int q = 0; q < pl->npp && fits; q++)
                fits = d->cfgs[(size_t)k * (size_t)pl->npp + (size_t)q] <= d->digits[q];
            if (!fits)
                continue;
            uint64_t ns = st - d->delta[k];
            int64_t *cell = &d->best[(h + 1) * d->states + ns];
            if (b + v > *cell) {
                *cell = b + v;
                d->from[(h + 1) * d->states + ns] = k;
            }
        }
    }
}

/*
 * Exact dynamic program over hosts when the demand space is small: state =
 * groups still needed per stage (mixed radix dp + 1); each host picks one
 * multiset of stages that fits its slots. *done stays 0 (not attempted) when too big.
 */
static tide_status slots_by_dp(placer *pl, int *done)
{
    *done = 0;
    dprog d;
    memset(&d, 0, sizeof d);
    if (!dprog_small(pl, &d))
        return TIDE_OK;
    tide_status rc = TIDE_OK;
    TIDE_CHECK_GOTO(dprog_tables(pl, &d), rc, out);
    if (d.ncfg == 0)
        goto out; /* too many configurations: not attempted */
    for (uint64_t x = 0; x < d.states * (pl->nh + 1); x++)
        d.best[x] = NEG_INF;
    d.best[d.states - 1] = 0; /* every digit at dp: all groups still needed */
    for (size_t h = 0; h < pl->nh; h++)
        dprog_host(pl, &d, h);
    if (d.best[pl->nh * d.states] == NEG_INF)
        TIDE_FAIL_GOTO(rc, out, TIDE_ERR_INTERNAL, "placement: no host assignment found");
    uint64_t st = 0;
    for (size_t h = pl->nh; h-- > 0;) {
        int k = d.from[(h + 1) * d.states + st];
        memcpy(&pl->cfg[h * (size_t)pl->npp], &d.cfgs[(size_t)k * (size_t)pl->npp],
               (size_t)pl->npp * sizeof *pl->cfg);
        st += d.delta[k];
    }
    *done = 1;
out:
    dprog_clear(&d);
    return rc;
}

/* Value of host h's current config plus `add` of stage a and minus `sub` of stage b. */
static tide_status value_with(placer *pl, size_t h, int add, int sub, int64_t *v)
{
    int *cfg = &pl->cfg[h * (size_t)pl->npp];
    if (add >= 0)
        cfg[add]++;
    if (sub >= 0)
        cfg[sub]--;
    tide_status rc = class_value(pl, h, cfg, v);
    if (add >= 0)
        cfg[add]--;
    if (sub >= 0)
        cfg[sub]++;
    return rc;
}

static int used_slots(const placer *pl, size_t h)
{
    int n = 0;
    for (int q = 0; q < pl->npp; q++)
        n += pl->cfg[h * (size_t)pl->npp + (size_t)q];
    return n;
}

/* Large hosts with several slots: greedy by marginal value, then improving exchanges. */
static tide_status slots_by_search(placer *pl)
{
    int *rem = pc_calloc(pl, (size_t)pl->npp, sizeof *rem);
    if (rem == NULL)
        return tide_errorf(TIDE_ERR_NOMEM, "out of memory placing groups");
    tide_status rc = TIDE_OK;
    for (int q = 0; q < pl->npp; q++)
        rem[q] = pl->ndp;
    for (int g = 0; g < pl->groups; g++) {
        int64_t bd = NEG_INF;
        size_t bh = 0;
        int bq = -1;
        for (size_t h = 0; h < pl->nh; h++) {
            if (used_slots(pl, h) >= pl->slots[h])
                continue;
            int64_t base;
            TIDE_CHECK_GOTO(class_value(pl, h, &pl->cfg[h * (size_t)pl->npp], &base), rc, out);
            for (int q = 0; q < pl->npp; q++) {
                if (rem[q] == 0)
                    continue;
                int64_t v;
                TIDE_CHECK_GOTO(value_with(pl, h, q, -1, &v), rc, out);
                if (v - base > bd) {
                    bd = v - base;
                    bh = h;
                    bq = q;
                }
            }
        }
        if (bq < 0)
            TIDE_FAIL_GOTO(rc, out, TIDE_ERR_INTERNAL, "placement: no slot left for a group");
        pl->cfg[bh * (size_t)pl->npp + (size_t)bq]++;
        rem[bq]--;
    }
    /* Exchanges: move a group to a free slot or swap two groups of different stages. */
    for (int round = 0; round < EXCHANGE_ROUNDS; round++) {
        int improved = 0;
        for (size_t a = 0; a < pl->nh && !improved; a++) {
            int64_t va;
            TIDE_CHECK_GOTO(class_value(pl, a, &pl->cfg[a * (size_t)pl->npp], &va), rc, out);
            for (size_t b = 0; b < pl->nh && !improved; b++) {
                if (a == b || pl->slots[b] == 0)
                    continue;
                int64_t vb;
                TIDE_CHECK_GOTO(class_value(pl, b, &pl->cfg[b * (size_t)pl->npp], &vb), rc, out);
                int bfree = used_slots(pl, b) < pl->slots[b];
                for (int qa = 0; qa < pl->npp && !improved; qa++) {
                    if (pl->cfg[a * (size_t)pl->npp + (size_t)qa] == 0)
                        continue;
                    for (int qb = bfree ? -1 : 0; qb < pl->npp && !improved; qb++) {
                        if (qb == qa || (qb >= 0 && pl->cfg[b * (size_t)pl->npp + (size_t)qb] == 0))
                            continue;
                        int64_t na, nb;
                        TIDE_CHECK_GOTO(value_with(pl, a, qb, qa, &na), rc, out);
                        TIDE_CHECK_GOTO(value_with(pl, b, qa, qb, &nb), rc, out);
                        if (na + nb > va + vb) {
                            pl->cfg[a * (size_t)pl->npp + (size_t)qa]--;
                            pl->cfg[b * (size_t)pl->npp + (size_t)qa]++;
                            if (qb >= 0) {
                                pl->cfg[b * (size_t)pl->npp + (size_t)qb]--;
                                pl->cfg[a * (size_t)pl->npp + (size_t)qb]++;
                            }
                            improved = 1;
                        }
                    }
                }
            }
        }
        if (!improved)
            break;
    }
out:
    tide_free(rem);
    return rc;
}

/* Turns each host's config into worker roles (exact per-host assignment). */
static tide_status realize_hosts(placer *pl)
{
    size_t maxw = 0;
    for (size_t h = 0; h < pl->nh; h++)
        maxw = pl->hoff[h + 1] - pl->hoff[h] > maxw ? pl->hoff[h + 1] - pl->hoff[h] : maxw;
    int *assign = pc_calloc(pl, maxw, sizeof *assign);
    if (assign == NULL)
        return tide_errorf(TIDE_ERR_NOMEM, "out of memory assigning roles");
    tide_status rc = TIDE_OK;
    for (size_t h = 0; h < pl->nh; h++) {
        int64_t v;
        TIDE_CHECK_GOTO(host_value(pl, h, &pl->cfg[h * (size_t)pl->npp], &v, assign), rc, out);
        for (size_t k = 0; k < pl->hoff[h + 1] - pl->hoff[h]; k++)
            pl->wrole[pl->hoff[h] + k] = assign[k];
    }
out:
    tide_free(assign);
    return rc;
}

tide_status tide__place_hosts(placer *pl)
{
    int maxs = 0, done = 0;
    for (size_t h = 0; h < pl->nh; h++)
        maxs = pl->slots[h] > maxs ? pl->slots[h] : maxs;
    TIDE_CHECK(host_classes(pl));
    if (maxs <= 1) {
        TIDE_CHECK(slots_by_flow(pl));
    } else {
        TIDE_CHECK(slots_by_dp(pl, &done));
        if (!done)
            TIDE_CHECK(slots_by_search(pl));
    }
    return realize_hosts(pl);
}
