/*
 * Shard geometry: which bytes of a tensor a coordinate holds and where they
 * sit in its local buffer (see reshard_int.h for the [A, D, B] block model).
 * Extract and insert copy block by block, so they cost O(bytes + blocks);
 * they serve tests, the simulator and workers loading a checkpoint.
 */
#include <string.h>

#include "reshard/reshard_int.h"

void tide__shard_of(const tide_collection_t *c, size_t i, int tp, int t, int dp, int d,
                    tide__shard *sh)
{
    const tide_tensor_desc *desc = &c->t[i];
    const tide__tgeom *g = &c->g[i];
    uint64_t tpe = tide__tp_eff(desc, tp);
    uint64_t te = desc->tp == TIDE_TP_SPLIT ? (uint64_t)t : 0;
    sh->k = g->a * g->s;
    sh->c = g->d / (g->s * tpe);
    sh->l = sh->c * g->b;
    sh->first = te * sh->c;
    sh->n = sh->k * sh->l;
    if (desc->dp == TIDE_DP_SHARDED) {
        uint64_t len;
        tide__zero_range(sh->n, (uint64_t)dp, (uint64_t)d, &sh->lo, &len);
        sh->hi = sh->lo + len;
    } else {
        sh->lo = 0;
        sh->hi = sh->n;
    }
}

/* Whether (i, p, d, t) names a tensor held at a coordinate that exists in l. */
static int holds(const tide_layout_t *l, const tide_collection_t *c, size_t i, int p, int d, int t)
{
    if (l == NULL || c == NULL || i >= c->n)
        return 0;
    if (p < 0 || p >= l->pp || d < 0 || d >= l->dp || t < 0 || t >= l->tp)
        return 0;
    return tide__stage_holds(l, p, c->t[i].layer);
}

uint64_t tide_shard_bytes(const tide_layout_t *l, const tide_collection_t *c, size_t i, int p,
                          int d, int t)
{
    if (!holds(l, c, i, p, d, t))
        return 0;
    tide__shard sh;
    tide__shard_of(c, i, l->tp, t, l->dp, d, &sh);
    return (sh.hi - sh.lo) * c->g[i].es;
}

/* Copies between the local buffer and the global tensor; dir 0: extract, 1: insert. */
static void copy_shard(const tide_layout_t *l, const tide_collection_t *c, size_t i, int p, int d,
                       int t, unsigned char *local, unsigned char *global, int dir)
{
    if (!holds(l, c, i, p, d, t))
        return;
    const tide__tgeom *g = &c->g[i];
    tide__shard sh;
    tide__shard_of(c, i, l->tp, t, l->dp, d, &sh);
    uint64_t es = g->es;
    for (uint64_t e = sh.lo; e < sh.hi;) {
        uint64_t o = e % sh.l;
        uint64_t run = sh.l - o;
        if (run > sh.hi - e)
            run = sh.hi - e;
        uint64_t ge = tide__shard_global(g, &sh, e);
        unsigned char *lp = local + (e - sh.lo) * es, *gp = global + ge * es;
        if (dir == 0)
            memcpy(lp, gp, run * es);
        else
            memcpy(gp, lp, run * es);
        e += run;
    }
}

void tide_shard_extract(const tide_layout_t *l, const tide_collection_t *c, size_t i, int p, int d,
                        int t, const void *global, void *local)
{
    copy_shard(l, c, i, p, d, t, local, (unsigned char *)(uintptr_t)global, 0);
}

void tide_shard_insert(const tide_layout_t *l, const tide_collection_t *c, size_t i, int p, int d,
                       int t, const void *local, void *global)
{
    copy_shard(l, c, i, p, d, t, (unsigned char *)(uintptr_t)local, global, 1);
}
