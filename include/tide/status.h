/*
 * tide status codes: every tide function that can fail returns a tide_status,
 * 0 on success and a negative code otherwise. The codes and their messages are
 * generated from one X-macro table so the enum and tide_strerror never drift.
 */
#ifndef TIDE_STATUS_H
#define TIDE_STATUS_H

#include <tide/api.h>

#ifdef __cplusplus
extern "C" {
#endif

/* X(NAME, value, message) */
#define TIDE_STATUS_MAP(X)                                                                         \
    X(OK, 0, "success")                                                                            \
    X(ERR_INVALID, -1, "invalid argument")                                                         \
    X(ERR_NOMEM, -2, "out of memory")                                                              \
    X(ERR_IO, -3, "I/O error")                                                                     \
    X(ERR_PROTOCOL, -4, "malformed or unexpected message")                                         \
    X(ERR_TIMEOUT, -5, "timed out")                                                                \
    X(ERR_ABORTED, -6, "operation aborted")                                                        \
    X(ERR_PEER, -7, "peer failed")                                                                 \
    X(ERR_NOT_FOUND, -8, "not found")                                                              \
    X(ERR_EXISTS, -9, "already exists")                                                            \
    X(ERR_STALE, -10, "stale generation")                                                          \
    X(ERR_DENIED, -11, "permission denied")                                                        \
    X(ERR_UNSUPPORTED, -12, "not supported")                                                       \
    X(ERR_NO_HOLDER, -13, "no live worker holds the data")                                         \
    X(ERR_BUSY, -14, "resource busy")                                                              \
    X(ERR_RANGE, -15, "value out of range")                                                        \
    X(ERR_NO_DEVICE, -16, "no device available")                                                   \
    X(ERR_CLOSED, -17, "connection closed")                                                        \
    X(ERR_BACKEND, -18, "communication backend error")                                             \
    X(ERR_INTERNAL, -19, "internal error")

#define TIDE__STATUS_ENUM(name, value, msg) TIDE_##name = (value),
typedef enum tide_status { TIDE_STATUS_MAP(TIDE__STATUS_ENUM) } tide_status;
#undef TIDE__STATUS_ENUM

/* Returns a static, human-readable message for rc; never NULL; any thread. */
TIDE_API const char *tide_strerror(tide_status rc);

/* Returns the static symbolic name of rc ("TIDE_ERR_INVALID"); never NULL; any thread. */
TIDE_API const char *tide_status_name(tide_status rc);

/*
 * Returns the detail message of the last error set on the calling thread with
 * tide_errorf (for example "tp=3 does not divide dimension 1 of fc1.weight"),
 * or "" when none; the string is thread-local and valid until the next error.
 */
TIDE_API const char *tide_last_error(void);

#ifdef __cplusplus
}
#endif

#endif /* TIDE_STATUS_H */
