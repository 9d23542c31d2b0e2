/*
 * The backend-independent half of collectives/: backend lookup, pools, the common
 * communicator state, the tide_coll_* wrappers (argument checks, abort state,
 * dispatch), colour splits, the creation handshake, host reductions and the polling
 * backoff. Workload: wrappers run once per operation, so they only do O(1) checks
 * (O(n) for a p2p batch of n ops).
 */
#include <limits.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "collectives/collectives_int.h"
#include "core/alloc.h"
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

/* ---- pools ----------------------------------------------------------------------- */

tide_status tide_coll_pool_new(tide_coll_pool_t **out, MPI_Comm world)
{
    if (out == NULL)
        return tide_errorf(TIDE_ERR_INVALID, "tide_coll_pool_new: out is NULL");
    *out = NULL;
    int init = 0, fin = 0;
    MPI_Initialized(&init);
    MPI_Finalized(&fin);
    if (!init || fin)
        return tide_errorf(TIDE_ERR_INVALID,
                           "MPI is not initialised (call MPI_Init_thread before creating a pool)");
    int level = MPI_THREAD_SINGLE;
    MPI_CHECK(MPI_Query_thread(&level));
    if (level < MPI_THREAD_FUNNELED)
        return tide_errorf(TIDE_ERR_UNSUPPORTED,
                           "MPI was initialised with MPI_THREAD_SINGLE; tide needs at least "
                           "MPI_THREAD_FUNNELED (MPI_THREAD_MULTIPLE if other threads call MPI): "
                           "use MPI_Init_thread");
    tide_coll_pool_t *pool = tide_calloc(1, sizeof *pool);
    if (pool == NULL)
        return tide_errorf(TIDE_ERR_NOMEM, "out of memory allocating a worker pool");
    tide_status rc = TIDE_OK;
    MPI_CHECK_GOTO(MPI_Comm_dup(world, &pool->comm), rc, fail);
    /* Errors come back as codes (translated by MPI_CHECK) instead of aborting the job. */
    MPI_CHECK_GOTO(MPI_Comm_set_errhandler(pool->comm, MPI_ERRORS_RETURN), rc, fail);
    MPI_CHECK_GOTO(MPI_Comm_rank(pool->comm, &pool->rank), rc, fail);
    MPI_CHECK_GOTO(MPI_Comm_size(pool->comm, &pool->size), rc, fail);
    *out = pool;
    return TIDE_OK;
fail:
    if (pool->comm != MPI_COMM_NULL && pool->comm != 0)
        MPI_Comm_free(&pool->comm);
    tide_free(pool);
    return rc;
}

tide_status tide_coll_pool_new_ranked(tide_coll_pool_t **out, MPI_Comm comm, const int *prank,
                                      int size)
{
    if (out == NULL || prank == NULL || size < 1)
        return tide_errorf(TIDE_ERR_INVALID, "tide_coll_pool_new_ranked: out, ranks and a size");
    *out = NULL;
    tide_coll_pool_t *pool = NULL;
    TIDE_CHECK(tide_coll_pool_new(&pool, comm));
    tide_status rc = TIDE_OK;
    int n = pool->size, me = pool->rank;
    pool->crank = tide_malloc((size_t)size * sizeof *pool->crank);
    TIDE_CHECK_ALLOC_GOTO(pool->crank, rc, fail);
    for (int r = 0; r < size; r++)
        pool->crank[r] = -1;
    for (int c = 0; c < n; c++) {
        if (prank[c] < 0 || prank[c] >= size || pool->crank[prank[c]] >= 0)
            TIDE_FAIL_GOTO(rc, fail, TIDE_ERR_INVALID,
                           "pool rank %d of process %d is outside [0, %d) or given twice", prank[c],
                           c, size);
        pool->crank[prank[c]] = c;
    }
    pool->rank = prank[me];
    pool->size = size;
    *out = pool;
    return TIDE_OK;
fail:
    tide_coll_pool_destroy(&pool);
    return rc;
}

tide_status tide_coll_pool_subset(tide_coll_pool_t **out, tide_coll_pool_t *pool,
                                  const int *members, int n, int tag, uint32_t timeout_ms,
                                  const int *cancel)
{
    if (out == NULL || pool == NULL || members == NULL || n < 1)
        return tide_errorf(TIDE_ERR_INVALID, "tide_coll_pool_subset: out, pool and members needed");
    *out = NULL;
    if (tag < 0 || tag > TIDE_COLL_MAX_TAG)
        return tide_errorf(TIDE_ERR_INVALID, "tide_coll_pool_subset: tag %d outside [0, %d]", tag,
                           TIDE_COLL_MAX_TAG);
    int me = -1;
    for (int i = 0; i < n; i++) {
        if (tide__pool_crank(pool, members[i]) < 0 || (i > 0 && members[i] <= members[i - 1]))
            return tide_errorf(TIDE_ERR_INVALID,
                               "tide_coll_pool_subset: member %d (pool rank %d) is unreachable "
                               "or out of order",
                               i, members[i]);
        if (members[i] == pool->rank)
            me = i;
    }
    if (me < 0)
        return tide_errorf(TIDE_ERR_INVALID,
                           "tide_coll_pool_subset: pool rank %d is not among the %d members",
                           pool->rank, n);
    tide_status rc = TIDE_OK;
    MPI_Group pg = MPI_GROUP_NULL, g = MPI_GROUP_NULL;
    tide_coll_pool_t *sub = tide_calloc(1, sizeof *sub);
    int *cr = tide_malloc((size_t)n * sizeof *cr);
    if (sub != NULL)
        sub->crank = tide_malloc((size_t)pool->size * sizeof *sub->crank);
    if (sub == NULL || cr == NULL || sub->crank == NULL) {
        /* the same on every member only if all fail alike: the others time out below */
        rc = tide_errorf(TIDE_ERR_NOMEM, "out of memory making a pool of %d ranks", n);
        goto fail;
    }
    sub->comm = MPI_COMM_NULL;
    /* MPI_Comm_create_group cannot be abandoned: every member must be there first, within
       the deadline, or none enters it */
    TIDE_CHECK_GOTO(tide__pool_handshake(pool, members, n, tag, timeout_ms, cancel, NULL, 0), rc,
                    fail);
    for (int r = 0; r < pool->size; r++)
        sub->crank[r] = -1;
    for (int i = 0; i < n; i++) {
        cr[i] = tide__pool_crank(pool, members[i]);
        sub->crank[members[i]] = i; /* Group_incl keeps the members' order */
    }
    MPI_CHECK_GOTO(MPI_Comm_group(pool->comm, &pg), rc, fail);
    MPI_CHECK_GOTO(MPI_Group_incl(pg, n, cr, &g), rc, fail);
    MPI_CHECK_GOTO(MPI_Comm_create_group(pool->comm, g, 2 * tag + 1, &sub->comm), rc, fail);
    MPI_CHECK_GOTO(MPI_Comm_set_errhandler(sub->comm, MPI_ERRORS_RETURN), rc, fail);
    sub->rank = pool->rank;
    sub->size = pool->size;
    MPI_Group_free(&g);
    MPI_Group_free(&pg);
    tide_free(cr);
    *out = sub;
    return TIDE_OK;
fail:
    if (g != MPI_GROUP_NULL)
        MPI_Group_free(&g);
    if (pg != MPI_GROUP_NULL)
        MPI_Group_free(&pg);
    if (sub != NULL && sub->comm != MPI_COMM_NULL)
        MPI_Comm_free(&sub->comm);
    if (sub != NULL)
        tide_free(sub->crank);
    tide_free(sub);
    tide_free(cr);
    return rc;
}

