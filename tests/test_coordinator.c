/*
 * Unit tests for the coordinator's pure parts: policy decisions (placement,
 * recovery, backfill order, switch step, failure detection with a fake clock),
 * layout helpers, and the SQLite store (round trip, append-only events,
 * exclusive file). In-process, milliseconds each.
 */
#include <criterion/criterion.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/alloc.h"
#include "coordinator/policy.h"
#include "coordinator/state.h"
#include "coordinator/store.h"

/* n workers, hosts of `per_host` consecutive ranks, all of class cls. */
static tide_policy_worker *workers(size_t n, int per_host, tide_pw_class cls)
{
    tide_policy_worker *w = calloc(n, sizeof *w);
    for (size_t i = 0; i < n; i++)
        w[i] = (tide_policy_worker){(int32_t)i, (int32_t)(i / (size_t)per_host), cls, 0};
    return w;
}

static int host_of(const tide_policy_worker *c, size_t n, int32_t rank)
{
    for (size_t i = 0; i < n; i++)
        if (c[i].rank == rank)
            return c[i].host;
    return -1;
}

Test(policy, first_layout_keeps_tp_groups_inside_hosts)
{
    /* 16 workers on 4 hosts of 4, listed interleaved so rank order alone would mix hosts */
    tide_policy_worker c[16];
    for (int i = 0; i < 16; i++)
        c[i] = (tide_policy_worker){i, i % 4, TIDE_PW_IDLE, 0};
    tide_resize_req req = {2, 4, 2, 8, 4, NULL, 0, 0};
    tide_layout_t *l = NULL;
    int32_t pre[16];
    size_t np = 99;
    cr_assert_eq(tide_policy_place(NULL, NULL, &req, c, 16, &l, pre, &np), TIDE_OK, "%s",
                 tide_last_error());
    cr_assert_eq(np, 0);
    cr_assert_eq(tide_layout_validate(l, NULL), TIDE_OK);
    for (int p = 0; p < 2; p++)
        for (int d = 0; d < 2; d++) {
            int h = host_of(c, 16, l->worker[tide_layout_index(l, p, d, 0)]);
            for (int t = 1; t < 4; t++)
                cr_assert_eq(host_of(c, 16, l->worker[tide_layout_index(l, p, d, t)]), h,
                             "TP group (%d,%d) spans hosts", p, d);
        }
    tide_layout_destroy(&l);
    cr_assert_null(l);
}

Test(policy, same_shape_resize_keeps_every_coordinate)
{
    tide_layout_t *old = NULL, *l = NULL;
    cr_assert_eq(tide_layout_new(&old, 4, 2, 2, 8, 4), TIDE_OK);
    tide_policy_worker *c = workers(16, 8, TIDE_PW_MEMBER);
    int32_t pre[16];
    size_t np;
    tide_resize_req same = {4, 2, 2, 8, 4, NULL, 0, 0};
    cr_assert_eq(tide_policy_place(old, NULL, &same, c, 16, &l, pre, &np), TIDE_OK, "%s",
                 tide_last_error());
    cr_assert_arr_eq(l->worker, old->worker, 16 * sizeof(int32_t));
    tide_layout_destroy(&l);
    /* shrinking dp keeps replicas 0 and 1 exactly where they were: nothing moves */
    tide_resize_req shrink = {2, 2, 2, 8, 4, NULL, 0, 0};
    cr_assert_eq(tide_policy_place(old, NULL, &shrink, c, 16, &l, pre, &np), TIDE_OK);
    for (int p = 0; p < 2; p++)
        for (int d = 0; d < 2; d++)
            for (int t = 0; t < 2; t++)
                cr_assert_eq(l->worker[tide_layout_index(l, p, d, t)],
                             old->worker[tide_layout_index(old, p, d, t)]);
    tide_layout_destroy(&l);
    tide_layout_destroy(&old);
    free(c);
}

