/*
 * The reshard planner's working state, shared by its files only: plan.c (the plan and
 * plan_for entry points the workers call), plan_totals.c (the totals and lower bound
 * the coordinator and placement call), plan_init.c (the planner's life cycle),
 * plan_pieces.c (what a destination needs, as pieces), plan_walk.c (the walks over
 * destinations that sum volumes and cut items) and plan_balance.c (the water-filling
 * balance and its bound). Nothing here is for other files, inside reshard/ or out.
 */
#ifndef TIDE_RESHARD_PLAN_INT_H
#define TIDE_RESHARD_PLAN_INT_H

#include <stddef.h>
#include <stdint.h>

#include "core/alloc.h"
#include "reshard/reshard_int.h"

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

/* Hosts for the totals walk's cross-host bytes. */
typedef struct host_map {
    const int32_t *host_of; /* NULL: cross-host bytes not wanted */
    size_t n;
    uint64_t cross; /* out: bytes sent between different known hosts */
} host_map;

/* tide_calloc that counts the bytes towards the planner call's peak memory (pl->mem_bytes). */
static inline void *pl_calloc(planner *pl, size_t n, size_t size)
{
    void *p = tide_calloc(n, size);
    if (p != NULL)
        pl->mem_bytes += (uint64_t)(n ? n : 1) * (size ? size : 1);
    return p;
}

/* Index of holder node (pk, dk, tk) in the per-node arrays. */
static inline size_t node_id(const planner *pl, int pk, int dk, int tk)
{
    return ((size_t)pk * ((size_t)pl->o->dp + 1) + (size_t)dk) * ((size_t)pl->o->tp + 1) +
           (size_t)tk;
}

/* Destination rank r's new coordinate and, when it was in the old layout, its old one. */
static inline const int *dst_coords(const planner *pl, uint32_t r, int *pn, int *dn, int *tn,
                                    int *oc)
{
    tide__coord(pl->nl, (size_t)pl->new_of[r], pn, dn, tn);
    if (pl->old_of[r] < 0)
        return NULL;
    tide__coord(pl->o, (size_t)pl->old_of[r], &oc[0], &oc[1], &oc[2]);
    return oc;
}

/* Puts every active node's cursor back at the start of its senders' quotas. */
static inline void reset_cursors(planner *pl)
{
    for (size_t k = 0; k < pl->n_act; k++) {
        pl->ns[pl->act[k]].j = 0;
        pl->ns[pl->act[k]].used = 0;
    }
}

/*
 * Validates the inputs and fills *pl (caller-owned storage): the worker universe, the
 * per-stage tensor lists, the geometry classes and (with_nodes) the holder nodes'
 * live-member counts. On failure *pl is cleared. Single thread per planner (plan_init.c).
 */
tide_status tide__planner_init(planner *pl, const tide_layout_t *old_l, const tide_layout_t *new_l,
                               const tide_collection_t *c, const uint8_t *alive, size_t n_alive,
                               int with_nodes);

/* Frees everything *pl holds and zeroes it; safe on a cleared planner (plan_init.c). */
void tide__planner_clear(planner *pl);

/*
 * The pieces of class cls for destination rank r at new (dp rank dn, tp rank tn), in
 * (*p)[0 .. *n): the planner's memory, valid until the next call (the pools may grow).
 * Computed once per (class, tn) or per destination; single thread per planner
 * (plan_pieces.c).
 */
tide_status tide__plan_get_pieces(planner *pl, uint32_t r, uint32_t cls, int dn, int tn,
                                  const piece_t **p, uint32_t *n);

/*
 * The bytes destination rank r (new coordinate pn, dn, tn; old one ocp, NULL when it held
 * nothing) takes from each holder node, by groups: dv[node] grows by them, and the nodes
 * it starts (dv was 0) are appended to touched[*nt ..). Single thread per planner
 * (plan_pieces.c).
 */
tide_status tide__plan_dst_chunks(planner *pl, uint32_t r, int pn, int dn, int tn, const int *ocp,
                                  uint64_t *dv, uint32_t *touched, size_t *nt);

/*
 * Walks every destination and every tensor of its stage in plan order in the given
 * walk_mode (M_VOLUME, M_COUNT, M_WRITE, M_COLLECT): sums volumes or cuts node streams
 * at the senders' quotas and records items (plan_walk.c). Single thread per planner.
 */
tide_status tide__plan_walk(planner *pl, int mode);

/*
 * Phase 1, the volume walk by (class, old stage) groups: node volumes, local bytes
 * and the lower bound; fails with TIDE_ERR_NO_HOLDER naming the first tensor in plan
 * order whose holders are all dead (plan_walk.c). Single thread per planner.
 */
tide_status tide__plan_walk_volume(planner *pl);

/*
 * Phase 2: water-fills each node's volume onto its live members' send loads (pl->load)
 * and lists each node's senders and quotas; needs the volume walk (plan_balance.c).
 * Single thread per planner.
 */
tide_status tide__plan_balance(planner *pl);

/*
 * A lower bound on the largest per-worker send given who holds what, into *out; needs
 * balancing (plan_balance.c). Single thread per planner.
 */
tide_status tide__plan_balanced_bound(planner *pl, uint64_t *out);

/*
 * After balancing: the plan's message count and largest receive without its items;
 * per-rank peer streams into streams (NULL: not wanted), cross-host bytes into hm
 * (NULL: not wanted). Moves the node cursors (plan_totals.c). Single thread per planner.
 */
tide_status tide__plan_walk_totals(planner *pl, uint64_t *messages, uint64_t *max_recv,
                                   uint32_t *streams, host_map *hm);

#endif /* TIDE_RESHARD_PLAN_INT_H */
