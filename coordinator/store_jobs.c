/*
 * coordinator/store: a job's row (see store.h). Scalars are columns; each structured part
 * is one proto record in a BLOB column (proto.h, "records"): the pools, the committed
 * layout, the pending reconfiguration's layout, the fit rules, the checkpoints and the
 * command line. The first join message is kept as received: it is a proto message already.
 *
 * A state file of schema 1 held those parts as text (and the command line as
 * NUL-separated bytes). Its rows are read through proto_legacy.h into the same records,
 * so both schemas load through one path, and tide_store_load then rewrites every job in
 * records and marks the file schema 2, in one transaction: a file that fails to load is
 * left as it was. Workload: one row write per job change; every row read once at start.
 */
#include <string.h>

#include <sqlite3.h>

#include "core/alloc.h"
#include "core/error.h"
#include "core/log.h"
#include "coordinator/store_int.h"
#include "proto/proto_legacy.h"
#include "proto/proto_reshard.h"

_Static_assert(TIDE_COORD_NAME_MAX == TIDE_PROTO_NAME_MAX + 1, "pool names fit a record");
_Static_assert(TIDE_COORD_CKPT_DIR_MAX == TIDE_PROTO_TEXT_MAX + 1, "checkpoint dirs fit a record");
_Static_assert(TIDE_COORD_JOB_POOLS_MAX == TIDE_PROTO_JOB_POOLS_MAX &&
                   TIDE_COORD_CKPTS_MAX == TIDE_PROTO_CKPTS_MAX,
               "a record holds every pool and checkpoint a job keeps");

/* The jobs table's columns, as SELECTed by load_jobs and bound by tide_store_put_job. */
enum {
    C_ID,
    C_NAME,
    C_KIND,
    C_STATE,
    C_CREATED,
    C_POOLS,
    C_LAYOUT,
    C_GEN,
    C_GEN_ISSUED,
    C_STEP,
    C_REQ_DP,
    C_REQ_TP,
    C_REQ_PP,
    C_REQ_MICRO,
    C_TOTAL_BYTES,
    C_JOIN,
    C_PRIORITY,
    C_OKIND,
    C_PLUGIN,
    C_ARGV,
    C_MEM_CAP,
    C_BUBBLES,
    C_ATTEMPTS,
    C_MAX_ATTEMPTS,
    C_WORKER,
    C_GRACE,
    C_RC_GEN,
    C_RC_RECOVER,
    C_RC_PHASE,
    C_RC_SWITCH,
    C_RC_STARTED,
    C_RC_LAYOUT,
    C_RC_REASON,
    C_LAYERS,
    C_RC_SWITCHED,
    C_FAILURES,
    C_FIT,
    C_CKPTS,
    C_RC_CKPT,
    C_RC_CKPT_STEP,
    C_MAX_MEMORY,
    C_MAX_PROCS,
};

/* ---- writing ------------------------------------------------------------------------------ */

/* ---- elastic declarations ------------------------------------------------------------------ */

/* A job's elastic declaration (coordinator/elastic_tided.h: bounds, pin, steps) lives in a
   table of its own, made when a job first has one: a state file is read, and written, as
   before until an operator declares bounds (the jobs table keeps schema 2's columns). */
#define EL_TABLE                                                                                   \
    "CREATE TABLE IF NOT EXISTS job_elastic(job INTEGER PRIMARY KEY, min_gpus INTEGER NOT NULL,"  \
    " max_gpus INTEGER NOT NULL, hold INTEGER NOT NULL, steps INTEGER NOT NULL)"

