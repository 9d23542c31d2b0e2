/*
 * The walks over destinations (phases 1 and 3 of plan.c's outline): every new worker in
 * id order, every tensor of its stage ascending, and each piece it needs either copied
 * locally or taken from its holder node. The volume walk sums the nodes' volumes (by
 * tensor groups with multiplicity); the counting, writing and collecting walks cut each
 * node's stream of pieces at its senders' quotas and record items (put). Workload:
 * linear in the plan's items; a collecting walk (plan_for) passes the destinations one
 * worker takes no part in by groups.
 */
#include <stdio.h>
#include <string.h>

#include "core/error.h"
#include "reshard/plan_int.h"

/* Records one item in the current walk mode. */
static tide_status put(planner *pl, uint32_t sr, uint32_t dr, const tide_xfer *x)
{
    if (pl->mode == M_WRITE) {
        pl->out[pl->cnt[sr]++] = *x;
        return TIDE_OK;
    }
    uint64_t bytes = x->run * x->count;
    if (sr == dr) {
        pl->sum.n_copies++;
        pl->sum.bytes_local += bytes;
    } else {
        pl->sum.n_xfers++;
        pl->sum.bytes_sent += bytes;
        pl->send[sr] += bytes;
        pl->recv[dr] += bytes;
        if (pl->last_dst[sr] != dr + 1) {
            pl->last_dst[sr] = dr + 1;
            pl->sum.messages++;
        }
    }
    if (pl->mode == M_COUNT) {
        pl->cnt[sr]++;
        return TIDE_OK;
    }
    if (x->src != pl->filter && x->dst != pl->filter)
        return TIDE_OK;
    if (pl->out_n == pl->out_cap) {
        size_t cap = pl->out_cap ? pl->out_cap * 2 : 256;
        tide_xfer *grown = tide_reallocarray(pl->out, cap, sizeof *grown);
        if (grown == NULL)
            return tide_errorf(TIDE_ERR_NOMEM, "out of memory collecting %zu plan items", cap);
        pl->mem_bytes += (uint64_t)(cap - pl->out_cap) * sizeof *grown;
        pl->out = grown;
        pl->out_cap = cap;
    }
    pl->out[pl->out_n++] = *x;
    return TIDE_OK;
}

/* Emits sequence bytes [a, b) from rank sr to rank dr as 1..3 items (head, strided middle, tail).
 */
static tide_status emit_range(planner *pl, const seq *s, uint64_t a, uint64_t b, uint32_t sr,
                              uint32_t dr, uint32_t i, uint64_t sshift, uint64_t dshift)
{
    tide_xfer x;
    memset(&x, 0, sizeof x); /* padding too: plans compare equal byte for byte */
    x.tensor = i;
    x.src = pl->ids[sr];
    x.dst = pl->ids[dr];
    uint64_t ka = a / s->run, va = a % s->run, kb = b / s->run, vb = b % s->run;
    if (ka == kb) {
        x.run = b - a;
        x.count = 1;
        x.src_off = s->so + ka * s->sc + va - sshift;
        x.dst_off = s->dof + ka * s->dc + va - dshift;
        x.src_stride = x.dst_stride = x.run;
        return put(pl, sr, dr, &x);
    }
    if (va != 0) {
        x.run = s->run - va;
        x.count = 1;
        x.src_off = s->so + ka * s->sc + va - sshift;
        x.dst_off = s->dof + ka * s->dc + va - dshift;
        x.src_stride = x.dst_stride = x.run;
        TIDE_CHECK(put(pl, sr, dr, &x));
        ka++;
    }
    if (kb > ka) {
        x.run = s->run;
        x.count = kb - ka;
        x.src_off = s->so + ka * s->sc - sshift;
        x.dst_off = s->dof + ka * s->dc - dshift;
        x.src_stride = x.count > 1 ? s->sc : x.run;
        x.dst_stride = x.count > 1 ? s->dc : x.run;
        TIDE_CHECK(put(pl, sr, dr, &x));
    }
    if (vb != 0) {
        x.run = vb;
        x.count = 1;
        x.src_off = s->so + kb * s->sc - sshift;
        x.dst_off = s->dof + kb * s->dc - dshift;
        x.src_stride = x.dst_stride = x.run;
        TIDE_CHECK(put(pl, sr, dr, &x));
    }
    return TIDE_OK;
}

