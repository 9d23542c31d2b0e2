/*
 * plan_bench: reshard planner scale. Plans a 175B-parameter GPT (96 layers,
 * hidden 12288, Adam state) between large layouts on one core and prints, per
 * pair: planning time (goal < 50 ms for (dp16,tp8,pp8)@1024 -> (dp12,tp8,pp8)@768),
 * bytes sent / exact lower bound (goal 1.00), largest send / balanced bound,
 * items, messages and the planner's peak memory. Then placement (issue 7):
 * for the 175B pairs and a 70B-class model (80 layers, hidden 8192) on 8-GPU
 * hosts, the bytes a resize sends under tide_reshard_place's map vs the default
 * rank order, and the placement time (goal < 100 ms at 1,024 workers).
 * Numbers go to --out as JSON.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>

#include "benchmarks/bench_out.h"
#include "core/clock.h"
#include "core/error.h"
#include "core/log.h"
#include "core/opts.h"
#include "reshard/reshard.h"
#include "reshard/reshard_int.h"

typedef struct pair {
    const char *name;
    int zero1;
    int odp, otp, opp; /* old degrees; default rank order */
    int ndp, ntp, npp; /* new degrees */
    int lost;          /* workers of the old layout marked dead (ids 0..lost-1 of dp rank 0) */
} pair;

typedef struct row {
    const pair *p;
    double plan_ms, plan_for_ms;
    tide_plan_summary s;
    size_t items, items_for;
    uint64_t peak_bytes, peak_for_bytes;
    long rss_delta_kb;
} row;

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static long maxrss_kb(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_maxrss;
}

static tide_status run_pair(const pair *p, const tide_collection_t *c, int reps, row *out)
{
    tide_status rc = TIDE_OK;
    tide_layout_t *o = NULL, *n = NULL;
    tide_plan_t *plan = NULL;
    uint8_t *alive = NULL;
    double *ms = NULL;
    int layers = tide_collection_num_layers(c);
    TIDE_CHECK_GOTO(tide_layout_new(&o, p->odp, p->otp, p->opp, layers, 2 * p->opp), rc, done);
    TIDE_CHECK_GOTO(tide_layout_new(&n, p->ndp, p->ntp, p->npp, layers, 2 * p->npp), rc, done);
    size_t nw =
        tide_layout_size(o) > tide_layout_size(n) ? tide_layout_size(o) : tide_layout_size(n);
    if (p->lost) {
        /* Workers lost: the first `lost` workers die; the new layout takes fresh ids after them. */
        alive = calloc(nw + (size_t)p->lost, 1);
        if (alive == NULL)
            return tide_errorf(TIDE_ERR_NOMEM, "bench: alive array");
        memset(alive, 1, nw + (size_t)p->lost);
        for (int k = 0; k < p->lost; k++) {
            alive[k] = 0;
            n->worker[k] = (int32_t)(nw + (size_t)k);
        }
        nw += (size_t)p->lost;
    }
    ms = calloc((size_t)reps, sizeof *ms);
    if (ms == NULL)
        TIDE_FAIL_GOTO(rc, done, TIDE_ERR_NOMEM, "bench: timing array");
    long rss0 = maxrss_kb();
    for (int r = 0; r < reps; r++) {
        uint64_t t0 = tide_now_ns();
        TIDE_CHECK_GOTO(tide_reshard_plan(o, n, c, alive, alive ? nw : 0, &plan), rc, done);
        ms[r] = (double)(tide_now_ns() - t0) / 1e6;
        out->s = plan->summary;
        out->items = plan->n;
        out->peak_bytes = tide__reshard_peak_bytes();
        tide_plan_destroy(&plan);
    }
    out->rss_delta_kb = maxrss_kb() - rss0;
    qsort(ms, (size_t)reps, sizeof *ms, cmp_double);
    out->plan_ms = ms[reps / 2];
    /* One worker's own plan: what each rank computes during a resize. */
    int32_t me = n->worker[tide_layout_size(n) / 2];
    for (int r = 0; r < reps; r++) {
        uint64_t t0 = tide_now_ns();
        TIDE_CHECK_GOTO(tide_reshard_plan_for(o, n, c, alive, alive ? nw : 0, me, &plan), rc, done);
        ms[r] = (double)(tide_now_ns() - t0) / 1e6;
        out->items_for = plan->n;
        out->peak_for_bytes = tide__reshard_peak_bytes();
        tide_plan_destroy(&plan);
    }
    qsort(ms, (size_t)reps, sizeof *ms, cmp_double);
    out->plan_for_ms = ms[reps / 2];
done:
    free(ms);
    free(alive);
    tide_plan_destroy(&plan);
    tide_layout_destroy(&o);
    tide_layout_destroy(&n);
    return rc;
}

