/*
 * cluster_sim: a GPU cluster whose capacity keeps changing, simulated over days, with
 * tided's real policy code making every decision, against the stop-checkpoint-restart
 * way that leaves GPUs outside the job idle.
 *
 * The cluster: --hosts x --gpus-per-host workers. Hosts go away (maintenance, reclaim)
 * at random, each for --outage-h hours, about once per --host-mtbf-h; single GPUs fail
 * about once per --gpu-mtbf-h and come back after --repair-h. One online job (a GPT
 * model of --layers x --hidden with Adam, tp --tp, pp --pp) always runs at the largest
 * dp the live workers hold (at most --max-dp); offline work waits for any idle GPU.
 * Time advances in --tick-s steps; whenever the live set changes:
 *   tide      tide_policy_recover (a member died: its coordinates refilled from
 *             replicas) or tide_policy_place (grow / shrink), then tide_reshard_plan on
 *             the real collection; the job is down for the largest per-worker send at
 *             --link-gbs plus --switch-s; every live GPU outside the job runs offline
 *             work (preempted when the job grows: --grace-s lost);
 *   restart   the job stops and restarts at the new dp: down for --restart-s; GPUs
 *             outside the job stay idle.
 * Printed: GPU-hours of training, of downtime, of offline work and idle, the share of
 * live GPU time doing useful work, bytes resharded with tided's placement against the
 * plain rank order, and the wall time of each decision (policy + plan). The time model
 * (link speed, restart and switch costs, failure rates) is a parameter, printed with the
 * results; the decisions and byte counts are the real code's. Numbers go to --out
 * (bench-out/cluster_sim.json).
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "benchmarks/bench_out.h"
#include "coordinator/policy.h"
#include "core/alloc.h"
#include "core/clock.h"
#include "core/error.h"
#include "core/opts.h"
#include "reshard/reshard.h"

#define PROG "cluster_sim"

typedef struct sim_cfg {
    long long hosts, gpus, layers, hidden, tp, pp, max_dp, seed, days, tick_s;
    double host_mtbf_h, outage_h, gpu_mtbf_h, repair_h, link_gbs, switch_s, restart_s, grace_s;
    const char *out;
} sim_cfg;

/* GPU-seconds by what they did. */
typedef struct ledger {
    double train, down, offline, idle;
    int changes;
} ledger;

static uint64_t rng_state;
static double last_cpu_ms; /* CPU time of the last decision: what load on the machine hides */

static uint64_t cpu_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static double uniform(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (double)(rng_state >> 11) / (double)(1ull << 53);
}

