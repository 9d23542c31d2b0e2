/*
 * The reshard executor (see executor.h for the algorithm and its staging bound).
 *
 * Setup is local and deterministic: from the full plan every rank derives the number
 * of peer streams of every rank, hence every rank's chunk size, hence the chunking of
 * each (sender, receiver) stream, identically at both ends. One small allreduce then
 * makes the ranks agree that all of them are ready before any byte moves, so a bad
 * argument or an allocation failure on one rank never leaves the others waiting.
 *
 * Workload: up to ~10^5 plan items; O(items log items) setup, then O(chunks) posting.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "collectives/collectives_int.h"
#include "collectives/executor.h"
#include "core/alloc.h"
#include "core/clock.h"

#define EXEC_LOG "exec"

/* Local copy work done between two polls of an in-flight round (bytes). */
#define LOCAL_SLICE ((uint64_t)4 << 20)

/* Rounds in flight at most when they need no staging (messages in place): enough to
   keep every peer busy; the bound only keeps the request count sane. */
#define AHEAD_ROUNDS 64

/* One message of a stream. Round k of a stream is its k-th chunk of at most
   chunk_size bytes; a chunk of several whole items goes as several messages (each big
   item alone, so it can be sent or received in place; runs of small items packed
   together), so a message never mixes a big item with others. */
typedef struct chunk {
    size_t pos;        /* first item (index into the stream's item list) */
    size_t n_items;    /* items touched */
    uint64_t off;      /* byte offset inside the first item */
    uint64_t len;      /* bytes */
    size_t round;      /* chunk number of the stream */
    uint64_t slot_off; /* offset inside the round's staging slot, when staged */
} chunk;

typedef struct stream {
    int peer;      /* communicator rank at the other end */
    int send;      /* 1: this rank sends, 0: receives */
    size_t *items; /* plan item indices, plan order (points into exec.item_idx) */
    size_t n_items;
    uint64_t bytes; /* total */
    uint64_t chunk_size;
    chunk *chunks; /* messages, in round order */
    size_t n_chunks;
    size_t n_rounds;
    size_t next_post, next_done; /* message cursors */
    void *slot[2];               /* staging, backend memory kind */
    uint64_t slot_bytes;
} stream;

typedef struct exec {
    tide_coll_comm_t *comm;
    const tide_coll_backend_v1 *be;
    const tide_exec_args *a;
    tide_coll_stream_t cstream;
    int me, n;
    uint64_t cap, max_chunk;
    uint64_t pack_below;    /* items smaller than this share messages (bytes) */
    int depth;              /* staged rounds in flight on this rank (1 or 2: staging slots) */
    size_t n_rounds;        /* rounds of this rank: the most of any of its streams */
    uint8_t *staged;        /* [n_rounds] 1: the round moves bytes through staging here */
    tide_coll_req_t **reqs; /* [n_rounds] the batch of each round in flight */
    uint64_t *chunk_of;     /* [n] chunk size of each rank (0: no streams) */
    stream *streams;
    size_t n_streams;
    size_t *item_idx;      /* backing store for streams[].items */
    tide_p2p_op *ops;      /* one entry per message of this rank, sized before data moves */
    tide_p2p_peer *peers;  /* [like ops] the other end's layout of each message */
    size_t lc_item;        /* local copies: next plan item */
    uint64_t lc_off;       /* and byte offset inside it */
    uint64_t staging;      /* bytes currently allocated */
    tide_mem_pool_t *pool; /* staging from here when not NULL */
    tide_exec_stats st;
    /* in-place mode (args->in_place): a copy of args whose rows for the rebuilt worker
       point at what the executor chose */
    tide_exec_in_place *ip;
    int ip_checked; /* the rebuilt worker's new buffers exist: validate checks them */
    tide_exec_args la;
    void **old_tab, **new_tab; /* [n_workers] rows (void *const * cast away) */
    void **ip_old, **ip_new;   /* [n_tensors] the worker's rows: sources, destinations */
    uint8_t *cls;              /* [n_tensors] IP_* */
    void **spill;              /* [n_tensors] host copy of a spilled old shard */
    struct ip_row *rows;       /* the shrink-in-place copies, per tensor in address order */
    size_t *row_at;            /* [n_tensors + 1] first row of each tensor */
} exec;

enum { IP_NONE = 0, IP_KEEP, IP_SHRINK, IP_REBUILD, IP_LEAVE };

/* One row of a shrink in place: run bytes from src to dst (offsets, dst <= src). */
typedef struct ip_row {
    uint64_t src, dst, run;
} ip_row;

static int rank_of(const exec *x, int32_t w)
{
    return x->a->rank_of_worker ? x->a->rank_of_worker[w] : (int)w;
}

static uint64_t item_bytes(const tide_xfer *it)
{
    return it->run * it->count;
}

/* ---- validation --------------------------------------------------------------------- */

/* Checks that the region (off, run, count, stride) fits in size bytes. */
static int region_fits(uint64_t off, uint64_t run, uint64_t count, uint64_t stride, uint64_t size)
{
    if (count == 0 || run == 0)
        return off <= size;
    if (count > 1 && (stride < run || (count - 1) > (UINT64_MAX - run - off) / stride))
        return 0;
    uint64_t end = off + (count - 1) * (count > 1 ? stride : 0) + run;
    return end >= off && end <= size;
}

static tide_status check_side(const exec *x, size_t i, const tide_xfer *it, int old_side)
{
    const tide_exec_args *a = x->a;
    int32_t w = old_side ? it->src : it->dst;
    void *const *const *bufs = old_side ? a->old_bufs : a->new_bufs;
    const uint64_t *const *sizes = old_side ? a->old_bytes : a->new_bytes;
    uint64_t off = old_side ? it->src_off : it->dst_off;
    uint64_t stride = old_side ? it->src_stride : it->dst_stride;
    const char *what = old_side ? "old" : "new";
    if (item_bytes(it) == 0)
        return TIDE_OK;
    if (bufs == NULL || bufs[w] == NULL || bufs[w][it->tensor] == NULL)
        return tide_errorf(TIDE_ERR_INVALID,
                           "plan item %zu needs worker %d's %s buffer of tensor %u, which rank "
                           "%d did not provide",
                           i, (int)w, what, it->tensor, x->me);
    if (it->count > 1 && stride < it->run)
        return tide_errorf(TIDE_ERR_INVALID,
                           "plan item %zu: %s stride %llu is shorter than its run of %llu bytes", i,
                           what, (unsigned long long)stride, (unsigned long long)it->run);
    if (sizes != NULL && sizes[w] != NULL &&
        !region_fits(off, it->run, it->count, stride, sizes[w][it->tensor]))
        return tide_errorf(TIDE_ERR_RANGE,
                           "plan item %zu reaches past the end of worker %d's %s buffer of tensor "
                           "%u (%llu bytes)",
                           i, (int)w, what, it->tensor, (unsigned long long)sizes[w][it->tensor]);
    return TIDE_OK;
}

static tide_status validate(exec *x)
{
    const tide_exec_args *a = x->a;
    const tide_plan_t *p = a->plan;
    if (p->n > 0 && p->items == NULL)
        return tide_errorf(TIDE_ERR_INVALID, "plan has %zu items but no item array", p->n);
    for (size_t i = 0; i < p->n; i++) {
        const tide_xfer *it = &p->items[i];
        if (it->tensor >= a->n_tensors)
            return tide_errorf(TIDE_ERR_INVALID, "plan item %zu names tensor %u of %zu", i,
                               it->tensor, a->n_tensors);
        if (it->src < 0 || (size_t)it->src >= a->n_workers || it->dst < 0 ||
            (size_t)it->dst >= a->n_workers)
            return tide_errorf(TIDE_ERR_INVALID,
                               "plan item %zu moves worker %d -> %d, outside [0, %zu)", i,
                               (int)it->src, (int)it->dst, a->n_workers);
        if (it->run != 0 && it->count > UINT64_MAX / it->run)
            return tide_errorf(TIDE_ERR_RANGE, "plan item %zu: %llu runs of %llu bytes overflow", i,
                               (unsigned long long)it->count, (unsigned long long)it->run);
        int rs = rank_of(x, it->src), rd = rank_of(x, it->dst);
        if (rs < 0 || rs >= x->n || rd < 0 || rd >= x->n)
            return tide_errorf(TIDE_ERR_INVALID,
                               "plan item %zu: worker %d or %d is on no rank of this %d-rank "
                               "communicator",
                               i, (int)it->src, (int)it->dst, x->n);
        if (rs == x->me)
            TIDE_CHECK(check_side(x, i, it, 1));
        if (rd == x->me && (x->ip == NULL || x->ip_checked || it->dst != x->ip->worker))
            TIDE_CHECK(check_side(x, i, it, 0));
    }
    return TIDE_OK;
}