Test(policy, grow_takes_idle_before_offline_and_cheapest_offline_first)
{
    tide_layout_t *old = NULL, *l = NULL;
    cr_assert_eq(tide_layout_new(&old, 2, 1, 1, 4, 1), TIDE_OK); /* ranks 0, 1 */
    tide_policy_worker c[6] = {
        {0, 0, TIDE_PW_MEMBER, 0},  {1, 0, TIDE_PW_MEMBER, 0}, {2, 1, TIDE_PW_OFFLINE, 5},
        {3, 1, TIDE_PW_OFFLINE, 1}, {4, 1, TIDE_PW_IDLE, 0},   {5, 1, TIDE_PW_OFFLINE, 9},
    };
    int32_t pre[6];
    size_t np;
    tide_resize_req req = {4, 1, 1, 4, 1, NULL, 0, 0};
    cr_assert_eq(tide_policy_place(old, NULL, &req, c, 6, &l, pre, &np), TIDE_OK, "%s",
                 tide_last_error());
    cr_assert_eq(np, 1, "one offline job must be preempted, got %zu", np);
    cr_assert_eq(pre[0], 3, "the lowest-priority offline work goes first, got rank %d", pre[0]);
    cr_assert(tide_coord_layout_has(l, 4));
    cr_assert(!tide_coord_layout_has(l, 2) && !tide_coord_layout_has(l, 5));
    cr_assert_eq(l->worker[0], 0);
    cr_assert_eq(l->worker[1], 1);
    tide_layout_destroy(&l);
    /* too few workers: a clear error that counts what exists */
    tide_resize_req big = {8, 1, 1, 4, 1, NULL, 0, 0};
    cr_assert_eq(tide_policy_place(old, NULL, &big, c, 6, &l, pre, &np), TIDE_ERR_NO_DEVICE);
    cr_assert_null(l);
    cr_assert(strstr(tide_last_error(), "needs 8 workers") != NULL, "%s", tide_last_error());
    cr_assert(strstr(tide_last_error(), "1 idle") != NULL, "%s", tide_last_error());
    tide_layout_destroy(&old);
}

Test(policy, bad_requests_are_refused)
{
    tide_policy_worker *c = workers(8, 8, TIDE_PW_IDLE);
    tide_layout_t *l = NULL;
    int32_t pre[8];
    size_t np;
    tide_resize_req zero = {0, 1, 1, 4, 1, NULL, 0, 0};
    cr_assert_eq(tide_policy_place(NULL, NULL, &zero, c, 8, &l, pre, &np), TIDE_ERR_INVALID);
    tide_resize_req deep = {1, 1, 8, 4, 1, NULL, 0, 0}; /* pp > layers */
    cr_assert_eq(tide_policy_place(NULL, NULL, &deep, c, 8, &l, pre, &np), TIDE_ERR_INVALID);
    int bad_stages[3] = {0, 4, 4}; /* empty second stage */
    tide_resize_req st = {1, 1, 2, 4, 1, bad_stages, 0, 0};
    cr_assert_eq(tide_policy_place(NULL, NULL, &st, c, 8, &l, pre, &np), TIDE_ERR_INVALID);
    c[3].rank = 2; /* duplicate candidate */
    tide_resize_req ok = {2, 1, 1, 4, 1, NULL, 0, 0};
    cr_assert_eq(tide_policy_place(NULL, NULL, &ok, c, 8, &l, pre, &np), TIDE_ERR_INVALID);
    cr_assert_null(l);
    free(c);
}

