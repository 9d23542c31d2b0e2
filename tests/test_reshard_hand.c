/*
 * Part of test_reshard (unit tests for reshard/): reshard plans checked by hand, item by
 * item (dp, tp and pp changes, fused qkv segments, zero1 ranges, lost workers with and
 * without a replica, an identity resize, a GPT dp shrink), and the plan validator catching
 * broken plans.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "reshard/reshard.h"
#include "tests/support/plan_check.h"
#include "tests/reshard_fixture.h"

/* ---- hand-checked plans ------------------------------------------------------------------ */

static void expect_item(const tide_plan_t *p, size_t k, uint32_t tensor, int src, int dst,
                        uint64_t src_off, uint64_t dst_off, uint64_t run, uint64_t count,
                        uint64_t src_stride, uint64_t dst_stride)
{
    cr_assert(k < p->n, "item %zu missing (plan has %zu)", k, p->n);
    const tide_xfer *x = &p->items[k];
    cr_expect(x->tensor == tensor && x->src == src && x->dst == dst && x->src_off == src_off &&
                  x->dst_off == dst_off && x->run == run && x->count == count,
              "item %zu: got (t%u %d->%d so %llu do %llu run %llu x %llu), want (t%u %d->%d so "
              "%llu do %llu run %llu x %llu)",
              k, x->tensor, (int)x->src, (int)x->dst, (unsigned long long)x->src_off,
              (unsigned long long)x->dst_off, (unsigned long long)x->run,
              (unsigned long long)x->count, tensor, src, dst, (unsigned long long)src_off,
              (unsigned long long)dst_off, (unsigned long long)run, (unsigned long long)count);
    if (count > 1)
        cr_expect(x->src_stride == src_stride && x->dst_stride == dst_stride,
                  "item %zu: strides %llu/%llu, want %llu/%llu", k,
                  (unsigned long long)x->src_stride, (unsigned long long)x->dst_stride,
                  (unsigned long long)src_stride, (unsigned long long)dst_stride);
}

Test(reshard_hand, dp_2_to_4_sends_each_replica_once_from_balanced_senders)
{
    tide_tensor_desc t[] = {
        mk("w", TIDE_F32, 2, 8, 4, 0, TIDE_TP_REPLICATED, 0, 1, TIDE_DP_REPLICATED)};
    tide_collection_t *c = coll(1, t, 1);
    tide_layout_t *o = layout(2, 1, 1, 1), *n = layout(4, 1, 1, 1);
    tide_plan_t *p = checked_plan(o, n, c, NULL, 0);
    cr_assert_eq(p->n, 4);
    expect_item(p, 0, 0, 0, 0, 0, 0, 128, 1, 0, 0);
    expect_item(p, 1, 0, 0, 2, 0, 0, 128, 1, 0, 0);
    expect_item(p, 2, 0, 1, 1, 0, 0, 128, 1, 0, 0);
    expect_item(p, 3, 0, 1, 3, 0, 0, 128, 1, 0, 0);
    cr_expect_eq(p->summary.bytes_sent, 256);
    cr_expect_eq(p->summary.bytes_local, 256);
    cr_expect_eq(p->summary.max_send, 128);
    cr_expect_eq(p->summary.balanced_bound, 128);
    cr_expect_eq(p->summary.max_recv, 128);
    cr_expect_eq(p->summary.messages, 2);
    cr_expect_eq(p->summary.n_xfers, 2);
    cr_expect_eq(p->summary.n_copies, 2);
    tide_plan_destroy(&p);
    cr_expect_null(p);
    tide_layout_destroy(&o);
    tide_layout_destroy(&n);
    tide_collection_destroy(&c);
}

