/*
 * The reshard planner: which bytes go from which worker to which worker when
 * a job's state moves from one layout to another.
 *
 * Workload: ~10^3..10^5 tensors, a few thousand workers; planning a 175B GPT
 * over 1,024 workers must take tens of milliseconds on one core, and every
 * worker plans the same thing, so the algorithm is linear in its output:
 *
 *  1. Walk every destination (new workers in id order) and every tensor its
 *     stage holds (ascending). The intersection of the new shard with each old
 *     shard it overlaps is a strided "sequence" (K runs, one per [A, D, B]
 *     block; see reshard_int.h) cut to a byte range by the ZeRO-1 dp ranges:
 *     1..3 plan items. Each such piece is either held by the destination
 *     (local copy) or must be sent by a member of its *holder node*: the live
 *     old workers at (stage or all stages, dp rank or all, tp rank or all).
 *     Holder nodes are few ((pp+1)(dp+1)(tp+1)), so volumes are summed per node.
 *  2. Balance: water-fill each node's volume onto its members' send loads,
 *     smallest nodes first, then re-pour each node given the others until
 *     nothing changes (block coordinate descent). Without ZeRO-sharded
 *     tensors the nodes form a laminar family and the first pass is optimal;
 *     in general a fixed point is optimal for the splittable min-max problem.
 *  3. Walk again and cut each node's stream of pieces (in destination order)
 *     at its senders' quotas, so each sender serves a contiguous run of
 *     destinations (few messages). Items are counted per source, then written
 *     straight into their sorted place: the walk order is (dst, tensor,
 *     dst_off), so a stable bucket by src gives (src, dst, tensor, dst_off).
 *
 * Nothing here is quadratic in workers: the cost is O(items + workers * 8)
 * plus small sorts of node members.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "core/log.h"
#include "core/sort.h"
#include "reshard/reshard_int.h"

/* Re-pour passes after the first; each is O(node members), a few thousand entries. */
#define MAX_BALANCE_PASSES 8

static _Thread_local uint64_t last_peak;

uint64_t tide__reshard_peak_bytes(void)
{
    return last_peak;
}

void tide__reshard_set_peak(uint64_t bytes)
{
    last_peak = bytes;
}

/* K runs of `run` bytes at so + k * sc in the old tp shard and dof + k * dc in the new one. */
typedef struct seq {
    uint64_t k, run;
    uint64_t so, sc;
    uint64_t dof, dc;
} seq;

/* A piece of one (destination, geometry class): sequence bytes [a, b) held by node (., dk, tk). */
typedef struct piece_t {
    seq s;
    uint64_t a, b;
    uint64_t sshift, dshift; /* start of the source / destination local buffer in the tp shard */
    int32_t dk, tk;
} piece_t;

/* count tensors of one geometry class and old stage key in a new stage. */
typedef struct group {
    uint32_t cls;
    int32_t pk;
    uint64_t count;
} group;

enum walk_mode {
    M_VOLUME,  /* sum node volumes, local bytes, the lower bound; detect missing holders */
    M_COUNT,   /* assign senders, count items per source, fill the summary */
    M_WRITE,   /* assign senders again, write items in sorted order */
    M_COLLECT, /* assign senders, fill the summary, keep the items touching one worker */
};

typedef struct node_state {
    uint32_t m_off, m_n; /* members: mem[m_off .. m_off + m_n), ascending rank */
    uint32_t s_off, s_n; /* senders with a positive quota: snd/sq[s_off ..) */
    uint32_t j;          /* cursor: current sender */
    uint64_t used;       /* bytes of the current sender's quota already assigned */
} node_state;

typedef struct planner {
    const tide_layout_t *o, *nl;
    const tide_collection_t *c;
    const uint8_t *alive;
    size_t n_alive;
    /* Worker universe: ranks index ids[], the sorted ids of old and new workers. */
    int32_t *ids;
    uint32_t nr;
    uint32_t *id_rank; /* id -> rank when ids are dense enough (else NULL: binary search) */
    size_t n_id_rank;
    int32_t *old_of, *new_of; /* rank -> layout index, or -1 */
    uint32_t *old_rank;       /* old layout index -> rank */
    int32_t *pk_of;           /* tensor -> old stage key (o->pp for ALL) */
    uint32_t *slist;          /* tensors of each new stage, ascending */
    size_t *soff;             /* new pp + 1 offsets into slist */
    /* Geometry classes: tensors whose pieces are identical for every destination. */
    uint32_t *cls_of;  /* tensor -> class */
    uint32_t *cls_rep; /* class -> first tensor of the class */
    uint32_t n_cls;
    uint32_t *cls_stamp, *cls_off, *cls_cnt; /* per class: 1 + rank cached, pool slice */
    piece_t *pool;                           /* pieces of the current destination */
    size_t pool_n, pool_cap;
    /* DP-replicated classes: their pieces depend on the new tp rank only (not on the dp
       rank), so they are computed once per (class, tp rank) for every destination. */
    piece_t *fpool;
    size_t fpool_n, fpool_cap;
    uint32_t *fc_off, *fc_cnt; /* [class * new tp + tp rank] */
    uint8_t *fc_done;
    group *grp;   /* (class, old stage) groups of each new stage */
    size_t *goff; /* new pp + 1 offsets into grp */
    /* Holder nodes (pk, dk, tk); the key equal to a degree means "all". */
    size_t n_nodes;
    uint64_t *vol;       /* bytes each node must send (NULL: lower bound only) */
    uint32_t *alive_cnt; /* live members per node */
    node_state *ns;
    uint32_t *act; /* nodes with volume, in balancing order */
    size_t n_act;
    uint32_t *mem;   /* member ranks of active nodes */
    uint64_t *quota; /* parallel to mem */
    uint32_t *snd;   /* sender ranks of active nodes */
    uint64_t *sq;    /* parallel to snd */
    uint64_t *load;  /* per rank: bytes it sends */
    /* Walk state. */
    int mode;
    int32_t filter; /* M_COLLECT: the worker whose items are kept */
    uint64_t bytes_local, bytes_needed;
    size_t *cnt; /* per rank: items (M_COUNT), then write cursor (M_WRITE) */
    uint64_t *send, *recv;
    uint32_t *last_dst;   /* per rank: 1 + rank of the last destination it sent to */
    uint64_t *sk_dv;      /* M_COLLECT: per node, bytes the current destination takes */
    uint32_t *sk_touched; /* M_COLLECT: the nodes it takes from */
    tide_plan_summary sum;
    tide_xfer *out;
    size_t out_n, out_cap;
    uint64_t mem_bytes; /* bytes allocated by this planner call (all live until the end) */
} planner;

