/*
 * A tiny harness for MPI integration tests: assertions that print the rank
 * and the location and then abort the whole job (so ctest sees a failure
 * instead of a hang), and a closing line per test.
 */
#ifndef TIDE_TESTS_MPI_TEST_H
#define TIDE_TESTS_MPI_TEST_H

#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

#include <tide/status.h>

static inline int mt_rank(void)
{
    int r = -1, init = 0;
    MPI_Initialized(&init);
    if (init)
        MPI_Comm_rank(MPI_COMM_WORLD, &r);
    return r;
}

#define MT_FAIL(...)                                                                               \
    do {                                                                                           \
        fprintf(stderr, "[rank %d] %s:%d: FAILED: ", mt_rank(), __FILE__, __LINE__);               \
        fprintf(stderr, __VA_ARGS__);                                                              \
        fputc('\n', stderr);                                                                       \
        fflush(stderr);                                                                            \
        MPI_Abort(MPI_COMM_WORLD, 1);                                                              \
        exit(1);                                                                                   \
    } while (0)

#define MT_ASSERT(cond, ...)                                                                       \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "[rank %d] assertion `%s` ", mt_rank(), #cond);                        \
            MT_FAIL(__VA_ARGS__);                                                                  \
        }                                                                                          \
    } while (0)

/* Asserts that a tide call succeeded, printing its status and detail otherwise. */
#define MT_OK(expr)                                                                                \
    do {                                                                                           \
        tide_status mt__rc = (expr);                                                               \
        if (mt__rc != TIDE_OK)                                                                     \
            MT_FAIL("%s returned %s: %s", #expr, tide_strerror(mt__rc), tide_last_error());        \
    } while (0)

/* Prints "name: passed" once (rank 0) after a barrier. */
static inline void mt_pass(const char *name)
{
    MPI_Barrier(MPI_COMM_WORLD);
    if (mt_rank() == 0) {
        printf("%s: passed\n", name);
        fflush(stdout);
    }
}

#endif /* TIDE_TESTS_MPI_TEST_H */
