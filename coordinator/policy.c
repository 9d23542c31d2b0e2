/*
 * coordinator/policy: pure decision functions (see policy.h). Placement keeps
 * old coordinates whenever the tensor/pipeline shape is unchanged, so dropping
 * data-parallel replicas moves no bytes and a recovery only refills the lost
 * coordinates; empty tensor-parallel groups are filled from one host when a
 * host has room (best fit, so big hosts stay whole for later groups).
 *
 * The map could later come from reshard's byte-minimising placement (issue 7):
 * fill_map() is the one place to switch.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "coordinator/policy.h"

/* Sorting record for candidates: class, then a class-specific key. */
typedef struct cand_key {
    int32_t idx; /* index into cand[] */
    int32_t cls;
    int64_t k1, k2, k3, k4;
} cand_key;

static int cmp_key(const void *a, const void *b)
{
    const cand_key *x = a, *y = b;
    if (x->cls != y->cls)
        return x->cls < y->cls ? -1 : 1;
    const int64_t xs[4] = {x->k1, x->k2, x->k3, x->k4}, ys[4] = {y->k1, y->k2, y->k3, y->k4};
    for (int i = 0; i < 4; i++)
        if (xs[i] != ys[i])
            return xs[i] < ys[i] ? -1 : 1;
    return 0;
}

static int cmp_i32(const void *a, const void *b)
{
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

static int same_stages(const tide_layout_t *a, const tide_layout_t *b)
{
    if (a->pp != b->pp || a->num_layers != b->num_layers)
        return 0;
    return memcmp(a->stage_start, b->stage_start, ((size_t)a->pp + 1) * sizeof(int)) == 0;
}

/* Rank -> position in the old layout, through a sorted (rank, index) table. */
typedef struct rank_pos {
    int32_t rank;
    int32_t index;
} rank_pos;

static int cmp_rank_pos(const void *a, const void *b)
{
    return cmp_i32(&((const rank_pos *)a)->rank, &((const rank_pos *)b)->rank);
}

static int32_t old_index(const rank_pos *tab, size_t n, int32_t rank)
{
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (tab[mid].rank < rank)
            lo = mid + 1;
        else
            hi = mid;
    }
    return (lo < n && tab[lo].rank == rank) ? tab[lo].index : -1;
}

typedef struct ctx {
    const tide_policy_worker *cand;
    int32_t *chosen; /* indices into cand, in preference order */
    size_t need;
    uint8_t *used;    /* per chosen position */
    int32_t *host_of; /* per chosen position: compact host index */
    size_t n_hosts;
    int32_t *host_left;    /* unused chosen workers per compact host */
    size_t *host_cursor;   /* scan position per host into host_members */
    int32_t *host_members; /* chosen positions grouped by host, chosen order inside */
    size_t *host_start;
    size_t global_cursor;
    int32_t *coord_pos; /* per layout index: chosen position placed there, -1 when empty */
} ctx;

static void take(ctx *c, size_t pos, size_t at)
{
    c->used[pos] = 1;
    c->coord_pos[at] = (int32_t)pos;
    c->host_left[c->host_of[pos]]--;
}

/* Next unused chosen position on host h (h must have some left). */
static size_t next_on_host(ctx *c, int32_t h)
{
    size_t *cur = &c->host_cursor[h];
    while (c->used[c->host_members[c->host_start[h] + *cur]])
        (*cur)++;
    return (size_t)c->host_members[c->host_start[h] + *cur];
}

static size_t next_any(ctx *c)
{
    while (c->used[c->global_cursor])
        c->global_cursor++;
    return c->global_cursor;
}

/*
 * Fills the empty (-1) coordinates of l with the unused chosen workers: a TP
 * group with placed members takes more from their host; an empty group takes
 * a whole host when one has room (the smallest that fits), else whatever is
 * left in preference order.
 */
