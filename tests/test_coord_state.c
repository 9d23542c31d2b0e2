/*
 * Unit tests for the coordinator's state (state.h; part of test_coordinator,
 * tests/coord_fixture.h): the seen list the failure scan reads, the (pool, rank) index
 * and forgotten workers' ids, a layout's record, a job's pools and checkpoints, and what
 * of them the store keeps over a reload. In-process, milliseconds each.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "coordinator/state.h"
#include "coordinator/store.h"
#include "proto/proto.h"
#include "proto/proto_reshard.h"
#include "tests/coord_fixture.h"

/* The seen list is the failure scan's only view of the workers: it must stay in order of
 * last messages through touches in any order, a clock that goes back, forgotten workers
 * and failed ones, return at most what fits, and expire exactly the silent ones. */
Test(state, seen_list_orders_workers_by_their_last_message)
{
    tide_coord_state_t *st = NULL;
    cr_assert_eq(tide_coord_state_new(&st), TIDE_OK);
    enum { N = 200 };
    uint64_t seen[N];
    uint64_t x = 0x12345678;
    tide_coord_worker_t *w = NULL;
    for (int r = 0; r < N; r++)
        cr_assert_eq(tide_coord_worker_add(st, -1, "pool", r, &w), TIDE_OK);
    uint64_t now = 1000;
    for (int round = 0; round < 5000; round++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        int id = (int)(x % N);
        /* mostly forward, now and then an earlier time (a caller's clock) */
        uint64_t t = (x >> 20) % 16 == 0 && now > 50 ? now - 50 : (now += 1 + (x >> 40) % 3);
        tide_coord_worker_seen(st, &st->workers[id], t);
        seen[id] = t;
    }
    /* every worker was seen at least once with overwhelming probability; make sure */
    for (int id = 0; id < N; id++)
        if (!st->workers[id].in_seen) {
            tide_coord_worker_seen(st, &st->workers[id], now);
            seen[id] = now;
        }
    /* the list is in last-seen order and holds everyone once */
    int count = 0;
    uint64_t prev = 0;
    for (int32_t at = st->seen_head; at != 0; at = st->workers[at - 1].seen_next) {
        cr_assert_geq(st->workers[at - 1].last_seen_ns, prev, "out of order at worker %d", at - 1);
        prev = st->workers[at - 1].last_seen_ns;
        count++;
    }
    cr_assert_eq(count, N);
    st->workers[7].state = TIDE_WS_LEFT;
    tide_coord_worker_remove(st, 9);
    /* expire everything silent for more than 100 at now: in pieces of 16 */
    uint64_t limit = 100;
    int expired = 0, want = 0;
    for (int id = 0; id < N; id++)
        want += id != 7 && id != 9 && now - seen[id] > limit;
    int32_t out[16], first = -1;
    size_t n;
    uint64_t last = 0;
    do {
        n = tide_coord_workers_expired(st, now, limit, out, 16);
        cr_assert_leq(n, 16);
        for (size_t i = 0; i < n; i++) {
            cr_assert(out[i] != 7 && out[i] != 9, "a gone or forgotten worker expired");
            cr_assert_gt(now - seen[out[i]], limit);
            cr_assert_geq(seen[out[i]], last, "oldest first");
            last = seen[out[i]];
            first = first < 0 ? out[i] : first;
            cr_assert(!st->workers[out[i]].in_seen, "an expired worker stays on the list");
            expired++;
        }
    } while (n == 16);
    cr_assert_eq(expired, want);
    /* the rest are recent: none expires, and a message puts an expired worker back */
    cr_assert_eq(tide_coord_workers_expired(st, now, limit, out, 16), 0);
    cr_assert_geq(first, 0);
    tide_coord_worker_seen(st, &st->workers[first], now + 1000);
    cr_assert(st->workers[first].in_seen && st->seen_tail == first + 1);
    tide_coord_state_destroy(&st);
}

