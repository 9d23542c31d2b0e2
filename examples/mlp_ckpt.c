/*
 * Distributed checkpoints of train_mlp (see mlp_ckpt.h). File formats, little-endian
 * host order (the files are read back on the machine that wrote them):
 *   layout.ckpt   "TIDELAY1", i32 dp, tp, pp, num_layers, micro_batches,
 *                 i32 stage_start[pp + 1], i32 worker[dp * tp * pp],
 *                 u64 n_tensors, u64 collection bytes
 *   rank-W.ckpt   "TIDECKP1", u64 n_tensors, u64 shard bytes[n_tensors], then the
 *                 shards in collection order (tensor i at the sum of the bytes before it)
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/error.h"
#include "core/log.h"
#include "examples/mlp_ckpt.h"

#define SUBSYS     "mlp.ckpt"
#define MAGIC_RANK "TIDECKP1"
#define MAGIC_LAY  "TIDELAY1"

/* ---- small I/O helpers ---------------------------------------------------------------- */

static tide_status write_all(int fd, const void *buf, uint64_t n, const char *path)
{
    const char *p = buf;
    while (n > 0) {
        ssize_t k = write(fd, p, n > (1u << 30) ? (1u << 30) : (size_t)n);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return tide_errorf(TIDE_ERR_IO, "writing %s: %s", path, strerror(errno));
        p += k;
        n -= (uint64_t)k;
    }
    return TIDE_OK;
}

static tide_status read_at(int fd, void *buf, uint64_t n, uint64_t off, const char *path)
{
    char *p = buf;
    while (n > 0) {
        ssize_t k = pread(fd, p, n > (1u << 30) ? (1u << 30) : (size_t)n, (off_t)off);
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0)
            return tide_errorf(TIDE_ERR_IO, "reading %s: %s", path, strerror(errno));
        if (k == 0)
            return tide_errorf(TIDE_ERR_IO,
                               "%s is shorter than its header says (truncated "
                               "checkpoint?)",
                               path);
        p += k;
        n -= (uint64_t)k;
        off += (uint64_t)k;
    }
    return TIDE_OK;
}

static tide_status open_file(const char *path, int flags, int *fd)
{
    *fd = open(path, flags | O_CLOEXEC, 0644);
    if (*fd >= 0)
        return TIDE_OK;
    return tide_errorf(errno == ENOENT ? TIDE_ERR_NOT_FOUND : TIDE_ERR_IO, "cannot open %s: %s",
                       path, strerror(errno));
}

/* ---- save ------------------------------------------------------------------------------ */

static tide_status save_layout(const tide_mlp_t *m, const char *dir)
{
    const tide_layout_t *l = tide_mlp_layout(m);
    const tide_collection_t *c = tide_mlp_collection(m);
    char path[4096];
    snprintf(path, sizeof path, "%s/layout.ckpt", dir);
    size_t n = tide_layout_size(l);
    size_t words = 5 + (size_t)l->pp + 1 + n;
    int32_t *w = tide_calloc(words, sizeof *w);
    if (w == NULL)
        return tide_errorf(TIDE_ERR_NOMEM, "out of memory writing %s", path);
    int32_t *q = w;
    *q++ = l->dp;
    *q++ = l->tp;
    *q++ = l->pp;
    *q++ = l->num_layers;
    *q++ = l->micro_batches;
    for (int s = 0; s <= l->pp; s++)
        *q++ = l->stage_start[s];
    for (size_t i = 0; i < n; i++)
        *q++ = l->worker[i];
    uint64_t tail[2] = {tide_collection_size(c), tide_collection_bytes(c)};
    int fd = -1;
    tide_status rc = open_file(path, O_WRONLY | O_CREAT | O_TRUNC, &fd);
    if (rc == TIDE_OK)
        rc = write_all(fd, MAGIC_LAY, 8, path);
    if (rc == TIDE_OK)
        rc = write_all(fd, w, words * sizeof *w, path);
    if (rc == TIDE_OK)
        rc = write_all(fd, tail, sizeof tail, path);
    if (fd >= 0 && close(fd) != 0 && rc == TIDE_OK)
        rc = tide_errorf(TIDE_ERR_IO, "closing %s: %s", path, strerror(errno));
    tide_free(w);
    return rc;
}

