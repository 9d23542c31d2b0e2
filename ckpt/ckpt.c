/*
 * The checkpoint format (see ckpt.h): shard writer, checksum files, the manifest's
 * writer and strict reader, finding and pruning checkpoints under a root.
 *
 * Encodings are explicit little-endian whatever the host.
 *   shard-*.sum  "TIDESUM1", u64 save_id, u64 bytes, u32 chunk, u32 n_chunks,
 *                u64 hash[n_chunks], u64 XXH3-64 of all before
 *   MANIFEST     "TIDECKPT", u32 version, u32 chunk, i64 step, u64 save_id,
 *                i32 num_layers, u32 n_tensors, per tensor: name[96], u32 dtype,
 *                u32 ndim, i64 shape[4], i32 layer, u32 tp, u32 tp_dim, u32 tp_segments,
 *                u32 dp; i32 dp, tp, pp, micro_batches, i32 stage_start[pp + 1];
 *                u32 n_shards, per shard: i32 p, d, t, u64 bytes, u32 n_chunks,
 *                u64 hash[n_chunks]; u64 XXH3-64 of all before
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "ckpt/ckpt_int.h"
#include "core/alloc.h"
#include "core/clock.h"
#include "core/error.h"
#include "core/log.h"

#define SUBSYS    "ckpt"
#define MAGIC_MAN "TIDECKPT"
#define MAGIC_SUM "TIDESUM1"
#define MANIFEST  "MANIFEST"
#define MAN_MAX   (256u << 20) /* bytes: a manifest larger than this is not one */

/* ---- helpers -------------------------------------------------------------------------- */

void tide__ckpt_shard_name(int p, int d, int t, const char *ext, char *buf, size_t len)
{
    snprintf(buf, len, "shard-p%d-d%d-t%d.%s", p, d, t, ext);
}

tide_status tide__ckpt_write_all(int fd, const void *buf, uint64_t n, const char *path)
{
    const char *q = buf;
    while (n > 0) {
        ssize_t k = write(fd, q, n > (1u << 30) ? (1u << 30) : (size_t)n);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return tide_errorf(TIDE_ERR_IO, "writing %s: %s", path,
                               k == 0 ? "no progress" : tide__ckpt_strerror(errno));
        q += k;
        n -= (uint64_t)k;
    }
    return TIDE_OK;
}

tide_status tide__ckpt_read_at(int fd, void *buf, uint64_t n, uint64_t off, const char *path)
{
    char *q = buf;
    while (n > 0) {
        ssize_t k = pread(fd, q, n > (1u << 30) ? (1u << 30) : (size_t)n, (off_t)off);
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0)
            return tide_errorf(TIDE_ERR_IO, "reading %s: %s", path, tide__ckpt_strerror(errno));
        if (k == 0)
            return tide_errorf(TIDE_ERR_INVALID,
                               "%s is truncated: it ends at byte %" PRIu64
                               " where the manifest needs %" PRIu64 " more",
                               path, off, n);
        q += k;
        n -= (uint64_t)k;
        off += (uint64_t)k;
    }
    return TIDE_OK;
}

tide__ckpt_bound tide__ckpt_bound_in(int timeout_ms)
{
    tide__ckpt_bound b = {UINT64_MAX, 0};
    if (timeout_ms > 0) {
        b.until_ns = tide_now_ns() + (uint64_t)timeout_ms * 1000000ull;
        b.ms = timeout_ms;
    }
    return b;
}

/* TIDE_ERR_TIMEOUT once b has passed: doing what names the file being written. */
static tide_status check_bound(tide__ckpt_bound b, const char *doing)
{
    if (tide_now_ns() >= b.until_ns)
        return tide_errorf(TIDE_ERR_TIMEOUT,
                           "%s: the save took longer than its bound of %d ms (a slow or stuck "
                           "disk; TIDE_CKPT_TIMEOUT_MS); the checkpoint stays incomplete",
                           doing, b.ms);
    return TIDE_OK;
}

uint64_t tide__ckpt_hash(const void *buf, uint64_t n)
{
    return (uint64_t)XXH3_64bits(buf, (size_t)n);
}

void tide__ckpt_fault(const char *point)
{
    static int shards_written;
    const char *f = getenv("TIDE_CKPT_FAULT");
    if (f == NULL)
        return;
    if (strcmp(point, "shard") == 0) {
        shards_written++;
        if (strncmp(f, "shards:", 7) == 0 && atoi(f + 7) == shards_written) {
            TIDE_WARN(SUBSYS, "TIDE_CKPT_FAULT=%s: exiting after %d shards", f, shards_written);
            _exit(86);
        }
    } else if (strcmp(point, f) == 0) {
        TIDE_WARN(SUBSYS, "TIDE_CKPT_FAULT=%s: exiting", f);
        _exit(86);
    }
}

/* ---- who writes what ------------------------------------------------------------------------ */

int tide_ckpt_saves(const tide_layout_t *l, const tide_collection_t *c, size_t i, int p, int d,
                    int t)
{
    const tide_tensor_desc *desc = tide_collection_tensor(c, i);
    if (desc->dp != TIDE_DP_SHARDED && d != 0)
        return 0;
    if (desc->tp != TIDE_TP_SPLIT && t != 0)
        return 0;
    if (desc->layer == TIDE_LAYER_ALL && p != 0)
        return 0;
    return tide_shard_bytes(l, c, i, p, d, t) > 0;
}

