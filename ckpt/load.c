/*
 * Loading a checkpoint into any layout (see tide_ckpt_load). The saved layout is the old
 * layout of a reshard plan and its shard files are the holders; the new layout's
 * coordinate is the destination. Old and new worker ids are renumbered apart (old
 * coordinate k is worker k, new coordinate k is worker n_old + k) because a relaunched
 * job's ranks share nothing with the saving job's. A file holds only what its
 * coordinate was the one writer of, so tensors are planned in classes by who writes
 * them (dp-sharded?, tp-split?, every stage?), each with the writers of that class as
 * the only live holders. Reads are chunk-aligned so that every byte used is checked against its
 * chunk's hash.
 */
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt/ckpt_int.h"
#include "core/alloc.h"
#include "core/error.h"

#define WINDOW_BYTES (8u << 20) /* bytes read (and checked) at once from a shard file */

/* One planned read: count runs of run bytes from a shard file into a buffer. */
typedef struct rd {
    uint64_t file_off, src_stride;
    uint8_t *dst;
    uint64_t dst_stride, run, count;
} rd;

typedef struct src {
    rd *r;
    size_t n, cap;
} src;

static int tensor_class(const tide_tensor_desc *t)
{
    return (t->dp == TIDE_DP_SHARDED) | (t->tp == TIDE_TP_SPLIT) << 1 |
           (t->layer == TIDE_LAYER_ALL) << 2;
}

/* Whether coordinate (p, d, t) writes the tensors of class cls (see tide_ckpt_saves). */
static int class_writer(int cls, int p, int d, int t)
{
    return ((cls & 1) || d == 0) && ((cls & 2) || t == 0) && (!(cls & 4) || p == 0);
}

static tide_status add_rd(src *s, const rd *r)
{
    if (s->n == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 16;
        rd *nr = tide_reallocarray(s->r, cap, sizeof *nr);
        if (nr == NULL)
            return tide_errorf(TIDE_ERR_NOMEM, "out of memory planning a checkpoint load");
        s->r = nr;
        s->cap = cap;
    }
    s->r[s->n++] = *r;
    return TIDE_OK;
}

/* Plans class cls: appends the reads of coordinate (p, d, t) of l to srcs. */
static tide_status plan_class(const tide_ckpt_t *ck, const tide_layout_t *l, int p, int d, int t,
                              void *const *bufs, int cls, src *srcs)
{
    const tide_collection_t *c = ck->coll;
    const tide_layout_t *ol = ck->layout;
    size_t n = tide_collection_size(c), n_old = tide_layout_size(ol), n_new = tide_layout_size(l);
    tide_status rc = TIDE_OK;
    tide_collection_t *sub = NULL;
    tide_layout_t *old_r = NULL, *new_r = NULL;
    tide_plan_t *plan = NULL;
    size_t *map = tide_calloc(n ? n : 1, sizeof *map);
    uint8_t *alive = tide_calloc(n_old + n_new, 1);
    size_t n_sub = 0;
    TIDE_CHECK_ALLOC_GOTO(map, rc, out);
    TIDE_CHECK_ALLOC_GOTO(alive, rc, out);
    TIDE_CHECK_GOTO(tide_collection_new(&sub, tide_collection_num_layers(c)), rc, out);
    for (size_t i = 0; i < n; i++) {
        const tide_tensor_desc *desc = tide_collection_tensor(c, i);
        if (tensor_class(desc) != cls || bufs[i] == NULL || tide_shard_bytes(l, c, i, p, d, t) == 0)
            continue;
        TIDE_CHECK_GOTO(tide_collection_add(sub, desc), rc, out);
        map[n_sub++] = i;
    }
    if (n_sub == 0)
        goto out;
    TIDE_CHECK_GOTO(tide_layout_copy(&old_r, ol), rc, out);
    TIDE_CHECK_GOTO(tide_layout_copy(&new_r, l), rc, out);
    for (size_t k = 0; k < n_old; k++) {
        old_r->worker[k] = (int32_t)k;
        int op = (int)(k / ((size_t)ol->dp * (size_t)ol->tp));
        int od = (int)(k / (size_t)ol->tp % (size_t)ol->dp), ot = (int)(k % (size_t)ol->tp);
        alive[k] = (uint8_t)class_writer(cls, op, od, ot);
    }
    for (size_t k = 0; k < n_new; k++) {
        new_r->worker[k] = (int32_t)(n_old + k);
        alive[n_old + k] = 1;
    }
    int32_t me = (int32_t)(n_old + tide_layout_index(l, p, d, t));
    TIDE_CHECK_GOTO(tide_reshard_plan_for(old_r, new_r, sub, alive, n_old + n_new, me, &plan), rc,
                    out);
    for (size_t k = 0; k < plan->n; k++) {
        const tide_xfer *x = &plan->items[k];
        if (x->dst != me)
            continue;
        if (x->src < 0 || (size_t)x->src >= n_old || x->tensor >= n_sub)
            TIDE_FAIL_GOTO(rc, out, TIDE_ERR_INTERNAL, "checkpoint plan item out of range");
        size_t i = map[x->tensor];
        int op = (int)((size_t)x->src / ((size_t)ol->dp * (size_t)ol->tp));
        int od = (int)((size_t)x->src / (size_t)ol->tp % (size_t)ol->dp);
        int ot = (int)((size_t)x->src % (size_t)ol->tp);
        int sk = ck->shard_of[x->src];
        if (sk < 0 || !tide_ckpt_saves(ol, c, i, op, od, ot))
            TIDE_FAIL_GOTO(
                rc, out, TIDE_ERR_INTERNAL,
                "checkpoint plan reads %s from (p %d, d %d, t %d), which did not save it",
                tide_collection_tensor(c, i)->name, op, od, ot);
        rd r = {tide__ckpt_tensor_offset(ol, c, i, op, od, ot) + x->src_off,
                x->src_stride,
                (uint8_t *)bufs[i] + x->dst_off,
                x->dst_stride,
                x->run,
                x->count};
        TIDE_CHECK_GOTO(add_rd(&srcs[sk], &r), rc, out);
    }
out:
    tide_plan_destroy(&plan);
    tide_layout_destroy(&old_r);
    tide_layout_destroy(&new_r);
    tide_collection_destroy(&sub);
    tide_free(alive);
    tide_free(map);
    return rc;
}

