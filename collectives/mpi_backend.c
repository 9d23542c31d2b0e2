/*
 * The "mpi" collective backend: host memory, Open MPI underneath.
 *
 * Every operation is built from non-blocking point-to-point calls (MPI_Isend /
 * MPI_Irecv) polled by one progress loop (MPI_Testsome plus the tide__backoff pause)
 * that checks the communicator's abort flag between polls, so a rank waiting on a
 * dead peer returns TIDE_ERR_ABORTED within about a millisecond of tide_coll_comm_abort
 * instead of hanging. Collectives are the classic bandwidth-optimal algorithms (ring
 * reduce-scatter + ring allgather for allreduce, ring allgather, binomial broadcast,
 * dissemination barrier), written here rather than taken from MPI's non-blocking
 * collectives because an MPI_Iallreduce can be neither cancelled nor abandoned
 * safely, while point-to-point receives can be cancelled. Reductions, bf16 included,
 * are done by tide__reduce_host, so results are bit-identical on every rank.
 *
 * Communicators come from MPI_Comm_create_group over the pool's communicator: only the
 * members take part, so the survivors of a failure can build one while a dead rank
 * is still in the pool. An aborted communicator is never freed: Open MPI 4.1 has no
 * revoke, and freeing it would let Open MPI reuse its context id while messages of
 * the aborted operation are still in flight, which could then match a receive of an
 * unrelated new communicator. The leak is one communicator per failure.
 *
 * Single copy ("direct", collectives/cma.c): between two ranks of one host that agreed
 * on it at creation, a p2p message of at least TIDE_COLL_CMA_MIN bytes whose op knows
 * the other end's layout (tide_p2p_peer) and where exactly one end is strided
 * is copied by that end with process_vm_writev / process_vm_readv, straight between
 * the two buffers, instead of travelling as an MPI vector type (packed and unpacked
 * through shared-memory fragments). Its descriptor exchange and copy run inside the
 * same progress loop, in slices between abort checks. Both ends contiguous stays on
 * plain MPI (already a single copy), both strided on the MPI vector path.
 *
 * Workload: messages from 0 bytes to GiBs (split into pieces of at most 1 GiB, MPI
 * counts being ints); a handful of requests per operation, thousands per reshard.
 */
#include <dlfcn.h>
#include <limits.h>
#include <link.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "collectives/cma_int.h"
#include "collectives/collectives_int.h"
#include "core/alloc.h"
#include "core/clock.h"

/* Tags on a tide communicator: one per kind of operation, so a grouped p2p batch and a
   collective never match each other's messages. */
enum { TAG_P2P = 1, TAG_ALLREDUCE, TAG_BCAST, TAG_ALLGATHER, TAG_RSCATTER, TAG_BARRIER };

/* Largest single MPI message (bytes): counts are ints. */
#define MSG_MAX ((size_t)1 << 30)

typedef struct mpi_comm {
    MPI_Comm comm;
    void *tmp;          /* scratch for reductions, grown on demand */
    size_t tmp_cap;     /* bytes */
    int quarantine;     /* an abandoned receive may still write tmp (or a single-copy
                           pusher a receive buffer: see tide__cma_abandon): never free it */
    tide__cma_comm cma; /* single-copy agreement and counters */
} mpi_comm;

/* Requests a batch holds without allocating: a collective step needs two (one send,
   one receive), so collectives never allocate, and neither does the executor's
   agreement allreduce (allocation-failure tests rely on it). */
#define BATCH_INLINE 4

/* A batch of requests; also the tide_coll_req_t of this backend. */
struct tide_coll_req {
    MPI_Request *reqs;
    size_t *expect;     /* bytes a receive must deliver; SIZE_MAX for a send */
    int *peer;          /* for error messages */
    int *idx;           /* MPI_Testsome scratch */
    MPI_Status *st;     /* MPI_Testsome scratch */
    int n, cap;         /* cap 0: the inline arrays below are in use (or nothing yet) */
    int left;           /* requests not yet complete */
    tide__cma_xfer *xs; /* single-copy messages (p2p batches only); fixed once posted */
    int n_xs, xs_left;  /* how many, and how many not yet complete */
    int leak_xs;        /* MPI or a peer may still touch xs after an abandon: never free */
    MPI_Request in_reqs[BATCH_INLINE];
    size_t in_expect[BATCH_INLINE];
    int in_peer[BATCH_INLINE], in_idx[BATCH_INLINE];
    MPI_Status in_st[BATCH_INLINE];
};

/* Smallest reduction scratch, allocated with the communicator (bytes). */
#define TMP_MIN 4096

static mpi_comm *impl(tide_coll_comm_t *c)
{
    return c->impl;
}

/* ---- batches ------------------------------------------------------------------------ */

static void batch_init(struct tide_coll_req *b)
{
    memset(b, 0, sizeof *b);
    b->reqs = b->in_reqs;
    b->expect = b->in_expect;
    b->peer = b->in_peer;
    b->idx = b->in_idx;
    b->st = b->in_st;
}

