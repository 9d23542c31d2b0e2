/*
 * The mpi backend's single-copy path (see cma_int.h for the protocol and its safety
 * rules): settings, the per-communicator agreement, the per-message state machine
 * (descriptor exchange, the copy in slices, acknowledgement) and the abandon path.
 *
 * Workload: one agreement per communicator creation (two allgathers, one probe per
 * same-host peer); per direct message three small MPI messages and process_vm_writev
 * or process_vm_readv calls of at most CMA_IOV iovecs a side (a strided region of
 * 2 KiB runs moves ~2 MiB per system call).
 */
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "collectives/cma_int.h"
#include "core/alloc.h"
#include "core/clock.h"

#ifndef IOV_MAX
#define IOV_MAX 1024
#endif
/* iovecs per side and system call: the kernel's limit, and 16 KiB of stack a side */
#define CMA_IOV (IOV_MAX < 1024 ? IOV_MAX : 1024)

#define DESC_MAGIC 0x74696465434d4132ull /* "tideCMA2" */
#define NACK_MAGIC 0x74696465434e414bull /* "tideCNAK" */
/* Bytes of a descriptor on the wire (pad travels only in the case fwd_size explains). */
#define DESC_WIRE ((int)offsetof(tide_cma_desc, pad))

/* Tags: seq % TAG_SPAN inside each range, at most 20479 (MPI guarantees 32767). A
   separate range per kind and direction, so that messages of the two directions of a
   pair (each with its own sequence) never match each other's receives. */
#define TAG_SPAN     4096
#define TAG_REV      8192  /* receiver -> sender: reverse descriptor, or a stray nack */
#define TAG_ACK_RECV 12288 /* PUSH: sender -> receiver, the copy is done (or not) */
#define TAG_ACK_SEND 16384 /* PULL: receiver -> sender, the copy is done (or not) */

/* States of a tide__cma_xfer; TIDE_CMA_X_DONE (4) ends. 0: never posted. */
enum { X_POSTED = 1, X_COPY = 2, X_ACK = 3 };

/* The word peers read to prove that they can reach this process (see probe_target). */
static volatile uint64_t probe_word;
static atomic_int refusal_logged;

/* What each member publishes at creation for the agreement. */
typedef struct cma_info {
    uint64_t probe_addr, probe_value; /* a word of its memory and the value there */
    uint64_t min_bytes;               /* its TIDE_COLL_CMA_MIN */
    int32_t pid, enabled;             /* enabled: TIDE_COLL_CMA is not 0 */
    char host[64];
} cma_info;

/* ---- settings, probe, copies ------------------------------------------------------------ */

/* This process's settings, read from the environment at each creation. */
static void settings(int *enabled, uint64_t *min_bytes)
{
    const char *on = getenv("TIDE_COLL_CMA");
    const char *min = getenv("TIDE_COLL_CMA_MIN");
    *enabled = !(on != NULL && (strcmp(on, "0") == 0 || strcmp(on, "off") == 0));
    *min_bytes = TIDE_CMA_DEFAULT_MIN;
    if (min != NULL && min[0] != '\0') {
        char *end = NULL;
        unsigned long long v = strtoull(min, &end, 10);
        if (end != NULL && *end == '\0' && v > 0)
            *min_bytes = (uint64_t)v;
        else
            TIDE_WARN(TIDE_COLL_LOG,
                      "TIDE_COLL_CMA_MIN='%s' is not a positive byte count; using %llu", min,
                      (unsigned long long)TIDE_CMA_DEFAULT_MIN);
    }
}

/* A word of this process's memory and its value, distinct per process with
   overwhelming probability and never 0: a peer reading it here reads this process. */
static void probe_target(uint64_t *addr, uint64_t *value)
{
    if (probe_word == 0) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        uint64_t v = ((uint64_t)getpid() << 32) ^ (uint64_t)ts.tv_nsec ^
                     ((uint64_t)ts.tv_sec * 0x9E3779B97F4A7C15ull) ^ (uint64_t)(uintptr_t)&ts;
        probe_word = v | 1;
    }
    *addr = (uint64_t)(uintptr_t)&probe_word;
    *value = probe_word;
}

