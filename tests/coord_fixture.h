/*
 * The fixture of the coordinator's in-process unit tests (test_coordinator.c,
 * test_coord_state.c, test_coord_store.c, one executable: test_coordinator):
 * the fit rules of a job whose program splits a global batch of 16, and a state file in
 * /tmp: its path, a reload of one job from it, its removal with SQLite's side files.
 * Header-only, like ctl_fixture.h: Criterion runs each test in its own process. Test
 * thread only.
 */
#ifndef TIDE_TESTS_COORD_FIXTURE_H
#define TIDE_TESTS_COORD_FIXTURE_H

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "coordinator/policy.h"
#include "coordinator/state.h"
#include "coordinator/store.h"

/* The rules of a job whose program splits a global batch of 16 in 4 micro-batches per dp
   rank (dp must divide 4) and 8 heads over tp. */
static const tide_fit_rule batch16[] = {
    {TIDE_DEGREE_DP, 4, "the global batch 16 / 4 micro-batches"},
    {TIDE_DEGREE_TP, 8, "the attention heads"},
};

/* Closes s and st, opens and loads the state file at path into them again and returns its
   job `name`. */
static inline tide_coord_job_t *reload_job(tide_store_t **s, tide_coord_state_t **st,
                                           const char *path, const char *name)
{
    tide_store_close(s);
    tide_coord_state_destroy(st);
    cr_assert_eq(tide_store_open(s, path, 0), TIDE_OK, "%s", tide_last_error());
    cr_assert_eq(tide_coord_state_new(st), TIDE_OK);
    cr_assert_eq(tide_store_load(*s, *st), TIDE_OK, "%s", tide_last_error());
    tide_coord_job_t *j = tide_coord_job_by_name(*st, name);
    cr_assert_not_null(j);
    return j;
}

static inline void tmp_path(char *buf, size_t len)
{
    snprintf(buf, len, "/tmp/tide-store-XXXXXX");
    int fd = mkstemp(buf);
    close(fd);
    unlink(buf);
}

static inline void rm_db(const char *p)
{
    char b[300];
    unlink(p);
    snprintf(b, sizeof b, "%s-wal", p);
    unlink(b);
    snprintf(b, sizeof b, "%s-shm", p);
    unlink(b);
    snprintf(b, sizeof b, "%s.seq", p);
    unlink(b);
}

#endif /* TIDE_TESTS_COORD_FIXTURE_H */