static double ratio(uint64_t a, uint64_t b)
{
    return b ? (double)a / (double)b : (a ? 1e9 : 1.0);
}

/* ---- placement ------------------------------------------------------------------ */

typedef struct place_case {
    const char *name;
    int model; /* 0: 175B, 1: 175B ZeRO-1, 2: 70B */
    int odp, otp, opp;
    int ndp, ntp, npp;
    int idle;      /* idle workers (whole hosts) available beyond the old layout */
    int lost_host; /* 1: host 0's workers failed */
} place_case;

typedef struct place_row {
    const place_case *pc;
    double place_ms, plan_ms;
    uint64_t chosen, plain, lower; /* bytes sent under the chosen map / the default order */
    uint64_t peak_bytes;
    size_t workers;
} place_row;

static tide_status run_place(const place_case *pc, const tide_collection_t *c, int reps,
                             place_row *out)
{
    tide_status rc = TIDE_OK;
    tide_layout_t *o = NULL, *n = NULL, *d = NULL;
    tide_plan_t *plan = NULL;
    tide_place_worker *w = NULL;
    double *ms = calloc((size_t)reps, sizeof *ms);
    int layers = tide_collection_num_layers(c);
    TIDE_CHECK_GOTO(tide_layout_new(&o, pc->odp, pc->otp, pc->opp, layers, 2 * pc->opp), rc, done);
    size_t no = tide_layout_size(o), nw = no + (size_t)pc->idle;
    w = calloc(nw, sizeof *w);
    if (w == NULL || ms == NULL)
        TIDE_FAIL_GOTO(rc, done, TIDE_ERR_NOMEM, "bench: workers");
    size_t k = 0;
    for (size_t id = 0; id < nw; id++) {
        if (pc->lost_host && id < 8)
            continue; /* failed: not available */
        w[k].id = (int32_t)id;
        w[k].host = (int32_t)(id / 8);
        k++;
    }
    tide_place_request rq = {pc->ndp, pc->ntp, pc->npp, 2 * pc->npp, NULL, w, k, 0};
    out->workers = k;
    for (int r = 0; r < reps; r++) {
        uint64_t t0 = tide_now_ns();
        tide_layout_destroy(&n);
        TIDE_CHECK_GOTO(tide_reshard_place(o, c, &rq, &n), rc, done);
        ms[r] = (double)(tide_now_ns() - t0) / 1e6;
    }
    out->peak_bytes = tide__reshard_peak_bytes();
    qsort(ms, (size_t)reps, sizeof *ms, cmp_double);
    out->place_ms = ms[reps / 2];
    TIDE_CHECK_GOTO(tide_reshard_place_default(c, &rq, &d), rc, done);
    TIDE_CHECK_GOTO(tide_reshard_lower_bound(o, n, c, &out->chosen), rc, done);
    TIDE_CHECK_GOTO(tide_reshard_lower_bound(o, d, c, &out->plain), rc, done);
    /* The plan under the chosen map (dead workers: the lost host). */
    uint8_t *alive = calloc(nw, 1);
    if (alive == NULL)
        TIDE_FAIL_GOTO(rc, done, TIDE_ERR_NOMEM, "bench: alive");
    for (size_t x = 0; x < k; x++)
        alive[w[x].id] = 1;
    uint64_t t0 = tide_now_ns();
    rc = tide_reshard_plan(o, n, c, alive, nw, &plan);
    out->plan_ms = (double)(tide_now_ns() - t0) / 1e6;
    free(alive);
    if (rc != TIDE_OK)
        goto done;
    out->lower = plan->summary.bytes_sent;
done:
    free(ms);
    free(w);
    tide_plan_destroy(&plan);
    tide_layout_destroy(&o);
    tide_layout_destroy(&n);
    tide_layout_destroy(&d);
    return rc;
}

