/*
 * The collectives conformance suite: one program run against every backend
 * (--backend mpi under mpirun -np 2, 4, 8; --backend nccl on one GPU from
 * scripts/gpu-check.sh). Every check compares exact bytes: reductions use small
 * integers that every dtype, bf16 included, represents exactly.
 *
 * Covered: backend lookup; communicators over the pool, reversed and shuffled
 * subsets, argument errors, allocation failures; allreduce (sum, max; f32, f64,
 * bf16, i32, i64) over sizes including 0 and sizes not divisible by the rank count,
 * in place and not; reduce-scatter; allgather; broadcast from every root; barrier;
 * colour splits (nested, and colour -1); grouped p2p (ring, all-to-all with random
 * sizes including 0 and self, several messages per peer, start/test); abort while a
 * peer never arrives (error within 1 s of the abort); a creation cancelled while a
 * member never arrives (within 1 s of the cancel flag, not the timeout); the mpi backend's
 * single-copy path (strided sender -> contiguous receiver and the reverse, with the other end's
 * layout given, runs of 1 B to more than a page, sizes around the threshold, bit-exact with the
 * gaps untouched, the backend's byte count proving the path was used; TIDE_COLL_CMA=0
 * falling back to the plain path; size and layout disagreements giving
 * TIDE_ERR_PROTOCOL at both ends; abort while a push is pending); the reshard executor on random
 * hand-made strided plans and, when reshard/ is built, on random planner plans, with
 * the gathered state bit-identical, progress reported and staging under the cap; the
 * executor's argument and allocation-failure agreement; a failure once data moves (an
 * injected device copy error, through a recording wrapper of the backend) aborting the
 * communicator before the cleanup's device work (staging freed, spilled shards copied
 * back), which restores the old shards.
 *
 * Sizes are small so that 8 oversubscribed ranks on 2 cores finish in seconds.
 */
#include <mpi.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "collectives/collectives.h"
#include "collectives/executor.h"
#include "core/alloc.h"
#include "core/clock.h"
#include "core/error.h"
#include "mpi_test.h"
#ifdef TIDE_HAVE_CUDA
#include "gpu_test.h"
#endif

static const tide_coll_backend_v1 *be;
static tide_coll_pool_t *pool;
static int me, np;
static uint64_t seed = 12345;
static int next_tag = 1; /* creation tags; advanced identically on every rank */

/* ---- helpers ---------------------------------------------------------------------- */

/* Deterministic generator: every rank draws the same numbers from the same state. */
static uint64_t rng_next(uint64_t *s)
{
    uint64_t x = *s;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return *s = x;
}

static uint64_t rng_below(uint64_t *s, uint64_t n)
{
    return n ? rng_next(s) % n : 0;
}

static void *dalloc(size_t bytes)
{
    void *p = NULL;
    MT_OK(be->mem_alloc(bytes, &p));
    return p;
}

static void put(void *dev, const void *host, size_t bytes)
{
    MT_OK(be->copy_host(dev, host, bytes, 0, NULL));
}

static void get(void *host, const void *dev, size_t bytes)
{
    MT_OK(be->copy_host(host, dev, bytes, 1, NULL));
}

static tide_coll_comm_t *make_comm(const int *members, int n)
{
    tide_coll_comm_params p = {
        .members = members, .n_members = n, .tag = next_tag++, .timeout_ms = 20000};
    tide_coll_comm_t *c = NULL;
    MT_OK(tide_coll_comm_new(&c, be, pool, &p));
    return c;
}

static tide_coll_comm_t *world_comm(void)
{
    int *m = malloc(sizeof(int) * (size_t)np);
    for (int i = 0; i < np; i++)
        m[i] = i;
    tide_coll_comm_t *c = make_comm(m, np);
    free(m);
    return c;
}

/* Small integer that every dtype represents exactly. */
static int val(int rank, size_t i, int op)
{
    int v = (int)((rank * 7 + i * 13 + (i >> 3)) % 16);
    return op == TIDE_RED_MAX ? v - 8 : v;
}

static void set_elem(void *buf, tide_dtype dt, size_t i, int v)
{
    switch (dt) {
    case TIDE_F32:
        ((float *)buf)[i] = (float)v;
        break;
    case TIDE_F64:
        ((double *)buf)[i] = (double)v;
        break;
    case TIDE_I32:
        ((int32_t *)buf)[i] = v;
        break;
    case TIDE_I64:
        ((int64_t *)buf)[i] = v;
        break;
    case TIDE_BF16: {
        float f = (float)v;
        uint32_t u;
        memcpy(&u, &f, sizeof u);
        ((uint16_t *)buf)[i] = (uint16_t)(u >> 16); /* exact for small integers */
        break;
    }
    default:
        MT_FAIL("dtype %d", (int)dt);
    }
}

static size_t esize(tide_dtype dt)
{
    return dt == TIDE_F64 || dt == TIDE_I64 ? 8 : dt == TIDE_BF16 ? 2 : 4;
}

static const tide_dtype dtypes[] = {TIDE_F32, TIDE_F64, TIDE_BF16, TIDE_I32, TIDE_I64};

/* Sizes including 0, 1, and sizes not divisible by the rank count. */
static size_t sizes[8];
static int n_sizes;

static void make_sizes(uint64_t *s)
{
    n_sizes = 0;
    sizes[n_sizes++] = 0;
    sizes[n_sizes++] = 1;
    sizes[n_sizes++] = (size_t)np + 1;
    sizes[n_sizes++] = (size_t)np * 7 + 3;
    sizes[n_sizes++] = 1 + (size_t)rng_below(s, 3000);
    if (np > 1)
        sizes[n_sizes++] = (size_t)np - 1;
}

/* ---- lookup and communicators -------------------------------------------------------- */

static void test_lookup(void)
{
    const tide_coll_backend_v1 *b = NULL;
    MT_OK(tide_coll_backend_find("mpi", &b));
    MT_ASSERT(b && strcmp(b->name, "mpi") == 0 && b->mem_kind == TIDE_MEM_HOST &&
                  b->version == TIDE_COLL_BACKEND_VERSION,
              "mpi backend table");
    MT_ASSERT(tide_coll_backend_find("gloo", &b) == TIDE_ERR_NOT_FOUND && b == NULL,
              "unknown backend must be NOT_FOUND");
    MT_ASSERT(strstr(tide_last_error(), "mpi") != NULL, "detail lists the built backends: %s",
              tide_last_error());
    MT_ASSERT(tide_coll_backend_find(NULL, &b) == TIDE_ERR_INVALID, "NULL name");
#ifdef TIDE_HAVE_NCCL
    MT_OK(tide_coll_backend_find("nccl", &b));
    MT_ASSERT(b->mem_kind == TIDE_MEM_DEVICE, "nccl is device memory");
#else
    MT_ASSERT(tide_coll_backend_find("nccl", &b) == TIDE_ERR_NOT_FOUND, "nccl not built");
#endif
    MT_ASSERT(tide_coll_backend_has_dtype(be, TIDE_F32) &&
                  tide_coll_backend_has_dtype(be, TIDE_I64),
              "f32 and i64");
    MT_ASSERT(!tide_coll_backend_has_dtype(be, TIDE_U8), "u8 is not a reduction dtype");
    mt_pass("lookup");
}

static void test_comm_basics(void)
{
    tide_coll_comm_t *c = world_comm();
    MT_ASSERT(tide_coll_comm_rank(c) == me && tide_coll_comm_size(c) == np, "world ranks");
    for (int r = 0; r < np; r++)
        MT_ASSERT(tide_coll_comm_pool_rank(c, r) == r, "pool rank of %d", r);
    MT_ASSERT(tide_coll_comm_pool_rank(c, np) == -1, "out of range pool rank");
    MT_ASSERT(tide_coll_comm_backend(c) == be && !tide_coll_comm_aborted(c), "backend, state");
    tide_coll_comm_destroy(&c);
    MT_ASSERT(c == NULL, "destroy nulls the pointer");
    tide_coll_comm_destroy(&c); /* NULL is fine */

    int *rev = malloc(sizeof(int) * (size_t)np);
    for (int i = 0; i < np; i++)
        rev[i] = np - 1 - i;
    c = make_comm(rev, np);
    MT_ASSERT(tide_coll_comm_rank(c) == np - 1 - me, "reversed order gives reversed ranks");
    tide_coll_comm_destroy(&c);

    /* Argument errors are local and immediate. */
    tide_coll_comm_params p = {.members = rev, .n_members = np, .tag = 5};
    if (np > 1) {
        rev[1] = rev[0];
        MT_ASSERT(tide_coll_comm_new(&c, be, pool, &p) == TIDE_ERR_INVALID && c == NULL,
                  "duplicate member");
        MT_ASSERT(strstr(tide_last_error(), "twice") != NULL, "detail: %s", tide_last_error());
    }
    int other[1] = {(me + 1) % np};
    p.members = other;
    p.n_members = 1;
    if (np > 1)
        MT_ASSERT(tide_coll_comm_new(&c, be, pool, &p) == TIDE_ERR_INVALID, "caller not a member");
    int bad[1] = {np + 3};
    p.members = bad;
    MT_ASSERT(tide_coll_comm_new(&c, be, pool, &p) == TIDE_ERR_INVALID, "member out of range");
    int self[1] = {me};
    p.members = self;
    p.tag = 999999;
    MT_ASSERT(tide_coll_comm_new(&c, be, pool, &p) == TIDE_ERR_RANGE, "tag out of range");
    free(rev);

    /* Allocation failures: every member fails at the same allocation, before any
       message, so nobody is left waiting; each failure is a clean NOMEM. */
    int *all = malloc(sizeof(int) * (size_t)np);
    for (int i = 0; i < np; i++)
        all[i] = i;
    for (long k = 1; k < 50; k++) {
        tide_alloc_fail_at(k, 0);
        tide_coll_comm_params q = {.members = all, .n_members = np, .tag = next_tag++};
        tide_status rc = tide_coll_comm_new(&c, be, pool, &q);
        long failed = tide_alloc_failures();
        tide_alloc_fail_at(0, 0);
        if (failed == 0) {
            MT_OK(rc);
            break;
        }
        MT_ASSERT(rc == TIDE_ERR_NOMEM && c == NULL, "allocation %ld failing gives %s", k,
                  tide_status_name(rc));
    }
    MT_ASSERT(c != NULL, "creation succeeds once allocations do");
    MT_OK(tide_coll_barrier(c, NULL));
    tide_coll_comm_destroy(&c);
    free(all);
    mt_pass("communicators");
}

/* ---- collectives ---------------------------------------------------------------------- */

static void check_allreduce(tide_coll_comm_t *c, const int *members, tide_dtype dt, tide_red_op op,
                            size_t count, int in_place)
{
    int n = tide_coll_comm_size(c);
    size_t es = esize(dt), bytes = count * es;
    unsigned char *h = malloc(bytes + 1), *want = malloc(bytes + 1), *got = malloc(bytes + 1);
    int self = members[tide_coll_comm_rank(c)];
    for (size_t i = 0; i < count; i++) {
        set_elem(h, dt, i, val(self, i, op));
        int acc = op == TIDE_RED_SUM ? 0 : -1000;
        for (int r = 0; r < n; r++) {
            int v = val(members[r], i, op);
            acc = op == TIDE_RED_SUM ? acc + v : (v > acc ? v : acc);
        }
        set_elem(want, dt, i, acc);
    }
    void *ds = dalloc(bytes), *dr = in_place ? ds : dalloc(bytes);
    put(ds, h, bytes);
    MT_OK(tide_coll_allreduce(c, ds, dr, count, dt, op, NULL));
    get(got, dr, bytes);
    MT_ASSERT(memcmp(got, want, bytes) == 0, "allreduce dtype %d op %d count %zu in_place %d", dt,
              op, count, in_place);
    be->mem_free(ds);
    if (!in_place)
        be->mem_free(dr);
    free(h);
    free(want);
    free(got);
}

