/*
 * worker/job: tide_join, the runtime joining a job. The program's request is checked, sent
 * to tided, and the job's first layout awaited: tided answers the ranks it placed, and the
 * lowest of them shares the layout with the rest of the pool over MPI, so that every rank
 * learns whether it is a member. A pool launched later for a running job becomes job ranks
 * from the base tided gives it. The first layout's groups are then built among its
 * members, watching its generation's abort word: a member that dies meanwhile ends the
 * build (tided's recovery), and the rank switches at its first step boundary.
 *
 * Workload: once per rank; a few MPI collectives over the pool and one round trip to tided.
 */
#include <limits.h>
#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "core/clock.h"
#include "core/error.h"
#include "core/log.h"
#include "proto/proto_reshard.h"
#include "worker/tide_int.h"

#define SUBSYS "worker"

/* Every rank learns whether all succeeded; a failing rank keeps its detail. */
static tide_status agree_rc(MPI_Comm comm, tide_status rc, const char *what)
{
    int mine = (int)rc, worst = 0;
    if (MPI_Allreduce(&mine, &worst, 1, MPI_INT, MPI_MIN, comm) != MPI_SUCCESS)
        return tide_errorf(TIDE_ERR_BACKEND, "MPI_Allreduce failed while %s", what);
    if (rc != TIDE_OK)
        return rc;
    if (worst != 0)
        return tide_errorf((tide_status)worst, "another rank failed while %s (see its log)", what);
    return TIDE_OK;
}

static int job_name_ok(const char *s)
{
    size_t n = s ? strlen(s) : 0;
    if (n == 0 || n > TIDE_PROTO_NAME_MAX)
        return 0;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '_' || c == ':' || c == '-'))
            return 0;
    }
    return 1;
}

/* The job's elastic declaration (tide_options), checked for what the wire can carry;
   whether a layout of the job meets the bounds is tided's check (tidectl bounds makes the
   same), so that both refuse alike. */
static tide_status decl_ok(const char *job, const tide_options *o)
{
    const int gpus_max = 1 << 20;
    if (o->min_gpus < 0 || o->min_gpus > gpus_max || o->max_gpus < 0 || o->max_gpus > gpus_max)
        return tide_errorf(TIDE_ERR_INVALID,
                           "job %s: bounds %d-%d GPUs (TIDE_MIN_GPUS, TIDE_MAX_GPUS): each must "
                           "be in 1..%d",
                           job, o->min_gpus, o->max_gpus, gpus_max);
    if ((o->min_gpus == 0) != (o->max_gpus == 0))
        return tide_errorf(TIDE_ERR_INVALID,
                           "job %s: bounds need both a minimum and a maximum (min_gpus %d, "
                           "max_gpus %d: TIDE_MIN_GPUS, TIDE_MAX_GPUS)",
                           job, o->min_gpus, o->max_gpus);
    if (o->priority < 0 || o->priority > 100)
        return tide_errorf(TIDE_ERR_INVALID,
                           "job %s: priority %d (TIDE_PRIORITY) is outside 0..100", job,
                           o->priority);
    return TIDE_OK;
}

static tide_status send_join(tide_t *t, const tide_join_req *req)
{
    tide_proto_tensor_t *ts = NULL;
    uint32_t n = 0;
    TIDE_CHECK(tide_proto_tensors_from(req->collection, &ts, &n));
    tide_msg_t m;
    tide_msg_init(&m, TIDE_MSG_JOIN);
    tide_proto_join_t *j = &m.u.join;
    j->worker = tide__ctl_worker_id(t->ctl);
    snprintf(j->job, sizeof j->job, "%s", req->job);
    j->total_bytes = tide_collection_bytes(req->collection);
    j->num_layers = tide_collection_num_layers(req->collection);
    j->dp = req->dp;
    j->tp = req->tp;
    j->pp = req->pp;
    j->micro_batches = req->micro_batches;
    j->tensors = ts;
    j->n_tensors = n;
    /* checked by tide_join (tide_fit_check): at most TIDE_FIT_RULES_MAX, each well formed */
    tide_proto_fit_t fit[TIDE_FIT_RULES_MAX];
    _Static_assert(TIDE_PROTO_FIT_MAX == TIDE_FIT_RULES_MAX, "proto carries every fit rule");
    tide_proto_fit_from(fit, req->fit, (uint32_t)req->n_fit);
    j->fit = req->n_fit > 0 ? fit : NULL;
    j->n_fit = (uint32_t)req->n_fit;
    j->min_gpus = t->opts.min_gpus;
    j->max_gpus = t->opts.max_gpus;
    j->priority = t->opts.priority;
    if (t->rank == 0 && (j->max_gpus > 0 || j->priority > 0))
        TIDE_INFO(SUBSYS, "job %s declares bounds %d-%d GPUs, priority %d", req->job, j->min_gpus,
                  j->max_gpus, j->priority);
    tide_status rc = tide__ctl_send(t->ctl, &m);
    tide_free(ts);
    return rc;
}