tide_status tide_mlp_ckpt_save(const tide_mlp_t *m, int32_t worker, const char *dir)
{
    if (m == NULL || dir == NULL || dir[0] == '\0')
        return tide_errorf(TIDE_ERR_INVALID, "tide_mlp_ckpt_save: no model or directory");
    if (!tide_mlp_active(m))
        return TIDE_OK;
    if (mkdir(dir, 0755) != 0 && errno != EEXIST)
        return tide_errorf(TIDE_ERR_IO, "cannot create checkpoint directory %s: %s", dir,
                           strerror(errno));
    const tide_layout_t *l = tide_mlp_layout(m);
    const tide_collection_t *c = tide_mlp_collection(m);
    size_t n = tide_collection_size(c);
    if (l->worker[0] == worker)
        TIDE_CHECK(save_layout(m, dir));
    char path[4096];
    snprintf(path, sizeof path, "%s/rank-%d.ckpt", dir, (int)worker);
    tide_status rc = TIDE_OK;
    uint64_t *sizes = tide_calloc(n + 1, sizeof *sizes);
    void *host = NULL;
    int fd = -1;
    TIDE_CHECK_ALLOC_GOTO(sizes, rc, out);
    sizes[0] = n;
    uint64_t biggest = 0;
    for (size_t i = 0; i < n; i++) {
        (void)tide_mlp_buffer(m, i, &sizes[i + 1]);
        biggest = sizes[i + 1] > biggest ? sizes[i + 1] : biggest;
    }
    host = tide_malloc(biggest ? biggest : 1);
    TIDE_CHECK_ALLOC_GOTO(host, rc, out);
    TIDE_CHECK_GOTO(open_file(path, O_WRONLY | O_CREAT | O_TRUNC, &fd), rc, out);
    TIDE_CHECK_GOTO(write_all(fd, MAGIC_RANK, 8, path), rc, out);
    TIDE_CHECK_GOTO(write_all(fd, sizes, (n + 1) * sizeof *sizes, path), rc, out);
    for (size_t i = 0; i < n; i++) {
        if (sizes[i + 1] == 0)
            continue;
        TIDE_CHECK_GOTO(tide_mlp_read(m, i, host, sizes[i + 1]), rc, out);
        TIDE_CHECK_GOTO(write_all(fd, host, sizes[i + 1], path), rc, out);
    }
out:
    if (fd >= 0 && close(fd) != 0 && rc == TIDE_OK)
        rc = tide_errorf(TIDE_ERR_IO, "closing %s: %s", path, strerror(errno));
    tide_free(host);
    tide_free(sizes);
    return rc;
}

/* ---- load ------------------------------------------------------------------------------ */

