/*
 * What a destination needs, as pieces (walk phase 1 and 3 read them): where an old tp
 * shard and the new one overlap is a strided sequence (K runs, one per [A, D, B] block;
 * see reshard_int.h), cut to byte ranges by the ZeRO-1 dp ranges, each range held by
 * one holder node. Pieces depend on a tensor's geometry class only, so they are
 * computed once per (class, new tp rank) for DP-replicated classes and once per
 * destination for the others. tide__overlap_bytes is the same geometry for one pair
 * of coordinates (placement's gains). Workload: every walk asks once per (destination,
 * tensor); O(1) per piece.
 */
#include <string.h>

#include "core/error.h"
#include "reshard/plan_int.h"

/* Sequence bytes whose offset on one side (base off, stride) is below q. */
static inline uint64_t seq_count(const seq *s, uint64_t off, uint64_t stride, uint64_t q)
{
    if (q <= off)
        return 0;
    uint64_t y = q - off, k = y / stride, rem = y % stride;
    if (k >= s->k)
        return s->k * s->run;
    return k * s->run + (rem < s->run ? rem : s->run);
}

/* Offset on one side of sequence byte pos. */
static inline uint64_t seq_off(const seq *s, uint64_t off, uint64_t stride, uint64_t pos)
{
    return off + (pos / s->run) * stride + pos % s->run;
}

uint64_t tide__overlap_bytes(const tide_collection_t *c, size_t i, int otp, int odp, int ot, int od,
                             int ntp, int ndp, int nt, int nd)
{
    const tide_tensor_desc *desc = &c->t[i];
    const tide__tgeom *g = &c->g[i];
    int split = desc->tp == TIDE_TP_SPLIT;
    uint64_t es = g->es, bb = g->b, kk = g->a * g->s;
    uint64_t tpo = split ? (uint64_t)otp : 1, tpn = split ? (uint64_t)ntp : 1;
    uint64_t to = split ? (uint64_t)ot : 0, tn = split ? (uint64_t)nt : 0;
    uint64_t co = g->d / (g->s * tpo), cn = g->d / (g->s * tpn);
    uint64_t lo = to * co > tn * cn ? to * co : tn * cn;
    uint64_t hi = (to + 1) * co < (tn + 1) * cn ? (to + 1) * co : (tn + 1) * cn;
    if (lo >= hi)
        return 0;
    seq s = {kk,           (hi - lo) * bb * es,      (lo - to * co) * bb * es,
             co * bb * es, (lo - tn * cn) * bb * es, cn * bb * es};
    if (desc->dp != TIDE_DP_SHARDED)
        return s.k * s.run;
    uint64_t q0, ql, r0, rl;
    tide__zero_range(kk * cn * bb, (uint64_t)ndp, (uint64_t)nd, &q0, &ql);
    tide__zero_range(kk * co * bb, (uint64_t)odp, (uint64_t)od, &r0, &rl);
    uint64_t a = seq_count(&s, s.dof, s.dc, q0 * es),
             b = seq_count(&s, s.dof, s.dc, (q0 + ql) * es);
    uint64_t ra = seq_count(&s, s.so, s.sc, r0 * es),
             rb = seq_count(&s, s.so, s.sc, (r0 + rl) * es);
    a = a > ra ? a : ra;
    b = b < rb ? b : rb;
    return a < b ? b - a : 0;
}

/* Appends one piece to the pool of the current destination. */
static tide_status pool_push(planner *pl, const seq *s, uint64_t a, uint64_t b, uint64_t sshift,
                             uint64_t dshift, int32_t dk, int32_t tk)
{
    if (pl->pool_n == pl->pool_cap) {
        size_t cap = pl->pool_cap ? pl->pool_cap * 2 : 64;
        piece_t *grown = tide_reallocarray(pl->pool, cap, sizeof *grown);
        if (grown == NULL)
            return tide_errorf(TIDE_ERR_NOMEM, "out of memory growing the piece pool to %zu", cap);
        pl->mem_bytes += (uint64_t)(cap - pl->pool_cap) * sizeof *grown;
        pl->pool = grown;
        pl->pool_cap = cap;
    }
    pl->pool[pl->pool_n++] = (piece_t){*s, a, b, sshift, dshift, dk, tk};
    return TIDE_OK;
}

/*
 * All pieces of geometry class cls for a destination at new (dp rank dn, tp
 * rank tn), appended to the pool: one per old tp chunk overlapping the new one
 * (and, for a ZeRO-1 tensor, per old dp range overlapping the new range).
 * Pieces do not depend on the tensor's stage; node keys are (stage, dk, tk).
 */
