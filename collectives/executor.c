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
    size_t *item_idx;     /* backing store for streams[].items */
    tide_p2p_op *ops;     /* one entry per message of this rank, sized before data moves */
    tide_p2p_peer *peers; /* [like ops] the other end's layout of each message */
    size_t lc_item;       /* local copies: next plan item */
    uint64_t lc_off;      /* and byte offset inside it */
    uint64_t staging;     /* bytes currently allocated */
    tide_exec_stats st;
} exec;

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
        if (rd == x->me)
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
    for (size_t i = 0; i < p->n; i++) {
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
static tide_status alloc_slots(exec *x)
{
    for (size_t k = 0; k < x->n_streams; k++)
        if (x->streams[k].n_rounds > x->n_rounds)
            x->n_rounds = x->streams[k].n_rounds;
    x->staged = tide_calloc(x->n_rounds ? x->n_rounds : 1, sizeof *x->staged);
    x->reqs = tide_calloc(x->n_rounds ? x->n_rounds : 1, sizeof *x->reqs);
    if (x->staged == NULL || x->reqs == NULL)
        return tide_errorf(TIDE_ERR_NOMEM, "out of memory planning the reshard rounds");
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
        for (int i = 0; i < slots; i++) {
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
        if (it->src != it->dst || rank_of(x, it->src) != x->me || b == 0)
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

static void release(exec *x)
{
    for (size_t k = 0; k < x->n_streams; k++) {
        for (int i = 0; i < 2; i++)
            if (x->streams[k].slot[i])
                x->be->mem_free(x->streams[k].slot[i]);
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
    memset(&x, 0, sizeof x);
    x.comm = comm;
    x.be = tide_coll_comm_backend(comm);
    x.a = args;
    x.cstream = opts->stream;
    x.me = tide_coll_comm_rank(comm);
    x.n = tide_coll_comm_size(comm);
    x.cap = opts->staging_cap ? opts->staging_cap : TIDE_EXEC_DEFAULT_STAGING_CAP;
    x.max_chunk = opts->max_chunk ? opts->max_chunk : TIDE_EXEC_DEFAULT_MAX_CHUNK;
    x.pack_below = opts->pack_below ? opts->pack_below : TIDE_EXEC_DEFAULT_PACK_BELOW;
    x.depth = 1;
    x.st.staging_cap = x.cap;

    /* Everything that can fail locally happens before the agreement. */
    tide_status local = TIDE_OK;
    if (x.max_chunk > TIDE_EXEC_MAX_CHUNK_LIMIT)
        local = tide_errorf(TIDE_ERR_RANGE, "max_chunk of %llu bytes is above the 1 GiB limit",
                            (unsigned long long)x.max_chunk);
    if (local == TIDE_OK)
        local = validate(&x);
    if (local == TIDE_OK) {
        x.chunk_of = tide_calloc((size_t)x.n, sizeof *x.chunk_of);
        if (x.chunk_of == NULL)
            local = tide_errorf(TIDE_ERR_NOMEM, "out of memory planning the reshard execution");
    }
    if (local == TIDE_OK)
        local = chunk_sizes(&x);
    if (local == TIDE_OK)
        local = build_streams(&x);
    if (local == TIDE_OK)
        local = alloc_slots(&x);
    if (local != TIDE_OK)
        TIDE_WARN(EXEC_LOG, "rank %d cannot run the reshard: %s", x.me, tide_last_error());

    char detail[512];
    snprintf(detail, sizeof detail, "%s", tide_last_error());
    int failed = -1, started = 0;
    tide_status rc = agree(&x, local, &failed);
    if (rc == TIDE_OK && local != TIDE_OK)
        rc = tide_errorf(local, "%s", detail);
    else if (rc == TIDE_OK && failed >= 0)
        rc = tide_errorf(TIDE_ERR_PEER,
                         "rank %d could not prepare its part of the reshard (see its log)", failed);
    if (rc != TIDE_OK)
        goto out;

    started = 1;
    uint64_t total = 0, done = 0;
    for (size_t i = 0; i < args->plan->n; i++) {
        const tide_xfer *it = &args->plan->items[i];
        if (it->src == it->dst && rank_of(&x, it->src) == x.me)
            total += item_bytes(it);
    }
    for (size_t k = 0; k < x.n_streams; k++) {
        total += x.streams[k].bytes;
        if (x.streams[k].send)
            x.st.bytes_sent += x.streams[k].bytes;
        else
            x.st.bytes_recv += x.streams[k].bytes;
    }
    x.st.chunk_bytes = x.chunk_of[x.me];

    if (opts->progress)
        opts->progress(opts->progress_ctx, done, total);
    uint64_t direct0 = x.be->direct_bytes ? x.be->direct_bytes(comm) : 0;
    rc = run_rounds(&x, opts, &done, total);
    if (x.be->direct_bytes)
        x.st.bytes_direct = x.be->direct_bytes(comm) - direct0;
    if (rc != TIDE_OK)
        goto out;
    if (opts->progress)
        opts->progress(opts->progress_ctx, done, total);
    TIDE_CHECK_GOTO(x.be->stream_sync(comm, x.cstream), rc, out);
out:
    /* Once data moves, peers may be mid-transfer with this rank: a failure then leaves
       the communicator dead (before that, every rank returned together and it lives). */
    if (rc != TIDE_OK && started)
        tide__comm_kill(comm);
    release(&x);
    x.st.seconds = (double)(tide_now_ns() - t0) / 1e9;
    if (stats)
        *stats = x.st;
    return rc;
}
