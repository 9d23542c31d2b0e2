/*
 * Part of test_reshard (unit tests for reshard/): layouts (defaults, validation messages,
 * fit rules), collections (field checks, lookup by name, the GPT builder) and shard
 * geometry (shards tile the tensor and round-trip).
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

/* ---- layouts ---------------------------------------------------------------------------- */

Test(reshard_layout, defaults_even_stages_and_rank_order)
{
    tide_layout_t *l = layout(2, 4, 3, 8);
    cr_expect_eq(tide_layout_size(l), 24);
    cr_expect_arr_eq(l->stage_start, ((int[]){0, 3, 6, 8}), 4 * sizeof(int));
    for (size_t i = 0; i < 24; i++)
        cr_expect_eq(l->worker[i], (int32_t)i);
    cr_expect_eq(tide_layout_index(l, 1, 1, 2), 14);
    int p, d, t;
    cr_assert_eq(tide_layout_find(l, 14, &p, &d, &t), TIDE_OK);
    cr_expect(p == 1 && d == 1 && t == 2);
    cr_expect_eq(tide_layout_find(l, 99, &p, &d, &t), TIDE_ERR_NOT_FOUND);
    cr_expect_eq(tide_layout_stage_of(l, 5), 1);
    cr_expect_eq(tide_layout_stage_of(l, 6), 2);
    cr_expect_eq(tide_layout_stage_of(l, TIDE_LAYER_PRE), 0);
    cr_expect_eq(tide_layout_stage_of(l, TIDE_LAYER_POST), 2);
    cr_expect_eq(tide_layout_stage_of(l, TIDE_LAYER_ALL), -1);
    cr_expect_eq(tide_layout_stage_of(l, 8), -1);
    char buf[64];
    cr_expect_str_eq(tide_layout_format(l, buf, sizeof buf),
                     "(dp 2, tp 4, pp 3; stages 0-2,3-5,6-7)");
    tide_layout_t *cp = NULL;
    cr_assert_eq(tide_layout_copy(&cp, l), TIDE_OK);
    cr_expect_arr_eq(cp->worker, l->worker, 24 * sizeof(int32_t));
    cr_expect_eq(tide_layout_validate(cp, NULL), TIDE_OK);
    tide_layout_destroy(&cp);
    tide_layout_destroy(&l);
    cr_expect_null(l);
    tide_layout_destroy(&l); /* NULL is fine */
}