Test(reshard_hand, tp_2_to_4_column_and_row_splits)
{
    tide_tensor_desc t[] = {
        mk("col", TIDE_F32, 2, 8, 4, 0, TIDE_TP_SPLIT, 0, 1, TIDE_DP_REPLICATED),
        mk("row", TIDE_F32, 2, 4, 8, 0, TIDE_TP_SPLIT, 1, 1, TIDE_DP_REPLICATED),
    };
    tide_collection_t *c = coll(1, t, 2);
    tide_layout_t *o = layout(1, 2, 1, 1), *n = layout(1, 4, 1, 1);
    tide_plan_t *p = checked_plan(o, n, c, NULL, 0);
    cr_assert_eq(p->n, 8);
    /* col rows: old t0 0-3, t1 4-7; new t' rows 2t'..2t'+1 (32 bytes). */
    expect_item(p, 0, 0, 0, 0, 0, 0, 32, 1, 0, 0);
    /* row cols: local [4, 2] taken from [4, 4]: 4 runs of 8 bytes, strides 16 / 8. */
    expect_item(p, 1, 1, 0, 0, 0, 0, 8, 4, 16, 8);
    expect_item(p, 2, 0, 0, 1, 32, 0, 32, 1, 0, 0);
    expect_item(p, 3, 1, 0, 1, 8, 0, 8, 4, 16, 8);
    expect_item(p, 4, 0, 1, 2, 0, 0, 32, 1, 0, 0);
    expect_item(p, 5, 1, 1, 2, 0, 0, 8, 4, 16, 8);
    expect_item(p, 6, 0, 1, 3, 32, 0, 32, 1, 0, 0);
    expect_item(p, 7, 1, 1, 3, 8, 0, 8, 4, 16, 8);
    cr_expect_eq(p->summary.bytes_sent, 3 * 64);
    cr_expect_eq(p->summary.bytes_local, 64);
    tide_plan_destroy(&p);
    tide_layout_destroy(&o);
    tide_layout_destroy(&n);
    tide_collection_destroy(&c);
}

Test(reshard_hand, tp_4_to_2_gathers_neighbouring_chunks)
{
    tide_tensor_desc t[] = {
        mk("col", TIDE_F32, 2, 8, 4, 0, TIDE_TP_SPLIT, 0, 1, TIDE_DP_REPLICATED),
        mk("row", TIDE_F32, 2, 4, 8, 0, TIDE_TP_SPLIT, 1, 1, TIDE_DP_REPLICATED),
    };
    tide_collection_t *c = coll(1, t, 2);
    tide_layout_t *o = layout(1, 4, 1, 1), *n = layout(1, 2, 1, 1);
    tide_plan_t *p = checked_plan(o, n, c, NULL, 0);
    cr_assert_eq(p->n, 8);
    expect_item(p, 0, 0, 0, 0, 0, 0, 32, 1, 0, 0);
    expect_item(p, 1, 1, 0, 0, 0, 0, 8, 4, 8, 16);
    expect_item(p, 2, 0, 1, 0, 0, 32, 32, 1, 0, 0);
    expect_item(p, 3, 1, 1, 0, 0, 8, 8, 4, 8, 16);
    expect_item(p, 4, 0, 2, 1, 0, 0, 32, 1, 0, 0);
    expect_item(p, 5, 1, 2, 1, 0, 0, 8, 4, 8, 16);
    expect_item(p, 6, 0, 3, 1, 0, 32, 32, 1, 0, 0);
    expect_item(p, 7, 1, 3, 1, 0, 8, 8, 4, 8, 16);
    cr_expect_eq(p->summary.bytes_sent, 3 * 32 + 3 * 32);
    cr_expect_eq(p->summary.messages, 3);
    tide_plan_destroy(&p);
    tide_layout_destroy(&o);
    tide_layout_destroy(&n);
    tide_collection_destroy(&c);
}