/* ---- setup ------------------------------------------------------------------------------ */

static int cmp_pair(const void *a, const void *b)
{
    const int *x = a, *y = b;
    if (x[0] != y[0])
        return x[0] < y[0] ? -1 : 1;
    return x[1] < y[1] ? -1 : x[1] > y[1];
}

/* Chunk size of every rank from its number of streams (see executor.h). */
static tide_status chunk_sizes(exec *x)
{
    const tide_plan_t *p = x->a->plan;
    tide_status rc = TIDE_OK;
    int *pairs = tide_calloc(p->n ? p->n : 1, 2 * sizeof *pairs);
    int *nstreams = tide_calloc((size_t)x->n, sizeof *nstreams);
    TIDE_CHECK_ALLOC_GOTO(pairs, rc, out);
    TIDE_CHECK_ALLOC_GOTO(nstreams, rc, out);
    size_t m = 0;
    if (p->stream_count != NULL) {
        /* a worker's part of the plan (tide_reshard_plan_for) carries everyone's count */
        for (size_t k = 0; k < p->n_stream; k++) {
            int32_t w = p->stream_worker[k];
            int q = w >= 0 && (size_t)w < x->a->n_workers ? rank_of(x, w) : -1;
            if (q >= 0 && q < x->n)
                nstreams[q] = (int)p->stream_count[k];
            else if (p->stream_count[k] > 0)
                TIDE_FAIL_GOTO(rc, out, TIDE_ERR_INVALID,
                               "plan gives worker %d peer streams but it is on no rank of this "
                               "%d-rank communicator",
                               (int)w, x->n);
        }
    }
    for (size_t i = 0; i < p->n && p->stream_count == NULL; i++) {
        const tide_xfer *it = &p->items[i];
        if (it->src == it->dst || item_bytes(it) == 0)
            continue;
        pairs[2 * m] = rank_of(x, it->src);
        pairs[2 * m + 1] = rank_of(x, it->dst);
        m++;
    }
    qsort(pairs, m, 2 * sizeof *pairs, cmp_pair);
    for (size_t i = 0; i < m; i++) {
        if (i > 0 && pairs[2 * i] == pairs[2 * i - 2] && pairs[2 * i + 1] == pairs[2 * i - 1])
            continue;
        nstreams[pairs[2 * i]]++;
        nstreams[pairs[2 * i + 1]]++;
    }
    uint64_t small = x->max_chunk < (64u << 10) ? x->max_chunk : (64u << 10);
    for (int q = 0; q < x->n; q++) {
        uint64_t s = (uint64_t)nstreams[q];
        if (s == 0)
            continue;
        int depth = x->cap / (2 * s) >= small ? 2 : 1;
        uint64_t c = x->cap / ((uint64_t)depth * s);
        if (c > x->max_chunk)
            c = x->max_chunk;
        if (c == 0) {
            rc = tide_errorf(TIDE_ERR_INVALID,
                             "staging cap of %llu bytes is too small for the %llu peer streams "
                             "of rank %d (it needs at least one byte per stream)",
                             (unsigned long long)x->cap, (unsigned long long)s, q);
            goto out;
        }
        x->chunk_of[q] = c;
        if (q == x->me) {
            x->depth = depth;
            x->st.peers = (int)s;
        }
    }
out:
    tide_free(pairs);
    tide_free(nstreams);
    return rc;
}

static chunk *new_msg(stream *s, size_t *cap)
{
    if (s->n_chunks == *cap) {
        *cap = *cap ? *cap * 2 : 8;
        chunk *nc = tide_reallocarray(s->chunks, *cap, sizeof *nc);
        if (nc == NULL)
            return NULL;
        s->chunks = nc;
    }
    chunk *ch = &s->chunks[s->n_chunks++];
    memset(ch, 0, sizeof *ch);
    ch->round = s->n_rounds;
    return ch;
}

/* Cuts a stream into rounds and messages: a round takes whole items while they fit in
   the chunk size (as messages: big items alone, runs of small items together); a
   bigger item is cut into pieces that are whole runs, or never cross a run boundary
   when a run exceeds the chunk. Both ends compute the same cut from the same items
   and chunk size. */
static tide_status cut(exec *x, stream *s)
{
    const tide_xfer *items = x->a->plan->items;
    uint64_t C = s->chunk_size;
    size_t cap = 0, pos = 0;
    uint64_t off = 0;
    while (pos < s->n_items) {
        const tide_xfer *it = &items[s->items[pos]];
        uint64_t b = item_bytes(it);
        if (off == 0 && b <= C) {
            uint64_t in_round = 0;
            chunk *small = NULL; /* open message of small items */
            while (pos < s->n_items && in_round + item_bytes(&items[s->items[pos]]) <= C) {
                uint64_t ib = item_bytes(&items[s->items[pos]]);
                if (ib >= x->pack_below || small == NULL) {
                    chunk *m = new_msg(s, &cap);
                    if (m == NULL)
                        goto nomem;
                    m->pos = pos;
                    m->slot_off = in_round;
                    small = ib >= x->pack_below ? NULL : m;
                    m->len = ib;
                    m->n_items = 1;
                } else {
                    small->len += ib;
                    small->n_items++;
                }
                in_round += ib;
                pos++;
            }
            s->n_rounds++;
            continue;
        }
        uint64_t piece = it->run <= C ? (C / it->run) * it->run : C;
        if (it->run > C) {
            uint64_t in_run = it->run - off % it->run;
            if (piece > in_run)
                piece = in_run;
        }
        if (piece > b - off)
            piece = b - off;
        chunk *m = new_msg(s, &cap);
        if (m == NULL)
            goto nomem;
        m->pos = pos;
        m->off = off;
        m->len = piece;
        m->n_items = 1;
        s->n_rounds++;
        off += piece;
        if (off == b) {
            pos++;
            off = 0;
        }
    }
    return TIDE_OK;
nomem:
    return tide_errorf(TIDE_ERR_NOMEM, "out of memory cutting a reshard stream");
}

static tide_status build_streams(exec *x)
{
    const tide_plan_t *p = x->a->plan;
    int n = x->n;
    tide_status rc = TIDE_OK;
    /* slot_of[2 * peer + send] = stream index + 1 (0: none yet). */
    size_t *slot_of = tide_calloc((size_t)n * 2, sizeof *slot_of);
    TIDE_CHECK_ALLOC_GOTO(slot_of, rc, out);
    size_t total = 0;
    for (size_t i = 0; i < p->n; i++) {
        const tide_xfer *it = &p->items[i];
        if (it->src == it->dst)
            continue;
        int rs = rank_of(x, it->src), rd = rank_of(x, it->dst);
        for (int send = 0; send < 2; send++) {
            if ((send ? rs : rd) != x->me)
                continue;
            int peer = send ? rd : rs;
            size_t k = slot_of[2 * (size_t)peer + (size_t)send];
            if (k == 0) {
                k = ++x->n_streams;
                slot_of[2 * (size_t)peer + (size_t)send] = k;
            }
            total++;
        }
    }
    x->streams = tide_calloc(x->n_streams ? x->n_streams : 1, sizeof *x->streams);
    x->item_idx = tide_calloc(total ? total : 1, sizeof *x->item_idx);
    TIDE_CHECK_ALLOC_GOTO(x->streams, rc, out);
    TIDE_CHECK_ALLOC_GOTO(x->item_idx, rc, out);
    /* Count, then place each stream's items contiguously, in plan order. */
    for (int peer = 0; peer < n; peer++)
        for (int send = 0; send < 2; send++) {
            size_t k = slot_of[2 * (size_t)peer + (size_t)send];
            if (k) {
                x->streams[k - 1].peer = peer;
                x->streams[k - 1].send = send;
            }
        }
    for (size_t i = 0; i < p->n; i++) {
        const tide_xfer *it = &p->items[i];
        if (it->src == it->dst)
            continue;
        int rs = rank_of(x, it->src), rd = rank_of(x, it->dst);
        for (int send = 0; send < 2; send++)
            if ((send ? rs : rd) == x->me)
                x->streams[slot_of[2 * (size_t)(send ? rd : rs) + (size_t)send] - 1].n_items++;
    }
    size_t at = 0;
    for (size_t k = 0; k < x->n_streams; k++) {
        x->streams[k].items = x->item_idx + at;
        at += x->streams[k].n_items;
        x->streams[k].n_items = 0;
    }
    for (size_t i = 0; i < p->n; i++) {
        const tide_xfer *it = &p->items[i];
        if (it->src == it->dst)
            continue;
        int rs = rank_of(x, it->src), rd = rank_of(x, it->dst);
        for (int send = 0; send < 2; send++) {
            if ((send ? rs : rd) != x->me)
                continue;
            stream *s = &x->streams[slot_of[2 * (size_t)(send ? rd : rs) + (size_t)send] - 1];
            s->items[s->n_items++] = i;
            s->bytes += item_bytes(it);
        }
    }
    for (size_t k = 0; k < x->n_streams; k++) {
        stream *s = &x->streams[k];
        if (s->bytes == 0)
            continue; /* nothing to move; the peer skips it too */
        uint64_t a = x->chunk_of[x->me], b = x->chunk_of[s->peer];
        s->chunk_size = a < b ? a : b;
        TIDE_CHECK_GOTO(cut(x, s), rc, out);
    }
    size_t msgs = 0;
    for (size_t k = 0; k < x->n_streams; k++)
        msgs += x->streams[k].n_chunks;
    x->ops = tide_calloc(msgs ? msgs : 1, sizeof *x->ops);
    TIDE_CHECK_ALLOC_GOTO(x->ops, rc, out);
    x->peers = tide_calloc(msgs ? msgs : 1, sizeof *x->peers);
    TIDE_CHECK_ALLOC_GOTO(x->peers, rc, out);
out:
    tide_free(slot_of);
    return rc;
}