static void *pl_calloc(planner *pl, size_t n, size_t size)
{
    void *p = tide_calloc(n, size);
    if (p != NULL)
        pl->mem_bytes += (uint64_t)(n ? n : 1) * (size ? size : 1);
    return p;
}

static void planner_free(planner *pl)
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

static inline size_t node_id(const planner *pl, int pk, int dk, int tk)
{
    return ((size_t)pk * ((size_t)pl->o->dp + 1) + (size_t)dk) * ((size_t)pl->o->tp + 1) +
           (size_t)tk;
}

static void node_keys(const planner *pl, size_t id, int *pk, int *dk, int *tk)
{
    *tk = (int)(id % ((size_t)pl->o->tp + 1));
    id /= (size_t)pl->o->tp + 1;
    *dk = (int)(id % ((size_t)pl->o->dp + 1));
    *pk = (int)(id / ((size_t)pl->o->dp + 1));
}

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

static int same_class(const tide_collection_t *c, uint32_t i, uint32_t j)
{
    const tide__tgeom *x = &c->g[i], *y = &c->g[j];
    return x->a == y->a && x->d == y->d && x->b == y->b && x->s == y->s && x->es == y->es &&
           c->t[i].tp == c->t[j].tp && c->t[i].dp == c->t[j].dp;
}

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

/*
 * Validates the inputs and builds the worker universe, the per-stage tensor
 * lists and (with_nodes) the holder nodes' live-member counts.
 */
static tide_status planner_init(planner *pl, const tide_layout_t *old_l, const tide_layout_t *new_l,
                                const tide_collection_t *c, const uint8_t *alive, size_t n_alive,
                                int with_nodes)
{
    tide_status rc = TIDE_OK;
    memset(pl, 0, sizeof *pl);
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
    pl->o = old_l;
    pl->nl = new_l;
    pl->c = c;
    pl->alive = alive;
    pl->n_alive = n_alive;
    size_t no = tide_layout_size(old_l), nn = tide_layout_size(new_l);

    /* Universe of worker ids, ascending: ranks give compact per-worker arrays. */
    pl->ids = pl_calloc(pl, no + nn, sizeof *pl->ids);
    TIDE_CHECK_ALLOC_GOTO(pl->ids, rc, fail);
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
        TIDE_CHECK_ALLOC_GOTO(pl->id_rank, rc, fail);
        for (size_t r = 0; r < nr; r++)
            pl->id_rank[pl->ids[r]] = (uint32_t)r;
    }
    pl->old_of = pl_calloc(pl, nr, sizeof *pl->old_of);
    TIDE_CHECK_ALLOC_GOTO(pl->old_of, rc, fail);
    pl->new_of = pl_calloc(pl, nr, sizeof *pl->new_of);
    TIDE_CHECK_ALLOC_GOTO(pl->new_of, rc, fail);
    pl->old_rank = pl_calloc(pl, no, sizeof *pl->old_rank);
    TIDE_CHECK_ALLOC_GOTO(pl->old_rank, rc, fail);
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
        if (!tide__is_alive(alive, n_alive, w)) {
            int p, d, t;
            tide__coord(new_l, i, &p, &d, &t);
            TIDE_FAIL_GOTO(rc, fail, TIDE_ERR_INVALID,
                           "worker %d is in the new layout at (pp %d, dp %d, tp %d) but is not "
                           "alive",
                           (int)w, p, d, t);
        }
    }

    /* Old stage key of each tensor and the tensors of each new stage, ascending. */
    size_t nt = c->n;
    pl->pk_of = pl_calloc(pl, nt, sizeof *pl->pk_of);
    TIDE_CHECK_ALLOC_GOTO(pl->pk_of, rc, fail);
    pl->soff = pl_calloc(pl, (size_t)new_l->pp + 1, sizeof *pl->soff);
    TIDE_CHECK_ALLOC_GOTO(pl->soff, rc, fail);
    size_t total = 0;
    for (size_t i = 0; i < nt; i++) {
        int layer = c->t[i].layer;
        pl->pk_of[i] = layer == TIDE_LAYER_ALL ? old_l->pp : tide__stage_of(old_l, layer);
        if (layer == TIDE_LAYER_ALL) {
            for (int s = 0; s < new_l->pp; s++)
                pl->soff[s + 1]++;
            total += (size_t)new_l->pp;
        } else {
            pl->soff[tide__stage_of(new_l, layer) + 1]++;
            total++;
        }
    }
    for (int s = 0; s < new_l->pp; s++)
        pl->soff[s + 1] += pl->soff[s];
    pl->slist = pl_calloc(pl, total, sizeof *pl->slist);
    TIDE_CHECK_ALLOC_GOTO(pl->slist, rc, fail);
    {
        size_t *fill = pl_calloc(pl, (size_t)new_l->pp, sizeof *fill);
        TIDE_CHECK_ALLOC_GOTO(fill, rc, fail);
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
    }
    TIDE_CHECK_GOTO(build_classes(pl), rc, fail);
    if (!with_nodes)
        return TIDE_OK;

    /* Live members per holder node: each live old worker is in 8 nodes. */
    pl->n_nodes = ((size_t)old_l->pp + 1) * ((size_t)old_l->dp + 1) * ((size_t)old_l->tp + 1);
    pl->vol = pl_calloc(pl, pl->n_nodes, sizeof *pl->vol);
    TIDE_CHECK_ALLOC_GOTO(pl->vol, rc, fail);
    pl->alive_cnt = pl_calloc(pl, pl->n_nodes, sizeof *pl->alive_cnt);
    TIDE_CHECK_ALLOC_GOTO(pl->alive_cnt, rc, fail);
    for (size_t i = 0; i < no; i++) {
        if (!tide__is_alive(alive, n_alive, old_l->worker[i]))
            continue;
        int p, d, t;
        tide__coord(old_l, i, &p, &d, &t);
        for (int m = 0; m < 8; m++)
            pl->alive_cnt[node_id(pl, (m & 1) ? old_l->pp : p, (m & 2) ? old_l->dp : d,
                                  (m & 4) ? old_l->tp : t)]++;
    }
    pl->load = pl_calloc(pl, nr, sizeof *pl->load);
    TIDE_CHECK_ALLOC_GOTO(pl->load, rc, fail);
    return TIDE_OK;