/* The error for bytes whose every holder is dead, naming the tensor and the region. */
static tide_status no_holder(planner *pl, uint32_t r, uint32_t i, int pk, int dk, int tk, int pn,
                             int dn, int tn)
{
    const tide_layout_t *o = pl->o;
    const tide_tensor_desc *t = &pl->c->t[i];
    const tide__tgeom *g = &pl->c->g[i];
    char region[192], holders[128];
    size_t at = 0;
    region[0] = holders[0] = '\0';
    uint64_t tpo = tide__tp_eff(t, o->tp);
    uint64_t co = g->d / (g->s * tpo);
    if (t->dp == TIDE_DP_SHARDED) {
        uint64_t r0, rl;
        tide__zero_range(g->a * g->s * co * g->b, (uint64_t)o->dp, (uint64_t)dk, &r0, &rl);
        at += (size_t)snprintf(region + at, sizeof region - at,
                               "elements [%llu, %llu) (dp rank %d's ZeRO-1 range) of ",
                               (unsigned long long)r0, (unsigned long long)(r0 + rl), dk);
    }
    if (t->tp == TIDE_TP_SPLIT && o->tp > 1) {
        unsigned long long lo = (unsigned long long)tk * co, hi = lo + co;
        if (t->tp_segments > 1)
            snprintf(region + at, sizeof region - at,
                     "tp shard %d of %d (dimension %d indices [%llu, %llu) of each of %d segments)",
                     tk, o->tp, t->tp_dim, lo, hi, t->tp_segments);
        else
            snprintf(region + at, sizeof region - at,
                     "tp shard %d of %d (dimension %d indices [%llu, %llu))", tk, o->tp, t->tp_dim,
                     lo, hi);
    } else {
        snprintf(region + at, sizeof region - at, "the whole tensor");
    }
    /* The dead holders, at most 8 listed. */
    size_t ha = 0;
    int listed = 0, more = 0;
    for (int p = 0; p < o->pp; p++)
        for (int d = 0; d < o->dp; d++)
            for (int tt = 0; tt < o->tp; tt++) {
                if ((pk != o->pp && p != pk) || (dk != o->dp && d != dk) ||
                    (tk != o->tp && tt != tk))
                    continue;
                if (listed == 8) {
                    more++;
                    continue;
                }
                int32_t w = o->worker[tide_layout_index(o, p, d, tt)];
                ha += (size_t)snprintf(holders + ha, sizeof holders - ha, "%s%d",
                                       listed ? ", " : "", (int)w);
                listed++;
            }
    if (more)
        snprintf(holders + ha, sizeof holders - ha, " and %d more", more);
    return tide_errorf(TIDE_ERR_NO_HOLDER,
                       "no live worker holds %s of %s, needed by worker %d at (pp %d, dp %d, tp "
                       "%d); its old holders (workers %s) are all dead",
                       region, t->name, (int)pl->ids[r], pn, dn, tn, holders);
}

/* One piece: sequence bytes [a, b) of tensor i for destination rank r, held by node keys. */
static tide_status piece(planner *pl, uint32_t r, uint32_t i, const seq *s, uint64_t a, uint64_t b,
                         uint64_t sshift, uint64_t dshift, int pk, int dk, int tk, const int *oc)
{
    const tide_layout_t *o = pl->o;
    int local = oc != NULL && (pk == o->pp || oc[0] == pk) && (dk == o->dp || oc[1] == dk) &&
                (tk == o->tp || oc[2] == tk);
    if (pl->mode == M_VOLUME) {
        if (local) {
            pl->bytes_local += b - a;
            return TIDE_OK;
        }
        pl->bytes_needed += b - a;
        if (pl->vol != NULL) {
            size_t id = node_id(pl, pk, dk, tk);
            if (pl->alive_cnt[id] == 0) {
                int pn, dn, tn;
                tide__coord(pl->nl, (size_t)pl->new_of[r], &pn, &dn, &tn);
                return no_holder(pl, r, i, pk, dk, tk, pn, dn, tn);
            }
            pl->vol[id] += b - a;
        }
        return TIDE_OK;
    }
    if (local)
        return emit_range(pl, s, a, b, r, r, i, sshift, dshift);
    node_state *ns = &pl->ns[node_id(pl, pk, dk, tk)];
    while (a < b) {
        if (ns->j >= ns->s_n)
            return tide_errorf(TIDE_ERR_INTERNAL, "reshard plan: a holder node ran out of quota");
        uint64_t q = pl->sq[ns->s_off + ns->j];
        uint64_t take = q - ns->used;
        if (take > b - a)
            take = b - a;
        TIDE_CHECK(
            emit_range(pl, s, a, a + take, pl->snd[ns->s_off + ns->j], r, i, sshift, dshift));
        a += take;
        ns->used += take;
        if (ns->used == q) {
            ns->j++;
            ns->used = 0;
        }
    }
    return TIDE_OK;
}

/*
 * For plan_for: destination r (not the filtered worker) by groups. When the
 * filtered worker sends it nothing (it is none of the senders whose quotas
 * cover r's chunk of each node stream), moves the node cursors past r's
 * chunks exactly as the tensor-by-tensor walk would and sets *skipped.
 */