/* The layout of message ch at the end of item it whose region has stride st there:
   1 with *run = 0 when the message is one contiguous range of that region, 1 with
   *run, *stride set when it is whole runs of the strided region and the backend moves
   strided buffers, 0 when it goes through staging there (contiguous, in a slot). Only
   plan data and the cut decide, so each end computes both ends' layouts alike. */
static int msg_layout(const exec *x, const tide_xfer *it, const chunk *ch, uint64_t st, size_t *run,
                      size_t *stride)
{
    *run = 0;
    *stride = 0;
    if (ch->n_items != 1 || item_bytes(it) == 0)
        return 0;
    uint64_t k0 = ch->off / it->run, k1 = (ch->off + ch->len - (ch->len ? 1 : 0)) / it->run;
    if (it->count == 1 || st == it->run || k0 == k1)
        return 1;
    if ((x->be->caps & TIDE_COLL_CAP_STRIDED) && ch->off % it->run == 0 && ch->len % it->run == 0 &&
        ch->len / it->run <= INT32_MAX && it->run <= INT32_MAX) {
        *run = (size_t)it->run;
        *stride = (size_t)st;
        return 1;
    }
    return 0;
}

/* Where a message lies in this rank's buffer when it can be moved in place: one
   contiguous range (*run = 0), or whole runs of one strided item when the backend
   moves strided buffers (*run, *stride set). NULL: it goes through staging. */
static char *in_place(const exec *x, const stream *s, const chunk *ch, size_t *run, size_t *stride)
{
    *run = 0;
    *stride = 0;
    if (ch->n_items != 1)
        return NULL;
    const tide_xfer *it = &x->a->plan->items[s->items[ch->pos]];
    uint64_t st = s->send ? it->src_stride : it->dst_stride;
    if (!msg_layout(x, it, ch, st, run, stride))
        return NULL;
    /* a shard spilled to host memory cannot be sent in place by a device backend; the
       receiver does not care how the bytes were packed (device backends ignore the
       peer layout), so this end alone decides */
    if (s->send && x->spill != NULL && it->src == x->ip->worker && x->spill[it->tensor] &&
        x->be->mem_kind != TIDE_MEM_HOST) {
        *run = *stride = 0;
        return NULL;
    }
    char *base = s->send ? (char *)x->a->old_bufs[it->src][it->tensor] + it->src_off
                         : (char *)x->a->new_bufs[it->dst][it->tensor] + it->dst_off;
    uint64_t k0 = ch->off / it->run;
    return *run ? base + k0 * st : base + k0 * st + ch->off % it->run;
}

/* The other end's layout of message ch (run 0: contiguous, in place or in its staging
   slot), for tide_p2p_peer. */
static void peer_layout(const exec *x, const stream *s, const chunk *ch, size_t *run,
                        size_t *stride)
{
    *run = 0;
    *stride = 0;
    if (ch->n_items != 1)
        return;
    const tide_xfer *it = &x->a->plan->items[s->items[ch->pos]];
    msg_layout(x, it, ch, s->send ? it->dst_stride : it->src_stride, run, stride);
}

static char *direct_ptr(const exec *x, const stream *s, const chunk *ch)
{
    size_t run, stride;
    return in_place(x, s, ch, &run, &stride);
}

/* Lays out each round's staged messages (only those: in-place ones need no staging)
   back to back in the stream's slot, and allocates the slots. */
static tide_status alloc_slots(exec *x, int dry, uint64_t *total_need)
{
    for (size_t k = 0; k < x->n_streams; k++)
        if (x->streams[k].n_rounds > x->n_rounds)
            x->n_rounds = x->streams[k].n_rounds;
    if (x->staged == NULL)
        x->staged = tide_calloc(x->n_rounds ? x->n_rounds : 1, sizeof *x->staged);
    if (x->reqs == NULL)
        x->reqs = tide_calloc(x->n_rounds ? x->n_rounds : 1, sizeof *x->reqs);
    if (x->staged == NULL || x->reqs == NULL)
        return tide_errorf(TIDE_ERR_NOMEM, "out of memory planning the reshard rounds");
    memset(x->staged, 0, x->n_rounds ? x->n_rounds : 1);
    if (total_need != NULL)
        *total_need = 0;
    for (size_t k = 0; k < x->n_streams; k++) {
        stream *s = &x->streams[k];
        uint64_t need = 0, at = 0;
        size_t staged_rounds = 0, last_round = SIZE_MAX;
        for (size_t c = 0; c < s->n_chunks; c++) {
            chunk *m = &s->chunks[c];
            if (m->round != last_round)
                at = 0;
            if (m->len == 0 || direct_ptr(x, s, m) != NULL)
                continue;
            if (m->round != last_round) {
                staged_rounds++;
                last_round = m->round;
            }
            x->staged[m->round] = 1;
            m->slot_off = at;
            at += m->len;
            if (at > need)
                need = at;
        }
        if (need == 0)
            continue;
        int slots = staged_rounds >= 2 && x->depth == 2 ? 2 : 1;
        if (total_need != NULL)
            *total_need += need * (uint64_t)slots;
        if (dry)
            continue;
        for (int i = 0; i < slots; i++) {
            if (x->pool != NULL)
                TIDE_CHECK(tide_mem_pool_alloc(x->pool, (size_t)need, &s->slot[i]));
            else
                TIDE_CHECK(x->be->mem_alloc((size_t)need, &s->slot[i]));
            x->staging += need;
        }
        s->slot_bytes = need;
    }
    x->st.peak_staging = x->staging;
    return TIDE_OK;
}

/* ---- data movement -------------------------------------------------------------------- */

/* Copies bytes [off, off + len) of an item between its strided local region (base,
   stride, run) and packed memory, in whichever direction pack says. */
static tide_status copy_range(exec *x, char *base, uint64_t stride, uint64_t run, uint64_t off,
                              uint64_t len, char *packed, int pack)
{
    const tide_coll_backend_v1 *be = x->be;
#define COPY(dst, dp, src, sp, w, h)                                                               \
    TIDE_CHECK(pack ? be->copy2d((dst), (dp), (src), (sp), (w), (h), x->cstream)                   \
                    : be->copy2d((src), (sp), (dst), (dp), (w), (h), x->cstream))
    /* pack: packed <- region; unpack: region <- packed (arguments mirrored). */
    while (len > 0) {
        uint64_t k = off / run, b = off % run;
        char *reg = base + k * stride + b;
        if (b != 0 || len < run) {
            uint64_t h = run - b < len ? run - b : len;
            COPY(packed, h, reg, h, h, 1);
            packed += h;
            off += h;
            len -= h;
            continue;
        }
        uint64_t rows = len / run;
        COPY(packed, run, reg, stride < run ? run : stride, run, rows);
        packed += rows * run;
        off += rows * run;
        len -= rows * run;
    }
#undef COPY
    return TIDE_OK;
}

