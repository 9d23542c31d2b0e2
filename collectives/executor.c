/*
 * The reshard executor (see executor.h for the algorithm and its staging bound): its
 * entry points and the run. executor_streams.c derives the per-peer streams of chunks
 * from the plan, executor_inplace.c does in-place mode; executor_int.h holds the state
 * the three share.
 *
 * Here: each message's layout at both ends (in place or through staging) and the staging
 * slots; the rounds (pack, post, complete, unpack) with the local copies run in slices
 * while transfers are in flight; the call itself. Setup is local and deterministic; one
 * small allreduce then makes the ranks agree that all of them are ready before any byte
 * moves, so a bad argument or an allocation failure on one rank never leaves the others
 * waiting.
 *
 * Workload: up to ~10^5 plan items; O(chunks) posting, each round one grouped p2p batch,
 * the bytes at close to the backend's point-to-point rate.
 */
#include <stdio.h>
#include <string.h>

#include "collectives/executor_int.h"
#include "core/alloc.h"
#include "core/clock.h"

/* Local copy work done between two polls of an in-flight round (bytes). */
#define LOCAL_SLICE ((uint64_t)4 << 20)

/* Rounds in flight at most when they need no staging (messages in place): enough to
   keep every peer busy; the bound only keeps the request count sane. */
#define AHEAD_ROUNDS 64

/* ---- message layouts and staging slots ------------------------------------------------ */

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
   the new shard), those of a shrunk one are made at the end (tide__exec_ip_finish). */
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
    /* sized in tide__exec_build_streams: no allocation once data moves */
    tide_p2p_op *ops = x->ops;
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

/* After a failure once data moved: aborts the communicator through the backend, then has
   this thread, its owner, do its half of the abort at once (stream_sync on an aborted
   communicator: nccl calls ncclCommAbort there, which ends kernels still waiting on peers,
   and waits for nothing). The cleanup that follows does synchronous device work (staging
   freed with cudaFree, tide__exec_ip_undo's copies back from host on this stream): behind a
   transfer kernel whose peer gave up, it would never return. rc and its message are kept. */
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
        TIDE_CHECK(tide__exec_ip_setup(x, args));
    }
    /* the rebuilt worker's new side: again once it has buffers */
    TIDE_CHECK(tide__exec_validate(x));
    if (x->ip != NULL)
        TIDE_CHECK(tide__exec_ip_classify(x));
    x->chunk_of = tide_calloc((size_t)x->n, sizeof *x->chunk_of);
    if (x->chunk_of == NULL)
        return tide_errorf(TIDE_ERR_NOMEM, "out of memory planning the reshard execution");
    TIDE_CHECK(tide__exec_chunk_sizes(x));
    TIDE_CHECK(tide__exec_build_streams(x));
    if (x->ip != NULL) {
        /* staging the slots will take: host memory lays them out alike after spills;
           device memory may stage more (spilled sends), within the cap */
        uint64_t sneed = 0;
        TIDE_CHECK(alloc_slots(x, 1, &sneed));
        if (x->be->mem_kind != TIDE_MEM_HOST)
            sneed = x->cap;
        TIDE_CHECK(tide__exec_ip_prepare(x, sneed));
        x->ip_checked = 1;
        TIDE_CHECK(tide__exec_validate(x));
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
        TIDE_CHECK(tide__exec_ip_finish(x));
    TIDE_DEBUG(TIDE_EXEC_LOG, "rank %d: rounds %.1f finish %.1f ms", x->me,
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
        tide__exec_ip_undo(x);
    tide__exec_ip_release(x);
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
        TIDE_WARN(TIDE_EXEC_LOG, "rank %d cannot run the reshard: %s", x.me, tide_last_error());
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
        TIDE_DEBUG(TIDE_EXEC_LOG, "rank %d: setup %.1f agree %.1f ms", x.me,
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
    tide_status rc = tide__exec_ip_setup(&x, args);
    if (rc == TIDE_OK)
        rc = tide__exec_ip_classify(&x);
    if (rc == TIDE_OK) {
        x.chunk_of = tide_calloc((size_t)x.n, sizeof *x.chunk_of);
        if (x.chunk_of == NULL)
            rc = tide_errorf(TIDE_ERR_NOMEM, "out of memory planning spills");
    }
    if (rc == TIDE_OK)
        rc = tide__exec_chunk_sizes(&x);
    if (rc == TIDE_OK)
        rc = tide__exec_build_streams(&x);
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
        rc = tide__exec_ip_choose(&x, sneed, order, &n_order, &in_use, &need);
    for (size_t k = 0; rc == TIDE_OK && k < n_order; k++)
        sizes[order[k]] = x.ip->old_bytes[order[k]];
    tide_free(order);
    release(&x);
    tide__exec_ip_release(&x);
    return rc;
}
