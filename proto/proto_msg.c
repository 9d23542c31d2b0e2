/*
 * proto: a message as a C struct, walked by its schema: validation (every rule decode
 * enforces, on values a sender filled in) and init / clear (freeing what the struct owns).
 * Senders validate through tide_proto_encode, or call tide_msg_validate on what they build
 * (worker's probes, proto_legacy.c's records); everyone who holds a message clears it.
 * Workload: a walk per message encoded and one per message cleared, ~10^4/s each in tided.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "proto/proto_int.h"

/* ---- validate (encode side) --------------------------------------------------------------------
 */

/* The field's name for an error message, formatted only when one is needed: this runs for every
 * field of every message. */
#define fn (tide__field_name(c, f->key, fnbuf, sizeof fnbuf))

/* A field of one value (int, double, bool, string, enum, nested struct). */
static tide_status validate_scalar(const tide__field *f, const void *base, tide__ctx *c)
{
    char fnbuf[160], want[96];
    const char *p = (const char *)base + f->off;
    switch (f->kind) {
    case TIDE__K_INT: {
        int neg;
        int64_t i;
        uint64_t u;
        tide__int_load(f, base, &neg, &i, &u);
        if (!tide__int_in_range(f, neg, i, u))
            return tide__fail(c, "%s must be %s, got %s%llu", fn,
                              tide__int_expect(f, want, sizeof want), neg ? "-" : "",
                              neg ? (unsigned long long)(-(i + 1)) + 1ull : (unsigned long long)u);
        return TIDE_OK;
    }
    case TIDE__K_DOUBLE: {
        double d;
        memcpy(&d, p, sizeof d);
        if (!isfinite(d) || d < f->dmin || d > f->dmax)
            return tide__fail(c, "%s must be a finite number in [%g, %g], got %g", fn, f->dmin,
                              f->dmax, d);
        return TIDE_OK;
    }
    case TIDE__K_BOOL: {
        int v;
        memcpy(&v, p, sizeof v);
        if (v != 0 && v != 1)
            return tide__fail(c, "%s must be a boolean (0 or 1), got %d", fn, v);
        return TIDE_OK;
    }
    case TIDE__K_STR: {
        size_t n = strnlen(p, f->size);
        if (n == f->size)
            return tide__fail(c, "%s is not NUL-terminated within %zu bytes", fn, f->size);
        return tide__check_str(c, f, p, n, f->size - 1, f->key);
    }
    case TIDE__K_ENUM: {
        int v;
        memcpy(&v, p, sizeof v);
        if (v < 0 || v >= f->n_names)
            return tide__fail(c, "%s has no wire name for value %d", fn, v);
        return TIDE_OK;
    }
    case TIDE__K_STRUCT: {
        if (f->flags & TIDE__F_NULLABLE) {
            int has;
            memcpy(&has, (const char *)base + f->has_off, sizeof has);
            if (!has)
                return TIDE_OK;
        }
        size_t plen = strlen(c->path);
        snprintf(c->path + plen, sizeof c->path - plen, "%s.", f->key);
        tide_status rc = tide__validate_struct(f->sub, p, c);
        c->path[plen] = '\0';
        return rc;
    }
    default:
        return tide__fail(c, "%s has an unknown kind", fn);
    }
}

/* An array's count within its limit and its pointer set when it has entries; *out: the
 * pointer (borrowed). */
static tide_status array_head(const tide__field *f, const void *base, uint32_t n, const void **out,
                              tide__ctx *c)
{
    char fnbuf[160];
    memcpy(out, (const char *)base + f->off, sizeof *out);
    if (n > f->cmax)
        return tide__fail(c, "%s has %u entries, more than the limit of %u", fn, n, f->cmax);
    if (n > 0 && *out == NULL)
        return tide__fail(c, "%s is NULL but needs %u entries", fn, n);
    return TIDE_OK;
}

