/*
 * The tide logger: four levels, a subsystem tag per line, one line per call
 * written atomically to stderr (or to a sink a test installs). The level comes
 * from TIDE_LOG (error, warn, info, debug; default warn) on first use and can
 * be overridden by a program's --log flag through tide_log_set_level.
 */
#ifndef TIDE_CORE_LOG_H
#define TIDE_CORE_LOG_H

#include <stdarg.h>
#include <stdint.h>

#include <tide/status.h>
#include "error.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum tide_log_level {
    TIDE_LOG_ERROR = 0,
    TIDE_LOG_WARN = 1,
    TIDE_LOG_INFO = 2,
    TIDE_LOG_DEBUG = 3,
} tide_log_level;

/* Receives each formatted line (no trailing newline); called with the logger lock held. */
typedef void (*tide_log_sink_fn)(void *ctx, tide_log_level level, const char *line);

/* Parses "error"/"warn"/"info"/"debug" (case-insensitive) into *out, or fails with a
   message naming them (core/opts.c: the logger itself sets no error details); any thread. */
tide_status tide_log_parse_level(const char *text, tide_log_level *out);

/* The level "error"/"warn"/"warning"/"info"/"debug" names (case-insensitive), or -1;
   no error details; any thread. */
int tide__log_level_of(const char *text);

/* Sets the process-wide level; any thread. */
void tide_log_set_level(tide_log_level level);

/* Returns the process-wide level (reads TIDE_LOG on first call); any thread. */
tide_log_level tide_log_get_level(void);

/* Returns the level's lower-case name ("warn"); static string; any thread. */
const char *tide_log_level_name(tide_log_level level);

/* Redirects lines to sink (NULL restores stderr); sink must outlive its use; any thread. */
void tide_log_set_sink(tide_log_sink_fn sink, void *ctx);

/* Formats and emits one line if level is enabled; never blocks on anything but stderr. */
void tide_log_write(tide_log_level level, const char *subsys, const char *file, int line,
                    const char *fmt, ...) TIDE_PRINTF(5, 6);

/* True when level would be emitted: use it to skip expensive formatting. */
#define TIDE_LOG_ENABLED(level) ((level) <= tide_log_get_level())

#define TIDE__LOG(level, subsys, ...)                                                              \
    do {                                                                                           \
        if (TIDE_LOG_ENABLED(level))                                                               \
            tide_log_write((level), (subsys), __FILE__, __LINE__, __VA_ARGS__);                    \
    } while (0)

#define TIDE_ERROR(subsys, ...) TIDE__LOG(TIDE_LOG_ERROR, subsys, __VA_ARGS__)
#define TIDE_WARN(subsys, ...) TIDE__LOG(TIDE_LOG_WARN, subsys, __VA_ARGS__)
#define TIDE_INFO(subsys, ...) TIDE__LOG(TIDE_LOG_INFO, subsys, __VA_ARGS__)
#define TIDE_DEBUG(subsys, ...) TIDE__LOG(TIDE_LOG_DEBUG, subsys, __VA_ARGS__)

/*
 * Rate limit of one call site (zero-initialised static): at most
 * TIDE_LOG_LIMIT_LINES lines per TIDE_LOG_LIMIT_MS window; the first line of a
 * later window says how many were suppressed. A client can then make tided
 * log a few lines a second, not one per message it sends.
 */
typedef struct tide_log_limit {
    uint64_t window_ns; /* start of the current window, monotonic */
    uint32_t lines;     /* lines written in it */
    uint32_t suppressed;
} tide_log_limit;

#define TIDE_LOG_LIMIT_LINES 10
#define TIDE_LOG_LIMIT_MS    10000

/* Like tide_log_write, unless rl's window already had its lines; any thread. */
void tide_log_write_limited(tide_log_limit *rl, tide_log_level level, const char *subsys,
                            const char *file, int line, const char *fmt, ...) TIDE_PRINTF(6, 7);

#define TIDE__LOG_LIMITED(level, subsys, ...)                                                      \
    do {                                                                                           \
        static tide_log_limit tide__rl_;                                                           \
        if (TIDE_LOG_ENABLED(level))                                                               \
            tide_log_write_limited(&tide__rl_, (level), (subsys), __FILE__, __LINE__,              \
                                   __VA_ARGS__);                                                   \
    } while (0)

/* Warnings and notes a remote peer can trigger at will: rate-limited per call site. */
#define TIDE_WARN_LIMITED(subsys, ...) TIDE__LOG_LIMITED(TIDE_LOG_WARN, subsys, __VA_ARGS__)
#define TIDE_INFO_LIMITED(subsys, ...) TIDE__LOG_LIMITED(TIDE_LOG_INFO, subsys, __VA_ARGS__)

#ifdef __cplusplus
}
#endif

#endif /* TIDE_CORE_LOG_H */
