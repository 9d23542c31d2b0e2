/*
 * examples/mlp_statefile: writer, reader and comparison of the whole-state file (format in
 * mlp_statefile.h). Workload: a few MB, once per run.
 */
#include "examples/mlp_statefile.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"

#define MAGIC "tide-mlp-state 1"

uint64_t tide_mlp_state_hash(const void *p, uint64_t n)
{
    const unsigned char *b = p;
    uint64_t h = 0xcbf29ce484222325ull ^ n;
    for (uint64_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 0x100000001b3ull;
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    return h | 1;
}

tide_status tide_mlp_state_write(const char *path, const tide_collection_t *c, void *const *full)
{
    if (path == NULL || c == NULL || full == NULL)
        return tide_errorf(TIDE_ERR_INVALID, "tide_mlp_state_write: path, c and full are required");
    size_t n = tide_collection_size(c);
    char tmp[4096];
    if (snprintf(tmp, sizeof tmp, "%s.tmp", path) >= (int)sizeof tmp)
        return tide_errorf(TIDE_ERR_INVALID, "state file path too long: %s", path);
    FILE *f = fopen(tmp, "wb");
    if (f == NULL)
        return tide_errorf(TIDE_ERR_IO, "cannot write %s: %s", tmp, strerror(errno));
    int bad = fprintf(f, "%s\ntensors %zu\n", MAGIC, n) < 0;
    for (size_t i = 0; i < n && !bad; i++) {
        const tide_tensor_desc *d = tide_collection_tensor(c, i);
        uint64_t bytes = tide_tensor_bytes(d);
        bad = fprintf(f, "tensor %s %d %" PRIu64 " %016" PRIx64 "\n", d->name, (int)d->dtype, bytes,
                      tide_mlp_state_hash(full[i], bytes)) < 0 ||
              (bytes > 0 && fwrite(full[i], 1, (size_t)bytes, f) != (size_t)bytes);
    }
    if (fclose(f) != 0 || bad) {
        remove(tmp);
        return tide_errorf(TIDE_ERR_IO, "cannot write %s: %s", tmp, strerror(errno));
    }
    if (rename(tmp, path) != 0) {
        tide_status rc =
            tide_errorf(TIDE_ERR_IO, "cannot rename %s to %s: %s", tmp, path, strerror(errno));
        remove(tmp);
        return rc;
    }
    return TIDE_OK;
}

/* One tensor of a state file, read whole. */
typedef struct entry {
    char name[128];
    int dtype;
    uint64_t bytes;
    void *data;
} entry;

typedef struct state {
    entry *e;
    size_t n;
} state;

static void state_clear(state *s)
{
    for (size_t i = 0; i < s->n; i++)
        tide_free(s->e[i].data);
    tide_free(s->e);
    memset(s, 0, sizeof *s);
}

static tide_status state_read(const char *path, state *s)
{
    memset(s, 0, sizeof *s);
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return tide_errorf(TIDE_ERR_IO, "cannot read %s: %s", path, strerror(errno));
    tide_status rc = TIDE_OK;
    char line[512];
    size_t n = 0;
    if (fgets(line, sizeof line, f) == NULL || strcmp(line, MAGIC "\n") != 0)
        TIDE_FAIL_GOTO(rc, out, TIDE_ERR_IO, "%s is not a tide-mlp-state file", path);
    if (fgets(line, sizeof line, f) == NULL || sscanf(line, "tensors %zu", &n) != 1 || n > 1000000)
        TIDE_FAIL_GOTO(rc, out, TIDE_ERR_IO, "%s: bad tensor count line", path);
    s->e = tide_calloc(n ? n : 1, sizeof *s->e);
    TIDE_CHECK_ALLOC_GOTO(s->e, rc, out);
    for (size_t i = 0; i < n; i++) {
        entry *e = &s->e[i];
        uint64_t hash = 0;
        if (fgets(line, sizeof line, f) == NULL ||
            sscanf(line, "tensor %127s %d %" SCNu64 " %" SCNx64, e->name, &e->dtype, &e->bytes,
                   &hash) != 4 ||
            e->bytes > (1ull << 40))
            TIDE_FAIL_GOTO(rc, out, TIDE_ERR_IO, "%s: bad header of tensor %zu", path, i);
        s->n = i + 1;
        e->data = tide_malloc(e->bytes ? (size_t)e->bytes : 1);
        TIDE_CHECK_ALLOC_GOTO(e->data, rc, out);
        if (fread(e->data, 1, (size_t)e->bytes, f) != (size_t)e->bytes)
            TIDE_FAIL_GOTO(rc, out, TIDE_ERR_IO, "%s: truncated in tensor %s", path, e->name);
        if (tide_mlp_state_hash(e->data, e->bytes) != hash)
            TIDE_FAIL_GOTO(rc, out, TIDE_ERR_IO, "%s: tensor %s does not match its hash", path,
                           e->name);
    }
out:
    fclose(f);
    if (rc != TIDE_OK)
        state_clear(s);
    return rc;
}

/* ||a - b|| / ||b|| (relative to 1 when b is all zero) and max |a - b| of n values. */
static double rel_diff(const void *pa, const void *pb, size_t n, int f64, double *max_abs)
{
    double num = 0.0, den = 0.0;
    *max_abs = 0.0;
    for (size_t k = 0; k < n; k++) {
        double x = f64 ? ((const double *)pa)[k] : ((const float *)pa)[k];
        double y = f64 ? ((const double *)pb)[k] : ((const float *)pb)[k];
        double d = x - y;
        if (isnan(d))
            return INFINITY;
        num += d * d;
        den += y * y;
        *max_abs = fmax(*max_abs, fabs(d));
    }
    return sqrt(num) / (den > 0.0 ? sqrt(den) : 1.0);
}

tide_status tide_mlp_state_compare(const char *a, const char *b, double rtol,
                                   tide_mlp_state_diff *out)
{
    if (a == NULL || b == NULL || out == NULL || !(rtol >= 0.0))
        return tide_errorf(TIDE_ERR_INVALID, "tide_mlp_state_compare: a, b, out and rtol >= 0");
    memset(out, 0, sizeof *out);
    state sa, sb;
    TIDE_CHECK(state_read(a, &sa));
    tide_status rc = state_read(b, &sb);
    if (rc != TIDE_OK) {
        state_clear(&sa);
        return rc;
    }
    if (sa.n != sb.n)
        TIDE_FAIL_GOTO(rc, done, TIDE_ERR_INVALID, "%s has %zu tensors, %s %zu", a, sa.n, b, sb.n);
    for (size_t i = 0; i < sa.n; i++) {
        const entry *x = &sa.e[i], *y = &sb.e[i];
        if (strcmp(x->name, y->name) != 0 || x->dtype != y->dtype || x->bytes != y->bytes)
            TIDE_FAIL_GOTO(rc, done, TIDE_ERR_INVALID,
                           "tensor %zu: %s (dtype %d, %" PRIu64 " bytes) in %s, %s (dtype %d, "
                           "%" PRIu64 " bytes) in %s",
                           i, x->name, x->dtype, x->bytes, a, y->name, y->dtype, y->bytes, b);
        out->tensors++;
        if (memcmp(x->data, y->data, (size_t)x->bytes) == 0) {
            out->identical++;
            continue;
        }
        int f32 = x->dtype == TIDE_F32, f64 = x->dtype == TIDE_F64;
        if (!f32 && !f64)
            TIDE_FAIL_GOTO(rc, done, TIDE_ERR_INVALID,
                           "tensor %s differs (dtype %d is compared exactly)", x->name, x->dtype);
        double abs = 0.0;
        double rel = rel_diff(x->data, y->data, (size_t)x->bytes / (f64 ? 8 : 4), f64, &abs);
        out->worst_abs = fmax(out->worst_abs, abs);
        if (rel > out->worst_rel || out->worst[0] == '\0') {
            out->worst_rel = rel;
            snprintf(out->worst, sizeof out->worst, "%s", x->name);
        }
    }
    if (out->worst_rel > rtol)
        TIDE_FAIL_GOTO(rc, done, TIDE_ERR_RANGE,
                       "tensor %s differs by %.3g in relative L2 norm (more than %.3g)", out->worst,
                       out->worst_rel, rtol);
done:
    state_clear(&sa);
    state_clear(&sb);
    return rc;
}
