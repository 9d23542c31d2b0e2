/*
 * Unit tests for the coordinator's pure parts: policy decisions (placement,
 * recovery, backfill order, switch step, failure detection with a fake clock),
 * layout helpers, and the SQLite store (round trip, append-only events,
 * exclusive file). In-process, milliseconds each.
 */
#include <criterion/criterion.h>
#include <msgpack.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/alloc.h"
#include "coordinator/event_fields.h"
#include "coordinator/policy.h"
#include "coordinator/state.h"
#include "coordinator/store.h"
#include "proto/proto.h"
#include "proto/proto_reshard.h"

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

/* The rules of a job whose program splits a global batch of 16 in 4 micro-batches per dp
   rank (dp must divide 4) and 8 heads over tp. */
static const tide_fit_rule batch16[] = {
    {TIDE_DEGREE_DP, 4, "the global batch 16 / 4 micro-batches"},
    {TIDE_DEGREE_TP, 8, "the attention heads"},
};

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

/* Closes s and st, opens and loads the state file at path into them again and returns its
   job `name`. */
static tide_coord_job_t *reload_job(tide_store_t **s, tide_coord_state_t **st, const char *path,
                                    const char *name)
{
    tide_store_close(s);
    tide_coord_state_destroy(st);
    cr_assert_eq(tide_store_open(s, path, 0), TIDE_OK, "%s", tide_last_error());
    cr_assert_eq(tide_coord_state_new(st), TIDE_OK);
    cr_assert_eq(tide_store_load(*s, *st), TIDE_OK, "%s", tide_last_error());
    tide_coord_job_t *j = tide_coord_job_by_name(*st, name);
    cr_assert_not_null(j);
    return j;
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
    snprintf(b, sizeof b, "%s.seq", p);
    unlink(b);
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
