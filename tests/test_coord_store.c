/*
 * Unit tests for the coordinator's SQLite store (store.h; part of test_coordinator,
 * tests/coord_fixture.h): a round trip and a reload, the append-only events and the
 * exclusive file, fit rules over a restart, state files an older tided wrote (schema 1,
 * tests/data) migrated or refused naming the job, the events query, a file that is no
 * database. In-process, milliseconds each.
 */
#include <criterion/criterion.h>
#include <msgpack.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "coordinator/event_fields.h"
#include "coordinator/state.h"
#include "coordinator/store.h"
#include "proto/proto.h"
#include "proto/proto_reshard.h"
#include "tests/coord_fixture.h"

Test(store, round_trip_and_reload)
{
    char path[64];
    tmp_path(path, sizeof path);
    tide_store_t *s = NULL;
    cr_assert_eq(tide_store_open(&s, path, 1), TIDE_OK, "%s", tide_last_error());
    tide_coord_state_t *st = NULL;
    cr_assert_eq(tide_coord_state_new(&st), TIDE_OK);
    tide_coord_worker_t *w = NULL;
    cr_assert_eq(tide_coord_worker_add(st, -1, "p", 3, &w), TIDE_OK);
    snprintf(w->host, sizeof w->host, "node-1");
    w->state = TIDE_WS_ONLINE;
    w->job = 1;
    w->memory = 1ull << 36;
    tide_coord_job_t *j = NULL;
    cr_assert_eq(tide_coord_job_add(st, 0, TIDE_CJOB_ONLINE, &j), TIDE_OK);
    snprintf(j->name, sizeof j->name, "train");
    cr_assert_eq(tide_coord_job_add_pool(j, "p", 16, 1), TIDE_OK);
    cr_assert_eq(tide_layout_new(&j->layout, 1, 1, 1, 4, 1), TIDE_OK);
    j->layout->worker[0] = 3;
    j->generation = j->gen_issued = 7;
    tide_layout_t *nl = NULL;
    cr_assert_eq(tide_layout_new(&nl, 2, 1, 1, 4, 1), TIDE_OK);
    nl->worker[0] = 3;
    nl->worker[1] = 9;
    cr_assert_eq(tide_reconf_new(&j->reconf, j->layout, nl, 8, 0), TIDE_OK);
    j->reconf->phase = TIDE_RP_COMMIT;
    j->reconf->switch_step = 42;
    j->reconf->recover = 1; /* a rollback to the checkpoint of step 40 */
    snprintf(j->reconf->ckpt, sizeof j->reconf->ckpt, "/ck/train/step-000000000040");
    j->reconf->ckpt_step = 40;
    cr_assert_eq(tide_coord_job_add_ckpt(j, 20, "/ck/train/step-000000000020"), TIDE_OK);
    cr_assert_eq(tide_coord_job_add_ckpt(j, 40, "/ck/train/step-000000000040"), TIDE_OK);
    tide_coord_job_t *o = NULL;
    cr_assert_eq(tide_coord_job_add(st, 0, TIDE_CJOB_OFFLINE, &o), TIDE_OK);
    snprintf(o->name, sizeof o->name, "eval");
    o->argv = tide_calloc(2, sizeof *o->argv);
    o->argv[0] = tide_strdup("python3");
    o->argv[1] = tide_strdup("eval.py");
    o->argc = 2;
    o->priority = -4;
    o->max_memory = 5ull << 30;
    o->max_procs = 64;
    cr_assert_eq(tide_store_put_worker(s, w), TIDE_ERR_INTERNAL); /* needs a transaction */
    cr_assert_eq(tide_store_begin(s), TIDE_OK);
    cr_assert_eq(tide_store_put_worker(s, w), TIDE_OK);
    cr_assert_eq(tide_store_put_job(s, j), TIDE_OK);
    cr_assert_eq(tide_store_put_job(s, o), TIDE_OK);
    cr_assert_eq(tide_store_event(s, 1000, "train", "resize_started", "to %d", 2), TIDE_OK);
    cr_assert_eq(tide_store_commit(s), TIDE_OK);
    /* an uncommitted change disappears */
    cr_assert_eq(tide_store_begin(s), TIDE_OK);
    cr_assert_eq(tide_store_event(s, 2000, "", "lost", "never committed"), TIDE_OK);
    tide_store_rollback(s);
    /* a second tided on the same file is refused */
    tide_store_t *other = NULL;
    cr_assert_eq(tide_store_open(&other, path, 1), TIDE_ERR_BUSY, "%s", tide_last_error());
    tide_store_close(&s);
    cr_assert_null(s);
    tide_coord_state_destroy(&st);

    cr_assert_eq(tide_store_open(&s, path, 0), TIDE_OK, "%s", tide_last_error());
    cr_assert_eq(tide_coord_state_new(&st), TIDE_OK);
    cr_assert_eq(tide_store_load(s, st), TIDE_OK, "%s", tide_last_error());
    w = tide_coord_worker_find(st, "p", 3);
    cr_assert_not_null(w);
    cr_assert_str_eq(w->host, "node-1");
    cr_assert_eq(w->state, TIDE_WS_ONLINE);
    cr_assert_eq(w->memory, 1ull << 36);
    j = tide_coord_job_by_name(st, "train");
    cr_assert_not_null(j);
    cr_assert_eq(j->generation, 7);
    cr_assert_eq(j->layout->worker[0], 3);
    cr_assert_not_null(j->reconf);
    cr_assert_eq(j->reconf->gen, 8);
    cr_assert_eq(j->reconf->phase, TIDE_RP_COMMIT);
    cr_assert_eq(j->reconf->switch_step, 42);
    cr_assert_str_eq(j->reconf->ckpt, "/ck/train/step-000000000040");
    cr_assert_eq(j->reconf->ckpt_step, 40);
    cr_assert_eq(j->n_ckpts, 2);
    cr_assert_eq(j->ckpts[1].step, 40);
    cr_assert_str_eq(j->ckpts[0].dir, "/ck/train/step-000000000020");
    cr_assert_eq(j->reconf->n_parts, 2);
    cr_assert(j->reconf->old_member[0] && !j->reconf->old_member[1]);
    o = tide_coord_job_by_name(st, "eval");
    cr_assert_eq(o->argc, 2);
    cr_assert_str_eq(o->argv[1], "eval.py");
    cr_assert_eq(o->priority, -4);
    cr_assert(o->max_memory == 5ull << 30 && o->max_procs == 64, "the limits survive a restart");
    tide_store_event_t *ev = NULL;
    size_t n = 0;
    tide_store_event_query_t all = {.limit = 100};
    cr_assert_eq(tide_store_query_events(s, &all, &ev, &n), TIDE_OK);
    cr_assert_eq(n, 1);
    cr_assert_str_eq(ev[0].kind, "resize_started");
    cr_assert_str_eq(ev[0].detail, "to 2");
    tide_store_events_free(&ev, n);
    tide_store_close(&s);
    tide_coord_state_destroy(&st);

    /* the event table is append-only even for direct SQL */
    sqlite3 *db = NULL;
    cr_assert_eq(sqlite3_open(path, &db), SQLITE_OK);
    cr_assert_neq(sqlite3_exec(db, "UPDATE events SET detail = 'x'", NULL, NULL, NULL), SQLITE_OK);
    cr_assert_neq(sqlite3_exec(db, "DELETE FROM events", NULL, NULL, NULL), SQLITE_OK);
    sqlite3_close(db);
    rm_db(path);
}

