/*
 * Unit and property tests of the elastic policy (coordinator/elastic): scenarios of the
 * issue (grow onto a joining pool, offline work yields first, a higher priority takes
 * GPUs down to a lower one's minimum, re-grow after a failure, pins and operator resizes
 * win, bounds refused with their reason), then randomised clusters checked for the
 * invariants (bounds, priorities, no GPU twice, rate limit, pay-back of the downtime) and
 * a simulated day of flapping hosts with no decision inside a job's interval.
 * In-process, a second or two in all.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coordinator/elastic.h"
#include "core/error.h"

/* ---- a small cluster the tests build and change ------------------------------------------ */

#define MAXJ 8

typedef struct cluster {
    tide_elastic_gpu *gpu;
    size_t ng;
    int per_host;
    tide_elastic_job job[MAXJ];
    tide_layout_t *layout[MAXJ]; /* owned; job[j].layout points here */
    tide_fit_rule fit[MAXJ][2];
    size_t nj;
} cluster;

static void cluster_init(cluster *c, int hosts, int per_host)
{
    memset(c, 0, sizeof *c);
    c->ng = (size_t)hosts * (size_t)per_host;
    c->per_host = per_host;
    c->gpu = calloc(c->ng, sizeof *c->gpu);
    for (size_t g = 0; g < c->ng; g++)
        c->gpu[g] = (tide_elastic_gpu){(int32_t)(g / (size_t)per_host), TIDE_EG_FREE, 0, 0};
}

static void cluster_free(cluster *c)
{
    for (size_t j = 0; j < MAXJ; j++)
        tide_layout_destroy(&c->layout[j]);
    free(c->gpu);
}

/* Adds a job (not started); returns its index. */
static size_t add_job(cluster *c, int64_t id, int prio, int min, int max, int tp, int pp)
{
    size_t j = c->nj++;
    c->job[j] = (tide_elastic_job){.id = id,
                                   .priority = prio,
                                   .min_gpus = min,
                                   .max_gpus = max,
                                   .tp = tp,
                                   .pp = pp,
                                   .micro = 1,
                                   .num_layers = 8,
                                   .state_bytes = 1u << 30,
                                   .last_change_s = -1};
    return j;
}

/* Gives job j a layout of dp over the listed GPUs (TP fastest), and marks them held. */
static void set_layout(cluster *c, size_t j, int dp, const int32_t *gpus)
{
    tide_elastic_job *jb = &c->job[j];
    tide_layout_destroy(&c->layout[j]);
    cr_assert_eq(tide_layout_new(&c->layout[j], dp, jb->tp, jb->pp, jb->num_layers, jb->micro),
                 TIDE_OK);
    for (size_t i = 0; i < tide_layout_size(c->layout[j]); i++) {
        c->layout[j]->worker[i] = gpus[i];
        c->gpu[gpus[i]].state = TIDE_EG_HELD;
    }
    jb->layout = c->layout[j];
}

/* GPUs [first, first + n) as a list (static storage: use before the next call). */
static const int32_t *range(int32_t first, int n)
{
    static int32_t r[4096];
    for (int i = 0; i < n; i++)
        r[i] = first + i;
    return r;
}

static void set_host(cluster *c, int host, int state, int joining)
{
    for (int g = 0; g < c->per_host; g++) {
        c->gpu[host * c->per_host + g].state = state;
        c->gpu[host * c->per_host + g].joining = joining;
    }
}

static tide_elastic_cfg cfg_fast(void)
{
    tide_elastic_cfg cfg = tide_elastic_cfg_default();
    cfg.min_interval_s = 60;
    return cfg;
}

static void decide(cluster *c, const tide_elastic_cfg *cfg, double now, tide_elastic_plan *p)
{
    tide_elastic_plan_clear(p);
    cr_assert_eq(tide_elastic_decide(cfg, c->job, c->nj, c->gpu, c->ng, now, p), TIDE_OK, "%s",
                 tide_last_error());
}

/* Applies every decision as if it committed at now: layouts replaced, GPUs moved. */
static void apply(cluster *c, const tide_elastic_plan *p, double now)
{
    for (size_t i = 0; i < p->n; i++) {
        const tide_elastic_decision *d = &p->d[i];
        for (size_t k = 0; k < d->n_released; k++)
            c->gpu[d->released[k]].state = TIDE_EG_FREE;
        for (size_t k = 0; k < d->n_gained; k++)
            c->gpu[d->gained[k]].state = TIDE_EG_HELD;
        tide_layout_destroy(&c->layout[d->index]);
        cr_assert_eq(tide_layout_copy(&c->layout[d->index], d->layout), TIDE_OK);
        c->job[d->index].layout = c->layout[d->index];
        c->job[d->index].last_change_s = now;
    }
    for (size_t g = 0; g < c->ng; g++)
        c->gpu[g].joining = 0;
}

static int dp_of(const cluster *c, size_t j)
{
    return c->job[j].layout ? c->job[j].layout->dp : 0;
}

/* ---- declarations ------------------------------------------------------------------------ */