static void batch_release(struct tide_coll_req *b)
{
    if (b->cap > 0) {
        tide_free(b->reqs);
        tide_free(b->expect);
        tide_free(b->peer);
        tide_free(b->idx);
        tide_free(b->st);
    }
    if (b->leak_xs)
        tide__cma_bury(b->xs);
    else
        tide_free(b->xs);
    batch_init(b);
}

/* 1 once every request and every single-copy message of the batch has completed. */
static int batch_done(const struct tide_coll_req *b)
{
    return b->left == 0 && b->xs_left == 0;
}

static tide_status batch_reserve(struct tide_coll_req *b, int extra)
{
    int have = b->cap > 0 ? b->cap : BATCH_INLINE;
    if (b->n + extra <= have)
        return TIDE_OK;
    int cap = have * 2;
    while (cap < b->n + extra)
        cap *= 2;
    MPI_Request *reqs = tide_calloc((size_t)cap, sizeof *reqs);
    size_t *expect = tide_calloc((size_t)cap, sizeof *expect);
    int *peer = tide_calloc((size_t)cap, sizeof *peer);
    int *idx = tide_calloc((size_t)cap, sizeof *idx);
    MPI_Status *st = tide_calloc((size_t)cap, sizeof *st);
    if (!reqs || !expect || !peer || !idx || !st) {
        tide_free(reqs);
        tide_free(expect);
        tide_free(peer);
        tide_free(idx);
        tide_free(st);
        return tide_errorf(TIDE_ERR_NOMEM, "out of memory growing an MPI request batch");
    }
    memcpy(reqs, b->reqs, (size_t)b->n * sizeof *reqs);
    memcpy(expect, b->expect, (size_t)b->n * sizeof *expect);
    memcpy(peer, b->peer, (size_t)b->n * sizeof *peer);
    if (b->cap > 0) {
        tide_free(b->reqs);
        tide_free(b->expect);
        tide_free(b->peer);
        tide_free(b->idx);
        tide_free(b->st);
    }
    b->reqs = reqs;
    b->expect = expect;
    b->peer = peer;
    b->idx = idx;
    b->st = st;
    b->cap = cap;
    return TIDE_OK;
}

/* Posts one logical message as pieces of at most MSG_MAX bytes (at least one piece, so a
   0-byte message is still matched in order). */
static tide_status batch_post(struct tide_coll_req *b, MPI_Comm comm, int send, void *buf,
                              size_t bytes, int peer, int tag)
{
    int pieces = bytes == 0 ? 1 : (int)((bytes + MSG_MAX - 1) / MSG_MAX);
    TIDE_CHECK(batch_reserve(b, pieces));
    for (int i = 0; i < pieces; i++) {
        size_t off = (size_t)i * MSG_MAX;
        size_t len = bytes - off < MSG_MAX ? bytes - off : MSG_MAX;
        char *p = bytes ? (char *)buf + off : buf;
        MPI_Request *r = &b->reqs[b->n];
        if (send)
            MPI_CHECK(MPI_Isend(p, (int)len, MPI_BYTE, peer, tag, comm, r));
        else
            MPI_CHECK(MPI_Irecv(p, (int)len, MPI_BYTE, peer, tag, comm, r));
        b->expect[b->n] = send ? SIZE_MAX : len;
        b->peer[b->n] = peer;
        b->n++;
        b->left++;
    }
    return TIDE_OK;
}

/* Gives up on a batch (abort or error): single-copy messages first (their liveness
   words are cleared before anything else, and pushers into our receive buffers are
   waited for, bounded), then cancels and frees the MPI requests still active. */
static void batch_abandon(tide_coll_comm_t *c, struct tide_coll_req *b)
{
    mpi_comm *m = impl(c);
    if (tide_coll_lease_expired() && (b->left > 0 || b->xs_left > 0)) {
        /* given up by its peers, maybe: not one more MPI call or single copy (either
           would progress what they abandoned); requests, scratch and descriptors stay */
        m->quarantine = 1;
        b->leak_xs = b->n_xs > 0;
        b->xs_left = 0;
        b->left = 0;
        return;
    }
    if (b->xs_left > 0 && tide__cma_abandon(&m->cma, m->comm, b->xs, b->n_xs, &m->quarantine))
        b->leak_xs = 1;
    b->xs_left = 0;
    if (b->left > 0 && tide__mpi_abandon(b->reqs, b->n) > 0)
        m->quarantine = 1;
    b->left = 0;
}

/* Steps every single-copy message of the batch, copying at most TIDE_CMA_SLICE bytes
   in all, so the progress loop checks the abort flag between slices. */
static tide_status xs_poll(tide_coll_comm_t *c, struct tide_coll_req *b, int *progress)
{
    mpi_comm *m = impl(c);
    uint64_t budget = TIDE_CMA_SLICE;
    for (int i = 0; i < b->n_xs && b->xs_left > 0; i++) {
        tide__cma_xfer *x = &b->xs[i];
        if (x->state == TIDE_CMA_X_DONE)
            continue;
        TIDE_CHECK(tide__cma_step(&m->cma, m->comm, x, &budget, progress));
        if (x->state == TIDE_CMA_X_DONE)
            b->xs_left--;
    }
    return TIDE_OK;
}

