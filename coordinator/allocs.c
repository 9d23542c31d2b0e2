/*
 * coordinator/allocs: pools' scheduler allocations (see allocs.h). An open-addressing
 * hash of pool names with tombstones, grown past half full; rows in the state file's
 * pool_allocs table, read and written with statements prepared per call (a write happens
 * once per launch, not per message). The table is made by the first write, not when the
 * file is opened: a file tided refuses to start from stays untouched, and a file of
 * before the table needs no migration (no table: no allocations).
 */
#include "coordinator/allocs.h"

#include <sqlite3.h>
#include <stdio.h>
#include <string.h>

#include "coordinator/state.h"
#include "coordinator/store_int.h"
#include "core/alloc.h"
#include "core/error.h"
#include "core/log.h"

typedef struct slot {
    int used; /* 0 empty, 1 holds an entry, 2 a removed one (probes go on past it) */
    char pool[TIDE_COORD_NAME_MAX];
    tide_proto_alloc_t a;
} slot;

struct tide_allocs {
    slot *s;
    size_t cap; /* a power of two */
    size_t n;   /* entries */
    size_t dead;
};

static uint64_t hash(const char *p)
{
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (; *p; p++)
        h = (h ^ (unsigned char)*p) * 1099511628211ull;
    return h;
}

tide_status tide_allocs_new(tide_allocs_t **out)
{
    *out = tide_calloc(1, sizeof **out);
    if (*out == NULL)
        return tide_errorf(TIDE_ERR_NOMEM, "out of memory for the allocation table");
    return TIDE_OK;
}

void tide_allocs_destroy(tide_allocs_t **self_p)
{
    if (self_p == NULL || *self_p == NULL)
        return;
    tide_free((*self_p)->s);
    tide_free(*self_p);
    *self_p = NULL;
}

/* The slot holding pool, or NULL. */
static slot *find(const tide_allocs_t *t, const char *pool)
{
    if (t->cap == 0)
        return NULL;
    for (size_t i = hash(pool) & (t->cap - 1), k = 0; k < t->cap; i = (i + 1) & (t->cap - 1), k++) {
        if (t->s[i].used == 0)
            return NULL;
        if (t->s[i].used == 1 && strcmp(t->s[i].pool, pool) == 0)
            return &t->s[i];
    }
    return NULL;
}

static tide_status grow(tide_allocs_t *t)
{
    size_t cap = t->cap ? t->cap * 2 : 64;
    while ((t->n + 1) * 2 > cap)
        cap *= 2;
    slot *s = tide_calloc(cap, sizeof *s);
    if (s == NULL)
        return tide_errorf(TIDE_ERR_NOMEM, "out of memory growing the allocation table");
    for (size_t i = 0; i < t->cap; i++) {
        if (t->s[i].used != 1)
            continue;
        size_t j = hash(t->s[i].pool) & (cap - 1);
        while (s[j].used)
            j = (j + 1) & (cap - 1);
        s[j] = t->s[i];
    }
    tide_free(t->s);
    t->s = s;
    t->cap = cap;
    t->dead = 0;
    return TIDE_OK;
}

tide_status tide_allocs_put(tide_allocs_t *t, const char *pool, const tide_proto_alloc_t *a)
{
    if (a->sched[0] == '\0') {
        tide_allocs_remove(t, pool);
        return TIDE_OK;
    }
    if (strlen(pool) >= TIDE_COORD_NAME_MAX)
        return tide_errorf(TIDE_ERR_INVALID, "pool name longer than %d", TIDE_COORD_NAME_MAX - 1);
    slot *e = find(t, pool);
    if (e != NULL) {
        e->a = *a;
        return TIDE_OK;
    }
    if ((t->n + t->dead + 1) * 2 > t->cap)
        TIDE_CHECK(grow(t));
    size_t i = hash(pool) & (t->cap - 1);
    while (t->s[i].used == 1)
        i = (i + 1) & (t->cap - 1);
    if (t->s[i].used == 2)
        t->dead--;
    t->s[i].used = 1;
    snprintf(t->s[i].pool, sizeof t->s[i].pool, "%s", pool);
    t->s[i].a = *a;
    t->n++;
    return TIDE_OK;
}