static void fill_map(ctx *c, tide_layout_t *l)
{
    for (int p = 0; p < l->pp; p++) {
        for (int d = 0; d < l->dp; d++) {
            int32_t h0 = -1;
            int empties = 0;
            for (int t = 0; t < l->tp; t++) {
                int32_t r = l->worker[tide_layout_index(l, p, d, t)];
                if (r < 0)
                    empties++;
            }
            if (empties == 0)
                continue;
            for (int t = 0; t < l->tp && h0 < 0; t++) {
                int32_t pos = c->coord_pos[tide_layout_index(l, p, d, t)];
                if (pos >= 0)
                    h0 = c->host_of[pos];
            }
            if (h0 < 0) {
                int32_t best = -1;
                for (size_t h = 0; h < c->n_hosts; h++)
                    if (c->host_left[h] >= empties &&
                        (best < 0 || c->host_left[h] < c->host_left[best]))
                        best = (int32_t)h;
                h0 = best;
            }
            for (int t = 0; t < l->tp; t++) {
                size_t at = tide_layout_index(l, p, d, t);
                if (l->worker[at] >= 0)
                    continue;
                size_t pos = (h0 >= 0 && c->host_left[h0] > 0) ? next_on_host(c, h0) : next_any(c);
                take(c, pos, at);
                l->worker[at] = c->cand[c->chosen[pos]].rank;
                if (h0 < 0)
                    h0 = c->host_of[pos];
            }
        }
    }
}

static int cmp_host_pos(const void *a, const void *b)
{
    const int64_t *x = a, *y = b; /* (host, position) pairs */
    if (x[0] != y[0])
        return x[0] < y[0] ? -1 : 1;
    return (x[1] > y[1]) - (x[1] < y[1]);
}