uint64_t tide__ckpt_tensor_offset(const tide_layout_t *l, const tide_collection_t *c, size_t i,
                                  int p, int d, int t)
{
    uint64_t off = 0;
    for (size_t j = 0; j < i; j++)
        if (tide_ckpt_saves(l, c, j, p, d, t))
            off += tide_shard_bytes(l, c, j, p, d, t);
    return off;
}

uint64_t tide_ckpt_shard_size(const tide_layout_t *l, const tide_collection_t *c, int p, int d,
                              int t)
{
    return tide__ckpt_tensor_offset(l, c, tide_collection_size(c), p, d, t);
}

void tide_ckpt_step_dir(const char *root, int64_t step, char *buf, size_t len)
{
    snprintf(buf, len, "%s/step-%012" PRId64, root, step);
}

/* ---- little-endian encoding ---------------------------------------------------------------- */

typedef struct enc {
    uint8_t *buf;
    size_t len, cap;
    int oom;
} enc;

static void put(enc *e, const void *src, size_t n)
{
    if (e->oom)
        return;
    if (e->len + n > e->cap) {
        size_t cap = e->cap ? e->cap : 4096;
        while (cap < e->len + n)
            cap *= 2;
        uint8_t *b = tide_realloc(e->buf, cap);
        if (b == NULL) {
            e->oom = 1;
            return;
        }
        e->buf = b;
        e->cap = cap;
    }
    memcpy(e->buf + e->len, src, n);
    e->len += n;
}

static void put_u32(enc *e, uint32_t v)
{
    uint8_t b[4];
    for (int k = 0; k < 4; k++)
        b[k] = (uint8_t)(v >> (8 * k));
    put(e, b, 4);
}

static void put_u64(enc *e, uint64_t v)
{
    uint8_t b[8];
    for (int k = 0; k < 8; k++)
        b[k] = (uint8_t)(v >> (8 * k));
    put(e, b, 8);
}

typedef struct dec {
    const uint8_t *buf;
    size_t len, off;
    int short_read;
} dec;

static int get(dec *x, void *dst, size_t n)
{
    if (x->short_read || x->len - x->off < n) {
        x->short_read = 1;
        memset(dst, 0, n);
        return 0;
    }
    memcpy(dst, x->buf + x->off, n);
    x->off += n;
    return 1;
}

static uint32_t get_u32(dec *x)
{
    uint8_t b[4];
    get(x, b, 4);
    uint32_t v = 0;
    for (int k = 0; k < 4; k++)
        v |= (uint32_t)b[k] << (8 * k);
    return v;
}

static uint64_t get_u64(dec *x)
{
    uint8_t b[8];
    get(x, b, 8);
    uint64_t v = 0;
    for (int k = 0; k < 8; k++)
        v |= (uint64_t)b[k] << (8 * k);
    return v;
}

static int32_t get_i32(dec *x)
{
    return (int32_t)get_u32(x);
}

/* ---- writing a shard ------------------------------------------------------------------- */

#define PIECE_BYTES (64u << 20) /* bytes written between two checks of the save's bound */

/* Writes the tensors (p, d, t) saves to fd, in collection order, and their chunk hashes into
   crc; checks the bound b between pieces. */
static tide_status write_tensors(int fd, const char *path, const tide_layout_t *l,
                                 const tide_collection_t *c, int p, int d, int t,
                                 const void *const *bufs, uint64_t *crc, tide__ckpt_bound b)
{
    XXH3_state_t *hs = XXH3_createState();
    if (hs == NULL || XXH3_64bits_reset(hs) != XXH_OK) {
        XXH3_freeState(hs);
        return tide_errorf(TIDE_ERR_NOMEM, "out of memory for %s's checksums", path);
    }
    const uint64_t chunk = TIDE_CKPT_CHUNK_BYTES;
    tide_status rc = TIDE_OK;
    /* The hash of chunk k runs over bytes [k * chunk, (k + 1) * chunk) of the file, which
       may span tensors: keep the running hash state and where in the chunk we are. */
    uint64_t pos = 0;
    for (size_t i = 0; i < tide_collection_size(c) && rc == TIDE_OK; i++) {
        if (!tide_ckpt_saves(l, c, i, p, d, t))
            continue;
        uint64_t n = tide_shard_bytes(l, c, i, p, d, t);
        if (bufs[i] == NULL)
            TIDE_FAIL_GOTO(rc, out, TIDE_ERR_INVALID, "writing %s: no buffer for tensor %s", path,
                           tide_collection_tensor(c, i)->name);
        const uint8_t *q = bufs[i];
        while (n > 0) {
            uint64_t piece = n < PIECE_BYTES ? n : PIECE_BYTES;
            TIDE_CHECK_GOTO(check_bound(b, path), rc, out);
            TIDE_CHECK_GOTO(tide__ckpt_write_all(fd, q, piece, path), rc, out);
            for (uint64_t left = piece; left > 0;) {
                uint64_t room = chunk - pos % chunk;
                uint64_t k = left < room ? left : room;
                (void)XXH3_64bits_update(hs, q, (size_t)k);
                pos += k;
                q += k;
                left -= k;
                n -= k;
                if (pos % chunk == 0) {
                    crc[pos / chunk - 1] = (uint64_t)XXH3_64bits_digest(hs);
                    (void)XXH3_64bits_reset(hs);
                }
            }
        }
    }
    if (pos % chunk != 0)
        crc[pos / chunk] = (uint64_t)XXH3_64bits_digest(hs);
out:
    XXH3_freeState(hs);
    return rc;
}

