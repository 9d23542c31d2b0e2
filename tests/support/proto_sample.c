/*
 * Test support: random valid proto messages and records for property tests, fuzz seed
 * corpora and load generators (kept out of tide_proto: generators do not ship). Every
 * struct field is set explicitly (not through the schema tables), so a round trip
 * through encode/decode checks the tables too.
 * Values hit their limits often (0, maxima, longest strings) because that is
 * where encoders and decoders break. Arrays stay small to keep tests fast.
 */
#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "tests/support/proto_sample.h"

typedef struct rng {
    uint64_t *s;
} rng_t;

static uint64_t next(rng_t *r)
{
    uint64_t x = *r->s ? *r->s : 0x9e3779b97f4a7c15ull;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    *r->s = x;
    return x * 0x2545f4914f6cdd1dull;
}

/* Uniform-ish in [lo, hi], with lo and hi themselves one time in four. */
static uint64_t urange(rng_t *r, uint64_t lo, uint64_t hi)
{
    uint64_t k = next(r);
    if ((k & 7) == 0)
        return lo;
    if ((k & 7) == 1)
        return hi;
    uint64_t span = hi - lo;
    if (span == UINT64_MAX)
        return next(r);
    return lo + next(r) % (span + 1);
}

static int64_t irange(rng_t *r, int64_t lo, int64_t hi)
{
    return (int64_t)((uint64_t)lo + urange(r, 0, (uint64_t)hi - (uint64_t)lo));
}

static double drange(rng_t *r, double lo, double hi)
{
    uint64_t k = next(r) & 7;
    if (k == 0)
        return lo;
    if (k == 1)
        return hi;
    return lo + (hi - lo) * ((double)(next(r) >> 11) / 9007199254740992.0);
}

static const char name_chars[] =
    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-:";

/* Random string into dst (capacity cap incl. NUL), length [minlen, maxlen]. */
static void rstr(rng_t *r, char *dst, size_t minlen, size_t maxlen, int cls)
{
    size_t n = (size_t)urange(r, minlen, maxlen);
    for (size_t i = 0; i < n; i++) {
        if (cls == 0)
            dst[i] = name_chars[next(r) % (sizeof name_chars - 1)];
        else if (cls == 1)
            dst[i] = (char)(0x21 + next(r) % 94); /* printable, no space */
        else if (cls == 3)
            dst[i] = (char)(0x20 + next(r) % 95); /* printable, space too */
        else
            dst[i] = (char)(1 + next(r) % 255); /* any byte but NUL */
    }
    dst[n] = '\0';
}

#define NAME(r, dst)  rstr(r, dst, 1, TIDE_PROTO_NAME_MAX, 0)
#define NAME0(r, dst) rstr(r, dst, 0, TIDE_PROTO_NAME_MAX, 0)
#define HOST(r, dst)  rstr(r, dst, 1, TIDE_PROTO_HOST_MAX, 1)
#define TEXT(r, dst)  rstr(r, dst, 0, TIDE_PROTO_TEXT_MAX, 2)

static int32_t worker_id(rng_t *r)
{
    return (int32_t)urange(r, 0, INT32_MAX);
}

/* A layout of at most 64 workers with random uneven stages. */
static tide_status layout(rng_t *r, tide_proto_layout_t *l, uint64_t gen)
{
    l->gen = gen;
    l->dp = (int)urange(r, 1, 4);
    l->tp = (int)urange(r, 1, 4);
    l->pp = (int)urange(r, 1, 4);
    l->num_layers = l->pp + (int)urange(r, 0, 20);
    l->micro_batches = (int)urange(r, 1, TIDE_PROTO_MICRO_MAX);
    size_t n = (size_t)l->dp * (size_t)l->tp * (size_t)l->pp;
    l->stage_start = tide_malloc(((size_t)l->pp + 1) * sizeof(int));
    l->worker = tide_malloc(n * sizeof(int32_t));
    if (l->stage_start == NULL || l->worker == NULL)
        return tide_errorf(TIDE_ERR_NOMEM, "out of memory sampling a layout");
    /* every stage gets one layer, the extra layers go to random stages */
    int extra = l->num_layers - l->pp;
    l->stage_start[0] = 0;
    for (int s = 1; s <= l->pp; s++) {
        int take = s == l->pp ? extra : (int)urange(r, 0, (uint64_t)extra);
        extra -= take;
        l->stage_start[s] = l->stage_start[s - 1] + 1 + take;
    }
    for (size_t i = 0; i < n; i++)
        l->worker[i] = (next(r) & 1) ? (int32_t)i : worker_id(r);
    return TIDE_OK;
}

/* Random typed fields of an event (the events reply's rows and the event_fields record). */
static tide_status event_fields_fill(rng_t *r, tide_proto_event_fields_t *f)
{
    memset(f, 0, sizeof *f);
    f->gen = urange(r, 0, UINT64_MAX);
    if (next(r) & 1) {
        f->dp = (int)urange(r, 1, TIDE_PROTO_DEGREE_MAX);
        f->tp = (int)urange(r, 1, TIDE_PROTO_DEGREE_MAX);
        f->pp = (int)urange(r, 1, TIDE_PROTO_DEGREE_MAX);
    }
    if (next(r) & 1) {
        f->from_dp = (int)urange(r, 1, TIDE_PROTO_DEGREE_MAX);
        f->from_tp = (int)urange(r, 1, TIDE_PROTO_DEGREE_MAX);
        f->from_pp = (int)urange(r, 1, TIDE_PROTO_DEGREE_MAX);
    }
    uint32_t n = (uint32_t)urange(r, 0, 6);
    if (n > 0) {
        f->workers = tide_malloc(n * sizeof *f->workers);
        if (f->workers == NULL)
            return tide_errorf(TIDE_ERR_NOMEM, "out of memory sampling event workers");
        for (uint32_t i = 0; i < n; i++)
            f->workers[i] = (int32_t)urange(r, 0, INT32_MAX);
    }
    f->n_workers = n;
    rstr(r, f->host, 0, TIDE_PROTO_HOST_MAX, 1);
    f->step = irange(r, -1, INT64_MAX);
    f->steps_lost = irange(r, 0, INT64_MAX);
    f->bytes = urange(r, 0, UINT64_MAX);
    f->ms = drange(r, 0.0, TIDE_PROTO_MS_MAX);
    f->downtime_ms = (next(r) & 1) ? drange(r, 0.0, TIDE_PROTO_MS_MAX) : 0.0;
    f->bubbles = (int)(next(r) & 1);
    rstr(r, f->reason, 0, TIDE_PROTO_REASON_MAX, 3);
    return TIDE_OK;
}

