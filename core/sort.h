/*
 * Sorting of plain integer arrays for the planner and the policy: an LSD radix sort,
 * several times faster than qsort's callback per comparison on the 10^4..10^5 worker
 * ids and host indices a decision sorts at 10,000 GPUs.
 */
#ifndef TIDE_CORE_SORT_H
#define TIDE_CORE_SORT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Sorts a[0, n) ascending in place. Needs n scratch entries (tide_malloc); when that
   allocation fails it falls back to qsort, so it never fails. Any thread. */
void tide_sort_i32(int32_t *a, size_t n);

/* tide_sort_i32 for unsigned values. */
void tide_sort_u32(uint32_t *a, size_t n);

#ifdef __cplusplus
}
#endif

#endif /* TIDE_CORE_SORT_H */
