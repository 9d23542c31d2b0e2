/*
 * Allocation wrappers used by all tide code instead of malloc and friends, so
 * that tests can make the Nth allocation fail and check that every caller turns
 * it into TIDE_ERR_NOMEM and leaks nothing (SQLite-style fault injection).
 */
#ifndef TIDE_CORE_ALLOC_H
#define TIDE_CORE_ALLOC_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* malloc that honours the failure hook; caller frees with tide_free; any thread. */
void *tide_malloc(size_t size);

/* calloc that honours the failure hook and checks n * size for overflow; any thread. */
void *tide_calloc(size_t n, size_t size);

/* realloc that honours the failure hook; on failure ptr is untouched; any thread. */
void *tide_realloc(void *ptr, size_t size);

/* Array realloc with overflow check (n * size); on failure ptr is untouched; any thread. */
void *tide_reallocarray(void *ptr, size_t n, size_t size);

/* strdup that honours the failure hook; NULL in gives NULL out; any thread. */
char *tide_strdup(const char *s);

/* free; NULL is fine; any thread. */
void tide_free(void *ptr);

/*
 * Test hook: the nth allocation from now (1 = the next one) and, if sticky,
 * every one after it returns NULL. n <= 0 disables the hook. Any thread; the
 * counter is process-wide and atomic.
 */
void tide_alloc_fail_at(long n, int sticky);

/* Number of allocations failed by the hook since the last tide_alloc_fail_at; any thread. */
long tide_alloc_failures(void);

/*
 * Makes the C library keep freed memory for the next allocations of this process instead
 * of handing it back to the kernel (up to retain bytes), and serve blocks of up to 32 MiB
 * from that heap rather than from fresh mappings. For programs that allocate and free the
 * same tens of MB over and over (tided's decisions, the cluster simulator): every fresh
 * page costs a fault, and in a virtual machine the faults cost more than the decision's
 * arithmetic. No-op outside glibc. Call once, at start, before threads.
 */
void tide_alloc_retain(size_t retain);

#ifdef __cplusplus
}
#endif

#endif /* TIDE_CORE_ALLOC_H */