/* Packs (send) or unpacks (receive) a staged chunk through slot. */
static tide_status move_chunk(exec *x, const stream *s, const chunk *ch, char *slot)
{
    const tide_xfer *items = x->a->plan->items;
    uint64_t left = ch->len, off = ch->off;
    for (size_t k = ch->pos; left > 0 && k < ch->pos + ch->n_items; k++) {
        const tide_xfer *it = &items[s->items[k]];
        uint64_t b = item_bytes(it);
        uint64_t seg = b - off < left ? b - off : left;
        if (seg > 0) {
            char *base = s->send ? (char *)x->a->old_bufs[it->src][it->tensor] + it->src_off
                                 : (char *)x->a->new_bufs[it->dst][it->tensor] + it->dst_off;
            uint64_t stride = s->send ? it->src_stride : it->dst_stride;
            TIDE_CHECK(copy_range(x, base, stride, it->run, off, seg, slot, s->send));
            slot += seg;
            left -= seg;
        }
        off = 0;
    }
    return TIDE_OK;
}

/* Copies bytes [off, off + len) of a local item between its two strided regions. */
static tide_status copy_between(exec *x, char *d, uint64_t ds, const char *sr, uint64_t ss,
                                uint64_t run, uint64_t off, uint64_t len)
{
    while (len > 0) {
        uint64_t k = off / run, b = off % run;
        if (b != 0 || len < run) {
            uint64_t h = run - b < len ? run - b : len;
            TIDE_CHECK(x->be->copy2d(d + k * ds + b, h, sr + k * ss + b, h, h, 1, x->cstream));
            off += h;
            len -= h;
            continue;
        }
        uint64_t rows = len / run;
        TIDE_CHECK(x->be->copy2d(d + k * ds, ds < run ? run : ds, sr + k * ss, ss < run ? run : ss,
                                 run, rows, x->cstream));
        off += rows * run;
        len -= rows * run;
    }
    return TIDE_OK;
}

/* In-place mode: the local copies of a kept tensor are not made (its buffer already is
   the new shard), those of a shrunk one are made at the end (ip_finish). */
static int ip_skip(const exec *x, const tide_xfer *it)
{
    return x->ip != NULL && it->dst == x->ip->worker &&
           (x->cls[it->tensor] == IP_KEEP || x->cls[it->tensor] == IP_SHRINK);
}

/* Runs up to budget bytes of the plan's local copies (src == dst on this rank), from
   where the last call stopped; *done grows by what was copied. Local copies are issued
   in slices between polls of the first rounds, so they overlap the transfers instead
   of delaying them. */
static tide_status local_step(exec *x, uint64_t budget, uint64_t *done)
{
    const tide_exec_args *a = x->a;
    for (; x->lc_item < a->plan->n && budget > 0; x->lc_item++, x->lc_off = 0) {
        const tide_xfer *it = &a->plan->items[x->lc_item];
        uint64_t b = item_bytes(it);
        if (it->src != it->dst || rank_of(x, it->src) != x->me || b == 0 || ip_skip(x, it))
            continue;
        uint64_t len = b - x->lc_off < budget ? b - x->lc_off : budget;
        TIDE_CHECK(copy_between(x, (char *)a->new_bufs[it->dst][it->tensor] + it->dst_off,
                                it->dst_stride,
                                (const char *)a->old_bufs[it->src][it->tensor] + it->src_off,
                                it->src_stride, it->run, x->lc_off, len));
        x->lc_off += len;
        x->st.bytes_local += len;
        *done += len;
        budget -= len;
        if (x->lc_off < b)
            break; /* budget spent inside this item: resume here */
    }
    return TIDE_OK;
}

static int local_left(const exec *x)
{
    return x->lc_item < x->a->plan->n;
}

static char *slot_for(const stream *s, const chunk *m)
{
    return (char *)s->slot[m->round % (s->slot[1] ? 2 : 1)] + m->slot_off;
}

static tide_status post_round(exec *x, size_t k, tide_p2p_op *ops, tide_coll_req_t **req)
{
    size_t n = 0;
    for (size_t i = 0; i < x->n_streams; i++) {
        stream *s = &x->streams[i];
        for (; s->next_post < s->n_chunks && s->chunks[s->next_post].round == k; s->next_post++) {
            const chunk *m = &s->chunks[s->next_post];
            size_t run = 0, stride = 0;
            char *ptr = in_place(x, s, m, &run, &stride);
            if (ptr == NULL && m->len > 0) {
                ptr = slot_for(s, m);
                if (s->send)
                    TIDE_CHECK(move_chunk(x, s, m, ptr));
                x->st.bytes_staged += m->len;
            }
            ops[n].kind = s->send ? TIDE_P2P_SEND : TIDE_P2P_RECV;
            ops[n].peer = s->peer;
            ops[n].buf = ptr;
            ops[n].bytes = (size_t)m->len;
            ops[n].run = run;
            ops[n].stride = stride;
            /* Both ends know both layouts from the plan: the backend can choose the same
               protocol at both without asking (see tide_p2p_peer). */
            peer_layout(x, s, m, &x->peers[n].run, &x->peers[n].stride);
            x->peers[n].known = 1;
            if (s->send)
                x->st.messages++;
            n++;
        }
    }
    x->st.rounds++;
    return tide_coll_p2p_start_peers(x->comm, ops, x->peers, n, x->cstream, req);
}

static tide_status finish_round(exec *x, size_t k, tide_coll_req_t **req, uint64_t *done)
{
    TIDE_CHECK(tide_coll_req_wait(x->comm, *req));
    tide_coll_req_free(x->comm, req);
    for (size_t i = 0; i < x->n_streams; i++) {
        stream *s = &x->streams[i];
        for (; s->next_done < s->n_chunks && s->chunks[s->next_done].round == k; s->next_done++) {
            const chunk *m = &s->chunks[s->next_done];
            if (!s->send && m->len > 0 && direct_ptr(x, s, m) == NULL)
                TIDE_CHECK(move_chunk(x, s, m, slot_for(s, m)));
            *done += m->len;
        }
    }
    return TIDE_OK;
}

/* Whether round r may be posted now that rounds [0, done) are finished. A round that
   stages bytes on this rank reuses the slots of round r - depth, so it waits for it
   (with depth 1, for every earlier round); a round whose messages are all in place
   needs no memory and goes out at once, up to AHEAD_ROUNDS ahead. Rounds are posted in
   order, so every stream's messages are posted in the same order at both ends (MPI
   matches them in that order) whatever the timing of either end. */
static int can_post(const exec *x, size_t r, size_t done)
{
    if (r >= x->n_rounds || r >= done + AHEAD_ROUNDS)
        return 0;
    return !x->staged[r] || r < done + (size_t)x->depth;
}

/* Posts rounds as soon as their staging is free, completes them in order (unpacking
   staged receives), runs the local copies in slices while transfers are in flight,
   and reports progress. */
static tide_status run_rounds(exec *x, const tide_exec_opts *opts, uint64_t *done, uint64_t total)
{
    size_t rounds = x->n_rounds;
    if (rounds == 0)
        return local_step(x, UINT64_MAX, done);
    tide_status rc = TIDE_OK;
    tide_p2p_op *ops = x->ops; /* sized in build_streams: no allocation once data moves */
    size_t posted = 0;
    for (size_t k = 0; k < rounds; k++) {
        while (can_post(x, posted, k)) {
            TIDE_CHECK_GOTO(post_round(x, posted, ops, &x->reqs[posted]), rc, out);
            posted++;
        }
        /* While round k is in flight, make progress on the local copies. */
        while (local_left(x)) {
            int ready = 0;
            TIDE_CHECK_GOTO(tide_coll_req_test(x->comm, x->reqs[k], &ready), rc, out);
            if (ready)
                break;
            TIDE_CHECK_GOTO(local_step(x, LOCAL_SLICE, done), rc, out);
        }
        TIDE_CHECK_GOTO(finish_round(x, k, &x->reqs[k], done), rc, out);
        if (opts->progress)
            opts->progress(opts->progress_ctx, *done, total);
    }
    rc = local_step(x, UINT64_MAX, done);
out:
    for (size_t k = 0; k < rounds; k++)
        tide_coll_req_free(x->comm, &x->reqs[k]);
    return rc;
}

/* ---- in-place mode (see tide_exec_in_place) ------------------------------------------- */

static int cmp_row(const void *a, const void *b)
{
    const ip_row *x = a, *y = b;
    return x->src < y->src ? -1 : x->src > y->src;
}

/* Rows of a tensor's shrink in place at most (more: rebuilt through a new block). */
#define IP_MAX_ROWS ((uint64_t)1 << 20)

/* Decides what happens to each tensor of the rebuilt worker (IP_*), and lays out the
   rows of the shrinks. Only plan data and sizes decide. */
