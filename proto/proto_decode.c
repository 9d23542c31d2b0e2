/*
 * proto: strict decoding. Input is untrusted (any peer, any bytes), so decoding
 * runs in two passes:
 *   1. skim: walks the raw msgpack bytes once without allocating, and refuses
 *      truncation, trailing bytes, invalid lead bytes, nesting deeper than
 *      TIDE_PROTO_MAX_DEPTH and more than TIDE_PROTO_MAX_OBJECTS values. This
 *      matters because msgpack-c allocates an array's or map's element storage
 *      from its declared count before reading the elements: after the skim,
 *      every declared element exists in the input, so msgpack-c's allocation is
 *      bounded by ~16 bytes per input byte and can never be a 5-byte bomb.
 *   2. msgpack_unpack_next builds the object tree in a zone; the schema walk
 *      then checks every field (presence, type, range, duplicates, unknown
 *      keys) and copies it into the C struct, allocating arrays with
 *      tide_malloc so that allocation failure can be injected in tests.
 * Workload: ~10^4 heartbeats/s of ~100 bytes in tided; rare messages of MBs.
 */
#include <math.h>
#include <msgpack.h>
#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "proto/proto_int.h"

/* ---- pass 1: skim ------------------------------------------------------------------------------
 */

typedef struct skim {
    const uint8_t *start, *p, *end;
    uint32_t objects, max_objects;
    tide__ctx *c;
} skim_t;

static tide_status skim_truncated(skim_t *s)
{
    return tide__fail(s->c, "truncated: the input ends inside the message (%zu bytes)",
                      (size_t)(s->end - s->start));
}

/* Reads a big-endian unsigned of n bytes (1, 2, 4, 8). */
static int skim_be(skim_t *s, size_t n, uint64_t *v)
{
    if ((size_t)(s->end - s->p) < n)
        return -1;
    uint64_t x = 0;
    for (size_t i = 0; i < n; i++)
        x = (x << 8) | s->p[i];
    s->p += n;
    *v = x;
    return 0;
}

static tide_status skim_bytes(skim_t *s, uint64_t n)
{
    if ((uint64_t)(s->end - s->p) < n)
        return skim_truncated(s);
    s->p += n;
    return TIDE_OK;
}

static tide_status skim_one(skim_t *s, int depth);

static tide_status skim_items(skim_t *s, uint64_t n, int depth)
{
    if (depth >= TIDE_PROTO_MAX_DEPTH)
        return tide__fail(s->c, "nesting deeper than %d levels of maps and arrays",
                          TIDE_PROTO_MAX_DEPTH);
    for (uint64_t i = 0; i < n; i++)
        TIDE_CHECK(skim_one(s, depth + 1));
    return TIDE_OK;
}

