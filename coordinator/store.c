/*
 * coordinator/store: SQLite persistence for tided (see store.h): the file, its
 * checks, transactions, workers and offline attempts; a job's row is store_jobs.c's,
 * the events store_events.c's. Statements are prepared once; the event table refuses UPDATE
 * and DELETE through triggers, so history is append-only even for someone with
 * the sqlite3 shell who forgets.
 *
 * A file that exists is checked before it is used, and refused with the
 * reason when damaged: a 0-byte file or a lone WAL (the database was lost), a
 * WAL whose committed frames fail their checksums (SQLite would silently drop
 * them and every later commit), and whatever PRAGMA integrity_check reports
 * (torn or truncated pages, broken b-trees, indexes that disagree with their
 * rows). SQLite keeps no checksum of row contents in the main file, so a flip
 * inside an unindexed value is the one damage that can pass.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <sqlite3.h>

#include "core/alloc.h"
#include "core/error.h"
#include "core/log.h"
#include "coordinator/store_int.h"

/* The state schema a new file gets. 1: a job's layouts, pools, fit rules and checkpoints
   were text columns and its command line NUL-separated bytes; 2: each is a proto record.
   tide_store_load migrates a file of schema 1. */
#define SCHEMA_VERSION "2"

#define ST_WORKER     TIDE__ST_WORKER
#define ST_DEL_WORKER TIDE__ST_DEL_WORKER
#define ST_NEXT_ID    TIDE__ST_NEXT_ID
#define ST_JOB        TIDE__ST_JOB
#define ST_EVENT      TIDE__ST_EVENT
#define ST_EVENTS     TIDE__ST_EVENTS
#define ST_ATTEMPT    TIDE__ST_ATTEMPT
#define ST_ATTEMPTS   TIDE__ST_ATTEMPTS
#define ST_BEGIN      TIDE__ST_BEGIN
#define ST_COMMIT     TIDE__ST_COMMIT
#define ST_ROLLBACK   TIDE__ST_ROLLBACK
#define ST__COUNT     TIDE__ST_COUNT

static const char *const schema =
    "CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);"
    "CREATE TABLE IF NOT EXISTS workers("
    " id INTEGER PRIMARY KEY, pool TEXT NOT NULL, rank INTEGER NOT NULL, pool_size INTEGER,"
    " host TEXT NOT NULL, device INTEGER, memory INTEGER, kind INTEGER, pid INTEGER,"
    " state INTEGER NOT NULL, job INTEGER, offline_job INTEGER, joined INTEGER, owner TEXT,"
    " gone_ms INTEGER, fenced_job INTEGER, UNIQUE(pool, rank));"
    "CREATE TABLE IF NOT EXISTS jobs("
    " id INTEGER PRIMARY KEY, name TEXT NOT NULL UNIQUE, kind INTEGER NOT NULL,"
    " state INTEGER NOT NULL, created_ms INTEGER, pool BLOB, layout BLOB, generation INTEGER,"
    " gen_issued INTEGER, step INTEGER, req_dp INTEGER, req_tp INTEGER, req_pp INTEGER,"
    " req_micro INTEGER, total_bytes INTEGER, join_blob BLOB, priority INTEGER, okind INTEGER,"
    " plugin TEXT, argv BLOB, mem_cap INTEGER, bubbles INTEGER, attempts INTEGER,"
    " max_attempts INTEGER, worker INTEGER, grace_ms INTEGER,"
    " rc_gen INTEGER, rc_recover INTEGER, rc_phase INTEGER, rc_switch INTEGER,"
    " rc_started_ms INTEGER, rc_layout BLOB, rc_reason TEXT, num_layers INTEGER,"
    " rc_switched INTEGER, failures INTEGER, fit BLOB, ckpts BLOB, rc_ckpt TEXT,"
    " rc_ckpt_step INTEGER, max_memory INTEGER, max_procs INTEGER);"
    "CREATE TABLE IF NOT EXISTS events("
    " id INTEGER PRIMARY KEY AUTOINCREMENT, time_ms INTEGER NOT NULL, job TEXT NOT NULL,"
    " kind TEXT NOT NULL, detail TEXT NOT NULL, fields BLOB);"
    "CREATE INDEX IF NOT EXISTS events_time ON events(time_ms);"
    "CREATE TABLE IF NOT EXISTS offline_attempts("
    " job INTEGER NOT NULL, attempt INTEGER NOT NULL, worker INTEGER, host TEXT, log TEXT,"
    " state INTEGER, exit_code INTEGER, time_ms INTEGER, tail BLOB, PRIMARY KEY(job, attempt));"
    "CREATE TRIGGER IF NOT EXISTS events_no_update BEFORE UPDATE ON events"
    " BEGIN SELECT RAISE(ABORT, 'the event table is append-only'); END;"
    "CREATE TRIGGER IF NOT EXISTS events_no_delete BEFORE DELETE ON events"
    " BEGIN SELECT RAISE(ABORT, 'the event table is append-only'); END;"
    "INSERT OR IGNORE INTO meta(key, value) VALUES('schema', '" SCHEMA_VERSION "');";

