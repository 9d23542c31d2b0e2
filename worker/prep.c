/*
 * worker/prep: the preparation object (prep.h): its thread, its job slot, the base it
 * prepares from, what it built ahead, and what the control thread's held ack waits for.
 * Also the memory a job prepares when the runtime owns the buffers: pool blocks for the
 * shards this rank will receive, the host spill blocks its switch will take, and a warm
 * read of its current shards.
 *
 * Workload: one job per announced generation; the memory work is the slow part (first
 * touches of up to GiBs), which is why it runs here and not at the switch step.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "collectives/executor.h"
#include "core/alloc.h"
#include "core/clock.h"
#include "core/error.h"
#include "core/log.h"
#include "worker/groups.h"
#include "worker/prep.h"

#define SUBSYS "worker"

/* The base as copied for the object and each job: the layout and the buffer table are
   owned copies. */
typedef struct base_copy {
    tide__prep_base b;
    tide_layout_t *layout;
    void **bufs;
} base_copy;

/* A generation to prepare. */
typedef struct job {
    uint64_t gen; /* 0: none */
    tide_msg_t msg;
} job;

struct tide__prep {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_t thread;
    int started, stop;
    tide__gens_t *gens;
    base_copy base;
    job queued;            /* the next job (the newest generation asked for) */
    uint64_t running;      /* the generation of the job running now (0: none) */
    uint64_t started_gen;  /* the newest generation started or queued */
    uint64_t done_gen;     /* the newest generation whose job ended */
    uint64_t released_gen; /* a step ended while this generation's ack was held */
    tide_prepare_fn fn;    /* the program's (tide_set_prepare) */
    void *fn_ctx;
    int fn_busy;
    tide__prebuilt pre; /* what was built ahead (whole sets only) */
    int said_single;    /* the log said why nothing is built ahead */
};

static void base_clear(base_copy *c)
{
    tide_layout_destroy(&c->layout);
    tide_free(c->bufs);
    memset(c, 0, sizeof *c);
}

static tide_status base_copy_of(base_copy *c, const tide__prep_base *b)
{
    memset(c, 0, sizeof *c);
    c->b = *b;
    if (b->layout != NULL)
        TIDE_CHECK(tide_layout_copy(&c->layout, b->layout));
    size_t n = b->n_tensors ? b->n_tensors : 1;
    c->bufs = tide_calloc(n, sizeof *c->bufs);
    if (c->bufs == NULL) {
        base_clear(c);
        return tide_errorf(TIDE_ERR_NOMEM, "out of memory copying the preparation's base");
    }
    if (b->bufs != NULL)
        memcpy(c->bufs, b->bufs, b->n_tensors * sizeof *c->bufs);
    c->b.layout = c->layout;
    c->b.bufs = c->bufs;
    return TIDE_OK;
}

/* ---- the memory a job prepares ---------------------------------------------------------- */

static uint64_t staging_cap(const tide__prep_base *b)
{
    return b->staging_cap ? b->staging_cap : TIDE_EXEC_DEFAULT_STAGING_CAP;
}

/* Blocks for the new shards this rank will receive into fresh memory (those it did not
   hold, or that grow), allocated and first-touched now, within the room the switch's
   memory bound leaves: the pool may hold max(held, new state) + staging cap in the switch
   (its mem_limit), so it reserves up to that over what it holds now (blocks in use and
   cached). A shard that grows while others shrink needs a block even when the rank's total
   stays the same. */