Test(policy, recovery_replaces_only_the_lost_coordinate)
{
    tide_layout_t *old = NULL, *l = NULL;
    cr_assert_eq(tide_layout_new(&old, 2, 2, 2, 8, 2), TIDE_OK); /* ranks 0..7 */
    /* rank 5 lost; idle 8 on host 1 (ranks 4..7's host) and idle 9 on host 2 */
    tide_policy_worker c[9];
    size_t n = 0;
    for (int r = 0; r < 8; r++)
        if (r != 5)
            c[n++] = (tide_policy_worker){r, r / 4, TIDE_PW_MEMBER, 0};
    c[n++] = (tide_policy_worker){9, 2, TIDE_PW_IDLE, 0};
    c[n++] = (tide_policy_worker){8, 1, TIDE_PW_IDLE, 0};
    int32_t pre[9];
    size_t np;
    cr_assert_eq(tide_policy_recover(old, NULL, c, n, &l, pre, &np), TIDE_OK, "%s",
                 tide_last_error());
    cr_assert_eq(l->dp, 2);
    for (size_t i = 0; i < 8; i++)
        cr_assert_eq(l->worker[i], old->worker[i] == 5 ? 8 : old->worker[i],
                     "index %zu: %d (replacement must come from the lost worker's host)", i,
                     l->worker[i]);
    tide_layout_destroy(&l);
    /* no spare: dp shrinks to 1 and every coordinate goes to a survivor that held the same
     * stage and TP rank, so the recovery moves nothing */
    n = 0;
    for (int r = 0; r < 8; r++)
        if (r != 5)
            c[n++] = (tide_policy_worker){r, r / 4, TIDE_PW_MEMBER, 0};
    cr_assert_eq(tide_policy_recover(old, NULL, c, n, &l, pre, &np), TIDE_OK);
    cr_assert_eq(l->dp, 1);
    for (int p = 0; p < 2; p++)
        for (int t = 0; t < 2; t++) {
            int32_t w = l->worker[tide_layout_index(l, p, 0, t)];
            int op, od, ot;
            cr_assert_neq(w, 5, "the lost worker is not used");
            cr_assert_eq(tide_layout_find(old, w, &op, &od, &ot), TIDE_OK);
            cr_assert(op == p && ot == t, "(%d, %d) went to worker %d which held (%d, %d)", p, t, w,
                      op, ot);
        }
    tide_layout_destroy(&l);
    /* fewer than tp * pp survivors: stalled */
    cr_assert_eq(tide_policy_recover(old, NULL, c, 3, &l, pre, &np), TIDE_ERR_NO_DEVICE);
    cr_assert(strstr(tide_last_error(), "at least tp * pp = 4") != NULL, "%s", tide_last_error());
    tide_layout_destroy(&old);
}

Test(policy, placement_survives_allocation_failures)
{
    tide_layout_t *old = NULL, *l = NULL;
    cr_assert_eq(tide_layout_new(&old, 2, 2, 1, 4, 1), TIDE_OK);
    tide_policy_worker *c = workers(8, 4, TIDE_PW_IDLE);
    for (int i = 0; i < 4; i++)
        c[i].cls = TIDE_PW_MEMBER;
    int32_t pre[8];
    size_t np;
    tide_resize_req req = {4, 2, 1, 4, 1, NULL, 0, 0};
    int failures_seen = 0;
    for (long k = 1; k < 64; k++) {
        tide_alloc_fail_at(k, 0);
        tide_status rc = tide_policy_place(old, NULL, &req, c, 8, &l, pre, &np);
        long failed = tide_alloc_failures();
        tide_alloc_fail_at(0, 0);
        if (failed == 0) {
            cr_assert_eq(rc, TIDE_OK);
            tide_layout_destroy(&l);
            break;
        }
        failures_seen++;
        cr_assert_eq(rc, TIDE_ERR_NOMEM, "allocation %ld failing gave %d", k, rc);
        cr_assert_null(l);
    }
    cr_assert_gt(failures_seen, 3);
    tide_layout_destroy(&old);
    free(c);
}

/* Every TP group of l on one host, by the candidates' hosts. */
static int tp_groups_inside_hosts(const tide_layout_t *l, const int32_t *host_of_rank)
{
    for (size_t k = 0; k < tide_layout_size(l); k += (size_t)l->tp)
        for (int t = 1; t < l->tp; t++)
            if (host_of_rank[l->worker[k + (size_t)t]] != host_of_rank[l->worker[k]])
                return 0;
    return 1;
}

/*
 * Random failure sequences on clusters of hosts of uneven sizes: single GPUs
 * and whole hosts fail and come back; after each change the job recovers (a
 * member died) or resizes to the largest dp the rule allows. No layout ever
 * chosen has a TP group across hosts, and the dp chosen is exactly the
 * largest whose groups the live hosts hold.
 */
