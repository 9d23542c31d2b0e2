/*
 * test_gpu_skip: the probe tests/test_gpu_skip.sh runs to check tide_test_require_gpu
 * (tests/gpu_test.h), the gate every GPU test passes first: it exits 77 (skip) only
 * where no NVIDIA device exists, 1 where a device is present but CUDA cannot use it,
 * and returns (here: exit 0) where a device answers.
 */
#include <stdio.h>

#include "gpu_test.h"

int main(void)
{
    tide_test_require_gpu("test_gpu_skip");
    printf("test_gpu_skip: a CUDA device is present and answers\n");
    return 0;
}