Test(elastic, bad_bounds_are_refused_with_the_reason)
{
    tide_elastic_job j = {.id = 1,
                          .priority = 5,
                          .min_gpus = 12,
                          .max_gpus = 8,
                          .tp = 1,
                          .pp = 1,
                          .micro = 1,
                          .num_layers = 4};
    cr_assert_eq(tide_elastic_check(&j, NULL, NULL), TIDE_ERR_INVALID);
    cr_assert(strstr(tide_last_error(), "min 12 GPUs is above max 8"), "%s", tide_last_error());
    j.min_gpus = 4;
    j.priority = TIDE_ELASTIC_PRIORITY_MAX + 1;
    cr_assert_eq(tide_elastic_check(&j, NULL, NULL), TIDE_ERR_INVALID);
    cr_assert(strstr(tide_last_error(), "priority 101 is out of range"), "%s", tide_last_error());
    j.priority = -1;
    cr_assert_eq(tide_elastic_check(&j, NULL, NULL), TIDE_ERR_INVALID);
    j.priority = 5;
    j.min_gpus = 0;
    cr_assert_eq(tide_elastic_check(&j, NULL, NULL), TIDE_ERR_INVALID);
    /* 5-7 GPUs with replicas of tp 2 x pp 2 = 4: no multiple of 4 in range */
    j.tp = 2;
    j.pp = 2;
    j.min_gpus = 5;
    j.max_gpus = 7;
    cr_assert_eq(tide_elastic_check(&j, NULL, NULL), TIDE_ERR_INVALID);
    cr_assert(strstr(tide_last_error(), "no layout of 5-7 GPUs exists"), "%s", tide_last_error());
    /* 12 GPUs (dp 3) only, and the global batch of 16 splits into no 3 replicas */
    tide_fit_rule fit = {TIDE_DEGREE_DP_MICRO, 16, "the global batch"};
    j.fit = &fit;
    j.n_fit = 1;
    j.min_gpus = 9;
    j.max_gpus = 12;
    cr_assert_eq(tide_elastic_check(&j, NULL, NULL), TIDE_ERR_INVALID);
    cr_assert(strstr(tide_last_error(), "fits the program's rules") &&
                  strstr(tide_last_error(), "does not divide 16 (the global batch)"),
              "%s", tide_last_error());
    /* 4-16 GPUs: dp 1, 2, 4 fit; 3 does not */
    int lo = 0, hi = 0;
    j.min_gpus = 4;
    j.max_gpus = 16;
    cr_assert_eq(tide_elastic_check(&j, &lo, &hi), TIDE_OK, "%s", tide_last_error());
    cr_assert_eq(lo, 1);
    cr_assert_eq(hi, 4);
    /* a malformed rule is named */
    fit.n = 0;
    cr_assert_eq(tide_elastic_check(&j, NULL, NULL), TIDE_ERR_INVALID);
    cr_assert(strstr(tide_last_error(), "below 1"), "%s", tide_last_error());
}

Test(elastic, a_run_with_a_bad_job_decides_nothing)
{
    cluster c;
    cluster_init(&c, 2, 4);
    add_job(&c, 1, 5, 4, 8, 1, 1);
    size_t b = add_job(&c, 2, 5, 4, 8, 1, 1);
    set_layout(&c, 0, 4, range(0, 4));
    set_layout(&c, b, 4, range(2, 4)); /* GPUs 2 and 3 in both layouts */
    tide_elastic_cfg cfg = cfg_fast();
    tide_elastic_plan p = {0};
    cr_assert_eq(tide_elastic_decide(&cfg, c.job, c.nj, c.gpu, c.ng, 0, &p), TIDE_ERR_INVALID);
    cr_assert(strstr(tide_last_error(), "in the layouts of job 1 and job 2"), "%s",
              tide_last_error());
    cr_assert_eq(p.n, 0);
    set_layout(&c, b, 4, range(4, 4));
    c.job[b].priority = 500;
    cr_assert_eq(tide_elastic_decide(&cfg, c.job, c.nj, c.gpu, c.ng, 0, &p), TIDE_ERR_INVALID);
    cr_assert(strstr(tide_last_error(), "job 2: priority 500"), "%s", tide_last_error());
    cfg.scaling = 0;
    c.job[b].priority = 5;
    cr_assert_eq(tide_elastic_decide(&cfg, c.job, c.nj, c.gpu, c.ng, 0, &p), TIDE_ERR_INVALID);
    cr_assert_eq(p.n, 0);
    cluster_free(&c);
}

/* ---- the scenario, step by step --------------------------------------------------- */