fail:
    planner_free(pl);
    return rc;
}

/* ---- pieces ------------------------------------------------------------------------------ */

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
static tide_status get_pieces(planner *pl, uint32_t r, uint32_t cls, int dn, int tn,
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

/* Destination rank r's new coordinate and, when it was in the old layout, its old one. */
static const int *dst_coords(const planner *pl, uint32_t r, int *pn, int *dn, int *tn, int *oc)
{
    tide__coord(pl->nl, (size_t)pl->new_of[r], pn, dn, tn);
    if (pl->old_of[r] < 0)
        return NULL;
    tide__coord(pl->o, (size_t)pl->old_of[r], &oc[0], &oc[1], &oc[2]);
    return oc;
}

static tide_status skip_dst(planner *pl, uint32_t r, int pn, int dn, int tn, const int *ocp,
                            int *skipped);

/*
 * Walks every destination in id order and every tensor of its stage in index
 * order. M_COLLECT skips, by groups, the destinations the filtered worker
 * neither is nor sends to (their bytes only move the node cursors).
 */
static tide_status walk(planner *pl, int mode)
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
            TIDE_CHECK(get_pieces(pl, r, pl->cls_of[i], dn, tn, &p, &n));
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
static tide_status walk_volume(planner *pl)
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
            TIDE_CHECK(get_pieces(pl, r, gr->cls, dn, tn, &p, &n));
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
    tide_status rc = walk(pl, M_VOLUME); /* fails at the first tensor in plan order */
    return rc != TIDE_OK ? rc
                         : tide_errorf(TIDE_ERR_INTERNAL, "reshard plan: missing holder not found");
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
    const tide_layout_t *o = pl->o;
    size_t nt = 0;
    *skipped = 0;
    for (size_t k = pl->goff[pn]; k < pl->goff[pn + 1]; k++) {
        const group *gr = &pl->grp[k];
        uint32_t n;
        const piece_t *p;
        TIDE_CHECK(get_pieces(pl, r, gr->cls, dn, tn, &p, &n));
        for (uint32_t x = 0; x < n; x++) {
            int pk = gr->pk, dk = p[x].dk, tk = p[x].tk;
            if (ocp != NULL && (pk == o->pp || ocp[0] == pk) && (dk == o->dp || ocp[1] == dk) &&
                (tk == o->tp || ocp[2] == tk))
                continue;
            size_t id = node_id(pl, pk, dk, tk);
            if (pl->sk_dv[id] == 0)
                pl->sk_touched[nt++] = (uint32_t)id;
            pl->sk_dv[id] += (p[x].b - p[x].a) * gr->count;
        }
    }
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

/* ---- balancing ----------------------------------------------------------------------------- */

typedef struct level {
    uint64_t load;
    uint32_t rank, j;
} level;

/* (load, rank) order; ranks are distinct within a node, so it is a total order and the
 * water level below has one answer whatever order selection visits the members in. */
static inline int level_less(const level *x, const level *y)
{
    return x->load < y->load || (x->load == y->load && x->rank < y->rank);
}

static inline void level_swap(level *t, uint32_t a, uint32_t b)
{
    level x = t[a];
    t[a] = t[b];
    t[b] = x;
}

/* Partitions t[lo, hi) around a pseudo-random pivot (an xorshift state in *rng: expected
 * linear time on any input); returns its final index p: t[lo, p) < t[p] < t[p + 1, hi). */
static uint32_t level_partition(level *t, uint32_t lo, uint32_t hi, uint64_t *rng)
{
    uint64_t x = *rng;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    *rng = x;
    level_swap(t, lo + (uint32_t)(x % (hi - lo)), hi - 1);
    level p = t[hi - 1];
    uint32_t at = lo;
    for (uint32_t i = lo; i + 1 < hi; i++)
        if (level_less(&t[i], &p))
            level_swap(t, i, at++);
    level_swap(t, at, hi - 1);
    return at;
}

/* Rearranges t[lo, hi) so that t[lo, lo + n) holds its n smallest members (any order). */
static void level_select(level *t, uint32_t lo, uint32_t hi, uint32_t n, uint64_t *rng)
{
    uint32_t want = lo + n;
    while (hi - lo > 1 && want > lo && want < hi) {
        uint32_t p = level_partition(t, lo, hi, rng);
        if (p == want)
            return;
        if (p < want)
            lo = p + 1;
        else
            hi = p;
    }
}

/*
 * Water-fills node volume V onto its members given their loads without this
 * node: the lowest members rise to a common level (integer bytes, the spare
 * bytes to the lowest (load, rank)). Writes the quotas; returns whether any
 * changed. Selection instead of a sort: expected O(members), where sorting every
 * member of every node on every balancing pass was most of a plan's time at 10^4
 * workers (nodes of replicated tensors hold thousands of members).
 */
static int pour(planner *pl, const node_state *ns, uint64_t vol, level *tmp)
{
    uint32_t m = ns->m_n;
    const uint32_t *mem = pl->mem + ns->m_off;
    uint64_t *q = pl->quota + ns->m_off;
    uint64_t rng = 0x9e3779b97f4a7c15ull ^ m;
    for (uint32_t j = 0; j < m; j++) {
        tmp[j].load = pl->load[mem[j]];
        tmp[j].rank = mem[j];
        tmp[j].j = j;
    }
    /* The largest k whose lowest k members can all be raised to the k-th lowest load
     * within vol (that count only grows with k): tmp[0, lo) are the lo lowest, all of them
     * raised; cum is their load. */
    uint32_t lo = 0, hi = m;
    uint64_t cum = 0;
    while (lo < hi) {
        uint32_t p = level_partition(tmp, lo, hi, &rng);
        uint64_t below = cum;
        for (uint32_t x = lo; x < p; x++)
            below += tmp[x].load;
        uint64_t need = (uint64_t)(p + 1) * tmp[p].load - (below + tmp[p].load);
        if (need <= vol) {
            cum = below + tmp[p].load;
            lo = p + 1;
        } else {
            hi = p;
        }
    }
    uint32_t k = lo;
    uint64_t total = vol + cum, base = total / k, rem = total % k;
    level_select(tmp, 0, k, (uint32_t)rem, &rng); /* the spare bytes' takers first */
    int changed = 0;
    for (uint32_t x = 0; x < m; x++) {
        uint64_t nq = 0;
        if (x < k)
            nq = base + (x < rem ? 1u : 0u) - tmp[x].load;
        if (q[tmp[x].j] != nq)
            changed = 1;
        q[tmp[x].j] = nq;
    }
    return changed;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

/* Orders the active nodes by (live members, id): smallest holder sets pour first. */
static tide_status sort_act(planner *pl)
{
    uint64_t *keys = tide_calloc(pl->n_act ? pl->n_act : 1, sizeof *keys);
    if (keys == NULL)
        return tide_errorf(TIDE_ERR_NOMEM, "out of memory ordering holder nodes");
    pl->mem_bytes += pl->n_act * sizeof *keys;
    for (size_t k = 0; k < pl->n_act; k++)
        keys[k] = ((uint64_t)pl->alive_cnt[pl->act[k]] << 32) | pl->act[k];
    qsort(keys, pl->n_act, sizeof *keys, cmp_u64);
    for (size_t k = 0; k < pl->n_act; k++)
        pl->act[k] = (uint32_t)keys[k];
    tide_free(keys);
    return TIDE_OK;
}

/* The members of each active node (a node holding volume), ascending rank (= ascending
 * worker id), and the planner's per-member arrays; *max_m: the most members of one node. */
static tide_status gather_members(planner *pl, uint32_t *max_m)
{
    const tide_layout_t *o = pl->o;
    size_t n_act = 0, n_mem = 0;
    *max_m = 1;
    for (size_t id = 0; id < pl->n_nodes; id++) {
        if (pl->vol[id] == 0)
            continue;
        n_act++;
        n_mem += pl->alive_cnt[id];
        if (pl->alive_cnt[id] > *max_m)
            *max_m = pl->alive_cnt[id];
    }
    pl->ns = pl_calloc(pl, pl->n_nodes, sizeof *pl->ns);
    pl->act = pl_calloc(pl, n_act, sizeof *pl->act);
    pl->mem = pl_calloc(pl, n_mem, sizeof *pl->mem);
    pl->quota = pl_calloc(pl, n_mem, sizeof *pl->quota);
    pl->snd = pl_calloc(pl, n_mem, sizeof *pl->snd);
    pl->sq = pl_calloc(pl, n_mem, sizeof *pl->sq);
    if (pl->ns == NULL || pl->act == NULL || pl->mem == NULL || pl->quota == NULL ||
        pl->snd == NULL || pl->sq == NULL)
        return tide_errorf(TIDE_ERR_NOMEM, "out of memory for %zu holder nodes", n_act);
    size_t at = 0;
    for (size_t id = 0; id < pl->n_nodes; id++) {
        if (pl->vol[id] == 0)
            continue;
        pl->act[pl->n_act++] = (uint32_t)id;
        int pk, dk, tk;
        node_keys(pl, id, &pk, &dk, &tk);
        node_state *ns = &pl->ns[id];
        ns->m_off = (uint32_t)at;
        int p0 = pk == o->pp ? 0 : pk, p1 = pk == o->pp ? o->pp : pk + 1;
        int d0 = dk == o->dp ? 0 : dk, d1 = dk == o->dp ? o->dp : dk + 1;
        int t0 = tk == o->tp ? 0 : tk, t1 = tk == o->tp ? o->tp : tk + 1;
        for (int p = p0; p < p1; p++)
            for (int d = d0; d < d1; d++)
                for (int t = t0; t < t1; t++) {
                    size_t idx = tide_layout_index(o, p, d, t);
                    if (tide__is_alive(pl->alive, pl->n_alive, o->worker[idx]))
                        pl->mem[at++] = pl->old_rank[idx];
                }
        ns->m_n = (uint32_t)(at - ns->m_off);
        tide_sort_u32(pl->mem + ns->m_off, ns->m_n);
    }
    return sort_act(pl);
}

/* Pass 0 pours smallest nodes first; later passes re-pour each node given the others.
 * A node none of whose members' loads moved since its last pour would pour the same
 * quotas again (pour depends only on those loads), so it is skipped: the quotas are
 * the same as re-pouring every node, at a fraction of the sorting. */
static tide_status pour_passes(planner *pl, uint32_t max_m)
{
    tide_status rc = TIDE_OK;
    level *tmp = pl_calloc(pl, max_m, sizeof *tmp);
    /* the step a rank's load last moved; a node's last pour */
    uint64_t *lchg = pl_calloc(pl, pl->nr ? pl->nr : 1, sizeof *lchg);
    uint64_t *pstep = pl_calloc(pl, pl->n_act ? pl->n_act : 1, sizeof *pstep);
    if (tmp == NULL || lchg == NULL || pstep == NULL) {
        rc = tide_errorf(TIDE_ERR_NOMEM, "out of memory balancing %zu holder nodes", pl->n_act);
        goto out;
    }
    uint64_t step = 0;
    for (int pass = 0; pass <= MAX_BALANCE_PASSES; pass++) {
        int changed = 0;
        for (size_t k = 0; k < pl->n_act; k++) {
            node_state *ns = &pl->ns[pl->act[k]];
            const uint32_t *mem = pl->mem + ns->m_off;
            uint64_t *q = pl->quota + ns->m_off;
            if (pass > 0) {
                int dirty = 0;
                for (uint32_t j = 0; j < ns->m_n && !dirty; j++)
                    dirty = lchg[mem[j]] > pstep[k];
                if (!dirty)
                    continue;
            }
            step++;
            for (uint32_t j = 0; j < ns->m_n; j++)
                pl->load[mem[j]] -= q[j];
            int moved = pour(pl, ns, pl->vol[pl->act[k]], tmp);
            for (uint32_t j = 0; j < ns->m_n; j++) {
                pl->load[mem[j]] += q[j];
                if (moved)
                    lchg[mem[j]] = step;
            }
            pstep[k] = step;
            changed |= moved;
        }
        if (!changed || pass == MAX_BALANCE_PASSES)
            break;
    }
out:
    tide_free(tmp);
    tide_free(lchg);
    tide_free(pstep);
    return rc;
}

/* Senders: members with a positive quota, ascending worker id. */
static void list_senders(planner *pl)
{
    size_t at = 0;
    for (size_t k = 0; k < pl->n_act; k++) {
        node_state *ns = &pl->ns[pl->act[k]];
        ns->s_off = (uint32_t)at;
        for (uint32_t j = 0; j < ns->m_n; j++) {
            uint64_t q = pl->quota[ns->m_off + j];
            if (q == 0)
                continue;
            pl->snd[at] = pl->mem[ns->m_off + j];
            pl->sq[at] = q;
            at++;
        }
        ns->s_n = (uint32_t)(at - ns->s_off);
    }
}

static tide_status balance(planner *pl)
{
    uint32_t max_m;
    TIDE_CHECK(gather_members(pl, &max_m));
    TIDE_CHECK(pour_passes(pl, max_m));
    list_senders(pl);
    return TIDE_OK;
}

/* Ceil(a / b) with b > 0. */
static uint64_t ceil_div(uint64_t a, uint64_t b)
{
    return a / b + (a % b != 0);
}

/*
 * A lower bound on the largest per-worker send: the bytes that only the
 * members of a set X hold, divided by |X|, for (1) every holder node X
 * (summing the nodes key-wise inside it) and (2) the closure of the most
 * loaded worker under "a node sending to X brings all its members", which
 * equals the optimum when balancing reached its fixed point.
 */
static tide_status balanced_bound(planner *pl, uint64_t *out)
{
    const tide_layout_t *o = pl->o;
    size_t np = (size_t)o->pp + 1, nd = (size_t)o->dp + 1, nt = (size_t)o->tp + 1;
    uint64_t best = 0;
    uint64_t *s = tide_calloc(pl->n_nodes, sizeof *s);
    if (s == NULL)
        return tide_errorf(TIDE_ERR_NOMEM, "out of memory computing the balanced bound");
    pl->mem_bytes += pl->n_nodes * sizeof *s;
    memcpy(s, pl->vol, pl->n_nodes * sizeof *s);
    /* Zeta transform: the "all" key of each dimension accumulates the specific keys. */
    for (size_t p = 0; p < np; p++)
        for (size_t d = 0; d < nd; d++)
            for (size_t t = 0; t + 1 < nt; t++)
                s[(p * nd + d) * nt + nt - 1] += s[(p * nd + d) * nt + t];
    for (size_t p = 0; p < np; p++)
        for (size_t t = 0; t < nt; t++)
            for (size_t d = 0; d + 1 < nd; d++)
                s[(p * nd + nd - 1) * nt + t] += s[(p * nd + d) * nt + t];
    for (size_t d = 0; d < nd; d++)
        for (size_t t = 0; t < nt; t++)
            for (size_t p = 0; p + 1 < np; p++)
                s[((np - 1) * nd + d) * nt + t] += s[(p * nd + d) * nt + t];
    for (size_t id = 0; id < pl->n_nodes; id++)
        if (pl->alive_cnt[id] > 0 && s[id] > 0) {
            uint64_t b = ceil_div(s[id], pl->alive_cnt[id]);
            if (b > best)
                best = b;
        }
    tide_free(s);

    /* Closure of the most loaded worker. */
    uint32_t wmax = 0;
    for (uint32_t r = 1; r < pl->nr; r++)
        if (pl->load[r] > pl->load[wmax])
            wmax = r;
    if (pl->nr > 0 && pl->load[wmax] > 0) {
        uint8_t *in = tide_calloc(pl->nr, 1);
        uint8_t *done = tide_calloc(pl->n_act ? pl->n_act : 1, 1);
        if (in == NULL || done == NULL) {
            tide_free(in);
            tide_free(done);
            return tide_errorf(TIDE_ERR_NOMEM, "out of memory computing the balanced bound");
        }
        pl->mem_bytes += pl->nr + pl->n_act;
        in[wmax] = 1;
        uint64_t n_in = 1;
        for (int grew = 1; grew;) {
            grew = 0;
            for (size_t k = 0; k < pl->n_act; k++) {
                if (done[k])
                    continue;
                const node_state *ns = &pl->ns[pl->act[k]];
                int touches = 0;
                for (uint32_t j = 0; j < ns->m_n && !touches; j++)
                    touches = in[pl->mem[ns->m_off + j]] && pl->quota[ns->m_off + j] > 0;
                if (!touches)
                    continue;
                done[k] = 1;
                grew = 1;
                for (uint32_t j = 0; j < ns->m_n; j++) {
                    uint32_t m = pl->mem[ns->m_off + j];
                    n_in += in[m] == 0;
                    in[m] = 1;
                }
            }
        }
        uint64_t inside = 0;
        for (size_t k = 0; k < pl->n_act; k++) {
            const node_state *ns = &pl->ns[pl->act[k]];
            int all = 1;
            for (uint32_t j = 0; j < ns->m_n && all; j++)
                all = in[pl->mem[ns->m_off + j]];
            if (all)
                inside += pl->vol[pl->act[k]];
        }
        uint64_t b = ceil_div(inside, n_in);
        if (b > best)
            best = b;
        tide_free(in);
        tide_free(done);
    }
    *out = best;
    return TIDE_OK;
}

/* ---- public entry points ------------------------------------------------------------------- */

static void reset_cursors(planner *pl)
{
    for (size_t k = 0; k < pl->n_act; k++) {
        pl->ns[pl->act[k]].j = 0;
        pl->ns[pl->act[k]].used = 0;
    }
}

/* Volume walk, balancing and the per-rank counters shared by plan and plan_for. */
static tide_status plan_prepare(planner *pl)
{
    tide_status rc = TIDE_OK;
    TIDE_CHECK(walk_volume(pl));
    TIDE_CHECK(balance(pl));
    pl->send = pl_calloc(pl, pl->nr, sizeof *pl->send);
    TIDE_CHECK_ALLOC_GOTO(pl->send, rc, out);
    pl->recv = pl_calloc(pl, pl->nr, sizeof *pl->recv);
    TIDE_CHECK_ALLOC_GOTO(pl->recv, rc, out);
    pl->last_dst = pl_calloc(pl, pl->nr, sizeof *pl->last_dst);
    TIDE_CHECK_ALLOC_GOTO(pl->last_dst, rc, out);
out:
    return rc;
}

/* Fills the summary's bounds and maxima once the counting walk is done. */
static tide_status plan_finish_summary(planner *pl)
{
    tide_plan_summary *s = &pl->sum;
    s->lower_bound = pl->bytes_needed;
    for (uint32_t r = 0; r < pl->nr; r++) {
        if (pl->send[r] > s->max_send)
            s->max_send = pl->send[r];
        if (pl->recv[r] > s->max_recv)
            s->max_recv = pl->recv[r];
    }
    if (s->bytes_sent != pl->bytes_needed || s->bytes_local != pl->bytes_local)
        return tide_errorf(
            TIDE_ERR_INTERNAL, "reshard plan: sent %llu / local %llu bytes, expected %llu / %llu",
            (unsigned long long)s->bytes_sent, (unsigned long long)s->bytes_local,
            (unsigned long long)pl->bytes_needed, (unsigned long long)pl->bytes_local);
    return balanced_bound(pl, &s->balanced_bound);
}

tide_status tide_reshard_plan(const tide_layout_t *old_l, const tide_layout_t *new_l,
                              const tide_collection_t *c, const uint8_t *alive, size_t n_alive,
                              tide_plan_t **out)
{
    if (out == NULL)
        return tide_errorf(TIDE_ERR_INVALID, "tide_reshard_plan: out is NULL");
    *out = NULL;
    planner pl;
    tide_status rc = planner_init(&pl, old_l, new_l, c, alive, n_alive, 1);
    if (rc != TIDE_OK)
        return rc;
    tide_plan_t *plan = NULL;
    TIDE_CHECK_GOTO(plan_prepare(&pl), rc, fail);
    pl.cnt = pl_calloc(&pl, pl.nr, sizeof *pl.cnt);
    TIDE_CHECK_ALLOC_GOTO(pl.cnt, rc, fail);
    TIDE_CHECK_GOTO(walk(&pl, M_COUNT), rc, fail);
    TIDE_CHECK_GOTO(plan_finish_summary(&pl), rc, fail);

    /* Bucket starts per source rank, then the sorted write. */
    size_t n = 0;
    for (uint32_t r = 0; r < pl.nr; r++) {
        size_t k = pl.cnt[r];
        pl.cnt[r] = n;
        n += k;
    }
    plan = tide_calloc(1, sizeof *plan);
    TIDE_CHECK_ALLOC_GOTO(plan, rc, fail);
    plan->items = tide_calloc(n, sizeof *plan->items);
    TIDE_CHECK_ALLOC_GOTO(plan->items, rc, fail);
    pl.mem_bytes += sizeof *plan + (uint64_t)(n ? n : 1) * sizeof *plan->items;
    pl.out = plan->items;
    reset_cursors(&pl);
    TIDE_CHECK_GOTO(walk(&pl, M_WRITE), rc, fail);
    pl.out = NULL;
    plan->n = n;
    plan->summary = pl.sum;
    tide__reshard_set_peak(pl.mem_bytes);
    planner_free(&pl);
    *out = plan;
    return TIDE_OK;
fail:
    pl.out = NULL;
    tide__reshard_set_peak(pl.mem_bytes);
    planner_free(&pl);
    tide_plan_destroy(&plan);
    return rc;
}

static int cmp_xfer(const void *a, const void *b)
{
    const tide_xfer *x = a, *y = b;
    if (x->src != y->src)
        return x->src < y->src ? -1 : 1;
    if (x->dst != y->dst)
        return x->dst < y->dst ? -1 : 1;
    if (x->tensor != y->tensor)
        return x->tensor < y->tensor ? -1 : 1;
    return (x->dst_off > y->dst_off) - (x->dst_off < y->dst_off);
}

typedef struct host_map {
    const int32_t *host_of; /* NULL: cross-host bytes not wanted */
    size_t n;
    uint64_t cross; /* out: bytes sent between different known hosts */
} host_map;

static tide_status walk_totals(planner *pl, uint64_t *messages, uint64_t *max_recv,
                               uint32_t *streams, host_map *hm);

tide_status tide_reshard_plan_for(const tide_layout_t *old_l, const tide_layout_t *new_l,
                                  const tide_collection_t *c, const uint8_t *alive, size_t n_alive,
                                  int32_t worker, tide_plan_t **out)
{
    if (out == NULL)
        return tide_errorf(TIDE_ERR_INVALID, "tide_reshard_plan_for: out is NULL");
    *out = NULL;
    planner pl;
    tide_status rc = planner_init(&pl, old_l, new_l, c, alive, n_alive, 1);
    if (rc != TIDE_OK)
        return rc;
    tide_plan_t *plan = NULL;
    uint32_t *streams = NULL;
    int32_t *stream_worker = NULL;
    TIDE_CHECK_GOTO(plan_prepare(&pl), rc, fail);
    /* the totals first (they move the node cursors), then only this worker's part */
    tide_plan_totals t;
    memset(&t, 0, sizeof t);
    streams = pl_calloc(&pl, pl.nr ? pl.nr : 1, sizeof *streams);
    TIDE_CHECK_ALLOC_GOTO(streams, rc, fail);
    TIDE_CHECK_GOTO(walk_totals(&pl, &t.messages, &t.max_recv, streams, NULL), rc, fail);
    for (uint32_t r = 0; r < pl.nr; r++)
        t.max_send = pl.load[r] > t.max_send ? pl.load[r] : t.max_send;
    TIDE_CHECK_GOTO(balanced_bound(&pl, &t.balanced_bound), rc, fail);
    reset_cursors(&pl);
    pl.sk_dv = pl_calloc(&pl, pl.n_nodes, sizeof *pl.sk_dv);
    TIDE_CHECK_ALLOC_GOTO(pl.sk_dv, rc, fail);
    pl.sk_touched = pl_calloc(&pl, pl.n_nodes, sizeof *pl.sk_touched);
    TIDE_CHECK_ALLOC_GOTO(pl.sk_touched, rc, fail);
    pl.filter = worker;
    TIDE_CHECK_GOTO(walk(&pl, M_COLLECT), rc, fail);
    pl.sum.bytes_sent = pl.sum.lower_bound = pl.bytes_needed;
    pl.sum.bytes_local = pl.bytes_local;
    pl.sum.max_send = t.max_send;
    pl.sum.max_recv = t.max_recv;
    pl.sum.balanced_bound = t.balanced_bound;
    pl.sum.messages = t.messages;
    pl.sum.n_xfers = pl.sum.n_copies = 0; /* counted over the kept items below */
    for (size_t k = 0; k < pl.out_n; k++) {
        if (pl.out[k].src == pl.out[k].dst)
            pl.sum.n_copies++;
        else
            pl.sum.n_xfers++;
    }
    /* Items where worker is the source come out sorted; those it receives need ordering. */
    if (pl.out_n > 1)
        qsort(pl.out, pl.out_n, sizeof *pl.out, cmp_xfer);
    plan = tide_calloc(1, sizeof *plan);
    TIDE_CHECK_ALLOC_GOTO(plan, rc, fail);
    pl.mem_bytes += sizeof *plan;
    plan->items = pl.out;
    plan->n = pl.out_n;
    plan->summary = pl.sum;
    pl.out = NULL;
    stream_worker = pl_calloc(&pl, pl.nr ? pl.nr : 1, sizeof *stream_worker);
    TIDE_CHECK_ALLOC_GOTO(stream_worker, rc, fail);
    for (uint32_t r = 0; r < pl.nr; r++)
        stream_worker[r] = pl.ids[r];
    plan->stream_worker = stream_worker;
    plan->stream_count = streams;
    plan->n_stream = pl.nr;
    tide__reshard_set_peak(pl.mem_bytes);
    planner_free(&pl);
    *out = plan;
    return TIDE_OK;
fail:
    tide__reshard_set_peak(pl.mem_bytes);
    planner_free(&pl);
    if (plan == NULL || plan->stream_count != streams) {
        tide_free(streams);
        tide_free(stream_worker);
    }
    tide_plan_destroy(&plan);
    return rc;
}

/*
 * The totals walk, by groups like walk_volume, after balancing: the bytes a
 * destination takes from a holder node are the next chunk of that node's
 * stream, and the full walk cuts each stream at the same quotas, so the
 * senders whose quotas cover the chunk are exactly those that send this
 * destination something. Counts distinct (sender, destination) pairs and the
 * largest receive volume; streams (NULL: not wanted) gets, per rank, the pairs
 * it is part of; hm (NULL: not wanted) the bytes of the chunks whose sender and
 * destination are on different hosts (a chunk's bytes from sender j are its overlap
 * with j's quota of the stream, as the full walk cuts them).
 */
static tide_status walk_totals(planner *pl, uint64_t *messages, uint64_t *max_recv,
                               uint32_t *streams, host_map *hm)
{
    tide_status rc = TIDE_OK;
    const tide_layout_t *o = pl->o;
    uint64_t *pos = pl_calloc(pl, pl->n_nodes, sizeof *pos);   /* stream bytes consumed */
    uint64_t *base = pl_calloc(pl, pl->n_nodes, sizeof *base); /* stream start of sender j */
    uint64_t *dv = pl_calloc(pl, pl->n_nodes, sizeof *dv);     /* this destination's chunk */
    uint32_t *touched = pl_calloc(pl, pl->n_nodes, sizeof *touched);
    uint32_t *stamp = pl_calloc(pl, pl->nr, sizeof *stamp); /* 1 + last destination, per rank */
    int32_t *host = NULL;                                   /* per rank, -1: unknown */
    if (hm != NULL) {
        host = pl_calloc(pl, pl->nr ? pl->nr : 1, sizeof *host);
        for (uint32_t r = 0; host != NULL && r < pl->nr; r++)
            host[r] = (size_t)pl->ids[r] < hm->n ? hm->host_of[pl->ids[r]] : -1;
        hm->cross = 0;
    }
    if (!pos || !base || !dv || !touched || !stamp || (hm != NULL && host == NULL)) {
        rc = tide_errorf(TIDE_ERR_NOMEM, "out of memory summing the plan");
        goto out;
    }
    *messages = *max_recv = 0;
    reset_cursors(pl);
    memset(pl->cls_stamp, 0, pl->n_cls * sizeof *pl->cls_stamp);
    for (uint32_t r = 0; r < pl->nr; r++) {
        if (pl->new_of[r] < 0)
            continue;
        int pn, dn, tn, oc[3];
        const int *ocp = dst_coords(pl, r, &pn, &dn, &tn, oc);
        size_t nt = 0;
        uint64_t recv = 0;
        pl->pool_n = 0;
        for (size_t k = pl->goff[pn]; k < pl->goff[pn + 1]; k++) {
            const group *gr = &pl->grp[k];
            uint32_t n;
            const piece_t *p;
            TIDE_CHECK_GOTO(get_pieces(pl, r, gr->cls, dn, tn, &p, &n), rc, out);
            for (uint32_t x = 0; x < n; x++) {
                int pk = gr->pk, dk = p[x].dk, tk = p[x].tk;
                if (ocp != NULL && (pk == o->pp || ocp[0] == pk) && (dk == o->dp || ocp[1] == dk) &&
                    (tk == o->tp || ocp[2] == tk))
                    continue;
                size_t id = node_id(pl, pk, dk, tk);
                if (dv[id] == 0)
                    touched[nt++] = (uint32_t)id;
                dv[id] += (p[x].b - p[x].a) * gr->count;
            }
        }
        for (size_t k = 0; k < nt; k++) {
            uint32_t id = touched[k];
            node_state *ns = &pl->ns[id];
            uint64_t c0 = pos[id], c1 = c0 + dv[id];
            recv += dv[id];
            while (ns->j < ns->s_n && base[id] + pl->sq[ns->s_off + ns->j] <= c0)
                base[id] += pl->sq[ns->s_off + ns->j++];
            uint64_t b = base[id];
            for (uint32_t j = ns->j; j < ns->s_n && b < c1; j++) {
                uint32_t sr = pl->snd[ns->s_off + j];
                if (host != NULL && host[sr] >= 0 && host[r] >= 0 && host[sr] != host[r]) {
                    uint64_t e = b + pl->sq[ns->s_off + j];
                    hm->cross += (e < c1 ? e : c1) - (b > c0 ? b : c0);
                }
                if (stamp[sr] != r + 1) {
                    stamp[sr] = r + 1;
                    (*messages)++;
                    if (streams != NULL) {
                        streams[sr]++;
                        streams[r]++;
                    }
                }
                b += pl->sq[ns->s_off + j];
            }
            if (b < c1)
                TIDE_FAIL_GOTO(rc, out, TIDE_ERR_INTERNAL,
                               "reshard plan: a holder node ran out of quota");
            pos[id] = c1;
            dv[id] = 0;
        }
        *max_recv = recv > *max_recv ? recv : *max_recv;
    }
out:
    tide_free(pos);
    tide_free(base);
    tide_free(dv);
    tide_free(touched);
    tide_free(stamp);
    tide_free(host);
    return rc;
}

tide_status tide_reshard_plan_totals(const tide_layout_t *old_l, const tide_layout_t *new_l,
                                     const tide_collection_t *c, const uint8_t *alive,
                                     size_t n_alive, tide_plan_totals *out)
{
    return tide_reshard_plan_totals_hosts(old_l, new_l, c, alive, n_alive, NULL, 0, out);
}

tide_status tide_reshard_plan_totals_hosts(const tide_layout_t *old_l, const tide_layout_t *new_l,
                                           const tide_collection_t *c, const uint8_t *alive,
                                           size_t n_alive, const int32_t *host_of, size_t n_host,
                                           tide_plan_totals *out)
{
    if (out == NULL)
        return tide_errorf(TIDE_ERR_INVALID, "tide_reshard_plan_totals: out is NULL");
    if (host_of == NULL && n_host > 0)
        return tide_errorf(TIDE_ERR_INVALID,
                           "tide_reshard_plan_totals_hosts: %zu hosts but no "
                           "host map",
                           n_host);
    memset(out, 0, sizeof *out);
    planner pl;
    TIDE_CHECK(planner_init(&pl, old_l, new_l, c, alive, n_alive, 1));
    tide_status rc = TIDE_OK;
    tide_plan_totals t;
    memset(&t, 0, sizeof t);
    TIDE_CHECK_GOTO(walk_volume(&pl), rc, out);
    TIDE_CHECK_GOTO(balance(&pl), rc, out);
    host_map hm = {host_of, n_host, 0};
    TIDE_CHECK_GOTO(walk_totals(&pl, &t.messages, &t.max_recv, NULL, host_of ? &hm : NULL), rc,
                    out);
    t.cross_host = hm.cross;
    for (uint32_t r = 0; r < pl.nr; r++)
        t.max_send = pl.load[r] > t.max_send ? pl.load[r] : t.max_send;
    t.bytes_sent = t.lower_bound = pl.bytes_needed;
    t.bytes_local = pl.bytes_local;
    TIDE_CHECK_GOTO(balanced_bound(&pl, &t.balanced_bound), rc, out);
    *out = t;
out:
    tide__reshard_set_peak(pl.mem_bytes);
    planner_free(&pl);
    return rc;
}

void tide_plan_destroy(tide_plan_t **self_p)
{
    if (self_p == NULL || *self_p == NULL)
        return;
    tide_free((*self_p)->items);
    tide_free((*self_p)->stream_worker);
    tide_free((*self_p)->stream_count);
    tide_free(*self_p);
    *self_p = NULL;
}

tide_status tide_reshard_lower_bound(const tide_layout_t *old_l, const tide_layout_t *new_l,
                                     const tide_collection_t *c, uint64_t *bytes)
{
    if (bytes == NULL)
        return tide_errorf(TIDE_ERR_INVALID, "tide_reshard_lower_bound: bytes is NULL");
    planner pl;
    TIDE_CHECK(planner_init(&pl, old_l, new_l, c, NULL, 0, 0));
    tide_status rc = walk_volume(&pl);
    if (rc == TIDE_OK)
        *bytes = pl.bytes_needed;
    planner_free(&pl);
    return rc;
}
