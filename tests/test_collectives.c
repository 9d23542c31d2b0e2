/*
 * Unit tests for collectives/ pieces that need no running MPI job: backend lookup,
 * the host reductions (bf16 rounding included) that make results bit-identical on
 * every rank, argument checks of the wrappers and of the executor, and the refusal
 * to build a pool before MPI is initialised.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "collectives/collectives.h"
#include "collectives/collectives_int.h"
#include "collectives/executor.h"

Test(coll_backend, lookup_by_name)
{
    const tide_coll_backend_v1 *be = NULL;
    cr_assert_eq(tide_coll_backend_find("mpi", &be), TIDE_OK);
    cr_assert_str_eq(be->name, "mpi");
    cr_assert_eq(be->mem_kind, TIDE_MEM_HOST);
    cr_assert_eq(be->version, TIDE_COLL_BACKEND_VERSION);
    cr_expect(be->comm_create && be->comm_split && be->comm_destroy && be->comm_abort &&
              be->p2p_start && be->req_test && be->req_wait && be->req_free && be->allreduce &&
              be->broadcast && be->allgather && be->reduce_scatter && be->barrier &&
              be->mem_alloc && be->mem_free && be->copy2d && be->copy_host && be->stream_sync);
    cr_expect_eq(tide_coll_backend_find("ucc", &be), TIDE_ERR_NOT_FOUND);
    cr_expect_null(be);
    cr_expect(strstr(tide_last_error(), "ucc") != NULL);
#ifdef TIDE_HAVE_NCCL
    cr_expect_eq(tide_coll_backend_find("nccl", &be), TIDE_OK);
    cr_expect_eq(be->mem_kind, TIDE_MEM_DEVICE);
    cr_expect_str_eq(tide_coll_backend_names(), "mpi,nccl");
#else
    cr_expect_eq(tide_coll_backend_find("nccl", &be), TIDE_ERR_NOT_FOUND);
    cr_expect(strstr(tide_last_error(), "CUDA") != NULL);
#endif
}

Test(coll_backend, dtypes)
{
    const tide_coll_backend_v1 *be = NULL;
    cr_assert_eq(tide_coll_backend_find("mpi", &be), TIDE_OK);
    cr_expect(tide_coll_backend_has_dtype(be, TIDE_F32));
    cr_expect(tide_coll_backend_has_dtype(be, TIDE_F64));
    cr_expect(tide_coll_backend_has_dtype(be, TIDE_BF16));
    cr_expect(tide_coll_backend_has_dtype(be, TIDE_I32));
    cr_expect(tide_coll_backend_has_dtype(be, TIDE_I64));
    cr_expect(!tide_coll_backend_has_dtype(be, TIDE_F16));
    cr_expect(!tide_coll_backend_has_dtype(be, TIDE_U8));
    cr_expect(!tide_coll_backend_has_dtype(NULL, TIDE_F32));
}

Test(coll_reduce, bf16_rounds_to_nearest_even)
{
    cr_expect_eq(tide__f32_to_bf16(1.0f), 0x3f80);
    cr_expect_eq(tide__bf16_to_f32(0x3f80), 1.0f);
    /* 1 + 2^-8 is exactly half way between bf16 1.0 and 1 + 2^-7: ties to even (1.0). */
    cr_expect_eq(tide__f32_to_bf16(1.0f + 0x1p-8f), 0x3f80);
    /* 1 + 3 * 2^-8 is half way between 1 + 2^-7 (odd) and 1 + 2^-6: goes up. */
    cr_expect_eq(tide__f32_to_bf16(1.0f + 3 * 0x1p-8f), 0x3f82);
    cr_expect_eq(tide__f32_to_bf16(1.0f + 0x1p-8f + 0x1p-20f), 0x3f81);
    cr_expect(isnan(tide__bf16_to_f32(tide__f32_to_bf16(NAN))));
    cr_expect_eq(tide__f32_to_bf16(-2.0f), 0xc000);
}