/* Copies the parts of read r that lie in file bytes [wa, wb), held at win. */
static void copy_window(const rd *r, uint64_t wa, uint64_t wb, const uint8_t *win)
{
    uint64_t a0 = r->file_off;
    uint64_t end = a0 + (r->count - 1) * r->src_stride + r->run;
    if (end <= wa || a0 >= wb)
        return;
    uint64_t q = 0;
    if (r->count > 1 && r->src_stride > 0 && wa > a0 + r->run)
        q = (wa - a0 - r->run) / r->src_stride;
    for (; q < r->count; q++) {
        uint64_t a = a0 + q * r->src_stride;
        if (a >= wb)
            break;
        uint64_t lo = a > wa ? a : wa, hi = a + r->run < wb ? a + r->run : wb;
        if (lo < hi)
            memcpy(r->dst + q * r->dst_stride + (lo - a), win + (lo - wa), hi - lo);
    }
}

/* Reads the chunks of shard sh that the reads s need, in windows of consecutive needed
   chunks (one pread each, a reused buffer), checks every chunk's hash, then copies the
   runs out of the window. */
static tide_status read_shard(const tide_ckpt_t *ck, const tide__ckpt_shard *sh, const src *s,
                              tide_ckpt_load_stats *st)
{
    char path[TIDE_CKPT_PATH_MAX + 128];
    snprintf(path, sizeof path, "%s/%s", ck->dir, sh->file);
    uint64_t chunk = ck->chunk;
    uint32_t win_chunks = (uint32_t)(WINDOW_BYTES / chunk) ? (uint32_t)(WINDOW_BYTES / chunk) : 1;
    tide_status rc = TIDE_OK;
    uint8_t *need = tide_calloc(sh->n_chunks ? sh->n_chunks : 1, 1);
    uint8_t *win = NULL;
    int fd = -1;
    TIDE_CHECK_ALLOC_GOTO(need, rc, out);
    int any = 0;
    for (size_t k = 0; k < s->n; k++) {
        const rd *r = &s->r[k];
        if (r->run == 0 || r->count == 0)
            continue;
        uint64_t end = r->file_off + (r->count - 1) * r->src_stride + r->run;
        if (end > sh->bytes)
            TIDE_FAIL_GOTO(rc, out, TIDE_ERR_INTERNAL, "%s: read past the shard's end", path);
        for (uint64_t q = 0; q < r->count; q++) {
            uint64_t a = r->file_off + q * r->src_stride;
            for (uint64_t j = a / chunk; j <= (a + r->run - 1) / chunk; j++)
                need[j] = 1;
        }
        any = 1;
    }
    if (!any)
        goto out;
    win = tide_malloc((size_t)win_chunks * chunk);
    TIDE_CHECK_ALLOC_GOTO(win, rc, out);
    TIDE_CHECK_GOTO(tide__ckpt_open_read(ck->fd, ck->dir, sh->file, &fd), rc, out);
    struct stat stt;
    if (fstat(fd, &stt) != 0 || (uint64_t)stt.st_size != sh->bytes)
        TIDE_FAIL_GOTO(rc, out, TIDE_ERR_INVALID,
                       "%s has %lld bytes; the manifest says %" PRIu64 " (truncated?)", path,
                       (long long)stt.st_size, sh->bytes);
    (void)posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
    for (uint32_t j = 0; j < sh->n_chunks;) {
        if (!need[j]) {
            j++;
            continue;
        }
        uint32_t e = j;
        while (e < sh->n_chunks && need[e] && e - j < win_chunks)
            e++;
        uint64_t wa = (uint64_t)j * chunk;
        uint64_t wb = e == sh->n_chunks ? sh->bytes : (uint64_t)e * chunk;
        TIDE_CHECK_GOTO(tide__ckpt_read_at(fd, win, wb - wa, wa, path), rc, out);
        st->bytes_read += wb - wa;
        for (uint32_t q = j; q < e; q++) {
            uint64_t qo = (uint64_t)q * chunk;
            uint64_t qn = sh->bytes - qo < chunk ? sh->bytes - qo : chunk;
            if (tide__ckpt_hash(win + (qo - wa), qn) != sh->hash[q])
                TIDE_FAIL_GOTO(rc, out, TIDE_ERR_INVALID,
                               "%s is corrupted: bytes %" PRIu64 "..%" PRIu64
                               " do not match the manifest's checksum",
                               path, qo, qo + qn - 1);
        }
        for (size_t k = 0; k < s->n; k++)
            if (s->r[k].run > 0 && s->r[k].count > 0)
                copy_window(&s->r[k], wa, wb, win);
        j = e;
    }
    st->files++;
    for (size_t k = 0; k < s->n; k++)
        st->bytes_needed += s->r[k].run * s->r[k].count;
out:
    if (fd >= 0)
        close(fd);
    tide_free(win);
    tide_free(need);
    return rc;
}

