/*
 * The reshard planner's life cycle: tide__planner_init checks the inputs and builds,
 * phase by phase, what every walk reads (the worker universe and its ranks, the
 * tensors of each new stage, the geometry classes and their groups, the holder
 * nodes' live members); tide__planner_clear frees it all; and the peak of the memory the
 * last planner of this thread held (tide__reshard_peak_bytes). Workload: once per planner
 * call, O(workers + tensors) plus small sorts.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/sort.h"
#include "reshard/plan_int.h"

static _Thread_local uint64_t last_peak;

uint64_t tide__reshard_peak_bytes(void)
{
    return last_peak;
}

void tide__reshard_set_peak(uint64_t bytes)
{
    last_peak = bytes;
}

/* Rank of worker id, which must be in the universe. */
static uint32_t rank_of(const planner *pl, int32_t id)
{
    if (pl->id_rank != NULL)
        return pl->id_rank[id];
    size_t lo = 0, hi = pl->nr;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (pl->ids[mid] < id)
            lo = mid + 1;
        else
            hi = mid;
    }
    return (uint32_t)lo;
}

/* Whether tensors i and j have the same geometry class (identical pieces everywhere). */
static int same_class(const tide_collection_t *c, uint32_t i, uint32_t j)
{
    const tide__tgeom *x = &c->g[i], *y = &c->g[j];
    return x->a == y->a && x->d == y->d && x->b == y->b && x->s == y->s && x->es == y->es &&
           c->t[i].tp == c->t[j].tp && c->t[i].dp == c->t[j].dp;
}

/* Hash of what same_class compares. */
static uint64_t class_hash(const tide_collection_t *c, uint32_t i)
{
    const tide__tgeom *g = &c->g[i];
    uint64_t v[6] = {g->a,
                     g->d,
                     g->b,
                     ((uint64_t)g->s << 32) | g->es,
                     (uint64_t)c->t[i].tp,
                     (uint64_t)c->t[i].dp};
    uint64_t h = UINT64_C(0x9e3779b97f4a7c15);
    for (int k = 0; k < 6; k++) {
        h ^= v[k] + UINT64_C(0x9e3779b97f4a7c15) + (h << 6) + (h >> 2);
        h *= UINT64_C(0xff51afd7ed558ccd);
    }
    return h ^ (h >> 33);
}

typedef struct gkey {
    uint32_t stage, cls;
    int32_t pk;
} gkey;

static int cmp_gkey(const void *a, const void *b)
{
    const gkey *x = a, *y = b;
    if (x->stage != y->stage)
        return x->stage < y->stage ? -1 : 1;
    if (x->cls != y->cls)
        return x->cls < y->cls ? -1 : 1;
    return (x->pk > y->pk) - (x->pk < y->pk);
}

