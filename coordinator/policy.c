/*
 * coordinator/policy: pure decision functions (see policy.h). Placement has
 * two halves: which workers a layout may use (members of the job first, then
 * idle workers, then workers running offline work, cheapest first: only as
 * many of those as the layout lacks) is the coordinator's choice; which of
 * them takes which coordinate is reshard's tide_reshard_place, which
 * minimises the bytes the reshard plan sends, keeps TP groups inside hosts
 * and, at equal bytes, keeps workers in their old roles. A job that joined
 * without tensors is placed over a stand-in collection (one TP-split tensor
 * per layer), so stage and TP-rank ownership still count.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "core/log.h"
#include "core/sort.h"
#include "coordinator/policy.h"

/* Sorting record for candidates: class, then a class-specific key. */
typedef struct cand_key {
    int32_t idx; /* index into cand[] */
    int32_t cls;
    int64_t k1, k2;
} cand_key;

static int cmp_key(const void *a, const void *b)
{
    const cand_key *x = a, *y = b;
    if (x->cls != y->cls)
        return x->cls < y->cls ? -1 : 1;
    if (x->k1 != y->k1)
        return x->k1 < y->k1 ? -1 : 1;
    return (x->k2 > y->k2) - (x->k2 < y->k2);
}

static int cmp_place_id(const void *a, const void *b)
{
    int32_t x = ((const tide_place_worker *)a)->id, y = ((const tide_place_worker *)b)->id;
    return (x > y) - (x < y);
}

