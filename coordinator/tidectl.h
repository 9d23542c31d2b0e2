/*
 * tidectl internals shared with tests/test_tidectl.c: the whole CLI as a
 * function (so tests run it against a fake tided in-process), and the pure
 * parsing and formatting pieces. tidectl.c compiled with TIDECTL_NO_MAIN=1
 * leaves out main(); the rest is the tidectl_cli library (tidectl_int.h).
 * Not a library API: only tidectl and its tests use it.
 */
#ifndef TIDE_TIDECTL_H
#define TIDE_TIDECTL_H

#include <stdint.h>
#include <stdio.h>

#include <tide/status.h>
#include "proto/proto.h"

/* Exit codes scripts rely on (also in `tidectl --help`). */
enum {
    TIDECTL_EXIT_OK = 0,          /* done; read commands printed their result */
    TIDECTL_EXIT_REFUSED = 1,     /* tided refused (its error message is printed), or the
                                     CURVE handshake was rejected, or tided's reply was bad */
    TIDECTL_EXIT_USAGE = 2,       /* bad command line or unreadable key file: nothing sent */
    TIDECTL_EXIT_UNREACHABLE = 3, /* no connection to tided within --timeout-ms */
    TIDECTL_EXIT_TIMEOUT = 4,     /* connected, but no reply within --timeout-ms */
    TIDECTL_EXIT_LOCAL = 5,       /* keygen could not write its files */
    TIDECTL_EXIT_ABORTED = 6,     /* --wait: the switch was aborted (its reason printed) */
};

/* Runs tidectl with argv (argv[0] is the program name); output to out, messages to err.
 * Returns one of the exit codes above. Blocks for at most --timeout-ms per request (top:
 * per refresh). Main thread; argv may be permuted. */
int tidectl_main(int argc, char **argv, FILE *out, FILE *err);

/* Parses "0-11,12-23" (inclusive layer ranges, contiguous from 0) into pp + 1 stage starts
 * {0, 12, 24}; *starts is tide_malloc'd (caller tide_frees); TIDE_ERR_INVALID + detail. */
tide_status tidectl_parse_stages(const char *text, int **starts, uint32_t *n);

/* Parses --since: "90s", "10m", "2h", "1d" (before now_ms), "YYYY-MM-DD[ HH:MM[:SS]]" or
 * with 'T' (local time; trailing 'Z' = UTC), or epoch milliseconds. */
tide_status tidectl_parse_since(const char *text, int64_t now_ms, int64_t *since_ms);

/* Parses a byte count: "1000", "512M", "16G", "16GiB", "1.5T" (binary units, K = 1024). */
tide_status tidectl_parse_bytes(const char *text, uint64_t *bytes);

/* Formats bytes as "1.50 GiB" / "512 B" into buf; returns buf. */
const char *tidectl_fmt_bytes(uint64_t bytes, char *buf, size_t len);

/* Reads a key file ("public = Z85", "secret = Z85", ...). pub/secret get 41 bytes (Z85 +
 * NUL); secret may be NULL (then not required). A 40-character Z85 string instead of a
 * path is taken as the public key itself when secret is NULL. */
tide_status tidectl_read_key(const char *path_or_z85, char *pub, char *secret);

/* How tidectl_print_status prints: the table, one JSON document, or the table with each
   worker's pool, pool rank and process id (-o wide). */
enum { TIDECTL_TABLE = 0, TIDECTL_JSON = 1, TIDECTL_WIDE = 2 };

/* Printers for replies: aligned tables, or one JSON document when json != 0 (events: one
   JSON object per line, each row in the reply's order; status: format, one of
   TIDECTL_TABLE, TIDECTL_JSON, TIDECTL_WIDE). */
void tidectl_print_status(FILE *out, const tide_proto_status_reply_t *r, int format);
void tidectl_print_jobs(FILE *out, const tide_proto_jobs_reply_t *r, int json);
void tidectl_print_events(FILE *out, const tide_proto_events_reply_t *r, int json);
void tidectl_print_resize(FILE *out, const tide_proto_resize_reply_t *r, int json);

/* Writes s as a JSON string literal (quotes, escapes, invalid UTF-8 as U+FFFD). */
void tidectl_json_str(FILE *out, const char *s);

#endif /* TIDE_TIDECTL_H */