static tide_status put_elastic(tide_store_t *s, const tide_coord_job_t *j)
{
    if (!s->el_table && j->el_min == 0 && j->el_max == 0 && j->el_hold == 0 && j->el_steps == 0)
        return TIDE_OK;
    sqlite3_stmt *st = NULL;
    int rc = sqlite3_exec(s->db, EL_TABLE, NULL, NULL, NULL); /* a rollback may have undone it */
    if (rc == SQLITE_OK)
        rc = sqlite3_prepare_v2(s->db,
                                "INSERT OR REPLACE INTO job_elastic(job, min_gpus, max_gpus, hold,"
                                " steps) VALUES(?1, ?2, ?3, ?4, ?5)",
                                -1, &st, NULL);
    if (rc == SQLITE_OK) {
        s->el_table = 1;
        sqlite3_bind_int64(st, 1, j->id);
        sqlite3_bind_int(st, 2, j->el_min);
        sqlite3_bind_int(st, 3, j->el_max);
        sqlite3_bind_int(st, 4, j->el_hold);
        sqlite3_bind_int64(st, 5, j->el_steps);
        rc = sqlite3_step(st);
        rc = rc == SQLITE_DONE ? SQLITE_OK : rc;
    }
    sqlite3_finalize(st);
    return rc == SQLITE_OK ? TIDE_OK : tide__store_db_error(s, rc, "saving a job's bounds");
}

/* One row of job_elastic into its job (rows of jobs that are gone are ignored). */
static tide_status read_elastic(tide_store_t *s, tide_coord_state_t *st, sqlite3_stmt *q)
{
    tide_coord_job_t *j = tide_coord_job_get(st, sqlite3_column_int64(q, 0));
    if (j == NULL)
        return TIDE_OK;
    int64_t lo = sqlite3_column_int64(q, 1), hi = sqlite3_column_int64(q, 2);
    int64_t hold = sqlite3_column_int64(q, 3), steps = sqlite3_column_int64(q, 4);
    if (lo < 0 || hi > (1 << 20) || lo > hi || (lo == 0) != (hi == 0) || hold < TIDE_EL_FREE ||
        hold > TIDE_EL_OPERATOR || steps < 0)
        return tide_errorf(TIDE_ERR_PROTOCOL,
                           "state file %s: job %s: its bounds are damaged (%lld-%lld GPUs, hold "
                           "%lld, %lld steps)",
                           s->path, j->name, (long long)lo, (long long)hi, (long long)hold,
                           (long long)steps);
    j->el_min = (int32_t)lo;
    j->el_max = (int32_t)hi;
    j->el_hold = (int32_t)hold;
    j->el_steps = steps;
    return TIDE_OK;
}

/* Every job's elastic declaration, when the file has any. */
static tide_status load_elastic(tide_store_t *s, tide_coord_state_t *st)
{
    sqlite3_stmt *q = NULL;
    int src = sqlite3_prepare_v2(s->db,
                                 "SELECT 1 FROM sqlite_master WHERE type = 'table' AND"
                                 " name = 'job_elastic'",
                                 -1, &q, NULL);
    if (src == SQLITE_OK)
        src = sqlite3_step(q);
    sqlite3_finalize(q);
    if (src == SQLITE_DONE)
        return TIDE_OK; /* no job ever declared bounds */
    if (src != SQLITE_ROW)
        return tide__store_db_error(s, src, "looking for jobs' bounds");
    s->el_table = 1;
    src = sqlite3_prepare_v2(s->db, "SELECT job, min_gpus, max_gpus, hold, steps FROM job_elastic",
                             -1, &q, NULL);
    if (src != SQLITE_OK)
        return tide__store_db_error(s, src, "loading jobs' bounds");
    tide_status rc = TIDE_OK;
    while (rc == TIDE_OK && (src = sqlite3_step(q)) == SQLITE_ROW)
        rc = read_elastic(s, st, q);
    if (rc == TIDE_OK && src != SQLITE_DONE)
        rc = tide__store_db_error(s, src, "loading jobs' bounds");
    sqlite3_finalize(q);
    return rc;
}

/* One encoded record per structured part of a job. */
typedef struct job_blobs {
    tide_proto_buf_t pools, layout, rc_layout, fit, ckpts, argv;
} job_blobs;

static void blobs_destroy(job_blobs *b)
{
    tide_proto_buf_destroy(&b->pools);
    tide_proto_buf_destroy(&b->layout);
    tide_proto_buf_destroy(&b->rc_layout);
    tide_proto_buf_destroy(&b->fit);
    tide_proto_buf_destroy(&b->ckpts);
    tide_proto_buf_destroy(&b->argv);
}

