/*
 * What the rest of collectives/ stands on: the backend registry (the built-in backends,
 * those added by tide_coll_backend_register, which dtypes each reduces), MPI error
 * translation and request abandon, the lease, the polling backoff and host reductions.
 * Called by the other coll*.c files, both backends, cma.c and the worker (the lease,
 * backend lookup); calls nothing else in collectives/. Workload: backoff and host
 * reductions run inside every blocking operation's poll loop (the mpi backend reduces on
 * the host); the rest once per call.
 */
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "collectives/collectives_int.h"
#include "core/clock.h"

/* ---- backends ------------------------------------------------------------------ */

static const tide_coll_backend_v1 *const backends[] = {
    &tide__coll_mpi_backend,
#if defined(TIDE_HAVE_NCCL)
    &tide__coll_nccl_backend,
#endif
};

/* Backends added by tide_coll_backend_register (main thread, before use). */
#define MAX_REGISTERED 4
static const tide_coll_backend_v1 *registered[MAX_REGISTERED];
static size_t n_registered;

tide_status tide_coll_backend_register(const tide_coll_backend_v1 *be)
{
    if (be == NULL || be->name == NULL || be->name[0] == '\0')
        return tide_errorf(TIDE_ERR_INVALID, "tide_coll_backend_register: a named backend is "
                                             "required");
    if (be->version != TIDE_COLL_BACKEND_VERSION)
        return tide_errorf(TIDE_ERR_UNSUPPORTED, "backend '%s' has interface version %d, not %d",
                           be->name, be->version, TIDE_COLL_BACKEND_VERSION);
    const tide_coll_backend_v1 *found = NULL;
    tide_status rc = tide_coll_backend_find(be->name, &found);
    tide_error_clear();
    if (rc == TIDE_OK)
        return tide_errorf(TIDE_ERR_EXISTS, "a collective backend named '%s' already exists",
                           be->name);
    if (n_registered == MAX_REGISTERED)
        return tide_errorf(TIDE_ERR_RANGE, "at most %d backends can be registered", MAX_REGISTERED);
    registered[n_registered++] = be;
    return TIDE_OK;
}

const char *tide_coll_backend_names(void)
{
#if defined(TIDE_HAVE_NCCL)
    return "mpi,nccl";
#else
    return "mpi";
#endif
}

tide_status tide_coll_backend_find(const char *name, const tide_coll_backend_v1 **out)
{
    if (out == NULL)
        return tide_errorf(TIDE_ERR_INVALID, "tide_coll_backend_find: out is NULL");
    *out = NULL;
    if (name == NULL)
        return tide_errorf(TIDE_ERR_INVALID, "collective backend name is NULL");
    for (size_t i = 0; i < sizeof backends / sizeof backends[0]; i++) {
        if (strcmp(backends[i]->name, name) == 0) {
            *out = backends[i];
            return TIDE_OK;
        }
    }
    for (size_t i = 0; i < n_registered; i++) {
        if (strcmp(registered[i]->name, name) == 0) {
            *out = registered[i];
            return TIDE_OK;
        }
    }
    return tide_errorf(TIDE_ERR_NOT_FOUND,
                       "no collective backend named '%s' in this build (built: %s%s)", name,
                       tide_coll_backend_names(),
                       strcmp(name, "nccl") == 0 ? "; nccl needs CUDA and NCCL at build time" : "");
}

size_t tide__red_dtype_size(tide_dtype dtype)
{
    switch (dtype) {
    case TIDE_F32:
    case TIDE_I32:
        return 4;
    case TIDE_F64:
    case TIDE_I64:
        return 8;
    case TIDE_BF16:
        return 2;
    default:
        return 0;
    }
}

int tide_coll_backend_has_dtype(const tide_coll_backend_v1 *be, tide_dtype dtype)
{
    if (be == NULL || tide__red_dtype_size(dtype) == 0)
        return 0;
    if (dtype == TIDE_BF16)
        return (be->caps & TIDE_COLL_CAP_BF16) != 0;
    return 1;
}

/* ---- MPI helpers ----------------------------------------------------------------- */

tide_status tide__mpi_error(int err, const char *expr, const char *file, int line)
{
    char msg[MPI_MAX_ERROR_STRING] = "";
    int len = 0;
    if (MPI_Error_string(err, msg, &len) != MPI_SUCCESS)
        snprintf(msg, sizeof msg, "MPI error %d", err);
    TIDE_ERROR(TIDE_COLL_LOG, "%s:%d: %s failed: %s", file, line, expr, msg);
    return tide_errorf(TIDE_ERR_BACKEND, "%s failed: %s", expr, msg);
}

/* Monotonic ns the lease runs out at; 0: no lease. */
static _Atomic uint64_t lease_until_ns;

void tide_coll_lease_set(uint64_t until_ns)
{
    atomic_store_explicit(&lease_until_ns, until_ns, memory_order_release);
}

