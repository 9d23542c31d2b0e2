/*
 * cluster_sim: a week of a 10,000-GPU cluster shared by online jobs of several
 * priorities and offline work, under failures, repairs and flapping hosts, run three
 * ways on the same trace; tide's way is decided by tided's real elastic policy
 * (tide_elastic_decide), recovery (tide_policy_recover) and reshard planner.
 *
 *   tide       elastic: jobs start at what their bounds and the free GPUs allow, grow
 *              onto idle GPUs (offline work yields), yield to higher priorities, re-grow
 *              after failures; a resize is down for the planner's estimate (busiest
 *              worker's bytes over --link-gbs, plus --switch-s); a failure is recovered
 *              from data-parallel replicas (down for the recovery plan's estimate, no
 *              step lost), from the last checkpoint only when no replica holds the state.
 *   restart    checkpoint-restart elasticity (torchrun --nnodes=MIN:MAX style): the same
 *              policy, but every change stops the job and relaunches it at the new size
 *              (--restart-s, which the policy also uses as its downtime estimate, and
 *              --restart-interval-s between a job's changes, so it changes less); a
 *              failure loses the work since the last checkpoint.
 *   static     fixed allocation: a job runs at its maximum or waits in a priority queue;
 *              a higher priority preempts whole lower jobs (requeued, work since their
 *              checkpoint lost); a failure loses that work and requeues the job.
 * All three fill GPUs no job holds with offline work (preempted: --offline-loss-s lost).
 *
 * Rates and their sources (flags; the defaults):
 *   --fail-per-gpu-h 1.97e-5: 419 unexpected interruptions in 54 days on 16,384 H100s
 *     during Llama 3 405B pre-training (Meta, "The Llama 3 Herd of Models", 2024, sec. 3.3.4);
 *     about one interruption every 5 hours at 10,000 GPUs. Meta's research clusters saw
 *     more (MTTF 7.9 h for 1,024-GPU jobs: Kokolis et al., "Revisiting Reliability in
 *     Large-Scale Machine Learning Research Clusters", HPCA 2025): --fail-per-gpu-h 1.24e-4.
 *   --host-share 0.41: the share of interruptions that take a whole host (Llama 3: 58.7%
 *     were GPU issues, faulty GPUs and HBM3 among them; the rest, network, host and
 *     software, are modelled as the host's).
 *   --repair-h 4, --flaky-hosts 4 (up --flap-up-min 60, down --flap-down-min 5), --restart-s
 *     600 (stop, relaunch, reload at scale), --ckpt-min 30: assumptions, not measurements
 *     (no report above gives repair times; link flaps are what MegaScale, NSDI 2024,
 *     describes as a common failure at 10,000 GPUs).
 * Model assumptions: GPUs fail independently (host events take the host's 8); a job's
 * speed grows with dp at --scaling of linear (so growing is not free); checkpoints are
 * asynchronous and cost nothing, every --ckpt-min of training; a first launch costs the
 * same in every way (not counted), a relaunch costs --restart-s; offline work arrives as
 * one-GPU chunks of 2 h on average, --offline-share of the cluster; every online job uses
 * tp 8 (a host's GPUs). Goodput = (useful training + offline work) GPU-hours / GPU-hours of
 * GPUs that were up; useful training counts a job's progress at its minimum size's rate
 * (what growing beyond it costs in scaling is reported apart).
 * Job classes (priority, bounds in GPUs, tp x pp, model, arrivals, work in GPU-hours at
 * their minimum): urgent 40, 512-1024, 8x2, 32x4096, every 12 h, 2000; research 30,
 * 128-512, 8x2, 40x5120, every 2 h, 2000; experiment 20, 16-64, 8x1, 24x2048, every 20 min,
 * 150; pretraining 10, 2048-4096, 8x4, 64x8192, two from the start, longer than the week.
 * Printed: the goodput table, decision time of tide's policy (p50/p99/max, wall and
 * CPU), written to --out (bench-out/cluster_sim.json).
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "benchmarks/bench_out.h"
#include "coordinator/elastic.h"
#include "coordinator/policy.h"
#include "core/alloc.h"
#include "core/clock.h"
#include "core/error.h"
#include "core/opts.h"
#include "reshard/reshard.h"

#define PROG     "cluster_sim"
#define N_CLASS  4
#define N_WAYS   3
#define WAY_TIDE 0
#define WAY_RST  1
#define WAY_STAT 2

typedef struct sim_cfg {
    long long hosts, gpus, days, tick_s, seed, flaky, pretrain_jobs;
    int expect_ahead;
    double fail_gpu_h, host_share, repair_h, flap_up_min, flap_down_min, restart_s, ckpt_min;
    double switch_s, link_gbs, scaling, interval_s, margin, policy_s, offline_share;
    double offline_loss_s, restart_interval_s;
    const char *out;
} sim_cfg;

typedef struct jclass {
    const char *name;
    int prio, min, max, tp, pp, layers;
    long long hidden;
    double every_h, work_h; /* mean hours between arrivals (0: --pretrain-jobs at start) */
} jclass;

static const jclass classes[N_CLASS] = {
    {"urgent", 40, 512, 1024, 8, 2, 32, 4096, 12.0, 2000},
    {"research", 30, 128, 512, 8, 2, 40, 5120, 2.0, 2000},
    {"experiment", 20, 16, 64, 8, 1, 24, 2048, 1.0 / 3.0, 150},
    {"pretraining", 10, 2048, 4096, 8, 4, 64, 8192, 0, 1e9},
};

enum { EV_GPU_DOWN, EV_GPU_UP, EV_HOST_DOWN, EV_HOST_UP, EV_ARRIVE, EV_OFFLINE };

