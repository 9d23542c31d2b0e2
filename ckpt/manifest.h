/*
 * ckpt/manifest: the bytes of a checkpoint's MANIFEST and of its shards' checksum files
 * (shard-*.sum), and nothing else: reading and writing the files is ckpt.c's.
 *
 * Format 2 (written): each file is one proto record (proto.h: "ckpt_manifest",
 * "ckpt_sum"), sealed by its "check" field, the XXH3-64 of the record encoded with check
 * 0: a flipped byte anywhere is found. Format 1 (read only, manifest_v1.c): the
 * hand-written little-endian MANIFEST of earlier tides, kept so that their checkpoints
 * still load. Whichever format, what a manifest says is checked the same way (the layout
 * against the collection, one shard per writing coordinate of the size that layout
 * implies). Pure; any thread on distinct objects.
 */
#ifndef TIDE_CKPT_MANIFEST_H
#define TIDE_CKPT_MANIFEST_H

#include <stddef.h>
#include <stdint.h>

#include "ckpt/ckpt_int.h"

/*
 * The MANIFEST of the checkpoint of c saved under l at step by save save_id, its shards in
 * chunks of `chunk` bytes: shards[0, n) in (p, d, t) order, into *out (tide_malloc'd; the
 * caller frees). TIDE_ERR_INVALID naming dir when it cannot be encoded, TIDE_ERR_NOMEM.
 */
tide_status tide__ckpt_manifest_encode(const tide_layout_t *l, const tide_collection_t *c,
                                       int64_t step, uint64_t save_id, uint32_t chunk,
                                       const tide__ckpt_shard *shards, size_t n, const char *dir,
                                       uint8_t **out, size_t *len);

/*
 * Reads the bytes b[0, len) of MANIFEST file `path` (format 1 or 2) into ck's step,
 * save_id, chunk, collection, layout, shards and shard_of, and checks them. Anything wrong:
 * TIDE_ERR_INVALID naming path (another format version names it); ck then holds only what
 * tide_ckpt_close frees.
 */
tide_status tide__ckpt_manifest_decode(tide_ckpt_t *ck, const uint8_t *b, size_t len,
                                       const char *path);

/* Format 1 into ck (manifest_v1.c): its framing, checksum and records, unchecked against
   each other (tide__ckpt_manifest_decode does that for both formats). */
tide_status tide__ckpt_manifest_decode_v1(tide_ckpt_t *ck, const uint8_t *b, size_t len,
                                          const char *path);

/* The checksum file of shard s (p, d, t, bytes, n_chunks, hash) written by save save_id in
   chunks of `chunk` bytes, into *out (tide_malloc'd; the caller frees). */
tide_status tide__ckpt_sum_encode(uint64_t save_id, uint32_t chunk, const tide__ckpt_shard *s,
                                  uint8_t **out, size_t *len);

/*
 * Reads checksum file `path`'s bytes b[0, len): its save into *save_id and its shard into s
 * (s->hash tide_malloc'd: the caller frees). TIDE_ERR_INVALID naming path when it is no
 * checksum file of chunks of TIDE_CKPT_CHUNK_BYTES (damaged, another format).
 */
tide_status tide__ckpt_sum_decode(const uint8_t *b, size_t len, const char *path, uint64_t *save_id,
                                  tide__ckpt_shard *s);

#endif /* TIDE_CKPT_MANIFEST_H */
