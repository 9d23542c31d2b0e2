/*
 * Devices, memory and streams through a backend's table (tide_coll_device_bind,
 * tide_coll_mem_*, tide_coll_stream_*), with the host defaults for a backend that leaves
 * an entry out, and the 2D copy split (tide__copy2d_*) that the nccl backend uses for
 * pitches beyond the device's limit. Called by the worker, the memory pool (pool.c) and
 * nccl_backend.c; calls only the backend's table. Workload: setup, and one call per copy.
 */
#include <string.h>

#include "collectives/collectives_int.h"

/* ---- devices and memory ------------------------------------------------------------ */

tide_status tide_coll_device_bind(const tide_coll_backend_v1 *be, int device)
{
    if (be == NULL)
        return tide_errorf(TIDE_ERR_INVALID, "tide_coll_device_bind: backend is NULL");
    if (be->device_bind == NULL)
        return TIDE_OK;
    if (device < 0)
        return tide_errorf(TIDE_ERR_INVALID, "backend '%s' needs a device index, got %d", be->name,
                           device);
    return be->device_bind(device);
}

tide_status tide_coll_mem_alloc(const tide_coll_backend_v1 *be, int device, size_t bytes,
                                void **out)
{
    if (be == NULL || out == NULL)
        return tide_errorf(TIDE_ERR_INVALID, "tide_coll_mem_alloc: backend and out are required");
    *out = NULL;
    if (be->mem_alloc_on != NULL)
        return be->mem_alloc_on(device, bytes, out);
    return be->mem_alloc(bytes, out);
}

tide_status tide_coll_mem_zero(const tide_coll_backend_v1 *be, int device, void *ptr, size_t bytes)
{
    if (be == NULL)
        return tide_errorf(TIDE_ERR_INVALID, "tide_coll_mem_zero: backend is NULL");
    if (bytes == 0)
        return TIDE_OK;
    if (ptr == NULL)
        return tide_errorf(TIDE_ERR_INVALID, "tide_coll_mem_zero: NULL buffer of %zu bytes", bytes);
    if (be->mem_zero != NULL)
        return be->mem_zero(device, ptr, bytes);
    if (be->mem_kind != TIDE_MEM_HOST)
        return tide_errorf(TIDE_ERR_UNSUPPORTED, "backend '%s' cannot zero its memory", be->name);
    memset(ptr, 0, bytes);
    return TIDE_OK;
}

tide_status tide_coll_mem_check(const tide_coll_backend_v1 *be, const void *ptr, size_t bytes,
                                const char *what)
{
    if (be == NULL)
        return tide_errorf(TIDE_ERR_INVALID, "tide_coll_mem_check: backend is NULL");
    if (bytes == 0 || be->mem_check == NULL)
        return TIDE_OK;
    if (ptr == NULL)
        return tide_errorf(TIDE_ERR_INVALID, "%s: NULL buffer of %zu bytes", what ? what : "buffer",
                           bytes);
    return be->mem_check(ptr, bytes, what ? what : "buffer");
}

tide_status tide_coll_stream_new_low(const tide_coll_backend_v1 *be, int device,
                                     tide_coll_stream_t *out)
{
    if (be == NULL || out == NULL)
        return tide_errorf(TIDE_ERR_INVALID, "tide_coll_stream_new_low: backend and out are "
                                             "required");
    *out = NULL;
    return be->stream_new_low != NULL ? be->stream_new_low(device, out) : TIDE_OK;
}

void tide_coll_stream_free(const tide_coll_backend_v1 *be, tide_coll_stream_t stream)
{
    if (be != NULL && stream != NULL && be->stream_free != NULL)
        be->stream_free(stream);
}

tide__copy2d_mode tide__copy2d_choose(size_t dpitch, size_t spitch, size_t width, size_t height,
                                      size_t max_pitch)
{
    if (height <= 1 || (dpitch == width && spitch == width))
        return TIDE__COPY_FLAT;
    if (dpitch <= max_pitch && spitch <= max_pitch)
        return TIDE__COPY_2D;
    return TIDE__COPY_ROWS;
}

tide_status tide__copy2d_split(void *dst, size_t dpitch, const void *src, size_t spitch,
                               size_t width, size_t height, size_t max_pitch,
                               const tide__copy2d_fns *fns, void *ctx)
{
    if (width == 0 || height == 0)
        return TIDE_OK;
    char *d = dst;
    const char *s = src;
    switch (tide__copy2d_choose(dpitch, spitch, width, height, max_pitch)) {
    case TIDE__COPY_FLAT:
        /* one row, or rows back to back at both ends: the pitch is irrelevant */
        return fns->flat(ctx, d, s, height == 1 ? width : width * height);
    case TIDE__COPY_2D:
        return fns->rect(ctx, d, dpitch, s, spitch, width, height);
    case TIDE__COPY_ROWS:
        /* a pitch beyond the device's limit comes with rows of GiBs: few of them */
        for (size_t r = 0; r < height; r++)
            TIDE_CHECK(fns->flat(ctx, d + r * dpitch, s + r * spitch, width));
        return TIDE_OK;
    }
    return tide_errorf(TIDE_ERR_INTERNAL, "unknown copy mode");
}