static void run_collectives(tide_coll_comm_t *c, const int *members, uint64_t *s)
{
    int n = tide_coll_comm_size(c), r = tide_coll_comm_rank(c);
    make_sizes(s);
    for (size_t d = 0; d < sizeof dtypes / sizeof dtypes[0]; d++) {
        if (!tide_coll_backend_has_dtype(be, dtypes[d]))
            continue;
        for (int k = 0; k < n_sizes; k++)
            for (int op = 0; op < 2; op++)
                check_allreduce(c, members, dtypes[d], (tide_red_op)op, sizes[k], k & 1);
    }

    /* reduce-scatter: recv[i] = sum over ranks of send[r * count + i]. */
    for (int k = 0; k < n_sizes; k++) {
        size_t count = sizes[k] % 700, total = count * (size_t)n;
        int32_t *h = malloc(4 * total + 4), *got = malloc(4 * count + 4);
        for (size_t i = 0; i < total; i++)
            h[i] = val(members[r], i, TIDE_RED_SUM);
        void *ds = dalloc(4 * total), *dr = dalloc(4 * count);
        put(ds, h, 4 * total);
        MT_OK(tide_coll_reduce_scatter(c, ds, dr, count, TIDE_I32, TIDE_RED_SUM, NULL));
        get(got, dr, 4 * count);
        for (size_t i = 0; i < count; i++) {
            int32_t want = 0;
            for (int q = 0; q < n; q++)
                want += val(members[q], (size_t)r * count + i, TIDE_RED_SUM);
            MT_ASSERT(got[i] == want, "reduce_scatter count %zu elem %zu: %d != %d", count, i,
                      got[i], want);
        }
        be->mem_free(ds);
        be->mem_free(dr);
        free(h);
        free(got);
    }

    /* allgather, in place and not. */
    for (int k = 0; k < n_sizes; k++) {
        size_t bytes = sizes[k] % 1000;
        unsigned char *mine = malloc(bytes + 1), *all = malloc(bytes * (size_t)n + 1);
        for (size_t i = 0; i < bytes; i++)
            mine[i] = (unsigned char)(members[r] * 31 + i);
        void *dsend = dalloc(bytes), *dall = dalloc(bytes * (size_t)n);
        put(dsend, mine, bytes);
        int in_place = k & 1;
        if (in_place)
            put((char *)dall + (size_t)r * bytes, mine, bytes);
        MT_OK(tide_coll_allgather(c, in_place ? (char *)dall + (size_t)r * bytes : dsend, dall,
                                  bytes, NULL));
        get(all, dall, bytes * (size_t)n);
        for (int q = 0; q < n; q++)
            for (size_t i = 0; i < bytes; i++)
                MT_ASSERT(all[(size_t)q * bytes + i] == (unsigned char)(members[q] * 31 + i),
                          "allgather bytes %zu from rank %d", bytes, q);
        be->mem_free(dsend);
        be->mem_free(dall);
        free(mine);
        free(all);
    }

    /* broadcast from every root. */
    for (int root = 0; root < n; root++) {
        size_t bytes = root == 0 ? 0 : root == 1 ? 1 : (size_t)rng_below(s, 5000);
        unsigned char *h = malloc(bytes + 1);
        for (size_t i = 0; i < bytes; i++)
            h[i] = r == root ? (unsigned char)(root + i * 7) : 0xAB;
        void *d = dalloc(bytes);
        put(d, h, bytes);
        MT_OK(tide_coll_broadcast(c, d, bytes, root, NULL));
        get(h, d, bytes);
        for (size_t i = 0; i < bytes; i++)
            MT_ASSERT(h[i] == (unsigned char)(root + i * 7), "broadcast root %d byte %zu", root, i);
        be->mem_free(d);
        free(h);
    }
    MT_ASSERT(tide_coll_broadcast(c, NULL, 4, n, NULL) == TIDE_ERR_INVALID, "bad root");
    MT_ASSERT(tide_coll_allreduce(c, NULL, NULL, 4, TIDE_U8, TIDE_RED_SUM, NULL) ==
                  TIDE_ERR_UNSUPPORTED,
              "u8 reduction");
    MT_ASSERT(!tide_coll_comm_aborted(c), "argument errors leave the communicator alive");
    MT_OK(tide_coll_barrier(c, NULL));
}

static void test_collectives(void)
{
    uint64_t s = seed ^ 0x1111;
    tide_coll_comm_t *c = world_comm();
    int *m = malloc(sizeof(int) * (size_t)np);
    for (int i = 0; i < np; i++)
        m[i] = i;
    run_collectives(c, m, &s);

    /* The barrier really waits: rank 0 arrives 100 ms late. */
    if (np > 1) {
        if (me == 0)
            tide_sleep_ms(100);
        uint64_t t0 = tide_now_ns();
        MT_OK(tide_coll_barrier(c, NULL));
        if (me != 0)
            MT_ASSERT(tide_now_ns() - t0 > 60ull * 1000000, "barrier returned before rank 0 came");
    }
    tide_coll_comm_destroy(&c);
    free(m);
    mt_pass("collectives");
}

