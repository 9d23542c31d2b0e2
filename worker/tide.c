/*
 * worker/tide: the public libtide API (include/tide/tide.h) on the training thread: the
 * runtime's lifecycle (the pool, the device, registration with tided, the threads it
 * starts and the objects it shares with them), the memory of the backend's kind and the
 * registered buffers. Joining a job is job.c, the step boundaries step.c, the switch
 * switch.c, the control thread ctl.c, the preparation prep.c.
 *
 * Workload: one tide_t per rank; its calls here are made once or per buffer.
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
#include "worker/retire.h"
#include "worker/sched.h"
#include "worker/tide_int.h"

#define SUBSYS "worker"

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
    o->min_gpus = (int)env_int("TIDE_MIN_GPUS", 0);
    o->max_gpus = (int)env_int("TIDE_MAX_GPUS", 0);
    o->priority = (int)env_int("TIDE_PRIORITY", 0);
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

/* The pool's name: opts->pool, else made on rank 0 (host, pid, time) and shared. */
static void pool_name(tide_t *t, const tide_options *opts, char *pool, size_t len)
{
    pool[0] = '\0';
    if (opts->pool != NULL && opts->pool[0] != '\0') {
        snprintf(pool, len, "%s", opts->pool);
    } else if (t->rank == 0) {
        char host[64] = "host";
        gethostname(host, sizeof host);
        host[sizeof host - 1] = '\0';
        for (char *c = host; *c; c++)
            if (!((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') ||
                  (*c >= '0' && *c <= '9') || *c == '.' || *c == '-'))
                *c = '-';
        snprintf(pool, len, "%s-%d-%lld", host, (int)getpid(),
                 (long long)(tide_wall_ms() % 100000000));
    }
    MPI_Bcast(pool, (int)len, MPI_CHAR, 0, t->end_comm);
    pool[len - 1] = '\0';
}

/* What this rank registers as with tided. */
static void registration(tide_t *t, const tide_options *opts, const char *pool, int n_local,
                         tide__ctl_config *cc)
{
    memset(cc, 0, sizeof *cc);
    cc->endpoint = opts->endpoint;
    cc->key_file = opts->key_file;
    cc->server_key = opts->server_key;
    cc->register_timeout_ms = opts->register_timeout_ms;
    snprintf(cc->reg.pool, sizeof cc->reg.pool, "%s", pool);
    cc->reg.rank = t->rank;
    cc->reg.size = t->size;
    if (gethostname(cc->reg.host, sizeof cc->reg.host) != 0 || cc->reg.host[0] == '\0')
        snprintf(cc->reg.host, sizeof cc->reg.host, "localhost");
    cc->reg.host[sizeof cc->reg.host - 1] = '\0';
    cc->reg.device = t->device > TIDE_PROTO_DEVICE_MAX ? TIDE_PROTO_DEVICE_MAX : t->device;
    cc->reg.kind = t->be->mem_kind == TIDE_MEM_DEVICE ? TIDE_DEVICE_GPU : TIDE_DEVICE_CPU;
    cc->reg.mem_bytes = worker_mem(t, opts, n_local);
    cc->reg.pid = (int)getpid();
    tide__sched_alloc(&cc->reg.alloc); /* the Slurm allocation it runs in, if any */
    cc->host = t->host;
    cc->intents = t->intents;
    cc->progress = &t->progress;
    cc->gens = t->gens;
    cc->prep = t->prep;
}

/* The pool, its job-end communicator, the backend, and the rank's device (bound on this
   thread first: libtide owns the device). *node: the ranks of this host. */
static tide_status open_pool(tide_t *t, const tide_options *opts, MPI_Comm world, MPI_Comm *node,
                             int *n_local)
{
    TIDE_CHECK(tide_coll_pool_new(&t->pool, world));
    t->rank = tide_coll_pool_rank(t->pool);
    t->size = tide_coll_pool_size(t->pool);
    if (MPI_Comm_dup(world, &t->end_comm) != MPI_SUCCESS)
        return tide_errorf(TIDE_ERR_BACKEND, "MPI_Comm_dup failed");
    MPI_Comm_set_errhandler(t->end_comm, MPI_ERRORS_RETURN);
    tide_status rc = tide_coll_backend_find(opts->backend ? opts->backend : "mpi", &t->be);
    /* the ranks of this host: a device index each, a share of the host's RAM, and one
       heartbeat message together */
    if (MPI_Comm_split_type(world, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, node) != MPI_SUCCESS)
        *node = MPI_COMM_NULL;
    int local = 0;
    local_ranks(*node, &local, n_local);
    t->device = opts->device >= 0 ? opts->device : local;
    if (rc == TIDE_OK)
        rc = tide_coll_device_bind(t->be, t->device);
    return rc;
}

/* The objects shared with the other threads: the intents mailbox, the generations' abort
   words, the preparation. */
static tide_status open_shared(tide_t *t)
{
    TIDE_CHECK(tide__mailbox_new(&t->intents));
    TIDE_CHECK(tide__gens_new(&t->gens));
    /* a device backend's communicators take long to destroy: not on the training thread
       (without the retirer, a switch destroys them itself) */
    if (t->be->device_bind != NULL && tide__retire_new(&t->retire, t->be, t->device) != TIDE_OK)
        TIDE_WARN(SUBSYS, "%s: switches destroy their old communicators themselves",
                  tide_last_error());
    return tide__prep_new(&t->prep, t->gens);
}

/* communicators are built ahead of a switch on the preparation thread only when every
   rank can (MPI_THREAD_MULTIPLE): all participants must build them, or none. A pool that
   joins later runs MPI_THREAD_MULTIPLE too (join.c needs it). */
static tide_status thread_level(tide_t *t)
{
    int level = MPI_THREAD_SINGLE, multi = 0;
    MPI_Query_thread(&level);
    multi = level >= MPI_THREAD_MULTIPLE;
    if (MPI_Allreduce(MPI_IN_PLACE, &multi, 1, MPI_INT, MPI_MIN, t->end_comm) != MPI_SUCCESS)
        return tide_errorf(TIDE_ERR_BACKEND, "MPI_Allreduce of thread levels failed");
    t->multi = multi;
    return TIDE_OK;
}

tide_status tide_new(tide_t **out, const tide_options *opts, MPI_Comm world)
{
    if (out == NULL || opts == NULL)
        return tide_errorf(TIDE_ERR_INVALID, "tide_new: out and opts are required");
    *out = NULL;
    tide_t *t = tide_calloc(1, sizeof *t);
    if (t == NULL)
        return tide_errorf(TIDE_ERR_NOMEM, "out of memory creating the tide runtime");
    t->opts = *opts;
    t->end_comm = MPI_COMM_NULL;
    t->plugin_grace = -1;
    tide_msg_init(&t->pending, TIDE_MSG_NONE);
    tide_msg_init(&t->plugin, TIDE_MSG_NONE);
    MPI_Comm node = MPI_COMM_NULL;
    int n_local = 1;
    tide_status rc = open_pool(t, opts, world, &node, &n_local);
    if (rc != TIDE_OK && t->end_comm == MPI_COMM_NULL)
        goto fail; /* no pool: nothing to agree over */
    if (rc == TIDE_OK)
        rc = open_shared(t);
    char pool[TIDE_PROTO_NAME_MAX + 1];
    if (t->end_comm != MPI_COMM_NULL)
        pool_name(t, opts, pool, sizeof pool);
    if (node != MPI_COMM_NULL) {
        tide_status hrc = tide__hostbeat_open(node, opts->heartbeat_aggregate, &t->host);
        MPI_Comm_free(&node);
        if (rc == TIDE_OK)
            rc = hrc;
    }
    if (rc == TIDE_OK) {
        tide__ctl_config cc;
        registration(t, opts, pool, n_local, &cc);
        rc = tide__ctl_new(&t->ctl, &cc);
    }
    TIDE_CHECK_GOTO(agree_rc(t->end_comm, rc, "registering with tided"), rc, fail);
    t->coord_ids = tide_calloc((size_t)t->size, sizeof *t->coord_ids);
    TIDE_CHECK_ALLOC_GOTO(t->coord_ids, rc, fail);
    int32_t me = tide__ctl_worker_id(t->ctl);
    if (MPI_Allgather(&me, 1, MPI_INT32_T, t->coord_ids, 1, MPI_INT32_T, t->end_comm) !=
        MPI_SUCCESS)
        TIDE_FAIL_GOTO(rc, fail, TIDE_ERR_BACKEND, "MPI_Allgather of worker ids failed");
    TIDE_CHECK_GOTO(thread_level(t), rc, fail);
    tide__fill_view(&t->view, 0, NULL, t->rank, 0);
    tide__rebase(t); /* the preparation thread starts, bound to the rank's device */
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

void tide__prep_base_of(const tide_t *t, tide__prep_base *b)
{
    memset(b, 0, sizeof *b);
    b->rank = t->rank;
    b->size = t->size;
    b->device = t->device;
    b->multi = t->multi;
    b->be = t->be;
    b->pool = t->pool;
    b->coll = t->coll;
    b->n_tensors = t->n_tensors;
    b->layout = t->layout;
    b->bufs = t->bufs;
    b->owned = t->owned;
    b->mem = t->mem;
    b->staging_cap = t->opts.staging_cap;
    b->mem_strict = t->opts.mem_strict;
    b->switch_timeout_ms = t->opts.switch_timeout_ms;
}

void tide__rebase(tide_t *t)
{
    if (t->prep == NULL)
        return;
    tide__prep_base b;
    tide__prep_base_of(t, &b);
    if (tide__prep_rebase(t->prep, &b) != TIDE_OK)
        TIDE_WARN(SUBSYS, "rank %d: the preparation did not hear of the new state: %s", t->rank,
                  tide_last_error());
}

tide_status tide_set_prepare(tide_t *t, tide_prepare_fn fn, void *ctx)
{
    if (t == NULL || t->prep == NULL)
        return tide_errorf(TIDE_ERR_INVALID, "tide_set_prepare: no runtime");
    tide__prep_set_fn(t->prep, fn, ctx);
    return TIDE_OK;
}

/* The other threads end: a build ahead of a switch (the words of the generations after
   the running one), the control thread (bye unless fenced), the preparation thread. */
static void stop_threads(tide_t *t, int fenced)
{
    if (t->gens != NULL)
        tide__gens_kill_above(t->gens, t->agree.gen);
    tide__ctl_destroy(&t->ctl, !fenced);
    tide__prep_destroy(&t->prep);
    tide__retire_destroy(&t->retire); /* the replaced layouts' communicators are gone */
    tide__hostbeat_close(&t->host);   /* the control thread that published is gone */
}

void tide_destroy(tide_t **self_p)
{
    if (self_p == NULL || *self_p == NULL)
        return;
    tide_t *t = *self_p;
    tide__drain_last(t);   /* a request sent during the last step is heard and reported */
    tide__ckpt_destroy(t); /* the last checkpoint is written before the rank leaves */
    if (t->ctl != NULL)
        tide__task_stop(t, &t->btask, 1); /* a bubble task goes back to tided's queue */
    if (t->intents != NULL)
        tide__drain(t); /* a fence said last */
    int fenced = t->fenced;
    stop_threads(t, fenced);
    /* no more heartbeats: the lease would run out under the frees below. A fenced rank
       keeps it expired until its last MPI handle is let go without a call into MPI. */
    if (!fenced)
        tide_coll_lease_set(0);
    tide_coll_comm_t *c[] = {t->c_all, t->c_tp, t->c_dp, t->c_pp};
    tide__destroy_comms(c, sizeof c / sizeof c[0]);
    tide__gen_put(&t->run_word);
    tide__gen_put(&t->next_word);
    tide_layout_destroy(&t->layout);
    tide__intent_clear(&t->next);
    tide_layout_destroy(&t->parked);
    tide_msg_clear(&t->pending);
    tide_msg_clear(&t->plugin);
    for (size_t i = 0; t->owned && t->bufs != NULL && i < t->n_tensors; i++)
        tide_mem_pool_free(t->mem, t->bufs[i]);
    tide_free(t->bufs);
    tide_free(t->moved);
    tide_mem_pool_destroy(&t->mem);
    tide_free(t->coord_ids);
    tide_coll_pool_destroy(&t->pool);
    tide__mailbox_destroy(&t->intents);
    tide__gens_destroy(&t->gens);
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
    /* the runtime prepares its pool for announced layouts from now on (a job that runs
       keeps the base it started with) */
    t->owned = 1;
    tide__rebase(t);
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