static tide_status skip_dst(planner *pl, uint32_t r, int pn, int dn, int tn, const int *ocp,
                            int *skipped)
{
    size_t nt = 0;
    *skipped = 0;
    TIDE_CHECK(tide__plan_dst_chunks(pl, r, pn, dn, tn, ocp, pl->sk_dv, pl->sk_touched, &nt));
    int involved = 0;
    for (size_t k = 0; k < nt && !involved; k++) {
        const node_state *ns = &pl->ns[pl->sk_touched[k]];
        uint64_t v = pl->sk_dv[pl->sk_touched[k]], used = ns->used;
        for (uint32_t j = ns->j; j < ns->s_n && v > 0; j++, used = 0) {
            uint64_t take = pl->sq[ns->s_off + j] - used;
            involved = pl->ids[pl->snd[ns->s_off + j]] == pl->filter;
            if (involved)
                break;
            v -= take < v ? take : v;
        }
    }
    for (size_t k = 0; k < nt; k++) {
        uint32_t id = pl->sk_touched[k];
        node_state *ns = &pl->ns[id];
        uint64_t v = pl->sk_dv[id];
        pl->sk_dv[id] = 0;
        while (!involved && v > 0) {
            if (ns->j >= ns->s_n)
                return tide_errorf(TIDE_ERR_INTERNAL,
                                   "reshard plan: a holder node ran out of quota");
            uint64_t take = pl->sq[ns->s_off + ns->j] - ns->used;
            take = take < v ? take : v;
            ns->used += take;
            v -= take;
            if (ns->used == pl->sq[ns->s_off + ns->j]) {
                ns->j++;
                ns->used = 0;
            }
        }
    }
    *skipped = !involved;
    return TIDE_OK;
}

/*
 * Walks every destination in id order and every tensor of its stage in index
 * order. M_COLLECT skips, by groups, the destinations the filtered worker
 * neither is nor sends to (their bytes only move the node cursors).
 */
tide_status tide__plan_walk(planner *pl, int mode)
{
    pl->mode = mode;
    memset(pl->cls_stamp, 0, pl->n_cls * sizeof *pl->cls_stamp);
    for (uint32_t r = 0; r < pl->nr; r++) {
        if (pl->new_of[r] < 0)
            continue;
        int pn, dn, tn, oc[3];
        const int *ocp = dst_coords(pl, r, &pn, &dn, &tn, oc);
        pl->pool_n = 0;
        if (mode == M_COLLECT && pl->ids[r] != pl->filter) {
            int skipped = 0;
            TIDE_CHECK(skip_dst(pl, r, pn, dn, tn, ocp, &skipped));
            if (skipped)
                continue;
        }
        for (size_t k = pl->soff[pn]; k < pl->soff[pn + 1]; k++) {
            uint32_t i = pl->slist[k], n;
            const piece_t *p;
            TIDE_CHECK(tide__plan_get_pieces(pl, r, pl->cls_of[i], dn, tn, &p, &n));
            for (uint32_t x = 0; x < n; x++)
                TIDE_CHECK(piece(pl, r, i, &p[x].s, p[x].a, p[x].b, p[x].sshift, p[x].dshift,
                                 pl->pk_of[i], p[x].dk, p[x].tk, ocp));
        }
    }
    return TIDE_OK;
}

/*
 * The volume walk, by (class, old stage) groups with multiplicity instead of
 * tensor by tensor: sums node volumes, local bytes and the lower bound. When a
 * node has no live member it reruns tensor by tensor to name the first one.
 */
tide_status tide__plan_walk_volume(planner *pl)
{
    pl->mode = M_VOLUME;
    memset(pl->cls_stamp, 0, pl->n_cls * sizeof *pl->cls_stamp);
    const tide_layout_t *o = pl->o;
    int missing = 0;
    for (uint32_t r = 0; r < pl->nr && !missing; r++) {
        if (pl->new_of[r] < 0)
            continue;
        int pn, dn, tn, oc[3];
        const int *ocp = dst_coords(pl, r, &pn, &dn, &tn, oc);
        pl->pool_n = 0;
        for (size_t k = pl->goff[pn]; k < pl->goff[pn + 1]; k++) {
            const group *gr = &pl->grp[k];
            uint32_t n;
            const piece_t *p;
            TIDE_CHECK(tide__plan_get_pieces(pl, r, gr->cls, dn, tn, &p, &n));
            for (uint32_t x = 0; x < n; x++) {
                uint64_t len = (p[x].b - p[x].a) * gr->count;
                int pk = gr->pk, dk = p[x].dk, tk = p[x].tk;
                if (ocp != NULL && (pk == o->pp || ocp[0] == pk) && (dk == o->dp || ocp[1] == dk) &&
                    (tk == o->tp || ocp[2] == tk)) {
                    pl->bytes_local += len;
                    continue;
                }
                pl->bytes_needed += len;
                if (pl->vol == NULL)
                    continue;
                size_t id = node_id(pl, pk, dk, tk);
                if (pl->alive_cnt[id] == 0)
                    missing = 1;
                pl->vol[id] += len;
            }
        }
    }
    if (!missing)
        return TIDE_OK;
    tide_status rc = tide__plan_walk(pl, M_VOLUME); /* fails at the first tensor in plan order */
    return rc != TIDE_OK ? rc
                         : tide_errorf(TIDE_ERR_INTERNAL, "reshard plan: missing holder not found");
}
