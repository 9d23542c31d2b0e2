/*
 * proto internals: the message catalogue as data. Each message type has a
 * schema (a table of fields: wire key, kind, offset in its C struct, range);
 * encode, decode, validate and free all walk the same tables, so the wire
 * format, the checks and the ownership rules cannot drift apart.
 *
 * The rooms, by who calls them: proto.c (the catalogue: a type's schema and role, the
 * sub-schemas and rules several share); the schemas by who speaks them, proto_worker.c
 * (workers <-> tided), proto_tidectl.c (tidectl <-> tided), proto_record.c (records on a
 * disk); proto_names.c (wire strings, for printers); proto_encode.c (senders: encode and
 * the byte buffer); proto_decode.c (receivers); proto_msg.c (validate, init, clear);
 * proto_check.c (the checks all of them share).
 */
#ifndef TIDE_PROTO_INT_H
#define TIDE_PROTO_INT_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "core/error.h"
#include "proto/proto.h"

typedef enum tide__kind {
    TIDE__K_INT,          /* integer stored in 4 or 8 bytes, signed or not: [min, max] */
    TIDE__K_DOUBLE,       /* double, finite, [dmin, dmax] */
    TIDE__K_BOOL,         /* int 0/1 */
    TIDE__K_STR,          /* char[size], length [min, size - 1], charset */
    TIDE__K_ENUM,         /* int enum value, wire: one of names[] */
    TIDE__K_I32_ARRAY,    /* int32 *: owned; count at count_off, or implied by expect() */
    TIDE__K_I64_FIXED,    /* int64[size] inline; count (int) at count_off in [cmin, cmax] */
    TIDE__K_STR_ARRAY,    /* char **: owned entries of length [min, size]; count at count_off */
    TIDE__K_STRUCT,       /* inline sub-struct (map); F_NULLABLE: nil allowed, has at has_off */
    TIDE__K_STRUCT_ARRAY, /* sub-struct array: owned; count at count_off in [cmin, cmax] */
    TIDE__K_U64_BIN,      /* uint64 *: owned; count at count_off, <= cmax; wire: one bin of
                             8 little-endian bytes per entry (chunk hashes: compact, 1 object) */
} tide__kind;

enum {
    TIDE__CS_NAME = 0, /* [A-Za-z0-9._:-] */
    TIDE__CS_HOST = 1, /* printable ASCII without space */
    TIDE__CS_TEXT = 2, /* any byte but NUL */
    TIDE__CS_LINE = 3, /* printable ASCII, spaces allowed: one line of text for people */
};

#define TIDE__F_UNSIGNED 1u
#define TIDE__F_NULLABLE 2u
#define TIDE__F_OPTIONAL 4u /* a double or integer that may be absent (0): sent only when not 0 */
#define TIDE__NO_OFF     ((size_t)-1)

typedef struct tide__ctx tide__ctx;
typedef struct tide__schema tide__schema;
typedef struct tide__field tide__field;

struct tide__field {
    const char *key;
    tide__kind kind;
    unsigned flags;
    size_t off;
    size_t size;  /* INT: 4/8 bytes; STR: array size; STR_ARRAY: max entry length; I64_FIXED: cap */
    int64_t min;  /* INT / array elements: lower bound; STR / STR_ARRAY entries: min length */
    uint64_t max; /* INT / array elements: upper bound */
    double dmin, dmax;
    const char *const *names; /* ENUM: wire names indexed by value */
    int n_names;
    int charset;
    size_t count_off;    /* uint32/int count, or NO_OFF */
    uint32_t cmin, cmax; /* array count bounds */
    tide_status (*expect)(const void *base, tide__ctx *c, uint32_t *n); /* implied count */
    const tide__schema *sub;                                            /* STRUCT, STRUCT_ARRAY */
    size_t has_off; /* STRUCT + F_NULLABLE: int has */
};

struct tide__schema {
    const tide__field *fields;
    size_t n_fields;
    size_t size; /* sizeof the C struct (array elements) */
    int owns;    /* 1 when the struct (or a sub-struct) holds owned pointers */
    tide_status (*check)(const void *base, tide__ctx *c); /* cross-field rules, or NULL */
};

/* Error context: which message, which nested field, which status to fail with. */
struct tide__ctx {
    tide_status code; /* TIDE_ERR_PROTOCOL decoding, TIDE_ERR_INVALID encoding */
    const char *msg;  /* wire type name */
    char path[96];    /* prefix of the current nested field: "rows[3]." */
};

#define NELEM(a) ((int)(sizeof(a) / sizeof((a)[0])))

