/*
 * Unit tests for the decisions tided takes through policy.h beyond placement and recovery
 * (test_coordinator.c has those): a job's first layout, a drain plan, a rollback layout,
 * whether survivors still hold a job's state, whose bubbles take a plugin, retry backoff
 * and a requested checkpoint's step. In-process, milliseconds each.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coordinator/policy.h"

/* n idle workers, hosts of `per_host` consecutive ranks. */
static void idle_workers(tide_policy_worker *c, size_t n, int per_host)
{
    for (size_t i = 0; i < n; i++)
        c[i] = (tide_policy_worker){(int32_t)i, (int32_t)(i / (size_t)per_host), TIDE_PW_IDLE, 0};
}

/* layers layers of one tp-split, dp-replicated f32 [8, 4] tensor each. */
static tide_collection_t *split_tensors(int layers)
{
    tide_collection_t *c = NULL;
    cr_assert_eq(tide_collection_new(&c, layers), TIDE_OK);
    for (int i = 0; i < layers; i++) {
        tide_tensor_desc d;
        memset(&d, 0, sizeof d);
        snprintf(d.name, sizeof d.name, "w%d", i);
        d.dtype = TIDE_F32;
        d.ndim = 2;
        d.shape[0] = 8;
        d.shape[1] = 4;
        d.layer = i;
        d.tp = TIDE_TP_SPLIT;
        d.tp_dim = 0;
        d.tp_segments = 1;
        d.dp = TIDE_DP_REPLICATED;
        cr_assert_eq(tide_collection_add(c, &d), TIDE_OK, "%s", tide_last_error());
    }
    return c;
}

Test(policy_first, waits_refuses_or_places)
{
    tide_policy_worker c[8];
    int32_t pre[8];
    size_t n, np;
    tide_layout_t *l = NULL;
    tide_policy_first v;
    int fit;
    tide_resize_req req = {2, 2, 1, 4, 1, NULL, 0, 0, NULL, 0};

    /* 3 idle ranks of a launch of 8: too few for dp 2 x tp 2 yet */
    idle_workers(c, 3, 2);
    n = 3;
    cr_assert_eq(tide_policy_first_layout(NULL, &req, c, &n, 8, &l, pre, &np, &v, &fit), TIDE_OK);
    cr_assert_eq(v, TIDE_FIRST_WAIT);
    cr_assert_null(l);

    /* the whole launch of 4 joined, one rank per host: no TP group of 2 fits in a host */
    idle_workers(c, 4, 1);
    n = 4;
    cr_assert_eq(tide_policy_first_layout(NULL, &req, c, &n, 4, &l, pre, &np, &v, &fit), TIDE_OK);
    cr_assert_eq(v, TIDE_FIRST_REFUSE);
    cr_assert_eq(fit, 0);
    cr_assert_null(l);
    /* the same ranks while more of the launch may still come: no layout yet, but no
       refusal (placement says what is missing) */
    n = 4;
    cr_assert_eq(tide_policy_first_layout(NULL, &req, c, &n, 8, &l, pre, &np, &v, &fit),
                 TIDE_ERR_NO_DEVICE);
    cr_assert_eq(v, TIDE_FIRST_WAIT);
    cr_assert_null(l);

    /* hosts of 2; one rank runs offline work (preempted for the job), one is another job's
       member (not a candidate of a first layout: compacted away) */
    idle_workers(c, 6, 2);
    c[1].cls = TIDE_PW_OFFLINE;
    c[5].cls = TIDE_PW_MEMBER;
    n = 6;
    cr_assert_eq(tide_policy_first_layout(NULL, &req, c, &n, 8, &l, pre, &np, &v, &fit), TIDE_OK,
                 "%s", tide_last_error());
    cr_assert_eq(v, TIDE_FIRST_PLACED);
    cr_assert_eq(n, 5);
    cr_assert_eq(tide_layout_size(l), 4);
    for (size_t i = 0; i < tide_layout_size(l); i++)
        cr_assert_neq(l->worker[i], 5);
    for (size_t i = 0; i < np; i++)
        cr_assert_eq(pre[i], 1, "only offline work on a chosen rank is preempted");
    tide_layout_destroy(&l);
}