Test(elastic, grows_on_join_shrinks_shares_and_grows_back)
{
    /* 3 hosts of 4; job A (bounds 4-12, priority 10) starts on host 0 */
    cluster c;
    cluster_init(&c, 3, 4);
    size_t a = add_job(&c, 1, 10, 4, 12, 1, 1);
    set_host(&c, 1, TIDE_EG_DOWN, 0);
    set_host(&c, 2, TIDE_EG_DOWN, 0);
    tide_elastic_cfg cfg = cfg_fast();
    tide_elastic_plan p = {0};
    decide(&c, &cfg, 0, &p);
    cr_assert_eq(p.n, 1);
    cr_assert_eq(p.d[0].rule, TIDE_ELASTIC_START);
    cr_assert_eq(p.d[0].new_dp, 4);
    apply(&c, &p, 0);

    /* host 1's pool joins: grows to 8 onto it */
    set_host(&c, 1, TIDE_EG_FREE, 1);
    decide(&c, &cfg, 100, &p);
    cr_assert_eq(p.n, 1);
    cr_assert_eq(p.d[0].rule, TIDE_ELASTIC_GROW);
    cr_assert_eq(p.d[0].new_dp, 8);
    cr_assert_eq(p.d[0].from_joining, 4);
    cr_assert_eq(p.d[0].n_gained, 4);
    cr_assert_eq(p.d[0].gained[0], 4);
    cr_assert(strstr(p.d[0].why, "grow dp 4 -> 8") && strstr(p.d[0].why, "4 on host 1") &&
                  strstr(p.d[0].why, "4 joining"),
              "%s", p.d[0].why);
    apply(&c, &p, 100);

    /* host 1 is lost: recovery (not the policy) shrinks A to its 4 survivors */
    set_host(&c, 1, TIDE_EG_DOWN, 0);
    decide(&c, &cfg, 200, &p);
    cr_assert_eq(p.n, 0, "a job with a member on a down GPU is recovery's");
    set_layout(&c, a, 4, range(0, 4));
    c.job[a].failed_from_dp = 8;
    decide(&c, &cfg, 201, &p);
    cr_assert_eq(p.n, 0);

    /* host 1 returns: re-grows at once (its last policy change was long ago) */
    set_host(&c, 1, TIDE_EG_FREE, 1);
    decide(&c, &cfg, 260, &p);
    cr_assert_eq(p.n, 1);
    cr_assert_eq(p.d[0].rule, TIDE_ELASTIC_REGROW);
    cr_assert_eq(p.d[0].new_dp, 8);
    apply(&c, &p, 260);
    c.job[a].failed_from_dp = 0;

    /* host 2 returns running offline work: A grows onto it, preempting the work */
    for (int g = 8; g < 12; g++)
        c.gpu[g] = (tide_elastic_gpu){2, TIDE_EG_OFFLINE, 3, 0};
    decide(&c, &cfg, 400, &p);
    cr_assert_eq(p.n, 1);
    cr_assert_eq(p.d[0].new_dp, 12);
    cr_assert_eq(p.d[0].from_offline, 4);
    cr_assert_eq(p.d[0].n_preempt, 4);
    apply(&c, &p, 400);

    /* B (4 GPUs, priority 50) arrives: A yields one host, B starts after it */
    size_t b = add_job(&c, 2, 50, 4, 4, 1, 1);
    decide(&c, &cfg, 500, &p);
    cr_assert_eq(p.n, 2);
    cr_assert_eq(p.d[0].rule, TIDE_ELASTIC_YIELD);
    cr_assert_eq(p.d[0].job, 1);
    cr_assert_eq(p.d[0].for_job, 2);
    cr_assert_eq(p.d[0].new_dp, 8);
    cr_assert_eq(p.d[1].rule, TIDE_ELASTIC_START);
    cr_assert_eq(p.d[1].job, 2);
    cr_assert_eq(p.d[1].waits, 1);
    cr_assert_eq(p.d[1].from_jobs, 4);
    cr_assert(strstr(p.d[0].why, "for job 2 (priority 50)"), "%s", p.d[0].why);
    apply(&c, &p, 500);

    /* B ends: A takes its GPUs back once its interval has passed */
    for (size_t i = 0; i < tide_layout_size(c.layout[b]); i++)
        c.gpu[c.layout[b]->worker[i]].state = TIDE_EG_FREE;
    tide_layout_destroy(&c.layout[b]);
    c.nj--;
    decide(&c, &cfg, 530, &p);
    cr_assert_eq(p.n, 0, "inside A's interval");
    decide(&c, &cfg, 560, &p);
    cr_assert_eq(p.n, 1);
    cr_assert_eq(p.d[0].new_dp, 12);
    apply(&c, &p, 560);
    cr_assert_eq(dp_of(&c, a), 12);
    tide_elastic_plan_clear(&p);
    cluster_free(&c);
}

Test(elastic, offline_work_yields_before_a_lower_priority_job)
{
    cluster c;
    cluster_init(&c, 4, 4);
    size_t lo = add_job(&c, 1, 10, 4, 16, 4, 1);
    size_t hi = add_job(&c, 2, 20, 4, 8, 4, 1);
    set_layout(&c, lo, 2, range(0, 8));
    set_layout(&c, hi, 1, range(8, 4));
    set_host(&c, 3, TIDE_EG_OFFLINE, 0);
    tide_elastic_cfg cfg = cfg_fast();
    tide_elastic_plan p = {0};
    decide(&c, &cfg, 1000, &p);
    cr_assert_eq(p.n, 1);
    cr_assert_eq(p.d[0].job, 2);
    cr_assert_eq(p.d[0].from_offline, 4);
    cr_assert_eq(p.d[0].from_jobs, 0);
    tide_elastic_plan_clear(&p);
    cluster_free(&c);
}