/* Reads one 64-bit word of process pid at addr into *out; 0 on success, else errno. */
static int read_word(pid_t pid, uint64_t addr, uint64_t *out)
{
    uint64_t v = 0;
    struct iovec l = {&v, sizeof v}, r = {(void *)(uintptr_t)addr, sizeof v};
    ssize_t got;
    do
        got = process_vm_readv(pid, &l, 1, &r, 1, 0);
    while (got < 0 && errno == EINTR);
    if (got != (ssize_t)sizeof v)
        return got < 0 ? errno : EFAULT;
    *out = v;
    return 0;
}

/* 1 when this process can read the probe word (addr, value) of process pid. */
static int probe(pid_t pid, uint64_t addr, uint64_t value)
{
    uint64_t got = 0;
    int err = read_word(pid, addr, &got);
    if (err == 0 && got == value)
        return 1;
    /* EPERM: ptrace scope, a missing CAP_SYS_PTRACE or a seccomp filter (containers);
       ENOSYS: a kernel without CMA. Either way every message stays on MPI. */
    if ((err == EPERM || err == ENOSYS || err == EACCES) &&
        atomic_exchange(&refusal_logged, 1) == 0)
        TIDE_INFO(TIDE_COLL_LOG,
                  "single-copy transfers unavailable (process_vm_readv of pid %d: %s); "
                  "same-host messages go through MPI (check "
                  "/proc/sys/kernel/yama/ptrace_scope or CAP_SYS_PTRACE)",
                  (int)pid, strerror(err));
    return 0;
}

/* 1 when process pid no longer runs (gone, or a zombie): it can write nothing. */
static int pid_gone(pid_t pid)
{
    if (kill(pid, 0) != 0 && errno == ESRCH)
        return 1;
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return errno == ENOENT;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    /* "pid (comm) S ...": comm may hold spaces and parentheses, so take the last ')'. */
    const char *p = strrchr(buf, ')');
    return p != NULL && p[1] == ' ' && (p[2] == 'Z' || p[2] == 'X');
}

/* Fills iov with the pieces of bytes [pos, pos + len) of region r, at most max of
   them; returns how many bytes they cover (all of len unless max ran out). */
static uint64_t fill(const tide_cma_region *r, uint64_t pos, uint64_t len, struct iovec *iov,
                     int max, int *n)
{
    *n = 0;
    if (len == 0)
        return 0;
    if (r->run == 0) {
        iov[0].iov_base = (void *)(uintptr_t)(r->addr + pos);
        iov[0].iov_len = (size_t)len;
        *n = 1;
        return len;
    }
    uint64_t covered = 0;
    while (covered < len && *n < max) {
        uint64_t p = pos + covered, k = p / r->run, b = p % r->run;
        uint64_t h = r->run - b < len - covered ? r->run - b : len - covered;
        iov[*n].iov_base = (void *)(uintptr_t)(r->addr + k * r->stride + b);
        iov[*n].iov_len = (size_t)h;
        (*n)++;
        covered += h;
    }
    return covered;
}

/* Copies bytes [pos, pos + len) (region order) between the local region and the remote
   region of process pid: write: local -> remote (process_vm_writev), else remote ->
   local (process_vm_readv). TIDE_ERR_PEER when the kernel refuses or memory is gone. */
static tide_status copy_bytes(pid_t pid, int write, const tide_cma_region *local,
                              const tide_cma_region *remote, uint64_t pos, uint64_t len)
{
    struct iovec liov[CMA_IOV], riov[CMA_IOV];
    while (len > 0) {
        int nl = 0, nr = 0;
        uint64_t cl = fill(local, pos, len, liov, CMA_IOV, &nl);
        uint64_t cr = fill(remote, pos, cl, riov, CMA_IOV, &nr);
        if (cr < cl)
            fill(local, pos, cr, liov, CMA_IOV, &nl);
        ssize_t got =
            write ? process_vm_writev(pid, liov, (unsigned long)nl, riov, (unsigned long)nr, 0)
                  : process_vm_readv(pid, liov, (unsigned long)nl, riov, (unsigned long)nr, 0);
        if (got < 0 && errno == EINTR)
            continue;
        if (got <= 0)
            return tide_errorf(TIDE_ERR_PEER,
                               "single-copy %s of %llu bytes %s pid %d failed: %s (the peer "
                               "exited or released its buffer)",
                               write ? "write" : "read", (unsigned long long)cr,
                               write ? "into" : "from", (int)pid,
                               got < 0 ? strerror(errno) : "no bytes");
        /* A short count means a fault part-way: the next call starts there and fails. */
        pos += (uint64_t)got;
        len -= (uint64_t)got;
    }
    return TIDE_OK;
}

