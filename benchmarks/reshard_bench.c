/*
 * reshard_bench: bandwidth of the reshard executor on the mpi backend, against the
 * same ranks' plain MPI point-to-point bandwidth measured in the same run.
 *
 * Run with 8 ranks: `mpirun -np 8 reshard_bench [--min-mib 64] [--max-mib 2048]`.
 * For state sizes doubling from --min-mib to --max-mib (one replica of an MLP model
 * with Adam moments, f32) and the layout pairs DP 2->4, TP 2->4, PP 2->4 and
 * (2,2,2)->(1,4,2) (default placement), it plans the reshard, then measures
 *   baseline: every rank sends each peer, in one MPI_Isend per GiB, exactly the bytes
 *             the plan sends it, from and into contiguous memory (MPI_Waitall);
 *   executor: tide_reshard_execute on the same plan (packing, chunking, staging cap);
 * and prints bytes sent, time, GB/s, the ratio executor/baseline (goal >= 0.8 for
 * >= 256 MiB) and the peak staging memory against the cap. Times are the slowest
 * rank's, best of --reps. Numbers go to --out (default bench-out/reshard_bench.json).
 *
 * Memory: each rank holds its old and new shards (DP 2->4 at size S: 2 S on ranks 0-1)
 * plus at most the staging cap; pick --max-mib to fit the machine.
 */
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "collectives/collectives.h"
#include "collectives/executor.h"
#include "core/alloc.h"
#include "core/clock.h"
#include "core/log.h"
#include "core/opts.h"
#include "reshard/reshard.h"

#define BENCH "bench"

typedef struct pair_spec {
    const char *name;
    int odp, otp, opp, ndp, ntp, npp;
} pair_spec;

static const pair_spec pairs[] = {
    {"DP 2->4", 2, 1, 1, 4, 1, 1},
    {"TP 2->4", 1, 2, 1, 1, 4, 1},
    {"PP 2->4", 1, 1, 2, 1, 1, 4},
    {"(2,2,2)->(1,4,2)", 2, 2, 2, 1, 4, 2},
};

typedef struct result {
    const char *pair;
    uint64_t state, sent;
    double base_s, exec_s, base_gbs, exec_gbs, ratio;
    uint64_t peak_staging, cap;
    int ok;
} result;

static int me, np;

/* Per-worker slabs: every tensor shard of a worker lives in one allocation. */
typedef struct slabs {
    char **mem;      /* [np] */
    uint64_t *bytes; /* [np] */
    void ***ptr;     /* [np][T] */
    uint64_t **size; /* [np][T] */
} slabs;

static int make_slabs(const tide_layout_t *l, const tide_collection_t *c, slabs *s, int fill)
{
    size_t T = tide_collection_size(c);
    s->mem = tide_calloc((size_t)np, sizeof *s->mem);
    s->bytes = tide_calloc((size_t)np, sizeof *s->bytes);
    s->ptr = tide_calloc((size_t)np, sizeof *s->ptr);
    s->size = tide_calloc((size_t)np, sizeof *s->size);
    if (!s->mem || !s->bytes || !s->ptr || !s->size)
        return -1;
    for (int w = 0; w < np; w++) {
        s->ptr[w] = tide_calloc(T, sizeof **s->ptr);
        s->size[w] = tide_calloc(T, sizeof **s->size);
        if (!s->ptr[w] || !s->size[w])
            return -1;
    }
    int p, d, t;
    if (tide_layout_find(l, me, &p, &d, &t) != TIDE_OK)
        return 0; /* this rank holds nothing in l */
    uint64_t total = 0;
    for (size_t i = 0; i < T; i++)
        total += tide_shard_bytes(l, c, i, p, d, t);
    s->mem[me] = tide_malloc(total ? total : 1);
    if (s->mem[me] == NULL)
        return -1;
    /* Touch every page now so that no page fault lands inside a timed region. */
    memset(s->mem[me], fill, total);
    s->bytes[me] = total;
    uint64_t at = 0;
    for (size_t i = 0; i < T; i++) {
        uint64_t b = tide_shard_bytes(l, c, i, p, d, t);
        if (b) {
            s->ptr[me][i] = s->mem[me] + at;
            s->size[me][i] = b;
        }
        at += b;
    }
    return 0;
}

static void free_slabs(slabs *s)
{
    for (int w = 0; w < np && s->ptr; w++) {
        tide_free(s->ptr[w]);
        tide_free(s->size[w]);
    }
    if (s->mem)
        tide_free(s->mem[me]);
    tide_free(s->mem);
    tide_free(s->bytes);
    tide_free(s->ptr);
    tide_free(s->size);
    memset(s, 0, sizeof *s);
}

