/*
 * Unit tests for proto/proto_legacy.h: the texts tided's state schema 1 held (written by
 * the tided of tests/data/state-v1.db) read into records field for field, and every
 * malformed text refused with TIDE_ERR_PROTOCOL, nothing half-read. The texts are the
 * exact strings the old writers produced.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "core/error.h"
#include "proto/proto_legacy.h"

/* Expects a refusal whose detail holds want, and an empty record. */
static void expect_malformed(tide_status rc, const tide_msg_t *m, const char *want)
{
    cr_assert_eq(rc, TIDE_ERR_PROTOCOL, "accepted (want a refusal holding '%s')", want);
    cr_assert_eq(m->type, TIDE_MSG_NONE, "a refused text left a record");
    cr_expect(strstr(tide_last_error(), want) != NULL, "'%s' lacks '%s'", tide_last_error(), want);
}

Test(proto_legacy, layouts)
{
    tide_msg_t m;
    cr_assert_eq(tide_proto_legacy_layout("2 2 3 10 4|0 2 8 10|40 1 2 3 4 5 6 7 8 9 10 11", 7, &m),
                 TIDE_OK, "%s", tide_last_error());
    const tide_proto_layout_t *l = &m.u.job_layout.layout;
    cr_assert_eq(m.type, TIDE_MSG_JOB_LAYOUT);
    cr_expect(l->gen == 7 && l->dp == 2 && l->tp == 2 && l->pp == 3 && l->num_layers == 10 &&
              l->micro_batches == 4);
    cr_expect(l->stage_start[1] == 2 && l->stage_start[3] == 10);
    cr_expect(l->worker[0] == 40 && l->worker[11] == 11);
    tide_msg_clear(&m);
    static const char *const bad[] = {
        "2 2 1 4 1|0 4|0 1 2",             /* a worker short */
        "2 2 1 4 1|0 4|0 1 2 3 4",         /* a worker too many */
        "1 1 1 4 1|0 4|0 junk",            /* not a number */
        "1 1 1 4 1 0 4|0",                 /* no separator */
        "0 1 1 4 1|0 4|0",                 /* a degree below 1 */
        "1 1 2 4 1|0 4 4|0 1",             /* a stage without layers */
        "1 1 1 4 1|1 4|0",                 /* stages not from layer 0 */
        "1 1 5 4 1|0 1 2 3 4 4|0 1 2 3 4", /* more stages than layers */
        "",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        tide_status rc = tide_proto_legacy_layout(bad[i], 1, &m);
        expect_malformed(rc, &m, "stored layout");
    }
}

Test(proto_legacy, pools)
{
    tide_msg_t m;
    cr_assert_eq(tide_proto_legacy_pools("pool-a 2 1;pool-b 2 2 7;pool-c 4 0", 0, &m), TIDE_OK,
                 "%s", tide_last_error());
    const tide_proto_job_pools_t *x = &m.u.job_pools;
    cr_assert_eq(x->n_pools, 3);
    cr_expect_str_eq(x->pools[1].name, "pool-b");
    cr_expect(x->pools[0].connected && x->pools[0].size == 2 && x->pools[0].left == 0);
    cr_expect(!x->pools[1].connected && x->pools[1].left == 7);
    cr_expect(!x->pools[2].connected && x->pools[2].size == 4 && x->pools[2].left == 0);
    tide_msg_clear(&m);
    /* a bare name (before jobs spanned pools): one connected pool of size0, or 1 */
    cr_assert_eq(tide_proto_legacy_pools("pool-a", 8, &m), TIDE_OK);
    cr_expect(m.u.job_pools.n_pools == 1 && m.u.job_pools.pools[0].size == 8 &&
              m.u.job_pools.pools[0].connected);
    tide_msg_clear(&m);
    cr_assert_eq(tide_proto_legacy_pools("pool-a", 0, &m), TIDE_OK);
    cr_expect(m.u.job_pools.pools[0].size == 1);
    tide_msg_clear(&m);
    cr_assert_eq(tide_proto_legacy_pools(NULL, 0, &m), TIDE_OK);
    cr_expect(m.type == TIDE_MSG_JOB_POOLS && m.u.job_pools.n_pools == 0);
    tide_msg_clear(&m);
    static const char *const bad[] = {
        "pool-a 2 1;pool-b 2 2", /* left at no generation */
        "pool-a 2 3",            /* no such state */
        "pool-a 2 1,pool-b 2 1", /* another separator */
        "pool-a x 1",            /* no size */
        "pool-a 0 1",            /* an empty pool */
        "my/pool 2 1",           /* not a pool name */
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        tide_status rc = tide_proto_legacy_pools(bad[i], 0, &m);
        expect_malformed(rc, &m, "stored pool list");
    }
    char many[1024] = "";
    for (int i = 0; i < 17; i++)
        snprintf(many + strlen(many), sizeof many - strlen(many), "%sp%d 1 1", i ? ";" : "", i);
    expect_malformed(tide_proto_legacy_pools(many, 0, &m), &m, "more than 16 pools");
}