static tide_status encode(const tide_coord_job_t *j, const tide_msg_t *m, tide_proto_buf_t *b)
{
    tide_status rc = tide_proto_encode_record(m, b);
    if (rc != TIDE_OK)
        return tide_errorf(rc, "job %s: storing its %s: %s", j->name, tide_msg_type_name(m->type),
                           tide_last_error());
    return TIDE_OK;
}

static tide_status encode_layout(const tide_coord_job_t *j, const tide_layout_t *l, uint64_t gen,
                                 tide_proto_buf_t *b)
{
    tide_msg_t m;
    tide_msg_init(&m, TIDE_MSG_JOB_LAYOUT);
    tide_proto_layout_from(&m.u.job_layout.layout, l, gen); /* borrowed: never cleared */
    return encode(j, &m, b);
}

/* Encodes j's pools, layouts, rules, checkpoints and command line into b (inited). The
   records borrow j's arrays or copy into the stack: none is cleared. */
static tide_status encode_job(const tide_coord_job_t *j, job_blobs *b)
{
    tide_msg_t m;
    tide_proto_job_pool_t pools[TIDE_COORD_JOB_POOLS_MAX];
    tide_msg_init(&m, TIDE_MSG_JOB_POOLS);
    for (int i = 0; i < j->n_pools; i++) {
        const tide_coord_job_pool *p = &j->pools[i];
        memcpy(pools[i].name, p->name, sizeof pools[i].name);
        pools[i].size = p->size;
        pools[i].left = p->left;
        pools[i].connected = p->left == 0 && p->connected; /* a pool that left is connected no
                                                              more, whatever memory says */
    }
    m.u.job_pools.pools = pools;
    m.u.job_pools.n_pools = (uint32_t)j->n_pools;
    TIDE_CHECK(encode(j, &m, &b->pools));

    tide_proto_fit_t fit[TIDE_FIT_RULES_MAX];
    tide_proto_fit_from(fit, j->fit, (uint32_t)j->n_fit);
    tide_msg_init(&m, TIDE_MSG_JOB_FIT);
    m.u.job_fit.fit = fit;
    m.u.job_fit.n_fit = (uint32_t)j->n_fit;
    TIDE_CHECK(encode(j, &m, &b->fit));

    tide_proto_ckpt_ref_t refs[TIDE_COORD_CKPTS_MAX];
    for (int i = 0; i < j->n_ckpts; i++) {
        refs[i].step = j->ckpts[i].step;
        memcpy(refs[i].dir, j->ckpts[i].dir, sizeof refs[i].dir);
    }
    tide_msg_init(&m, TIDE_MSG_JOB_CKPTS);
    m.u.job_ckpts.ckpts = refs;
    m.u.job_ckpts.n_ckpts = (uint32_t)j->n_ckpts;
    TIDE_CHECK(encode(j, &m, &b->ckpts));

    tide_msg_init(&m, TIDE_MSG_JOB_ARGV);
    m.u.job_argv.argv = j->argv;
    m.u.job_argv.argc = j->argc;
    TIDE_CHECK(encode(j, &m, &b->argv));
    if (j->layout)
        TIDE_CHECK(encode_layout(j, j->layout, j->generation, &b->layout));
    if (j->reconf)
        TIDE_CHECK(encode_layout(j, j->reconf->layout, j->reconf->gen, &b->rc_layout));
    return TIDE_OK;
}

static void bind_blob(sqlite3_stmt *st, int col, const tide_proto_buf_t *b)
{
    if (b->len > 0)
        sqlite3_bind_blob(st, col + 1, b->data, (int)b->len, SQLITE_STATIC);
}

