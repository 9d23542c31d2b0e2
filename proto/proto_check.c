/*
 * proto_check: the checks every codec path shares (proto_int.h): the failure message with
 * the field's path, integer ranges and stores, names and strings. proto_msg.c (validation),
 * proto_encode.c, proto_decode.c and the schemas' rules call in here; nothing here calls back.
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "core/error.h"
#include "proto/proto_int.h"

tide_status tide__fail(tide__ctx *c, const char *fmt, ...)
{
    char text[448];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    return tide_errorf(c->code, "%s: %s", c->msg, text);
}

void tide__path_index(tide__ctx *c, size_t plen, const char *key, uint32_t k)
{
    char num[12];
    size_t nd = 0;
    do {
        num[nd++] = (char)('0' + k % 10);
        k /= 10;
    } while (k != 0);
    char *p = c->path + plen, *end = c->path + sizeof c->path - 1;
    for (const char *q = key; *q && p < end; q++)
        *p++ = *q;
    if (p < end)
        *p++ = '[';
    while (nd > 0 && p < end)
        *p++ = num[--nd];
    for (const char *q = "]."; *q && p < end; q++)
        *p++ = *q;
    *p = '\0';
}

const char *tide__field_name(const tide__ctx *c, const char *key, char *buf, size_t len)
{
    snprintf(buf, len, "field '%s%s'", c->path, key);
    return buf;
}

int tide__int_in_range(const tide__field *f, int neg, int64_t i, uint64_t u)
{
    if (f->flags & TIDE__F_UNSIGNED) /* bounds are [min >= 0, max] as uint64 */
        return !neg && u >= (uint64_t)f->min && u <= f->max;
    int64_t max = (int64_t)f->max; /* signed fields keep an int64 upper bound in max */
    if (neg)
        return i >= f->min && i <= max;
    return max >= 0 && u <= (uint64_t)max && (f->min <= 0 || u >= (uint64_t)f->min);
}

const char *tide__int_expect(const tide__field *f, char *buf, size_t len)
{
    int is_unsigned = (f->flags & TIDE__F_UNSIGNED) != 0;
    if (f->min == 0 &&
        ((is_unsigned && f->max == UINT64_MAX) || (!is_unsigned && f->max == INT64_MAX)))
        snprintf(buf, len, "a non-negative integer");
    else if (is_unsigned && f->max == UINT64_MAX)
        snprintf(buf, len, "an integer >= %lld", (long long)f->min);
    else if (is_unsigned)
        snprintf(buf, len, "an integer in [%lld, %llu]", (long long)f->min,
                 (unsigned long long)f->max);
    else
        snprintf(buf, len, "an integer in [%lld, %lld]", (long long)f->min, (long long)f->max);
    return buf;
}

void tide__int_store(const tide__field *f, void *base, int neg, int64_t i, uint64_t u)
{
    char *p = (char *)base + f->off;
    int64_t sv = neg ? i : (int64_t)u; /* in range, so it fits the storage */
    if (f->size == 8) {
        if (f->flags & TIDE__F_UNSIGNED)
            memcpy(p, &u, 8);
        else
            memcpy(p, &sv, 8);
    } else {
        if (f->flags & TIDE__F_UNSIGNED) {
            uint32_t v = (uint32_t)u;
            memcpy(p, &v, 4);
        } else {
            int32_t v = (int32_t)sv;
            memcpy(p, &v, 4);
        }
    }
}

/* Reads a stored integer back as (neg, i, u). */
void tide__int_load(const tide__field *f, const void *base, int *neg, int64_t *i, uint64_t *u)
{
    const char *p = (const char *)base + f->off;
    int64_t sv = 0;
    uint64_t uv = 0;
    if (f->size == 8) {
        if (f->flags & TIDE__F_UNSIGNED)
            memcpy(&uv, p, 8);
        else
            memcpy(&sv, p, 8);
    } else {
        if (f->flags & TIDE__F_UNSIGNED) {
            uint32_t v;
            memcpy(&v, p, 4);
            uv = v;
        } else {
            int32_t v;
            memcpy(&v, p, 4);
            sv = v;
        }
    }
    if (f->flags & TIDE__F_UNSIGNED) {
        *neg = 0;
        *u = uv;
        *i = 0;
    } else {
        *neg = sv < 0;
        *i = sv;
        *u = sv < 0 ? 0 : (uint64_t)sv;
    }
}

static int name_char(unsigned char ch)
{
    return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
           ch == '.' || ch == '_' || ch == '-' || ch == ':';
}

/* The field's name for an error message, formatted only when one is needed: this runs for every
 * field of every message. */
#define fn (tide__field_name(c, key, fnbuf, sizeof fnbuf))
tide_status tide__check_str(tide__ctx *c, const tide__field *f, const char *s, size_t n,
                            size_t max_len, const char *key)
{
    char fnbuf[160];
    if (n > max_len)
        return tide__fail(c, "%s is %zu bytes, longer than the limit of %zu", fn, n, max_len);
    if (n < (size_t)f->min)
        return tide__fail(c, "%s must not be empty", fn);
    if (memchr(s, '\0', n) != NULL)
        return tide__fail(c, "%s must not contain a NUL byte", fn);
    for (size_t k = 0; k < n && f->charset != TIDE__CS_TEXT; k++) {
        unsigned char ch = (unsigned char)s[k];
        if (f->charset == TIDE__CS_NAME && !name_char(ch))
            return tide__fail(
                c, "%s may hold only letters, digits and . _ - : (byte %zu is 0x%02x)", fn, k, ch);
        if (f->charset == TIDE__CS_HOST && (ch <= 0x20 || ch >= 0x7f))
            return tide__fail(
                c, "%s may hold only printable ASCII without spaces (byte %zu is 0x%02x)", fn, k,
                ch);
        if (f->charset == TIDE__CS_LINE && (ch < 0x20 || ch >= 0x7f))
            return tide__fail(c, "%s may hold only printable ASCII (byte %zu is 0x%02x)", fn, k,
                              ch);
    }
    return TIDE_OK;
}
#undef fn
