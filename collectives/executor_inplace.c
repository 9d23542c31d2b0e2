/*
 * The reshard executor's in-place mode (tide_exec_in_place; executor.c calls it): which of
 * the rebuilt worker's tensors keep their buffer, shrink inside it or are rebuilt in a new
 * pool block; which old shards spill to host memory to stay under the limit (one choice for
 * the call and for tide_exec_plan_spills); the shrinks' rows once every transfer is done,
 * and the undo after a failure.
 *
 * Workload: one worker's tensors and plan items, up to 2^20 rows per shrunk tensor;
 * O(items + rows log rows) to classify, then on the host one memmove per row, on a device
 * one pitched copy per evenly strided batch of rows (O(log rows) for a tensor-parallel
 * shrink).
 */
#include <stdlib.h>
#include <string.h>

#include "collectives/executor_int.h"
#include "core/alloc.h"

/* ---- in-place mode (see tide_exec_in_place) ------------------------------------------- */

static int cmp_row(const void *a, const void *b)
{
    const ip_row *x = a, *y = b;
    return x->src < y->src ? -1 : x->src > y->src;
}

/* Rows of a tensor's shrink in place at most (more: rebuilt through a new block). */
#define IP_MAX_ROWS ((uint64_t)1 << 20)

tide_status tide__exec_ip_classify(exec *x)
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

tide_status tide__exec_ip_choose(const exec *x, uint64_t staging_need, size_t *order,
                                 size_t *n_order, uint64_t *in_use_out, uint64_t *need_out)
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

tide_status tide__exec_ip_prepare(exec *x, uint64_t staging_need)
{
    tide_exec_in_place *ip = x->ip;
    size_t nt = x->a->n_tensors;
    for (size_t i = 0; i < nt; i++)
        x->ip_old[i] = ip->bufs[i];
    size_t *order = tide_malloc((nt ? nt : 1) * sizeof *order), n_order = 0;
    if (order == NULL)
        return tide_errorf(TIDE_ERR_NOMEM, "out of memory choosing shards to spill");
    uint64_t in_use = 0, need = 0;
    tide_status rc = tide__exec_ip_choose(x, staging_need, order, &n_order, &in_use, &need);
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
        TIDE_WARN(TIDE_EXEC_LOG, "rank %d goes %llu bytes over its memory limit of %llu bytes",
                  x->me, (unsigned long long)(in_use + need - ip->limit),
                  (unsigned long long)ip->limit);
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

tide_status tide__exec_ip_finish(exec *x)
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

void tide__exec_ip_undo(exec *x)
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
            TIDE_ERROR(TIDE_EXEC_LOG, "rank %d lost tensor %zu's spilled old shard: %s", x->me, i,
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

tide_status tide__exec_ip_setup(exec *x, const tide_exec_args *args)
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

void tide__exec_ip_release(exec *x)
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
