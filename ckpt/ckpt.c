/*
 * The checkpoint format (see ckpt.h): shard writer, checksum files, publishing the
 * manifest and opening it. The bytes of the manifest and of the checksum files are
 * manifest.c's (proto records); format 1's binary manifest is read by manifest_v1.c.
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
#include "ckpt/manifest.h"
#include "core/alloc.h"
#include "core/clock.h"
#include "core/error.h"
#include "core/fault.h"
#include "core/log.h"

#define SUBSYS   "ckpt"
#define MANIFEST "MANIFEST"
#define MAN_MAX  (256u << 20) /* bytes: a manifest larger than this is not one */

/* ---- helpers -------------------------------------------------------------------------- */

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
    uint8_t *sum = NULL;
    size_t sum_len = 0;
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
    tide__ckpt_shard rec = {p, d, t, total, n_chunks, crc, ""};
    TIDE_CHECK_GOTO(tide__ckpt_sum_encode(save_id, chunk, &rec, &sum, &sum_len), rc, out);
    tide__ckpt_shard_name(p, d, t, "sum", name, sizeof name);
    /* the .sum renamed into place says: this shard is complete and on disk */
    TIDE_CHECK_GOTO(tide__ckpt_write_atomic(dir, dpath, name, sum, sum_len, NULL), rc, out);
    tide__ckpt_fault("shard");
out:
    if (fd >= 0)
        close(fd);
    tide_free(sum);
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

/* Reads checksum file name of dir, shard (p, d, t)'s, into *s (s->hash: caller frees);
   TIDE_ERR_NOT_FOUND when absent or of another save_id (a crashed attempt's, not this
   save's). */
static tide_status read_sum(int dir, const char *dpath, const char *name, uint64_t save_id, int p,
                            int d, int t, tide__ckpt_shard *s)
{
    uint8_t *b = NULL;
    size_t len = 0;
    memset(s, 0, sizeof *s);
    char path[TIDE_CKPT_PATH_MAX + 128];
    snprintf(path, sizeof path, "%s/%s", dpath, name);
    TIDE_CHECK(tide__ckpt_read_whole(dir, dpath, name, MAN_MAX, &b, &len));
    uint64_t id = 0;
    tide_status rc = tide__ckpt_sum_decode(b, len, path, &id, s);
    tide_free(b);
    if (rc == TIDE_OK && (s->p != p || s->d != d || s->t != t))
        rc = tide_errorf(TIDE_ERR_INVALID, "%s holds the checksums of shard (p %d, d %d, t %d)",
                         path, s->p, s->d, s->t);
    else if (rc == TIDE_OK && id != save_id)
        rc = tide_errorf(TIDE_ERR_NOT_FOUND, "%s belongs to another save", path);
    if (rc != TIDE_OK) {
        tide_free(s->hash);
        s->hash = NULL;
    }
    return rc;
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
   noted a failure, or b passes; its size and hashes into *s (s->hash: caller frees). */
static tide_status wait_shard(int dir, const char *dpath, int p, int d, int t, uint64_t save_id,
                              tide__ckpt_bound b, tide__ckpt_shard *s)
{
    char name[64], why[600];
    tide__ckpt_shard_name(p, d, t, "sum", name, sizeof name);
    uint64_t nap_ms = 2; /* doubling to 50: quick when shards land together, cheap when not */
    for (;;) {
        tide_status rc = read_sum(dir, dpath, name, save_id, p, d, t, s);
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

/* Frees the chunk hashes of shards[0, n) and the array. */
static void free_shards(tide__ckpt_shard *shards, size_t n)
{
    for (size_t k = 0; shards != NULL && k < n; k++)
        tide_free(shards[k].hash);
    tide_free(shards);
}

tide_status tide__ckpt_publish_at(int dir, const char *dpath, const tide_layout_t *l,
                                  const tide_collection_t *c, int64_t step, uint64_t save_id,
                                  tide__ckpt_bound b)
{
    tide_status rc = TIDE_OK;
    uint8_t *man = NULL;
    size_t man_len = 0, n_shards = 0;
    tide__ckpt_shard *shards = tide_calloc(tide_layout_size(l), sizeof *shards);
    if (shards == NULL)
        return tide_errorf(TIDE_ERR_NOMEM, "out of memory publishing %s", dpath);
    for (int p = 0; p < l->pp; p++)
        for (int d = 0; d < l->dp; d++)
            for (int t = 0; t < l->tp; t++) {
                uint64_t want = tide_ckpt_shard_size(l, c, p, d, t);
                if (want == 0)
                    continue;
                tide__ckpt_shard *s = &shards[n_shards];
                rc = wait_shard(dir, dpath, p, d, t, save_id, b, s);
                if (rc == TIDE_OK)
                    n_shards++;
                if (rc == TIDE_OK && s->bytes != want)
                    rc = tide_errorf(TIDE_ERR_INVALID,
                                     "%s: shard (p %d, d %d, t %d) says %" PRIu64
                                     " bytes, the layout %" PRIu64,
                                     dpath, p, d, t, s->bytes, want);
                if (rc != TIDE_OK)
                    goto out;
            }
    TIDE_CHECK_GOTO(tide__ckpt_manifest_encode(l, c, step, save_id, TIDE_CKPT_CHUNK_BYTES, shards,
                                               n_shards, dpath, &man, &man_len),
                    rc, out);
    /* every shard is fsynced and its entry too (each writer fsynced dir after its .sum) */
    TIDE_CHECK_GOTO(tide__ckpt_write_atomic(dir, dpath, MANIFEST, man, man_len, "manifest"), rc,
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
    free_shards(shards, n_shards);
    tide_free(man);
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
    TIDE_CHECK_GOTO(tide__ckpt_manifest_decode(ck, b, len, path), rc, out);
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

int tide_ckpt_format(const tide_ckpt_t *ck)
{
    return ck->format;
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
    return tide_ckpt_verify_progress(ck, NULL, NULL);
}

tide_status tide_ckpt_verify_progress(const tide_ckpt_t *ck, tide_ckpt_progress_fn progress,
                                      void *arg)
{
    uint8_t *buf = tide_malloc(ck->chunk);
    if (buf == NULL)
        return tide_errorf(TIDE_ERR_NOMEM, "out of memory verifying %s", ck->dir);
    uint64_t total = 0, done = 0;
    for (size_t k = 0; k < ck->n_shards; k++)
        total += ck->shards[k].bytes;
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
            done += n;
            if (rc == TIDE_OK && progress != NULL)
                progress(arg, done, total);
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
