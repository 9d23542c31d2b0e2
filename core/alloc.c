/*
 * Allocation wrappers with an injectable failure. The hook costs one relaxed
 * atomic load per allocation when disabled.
 */
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif

#include "alloc.h"

static atomic_long fail_countdown; /* 0: disabled; k > 0: the kth next allocation fails */
static atomic_int fail_sticky;
static atomic_long failures;

static int should_fail(void)
{
    if (atomic_load_explicit(&fail_countdown, memory_order_relaxed) == 0)
        return 0;
    long left = atomic_fetch_sub(&fail_countdown, 1);
    if (left == 1) {
        if (atomic_load(&fail_sticky))
            atomic_store(&fail_countdown, 1); /* keep failing */
        atomic_fetch_add(&failures, 1);
        return 1;
    }
    if (left <= 0) { /* raced with a disable */
        atomic_store(&fail_countdown, 0);
        return 0;
    }
    return 0;
}

void tide_alloc_fail_at(long n, int sticky)
{
    atomic_store(&fail_sticky, sticky ? 1 : 0);
    atomic_store(&failures, 0);
    atomic_store(&fail_countdown, n > 0 ? n : 0);
}

long tide_alloc_failures(void)
{
    return atomic_load(&failures);
}

void *tide_malloc(size_t size)
{
    if (should_fail())
        return NULL;
    return malloc(size ? size : 1);
}

void *tide_calloc(size_t n, size_t size)
{
    if (size != 0 && n > SIZE_MAX / size)
        return NULL;
    if (should_fail())
        return NULL;
    return calloc(n ? n : 1, size ? size : 1);
}

void *tide_realloc(void *ptr, size_t size)
{
    if (should_fail())
        return NULL;
    return realloc(ptr, size ? size : 1);
}

void *tide_reallocarray(void *ptr, size_t n, size_t size)
{
    if (size != 0 && n > SIZE_MAX / size)
        return NULL;
    return tide_realloc(ptr, n * size);
}

char *tide_strdup(const char *s)
{
    if (s == NULL)
        return NULL;
    size_t len = strlen(s) + 1;
    char *copy = tide_malloc(len);
    if (copy != NULL)
        memcpy(copy, s, len);
    return copy;
}

void tide_free(void *ptr)
{
    free(ptr);
}

void tide_alloc_retain(size_t retain)
{
#ifdef __GLIBC__
    mallopt(M_MMAP_THRESHOLD, 32 << 20); /* glibc's largest: 32 MiB on 64-bit */
    mallopt(M_TRIM_THRESHOLD, retain > INT32_MAX ? INT32_MAX : (int)retain);
#else
    (void)retain;
#endif
}