const tide_proto_alloc_t *tide_allocs_get(const tide_allocs_t *t, const char *pool)
{
    const slot *e = find(t, pool);
    return e != NULL ? &e->a : NULL;
}

void tide_allocs_remove(tide_allocs_t *t, const char *pool)
{
    slot *e = find(t, pool);
    if (e == NULL)
        return;
    e->used = 2;
    t->n--;
    t->dead++;
}

size_t tide_allocs_count(const tide_allocs_t *t)
{
    return t->n;
}

void tide_allocs_each(const tide_allocs_t *t,
                      void (*fn)(void *ctx, const char *pool, const tide_proto_alloc_t *a),
                      void *ctx)
{
    for (size_t i = 0; i < t->cap; i++)
        if (t->s[i].used == 1)
            fn(ctx, t->s[i].pool, &t->s[i].a);
}

void tide_alloc_label(const tide_proto_alloc_t *a, char *out, size_t len)
{
    if (len == 0)
        return;
    if (a == NULL || a->sched[0] == '\0')
        out[0] = '\0';
    else
        snprintf(out, len, "%s %s", a->sched, a->id);
}

/* ---- the state file -------------------------------------------------------------------------- */

/* Prepares text on s's file into *q. */
static tide_status prepare(tide_store_t *s, const char *text, sqlite3_stmt **q, const char *what)
{
    int rc = sqlite3_prepare_v2(s->db, text, -1, q, NULL);
    return rc == SQLITE_OK ? TIDE_OK : tide__store_db_error(s, rc, what);
}

/* Steps a write to its end and finalizes it. */
static tide_status step_write(tide_store_t *s, sqlite3_stmt *q, const char *what)
{
    int rc = sqlite3_step(q);
    sqlite3_finalize(q);
    return rc == SQLITE_DONE ? TIDE_OK : tide__store_db_error(s, rc, what);
}

tide_status tide_store_put_alloc(tide_store_t *s, const char *pool, const tide_proto_alloc_t *a)
{
    TIDE_CHECK(tide__store_need_txn(s, "put_alloc"));
    sqlite3_stmt *q;
    TIDE_CHECK(prepare(s,
                       "CREATE TABLE IF NOT EXISTS pool_allocs(pool TEXT PRIMARY KEY,"
                       " sched TEXT NOT NULL, id TEXT NOT NULL, nodes TEXT, node TEXT, gpus TEXT,"
                       " partition TEXT, restarts INTEGER)",
                       &q, "making the pools' allocation table"));
    TIDE_CHECK(step_write(s, q, "making the pools' allocation table"));
    TIDE_CHECK(prepare(s,
                       "INSERT OR REPLACE INTO pool_allocs(pool, sched, id, nodes, node, gpus,"
                       " partition, restarts) VALUES(?1,?2,?3,?4,?5,?6,?7,?8)",
                       &q, "saving a pool's allocation"));
    sqlite3_bind_text(q, 1, pool, -1, SQLITE_STATIC);
    sqlite3_bind_text(q, 2, a->sched, -1, SQLITE_STATIC);
    sqlite3_bind_text(q, 3, a->id, -1, SQLITE_STATIC);
    sqlite3_bind_text(q, 4, a->nodes, -1, SQLITE_STATIC);
    sqlite3_bind_text(q, 5, a->node, -1, SQLITE_STATIC);
    sqlite3_bind_text(q, 6, a->gpus, -1, SQLITE_STATIC);
    sqlite3_bind_text(q, 7, a->partition, -1, SQLITE_STATIC);
    sqlite3_bind_int(q, 8, a->restarts);
    return step_write(s, q, "saving a pool's allocation");
}