static tide_status load_layout(const tide_mlp_t *m, const char *dir, tide_layout_t **out)
{
    *out = NULL;
    char path[4096];
    snprintf(path, sizeof path, "%s/layout.ckpt", dir);
    int fd = -1;
    TIDE_CHECK(open_file(path, O_RDONLY, &fd));
    tide_status rc = TIDE_OK;
    tide_layout_t *l = NULL;
    char magic[8];
    int32_t head[5];
    uint64_t off = 0, tail[2];
    TIDE_CHECK_GOTO(read_at(fd, magic, 8, off, path), rc, out);
    off += 8;
    if (memcmp(magic, MAGIC_LAY, 8) != 0)
        TIDE_FAIL_GOTO(rc, out, TIDE_ERR_INVALID, "%s is not a train_mlp checkpoint layout", path);
    TIDE_CHECK_GOTO(read_at(fd, head, sizeof head, off, path), rc, out);
    off += sizeof head;
    if (head[0] < 1 || head[1] < 1 || head[2] < 1 || head[2] > 1 << 16 || head[0] > 1 << 16 ||
        head[1] > 1 << 16)
        TIDE_FAIL_GOTO(rc, out, TIDE_ERR_INVALID, "%s: implausible degrees dp %d tp %d pp %d", path,
                       head[0], head[1], head[2]);
    TIDE_CHECK_GOTO(tide_layout_new(&l, head[0], head[1], head[2], head[3], head[4]), rc, out);
    TIDE_CHECK_GOTO(read_at(fd, l->stage_start, (size_t)(l->pp + 1) * sizeof(int32_t), off, path),
                    rc, out);
    off += (size_t)(l->pp + 1) * sizeof(int32_t);
    TIDE_CHECK_GOTO(read_at(fd, l->worker, tide_layout_size(l) * sizeof(int32_t), off, path), rc,
                    out);
    off += tide_layout_size(l) * sizeof(int32_t);
    TIDE_CHECK_GOTO(read_at(fd, tail, sizeof tail, off, path), rc, out);
    const tide_collection_t *c = tide_mlp_collection(m);
    if (tail[0] != tide_collection_size(c) || tail[1] != tide_collection_bytes(c))
        TIDE_FAIL_GOTO(rc, out, TIDE_ERR_INVALID,
                       "%s holds a model of %llu tensors and %llu bytes; this one has %zu tensors "
                       "and %llu bytes (same --layers/--hidden/--ffn/--vocab/--zero1?)",
                       path, (unsigned long long)tail[0], (unsigned long long)tail[1],
                       tide_collection_size(c), (unsigned long long)tide_collection_bytes(c));
    TIDE_CHECK_GOTO(tide_layout_validate(l, c), rc, out);
    *out = l;
    l = NULL;
out:
    tide_layout_destroy(&l);
    close(fd);
    return rc;
}

/* An old rank's file, opened on first use, with where each tensor starts in it. */
typedef struct src_file {
    int fd;
    uint64_t *start; /* n_tensors file offsets */
} src_file;

static tide_status open_src(const tide_layout_t *old_l, const tide_collection_t *c, const char *dir,
                            int32_t w, src_file *f, char *path, size_t plen)
{
    snprintf(path, plen, "%s/rank-%d.ckpt", dir, (int)w);
    if (f->fd >= 0)
        return TIDE_OK;
    size_t n = tide_collection_size(c);
    int p = 0, d = 0, t = 0;
    TIDE_CHECK(tide_layout_find(old_l, w, &p, &d, &t));
    TIDE_CHECK(open_file(path, O_RDONLY, &f->fd));
    tide_status rc = TIDE_OK;
    uint64_t *sizes = tide_calloc(n + 1, sizeof *sizes);
    f->start = tide_calloc(n ? n : 1, sizeof *f->start);
    char magic[8];
    TIDE_CHECK_ALLOC_GOTO(sizes, rc, out);
    TIDE_CHECK_ALLOC_GOTO(f->start, rc, out);
    TIDE_CHECK_GOTO(read_at(f->fd, magic, 8, 0, path), rc, out);
    TIDE_CHECK_GOTO(read_at(f->fd, sizes, (n + 1) * sizeof *sizes, 8, path), rc, out);
    if (memcmp(magic, MAGIC_RANK, 8) != 0 || sizes[0] != n)
        TIDE_FAIL_GOTO(rc, out, TIDE_ERR_INVALID, "%s is not a shard file of this model", path);
    uint64_t off = 8 + (n + 1) * sizeof *sizes;
    for (size_t i = 0; i < n; i++) {
        if (sizes[i + 1] != tide_shard_bytes(old_l, c, i, p, d, t))
            TIDE_FAIL_GOTO(rc, out, TIDE_ERR_INVALID,
                           "%s: tensor %s has %llu bytes, the saved layout says %llu", path,
                           tide_collection_tensor(c, i)->name, (unsigned long long)sizes[i + 1],
                           (unsigned long long)tide_shard_bytes(old_l, c, i, p, d, t));
        f->start[i] = off;
        off += sizes[i + 1];
    }
    struct stat stt;
    if (fstat(f->fd, &stt) != 0 || (uint64_t)stt.st_size < off)
        TIDE_FAIL_GOTO(rc, out, TIDE_ERR_IO, "%s has %lld bytes, its header says %llu (truncated?)",
                       path, (long long)stt.st_size, (unsigned long long)off);
out:
    tide_free(sizes);
    if (rc != TIDE_OK) {
        close(f->fd);
        f->fd = -1;
        tide_free(f->start);
        f->start = NULL;
    }
    return rc;
}