static void reserve_pool(const tide__prep_base *b, const tide_view *cur, const tide_view *v)
{
    if (!v->member)
        return;
    uint64_t *sizes = tide_calloc(b->n_tensors ? b->n_tensors : 1, sizeof *sizes);
    if (sizes == NULL)
        return;
    uint64_t old_total = 0, new_total = 0;
    for (size_t i = 0; i < b->n_tensors; i++) {
        uint64_t o = cur->member ? tide_shard_bytes(b->layout, b->coll, i, cur->pp_rank,
                                                    cur->dp_rank, cur->tp_rank)
                                 : 0;
        uint64_t n = tide_shard_bytes(v->layout, b->coll, i, v->pp_rank, v->dp_rank, v->tp_rank);
        old_total += o;
        new_total += n;
        if (n > o)
            sizes[i] = n;
    }
    tide_mem_pool_stats ps;
    tide_mem_pool_stats_get(b->mem, &ps);
    uint64_t held = ps.in_use > old_total ? ps.in_use : old_total;
    uint64_t limit = (held > new_total ? held : new_total) + staging_cap(b);
    uint64_t room = limit > ps.in_use + ps.cached ? limit - ps.in_use - ps.cached : 0;
    /* room 0 would mean no bound to the pool: nothing is reserved then */
    if (room > 0 && tide_mem_pool_reserve(b->mem, sizes, b->n_tensors, room) != TIDE_OK)
        TIDE_WARN(SUBSYS, "rank %d: could not prepare pool memory for generation %llu: %s", b->rank,
                  (unsigned long long)v->generation, tide_last_error());
    tide_free(sizes);
}

/* The executor's tables of this rank alone, as the switch will pass them (in place). */
typedef struct spill_tables {
    int *parts, *rank_of;
    uint8_t *alive;
    uint64_t *ob, *nb, *sizes;
    const uint64_t **obr, **nbr;
} spill_tables;

static void spill_free(spill_tables *s)
{
    tide_free(s->parts);
    tide_free(s->rank_of);
    tide_free(s->alive);
    tide_free(s->ob);
    tide_free(s->nb);
    tide_free(s->sizes);
    tide_free(s->obr);
    tide_free(s->nbr);
}

static tide_status spill_alloc(spill_tables *s, size_t nw, size_t nt)
{
    memset(s, 0, sizeof *s);
    s->parts = tide_malloc(nw * sizeof *s->parts);
    s->rank_of = tide_malloc(nw * sizeof *s->rank_of);
    s->alive = tide_malloc(nw);
    s->ob = tide_calloc(nt, sizeof *s->ob);
    s->nb = tide_calloc(nt, sizeof *s->nb);
    s->sizes = tide_calloc(nt, sizeof *s->sizes);
    s->obr = tide_calloc(nw, sizeof *s->obr);
    s->nbr = tide_calloc(nw, sizeof *s->nbr);
    if (!s->parts || !s->rank_of || !s->alive || !s->ob || !s->nb || !s->sizes || !s->obr ||
        !s->nbr)
        return tide_errorf(TIDE_ERR_NOMEM, "out of memory");
    return TIDE_OK;
}

/* The spills the switch from prev to nl will make on this rank (sizes[i]), chosen as the
   executor chooses them over this rank's plan, every participant alive. */
