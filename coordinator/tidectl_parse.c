/*
 * tidectl's text in: layer ranges, times, byte counts, key files and job names from the
 * command line, each refused with a message that names what was wrong.
 */
#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "coordinator/tidectl_int.h"
#include "core/alloc.h"
#include "core/keyfile.h"

/* ---- parsing --------------------------------------------------------------------------------- */

static int parse_int(const char **p, long long *v)
{
    char *end;
    if (!isdigit((unsigned char)**p))
        return -1;
    errno = 0;
    *v = strtoll(*p, &end, 10);
    if (errno != 0)
        return -1;
    *p = end;
    return 0;
}

tide_status tidectl_parse_stages(const char *text, int **starts, uint32_t *n)
{
    *starts = NULL;
    *n = 0;
    size_t cap = 1;
    for (const char *q = text; *q; q++)
        cap += *q == ',';
    if (cap > TIDE_PROTO_DEGREE_MAX)
        return tide_errorf(TIDE_ERR_INVALID, "--stages: more than %d stages",
                           TIDE_PROTO_DEGREE_MAX);
    int *s = tide_malloc((cap + 1) * sizeof *s);
    if (s == NULL)
        return tide_errorf(TIDE_ERR_NOMEM, "out of memory parsing --stages");
    const char *p = text;
    uint32_t k = 0;
    long long expect = 0;
    for (;;) {
        long long a, b;
        const char *at = p;
        if (parse_int(&p, &a) != 0)
            goto bad;
        b = a;
        if (*p == '-') {
            p++;
            if (parse_int(&p, &b) != 0)
                goto bad;
        }
        if (a != expect) {
            tide_free(s);
            return tide_errorf(TIDE_ERR_INVALID,
                               "--stages: stage %u starts at layer %lld but must start at %lld "
                               "(ranges are inclusive, contiguous, from layer 0: 0-11,12-23)",
                               k, a, expect);
        }
        if (b < a || b >= (long long)TIDE_PROTO_LAYERS_MAX) {
            tide_free(s);
            return tide_errorf(TIDE_ERR_INVALID,
                               "--stages: '%.*s' is not a layer range a-b with a <= b",
                               (int)(p - at), at);
        }
        s[k++] = (int)a;
        expect = b + 1;
        if (*p == '\0')
            break;
        if (*p != ',')
            goto bad;
        p++;
    }
    s[k] = (int)expect;
    *starts = s;
    *n = k + 1;
    return TIDE_OK;
bad:
    tide_free(s);
    return tide_errorf(TIDE_ERR_INVALID,
                       "--stages: cannot parse '%s' at '%s' (expected inclusive layer ranges "
                       "like 0-11,12-23)",
                       text, p);
}