static tide_status skim_one(skim_t *s, int depth)
{
    uint64_t n;
    if (s->p >= s->end)
        return skim_truncated(s);
    if (++s->objects > s->max_objects)
        return tide__fail(s->c, "more than %u values in one message", s->max_objects);
    size_t at = (size_t)(s->p - s->start);
    uint8_t b = *s->p++;
    if (b <= 0x7f || b >= 0xe0 || b == 0xc0 || b == 0xc2 || b == 0xc3)
        return TIDE_OK; /* fixint, nil, bool */
    if (b >= 0x80 && b <= 0x8f)
        return skim_items(s, 2ull * (b & 0x0f), depth);
    if (b >= 0x90 && b <= 0x9f)
        return skim_items(s, b & 0x0f, depth);
    if (b >= 0xa0 && b <= 0xbf)
        return skim_bytes(s, b & 0x1f);
    switch (b) {
    case 0xc4: /* bin 8/16/32 */
    case 0xd9: /* str 8/16/32 */
        if (skim_be(s, 1, &n))
            return skim_truncated(s);
        return skim_bytes(s, n);
    case 0xc5:
    case 0xda:
        if (skim_be(s, 2, &n))
            return skim_truncated(s);
        return skim_bytes(s, n);
    case 0xc6:
    case 0xdb:
        if (skim_be(s, 4, &n))
            return skim_truncated(s);
        return skim_bytes(s, n);
    case 0xc7: /* ext 8/16/32: length, type byte, data */
        if (skim_be(s, 1, &n))
            return skim_truncated(s);
        return skim_bytes(s, n + 1);
    case 0xc8:
        if (skim_be(s, 2, &n))
            return skim_truncated(s);
        return skim_bytes(s, n + 1);
    case 0xc9:
        if (skim_be(s, 4, &n))
            return skim_truncated(s);
        return skim_bytes(s, n + 1);
    case 0xca: /* float 32/64 */
        return skim_bytes(s, 4);
    case 0xcb:
        return skim_bytes(s, 8);
    case 0xcc: /* uint / int 8..64 */
    case 0xd0:
        return skim_bytes(s, 1);
    case 0xcd:
    case 0xd1:
        return skim_bytes(s, 2);
    case 0xce:
    case 0xd2:
        return skim_bytes(s, 4);
    case 0xcf:
    case 0xd3:
        return skim_bytes(s, 8);
    case 0xd4: /* fixext 1..16: type byte + data */
        return skim_bytes(s, 2);
    case 0xd5:
        return skim_bytes(s, 3);
    case 0xd6:
        return skim_bytes(s, 5);
    case 0xd7:
        return skim_bytes(s, 9);
    case 0xd8:
        return skim_bytes(s, 17);
    case 0xdc: /* array 16/32 */
        if (skim_be(s, 2, &n))
            return skim_truncated(s);
        return skim_items(s, n, depth);
    case 0xdd:
        if (skim_be(s, 4, &n))
            return skim_truncated(s);
        return skim_items(s, n, depth);
    case 0xde: /* map 16/32 */
        if (skim_be(s, 2, &n))
            return skim_truncated(s);
        return skim_items(s, 2 * n, depth);
    case 0xdf:
        if (skim_be(s, 4, &n))
            return skim_truncated(s);
        return skim_items(s, 2 * n, depth);
    default: /* 0xc1: never used */
        return tide__fail(s->c, "byte 0x%02x at offset %zu is not valid msgpack", b, at);
    }
}

/* ---- pass 2: schema walk
 * -------------------------------------------------------------------------- */

static const char *obj_type_name(msgpack_object_type t)
{
    switch (t) {
    case MSGPACK_OBJECT_NIL:
        return "nil";
    case MSGPACK_OBJECT_BOOLEAN:
        return "a boolean";
    case MSGPACK_OBJECT_POSITIVE_INTEGER:
    case MSGPACK_OBJECT_NEGATIVE_INTEGER:
        return "an integer";
    case MSGPACK_OBJECT_FLOAT32:
    case MSGPACK_OBJECT_FLOAT64:
        return "a float";
    case MSGPACK_OBJECT_STR:
        return "a string";
    case MSGPACK_OBJECT_ARRAY:
        return "an array";
    case MSGPACK_OBJECT_MAP:
        return "a map";
    case MSGPACK_OBJECT_BIN:
        return "binary";
    case MSGPACK_OBJECT_EXT:
        return "an ext";
    }
    return "unknown";
}

/* Copies a peer-supplied string for an error message: printable ASCII, at most 40 chars. */
static const char *printable(const char *s, size_t n, char *buf, size_t len)
{
    size_t k = 0;
    for (size_t i = 0; i < n && k + 4 < len && i < 40; i++) {
        unsigned char ch = (unsigned char)s[i];
        buf[k++] = (ch >= 0x20 && ch < 0x7f && ch != '\'') ? (char)ch : '?';
    }
    if (n > 40 && k + 4 < len) {
        memcpy(buf + k, "...", 3);
        k += 3;
    }
    buf[k] = '\0';
    return buf;
}

static int key_is(const msgpack_object *k, const char *name)
{
    size_t n = strlen(name);
    return k->type == MSGPACK_OBJECT_STR && k->via.str.size == n &&
           memcmp(k->via.str.ptr, name, n) == 0;
}

/* Reads an integer object as (neg, i, u); -1 when the object is not an integer. */
static int obj_int(const msgpack_object *o, int *neg, int64_t *i, uint64_t *u)
{
    if (o->type == MSGPACK_OBJECT_POSITIVE_INTEGER) {
        *neg = 0;
        *u = o->via.u64;
        *i = 0;
        return 0;
    }
    if (o->type == MSGPACK_OBJECT_NEGATIVE_INTEGER) {
        *neg = 1;
        *i = o->via.i64;
        *u = 0;
        return 0;
    }
    return -1;
}