static const char *const sql[ST__COUNT] = {
    [ST_WORKER] = "INSERT OR REPLACE INTO workers(id, pool, rank, pool_size, host, device, memory,"
                  " kind, pid, state, job, offline_job, joined, owner, gone_ms, fenced_job)"
                  " VALUES(?1,?2,?3,?4,?5,?6,?7,?8,?9,?10,?11,?12,?13,?14,?15,?16)",
    [ST_DEL_WORKER] = "DELETE FROM workers WHERE id = ?1",
    /* the ids handed out so far: a forgotten worker's id is never reused, restarts included */
    [ST_NEXT_ID] = "INSERT OR REPLACE INTO meta(key, value) VALUES('next_worker_id', ?1)",
    [ST_JOB] =
        "INSERT OR REPLACE INTO jobs(id, name, kind, state, created_ms, pool, layout,"
        " generation, gen_issued, step, req_dp, req_tp, req_pp, req_micro, total_bytes,"
        " join_blob, priority, okind, plugin, argv, mem_cap, bubbles, attempts,"
        " max_attempts, worker, grace_ms, rc_gen, rc_recover, rc_phase, rc_switch,"
        " rc_started_ms, rc_layout, rc_reason, num_layers, rc_switched, failures, fit, ckpts,"
        " rc_ckpt, rc_ckpt_step, max_memory, max_procs) VALUES(?1,"
        "?2,?3,?4,?5,?6,?7,?8,?9,?10,?11,?12,?13,?14,?15,?16,?17,?18,?19,?20,?21,?22,?23,?24,?25,"
        "?26,?27,?28,?29,?30,?31,?32,?33,?34,?35,?36,?37,?38,?39,?40,?41,?42)",
    /* the event statements are event_sql's */
    [ST_ATTEMPT] = "INSERT OR REPLACE INTO offline_attempts(job, attempt, worker, host, log, state,"
                   " exit_code, time_ms, tail) VALUES(?1,?2,?3,?4,?5,?6,?7,?8,?9)",
    [ST_ATTEMPTS] = "SELECT job, attempt, worker, host, log, state, exit_code, time_ms, tail FROM"
                    " (SELECT * FROM offline_attempts WHERE job = ?1 AND (?2 = 0 OR attempt = ?2)"
                    " ORDER BY attempt DESC LIMIT ?3) ORDER BY attempt",
    [ST_BEGIN] = "BEGIN IMMEDIATE",
    [ST_COMMIT] = "COMMIT",
    [ST_ROLLBACK] = "ROLLBACK",
    [TIDE__ST_SEQ] = "INSERT OR REPLACE INTO meta(key, value) VALUES('commit_seq', ?1)",
};

tide_status tide__store_db_error(tide_store_t *s, int code, const char *what)
{
    tide_status rc = (code == SQLITE_BUSY || code == SQLITE_LOCKED) ? TIDE_ERR_BUSY
                     : (code == SQLITE_NOMEM)                       ? TIDE_ERR_NOMEM
                                                                    : TIDE_ERR_IO;
    return tide_errorf(rc, "state file %s: %s: %s", s->path, what,
                       s->db ? sqlite3_errmsg(s->db) : sqlite3_errstr(code));
}

static tide_status exec(tide_store_t *s, const char *text, const char *what)
{
    char *err = NULL;
    int rc = sqlite3_exec(s->db, text, NULL, NULL, &err);
    if (rc != SQLITE_OK) {
        tide_status st =
            tide_errorf(rc == SQLITE_BUSY ? TIDE_ERR_BUSY : TIDE_ERR_IO, "state file %s: %s: %s",
                        s->path, what, err ? err : sqlite3_errstr(rc));
        sqlite3_free(err);
        return st;
    }
    return TIDE_OK;
}

tide_status tide__store_step_done(tide_store_t *s, int which, const char *what)
{
    sqlite3_stmt *st = s->st[which];
    int rc = sqlite3_step(st);
    sqlite3_reset(st);
    sqlite3_clear_bindings(st);
    if (rc != SQLITE_DONE)
        return tide__store_db_error(s, rc, what);
    return TIDE_OK;
}

/* The event statements: with the fields column, and without it for a file written before
   events had fields (until tide_store_load adds the column; their rows read as no fields).
   The filters of tide_store_query_events: 0 or '' for none. */
#define EVENTS_WHERE                                                                               \
    " FROM events WHERE id > ?1 AND time_ms >= ?2 AND (?3 = 0 OR time_ms < ?3) AND"                \
    " (?4 = '' OR job = ?4) AND (?5 = '' OR kind GLOB ?5)"