Test(reshard_layout, validation_messages_name_the_problem)
{
    tide_tensor_desc t[] = {mk("layer.4.fc1.weight", TIDE_F32, 2, 4096, 1024, 4, TIDE_TP_SPLIT, 0,
                               1, TIDE_DP_REPLICATED)};
    tide_collection_t *c = coll(6, t, 1);
    tide_layout_t *l = layout(1, 3, 1, 6);
    cr_expect_eq(tide_layout_validate(l, c), TIDE_ERR_INVALID);
    cr_expect_str_eq(tide_last_error(),
                     "tp=3 does not divide dimension 0 of layer.4.fc1.weight (size 4096)");
    tide_layout_destroy(&l);

    l = layout(4, 2, 1, 6);
    l->worker[7] = 7;
    l->worker[0] = 7;
    cr_expect_eq(tide_layout_validate(l, NULL), TIDE_ERR_INVALID);
    cr_expect_str_eq(tide_last_error(), "worker 7 appears twice: at (pp 0, dp 0, tp 0) and (pp 0, "
                                        "dp 3, tp 1)");
    l->worker[0] = -2;
    cr_expect_eq(tide_layout_validate(l, NULL), TIDE_ERR_INVALID);
    cr_expect(strstr(tide_last_error(), "negative") != NULL);
    tide_layout_destroy(&l);

    l = layout(1, 1, 3, 6);
    cr_expect_eq(tide_layout_set_stages(l, (int[]){0, 2, 6, 6}), TIDE_ERR_INVALID);
    cr_expect_str_eq(tide_last_error(), "stage 2 has no layers");
    l->stage_start[2] = 6; /* written directly: the validator catches it too */
    cr_expect_eq(tide_layout_validate(l, NULL), TIDE_ERR_INVALID);
    cr_expect_str_eq(tide_last_error(), "stage 2 has no layers");
    l->stage_start[2] = 4;
    cr_expect_eq(tide_layout_validate(l, c), TIDE_OK);
    cr_expect_eq(tide_layout_parse_stages(l, "0-1,3-4,5-5"), TIDE_ERR_INVALID);
    cr_expect(strstr(tide_last_error(), "stage 1 starts at layer 3, expected 2") != NULL, "%s",
              tide_last_error());
    cr_expect_eq(tide_layout_parse_stages(l, "0-5"), TIDE_ERR_INVALID);
    cr_expect(strstr(tide_last_error(), "1 ranges for pp=3") != NULL, "%s", tide_last_error());
    cr_expect_eq(tide_layout_parse_stages(l, "0-1,2-3,4-6"), TIDE_ERR_INVALID);
    cr_expect_eq(tide_layout_parse_stages(l, "0-1,2-3,4-x"), TIDE_ERR_INVALID);
    cr_expect_eq(tide_layout_parse_stages(l, "0-1,2-2,3-5"), TIDE_OK);
    cr_expect_arr_eq(l->stage_start, ((int[]){0, 2, 3, 6}), 4 * sizeof(int));
    tide_layout_destroy(&l);

    l = layout(1, 1, 1, 5);
    cr_expect_eq(tide_layout_validate(l, c), TIDE_ERR_INVALID);
    cr_expect_str_eq(tide_last_error(), "the layout has 5 layers but the collection has 6");
    tide_layout_destroy(&l);

    cr_expect_eq(tide_layout_new(&l, 1, 1, 4, 3, 1), TIDE_ERR_INVALID);
    cr_expect_null(l);
    cr_expect(strstr(tide_last_error(), "pp=4 needs at least 4 layers") != NULL);
    cr_expect_eq(tide_layout_new(&l, 0, 1, 1, 3, 1), TIDE_ERR_INVALID);
    cr_expect_eq(tide_layout_new(&l, 1, 1, 1, 3, 0), TIDE_ERR_INVALID);
    tide_collection_destroy(&c);
}

/* Fit rules: each degree divides its numbers; the first broken rule is named with what it
   counts; malformed rules are refused, not treated as "any layout". */
Test(reshard_layout, fit_rules_name_the_number_a_degree_does_not_divide)
{
    const tide_fit_rule r[] = {
        {TIDE_DEGREE_DP, 4, "the global batch 16 / 4 micro-batches"},
        {TIDE_DEGREE_TP, 64, "the hidden size"},
        {TIDE_DEGREE_TP, 24, ""},
        {TIDE_DEGREE_PP, 6, "the layers, evenly"},
    };
    cr_expect_eq(tide_fit_check(r, 4, 4, 8, 3, 1), TIDE_OK, "%s", tide_last_error());
    cr_expect_eq(tide_fit_check(r, 4, 1, 1, 1, 1), TIDE_OK);
    cr_expect_eq(tide_fit_check(NULL, 0, 3, 5, 7, 1), TIDE_OK, "no rules: any degrees");
    cr_expect_eq(tide_fit_check(r, 4, 3, 1, 1, 1), TIDE_ERR_INVALID);
    cr_expect_str_eq(tide_last_error(),
                     "dp 3 does not divide 4 (the global batch 16 / 4 micro-batches)");
    cr_expect_eq(tide_fit_check(r, 4, 2, 16, 1, 1), TIDE_ERR_INVALID);
    cr_expect_str_eq(tide_last_error(), "tp 16 does not divide 24");
    cr_expect_eq(tide_fit_check(r, 4, 2, 2, 4, 1), TIDE_ERR_INVALID);
    cr_expect_str_eq(tide_last_error(), "pp 4 does not divide 6 (the layers, evenly)");
    cr_expect_eq(tide_fit_check(r, 4, 0, 1, 1, 1), TIDE_ERR_INVALID);

    tide_fit_rule bad = {TIDE_DEGREE_DP, 0, ""};
    cr_expect_eq(tide_fit_check(&bad, 1, 1, 1, 1, 1), TIDE_ERR_INVALID, "n 0 is malformed");
    cr_expect(strstr(tide_last_error(), "below 1") != NULL, "%s", tide_last_error());
    bad = (tide_fit_rule){(tide_degree)4, 4, ""};
    cr_expect_eq(tide_fit_check(&bad, 1, 1, 1, 1, 1), TIDE_ERR_INVALID);
    cr_expect(strstr(tide_last_error(), "not dp, tp, pp or dp_micro") != NULL, "%s",
              tide_last_error());
    cr_expect_eq(tide_fit_check(r, 4, 1, 1, 1, 0), TIDE_ERR_INVALID, "0 micro-batches");
    bad = (tide_fit_rule){TIDE_DEGREE_TP, 4, "two\nlines"};
    cr_expect_eq(tide_fit_check(&bad, 1, 1, 1, 1, 1), TIDE_ERR_INVALID);
    cr_expect(strstr(tide_last_error(), "printable") != NULL, "%s", tide_last_error());
    memset(bad.what, 'x', sizeof bad.what);
    cr_expect_eq(tide_fit_check(&bad, 1, 1, 1, 1, 1), TIDE_ERR_INVALID);
    cr_expect(strstr(tide_last_error(), "not terminated") != NULL, "%s", tide_last_error());
    cr_expect_eq(tide_fit_check(NULL, 2, 1, 1, 1, 1), TIDE_ERR_INVALID);
    cr_expect_eq(tide_fit_check(r, TIDE_FIT_RULES_MAX + 1, 1, 1, 1, 1), TIDE_ERR_INVALID);

    char buf[256];
    cr_expect_str_eq(tide_fit_format(r, 2, buf, sizeof buf),
                     "dp divides 4 (the global batch 16 / 4 micro-batches); tp divides 64 (the "
                     "hidden size)");
    cr_expect_str_eq(tide_fit_format(NULL, 0, buf, sizeof buf), "any layout");
    cr_expect_str_eq(tide_degree_name(TIDE_DEGREE_PP), "pp");
    cr_expect_str_eq(tide_degree_name(TIDE_DEGREE_DP_MICRO), "dp_micro");
}

