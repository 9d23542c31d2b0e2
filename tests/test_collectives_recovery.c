/*
 * Kill-one-rank recovery, run as `mpirun --enable-recovery -np 4`: the rank its scenario
 * names (tests/scenarios/test_collectives_recovery.h: the last one) dies (SIGKILL) while the others
 * wait on it inside an allreduce. A watchdog thread on each survivor stands in for the worker's
 * heartbeat thread: it notices that the dead rank's process is gone and calls tide_coll_comm_abort.
 * The survivors must get TIDE_ERR_ABORTED within 1 s of that, build a communicator over themselves
 * only (MPI_Comm_create_group over the pool, with the dead rank still in it) and complete an
 * allreduce with the exact sum. All ranks run on one host, so liveness is read from /proc (a zombie
 * counts as dead).
 *
 * --backend nccl (scripts/gpu-check.sh, one GPU, each rank its own NCCL_HOSTID) runs
 * the same on device buffers; there NCCL may see the dead peer itself before the
 * watchdog does (its socket closes), and that error must also come back as
 * TIDE_ERR_ABORTED, the status a training step recovers from.
 */
#include <mpi.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "collectives/collectives.h"
#include "core/clock.h"
#include "mpi_test.h"
#include "tests/support/scenario.h"

struct watch {
    int pid;
    tide_coll_comm_t *comm;
    uint64_t aborted_at;
    volatile int stop;
};

static int process_alive(int pid)
{
    char path[64], buf[256];
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return 0;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    const char *p = strrchr(buf, ')');
    return !(p && p[1] == ' ' && (p[2] == 'Z' || p[2] == 'X'));
}

static void *watchdog(void *arg)
{
    struct watch *w = arg;
    while (!w->stop) {
        if (!process_alive(w->pid)) {
            w->aborted_at = tide_now_ns();
            tide_coll_comm_abort(w->comm);
            return NULL;
        }
        tide_sleep_ms(5);
    }
    return NULL;
}

/* The scenario (tests/scenarios/test_collectives_recovery.h): one row. */
static const mt_row scenarios[] = {
#define ROW(name, ranks, timeout, labels, mpi, first, resizes, kill, ckpt, gen, status)            \
    {name, ranks, timeout, labels, mpi, first, resizes, kill, ckpt, gen, status},
#include "scenarios/test_collectives_recovery.h"
#undef ROW
};

int main(int argc, char **argv)
{
    const mt_row *row = NULL;
    if (MT_ROWS_SELECT(argc, argv, 1, scenarios, &row))
        return 0; /* --list */
    mt_scenario sc;
    if (row == NULL || mt_scenario_parse(row, &sc) != TIDE_OK || sc.kill.rank < 0) {
        fprintf(stderr, "test_collectives_recovery: its scenario must kill a rank (rN)\n");
        return 2;
    }
    int provided = 0, me, np;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    MPI_Comm_size(MPI_COMM_WORLD, &np);
    MT_ASSERT(np >= 3 && np <= 64 && sc.kill.rank < np, "run with 3..64 ranks, more than %d",
              sc.kill.rank);
    const char *name = "mpi";
    for (int i = 1; i + 1 < argc; i++)
        if (strcmp(argv[i], "--backend") == 0)
            name = argv[i + 1];
    const tide_coll_backend_v1 *be = NULL;
    tide_coll_pool_t *pool = NULL;
    MT_OK(tide_coll_backend_find(name, &be));
    MT_OK(tide_coll_pool_new(&pool, MPI_COMM_WORLD));
    int members[64], pids[64], mypid = (int)getpid();
    for (int i = 0; i < np; i++)
        members[i] = i;
    MPI_Allgather(&mypid, 1, MPI_INT, pids, 1, MPI_INT, MPI_COMM_WORLD);
    tide_coll_comm_params p = {.members = members, .n_members = np, .tag = 1};
    tide_coll_comm_t *all = NULL;
    MT_OK(tide_coll_comm_new(&all, be, pool, &p));
    MT_OK(tide_coll_barrier(all, NULL)); /* everyone alive and connected */
    int victim = sc.kill.rank;
    if (me == victim) {
        tide_sleep_ms(300); /* the others are inside the allreduce by now */
        raise(SIGKILL);
    }

    struct watch w = {pids[victim], all, 0, 0};
    pthread_t th;
    pthread_create(&th, NULL, watchdog, &w);
    float x[1000];
    void *dx = NULL, *dy = NULL, *dv = NULL;
    for (int i = 0; i < 1000; i++)
        x[i] = (float)me;
    MT_OK(be->mem_alloc(sizeof x, &dx));
    MT_OK(be->mem_alloc(sizeof x, &dy));
    MT_OK(be->copy_host(dx, x, sizeof x, 0, NULL));
    uint64_t t0 = tide_now_ns();
    tide_status rc = tide_coll_allreduce(all, dx, dy, 1000, TIDE_F32, TIDE_RED_SUM, NULL);
    uint64_t t1 = tide_now_ns();
    w.stop = 1;
    pthread_join(th, NULL);
    MT_ASSERT(rc == TIDE_ERR_ABORTED, "allreduce with a dead peer returned %s",
              tide_status_name(rc));
    /* the watchdog's abort, or (nccl) the backend's own report of the dead peer */
    int by_backend = w.aborted_at == 0 || w.aborted_at > t1;
    MT_ASSERT(!by_backend || strcmp(be->name, "mpi") != 0,
              "mpi cannot see a dead peer: only the watchdog's abort ends the wait");
    MT_ASSERT(by_backend || t1 - w.aborted_at < 1000ull * 1000000,
              "returned %.3f s after the abort", (double)(t1 - w.aborted_at) / 1e9);
    fprintf(stderr, "[rank %d] allreduce failed after %.3f s (%s): %s\n", me,
            (double)(t1 - t0) / 1e9,
            by_backend ? "the backend saw the dead peer" : "aborted by the watchdog",
            tide_last_error());
    tide_coll_comm_destroy(&all);

    /* Survivors only: the dead rank is still in the pool but not in the group. */
    p.n_members = np - 1;
    p.tag = 2;
    p.timeout_ms = 10000;
    tide_coll_comm_t *live = NULL;
    MT_OK(tide_coll_comm_new(&live, be, pool, &p));
    MT_ASSERT(tide_coll_comm_size(live) == np - 1, "survivor communicator size");
    int64_t v[257], want = 0;
    for (int r = 0; r < np - 1; r++)
        want += r + 1;
    for (int i = 0; i < 257; i++)
        v[i] = me + 1;
    MT_OK(be->mem_alloc(sizeof v, &dv));
    MT_OK(be->copy_host(dv, v, sizeof v, 0, NULL));
    MT_OK(tide_coll_allreduce(live, dv, dv, 257, TIDE_I64, TIDE_RED_SUM, NULL));
    MT_OK(be->copy_host(v, dv, sizeof v, 1, NULL));
    for (int i = 0; i < 257; i++)
        MT_ASSERT(v[i] == want, "survivor allreduce %lld != %lld", (long long)v[i],
                  (long long)want);
    MT_OK(tide_coll_barrier(live, NULL));
    tide_coll_comm_destroy(&live);
    be->mem_free(dx);
    be->mem_free(dy);
    be->mem_free(dv);
    tide_coll_pool_destroy(&pool);
    if (me == 0) {
        printf("recovery: passed (%d survivors of %d; allreduce sum %lld)\n", np - 1, np,
               (long long)want);
        fflush(stdout);
    }
    MPI_Finalize();
    return 0;
}
