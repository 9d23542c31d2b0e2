/*
 * reshard_bench: bandwidth of the reshard executor on the mpi backend, against the
 * same ranks' plain MPI point-to-point bandwidth measured in the same run.
 *
 * Run with 8 ranks: `mpirun -np 8 reshard_bench [--min-mib 64] [--max-mib 2048]`.
 * For state sizes doubling from --min-mib to --max-mib (one replica of an MLP model
 * with Adam moments, f32) and the layout pairs DP 2->4, TP 2->4, PP 2->4 and
 * (2,2,2)->(1,4,2) and (1,4,2)->(2,4,1), it places the new layout the way tided does by default
 * (tide_reshard_place, the map that sends the fewest bytes; --placement default: the
 * plain rank order), plans the reshard, then times four things:
 *   mpi:      every rank exchanges with each peer exactly the bytes the plan moves
 *             between them, one contiguous MPI_Isend/Irecv per (src, dst) pair, old
 *             slab to new slab, MPI_Waitall;
 *   mpi+cp:   the same plus one memcpy of the plan's local bytes (the same work as a
 *             live resize, done the simplest fast way);
 *   net:      tide_reshard_execute on the plan without its local copies (the
 *             executor's network phase alone: packing, chunking, staging cap);
 *   exec:     tide_reshard_execute on the whole plan (what a live resize costs).
 * Each time is the slowest rank's, from a barrier to the end; every repetition runs
 * the four, in an order rotated from one repetition to the next so that machine load
 * hits them alike, and the table shows medians over --reps. Ratios (goal >= 0.8 for
 * >= 256 MiB): r_net = mpi / net (network phase against plain MPI on the same bytes),
 * r_e2e = mpi+cp / exec (whole resize against plain MPI + memcpy), r_p2p = mpi / exec
 * (whole resize against the network bytes alone: local copies count against the
 * executor). Also the peak staging memory against the cap, and "direct": the bytes the
 * executor moved by single copy (tide_exec_stats.bytes_direct summed over the ranks;
 * TIDE_COLL_CMA=0 turns that path off for a comparison). Numbers (medians, min,
 * max) go to --out (default bench-out/reshard_bench.json).
 *
 * Across hosts (ranks whose hostnames differ, e.g. `mpirun --host h1:4,h2:4` on
 * scripts/cluster.sh with a shaped link), placement knows each rank's host as tided
 * does, and the table adds under each row the plan's bytes between ranks on different
 * hosts, with the chosen placement and with the plain rank order, and the cross-host
 * goal: when the link is the bottleneck, the executor's network phase runs at >= 0.9 of
 * plain point-to-point (the baseline) over the same link (r_net >= 0.9). The link's rate
 * is measured first (the ranks of the first host and as many of another, paired, send
 * each other --probe-mib in all at once over MPI, best of 3); a pair is link-bound when
 * the busiest host's outgoing cross-host bytes at that rate take >= 0.8 of the baseline's
 * time (the baseline then runs at the link's speed, and the link, not the copies,
 * decides). Pairs that move nothing across hosts, or are not link-bound, say so and have
 * no cross-host goal.
 *
 * --backend nccl (built with CUDA and NCCL): the same plans, executor and timings on
 * the nccl backend, every shard and staging buffer device memory (allocated and zeroed
 * through the backend table on the rank's device: TIDE_DEVICE, else its index on the
 * host), against plain NCCL: one ncclSend / ncclRecv per (src, dst) pair of exactly the
 * bytes the plan moves between them, in one ncclGroupStart/End, on a communicator of
 * the same ranks made with ncclCommInitRank, and for "nccl+cp" one cudaMemcpyAsync of
 * the local bytes on a second stream. Columns and JSON keys say nccl for mpi; numbers
 * go to bench-out/reshard_bench_nccl.json by default. On one GPU, give each rank its
 * own NCCL_HOSTID (scripts/gpu-check.sh does): NCCL then runs them as hosts of their
 * own, over its socket transport.
 *
 * Memory: each rank holds its old and new shards (DP 2->4 at size S: 2 S on ranks 0-1)
 * plus at most the staging cap; pick --max-mib to fit the machine. On a machine with
 * fewer cores than ranks every rank shares the cores, baselines and executor alike:
 * bind the ranks (mpirun --bind-to core:overload-allowed) or the scheduler's placement,
 * which changes from run to run, moves the ratios by up to 2x. Every core busy, the
 * copies' CPU time decides: a strided single copy costs more per byte than the
 * baseline's contiguous one (copy_bench measures both and the ceiling they give).
 */
#include <math.h>
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "benchmarks/bench_out.h"
#include "collectives/collectives.h"
#include "collectives/executor.h"
#include "core/alloc.h"
#include "core/clock.h"
#include "core/log.h"
#include "core/opts.h"
#include "core/version.h"
#include "reshard/reshard.h"

#if defined(TIDE_HAVE_NCCL)
#include <cuda_runtime_api.h>
#include <nccl.h>
#endif

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
    /* on 2 hosts x 4 ranks: one pipeline stage per host back to one replica per host,
       every byte it moves crosses the link */
    {"(1,4,2)->(2,4,1)", 1, 4, 2, 2, 4, 1},
};

/* The four timings of a (pair, size), each the median over the repetitions of the
   slowest rank's seconds. */
enum { M_MPI, M_MPI_COPY, M_EXEC_NET, M_EXEC, M_COUNT };
static const char *const m_names_mpi[M_COUNT] = {"mpi", "mpi_copy", "exec_net", "exec"};
static const char *const m_names_nccl[M_COUNT] = {"nccl", "nccl_copy", "exec_net", "exec"};
static const char *const *m_names = m_names_mpi;