/* ---- agreement ----------------------------------------------------------------------------- */

tide_status tide__cma_comm_init(tide__cma_comm *cc, int rank, int size)
{
    memset(cc, 0, sizeof *cc);
    cc->rank = rank;
    cc->size = size;
    size_t n = (size_t)size, nb = (n + 7) / 8;
    cc->direct = tide_calloc(n, sizeof *cc->direct);
    cc->pid = tide_calloc(n, sizeof *cc->pid);
    cc->send_seq = tide_calloc(n, sizeof *cc->send_seq);
    cc->recv_seq = tide_calloc(n, sizeof *cc->recv_seq);
    cc->nack = tide_calloc(n, sizeof *cc->nack);
    cc->scratch = tide_calloc(n, sizeof(cma_info) + nb);
    if (!cc->direct || !cc->pid || !cc->send_seq || !cc->recv_seq || !cc->nack || !cc->scratch) {
        tide__cma_comm_fini(cc);
        return tide_errorf(TIDE_ERR_NOMEM,
                           "out of memory for the single-copy state of a "
                           "%d-member communicator",
                           size);
    }
    return TIDE_OK;
}

void tide__cma_comm_fini(tide__cma_comm *cc)
{
    tide_free(cc->direct);
    tide_free(cc->pid);
    tide_free(cc->send_seq);
    tide_free(cc->recv_seq);
    tide_free(cc->nack);
    tide_free(cc->scratch);
    memset(cc, 0, sizeof *cc);
}

static int bit(const uint8_t *row, int r)
{
    return (row[r / 8] >> (r % 8)) & 1;
}

tide_status tide__cma_agree(tide__cma_comm *cc, tide_coll_comm_t *c)
{
    int n = cc->size, me = cc->rank;
    if (n == 1)
        return TIDE_OK;
    cma_info *info = cc->scratch;
    size_t nb = ((size_t)n + 7) / 8;
    uint8_t *bits = (uint8_t *)(info + n);
    cma_info *mine = &info[me];
    memset(mine, 0, sizeof *mine);
    int enabled = 0;
    uint64_t min_bytes = 0;
    settings(&enabled, &min_bytes);
    probe_target(&mine->probe_addr, &mine->probe_value);
    mine->min_bytes = min_bytes;
    mine->pid = (int32_t)getpid();
    mine->enabled = enabled;
    if (gethostname(mine->host, sizeof mine->host - 1) != 0)
        mine->host[0] = '\0';
    TIDE_CHECK(tide_coll_allgather(c, mine, info, sizeof *mine, NULL));
    uint8_t *row = bits + (size_t)me * nb;
    memset(row, 0, nb);
    cc->min_bytes = 0;
    for (int r = 0; r < n; r++) {
        cma_info *in = &info[r];
        in->host[sizeof in->host - 1] = '\0';
        cc->pid[r] = in->pid;
        if (in->min_bytes > cc->min_bytes)
            cc->min_bytes = in->min_bytes;
        if (r != me && enabled && in->enabled && strcmp(in->host, mine->host) == 0 &&
            probe((pid_t)in->pid, in->probe_addr, in->probe_value))
            row[r / 8] |= (uint8_t)(1u << (r % 8));
    }
    TIDE_CHECK(tide_coll_allgather(c, row, bits, nb, NULL));
    int pairs = 0;
    for (int r = 0; r < n; r++) {
        cc->direct[r] = (uint8_t)(r != me && bit(row, r) && bit(bits + (size_t)r * nb, me));
        pairs += cc->direct[r];
    }
    cc->token_base = mine->probe_value ^ ((uint64_t)(uintptr_t)cc * 0x9E3779B97F4A7C15ull);
    TIDE_DEBUG(TIDE_COLL_LOG, "rank %d: single copy with %d of %d peers (messages >= %llu bytes)",
               me, pairs, n - 1, (unsigned long long)cc->min_bytes);
    return TIDE_OK;
}