tide_status tide_mlp_ckpt_load(tide_mlp_t *m, int32_t worker, const char *dir)
{
    if (m == NULL || dir == NULL || dir[0] == '\0')
        return tide_errorf(TIDE_ERR_INVALID, "tide_mlp_ckpt_load: no model or directory");
    if (!tide_mlp_active(m))
        return TIDE_OK;
    const tide_collection_t *c = tide_mlp_collection(m);
    const tide_layout_t *new_l = tide_mlp_layout(m);
    size_t n = tide_collection_size(c);
    tide_status rc = TIDE_OK;
    tide_layout_t *old_l = NULL;
    tide_plan_t *plan = NULL;
    src_file *files = NULL;
    void **host = NULL;
    size_t n_files = 0;
    char path[4096];
    TIDE_CHECK(load_layout(m, dir, &old_l));
    for (size_t i = 0; i < tide_layout_size(old_l); i++)
        n_files = (size_t)old_l->worker[i] + 1 > n_files ? (size_t)old_l->worker[i] + 1 : n_files;
    files = tide_calloc(n_files, sizeof *files);
    host = tide_calloc(n, sizeof *host);
    TIDE_CHECK_ALLOC_GOTO(files, rc, out);
    TIDE_CHECK_ALLOC_GOTO(host, rc, out);
    for (size_t w = 0; w < n_files; w++)
        files[w].fd = -1;
    for (size_t i = 0; i < n; i++) {
        uint64_t b = 0;
        (void)tide_mlp_buffer(m, i, &b);
        if (b == 0)
            continue;
        host[i] = tide_malloc(b);
        TIDE_CHECK_ALLOC_GOTO(host[i], rc, out);
    }
    /* The files are the old holders: the plan from the saved layout says which of
       their bytes land where in this worker's new shards. Old and new worker ids are
       independent (a relaunch), so this worker's "local copy" items read its old file. */
    TIDE_CHECK_GOTO(tide_reshard_plan_for(old_l, new_l, c, NULL, 0, worker, &plan), rc, out);
    for (size_t k = 0; k < plan->n; k++) {
        const tide_xfer *x = &plan->items[k];
        if (x->dst != worker)
            continue;
        if (x->src < 0 || (size_t)x->src >= n_files || x->tensor >= n || host[x->tensor] == NULL)
            TIDE_FAIL_GOTO(rc, out, TIDE_ERR_INTERNAL, "checkpoint plan item out of range");
        src_file *f = &files[x->src];
        TIDE_CHECK_GOTO(open_src(old_l, c, dir, x->src, f, path, sizeof path), rc, out);
        uint64_t base = f->start[x->tensor] + x->src_off;
        uint8_t *dst = (uint8_t *)host[x->tensor] + x->dst_off;
        if (x->count == 1 || (x->src_stride == x->run && x->dst_stride == x->run)) {
            TIDE_CHECK_GOTO(read_at(f->fd, dst, x->run * x->count, base, path), rc, out);
            continue;
        }
        for (uint64_t r = 0; r < x->count; r++)
            TIDE_CHECK_GOTO(
                read_at(f->fd, dst + r * x->dst_stride, x->run, base + r * x->src_stride, path), rc,
                out);
    }
    for (size_t i = 0; i < n; i++) {
        uint64_t b = 0;
        (void)tide_mlp_buffer(m, i, &b);
        if (b > 0)
            TIDE_CHECK_GOTO(tide_mlp_write(m, i, host[i], b), rc, out);
    }
    TIDE_INFO(SUBSYS, "worker %d: loaded step %lld from %s", (int)worker,
              (long long)tide_mlp_step_count(m), dir);
out:
    for (size_t w = 0; files != NULL && w < n_files; w++) {
        if (files[w].fd >= 0)
            close(files[w].fd);
        tide_free(files[w].start);
    }
    tide_free(files);
    for (size_t i = 0; host != NULL && i < n; i++)
        tide_free(host[i]);
    tide_free(host);
    tide_plan_destroy(&plan);
    tide_layout_destroy(&old_l);
    return rc;
}