Test(policy, random_failures_never_put_a_tp_group_across_hosts)
{
    uint64_t s = 0x5ca1e;
    int decisions = 0, reduced = 0;
    for (int run = 0; run < 12; run++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        static const int tps[] = {2, 4, 8};
        int tp = tps[(s >> 33) % 3], pp = 1 + (int)((s >> 40) % 3),
            hosts = 6 + (int)((s >> 45) % 10);
        int gpus = tp + (int)((s >> 50) % (unsigned)tp); /* tp .. 2 tp - 1 per host */
        int n = hosts * gpus, layers = 6;
        int32_t *host = calloc((size_t)n, sizeof *host);
        uint8_t *alive = calloc((size_t)n, 1), *member = calloc((size_t)n, 1);
        tide_policy_worker *cand = calloc((size_t)n, sizeof *cand);
        int32_t *pre = calloc((size_t)n, sizeof *pre);
        for (int w = 0; w < n; w++) {
            host[w] = w / gpus;
            alive[w] = 1;
        }
        tide_layout_t *job = NULL;
        for (int step = 0; step < 40; step++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            int w = (int)((s >> 33) % (uint64_t)n);
            if ((s >> 20) % 4 == 0) /* a whole host goes down or comes back */
                for (int g = 0; g < gpus; g++)
                    alive[host[w] * gpus + g] = !alive[host[w] * gpus + g];
            else
                alive[w] = !alive[w];
            size_t k = 0;
            int lost = 0;
            for (int x = 0; x < n; x++) {
                lost += member[x] && !alive[x];
                if (alive[x])
                    cand[k++] = (tide_policy_worker){x, host[x],
                                                     member[x] ? TIDE_PW_MEMBER : TIDE_PW_IDLE, 0};
            }
            int by_count = (int)k / (tp * pp);
            int dp = tide_policy_tp_fit_dp(cand, k, tp, pp, by_count);
            /* the rule, recomputed here: whole groups per live host */
            int slots = 0;
            for (int h = 0; h < hosts; h++) {
                int up = 0;
                for (int g = 0; g < gpus; g++)
                    up += alive[h * gpus + g];
                slots += up / tp;
            }
            cr_assert_eq(dp, slots / pp < by_count ? slots / pp : by_count);
            reduced += dp < by_count;
            tide_layout_t *l = NULL;
            size_t np = 0;
            tide_status rc;
            if (job != NULL && lost) {
                rc = tide_policy_recover(job, NULL, cand, k, &l, pre, &np);
                if (rc == TIDE_OK)
                    cr_assert_leq(l->dp, dp, "recovery chose dp %d, the hosts hold %d", l->dp, dp);
            } else if (dp >= 1) {
                tide_resize_req req = {dp, tp, pp, layers, 1, NULL, 0, 0};
                rc = tide_policy_place(job, NULL, &req, cand, k, &l, pre, &np);
                cr_assert_eq(rc, TIDE_OK, "run %d step %d: dp %d: %s", run, step, dp,
                             tide_last_error());
            } else {
                continue;
            }
            if (rc != TIDE_OK) {
                cr_assert_eq(rc, TIDE_ERR_NO_DEVICE, "%s", tide_last_error());
                cr_assert_eq(dp, 0, "recovery refused with room for dp %d: %s", dp,
                             tide_last_error());
                continue;
            }
            decisions++;
            cr_assert(tp_groups_inside_hosts(l, host),
                      "run %d step %d: a TP group of %d spans "
                      "hosts",
                      run, step, tp);
            memset(member, 0, (size_t)n);
            for (size_t i = 0; i < tide_layout_size(l); i++)
                member[l->worker[i]] = 1;
            tide_layout_destroy(&job);
            job = l;
        }
        tide_layout_destroy(&job);
        free(host);
        free(alive);
        free(member);
        free(cand);
        free(pre);
    }
    cr_log_info("%d layouts chosen, %d times a smaller dp so TP groups fit in hosts", decisions,
                reduced);
    cr_expect(decisions > 100 && reduced > 10, "%d decisions, %d reduced", decisions, reduced);
}