static int write_json(const char *path, const row *rows, int n, const place_row *pr, int npr)
{
    FILE *f = bench_out_open("plan_bench", path);
    if (f == NULL)
        return -1;
    fprintf(f, "{\n  \"benchmark\": \"plan_bench\",\n  \"rows\": [\n");
    for (int i = 0; i < n; i++) {
        const row *r = &rows[i];
        fprintf(f,
                "    {\"pair\": \"%s\", \"plan_ms\": %.3f, \"plan_for_ms\": %.3f, "
                "\"bytes_sent\": %llu, \"lower_bound\": %llu, \"sent_over_bound\": %.4f, "
                "\"max_send\": %llu, \"balanced_bound\": %llu, \"max_send_over_bound\": %.4f, "
                "\"bytes_local\": %llu, \"max_recv\": %llu, \"messages\": %llu, \"items\": %zu, "
                "\"items_for\": %zu, \"peak_bytes\": %llu, \"peak_for_bytes\": %llu, "
                "\"maxrss_delta_kb\": %ld}%s\n",
                r->p->name, r->plan_ms, r->plan_for_ms, (unsigned long long)r->s.bytes_sent,
                (unsigned long long)r->s.lower_bound, ratio(r->s.bytes_sent, r->s.lower_bound),
                (unsigned long long)r->s.max_send, (unsigned long long)r->s.balanced_bound,
                ratio(r->s.max_send, r->s.balanced_bound), (unsigned long long)r->s.bytes_local,
                (unsigned long long)r->s.max_recv, (unsigned long long)r->s.messages, r->items,
                r->items_for, (unsigned long long)r->peak_bytes,
                (unsigned long long)r->peak_for_bytes, r->rss_delta_kb, i + 1 < n ? "," : "");
    }
    fprintf(f, "  ],\n  \"placement\": [\n");
    for (int i = 0; i < npr; i++) {
        const place_row *r = &pr[i];
        fprintf(f,
                "    {\"pair\": \"%s\", \"workers\": %zu, \"place_ms\": %.3f, "
                "\"bytes_chosen\": %llu, \"bytes_default\": %llu, \"plan_ms_chosen\": %.3f, "
                "\"plan_sent_chosen\": %llu, \"peak_bytes\": %llu}%s\n",
                r->pc->name, r->workers, r->place_ms, (unsigned long long)r->chosen,
                (unsigned long long)r->plain, r->plan_ms, (unsigned long long)r->lower,
                (unsigned long long)r->peak_bytes, i + 1 < npr ? "," : "");
    }
    fprintf(f, "  ]\n}\n");
    return fclose(f);
}