Test(reshard_hand, pp_2_to_4_with_uneven_stages)
{
    tide_tensor_desc t[8];
    t[0] =
        mk("emb", TIDE_F32, 1, 4, 0, TIDE_LAYER_PRE, TIDE_TP_REPLICATED, 0, 1, TIDE_DP_REPLICATED);
    for (int i = 0; i < 6; i++) {
        char name[8];
        snprintf(name, sizeof name, "l%d", i);
        t[1 + i] = mk(name, TIDE_F32, 1, 4, 0, i, TIDE_TP_REPLICATED, 0, 1, TIDE_DP_REPLICATED);
    }
    t[7] = mk("head", TIDE_F32, 1, 4, 0, TIDE_LAYER_POST, TIDE_TP_REPLICATED, 0, 1,
              TIDE_DP_REPLICATED);
    tide_collection_t *c = coll(6, t, 8);
    tide_layout_t *o = layout(1, 1, 2, 6), *n = layout(1, 1, 4, 6);
    cr_assert_eq(tide_layout_parse_stages(o, "0-3,4-5"), TIDE_OK, "%s", tide_last_error());
    cr_assert_eq(tide_layout_parse_stages(n, "0-0,1-2,3-4,5-5"), TIDE_OK, "%s", tide_last_error());
    char buf[96];
    cr_expect_str_eq(tide_layout_format(n, buf, sizeof buf), "(dp 1, tp 1, pp 4; stages "
                                                             "0-0,1-2,3-4,5-5)");
    tide_plan_t *p = checked_plan(o, n, c, NULL, 0);
    cr_assert_eq(p->n, 8);
    /* emb and l0 stay on worker 0; l1-l3 leave old stage 0; l4, l5, head leave worker 1. */
    expect_item(p, 0, 0, 0, 0, 0, 0, 16, 1, 0, 0);
    expect_item(p, 1, 1, 0, 0, 0, 0, 16, 1, 0, 0);
    expect_item(p, 2, 2, 0, 1, 0, 0, 16, 1, 0, 0);
    expect_item(p, 3, 3, 0, 1, 0, 0, 16, 1, 0, 0);
    expect_item(p, 4, 4, 0, 2, 0, 0, 16, 1, 0, 0);
    expect_item(p, 5, 5, 1, 2, 0, 0, 16, 1, 0, 0);
    expect_item(p, 6, 6, 1, 3, 0, 0, 16, 1, 0, 0);
    expect_item(p, 7, 7, 1, 3, 0, 0, 16, 1, 0, 0);
    cr_expect_eq(p->summary.bytes_sent, 6 * 16);
    cr_expect_eq(p->summary.max_send, 3 * 16);
    tide_plan_destroy(&p);
    tide_layout_destroy(&o);
    tide_layout_destroy(&n);
    tide_collection_destroy(&c);
}

/* Runs the plan on a qkv whose element e holds the float e; returns worker w's new buffer. */
static float *run_qkv(const tide_layout_t *o, const tide_layout_t *n, const tide_collection_t *c,
                      const tide_plan_t *p, int w)
{
    float global[24];
    for (int e = 0; e < 24; e++)
        global[e] = (float)e;
    int nw = max_worker(o, n) + 1;
    void ***ob = make_bufs(o, c, nw, 0), ***nb = make_bufs(n, c, nw, 0);
    for (size_t j = 0; j < tide_layout_size(o); j++) {
        int pp, d, t;
        coord(o, j, &pp, &d, &t);
        tide_shard_extract(o, c, 0, pp, d, t, global, ob[o->worker[j]][0]);
    }
    tide_plan_simulate(p, (void *const *const *)ob, (void *const *const *)nb);
    float *out = malloc(24 * sizeof *out);
    memcpy(out, nb[w][0], 24 * sizeof *out / (size_t)n->tp);
    free_bufs(ob, c, nw);
    free_bufs(nb, c, nw);
    return out;
}

Test(reshard_hand, fused_qkv_is_split_segment_by_segment)
{
    /* qkv [12, 2]: q rows 0-3, k rows 4-7, v rows 8-11. */
    tide_tensor_desc t[] = {
        mk("qkv", TIDE_F32, 2, 12, 2, 0, TIDE_TP_SPLIT, 0, 3, TIDE_DP_REPLICATED)};
    tide_collection_t *c = coll(1, t, 1);
    tide_layout_t *l1 = layout(1, 1, 1, 1), *l2 = layout(1, 2, 1, 1);

    tide_plan_t *p = checked_plan(l1, l2, c, NULL, 0);
    cr_assert_eq(p->n, 2);
    expect_item(p, 0, 0, 0, 0, 0, 0, 16, 3, 32, 16);  /* q0-1, k4-5, v8-9 */
    expect_item(p, 1, 0, 0, 1, 16, 0, 16, 3, 32, 16); /* q2-3, k6-7, v10-11 */
    float *b = run_qkv(l1, l2, c, p, 1);
    const float want1[12] = {4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23};
    cr_expect_arr_eq(b, want1, sizeof want1);
    free(b);
    tide_plan_destroy(&p);

    p = checked_plan(l2, l1, c, NULL, 0);
    cr_assert_eq(p->n, 2);
    expect_item(p, 0, 0, 0, 0, 0, 0, 16, 3, 16, 32);
    expect_item(p, 1, 0, 1, 0, 0, 16, 16, 3, 16, 32);
    b = run_qkv(l2, l1, c, p, 0);
    for (int e = 0; e < 24; e++)
        cr_expect_eq(b[e], (float)e);
    free(b);
    tide_plan_destroy(&p);

    /* tp 2 -> 3 (4 rows per segment is not divisible by 3: rejected with the segment size). */
    tide_layout_t *l3 = layout(1, 3, 1, 1);
    cr_expect_eq(tide_reshard_plan(l2, l3, c, NULL, 0, &p), TIDE_ERR_INVALID);
    cr_expect_str_eq(tide_last_error(), "new layout: tp=3 does not divide dimension 0 of qkv "
                                        "(size 12: 3 fused segments of 4)");
    tide_layout_destroy(&l1);
    tide_layout_destroy(&l2);
    tide_layout_destroy(&l3);
    tide_collection_destroy(&c);
}