tide_status tide_ckpt_load(const tide_ckpt_t *ck, const tide_layout_t *l, int p, int d, int t,
                           void *const *bufs, tide_ckpt_load_stats *stats)
{
    if (ck == NULL || l == NULL || bufs == NULL)
        return tide_errorf(TIDE_ERR_INVALID, "tide_ckpt_load: NULL argument");
    if (p < 0 || p >= l->pp || d < 0 || d >= l->dp || t < 0 || t >= l->tp)
        return tide_errorf(TIDE_ERR_INVALID,
                           "tide_ckpt_load: (p %d, d %d, t %d) is outside the "
                           "layout",
                           p, d, t);
    tide_status rc = tide_layout_validate(l, ck->coll);
    if (rc != TIDE_OK)
        return tide_errorf(rc, "loading checkpoint %s: %s", ck->dir, tide_last_error());
    tide_ckpt_load_stats st = {0, 0, 0};
    src *srcs = tide_calloc(ck->n_shards ? ck->n_shards : 1, sizeof *srcs);
    if (srcs == NULL)
        return tide_errorf(TIDE_ERR_NOMEM, "out of memory loading %s", ck->dir);
    for (int cls = 0; cls < 8; cls++)
        TIDE_CHECK_GOTO(plan_class(ck, l, p, d, t, bufs, cls, srcs), rc, out);
    for (size_t k = 0; k < ck->n_shards; k++)
        if (srcs[k].n > 0)
            TIDE_CHECK_GOTO(read_shard(ck, &ck->shards[k], &srcs[k], &st), rc, out);
    if (stats != NULL)
        *stats = st;
out:
    for (size_t k = 0; k < ck->n_shards; k++)
        tide_free(srcs[k].r);
    tide_free(srcs);
    return rc;
}
