/*
 * ckpt/manifest (manifest.h): a checkpoint's MANIFEST and shard checksum files as sealed
 * proto records, and the checks every manifest passes whatever its format. Runs once per
 * published or opened checkpoint and once per shard written; a manifest holds one 8-byte
 * hash per MiB of checkpoint, so a TiB is an 8 MiB record, encoded twice to seal it.
 */
#include <inttypes.h>
#include <string.h>

#include "ckpt/manifest.h"
#include "core/alloc.h"
#include "core/error.h"
#include "proto/proto.h"
#include "proto/proto_reshard.h"

#define MAGIC_V1 "TIDECKPT"

/* Encodes record m into b sealed: *check (m's check field) becomes the XXH3-64 of m
   encoded with check 0. */
static tide_status seal(tide_msg_t *m, uint64_t *check, tide_proto_buf_t *b)
{
    *check = 0;
    TIDE_CHECK(tide_proto_encode_record(m, b));
    *check = tide__ckpt_hash(b->data, b->len);
    return tide_proto_encode_record(m, b);
}

/* TIDE_OK when *check (decoded record m's check field) is m's seal; it is left as found. */
static tide_status unseal(tide_msg_t *m, uint64_t *check, const char *path)
{
    uint64_t want = *check;
    tide_proto_buf_t b;
    tide_proto_buf_init(&b);
    *check = 0;
    tide_status rc = tide_proto_encode_record(m, &b);
    *check = want;
    int ok = rc == TIDE_OK && tide__ckpt_hash(b.data, b.len) == want;
    tide_proto_buf_destroy(&b);
    if (rc == TIDE_ERR_NOMEM)
        return rc;
    if (!ok)
        return tide_errorf(TIDE_ERR_INVALID,
                           "%s is corrupted or truncated (its checksum does not match)", path);
    return TIDE_OK;
}

/* A record of path refused by the decoder: damaged, or of another tide. */
static tide_status unreadable(tide_status rc, const char *path, const char *what)
{
    if (rc == TIDE_ERR_NOMEM)
        return rc;
    return tide_errorf(TIDE_ERR_INVALID, "%s is not a readable %s (corrupted or truncated?): %s",
                       path, what, tide_last_error());
}

static void shard_record(tide_proto_ckpt_shard_t *out, const tide__ckpt_shard *s)
{
    out->p = s->p;
    out->d = s->d;
    out->t = s->t;
    out->bytes = s->bytes;
    out->hashes = s->hash; /* borrowed: the record is never cleared */
    out->n_hashes = s->n_chunks;
}

/* ---- the manifest ------------------------------------------------------------------------- */

tide_status tide__ckpt_manifest_encode(const tide_layout_t *l, const tide_collection_t *c,
                                       int64_t step, uint64_t save_id, uint32_t chunk,
                                       const tide__ckpt_shard *shards, size_t n, const char *dir,
                                       uint8_t **out, size_t *len)
{
    *out = NULL;
    *len = 0;
    tide_msg_t m;
    tide_msg_init(&m, TIDE_MSG_CKPT_MANIFEST);
    tide_proto_ckpt_manifest_t *x = &m.u.ckpt_manifest;
    x->format = TIDE_CKPT_VERSION;
    x->chunk = chunk;
    x->step = step;
    x->save_id = save_id;
    tide_proto_layout_from(&x->layout, l, 0); /* borrowed */
    tide_proto_buf_t b;
    tide_proto_buf_init(&b);
    tide_status rc = tide_proto_tensors_from(c, &x->tensors, &x->n_tensors);
    x->shards = rc == TIDE_OK ? tide_calloc(n ? n : 1, sizeof *x->shards) : NULL;
    if (rc == TIDE_OK && x->shards == NULL)
        rc = tide_errorf(TIDE_ERR_NOMEM, "out of memory encoding %s's manifest", dir);
    for (size_t k = 0; rc == TIDE_OK && k < n; k++)
        shard_record(&x->shards[k], &shards[k]);
    x->n_shards = (uint32_t)n;
    if (rc == TIDE_OK)
        rc = seal(&m, &x->check, &b);
    if (rc != TIDE_OK && rc != TIDE_ERR_NOMEM)
        rc = tide_errorf(rc, "checkpoint %s: its manifest: %s", dir, tide_last_error());
    if (rc == TIDE_OK)
        *out = tide_proto_buf_release(&b, len);
    tide_proto_buf_destroy(&b);
    tide_free(x->tensors);
    tide_free(x->shards);
    return rc;
}