Test(policy_drain, moves_only_the_drained_coordinate_or_shrinks)
{
    tide_layout_t *old = NULL, *l = NULL;
    cr_assert_eq(tide_layout_new(&old, 2, 2, 1, 4, 1), TIDE_OK);
    for (int i = 0; i < 4; i++)
        old->worker[i] = i;
    tide_policy_worker c[5];
    idle_workers(c, 5, 2); /* ranks 0-3 members on hosts 0 and 1; rank 4 idle on host 2 */
    for (int i = 0; i < 4; i++)
        c[i].cls = TIDE_PW_MEMBER;
    c[4].host = 1; /* the idle rank shares rank 2 and 3's host */
    int32_t pre[5];
    size_t np;
    char why[512];
    /* drain rank 3: rank 4, on the same host, takes its coordinate; no one else moves */
    cr_assert_eq(tide_policy_drain(old, NULL, NULL, 0, c, 5, 3, &l, pre, &np, why, sizeof why),
                 TIDE_OK, "%s", tide_last_error());
    cr_assert_eq(l->dp, 2);
    int moved = 0;
    for (size_t i = 0; i < 4; i++) {
        cr_assert_neq(l->worker[i], 3, "the drained rank keeps no coordinate");
        moved += l->worker[i] != old->worker[i];
    }
    cr_assert_eq(moved, 1);
    cr_assert_str_eq(why, "");
    tide_layout_destroy(&l);
    /* no idle rank left: the job shrinks to dp 1 and says why */
    cr_assert_eq(tide_policy_drain(old, NULL, NULL, 0, c, 4, 3, &l, pre, &np, why, sizeof why),
                 TIDE_OK, "%s", tide_last_error());
    cr_assert_eq(l->dp, 1);
    cr_assert(strstr(why, "dp 1 instead of 2") != NULL, "%s", why);
    tide_layout_destroy(&l);
    tide_layout_destroy(&old);
}

Test(policy_rollback, takes_the_largest_layout_the_survivors_run)
{
    tide_layout_t *old = NULL, *l = NULL;
    cr_assert_eq(tide_layout_new(&old, 1, 2, 2, 4, 2), TIDE_OK);
    tide_policy_worker c[3];
    idle_workers(c, 3, 3);
    int32_t pre[3];
    size_t np;
    char why[256];
    /* 3 workers: tp 2 does not divide 3, pp 2 does not divide 3: dp 3, tp 1, pp 1 */
    cr_assert_eq(tide_policy_rollback(old, NULL, NULL, 0, c, 3, &l, pre, &np, why, sizeof why),
                 TIDE_OK, "%s", tide_last_error());
    cr_assert_eq(l->dp, 3);
    cr_assert_eq(l->tp, 1);
    cr_assert_eq(l->pp, 1);
    cr_assert(strstr(why, "(dp 3, tp 1, pp 1) instead of (dp 1, tp 2, pp 2)") != NULL, "%s", why);
    tide_layout_destroy(&l);
    /* a rule that only dp 1 may run: the largest job is then 2 workers, the widest tp first */
    tide_fit_rule one;
    memset(&one, 0, sizeof one);
    one.degree = TIDE_DEGREE_DP;
    one.n = 1;
    snprintf(one.what, sizeof one.what, "one replica");
    cr_assert_eq(tide_policy_rollback(old, NULL, &one, 1, c, 3, &l, pre, &np, why, sizeof why),
                 TIDE_OK, "%s", tide_last_error());
    cr_assert_eq(l->dp, 1);
    cr_assert_eq(l->tp, 2);
    cr_assert_eq(tide_layout_size(l), 2);
    tide_layout_destroy(&l);
    cr_assert_eq(tide_policy_rollback(old, NULL, NULL, 0, c, 0, &l, pre, &np, why, sizeof why),
                 TIDE_ERR_NO_DEVICE);
    cr_assert_null(l);
    tide_layout_destroy(&old);
}