typedef struct event {
    double t;
    int kind;
    int32_t who;  /* GPU or host; class for arrivals */
    double value; /* work (GPU-s) of an arrival or an offline chunk */
} event;

typedef struct sjob {
    int cls;
    int64_t id;
    double work;        /* GPU-seconds of progress left, at the minimum size's rate */
    double since_ckpt;  /* seconds trained since its last checkpoint */
    double down_until;  /* no progress before (a switch, recovery or relaunch) */
    double last_change; /* its last policy change, -1 none */
    int failed_from;    /* dp before failures shrank it, 0 none */
    int reload;         /* 1: its next start relaunches from a checkpoint */
    int done, ran;
    int hit;          /* a GPU of it went down this tick */
    tide_layout_t *l; /* elastic ways: layout over GPU ids; NULL when stopped */
    int32_t host0;    /* static: first of its hosts when running, else -1 */
    int32_t *hosts;   /* static: the hosts it holds (owned) */
    int n_hosts;
} sjob;

/* GPU-seconds by what they did. */
typedef struct ledger {
    double useful, scaling, down, lost, offline, offline_lost, idle, avail;
    long changes, recoveries, restarts, preemptions;
    long by_rule[5];     /* elastic ways: decisions by tide_elastic_rule */
    double down_rule[5]; /* GPU-seconds of downtime they cost */
    int done[N_CLASS];
} ledger;

typedef struct way {
    int kind;
    sjob *jobs;
    size_t nj, cap;
    tide_elastic_gpu *g; /* host, state (FREE, OFFLINE, HELD, DOWN), joining */
    int32_t *holder;     /* job index holding the GPU, -1 */
    double *chunk;       /* offline work left on the GPU (s) */
    double *queue;       /* offline chunks waiting (s each) */
    size_t nq, capq;
    ledger lg;
    double next_policy;
    int dirty; /* a job ended or stopped: decide at the next tick */
} way;

typedef struct sim {
    sim_cfg c;
    size_t n; /* GPUs */
    tide_collection_t *coll[N_CLASS];
    event *ev;
    size_t n_ev, cap_ev;
    int32_t *down;  /* per GPU: down events in force */
    uint8_t *alive; /* per GPU, for recovery plans */
    way w[N_WAYS];
    double *dec_ms, *dec_cpu; /* tide's policy runs */
    size_t n_dec, cap_dec;
    tide_elastic_cfg pcfg[2]; /* tide's and restart's policy settings */
} sim;

static uint64_t rng;

static double uniform(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (double)(rng >> 11) / (double)(1ull << 53);
}