/* The shard file and its checksum file (see tide__ckpt_write_shard_at). */
static tide_status write_shard_files(int dir, const char *dpath, const tide_layout_t *l,
                                     const tide_collection_t *c, int p, int d, int t,
                                     const void *const *bufs, uint64_t save_id, uint64_t total,
                                     tide__ckpt_bound b)
{
    char name[64], path[TIDE_CKPT_PATH_MAX + 128];
    tide__ckpt_shard_name(p, d, t, "bin", name, sizeof name);
    snprintf(path, sizeof path, "%s/%s", dpath, name);
    uint32_t chunk = TIDE_CKPT_CHUNK_BYTES;
    uint32_t n_chunks = (uint32_t)((total + chunk - 1) / chunk);
    uint64_t *crc = tide_calloc(n_chunks ? n_chunks : 1, sizeof *crc);
    if (crc == NULL)
        return tide_errorf(TIDE_ERR_NOMEM, "out of memory for %s's checksums", path);
    int fd = -1;
    tide_status rc = TIDE_OK;
    enc e = {0};
    TIDE_CHECK_GOTO(tide__ckpt_create(dir, dpath, name, &fd), rc, out);
    TIDE_CHECK_GOTO(write_tensors(fd, path, l, c, p, d, t, bufs, crc, b), rc, out);
    if (fsync(fd) != 0)
        TIDE_FAIL_GOTO(rc, out, TIDE_ERR_IO, "fsync of %s: %s", path, tide__ckpt_strerror(errno));
    if (close(fd) != 0) {
        fd = -1;
        TIDE_FAIL_GOTO(rc, out, TIDE_ERR_IO, "closing %s: %s", path, tide__ckpt_strerror(errno));
    }
    fd = -1;
    TIDE_CHECK_GOTO(check_bound(b, path), rc, out);
    put(&e, MAGIC_SUM, 8);
    put_u64(&e, save_id);
    put_u64(&e, total);
    put_u32(&e, chunk);
    put_u32(&e, n_chunks);
    for (uint32_t k = 0; k < n_chunks; k++)
        put_u64(&e, crc[k]);
    if (!e.oom)
        put_u64(&e, tide__ckpt_hash(e.buf, e.len));
    if (e.oom)
        TIDE_FAIL_GOTO(rc, out, TIDE_ERR_NOMEM, "out of memory encoding %s's checksums", path);
    tide__ckpt_shard_name(p, d, t, "sum", name, sizeof name);
    /* the .sum renamed into place says: this shard is complete and on disk */
    TIDE_CHECK_GOTO(tide__ckpt_write_atomic(dir, dpath, name, e.buf, e.len, NULL), rc, out);
    tide__ckpt_fault("shard");
out:
    if (fd >= 0)
        close(fd);
    tide_free(e.buf);
    tide_free(crc);
    return rc;
}

/* After a failed shard write: its partial file goes (it can never be published, and on a
   full disk its blocks are what the next save needs), and a note "save <id>: <reason>"
   tells the publisher not to wait for it. Best effort (the publisher's bound still holds);
   the failure's own message is kept. */
static void note_failure(int dir, const char *dpath, int p, int d, int t, uint64_t save_id,
                         tide_status rc)
{
    char msg[700], note[760], name[64];
    snprintf(msg, sizeof msg, "%s", tide_last_error());
    tide__ckpt_shard_name(p, d, t, "bin", name, sizeof name);
    (void)tide__ckpt_remove(dir, dpath, name);
    int n = snprintf(note, sizeof note, "save %016" PRIx64 ": %s\n", save_id, msg);
    tide__ckpt_shard_name(p, d, t, "failed", name, sizeof name);
    if (tide__ckpt_write_atomic(dir, dpath, name, note, (size_t)n < sizeof note ? (size_t)n : 0,
                                NULL) != TIDE_OK)
        TIDE_DEBUG(SUBSYS, "no failure note for %s/%s: %s", dpath, name, tide_last_error());
    tide_errorf(rc, "%s", msg);
}

tide_status tide__ckpt_write_shard_at(int dir, const char *dpath, const tide_layout_t *l,
                                      const tide_collection_t *c, int p, int d, int t,
                                      const void *const *bufs, uint64_t save_id, tide__ckpt_bound b)
{
    uint64_t total = tide_ckpt_shard_size(l, c, p, d, t);
    if (total == 0)
        return TIDE_OK;
    char name[64];
    /* a complete checkpoint of this step saved before (a job rolled back past it saves it
       again): incomplete from now on, until this save publishes, never complete-looking
       over shards being rewritten */
    TIDE_CHECK(tide__ckpt_remove(dir, dpath, MANIFEST));
    /* a crashed or failed attempt's checksums and note must not describe this attempt */
    tide__ckpt_shard_name(p, d, t, "sum", name, sizeof name);
    TIDE_CHECK(tide__ckpt_remove(dir, dpath, name));
    tide__ckpt_shard_name(p, d, t, "failed", name, sizeof name);
    TIDE_CHECK(tide__ckpt_remove(dir, dpath, name));
    tide_status rc = write_shard_files(dir, dpath, l, c, p, d, t, bufs, save_id, total, b);
    if (rc != TIDE_OK)
        note_failure(dir, dpath, p, d, t, save_id, rc);
    return rc;
}

