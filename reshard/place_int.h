/*
 * Placement's working state, shared by its two files only: place.c (the entry points,
 * the gains, regime 1, TP groups and dp ranks) and place_hosts.c (regime 2: which host
 * takes which TP groups). Nothing here is for other files, inside reshard/ or out.
 */
#ifndef TIDE_RESHARD_PLACE_INT_H
#define TIDE_RESHARD_PLACE_INT_H

#include <stdint.h>

#include "core/alloc.h"
#include "reshard/reshard_int.h"

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

/* tide_calloc that counts the bytes towards the decision's peak memory (pl->mem). */
static inline void *pc_calloc(placer *pl, size_t n, size_t size)
{
    void *p = tide_calloc(n, size);
    if (p != NULL)
        pl->mem += (uint64_t)(n ? n : 1) * (size ? size : 1);
    return p;
}

/* Gain of worker x in role p' * ntp + t': the DP-replicated bytes it keeps there, scaled,
   plus 1 when it keeps its old (p, t). */
static inline int64_t gain(const placer *pl, const pworker *x, int role)
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

/*
 * Regime 2, hosts take whole TP groups (place_hosts.c): classifies the hosts, puts
 * pl->groups groups of stages on them within their slots (a flow when each host has one
 * slot, an exact program when the demand space is small, else a greedy search refined
 * by exchanges), then assigns each host's workers to its groups' roles (pl->wrole).
 * Needs pl->slots, pl->cfg (zeroed) and pl->wrole; single thread.
 */
tide_status tide__place_hosts(placer *pl);

#endif /* TIDE_RESHARD_PLACE_INT_H */
