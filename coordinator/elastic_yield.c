/*
 * coordinator/elastic_yield: lower priorities giving GPUs to a higher one, the part of
 * the elastic policy's run (elastic.c) that shrinks other jobs. A job yields whole
 * replicas, the ones worth most to the job it yields to, never below its minimum, and
 * only when that raises the dp the higher job reaches; it may yield to several higher
 * jobs in one run (decisions in a row).
 */
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "core/sort.h"
#include "coordinator/elastic_int.h"

static int cmp_i32(const void *a, const void *b)
{
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/* Workers of sorted hosts h[0..n) on host `host`. */
static int64_t count_host(const int32_t *h, size_t n, int32_t host)
{
    const int32_t *p = bsearch(&host, h, n, sizeof *h, cmp_i32);
    if (p == NULL)
        return 0;
    const int32_t *a = p, *b = p;
    while (a > h && a[-1] == host)
        a--;
    while (b + 1 < h + n && b[1] == host)
        b++;
    return b - a + 1;
}

/*
 * Which of k's replicas to give up for j, marked in drop[dp rank]: whole replicas (so
 * that nothing moves), those worth most to j first: a GPU of k counts for the room j
 * already has on its host plus k's GPUs there that j can use (TP groups fill hosts).
 * j's candidates are in r->cand.
 */
static tide_status choose_replicas(run *r, size_t k, size_t j, int give, uint8_t *drop)
{
    const tide_layout_t *l = r->lay[k];
    size_t m = tide_layout_size(l);
    int32_t *jh = tide_malloc((r->n_cand ? r->n_cand : 1) * sizeof *jh);
    host_key *keys = tide_malloc(m * sizeof *keys);
    host_key *rep = tide_calloc((size_t)l->dp, sizeof *rep);
    if (jh == NULL || keys == NULL || rep == NULL) {
        tide_free(jh);
        tide_free(keys);
        tide_free(rep);
        return tide_errorf(TIDE_ERR_NOMEM, "out of memory choosing what job %lld gives up",
                           (long long)r->jobs[k].id);
    }
    for (size_t i = 0; i < r->n_cand; i++)
        jh[i] = r->cand[i].host;
    tide_sort_i32(jh, r->n_cand);
    tide__elastic_next_epoch(r); /* j's reach */
    for (size_t x = 0, nr = tide__elastic_ranks_of(r, &r->jobs[j]); x < nr; x++) {
        int32_t g = tide__elastic_gpu_of(r, &r->jobs[j], (int32_t)x);
        if (g >= 0)
            r->stamp[g] = r->epoch;
    }
    size_t nk = 0;
    for (size_t i = 0; i < m; i++) {
        int32_t g = tide__elastic_gpu_of(r, &r->jobs[k], l->worker[i]);
        if (r->stamp[g] == r->epoch)
            keys[nk++] = (host_key){(int32_t)i, r->gpus[g].host,
                                    count_host(jh, r->n_cand, r->gpus[g].host), 0};
    }
    tide__elastic_score_by_host(keys, nk, 1);
    for (int d = 0; d < l->dp; d++)
        rep[d] = (host_key){d, 0, 0, -d}; /* ties: the highest dp rank first */
    for (size_t i = 0; i < nk; i++) {
        int d = (int)((size_t)keys[i].idx / (size_t)l->tp % (size_t)l->dp);
        rep[d].score += keys[i].score;
    }
    qsort(rep, (size_t)l->dp, sizeof *rep, tide__elastic_cmp_score);
    for (int i = 0; i < give && i < l->dp; i++)
        drop[rep[i].idx] = 1;
    tide_free(jh);
    tide_free(keys);
    tide_free(rep);
    return TIDE_OK;
}

/*
 * Shrinks k to dp d for j: k keeps the replicas j needs least (choose_replicas), placed
 * over its own GPUs; appends a YIELD whose released GPUs are kept for j. Appends nothing
 * when k cannot be placed at d.
 */
static tide_status yield(run *r, size_t k, size_t j, int d)
{
    const tide_elastic_job *kb = &r->jobs[k];
    const tide_layout_t *l = r->lay[k];
    size_t m = tide_layout_size(l), n = 0, n_pre = 0;
    uint8_t *drop = tide_calloc((size_t)l->dp, 1);
    tide_policy_worker *kc = tide_malloc(m * sizeof *kc);
    int32_t *pre = tide_malloc(m * sizeof *pre);
    tide_layout_t *nl = NULL;
    tide_elastic_decision *dec = NULL;
    tide_status rc = TIDE_OK;
    TIDE_CHECK_ALLOC_GOTO(drop, rc, out);
    TIDE_CHECK_ALLOC_GOTO(kc, rc, out);
    TIDE_CHECK_ALLOC_GOTO(pre, rc, out);
    TIDE_CHECK_GOTO(choose_replicas(r, k, j, r->cur[k] - d, drop), rc, out);
    for (int pass = 0; pass < 2 && nl == NULL; pass++) {
        n = 0;
        for (size_t i = 0; i < m; i++)
            if (pass == 1 || !drop[i / (size_t)l->tp % (size_t)l->dp])
                kc[n++] = (tide_policy_worker){
                    l->worker[i], r->gpus[tide__elastic_gpu_of(r, kb, l->worker[i])].host,
                    TIDE_PW_MEMBER, 0};
        if (tide__elastic_place(r, k, d, kc, n, &nl, pre, &n_pre) != TIDE_OK)
            nl = NULL; /* the second pass lets placement choose among all its GPUs */
    }
    if (nl == NULL)
        goto out;
    TIDE_CHECK_GOTO(tide__elastic_emit(r, k, TIDE_ELASTIC_YIELD, &nl, NULL, 0, &dec), rc, out);
    dec->for_job = r->jobs[j].id;
    tide__elastic_estimate(r, k, dec->layout, dec);
    for (size_t i = 0; i < dec->n_released; i++) {
        r->hold_for[dec->released[i]] = (int32_t)j;
        r->from_job[dec->released[i]] = (int32_t)k;
    }
    tide__elastic_why_head(r, k, dec);
    tide__elastic_why_add(dec, " for job %lld (priority %d): -%zu GPUs (", (long long)r->jobs[j].id,
                          r->jobs[j].priority, dec->n_released);
    tide__elastic_why_hosts(r, dec, dec->released, dec->n_released);
    tide__elastic_why_add(dec, "); est. %.2f s down, %llu bytes moved", dec->downtime_s,
                          (unsigned long long)dec->bytes_sent);
out:
    tide_layout_destroy(&nl);
    tide_free(drop);
    tide_free(kc);
    tide_free(pre);
    return rc;
}

/* k may yield to j: lower priority, running, free to change, above its minimum. */
static int may_yield(const run *r, size_t k, size_t j)
{
    return k != j && r->jobs[k].priority < r->jobs[j].priority && r->jobs[k].layout != NULL &&
           !r->frozen[k] && r->changed[k] != 1 && !tide__elastic_limited(r, k) &&
           r->cur[k] > r->lo[k];
}

/*
 * Takes GPUs for j (short of dp `want`, *fd reachable now) from lower-priority jobs, the
 * lowest priority first (the youngest first among equals), each down to what j lacks and
 * never below its minimum; keeps a yield only when it raises the dp j can reach.
 */
tide_status tide__elastic_take_from_lower(run *r, size_t j, int want, int *fd)
{
    long gj = (long)r->jobs[j].tp * r->jobs[j].pp;
    for (size_t oi = r->nj; oi-- > 0 && *fd < want;) {
        size_t k = r->order[oi];
        if (!may_yield(r, k, j))
            continue;
        const tide_elastic_job *kb = &r->jobs[k];
        long gk = (long)kb->tp * kb->pp, lack = (long)(want - *fd) * gj;
        int d = r->cur[k] - (int)((lack + gk - 1) / gk);
        d = d < r->lo[k] ? r->lo[k]
                         : tide_policy_fit_dp(kb->fit, kb->n_fit, kb->tp, kb->pp, kb->micro, d);
        d = d < r->lo[k] ? r->lo[k] : d;
        for (int tries = 0; tries < 2 && d < r->cur[k]; tries++) {
            size_t mark = r->plan->n;
            TIDE_CHECK(yield(r, k, j, d));
            tide__elastic_build_cands(r, j, 0);
            int f2 = mark < r->plan->n ? tide__elastic_feasible(r, j, want) : *fd;
            if (f2 > *fd) {
                *fd = f2;
                break;
            }
            tide__elastic_undo_yields(r, mark);
            tide__elastic_build_cands(r, j, 0);
            if (d == r->lo[k])
                break;
            d = r->lo[k]; /* the GPUs did not sit where j can use them: all k can give */
        }
    }
    return TIDE_OK;
}