typedef struct result {
    const char *pair;
    uint64_t state, sent, local;
    double med[M_COUNT], min[M_COUNT], max[M_COUNT]; /* seconds */
    double ratio_net; /* mpi / exec_net: network phase against plain MPI (the goal) */
    double ratio_e2e; /* mpi_copy / exec: whole resize against MPI + memcpy */
    double ratio_p2p; /* mpi / exec: whole resize against the network bytes alone */
    uint64_t peak_staging, cap;
    uint64_t direct;               /* bytes the network run received by single copy (all ranks) */
    uint64_t cross, cross_default; /* plan bytes between hosts: chosen placement, rank order */
    uint64_t cross_out_max;        /* the most cross-host bytes one host sends (its uplink) */
    int ok;
} result;

static int me, np;
static int g_host[64]; /* host index of each rank (ranks with equal hostnames share one) */
static int g_hosts = 1;
static double g_link_Bps; /* measured rate of one host's link to another (bytes/s); 0: one host */

#define X_GOAL     0.9 /* cross-host goal: r_net when the link is the bottleneck */
#define LINK_BOUND 0.8 /* link-bound: the busiest uplink's share of the baseline's time */

/* The most bytes of plan that one host sends to other hosts. */
static uint64_t cross_out_max(const tide_plan_t *plan)
{
    uint64_t out[64] = {0}, m = 0;
    for (size_t i = 0; i < plan->n; i++) {
        const tide_xfer *x = &plan->items[i];
        if (x->src != x->dst && g_host[x->src] != g_host[x->dst])
            out[g_host[x->src]] += x->run * x->count;
    }
    for (int h = 0; h < g_hosts && h < 64; h++)
        m = out[h] > m ? out[h] : m;
    return m;
}

/* Share of the baseline's time that the busiest uplink's cross-host bytes take at the
   measured link rate (>= LINK_BOUND: link-bound); 0 without cross-host bytes. */
static double link_share(const result *r)
{
    if (g_link_Bps <= 0 || r->cross_out_max == 0 || r->med[M_MPI] <= 0)
        return 0.0;
    return (double)r->cross_out_max / g_link_Bps / r->med[M_MPI];
}

/*
 * The link's rate: the ranks of the first host and as many of the next host, paired in
 * rank order, send each other their part of `bytes` at once (one stream per pair, as a
 * plan's traffic flows; each direction is one host's uplink), best of 3; bytes/s of one
 * direction, on every rank. Collective over MPI_COMM_WORLD; 0 with one host or when out
 * of memory.
 */
static double probe_link(uint64_t bytes)
{
    int a[64], b[64], na = 0, nb = 0, other = -1;
    for (int w = 0; w < np && w < 64; w++) {
        if (g_host[w] == g_host[0])
            a[na++] = w;
        else if (other < 0 || g_host[w] == other) {
            other = g_host[w];
            b[nb++] = w;
        }
    }
    int pairs_n = na < nb ? na : nb, peer = -1;
    for (int k = 0; k < pairs_n; k++) {
        if (me == a[k])
            peer = b[k];
        if (me == b[k])
            peer = a[k];
    }
    uint64_t part = pairs_n > 0 ? bytes / (uint64_t)pairs_n : 0;
    double best = 0.0;
    char *sb = NULL, *rb = NULL;
    int ok = 1;
    if (peer >= 0) {
        sb = tide_malloc((size_t)part + 1);
        rb = tide_malloc((size_t)part + 1);
        ok = sb != NULL && rb != NULL;
        if (ok)
            memset(sb, 0x3c, (size_t)part);
    }
    int all_ok = 0;
    MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    for (int k = 0; pairs_n > 0 && all_ok && k < 3; k++) {
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = MPI_Wtime();
        /* int counts: sent in pieces of at most 1 GiB */
        for (uint64_t at = 0; peer >= 0 && at < part; at += 1u << 30) {
            int n = (int)(part - at < (1u << 30) ? part - at : (1u << 30));
            MPI_Request q[2];
            MPI_Irecv(rb + at, n, MPI_BYTE, peer, 77, MPI_COMM_WORLD, &q[0]);
            MPI_Isend(sb + at, n, MPI_BYTE, peer, 77, MPI_COMM_WORLD, &q[1]);
            MPI_Waitall(2, q, MPI_STATUSES_IGNORE);
        }
        double t = MPI_Wtime() - t0, worst = 0.0;
        MPI_Allreduce(&t, &worst, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        best = fmax(best, worst > 0 ? (double)(part * (uint64_t)pairs_n) / worst : 0.0);
    }
    tide_free(sb);
    tide_free(rb);
    return best;
}

/* Bytes of plan sent between ranks of different hosts. */
static uint64_t cross_bytes(const tide_plan_t *plan)
{
    uint64_t b = 0;
    for (size_t i = 0; i < plan->n; i++) {
        const tide_xfer *x = &plan->items[i];
        if (x->src != x->dst && g_host[x->src] != g_host[x->dst])
            b += x->run * x->count;
    }
    return b;
}
static int g_optimal = 1; /* --placement: 1 optimal (tided's default), 0 rank order */

/* The backend the executor runs on, and where shards live: host memory (mpi) or device
   memory of g_dev (nccl), allocated and zeroed through the backend table. */
static const tide_coll_backend_v1 *g_be;
static int g_dev;
static int g_nccl; /* --backend nccl: device shards, plain-NCCL baselines */

/* bytes of g_be's memory, every byte written now (host: fill, so that no page fault
   lands in a timed region; device: zeroed on the device); NULL when out of memory. */
static char *bench_alloc(uint64_t bytes, int fill)
{
    void *p = NULL;
    if (!g_nccl) {
        p = tide_malloc((size_t)bytes);
        if (p != NULL)
            memset(p, fill, (size_t)bytes);
        return p;
    }
    if (tide_coll_mem_alloc(g_be, g_dev, (size_t)bytes, &p) != TIDE_OK)
        return NULL;
    if (tide_coll_mem_zero(g_be, g_dev, p, (size_t)bytes) != TIDE_OK) {
        g_be->mem_free(p);
        return NULL;
    }
    return p;
}

static void bench_free(void *p)
{
    if (!g_nccl)
        tide_free(p);
    else if (p != NULL)
        g_be->mem_free(p);
}

/* Page size the baseline aligns its messages to (bytes), and the extra room each slab
   has for that: one page per peer and one for the slab's own start. */
#define PAGE  ((uint64_t)4096)
#define SLACK ((uint64_t)(np + 2) * PAGE)

static uint64_t align_up(uint64_t v)
{
    return (v + PAGE - 1) / PAGE * PAGE;
}

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
    /* SLACK at the end: room for the baseline's page-aligned messages (see baseline).
       Every page touched now, so that no page fault lands inside a timed region. */
    s->mem[me] = bench_alloc(total + SLACK, fill);
    if (s->mem[me] == NULL)
        return -1;
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
        bench_free(s->mem[me]);
    tide_free(s->mem);
    tide_free(s->bytes);
    tide_free(s->ptr);
    tide_free(s->size);
    memset(s, 0, sizeof *s);
}

