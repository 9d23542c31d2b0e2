/*
 * Unit tests for the coordinator's policy decisions (policy.h): placement (TP groups inside
 * hosts, idle workers before offline ones, the fit rules), recovery, backfill order, switch step,
 * failure detection with a fake clock. The rest of test_coordinator: the state in
 * test_coord_state.c, the SQLite store in test_coord_store.c. In-process,
 * milliseconds each.
 */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "coordinator/policy.h"
#include "coordinator/state.h"
#include "tests/coord_fixture.h"

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
    tide_resize_req req = {2, 4, 2, 8, 4, NULL, 0, 0, NULL, 0};
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
    tide_resize_req same = {4, 2, 2, 8, 4, NULL, 0, 0, NULL, 0};
    cr_assert_eq(tide_policy_place(old, NULL, &same, c, 16, &l, pre, &np), TIDE_OK, "%s",
                 tide_last_error());
    cr_assert_arr_eq(l->worker, old->worker, 16 * sizeof(int32_t));
    tide_layout_destroy(&l);
    /* shrinking dp keeps replicas 0 and 1 exactly where they were: nothing moves */
    tide_resize_req shrink = {2, 2, 2, 8, 4, NULL, 0, 0, NULL, 0};
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
    tide_resize_req req = {4, 1, 1, 4, 1, NULL, 0, 0, NULL, 0};
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
    tide_resize_req big = {8, 1, 1, 4, 1, NULL, 0, 0, NULL, 0};
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
    tide_resize_req zero = {0, 1, 1, 4, 1, NULL, 0, 0, NULL, 0};
    cr_assert_eq(tide_policy_place(NULL, NULL, &zero, c, 8, &l, pre, &np), TIDE_ERR_INVALID);
    tide_resize_req deep = {1, 1, 8, 4, 1, NULL, 0, 0, NULL, 0}; /* pp > layers */
    cr_assert_eq(tide_policy_place(NULL, NULL, &deep, c, 8, &l, pre, &np), TIDE_ERR_INVALID);
    int bad_stages[3] = {0, 4, 4}; /* empty second stage */
    tide_resize_req st = {1, 1, 2, 4, 1, bad_stages, 0, 0, NULL, 0};
    cr_assert_eq(tide_policy_place(NULL, NULL, &st, c, 8, &l, pre, &np), TIDE_ERR_INVALID);
    c[3].rank = 2; /* duplicate candidate */
    tide_resize_req ok = {2, 1, 1, 4, 1, NULL, 0, 0, NULL, 0};
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
    cr_assert_eq(tide_policy_recover(old, NULL, NULL, 0, c, n, &l, pre, &np, NULL, 0), TIDE_OK,
                 "%s", tide_last_error());
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
    cr_assert_eq(tide_policy_recover(old, NULL, NULL, 0, c, n, &l, pre, &np, NULL, 0), TIDE_OK);
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
    cr_assert_eq(tide_policy_recover(old, NULL, NULL, 0, c, 3, &l, pre, &np, NULL, 0),
                 TIDE_ERR_NO_DEVICE);
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
    tide_resize_req req = {4, 2, 1, 4, 1, NULL, 0, 0, NULL, 0};
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

