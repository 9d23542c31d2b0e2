/*
 * tide_mlp_comm over MPI (host memory) and the root gather/scatter of train_mlp's state.
 * MPI error codes are translated to TIDE_ERR_BACKEND here and nowhere else.
 */
#include <limits.h>
#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "core/log.h"
#include "examples/mlp_mpi.h"

#define SUBSYS    "mlp.mpi"
#define TAG_FWD   11        /* activations, stage p -> p + 1 */
#define TAG_BWD   12        /* gradients, stage p + 1 -> p */
#define TAG_STATE 13        /* gather / scatter */
#define CHUNK     (1 << 30) /* elements or bytes per MPI call (counts are int) */

struct tide_mlp_mpi {
    tide_mlp_comm comm;
    MPI_Comm tp, dp, pp;
    int pp_rank, pp_size;
};

static tide_status mpi_fail(int err, const char *what)
{
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(err, msg, &len) != MPI_SUCCESS)
        snprintf(msg, sizeof msg, "MPI error %d", err);
    return tide_errorf(TIDE_ERR_BACKEND, "%s failed: %s", what, msg);
}

#define MPI_CHECK(call, what)                                                                      \
    do {                                                                                           \
        int mpi__err = (call);                                                                     \
        if (mpi__err != MPI_SUCCESS)                                                               \
            return mpi_fail(mpi__err, what);                                                       \
    } while (0)

static tide_status c_allreduce(void *ctx, tide_mlp_group group, void *buf, size_t n,
                               tide_dtype dtype, tide_mlp_redop op)
{
    tide_mlp_mpi_t *s = ctx;
    MPI_Comm c = group == TIDE_MLP_GROUP_TP ? s->tp : group == TIDE_MLP_GROUP_DP ? s->dp : s->pp;
    if (c == MPI_COMM_NULL)
        return tide_errorf(TIDE_ERR_INVALID, "allreduce on a rank outside the layout");
    MPI_Datatype t;
    if (dtype == TIDE_F32)
        t = MPI_FLOAT;
    else if (dtype == TIDE_F64)
        t = MPI_DOUBLE;
    else
        return tide_errorf(TIDE_ERR_UNSUPPORTED, "allreduce of %s", tide_dtype_name(dtype));
    size_t es = tide_dtype_size(dtype);
    for (size_t off = 0; off < n; off += CHUNK) {
        size_t k = n - off < CHUNK ? n - off : CHUNK;
        MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, (char *)buf + off * es, (int)k, t,
                                op == TIDE_MLP_MAX ? MPI_MAX : MPI_SUM, c),
                  "MPI_Allreduce");
    }
    return TIDE_OK;
}

static tide_status c_exchange(void *ctx, int send_peer, const float *send_buf, size_t send_n,
                              int recv_peer, float *recv_buf, size_t recv_n)
{
    tide_mlp_mpi_t *s = ctx;
    if (s->pp == MPI_COMM_NULL)
        return tide_errorf(TIDE_ERR_INVALID, "pipeline exchange on a rank outside the layout");
    if (send_n > INT_MAX || recv_n > INT_MAX)
        return tide_errorf(TIDE_ERR_RANGE, "pipeline message of %zu floats exceeds MPI's int",
                           send_n > recv_n ? send_n : recv_n);
    MPI_Request req[2];
    int nreq = 0;
    if (recv_peer != 0) {
        int src = s->pp_rank + recv_peer;
        if (src < 0 || src >= s->pp_size)
            return tide_errorf(TIDE_ERR_INVALID, "no pipeline stage %d to receive from", src);
        MPI_CHECK(MPI_Irecv(recv_buf, (int)recv_n, MPI_FLOAT, src,
                            recv_peer < 0 ? TAG_FWD : TAG_BWD, s->pp, &req[nreq++]),
                  "MPI_Irecv");
    }
    if (send_peer != 0) {
        int dst = s->pp_rank + send_peer;
        if (dst < 0 || dst >= s->pp_size)
            return tide_errorf(TIDE_ERR_INVALID, "no pipeline stage %d to send to", dst);
        MPI_CHECK(MPI_Isend(send_buf, (int)send_n, MPI_FLOAT, dst,
                            send_peer > 0 ? TAG_FWD : TAG_BWD, s->pp, &req[nreq++]),
                  "MPI_Isend");
    }
    MPI_CHECK(MPI_Waitall(nreq, req, MPI_STATUSES_IGNORE), "MPI_Waitall (pipeline)");
    return TIDE_OK;
}

