/*
 * worker/tide: the public libtide API (include/tide/tide.h) on the training thread:
 * joining the pool and a job, step boundaries, the layout switch (plan, executor,
 * communicators of the new layout, done report), idle waiting with offline plugin
 * work, and releasing idle ranks at the end of the job. The background half (socket,
 * heartbeats, commands) is ctl.c.
 *
 * Workload: one tide_t per rank; tide_step_begin/end once per training step (a mutex
 * and a few comparisons); a switch per resize moves up to GiBs through the executor.
 */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "collectives/executor.h"
#include "core/alloc.h"
#include "core/clock.h"
#include "core/error.h"
#include "core/log.h"
#include "worker/tide_int.h"

#define SUBSYS  "worker"
#define TAG_END 7101 /* pool message: the job ended (tide_finish) */

/* ---- options ----------------------------------------------------------------------------- */

static const char *env_str(const char *name, const char *def)
{
    const char *v = getenv(name);
    return v != NULL && v[0] != '\0' ? v : def;
}

static long long env_int(const char *name, long long def)
{
    const char *v = getenv(name);
    if (v == NULL || v[0] == '\0')
        return def;
    char *end = NULL;
    long long x = strtoll(v, &end, 10);
    if (end == v || *end != '\0') {
        TIDE_WARN(SUBSYS, "ignoring %s=%s: not an integer", name, v);
        return def;
    }
    return x;
}

void tide_options_init(tide_options *o)
{
    memset(o, 0, sizeof *o);
    o->endpoint = env_str("TIDE_ENDPOINT", "tcp://127.0.0.1:5555");
    o->key_file = env_str("TIDE_KEY", NULL);
    o->server_key = env_str("TIDE_SERVER_KEY", NULL);
    o->pool = env_str("TIDE_POOL", NULL);
    o->backend = env_str("TIDE_BACKEND", "mpi");
    o->device = (int)env_int("TIDE_DEVICE", -1);
    o->mem_bytes = (uint64_t)env_int("TIDE_MEM_BYTES", 0);
    o->register_timeout_ms = (int)env_int("TIDE_REGISTER_TIMEOUT_MS", 10000);
    o->join_timeout_ms = (int)env_int("TIDE_JOIN_TIMEOUT_MS", 120000);
    o->switch_timeout_ms = (int)env_int("TIDE_SWITCH_TIMEOUT_MS", 120000);
    o->staging_cap = (uint64_t)env_int("TIDE_STAGING_CAP", 0);
    o->mem_strict = env_int("TIDE_MEM_STRICT", 0) != 0;
    o->heartbeat_aggregate = env_int("TIDE_HEARTBEAT_AGGREGATE", 1) != 0;
}

/* ---- communicators and aborts ------------------------------------------------------------ */

/* Runs on the background thread with ctl's lock held: only flags are set. which 0: the
   step's communicators; 1 the switch's (and the first layout's while tide_join builds
   them: they are published in the same slots) and what is built ahead; 2 only what is
   built ahead (its generation was aborted or replaced). */
static void abort_cb(void *ctx, int which)
{
    tide_t *t = ctx;
    if (which != 0) /* a build ahead of the switch step ends (2: only that) */
        tide__prebuilt_cancel_locked(t);
    if (which == 2)
        return;
    if (which != 0) /* a communicator of the switch still being made ends too */
        __atomic_store_n(&t->switch_cancel, 1, __ATOMIC_RELAXED);
    tide_coll_comm_t *const step_set[] = {t->c_all, t->c_tp, t->c_dp, t->c_pp};
    tide_coll_comm_t *const switch_set[] = {t->c_switch, t->n_all, t->n_tp, t->n_dp, t->n_pp};
    if (which == 0) {
        for (size_t i = 0; i < 4; i++)
            if (step_set[i] != NULL)
                tide_coll_comm_abort(step_set[i]);
    } else {
        for (size_t i = 0; i < 5; i++)
            if (switch_set[i] != NULL)
                tide_coll_comm_abort(switch_set[i]);
    }
}

/* ---- pool ---------------------------------------------------------------------------------- */

/* This rank's index among the ranks of its host (node: their communicator) and how many
   those are; 0 and 1 without one. */
static void local_ranks(MPI_Comm node, int *index, int *count)
{
    *index = 0;
    *count = 1;
    if (node == MPI_COMM_NULL)
        return;
    MPI_Comm_rank(node, index);
    MPI_Comm_size(node, count);
}

/* The memory a worker reports (tidectl status): TIDE_MEM_BYTES when set; else its
   device's (a GPU backend); else its share of the host's RAM, which the ranks on the host
   divide (host-memory mode: each rank's "device" is its part of the RAM, not all of it). */
static uint64_t worker_mem(const tide_t *t, const tide_options *opts, int local_count)
{
    if (opts->mem_bytes > 0)
        return opts->mem_bytes;
    uint64_t bytes = 0;
    if (t->be != NULL && t->be->mem_total != NULL && t->be->mem_total(t->device, &bytes) == TIDE_OK)
        return bytes;
    tide_error_clear();
    long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
    bytes = pages > 0 && psz > 0 ? (uint64_t)pages * (uint64_t)psz : 0;
    return bytes / (uint64_t)(local_count > 0 ? local_count : 1);
}

/* On ctl's preparation thread, runtime-owned: the kernel reads this rank's current shards
   once (tide_mem_pool_warm), so that the switch's single copies out of them run at memory
   speed. Shards received in an earlier switch were only populated (tide_mem_pool_reserve);
   already warm memory costs one memcpy. The buffers do not change while it runs. */
static void warm_state(tide_t *t)
{
    const tide_view *cur = &t->view;
    if (!cur->member || t->bufs == NULL)
        return;
    for (size_t i = 0; i < t->n_tensors; i++)
        if (t->bufs[i] != NULL)
            tide_mem_pool_warm(t->mem, t->bufs[i],
                               (size_t)tide_shard_bytes(t->layout, t->coll, i, cur->pp_rank,
                                                        cur->dp_rank, cur->tp_rank));
}

static void prep_run(void *ctx, uint64_t gen, const tide_proto_layout_msg_t *pl);

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

