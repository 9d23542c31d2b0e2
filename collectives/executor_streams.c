/*
 * The reshard executor's setup (executor.c calls it): the plan checked against the
 * buffers, then, locally and deterministically, the number of peer streams of every rank,
 * hence every rank's chunk size, hence each (sender, receiver) stream of this rank cut
 * into rounds and messages, identically at both ends.
 *
 * Workload: up to ~10^5 plan items per call; O(items log items), once, before any byte
 * moves.
 */
#include <stdlib.h>
#include <string.h>

#include "collectives/executor_int.h"
#include "core/alloc.h"

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

tide_status tide__exec_validate(exec *x)
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

tide_status tide__exec_chunk_sizes(exec *x)
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

tide_status tide__exec_build_streams(exec *x)
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
