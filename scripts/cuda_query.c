/*
 * cuda_query: asks the CUDA driver itself whether it can use a device (cuInit, the
 * device count, the first device's name), loading libcuda (argv[1], default
 * libcuda.so.1) with dlopen, so that neither the CUDA toolkit nor nvidia-smi is needed.
 * Prints "NAME (N devices)" and exits 0, or says why not and exits 1. scripts/gpu-check.sh's
 * gpu-info step runs it (built there with cc, or carried prebuilt in a gpu-bundle).
 */
#include <dlfcn.h>
#include <stdio.h>
typedef int (*init_fn)(unsigned);
typedef int (*count_fn)(int *);
typedef int (*get_fn)(int *, int);
typedef int (*name_fn)(char *, int, int);
int main(int argc, char **argv)
{
    const char *lib = argc > 1 ? argv[1] : "libcuda.so.1";
    void *h = dlopen(lib, RTLD_NOW);
    if (h == NULL) {
        fprintf(stderr, "cannot load the CUDA driver %s: %s\n", lib, dlerror());
        return 1;
    }
    init_fn init = (init_fn)dlsym(h, "cuInit");
    count_fn count = (count_fn)dlsym(h, "cuDeviceGetCount");
    get_fn get = (get_fn)dlsym(h, "cuDeviceGet");
    name_fn name = (name_fn)dlsym(h, "cuDeviceGetName");
    if (!init || !count || !get || !name) {
        fprintf(stderr, "%s is not a CUDA driver (no cuInit...)\n", lib);
        return 1;
    }
    int rc = init(0), n = 0, dev = 0;
    if (rc != 0) {
        fprintf(stderr, "cuInit failed: CUDA error %d\n", rc);
        return 1;
    }
    if ((rc = count(&n)) != 0 || n < 1) {
        fprintf(stderr, "the CUDA driver sees no device (error %d, %d devices)\n", rc, n);
        return 1;
    }
    char buf[256] = "";
    if ((rc = get(&dev, 0)) != 0 || (rc = name(buf, (int)sizeof buf, dev)) != 0) {
        fprintf(stderr, "device 0 does not answer: CUDA error %d\n", rc);
        return 1;
    }
    printf("%s (%d device%s)\n", buf, n, n > 1 ? "s" : "");
    return 0;
}