Test(coll_reduce, every_dtype_and_op)
{
    float f[3] = {1, -2, 3.5f}, g[3] = {2, -5, 0.25f};
    tide__reduce_host(f, g, 3, TIDE_F32, TIDE_RED_SUM);
    cr_expect(f[0] == 3 && f[1] == -7 && f[2] == 3.75f);
    tide__reduce_host(f, g, 3, TIDE_F32, TIDE_RED_MAX);
    cr_expect(f[0] == 3 && f[1] == -5 && f[2] == 3.75f);
    double d[2] = {1e300, -1}, e[2] = {1e300, 4};
    tide__reduce_host(d, e, 2, TIDE_F64, TIDE_RED_MAX);
    cr_expect(d[0] == 1e300 && d[1] == 4);
    int32_t i[2] = {INT32_MAX, -3}, j[2] = {1, -4};
    tide__reduce_host(i, j, 2, TIDE_I32, TIDE_RED_SUM); /* wraps, no UB */
    cr_expect(i[0] == INT32_MIN && i[1] == -7);
    int64_t k[2] = {5, -9}, l[2] = {-6, -8};
    tide__reduce_host(k, l, 2, TIDE_I64, TIDE_RED_MAX);
    cr_expect(k[0] == 5 && k[1] == -8);
    uint16_t b[2] = {tide__f32_to_bf16(1.5f), tide__f32_to_bf16(-3)};
    uint16_t c[2] = {tide__f32_to_bf16(2.25f), tide__f32_to_bf16(-1)};
    tide__reduce_host(b, c, 2, TIDE_BF16, TIDE_RED_SUM);
    cr_expect(tide__bf16_to_f32(b[0]) == 3.75f && tide__bf16_to_f32(b[1]) == -4.0f);
    cr_expect_eq(tide__red_dtype_size(TIDE_BF16), 2);
    cr_expect_eq(tide__red_dtype_size(TIDE_U8), 0);
}

Test(coll_wrappers, arguments_are_checked_without_a_job)
{
    int x = 0;
    cr_expect_eq(tide_coll_allreduce(NULL, &x, &x, 1, TIDE_I32, TIDE_RED_SUM, NULL),
                 TIDE_ERR_INVALID);
    cr_expect_eq(tide_coll_barrier(NULL, NULL), TIDE_ERR_INVALID);
    cr_expect_eq(tide_coll_group_p2p(NULL, NULL, 0, NULL), TIDE_ERR_INVALID);
    tide_coll_comm_t *c = (tide_coll_comm_t *)&x;
    cr_expect_eq(tide_coll_comm_split(NULL, 0, 0, &c), TIDE_ERR_INVALID);
    cr_expect_null(c);
    tide_coll_comm_abort(NULL);
    tide_coll_comm_destroy(NULL);
    cr_expect(tide_coll_comm_aborted(NULL));
    cr_expect_eq(tide_coll_comm_size(NULL), 0);
    tide_coll_pool_t *pool = (tide_coll_pool_t *)&x;
    cr_expect_eq(tide_coll_pool_new(&pool, MPI_COMM_WORLD), TIDE_ERR_INVALID);
    cr_expect_null(pool);
    cr_expect(strstr(tide_last_error(), "MPI_Init_thread") != NULL);
}

Test(coll_executor, defaults_and_arguments)
{
    tide_exec_opts o;
    tide_exec_opts_init(&o);
    cr_expect_eq(o.staging_cap, 256ull << 20);
    cr_expect_eq(o.max_chunk, TIDE_EXEC_DEFAULT_MAX_CHUNK);
    cr_expect_null(o.progress);
    tide_exec_stats st;
    memset(&st, 0xff, sizeof st);
    cr_expect_eq(tide_reshard_execute(NULL, NULL, &o, &st), TIDE_ERR_INVALID);
    cr_expect_eq(st.bytes_sent, 0);
}

/* ---- copies without the pitch limit (tide__copy2d_split) ------------------------------ */

typedef struct copy_log {
    size_t max_pitch;
    int flats, rects, bad;
} copy_log;

static tide_status log_flat(void *ctx, void *dst, const void *src, size_t bytes)
{
    ((copy_log *)ctx)->flats++;
    memmove(dst, src, bytes);
    return TIDE_OK;
}

static tide_status log_rect(void *ctx, void *dst, size_t dpitch, const void *src, size_t spitch,
                            size_t width, size_t height)
{
    copy_log *l = ctx;
    l->rects++;
    /* what cudaMemcpy2DAsync refuses */
    if (dpitch > l->max_pitch || spitch > l->max_pitch || width > dpitch || width > spitch)
        l->bad++;
    for (size_t r = 0; r < height; r++)
        memcpy((char *)dst + r * dpitch, (const char *)src + r * spitch, width);
    return TIDE_OK;
}

/* Copies height rows of width bytes through the splitter with the given limit and checks
   the result against a plain row loop, byte for byte (the padding left untouched). */