/* ---- field constructors -------------------------------------------------------------------- */

#define MEMBER(T, m) (((T *)0)->m)
#define IS_UNSIGNED(T, m)                                                                          \
    _Generic(MEMBER(T, m), uint32_t : TIDE__F_UNSIGNED, uint64_t : TIDE__F_UNSIGNED, default : 0u)

#define F_INT(T, m, k, lo, hi)                                                                     \
    {                                                                                              \
        .key = (k), .kind = TIDE__K_INT, .flags = IS_UNSIGNED(T, m), .off = offsetof(T, m),        \
        .size = sizeof(MEMBER(T, m)), .min = (lo), .max = (hi), .count_off = TIDE__NO_OFF          \
    }
#define F_U64(T, m, k) F_INT(T, m, k, 0, UINT64_MAX)
/* An integer a peer of before it does not send (read as 0) and that is sent only when not 0. */
#define F_INT_OPT(T, m, k, lo, hi)                                                                 \
    {                                                                                              \
        .key = (k), .kind = TIDE__K_INT, .flags = IS_UNSIGNED(T, m) | TIDE__F_OPTIONAL,            \
        .off = offsetof(T, m), .size = sizeof(MEMBER(T, m)), .min = (lo), .max = (hi),             \
        .count_off = TIDE__NO_OFF                                                                  \
    }
#define F_WORKER(T, m)    F_INT(T, m, "worker", 0, INT32_MAX)
#define F_GEN(T, m)       F_U64(T, m, "gen")
#define F_DEGREE(T, m, k) F_INT(T, m, k, 1, TIDE_PROTO_DEGREE_MAX)
#define F_DBL(T, m, k, lo, hi)                                                                     \
    {                                                                                              \
        .key = (k), .kind = TIDE__K_DOUBLE, .off = offsetof(T, m), .dmin = (lo), .dmax = (hi),     \
        .count_off = TIDE__NO_OFF                                                                  \
    }
#define F_MS(T, m, k) F_DBL(T, m, k, 0.0, TIDE_PROTO_MS_MAX)
#define F_MS_OPT(T, m, k)                                                                          \
    {                                                                                              \
        .key = (k), .kind = TIDE__K_DOUBLE, .flags = TIDE__F_OPTIONAL, .off = offsetof(T, m),      \
        .dmin = 0.0, .dmax = TIDE_PROTO_MS_MAX, .count_off = TIDE__NO_OFF                          \
    }
#define F_BOOL(T, m, k)                                                                            \
    {                                                                                              \
        .key = (k), .kind = TIDE__K_BOOL, .off = offsetof(T, m), .count_off = TIDE__NO_OFF         \
    }
#define F_STR(T, m, k, cs, minlen)                                                                 \
    {                                                                                              \
        .key = (k), .kind = TIDE__K_STR, .off = offsetof(T, m), .size = sizeof(MEMBER(T, m)),      \
        .min = (minlen), .charset = (cs), .count_off = TIDE__NO_OFF                                \
    }
#define F_JOB(T, m)       F_STR(T, m, "job", TIDE__CS_NAME, 1)
#define F_JOB_EMPTY(T, m) F_STR(T, m, "job", TIDE__CS_NAME, 0)
#define F_TEXT(T, m, k)   F_STR(T, m, k, TIDE__CS_TEXT, 0)
#define F_ENUM(T, m, k, tbl)                                                                       \
    {                                                                                              \
        .key = (k), .kind = TIDE__K_ENUM, .off = offsetof(T, m), .names = (tbl),                   \
        .n_names = NELEM(tbl), .count_off = TIDE__NO_OFF                                           \
    }

#define ARGV_FIELD(T)                                                                              \
    {                                                                                              \
        .key = "argv", .kind = TIDE__K_STR_ARRAY, .off = offsetof(T, argv),                        \
        .size = TIDE_PROTO_ARG_MAX, .min = 0, .charset = TIDE__CS_TEXT,                            \
        .count_off = offsetof(T, argc), .cmax = TIDE_PROTO_ARGV_MAX                                \
    }

#define SCHEMA(fields, T, owns, check)                                                             \
    {                                                                                              \
        fields, NELEM(fields), sizeof(T), owns, check                                              \
    }

/* Sub-schemas shared by several messages and records (proto.c). */
extern const tide__schema tide__layout_schema;       /* tide_proto_layout_t */
extern const tide__schema tide__tensor_schema;       /* tide_proto_tensor_t */
extern const tide__schema tide__fit_schema;          /* tide_proto_fit_t */
extern const tide__schema tide__event_fields_schema; /* tide_proto_event_fields_t */

