/*
 * Test support: plan checking. The validator proves a plan byte by byte against the
 * layouts (every new local byte written exactly once, from a live worker whose old
 * buffer holds that same global byte), and the simulator executes a plan on host
 * buffers. Both serve tests only (kept out of tide_reshard): the validator costs
 * O(runs log runs) and memory per run, so it is meant for test-sized plans, not for a
 * 175B model on every resize. Reads the planner's geometry (reshard/reshard_int.h).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "reshard/reshard_int.h"
#include "tests/support/plan_check.h"

void tide_plan_simulate(const tide_plan_t *plan, void *const *const *old_bufs,
                        void *const *const *new_bufs)
{
    if (plan == NULL || old_bufs == NULL || new_bufs == NULL)
        return;
    for (size_t k = 0; k < plan->n; k++) {
        const tide_xfer *x = &plan->items[k];
        if (old_bufs[x->src] == NULL || new_bufs[x->dst] == NULL)
            continue;
        const unsigned char *src = old_bufs[x->src][x->tensor];
        unsigned char *dst = new_bufs[x->dst][x->tensor];
        if (src == NULL || dst == NULL)
            continue;
        for (uint64_t r = 0; r < x->count; r++)
            memcpy(dst + x->dst_off + r * x->dst_stride, src + x->src_off + r * x->src_stride,
                   x->run);
    }
}

/* ---- validation ---------------------------------------------------------------------- */

/* Bytes [off, off + len) written to one (new coordinate, tensor) buffer. */
typedef struct span {
    uint32_t dst; /* new layout index */
    uint32_t tensor;
    uint64_t off, len;
    size_t item; /* for messages */
} span;

static int cmp_span(const void *a, const void *b)
{
    const span *x = a, *y = b;
    if (x->dst != y->dst)
        return x->dst < y->dst ? -1 : 1;
    if (x->tensor != y->tensor)
        return x->tensor < y->tensor ? -1 : 1;
    return (x->off > y->off) - (x->off < y->off);
}

typedef struct vctx {
    const tide_layout_t *o, *nl;
    const tide_collection_t *c;
    const tide_plan_t *plan;
    span *spans;
    size_t n_spans, cap_spans;
} vctx;

static tide_status add_span(vctx *v, uint32_t dst, uint32_t tensor, uint64_t off, uint64_t len,
                            size_t item)
{
    if (v->n_spans == v->cap_spans) {
        size_t cap = v->cap_spans ? v->cap_spans * 2 : 1024;
        span *s = tide_reallocarray(v->spans, cap, sizeof *s);
        if (s == NULL)
            return tide_errorf(TIDE_ERR_NOMEM, "out of memory validating a plan (%zu runs)", cap);
        v->spans = s;
        v->cap_spans = cap;
    }
    v->spans[v->n_spans++] = (span){dst, tensor, off, len, item};
    return TIDE_OK;
}

/* Bytes left in the block that local byte x of shard sh sits in. */
static uint64_t block_left(const tide__shard *sh, uint64_t es, uint64_t x)
{
    uint64_t e = sh->lo + x / es;
    return (sh->l - e % sh->l) * es - x % es;
}

/* Global byte of local byte x of shard sh. */
static uint64_t global_byte(const tide__tgeom *g, const tide__shard *sh, uint64_t x)
{
    uint64_t es = g->es;
    return tide__shard_global(g, sh, sh->lo + x / es) * es + x % es;
}

static int fits(uint64_t off, uint64_t count, uint64_t stride, uint64_t run, uint64_t size)
{
    if (run > size || off > size - run)
        return 0;
    if (count <= 1)
        return 1;
    uint64_t room = size - run - off;
    return stride <= room / (count - 1);
}