static int cmp_i32(const void *a, const void *b)
{
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

static int64_t gcd64(int64_t a, int64_t b)
{
    while (b != 0) {
        int64_t t = a % b;
        a = b;
        b = t;
    }
    return a;
}

/*
 * The stand-in collection for a job without tensors: per layer one f32
 * [lcm(old tp, new tp) * 4, 16] tensor split along dimension 0, so that a
 * worker's gain for a role is the share of that stage and TP rank it holds.
 */
static tide_status stand_in_collection(const tide_layout_t *old, const tide_resize_req *req,
                                       tide_collection_t **out)
{
    int64_t a = old ? old->tp : 1, b = req->tp;
    int64_t rows = a / gcd64(a, b) * b * 4;
    TIDE_CHECK(tide_collection_new(out, req->num_layers));
    for (int i = 0; i < req->num_layers; i++) {
        tide_tensor_desc d;
        memset(&d, 0, sizeof d);
        snprintf(d.name, sizeof d.name, "layer.%d", i);
        d.dtype = TIDE_F32;
        d.ndim = 2;
        d.shape[0] = rows;
        d.shape[1] = 16;
        d.layer = i;
        d.tp = TIDE_TP_SPLIT;
        d.tp_dim = 0;
        d.tp_segments = 1;
        d.dp = TIDE_DP_REPLICATED;
        tide_status rc = tide_collection_add(*out, &d);
        if (rc != TIDE_OK) {
            tide_collection_destroy(out);
            return rc;
        }
    }
    return TIDE_OK;
}

/* TP groups of tp workers the hosts of these workers hold; hosts sorted in place. */
static long host_slots(int32_t *hosts, size_t n, int tp)
{
    tide_sort_i32(hosts, n);
    long slots = 0;
    for (size_t i = 0, run = 0; i < n; i++) {
        run++;
        if (i + 1 == n || hosts[i + 1] != hosts[i]) {
            slots += (long)(run / (size_t)tp);
            run = 0;
        }
    }
    return slots;
}

int tide_policy_tp_fit_dp(const tide_policy_worker *cand, size_t n, int tp, int pp, int want)
{
    if (tp <= 1 || want <= 0 || pp <= 0)
        return want > 0 ? want : 0;
    int32_t *hosts = tide_malloc((n ? n : 1) * sizeof *hosts);
    if (hosts == NULL)
        return 0; /* the caller's placement then reports what is missing */
    for (size_t i = 0; i < n; i++)
        hosts[i] = cand[i].host;
    long dp = host_slots(hosts, n, tp) / pp;
    tide_free(hosts);
    return dp < want ? (int)dp : want;
}

/*
 * TP groups inside hosts: when the first *offer candidates in preference
 * order lack room for dp * pp groups, offers offline workers too, cheapest
 * first, until they have it (or every candidate is offered: placement then
 * refuses with the counts).
 */
static tide_status offer_whole_hosts(const tide_policy_worker *cand, const cand_key *keys, size_t n,
                                     const tide_resize_req *req, size_t *offer)
{
    if (req->tp <= 1)
        return TIDE_OK;
    int32_t *hosts = tide_malloc((n ? n : 1) * sizeof *hosts);
    if (hosts == NULL)
        return tide_errorf(TIDE_ERR_NOMEM, "out of memory counting hosts");
    long groups = (long)req->dp * req->pp;
    size_t k = *offer;
    for (;;) {
        for (size_t i = 0; i < k; i++)
            hosts[i] = cand[keys[i].idx].host;
        if (host_slots(hosts, k, req->tp) >= groups || k == n)
            break;
        /* a few steps at most: each adds the workers a missing group needs */
        k = k + (size_t)req->tp < n ? k + (size_t)req->tp : n;
    }
    tide_free(hosts);
    *offer = k;
    return TIDE_OK;
}

/* The layout req asks for, without its map: the program's fit rules checked, stages from
 * req, or old's when pp and the layers stay. */
static tide_status new_layout(const tide_layout_t *old, const tide_resize_req *req,
                              tide_layout_t **out)
{
    /* what the program cannot run is refused whatever workers there are: the reason is the
       program's, and no number of workers changes it */
    if (tide_fit_check(req->fit, req->n_fit, req->dp, req->tp, req->pp, req->micro_batches) !=
        TIDE_OK)
        return tide_errorf(TIDE_ERR_INVALID,
                           "(dp %d, tp %d, pp %d; %d micro-batches) is not a layout the job's "
                           "program can run: %s",
                           req->dp, req->tp, req->pp, req->micro_batches, tide_last_error());
    tide_layout_t *l = NULL;
    TIDE_CHECK(tide_layout_new(&l, req->dp, req->tp, req->pp, req->num_layers, req->micro_batches));
    if (req->stage_start != NULL)
        memcpy(l->stage_start, req->stage_start, ((size_t)req->pp + 1) * sizeof(int));
    else if (old != NULL && old->pp == req->pp && old->num_layers == req->num_layers)
        memcpy(l->stage_start, old->stage_start, ((size_t)req->pp + 1) * sizeof(int));
    tide_status rc = tide_layout_validate(l, NULL);
    if (rc != TIDE_OK) {
        tide_layout_destroy(&l);
        return rc;
    }
    *out = l;
    return TIDE_OK;
}

/* The candidates' ranks, sorted, into *out (caller frees); TIDE_ERR_INVALID when one is
 * negative or listed twice. */
static tide_status sorted_ranks(const tide_policy_worker *cand, size_t n, int32_t **out)
{
    int32_t *ranks = tide_malloc((n ? n : 1) * sizeof *ranks);
    if (ranks == NULL)
        return tide_errorf(TIDE_ERR_NOMEM, "out of memory sorting %zu candidates", n);
    for (size_t i = 0; i < n; i++)
        ranks[i] = cand[i].rank;
    tide_sort_i32(ranks, n);
    for (size_t i = 0; i < n; i++) {
        if (ranks[i] < 0 || (i > 0 && ranks[i] == ranks[i - 1])) {
            tide_status rc = tide_errorf(TIDE_ERR_INVALID, "candidate rank %d is %s", ranks[i],
                                         ranks[i] < 0 ? "negative" : "listed twice");
            tide_free(ranks);
            return rc;
        }
    }
    *out = ranks;
    return TIDE_OK;
}

/* The candidates' preference keys, unsorted, into *out (caller frees): members (of old
 * after all), idle, then offline work by ascending priority; counts[class] of each. */
static tide_status preference_keys(const tide_layout_t *old, const tide_policy_worker *cand,
                                   size_t n, cand_key **out, size_t counts[3])
{
    size_t n_old = old ? tide_layout_size(old) : 0;
    int32_t *olds = tide_malloc((n_old ? n_old : 1) * sizeof *olds);
    cand_key *keys = tide_malloc((n ? n : 1) * sizeof *keys);
    tide_status rc = TIDE_OK;
    if (olds == NULL || keys == NULL)
        TIDE_FAIL_GOTO(rc, out, TIDE_ERR_NOMEM, "out of memory ordering %zu candidates", n);
    if (old != NULL)
        memcpy(olds, old->worker, n_old * sizeof *olds);
    tide_sort_i32(olds, n_old);
    for (size_t i = 0; i < n; i++) {
        cand_key *k = &keys[i];
        k->idx = (int32_t)i;
        k->cls = (int32_t)cand[i].cls;
        if (k->cls < 0 || k->cls > 2 || cand[i].host < 0)
            TIDE_FAIL_GOTO(rc, out, TIDE_ERR_INVALID,
                           "candidate %d has an unknown class %d or host %d", cand[i].rank, k->cls,
                           cand[i].host);
        if (k->cls == TIDE_PW_MEMBER &&
            (old == NULL || bsearch(&cand[i].rank, olds, n_old, sizeof *olds, cmp_i32) == NULL))
            k->cls = TIDE_PW_IDLE; /* not in the old layout after all */
        counts[k->cls]++;
        k->k1 = k->cls == TIDE_PW_OFFLINE ? cand[i].priority : 0; /* least important first */
        k->k2 = cand[i].rank;
    }
    *out = keys;
    keys = NULL;
out:
    tide_free(olds);
    tide_free(keys);
    return rc;
}

/* Maps the offered workers pw[0..offer) onto l's coordinates (reshard's placement, or the
 * plain rank order), over coll or a stand-in for it. */
static tide_status map_workers(const tide_layout_t *old, const tide_collection_t *coll,
                               const tide_resize_req *req, tide_place_worker *pw, size_t offer,
                               tide_layout_t *l)
{
    tide_collection_t *own = NULL;
    tide_layout_t *placed = NULL;
    tide_status rc = TIDE_OK;
    if (req->plain)
        qsort(pw, offer, sizeof *pw, cmp_place_id);
    if (coll == NULL) {
        TIDE_CHECK(stand_in_collection(old, req, &own));
        coll = own;
    }
    tide_place_request pr = {.dp = req->dp,
                             .tp = req->tp,
                             .pp = req->pp,
                             .micro_batches = req->micro_batches,
                             .stage_start = l->stage_start,
                             .workers = pw,
                             .n_workers = offer,
                             .tp_across_hosts = req->tp_across_hosts};
    if (req->plain)
        rc = tide_reshard_place_default(coll, &pr, &placed);
    else
        rc = tide_reshard_place(old, coll, &pr, &placed);
    if (rc == TIDE_OK)
        memcpy(l->worker, placed->worker, tide_layout_size(l) * sizeof *l->worker);
    tide_layout_destroy(&placed);
    tide_collection_destroy(&own);
    return rc;
}

tide_status tide_policy_place(const tide_layout_t *old, const tide_collection_t *coll,
                              const tide_resize_req *req, const tide_policy_worker *cand, size_t n,
                              tide_layout_t **out, int32_t *preempt, size_t *n_preempt)
{
    tide_status rc = TIDE_OK;
    tide_layout_t *l = NULL;
    cand_key *keys = NULL;
    int32_t *ranks = NULL;
    tide_place_worker *pw = NULL;
    size_t counts[3] = {0, 0, 0};

    *out = NULL;
    *n_preempt = 0;
    TIDE_CHECK(new_layout(old, req, &l));
    size_t need = tide_layout_size(l);
    TIDE_CHECK_GOTO(sorted_ranks(cand, n, &ranks), rc, out);
    TIDE_CHECK_GOTO(preference_keys(old, cand, n, &keys, counts), rc, out);
    if (n < need) {
        char buf[128];
        TIDE_FAIL_GOTO(rc, out, TIDE_ERR_NO_DEVICE,
                       "layout %s needs %zu workers; the pool has %zu available (%zu in the "
                       "job, %zu idle, %zu running offline work); free workers or ask for less",
                       tide_layout_format(l, buf, sizeof buf), need, n, counts[0], counts[1],
                       counts[2]);
    }
    qsort(keys, n, sizeof *keys, cmp_key);

    /* offered workers: every member and idle worker, offline ones only as far as needed;
     * --placement default: the first `need` in preference order, in rank order */
    size_t offer = counts[0] + counts[1];
    if (offer < need || req->plain)
        offer = need;
    if (!req->plain && !req->tp_across_hosts)
        TIDE_CHECK_GOTO(offer_whole_hosts(cand, keys, n, req, &offer), rc, out);
    pw = tide_malloc(offer * sizeof *pw);
    TIDE_CHECK_ALLOC_GOTO(pw, rc, out);
    for (size_t i = 0; i < offer; i++)
        pw[i] = (tide_place_worker){cand[keys[i].idx].rank, cand[keys[i].idx].host};
    TIDE_CHECK_GOTO(map_workers(old, coll, req, pw, offer, l), rc, out);

    /* the offline work on every chosen worker that runs some is preempted */
    memcpy(ranks, l->worker, need * sizeof *ranks);
    tide_sort_i32(ranks, need);
    for (size_t i = 0; i < n; i++)
        if (cand[i].cls == TIDE_PW_OFFLINE &&
            bsearch(&cand[i].rank, ranks, need, sizeof *ranks, cmp_i32) != NULL)
            preempt[(*n_preempt)++] = cand[i].rank;
    TIDE_CHECK_GOTO(tide_layout_validate(l, NULL), rc, out);
    *out = l;
    l = NULL;
out:
    tide_layout_destroy(&l);
    tide_free(keys);
    tide_free(ranks);
    tide_free(pw);
    if (rc != TIDE_OK)
        *n_preempt = 0;
    return rc;
}

int tide_policy_fit_dp(const tide_fit_rule *fit, size_t n_fit, int tp, int pp, int micro, int want)
{
    for (int dp = want; dp >= 1; dp--)
        if (tide_fit_check(fit, n_fit, dp, tp, pp, micro) == TIDE_OK)
            return dp;
    return 0;
}

/* Appends printf text to why[0..len) at *at, "; " between parts; never overflows. */
static void why_add(char *why, size_t len, size_t *at, const char *fmt, ...) TIDE_PRINTF(4, 5);
static void why_add(char *why, size_t len, size_t *at, const char *fmt, ...)
{
    if (why == NULL || *at + 1 >= len)
        return;
    if (*at > 0 && why[*at - 1] != ' ') {
        int w = snprintf(why + *at, len - *at, "; ");
        *at += w < 0 ? 0 : (size_t)w;
        if (*at >= len)
            *at = len - 1;
    }
    va_list ap;
    va_start(ap, fmt);
    int w = vsnprintf(why + *at, len - *at, fmt, ap);
    va_end(ap);
    *at += w < 0 ? 0 : (size_t)w;
    if (*at >= len)
        *at = len - 1;
}

/*
 * Recovery's dp: three limits applied in turn, each kept apart so that the event can say
 * which one cost replicas: the candidates' count, TP groups inside hosts
 * (tide_policy_tp_fit_dp) and the program's fit rules (tide_policy_fit_dp). 0 with the
 * error set when none leaves a dp.
 */
static tide_status recover_dp(const tide_layout_t *old, const tide_fit_rule *fit, size_t n_fit,
                              const tide_policy_worker *cand, size_t n, int *dp_out, char *why,
                              size_t why_len)
{
    size_t group = (size_t)old->tp * (size_t)old->pp, at = 0;
    if (why != NULL && why_len > 0)
        why[0] = '\0';
    *dp_out = 0;
    if (n < group)
        return tide_errorf(TIDE_ERR_NO_DEVICE,
                           "recovery needs at least tp * pp = %zu workers for one replica; only "
                           "%zu are available in the pool; the job waits for workers",
                           group, n);
    int by_count = n < tide_layout_size(old) ? (int)(n / group) : old->dp;
    int by_hosts = tide_policy_tp_fit_dp(cand, n, old->tp, old->pp, by_count);
    if (by_hosts == 0)
        return tide_errorf(TIDE_ERR_NO_DEVICE,
                           "recovery needs a host with %d free workers for each of the %d TP "
                           "groups of one replica; the %zu available workers' hosts do not "
                           "have that room; the job waits for workers",
                           old->tp, old->pp, n);
    int dp = tide_policy_fit_dp(fit, n_fit, old->tp, old->pp, old->micro_batches, by_hosts);
    if (dp == 0) {
        /* the rule tp, pp or the micro-batches break */
        tide_fit_check(fit, n_fit, 1, old->tp, old->pp, old->micro_batches);
        return tide_errorf(TIDE_ERR_INVALID,
                           "the job's own layout (tp %d, pp %d) breaks its program's fit rules "
                           "(%s): no dp can recover it",
                           old->tp, old->pp, tide_last_error());
    }
    *dp_out = dp;
    if (dp == old->dp)
        return TIDE_OK;
    why_add(why, why_len, &at, "dp %d instead of %d: ", dp, old->dp);
    if (by_count < old->dp)
        why_add(why, why_len, &at, "the %zu available workers hold at most dp %d of tp %d x pp %d",
                n, by_count, old->tp, old->pp);
    if (by_hosts < by_count)
        why_add(why, why_len, &at,
                "each TP group of %d must sit inside one host, and the hosts hold dp %d", old->tp,
                by_hosts);
    if (dp < by_hosts) {
        tide_fit_check(fit, n_fit, by_hosts, old->tp, old->pp, old->micro_batches);
        why_add(why, why_len, &at, "the job's program cannot run dp %d: %s", by_hosts,
                tide_last_error());
    }
    TIDE_INFO("policy", "recovery: %s", why != NULL ? why : "smaller dp");
    return TIDE_OK;
}

tide_status tide_policy_recover(const tide_layout_t *old, const tide_collection_t *coll,
                                const tide_fit_rule *fit, size_t n_fit,
                                const tide_policy_worker *cand, size_t n, tide_layout_t **out,
                                int32_t *preempt, size_t *n_preempt, char *why, size_t why_len)
{
    *out = NULL;
    *n_preempt = 0;
    tide_resize_req req = {
        old->dp, old->tp, old->pp, old->num_layers, old->micro_batches, old->stage_start, 0,
        0,       fit,     n_fit};
    TIDE_CHECK(recover_dp(old, fit, n_fit, cand, n, &req.dp, why, why_len));
    TIDE_CHECK(tide_policy_place(old, coll, &req, cand, n, out, preempt, n_preempt));
    if (req.dp == old->dp || why == NULL || why_len == 0)
        return TIDE_OK;
    /* what the smaller layout leaves: survivors and idle workers free for offline work */
    size_t need = tide_layout_size(*out), idle = 0;
    int32_t *used = tide_malloc(need * sizeof *used);
    if (used == NULL) {
        tide_layout_destroy(out);
        *n_preempt = 0;
        return tide_errorf(TIDE_ERR_NOMEM, "out of memory describing a recovery");
    }
    memcpy(used, (*out)->worker, need * sizeof *used);
    tide_sort_i32(used, need);
    for (size_t i = 0; i < n; i++)
        idle += cand[i].cls != TIDE_PW_OFFLINE &&
                bsearch(&cand[i].rank, used, need, sizeof *used, cmp_i32) == NULL;
    tide_free(used);
    size_t at = strlen(why);
    why_add(why, why_len, &at, "%zu worker%s left idle for offline work", idle,
            idle == 1 ? "" : "s");
    return TIDE_OK;
}

static int cmp_offline(const void *a, const void *b)
{
    const tide_policy_offline *x = a, *y = b;
    if (x->priority != y->priority)
        return x->priority > y->priority ? -1 : 1;
    return (x->job > y->job) - (x->job < y->job);
}

static int cmp_idle(const void *a, const void *b)
{
    const tide_policy_idle *x = a, *y = b;
    return (x->worker > y->worker) - (x->worker < y->worker);
}

tide_status tide_policy_assign(const tide_policy_offline *queued, size_t nq,
                               const tide_policy_idle *idle, size_t ni, tide_policy_assignment *out,
                               size_t *n_out)
{
    *n_out = 0;
    if (nq == 0 || ni == 0)
        return TIDE_OK;
    tide_policy_offline *q = tide_malloc(nq * sizeof *q);
    tide_policy_idle *w = tide_malloc(ni * sizeof *w);
    uint8_t *taken = tide_calloc(ni, 1);
    if (q == NULL || w == NULL || taken == NULL) {
        tide_free(q);
        tide_free(w);
        tide_free(taken);
        return tide_errorf(TIDE_ERR_NOMEM, "out of memory assigning offline work");
    }
    memcpy(q, queued, nq * sizeof *q);
    memcpy(w, idle, ni * sizeof *w);
    qsort(q, nq, sizeof *q, cmp_offline);
    qsort(w, ni, sizeof *w, cmp_idle);
    /* O(nq * ni) at worst; both are a pool's worth at most, and the scan stops once
       every worker is taken */
    size_t n = 0;
    for (size_t i = 0; i < nq && n < ni; i++) {
        /* a retry goes elsewhere than where it just failed, when it can */
        size_t pick = ni, fallback = ni;
        for (size_t k = 0; k < ni && pick == ni; k++) {
            if (taken[k] || (q[i].mem_cap > 0 && w[k].memory > 0 && w[k].memory < q[i].mem_cap))
                continue;
            if (w[k].worker == q[i].avoid && q[i].avoid >= 0) {
                fallback = k;
                continue;
            }
            pick = k;
        }
        if (pick == ni)
            pick = fallback;
        if (pick == ni)
            continue;
        taken[pick] = 1;
        out[n++] = (tide_policy_assignment){q[i].job, w[pick].worker};
    }
    *n_out = n;
    tide_free(q);
    tide_free(w);
    tide_free(taken);
    return TIDE_OK;
}

int64_t tide_policy_switch_step(const int64_t *steps, const uint8_t *old_member,
                                const uint8_t *gone, size_t n, int recover)
{
    int64_t best = -1;
    for (size_t i = 0; i < n; i++) {
        if (!old_member[i] || (gone != NULL && gone[i]) || steps[i] < 0)
            continue;
        if (best < 0 || (recover ? steps[i] < best : steps[i] > best))
            best = steps[i];
    }
    if (best < 0)
        return -1;
    return recover ? best : best + 1;
}

tide_status tide_policy_drain(const tide_layout_t *old, const tide_collection_t *coll,
                              const tide_fit_rule *fit, size_t n_fit,
                              const tide_policy_worker *cand, size_t n, int32_t drained,
                              tide_layout_t **out, int32_t *preempt, size_t *n_preempt, char *why,
                              size_t why_len)
{
    *out = NULL;
    *n_preempt = 0;
    tide_policy_worker *rest = tide_malloc((n ? n : 1) * sizeof *rest);
    if (rest == NULL)
        return tide_errorf(TIDE_ERR_NOMEM, "out of memory planning the drain");
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (cand[i].rank != drained)
            rest[k++] = cand[i];
    tide_status rc =
        tide_policy_recover(old, coll, fit, n_fit, rest, k, out, preempt, n_preempt, why, why_len);
    tide_free(rest);
    return rc;
}

tide_status tide_policy_first_layout(const tide_collection_t *coll, const tide_resize_req *req,
                                     tide_policy_worker *cand, size_t *n, int32_t launch_size,
                                     tide_layout_t **out, int32_t *preempt, size_t *n_preempt,
                                     tide_policy_first *verdict, int *fit_dp)
{
    *out = NULL;
    *n_preempt = 0;
    *verdict = TIDE_FIRST_WAIT;
    *fit_dp = 0;
    /* The job's own ranks start it: idle ones first, and those that were given offline work
       between registering and joining (backfill is quick) are preempted for it, or the job
       would wait for that work to end. */
    size_t k = 0, need = (size_t)req->dp * (size_t)req->tp * (size_t)req->pp;
    for (size_t i = 0; i < *n; i++)
        if (cand[i].cls == TIDE_PW_IDLE || cand[i].cls == TIDE_PW_OFFLINE)
            cand[k++] = cand[i];
    *n = k;
    if (k < need)
        return TIDE_OK;
    /* Every rank of the launch joined and their hosts cannot hold the TP groups each inside
       one host: more ranks will never come, and a TP group across hosts runs its per-layer
       collectives over the network, so the job is refused instead of waiting for ever. */
    int fit = tide_policy_tp_fit_dp(cand, k, req->tp, req->pp, req->dp);
    if (fit < req->dp && launch_size >= 0 && k >= (size_t)launch_size) {
        *verdict = TIDE_FIRST_REFUSE;
        *fit_dp = fit;
        return TIDE_OK;
    }
    TIDE_CHECK(tide_policy_place(NULL, coll, req, cand, k, out, preempt, n_preempt));
    *verdict = TIDE_FIRST_PLACED;
    return TIDE_OK;
}

tide_status tide_policy_rollback(const tide_layout_t *old, const tide_collection_t *coll,
                                 const tide_fit_rule *fit, size_t n_fit,
                                 const tide_policy_worker *cand, size_t n, tide_layout_t **out,
                                 int32_t *preempt, size_t *n_preempt, char *why, size_t why_len)
{
    int tries = 256; /* placements attempted at most (each O(n log n)) */
    for (int size = (int)(n < (size_t)INT32_MAX ? n : INT32_MAX); size >= 1 && tries > 0; size--)
        for (int tp = old->tp; tp >= 1 && tries > 0; tp--) {
            if (old->tp % tp != 0 || size % tp != 0)
                continue;
            for (int pp = old->pp; pp >= 1 && tries > 0; pp--) {
                int dp = (size / tp) / pp;
                if ((size / tp) % pp != 0 ||
                    tide_fit_check(fit, n_fit, dp, tp, pp, old->micro_batches) != TIDE_OK)
                    continue;
                tide_resize_req req = {dp, tp,  pp,   old->num_layers, old->micro_batches, NULL, 0,
                                       0,  fit, n_fit};
                tries--;
                if (tide_policy_place(old, coll, &req, cand, n, out, preempt, n_preempt) != TIDE_OK)
                    continue;
                snprintf(why, why_len,
                         "(dp %d, tp %d, pp %d) instead of (dp %d, tp %d, pp %d): the %zu "
                         "available workers hold no more",
                         dp, tp, pp, old->dp, old->tp, old->pp, n);
                tide_error_clear();
                return TIDE_OK;
            }
        }
    return tide_errorf(TIDE_ERR_NO_DEVICE, "%zu candidate workers", n);
}

/* The plan's "needed by worker N" names a stand-in (an id >= first_fresh) when to was
 * made up: name the dead worker it replaces instead. */
static void name_replaced(char *why, size_t len, const tide_layout_t *old, const tide_layout_t *to,
                          size_t first_fresh)
{
    char *at = strstr(why, "needed by worker ");
    long id = at != NULL ? strtol(at + 17, NULL, 10) : -1;
    for (size_t i = 0; id >= (long)first_fresh && i < tide_layout_size(to); i++)
        if (to->worker[i] == id) {
            char rest[1024];
            const char *tail = at + 17;
            while (*tail >= '0' && *tail <= '9')
                tail++;
            snprintf(rest, sizeof rest, "%s", tail);
            snprintf(at, len - (size_t)(at - why), "needed by any worker that replaces worker %d%s",
                     (int)old->worker[i], rest);
            break;
        }
}

tide_status tide_policy_recovery_feasible(const tide_layout_t *old, const uint8_t *dead,
                                          const tide_layout_t *to, const tide_collection_t *coll)
{
    tide_layout_t *made = NULL; /* to, or old with each dead coordinate given a stand-in */
    size_t n = 0;
    for (size_t i = 0; i < tide_layout_size(old); i++)
        if ((size_t)old->worker[i] + 1 > n)
            n = (size_t)old->worker[i] + 1;
    for (size_t i = 0; to != NULL && i < tide_layout_size(to); i++)
        if ((size_t)to->worker[i] + 1 > n)
            n = (size_t)to->worker[i] + 1;
    size_t fresh = n; /* ids past every worker's: the stand-ins of the dead (to NULL) */
    if (to == NULL) {
        n += tide_layout_size(old);
        TIDE_CHECK(tide_layout_copy(&made, old));
    }
    uint8_t *alive = tide_malloc(n ? n : 1);
    if (alive == NULL) {
        tide_layout_destroy(&made);
        return tide_errorf(TIDE_ERR_NOMEM, "out of memory checking a recovery");
    }
    memset(alive, 1, n);
    for (size_t i = 0; i < tide_layout_size(old); i++) {
        if (!dead[i])
            continue;
        alive[old->worker[i]] = 0;
        if (made != NULL)
            made->worker[i] = (int32_t)fresh++;
    }
    tide_plan_totals t;
    const tide_layout_t *target = made != NULL ? made : to;
    tide_status rc = tide_reshard_plan_totals(old, target, coll, alive, n, &t);
    char why[1024];
    snprintf(why, sizeof why, "%s", rc != TIDE_OK ? tide_last_error() : "");
    if (rc != TIDE_OK && made != NULL)
        name_replaced(why, sizeof why, old, made, n - tide_layout_size(old));
    tide_free(alive);
    tide_layout_destroy(&made);
    if (rc != TIDE_OK)
        return tide_errorf(rc,
                           "its state cannot be rebuilt from the survivors%s: %s; restart it "
                           "from a checkpoint",
                           to == NULL ? ", however many workers join" : "", why);
    return TIDE_OK;
}

long tide_policy_bubble_pick(const tide_policy_bubbles *w, size_t n)
{
    long best = -1;
    for (size_t i = 0; i < n; i++) {
        if (w[i].bubble_ns == 0 || w[i].busy_ns == 0)
            continue;
        if (best < 0 || (double)w[i].bubble_ns / (double)w[i].busy_ns >
                            (double)w[best].bubble_ns / (double)w[best].busy_ns)
            best = (long)i;
    }
    return best;
}

int64_t tide_policy_retry_backoff_ms(int64_t base_ms, int32_t failures)
{
    int64_t ms = base_ms;
    for (int32_t i = 1; i < failures && ms < 60000; i++)
        ms *= 2;
    return ms > 60000 ? 60000 : ms;
}

int64_t tide_policy_ckpt_step(int64_t furthest, double steps_per_s, int64_t heartbeat_ms)
{
    double ahead = steps_per_s * 4.0 * (double)heartbeat_ms / 1000.0;
    return furthest + 2 + (int64_t)(ahead < 1e6 ? ahead : 1e6);
}