int tide_coll_lease_expired(void)
{
    uint64_t until = atomic_load_explicit(&lease_until_ns, memory_order_acquire);
    return until != 0 && tide_now_ns() >= until;
}

int tide__mpi_abandon(MPI_Request *reqs, int n)
{
    if (tide_coll_lease_expired())
        return n; /* not one more MPI call: see tide_coll_lease_set */
    int active = 0;
    for (int i = 0; i < n; i++) {
        if (reqs[i] != MPI_REQUEST_NULL) {
            MPI_Cancel(&reqs[i]);
            active++;
        }
    }
    uint64_t deadline = tide_now_ns() + 50ull * 1000 * 1000;
    while (active > 0 && tide_now_ns() < deadline) {
        active = 0;
        for (int i = 0; i < n; i++) {
            if (reqs[i] == MPI_REQUEST_NULL)
                continue;
            int flag = 0;
            if (MPI_Test(&reqs[i], &flag, MPI_STATUS_IGNORE) != MPI_SUCCESS || !flag)
                active++;
        }
        if (active > 0)
            tide_sleep_ms(1);
    }
    int left = 0;
    for (int i = 0; i < n; i++) {
        if (reqs[i] != MPI_REQUEST_NULL) {
            MPI_Request_free(&reqs[i]);
            left++;
        }
    }
    if (left > 0)
        TIDE_WARN(TIDE_COLL_LOG,
                  "%d MPI request(s) could not be cancelled and were abandoned (a message to "
                  "or from a failed peer)",
                  left);
    return left;
}

/* ---- backoff --------------------------------------------------------------------- */

void tide__backoff_init(tide__backoff *b)
{
    b->last_progress_ns = tide_now_ns();
    b->sleep_ns = 0;
    b->spins = 0;
}

void tide__backoff_progress(tide__backoff *b)
{
    b->last_progress_ns = tide_now_ns();
    b->sleep_ns = 0;
    b->spins = 0;
}

void tide__backoff_pause(tide__backoff *b)
{
    /* A few hundred bare polls first: small messages on shared memory complete in
       microseconds and a yield would only add latency. */
    if (b->spins < 256) {
        b->spins++;
        return;
    }
    if (tide_now_ns() - b->last_progress_ns < TIDE_COLL_YIELD_WINDOW_NS) {
        sched_yield();
        return;
    }
    b->sleep_ns = b->sleep_ns == 0 ? 10000 : b->sleep_ns * 2;
    if (b->sleep_ns > 1000000)
        b->sleep_ns = 1000000;
    struct timespec ts = {0, (long)b->sleep_ns};
    nanosleep(&ts, NULL);
}

/* ---- host reductions --------------------------------------------------------------- */

float tide__bf16_to_f32(uint16_t v)
{
    uint32_t u = (uint32_t)v << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

uint16_t tide__f32_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu) != 0)
        return (uint16_t)((u >> 16) | 0x0040u); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u);            /* round to nearest even */
    return (uint16_t)(u >> 16);
}

#define REDUCE_LOOP(type, expr)                                                                    \
    do {                                                                                           \
        type *a = inout;                                                                           \
        const type *b = in;                                                                        \
        for (size_t i = 0; i < count; i++) {                                                       \
            type x = a[i], y = b[i];                                                               \
            a[i] = (expr);                                                                         \
        }                                                                                          \
    } while (0)

void tide__reduce_host(void *inout, const void *in, size_t count, tide_dtype dtype, tide_red_op op)
{
    int sum = op == TIDE_RED_SUM;
    switch (dtype) {
    case TIDE_F32:
        if (sum)
            REDUCE_LOOP(float, x + y);
        else
            REDUCE_LOOP(float, y > x ? y : x);
        break;
    case TIDE_F64:
        if (sum)
            REDUCE_LOOP(double, x + y);
        else
            REDUCE_LOOP(double, y > x ? y : x);
        break;
    case TIDE_I32:
        /* Sums wrap like two's complement instead of being undefined on overflow. */
        if (sum)
            REDUCE_LOOP(int32_t, (int32_t)((uint32_t)x + (uint32_t)y));
        else
            REDUCE_LOOP(int32_t, y > x ? y : x);
        break;
    case TIDE_I64:
        if (sum)
            REDUCE_LOOP(int64_t, (int64_t)((uint64_t)x + (uint64_t)y));
        else
            REDUCE_LOOP(int64_t, y > x ? y : x);
        break;
    case TIDE_BF16: {
        uint16_t *a = inout;
        const uint16_t *b = in;
        for (size_t i = 0; i < count; i++) {
            float x = tide__bf16_to_f32(a[i]), y = tide__bf16_to_f32(b[i]);
            a[i] = tide__f32_to_bf16(sum ? x + y : (y > x ? y : x));
        }
        break;
    }
    default:
        break; /* callers check the dtype first */
    }
}