/* dp_micro: dp times the micro-batch count divides the global batch, whichever count a
   resize gives the job; the refusal says the product. */
Test(reshard_layout, fit_rule_over_dp_and_micro_batches)
{
    const tide_fit_rule r[] = {{TIDE_DEGREE_DP_MICRO, 16, "the global batch"}};
    cr_expect_eq(tide_fit_check(r, 1, 4, 1, 1, 4), TIDE_OK, "%s", tide_last_error());
    cr_expect_eq(tide_fit_check(r, 1, 2, 1, 1, 8), TIDE_OK);
    cr_expect_eq(tide_fit_check(r, 1, 8, 1, 1, 2), TIDE_OK);
    cr_expect_eq(tide_fit_check(r, 1, 4, 1, 1, 8), TIDE_ERR_INVALID, "32 samples of 16");
    cr_expect_str_eq(tide_last_error(),
                     "dp 4 x 8 micro-batches = 32 does not divide 16 (the global batch)");
    cr_expect_eq(tide_fit_check(r, 1, 3, 1, 1, 4), TIDE_ERR_INVALID);
    cr_expect_str_eq(tide_last_error(),
                     "dp 3 x 4 micro-batches = 12 does not divide 16 (the global batch)");
    char buf[128];
    cr_expect_str_eq(tide_fit_format(r, 1, buf, sizeof buf),
                     "dp x micro-batches divides 16 (the global batch)");
}

/* ---- collections and geometry -------------------------------------------------------------- */