tide_status tide_ckpt_write_shard(const char *dir, const tide_layout_t *l,
                                  const tide_collection_t *c, int p, int d, int t,
                                  const void *const *bufs, uint64_t save_id)
{
    if (dir == NULL || l == NULL || c == NULL || bufs == NULL)
        return tide_errorf(TIDE_ERR_INVALID, "tide_ckpt_write_shard: NULL argument");
    if (tide_ckpt_shard_size(l, c, p, d, t) == 0)
        return TIDE_OK;
    int fd = -1;
    TIDE_CHECK(tide__ckpt_open_ckdir(dir, 1, &fd));
    tide_status rc =
        tide__ckpt_write_shard_at(fd, dir, l, c, p, d, t, bufs, save_id, tide__ckpt_bound_in(0));
    close(fd);
    return rc;
}

/* ---- publishing --------------------------------------------------------------------------- */

/* Parses checksum file name of dir into *bytes / crc (caller frees *crc);
   TIDE_ERR_NOT_FOUND when absent or of another save_id (a crashed attempt's, not this
   save's). */
static tide_status read_sum(int dir, const char *dpath, const char *name, uint64_t save_id,
                            uint64_t *bytes, uint32_t *n_chunks, uint64_t **crc)
{
    uint8_t *b = NULL;
    size_t len = 0;
    *crc = NULL;
    char path[TIDE_CKPT_PATH_MAX + 128];
    snprintf(path, sizeof path, "%s/%s", dpath, name);
    TIDE_CHECK(tide__ckpt_read_whole(dir, dpath, name, MAN_MAX, &b, &len));
    tide_status rc = TIDE_OK;
    dec x = {b, len, 0, 0};
    char magic[8];
    get(&x, magic, 8);
    uint64_t id = get_u64(&x);
    *bytes = get_u64(&x);
    uint32_t chunk = get_u32(&x);
    *n_chunks = get_u32(&x);
    if (x.short_read || memcmp(magic, MAGIC_SUM, 8) != 0 || chunk != TIDE_CKPT_CHUNK_BYTES ||
        len != 8 + 8 + 8 + 4 + 4 + 8 * (size_t)*n_chunks + 8 ||
        tide__ckpt_hash(b, len - 8) != (x.off = len - 8, get_u64(&x)))
        TIDE_FAIL_GOTO(rc, out, TIDE_ERR_INVALID, "%s is not a valid checksum file", path);
    if (id != save_id)
        TIDE_FAIL_GOTO(rc, out, TIDE_ERR_NOT_FOUND, "%s belongs to another save", path);
    *crc = tide_calloc(*n_chunks ? *n_chunks : 1, sizeof **crc);
    TIDE_CHECK_ALLOC_GOTO(*crc, rc, out);
    x.off = 8 + 8 + 8 + 4 + 4;
    for (uint32_t k = 0; k < *n_chunks; k++)
        (*crc)[k] = get_u64(&x);
out:
    tide_free(b);
    return rc;
}

static void put_layout_and_collection(enc *e, const tide_layout_t *l, const tide_collection_t *c)
{
    put_u32(e, (uint32_t)tide_collection_num_layers(c));
    put_u32(e, (uint32_t)tide_collection_size(c));
    for (size_t i = 0; i < tide_collection_size(c); i++) {
        const tide_tensor_desc *t = tide_collection_tensor(c, i);
        char name[TIDE_NAME_MAX];
        memset(name, 0, sizeof name);
        snprintf(name, sizeof name, "%s", t->name);
        put(e, name, sizeof name);
        put_u32(e, (uint32_t)t->dtype);
        put_u32(e, (uint32_t)t->ndim);
        for (int k = 0; k < TIDE_MAX_DIMS; k++)
            put_u64(e, (uint64_t)(k < t->ndim ? t->shape[k] : 0));
        put_u32(e, (uint32_t)t->layer);
        put_u32(e, (uint32_t)t->tp);
        put_u32(e, (uint32_t)t->tp_dim);
        put_u32(e, (uint32_t)t->tp_segments);
        put_u32(e, (uint32_t)t->dp);
    }
    put_u32(e, (uint32_t)l->dp);
    put_u32(e, (uint32_t)l->tp);
    put_u32(e, (uint32_t)l->pp);
    put_u32(e, (uint32_t)l->micro_batches);
    for (int s = 0; s <= l->pp; s++)
        put_u32(e, (uint32_t)l->stage_start[s]);
}

/* 1 when the writer of shard (p, d, t) left a note that it failed this save; its reason
   into why. */