/* 1 when the file has the pool_allocs table. */
static int has_table(tide_store_t *s)
{
    sqlite3_stmt *q = NULL;
    int have = sqlite3_prepare_v2(s->db,
                                  "SELECT 1 FROM sqlite_master WHERE type = 'table' AND"
                                  " name = 'pool_allocs'",
                                  -1, &q, NULL) == SQLITE_OK &&
               sqlite3_step(q) == SQLITE_ROW;
    sqlite3_finalize(q);
    return have;
}

tide_status tide_store_del_alloc(tide_store_t *s, const char *pool)
{
    TIDE_CHECK(tide__store_need_txn(s, "del_alloc"));
    if (!has_table(s))
        return TIDE_OK;
    sqlite3_stmt *q;
    TIDE_CHECK(prepare(s, "DELETE FROM pool_allocs WHERE pool = ?1", &q,
                       "forgetting a pool's allocation"));
    sqlite3_bind_text(q, 1, pool, -1, SQLITE_STATIC);
    return step_write(s, q, "forgetting a pool's allocation");
}

/* Row r of q into a; 0 when a field is not one the protocol would carry. */
static int read_row(sqlite3_stmt *q, char *pool, tide_proto_alloc_t *a)
{
    memset(a, 0, sizeof *a);
    tide__store_copy_text(pool, TIDE_COORD_NAME_MAX, sqlite3_column_text(q, 0));
    tide__store_copy_text(a->sched, sizeof a->sched, sqlite3_column_text(q, 1));
    tide__store_copy_text(a->id, sizeof a->id, sqlite3_column_text(q, 2));
    tide__store_copy_text(a->nodes, sizeof a->nodes, sqlite3_column_text(q, 3));
    tide__store_copy_text(a->node, sizeof a->node, sqlite3_column_text(q, 4));
    tide__store_copy_text(a->gpus, sizeof a->gpus, sqlite3_column_text(q, 5));
    tide__store_copy_text(a->partition, sizeof a->partition, sqlite3_column_text(q, 6));
    a->restarts = sqlite3_column_int(q, 7);
    /* the protocol's own check: a message of it must encode */
    tide_msg_t m;
    tide_msg_init(&m, TIDE_MSG_REGISTER);
    snprintf(m.u.reg.pool, sizeof m.u.reg.pool, "%s", pool[0] ? pool : "-");
    snprintf(m.u.reg.host, sizeof m.u.reg.host, "h");
    m.u.reg.size = 1;
    m.u.reg.pid = 1;
    m.u.reg.alloc = *a;
    tide_proto_buf_t b;
    tide_proto_buf_init(&b);
    int ok = pool[0] != '\0' && tide_proto_encode(&m, &b) == TIDE_OK;
    tide_proto_buf_destroy(&b);
    return ok;
}

tide_status tide_store_load_allocs(tide_store_t *s, tide_allocs_t *t)
{
    if (!has_table(s))
        return TIDE_OK;
    sqlite3_stmt *q;
    TIDE_CHECK(prepare(s,
                       "SELECT pool, sched, id, nodes, node, gpus, partition, restarts"
                       " FROM pool_allocs",
                       &q, "reading the pools' allocations"));
    tide_status rc = TIDE_OK;
    int src = SQLITE_DONE;
    while (rc == TIDE_OK && (src = sqlite3_step(q)) == SQLITE_ROW) {
        char pool[TIDE_COORD_NAME_MAX];
        tide_proto_alloc_t a;
        if (!read_row(q, pool, &a)) {
            TIDE_WARN("store", "state file %s: pool_allocs row of pool '%.60s' is not an "
                               "allocation (%s): skipped", s->path, pool, tide_last_error());
            continue;
        }
        rc = tide_allocs_put(t, pool, &a);
    }
    if (rc == TIDE_OK && src != SQLITE_DONE)
        rc = tide__store_db_error(s, src, "reading the pools' allocations");
    sqlite3_finalize(q);
    return rc;
}