/* Wire strings of the enums, indexed by value (proto_names.c): the schemas' F_ENUM tables.
   Each size is its enum's last value + 1; proto_names.c checks each list holds that many. */
extern const char *const tide__device_kind_names[TIDE_DEVICE_GPU + 1];
extern const char *const tide__worker_state_names[TIDE_WORKER_LEFT + 1];
extern const char *const tide__job_kind_names[TIDE_JOB_PLUGIN + 1];
extern const char *const tide__job_state_names[TIDE_JOB_STALLED + 1];
extern const char *const tide__placement_names[TIDE_PLACEMENT_OPTIMAL + 1];
extern const char *const tide__degree_names[4]; /* tide_degree: dp, tp, pp, dp_micro */

/* The message schemas of a room, indexed by type; an entry of size 0 is another room's type.
   proto_worker.c: what workers and tided say; proto_tidectl.c: tidectl's requests, replies. */
extern const tide__schema tide__worker_schemas[TIDE_MSG__COUNT];
extern const tide__schema tide__tidectl_schemas[TIDE_MSG__COUNT];

/* Schema of a record type (proto_record.c), NULL for any other type. */
const tide__schema *tide__record_schema(tide_msg_type_t type);

/* Per-type schema (NULL for TIDE_MSG_NONE): the rooms' tables, then the records' (proto.c);
   type in [0, TIDE_MSG__COUNT). Pure; any thread. */
const tide__schema *tide__msg_schema(tide_msg_type_t type);

/* Cross-field rules several schemas share (proto.c): TIDE_OK, else fail via c. Pure; any
   thread. */
/* dp*tp*pp is at most TIDE_PROTO_WORKERS_MAX workers. */
tide_status tide__check_degrees(tide__ctx *c, int dp, int tp, int pp);
/* n stage boundaries s (NULL only when n = 0): s[0] = 0, strictly increasing. */
tide_status tide__check_stages(tide__ctx *c, const int *s, uint32_t n);
/* Offline work: a command job carries argv and no plugin, a plugin job a plugin name. */
tide_status tide__check_offline(tide__ctx *c, tide_proto_job_kind_t kind, const char *plugin,
                                uint32_t argc);

/* Formats "<msg>: <text>" with ctx->code; returns ctx->code. */
tide_status tide__fail(tide__ctx *c, const char *fmt, ...) TIDE_PRINTF(2, 3);

/* "field 'rows[3].host'" text for key under the context's path, into buf. */
const char *tide__field_name(const tide__ctx *c, const char *key, char *buf, size_t len);

/* Writes "<key>[<k>]." at c->path + plen (truncated to fit); cheap: once per array element. */
void tide__path_index(tide__ctx *c, size_t plen, const char *key, uint32_t k);

/* Range check shared by decode and validate: value is (neg ? i : u). */
int tide__int_in_range(const tide__field *f, int neg, int64_t i, uint64_t u);

/* "a non-negative integer" / "an integer in [1, 65536]" into buf. */
const char *tide__int_expect(const tide__field *f, char *buf, size_t len);

/* Stores an in-range integer into the field at base + f->off (by size and sign). */
void tide__int_store(const tide__field *f, void *base, int neg, int64_t i, uint64_t u);

/* Reads a stored integer field back as (neg, i, u); any thread. */
void tide__int_load(const tide__field *f, const void *base, int *neg, int64_t *i, uint64_t *u);

/* Checks bytes [0, n) against a charset and length rules; 0 ok, else fails via c. */
tide_status tide__check_str(tide__ctx *c, const tide__field *f, const char *s, size_t n,
                            size_t max_len, const char *key);

/* Runs the schema's field checks on stored values (encode side) and its check()
   (proto_msg.c); reads base only. Any thread. */
tide_status tide__validate_struct(const tide__schema *s, const void *base, tide__ctx *c);

/* Frees what the struct owns (proto_msg.c); pointers become NULL and counts 0. Any thread
   that owns base. */
void tide__free_struct(const tide__schema *s, void *base);

/* Loads a uint32 array count stored at base + off. */
static inline uint32_t tide__load_count(const void *base, size_t off)
{
    uint32_t n;
    memcpy(&n, (const char *)base + off, sizeof n);
    return n;
}

/* Stores a uint32 array count at base + off (the field may be an int: same size). */
static inline void tide__store_count(void *base, size_t off, uint32_t n)
{
    memcpy((char *)base + off, &n, sizeof n);
}

#endif /* TIDE_PROTO_INT_H */