/* Geometry classes of the tensors and the (class, old stage) groups of each new stage. */
static tide_status build_classes(planner *pl)
{
    tide_status rc = TIDE_OK;
    const tide_collection_t *c = pl->c;
    size_t nt = c->n, cap = 64;
    while (cap < 2 * nt)
        cap *= 2;
    gkey *keys = NULL;
    uint32_t *table = pl_calloc(pl, cap, sizeof *table);
    TIDE_CHECK_ALLOC_GOTO(table, rc, out);
    pl->cls_of = pl_calloc(pl, nt, sizeof *pl->cls_of);
    TIDE_CHECK_ALLOC_GOTO(pl->cls_of, rc, out);
    pl->cls_rep = pl_calloc(pl, nt, sizeof *pl->cls_rep);
    TIDE_CHECK_ALLOC_GOTO(pl->cls_rep, rc, out);
    for (uint32_t i = 0; i < nt; i++) {
        size_t h = (size_t)class_hash(c, i) & (cap - 1);
        while (table[h] != 0 && !same_class(c, pl->cls_rep[table[h] - 1], i))
            h = (h + 1) & (cap - 1);
        if (table[h] == 0) {
            pl->cls_rep[pl->n_cls] = i;
            table[h] = ++pl->n_cls;
        }
        pl->cls_of[i] = table[h] - 1;
    }
    pl->cls_stamp = pl_calloc(pl, pl->n_cls, sizeof *pl->cls_stamp);
    TIDE_CHECK_ALLOC_GOTO(pl->cls_stamp, rc, out);
    pl->cls_off = pl_calloc(pl, pl->n_cls, sizeof *pl->cls_off);
    TIDE_CHECK_ALLOC_GOTO(pl->cls_off, rc, out);
    pl->cls_cnt = pl_calloc(pl, pl->n_cls, sizeof *pl->cls_cnt);
    TIDE_CHECK_ALLOC_GOTO(pl->cls_cnt, rc, out);
    size_t nfc = (size_t)pl->n_cls * (size_t)pl->nl->tp;
    pl->fc_off = pl_calloc(pl, nfc, sizeof *pl->fc_off);
    TIDE_CHECK_ALLOC_GOTO(pl->fc_off, rc, out);
    pl->fc_cnt = pl_calloc(pl, nfc, sizeof *pl->fc_cnt);
    TIDE_CHECK_ALLOC_GOTO(pl->fc_cnt, rc, out);
    pl->fc_done = pl_calloc(pl, nfc, sizeof *pl->fc_done);
    TIDE_CHECK_ALLOC_GOTO(pl->fc_done, rc, out);

    int npp = pl->nl->pp;
    size_t total = pl->soff[npp];
    keys = pl_calloc(pl, total, sizeof *keys);
    TIDE_CHECK_ALLOC_GOTO(keys, rc, out);
    for (int st = 0; st < npp; st++)
        for (size_t k = pl->soff[st]; k < pl->soff[st + 1]; k++) {
            uint32_t i = pl->slist[k];
            keys[k] = (gkey){(uint32_t)st, pl->cls_of[i], pl->pk_of[i]};
        }
    qsort(keys, total, sizeof *keys, cmp_gkey);
    pl->grp = pl_calloc(pl, total, sizeof *pl->grp);
    TIDE_CHECK_ALLOC_GOTO(pl->grp, rc, out);
    pl->goff = pl_calloc(pl, (size_t)npp + 1, sizeof *pl->goff);
    TIDE_CHECK_ALLOC_GOTO(pl->goff, rc, out);
    size_t ng = 0;
    for (size_t k = 0; k < total; k++) {
        if (ng > 0 && cmp_gkey(&keys[k - 1], &keys[k]) == 0) {
            pl->grp[ng - 1].count++;
            continue;
        }
        pl->grp[ng++] = (group){keys[k].cls, keys[k].pk, 1};
        pl->goff[keys[k].stage + 1] = ng;
    }
    for (int st = 0; st < npp; st++)
        if (pl->goff[st + 1] < pl->goff[st])
            pl->goff[st + 1] = pl->goff[st];
out:
    tide_free(table);
    tide_free(keys);
    return rc;
}

/* Rejects NULL inputs and layouts that do not fit c, naming the layout at fault. */
static tide_status check_inputs(const tide_layout_t *old_l, const tide_layout_t *new_l,
                                const tide_collection_t *c)
{
    tide_status rc = TIDE_OK;
    if (old_l == NULL || new_l == NULL || c == NULL)
        return tide_errorf(TIDE_ERR_INVALID, "reshard plan: NULL layout or collection");
    for (int k = 0; k < 2; k++) {
        rc = tide_layout_validate(k ? new_l : old_l, c);
        if (rc == TIDE_ERR_INVALID) {
            char detail[400]; /* tide_errorf overwrites the detail it would read */
            snprintf(detail, sizeof detail, "%s", tide_last_error());
            return tide_errorf(rc, "%s layout: %s", k ? "new" : "old", detail);
        }
        if (rc != TIDE_OK)
            return rc;
    }
    return TIDE_OK;
}

/* Universe of worker ids, ascending: ranks give compact per-worker arrays. */
static tide_status build_universe(planner *pl)
{
    tide_status rc = TIDE_OK;
    const tide_layout_t *old_l = pl->o, *new_l = pl->nl;
    size_t no = tide_layout_size(old_l), nn = tide_layout_size(new_l);
    pl->ids = pl_calloc(pl, no + nn, sizeof *pl->ids);
    TIDE_CHECK_ALLOC_GOTO(pl->ids, rc, out);
    memcpy(pl->ids, old_l->worker, no * sizeof *pl->ids);
    memcpy(pl->ids + no, new_l->worker, nn * sizeof *pl->ids);
    tide_sort_i32(pl->ids, no + nn);
    size_t nr = 0;
    for (size_t k = 0; k < no + nn; k++)
        if (nr == 0 || pl->ids[nr - 1] != pl->ids[k])
            pl->ids[nr++] = pl->ids[k];
    pl->nr = (uint32_t)nr;
    /* job ranks are dense: a direct map instead of a binary search per lookup */
    if (nr > 0 && pl->ids[0] >= 0 && (size_t)pl->ids[nr - 1] < 4 * nr + 1024) {
        pl->n_id_rank = (size_t)pl->ids[nr - 1] + 1;
        pl->id_rank = pl_calloc(pl, pl->n_id_rank, sizeof *pl->id_rank);
        TIDE_CHECK_ALLOC_GOTO(pl->id_rank, rc, out);
        for (size_t r = 0; r < nr; r++)
            pl->id_rank[pl->ids[r]] = (uint32_t)r;
    }
out:
    return rc;
}