Test(elastic, never_below_the_lower_jobs_minimum)
{
    /* A holds 12 with minimum 8; B needs 8 to start: A can give 4 only, so nothing */
    cluster c;
    cluster_init(&c, 3, 4);
    size_t a = add_job(&c, 1, 10, 8, 12, 1, 1);
    set_layout(&c, a, 12, range(0, 12));
    add_job(&c, 2, 50, 8, 8, 1, 1);
    tide_elastic_cfg cfg = cfg_fast();
    tide_elastic_plan p = {0};
    decide(&c, &cfg, 1000, &p);
    cr_assert_eq(p.n, 0, "a yield that does not let B start is undone");
    /* B's minimum 4: A yields 4 and B starts on them */
    c.job[1].min_gpus = 4;
    decide(&c, &cfg, 1000, &p);
    cr_assert_eq(p.n, 2);
    cr_assert_eq(p.d[0].new_dp, 8);
    cr_assert_eq(p.d[1].new_dp, 4);
    /* equal priorities never take from each other */
    c.job[1].priority = 10;
    decide(&c, &cfg, 1000, &p);
    cr_assert_eq(p.n, 0);
    tide_elastic_plan_clear(&p);
    cluster_free(&c);
}

Test(elastic, pins_operator_resizes_and_reconfigurations_win)
{
    cluster c;
    cluster_init(&c, 4, 4);
    size_t a = add_job(&c, 1, 10, 4, 16, 1, 1);
    set_layout(&c, a, 8, range(0, 8));
    size_t b = add_job(&c, 2, 90, 4, 16, 1, 1);
    tide_elastic_cfg cfg = cfg_fast();
    tide_elastic_plan p = {0};
    int32_t *flag[3] = {&c.job[a].pinned, &c.job[a].operator_hold, &c.job[a].busy};
    for (int f = 0; f < 3; f++) {
        *flag[f] = 1;
        decide(&c, &cfg, 1000, &p);
        /* B starts on the free 8 only; A neither grows nor yields */
        cr_assert_eq(p.n, 1, "flag %d", f);
        cr_assert_eq(p.d[0].job, 2);
        cr_assert_eq(p.d[0].new_dp, 8);
        *flag[f] = 0;
    }
    /* unpinned: A yields down to its minimum so that B reaches 12 */
    decide(&c, &cfg, 1000, &p);
    cr_assert_eq(p.n, 2);
    cr_assert_eq(p.d[0].job, 1);
    cr_assert_eq(p.d[0].new_dp, 4);
    cr_assert_eq(p.d[1].new_dp, 12);
    (void)b;
    tide_elastic_plan_clear(&p);
    cluster_free(&c);
}

Test(elastic, bounds_lowered_shrink_and_a_grow_that_does_not_pay_is_not_made)
{
    cluster c;
    cluster_init(&c, 2, 8);
    size_t a = add_job(&c, 1, 10, 2, 16, 2, 1);
    set_layout(&c, a, 4, range(0, 8));
    c.job[a].max_gpus = 4;
    c.job[a].last_change_s = 999; /* a bounds change is the operator's: no interval */
    tide_elastic_cfg cfg = cfg_fast();
    tide_elastic_plan p = {0};
    decide(&c, &cfg, 1000, &p);
    cr_assert_eq(p.n, 1);
    cr_assert_eq(p.d[0].rule, TIDE_ELASTIC_BOUNDS);
    cr_assert_eq(p.d[0].new_dp, 2);
    cr_assert_eq(p.d[0].n_released, 4);
    apply(&c, &p, 1000);
    /* 3 steps of 1 s left: dp 2 -> 8 saves 2.2 s, less than 2 x (the switch's 2 s + a 1 GiB
       replica's shards over 25 GB/s) */
    c.job[a].max_gpus = 16;
    c.job[a].steps_left = 3;
    c.job[a].step_s = 1.0;
    decide(&c, &cfg, 2000, &p);
    cr_assert_eq(p.n, 0);
    c.job[a].steps_left = 100000;
    decide(&c, &cfg, 2000, &p);
    cr_assert_eq(p.n, 1);
    cr_assert_eq(p.d[0].new_dp, 8);
    cr_assert_gt(p.d[0].gain_s, 2 * p.d[0].downtime_s);
    cr_assert(strstr(p.d[0].why, "saved over 100000 steps"), "%s", p.d[0].why);
    tide_elastic_plan_clear(&p);
    cluster_free(&c);
}

Test(elastic, a_rate_limited_job_keeps_its_room_from_lower_priorities)
{
    cluster c;
    cluster_init(&c, 4, 4);
    size_t hi = add_job(&c, 1, 50, 4, 12, 4, 1);
    size_t lo = add_job(&c, 2, 10, 4, 12, 4, 1);
    set_layout(&c, hi, 1, range(0, 4));
    set_layout(&c, lo, 1, range(4, 4));
    c.job[hi].last_change_s = 990; /* changed 10 s ago, interval 60 s */
    tide_elastic_cfg cfg = cfg_fast();
    tide_elastic_plan p = {0};
    decide(&c, &cfg, 1000, &p);
    cr_assert_eq(p.n, 0, "the 8 free GPUs wait for the higher priority");
    decide(&c, &cfg, 1060, &p);
    cr_assert_eq(p.n, 1);
    cr_assert_eq(p.d[0].job, 1);
    cr_assert_eq(p.d[0].new_dp, 3);
    tide_elastic_plan_clear(&p);
    cluster_free(&c);
}

