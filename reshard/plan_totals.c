/*
 * The plan's totals without its items, for those that decide rather than move: the
 * coordinator (tide_reshard_plan_totals, _hosts: bytes, largest send and receive,
 * messages, cross-host bytes) and placement (tide_reshard_lower_bound). The totals
 * walk runs after balancing and passes each destination by tensor groups: what it
 * takes from a holder node is the next chunk of that node's stream, cut at the same
 * quotas as the full walk would. plan_for (plan.c) uses it for everyone's stream
 * counts. Workload: O(workers * tensor classes per stage), milliseconds at 10^4
 * workers.
 */
#include <string.h>

#include "core/error.h"
#include "reshard/plan_int.h"

/* The totals walk's outputs and scratch, per node and per rank, for one walk. */
typedef struct totals_walk {
    uint64_t *pos;      /* per node: stream bytes consumed */
    uint64_t *base;     /* per node: stream start of sender j */
    uint64_t *dv;       /* per node: this destination's chunk */
    uint32_t *touched;  /* the nodes this destination takes from */
    uint32_t *stamp;    /* per rank: 1 + last destination */
    int32_t *host;      /* per rank, -1: unknown; NULL without hm */
    uint64_t *messages; /* out: distinct (sender, destination) pairs */
    uint32_t *streams;  /* out, per rank (NULL: not wanted): the pairs it is part of */
    host_map *hm;       /* out (NULL: not wanted): cross-host bytes */
} totals_walk;

/* Allocates the walk's scratch and, with tw->hm, each rank's host (tw->hm->cross = 0). */
static tide_status totals_walk_init(planner *pl, totals_walk *tw)
{
    host_map *hm = tw->hm;
    tw->pos = pl_calloc(pl, pl->n_nodes, sizeof *tw->pos);
    tw->base = pl_calloc(pl, pl->n_nodes, sizeof *tw->base);
    tw->dv = pl_calloc(pl, pl->n_nodes, sizeof *tw->dv);
    tw->touched = pl_calloc(pl, pl->n_nodes, sizeof *tw->touched);
    tw->stamp = pl_calloc(pl, pl->nr, sizeof *tw->stamp);
    if (hm != NULL) {
        tw->host = pl_calloc(pl, pl->nr ? pl->nr : 1, sizeof *tw->host);
        for (uint32_t r = 0; tw->host != NULL && r < pl->nr; r++)
            tw->host[r] = (size_t)pl->ids[r] < hm->n ? hm->host_of[pl->ids[r]] : -1;
        hm->cross = 0;
    }
    if (!tw->pos || !tw->base || !tw->dv || !tw->touched || !tw->stamp ||
        (hm != NULL && tw->host == NULL))
        return tide_errorf(TIDE_ERR_NOMEM, "out of memory summing the plan");
    return TIDE_OK;
}

/* Frees the walk's scratch. */
static void totals_walk_clear(totals_walk *tw)
{
    tide_free(tw->pos);
    tide_free(tw->base);
    tide_free(tw->dv);
    tide_free(tw->touched);
    tide_free(tw->stamp);
    tide_free(tw->host);
}

/*
 * Cuts destination r's chunks (tw->dv of the nodes touched[0, nt)) at the senders'
 * quotas, as the full walk would: counts the (sender, r) pairs not seen yet and the
 * chunks' cross-host bytes (a chunk's bytes from sender j are its overlap with j's
 * quota of the stream); *recv gets r's bytes. Resets dv for the next destination.
 */