static copy_log run_copy(size_t dpitch, size_t spitch, size_t width, size_t height,
                         size_t max_pitch)
{
    size_t sn = spitch * height, dn = dpitch * height;
    unsigned char *src = malloc(sn), *dst = malloc(dn), *ref = malloc(dn);
    for (size_t i = 0; i < sn; i++)
        src[i] = (unsigned char)(i * 7 + 3);
    memset(dst, 0xee, dn);
    memset(ref, 0xee, dn);
    for (size_t r = 0; r < height; r++)
        memcpy(ref + r * dpitch, src + r * spitch, width);
    copy_log l = {max_pitch, 0, 0, 0};
    static const tide__copy2d_fns fns = {log_flat, log_rect};
    cr_assert_eq(tide__copy2d_split(dst, dpitch, src, spitch, width, height, max_pitch, &fns, &l),
                 TIDE_OK);
    cr_expect_eq(memcmp(dst, ref, dn), 0, "dpitch %zu spitch %zu width %zu height %zu limit %zu",
                 dpitch, spitch, width, height, max_pitch);
    cr_expect_eq(l.bad, 0, "a 2D copy beyond the pitch limit was issued");
    free(src);
    free(dst);
    free(ref);
    return l;
}

Test(coll_copy2d, contiguous_beyond_the_pitch_limit_is_one_flat_copy)
{
    /* a 2.25 GiB fc1 weight at tp 1, scaled down: one row wider than the limit */
    copy_log l = run_copy(4096, 4096, 4096, 1, 1000);
    cr_expect_eq(l.flats, 1);
    cr_expect_eq(l.rects, 0);
    /* rows back to back at both ends: one flat copy whatever the pitch */
    l = run_copy(3000, 3000, 3000, 5, 1000);
    cr_expect_eq(l.flats, 1);
    cr_expect_eq(l.rects, 0);
}

Test(coll_copy2d, pitched_within_the_limit_is_one_2d_copy)
{
    copy_log l = run_copy(64, 96, 48, 9, 1000);
    cr_expect_eq(l.rects, 1);
    cr_expect_eq(l.flats, 0);
    cr_expect_eq(tide__copy2d_choose(64, 96, 48, 9, 96), TIDE__COPY_2D);
}

Test(coll_copy2d, pitched_beyond_the_limit_copies_row_by_row)
{
    /* a column slice of rows longer than the limit: either pitch too large */
    copy_log l = run_copy(2048, 4096, 2048, 3, 1000);
    cr_expect_eq(l.rects, 0);
    cr_expect_eq(l.flats, 3);
    l = run_copy(4096, 1500, 1200, 4, 2000);
    cr_expect_eq(l.flats, 4);
    cr_expect_eq(tide__copy2d_choose(2001, 64, 64, 2, 2000), TIDE__COPY_ROWS);
}

Test(coll_copy2d, empty_copies_do_nothing)
{
    copy_log l = run_copy(16, 16, 0, 3, 8);
    cr_expect_eq(l.flats + l.rects, 0);
}

Test(coll_mem, host_backend_wrappers)
{
    const tide_coll_backend_v1 *mpi = NULL;
    cr_assert_eq(tide_coll_backend_find("mpi", &mpi), TIDE_OK);
    cr_expect_eq(tide_coll_device_bind(mpi, 3), TIDE_OK); /* a host backend binds nothing */
    void *p = NULL;
    cr_assert_eq(tide_coll_mem_alloc(mpi, 0, 64, &p), TIDE_OK);
    memset(p, 0x5a, 64);
    cr_expect_eq(tide_coll_mem_zero(mpi, 0, p, 64), TIDE_OK);
    for (int i = 0; i < 64; i++)
        cr_expect_eq(((unsigned char *)p)[i], 0);
    cr_expect_eq(tide_coll_mem_check(mpi, p, 64, "tensor w"), TIDE_OK);
    cr_expect_eq(tide_coll_mem_check(mpi, NULL, 64, "tensor w"), TIDE_ERR_INVALID);
    cr_expect(strstr(tide_last_error(), "tensor w") != NULL);
    tide_coll_stream_t s = (tide_coll_stream_t)p;
    cr_expect_eq(tide_coll_stream_new_low(mpi, 0, &s), TIDE_OK);
    cr_expect_null(s);
    tide_coll_stream_free(mpi, s);
    mpi->mem_free(p);
}