Test(state, worker_index_and_layout_record)
{
    tide_coord_state_t *st = NULL;
    cr_assert_eq(tide_coord_state_new(&st), TIDE_OK);
    tide_coord_worker_t *w = NULL;
    for (int r = 0; r < 500; r++)
        cr_assert_eq(tide_coord_worker_add(st, -1, r % 2 ? "a" : "b", r, &w), TIDE_OK);
    cr_assert_eq(tide_coord_worker_add(st, -1, "a", 1, &w), TIDE_ERR_EXISTS);
    cr_assert_eq(tide_coord_worker_find(st, "b", 498)->id, 498);
    cr_assert_null(tide_coord_worker_find(st, "a", 498));
    tide_coord_state_destroy(&st);

    /* a layout goes into its record and comes back exactly (what the store keeps) */
    tide_layout_t *l = NULL, *back = NULL;
    cr_assert_eq(tide_layout_new(&l, 2, 2, 3, 10, 4), TIDE_OK);
    cr_assert_eq(tide_layout_parse_stages(l, "0-1,2-7,8-9"), TIDE_OK, "%s", tide_last_error());
    l->worker[0] = 40;
    tide_msg_t m, d;
    tide_msg_init(&m, TIDE_MSG_JOB_LAYOUT);
    tide_proto_layout_from(&m.u.job_layout.layout, l, 9);
    tide_proto_buf_t b;
    tide_proto_buf_init(&b);
    cr_assert_eq(tide_proto_encode_record(&m, &b), TIDE_OK, "%s", tide_last_error());
    cr_assert_eq(tide_proto_decode_record(b.data, b.len, TIDE_MSG_JOB_LAYOUT, &d), TIDE_OK);
    cr_assert_eq(d.u.job_layout.layout.gen, 9u);
    cr_assert_eq(tide_proto_layout_to(&d.u.job_layout.layout, &back), TIDE_OK, "%s",
                 tide_last_error());
    tide_msg_clear(&d);
    cr_assert_arr_eq(back->worker, l->worker, 12 * sizeof(int32_t));
    cr_assert_arr_eq(back->stage_start, l->stage_start, 4 * sizeof(int));
    cr_assert_eq(back->micro_batches, 4);
    tide_layout_destroy(&back);
    tide_layout_t *two = NULL;
    cr_assert_eq(tide_layout_new(&two, 1, 1, 2, 10, 1), TIDE_OK);
    cr_assert_eq(tide_layout_parse_stages(two, "0-1,3-9,"), TIDE_ERR_INVALID);
    cr_assert_eq(tide_layout_parse_stages(two, "0-4,5-8"), TIDE_ERR_INVALID);
    tide_layout_destroy(&two);
    /* damaged: a worker twice is refused by the layout's own check, a record cut short by
       the decoder; nothing comes back */
    l->worker[1] = 40;
    tide_proto_layout_from(&m.u.job_layout.layout, l, 9);
    cr_assert_eq(tide_proto_encode_record(&m, &b), TIDE_OK);
    cr_assert_eq(tide_proto_decode_record(b.data, b.len, TIDE_MSG_JOB_LAYOUT, &d), TIDE_OK);
    cr_assert_eq(tide_proto_layout_to(&d.u.job_layout.layout, &back), TIDE_ERR_INVALID);
    cr_assert(strstr(tide_last_error(), "40") != NULL, "%s", tide_last_error());
    tide_msg_clear(&d);
    cr_assert_eq(tide_proto_decode_record(b.data, b.len - 3, TIDE_MSG_JOB_LAYOUT, &d),
                 TIDE_ERR_PROTOCOL);
    cr_assert_null(back);
    tide_proto_buf_destroy(&b);
    tide_layout_destroy(&l);
}

Test(state, job_pools_keep_a_pool_that_left)
{
    char path[64];
    tmp_path(path, sizeof path);
    tide_store_t *s = NULL;
    tide_coord_state_t *st = NULL;
    cr_assert_eq(tide_store_open(&s, path, 0), TIDE_OK, "%s", tide_last_error());
    cr_assert_eq(tide_coord_state_new(&st), TIDE_OK);
    tide_coord_job_t *j = NULL;
    cr_assert_eq(tide_coord_job_add(st, 0, TIDE_CJOB_ONLINE, &j), TIDE_OK);
    snprintf(j->name, sizeof j->name, "train");
    cr_assert_eq(tide_coord_job_add_pool(j, "pool-a", 2, 1), TIDE_OK);
    cr_assert_eq(tide_coord_job_add_pool(j, "pool-b", 2, 1), TIDE_OK);
    cr_assert_eq(tide_coord_job_add_pool(j, "pool-c", 4, 1), TIDE_OK);
    j->pools[1].left = 7; /* released at generation 7 (still marked connected in memory) */
    cr_assert_eq(tide_store_begin(s), TIDE_OK);
    cr_assert_eq(tide_store_put_job(s, j), TIDE_OK, "%s", tide_last_error());
    cr_assert_eq(tide_store_commit(s), TIDE_OK);
    tide_coord_job_t *back = reload_job(&s, &st, path, "train");
    cr_assert_eq(back->n_pools, 3);
    cr_assert_str_eq(back->pools[1].name, "pool-b");
    cr_assert_eq(back->pools[1].left, 7u);
    cr_assert_eq(back->pools[1].connected, 0);
    cr_assert_eq(back->pools[2].base, 4);
    cr_assert_eq(back->pools[2].left, 0u);
    cr_assert_eq(back->pools[2].connected, 1);
    tide_store_close(&s);
    tide_coord_state_destroy(&st);
    rm_db(path);
}

