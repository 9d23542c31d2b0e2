/*
 * The fixture of the collectives conformance suite, one program (test_collectives_conformance;
 * test_collectives_conformance_nccl on a GPU) in four sources: test_collectives_conformance.c
 * (main(), lookup, communicators, collectives, p2p, abort, watch words), test_conf_direct.c
 * (single copy), test_conf_executor.c (the executor's plans) and test_conf_exec_wrapped.c
 * (the executor over wrapped backends). Here: the state main() sets once (defined in
 * test_collectives_conformance.c), the deterministic generator, device memory and
 * communicator helpers, an abort from another thread, the single-copy helpers that the
 * direct tests and the executor's single-copy run share, and the cases of the other files.
 * The cases run in the order of the calls in main(), the suite's one list. Header-only,
 * like ctl_fixture.h.
 */
#ifndef TIDE_TESTS_CONF_FIXTURE_H
#define TIDE_TESTS_CONF_FIXTURE_H

#include <mpi.h>
#include <stdint.h>
#include <stdlib.h>

#include "collectives/collectives.h"
#include "core/clock.h"
#include "mpi_test.h"

/* Set once by main() (test_collectives_conformance.c) before the first case. */
extern const tide_coll_backend_v1 *be;
extern tide_coll_pool_t *pool;
extern int me, np;
extern uint64_t seed;
extern int next_tag; /* creation tags; advanced identically on every rank */

/* Deterministic generator: every rank draws the same numbers from the same state. */
static inline uint64_t rng_next(uint64_t *s)
{
    uint64_t x = *s;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return *s = x;
}

static inline uint64_t rng_below(uint64_t *s, uint64_t n)
{
    return n ? rng_next(s) % n : 0;
}

static inline void *dalloc(size_t bytes)
{
    void *p = NULL;
    MT_OK(be->mem_alloc(bytes, &p));
    return p;
}

static inline void put(void *dev, const void *host, size_t bytes)
{
    MT_OK(be->copy_host(dev, host, bytes, 0, NULL));
}

static inline void get(void *host, const void *dev, size_t bytes)
{
    MT_OK(be->copy_host(host, dev, bytes, 1, NULL));
}

static inline tide_coll_comm_t *make_comm(const int *members, int n)
{
    tide_coll_comm_params p = {
        .members = members, .n_members = n, .tag = next_tag++, .timeout_ms = 20000};
    tide_coll_comm_t *c = NULL;
    MT_OK(tide_coll_comm_new(&c, be, pool, &p));
    return c;
}

static inline tide_coll_comm_t *world_comm(void)
{
    int *m = malloc(sizeof(int) * (size_t)np);
    for (int i = 0; i < np; i++)
        m[i] = i;
    tide_coll_comm_t *c = make_comm(m, np);
    free(m);
    return c;
}

struct aborter {
    tide_coll_comm_t *c;
    uint64_t delay_ms, at_ns;
};

static inline void *abort_later(void *arg)
{
    struct aborter *a = arg;
    tide_sleep_ms(a->delay_ms);
    a->at_ns = tide_now_ns();
    tide_coll_comm_abort(a->c); /* from another thread, as the heartbeat thread does */
    return NULL;
}

/* 1 when the backend agreed on single copy with comm rank peer at creation. */
static inline int direct_to(const tide_coll_comm_t *c, int peer)
{
    return be->p2p_direct != NULL && be->p2p_direct(c, peer);
}

/* Sets (value != NULL) or clears a single-copy setting on every rank; the backend reads
   them at each communicator creation. */
static inline void cma_env(const char *name, const char *value)
{
    if (value)
        setenv(name, value, 1);
    else
        unsetenv(name);
}

/* The agreement is symmetric, and absent where it must be. Returns 1 when this rank
   agreed on single copy with at least one peer. */
static inline int check_agreement(tide_coll_comm_t *c, int must_be_off)
{
    int view[64] = {0}, all[64 * 64] = {0}, any = 0;
    for (int r = 0; r < np; r++)
        view[r] = direct_to(c, r);
    MPI_Allgather(view, 64, MPI_INT, all, 64, MPI_INT, MPI_COMM_WORLD);
    for (int a = 0; a < np; a++)
        for (int b = 0; b < np; b++) {
            MT_ASSERT(all[a * 64 + b] == all[b * 64 + a], "single copy %d<->%d not symmetric", a,
                      b);
            if (a == b || must_be_off)
                MT_ASSERT(all[a * 64 + b] == 0, "single copy %d->%d where it must be off", a, b);
            any |= all[a * 64 + b];
        }
    return any;
}

/* The cases of the other files, in the order main() runs them. */
void test_p2p_direct(void);            /* test_conf_direct.c */
void test_direct_errors(void);         /* test_conf_direct.c */
void test_executor_random(void);       /* test_conf_executor.c */
void test_executor_errors(void);       /* test_conf_executor.c */
void test_executor_abort_first(void);  /* test_conf_exec_wrapped.c */
void test_executor_shrink_spill(void); /* test_conf_exec_wrapped.c */
void test_executor_shrink_rows(void);  /* test_conf_exec_wrapped.c */
#ifdef TIDE_TEST_HAVE_RESHARD
void test_executor_reshard(void); /* test_conf_executor.c */
#endif
void test_executor_direct(void); /* test_conf_executor.c */

#endif /* TIDE_TESTS_CONF_FIXTURE_H */