static tide_status class_pieces(planner *pl, uint32_t cls, int dn, int tn)
{
    const tide_layout_t *o = pl->o, *nl = pl->nl;
    uint32_t i = pl->cls_rep[cls];
    const tide_tensor_desc *desc = &pl->c->t[i];
    const tide__tgeom *g = &pl->c->g[i];
    int split = desc->tp == TIDE_TP_SPLIT;
    uint64_t es = g->es, bb = g->b, kk = g->a * g->s;
    uint64_t tpo = split ? (uint64_t)o->tp : 1, tpn = split ? (uint64_t)nl->tp : 1;
    uint64_t tnn = split ? (uint64_t)tn : 0;
    uint64_t co = g->d / (g->s * tpo), cn = g->d / (g->s * tpn);
    int sharded = desc->dp == TIDE_DP_SHARDED;
    uint64_t q0 = 0, q1 = 0, n_old = kk * co * bb;
    if (sharded) {
        uint64_t len;
        tide__zero_range(kk * cn * bb, (uint64_t)nl->dp, (uint64_t)dn, &q0, &len);
        if (len == 0)
            return TIDE_OK;
        q1 = (q0 + len) * es;
        q0 *= es;
    }
    uint64_t t_lo = tnn * cn / co, t_hi = ((tnn + 1) * cn - 1) / co;
    for (uint64_t t = t_lo; t <= t_hi; t++) {
        uint64_t lo = t * co > tnn * cn ? t * co : tnn * cn;
        uint64_t hi = (t + 1) * co < (tnn + 1) * cn ? (t + 1) * co : (tnn + 1) * cn;
        seq s = {kk,           (hi - lo) * bb * es,       (lo - t * co) * bb * es,
                 co * bb * es, (lo - tnn * cn) * bb * es, cn * bb * es};
        if (s.k == 1 || (s.run == s.sc && s.run == s.dc)) { /* contiguous on both sides */
            s.run *= s.k;
            s.k = 1;
            s.sc = s.dc = s.run;
        }
        int32_t tk = split ? (int32_t)t : o->tp;
        if (!sharded) {
            TIDE_CHECK(pool_push(pl, &s, 0, s.k * s.run, 0, 0, o->dp, tk));
            continue;
        }
        uint64_t p0 = seq_count(&s, s.dof, s.dc, q0), p1 = seq_count(&s, s.dof, s.dc, q1);
        if (p0 >= p1)
            continue;
        uint64_t uf = seq_off(&s, s.so, s.sc, p0) / es, ul = seq_off(&s, s.so, s.sc, p1 - 1) / es;
        uint64_t df = tide__zero_owner(n_old, (uint64_t)o->dp, uf);
        uint64_t dl = tide__zero_owner(n_old, (uint64_t)o->dp, ul);
        for (uint64_t d = df; d <= dl; d++) {
            uint64_t r0, rl;
            tide__zero_range(n_old, (uint64_t)o->dp, d, &r0, &rl);
            if (rl == 0)
                continue;
            uint64_t a = seq_count(&s, s.so, s.sc, r0 * es);
            uint64_t b = seq_count(&s, s.so, s.sc, (r0 + rl) * es);
            if (a < p0)
                a = p0;
            if (b > p1)
                b = p1;
            if (a < b)
                TIDE_CHECK(pool_push(pl, &s, a, b, r0 * es, q0, (int32_t)d, tk));
        }
    }
    return TIDE_OK;
}

/* The pieces of class cls for destination rank r at new (dn, tn): those of a DP-replicated
 * class once per (class, tn), the others once per destination. */
tide_status tide__plan_get_pieces(planner *pl, uint32_t r, uint32_t cls, int dn, int tn,
                                  const piece_t **p, uint32_t *n)
{
    if (pl->c->t[pl->cls_rep[cls]].dp != TIDE_DP_SHARDED) {
        size_t key = (size_t)cls * (size_t)pl->nl->tp + (size_t)tn;
        if (!pl->fc_done[key]) {
            size_t at = pl->pool_n;
            TIDE_CHECK(class_pieces(pl, cls, dn, tn));
            size_t k = pl->pool_n - at;
            if (pl->fpool_n + k > pl->fpool_cap) {
                size_t cap = pl->fpool_cap ? pl->fpool_cap * 2 : 64;
                while (cap < pl->fpool_n + k)
                    cap *= 2;
                piece_t *grown = tide_reallocarray(pl->fpool, cap, sizeof *grown);
                if (grown == NULL)
                    return tide_errorf(TIDE_ERR_NOMEM, "out of memory keeping %zu pieces", cap);
                pl->mem_bytes += (uint64_t)(cap - pl->fpool_cap) * sizeof *grown;
                pl->fpool = grown;
                pl->fpool_cap = cap;
            }
            memcpy(pl->fpool + pl->fpool_n, pl->pool + at, k * sizeof *pl->fpool);
            pl->fc_off[key] = (uint32_t)pl->fpool_n;
            pl->fc_cnt[key] = (uint32_t)k;
            pl->fc_done[key] = 1;
            pl->fpool_n += k;
            pl->pool_n = at;
        }
        *p = pl->fpool + pl->fc_off[key];
        *n = pl->fc_cnt[key];
        return TIDE_OK;
    }
    if (pl->cls_stamp[cls] != r + 1) {
        size_t at = pl->pool_n;
        TIDE_CHECK(class_pieces(pl, cls, dn, tn));
        pl->cls_stamp[cls] = r + 1;
        pl->cls_off[cls] = (uint32_t)at;
        pl->cls_cnt[cls] = (uint32_t)(pl->pool_n - at);
    }
    *p = pl->pool + pl->cls_off[cls];
    *n = pl->cls_cnt[cls];
    return TIDE_OK;
}

tide_status tide__plan_dst_chunks(planner *pl, uint32_t r, int pn, int dn, int tn, const int *ocp,
                                  uint64_t *dv, uint32_t *touched, size_t *nt)
{
    const tide_layout_t *o = pl->o;
    for (size_t k = pl->goff[pn]; k < pl->goff[pn + 1]; k++) {
        const group *gr = &pl->grp[k];
        uint32_t n;
        const piece_t *p;
        TIDE_CHECK(tide__plan_get_pieces(pl, r, gr->cls, dn, tn, &p, &n));
        for (uint32_t x = 0; x < n; x++) {
            int pk = gr->pk, dk = p[x].dk, tk = p[x].tk;
            if (ocp != NULL && (pk == o->pp || ocp[0] == pk) && (dk == o->dp || ocp[1] == dk) &&
                (tk == o->tp || ocp[2] == tk))
                continue;
            size_t id = node_id(pl, pk, dk, tk);
            if (dv[id] == 0)
                touched[(*nt)++] = (uint32_t)id;
            dv[id] += (p[x].b - p[x].a) * gr->count;
        }
    }
    return TIDE_OK;
}