MPI_Comm tide_coll_pool_comm(const tide_coll_pool_t *pool)
{
    return pool ? pool->comm : MPI_COMM_NULL;
}

int tide_coll_pool_comm_rank(const tide_coll_pool_t *pool, int r)
{
    return pool != NULL ? tide__pool_crank(pool, r) : -1;
}

void tide_coll_pool_destroy(tide_coll_pool_t **self_p)
{
    if (self_p == NULL || *self_p == NULL)
        return;
    tide_coll_pool_t *pool = *self_p;
    int fin = 0;
    MPI_Finalized(&fin);
    /* MPI_Comm_free is local in Open MPI (no synchronisation with peers), so this is
       safe with dead ranks in the pool; a process whose lease ran out lets the handle go
       without calling MPI at all */
    if (!fin && !tide_coll_lease_expired())
        MPI_Comm_free(&pool->comm);
    tide_free(pool->crank);
    tide_free(pool);
    *self_p = NULL;
}

int tide_coll_pool_rank(const tide_coll_pool_t *pool)
{
    return pool ? pool->rank : -1;
}

int tide_coll_pool_size(const tide_coll_pool_t *pool)
{
    return pool ? pool->size : 0;
}

/* ---- handshake --------------------------------------------------------------------- */

typedef struct hs_msg {
    uint64_t hash;
    int32_t n, tag;
    int32_t refused; /* "go" only: the first member could not make the payload */
    uint8_t payload[TIDE_COLL_HANDSHAKE_PAYLOAD];
} hs_msg;