/* Format 2 (a sealed "ckpt_manifest" record) into ck. */
static tide_status decode_v2(tide_ckpt_t *ck, const uint8_t *b, size_t len, const char *path)
{
    tide_msg_t m;
    tide_status rc = tide_proto_decode_record(b, len, TIDE_MSG_CKPT_MANIFEST, &m);
    if (rc != TIDE_OK)
        return unreadable(rc, path, "tide checkpoint manifest");
    tide_proto_ckpt_manifest_t *x = &m.u.ckpt_manifest;
    const tide_proto_layout_t *pl = &x->layout;
    TIDE_CHECK_GOTO(unseal(&m, &x->check, path), rc, out);
    if (x->format != TIDE_CKPT_VERSION)
        TIDE_FAIL_GOTO(rc, out, TIDE_ERR_INVALID,
                       "%s is format version %u; this tide reads versions 1 and %d", path,
                       x->format, TIDE_CKPT_VERSION);
    ck->format = (int)x->format;
    ck->chunk = x->chunk;
    ck->step = x->step;
    ck->save_id = x->save_id;
    rc = tide_proto_tensors_to(x->tensors, x->n_tensors, pl->num_layers, &ck->coll);
    if (rc != TIDE_OK && rc != TIDE_ERR_NOMEM)
        TIDE_FAIL_GOTO(rc, out, TIDE_ERR_INVALID, "%s: %s", path, tide_last_error());
    TIDE_CHECK_GOTO(rc, rc, out);
    /* loaded by coordinate: the saved layout's worker ids are the coordinates' indexes, as
       a format-1 manifest's, whatever ranks held it */
    rc = tide_layout_new(&ck->layout, pl->dp, pl->tp, pl->pp, pl->num_layers, pl->micro_batches);
    if (rc == TIDE_OK)
        rc = tide_layout_set_stages(ck->layout, pl->stage_start);
    if (rc != TIDE_OK && rc != TIDE_ERR_NOMEM)
        TIDE_FAIL_GOTO(rc, out, TIDE_ERR_INVALID, "%s: bad layout: %s", path, tide_last_error());
    TIDE_CHECK_GOTO(rc, rc, out);
    ck->shards = tide_calloc(x->n_shards ? x->n_shards : 1, sizeof *ck->shards);
    TIDE_CHECK_ALLOC_GOTO(ck->shards, rc, out);
    for (uint32_t k = 0; k < x->n_shards; k++) {
        tide__ckpt_shard *s = &ck->shards[k];
        s->p = x->shards[k].p;
        s->d = x->shards[k].d;
        s->t = x->shards[k].t;
        s->bytes = x->shards[k].bytes;
        s->n_chunks = x->shards[k].n_hashes;
        s->hash = x->shards[k].hashes; /* the checkpoint owns it from now on */
        x->shards[k].hashes = NULL;
        x->shards[k].n_hashes = 0;
    }
    ck->n_shards = x->n_shards;
out:
    tide_msg_clear(&m);
    return rc;
}

/* What both formats are held to: the layout fits the collection, and the shards are one
   per coordinate that saves something, of the size the layout implies. */