/* A layout whose TP groups do not fit in hosts is refused with the room, unless allowed. */
Test(policy, resize_without_room_for_tp_groups_is_refused_unless_allowed)
{
    tide_policy_worker *c = workers(12, 3, TIDE_PW_IDLE); /* 4 hosts of 3: one group of 2 each */
    tide_resize_req req = {5, 2, 1, 4, 1, NULL, 0, 0};
    tide_layout_t *l = NULL;
    int32_t pre[12];
    size_t np = 0;
    cr_assert_eq(tide_policy_tp_fit_dp(c, 12, 2, 1, 6), 4);
    cr_assert_eq(tide_policy_place(NULL, NULL, &req, c, 12, &l, pre, &np), TIDE_ERR_NO_DEVICE);
    cr_expect(strstr(tide_last_error(), "needs 5 TP groups of 2 workers, each inside one host") !=
                  NULL,
              "%s", tide_last_error());
    cr_assert_null(l);
    req.tp_across_hosts = 1;
    cr_assert_eq(tide_policy_place(NULL, NULL, &req, c, 12, &l, pre, &np), TIDE_OK, "%s",
                 tide_last_error());
    tide_layout_destroy(&l);
    free(c);
}

Test(policy, backfill_by_priority_then_submission)
{
    tide_policy_offline q[4] = {{10, 0, 0, -1}, {11, 5, 0, -1}, {12, 5, 0, -1}, {13, -3, 0, -1}};
    tide_policy_idle idle[3] = {{7, 0}, {2, 0}, {4, 0}};
    tide_policy_assignment out[3];
    size_t n;
    cr_assert_eq(tide_policy_assign(q, 4, idle, 3, out, &n), TIDE_OK);
    cr_assert_eq(n, 3);
    cr_assert_eq(out[0].job, 11);
    cr_assert_eq(out[0].worker, 2);
    cr_assert_eq(out[1].job, 12);
    cr_assert_eq(out[1].worker, 4);
    cr_assert_eq(out[2].job, 10);
    cr_assert_eq(out[2].worker, 7);
    cr_assert_eq(tide_policy_assign(q, 4, idle, 0, out, &n), TIDE_OK);
    cr_assert_eq(n, 0);
}

/* A retry goes to another worker than the one its last attempt failed on, and back to
   that one only when no other fits. */
Test(policy, backfill_retries_elsewhere_than_the_failed_worker)
{
    tide_policy_offline q[2] = {{30, 5, 0, 2}, {31, 1, 0, -1}};
    tide_policy_idle idle[2] = {{2, 0}, {4, 0}};
    tide_policy_assignment out[2];
    size_t n;
    cr_assert_eq(tide_policy_assign(q, 2, idle, 2, out, &n), TIDE_OK);
    cr_assert_eq(n, 2);
    cr_assert_eq(out[0].job, 30);
    cr_assert_eq(out[0].worker, 4, "job 30 failed on worker 2: it goes to 4");
    cr_assert_eq(out[1].job, 31);
    cr_assert_eq(out[1].worker, 2);
    /* only the worker it failed on is free: it runs there rather than wait */
    cr_assert_eq(tide_policy_assign(q, 1, idle, 1, out, &n), TIDE_OK);
    cr_assert_eq(n, 1);
    cr_assert_eq(out[0].worker, 2);
}

/* A job goes only where its --mem-cap fits; one that fits nowhere waits without
   holding back lower-priority jobs that fit. */