/* A plain receive from peer failed on its size: when the size is a single-copy
   descriptor's, the peer sent a direct message where we expected a plain one, and
   waits for our reverse descriptor: nack it so that it fails too. */
static void maybe_stray(tide_coll_comm_t *c, int peer, size_t got)
{
    mpi_comm *m = impl(c);
    if (tide__cma_maybe_stray(&m->cma, peer, got))
        tide__cma_stray(&m->cma, m->comm, peer);
}

/* One poll: completes what has finished, checks receive sizes. *progress = completions. */
static tide_status batch_poll(tide_coll_comm_t *c, struct tide_coll_req *b, int *progress)
{
    *progress = 0;
    if (b->xs_left > 0) {
        tide_status rc = xs_poll(c, b, progress);
        if (rc != TIDE_OK) {
            batch_abandon(c, b);
            return rc;
        }
    }
    if (b->left == 0)
        return TIDE_OK;
    int outcount = 0;
    int err = MPI_Testsome(b->n, b->reqs, &outcount, b->idx, b->st);
    if (err != MPI_SUCCESS && err != MPI_ERR_IN_STATUS) {
        batch_abandon(c, b);
        return tide__mpi_error(err, "MPI_Testsome", __FILE__, __LINE__);
    }
    if (outcount == MPI_UNDEFINED) {
        b->left = 0;
        return TIDE_OK;
    }
    for (int k = 0; k < outcount; k++) {
        int i = b->idx[k];
        if (err == MPI_ERR_IN_STATUS && b->st[k].MPI_ERROR != MPI_SUCCESS) {
            int cls = 0;
            MPI_Error_class(b->st[k].MPI_ERROR, &cls);
            if (cls == MPI_ERR_TRUNCATE && b->expect[i] != SIZE_MAX) {
                maybe_stray(c, b->peer[i], SIZE_MAX);
                batch_abandon(c, b);
                return tide_errorf(TIDE_ERR_PROTOCOL,
                                   "a message from rank %d was bigger than the %zu bytes rank %d "
                                   "expected (the ranks disagree on the operation's sizes)",
                                   b->peer[i], b->expect[i], c->rank);
            }
            batch_abandon(c, b);
            tide_status rc =
                tide__mpi_error(b->st[k].MPI_ERROR, "MPI_Testsome (a request)", __FILE__, __LINE__);
            return tide_errorf(rc, "message %s rank %d failed: %s",
                               b->expect[i] == SIZE_MAX ? "to" : "from", b->peer[i],
                               tide_last_error());
        }
        if (b->expect[i] != SIZE_MAX) {
            int got = 0;
            MPI_Get_count(&b->st[k], MPI_BYTE, &got);
            if ((size_t)got != b->expect[i]) {
                maybe_stray(c, b->peer[i], (size_t)got);
                batch_abandon(c, b);
                return tide_errorf(TIDE_ERR_PROTOCOL,
                                   "received %d bytes from rank %d where %zu were expected "
                                   "(the ranks disagree on the operation's sizes)",
                                   got, b->peer[i], b->expect[i]);
            }
        }
    }
    b->left -= outcount;
    *progress = outcount;
    return TIDE_OK;
}

/* 1 when nothing of the batch needs this rank's work: no MPI request is pending and
   every single-copy message waits for the peer that copies it. */
static int batch_idle(const struct tide_coll_req *b)
{
    if (b->left > 0)
        return 0;
    for (int i = 0; i < b->n_xs; i++)
        if (!tide__cma_idle(&b->xs[i]))
            return 0;
    return 1;
}

/* Pause of a rank that only waits for a peer's single copy (us): it has nothing to
   progress locally, so it sleeps rather than spins, leaving the core to the copiers
   (which matters when ranks outnumber cores); the acknowledgement is seen within about
   that long, against copies of milliseconds. */
#define IDLE_PAUSE_US 50

/* The progress loop: polls until the batch completes or the communicator is aborted. */
static tide_status batch_wait(tide_coll_comm_t *c, struct tide_coll_req *b)
{
    tide__backoff bo;
    tide__backoff_init(&bo);
    for (;;) {
        if (tide__comm_is_aborted(c)) {
            batch_abandon(c, b);
            return tide_errorf(TIDE_ERR_ABORTED,
                               "communicator aborted while rank %d of %d was waiting on its "
                               "peers",
                               c->rank, c->size);
        }
        int progress = 0;
        TIDE_CHECK(batch_poll(c, b, &progress));
        if (batch_done(b))
            return TIDE_OK;
        if (progress) {
            tide__backoff_progress(&bo);
        } else if (b->n_xs > 0 && batch_idle(b)) {
            struct timespec ts = {0, IDLE_PAUSE_US * 1000L};
            nanosleep(&ts, NULL);
        } else {
            tide__backoff_pause(&bo);
        }
    }
}