static tide_status fail_int(tide__ctx *c, const tide__field *f, const char *fn,
                            const msgpack_object *o)
{
    char want[96];
    tide__int_expect(f, want, sizeof want);
    if (o->type == MSGPACK_OBJECT_POSITIVE_INTEGER)
        return tide__fail(c, "%s must be %s, got %llu", fn, want, (unsigned long long)o->via.u64);
    if (o->type == MSGPACK_OBJECT_NEGATIVE_INTEGER)
        return tide__fail(c, "%s must be %s, got %lld", fn, want, (long long)o->via.i64);
    return tide__fail(c, "%s must be %s (got %s)", fn, want, obj_type_name(o->type));
}

static tide_status nomem(tide__ctx *c, const char *fn, uint32_t n)
{
    return tide_errorf(TIDE_ERR_NOMEM, "%s: out of memory decoding %s (%u entries)", c->msg, fn, n);
}

static tide_status decode_struct(const tide__schema *s, const msgpack_object *map, void *base,
                                 tide__ctx *c, int top);

/* The field's name for an error message, formatted only when one is needed: this runs for every
 * field of every message. */
#define fn (tide__field_name(c, f->key, fnbuf, sizeof fnbuf))
static tide_status decode_k_int(const tide__field *f, const msgpack_object *o, void *base,
                                tide__ctx *c)
{
    char fnbuf[160];
    int neg;
    int64_t i;
    uint64_t u;
    if (obj_int(o, &neg, &i, &u) != 0 || !tide__int_in_range(f, neg, i, u))
        return fail_int(c, f, fn, o);
    tide__int_store(f, base, neg, i, u);
    return TIDE_OK;
}

static tide_status decode_k_double(const tide__field *f, const msgpack_object *o, void *base,
                                   tide__ctx *c)
{
    (void)base;
    char fnbuf[160];
    char *p = (char *)base + f->off;
    double d;
    if (o->type == MSGPACK_OBJECT_FLOAT32 || o->type == MSGPACK_OBJECT_FLOAT64)
        d = o->via.f64;
    else if (o->type == MSGPACK_OBJECT_POSITIVE_INTEGER)
        d = (double)o->via.u64;
    else if (o->type == MSGPACK_OBJECT_NEGATIVE_INTEGER)
        d = (double)o->via.i64;
    else
        return tide__fail(c, "%s must be a number in [%g, %g] (got %s)", fn, f->dmin, f->dmax,
                          obj_type_name(o->type));
    if (!isfinite(d) || d < f->dmin || d > f->dmax)
        return tide__fail(c, "%s must be a finite number in [%g, %g], got %g", fn, f->dmin, f->dmax,
                          d);
    memcpy(p, &d, sizeof d);
    return TIDE_OK;
}

static tide_status decode_k_bool(const tide__field *f, const msgpack_object *o, void *base,
                                 tide__ctx *c)
{
    (void)base;
    char fnbuf[160];
    char *p = (char *)base + f->off;
    if (o->type != MSGPACK_OBJECT_BOOLEAN)
        return tide__fail(c, "%s must be a boolean (got %s)", fn, obj_type_name(o->type));
    int v = o->via.boolean ? 1 : 0;
    memcpy(p, &v, sizeof v);
    return TIDE_OK;
}

static tide_status decode_k_str(const tide__field *f, const msgpack_object *o, void *base,
                                tide__ctx *c)
{
    (void)base;
    char fnbuf[160];
    char *p = (char *)base + f->off;
    if (o->type != MSGPACK_OBJECT_STR)
        return tide__fail(c, "%s must be a string (got %s)", fn, obj_type_name(o->type));
    TIDE_CHECK(tide__check_str(c, f, o->via.str.ptr, o->via.str.size, f->size - 1, f->key));
    memcpy(p, o->via.str.ptr, o->via.str.size);
    p[o->via.str.size] = '\0';
    return TIDE_OK;
}