static const char *const event_sql[2][3] = {
    {"INSERT INTO events(time_ms, job, kind, detail) VALUES(?1,?2,?3,?4)",
     "SELECT id, time_ms, job, kind, detail, NULL" EVENTS_WHERE " ORDER BY id LIMIT ?6",
     "SELECT id, time_ms, job, kind, detail, NULL" EVENTS_WHERE " ORDER BY id DESC LIMIT ?6"},
    {"INSERT INTO events(time_ms, job, kind, detail, fields) VALUES(?1,?2,?3,?4,?5)",
     "SELECT id, time_ms, job, kind, detail, fields" EVENTS_WHERE " ORDER BY id LIMIT ?6",
     "SELECT id, time_ms, job, kind, detail, fields" EVENTS_WHERE " ORDER BY id DESC LIMIT ?6"},
};
static const int event_st[3] = {ST_EVENT, ST_EVENTS, TIDE__ST_EVENTS_NEWEST};

/* (Re)prepares the event statements for whether the file has the fields column. */
static tide_status prepare_events(tide_store_t *s)
{
    for (int i = 0; i < 3; i++) {
        sqlite3_finalize(s->st[event_st[i]]);
        s->st[event_st[i]] = NULL;
        const char *text = event_sql[s->ev_fields][i];
        int src = sqlite3_prepare_v3(s->db, text, -1, SQLITE_PREPARE_PERSISTENT,
                                     &s->st[event_st[i]], NULL);
        if (src != SQLITE_OK)
            return tide_errorf(TIDE_ERR_INTERNAL, "state file %s: preparing '%.40s': %s", s->path,
                               text, sqlite3_errmsg(s->db));
    }
    return TIDE_OK;
}

/* 1 when table has column name (names are ours, never a user's). */
static int has_column(tide_store_t *s, const char *table, const char *name, int *have)
{
    char q[160];
    snprintf(q, sizeof q, "SELECT 1 FROM pragma_table_info('%s') WHERE name = '%s'", table, name);
    sqlite3_stmt *st = NULL;
    int src = sqlite3_prepare_v2(s->db, q, -1, &st, NULL);
    *have = src == SQLITE_OK && sqlite3_step(st) == SQLITE_ROW;
    sqlite3_finalize(st);
    return src;
}

tide_status tide__store_add_event_fields(tide_store_t *s)
{
    if (s->ev_fields)
        return TIDE_OK;
    TIDE_CHECK(tide_store_begin(s));
    tide_status rc = exec(s, "ALTER TABLE events ADD COLUMN fields BLOB", "adding event fields");
    if (rc == TIDE_OK)
        rc = tide_store_commit(s);
    if (rc != TIDE_OK) {
        tide_store_rollback(s);
        return rc;
    }
    s->ev_fields = 1;
    return prepare_events(s);
}

/*
 * Columns added after schema 1 was first written (same schema version: nothing
 * was deployed): a state file from before gets them empty, which reads as
 * "no key bound", "no participant switched", "no failures counted" and "no fit
 * rules" (its jobs joined before programs declared them: any layout, as then).
 */
static tide_status add_columns(tide_store_t *s)
{
    static const char *const cols[][3] = {
        {"workers", "owner", "TEXT"},
        {"workers", "gone_ms", "INTEGER"},
        {"workers", "fenced_job", "INTEGER"},
        {"jobs", "rc_switched", "INTEGER"},
        {"jobs", "failures", "INTEGER"},
        {"jobs", "fit", "TEXT"},
        {"jobs", "ckpts", "TEXT"},
        {"jobs", "rc_ckpt", "TEXT"},
        {"jobs", "rc_ckpt_step", "INTEGER"},
        {"jobs", "max_memory", "INTEGER"}, /* an offline command's limits: empty is none */
        {"jobs", "max_procs", "INTEGER"},
    };
    for (size_t i = 0; i < sizeof cols / sizeof cols[0]; i++) {
        char q[160];
        snprintf(q, sizeof q, "SELECT 1 FROM pragma_table_info('%s') WHERE name = '%s'", cols[i][0],
                 cols[i][1]);
        sqlite3_stmt *st = NULL;
        int src = sqlite3_prepare_v2(s->db, q, -1, &st, NULL);
        int have = src == SQLITE_OK && sqlite3_step(st) == SQLITE_ROW;
        sqlite3_finalize(st);
        if (src != SQLITE_OK)
            return tide__store_db_error(s, src, "reading the table layout");
        if (have)
            continue;
        snprintf(q, sizeof q, "ALTER TABLE %s ADD COLUMN %s %s", cols[i][0], cols[i][1],
                 cols[i][2]);
        TIDE_CHECK(exec(s, q, "adding a column"));
    }
    return TIDE_OK;
}

