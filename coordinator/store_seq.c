/*
 * coordinator/store_seq: what SQLite cannot see for itself, acknowledged commits that a
 * state file lost: its write-ahead log not copied with it, or a damaged last WAL frame
 * (SQLite takes a bad last frame for a torn write and drops that commit silently).
 *
 * Two witnesses, both written by tided and checked before the file is used:
 *  - the database counts its commits (meta 'commit_seq', bumped inside every committed
 *    transaction), and tided writes that count after each commit into a sidecar file
 *    "<state>.seq" (fdatasync'd with --sync-full): a file that holds fewer commits than its
 *    sidecar says were acknowledged lost the difference;
 *  - meta 'open' is 1 in the database file itself (checkpointed at start) while a tided
 *    has it open, 0 after a clean close (which also removes the WAL): a file that says it
 *    is open and has no WAL beside it was copied, or its WAL deleted, while in use.
 * Either is refused naming the file and the loss unless the operator accepts it
 * (tided --accept-state-loss). Both are written from the first transaction on (a file
 * tided only read is left as it came). One sidecar write per commit; single thread.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <sqlite3.h>

#include "core/error.h"
#include "core/log.h"
#include "coordinator/store_int.h"

#define SEQ_TEXT 21 /* "%020llu\n" */

/* The integer meta value of key, 0 when absent. */
static int64_t meta_int(tide_store_t *s, const char *key)
{
    sqlite3_stmt *q = NULL;
    int64_t v = 0;
    if (sqlite3_prepare_v2(s->db, "SELECT value FROM meta WHERE key = ?1", -1, &q, NULL) ==
        SQLITE_OK) {
        sqlite3_bind_text(q, 1, key, -1, SQLITE_STATIC);
        if (sqlite3_step(q) == SQLITE_ROW)
            v = sqlite3_column_int64(q, 0);
    }
    sqlite3_finalize(q);
    return v;
}

/* The sidecar's count; 0 when it is absent (a file of an older tided), -1 when unreadable. */
static int64_t read_sidecar(const char *path)
{
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return errno == ENOENT ? 0 : -1;
    unsigned long long v = 0;
    int ok = fscanf(f, "%llu", &v) == 1;
    fclose(f);
    return ok && v <= INT64_MAX ? (int64_t)v : -1;
}

/* The operator accepted the loss: the sidecar counts what the file holds from now on, so
   that the next start does not ask again. */
static tide_status accept_count(tide_store_t *s)
{
    FILE *f = fopen(s->seq_path, "w");
    int ok = f != NULL && fprintf(f, "%020llu\n", (unsigned long long)s->seq) == SEQ_TEXT;
    if (f != NULL && fclose(f) != 0)
        ok = 0;
    if (!ok)
        return tide_errorf(TIDE_ERR_IO, "cannot write %s (the state file's commit count): %s",
                           s->seq_path, strerror(errno));
    return TIDE_OK;
}

tide_status tide__store_seq_check(tide_store_t *s, int existed, int wal_existed, int accept_loss)
{
    snprintf(s->seq_path, sizeof s->seq_path, "%s.seq", s->path);
    s->seq = existed ? meta_int(s, "commit_seq") : 0;
    if (!existed)
        return TIDE_OK; /* a new file: a stale sidecar of a deleted one says nothing */
    int64_t acked = read_sidecar(s->seq_path);
    int in_use = meta_int(s, "open") != 0;
    char loss[1400] = "";
    if (acked < 0)
        snprintf(loss, sizeof loss, "its commit count %s cannot be read", s->seq_path);
    else if (acked > s->seq)
        snprintf(loss, sizeof loss,
                 "it holds %" PRId64 " commits but %s says tided acknowledged %" PRId64
                 ": the last %" PRId64 " are missing (its write-ahead log %s-wal was lost, "
                 "damaged in its last frames, or not copied with it)",
                 s->seq, s->seq_path, acked, acked - s->seq, s->path);
    else if (in_use && !wal_existed)
        snprintf(loss, sizeof loss,
                 "it was in use by a tided that did not stop cleanly, and its write-ahead log "
                 "%s-wal is missing (the file was copied without it, or it was deleted): the "
                 "commits in that log are lost",
                 s->path);
    if (loss[0] == '\0')
        return TIDE_OK;
    if (accept_loss) {
        TIDE_WARN("store", "state file %s: %s; starting from what it holds (--accept-state-loss)",
                  s->path, loss);
        return accept_count(s);
    }
    return tide_errorf(TIDE_ERR_IO,
                       "state file %s: %s. tided will not start from it: restore the file "
                       "together with its -wal (or a backup copy), or start with "
                       "--accept-state-loss to go on "
                       "from what it holds (jobs and workers of the missing commits are then "
                       "unknown to tided)",
                       s->path, loss);
}