static tide_status plan_spills(const tide__prep_base *b, const tide_view *cur, const tide_view *v,
                               const tide_layout_t *prev, const tide_layout_t *nl, spill_tables *s)
{
    size_t nw = (size_t)b->size;
    memset(s->alive, 1, nw);
    int np = tide__participants(prev, nl, NULL, b->size, s->parts);
    if (np <= 0)
        return tide_errorf(TIDE_ERR_NOMEM, "out of memory listing the participants");
    for (size_t r = 0; r < nw; r++)
        s->rank_of[r] = -1;
    for (int k = 0; k < np; k++)
        s->rank_of[s->parts[k]] = k;
    uint64_t state_old = 0, state_new = 0;
    for (size_t i = 0; i < b->n_tensors; i++) {
        s->ob[i] =
            tide_shard_bytes(b->layout, b->coll, i, cur->pp_rank, cur->dp_rank, cur->tp_rank);
        s->nb[i] = tide_shard_bytes(nl, b->coll, i, v->pp_rank, v->dp_rank, v->tp_rank);
        state_old += s->ob[i];
        state_new += s->nb[i];
    }
    s->obr[b->rank] = s->ob;
    s->nbr[b->rank] = s->nb;
    tide_plan_t *plan = NULL;
    TIDE_CHECK(tide_reshard_plan_for(prev, nl, b->coll, s->alive, nw, b->rank, &plan));
    tide_mem_pool_stats ps;
    tide_mem_pool_stats_get(b->mem, &ps);
    uint64_t held = ps.in_use > state_old ? ps.in_use : state_old;
    tide_exec_in_place ip = {b->mem,
                             b->rank,
                             (void **)b->bufs,
                             s->ob,
                             s->nb,
                             NULL,
                             (held > state_new ? held : state_new) + staging_cap(b),
                             b->mem_strict};
    tide_exec_args ea = {plan, nw, b->n_tensors, s->rank_of, NULL, NULL, s->obr, s->nbr, &ip};
    tide_exec_opts eo;
    tide_exec_opts_init(&eo);
    eo.staging_cap = b->staging_cap;
    eo.pool = b->mem;
    tide_status rc = tide_exec_plan_spills(b->be, np, s->rank_of[b->rank], &ea, &eo, s->sizes);
    tide_plan_destroy(&plan);
    return rc;
}

/* On a rank in both layouts (only such a rank holds old shards it may have to spill): the
   host spill blocks (pinned on a GPU) that the switch to pl's generation will take,
   prepared now, so that it neither allocates them nor frees them on its critical path. */
static void reserve_spill(const tide__prep_base *b, const tide_proto_layout_msg_t *pl,
                          const tide_view *cur, const tide_view *v)
{
    if (!v->member || !cur->member || pl->recover || pl->n_join_new > 0 || pl->n_leave > 0 ||
        !pl->has_prev)
        return;
    spill_tables s;
    tide_layout_t *prev = NULL, *nl = NULL;
    tide_status rc = spill_alloc(&s, (size_t)b->size, b->n_tensors ? b->n_tensors : 1);
    if (rc == TIDE_OK)
        rc = tide__layout_from_proto(&pl->prev, &prev);
    if (rc == TIDE_OK)
        rc = tide__layout_from_proto(&pl->layout, &nl);
    if (rc == TIDE_OK)
        rc = plan_spills(b, cur, v, prev, nl, &s);
    uint64_t total = 0;
    for (size_t i = 0; rc == TIDE_OK && i < b->n_tensors; i++)
        total += s.sizes[i];
    if (rc == TIDE_OK && total > 0) {
        rc = tide_mem_pool_spill_reserve(b->mem, s.sizes, b->n_tensors);
        if (rc == TIDE_OK)
            TIDE_INFO(SUBSYS,
                      "rank %d: %llu bytes of host spill memory prepared for generation %llu",
                      b->rank, (unsigned long long)total, (unsigned long long)v->generation);
    }
    if (rc != TIDE_OK)
        TIDE_WARN(SUBSYS,
                  "rank %d: could not prepare host spill memory for generation %llu: %s (the "
                  "switch allocates what it spills)",
                  b->rank, (unsigned long long)v->generation, tide_last_error());
    tide_layout_destroy(&prev);
    tide_layout_destroy(&nl);
    spill_free(&s);
}

/* The kernel reads this rank's current shards once (tide_mem_pool_warm), so that the
   switch's single copies out of them run at memory speed: shards received in an earlier
   switch were only populated. Already warm memory costs one memcpy. */
static void warm_state(const tide__prep_base *b, const tide_view *cur)
{
    for (size_t i = 0; cur->member && i < b->n_tensors; i++)
        if (b->bufs[i] != NULL)
            tide_mem_pool_warm(b->mem, b->bufs[i],
                               (size_t)tide_shard_bytes(b->layout, b->coll, i, cur->pp_rank,
                                                        cur->dp_rank, cur->tp_rank));
}