/* One message of a baseline: a send to or a receive from peer of len bytes at buf. */
typedef struct bmsg {
    int peer, send;
    char *buf;
    uint64_t len;
} bmsg;

/* What this rank moves in a plan, for the plain-MPI baselines: bytes sent to and
   received from each peer (network transfers only) and bytes copied locally. */
typedef struct volumes {
    uint64_t *to, *from; /* [np] bytes */
    uint64_t local;      /* bytes */
    int n_msgs;          /* messages the baseline posts */
    MPI_Request *reqs;   /* [n_msgs] */
    bmsg *msgs;          /* [n_msgs] */
    char *scratch;       /* a send source when the old slab is shorter than a piece */
} volumes;

/* Largest single baseline message (bytes): at most 1 GiB, MPI counts being ints;
   --base-piece-mib lowers it to compare chunked plain MPI. */
static uint64_t PIECE = (uint64_t)1 << 30;

static int volumes_new(const tide_plan_t *plan, const slabs *olds, volumes *v)
{
    memset(v, 0, sizeof *v);
    v->to = tide_calloc((size_t)np, sizeof *v->to);
    v->from = tide_calloc((size_t)np, sizeof *v->from);
    if (!v->to || !v->from)
        return -1;
    for (size_t i = 0; i < plan->n; i++) {
        const tide_xfer *it = &plan->items[i];
        uint64_t b = it->run * it->count;
        if (it->src == it->dst && it->src == me)
            v->local += b;
        else if (it->src != it->dst && it->src == me)
            v->to[it->dst] += b;
        else if (it->src != it->dst && it->dst == me)
            v->from[it->src] += b;
    }
    int scratch = 0;
    for (int p = 0; p < np; p++) {
        v->n_msgs += (int)((v->to[p] + PIECE - 1) / PIECE + (v->from[p] + PIECE - 1) / PIECE);
        for (uint64_t off = 0; off < v->to[p]; off += PIECE)
            if ((v->to[p] - off < PIECE ? v->to[p] - off : PIECE) > olds->bytes[me] + PAGE)
                scratch = 1;
    }
    v->reqs = tide_calloc((size_t)v->n_msgs + 1, sizeof *v->reqs);
    v->msgs = tide_calloc((size_t)v->n_msgs + 1, sizeof *v->msgs);
    if (v->reqs == NULL || v->msgs == NULL)
        return -1;
    if (scratch) {
        /* Allocated and touched here, so that no allocation or page fault is timed. */
        v->scratch = bench_alloc(PIECE, 0x5a);
        if (v->scratch == NULL)
            return -1;
    }
    return 0;
}

static void volumes_free(volumes *v)
{
    tide_free(v->to);
    tide_free(v->from);
    tide_free(v->reqs);
    tide_free(v->msgs);
    bench_free(v->scratch);
    memset(v, 0, sizeof *v);
}

/* Where the baseline's messages go, computed once per repetition before the clock
   starts: every rank exchanges with each peer exactly the bytes the plan moves between
   them, as one contiguous message per (src, dst) pair (pieces of --base-piece-mib),
   receiving into its new slab and sending from its old slab (consecutive peers get
   consecutive ranges, so no two peers read the same bytes); sends first, starting with
   the next rank (not everyone with rank 0), then receives. *cdst / *csrc: where the
   local bytes are copied (NULL when they do not fit beside the receives). Returns the
   message count (<= v->n_msgs). */