tide_status tidectl_parse_since(const char *text, int64_t now_ms, int64_t *since_ms)
{
    char *end;
    errno = 0;
    double v = strtod(text, &end);
    if (end != text && errno == 0 && v >= 0) {
        double unit = 0;
        if (strcmp(end, "s") == 0)
            unit = 1e3;
        else if (strcmp(end, "m") == 0 || strcmp(end, "min") == 0)
            unit = 60e3;
        else if (strcmp(end, "h") == 0)
            unit = 3600e3;
        else if (strcmp(end, "d") == 0)
            unit = 86400e3;
        else if (strcmp(end, "ms") == 0)
            unit = 1;
        if (unit > 0) {
            double ago = v * unit;
            *since_ms = ago >= (double)now_ms ? 0 : now_ms - (int64_t)ago;
            return TIDE_OK;
        }
        if (*end == '\0' && strchr(text, '.') == NULL) {
            *since_ms = (int64_t)strtoll(text, NULL, 10); /* epoch ms */
            return TIDE_OK;
        }
    }
    struct tm tm;
    memset(&tm, 0, sizeof tm);
    int y, mo, d, h = 0, mi = 0, sec = 0;
    char sep = 0, z = 0;
    int got = sscanf(text, "%4d-%2d-%2d%c%2d:%2d:%2d%c", &y, &mo, &d, &sep, &h, &mi, &sec, &z);
    if (got == 3 || ((got == 6 || got == 7 || got == 8) && (sep == 'T' || sep == ' '))) {
        if (got == 6) {
            /* "HH:MM" then maybe 'Z' */
            sec = 0;
            z = text[strlen(text) - 1] == 'Z' ? 'Z' : 0;
        }
        if (got == 8 && z != 'Z')
            goto bad;
        if (mo < 1 || mo > 12 || d < 1 || d > 31 || h > 23 || mi > 59 || sec > 60)
            goto bad;
        tm.tm_year = y - 1900;
        tm.tm_mon = mo - 1;
        tm.tm_mday = d;
        tm.tm_hour = h;
        tm.tm_min = mi;
        tm.tm_sec = sec;
        tm.tm_isdst = -1;
        time_t t = z == 'Z' ? timegm(&tm) : mktime(&tm);
        if (t == (time_t)-1)
            goto bad;
        *since_ms = (int64_t)t * 1000;
        return TIDE_OK;
    }
bad:
    return tide_errorf(TIDE_ERR_INVALID,
                       "--since '%s': expected a duration ago (90s, 10m, 2h, 1d), a time "
                       "(2024-05-01 12:00, 2024-05-01T12:00:00Z) or epoch milliseconds",
                       text);
}

tide_status tidectl_parse_bytes(const char *text, uint64_t *bytes)
{
    char *end;
    errno = 0;
    double v = strtod(text, &end);
    if (end == text || errno != 0 || v < 0)
        goto bad;
    double mult = 1;
    const char *u = end;
    if (*u) {
        const char *units = "KMGTPE";
        const char *k = strchr(units, toupper((unsigned char)*u));
        if (k == NULL)
            goto bad;
        for (const char *q = units; q <= k; q++)
            mult *= 1024.0;
        u++;
        if (strcmp(u, "") != 0 && strcmp(u, "i") != 0 && strcmp(u, "iB") != 0 &&
            strcmp(u, "B") != 0)
            goto bad;
    }
    double b = v * mult;
    if (b >= 18446744073709551615.0)
        goto bad;
    *bytes = (uint64_t)b;
    return TIDE_OK;
bad:
    return tide_errorf(TIDE_ERR_INVALID,
                       "'%s' is not a byte count (examples: 1000, 512M, 16G, 16GiB)", text);
}

tide_status tidectl_read_key(const char *path_or_z85, char *pub, char *secret)
{
    if (secret == NULL)
        return tide_keyfile_server_key(path_or_z85, pub);
    tide_keyfile k;
    TIDE_CHECK(tide_keyfile_read_pair(path_or_z85, &k));
    memcpy(pub, k.public_key, sizeof k.public_key);
    memcpy(secret, k.secret_key, sizeof k.secret_key);
    memset(&k, 0, sizeof k);
    return TIDE_OK;
}

int tidectl__usage_error(FILE *err, const char *cmd, const char *fmt, ...) TIDE_PRINTF(3, 4);

int tidectl__usage_error(FILE *err, const char *cmd, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(err, "tidectl %s: ", cmd);
    vfprintf(err, fmt, ap);
    va_end(ap);
    fprintf(err, " (see tidectl %s --help)\n", cmd);
    return TIDECTL_EXIT_USAGE;
}

int tidectl__copy_job(FILE *err, const char *cmd, const char *what, const char *name, char *dst)
{
    if (strlen(name) == 0 || strlen(name) > TIDE_PROTO_NAME_MAX)
        return tidectl__usage_error(err, cmd, "%s must be 1 to %d characters", what,
                                    TIDE_PROTO_NAME_MAX);
    for (const char *p = name; *p; p++)
        if (!isalnum((unsigned char)*p) && !strchr("._-:", *p))
            return tidectl__usage_error(
                err, cmd, "%s '%s' may hold only letters, digits and . _ - :", what, name);
    strcpy(dst, name);
    return TIDECTL_EXIT_OK;
}