/* Rank <-> layout index of both layouts; fails when a worker of the new layout is not alive. */
static tide_status map_workers(planner *pl)
{
    tide_status rc = TIDE_OK;
    const tide_layout_t *old_l = pl->o, *new_l = pl->nl;
    size_t no = tide_layout_size(old_l), nn = tide_layout_size(new_l), nr = pl->nr;
    pl->old_of = pl_calloc(pl, nr, sizeof *pl->old_of);
    TIDE_CHECK_ALLOC_GOTO(pl->old_of, rc, out);
    pl->new_of = pl_calloc(pl, nr, sizeof *pl->new_of);
    TIDE_CHECK_ALLOC_GOTO(pl->new_of, rc, out);
    pl->old_rank = pl_calloc(pl, no, sizeof *pl->old_rank);
    TIDE_CHECK_ALLOC_GOTO(pl->old_rank, rc, out);
    for (size_t r = 0; r < nr; r++)
        pl->old_of[r] = pl->new_of[r] = -1;
    for (size_t i = 0; i < no; i++) {
        uint32_t r = rank_of(pl, old_l->worker[i]);
        pl->old_of[r] = (int32_t)i;
        pl->old_rank[i] = r;
    }
    for (size_t i = 0; i < nn; i++) {
        int32_t w = new_l->worker[i];
        pl->new_of[rank_of(pl, w)] = (int32_t)i;
        if (!tide__is_alive(pl->alive, pl->n_alive, w)) {
            int p, d, t;
            tide__coord(new_l, i, &p, &d, &t);
            TIDE_FAIL_GOTO(rc, out, TIDE_ERR_INVALID,
                           "worker %d is in the new layout at (pp %d, dp %d, tp %d) but is not "
                           "alive",
                           (int)w, p, d, t);
        }
    }
out:
    return rc;
}

/* Old stage key of each tensor and each new stage's count of tensors, as offsets into slist
 * (soff); *total: the length of slist (a tensor of every layer is in every stage). */
static tide_status count_stages(planner *pl, size_t *total)
{
    tide_status rc = TIDE_OK;
    const tide_layout_t *old_l = pl->o, *new_l = pl->nl;
    const tide_collection_t *c = pl->c;
    size_t nt = c->n;
    pl->pk_of = pl_calloc(pl, nt, sizeof *pl->pk_of);
    TIDE_CHECK_ALLOC_GOTO(pl->pk_of, rc, out);
    pl->soff = pl_calloc(pl, (size_t)new_l->pp + 1, sizeof *pl->soff);
    TIDE_CHECK_ALLOC_GOTO(pl->soff, rc, out);
    *total = 0;
    for (size_t i = 0; i < nt; i++) {
        int layer = c->t[i].layer;
        pl->pk_of[i] = layer == TIDE_LAYER_ALL ? old_l->pp : tide__stage_of(old_l, layer);
        if (layer == TIDE_LAYER_ALL) {
            for (int s = 0; s < new_l->pp; s++)
                pl->soff[s + 1]++;
            *total += (size_t)new_l->pp;
        } else {
            pl->soff[tide__stage_of(new_l, layer) + 1]++;
            (*total)++;
        }
    }
    for (int s = 0; s < new_l->pp; s++)
        pl->soff[s + 1] += pl->soff[s];
out:
    return rc;
}

/* The tensors of each new stage, ascending, into slist[soff[s] .. soff[s + 1]). */
static tide_status fill_stages(planner *pl, size_t total)
{
    tide_status rc = TIDE_OK;
    const tide_layout_t *new_l = pl->nl;
    const tide_collection_t *c = pl->c;
    size_t nt = c->n;
    pl->slist = pl_calloc(pl, total, sizeof *pl->slist);
    TIDE_CHECK_ALLOC_GOTO(pl->slist, rc, out);
    size_t *fill = pl_calloc(pl, (size_t)new_l->pp, sizeof *fill);
    TIDE_CHECK_ALLOC_GOTO(fill, rc, out);
    for (int s = 0; s < new_l->pp; s++)
        fill[s] = pl->soff[s];
    for (size_t i = 0; i < nt; i++) {
        int layer = c->t[i].layer;
        if (layer == TIDE_LAYER_ALL) {
            for (int s = 0; s < new_l->pp; s++)
                pl->slist[fill[s]++] = (uint32_t)i;
        } else {
            int s = tide__stage_of(new_l, layer);
            pl->slist[fill[s]++] = (uint32_t)i;
        }
    }
    tide_free(fill);
out:
    return rc;
}