Test(reshard_collection, add_checks_every_field)
{
    tide_collection_t *c = NULL;
    cr_assert_eq(tide_collection_new(&c, 2), TIDE_OK);
    tide_tensor_desc ok = mk("a", TIDE_F16, 2, 6, 4, 1, TIDE_TP_SPLIT, 0, 3, TIDE_DP_SHARDED);
    cr_expect_eq(tide_collection_add(c, &ok), TIDE_OK);
    cr_expect_eq(tide_collection_add(c, &ok), TIDE_ERR_EXISTS);
    tide_tensor_desc bad = ok;
    snprintf(bad.name, sizeof bad.name, "b");
    bad.layer = 2;
    cr_expect_eq(tide_collection_add(c, &bad), TIDE_ERR_INVALID);
    cr_expect(strstr(tide_last_error(), "layer 2 is outside") != NULL, "%s", tide_last_error());
    bad = ok;
    snprintf(bad.name, sizeof bad.name, "b");
    bad.tp_segments = 4;
    cr_expect_eq(tide_collection_add(c, &bad), TIDE_ERR_INVALID);
    cr_expect_str_eq(tide_last_error(), "b: 4 segments do not divide dimension 0 (size 6)");
    bad.tp_segments = 1;
    bad.tp_dim = 2;
    cr_expect_eq(tide_collection_add(c, &bad), TIDE_ERR_INVALID);
    bad.tp_dim = 0;
    bad.shape[1] = 0;
    cr_expect_eq(tide_collection_add(c, &bad), TIDE_ERR_INVALID);
    bad.shape[1] = 4;
    bad.dtype = (tide_dtype)42;
    cr_expect_eq(tide_collection_add(c, &bad), TIDE_ERR_INVALID);
    bad.dtype = TIDE_F32;
    bad.ndim = 5;
    cr_expect_eq(tide_collection_add(c, &bad), TIDE_ERR_INVALID);
    bad.ndim = 2;
    bad.name[0] = '\0';
    cr_expect_eq(tide_collection_add(c, &bad), TIDE_ERR_INVALID);
    cr_expect_eq(tide_collection_size(c), 1);
    size_t idx = 9;
    cr_expect_eq(tide_collection_find(c, "a", &idx), TIDE_OK);
    cr_expect_eq(idx, 0);
    cr_expect_eq(tide_collection_find(c, "zz", &idx), TIDE_ERR_NOT_FOUND);
    cr_expect_eq(tide_tensor_bytes(tide_collection_tensor(c, 0)), 48);
    cr_expect_eq(tide_collection_bytes(c), 48);
    cr_expect_eq(tide_collection_num_layers(c), 2);
    cr_expect_eq(tide_dtype_size(TIDE_BF16), 2);
    cr_expect_str_eq(tide_dtype_name(TIDE_I64), "i64");
    cr_expect_str_eq(tide_dtype_name((tide_dtype)99), "?");
    tide_collection_destroy(&c);
    cr_expect_null(c);
}

Test(reshard_collection, many_tensors_are_found_by_name)
{
    tide_collection_t *c = NULL;
    cr_assert_eq(tide_collection_new(&c, 1), TIDE_OK);
    for (int k = 0; k < 5000; k++) {
        char name[32];
        snprintf(name, sizeof name, "t.%d", k);
        tide_tensor_desc t =
            mk(name, TIDE_U8, 1, 3, 0, 0, TIDE_TP_REPLICATED, 0, 1, TIDE_DP_REPLICATED);
        cr_assert_eq(tide_collection_add(c, &t), TIDE_OK);
    }
    for (int k = 0; k < 5000; k += 7) {
        char name[32];
        size_t idx;
        snprintf(name, sizeof name, "t.%d", k);
        cr_assert_eq(tide_collection_find(c, name, &idx), TIDE_OK);
        cr_assert_eq(idx, (size_t)k);
    }
    tide_collection_destroy(&c);
}