static tide_status cut_chunks(planner *pl, totals_walk *tw, uint32_t r, size_t nt, uint64_t *recv)
{
    for (size_t k = 0; k < nt; k++) {
        uint32_t id = tw->touched[k];
        node_state *ns = &pl->ns[id];
        uint64_t c0 = tw->pos[id], c1 = c0 + tw->dv[id];
        *recv += tw->dv[id];
        while (ns->j < ns->s_n && tw->base[id] + pl->sq[ns->s_off + ns->j] <= c0)
            tw->base[id] += pl->sq[ns->s_off + ns->j++];
        uint64_t b = tw->base[id];
        for (uint32_t j = ns->j; j < ns->s_n && b < c1; j++) {
            uint32_t sr = pl->snd[ns->s_off + j];
            if (tw->host != NULL && tw->host[sr] >= 0 && tw->host[r] >= 0 &&
                tw->host[sr] != tw->host[r]) {
                uint64_t e = b + pl->sq[ns->s_off + j];
                tw->hm->cross += (e < c1 ? e : c1) - (b > c0 ? b : c0);
            }
            if (tw->stamp[sr] != r + 1) {
                tw->stamp[sr] = r + 1;
                (*tw->messages)++;
                if (tw->streams != NULL) {
                    tw->streams[sr]++;
                    tw->streams[r]++;
                }
            }
            b += pl->sq[ns->s_off + j];
        }
        if (b < c1)
            return tide_errorf(TIDE_ERR_INTERNAL, "reshard plan: a holder node ran out of quota");
        tw->pos[id] = c1;
        tw->dv[id] = 0;
    }
    return TIDE_OK;
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
tide_status tide__plan_walk_totals(planner *pl, uint64_t *messages, uint64_t *max_recv,
                                   uint32_t *streams, host_map *hm)
{
    tide_status rc = TIDE_OK;
    totals_walk tw = {.messages = messages, .streams = streams, .hm = hm};
    TIDE_CHECK_GOTO(totals_walk_init(pl, &tw), rc, out);
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
        TIDE_CHECK_GOTO(tide__plan_dst_chunks(pl, r, pn, dn, tn, ocp, tw.dv, tw.touched, &nt), rc,
                        out);
        TIDE_CHECK_GOTO(cut_chunks(pl, &tw, r, nt, &recv), rc, out);
        *max_recv = recv > *max_recv ? recv : *max_recv;
    }
out:
    totals_walk_clear(&tw);
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
    TIDE_CHECK(tide__planner_init(&pl, old_l, new_l, c, alive, n_alive, 1));
    tide_status rc = TIDE_OK;
    tide_plan_totals t;
    memset(&t, 0, sizeof t);
    TIDE_CHECK_GOTO(tide__plan_walk_volume(&pl), rc, out);
    TIDE_CHECK_GOTO(tide__plan_balance(&pl), rc, out);
    host_map hm = {host_of, n_host, 0};
    TIDE_CHECK_GOTO(
        tide__plan_walk_totals(&pl, &t.messages, &t.max_recv, NULL, host_of ? &hm : NULL), rc, out);
    t.cross_host = hm.cross;
    for (uint32_t r = 0; r < pl.nr; r++)
        t.max_send = pl.load[r] > t.max_send ? pl.load[r] : t.max_send;
    t.bytes_sent = t.lower_bound = pl.bytes_needed;
    t.bytes_local = pl.bytes_local;
    TIDE_CHECK_GOTO(tide__plan_balanced_bound(&pl, &t.balanced_bound), rc, out);
    *out = t;
out:
    tide__reshard_set_peak(pl.mem_bytes);
    tide__planner_clear(&pl);
    return rc;
}

tide_status tide_reshard_lower_bound(const tide_layout_t *old_l, const tide_layout_t *new_l,
                                     const tide_collection_t *c, uint64_t *bytes)
{
    if (bytes == NULL)
        return tide_errorf(TIDE_ERR_INVALID, "tide_reshard_lower_bound: bytes is NULL");
    planner pl;
    TIDE_CHECK(tide__planner_init(&pl, old_l, new_l, c, NULL, 0, 0));
    tide_status rc = tide__plan_walk_volume(&pl);
    if (rc == TIDE_OK)
        *bytes = pl.bytes_needed;
    tide__planner_clear(&pl);
    return rc;
}