/* ---- a job ------------------------------------------------------------------------------ */

/* The program's preparation, for its place v in the new layout: tide_set_prepare waits
   while it runs, not while the communicators are built (that would tie the program to
   its peers' pace). */
static tide_status program_fn(tide__prep_t *p, const tide_view *v)
{
    pthread_mutex_lock(&p->mu);
    tide_prepare_fn fn = v->member ? p->fn : NULL;
    void *ctx = p->fn_ctx;
    p->fn_busy = fn != NULL;
    pthread_mutex_unlock(&p->mu);
    if (fn == NULL)
        return TIDE_OK;
    tide_status rc = fn(ctx, v);
    pthread_mutex_lock(&p->mu);
    p->fn_busy = 0;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    return rc;
}

/* What was built ahead becomes the result; an older one (a generation that went away) is
   freed. */
static void publish(tide__prep_t *p, tide__prebuilt *built)
{
    tide__prebuilt old;
    pthread_mutex_lock(&p->mu);
    old = p->pre;
    p->pre = *built;
    pthread_mutex_unlock(&p->mu);
    memset(built, 0, sizeof *built);
    tide__prebuilt_free(&old);
}

/* Generation gen's preparation: the communicators first (every participant builds them
   together, so they come before anything slow of this rank alone), then, on a member, the
   memory of the runtime-owned buffers and the program's function. */
static void run_job(tide__prep_t *p, const base_copy *bc, uint64_t gen,
                    const tide_proto_layout_msg_t *pl, const tide__gen_t *word)
{
    const tide__prep_base *b = &bc->b;
    tide_layout_t *l = NULL;
    if (b->coll == NULL || tide__layout_from_proto(&pl->layout, &l) != TIDE_OK) {
        tide_error_clear(); /* no job yet, or the switch step reports it */
        return;
    }
    tide_view v, cur;
    tide__fill_view(&v, gen, l, b->rank, -1);
    tide__fill_view(&cur, 0, b->layout, b->rank, 0);
    uint64_t t0 = tide_now_ns();
    if (pl->has_prev && !pl->recover && pl->n_join_new == 0 && pl->n_leave == 0 && !b->multi &&
        !p->said_single) {
        TIDE_INFO(SUBSYS,
                  "rank %d: communicators of announced layouts are built at the switch step, "
                  "not ahead: a rank of the pool initialised MPI below MPI_THREAD_MULTIPLE "
                  "(building them on the preparation thread needs it)",
                  b->rank);
        p->said_single = 1;
    }
    tide__prebuilt built;
    tide__prebuild(b, gen, pl, word, &built);
    if (built.gen != 0)
        publish(p, &built);
    if (b->owned) {
        reserve_pool(b, &cur, &v);
        reserve_spill(b, pl, &cur, &v);
        warm_state(b, &cur);
    }
    tide_status rc = program_fn(p, &v);
    if (rc != TIDE_OK)
        TIDE_WARN(SUBSYS,
                  "rank %d: preparing generation %llu failed (%s: %s); it switches unprepared",
                  b->rank, (unsigned long long)gen, tide_strerror(rc), tide_last_error());
    else if (v.member && (p->fn != NULL || b->owned))
        TIDE_INFO(SUBSYS, "rank %d: generation %llu prepared in %.1f ms", b->rank,
                  (unsigned long long)gen, (double)(tide_now_ns() - t0) / 1e6);
    tide_layout_destroy(&l);
}