static double exp_draw(double mean_s)
{
    return -mean_s * log(1.0 - uniform());
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* The dp the live set holds: at most --max-dp, every TP group inside one live host. */
static int live_dp(const sim_cfg *c, const uint8_t *alive, int n_alive)
{
    int per = (int)(c->tp * c->pp);
    int dp = n_alive / per < c->max_dp ? n_alive / per : (int)c->max_dp;
    long slots = 0;
    for (long long h = 0; h < c->hosts; h++) {
        int up = 0;
        for (long long g = 0; g < c->gpus; g++)
            up += alive[h * c->gpus + g];
        slots += up / c->tp;
    }
    return slots / c->pp < dp ? (int)(slots / c->pp) : dp;
}

/* TP groups of l whose workers are on more than one host (worker w is on host w / gpus). */
static int groups_across_hosts(const sim_cfg *c, const tide_layout_t *l)
{
    int bad = 0;
    for (size_t k = 0; l != NULL && k < tide_layout_size(l); k += (size_t)l->tp)
        for (int t = 1; t < l->tp; t++)
            if (l->worker[k + (size_t)t] / c->gpus != l->worker[k] / c->gpus) {
                bad++;
                break;
            }
    return bad;
}

/* The job's next layout for the live set (tide's way): recovery when members died,
   else a placement at the largest dp that fits. NULL (job stopped) when not even dp 1
   fits. *bytes / *max_send from the real plan; *ms the decision's wall time. */
static tide_layout_t *decide(const sim_cfg *c, const tide_collection_t *coll,
                             const tide_layout_t *old, const uint8_t *alive, int n_alive, int plain,
                             uint64_t *bytes, uint64_t *max_send, double *ms)
{
    int n = (int)(c->hosts * c->gpus);
    int per = (int)(c->tp * c->pp);
    int dp = n_alive / per < c->max_dp ? n_alive / per : (int)c->max_dp;
    *bytes = *max_send = 0;
    *ms = 0;
    if (dp < 1)
        return NULL;
    uint64_t t0 = tide_now_ns(), c0 = cpu_ns();
    tide_policy_worker *cand = tide_malloc((size_t)n * sizeof *cand);
    int32_t *pre = tide_malloc((size_t)n * sizeof *pre);
    uint8_t *in_old = tide_calloc((size_t)n, 1);
    size_t k = 0, n_pre = 0;
    int lost = 0;
    for (size_t i = 0; old != NULL && i < tide_layout_size(old); i++)
        in_old[old->worker[i]] = 1;
    for (int w = 0; w < n; w++) {
        int member = in_old[w];
        lost += member && !alive[w];
        if (alive[w])
            cand[k++] = (tide_policy_worker){w, (int32_t)(w / c->gpus),
                                             member ? TIDE_PW_MEMBER : TIDE_PW_OFFLINE, 0};
    }
    /* TP groups inside hosts: the largest dp whose groups the live hosts hold */
    dp = tide_policy_tp_fit_dp(cand, k, (int)c->tp, (int)c->pp, dp);
    if (dp < 1) {
        tide_free(cand);
        tide_free(pre);
        tide_free(in_old);
        return NULL;
    }
    tide_error_clear();
    tide_layout_t *l = NULL;
    tide_status rc;
    if (old != NULL && lost && !plain && old->dp <= dp) {
        rc = tide_policy_recover(old, coll, NULL, 0, cand, k, &l, pre, &n_pre, NULL, 0);
    } else {
        tide_resize_req req = {dp,   (int)c->tp, (int)c->pp, (int)c->layers, 1,
                               NULL, plain,      0,          NULL,           0};
        rc = tide_policy_place(old, coll, &req, cand, k, &l, pre, &n_pre);
    }
    if (rc == TIDE_OK && old != NULL && l != NULL) {
        tide_plan_totals t; /* what tided computes: the totals, not the items */
        if (tide_reshard_plan_totals(old, l, coll, alive, (size_t)n, &t) == TIDE_OK) {
            *bytes = t.bytes_sent;
            *max_send = t.max_send;
        } else {
            /* state lost with no replica: a restart from a checkpoint (counted by caller) */
            *bytes = UINT64_MAX;
        }
    }
    *ms = (double)(tide_now_ns() - t0) / 1e6;
    last_cpu_ms = (double)(cpu_ns() - c0) / 1e6;
    tide_free(cand);
    tide_free(pre);
    tide_free(in_old);
    if (rc != TIDE_OK) {
        fprintf(stderr, PROG ": policy refused dp %d: %s\n", dp, tide_last_error());
        return NULL;
    }
    return l;
}

int main(int argc, char **argv)
{
    sim_cfg c;
    memset(&c, 0, sizeof c);
    tide_opt opts[] = {
        {"hosts", NULL, TIDE_OPT_INT, &c.hosts, "1250", "hosts", 1, 4096},
        {"gpus-per-host", NULL, TIDE_OPT_INT, &c.gpus, "8", "GPUs per host", 1, 64},
        {"layers", NULL, TIDE_OPT_INT, &c.layers, "32", "model: transformer blocks", 1, 1024},
        {"hidden", NULL, TIDE_OPT_INT, &c.hidden, "4096", "model: width", 64, 1 << 16},
        {"tp", NULL, TIDE_OPT_INT, &c.tp, "8", "tensor-parallel degree", 1, 64},
        {"pp", NULL, TIDE_OPT_INT, &c.pp, "4", "pipeline stages", 1, 256},
        {"max-dp", NULL, TIDE_OPT_INT, &c.max_dp, "0", "largest dp the job takes (0: hosts / 4)", 0,
         4096},
        {"days", NULL, TIDE_OPT_INT, &c.days, "7", "simulated days", 1, 365},
        {"tick-s", NULL, TIDE_OPT_INT, &c.tick_s, "60", "time step (s)", 1, 3600},
        {"host-mtbf-h", NULL, TIDE_OPT_DOUBLE, &c.host_mtbf_h, "48",
         "mean hours between a host's outages", 0, 0},
        {"outage-h", NULL, TIDE_OPT_DOUBLE, &c.outage_h, "2", "mean length of an outage (h)", 0, 0},
        {"gpu-mtbf-h", NULL, TIDE_OPT_DOUBLE, &c.gpu_mtbf_h, "5000",
         "mean hours between a GPU's failures", 0, 0},
        {"repair-h", NULL, TIDE_OPT_DOUBLE, &c.repair_h, "4", "mean repair time (h)", 0, 0},
        {"link-gbs", NULL, TIDE_OPT_DOUBLE, &c.link_gbs, "25",
         "tide: per-GPU reshard bandwidth (GB/s)", 0, 0},
        {"switch-s", NULL, TIDE_OPT_DOUBLE, &c.switch_s, "2",
         "tide: fixed cost of a switch (agreement, communicators) (s)", 0, 0},
        {"restart-s", NULL, TIDE_OPT_DOUBLE, &c.restart_s, "600",
         "restart: stop, checkpoint, relaunch, reload (s)", 0, 0},
        {"grace-s", NULL, TIDE_OPT_DOUBLE, &c.grace_s, "10",
         "tide: offline work lost per preemption (s)", 0, 0},
        {"seed", NULL, TIDE_OPT_INT, &c.seed, "42", "random seed", 0, 1ll << 62},
        {"out", NULL, TIDE_OPT_STRING, &c.out, "bench-out/cluster_sim.json", "results file", 0, 0},
        {NULL, NULL, 0, NULL, NULL, NULL, 0, 0},
    };
    int code = tide_opts_main(opts, argc, argv, PROG);
    if (code >= 0)
        return code;
    if (c.host_mtbf_h <= 0 || c.outage_h <= 0 || c.gpu_mtbf_h <= 0 || c.repair_h <= 0 ||
        c.link_gbs <= 0 || c.switch_s < 0 || c.restart_s < 0 || c.grace_s < 0) {
        fprintf(stderr, PROG ": rates, times and bandwidth must be positive\n");
        return 2;
    }
    if (c.max_dp == 0)
        c.max_dp = c.hosts / 4 > 0 ? c.hosts / 4 : 1;
    int n = (int)(c.hosts * c.gpus);
    tide_alloc_retain(256u << 20); /* as tided does: decisions reuse the heap */
    uint64_t wall0 = tide_now_ns();
    tide_model_spec spec = {.layers = (int)c.layers,
                            .hidden = c.hidden,
                            .ffn = 4 * c.hidden,
                            .heads = c.hidden / 128 > 0 ? c.hidden / 128 : 1,
                            .vocab = 0,
                            .attention = 1,
                            .adam = 1,
                            .zero1 = 0,
                            .dtype = TIDE_BF16};
    tide_collection_t *coll = NULL;
    if (tide_collection_build_gpt(&coll, &spec) != TIDE_OK) {
        fprintf(stderr, PROG ": model: %s\n", tide_last_error());
        return 2;
    }
    rng_state = (uint64_t)c.seed * 0x9E3779B97F4A7C15ull + 1;
    uint8_t *alive = tide_calloc((size_t)n, 1);
    double *host_back = tide_calloc((size_t)c.hosts, sizeof *host_back);
    double *gpu_back = tide_calloc((size_t)n, sizeof *gpu_back);
    double *decide_ms = tide_calloc(100000, sizeof *decide_ms);
    double *decide_cpu = tide_calloc(100000, sizeof *decide_cpu);
    if (!alive || !host_back || !gpu_back || !decide_ms || !decide_cpu) {
        fprintf(stderr, PROG ": out of memory\n");
        return 1;
    }
    int n_decisions = 0;
    const double tick = (double)c.tick_s, end = (double)c.days * 86400.0;
    const double p_host = tick / (c.host_mtbf_h * 3600.0), p_gpu = tick / (c.gpu_mtbf_h * 3600.0);
    ledger tide = {0}, rst = {0};
    tide_layout_t *job = NULL; /* tide's layout */
    int rst_size = 0;          /* the restart way's job size (workers) */
    double tide_down_until = 0, rst_down_until = 0;
    double bytes_tide = 0, bytes_plain = 0, lost_restarts = 0;
    int prev_alive = -1;
    long across = 0; /* TP groups placed across hosts, over every decision */
    for (double now = 0; now < end; now += tick) {
        int changed = 0;
        for (int h = 0; h < c.hosts; h++) {
            if (host_back[h] > now)
                continue;
            if (uniform() < p_host) {
                host_back[h] = now + exp_draw(c.outage_h * 3600.0);
                changed = 1;
            }
        }
        int n_alive = 0;
        for (int w = 0; w < n; w++) {
            if (gpu_back[w] <= now && uniform() < p_gpu) {
                gpu_back[w] = now + exp_draw(c.repair_h * 3600.0);
                changed = 1;
            }
            uint8_t a = host_back[w / c.gpus] <= now && gpu_back[w] <= now;
            changed |= a != alive[w];
            alive[w] = a;
            n_alive += a;
        }
        if (changed || prev_alive < 0) {
            /* tide: one decision on the real policy, its plan priced by the time model */
            uint64_t b = 0, mx = 0, bp = 0, mxp = 0;
            double ms = 0, msp = 0;
            int per = (int)(c.tp * c.pp);
            int want = live_dp(&c, alive, n_alive);
            int members_dead = 0;
            if (job != NULL)
                for (size_t i = 0; i < tide_layout_size(job); i++)
                    members_dead += !alive[job->worker[i]];
            if (job == NULL || members_dead > 0 || want != job->dp) {
                /* restart: the same change (a member lost, or a new size) means stop,
                   checkpoint, relaunch and reload at the new size */
                rst_size = want * per;
                rst_down_until = now + c.restart_s;
                rst.changes++;
                tide_layout_t *l = decide(&c, coll, job, alive, n_alive, 0, &b, &mx, &ms);
                across += groups_across_hosts(&c, l);
                tide_layout_t *lp = decide(&c, coll, job, alive, n_alive, 1, &bp, &mxp, &msp);
                tide_layout_destroy(&lp);
                if (n_decisions < 100000)
                    decide_cpu[n_decisions] = last_cpu_ms, decide_ms[n_decisions++] = ms;
                double cost = c.switch_s;
                if (b == UINT64_MAX) {
                    cost = c.restart_s; /* no replica: back to the last checkpoint */
                    lost_restarts++;
                } else if (job != NULL) {
                    cost += (double)mx / (c.link_gbs * 1e9);
                    bytes_tide += (double)b;
                    bytes_plain += bp == UINT64_MAX ? 0 : (double)bp;
                }
                int grows = job != NULL && l != NULL && tide_layout_size(l) > tide_layout_size(job);
                tide.offline -=
                    grows ? c.grace_s * (double)(tide_layout_size(l) - tide_layout_size(job)) : 0;
                tide_layout_destroy(&job);
                job = l;
                tide_down_until = now + cost;
                tide.changes++;
            }
            prev_alive = n_alive;
        }
        /* the tick's GPU time, each way */
        int jsize = job ? (int)tide_layout_size(job) : 0;
        double down = fmin(tick, fmax(0.0, tide_down_until - now));
        tide.train += (double)jsize * (tick - down);
        tide.down += (double)jsize * down;
        tide.offline += (double)(n_alive - jsize) * tick;
        double rdown = fmin(tick, fmax(0.0, rst_down_until - now));
        rst.train += (double)rst_size * (tick - rdown);
        rst.down += (double)rst_size * rdown;
        rst.idle += (double)(n_alive - rst_size) * tick;
    }
    double live = tide.train + tide.down + tide.offline + tide.idle;
    qsort(decide_ms, (size_t)n_decisions, sizeof *decide_ms, cmp_double);
    double p50 = n_decisions ? decide_ms[n_decisions / 2] : 0;
    double pmax = n_decisions ? decide_ms[n_decisions - 1] : 0;
    double p99 = n_decisions ? decide_ms[(size_t)((double)(n_decisions - 1) * 0.99)] : 0;
    qsort(decide_cpu, (size_t)n_decisions, sizeof *decide_cpu, cmp_double);
    double cpu50 = n_decisions ? decide_cpu[n_decisions / 2] : 0;
    double cpu99 = n_decisions ? decide_cpu[(size_t)((double)(n_decisions - 1) * 0.99)] : 0;
    double wall_s = (double)(tide_now_ns() - wall0) / 1e9;
    double h = 3600.0;
    printf(PROG ": %d GPUs (%lld hosts x %lld), %lld days; GPT %lld layers x %lld, tp %lld, pp "
                "%lld; host outages every %.0f h for %.1f h, GPU failures every %.0f h; link %.0f "
                "GB/s, switch %.1f s, restart %.0f s\n\n",
           n, c.hosts, c.gpus, c.days, c.layers, c.hidden, c.tp, c.pp, c.host_mtbf_h, c.outage_h,
           c.gpu_mtbf_h, c.link_gbs, c.switch_s, c.restart_s);
    printf("%-10s %8s %12s %12s %12s %12s %10s\n", "way", "changes", "train GPU-h", "down GPU-h",
           "offline GPU-h", "idle GPU-h", "useful");
    printf("%-10s %8d %12.0f %12.0f %12.0f %12.0f %9.1f%%\n", "tide", tide.changes, tide.train / h,
           tide.down / h, tide.offline / h, tide.idle / h,
           100.0 * (tide.train + tide.offline) / live);
    printf("%-10s %8d %12.0f %12.0f %12s %12.0f %9.1f%%\n", "restart", rst.changes, rst.train / h,
           rst.down / h, "-", rst.idle / h, 100.0 * rst.train / live);
    printf("\ntraining GPU-hours tide / restart = %.3f; resharded %.1f TB with tided's placement, "
           "%.1f TB with the rank order (%.1fx); %d decisions: policy + plan p50 %.1f ms, p99 "
           "%.1f ms, max %.1f ms (CPU time p50 %.1f ms, p99 %.1f ms); %.0f recoveries needed a "
           "checkpoint; %ld TP groups placed "
           "across hosts; wall %.1f s\n",
           rst.train > 0 ? tide.train / rst.train : 0, bytes_tide / 1e12, bytes_plain / 1e12,
           bytes_tide > 0 ? bytes_plain / bytes_tide : 0, n_decisions, p50, p99, pmax, cpu50, cpu99,
           lost_restarts, across, wall_s);
    FILE *f = bench_out_open("cluster_sim", c.out);
    if (f != NULL) {
        fprintf(f,
                "{\"bench\":\"cluster_sim\",\"gpus\":%d,\"days\":%lld,\"seed\":%lld,"
                "\"tide\":{\"changes\":%d,\"train_gpu_h\":%.1f,\"down_gpu_h\":%.1f,"
                "\"offline_gpu_h\":%.1f,\"idle_gpu_h\":%.1f},"
                "\"restart\":{\"changes\":%d,\"train_gpu_h\":%.1f,\"down_gpu_h\":%.1f,"
                "\"idle_gpu_h\":%.1f},\"bytes_tide\":%.0f,\"bytes_rank_order\":%.0f,"
                "\"decisions\":%d,\"decision_ms_p50\":%.3f,\"decision_ms_p99\":%.3f,"
                "\"decision_ms_max\":%.3f,\"decision_cpu_ms_p50\":%.3f,"
                "\"decision_cpu_ms_p99\":%.3f,\"tp_groups_across_hosts\":%ld,\"wall_s\":%.1f,"
                "\"link_gbs\":%.1f,"
                "\"switch_s\":%.1f,\"restart_s\":%.1f}\n",
                n, c.days, c.seed, tide.changes, tide.train / h, tide.down / h, tide.offline / h,
                tide.idle / h, rst.changes, rst.train / h, rst.down / h, rst.idle / h, bytes_tide,
                bytes_plain, n_decisions, p50, p99, pmax, cpu50, cpu99, across, wall_s, c.link_gbs,
                c.switch_s, c.restart_s);
        fclose(f);
        printf("wrote %s\n", c.out);
    }
    tide_layout_destroy(&job);
    tide_collection_destroy(&coll);
    tide_free(alive);
    tide_free(host_back);
    tide_free(gpu_back);
    tide_free(decide_ms);
    tide_free(decide_cpu);
    return 0;
}