static int failed_note(int dir, const char *dpath, int p, int d, int t, uint64_t save_id, char *why,
                       size_t len)
{
    char name[64], want[32];
    tide__ckpt_shard_name(p, d, t, "failed", name, sizeof name);
    struct stat st;
    if (fstatat(dir, name, &st, AT_SYMLINK_NOFOLLOW) != 0)
        return 0;
    uint8_t *b = NULL;
    size_t n = 0;
    if (tide__ckpt_read_whole(dir, dpath, name, 4096, &b, &n) != TIDE_OK) {
        tide_error_clear(); /* a note being renamed into place, or not one: keep waiting */
        return 0;
    }
    size_t w = (size_t)snprintf(want, sizeof want, "save %016" PRIx64 ": ", save_id);
    int ours = n >= w && memcmp(b, want, w) == 0;
    if (ours) {
        size_t k = n - w;
        while (k > 0 && b[w + k - 1] == '\n')
            k--;
        snprintf(why, len, "%.*s", (int)k, (const char *)b + w);
    }
    tide_free(b);
    return ours;
}

/* Waits until the checksum file of shard (p, d, t) of this save is in place, its writer
   noted a failure, or b passes; its size and hashes into *bytes, *n_chunks, *crc. */
static tide_status wait_shard(int dir, const char *dpath, int p, int d, int t, uint64_t save_id,
                              tide__ckpt_bound b, uint64_t *bytes, uint32_t *n_chunks,
                              uint64_t **crc)
{
    char name[64], why[600];
    tide__ckpt_shard_name(p, d, t, "sum", name, sizeof name);
    uint64_t nap_ms = 2; /* doubling to 50: quick when shards land together, cheap when not */
    for (;;) {
        tide_status rc = read_sum(dir, dpath, name, save_id, bytes, n_chunks, crc);
        if (rc != TIDE_ERR_NOT_FOUND)
            return rc;
        if (failed_note(dir, dpath, p, d, t, save_id, why, sizeof why))
            return tide_errorf(TIDE_ERR_IO,
                               "checkpoint %s: the writer of shard (p %d, d %d, t %d) failed: "
                               "%s; the checkpoint stays incomplete",
                               dpath, p, d, t, why);
        if (tide_now_ns() >= b.until_ns)
            return tide_errorf(TIDE_ERR_TIMEOUT,
                               "checkpoint %s: shard %s was not written within %d ms; the "
                               "checkpoint stays incomplete",
                               dpath, name, b.ms);
        tide_sleep_ms(nap_ms);
        nap_ms = nap_ms * 2 < 50 ? nap_ms * 2 : 50;
    }
}

tide_status tide__ckpt_publish_at(int dir, const char *dpath, const tide_layout_t *l,
                                  const tide_collection_t *c, int64_t step, uint64_t save_id,
                                  tide__ckpt_bound b)
{
    enc e = {0};
    tide_status rc = TIDE_OK;
    put(&e, MAGIC_MAN, 8);
    put_u32(&e, TIDE_CKPT_VERSION);
    put_u32(&e, TIDE_CKPT_CHUNK_BYTES);
    put_u64(&e, (uint64_t)step);
    put_u64(&e, save_id);
    put_layout_and_collection(&e, l, c);
    uint32_t n_shards = 0;
    for (int p = 0; p < l->pp; p++)
        for (int d = 0; d < l->dp; d++)
            for (int t = 0; t < l->tp; t++)
                n_shards += tide_ckpt_shard_size(l, c, p, d, t) > 0;
    put_u32(&e, n_shards);
    for (int p = 0; p < l->pp; p++)
        for (int d = 0; d < l->dp; d++)
            for (int t = 0; t < l->tp; t++) {
                uint64_t want = tide_ckpt_shard_size(l, c, p, d, t);
                if (want == 0)
                    continue;
                uint64_t bytes = 0;
                uint32_t n_chunks = 0;
                uint64_t *crc = NULL;
                rc = wait_shard(dir, dpath, p, d, t, save_id, b, &bytes, &n_chunks, &crc);
                if (rc == TIDE_OK && bytes != want)
                    rc = tide_errorf(TIDE_ERR_INVALID,
                                     "%s: shard (p %d, d %d, t %d) says %" PRIu64
                                     " bytes, the layout %" PRIu64,
                                     dpath, p, d, t, bytes, want);
                if (rc != TIDE_OK) {
                    tide_free(crc);
                    goto out;
                }
                put_u32(&e, (uint32_t)p);
                put_u32(&e, (uint32_t)d);
                put_u32(&e, (uint32_t)t);
                put_u64(&e, bytes);
                put_u32(&e, n_chunks);
                for (uint32_t k = 0; k < n_chunks; k++)
                    put_u64(&e, crc[k]);
                tide_free(crc);
            }
    if (!e.oom)
        put_u64(&e, tide__ckpt_hash(e.buf, e.len));
    if (e.oom)
        TIDE_FAIL_GOTO(rc, out, TIDE_ERR_NOMEM, "out of memory encoding %s's manifest", dpath);
    /* every shard is fsynced and its entry too (each writer fsynced dir after its .sum) */
    TIDE_CHECK_GOTO(tide__ckpt_write_atomic(dir, dpath, MANIFEST, e.buf, e.len, "manifest"), rc,
                    out);
    /* the manifest holds the checksums now; failure notes of earlier attempts are moot */
    for (int p = 0; p < l->pp; p++)
        for (int d = 0; d < l->dp; d++)
            for (int t = 0; t < l->tp; t++) {
                char name[64];
                tide__ckpt_shard_name(p, d, t, "sum", name, sizeof name);
                (void)unlinkat(dir, name, 0);
                tide__ckpt_shard_name(p, d, t, "failed", name, sizeof name);
                (void)unlinkat(dir, name, 0);
            }
    TIDE_INFO(SUBSYS, "published checkpoint of step %lld in %s", (long long)step, dpath);
out:
    tide_free(e.buf);
    return rc;
}