Test(policy_recovery, survivors_hold_the_state_only_with_a_replica)
{
    tide_collection_t *coll = split_tensors(2);
    tide_layout_t *old = NULL;
    cr_assert_eq(tide_layout_new(&old, 2, 2, 1, 2, 1), TIDE_OK); /* workers 0-3 */
    for (int i = 0; i < 4; i++)
        old->worker[i] = 10 + i;
    uint8_t dead[4] = {0, 1, 0, 0};
    /* the lost coordinate has a dp replica: any replacement can be served */
    cr_assert_eq(tide_policy_recovery_feasible(old, dead, NULL, coll), TIDE_OK, "%s",
                 tide_last_error());
    /* both replicas of tp rank 1 lost: nobody holds it, whoever joins; the error names the
       dead worker a new one would replace, not a made-up id */
    uint8_t both[4] = {0, 1, 0, 1};
    cr_assert_eq(tide_policy_recovery_feasible(old, both, NULL, coll), TIDE_ERR_NO_HOLDER);
    cr_assert(strstr(tide_last_error(), "needed by any worker that replaces worker 11 ") != NULL ||
                  strstr(tide_last_error(), "needed by any worker that replaces worker 13 ") !=
                      NULL,
              "%s", tide_last_error());
    cr_assert(strstr(tide_last_error(), "however many workers join") != NULL, "%s",
              tide_last_error());
    /* a layout over the two survivors (dp 1): it needs tp rank 1, which no survivor has */
    tide_layout_t *to = NULL;
    cr_assert_eq(tide_layout_new(&to, 1, 2, 1, 2, 1), TIDE_OK);
    to->worker[0] = 10;
    to->worker[1] = 12;
    cr_assert_eq(tide_policy_recovery_feasible(old, both, to, coll), TIDE_ERR_NO_HOLDER);
    cr_assert_eq(tide_policy_recovery_feasible(old, dead, to, coll), TIDE_OK, "%s",
                 tide_last_error());
    tide_layout_destroy(&to);
    tide_layout_destroy(&old);
    tide_collection_destroy(&coll);
}

Test(policy_bubbles, the_largest_measured_share_wins)
{
    tide_policy_bubbles w[4] = {
        {7, 0, 100},  /* no bubbles measured */
        {8, 30, 100}, /* 30% */
        {9, 60, 200}, /* 30%: a tie keeps the first */
        {10, 50, 0},  /* no step time measured */
    };
    cr_assert_eq(tide_policy_bubble_pick(w, 4), 1);
    w[2].bubble_ns = 61;
    cr_assert_eq(tide_policy_bubble_pick(w, 4), 2);
    cr_assert_eq(tide_policy_bubble_pick(w, 1), -1);
    cr_assert_eq(tide_policy_bubble_pick(NULL, 0), -1);
}

Test(policy_offline, retry_backoff_doubles_up_to_a_minute)
{
    cr_assert_eq(tide_policy_retry_backoff_ms(1000, 1), 1000);
    cr_assert_eq(tide_policy_retry_backoff_ms(1000, 2), 2000);
    cr_assert_eq(tide_policy_retry_backoff_ms(1000, 4), 8000);
    cr_assert_eq(tide_policy_retry_backoff_ms(1000, 40), 60000);
    cr_assert_eq(tide_policy_retry_backoff_ms(0, 5), 0);
}

Test(policy_checkpoint, the_step_is_past_every_member)
{
    /* no speed known: two steps past the furthest member */
    cr_assert_eq(tide_policy_ckpt_step(10, 0.0, 1000), 12);
    /* 5 steps/s and a heartbeat of 1 s: the 4 periods a request may take, 20 steps */
    cr_assert_eq(tide_policy_ckpt_step(10, 5.0, 1000), 32);
    /* an absurd speed is bounded */
    cr_assert_eq(tide_policy_ckpt_step(0, 1e12, 1000), 2 + 1000000);
}
