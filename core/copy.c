/*
 * Bulk copies with non-temporal stores (see copy.h). x86-64 with SSE2 streams; every
 * other target falls back to memcpy.
 */
#include <stdint.h>
#include <string.h>

#include "core/copy.h"

#if defined(__SSE2__)
#include <emmintrin.h>

/* One row: memcpy up to a 16-byte-aligned destination, then 64-byte blocks of
   streaming stores, then memcpy for the tail. */
static void stream_row(char *d, const char *s, size_t n)
{
    size_t head = (size_t)(-(uintptr_t)d & 15u);
    if (head > n)
        head = n;
    memcpy(d, s, head);
    d += head;
    s += head;
    n -= head;
    for (; n >= 64; n -= 64, d += 64, s += 64) {
        __m128i a = _mm_loadu_si128((const __m128i *)(const void *)s);
        __m128i b = _mm_loadu_si128((const __m128i *)(const void *)(s + 16));
        __m128i c = _mm_loadu_si128((const __m128i *)(const void *)(s + 32));
        __m128i e = _mm_loadu_si128((const __m128i *)(const void *)(s + 48));
        _mm_stream_si128((__m128i *)(void *)d, a);
        _mm_stream_si128((__m128i *)(void *)(d + 16), b);
        _mm_stream_si128((__m128i *)(void *)(d + 32), c);
        _mm_stream_si128((__m128i *)(void *)(d + 48), e);
    }
    memcpy(d, s, n);
}
#endif

void tide_copy_2d(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                  size_t height)
{
    char *d = dst;
    const char *s = src;
    if (width == 0 || height == 0)
        return;
    if (height == 1 || (dpitch == width && spitch == width)) {
        width *= height;
        height = 1;
    }
#if defined(__SSE2__)
    /* Rows narrower than a few cache lines gain little from streaming and pay for the
       partial lines at both ends. */
    if (width * height >= TIDE_COPY_STREAM_MIN && width >= 256) {
        for (size_t r = 0; r < height; r++)
            stream_row(d + r * dpitch, s + r * spitch, width);
        _mm_sfence(); /* streamed stores are weakly ordered: publish them before return */
        return;
    }
#endif
    for (size_t r = 0; r < height; r++)
        memcpy(d + r * dpitch, s + r * spitch, width);
}

void tide_copy(void *dst, const void *src, size_t n)
{
    tide_copy_2d(dst, n, src, n, n, 1);
}