tide_status tide_store_put_job(tide_store_t *s, const tide_coord_job_t *j)
{
    TIDE_CHECK(tide__store_need_txn(s, "put_job"));
    if (s->schema < 2)
        return tide_errorf(TIDE_ERR_INTERNAL,
                           "state file %s is of schema %d: tide_store_load migrates it before "
                           "any job is written",
                           s->path, s->schema);
    job_blobs b;
    memset(&b, 0, sizeof b);
    tide_status rc = encode_job(j, &b);
    if (rc != TIDE_OK) {
        blobs_destroy(&b);
        return rc;
    }
    sqlite3_stmt *st = s->st[TIDE__ST_JOB];
    sqlite3_bind_int64(st, C_ID + 1, j->id);
    sqlite3_bind_text(st, C_NAME + 1, j->name, -1, SQLITE_STATIC);
    sqlite3_bind_int(st, C_KIND + 1, (int)j->kind);
    sqlite3_bind_int(st, C_STATE + 1, (int)j->state);
    sqlite3_bind_int64(st, C_CREATED + 1, j->created_ms);
    bind_blob(st, C_POOLS, &b.pools);
    bind_blob(st, C_LAYOUT, &b.layout);
    sqlite3_bind_int64(st, C_GEN + 1, (sqlite3_int64)j->generation);
    sqlite3_bind_int64(st, C_GEN_ISSUED + 1, (sqlite3_int64)j->gen_issued);
    sqlite3_bind_int64(st, C_STEP + 1, j->step);
    sqlite3_bind_int(st, C_REQ_DP + 1, j->req_dp);
    sqlite3_bind_int(st, C_REQ_TP + 1, j->req_tp);
    sqlite3_bind_int(st, C_REQ_PP + 1, j->req_pp);
    sqlite3_bind_int(st, C_REQ_MICRO + 1, j->req_micro);
    sqlite3_bind_int64(st, C_TOTAL_BYTES + 1, (sqlite3_int64)j->total_bytes);
    if (j->join_blob)
        sqlite3_bind_blob(st, C_JOIN + 1, j->join_blob, (int)j->join_len, SQLITE_STATIC);
    sqlite3_bind_int(st, C_PRIORITY + 1, j->priority);
    sqlite3_bind_int(st, C_OKIND + 1, (int)j->okind);
    sqlite3_bind_text(st, C_PLUGIN + 1, j->plugin, -1, SQLITE_STATIC);
    bind_blob(st, C_ARGV, &b.argv);
    sqlite3_bind_int64(st, C_MEM_CAP + 1, (sqlite3_int64)j->mem_cap);
    sqlite3_bind_int(st, C_BUBBLES + 1, j->bubbles);
    sqlite3_bind_int(st, C_ATTEMPTS + 1, j->attempts);
    sqlite3_bind_int(st, C_MAX_ATTEMPTS + 1, j->max_attempts);
    sqlite3_bind_int(st, C_WORKER + 1, j->worker);
    sqlite3_bind_int64(st, C_GRACE + 1, j->grace_ms);
    sqlite3_bind_int64(st, C_MAX_MEMORY + 1, (sqlite3_int64)j->max_memory);
    sqlite3_bind_int64(st, C_MAX_PROCS + 1, j->max_procs);
    sqlite3_bind_int(st, C_LAYERS + 1, j->num_layers);
    sqlite3_bind_int(st, C_FAILURES + 1, j->failures);
    bind_blob(st, C_FIT, &b.fit);
    bind_blob(st, C_CKPTS, &b.ckpts);
    if (j->reconf) {
        const tide_reconf_t *r = j->reconf;
        sqlite3_bind_int64(st, C_RC_GEN + 1, (sqlite3_int64)r->gen);
        sqlite3_bind_int(st, C_RC_RECOVER + 1, r->recover);
        sqlite3_bind_int(st, C_RC_PHASE + 1, (int)r->phase);
        sqlite3_bind_int64(st, C_RC_SWITCH + 1, r->switch_step);
        sqlite3_bind_int64(st, C_RC_STARTED + 1, r->started_ms);
        bind_blob(st, C_RC_LAYOUT, &b.rc_layout);
        sqlite3_bind_text(st, C_RC_REASON + 1, r->reason, -1, SQLITE_STATIC);
        sqlite3_bind_int(st, C_RC_SWITCHED + 1, r->switched);
        sqlite3_bind_text(st, C_RC_CKPT + 1, r->ckpt, -1, SQLITE_STATIC);
        sqlite3_bind_int64(st, C_RC_CKPT_STEP + 1, r->ckpt_step);
    }
    rc = tide__store_step_done(s, TIDE__ST_JOB, "saving a job");
    blobs_destroy(&b);
    return rc == TIDE_OK ? put_elastic(s, j) : rc;
}

/* ---- reading ------------------------------------------------------------------------------ */

/* "state file P: job J: its <part>: <detail>", a protocol error (bad stored data) unless
   memory ran out. */