static tide_status check_item(vctx *v, size_t k, const tide__worker_index *oix,
                              const tide__worker_index *nix, const uint8_t *alive, size_t n_alive)
{
    const tide_xfer *x = &v->plan->items[k];
    const tide_collection_t *c = v->c;
    if (x->tensor >= c->n)
        return tide_errorf(TIDE_ERR_INVALID, "plan item %zu: tensor %u does not exist", k,
                           x->tensor);
    const tide_tensor_desc *t = &c->t[x->tensor];
    const tide__tgeom *g = &c->g[x->tensor];
#define FAIL(...)                                                                                  \
    do {                                                                                           \
        char what_[256];                                                                           \
        snprintf(what_, sizeof what_, __VA_ARGS__);                                                \
        return tide_errorf(TIDE_ERR_INVALID, "plan item %zu (%s, worker %d -> %d): %s", k,         \
                           t->name, (int)x->src, (int)x->dst, what_);                              \
    } while (0)
    if (x->run == 0 || x->count == 0)
        FAIL("empty (run %llu, count %llu)", (unsigned long long)x->run,
             (unsigned long long)x->count);
    long si = tide__worker_index_find(oix, x->src);
    if (si < 0)
        FAIL("source worker is not in the old layout");
    if (!tide__is_alive(alive, n_alive, x->src))
        FAIL("source worker is dead");
    long di = tide__worker_index_find(nix, x->dst);
    if (di < 0)
        FAIL("destination worker is not in the new layout");
    int sp, sd, st, dp, dd, dt;
    tide__coord(v->o, (size_t)si, &sp, &sd, &st);
    tide__coord(v->nl, (size_t)di, &dp, &dd, &dt);
    if (!tide__stage_holds(v->o, sp, t->layer))
        FAIL("the source's old stage %d does not hold the tensor", sp);
    if (!tide__stage_holds(v->nl, dp, t->layer))
        FAIL("the destination's new stage %d does not hold the tensor", dp);
    tide__shard ss, ds;
    tide__shard_of(c, x->tensor, v->o->tp, st, v->o->dp, sd, &ss);
    tide__shard_of(c, x->tensor, v->nl->tp, dt, v->nl->dp, dd, &ds);
    uint64_t es = g->es;
    uint64_t sbytes = (ss.hi - ss.lo) * es, dbytes = (ds.hi - ds.lo) * es;
    if (!fits(x->src_off, x->count, x->src_stride, x->run, sbytes))
        FAIL("source range (off %llu, %llu x %llu bytes, stride %llu) exceeds its %llu-byte buffer",
             (unsigned long long)x->src_off, (unsigned long long)x->count,
             (unsigned long long)x->run, (unsigned long long)x->src_stride,
             (unsigned long long)sbytes);
    if (!fits(x->dst_off, x->count, x->dst_stride, x->run, dbytes))
        FAIL("destination range (off %llu, %llu x %llu bytes, stride %llu) exceeds its %llu-byte "
             "buffer",
             (unsigned long long)x->dst_off, (unsigned long long)x->count,
             (unsigned long long)x->run, (unsigned long long)x->dst_stride,
             (unsigned long long)dbytes);
    for (uint64_t r = 0; r < x->count; r++) {
        uint64_t xs = x->src_off + r * x->src_stride, xd = x->dst_off + r * x->dst_stride;
        for (uint64_t pos = 0; pos < x->run;) {
            uint64_t gs = global_byte(g, &ss, xs + pos), gd = global_byte(g, &ds, xd + pos);
            if (gs != gd)
                FAIL("run %llu byte %llu reads global byte %llu but writes global byte %llu",
                     (unsigned long long)r, (unsigned long long)pos, (unsigned long long)gs,
                     (unsigned long long)gd);
            uint64_t step = x->run - pos, ls = block_left(&ss, es, xs + pos),
                     ld = block_left(&ds, es, xd + pos);
            step = step < ls ? step : ls;
            step = step < ld ? step : ld;
            pos += step;
        }
    }
#undef FAIL
    if (x->count > 1 && x->dst_stride == x->run)
        return add_span(v, (uint32_t)di, x->tensor, x->dst_off, x->run * x->count, k);
    for (uint64_t r = 0; r < x->count; r++)
        TIDE_CHECK(add_span(v, (uint32_t)di, x->tensor, x->dst_off + r * x->dst_stride, x->run, k));
    return TIDE_OK;
}

