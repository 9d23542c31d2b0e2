/*
 * Bulk host memory copies for moving model state: a 2-D copy (rows of width bytes at
 * two pitches) that streams large copies past the cache.
 *
 * A reshard copies hundreds of MiB per rank into freshly allocated buffers that the
 * next training step reads only much later. A plain memcpy first reads every
 * destination line into the cache (read-for-ownership) and later writes it back, three
 * memory passes per byte; non-temporal stores write the destination straight to memory,
 * two passes. On a machine whose cores share the memory bus (every reshard on one host)
 * that is up to 1.5x faster. Small copies use memcpy, whose result the caller is likely
 * to read next.
 *
 * Workload: copies of KiBs to GiBs; rows of bytes to MiBs.
 */
#ifndef TIDE_CORE_COPY_H
#define TIDE_CORE_COPY_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Copies at or above this many bytes in total stream past the cache (bytes). */
#define TIDE_COPY_STREAM_MIN ((size_t)1 << 20)

/* Copies height rows of width bytes from src (rows pitch spitch bytes apart) to dst
   (dpitch apart). Regions must not overlap. Streams the stores when the total is at
   least TIDE_COPY_STREAM_MIN and the CPU has SSE2; memcpy otherwise. Blocks for the
   copy; any thread. */
void tide_copy_2d(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                  size_t height);

/* Same for one contiguous range: tide_copy_2d(dst, n, src, n, n, 1). */
void tide_copy(void *dst, const void *src, size_t n);

#ifdef __cplusplus
}
#endif

#endif /* TIDE_CORE_COPY_H */
