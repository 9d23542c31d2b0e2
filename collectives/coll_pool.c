/*
 * Pools (tide_coll_pool_*: the MPI processes communicators are made from, and subsets of
 * them), the handshake every member of a new communicator goes through before any
 * creation call (tide__pool_handshake_run and its hs_* halves, which both backends
 * call), and an allgather in host memory over the pool (tide__pool_allgather, which a
 * colour split uses instead of a device collective; tide_coll_pool_allgather for
 * callers). Workload: once per pool and per communicator creation, never per operation;
 * O(members) messages, bounded by a deadline and cancel flags.
 */
#include <limits.h>
#include <stdio.h>
#include <string.h>

#include "collectives/collectives_int.h"
#include "core/alloc.h"
#include "core/clock.h"

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
    tide_status rc = root ? hs_root(&r, payload, payload_len) : hs_member(&r, payload, payload_len);
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