/* A field of several values (int32s, fixed int64s, strings, uint64 bins, structs). */
static tide_status validate_array(const tide__field *f, const void *base, tide__ctx *c)
{
    char fnbuf[160], want[96];
    uint32_t n = 0;
    const void *v;
    switch (f->kind) {
    case TIDE__K_I32_ARRAY: {
        if (f->expect)
            TIDE_CHECK(f->expect(base, c, &n));
        else
            n = tide__load_count(base, f->count_off);
        if (f->count_off != TIDE__NO_OFF) {
            TIDE_CHECK(array_head(f, base, n, &v, c));
        } else { /* a count another field sets (expect) has no limit of its own */
            memcpy(&v, (const char *)base + f->off, sizeof v);
            if (n > 0 && v == NULL)
                return tide__fail(c, "%s is NULL but needs %u entries", fn, n);
        }
        const int32_t *a = v;
        for (uint32_t k = 0; k < n; k++) {
            if (!tide__int_in_range(f, a[k] < 0, a[k], a[k] < 0 ? 0 : (uint64_t)a[k]))
                return tide__fail(c, "%s[%u] must be %s, got %d", fn, k,
                                  tide__int_expect(f, want, sizeof want), a[k]);
        }
        return TIDE_OK;
    }
    case TIDE__K_I64_FIXED: {
        n = tide__load_count(base, f->count_off);
        if (n < f->cmin || n > f->cmax)
            return tide__fail(c, "%s must have %u to %u entries, got %u", fn, f->cmin, f->cmax, n);
        const int64_t *a = (const int64_t *)(const void *)((const char *)base + f->off);
        for (uint32_t k = 0; k < n; k++)
            if (a[k] < f->min)
                return tide__fail(c, "%s[%u] must be %s, got %lld", fn, k,
                                  tide__int_expect(f, want, sizeof want), (long long)a[k]);
        return TIDE_OK;
    }
    case TIDE__K_STR_ARRAY: {
        n = tide__load_count(base, f->count_off);
        TIDE_CHECK(array_head(f, base, n, &v, c));
        char *const *a = v;
        for (uint32_t k = 0; k < n; k++) {
            char key[48];
            snprintf(key, sizeof key, "%s[%u]", f->key, k);
            if (a[k] == NULL)
                return tide__fail(c, "field '%s%s' is NULL", c->path, key);
            TIDE_CHECK(tide__check_str(c, f, a[k], strnlen(a[k], f->size + 1), f->size, key));
        }
        return TIDE_OK;
    }
    case TIDE__K_U64_BIN:
        return array_head(f, base, tide__load_count(base, f->count_off), &v, c);
    case TIDE__K_STRUCT_ARRAY: {
        n = tide__load_count(base, f->count_off);
        TIDE_CHECK(array_head(f, base, n, &v, c));
        const char *a = v;
        size_t plen = strlen(c->path);
        tide_status rc = TIDE_OK;
        for (uint32_t k = 0; k < n && rc == TIDE_OK; k++) {
            tide__path_index(c, plen, f->key, k);
            rc = tide__validate_struct(f->sub, a + (size_t)k * f->sub->size, c);
        }
        c->path[plen] = '\0';
        return rc;
    }
    default:
        return tide__fail(c, "%s has an unknown kind", fn);
    }
}

static tide_status validate_field(const tide__field *f, const void *base, tide__ctx *c)
{
    switch (f->kind) {
    case TIDE__K_I32_ARRAY:
    case TIDE__K_I64_FIXED:
    case TIDE__K_STR_ARRAY:
    case TIDE__K_U64_BIN:
    case TIDE__K_STRUCT_ARRAY:
        return validate_array(f, base, c);
    default:
        return validate_scalar(f, base, c);
    }
}
#undef fn

tide_status tide__validate_struct(const tide__schema *s, const void *base, tide__ctx *c)
{
    for (size_t k = 0; k < s->n_fields; k++)
        TIDE_CHECK(validate_field(&s->fields[k], base, c));
    if (s->check)
        TIDE_CHECK(s->check(base, c));
    return TIDE_OK;
}

tide_status tide_msg_validate(const tide_msg_t *msg)
{
    if (msg == NULL)
        return tide_errorf(TIDE_ERR_INVALID, "message is NULL");
    const tide__schema *s = tide__msg_schema(msg->type);
    if (s == NULL)
        return tide_errorf(TIDE_ERR_INVALID, "message has no valid type (%d)", (int)msg->type);
    tide__ctx c = {TIDE_ERR_INVALID, tide_msg_type_name(msg->type), ""};
    return tide__validate_struct(s, &msg->u, &c);
}

/* ---- init / clear -------------------------------------------------------------------------------
 */

void tide__free_struct(const tide__schema *s, void *base)
{
    if (!s->owns)
        return;
    for (size_t k = 0; k < s->n_fields; k++) {
        const tide__field *f = &s->fields[k];
        char *p = (char *)base + f->off;
        switch (f->kind) {
        case TIDE__K_I32_ARRAY: {
            void *a;
            memcpy(&a, p, sizeof a);
            tide_free(a);
            a = NULL;
            memcpy(p, &a, sizeof a);
            if (f->count_off != TIDE__NO_OFF)
                tide__store_count(base, f->count_off, 0);
            break;
        }
        case TIDE__K_U64_BIN: {
            void *a;
            memcpy(&a, p, sizeof a);
            tide_free(a);
            a = NULL;
            memcpy(p, &a, sizeof a);
            tide__store_count(base, f->count_off, 0);
            break;
        }
        case TIDE__K_STR_ARRAY: {
            char **a;
            memcpy(&a, p, sizeof a);
            uint32_t n = tide__load_count(base, f->count_off);
            for (uint32_t i = 0; a && i < n; i++)
                tide_free(a[i]);
            tide_free(a);
            a = NULL;
            memcpy(p, &a, sizeof a);
            tide__store_count(base, f->count_off, 0);
            break;
        }
        case TIDE__K_STRUCT:
            tide__free_struct(f->sub, p);
            break;
        case TIDE__K_STRUCT_ARRAY: {
            char *a;
            memcpy(&a, p, sizeof a);
            uint32_t n = tide__load_count(base, f->count_off);
            for (uint32_t i = 0; a && f->sub->owns && i < n; i++)
                tide__free_struct(f->sub, a + (size_t)i * f->sub->size);
            tide_free(a);
            a = NULL;
            memcpy(p, &a, sizeof a);
            tide__store_count(base, f->count_off, 0);
            break;
        }
        default:
            break;
        }
    }
}

void tide_msg_init(tide_msg_t *msg, tide_msg_type_t type)
{
    memset(msg, 0, sizeof *msg);
    msg->type = type;
}

void tide_msg_clear(tide_msg_t *msg)
{
    if (msg == NULL)
        return;
    const tide__schema *s = tide__msg_schema(msg->type);
    if (s)
        tide__free_struct(s, &msg->u);
    tide_msg_init(msg, TIDE_MSG_NONE);
}
