/*
 * Scenario tables (scenario.h): parsing a row's layouts and kill, listing a table for
 * CMake's check, and picking the row a test runs. Test support only.
 */
#include <ctype.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "tests/support/scenario.h"

/* A positive decimal at *p, advancing it; -1 when there is none. */
static int number(const char **p)
{
    if (!isdigit((unsigned char)**p))
        return -1;
    char *end = NULL;
    long v = strtol(*p, &end, 10);
    *p = end;
    return v > 0 && v < 1000000 ? (int)v : -1;
}

tide_status mt_layout_parse(const char *s, mt_layout *out)
{
    memset(out, 0, sizeof *out);
    const char *p = s;
    out->dp = number(&p);
    if (out->dp > 0 && *p == 'x') {
        p++;
        out->tp = number(&p);
    }
    if (out->tp > 0 && *p == 'x') {
        p++;
        out->pp = number(&p);
    }
    if (out->dp <= 0 || out->tp <= 0 || out->pp <= 0)
        return tide_errorf(TIDE_ERR_INVALID, "layout '%s': want DPxTPxPP[:STAGES][/MICRO]", s);
    if (*p == ':') {
        size_t n = strcspn(++p, "/");
        if (n == 0 || n >= sizeof out->stages)
            return tide_errorf(TIDE_ERR_INVALID, "layout '%s': stages empty or too long", s);
        memcpy(out->stages, p, n);
        p += n;
    }
    if (*p == '/') {
        p++;
        out->micro = number(&p);
        if (out->micro <= 0)
            return tide_errorf(TIDE_ERR_INVALID, "layout '%s': micro-batches after '/'", s);
    }
    if (*p != '\0')
        return tide_errorf(TIDE_ERR_INVALID, "layout '%s': unexpected '%s'", s, p);
    return TIDE_OK;
}

/* "pPdDtT" or "rN" into k. */
static tide_status kill_target(const char *s, const char *p, mt_kill *k)
{
    k->rank = -1;
    if (*p == 'r') {
        p++;
        k->rank = isdigit((unsigned char)*p) ? (int)strtol(p, (char **)&p, 10) : -1;
        if (k->rank >= 0 && *p == '\0')
            return TIDE_OK;
    } else {
        int end = 0;
        if (sscanf(p, "p%dd%dt%d%n", &k->p, &k->d, &k->t, &end) == 3 && p[end] == '\0' &&
            k->p >= 0 && k->d >= 0 && k->t >= 0)
            return TIDE_OK;
    }
    return tide_errorf(TIDE_ERR_INVALID, "kill '%s': the target is pPdDtT or rN", s);
}

tide_status mt_kill_parse(const char *s, mt_kill *out)
{
    memset(out, 0, sizeof *out);
    out->step = -1;
    out->rank = -1;
    if (s[0] == '\0')
        return TIDE_OK;
    const char *p = s;
    size_t n = 0;
    while (islower((unsigned char)p[n]))
        n++;
    if (n == 0 || n >= sizeof out->when || p[n] != ' ')
        return tide_errorf(TIDE_ERR_INVALID, "kill '%s': want WHEN [STEP] at TARGET", s);
    memcpy(out->when, p, n);
    p += n + 1;
    if (isdigit((unsigned char)*p)) {
        out->step = (int)strtol(p, (char **)&p, 10);
        if (*p++ != ' ')
            return tide_errorf(TIDE_ERR_INVALID, "kill '%s': want WHEN [STEP] at TARGET", s);
    }
    if (strncmp(p, "at ", 3) != 0)
        return tide_errorf(TIDE_ERR_INVALID, "kill '%s': want WHEN [STEP] at TARGET", s);
    return kill_target(s, p + 3, out);
}

tide_status mt_scenario_parse(const mt_row *row, mt_scenario *out)
{
    memset(out, 0, sizeof *out);
    out->row = row;
    if (row->first[0] != '\0') {
        TIDE_CHECK(mt_layout_parse(row->first, &out->first));
        out->has_first = 1;
    }
    const char *p = row->resizes;
    while (*p != '\0') {
        char one[128];
        size_t n = strcspn(p, " ");
        if (n >= sizeof one || out->n_resizes == MT_MAX_RESIZES)
            return tide_errorf(TIDE_ERR_INVALID, "scenario %s: resizes '%s' too long", row->name,
                               row->resizes);
        memcpy(one, p, n);
        one[n] = '\0';
        TIDE_CHECK(mt_layout_parse(one, &out->resize[out->n_resizes++]));
        p += n;
        while (*p == ' ')
            p++;
    }
    return mt_kill_parse(row->kill, &out->kill);
}

const char *mt_layout_str(const mt_layout *l, char *buf, size_t len)
{
    int n = snprintf(buf, len, "%dx%dx%d", l->dp, l->tp, l->pp);
    if (l->stages[0] != '\0' && n >= 0 && (size_t)n < len)
        n += snprintf(buf + n, len - (size_t)n, ":%s", l->stages);
    if (l->micro > 0 && n >= 0 && (size_t)n < len)
        snprintf(buf + n, len - (size_t)n, "/%d", l->micro);
    return buf;
}

static const mt_row *row_at(const void *rows, size_t i, size_t stride)
{
    return (const mt_row *)(const void *)((const char *)rows + i * stride);
}

void mt_rows_print(const void *rows, size_t n, size_t stride, FILE *out)
{
    for (size_t i = 0; i < n; i++) {
        const mt_row *r = row_at(rows, i, stride);
        fprintf(out, "%s %d %d %s %s\n", r->name[0] ? r->name : "-", r->ranks, r->timeout,
                r->labels[0] ? r->labels : "-", r->mpi[0] ? r->mpi : "-");
    }
}

const mt_row *mt_rows_find(const void *rows, size_t n, size_t stride, const char *name)
{
    for (size_t i = 0; i < n; i++)
        if (strcmp(row_at(rows, i, stride)->name, name) == 0)
            return row_at(rows, i, stride);
    fprintf(stderr, "no scenario '%s'; the table has:", name);
    for (size_t i = 0; i < n; i++)
        fprintf(stderr, " '%s'", row_at(rows, i, stride)->name);
    fputc('\n', stderr);
    return NULL;
}

int mt_rows_select(int argc, char **argv, int name_arg, const void *rows, size_t n, size_t stride,
                   const mt_row **out)
{
    *out = NULL;
    if (argc >= 2 && strcmp(argv[1], "--list") == 0) {
        mt_rows_print(rows, n, stride, stdout);
        return 1;
    }
    if (n == 1 && row_at(rows, 0, stride)->name[0] == '\0') {
        *out = row_at(rows, 0, stride); /* a test of one scenario: no name to give */
        return 0;
    }
    if (name_arg >= argc) {
        fprintf(stderr, "usage: %s ... SCENARIO (argument %d), or %s --list\n", argv[0], name_arg,
                argv[0]);
        return 0;
    }
    *out = mt_rows_find(rows, n, stride, argv[name_arg]);
    return 0;
}
