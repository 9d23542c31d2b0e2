/*
 * pool: the block cache behind a rank's state buffers and reshard staging (see pool.h).
 * A flat array of blocks searched linearly: a rank holds tens of them. Host spill blocks
 * (pinned on a GPU) sit in a second array of the same kind, prepared ahead and released
 * by a thread of the pool's own, so that neither cudaMallocHost nor cudaFreeHost runs in
 * a switch.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <unistd.h>

#include "collectives/pool.h"
#include "core/alloc.h"
#include "core/error.h"
#include "core/log.h"

#define POOL_LOG "pool"

typedef struct block {
    void *ptr;
    uint64_t cap; /* bytes */
    int used;
} block;

struct tide_mem_pool {
    pthread_mutex_t mu;
    const tide_coll_backend_v1 *be;
    int device; /* the device the pool's blocks live on (device backends) */
    block *b;
    size_t n, n_cap;
    block *h; /* host spill blocks: used, or kept for the next spill */
    size_t nh, nh_cap;
    pthread_t reaper; /* frees released spill blocks (tide_mem_pool_spill_release) */
    int reaping;      /* reaper started, not joined */
    uint64_t limit;
    int strict;
    tide_mem_pool_stats st;
};

tide_status tide_mem_pool_new(tide_mem_pool_t **out, const tide_coll_backend_v1 *be, int device)
{
    *out = NULL;
    if (be == NULL)
        return tide_errorf(TIDE_ERR_INVALID, "memory pool: no backend");
    tide_mem_pool_t *p = tide_calloc(1, sizeof *p);
    if (p == NULL)
        return tide_errorf(TIDE_ERR_NOMEM, "out of memory for a memory pool");
    pthread_mutex_init(&p->mu, NULL);
    p->be = be;
    p->device = device;
    *out = p;
    return TIDE_OK;
}

static void host_free(const tide_mem_pool_t *p, void *ptr)
{
    if (p->be->host_free != NULL)
        p->be->host_free(ptr);
    else
        tide_free(ptr);
}

static void reap_join(tide_mem_pool_t *p)
{
    if (p->reaping)
        pthread_join(p->reaper, NULL);
    p->reaping = 0;
}

void tide_mem_pool_destroy(tide_mem_pool_t **self_p)
{
    if (self_p == NULL || *self_p == NULL)
        return;
    tide_mem_pool_t *p = *self_p;
    reap_join(p);
    for (size_t i = 0; i < p->n; i++)
        p->be->mem_free(p->b[i].ptr);
    tide_free(p->b);
    for (size_t i = 0; i < p->nh; i++)
        host_free(p, p->h[i].ptr);
    tide_free(p->h);
    pthread_mutex_destroy(&p->mu);
    tide_free(p);
    *self_p = NULL;
}

const tide_coll_backend_v1 *tide_mem_pool_backend(const tide_mem_pool_t *p)
{
    return p->be;
}

static void note_peaks(tide_mem_pool_t *p)
{
    if (p->st.in_use > p->st.peak_in_use)
        p->st.peak_in_use = p->st.in_use;
    if (p->st.in_use + p->st.cached > p->st.peak_held)
        p->st.peak_held = p->st.in_use + p->st.cached;
}

/* Releases cached block i to the system (the last block moves into its place). */
static void drop_block(tide_mem_pool_t *p, size_t i)
{
    p->be->mem_free(p->b[i].ptr);
    p->st.cached -= p->b[i].cap;
    p->b[i] = p->b[--p->n];
}

/* Gives cached blocks back, largest first, until in_use + cached + extra <= limit. */
static void make_room(tide_mem_pool_t *p, uint64_t extra)
{
    while (p->limit > 0 && p->st.in_use + p->st.cached + extra > p->limit) {
        size_t best = p->n;
        for (size_t i = 0; i < p->n; i++)
            if (!p->b[i].used && (best == p->n || p->b[i].cap > p->b[best].cap))
                best = i;
        if (best == p->n)
            return;
        drop_block(p, best);
    }
}

