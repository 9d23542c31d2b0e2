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
 * This file is the policy (what a map is worth and how the problem is cut) with
 * regime 1 and the dp-rank matching; regime 2 (hosts take whole TP groups) is
 * place_hosts.c, and the two generic solvers they hand the pieces to, assignment and
 * min-cost flow, are assign.c.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "core/log.h"
#include "reshard/assign.h"
#include "reshard/place_int.h"

#define HUNGARIAN_MAX 256 /* larger dp-rank matchings use a greedy */

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

/* ---- groups and dp ranks ------------------------------------------------------------------------
 */

static _Thread_local const placer *sort_pl; /* qsort has no context argument */

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

/* The dp-rank matching's working set, for every stage in turn. */
typedef struct dpmatch {
    int nd, full; /* dp degree; full: exact matching (nd <= HUNGARIAN_MAX), else greedy */
    zent *z;      /* ZeRO-1 entries by stage (zero_entries) */
    size_t nz;
    int64_t *zb;    /* [nd][nd]: ZeRO-1 bytes group j keeps as dp rank d (NULL: none) */
    int64_t *wt;    /* weights: [nd][nd] when full, else one row */
    int *a, *prev;  /* [nd]: group j's dp rank; the previous stage's group at dp rank d */
    char *taken;    /* [nd]: dp ranks taken (greedy) */
    int *keep;      /* [nd]: members keeping their old (q, d, t), per d */
    int64_t m1, m2; /* weight radices: ZeRO-1 bytes, then neighbours, then kept roles */
} dpmatch;

/* Stage q's ZeRO-1 bytes per (group j, dp rank d) into zb, from entries [z0, z1); returns
   the shift that keeps the weights within int64. */
static int stage_zero_bytes(const placer *pl, dpmatch *dm, int q, size_t z0, size_t z1)
{
    int nd = dm->nd, ntp = pl->ntp;
    int64_t zmax = 0;
    for (int j = 0; j < nd && z1 > z0; j++)
        for (int d = 0; d < nd; d++) {
            uint64_t bytes = 0;
            int g = q * nd + j;
            for (int t = 0; t < ntp; t++) {
                const pworker *x = &pl->w[pl->gmember[(size_t)g * (size_t)ntp + (size_t)t]];
                if (x->op < 0)
                    continue;
                for (size_t k = z0; k < z1; k++)
                    if (dm->z[k].p < 0 || dm->z[k].p == x->op)
                        bytes += dm->z[k].count * tide__overlap_bytes(pl->c, dm->z[k].tensor,
                                                                      pl->otp, pl->odp, x->ot,
                                                                      x->od, ntp, nd, t, d);
            }
            int64_t *cell = &dm->zb[(size_t)j * (size_t)nd + (size_t)d];
            *cell = (int64_t)(bytes >> 1);
            zmax = *cell > zmax ? *cell : zmax;
        }
    int zs = 0;
    while ((zmax >> zs) > (INT64_C(1) << 61) / dm->m1 / (nd + 1))
        zs++;
    return zs;
}

/* Group j of stage q's weight for each dp rank d, into row. */
static void group_weights(const placer *pl, dpmatch *dm, int q, int j, int zs, int64_t *row)
{
    int nd = dm->nd, ntp = pl->ntp, g = q * nd + j;
    const pworker *first = &pl->w[pl->gmember[(size_t)g * (size_t)ntp]];
    /* members keeping their old (q, d, t), per d: one pass over the group */
    memset(dm->keep, 0, (size_t)nd * sizeof *dm->keep);
    for (int t = 0; t < ntp; t++) {
        const pworker *x = &pl->w[pl->gmember[(size_t)g * (size_t)ntp + (size_t)t]];
        if (x->op == q && x->ot == t && x->od >= 0 && x->od < nd)
            dm->keep[x->od]++;
    }
    for (int d = 0; d < nd; d++) {
        int64_t neigh = 0, role = dm->keep[d];
        if (q > 0) {
            const pworker *pf = &pl->w[pl->gmember[(size_t)dm->prev[d] * (size_t)ntp]];
            neigh = pf->host == first->host                                        ? 2
                    : (pf->host - first->host == 1 || first->host - pf->host == 1) ? 1
                                                                                   : 0;
        }
        int64_t zbytes = dm->zb != NULL ? dm->zb[(size_t)j * (size_t)nd + (size_t)d] : 0;
        row[d] = (zbytes >> zs) * dm->m1 + neigh * dm->m2 + role;
    }
}