/* Posts a send and a receive (either may be skipped with peer < 0) and waits for both. */
static tide_status sendrecv(tide_coll_comm_t *c, const void *sbuf, size_t sbytes, int speer,
                            void *rbuf, size_t rbytes, int rpeer, int tag)
{
    struct tide_coll_req b;
    batch_init(&b);
    tide_status rc = TIDE_OK;
    MPI_Comm comm = impl(c)->comm;
    if (rpeer >= 0)
        TIDE_CHECK_GOTO(batch_post(&b, comm, 0, rbuf, rbytes, rpeer, tag), rc, out);
    if (speer >= 0)
        TIDE_CHECK_GOTO(batch_post(&b, comm, 1, (void *)sbuf, sbytes, speer, tag), rc, out);
    TIDE_CHECK_GOTO(batch_wait(c, &b), rc, out);
out:
    if (rc != TIDE_OK)
        batch_abandon(c, &b);
    batch_release(&b);
    return rc;
}

static tide_status tmp_reserve(tide_coll_comm_t *c, size_t bytes, void **out)
{
    mpi_comm *m = impl(c);
    if (m->tmp_cap < bytes) {
        if (m->quarantine) {
            /* The old buffer may still be written by an abandoned receive: keep it. */
            tide__cma_bury(m->tmp);
            m->tmp = NULL;
            m->tmp_cap = 0;
        }
        void *p = tide_realloc(m->tmp, bytes);
        if (p == NULL)
            return tide_errorf(TIDE_ERR_NOMEM, "out of memory for %zu bytes of reduction scratch",
                               bytes);
        m->tmp = p;
        m->tmp_cap = bytes;
    }
    *out = m->tmp;
    return TIDE_OK;
}

/* ---- communicators -------------------------------------------------------------------- */

static tide_status finish_create(tide_coll_comm_t *c, int tag)
{
    mpi_comm *m = impl(c);
    MPI_Group pg = MPI_GROUP_NULL, g = MPI_GROUP_NULL;
    tide_status rc = TIDE_OK;
    /* the members' ranks in the pool's communicator (the pool ranks themselves unless
       the pool joined others); a failure here is local to a joined pool's member, whose
       peers then time out in the creation below */
    int *cr = c->members;
    if (c->pool->crank != NULL) {
        cr = tide_malloc((size_t)c->size * sizeof *cr);
        if (cr == NULL)
            return tide_errorf(TIDE_ERR_NOMEM, "out of memory creating a communicator");
        for (int i = 0; i < c->size; i++)
            cr[i] = tide__pool_crank(c->pool, c->members[i]);
    }
    MPI_CHECK_GOTO(MPI_Comm_group(c->pool->comm, &pg), rc, out);
    MPI_CHECK_GOTO(MPI_Group_incl(pg, c->size, cr, &g), rc, out);
    /* Collective over the group's members only (Open MPI allocates the context id with
       point-to-point messages among them), so dead pool ranks outside it do not matter. */
    MPI_CHECK_GOTO(MPI_Comm_create_group(c->pool->comm, g, 2 * tag + 1, &m->comm), rc, out);
    MPI_CHECK_GOTO(MPI_Comm_set_errhandler(m->comm, MPI_ERRORS_RETURN), rc, out);
    int r = -1;
    MPI_CHECK_GOTO(MPI_Comm_rank(m->comm, &r), rc, out);
    if (r != c->rank)
        rc = tide_errorf(TIDE_ERR_INTERNAL, "MPI gave rank %d where tide expected %d", r, c->rank);
out:
    if (g != MPI_GROUP_NULL)
        MPI_Group_free(&g);
    if (pg != MPI_GROUP_NULL)
        MPI_Group_free(&pg);
    if (cr != c->members)
        tide_free(cr);
    return rc;
}

static void mpi_destroy(tide_coll_comm_t *c);

static tide_status create_members(tide_coll_pool_t *pool, const int *members, int n, int tag,
                                  uint32_t timeout_ms, const int *cancel, const int *cancel2,
                                  tide_coll_comm_t **out)
{
    tide_coll_comm_t *c = NULL;
    tide_status rc = TIDE_OK;
    /* Every allocation happens before any message, so an allocation failure is the same
       on every member and nobody is left waiting in the handshake. */
    TIDE_CHECK(tide__comm_alloc(&tide__coll_mpi_backend, pool, members, n, tag, timeout_ms, &c));
    mpi_comm *m = tide_calloc(1, sizeof *m);
    TIDE_CHECK_ALLOC_GOTO(m, rc, fail);
    m->comm = MPI_COMM_NULL;
    c->impl = m;
    m->tmp = tide_malloc(TMP_MIN);
    TIDE_CHECK_ALLOC_GOTO(m->tmp, rc, fail);
    m->tmp_cap = TMP_MIN;
    TIDE_CHECK_GOTO(tide__cma_comm_init(&m->cma, c->rank, n), rc, fail);
    tide__handshake h = {members, n, tag, timeout_ms, cancel, cancel2, NULL, NULL};
    TIDE_CHECK_GOTO(tide__pool_handshake_run(pool, &h, NULL, 0), rc, fail);
    TIDE_CHECK_GOTO(finish_create(c, tag), rc, fail);
    TIDE_CHECK_GOTO(tide__cma_agree(&m->cma, c), rc, fail);
    TIDE_DEBUG(TIDE_COLL_LOG, "mpi communicator: rank %d of %d (tag %d)", c->rank, c->size, tag);
    *out = c;
    return TIDE_OK;
fail:
    mpi_destroy(c);
    return rc;
}