static double exp_draw(double mean)
{
    return -mean * log(1.0 - uniform());
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static int cmp_event(const void *a, const void *b)
{
    const event *x = a, *y = b;
    if (x->t != y->t)
        return x->t < y->t ? -1 : 1;
    return (x->kind > y->kind) - (x->kind < y->kind);
}

static uint64_t cpu_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Grows *p (n used of *cap, elem bytes each) for one more; exits on out of memory (a
   benchmark with nowhere to go). */
static void *grow_array(void *p, size_t n, size_t *cap, size_t elem)
{
    if (n < *cap)
        return p;
    *cap = *cap ? 2 * *cap : 64;
    void *q = tide_realloc(p, *cap * elem);
    if (q == NULL) {
        fprintf(stderr, PROG ": out of memory\n");
        exit(1);
    }
    return q;
}

static void add_event(sim *s, double t, int kind, int32_t who, double value)
{
    if (t >= (double)s->c.days * 86400.0)
        return;
    s->ev = grow_array(s->ev, s->n_ev, &s->cap_ev, sizeof *s->ev);
    s->ev[s->n_ev++] = (event){t, kind, who, value};
}

/* The week's trace, the same for every way: failures and repairs, flapping hosts, job
   arrivals and offline chunks. */
static void make_trace(sim *s)
{
    const sim_cfg *c = &s->c;
    double end = (double)c->days * 86400.0;
    double rate = c->fail_gpu_h * (double)s->n / 3600.0; /* interruptions per second */
    for (double t = exp_draw(1.0 / rate); t < end; t += exp_draw(1.0 / rate)) {
        int32_t g = (int32_t)(uniform() * (double)s->n);
        double back = t + exp_draw(c->repair_h * 3600.0);
        int host = uniform() < c->host_share;
        add_event(s, t, host ? EV_HOST_DOWN : EV_GPU_DOWN, host ? g / (int32_t)c->gpus : g, 0);
        add_event(s, back, host ? EV_HOST_UP : EV_GPU_UP, host ? g / (int32_t)c->gpus : g, 0);
    }
    for (long long f = 0; f < c->flaky; f++) {
        int32_t h = (int32_t)(uniform() * (double)c->hosts);
        for (double t = exp_draw(c->flap_up_min * 60.0); t < end;) {
            double back = t + exp_draw(c->flap_down_min * 60.0);
            add_event(s, t, EV_HOST_DOWN, h, 0);
            add_event(s, back, EV_HOST_UP, h, 0);
            t = back + exp_draw(c->flap_up_min * 60.0);
        }
    }
    for (int k = 0; k < N_CLASS; k++) {
        const jclass *jc = &classes[k];
        if (jc->every_h <= 0) {
            for (long long i = 0; i < c->pretrain_jobs; i++)
                add_event(s, 0, EV_ARRIVE, k, jc->work_h * 3600.0);
            continue;
        }
        for (double t = exp_draw(jc->every_h * 3600.0); t < end;
             t += exp_draw(jc->every_h * 3600.0))
            add_event(s, t, EV_ARRIVE, k, exp_draw(jc->work_h * 3600.0));
    }
    double chunk = 2 * 3600.0, every = chunk / (c->offline_share * (double)s->n);
    for (double t = 0; c->offline_share > 0 && t < end; t += exp_draw(every))
        add_event(s, t, EV_OFFLINE, 0, exp_draw(chunk));
    qsort(s->ev, s->n_ev, sizeof *s->ev, cmp_event);
}

/* ---- offline work ---------------------------------------------------------------------------- */

static void queue_chunk(way *w, double left)
{
    w->queue = grow_array(w->queue, w->nq, &w->capq, sizeof *w->queue);
    w->queue[w->nq++] = left;
}

/* GPU g stops its offline chunk: what it did since the chunk's last save is lost (at most
   --offline-loss-s) and the rest waits again. */
static void stop_chunk(const sim *s, way *w, int32_t g)
{
    if (w->g[g].state != TIDE_EG_OFFLINE)
        return;
    double loss = s->c.offline_loss_s;
    w->lg.offline -= loss;
    w->lg.offline_lost += loss;
    queue_chunk(w, w->chunk[g] + loss);
    w->chunk[g] = 0;
    w->g[g].state = TIDE_EG_FREE;
    w->lg.preemptions++;
}

/* Free GPUs take waiting chunks (the oldest last in the queue first: a stack is as good a
   model of "some offline job" as a queue, and cheaper). */
static void fill_offline(const sim *s, way *w)
{
    for (size_t g = 0; g < s->n && w->nq > 0; g++)
        if (w->g[g].state == TIDE_EG_FREE) {
            w->chunk[g] = w->queue[--w->nq];
            w->g[g].state = TIDE_EG_OFFLINE;
        }
}

/* ---- jobs ------------------------------------------------------------------------------------ */

static int job_gpus(const sjob *j)
{
    if (j->l != NULL)
        return (int)tide_layout_size(j->l);
    return j->host0 >= 0 ? classes[j->cls].max : 0;
}

/* Progress per second at n GPUs, in GPU-seconds at the class's minimum size's rate: each
   GPU beyond the minimum gives --scaling of one. */
static double job_rate(const sim *s, const sjob *j, int n)
{
    double lo = classes[j->cls].min;
    return n <= lo ? n : lo + ((double)n - lo) * s->c.scaling;
}

/* Lost work since the job's last checkpoint: taken back from what it was credited. */
static void lose_since_ckpt(const sim *s, way *w, sjob *j)
{
    double lost = j->since_ckpt * job_rate(s, j, job_gpus(j));
    w->lg.useful -= lost;
    w->lg.lost += lost;
    j->work += lost;
    j->since_ckpt = 0;
    j->reload = 1;
}

/* Marks GPU g held by job index k, preempting offline work on it. */
static void take_gpu(const sim *s, way *w, int32_t g, size_t k)
{
    stop_chunk(s, w, g);
    w->g[g].state = TIDE_EG_HELD;
    w->holder[g] = (int32_t)k;
}

static void free_gpu(way *w, int32_t g)
{
    if (w->g[g].state == TIDE_EG_HELD)
        w->g[g].state = TIDE_EG_FREE;
    w->holder[g] = -1;
}

/* The job stops (failure without replicas, restart way's change, static preemption): its
   GPUs free, its work since the checkpoint lost when `lose`. */
static void stop_job(const sim *s, way *w, size_t k, int lose)
{
    sjob *j = &w->jobs[k];
    if (lose)
        lose_since_ckpt(s, w, j);
    for (size_t i = 0; j->l != NULL && i < tide_layout_size(j->l); i++)
        free_gpu(w, j->l->worker[i]);
    for (int h = 0; h < j->n_hosts; h++)
        for (long long x = 0; x < s->c.gpus; x++)
            free_gpu(w, (int32_t)(j->hosts[h] * s->c.gpus + x));
    tide_layout_destroy(&j->l);
    j->host0 = -1;
    j->n_hosts = 0;
    w->lg.restarts += lose;
}

/* One tick of every running job: progress, downtime, checkpoints, completion. */
static void run_jobs(const sim *s, way *w, double now, double tick)
{
    double ckpt = s->c.ckpt_min * 60.0;
    for (size_t k = 0; k < w->nj; k++) {
        sjob *j = &w->jobs[k];
        int n = job_gpus(j);
        if (j->done || n == 0)
            continue;
        double down = fmin(tick, fmax(0.0, j->down_until - now)), up = tick - down;
        double prog = job_rate(s, j, n) * up;
        w->lg.down += n * down;
        w->lg.useful += prog;
        w->lg.scaling += n * up - prog;
        j->work -= prog;
        j->since_ckpt += up;
        if (j->since_ckpt >= ckpt)
            j->since_ckpt -= ckpt;
        if (j->work <= 0) {
            w->lg.useful += j->work; /* the part of the tick after it finished */
            w->lg.idle -= j->work;
            j->done = 1;
            w->dirty = 1;
            w->lg.done[j->cls]++;
            stop_job(s, w, k, 0);
        }
    }
}

/* Offline work and idle GPUs over one tick, and the GPU time available. */
static void run_gpus(const sim *s, way *w, double tick)
{
    for (size_t g = 0; g < s->n; g++) {
        int st = w->g[g].state;
        if (st == TIDE_EG_DOWN)
            continue;
        w->lg.avail += tick;
        if (st == TIDE_EG_FREE)
            w->lg.idle += tick;
        if (st != TIDE_EG_OFFLINE)
            continue;
        double did = fmin(tick, w->chunk[g]);
        w->lg.offline += did;
        w->lg.idle += tick - did;
        w->chunk[g] -= did;
        if (w->chunk[g] <= 0)
            w->g[g].state = TIDE_EG_FREE;
    }
}

/* ---- failures -------------------------------------------------------------------------------- */

/*
 * tide's recovery of job k, some of whose GPUs went down (tided's tide_policy_recover over
 * the surviving members, free GPUs and offline work): down for the recovery plan's
 * estimate; from the last checkpoint (relaunch) when no replica holds the lost state or
 * no layout fits.
 */
static void recover_tide(sim *s, way *w, size_t k, double now)
{
    sjob *j = &w->jobs[k];
    const jclass *jc = &classes[j->cls];
    tide_policy_worker *cand = tide_malloc(s->n * sizeof *cand);
    int32_t *pre = tide_malloc(s->n * sizeof *pre);
    size_t n = 0, n_pre = 0;
    for (size_t g = 0; g < s->n; g++) {
        int st = w->g[g].state, member = w->holder[g] == (int32_t)k && st != TIDE_EG_DOWN;
        if (member || st == TIDE_EG_FREE || st == TIDE_EG_OFFLINE)
            cand[n++] = (tide_policy_worker){(int32_t)g, w->g[g].host,
                                             member               ? TIDE_PW_MEMBER
                                             : st == TIDE_EG_FREE ? TIDE_PW_IDLE
                                                                  : TIDE_PW_OFFLINE,
                                             0};
        s->alive[g] = st != TIDE_EG_DOWN;
    }
    tide_layout_t *nl = NULL;
    tide_plan_totals t;
    int ok = tide_policy_recover(j->l, s->coll[j->cls], NULL, 0, cand, n, &nl, pre, &n_pre, NULL,
                                 0) == TIDE_OK &&
             tide_reshard_plan_totals(j->l, nl, s->coll[j->cls], s->alive, s->n, &t) == TIDE_OK;
    tide_free(cand);
    tide_free(pre);
    w->lg.recoveries++;
    if (!ok || nl->dp * jc->tp * jc->pp < jc->min) {
        tide_layout_destroy(&nl);
        stop_job(s, w, k, 1); /* the policy starts it again, from its checkpoint */
        return;
    }
    if (nl->dp < j->l->dp)
        j->failed_from = j->failed_from > j->l->dp ? j->failed_from : j->l->dp;
    for (size_t i = 0; i < tide_layout_size(j->l); i++)
        free_gpu(w, j->l->worker[i]);
    for (size_t i = 0; i < tide_layout_size(nl); i++)
        take_gpu(s, w, nl->worker[i], k);
    tide_layout_destroy(&j->l);
    j->l = nl;
    uint64_t busiest = t.max_send > t.max_recv ? t.max_send : t.max_recv;
    j->down_until = now + s->c.switch_s + (double)busiest / (s->c.link_gbs * 1e9);
}

/* GPU g of way w went down: its offline work stops, its job is hit (handled once per
   tick, after every event of the tick: a host takes 8 GPUs at once). */
static void gpu_down(sim *s, way *w, int32_t g)
{
    int32_t k = w->holder[g];
    stop_chunk(s, w, g);
    w->g[g].state = TIDE_EG_DOWN;
    w->g[g].joining = 0;
    if (k >= 0)
        w->jobs[k].hit = 1;
}

/* Jobs hit this tick: tide recovers them, the other ways stop them. */
static void handle_hits(sim *s, way *w, double now)
{
    for (size_t k = 0; k < w->nj; k++) {
        if (!w->jobs[k].hit)
            continue;
        w->jobs[k].hit = 0;
        w->dirty = 1;
        if (w->kind == WAY_TIDE)
            recover_tide(s, w, k, now);
        else
            stop_job(s, w, k, 1);
    }
}

static void gpu_up(way *w, int32_t g)
{
    w->g[g].state = TIDE_EG_FREE;
    w->g[g].joining = 1;
    w->holder[g] = -1;
}

/* ---- the elastic ways: tided's policy ----------------------------------------------------- */

/* The policy's view of job j of way w at now. */
static tide_elastic_job policy_job(const sim *s, const way *w, const sjob *j, double now)
{
    const jclass *jc = &classes[j->cls];
    int n = job_gpus(j);
    double rate = n > 0 ? job_rate(s, j, n) : 1.0;
    return (tide_elastic_job){.id = j->id,
                              .priority = jc->prio,
                              .min_gpus = jc->min,
                              .max_gpus = jc->max,
                              .tp = jc->tp,
                              .pp = jc->pp,
                              .micro = 1,
                              .num_layers = jc->layers,
                              .layout = j->l,
                              .coll = w->kind == WAY_TIDE ? s->coll[j->cls] : NULL,
                              .steps_left = (int64_t)(j->work / rate) + 1, /* 1 s steps */
                              .step_s = 1.0,
                              .last_change_s = j->last_change,
                              .failed_from_dp = j->failed_from,
                              .busy = j->down_until > now};
}

/* Applies decision d of way w at now: GPUs move, the job is down for the estimate (tide)
   or a relaunch (restart). */
static void apply_decision(const sim *s, way *w, const tide_elastic_decision *d,
                           const size_t *job_of, double now)
{
    size_t k = job_of[d->index];
    sjob *j = &w->jobs[k];
    for (size_t i = 0; i < d->n_released; i++)
        free_gpu(w, d->released[i]);
    for (size_t i = 0; i < d->n_gained; i++)
        take_gpu(s, w, d->gained[i], k);
    tide_layout_destroy(&j->l);
    if (tide_layout_copy(&j->l, d->layout) != TIDE_OK) {
        fprintf(stderr, PROG ": out of memory\n");
        exit(1);
    }
    double down = w->kind == WAY_TIDE ? d->downtime_s : s->c.restart_s;
    if (d->rule == TIDE_ELASTIC_START)
        down = j->reload ? s->c.restart_s : 0; /* a first launch costs the same everywhere */
    j->down_until = now + down;
    w->lg.by_rule[d->rule]++;
    w->lg.down_rule[d->rule] += down * (double)tide_layout_size(d->layout);
    j->reload = 0;
    j->last_change = now;
    if (d->rule == TIDE_ELASTIC_GROW || d->rule == TIDE_ELASTIC_REGROW)
        j->failed_from = d->new_dp >= j->failed_from ? 0 : j->failed_from;
    w->lg.changes++;
}

/* One run of the policy for an elastic way; tide's runs are timed. */
static void run_policy(sim *s, way *w, double now)
{
    tide_elastic_job *jobs = tide_malloc((w->nj ? w->nj : 1) * sizeof *jobs);
    size_t *job_of = tide_malloc((w->nj ? w->nj : 1) * sizeof *job_of), n = 0;
    if (jobs == NULL || job_of == NULL) {
        fprintf(stderr, PROG ": out of memory\n");
        exit(1);
    }
    for (size_t k = 0; k < w->nj; k++)
        if (!w->jobs[k].done) {
            job_of[n] = k;
            jobs[n++] = policy_job(s, w, &w->jobs[k], now);
        }
    tide_elastic_plan plan = {0};
    uint64_t t0 = tide_now_ns(), c0 = cpu_ns();
    tide_status rc = tide_elastic_decide(&s->pcfg[w->kind], jobs, n, w->g, s->n, now, &plan);
    if (w->kind == WAY_TIDE) {
        size_t cap = s->cap_dec;
        s->dec_ms = grow_array(s->dec_ms, s->n_dec, &s->cap_dec, sizeof *s->dec_ms);
        s->dec_cpu = grow_array(s->dec_cpu, s->n_dec, &cap, sizeof *s->dec_cpu);
        s->dec_ms[s->n_dec] = (double)(tide_now_ns() - t0) / 1e6;
        s->dec_cpu[s->n_dec++] = (double)(cpu_ns() - c0) / 1e6;
    }
    if (rc != TIDE_OK) {
        fprintf(stderr, PROG ": the policy refused: %s\n", tide_last_error());
        exit(1);
    }
    for (size_t i = 0; i < plan.n; i++)
        apply_decision(s, w, &plan.d[i], job_of, now);
    for (size_t g = 0; g < s->n; g++)
        w->g[g].joining = 0;
    tide_elastic_plan_clear(&plan);
    tide_free(jobs);
    tide_free(job_of);
}

/* ---- the static way ------------------------------------------------------------------------ */

/* A host nobody holds, all of whose GPUs are up. */
static int host_free(const sim *s, const way *w, long long h)
{
    for (long long x = 0; x < s->c.gpus; x++)
        if (w->g[h * s->c.gpus + x].state == TIDE_EG_DOWN || w->holder[h * s->c.gpus + x] >= 0)
            return 0;
    return 1;
}

/* Starts job k on hosts h[0..n). */
static void start_static(const sim *s, way *w, size_t k, const int32_t *h, int n, double now)
{
    sjob *j = &w->jobs[k];
    j->hosts = tide_realloc(j->hosts, (size_t)n * sizeof *j->hosts);
    if (j->hosts == NULL) {
        fprintf(stderr, PROG ": out of memory\n");
        exit(1);
    }
    memcpy(j->hosts, h, (size_t)n * sizeof *h);
    j->n_hosts = n;
    j->host0 = h[0];
    for (int i = 0; i < n; i++)
        for (long long x = 0; x < s->c.gpus; x++)
            take_gpu(s, w, (int32_t)(h[i] * s->c.gpus + x), k);
    j->down_until = now + (j->reload ? s->c.restart_s : 0);
    j->reload = 0;
    w->lg.changes++;
}

static int free_hosts(const sim *s, const way *w, int32_t *out)
{
    int n = 0;
    for (long long h = 0; h < s->c.hosts; h++)
        if (host_free(s, w, h))
            out[n++] = (int32_t)h;
    return n;
}

/* Hosts that running jobs of priority below prio hold. */
static int lower_hosts(const way *w, int prio)
{
    int n = 0;
    for (size_t v = 0; v < w->nj; v++)
        if (!w->jobs[v].done && w->jobs[v].host0 >= 0 && classes[w->jobs[v].cls].prio < prio)
            n += w->jobs[v].n_hosts;
    return n;
}

/* Waiting jobs by priority, then arrival; each starts at its maximum on free hosts, or by
   preempting whole lower-priority jobs (the lowest priority, then the youngest first) when
   that is enough; else it waits and lower jobs that fit may start. */
static void schedule_static(const sim *s, way *w, double now)
{
    int32_t *free_h = tide_malloc((size_t)s->c.hosts * sizeof *free_h);
    if (free_h == NULL)
        return;
    int have = free_hosts(s, w, free_h);
    for (int prio = 100; prio >= 0; prio--)
        for (size_t k = 0; k < w->nj; k++) {
            sjob *j = &w->jobs[k];
            if (j->done || j->host0 >= 0 || classes[j->cls].prio != prio)
                continue;
            int need = (int)(classes[j->cls].max / s->c.gpus);
            if (have + lower_hosts(w, prio) < need)
                continue;
            for (int p = 0; p < prio && have < need; p++)
                for (size_t v = w->nj; v-- > 0 && have < need;)
                    if (!w->jobs[v].done && w->jobs[v].host0 >= 0 &&
                        classes[w->jobs[v].cls].prio == p) {
                        stop_job(s, w, v, 1);
                        have = free_hosts(s, w, free_h);
                    }
            if (have < need)
                continue;
            start_static(s, w, k, free_h, need, now);
            have = free_hosts(s, w, free_h);
        }
    tide_free(free_h);
}

/* ---- the week -------------------------------------------------------------------------------- */

static void arrive(sim *s, int cls, double work, int64_t id)
{
    for (int k = 0; k < N_WAYS; k++) {
        way *w = &s->w[k];
        w->jobs = grow_array(w->jobs, w->nj, &w->cap, sizeof *w->jobs);
        w->jobs[w->nj++] =
            (sjob){.cls = cls, .id = id, .work = work, .last_change = -1, .host0 = -1};
    }
}

/* The events of [now, now + tick): every way sees the same GPUs go and come back. */
static int apply_events(sim *s, size_t *next, double now, double tick, int64_t *next_id)
{
    int changed = 0;
    for (; *next < s->n_ev && s->ev[*next].t < now + tick; (*next)++) {
        const event *e = &s->ev[*next];
        if (e->kind == EV_ARRIVE) {
            arrive(s, e->who, e->value, (*next_id)++);
            changed = 1;
            continue;
        }
        if (e->kind == EV_OFFLINE) {
            for (int k = 0; k < N_WAYS; k++)
                queue_chunk(&s->w[k], e->value);
            continue;
        }
        int down = e->kind == EV_GPU_DOWN || e->kind == EV_HOST_DOWN;
        int host = e->kind == EV_HOST_DOWN || e->kind == EV_HOST_UP;
        int32_t first = host ? e->who * (int32_t)s->c.gpus : e->who;
        int32_t count = host ? (int32_t)s->c.gpus : 1;
        for (int32_t g = first; g < first + count; g++) {
            s->down[g] += down ? 1 : -1;
            if (s->down[g] != (down ? 1 : 0))
                continue; /* already down, or still down for another reason */
            for (int k = 0; k < N_WAYS; k++) {
                if (down)
                    gpu_down(s, &s->w[k], g);
                else
                    gpu_up(&s->w[k], g);
            }
            changed = 1;
        }
    }
    return changed;
}

static void simulate(sim *s)
{
    double tick = (double)s->c.tick_s, end = (double)s->c.days * 86400.0;
    size_t next = 0;
    int64_t id = 1;
    for (double now = 0; now < end; now += tick) {
        int changed = apply_events(s, &next, now, tick, &id);
        for (int k = 0; k < N_WAYS; k++) {
            way *w = &s->w[k];
            handle_hits(s, w, now);
            if (changed || w->dirty || now >= w->next_policy) {
                w->dirty = 0;
                if (w->kind == WAY_STAT)
                    schedule_static(s, w, now);
                else
                    run_policy(s, w, now);
                w->next_policy = now + s->c.policy_s;
            }
            fill_offline(s, w);
            run_jobs(s, w, now, tick);
            run_gpus(s, w, tick);
        }
    }
}

/* ---- results --------------------------------------------------------------------------------- */

static const char *const way_names[N_WAYS] = {"tide", "restart", "static"};

static double goodput(const ledger *l)
{
    return l->avail > 0 ? (l->useful + l->offline) / l->avail : 0;
}

static double pct(double *v, size_t n, double q)
{
    return n ? v[(size_t)((double)(n - 1) * q)] : 0;
}

static void report(sim *s, double wall_s)
{
    const sim_cfg *c = &s->c;
    double h = 3600.0;
    printf(PROG ": %zu GPUs (%lld hosts x %lld), %lld days, seed %lld; interruptions %.3g per "
                "GPU-hour (%.0f%% whole hosts), repair %.1f h, %lld flapping hosts; restart %.0f "
                "s, checkpoint every %.0f min, link %.0f GB/s, switch %.1f s\n\n",
           s->n, c->hosts, c->gpus, c->days, c->seed, c->fail_gpu_h, 100 * c->host_share,
           c->repair_h, c->flaky, c->restart_s, c->ckpt_min, c->link_gbs, c->switch_s);
    printf("%-8s %8s %9s %10s %9s %9s %8s %9s %9s %9s %8s %s\n", "way", "changes", "restarts",
           "useful GPU-h", "offline", "down", "lost", "scaling", "idle", "avail", "goodput",
           "jobs done (urgent/research/exp/pretrain)");
    for (int k = 0; k < N_WAYS; k++) {
        const ledger *l = &s->w[k].lg;
        printf("%-8s %8ld %9ld %10.0f %9.0f %9.0f %8.0f %9.0f %9.0f %9.0f %7.1f%% %d/%d/%d/%d\n",
               way_names[k], l->changes, l->restarts, l->useful / h, l->offline / h, l->down / h,
               (l->lost + l->offline_lost) / h, l->scaling / h, l->idle / h, l->avail / h,
               100 * goodput(l), l->done[0], l->done[1], l->done[2], l->done[3]);
    }
    qsort(s->dec_ms, s->n_dec, sizeof *s->dec_ms, cmp_double);
    qsort(s->dec_cpu, s->n_dec, sizeof *s->dec_cpu, cmp_double);
    for (int k = 0; k < 2; k++) {
        const ledger *l = &s->w[k].lg;
        printf("%s decisions: ", way_names[k]);
        for (int r = 0; r < 5; r++)
            printf("%s%ld %s (%.0f GPU-h down)", r ? ", " : "", l->by_rule[r],
                   tide_elastic_rule_name(r), l->down_rule[r] / h);
        printf("\n");
    }
    double p50 = pct(s->dec_ms, s->n_dec, 0.5), p99 = pct(s->dec_ms, s->n_dec, 0.99);
    double mx = pct(s->dec_ms, s->n_dec, 1.0), c99 = pct(s->dec_cpu, s->n_dec, 0.99);
    printf("\ngoodput = (useful training + offline work) / GPU-hours of up GPUs; tide / restart "
           "%.3f, tide / static %.3f. tide's policy: %zu runs at %zu GPUs, p50 %.1f ms, p99 "
           "%.1f ms, max %.1f ms (CPU p50 %.1f ms, p99 %.1f ms); %ld recoveries; wall %.1f s\n",
           goodput(&s->w[0].lg) / fmax(goodput(&s->w[1].lg), 1e-9),
           goodput(&s->w[0].lg) / fmax(goodput(&s->w[2].lg), 1e-9), s->n_dec, s->n, p50, p99, mx,
           pct(s->dec_cpu, s->n_dec, 0.5), c99, s->w[0].lg.recoveries, wall_s);
    FILE *f = bench_out_open(PROG, c->out);
    if (f == NULL)
        return;
    fprintf(f,
            "{\"bench\":\"cluster_sim\",\"gpus\":%zu,\"days\":%lld,\"seed\":%lld,"
            "\"fail_per_gpu_h\":%g,\"host_share\":%g,\"repair_h\":%g,\"flaky_hosts\":%lld,"
            "\"restart_s\":%g,\"ckpt_min\":%g,\"ways\":{",
            s->n, c->days, c->seed, c->fail_gpu_h, c->host_share, c->repair_h, c->flaky,
            c->restart_s, c->ckpt_min);
    for (int k = 0; k < N_WAYS; k++) {
        const ledger *l = &s->w[k].lg;
        fprintf(f,
                "%s\"%s\":{\"changes\":%ld,\"restarts\":%ld,\"useful_gpu_h\":%.1f,"
                "\"offline_gpu_h\":%.1f,\"down_gpu_h\":%.1f,\"lost_gpu_h\":%.1f,"
                "\"scaling_gpu_h\":%.1f,\"idle_gpu_h\":%.1f,\"avail_gpu_h\":%.1f,"
                "\"goodput\":%.4f,\"jobs_done\":[%d,%d,%d,%d]}",
                k ? "," : "", way_names[k], l->changes, l->restarts, l->useful / h, l->offline / h,
                l->down / h, (l->lost + l->offline_lost) / h, l->scaling / h, l->idle / h,
                l->avail / h, goodput(l), l->done[0], l->done[1], l->done[2], l->done[3]);
    }
    fprintf(f,
            "},\"policy_runs\":%zu,\"decision_ms_p50\":%.3f,\"decision_ms_p99\":%.3f,"
            "\"decision_ms_max\":%.3f,\"decision_cpu_ms_p99\":%.3f,\"wall_s\":%.1f}\n",
            s->n_dec, p50, p99, mx, c99, wall_s);
    fclose(f);
    printf("wrote %s\n", c->out);
}

/* ---- setup ----------------------------------------------------------------------------------- */

static int parse(sim_cfg *c, int argc, char **argv)
{
    tide_opt opts[] = {
        {"hosts", NULL, TIDE_OPT_INT, &c->hosts, "1250", "hosts", 8, 1 << 16},
        {"gpus-per-host", NULL, TIDE_OPT_INT, &c->gpus, "8", "GPUs per host (jobs use tp 8)", 8, 8},
        {"days", NULL, TIDE_OPT_INT, &c->days, "7", "simulated days", 1, 365},
        {"tick-s", NULL, TIDE_OPT_INT, &c->tick_s, "60", "time step (s)", 1, 3600},
        {"seed", NULL, TIDE_OPT_INT, &c->seed, "42", "random seed", 0, 1ll << 62},
        {"pretrain-jobs", NULL, TIDE_OPT_INT, &c->pretrain_jobs, "2",
         "pre-training jobs running from the start", 0, 64},
        {"fail-per-gpu-h", NULL, TIDE_OPT_DOUBLE, &c->fail_gpu_h, "1.973e-5",
         "interruptions per GPU-hour (Llama 3: 419 in 54 days on 16,384 GPUs)", 0, 0},
        {"host-share", NULL, TIDE_OPT_DOUBLE, &c->host_share, "0.41",
         "share of interruptions taking a whole host (Llama 3: 58.7% were GPU issues)", 0, 0},
        {"repair-h", NULL, TIDE_OPT_DOUBLE, &c->repair_h, "4", "mean repair time (h; assumed)", 0,
         0},
        {"flaky-hosts", NULL, TIDE_OPT_INT, &c->flaky, "4", "hosts whose link flaps", 0, 1 << 16},
        {"flap-up-min", NULL, TIDE_OPT_DOUBLE, &c->flap_up_min, "60",
         "flapping host: mean minutes up", 0, 0},
        {"flap-down-min", NULL, TIDE_OPT_DOUBLE, &c->flap_down_min, "5",
         "flapping host: mean minutes down", 0, 0},
        {"restart-s", NULL, TIDE_OPT_DOUBLE, &c->restart_s, "600",
         "stop, relaunch and reload a job (s; assumed)", 0, 0},
        {"ckpt-min", NULL, TIDE_OPT_DOUBLE, &c->ckpt_min, "30", "minutes between checkpoints", 0,
         0},
        {"switch-s", NULL, TIDE_OPT_DOUBLE, &c->switch_s, "2", "tide: fixed cost of a switch (s)",
         0, 0},
        {"link-gbs", NULL, TIDE_OPT_DOUBLE, &c->link_gbs, "25",
         "tide: per-GPU reshard bandwidth (GB/s)", 0, 0},
        {"scaling", NULL, TIDE_OPT_DOUBLE, &c->scaling, "0.9",
         "share of linear speed-up a GPU beyond a job's minimum gives", 0, 0},
        {"interval-s", NULL, TIDE_OPT_DOUBLE, &c->interval_s, "300",
         "policy: least time between a job's changes (s)", 0, 0},
        {"restart-interval-s", NULL, TIDE_OPT_DOUBLE, &c->restart_interval_s, "3600",
         "restart way: least time between a job's changes (s): a relaunch costs minutes", 0, 0},
        {"margin", NULL, TIDE_OPT_DOUBLE, &c->margin, "2",
         "policy: a grow saves more than margin x its downtime", 0, 0},
        {"policy-s", NULL, TIDE_OPT_DOUBLE, &c->policy_s, "300",
         "run the policy at least this often (s)", 0, 0},
        {"offline-share", NULL, TIDE_OPT_DOUBLE, &c->offline_share, "0.05",
         "offline work arriving, as a share of the cluster", 0, 0},
        {"offline-loss-s", NULL, TIDE_OPT_DOUBLE, &c->offline_loss_s, "300",
         "offline work lost per preemption (s)", 0, 0},
        {"expect-ahead", NULL, TIDE_OPT_BOOL, &c->expect_ahead, "0",
         "exit 3 unless tide's goodput is above both others' (for the test suite)", 0, 0},
        {"out", NULL, TIDE_OPT_STRING, &c->out, "bench-out/cluster_sim.json", "results file", 0, 0},
        {NULL, NULL, 0, NULL, NULL, NULL, 0, 0},
    };
    int code = tide_opts_main(opts, argc, argv, PROG);
    if (code >= 0)
        return code;
    if (!(c->fail_gpu_h >= 0) || !(c->host_share >= 0 && c->host_share <= 1) ||
        !(c->repair_h > 0) || !(c->flap_up_min > 0) || !(c->flap_down_min > 0) ||
        !(c->restart_s >= 0) || !(c->ckpt_min > 0) || !(c->switch_s >= 0) || !(c->link_gbs > 0) ||
        !(c->scaling > 0 && c->scaling <= 1) || !(c->interval_s >= 0) || !(c->margin >= 0) ||
        !(c->restart_interval_s >= 0) || !(c->policy_s > 0) || !(c->offline_share >= 0) ||
        !(c->offline_loss_s >= 0)) {
        fprintf(stderr, PROG ": a rate, time or share is out of range (see --help)\n");
        return 2;
    }
    return -1;
}

static int setup(sim *s)
{
    s->n = (size_t)(s->c.hosts * s->c.gpus);
    for (int k = 0; k < N_CLASS; k++) {
        const jclass *jc = &classes[k];
        tide_model_spec spec = {.layers = jc->layers,
                                .hidden = jc->hidden,
                                .ffn = 4 * jc->hidden,
                                .heads = jc->hidden / 128,
                                .attention = 1,
                                .adam = 1,
                                .dtype = TIDE_BF16};
        if (tide_collection_build_gpt(&s->coll[k], &spec) != TIDE_OK) {
            fprintf(stderr, PROG ": model: %s\n", tide_last_error());
            return 1;
        }
    }
    s->down = tide_calloc(s->n, sizeof *s->down);
    s->alive = tide_calloc(s->n, 1);
    if (s->down == NULL || s->alive == NULL)
        return 1;
    for (int k = 0; k < N_WAYS; k++) {
        way *w = &s->w[k];
        w->kind = k;
        w->g = tide_calloc(s->n, sizeof *w->g);
        w->holder = tide_malloc(s->n * sizeof *w->holder);
        w->chunk = tide_calloc(s->n, sizeof *w->chunk);
        if (w->g == NULL || w->holder == NULL || w->chunk == NULL)
            return 1;
        for (size_t g = 0; g < s->n; g++) {
            w->g[g] = (tide_elastic_gpu){(int32_t)(g / (size_t)s->c.gpus), TIDE_EG_FREE, 0, 0};
            w->holder[g] = -1;
        }
    }
    tide_elastic_cfg p = tide_elastic_cfg_default();
    p.min_interval_s = s->c.interval_s;
    p.gain_margin = s->c.margin;
    p.switch_s = s->c.switch_s;
    p.link_bytes_per_s = s->c.link_gbs * 1e9;
    p.scaling = s->c.scaling;
    s->pcfg[WAY_TIDE] = p;
    p.switch_s = s->c.restart_s; /* a change is a relaunch; nothing moves over the links */
    p.link_bytes_per_s = 1e18;
    p.min_interval_s = s->c.restart_interval_s;
    s->pcfg[WAY_RST] = p;
    rng = (uint64_t)s->c.seed * 0x9E3779B97F4A7C15ull + 1;
    make_trace(s);
    return 0;
}

static void teardown(sim *s)
{
    for (int k = 0; k < N_CLASS; k++)
        tide_collection_destroy(&s->coll[k]);
    for (int k = 0; k < N_WAYS; k++) {
        way *w = &s->w[k];
        for (size_t i = 0; i < w->nj; i++) {
            tide_layout_destroy(&w->jobs[i].l);
            tide_free(w->jobs[i].hosts);
        }
        tide_free(w->jobs);
        tide_free(w->g);
        tide_free(w->holder);
        tide_free(w->chunk);
        tide_free(w->queue);
    }
    tide_free(s->ev);
    tide_free(s->down);
    tide_free(s->alive);
    tide_free(s->dec_ms);
    tide_free(s->dec_cpu);
}

int main(int argc, char **argv)
{
    static sim s;
    int code = parse(&s.c, argc, argv);
    if (code >= 0)
        return code;
    tide_alloc_retain(256u << 20); /* as tided does: decisions reuse the heap */
    uint64_t t0 = tide_now_ns();
    if (setup(&s) != 0) {
        fprintf(stderr, PROG ": out of memory\n");
        teardown(&s);
        return 1;
    }
    simulate(&s);
    report(&s, (double)(tide_now_ns() - t0) / 1e9);
    double tide = goodput(&s.w[WAY_TIDE].lg);
    int ahead = tide > goodput(&s.w[WAY_RST].lg) && tide > goodput(&s.w[WAY_STAT].lg);
    teardown(&s);
    if (s.c.expect_ahead && !ahead) {
        fprintf(stderr, PROG ": tide's goodput is not above both others'\n");
        return 3;
    }
    return 0;
}