/* A job remembers its newest complete checkpoints in step order, forgets a refused one,
   and its stored record reads back exactly. */
Test(state, job_checkpoints_keep_the_newest_in_step_order)
{
    char path[64];
    tmp_path(path, sizeof path);
    tide_store_t *s = NULL;
    tide_coord_state_t *st = NULL;
    cr_assert_eq(tide_store_open(&s, path, 0), TIDE_OK, "%s", tide_last_error());
    cr_assert_eq(tide_coord_state_new(&st), TIDE_OK);
    tide_coord_job_t *j = NULL;
    cr_assert_eq(tide_coord_job_add(st, 0, TIDE_CJOB_ONLINE, &j), TIDE_OK);
    snprintf(j->name, sizeof j->name, "train");
    char dir[64];
    for (int k = 1; k <= TIDE_COORD_CKPTS_MAX + 3; k++) {
        int step = k == 5 ? 1000 : 10 * k; /* one report out of order */
        snprintf(dir, sizeof dir, "/ck/step-%d", step);
        cr_assert_eq(tide_coord_job_add_ckpt(j, step, dir), TIDE_OK, "%s", tide_last_error());
    }
    cr_assert_eq(j->n_ckpts, TIDE_COORD_CKPTS_MAX);
    for (int i = 1; i < j->n_ckpts; i++)
        cr_assert_lt(j->ckpts[i - 1].step, j->ckpts[i].step);
    cr_assert_eq(j->ckpts[j->n_ckpts - 1].step, 1000);
    cr_assert_eq(j->ckpts[0].step, 40); /* 10, 20, 30 fell off the old end */
    cr_assert_eq(tide_coord_job_add_ckpt(j, 5, "/ck/step-5"), TIDE_OK); /* older than all */
    cr_assert_eq(j->ckpts[0].step, 40);
    cr_assert_eq(tide_coord_job_add_ckpt(j, 60, "/ck/again-60"), TIDE_OK); /* replaced */
    cr_assert_eq(j->n_ckpts, TIDE_COORD_CKPTS_MAX);
    tide_coord_job_drop_ckpt(j, 1000);
    cr_assert_eq(j->n_ckpts, TIDE_COORD_CKPTS_MAX - 1);
    cr_assert_eq(j->ckpts[j->n_ckpts - 1].step, 110);
    cr_assert_eq(tide_store_begin(s), TIDE_OK);
    cr_assert_eq(tide_store_put_job(s, j), TIDE_OK, "%s", tide_last_error());
    cr_assert_eq(tide_store_commit(s), TIDE_OK);
    tide_coord_ckpt want[TIDE_COORD_CKPTS_MAX];
    int n = j->n_ckpts;
    memcpy(want, j->ckpts, (size_t)n * sizeof *want);
    tide_coord_job_t *back = reload_job(&s, &st, path, "train");
    cr_assert_eq(back->n_ckpts, n);
    for (int i = 0; i < n; i++) {
        cr_assert_eq(back->ckpts[i].step, want[i].step);
        cr_assert_str_eq(back->ckpts[i].dir, want[i].dir);
    }
    cr_assert(strstr(back->ckpts[1].dir, "again-60") != NULL);
    cr_expect_eq(tide_coord_job_add_ckpt(back, 1, "/ck/a\tb"), TIDE_ERR_INVALID);
    cr_expect_eq(tide_coord_job_add_ckpt(back, 1, ""), TIDE_ERR_INVALID);
    cr_expect_eq(tide_coord_job_add_ckpt(back, -1, "/ck"), TIDE_ERR_INVALID);
    tide_store_close(&s);
    tide_coord_state_destroy(&st);
    rm_db(path);
}