/* Copies tests/data/<name> (written by an older tided) to path. */
static void copy_fixture(const char *name, const char *path)
{
    char src[512];
    snprintf(src, sizeof src, "%s/%s", TIDE_TEST_DATA, name);
    FILE *in = fopen(src, "rb"), *out = fopen(path, "wb");
    cr_assert(in != NULL && out != NULL, "copying %s to %s", src, path);
    char buf[8192];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, in)) > 0)
        cr_assert_eq(fwrite(buf, 1, n, out), n);
    fclose(in);
    cr_assert_eq(fclose(out), 0);
}

/* The whole file at path (malloc'd; caller frees). */
static uint8_t *read_all(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f, "%s", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *b = malloc((size_t)n + 1);
    cr_assert_eq(fread(b, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    *len = (size_t)n;
    return b;
}

/* Sets column col of job "train" in the state file at path, as text or as a blob, with
   the sqlite3 library (as someone with the shell could). */
static void set_column(const char *path, const char *col, const void *v, size_t len, int text)
{
    sqlite3 *db = NULL;
    cr_assert_eq(sqlite3_open(path, &db), SQLITE_OK);
    char sql[128];
    snprintf(sql, sizeof sql, "UPDATE jobs SET %s = ?1 WHERE name = 'train'", col);
    sqlite3_stmt *q = NULL;
    cr_assert_eq(sqlite3_prepare_v2(db, sql, -1, &q, NULL), SQLITE_OK, "%s", sqlite3_errmsg(db));
    if (text)
        sqlite3_bind_text(q, 1, v, (int)len, SQLITE_STATIC);
    else
        sqlite3_bind_blob(q, 1, v, (int)len, SQLITE_STATIC);
    cr_assert_eq(sqlite3_step(q), SQLITE_DONE);
    sqlite3_finalize(q);
    sqlite3_close(db);
}

/* A "job_fit" record of one rule packed by hand (so that it can break any rule); degree
   NULL: a "job_ckpts" record instead. */
static void fit_record(msgpack_sbuffer *sb, const char *degree, int64_t n, const char *what)
{
    msgpack_packer pk;
    msgpack_packer_init(&pk, sb, msgpack_sbuffer_write);
    msgpack_pack_map(&pk, 3);
    msgpack_pack_str_with_body(&pk, "v", 1);
    msgpack_pack_uint64(&pk, TIDE_PROTO_VERSION);
    msgpack_pack_str_with_body(&pk, "type", 4);
    const char *type = degree ? "job_fit" : "job_ckpts";
    msgpack_pack_str_with_body(&pk, type, strlen(type));
    msgpack_pack_str_with_body(&pk, degree ? "fit" : "ckpts", degree ? 3 : 5);
    msgpack_pack_array(&pk, degree ? 1 : 0);
    if (degree == NULL)
        return;
    msgpack_pack_map(&pk, 3);
    msgpack_pack_str_with_body(&pk, "degree", 6);
    msgpack_pack_str_with_body(&pk, degree, strlen(degree));
    msgpack_pack_str_with_body(&pk, "n", 1);
    msgpack_pack_int64(&pk, n);
    msgpack_pack_str_with_body(&pk, "what", 4);
    msgpack_pack_str_with_body(&pk, what, strlen(what));
}

/* A join as a tided from before fit rules stored it: encoded today, "fit" left out. */
static uint8_t *join_without_fit(size_t *len)
{
    tide_msg_t m;
    tide_msg_init(&m, TIDE_MSG_JOIN);
    m.u.join.worker = 0;
    snprintf(m.u.join.job, sizeof m.u.join.job, "train");
    m.u.join.num_layers = 4;
    m.u.join.dp = m.u.join.tp = m.u.join.pp = m.u.join.micro_batches = 1;
    tide_proto_buf_t b;
    tide_proto_buf_init(&b);
    cr_assert_eq(tide_proto_encode(&m, &b), TIDE_OK);
    msgpack_unpacked u;
    msgpack_unpacked_init(&u);
    size_t off = 0;
    cr_assert_eq(msgpack_unpack_next(&u, (const char *)b.data, b.len, &off),
                 MSGPACK_UNPACK_SUCCESS);
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_map(&pk, u.data.via.map.size - 1);
    for (uint32_t k = 0; k < u.data.via.map.size; k++) {
        const msgpack_object_kv *kv = &u.data.via.map.ptr[k];
        if (kv->key.via.str.size == 3 && memcmp(kv->key.via.str.ptr, "fit", 3) == 0)
            continue;
        msgpack_pack_object(&pk, kv->key);
        msgpack_pack_object(&pk, kv->val);
    }
    uint8_t *out = malloc(sb.size);
    memcpy(out, sb.data, sb.size);
    *len = sb.size;
    msgpack_sbuffer_destroy(&sb);
    msgpack_unpacked_destroy(&u);
    tide_proto_buf_destroy(&b);
    return out;
}

/* A job's fit rules survive a restart exactly; a state file written before jobs had rules
   gets the column and reads as "no rules"; a damaged rule is refused, not weakened. */
Test(store, fit_rules_survive_a_restart_and_old_files_migrate)
{
    char path[64];
    tmp_path(path, sizeof path);
    tide_store_t *s = NULL;
    tide_coord_state_t *st = NULL;
    cr_assert_eq(tide_store_open(&s, path, 1), TIDE_OK, "%s", tide_last_error());
    cr_assert_eq(tide_coord_state_new(&st), TIDE_OK);
    tide_coord_job_t *j = NULL, *k = NULL;
    cr_assert_eq(tide_coord_job_add(st, 0, TIDE_CJOB_ONLINE, &j), TIDE_OK);
    snprintf(j->name, sizeof j->name, "train");
    cr_assert_eq(tide_coord_job_add_pool(j, "p", 4, 1), TIDE_OK);
    j->fit[0] = batch16[0];
    j->fit[1] = batch16[1];
    j->fit[2] = (tide_fit_rule){TIDE_DEGREE_PP, INT64_C(1) << 62, ""};
    j->n_fit = 3;
    cr_assert_eq(tide_coord_job_add(st, 0, TIDE_CJOB_ONLINE, &k), TIDE_OK);
    snprintf(k->name, sizeof k->name, "free");
    cr_assert_eq(tide_store_begin(s), TIDE_OK);
    cr_assert_eq(tide_store_put_job(s, j), TIDE_OK);
    cr_assert_eq(tide_store_put_job(s, k), TIDE_OK);
    cr_assert_eq(tide_store_commit(s), TIDE_OK);
    tide_store_close(&s);
    tide_coord_state_destroy(&st);

    cr_assert_eq(tide_store_open(&s, path, 1), TIDE_OK, "%s", tide_last_error());
    cr_assert_eq(tide_coord_state_new(&st), TIDE_OK);
    cr_assert_eq(tide_store_load(s, st), TIDE_OK, "%s", tide_last_error());
    j = tide_coord_job_by_name(st, "train");
    cr_assert_eq(j->n_fit, 3);
    cr_assert_arr_eq(j->fit, batch16, sizeof batch16, "the rules come back byte for byte");
    cr_expect(j->fit[2].degree == TIDE_DEGREE_PP && j->fit[2].n == INT64_C(1) << 62 &&
              j->fit[2].what[0] == '\0');
    cr_assert_eq(tide_coord_job_by_name(st, "free")->n_fit, 0);
    tide_store_close(&s);
    tide_coord_state_destroy(&st);

    /* damaged rules: each refused at start with the job's name, never read as weaker */
    static const struct {
        const char *degree;
        int64_t n;
        const char *what;
    } damaged[] = {
        {"dp", 0, ""},            /* n below 1 */
        {"dp", -4, ""},           /* a sign */
        {"ep", 4, ""},            /* no such degree */
        {"tp", 4, "a\tb"},        /* not printable */
        {NULL, 0, NULL},          /* not a fit record (a job_ckpts one) */
        {"dp", 4, "the batch\n"}, /* cut short (below) */
    };
    for (size_t i = 0; i < sizeof damaged / sizeof damaged[0]; i++) {
        msgpack_sbuffer sb;
        msgpack_sbuffer_init(&sb);
        fit_record(&sb, damaged[i].degree, damaged[i].n, damaged[i].what);
        size_t len = i + 1 == sizeof damaged / sizeof damaged[0] ? sb.size - 2 : sb.size;
        set_column(path, "fit", sb.data, len, 0);
        msgpack_sbuffer_destroy(&sb);
        cr_assert_eq(tide_store_open(&s, path, 1), TIDE_OK, "%s", tide_last_error());
        cr_assert_eq(tide_coord_state_new(&st), TIDE_OK);
        cr_assert_eq(tide_store_load(s, st), TIDE_ERR_PROTOCOL, "case %zu was accepted", i);
        cr_expect(strstr(tide_last_error(), "job train") != NULL &&
                      strstr(tide_last_error(), "fit rule") != NULL,
                  "%s", tide_last_error());
        tide_store_close(&s);
        tide_coord_state_destroy(&st);
    }
    /* the old text where a record belongs */
    set_column(path, "fit", "dp 4\n", 5, 1);
    cr_assert_eq(tide_store_open(&s, path, 1), TIDE_OK, "%s", tide_last_error());
    cr_assert_eq(tide_coord_state_new(&st), TIDE_OK);
    cr_assert_eq(tide_store_load(s, st), TIDE_ERR_PROTOCOL);
    cr_expect(strstr(tide_last_error(), "not a BLOB") != NULL, "%s", tide_last_error());
    tide_store_close(&s);
    tide_coord_state_destroy(&st);
    rm_db(path);

    /* damaged rules in a state file of schema 1 (text): refused the same, the file untouched */
    static const char *const damaged_text[] = {
        "dp 4 the batch",            /* no line end */
        "dp 0\n",                    /* n below 1 */
        "dp -4\n",                   /* a sign */
        "dp 04\n",                   /* not as written */
        "ep 4\n",                    /* no such degree */
        "dp  4\n",                   /* spacing */
        "dp 4 \n",                   /* an empty what is written without its space */
        "dp 99999999999999999999\n", /* overflow */
        "tp 4 a\tb\n",               /* not printable */
    };
    for (size_t i = 0; i < sizeof damaged_text / sizeof damaged_text[0]; i++) {
        copy_fixture("state-v1.db", path);
        set_column(path, "fit", damaged_text[i], strlen(damaged_text[i]), 1);
        size_t before_len = 0, after_len = 0;
        uint8_t *before = read_all(path, &before_len);
        cr_assert_eq(tide_store_open(&s, path, 1), TIDE_OK, "%s", tide_last_error());
        cr_assert_eq(tide_coord_state_new(&st), TIDE_OK);
        cr_assert_eq(tide_store_load(s, st), TIDE_ERR_PROTOCOL, "'%s' was accepted",
                     damaged_text[i]);
        cr_expect(strstr(tide_last_error(), "job train") != NULL &&
                      strstr(tide_last_error(), "fit rule") != NULL,
                  "%s", tide_last_error());
        tide_store_close(&s);
        tide_coord_state_destroy(&st);
        uint8_t *after = read_all(path, &after_len);
        cr_expect(before_len == after_len && memcmp(before, after, before_len) == 0,
                  "case %zu: a refused state file was changed", i);
        free(before);
        free(after);
        rm_db(path);
    }

    /* a state file from before the fit column: opened, migrated, its jobs have no rules and
       their stored joins (written without "fit") decode again */
    copy_fixture("state-v1.db", path);
    size_t old_len = 0;
    uint8_t *old_join = join_without_fit(&old_len);
    sqlite3 *db = NULL;
    cr_assert_eq(sqlite3_open(path, &db), SQLITE_OK);
    cr_assert_eq(sqlite3_exec(db, "ALTER TABLE jobs DROP COLUMN fit", NULL, NULL, NULL), SQLITE_OK,
                 "%s", sqlite3_errmsg(db));
    sqlite3_close(db);
    set_column(path, "join_blob", old_join, old_len, 0);
    tide_msg_t jm;
    cr_assert_eq(tide_proto_decode(old_join, old_len, &jm), TIDE_ERR_PROTOCOL,
                 "the old join does not decode as it is");
    free(old_join);
    cr_assert_eq(tide_store_open(&s, path, 1), TIDE_OK, "%s", tide_last_error());
    cr_assert_eq(tide_coord_state_new(&st), TIDE_OK);
    cr_assert_eq(tide_store_load(s, st), TIDE_OK, "%s", tide_last_error());
    j = tide_coord_job_by_name(st, "train");
    cr_assert_not_null(j);
    cr_assert_eq(j->n_fit, 0);
    cr_assert_eq(tide_proto_decode(j->join_blob, j->join_len, &jm), TIDE_OK, "%s",
                 tide_last_error());
    cr_expect(jm.type == TIDE_MSG_JOIN && jm.u.join.n_fit == 0 && jm.u.join.num_layers == 4);
    tide_msg_clear(&jm);
    j->fit[0] = batch16[0];
    j->n_fit = 1;
    cr_assert_eq(tide_store_begin(s), TIDE_OK);
    cr_assert_eq(tide_store_put_job(s, j), TIDE_OK);
    cr_assert_eq(tide_store_commit(s), TIDE_OK);
    j = reload_job(&s, &st, path, "train");
    cr_assert_eq(j->n_fit, 1);
    cr_assert_str_eq(j->fit[0].what, "the global batch 16 / 4 micro-batches");
    tide_store_close(&s);
    tide_coord_state_destroy(&st);
    rm_db(path);
}

/* What tests/data/state-v1.db holds (tests/data/make_v1_fixtures.c wrote it). */
static void expect_fixture_state(tide_store_t *s, tide_coord_state_t *st)
{
    cr_assert_eq(st->next_worker_id, 7);
    cr_assert_null(tide_coord_worker_get(st, 5), "worker 5 was forgotten");
    tide_coord_worker_t *w = tide_coord_worker_find(st, "pool-a", 3);
    cr_assert_not_null(w);
    cr_expect(w->id == 3 && w->state == TIDE_WS_FAILED && w->gone_ms == 1700000000003 &&
              w->fenced_job == 1 && w->memory == 4ull << 34 && w->pid == 1003 && w->device == 1 &&
              w->pool_size == 4);
    cr_expect_str_eq(w->host, "node-1");
    cr_expect_str_eq(w->owner, "worker:key0");
    w = tide_coord_worker_find(st, "pool-c", 0);
    cr_expect(w->id == 6 && w->state == TIDE_WS_OFFLINE && w->offline_job == 4);

    tide_coord_job_t *j = tide_coord_job_by_name(st, "train");
    cr_assert_not_null(j);
    cr_expect(j->id == 1 && j->kind == TIDE_CJOB_ONLINE && j->state == TIDE_JS_RESIZING &&
              j->created_ms == 1700000000123 && j->generation == 9 && j->gen_issued == 10 &&
              j->step == 123 && j->req_dp == 2 && j->req_tp == 1 && j->req_pp == 2 &&
              j->req_micro == 4 && j->num_layers == 6 && j->total_bytes == 3 * 4096);
    cr_assert_eq(j->n_pools, 3);
    cr_expect_str_eq(j->pools[1].name, "pool-b");
    cr_expect(j->pools[0].connected && j->pools[0].size == 4 && j->pools[0].left == 0);
    cr_expect(!j->pools[1].connected && j->pools[1].left == 7 && j->pools[1].base == 4);
    cr_expect(!j->pools[2].connected && j->pools[2].left == 0 && j->pools[2].base == 6);
    cr_assert_not_null(j->layout);
    static const int stages[] = {0, 2, 6};
    static const int32_t ranks[] = {0, 1, 2, 3};
    cr_expect(j->layout->dp == 2 && j->layout->tp == 1 && j->layout->pp == 2 &&
              j->layout->micro_batches == 4);
    cr_expect_arr_eq(j->layout->stage_start, stages, sizeof stages);
    cr_expect_arr_eq(j->layout->worker, ranks, sizeof ranks);
    cr_assert_eq(j->n_fit, 3);
    cr_expect(j->fit[0].degree == TIDE_DEGREE_DP_MICRO && j->fit[0].n == 16);
    cr_expect_str_eq(j->fit[0].what, "the global batch");
    cr_expect(j->fit[1].degree == TIDE_DEGREE_TP && j->fit[1].n == 8);
    cr_expect(j->fit[2].degree == TIDE_DEGREE_PP && j->fit[2].n == INT64_C(1) << 62 &&
              j->fit[2].what[0] == '\0');
    cr_assert_eq(j->n_ckpts, 3);
    cr_expect(j->ckpts[0].step == 60 && j->ckpts[2].step == 100);
    cr_expect_str_eq(j->ckpts[2].dir, "/ck/train with space/step-000000000100");
    tide_msg_t jm;
    cr_assert_eq(tide_proto_decode(j->join_blob, j->join_len, &jm), TIDE_OK, "%s",
                 tide_last_error());
    cr_expect(jm.u.join.n_tensors == 2 && jm.u.join.n_fit == 1 && jm.u.join.num_layers == 6);
    tide_msg_clear(&jm);
    const tide_reconf_t *r = j->reconf;
    cr_assert_not_null(r);
    cr_expect(r->gen == 10 && r->recover == 1 && r->phase == TIDE_RP_COMMIT &&
              r->switch_step == 100 && r->switched == 1 && r->started_ms == 1700000000999 &&
              r->ckpt_step == 100);
    cr_expect_str_eq(r->reason, "recovery: worker 3 failed; dp 1 instead of 2");
    cr_expect_str_eq(r->ckpt, "/ck/train with space/step-000000000100");
    static const int rstages[] = {0, 3, 6};
    cr_expect(r->layout->dp == 1 && r->layout->pp == 2 && r->layout->micro_batches == 8);
    cr_expect_arr_eq(r->layout->stage_start, rstages, sizeof rstages);
    cr_expect(r->n_parts == 4 && r->old_member[3] && r->layout->worker[1] == 1);

    j = tide_coord_job_by_name(st, "waiting");
    cr_expect(j->state == TIDE_JS_QUEUED && j->n_pools == 1 && j->pools[0].size == 8 &&
              j->layout == NULL && j->reconf == NULL && j->n_fit == 0 && j->n_ckpts == 0);
    j = tide_coord_job_by_name(st, "scan");
    cr_expect(j->kind == TIDE_CJOB_OFFLINE && j->okind == TIDE_OFFLINE_PLUGIN && j->argc == 0 &&
              j->priority == 2 && j->n_pools == 0);
    cr_expect_str_eq(j->plugin, "tide_scan");
    j = tide_coord_job_by_name(st, "eval");
    cr_assert_eq(j->argc, 4);
    cr_expect_str_eq(j->argv[0], "python3");
    cr_expect_str_eq(j->argv[2], "--data=a b");
    cr_expect_str_eq(j->argv[3], "");
    cr_expect(j->state == TIDE_JS_ASSIGNED && j->priority == -4 && j->mem_cap == 1ull << 33 &&
              j->bubbles == 1 && j->attempts == 2 && j->failures == 1 && j->max_attempts == 5 &&
              j->worker == 6 && j->grace_ms == 2500);
    cr_expect(j->max_memory == 0 && j->max_procs == 0, "a job of before the limits has none");
    tide_store_attempt_t *a = NULL;
    size_t n = 0;
    cr_assert_eq(tide_store_attempts(s, 4, 0, 10, &a, &n), TIDE_OK);
    cr_assert_eq(n, 1);
    cr_expect(a[0].attempt == 1 && a[0].worker == 6 && a[0].exit_code == 3);
    cr_expect_str_eq(a[0].tail, "Traceback: boom\n");
    tide_free(a);
    tide_store_event_t *ev = NULL;
    tide_store_event_query_t all = {.limit = 10};
    cr_assert_eq(tide_store_query_events(s, &all, &ev, &n), TIDE_OK);
    cr_assert_eq(n, 2);
    cr_expect_str_eq(ev[0].detail, "to dp 1");
    cr_expect_eq(ev[0].fields.n_workers, 0); /* schema 1 events have no fields */
    tide_store_events_free(&ev, n);
}

/* The type of column col of job "train" in the state file at path, as SQLite says. */
static void expect_column_type(const char *path, const char *col, const char *want)
{
    sqlite3 *db = NULL;
    cr_assert_eq(sqlite3_open(path, &db), SQLITE_OK);
    char sql[160];
    snprintf(sql, sizeof sql, "SELECT typeof(%s) FROM jobs WHERE name = 'train'", col);
    sqlite3_stmt *q = NULL;
    cr_assert_eq(sqlite3_prepare_v2(db, sql, -1, &q, NULL), SQLITE_OK);
    cr_assert_eq(sqlite3_step(q), SQLITE_ROW);
    cr_expect_str_eq((const char *)sqlite3_column_text(q, 0), want, "column %s", col);
    sqlite3_finalize(q);
    sqlite3_close(db);
}

/* A state file an older tided wrote (schema 1: text columns) loads field for field; loading
   migrates it (records, schema 2) in one go, after which it loads the same; no job is
   written into it before that. */
Test(store, a_state_file_of_schema_1_loads_field_for_field_and_is_migrated)
{
    char path[64];
    tmp_path(path, sizeof path);
    copy_fixture("state-v1.db", path);
    expect_column_type(path, "layout", "text");
    tide_store_t *s = NULL;
    tide_coord_state_t *st = NULL;
    cr_assert_eq(tide_store_open(&s, path, 1), TIDE_OK, "%s", tide_last_error());
    cr_assert_eq(tide_coord_state_new(&st), TIDE_OK);
    tide_coord_job_t *j = NULL;
    cr_assert_eq(tide_coord_job_add(st, 99, TIDE_CJOB_ONLINE, &j), TIDE_OK);
    cr_assert_eq(tide_store_begin(s), TIDE_OK);
    cr_assert_eq(tide_store_put_job(s, j), TIDE_ERR_INTERNAL, "a job written before migrating");
    tide_store_rollback(s);
    tide_coord_state_destroy(&st);
    cr_assert_eq(tide_coord_state_new(&st), TIDE_OK);
    cr_assert_eq(tide_store_load(s, st), TIDE_OK, "%s", tide_last_error());
    expect_fixture_state(s, st);
    tide_store_close(&s);
    tide_coord_state_destroy(&st);
    static const char *const blobs[] = {"pool", "layout", "rc_layout", "fit", "ckpts", "argv"};
    for (size_t i = 0; i < sizeof blobs / sizeof blobs[0]; i++)
        expect_column_type(path, blobs[i], "blob");
    cr_assert_eq(tide_store_open(&s, path, 1), TIDE_OK, "%s", tide_last_error());
    cr_assert_eq(tide_coord_state_new(&st), TIDE_OK);
    cr_assert_eq(tide_store_load(s, st), TIDE_OK, "%s", tide_last_error());
    expect_fixture_state(s, st);
    tide_store_close(&s);
    tide_coord_state_destroy(&st);
    /* a schema this tided does not know is refused naming it */
    sqlite3 *db = NULL;
    cr_assert_eq(sqlite3_open(path, &db), SQLITE_OK);
    cr_assert_eq(
        sqlite3_exec(db, "UPDATE meta SET value = '3' WHERE key = 'schema'", NULL, NULL, NULL),
        SQLITE_OK);
    sqlite3_close(db);
    cr_assert_eq(tide_store_open(&s, path, 1), TIDE_ERR_UNSUPPORTED);
    cr_expect(strstr(tide_last_error(), "schema version '3'") != NULL, "%s", tide_last_error());
    rm_db(path);
}

/* Each damaged text of a schema-1 file is refused naming the job and the part; the file is
   left as it was. */
Test(store, damaged_schema_1_texts_are_refused_naming_the_job)
{
    static const struct {
        const char *col, *text, *says;
    } cases[] = {
        {"layout", "2 1 2 6 4|0 2 6|0 1 2", "its layout"},
        {"layout", "2 1 2 6 4|0 2 6|0 1 2 2", "its layout"},
        {"layout", "1 1 1 4 1|0 4|0 junk", "its layout"},
        {"pool", "pool-a 4 1;pool-b 2 2", "its pools"},
        {"pool", "pool-a 4 3", "its pools"},
        {"ckpts", "20\t/ck/a\n10\t/ck/b\n", "its checkpoints"},
        {"ckpts", "x\t/ck\n", "its checkpoints"},
        {"ckpts", "20\t/ck", "its checkpoints"},
        {"rc_layout", "1 1 2 6 8|0 3 6|0 0", "pending reconfiguration"},
    };
    char path[64];
    tmp_path(path, sizeof path);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        copy_fixture("state-v1.db", path);
        set_column(path, cases[i].col, cases[i].text, strlen(cases[i].text), 1);
        size_t bl = 0, al = 0;
        uint8_t *before = read_all(path, &bl);
        tide_store_t *s = NULL;
        tide_coord_state_t *st = NULL;
        cr_assert_eq(tide_store_open(&s, path, 1), TIDE_OK, "%s", tide_last_error());
        cr_assert_eq(tide_coord_state_new(&st), TIDE_OK);
        cr_assert_eq(tide_store_load(s, st), TIDE_ERR_PROTOCOL, "case %zu was accepted", i);
        cr_expect(strstr(tide_last_error(), "job train") != NULL &&
                      strstr(tide_last_error(), cases[i].says) != NULL,
                  "case %zu: %s", i, tide_last_error());
        tide_store_close(&s);
        tide_coord_state_destroy(&st);
        uint8_t *after = read_all(path, &al);
        cr_expect(bl == al && memcmp(before, after, bl) == 0, "case %zu: the file changed", i);
        free(before);
        free(after);
        rm_db(path);
    }
}

/* The events query filters by job, kind (a glob) and time, newest or oldest first, and an
   event's typed fields come back as they were written. */
Test(store, events_filter_by_job_kind_and_time_with_their_fields)
{
    char path[64];
    tmp_path(path, sizeof path);
    tide_store_t *s = NULL;
    cr_assert_eq(tide_store_open(&s, path, 0), TIDE_OK, "%s", tide_last_error());
    cr_assert_eq(tide_store_begin(s), TIDE_OK);
    int32_t map[4] = {5, 6, 7, 8};
    tide_proto_event_fields_t f;
    tide_event_fields_init(&f);
    f.gen = 2;
    f.dp = 2, f.tp = 2, f.pp = 1;
    f.from_dp = 4, f.from_tp = 1, f.from_pp = 1;
    f.workers = map;
    f.n_workers = 4;
    f.bytes = 4096;
    f.ms = 12.5;
    f.step = 40;
    tide_event_fields_reason(&f, "operator\nresize");
    cr_assert_eq(tide_store_event(s, 1000, "a", "layout", "gen 1"), TIDE_OK);
    cr_assert_eq(tide_store_event_fields(s, 2000, "a", "resized", &f, "gen 2"), TIDE_OK);
    cr_assert_eq(tide_store_event(s, 3000, "b", "resize_started", "b gen 2"), TIDE_OK);
    cr_assert_eq(tide_store_event(s, 4000, "", "worker_failed", "w 3"), TIDE_OK);
    cr_assert_eq(tide_store_event(s, 5000, "a", "resize_started", "gen 3"), TIDE_OK);
    cr_assert_eq(tide_store_commit(s), TIDE_OK);
    tide_store_event_t *ev = NULL;
    size_t n = 0;
    /* newest first, limited: the tail */
    tide_store_event_query_t q = {.limit = 2, .newest = 1};
    cr_assert_eq(tide_store_query_events(s, &q, &ev, &n), TIDE_OK);
    cr_assert_eq(n, 2);
    cr_expect(ev[0].time_ms == 5000 && ev[1].time_ms == 4000);
    tide_store_events_free(&ev, n);
    /* one job, kinds by glob */
    q = (tide_store_event_query_t){.limit = 10, .job = "a", .kind = "resize*"};
    cr_assert_eq(tide_store_query_events(s, &q, &ev, &n), TIDE_OK);
    cr_assert_eq(n, 2);
    cr_expect_str_eq(ev[0].detail, "gen 2");
    cr_expect_str_eq(ev[1].detail, "gen 3");
    const tide_proto_event_fields_t *g = &ev[0].fields;
    cr_expect(g->gen == 2 && g->dp == 2 && g->tp == 2 && g->pp == 1 && g->from_dp == 4);
    cr_assert_eq(g->n_workers, 4);
    cr_expect(g->workers[0] == 5 && g->workers[3] == 8);
    cr_expect(g->bytes == 4096 && g->ms == 12.5 && g->step == 40);
    cr_expect_str_eq(g->reason, "operator?resize");
    cr_expect(ev[1].fields.n_workers == 0 && ev[1].fields.step == -1, "no fields: none");
    tide_store_events_free(&ev, n);
    /* a time range [since, until) and an id cursor */
    q = (tide_store_event_query_t){.limit = 10, .since_ms = 2000, .until_ms = 5000};
    cr_assert_eq(tide_store_query_events(s, &q, &ev, &n), TIDE_OK);
    cr_assert_eq(n, 3);
    cr_expect(ev[0].time_ms == 2000 && ev[2].time_ms == 4000);
    uint64_t third = ev[1].id;
    tide_store_events_free(&ev, n);
    q = (tide_store_event_query_t){.limit = 10, .since_id = third, .kind = "worker_?ailed"};
    cr_assert_eq(tide_store_query_events(s, &q, &ev, &n), TIDE_OK);
    cr_assert_eq(n, 1);
    cr_expect_str_eq(ev[0].detail, "w 3");
    tide_store_events_free(&ev, n);
    q = (tide_store_event_query_t){.limit = 10, .job = "nobody"};
    cr_assert_eq(tide_store_query_events(s, &q, &ev, &n), TIDE_OK);
    cr_expect_eq(n, 0);
    tide_store_events_free(&ev, n);
    tide_store_close(&s);
    rm_db(path);
}

Test(store, garbage_file_is_refused)
{
    char path[64];
    tmp_path(path, sizeof path);
    FILE *f = fopen(path, "w");
    fputs("this is not a database, it is a text file that is long enough to matter\n", f);
    fclose(f);
    tide_store_t *s = NULL;
    cr_assert_neq(tide_store_open(&s, path, 1), TIDE_OK);
    cr_assert_null(s);
    cr_assert(strstr(tide_last_error(), path) != NULL, "%s", tide_last_error());
    rm_db(path);
}
