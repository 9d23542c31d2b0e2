/*
 * worker/hostbeat: heartbeats aggregated per host. The ranks of a pool on one host share
 * a small POSIX shared-memory segment, one slot per rank: each rank's control thread
 * publishes its heartbeat there (step, generation, idle, bubble and step time, and a
 * sequence number only that thread advances); the lowest local rank whose control thread
 * runs is the leader and sends one host_heartbeat per period for the ranks whose
 * sequence advanced; a rank whose control thread stopped is left out (tided fails it
 * by timeout). The leader stamps each slot it sent with the time it sent it, which is
 * when the other ranks' leases run from; a rank not covered for 1.5 periods sends its
 * own heartbeat (the leader died or stalled).
 *
 * Memory model: slots are written with atomics (the segment is shared by processes):
 * step and generation under a seqlock (the owner is the only writer), time counters as
 * accumulators the owner adds to and the sender takes (exchange with 0), so no interval
 * is counted twice or lost when the sender changes. The segment is unlinked as soon as
 * every rank mapped it: nothing stays in /dev/shm, whoever dies.
 *
 * Workload: one publish per half period per rank, one scan of a host's slots (at most
 * TIDE_PROTO_HOST_BEATS_MAX) per period on the leader.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/clock.h"
#include "core/error.h"
#include "core/log.h"
#include "worker/tide_int.h"

#define SUBSYS "worker"
#define MAGIC  0x74696465686232ull /* "tidehb2" */

typedef struct slot {
    uint64_t seq;     /* seqlock over worker/step/gen: odd while the owner writes */
    uint64_t worker;  /* tided's worker id of the rank (+1; 0: none yet) */
    uint64_t step;    /* steps completed */
    uint64_t gen;     /* generation running */
    uint64_t active;  /* 1 while the rank's heartbeats go through the host */
    uint64_t beat_ns; /* monotonic ns of its last publish */
    /* accumulators since the last heartbeat sent for it (owner adds, sender takes) */
    uint64_t idle_ns, bubble_ns, filled_ns;
    uint64_t busy; /* steps << 48 | step ns: both taken at once */
    /* written by whoever sent a heartbeat carrying this slot */
    uint64_t sent_seq; /* the seq it carried */
    uint64_t sent_ns;  /* monotonic ns it was sent at */
    uint64_t in_step;  /* ns the owner's step in progress had run at its last publish */
    uint64_t pad[2];   /* one slot per 128 bytes: ranks do not share cache lines */
} slot;

typedef struct segment {
    uint64_t magic;
    uint64_t n;
    uint64_t pad[14];
    slot slots[];
} segment;

struct tide__hostbeat {
    segment *seg;
    size_t bytes;
    int n, me;
};

static uint64_t ld(const uint64_t *p)
{
    return __atomic_load_n(p, __ATOMIC_ACQUIRE);
}

static void st(uint64_t *p, uint64_t v)
{
    __atomic_store_n(p, v, __ATOMIC_RELEASE);
}

static uint64_t take(uint64_t *p)
{
    return __atomic_exchange_n(p, 0, __ATOMIC_ACQ_REL);
}

static void add(uint64_t *p, uint64_t v)
{
    __atomic_fetch_add(p, v, __ATOMIC_ACQ_REL);
}