static tide_status push_block(block **b, size_t *n, size_t *n_cap, void *ptr, uint64_t cap,
                              int used)
{
    if (*n == *n_cap) {
        size_t nc = *n_cap ? 2 * *n_cap : 16;
        block *nb = tide_reallocarray(*b, nc, sizeof *nb);
        if (nb == NULL)
            return tide_errorf(TIDE_ERR_NOMEM, "out of memory for the pool's block table");
        *b = nb;
        *n_cap = nc;
    }
    (*b)[(*n)++] = (block){ptr, cap, used};
    return TIDE_OK;
}

static tide_status add_block(tide_mem_pool_t *p, void *ptr, uint64_t cap, int used)
{
    return push_block(&p->b, &p->n, &p->n_cap, ptr, cap, used);
}

/* The cached block to serve bytes from, or p->n: the smallest that fits and is at
   most a fifteenth larger than asked (a larger one would waste what the limit counts). */
static size_t best_fit(const tide_mem_pool_t *p, uint64_t bytes)
{
    size_t best = p->n;
    for (size_t i = 0; i < p->n; i++) {
        const block *b = &p->b[i];
        if (b->used || b->cap < bytes || b->cap - bytes > b->cap / 16)
            continue;
        if (best == p->n || b->cap < p->b[best].cap)
            best = i;
    }
    return best;
}

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23 /* Linux 5.14 */
#endif

/* Blocks from this size up are populated when taken from the system (bytes). */
#define POPULATE_FROM ((uint64_t)1 << 20)

/* Bytes of each self-copy that warms a block for the kernel (see touch). */
#define WARM_PIECE ((size_t)1 << 20)

/* Where those copies go: written only by the kernel, read by no one, so threads warming
   at once may share it (its pages are faulted in once per process). */
static char warm_sink[WARM_PIECE];

/*
 * Has the kernel read [from, to) once through this process's own addresses: copies it,
 * a MiB per call, into warm_sink with process_vm_writev to this very process. On a VM
 * that shadows guest page tables (seen here: a PVM guest) the kernel's first access to
 * each user page, the one a single-copy transfer makes on the copier's side
 * (process_vm_readv/writev), costs a trap to the host: 0.3 GB/s against 4-6 GB/s once
 * warmed, measured with two processes. Elsewhere it is one memcpy of the block. Best
 * effort: where the call is refused (seccomp) the transfers only run slower the first
 * time.
 */
static void warm_for_kernel(uintptr_t from, uintptr_t to)
{
    pid_t me = getpid();
    for (uintptr_t a = from; a < to; a += WARM_PIECE) {
        size_t len = to - a < WARM_PIECE ? (size_t)(to - a) : WARM_PIECE;
        struct iovec local = {(void *)a, len}, remote = {warm_sink, len};
        if (process_vm_writev(me, &local, 1, &remote, 1, 0) < 0)
            break;
    }
}

/*
 * Makes every page of a fresh host block ready for full-speed use, outside any lock (it
 * takes ~0.4 s a GiB on a VM, nothing like that on bare metal). Page faults one at a time
 * cost ~12 us a page there (0.33 GB/s); the kernel maps the whole range in one call
 * (MADV_POPULATE_WRITE, ~5 GB/s), but on a VM whose host backs guest memory lazily the
 * first write to each page still traps to the host afterwards (0.7 GB/s measured), and
 * so does the kernel's first access (warm_for_kernel). So the range is populated, one
 * byte of every page is rewritten with its own value, and the kernel reads it once: what
 * is left after that is memory speed. warm 0: populated only (the kernel's own mapping
 * is then ready, the user's is not). Before Linux 5.14 (no populate) it is zeroed.
 */
