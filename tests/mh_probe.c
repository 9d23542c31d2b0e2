/*
 * mh_probe: what a launch across the hosts of scripts/cluster.sh looks like to MPI, for
 * test_multihost_cluster. Run with ranks on at least two hosts, at least two per host:
 *   mpirun ... --host h1:2,h2:2 -np 4 mh_probe [MIB]
 * Checks that MPI_COMM_TYPE_SHARED splits the ranks exactly by hostname (Open MPI sees
 * one node per host: shared memory inside it, TCP between them), then times MIB MiB
 * (default 16) sent one way between rank 0 and a rank on its host, and between rank 0
 * and a rank on another host, best of 5, and prints one line rank 0's script can read:
 *   mh_probe: hosts H ranks N shared-split per-host local_mbs X remote_mbs Y
 * Exit 0 on success; an assertion aborts the job with the reason.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "mpi_test.h"

#define HOST_LEN 64

/* MB/s of n bytes sent from rank a to rank b (best of 5: a loaded machine deschedules the
   ranks now and then), on rank 0; others return 0. */
static double one_way(int a, int b, char *buf, int n, int rank)
{
    double best = 0.0;
    for (int rep = 0; rep < 5; rep++) {
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = MPI_Wtime();
        if (rank == a)
            MPI_Send(buf, n, MPI_CHAR, b, 7, MPI_COMM_WORLD);
        else if (rank == b)
            MPI_Recv(buf, n, MPI_CHAR, a, 7, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        /* the receiver's end time decides: it has the last byte */
        double dt = MPI_Wtime() - t0;
        if (rank == b)
            MPI_Send(&dt, 1, MPI_DOUBLE, 0, 8, MPI_COMM_WORLD);
        if (rank == 0) {
            MPI_Recv(&dt, 1, MPI_DOUBLE, b, 8, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            double mbs = (double)n / dt / 1e6;
            if (mbs > best)
                best = mbs;
        }
    }
    return best;
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int rank = 0, size = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    int mib = argc > 1 ? atoi(argv[1]) : 16;
    MT_ASSERT(mib > 0 && mib <= 1024, "MIB must be 1..1024, not %s", argv[1]);

    char(*hosts)[HOST_LEN] = calloc((size_t)size, HOST_LEN);
    char me[HOST_LEN] = "";
    MT_ASSERT(hosts != NULL && gethostname(me, sizeof me - 1) == 0, "hostname");
    MPI_Allgather(me, HOST_LEN, MPI_CHAR, hosts, HOST_LEN, MPI_CHAR, MPI_COMM_WORLD);

    /* the shared-memory split holds exactly the ranks of this hostname */
    MPI_Comm node;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
    int node_size = 0, same = 0, n_hosts = 0;
    MPI_Comm_size(node, &node_size);
    for (int i = 0; i < size; i++) {
        same += strcmp(hosts[i], me) == 0;
        int first = 1;
        for (int j = 0; j < i; j++)
            first &= strcmp(hosts[j], hosts[i]) != 0;
        n_hosts += first;
    }
    MT_ASSERT(node_size == same,
              "host %s: MPI_COMM_TYPE_SHARED holds %d ranks, but %d ranks run on this host", me,
              node_size, same);
    char(*node_hosts)[HOST_LEN] = calloc((size_t)node_size, HOST_LEN);
    MT_ASSERT(node_hosts != NULL, "calloc");
    MPI_Allgather(me, HOST_LEN, MPI_CHAR, node_hosts, HOST_LEN, MPI_CHAR, node);
    for (int i = 0; i < node_size; i++)
        MT_ASSERT(strcmp(node_hosts[i], me) == 0,
                  "MPI_COMM_TYPE_SHARED of host %s holds a rank of host %s", me, node_hosts[i]);
    MPI_Comm_free(&node);
    MT_ASSERT(n_hosts >= 2, "all %d ranks run on %s: launch across at least two hosts", size,
              hosts[0]);

    int local = -1, remote = -1;
    for (int i = 1; i < size; i++) {
        if (local < 0 && strcmp(hosts[i], hosts[0]) == 0)
            local = i;
        if (remote < 0 && strcmp(hosts[i], hosts[0]) != 0)
            remote = i;
    }
    MT_ASSERT(local > 0 && remote > 0, "need a second rank on %s and one on another host",
              hosts[0]);
    int n = mib << 20;
    char *buf = malloc((size_t)n);
    MT_ASSERT(buf != NULL, "malloc %d", n);
    memset(buf, 1, (size_t)n);
    double l = one_way(0, local, buf, n, rank);
    double r = one_way(0, remote, buf, n, rank);
    if (rank == 0) {
        printf("mh_probe: hosts %d ranks %d shared-split per-host local_mbs %.1f remote_mbs %.1f\n",
               n_hosts, size, l, r);
        fflush(stdout);
    }
    free(buf);
    free(node_hosts);
    free(hosts);
    MPI_Finalize();
    return 0;
}