static tide_status ip_classify(exec *x)
{
    const tide_exec_in_place *ip = x->ip;
    const tide_plan_t *p = x->a->plan;
    size_t nt = x->a->n_tensors;
    int32_t w = ip->worker;
    tide_status rc = TIDE_OK;
    uint8_t *local_only = tide_malloc(nt ? nt : 1), *same = tide_malloc(nt ? nt : 1);
    uint64_t *in = tide_calloc(nt ? nt : 1, sizeof *in), *nrows = NULL;
    nrows = tide_calloc(nt ? nt : 1, sizeof *nrows);
    x->row_at = tide_calloc(nt + 1, sizeof *x->row_at);
    TIDE_CHECK_ALLOC_GOTO(local_only, rc, out);
    TIDE_CHECK_ALLOC_GOTO(same, rc, out);
    TIDE_CHECK_ALLOC_GOTO(in, rc, out);
    TIDE_CHECK_ALLOC_GOTO(nrows, rc, out);
    TIDE_CHECK_ALLOC_GOTO(x->row_at, rc, out);
    memset(local_only, 1, nt ? nt : 1);
    memset(same, 1, nt ? nt : 1);
    for (size_t k = 0; k < p->n; k++) {
        const tide_xfer *it = &p->items[k];
        if (it->dst != w || item_bytes(it) == 0)
            continue;
        in[it->tensor] += item_bytes(it);
        if (it->src != w)
            local_only[it->tensor] = 0;
        if (it->src_off != it->dst_off || (it->count > 1 && it->src_stride != it->dst_stride))
            same[it->tensor] = 0;
        nrows[it->tensor] += it->count;
    }
    uint64_t total_rows = 0;
    for (size_t i = 0; i < nt; i++) {
        uint64_t o = ip->old_bytes[i], n = ip->new_bytes[i];
        int held = o > 0 && ip->bufs[i] != NULL;
        if (n == 0)
            x->cls[i] = held ? IP_LEAVE : IP_NONE;
        else if (held && local_only[i] && in[i] == n && same[i] && o == n)
            x->cls[i] = IP_KEEP;
        else if (held && local_only[i] && in[i] == n && nrows[i] <= IP_MAX_ROWS &&
                 tide_mem_pool_capacity(ip->pool, ip->bufs[i]) >= n)
            x->cls[i] = IP_SHRINK; /* checked row by row below */
        else
            x->cls[i] = IP_REBUILD;
        if (x->cls[i] == IP_SHRINK)
            total_rows += nrows[i];
    }
    x->rows = tide_calloc(total_rows ? total_rows : 1, sizeof *x->rows);
    TIDE_CHECK_ALLOC_GOTO(x->rows, rc, out);
    uint64_t at = 0;
    for (size_t i = 0; i < nt; i++) {
        x->row_at[i] = at;
        if (x->cls[i] == IP_SHRINK)
            at += nrows[i];
        nrows[i] = x->row_at[i]; /* fill cursor */
    }
    x->row_at[nt] = at;
    for (size_t k = 0; k < p->n; k++) {
        const tide_xfer *it = &p->items[k];
        if (it->dst != w || item_bytes(it) == 0 || x->cls[it->tensor] != IP_SHRINK)
            continue;
        for (uint64_t r = 0; r < it->count; r++)
            x->rows[nrows[it->tensor]++] = (ip_row){it->src_off + r * it->src_stride,
                                                    it->dst_off + r * it->dst_stride, it->run};
    }
    for (size_t i = 0; i < nt; i++) {
        if (x->cls[i] != IP_SHRINK)
            continue;
        ip_row *r = x->rows + x->row_at[i];
        size_t m = (size_t)(x->row_at[i + 1] - x->row_at[i]);
        qsort(r, m, sizeof *r, cmp_row);
        /* In ascending source order a row written at or below its source never reaches
           a later row's source; device copies must not overlap at all. */
        for (size_t k = 0; k < m && x->cls[i] == IP_SHRINK; k++) {
            int ok = r[k].dst <= r[k].src;
            if (x->be->mem_kind != TIDE_MEM_HOST)
                ok = r[k].dst == r[k].src || r[k].dst + r[k].run <= r[k].src;
            if (!ok)
                x->cls[i] = IP_REBUILD;
        }
    }
out:
    tide_free(local_only);
    tide_free(same);
    tide_free(in);
    tide_free(nrows);
    return rc;
}

static int cmp_size_desc(const void *a, const void *b, void *ctx)
{
    const uint64_t *o = ctx;
    size_t x = *(const size_t *)a, y = *(const size_t *)b;
    return o[x] > o[y] ? -1 : o[x] < o[y];
}

/* Spills old shard i to host memory: the transfers read the copy, its block goes back
   to the pool for the new shards. */
static tide_status ip_spill_one(exec *x, size_t i)
{
    const tide_exec_in_place *ip = x->ip;
    uint64_t o = ip->old_bytes[i];
    void *h = NULL;
    TIDE_CHECK(tide_mem_pool_spill_alloc(ip->pool, (size_t)o, &h));
    tide_status rc = x->be->copy_host(h, ip->bufs[i], (size_t)o, 1, x->cstream);
    if (rc != TIDE_OK) {
        tide_mem_pool_spill_free(ip->pool, h, (size_t)o);
        return rc;
    }
    x->spill[i] = h;
    x->ip_old[i] = h;
    tide_mem_pool_free(ip->pool, ip->bufs[i]);
    x->st.bytes_spilled += o;
    return TIDE_OK;
}

/* The old shards to spill so that the new shards and the staging (staging_need bytes) fit
   under the limit: leaving shards (rebuilt or no longer held), largest first, then shards
   that would shrink in place, largest gain first (a shrinking shard gives its tail back
   only once every byte of it has been sent, so until then it holds its whole old block;
   spilled, that block serves the switch at once and the new shard is rebuilt in a block of
   its own). order gets them (n_tensors entries), *n_order how many; *in_use and *need
   what the pool will hold and take after those spills. Reads the pool, changes nothing:
   the switch and its preparation (tide_exec_plan_spills) choose alike. */
static tide_status ip_choose(const exec *x, uint64_t staging_need, size_t *order, size_t *n_order,
                             uint64_t *in_use_out, uint64_t *need_out)
{
    const tide_exec_in_place *ip = x->ip;
    size_t nt = x->a->n_tensors;
    uint64_t need = staging_need;
    for (size_t i = 0; i < nt; i++)
        if (x->cls[i] == IP_REBUILD)
            need += ip->new_bytes[i];
    tide_mem_pool_stats ps;
    tide_mem_pool_stats_get(ip->pool, &ps);
    uint64_t in_use = ps.in_use;
    *n_order = 0;
    if (ip->limit == 0 || in_use + need <= ip->limit) {
        *in_use_out = in_use;
        *need_out = need;
        return TIDE_OK;
    }
    size_t *cand = tide_malloc((nt ? nt : 1) * sizeof *cand);
    uint64_t *gain = tide_calloc(nt ? nt : 1, sizeof *gain);
    if (cand == NULL || gain == NULL) {
        tide_free(cand);
        tide_free(gain);
        return tide_errorf(TIDE_ERR_NOMEM, "out of memory choosing shards to spill");
    }
    size_t nc = 0;
    for (size_t i = 0; i < nt; i++)
        if ((x->cls[i] == IP_REBUILD || x->cls[i] == IP_LEAVE) && ip->old_bytes[i] > 0 &&
            ip->bufs[i] != NULL)
            cand[nc++] = i;
    qsort_r(cand, nc, sizeof *cand, cmp_size_desc, (void *)ip->old_bytes);
    for (size_t k = 0; k < nc && in_use + need > ip->limit; k++) {
        uint64_t cap = tide_mem_pool_capacity(ip->pool, ip->bufs[cand[k]]);
        order[(*n_order)++] = cand[k];
        in_use -= cap < in_use ? cap : in_use;
    }
    nc = 0;
    for (size_t i = 0; in_use + need > ip->limit && i < nt; i++) {
        uint64_t cap = x->cls[i] == IP_SHRINK && ip->bufs[i] != NULL
                           ? tide_mem_pool_capacity(ip->pool, ip->bufs[i])
                           : 0;
        if (cap > ip->new_bytes[i]) {
            gain[i] = cap - ip->new_bytes[i];
            cand[nc++] = i;
        }
    }
    qsort_r(cand, nc, sizeof *cand, cmp_size_desc, gain);
    for (size_t k = 0; k < nc && in_use + need > ip->limit; k++) {
        size_t i = cand[k];
        uint64_t cap = tide_mem_pool_capacity(ip->pool, ip->bufs[i]);
        order[(*n_order)++] = i;
        need += ip->new_bytes[i];
        in_use -= cap < in_use ? cap : in_use;
    }
    tide_free(gain);
    tide_free(cand);
    *in_use_out = in_use;
    *need_out = need;
    return TIDE_OK;
}

