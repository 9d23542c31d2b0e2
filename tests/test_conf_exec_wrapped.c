/*
 * Part of test_collectives_conformance (the collectives conformance suite; its cases run
 * in the order of main() in test_collectives_conformance.c): the reshard executor over
 * wrappers of the backend under test. A failure once data moves (an injected device copy
 * error) aborting the communicator before the cleanup's device work (staging freed,
 * spilled shards copied back), which restores the old shards; a shrink in place under a
 * memory limit that only spilling meets, with the spill memory taken before the reshard;
 * a device backend's shrink in place moving many rows per pitched copy.
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
void test_executor_abort_first(void)
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

void test_executor_shrink_spill(void)
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

void test_executor_shrink_rows(void)
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
