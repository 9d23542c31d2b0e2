/*
 * worker/leave: a generation that releases whole pools (launches) of a job, the
 * counterpart of join.c. The processes of the job's connected launches share one
 * communicator (the pool's, merged when a launch joined); when a committed layout holds
 * none of a launch's ranks, tided lists at that generation the live ranks that stay and
 * those that leave. At the switch each side makes a pool of its own processes out of the
 * shared one (tide_coll_pool_subset: collective over that side only) and, at the commit,
 * drops the shared one, so that the stay side holds no communicator naming a process of
 * a launch that leaves, and that launch's mpirun can exit without disturbing the job.
 *
 * Workload: once per release; a rendezvous and an MPI_Comm_create_group, milliseconds.
 */
#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "core/log.h"
#include "worker/tide_int.h"

#define SUBSYS "worker"

static int holds(const int32_t *a, uint32_t n, int32_t r)
{
    for (uint32_t i = 0; i < n; i++)
        if (a[i] == r)
            return 1;
    return 0;
}

tide_status tide__leave_split(tide_t *t, const tide__leave_req *lr, const int *cancel,
                              tide__join_result *out)
{
    memset(out, 0, sizeof *out);
    out->end_comm = MPI_COMM_NULL;
    int leaving = holds(lr->leave, lr->n_leave, t->rank);
    if (leaving == holds(lr->stay, lr->n_stay, t->rank))
        return tide_errorf(TIDE_ERR_PROTOCOL,
                           "generation %llu's release lists job rank %d on %s side",
                           (unsigned long long)lr->gen, t->rank, leaving ? "either" : "neither");
    const int32_t *side = leaving ? lr->leave : lr->stay;
    uint32_t n = leaving ? lr->n_leave : lr->n_stay;
    int *members = tide_malloc((size_t)n * sizeof *members);
    int32_t *ids = tide_malloc((size_t)t->size * sizeof *ids);
    tide_coll_pool_t *sub = NULL;
    MPI_Comm end = MPI_COMM_NULL;
    tide_status rc = TIDE_OK;
    if (members == NULL || ids == NULL)
        TIDE_FAIL_GOTO(rc, fail, TIDE_ERR_NOMEM, "out of memory for generation %llu's release",
                       (unsigned long long)lr->gen);
    for (uint32_t i = 0; i < n; i++)
        members[i] = side[i];
    /* an abort of the switch (the generation's word) ends the rendezvous too */
    TIDE_CHECK_GOTO(tide_coll_pool_subset(&sub, t->pool, members, (int)n, tide__gen_tag(lr->gen, 7),
                                          (uint32_t)t->opts.switch_timeout_ms, cancel),
                    rc, fail);
    /* job-end messages (tide_finish) travel among this side only from now on */
    if (MPI_Comm_dup(tide_coll_pool_comm(sub), &end) != MPI_SUCCESS)
        TIDE_FAIL_GOTO(rc, fail, TIDE_ERR_BACKEND,
                       "MPI_Comm_dup of the %u processes that %s failed", n,
                       leaving ? "leave" : "stay");
    MPI_Comm_set_errhandler(end, MPI_ERRORS_RETURN);
    for (int32_t r = 0; r < t->size; r++)
        ids[r] = holds(side, n, r) ? t->coord_ids[r] : -1;
    TIDE_INFO(SUBSYS, "job rank %d: generation %llu %s: a pool of the %u ranks that %s", t->rank,
              (unsigned long long)lr->gen,
              leaving ? "releases this rank's launch" : "releases other launches", n,
              leaving ? "leave" : "stay");
    tide_free(members);
    out->pool = sub;
    out->end_comm = end;
    out->ids = ids;
    return TIDE_OK;
fail:
    tide_coll_pool_destroy(&sub);
    tide_free(members);
    tide_free(ids);
    return rc;
}
