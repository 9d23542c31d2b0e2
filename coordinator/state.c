/*
 * coordinator/state: the in-memory cluster picture. Single thread (tided's
 * event loop). Workers live in one array indexed by id; a small open-address
 * hash maps (pool, rank) to an id. Jobs are heap objects behind a pointer array
 * so pointers stay valid while jobs are added.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "coordinator/state.h"

#define MAX_COORDS (1u << 20)

const char *tide_wstate_name(tide_wstate s)
{
    static const char *const n[] = {"idle", "online", "offline", "failed", "draining", "left"};
    return ((unsigned)s < 6) ? n[s] : "?";
}

const char *tide_jstate_name(tide_jstate s)
{
    static const char *const n[] = {"running",  "resizing", "stalled", "queued",
                                    "assigned", "done",     "failed",  "cancelled"};
    return ((unsigned)s < 8) ? n[s] : "?";
}

tide_status tide_coord_state_new(tide_coord_state_t **out)
{
    tide_coord_state_t *st = tide_calloc(1, sizeof *st);
    if (st == NULL)
        return tide_errorf(TIDE_ERR_NOMEM, "out of memory allocating the cluster state");
    st->next_job_id = 1;
    *out = st;
    return TIDE_OK;
}

static int cmp_i32_(const void *a, const void *b)
{
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

tide_status tide_reconf_new(tide_reconf_t **out, const tide_layout_t *old, tide_layout_t *layout,
                            uint64_t gen, int recover)
{
    tide_status rc = TIDE_OK;
    size_t n_old = old ? tide_layout_size(old) : 0, n_new = tide_layout_size(layout);
    tide_reconf_t *r = tide_calloc(1, sizeof *r);
    TIDE_CHECK_ALLOC_GOTO(r, rc, fail);
    r->layout = layout;
    layout = NULL;
    r->gen = gen;
    r->recover = recover;
    r->phase = TIDE_RP_PREPARE;
    r->switch_step = -1;
    r->join_pool = -1;
    r->parts = tide_malloc((n_old + n_new) * sizeof *r->parts);
    TIDE_CHECK_ALLOC_GOTO(r->parts, rc, fail);
    if (n_old)
        memcpy(r->parts, old->worker, n_old * sizeof *r->parts);
    memcpy(r->parts + n_old, r->layout->worker, n_new * sizeof *r->parts);
    qsort(r->parts, n_old + n_new, sizeof *r->parts, cmp_i32_);
    size_t k = 0;
    for (size_t i = 0; i < n_old + n_new; i++)
        if (k == 0 || r->parts[i] != r->parts[k - 1])
            r->parts[k++] = r->parts[i];
    r->n_parts = k;
    r->acked = tide_calloc(k, 1);
    r->old_member = tide_calloc(k, 1);
    r->ack_step = tide_calloc(k, sizeof *r->ack_step);
    r->gone = tide_calloc(k, 1);
    TIDE_CHECK_ALLOC_GOTO(r->gone, rc, fail);
    TIDE_CHECK_ALLOC_GOTO(r->acked, rc, fail);
    TIDE_CHECK_ALLOC_GOTO(r->old_member, rc, fail);
    TIDE_CHECK_ALLOC_GOTO(r->ack_step, rc, fail);
    for (size_t i = 0; i < n_old; i++)
        r->old_member[tide_reconf_find(r, old->worker[i])] = 1;
    for (size_t i = 0; i < k; i++)
        r->ack_step[i] = -1;
    *out = r;
    return TIDE_OK;
fail:
    tide_layout_destroy(&layout);
    tide_reconf_destroy(&r);
    return rc;
}

static int32_t *dup_ranks(const int32_t *a, size_t n)
{
    int32_t *d = tide_malloc((n ? n : 1) * sizeof *d);
    if (d != NULL && n > 0)
        memcpy(d, a, n * sizeof *d);
    return d;
}

/* Adds the ranks of a (n_a) and b (n_b) to r's participants (a new participant is no old
   member and has not acked); *a_copy and *b_copy get copies of both lists. */