static void test_subsets(void)
{
    uint64_t s = seed ^ 0x2222;
    /* Evens (reversed) and odds at the same time: creation involves only the members. */
    int members[64], n = 0;
    for (int r = np - 1; r >= 0; r--)
        if (r % 2 == me % 2)
            members[n++] = r;
    tide_coll_comm_t *c = make_comm(members, n);
    MT_ASSERT(tide_coll_comm_size(c) == n && members[tide_coll_comm_rank(c)] == me, "subset rank");
    run_collectives(c, members, &s);
    tide_coll_comm_destroy(&c);
    MPI_Barrier(MPI_COMM_WORLD);

    /* A random subset in random order; the others do not take part at all. */
    int perm[64];
    for (int i = 0; i < np; i++)
        perm[i] = i;
    for (int i = np - 1; i > 0; i--) {
        int j = (int)rng_below(&s, (uint64_t)i + 1), t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    int k = 1 + (int)rng_below(&s, (uint64_t)np);
    int in = 0;
    for (int i = 0; i < k; i++)
        in |= perm[i] == me;
    int tag = next_tag++;
    if (in) {
        tide_coll_comm_params p = {.members = perm, .n_members = k, .tag = tag};
        MT_OK(tide_coll_comm_new(&c, be, pool, &p));
        uint64_t s2 = s;
        run_collectives(c, perm, &s2);
        tide_coll_comm_destroy(&c);
    }
    mt_pass("subsets");
}

static void test_split(void)
{
    tide_coll_comm_t *w = world_comm();
    int color = me % 3, key = -me;
    if (np > 2 && me == 1)
        color = -1;
    tide_coll_comm_t *c = NULL;
    MT_OK(tide_coll_comm_split(w, color, key, &c));
    if (color < 0) {
        MT_ASSERT(c == NULL, "colour -1 gets no communicator");
    } else {
        int expect[64], n = 0;
        for (int r = np - 1; r >= 0; r--) /* key -r: descending pool rank */
            if (r % 3 == color && !(np > 2 && r == 1))
                expect[n++] = r;
        MT_ASSERT(tide_coll_comm_size(c) == n, "split size %d != %d", tide_coll_comm_size(c), n);
        for (int i = 0; i < n; i++)
            MT_ASSERT(tide_coll_comm_pool_rank(c, i) == expect[i], "split rank %d is pool %d", i,
                      tide_coll_comm_pool_rank(c, i));
        uint64_t s = seed ^ 0x3333;
        run_collectives(c, expect, &s);
        /* Nested: split the split in two halves by position. */
        tide_coll_comm_t *cc = NULL;
        int half = tide_coll_comm_rank(c) < n / 2;
        MT_OK(tide_coll_comm_split(c, half, 0, &cc));
        int64_t one = 1, cnt = 0;
        void *d = dalloc(8);
        put(d, &one, 8);
        MT_OK(tide_coll_allreduce(cc, d, d, 1, TIDE_I64, TIDE_RED_SUM, NULL));
        get(&cnt, d, 8);
        be->mem_free(d);
        MT_ASSERT(cnt == (half ? n / 2 : n - n / 2), "nested split size %lld", (long long)cnt);
        tide_coll_comm_destroy(&cc);
    }
    tide_coll_comm_destroy(&c);
    tide_coll_comm_destroy(&w);
    mt_pass("split");
}

/* ---- grouped p2p ------------------------------------------------------------------------ */

static size_t pair_size(uint64_t salt, int src, int dst)
{
    uint64_t s =
        seed ^ salt ^ ((uint64_t)src << 20) ^ ((uint64_t)dst << 40) ^ 0x9E3779B97F4A7C15ull;
    rng_next(&s);
    uint64_t v = rng_next(&s) % 8;
    return v == 0 ? 0 : (size_t)(rng_next(&s) % 4000);
}

static unsigned char pat(int src, int dst, size_t i, int k)
{
    return (unsigned char)(src * 37 + dst * 11 + i * 3 + k * 101);
}

static void test_p2p(void)
{
    tide_coll_comm_t *c = world_comm();
    /* All-to-all with random sizes (0 included), self included, two messages per peer in
       one batch (matched in order). */
    for (int round = 0; round < 3; round++) {
        int nops = 4 * np;
        tide_p2p_op *ops = calloc((size_t)nops, sizeof *ops);
        void **dev = calloc((size_t)nops, sizeof *dev);
        int k = 0;
        for (int p = 0; p < np; p++)
            for (int m = 0; m < 2; m++) {
                size_t sb = pair_size((uint64_t)round * 2 + (uint64_t)m, me, p);
                size_t rb = pair_size((uint64_t)round * 2 + (uint64_t)m, p, me);
                unsigned char *h = malloc(sb + 1);
                for (size_t i = 0; i < sb; i++)
                    h[i] = pat(me, p, i, m);
                dev[k] = dalloc(sb);
                put(dev[k], h, sb);
                free(h);
                ops[k] =
                    (tide_p2p_op){.kind = TIDE_P2P_SEND, .peer = p, .buf = dev[k], .bytes = sb};
                k++;
                dev[k] = dalloc(rb);
                ops[k] =
                    (tide_p2p_op){.kind = TIDE_P2P_RECV, .peer = p, .buf = dev[k], .bytes = rb};
                k++;
            }
        if (round == 2) {
            /* start + test loop instead of the blocking call */
            tide_coll_req_t *req = NULL;
            MT_OK(tide_coll_p2p_start(c, ops, (size_t)k, NULL, &req));
            int done = 0;
            while (!done)
                MT_OK(tide_coll_req_test(c, req, &done));
            tide_coll_req_free(c, &req);
            MT_ASSERT(req == NULL, "req_free nulls");
        } else {
            MT_OK(tide_coll_group_p2p(c, ops, (size_t)k, NULL));
        }
        for (int i = 0; i < k; i++) {
            if (ops[i].kind != TIDE_P2P_RECV)
                continue;
            int p = ops[i].peer, m = (i / 2) % 2;
            unsigned char *h = malloc(ops[i].bytes + 1);
            get(h, ops[i].buf, ops[i].bytes);
            for (size_t j = 0; j < ops[i].bytes; j++)
                MT_ASSERT(h[j] == pat(p, me, j, m), "p2p round %d from %d msg %d byte %zu", round,
                          p, m, j);
            free(h);
        }
        for (int i = 0; i < k; i++)
            be->mem_free(dev[i]);
        free(ops);
        free(dev);
    }
    /* Strided ops (runs of 3 bytes every 5): strided send, contiguous receive, and the
       other way round, with the neighbours; refused where the backend cannot. */
    {
        unsigned char hs[20], hr[20];
        for (int i = 0; i < 20; i++)
            hs[i] = (unsigned char)(me * 50 + i);
        void *ds = dalloc(20), *dr = dalloc(20);
        put(ds, hs, 20);
        memset(hr, 0xEE, 20);
        put(dr, hr, 20);
        int right = (me + 1) % np, left = (me - 1 + np) % np;
        tide_p2p_op ops[4] = {
            {.kind = TIDE_P2P_SEND, .peer = right, .buf = ds, .bytes = 12, .run = 3, .stride = 5},
            {.kind = TIDE_P2P_RECV, .peer = left, .buf = dr, .bytes = 12},
            {.kind = TIDE_P2P_SEND, .peer = right, .buf = ds, .bytes = 12},
            {.kind = TIDE_P2P_RECV, .peer = left, .buf = dr, .bytes = 12, .run = 3, .stride = 5},
        };
        if (be->caps & TIDE_COLL_CAP_STRIDED) {
            MT_OK(tide_coll_group_p2p(c, ops, 2, NULL));
            get(hr, dr, 20);
            for (int i = 0; i < 12; i++)
                MT_ASSERT(hr[i] == (unsigned char)(left * 50 + (i / 3) * 5 + i % 3),
                          "strided send byte %d", i);
            memset(hr, 0xEE, 20);
            put(dr, hr, 20);
            MT_OK(tide_coll_group_p2p(c, ops + 2, 2, NULL));
            get(hr, dr, 20);
            for (int i = 0; i < 20; i++)
                MT_ASSERT(hr[i] == (i % 5 < 3 && i < 18
                                        ? (unsigned char)(left * 50 + (i / 5) * 3 + i % 5)
                                        : 0xEE),
                          "strided receive byte %d", i);
        } else {
            MT_ASSERT(tide_coll_group_p2p(c, ops, 2, NULL) == TIDE_ERR_UNSUPPORTED,
                      "strided op refused");
        }
        be->mem_free(ds);
        be->mem_free(dr);
    }
    /* Bad ops are refused before anything is posted. */
    tide_p2p_op bad = {.kind = TIDE_P2P_SEND, .peer = np};
    MT_ASSERT(tide_coll_group_p2p(c, &bad, 1, NULL) == TIDE_ERR_INVALID, "peer out of range");
    bad.peer = 0;
    bad.bytes = 10;
    MT_ASSERT(tide_coll_group_p2p(c, &bad, 1, NULL) == TIDE_ERR_INVALID, "NULL buffer");
    MT_OK(tide_coll_barrier(c, NULL));
    tide_coll_comm_destroy(&c);
    mt_pass("p2p");
}

/* ---- abort ------------------------------------------------------------------------------- */

struct aborter {
    tide_coll_comm_t *c;
    uint64_t delay_ms, at_ns;
};

static void *abort_later(void *arg)
{
    struct aborter *a = arg;
    tide_sleep_ms(a->delay_ms);
    a->at_ns = tide_now_ns();
    tide_coll_comm_abort(a->c); /* from another thread, as the heartbeat thread does */
    return NULL;
}

static void expect_aborted_within(tide_coll_comm_t *c, int which)
{
    struct aborter a = {c, 150, 0};
    pthread_t th;
    pthread_create(&th, NULL, abort_later, &a);
    tide_status rc;
    void *d = dalloc(4096);
    if (which == 0) {
        rc = tide_coll_allreduce(c, d, d, 1024, TIDE_F32, TIDE_RED_SUM, NULL);
    } else if (which == 1) {
        tide_p2p_op op = {
            .kind = TIDE_P2P_RECV, .peer = 0, .buf = d, .bytes = 100}; /* never sent */
        rc = tide_coll_group_p2p(c, &op, 1, NULL);
    } else {
        rc = tide_coll_barrier(c, NULL);
    }
    uint64_t end = tide_now_ns();
    pthread_join(th, NULL);
    MT_ASSERT(rc == TIDE_ERR_ABORTED, "blocked op %d returned %s, not ABORTED", which,
              tide_status_name(rc));
    MT_ASSERT(end - a.at_ns < 1000ull * 1000000, "op %d returned %.3f s after the abort", which,
              (double)(end - a.at_ns) / 1e9);
    MT_ASSERT(tide_coll_comm_aborted(c), "aborted state");
    uint64_t t0 = tide_now_ns();
    MT_ASSERT(tide_coll_barrier(c, NULL) == TIDE_ERR_ABORTED, "later ops fail");
    MT_ASSERT(tide_now_ns() - t0 < 10ull * 1000000, "and fail at once");
    be->mem_free(d);
}

struct canceller {
    int flag;
    uint64_t at_ns;
};

static void *cancel_later(void *arg)
{
    struct canceller *k = arg;
    tide_sleep_ms(150);
    k->at_ns = tide_now_ns();
    __atomic_store_n(&k->flag, 1, __ATOMIC_RELAXED); /* as libtide's abort of a switch */
    return NULL;
}

/* Creates a communicator over the whole pool while one rank stays away; another thread
   sets the cancel flag after 150 ms: TIDE_ERR_ABORTED within a second of it, long before
   the 60 s timeout. */
static void expect_creation_cancelled(int tag)
{
    int *all = tide_malloc((size_t)np * sizeof *all);
    for (int i = 0; i < np; i++)
        all[i] = i;
    struct canceller k = {0, 0};
    pthread_t th;
    pthread_create(&th, NULL, cancel_later, &k);
    tide_coll_comm_params p = {
        .members = all, .n_members = np, .tag = tag, .timeout_ms = 60000, .cancel = &k.flag};
    tide_coll_comm_t *c = NULL;
    tide_status rc = tide_coll_comm_new(&c, be, pool, &p);
    uint64_t end = tide_now_ns();
    pthread_join(th, NULL);
    MT_ASSERT(rc == TIDE_ERR_ABORTED && c == NULL, "cancelled creation returned %s",
              tide_status_name(rc));
    MT_ASSERT(end - k.at_ns < 1000ull * 1000000, "creation returned %.3f s after the cancel",
              (double)(end - k.at_ns) / 1e9);
    tide_free(all);
}

static void test_abort(void)
{
    /* Abort before anything: immediate error, even with one rank. */
    tide_coll_comm_t *c = world_comm();
    tide_coll_comm_abort(c);
    tide_coll_comm_abort(c); /* idempotent */
    MT_ASSERT(tide_coll_allreduce(c, NULL, NULL, 0, TIDE_F32, TIDE_RED_SUM, NULL) ==
                  TIDE_ERR_ABORTED,
              "op after abort");
    tide_coll_comm_destroy(&c);

    if (np > 1) {
        /* Rank 0 is the peer that never arrives; the others block and are aborted. */
        for (int which = 0; which < 3; which++) {
            c = world_comm();
            if (me != 0)
                expect_aborted_within(c, which);
            MPI_Barrier(MPI_COMM_WORLD);
            tide_coll_comm_abort(c); /* a survivor aborts its copy too */
            tide_coll_comm_destroy(&c);
        }
        /* Creation with a member that never arrives ends at the cancel flag, not at the
           timeout: first the root (pool rank 0) stays away, then the last rank. */
        for (int absent_k = 0; absent_k < 2; absent_k++) {
            int absent = absent_k == 0 ? 0 : np - 1, tag = next_tag++;
            if (me != absent)
                expect_creation_cancelled(tag);
            MPI_Barrier(MPI_COMM_WORLD);
        }
        /* The pool still works: a fresh communicator over everyone. */
        c = world_comm();
        MT_OK(tide_coll_barrier(c, NULL));
        tide_coll_comm_destroy(&c);
    } else if (strcmp(be->name, "mpi") == 0) {
        /* One rank: a receive from itself that is never sent. */
        c = world_comm();
        expect_aborted_within(c, 1);
        tide_coll_comm_destroy(&c);
    }
    mt_pass("abort");
}

/* ---- watch words ------------------------------------------------------------------------- */

struct watcher {
    int word;
    uint64_t at_ns;
};

static void *raise_later(void *arg)
{
    struct watcher *w = arg;
    tide_sleep_ms(150);
    w->at_ns = tide_now_ns();
    __atomic_store_n(&w->word, 1, __ATOMIC_RELAXED); /* as libtide's control thread */
    return NULL;
}

/* A communicator made with a watch word, and one split off it, count as aborted once the
   word is set, without tide_coll_comm_abort: an operation blocked on a peer that never
   comes returns TIDE_ERR_ABORTED within a second of it, so does a split in progress, and
   no communicator is made once it is set. */
static void test_watch(void)
{
    int *all = tide_malloc((size_t)np * sizeof *all);
    for (int i = 0; i < np; i++)
        all[i] = i;
    struct watcher w = {0, 0};
    tide_coll_comm_params p = {.members = all, .n_members = np, .tag = next_tag++,
                               .timeout_ms = 20000, .watch = &w.word};
    tide_coll_comm_t *c = NULL, *half = NULL;
    MT_OK(tide_coll_comm_new(&c, be, pool, &p));
    MT_OK(tide_coll_comm_split(c, me % 2, me, &half));
    MT_ASSERT(!tide_coll_comm_aborted(c) && !tide_coll_comm_aborted(half), "alive before");
    MT_OK(tide_coll_barrier(half, NULL));
    pthread_t th;
    pthread_create(&th, NULL, raise_later, &w);
    tide_status rc = TIDE_OK;
    if (np > 1 && me != 0) {
        /* rank 0 never splits again: the others wait for it until the word is set */
        tide_coll_comm_t *more = NULL;
        rc = tide_coll_comm_split(c, 0, me, &more);
        MT_ASSERT(rc == TIDE_ERR_ABORTED && more == NULL, "a split under a set word: %s",
                  tide_status_name(rc));
    } else if (np == 1 && strcmp(be->name, "mpi") == 0) {
        tide_p2p_op op = {.kind = TIDE_P2P_RECV, .peer = 0, .buf = NULL, .bytes = 0};
        void *d = dalloc(64);
        op.buf = d;
        op.bytes = 16; /* a receive from itself that is never sent */
        rc = tide_coll_group_p2p(c, &op, 1, NULL);
        MT_ASSERT(rc == TIDE_ERR_ABORTED, "a receive under a set word: %s", tide_status_name(rc));
        be->mem_free(d);
    }
    pthread_join(th, NULL);
    if (rc != TIDE_OK)
        MT_ASSERT(tide_now_ns() - w.at_ns < 1000ull * 1000000, "ended %.3f s after the word",
                  (double)(tide_now_ns() - w.at_ns) / 1e9);
    MT_ASSERT(tide_coll_comm_aborted(c) && tide_coll_comm_aborted(half),
              "the communicator and its split count as aborted");
    MT_ASSERT(tide_coll_barrier(half, NULL) == TIDE_ERR_ABORTED, "operations fail at once");
    tide_coll_comm_t *late = NULL;
    p.tag = next_tag++;
    MT_ASSERT(tide_coll_comm_new(&late, be, pool, &p) == TIDE_ERR_ABORTED && late == NULL,
              "no communicator under a set word");
    tide_coll_comm_destroy(&half);
    tide_coll_comm_destroy(&c);
    MPI_Barrier(MPI_COMM_WORLD);
    tide_free(all);
    mt_pass("watch");
}

/* ---- single copy ("direct": the mpi backend's process_vm_writev / readv path) ---------- */

/* 1 when the backend agreed on single copy with comm rank peer at creation. */
static int direct_to(const tide_coll_comm_t *c, int peer)
{
    return be->p2p_direct != NULL && be->p2p_direct(c, peer);
}

static uint64_t direct_bytes(const tide_coll_comm_t *c)
{
    return be->direct_bytes != NULL ? be->direct_bytes(c) : 0;
}

/* Sets (value != NULL) or clears a single-copy setting on every rank; the backend reads
   them at each communicator creation. */
static void cma_env(const char *name, const char *value)
{
    if (value)
        setenv(name, value, 1);
    else
        unsetenv(name);
}

/* Threshold the direct tests run with (bytes): set explicitly so the test knows it. */
#define DIRECT_MIN ((size_t)64 << 10)

/* One message of the direct tests: its size and both ends' layouts (run 0: contiguous). */
typedef struct dmsg {
    size_t bytes, srun, sstride, rrun, rstride;
} dmsg;

static size_t span_of(size_t bytes, size_t run, size_t stride)
{
    return run == 0 || bytes == 0 ? bytes : (bytes / run - 1) * stride + run;
}

static unsigned char dpat(int src, uint64_t salt, size_t j)
{
    return (unsigned char)((size_t)src * 131 + salt * 17 + j * 7 + (j >> 9));
}

static size_t at_of(size_t j, size_t run, size_t stride)
{
    return run ? (j / run) * stride + j % run : j;
}

/* Shapes of a direct test message: which ends are strided. */
enum { SHAPE_RECV_STRIDED, SHAPE_SEND_STRIDED, SHAPE_CONTIGUOUS, SHAPE_BOTH_STRIDED };

/* A message of that shape (the strided ends with runs from 1 byte to more than a page;
   both strided: the receiver's stride differs), sizes just below, at and above
   DIRECT_MIN, or up to 3 MiB more. */
static dmsg draw_dmsg(uint64_t *s, int shape)
{
    static const size_t runs[] = {1, 3, 64, 1000, 2368, 4096, 4099, 9000};
    size_t run = runs[rng_below(s, sizeof runs / sizeof runs[0])];
    size_t stride = run + 1 + (size_t)rng_below(s, run < 64 ? 16 : run);
    size_t nruns;
    switch (rng_below(s, 4)) {
    case 0:
        nruns = (DIRECT_MIN - 1) / run; /* just below the threshold: plain MPI */
        break;
    case 1:
        nruns = (DIRECT_MIN + run - 1) / run; /* at it (or just above) */
        break;
    case 2:
        nruns = (DIRECT_MIN + run - 1) / run + 1;
        break;
    default:
        nruns = (DIRECT_MIN + (size_t)rng_below(s, (uint64_t)3 << 20)) / run + 1;
        break;
    }
    if (nruns < 2)
        nruns = 2;
    dmsg m = {.bytes = nruns * run};
    if (shape == SHAPE_SEND_STRIDED || shape == SHAPE_BOTH_STRIDED) {
        m.srun = run;
        m.sstride = stride;
    }
    if (shape == SHAPE_RECV_STRIDED || shape == SHAPE_BOTH_STRIDED) {
        m.rrun = run;
        m.rstride = shape == SHAPE_BOTH_STRIDED ? stride + 8 : stride;
    }
    return m;
}

/* The same message as drawn by its sender src for this iteration. */
static dmsg dmsg_of(uint64_t salt, int src, int shape)
{
    uint64_t s = seed ^ 0xD1EC7ull ^ (salt * 0x9E3779B97F4A7C15ull) ^ ((uint64_t)src << 33);
    rng_next(&s);
    return draw_dmsg(&s, shape);
}

/* Ring exchanges, each batch: a strided sender's message, a small plain message, a
   strided receiver's, a contiguous one and one strided at both ends to the right
   neighbour, the same five from the left one, with both ends' layouts given. Checks
   every byte and gap, and that exactly the messages of at least DIRECT_MIN went by
   single copy, whatever their layouts (the sender pushes them all). expect_direct 0:
   single copy must be unused. */
#define NMSG 5
static void direct_ring(tide_coll_comm_t *c, int iters, int expect_direct, const char *what)
{
    int right = (me + 1) % np, left = (me - 1 + np) % np;
    uint64_t total = 0;
    for (int it = 0; it < iters; it++) {
        dmsg sm[NMSG], rm[NMSG];
        static const int shape[NMSG] = {SHAPE_SEND_STRIDED, -1, SHAPE_RECV_STRIDED,
                                        SHAPE_CONTIGUOUS, SHAPE_BOTH_STRIDED};
        for (int k = 0; k < NMSG; k++) {
            if (shape[k] < 0)
                continue;
            sm[k] = dmsg_of((uint64_t)it * NMSG + (uint64_t)k, me, shape[k]);
            rm[k] = dmsg_of((uint64_t)it * NMSG + (uint64_t)k, left, shape[k]);
        }
        sm[1] = (dmsg){.bytes = 100 + (size_t)(me % 7)};
        rm[1] = (dmsg){.bytes = 100 + (size_t)(left % 7)};
        if (it == 0) {
            /* once: more than one 16 MiB slice and more than IOV_MAX runs per call */
            sm[0] = rm[0] = (dmsg){
                .bytes = ((size_t)17 << 20) / 2368 * 2368, .srun = 2368, .sstride = 2368 + 64};
        }
        tide_p2p_op ops[2 * NMSG];
        tide_p2p_peer peers[2 * NMSG];
        unsigned char *sb[NMSG], *rb[NMSG];
        size_t rspan[NMSG];
        for (int k = 0; k < NMSG; k++) {
            size_t ss = span_of(sm[k].bytes, sm[k].srun, sm[k].sstride);
            rspan[k] = span_of(rm[k].bytes, rm[k].rrun, rm[k].rstride);
            sb[k] = malloc(ss + 1);
            rb[k] = malloc(rspan[k] + 1);
            memset(sb[k], 0xAB, ss);
            for (size_t j = 0; j < sm[k].bytes; j++)
                sb[k][at_of(j, sm[k].srun, sm[k].sstride)] =
                    dpat(me, (uint64_t)it * NMSG + (uint64_t)k, j);
            memset(rb[k], 0xEE, rspan[k]);
            ops[k] = (tide_p2p_op){.kind = TIDE_P2P_SEND,
                                   .peer = right,
                                   .buf = sb[k],
                                   .bytes = sm[k].bytes,
                                   .run = sm[k].srun,
                                   .stride = sm[k].sstride};
            peers[k] = (tide_p2p_peer){.run = sm[k].rrun, .stride = sm[k].rstride, .known = 1};
            ops[NMSG + k] = (tide_p2p_op){.kind = TIDE_P2P_RECV,
                                          .peer = left,
                                          .buf = rb[k],
                                          .bytes = rm[k].bytes,
                                          .run = rm[k].rrun,
                                          .stride = rm[k].rstride};
            peers[NMSG + k] =
                (tide_p2p_peer){.run = rm[k].srun, .stride = rm[k].sstride, .known = 1};
        }
        uint64_t d0 = direct_bytes(c);
        if (it % 2) {
            tide_coll_req_t *req = NULL;
            MT_OK(tide_coll_p2p_start_peers(c, ops, peers, 2 * NMSG, NULL, &req));
            int done = 0;
            while (!done)
                MT_OK(tide_coll_req_test(c, req, &done));
            tide_coll_req_free(c, &req);
        } else {
            tide_coll_req_t *req = NULL;
            MT_OK(tide_coll_p2p_start_peers(c, ops, peers, 2 * NMSG, NULL, &req));
            MT_OK(tide_coll_req_wait(c, req));
            tide_coll_req_free(c, &req);
        }
        uint64_t got = direct_bytes(c) - d0, want = 0;
        for (int k = 0; k < NMSG; k++) {
            for (size_t i = 0; i < rspan[k]; i++) {
                size_t run = rm[k].rrun ? rm[k].rrun : rspan[k];
                size_t stride = rm[k].rrun ? rm[k].rstride : rspan[k];
                size_t r = i / stride, b = i % stride;
                unsigned char w =
                    b < run ? dpat(left, (uint64_t)it * NMSG + (uint64_t)k, r * run + b) : 0xEE;
                if (rb[k][i] != w)
                    MT_FAIL("%s: iteration %d message %d (%zu bytes, runs %zu/%zu -> %zu/%zu) "
                            "byte %zu is %#x, not %#x",
                            what, it, k, rm[k].bytes, rm[k].srun, rm[k].sstride, rm[k].rrun,
                            rm[k].rstride, i, rb[k][i], w);
            }
            if (k != 1 && rm[k].bytes >= DIRECT_MIN && direct_to(c, left))
                want += rm[k].bytes;
            free(sb[k]);
            free(rb[k]);
        }
        MT_ASSERT(got == (expect_direct ? want : 0),
                  "%s: iteration %d: %llu bytes by single copy, expected %llu", what, it,
                  (unsigned long long)got, (unsigned long long)(expect_direct ? want : 0));
        total += got;
    }
    uint64_t all = 0;
    MPI_Allreduce(&total, &all, 1, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD);
    if (me == 0)
        printf("%s: %llu bytes by single copy\n", what, (unsigned long long)all);
}

/* The agreement is symmetric, and absent where it must be. Returns 1 when this rank
   agreed on single copy with at least one peer. */
static int check_agreement(tide_coll_comm_t *c, int must_be_off)
{
    int view[64] = {0}, all[64 * 64] = {0}, any = 0;
    for (int r = 0; r < np; r++)
        view[r] = direct_to(c, r);
    MPI_Allgather(view, 64, MPI_INT, all, 64, MPI_INT, MPI_COMM_WORLD);
    for (int a = 0; a < np; a++)
        for (int b = 0; b < np; b++) {
            MT_ASSERT(all[a * 64 + b] == all[b * 64 + a], "single copy %d<->%d not symmetric", a,
                      b);
            if (a == b || must_be_off)
                MT_ASSERT(all[a * 64 + b] == 0, "single copy %d->%d where it must be off", a, b);
            any |= all[a * 64 + b];
        }
    return any;
}

static void test_p2p_direct(void)
{
    if (strcmp(be->name, "mpi") != 0 || np < 2) {
        mt_pass("p2p_direct (no single-copy path to test here)");
        return;
    }
    cma_env("TIDE_COLL_CMA_MIN", "65536");
    tide_coll_comm_t *c = world_comm();
    int any = check_agreement(c, 0);
    if (!any && me == 0)
        printf("NOTE: single copy not available between these ranks (the agreement found no "
               "reachable peer); checking results only\n");
    direct_ring(c, 8, 1, "p2p_direct");
    tide_coll_comm_destroy(&c);

    /* TIDE_COLL_CMA=0: everything on the plain path, same results. */
    cma_env("TIDE_COLL_CMA", "0");
    c = world_comm();
    check_agreement(c, 1);
    direct_ring(c, 4, 0, "p2p_direct with TIDE_COLL_CMA=0");
    tide_coll_comm_destroy(&c);
    cma_env("TIDE_COLL_CMA", NULL);
    cma_env("TIDE_COLL_CMA_MIN", NULL);
    mt_pass("p2p_direct");
}

/* Ranks 0 and 1 disagree about one message (variant: 0 sizes, 1 who is strided, 2 the
   receiver posts a plain receive, 3 a claimed layout): both get TIDE_ERR_PROTOCOL
   promptly and the receive buffer is not written (past the descriptor, in variant 2,
   where MPI delivers it into the plain receive). */
static void direct_mismatch(int variant)
{
    tide_coll_comm_t *c = world_comm();
    int ok = np >= 2 && direct_to(c, me == 0 ? 1 : 0);
    if (me <= 1 && ok) {
        size_t run = 2368, stride = 4736, bytes = run * 64;
        size_t rbytes = variant == 0 ? bytes + run : bytes;
        size_t sspan = span_of(bytes, run, stride), rspan = span_of(rbytes, run, stride);
        unsigned char *buf = malloc(sspan > rspan ? sspan : rspan);
        memset(buf, 0x3C, sspan > rspan ? sspan : rspan);
        tide_p2p_op op = {.peer = 1 - me, .buf = buf};
        tide_p2p_peer peer = {.known = 1};
        if (me == 0) { /* strided sender, says the receiver is contiguous: a push */
            op.kind = TIDE_P2P_SEND;
            op.bytes = bytes;
            op.run = run;
            op.stride = stride;
        } else {
            op.kind = TIDE_P2P_RECV;
            op.bytes = rbytes;
            peer.run = variant == 3 ? run / 2 : run;
            peer.stride = stride;
            if (variant == 1) { /* strided too, and says the sender is contiguous */
                op.run = run;
                op.stride = stride;
                peer.run = peer.stride = 0;
            }
        }
        uint64_t t0 = tide_now_ns();
        tide_status rc = tide_coll_p2p_start_peers(c, &op, variant == 2 && me == 1 ? NULL : &peer,
                                                   1, NULL, NULL);
        MT_ASSERT(rc == TIDE_ERR_INVALID, "out NULL refused");
        tide_coll_req_t *req = NULL;
        rc = tide_coll_p2p_start_peers(c, &op, variant == 2 && me == 1 ? NULL : &peer, 1, NULL,
                                       &req);
        if (rc == TIDE_OK)
            rc = tide_coll_req_wait(c, req);
        tide_coll_req_free(c, &req);
        double dt = (double)(tide_now_ns() - t0) / 1e9;
        MT_ASSERT(rc == TIDE_ERR_PROTOCOL, "mismatch %d: rank %d got %s (%s)", variant, me,
                  tide_status_name(rc), tide_last_error());
        MT_ASSERT(dt < 2.0, "mismatch %d: rank %d took %.3f s", variant, me, dt);
        if (me == 1)
            for (size_t i = variant == 2 ? 96 : 0; i < rspan; i++)
                MT_ASSERT(buf[i] == 0x3C, "mismatch %d: receive buffer byte %zu written", variant,
                          i);
        free(buf);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    tide_coll_comm_abort(c);
    tide_coll_comm_destroy(&c);
}

static void test_direct_errors(void)
{
    if (strcmp(be->name, "mpi") != 0 || np < 2) {
        mt_pass("direct_errors (no single-copy path to test here)");
        return;
    }
    cma_env("TIDE_COLL_CMA_MIN", "65536");
    for (int v = 0; v < 4; v++)
        direct_mismatch(v);
    /* Abort while a push into rank 1 is pending: the pusher never posts (late 0), or
       posts after rank 1 gave up (late 1) and must stop at its liveness check. Rank 1
       returns ABORTED within 1 s of the abort and its buffer is never written. */
    for (int late = 0; late < 2; late++) {
        tide_coll_comm_t *c = world_comm();
        int ok = direct_to(c, me == 0 ? 1 : 0);
        size_t run = 2368, stride = 4736, bytes = run * 512;
        size_t sspan = span_of(bytes, run, stride);
        unsigned char *buf = malloc(sspan);
        memset(buf, 0x5D, sspan);
        if (me == 1 && ok) {
            struct aborter a = {c, 150, 0};
            pthread_t th;
            pthread_create(&th, NULL, abort_later, &a);
            tide_p2p_op op = {.kind = TIDE_P2P_RECV, .peer = 0, .buf = buf, .bytes = bytes};
            tide_p2p_peer peer = {.run = run, .stride = stride, .known = 1};
            tide_coll_req_t *req = NULL;
            tide_status rc = tide_coll_p2p_start_peers(c, &op, &peer, 1, NULL, &req);
            if (rc == TIDE_OK)
                rc = tide_coll_req_wait(c, req);
            uint64_t end = tide_now_ns();
            tide_coll_req_free(c, &req);
            pthread_join(th, NULL);
            MT_ASSERT(rc == TIDE_ERR_ABORTED, "push receive aborted (late %d): %s", late,
                      tide_status_name(rc));
            MT_ASSERT(end - a.at_ns < 1000ull * 1000000,
                      "push receive returned %.3f s after the abort (late %d)",
                      (double)(end - a.at_ns) / 1e9, late);
            for (size_t i = 0; i < bytes; i++)
                MT_ASSERT(buf[i] == 0x5D, "late %d: byte %zu written after the abort", late, i);
        } else if (me == 0 && ok && late) {
            tide_sleep_ms(350); /* rank 1 has given up by now */
            tide_p2p_op op = {.kind = TIDE_P2P_SEND,
                              .peer = 1,
                              .buf = buf,
                              .bytes = bytes,
                              .run = run,
                              .stride = stride};
            tide_p2p_peer peer = {.known = 1};
            tide_coll_req_t *req = NULL;
            tide_status rc = tide_coll_p2p_start_peers(c, &op, &peer, 1, NULL, &req);
            if (rc == TIDE_OK)
                rc = tide_coll_req_wait(c, req);
            tide_coll_req_free(c, &req);
            MT_ASSERT(rc == TIDE_ERR_PEER, "pusher after the receiver gave up: %s (%s)",
                      tide_status_name(rc), tide_last_error());
        }
        free(buf);
        MPI_Barrier(MPI_COMM_WORLD);
        tide_coll_comm_abort(c);
        tide_coll_comm_destroy(&c);
    }
    cma_env("TIDE_COLL_CMA_MIN", NULL);
    mt_pass("direct_errors");
}

/* ---- executor: hand-made random plans ------------------------------------------------------ */

typedef struct part {
    int w;
    uint32_t r0, r1, c0, c1;
} part;

typedef struct rplan {
    int T;
    uint32_t rows[8], cols[8];
    part oldp[8][24], newp[8][24];
    int n_old[8], n_new[8];
    tide_xfer items[4096];
    size_t n;
} rplan;

static unsigned char gbyte(int t, uint32_t r, uint32_t c)
{
    uint64_t x = seed ^ ((uint64_t)t << 50) ^ ((uint64_t)r << 25) ^ c;
    x *= 0x9E3779B97F4A7C15ull;
    return (unsigned char)(x >> 56);
}

/* Splits tensor t by rows or columns into parts held by distinct workers, some parts
   replicated on a second worker. */
static void partition(uint64_t *s, rplan *p, int t, int W, part *out, int *n_out)
{
    int by_rows = (int)rng_below(s, 2);
    uint32_t dim = by_rows ? p->rows[t] : p->cols[t];
    int k = 1 + (int)rng_below(s, (uint64_t)(W < (int)dim ? W : (int)dim));
    int unused[64], n_unused = W, n = 0;
    for (int w = 0; w < W; w++)
        unused[w] = w;
    uint32_t at = 0;
    for (int i = 0; i < k; i++) {
        uint32_t end =
            i == k - 1 ? dim : at + 1 + (uint32_t)rng_below(s, dim - at - (uint32_t)(k - i) + 1);
        /* a replica only while enough workers remain for the parts still to place */
        int reps = 1 + (rng_below(s, 3) == 0 && n_unused - 1 > k - i - 1);
        for (int rep = 0; rep < reps; rep++) {
            int j = (int)rng_below(s, (uint64_t)n_unused), w = unused[j];
            unused[j] = unused[--n_unused];
            part q = {w, 0, p->rows[t], 0, p->cols[t]};
            if (by_rows) {
                q.r0 = at;
                q.r1 = end;
            } else {
                q.c0 = at;
                q.c1 = end;
            }
            out[n++] = q;
        }
        at = end;
    }
    *n_out = n;
}

static int cmp_item(const void *a, const void *b)
{
    const tide_xfer *x = a, *y = b;
    if (x->src != y->src)
        return x->src < y->src ? -1 : 1;
    if (x->dst != y->dst)
        return x->dst < y->dst ? -1 : 1;
    if (x->tensor != y->tensor)
        return x->tensor < y->tensor ? -1 : 1;
    return x->dst_off < y->dst_off ? -1 : x->dst_off > y->dst_off;
}

static void make_rplan(uint64_t *s, rplan *p, int W)
{
    memset(p, 0, sizeof *p);
    p->T = 1 + (int)rng_below(s, 4);
    for (int t = 0; t < p->T; t++) {
        p->rows[t] = 1 + (uint32_t)rng_below(s, 12);
        p->cols[t] = 1 + (uint32_t)rng_below(s, 40);
        partition(s, p, t, W, p->oldp[t], &p->n_old[t]);
        partition(s, p, t, W, p->newp[t], &p->n_new[t]);
        /* Every new part takes each overlapping old region from one holder: itself when
           it holds it (a local copy), else a random replica. */
        for (int i = 0; i < p->n_new[t]; i++) {
            part *P = &p->newp[t][i];
            /* old parts are grouped by region: consecutive entries with equal bounds */
            for (int j = 0; j < p->n_old[t];) {
                int e = j;
                while (e < p->n_old[t] && p->oldp[t][e].r0 == p->oldp[t][j].r0 &&
                       p->oldp[t][e].c0 == p->oldp[t][j].c0 &&
                       p->oldp[t][e].r1 == p->oldp[t][j].r1 && p->oldp[t][e].c1 == p->oldp[t][j].c1)
                    e++;
                part *Q = &p->oldp[t][j];
                int src = p->oldp[t][j + (int)rng_below(s, (uint64_t)(e - j))].w;
                for (int q = j; q < e; q++)
                    if (p->oldp[t][q].w == P->w)
                        src = P->w;
                uint32_t r0 = P->r0 > Q->r0 ? P->r0 : Q->r0, r1 = P->r1 < Q->r1 ? P->r1 : Q->r1;
                uint32_t c0 = P->c0 > Q->c0 ? P->c0 : Q->c0, c1 = P->c1 < Q->c1 ? P->c1 : Q->c1;
                if (r0 < r1 && c0 < c1) {
                    uint32_t qw = Q->c1 - Q->c0, pw = P->c1 - P->c0;
                    tide_xfer *it = &p->items[p->n++];
                    it->tensor = (uint32_t)t;
                    it->src = src;
                    it->dst = P->w;
                    it->run = c1 - c0;
                    it->count = r1 - r0;
                    it->src_off = (uint64_t)(r0 - Q->r0) * qw + (c0 - Q->c0);
                    it->src_stride = qw;
                    it->dst_off = (uint64_t)(r0 - P->r0) * pw + (c0 - P->c0);
                    it->dst_stride = pw;
                }
                j = e;
            }
        }
    }
    qsort(p->items, p->n, sizeof p->items[0], cmp_item);
}

struct prog {
    uint64_t last, total;
    int calls, monotonic;
};

static void on_progress(void *ctx, uint64_t done, uint64_t total)
{
    struct prog *p = ctx;
    if (done < p->last || done > total)
        p->monotonic = 0;
    p->last = done;
    p->total = total;
    p->calls++;
}

/* Bytes the executor tests received by single copy (tide_exec_stats.bytes_direct). */
static uint64_t exec_direct;

static void run_rplan(tide_coll_comm_t *c, uint64_t *s, int W, uint64_t cap, uint64_t chunk,
                      uint64_t pack)
{
    static rplan p;
    make_rplan(s, &p, W);
    int *rank_of = malloc(sizeof(int) * (size_t)W);
    for (int w = 0; w < W; w++)
        rank_of[w] = w % np;
    void *oldb[64][8] = {{0}}, *newb[64][8] = {{0}};
    uint64_t olds[64][8] = {{0}}, news[64][8] = {{0}};
    void **ob[64], **nb[64];
    const uint64_t *os[64], *ns[64];
    for (int w = 0; w < W; w++) {
        ob[w] = oldb[w];
        nb[w] = newb[w];
        os[w] = olds[w];
        ns[w] = news[w];
    }
    for (int t = 0; t < p.T; t++) {
        for (int side = 0; side < 2; side++) {
            part *parts = side ? p.newp[t] : p.oldp[t];
            int n = side ? p.n_new[t] : p.n_old[t];
            for (int i = 0; i < n; i++) {
                part *q = &parts[i];
                if (rank_of[q->w] != me)
                    continue;
                uint32_t w = q->c1 - q->c0, h = q->r1 - q->r0;
                unsigned char *hb = malloc((size_t)w * h);
                for (uint32_t r = 0; r < h; r++)
                    for (uint32_t k = 0; k < w; k++)
                        hb[r * w + k] = side ? 0xEE : gbyte(t, q->r0 + r, q->c0 + k);
                void *d = dalloc((size_t)w * h);
                put(d, hb, (size_t)w * h);
                free(hb);
                (side ? newb : oldb)[q->w][t] = d;
                (side ? news : olds)[q->w][t] = (uint64_t)w * h;
            }
        }
    }
    tide_plan_t plan = {.items = p.items, .n = p.n};
    tide_exec_args a = {.plan = &plan,
                        .n_workers = (size_t)W,
                        .n_tensors = (size_t)p.T,
                        .rank_of_worker = rank_of,
                        .old_bufs = (void *const *const *)ob,
                        .new_bufs = (void *const *const *)nb,
                        .old_bytes = os,
                        .new_bytes = ns};
    struct prog pr = {0, 0, 0, 1};
    tide_exec_opts o;
    tide_exec_opts_init(&o);
    o.staging_cap = cap;
    o.max_chunk = chunk;
    o.pack_below = pack; /* small: most items in place, their rounds posted ahead */
    o.progress = on_progress;
    o.progress_ctx = &pr;
    tide_exec_stats st;
    MT_OK(tide_reshard_execute(c, &a, &o, &st));
    MT_ASSERT(st.bytes_direct <= st.bytes_recv, "%llu bytes by single copy of %llu received",
              (unsigned long long)st.bytes_direct, (unsigned long long)st.bytes_recv);
    exec_direct += st.bytes_direct;
    MT_ASSERT(pr.calls >= 1 && pr.monotonic && pr.last == pr.total, "progress %llu/%llu, %d calls",
              (unsigned long long)pr.last, (unsigned long long)pr.total, pr.calls);
    MT_ASSERT(pr.total == st.bytes_local + st.bytes_sent + st.bytes_recv, "progress total");
    MT_ASSERT(st.peak_staging <= cap, "peak staging %llu > cap %llu",
              (unsigned long long)st.peak_staging, (unsigned long long)cap);
    /* Every byte of every new shard equals the global tensor: the state gathered from the
       new shards is bit-identical to the original. */
    for (int t = 0; t < p.T; t++)
        for (int i = 0; i < p.n_new[t]; i++) {
            part *q = &p.newp[t][i];
            if (rank_of[q->w] != me)
                continue;
            uint32_t w = q->c1 - q->c0, h = q->r1 - q->r0;
            unsigned char *hb = malloc((size_t)w * h);
            get(hb, newb[q->w][t], (size_t)w * h);
            for (uint32_t r = 0; r < h; r++)
                for (uint32_t k = 0; k < w; k++)
                    MT_ASSERT(hb[r * w + k] == gbyte(t, q->r0 + r, q->c0 + k),
                              "tensor %d worker %d byte (%u,%u) W=%d cap=%llu chunk=%llu", t, q->w,
                              r, k, W, (unsigned long long)cap, (unsigned long long)chunk);
            free(hb);
        }
    for (int w = 0; w < W; w++)
        for (int t = 0; t < p.T; t++) {
            if (oldb[w][t])
                be->mem_free(oldb[w][t]);
            if (newb[w][t])
                be->mem_free(newb[w][t]);
        }
    free(rank_of);
}

static void test_executor_random(void)
{
    tide_coll_comm_t *c = world_comm();
    uint64_t s = seed ^ 0x4444;
    for (int iter = 0; iter < 16; iter++) {
        int W = 1 + (int)rng_below(&s, (uint64_t)(2 * np < 24 ? 2 * np : 24));
        uint64_t cap = iter % 3 == 0 ? ((uint64_t)256 << 20) : 64 + rng_below(&s, 16384);
        /* chunks smaller than a row cut runs into pieces; bigger ones pack whole items */
        uint64_t chunk = iter % 4 == 0 ? 0
                         : iter % 2    ? 1 + rng_below(&s, 24)
                                       : 1 + rng_below(&s, 700);
        /* pack_below small: items travel in place (rounds posted ahead, without
           staging) between staged rounds of packed small items */
        uint64_t pack = iter % 3 == 1 ? 1 + (uint64_t)iter * 37 : 0;
        run_rplan(c, &s, W, cap, chunk, pack);
    }
    tide_coll_comm_destroy(&c);
    mt_pass("executor_random_plans");
}

static void test_executor_errors(void)
{
    tide_coll_comm_t *c = world_comm();
    int W = np;
    tide_xfer items[2];
    memset(items, 0, sizeof items);
    /* worker w sends 16 bytes of tensor 0 to w+1 */
    unsigned char *hold = calloc(64, 1), *hnew = calloc(64, 1);
    void *oldb = dalloc(64), *newb = dalloc(64);
    void *ob_row[1] = {oldb}, *nb_row[1] = {newb};
    void **ob = calloc((size_t)W, sizeof *ob), **nb = calloc((size_t)W, sizeof *nb);
    ob[me] = ob_row;
    nb[me] = nb_row;
    tide_plan_t plan = {.items = items, .n = 1};
    tide_exec_args a = {.plan = &plan,
                        .n_workers = (size_t)W,
                        .n_tensors = 1,
                        .old_bufs = (void *const *const *)ob,
                        .new_bufs = (void *const *const *)nb};
    items[0] = (tide_xfer){.tensor = 3, .src = 0, .dst = np - 1, .run = 16, .count = 1};
    MT_ASSERT(tide_reshard_execute(c, &a, NULL, NULL) == TIDE_ERR_INVALID, "bad tensor index");
    MT_ASSERT(strstr(tide_last_error(), "tensor 3") != NULL, "detail: %s", tide_last_error());
    items[0].tensor = 0;
    items[0].src = W + 5;
    MT_ASSERT(tide_reshard_execute(c, &a, NULL, NULL) == TIDE_ERR_INVALID, "bad worker");
    /* Only rank 0 lacks the buffer it must send from: it says why, the others learn that
       a peer failed; nobody hangs and nothing moves. */
    items[0].src = 0;
    if (me == 0)
        ob[0] = NULL;
    tide_status rc = tide_reshard_execute(c, &a, NULL, NULL);
    MT_ASSERT(rc == (me == 0  ? TIDE_ERR_INVALID
                     : np > 1 ? TIDE_ERR_PEER
                              : TIDE_ERR_INVALID),
              "missing buffer on rank 0 gives %s here", tide_status_name(rc));
    ob[me] = ob_row;
    /* Out of bounds when sizes are given. */
    uint64_t sz = 64, *szp = &sz;
    const uint64_t *sizes_row[64];
    for (int w = 0; w < W && w < 64; w++)
        sizes_row[w] = szp;
    a.old_bytes = sizes_row;
    a.new_bytes = sizes_row;
    items[0].src_off = 60;
    MT_ASSERT(tide_reshard_execute(c, &a, NULL, NULL) == (me == 0  ? TIDE_ERR_RANGE
                                                          : np > 1 ? TIDE_ERR_PEER
                                                                   : TIDE_ERR_RANGE),
              "region past the end");
    items[0].src_off = 0;
    /* A staging cap too small for the streams. */
    if (np > 1) {
        items[0].count = 4;
        items[0].src_stride = 16;
        items[0].dst_stride = 16;
        items[0].run = 1;
        tide_exec_opts o;
        tide_exec_opts_init(&o);
        o.staging_cap = 1; /* rank 0 and np-1 each have one stream: 1 byte per stream works */
        MT_OK(tide_reshard_execute(c, &a, &o, NULL));
        items[0].run = 16;
        items[0].count = 1;
    }
    /* Allocation failures in the setup: sticky failures from the k-th allocation on fail
       every rank before the agreement, and the communicator stays usable. */
    for (long k = 1; k <= 3; k++) {
        tide_alloc_fail_at(k, 1);
        rc = tide_reshard_execute(c, &a, NULL, NULL);
        tide_alloc_fail_at(0, 0);
        MT_ASSERT(rc == TIDE_ERR_NOMEM, "allocation %ld failing gives %s", k, tide_status_name(rc));
        MT_ASSERT(!tide_coll_comm_aborted(c), "setup failures leave the communicator alive");
    }
    if (np > 1) {
        if (me == 0)
            tide_alloc_fail_at(1, 1);
        rc = tide_reshard_execute(c, &a, NULL, NULL);
        tide_alloc_fail_at(0, 0);
        MT_ASSERT(rc == (me == 0 ? TIDE_ERR_NOMEM : TIDE_ERR_PEER), "one rank out of memory: %s",
                  tide_status_name(rc));
    }
    /* And then it works. */
    for (int i = 0; i < 64; i++)
        hold[i] = (unsigned char)(me * 3 + i);
    put(oldb, hold, 64);
    MT_OK(tide_reshard_execute(c, &a, NULL, NULL));
    if (me == np - 1) {
        get(hnew, newb, 64);
        for (int i = 0; i < 16; i++)
            MT_ASSERT(hnew[i] == (unsigned char)(0 * 3 + i), "moved byte %d", i);
    }
    be->mem_free(oldb);
    be->mem_free(newb);
    free(ob);
    free(nb);
    free(hold);
    free(hnew);
    tide_coll_comm_destroy(&c);
    mt_pass("executor_errors");
}

/* ---- executor: a failure once data moves aborts before the cleanup --------------------------- */

/* The backend in use, wrapped: after the executor's agreement (its one allreduce) the next
   copy2d fails, as a device copy that faults would, and from that failure on every call
   is logged in order. On nccl the transfers already posted may be stuck on a peer that
   gave up: the communicator must be aborted (comm_abort, then the owner thread's
   stream_sync on it, which calls ncclCommAbort) before any synchronous device work of the
   cleanup, or that work waits forever behind them. */
enum { EV_FAIL, EV_ABORT, EV_SYNC_COMM, EV_DEVICE, EV_OTHER };
static tide_coll_backend_v1 arec;
static int arec_arm_next, arec_armed, arec_failed, arec_n;
static int arec_log[256];
static const char *arec_what[256];

static void arec_note(int ev, const char *what)
{
    if (arec_failed && arec_n < 256) {
        arec_what[arec_n] = what;
        arec_log[arec_n++] = ev;
    }
}

static tide_status arec_allreduce(tide_coll_comm_t *c, const void *send, void *recv, size_t count,
                                  tide_dtype dt, tide_red_op op, tide_coll_stream_t s)
{
    arec_note(EV_OTHER, "allreduce");
    tide_status rc = be->allreduce(c, send, recv, count, dt, op, s);
    if (arec_arm_next)
        arec_armed = 1; /* the agreement is done: data moves from now on */
    return rc;
}

static tide_status arec_copy2d(void *dst, size_t dp, const void *src, size_t sp, size_t w, size_t h,
                               tide_coll_stream_t s)
{
    if (arec_armed && !arec_failed) {
        arec_failed = 1;
        arec_note(EV_FAIL, "copy2d (failing)");
        return tide_errorf(TIDE_ERR_BACKEND, "injected: a device copy failed");
    }
    arec_note(EV_DEVICE, "copy2d");
    return be->copy2d(dst, dp, src, sp, w, h, s);
}

static tide_status arec_copy_host(void *dst, const void *src, size_t bytes, int to_host,
                                  tide_coll_stream_t s)
{
    arec_note(EV_DEVICE, "copy_host");
    return be->copy_host(dst, src, bytes, to_host, s);
}

static tide_status arec_sync(tide_coll_comm_t *c, tide_coll_stream_t s)
{
    arec_note(c != NULL ? EV_SYNC_COMM : EV_DEVICE,
              c != NULL ? "stream_sync(comm)" : "stream_sync");
    return be->stream_sync(c, s);
}

static void arec_abort(tide_coll_comm_t *c)
{
    arec_note(EV_ABORT, "comm_abort");
    if (be->comm_abort != NULL)
        be->comm_abort(c);
}

static tide_status arec_alloc(size_t bytes, void **out)
{
    arec_note(EV_DEVICE, "mem_alloc");
    return be->mem_alloc(bytes, out);
}

static tide_status arec_alloc_on(int device, size_t bytes, void **out)
{
    arec_note(EV_DEVICE, "mem_alloc_on");
    return be->mem_alloc_on(device, bytes, out);
}

static void arec_free(void *ptr)
{
    arec_note(EV_DEVICE, "mem_free");
    be->mem_free(ptr);
}

static tide_status arec_host_alloc(size_t bytes, void **out)
{
    arec_note(EV_DEVICE, "host_alloc");
    return be->host_alloc(bytes, out);
}

static void arec_host_free(void *ptr)
{
    arec_note(EV_DEVICE, "host_free"); /* cudaFreeHost waits for the device too */
    be->host_free(ptr);
}

/* Each rank rebuilds its worker w in place: tensor 0 grows from 64 to 128 bytes (its own
   old bytes, copied locally, then worker w-1's, received), tensor 1 (256 bytes) leaves. A
   memory limit of 1 byte spills both old shards to host, so that the undo after the
   failure copies them back (ip_undo's copy_host). Every rank's local copy fails. */
static void test_executor_abort_first(void)
{
    arec = *be;
    arec.name = "arec";
    arec.allreduce = arec_allreduce;
    arec.copy2d = arec_copy2d;
    arec.copy_host = arec_copy_host;
    arec.stream_sync = arec_sync;
    arec.comm_abort = arec_abort;
    arec.mem_alloc = arec_alloc;
    arec.mem_free = arec_free;
    if (be->mem_alloc_on != NULL)
        arec.mem_alloc_on = arec_alloc_on;
    if (be->host_alloc != NULL) {
        arec.host_alloc = arec_host_alloc;
        arec.host_free = arec_host_free;
    }
    MT_OK(tide_coll_backend_register(&arec));
    int *m = malloc(sizeof(int) * (size_t)np);
    for (int i = 0; i < np; i++)
        m[i] = i;
    tide_coll_comm_params cp = {
        .members = m, .n_members = np, .tag = next_tag++, .timeout_ms = 20000};
    tide_coll_comm_t *c = NULL;
    MT_OK(tide_coll_comm_new(&c, &arec, pool, &cp));
    free(m);

    tide_mem_pool_t *mp = NULL;
    MT_OK(tide_mem_pool_new(&mp, &arec, 0));
    uint64_t old_bytes[2] = {64, 256}, new_bytes[2] = {128, 0};
    unsigned char want[2][256];
    void *bufs[2];
    for (int t = 0; t < 2; t++) {
        MT_OK(tide_mem_pool_alloc(mp, (size_t)old_bytes[t], &bufs[t]));
        for (uint64_t i = 0; i < old_bytes[t]; i++)
            want[t][i] = (unsigned char)(me * 31 + t * 7 + (int)i);
        put(bufs[t], want[t], (size_t)old_bytes[t]);
    }
    tide_xfer *items = calloc((size_t)np * 2, sizeof *items);
    for (int w = 0; w < np; w++) {
        items[2 * w] = (tide_xfer){.tensor = 0, .src = w, .dst = w, .run = 64, .count = 1};
        items[2 * w + 1] = (tide_xfer){
            .tensor = 0, .src = (w + np - 1) % np, .dst = w, .dst_off = 64, .run = 64, .count = 1};
    }
    tide_plan_t plan = {.items = items, .n = (size_t)np * 2};
    uint8_t moved[2] = {0, 0};
    tide_exec_in_place ip = {.pool = mp,
                             .worker = me,
                             .bufs = bufs,
                             .old_bytes = old_bytes,
                             .new_bytes = new_bytes,
                             .moved = moved,
                             .limit = 1,
                             .strict = 0};
    const uint64_t **ob = calloc((size_t)np, sizeof *ob), **nb = calloc((size_t)np, sizeof *nb);
    ob[me] = old_bytes;
    nb[me] = new_bytes;
    tide_exec_args a = {.plan = &plan,
                        .n_workers = (size_t)np,
                        .n_tensors = 2,
                        .old_bytes = (const uint64_t *const *)ob,
                        .new_bytes = (const uint64_t *const *)nb,
                        .in_place = &ip};
    tide_exec_opts o;
    tide_exec_opts_init(&o);
    o.pack_below = 1; /* messages in place: the only copy2d is the local copy */
    tide_exec_stats st;
    arec_arm_next = 1;
    tide_status rc = tide_reshard_execute(c, &a, &o, &st);
    arec_arm_next = arec_armed = 0;
    MT_ASSERT(arec_failed, "the injected copy failure was never reached");
    MT_ASSERT(rc == TIDE_ERR_BACKEND && strstr(tide_last_error(), "injected") != NULL,
              "the failed reshard says %s (%s), not the copy's failure", tide_status_name(rc),
              tide_last_error());
    MT_ASSERT(st.bytes_spilled == 320,
              "both old shards spilled (%llu bytes), so that the undo "
              "copies them back",
              (unsigned long long)st.bytes_spilled);
    MT_ASSERT(tide_coll_comm_aborted(c), "a failure once data moved leaves the communicator dead");
    /* the order: abort, the owner's half of it, and only then device work */
    int abort_at = -1, sync_at = -1, device_at = -1;
    for (int i = 1; i < arec_n; i++) {
        if (arec_log[i] == EV_ABORT && abort_at < 0)
            abort_at = i;
        if (arec_log[i] == EV_SYNC_COMM && abort_at >= 0 && sync_at < 0)
            sync_at = i;
        if (arec_log[i] == EV_DEVICE && device_at < 0)
            device_at = i;
    }
    MT_ASSERT(device_at > 0, "the cleanup after the failure did no device work (%d calls)", arec_n);
    MT_ASSERT(abort_at > 0 && sync_at > abort_at && sync_at < device_at,
              "after the failure, %s came before the communicator was aborted (comm_abort at "
              "call %d, its owner's stream_sync at %d, first device work at %d)",
              arec_what[device_at], abort_at, sync_at, device_at);
    int copies_back = 0;
    for (int i = 0; i < arec_n; i++)
        copies_back += arec_log[i] == EV_DEVICE && strcmp(arec_what[i], "copy_host") == 0;
    MT_ASSERT(copies_back >= 2, "the undo copied %d spilled shards back", copies_back);
    /* the call's memory limit was the call's: left on the pool, it would bound (strict:
       refuse) what the runtime prepares for the next switch */
    tide_mem_pool_stats ps;
    tide_mem_pool_stats_get(mp, &ps);
    MT_ASSERT(ps.limit == 0 && ps.strict == 0,
              "the reshard left its memory limit (%llu bytes, strict %d) on the pool",
              (unsigned long long)ps.limit, ps.strict);
    /* and the undo gave the old shards back */
    for (int t = 0; t < 2; t++) {
        unsigned char got[256];
        MT_ASSERT(bufs[t] != NULL && tide_mem_pool_owns(mp, bufs[t]),
                  "tensor %d's old shard is not back in a pool block", t);
        get(got, bufs[t], (size_t)old_bytes[t]);
        MT_ASSERT(memcmp(got, want[t], (size_t)old_bytes[t]) == 0,
                  "tensor %d's old shard differs after the undo", t);
        MT_ASSERT(moved[t] == 1,
                  "tensor %d came back from its spill into a block of the pool "
                  "(maybe at its old address): moved must say so",
                  t);
    }
    arec_failed = 0;
    arec_n = 0;
    tide_coll_comm_destroy(&c);
    for (int t = 0; t < 2; t++)
        tide_mem_pool_free(mp, bufs[t]);
    tide_mem_pool_destroy(&mp);
    free(items);
    free(ob);
    free(nb);
    mt_pass("executor_abort_before_cleanup");
}

/* In place under a strict limit that spilling the leaving shards cannot meet: tensor 0
   shrinks in place (old 256 bytes, new = its second half at offset 0), tensor 1 grows
   (256 -> 512: its own old bytes, then worker w-1's). The rank holds 512 and may hold
   640 (its new state) + 64 (staging cap): tensor 1 spilled leaves 256 + 512 new, over;
   tensor 0 spilled too (rebuilt in a new block of 128 instead of shrinking in its 256)
   fits exactly. Checked: the data, the spills, that every new shard moved, and the
   pool's peak within the limit.
   The spill memory is planned (tide_exec_plan_spills) and prepared (spill_reserve) before
   the reshard, which then allocates and frees no host memory (the wrapper counts
   host_alloc and host_free: cudaMallocHost and cudaFreeHost on nccl; on mpi the pool's
   plain host memory goes through them too); tide_mem_pool_spill_release frees the blocks
   afterwards on the pool's thread. */
static tide_coll_backend_v1 srec;
static int srec_allocs, srec_frees;

static tide_status srec_host_alloc(size_t bytes, void **out)
{
    __atomic_add_fetch(&srec_allocs, 1, __ATOMIC_RELAXED);
    if (be->host_alloc != NULL)
        return be->host_alloc(bytes, out);
    *out = malloc(bytes);
    return *out != NULL ? TIDE_OK : TIDE_ERR_NOMEM;
}

static void srec_host_free(void *ptr)
{
    __atomic_add_fetch(&srec_frees, 1, __ATOMIC_RELAXED);
    if (be->host_free != NULL)
        be->host_free(ptr);
    else
        free(ptr);
}

static void test_executor_shrink_spill(void)
{
    tide_coll_comm_t *c = world_comm();
    srec = *be;
    srec.name = "srec";
    srec.host_alloc = srec_host_alloc;
    srec.host_free = srec_host_free;
    tide_mem_pool_t *mp = NULL;
    MT_OK(tide_mem_pool_new(&mp, &srec, 0));
    enum { CAP = 64 };
    uint64_t old_bytes[2] = {256, 256}, new_bytes[2] = {128, 512};
    unsigned char want0[128], want1[512], mine[2][256];
    void *bufs[2];
    int prev = (me + np - 1) % np;
    for (int t = 0; t < 2; t++) {
        MT_OK(tide_mem_pool_alloc(mp, 256, &bufs[t]));
        for (int i = 0; i < 256; i++)
            mine[t][i] = (unsigned char)(me * 37 + t * 11 + i);
        put(bufs[t], mine[t], 256);
    }
    memcpy(want0, mine[0] + 128, 128);
    memcpy(want1, mine[1], 256);
    for (int i = 0; i < 256; i++)
        want1[256 + i] = (unsigned char)(prev * 37 + 11 + i);
    tide_xfer *items = calloc((size_t)np * 3, sizeof *items);
    for (int w = 0; w < np; w++) {
        items[3 * w] =
            (tide_xfer){.tensor = 0, .src = w, .dst = w, .src_off = 128, .run = 128, .count = 1};
        items[3 * w + 1] = (tide_xfer){.tensor = 1, .src = w, .dst = w, .run = 256, .count = 1};
        items[3 * w + 2] = (tide_xfer){.tensor = 1,
                                       .src = (w + np - 1) % np,
                                       .dst = w,
                                       .dst_off = 256,
                                       .run = 256,
                                       .count = 1};
    }
    tide_plan_t plan = {.items = items, .n = (size_t)np * 3};
    uint8_t moved[2] = {0, 0};
    tide_exec_in_place ip = {.pool = mp,
                             .worker = me,
                             .bufs = bufs,
                             .old_bytes = old_bytes,
                             .new_bytes = new_bytes,
                             .moved = moved,
                             .limit = 640 + CAP,
                             .strict = 1};
    const uint64_t **ob = calloc((size_t)np, sizeof *ob), **nb = calloc((size_t)np, sizeof *nb);
    ob[me] = old_bytes;
    nb[me] = new_bytes;
    tide_exec_args a = {.plan = &plan,
                        .n_workers = (size_t)np,
                        .n_tensors = 2,
                        .old_bytes = (const uint64_t *const *)ob,
                        .new_bytes = (const uint64_t *const *)nb,
                        .in_place = &ip};
    tide_exec_opts o;
    tide_exec_opts_init(&o);
    o.staging_cap = CAP;
    uint64_t planned[2] = {1, 1};
    MT_OK(tide_exec_plan_spills(be, np, me, &a, &o, planned));
    MT_ASSERT(planned[0] == 256 && planned[1] == 256,
              "planned spills %llu and %llu bytes (the reshard spills both old shards)",
              (unsigned long long)planned[0], (unsigned long long)planned[1]);
    MT_OK(tide_mem_pool_spill_reserve(mp, planned, 2));
    MT_ASSERT(srec_allocs == 2, "spill_reserve took %d host blocks for 2 shards", srec_allocs);
    srec_allocs = 0;
    tide_exec_stats st;
    MT_OK(tide_reshard_execute(c, &a, &o, &st));
    MT_ASSERT(srec_allocs == 0 && __atomic_load_n(&srec_frees, __ATOMIC_RELAXED) == 0,
              "the reshard allocated %d and freed %d host spill blocks (all were prepared)",
              srec_allocs, srec_frees);
    tide_mem_pool_stats sp;
    tide_mem_pool_stats_get(mp, &sp);
    MT_ASSERT(sp.spill_reused == 512 && sp.spill_fresh == 0 && sp.spill == 0 &&
                  sp.spill_cached == 512,
              "spill memory: %llu reused, %llu fresh, %llu holding, %llu kept",
              (unsigned long long)sp.spill_reused, (unsigned long long)sp.spill_fresh,
              (unsigned long long)sp.spill, (unsigned long long)sp.spill_cached);
    tide_mem_pool_spill_release(mp);
    tide_mem_pool_stats_get(mp, &sp);
    MT_ASSERT(sp.spill_cached == 0, "released spill blocks are still kept");
    MT_ASSERT(st.bytes_spilled == 512 && st.bytes_shrunk == 0 && st.bytes_rebuilt == 640,
              "spilled %llu (want both old shards: 512), shrunk %llu (0), rebuilt %llu (640)",
              (unsigned long long)st.bytes_spilled, (unsigned long long)st.bytes_shrunk,
              (unsigned long long)st.bytes_rebuilt);
    MT_ASSERT(moved[0] && moved[1], "both tensors are in new blocks (moved %d %d)", moved[0],
              moved[1]);
    unsigned char got[512];
    get(got, bufs[0], 128);
    MT_ASSERT(memcmp(got, want0, 128) == 0, "tensor 0 (rebuilt from its spill) differs");
    get(got, bufs[1], 512);
    MT_ASSERT(memcmp(got, want1, 512) == 0, "tensor 1 differs");
    tide_mem_pool_stats ps;
    tide_mem_pool_stats_get(mp, &ps);
    MT_ASSERT(ps.peak_in_use <= 640 + CAP,
              "the pool held %llu bytes in use at its peak, over the limit of %d",
              (unsigned long long)ps.peak_in_use, 640 + CAP);
    tide_coll_comm_destroy(&c);
    for (int t = 0; t < 2; t++)
        tide_mem_pool_free(mp, bufs[t]);
    tide_mem_pool_destroy(&mp); /* waits for the pool's thread */
    MT_ASSERT(srec_frees == 2, "the pool's thread freed %d of the 2 released spill blocks",
              srec_frees);
    free(items);
    free(ob);
    free(nb);
    mt_pass("executor_shrink_spill");
}

/* A device backend's shrink in place moves its rows with the backend's pitched copy,
   many rows a call, not one call per row (up to 2^20 rows: seconds of cudaMemcpyAsync).
   Tensor 0 of 1024 rows of 32 bytes keeps the second half of each row (16 bytes at offset
   16, new row pitch 16). On the mpi backend the wrapper plays a device backend whose
   pitched copy moves the rows of one call in reverse order (a device copies them in no
   order): a batch whose destinations overlap one of its sources corrupts the result. */
static tide_coll_backend_v1 drec;
static int drec_copies, drec_rows;

static tide_status drec_copy2d(void *dst, size_t dp, const void *src, size_t sp, size_t w, size_t h,
                               tide_coll_stream_t s)
{
    drec_copies++;
    drec_rows += (int)h;
    if (be->mem_kind != TIDE_MEM_HOST)
        return be->copy2d(dst, dp, src, sp, w, h, s);
    for (size_t k = h; k-- > 0;)
        memmove((char *)dst + k * dp, (const char *)src + k * sp, w);
    return TIDE_OK;
}

static void test_executor_shrink_rows(void)
{
    enum { ROWS = 1024, W = 16 };
    drec = *be;
    drec.name = "drec";
    drec.mem_kind = TIDE_MEM_DEVICE; /* on mpi: host memory under a device's rules */
    drec.copy2d = drec_copy2d;
    int *m = malloc(sizeof(int) * (size_t)np);
    for (int i = 0; i < np; i++)
        m[i] = i;
    tide_coll_comm_params cp = {
        .members = m, .n_members = np, .tag = next_tag++, .timeout_ms = 20000};
    tide_coll_comm_t *c = NULL;
    MT_OK(tide_coll_comm_new(&c, &drec, pool, &cp));
    free(m);
    tide_mem_pool_t *mp = NULL;
    MT_OK(tide_mem_pool_new(&mp, &drec, 0));
    uint64_t old_bytes[1] = {2 * W * ROWS}, new_bytes[1] = {W * ROWS};
    unsigned char *old = malloc(2 * W * ROWS), *want = malloc(W * ROWS), *got = malloc(W * ROWS);
    void *bufs[1];
    MT_OK(tide_mem_pool_alloc(mp, 2 * W * ROWS, &bufs[0]));
    for (int i = 0; i < 2 * W * ROWS; i++)
        old[i] = (unsigned char)(me * 13 + i * 7 + i / 251);
    for (int r = 0; r < ROWS; r++)
        memcpy(want + r * W, old + r * 2 * W + W, W);
    put(bufs[0], old, 2 * W * ROWS);
    tide_xfer *items = calloc((size_t)np, sizeof *items);
    for (int w = 0; w < np; w++)
        items[w] = (tide_xfer){.tensor = 0,
                               .src = w,
                               .dst = w,
                               .src_off = W,
                               .src_stride = 2 * W,
                               .dst_stride = W,
                               .run = W,
                               .count = ROWS};
    tide_plan_t plan = {.items = items, .n = (size_t)np};
    uint8_t moved[1] = {0};
    tide_exec_in_place ip = {.pool = mp,
                             .worker = me,
                             .bufs = bufs,
                             .old_bytes = old_bytes,
                             .new_bytes = new_bytes,
                             .moved = moved};
    const uint64_t **ob = calloc((size_t)np, sizeof *ob), **nb = calloc((size_t)np, sizeof *nb);
    ob[me] = old_bytes;
    nb[me] = new_bytes;
    tide_exec_args a = {.plan = &plan,
                        .n_workers = (size_t)np,
                        .n_tensors = 1,
                        .old_bytes = (const uint64_t *const *)ob,
                        .new_bytes = (const uint64_t *const *)nb,
                        .in_place = &ip};
    tide_exec_opts o;
    tide_exec_opts_init(&o);
    tide_exec_stats st;
    drec_copies = drec_rows = 0;
    MT_OK(tide_reshard_execute(c, &a, &o, &st));
    MT_ASSERT(st.bytes_shrunk == W * ROWS && !moved[0], "tensor 0 shrank in place (%llu bytes)",
              (unsigned long long)st.bytes_shrunk);
    get(got, bufs[0], W * ROWS);
    MT_ASSERT(memcmp(got, want, W * ROWS) == 0, "the rows shrunk in place differ");
    MT_ASSERT(drec_rows == ROWS && drec_copies <= 24,
              "%d rows moved in %d copies (one per row costs seconds at 2^20 rows; doubling "
              "batches take about log2(rows))",
              drec_rows, drec_copies);
    if (me == 0)
        printf("executor_shrink_rows: %d rows in %d pitched copies\n", drec_rows, drec_copies);
    tide_coll_comm_destroy(&c);
    tide_mem_pool_free(mp, bufs[0]);
    tide_mem_pool_destroy(&mp);
    free(items);
    free(ob);
    free(nb);
    free(old);
    free(want);
    free(got);
    mt_pass("executor_shrink_rows");
}

/* ---- executor: reshard planner plans --------------------------------------------------------- */

#ifdef TIDE_TEST_HAVE_RESHARD
static void random_layout(uint64_t *s, int max_workers, int layers, tide_layout_t **out)
{
    static const int choices[][3] = {{1, 1, 1}, {2, 1, 1}, {1, 2, 1}, {1, 1, 2}, {2, 2, 1},
                                     {2, 1, 2}, {1, 2, 2}, {4, 1, 1}, {1, 4, 1}, {1, 1, 4},
                                     {2, 2, 2}, {1, 4, 2}, {4, 2, 1}, {2, 4, 1}};
    for (;;) {
        const int *d = choices[rng_below(s, sizeof choices / sizeof choices[0])];
        if (d[0] * d[1] * d[2] > max_workers)
            continue;
        MT_OK(tide_layout_new(out, d[0], d[1], d[2], layers, 1));
        /* random placement over worker ids 0..max_workers-1 */
        int ids[64];
        for (int i = 0; i < max_workers; i++)
            ids[i] = i;
        for (int i = max_workers - 1; i > 0; i--) {
            int j = (int)rng_below(s, (uint64_t)i + 1), t = ids[i];
            ids[i] = ids[j];
            ids[j] = t;
        }
        for (size_t i = 0; i < tide_layout_size(*out); i++)
            (*out)->worker[i] = ids[i];
        return;
    }
}

static void shard_bufs(const tide_layout_t *l, const tide_collection_t *col, unsigned char **global,
                       const int *rank_of, int fill_from_global, void ***bufs, uint64_t **bytes)
{
    size_t T = tide_collection_size(col);
    for (int p = 0; p < l->pp; p++)
        for (int d = 0; d < l->dp; d++)
            for (int t = 0; t < l->tp; t++) {
                int w = l->worker[tide_layout_index(l, p, d, t)];
                if (rank_of[w] != me)
                    continue;
                for (size_t i = 0; i < T; i++) {
                    uint64_t b = tide_shard_bytes(l, col, i, p, d, t);
                    if (b == 0)
                        continue;
                    unsigned char *h = malloc(b);
                    if (fill_from_global)
                        tide_shard_extract(l, col, i, p, d, t, global[i], h);
                    else
                        memset(h, 0xEE, b);
                    bufs[w][i] = dalloc(b);
                    put(bufs[w][i], h, b);
                    bytes[w][i] = b;
                    free(h);
                }
            }
}

static void test_executor_reshard(void)
{
    tide_coll_comm_t *c = world_comm();
    uint64_t s = seed ^ 0x5555;
    int max_workers = np * 2 < 8 ? np * 2 : 8;
    for (int iter = 0; iter < 6; iter++) {
        tide_model_spec spec = {.layers = 4,
                                .hidden = 8,
                                .ffn = 16,
                                .heads = 2,
                                .vocab = 16,
                                .attention = (int)rng_below(&s, 2),
                                .adam = 1,
                                .zero1 = (int)rng_below(&s, 2),
                                .dtype = TIDE_F32};
        tide_collection_t *col = NULL;
        MT_OK(tide_collection_build_gpt(&col, &spec));
        tide_layout_t *ol = NULL, *nl = NULL;
        random_layout(&s, max_workers, spec.layers, &ol);
        random_layout(&s, max_workers, spec.layers, &nl);
        tide_plan_t *plan = NULL;
        MT_OK(tide_reshard_plan(ol, nl, col, NULL, 0, &plan));
        size_t T = tide_collection_size(col);
        unsigned char **global = calloc(T, sizeof *global);
        for (size_t i = 0; i < T; i++) {
            uint64_t b = tide_tensor_bytes(tide_collection_tensor(col, i));
            global[i] = malloc(b);
            for (uint64_t k = 0; k < b; k++)
                global[i][k] = gbyte((int)i + iter * 1000, 0, (uint32_t)k);
        }
        int W = max_workers;
        int rank_of[64];
        for (int w = 0; w < W; w++)
            rank_of[w] = w % np;
        void ***ob = calloc((unsigned)W, sizeof *ob), ***nb = calloc((unsigned)W, sizeof *nb);
        uint64_t **os = calloc((unsigned)W, sizeof *os), **ns = calloc((unsigned)W, sizeof *ns);
        for (int w = 0; w < W; w++) {
            ob[w] = calloc(T, sizeof **ob);
            nb[w] = calloc(T, sizeof **nb);
            os[w] = calloc(T, sizeof **os);
            ns[w] = calloc(T, sizeof **ns);
        }
        shard_bufs(ol, col, global, rank_of, 1, ob, os);
        shard_bufs(nl, col, global, rank_of, 0, nb, ns);
        tide_exec_args a = {.plan = plan,
                            .n_workers = (size_t)W,
                            .n_tensors = T,
                            .rank_of_worker = rank_of,
                            .old_bufs = (void *const *const *)ob,
                            .new_bufs = (void *const *const *)nb,
                            .old_bytes = (const uint64_t *const *)os,
                            .new_bytes = (const uint64_t *const *)ns};
        tide_exec_opts o;
        tide_exec_opts_init(&o);
        o.staging_cap = 512 + rng_below(&s, 8192);
        o.max_chunk = 1 + rng_below(&s, 1024);
        o.pack_below = iter % 2 ? 1 + (uint64_t)iter * 100 : 0; /* in place and staged mixed */
        tide_exec_stats st;
        MT_OK(tide_reshard_execute(c, &a, &o, &st));
        exec_direct += st.bytes_direct;
        MT_ASSERT(st.peak_staging <= o.staging_cap, "staging %llu > cap",
                  (unsigned long long)st.peak_staging);
        /* The new shards are exactly the new layout's shards of the original state. */
        for (int p = 0; p < nl->pp; p++)
            for (int d = 0; d < nl->dp; d++)
                for (int t = 0; t < nl->tp; t++) {
                    int w = nl->worker[tide_layout_index(nl, p, d, t)];
                    if (rank_of[w] != me)
                        continue;
                    for (size_t i = 0; i < T; i++) {
                        uint64_t b = ns[w][i];
                        if (b == 0)
                            continue;
                        unsigned char *want = malloc(b), *got = malloc(b);
                        tide_shard_extract(nl, col, i, p, d, t, global[i], want);
                        get(got, nb[w][i], b);
                        MT_ASSERT(memcmp(want, got, b) == 0, "iter %d tensor %s worker %d", iter,
                                  tide_collection_tensor(col, i)->name, w);
                        free(want);
                        free(got);
                    }
                }
        uint64_t sent = st.bytes_sent, all = 0;
        MPI_Allreduce(&sent, &all, 1, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD);
        MT_ASSERT(all == plan->summary.bytes_sent, "bytes sent %llu, plan says %llu",
                  (unsigned long long)all, (unsigned long long)plan->summary.bytes_sent);
        for (int w = 0; w < W; w++) {
            for (size_t i = 0; i < T; i++) {
                if (ob[w][i])
                    be->mem_free(ob[w][i]);
                if (nb[w][i])
                    be->mem_free(nb[w][i]);
            }
            free(ob[w]);
            free(nb[w]);
            free(os[w]);
            free(ns[w]);
        }
        free(ob);
        free(nb);
        free(os);
        free(ns);
        for (size_t i = 0; i < T; i++)
            free(global[i]);
        free(global);
        tide_plan_destroy(&plan);
        tide_layout_destroy(&ol);
        tide_layout_destroy(&nl);
        tide_collection_destroy(&col);
    }
    tide_coll_comm_destroy(&c);
    mt_pass("executor_reshard_plans");
}
#endif

/* The executor's plans again with every message eligible for single copy
   (TIDE_COLL_CMA_MIN=1): the same bit-identical checks, now through the direct path
   wherever one end of a message is strided and the other not; and with TIDE_COLL_CMA=0
   nothing goes that way. */
static void test_executor_direct(void)
{
    if (strcmp(be->name, "mpi") != 0 || np < 2)
        return;
    cma_env("TIDE_COLL_CMA_MIN", "1");
    tide_coll_comm_t *c = world_comm();
    int any = check_agreement(c, 0);
    tide_coll_comm_destroy(&c);
    exec_direct = 0;
    test_executor_random();
#ifdef TIDE_TEST_HAVE_RESHARD
    test_executor_reshard();
#endif
    uint64_t all = 0;
    MPI_Allreduce(&exec_direct, &all, 1, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD);
    uint64_t used = all;
    if (any)
        MT_ASSERT(all > 0, "single copy agreed but never used by the executor's plans");
    else if (me == 0)
        printf("NOTE: no single-copy peers here; executor results checked only\n");
    cma_env("TIDE_COLL_CMA", "0");
    exec_direct = 0;
    test_executor_random();
    MPI_Allreduce(&exec_direct, &all, 1, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD);
    MT_ASSERT(all == 0, "single copy used with TIDE_COLL_CMA=0");
    cma_env("TIDE_COLL_CMA", NULL);
    cma_env("TIDE_COLL_CMA_MIN", NULL);
    if (me == 0)
        printf("executor_direct: passed (%llu bytes of the executor's plans by single copy)\n",
               (unsigned long long)used);
}

/* ---- main ----------------------------------------------------------------------------------- */

int main(int argc, char **argv)
{
    const char *name = "mpi";
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--backend") == 0 && i + 1 < argc)
            name = argv[++i];
        else if (strcmp(argv[i], "--seed") == 0 && i + 1 < argc)
            seed = strtoull(argv[++i], NULL, 10);
    }
#ifdef TIDE_HAVE_CUDA
    if (strcmp(name, "nccl") == 0)
        tide_test_require_gpu("collectives conformance (nccl)");
#endif
    int provided = 0;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    MPI_Comm_size(MPI_COMM_WORLD, &np);
    MT_ASSERT(np <= 64, "at most 64 ranks");
    if (tide_coll_backend_find(name, &be) != TIDE_OK) {
        if (me == 0)
            printf("SKIP: backend %s: %s\n", name, tide_last_error());
        MPI_Finalize();
        return 77;
    }
    MT_OK(tide_coll_pool_new(&pool, MPI_COMM_WORLD));
    if (me == 0)
        printf("conformance: backend %s, %d ranks, seed %llu\n", name, np,
               (unsigned long long)seed);
    uint64_t t0 = tide_now_ns();
    test_lookup();
    test_comm_basics();
    test_collectives();
    test_subsets();
    test_split();
    test_p2p();
    test_abort();
    test_watch();
    test_p2p_direct();
    test_direct_errors();
    test_executor_random();
    test_executor_errors();
    test_executor_abort_first();
    test_executor_shrink_spill();
    test_executor_shrink_rows();
#ifdef TIDE_TEST_HAVE_RESHARD
    test_executor_reshard();
#else
    if (me == 0)
        printf("executor_reshard_plans: not built (reshard/ has no library yet)\n");
#endif
    test_executor_direct();
    tide_coll_pool_destroy(&pool);
    if (me == 0)
        printf("conformance: all passed in %.2f s\n", (double)(tide_now_ns() - t0) / 1e9);
    MPI_Finalize();
    return 0;
}