static tide_status bad_part(tide_store_t *s, const tide_coord_job_t *j, const char *part,
                            tide_status rc)
{
    return tide_errorf(rc == TIDE_ERR_NOMEM ? rc : TIDE_ERR_PROTOCOL,
                       "state file %s: job %s: its %s: %s", s->path, j->name, part,
                       tide_last_error());
}

/* What a schema-1 text needs besides itself: a layout's generation, the size of a bare
   pool name's pool. */
typedef struct legacy_arg {
    uint64_t gen;
    int32_t size0;
} legacy_arg;

/*
 * Column col of row q as a record of `type` into *m: a record blob in a schema-2 file, or
 * in a schema-1 file the old text read through proto_legacy.h. NULL leaves *m empty
 * (TIDE_MSG_NONE): allowed where `optional`, else (schema 2) damage.
 */
static tide_status read_record(tide_store_t *s, sqlite3_stmt *q, int col, tide_msg_type_t type,
                               int optional, const legacy_arg *la, tide_msg_t *m)
{
    tide_msg_init(m, TIDE_MSG_NONE);
    int ct = sqlite3_column_type(q, col);
    if (s->schema >= 2 && !(ct == SQLITE_BLOB || (ct == SQLITE_NULL && optional)))
        return tide_errorf(TIDE_ERR_PROTOCOL, "no stored '%s' record (the column is %s)",
                           tide_msg_type_name(type), ct == SQLITE_NULL ? "NULL" : "not a BLOB");
    if (s->schema >= 2 || type == TIDE_MSG_JOB_ARGV) {
        const void *blob = sqlite3_column_blob(q, col); /* before its size: SQLite's order */
        size_t len = (size_t)sqlite3_column_bytes(q, col);
        if (s->schema < 2)
            return tide_proto_legacy_argv(blob, len, m);
        return ct == SQLITE_NULL ? TIDE_OK : tide_proto_decode_record(blob, len, type, m);
    }
    const char *text = (const char *)sqlite3_column_text(q, col);
    if (text == NULL && optional)
        return TIDE_OK;
    switch (type) {
    case TIDE_MSG_JOB_LAYOUT:
        return tide_proto_legacy_layout(text, la->gen, m);
    case TIDE_MSG_JOB_POOLS:
        return tide_proto_legacy_pools(text, la->size0, m);
    case TIDE_MSG_JOB_FIT:
        return tide_proto_legacy_fit(text, m);
    default:
        return tide_proto_legacy_ckpts(text, m);
    }
}

static tide_status apply_pools(tide_coord_job_t *j, tide_msg_t *m)
{
    const tide_proto_job_pools_t *x = &m->u.job_pools;
    j->n_pools = 0;
    for (uint32_t i = 0; i < x->n_pools; i++) {
        const tide_proto_job_pool_t *p = &x->pools[i];
        TIDE_CHECK(tide_coord_job_add_pool(j, p->name, p->size, p->connected));
        j->pools[j->n_pools - 1].left = p->left;
    }
    return TIDE_OK;
}

/* The layout of a "job_layout" record stored for generation gen; NULL for none. */
static tide_status layout_of(const tide_msg_t *m, uint64_t gen, tide_layout_t **out)
{
    *out = NULL;
    if (m->type == TIDE_MSG_NONE)
        return TIDE_OK;
    const tide_proto_layout_t *l = &m->u.job_layout.layout;
    if (l->gen != gen)
        return tide_errorf(TIDE_ERR_PROTOCOL, "it is of generation %llu, not %llu",
                           (unsigned long long)l->gen, (unsigned long long)gen);
    return tide_proto_layout_to(l, out);
}

static tide_status apply_layout(tide_coord_job_t *j, tide_msg_t *m)
{
    return layout_of(m, j->generation, &j->layout);
}

/* A job saved before joins carried fit rules (schema 1, its fit column NULL) has none, and
   its stored first join gets "fit": [] so that it decodes under today's schema (placement,
   estimates and a later pool's join read it). Else the rules as a program would have to
   send them: a damaged one is refused, not read as a weaker rule. */
