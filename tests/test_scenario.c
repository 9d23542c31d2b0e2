/*
 * Unit tests of the MPI tests' scenario tables (tests/support/scenario.c): layouts and
 * kills as the tables write them, every malformed one refused naming its text, a row's
 * resizes, picking a row by name, and the listing CMake's table check compares.
 */
#include <criterion/criterion.h>
#include <criterion/redirect.h>
#include <stdio.h>
#include <string.h>

#include "core/error.h"
#include "tests/support/scenario.h"

Test(scenario, layouts_parse_with_stages_and_micro_batches)
{
    mt_layout l;
    char buf[96];
    cr_assert_eq(mt_layout_parse("2x1x2", &l), TIDE_OK);
    cr_expect(l.dp == 2 && l.tp == 1 && l.pp == 2 && l.micro == 0 && l.stages[0] == '\0');
    cr_expect_str_eq(mt_layout_str(&l, buf, sizeof buf), "2x1x2");
    cr_assert_eq(mt_layout_parse("1x2x2:0-2,3-3/8", &l), TIDE_OK);
    cr_expect(l.dp == 1 && l.tp == 2 && l.pp == 2 && l.micro == 8);
    cr_expect_str_eq(l.stages, "0-2,3-3");
    cr_expect_str_eq(mt_layout_str(&l, buf, sizeof buf), "1x2x2:0-2,3-3/8");
    cr_assert_eq(mt_layout_parse("2x2x2/4", &l), TIDE_OK);
    cr_expect(l.micro == 4 && l.stages[0] == '\0');
}

Test(scenario, malformed_layouts_are_refused_naming_the_text)
{
    const char *bad[] = {"",       "2x2",   "0x1x1",    "2x-1x1", "2xx1", "2x1x1:", "2x1x1/",
                         "2x1x1/0", "2x1x1 ", "2x1x1junk", "x1x1",  "2x1x1:0-1/2/3"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        mt_layout l;
        cr_expect_eq(mt_layout_parse(bad[i], &l), TIDE_ERR_INVALID, "'%s' accepted", bad[i]);
        char want[64];
        snprintf(want, sizeof want, "layout '%s'", bad[i]);
        cr_expect(strstr(tide_last_error(), want) != NULL, "'%s': %s", bad[i],
                  tide_last_error());
    }
}

Test(scenario, kills_name_when_step_and_target)
{
    mt_kill k;
    cr_assert_eq(mt_kill_parse("", &k), TIDE_OK);
    cr_expect(k.when[0] == '\0' && k.step == -1 && k.rank == -1);
    cr_assert_eq(mt_kill_parse("after 4 at p1d1t0", &k), TIDE_OK);
    cr_expect_str_eq(k.when, "after");
    cr_expect(k.step == 4 && k.rank == -1 && k.p == 1 && k.d == 1 && k.t == 0);
    cr_assert_eq(mt_kill_parse("now at r3", &k), TIDE_OK);
    cr_expect_str_eq(k.when, "now");
    cr_expect(k.step == -1 && k.rank == 3);
    cr_assert_eq(mt_kill_parse("split at r2", &k), TIDE_OK);
    cr_expect(k.rank == 2);
}

Test(scenario, malformed_kills_are_refused_naming_the_text)
{
    const char *bad[] = {"after",           "after 4",         "after 4 p1d1t0", "after 4 at",
                         "after 4 at p1d1", "after 4 at r",    "after 4 at r2x", "4 at r1",
                         "After 4 at r1",   "after 4at p0d0t0", "after at p-1d0t0",
                         "averyveryverylongword 1 at r0", "after 4 at p1d1t0x"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        mt_kill k;
        cr_expect_eq(mt_kill_parse(bad[i], &k), TIDE_ERR_INVALID, "'%s' accepted", bad[i]);
        char want[64];
        snprintf(want, sizeof want, "kill '%s'", bad[i]);
        cr_expect(strstr(tide_last_error(), want) != NULL, "'%s': %s", bad[i],
                  tide_last_error());
    }
}

Test(scenario, a_row_parses_its_resizes_in_order)
{
    mt_row row = {"r", 8, 90, "", "recovery", "2x2x2", "1x4x2  4x1x1 1x2x2:0-2,3-3",
                  "after 4 at p0d3t0", 0, 4, TIDE_OK};
    mt_scenario sc;
    cr_assert_eq(mt_scenario_parse(&row, &sc), TIDE_OK, "%s", tide_last_error());
    cr_expect(sc.row == &row && sc.has_first && sc.first.dp == 2);
    cr_assert_eq(sc.n_resizes, 3);
    cr_expect(sc.resize[0].tp == 4 && sc.resize[1].dp == 4 && sc.resize[2].pp == 2);
    cr_expect_str_eq(sc.resize[2].stages, "0-2,3-3");
    cr_expect(sc.kill.d == 3);

    row.first = "";
    row.resizes = "";
    row.kill = "";
    cr_assert_eq(mt_scenario_parse(&row, &sc), TIDE_OK);
    cr_expect(!sc.has_first && sc.n_resizes == 0 && sc.kill.when[0] == '\0');

    row.resizes = "1x1x1 2x2";
    cr_expect_eq(mt_scenario_parse(&row, &sc), TIDE_ERR_INVALID);
    row.resizes = "1x1x1 1x1x1 1x1x1 1x1x1 1x1x1 1x1x1 1x1x1 1x1x1 1x1x1"; /* 9 > MT_MAX */
    cr_expect_eq(mt_scenario_parse(&row, &sc), TIDE_ERR_INVALID);
    cr_expect(strstr(tide_last_error(), "too long") != NULL, "%s", tide_last_error());
}

/* A driver's row: the generic columns, then its own. */
typedef struct drow {
    mt_row row;
    int mine;
} drow;

static const drow table[] = {
    {{"a", 2, 60, "", "", "1x1x1", "", "", 0, 1, TIDE_OK}, 7},
    {{"b", 4, 120, "slow", "recovery", "2x1x1", "", "now at r1", 0, 1, TIDE_OK}, 9},
};

Test(scenario, rows_are_picked_by_name_and_listed_for_cmake, .init = cr_redirect_stdout)
{
    const mt_row *r = NULL;
    char *pick[] = {"drv", "tided", "b", NULL};
    cr_assert_eq(MT_ROWS_SELECT(3, pick, 2, table, &r), 0);
    cr_assert(r == &table[1].row);
    cr_expect_eq(((const drow *)(const void *)r)->mine, 9);

    char *missing[] = {"drv", "tided", "c", NULL};
    cr_expect_eq(MT_ROWS_SELECT(3, missing, 2, table, &r), 0);
    cr_expect(r == NULL);
    cr_expect_eq(MT_ROWS_SELECT(2, missing, 2, table, &r), 0); /* no name given */
    cr_expect(r == NULL);

    char *list[] = {"drv", "--list", NULL};
    cr_expect_eq(MT_ROWS_SELECT(2, list, 2, table, &r), 1);
    fflush(stdout);
    cr_expect_stdout_eq_str("a 2 60 - -\nb 4 120 slow recovery\n");
}

static const drow single[] = {{{"", 4, 60, "", "", "", "", "", 0, 0, TIDE_OK}, 1}};

Test(scenario, a_table_of_one_unnamed_row_needs_no_name)
{
    const mt_row *r = NULL;
    char *argv[] = {"drv", NULL};
    cr_expect_eq(MT_ROWS_SELECT(1, argv, 1, single, &r), 0);
    cr_expect(r == &single[0].row);
}
