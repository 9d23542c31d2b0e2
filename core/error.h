/*
 * Error reporting and the check macros every tide module uses.
 *
 * A failing call returns a tide_status; the place that first detects a problem
 * records a detail message with tide_errorf, and every hop that propagates the
 * error through TIDE_CHECK logs its file:line at debug level, so with
 * TIDE_LOG=debug an error reads like a backtrace.
 */
#ifndef TIDE_CORE_ERROR_H
#define TIDE_CORE_ERROR_H

#include <tide/status.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define TIDE_PRINTF(fmt, args) __attribute__((format(printf, fmt, args)))
#define TIDE_UNLIKELY(x) __builtin_expect(!!(x), 0)
#else
#define TIDE_PRINTF(fmt, args)
#define TIDE_UNLIKELY(x) (x)
#endif

/* Sets the calling thread's detail message and returns rc unchanged; any thread. */
tide_status tide_errorf(tide_status rc, const char *fmt, ...) TIDE_PRINTF(2, 3);

/* Clears the calling thread's detail message; any thread. */
void tide_error_clear(void);

/* Logs one propagation hop at debug level; used by the macros below, any thread. */
void tide__check_hop(const char *file, int line, const char *expr, tide_status rc);

/* Evaluate expr (a tide_status); on failure log the hop and return it. */
#define TIDE_CHECK(expr)                                                                           \
    do {                                                                                           \
        tide_status tide__rc = (expr);                                                             \
        if (TIDE_UNLIKELY(tide__rc != TIDE_OK)) {                                                  \
            tide__check_hop(__FILE__, __LINE__, #expr, tide__rc);                                  \
            return tide__rc;                                                                       \
        }                                                                                          \
    } while (0)

/* Evaluate expr into rc; on failure log the hop and jump to label (one cleanup path). */
#define TIDE_CHECK_GOTO(expr, rc, label)                                                           \
    do {                                                                                           \
        (rc) = (expr);                                                                             \
        if (TIDE_UNLIKELY((rc) != TIDE_OK)) {                                                      \
            tide__check_hop(__FILE__, __LINE__, #expr, (rc));                                      \
            goto label;                                                                            \
        }                                                                                          \
    } while (0)

/* Fail with a detail message and jump to label: rc = tide_errorf(code, ...). */
#define TIDE_FAIL_GOTO(rc, label, code, ...)                                                       \
    do {                                                                                           \
        (rc) = tide_errorf((code), __VA_ARGS__);                                                   \
        tide__check_hop(__FILE__, __LINE__, "TIDE_FAIL_GOTO", (rc));                               \
        goto label;                                                                                \
    } while (0)

/* Allocation check: a NULL pointer becomes TIDE_ERR_NOMEM and a jump to label. */
#define TIDE_CHECK_ALLOC_GOTO(ptr, rc, label)                                                      \
    do {                                                                                           \
        if (TIDE_UNLIKELY((ptr) == NULL)) {                                                        \
            (rc) = tide_errorf(TIDE_ERR_NOMEM, "out of memory allocating %s", #ptr);               \
            tide__check_hop(__FILE__, __LINE__, #ptr, (rc));                                       \
            goto label;                                                                            \
        }                                                                                          \
    } while (0)

#ifdef __cplusplus
}
#endif

#endif /* TIDE_CORE_ERROR_H */