static tide_status mpi_create(tide_coll_pool_t *pool, const tide_coll_comm_params *p,
                              tide_coll_comm_t **out)
{
    return create_members(pool, p->members, p->n_members, p->tag, p->timeout_ms, p->cancel, NULL,
                          out);
}

static tide_status mpi_split(tide_coll_comm_t *parent, int color, int key, const int *members,
                             int n, tide_coll_comm_t **out)
{
    (void)key;
    *out = NULL;
    if (color < 0)
        return TIDE_OK;
    /* Same derived tag on every member: parent tag and split count are the same there. */
    int tag = (int)(((unsigned)parent->tag * 2654435761u + 7919u * (parent->split_seq + 1u)) %
                    (TIDE_COLL_MAX_TAG + 1u));
    /* aborting the parent (a switch that fails), directly or through its watch word,
       ends the split's handshake too */
    return create_members(parent->pool, members, n, tag, parent->timeout_ms,
                          (const int *)&parent->aborted, parent->watch, out);
}

static void mpi_destroy(tide_coll_comm_t *c)
{
    if (c == NULL)
        return;
    mpi_comm *m = impl(c);
    if (m != NULL) {
        int fin = 0;
        MPI_Finalized(&fin);
        if (m->comm != MPI_COMM_NULL && !fin) {
            if (tide__comm_is_aborted(c))
                TIDE_DEBUG(TIDE_COLL_LOG, "leaving aborted MPI communicator allocated (no "
                                          "revoke in this MPI; its context id stays reserved)");
            else
                MPI_Comm_free(&m->comm);
        }
        if (m->quarantine)
            tide__cma_bury(m->tmp); /* an abandoned receive may still write it */
        else
            tide_free(m->tmp);
        tide__cma_comm_fini(&m->cma);
        tide_free(m);
    }
    tide__comm_free(c);
}

static void mpi_abort(tide_coll_comm_t *c)
{
    (void)c; /* the flag set by the wrapper is all the progress loop needs */
}

/* ---- point to point ---------------------------------------------------------------------- */

/* A strided op as one message of an MPI vector type: Open MPI packs the runs into its
   own fragments (which it copies anyway without single-copy transports), so strided
   tensor regions travel without a staging copy. The type signature is bytes MPI_BYTEs,
   the same as a contiguous message, so the other end may be contiguous. */
static tide_status post_strided(struct tide_coll_req *b, MPI_Comm comm, int send,
                                const tide_p2p_op *op)
{
    TIDE_CHECK(batch_reserve(b, 1));
    MPI_Datatype t;
    MPI_CHECK(MPI_Type_create_hvector((int)(op->bytes / op->run), (int)op->run,
                                      (MPI_Aint)op->stride, MPI_BYTE, &t));
    int err = MPI_Type_commit(&t);
    MPI_Request *r = &b->reqs[b->n];
    if (err == MPI_SUCCESS)
        err = send ? MPI_Isend(op->buf, 1, t, op->peer, TAG_P2P, comm, r)
                   : MPI_Irecv(op->buf, 1, t, op->peer, TAG_P2P, comm, r);
    MPI_Type_free(&t); /* the request keeps what it needs */
    if (err != MPI_SUCCESS)
        return tide__mpi_error(err, send ? "MPI_Isend(vector)" : "MPI_Irecv(vector)", __FILE__,
                               __LINE__);
    /* MPI_Get_count in MPI_BYTE counts the bytes delivered into the vector. */
    b->expect[b->n] = send ? SIZE_MAX : op->bytes;
    b->peer[b->n] = op->peer;
    b->n++;
    b->left++;
    return TIDE_OK;
}

