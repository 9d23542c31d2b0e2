/*
 * Placement: which available worker takes each coordinate of a new layout,
 * so that the reshard plan moves the fewest bytes. Workload: up to a few
 * thousand workers on hosts of ~8 GPUs, called once per resize or recovery
 * by the coordinator (goal < 100 ms at 1,024 workers).
 *
 * Model. A plan sends, for every new coordinate, the bytes it needs minus the
 * bytes its worker already holds; so placement maximises the total *gain*
 * (bytes kept in place). For DP-replicated state the gain of a worker for a
 * new role (stage p', tp rank t') depends only on its old (p, t): a small
 * matrix R[(p, t)][(p', t')]. Workers are thus interchangeable within a class,
 * and so are hosts with the same multiset of classes. ZeRO-1 state adds a
 * term that depends on dp ranks; it is matched last, stage by stage.
 *
 * A TP group must sit inside one host unless the request allows otherwise,
 * i.e. a host takes whole groups ("slots" of tp workers); too few slots is
 * an error, never a silent split. Regimes:
 *  - hosts do not constrain (tp = 1 or tp_across_hosts):
 *    a transportation problem from worker classes to roles (min-cost flow);
 *  - every host has at most one slot: transportation from host classes to
 *    stages, the value of a host for a stage being an exact assignment of its
 *    workers to the stage's tp ranks (Hungarian);
 *  - hosts with several slots: exact dynamic programming over hosts when the
 *    demand space is small, else a greedy start refined by slot exchanges.
 * Gains are scaled (bytes * ks + ties) so that, among maps of equal bytes,
 * workers keep their old (p, t). Then each stage's groups are matched to dp
 * ranks (Hungarian): ZeRO-1 bytes first, then pipeline neighbours on the same
 * or adjacent host, then old dp ranks.
 *
 * This file is the policy (what a map is worth and how the problem is cut); the two
 * generic solvers it hands the pieces to, assignment and min-cost flow, are assign.c.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "core/log.h"
#include "reshard/assign.h"
#include "reshard/reshard_int.h"

#define NEG_INF         INT64_MIN
#define DP_MAX_CELLS    (1u << 21) /* states x hosts of the exact small-case program */
#define HUNGARIAN_MAX   256        /* larger dp-rank matchings use a greedy */
#define EXCHANGE_ROUNDS 256

typedef struct pworker {
    int32_t id, host;
    int op, od, ot; /* old coordinate; op = -1 when the worker held nothing */
    int hidx;       /* index of its host */
} pworker;

typedef struct cache_ent {
    uint64_t key; /* 0: empty */
    int64_t value;
} cache_ent;

typedef struct placer {
    const tide_layout_t *o; /* may be NULL */
    const tide_collection_t *c;
    const tide_place_request *rq;
    tide_layout_t *n;
    pworker *w; /* available workers sorted by (host, id) */
    size_t nw;
    size_t *hoff; /* host h: w[hoff[h] .. hoff[h + 1]) */
    size_t nh;
    int ntp, ndp, npp, nroles, groups;
    int otp, odp, opp, ncls;
    uint64_t *rbytes; /* [ncls][nroles]: DP-replicated bytes a class keeps in a role */
    int shift;        /* rbytes >> shift keeps sums far from overflow */
    int64_t ks;       /* gain = (bytes >> shift) * ks + (1 if the worker keeps its (p, t)) */
    int *hsig;        /* per host, its workers' old classes sorted (idle = -1); parallel to w */
    int *hclass;      /* host -> class of identical hosts */
    int *hrep;        /* class -> representative host */
    int nhcls;
    int *slots;   /* host -> TP groups it can take */
    int *cfg;     /* host -> [npp] groups of each stage placed on it */
    int *wrole;   /* worker -> role p' * ntp + t', or -1 */
    int *wgroup;  /* worker -> group index, or -1 */
    int *gstage;  /* group -> stage */
    int *gmember; /* group -> [ntp] worker indices */
    int ngroups;
    cache_ent *cache; /* (host class, config) -> value */
    size_t cache_cap, cache_n;
    uint64_t mem;
} placer;

static void *pc_calloc(placer *pl, size_t n, size_t size)
{
    void *p = tide_calloc(n, size);
    if (p != NULL)
        pl->mem += (uint64_t)(n ? n : 1) * (size ? size : 1);
    return p;
}

static void placer_free(placer *pl)
{
    tide_free(pl->w);
    tide_free(pl->hoff);
    tide_free(pl->rbytes);
    tide_free(pl->hsig);
    tide_free(pl->hclass);
    tide_free(pl->hrep);
    tide_free(pl->slots);
    tide_free(pl->cfg);
    tide_free(pl->wrole);
    tide_free(pl->wgroup);
    tide_free(pl->gstage);
    tide_free(pl->gmember);
    tide_free(pl->cache);
    tide_layout_destroy(&pl->n);
}