/* ---- one message ----------------------------------------------------------------------------- */

static int is_strided(uint64_t bytes, uint64_t run, uint64_t stride)
{
    return run != 0 && stride != run && bytes > run;
}

/* Layouts are compared in this form: run and stride 0 for anything contiguous. */
static void normalize(uint64_t bytes, uint64_t *run, uint64_t *stride)
{
    if (!is_strided(bytes, *run, *stride))
        *run = *stride = 0;
}

tide_cma_mode tide__cma_mode(const tide__cma_comm *cc, const tide_p2p_op *op,
                             const tide_p2p_peer *peer)
{
    if (peer == NULL || !peer->known || op->bytes == 0 || cc->direct == NULL ||
        op->peer == cc->rank || !cc->direct[op->peer] || op->bytes < cc->min_bytes)
        return TIDE_CMA_NONE;
    /* The sender copies, whatever the two layouts: its local side is state it has held
       (warmed for the kernel when it was allocated, see the pool's warm_for_kernel),
       while a receive buffer is reached through the kernel's own mapping of its pages,
       which a freshly populated block already has. A receiver copying (a pull, or Open
       MPI's own single copy for two contiguous ends) would pay, on a VM that shadows
       page tables, a trap per page of the block it just prepared: 0.3 GB/s against 4-6. */
    return TIDE_CMA_PUSH;
}

static int tag_of(int base, uint64_t seq)
{
    return base + (int)(seq % TAG_SPAN);
}

static int ack_tag(const tide__cma_xfer *x)
{
    return tag_of(x->mode == TIDE_CMA_PUSH ? TAG_ACK_RECV : TAG_ACK_SEND, x->seq);
}

/* Size of the forward descriptor (bytes), chosen never to equal the message's own byte
   count, so that a receiver that expected a plain message of that many bytes sees a
   size mismatch instead of taking the descriptor for data. */
static int fwd_size(uint64_t bytes)
{
    return bytes == (uint64_t)DESC_WIRE ? (int)sizeof(tide_cma_desc) : DESC_WIRE;
}

tide_status tide__cma_post(tide__cma_comm *cc, MPI_Comm comm, int data_tag, tide__cma_xfer *x,
                           const tide_p2p_op *op, const tide_p2p_peer *peer, tide_cma_mode mode)
{
    memset(x, 0, sizeof *x);
    for (int i = 0; i < 3; i++)
        x->req[i] = MPI_REQUEST_NULL;
    x->send = op->kind == TIDE_P2P_SEND;
    x->peer = op->peer;
    x->mode = (int)mode;
    x->copier = (mode == TIDE_CMA_PUSH) == (x->send != 0);
    x->local = (tide_cma_region){(uint64_t)(uintptr_t)op->buf, op->bytes, op->run, op->stride};
    normalize(op->bytes, &x->local.run, &x->local.stride);
    x->seq = x->send ? cc->send_seq[op->peer]++ : cc->recv_seq[op->peer]++;
    uint64_t token =
        (cc->token_base ^ ((x->seq + 1) * 0xD6E8FEB86659FD93ull) ^ (uint64_t)(uintptr_t)x) | 1;
    atomic_store(&x->live, token);
    uint64_t pr = peer->run, ps = peer->stride;
    normalize(op->bytes, &pr, &ps);
    x->mine = (tide_cma_desc){.magic = DESC_MAGIC,
                              .seq = x->seq,
                              .mode = (uint64_t)mode,
                              .bytes = op->bytes,
                              .addr = x->local.addr,
                              .run = x->local.run,
                              .stride = x->local.stride,
                              .peer_run = pr,
                              .peer_stride = ps,
                              .live_addr = (uint64_t)(uintptr_t)&x->live,
                              .token = token};
    x->state = X_POSTED;
    int fwd = fwd_size(op->bytes), rev = tag_of(TAG_REV, x->seq);
    if (x->send) {
        MPI_CHECK(MPI_Isend(&x->mine, fwd, MPI_BYTE, x->peer, data_tag, comm, &x->req[0]));
        MPI_CHECK(MPI_Irecv(&x->theirs, DESC_WIRE, MPI_BYTE, x->peer, rev, comm, &x->req[1]));
    } else {
        MPI_CHECK(MPI_Irecv(&x->theirs, fwd, MPI_BYTE, x->peer, data_tag, comm, &x->req[1]));
        MPI_CHECK(MPI_Isend(&x->mine, DESC_WIRE, MPI_BYTE, x->peer, rev, comm, &x->req[0]));
    }
    if (!x->copier)
        MPI_CHECK(MPI_Irecv(x->ack_in, 2, MPI_UINT64_T, x->peer, ack_tag(x), comm, &x->req[2]));
    return TIDE_OK;
}

