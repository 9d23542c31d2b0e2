/*
 * Settings from one place: every program declares a table of options; each is
 * a --flag whose default comes from a TIDE_* environment variable when set,
 * else from the table. Parsed once at start and logged at info level.
 */
#ifndef TIDE_CORE_OPTS_H
#define TIDE_CORE_OPTS_H

#include <stdio.h>

#include <tide/status.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum tide_opt_type {
    TIDE_OPT_STRING, /* value: const char **, points into argv, environ or the table */
    TIDE_OPT_INT,    /* value: long long * */
    TIDE_OPT_DOUBLE, /* value: double * */
    TIDE_OPT_BOOL,   /* value: int *; "--x" sets 1, "--no-x" sets 0, env "1"/"0"/"true"/"false" */
} tide_opt_type;

typedef struct tide_opt {
    const char *name; /* "endpoint" for --endpoint; NULL ends the table */
    const char *env;  /* "TIDE_ENDPOINT", or NULL when no environment default */
    tide_opt_type type;
    void *value;        /* where the parsed value is stored */
    const char *def;    /* default as text, or NULL (strings: stays NULL) */
    const char *help;   /* one line for --help */
    long long min, max; /* inclusive range for TIDE_OPT_INT when min < max */
} tide_opt;

/* What *help says after tide_opts_parse: go on, or print the usage or the version. */
enum { TIDE_OPTS_RUN = 0, TIDE_OPTS_HELP = 1, TIDE_OPTS_VERSION = 2 };

/*
 * Applies defaults, then environment, then argv[1..] flags ("--name value" or
 * "--name=value"). Positional arguments are moved, in order, to the front of
 * argv[1..]; *npos receives their count. "-h"/"--help" sets *help (if non-NULL) to
 * TIDE_OPTS_HELP, "--version" to TIDE_OPTS_VERSION (help wins when both are given);
 * the caller prints them (tide_opts_usage, tide_version_print in core/version.h).
 * Unknown flags, missing values and out-of-range numbers fail with a detail
 * message naming the flag. Main thread; argv strings must outlive the values.
 */
tide_status tide_opts_parse(const tide_opt *opts, int argc, char **argv, int *npos, int *help);

/* Prints "usage: prog synopsis" and one line per option with its env and default, then
   the -h and --version lines. */
void tide_opts_usage(FILE *out, const char *prog, const char *synopsis, const tide_opt *opts);

/*
 * The flags of a program that takes no positional arguments, parsed as by
 * tide_opts_parse: -1 when the program goes on; otherwise the status to exit with, 0
 * after --help printed the usage to stdout, 2 after an error (bad flag, or a positional
 * argument) printed to stderr prefixed with prog, 0 after --version printed the version
 * to stdout. Main thread.
 */
int tide_opts_main(const tide_opt *opts, int argc, char **argv, const char *prog);

/* Logs every option's effective value at info level under subsys. */
void tide_opts_log(const char *subsys, const tide_opt *opts);

#ifdef __cplusplus
}
#endif

#endif /* TIDE_CORE_OPTS_H */
