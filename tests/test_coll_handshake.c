/*
 * MPI test of the creation handshake's made payload (tide__pool_handshake_run, 3 ranks):
 * the nccl backend makes its unique id there, and ncclGetUniqueId starts a thread that
 * lives until every member joins it, so the id must be made only once every member has
 * arrived, and never when one does not come.
 *   1. all three come, the last 300 ms late: the first member makes the payload once,
 *      after the late one arrived, and every member receives it;
 *   2. one never comes: the others time out and the payload is never made;
 *   3. making it fails: the first member gets that status, the other one
 *      TIDE_ERR_BACKEND naming the first member;
 *   4. a one-member communicator: the payload is made at once, with no messages.
 */
#include <mpi.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "collectives/collectives_int.h"
#include "core/clock.h"
#include "mpi_test.h"

typedef struct maker {
    int calls;
    uint64_t at_ns; /* when it was called */
    tide_status rc; /* what it returns */
} maker;

static tide_status make(void *ctx, void *payload, size_t len)
{
    maker *m = ctx;
    m->calls++;
    m->at_ns = tide_now_ns();
    if (m->rc != TIDE_OK)
        return tide_errorf(m->rc, "the test's maker fails on purpose");
    snprintf(payload, len, "made by the first member");
    return TIDE_OK;
}

/* A handshake whose payload the first member makes with make(m). */
static tide_status handshake(tide_coll_pool_t *pool, const int *members, int n, int tag,
                             uint32_t timeout_ms, maker *m, char *payload, size_t len)
{
    tide__handshake h = {members, n, tag, timeout_ms, NULL, NULL, make, m};
    return tide__pool_handshake_run(pool, &h, payload, len);
}

int main(int argc, char **argv)
{
    int provided = 0;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    int rank = 0, size = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    MT_ASSERT(size == 3, "run with 3 ranks, not %d", size);
    tide_coll_pool_t *pool = NULL;
    MT_OK(tide_coll_pool_new(&pool, MPI_COMM_WORLD));
    const int all[3] = {0, 1, 2};
    char payload[64];

    /* 1. the last member arrives late: the payload is made after it arrived */
    maker m = {0, 0, TIDE_OK};
    uint64_t late_at = 0;
    memset(payload, 0, sizeof payload);
    if (rank == 2) {
        usleep(300 * 1000);
        late_at = tide_now_ns();
    }
    MT_OK(handshake(pool, all, 3, 901, 10000, &m, payload, sizeof payload));
    MT_ASSERT(strcmp(payload, "made by the first member") == 0, "payload '%s'", payload);
    MT_ASSERT(m.calls == (rank == 0), "rank %d made the payload %d times", rank, m.calls);
    MPI_Bcast(&late_at, 1, MPI_UINT64_T, 2, MPI_COMM_WORLD);
    if (rank == 0)
        MT_ASSERT(m.at_ns >= late_at, "the payload was made %.1f ms before the last member came",
                  (double)(late_at - m.at_ns) * 1e-6);

    /* 2. rank 2 never comes: nobody makes anything */
    m = (maker){0, 0, TIDE_OK};
    if (rank != 2) {
        tide_status rc = handshake(pool, all, 3, 902, 300, &m, payload, sizeof payload);
        MT_ASSERT(rc == TIDE_ERR_TIMEOUT, "a missing member: %s (%s)", tide_strerror(rc),
                  tide_last_error());
        MT_ASSERT(m.calls == 0, "the payload was made although a member never came");
    }
    MPI_Barrier(MPI_COMM_WORLD);

    /* 3. making it fails: every member hears of it */
    const int two[2] = {0, 1};
    m = (maker){0, 0, TIDE_ERR_NOMEM};
    if (rank != 2) {
        tide_status rc = handshake(pool, two, 2, 903, 10000, &m, payload, sizeof payload);
        if (rank == 0)
            MT_ASSERT(rc == TIDE_ERR_NOMEM && m.calls == 1, "the maker's failure: %s",
                      tide_strerror(rc));
        else
            MT_ASSERT(rc == TIDE_ERR_BACKEND &&
                          strstr(tide_last_error(), "first member, pool rank 0, could not") != NULL,
                      "the first member's failure, seen by another: %s (%s)", tide_strerror(rc),
                      tide_last_error());
    }
    MPI_Barrier(MPI_COMM_WORLD);

    /* 4. one member: made at once */
    m = (maker){0, 0, TIDE_OK};
    memset(payload, 0, sizeof payload);
    MT_OK(handshake(pool, &rank, 1, 904, 1000, &m, payload, sizeof payload));
    MT_ASSERT(m.calls == 1 && strcmp(payload, "made by the first member") == 0,
              "a one-member communicator: %d calls, payload '%s'", m.calls, payload);

    tide_coll_pool_destroy(&pool);
    mt_pass("test_coll_handshake");
    MPI_Finalize();
    return 0;
}