static tide_status add_parts(tide_reconf_t *r, const int32_t *a, size_t n_a, const int32_t *b,
                             size_t n_b, int32_t **a_copy, int32_t **b_copy)
{
    size_t n = r->n_parts + n_a + n_b;
    int32_t *parts = tide_malloc((n ? n : 1) * sizeof *parts);
    uint8_t *old_member = tide_calloc(n ? n : 1, 1);
    uint8_t *acked = tide_calloc(n ? n : 1, 1), *gone = tide_calloc(n ? n : 1, 1);
    int64_t *ack_step = tide_malloc((n ? n : 1) * sizeof *ack_step);
    int32_t *jo = dup_ranks(a, n_a), *jn = dup_ranks(b, n_b);
    if (parts == NULL || old_member == NULL || acked == NULL || gone == NULL || ack_step == NULL ||
        jo == NULL || jn == NULL) {
        tide_free(parts);
        tide_free(old_member);
        tide_free(acked);
        tide_free(gone);
        tide_free(ack_step);
        tide_free(jo);
        tide_free(jn);
        return tide_errorf(TIDE_ERR_NOMEM, "out of memory listing a generation's participants");
    }
    memcpy(parts, r->parts, r->n_parts * sizeof *parts);
    if (n_a)
        memcpy(parts + r->n_parts, a, n_a * sizeof *parts);
    if (n_b)
        memcpy(parts + r->n_parts + n_a, b, n_b * sizeof *parts);
    qsort(parts, n, sizeof *parts, cmp_i32_);
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (k == 0 || parts[i] != parts[k - 1])
            parts[k++] = parts[i];
    for (size_t i = 0; i < k; i++) {
        long o = tide_reconf_find(r, parts[i]);
        old_member[i] = o >= 0 ? r->old_member[o] : 0;
        ack_step[i] = -1;
    }
    tide_free(r->parts);
    tide_free(r->old_member);
    tide_free(r->acked);
    tide_free(r->gone);
    tide_free(r->ack_step);
    r->parts = parts;
    r->n_parts = k;
    r->old_member = old_member;
    r->acked = acked;
    r->gone = gone;
    r->ack_step = ack_step;
    *a_copy = jo;
    *b_copy = jn;
    return TIDE_OK;
}

tide_status tide_reconf_set_join(tide_reconf_t *r, int pool, const int32_t *old, size_t n_old,
                                 const int32_t *new_ranks, size_t n_new)
{
    int32_t *jo = NULL, *jn = NULL;
    TIDE_CHECK(add_parts(r, old, n_old, new_ranks, n_new, &jo, &jn));
    tide_free(r->join_old);
    tide_free(r->join_new);
    r->join_pool = pool;
    r->join_old = jo;
    r->n_join_old = n_old;
    r->join_new = jn;
    r->n_join_new = n_new;
    return TIDE_OK;
}

tide_status tide_reconf_set_leave(tide_reconf_t *r, uint32_t pools, const int32_t *stay,
                                  size_t n_stay, const int32_t *leave, size_t n_leave)
{
    int32_t *ls = NULL, *ll = NULL;
    TIDE_CHECK(add_parts(r, stay, n_stay, leave, n_leave, &ls, &ll));
    tide_free(r->stay);
    tide_free(r->leave);
    r->leave_pools = pools;
    r->stay = ls;
    r->n_stay = n_stay;
    r->leave = ll;
    r->n_leave = n_leave;
    return TIDE_OK;
}

/* ---- a job's pools ----------------------------------------------------------------------- */

int tide_coord_job_pool_find(const tide_coord_job_t *j, const char *name)
{
    for (int i = 0; i < j->n_pools; i++)
        if (strcmp(j->pools[i].name, name) == 0)
            return i;
    return -1;
}

int32_t tide_coord_job_rank(const tide_coord_job_t *j, const tide_coord_worker_t *w)
{
    int i = tide_coord_job_pool_find(j, w->pool);
    if (i < 0 || w->rank < 0 || w->rank >= j->pools[i].size)
        return -1;
    return j->pools[i].base + w->rank;
}