/* Waits for tided's answer to the join: the first layout, ok (waiting), or an error. */
static tide_status join_answer(tide_t *t, const char *job, tide_msg_t *layout, int timeout_ms)
{
    uint64_t deadline = tide_now_ns() + (uint64_t)timeout_ms * 1000000ull;
    for (;;) {
        uint64_t now = tide_now_ns();
        if (now >= deadline)
            return tide_errorf(TIDE_ERR_TIMEOUT,
                               "tided did not answer the join of job %s within "
                               "%d ms",
                               job, timeout_ms);
        tide_msg_t m;
        tide_status rc = tide__ctl_reply(t->ctl, &m, (int)((deadline - now) / 1000000ull) + 1);
        if (rc == TIDE_ERR_TIMEOUT)
            continue;
        TIDE_CHECK(rc);
        if (m.type == TIDE_MSG_LAYOUT && strcmp(m.u.layout.job, job) == 0) {
            *layout = m;
            return TIDE_OK;
        }
        if (m.type == TIDE_MSG_OK && strcmp(m.u.ok.job, job) == 0) {
            TIDE_INFO(SUBSYS, "join: %s", m.u.ok.message);
            tide_msg_clear(&m);
            return TIDE_OK;
        }
        if (m.type == TIDE_MSG_ERROR) {
            rc = tide_errorf(m.u.error.code < 0 ? (tide_status)m.u.error.code : TIDE_ERR_PROTOCOL,
                             "tided refused the join of job %s: %s", job, m.u.error.message);
            tide_msg_clear(&m);
            return rc;
        }
        tide_msg_clear(&m);
    }
}

/* Makes this pool's ranks job ranks [base, base + size) of a job of `world` ranks: a new
   pool over the same processes, and the coordinator ids of the others unknown (-1) until
   a join connects them. Collective over the pool (every rank joins); main thread. */
static tide_status rebase(tide_t *t, int32_t base, int32_t world)
{
    int n = t->size, me = t->rank;
    if (base < 0 || world < base + n)
        return tide_errorf(TIDE_ERR_PROTOCOL,
                           "tided gives this pool of %d ranks job ranks from %d in a job of %d", n,
                           base, world);
    int *prank = tide_malloc((size_t)n * sizeof *prank);
    int32_t *ids = tide_malloc((size_t)world * sizeof *ids);
    tide_coll_pool_t *np = NULL;
    tide_status rc = TIDE_OK;
    if (prank == NULL || ids == NULL)
        TIDE_FAIL_GOTO(rc, out, TIDE_ERR_NOMEM, "out of memory renumbering the pool");
    for (int c = 0; c < n; c++)
        prank[c] = base + c;
    for (int32_t r = 0; r < world; r++)
        ids[r] = r >= base && r < base + n ? t->coord_ids[r - base] : -1;
    TIDE_CHECK_GOTO(tide_coll_pool_new_ranked(&np, tide_coll_pool_comm(t->pool), prank, world), rc,
                    out);
    tide_coll_pool_destroy(&t->pool);
    t->pool = np;
    tide_free(t->coord_ids);
    t->coord_ids = ids;
    ids = NULL;
    t->rank = base + me;
    t->size = world;
    TIDE_INFO(SUBSYS, "pool rank %d is job rank %d of %d (this pool joined a running job)", me,
              t->rank, world);
out:
    tide_free(prank);
    tide_free(ids);
    return rc;
}

/* The agreement of a job joined with start_step steps completed. */
static void start_state(tide_t *t, void *ctx)
{
    tide__agree_init(&t->agree, *(const int64_t *)ctx);
}

/* The program's request, checked before tided hears of it. */
static tide_status join_req_ok(const tide_join_req *req)
{
    if (!job_name_ok(req->job))
        return tide_errorf(TIDE_ERR_INVALID, "job name '%s' must be 1..%d chars of [A-Za-z0-9._:-]",
                           req->job ? req->job : "(null)", TIDE_PROTO_NAME_MAX);
    if (req->dp < 1 || req->tp < 1 || req->pp < 1 || req->micro_batches < 1 || req->start_step < 0)
        return tide_errorf(TIDE_ERR_INVALID,
                           "job %s: dp, tp, pp and micro-batches must be >= 1 and "
                           "start_step >= 0",
                           req->job);
    if (req->n_fit < 0)
        return tide_errorf(TIDE_ERR_INVALID, "job %s: n_fit is %d (must be >= 0)", req->job,
                           req->n_fit);
    if (tide_fit_check(req->fit, (size_t)req->n_fit, req->dp, req->tp, req->pp,
                       req->micro_batches) != TIDE_OK)
        /* the program's own first layout: said here, before tided starts a job that would
           refuse it */
        return tide_errorf(TIDE_ERR_INVALID,
                           "job %s: the first layout (dp %d, tp %d, pp %d) is not one the "
                           "program can run by its own fit rules: %s",
                           req->job, req->dp, req->tp, req->pp, tide_last_error());
    return TIDE_OK;
}