tide_status tide_ckpt_publish(const char *dir, const tide_layout_t *l, const tide_collection_t *c,
                              int64_t step, uint64_t save_id, int timeout_ms)
{
    if (dir == NULL || l == NULL || c == NULL)
        return tide_errorf(TIDE_ERR_INVALID, "tide_ckpt_publish: NULL argument");
    int fd = -1;
    TIDE_CHECK(tide__ckpt_open_ckdir(dir, 1, &fd));
    /* timeout_ms <= 0: one look, no wait */
    tide__ckpt_bound b = {tide_now_ns(), 0};
    if (timeout_ms > 0)
        b = tide__ckpt_bound_in(timeout_ms);
    tide_status rc = tide__ckpt_publish_at(fd, dir, l, c, step, save_id, b);
    close(fd);
    return rc;
}

/* ---- reading the manifest ------------------------------------------------------------------ */

tide_status tide_ckpt_open(tide_ckpt_t **out, const char *dir)
{
    if (out == NULL || dir == NULL)
        return tide_errorf(TIDE_ERR_INVALID, "tide_ckpt_open: NULL argument");
    *out = NULL;
    char path[TIDE_CKPT_PATH_MAX + 128];
    snprintf(path, sizeof path, "%s/%s", dir, MANIFEST);
    uint8_t *b = NULL;
    size_t len = 0;
    int fd = -1;
    TIDE_CHECK(tide__ckpt_open_ckdir(dir, 0, &fd));
    tide_status rc = tide__ckpt_read_whole(fd, dir, MANIFEST, MAN_MAX, &b, &len);
    if (rc != TIDE_OK) {
        close(fd);
        if (rc == TIDE_ERR_NOT_FOUND)
            return tide_errorf(TIDE_ERR_NOT_FOUND,
                               "%s does not exist: %s is not a complete checkpoint", path, dir);
        return rc;
    }
    tide_ckpt_t *ck = tide_calloc(1, sizeof *ck);
    if (ck == NULL)
        close(fd);
    TIDE_CHECK_ALLOC_GOTO(ck, rc, out);
    ck->fd = fd; /* every shard is read from the directory this manifest was read from */
    snprintf(ck->dir, sizeof ck->dir, "%s", dir);
    dec x = {b, len, 0, 0};
    char magic[8];
    get(&x, magic, 8);
    if (x.short_read || memcmp(magic, MAGIC_MAN, 8) != 0)
        TIDE_FAIL_GOTO(rc, out, TIDE_ERR_INVALID, "%s is not a tide checkpoint manifest", path);
    uint32_t version = get_u32(&x);
    if (version != TIDE_CKPT_VERSION)
        TIDE_FAIL_GOTO(rc, out, TIDE_ERR_INVALID,
                       "%s is format version %u; this tide reads version %d", path, version,
                       TIDE_CKPT_VERSION);
    uint64_t stored = 0;
    for (int k = 0; len >= 8 + 4 + 8 && k < 8; k++)
        stored |= (uint64_t)b[len - 8 + (size_t)k] << (8 * k);
    if (len < 8 + 4 + 8 || tide__ckpt_hash(b, len - 8) != stored)
        TIDE_FAIL_GOTO(rc, out, TIDE_ERR_INVALID,
                       "%s is corrupted or truncated (its checksum does not match)", path);
    x.len = len - 8;
    ck->chunk = get_u32(&x);
    ck->step = (int64_t)get_u64(&x);
    ck->save_id = get_u64(&x);
    if (ck->chunk == 0 || ck->chunk > (1u << 30))
        TIDE_FAIL_GOTO(rc, out, TIDE_ERR_INVALID, "%s: bad chunk size %u", path, ck->chunk);
    int32_t num_layers = get_i32(&x);
    uint32_t n_tensors = get_u32(&x);
    if (x.short_read || num_layers < 0 || n_tensors > x.len / 64)
        TIDE_FAIL_GOTO(rc, out, TIDE_ERR_INVALID, "%s: bad collection header", path);
    TIDE_CHECK_GOTO(tide_collection_new(&ck->coll, num_layers), rc, out);
    for (uint32_t i = 0; i < n_tensors; i++) {
        tide_tensor_desc t;
        memset(&t, 0, sizeof t);
        get(&x, t.name, sizeof t.name);
        t.name[TIDE_NAME_MAX - 1] = '\0';
        t.dtype = (tide_dtype)get_u32(&x);
        t.ndim = get_i32(&x);
        for (int k = 0; k < TIDE_MAX_DIMS; k++)
            t.shape[k] = (int64_t)get_u64(&x);
        t.layer = get_i32(&x);
        t.tp = (tide_tp_rule)get_u32(&x);
        t.tp_dim = get_i32(&x);
        t.tp_segments = get_i32(&x);
        t.dp = (tide_dp_rule)get_u32(&x);
        if (x.short_read)
            TIDE_FAIL_GOTO(rc, out, TIDE_ERR_INVALID, "%s is truncated in tensor %u", path, i);
        rc = tide_collection_add(ck->coll, &t);
        if (rc != TIDE_OK)
            TIDE_FAIL_GOTO(rc, out, TIDE_ERR_INVALID, "%s: tensor %u: %s", path, i,
                           tide_last_error());
    }
    int32_t deg[4];
    for (int k = 0; k < 4; k++)
        deg[k] = get_i32(&x);
    if (x.short_read || deg[0] < 1 || deg[1] < 1 || deg[2] < 1 || deg[3] < 1 ||
        deg[0] > (1 << 16) || deg[1] > (1 << 16) || deg[2] > (1 << 16) ||
        (int64_t)deg[0] * deg[1] * deg[2] > (1 << 20))
        TIDE_FAIL_GOTO(rc, out, TIDE_ERR_INVALID, "%s: bad layout degrees", path);
    TIDE_CHECK_GOTO(tide_layout_new(&ck->layout, deg[0], deg[1], deg[2], num_layers, deg[3]), rc,
                    out);
    {
        int *starts = tide_calloc((size_t)deg[2] + 1, sizeof *starts);
        TIDE_CHECK_ALLOC_GOTO(starts, rc, out);
        for (int s = 0; s <= deg[2]; s++)
            starts[s] = get_i32(&x);
        rc = x.short_read ? TIDE_ERR_INVALID : tide_layout_set_stages(ck->layout, starts);
        tide_free(starts);
        if (rc != TIDE_OK)
            TIDE_FAIL_GOTO(rc, out, TIDE_ERR_INVALID, "%s: bad stages", path);
    }
    rc = tide_layout_validate(ck->layout, ck->coll);
    if (rc != TIDE_OK)
        TIDE_FAIL_GOTO(rc, out, TIDE_ERR_INVALID, "%s: %s", path, tide_last_error());
    const tide_layout_t *l = ck->layout;
    size_t n_coord = tide_layout_size(l);
    ck->shard_of = tide_calloc(n_coord, sizeof *ck->shard_of);
    TIDE_CHECK_ALLOC_GOTO(ck->shard_of, rc, out);
    for (size_t k = 0; k < n_coord; k++)
        ck->shard_of[k] = -1;
    uint32_t n_shards = get_u32(&x);
    if (x.short_read || n_shards > n_coord)
        TIDE_FAIL_GOTO(rc, out, TIDE_ERR_INVALID, "%s: bad shard count %u", path, n_shards);
    ck->shards = tide_calloc(n_shards ? n_shards : 1, sizeof *ck->shards);
    TIDE_CHECK_ALLOC_GOTO(ck->shards, rc, out);
    for (uint32_t k = 0; k < n_shards; k++) {
        tide__ckpt_shard *s = &ck->shards[k];
        s->p = get_i32(&x);
        s->d = get_i32(&x);
        s->t = get_i32(&x);
        s->bytes = get_u64(&x);
        s->n_chunks = get_u32(&x);
        if (x.short_read || s->p < 0 || s->p >= l->pp || s->d < 0 || s->d >= l->dp || s->t < 0 ||
            s->t >= l->tp)
            TIDE_FAIL_GOTO(rc, out, TIDE_ERR_INVALID, "%s: bad shard record %u", path, k);
        size_t idx = tide_layout_index(l, s->p, s->d, s->t);
        uint64_t want = tide_ckpt_shard_size(l, ck->coll, s->p, s->d, s->t);
        if (ck->shard_of[idx] >= 0 || want == 0 || s->bytes != want ||
            s->n_chunks != (want + ck->chunk - 1) / ck->chunk)
            TIDE_FAIL_GOTO(rc, out, TIDE_ERR_INVALID,
                           "%s: shard (p %d, d %d, t %d) of %" PRIu64
                           " bytes does not fit the saved layout (%" PRIu64 " bytes)",
                           path, s->p, s->d, s->t, s->bytes, want);
        if ((uint64_t)s->n_chunks * 8 > x.len - x.off)
            TIDE_FAIL_GOTO(rc, out, TIDE_ERR_INVALID, "%s is truncated in shard %u", path, k);
        s->hash = tide_calloc(s->n_chunks ? s->n_chunks : 1, sizeof *s->hash);
        TIDE_CHECK_ALLOC_GOTO(s->hash, rc, out);
        for (uint32_t j = 0; j < s->n_chunks; j++)
            s->hash[j] = get_u64(&x);
        tide__ckpt_shard_name(s->p, s->d, s->t, "bin", s->file, sizeof s->file);
        ck->shard_of[idx] = (int)k;
        ck->n_shards++;
    }
    for (size_t k = 0; k < n_coord; k++) {
        int p = (int)(k / ((size_t)l->dp * (size_t)l->tp));
        int d = (int)(k / (size_t)l->tp % (size_t)l->dp), t = (int)(k % (size_t)l->tp);
        if (ck->shard_of[k] < 0 && tide_ckpt_shard_size(l, ck->coll, p, d, t) > 0)
            TIDE_FAIL_GOTO(rc, out, TIDE_ERR_INVALID,
                           "%s lists no shard for (p %d, d %d, t %d), which the layout needs", path,
                           p, d, t);
    }
    if (x.off != x.len || x.short_read)
        TIDE_FAIL_GOTO(rc, out, TIDE_ERR_INVALID, "%s: %zu unexpected bytes after the shards", path,
                       x.len - x.off);
    *out = ck;
    ck = NULL;
out:
    tide_free(b);
    tide_ckpt_close(&ck);
    return rc;
}