/* The thread: one job at a time, bound to the rank's device before its first call. */
static void *prep_main(void *arg)
{
    tide__prep_t *p = arg;
    pthread_mutex_lock(&p->mu);
    const tide_coll_backend_v1 *be = p->base.b.be;
    int device = p->base.b.device;
    pthread_mutex_unlock(&p->mu);
    /* a new thread starts on device 0 */
    if (tide_coll_device_bind(be, device) != TIDE_OK)
        TIDE_WARN(SUBSYS, "preparation thread: cannot bind device %d: %s", device,
                  tide_last_error());
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->stop && p->queued.gen == 0)
            pthread_cond_wait(&p->cv, &p->mu);
        if (p->stop)
            break;
        job j = p->queued;
        memset(&p->queued, 0, sizeof p->queued);
        p->running = j.gen;
        base_copy bc;
        tide_status rc = base_copy_of(&bc, &p->base.b);
        pthread_mutex_unlock(&p->mu);
        tide__gen_t *word = tide__gens_get(p->gens, j.gen);
        /* a generation aborted (or replaced) before its job began is not prepared */
        if (rc == TIDE_OK && word != NULL && !tide__gen_aborted(word))
            run_job(p, &bc, j.gen, &j.msg.u.layout, word);
        tide__gen_put(&word);
        base_clear(&bc);
        tide_msg_clear(&j.msg);
        pthread_mutex_lock(&p->mu);
        p->running = 0;
        if (j.gen > p->done_gen)
            p->done_gen = j.gen;
        pthread_cond_broadcast(&p->cv);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

/* ---- the object ------------------------------------------------------------------------- */

tide_status tide__prep_new(tide__prep_t **out, tide__gens_t *gens)
{
    *out = NULL;
    tide__prep_t *p = tide_calloc(1, sizeof *p);
    if (p == NULL)
        return tide_errorf(TIDE_ERR_NOMEM, "out of memory for the preparation");
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    p->gens = gens;
    *out = p;
    return TIDE_OK;
}

tide_status tide__prep_rebase(tide__prep_t *p, const tide__prep_base *b)
{
    base_copy c;
    TIDE_CHECK(base_copy_of(&c, b));
    pthread_mutex_lock(&p->mu);
    base_copy old = p->base;
    p->base = c;
    int start = !p->started;
    p->started = 1;
    pthread_mutex_unlock(&p->mu);
    base_clear(&old);
    /* the thread starts with the first base: it needs the backend and device to bind */
    if (start && pthread_create(&p->thread, NULL, prep_main, p) != 0) {
        pthread_mutex_lock(&p->mu);
        p->started = 0;
        pthread_mutex_unlock(&p->mu);
        return tide_errorf(TIDE_ERR_IO, "cannot start the preparation thread");
    }
    return TIDE_OK;
}

void tide__prep_destroy(tide__prep_t **self_p)
{
    if (self_p == NULL || *self_p == NULL)
        return;
    tide__prep_t *p = *self_p;
    pthread_mutex_lock(&p->mu);
    p->stop = 1;
    int started = p->started;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    if (started)
        pthread_join(p->thread, NULL);
    tide__prebuilt_free(&p->pre);
    tide_msg_clear(&p->queued.msg);
    base_clear(&p->base);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv);
    tide_free(p);
    *self_p = NULL;
}

/* A deep copy of a layout message (through its encoding: one reader, one writer). */
static tide_status copy_layout_msg(const tide_proto_layout_msg_t *pl, tide_msg_t *out)
{
    tide_msg_t m;
    tide_msg_init(&m, TIDE_MSG_LAYOUT);
    m.u.layout = *pl; /* borrowed for the encoding only */
    tide_proto_buf_t b;
    tide_proto_buf_init(&b);
    tide_status rc = tide_proto_encode(&m, &b);
    if (rc == TIDE_OK)
        rc = tide_proto_decode(b.data, b.len, out);
    tide_proto_buf_destroy(&b);
    return rc;
}