Test(policy, backfill_respects_memory_caps)
{
    const uint64_t G = 1ull << 30;
    tide_policy_offline q[3] = {{20, 9, 80 * G, -1}, {21, 5, 30 * G, -1}, {22, 1, 0, -1}};
    tide_policy_idle idle[3] = {{1, 24 * G}, {2, 40 * G}, {3, 0}};
    tide_policy_assignment out[3];
    size_t n;
    cr_assert_eq(tide_policy_assign(q, 3, idle, 3, out, &n), TIDE_OK);
    /* 20 needs 80 GiB: only worker 3 (memory unknown) can take it; 21 then fits on 2 */
    cr_assert_eq(n, 3);
    cr_assert_eq(out[0].job, 20);
    cr_assert_eq(out[0].worker, 3);
    cr_assert_eq(out[1].job, 21);
    cr_assert_eq(out[1].worker, 2);
    cr_assert_eq(out[2].job, 22);
    cr_assert_eq(out[2].worker, 1);
    /* known memory everywhere: the 80 GiB job waits, the others go */
    idle[2].memory = 16 * G;
    cr_assert_eq(tide_policy_assign(q, 3, idle, 3, out, &n), TIDE_OK);
    cr_assert_eq(n, 2);
    cr_assert_eq(out[0].job, 21);
    cr_assert_eq(out[0].worker, 2);
    cr_assert_eq(out[1].job, 22);
    cr_assert_eq(out[1].worker, 1);
}

Test(policy, switch_step)
{
    int64_t steps[4] = {10, 11, 0, 9};
    uint8_t old[4] = {1, 1, 0, 1};
    cr_assert_eq(tide_policy_switch_step(steps, old, 4, 0), 12); /* max of old members + 1 */
    cr_assert_eq(tide_policy_switch_step(steps, old, 4, 1), 9);  /* recovery: min */
    uint8_t none[4] = {0, 0, 0, 0};
    cr_assert_eq(tide_policy_switch_step(steps, none, 4, 0), -1);
}

Test(policy, failure_detection_with_a_fake_clock)
{
    tide_coord_state_t *st = NULL;
    cr_assert_eq(tide_coord_state_new(&st), TIDE_OK);
    tide_coord_worker_t *w = NULL;
    for (int r = 0; r < 3; r++) {
        cr_assert_eq(tide_coord_worker_add(st, -1, "pool", r, &w), TIDE_OK);
        w->last_seen_ns = 1000000000ull; /* t = 1 s */
    }
    st->workers[2].state = TIDE_WS_FAILED;
    int32_t out[3];
    const uint64_t hb = 1000000000ull;
    cr_assert_eq(tide_policy_expired(st->workers, 3, 3900000000ull, hb, 3, out), 0);
    st->workers[1].last_seen_ns = 3000000000ull; /* heartbeat at t = 3 s */
    size_t n = tide_policy_expired(st->workers, 3, 4100000000ull, hb, 3, out);
    cr_assert_eq(n, 1);
    cr_assert_eq(out[0], 0);
    cr_assert_eq(tide_policy_expired(st->workers, 3, 6100000000ull, hb, 3, out), 2);
    tide_coord_state_destroy(&st);
    cr_assert_null(st);
}

Test(state, worker_index_and_layout_text)
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

    tide_layout_t *l = NULL, *back = NULL;
    cr_assert_eq(tide_layout_new(&l, 2, 2, 3, 10, 4), TIDE_OK);
    cr_assert_eq(tide_layout_parse_stages(l, "0-1,2-7,8-9"), TIDE_OK, "%s", tide_last_error());
    l->worker[0] = 40;
    char *text = NULL;
    cr_assert_eq(tide_coord_layout_to_text(l, &text), TIDE_OK);
    cr_assert_eq(tide_coord_layout_from_text(text, &back), TIDE_OK, "%s", tide_last_error());
    cr_assert_arr_eq(back->worker, l->worker, 12 * sizeof(int32_t));
    cr_assert_arr_eq(back->stage_start, l->stage_start, 4 * sizeof(int));
    tide_free(text);
    tide_layout_destroy(&back);
    tide_layout_t *two = NULL;
    cr_assert_eq(tide_layout_new(&two, 1, 1, 2, 10, 1), TIDE_OK);
    cr_assert_eq(tide_layout_parse_stages(two, "0-1,3-9,"), TIDE_ERR_INVALID);
    cr_assert_eq(tide_layout_parse_stages(two, "0-4,5-8"), TIDE_ERR_INVALID);
    tide_layout_destroy(&two);
    cr_assert_eq(tide_coord_layout_from_text("2 2 1 4 1|0 4|0 1 2", &back), TIDE_ERR_INVALID);
    cr_assert_eq(tide_coord_layout_from_text("2 2 1 4 1|0 4|0 1 2 2", &back), TIDE_ERR_INVALID);
    cr_assert_eq(tide_coord_layout_from_text("1 1 1 4 1|0 4|0 junk", &back), TIDE_ERR_INVALID);
    cr_assert_null(back);
    tide_layout_destroy(&l);
}