int tide_coord_job_locate(const tide_coord_job_t *j, int32_t jrank, int32_t *rank)
{
    for (int i = 0; i < j->n_pools; i++) {
        const tide_coord_job_pool *p = &j->pools[i];
        if (jrank >= p->base && jrank - p->base < p->size) {
            *rank = jrank - p->base;
            return i;
        }
    }
    return -1;
}

int32_t tide_coord_job_world(const tide_coord_job_t *j, int connected_only)
{
    int32_t n = 0;
    for (int i = 0; i < j->n_pools; i++)
        if (!connected_only || j->pools[i].connected)
            n = j->pools[i].base + j->pools[i].size > n ? j->pools[i].base + j->pools[i].size : n;
    return n;
}

tide_status tide_coord_job_add_pool(tide_coord_job_t *j, const char *name, int32_t size,
                                    int connected)
{
    if (j->n_pools >= TIDE_COORD_JOB_POOLS_MAX)
        return tide_errorf(TIDE_ERR_RANGE, "job %s already spans %d pools, the most one job may",
                           j->name, TIDE_COORD_JOB_POOLS_MAX);
    int32_t base = tide_coord_job_world(j, 0);
    if (size < 1 || (int64_t)base + size > (int64_t)(1 << 20))
        return tide_errorf(TIDE_ERR_RANGE, "pool %s of %d ranks does not fit job %s's %d job ranks",
                           name, size, j->name, base);
    tide_coord_job_pool *p = &j->pools[j->n_pools++];
    snprintf(p->name, sizeof p->name, "%s", name);
    p->base = base;
    p->size = size;
    p->connected = connected;
    p->left = 0;
    return TIDE_OK;
}

tide_status tide_coord_job_add_ckpt(tide_coord_job_t *j, int64_t step, const char *dir)
{
    size_t len = strlen(dir);
    if (step < 0 || len == 0 || len >= TIDE_COORD_CKPT_DIR_MAX || strpbrk(dir, "\t\n") != NULL)
        return tide_errorf(TIDE_ERR_INVALID,
                           "job %s: checkpoint directory '%.64s' (step %lld) is empty, too long "
                           "or holds a tab or newline",
                           j->name, dir, (long long)step);
    if (j->ckpts == NULL) {
        j->ckpts = tide_calloc(TIDE_COORD_CKPTS_MAX, sizeof *j->ckpts);
        if (j->ckpts == NULL)
            return tide_errorf(TIDE_ERR_NOMEM, "out of memory recording job %s's checkpoint",
                               j->name);
    }
    tide_coord_job_drop_ckpt(j, step);
    int at = j->n_ckpts; /* sorted by step: insert in place */
    while (at > 0 && j->ckpts[at - 1].step > step)
        at--;
    if (j->n_ckpts == TIDE_COORD_CKPTS_MAX) {
        if (at == 0)
            return TIDE_OK; /* older than every one kept */
        memmove(&j->ckpts[0], &j->ckpts[1], (size_t)(at - 1) * sizeof *j->ckpts);
        at--;
    } else {
        memmove(&j->ckpts[at + 1], &j->ckpts[at], (size_t)(j->n_ckpts - at) * sizeof *j->ckpts);
        j->n_ckpts++;
    }
    j->ckpts[at].step = step;
    memcpy(j->ckpts[at].dir, dir, len + 1);
    return TIDE_OK;
}

void tide_coord_job_drop_ckpt(tide_coord_job_t *j, int64_t step)
{
    for (int i = 0; i < j->n_ckpts; i++)
        if (j->ckpts[i].step == step) {
            memmove(&j->ckpts[i], &j->ckpts[i + 1],
                    (size_t)(j->n_ckpts - i - 1) * sizeof *j->ckpts);
            j->n_ckpts--;
            return;
        }
}

long tide_reconf_find(const tide_reconf_t *r, int32_t rank)
{
    const int32_t *hit = bsearch(&rank, r->parts, r->n_parts, sizeof *r->parts, cmp_i32_);
    return hit ? (long)(hit - r->parts) : -1;
}