int main(int argc, char **argv)
{
    const char *out_path = NULL, *log = NULL;
    long long reps = 5;
    const tide_opt opts[] = {
        {"out", "TIDE_BENCH_OUT", TIDE_OPT_STRING, &out_path, "bench-out/plan_bench.json",
         "where to write the numbers (JSON)", 0, 0},
        {"reps", "TIDE_BENCH_REPS", TIDE_OPT_INT, &reps, "5", "timed repetitions per pair", 1,
         1000},
        {"log", "TIDE_LOG", TIDE_OPT_STRING, &log, "warn", "log level", 0, 0},
        {NULL, NULL, 0, NULL, NULL, NULL, 0, 0},
    };
    int code = tide_opts_main(opts, argc, argv, "plan_bench");
    if (code >= 0)
        return code;
    tide_log_level level;
    if (tide_log_parse_level(log, &level) == TIDE_OK)
        tide_log_set_level(level);
    tide_opts_log("plan_bench", opts);

    static const pair pairs[] = {
        {"175B (16,8,8)@1024 -> (12,8,8)@768", 0, 16, 8, 8, 12, 8, 8, 0},
        {"175B zero1 (16,8,8)@1024 -> (12,8,8)@768", 1, 16, 8, 8, 12, 8, 8, 0},
        {"175B (16,8,8)@1024 -> (8,8,12)@768", 0, 16, 8, 8, 8, 8, 12, 0},
        {"175B zero1 (16,8,8)@1024 -> (32,4,8)@1024", 1, 16, 8, 8, 32, 4, 8, 0},
        {"175B (12,8,8)@768 -> (16,8,8)@1024", 0, 12, 8, 8, 16, 8, 8, 0},
        {"175B (16,8,8)@1024, 8 workers lost", 0, 16, 8, 8, 16, 8, 8, 8},
    };
    int np = (int)(sizeof pairs / sizeof pairs[0]);
    row rows[sizeof pairs / sizeof pairs[0]];
    memset(rows, 0, sizeof rows);
    tide_collection_t *c[2] = {NULL, NULL};
    for (int z = 0; z < 2; z++) {
        tide_model_spec spec = {.layers = 96,
                                .hidden = 12288,
                                .ffn = 0,
                                .heads = 96,
                                .vocab = 51200,
                                .attention = 1,
                                .adam = 1,
                                .zero1 = z,
                                .dtype = TIDE_F32};
        if (tide_collection_build_gpt(&c[z], &spec) != TIDE_OK) {
            fprintf(stderr, "plan_bench: %s\n", tide_last_error());
            return 1;
        }
    }
    printf("model: %zu tensors, %.1f G parameters, %.2f TB with Adam state (f32)\n",
           tide_collection_size(c[0]), (double)tide_collection_bytes(c[0]) / 12e9,
           (double)tide_collection_bytes(c[0]) / 1e12);
    printf("%-44s %8s %8s %9s %9s %8s %9s %10s\n", "pair", "plan ms", "for ms", "sent/LB",
           "max/bal", "items", "messages", "peak MiB");
    int rc = 0;
    for (int i = 0; i < np; i++) {
        rows[i].p = &pairs[i];
        if (run_pair(&pairs[i], c[pairs[i].zero1], (int)reps, &rows[i]) != TIDE_OK) {
            fprintf(stderr, "plan_bench: %s: %s\n", pairs[i].name, tide_last_error());
            rc = 1;
            continue;
        }
        const row *r = &rows[i];
        printf("%-44s %8.2f %8.2f %9.4f %9.4f %8zu %9llu %10.1f\n", r->p->name, r->plan_ms,
               r->plan_for_ms, ratio(r->s.bytes_sent, r->s.lower_bound),
               ratio(r->s.max_send, r->s.balanced_bound), r->items,
               (unsigned long long)r->s.messages, (double)r->peak_bytes / (1 << 20));
    }
    static const place_case pcs[] = {
        {"175B (16,8,8)@1024 -> (12,8,8)", 0, 16, 8, 8, 12, 8, 8, 0, 0},
        {"175B (16,8,8)@1024 -> (8,8,12)", 0, 16, 8, 8, 8, 8, 12, 0, 0},
        {"175B zero1 (16,8,8)@1024 -> (32,4,8)", 1, 16, 8, 8, 32, 4, 8, 0, 0},
        {"175B (12,8,8)@768 -> (16,8,8) +256 idle", 0, 12, 8, 8, 16, 8, 8, 256, 0},
        {"175B (16,8,8)@1024, host 0 lost, +1 spare", 0, 16, 8, 8, 16, 8, 8, 8, 1},
        {"70B (8,8,8)@512 -> (6,8,8)", 2, 8, 8, 8, 6, 8, 8, 0, 0},
        {"70B (8,8,8)@512 -> (8,8,10) +128 idle", 2, 8, 8, 8, 8, 8, 10, 128, 0},
        {"70B (8,8,8)@512 -> (16,4,8)", 2, 8, 8, 8, 16, 4, 8, 0, 0},
        {"70B (8,8,8)@512 -> (16,8,8) +512 idle", 2, 8, 8, 8, 16, 8, 8, 512, 0},
    };
    int npc = (int)(sizeof pcs / sizeof pcs[0]);
    place_row prow[sizeof pcs / sizeof pcs[0]];
    memset(prow, 0, sizeof prow);
    tide_collection_t *c70 = NULL;
    tide_model_spec s70 = {.layers = 80,
                           .hidden = 8192,
                           .ffn = 0,
                           .heads = 64,
                           .vocab = 51200,
                           .attention = 1,
                           .adam = 1,
                           .zero1 = 0,
                           .dtype = TIDE_F32};
    if (tide_collection_build_gpt(&c70, &s70) != TIDE_OK) {
        fprintf(stderr, "plan_bench: %s\n", tide_last_error());
        return 1;
    }
    printf("\nplacement (8-GPU hosts; 70B-class: %.1f G parameters)\n",
           (double)tide_collection_bytes(c70) / 12e9);
    printf("%-44s %7s %9s %12s %12s %9s %8s\n", "pair", "workers", "place ms", "chosen GB",
           "default GB", "default/x", "plan ms");
    for (int i = 0; i < npc; i++) {
        prow[i].pc = &pcs[i];
        const tide_collection_t *cc = pcs[i].model == 2 ? c70 : c[pcs[i].model];
        if (run_place(&pcs[i], cc, (int)reps, &prow[i]) != TIDE_OK) {
            fprintf(stderr, "plan_bench: %s: %s\n", pcs[i].name, tide_last_error());
            rc = 1;
            continue;
        }
        const place_row *r = &prow[i];
        char ratio_s[16];
        if (r->chosen)
            snprintf(ratio_s, sizeof ratio_s, "%.2f", (double)r->plain / (double)r->chosen);
        else
            snprintf(ratio_s, sizeof ratio_s, "%s", r->plain ? "inf" : "1.00");
        printf("%-44s %7zu %9.2f %12.1f %12.1f %9s %8.2f\n", pcs[i].name, r->workers, r->place_ms,
               (double)r->chosen / 1e9, (double)r->plain / 1e9, ratio_s, r->plan_ms);
    }
    tide_collection_destroy(&c70);
    for (int z = 0; z < 2; z++)
        tide_collection_destroy(&c[z]);
    if (write_json(out_path, rows, np, prow, npc) != 0) {
        fprintf(stderr, "plan_bench: cannot write %s\n", out_path);
        return 1;
    }
    printf("wrote %s\n", out_path);
    return rc;
}