static void touch(void *ptr, uint64_t bytes, int warm)
{
    long pg = sysconf(_SC_PAGESIZE);
    uintptr_t from = pg > 0 ? ((uintptr_t)ptr + (uintptr_t)pg - 1) & ~((uintptr_t)pg - 1) : 0;
    uintptr_t to = pg > 0 ? ((uintptr_t)ptr + bytes) & ~((uintptr_t)pg - 1) : 0;
    if (bytes < POPULATE_FROM || to <= from ||
        madvise((void *)from, to - from, MADV_POPULATE_WRITE) != 0) {
        memset(ptr, 0, (size_t)bytes);
        return;
    }
    if (!warm)
        return;
    for (uintptr_t a = from; a < to; a += (uintptr_t)pg) {
        volatile char *c = (volatile char *)a;
        *c = *c;
    }
    warm_for_kernel(from, to);
}

void tide_mem_pool_warm(const tide_mem_pool_t *p, const void *ptr, size_t bytes)
{
    if (p == NULL || ptr == NULL || p->be->mem_kind != TIDE_MEM_HOST || bytes == 0)
        return;
    warm_for_kernel((uintptr_t)ptr, (uintptr_t)ptr + bytes);
}

/* With the lock held: a block from the cache, or fresh; *fresh says which (a fresh host
   block is for the caller to touch once the lock is released). */
static tide_status alloc_locked(tide_mem_pool_t *p, uint64_t bytes, int used, void **out,
                                int *fresh)
{
    *fresh = 0;
    if (bytes == 0)
        bytes = 1;
    size_t i = used ? best_fit(p, bytes) : p->n;
    if (i < p->n) {
        p->b[i].used = 1;
        p->st.cached -= p->b[i].cap;
        p->st.in_use += p->b[i].cap;
        p->st.reused += p->b[i].cap;
        note_peaks(p);
        *out = p->b[i].ptr;
        return TIDE_OK;
    }
    uint64_t extra = bytes;
    if (p->limit > 0 && p->strict && p->st.in_use + extra > p->limit)
        return tide_errorf(TIDE_ERR_NOMEM,
                           "memory limit: %llu bytes in use + %llu asked is over the limit of "
                           "%llu bytes",
                           (unsigned long long)p->st.in_use, (unsigned long long)bytes,
                           (unsigned long long)p->limit);
    make_room(p, extra);
    if (p->limit > 0 && p->st.in_use + p->st.cached + extra > p->limit)
        TIDE_WARN(POOL_LOG, "holding %llu bytes, over the limit of %llu bytes",
                  (unsigned long long)(p->st.in_use + p->st.cached + extra),
                  (unsigned long long)p->limit);
    void *ptr = NULL;
    TIDE_CHECK(tide_coll_mem_alloc(p->be, p->device, (size_t)bytes, &ptr));
    tide_status rc = add_block(p, ptr, bytes, used);
    if (rc != TIDE_OK) {
        p->be->mem_free(ptr);
        return rc;
    }
    if (used)
        p->st.in_use += bytes;
    else
        p->st.cached += bytes;
    p->st.fresh += bytes;
    note_peaks(p);
    *out = ptr;
    *fresh = p->be->mem_kind == TIDE_MEM_HOST;
    return TIDE_OK;
}

tide_status tide_mem_pool_alloc(tide_mem_pool_t *p, size_t bytes, void **out)
{
    *out = NULL;
    int fresh = 0;
    pthread_mutex_lock(&p->mu);
    tide_status rc = alloc_locked(p, bytes, 1, out, &fresh);
    pthread_mutex_unlock(&p->mu);
    if (rc == TIDE_OK && fresh)
        touch(*out, bytes ? bytes : 1, 1);
    return rc;
}

static size_t find(const tide_mem_pool_t *p, const void *ptr)
{
    for (size_t i = 0; i < p->n; i++)
        if (p->b[i].ptr == ptr)
            return i;
    return p->n;
}

