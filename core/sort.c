/*
 * LSD radix sort of 32-bit keys, 11 bits a pass, skipping the passes whose digit is
 * the same in every key (small ranges such as worker ids and host indices take one or
 * two passes). Small arrays use insertion sort. Workload: arrays of up to ~10^6
 * entries, a few per scheduling decision.
 */
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/sort.h"

#define SMALL  48 /* below this, insertion sort beats the counting passes */
#define BITS   11
#define DIGITS (1u << BITS)

static int cmp_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return (x > y) - (x < y);
}

static void insertion(uint32_t *a, size_t n)
{
    for (size_t i = 1; i < n; i++) {
        uint32_t v = a[i];
        size_t j = i;
        while (j > 0 && a[j - 1] > v) {
            a[j] = a[j - 1];
            j--;
        }
        a[j] = v;
    }
}

void tide_sort_u32(uint32_t *a, size_t n)
{
    if (n < SMALL) {
        insertion(a, n);
        return;
    }
    uint32_t *tmp = tide_malloc(n * sizeof *tmp);
    if (tmp == NULL) {
        qsort(a, n, sizeof *a, cmp_u32);
        return;
    }
    uint32_t lo_all = UINT32_MAX, hi_any = 0;
    for (size_t i = 0; i < n; i++) {
        lo_all &= a[i];
        hi_any |= a[i];
    }
    uint32_t varies = lo_all ^ hi_any; /* bits that differ somewhere */
    uint32_t *src = a, *dst = tmp;
    static _Thread_local size_t count[DIGITS];
    for (unsigned shift = 0; shift < 32; shift += BITS) {
        if (((varies >> shift) & (DIGITS - 1)) == 0)
            continue; /* every key has the same digit here: the pass would not move one */
        memset(count, 0, sizeof count);
        for (size_t i = 0; i < n; i++)
            count[(src[i] >> shift) & (DIGITS - 1)]++;
        size_t at = 0;
        for (size_t d = 0; d < DIGITS; d++) {
            size_t c = count[d];
            count[d] = at;
            at += c;
        }
        for (size_t i = 0; i < n; i++)
            dst[count[(src[i] >> shift) & (DIGITS - 1)]++] = src[i];
        uint32_t *t = src;
        src = dst;
        dst = t;
    }
    if (src != a)
        memcpy(a, src, n * sizeof *a);
    tide_free(tmp);
}

void tide_sort_i32(int32_t *a, size_t n)
{
    /* flipping the sign bit maps int32 order onto uint32 order */
    uint32_t *u = (uint32_t *)(void *)a;
    for (size_t i = 0; i < n; i++)
        u[i] ^= 0x80000000u;
    tide_sort_u32(u, n);
    for (size_t i = 0; i < n; i++)
        u[i] ^= 0x80000000u;
}
