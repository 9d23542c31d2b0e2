/*
 * GPU tests call tide_test_require_gpu() first. It skips (prints why, exits 77, which
 * ctest reports as skipped) only where this machine has no NVIDIA device at all: CUDA
 * finds none (cudaErrorNoDevice, cudaErrorInsufficientDriver, or 0 devices) and no
 * /dev/nvidia<N> node exists, or CUDA_VISIBLE_DEVICES hides every device on purpose.
 * Anything else is a failure (exit 1) with the CUDA error: a device node without a
 * working driver, a driver too old for the runtime on a machine that has a GPU, a
 * listed device that does not answer. A broken GPU must never pass as "no GPU".
 */
#ifndef TIDE_TESTS_GPU_TEST_H
#define TIDE_TESTS_GPU_TEST_H

#include <cuda_runtime_api.h>
#include <glob.h>
#include <stdio.h>
#include <stdlib.h>

/* 1 when a /dev/nvidia<N> device node exists (an NVIDIA GPU is present). */
static inline int tide_test_nvidia_node(void)
{
    glob_t g;
    int found = glob("/dev/nvidia[0-9]*", 0, NULL, &g) == 0 && g.gl_pathc > 0;
    globfree(&g);
    return found;
}

static inline void tide_test_require_gpu(const char *test)
{
    int n = 0;
    cudaError_t err = cudaGetDeviceCount(&n);
    int none = err == cudaErrorNoDevice || err == cudaErrorInsufficientDriver ||
               (err == cudaSuccess && n == 0);
    const char *cvd = getenv("CUDA_VISIBLE_DEVICES");
    if (none && !tide_test_nvidia_node()) {
        printf("SKIP: %s: no CUDA device on this machine (%s; no /dev/nvidia* node)\n", test,
               err != cudaSuccess ? cudaGetErrorString(err) : "0 devices");
        fflush(stdout);
        exit(77);
    }
    if (none && cvd != NULL && (cvd[0] == '\0' || cvd[0] == '-')) {
        printf("SKIP: %s: CUDA_VISIBLE_DEVICES='%s' hides every device\n", test, cvd);
        fflush(stdout);
        exit(77);
    }
    if (err == cudaSuccess && n > 0) {
        /* a device is listed: it must also answer a query (no context made here: the
           test picks its own device) */
        int major = 0;
        err = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0);
        if (err == cudaSuccess)
            return;
    }
    fprintf(stderr,
            "FAIL: %s: an NVIDIA device is present but CUDA cannot use it: %s (%s)%s%s\n"
            "      (a GPU test skips only where no device exists; fix the driver, or run "
            "with CUDA_VISIBLE_DEVICES= to skip on purpose)\n",
            test, cudaGetErrorName(err), cudaGetErrorString(err),
            cvd != NULL ? "; CUDA_VISIBLE_DEVICES=" : "", cvd != NULL ? cvd : "");
    fflush(stderr);
    exit(1);
}

#endif /* TIDE_TESTS_GPU_TEST_H */