/* Ranks tided placed get the first layout; the others get nothing. Every rank waits until
   one has it (or the join timeout): *root is the lowest rank holding it. Collective over
   the pool. */
static tide_status first_holder(tide_t *t, const char *job, tide_msg_t *first, int *root)
{
    uint64_t deadline = tide_now_ns() + (uint64_t)t->opts.join_timeout_ms * 1000000ull;
    for (;;) {
        if (first->type == TIDE_MSG_NONE) {
            tide_msg_t m;
            if (tide__ctl_reply(t->ctl, &m, 50) == TIDE_OK) {
                if (m.type == TIDE_MSG_LAYOUT && strcmp(m.u.layout.job, job) == 0)
                    *first = m;
                else
                    tide_msg_clear(&m);
            }
        }
        int in[2] = {first->type == TIDE_MSG_LAYOUT ? t->rank : INT_MAX,
                     tide_now_ns() >= deadline ? 0 : 1};
        int res[2];
        if (MPI_Allreduce(in, res, 2, MPI_INT, MPI_MIN, t->end_comm) != MPI_SUCCESS)
            return tide_errorf(TIDE_ERR_BACKEND, "MPI_Allreduce failed while joining");
        *root = res[0];
        if (*root != INT_MAX)
            return TIDE_OK;
        if (res[1] == 0)
            return tide_errorf(TIDE_ERR_TIMEOUT,
                               "job %s got no first layout within %d ms (tided waits until "
                               "dp*tp*pp ranks have joined; see tidectl events)",
                               job, t->opts.join_timeout_ms);
    }
}

/* The lowest rank holding the first layout shares it over MPI, so that every rank learns
   whether it is a member: *first (replaced) is the same message on every rank.
   Collective over the pool. */
static tide_status share_first(tide_t *t, const char *job, tide_msg_t *first)
{
    int root = INT_MAX;
    TIDE_CHECK(first_holder(t, job, first, &root));
    tide_proto_buf_t b;
    tide_proto_buf_init(&b);
    unsigned long long len = 0;
    tide_status rc = TIDE_OK;
    if (t->rank == root) {
        rc = tide_proto_encode(first, &b);
        len = rc == TIDE_OK ? b.len : 0;
    }
    MPI_Bcast(&len, 1, MPI_UNSIGNED_LONG_LONG, root, t->end_comm);
    if (len == 0) {
        tide_proto_buf_destroy(&b);
        return tide_errorf(TIDE_ERR_INTERNAL, "rank %d could not share the first layout", root);
    }
    if (t->rank != root) {
        b.data = tide_malloc(len);
        b.len = b.cap = b.data ? len : 0;
    }
    int have = b.data != NULL, all_have = 0;
    MPI_Allreduce(&have, &all_have, 1, MPI_INT, MPI_MIN, t->end_comm);
    if (!all_have) {
        tide_proto_buf_destroy(&b);
        return tide_errorf(TIDE_ERR_NOMEM, "out of memory receiving the first layout");
    }
    MPI_Bcast(b.data, (int)len, MPI_BYTE, root, t->end_comm);
    tide_msg_clear(first);
    rc = tide_proto_decode(b.data, len, first);
    tide_proto_buf_destroy(&b);
    return rc;
}

/* The first layout's agreement state: the generation runs; from here a recovery (or halt)
   ends the groups' build (the control thread sets the generation's word). */
static void first_state(tide_t *t, void *ctx)
{
    uint64_t gen = *(const uint64_t *)ctx;
    tide__agree_first(&t->agree, gen, t->view.member);
    t->agree.building = t->view.member;
}

/* The job's first layout l (taken) becomes the runtime's: view, agreement, abort word,
   buffer table, memory pool; the preparation hears of it. */
static tide_status adopt_first(tide_t *t, const tide_join_req *req, tide_layout_t *l, uint64_t gen)
{
    t->coll = req->collection;
    t->n_tensors = tide_collection_size(req->collection);
    snprintf(t->job, sizeof t->job, "%s", req->job);
    t->layout = l;
    tide__fill_view(&t->view, gen, l, t->rank, req->start_step);
    t->run_word = tide__gens_get(t->gens, gen);
    if (t->run_word == NULL)
        return tide_errorf(TIDE_ERR_NOMEM, "out of memory for the generation's abort word");
    tide__agree_change(t, first_state, &gen);
    t->bufs = tide_calloc(t->n_tensors ? t->n_tensors : 1, sizeof *t->bufs);
    t->moved = tide_calloc(t->n_tensors ? t->n_tensors : 1, 1);
    if (t->bufs == NULL || t->moved == NULL)
        return tide_errorf(TIDE_ERR_NOMEM, "out of memory for the buffer table");
    if (t->mem == NULL)
        TIDE_CHECK(tide_mem_pool_new(&t->mem, t->be, t->device));
    tide__rebase(t);
    return TIDE_OK;
}