static tide_status check_shards(tide_ckpt_t *ck, const char *path)
{
    tide_status rc = tide_layout_validate(ck->layout, ck->coll);
    if (rc != TIDE_OK)
        return tide_errorf(TIDE_ERR_INVALID, "%s: %s", path, tide_last_error());
    const tide_layout_t *l = ck->layout;
    size_t n_coord = tide_layout_size(l);
    if (ck->n_shards > n_coord)
        return tide_errorf(TIDE_ERR_INVALID, "%s: bad shard count %zu", path, ck->n_shards);
    ck->shard_of = tide_calloc(n_coord, sizeof *ck->shard_of);
    if (ck->shard_of == NULL)
        return tide_errorf(TIDE_ERR_NOMEM, "out of memory opening %s", path);
    for (size_t k = 0; k < n_coord; k++)
        ck->shard_of[k] = -1;
    for (size_t k = 0; k < ck->n_shards; k++) {
        tide__ckpt_shard *s = &ck->shards[k];
        if (s->p < 0 || s->p >= l->pp || s->d < 0 || s->d >= l->dp || s->t < 0 || s->t >= l->tp)
            return tide_errorf(TIDE_ERR_INVALID, "%s: bad shard record %zu", path, k);
        size_t idx = tide_layout_index(l, s->p, s->d, s->t);
        uint64_t want = tide_ckpt_shard_size(l, ck->coll, s->p, s->d, s->t);
        if (ck->shard_of[idx] >= 0 || want == 0 || s->bytes != want ||
            s->n_chunks != (want + ck->chunk - 1) / ck->chunk)
            return tide_errorf(TIDE_ERR_INVALID,
                               "%s: shard (p %d, d %d, t %d) of %" PRIu64
                               " bytes does not fit the saved layout (%" PRIu64 " bytes)",
                               path, s->p, s->d, s->t, s->bytes, want);
        tide__ckpt_shard_name(s->p, s->d, s->t, "bin", s->file, sizeof s->file);
        ck->shard_of[idx] = (int)k;
    }
    for (size_t k = 0; k < n_coord; k++) {
        int p = (int)(k / ((size_t)l->dp * (size_t)l->tp));
        int d = (int)(k / (size_t)l->tp % (size_t)l->dp), t = (int)(k % (size_t)l->tp);
        if (ck->shard_of[k] < 0 && tide_ckpt_shard_size(l, ck->coll, p, d, t) > 0)
            return tide_errorf(TIDE_ERR_INVALID,
                               "%s lists no shard for (p %d, d %d, t %d), which the layout needs",
                               path, p, d, t);
    }
    return TIDE_OK;
}

tide_status tide__ckpt_manifest_decode(tide_ckpt_t *ck, const uint8_t *b, size_t len,
                                       const char *path)
{
    if (len >= 8 && memcmp(b, MAGIC_V1, 8) == 0)
        TIDE_CHECK(tide__ckpt_manifest_decode_v1(ck, b, len, path));
    else
        TIDE_CHECK(decode_v2(ck, b, len, path));
    if (ck->chunk == 0 || ck->chunk > TIDE_PROTO_CHUNK_MAX)
        return tide_errorf(TIDE_ERR_INVALID, "%s: bad chunk size %u", path, ck->chunk);
    return check_shards(ck, path);
}

/* ---- shard checksum files ------------------------------------------------------------------ */

tide_status tide__ckpt_sum_encode(uint64_t save_id, uint32_t chunk, const tide__ckpt_shard *s,
                                  uint8_t **out, size_t *len)
{
    *out = NULL;
    *len = 0;
    tide_msg_t m;
    tide_msg_init(&m, TIDE_MSG_CKPT_SUM);
    m.u.ckpt_sum.save_id = save_id;
    m.u.ckpt_sum.chunk = chunk;
    shard_record(&m.u.ckpt_sum.shard, s);
    tide_proto_buf_t b;
    tide_proto_buf_init(&b);
    tide_status rc = seal(&m, &m.u.ckpt_sum.check, &b);
    if (rc == TIDE_OK)
        *out = tide_proto_buf_release(&b, len);
    tide_proto_buf_destroy(&b);
    return rc;
}

tide_status tide__ckpt_sum_decode(const uint8_t *b, size_t len, const char *path, uint64_t *save_id,
                                  tide__ckpt_shard *s)
{
    tide_msg_t m;
    tide_status rc = tide_proto_decode_record(b, len, TIDE_MSG_CKPT_SUM, &m);
    if (rc != TIDE_OK)
        return unreadable(rc, path, "checksum file");
    tide_proto_ckpt_sum_t *x = &m.u.ckpt_sum;
    rc = unseal(&m, &x->check, path);
    if (rc == TIDE_OK && x->chunk != TIDE_CKPT_CHUNK_BYTES)
        rc = tide_errorf(TIDE_ERR_INVALID, "%s: chunks of %u bytes, not %u", path, x->chunk,
                         TIDE_CKPT_CHUNK_BYTES);
    if (rc == TIDE_OK) {
        *save_id = x->save_id;
        s->p = x->shard.p;
        s->d = x->shard.d;
        s->t = x->shard.t;
        s->bytes = x->shard.bytes;
        s->n_chunks = x->shard.n_hashes;
        s->hash = x->shard.hashes; /* the caller's from now on */
        x->shard.hashes = NULL;
        x->shard.n_hashes = 0;
    }
    tide_msg_clear(&m);
    return rc;
}