static tide_status argv_fill(rng_t *r, char ***argv, uint32_t *argc, uint32_t min)
{
    uint32_t n = (uint32_t)urange(r, min, 5);
    *argc = 0;
    *argv = n ? tide_calloc(n, sizeof(char *)) : NULL;
    if (n && *argv == NULL)
        return tide_errorf(TIDE_ERR_NOMEM, "out of memory sampling argv");
    *argc = n;
    for (uint32_t i = 0; i < n; i++) {
        size_t len = (size_t)urange(r, 0, (next(r) & 15) == 0 ? TIDE_PROTO_ARG_MAX : 16);
        (*argv)[i] = tide_malloc(len + 1);
        if ((*argv)[i] == NULL)
            return tide_errorf(TIDE_ERR_NOMEM, "out of memory sampling argv");
        rstr(r, (*argv)[i], len, len, 2);
    }
    return TIDE_OK;
}

/* One tensor of a model of num_layers layers. */
static void tensor(rng_t *r, tide_proto_tensor_t *t, int num_layers)
{
    rstr(r, t->name, 1, TIDE_PROTO_TENSOR_NAME_MAX, 2);
    t->dtype = (int)urange(r, 0, 6);
    t->ndim = (int)urange(r, 1, TIDE_PROTO_DIMS_MAX);
    for (int d = 0; d < t->ndim; d++)
        t->shape[d] = irange(r, 1, INT64_MAX);
    t->layer = (int)irange(r, -3, num_layers - 1);
    t->tp = (int)urange(r, 0, 1);
    t->tp_dim = (int)urange(r, 0, (uint64_t)t->ndim - 1);
    t->tp_segments = (int)urange(r, 1, INT32_MAX);
    t->dp = (int)urange(r, 0, 1);
}

/* 0..4 fit rules with degrees in [0, max_degree]. */
static tide_status fit_fill(rng_t *r, tide_proto_fit_t **fit, uint32_t *n_fit, int max_degree)
{
    uint32_t nf = (uint32_t)urange(r, 0, 4);
    *fit = nf ? tide_calloc(nf, sizeof **fit) : NULL;
    if (nf && *fit == NULL)
        return tide_errorf(TIDE_ERR_NOMEM, "out of memory sampling fit rules");
    *n_fit = nf;
    for (uint32_t i = 0; i < nf; i++) {
        (*fit)[i].degree = (int)urange(r, 0, (uint64_t)max_degree);
        (*fit)[i].n = irange(r, 1, TIDE_PROTO_FIT_N_MAX);
        rstr(r, (*fit)[i].what, 0, TIDE_PROTO_FIT_WHAT_MAX, 3);
    }
    return TIDE_OK;
}

/* One heartbeat of worker `worker`. */
static void beat(rng_t *r, tide_proto_heartbeat_t *x, int32_t worker)
{
    x->worker = worker;
    x->step = urange(r, 0, UINT64_MAX);
    x->gen = urange(r, 0, UINT64_MAX);
    x->idle_ms = drange(r, 0, TIDE_PROTO_MS_MAX);
    x->bubble_ms = drange(r, 0, 1000);
    x->filled_ms = drange(r, 0, x->bubble_ms);
    x->step_ms = drange(r, 0, 1e4);
}

static void *rows(size_t n, size_t size)
{
    return n ? tide_calloc(n, size) : NULL;
}

/* One shard of coordinate (p, d, t) in chunks of `chunk` bytes: 1..4 chunks, the last one
   often short. */
static tide_status shard(rng_t *r, tide_proto_ckpt_shard_t *s, uint32_t chunk, int p, int d, int t)
{
    s->p = p;
    s->d = d;
    s->t = t;
    s->bytes = urange(r, 1, (uint64_t)chunk * urange(r, 1, 4));
    uint64_t n = s->bytes / chunk + (s->bytes % chunk != 0);
    s->hashes = tide_malloc((size_t)n * sizeof *s->hashes);
    if (s->hashes == NULL)
        return tide_errorf(TIDE_ERR_NOMEM, "out of memory sampling chunk hashes");
    s->n_hashes = (uint32_t)n;
    for (uint64_t k = 0; k < n; k++)
        s->hashes[k] = next(r);
    return TIDE_OK;
}