/* ---- randomised clusters ------------------------------------------------------------------- */

static uint64_t rs;

static uint32_t rnd(uint32_t n)
{
    rs ^= rs << 13;
    rs ^= rs >> 7;
    rs ^= rs << 17;
    return (uint32_t)(rs >> 33) % n;
}

/* Places job j at a random fitting dp on whole TP groups of up GPUs nobody holds; leaves
   it unstarted when they are too few. */
static void random_layout(cluster *c, size_t j)
{
    tide_elastic_job *jb = &c->job[j];
    int lo = 0, hi = 0;
    cr_assert_eq(tide_elastic_check(jb, &lo, &hi), TIDE_OK, "%s", tide_last_error());
    int dp = lo + (int)rnd((uint32_t)(hi - lo + 1));
    while (tide_fit_check(jb->fit, jb->n_fit, dp, jb->tp, jb->pp, jb->micro) != TIDE_OK)
        dp--;
    int32_t gpus[512];
    size_t n = 0, need = (size_t)dp * (size_t)jb->tp * (size_t)jb->pp;
    int hosts = (int)(c->ng / (size_t)c->per_host), h0 = (int)rnd((uint32_t)hosts);
    for (int hh = 0; hh < hosts && n < need; hh++) {
        int h = (h0 + hh) % hosts, run = 0;
        for (int g = h * c->per_host; g < (h + 1) * c->per_host && n < need; g++) {
            if (c->gpu[g].state == TIDE_EG_HELD || c->gpu[g].state == TIDE_EG_DOWN)
                continue;
            gpus[n++] = g;
            run = (run + 1) % jb->tp;
        }
        n -= (size_t)run; /* only whole TP groups on a host */
    }
    if (n == need && need <= 512)
        set_layout(c, j, dp, gpus);
}

/* A random cluster and jobs; `simple`: tp = pp = 1, minimum 1 GPU, no fit rules, no rate
   limits, pins or step counts, so that priorities can be checked exactly. */
static void random_cluster(cluster *c, int simple)
{
    int per = 1 << rnd(4), hosts = 2 + (int)rnd(11);
    cluster_init(c, hosts, per);
    for (size_t g = 0; g < c->ng; g++) {
        uint32_t x = rnd(10);
        c->gpu[g].state = x < 6 ? TIDE_EG_FREE : x < 8 ? TIDE_EG_OFFLINE : TIDE_EG_DOWN;
        c->gpu[g].offline_priority = (int32_t)rnd(10);
        c->gpu[g].joining = rnd(4) == 0;
    }
    size_t nj = 1 + rnd(6);
    for (size_t j = 0; j < nj; j++) {
        int tp = simple ? 1 : 1 << rnd(1 + (uint32_t)__builtin_ctz((unsigned)per));
        int pp = simple ? 1 : 1 + (int)rnd(2), g = tp * pp, lo = 1 + (int)rnd(3);
        int hi = lo + (int)rnd(4);
        add_job(c, 100 + (int64_t)j, 10 * (int)rnd(5), simple ? 1 : lo * g - (int)rnd((uint32_t)g),
                hi * g + (int)rnd((uint32_t)g), tp, pp);
        tide_elastic_job *jb = &c->job[j];
        if (!simple && rnd(3) == 0) {
            c->fit[j][0] = (tide_fit_rule){TIDE_DEGREE_DP_MICRO, rnd(2) ? 12 : 16, "batch"};
            jb->fit = c->fit[j];
            jb->n_fit = 1;
            if (tide_elastic_check(jb, NULL, NULL) != TIDE_OK)
                jb->n_fit = 0;
        }
        if (!simple) {
            jb->pinned = rnd(10) == 0;
            jb->operator_hold = rnd(20) == 0;
            jb->busy = rnd(20) == 0;
            jb->last_change_s = rnd(3) == 0 ? 1000.0 - rnd(120) : -1;
            jb->steps_left = rnd(2) ? 1 + rnd(100000) : 0;
            jb->step_s = 0.5;
        }
        if (rnd(10) < 7)
            random_layout(c, j);
        if (!simple && jb->layout != NULL && jb->layout->dp > 1 && rnd(10) == 0) {
            int32_t keep = jb->max_gpus; /* an operator lowered the maximum */
            jb->max_gpus = (jb->layout->dp - 1) * g;
            if (tide_elastic_check(jb, NULL, NULL) != TIDE_OK)
                jb->max_gpus = keep;
        }
    }
}

/* A TP group of l split over hosts: the number of such groups. */
static int groups_across(const cluster *c, const tide_layout_t *l)
{
    int bad = 0;
    for (size_t k = 0; k < tide_layout_size(l); k += (size_t)l->tp)
        for (int t = 1; t < l->tp; t++)
            if (c->gpu[l->worker[k + (size_t)t]].host != c->gpu[l->worker[k]].host) {
                bad++;
                break;
            }
    return bad;
}