static tide_status apply_fit(tide_coord_job_t *j, tide_msg_t *m)
{
    j->n_fit = 0;
    if (m->type == TIDE_MSG_NONE) {
        if (j->join_blob == NULL)
            return TIDE_OK;
        uint8_t *blob = NULL;
        size_t len = 0;
        TIDE_CHECK(tide_proto_join_upgrade(j->join_blob, j->join_len, &blob, &len));
        tide_free(j->join_blob);
        j->join_blob = blob;
        j->join_len = len;
        return TIDE_OK;
    }
    const tide_proto_job_fit_t *x = &m->u.job_fit;
    tide_proto_fit_to(j->fit, x->fit, x->n_fit);
    j->n_fit = (int)x->n_fit;
    tide_status rc = tide_fit_check(j->fit, (size_t)j->n_fit, 1, 1, 1, 1);
    if (rc != TIDE_OK)
        j->n_fit = 0;
    return rc;
}

static tide_status apply_ckpts(tide_coord_job_t *j, tide_msg_t *m)
{
    const tide_proto_job_ckpts_t *x = &m->u.job_ckpts;
    j->n_ckpts = 0;
    for (uint32_t i = 0; i < x->n_ckpts; i++)
        TIDE_CHECK(tide_coord_job_add_ckpt(j, x->ckpts[i].step, x->ckpts[i].dir));
    return TIDE_OK;
}

/* Takes the command line out of the record (the job owns it from now on). */
static tide_status apply_argv(tide_coord_job_t *j, tide_msg_t *m)
{
    j->argv = m->u.job_argv.argv;
    j->argc = m->u.job_argv.argc;
    m->u.job_argv.argv = NULL;
    m->u.job_argv.argc = 0;
    return TIDE_OK;
}

/* The structured parts of a job row, in the order they are read (the join, a scalar,
   before the fit rules that may upgrade it). */
typedef struct part {
    int col;
    tide_msg_type_t type;
    int optional[3]; /* by schema (index 1, 2): the column may be NULL */
    const char *name;
    tide_status (*apply)(tide_coord_job_t *j, tide_msg_t *m);
} part_t;

static const part_t parts[] = {
    {C_POOLS, TIDE_MSG_JOB_POOLS, {0, 1, 0}, "pools", apply_pools},
    {C_LAYOUT, TIDE_MSG_JOB_LAYOUT, {0, 1, 1}, "layout", apply_layout},
    {C_FIT, TIDE_MSG_JOB_FIT, {0, 1, 0}, "fit rules", apply_fit},
    {C_CKPTS, TIDE_MSG_JOB_CKPTS, {0, 1, 0}, "checkpoints", apply_ckpts},
    {C_ARGV, TIDE_MSG_JOB_ARGV, {0, 1, 0}, "command line", apply_argv},
};

/* The structured parts of row q into j, whose scalars (generation, join) are read. */
static tide_status read_parts(tide_store_t *s, tide_coord_state_t *st, sqlite3_stmt *q,
                              tide_coord_job_t *j)
{
    legacy_arg la = {j->generation, 0};
    if (s->schema < 2) { /* a bare pool name (schema 1's oldest files): its rank 0's pool size */
        const char *pools = (const char *)sqlite3_column_text(q, C_POOLS);
        const tide_coord_worker_t *w0 = pools ? tide_coord_worker_find(st, pools, 0) : NULL;
        la.size0 = w0 ? w0->pool_size : 0;
    }
    for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++) {
        const part_t *p = &parts[i];
        tide_msg_t m;
        tide_status rc = read_record(s, q, p->col, p->type, p->optional[s->schema], &la, &m);
        if (rc == TIDE_OK)
            rc = p->apply(j, &m);
        tide_msg_clear(&m);
        if (rc != TIDE_OK)
            return bad_part(s, j, p->name, rc);
    }
    return TIDE_OK;
}