void tide_reconf_destroy(tide_reconf_t **self_p)
{
    if (self_p == NULL || *self_p == NULL)
        return;
    tide_reconf_t *r = *self_p;
    tide_layout_destroy(&r->layout);
    tide_free(r->parts);
    tide_free(r->acked);
    tide_free(r->ack_step);
    tide_free(r->old_member);
    tide_free(r->gone);
    tide_free(r->join_old);
    tide_free(r->join_new);
    tide_free(r->stay);
    tide_free(r->leave);
    tide_free(r);
    *self_p = NULL;
}

static void job_free(tide_coord_job_t *j)
{
    if (j == NULL)
        return;
    tide_layout_destroy(&j->layout);
    tide_reconf_destroy(&j->reconf);
    for (uint32_t i = 0; i < j->argc; i++)
        tide_free(j->argv[i]);
    tide_free(j->argv);
    tide_free(j->join_blob);
    tide_free(j->ckpts);
    tide_free(j);
}

void tide_coord_state_destroy(tide_coord_state_t **self_p)
{
    if (self_p == NULL || *self_p == NULL)
        return;
    tide_coord_state_t *st = *self_p;
    for (size_t i = 0; i < st->n_jobs; i++)
        job_free(st->jobs[i]);
    tide_free(st->jobs);
    tide_free(st->workers);
    tide_free(st->hash);
    tide_free(st);
    *self_p = NULL;
}

/* FNV-1a over the pool name and the rank. */
static uint64_t key_hash(const char *pool, int32_t rank)
{
    uint64_t h = 1469598103934665603ull;
    for (const unsigned char *p = (const unsigned char *)pool; *p; p++)
        h = (h ^ *p) * 1099511628211ull;
    for (int i = 0; i < 4; i++)
        h = (h ^ (((uint32_t)rank >> (8 * i)) & 0xff)) * 1099511628211ull;
    return h;
}

static void hash_insert(tide_coord_state_t *st, int32_t id)
{
    const tide_coord_worker_t *w = &st->workers[id];
    size_t mask = st->hash_cap - 1;
    size_t i = (size_t)key_hash(w->pool, w->rank) & mask;
    while (st->hash[i] >= 0)
        i = (i + 1) & mask;
    st->hash[i] = id;
}

static tide_status hash_grow(tide_coord_state_t *st, size_t need)
{
    size_t cap = st->hash_cap ? st->hash_cap : 64;
    while (cap < need * 2)
        cap *= 2;
    if (cap == st->hash_cap)
        return TIDE_OK;
    int32_t *h = tide_calloc(cap, sizeof *h);
    if (h == NULL)
        return tide_errorf(TIDE_ERR_NOMEM, "out of memory growing the worker index");
    for (size_t i = 0; i < cap; i++)
        h[i] = -1;
    tide_free(st->hash);
    st->hash = h;
    st->hash_cap = cap;
    for (size_t id = 0; id < st->n_workers; id++)
        if (st->workers[id].pool[0] != '\0')
            hash_insert(st, (int32_t)id);
    return TIDE_OK;
}

tide_coord_worker_t *tide_coord_worker_find(tide_coord_state_t *st, const char *pool, int32_t rank)
{
    if (st->hash_cap == 0)
        return NULL;
    size_t mask = st->hash_cap - 1;
    size_t i = (size_t)key_hash(pool, rank) & mask;
    while (st->hash[i] >= 0) {
        tide_coord_worker_t *w = &st->workers[st->hash[i]];
        if (w->rank == rank && strcmp(w->pool, pool) == 0)
            return w;
        i = (i + 1) & mask;
    }
    return NULL;
}

tide_coord_worker_t *tide_coord_worker_get(tide_coord_state_t *st, int32_t id)
{
    if (id < 0 || (size_t)id >= st->n_workers || st->workers[id].pool[0] == '\0')
        return NULL;
    return &st->workers[id];
}

int tide_coord_worker_gone(const tide_coord_worker_t *w)
{
    return w->state == TIDE_WS_FAILED || w->state == TIDE_WS_LEFT;
}