tide_status tide__hostbeat_open(MPI_Comm node, int enable, tide__hostbeat_t **out)
{
    *out = NULL;
    int me = 0, n = 1;
    MPI_Comm_rank(node, &me);
    MPI_Comm_size(node, &n);
    /* every rank of the host decides the same: on only when all want it */
    int want = enable && n <= TIDE_PROTO_HOST_BEATS_MAX, all = 0;
    if (MPI_Allreduce(&want, &all, 1, MPI_INT, MPI_MIN, node) != MPI_SUCCESS)
        return tide_errorf(TIDE_ERR_BACKEND, "MPI_Allreduce failed agreeing on host heartbeats");
    if (!all) {
        if (enable && me == 0 && n > TIDE_PROTO_HOST_BEATS_MAX)
            TIDE_WARN(SUBSYS,
                      "%d ranks on this host, more than a host heartbeat carries (%d): "
                      "each rank sends its own heartbeats",
                      n, TIDE_PROTO_HOST_BEATS_MAX);
        return TIDE_OK;
    }
    size_t bytes = sizeof(segment) + (size_t)n * sizeof(slot);
    char name[96] = "";
    int ok = 1, fd = -1;
    void *map = MAP_FAILED;
    if (me == 0) {
        snprintf(name, sizeof name, "/tide-hb-%d-%llx", (int)getpid(),
                 (unsigned long long)(tide_now_ns() & 0xffffffffffull));
        fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL, 0600);
        ok = fd >= 0 && ftruncate(fd, (off_t)bytes) == 0;
        if (!ok)
            TIDE_WARN(SUBSYS,
                      "cannot make the host heartbeat segment %s: %s; each rank sends "
                      "its own heartbeats",
                      name, strerror(errno));
    }
    if (MPI_Bcast(name, sizeof name, MPI_CHAR, 0, node) != MPI_SUCCESS ||
        MPI_Bcast(&ok, 1, MPI_INT, 0, node) != MPI_SUCCESS) {
        if (fd >= 0)
            shm_unlink(name);
        return tide_errorf(TIDE_ERR_BACKEND, "MPI_Bcast failed sharing the host heartbeat segment");
    }
    if (ok && me != 0)
        fd = shm_open(name, O_RDWR, 0600);
    if (ok && fd >= 0)
        map = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (fd >= 0)
        close(fd);
    int mapped = ok && map != MAP_FAILED, every = 0;
    MPI_Allreduce(&mapped, &every, 1, MPI_INT, MPI_MIN, node);
    if (me == 0 && name[0] != '\0' && ok)
        shm_unlink(name); /* every rank has it mapped (or gave up): nothing left behind */
    if (!every) {
        if (map != MAP_FAILED)
            munmap(map, bytes);
        if (me == 0 && ok)
            TIDE_WARN(SUBSYS, "a rank of this host could not map the host heartbeat segment: "
                              "each rank sends its own heartbeats");
        return TIDE_OK;
    }
    tide__hostbeat_t *h = tide_calloc(1, sizeof *h);
    if (h == NULL) {
        munmap(map, bytes);
        return tide_errorf(TIDE_ERR_NOMEM, "out of memory for host heartbeats");
    }
    h->seg = map;
    h->bytes = bytes;
    h->n = n;
    h->me = me;
    if (me == 0) {
        h->seg->n = (uint64_t)n;
        st(&h->seg->magic, MAGIC);
    }
    MPI_Barrier(node); /* the header is written before anyone reads it */
    *out = h;
    return TIDE_OK;
}

void tide__hostbeat_close(tide__hostbeat_t **self_p)
{
    if (self_p == NULL || *self_p == NULL)
        return;
    tide__hostbeat_t *h = *self_p;
    st(&h->seg->slots[h->me].active, 0); /* the leader stops carrying this rank at once */
    munmap(h->seg, h->bytes);
    tide_free(h);
    *self_p = NULL;
}

int tide__hostbeat_ranks(const tide__hostbeat_t *h)
{
    return h->n;
}

int tide__hostbeat_me(const tide__hostbeat_t *h)
{
    return h->me;
}

void tide__hostbeat_publish(tide__hostbeat_t *h, const tide__beat *b, uint64_t now)
{
    slot *s = &h->seg->slots[h->me];
    add(&s->idle_ns, b->idle_ns);
    add(&s->bubble_ns, b->bubble_ns);
    add(&s->filled_ns, b->filled_ns);
    uint64_t steps = b->steps > 0xffff ? 0xffff : b->steps;
    uint64_t ns = b->step_ns > 0xffffffffffffull ? 0xffffffffffffull : b->step_ns;
    add(&s->busy, steps << 48 | ns);
    uint64_t seq = ld(&s->seq);
    st(&s->seq, seq + 1);
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    st(&s->worker, (uint64_t)b->worker + 1);
    st(&s->step, b->step);
    st(&s->gen, b->gen);
    st(&s->in_step, b->in_step_ns);
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    st(&s->seq, seq + 2);
    st(&s->beat_ns, now);
    st(&s->active, 1);
}

void tide__hostbeat_inactive(tide__hostbeat_t *h)
{
    st(&h->seg->slots[h->me].active, 0);
}

