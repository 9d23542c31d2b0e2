/*
 * proto: encoding and the byte buffer, what senders call (workers, tided's replies,
 * tidectl's requests, the records tided and checkpoints write). Encoding validates the
 * message (proto_msg.c), then walks its schema and packs with msgpack-c's packer into a
 * tide_proto_buf_t grown with tide_realloc (so allocation failures are injectable).
 * Workload: one small message per heartbeat on each worker, ~10^4 encodes/s of replies at
 * most in tided; records up to TIDE_PROTO_RECORD_MAX_BYTES.
 */
#include <msgpack.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "proto/proto_int.h"

/* ---- buffer ------------------------------------------------------------------------------------
 */

void tide_proto_buf_init(tide_proto_buf_t *buf)
{
    buf->data = NULL;
    buf->len = 0;
    buf->cap = 0;
}

void tide_proto_buf_destroy(tide_proto_buf_t *buf)
{
    if (buf == NULL)
        return;
    tide_free(buf->data);
    tide_proto_buf_init(buf);
}

uint8_t *tide_proto_buf_release(tide_proto_buf_t *buf, size_t *len)
{
    uint8_t *d = buf->data;
    if (len)
        *len = buf->len;
    tide_proto_buf_init(buf);
    return d;
}

/* msgpack_packer write callback: appends, doubling capacity; -1 on allocation failure. */
static int buf_write(void *data, const char *src, size_t n)
{
    tide_proto_buf_t *b = data;
    if (n > SIZE_MAX - b->len)
        return -1;
    if (b->len + n > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n)
            cap = cap > SIZE_MAX / 2 ? b->len + n : cap * 2;
        uint8_t *d = tide_realloc(b->data, cap);
        if (d == NULL)
            return -1;
        b->data = d;
        b->cap = cap;
    }
    memcpy(b->data + b->len, src, n);
    b->len += n;
    return 0;
}

/* ---- encode ------------------------------------------------------------------------------------
 */

static int pack_str(msgpack_packer *pk, const char *s, size_t n)
{
    if (msgpack_pack_str(pk, n) != 0)
        return -1;
    return msgpack_pack_str_body(pk, s, n);
}

static int pack_key(msgpack_packer *pk, const char *key)
{
    return pack_str(pk, key, strlen(key));
}

static int encode_struct(const tide__schema *s, const void *base, msgpack_packer *pk, int top,
                         const char *type_name);

/* A field of several values: an array, or uint64s as one bin. 0, or -1 when the packer failed. */
static int encode_array(const tide__field *f, const void *base, msgpack_packer *pk)
{
    const char *p = (const char *)base + f->off;
    switch (f->kind) {
    case TIDE__K_I32_ARRAY: {
        uint32_t n;
        if (f->expect) {
            tide__ctx c = {TIDE_ERR_INVALID, "", ""};
            if (f->expect(base, &c, &n) != TIDE_OK) /* validated before: cannot fail */
                return -1;
        } else {
            n = tide__load_count(base, f->count_off);
        }
        const int32_t *a;
        memcpy(&a, p, sizeof a);
        if (msgpack_pack_array(pk, n) != 0)
            return -1;
        for (uint32_t k = 0; k < n; k++)
            if (msgpack_pack_int32(pk, a[k]) != 0)
                return -1;
        return 0;
    }
    case TIDE__K_I64_FIXED: {
        uint32_t n = tide__load_count(base, f->count_off);
        const int64_t *a = (const int64_t *)(const void *)p;
        if (msgpack_pack_array(pk, n) != 0)
            return -1;
        for (uint32_t k = 0; k < n; k++)
            if (msgpack_pack_int64(pk, a[k]) != 0)
                return -1;
        return 0;
    }
    case TIDE__K_STR_ARRAY: {
        uint32_t n = tide__load_count(base, f->count_off);
        char *const *a;
        memcpy(&a, p, sizeof a);
        if (msgpack_pack_array(pk, n) != 0)
            return -1;
        for (uint32_t k = 0; k < n; k++)
            if (pack_str(pk, a[k], strlen(a[k])) != 0)
                return -1;
        return 0;
    }
    case TIDE__K_U64_BIN: {
        uint32_t n = tide__load_count(base, f->count_off);
        const uint64_t *a;
        memcpy(&a, p, sizeof a);
        if (msgpack_pack_bin(pk, (size_t)n * 8) != 0)
            return -1;
        uint8_t le[512];
        for (uint32_t k = 0; k < n;) {
            size_t m = 0;
            for (; k < n && m < sizeof le; k++, m += 8)
                for (int b = 0; b < 8; b++)
                    le[m + (size_t)b] = (uint8_t)(a[k] >> (8 * b));
            if (msgpack_pack_bin_body(pk, le, m) != 0)
                return -1;
        }
        return 0;
    }
    case TIDE__K_STRUCT_ARRAY: {
        uint32_t n = tide__load_count(base, f->count_off);
        const char *a;
        memcpy(&a, p, sizeof a);
        if (msgpack_pack_array(pk, n) != 0)
            return -1;
        for (uint32_t k = 0; k < n; k++)
            if (encode_struct(f->sub, a + (size_t)k * f->sub->size, pk, 0, NULL) != 0)
                return -1;
        return 0;
    }
    default:
        return -1;
    }
}