/* One decision's own invariants. */
static void check_decision(const cluster *c, const tide_elastic_cfg *cfg,
                           const tide_elastic_plan *p, size_t i, double now)
{
    const tide_elastic_decision *d = &p->d[i];
    cr_assert_lt(d->index, c->nj);
    const tide_elastic_job *jb = &c->job[d->index];
    int lo = 0, hi = 0;
    cr_assert_eq(d->job, jb->id);
    cr_assert(!jb->pinned && !jb->operator_hold && !jb->busy, "job %lld is not the policy's: %s",
              (long long)d->job, d->why);
    cr_assert_eq(tide_elastic_check(jb, &lo, &hi), TIDE_OK);
    cr_assert_eq(tide_layout_validate(d->layout, NULL), TIDE_OK, "%s", tide_last_error());
    cr_assert(d->layout->tp == jb->tp && d->layout->pp == jb->pp);
    cr_assert_eq(tide_fit_check(jb->fit, jb->n_fit, d->new_dp, jb->tp, jb->pp, jb->micro), TIDE_OK);
    cr_assert(d->new_dp >= lo && d->new_dp <= hi, "dp %d outside %d-%d: %s", d->new_dp, lo, hi,
              d->why);
    cr_assert_eq(groups_across(c, d->layout), 0, "%s", d->why);
    /* a bounds change is the operator's; a job with nothing starts when it can */
    cr_assert(d->rule == TIDE_ELASTIC_BOUNDS || d->rule == TIDE_ELASTIC_START ||
                  jb->last_change_s < 0 || now - jb->last_change_s >= cfg->min_interval_s,
              "job %lld changed inside its interval: %s", (long long)d->job, d->why);
    cr_assert(strlen(d->why) > 10);
    const tide_elastic_decision *before = NULL; /* the job's previous decision in the run */
    for (size_t k = 0; k < i; k++)
        before = p->d[k].index == d->index ? &p->d[k] : before;
    cr_assert(before == NULL || (before->rule == TIDE_ELASTIC_YIELD &&
                                 d->rule == TIDE_ELASTIC_YIELD && before->new_dp == d->old_dp),
              "two decisions for one job, other than yields in a row");
    for (size_t k = 0; k < d->n_preempt; k++)
        cr_assert_eq(c->gpu[d->preempt[k]].state, TIDE_EG_OFFLINE); /* rank r is GPU r */
    if (d->rule == TIDE_ELASTIC_YIELD) {
        const tide_elastic_job *for_job = NULL;
        for (size_t k = 0; k < c->nj; k++)
            for_job = c->job[k].id == d->for_job ? &c->job[k] : for_job;
        cr_assert_not_null(for_job);
        cr_assert_gt(for_job->priority, jb->priority, "%s", d->why);
        cr_assert(d->new_dp < d->old_dp && d->n_gained == 0);
    } else if (d->rule == TIDE_ELASTIC_BOUNDS) {
        cr_assert(d->old_dp > hi && d->n_gained == 0);
    } else {
        cr_assert_gt(d->new_dp, d->old_dp);
        cr_assert_eq(d->rule == TIDE_ELASTIC_START, jb->layout == NULL);
        double down = d->downtime_s;
        for (size_t k = 0; k < i; k++)
            down += p->d[k].for_job == d->job
                        ? p->d[k].downtime_s * (double)tide_layout_size(p->d[k].layout) /
                              (double)tide_layout_size(d->layout)
                        : 0;
        cr_assert(jb->layout == NULL || d->gain_s < 0 || d->gain_s > cfg->gain_margin * down, "%s",
                  d->why);
    }
}

/* Every decision's invariants, and the cluster after all of them: no GPU twice, none down,
   what a job gains was free, ran offline work or was yielded to it. */
static void check_plan(const cluster *c, const tide_elastic_cfg *cfg, const tide_elastic_plan *p,
                       double now)
{
    int64_t *yielded_for = calloc(c->ng, sizeof *yielded_for);
    int *users = calloc(c->ng, sizeof *users);
    for (size_t i = 0; i < p->n; i++) {
        check_decision(c, cfg, p, i, now);
        const tide_elastic_decision *d = &p->d[i];
        for (size_t k = 0; k < d->n_released; k++)
            yielded_for[d->released[k]] = d->rule == TIDE_ELASTIC_YIELD ? d->for_job : -1;
        for (size_t k = 0; k < d->n_gained; k++) {
            int32_t g = d->gained[k];
            cr_assert(c->gpu[g].state == TIDE_EG_FREE || c->gpu[g].state == TIDE_EG_OFFLINE ||
                          (yielded_for[g] == d->job && d->waits),
                      "GPU %d (state %d) is not free for job %lld: %s", g, c->gpu[g].state,
                      (long long)d->job, d->why);
        }
    }
    for (size_t j = 0; j < c->nj; j++) {
        const tide_layout_t *l = c->job[j].layout;
        for (size_t i = 0; i < p->n; i++)
            l = p->d[i].index == j ? p->d[i].layout : l;
        for (size_t i = 0; l != NULL && i < tide_layout_size(l); i++)
            users[l->worker[i]]++;
    }
    for (size_t g = 0; g < c->ng; g++)
        cr_assert_leq(users[g], 1, "GPU %zu used by %d jobs", g, users[g]);
    free(yielded_for);
    free(users);
}