/* Stage q's groups to dp ranks (ZeRO-1 entries [z0, z1)), written into the new layout. */
static tide_status match_stage(placer *pl, dpmatch *dm, int q, size_t z0, size_t z1)
{
    int nd = dm->nd, ntp = pl->ntp;
    int zs = stage_zero_bytes(pl, dm, q, z0, z1);
    memset(dm->taken, 0, (size_t)nd);
    for (int j = 0; j < nd; j++) {
        int64_t *row = dm->full ? dm->wt + (size_t)j * (size_t)nd : dm->wt;
        group_weights(pl, dm, q, j, zs, row);
        if (!dm->full) { /* greedy: each group in turn takes its best free rank */
            int bd = -1;
            for (int d = 0; d < nd; d++)
                if (!dm->taken[d] && (bd < 0 || row[d] > row[bd]))
                    bd = d;
            dm->taken[bd] = 1;
            dm->a[j] = bd;
        }
    }
    if (dm->full)
        TIDE_CHECK(tide__assign_max(dm->wt, nd, nd, dm->a, NULL));
    for (int j = 0; j < nd; j++) {
        int g = q * nd + j;
        dm->prev[dm->a[j]] = g;
        for (int t = 0; t < ntp; t++)
            pl->n->worker[tide_layout_index(pl->n, q, dm->a[j], t)] =
                pl->w[pl->gmember[(size_t)g * (size_t)ntp + (size_t)t]].id;
    }
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
    dpmatch dm;
    memset(&dm, 0, sizeof dm);
    int nd = dm.nd = pl->ndp;
    dm.a = pc_calloc(pl, (size_t)nd, sizeof *dm.a);
    dm.prev = pc_calloc(pl, (size_t)nd, sizeof *dm.prev);
    dm.taken = pc_calloc(pl, (size_t)nd, 1);
    dm.keep = pc_calloc(pl, (size_t)nd, sizeof *dm.keep);
    if (!dm.a || !dm.prev || !dm.taken || !dm.keep) {
        rc = tide_errorf(TIDE_ERR_NOMEM, "out of memory matching dp ranks");
        goto out;
    }
    TIDE_CHECK_GOTO(zero_entries(pl, &dm.z, &dm.nz), rc, out);
    /* Matrices of nd x nd only where they are needed (ZeRO-1 bytes, the exact matching):
     * at dp 300 each is 700 KB of fresh pages per decision, whose faults cost more than
     * everything else here; the greedy takes its weights row by row. */
    dm.full = nd <= HUNGARIAN_MAX;
    if (dm.nz > 0) {
        dm.zb = pc_calloc(pl, (size_t)nd * (size_t)nd, sizeof *dm.zb);
        TIDE_CHECK_ALLOC_GOTO(dm.zb, rc, out);
    }
    dm.wt = pc_calloc(pl, dm.full ? (size_t)nd * (size_t)nd : (size_t)nd, sizeof *dm.wt);
    TIDE_CHECK_ALLOC_GOTO(dm.wt, rc, out);
    dm.m2 = pl->ntp + 1;
    dm.m1 = (int64_t)nd * 3 * dm.m2 + 1;
    size_t zi = 0;
    for (int q = 0; q < pl->npp; q++) {
        size_t z0 = zi;
        while (zi < dm.nz && dm.z[zi].q == q)
            zi++;
        TIDE_CHECK_GOTO(match_stage(pl, &dm, q, z0, zi), rc, out);
    }
out:
    tide_free(dm.z);
    tide_free(dm.zb);
    tide_free(dm.wt);
    tide_free(dm.a);
    tide_free(dm.prev);
    tide_free(dm.taken);
    tide_free(dm.keep);
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

/* The placer's degrees, from the request and the old layout (NULL: a fresh job). */
static void placer_degrees(placer *pl, const tide_layout_t *old_l, const tide_collection_t *c,
                           const tide_place_request *req)
{
    pl->o = old_l;
    pl->c = c;
    pl->rq = req;
    pl->ntp = req->tp;
    pl->ndp = req->dp;
    pl->npp = req->pp;
    pl->nroles = pl->ntp * pl->npp;
    pl->groups = pl->ndp * pl->npp;
    pl->otp = old_l ? old_l->tp : 1;
    pl->odp = old_l ? old_l->dp : 1;
    pl->opp = old_l ? old_l->pp : 1;
    pl->ncls = pl->otp * pl->opp;
    pl->nw = pl->rq->n_workers;
}

/* Workers: unique ids, hosts >= 0, their old coordinates (oix: the old layout's index,
   NULL without one); sorted by (host, id), each host's range in hoff; the gain scale. */
static tide_status load_workers(placer *pl, const tide__worker_index *oix)
{
    const tide_place_request *req = pl->rq;
    pl->w = pc_calloc(pl, pl->nw, sizeof *pl->w);
    if (pl->w == NULL)
        return tide_errorf(TIDE_ERR_NOMEM, "out of memory listing %zu workers", pl->nw);
    for (size_t x = 0; x < pl->nw; x++) {
        const tide_place_worker *r = &req->workers[x];
        if (r->id < 0 || r->host < 0)
            return tide_errorf(TIDE_ERR_INVALID,
                               "placement: worker %d on host %d: ids and hosts must be >= 0",
                               (int)r->id, (int)r->host);
        pworker *w = &pl->w[x];
        w->id = r->id;
        w->host = r->host;
        w->op = -1;
        long at = oix != NULL ? tide__worker_index_find(oix, r->id) : -1;
        if (at >= 0)
            tide__coord(pl->o, (size_t)at, &w->op, &w->od, &w->ot);
    }
    qsort(pl->w, pl->nw, sizeof *pl->w, cmp_worker_id);
    for (size_t x = 1; x < pl->nw; x++)
        if (pl->w[x].id == pl->w[x - 1].id)
            return tide_errorf(TIDE_ERR_INVALID, "placement: worker %d is listed twice",
                               (int)pl->w[x].id);
    qsort(pl->w, pl->nw, sizeof *pl->w, cmp_worker_host);
    pl->hoff = pc_calloc(pl, pl->nw + 1, sizeof *pl->hoff);
    if (pl->hoff == NULL)
        return tide_errorf(TIDE_ERR_NOMEM, "out of memory grouping workers by host");
    for (size_t x = 0; x < pl->nw; x++) {
        if (x == 0 || pl->w[x].host != pl->w[x - 1].host)
            pl->hoff[pl->nh++] = x;
        pl->w[x].hidx = (int)pl->nh - 1;
    }
    pl->hoff[pl->nh] = pl->nw;
    pl->ks = 2;
    while (pl->ks <= (int64_t)pl->nw + 1)
        pl->ks *= 2;
    return TIDE_OK;
}

/* The per-worker and per-host maps the regimes fill, and under the host rule each host's
   slots (whole TP groups it can take): too few for the layout is an error. */
static tide_status host_slots(placer *pl, int by_host)
{
    pl->wrole = pc_calloc(pl, pl->nw, sizeof *pl->wrole);
    pl->slots = pc_calloc(pl, pl->nh, sizeof *pl->slots);
    pl->cfg = pc_calloc(pl, pl->nh * (size_t)pl->npp, sizeof *pl->cfg);
    if (pl->wrole == NULL || pl->slots == NULL || pl->cfg == NULL)
        return tide_errorf(TIDE_ERR_NOMEM, "out of memory for the placement maps");
    if (!by_host)
        return TIDE_OK;
    long total = 0;
    for (size_t h = 0; h < pl->nh; h++) {
        pl->slots[h] = (int)((pl->hoff[h + 1] - pl->hoff[h]) / (size_t)pl->ntp);
        total += pl->slots[h];
    }
    if (total < pl->groups) /* a TP group across hosts runs its collectives on the network */
        return tide_errorf(TIDE_ERR_NO_DEVICE,
                           "placement: (dp %d, tp %d, pp %d) needs %d TP groups of %d workers, "
                           "each inside one host; the hosts of the %zu available workers have "
                           "room for %ld; choose a smaller dp, or allow TP groups across hosts",
                           pl->ndp, pl->ntp, pl->npp, pl->groups, pl->ntp, pl->nw, total);
    return TIDE_OK;
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
    placer_degrees(&pl, old_l, c, req);
    int by_host = pl.ntp > 1 && !req->tp_across_hosts;
    TIDE_CHECK_GOTO(load_workers(&pl, old_l != NULL ? &oix : NULL), rc, out);
    TIDE_CHECK_GOTO(build_gains(&pl), rc, out);
    TIDE_CHECK_GOTO(host_slots(&pl, by_host), rc, out);
    TIDE_CHECK_GOTO(by_host ? tide__place_hosts(&pl) : place_roles(&pl), rc, out);
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