static int region_ok(const tide_cma_desc *d)
{
    return d->run == 0 || (d->bytes % d->run == 0 && d->stride >= d->run);
}

/* Both descriptors, checked with the same rule at both ends (so both reach the same
   verdict; a failed verdict means nobody copies). got: bytes that arrived. */
static tide_status verdict(const tide__cma_comm *cc, tide__cma_xfer *x, int got)
{
    const tide_cma_desc *t = &x->theirs, *m = &x->mine;
    int want = x->send ? DESC_WIRE : fwd_size(x->local.bytes);
    const char *what = x->send ? "sends" : "receives", *other = x->send ? "receives" : "sends";
    x->no_push = 1;
    if (got == DESC_WIRE && t->magic == NACK_MAGIC)
        return tide_errorf(TIDE_ERR_PROTOCOL,
                           "rank %d expected a plain message where rank %d %s %llu bytes by "
                           "single copy (the ranks disagree on the message's size or layout)",
                           x->peer, cc->rank, what, (unsigned long long)x->local.bytes);
    if (got != want || t->magic != DESC_MAGIC)
        return tide_errorf(TIDE_ERR_PROTOCOL,
                           "rank %d sent a plain message of %d bytes where rank %d expected the "
                           "descriptor of a %llu-byte single-copy message (the ranks disagree "
                           "on the message's size or layout)",
                           x->peer, got, cc->rank, (unsigned long long)x->local.bytes);
    if (t->seq != m->seq)
        return tide_errorf(TIDE_ERR_PROTOCOL,
                           "single-copy message %llu of rank %d met message %llu of rank %d (the "
                           "ranks disagree on their sequence of operations)",
                           (unsigned long long)t->seq, x->peer, (unsigned long long)m->seq,
                           cc->rank);
    if (t->bytes != m->bytes)
        return tide_errorf(TIDE_ERR_PROTOCOL,
                           "rank %d %s %llu bytes where rank %d %s %llu (the ranks disagree on "
                           "the message's size)",
                           x->peer, other, (unsigned long long)t->bytes, cc->rank, what,
                           (unsigned long long)m->bytes);
    if (t->mode != m->mode || t->run != m->peer_run || t->stride != m->peer_stride ||
        t->peer_run != m->run || t->peer_stride != m->stride || !region_ok(t) || !region_ok(m))
        return tide_errorf(TIDE_ERR_PROTOCOL,
                           "rank %d and rank %d disagree on the layout of a %llu-byte message: "
                           "rank %d has runs of %llu at stride %llu and expects %llu/%llu, rank "
                           "%d has %llu/%llu and expects %llu/%llu (0: contiguous)",
                           x->peer, cc->rank, (unsigned long long)m->bytes, x->peer,
                           (unsigned long long)t->run, (unsigned long long)t->stride,
                           (unsigned long long)t->peer_run, (unsigned long long)t->peer_stride,
                           cc->rank, (unsigned long long)m->run, (unsigned long long)m->stride,
                           (unsigned long long)m->peer_run, (unsigned long long)m->peer_stride);
    x->no_push = 0;
    return TIDE_OK;
}

/* The copier's part: slices of at most *budget bytes; for a push, the receiver's
   liveness word is read before every slice; for a pull, the sender's after the copy. */