void tide_ckpt_close(tide_ckpt_t **self_p)
{
    if (self_p == NULL || *self_p == NULL)
        return;
    tide_ckpt_t *ck = *self_p;
    for (size_t k = 0; ck->shards != NULL && k < ck->n_shards; k++)
        tide_free(ck->shards[k].hash);
    tide_free(ck->shards);
    tide_free(ck->shard_of);
    tide_collection_destroy(&ck->coll);
    tide_layout_destroy(&ck->layout);
    if (ck->fd >= 0)
        close(ck->fd);
    tide_free(ck);
    *self_p = NULL;
}

int64_t tide_ckpt_step(const tide_ckpt_t *ck)
{
    return ck->step;
}

const tide_collection_t *tide_ckpt_collection(const tide_ckpt_t *ck)
{
    return ck->coll;
}

const tide_layout_t *tide_ckpt_layout(const tide_ckpt_t *ck)
{
    return ck->layout;
}

const char *tide_ckpt_dir(const tide_ckpt_t *ck)
{
    return ck->dir;
}

size_t tide_ckpt_num_shards(const tide_ckpt_t *ck)
{
    return ck->n_shards;
}

void tide_ckpt_shard_info(const tide_ckpt_t *ck, size_t k, int *p, int *d, int *t, uint64_t *bytes,
                          const char **file)
{
    const tide__ckpt_shard *s = &ck->shards[k];
    *p = s->p;
    *d = s->d;
    *t = s->t;
    *bytes = s->bytes;
    *file = s->file;
}