Test(reshard_collection, gpt_builder_names_rules_and_size)
{
    tide_model_spec s = {.layers = 2,
                         .hidden = 16,
                         .ffn = 0,
                         .heads = 4,
                         .vocab = 32,
                         .attention = 1,
                         .adam = 1,
                         .zero1 = 1,
                         .dtype = TIDE_F32};
    tide_collection_t *c = NULL;
    cr_assert_eq(tide_collection_build_gpt(&c, &s), TIDE_OK, "%s", tide_last_error());
    /* 12 parameters per block, embed, final_ln x2, head; x3 with Adam; plus step. */
    cr_expect_eq(tide_collection_size(c), (2 * 12 + 4) * 3 + 1);
    uint64_t h = 16, params = 2 * 32 * h + 2 * (12 * h * h + 13 * h) + 2 * h;
    cr_expect_eq(tide_collection_bytes(c), params * 3 * 4 + 8);
    size_t i;
    cr_assert_eq(tide_collection_find(c, "layer.1.qkv.weight", &i), TIDE_OK);
    const tide_tensor_desc *t = tide_collection_tensor(c, i);
    cr_expect(t->tp == TIDE_TP_SPLIT && t->tp_dim == 0 && t->tp_segments == 3 &&
              t->shape[0] == 48 && t->shape[1] == 16 && t->layer == 1 &&
              t->dp == TIDE_DP_REPLICATED);
    const tide_tensor_desc *m = tide_collection_tensor(c, i + 1);
    cr_expect_str_eq(m->name, "layer.1.qkv.weight.exp_avg");
    cr_expect_eq(m->dp, TIDE_DP_SHARDED);
    cr_expect_str_eq(tide_collection_tensor(c, i + 2)->name, "layer.1.qkv.weight.exp_avg_sq");
    cr_assert_eq(tide_collection_find(c, "layer.0.fc2.weight", &i), TIDE_OK);
    t = tide_collection_tensor(c, i);
    cr_expect(t->tp_dim == 1 && t->shape[0] == 16 && t->shape[1] == 64);
    cr_assert_eq(tide_collection_find(c, "embed.weight", &i), TIDE_OK);
    cr_expect_eq(tide_collection_tensor(c, i)->layer, TIDE_LAYER_PRE);
    cr_assert_eq(tide_collection_find(c, "head.weight", &i), TIDE_OK);
    cr_expect_eq(tide_collection_tensor(c, i)->layer, TIDE_LAYER_POST);
    cr_assert_eq(tide_collection_find(c, "step", &i), TIDE_OK);
    cr_expect(tide_collection_tensor(c, i)->layer == TIDE_LAYER_ALL &&
              tide_collection_tensor(c, i)->dtype == TIDE_I64);
    tide_collection_destroy(&c);
    s.attention = 0;
    s.vocab = 0;
    s.adam = 0;
    cr_assert_eq(tide_collection_build_gpt(&c, &s), TIDE_OK);
    cr_expect_eq(tide_collection_size(c), 2 * 6 + 2 + 1);
    cr_expect_eq(tide_collection_find(c, "embed.weight", &i), TIDE_ERR_NOT_FOUND);
    tide_collection_destroy(&c);
    s.heads = 3;
    s.attention = 1;
    cr_expect_eq(tide_collection_build_gpt(&c, &s), TIDE_ERR_INVALID);
    cr_expect_null(c);
}

Test(reshard_geometry, shards_tile_the_tensor_and_round_trip)
{
    tide_tensor_desc t[] = {
        mk("qkv", TIDE_F32, 2, 12, 2, 0, TIDE_TP_SPLIT, 0, 3, TIDE_DP_SHARDED),
        mk("row", TIDE_BF16, 2, 3, 8, 0, TIDE_TP_SPLIT, 1, 1, TIDE_DP_REPLICATED),
    };
    tide_collection_t *c = coll(1, t, 2);
    tide_layout_t *l = layout(3, 2, 1, 1);
    float g[24], back[24];
    for (int e = 0; e < 24; e++)
        g[e] = (float)e;
    memset(back, 0, sizeof back);
    uint64_t total = 0;
    for (int d = 0; d < 3; d++)
        for (int tt = 0; tt < 2; tt++) {
            uint64_t b = tide_shard_bytes(l, c, 0, 0, d, tt);
            total += b;
            float buf[24];
            tide_shard_extract(l, c, 0, 0, d, tt, g, buf);
            tide_shard_insert(l, c, 0, 0, d, tt, buf, back);
        }
    cr_expect_eq(total, sizeof g);
    cr_expect_arr_eq(back, g, sizeof g);
    /* tp rank 1's shard is rows 2-3, 6-7, 10-11; dp rank 0 holds its first 4 of 12 elements. */
    float buf[24];
    tide_shard_extract(l, c, 0, 0, 0, 1, g, buf);
    cr_expect_arr_eq(buf, ((float[]){4, 5, 6, 7}), 4 * sizeof(float));
    cr_expect_eq(tide_shard_bytes(l, c, 1, 0, 2, 1), 3 * 4 * 2);
    cr_expect_eq(tide_shard_bytes(l, c, 1, 1, 0, 0), 0); /* no such stage */
    tide_layout_destroy(&l);
    tide_collection_destroy(&c);
}