Test(reshard_hand, zero1_ranges_follow_a_dp_change)
{
    tide_tensor_desc t[] = {
        mk("m", TIDE_F32, 1, 10, 0, 0, TIDE_TP_REPLICATED, 0, 1, TIDE_DP_SHARDED)};
    tide_collection_t *c = coll(1, t, 1);
    tide_layout_t *o = layout(2, 1, 1, 1), *n = layout(3, 1, 1, 1);
    /* Old ranges [0,5) [5,10); new [0,4) [4,7) [7,10): the first n % dp ranks are longer. */
    cr_expect_eq(tide_shard_bytes(n, c, 0, 0, 0, 0), 16);
    cr_expect_eq(tide_shard_bytes(n, c, 0, 0, 1, 0), 12);
    cr_expect_eq(tide_shard_bytes(n, c, 0, 0, 2, 0), 12);
    tide_plan_t *p = checked_plan(o, n, c, NULL, 0);
    cr_assert_eq(p->n, 4);
    expect_item(p, 0, 0, 0, 0, 0, 0, 16, 1, 0, 0);
    expect_item(p, 1, 0, 0, 1, 16, 0, 4, 1, 0, 0);
    expect_item(p, 2, 0, 1, 1, 0, 4, 8, 1, 0, 0);
    expect_item(p, 3, 0, 1, 2, 8, 0, 12, 1, 0, 0);
    cr_expect_eq(p->summary.bytes_sent, 16);
    cr_expect_eq(p->summary.bytes_local, 24);
    tide_plan_destroy(&p);
    tide_layout_destroy(&o);
    tide_layout_destroy(&n);
    tide_collection_destroy(&c);
}

Test(reshard_hand, zero1_with_tp_split_uses_head_middle_tail_items)
{
    /* [6, 4] split along dim 1 over tp 2 -> 1, ZeRO over dp 1 -> 2: new rank 0 holds global
     * rows 0-2 of the unsplit tensor; from old t0 ([6,2]) that is 3 runs of 8 bytes. */
    tide_tensor_desc t[] = {mk("z", TIDE_F32, 2, 6, 4, 0, TIDE_TP_SPLIT, 1, 1, TIDE_DP_SHARDED)};
    tide_collection_t *c = coll(1, t, 1);
    tide_layout_t *o = layout(1, 2, 1, 1), *n = layout(2, 1, 1, 1);
    tide_plan_t *p = checked_plan(o, n, c, NULL, 0);
    cr_assert_eq(p->n, 4);
    expect_item(p, 0, 0, 0, 0, 0, 0, 8, 3, 8, 16);
    expect_item(p, 1, 0, 0, 1, 24, 0, 8, 3, 8, 16);
    expect_item(p, 2, 0, 1, 0, 0, 8, 8, 3, 8, 16);
    expect_item(p, 3, 0, 1, 1, 24, 8, 8, 3, 8, 16);
    tide_plan_destroy(&p);
    /* Odd sizes: [5, 4] over dp 3 cuts inside runs (partial head and tail items). */
    tide_tensor_desc t2[] = {mk("z", TIDE_F32, 2, 5, 4, 0, TIDE_TP_SPLIT, 1, 1, TIDE_DP_SHARDED)};
    tide_collection_t *c2 = coll(1, t2, 1);
    tide_layout_t *n3 = layout(3, 1, 1, 1);
    p = checked_plan(o, n3, c2, NULL, 0);
    int partial = 0;
    for (size_t k = 0; k < p->n; k++)
        partial += p->items[k].run == 4; /* one element of a two-element run */
    cr_expect(partial > 0);
    tide_plan_destroy(&p);
    tide_layout_destroy(&o);
    tide_layout_destroy(&n);
    tide_layout_destroy(&n3);
    tide_collection_destroy(&c);
    tide_collection_destroy(&c2);
}