tide_status tide_new(tide_t **out, const tide_options *opts, MPI_Comm world)
{
    if (out == NULL || opts == NULL)
        return tide_errorf(TIDE_ERR_INVALID, "tide_new: out and opts are required");
    *out = NULL;
    tide_status rc = TIDE_OK;
    tide_t *t = tide_calloc(1, sizeof *t);
    if (t == NULL)
        return tide_errorf(TIDE_ERR_NOMEM, "out of memory creating the tide runtime");
    t->opts = *opts;
    t->end_comm = MPI_COMM_NULL;
    t->save_step = -1;
    pthread_mutex_init(&t->prep_mu, NULL);
    pthread_cond_init(&t->prep_cv, NULL);
    TIDE_CHECK_GOTO(tide_coll_pool_new(&t->pool, world), rc, fail);
    t->rank = tide_coll_pool_rank(t->pool);
    t->size = tide_coll_pool_size(t->pool);
    if (MPI_Comm_dup(world, &t->end_comm) != MPI_SUCCESS)
        TIDE_FAIL_GOTO(rc, fail, TIDE_ERR_BACKEND, "MPI_Comm_dup failed");
    MPI_Comm_set_errhandler(t->end_comm, MPI_ERRORS_RETURN);
    rc = tide_coll_backend_find(opts->backend ? opts->backend : "mpi", &t->be);
    /* the ranks of this host: a device index each, a share of the host's RAM, and one
       heartbeat message together */
    MPI_Comm node = MPI_COMM_NULL;
    if (MPI_Comm_split_type(world, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node) != MPI_SUCCESS)
        node = MPI_COMM_NULL;
    int local = 0, n_local = 1;
    local_ranks(node, &local, &n_local);
    int dev = opts->device >= 0 ? opts->device : local;
    t->device = dev;
    /* libtide owns the device: this thread first, then every thread it starts */
    if (rc == TIDE_OK)
        rc = tide_coll_device_bind(t->be, dev);
    char pool[TIDE_PROTO_NAME_MAX + 1] = "";
    if (opts->pool != NULL && opts->pool[0] != '\0') {
        snprintf(pool, sizeof pool, "%s", opts->pool);
    } else if (t->rank == 0) {
        char host[64] = "host";
        gethostname(host, sizeof host);
        host[sizeof host - 1] = '\0';
        for (char *c = host; *c; c++)
            if (!((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') ||
                  (*c >= '0' && *c <= '9') || *c == '.' || *c == '-'))
                *c = '-';
        snprintf(pool, sizeof pool, "%s-%d-%lld", host, (int)getpid(),
                 (long long)(tide_wall_ms() % 100000000));
    }
    MPI_Bcast(pool, sizeof pool, MPI_CHAR, 0, t->end_comm);
    pool[sizeof pool - 1] = '\0';

    tide__ctl_config cc;
    memset(&cc, 0, sizeof cc);
    cc.endpoint = opts->endpoint;
    cc.key_file = opts->key_file;
    cc.server_key = opts->server_key;
    cc.register_timeout_ms = opts->register_timeout_ms;
    snprintf(cc.reg.pool, sizeof cc.reg.pool, "%s", pool);
    cc.reg.rank = t->rank;
    cc.reg.size = t->size;
    if (gethostname(cc.reg.host, sizeof cc.reg.host) != 0 || cc.reg.host[0] == '\0')
        snprintf(cc.reg.host, sizeof cc.reg.host, "localhost");
    cc.reg.host[sizeof cc.reg.host - 1] = '\0';
    cc.reg.device = dev > TIDE_PROTO_DEVICE_MAX ? TIDE_PROTO_DEVICE_MAX : dev;
    cc.reg.kind = (t->be && t->be->mem_kind == TIDE_MEM_DEVICE) ? TIDE_DEVICE_GPU : TIDE_DEVICE_CPU;
    cc.reg.mem_bytes = worker_mem(t, opts, n_local);
    cc.reg.pid = (int)getpid();
    if (node != MPI_COMM_NULL) {
        tide_status hrc = tide__hostbeat_open(node, opts->heartbeat_aggregate, &t->host);
        MPI_Comm_free(&node);
        if (rc == TIDE_OK)
            rc = hrc;
    }
    cc.host = t->host;
    if (rc == TIDE_OK)
        rc = tide__ctl_new(&t->ctl, &cc);
    TIDE_CHECK_GOTO(agree_rc(t->end_comm, rc, "registering with tided"), rc, fail);
    t->coord_ids = tide_calloc((size_t)t->size, sizeof *t->coord_ids);
    TIDE_CHECK_ALLOC_GOTO(t->coord_ids, rc, fail);
    int32_t me = tide__ctl_worker_id(t->ctl);
    if (MPI_Allgather(&me, 1, MPI_INT32_T, t->coord_ids, 1, MPI_INT32_T, t->end_comm) !=
        MPI_SUCCESS)
        TIDE_FAIL_GOTO(rc, fail, TIDE_ERR_BACKEND, "MPI_Allgather of worker ids failed");
    /* communicators are built ahead of a switch on the preparation thread only when every
       rank can (MPI_THREAD_MULTIPLE): all participants must build them, or none. A pool
       that joins later runs MPI_THREAD_MULTIPLE too (join.c needs it). */
    int level = MPI_THREAD_SINGLE, multi = 0;
    MPI_Query_thread(&level);
    multi = level >= MPI_THREAD_MULTIPLE;
    if (MPI_Allreduce(MPI_IN_PLACE, &multi, 1, MPI_INT, MPI_MIN, t->end_comm) != MPI_SUCCESS)
        TIDE_FAIL_GOTO(rc, fail, TIDE_ERR_BACKEND, "MPI_Allreduce of thread levels failed");
    t->multi = multi;
    tide__ctl_set_abort(t->ctl, abort_cb, t);
    /* the runtime's preparation of announced layouts (prep_run): communicators on every
       participant, pool blocks and the program's tide_set_prepare function on members */
    tide__ctl_set_prepare(t->ctl, prep_run, t);
    tide__fill_view(&t->view, 0, NULL, t->rank, 0);
    TIDE_INFO(SUBSYS, "rank %d/%d registered as worker %d in pool %s (%s backend); heartbeats: %s",
              t->rank, t->size, me, pool, t->be->name,
              t->host == NULL ? "its own (TIDE_HEARTBEAT_AGGREGATE=0, or no shared memory)"
                              : "one message per host, through the lowest local rank running");
    *out = t;
    return TIDE_OK;
fail:
    tide_destroy(&t);
    return rc;
}

/* ---- preparing announced layouts (tide_set_prepare) --------------------------------------- */

/* On ctl's preparation thread, when the runtime owns the buffers: blocks for the new
   shards this rank will receive into fresh memory (those it did not hold, or that
   grow), allocated and first-touched now, while the old layout still trains, within
   the room the switch's memory bound leaves: the pool may hold max(held, new state) +
   staging cap in the switch (tide_reshard's mem_limit), so it reserves up to that over
   what it holds now (blocks in use and cached). A shard that grows while others shrink
   needs a block even when the rank's total stays the same. The layout and buffers of
   the current generation do not change while a preparation may run (the switch waits
   for it). */
static void reserve_pool(tide_t *t, const tide_view *v)
{
    if (!v->member)
        return;
    uint64_t *sizes = tide_calloc(t->n_tensors ? t->n_tensors : 1, sizeof *sizes);
    if (sizes == NULL)
        return;
    const tide_view *cur = &t->view;
    uint64_t old_total = 0, new_total = 0;
    for (size_t i = 0; i < t->n_tensors; i++) {
        uint64_t o = cur->member ? tide_shard_bytes(t->layout, t->coll, i, cur->pp_rank,
                                                    cur->dp_rank, cur->tp_rank)
                                 : 0;
        uint64_t n = tide_shard_bytes(v->layout, t->coll, i, v->pp_rank, v->dp_rank, v->tp_rank);
        old_total += o;
        new_total += n;
        if (n > o)
            sizes[i] = n;
    }
    tide_mem_pool_stats ps;
    tide_mem_pool_stats_get(t->mem, &ps);
    uint64_t cap = t->opts.staging_cap ? t->opts.staging_cap : TIDE_EXEC_DEFAULT_STAGING_CAP;
    uint64_t held = ps.in_use > old_total ? ps.in_use : old_total;
    uint64_t limit = (held > new_total ? held : new_total) + cap;
    uint64_t room = limit > ps.in_use + ps.cached ? limit - ps.in_use - ps.cached : 0;
    /* room 0 would mean no bound to the pool: nothing is reserved then */
    if (room > 0 && tide_mem_pool_reserve(t->mem, sizes, t->n_tensors, room) != TIDE_OK)
        TIDE_WARN(SUBSYS, "rank %d: could not prepare pool memory for generation %llu: %s", t->rank,
                  (unsigned long long)v->generation, tide_last_error());
    tide_free(sizes);
}

/* On ctl's preparation thread, runtime-owned, on a rank in both layouts (only such a rank
   holds old shards it may have to spill): the host spill blocks (pinned on a GPU) that the
   switch to pl's generation will take, prepared now, so that it neither allocates them
   nor frees them (tide_mem_pool_spill_release) on its critical path. The executor's own
   choice (tide_exec_plan_spills) over this rank's plan, every participant alive, with
   the memory limit the switch will set (switch.c: mem_limit). */
static void reserve_spill(tide_t *t, const tide_proto_layout_msg_t *pl, const tide_view *v)
{
    if (!v->member || !t->view.member || pl->recover || pl->n_join_new > 0 || pl->n_leave > 0 ||
        !pl->has_prev)
        return;
    size_t nw = (size_t)t->size, nt = t->n_tensors ? t->n_tensors : 1;
    tide_layout_t *prev = NULL, *nl = NULL;
    tide_plan_t *plan = NULL;
    int *parts = tide_malloc(nw * sizeof *parts), *rank_of = tide_malloc(nw * sizeof *rank_of);
    uint8_t *alive = tide_malloc(nw);
    uint64_t *ob = tide_calloc(nt, sizeof *ob), *nb = tide_calloc(nt, sizeof *nb);
    uint64_t *sizes = tide_calloc(nt, sizeof *sizes);
    const uint64_t **obr = tide_calloc(nw, sizeof *obr), **nbr = tide_calloc(nw, sizeof *nbr);
    tide_status rc = TIDE_OK;
    if (!parts || !rank_of || !alive || !ob || !nb || !sizes || !obr || !nbr)
        TIDE_FAIL_GOTO(rc, out, TIDE_ERR_NOMEM, "out of memory");
    TIDE_CHECK_GOTO(tide__layout_from_proto(&pl->prev, &prev), rc, out);
    TIDE_CHECK_GOTO(tide__layout_from_proto(&pl->layout, &nl), rc, out);
    memset(alive, 1, nw);
    int np = tide__participants(prev, nl, NULL, t->size, parts);
    if (np <= 0)
        TIDE_FAIL_GOTO(rc, out, TIDE_ERR_NOMEM, "out of memory listing the participants");
    for (size_t r = 0; r < nw; r++)
        rank_of[r] = -1;
    for (int k = 0; k < np; k++)
        rank_of[parts[k]] = k;
    const tide_view *cur = &t->view;
    uint64_t state_old = 0, state_new = 0;
    for (size_t i = 0; i < t->n_tensors; i++) {
        ob[i] = tide_shard_bytes(t->layout, t->coll, i, cur->pp_rank, cur->dp_rank, cur->tp_rank);
        nb[i] = tide_shard_bytes(nl, t->coll, i, v->pp_rank, v->dp_rank, v->tp_rank);
        state_old += ob[i];
        state_new += nb[i];
    }
    obr[t->rank] = ob;
    nbr[t->rank] = nb;
    TIDE_CHECK_GOTO(tide_reshard_plan_for(prev, nl, t->coll, alive, nw, t->rank, &plan), rc, out);
    uint64_t cap = t->opts.staging_cap ? t->opts.staging_cap : TIDE_EXEC_DEFAULT_STAGING_CAP;
    tide_mem_pool_stats ps;
    tide_mem_pool_stats_get(t->mem, &ps);
    uint64_t held = ps.in_use > state_old ? ps.in_use : state_old;
    tide_exec_in_place ip = {t->mem,
                             t->rank,
                             t->bufs,
                             ob,
                             nb,
                             NULL,
                             (held > state_new ? held : state_new) + cap,
                             t->opts.mem_strict};
    tide_exec_args ea = {plan, nw, t->n_tensors, rank_of, NULL, NULL, obr, nbr, &ip};
    tide_exec_opts eo;
    tide_exec_opts_init(&eo);
    eo.staging_cap = t->opts.staging_cap;
    eo.pool = t->mem;
    TIDE_CHECK_GOTO(tide_exec_plan_spills(t->be, np, rank_of[t->rank], &ea, &eo, sizes), rc, out);
    uint64_t total = 0;
    for (size_t i = 0; i < t->n_tensors; i++)
        total += sizes[i];
    if (total > 0) {
        TIDE_CHECK_GOTO(tide_mem_pool_spill_reserve(t->mem, sizes, t->n_tensors), rc, out);
        TIDE_INFO(SUBSYS, "rank %d: %llu bytes of host spill memory prepared for generation %llu",
                  t->rank, (unsigned long long)total, (unsigned long long)v->generation);
    }
out:
    if (rc != TIDE_OK)
        TIDE_WARN(SUBSYS,
                  "rank %d: could not prepare host spill memory for generation %llu: %s (the "
                  "switch allocates what it spills)",
                  t->rank, (unsigned long long)v->generation, tide_last_error());
    tide_plan_destroy(&plan);
    tide_layout_destroy(&prev);
    tide_layout_destroy(&nl);
    tide_free(parts);
    tide_free(rank_of);
    tide_free(alive);
    tide_free(ob);
    tide_free(nb);
    tide_free(sizes);
    tide_free(obr);
    tide_free(nbr);
}

/* On ctl's preparation thread, for every generation this rank takes part in: first the
   communicators (every participant builds them together, so they come before anything
   slow of this rank alone), then, on a member, the pool blocks of the runtime-owned
   buffers and the program's prepare function (tide_set_prepare) for its place in the new
   layout: its pool blocks and host spill blocks. */
static void prep_run(void *ctx, uint64_t gen, const tide_proto_layout_msg_t *pl)
{
    tide_t *t = ctx;
    if (t->coll == NULL)
        return; /* no job yet */
    tide_layout_t *l = NULL;
    if (tide__layout_from_proto(&pl->layout, &l) != TIDE_OK) {
        tide_error_clear(); /* the switch step reports it */
        return;
    }
    tide_view v;
    tide__fill_view(&v, gen, l, t->rank, -1);
    uint64_t t0 = tide_now_ns();
    /* a new thread starts on device 0: bind before anything is allocated */
    tide_status rc = tide_coll_device_bind(t->be, t->device);
    if (rc == TIDE_OK)
        tide__prebuild(t, gen, pl);
    if (rc == TIDE_OK && t->owned) {
        reserve_pool(t, &v);
        reserve_spill(t, pl, &v);
        warm_state(t);
    }
    /* the program's function: tide_set_prepare waits while it runs, not while the
       communicators above are built (that would tie the program to its peers' pace) */
    pthread_mutex_lock(&t->prep_mu);
    tide_prepare_fn fn = v.member ? t->prep_fn : NULL;
    void *fctx = t->prep_ctx;
    t->prep_fn_busy = fn != NULL;
    pthread_mutex_unlock(&t->prep_mu);
    if (rc == TIDE_OK && fn != NULL)
        rc = fn(fctx, &v);
    if (fn != NULL) {
        pthread_mutex_lock(&t->prep_mu);
        t->prep_fn_busy = 0;
        pthread_cond_broadcast(&t->prep_cv);
        pthread_mutex_unlock(&t->prep_mu);
    }
    if (rc != TIDE_OK)
        TIDE_WARN(SUBSYS,
                  "rank %d: preparing generation %llu failed (%s: %s); it switches unprepared",
                  t->rank, (unsigned long long)gen, tide_strerror(rc), tide_last_error());
    else if (fn != NULL || t->owned)
        TIDE_INFO(SUBSYS, "rank %d: generation %llu prepared in %.1f ms", t->rank,
                  (unsigned long long)gen, (double)(tide_now_ns() - t0) / 1e6);
    tide_layout_destroy(&l);
}

tide_status tide_set_prepare(tide_t *t, tide_prepare_fn fn, void *ctx)
{
    if (t == NULL || t->ctl == NULL)
        return tide_errorf(TIDE_ERR_INVALID, "tide_set_prepare: no runtime");
    pthread_mutex_lock(&t->prep_mu);
    while (t->prep_fn_busy) /* the program's function runs: ctx stays its own until it ends */
        pthread_cond_wait(&t->prep_cv, &t->prep_mu);
    t->prep_fn = fn;
    t->prep_ctx = ctx;
    pthread_mutex_unlock(&t->prep_mu);
    if (fn == NULL)
        tide__ctl_prepare_release(t->ctl); /* an ack held for it goes out */
    return TIDE_OK;
}

void tide_destroy(tide_t **self_p)
{
    if (self_p == NULL || *self_p == NULL)
        return;
    tide_t *t = *self_p;
    tide__ckpt_destroy(t); /* the last checkpoint is written before the rank leaves */
    if (t->ctl != NULL)
        tide__task_stop(t, &t->btask, 1); /* a bubble task goes back to tided's queue */
    int fenced = 0;
    if (t->ctl != NULL) {
        tide__ctl_lock(t->ctl);
        fenced = tide__ctl_fenced(t->ctl, NULL, 0);
        /* a build ahead of a switch ends now: ctl's destroy joins its thread */
        tide__prebuilt_cancel_locked(t);
        tide__ctl_unlock(t->ctl);
    }
    tide__ctl_destroy(&t->ctl, !fenced); /* no abort callback can run after this */
    tide__hostbeat_close(&t->host);      /* the control thread that published is gone */
    /* no more heartbeats: the lease would run out under the frees below. A fenced rank
       keeps it expired until its last MPI handle is let go without a call into MPI. */
    if (!fenced)
        tide_coll_lease_set(0);
    tide__prebuilt_drop(t, 1);
    tide_coll_comm_t *c[] = {t->c_all, t->c_tp, t->c_dp, t->c_pp, t->c_switch,
                             t->n_all, t->n_tp, t->n_dp, t->n_pp};
    tide__destroy_comms(c, sizeof c / sizeof c[0]);
    tide_layout_destroy(&t->layout);
    tide__intent_clear(&t->next);
    tide_layout_destroy(&t->parked);
    for (size_t i = 0; t->owned && t->bufs != NULL && i < t->n_tensors; i++)
        tide_mem_pool_free(t->mem, t->bufs[i]);
    tide_free(t->bufs);
    tide_free(t->moved);
    tide_mem_pool_destroy(&t->mem);
    tide_free(t->coord_ids);
    tide_coll_pool_destroy(&t->pool);
    pthread_mutex_destroy(&t->prep_mu);
    pthread_cond_destroy(&t->prep_cv);
    int fin = 0;
    MPI_Finalized(&fin);
    if (!fin && !fenced && t->end_comm != MPI_COMM_NULL)
        MPI_Comm_free(&t->end_comm);
    if (fenced)
        tide_coll_lease_set(0); /* tide's communicators are gone: the program's own MPI is
                                   its business */
    tide_free(t);
    *self_p = NULL;
}

int32_t tide_worker_id(const tide_t *t)
{
    return t ? tide__ctl_worker_id(t->ctl) : -1;
}

int tide_pool_rank(const tide_t *t)
{
    return t ? t->rank : -1;
}

MPI_Comm tide_world(const tide_t *t)
{
    return t ? t->end_comm : MPI_COMM_NULL;
}

int tide_world_rank(const tide_t *t, int32_t w)
{
    return t ? tide_coll_pool_comm_rank(t->pool, w) : -1;
}

int32_t tide_pool_worker_id(const tide_t *t, int rank)
{
    if (t == NULL || rank < 0 || rank >= t->size)
        return -1;
    return t->coord_ids[rank];
}

int tide_pool_size(const tide_t *t)
{
    return t ? t->size : 0;
}

const char *tide_backend_name(const tide_t *t)
{
    return t ? t->be->name : "";
}

tide_mem_kind tide_buffer_kind(const tide_t *t)
{
    return t ? t->be->mem_kind : TIDE_MEM_HOST;
}

/* ---- memory of the backend's kind ------------------------------------------------------- */

tide_status tide_mem_alloc(const tide_t *t, size_t bytes, void **out)
{
    if (out == NULL)
        return tide_errorf(TIDE_ERR_INVALID, "tide_mem_alloc: out is NULL");
    *out = NULL;
    if (t == NULL)
        return tide_errorf(TIDE_ERR_INVALID, "tide_mem_alloc: the runtime is NULL");
    return tide_coll_mem_alloc(t->be, t->device, bytes ? bytes : 1, out);
}

void tide_mem_free(const tide_t *t, void *ptr)
{
    if (t != NULL && ptr != NULL)
        t->be->mem_free(ptr);
}

/* The common checks of the copies: a runtime, buffers where there are bytes, and each
 * backend-side buffer of the backend's kind. */
static tide_status copy_args(const tide_t *t, const char *op, const void *dst, int dst_be,
                             const void *src, int src_be, size_t bytes)
{
    if (t == NULL)
        return tide_errorf(TIDE_ERR_INVALID, "%s: the runtime is NULL", op);
    if (bytes == 0)
        return TIDE_OK;
    if (dst == NULL || src == NULL)
        return tide_errorf(TIDE_ERR_INVALID, "%s: NULL %s for %zu bytes", op,
                           dst == NULL ? "destination" : "source", bytes);
    if (dst_be)
        TIDE_CHECK(tide_coll_mem_check(t->be, dst, bytes, "the destination"));
    if (src_be)
        TIDE_CHECK(tide_coll_mem_check(t->be, src, bytes, "the source"));
    return TIDE_OK;
}

tide_status tide_mem_copy(const tide_t *t, void *dst, const void *src, size_t bytes)
{
    TIDE_CHECK(copy_args(t, "tide_mem_copy", dst, 1, src, 1, bytes));
    if (bytes == 0)
        return TIDE_OK;
    TIDE_CHECK(t->be->copy2d(dst, bytes, src, bytes, bytes, 1, NULL));
    return t->be->stream_sync(NULL, NULL);
}

tide_status tide_copy_to_host(const tide_t *t, void *host, const void *src, size_t bytes)
{
    TIDE_CHECK(copy_args(t, "tide_copy_to_host", host, 0, src, 1, bytes));
    return bytes == 0 ? TIDE_OK : t->be->copy_host(host, src, bytes, 1, NULL);
}

tide_status tide_copy_from_host(const tide_t *t, void *dst, const void *host, size_t bytes)
{
    TIDE_CHECK(copy_args(t, "tide_copy_from_host", dst, 1, host, 0, bytes));
    return bytes == 0 ? TIDE_OK : t->be->copy_host(dst, host, bytes, 0, NULL);
}

const tide_view *tide_view_get(const tide_t *t)
{
    return &t->view;
}

const tide_view *tide_view_next(const tide_t *t)
{
    return t->has_next ? &t->next_view : NULL;
}

/* ---- join ------------------------------------------------------------------------------------ */

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

static tide_status send_join(tide_t *t, const tide_join_req *req)
{
    size_t n = tide_collection_size(req->collection);
    if (n > TIDE_PROTO_TENSORS_MAX)
        return tide_errorf(TIDE_ERR_RANGE, "the collection has %zu tensors; tided takes %u", n,
                           TIDE_PROTO_TENSORS_MAX);
    tide_proto_tensor_t *ts = tide_calloc(n ? n : 1, sizeof *ts);
    if (ts == NULL)
        return tide_errorf(TIDE_ERR_NOMEM, "out of memory describing %zu tensors", n);
    for (size_t i = 0; i < n; i++) {
        const tide_tensor_desc *d = tide_collection_tensor(req->collection, i);
        snprintf(ts[i].name, sizeof ts[i].name, "%s", d->name);
        ts[i].dtype = (int)d->dtype;
        ts[i].ndim = d->ndim;
        memcpy(ts[i].shape, d->shape, sizeof ts[i].shape);
        ts[i].layer = d->layer;
        ts[i].tp = (int)d->tp;
        ts[i].tp_dim = d->tp == TIDE_TP_SPLIT ? d->tp_dim : 0;
        ts[i].tp_segments = d->tp_segments;
        ts[i].dp = (int)d->dp;
    }
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
    j->n_tensors = (uint32_t)n;
    /* checked by tide_join (tide_fit_check): at most TIDE_FIT_RULES_MAX, each well formed */
    tide_proto_fit_t fit[TIDE_FIT_RULES_MAX];
    _Static_assert(TIDE_PROTO_FIT_MAX == TIDE_FIT_RULES_MAX &&
                       TIDE_PROTO_FIT_WHAT_MAX + 1 == TIDE_FIT_WHAT_MAX,
                   "proto carries every fit rule libtide takes");
    for (int i = 0; i < req->n_fit; i++) {
        fit[i].degree = (int)req->fit[i].degree;
        fit[i].n = req->fit[i].n;
        memcpy(fit[i].what, req->fit[i].what, sizeof fit[i].what);
    }
    j->fit = req->n_fit > 0 ? fit : NULL;
    j->n_fit = (uint32_t)req->n_fit;
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

/* The job's first layout l (taken) becomes the runtime's: view, agreement, buffer table,
   memory pool. From here a recovery (or halt) aborts the groups' build: switch_cancel, set
   by the control thread under ctl's lock from now on. */
static tide_status adopt_first(tide_t *t, const tide_join_req *req, tide_layout_t *l, uint64_t gen)
{
    t->coll = req->collection;
    t->n_tensors = tide_collection_size(req->collection);
    snprintf(t->job, sizeof t->job, "%s", req->job);
    t->layout = l;
    tide__fill_view(&t->view, gen, l, t->rank, req->start_step);
    tide__ctl_lock(t->ctl);
    tide__agree *ag = tide__ctl_agree(t->ctl);
    tide__agree_first(ag, gen, t->view.member);
    ag->building = t->view.member;
    __atomic_store_n(&t->switch_cancel, 0, __ATOMIC_RELAXED);
    tide__ctl_unlock(t->ctl);
    t->bufs = tide_calloc(t->n_tensors ? t->n_tensors : 1, sizeof *t->bufs);
    t->moved = tide_calloc(t->n_tensors ? t->n_tensors : 1, 1);
    if (t->bufs == NULL || t->moved == NULL)
        return tide_errorf(TIDE_ERR_NOMEM, "out of memory for the buffer table");
    if (t->mem == NULL)
        TIDE_CHECK(tide_mem_pool_new(&t->mem, t->be, t->device));
    return TIDE_OK;
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
    tide_status rc = tide__build_groups(t, t->layout, gen, NULL, 1, t->view.pp_rank,
                                        t->view.dp_rank, t->view.tp_rank, g);
    tide__ctl_lock(t->ctl);
    tide__agree *ag = tide__ctl_agree(t->ctl);
    ag->building = 0;
    int abandoned = rc == TIDE_ERR_ABORTED && __atomic_load_n(&t->switch_cancel, __ATOMIC_RELAXED);
    if (rc == TIDE_OK) {
        tide__unpublish_new(t);
        t->c_all = g[0];
        t->c_tp = g[1];
        t->c_dp = g[2];
        t->c_pp = g[3];
    } else if (abandoned) {
        ag->groups_dead = 1;
    }
    tide__ctl_unlock(t->ctl);
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
    if (rc == TIDE_OK) {
        tide__ctl_set_job(t->ctl, req->job, req->start_step);
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

tide_status tide_give_buffers(tide_t *t, void ***bufs_p)
{
    if (t == NULL || t->bufs == NULL || t->mem == NULL)
        return tide_errorf(TIDE_ERR_INVALID, "tide_give_buffers: join a job first");
    if (bufs_p == NULL || *bufs_p == NULL)
        return tide_errorf(TIDE_ERR_INVALID, "tide_give_buffers: no buffer table");
    if (t->owned)
        return tide_errorf(TIDE_ERR_INVALID, "tide_give_buffers: the runtime owns buffers "
                                             "already");
    void **b = *bufs_p;
    for (size_t i = 0; i < t->n_tensors; i++)
        if (b[i] != NULL && !tide_mem_pool_owns(t->mem, b[i]))
            return tide_errorf(TIDE_ERR_INVALID,
                               "tide_give_buffers: the buffer of tensor %s is not from "
                               "tide_alloc_buffers",
                               tide_collection_tensor(t->coll, i)->name);
    TIDE_CHECK(tide_set_buffers(t, b));
    /* the runtime prepares its pool for announced layouts from now on (prep_run reads
       owned on the preparation thread: none runs while it changes) */
    tide__ctl_lock(t->ctl);
    tide__ctl_prepare_wait(t->ctl);
    t->owned = 1;
    tide__ctl_unlock(t->ctl);
    tide_free(b);
    *bufs_p = NULL;
    return TIDE_OK;
}

void *const *tide_buffers(const tide_t *t)
{
    return t != NULL && t->owned ? t->bufs : NULL;
}

int tide_buffer_moved(const tide_t *t, size_t i)
{
    return t != NULL && t->moved != NULL && i < t->n_tensors ? t->moved[i] : 0;
}

tide_status tide_set_buffers(tide_t *t, void *const *bufs)
{
    if (t == NULL || t->bufs == NULL)
        return tide_errorf(TIDE_ERR_INVALID, "tide_set_buffers: join a job first");
    if (bufs == NULL)
        return tide_errorf(TIDE_ERR_INVALID, "tide_set_buffers: bufs is NULL");
    const tide_view *v = &t->view;
    for (size_t i = 0; i < t->n_tensors; i++) {
        uint64_t need =
            v->member ? tide_shard_bytes(t->layout, t->coll, i, v->pp_rank, v->dp_rank, v->tp_rank)
                      : 0;
        if (need > 0 && bufs[i] == NULL)
            return tide_errorf(TIDE_ERR_INVALID,
                               "tide_set_buffers: tensor %s needs a %llu-byte "
                               "buffer on this rank, got NULL",
                               tide_collection_tensor(t->coll, i)->name, (unsigned long long)need);
        TIDE_CHECK(tide__check_buf(t, "tide_set_buffers", i, bufs[i], need));
    }
    memcpy(t->bufs, bufs, t->n_tensors * sizeof *bufs);
    return TIDE_OK;
}

tide_status tide__check_buf(const tide_t *t, const char *who, size_t i, const void *buf,
                            uint64_t bytes)
{
    char what[160];
    snprintf(what, sizeof what, "%s: tensor %s", who, tide_collection_tensor(t->coll, i)->name);
    return tide_coll_mem_check(t->be, buf, (size_t)bytes, what);
}

int tide_device(const tide_t *t)
{
    return t != NULL ? t->device : -1;
}

tide_status tide_bind_device(const tide_t *t)
{
    if (t == NULL)
        return tide_errorf(TIDE_ERR_INVALID, "tide_bind_device: no runtime");
    return tide_coll_device_bind(t->be, t->device);
}

/* ---- steps ----------------------------------------------------------------------------------- */

/* An idle rank: was the job ended by its members (tide_finish), or this rank's pool
   released from it? */
static int job_ended(tide_t *t)
{
    /* tided releases a pool once the generation that left it out is committed, so no
       peer still waits on this rank's part of that switch: the launch may exit */
    uint64_t rel = tide__ctl_released(t->ctl);
    if (rel != 0 && rel <= t->view.generation) {
        TIDE_INFO(SUBSYS,
                  "job %s: generation %llu released this rank's pool (its launch left the "
                  "job); rank %d finishes",
                  t->job, (unsigned long long)rel, t->rank);
        return 1;
    }
    int64_t last = 0;
    char why[TIDE_PROTO_TEXT_MAX + 1] = "";
    if (tide__ctl_job_ended(t->ctl, &last, why, sizeof why)) {
        /* tided's word: a member stopped without tide_finish (or the members that could
           release this rank cannot reach it, or are gone) */
        TIDE_INFO(SUBSYS, "job %s ended at step %lld: tided says %s; idle rank %d released", t->job,
                  (long long)last, why[0] ? why : "so", t->rank);
        return 1;
    }
    int flag = 0;
    MPI_Status st;
    if (MPI_Iprobe(MPI_ANY_SOURCE, TAG_END, t->end_comm, &flag, &st) != MPI_SUCCESS || !flag)
        return 0;
    int64_t step = 0;
    MPI_Recv(&step, 1, MPI_INT64_T, st.MPI_SOURCE, TAG_END, t->end_comm, MPI_STATUS_IGNORE);
    TIDE_INFO(SUBSYS, "job %s ended at step %lld; idle rank %d released", t->job, (long long)step,
              t->rank);
    return 1;
}

/* With the lock held, at the step boundary that decided the switch: takes the pending
   generation's intent by value (tide_reshard runs it) and this rank's view of its layout.
   From here an abort of the switch sets switch_cancel; one that came already (also while
   the boundary waited for the preparation) leaves it set: set under the lock the abort
   callback takes, so that no abort falls between the test and the store. */
static tide_status take_next(tide_t *t)
{
    const tide_proto_layout_msg_t *pl = tide__ctl_pending_layout(t->ctl);
    tide__agree *a = tide__ctl_agree(t->ctl);
    if (pl == NULL)
        return tide_errorf(TIDE_ERR_INTERNAL, "switch to generation %llu without its layout",
                           (unsigned long long)a->p_gen);
    uint64_t gen = pl->layout.gen;
    tide__intent_clear(&t->next);
    TIDE_CHECK(tide__intent_from_msg(&t->next, gen, pl, a->p_old));
    __atomic_store_n(&t->switch_cancel, !(a->p_gen == gen && a->p_switching && !a->p_aborted),
                     __ATOMIC_RELAXED);
    tide_layout_destroy(&t->parked);
    tide__fill_view(&t->next_view, gen, t->next.next, t->rank, a->p_switch);
    t->has_next = 1;
    return TIDE_OK;
}

tide_status tide_step_begin(tide_t *t, tide_step_action *action)
{
    if (t == NULL || action == NULL || t->job[0] == '\0')
        return tide_errorf(TIDE_ERR_INVALID, "tide_step_begin: join a job first");
    if (t->finished) {
        *action = TIDE_STEP_FINISHED;
        return TIDE_OK;
    }
    uint64_t idle_from = 0, begin_ns = tide_now_ns();
    tide_status rc = TIDE_OK;
    /* communicators built ahead for a generation that was aborted or replaced are freed
       here, on the thread that may use them, once their build is over */
    tide__prebuilt_drop(t, 0);
    tide__ctl_lock(t->ctl);
    for (;;) {
        char why[TIDE_PROTO_TEXT_MAX + 1];
        if (tide__ctl_fenced(t->ctl, why, sizeof why)) {
            /* the job goes on without this rank: it must leave, touching no peer */
            if (!t->fence_logged)
                TIDE_ERROR(SUBSYS,
                           "rank %d of job %s was fenced and must exit now without further "
                           "communication: %s",
                           t->rank, t->job, why);
            t->fence_logged = 1;
            rc = tide_errorf(TIDE_ERR_STALE,
                             "rank %d of job %s was fenced (the job went on without it): %s",
                             t->rank, t->job, why);
            break;
        }
        int halted = tide__ctl_halted(t->ctl, why, sizeof why);
        if (halted != 0) {
            rc = tide_errorf((tide_status)halted, "tided halted job %s: %s", t->job, why);
            break;
        }
        tide__agree *a = tide__ctl_agree(t->ctl);
        tide__begin d = tide__agree_begin(a);
        if (d == TIDE__BEGIN_RUN) {
            t->view.step = a->completed;
            t->step_t0 = tide_now_ns();
            *action = TIDE_STEP_RUN;
            t->bubble_k = 0;
            break;
        }
        if (d == TIDE__BEGIN_FINISH) {
            t->view.step = a->completed;
            t->step_t0 = tide_now_ns();
            *action = TIDE_STEP_FINISH;
            break;
        }
        if (d == TIDE__BEGIN_SWITCH) {
            tide__ctl_prepare_wait(t->ctl); /* the program's preparation comes first */
            rc = take_next(t);
            if (rc != TIDE_OK) {
                tide__agree_switch_failed(a);
                break;
            }
            t->switch_wait_ms = (double)(tide_now_ns() - begin_ns) / 1e6;
            *action = TIDE_STEP_RECONFIGURE;
            break;
        }
        if (d == TIDE__BEGIN_STALE) {
            rc = tide_errorf(TIDE_ERR_STALE,
                             "rank %d completed %lld steps, past generation %llu's switch step "
                             "%lld (a recovery rolled the job back; this rank cannot follow)",
                             t->rank, (long long)a->completed, (unsigned long long)a->p_gen,
                             (long long)a->p_switch);
            break;
        }
        /* WAIT: at the boundary for a commit, or idle outside the layout */
        if (idle_from == 0)
            idle_from = tide_now_ns();
        if (a->member && a->groups_dead) {
            /* the layout's communicators failed (tide_step_end). When a peer died, tided's
               recovery comes within its failure timeout and switches this rank. When none
               did (nccl maps its socket and IB errors to ABORTED: a flaky link or NIC looks
               like a dead peer), none ever comes: the rank gives up after the switch
               timeout rather than wait forever, and tided recovers the job around it once
               its heartbeats stop. */
            uint64_t bound = (uint64_t)t->opts.switch_timeout_ms * 1000000ull;
            if (tide_now_ns() - idle_from >= bound) {
                rc = tide_errorf(TIDE_ERR_TIMEOUT,
                                 "rank %d: generation %llu's communicators failed at step %lld "
                                 "and no new layout replaced them within %d ms "
                                 "(TIDE_SWITCH_TIMEOUT_MS): tided knows of no dead peer, so "
                                 "the failure was not a lost worker (a network or device "
                                 "fault?); this rank gives up",
                                 t->rank, (unsigned long long)a->gen, (long long)a->completed,
                                 t->opts.switch_timeout_ms);
                break;
            }
        }
        int idle = !a->member && a->p_gen == 0;
        tide__ctl_unlock(t->ctl);
        tide__prebuilt_drop(t, 0); /* an abort while this rank waits at the boundary */
        if (idle && job_ended(t)) {
            t->finished = 1;
            *action = TIDE_STEP_FINISHED;
            tide__ctl_add_idle(t->ctl, tide_now_ns() - idle_from);
            return TIDE_OK;
        }
        if (idle && t->btask != NULL)
            tide__task_stop(t, &t->btask, 1); /* out of the layout: no more bubbles */
        if (idle)
            tide__run_plugin(t);
        tide__ctl_lock(t->ctl);
        tide__ctl_wait(t->ctl, 20);
    }
    tide__ctl_unlock(t->ctl);
    if (idle_from != 0)
        tide__ctl_add_idle(t->ctl, tide_now_ns() - idle_from);
    return rc;
}

/* 1 when a member's step communicators are gone or dead (aborted, or an operation on
   them failed): no step can run on them. Main thread. */
static int step_groups_dead(const tide_t *t)
{
    if (!t->view.member)
        return 0;
    const tide_coll_comm_t *c[] = {t->c_all, t->c_tp, t->c_dp, t->c_pp};
    for (size_t i = 0; i < 4; i++)
        if (tide_coll_comm_aborted(c[i])) /* NULL counts: never built */
            return 1;
    return 0;
}

tide_status tide_step_end(tide_t *t, tide_status step_rc)
{
    if (t == NULL || t->ctl == NULL)
        return tide_errorf(TIDE_ERR_INVALID, "tide_step_end: no runtime");
    tide__ctl_lock(t->ctl);
    tide__agree *a = tide__ctl_agree(t->ctl);
    int r = tide__agree_end(a, step_rc == TIDE_OK);
    /* a step that failed on a dead communicator is not retried on it (it would fail at
       once, for as long as no new layout comes): tide_step_begin waits for one */
    if (r == 0 && step_rc != TIDE_OK && step_groups_dead(t))
        a->groups_dead = 1;
    t->view.step = a->completed;
    tide__ctl_unlock(t->ctl);
    if (r != 0)
        return tide_errorf(TIDE_ERR_INVALID, "tide_step_end without tide_step_begin");
    tide__ctl_prepare_release(t->ctl); /* a held ack goes out by the end of a step */
    tide__bubble_boundary(t);
    if (step_rc == TIDE_OK) {
        tide__ctl_add_step(t->ctl, tide_now_ns() - t->step_t0);
        tide__ckpt_step_end(t);
    } else
        TIDE_WARN(SUBSYS, "rank %d: step %lld failed (%s); not counted", t->rank,
                  (long long)t->view.step, tide_strerror(step_rc));
    return TIDE_OK;
}

void tide_step_can_finish(tide_t *t)
{
    if (t == NULL || t->ctl == NULL)
        return;
    tide__ctl_lock(t->ctl);
    tide__agree_can_finish(tide__ctl_agree(t->ctl));
    tide__ctl_unlock(t->ctl);
}

void tide_bubble_begin(tide_t *t)
{
    if (t != NULL)
        t->bubble_t0 = tide_now_ns();
}

void tide_bubble_end(tide_t *t)
{
    if (t != NULL && t->bubble_t0 != 0) {
        uint64_t ns = tide_now_ns() - t->bubble_t0;
        tide__ctl_add_bubble(t->ctl, ns, 0);
        t->bstats.windows++;
        t->bstats.bubble_ms += (double)ns / 1e6;
        t->bubble_t0 = 0;
    }
}

tide_status tide_finish(tide_t *t)
{
    if (t == NULL || t->layout == NULL)
        return tide_errorf(TIDE_ERR_INVALID, "tide_finish: join a job first");
    char why[TIDE_PROTO_TEXT_MAX + 1];
    tide__ctl_lock(t->ctl);
    int fenced = tide__ctl_fenced(t->ctl, why, sizeof why);
    tide__ctl_unlock(t->ctl);
    if (fenced) /* its idle ranks are the job's, which goes on: nothing to release */
        return tide_errorf(TIDE_ERR_STALE, "tide_finish: rank %d was fenced: %s", t->rank, why);
    t->finished = 1;
    if (!t->view.member || t->layout->worker[0] != t->rank)
        return TIDE_OK;
    /* the send buffer outlives an abandoned request: MPI may still read it later */
    static int64_t end_step;
    end_step = t->view.step;
    MPI_Request *reqs = tide_malloc((size_t)t->size * sizeof *reqs);
    int *who = tide_malloc((size_t)t->size * sizeof *who);
    if (reqs == NULL || who == NULL) {
        tide_free(reqs);
        tide_free(who);
        return tide_errorf(TIDE_ERR_NOMEM, "out of memory releasing the idle ranks");
    }
    int n = 0;
    for (int r = 0; r < t->size; r++) {
        int p, d, tt;
        /* end_comm holds the processes of the pool's communicator, in its order */
        int c = tide_coll_pool_comm_rank(t->pool, r);
        if (c < 0 || tide_layout_find(t->layout, r, &p, &d, &tt) == TIDE_OK)
            continue;
        if (MPI_Isend(&end_step, 1, MPI_INT64_T, c, TAG_END, t->end_comm, &reqs[n]) != MPI_SUCCESS)
            TIDE_WARN(SUBSYS, "could not release idle rank %d", r);
        else
            who[n++] = r;
    }
    /* an idle rank that died (a pool that left) never takes its message: not waited for
       past a bound, or the job's end would hang on it */
    uint64_t deadline = tide_now_ns() + 2000ull * 1000000ull;
    int all = n == 0;
    while (!all && tide_now_ns() < deadline) {
        if (MPI_Testall(n, reqs, &all, MPI_STATUSES_IGNORE) != MPI_SUCCESS)
            break;
        if (!all)
            usleep(1000);
    }
    for (int i = 0; !all && i < n; i++) {
        int done = 0;
        if (reqs[i] != MPI_REQUEST_NULL &&
            MPI_Test(&reqs[i], &done, MPI_STATUS_IGNORE) == MPI_SUCCESS && !done) {
            TIDE_WARN(SUBSYS, "idle rank %d did not take the job's end within 2 s (gone?)", who[i]);
            MPI_Request_free(&reqs[i]);
        }
    }
    tide_free(reqs);
    tide_free(who);
    tide_error_clear();
    return TIDE_OK;
}

/* ---- buffers ----------------------------------------------------------------------------------
 */

/* A buffer of tide_alloc_buffers back to the pool (or the backend, before a job). */
void tide__free_buffer(const tide_t *t, void *p)
{
    if (p == NULL)
        return;
    if (t->mem != NULL)
        tide_mem_pool_free(t->mem, p);
    else
        t->be->mem_free(p);
}

tide_status tide_alloc_buffers(const tide_t *t, const tide_view *v, void ***out)
{
    if (t == NULL || v == NULL || out == NULL || t->coll == NULL)
        return tide_errorf(TIDE_ERR_INVALID, "tide_alloc_buffers: join a job first");
    *out = NULL;
    void **b = tide_calloc(t->n_tensors ? t->n_tensors : 1, sizeof *b);
    if (b == NULL)
        return tide_errorf(TIDE_ERR_NOMEM, "out of memory allocating buffer pointers");
    tide_status rc = TIDE_OK;
    for (size_t i = 0; v->member && i < t->n_tensors; i++) {
        uint64_t n = tide_shard_bytes(v->layout, t->coll, i, v->pp_rank, v->dp_rank, v->tp_rank);
        if (n == 0)
            continue;
        /* the rank's device by name: this may run on the program's preparation thread */
        TIDE_CHECK_GOTO(t->mem != NULL ? tide_mem_pool_alloc(t->mem, (size_t)n, &b[i])
                                       : tide_coll_mem_alloc(t->be, t->device, (size_t)n, &b[i]),
                        rc, fail);
        TIDE_CHECK_GOTO(tide_coll_mem_zero(t->be, t->device, b[i], (size_t)n), rc, fail);
    }
    *out = b;
    return TIDE_OK;
fail:
    for (size_t i = 0; i < t->n_tensors; i++)
        tide__free_buffer(t, b[i]);
    tide_free(b);
    return rc;
}

void tide_free_buffers(const tide_t *t, void ***bufs_p)
{
    if (bufs_p == NULL || *bufs_p == NULL || t == NULL)
        return;
    for (size_t i = 0; i < t->n_tensors; i++)
        tide__free_buffer(t, (*bufs_p)[i]);
    tide_free(*bufs_p);
    *bufs_p = NULL;
}