/* Forgetting workers keeps the (pool, rank) index whole (every other worker is still
   found, whatever probe chains the removed ones sat in), never hands an id out again, and
   the store deletes the row and remembers the ids handed out, so a reload neither brings
   the worker back nor reuses its id; gone_ms and fenced_job survive a reload. */
Test(state, forgotten_workers_leave_the_index_and_their_ids_are_never_reused)
{
    tide_coord_state_t *st = NULL;
    cr_assert_eq(tide_coord_state_new(&st), TIDE_OK);
    tide_coord_worker_t *w = NULL;
    for (int r = 0; r < 300; r++)
        cr_assert_eq(tide_coord_worker_add(st, -1, r % 3 ? "a" : "b", r, &w), TIDE_OK);
    for (int r = 0; r < 300; r += 7)
        tide_coord_worker_remove(st, tide_coord_worker_find(st, r % 3 ? "a" : "b", r)->id);
    tide_coord_worker_remove(st, 299); /* the last id: the scans get shorter, ids do not */
    for (int r = 0; r < 300; r++) {
        w = tide_coord_worker_find(st, r % 3 ? "a" : "b", r);
        if (r % 7 == 0 || r == 299) {
            cr_assert_null(w, "worker of rank %d was forgotten", r);
            cr_assert_null(tide_coord_worker_get(st, r));
        } else {
            cr_assert_not_null(w, "rank %d lost from the index", r);
            cr_assert_eq(w->id, r);
        }
    }
    tide_coord_worker_remove(st, 0); /* forgotten already: nothing happens */
    cr_assert_eq(tide_coord_worker_add(st, -1, "b", 0, &w), TIDE_OK, "its (pool, rank) is free");
    cr_assert_eq(w->id, 300, "a new id, not the forgotten one");
    tide_coord_state_destroy(&st);

    char path[64];
    tmp_path(path, sizeof path);
    tide_store_t *s = NULL;
    cr_assert_eq(tide_store_open(&s, path, 0), TIDE_OK, "%s", tide_last_error());
    cr_assert_eq(tide_coord_state_new(&st), TIDE_OK);
    tide_coord_worker_t *a = NULL, *b = NULL;
    cr_assert_eq(tide_coord_worker_add(st, -1, "p", 0, &a), TIDE_OK);
    cr_assert_eq(tide_coord_worker_add(st, -1, "p", 1, &b), TIDE_OK);
    a = tide_coord_worker_get(st, 0);
    a->state = TIDE_WS_FAILED;
    a->gone_ms = 1234;
    a->fenced_job = 5;
    b->state = TIDE_WS_LEFT;
    b->gone_ms = 99;
    cr_assert_eq(tide_store_begin(s), TIDE_OK);
    cr_assert_eq(tide_store_put_worker(s, a), TIDE_OK);
    cr_assert_eq(tide_store_put_worker(s, b), TIDE_OK);
    cr_assert_eq(tide_store_commit(s), TIDE_OK);
    tide_coord_worker_remove(st, 1);
    cr_assert_eq(tide_store_begin(s), TIDE_OK);
    cr_assert_eq(tide_store_del_worker(s, 1, st->next_worker_id), TIDE_OK);
    cr_assert_eq(tide_store_commit(s), TIDE_OK);
    tide_store_close(&s);
    tide_coord_state_destroy(&st);
    cr_assert_eq(tide_store_open(&s, path, 0), TIDE_OK, "%s", tide_last_error());
    cr_assert_eq(tide_coord_state_new(&st), TIDE_OK);
    cr_assert_eq(tide_store_load(s, st), TIDE_OK, "%s", tide_last_error());
    cr_assert_null(tide_coord_worker_find(st, "p", 1), "a forgotten worker came back");
    a = tide_coord_worker_find(st, "p", 0);
    cr_assert_not_null(a);
    cr_assert(a->state == TIDE_WS_FAILED && a->gone_ms == 1234 && a->fenced_job == 5);
    cr_assert_eq(tide_coord_worker_add(st, -1, "q", 0, &w), TIDE_OK);
    cr_assert_eq(w->id, 2, "id 1 was handed out before: never again");
    tide_store_close(&s);
    tide_coord_state_destroy(&st);
    rm_db(path);
}
