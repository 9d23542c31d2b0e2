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
 *
 * One program in four sources: this file holds main() (the cases, called in the order
 * they run), lookup, communicators, collectives, splits, p2p, abort and watch words;
 * test_conf_direct.c the single-copy path; test_conf_executor.c the executor's plans;
 * test_conf_exec_wrapped.c the executor over wrapped backends; conf_fixture.h what they
 * share.
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
#include "conf_fixture.h"
#include "mpi_test.h"
#ifdef TIDE_HAVE_CUDA
#include "gpu_test.h"
#endif

const tide_coll_backend_v1 *be;
tide_coll_pool_t *pool;
int me, np;
uint64_t seed = 12345;
int next_tag = 1; /* creation tags; advanced identically on every rank */

/* ---- helpers ---------------------------------------------------------------------- */

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