Test(coll_mem, registered_backends_are_found_and_names_stay_unique)
{
    const tide_coll_backend_v1 *mpi = NULL;
    cr_assert_eq(tide_coll_backend_find("mpi", &mpi), TIDE_OK);
    static tide_coll_backend_v1 wrap;
    wrap = *mpi;
    wrap.name = "wrap";
    cr_expect_eq(tide_coll_backend_register(&wrap), TIDE_OK);
    const tide_coll_backend_v1 *got = NULL;
    cr_expect_eq(tide_coll_backend_find("wrap", &got), TIDE_OK);
    cr_expect_eq(got, &wrap);
    cr_expect_eq(tide_coll_backend_register(&wrap), TIDE_ERR_EXISTS);
    static tide_coll_backend_v1 old;
    old = *mpi;
    old.name = "old";
    old.version = 0;
    cr_expect_eq(tide_coll_backend_register(&old), TIDE_ERR_UNSUPPORTED);
}

/* ---- the memory pool behind in-place switches (collectives/pool.h) ---- */

static tide_mem_pool_t *host_pool(void)
{
    const tide_coll_backend_v1 *be = NULL;
    cr_assert_eq(tide_coll_backend_find("mpi", &be), TIDE_OK);
    tide_mem_pool_t *p = NULL;
    cr_assert_eq(tide_mem_pool_new(&p, be, 0), TIDE_OK);
    return p;
}

Test(mem_pool, freed_blocks_are_reused_not_returned)
{
    tide_mem_pool_t *p = host_pool();
    tide_mem_pool_stats st;
    void *a = NULL, *b = NULL, *c = NULL;
    cr_assert_eq(tide_mem_pool_alloc(p, 1 << 20, &a), TIDE_OK);
    cr_expect(tide_mem_pool_owns(p, a));
    memset(a, 7, 1 << 20);
    tide_mem_pool_free(p, a);
    cr_expect_not(tide_mem_pool_owns(p, a));
    tide_mem_pool_mark(p);
    /* a block a little smaller reuses the cached one; one much smaller does not */
    cr_assert_eq(tide_mem_pool_alloc(p, (1 << 20) - 1000, &b), TIDE_OK);
    cr_expect_eq(b, a);
    cr_assert_eq(tide_mem_pool_alloc(p, 4096, &c), TIDE_OK);
    cr_expect_neq(c, a);
    tide_mem_pool_stats_get(p, &st);
    cr_expect_eq(st.reused, 1 << 20);
    cr_expect_eq(st.fresh, 4096);
    cr_expect_eq(st.in_use, (1 << 20) + 4096);
    cr_expect_eq(st.cached, 0);
    tide_mem_pool_free(p, b);
    tide_mem_pool_free(p, c);
    tide_mem_pool_free(p, NULL);
    tide_mem_pool_trim(p);
    tide_mem_pool_stats_get(p, &st);
    cr_expect_eq(st.in_use + st.cached, 0);
    tide_mem_pool_destroy(&p);
    cr_expect_null(p);
    tide_mem_pool_destroy(&p);
}

Test(mem_pool, a_strict_limit_fails_and_a_soft_one_goes_over)
{
    tide_mem_pool_t *p = host_pool();
    void *a = NULL, *b = NULL, *c = NULL;
    cr_assert_eq(tide_mem_pool_alloc(p, 8192, &a), TIDE_OK);
    tide_mem_pool_free(p, a);
    tide_mem_pool_set_limit(p, 16384, 1);
    /* the cached 8 KiB block goes back to the system to make room for a 12 KiB one */
    cr_assert_eq(tide_mem_pool_alloc(p, 12288, &b), TIDE_OK);
    tide_mem_pool_stats st;
    tide_mem_pool_stats_get(p, &st);
    cr_expect_eq(st.cached, 0);
    cr_expect_eq(tide_mem_pool_alloc(p, 8192, &c), TIDE_ERR_NOMEM);
    cr_expect_null(c);
    cr_expect(strstr(tide_last_error(), "limit") != NULL);
    tide_mem_pool_set_limit(p, 16384, 0);
    cr_expect_eq(tide_mem_pool_alloc(p, 8192, &c), TIDE_OK);
    tide_mem_pool_stats_get(p, &st);
    cr_expect_eq(st.peak_in_use, 12288 + 8192);
    tide_mem_pool_free(p, b);
    tide_mem_pool_free(p, c);
    tide_mem_pool_destroy(&p);
}