Test(reshard_hand, lost_worker_with_a_replica_is_served_by_the_replica)
{
    tide_tensor_desc t[] = {
        mk("w", TIDE_F32, 1, 4, 0, 0, TIDE_TP_REPLICATED, 0, 1, TIDE_DP_REPLICATED)};
    tide_collection_t *c = coll(1, t, 1);
    tide_layout_t *o = layout(2, 1, 1, 1), *n = layout(2, 1, 1, 1);
    n->worker[0] = 1;
    n->worker[1] = 2;
    uint8_t alive[3] = {0, 1, 1};
    tide_plan_t *p = checked_plan(o, n, c, alive, 3);
    cr_assert_eq(p->n, 2);
    expect_item(p, 0, 0, 1, 1, 0, 0, 16, 1, 0, 0);
    expect_item(p, 1, 0, 1, 2, 0, 0, 16, 1, 0, 0);
    tide_plan_destroy(&p);
    /* A dead worker in the new layout is refused. */
    n->worker[1] = 0;
    cr_expect_eq(tide_reshard_plan(o, n, c, alive, 3, &p), TIDE_ERR_INVALID);
    cr_expect(strstr(tide_last_error(), "worker 0 is in the new layout") != NULL, "%s",
              tide_last_error());
    tide_layout_destroy(&o);
    tide_layout_destroy(&n);
    tide_collection_destroy(&c);
}

Test(reshard_hand, lost_worker_without_a_replica_names_tensor_and_region)
{
    tide_tensor_desc t[] = {
        mk("layer.0.fc1.weight", TIDE_F32, 2, 8, 2, 0, TIDE_TP_SPLIT, 0, 1, TIDE_DP_REPLICATED),
        mk("layer.0.fc1.weight.exp_avg", TIDE_F32, 2, 8, 2, 0, TIDE_TP_REPLICATED, 0, 1,
           TIDE_DP_SHARDED)};
    tide_collection_t *c = coll(1, t, 1);
    tide_layout_t *o = layout(1, 2, 1, 1), *n = layout(1, 2, 1, 1);
    n->worker[1] = 2;
    uint8_t alive[3] = {1, 0, 1};
    tide_plan_t *p = NULL;
    cr_assert_eq(tide_reshard_plan(o, n, c, alive, 3, &p), TIDE_ERR_NO_HOLDER);
    cr_expect_null(p);
    cr_expect_str_eq(tide_last_error(),
                     "no live worker holds tp shard 1 of 2 (dimension 0 indices [4, 8)) of "
                     "layer.0.fc1.weight, needed by worker 2 at (pp 0, dp 0, tp 1); its old "
                     "holders (workers 1) are all dead");
    cr_expect_eq(tide_reshard_plan_for(o, n, c, alive, 3, 2, &p), TIDE_ERR_NO_HOLDER);
    tide_collection_destroy(&c);
    /* ZeRO-1 state: the region is the dead rank's range. */
    c = coll(1, &t[1], 1);
    tide_layout_destroy(&o);
    tide_layout_destroy(&n);
    o = layout(2, 1, 1, 1);
    n = layout(2, 1, 1, 1);
    n->worker[1] = 2;
    cr_assert_eq(tide_reshard_plan(o, n, c, alive, 3, &p), TIDE_ERR_NO_HOLDER);
    cr_expect(strstr(tide_last_error(), "elements [8, 16) (dp rank 1's ZeRO-1 range) of the whole "
                                        "tensor of layer.0.fc1.weight.exp_avg") != NULL,
              "%s", tide_last_error());
    tide_layout_destroy(&o);
    tide_layout_destroy(&n);
    tide_collection_destroy(&c);
}