static tide_status decode_k_enum(const tide__field *f, const msgpack_object *o, void *base,
                                 tide__ctx *c)
{
    (void)base;
    char fnbuf[160];
    char *p = (char *)base + f->off;
    if (o->type == MSGPACK_OBJECT_STR) {
        for (int v = 0; v < f->n_names; v++) {
            if (key_is(o, f->names[v])) {
                memcpy(p, &v, sizeof v);
                return TIDE_OK;
            }
        }
    }
    char opts[160] = "";
    for (int v = 0; v < f->n_names; v++) {
        size_t len = strlen(opts);
        snprintf(opts + len, sizeof opts - len, "%s\"%s\"", v ? ", " : "", f->names[v]);
    }
    if (o->type == MSGPACK_OBJECT_STR) {
        char got[64];
        return tide__fail(c, "%s must be one of %s, got \"%s\"", fn, opts,
                          printable(o->via.str.ptr, o->via.str.size, got, sizeof got));
    }
    return tide__fail(c, "%s must be one of %s (got %s)", fn, opts, obj_type_name(o->type));
}

static tide_status decode_k_i32_array(const tide__field *f, const msgpack_object *o, void *base,
                                      tide__ctx *c)
{
    char fnbuf[160];
    char *p = (char *)base + f->off;
    int neg;
    int64_t i;
    uint64_t u;
    if (o->type != MSGPACK_OBJECT_ARRAY)
        return tide__fail(c, "%s must be an array of integers (got %s)", fn,
                          obj_type_name(o->type));
    uint32_t n = o->via.array.size;
    if (f->expect) {
        uint32_t want;
        TIDE_CHECK(f->expect(base, c, &want));
        if (n != want)
            return tide__fail(c, "%s must have %u entries, got %u", fn, want, n);
    } else if (n > f->cmax) {
        return tide__fail(c, "%s has %u entries, more than the limit of %u", fn, n, f->cmax);
    }
    int32_t *a = NULL;
    if (n > 0) {
        a = tide_malloc((size_t)n * sizeof *a);
        if (a == NULL)
            return nomem(c, fn, n);
    }
    memcpy(p, &a, sizeof a);
    if (f->count_off != TIDE__NO_OFF)
        tide__store_count(base, f->count_off, n);
    for (uint32_t k = 0; k < n; k++) {
        const msgpack_object *e = &o->via.array.ptr[k];
        if (obj_int(e, &neg, &i, &u) != 0 || !tide__int_in_range(f, neg, i, u)) {
            char efn[176];
            snprintf(efn, sizeof efn, "field '%s%s[%u]'", c->path, f->key, k);
            return fail_int(c, f, efn, e);
        }
        a[k] = neg ? (int32_t)i : (int32_t)u;
    }
    return TIDE_OK;
}

static tide_status decode_k_i64_fixed(const tide__field *f, const msgpack_object *o, void *base,
                                      tide__ctx *c)
{
    char fnbuf[160];
    char *p = (char *)base + f->off;
    int neg;
    int64_t i;
    uint64_t u;
    if (o->type != MSGPACK_OBJECT_ARRAY)
        return tide__fail(c, "%s must be an array of integers (got %s)", fn,
                          obj_type_name(o->type));
    uint32_t n = o->via.array.size;
    if (n < f->cmin || n > f->cmax)
        return tide__fail(c, "%s must have %u to %u entries, got %u", fn, f->cmin, f->cmax, n);
    int64_t *a = (int64_t *)(void *)p;
    for (uint32_t k = 0; k < n; k++) {
        const msgpack_object *e = &o->via.array.ptr[k];
        if (obj_int(e, &neg, &i, &u) != 0 || !tide__int_in_range(f, neg, i, u)) {
            char efn[176];
            snprintf(efn, sizeof efn, "field '%s%s[%u]'", c->path, f->key, k);
            return fail_int(c, f, efn, e);
        }
        a[k] = neg ? i : (int64_t)u;
    }
    tide__store_count(base, f->count_off, n);
    return TIDE_OK;
}

