/*
 * The entry file of the backend-independent half of collectives/: communicators (the
 * common state, creation, colour splits, abort, queries) and the tide_coll_* operations on
 * them (argument checks, abort state, dispatch to the backend). Beside it: coll_base.c
 * (backend registry, MPI helpers, lease, backoff, host reductions), coll_pool.c (pools,
 * the creation handshake, a host allgather over the pool) and coll_mem.c (devices,
 * memory, streams, 2D copies). Workload: wrappers run once per operation, so they only
 * do O(1) checks (O(n) for a p2p batch of n ops).
 */
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "collectives/collectives_int.h"
#include "core/alloc.h"

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