/* Live members per holder node (each live old worker is in 8 nodes), node volumes and the
 * per-rank send loads, zeroed. */
static tide_status count_node_members(planner *pl)
{
    tide_status rc = TIDE_OK;
    const tide_layout_t *old_l = pl->o;
    size_t no = tide_layout_size(old_l);
    pl->n_nodes = ((size_t)old_l->pp + 1) * ((size_t)old_l->dp + 1) * ((size_t)old_l->tp + 1);
    pl->vol = pl_calloc(pl, pl->n_nodes, sizeof *pl->vol);
    TIDE_CHECK_ALLOC_GOTO(pl->vol, rc, out);
    pl->alive_cnt = pl_calloc(pl, pl->n_nodes, sizeof *pl->alive_cnt);
    TIDE_CHECK_ALLOC_GOTO(pl->alive_cnt, rc, out);
    for (size_t i = 0; i < no; i++) {
        if (!tide__is_alive(pl->alive, pl->n_alive, old_l->worker[i]))
            continue;
        int p, d, t;
        tide__coord(old_l, i, &p, &d, &t);
        for (int m = 0; m < 8; m++)
            pl->alive_cnt[node_id(pl, (m & 1) ? old_l->pp : p, (m & 2) ? old_l->dp : d,
                                  (m & 4) ? old_l->tp : t)]++;
    }
    pl->load = pl_calloc(pl, pl->nr, sizeof *pl->load);
    TIDE_CHECK_ALLOC_GOTO(pl->load, rc, out);
out:
    return rc;
}

tide_status tide__planner_init(planner *pl, const tide_layout_t *old_l, const tide_layout_t *new_l,
                               const tide_collection_t *c, const uint8_t *alive, size_t n_alive,
                               int with_nodes)
{
    tide_status rc = TIDE_OK;
    size_t total = 0;
    memset(pl, 0, sizeof *pl);
    TIDE_CHECK(check_inputs(old_l, new_l, c));
    pl->o = old_l;
    pl->nl = new_l;
    pl->c = c;
    pl->alive = alive;
    pl->n_alive = n_alive;
    TIDE_CHECK_GOTO(build_universe(pl), rc, fail);
    TIDE_CHECK_GOTO(map_workers(pl), rc, fail);
    TIDE_CHECK_GOTO(count_stages(pl, &total), rc, fail);
    TIDE_CHECK_GOTO(fill_stages(pl, total), rc, fail);
    TIDE_CHECK_GOTO(build_classes(pl), rc, fail);
    if (with_nodes)
        TIDE_CHECK_GOTO(count_node_members(pl), rc, fail);
    return TIDE_OK;
fail:
    tide__planner_clear(pl);
    return rc;
}

void tide__planner_clear(planner *pl)
{
    tide_free(pl->ids);
    tide_free(pl->old_of);
    tide_free(pl->new_of);
    tide_free(pl->old_rank);
    tide_free(pl->pk_of);
    tide_free(pl->slist);
    tide_free(pl->soff);
    tide_free(pl->cls_of);
    tide_free(pl->cls_rep);
    tide_free(pl->cls_stamp);
    tide_free(pl->cls_off);
    tide_free(pl->cls_cnt);
    tide_free(pl->pool);
    tide_free(pl->fpool);
    tide_free(pl->fc_off);
    tide_free(pl->fc_cnt);
    tide_free(pl->fc_done);
    tide_free(pl->id_rank);
    tide_free(pl->grp);
    tide_free(pl->goff);
    tide_free(pl->vol);
    tide_free(pl->alive_cnt);
    tide_free(pl->ns);
    tide_free(pl->act);
    tide_free(pl->mem);
    tide_free(pl->quota);
    tide_free(pl->snd);
    tide_free(pl->sq);
    tide_free(pl->load);
    tide_free(pl->cnt);
    tide_free(pl->send);
    tide_free(pl->recv);
    tide_free(pl->last_dst);
    tide_free(pl->sk_dv);
    tide_free(pl->sk_touched);
    tide_free(pl->out);
    memset(pl, 0, sizeof *pl);
}