Test(proto_legacy, fit_rules)
{
    tide_msg_t m;
    cr_assert_eq(tide_proto_legacy_fit("dp_micro 16 the global batch\ntp 8 attention heads\npp "
                                       "4611686018427387904\n",
                                       &m),
                 TIDE_OK, "%s", tide_last_error());
    const tide_proto_job_fit_t *x = &m.u.job_fit;
    cr_assert_eq(x->n_fit, 3);
    cr_expect(x->fit[0].degree == 3 && x->fit[0].n == 16);
    cr_expect_str_eq(x->fit[0].what, "the global batch");
    cr_expect(x->fit[1].degree == 1 && x->fit[1].n == 8);
    cr_expect(x->fit[2].degree == 2 && x->fit[2].n == INT64_C(1) << 62 && x->fit[2].what[0] == 0);
    tide_msg_clear(&m);
    cr_assert_eq(tide_proto_legacy_fit("", &m), TIDE_OK);
    cr_expect(m.type == TIDE_MSG_JOB_FIT && m.u.job_fit.n_fit == 0);
    tide_msg_clear(&m);
    static const char *const bad[] = {
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
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        tide_status rc = tide_proto_legacy_fit(bad[i], &m);
        expect_malformed(rc, &m, "fit rule");
    }
}

Test(proto_legacy, checkpoints)
{
    tide_msg_t m;
    cr_assert_eq(tide_proto_legacy_ckpts("60\t/ck/train/step-000000000060\n100\t/ck/with "
                                         "space/step-000000000100\n",
                                         &m),
                 TIDE_OK, "%s", tide_last_error());
    cr_assert_eq(m.u.job_ckpts.n_ckpts, 2);
    cr_expect(m.u.job_ckpts.ckpts[1].step == 100);
    cr_expect_str_eq(m.u.job_ckpts.ckpts[1].dir, "/ck/with space/step-000000000100");
    tide_msg_clear(&m);
    static const char *const bad[] = {
        "20\t/ck/a\n10\t/ck/b\n", "x\t/ck\n", "20 /ck\n", "20\t\n", "20\t/ck", "-5\t/ck\n"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        tide_status rc = tide_proto_legacy_ckpts(bad[i], &m);
        expect_malformed(rc, &m, "stored checkpoints");
    }
    char many[512] = "";
    for (int i = 0; i < 9; i++)
        snprintf(many + strlen(many), sizeof many - strlen(many), "%d\t/ck/%d\n", i, i);
    expect_malformed(tide_proto_legacy_ckpts(many, &m), &m, "more than 8 checkpoints");
}

Test(proto_legacy, command_lines)
{
    tide_msg_t m;
    static const char argv[] = "python3\0eval.py\0--data=a b\0"; /* and the literal's NUL */
    cr_assert_eq(tide_proto_legacy_argv(argv, sizeof argv, &m), TIDE_OK, "%s", tide_last_error());
    cr_assert_eq(m.u.job_argv.argc, 4);
    cr_expect_str_eq(m.u.job_argv.argv[2], "--data=a b");
    cr_expect_str_eq(m.u.job_argv.argv[3], "");
    tide_msg_clear(&m);
    cr_assert_eq(tide_proto_legacy_argv(NULL, 0, &m), TIDE_OK);
    cr_expect(m.type == TIDE_MSG_JOB_ARGV && m.u.job_argv.argc == 0);
    tide_msg_clear(&m);
    expect_malformed(tide_proto_legacy_argv("sh\0-c", 5, &m), &m, "not terminated");
}