Test(reshard_hand, identity_resize_copies_everything_locally)
{
    tide_model_spec s = {.layers = 4,
                         .hidden = 8,
                         .heads = 2,
                         .vocab = 16,
                         .attention = 1,
                         .adam = 1,
                         .zero1 = 1,
                         .dtype = TIDE_BF16};
    tide_collection_t *c = NULL;
    cr_assert_eq(tide_collection_build_gpt(&c, &s), TIDE_OK);
    tide_layout_t *o = layout(2, 2, 2, 4);
    tide_plan_t *p = checked_plan(o, o, c, NULL, 0);
    cr_expect_eq(p->summary.bytes_sent, 0);
    cr_expect_eq(p->summary.messages, 0);
    cr_expect_eq(p->summary.n_xfers, 0);
    /* One contiguous copy per held (worker, tensor). */
    size_t held = 0;
    for (size_t j = 0; j < tide_layout_size(o); j++)
        for (size_t i = 0; i < tide_collection_size(c); i++) {
            int pp, d, t;
            coord(o, j, &pp, &d, &t);
            held += tide_shard_bytes(o, c, i, pp, d, t) > 0;
        }
    cr_expect_eq(p->n, held);
    tide_plan_destroy(&p);
    tide_layout_destroy(&o);
    tide_collection_destroy(&c);
}

Test(reshard_hand, gpt_dp_shrink_with_default_map_and_zero1)
{
    /* The bench's shape, small: (4,2,2) -> (3,2,2) under the default rank order. */
    for (int zero = 0; zero < 2; zero++) {
        tide_model_spec s = {.layers = 4,
                             .hidden = 12,
                             .heads = 2,
                             .vocab = 8,
                             .attention = 1,
                             .adam = 1,
                             .zero1 = zero,
                             .dtype = TIDE_F32};
        tide_collection_t *c = NULL;
        cr_assert_eq(tide_collection_build_gpt(&c, &s), TIDE_OK);
        tide_layout_t *o = layout(4, 2, 2, 4), *n = layout(3, 2, 2, 4);
        tide_plan_t *p = checked_plan(o, n, c, NULL, 0);
        cr_expect(p->summary.bytes_sent > 0);
        cr_expect_leq(p->summary.max_send, p->summary.balanced_bound * 105 / 100 + 1);
        tide_plan_destroy(&p);
        tide_layout_destroy(&o);
        tide_layout_destroy(&n);
        tide_collection_destroy(&c);
    }
}

Test(reshard_validate, catches_broken_plans)
{
    tide_tensor_desc t[] = {mk("w", TIDE_F32, 2, 8, 4, 0, TIDE_TP_SPLIT, 0, 1, TIDE_DP_REPLICATED)};
    tide_collection_t *c = coll(1, t, 1);
    tide_layout_t *o = layout(2, 2, 1, 1), *n = layout(1, 2, 1, 1);
    n->worker[1] = 2;
    tide_plan_t *p = checked_plan(o, n, c, NULL, 0);
    tide_xfer saved;
    /* Each corruption must be caught. */
    for (int k = 0; k < 6; k++) {
        size_t at = p->n - 1;
        saved = p->items[at];
        tide_xfer *x = &p->items[at];
        if (k == 0)
            x->src_off += 4; /* reads the wrong bytes */
        else if (k == 1)
            x->run -= 4; /* leaves a hole */
        else if (k == 2)
            x->dst = 3; /* not in the new layout */
        else if (k == 3)
            x->dst_off += 1 << 20; /* out of range */
        else if (k == 4)
            x->tensor = 9;
        else
            x->src = 7; /* not an old worker */
        cr_expect_eq(tide_plan_validate(o, n, c, NULL, 0, p), TIDE_ERR_INVALID, "corruption %d", k);
        p->items[at] = saved;
    }
    /* A dead source is refused. */
    uint8_t alive[8] = {1, 1, 1, 1, 1, 1, 1, 1};
    cr_assert(p->items[p->n - 1].src != p->items[p->n - 1].dst);
    alive[p->items[p->n - 1].src] = 0;
    cr_expect_eq(tide_plan_validate(o, n, c, alive, 8, p), TIDE_ERR_INVALID);
    cr_expect(strstr(tide_last_error(), "dead") != NULL, "%s", tide_last_error());
    /* A duplicated item writes bytes twice (and breaks the order). */
    tide_xfer *items = realloc(p->items, (p->n + 1) * sizeof *items);
    p->items = items;
    p->items[p->n] = p->items[p->n - 1];
    p->n++;
    cr_expect_eq(tide_plan_validate(o, n, c, NULL, 0, p), TIDE_ERR_INVALID);
    p->n--;
    cr_expect_eq(tide_plan_validate(o, n, c, NULL, 0, p), TIDE_OK, "%s", tide_last_error());
    tide_plan_destroy(&p);
    tide_layout_destroy(&o);
    tide_layout_destroy(&n);
    tide_collection_destroy(&c);
}
