/*
 * Phase 2 of plan.c's outline, the balance: water-fill each holder node's volume onto
 * its live members' send loads, smallest nodes first, then re-pour each node given the
 * others until nothing changes (block coordinate descent); then each node's senders are
 * the members with a positive quota. Also the balanced bound, the lower bound on the
 * largest send that the plan's summary reports next to it. Workload: O(node members)
 * per pass, a few thousand entries, at most 1 + MAX_BALANCE_PASSES passes.
 */
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/sort.h"
#include "reshard/plan_int.h"

/* Re-pour passes after the first; each is O(node members), a few thousand entries. */
#define MAX_BALANCE_PASSES 8

/* Keys (pk, dk, tk) of holder node id; the inverse of node_id. */
static void node_keys(const planner *pl, size_t id, int *pk, int *dk, int *tk)
{
    *tk = (int)(id % ((size_t)pl->o->tp + 1));
    id /= (size_t)pl->o->tp + 1;
    *dk = (int)(id % ((size_t)pl->o->dp + 1));
    *pk = (int)(id / ((size_t)pl->o->dp + 1));
}

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

tide_status tide__plan_balance(planner *pl)
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

/* (1) of the balanced bound: for every holder node X, the bytes of the nodes inside X
 * (summed key-wise) over X's live members; raises *best. */
static tide_status node_bound(planner *pl, uint64_t *best)
{
    const tide_layout_t *o = pl->o;
    size_t np = (size_t)o->pp + 1, nd = (size_t)o->dp + 1, nt = (size_t)o->tp + 1;
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
            if (b > *best)
                *best = b;
        }
    tide_free(s);
    return TIDE_OK;
}

/* Grows the set in[] (per rank) to its closure under "a node sending to the set brings all
 * its members"; done[] (per active node, zeroed) marks the nodes taken in. Returns the
 * closure's size, given n_in members at the start. */
static uint64_t grow_closure(const planner *pl, uint8_t *in, uint8_t *done, uint64_t n_in)
{
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
    return n_in;
}

/* (2) of the balanced bound: the closure of the most loaded worker, the bytes of the nodes
 * all of whose members are inside it over its size; raises *best. */
static tide_status closure_bound(planner *pl, uint64_t *best)
{
    uint32_t wmax = 0;
    for (uint32_t r = 1; r < pl->nr; r++)
        if (pl->load[r] > pl->load[wmax])
            wmax = r;
    if (pl->nr == 0 || pl->load[wmax] == 0)
        return TIDE_OK;
    uint8_t *in = tide_calloc(pl->nr, 1);
    uint8_t *done = tide_calloc(pl->n_act ? pl->n_act : 1, 1);
    if (in == NULL || done == NULL) {
        tide_free(in);
        tide_free(done);
        return tide_errorf(TIDE_ERR_NOMEM, "out of memory computing the balanced bound");
    }
    pl->mem_bytes += pl->nr + pl->n_act;
    in[wmax] = 1;
    uint64_t n_in = grow_closure(pl, in, done, 1);
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
    if (b > *best)
        *best = b;
    tide_free(in);
    tide_free(done);
    return TIDE_OK;
}

/*
 * A lower bound on the largest per-worker send: the bytes that only the
 * members of a set X hold, divided by |X|, for (1) every holder node X
 * (summing the nodes key-wise inside it) and (2) the closure of the most
 * loaded worker under "a node sending to X brings all its members", which
 * equals the optimum when balancing reached its fixed point.
 */
tide_status tide__plan_balanced_bound(planner *pl, uint64_t *out)
{
    uint64_t best = 0;
    TIDE_CHECK(node_bound(pl, &best));
    TIDE_CHECK(closure_bound(pl, &best));
    *out = best;
    return TIDE_OK;
}
