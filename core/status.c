/*
 * tide_status messages and the thread-local error detail. Cold paths only:
 * nothing here runs unless something failed.
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "error.h"
#include "log.h"

#define TIDE__DETAIL_MAX 512

static _Thread_local char detail[TIDE__DETAIL_MAX];

const char *tide_strerror(tide_status rc)
{
    switch (rc) {
#define TIDE__STATUS_MSG(name, value, msg)                                                         \
    case TIDE_##name:                                                                              \
        return msg;
        TIDE_STATUS_MAP(TIDE__STATUS_MSG)
#undef TIDE__STATUS_MSG
    }
    return "unknown tide status";
}

const char *tide_status_name(tide_status rc)
{
    switch (rc) {
#define TIDE__STATUS_NAME(name, value, msg)                                                        \
    case TIDE_##name:                                                                              \
        return "TIDE_" #name;
        TIDE_STATUS_MAP(TIDE__STATUS_NAME)
#undef TIDE__STATUS_NAME
    }
    return "TIDE_UNKNOWN";
}

tide_status tide_errorf(tide_status rc, const char *fmt, ...)
{
    /* Formatted aside first: callers often wrap the previous detail,
       tide_errorf(rc, "...: %s", tide_last_error()), and vsnprintf must not write the
       buffer it reads. */
    char buf[sizeof detail];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    memcpy(detail, buf, sizeof detail);
    return rc;
}

void tide_error_clear(void)
{
    detail[0] = '\0';
}

const char *tide_last_error(void)
{
    return detail;
}

void tide__check_hop(const char *file, int line, const char *expr, tide_status rc)
{
    if (TIDE_LOG_ENABLED(TIDE_LOG_DEBUG))
        tide_log_write(TIDE_LOG_DEBUG, "check", file, line, "%s failed: %s%s%s", expr,
                       tide_strerror(rc), detail[0] ? ": " : "", detail);
}
