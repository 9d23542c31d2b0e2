/*
 * GPU tests call tide_test_require_gpu() first: on a machine without a CUDA
 * device they print why and exit 77, which ctest reports as skipped.
 */
#ifndef TIDE_TESTS_GPU_TEST_H
#define TIDE_TESTS_GPU_TEST_H

#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>

static inline void tide_test_require_gpu(const char *test)
{
    int n = 0;
    cudaError_t err = cudaGetDeviceCount(&n);
    if (err != cudaSuccess || n == 0) {
        printf("SKIP: %s: no CUDA device present (%s)\n", test,
               err != cudaSuccess ? cudaGetErrorString(err) : "0 devices");
        fflush(stdout);
        exit(77);
    }
}

#endif /* TIDE_TESTS_GPU_TEST_H */