static void built(tide_t *t, void *ctx)
{
    int dead = *(const int *)ctx;
    t->agree.building = 0;
    if (dead)
        t->agree.groups_dead = 1;
}

/* The first layout's communicators, among its members only. A build the control thread
   ended (a member died: tided recovers the job, or halted it) is not a failure: the rank
   joined, runs no step on the missing groups, and its first tide_step_begin switches to
   the recovery (or reports the halt). */
static tide_status build_first(tide_t *t, uint64_t gen)
{
    if (!t->view.member)
        return TIDE_OK;
    tide_coll_comm_t *g[4];
    tide__group_ctx gc = {t->be, t->pool, (uint32_t)t->opts.switch_timeout_ms,
                          tide__gen_word(t->run_word)};
    tide_status rc = tide__build_groups(&gc, t->layout, &t->view, NULL, 0, g);
    int abandoned = rc == TIDE_ERR_ABORTED && tide__gen_aborted(t->run_word);
    tide__agree_change(t, built, &abandoned);
    if (rc == TIDE_OK) {
        t->c_all = g[0];
        t->c_tp = g[1];
        t->c_dp = g[2];
        t->c_pp = g[3];
    }
    if (!abandoned)
        return rc;
    TIDE_WARN(SUBSYS,
              "rank %d: generation %llu's communicators were abandoned while being built (%s); "
              "the job's next generation replaces them",
              t->rank, (unsigned long long)gen, tide_last_error());
    tide_error_clear();
    return TIDE_OK;
}

tide_status tide_join(tide_t *t, const tide_join_req *req)
{
    if (t == NULL || req == NULL || req->collection == NULL)
        return tide_errorf(TIDE_ERR_INVALID, "tide_join: runtime, request and collection needed");
    if (t->job[0] != '\0')
        return tide_errorf(TIDE_ERR_EXISTS, "this rank already runs job %s", t->job);
    tide_msg_t first;
    tide_msg_init(&first, TIDE_MSG_NONE);
    tide_status rc = join_req_ok(req);
    if (rc == TIDE_OK)
        rc = decl_ok(req->job, &t->opts);
    if (rc == TIDE_OK) {
        tide__ctl_set_job(t->ctl, req->job);
        tide__agree_change(t, start_state, (void *)&req->start_step);
        tide_msg_t stale;
        while (tide__ctl_reply(t->ctl, &stale, 0) == TIDE_OK)
            tide_msg_clear(&stale);
        rc = send_join(t, req);
    }
    if (rc == TIDE_OK)
        rc = join_answer(t, req->job, &first, t->opts.register_timeout_ms);
    TIDE_CHECK_GOTO(agree_rc(t->end_comm, rc, "joining the job"), rc, out);
    TIDE_CHECK_GOTO(share_first(t, req->job, &first), rc, out);
    /* a pool launched later for a running job: its ranks are job ranks from base on */
    const tide_proto_layout_msg_t *fl = &first.u.layout;
    if (fl->base != 0 || fl->world != t->size)
        TIDE_CHECK_GOTO(rebase(t, fl->base, fl->world), rc, out);
    tide_layout_t *l = NULL;
    TIDE_CHECK_GOTO(tide__layout_from_proto(&fl->layout, &l), rc, out);
    rc = tide_layout_validate(l, req->collection);
    if (rc != TIDE_OK) {
        tide_layout_destroy(&l);
        TIDE_FAIL_GOTO(rc, out, rc, "tided's first layout does not fit the collection: %s",
                       tide_last_error());
    }
    uint64_t gen = fl->layout.gen;
    TIDE_CHECK_GOTO(adopt_first(t, req, l, gen), rc, out);
    TIDE_CHECK_GOTO(build_first(t, gen), rc, out);
    t->view.all = t->c_all;
    t->view.tp = t->c_tp;
    t->view.dp = t->c_dp;
    t->view.pp = t->c_pp;
    char desc[160];
    TIDE_INFO(SUBSYS, "job %s generation %llu: %s; rank %d %s", t->job, (unsigned long long)gen,
              tide_layout_format(l, desc, sizeof desc), t->rank,
              t->view.member ? "is a member" : "waits idle");
out:
    tide_msg_clear(&first);
    return rc;
}
