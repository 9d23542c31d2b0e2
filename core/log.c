/*
 * The logger. Lines are formatted into a stack buffer and written with one
 * fwrite under a mutex, so lines from the heartbeat thread and the training
 * thread never interleave. Expected volume: a few lines per second at info.
 */
#include <ctype.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "log.h"

static atomic_int level = -1; /* -1: not yet read from TIDE_LOG */
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static tide_log_sink_fn sink_fn;
static void *sink_ctx;

static const char *const names[] = {"error", "warn", "info", "debug"};

int tide__log_level_of(const char *text)
{
    if (text == NULL)
        return -1;
    for (int i = 0; i < 4; i++) {
        if (strcasecmp(text, names[i]) == 0)
            return i;
    }
    return strcasecmp(text, "warning") == 0 ? (int)TIDE_LOG_WARN : -1;
}

void tide_log_set_level(tide_log_level l)
{
    atomic_store(&level, (int)l);
}

tide_log_level tide_log_get_level(void)
{
    int l = atomic_load_explicit(&level, memory_order_relaxed);
    if (l >= 0)
        return (tide_log_level)l;
    tide_log_level parsed = TIDE_LOG_WARN;
    const char *env = getenv("TIDE_LOG");
    int l_env = env != NULL && env[0] != '\0' ? tide__log_level_of(env) : (int)TIDE_LOG_WARN;
    if (l_env < 0)
        fprintf(stderr, "tide: ignoring TIDE_LOG=%s (use error, warn, info or debug)\n", env);
    else
        parsed = (tide_log_level)l_env;
    int expected = -1;
    atomic_compare_exchange_strong(&level, &expected, (int)parsed);
    return (tide_log_level)atomic_load(&level);
}

const char *tide_log_level_name(tide_log_level l)
{
    if ((int)l < 0 || (int)l > 3)
        return "?";
    return names[l];
}

void tide_log_set_sink(tide_log_sink_fn fn, void *ctx)
{
    pthread_mutex_lock(&lock);
    sink_fn = fn;
    sink_ctx = ctx;
    pthread_mutex_unlock(&lock);
}

static const char *basename_of(const char *path)
{
    const char *slash = strrchr(path, '/');
    return slash ? slash + 1 : path;
}

static void write_line(tide_log_level l, const char *subsys, const char *file, int line,
                       const char *fmt, va_list ap) TIDE_PRINTF(5, 0);

void tide_log_write(tide_log_level l, const char *subsys, const char *file, int line,
                    const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    write_line(l, subsys, file, line, fmt, ap);
    va_end(ap);
}

void tide_log_write_limited(tide_log_limit *rl, tide_log_level l, const char *subsys,
                            const char *file, int line, const char *fmt, ...)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    uint64_t now = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
    uint32_t dropped = 0;
    int write = 0, last = 0;
    pthread_mutex_lock(&lock);
    if (rl->window_ns == 0 || now - rl->window_ns >= (uint64_t)TIDE_LOG_LIMIT_MS * 1000000ull) {
        dropped = rl->suppressed;
        rl->window_ns = now;
        rl->lines = 0;
        rl->suppressed = 0;
    }
    if (rl->lines < TIDE_LOG_LIMIT_LINES) {
        rl->lines++;
        write = 1;
        last = rl->lines == TIDE_LOG_LIMIT_LINES;
    } else {
        rl->suppressed++;
    }
    pthread_mutex_unlock(&lock);
    if (dropped > 0)
        tide_log_write(l, subsys, file, line, "%u more lines like the next one were suppressed",
                       dropped);
    if (write) {
        va_list ap;
        va_start(ap, fmt);
        write_line(l, subsys, file, line, fmt, ap);
        va_end(ap);
    }
    if (last)
        tide_log_write(l, subsys, file, line,
                       "more lines like the previous one are suppressed for %d s",
                       TIDE_LOG_LIMIT_MS / 1000);
}

static void write_line(tide_log_level l, const char *subsys, const char *file, int line,
                       const char *fmt, va_list ap)
{
    char buf[1024];
    struct timespec ts;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    int n = snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ %c [%s] ",
                     tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min,
                     tm.tm_sec, ts.tv_nsec / 1000000L, toupper((unsigned char)names[l][0]),
                     subsys ? subsys : "tide");
    if (n < 0)
        return;
    int m = vsnprintf(buf + n, sizeof buf - (size_t)n, fmt, ap);
    if (m > 0)
        n += m;
    if ((size_t)n >= sizeof buf - 1)
        n = (int)sizeof buf - 2;
    /* Where it came from matters only when debugging. */
    if (l == TIDE_LOG_DEBUG && file != NULL && (size_t)n < sizeof buf - 2) {
        m = snprintf(buf + n, sizeof buf - (size_t)n, " (%s:%d)", basename_of(file), line);
        if (m > 0)
            n += m;
        if ((size_t)n >= sizeof buf - 1)
            n = (int)sizeof buf - 2;
    }
    pthread_mutex_lock(&lock);
    if (sink_fn != NULL) {
        buf[n] = '\0';
        sink_fn(sink_ctx, l, buf);
    } else {
        buf[n] = '\n';
        fwrite(buf, 1, (size_t)n + 1, stderr);
    }
    pthread_mutex_unlock(&lock);
}