/* The pending reconfiguration of row q, if it has one (its layout column is not NULL). */
static tide_status read_reconf(tide_store_t *s, sqlite3_stmt *q, tide_coord_job_t *j)
{
    legacy_arg la = {(uint64_t)sqlite3_column_int64(q, C_RC_GEN), 0};
    tide_msg_t m;
    tide_layout_t *nl = NULL;
    tide_status rc = read_record(s, q, C_RC_LAYOUT, TIDE_MSG_JOB_LAYOUT, 1, &la, &m);
    if (rc == TIDE_OK)
        rc = layout_of(&m, la.gen, &nl);
    tide_msg_clear(&m);
    if (rc != TIDE_OK)
        return bad_part(s, j, "pending reconfiguration's layout", rc);
    if (nl == NULL)
        return TIDE_OK;
    TIDE_CHECK(
        tide_reconf_new(&j->reconf, j->layout, nl, la.gen, sqlite3_column_int(q, C_RC_RECOVER)));
    tide_reconf_t *r = j->reconf;
    r->phase = sqlite3_column_int(q, C_RC_PHASE) ? TIDE_RP_COMMIT : TIDE_RP_PREPARE;
    r->switch_step = sqlite3_column_int64(q, C_RC_SWITCH);
    r->started_ms = sqlite3_column_int64(q, C_RC_STARTED);
    tide__store_copy_text(r->reason, sizeof r->reason, sqlite3_column_text(q, C_RC_REASON));
    r->switched = r->phase == TIDE_RP_COMMIT && sqlite3_column_int(q, C_RC_SWITCHED);
    tide__store_copy_text(r->ckpt, sizeof r->ckpt, sqlite3_column_text(q, C_RC_CKPT));
    r->ckpt_step = r->ckpt[0] ? sqlite3_column_int64(q, C_RC_CKPT_STEP) : 0;
    return TIDE_OK;
}

/* The scalar columns of row q into a new job of st. */
static tide_status read_scalars(tide_store_t *s, tide_coord_state_t *st, sqlite3_stmt *q,
                                tide_coord_job_t **out)
{
    int kind = sqlite3_column_int(q, C_KIND), state = sqlite3_column_int(q, C_STATE);
    if (kind < 0 || kind > 1 || state < 0 || state > TIDE_JS_CANCELLED)
        return tide_errorf(TIDE_ERR_IO, "state file %s: job %lld is corrupt", s->path,
                           (long long)sqlite3_column_int64(q, C_ID));
    tide_coord_job_t *j = NULL;
    TIDE_CHECK(tide_coord_job_add(st, sqlite3_column_int64(q, C_ID), (tide_job_kind)kind, &j));
    *out = j;
    tide__store_copy_text(j->name, sizeof j->name, sqlite3_column_text(q, C_NAME));
    j->state = (tide_jstate)state;
    j->created_ms = sqlite3_column_int64(q, C_CREATED);
    j->generation = (uint64_t)sqlite3_column_int64(q, C_GEN);
    j->gen_issued = (uint64_t)sqlite3_column_int64(q, C_GEN_ISSUED);
    j->step = sqlite3_column_int64(q, C_STEP);
    j->req_dp = sqlite3_column_int(q, C_REQ_DP);
    j->req_tp = sqlite3_column_int(q, C_REQ_TP);
    j->req_pp = sqlite3_column_int(q, C_REQ_PP);
    j->req_micro = sqlite3_column_int(q, C_REQ_MICRO);
    j->total_bytes = (uint64_t)sqlite3_column_int64(q, C_TOTAL_BYTES);
    int blen = sqlite3_column_bytes(q, C_JOIN);
    if (blen > 0) {
        j->join_blob = tide_malloc((size_t)blen);
        if (j->join_blob == NULL)
            return tide_errorf(TIDE_ERR_NOMEM, "out of memory loading job %s", j->name);
        memcpy(j->join_blob, sqlite3_column_blob(q, C_JOIN), (size_t)blen);
        j->join_len = (size_t)blen;
    }
    j->priority = sqlite3_column_int(q, C_PRIORITY);
    j->okind = (tide_offline_kind)(sqlite3_column_int(q, C_OKIND) ? 1 : 0);
    tide__store_copy_text(j->plugin, sizeof j->plugin, sqlite3_column_text(q, C_PLUGIN));
    j->mem_cap = (uint64_t)sqlite3_column_int64(q, C_MEM_CAP);
    j->bubbles = sqlite3_column_int(q, C_BUBBLES);
    j->attempts = sqlite3_column_int(q, C_ATTEMPTS);
    j->max_attempts = sqlite3_column_int(q, C_MAX_ATTEMPTS);
    j->worker = sqlite3_column_int(q, C_WORKER);
    j->grace_ms = sqlite3_column_int64(q, C_GRACE);
    j->max_memory = (uint64_t)sqlite3_column_int64(q, C_MAX_MEMORY); /* NULL (before): 0 */
    j->max_procs = (uint32_t)sqlite3_column_int64(q, C_MAX_PROCS);
    j->num_layers = sqlite3_column_int(q, C_LAYERS);
    j->failures = sqlite3_column_int(q, C_FAILURES);
    return TIDE_OK;
}