static uint64_t members_hash(const int *members, int n, int tag)
{
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    int32_t head[2] = {n, tag};
    const unsigned char *p = (const unsigned char *)head;
    for (size_t i = 0; i < sizeof head; i++)
        h = (h ^ p[i]) * 1099511628211ull;
    p = (const unsigned char *)members;
    for (size_t i = 0; i < (size_t)n * sizeof(int); i++)
        h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

/* Polls reqs until all complete, the deadline passes (TIDE_ERR_TIMEOUT) or cancel is
   set (TIDE_ERR_ABORTED, message set). */
static tide_status wait_deadline(MPI_Request *reqs, int n, uint64_t deadline_ns, const int *cancel,
                                 const int *cancel2, int tag)
{
    tide__backoff bo;
    tide__backoff_init(&bo);
    for (;;) {
        int flag = 0;
        MPI_CHECK(MPI_Testall(n, reqs, &flag, MPI_STATUSES_IGNORE));
        if (flag)
            return TIDE_OK;
        int cancelled = tide__cancelled(cancel) || tide__cancelled(cancel2);
        if (cancelled || tide_coll_lease_expired())
            return tide_errorf(TIDE_ERR_ABORTED,
                               "communicator creation (tag %d) was %s while waiting for its "
                               "members",
                               tag, cancelled ? "cancelled" : "fenced (lease ran out)");
        if (tide_now_ns() >= deadline_ns)
            return TIDE_ERR_TIMEOUT;
        tide__backoff_pause(&bo);
    }
}

tide_status tide__pool_handshake(tide_coll_pool_t *pool, const int *members, int n, int tag,
                                 uint32_t timeout_ms, const int *cancel, void *payload,
                                 size_t payload_len)
{
    tide__handshake h = {members, n, tag, timeout_ms, cancel, NULL, NULL, NULL};
    return tide__pool_handshake_run(pool, &h, payload, payload_len);
}

/* One handshake's messages and limits, on either side. */
typedef struct hs_run {
    tide_coll_pool_t *pool;
    const tide__handshake *h;
    hs_msg *in;   /* in[0..n-1]: what each member sent (in[0] on a member: the "go") */
    hs_msg *mine; /* root: the "go" answer; others: the "arrived" note */
    MPI_Request *reqs;
    uint64_t deadline;
    uint32_t limit_ms;
    int mpitag;
} hs_run;

static tide_status hs_wait(hs_run *r, MPI_Request *reqs, int n)
{
    return wait_deadline(reqs, n, r->deadline, r->h->cancel, r->h->cancel2, r->h->tag);
}

/* A member's side: "arrived" to members[0], then its "go" (with the payload) back. */
static tide_status hs_member(hs_run *r, void *payload, size_t payload_len)
{
    const tide__handshake *h = r->h;
    int c0 = tide__pool_crank(r->pool, h->members[0]);
    MPI_CHECK(MPI_Irecv(&r->in[0], (int)sizeof r->in[0], MPI_BYTE, c0, r->mpitag, r->pool->comm,
                        &r->reqs[0]));
    MPI_CHECK(MPI_Isend(r->mine, (int)sizeof *r->mine, MPI_BYTE, c0, r->mpitag, r->pool->comm,
                        &r->reqs[1]));
    tide_status rc = hs_wait(r, r->reqs, 2);
    if (rc == TIDE_ERR_TIMEOUT)
        return tide_errorf(TIDE_ERR_TIMEOUT,
                           "communicator creation (tag %d, %d members) timed out after %u ms "
                           "waiting for its first member, pool rank %d",
                           h->tag, h->n, r->limit_ms, h->members[0]);
    TIDE_CHECK(rc);
    if (r->in[0].refused)
        return tide_errorf(TIDE_ERR_BACKEND,
                           "communicator creation tag %d: its first member, pool rank %d, "
                           "could not set it up (its log says why)",
                           h->tag, h->members[0]);
    if (r->in[0].hash != r->mine->hash || r->in[0].n != h->n || r->in[0].tag != h->tag)
        return tide_errorf(TIDE_ERR_PROTOCOL,
                           "communicator creation tag %d: the members do not agree on the "
                           "member list (first member pool rank %d)",
                           h->tag, h->members[0]);
    if (payload_len)
        memcpy(payload, r->in[0].payload, payload_len);
    return TIDE_OK;
}

/* The root's wait for every "arrived": TIDE_ERR_TIMEOUT names the members that never
   came. */
static tide_status hs_arrivals(hs_run *r)
{
    const tide__handshake *h = r->h;
    for (int i = 1; i < h->n; i++)
        MPI_CHECK(MPI_Irecv(&r->in[i], (int)sizeof r->in[i], MPI_BYTE,
                            tide__pool_crank(r->pool, h->members[i]), r->mpitag, r->pool->comm,
                            &r->reqs[i]));
    tide_status rc = hs_wait(r, r->reqs + 1, h->n - 1);
    if (rc != TIDE_ERR_TIMEOUT)
        return rc;
    char missing[256] = "";
    size_t len = 0;
    for (int i = 1; i < h->n; i++) {
        int flag = 0;
        if (r->reqs[i] != MPI_REQUEST_NULL)
            MPI_Test(&r->reqs[i], &flag, MPI_STATUS_IGNORE);
        if (r->reqs[i] != MPI_REQUEST_NULL && len + 12 < sizeof missing)
            len += (size_t)snprintf(missing + len, sizeof missing - len, "%s%d", len ? "," : "",
                                    h->members[i]);
    }
    return tide_errorf(TIDE_ERR_TIMEOUT,
                       "communicator creation (tag %d, %d members) timed out after %u ms: "
                       "pool rank(s) %s never arrived",
                       h->tag, h->n, r->limit_ms, missing);
}

/* The root's side: every "arrived", then "go" (with the payload, made now when h->make
   says so) to each; a member with another member list still gets an answer. */
static tide_status hs_root(hs_run *r, void *payload, size_t payload_len)
{
    const tide__handshake *h = r->h;
    TIDE_CHECK(hs_arrivals(r));
    tide_status rc = TIDE_OK;
    for (int i = 1; i < h->n; i++) {
        if (r->in[i].hash != r->mine->hash || r->in[i].n != h->n || r->in[i].tag != h->tag) {
            rc = tide_errorf(TIDE_ERR_PROTOCOL,
                             "pool rank %d joined communicator creation tag %d with a different "
                             "member list (%d members, tag %d; here %d members)",
                             h->members[i], h->tag, r->in[i].n, r->in[i].tag, h->n);
            r->mine->hash = 0; /* still answer everyone, so that nobody waits for a timeout */
        }
    }
    /* Everyone is here: only now is the payload made (the nccl backend's unique id starts
       a thread that lives until every member joins it, which a member that never came
       would never do). A failure to make it is every member's failure. */
    if (rc == TIDE_OK && h->make != NULL) {
        rc = h->make(h->make_ctx, payload, payload_len);
        r->mine->refused = rc != TIDE_OK;
    }
    if (payload_len)
        memcpy(r->mine->payload, payload, payload_len);
    for (int i = 1; i < h->n; i++)
        MPI_CHECK(MPI_Isend(r->mine, (int)sizeof *r->mine, MPI_BYTE,
                            tide__pool_crank(r->pool, h->members[i]), r->mpitag, r->pool->comm,
                            &r->reqs[i]));
    tide_status wrc = hs_wait(r, r->reqs + 1, h->n - 1);
    if (wrc == TIDE_ERR_TIMEOUT)
        wrc = tide_errorf(TIDE_ERR_TIMEOUT,
                          "communicator creation (tag %d): a member stopped answering during "
                          "the handshake",
                          h->tag);
    return rc != TIDE_OK ? rc : wrc;
}

tide_status tide__pool_handshake_run(tide_coll_pool_t *pool, const tide__handshake *h,
                                     void *payload, size_t payload_len)
{
    int root = h->members[0] == pool->rank;
    if (h->n <= 1)
        return h->make != NULL && root ? h->make(h->make_ctx, payload, payload_len) : TIDE_OK;
    if (payload_len > TIDE_COLL_HANDSHAKE_PAYLOAD)
        return tide_errorf(TIDE_ERR_INTERNAL, "handshake payload of %zu bytes is too large",
                           payload_len);
    hs_run r = {.pool = pool, .h = h, .mpitag = 2 * h->tag};
    r.limit_ms = h->timeout_ms ? h->timeout_ms : TIDE_COLL_DEFAULT_TIMEOUT_MS;
    r.deadline = tide_now_ns() + (uint64_t)r.limit_ms * 1000000ull;
    /* Allocated on every member, root or not, so that an allocation failure hits all
       members at the same point and none is left waiting for the others. */
    r.in = tide_calloc((size_t)h->n + 1, sizeof *r.in);
    r.reqs = tide_calloc((size_t)h->n, sizeof *r.reqs);
    if (r.in == NULL || r.reqs == NULL) {
        tide_free(r.in);
        tide_free(r.reqs);
        return tide_errorf(TIDE_ERR_NOMEM, "out of memory in a communicator handshake");
    }
    for (int i = 0; i < h->n; i++)
        r.reqs[i] = MPI_REQUEST_NULL;
    r.mine = &r.in[h->n];
    r.mine->hash = members_hash(h->members, h->n, h->tag);
    r.mine->n = h->n;
    r.mine->tag = h->tag;
    tide_status rc =
        root ? hs_root(&r, payload, payload_len) : hs_member(&r, payload, payload_len);
    if (rc != TIDE_OK)
        tide__mpi_abandon(r.reqs, h->n);
    tide_free(r.in);
    tide_free(r.reqs);
    return rc;
}

/* ---- a host allgather over the pool --------------------------------------------------------- */

/* The root's half: every member's part into all, then the whole table to each. */
static tide_status gather_root(tide_coll_pool_t *pool, const int *members, int n, int mpitag,
                               uint64_t deadline, const int *cancel, const int *cancel2,
                               size_t bytes, void *all, MPI_Request *reqs)
{
    for (int i = 1; i < n; i++)
        MPI_CHECK(MPI_Irecv((char *)all + (size_t)i * bytes, (int)bytes, MPI_BYTE,
                            tide__pool_crank(pool, members[i]), mpitag, pool->comm, &reqs[i]));
    TIDE_CHECK(wait_deadline(reqs + 1, n - 1, deadline, cancel, cancel2, mpitag / 2));
    for (int i = 1; i < n; i++)
        MPI_CHECK(MPI_Isend(all, (int)((size_t)n * bytes), MPI_BYTE,
                            tide__pool_crank(pool, members[i]), mpitag, pool->comm, &reqs[i]));
    return wait_deadline(reqs + 1, n - 1, deadline, cancel, cancel2, mpitag / 2);
}

tide_status tide__pool_allgather(tide_coll_pool_t *pool, const int *members, int n, int tag,
                                 uint32_t timeout_ms, const int *cancel, const int *cancel2,
                                 const void *mine, size_t bytes, void *all)
{
    int me = -1;
    for (int i = 0; i < n; i++)
        if (members[i] == pool->rank)
            me = i;
    if (me < 0)
        return tide_errorf(TIDE_ERR_INVALID, "pool rank %d is not among the %d members of a gather",
                           pool->rank, n);
    memcpy((char *)all + (size_t)me * bytes, mine, bytes);
    if (n == 1)
        return TIDE_OK;
    uint32_t limit_ms = timeout_ms ? timeout_ms : TIDE_COLL_DEFAULT_TIMEOUT_MS;
    uint64_t deadline = tide_now_ns() + (uint64_t)limit_ms * 1000000ull;
    MPI_Request *reqs = tide_calloc((size_t)n, sizeof *reqs);
    if (reqs == NULL)
        return tide_errorf(TIDE_ERR_NOMEM, "out of memory in a gather over the pool");
    for (int i = 0; i < n; i++)
        reqs[i] = MPI_REQUEST_NULL;
    int mpitag = 2 * tag;
    tide_status rc = TIDE_OK;
    if (me == 0) {
        rc = gather_root(pool, members, n, mpitag, deadline, cancel, cancel2, bytes, all, reqs);
    } else {
        int c0 = tide__pool_crank(pool, members[0]);
        MPI_CHECK_GOTO(
            MPI_Irecv(all, (int)((size_t)n * bytes), MPI_BYTE, c0, mpitag, pool->comm, &reqs[0]),
            rc, out);
        MPI_CHECK_GOTO(MPI_Isend((char *)all + (size_t)me * bytes, (int)bytes, MPI_BYTE, c0, mpitag,
                                 pool->comm, &reqs[1]),
                       rc, out);
        rc = wait_deadline(reqs, 2, deadline, cancel, cancel2, tag);
    }
    if (rc == TIDE_ERR_TIMEOUT)
        rc = tide_errorf(TIDE_ERR_TIMEOUT,
                         "a gather over the pool (tag %d, %d members) timed out after %u ms", tag,
                         n, limit_ms);
out:
    if (rc != TIDE_OK)
        tide__mpi_abandon(reqs, n);
    tide_free(reqs);
    return rc;
}

tide_status tide_coll_pool_allgather(tide_coll_pool_t *pool, const int *members, int n, int tag,
                                     uint32_t timeout_ms, const int *cancel, const void *mine,
                                     size_t bytes, void *all)
{
    if (pool == NULL || members == NULL || n < 1 || mine == NULL || all == NULL || bytes == 0 ||
        bytes > INT_MAX / (size_t)n)
        return tide_errorf(TIDE_ERR_INVALID, "tide_coll_pool_allgather: bad arguments");
    if (tag < 0 || tag > TIDE_COLL_MAX_TAG)
        return tide_errorf(TIDE_ERR_INVALID, "tide_coll_pool_allgather: tag %d outside [0, %d]",
                           tag, TIDE_COLL_MAX_TAG);
    for (int i = 0; i < n; i++)
        if (tide__pool_crank(pool, members[i]) < 0)
            return tide_errorf(TIDE_ERR_INVALID,
                               "tide_coll_pool_allgather: member pool rank %d is unreachable",
                               members[i]);
    return tide__pool_allgather(pool, members, n, tag, timeout_ms, cancel, NULL, mine, bytes, all);
}

/* ---- communicators ------------------------------------------------------------------- */

tide_status tide__comm_alloc(const tide_coll_backend_v1 *be, tide_coll_pool_t *pool,
                             const int *members, int n, int tag, uint32_t timeout_ms,
                             tide_coll_comm_t **out)
{
    tide_status rc = TIDE_OK;
    tide_coll_comm_t *c = tide_calloc(1, sizeof *c);
    TIDE_CHECK_ALLOC_GOTO(c, rc, fail);
    c->members = tide_calloc((size_t)n, sizeof *c->members);
    TIDE_CHECK_ALLOC_GOTO(c->members, rc, fail);
    memcpy(c->members, members, (size_t)n * sizeof *members);
    c->be = be;
    c->pool = pool;
    c->size = n;
    c->rank = -1;
    for (int i = 0; i < n; i++)
        if (members[i] == pool->rank)
            c->rank = i;
    c->tag = tag;
    c->timeout_ms = timeout_ms;
    atomic_init(&c->aborted, 0);
    *out = c;
    return TIDE_OK;
fail:
    if (c)
        tide_free(c->members);
    tide_free(c);
    return rc;
}

void tide__comm_free(tide_coll_comm_t *comm)
{
    if (comm == NULL)
        return;
    tide_free(comm->members);
    tide_free(comm);
}

static tide_status check_members(const tide_coll_pool_t *pool, const int *members, int n, int tag)
{
    if (n < 1 || members == NULL)
        return tide_errorf(TIDE_ERR_INVALID, "a communicator needs at least one member (got %d)",
                           n);
    if (n > pool->size)
        return tide_errorf(TIDE_ERR_INVALID, "%d members but the pool has only %d ranks", n,
                           pool->size);
    if (tag < 0 || tag > TIDE_COLL_MAX_TAG)
        return tide_errorf(TIDE_ERR_RANGE, "communicator tag %d is outside [0, %d]", tag,
                           TIDE_COLL_MAX_TAG);
    int self = 0;
    for (int i = 0; i < n; i++) {
        if (members[i] < 0 || members[i] >= pool->size)
            return tide_errorf(TIDE_ERR_INVALID, "member %d is pool rank %d, outside [0, %d)", i,
                               members[i], pool->size);
        if (members[i] == pool->rank)
            self = 1;
        if (tide__pool_crank(pool, members[i]) < 0)
            return tide_errorf(TIDE_ERR_INVALID,
                               "member %d is pool rank %d, which this process cannot reach (it "
                               "was not connected when its pool last joined)",
                               i, members[i]);
        for (int j = 0; j < i; j++)
            if (members[j] == members[i])
                return tide_errorf(TIDE_ERR_INVALID,
                                   "pool rank %d appears twice in the member list", members[i]);
    }
    if (!self)
        return tide_errorf(TIDE_ERR_INVALID,
                           "pool rank %d is not among the %d members of the communicator it "
                           "tries to create",
                           pool->rank, n);
    return TIDE_OK;
}

tide_status tide_coll_comm_new(tide_coll_comm_t **out, const tide_coll_backend_v1 *be,
                               tide_coll_pool_t *pool, const tide_coll_comm_params *params)
{
    if (out == NULL)
        return tide_errorf(TIDE_ERR_INVALID, "tide_coll_comm_new: out is NULL");
    *out = NULL;
    if (be == NULL || pool == NULL || params == NULL)
        return tide_errorf(TIDE_ERR_INVALID, "tide_coll_comm_new: backend, pool and params "
                                             "are required");
    if (be->version != TIDE_COLL_BACKEND_VERSION)
        return tide_errorf(TIDE_ERR_UNSUPPORTED, "backend '%s' has interface version %d, not %d",
                           be->name, be->version, TIDE_COLL_BACKEND_VERSION);
    TIDE_CHECK(check_members(pool, params->members, params->n_members, params->tag));
    if (tide_coll_lease_expired())
        return tide_errorf(TIDE_ERR_ABORTED, "no new communicator: this process's lease ran out "
                                             "(it may have been declared failed)");
    if (tide__cancelled(params->watch))
        return tide_errorf(TIDE_ERR_ABORTED, "no new communicator (tag %d): its abort word is set",
                           params->tag);
    TIDE_CHECK(be->comm_create(pool, params, out));
    /* the communicator dispatches through the table it was made with: a registered
       wrapper of a built backend (tide_coll_backend_register) sees every later call */
    (*out)->be = be;
    (*out)->watch = params->watch;
    return TIDE_OK;
}

static int cmp_color_key(const void *a, const void *b)
{
    const int32_t *x = a, *y = b; /* {key, parent rank, pool rank} */
    if (x[0] != y[0])
        return x[0] < y[0] ? -1 : 1;
    return x[1] < y[1] ? -1 : x[1] > y[1];
}

tide_status tide_coll_comm_split(tide_coll_comm_t *parent, int color, int key,
                                 tide_coll_comm_t **out)
{
    if (out == NULL)
        return tide_errorf(TIDE_ERR_INVALID, "tide_coll_comm_split: out is NULL");
    *out = NULL;
    if (parent == NULL)
        return tide_errorf(TIDE_ERR_INVALID, "tide_coll_comm_split: parent is NULL");
    if (tide__comm_is_aborted(parent))
        return tide_errorf(TIDE_ERR_ABORTED, "cannot split an aborted communicator");
    if (color < 0)
        color = -1;
    const tide_coll_backend_v1 *be = parent->be;
    size_t n = (size_t)parent->size;
    tide_status rc = TIDE_OK;
    int32_t *all = tide_calloc(n, 2 * sizeof *all);
    int32_t *sorted = tide_calloc(n, 3 * sizeof *sorted);
    int *members = tide_calloc(n, sizeof *members);
    TIDE_CHECK_ALLOC_GOTO(all, rc, out_free);
    TIDE_CHECK_ALLOC_GOTO(sorted, rc, out_free);
    TIDE_CHECK_ALLOC_GOTO(members, rc, out_free);
    int32_t mine[2] = {color, key};
    if (be->mem_kind == TIDE_MEM_HOST) {
        memcpy(all + 2 * parent->rank, mine, sizeof mine);
        TIDE_CHECK_GOTO(tide_coll_allgather(parent, all + 2 * parent->rank, all, sizeof mine, NULL),
                        rc, out_free);
    } else {
        /* over the pool's MPI communicator in host memory, never a device collective: a
           split may run on a thread of its own while the training thread's collectives
           run on the same device, and two ranks could then enqueue the two in opposite
           orders. The tag is the one the mpi backend derives for a split's handshake (a
           device backend's split uses no other pool message). */
        int tag = (int)(((unsigned)parent->tag * 2654435761u + 7919u * (parent->split_seq + 1u)) %
                        (TIDE_COLL_MAX_TAG + 1u));
        TIDE_CHECK_GOTO(tide__pool_allgather(parent->pool, parent->members, parent->size, tag,
                                             parent->timeout_ms, (const int *)&parent->aborted,
                                             parent->watch, mine, sizeof mine, all),
                        rc, out_free);
    }
    int m = 0;
    if (color >= 0) {
        for (size_t r = 0; r < n; r++) {
            if (all[2 * r] != color)
                continue;
            sorted[3 * m] = all[2 * r + 1];
            sorted[3 * m + 1] = (int32_t)r;
            sorted[3 * m + 2] = parent->members[r];
            m++;
        }
        qsort(sorted, (size_t)m, 3 * sizeof *sorted, cmp_color_key);
        for (int i = 0; i < m; i++)
            members[i] = sorted[3 * i + 2];
    }
    rc = be->comm_split(parent, color, key, color >= 0 ? members : NULL, m, out);
    if (rc != TIDE_OK)
        tide__check_hop(__FILE__, __LINE__, "comm_split", rc);
    else if (*out != NULL) {
        (*out)->be = be; /* the parent's table, as in tide_coll_comm_new */
        (*out)->watch = parent->watch;
    }
    parent->split_seq++;
out_free:
    tide_free(all);
    tide_free(sorted);
    tide_free(members);
    return rc;
}

void tide_coll_comm_destroy(tide_coll_comm_t **self_p)
{
    if (self_p == NULL || *self_p == NULL)
        return;
    tide_coll_comm_t *c = *self_p;
    c->be->comm_destroy(c);
    *self_p = NULL;
}

void tide_coll_comm_abort(tide_coll_comm_t *comm)
{
    if (comm == NULL)
        return;
    atomic_store(&comm->aborted, 1);
    if (comm->be->comm_abort)
        comm->be->comm_abort(comm);
}

int tide_coll_comm_aborted(const tide_coll_comm_t *comm)
{
    return comm == NULL || tide__comm_is_aborted((tide_coll_comm_t *)comm);
}

int tide_coll_comm_rank(const tide_coll_comm_t *comm)
{
    return comm ? comm->rank : -1;
}

int tide_coll_comm_size(const tide_coll_comm_t *comm)
{
    return comm ? comm->size : 0;
}

int tide_coll_comm_pool_rank(const tide_coll_comm_t *comm, int r)
{
    if (comm == NULL || r < 0 || r >= comm->size)
        return -1;
    return comm->members[r];
}

const tide_coll_backend_v1 *tide_coll_comm_backend(const tide_coll_comm_t *comm)
{
    return comm ? comm->be : NULL;
}

int tide_coll_comm_has_dtype(const tide_coll_comm_t *comm, tide_dtype dtype)
{
    return comm != NULL && tide_coll_backend_has_dtype(comm->be, dtype);
}

/* ---- operations ------------------------------------------------------------------------ */

/* Common entry check: a live communicator. */
static tide_status live(tide_coll_comm_t *comm, const char *op)
{
    if (comm == NULL)
        return tide_errorf(TIDE_ERR_INVALID, "%s: communicator is NULL", op);
    if (tide__comm_is_aborted(comm))
        return tide_errorf(TIDE_ERR_ABORTED, "%s on an aborted communicator (rank %d of %d)", op,
                           comm->rank, comm->size);
    return TIDE_OK;
}

/* A failed operation leaves the communicator dead: peers may be mid-operation. */
static tide_status finish(tide_coll_comm_t *comm, tide_status rc)
{
    if (rc != TIDE_OK)
        tide__comm_kill(comm);
    return rc;
}

static tide_status check_red(tide_coll_comm_t *comm, const char *op, const void *send,
                             const void *recv, size_t count, tide_dtype dtype, tide_red_op rop)
{
    if (!tide_coll_backend_has_dtype(comm->be, dtype))
        return tide_errorf(TIDE_ERR_UNSUPPORTED, "%s: backend '%s' cannot reduce dtype %d%s", op,
                           comm->be->name, (int)dtype,
                           dtype == TIDE_BF16 ? " (bf16)" : " (use f32, f64, i32 or i64)");
    if (rop != TIDE_RED_SUM && rop != TIDE_RED_MAX)
        return tide_errorf(TIDE_ERR_INVALID, "%s: unknown reduction operator %d", op, (int)rop);
    if (count > 0 && (send == NULL || recv == NULL))
        return tide_errorf(TIDE_ERR_INVALID, "%s: NULL buffer for %zu elements", op, count);
    if (count > SIZE_MAX / 8 / (size_t)comm->size)
        return tide_errorf(TIDE_ERR_RANGE, "%s: %zu elements is too many", op, count);
    return TIDE_OK;
}

tide_status tide_coll_p2p_start(tide_coll_comm_t *comm, const tide_p2p_op *ops, size_t n,
                                tide_coll_stream_t stream, tide_coll_req_t **out)
{
    return tide_coll_p2p_start_peers(comm, ops, NULL, n, stream, out);
}

tide_status tide_coll_p2p_start_peers(tide_coll_comm_t *comm, const tide_p2p_op *ops,
                                      const tide_p2p_peer *peers, size_t n,
                                      tide_coll_stream_t stream, tide_coll_req_t **out)
{
    if (out == NULL)
        return tide_errorf(TIDE_ERR_INVALID, "p2p_start: out is NULL");
    *out = NULL;
    TIDE_CHECK(live(comm, "p2p"));
    if (n > 0 && ops == NULL)
        return tide_errorf(TIDE_ERR_INVALID, "p2p: %zu ops but the op array is NULL", n);
    if (n > (size_t)INT_MAX / 4)
        return tide_errorf(TIDE_ERR_RANGE, "p2p: %zu ops in one batch is too many", n);
    for (size_t i = 0; i < n; i++) {
        if (ops[i].kind != TIDE_P2P_SEND && ops[i].kind != TIDE_P2P_RECV)
            return tide_errorf(TIDE_ERR_INVALID, "p2p op %zu: unknown kind %d", i,
                               (int)ops[i].kind);
        if (ops[i].peer < 0 || ops[i].peer >= comm->size)
            return tide_errorf(TIDE_ERR_INVALID, "p2p op %zu: peer %d outside [0, %d)", i,
                               ops[i].peer, comm->size);
        if (ops[i].bytes > 0 && ops[i].buf == NULL)
            return tide_errorf(TIDE_ERR_INVALID, "p2p op %zu: NULL buffer for %zu bytes", i,
                               ops[i].bytes);
        if (ops[i].run != 0) {
            if (!(comm->be->caps & TIDE_COLL_CAP_STRIDED))
                return tide_errorf(TIDE_ERR_UNSUPPORTED,
                                   "p2p op %zu is strided but backend '%s' only moves contiguous "
                                   "buffers",
                                   i, comm->be->name);
            if (ops[i].bytes % ops[i].run != 0 || ops[i].stride < ops[i].run ||
                ops[i].bytes / ops[i].run > (size_t)INT_MAX || ops[i].run > (size_t)INT_MAX)
                return tide_errorf(TIDE_ERR_INVALID,
                                   "p2p op %zu: %zu bytes do not make whole runs of %zu bytes at "
                                   "stride %zu (or too many)",
                                   i, ops[i].bytes, ops[i].run, ops[i].stride);
        }
        if (peers != NULL && peers[i].known && peers[i].run != 0 &&
            (peers[i].stride < peers[i].run || ops[i].bytes % peers[i].run != 0))
            return tide_errorf(TIDE_ERR_INVALID,
                               "p2p op %zu: the other end's layout (runs of %zu bytes at stride "
                               "%zu) does not hold %zu bytes in whole runs",
                               i, peers[i].run, peers[i].stride, ops[i].bytes);
    }
    return finish(comm, comm->be->p2p_start(comm, ops, peers, n, stream, out));
}

tide_status tide_coll_req_test(tide_coll_comm_t *comm, tide_coll_req_t *req, int *done)
{
    if (done == NULL || req == NULL || comm == NULL)
        return tide_errorf(TIDE_ERR_INVALID, "req_test: comm, req and done are required");
    *done = 0;
    return finish(comm, comm->be->req_test(comm, req, done));
}

tide_status tide_coll_req_wait(tide_coll_comm_t *comm, tide_coll_req_t *req)
{
    if (req == NULL || comm == NULL)
        return tide_errorf(TIDE_ERR_INVALID, "req_wait: comm and req are required");
    return finish(comm, comm->be->req_wait(comm, req));
}

void tide_coll_req_free(tide_coll_comm_t *comm, tide_coll_req_t **req_p)
{
    if (comm == NULL || req_p == NULL || *req_p == NULL)
        return;
    comm->be->req_free(comm, *req_p);
    *req_p = NULL;
}

tide_status tide_coll_group_p2p(tide_coll_comm_t *comm, const tide_p2p_op *ops, size_t n,
                                tide_coll_stream_t stream)
{
    tide_coll_req_t *req = NULL;
    TIDE_CHECK(tide_coll_p2p_start(comm, ops, n, stream, &req));
    tide_status rc = tide_coll_req_wait(comm, req);
    tide_coll_req_free(comm, &req);
    return rc;
}

tide_status tide_coll_allreduce(tide_coll_comm_t *comm, const void *send, void *recv, size_t count,
                                tide_dtype dtype, tide_red_op op, tide_coll_stream_t stream)
{
    TIDE_CHECK(live(comm, "allreduce"));
    TIDE_CHECK(check_red(comm, "allreduce", send, recv, count, dtype, op));
    if (count == 0)
        return TIDE_OK;
    return finish(comm, comm->be->allreduce(comm, send, recv, count, dtype, op, stream));
}

tide_status tide_coll_broadcast(tide_coll_comm_t *comm, void *buf, size_t bytes, int root,
                                tide_coll_stream_t stream)
{
    TIDE_CHECK(live(comm, "broadcast"));
    if (root < 0 || root >= comm->size)
        return tide_errorf(TIDE_ERR_INVALID, "broadcast: root %d outside [0, %d)", root,
                           comm->size);
    if (bytes > 0 && buf == NULL)
        return tide_errorf(TIDE_ERR_INVALID, "broadcast: NULL buffer for %zu bytes", bytes);
    if (bytes == 0)
        return TIDE_OK;
    return finish(comm, comm->be->broadcast(comm, buf, bytes, root, stream));
}

tide_status tide_coll_allgather(tide_coll_comm_t *comm, const void *send, void *recv, size_t bytes,
                                tide_coll_stream_t stream)
{
    TIDE_CHECK(live(comm, "allgather"));
    if (bytes > 0 && (send == NULL || recv == NULL))
        return tide_errorf(TIDE_ERR_INVALID, "allgather: NULL buffer for %zu bytes", bytes);
    if (bytes > SIZE_MAX / (size_t)comm->size)
        return tide_errorf(TIDE_ERR_RANGE, "allgather: %zu bytes per rank is too many", bytes);
    if (bytes == 0)
        return TIDE_OK;
    return finish(comm, comm->be->allgather(comm, send, recv, bytes, stream));
}

tide_status tide_coll_reduce_scatter(tide_coll_comm_t *comm, const void *send, void *recv,
                                     size_t count, tide_dtype dtype, tide_red_op op,
                                     tide_coll_stream_t stream)
{
    TIDE_CHECK(live(comm, "reduce_scatter"));
    TIDE_CHECK(check_red(comm, "reduce_scatter", send, recv, count, dtype, op));
    if (count == 0)
        return TIDE_OK;
    return finish(comm, comm->be->reduce_scatter(comm, send, recv, count, dtype, op, stream));
}

tide_status tide_coll_barrier(tide_coll_comm_t *comm, tide_coll_stream_t stream)
{
    TIDE_CHECK(live(comm, "barrier"));
    return finish(comm, comm->be->barrier(comm, stream));
}

/* ---- devices and memory ------------------------------------------------------------ */

tide_status tide_coll_device_bind(const tide_coll_backend_v1 *be, int device)
{
    if (be == NULL)
        return tide_errorf(TIDE_ERR_INVALID, "tide_coll_device_bind: backend is NULL");
    if (be->device_bind == NULL)
        return TIDE_OK;
    if (device < 0)
        return tide_errorf(TIDE_ERR_INVALID, "backend '%s' needs a device index, got %d", be->name,
                           device);
    return be->device_bind(device);
}

tide_status tide_coll_mem_alloc(const tide_coll_backend_v1 *be, int device, size_t bytes,
                                void **out)
{
    if (be == NULL || out == NULL)
        return tide_errorf(TIDE_ERR_INVALID, "tide_coll_mem_alloc: backend and out are required");
    *out = NULL;
    if (be->mem_alloc_on != NULL)
        return be->mem_alloc_on(device, bytes, out);
    return be->mem_alloc(bytes, out);
}

tide_status tide_coll_mem_zero(const tide_coll_backend_v1 *be, int device, void *ptr, size_t bytes)
{
    if (be == NULL)
        return tide_errorf(TIDE_ERR_INVALID, "tide_coll_mem_zero: backend is NULL");
    if (bytes == 0)
        return TIDE_OK;
    if (ptr == NULL)
        return tide_errorf(TIDE_ERR_INVALID, "tide_coll_mem_zero: NULL buffer of %zu bytes", bytes);
    if (be->mem_zero != NULL)
        return be->mem_zero(device, ptr, bytes);
    if (be->mem_kind != TIDE_MEM_HOST)
        return tide_errorf(TIDE_ERR_UNSUPPORTED, "backend '%s' cannot zero its memory", be->name);
    memset(ptr, 0, bytes);
    return TIDE_OK;
}

tide_status tide_coll_mem_check(const tide_coll_backend_v1 *be, const void *ptr, size_t bytes,
                                const char *what)
{
    if (be == NULL)
        return tide_errorf(TIDE_ERR_INVALID, "tide_coll_mem_check: backend is NULL");
    if (bytes == 0 || be->mem_check == NULL)
        return TIDE_OK;
    if (ptr == NULL)
        return tide_errorf(TIDE_ERR_INVALID, "%s: NULL buffer of %zu bytes", what ? what : "buffer",
                           bytes);
    return be->mem_check(ptr, bytes, what ? what : "buffer");
}

tide_status tide_coll_stream_new_low(const tide_coll_backend_v1 *be, int device,
                                     tide_coll_stream_t *out)
{
    if (be == NULL || out == NULL)
        return tide_errorf(TIDE_ERR_INVALID, "tide_coll_stream_new_low: backend and out are "
                                             "required");
    *out = NULL;
    return be->stream_new_low != NULL ? be->stream_new_low(device, out) : TIDE_OK;
}

void tide_coll_stream_free(const tide_coll_backend_v1 *be, tide_coll_stream_t stream)
{
    if (be != NULL && stream != NULL && be->stream_free != NULL)
        be->stream_free(stream);
}

tide__copy2d_mode tide__copy2d_choose(size_t dpitch, size_t spitch, size_t width, size_t height,
                                      size_t max_pitch)
{
    if (height <= 1 || (dpitch == width && spitch == width))
        return TIDE__COPY_FLAT;
    if (dpitch <= max_pitch && spitch <= max_pitch)
        return TIDE__COPY_2D;
    return TIDE__COPY_ROWS;
}

tide_status tide__copy2d_split(void *dst, size_t dpitch, const void *src, size_t spitch,
                               size_t width, size_t height, size_t max_pitch,
                               const tide__copy2d_fns *fns, void *ctx)
{
    if (width == 0 || height == 0)
        return TIDE_OK;
    char *d = dst;
    const char *s = src;
    switch (tide__copy2d_choose(dpitch, spitch, width, height, max_pitch)) {
    case TIDE__COPY_FLAT:
        /* one row, or rows back to back at both ends: the pitch is irrelevant */
        return fns->flat(ctx, d, s, height == 1 ? width : width * height);
    case TIDE__COPY_2D:
        return fns->rect(ctx, d, dpitch, s, spitch, width, height);
    case TIDE__COPY_ROWS:
        /* a pitch beyond the device's limit comes with rows of GiBs: few of them */
        for (size_t r = 0; r < height; r++)
            TIDE_CHECK(fns->flat(ctx, d + r * dpitch, s + r * spitch, width));
        return TIDE_OK;
    }
    return tide_errorf(TIDE_ERR_INTERNAL, "unknown copy mode");
}