static tide_status decode_k_str_array(const tide__field *f, const msgpack_object *o, void *base,
                                      tide__ctx *c)
{
    char fnbuf[160];
    char *p = (char *)base + f->off;
    if (o->type != MSGPACK_OBJECT_ARRAY)
        return tide__fail(c, "%s must be an array of strings (got %s)", fn, obj_type_name(o->type));
    uint32_t n = o->via.array.size;
    if (n > f->cmax)
        return tide__fail(c, "%s has %u entries, more than the limit of %u", fn, n, f->cmax);
    char **a = NULL;
    if (n > 0) {
        a = tide_calloc(n, sizeof *a);
        if (a == NULL)
            return nomem(c, fn, n);
    }
    memcpy(p, &a, sizeof a);
    tide__store_count(base, f->count_off, n);
    for (uint32_t k = 0; k < n; k++) {
        const msgpack_object *e = &o->via.array.ptr[k];
        char key[48];
        snprintf(key, sizeof key, "%s[%u]", f->key, k);
        if (e->type != MSGPACK_OBJECT_STR)
            return tide__fail(c, "field '%s%s' must be a string (got %s)", c->path, key,
                              obj_type_name(e->type));
        TIDE_CHECK(tide__check_str(c, f, e->via.str.ptr, e->via.str.size, f->size, key));
        a[k] = tide_malloc((size_t)e->via.str.size + 1);
        if (a[k] == NULL)
            return nomem(c, fn, n);
        memcpy(a[k], e->via.str.ptr, e->via.str.size);
        a[k][e->via.str.size] = '\0';
    }
    return TIDE_OK;
}

static tide_status decode_k_u64_bin(const tide__field *f, const msgpack_object *o, void *base,
                                    tide__ctx *c)
{
    char fnbuf[160];
    char *p = (char *)base + f->off;
    if (o->type != MSGPACK_OBJECT_BIN)
        return tide__fail(c, "%s must be binary, 8 bytes per entry (got %s)", fn,
                          obj_type_name(o->type));
    uint32_t size = o->via.bin.size;
    if (size % 8 != 0)
        return tide__fail(c, "%s has %u bytes, not a whole number of 8-byte entries", fn, size);
    uint32_t n = size / 8;
    if (n > f->cmax)
        return tide__fail(c, "%s has %u entries, more than the limit of %u", fn, n, f->cmax);
    uint64_t *a = NULL;
    if (n > 0) {
        a = tide_malloc((size_t)n * sizeof *a);
        if (a == NULL)
            return nomem(c, fn, n);
    }
    memcpy(p, &a, sizeof a);
    tide__store_count(base, f->count_off, n);
    const uint8_t *b = (const uint8_t *)o->via.bin.ptr;
    for (uint32_t k = 0; k < n; k++) {
        uint64_t v = 0;
        for (int j = 7; j >= 0; j--)
            v = (v << 8) | b[(size_t)k * 8 + (size_t)j];
        a[k] = v;
    }
    return TIDE_OK;
}

static tide_status decode_k_struct(const tide__field *f, const msgpack_object *o, void *base,
                                   tide__ctx *c)
{
    char fnbuf[160];
    char *p = (char *)base + f->off;
    int has = 1;
    if ((f->flags & TIDE__F_NULLABLE) && o->type == MSGPACK_OBJECT_NIL) {
        has = 0;
    } else if (o->type != MSGPACK_OBJECT_MAP) {
        return tide__fail(c, "%s must be a map%s (got %s)", fn,
                          (f->flags & TIDE__F_NULLABLE) ? " or nil" : "", obj_type_name(o->type));
    }
    if (f->flags & TIDE__F_NULLABLE)
        memcpy((char *)base + f->has_off, &has, sizeof has);
    if (!has)
        return TIDE_OK;
    size_t plen = strlen(c->path);
    snprintf(c->path + plen, sizeof c->path - plen, "%s.", f->key);
    tide_status rc = decode_struct(f->sub, o, p, c, 0);
    c->path[plen] = '\0';
    return rc;
}

static tide_status decode_k_struct_array(const tide__field *f, const msgpack_object *o, void *base,
                                         tide__ctx *c)
{
    char fnbuf[160];
    char *p = (char *)base + f->off;
    if (o->type != MSGPACK_OBJECT_ARRAY)
        return tide__fail(c, "%s must be an array of maps (got %s)", fn, obj_type_name(o->type));
    uint32_t n = o->via.array.size;
    if (n > f->cmax)
        return tide__fail(c, "%s has %u entries, more than the limit of %u", fn, n, f->cmax);
    char *a = NULL;
    if (n > 0) {
        a = tide_calloc(n, f->sub->size);
        if (a == NULL)
            return nomem(c, fn, n);
    }
    memcpy(p, &a, sizeof a);
    tide__store_count(base, f->count_off, n); /* zeroed elements: safe to free if we fail */
    size_t plen = strlen(c->path);
    tide_status rc = TIDE_OK;
    for (uint32_t k = 0; k < n && rc == TIDE_OK; k++) {
        const msgpack_object *e = &o->via.array.ptr[k];
        tide__path_index(c, plen, f->key, k);
        if (e->type != MSGPACK_OBJECT_MAP) {
            c->path[plen] = '\0';
            return tide__fail(c, "field '%s%s[%u]' must be a map (got %s)", c->path, f->key, k,
                              obj_type_name(e->type));
        }
        rc = decode_struct(f->sub, e, a + (size_t)k * f->sub->size, c, 0);
    }
    c->path[plen] = '\0';
    return rc;
}