static tide_status mpi_p2p_start(tide_coll_comm_t *c, const tide_p2p_op *ops,
                                 const tide_p2p_peer *peers, size_t n, tide_coll_stream_t stream,
                                 tide_coll_req_t **out)
{
    (void)stream;
    struct tide_coll_req *b = tide_malloc(sizeof *b);
    if (b == NULL)
        return tide_errorf(TIDE_ERR_NOMEM, "out of memory for a p2p batch");
    batch_init(b);
    tide_status rc = TIDE_OK;
    mpi_comm *m = impl(c);
    MPI_Comm comm = m->comm;
    size_t n_direct = 0;
    for (size_t i = 0; i < n; i++)
        n_direct += tide__cma_mode(&m->cma, &ops[i], peers ? &peers[i] : NULL) != TIDE_CMA_NONE;
    if (n_direct > 0) {
        /* Fixed before anything is posted: MPI reads and writes descriptors in place. */
        b->xs = tide_calloc(n_direct, sizeof *b->xs);
        if (b->xs == NULL) {
            tide_free(b);
            return tide_errorf(TIDE_ERR_NOMEM, "out of memory for %zu single-copy messages",
                               n_direct);
        }
    }
    /* Sends first. Large messages over shared memory are pulled by the receiver
       (single copy, CMA), and an MPI_Irecv that matches a message already announced
       does that whole copy inside the call: posted first, a receive would hold back
       this rank's own sends, and with them every peer waiting to pull from it (a
       chain 0 -> 1 -> 2 then runs one hop at a time). Posting order does not affect
       matching, which is by (source, tag) in posting order per peer on each side;
       sends to ourselves wait as unexpected messages until their receive is posted. */
    for (int pass = 0; pass < 2; pass++)
        for (size_t i = 0; i < n; i++) {
            int send = ops[i].kind == TIDE_P2P_SEND;
            if (send == pass)
                continue;
            const tide_p2p_peer *peer = peers ? &peers[i] : NULL;
            tide_cma_mode mode = tide__cma_mode(&m->cma, &ops[i], peer);
            if (mode != TIDE_CMA_NONE) {
                /* counted before posting, so that an abandon covers a half-posted one */
                tide__cma_xfer *x = &b->xs[b->n_xs++];
                b->xs_left++;
                TIDE_CHECK_GOTO(tide__cma_post(&m->cma, comm, TAG_P2P, x, &ops[i], peer, mode), rc,
                                fail);
            } else if (ops[i].run != 0 && ops[i].bytes > 0)
                TIDE_CHECK_GOTO(post_strided(b, comm, send, &ops[i]), rc, fail);
            else
                TIDE_CHECK_GOTO(
                    batch_post(b, comm, send, ops[i].buf, ops[i].bytes, ops[i].peer, TAG_P2P), rc,
                    fail);
        }
    *out = b;
    return TIDE_OK;
fail:
    batch_abandon(c, b);
    batch_release(b);
    tide_free(b);
    return rc;
}

static tide_status mpi_req_test(tide_coll_comm_t *c, tide_coll_req_t *req, int *done)
{
    if (tide__comm_is_aborted(c)) {
        batch_abandon(c, req);
        return tide_errorf(TIDE_ERR_ABORTED, "communicator aborted (rank %d of %d)", c->rank,
                           c->size);
    }
    int progress = 0;
    TIDE_CHECK(batch_poll(c, req, &progress));
    *done = batch_done(req);
    return TIDE_OK;
}

static tide_status mpi_req_wait(tide_coll_comm_t *c, tide_coll_req_t *req)
{
    return batch_wait(c, req);
}

static void mpi_req_free(tide_coll_comm_t *c, tide_coll_req_t *req)
{
    if (!batch_done(req))
        batch_abandon(c, req);
    batch_release(req);
    tide_free(req);
}

/* ---- collectives ---------------------------------------------------------------------- */

/* Block b of n over count elements: the first count % n blocks one element longer. */
static size_t block_off(size_t count, int n, int b)
{
    size_t base = count / (size_t)n, rem = count % (size_t)n;
    return (size_t)b * base + ((size_t)b < rem ? (size_t)b : rem);
}

static size_t block_len(size_t count, int n, int b)
{
    return count / (size_t)n + ((size_t)b < count % (size_t)n ? 1 : 0);
}

static tide_status mpi_allreduce(tide_coll_comm_t *c, const void *send, void *recv, size_t count,
                                 tide_dtype dtype, tide_red_op op, tide_coll_stream_t stream)
{
    (void)stream;
    size_t esz = tide__red_dtype_size(dtype);
    int n = c->size, r = c->rank;
    char *out = recv;
    if (send != recv)
        memcpy(recv, send, count * esz);
    if (n == 1)
        return TIDE_OK;
    int right = (r + 1) % n, left = (r - 1 + n) % n;
    void *tmp = NULL;
    TIDE_CHECK(tmp_reserve(c, (count / (size_t)n + 1) * esz, &tmp));
    /* Ring reduce-scatter: after n-1 steps rank r holds the full reduction of block r. */
    for (int s = 0; s < n - 1; s++) {
        int sb = (r - s - 1 + 2 * n) % n, rb = (r - s - 2 + 2 * n) % n;
        size_t rlen = block_len(count, n, rb);
        TIDE_CHECK(sendrecv(c, out + block_off(count, n, sb) * esz, block_len(count, n, sb) * esz,
                            right, tmp, rlen * esz, left, TAG_ALLREDUCE));
        tide__reduce_host(out + block_off(count, n, rb) * esz, tmp, rlen, dtype, op);
    }
    /* Ring allgather of the reduced blocks: every rank ends with the same bits. */
    for (int s = 0; s < n - 1; s++) {
        int sb = (r - s + n) % n, rb = (r - s - 1 + n) % n;
        TIDE_CHECK(sendrecv(c, out + block_off(count, n, sb) * esz, block_len(count, n, sb) * esz,
                            right, out + block_off(count, n, rb) * esz,
                            block_len(count, n, rb) * esz, left, TAG_ALLREDUCE));
    }
    return TIDE_OK;
}