void tide__prep_start(tide__prep_t *p, uint64_t gen, const tide_proto_layout_msg_t *pl)
{
    tide_msg_t copy;
    tide_msg_init(&copy, TIDE_MSG_NONE);
    pthread_mutex_lock(&p->mu);
    int fresh = gen > p->started_gen && p->started;
    pthread_mutex_unlock(&p->mu);
    if (!fresh)
        return;
    if (copy_layout_msg(pl, &copy) != TIDE_OK) {
        TIDE_WARN(SUBSYS, "cannot prepare generation %llu (%s); it switches unprepared",
                  (unsigned long long)gen, tide_last_error());
        pthread_mutex_lock(&p->mu);
        p->started_gen = p->done_gen = gen > p->done_gen ? gen : p->done_gen;
        pthread_cond_broadcast(&p->cv);
        pthread_mutex_unlock(&p->mu);
        return;
    }
    pthread_mutex_lock(&p->mu);
    tide_msg_t older = p->queued.msg;
    p->queued.gen = gen;
    p->queued.msg = copy;
    p->started_gen = gen;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    tide_msg_clear(&older);
}

int tide__prep_ready(tide__prep_t *p, uint64_t gen)
{
    pthread_mutex_lock(&p->mu);
    int ready = !p->started || p->done_gen >= gen || p->released_gen >= gen;
    pthread_mutex_unlock(&p->mu);
    return ready;
}

void tide__prep_release(tide__prep_t *p)
{
    pthread_mutex_lock(&p->mu);
    p->released_gen = p->started_gen;
    pthread_mutex_unlock(&p->mu);
}

void tide__prep_wait(tide__prep_t *p, uint64_t gen)
{
    pthread_mutex_lock(&p->mu);
    while (p->running != 0 || (p->queued.gen != 0 && p->queued.gen <= gen))
        pthread_cond_wait(&p->cv, &p->mu);
    pthread_mutex_unlock(&p->mu);
}

void tide__prep_set_fn(tide__prep_t *p, tide_prepare_fn fn, void *ctx)
{
    pthread_mutex_lock(&p->mu);
    while (p->fn_busy) /* the program's function runs: ctx stays its own until it ends */
        pthread_cond_wait(&p->cv, &p->mu);
    p->fn = fn;
    p->fn_ctx = ctx;
    if (fn == NULL)
        p->released_gen = p->started_gen; /* an ack held for it goes out */
    pthread_mutex_unlock(&p->mu);
}

int tide__prep_take(tide__prep_t *p, uint64_t gen, const int *parts, int np, tide_coll_comm_t **sw,
                    tide_coll_comm_t **g, tide_plan_t **plan)
{
    pthread_mutex_lock(&p->mu);
    tide__prebuilt *b = &p->pre;
    int ok = b->gen == gen && b->sw != NULL && b->np == np &&
             memcmp(b->parts, parts, (size_t)np * sizeof *parts) == 0 &&
             !tide_coll_comm_aborted(b->sw);
    for (int k = 0; ok && k < 4; k++)
        ok = b->g[k] == NULL || !tide_coll_comm_aborted(b->g[k]);
    tide__prebuilt got;
    memset(&got, 0, sizeof got);
    if (ok) {
        got = *b;
        memset(b, 0, sizeof *b);
    }
    pthread_mutex_unlock(&p->mu);
    if (!ok)
        return 0;
    *sw = got.sw;
    for (int k = 0; k < 4; k++)
        g[k] = got.g[k];
    *plan = got.plan;
    tide_free(got.parts);
    return 1;
}

void tide__prep_drop(tide__prep_t *p, uint64_t keep)
{
    tide__prebuilt b;
    memset(&b, 0, sizeof b);
    pthread_mutex_lock(&p->mu);
    if (p->pre.gen != 0 && (p->pre.gen != keep || tide_coll_comm_aborted(p->pre.sw))) {
        b = p->pre;
        memset(&p->pre, 0, sizeof p->pre);
    }
    pthread_mutex_unlock(&p->mu);
    if (b.gen != 0)
        TIDE_DEBUG(SUBSYS,
                   "freed the communicators built ahead for generation %llu, which went "
                   "away",
                   (unsigned long long)b.gen);
    tide__prebuilt_free(&b);
}