static tide_status decode_field(const tide__field *f, const msgpack_object *o, void *base,
                                tide__ctx *c)
{
    char fnbuf[160];
    switch (f->kind) {
    case TIDE__K_INT:
        return decode_k_int(f, o, base, c);
    case TIDE__K_DOUBLE:
        return decode_k_double(f, o, base, c);
    case TIDE__K_BOOL:
        return decode_k_bool(f, o, base, c);
    case TIDE__K_STR:
        return decode_k_str(f, o, base, c);
    case TIDE__K_ENUM:
        return decode_k_enum(f, o, base, c);
    case TIDE__K_I32_ARRAY:
        return decode_k_i32_array(f, o, base, c);
    case TIDE__K_I64_FIXED:
        return decode_k_i64_fixed(f, o, base, c);
    case TIDE__K_STR_ARRAY:
        return decode_k_str_array(f, o, base, c);
    case TIDE__K_U64_BIN:
        return decode_k_u64_bin(f, o, base, c);
    case TIDE__K_STRUCT:
        return decode_k_struct(f, o, base, c);
    case TIDE__K_STRUCT_ARRAY:
        return decode_k_struct_array(f, o, base, c);
    }
    return tide__fail(c, "%s has an unknown kind", fn);
}
#undef fn

static tide_status decode_struct(const tide__schema *s, const msgpack_object *map, void *base,
                                 tide__ctx *c, int top)
{
    const msgpack_object *vals[32] = {0};
    char buf[64];
    if (s->n_fields > 32)
        return tide_errorf(TIDE_ERR_INTERNAL, "%s: schema has more than 32 fields", c->msg);
    for (uint32_t k = 0; k < map->via.map.size; k++) {
        const msgpack_object_kv *kv = &map->via.map.ptr[k];
        if (kv->key.type != MSGPACK_OBJECT_STR)
            return tide__fail(c, "map keys must be strings (got %s in %s)",
                              obj_type_name(kv->key.type), c->path[0] ? c->path : "the message");
        if (top && (key_is(&kv->key, "v") || key_is(&kv->key, "type")))
            continue; /* checked by tide_proto_decode */
        size_t f = 0;
        while (f < s->n_fields && !key_is(&kv->key, s->fields[f].key))
            f++;
        if (f == s->n_fields)
            return tide__fail(c, "unknown field '%s%s' (schema v%d has no such field)", c->path,
                              printable(kv->key.via.str.ptr, kv->key.via.str.size, buf, sizeof buf),
                              TIDE_PROTO_VERSION);
        if (vals[f] != NULL)
            return tide__fail(c, "duplicated field '%s%s'", c->path, s->fields[f].key);
        vals[f] = &kv->val;
    }
    /* Schema order, not wire order: counts implied by earlier fields (pp before stages). */
    for (size_t f = 0; f < s->n_fields; f++) {
        if (vals[f] == NULL && (s->fields[f].flags & TIDE__F_OPTIONAL))
            continue; /* a peer of before the field: it stays 0 */
        if (vals[f] == NULL)
            return tide__fail(c, "missing field '%s%s'", c->path, s->fields[f].key);
        TIDE_CHECK(decode_field(&s->fields[f], vals[f], base, c));
    }
    if (s->check)
        TIDE_CHECK(s->check(base, c));
    return TIDE_OK;
}