int tide__hostbeat_leader(const tide__hostbeat_t *h, uint64_t now, uint64_t stale_ns)
{
    for (int i = 0; i < h->n; i++) {
        slot *s = &h->seg->slots[i];
        uint64_t beat = ld(&s->beat_ns);
        if (ld(&s->active) && ld(&s->worker) != 0 && (now < beat || now - beat < stale_ns))
            return i;
    }
    return -1;
}

/* Reads slot i's heartbeat (when its seq is past the last one sent) and takes its
 * accumulators; 1 with *b and *seq filled, 0 when there is nothing new or the owner is
 * in the middle of a publish. */
static int claim(slot *s, tide_proto_heartbeat_t *b, uint64_t *seq_out, int force)
{
    for (int tries = 0; tries < 4; tries++) {
        uint64_t s1 = ld(&s->seq);
        if (s1 & 1)
            continue;
        if (!force && s1 <= ld(&s->sent_seq))
            return 0; /* nothing published since the last heartbeat sent for it */
        uint64_t worker = ld(&s->worker), step = ld(&s->step), gen = ld(&s->gen);
        uint64_t in_step = ld(&s->in_step);
        __atomic_thread_fence(__ATOMIC_SEQ_CST);
        if (ld(&s->seq) != s1 || worker == 0)
            continue;
        memset(b, 0, sizeof *b);
        b->worker = (int32_t)(worker - 1);
        b->step = step;
        b->gen = gen;
        b->idle_ms = (double)take(&s->idle_ns) / 1e6;
        b->bubble_ms = (double)take(&s->bubble_ns) / 1e6;
        b->filled_ms = (double)take(&s->filled_ns) / 1e6;
        uint64_t busy = take(&s->busy), steps = busy >> 48, ns = busy & 0xffffffffffffull;
        b->step_ms = steps ? (double)ns / 1e6 / (double)steps : 0.0;
        if (b->idle_ms > TIDE_PROTO_MS_MAX)
            b->idle_ms = TIDE_PROTO_MS_MAX;
        b->in_step_ms = (double)in_step / 1e6;
        if (b->in_step_ms > TIDE_PROTO_MS_MAX)
            b->in_step_ms = TIDE_PROTO_MS_MAX;
        *seq_out = s1;
        return 1;
    }
    return 0;
}

static int cmp_beat(const void *a, const void *b)
{
    int32_t x = ((const tide_proto_heartbeat_t *)a)->worker;
    int32_t y = ((const tide_proto_heartbeat_t *)b)->worker;
    return (x > y) - (x < y);
}

size_t tide__hostbeat_collect(tide__hostbeat_t *h, tide_proto_heartbeat_t *beats, uint64_t *seqs,
                              int *slots)
{
    size_t k = 0;
    for (int i = 0; i < h->n; i++) {
        slot *s = &h->seg->slots[i];
        if (!ld(&s->active))
            continue;
        if (claim(s, &beats[k], &seqs[k], 0)) {
            slots[k] = i;
            k++;
        }
    }
    /* the wire wants worker order: ranks and worker ids need not agree */
    for (size_t a = 1; a < k; a++)
        for (size_t b = a; b > 0 && cmp_beat(&beats[b - 1], &beats[b]) > 0; b--) {
            tide_proto_heartbeat_t tb = beats[b];
            beats[b] = beats[b - 1];
            beats[b - 1] = tb;
            uint64_t ts = seqs[b];
            seqs[b] = seqs[b - 1];
            seqs[b - 1] = ts;
            int ti = slots[b];
            slots[b] = slots[b - 1];
            slots[b - 1] = ti;
        }
    return k;
}

int tide__hostbeat_own(tide__hostbeat_t *h, tide_proto_heartbeat_t *b, uint64_t *seq)
{
    return claim(&h->seg->slots[h->me], b, seq, 1);
}

void tide__hostbeat_sent(tide__hostbeat_t *h, int i, uint64_t seq, uint64_t now)
{
    slot *s = &h->seg->slots[i];
    st(&s->sent_seq, seq);
    st(&s->sent_ns, now);
}

uint64_t tide__hostbeat_covered(const tide__hostbeat_t *h)
{
    return ld(&h->seg->slots[h->me].sent_ns);
}