/* Plain MPI: the plan's per-peer volumes as contiguous messages. Returns seconds. */
static double baseline(const tide_plan_t *plan, slabs *olds, slabs *news)
{
    uint64_t *to = calloc((size_t)np, sizeof *to), *from = calloc((size_t)np, sizeof *from);
    for (size_t i = 0; i < plan->n; i++) {
        const tide_xfer *it = &plan->items[i];
        if (it->src == it->dst)
            continue;
        if (it->src == me)
            to[it->dst] += it->run * it->count;
        if (it->dst == me)
            from[it->src] += it->run * it->count;
    }
    const uint64_t piece = (uint64_t)1 << 30;
    int cap = 4 * np + 64, n = 0;
    MPI_Request *reqs = calloc((size_t)cap, sizeof *reqs);
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    uint64_t at = 0;
    for (int p = 0; p < np; p++)
        for (uint64_t off = 0; off < from[p]; off += piece) {
            uint64_t len = from[p] - off < piece ? from[p] - off : piece;
            if (n == cap) {
                cap *= 2;
                reqs = realloc(reqs, (size_t)cap * sizeof *reqs);
            }
            MPI_Irecv(news->mem[me] + at, (int)len, MPI_BYTE, p, 7, MPI_COMM_WORLD, &reqs[n++]);
            at += len;
        }
    /* Same 1 GiB pieces as the receiver; a piece comes from this rank's old shards, or
       from scratch when the rank sends a peer more than it holds. */
    uint64_t have = olds->bytes[me];
    char *scratch = NULL;
    for (int p = 0; p < np; p++)
        for (uint64_t off = 0; off < to[p]; off += piece) {
            uint64_t len = to[p] - off < piece ? to[p] - off : piece;
            char *src = olds->mem[me];
            if (len > have) {
                if (scratch == NULL)
                    scratch = calloc(1, piece);
                src = scratch;
            }
            if (n == cap) {
                cap *= 2;
                reqs = realloc(reqs, (size_t)cap * sizeof *reqs);
            }
            MPI_Isend(src, (int)len, MPI_BYTE, p, 7, MPI_COMM_WORLD, &reqs[n++]);
        }
    MPI_Waitall(n, reqs, MPI_STATUSES_IGNORE);
    double t = MPI_Wtime() - t0, tmax = 0;
    MPI_Allreduce(&t, &tmax, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    free(scratch);
    free(reqs);
    free(to);
    free(from);
    return tmax;
}

static int model_for(uint64_t state_bytes, tide_collection_t **out)
{
    /* MLP blocks with Adam: about 3 * (8 h^2 + 10 h) * 4 bytes per layer, 8 layers. */
    double h = sqrt((double)state_bytes / (8.0 * 96.0));
    int64_t hidden = (int64_t)(h / 8.0 + 0.5) * 8;
    if (hidden < 8)
        hidden = 8;
    tide_model_spec spec = {.layers = 8,
                            .hidden = hidden,
                            .ffn = 4 * hidden,
                            .heads = 1,
                            .vocab = 0,
                            .attention = 0,
                            .adam = 1,
                            .zero1 = 0,
                            .dtype = TIDE_F32};
    return tide_collection_build_gpt(out, &spec) == TIDE_OK ? 0 : -1;
}

static int run_one(tide_coll_comm_t *comm, const pair_spec *ps, const tide_collection_t *col,
                   uint64_t cap, uint64_t chunk, uint64_t pack, int reps, result *r)
{
    tide_layout_t *ol = NULL, *nl = NULL;
    tide_plan_t *plan = NULL;
    slabs olds, news;
    memset(&olds, 0, sizeof olds);
    memset(&news, 0, sizeof news);
    int rc = -1;
    int L = tide_collection_num_layers(col);
    if (tide_layout_new(&ol, ps->odp, ps->otp, ps->opp, L, 1) != TIDE_OK ||
        tide_layout_new(&nl, ps->ndp, ps->ntp, ps->npp, L, 1) != TIDE_OK ||
        tide_reshard_plan(ol, nl, col, NULL, 0, &plan) != TIDE_OK) {
        TIDE_ERROR(BENCH, "%s: planning failed: %s", ps->name, tide_last_error());
        goto out;
    }
    int bad = make_slabs(ol, col, &olds, 0x5a) || make_slabs(nl, col, &news, 0);
    int any_bad = 0;
    MPI_Allreduce(&bad, &any_bad, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (any_bad) {
        TIDE_ERROR(BENCH, "%s: out of memory for the shards (lower --max-mib)", ps->name);
        goto out;
    }
    r->pair = ps->name;
    r->state = tide_collection_bytes(col);
    r->sent = plan->summary.bytes_sent;
    r->cap = cap;
    r->base_s = r->exec_s = 1e30;
    for (int k = 0; k < reps; k++) {
        double b = baseline(plan, &olds, &news);
        if (b < r->base_s)
            r->base_s = b;
        tide_exec_args a = {.plan = plan,
                            .n_workers = (size_t)np,
                            .n_tensors = tide_collection_size(col),
                            .old_bufs = (void *const *const *)olds.ptr,
                            .new_bufs = (void *const *const *)news.ptr,
                            .old_bytes = (const uint64_t *const *)olds.size,
                            .new_bytes = (const uint64_t *const *)news.size};
        tide_exec_opts o;
        tide_exec_opts_init(&o);
        o.staging_cap = cap;
        if (chunk)
            o.max_chunk = chunk;
        if (pack)
            o.pack_below = pack;
        tide_exec_stats st;
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = MPI_Wtime();
        tide_status s = tide_reshard_execute(comm, &a, &o, &st);
        double t = MPI_Wtime() - t0, tmax = 0;
        if (s != TIDE_OK) {
            TIDE_ERROR(BENCH, "%s: execute failed: %s", ps->name, tide_last_error());
            goto out;
        }
        MPI_Allreduce(&t, &tmax, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        if (tmax < r->exec_s)
            r->exec_s = tmax;
        uint64_t peak = 0, sent = 0;
        MPI_Allreduce(&st.peak_staging, &peak, 1, MPI_UINT64_T, MPI_MAX, MPI_COMM_WORLD);
        MPI_Allreduce(&st.bytes_sent, &sent, 1, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD);
        if (peak > r->peak_staging)
            r->peak_staging = peak;
        if (sent != r->sent) {
            TIDE_ERROR(BENCH, "%s: executor sent %llu bytes, plan says %llu", ps->name,
                       (unsigned long long)sent, (unsigned long long)r->sent);
            goto out;
        }
    }
    r->base_gbs = (double)r->sent / r->base_s / 1e9;
    r->exec_gbs = (double)r->sent / r->exec_s / 1e9;
    r->ratio = r->base_s / r->exec_s;
    r->ok = 1;
    rc = 0;
out:
    free_slabs(&olds);
    free_slabs(&news);
    tide_plan_destroy(&plan);
    tide_layout_destroy(&ol);
    tide_layout_destroy(&nl);
    return rc;
}

static void write_json(const char *path, const result *res, int n, long long cap_mib)
{
    char dir[512];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash) {
        *slash = '\0';
        mkdir(dir, 0755);
    }
    FILE *f = fopen(path, "w");
    if (f == NULL) {
        TIDE_ERROR(BENCH, "cannot write %s", path);
        return;
    }
    fprintf(
        f,
        "{\n  \"benchmark\": \"reshard_bench\",\n  \"ranks\": %d,\n  \"staging_cap_mib\": %lld,\n"
        "  \"results\": [\n",
        np, cap_mib);
    for (int i = 0; i < n; i++)
        fprintf(f,
                "    {\"pair\": \"%s\", \"state_bytes\": %llu, \"bytes_sent\": %llu, "
                "\"baseline_s\": %.6f, \"executor_s\": %.6f, \"baseline_gbs\": %.3f, "
                "\"executor_gbs\": %.3f, \"ratio\": %.3f, \"peak_staging\": %llu, "
                "\"staging_cap\": %llu}%s\n",
                res[i].pair, (unsigned long long)res[i].state, (unsigned long long)res[i].sent,
                res[i].base_s, res[i].exec_s, res[i].base_gbs, res[i].exec_gbs, res[i].ratio,
                (unsigned long long)res[i].peak_staging, (unsigned long long)res[i].cap,
                i + 1 < n ? "," : "");
    fprintf(f, "  ]\n}\n");
    fclose(f);
}

int main(int argc, char **argv)
{
    long long min_mib = 64, max_mib = 2048, cap_mib = 256, chunk_mib = 0, reps = 1, pack_kib = 0;
    const char *out = "bench-out/reshard_bench.json", *log = NULL;
    int help = 0, npos = 0;
    tide_opt opts[] = {
        {"min-mib", "TIDE_BENCH_MIN_MIB", TIDE_OPT_INT, &min_mib, "64", "smallest state (MiB)", 1,
         1 << 20},
        {"max-mib", "TIDE_BENCH_MAX_MIB", TIDE_OPT_INT, &max_mib, "2048",
         "largest state (MiB); lower it on small machines", 1, 1 << 20},
        {"cap-mib", "TIDE_STAGING_CAP_MIB", TIDE_OPT_INT, &cap_mib, "256", "staging cap (MiB)", 1,
         1 << 20},
        {"chunk-mib", "TIDE_CHUNK_MIB", TIDE_OPT_INT, &chunk_mib, "0",
         "max chunk (MiB); 0: executor default", 0, 1024},
        {"pack-kib", "TIDE_PACK_KIB", TIDE_OPT_INT, &pack_kib, "0",
         "pack items below this size (KiB); 0: executor default", 0, 1 << 20},
        {"reps", "TIDE_BENCH_REPS", TIDE_OPT_INT, &reps, "1", "repetitions (best is kept)", 1, 100},
        {"out", "TIDE_BENCH_OUT", TIDE_OPT_STRING, &out, "bench-out/reshard_bench.json",
         "where the numbers go (JSON)", 0, 0},
        {"log", "TIDE_LOG", TIDE_OPT_STRING, &log, NULL, "log level", 0, 0},
        {NULL, NULL, 0, NULL, NULL, NULL, 0, 0},
    };
    int provided = 0;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    MPI_Comm_size(MPI_COMM_WORLD, &np);
    tide_status rc = tide_opts_parse(opts, argc, argv, &npos, &help);
    if (rc != TIDE_OK || help) {
        if (me == 0) {
            if (rc != TIDE_OK)
                fprintf(stderr, "reshard_bench: %s\n", tide_last_error());
            tide_opts_usage(stderr, "mpirun -np 8 reshard_bench", "[options]", opts);
        }
        MPI_Finalize();
        return rc != TIDE_OK ? 2 : 0;
    }
    if (log) {
        tide_log_level lv;
        if (tide_log_parse_level(log, &lv) == TIDE_OK)
            tide_log_set_level(lv);
    }
    if (me == 0)
        tide_opts_log(BENCH, opts);
    if (np < 8) {
        if (me == 0)
            fprintf(stderr, "reshard_bench: needs 8 ranks (the (2,2,2) layout), got %d\n", np);
        MPI_Finalize();
        return 2;
    }
    const tide_coll_backend_v1 *be = NULL;
    tide_coll_pool_t *pool = NULL;
    tide_coll_comm_t *comm = NULL;
    int members[1024];
    for (int i = 0; i < np && i < 1024; i++)
        members[i] = i;
    tide_coll_comm_params cp = {.members = members, .n_members = np, .tag = 1};
    if (tide_coll_backend_find("mpi", &be) != TIDE_OK ||
        tide_coll_pool_new(&pool, MPI_COMM_WORLD) != TIDE_OK ||
        tide_coll_comm_new(&comm, be, pool, &cp) != TIDE_OK) {
        fprintf(stderr, "reshard_bench: %s\n", tide_last_error());
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    result res[64];
    int nres = 0;
    if (me == 0) {
        printf("reshard_bench: %d ranks, mpi backend, staging cap %lld MiB\n", np, cap_mib);
        printf("%-18s %9s %10s %9s %9s %9s %9s %6s %12s\n", "pair", "state", "sent", "mpi s",
               "exec s", "mpi GB/s", "exec GB/s", "ratio", "peak stage");
    }
    int failed = 0;
    for (long long mib = min_mib; mib <= max_mib && nres < 60; mib *= 2) {
        tide_collection_t *col = NULL;
        if (model_for((uint64_t)mib << 20, &col) != 0) {
            failed = 1;
            break;
        }
        for (size_t k = 0; k < sizeof pairs / sizeof pairs[0]; k++) {
            result *r = &res[nres];
            memset(r, 0, sizeof *r);
            if (run_one(comm, &pairs[k], col, (uint64_t)cap_mib << 20, (uint64_t)chunk_mib << 20,
                        (uint64_t)pack_kib << 10, (int)reps, r) != 0) {
                failed = 1;
                continue;
            }
            nres++;
            if (me == 0) {
                printf("%-18s %6.0f MiB %6.0f MiB %9.3f %9.3f %9.2f %9.2f %6.2f %8.0f MiB%s\n",
                       r->pair, (double)r->state / 1048576.0, (double)r->sent / 1048576.0,
                       r->base_s, r->exec_s, r->base_gbs, r->exec_gbs, r->ratio,
                       (double)r->peak_staging / 1048576.0,
                       r->peak_staging <= r->cap ? "" : " (over cap!)");
                fflush(stdout);
            }
        }
        tide_collection_destroy(&col);
    }
    if (me == 0) {
        write_json(out, res, nres, cap_mib);
        printf("numbers written to %s\n", out);
    }
    tide_coll_comm_destroy(&comm);
    tide_coll_pool_destroy(&pool);
    MPI_Finalize();
    return failed ? 1 : 0;
}