/* Rewrites every job of st in records and marks the file schema 2, in one transaction. */
static tide_status migrate(tide_store_t *s, tide_coord_state_t *st)
{
    TIDE_CHECK(tide_store_begin(s));
    s->schema = 2;
    tide_status rc = TIDE_OK;
    for (size_t i = 0; i < st->n_jobs && rc == TIDE_OK; i++)
        rc = tide_store_put_job(s, st->jobs[i]);
    char *err = NULL;
    if (rc == TIDE_OK && sqlite3_exec(s->db, "UPDATE meta SET value = '2' WHERE key = 'schema'",
                                      NULL, NULL, &err) != SQLITE_OK)
        rc = tide_errorf(TIDE_ERR_IO, "state file %s: marking it schema 2: %s", s->path,
                         err ? err : "?");
    sqlite3_free(err);
    if (rc == TIDE_OK)
        rc = tide_store_commit(s);
    if (rc != TIDE_OK) {
        tide_store_rollback(s);
        s->schema = 1;
        return rc;
    }
    TIDE_INFO("store",
              "state file %s: migrated %zu jobs from schema 1 (text fields) to 2 (records)",
              s->path, st->n_jobs);
    return TIDE_OK;
}

/* Loads every job into st (workers loaded first: a schema-1 pool list may need one). */
static tide_status load_jobs(tide_store_t *s, tide_coord_state_t *st)
{
    sqlite3_stmt *q = NULL;
    int src = sqlite3_prepare_v2(
        s->db,
        "SELECT id, name, kind, state, created_ms, pool, layout, generation, gen_issued, step,"
        " req_dp, req_tp, req_pp, req_micro, total_bytes, join_blob, priority, okind, plugin,"
        " argv, mem_cap, bubbles, attempts, max_attempts, worker, grace_ms, rc_gen, rc_recover,"
        " rc_phase, rc_switch, rc_started_ms, rc_layout, rc_reason, num_layers, rc_switched,"
        " failures, fit, ckpts, rc_ckpt, rc_ckpt_step, max_memory, max_procs FROM jobs"
        " ORDER BY id",
        -1, &q, NULL);
    if (src != SQLITE_OK)
        return tide__store_db_error(s, src, "loading jobs");
    tide_status rc = TIDE_OK;
    while (rc == TIDE_OK && (src = sqlite3_step(q)) == SQLITE_ROW) {
        tide_coord_job_t *j = NULL;
        rc = read_scalars(s, st, q, &j);
        if (rc == TIDE_OK)
            rc = read_parts(s, st, q, j);
        if (rc == TIDE_OK)
            rc = read_reconf(s, q, j);
    }
    if (rc == TIDE_OK && src != SQLITE_DONE)
        rc = tide__store_db_error(s, src, "loading jobs");
    sqlite3_finalize(q);
    if (rc == TIDE_OK && s->schema < 2)
        rc = migrate(s, st);
    return rc;
}

/* Here rather than in store.c, which holds the rest of the file's calls, so that the two
   files call one way: store_jobs.c uses store.c's helpers, never the reverse. */
tide_status tide_store_load(tide_store_t *s, tide_coord_state_t *st)
{
    if (st->n_workers != 0 || st->n_jobs != 0)
        return tide_errorf(TIDE_ERR_INVALID, "store: load into a non-empty state");
    TIDE_CHECK(tide__store_load_workers(s, st));
    TIDE_CHECK(load_jobs(s, st));
    TIDE_CHECK(load_elastic(s, st));
    return tide__store_add_event_fields(s);
}
