/*
 * Clocks: a monotonic clock for durations and timers, and wall-clock time for
 * event records. Both are cheap (vDSO clock_gettime).
 */
#ifndef TIDE_CORE_CLOCK_H
#define TIDE_CORE_CLOCK_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Monotonic time in nanoseconds since an arbitrary origin; any thread. */
uint64_t tide_now_ns(void);

/* Wall-clock time in milliseconds since the Unix epoch; any thread. */
int64_t tide_wall_ms(void);

/* Sleeps the calling thread for ms milliseconds (restarts on EINTR). */
void tide_sleep_ms(uint64_t ms);

#ifdef __cplusplus
}
#endif

#endif /* TIDE_CORE_CLOCK_H */