/* Makes room for the new shards and the staging (need bytes) under the limit by spilling
   what ip_choose picks (a shrinking shard spilled is rebuilt instead), then takes the new
   blocks. */
static tide_status ip_prepare(exec *x, uint64_t staging_need)
{
    tide_exec_in_place *ip = x->ip;
    size_t nt = x->a->n_tensors;
    for (size_t i = 0; i < nt; i++)
        x->ip_old[i] = ip->bufs[i];
    size_t *order = tide_malloc((nt ? nt : 1) * sizeof *order), n_order = 0;
    if (order == NULL)
        return tide_errorf(TIDE_ERR_NOMEM, "out of memory choosing shards to spill");
    uint64_t in_use = 0, need = 0;
    tide_status rc = ip_choose(x, staging_need, order, &n_order, &in_use, &need);
    for (size_t k = 0; k < n_order && rc == TIDE_OK; k++) {
        size_t i = order[k];
        rc = ip_spill_one(x, i);
        if (rc == TIDE_OK && x->cls[i] == IP_SHRINK)
            x->cls[i] = IP_REBUILD; /* its local copies now run from the spill */
    }
    tide_free(order);
    TIDE_CHECK(rc);
    if (n_order > 0 && x->be->mem_kind != TIDE_MEM_HOST)
        TIDE_CHECK(x->be->stream_sync(NULL, x->cstream));
    if (ip->limit > 0 && in_use + need > ip->limit) {
        if (ip->strict)
            return tide_errorf(TIDE_ERR_NOMEM,
                               "rank %d needs %llu bytes of new shards and staging over the %llu "
                               "it holds, past its memory limit of %llu bytes even with every "
                               "leaving or shrinking shard spilled",
                               x->me, (unsigned long long)need, (unsigned long long)in_use,
                               (unsigned long long)ip->limit);
        TIDE_WARN(EXEC_LOG, "rank %d goes %llu bytes over its memory limit of %llu bytes", x->me,
                  (unsigned long long)(in_use + need - ip->limit), (unsigned long long)ip->limit);
    }
    for (size_t i = 0; i < nt; i++) {
        uint64_t n = ip->new_bytes[i];
        switch (x->cls[i]) {
        case IP_KEEP:
            x->ip_new[i] = ip->bufs[i];
            x->st.bytes_kept += n;
            break;
        case IP_SHRINK:
            x->ip_new[i] = ip->bufs[i];
            x->st.bytes_shrunk += n;
            break;
        case IP_REBUILD:
            TIDE_CHECK(tide_mem_pool_alloc(ip->pool, (size_t)n, &x->ip_new[i]));
            x->st.bytes_rebuilt += n;
            break;
        default:
            x->ip_new[i] = NULL;
        }
    }
    return TIDE_OK;
}

/* How many rows from r[0] (n of them, ascending sources, none in place) one pitched copy
   may move: the same run at constant source and destination steps (each at least the
   run), every destination below the first source. The rows of a batch are copied in no
   particular order, so no destination of it may overlap a source of it; rows before it
   were copied already (stream order), and the sources of those after it lie above every
   destination here (each row is written at or below its own source, in ascending source
   order). A tensor-parallel shrink's rows (source step a multiple of the destination's)
   go in batches that double: O(log rows) copies instead of one per row. */
static uint64_t ip_batch(const ip_row *r, uint64_t n)
{
    if (n < 2 || r[1].run != r[0].run || r[1].src - r[0].src < r[0].run || r[1].dst <= r[0].dst ||
        r[1].dst - r[0].dst < r[0].run)
        return 1;
    uint64_t sp = r[1].src - r[0].src, dp = r[1].dst - r[0].dst, m = 0;
    while (m < n && r[m].run == r[0].run && r[m].src == r[0].src + m * sp &&
           r[m].dst == r[0].dst + m * dp && r[m].dst + r[m].run <= r[0].src)
        m++;
    return m > 0 ? m : 1;
}

/* After every transfer: the shrinks (rows in address order; on a device, evenly strided
   runs of rows in one pitched copy each), then the old blocks that left go back to the
   pool and the spills to the host; bufs become the new shards. */
static tide_status ip_finish(exec *x)
{
    tide_exec_in_place *ip = x->ip;
    size_t nt = x->a->n_tensors;
    for (size_t i = 0; i < nt; i++) {
        if (x->cls[i] != IP_SHRINK)
            continue;
        char *base = ip->bufs[i];
        for (uint64_t k = x->row_at[i]; k < x->row_at[i + 1];) {
            const ip_row *r = &x->rows[k];
            if (r->dst == r->src) {
                k++;
                continue;
            }
            if (x->be->mem_kind == TIDE_MEM_HOST) {
                memmove(base + r->dst, base + r->src, (size_t)r->run);
                k++;
                continue;
            }
            /* up to 2^20 rows: one cudaMemcpyAsync each would cost seconds */
            uint64_t m = ip_batch(r, x->row_at[i + 1] - k);
            size_t dp = m > 1 ? (size_t)(r[1].dst - r[0].dst) : (size_t)r->run;
            size_t sp = m > 1 ? (size_t)(r[1].src - r[0].src) : (size_t)r->run;
            TIDE_CHECK(x->be->copy2d(base + r->dst, dp, base + r->src, sp, (size_t)r->run,
                                     (size_t)m, x->cstream));
            k += m;
        }
        x->st.bytes_local += ip->new_bytes[i];
    }
    if (x->be->mem_kind != TIDE_MEM_HOST)
        TIDE_CHECK(x->be->stream_sync(NULL, x->cstream));
    for (size_t i = 0; i < nt; i++) {
        void *old = ip->bufs[i];
        if (x->cls[i] == IP_SHRINK)
            tide_mem_pool_shrink(ip->pool, old, (size_t)ip->new_bytes[i]);
        if (x->cls[i] == IP_REBUILD || x->cls[i] == IP_LEAVE) {
            if (x->spill[i] != NULL) {
                tide_mem_pool_spill_free(ip->pool, x->spill[i], (size_t)ip->old_bytes[i]);
                x->spill[i] = NULL;
            } else {
                tide_mem_pool_free(ip->pool, old);
            }
        }
        ip->bufs[i] = x->ip_new[i];
        x->ip_new[i] = NULL;
        if (ip->moved)
            ip->moved[i] = ip->bufs[i] != old;
    }
    return TIDE_OK;
}

/* After a failure: new blocks back to the pool, spilled shards copied back into pool
   blocks (moved), so bufs hold the old shards again. */
static void ip_undo(exec *x)
{
    tide_exec_in_place *ip = x->ip;
    size_t nt = x->a->n_tensors;
    for (size_t i = 0; i < nt; i++) {
        if (ip->moved)
            ip->moved[i] = 0;
        if (x->cls[i] == IP_REBUILD && x->ip_new != NULL && x->ip_new[i] != NULL)
            tide_mem_pool_free(ip->pool, x->ip_new[i]);
        if (x->spill == NULL || x->spill[i] == NULL)
            continue;
        void *b = NULL;
        tide_status rc = tide_mem_pool_alloc(ip->pool, (size_t)ip->old_bytes[i], &b);
        if (rc == TIDE_OK)
            rc = x->be->copy_host(b, x->spill[i], (size_t)ip->old_bytes[i], 0, x->cstream);
        if (rc != TIDE_OK) {
            TIDE_ERROR(EXEC_LOG, "rank %d lost tensor %zu's spilled old shard: %s", x->me, i,
                       tide_last_error());
            tide_mem_pool_free(ip->pool, b);
            b = NULL;
        }
        ip->bufs[i] = b;
        if (ip->moved)
            ip->moved[i] = 1;
        tide_mem_pool_spill_free(ip->pool, x->spill[i], (size_t)ip->old_bytes[i]);
        x->spill[i] = NULL;
    }
}

/* Sets up in-place mode: the local copy of args with the rebuilt worker's rows, the
   classification, the spills and the new blocks. */
