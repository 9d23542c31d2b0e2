/*
 * proto records: the structures tide writes to a disk, encoded like the messages of
 * proto.h (which includes this file where the shared sub-structures they hold are
 * defined; include proto/proto.h, not this file).
 */
#ifndef TIDE_PROTO_RECORD_H
#define TIDE_PROTO_RECORD_H

#ifndef TIDE_PROTO_H
#error "include proto/proto.h, which includes proto/proto_record.h"
#endif

/* ---- records: what reaches a disk ---------------------------------------------------------- */

/*
 * Records are messages that are stored rather than sent: tided keeps each structured part
 * of a job in its state file as one record (a BLOB column), and a checkpoint's MANIFEST
 * and its shards' checksum files are one record each. Same header ("v", "type"), same
 * strict decoder, fuzzed like the wire messages; tided refuses them on its socket
 * (TIDE_ROLE_RECORD). A record carries the schema version it was written under, so a later
 * schema reads it or refuses it naming that version. Write and read them with
 * tide_proto_encode_record / tide_proto_decode_record (a larger size limit, and the type
 * the caller expects).
 */

#define TIDE_PROTO_RECORD_MAX_BYTES   (256u << 20) /* bytes of one encoded record */
#define TIDE_PROTO_RECORD_MAX_OBJECTS (1u << 25)   /* msgpack objects in one record */
#define TIDE_PROTO_JOB_POOLS_MAX      16         /* pools of one job (= TIDE_COORD_JOB_POOLS_MAX) */
#define TIDE_PROTO_CKPTS_MAX          8          /* checkpoints tided keeps per job */
#define TIDE_PROTO_CHUNK_MAX          (1u << 30) /* bytes of one checksummed chunk of a shard */
#define TIDE_PROTO_HASHES_MAX         (TIDE_PROTO_RECORD_MAX_BYTES / 8) /* chunk hashes of one shard */

/* "job_layout": a layout of a job as tided stores it: its committed one (layout.gen = the
   job's generation) or the one its pending reconfiguration installs (layout.gen = that
   generation). */
typedef struct tide_proto_job_layout {
    tide_proto_layout_t layout; /* "layout" */
} tide_proto_job_layout_t;

/* One pool (mpirun launch) of an online job: its ranks are the job ranks following the
   previous pools'. */
typedef struct tide_proto_job_pool {
    char name[TIDE_PROTO_NAME_MAX + 1]; /* "name": the pool id, like a job name */
    int32_t size;                       /* "size": ranks, [1, 2^20] */
    int connected; /* "connected": bool, shares the job's communicators (0 once it left) */
    uint64_t left; /* "left": the committed generation that released it, 0 while it stays */
} tide_proto_job_pool_t;

/* "job_pools": an online job's pools in job-rank order (0..16; [] for offline jobs); the
   first is the launching one. Their ranks together are at most 2^20. */
typedef struct tide_proto_job_pools {
    tide_proto_job_pool_t *pools; /* "pools": owned */
    uint32_t n_pools;
} tide_proto_job_pools_t;

/* "job_fit": the fit rules an online job's program declared (0..32, as its join carried
   them; [] for none). Whether they are consistent is reshard's tide_fit_check. */
typedef struct tide_proto_job_fit {
    tide_proto_fit_t *fit; /* "fit": owned */
    uint32_t n_fit;
} tide_proto_job_fit_t;

/* One complete checkpoint of a job, as its publisher reported it ("saved"). */
typedef struct tide_proto_ckpt_ref {
    int64_t step;                      /* "step": [0, INT64_MAX] */
    char dir[TIDE_PROTO_TEXT_MAX + 1]; /* "dir": 1.. chars, ROOT/step-<012 step> */
} tide_proto_ckpt_ref_t;

/* "job_ckpts": the complete checkpoints tided remembers of an online job, oldest first
   (strictly increasing steps), 0..8. */
typedef struct tide_proto_job_ckpts {
    tide_proto_ckpt_ref_t *ckpts; /* "ckpts": owned */
    uint32_t n_ckpts;
} tide_proto_job_ckpts_t;

/* "job_argv": an offline job's command line (command jobs) or its plugin's arguments, as
   submitted: 0..256 entries of 0..4095 bytes. */
typedef struct tide_proto_job_argv {
    char **argv; /* "argv": owned, each entry owned */
    uint32_t argc;
} tide_proto_job_argv_t;

/* One shard file of a checkpoint: what coordinate (p, d, t) of the saved layout wrote,
   and the XXH3-64 of each chunk of it (chunk k: bytes [k * chunk, (k + 1) * chunk)).
   Wire: "hashes" is one binary string of 8 bytes per chunk, little-endian, so that a
   checkpoint of many TiB stays one record. */
typedef struct tide_proto_ckpt_shard {
    int p, d, t;      /* "p","d","t": [0, 65535] each, inside the layout */
    uint64_t bytes;   /* "bytes": the file's size, >= 1 */
    uint64_t *hashes; /* "hashes": owned; ceil(bytes / chunk) entries */
    uint32_t n_hashes;
} tide_proto_ckpt_shard_t;

/*
 * "ckpt_manifest": a checkpoint's MANIFEST, written last (its presence makes the checkpoint
 * complete). format: the checkpoint format version (ckpt.h's TIDE_CKPT_VERSION; 1 was the
 * hand-written binary MANIFEST before this record, which ckpt/ still reads). The layout is
 * the saved one (gen 0; workers as saved); tensors is the collection in order (each
 * tensor's layer below layout.layers); shards lists every file written, in strictly
 * increasing (p, d, t) order, each inside the layout. check: XXH3-64 of this record encoded
 * with check = 0, so that a flipped byte anywhere is found (ckpt computes and checks it).
 */
typedef struct tide_proto_ckpt_manifest {
    uint32_t format;                 /* "format": [2, 65535] */
    uint32_t chunk;                  /* "chunk": bytes per hashed chunk, [1, 2^30] */
    int64_t step;                    /* "step": steps completed by the saved state, >= 0 */
    uint64_t save_id;                /* "save_id": the same on every file of one save */
    tide_proto_layout_t layout;      /* "layout" */
    tide_proto_tensor_t *tensors;    /* "tensors": owned */
    uint32_t n_tensors;              /* <= TIDE_PROTO_TENSORS_MAX */
    tide_proto_ckpt_shard_t *shards; /* "shards": owned */
    uint32_t n_shards;               /* <= TIDE_PROTO_WORKERS_MAX */
    uint64_t check;                  /* "check" */
} tide_proto_ckpt_manifest_t;

/* "ckpt_sum": the checksums of one shard file, written beside it once it is on disk
   (shard-*.sum); the publisher waits for every one and copies them into the manifest.
   check: as the manifest's. */
typedef struct tide_proto_ckpt_sum {
    uint64_t save_id;              /* "save_id": the save that wrote the shard */
    uint32_t chunk;                /* "chunk": [1, 2^30] */
    tide_proto_ckpt_shard_t shard; /* "shard" */
    uint64_t check;                /* "check" */
} tide_proto_ckpt_sum_t;

#endif /* TIDE_PROTO_RECORD_H */