/* Writes the count into the sidecar; a failure only warns (the sidecar then lags behind,
   which never refuses a file). */
static void write_sidecar(tide_store_t *s)
{
    if (s->seq_fd < 0)
        return;
    char text[SEQ_TEXT + 1];
    snprintf(text, sizeof text, "%020llu\n", (unsigned long long)s->seq);
    if (pwrite(s->seq_fd, text, SEQ_TEXT, 0) != SEQ_TEXT ||
        (s->sync_full && fdatasync(s->seq_fd) != 0))
        TIDE_WARN_LIMITED("store", "cannot write %s: %s", s->seq_path, strerror(errno));
}

tide_status tide__store_seq_start(tide_store_t *s)
{
    char q[160];
    snprintf(q, sizeof q,
             "INSERT OR REPLACE INTO meta(key, value) VALUES('open', 1), ('commit_seq', %" PRId64
             ")",
             s->seq);
    char *err = NULL;
    int src = sqlite3_exec(s->db, q, NULL, NULL, &err);
    if (src == SQLITE_OK) /* into the database file itself: a copy without the WAL says it */
        src = sqlite3_exec(s->db, "PRAGMA wal_checkpoint(TRUNCATE)", NULL, NULL, &err);
    if (src != SQLITE_OK) {
        tide_status rc = tide_errorf(TIDE_ERR_IO, "state file %s: marking it in use: %s", s->path,
                                     err ? err : sqlite3_errstr(src));
        sqlite3_free(err);
        return rc;
    }
    s->seq_fd = open(s->seq_path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (s->seq_fd < 0)
        return tide_errorf(TIDE_ERR_IO, "cannot write %s (the state file's commit count): %s",
                           s->seq_path, strerror(errno));
    write_sidecar(s);
    sqlite3_db_config(s->db, SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, 0, (int *)NULL);
    return TIDE_OK;
}

tide_status tide__store_seq_bump(tide_store_t *s)
{
    sqlite3_stmt *q = s->st[TIDE__ST_SEQ];
    sqlite3_bind_int64(q, 1, s->seq + 1);
    int src = sqlite3_step(q);
    sqlite3_reset(q);
    sqlite3_clear_bindings(q);
    if (src == SQLITE_DONE)
        return TIDE_OK;
    return tide_errorf(src == SQLITE_BUSY ? TIDE_ERR_BUSY : TIDE_ERR_IO,
                       "state file %s: counting the commit: %s", s->path, sqlite3_errmsg(s->db));
}

void tide__store_seq_committed(tide_store_t *s)
{
    s->seq++;
    write_sidecar(s);
}

void tide__store_seq_close(tide_store_t *s)
{
    if (s->seq_fd < 0)
        return;
    close(s->seq_fd);
    s->seq_fd = -1;
    if (s->in_txn)
        return;
    /* a clean stop: the WAL goes into the file at close; if 'open' cannot be cleared, the
       WAL is kept so that the next start does not take the file for a copy without it */
    if (sqlite3_exec(s->db, "INSERT OR REPLACE INTO meta(key, value) VALUES('open', 0)", NULL,
                     NULL, NULL) != SQLITE_OK) {
        int keep = 1;
        sqlite3_file_control(s->db, "main", SQLITE_FCNTL_PERSIST_WAL, &keep);
        TIDE_WARN("store", "state file %s: cannot mark a clean stop: %s", s->path,
                  sqlite3_errmsg(s->db));
    }
}