tide_status tide_mlp_mpi_new(tide_mlp_mpi_t **out, MPI_Comm world, const tide_layout_t *l)
{
    *out = NULL;
    int rank = 0, size = 0;
    MPI_CHECK(MPI_Comm_rank(world, &rank), "MPI_Comm_rank");
    MPI_CHECK(MPI_Comm_size(world, &size), "MPI_Comm_size");
    for (size_t i = 0; i < tide_layout_size(l); i++)
        if (l->worker[i] < 0 || l->worker[i] >= size)
            return tide_errorf(TIDE_ERR_INVALID,
                               "layout names worker %d but only %d ranks were launched (mpirun "
                               "-np must be >= dp * tp * pp)",
                               l->worker[i], size);
    tide_mlp_mpi_t *s = tide_calloc(1, sizeof *s);
    if (s == NULL)
        return tide_errorf(TIDE_ERR_NOMEM, "out of memory for the MPI comm");
    s->tp = s->dp = s->pp = MPI_COMM_NULL;
    int p = 0, d = 0, t = 0;
    int in = tide_layout_find(l, rank, &p, &d, &t) == TIDE_OK;
    tide_error_clear();
    int ctp = in ? p * l->dp + d : MPI_UNDEFINED;
    int cdp = in ? p * l->tp + t : MPI_UNDEFINED;
    int cpp = in ? d * l->tp + t : MPI_UNDEFINED;
    int err = MPI_Comm_split(world, ctp, t, &s->tp);
    if (err == MPI_SUCCESS)
        err = MPI_Comm_split(world, cdp, d, &s->dp);
    if (err == MPI_SUCCESS)
        err = MPI_Comm_split(world, cpp, p, &s->pp);
    if (err != MPI_SUCCESS) {
        tide_mlp_mpi_destroy(&s);
        return mpi_fail(err, "MPI_Comm_split");
    }
    if (in) {
        MPI_Comm_set_errhandler(s->tp, MPI_ERRORS_RETURN);
        MPI_Comm_set_errhandler(s->dp, MPI_ERRORS_RETURN);
        MPI_Comm_set_errhandler(s->pp, MPI_ERRORS_RETURN);
        MPI_Comm_rank(s->pp, &s->pp_rank);
        MPI_Comm_size(s->pp, &s->pp_size);
    }
    s->comm.ctx = s;
    s->comm.device_memory = 0;
    s->comm.allreduce = c_allreduce;
    s->comm.exchange = c_exchange;
    *out = s;
    return TIDE_OK;
}

void tide_mlp_mpi_destroy(tide_mlp_mpi_t **self_p)
{
    if (self_p == NULL || *self_p == NULL)
        return;
    tide_mlp_mpi_t *s = *self_p;
    if (s->tp != MPI_COMM_NULL)
        MPI_Comm_free(&s->tp);
    if (s->dp != MPI_COMM_NULL)
        MPI_Comm_free(&s->dp);
    if (s->pp != MPI_COMM_NULL)
        MPI_Comm_free(&s->pp);
    tide_free(s);
    *self_p = NULL;
}

const tide_mlp_comm *tide_mlp_mpi_comm(const tide_mlp_mpi_t *self)
{
    return &self->comm;
}

/* ---- gather / scatter ------------------------------------------------------------------- */

static tide_status send_bytes(const void *buf, uint64_t bytes, int dst, MPI_Comm world)
{
    for (uint64_t off = 0; off < bytes; off += CHUNK) {
        uint64_t k = bytes - off < CHUNK ? bytes - off : CHUNK;
        MPI_CHECK(MPI_Send((const char *)buf + off, (int)k, MPI_BYTE, dst, TAG_STATE, world),
                  "MPI_Send (state)");
    }
    return TIDE_OK;
}

static tide_status recv_bytes(void *buf, uint64_t bytes, int src, MPI_Comm world)
{
    for (uint64_t off = 0; off < bytes; off += CHUNK) {
        uint64_t k = bytes - off < CHUNK ? bytes - off : CHUNK;
        MPI_CHECK(
            MPI_Recv((char *)buf + off, (int)k, MPI_BYTE, src, TAG_STATE, world, MPI_STATUS_IGNORE),
            "MPI_Recv (state)");
    }
    return TIDE_OK;
}

void tide_mlp_full_free(const tide_collection_t *c, void ***full_p)
{
    if (full_p == NULL || *full_p == NULL)
        return;
    for (size_t i = 0; i < tide_collection_size(c); i++)
        tide_free((*full_p)[i]);
    tide_free(*full_p);
    *full_p = NULL;
}

/* One copy of every byte: tp-split shards from every tp rank, else tp rank 0; dp-sharded
 * ranges from every dp rank, else dp rank 0. */
static int canonical(const tide_tensor_desc *td, int d, int t)
{
    return (td->tp == TIDE_TP_SPLIT || t == 0) && (td->dp == TIDE_DP_SHARDED || d == 0);
}