#define DAMAGED_HOW_TO                                                                             \
    "tided will not start from it; keep it for inspection and restore a backup copy, or start "    \
    "with another --state file (the jobs and workers it held are then unknown to tided)"

static uint32_t be32(const uint8_t *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

/* SQLite's WAL checksum over n bytes (n % 8 == 0), continuing from s[2]. */
static void wal_cksum(int big, const uint8_t *d, size_t n, uint32_t s[2])
{
    for (size_t i = 0; i < n; i += 8) {
        uint32_t x0, x1;
        if (big) {
            x0 = be32(d + i);
            x1 = be32(d + i + 4);
        } else {
            memcpy(&x0, d + i, 4);
            memcpy(&x1, d + i + 4, 4);
        }
        s[0] += x0 + s[1];
        s[1] += x1 + s[0];
    }
}

/*
 * Checks path-wal frame by frame (the format in SQLite's wal.c). A torn tail (a
 * commit cut short by a crash) is normal and SQLite ignores it; a frame that fails
 * its checksum while a later frame of the same WAL ends a transaction means
 * committed changes would be dropped: damage.
 */
static tide_status check_wal(const char *path)
{
    char wal[600];
    snprintf(wal, sizeof wal, "%s-wal", path);
    FILE *f = fopen(wal, "rb");
    if (f == NULL)
        return TIDE_OK;
    tide_status rc = TIDE_OK;
    uint8_t hdr[32];
    uint8_t *page = NULL;
    size_t got = fread(hdr, 1, sizeof hdr, f);
    if (got == 0)
        goto out; /* an empty WAL holds nothing */
    uint32_t magic = be32(hdr);
    if (got < sizeof hdr || (magic & 0xFFFFFFFEu) != 0x377f0682u) {
        rc = tide_errorf(TIDE_ERR_IO,
                         "state file %s: its write-ahead log %s is damaged (bad "
                         "header); " DAMAGED_HOW_TO,
                         path, wal);
        goto out;
    }
    int big = magic & 1;
    uint32_t pgsz = be32(hdr + 8);
    uint32_t ck[2] = {0, 0};
    wal_cksum(big, hdr, 24, ck);
    if (ck[0] != be32(hdr + 24) || ck[1] != be32(hdr + 28)) {
        rc = tide_errorf(TIDE_ERR_IO,
                         "state file %s: its write-ahead log %s is damaged (header "
                         "checksum); " DAMAGED_HOW_TO,
                         path, wal);
        goto out;
    }
    if (pgsz < 512 || pgsz > 65536 || (pgsz & (pgsz - 1)) != 0)
        goto out; /* SQLite ignores such a WAL; the database file is checked on its own */
    page = tide_malloc(pgsz);
    if (page == NULL) {
        rc = tide_errorf(TIDE_ERR_NOMEM, "out of memory checking %s", wal);
        goto out;
    }
    uint32_t salt1 = be32(hdr + 16), salt2 = be32(hdr + 20);
    int bad = 0;
    uint64_t frame = 0, bad_frame = 0;
    uint8_t fh[24];
    while (fread(fh, 1, sizeof fh, f) == sizeof fh && fread(page, 1, pgsz, f) == pgsz) {
        frame++;
        if (be32(fh + 8) != salt1 || be32(fh + 12) != salt2)
            continue; /* a frame of an earlier WAL generation: SQLite stops here too */
        int commit = be32(fh + 4) != 0;
        if (bad) {
            if (commit) {
                rc = tide_errorf(TIDE_ERR_IO,
                                 "state file %s: its write-ahead log %s is damaged (frame %llu "
                                 "fails its checksum, yet later transactions were committed "
                                 "after it); " DAMAGED_HOW_TO,
                                 path, wal, (unsigned long long)bad_frame);
                goto out;
            }
            continue;
        }
        wal_cksum(big, fh, 8, ck);
        wal_cksum(big, page, pgsz, ck);
        if (ck[0] != be32(fh + 16) || ck[1] != be32(fh + 20)) {
            bad = 1;
            bad_frame = frame;
        }
    }
out:
    tide_free(page);
    fclose(f);
    return rc;
}

/* Refuses a state file that existed and lost its content (see the file comment). */
static tide_status check_existing(const char *path, int *existed, int *wal_existed)
{
    struct stat db, wal;
    char walp[600];
    snprintf(walp, sizeof walp, "%s-wal", path);
    int have_db = stat(path, &db) == 0;
    *wal_existed = stat(walp, &wal) == 0;
    int have_wal = *wal_existed && wal.st_size > 0;
    *existed = have_db && db.st_size > 0;
    if (!have_db && errno != ENOENT)
        return tide_errorf(TIDE_ERR_IO, "cannot read state file %s: %s", path, strerror(errno));
    if (have_db && db.st_size == 0 && !have_wal)
        return tide_errorf(TIDE_ERR_IO,
                           "state file %s exists but is empty (0 bytes): it was truncated or "
                           "replaced. tided wrote a header into it when it first started, so "
                           "its jobs and workers are lost; restore a backup copy, or delete the "
                           "file to start with no state",
                           path);
    if ((!have_db || db.st_size == 0) && have_wal)
        return tide_errorf(TIDE_ERR_IO,
                           "state file %s is missing or empty but its write-ahead log %s is "
                           "not: the database was lost; " DAMAGED_HOW_TO,
                           path, walp);
    if (*existed && db.st_size < 512)
        return tide_errorf(TIDE_ERR_IO,
                           "state file %s is %lld bytes, less than one SQLite page: it was "
                           "truncated; " DAMAGED_HOW_TO,
                           path, (long long)db.st_size);
    return *existed ? check_wal(path) : TIDE_OK;
}

/* PRAGMA integrity_check of an opened existing file; refuses anything but "ok". */
static tide_status check_integrity(tide_store_t *s)
{
    sqlite3_stmt *q = NULL;
    int src = sqlite3_prepare_v2(s->db, "PRAGMA integrity_check(8)", -1, &q, NULL);
    char first[256] = "";
    int rows = 0, ok = 0;
    if (src == SQLITE_OK) {
        while ((src = sqlite3_step(q)) == SQLITE_ROW) {
            const char *t = (const char *)sqlite3_column_text(q, 0);
            if (rows++ == 0) {
                snprintf(first, sizeof first, "%s", t ? t : "?");
                ok = t != NULL && strcmp(t, "ok") == 0;
            }
        }
    }
    sqlite3_finalize(q);
    if (src != SQLITE_DONE && src != SQLITE_OK)
        return tide_errorf(TIDE_ERR_IO, "state file %s is damaged (%s); " DAMAGED_HOW_TO, s->path,
                           sqlite3_errstr(src));
    if (!ok || rows != 1)
        return tide_errorf(
            TIDE_ERR_IO,
            "state file %s is damaged: integrity_check reports '%s'%s; " DAMAGED_HOW_TO, s->path,
            first, rows > 1 ? " and more" : "");
    return TIDE_OK;
}

/* The file's state schema into s->schema: 1 (read, then migrated by tide_store_load) or 2;
   any other is refused naming it. */
static tide_status read_schema(tide_store_t *s)
{
    sqlite3_stmt *q = NULL;
    char version[32] = "";
    sqlite3_prepare_v2(s->db, "SELECT value FROM meta WHERE key = 'schema'", -1, &q, NULL);
    if (q != NULL && sqlite3_step(q) == SQLITE_ROW)
        tide__store_copy_text(version, sizeof version, sqlite3_column_text(q, 0));
    sqlite3_finalize(q);
    s->schema = strcmp(version, "1") == 0 ? 1 : strcmp(version, SCHEMA_VERSION) == 0 ? 2 : 0;
    if (s->schema == 0)
        return tide_errorf(TIDE_ERR_UNSUPPORTED,
                           "state file %s has schema version '%s'; this tided reads versions 1 "
                           "and " SCHEMA_VERSION " (a newer tided wrote it? use a new --state "
                           "file)",
                           s->path, version);
    return TIDE_OK;
}

tide_status tide_store_open(tide_store_t **out, const char *path, int sync_full)
{
    return tide_store_open_ex(out, path, sync_full, 0);
}

tide_status tide_store_open_ex(tide_store_t **out, const char *path, int sync_full,
                               int accept_loss)
{
    tide_status rc = TIDE_OK;
    tide_store_t *s = tide_calloc(1, sizeof *s);
    if (s == NULL)
        return tide_errorf(TIDE_ERR_NOMEM, "out of memory opening the state file");
    snprintf(s->path, sizeof s->path, "%s", path);
    s->sync_full = sync_full;
    s->seq_fd = -1;
    int existed = 0, wal_existed = 0;
    TIDE_CHECK_GOTO(check_existing(path, &existed, &wal_existed), rc, fail);
    int src = sqlite3_open_v2(path, &s->db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, NULL);
    if (src != SQLITE_OK)
        TIDE_FAIL_GOTO(rc, fail, TIDE_ERR_IO,
                       "cannot open state file %s: %s (check the --state path and permissions)",
                       path, s->db ? sqlite3_errmsg(s->db) : sqlite3_errstr(src));
    sqlite3_extended_result_codes(s->db, 0);
    /* a file refused below, or never written (tide__store_seq_start), is left as it came:
       its WAL is not checkpointed into it at close */
    sqlite3_db_config(s->db, SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, 1, (int *)NULL);
    /* Exclusive locking: the first transaction takes the lock for the life of the
     * connection, so a second tided on the same file fails at once. */
    TIDE_CHECK_GOTO(exec(s, "PRAGMA locking_mode=EXCLUSIVE", "locking mode"), rc, fail);
    {
        sqlite3_stmt *q = NULL;
        src = sqlite3_prepare_v2(s->db, "PRAGMA journal_mode=WAL", -1, &q, NULL);
        if (src == SQLITE_OK)
            src = sqlite3_step(q);
        const char *mode = src == SQLITE_ROW ? (const char *)sqlite3_column_text(q, 0) : NULL;
        int wal = mode != NULL && strcmp(mode, "wal") == 0;
        sqlite3_finalize(q);
        if (src == SQLITE_BUSY)
            TIDE_FAIL_GOTO(rc, fail, TIDE_ERR_BUSY,
                           "state file %s is in use by another tided (stop it or use another "
                           "--state)",
                           path);
        if (!wal && existed)
            TIDE_FAIL_GOTO(rc, fail, TIDE_ERR_IO,
                           "state file %s is not a readable SQLite database (%s): it is damaged "
                           "or not a tide state file; " DAMAGED_HOW_TO,
                           path, sqlite3_errmsg(s->db));
        if (!wal)
            TIDE_FAIL_GOTO(rc, fail, TIDE_ERR_IO,
                           "state file %s: cannot switch to WAL mode (%s); is it a SQLite file?",
                           path, sqlite3_errmsg(s->db));
    }
    if (existed)
        TIDE_CHECK_GOTO(check_integrity(s), rc, fail);
    TIDE_CHECK_GOTO(tide__store_seq_check(s, existed, wal_existed, accept_loss), rc, fail);
    TIDE_CHECK_GOTO(
        exec(s, sync_full ? "PRAGMA synchronous=FULL" : "PRAGMA synchronous=NORMAL", "synchronous"),
        rc, fail);
    rc = exec(s, "BEGIN EXCLUSIVE", "lock");
    if (rc == TIDE_ERR_BUSY)
        TIDE_FAIL_GOTO(rc, fail, TIDE_ERR_BUSY,
                       "state file %s is in use by another tided (stop it or use another --state)",
                       path);
    TIDE_CHECK_GOTO(rc, rc, fail);
    rc = exec(s, schema, "creating tables");
    if (rc != TIDE_OK) {
        exec(s, "ROLLBACK", "rollback");
        goto fail;
    }
    rc = add_columns(s);
    if (rc != TIDE_OK) {
        exec(s, "ROLLBACK", "rollback");
        goto fail;
    }
    TIDE_CHECK_GOTO(exec(s, "COMMIT", "creating tables"), rc, fail);
    TIDE_CHECK_GOTO(read_schema(s), rc, fail);
    src = has_column(s, "events", "fields", &s->ev_fields);
    if (src != SQLITE_OK)
        TIDE_FAIL_GOTO(rc, fail, TIDE_ERR_IO, "state file %s: reading the event table: %s", path,
                       sqlite3_errmsg(s->db));
    TIDE_CHECK_GOTO(prepare_events(s), rc, fail);
    for (int i = 0; i < ST__COUNT; i++) {
        if (sql[i] == NULL)
            continue; /* an event statement: prepared above */
        src = sqlite3_prepare_v3(s->db, sql[i], -1, SQLITE_PREPARE_PERSISTENT, &s->st[i], NULL);
        if (src != SQLITE_OK)
            TIDE_FAIL_GOTO(rc, fail, TIDE_ERR_INTERNAL, "state file %s: preparing '%.40s': %s",
                           path, sql[i], sqlite3_errmsg(s->db));
    }
    *out = s;
    return TIDE_OK;
fail:
    tide_store_close(&s);
    if (existed && !wal_existed) { /* a refused file is left as it was: no WAL of ours */
        char walp[600];
        snprintf(walp, sizeof walp, "%s-wal", path);
        unlink(walp);
    }
    return rc;
}

void tide_store_close(tide_store_t **self_p)
{
    if (self_p == NULL || *self_p == NULL)
        return;
    tide_store_t *s = *self_p;
    if (s->in_txn)
        tide_store_rollback(s);
    tide__store_seq_close(s);
    for (int i = 0; i < ST__COUNT; i++)
        sqlite3_finalize(s->st[i]);
    sqlite3_close(s->db);
    tide_free(s);
    *self_p = NULL;
}

tide_status tide_store_begin(tide_store_t *s)
{
    if (s->in_txn)
        return TIDE_OK;
    if (s->seq_fd < 0)
        TIDE_CHECK(tide__store_seq_start(s)); /* the first write: the file is in use now */
    TIDE_CHECK(tide__store_step_done(s, ST_BEGIN, "begin"));
    s->in_txn = 1;
    return TIDE_OK;
}

int tide_store_in_txn(const tide_store_t *s)
{
    return s->in_txn;
}

tide_status tide_store_commit(tide_store_t *s)
{
    if (!s->in_txn)
        return TIDE_OK;
    tide_status rc = tide__store_seq_bump(s);
    if (rc == TIDE_OK)
        rc = tide__store_step_done(s, ST_COMMIT, "commit");
    if (rc != TIDE_OK) {
        tide_store_rollback(s);
        return rc;
    }
    s->in_txn = 0;
    tide__store_seq_committed(s);
    return TIDE_OK;
}

void tide_store_rollback(tide_store_t *s)
{
    if (!s->in_txn)
        return;
    sqlite3_step(s->st[ST_ROLLBACK]);
    sqlite3_reset(s->st[ST_ROLLBACK]);
    s->in_txn = 0;
}

tide_status tide__store_need_txn(tide_store_t *s, const char *what)
{
    if (!s->in_txn)
        return tide_errorf(TIDE_ERR_INTERNAL, "store: %s outside a transaction", what);
    return TIDE_OK;
}

tide_status tide_store_put_worker(tide_store_t *s, const tide_coord_worker_t *w)
{
    TIDE_CHECK(tide__store_need_txn(s, "put_worker"));
    sqlite3_stmt *st = s->st[ST_WORKER];
    sqlite3_bind_int(st, 1, w->id);
    sqlite3_bind_text(st, 2, w->pool, -1, SQLITE_STATIC);
    sqlite3_bind_int(st, 3, w->rank);
    sqlite3_bind_int(st, 4, w->pool_size);
    sqlite3_bind_text(st, 5, w->host, -1, SQLITE_STATIC);
    sqlite3_bind_int(st, 6, w->device);
    sqlite3_bind_int64(st, 7, (sqlite3_int64)w->memory);
    sqlite3_bind_int(st, 8, w->kind);
    sqlite3_bind_int(st, 9, w->pid);
    sqlite3_bind_int(st, 10, (int)w->state);
    sqlite3_bind_int64(st, 11, w->job);
    sqlite3_bind_int64(st, 12, w->offline_job);
    sqlite3_bind_int64(st, 13, w->joined);
    sqlite3_bind_text(st, 14, w->owner, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 15, w->gone_ms);
    sqlite3_bind_int64(st, 16, w->fenced_job);
    return tide__store_step_done(s, ST_WORKER, "saving a worker");
}

tide_status tide_store_del_worker(tide_store_t *s, int32_t id, int32_t next_id)
{
    TIDE_CHECK(tide__store_need_txn(s, "del_worker"));
    sqlite3_bind_int(s->st[ST_DEL_WORKER], 1, id);
    TIDE_CHECK(tide__store_step_done(s, ST_DEL_WORKER, "forgetting a worker"));
    sqlite3_bind_int(s->st[ST_NEXT_ID], 1, next_id); /* stored as text: meta's affinity */
    return tide__store_step_done(s, ST_NEXT_ID, "recording the worker ids handed out");
}

void tide__store_copy_text(char *dst, size_t cap, const unsigned char *src)
{
    snprintf(dst, cap, "%s", src ? (const char *)src : "");
}

tide_status tide__store_load_workers(tide_store_t *s, tide_coord_state_t *st)
{
    sqlite3_stmt *q = NULL;
    int src = sqlite3_prepare_v2(s->db,
                                 "SELECT id, pool, rank, pool_size, host, device, memory, kind, "
                                 "pid, state, job, offline_job, joined, owner, gone_ms, fenced_job "
                                 "FROM workers ORDER BY id",
                                 -1, &q, NULL);
    if (src != SQLITE_OK)
        return tide__store_db_error(s, src, "loading workers");
    tide_status rc = TIDE_OK;
    while ((src = sqlite3_step(q)) == SQLITE_ROW) {
        tide_coord_worker_t *w = NULL;
        const char *pool = (const char *)sqlite3_column_text(q, 1);
        TIDE_CHECK_GOTO(tide_coord_worker_add(st, sqlite3_column_int(q, 0), pool ? pool : "",
                                              sqlite3_column_int(q, 2), &w),
                        rc, out);
        w->pool_size = sqlite3_column_int(q, 3);
        tide__store_copy_text(w->host, sizeof w->host, sqlite3_column_text(q, 4));
        w->device = sqlite3_column_int(q, 5);
        w->memory = (uint64_t)sqlite3_column_int64(q, 6);
        w->kind = sqlite3_column_int(q, 7);
        w->pid = sqlite3_column_int(q, 8);
        int state = sqlite3_column_int(q, 9);
        if (state < TIDE_WS_IDLE || state > TIDE_WS_LEFT)
            TIDE_FAIL_GOTO(rc, out, TIDE_ERR_IO, "state file %s: worker %d has bad state %d",
                           s->path, w->id, state);
        w->state = (tide_wstate)state;
        w->job = sqlite3_column_int64(q, 10);
        w->offline_job = sqlite3_column_int64(q, 11);
        w->joined = sqlite3_column_int64(q, 12);
        tide__store_copy_text(w->owner, sizeof w->owner, sqlite3_column_text(q, 13));
        w->gone_ms = sqlite3_column_int64(q, 14);
        w->fenced_job = sqlite3_column_int64(q, 15);
    }
    if (src != SQLITE_DONE)
        rc = tide__store_db_error(s, src, "loading workers");
    if (rc != TIDE_OK)
        goto out;
    /* ids handed out before: those of forgotten workers stay used */
    sqlite3_finalize(q);
    q = NULL;
    src = sqlite3_prepare_v2(s->db, "SELECT value FROM meta WHERE key = 'next_worker_id'", -1, &q,
                             NULL);
    if (src != SQLITE_OK)
        return tide__store_db_error(s, src, "loading the next worker id");
    if ((src = sqlite3_step(q)) == SQLITE_ROW) {
        long long next = sqlite3_column_int64(q, 0);
        if (next < 0 || next > INT32_MAX)
            TIDE_FAIL_GOTO(rc, out, TIDE_ERR_IO, "state file %s: bad next worker id %lld", s->path,
                           next);
        if ((int32_t)next > st->next_worker_id)
            st->next_worker_id = (int32_t)next;
    } else if (src != SQLITE_DONE) {
        rc = tide__store_db_error(s, src, "loading the next worker id");
    }
out:
    sqlite3_finalize(q);
    return rc;
}

tide_status tide_store_put_attempt(tide_store_t *s, const tide_store_attempt_t *a)
{
    TIDE_CHECK(tide__store_need_txn(s, "put_attempt"));
    sqlite3_stmt *st = s->st[ST_ATTEMPT];
    sqlite3_bind_int64(st, 1, a->job);
    sqlite3_bind_int(st, 2, a->attempt);
    sqlite3_bind_int(st, 3, a->worker);
    sqlite3_bind_text(st, 4, a->host, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 5, a->log, -1, SQLITE_STATIC);
    sqlite3_bind_int(st, 6, a->state);
    sqlite3_bind_int(st, 7, a->exit_code);
    sqlite3_bind_int64(st, 8, a->time_ms);
    sqlite3_bind_blob(st, 9, a->tail, (int)strnlen(a->tail, sizeof a->tail), SQLITE_STATIC);
    return tide__store_step_done(s, ST_ATTEMPT, "saving an offline attempt");
}

tide_status tide_store_attempts(tide_store_t *s, int64_t job, int32_t attempt, uint32_t limit,
                                tide_store_attempt_t **rows, size_t *n)
{
    *rows = NULL;
    *n = 0;
    if (limit == 0)
        return TIDE_OK;
    tide_store_attempt_t *r = tide_calloc(limit, sizeof *r);
    if (r == NULL)
        return tide_errorf(TIDE_ERR_NOMEM, "out of memory reading %u attempts", limit);
    sqlite3_stmt *q = s->st[ST_ATTEMPTS];
    sqlite3_bind_int64(q, 1, job);
    sqlite3_bind_int(q, 2, attempt);
    sqlite3_bind_int64(q, 3, limit);
    size_t k = 0;
    int src = SQLITE_DONE;
    while (k < limit && (src = sqlite3_step(q)) == SQLITE_ROW) {
        tide_store_attempt_t *a = &r[k++];
        a->job = sqlite3_column_int64(q, 0);
        a->attempt = sqlite3_column_int(q, 1);
        a->worker = sqlite3_column_int(q, 2);
        tide__store_copy_text(a->host, sizeof a->host, sqlite3_column_text(q, 3));
        tide__store_copy_text(a->log, sizeof a->log, sqlite3_column_text(q, 4));
        a->state = sqlite3_column_int(q, 5);
        a->exit_code = sqlite3_column_int(q, 6);
        a->time_ms = sqlite3_column_int64(q, 7);
        int len = sqlite3_column_bytes(q, 8);
        const void *tail = sqlite3_column_blob(q, 8);
        if (len >= (int)sizeof a->tail)
            len = (int)sizeof a->tail - 1;
        if (tail != NULL && len > 0)
            memcpy(a->tail, tail, (size_t)len);
        a->tail[len > 0 ? len : 0] = '\0';
    }
    if (k < limit && src != SQLITE_DONE) {
        tide_status rc = tide__store_db_error(s, src, "reading offline attempts");
        sqlite3_reset(q);
        tide_free(r);
        return rc;
    }
    sqlite3_reset(q);
    *rows = r;
    *n = k;
    return TIDE_OK;
}