tide_status tide_policy_place(const tide_layout_t *old, const tide_resize_req *req,
                              const tide_policy_worker *cand, size_t n, tide_layout_t **out,
                              int32_t *preempt, size_t *n_preempt)
{
    tide_status rc = TIDE_OK;
    tide_layout_t *l = NULL;
    cand_key *keys = NULL;
    rank_pos *tab = NULL;
    int32_t *ranks = NULL, *members = NULL;
    size_t n_members = 0;
    int64_t *hp = NULL;
    uint8_t *complete = NULL;
    int *slot = NULL; /* per old dp rank: its new dp rank, or < 0 when not kept */
    ctx c = {.cand = cand};
    size_t n_old = old ? tide_layout_size(old) : 0;

    *n_preempt = 0;
    TIDE_CHECK(
        tide_coord_layout_new(&l, req->dp, req->tp, req->pp, req->num_layers, req->micro_batches));
    if (req->stage_start != NULL)
        memcpy(l->stage_start, req->stage_start, ((size_t)req->pp + 1) * sizeof(int));
    else if (old != NULL && old->pp == req->pp && old->num_layers == req->num_layers)
        memcpy(l->stage_start, old->stage_start, ((size_t)req->pp + 1) * sizeof(int));
    for (size_t i = 0; i < tide_layout_size(l); i++)
        l->worker[i] = (int32_t)i; /* unique placeholders: check degrees and stages first */
    TIDE_CHECK_GOTO(tide_coord_layout_check(l), rc, out);
    for (size_t i = 0; i < tide_layout_size(l); i++)
        l->worker[i] = -1;
    c.need = tide_layout_size(l);

    /* candidate ranks must be unique and valid */
    ranks = tide_malloc((n ? n : 1) * sizeof *ranks);
    TIDE_CHECK_ALLOC_GOTO(ranks, rc, out);
    for (size_t i = 0; i < n; i++)
        ranks[i] = cand[i].rank;
    qsort(ranks, n, sizeof *ranks, cmp_i32);
    for (size_t i = 0; i < n; i++) {
        if (ranks[i] < 0 || (i > 0 && ranks[i] == ranks[i - 1]))
            TIDE_FAIL_GOTO(rc, out, TIDE_ERR_INVALID, "candidate rank %d is %s", ranks[i],
                           ranks[i] < 0 ? "negative" : "listed twice");
    }

    /* old coordinates of members, and which old replicas are complete */
    if (old != NULL) {
        tab = tide_malloc(n_old * sizeof *tab);
        complete = tide_malloc((size_t)old->dp);
        TIDE_CHECK_ALLOC_GOTO(tab, rc, out);
        TIDE_CHECK_ALLOC_GOTO(complete, rc, out);
        for (size_t i = 0; i < n_old; i++)
            tab[i] = (rank_pos){old->worker[i], (int32_t)i};
        qsort(tab, n_old, sizeof *tab, cmp_rank_pos);
        memset(complete, 1, (size_t)old->dp);
        members = tide_malloc((n ? n : 1) * sizeof *members);
        TIDE_CHECK_ALLOC_GOTO(members, rc, out);
        for (size_t i = 0; i < n; i++)
            if (cand[i].cls == TIDE_PW_MEMBER)
                members[n_members++] = cand[i].rank;
        qsort(members, n_members, sizeof *members, cmp_i32);
        for (size_t i = 0; i < n_old; i++)
            if (bsearch(&old->worker[i], members, n_members, sizeof *members, cmp_i32) == NULL)
                complete[(i / (size_t)old->tp) % (size_t)old->dp] = 0;
    }

    /* preference order */
    keys = tide_malloc((n ? n : 1) * sizeof *keys);
    TIDE_CHECK_ALLOC_GOTO(keys, rc, out);
    size_t counts[3] = {0, 0, 0};
    for (size_t i = 0; i < n; i++) {
        cand_key *k = &keys[i];
        memset(k, 0, sizeof *k);
        k->idx = (int32_t)i;
        k->cls = (int32_t)cand[i].cls;
        if (k->cls < 0 || k->cls > 2)
            TIDE_FAIL_GOTO(rc, out, TIDE_ERR_INVALID, "candidate %d has an unknown class %d",
                           cand[i].rank, k->cls);
        int32_t oi = old ? old_index(tab, n_old, cand[i].rank) : -1;
        if (k->cls == TIDE_PW_MEMBER && oi < 0)
            k->cls = TIDE_PW_IDLE; /* not in the old layout after all */
        counts[k->cls]++;
        if (k->cls == TIDE_PW_MEMBER) {
            int32_t t = oi % old->tp, d = (oi / old->tp) % old->dp, p = oi / (old->tp * old->dp);
            k->k1 = complete[d] ? 0 : 1; /* whole replicas first: they keep all their state */
            k->k2 = d;
            k->k3 = p;
            k->k4 = t;
        } else if (k->cls == TIDE_PW_OFFLINE) {
            k->k1 = cand[i].priority; /* preempt the least important work first */
            k->k2 = cand[i].host;
            k->k3 = cand[i].rank;
        } else {
            k->k1 = cand[i].host;
            k->k2 = cand[i].rank;
        }
    }
    if (n < c.need) {
        char buf[128];
        TIDE_FAIL_GOTO(rc, out, TIDE_ERR_NO_DEVICE,
                       "layout %s needs %zu workers; the pool has %zu available (%zu in the "
                       "job, %zu idle, %zu running offline work); free workers or ask for less",
                       tide_coord_layout_describe(l, buf, sizeof buf), c.need, n, counts[0],
                       counts[1], counts[2]);
    }
    qsort(keys, n, sizeof *keys, cmp_key);

    c.chosen = tide_malloc(c.need * sizeof *c.chosen);
    c.used = tide_calloc(c.need, 1);
    c.host_of = tide_malloc(c.need * sizeof *c.host_of);
    c.host_left = tide_calloc(c.need, sizeof *c.host_left);
    c.host_cursor = tide_calloc(c.need, sizeof *c.host_cursor);
    c.host_members = tide_malloc(c.need * sizeof *c.host_members);
    c.host_start = tide_calloc(c.need + 1, sizeof *c.host_start);
    hp = tide_malloc(c.need * 2 * sizeof *hp);
    c.coord_pos = tide_malloc(c.need * sizeof *c.coord_pos);
    TIDE_CHECK_ALLOC_GOTO(c.coord_pos, rc, out);
    TIDE_CHECK_ALLOC_GOTO(c.chosen, rc, out);
    TIDE_CHECK_ALLOC_GOTO(c.used, rc, out);
    TIDE_CHECK_ALLOC_GOTO(c.host_of, rc, out);
    TIDE_CHECK_ALLOC_GOTO(c.host_left, rc, out);
    TIDE_CHECK_ALLOC_GOTO(c.host_cursor, rc, out);
    TIDE_CHECK_ALLOC_GOTO(c.host_members, rc, out);
    TIDE_CHECK_ALLOC_GOTO(c.host_start, rc, out);
    TIDE_CHECK_ALLOC_GOTO(hp, rc, out);
    for (size_t i = 0; i < c.need; i++) {
        c.coord_pos[i] = -1;
        c.chosen[i] = keys[i].idx;
        hp[2 * i] = cand[keys[i].idx].host;
        hp[2 * i + 1] = (int64_t)i;
    }
    /* compact hosts: positions grouped by host id, chosen order inside each host */
    qsort(hp, c.need, 2 * sizeof *hp, cmp_host_pos);
    for (size_t i = 0; i < c.need; i++) {
        if (i > 0 && hp[2 * i] != hp[2 * (i - 1)])
            c.host_start[++c.n_hosts] = i;
        c.host_of[hp[2 * i + 1]] = (int32_t)c.n_hosts;
        c.host_members[i] = (int32_t)hp[2 * i + 1];
        c.host_left[c.n_hosts]++;
    }
    c.n_hosts++;
    c.host_start[c.n_hosts] = c.need;

    /* keep old coordinates when the tp/pp shape and stages are unchanged: the kept
     * replicas (whole ones first) keep their dp rank when it still exists */
    if (old != NULL && old->tp == l->tp && same_stages(old, l)) {
        slot = tide_malloc((size_t)old->dp * sizeof *slot);
        TIDE_CHECK_ALLOC_GOTO(slot, rc, out);
        uint8_t *taken = (uint8_t *)c.used; /* scratch: reset below */
        for (int d = 0; d < old->dp; d++)
            slot[d] = -2; /* -2: not kept */
        int kept = 0;
        for (size_t i = 0; i < c.need && kept < l->dp; i++) {
            if (keys[i].cls != TIDE_PW_MEMBER)
                break;
            if (slot[keys[i].k2] == -2) {
                slot[keys[i].k2] = -1;
                kept++;
            }
        }
        memset(taken, 0, c.need);
        for (int d = 0; d < old->dp; d++)
            if (slot[d] == -1 && d < l->dp) {
                slot[d] = d;
                taken[d] = 1;
            }
        int next = 0;
        for (int d = 0; d < old->dp; d++)
            if (slot[d] == -1) {
                while (taken[next])
                    next++;
                slot[d] = next;
                taken[next] = 1;
            }
        memset(taken, 0, c.need);
        for (size_t i = 0; i < c.need; i++) {
            const cand_key *k = &keys[i];
            if (k->cls != TIDE_PW_MEMBER)
                break;
            if (slot[k->k2] < 0)
                continue; /* a replica that is not kept: its workers fill gaps below */
            size_t at = tide_layout_index(l, (int)k->k3, slot[k->k2], (int)k->k4);
            l->worker[at] = cand[k->idx].rank;
            take(&c, i, at);
        }
    }
    fill_map(&c, l);

    for (size_t i = 0; i < c.need; i++)
        if (cand[c.chosen[i]].cls == TIDE_PW_OFFLINE)
            preempt[(*n_preempt)++] = cand[c.chosen[i]].rank;
    TIDE_CHECK_GOTO(tide_coord_layout_check(l), rc, out);
    *out = l;
    l = NULL;
out:
    tide_coord_layout_free(&l);
    tide_free(keys);
    tide_free(tab);
    tide_free(ranks);
    tide_free(members);
    tide_free(hp);
    tide_free(c.coord_pos);
    tide_free(complete);
    tide_free(slot);
    tide_free(c.chosen);
    tide_free(c.used);
    tide_free(c.host_of);
    tide_free(c.host_left);
    tide_free(c.host_cursor);
    tide_free(c.host_members);
    tide_free(c.host_start);
    if (rc != TIDE_OK)
        *n_preempt = 0;
    return rc;
}