tide_status tide_ckpt_verify(const tide_ckpt_t *ck)
{
    uint8_t *buf = tide_malloc(ck->chunk);
    if (buf == NULL)
        return tide_errorf(TIDE_ERR_NOMEM, "out of memory verifying %s", ck->dir);
    tide_status rc = TIDE_OK;
    for (size_t k = 0; k < ck->n_shards && rc == TIDE_OK; k++) {
        const tide__ckpt_shard *s = &ck->shards[k];
        char path[TIDE_CKPT_PATH_MAX + 128];
        snprintf(path, sizeof path, "%s/%s", ck->dir, s->file);
        int fd = -1;
        rc = tide__ckpt_open_read(ck->fd, ck->dir, s->file, &fd);
        if (rc != TIDE_OK)
            break;
        struct stat st;
        if (fstat(fd, &st) != 0 || (uint64_t)st.st_size != s->bytes)
            rc = tide_errorf(TIDE_ERR_INVALID,
                             "%s has %lld bytes; the manifest says %" PRIu64 " (truncated?)", path,
                             (long long)st.st_size, s->bytes);
        for (uint32_t j = 0; j < s->n_chunks && rc == TIDE_OK; j++) {
            uint64_t off = (uint64_t)j * ck->chunk;
            uint64_t n = s->bytes - off < ck->chunk ? s->bytes - off : ck->chunk;
            rc = tide__ckpt_read_at(fd, buf, n, off, path);
            if (rc == TIDE_OK && tide__ckpt_hash(buf, n) != s->hash[j])
                rc = tide_errorf(TIDE_ERR_INVALID,
                                 "%s is corrupted: bytes %" PRIu64 "..%" PRIu64
                                 " do not match the manifest's checksum",
                                 path, off, off + n - 1);
        }
        close(fd);
    }
    tide_free(buf);
    return rc;
}

tide_status tide_ckpt_check_collection(const tide_ckpt_t *ck, const tide_collection_t *c)
{
    const tide_collection_t *s = ck->coll;
    if (tide_collection_size(c) != tide_collection_size(s) ||
        tide_collection_num_layers(c) != tide_collection_num_layers(s))
        return tide_errorf(TIDE_ERR_INVALID,
                           "checkpoint %s holds %zu tensors over %d layers; this model has %zu "
                           "tensors over %d layers",
                           ck->dir, tide_collection_size(s), tide_collection_num_layers(s),
                           tide_collection_size(c), tide_collection_num_layers(c));
    for (size_t i = 0; i < tide_collection_size(c); i++) {
        const tide_tensor_desc *a = tide_collection_tensor(s, i), *b = tide_collection_tensor(c, i);
        int same = strcmp(a->name, b->name) == 0 && a->dtype == b->dtype && a->ndim == b->ndim &&
                   a->layer == b->layer && a->tp == b->tp && a->dp == b->dp &&
                   (a->tp != TIDE_TP_SPLIT ||
                    (a->tp_dim == b->tp_dim && a->tp_segments == b->tp_segments));
        for (int k = 0; same && k < a->ndim; k++)
            same = a->shape[k] == b->shape[k];
        if (!same)
            return tide_errorf(TIDE_ERR_INVALID,
                               "checkpoint %s: tensor %zu is %s (%s, %" PRIu64
                               " bytes); this model has %s (%s, %" PRIu64 " bytes)",
                               ck->dir, i, a->name, tide_dtype_name(a->dtype), tide_tensor_bytes(a),
                               b->name, tide_dtype_name(b->dtype), tide_tensor_bytes(b));
    }
    return TIDE_OK;
}
