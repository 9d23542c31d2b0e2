/*
 * Layouts: (dp, tp, pp), pipeline stage boundaries, micro-batches and the
 * explicit coordinate -> worker map, with a validator whose messages name the
 * offending tensor, worker or stage. Workload: layouts of up to a few thousand
 * workers, validated once per resize (O(n log n) for the uniqueness check).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "reshard/reshard_int.h"

/* Upper bound on dp * tp * pp: worker ids are int32 and coordinates fit in uint32. */
#define MAX_WORKERS (1L << 24)

static tide_status check_degrees(int dp, int tp, int pp, int num_layers, int micro_batches)
{
    if (dp < 1 || tp < 1 || pp < 1)
        return tide_errorf(TIDE_ERR_INVALID, "degrees must be >= 1 (dp %d, tp %d, pp %d)", dp, tp,
                           pp);
    if ((long)dp * tp > MAX_WORKERS || (long)dp * tp * pp > MAX_WORKERS)
        return tide_errorf(TIDE_ERR_RANGE, "dp * tp * pp = %ld workers is above the limit of %ld",
                           (long)dp * tp * pp, MAX_WORKERS);
    if (num_layers < pp)
        return tide_errorf(TIDE_ERR_INVALID,
                           "pp=%d needs at least %d layers (one per stage), the model has %d", pp,
                           pp, num_layers);
    if (micro_batches < 1)
        return tide_errorf(TIDE_ERR_INVALID, "micro_batches is %d (must be >= 1)", micro_batches);
    return TIDE_OK;
}

tide_status tide_layout_new(tide_layout_t **out, int dp, int tp, int pp, int num_layers,
                            int micro_batches)
{
    if (out == NULL)
        return tide_errorf(TIDE_ERR_INVALID, "tide_layout_new: out is NULL");
    *out = NULL;
    TIDE_CHECK(check_degrees(dp, tp, pp, num_layers, micro_batches));
    tide_status rc = TIDE_OK;
    tide_layout_t *l = tide_calloc(1, sizeof *l);
    TIDE_CHECK_ALLOC_GOTO(l, rc, fail);
    l->dp = dp;
    l->tp = tp;
    l->pp = pp;
    l->num_layers = num_layers;
    l->micro_batches = micro_batches;
    l->stage_start = tide_calloc((size_t)pp + 1, sizeof *l->stage_start);
    TIDE_CHECK_ALLOC_GOTO(l->stage_start, rc, fail);
    size_t n = tide_layout_size(l);
    l->worker = tide_calloc(n, sizeof *l->worker);
    TIDE_CHECK_ALLOC_GOTO(l->worker, rc, fail);
    int base = num_layers / pp, extra = num_layers % pp;
    for (int s = 0; s < pp; s++)
        l->stage_start[s + 1] = l->stage_start[s] + base + (s < extra ? 1 : 0);
    for (size_t i = 0; i < n; i++)
        l->worker[i] = (int32_t)i;
    *out = l;
    return TIDE_OK;
fail:
    tide_layout_destroy(&l);
    return rc;
}

tide_status tide_layout_copy(tide_layout_t **out, const tide_layout_t *src)
{
    if (out == NULL || src == NULL)
        return tide_errorf(TIDE_ERR_INVALID, "tide_layout_copy: NULL argument");
    *out = NULL;
    tide_layout_t *l = NULL;
    TIDE_CHECK(tide_layout_new(&l, src->dp, src->tp, src->pp, src->num_layers, src->micro_batches));
    memcpy(l->stage_start, src->stage_start, ((size_t)src->pp + 1) * sizeof *l->stage_start);
    memcpy(l->worker, src->worker, tide_layout_size(src) * sizeof *l->worker);
    *out = l;
    return TIDE_OK;
}

void tide_layout_destroy(tide_layout_t **self_p)
{
    if (self_p == NULL || *self_p == NULL)
        return;
    tide_layout_t *l = *self_p;
    tide_free(l->stage_start);
    tide_free(l->worker);
    tide_free(l);
    *self_p = NULL;
}

