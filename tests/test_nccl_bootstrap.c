/*
 * GPU test (2 ranks on one GPU, each its own NCCL_HOSTID): NCCL's bootstrap root thread,
 * which ncclGetUniqueId starts on rank 0 ("NCCL BootstrapR", detached, ending only once
 * every rank of the id checked in), must not outlive a failed communicator creation.
 *   1. rank 1 never comes: rank 0's creation times out, and no such thread runs (the id
 *      is made only once every member arrived);
 *   2. rank 1 takes the id in the handshake but never calls NCCL: rank 0's init times
 *      out, and the thread is gone after it (ended by a one-rank init on the id);
 *   3. a 2-rank communicator then forms and reduces as usual.
 * Skips (77) without a GPU (tests/gpu_test.h).
 */
#include <dirent.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "collectives/collectives_int.h"
#include "gpu_test.h"
#include "mpi_test.h"

/* Threads of this process named like NCCL's bootstrap root. */
static int root_threads(void)
{
    int n = 0;
    DIR *d = opendir("/proc/self/task");
    struct dirent *e;
    while (d != NULL && (e = readdir(d)) != NULL) {
        char path[300], name[64] = "";
        snprintf(path, sizeof path, "/proc/self/task/%s/comm", e->d_name);
        FILE *f = fopen(path, "r");
        if (f == NULL)
            continue;
        if (fgets(name, sizeof name, f) != NULL && strncmp(name, "NCCL BootstrapR", 15) == 0)
            n++;
        fclose(f);
    }
    if (d != NULL)
        closedir(d);
    return n;
}

/* Waits up to 3 s for the root threads to be gone (a thread told to end takes a moment). */
static int root_threads_after_wait(void)
{
    for (int i = 0; i < 30 && root_threads() > 0; i++)
        usleep(100 * 1000);
    return root_threads();
}

int main(int argc, char **argv)
{
    int provided = 0, rank = 0, size = 0;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    tide_test_require_gpu("test_nccl_bootstrap");
    MT_ASSERT(size == 2, "run with 2 ranks, not %d", size);
    char host[32];
    snprintf(host, sizeof host, "tide-bootstrap-%d", rank);
    setenv("NCCL_HOSTID", host, 1); /* two ranks on one GPU (see scripts/gpu-check.sh) */
    const tide_coll_backend_v1 *be = NULL;
    MT_OK(tide_coll_backend_find("nccl", &be));
    MT_OK(tide_coll_device_bind(be, 0));
    tide_coll_pool_t *pool = NULL;
    MT_OK(tide_coll_pool_new(&pool, MPI_COMM_WORLD));
    const int both[2] = {0, 1};
    tide_coll_comm_t *c = NULL;

    /* 1. rank 1 never comes */
    if (rank == 0) {
        tide_coll_comm_params p = {both, 2, 11, 500, NULL, NULL};
        tide_status rc = tide_coll_comm_new(&c, be, pool, &p);
        MT_ASSERT(rc == TIDE_ERR_TIMEOUT, "a member never came: %s (%s)", tide_strerror(rc),
                  tide_last_error());
        MT_ASSERT(root_threads() == 0, "%d bootstrap root thread(s) after a member never came",
                  root_threads());
    }
    MPI_Barrier(MPI_COMM_WORLD);

    /* 2. rank 1 takes the id and never joins NCCL */
    if (rank == 0) {
        tide_coll_comm_params p = {both, 2, 12, 2000, NULL, NULL};
        tide_status rc = tide_coll_comm_new(&c, be, pool, &p);
        MT_ASSERT(rc != TIDE_OK, "a communicator formed without rank 1");
        MT_ASSERT(root_threads_after_wait() == 0,
                  "%d bootstrap root thread(s) left after rank 1 never joined NCCL (%s)",
                  root_threads(), tide_last_error());
    } else {
        char id[TIDE_COLL_HANDSHAKE_PAYLOAD];
        MT_OK(tide__pool_handshake(pool, both, 2, 12, 10000, NULL, id, 128));
    }
    MPI_Barrier(MPI_COMM_WORLD);

    /* 3. a communicator of both, as usual */
    tide_coll_comm_params p = {both, 2, 13, 30000, NULL, NULL};
    MT_OK(tide_coll_comm_new(&c, be, pool, &p));
    int *dev = NULL, v = rank + 1;
    MT_OK(tide_coll_mem_alloc(be, 0, sizeof v, (void **)&dev));
    MT_OK(be->copy_host(dev, &v, sizeof v, 0, NULL));
    MT_OK(tide_coll_allreduce(c, dev, dev, 1, TIDE_I32, TIDE_RED_SUM, NULL));
    MT_OK(be->copy_host(&v, dev, sizeof v, 1, NULL));
    MT_ASSERT(v == 3, "allreduce of 1 and 2 gave %d", v);
    be->mem_free(dev);
    tide_coll_comm_destroy(&c);
    MT_ASSERT(root_threads_after_wait() == 0, "a root thread outlived a formed communicator");
    tide_coll_pool_destroy(&pool);
    mt_pass("test_nccl_bootstrap");
    MPI_Finalize();
    return 0;
}