void tide_mem_pool_free(tide_mem_pool_t *p, void *ptr)
{
    if (ptr == NULL)
        return;
    pthread_mutex_lock(&p->mu);
    size_t i = find(p, ptr);
    if (i == p->n || !p->b[i].used) {
        pthread_mutex_unlock(&p->mu);
        TIDE_ERROR(POOL_LOG, "internal: freeing %p, which is no block handed out by this pool",
                   ptr);
        return;
    }
    p->b[i].used = 0;
    p->st.in_use -= p->b[i].cap;
    p->st.cached += p->b[i].cap;
    make_room(p, 0);
    pthread_mutex_unlock(&p->mu);
}

int tide_mem_pool_owns(tide_mem_pool_t *p, const void *ptr)
{
    pthread_mutex_lock(&p->mu);
    size_t i = find(p, ptr);
    int yes = i < p->n && p->b[i].used;
    pthread_mutex_unlock(&p->mu);
    return yes;
}

uint64_t tide_mem_pool_capacity(tide_mem_pool_t *p, const void *ptr)
{
    pthread_mutex_lock(&p->mu);
    size_t i = find(p, ptr);
    uint64_t cap = i < p->n ? p->b[i].cap : 0;
    pthread_mutex_unlock(&p->mu);
    return cap;
}

void tide_mem_pool_shrink(tide_mem_pool_t *p, void *ptr, size_t bytes)
{
    if (p->be->mem_kind != TIDE_MEM_HOST || bytes == 0)
        return;
    pthread_mutex_lock(&p->mu);
    size_t i = find(p, ptr);
    long pg = sysconf(_SC_PAGESIZE);
    if (i < p->n && p->b[i].used && bytes < p->b[i].cap && pg > 0) {
        /* the whole pages past the new end go back to the system (the address stays:
           it is the caller's shard pointer); the block counts what is left */
        uintptr_t from = ((uintptr_t)ptr + bytes + (uintptr_t)pg - 1) & ~((uintptr_t)pg - 1);
        uintptr_t to = ((uintptr_t)ptr + p->b[i].cap) & ~((uintptr_t)pg - 1);
        if (to > from && madvise((void *)from, to - from, MADV_DONTNEED) == 0) {
            uint64_t cap = (uint64_t)(from - (uintptr_t)ptr);
            p->st.in_use -= p->b[i].cap - cap;
            p->b[i].cap = cap;
        }
    }
    pthread_mutex_unlock(&p->mu);
}

/* Fresh host memory for spills: pinned where the backend has it, else plain and
   populated (the spill copy then takes no page faults). Outside the lock: slow. */
static tide_status host_new(const tide_mem_pool_t *p, uint64_t bytes, void **out)
{
    *out = NULL;
    if (p->be->host_alloc != NULL)
        return p->be->host_alloc(bytes ? (size_t)bytes : 1, out);
    *out = tide_malloc(bytes ? (size_t)bytes : 1);
    if (*out == NULL)
        return tide_errorf(TIDE_ERR_NOMEM, "out of host memory spilling %llu bytes",
                           (unsigned long long)bytes);
    touch(*out, bytes, 1);
    return TIDE_OK;
}

/* With the lock held: the smallest kept spill block of at least bytes, or p->nh. */
static size_t spill_fit(const tide_mem_pool_t *p, uint64_t bytes)
{
    size_t best = p->nh;
    for (size_t i = 0; i < p->nh; i++)
        if (!p->h[i].used && p->h[i].cap >= bytes &&
            (best == p->nh || p->h[i].cap < p->h[best].cap))
            best = i;
    return best;
}