/* A checkpoint manifest: a few tensors, a shard for some coordinates of its layout. */
static tide_status manifest(rng_t *r, tide_proto_ckpt_manifest_t *x)
{
    x->format = (uint32_t)urange(r, 2, 65535);
    x->chunk = (uint32_t)urange(r, 1, TIDE_PROTO_CHUNK_MAX);
    x->step = irange(r, 0, INT64_MAX);
    x->save_id = urange(r, 0, UINT64_MAX);
    x->check = urange(r, 0, UINT64_MAX);
    TIDE_CHECK(layout(r, &x->layout, 0));
    uint32_t n = (uint32_t)urange(r, 0, 6);
    x->tensors = rows(n, sizeof *x->tensors);
    if (n && x->tensors == NULL)
        return tide_errorf(TIDE_ERR_NOMEM, "out of memory sampling tensors");
    x->n_tensors = n;
    for (uint32_t i = 0; i < n; i++)
        tensor(r, &x->tensors[i], x->layout.num_layers);
    const tide_proto_layout_t *l = &x->layout;
    size_t coords = (size_t)l->dp * (size_t)l->tp * (size_t)l->pp;
    x->shards = rows(coords, sizeof *x->shards);
    if (x->shards == NULL)
        return tide_errorf(TIDE_ERR_NOMEM, "out of memory sampling shards");
    for (size_t k = 0; k < coords && x->n_shards < 8; k++)
        if (next(r) & 1) /* (p, d, t) order: the layout's index order */
            TIDE_CHECK(shard(r, &x->shards[x->n_shards++], x->chunk,
                             (int)(k / ((size_t)l->dp * (size_t)l->tp)),
                             (int)(k / (size_t)l->tp % (size_t)l->dp), (int)(k % (size_t)l->tp)));
    return TIDE_OK;
}

/* The records (stored, never sent). */
static tide_status fill_record(rng_t *r, tide_msg_t *m)
{
    switch (m->type) {
    case TIDE_MSG_JOB_LAYOUT:
        return layout(r, &m->u.job_layout.layout, urange(r, 0, UINT64_MAX));
    case TIDE_MSG_JOB_POOLS: {
        tide_proto_job_pools_t *x = &m->u.job_pools;
        uint32_t n = (uint32_t)urange(r, 0, 4);
        x->pools = rows(n, sizeof *x->pools);
        if (n && x->pools == NULL)
            return tide_errorf(TIDE_ERR_NOMEM, "out of memory sampling pools");
        x->n_pools = n;
        for (uint32_t i = 0; i < n; i++) {
            tide_proto_job_pool_t *p = &x->pools[i];
            NAME(r, p->name);
            p->size = (int32_t)urange(r, 1, TIDE_PROTO_WORKERS_MAX / 4);
            p->left = (next(r) & 3) == 0 ? urange(r, 1, UINT64_MAX) : 0;
            p->connected = p->left == 0 && (next(r) & 1);
        }
        return TIDE_OK;
    }
    case TIDE_MSG_JOB_FIT:
        return fit_fill(r, &m->u.job_fit.fit, &m->u.job_fit.n_fit, 3);
    case TIDE_MSG_EVENT_FIELDS:
        return event_fields_fill(r, &m->u.event_fields);
    case TIDE_MSG_JOB_CKPTS: {
        tide_proto_job_ckpts_t *x = &m->u.job_ckpts;
        uint32_t n = (uint32_t)urange(r, 0, TIDE_PROTO_CKPTS_MAX);
        x->ckpts = rows(n, sizeof *x->ckpts);
        if (n && x->ckpts == NULL)
            return tide_errorf(TIDE_ERR_NOMEM, "out of memory sampling checkpoints");
        x->n_ckpts = n;
        int64_t step = irange(r, 0, 1000);
        for (uint32_t i = 0; i < n; i++) {
            x->ckpts[i].step = step;
            step += irange(r, 1, 1000);
            rstr(r, x->ckpts[i].dir, 1, TIDE_PROTO_TEXT_MAX, 2);
        }
        if (n > 0 && (next(r) & 3) == 0) /* above every earlier one (each at most 9000) */
            x->ckpts[n - 1].step = INT64_MAX;
        return TIDE_OK;
    }
    case TIDE_MSG_JOB_ARGV:
        return argv_fill(r, &m->u.job_argv.argv, &m->u.job_argv.argc, 0);
    case TIDE_MSG_CKPT_MANIFEST:
        return manifest(r, &m->u.ckpt_manifest);
    case TIDE_MSG_CKPT_SUM: {
        tide_proto_ckpt_sum_t *x = &m->u.ckpt_sum;
        x->save_id = urange(r, 0, UINT64_MAX);
        x->chunk = (uint32_t)urange(r, 1, TIDE_PROTO_CHUNK_MAX);
        x->check = urange(r, 0, UINT64_MAX);
        return shard(r, &x->shard, x->chunk, (int)urange(r, 0, TIDE_PROTO_DEGREE_MAX - 1),
                     (int)urange(r, 0, TIDE_PROTO_DEGREE_MAX - 1),
                     (int)urange(r, 0, TIDE_PROTO_DEGREE_MAX - 1));
    }
    default:
        return tide_errorf(TIDE_ERR_INVALID, "cannot sample message type %d", (int)m->type);
    }
}

/* An allocation: none half of the time, else Slurm's. */
static void sample_alloc(rng_t *r, tide_proto_alloc_t *a)
{
    memset(a, 0, sizeof *a);
    if (next(r) & 1)
        return;
    snprintf(a->sched, sizeof a->sched, "slurm");
    size_t n = (size_t)urange(r, 1, TIDE_PROTO_ALLOC_ID_MAX);
    for (size_t i = 0; i < n; i++)
        a->id[i] = i > 0 && (next(r) & 7) == 0 ? '_' : (char)('0' + next(r) % 10);
    a->id[n] = '\0';
    rstr(r, a->nodes, 0, TIDE_PROTO_TEXT_MAX, 1);
    rstr(r, a->node, 0, TIDE_PROTO_HOST_MAX, 1);
    rstr(r, a->gpus, 0, TIDE_PROTO_GPUS_MAX, 1);
    rstr(r, a->partition, 0, TIDE_PROTO_NAME_MAX, 1);
    a->restarts = (int)urange(r, 0, INT32_MAX);
}