tide_status tide_mlp_gather(const tide_mlp_t *m, MPI_Comm world, int root, void ***full_out)
{
    tide_status rc = TIDE_OK;
    const tide_collection_t *c = tide_mlp_collection(m);
    const tide_layout_t *l = tide_mlp_layout(m);
    size_t n = tide_collection_size(c);
    int me = 0;
    void **full = NULL;
    void *tmp = NULL;
    *full_out = NULL;
    MPI_CHECK(MPI_Comm_rank(world, &me), "MPI_Comm_rank");
    if (me == root) {
        full = tide_calloc(n, sizeof *full);
        TIDE_CHECK_ALLOC_GOTO(full, rc, out);
    }
    for (size_t i = 0; i < n; i++) {
        const tide_tensor_desc *td = tide_collection_tensor(c, i);
        if (me == root) {
            full[i] = tide_calloc(1, tide_tensor_bytes(td));
            TIDE_CHECK_ALLOC_GOTO(full[i], rc, out);
        }
        for (int p = 0; p < l->pp; p++)
            for (int d = 0; d < l->dp; d++)
                for (int t = 0; t < l->tp; t++) {
                    uint64_t b = tide_shard_bytes(l, c, i, p, d, t);
                    int w = l->worker[tide_layout_index(l, p, d, t)];
                    if (b == 0 || !canonical(td, d, t) || (me != root && me != w))
                        continue;
                    tmp = tide_malloc(b);
                    TIDE_CHECK_ALLOC_GOTO(tmp, rc, out);
                    if (me == w)
                        TIDE_CHECK_GOTO(tide_mlp_read(m, i, tmp, b), rc, out);
                    if (me == root && w != root)
                        TIDE_CHECK_GOTO(recv_bytes(tmp, b, w, world), rc, out);
                    else if (me == w && w != root)
                        TIDE_CHECK_GOTO(send_bytes(tmp, b, root, world), rc, out);
                    if (me == root)
                        tide_shard_insert(l, c, i, p, d, t, tmp, full[i]);
                    tide_free(tmp);
                    tmp = NULL;
                }
    }
    *full_out = full;
    full = NULL;
out:
    tide_free(tmp);
    tide_mlp_full_free(c, &full);
    return rc;
}

tide_status tide_mlp_scatter(tide_mlp_t *m, MPI_Comm world, int root, void *const *full)
{
    tide_status rc = TIDE_OK;
    const tide_collection_t *c = tide_mlp_collection(m);
    const tide_layout_t *l = tide_mlp_layout(m);
    int me = 0;
    void *tmp = NULL;
    MPI_CHECK(MPI_Comm_rank(world, &me), "MPI_Comm_rank");
    if (me == root && full == NULL)
        return tide_errorf(TIDE_ERR_INVALID, "scatter: root has no state to send");
    for (size_t i = 0; i < tide_collection_size(c); i++)
        for (int p = 0; p < l->pp; p++)
            for (int d = 0; d < l->dp; d++)
                for (int t = 0; t < l->tp; t++) {
                    uint64_t b = tide_shard_bytes(l, c, i, p, d, t);
                    int w = l->worker[tide_layout_index(l, p, d, t)];
                    if (b == 0 || (me != root && me != w))
                        continue;
                    tmp = tide_malloc(b);
                    TIDE_CHECK_ALLOC_GOTO(tmp, rc, out);
                    if (me == root)
                        tide_shard_extract(l, c, i, p, d, t, full[i], tmp);
                    if (me == root && w != root)
                        TIDE_CHECK_GOTO(send_bytes(tmp, b, w, world), rc, out);
                    else if (me == w && w != root)
                        TIDE_CHECK_GOTO(recv_bytes(tmp, b, root, world), rc, out);
                    if (me == w)
                        TIDE_CHECK_GOTO(tide_mlp_write(m, i, tmp, b), rc, out);
                    tide_free(tmp);
                    tmp = NULL;
                }
out:
    tide_free(tmp);
    return rc;
}

tide_status tide_mlp_relayout_via_root(tide_mlp_t *m, MPI_Comm world, int root,
                                       const tide_layout_t *new_l)
{
    tide_status rc = TIDE_OK;
    void **full = NULL, **bufs = NULL;
    int me = 0;
    MPI_CHECK(MPI_Comm_rank(world, &me), "MPI_Comm_rank");
    TIDE_CHECK_GOTO(tide_mlp_gather(m, world, root, &full), rc, out);
    TIDE_CHECK_GOTO(tide_mlp_alloc_buffers(m, new_l, me, &bufs), rc, out);
    TIDE_CHECK_GOTO(tide_mlp_adopt(m, new_l, me, &bufs), rc, out);
    TIDE_CHECK_GOTO(tide_mlp_scatter(m, world, root, full), rc, out);
out:
    tide_mlp_free_buffers(m, &bufs);
    tide_mlp_full_free(tide_mlp_collection(m), &full);
    return rc;
}