Test(mem_pool, reserve_touches_ahead_within_its_room_and_shrink_gives_back_pages)
{
    tide_mem_pool_t *p = host_pool();
    uint64_t sizes[3] = {1 << 20, 0, 2 << 20};
    cr_assert_eq(tide_mem_pool_reserve(p, sizes, 3, 1 << 20), TIDE_OK); /* room: the first */
    tide_mem_pool_stats st;
    tide_mem_pool_stats_get(p, &st);
    cr_expect_eq(st.cached, 1 << 20);
    cr_assert_eq(tide_mem_pool_reserve(p, sizes, 3, 0), TIDE_OK); /* the first is there */
    tide_mem_pool_stats_get(p, &st);
    cr_expect_eq(st.cached, 3 << 20);
    tide_mem_pool_mark(p);
    void *a = NULL;
    cr_assert_eq(tide_mem_pool_alloc(p, 2 << 20, &a), TIDE_OK);
    tide_mem_pool_stats_get(p, &st);
    cr_expect_eq(st.fresh, 0);
    memset(a, 3, 2 << 20);
    tide_mem_pool_shrink(p, a, 1000);
    uint64_t cap = tide_mem_pool_capacity(p, a); /* up to the next page boundary */
    cr_expect(cap >= 1000 && cap <= 1000 + 4096, "capacity %llu", (unsigned long long)cap);
    cr_expect_eq(((unsigned char *)a)[999], 3);
    void *h = NULL;
    cr_assert_eq(tide_mem_pool_spill_alloc(p, 5000, &h), TIDE_OK);
    tide_mem_pool_stats_get(p, &st);
    cr_expect_eq(st.spill, 5000);
    tide_mem_pool_spill_free(p, h, 5000);
    tide_mem_pool_free(p, a);
    tide_mem_pool_destroy(&p);
}

/* Whether all pages of [p, p + bytes) are resident (mincore), but for the partial
   pages at either end (the pool maps the whole pages inside a block). */
static int mapped(const void *p, size_t bytes)
{
    long pg = sysconf(_SC_PAGESIZE);
    uintptr_t from = ((uintptr_t)p + (uintptr_t)pg - 1) & ~((uintptr_t)pg - 1);
    uintptr_t to = ((uintptr_t)p + bytes) & ~((uintptr_t)pg - 1);
    size_t n = (to - from) / (size_t)pg, in = 0;
    unsigned char *v = malloc(n ? n : 1);
    cr_assert_not_null(v);
    cr_assert_eq(mincore((void *)from, to - from, v), 0);
    for (size_t i = 0; i < n; i++)
        in += v[i] & 1;
    free(v);
    return n > 0 && in == n;
}

Test(mem_pool, fresh_blocks_are_mapped_ahead_and_warming_keeps_the_bytes)
{
    tide_mem_pool_t *p = host_pool();
    size_t big = (size_t)3 << 20;
    /* an allocation and a reservation both hand out blocks whose pages are all mapped:
       the switch that receives into them takes no page fault */
    void *a = NULL;
    cr_assert_eq(tide_mem_pool_alloc(p, big, &a), TIDE_OK);
    cr_expect(mapped(a, big), "an allocated block is not mapped");
    uint64_t sizes[1] = {big};
    cr_assert_eq(tide_mem_pool_reserve(p, sizes, 1, 0), TIDE_OK);
    void *b = NULL;
    tide_mem_pool_mark(p);
    cr_assert_eq(tide_mem_pool_alloc(p, big, &b), TIDE_OK);
    tide_mem_pool_stats st;
    tide_mem_pool_stats_get(p, &st);
    cr_expect_eq(st.fresh, 0, "the reserved block was taken");
    cr_expect(mapped(b, big), "a reserved block is not mapped");
    /* warming (an unaligned, odd range, and nothing for NULL) leaves every byte as it was */
    unsigned char *u = a;
    for (size_t i = 0; i < big; i++)
        u[i] = (unsigned char)(i * 131u + 7u);
    tide_mem_pool_warm(p, u + 5, big - 11);
    tide_mem_pool_warm(p, NULL, big);
    tide_mem_pool_warm(NULL, u, big);
    for (size_t i = 0; i < big; i++)
        if (u[i] != (unsigned char)(i * 131u + 7u))
            cr_assert_fail("byte %zu changed by warming", i);
    tide_mem_pool_free(p, a);
    tide_mem_pool_free(p, b);
    tide_mem_pool_destroy(&p);
}