static tide_status copy_some(tide__cma_comm *cc, MPI_Comm comm, tide__cma_xfer *x, uint64_t *budget,
                             int *progress)
{
    const tide_cma_desc *t = &x->theirs;
    pid_t pid = (pid_t)cc->pid[x->peer];
    tide_cma_region remote = {t->addr, t->bytes, t->run, t->stride};
    int push = x->mode == TIDE_CMA_PUSH;
    while (*budget > 0 && x->copied < x->local.bytes) {
        if (push) {
            uint64_t w = 0;
            int err = read_word(pid, t->live_addr, &w);
            if (err != 0 || w != t->token)
                return tide_errorf(TIDE_ERR_PEER,
                                   "rank %d gave up its receive (aborted or failed) while rank %d "
                                   "was writing into it by single copy; stopped after %llu of "
                                   "%llu bytes",
                                   x->peer, cc->rank, (unsigned long long)x->copied,
                                   (unsigned long long)x->local.bytes);
        }
        uint64_t left = x->local.bytes - x->copied;
        uint64_t len = left < *budget ? left : *budget;
        tide_status rc = copy_bytes(pid, push, &x->local, &remote, x->copied, len);
        if (rc != TIDE_OK)
            return tide_errorf(rc, "%s rank %d: %s", push ? "sending to" : "receiving from",
                               x->peer, tide_last_error());
        x->copied += len;
        *budget -= len;
        ++*progress;
    }
    if (x->copied < x->local.bytes)
        return TIDE_OK;
    if (!push) {
        /* The sender clears its word before its caller can touch the buffer again, so
           reading the token now means no byte came from a buffer it had given up. */
        uint64_t w = 0;
        int err = read_word(pid, t->live_addr, &w);
        if (err != 0 || w != t->token)
            return tide_errorf(TIDE_ERR_PEER,
                               "rank %d gave up its send (aborted or failed) while rank %d was "
                               "copying it; the received bytes are not valid",
                               x->peer, cc->rank);
    }
    x->ack_out[0] = x->seq;
    x->ack_out[1] = 0;
    MPI_CHECK(MPI_Isend(x->ack_out, 2, MPI_UINT64_T, x->peer, ack_tag(x), comm, &x->req[2]));
    if (!x->send)
        cc->direct_bytes += x->local.bytes;
    x->state = X_ACK;
    return TIDE_OK;
}

/* Tests one request; *flag = 1 once it completed. A truncated receive (the peer sent a
   bigger plain message) is a protocol error. */
static tide_status test_req(const tide__cma_comm *cc, const tide__cma_xfer *x, MPI_Request *r,
                            int *flag, MPI_Status *st)
{
    *flag = 0;
    if (*r == MPI_REQUEST_NULL) {
        *flag = 1;
        return TIDE_OK;
    }
    int err = MPI_Test(r, flag, st);
    if (err == MPI_SUCCESS)
        return TIDE_OK;
    int cls = 0;
    MPI_Error_class(err, &cls);
    if (cls == MPI_ERR_TRUNCATE)
        return tide_errorf(TIDE_ERR_PROTOCOL,
                           "rank %d sent a plain message bigger than the single-copy descriptor "
                           "rank %d expected for a %llu-byte message (the ranks disagree on the "
                           "message's size or layout)",
                           x->peer, cc->rank, (unsigned long long)x->local.bytes);
    return tide__mpi_error(err, "MPI_Test (single-copy message)", __FILE__, __LINE__);
}