/* Finds "v" and "type" at the top level, refusing duplicates; sets *type. */
static tide_status decode_header(const msgpack_object *root, tide__ctx *c, tide_msg_type_t *type)
{
    const msgpack_object *v = NULL, *t = NULL;
    char buf[64];
    for (uint32_t k = 0; k < root->via.map.size; k++) {
        const msgpack_object_kv *kv = &root->via.map.ptr[k];
        if (kv->key.type != MSGPACK_OBJECT_STR)
            return tide__fail(c, "map keys must be strings (got %s in the message)",
                              obj_type_name(kv->key.type));
        if (key_is(&kv->key, "v")) {
            if (v)
                return tide__fail(c, "duplicated field 'v'");
            v = &kv->val;
        } else if (key_is(&kv->key, "type")) {
            if (t)
                return tide__fail(c, "duplicated field 'type'");
            t = &kv->val;
        }
    }
    if (v == NULL)
        return tide__fail(c, "missing field 'v' (the schema version, %d)", TIDE_PROTO_VERSION);
    if (v->type != MSGPACK_OBJECT_POSITIVE_INTEGER || v->via.u64 != TIDE_PROTO_VERSION) {
        if (v->type == MSGPACK_OBJECT_POSITIVE_INTEGER)
            return tide__fail(c, "unsupported schema version v=%llu (this build speaks v=%d)",
                              (unsigned long long)v->via.u64, TIDE_PROTO_VERSION);
        return tide__fail(c, "field 'v' must be the integer %d (got %s)", TIDE_PROTO_VERSION,
                          obj_type_name(v->type));
    }
    if (t == NULL)
        return tide__fail(c, "missing field 'type'");
    if (t->type != MSGPACK_OBJECT_STR)
        return tide__fail(c, "field 'type' must be a string (got %s)", obj_type_name(t->type));
    for (int k = TIDE_MSG_NONE + 1; k < TIDE_MSG__COUNT; k++) {
        if (key_is(t, tide_msg_type_name((tide_msg_type_t)k))) {
            *type = (tide_msg_type_t)k;
            return TIDE_OK;
        }
    }
    return tide__fail(c, "unknown type '%s'",
                      printable(t->via.str.ptr, t->via.str.size, buf, sizeof buf));
}

/* Decodes one message of at most max_bytes and max_objects values; of type want unless
   want is TIDE_MSG_NONE. */
static tide_status decode_limited(const void *data, size_t len, tide_msg_t *out, size_t max_bytes,
                                  uint32_t max_objects, tide_msg_type_t want)
{
    tide__ctx c = {TIDE_ERR_PROTOCOL, "message", ""};
    tide_msg_init(out, TIDE_MSG_NONE);
    if (len == 0)
        return tide__fail(&c, "empty input");
    if (data == NULL)
        return tide_errorf(TIDE_ERR_INVALID, "tide_proto_decode: data is NULL");
    if (len > max_bytes)
        return tide__fail(&c, "%zu bytes exceed the %zu-byte message limit", len, max_bytes);

    skim_t s = {data, data, (const uint8_t *)data + len, 0, max_objects, &c};
    TIDE_CHECK(skim_one(&s, 0));
    if (s.p != s.end)
        return tide__fail(&c, "%zu trailing bytes after the message map", (size_t)(s.end - s.p));
    uint8_t lead = ((const uint8_t *)data)[0];
    if (!((lead >= 0x80 && lead <= 0x8f) || lead == 0xde || lead == 0xdf))
        return tide__fail(&c, "the top level must be a map");

    msgpack_unpacked u;
    msgpack_unpacked_init(&u);
    size_t off = 0;
    tide_status rc = TIDE_OK;
    tide_msg_type_t type = TIDE_MSG_NONE;
    msgpack_unpack_return ur = msgpack_unpack_next(&u, data, len, &off);
    if (ur == MSGPACK_UNPACK_NOMEM_ERROR) {
        rc = tide_errorf(TIDE_ERR_NOMEM, "message: out of memory unpacking %zu bytes", len);
        goto out;
    }
    if (ur != MSGPACK_UNPACK_SUCCESS || off != len || u.data.type != MSGPACK_OBJECT_MAP) {
        rc = tide__fail(&c, "msgpack-c could not unpack the message (code %d)", (int)ur);
        goto out;
    }
    TIDE_CHECK_GOTO(decode_header(&u.data, &c, &type), rc, out);
    if (want != TIDE_MSG_NONE && type != want)
        TIDE_FAIL_GOTO(rc, out, TIDE_ERR_PROTOCOL, "the record is a '%s', not a '%s'",
                       tide_msg_type_name(type), tide_msg_type_name(want));
    c.msg = tide_msg_type_name(type);
    out->type = type;
    TIDE_CHECK_GOTO(decode_struct(tide__msg_schema(type), &u.data, &out->u, &c, 1), rc, out);
out:
    if (rc != TIDE_OK)
        tide_msg_clear(out);
    msgpack_unpacked_destroy(&u);
    return rc;
}