static tide_status mpi_reduce_scatter(tide_coll_comm_t *c, const void *send, void *recv,
                                      size_t count, tide_dtype dtype, tide_red_op op,
                                      tide_coll_stream_t stream)
{
    (void)stream;
    size_t esz = tide__red_dtype_size(dtype), blk = count * esz;
    int n = c->size, r = c->rank;
    const char *in = send;
    if (n == 1) {
        if (send != recv)
            memmove(recv, send, blk);
        return TIDE_OK;
    }
    int right = (r + 1) % n, left = (r - 1 + n) % n;
    char *tmp = NULL;
    TIDE_CHECK(tmp_reserve(c, 2 * blk, (void **)&tmp));
    char *acc = tmp, *inc = tmp + blk;
    /* Step s sends the running sum of block r-s-1 and receives that of block r-s-2; the
       last block received is r's own, finished here and written to recv. */
    const char *sendp = in + (size_t)((r - 1 + n) % n) * blk;
    for (int s = 0; s < n - 1; s++) {
        int rb = (r - s - 2 + 2 * n) % n;
        TIDE_CHECK(sendrecv(c, sendp, blk, right, inc, blk, left, TAG_RSCATTER));
        char *dst = s == n - 2 ? (char *)recv : acc;
        memcpy(dst, in + (size_t)rb * blk, blk);
        tide__reduce_host(dst, inc, count, dtype, op);
        sendp = acc;
    }
    return TIDE_OK;
}

static tide_status mpi_allgather(tide_coll_comm_t *c, const void *send, void *recv, size_t bytes,
                                 tide_coll_stream_t stream)
{
    (void)stream;
    int n = c->size, r = c->rank;
    char *out = recv;
    if (send != out + (size_t)r * bytes)
        memmove(out + (size_t)r * bytes, send, bytes);
    int right = (r + 1) % n, left = (r - 1 + n) % n;
    for (int s = 0; s < n - 1; s++) {
        int sb = (r - s + n) % n, rb = (r - s - 1 + n) % n;
        TIDE_CHECK(sendrecv(c, out + (size_t)sb * bytes, bytes, right, out + (size_t)rb * bytes,
                            bytes, left, TAG_ALLGATHER));
    }
    return TIDE_OK;
}

static tide_status mpi_broadcast(tide_coll_comm_t *c, void *buf, size_t bytes, int root,
                                 tide_coll_stream_t stream)
{
    (void)stream;
    int n = c->size, vr = (c->rank - root + n) % n;
    /* Binomial tree over ranks relative to root. */
    int mask = 1;
    while (mask < n) {
        if (vr & mask) {
            TIDE_CHECK(sendrecv(c, NULL, 0, -1, buf, bytes, (vr - mask + root) % n, TAG_BCAST));
            break;
        }
        mask <<= 1;
    }
    struct tide_coll_req b;
    batch_init(&b);
    tide_status rc = TIDE_OK;
    for (mask >>= 1; mask > 0; mask >>= 1)
        if (vr + mask < n)
            TIDE_CHECK_GOTO(
                batch_post(&b, impl(c)->comm, 1, buf, bytes, (vr + mask + root) % n, TAG_BCAST), rc,
                out);
    TIDE_CHECK_GOTO(batch_wait(c, &b), rc, out);
out:
    if (rc != TIDE_OK)
        batch_abandon(c, &b);
    batch_release(&b);
    return rc;
}

static tide_status mpi_barrier(tide_coll_comm_t *c, tide_coll_stream_t stream)
{
    (void)stream;
    int n = c->size, r = c->rank;
    /* Dissemination: after round k every rank has heard, indirectly, from 2^k others. */
    for (int k = 1; k < n; k <<= 1)
        TIDE_CHECK(sendrecv(c, NULL, 0, (r + k) % n, NULL, 0, (r - k + n) % n, TAG_BARRIER));
    return TIDE_OK;
}

/* ---- memory ----------------------------------------------------------------------------- */

static tide_status host_alloc(size_t bytes, void **out)
{
    *out = tide_malloc(bytes ? bytes : 1);
    if (*out == NULL)
        return tide_errorf(TIDE_ERR_NOMEM, "out of memory allocating %zu bytes of host staging",
                           bytes);
    return TIDE_OK;
}

static void host_free(void *p)
{
    tide_free(p);
}

static tide_status host_copy2d(void *dst, size_t dpitch, const void *src, size_t spitch,
                               size_t width, size_t height, tide_coll_stream_t stream)
{
    (void)stream;
    if (width == 0 || height == 0)
        return TIDE_OK;
    if (dpitch == width && spitch == width) {
        memcpy(dst, src, width * height);
        return TIDE_OK;
    }
    char *d = dst;
    const char *s = src;
    for (size_t i = 0; i < height; i++)
        memcpy(d + i * dpitch, s + i * spitch, width);
    return TIDE_OK;
}