static tide_status fill(rng_t *r, tide_msg_t *m)
{
    switch (m->type) {
    case TIDE_MSG_REGISTER: {
        tide_proto_register_t *x = &m->u.reg;
        NAME(r, x->pool);
        x->size = (int)urange(r, 1, TIDE_PROTO_WORKERS_MAX);
        x->rank = (int)urange(r, 0, (uint64_t)x->size - 1);
        HOST(r, x->host);
        x->device = (int)urange(r, 0, TIDE_PROTO_DEVICE_MAX);
        x->mem_bytes = urange(r, 0, UINT64_MAX);
        x->kind = (tide_proto_device_kind_t)urange(r, 0, 1);
        x->pid = (int)urange(r, 1, INT32_MAX);
        sample_alloc(r, &x->alloc);
        return TIDE_OK;
    }
    case TIDE_MSG_REGISTER_OK:
        m->u.register_ok.worker = worker_id(r);
        m->u.register_ok.heartbeat_ms = (int)urange(r, 10, 600000);
        m->u.register_ok.fail_ms =
            (int)urange(r, (uint64_t)m->u.register_ok.heartbeat_ms, INT32_MAX);
        return TIDE_OK;
    case TIDE_MSG_HEARTBEAT:
        beat(r, &m->u.heartbeat, worker_id(r));
        return TIDE_OK;
    case TIDE_MSG_HOST_HEARTBEAT: {
        tide_proto_host_heartbeat_t *x = &m->u.host_heartbeat;
        uint32_t n = (uint32_t)urange(r, 1, 8);
        x->beats = rows(n, sizeof *x->beats);
        if (x->beats == NULL)
            return tide_errorf(TIDE_ERR_NOMEM, "out of memory sampling heartbeats");
        x->n_beats = n;
        /* ascending worker ids (a host's ranks), the sender one of them */
        int32_t id = (int32_t)urange(r, 0, INT32_MAX - 8 * 1000);
        for (uint32_t i = 0; i < n; i++) {
            beat(r, &x->beats[i], id);
            id += (int32_t)urange(r, 1, 1000);
        }
        x->worker = x->beats[urange(r, 0, n - 1)].worker;
        return TIDE_OK;
    }
    case TIDE_MSG_BYE:
        m->u.bye.worker = worker_id(r);
        return TIDE_OK;
    case TIDE_MSG_JOIN: {
        tide_proto_join_t *x = &m->u.join;
        x->worker = worker_id(r);
        NAME(r, x->job);
        x->total_bytes = urange(r, 0, UINT64_MAX);
        x->num_layers = (int)urange(r, 4, TIDE_PROTO_LAYERS_MAX);
        x->dp = (int)urange(r, 1, 8);
        x->tp = (int)urange(r, 1, 8);
        x->pp = (int)urange(r, 1, 4);
        x->micro_batches = (int)urange(r, 1, TIDE_PROTO_MICRO_MAX);
        uint32_t n = (uint32_t)urange(r, 0, 6);
        x->tensors = rows(n, sizeof *x->tensors);
        if (n && x->tensors == NULL)
            return tide_errorf(TIDE_ERR_NOMEM, "out of memory sampling tensors");
        x->n_tensors = n;
        for (uint32_t i = 0; i < n; i++)
            tensor(r, &x->tensors[i], x->num_layers);
        if (next(r) & 1) { /* bounds and priority declared at launch, or left out */
            x->min_gpus = (int32_t)urange(r, 1, 64);
            x->max_gpus = (int32_t)urange(r, 1, 1 << 20);
            x->priority = (int32_t)urange(r, 0, 100);
        }
        return fit_fill(r, &x->fit, &x->n_fit, 2);
    }
    case TIDE_MSG_LAYOUT: {
        tide_proto_layout_msg_t *x = &m->u.layout;
        NAME(r, x->job);
        uint64_t gen = urange(r, 1, UINT64_MAX);
        TIDE_CHECK(layout(r, &x->layout, gen));
        x->has_prev = (int)(next(r) & 1);
        if (x->has_prev) {
            TIDE_CHECK(layout(r, &x->prev, urange(r, 0, gen - 1)));
            /* the same model: adopt the new layout's layer count, re-spread the stages */
            x->prev.num_layers = x->layout.num_layers;
            if (x->prev.pp > x->prev.num_layers)
                x->prev.pp = x->prev.num_layers; /* still <= 4 entries allocated */
            for (int s = 0; s < x->prev.pp; s++)
                x->prev.stage_start[s] = s;
            x->prev.stage_start[x->prev.pp] = x->prev.num_layers;
        }
        x->world = (int32_t)urange(r, 1, 64);
        x->base = (int32_t)urange(r, 0, (uint64_t)x->world - 1);
        x->recover = x->has_prev && (next(r) & 1);
        if (x->has_prev && x->world >= 2 && (next(r) & 1)) {
            /* a join: ranks [0, cut) already connected, [cut, world) joining */
            int32_t cut = (int32_t)urange(r, 1, (uint64_t)x->world - 1);
            x->n_join_old = (uint32_t)cut;
            x->n_join_new = (uint32_t)(x->world - cut);
            x->join_old = tide_malloc(x->n_join_old * sizeof *x->join_old);
            x->join_new = tide_malloc(x->n_join_new * sizeof *x->join_new);
            if (x->join_old == NULL || x->join_new == NULL)
                return tide_errorf(TIDE_ERR_NOMEM, "out of memory sampling a join");
            for (int32_t k = 0; k < x->world; k++) {
                if (k < cut)
                    x->join_old[k] = k;
                else
                    x->join_new[k - cut] = k;
            }
        } else if (x->has_prev && (next(r) & 1)) {
            /* a release: the layout on job ranks [0, n) of the launches that stay, ranks
               [cut, world) leaving */
            int32_t n = x->layout.dp * x->layout.tp * x->layout.pp;
            if (x->world <= n)
                x->world = n + 1 + (int32_t)urange(r, 0, 8);
            x->base = (int32_t)urange(r, 0, (uint64_t)x->world - 1);
            int32_t cut = (int32_t)urange(r, (uint64_t)n, (uint64_t)x->world - 1);
            for (int32_t k = 0; k < n; k++)
                x->layout.worker[k] = k;
            x->n_stay = (uint32_t)cut;
            x->n_leave = (uint32_t)(x->world - cut);
            x->stay = tide_malloc((cut ? (size_t)cut : 1) * sizeof *x->stay);
            x->leave = tide_malloc(x->n_leave * sizeof *x->leave);
            if (x->stay == NULL || x->leave == NULL)
                return tide_errorf(TIDE_ERR_NOMEM, "out of memory sampling a release");
            for (int32_t k = 0; k < x->world; k++) {
                if (k < cut)
                    x->stay[k] = k;
                else
                    x->leave[k - cut] = k;
            }
        }
        if (x->recover && (next(r) & 1)) {
            rstr(r, x->ckpt, 1, TIDE_PROTO_TEXT_MAX, 2);
            x->ckpt_step = urange(r, 0, UINT64_MAX);
        }
        return TIDE_OK;
    }
    case TIDE_MSG_JOB_END:
        NAME(r, m->u.job_end.job);
        m->u.job_end.step = urange(r, 0, UINT64_MAX);
        return TIDE_OK;
    case TIDE_MSG_RELEASE:
        NAME(r, m->u.release.job);
        m->u.release.gen = urange(r, 1, UINT64_MAX);
        return TIDE_OK;
    case TIDE_MSG_JOIN_PORT:
        m->u.join_port.worker = worker_id(r);
        NAME(r, m->u.join_port.job);
        m->u.join_port.gen = urange(r, 0, UINT64_MAX);
        rstr(r, m->u.join_port.port, 1, TIDE_PROTO_TEXT_MAX, 2);
        return TIDE_OK;
    case TIDE_MSG_PREPARE:
        NAME(r, m->u.prepare.job);
        m->u.prepare.gen = urange(r, 0, UINT64_MAX);
        m->u.prepare.step = urange(r, 0, UINT64_MAX);
        return TIDE_OK;
    case TIDE_MSG_PREPARE_ACK:
        m->u.prepare_ack.worker = worker_id(r);
        NAME(r, m->u.prepare_ack.job);
        m->u.prepare_ack.gen = urange(r, 0, UINT64_MAX);
        m->u.prepare_ack.step = urange(r, 0, UINT64_MAX);
        return TIDE_OK;
    case TIDE_MSG_COMMIT:
        NAME(r, m->u.commit.job);
        m->u.commit.gen = urange(r, 0, UINT64_MAX);
        m->u.commit.step = urange(r, 0, UINT64_MAX);
        m->u.commit.recover = (int)urange(r, 0, 1);
        return TIDE_OK;
    case TIDE_MSG_ABORT:
        NAME(r, m->u.abort_.job);
        m->u.abort_.gen = urange(r, 0, UINT64_MAX);
        TEXT(r, m->u.abort_.reason);
        return TIDE_OK;
    case TIDE_MSG_DONE: {
        tide_proto_done_t *x = &m->u.done;
        x->worker = worker_id(r);
        NAME(r, x->job);
        x->gen = urange(r, 0, UINT64_MAX);
        x->status = (int)irange(r, -1000, 0);
        x->bytes_moved = urange(r, 0, UINT64_MAX);
        x->ms = drange(r, 0, TIDE_PROTO_MS_MAX);
        return TIDE_OK;
    }
    case TIDE_MSG_FENCED:
        m->u.fenced.worker = worker_id(r);
        NAME0(r, m->u.fenced.job);
        m->u.fenced.gen = urange(r, 0, UINT64_MAX);
        TEXT(r, m->u.fenced.reason);
        return TIDE_OK;
    case TIDE_MSG_LIVENESS:
    case TIDE_MSG_LIVENESS_REPLY: {
        int reply = m->type == TIDE_MSG_LIVENESS_REPLY;
        uint32_t n = (uint32_t)urange(r, 1, 8);
        int32_t *ranks = tide_malloc(n * sizeof *ranks);
        int32_t *alive = reply ? tide_malloc(n * sizeof *alive) : NULL;
        if (ranks == NULL || (reply && alive == NULL)) {
            tide_free(ranks);
            tide_free(alive);
            return tide_errorf(TIDE_ERR_NOMEM, "out of memory sampling ranks");
        }
        /* strictly increasing, often ending at the largest job rank */
        int32_t at = (int32_t)urange(r, 0, 16);
        for (uint32_t i = 0; i < n; i++) {
            ranks[i] = at;
            at += (int32_t)urange(r, 1, 1000);
        }
        if ((next(r) & 3) == 0) /* above every earlier one (each at most 8016) */
            ranks[n - 1] = (int32_t)TIDE_PROTO_WORKERS_MAX - 1;
        for (uint32_t i = 0; reply && i < n; i++)
            alive[i] = (int32_t)(next(r) & 1);
        if (reply) {
            tide_proto_liveness_reply_t *x = &m->u.liveness_reply;
            NAME(r, x->job);
            x->ranks = ranks;
            x->n_ranks = n;
            x->alive = alive;
            x->n_alive = n;
        } else {
            tide_proto_liveness_t *x = &m->u.liveness;
            x->worker = worker_id(r);
            NAME(r, x->job);
            x->ranks = ranks;
            x->n_ranks = n;
        }
        return TIDE_OK;
    }
    case TIDE_MSG_HALT:
        NAME(r, m->u.halt.job);
        m->u.halt.gen = urange(r, 0, UINT64_MAX);
        m->u.halt.code = (int)irange(r, -1000, -1);
        TEXT(r, m->u.halt.reason);
        return TIDE_OK;
    case TIDE_MSG_SAVE:
        NAME(r, m->u.save.job);
        rstr(r, m->u.save.dir, 1, TIDE_PROTO_TEXT_MAX, 2);
        m->u.save.step = urange(r, 0, UINT64_MAX);
        m->u.save.id = urange(r, 0, UINT64_MAX);
        m->u.save.phase = (uint32_t)urange(r, TIDE_PROTO_SAVE_PROPOSE, TIDE_PROTO_SAVE_DROP);
        return TIDE_OK;
    case TIDE_MSG_SAVE_ACK:
        m->u.save_ack.worker = worker_id(r);
        NAME(r, m->u.save_ack.job);
        m->u.save_ack.id = urange(r, 1, UINT64_MAX);
        m->u.save_ack.step = urange(r, 0, UINT64_MAX);
        m->u.save_ack.done = urange(r, 0, UINT64_MAX);
        m->u.save_ack.member = (int)urange(r, 0, 1);
        return TIDE_OK;
    case TIDE_MSG_SAVED: {
        tide_proto_saved_t *x = &m->u.saved;
        x->worker = worker_id(r);
        NAME(r, x->job);
        x->step = urange(r, 0, UINT64_MAX);
        rstr(r, x->dir, 1, TIDE_PROTO_TEXT_MAX, 2);
        x->code = (int)irange(r, -1000, 0);
        if (x->code != 0)
            TEXT(r, x->reason);
        return TIDE_OK;
    }
    case TIDE_MSG_FAILURE: {
        tide_proto_failure_t *x = &m->u.failure;
        x->worker = worker_id(r);
        NAME0(r, x->job);
        x->gen = urange(r, 0, UINT64_MAX);
        x->code = (int)irange(r, -1000, 0);
        TEXT(r, x->reason);
        return TIDE_OK;
    }
    case TIDE_MSG_LEAVE:
        m->u.leave.worker = worker_id(r);
        TEXT(r, m->u.leave.reason);
        return TIDE_OK;
    case TIDE_MSG_OFFLINE_ASSIGN: {
        tide_proto_offline_assign_t *x = &m->u.offline_assign;
        NAME(r, x->job);
        x->kind = (next(r) & 1) ? TIDE_JOB_COMMAND : TIDE_JOB_PLUGIN;
        if (x->kind == TIDE_JOB_PLUGIN)
            NAME(r, x->plugin);
        TIDE_CHECK(argv_fill(r, &x->argv, &x->argc, x->kind == TIDE_JOB_COMMAND ? 1 : 0));
        x->priority = (int)irange(r, -1000, 1000);
        x->mem_cap = urange(r, 0, UINT64_MAX);
        x->bubbles = (int)(next(r) & 1);
        x->attempt = (uint32_t)urange(r, 1, UINT32_MAX);
        x->grace_ms = (int)urange(r, 0, 600000);
        x->max_memory = (next(r) & 1) ? urange(r, 0, UINT64_MAX) : 0;
        x->max_procs = (next(r) & 1) ? (uint32_t)urange(r, 0, TIDE_PROTO_PROCS_MAX) : 0;
        return TIDE_OK;
    }
    case TIDE_MSG_PREEMPT:
        NAME(r, m->u.preempt.job);
        m->u.preempt.grace_ms = (int)urange(r, 0, 600000);
        return TIDE_OK;
    case TIDE_MSG_OFFLINE_STATUS: {
        tide_proto_offline_status_t *x = &m->u.offline_status;
        x->worker = worker_id(r);
        NAME(r, x->job);
        x->attempt = (uint32_t)urange(r, 1, UINT32_MAX);
        x->state = (tide_proto_job_state_t)urange(r, 0, TIDE_JOB_CANCELLED);
        x->exit_code = (int)irange(r, -255, 255);
        x->progress = drange(r, 0, 1);
        TEXT(r, x->log);
        TEXT(r, x->tail);
        return TIDE_OK;
    }
    case TIDE_MSG_BUBBLE: {
        tide_proto_bubble_t *x = &m->u.bubble;
        x->worker = worker_id(r);
        NAME(r, x->job);
        x->gen = urange(r, 0, UINT64_MAX);
        x->steps = (uint32_t)urange(r, 1, UINT32_MAX);
        x->windows = (uint32_t)urange(r, 0, UINT32_MAX);
        x->total_ms = drange(r, 0, TIDE_PROTO_MS_MAX);
        x->mean_ms = drange(r, 0, 100);
        x->max_ms = drange(r, 0, 1000);
        return TIDE_OK;
    }
    case TIDE_MSG_STATUS:
        m->u.status.from = (int32_t)urange(r, 0, INT32_MAX);
        m->u.status.limit = (uint32_t)urange(r, 0, TIDE_PROTO_ROWS_MAX);
        m->u.status.all = (int)(next(r) & 1);
        NAME0(r, m->u.status.job);
        return TIDE_OK;
    case TIDE_MSG_JOBS:
        return TIDE_OK;
    case TIDE_MSG_STATUS_REPLY: {
        tide_proto_status_reply_t *x = &m->u.status_reply;
        x->time_ms = irange(r, 0, INT64_MAX);
        TEXT(r, x->ompi_server);
        uint32_t n = (uint32_t)urange(r, 0, 8);
        x->rows = rows(n, sizeof *x->rows);
        if (n && x->rows == NULL)
            return tide_errorf(TIDE_ERR_NOMEM, "out of memory sampling rows");
        x->n_rows = n;
        /* ascending worker ids, below the next page's start when there is one */
        int32_t id = (int32_t)urange(r, 0, 1000);
        for (uint32_t i = 0; i < n; i++) {
            tide_proto_gpu_row_t *g = &x->rows[i];
            g->worker = id;
            id += (int32_t)urange(r, 1, 1000);
            HOST(r, g->host);
            g->pid = (int32_t)irange(r, 0, INT32_MAX);
            NAME0(r, g->pool);
            g->pool_rank = (int32_t)irange(r, 0, TIDE_PROTO_WORKERS_MAX - 1);
            g->device = (int)urange(r, 0, TIDE_PROTO_DEVICE_MAX);
            g->kind = (tide_proto_device_kind_t)urange(r, 0, 1);
            g->state = (tide_proto_worker_state_t)urange(r, 0, TIDE_WORKER_LEFT);
            g->mem_bytes = urange(r, 0, UINT64_MAX);
            NAME0(r, g->job);
            g->stage = (int)irange(r, -1, TIDE_PROTO_DEGREE_MAX - 1);
            g->dp_rank = (int)irange(r, -1, TIDE_PROTO_DEGREE_MAX - 1);
            g->tp_rank = (int)irange(r, -1, TIDE_PROTO_DEGREE_MAX - 1);
            g->step = urange(r, 0, UINT64_MAX);
            g->bubble_pct = drange(r, 0, 100);
            NAME0(r, g->offline);
            g->last_seen_ms = irange(r, 0, INT64_MAX);
            rstr(r, g->alloc, 0, sizeof g->alloc - 1, 3);
        }
        x->total = n + (uint32_t)urange(r, 0, 100000);
        x->next = n > 0 && (next(r) & 1) ? id : -1;
        return TIDE_OK;
    }
    case TIDE_MSG_JOBS_REPLY: {
        tide_proto_jobs_reply_t *x = &m->u.jobs_reply;
        uint32_t n = (uint32_t)urange(r, 0, 8);
        x->rows = rows(n, sizeof *x->rows);
        if (n && x->rows == NULL)
            return tide_errorf(TIDE_ERR_NOMEM, "out of memory sampling rows");
        x->n_rows = n;
        for (uint32_t i = 0; i < n; i++) {
            tide_proto_job_row_t *j = &x->rows[i];
            NAME(r, j->name);
            j->kind = (tide_proto_job_kind_t)urange(r, 0, TIDE_JOB_PLUGIN);
            j->state = (tide_proto_job_state_t)urange(r, 0, TIDE_JOB_CANCELLED);
            j->gen = urange(r, 0, UINT64_MAX);
            j->dp = (int)urange(r, 0, TIDE_PROTO_DEGREE_MAX);
            j->tp = (int)urange(r, 0, TIDE_PROTO_DEGREE_MAX);
            j->pp = (int)urange(r, 0, TIDE_PROTO_DEGREE_MAX);
            j->workers = (uint32_t)urange(r, 0, TIDE_PROTO_WORKERS_MAX);
            j->step = urange(r, 0, UINT64_MAX);
            j->throughput = drange(r, 0, 1e6);
            j->priority = (int)irange(r, -1000, 1000);
            j->attempts = (uint32_t)urange(r, 0, UINT32_MAX);
            rstr(r, j->allocs, 0, TIDE_PROTO_TEXT_MAX, 3);
            if (next(r) & 1) { /* elastic bounds, or none (left out) */
                j->min_gpus = (int32_t)urange(r, 1, 1 << 20);
                j->max_gpus = (int32_t)urange(r, 1, 1 << 20);
            }
            j->hold = (int32_t)urange(r, 0, 2);
        }
        return TIDE_OK;
    }
    case TIDE_MSG_RESIZE: {
        tide_proto_resize_t *x = &m->u.resize;
        NAME(r, x->job);
        x->dp = (int)urange(r, 1, TIDE_PROTO_DEGREE_MAX);
        x->tp = (int)urange(r, 1, 16);
        x->pp = (int)urange(r, 1, 8);
        while ((uint64_t)x->dp * (uint64_t)x->tp * (uint64_t)x->pp > TIDE_PROTO_WORKERS_MAX)
            x->dp /= 2;
        if (next(r) & 1) {
            x->n_stages = (uint32_t)x->pp + 1;
            x->stage_start = tide_malloc(x->n_stages * sizeof(int));
            if (x->stage_start == NULL) {
                x->n_stages = 0;
                return tide_errorf(TIDE_ERR_NOMEM, "out of memory sampling stages");
            }
            x->stage_start[0] = 0;
            for (uint32_t s = 1; s < x->n_stages; s++)
                x->stage_start[s] = x->stage_start[s - 1] + 1 + (int)urange(r, 0, 10);
        }
        x->dry_run = (int)(next(r) & 1);
        x->placement = (tide_proto_placement_t)urange(r, 0, 1);
        x->tp_across_hosts = (int)(next(r) & 1);
        return TIDE_OK;
    }
    case TIDE_MSG_RESIZE_REPLY: {
        tide_proto_resize_reply_t *x = &m->u.resize_reply;
        NAME(r, x->job);
        x->dry_run = (int)(next(r) & 1);
        TIDE_CHECK(layout(r, &x->layout, urange(r, 0, UINT64_MAX)));
        x->bytes_sent = urange(r, 0, UINT64_MAX);
        x->bytes_local = urange(r, 0, UINT64_MAX);
        x->max_send = urange(r, 0, UINT64_MAX);
        x->messages = urange(r, 0, UINT64_MAX);
        x->est_ms = drange(r, 0, TIDE_PROTO_MS_MAX);
        x->preempted = (uint32_t)urange(r, 0, UINT32_MAX);
        x->bytes_default = urange(r, 0, UINT64_MAX);
        x->cross_host = urange(r, 0, UINT64_MAX);
        x->cross_host_default = urange(r, 0, UINT64_MAX);
        return TIDE_OK;
    }
    case TIDE_MSG_SUBMIT: {
        tide_proto_submit_t *x = &m->u.submit;
        NAME(r, x->name);
        x->kind = (next(r) & 1) ? TIDE_JOB_COMMAND : TIDE_JOB_PLUGIN;
        if (x->kind == TIDE_JOB_PLUGIN)
            NAME(r, x->plugin);
        TIDE_CHECK(argv_fill(r, &x->argv, &x->argc, x->kind == TIDE_JOB_COMMAND ? 1 : 0));
        x->priority = (int)irange(r, -1000, 1000);
        x->mem_cap = urange(r, 0, UINT64_MAX);
        x->bubbles = (int)(next(r) & 1);
        x->max_memory = (next(r) & 1) ? urange(r, 0, UINT64_MAX) : 0;
        x->max_procs = (next(r) & 1) ? (uint32_t)urange(r, 0, TIDE_PROTO_PROCS_MAX) : 0;
        return TIDE_OK;
    }
    case TIDE_MSG_CANCEL:
        NAME(r, m->u.cancel.job);
        return TIDE_OK;
    case TIDE_MSG_DRAIN:
        m->u.drain.worker = worker_id(r);
        return TIDE_OK;
    case TIDE_MSG_ELASTIC:
        NAME(r, m->u.elastic.job);
        m->u.elastic.min_gpus = (int32_t)(next(r) % 5);
        m->u.elastic.max_gpus = m->u.elastic.min_gpus ? m->u.elastic.min_gpus + (int32_t)(next(r) % 9) : 0;
        m->u.elastic.priority = (int32_t)(next(r) % 102) - 1;
        m->u.elastic.pin = (int32_t)(next(r) % 3) - 1;
        m->u.elastic.steps = (int64_t)(next(r) % 100000) - 1;
        return TIDE_OK;
    case TIDE_MSG_GROW:
        NAME(r, m->u.grow.job);
        m->u.grow.nodes = (int)urange(r, 1, 4096);
        return TIDE_OK;
    case TIDE_MSG_CHECKPOINT:
        NAME(r, m->u.checkpoint.job);
        if (next(r) & 1) {
            rstr(r, m->u.checkpoint.dir, 1, TIDE_PROTO_TEXT_MAX, 2);
            m->u.checkpoint.dir[0] = '/';
        }
        return TIDE_OK;
    case TIDE_MSG_EVENTS:
        m->u.events.since_id = urange(r, 0, UINT64_MAX);
        m->u.events.since_ms = irange(r, 0, INT64_MAX);
        m->u.events.limit = (uint32_t)urange(r, 1, TIDE_PROTO_EVENTS_MAX);
        m->u.events.until_ms = (next(r) & 1) || m->u.events.since_ms == INT64_MAX
                                   ? 0
                                   : irange(r, m->u.events.since_ms + 1, INT64_MAX);
        NAME0(r, m->u.events.job);
        NAME0(r, m->u.events.kind);
        if (m->u.events.kind[0] != '\0' && (next(r) & 1))
            m->u.events.kind[0] = '*';
        m->u.events.newest = (int)(next(r) & 1);
        return TIDE_OK;
    case TIDE_MSG_EVENTS_REPLY: {
        tide_proto_events_reply_t *x = &m->u.events_reply;
        uint32_t n = (uint32_t)urange(r, 0, 8);
        x->rows = rows(n, sizeof *x->rows);
        if (n && x->rows == NULL)
            return tide_errorf(TIDE_ERR_NOMEM, "out of memory sampling rows");
        x->n_rows = n;
        for (uint32_t i = 0; i < n; i++) {
            tide_proto_event_row_t *e = &x->rows[i];
            e->id = urange(r, 0, UINT64_MAX);
            e->time_ms = irange(r, 0, INT64_MAX);
            NAME0(r, e->job);
            NAME(r, e->kind);
            TEXT(r, e->detail);
            TIDE_CHECK(event_fields_fill(r, &e->fields));
        }
        return TIDE_OK;
    }
    case TIDE_MSG_LOGS:
        NAME(r, m->u.logs.job);
        m->u.logs.attempt = (uint32_t)urange(r, 0, UINT32_MAX);
        return TIDE_OK;
    case TIDE_MSG_LOGS_REPLY: {
        tide_proto_logs_reply_t *x = &m->u.logs_reply;
        NAME(r, x->job);
        uint32_t n = (uint32_t)urange(r, 0, 4);
        x->rows = rows(n, sizeof *x->rows);
        if (n && x->rows == NULL)
            return tide_errorf(TIDE_ERR_NOMEM, "out of memory sampling rows");
        x->n_rows = n;
        for (uint32_t i = 0; i < n; i++) {
            tide_proto_attempt_row_t *a = &x->rows[i];
            a->attempt = (uint32_t)urange(r, 1, UINT32_MAX);
            a->worker = worker_id(r);
            HOST(r, a->host);
            TEXT(r, a->log);
            a->state = (tide_proto_job_state_t)urange(r, 0, TIDE_JOB_CANCELLED);
            a->exit_code = (int)irange(r, -255, 255);
            a->time_ms = irange(r, 0, INT64_MAX);
            TEXT(r, a->tail);
        }
        return TIDE_OK;
    }
    case TIDE_MSG_OK:
        NAME0(r, m->u.ok.job);
        TEXT(r, m->u.ok.message);
        return TIDE_OK;
    case TIDE_MSG_ERROR:
        m->u.error.code = (int)irange(r, -1000, -1);
        TEXT(r, m->u.error.message);
        return TIDE_OK;
    default:
        return fill_record(r, m);
    }
}

tide_status tide_proto_sample(tide_msg_t *out, tide_msg_type_t type, uint64_t *rng)
{
    rng_t r = {rng};
    tide_msg_init(out, type);
    if ((int)type <= (int)TIDE_MSG_NONE || (int)type >= (int)TIDE_MSG__COUNT) {
        tide_msg_init(out, TIDE_MSG_NONE);
        return tide_errorf(TIDE_ERR_INVALID, "cannot sample message type %d", (int)type);
    }
    tide_status rc = fill(&r, out);
    if (rc != TIDE_OK)
        tide_msg_clear(out);
    return rc;
}
