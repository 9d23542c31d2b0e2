/*
 * Fit rules: what a training program can run, as numbers each parallel degree must
 * divide (tide_fit_rule in include/tide/collection.h). One checker for the program
 * (its requested first layout, at join), tided (every resize, first layout and recovery
 * it picks) and tests, so the three cannot disagree on a layout. Workload: at most 32
 * rules, checked a few times per layout decision.
 */
#include <stdio.h>
#include <string.h>

#include "core/error.h"
#include "reshard/reshard_int.h"

static const char *const degree_names[] = {"dp", "tp", "pp", "dp_micro"};
#define N_DEGREES 4

const char *tide_degree_name(tide_degree degree)
{
    return (int)degree >= 0 && (int)degree < N_DEGREES ? degree_names[degree] : "?";
}

/* How a rule's degree reads in text: "dp x micro-batches" for dp_micro. */
static const char *degree_text(tide_degree degree)
{
    return degree == TIDE_DEGREE_DP_MICRO ? "dp x micro-batches" : tide_degree_name(degree);
}

/* A rule as the program wrote it: known degree, n >= 1, what printable and terminated. */
static tide_status rule_ok(const tide_fit_rule *r, size_t i)
{
    if ((int)r->degree < 0 || (int)r->degree >= N_DEGREES)
        return tide_errorf(TIDE_ERR_INVALID,
                           "fit rule %zu: degree %d is not dp, tp, pp or dp_micro", i,
                           (int)r->degree);
    if (r->n < 1)
        return tide_errorf(TIDE_ERR_INVALID, "fit rule %zu: %s must divide %lld, which is below 1",
                           i, degree_text(r->degree), (long long)r->n);
    const char *end = memchr(r->what, '\0', sizeof r->what);
    if (end == NULL)
        return tide_errorf(TIDE_ERR_INVALID,
                           "fit rule %zu: 'what' is not terminated within %d bytes", i,
                           TIDE_FIT_WHAT_MAX);
    for (const char *p = r->what; p < end; p++)
        if (*p < 0x20 || *p > 0x7e)
            return tide_errorf(TIDE_ERR_INVALID,
                               "fit rule %zu: 'what' holds byte 0x%02x; only printable ASCII", i,
                               (unsigned char)*p);
    return TIDE_OK;
}

tide_status tide_fit_check(const tide_fit_rule *rules, size_t n, int dp, int tp, int pp,
                           int micro)
{
    if (n > TIDE_FIT_RULES_MAX)
        return tide_errorf(TIDE_ERR_INVALID, "%zu fit rules; at most %d", n, TIDE_FIT_RULES_MAX);
    if (n > 0 && rules == NULL)
        return tide_errorf(TIDE_ERR_INVALID, "%zu fit rules announced but none given", n);
    if (dp < 1 || tp < 1 || pp < 1 || micro < 1)
        return tide_errorf(TIDE_ERR_INVALID,
                           "degrees and micro-batches must be >= 1 (dp %d, tp %d, pp %d, "
                           "micro-batches %d)",
                           dp, tp, pp, micro);
    for (size_t i = 0; i < n; i++)
        TIDE_CHECK(rule_ok(&rules[i], i));
    const int64_t deg[N_DEGREES] = {dp, tp, pp, (int64_t)dp * micro};
    for (size_t i = 0; i < n; i++) {
        const tide_fit_rule *r = &rules[i];
        if (r->n % deg[r->degree] == 0)
            continue;
        const char *o = r->what[0] ? " (" : "", *c = r->what[0] ? ")" : "";
        if (r->degree == TIDE_DEGREE_DP_MICRO)
            return tide_errorf(TIDE_ERR_INVALID,
                               "dp %d x %d micro-batches = %lld does not divide %lld%s%s%s", dp,
                               micro, (long long)deg[r->degree], (long long)r->n, o, r->what, c);
        return tide_errorf(TIDE_ERR_INVALID, "%s %lld does not divide %lld%s%s%s",
                           degree_names[r->degree], (long long)deg[r->degree], (long long)r->n, o,
                           r->what, c);
    }
    return TIDE_OK;
}

char *tide_fit_format(const tide_fit_rule *rules, size_t n, char *buf, size_t len)
{
    if (buf == NULL || len == 0)
        return buf;
    buf[0] = '\0';
    if (n == 0 || rules == NULL) {
        snprintf(buf, len, "any layout");
        return buf;
    }
    size_t at = 0;
    for (size_t i = 0; i < n && at < len; i++) {
        const tide_fit_rule *r = &rules[i];
        int w = snprintf(buf + at, len - at, "%s%s divides %lld%s%.*s%s", i ? "; " : "",
                         degree_text(r->degree), (long long)r->n, r->what[0] ? " (" : "",
                         TIDE_FIT_WHAT_MAX - 1, r->what, r->what[0] ? ")" : "");
        at += w < 0 ? 0 : (size_t)w;
    }
    return buf;
}