static tide_status ip_setup(exec *x, const tide_exec_args *args)
{
    tide_exec_in_place *ip = args->in_place;
    size_t nw = args->n_workers, nt = args->n_tensors;
    if (ip->pool == NULL || ip->bufs == NULL || ip->old_bytes == NULL || ip->new_bytes == NULL ||
        ip->worker < 0 || (size_t)ip->worker >= nw)
        return tide_errorf(TIDE_ERR_INVALID, "reshard in place: pool, bufs, sizes and a worker "
                                             "of the plan are required");
    if (rank_of(x, ip->worker) != x->me)
        return tide_errorf(TIDE_ERR_INVALID, "reshard in place: worker %d is not on rank %d",
                           (int)ip->worker, x->me);
    for (size_t i = 0; i < nt; i++)
        if (ip->bufs[i] != NULL && !tide_mem_pool_owns(ip->pool, ip->bufs[i]))
            return tide_errorf(TIDE_ERR_INVALID,
                               "reshard in place: the old buffer of tensor %zu is no block of "
                               "the pool",
                               i);
    x->old_tab = tide_calloc(nw ? nw : 1, sizeof *x->old_tab);
    x->new_tab = tide_calloc(nw ? nw : 1, sizeof *x->new_tab);
    x->ip_old = tide_calloc(nt ? nt : 1, sizeof *x->ip_old);
    x->ip_new = tide_calloc(nt ? nt : 1, sizeof *x->ip_new);
    x->spill = tide_calloc(nt ? nt : 1, sizeof *x->spill);
    x->cls = tide_calloc(nt ? nt : 1, 1);
    if (!x->old_tab || !x->new_tab || !x->ip_old || !x->ip_new || !x->spill || !x->cls)
        return tide_errorf(TIDE_ERR_NOMEM, "out of memory setting up a reshard in place");
    for (size_t w = 0; w < nw; w++) {
        x->old_tab[w] = args->old_bufs ? (void *)args->old_bufs[w] : NULL;
        x->new_tab[w] = args->new_bufs ? (void *)args->new_bufs[w] : NULL;
    }
    for (size_t i = 0; i < nt; i++)
        x->ip_old[i] = ip->bufs[i];
    x->old_tab[ip->worker] = x->ip_old;
    x->new_tab[ip->worker] = x->ip_new;
    x->la = *args;
    x->la.old_bufs = (void *const *const *)x->old_tab;
    x->la.new_bufs = (void *const *const *)x->new_tab;
    x->a = &x->la;
    return TIDE_OK;
}

static void ip_release(exec *x)
{
    tide_free(x->old_tab);
    tide_free(x->new_tab);
    tide_free(x->ip_old);
    tide_free(x->ip_new);
    tide_free(x->spill);
    tide_free(x->cls);
    tide_free(x->rows);
    tide_free(x->row_at);
}

/* ---- entry ----------------------------------------------------------------------------- */

void tide_exec_opts_init(tide_exec_opts *opts)
{
    memset(opts, 0, sizeof *opts);
    opts->staging_cap = TIDE_EXEC_DEFAULT_STAGING_CAP;
    opts->max_chunk = TIDE_EXEC_DEFAULT_MAX_CHUNK;
    opts->pack_below = TIDE_EXEC_DEFAULT_PACK_BELOW;
}

/* Every rank learns whether all ranks are ready: 0 everywhere, or the highest failing
   rank + 1. Uses the communicator itself, in its memory kind. */
static tide_status agree(exec *x, tide_status local, int *failed_rank)
{
    int32_t v = local == TIDE_OK ? 0 : x->me + 1;
    *failed_rank = -1;
    if (x->be->mem_kind == TIDE_MEM_HOST) {
        TIDE_CHECK(tide_coll_allreduce(x->comm, &v, &v, 1, TIDE_I32, TIDE_RED_MAX, x->cstream));
    } else {
        void *dev = NULL;
        TIDE_CHECK(x->be->mem_alloc(sizeof v, &dev));
        tide_status rc = x->be->copy_host(dev, &v, sizeof v, 0, x->cstream);
        if (rc == TIDE_OK)
            rc = tide_coll_allreduce(x->comm, dev, dev, 1, TIDE_I32, TIDE_RED_MAX, x->cstream);
        if (rc == TIDE_OK)
            rc = x->be->copy_host(&v, dev, sizeof v, 1, x->cstream);
        x->be->mem_free(dev);
        TIDE_CHECK(rc);
    }
    *failed_rank = v - 1;
    return TIDE_OK;
}

/* After a failure once data moved: aborts the communicator through the backend, then has
   this thread, its owner, do its half of the abort at once (stream_sync on an aborted
   communicator: nccl calls ncclCommAbort there, which ends kernels still waiting on peers,
   and waits for nothing). The cleanup that follows does synchronous device work (staging
   freed with cudaFree, ip_undo's copies back from host on this stream): behind a transfer
   kernel whose peer gave up, it would never return. rc and its message are kept. */
static void abort_first(exec *x, tide_status rc)
{
    char detail[512];
    snprintf(detail, sizeof detail, "%s", tide_last_error());
    tide_coll_comm_abort(x->comm);
    (void)x->be->stream_sync(x->comm, x->cstream);
    tide_errorf(rc, "%s", detail);
}

static void release(exec *x)
{
    for (size_t k = 0; k < x->n_streams; k++) {
        for (int i = 0; i < 2; i++) {
            if (x->streams[k].slot[i] == NULL)
                continue;
            if (x->pool != NULL)
                tide_mem_pool_free(x->pool, x->streams[k].slot[i]);
            else
                x->be->mem_free(x->streams[k].slot[i]);
        }
        tide_free(x->streams[k].chunks);
    }
    tide_free(x->streams);
    tide_free(x->item_idx);
    tide_free(x->ops);
    tide_free(x->peers);
    tide_free(x->chunk_of);
    tide_free(x->staged);
    tide_free(x->reqs);
}

/* x's fields from the call's arguments; the pool marked, its limit before in *ps0. */
static void exec_init(exec *x, tide_coll_comm_t *comm, const tide_exec_args *args,
                      const tide_exec_opts *opts, tide_mem_pool_stats *ps0)
{
    memset(x, 0, sizeof *x);
    x->comm = comm;
    x->be = tide_coll_comm_backend(comm);
    x->a = args;
    x->cstream = opts->stream;
    x->me = tide_coll_comm_rank(comm);
    x->n = tide_coll_comm_size(comm);
    x->cap = opts->staging_cap ? opts->staging_cap : TIDE_EXEC_DEFAULT_STAGING_CAP;
    x->max_chunk = opts->max_chunk ? opts->max_chunk : TIDE_EXEC_DEFAULT_MAX_CHUNK;
    x->pack_below = opts->pack_below ? opts->pack_below : TIDE_EXEC_DEFAULT_PACK_BELOW;
    x->depth = 1;
    x->st.staging_cap = x->cap;
    x->pool = args->in_place != NULL ? args->in_place->pool : opts->pool;
    memset(ps0, 0, sizeof *ps0);
    if (x->pool != NULL) {
        tide_mem_pool_mark(x->pool);
        tide_mem_pool_stats_get(x->pool, ps0);
        x->st.pool_start = ps0->in_use;
    }
}

/* Everything that can fail locally, before the agreement: the in-place setup, the
   checks, the chunk sizes, the streams and the staging slots. */
static tide_status prepare_local(exec *x, const tide_exec_args *args)
{
    if (x->max_chunk > TIDE_EXEC_MAX_CHUNK_LIMIT)
        return tide_errorf(TIDE_ERR_RANGE, "max_chunk of %llu bytes is above the 1 GiB limit",
                           (unsigned long long)x->max_chunk);
    if (args->in_place != NULL) {
        x->ip = args->in_place;
        if (x->ip->limit > 0)
            tide_mem_pool_set_limit(x->ip->pool, x->ip->limit, x->ip->strict);
        TIDE_CHECK(ip_setup(x, args));
    }
    TIDE_CHECK(validate(x)); /* the rebuilt worker's new side: again once it has buffers */
    if (x->ip != NULL)
        TIDE_CHECK(ip_classify(x));
    x->chunk_of = tide_calloc((size_t)x->n, sizeof *x->chunk_of);
    if (x->chunk_of == NULL)
        return tide_errorf(TIDE_ERR_NOMEM, "out of memory planning the reshard execution");
    TIDE_CHECK(chunk_sizes(x));
    TIDE_CHECK(build_streams(x));
    if (x->ip != NULL) {
        /* staging the slots will take: host memory lays them out alike after spills;
           device memory may stage more (spilled sends), within the cap */
        uint64_t sneed = 0;
        TIDE_CHECK(alloc_slots(x, 1, &sneed));
        if (x->be->mem_kind != TIDE_MEM_HOST)
            sneed = x->cap;
        TIDE_CHECK(ip_prepare(x, sneed));
        x->ip_checked = 1;
        TIDE_CHECK(validate(x));
    }
    return alloc_slots(x, 0, NULL);
}

/* The bytes this rank moves: its local copies and its streams (the sent and received
   counted in x->st). */