/* Every TP group of l on one host, looking hosts up among the candidates. */
static int tp_groups_inside_hosts_of(const tide_layout_t *l, const tide_policy_worker *c, size_t n)
{
    for (size_t k = 0; k < tide_layout_size(l); k += (size_t)l->tp)
        for (int t = 1; t < l->tp; t++)
            if (host_of(c, n, l->worker[k + (size_t)t]) != host_of(c, n, l->worker[k]))
                return 0;
    return 1;
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
                rc = tide_policy_recover(job, NULL, NULL, 0, cand, k, &l, pre, &np, NULL, 0);
                if (rc == TIDE_OK)
                    cr_assert_leq(l->dp, dp, "recovery chose dp %d, the hosts hold %d", l->dp, dp);
            } else if (dp >= 1) {
                tide_resize_req req = {dp, tp, pp, layers, 1, NULL, 0, 0, NULL, 0};
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
    tide_resize_req req = {5, 2, 1, 4, 1, NULL, 0, 0, NULL, 0};
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

/* A resize to a layout the program cannot run is refused with the rule, however many
   workers there are: before, tided placed it and every rank died applying it. */
Test(policy, resize_to_a_layout_the_program_cannot_run_is_refused_with_the_rule)
{
    tide_policy_worker *c = workers(16, 8, TIDE_PW_IDLE);
    tide_layout_t *old = NULL, *l = NULL;
    cr_assert_eq(tide_layout_new(&old, 4, 1, 1, 4, 4), TIDE_OK);
    for (int i = 0; i < 4; i++)
        c[i].cls = TIDE_PW_MEMBER;
    int32_t pre[16];
    size_t np = 0;
    tide_resize_req req = {3, 1, 1, 4, 4, NULL, 0, 0, batch16, 2};
    cr_assert_eq(tide_policy_place(old, NULL, &req, c, 16, &l, pre, &np), TIDE_ERR_INVALID);
    cr_assert_null(l);
    cr_expect_str_eq(tide_last_error(),
                     "(dp 3, tp 1, pp 1; 4 micro-batches) is not a layout the job's program "
                     "can run: dp 3 does not divide 4 (the global batch 16 / 4 micro-batches)");
    req.dp = 2;
    req.tp = 3;
    cr_assert_eq(tide_policy_place(old, NULL, &req, c, 16, &l, pre, &np), TIDE_ERR_INVALID);
    cr_expect(strstr(tide_last_error(), "tp 3 does not divide 8 (the attention heads)") != NULL,
              "%s", tide_last_error());
    /* too few workers as well: the program's reason comes first, more workers would not help */
    req.dp = 3;
    req.tp = 1;
    cr_assert_eq(tide_policy_place(old, NULL, &req, c, 2, &l, pre, &np), TIDE_ERR_INVALID);
    cr_expect(strstr(tide_last_error(), "dp 3 does not divide 4") != NULL, "%s", tide_last_error());
    /* what the rules allow is placed as before; without rules anything goes */
    req.dp = 2;
    req.tp = 4;
    cr_assert_eq(tide_policy_place(old, NULL, &req, c, 16, &l, pre, &np), TIDE_OK, "%s",
                 tide_last_error());
    cr_expect(l->dp == 2 && l->tp == 4);
    tide_layout_destroy(&l);
    req = (tide_resize_req){3, 1, 1, 4, 4, NULL, 0, 0, NULL, 0};
    cr_assert_eq(tide_policy_place(old, NULL, &req, c, 16, &l, pre, &np), TIDE_OK);
    tide_layout_destroy(&l);
    tide_layout_destroy(&old);
    free(c);
}

/* dp 4 loses a worker: 3 survivors would make dp 3, which the program cannot run (it died
   of it before). Recovery takes dp 2, leaves the third survivor idle, and says why. */
Test(policy, recovery_picks_the_largest_dp_the_program_can_run)
{
    tide_layout_t *old = NULL, *l = NULL;
    cr_assert_eq(tide_layout_new(&old, 4, 1, 1, 4, 4), TIDE_OK); /* ranks 0..3 */
    tide_policy_worker c[4] = {{0, 0, TIDE_PW_MEMBER, 0},
                               {1, 0, TIDE_PW_MEMBER, 0},
                               {3, 0, TIDE_PW_MEMBER, 0},
                               {7, 0, TIDE_PW_OFFLINE, 5}}; /* rank 2 lost */
    int32_t pre[4];
    size_t np = 0;
    char why[512];
    cr_assert_eq(tide_policy_recover(old, NULL, batch16, 2, c, 3, &l, pre, &np, why, sizeof why),
                 TIDE_OK, "%s", tide_last_error());
    cr_assert_eq(l->dp, 2, "recovery chose dp %d", l->dp);
    cr_assert_eq(tide_fit_check(batch16, 2, l->dp, l->tp, l->pp, l->micro_batches), TIDE_OK);
    cr_expect_str_eq(why,
                     "dp 2 instead of 4: the 3 available workers hold at most dp 3 of tp 1 x pp 1; "
                     "the job's program cannot run dp 3: dp 3 does not divide 4 (the global "
                     "batch 16 / 4 micro-batches); 1 worker left idle for offline work");
    /* the survivors keep their roles: dp ranks 0 and 1 stay where they were */
    cr_expect(l->worker[0] == 0 && l->worker[1] == 1, "workers %d %d", l->worker[0], l->worker[1]);
    tide_layout_destroy(&l);
    /* offline work is not preempted for a replica the program could not use */
    cr_assert_eq(tide_policy_recover(old, NULL, batch16, 2, c, 4, &l, pre, &np, why, sizeof why),
                 TIDE_OK, "%s", tide_last_error());
    cr_assert_eq(l->dp, 4, "with the offline worker there are 4 again: dp 4");
    cr_assert_eq(np, 1);
    cr_expect_str_eq(why, "");
    tide_layout_destroy(&l);
    /* without rules, as before: dp 3 */
    cr_assert_eq(tide_policy_recover(old, NULL, NULL, 0, c, 3, &l, pre, &np, why, sizeof why),
                 TIDE_OK);
    cr_assert_eq(l->dp, 3);
    cr_expect(strstr(why, "dp 3 instead of 4") != NULL, "%s", why);
    tide_layout_destroy(&l);
    /* tp and pp that break the rules leave no dp to recover with */
    tide_layout_t *bad = NULL;
    cr_assert_eq(tide_layout_new(&bad, 2, 3, 1, 4, 4), TIDE_OK);
    tide_policy_worker b[6];
    for (int i = 0; i < 6; i++)
        b[i] = (tide_policy_worker){i, 0, TIDE_PW_MEMBER, 0};
    cr_assert_eq(tide_policy_recover(bad, NULL, batch16, 2, b, 5, &l, pre, &np, why, sizeof why),
                 TIDE_ERR_INVALID);
    cr_expect(strstr(tide_last_error(), "tp 3 does not divide 8") != NULL, "%s", tide_last_error());
    cr_assert_null(l);
    tide_layout_destroy(&bad);
    tide_layout_destroy(&old);
}

/* The TP-inside-host rule and the fit rules together: each limit is applied and named. */
Test(policy, recovery_combines_tp_inside_hosts_with_the_fit_rules)
{
    /* (dp 6, tp 2) on ranks 0..11 loses rank 11; ranks 0..10 and idle 12..14 sit on hosts
       of 3 GPUs (rank / 3), each with room for one TP group of 2: enough workers for dp 6,
       room in the hosts for dp 5, and a program that needs dp to divide 6: dp 3 */
    tide_layout_t *old = NULL, *l = NULL;
    cr_assert_eq(tide_layout_new(&old, 6, 2, 1, 4, 1), TIDE_OK);
    tide_policy_worker c[16];
    size_t n = 0;
    for (int r = 0; r < 15; r++)
        if (r != 11)
            c[n++] = (tide_policy_worker){r, r / 3, r < 12 ? TIDE_PW_MEMBER : TIDE_PW_IDLE, 0};
    const tide_fit_rule six[] = {{TIDE_DEGREE_DP, 6, "the batch of 6"}};
    int32_t pre[16];
    size_t np = 0;
    char why[512];
    cr_assert_eq(tide_policy_tp_fit_dp(c, n, 2, 1, 6), 5);
    cr_assert_eq(tide_policy_recover(old, NULL, six, 1, c, n, &l, pre, &np, why, sizeof why),
                 TIDE_OK, "%s", tide_last_error());
    cr_assert_eq(l->dp, 3, "dp %d", l->dp);
    cr_assert(tp_groups_inside_hosts_of(l, c, n), "a TP group spans hosts");
    cr_expect_str_eq(why, "dp 3 instead of 6: each TP group of 2 must sit inside one host, and "
                          "the hosts hold dp 5; the job's program cannot run dp 5: dp 5 does not "
                          "divide 6 (the batch of 6); 8 workers left idle for offline work");
    tide_layout_destroy(&l);
    /* without the rules the TP rule alone: dp 5, as before */
    cr_assert_eq(tide_policy_recover(old, NULL, NULL, 0, c, n, &l, pre, &np, why, sizeof why),
                 TIDE_OK);
    cr_assert_eq(l->dp, 5);
    cr_assert(tp_groups_inside_hosts_of(l, c, n), "a TP group spans hosts");
    tide_layout_destroy(&l);
    tide_layout_destroy(&old);
}

/*
 * Property: random clusters, random programs (rules on dp, tp and pp) and random failure
 * sequences. Whatever the recovery picks is a layout the program can run, keeps every TP
 * group inside a host, and is the largest dp that the survivors, their hosts and the rules
 * allow together (nothing is given up for no reason); a resize is refused exactly when the
 * rules forbid it.
 */
Test(policy, random_recoveries_never_pick_a_layout_the_program_cannot_run)
{
    uint64_t s = 0xf17f17ull;
    int decisions = 0, by_rules = 0, refused = 0;
    for (int run = 0; run < 40; run++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        static const int tps[] = {1, 2, 4};
        int tp = tps[(s >> 33) % 3], pp = 1 + (int)((s >> 40) % 3), layers = 12;
        int gpus = tp * (1 + (int)((s >> 44) % 2)) + (int)((s >> 48) % 2); /* spare GPUs */
        int hosts = 3 + (int)((s >> 52) % 6);
        int n = hosts * gpus;
        /* the program: batch B over M micro-batches; heads over tp; layers over pp */
        static const int batches[] = {12, 16, 18, 20, 24, 30, 32, 36};
        int M = 1 + (int)((s >> 20) % 3);
        int B = batches[(s >> 24) % 8] * M;
        tide_fit_rule fit[3];
        memset(fit, 0, sizeof fit);
        fit[0] = (tide_fit_rule){TIDE_DEGREE_DP, B / M, "the batch"};
        fit[1] = (tide_fit_rule){TIDE_DEGREE_TP, tp * 3, "the heads"};
        fit[2] = (tide_fit_rule){TIDE_DEGREE_PP, 12, "the layers"};
        int dp0 = tide_policy_fit_dp(fit, 3, tp, pp, M, n / (tp * pp));
        if (dp0 < 2)
            continue;
        int32_t *host = calloc((size_t)n, sizeof *host);
        uint8_t *alive = calloc((size_t)n, 1), *member = calloc((size_t)n, 1);
        tide_policy_worker *cand = calloc((size_t)n, sizeof *cand);
        int32_t *pre = calloc((size_t)n, sizeof *pre);
        for (int w = 0; w < n; w++) {
            host[w] = w / gpus;
            alive[w] = 1;
        }
        tide_layout_t *job = NULL;
        for (int w = 0; w < n; w++)
            cand[w] = (tide_policy_worker){w, host[w], TIDE_PW_IDLE, 0};
        size_t np = 0;
        tide_resize_req first = {tide_policy_tp_fit_dp(cand, (size_t)n, tp, pp, dp0),
                                 tp,
                                 pp,
                                 layers,
                                 M,
                                 NULL,
                                 0,
                                 0,
                                 fit,
                                 3};
        first.dp = tide_policy_fit_dp(fit, 3, tp, pp, M, first.dp);
        cr_assert_eq(tide_policy_place(NULL, NULL, &first, cand, (size_t)n, &job, pre, &np),
                     TIDE_OK, "run %d: %s", run, tide_last_error());
        for (size_t i = 0; i < tide_layout_size(job); i++)
            member[job->worker[i]] = 1;
        for (int step = 0; step < 30; step++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            int w = (int)((s >> 33) % (uint64_t)n);
            if ((s >> 20) % 5 == 0)
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
            /* a random resize the operator asks for: refused exactly when the rules say so */
            int rdp = 1 + (int)((s >> 40) % 6), rtp = tps[(s >> 46) % 3],
                rpp = 1 + (int)((s >> 50) % 4);
            tide_resize_req rr = {rdp, rtp, rpp, layers, M, NULL, 0, 1, fit, 3};
            tide_layout_t *rl = NULL;
            tide_status rrc = tide_policy_place(job, NULL, &rr, cand, k, &rl, pre, &np);
            int allowed = tide_fit_check(fit, 3, rdp, rtp, rpp, M) == TIDE_OK;
            if (!allowed) {
                cr_assert_eq(rrc, TIDE_ERR_INVALID, "resize to a forbidden layout placed");
                cr_assert(strstr(tide_last_error(), "does not divide") != NULL, "%s",
                          tide_last_error());
                refused++;
            } else if (rrc == TIDE_OK) {
                cr_assert_eq(tide_fit_check(fit, 3, rl->dp, rl->tp, rl->pp, rl->micro_batches),
                             TIDE_OK);
            }
            tide_layout_destroy(&rl);
            if (!lost)
                continue;
            tide_layout_t *l = NULL;
            char why[1024];
            tide_status rc =
                tide_policy_recover(job, NULL, fit, 3, cand, k, &l, pre, &np, why, sizeof why);
            /* the best dp by hand: count, hosts, rules */
            int by_count = (int)k / (tp * pp);
            if (by_count > job->dp)
                by_count = job->dp;
            int by_hosts = tide_policy_tp_fit_dp(cand, k, tp, pp, by_count);
            int best = 0;
            for (int d = by_hosts; d >= 1 && best == 0; d--)
                if ((B / M) % d == 0)
                    best = d;
            if (rc != TIDE_OK) {
                cr_assert_eq(rc, TIDE_ERR_NO_DEVICE, "%s", tide_last_error());
                cr_assert_eq(best, 0, "recovery refused with room for dp %d: %s", best,
                             tide_last_error());
                continue;
            }
            decisions++;
            cr_assert_eq(tide_fit_check(fit, 3, l->dp, l->tp, l->pp, l->micro_batches), TIDE_OK,
                         "run %d step %d: recovery picked %d x %d x %d: %s", run, step, l->dp,
                         l->tp, l->pp, tide_last_error());
            cr_assert_eq(l->dp, best, "run %d step %d: dp %d, the best runnable is %d", run, step,
                         l->dp, best);
            cr_assert(tp_groups_inside_hosts(l, host), "run %d step %d: TP group across hosts", run,
                      step);
            for (size_t i = 0; i < tide_layout_size(l); i++)
                cr_assert(alive[l->worker[i]], "a dead worker in the recovery layout");
            if (best < by_hosts) {
                by_rules++;
                cr_assert(strstr(why, "the job's program cannot run dp") != NULL, "%s", why);
            }
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
    cr_log_info("%d recoveries, %d held back by the program's rules, %d resizes refused", decisions,
                by_rules, refused);
    cr_expect(decisions > 100 && by_rules > 10 && refused > 100,
              "%d decisions, %d by rules, %d "
              "refused",
              decisions, by_rules, refused);
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
    cr_assert_eq(tide_policy_switch_step(steps, old, NULL, 4, 0), 12); /* max of old members + 1 */
    cr_assert_eq(tide_policy_switch_step(steps, old, NULL, 4, 1), 9);  /* recovery: min */
    uint8_t none[4] = {0, 0, 0, 0};
    cr_assert_eq(tide_policy_switch_step(steps, none, NULL, 4, 0), -1);
}

Test(policy, failure_detection_with_a_fake_clock)
{
    tide_coord_state_t *st = NULL;
    cr_assert_eq(tide_coord_state_new(&st), TIDE_OK);
    tide_coord_worker_t *w = NULL;
    for (int r = 0; r < 3; r++) {
        cr_assert_eq(tide_coord_worker_add(st, -1, "pool", r, &w), TIDE_OK);
        tide_coord_worker_seen(st, w, 1000000000ull); /* t = 1 s */
    }
    st->workers[2].state = TIDE_WS_FAILED;
    int32_t out[3];
    const uint64_t limit = 3 * 1000000000ull; /* 3 heartbeats of 1 s */
    cr_assert_eq(tide_coord_workers_expired(st, 3900000000ull, limit, out, 3), 0);
    tide_coord_worker_seen(st, &st->workers[1], 3000000000ull); /* heartbeat at t = 3 s */
    size_t n = tide_coord_workers_expired(st, 4100000000ull, limit, out, 3);
    cr_assert_eq(n, 1);
    cr_assert_eq(out[0], 0);
    /* worker 0 was handed out (and left the list): only worker 1 expires later; the failed
       one never does */
    n = tide_coord_workers_expired(st, 6100000000ull, limit, out, 3);
    cr_assert_eq(n, 1);
    cr_assert_eq(out[0], 1);
    cr_assert_eq(tide_coord_workers_expired(st, 60000000000ull, limit, out, 3), 0);
    tide_coord_state_destroy(&st);
    cr_assert_null(st);
}