tide_status tide__cma_step(tide__cma_comm *cc, MPI_Comm comm, tide__cma_xfer *x, uint64_t *budget,
                           int *progress)
{
    if (x->state == TIDE_CMA_X_DONE || x->state == 0)
        return TIDE_OK;
    int flag = 0;
    MPI_Status st;
    if (x->req[0] != MPI_REQUEST_NULL) {
        TIDE_CHECK(test_req(cc, x, &x->req[0], &flag, MPI_STATUS_IGNORE));
        *progress += flag;
    }
    if (x->state == X_POSTED) {
        tide_status rc = test_req(cc, x, &x->req[1], &flag, &st);
        if (rc != TIDE_OK) {
            x->no_push = 1; /* a plain message came instead: nobody pushes */
            return rc;
        }
        if (!flag)
            return TIDE_OK;
        ++*progress;
        int got = 0;
        MPI_Get_count(&st, MPI_BYTE, &got);
        TIDE_CHECK(verdict(cc, x, got));
        x->state = x->copier ? X_COPY : X_ACK;
    }
    if (x->state == X_COPY)
        TIDE_CHECK(copy_some(cc, comm, x, budget, progress));
    if (x->state != X_ACK)
        return TIDE_OK;
    if (x->req[2] != MPI_REQUEST_NULL) {
        TIDE_CHECK(test_req(cc, x, &x->req[2], &flag, MPI_STATUS_IGNORE));
        if (!flag)
            return TIDE_OK;
        ++*progress;
        if (!x->copier) {
            if (x->ack_in[0] != x->seq)
                return tide_errorf(TIDE_ERR_PROTOCOL,
                                   "rank %d acknowledged single-copy message %llu where rank %d "
                                   "expected %llu",
                                   x->peer, (unsigned long long)x->ack_in[0], cc->rank,
                                   (unsigned long long)x->seq);
            x->no_push = 1; /* the pusher has stopped, whatever it says */
            if (x->ack_in[1] != 0)
                return tide_errorf(TIDE_ERR_PEER,
                                   "rank %d could not complete a %llu-byte single-copy %s rank "
                                   "%d (see its log)",
                                   x->peer, (unsigned long long)x->local.bytes,
                                   x->send ? "receive from" : "send to", cc->rank);
            if (!x->send)
                cc->direct_bytes += x->local.bytes;
        }
    }
    if (x->req[0] == MPI_REQUEST_NULL) {
        atomic_store(&x->live, 0);
        x->state = TIDE_CMA_X_DONE;
    }
    return TIDE_OK;
}

int tide__cma_idle(const tide__cma_xfer *x)
{
    return x->state == TIDE_CMA_X_DONE || x->state == 0 || (!x->copier && x->state == X_ACK);
}

/* ---- giving up ------------------------------------------------------------------------------ */

/* 1 while an abandoned PUSH receive may still be written by its pusher. */
static int push_may_run(const tide__cma_comm *cc, tide__cma_xfer *x)
{
    if (x->send || x->mode != TIDE_CMA_PUSH || x->no_push || x->state == 0 ||
        x->state == TIDE_CMA_X_DONE)
        return 0;
    int flag = 0;
    if (x->req[2] == MPI_REQUEST_NULL ||
        (MPI_Test(&x->req[2], &flag, MPI_STATUS_IGNORE) == MPI_SUCCESS && flag)) {
        x->no_push = 1; /* its ack or nack came: it has stopped */
        return 0;
    }
    if (pid_gone((pid_t)cc->pid[x->peer])) {
        x->no_push = 1;
        return 0;
    }
    return 1;
}