Test(elastic, random_clusters_keep_every_invariant)
{
    tide_elastic_cfg cfg = cfg_fast();
    size_t decisions = 0, yields = 0;
    for (uint64_t seed = 1; seed <= 400; seed++) {
        rs = seed * 0x9E3779B97F4A7C15ull;
        cluster c;
        random_cluster(&c, 0);
        tide_elastic_plan p = {0};
        cr_assert_eq(tide_elastic_decide(&cfg, c.job, c.nj, c.gpu, c.ng, 1000, &p), TIDE_OK,
                     "seed %llu: %s", (unsigned long long)seed, tide_last_error());
        check_plan(&c, &cfg, &p, 1000);
        decisions += p.n;
        for (size_t i = 0; i < p.n; i++)
            yields += p.d[i].rule == TIDE_ELASTIC_YIELD;
        tide_elastic_plan_clear(&p);
        cluster_free(&c);
    }
    cr_assert_gt(decisions, 200, "the clusters exercise the policy (%zu decisions)", decisions);
    cr_assert_gt(yields, 5, "and its yields (%zu)", yields);
}

Test(elastic, random_clusters_respect_priorities)
{
    tide_elastic_cfg cfg = cfg_fast();
    for (uint64_t seed = 1; seed <= 400; seed++) {
        rs = seed * 0xD1B54A32D192ED03ull;
        cluster c;
        random_cluster(&c, 1);
        tide_elastic_plan p = {0};
        cr_assert_eq(tide_elastic_decide(&cfg, c.job, c.nj, c.gpu, c.ng, 1000, &p), TIDE_OK);
        check_plan(&c, &cfg, &p, 1000);
        apply(&c, &p, 1000);
        size_t free_gpus = 0;
        for (size_t g = 0; g < c.ng; g++)
            free_gpus += c.gpu[g].state == TIDE_EG_FREE || c.gpu[g].state == TIDE_EG_OFFLINE;
        /* a job short of its maximum left no GPU free, and every lower priority at its
           minimum */
        for (size_t j = 0; j < c.nj; j++) {
            int hi = 0;
            tide_elastic_check(&c.job[j], NULL, &hi);
            if (dp_of(&c, j) >= hi)
                continue;
            cr_assert_eq(free_gpus, 0, "seed %llu: job %lld at dp %d < %d with %zu GPUs free",
                         (unsigned long long)seed, (long long)c.job[j].id, dp_of(&c, j), hi,
                         free_gpus);
            for (size_t k = 0; k < c.nj; k++)
                cr_assert(c.job[k].priority >= c.job[j].priority || dp_of(&c, k) <= 1,
                          "seed %llu: job %lld (priority %d) keeps dp %d while job %lld "
                          "(priority %d) is short",
                          (unsigned long long)seed, (long long)c.job[k].id, c.job[k].priority,
                          dp_of(&c, k), (long long)c.job[j].id, c.job[j].priority);
        }
        tide_elastic_plan_clear(&p);
        cluster_free(&c);
    }
}

/* Recovery as tided does it, not a policy change: replicas with a GPU down are dropped. */
static void recover(cluster *c, size_t j)
{
    tide_layout_t *l = c->layout[j];
    int keep[64], n = 0;
    for (int d = 0; d < l->dp; d++) {
        int ok = 1;
        for (int p = 0; p < l->pp; p++)
            for (int t = 0; t < l->tp; t++)
                ok &= c->gpu[l->worker[tide_layout_index(l, p, d, t)]].state != TIDE_EG_DOWN;
        if (ok)
            keep[n++] = d;
    }
    if (n == l->dp)
        return;
    for (size_t i = 0; i < tide_layout_size(l); i++)
        if (c->gpu[l->worker[i]].state != TIDE_EG_DOWN)
            c->gpu[l->worker[i]].state = TIDE_EG_FREE;
    c->job[j].failed_from_dp = l->dp > c->job[j].failed_from_dp ? l->dp : c->job[j].failed_from_dp;
    if (n == 0) {
        tide_layout_destroy(&c->layout[j]);
        c->job[j].layout = NULL;
        return;
    }
    int32_t gpus[512];
    for (int p = 0; p < l->pp; p++)
        for (int d = 0; d < n; d++)
            for (int t = 0; t < l->tp; t++)
                gpus[(p * n + d) * l->tp + t] = l->worker[tide_layout_index(l, p, keep[d], t)];
    tide_layout_t *old = c->layout[j];
    c->layout[j] = NULL;
    set_layout(c, j, n, gpus);
    tide_layout_destroy(&old);
}