static int baseline_msgs(const volumes *v, slabs *olds, slabs *news, bmsg *m, char **cdst,
                         const char **csrc)
{
    int n = 0;
    /* Every message starts on a page boundary at both ends (the slabs' SLACK makes
       room): memory copies run at very different speeds depending on where source and
       destination sit relative to each other modulo the page size (a destination a
       few bytes past the source, modulo 4 KiB, costs up to 2x through 4K aliasing of
       loads and stores), and the baseline must not be slowed by an accident of its
       own layout. The executor moves the plan's real tensor addresses. */
    char *obase = olds->mem[me], *nbase = news->mem[me];
    uint64_t have = 0, room = 0, recv_at = 0, at = 0;
    if (obase) {
        char *b = (char *)(uintptr_t)align_up((uintptr_t)obase);
        have = olds->bytes[me] + SLACK - (uint64_t)(b - obase) - PAGE;
        obase = b;
    }
    if (nbase) {
        char *b = (char *)(uintptr_t)align_up((uintptr_t)nbase);
        room = news->bytes[me] + SLACK - (uint64_t)(b - nbase);
        nbase = b;
    }
    for (int q = 1; q <= np; q++) {
        int p = (me + q) % np;
        for (uint64_t off = 0; off < v->to[p]; off += PIECE) {
            uint64_t len = v->to[p] - off < PIECE ? v->to[p] - off : PIECE;
            /* Distinct source ranges for different peers while the slab allows: two
               receivers pulling the same pages at once contend on them (single-copy
               transports pin the sender's pages). */
            char *src = v->scratch;
            if (len <= have) {
                uint64_t start = at + len <= have ? at : 0;
                src = obase + start;
                at = align_up(start + len);
            }
            m[n++] = (bmsg){p, 1, src, len};
        }
    }
    /* Receives after the sends, as in the mpi backend: a receive matching a message
       already announced does the whole single copy inside MPI_Irecv. */
    for (int p = 0; p < np; p++)
        for (uint64_t off = 0; off < v->from[p]; off += PIECE) {
            uint64_t len = v->from[p] - off < PIECE ? v->from[p] - off : PIECE;
            m[n++] = (bmsg){p, 0, nbase + recv_at, len};
            recv_at = align_up(recv_at + len);
        }
    /* New slab = received bytes then local bytes; the copy never overlaps a receive. */
    *cdst = NULL;
    *csrc = NULL;
    if (v->local > 0 && recv_at + v->local <= room && v->local <= have) {
        *cdst = nbase + recv_at;
        *csrc = obase;
    }
    return n;
}

/*
 * The plain-MPI baseline: baseline_msgs' messages as MPI_Isend / MPI_Irecv, then
 * MPI_Waitall. With copy set it also copies the plan's local bytes, old slab to new
 * slab, with one memcpy between posting and MPI_Waitall: the same work as the
 * executor, done the simplest fast way. Returns the slowest rank's seconds.
 */
