/*
 * Unit tests for coordinator/allocs: the pools' scheduler allocations in memory (many
 * entries through growth and removals, the label tidectl shows) and in the state file
 * (written in a transaction, read back by a new store on the same file; a row edited by
 * hand into something the protocol refuses is skipped, not loaded). In-process, ms.
 */
#include <criterion/criterion.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "coordinator/allocs.h"

static tide_proto_alloc_t slurm(const char *id, const char *node)
{
    tide_proto_alloc_t a;
    memset(&a, 0, sizeof a);
    strcpy(a.sched, "slurm");
    snprintf(a.id, sizeof a.id, "%s", id);
    strcpy(a.nodes, "h[1-3]");
    snprintf(a.node, sizeof a.node, "%s", node);
    strcpy(a.gpus, "0,1");
    strcpy(a.partition, "low");
    a.restarts = 1;
    return a;
}

static void count_each(void *ctx, const char *pool, const tide_proto_alloc_t *a)
{
    (void)pool;
    (void)a;
    (*(size_t *)ctx)++;
}

Test(allocs, table_through_growth_and_removals)
{
    tide_allocs_t *t = NULL;
    cr_assert_eq(tide_allocs_new(&t), TIDE_OK);
    cr_expect_null(tide_allocs_get(t, "p0"));
    char pool[32], id[16];
    for (int i = 0; i < 1000; i++) {
        snprintf(pool, sizeof pool, "h%d-%d", i % 7, i);
        snprintf(id, sizeof id, "%d", 100 + i);
        tide_proto_alloc_t a = slurm(id, "h1");
        cr_assert_eq(tide_allocs_put(t, pool, &a), TIDE_OK);
    }
    cr_expect_eq(tide_allocs_count(t), 1000u);
    for (int i = 0; i < 1000; i += 2) {
        snprintf(pool, sizeof pool, "h%d-%d", i % 7, i);
        tide_allocs_remove(t, pool);
    }
    tide_allocs_remove(t, "no-such-pool");
    cr_expect_eq(tide_allocs_count(t), 500u);
    for (int i = 0; i < 1000; i++) {
        snprintf(pool, sizeof pool, "h%d-%d", i % 7, i);
        const tide_proto_alloc_t *a = tide_allocs_get(t, pool);
        if (i % 2 == 0) {
            cr_expect_null(a, "%s was removed", pool);
        } else {
            cr_assert_not_null(a, "%s lost", pool);
            cr_expect_eq(atoi(a->id), 100 + i);
        }
    }
    /* removed slots are reused, and a replaced entry stays one */
    for (int i = 0; i < 2000; i++) {
        snprintf(pool, sizeof pool, "again-%d", i % 300);
        tide_proto_alloc_t a = slurm("7", "h2");
        cr_assert_eq(tide_allocs_put(t, pool, &a), TIDE_OK);
    }
    cr_expect_eq(tide_allocs_count(t), 800u);
    size_t n = 0;
    tide_allocs_each(t, count_each, &n);
    cr_expect_eq(n, 800u);
    /* no scheduler: the entry goes */
    tide_proto_alloc_t none;
    memset(&none, 0, sizeof none);
    cr_assert_eq(tide_allocs_put(t, "again-1", &none), TIDE_OK);
    cr_expect_null(tide_allocs_get(t, "again-1"));
    char label[64];
    tide_alloc_label(tide_allocs_get(t, "again-2"), label, sizeof label);
    cr_expect_str_eq(label, "slurm 7");
    tide_alloc_label(NULL, label, sizeof label);
    cr_expect_str_eq(label, "");
    tide_allocs_destroy(&t);
    cr_expect_null(t);
    tide_allocs_destroy(&t);
}

Test(allocs, state_file_round_trip)
{
    char path[] = "/tmp/tide-allocs-XXXXXX";
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    close(fd);
    unlink(path);
    tide_store_t *s = NULL;
    cr_assert_eq(tide_store_open(&s, path, 0), TIDE_OK, "%s", tide_last_error());
    tide_proto_alloc_t a = slurm("42", "h2"), b = slurm("43_1", "h3");
    tide_allocs_t *t = NULL;
    cr_assert_eq(tide_allocs_new(&t), TIDE_OK);
    cr_expect_eq(tide_store_load_allocs(s, t), TIDE_OK, "a file of before the table: none");
    cr_expect_eq(tide_allocs_count(t), 0u);
    cr_assert_eq(tide_store_begin(s), TIDE_OK);
    cr_expect_eq(tide_store_del_alloc(s, "p1"), TIDE_OK);
    cr_assert_eq(tide_store_commit(s), TIDE_OK);
    cr_expect_eq(tide_store_put_alloc(s, "p1", &a), TIDE_ERR_INTERNAL, "a write needs a transaction");
    cr_assert_eq(tide_store_begin(s), TIDE_OK);
    cr_assert_eq(tide_store_put_alloc(s, "p1", &a), TIDE_OK, "%s", tide_last_error());
    cr_assert_eq(tide_store_put_alloc(s, "p2", &b), TIDE_OK);
    cr_assert_eq(tide_store_put_alloc(s, "p3", &b), TIDE_OK);
    cr_assert_eq(tide_store_del_alloc(s, "p3"), TIDE_OK);
    cr_assert_eq(tide_store_commit(s), TIDE_OK);
    tide_store_close(&s);

    /* a row edited into something no worker could have reported */
    sqlite3 *db;
    cr_assert_eq(sqlite3_open(path, &db), SQLITE_OK);
    cr_assert_eq(sqlite3_exec(db, "INSERT INTO pool_allocs VALUES('p9','slurm','12;x','','','',"
                                  "'',0)", NULL, NULL, NULL), SQLITE_OK);
    sqlite3_close(db);

    cr_assert_eq(tide_store_open(&s, path, 0), TIDE_OK, "%s", tide_last_error());
    cr_assert_eq(tide_store_load_allocs(s, t), TIDE_OK, "%s", tide_last_error());
    cr_expect_eq(tide_allocs_count(t), 2u);
    const tide_proto_alloc_t *r = tide_allocs_get(t, "p1");
    cr_assert_not_null(r);
    cr_expect_eq(memcmp(r, &a, sizeof a), 0, "p1 came back different");
    cr_expect_str_eq(tide_allocs_get(t, "p2")->id, "43_1");
    cr_expect_null(tide_allocs_get(t, "p3"));
    cr_expect_null(tide_allocs_get(t, "p9"), "a refused row was loaded");
    tide_allocs_destroy(&t);
    tide_store_close(&s);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -f %s %s-wal %s-shm %s.seq", path, path, path, path);
    cr_expect_eq(system(cmd), 0);
}