tide_status tide_mem_pool_spill_alloc(tide_mem_pool_t *p, size_t bytes, void **out)
{
    *out = NULL;
    pthread_mutex_lock(&p->mu);
    size_t i = spill_fit(p, bytes);
    if (i < p->nh) { /* prepared ahead: no allocation in the switch */
        p->h[i].used = 1;
        p->st.spill_cached -= p->h[i].cap;
        p->st.spill += p->h[i].cap;
        p->st.spill_reused += p->h[i].cap;
        if (p->st.spill > p->st.peak_spill)
            p->st.peak_spill = p->st.spill;
        *out = p->h[i].ptr;
        pthread_mutex_unlock(&p->mu);
        return TIDE_OK;
    }
    pthread_mutex_unlock(&p->mu);
    void *ptr = NULL;
    TIDE_CHECK(host_new(p, bytes, &ptr));
    pthread_mutex_lock(&p->mu);
    tide_status rc = push_block(&p->h, &p->nh, &p->nh_cap, ptr, bytes, 1);
    if (rc == TIDE_OK) {
        p->st.spill += bytes;
        p->st.spill_fresh += bytes;
        if (p->st.spill > p->st.peak_spill)
            p->st.peak_spill = p->st.spill;
    }
    pthread_mutex_unlock(&p->mu);
    if (rc != TIDE_OK) {
        host_free(p, ptr);
        return rc;
    }
    *out = ptr;
    return TIDE_OK;
}

void tide_mem_pool_spill_free(tide_mem_pool_t *p, void *ptr, size_t bytes)
{
    (void)bytes; /* the block knows its capacity */
    if (ptr == NULL)
        return;
    pthread_mutex_lock(&p->mu);
    for (size_t i = 0; i < p->nh; i++) {
        if (p->h[i].ptr != ptr || !p->h[i].used)
            continue;
        /* kept: freed by tide_mem_pool_spill_release, off the switch's path */
        p->h[i].used = 0;
        p->st.spill -= p->h[i].cap;
        p->st.spill_cached += p->h[i].cap;
        pthread_mutex_unlock(&p->mu);
        return;
    }
    pthread_mutex_unlock(&p->mu);
    TIDE_ERROR(POOL_LOG, "internal: freeing %p, which is no spill block of this pool", ptr);
}

tide_status tide_mem_pool_spill_reserve(tide_mem_pool_t *p, const uint64_t *sizes, size_t n)
{
    tide_status rc = TIDE_OK;
    for (size_t k = 0; k < n && rc == TIDE_OK; k++) {
        if (sizes[k] == 0)
            continue;
        pthread_mutex_lock(&p->mu);
        size_t i = spill_fit(p, sizes[k]);
        if (i < p->nh) {
            p->h[i].used = 2; /* claimed for this round */
            pthread_mutex_unlock(&p->mu);
            continue;
        }
        pthread_mutex_unlock(&p->mu);
        void *ptr = NULL;
        rc = host_new(p, sizes[k], &ptr);
        if (rc != TIDE_OK)
            break;
        pthread_mutex_lock(&p->mu);
        rc = push_block(&p->h, &p->nh, &p->nh_cap, ptr, sizes[k], 2);
        if (rc == TIDE_OK)
            p->st.spill_cached += sizes[k];
        pthread_mutex_unlock(&p->mu);
        if (rc != TIDE_OK)
            host_free(p, ptr);
    }
    pthread_mutex_lock(&p->mu);
    for (size_t i = 0; i < p->nh; i++)
        if (p->h[i].used == 2)
            p->h[i].used = 0;
    pthread_mutex_unlock(&p->mu);
    return rc;
}

typedef struct reap_arg {
    const tide_coll_backend_v1 *be;
    int device;
    block *b;
    size_t n;
} reap_arg;

static void *reap_main(void *arg)
{
    reap_arg *a = arg;
    /* a thread starts on device 0: cudaFreeHost needs the pool's device current */
    if (a->be->device_bind != NULL)
        (void)a->be->device_bind(a->device);
    for (size_t i = 0; i < a->n; i++) {
        if (a->be->host_free != NULL)
            a->be->host_free(a->b[i].ptr);
        else
            tide_free(a->b[i].ptr);
    }
    tide_free(a->b);
    tide_free(a);
    return NULL;
}