static tide_status check_stages(int pp, int num_layers, const int *starts)
{
    if (starts[0] != 0)
        return tide_errorf(TIDE_ERR_INVALID, "stage 0 starts at layer %d (must be 0)", starts[0]);
    for (int s = 0; s < pp; s++) {
        if (starts[s + 1] <= starts[s])
            return tide_errorf(TIDE_ERR_INVALID, "stage %d has no layers", s);
        if (starts[s + 1] > num_layers)
            return tide_errorf(TIDE_ERR_INVALID, "stage %d ends after the last layer (%d layers)",
                               s, num_layers);
    }
    if (starts[pp] != num_layers)
        return tide_errorf(TIDE_ERR_INVALID,
                           "stages cover layers 0-%d but the model has %d layers (0-%d)",
                           starts[pp] - 1, num_layers, num_layers - 1);
    return TIDE_OK;
}

tide_status tide_layout_set_stages(tide_layout_t *l, const int *starts)
{
    if (l == NULL || starts == NULL)
        return tide_errorf(TIDE_ERR_INVALID, "tide_layout_set_stages: NULL argument");
    TIDE_CHECK(check_stages(l->pp, l->num_layers, starts));
    memcpy(l->stage_start, starts, ((size_t)l->pp + 1) * sizeof *starts);
    return TIDE_OK;
}

static int parse_int(const char **p, int *v)
{
    const char *s = *p;
    if (*s < '0' || *s > '9')
        return 0;
    long x = 0;
    while (*s >= '0' && *s <= '9') {
        x = x * 10 + (*s - '0');
        if (x > 1000000000L)
            return 0;
        s++;
    }
    *v = (int)x;
    *p = s;
    return 1;
}

tide_status tide_layout_parse_stages(tide_layout_t *l, const char *text)
{
    if (l == NULL || text == NULL)
        return tide_errorf(TIDE_ERR_INVALID, "tide_layout_parse_stages: NULL argument");
    tide_status rc = TIDE_OK;
    int *starts = tide_calloc((size_t)l->pp + 1, sizeof *starts);
    if (starts == NULL)
        return tide_errorf(TIDE_ERR_NOMEM, "out of memory parsing stages");
    const char *p = text;
    int s = 0;
    for (;;) {
        int a, b;
        while (*p == ' ')
            p++;
        if (!parse_int(&p, &a))
            TIDE_FAIL_GOTO(rc, out, TIDE_ERR_INVALID,
                           "stages \"%s\": expected a layer number at offset %d", text,
                           (int)(p - text));
        b = a;
        if (*p == '-') {
            p++;
            if (!parse_int(&p, &b))
                TIDE_FAIL_GOTO(rc, out, TIDE_ERR_INVALID,
                               "stages \"%s\": expected a layer number at offset %d", text,
                               (int)(p - text));
        }
        if (s >= l->pp)
            TIDE_FAIL_GOTO(rc, out, TIDE_ERR_INVALID, "stages \"%s\": more than pp=%d ranges", text,
                           l->pp);
        if (b < a)
            TIDE_FAIL_GOTO(rc, out, TIDE_ERR_INVALID,
                           "stages \"%s\": stage %d has no layers (%d-%d)", text, s, a, b);
        int expect = s == 0 ? 0 : starts[s];
        if (a != expect)
            TIDE_FAIL_GOTO(rc, out, TIDE_ERR_INVALID,
                           "stages \"%s\": stage %d starts at layer %d, expected %d (stages must "
                           "be contiguous)",
                           text, s, a, expect);
        starts[s + 1] = b + 1;
        s++;
        while (*p == ' ')
            p++;
        if (*p == '\0')
            break;
        if (*p != ',')
            TIDE_FAIL_GOTO(rc, out, TIDE_ERR_INVALID, "stages \"%s\": unexpected '%c' at offset %d",
                           text, *p, (int)(p - text));
        p++;
    }
    if (s != l->pp)
        TIDE_FAIL_GOTO(rc, out, TIDE_ERR_INVALID, "stages \"%s\": %d ranges for pp=%d", text, s,
                       l->pp);
    TIDE_CHECK_GOTO(tide_layout_set_stages(l, starts), rc, out);
out:
    tide_free(starts);
    return rc;
}