tide_status tide_proto_decode(const void *data, size_t len, tide_msg_t *out)
{
    return decode_limited(data, len, out, TIDE_PROTO_MAX_MSG_BYTES, TIDE_PROTO_MAX_OBJECTS,
                          TIDE_MSG_NONE);
}

tide_status tide_proto_decode_record(const void *data, size_t len, tide_msg_type_t type,
                                     tide_msg_t *out)
{
    if (tide_msg_type_role(type) != TIDE_ROLE_RECORD) {
        tide_msg_init(out, TIDE_MSG_NONE);
        return tide_errorf(TIDE_ERR_INVALID, "a '%s' message is no record",
                           tide_msg_type_name(type));
    }
    return decode_limited(data, len, out, TIDE_PROTO_RECORD_MAX_BYTES,
                          TIDE_PROTO_RECORD_MAX_OBJECTS, type);
}

/* msgpack-c's sbuffer writer, with tide's allocator (so failures are injectable). */
static int upgrade_write(void *data, const char *buf, size_t len)
{
    tide_proto_buf_t *b = data;
    if (b->len + len > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + len)
            cap *= 2;
        uint8_t *p = tide_realloc(b->data, cap);
        if (p == NULL)
            return -1;
        b->data = p;
        b->cap = cap;
    }
    memcpy(b->data + b->len, buf, len);
    b->len += len;
    return 0;
}

tide_status tide_proto_join_upgrade(const void *data, size_t len, uint8_t **out, size_t *out_len)
{
    *out = NULL;
    *out_len = 0;
    if (data == NULL || len == 0 || len > TIDE_PROTO_MAX_MSG_BYTES)
        return tide_errorf(TIDE_ERR_PROTOCOL, "join: %zu bytes are no stored join message", len);
    msgpack_unpacked u;
    msgpack_unpacked_init(&u);
    tide_proto_buf_t b;
    tide_proto_buf_init(&b);
    tide_status rc = TIDE_OK;
    size_t off = 0;
    msgpack_unpack_return ur = msgpack_unpack_next(&u, data, len, &off);
    if (ur == MSGPACK_UNPACK_NOMEM_ERROR)
        TIDE_FAIL_GOTO(rc, done, TIDE_ERR_NOMEM, "join: out of memory unpacking %zu bytes", len);
    if (ur != MSGPACK_UNPACK_SUCCESS || off != len || u.data.type != MSGPACK_OBJECT_MAP)
        TIDE_FAIL_GOTO(rc, done, TIDE_ERR_PROTOCOL,
                       "join: the stored message is not one msgpack map (code %d)", (int)ur);
    const msgpack_object_map *m = &u.data.via.map;
    int has_fit = 0;
    for (uint32_t k = 0; k < m->size; k++)
        has_fit |= key_is(&m->ptr[k].key, "fit");
    msgpack_packer pk;
    msgpack_packer_init(&pk, &b, upgrade_write);
    int bad = msgpack_pack_map(&pk, m->size + (has_fit ? 0 : 1));
    for (uint32_t k = 0; k < m->size && !bad; k++)
        bad = msgpack_pack_object(&pk, m->ptr[k].key) || msgpack_pack_object(&pk, m->ptr[k].val);
    if (!bad && !has_fit)
        bad = msgpack_pack_str(&pk, 3) || msgpack_pack_str_body(&pk, "fit", 3) ||
              msgpack_pack_array(&pk, 0);
    if (bad)
        TIDE_FAIL_GOTO(rc, done, TIDE_ERR_NOMEM, "join: out of memory upgrading %zu bytes", len);
    tide_msg_t check;
    TIDE_CHECK_GOTO(tide_proto_decode(b.data, b.len, &check), rc, done);
    tide_msg_type_t type = check.type;
    tide_msg_clear(&check);
    if (type != TIDE_MSG_JOIN)
        TIDE_FAIL_GOTO(rc, done, TIDE_ERR_PROTOCOL, "join: the stored message is a '%s'",
                       tide_msg_type_name(type));
    *out = tide_proto_buf_release(&b, out_len);
done:
    tide_proto_buf_destroy(&b);
    msgpack_unpacked_destroy(&u);
    return rc;
}