static void seen_unlink(tide_coord_state_t *st, tide_coord_worker_t *w)
{
    if (!w->in_seen)
        return;
    if (w->seen_prev != 0)
        st->workers[w->seen_prev - 1].seen_next = w->seen_next;
    else
        st->seen_head = w->seen_next;
    if (w->seen_next != 0)
        st->workers[w->seen_next - 1].seen_prev = w->seen_prev;
    else
        st->seen_tail = w->seen_prev;
    w->seen_prev = w->seen_next = 0;
    w->in_seen = 0;
}

void tide_coord_worker_seen(tide_coord_state_t *st, tide_coord_worker_t *w, uint64_t now)
{
    w->last_seen_ns = now;
    if (w->in_seen && w->seen_next == 0)
        return; /* already the most recent */
    seen_unlink(st, w);
    /* after the last worker seen no later than now: the tail itself unless a caller's clock
       went back */
    int32_t after = st->seen_tail;
    while (after != 0 && st->workers[after - 1].last_seen_ns > now)
        after = st->workers[after - 1].seen_prev;
    int32_t before = after != 0 ? st->workers[after - 1].seen_next : st->seen_head;
    w->seen_prev = after;
    w->seen_next = before;
    if (after != 0)
        st->workers[after - 1].seen_next = w->id + 1;
    else
        st->seen_head = w->id + 1;
    if (before != 0)
        st->workers[before - 1].seen_prev = w->id + 1;
    else
        st->seen_tail = w->id + 1;
    w->in_seen = 1;
}

size_t tide_coord_workers_expired(tide_coord_state_t *st, uint64_t now, uint64_t limit,
                                  int32_t *out, size_t max)
{
    size_t k = 0;
    while (st->seen_head != 0 && k < max) {
        tide_coord_worker_t *w = &st->workers[st->seen_head - 1];
        if (w->pool[0] != '\0' && !tide_coord_worker_gone(w) &&
            !(now > w->last_seen_ns && now - w->last_seen_ns > limit))
            break; /* every worker after it was seen later */
        int alive = w->pool[0] != '\0' && !tide_coord_worker_gone(w);
        seen_unlink(st, w);
        if (alive)
            out[k++] = w->id;
    }
    return k;
}

void tide_coord_worker_remove(tide_coord_state_t *st, int32_t id)
{
    if (tide_coord_worker_get(st, id) == NULL)
        return;
    seen_unlink(st, &st->workers[id]);
    /* linear probing: empty the slot, then re-insert the rest of its cluster so that no
       lookup stops at the hole before reaching a key placed past it */
    size_t mask = st->hash_cap - 1;
    size_t i = (size_t)key_hash(st->workers[id].pool, st->workers[id].rank) & mask;
    while (st->hash[i] != id)
        i = (i + 1) & mask;
    st->hash[i] = -1;
    memset(&st->workers[id], 0, sizeof st->workers[id]);
    for (size_t k = (i + 1) & mask; st->hash[k] >= 0; k = (k + 1) & mask) {
        int32_t moved = st->hash[k];
        st->hash[k] = -1;
        hash_insert(st, moved);
    }
    while (st->n_workers > 0 && st->workers[st->n_workers - 1].pool[0] == '\0')
        st->n_workers--; /* scans stop at the last live id; next_worker_id stays */
}

