/* Flag and environment parsing shared by tided, tidectl, examples and benchmarks. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "error.h"
#include "log.h"
#include "opts.h"
#include "version.h"

static tide_status parse_bool(const char *text, int *out)
{
    if (strcmp(text, "1") == 0 || strcasecmp(text, "true") == 0 || strcasecmp(text, "yes") == 0 ||
        strcasecmp(text, "on") == 0) {
        *out = 1;
        return TIDE_OK;
    }
    if (strcmp(text, "0") == 0 || strcasecmp(text, "false") == 0 || strcasecmp(text, "no") == 0 ||
        strcasecmp(text, "off") == 0) {
        *out = 0;
        return TIDE_OK;
    }
    return TIDE_ERR_INVALID;
}

static tide_status set_value(const tide_opt *o, const char *text, const char *origin)
{
    char *end = NULL;
    switch (o->type) {
    case TIDE_OPT_STRING:
        *(const char **)o->value = text;
        return TIDE_OK;
    case TIDE_OPT_INT: {
        errno = 0;
        long long v = strtoll(text, &end, 10);
        if (errno != 0 || end == text || *end != '\0')
            return tide_errorf(TIDE_ERR_INVALID, "%s --%s: '%s' is not an integer", origin, o->name,
                               text);
        if (o->min < o->max && (v < o->min || v > o->max))
            return tide_errorf(TIDE_ERR_RANGE, "%s --%s: %lld is outside [%lld, %lld]", origin,
                               o->name, v, o->min, o->max);
        *(long long *)o->value = v;
        return TIDE_OK;
    }
    case TIDE_OPT_DOUBLE: {
        errno = 0;
        double v = strtod(text, &end);
        if (errno != 0 || end == text || *end != '\0')
            return tide_errorf(TIDE_ERR_INVALID, "%s --%s: '%s' is not a number", origin, o->name,
                               text);
        *(double *)o->value = v;
        return TIDE_OK;
    }
    case TIDE_OPT_BOOL:
        if (parse_bool(text, (int *)o->value) != TIDE_OK)
            return tide_errorf(TIDE_ERR_INVALID, "%s --%s: '%s' is not a boolean (1/0/true/false)",
                               origin, o->name, text);
        return TIDE_OK;
    }
    return tide_errorf(TIDE_ERR_INTERNAL, "option --%s has an unknown type", o->name);
}

static const tide_opt *find(const tide_opt *opts, const char *name, size_t len)
{
    for (const tide_opt *o = opts; o->name != NULL; o++)
        if (strlen(o->name) == len && strncmp(o->name, name, len) == 0)
            return o;
    return NULL;
}

tide_status tide_opts_parse(const tide_opt *opts, int argc, char **argv, int *npos, int *help)
{
    if (help)
        *help = 0;
    for (const tide_opt *o = opts; o->name != NULL; o++) {
        if (o->def != NULL)
            TIDE_CHECK(set_value(o, o->def, "default"));
        const char *env = o->env ? getenv(o->env) : NULL;
        if (env != NULL && env[0] != '\0') {
            tide_status rc = set_value(o, env, o->env);
            if (rc != TIDE_OK)
                return rc;
        }
    }
    int pos = 0;
    for (int i = 1; i < argc; i++) {
        char *arg = argv[i];
        if (strcmp(arg, "-h") == 0 || strcmp(arg, "--help") == 0) {
            if (help)
                *help = TIDE_OPTS_HELP;
            continue;
        }
        if (strcmp(arg, "--version") == 0) {
            if (help && *help != TIDE_OPTS_HELP)
                *help = TIDE_OPTS_VERSION;
            continue;
        }
        if (strcmp(arg, "--") == 0) {
            for (i++; i < argc; i++)
                argv[1 + pos++] = argv[i];
            break;
        }
        if (strncmp(arg, "--", 2) != 0 || arg[2] == '\0') {
            argv[1 + pos++] = arg;
            continue;
        }
        const char *name = arg + 2;
        const char *eq = strchr(name, '=');
        size_t len = eq ? (size_t)(eq - name) : strlen(name);
        const tide_opt *o = find(opts, name, len);
        if (o == NULL && strncmp(name, "no-", 3) == 0) {
            const tide_opt *b = find(opts, name + 3, len - 3);
            if (b != NULL && b->type == TIDE_OPT_BOOL && eq == NULL) {
                *(int *)b->value = 0;
                continue;
            }
        }
        if (o == NULL)
            return tide_errorf(TIDE_ERR_INVALID, "unknown option '--%.*s' (see --help)", (int)len,
                               name);
        if (o->type == TIDE_OPT_BOOL && eq == NULL) {
            *(int *)o->value = 1;
            continue;
        }
        const char *text = eq ? eq + 1 : NULL;
        if (text == NULL) {
            if (i + 1 >= argc)
                return tide_errorf(TIDE_ERR_INVALID, "option --%s needs a value", o->name);
            text = argv[++i];
        }
        TIDE_CHECK(set_value(o, text, "flag"));
    }
    if (npos)
        *npos = pos;
    return TIDE_OK;
}

int tide_opts_main(const tide_opt *opts, int argc, char **argv, const char *prog)
{
    int help = 0, npos = 0;
    tide_status rc = tide_opts_parse(opts, argc, argv, &npos, &help);
    if (rc == TIDE_OK && npos > 0 && !help)
        rc = tide_errorf(TIDE_ERR_INVALID, "unexpected argument '%s' (see --help)", argv[1]);
    if (rc != TIDE_OK) {
        fprintf(stderr, "%s: %s\n", prog, tide_last_error());
        return 2;
    }
    if (help == TIDE_OPTS_VERSION) {
        tide_version_print(stdout, prog);
        return 0;
    }
    if (help) {
        tide_opts_usage(stdout, prog, "[options]", opts);
        return 0;
    }
    return -1;
}

static void format_value(const tide_opt *o, char *buf, size_t len)
{
    switch (o->type) {
    case TIDE_OPT_STRING: {
        const char *s = *(const char **)o->value;
        snprintf(buf, len, "%s", s ? s : "(unset)");
        break;
    }
    case TIDE_OPT_INT:
        snprintf(buf, len, "%lld", *(long long *)o->value);
        break;
    case TIDE_OPT_DOUBLE:
        snprintf(buf, len, "%g", *(double *)o->value);
        break;
    case TIDE_OPT_BOOL:
        snprintf(buf, len, "%s", *(int *)o->value ? "true" : "false");
        break;
    }
}

void tide_opts_usage(FILE *out, const char *prog, const char *synopsis, const tide_opt *opts)
{
    fprintf(out, "usage: %s %s\n\noptions:\n", prog, synopsis ? synopsis : "[options]");
    for (const tide_opt *o = opts; o->name != NULL; o++) {
        char flag[64];
        snprintf(flag, sizeof flag, "--%s%s", o->name, o->type == TIDE_OPT_BOOL ? "" : " V");
        fprintf(out, "  %-24s %s", flag, o->help ? o->help : "");
        if (o->def)
            fprintf(out, " [default %s]", o->def);
        if (o->env)
            fprintf(out, " [env %s]", o->env);
        fputc('\n', out);
    }
    fprintf(out, "  %-24s %s\n", "-h, --help", "show this help and exit");
    fprintf(out, "  %-24s %s\n", "--version", "show the version and exit");
}

void tide_opts_log(const char *subsys, const tide_opt *opts)
{
    if (!TIDE_LOG_ENABLED(TIDE_LOG_INFO))
        return;
    for (const tide_opt *o = opts; o->name != NULL; o++) {
        char buf[256];
        format_value(o, buf, sizeof buf);
        TIDE_INFO(subsys, "setting %s = %s", o->name, buf);
    }
}

tide_status tide_log_parse_level(const char *text, tide_log_level *out)
{
    if (text == NULL)
        return tide_errorf(TIDE_ERR_INVALID, "log level missing");
    int l = tide__log_level_of(text);
    if (l < 0)
        return tide_errorf(TIDE_ERR_INVALID,
                           "unknown log level '%s' (use error, warn, info or debug)", text);
    *out = (tide_log_level)l;
    return TIDE_OK;
}