Test(state, job_pools_text_keeps_a_pool_that_left)
{
    tide_coord_job_t j;
    memset(&j, 0, sizeof j);
    snprintf(j.name, sizeof j.name, "train");
    cr_assert_eq(tide_coord_job_add_pool(&j, "pool-a", 2, 1), TIDE_OK);
    cr_assert_eq(tide_coord_job_add_pool(&j, "pool-b", 2, 0), TIDE_OK);
    cr_assert_eq(tide_coord_job_add_pool(&j, "pool-c", 4, 1), TIDE_OK);
    j.pools[1].left = 7; /* released at generation 7 */
    char *text = NULL;
    cr_assert_eq(tide_coord_job_pools_to_text(&j, &text), TIDE_OK);
    cr_assert_str_eq(text, "pool-a 2 1;pool-b 2 2 7;pool-c 4 1");
    tide_coord_job_t back;
    memset(&back, 0, sizeof back);
    cr_assert_eq(tide_coord_job_pools_from_text(&back, text, 0), TIDE_OK, "%s", tide_last_error());
    tide_free(text);
    cr_assert_eq(back.n_pools, 3);
    cr_assert_eq(back.pools[1].left, 7u);
    cr_assert_eq(back.pools[1].connected, 0);
    cr_assert_eq(back.pools[2].base, 4);
    cr_assert_eq(back.pools[2].left, 0u);
    cr_assert_eq(back.pools[2].connected, 1);
    /* a pool said to have left at no generation is refused */
    cr_assert_eq(tide_coord_job_pools_from_text(&back, "pool-a 2 1;pool-b 2 2", 0),
                 TIDE_ERR_PROTOCOL);
    cr_assert_eq(tide_coord_job_pools_from_text(&back, "pool-a 2 3", 0), TIDE_ERR_PROTOCOL);
}

static void tmp_path(char *buf, size_t len)
{
    snprintf(buf, len, "/tmp/tide-store-XXXXXX");
    int fd = mkstemp(buf);
    close(fd);
    unlink(buf);
}

static void rm_db(const char *p)
{
    char b[300];
    unlink(p);
    snprintf(b, sizeof b, "%s-wal", p);
    unlink(b);
    snprintf(b, sizeof b, "%s-shm", p);
    unlink(b);
}

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
    tide_coord_job_t *o = NULL;
    cr_assert_eq(tide_coord_job_add(st, 0, TIDE_CJOB_OFFLINE, &o), TIDE_OK);
    snprintf(o->name, sizeof o->name, "eval");
    o->argv = tide_calloc(2, sizeof *o->argv);
    o->argv[0] = tide_strdup("python3");
    o->argv[1] = tide_strdup("eval.py");
    o->argc = 2;
    o->priority = -4;
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
    cr_assert_eq(j->reconf->n_parts, 2);
    cr_assert(j->reconf->old_member[0] && !j->reconf->old_member[1]);
    o = tide_coord_job_by_name(st, "eval");
    cr_assert_eq(o->argc, 2);
    cr_assert_str_eq(o->argv[1], "eval.py");
    cr_assert_eq(o->priority, -4);
    tide_store_event_t *ev = NULL;
    size_t n = 0;
    cr_assert_eq(tide_store_events(s, 0, 0, 100, &ev, &n), TIDE_OK);
    cr_assert_eq(n, 1);
    cr_assert_str_eq(ev[0].kind, "resize_started");
    cr_assert_str_eq(ev[0].detail, "to 2");
    tide_free(ev);
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