void tide_mem_pool_spill_release(tide_mem_pool_t *p)
{
    reap_join(p); /* the last round is done long since: it began a switch ago */
    reap_arg *a = tide_calloc(1, sizeof *a);
    pthread_mutex_lock(&p->mu);
    size_t k = 0;
    block *free_b = a != NULL ? tide_calloc(p->nh ? p->nh : 1, sizeof *free_b) : NULL;
    for (size_t i = 0; i < p->nh; i++) {
        if (p->h[i].used || free_b == NULL) {
            p->h[k++] = p->h[i];
            continue;
        }
        p->st.spill_cached -= p->h[i].cap;
        free_b[a->n++] = p->h[i];
    }
    p->nh = k;
    pthread_mutex_unlock(&p->mu);
    if (a == NULL || free_b == NULL || a->n == 0) {
        tide_free(free_b);
        tide_free(a);
        return; /* out of memory: they stay kept, freed at the next release or destroy */
    }
    a->be = p->be;
    a->device = p->device;
    a->b = free_b;
    if (pthread_create(&p->reaper, NULL, reap_main, a) == 0) {
        p->reaping = 1;
        return;
    }
    reap_main(a); /* no thread: here, then */
}

void tide_mem_pool_set_limit(tide_mem_pool_t *p, uint64_t limit, int strict)
{
    pthread_mutex_lock(&p->mu);
    p->limit = limit;
    p->strict = strict;
    make_room(p, 0);
    pthread_mutex_unlock(&p->mu);
}

tide_status tide_mem_pool_reserve(tide_mem_pool_t *p, const uint64_t *sizes, size_t n,
                                  uint64_t room)
{
    tide_status rc = TIDE_OK;
    uint64_t added = 0;
    for (size_t k = 0; k < n && rc == TIDE_OK; k++) {
        if (sizes[k] == 0)
            continue;
        pthread_mutex_lock(&p->mu);
        /* a cached block that fits already counts: the switch will take it */
        size_t i = best_fit(p, sizes[k]);
        if (i < p->n) {
            p->b[i].used = 2; /* claimed for this reservation round */
            pthread_mutex_unlock(&p->mu);
            continue;
        }
        if (room > 0 && added + sizes[k] > room) {
            pthread_mutex_unlock(&p->mu);
            continue;
        }
        void *ptr = NULL;
        int fresh = 0;
        rc = alloc_locked(p, sizes[k], 0, &ptr, &fresh);
        if (rc == TIDE_OK) {
            p->b[p->n - 1].used = 2;
            added += sizes[k];
        }
        pthread_mutex_unlock(&p->mu);
        /* populated outside the lock (the slow part: page faults). Blocks reserved for
           a switch are received into, which single copies do through the kernel's own
           mapping (populating made it): the per-page writes and the kernel's read would
           double the preparation that holds the switch back. The program's first step
           on them pays the rest; warm_state warms them before they are sent. */
        if (rc == TIDE_OK && fresh)
            touch(ptr, sizes[k], 0);
    }
    pthread_mutex_lock(&p->mu);
    for (size_t i = 0; i < p->n; i++)
        if (p->b[i].used == 2)
            p->b[i].used = 0;
    pthread_mutex_unlock(&p->mu);
    return rc;
}

void tide_mem_pool_trim(tide_mem_pool_t *p)
{
    pthread_mutex_lock(&p->mu);
    for (size_t i = p->n; i-- > 0;)
        if (!p->b[i].used)
            drop_block(p, i);
    pthread_mutex_unlock(&p->mu);
}

void tide_mem_pool_mark(tide_mem_pool_t *p)
{
    pthread_mutex_lock(&p->mu);
    p->st.peak_in_use = p->st.in_use;
    p->st.peak_held = p->st.in_use + p->st.cached;
    p->st.peak_spill = p->st.spill;
    p->st.fresh = p->st.reused = 0;
    p->st.spill_fresh = p->st.spill_reused = 0;
    pthread_mutex_unlock(&p->mu);
}

void tide_mem_pool_stats_get(tide_mem_pool_t *p, tide_mem_pool_stats *out)
{
    pthread_mutex_lock(&p->mu);
    *out = p->st;
    out->limit = p->limit;
    out->strict = p->strict;
    pthread_mutex_unlock(&p->mu);
}