static int encode_field(const tide__field *f, const void *base, msgpack_packer *pk)
{
    const char *p = (const char *)base + f->off;
    switch (f->kind) {
    case TIDE__K_INT: {
        int neg;
        int64_t i;
        uint64_t u;
        tide__int_load(f, base, &neg, &i, &u);
        return neg ? msgpack_pack_int64(pk, i) : msgpack_pack_uint64(pk, u);
    }
    case TIDE__K_DOUBLE: {
        double d;
        memcpy(&d, p, sizeof d);
        return msgpack_pack_double(pk, d);
    }
    case TIDE__K_BOOL: {
        int v;
        memcpy(&v, p, sizeof v);
        return v ? msgpack_pack_true(pk) : msgpack_pack_false(pk);
    }
    case TIDE__K_STR:
        return pack_str(pk, p, strlen(p));
    case TIDE__K_ENUM: {
        int v;
        memcpy(&v, p, sizeof v);
        return pack_key(pk, f->names[v]);
    }
    case TIDE__K_STRUCT:
        if (f->flags & TIDE__F_NULLABLE) {
            int has;
            memcpy(&has, (const char *)base + f->has_off, sizeof has);
            if (!has)
                return msgpack_pack_nil(pk);
        }
        return encode_struct(f->sub, p, pk, 0, NULL);
    default:
        return encode_array(f, base, pk);
    }
}

/* 1 when field f of base is optional and 0: it is left out (peers of before it decode the
   message, and a heartbeat stays small). Optional fields are doubles or integers. */
static int left_out(const tide__field *f, const void *base)
{
    if (!(f->flags & TIDE__F_OPTIONAL))
        return 0;
    const char *p = (const char *)base + f->off;
    if (f->kind == TIDE__K_DOUBLE) {
        double v;
        memcpy(&v, p, sizeof v);
        return v == 0.0;
    }
    static const char zero[sizeof(uint64_t)];
    return f->size <= sizeof zero && memcmp(p, zero, f->size) == 0;
}

static int encode_struct(const tide__schema *s, const void *base, msgpack_packer *pk, int top,
                         const char *type_name)
{
    size_t n = s->n_fields;
    for (size_t k = 0; k < s->n_fields; k++)
        n -= (size_t)left_out(&s->fields[k], base);
    if (msgpack_pack_map(pk, n + (top ? 2 : 0)) != 0)
        return -1;
    if (top) {
        if (pack_key(pk, "v") != 0 || msgpack_pack_uint64(pk, TIDE_PROTO_VERSION) != 0 ||
            pack_key(pk, "type") != 0 || pack_key(pk, type_name) != 0)
            return -1;
    }
    for (size_t k = 0; k < s->n_fields; k++) {
        if (left_out(&s->fields[k], base))
            continue;
        if (pack_key(pk, s->fields[k].key) != 0 || encode_field(&s->fields[k], base, pk) != 0)
            return -1;
    }
    return 0;
}

/* Encodes msg into buf if it validates and its encoding has at most limit bytes. */
static tide_status encode_limited(const tide_msg_t *msg, tide_proto_buf_t *buf, size_t limit)
{
    buf->len = 0;
    TIDE_CHECK(tide_msg_validate(msg));
    msgpack_packer pk;
    msgpack_packer_init(&pk, buf, buf_write);
    if (encode_struct(tide__msg_schema(msg->type), &msg->u, &pk, 1,
                      tide_msg_type_name(msg->type)) != 0) {
        buf->len = 0;
        return tide_errorf(TIDE_ERR_NOMEM, "out of memory encoding a %s message",
                           tide_msg_type_name(msg->type));
    }
    if (buf->len > limit) {
        size_t n = buf->len;
        buf->len = 0;
        return tide_errorf(TIDE_ERR_INVALID,
                           "%s: encoded message is %zu bytes, over the %zu-byte limit",
                           tide_msg_type_name(msg->type), n, limit);
    }
    return TIDE_OK;
}

tide_status tide_proto_encode(const tide_msg_t *msg, tide_proto_buf_t *buf)
{
    return encode_limited(msg, buf, TIDE_PROTO_MAX_MSG_BYTES);
}

tide_status tide_proto_encode_record(const tide_msg_t *msg, tide_proto_buf_t *buf)
{
    buf->len = 0;
    if (msg == NULL || tide_msg_type_role(msg->type) != TIDE_ROLE_RECORD)
        return tide_errorf(TIDE_ERR_INVALID, "a '%s' message is no record",
                           msg ? tide_msg_type_name(msg->type) : "(null)");
    return encode_limited(msg, buf, TIDE_PROTO_RECORD_MAX_BYTES);
}