/* Every held (new coordinate, tensor) buffer is tiled exactly by the sorted spans. */
static tide_status check_coverage(vctx *v)
{
    const tide_layout_t *nl = v->nl;
    const tide_collection_t *c = v->c;
    size_t at = 0, nn = tide_layout_size(nl);
    for (size_t j = 0; j < nn; j++) {
        int p, d, t;
        tide__coord(nl, j, &p, &d, &t);
        for (size_t i = 0; i < c->n; i++) {
            uint64_t size = tide_shard_bytes(nl, c, i, p, d, t);
            uint64_t cur = 0;
            while (at < v->n_spans && v->spans[at].dst == j && v->spans[at].tensor == i) {
                const span *s = &v->spans[at];
                if (s->off < cur)
                    return tide_errorf(
                        TIDE_ERR_INVALID,
                        "worker %d's new buffer of %s: bytes [%llu, %llu) written "
                        "twice (plan item %zu)",
                        (int)nl->worker[j], c->t[i].name, (unsigned long long)s->off,
                        (unsigned long long)(cur < s->off + s->len ? cur : s->off + s->len),
                        s->item);
                if (s->off > cur)
                    break;
                cur = s->off + s->len;
                at++;
            }
            if (cur != size)
                return tide_errorf(TIDE_ERR_INVALID,
                                   "worker %d's new buffer of %s (%llu bytes): bytes from %llu are "
                                   "never written",
                                   (int)nl->worker[j], c->t[i].name, (unsigned long long)size,
                                   (unsigned long long)cur);
            if (at < v->n_spans && v->spans[at].dst == j && v->spans[at].tensor == i)
                return tide_errorf(TIDE_ERR_INVALID,
                                   "worker %d's new buffer of %s: plan item %zu writes past its "
                                   "%llu bytes",
                                   (int)nl->worker[j], c->t[i].name, v->spans[at].item,
                                   (unsigned long long)size);
        }
    }
    return TIDE_OK;
}

static int xfer_before(const tide_xfer *x, const tide_xfer *y)
{
    if (x->src != y->src)
        return x->src < y->src;
    if (x->dst != y->dst)
        return x->dst < y->dst;
    if (x->tensor != y->tensor)
        return x->tensor < y->tensor;
    return x->dst_off < y->dst_off;
}

tide_status tide_plan_validate(const tide_layout_t *old_l, const tide_layout_t *new_l,
                               const tide_collection_t *c, const uint8_t *alive, size_t n_alive,
                               const tide_plan_t *plan)
{
    if (old_l == NULL || new_l == NULL || c == NULL || plan == NULL)
        return tide_errorf(TIDE_ERR_INVALID, "tide_plan_validate: NULL argument");
    if (plan->n > 0 && plan->items == NULL)
        return tide_errorf(TIDE_ERR_INVALID, "plan has %zu items but no item array", plan->n);
    TIDE_CHECK(tide_layout_validate(old_l, c));
    TIDE_CHECK(tide_layout_validate(new_l, c));
    tide_status rc = TIDE_OK;
    tide__worker_index oix, nix;
    memset(&nix, 0, sizeof nix);
    vctx v = {old_l, new_l, c, plan, NULL, 0, 0};
    TIDE_CHECK(tide__worker_index_new(old_l, &oix));
    TIDE_CHECK_GOTO(tide__worker_index_new(new_l, &nix), rc, out);
    for (size_t k = 0; k < plan->n; k++) {
        if (k > 0 && !xfer_before(&plan->items[k - 1], &plan->items[k]))
            TIDE_FAIL_GOTO(rc, out, TIDE_ERR_INVALID,
                           "plan items %zu and %zu are not sorted by (src, dst, tensor, dst_off)",
                           k - 1, k);
        TIDE_CHECK_GOTO(check_item(&v, k, &oix, &nix, alive, n_alive), rc, out);
    }
    if (v.n_spans > 1)
        qsort(v.spans, v.n_spans, sizeof *v.spans, cmp_span);
    TIDE_CHECK_GOTO(check_coverage(&v), rc, out);
out:
    tide_free(v.spans);
    tide__worker_index_free(&oix);
    tide__worker_index_free(&nix);
    return rc;
}