static uint64_t bytes_to_move(exec *x)
{
    uint64_t total = 0;
    for (size_t i = 0; i < x->a->plan->n; i++) {
        const tide_xfer *it = &x->a->plan->items[i];
        if (it->src == it->dst && rank_of(x, it->src) == x->me && !ip_skip(x, it))
            total += item_bytes(it);
    }
    for (size_t k = 0; k < x->n_streams; k++) {
        total += x->streams[k].bytes;
        if (x->streams[k].send)
            x->st.bytes_sent += x->streams[k].bytes;
        else
            x->st.bytes_recv += x->streams[k].bytes;
    }
    x->st.chunk_bytes = x->chunk_of[x->me];
    return total;
}

/* The data movement, once every rank agreed: the rounds, the stream's end and the
   in-place finish; t_agree is when the agreement ended (for the debug timings). */
static tide_status move_all(exec *x, const tide_exec_opts *opts, uint64_t t_agree)
{
    uint64_t total = bytes_to_move(x), done = 0;
    if (opts->progress)
        opts->progress(opts->progress_ctx, done, total);
    uint64_t direct0 = x->be->direct_bytes ? x->be->direct_bytes(x->comm) : 0;
    tide_status rc = run_rounds(x, opts, &done, total);
    uint64_t t_rounds = tide_now_ns();
    if (x->be->direct_bytes)
        x->st.bytes_direct = x->be->direct_bytes(x->comm) - direct0;
    TIDE_CHECK(rc);
    if (opts->progress)
        opts->progress(opts->progress_ctx, done, total);
    TIDE_CHECK(x->be->stream_sync(x->comm, x->cstream));
    uint64_t t_sync = tide_now_ns();
    if (x->ip != NULL)
        TIDE_CHECK(ip_finish(x));
    TIDE_DEBUG(EXEC_LOG, "rank %d: rounds %.1f finish %.1f ms", x->me,
               (double)(t_rounds - t_agree) / 1e6, (double)(tide_now_ns() - t_sync) / 1e6);
    return TIDE_OK;
}

/* After the call, whatever its end: a communicator data moved on is aborted on failure,
   staging and in-place state released or undone, the pool's limit restored, the stats. */
static void exec_end(exec *x, tide_status rc, int started, const tide_mem_pool_stats *ps0,
                     uint64_t t0, tide_exec_stats *stats)
{
    /* Once data moves, peers may be mid-transfer with this rank: a failure then leaves
       the communicator dead (before that, every rank returned together and it lives),
       and it is aborted before anything below touches the device. */
    if (rc != TIDE_OK && started)
        abort_first(x, rc);
    release(x);
    if (x->ip != NULL && rc != TIDE_OK && x->cls != NULL)
        ip_undo(x);
    ip_release(x);
    if (x->pool != NULL) {
        tide_mem_pool_stats ps;
        tide_mem_pool_stats_get(x->pool, &ps);
        x->st.peak_extra =
            ps.peak_in_use > x->st.pool_start ? ps.peak_in_use - x->st.pool_start : 0;
        x->st.fresh_bytes = ps.fresh;
    }
    /* the limit bounds this call only: left in place, it would bound (strict: refuse)
       the blocks prepared ahead of the next switch, which may need more */
    if (x->ip != NULL && x->ip->limit > 0)
        tide_mem_pool_set_limit(x->ip->pool, ps0->limit, ps0->strict);
    x->st.seconds = (double)(tide_now_ns() - t0) / 1e9;
    if (stats)
        *stats = x->st;
}

tide_status tide_reshard_execute(tide_coll_comm_t *comm, const tide_exec_args *args,
                                 const tide_exec_opts *opts, tide_exec_stats *stats)
{
    uint64_t t0 = tide_now_ns();
    if (stats)
        memset(stats, 0, sizeof *stats);
    if (comm == NULL || args == NULL || args->plan == NULL)
        return tide_errorf(TIDE_ERR_INVALID, "reshard execute: comm, args and args->plan are "
                                             "required");
    if (tide_coll_comm_aborted(comm))
        return tide_errorf(TIDE_ERR_ABORTED, "reshard execute on an aborted communicator");
    tide_exec_opts def;
    tide_exec_opts_init(&def);
    if (opts == NULL)
        opts = &def;
    exec x;
    tide_mem_pool_stats ps0; /* the limit in effect before: the call's own is undone */
    exec_init(&x, comm, args, opts, &ps0);
    tide_status local = prepare_local(&x, args);
    if (local != TIDE_OK)
        TIDE_WARN(EXEC_LOG, "rank %d cannot run the reshard: %s", x.me, tide_last_error());
    char detail[512];
    snprintf(detail, sizeof detail, "%s", tide_last_error());
    int failed = -1, started = 0;
    uint64_t t_setup = tide_now_ns();
    tide_status rc = agree(&x, local, &failed);
    uint64_t t_agree = tide_now_ns();
    if (rc == TIDE_OK && local != TIDE_OK)
        rc = tide_errorf(local, "%s", detail);
    else if (rc == TIDE_OK && failed >= 0)
        rc = tide_errorf(TIDE_ERR_PEER,
                         "rank %d could not prepare its part of the reshard (see its log)", failed);
    if (rc == TIDE_OK) {
        TIDE_DEBUG(EXEC_LOG, "rank %d: setup %.1f agree %.1f ms", x.me,
                   (double)(t_setup - t0) / 1e6, (double)(t_agree - t_setup) / 1e6);
        started = 1;
        rc = move_all(&x, opts, t_agree);
    }
    exec_end(&x, rc, started, &ps0, t0, stats);
    return rc;
}

tide_status tide_exec_plan_spills(const tide_coll_backend_v1 *be, int n_ranks, int rank,
                                  const tide_exec_args *args, const tide_exec_opts *opts,
                                  uint64_t *sizes)
{
    if (be == NULL || args == NULL || args->plan == NULL || args->in_place == NULL ||
        sizes == NULL || n_ranks < 1 || rank < 0 || rank >= n_ranks)
        return tide_errorf(TIDE_ERR_INVALID, "planning spills: backend, plan, in-place "
                                             "arguments and a rank of the communicator needed");
    memset(sizes, 0, (args->n_tensors ? args->n_tensors : 1) * sizeof *sizes);
    tide_exec_opts def;
    tide_exec_opts_init(&def);
    if (opts == NULL)
        opts = &def;
    /* the call's own setup, from the same plan, sizes and pool: the same choice */
    exec x;
    memset(&x, 0, sizeof x);
    x.be = be;
    x.a = args;
    x.me = rank;
    x.n = n_ranks;
    x.cap = opts->staging_cap ? opts->staging_cap : TIDE_EXEC_DEFAULT_STAGING_CAP;
    x.max_chunk = opts->max_chunk ? opts->max_chunk : TIDE_EXEC_DEFAULT_MAX_CHUNK;
    x.pack_below = opts->pack_below ? opts->pack_below : TIDE_EXEC_DEFAULT_PACK_BELOW;
    x.depth = 1;
    x.ip = args->in_place;
    x.pool = x.ip->pool;
    tide_status rc = ip_setup(&x, args);
    if (rc == TIDE_OK)
        rc = ip_classify(&x);
    if (rc == TIDE_OK) {
        x.chunk_of = tide_calloc((size_t)x.n, sizeof *x.chunk_of);
        if (x.chunk_of == NULL)
            rc = tide_errorf(TIDE_ERR_NOMEM, "out of memory planning spills");
    }
    if (rc == TIDE_OK)
        rc = chunk_sizes(&x);
    if (rc == TIDE_OK)
        rc = build_streams(&x);
    uint64_t sneed = 0;
    if (rc == TIDE_OK)
        rc = alloc_slots(&x, 1, &sneed); /* dry: what the staging will take */
    if (be->mem_kind != TIDE_MEM_HOST)
        sneed = x.cap;
    size_t nt = args->n_tensors, n_order = 0;
    size_t *order = rc == TIDE_OK ? tide_malloc((nt ? nt : 1) * sizeof *order) : NULL;
    if (rc == TIDE_OK && order == NULL)
        rc = tide_errorf(TIDE_ERR_NOMEM, "out of memory planning spills");
    uint64_t in_use = 0, need = 0;
    if (rc == TIDE_OK)
        rc = ip_choose(&x, sneed, order, &n_order, &in_use, &need);
    for (size_t k = 0; rc == TIDE_OK && k < n_order; k++)
        sizes[order[k]] = x.ip->old_bytes[order[k]];
    tide_free(order);
    release(&x);
    ip_release(&x);
    return rc;
}