/* ---- gains ------------------------------------------------------------------------------- */

static int64_t gain(const placer *pl, const pworker *x, int role)
{
    if (x->op < 0)
        return 0;
    int oc = x->op * pl->otp + x->ot;
    int64_t g =
        (int64_t)(pl->rbytes[(size_t)oc * (size_t)pl->nroles + (size_t)role] >> pl->shift) * pl->ks;
    if (role / pl->ntp == x->op && role % pl->ntp == x->ot)
        g += 1;
    return g;
}

/* R[(p, t)][(p', t')]: bytes of DP-replicated tensors an old (p, t) holds of a new (p', t'). */
static tide_status build_gains(placer *pl)
{
    const tide_collection_t *c = pl->c;
    const tide_layout_t *o = pl->o, *n = pl->n;
    pl->rbytes = pc_calloc(pl, (size_t)pl->ncls * (size_t)pl->nroles, sizeof *pl->rbytes);
    if (pl->rbytes == NULL)
        return tide_errorf(TIDE_ERR_NOMEM, "out of memory for placement gains");
    if (o == NULL)
        return TIDE_OK;
    for (size_t i = 0; i < c->n; i++) {
        const tide_tensor_desc *t = &c->t[i];
        if (t->dp == TIDE_DP_SHARDED)
            continue;
        int all = t->layer == TIDE_LAYER_ALL;
        int p0 = all ? 0 : tide__stage_of(o, t->layer), p1 = all ? o->pp : p0 + 1;
        int q0 = all ? 0 : tide__stage_of(n, t->layer), q1 = all ? n->pp : q0 + 1;
        for (int ot = 0; ot < o->tp; ot++)
            for (int nt = 0; nt < n->tp; nt++) {
                uint64_t b = tide__overlap_bytes(c, i, o->tp, 1, ot, 0, n->tp, 1, nt, 0);
                if (b == 0)
                    continue;
                for (int p = p0; p < p1; p++)
                    for (int q = q0; q < q1; q++)
                        pl->rbytes[(size_t)(p * o->tp + ot) * (size_t)pl->nroles +
                                   (size_t)(q * n->tp + nt)] += b;
            }
    }
    /* Scale so that sums over all workers of bytes * ks stay below 2^62. */
    uint64_t maxr = 0;
    for (size_t k = 0; k < (size_t)pl->ncls * (size_t)pl->nroles; k++)
        maxr = pl->rbytes[k] > maxr ? pl->rbytes[k] : maxr;
    while (pl->shift < 63 &&
           (maxr >> pl->shift) > (UINT64_C(1) << 62) / (uint64_t)pl->ks / (uint64_t)(pl->nw + 1))
        pl->shift++;
    return TIDE_OK;
}

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

/* ---- regime 1: hosts do not constrain TP groups ------------------------------------------------
 */