Test(elastic, flapping_hosts_do_not_make_a_job_thrash)
{
    tide_elastic_cfg cfg = cfg_fast();
    cfg.min_interval_s = 600;
    size_t changes = 0, regrows = 0, yields = 0;
    for (uint64_t seed = 1; seed <= 6; seed++) {
        rs = seed * 0x2545F4914F6CDD1Dull;
        cluster c;
        cluster_init(&c, 8, 4);
        add_job(&c, 1, 50, 4, 16, 2, 1);
        add_job(&c, 2, 30, 2, 24, 1, 1);
        add_job(&c, 3, 10, 4, 32, 4, 1);
        double last[MAXJ];
        for (size_t j = 0; j < MAXJ; j++)
            last[j] = -1e9;
        tide_elastic_plan p = {0};
        for (double now = 0; now < 86400; now += 30) {
            for (int h = 0; h < 8; h++)
                if (rnd(100) < 3) {
                    int down = c.gpu[h * 4].state != TIDE_EG_DOWN;
                    for (int g = h * 4; g < h * 4 + 4; g++)
                        if (down || c.gpu[g].state == TIDE_EG_DOWN)
                            c.gpu[g].state = down ? TIDE_EG_DOWN : TIDE_EG_FREE;
                    for (int g = h * 4; g < h * 4 + 4; g++)
                        c.gpu[g].joining = !down;
                }
            for (size_t j = 0; j < c.nj; j++)
                if (c.layout[j] != NULL)
                    recover(&c, j);
            decide(&c, &cfg, now, &p);
            check_plan(&c, &cfg, &p, now);
            for (size_t i = 0; i < p.n; i++) {
                size_t j = p.d[i].index;
                if (last[j] == now && p.d[i].rule == TIDE_ELASTIC_YIELD)
                    continue; /* a second yield of the same run */
                cr_assert(p.d[i].rule == TIDE_ELASTIC_START || now - last[j] >= cfg.min_interval_s,
                          "job %zu changed at %.0f s and again at %.0f s: %s", j, last[j], now,
                          p.d[i].why);
                last[j] = now;
                regrows += p.d[i].rule == TIDE_ELASTIC_REGROW;
                yields += p.d[i].rule == TIDE_ELASTIC_YIELD;
                if (p.d[i].rule != TIDE_ELASTIC_YIELD && p.d[i].rule != TIDE_ELASTIC_BOUNDS)
                    c.job[j].failed_from_dp = 0;
            }
            changes += p.n;
            apply(&c, &p, now);
        }
        tide_elastic_plan_clear(&p);
        cluster_free(&c);
    }
    /* about 3 host changes a minute: far more than the jobs were changed */
    cr_assert_gt(changes, 20, "%zu changes", changes);
    cr_assert_lt(changes, 6 * 3 * 86400 / 600 + 6 * 3, "%zu changes", changes);
    cr_assert_gt(regrows, 0);
    cr_assert_gt(yields, 0);
}

Test(elastic, jobs_see_gpus_through_their_own_ranks)
{
    /* tided's view: each job's layout names its own ranks; a higher job's pool launched on
       host 2 reaches only that host's GPUs, which the lower job holds */
    cluster c;
    cluster_init(&c, 3, 4);
    size_t a = add_job(&c, 1, 10, 4, 12, 1, 1);
    size_t b = add_job(&c, 2, 50, 4, 4, 1, 1);
    static const int32_t a_gpu[12] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11};
    static const int32_t b_gpu[5] = {8, 9, 10, 11, -1}; /* rank 4 has no GPU */
    c.job[a].rank_gpu = a_gpu;
    c.job[a].n_ranks = 12;
    c.job[b].rank_gpu = b_gpu;
    c.job[b].n_ranks = 5;
    set_layout(&c, a, 12, range(0, 12));
    tide_elastic_cfg cfg = cfg_fast();
    tide_elastic_plan p = {0};
    decide(&c, &cfg, 1000, &p);
    cr_assert_eq(p.n, 2);
    cr_assert_eq(p.d[0].job, 1);
    cr_assert_eq(p.d[0].n_released, 4);
    for (size_t i = 0; i < 4; i++)
        cr_assert_eq(p.d[0].released[i], 8 + (int32_t)i, "A gives up host 2, what B reaches");
    cr_assert_eq(p.d[1].job, 2);
    int32_t ranks[4];
    memcpy(ranks, p.d[1].layout->worker, sizeof ranks);
    for (size_t i = 0; i < 4; i++) {
        cr_assert(ranks[i] >= 0 && ranks[i] < 4, "B's layout names B's ranks (%d)", ranks[i]);
        cr_assert_eq(p.d[1].gained[i], 8 + (int32_t)i);
    }
    /* a rank of a layout with no GPU is refused */
    set_layout(&c, b, 1, range(0, 1));
    c.layout[b]->worker[0] = 4;
    cr_assert_eq(tide_elastic_decide(&cfg, c.job, c.nj, c.gpu, c.ng, 1000, &p), TIDE_ERR_INVALID);
    cr_assert(strstr(tide_last_error(), "rank 4 of its layout has no GPU"), "%s",
              tide_last_error());
    tide_elastic_plan_clear(&p);
    cluster_free(&c);
}