tide_status tide_coord_worker_add(tide_coord_state_t *st, int32_t id, const char *pool,
                                  int32_t rank, tide_coord_worker_t **out)
{
    if (pool == NULL || pool[0] == '\0' || strlen(pool) >= TIDE_COORD_NAME_MAX)
        return tide_errorf(TIDE_ERR_INVALID, "pool name must have 1..%d characters",
                           TIDE_COORD_NAME_MAX - 1);
    if (rank < 0)
        return tide_errorf(TIDE_ERR_INVALID, "rank %d is negative", rank);
    if (tide_coord_worker_find(st, pool, rank) != NULL)
        return tide_errorf(TIDE_ERR_EXISTS, "worker %s/%d already registered", pool, rank);
    if (id < 0)
        id = st->next_worker_id > (int32_t)st->n_workers ? st->next_worker_id
                                                         : (int32_t)st->n_workers;
    if (id >= (int32_t)MAX_COORDS)
        return tide_errorf(TIDE_ERR_RANGE,
                           "too many worker ids handed out (limit %u): restart tided with a "
                           "fresh --state once its jobs have ended",
                           MAX_COORDS);
    if ((size_t)id < st->n_workers && st->workers[id].pool[0] != '\0')
        return tide_errorf(TIDE_ERR_EXISTS, "worker id %d already used", id);
    size_t need = (size_t)id + 1 > st->n_workers ? (size_t)id + 1 : st->n_workers;
    if (need > st->cap_workers) {
        size_t cap = st->cap_workers ? st->cap_workers * 2 : 64;
        while (cap < need)
            cap *= 2;
        tide_coord_worker_t *w = tide_reallocarray(st->workers, cap, sizeof *w);
        if (w == NULL)
            return tide_errorf(TIDE_ERR_NOMEM, "out of memory growing the worker table");
        memset(w + st->cap_workers, 0, (cap - st->cap_workers) * sizeof *w);
        st->workers = w;
        st->cap_workers = cap;
    }
    TIDE_CHECK(hash_grow(st, need));
    tide_coord_worker_t *w = &st->workers[id];
    memset(w, 0, sizeof *w);
    w->id = id;
    snprintf(w->pool, sizeof w->pool, "%s", pool);
    w->rank = rank;
    w->device = -1;
    w->state = TIDE_WS_IDLE;
    if (need > st->n_workers)
        st->n_workers = need;
    if (id + 1 > st->next_worker_id)
        st->next_worker_id = id + 1;
    hash_insert(st, id);
    *out = w;
    return TIDE_OK;
}

tide_coord_job_t *tide_coord_job_get(tide_coord_state_t *st, int64_t id)
{
    for (size_t i = 0; i < st->n_jobs; i++)
        if (st->jobs[i]->id == id)
            return st->jobs[i];
    return NULL;
}

tide_coord_job_t *tide_coord_job_by_name(tide_coord_state_t *st, const char *name)
{
    for (size_t i = 0; i < st->n_jobs; i++)
        if (strcmp(st->jobs[i]->name, name) == 0)
            return st->jobs[i];
    return NULL;
}

tide_status tide_coord_job_add(tide_coord_state_t *st, int64_t id, tide_job_kind kind,
                               tide_coord_job_t **out)
{
    if (id <= 0)
        id = st->next_job_id;
    if (tide_coord_job_get(st, id) != NULL)
        return tide_errorf(TIDE_ERR_EXISTS, "job %lld already exists", (long long)id);
    if (st->n_jobs == st->cap_jobs) {
        size_t cap = st->cap_jobs ? st->cap_jobs * 2 : 16;
        tide_coord_job_t **j = tide_reallocarray(st->jobs, cap, sizeof *j);
        if (j == NULL)
            return tide_errorf(TIDE_ERR_NOMEM, "out of memory growing the job table");
        st->jobs = j;
        st->cap_jobs = cap;
    }
    tide_coord_job_t *j = tide_calloc(1, sizeof *j);
    if (j == NULL)
        return tide_errorf(TIDE_ERR_NOMEM, "out of memory allocating a job");
    j->id = id;
    j->kind = kind;
    j->worker = -1;
    j->last_failed = -1;
    j->max_attempts = 3;
    j->grace_ms = 10000;
    st->jobs[st->n_jobs++] = j;
    if (id >= st->next_job_id)
        st->next_job_id = id + 1;
    *out = j;
    return TIDE_OK;
}

/* ---- layouts ----------------------------------------------------------------------- */

int tide_coord_layout_has(const tide_layout_t *l, int32_t rank)
{
    for (size_t i = 0; i < tide_layout_size(l); i++)
        if (l->worker[i] == rank)
            return 1;
    return 0;
}