static tide_status host_copy(void *dst, const void *src, size_t bytes, int to_host,
                             tide_coll_stream_t stream)
{
    (void)to_host;
    (void)stream;
    if (bytes)
        memmove(dst, src, bytes);
    return TIDE_OK;
}

static tide_status host_sync(tide_coll_comm_t *c, tide_coll_stream_t stream)
{
    (void)stream; /* host copies are done when they return: nothing to wait for */
    if (c != NULL && tide__comm_is_aborted(c))
        return tide_errorf(TIDE_ERR_ABORTED, "communicator aborted (rank %d of %d)", c->rank,
                           c->size);
    return TIDE_OK;
}

static int mpi_p2p_direct(const tide_coll_comm_t *c, int peer)
{
    const mpi_comm *m = c->impl;
    return peer >= 0 && peer < c->size && m->cma.direct != NULL && m->cma.direct[peer];
}

static uint64_t mpi_direct_bytes(const tide_coll_comm_t *c)
{
    const mpi_comm *m = c->impl;
    return m->cma.direct_bytes;
}

/* cuPointerGetAttribute, looked up only in a process that has loaded the CUDA driver
   already: a process without it has no device memory to hand us, and one without a GPU
   must not start to load it here. The values are the driver's ABI (cuda.h):
   CU_POINTER_ATTRIBUTE_MEMORY_TYPE 2, CU_POINTER_ATTRIBUTE_IS_MANAGED 8,
   CU_MEMORYTYPE_DEVICE 2. */
typedef int (*cu_ptr_attr_fn)(void *data, int attribute, unsigned long long ptr);

/* The driver's function once found (kept: the driver is never unloaded). Every buffer of
   every switch is checked, so the lookup must be cheap: dlopen(RTLD_NOLOAD) of a library
   that is not loaded searches the library path on disk (~1 ms each here, 0.4 s for a
   switch of 200 tensors); the loaded objects' names are walked in memory instead, and
   the driver is looked for again only while it is absent (a program may load it later). */
static _Atomic uintptr_t cu_get;

static int is_cuda_driver(struct dl_phdr_info *info, size_t size, void *found)
{
    (void)size;
    const char *base = strrchr(info->dlpi_name, '/');
    base = base != NULL ? base + 1 : info->dlpi_name;
    if (strncmp(base, "libcuda.so", 10) == 0)
        *(int *)found = 1;
    return *(int *)found;
}

static cu_ptr_attr_fn cuda_pointer_attr(void)
{
    uintptr_t f = atomic_load(&cu_get);
    if (f != 0)
        return (cu_ptr_attr_fn)f;
    int found = 0;
    dl_iterate_phdr(is_cuda_driver, &found);
    if (!found)
        return NULL;
    void *h = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
    if (h == NULL)
        return NULL;
    f = (uintptr_t)dlsym(h, "cuPointerGetAttribute");
    if (f == 0) {
        dlclose(h);
        return NULL;
    }
    atomic_store(&cu_get, f); /* h stays open: the function must stay mapped */
    return (cu_ptr_attr_fn)f;
}

static tide_status host_check(const void *ptr, size_t bytes, const char *what)
{
    cu_ptr_attr_fn get = cuda_pointer_attr();
    if (get == NULL)
        return TIDE_OK;
    unsigned int type = 0, managed = 0;
    int device = get(&type, 2, (unsigned long long)(uintptr_t)ptr) == 0 && type == 2 &&
                 !(get(&managed, 8, (unsigned long long)(uintptr_t)ptr) == 0 && managed);
    if (device)
        return tide_errorf(TIDE_ERR_INVALID,
                           "%s (%zu bytes at %p) is GPU memory, but the mpi backend moves host "
                           "memory: use the nccl backend (TIDE_BACKEND=nccl) or host buffers",
                           what, bytes, ptr);
    return TIDE_OK;
}

const tide_coll_backend_v1 tide__coll_mpi_backend = {
    .version = TIDE_COLL_BACKEND_VERSION,
    .name = "mpi",
    .mem_kind = TIDE_MEM_HOST,
    .caps = TIDE_COLL_CAP_BF16 | TIDE_COLL_CAP_STRIDED,
    .comm_create = mpi_create,
    .comm_split = mpi_split,
    .comm_destroy = mpi_destroy,
    .comm_abort = mpi_abort,
    .p2p_start = mpi_p2p_start,
    .req_test = mpi_req_test,
    .req_wait = mpi_req_wait,
    .req_free = mpi_req_free,
    .allreduce = mpi_allreduce,
    .broadcast = mpi_broadcast,
    .allgather = mpi_allgather,
    .reduce_scatter = mpi_reduce_scatter,
    .barrier = mpi_barrier,
    .mem_alloc = host_alloc,
    .mem_free = host_free,
    .copy2d = host_copy2d,
    .copy_host = host_copy,
    .stream_sync = host_sync,
    .p2p_direct = mpi_p2p_direct,
    .direct_bytes = mpi_direct_bytes,
    .mem_check = host_check,
};