tide_status tide_layout_find(const tide_layout_t *l, int32_t worker, int *p, int *d, int *t)
{
    size_t n = tide_layout_size(l);
    for (size_t i = 0; i < n; i++) {
        if (l->worker[i] == worker) {
            int pp, dd, tt;
            tide__coord(l, i, &pp, &dd, &tt);
            if (p)
                *p = pp;
            if (d)
                *d = dd;
            if (t)
                *t = tt;
            return TIDE_OK;
        }
    }
    return tide_errorf(TIDE_ERR_NOT_FOUND, "worker %d is not in the layout", (int)worker);
}

int tide__stage_of(const tide_layout_t *l, int layer)
{
    if (layer == TIDE_LAYER_PRE)
        return 0;
    if (layer == TIDE_LAYER_POST)
        return l->pp - 1;
    if (layer < 0 || layer >= l->num_layers)
        return -1;
    int lo = 0, hi = l->pp - 1; /* the stage s with stage_start[s] <= layer < stage_start[s+1] */
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (l->stage_start[mid] <= layer)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

int tide_layout_stage_of(const tide_layout_t *l, int layer)
{
    return tide__stage_of(l, layer);
}

/* ---- worker index -------------------------------------------------------------------- */

typedef struct id_pos {
    int32_t id;
    uint32_t pos;
} id_pos;

static int cmp_id_pos(const void *a, const void *b)
{
    const id_pos *x = a, *y = b;
    if (x->id != y->id)
        return x->id < y->id ? -1 : 1;
    return x->pos < y->pos ? -1 : (x->pos > y->pos);
}

/*
 * Sorts by (id, pos). Ids are usually dense pool ranks: a counting sort over
 * them (pos ascending within an id, as tmp is filled in pos order) costs
 * O(n + max id) instead of qsort's O(n log n) calls through a pointer; this
 * runs for every validation, several times per placement decision.
 */
static tide_status sort_id_pos(id_pos *tmp, size_t n)
{
    int32_t max = 0;
    for (size_t i = 0; i < n; i++)
        max = tmp[i].id > max ? tmp[i].id : max;
    size_t range = (size_t)max + 1;
    if (range > 4 * n + 1024) { /* sparse ids */
        qsort(tmp, n, sizeof *tmp, cmp_id_pos);
        return TIDE_OK;
    }
    uint32_t *start = tide_calloc(range + 1, sizeof *start);
    id_pos *out = tide_calloc(n ? n : 1, sizeof *out);
    if (start == NULL || out == NULL) {
        tide_free(start);
        tide_free(out);
        return tide_errorf(TIDE_ERR_NOMEM, "out of memory indexing %zu workers", n);
    }
    for (size_t i = 0; i < n; i++)
        start[tmp[i].id + 1]++;
    for (size_t k = 0; k < range; k++)
        start[k + 1] += start[k];
    for (size_t i = 0; i < n; i++)
        out[start[tmp[i].id]++] = tmp[i];
    memcpy(tmp, out, n * sizeof *tmp);
    tide_free(out);
    tide_free(start);
    return TIDE_OK;
}

tide_status tide__worker_index_new(const tide_layout_t *l, tide__worker_index *ix)
{
    memset(ix, 0, sizeof *ix);
    size_t n = tide_layout_size(l);
    tide_status rc = TIDE_OK;
    id_pos *tmp = tide_calloc(n, sizeof *tmp);
    TIDE_CHECK_ALLOC_GOTO(tmp, rc, fail);
    for (size_t i = 0; i < n; i++) {
        tmp[i].id = l->worker[i];
        tmp[i].pos = (uint32_t)i;
        if (l->worker[i] < 0) {
            int p, d, t;
            tide__coord(l, i, &p, &d, &t);
            TIDE_FAIL_GOTO(rc, fail, TIDE_ERR_INVALID,
                           "worker id %d at (pp %d, dp %d, tp %d) is negative", (int)l->worker[i],
                           p, d, t);
        }
    }
    TIDE_CHECK_GOTO(sort_id_pos(tmp, n), rc, fail);
    for (size_t i = 1; i < n; i++) {
        if (tmp[i].id == tmp[i - 1].id) {
            int p0, d0, t0, p1, d1, t1;
            tide__coord(l, tmp[i - 1].pos, &p0, &d0, &t0);
            tide__coord(l, tmp[i].pos, &p1, &d1, &t1);
            TIDE_FAIL_GOTO(rc, fail, TIDE_ERR_INVALID,
                           "worker %d appears twice: at (pp %d, dp %d, tp %d) and (pp %d, dp %d, "
                           "tp %d)",
                           (int)tmp[i].id, p0, d0, t0, p1, d1, t1);
        }
    }
    ix->ids = tide_calloc(n, sizeof *ix->ids);
    TIDE_CHECK_ALLOC_GOTO(ix->ids, rc, fail);
    ix->pos = tide_calloc(n, sizeof *ix->pos);
    TIDE_CHECK_ALLOC_GOTO(ix->pos, rc, fail);
    for (size_t i = 0; i < n; i++) {
        ix->ids[i] = tmp[i].id;
        ix->pos[i] = tmp[i].pos;
    }
    ix->n = n;
    tide_free(tmp);
    return TIDE_OK;
fail:
    tide_free(tmp);
    tide__worker_index_free(ix);
    return rc;
}

void tide__worker_index_free(tide__worker_index *ix)
{
    tide_free(ix->ids);
    tide_free(ix->pos);
    memset(ix, 0, sizeof *ix);
}

long tide__worker_index_find(const tide__worker_index *ix, int32_t id)
{
    size_t lo = 0, hi = ix->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (ix->ids[mid] < id)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo < ix->n && ix->ids[lo] == id)
        return (long)ix->pos[lo];
    return -1;
}