tide_status tide_policy_recover(const tide_layout_t *old, const tide_policy_worker *cand, size_t n,
                                tide_layout_t **out, int32_t *preempt, size_t *n_preempt)
{
    tide_resize_req req = {old->dp,         old->tp, old->pp, old->num_layers, old->micro_batches,
                           old->stage_start};
    size_t group = (size_t)old->tp * (size_t)old->pp;
    if (n < group) {
        *n_preempt = 0;
        return tide_errorf(TIDE_ERR_NO_DEVICE,
                           "recovery needs at least tp * pp = %zu workers for one replica; only "
                           "%zu are available in the pool; the job waits for workers",
                           group, n);
    }
    if (n < tide_layout_size(old))
        req.dp = (int)(n / group); /* the largest dp that fits the same tp and pp */
    return tide_policy_place(old, &req, cand, n, out, preempt, n_preempt);
}

static int cmp_offline(const void *a, const void *b)
{
    const tide_policy_offline *x = a, *y = b;
    if (x->priority != y->priority)
        return x->priority > y->priority ? -1 : 1;
    return (x->job > y->job) - (x->job < y->job);
}

tide_status tide_policy_assign(const tide_policy_offline *queued, size_t nq, const int32_t *idle,
                               size_t ni, tide_policy_assignment *out, size_t *n_out)
{
    *n_out = 0;
    size_t m = nq < ni ? nq : ni;
    if (m == 0)
        return TIDE_OK;
    tide_policy_offline *q = tide_malloc(nq * sizeof *q);
    int32_t *w = tide_malloc(ni * sizeof *w);
    if (q == NULL || w == NULL) {
        tide_free(q);
        tide_free(w);
        return tide_errorf(TIDE_ERR_NOMEM, "out of memory assigning offline work");
    }
    memcpy(q, queued, nq * sizeof *q);
    memcpy(w, idle, ni * sizeof *w);
    qsort(q, nq, sizeof *q, cmp_offline);
    qsort(w, ni, sizeof *w, cmp_i32);
    for (size_t i = 0; i < m; i++)
        out[i] = (tide_policy_assignment){q[i].job, w[i]};
    *n_out = m;
    tide_free(q);
    tide_free(w);
    return TIDE_OK;
}

int64_t tide_policy_switch_step(const int64_t *steps, const uint8_t *old_member, size_t n,
                                int recover)
{
    int64_t best = -1;
    for (size_t i = 0; i < n; i++) {
        if (!old_member[i] || steps[i] < 0)
            continue;
        if (best < 0 || (recover ? steps[i] < best : steps[i] > best))
            best = steps[i];
    }
    if (best < 0)
        return -1;
    return recover ? best : best + 1;
}

size_t tide_policy_expired(const tide_coord_worker_t *workers, size_t n, uint64_t now_ns,
                           uint64_t heartbeat_ns, int miss_limit, int32_t *out)
{
    uint64_t limit = heartbeat_ns * (uint64_t)(miss_limit > 0 ? miss_limit : 1);
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        const tide_coord_worker_t *w = &workers[i];
        if (w->pool[0] == '\0' || w->state == TIDE_WS_FAILED)
            continue;
        if (now_ns > w->last_seen_ns && now_ns - w->last_seen_ns > limit)
            out[k++] = w->id;
    }
    return k;
}
