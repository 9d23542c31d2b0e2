/*
 * libFuzzer target for a checkpoint MANIFEST's reader (ckpt/manifest.h), past the seals
 * that would stop random bytes at the door. The first byte picks the format: odd, the
 * rest is the body of a format-1 manifest, which the harness frames ("TIDECKPT", version
 * 1, ..., its XXH3-64) as the old writer did; even, the rest is a "ckpt_manifest" record,
 * which the harness re-seals when it decodes (else the raw bytes go in). Any bytes in:
 * never a crash, leak or sanitizer report; a refusal is TIDE_ERR_INVALID (or NOMEM) and
 * leaves nothing behind; what is taken is a layout that fits its collection. Built only
 * with -DTIDE_FUZZ=ON and clang; run by scripts/fuzz.sh.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "ckpt/manifest.h"
#include "core/alloc.h"
#include "proto/proto.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* "TIDECKPT", u32 1, body, u64 XXH3-64 of all before: a format-1 file around body. */
static uint8_t *frame_v1(const uint8_t *body, size_t n, size_t *len)
{
    uint8_t *b = malloc(12 + n + 8);
    if (b == NULL)
        return NULL;
    memcpy(b, "TIDECKPT\x01\x00\x00\x00", 12);
    memcpy(b + 12, body, n);
    uint64_t h = XXH3_64bits(b, 12 + n);
    for (int k = 0; k < 8; k++)
        b[12 + n + (size_t)k] = (uint8_t)(h >> (8 * k));
    *len = 12 + n + 8;
    return b;
}

/* The record in body re-encoded with a correct seal, or NULL when it does not decode. */
static uint8_t *reseal(const uint8_t *body, size_t n, size_t *len)
{
    tide_msg_t m;
    if (tide_proto_decode_record(body, n, TIDE_MSG_CKPT_MANIFEST, &m) != TIDE_OK)
        return NULL;
    tide_proto_buf_t b;
    tide_proto_buf_init(&b);
    m.u.ckpt_manifest.check = 0;
    uint8_t *out = NULL;
    if (tide_proto_encode_record(&m, &b) == TIDE_OK) {
        m.u.ckpt_manifest.check = XXH3_64bits(b.data, b.len);
        if (tide_proto_encode_record(&m, &b) == TIDE_OK)
            out = tide_proto_buf_release(&b, len);
    }
    tide_proto_buf_destroy(&b);
    tide_msg_clear(&m);
    return out;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size == 0)
        return 0;
    size_t len = 0;
    uint8_t *file =
        (data[0] & 1) ? frame_v1(data + 1, size - 1, &len) : reseal(data + 1, size - 1, &len);
    const uint8_t *bytes = file ? file : data + 1;
    if (file == NULL)
        len = size - 1;
    tide_ckpt_t *ck = tide_calloc(1, sizeof *ck);
    if (ck == NULL) {
        free(file);
        return 0;
    }
    ck->fd = -1; /* no directory: only the manifest's bytes are read */
    tide_status rc = tide__ckpt_manifest_decode(ck, bytes, len, "MANIFEST");
    if (rc != TIDE_OK && rc != TIDE_ERR_INVALID && rc != TIDE_ERR_NOMEM)
        abort(); /* a bad manifest is invalid, nothing else */
    if (rc == TIDE_OK && (ck->coll == NULL || ck->layout == NULL || ck->shard_of == NULL ||
                          tide_layout_validate(ck->layout, ck->coll) != TIDE_OK))
        abort(); /* taken, yet not a checkpoint one can load */
    tide_ckpt_close(&ck);
    if (data[0] & 1)
        free(file);
    else
        tide_free(file);
    return 0;
}