/* ---- validation ------------------------------------------------------------------------ */

static tide_status check_tensor(const tide_layout_t *l, const tide_tensor_desc *t)
{
    if (t->tp != TIDE_TP_SPLIT || l->tp == 1)
        return TIDE_OK;
    int64_t size = t->shape[t->tp_dim];
    int64_t seg = size / t->tp_segments;
    if (seg % l->tp == 0)
        return TIDE_OK;
    if (t->tp_segments == 1)
        return tide_errorf(TIDE_ERR_INVALID, "tp=%d does not divide dimension %d of %s (size %lld)",
                           l->tp, t->tp_dim, t->name, (long long)size);
    return tide_errorf(TIDE_ERR_INVALID,
                       "tp=%d does not divide dimension %d of %s (size %lld: %d fused segments of "
                       "%lld)",
                       l->tp, t->tp_dim, t->name, (long long)size, t->tp_segments, (long long)seg);
}

tide_status tide_layout_validate(const tide_layout_t *l, const tide_collection_t *c)
{
    if (l == NULL)
        return tide_errorf(TIDE_ERR_INVALID, "tide_layout_validate: layout is NULL");
    TIDE_CHECK(check_degrees(l->dp, l->tp, l->pp, l->num_layers, l->micro_batches));
    if (l->stage_start == NULL || l->worker == NULL)
        return tide_errorf(TIDE_ERR_INVALID, "layout has no stage or worker arrays");
    TIDE_CHECK(check_stages(l->pp, l->num_layers, l->stage_start));
    tide__worker_index ix;
    TIDE_CHECK(tide__worker_index_new(l, &ix));
    tide__worker_index_free(&ix);
    if (c == NULL)
        return TIDE_OK;
    if (c->num_layers != l->num_layers)
        return tide_errorf(TIDE_ERR_INVALID, "the layout has %d layers but the collection has %d",
                           l->num_layers, c->num_layers);
    for (size_t i = 0; i < c->n; i++)
        TIDE_CHECK(check_tensor(l, &c->t[i]));
    return TIDE_OK;
}

char *tide_layout_format(const tide_layout_t *l, char *buf, size_t len)
{
    if (buf == NULL || len == 0)
        return buf;
    size_t at = 0;
    int w = snprintf(buf, len, "(dp %d, tp %d, pp %d; stages ", l->dp, l->tp, l->pp);
    at = w < 0 ? 0 : (size_t)w;
    for (int s = 0; s < l->pp && at < len; s++) {
        w = snprintf(buf + at, len - at, "%s%d-%d", s ? "," : "", l->stage_start[s],
                     l->stage_start[s + 1] - 1);
        at += w < 0 ? 0 : (size_t)w;
    }
    if (at < len)
        snprintf(buf + at, len - at, ")");
    return buf;
}