static double baseline(const volumes *v, slabs *olds, slabs *news, int copy)
{
    char *cdst;
    const char *csrc;
    int n = baseline_msgs(v, olds, news, v->msgs, &cdst, &csrc);
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    for (int i = 0; i < n; i++) {
        const bmsg *m = &v->msgs[i];
        if (m->send)
            MPI_Isend(m->buf, (int)m->len, MPI_BYTE, m->peer, 7, MPI_COMM_WORLD, &v->reqs[i]);
        else
            MPI_Irecv(m->buf, (int)m->len, MPI_BYTE, m->peer, 7, MPI_COMM_WORLD, &v->reqs[i]);
    }
    if (copy && cdst != NULL)
        memcpy(cdst, csrc, (size_t)v->local);
    MPI_Waitall(n, v->reqs, MPI_STATUSES_IGNORE);
    double t = MPI_Wtime() - t0, tmax = 0;
    MPI_Allreduce(&t, &tmax, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    return tmax;
}

#if defined(TIDE_HAVE_NCCL)
/* The plain-NCCL baseline's communicator (ncclCommInitRank over all ranks, on g_dev)
   and its streams: [0] the messages, [1] the local copy. */
static ncclComm_t g_nc;
static cudaStream_t g_ns[2];

static void nccl_die(const char *what, const char *why)
{
    fprintf(stderr, "reshard_bench: rank %d: %s failed: %s\n", me, what, why);
    MPI_Abort(MPI_COMM_WORLD, 1);
}

#define BENCH_NCCL(expr)                                                                           \
    do {                                                                                           \
        ncclResult_t bench__r = (expr);                                                            \
        if (bench__r != ncclSuccess)                                                               \
            nccl_die(#expr, ncclGetErrorString(bench__r));                                         \
    } while (0)
#define BENCH_CUDA(expr)                                                                           \
    do {                                                                                           \
        cudaError_t bench__e = (expr);                                                             \
        if (bench__e != cudaSuccess)                                                               \
            nccl_die(#expr, cudaGetErrorString(bench__e));                                         \
    } while (0)

static void nccl_baseline_init(void)
{
    ncclUniqueId id;
    memset(&id, 0, sizeof id);
    if (me == 0)
        BENCH_NCCL(ncclGetUniqueId(&id));
    MPI_Bcast(&id, (int)sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);
    BENCH_NCCL(ncclCommInitRank(&g_nc, np, id, me));
    for (int i = 0; i < 2; i++)
        BENCH_CUDA(cudaStreamCreateWithFlags(&g_ns[i], cudaStreamNonBlocking));
}

static void nccl_baseline_fini(void)
{
    for (int i = 0; i < 2; i++)
        if (g_ns[i] != NULL)
            cudaStreamDestroy(g_ns[i]);
    if (g_nc != NULL) {
        ncclCommFinalize(g_nc);
        ncclCommDestroy(g_nc);
    }
}

/*
 * The plain-NCCL baseline: baseline_msgs' messages as ncclSend / ncclRecv of bytes in
 * one group on one stream, and with copy set the plan's local bytes as one
 * cudaMemcpyAsync on a second stream, overlapping them; then both streams synchronised.
 * Returns the slowest rank's seconds.
 */
static double baseline_nccl(const volumes *v, slabs *olds, slabs *news, int copy)
{
    char *cdst;
    const char *csrc;
    int n = baseline_msgs(v, olds, news, v->msgs, &cdst, &csrc);
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    BENCH_NCCL(ncclGroupStart());
    for (int i = 0; i < n; i++) {
        const bmsg *m = &v->msgs[i];
        if (m->send)
            BENCH_NCCL(ncclSend(m->buf, (size_t)m->len, ncclInt8, m->peer, g_nc, g_ns[0]));
        else
            BENCH_NCCL(ncclRecv(m->buf, (size_t)m->len, ncclInt8, m->peer, g_nc, g_ns[0]));
    }
    BENCH_NCCL(ncclGroupEnd());
    if (copy && cdst != NULL)
        BENCH_CUDA(
            cudaMemcpyAsync(cdst, csrc, (size_t)v->local, cudaMemcpyDeviceToDevice, g_ns[1]));
    BENCH_CUDA(cudaStreamSynchronize(g_ns[0]));
    BENCH_CUDA(cudaStreamSynchronize(g_ns[1]));
    double t = MPI_Wtime() - t0, tmax = 0;
    MPI_Allreduce(&t, &tmax, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    return tmax;
}
#endif

/* The baseline of the backend in use: plain MPI, or plain NCCL. */
static double baseline_any(const volumes *v, slabs *olds, slabs *news, int copy)
{
#if defined(TIDE_HAVE_NCCL)
    if (g_nccl)
        return baseline_nccl(v, olds, news, copy);
#endif
    return baseline(v, olds, news, copy);
}

/* The plan without its local copies: the executor's network phase alone. */
static int network_plan(const tide_plan_t *plan, tide_plan_t *out)
{
    memset(out, 0, sizeof *out);
    out->items = tide_calloc(plan->n ? plan->n : 1, sizeof *out->items);
    if (out->items == NULL)
        return -1;
    for (size_t i = 0; i < plan->n; i++)
        if (plan->items[i].src != plan->items[i].dst)
            out->items[out->n++] = plan->items[i];
    out->summary = plan->summary;
    out->summary.bytes_local = 0;
    out->summary.n_copies = 0;
    return 0;
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

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* One timed tide_reshard_execute; returns the slowest rank's seconds, or -1. */
static double exec_once(tide_coll_comm_t *comm, const tide_plan_t *plan,
                        const tide_collection_t *col, slabs *olds, slabs *news,
                        const tide_exec_opts *o, result *r)
{
    tide_exec_args a = {.plan = plan,
                        .n_workers = (size_t)np,
                        .n_tensors = tide_collection_size(col),
                        .old_bufs = (void *const *const *)olds->ptr,
                        .new_bufs = (void *const *const *)news->ptr,
                        .old_bytes = (const uint64_t *const *)olds->size,
                        .new_bytes = (const uint64_t *const *)news->size};
    tide_exec_stats st;
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    tide_status s = tide_reshard_execute(comm, &a, o, &st);
    double t = MPI_Wtime() - t0, tmax = 0;
    if (s != TIDE_OK) {
        TIDE_ERROR(BENCH, "%s: execute failed: %s", r->pair, tide_last_error());
        MPI_Abort(MPI_COMM_WORLD, 1); /* the others may be inside the executor */
    }
    MPI_Allreduce(&t, &tmax, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    uint64_t peak = 0, sent = 0, direct = 0;
    MPI_Allreduce(&st.peak_staging, &peak, 1, MPI_UINT64_T, MPI_MAX, MPI_COMM_WORLD);
    MPI_Allreduce(&st.bytes_sent, &sent, 1, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD);
    MPI_Allreduce(&st.bytes_direct, &direct, 1, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD);
    r->direct = direct;
    if (peak > r->peak_staging)
        r->peak_staging = peak;
    if (sent != r->sent) {
        TIDE_ERROR(BENCH, "%s: executor sent %llu bytes, plan says %llu", r->pair,
                   (unsigned long long)sent, (unsigned long long)r->sent);
        return -1;
    }
    return tmax;
}

static int run_one(tide_coll_comm_t *comm, const pair_spec *ps, const tide_collection_t *col,
                   uint64_t cap, uint64_t chunk, uint64_t pack, int reps, result *r)
{
    tide_layout_t *ol = NULL, *nl = NULL;
    tide_plan_t *plan = NULL, net;
    slabs olds, news;
    volumes v;
    memset(&olds, 0, sizeof olds);
    memset(&news, 0, sizeof news);
    memset(&v, 0, sizeof v);
    memset(&net, 0, sizeof net);
    double *samples = NULL;
    int rc = -1;
    int L = tide_collection_num_layers(col);
    /* every rank of this machine is a worker on one host, as tided would offer them */
    tide_place_worker pw[64];
    for (int w = 0; w < np && w < 64; w++)
        pw[w] = (tide_place_worker){w, g_host[w]};
    tide_place_request pr = {.dp = ps->ndp,
                             .tp = ps->ntp,
                             .pp = ps->npp,
                             .micro_batches = 1,
                             .stage_start = NULL,
                             .workers = pw,
                             .n_workers = (size_t)(np < 64 ? np : 64),
                             .tp_across_hosts = 0};
    if (tide_layout_new(&ol, ps->odp, ps->otp, ps->opp, L, 1) != TIDE_OK ||
        (g_optimal ? tide_reshard_place(ol, col, &pr, &nl)
                   : tide_reshard_place_default(col, &pr, &nl)) != TIDE_OK ||
        tide_reshard_plan(ol, nl, col, NULL, 0, &plan) != TIDE_OK) {
        TIDE_ERROR(BENCH, "%s: planning failed: %s", ps->name, tide_last_error());
        goto out;
    }
    r->cross = r->cross_default = cross_bytes(plan);
    r->cross_out_max = cross_out_max(plan);
    if (g_optimal) {
        tide_layout_t *dl = NULL;
        tide_plan_t *dplan = NULL;
        if (tide_reshard_place_default(col, &pr, &dl) == TIDE_OK &&
            tide_reshard_plan(ol, dl, col, NULL, 0, &dplan) == TIDE_OK)
            r->cross_default = cross_bytes(dplan);
        tide_plan_destroy(&dplan);
        tide_layout_destroy(&dl);
    }
    int bad = make_slabs(ol, col, &olds, 0x5a) || make_slabs(nl, col, &news, 0) ||
              volumes_new(plan, &olds, &v) || network_plan(plan, &net);
    samples = tide_calloc((size_t)reps * M_COUNT, sizeof *samples);
    bad = bad || samples == NULL;
    int any_bad = 0;
    MPI_Allreduce(&bad, &any_bad, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (any_bad) {
        TIDE_ERROR(BENCH, "%s: out of memory for the shards (lower --max-mib)", ps->name);
        goto out;
    }
    r->pair = ps->name;
    r->state = tide_collection_bytes(col);
    r->sent = plan->summary.bytes_sent;
    r->local = plan->summary.bytes_local;
    r->cap = cap;
    tide_exec_opts o;
    tide_exec_opts_init(&o);
    o.staging_cap = cap;
    if (chunk)
        o.max_chunk = chunk;
    if (pack)
        o.pack_below = pack;
    /* Interleaved: repetition k runs the four measurements starting from a different
       one, so machine load and cache state hit every measurement alike. */
    for (int k = 0; k < reps; k++)
        for (int j = 0; j < M_COUNT; j++) {
            int m = (j + k) % M_COUNT;
            double t = -1;
            switch (m) {
            case M_MPI:
                t = baseline_any(&v, &olds, &news, 0);
                break;
            case M_MPI_COPY:
                t = baseline_any(&v, &olds, &news, 1);
                break;
            case M_EXEC_NET:
                t = exec_once(comm, &net, col, &olds, &news, &o, r);
                break;
            default:
                t = exec_once(comm, plan, col, &olds, &news, &o, r);
                break;
            }
            if (t < 0)
                goto out;
            samples[(size_t)m * (size_t)reps + (size_t)k] = t;
        }
    for (int m = 0; m < M_COUNT; m++) {
        double *x = samples + (size_t)m * (size_t)reps;
        qsort(x, (size_t)reps, sizeof *x, cmp_double);
        r->min[m] = x[0];
        r->max[m] = x[reps - 1];
        r->med[m] = reps % 2 ? x[reps / 2] : (x[reps / 2 - 1] + x[reps / 2]) / 2;
    }
    /* A plan that sends nothing (every byte already on its worker) has no network phase
       to compare: its ratios against point-to-point are not defined (-1, shown as -). */
    r->ratio_net = r->sent > 0 ? r->med[M_MPI] / r->med[M_EXEC_NET] : -1.0;
    r->ratio_e2e = r->med[M_MPI_COPY] / r->med[M_EXEC];
    r->ratio_p2p = r->sent > 0 ? r->med[M_MPI] / r->med[M_EXEC] : -1.0;
    r->ok = 1;
    rc = 0;
out:
    tide_free(samples);
    tide_free(net.items);
    volumes_free(&v);
    free_slabs(&olds);
    free_slabs(&news);
    tide_plan_destroy(&plan);
    tide_layout_destroy(&ol);
    tide_layout_destroy(&nl);
    return rc;
}

/* 0 when the numbers are in path. */
static int write_json(const char *path, const result *res, int n, long long cap_mib)
{
    FILE *f = bench_out_open("reshard_bench", path);
    if (f == NULL)
        return -1;
    fprintf(
        f,
        "{\n  \"benchmark\": \"reshard_bench\",\n  \"backend\": \"%s\",\n  \"baseline\": \"%s\",\n"
        "  \"ranks\": %d,\n  \"staging_cap_mib\": %lld,\n"
        "  \"placement\": \"%s\",\n  \"results\": [\n",
        g_be->name, g_nccl ? "ncclSend/ncclRecv" : "MPI_Isend/MPI_Irecv", np, cap_mib,
        g_optimal ? "optimal" : "default");
    for (int i = 0; i < n; i++) {
        const result *r = &res[i];
        fprintf(f,
                "    {\"pair\": \"%s\", \"state_bytes\": %llu, \"bytes_sent\": %llu, "
                "\"bytes_local\": %llu, ",
                r->pair, (unsigned long long)r->state, (unsigned long long)r->sent,
                (unsigned long long)r->local);
        for (int m = 0; m < M_COUNT; m++)
            fprintf(f, "\"%s_s\": {\"median\": %.6f, \"min\": %.6f, \"max\": %.6f}, ", m_names[m],
                    r->med[m], r->min[m], r->max[m]);
        if (r->sent > 0)
            fprintf(f,
                    "\"%s_gbs\": %.3f, \"exec_net_gbs\": %.3f, \"ratio_net\": %.3f, "
                    "\"ratio_p2p\": %.3f, ",
                    m_names[M_MPI], (double)r->sent / r->med[M_MPI] / 1e9,
                    (double)r->sent / r->med[M_EXEC_NET] / 1e9, r->ratio_net, r->ratio_p2p);
        else /* nothing sent: no network phase to compare */
            fprintf(f,
                    "\"%s_gbs\": null, \"exec_net_gbs\": null, \"ratio_net\": null, "
                    "\"ratio_p2p\": null, ",
                    m_names[M_MPI]);
        double share = link_share(r);
        const char *met = share < LINK_BOUND || r->sent == 0 ? "null"
                          : r->ratio_net >= X_GOAL           ? "true"
                                                             : "false";
        fprintf(f,
                "\"ratio_e2e\": %.3f, \"peak_staging\": %llu, \"staging_cap\": %llu, "
                "\"bytes_direct\": %llu, \"hosts\": %d, \"bytes_cross_host\": %llu, "
                "\"bytes_cross_host_rank_order\": %llu, \"cross_host_out_max\": %llu, "
                "\"link_bytes_per_s\": %.0f, \"link_share\": %.3f, \"link_bound\": %s, "
                "\"cross_host_goal\": %.2f, \"cross_host_goal_met\": %s}%s\n",
                r->ratio_e2e, (unsigned long long)r->peak_staging, (unsigned long long)r->cap,
                (unsigned long long)r->direct, g_hosts, (unsigned long long)r->cross,
                (unsigned long long)r->cross_default, (unsigned long long)r->cross_out_max,
                g_link_Bps, share, share >= LINK_BOUND ? "true" : "false", X_GOAL, met,
                i + 1 < n ? "," : "");
    }
    fprintf(f, "  ]\n}\n");
    return fclose(f) == 0 ? 0 : -1;
}

int main(int argc, char **argv)
{
    long long probe_mib = 64;
    long long min_mib = 64, max_mib = 2048, cap_mib = 256, chunk_mib = 0, reps = 5, pack_kib = 0,
              piece_mib = 1024, only_pair = -1;
    const char *out = NULL, *log = NULL, *placement = NULL, *backend = NULL;
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
        {"base-piece-mib", "TIDE_BENCH_BASE_PIECE_MIB", TIDE_OPT_INT, &piece_mib, "1024",
         "largest baseline message (MiB)", 1, 1024},
        {"placement", "TIDE_BENCH_PLACEMENT", TIDE_OPT_STRING, &placement, "optimal",
         "new layout's map: optimal (fewest bytes, tided's default) or default (rank order)", 0, 0},
        {"pair", "TIDE_BENCH_PAIR", TIDE_OPT_INT, &only_pair, "-1",
         "run only this layout pair (0 DP, 1 TP, 2 PP, 3 (2,2,2), 4 (1,4,2)); -1: all", -1, 4},
        {"probe-mib", "TIDE_BENCH_PROBE_MIB", TIDE_OPT_INT, &probe_mib, "64",
         "across hosts: bytes each way of the link-rate probe (MiB)", 1, 1 << 14},
        {"reps", "TIDE_BENCH_REPS", TIDE_OPT_INT, &reps, "5",
         "repetitions, interleaved (the median is reported)", 1, 1000},
        {"backend", "TIDE_BENCH_BACKEND", TIDE_OPT_STRING, &backend, "mpi",
         "mpi (host memory, against plain MPI) or nccl (device memory, against plain NCCL)", 0, 0},
        {"out", "TIDE_BENCH_OUT", TIDE_OPT_STRING, &out, NULL,
         "where the numbers go (JSON); default bench-out/reshard_bench.json, "
         "bench-out/reshard_bench_nccl.json for nccl",
         0, 0},
        {"log", "TIDE_LOG", TIDE_OPT_STRING, &log, NULL, "log level", 0, 0},
        {NULL, NULL, 0, NULL, NULL, NULL, 0, 0},
    };
    int provided = 0;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    MPI_Comm_size(MPI_COMM_WORLD, &np);
    {
        /* hosts by hostname, numbered in rank order of first appearance */
        char(*names)[64] = tide_calloc((size_t)np, 64);
        char mine[64] = "";
        gethostname(mine, sizeof mine - 1);
        if (names != NULL) {
            MPI_Allgather(mine, 64, MPI_CHAR, names, 64, MPI_CHAR, MPI_COMM_WORLD);
            g_hosts = 0;
            for (int w = 0; w < np && w < 64; w++) {
                int h = g_hosts;
                for (int v = 0; v < w; v++)
                    if (strcmp(names[v], names[w]) == 0) {
                        h = g_host[v];
                        break;
                    }
                g_host[w] = h;
                g_hosts += h == g_hosts;
            }
            tide_free(names);
        }
    }
    tide_status rc = tide_opts_parse(opts, argc, argv, &npos, &help);
    if (rc != TIDE_OK || help) {
        if (me == 0 && rc == TIDE_OK && help == TIDE_OPTS_VERSION)
            tide_version_print(stdout, "reshard_bench");
        else if (me == 0) {
            if (rc != TIDE_OK)
                fprintf(stderr, "reshard_bench: %s\n", tide_last_error());
            tide_opts_usage(stderr, "mpirun -np 8 reshard_bench", "[options]", opts);
        }
        MPI_Finalize();
        return rc != TIDE_OK ? 2 : 0;
    }
    PIECE = (uint64_t)piece_mib << 20;
    if (strcmp(placement, "optimal") != 0 && strcmp(placement, "default") != 0) {
        if (me == 0)
            fprintf(stderr, "reshard_bench: --placement takes optimal or default, not %s\n",
                    placement);
        MPI_Finalize();
        return 2;
    }
    g_optimal = strcmp(placement, "optimal") == 0;
    if (strcmp(backend, "mpi") != 0 && strcmp(backend, "nccl") != 0) {
        if (me == 0)
            fprintf(stderr, "reshard_bench: --backend takes mpi or nccl, not %s\n", backend);
        MPI_Finalize();
        return 2;
    }
    g_nccl = strcmp(backend, "nccl") == 0;
#if !defined(TIDE_HAVE_NCCL)
    if (g_nccl) {
        if (me == 0)
            fprintf(stderr, "reshard_bench: --backend nccl: this build has no NCCL (built "
                            "without CUDA/NCCL, or with -DTIDE_CUDA=OFF)\n");
        MPI_Finalize();
        return 2;
    }
#endif
    if (g_nccl)
        m_names = m_names_nccl;
    if (out == NULL)
        out = g_nccl ? "bench-out/reshard_bench_nccl.json" : "bench-out/reshard_bench.json";
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
    /* the rank's device, as libtide picks it: TIDE_DEVICE, else its index on the host */
    g_dev = 0;
    {
        const char *d = getenv("TIDE_DEVICE");
        MPI_Comm node;
        if (d != NULL && d[0] != '\0')
            g_dev = atoi(d);
        else if (MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL,
                                     &node) == MPI_SUCCESS) {
            MPI_Comm_rank(node, &g_dev);
            MPI_Comm_free(&node);
        }
    }
    if (tide_coll_backend_find(backend, &be) != TIDE_OK ||
        tide_coll_device_bind(be, g_dev) != TIDE_OK ||
        tide_coll_pool_new(&pool, MPI_COMM_WORLD) != TIDE_OK ||
        tide_coll_comm_new(&comm, be, pool, &cp) != TIDE_OK) {
        fprintf(stderr, "reshard_bench: %s\n", tide_last_error());
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    g_be = be;
#if defined(TIDE_HAVE_NCCL)
    if (g_nccl)
        nccl_baseline_init();
#endif
    if (g_hosts > 1)
        g_link_Bps = probe_link((uint64_t)probe_mib << 20);
    result res[64];
    int nres = 0;
    if (me == 0) {
        printf("reshard_bench: %d ranks, %s backend (baseline: plain %s), staging cap %lld MiB, "
               "%s placement\n",
               np, be->name, g_nccl ? "NCCL send/recv" : "MPI point-to-point", cap_mib, placement);
        if (g_hosts > 1)
            printf("%d hosts, link %.1f MB/s each way (measured): under each row, the bytes "
                   "sent between hosts with this placement and with the plain rank order, and "
                   "the cross-host goal (r_net >= %.1f when the link is the bottleneck)\n",
                   g_hosts, g_link_Bps / 1e6, X_GOAL);
        printf("%-18s %8s %8s %8s %8s %8s %8s %8s %9s %6s %6s %6s %9s %8s\n", "pair", "state",
               "sent", "local", g_nccl ? "nccl s" : "mpi s", g_nccl ? "ncl+cp s" : "mpi+cp s",
               "net s", "exec s", "net GB/s", "r_net", "r_e2e", "r_p2p", "peak stg", "direct");
    }
    int failed = 0;
    for (long long mib = min_mib; mib <= max_mib && nres < 60; mib *= 2) {
        tide_collection_t *col = NULL;
        if (model_for((uint64_t)mib << 20, &col) != 0) {
            failed = 1;
            break;
        }
        for (size_t k = 0; k < sizeof pairs / sizeof pairs[0]; k++) {
            if (only_pair >= 0 && (size_t)only_pair != k)
                continue;
            result *r = &res[nres];
            memset(r, 0, sizeof *r);
            if (run_one(comm, &pairs[k], col, (uint64_t)cap_mib << 20, (uint64_t)chunk_mib << 20,
                        (uint64_t)pack_kib << 10, (int)reps, r) != 0) {
                failed = 1;
                continue;
            }
            nres++;
            if (me == 0) {
                char gbs[16] = "        -", rn[16] = "     -", rp[16] = "     -";
                if (r->sent > 0) {
                    snprintf(gbs, sizeof gbs, "%9.2f", (double)r->sent / r->med[M_EXEC_NET] / 1e9);
                    snprintf(rn, sizeof rn, "%6.2f", r->ratio_net);
                    snprintf(rp, sizeof rp, "%6.2f", r->ratio_p2p);
                }
                printf("%-18s %4.0f MiB %4.0f MiB %4.0f MiB %8.4f %8.4f %8.4f %8.4f %s %s "
                       "%6.2f %s %5.0f MiB %4.0f MiB%s\n",
                       r->pair, (double)r->state / 1048576.0, (double)r->sent / 1048576.0,
                       (double)r->local / 1048576.0, r->med[M_MPI], r->med[M_MPI_COPY],
                       r->med[M_EXEC_NET], r->med[M_EXEC], gbs, rn, r->ratio_e2e, rp,
                       (double)r->peak_staging / 1048576.0, (double)r->direct / 1048576.0,
                       r->peak_staging <= r->cap ? "" : " (over cap!)");
                if (g_hosts > 1) {
                    double share = link_share(r);
                    char goal[160];
                    if (r->cross == 0)
                        snprintf(goal, sizeof goal, "nothing crosses hosts: no cross-host goal");
                    else if (share < LINK_BOUND)
                        snprintf(
                            goal, sizeof goal,
                            "not link-bound (the link takes %.0f%% of the baseline's time): no "
                            "cross-host goal",
                            100.0 * share);
                    else
                        snprintf(
                            goal, sizeof goal,
                            "link-bound (%.0f%% of the baseline's time): goal r_net >= %.1f %s",
                            100.0 * share, X_GOAL, r->ratio_net >= X_GOAL ? "met" : "NOT met");
                    printf("%-18s across hosts %4.0f MiB, rank order %4.0f MiB; %s\n", "",
                           (double)r->cross / 1048576.0, (double)r->cross_default / 1048576.0,
                           goal);
                }
                fflush(stdout);
            }
        }
        tide_collection_destroy(&col);
    }
    if (me == 0) {
        if (write_json(out, res, nres, cap_mib) == 0)
            printf("numbers written to %s\n", out);
        else
            failed = 1;
    }
#if defined(TIDE_HAVE_NCCL)
    if (g_nccl)
        nccl_baseline_fini();
#endif
    tide_coll_comm_destroy(&comm);
    tide_coll_pool_destroy(&pool);
    MPI_Finalize();
    return failed ? 1 : 0;
}