/* Worker classes (old (p, t), or idle) to roles, dp ranks per role: exact transportation. */
static tide_status place_roles(placer *pl)
{
    tide_status rc = TIDE_OK;
    int nc = pl->ncls + 1; /* last: idle workers */
    int64_t *supply = pc_calloc(pl, (size_t)nc, sizeof *supply);
    int *edge = pc_calloc(pl, (size_t)nc * (size_t)pl->nroles, sizeof *edge);
    tide__flow f;
    memset(&f, 0, sizeof f);
    if (supply == NULL || edge == NULL) {
        rc = tide_errorf(TIDE_ERR_NOMEM, "out of memory placing roles");
        goto out;
    }
    for (size_t x = 0; x < pl->nw; x++) {
        const pworker *w = &pl->w[x];
        supply[w->op < 0 ? pl->ncls : w->op * pl->otp + w->ot]++;
    }
    int s = nc + pl->nroles, t = s + 1;
    TIDE_CHECK_GOTO(tide__flow_init(&f, t + 1, nc * pl->nroles + nc + pl->nroles), rc, out);
    for (int k = 0; k < nc; k++)
        if (supply[k] > 0)
            tide__flow_edge(&f, s, k, supply[k], 0);
    for (int k = 0; k < nc; k++) {
        if (supply[k] == 0)
            continue;
        pworker proto = {0, 0, k < pl->ncls ? k / pl->otp : -1, 0, k < pl->ncls ? k % pl->otp : 0,
                         0};
        for (int r = 0; r < pl->nroles; r++)
            edge[k * pl->nroles + r] =
                tide__flow_edge(&f, k, nc + r, supply[k], -gain(pl, &proto, r));
    }
    for (int r = 0; r < pl->nroles; r++)
        tide__flow_edge(&f, nc + r, t, pl->ndp, 0);
    int64_t want = (int64_t)pl->nroles * pl->ndp, got = 0;
    TIDE_CHECK_GOTO(tide__flow_run(&f, s, t, want, &got), rc, out);
    if (got != want)
        TIDE_FAIL_GOTO(rc, out, TIDE_ERR_INTERNAL, "placement: roles flow %lld of %lld",
                       (long long)got, (long long)want);
    /* Workers of a class take its roles in (host, id) order. */
    for (size_t x = 0; x < pl->nw; x++) {
        const pworker *w = &pl->w[x];
        int k = w->op < 0 ? pl->ncls : w->op * pl->otp + w->ot;
        pl->wrole[x] = -1;
        /* Prefer the worker's own old role when the flow uses it. */
        int own = w->op >= 0 && w->op < pl->npp && w->ot < pl->ntp ? w->op * pl->ntp + w->ot : -1;
        if (own >= 0) {
            int e = edge[k * pl->nroles + own];
            if (f.cap[e ^ 1] > 0) {
                f.cap[e ^ 1]--;
                pl->wrole[x] = own;
                continue;
            }
        }
        for (int r = 0; r < pl->nroles; r++) {
            int e = edge[k * pl->nroles + r];
            if (f.cap[e ^ 1] > 0) {
                f.cap[e ^ 1]--;
                pl->wrole[x] = r;
                break;
            }
        }
    }
out:
    tide__flow_clear(&f);
    tide_free(supply);
    tide_free(edge);
    return rc;
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

/*
 * Exact dynamic program over hosts when the demand space is small: state =
 * groups still needed per stage (mixed radix dp + 1); each host picks one
 * multiset of stages that fits its slots. Returns 0 (not attempted) when too big.
 */
static tide_status slots_by_dp(placer *pl, int *done)
{
    *done = 0;
    uint64_t radix = (uint64_t)pl->ndp + 1, states = 1;
    int maxs = 0;
    for (int q = 0; q < pl->npp; q++) {
        states *= radix;
        if (states > DP_MAX_CELLS)
            return TIDE_OK;
    }
    for (size_t h = 0; h < pl->nh; h++)
        maxs = pl->slots[h] > maxs ? pl->slots[h] : maxs;
    if (maxs > 16 || states * (pl->nh + 1) > DP_MAX_CELLS)
        return TIDE_OK;
    tide_status rc = TIDE_OK;
    int cap = 4096;
    int *cfgs = pc_calloc(pl, (size_t)cap * (size_t)pl->npp, sizeof *cfgs);
    int64_t *best = pc_calloc(pl, (size_t)(states * (pl->nh + 1)), sizeof *best);
    int32_t *from = pc_calloc(pl, (size_t)(states * (pl->nh + 1)), sizeof *from);
    int64_t *val = NULL;
    uint64_t *delta = NULL;
    int *digits = pc_calloc(pl, (size_t)pl->npp, sizeof *digits);
    if (!cfgs || !best || !from || !digits) {
        rc = tide_errorf(TIDE_ERR_NOMEM, "out of memory in the placement program");
        goto out;
    }
    int ncfg = enum_cfgs(pl->npp, maxs, cfgs, cap);
    if (ncfg < 0)
        goto out; /* too many configurations: not attempted */
    val = pc_calloc(pl, (size_t)ncfg * (size_t)pl->nhcls, sizeof *val);
    delta = pc_calloc(pl, (size_t)ncfg, sizeof *delta);
    if (!val || !delta) {
        rc = tide_errorf(TIDE_ERR_NOMEM, "out of memory in the placement program");
        goto out;
    }
    for (int k = 0; k < ncfg; k++) {
        uint64_t d = 0, m = 1;
        for (int q = 0; q < pl->npp; q++, m *= radix)
            d += (uint64_t)cfgs[(size_t)k * (size_t)pl->npp + (size_t)q] * m;
        delta[k] = d;
    }
    /* Values per (host class, config) that fits the class's slots. */
    for (int hc = 0; hc < pl->nhcls; hc++) {
        size_t h = (size_t)pl->hrep[hc];
        for (int k = 0; k < ncfg; k++) {
            int size = 0;
            for (int q = 0; q < pl->npp; q++)
                size += cfgs[(size_t)k * (size_t)pl->npp + (size_t)q];
            if (size > pl->slots[h]) {
                val[(size_t)hc * (size_t)ncfg + (size_t)k] = NEG_INF;
                continue;
            }
            TIDE_CHECK_GOTO(class_value(pl, h, &cfgs[(size_t)k * (size_t)pl->npp],
                                        &val[(size_t)hc * (size_t)ncfg + (size_t)k]),
                            rc, out);
        }
    }
    for (uint64_t x = 0; x < states * (pl->nh + 1); x++)
        best[x] = NEG_INF;
    uint64_t full = states - 1; /* every digit at dp: all groups still needed */
    best[full] = 0;
    for (size_t h = 0; h < pl->nh; h++) {
        int hc = pl->hclass[h];
        for (uint64_t st = 0; st < states; st++) {
            int64_t b = best[h * states + st];
            if (b == NEG_INF)
                continue;
            uint64_t rem = st;
            for (int q = 0; q < pl->npp; q++) {
                digits[q] = (int)(rem % radix);
                rem /= radix;
            }
            for (int k = 0; k < ncfg; k++) {
                int64_t v = val[(size_t)hc * (size_t)ncfg + (size_t)k];
                if (v == NEG_INF)
                    continue;
                int fits = 1;
                for (int q = 0; q < pl->npp && fits; q++)
                    fits = cfgs[(size_t)k * (size_t)pl->npp + (size_t)q] <= digits[q];
                if (!fits)
                    continue;
                uint64_t ns = st - delta[k];
                int64_t *cell = &best[(h + 1) * states + ns];
                if (b + v > *cell) {
                    *cell = b + v;
                    from[(h + 1) * states + ns] = k;
                }
            }
        }
    }
    if (best[pl->nh * states] == NEG_INF)
        TIDE_FAIL_GOTO(rc, out, TIDE_ERR_INTERNAL, "placement: no host assignment found");
    uint64_t st = 0;
    for (size_t h = pl->nh; h-- > 0;) {
        int k = from[(h + 1) * states + st];
        memcpy(&pl->cfg[h * (size_t)pl->npp], &cfgs[(size_t)k * (size_t)pl->npp],
               (size_t)pl->npp * sizeof *pl->cfg);
        st += delta[k];
    }
    *done = 1;
out:
    tide_free(cfgs);
    tide_free(best);
    tide_free(from);
    tide_free(val);
    tide_free(delta);
    tide_free(digits);
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

/* ---- groups and dp ranks ------------------------------------------------------------------------
 */

static int cmp_by_host_dp(const void *a, const void *b)
{
    const placer *pl = sort_pl;
    const pworker *x = &pl->w[*(const int *)a], *y = &pl->w[*(const int *)b];
    if (x->host != y->host)
        return x->host < y->host ? -1 : 1;
    if (x->od != y->od)
        return x->od < y->od ? -1 : 1;
    return (x->id > y->id) - (x->id < y->id);
}

/*
 * TP groups: for each stage, the j-th worker (by host, old dp rank) of every tp
 * rank. Under host slots each host contributes the same number of workers to
 * every tp rank of a stage, so each group lies inside one host.
 */
static tide_status form_groups(placer *pl)
{
    tide_status rc = TIDE_OK;
    int *cnt = pc_calloc(pl, (size_t)pl->nroles + 1, sizeof *cnt);
    int *list = pc_calloc(pl, pl->nw, sizeof *list);
    pl->ngroups = pl->groups;
    pl->gstage = pc_calloc(pl, (size_t)pl->ngroups, sizeof *pl->gstage);
    pl->gmember = pc_calloc(pl, (size_t)pl->ngroups * (size_t)pl->ntp, sizeof *pl->gmember);
    if (!cnt || !list || !pl->gstage || !pl->gmember) {
        rc = tide_errorf(TIDE_ERR_NOMEM, "out of memory forming TP groups");
        goto out;
    }
    for (size_t x = 0; x < pl->nw; x++)
        if (pl->wrole[x] >= 0)
            cnt[pl->wrole[x] + 1]++;
    for (int r = 0; r < pl->nroles; r++) {
        if (cnt[r + 1] != pl->ndp)
            TIDE_FAIL_GOTO(rc, out, TIDE_ERR_INTERNAL, "placement: role %d has %d workers, not %d",
                           r, cnt[r + 1], pl->ndp);
        cnt[r + 1] += cnt[r];
    }
    for (size_t x = 0; x < pl->nw; x++)
        if (pl->wrole[x] >= 0)
            list[cnt[pl->wrole[x]]++] = (int)x;
    sort_pl = pl;
    for (int r = 0; r < pl->nroles; r++) {
        int *l = list + (size_t)r * (size_t)pl->ndp;
        qsort(l, (size_t)pl->ndp, sizeof *l, cmp_by_host_dp);
    }
    for (int q = 0; q < pl->npp; q++)
        for (int j = 0; j < pl->ndp; j++) {
            int g = q * pl->ndp + j;
            pl->gstage[g] = q;
            for (int t = 0; t < pl->ntp; t++)
                pl->gmember[(size_t)g * (size_t)pl->ntp + (size_t)t] =
                    list[(size_t)(q * pl->ntp + t) * (size_t)pl->ndp + (size_t)j];
        }
out:
    tide_free(cnt);
    tide_free(list);
    return rc;
}

/* A DP-sharded tensor class shared by new stage q and old stage p (-1: every old stage). */
typedef struct zent {
    int q, p;
    uint32_t tensor; /* representative */
    uint64_t count;
} zent;

static const tide_collection_t *sort_c;

static int geom_cmp(const tide_collection_t *c, uint32_t i, uint32_t j)
{
    const tide__tgeom *x = &c->g[i], *y = &c->g[j];
    uint64_t a[6] = {x->a, x->d, x->b, x->s, x->es, (uint64_t)c->t[i].tp};
    uint64_t b[6] = {y->a, y->d, y->b, y->s, y->es, (uint64_t)c->t[j].tp};
    for (int k = 0; k < 6; k++)
        if (a[k] != b[k])
            return a[k] < b[k] ? -1 : 1;
    return 0;
}

static int cmp_zent(const void *a, const void *b)
{
    const zent *x = a, *y = b;
    if (x->q != y->q)
        return x->q < y->q ? -1 : 1;
    if (x->p != y->p)
        return x->p < y->p ? -1 : 1;
    int r = geom_cmp(sort_c, x->tensor, y->tensor);
    return r != 0 ? r : (x->tensor > y->tensor) - (x->tensor < y->tensor);
}

/* ZeRO-1 state per (new stage, old stage, geometry), with multiplicities. */
static tide_status zero_entries(placer *pl, zent **out, size_t *n_out)
{
    const tide_collection_t *c = pl->c;
    size_t n = 0;
    *out = NULL;
    *n_out = 0;
    if (pl->o == NULL)
        return TIDE_OK;
    for (size_t i = 0; i < c->n; i++)
        if (c->t[i].dp == TIDE_DP_SHARDED)
            n += c->t[i].layer == TIDE_LAYER_ALL ? (size_t)pl->npp : 1;
    if (n == 0)
        return TIDE_OK;
    zent *z = pc_calloc(pl, n, sizeof *z);
    if (z == NULL)
        return tide_errorf(TIDE_ERR_NOMEM, "out of memory listing ZeRO-1 state");
    size_t k = 0;
    for (size_t i = 0; i < c->n; i++) {
        const tide_tensor_desc *t = &c->t[i];
        if (t->dp != TIDE_DP_SHARDED)
            continue;
        if (t->layer == TIDE_LAYER_ALL) {
            for (int q = 0; q < pl->npp; q++)
                z[k++] = (zent){q, -1, (uint32_t)i, 1};
        } else {
            z[k++] = (zent){tide__stage_of(pl->n, t->layer), tide__stage_of(pl->o, t->layer),
                            (uint32_t)i, 1};
        }
    }
    sort_c = c;
    qsort(z, n, sizeof *z, cmp_zent);
    size_t m = 0;
    for (k = 0; k < n; k++) {
        if (m > 0 && z[m - 1].q == z[k].q && z[m - 1].p == z[k].p &&
            geom_cmp(c, z[m - 1].tensor, z[k].tensor) == 0) {
            z[m - 1].count++;
            continue;
        }
        z[m++] = z[k];
    }
    *out = z;
    *n_out = m;
    return TIDE_OK;
}

/*
 * Matches each stage's groups to dp ranks: ZeRO-1 bytes kept first, then a
 * pipeline neighbour (the previous stage's group of that dp rank) on the same
 * (2) or an adjacent (1) host, then members keeping their old (p, d).
 */
static tide_status assign_dp(placer *pl)
{
    tide_status rc = TIDE_OK;
    int nd = pl->ndp, ntp = pl->ntp;
    size_t nz = 0;
    zent *z = NULL;
    int64_t *zb = NULL, *wt = NULL;
    int *a = pc_calloc(pl, (size_t)nd, sizeof *a), *prev = pc_calloc(pl, (size_t)nd, sizeof *prev);
    char *taken = pc_calloc(pl, (size_t)nd, 1);
    int *keep = pc_calloc(pl, (size_t)nd, sizeof *keep);
    if (!a || !prev || !taken || !keep) {
        rc = tide_errorf(TIDE_ERR_NOMEM, "out of memory matching dp ranks");
        goto out;
    }
    TIDE_CHECK_GOTO(zero_entries(pl, &z, &nz), rc, out);
    /* Matrices of nd x nd only where they are needed (ZeRO-1 bytes, the exact matching):
     * at dp 300 each is 700 KB of fresh pages per decision, whose faults cost more than
     * everything else here; the greedy takes its weights row by row. */
    int full = nd <= HUNGARIAN_MAX;
    if (nz > 0) {
        zb = pc_calloc(pl, (size_t)nd * (size_t)nd, sizeof *zb);
        TIDE_CHECK_ALLOC_GOTO(zb, rc, out);
    }
    wt = pc_calloc(pl, full ? (size_t)nd * (size_t)nd : (size_t)nd, sizeof *wt);
    TIDE_CHECK_ALLOC_GOTO(wt, rc, out);
    int64_t m2 = ntp + 1, m1 = (int64_t)nd * 3 * m2 + 1;
    size_t zi = 0;
    for (int q = 0; q < pl->npp; q++) {
        size_t z0 = zi;
        while (zi < nz && z[zi].q == q)
            zi++;
        int64_t zmax = 0;
        for (int j = 0; j < nd && zi > z0; j++)
            for (int d = 0; d < nd; d++) {
                uint64_t bytes = 0;
                int g = q * nd + j;
                for (int t = 0; t < ntp; t++) {
                    const pworker *x = &pl->w[pl->gmember[(size_t)g * (size_t)ntp + (size_t)t]];
                    if (x->op < 0)
                        continue;
                    for (size_t k = z0; k < zi; k++)
                        if (z[k].p < 0 || z[k].p == x->op)
                            bytes += z[k].count * tide__overlap_bytes(pl->c, z[k].tensor, pl->otp,
                                                                      pl->odp, x->ot, x->od, ntp,
                                                                      nd, t, d);
                }
                zb[(size_t)j * (size_t)nd + (size_t)d] = (int64_t)(bytes >> 1);
                zmax = zb[(size_t)j * (size_t)nd + (size_t)d] > zmax
                           ? zb[(size_t)j * (size_t)nd + (size_t)d]
                           : zmax;
            }
        int zs = 0;
        while ((zmax >> zs) > (INT64_C(1) << 61) / m1 / (nd + 1))
            zs++;
        memset(taken, 0, (size_t)nd);
        for (int j = 0; j < nd; j++) {
            int g = q * nd + j;
            const pworker *first = &pl->w[pl->gmember[(size_t)g * (size_t)ntp]];
            int64_t *row = full ? wt + (size_t)j * (size_t)nd : wt;
            /* members keeping their old (q, d, t), per d: one pass over the group */
            memset(keep, 0, (size_t)nd * sizeof *keep);
            for (int t = 0; t < ntp; t++) {
                const pworker *x = &pl->w[pl->gmember[(size_t)g * (size_t)ntp + (size_t)t]];
                if (x->op == q && x->ot == t && x->od >= 0 && x->od < nd)
                    keep[x->od]++;
            }
            for (int d = 0; d < nd; d++) {
                int64_t neigh = 0, role = keep[d];
                if (q > 0) {
                    const pworker *pf = &pl->w[pl->gmember[(size_t)prev[d] * (size_t)ntp]];
                    neigh = pf->host == first->host                                        ? 2
                            : (pf->host - first->host == 1 || first->host - pf->host == 1) ? 1
                                                                                           : 0;
                }
                int64_t zbytes = zb != NULL ? zb[(size_t)j * (size_t)nd + (size_t)d] : 0;
                row[d] = (zbytes >> zs) * m1 + neigh * m2 + role;
            }
            if (!full) { /* greedy: each group in turn takes its best free rank */
                int bd = -1;
                for (int d = 0; d < nd; d++)
                    if (!taken[d] && (bd < 0 || row[d] > row[bd]))
                        bd = d;
                taken[bd] = 1;
                a[j] = bd;
            }
        }
        if (full)
            TIDE_CHECK_GOTO(tide__assign_max(wt, nd, nd, a, NULL), rc, out);
        for (int j = 0; j < nd; j++) {
            int g = q * nd + j;
            prev[a[j]] = g;
            for (int t = 0; t < ntp; t++)
                pl->n->worker[tide_layout_index(pl->n, q, a[j], t)] =
                    pl->w[pl->gmember[(size_t)g * (size_t)ntp + (size_t)t]].id;
        }
    }
out:
    tide_free(z);
    tide_free(zb);
    tide_free(wt);
    tide_free(a);
    tide_free(prev);
    tide_free(taken);
    tide_free(keep);
    return rc;
}

/* ---- entry points ------------------------------------------------------------------------------
 */

static int cmp_worker_id(const void *a, const void *b)
{
    const pworker *x = a, *y = b;
    return (x->id > y->id) - (x->id < y->id);
}

static int cmp_worker_host(const void *a, const void *b)
{
    const pworker *x = a, *y = b;
    if (x->host != y->host)
        return x->host < y->host ? -1 : 1;
    return (x->id > y->id) - (x->id < y->id);
}

/* The new layout's skeleton (degrees, stages) checked against the collection. */
static tide_status skeleton(const tide_collection_t *c, const tide_place_request *req,
                            tide_layout_t **out)
{
    *out = NULL;
    if (c == NULL || req == NULL)
        return tide_errorf(TIDE_ERR_INVALID, "placement: NULL collection or request");
    if (req->n_workers > 0 && req->workers == NULL)
        return tide_errorf(TIDE_ERR_INVALID, "placement: %zu workers but no worker array",
                           req->n_workers);
    tide_layout_t *l = NULL;
    TIDE_CHECK(tide_layout_new(&l, req->dp, req->tp, req->pp, c->num_layers, req->micro_batches));
    tide_status rc = TIDE_OK;
    if (req->stage_start != NULL)
        TIDE_CHECK_GOTO(tide_layout_set_stages(l, req->stage_start), rc, fail);
    TIDE_CHECK_GOTO(tide_layout_validate(l, c), rc, fail);
    size_t need = tide_layout_size(l);
    if (req->n_workers < need)
        TIDE_FAIL_GOTO(rc, fail, TIDE_ERR_INVALID,
                       "placement: (dp %d, tp %d, pp %d) needs %zu workers, %zu are available",
                       req->dp, req->tp, req->pp, need, req->n_workers);
    *out = l;
    return TIDE_OK;
fail:
    tide_layout_destroy(&l);
    return rc;
}

tide_status tide_reshard_place_default(const tide_collection_t *c, const tide_place_request *req,
                                       tide_layout_t **out)
{
    if (out == NULL)
        return tide_errorf(TIDE_ERR_INVALID, "tide_reshard_place_default: out is NULL");
    tide_layout_t *l = NULL;
    TIDE_CHECK(skeleton(c, req, &l));
    for (size_t k = 0; k < tide_layout_size(l); k++)
        l->worker[k] = req->workers[k].id;
    tide_status rc = tide_layout_validate(l, c);
    if (rc != TIDE_OK) {
        tide_layout_destroy(&l);
        return rc;
    }
    *out = l;
    return TIDE_OK;
}

/*
 * The heuristic parts (several TP groups per host at scale, ZeRO-1 ranges)
 * carry no optimality proof, so the rank order over the workers sorted by id
 * is evaluated too and wins when it is valid under the same host rule and
 * sends fewer bytes: placement is never worse than the default order.
 */
static tide_status keep_if_better_than_default(placer *pl, int by_host)
{
    tide_status rc = TIDE_OK;
    tide_layout_t *d = NULL;
    pworker *byid = pc_calloc(pl, pl->nw, sizeof *byid);
    if (byid == NULL)
        return tide_errorf(TIDE_ERR_NOMEM, "out of memory comparing with the default order");
    memcpy(byid, pl->w, pl->nw * sizeof *byid);
    qsort(byid, pl->nw, sizeof *byid, cmp_worker_id);
    TIDE_CHECK_GOTO(tide_layout_copy(&d, pl->n), rc, out);
    size_t n = tide_layout_size(d);
    for (size_t k = 0; k < n; k++)
        d->worker[k] = byid[k].id;
    if (by_host) /* the default must obey the host rule to compete */
        for (size_t k = 0; k < n; k++)
            if (byid[k].host != byid[k - k % (size_t)pl->ntp].host)
                goto out;
    uint64_t chosen = 0, plain = 0;
    TIDE_CHECK_GOTO(tide_reshard_lower_bound(pl->o, pl->n, pl->c, &chosen), rc, out);
    TIDE_CHECK_GOTO(tide_reshard_lower_bound(pl->o, d, pl->c, &plain), rc, out);
    if (plain < chosen) {
        TIDE_INFO("reshard", "placement: the default order sends %llu bytes, fewer than %llu",
                  (unsigned long long)plain, (unsigned long long)chosen);
        memcpy(pl->n->worker, d->worker, n * sizeof *d->worker);
    }
out:
    tide_layout_destroy(&d);
    tide_free(byid);
    return rc;
}

tide_status tide_reshard_place(const tide_layout_t *old_l, const tide_collection_t *c,
                               const tide_place_request *req, tide_layout_t **out)
{
    if (out == NULL)
        return tide_errorf(TIDE_ERR_INVALID, "tide_reshard_place: out is NULL");
    *out = NULL;
    placer pl;
    memset(&pl, 0, sizeof pl);
    tide_status rc = TIDE_OK;
    tide__worker_index oix;
    memset(&oix, 0, sizeof oix);
    TIDE_CHECK(skeleton(c, req, &pl.n));
    if (old_l != NULL) {
        rc = tide_layout_validate(old_l, c);
        if (rc != TIDE_OK) {
            tide_layout_destroy(&pl.n);
            return rc;
        }
        TIDE_CHECK_GOTO(tide__worker_index_new(old_l, &oix), rc, out);
    }
    pl.o = old_l;
    pl.c = c;
    pl.rq = req;
    pl.ntp = req->tp;
    pl.ndp = req->dp;
    pl.npp = req->pp;
    pl.nroles = pl.ntp * pl.npp;
    pl.groups = pl.ndp * pl.npp;
    pl.otp = old_l ? old_l->tp : 1;
    pl.odp = old_l ? old_l->dp : 1;
    pl.opp = old_l ? old_l->pp : 1;
    pl.ncls = pl.otp * pl.opp;
    pl.nw = req->n_workers;

    /* Workers: unique ids, hosts >= 0; their old coordinates. */
    pl.w = pc_calloc(&pl, pl.nw, sizeof *pl.w);
    TIDE_CHECK_ALLOC_GOTO(pl.w, rc, out);
    for (size_t x = 0; x < pl.nw; x++) {
        const tide_place_worker *r = &req->workers[x];
        if (r->id < 0 || r->host < 0)
            TIDE_FAIL_GOTO(rc, out, TIDE_ERR_INVALID,
                           "placement: worker %d on host %d: ids and hosts must be >= 0",
                           (int)r->id, (int)r->host);
        pworker *w = &pl.w[x];
        w->id = r->id;
        w->host = r->host;
        w->op = -1;
        long at = old_l ? tide__worker_index_find(&oix, r->id) : -1;
        if (at >= 0)
            tide__coord(old_l, (size_t)at, &w->op, &w->od, &w->ot);
    }
    qsort(pl.w, pl.nw, sizeof *pl.w, cmp_worker_id);
    for (size_t x = 1; x < pl.nw; x++)
        if (pl.w[x].id == pl.w[x - 1].id)
            TIDE_FAIL_GOTO(rc, out, TIDE_ERR_INVALID, "placement: worker %d is listed twice",
                           (int)pl.w[x].id);
    qsort(pl.w, pl.nw, sizeof *pl.w, cmp_worker_host);
    pl.hoff = pc_calloc(&pl, pl.nw + 1, sizeof *pl.hoff);
    TIDE_CHECK_ALLOC_GOTO(pl.hoff, rc, out);
    for (size_t x = 0; x < pl.nw; x++) {
        if (x == 0 || pl.w[x].host != pl.w[x - 1].host)
            pl.hoff[pl.nh++] = x;
        pl.w[x].hidx = (int)pl.nh - 1;
    }
    pl.hoff[pl.nh] = pl.nw;
    pl.ks = 2;
    while (pl.ks <= (int64_t)pl.nw + 1)
        pl.ks *= 2;
    TIDE_CHECK_GOTO(build_gains(&pl), rc, out);
    pl.wrole = pc_calloc(&pl, pl.nw, sizeof *pl.wrole);
    pl.slots = pc_calloc(&pl, pl.nh, sizeof *pl.slots);
    pl.cfg = pc_calloc(&pl, pl.nh * (size_t)pl.npp, sizeof *pl.cfg);
    TIDE_CHECK_ALLOC_GOTO(pl.wrole, rc, out);
    TIDE_CHECK_ALLOC_GOTO(pl.slots, rc, out);
    TIDE_CHECK_ALLOC_GOTO(pl.cfg, rc, out);

    int by_host = pl.ntp > 1 && !req->tp_across_hosts;
    if (by_host) {
        long total = 0;
        for (size_t h = 0; h < pl.nh; h++) {
            pl.slots[h] = (int)((pl.hoff[h + 1] - pl.hoff[h]) / (size_t)pl.ntp);
            total += pl.slots[h];
        }
        if (total < pl.groups) /* a TP group across hosts runs its collectives on the network */
            TIDE_FAIL_GOTO(rc, out, TIDE_ERR_NO_DEVICE,
                           "placement: (dp %d, tp %d, pp %d) needs %d TP groups of %d workers, "
                           "each inside one host; the hosts of the %zu available workers have "
                           "room for %ld; choose a smaller dp, or allow TP groups across hosts",
                           pl.ndp, pl.ntp, pl.npp, pl.groups, pl.ntp, pl.nw, total);
    }
    if (!by_host) {
        TIDE_CHECK_GOTO(place_roles(&pl), rc, out);
    } else {
        int maxs = 0, done = 0;
        for (size_t h = 0; h < pl.nh; h++)
            maxs = pl.slots[h] > maxs ? pl.slots[h] : maxs;
        TIDE_CHECK_GOTO(host_classes(&pl), rc, out);
        if (maxs <= 1) {
            TIDE_CHECK_GOTO(slots_by_flow(&pl), rc, out);
        } else {
            TIDE_CHECK_GOTO(slots_by_dp(&pl, &done), rc, out);
            if (!done)
                TIDE_CHECK_GOTO(slots_by_search(&pl), rc, out);
        }
        TIDE_CHECK_GOTO(realize_hosts(&pl), rc, out);
    }
    TIDE_CHECK_GOTO(form_groups(&pl), rc, out);
    TIDE_CHECK_GOTO(assign_dp(&pl), rc, out);
    TIDE_CHECK_GOTO(tide_layout_validate(pl.n, c), rc, out);
    if (old_l != NULL)
        TIDE_CHECK_GOTO(keep_if_better_than_default(&pl, by_host), rc, out);
    pl.mem += tide_layout_size(pl.n) * sizeof *pl.n->worker;
    *out = pl.n;
    pl.n = NULL;
out:
    tide__reshard_set_peak(pl.mem);
    tide__worker_index_free(&oix);
    placer_free(&pl);
    return rc;
}