int tide__cma_abandon(tide__cma_comm *cc, MPI_Comm comm, tide__cma_xfer *xs, int n, int *quarantine)
{
    int leak = 0;
    /* First of all: from here on no peer may start touching our buffers. */
    for (int i = 0; i < n; i++)
        atomic_store_explicit(&xs[i].live, 0, memory_order_seq_cst);
    atomic_thread_fence(memory_order_seq_cst);
    for (int i = 0; i < n; i++) {
        tide__cma_xfer *x = &xs[i];
        if (x->state == 0 || x->state == TIDE_CMA_X_DONE)
            continue;
        if (x->copier && x->state < X_ACK) {
            /* The peer waits for our acknowledgement: tell it we stopped (best effort;
               MPI may still read ack_out after the request is freed, hence leak). */
            x->ack_out[0] = x->seq;
            x->ack_out[1] = 1;
            MPI_Request r = MPI_REQUEST_NULL;
            if (MPI_Isend(x->ack_out, 2, MPI_UINT64_T, x->peer, ack_tag(x), comm, &r) ==
                MPI_SUCCESS)
                MPI_Request_free(&r);
            leak = 1;
        }
    }
    /*
     * A pusher that read our liveness word just before we cleared it may still be
     * writing one slice into a receive buffer, and our caller may reuse that buffer as
     * soon as we return. So wait, bounded, until every such pusher has confirmed (its
     * ack or nack: it reads the word before every slice, sees it cleared and nacks) or
     * its process is gone. A pusher that has not even started needs no wait, but we
     * cannot tell it from one in mid-slice, so it costs the bound (500 ms). Past the
     * bound the communicator is reported quarantined and the buffer's owner warned.
     */
    uint64_t deadline = tide_now_ns() + (uint64_t)TIDE_CMA_ABANDON_WAIT_MS * 1000000ull;
    for (;;) {
        int waiting = 0;
        for (int i = 0; i < n; i++)
            waiting += push_may_run(cc, &xs[i]);
        if (waiting == 0)
            break;
        if (tide_now_ns() >= deadline) {
            for (int i = 0; i < n; i++)
                if (push_may_run(cc, &xs[i]))
                    TIDE_ERROR(TIDE_COLL_LOG,
                               "rank %d gave up a %llu-byte single-copy receive from rank %d "
                               "(pid %d), which did not confirm within %d ms that it stopped "
                               "writing into it: do not reuse that buffer; communicator "
                               "quarantined",
                               cc->rank, (unsigned long long)xs[i].local.bytes, xs[i].peer,
                               (int)cc->pid[xs[i].peer], TIDE_CMA_ABANDON_WAIT_MS);
            *quarantine = 1;
            leak = 1;
            break;
        }
        tide_sleep_ms(1);
    }
    /* Cancel what is still pending, wait up to 50 ms, free the rest (MPI keeps those
       alive and may still write the descriptors and acknowledgements in xs). */
    int active = 0;
    for (int i = 0; i < n; i++)
        for (int k = 0; k < 3; k++)
            if (xs[i].req[k] != MPI_REQUEST_NULL) {
                MPI_Cancel(&xs[i].req[k]);
                active++;
            }
    uint64_t cancel_deadline = tide_now_ns() + 50ull * 1000000;
    while (active > 0 && tide_now_ns() < cancel_deadline) {
        active = 0;
        for (int i = 0; i < n; i++)
            for (int k = 0; k < 3; k++) {
                if (xs[i].req[k] == MPI_REQUEST_NULL)
                    continue;
                int flag = 0;
                if (MPI_Test(&xs[i].req[k], &flag, MPI_STATUS_IGNORE) != MPI_SUCCESS || !flag)
                    active++;
            }
        if (active > 0)
            tide_sleep_ms(1);
    }
    for (int i = 0; i < n; i++) {
        for (int k = 0; k < 3; k++)
            if (xs[i].req[k] != MPI_REQUEST_NULL) {
                MPI_Request_free(&xs[i].req[k]);
                leak = 1;
            }
        if (xs[i].state != 0)
            xs[i].state = TIDE_CMA_X_DONE;
    }
    return leak;
}

/* Memory kept forever (tide__cma_bury): a lock-free list rooted in a global. */
typedef struct grave {
    struct grave *next;
    void *p;
} grave;
static _Atomic(grave *) graves;

void tide__cma_bury(void *p)
{
    if (p == NULL)
        return;
    /* plain malloc: a failure injected by a test must not turn into a free of p */
    grave *g = malloc(sizeof *g);
    if (g == NULL)
        return; /* p stays allocated all the same, only unreachable */
    g->p = p;
    g->next = atomic_load(&graves);
    while (!atomic_compare_exchange_weak(&graves, &g->next, g))
        ;
}

int tide__cma_maybe_stray(const tide__cma_comm *cc, int peer, size_t got)
{
    return cc->direct != NULL && peer != cc->rank && cc->direct[peer] &&
           (got == SIZE_MAX || got == (size_t)DESC_WIRE || got == sizeof(tide_cma_desc));
}

void tide__cma_stray(tide__cma_comm *cc, MPI_Comm comm, int peer)
{
    /* The direct sender numbered its message with the count of direct messages this
       rank has received from it (they agreed so far, or the communicator were dead),
       and waits for the reverse descriptor under that number. */
    tide_cma_desc *d = &cc->nack[peer];
    memset(d, 0, sizeof *d);
    d->magic = NACK_MAGIC;
    d->seq = cc->recv_seq[peer];
    MPI_Request r = MPI_REQUEST_NULL;
    if (MPI_Isend(d, DESC_WIRE, MPI_BYTE, peer, tag_of(TAG_REV, d->seq), comm, &r) == MPI_SUCCESS)
        MPI_Request_free(&r);
}
