/*
 * Part of test_reshard (unit tests for reshard/): every allocation failure (injected with
 * tide_alloc_fail_at) in the collection builder, planning, the lower bound, layout copy and
 * validation, and the plan validator returns TIDE_ERR_NOMEM without leaks.
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

/* ---- allocation failures ------------------------------------------------------------------- */

Test(reshard_alloc, every_allocation_failure_is_nomem_without_leaks)
{
    tide_model_spec s = {.layers = 3,
                         .hidden = 8,
                         .heads = 2,
                         .vocab = 8,
                         .attention = 1,
                         .adam = 1,
                         .zero1 = 0, /* DP-replicated: a dead old worker leaves a live replica */
                         .dtype = TIDE_F32};
    tide_collection_t *c = NULL;
    /* Collection builder. */
    int failed = 0;
    for (long n = 1;; n++) {
        tide_alloc_fail_at(n, 0);
        tide_status rc = tide_collection_build_gpt(&c, &s);
        tide_alloc_fail_at(0, 0);
        if (rc == TIDE_OK)
            break;
        cr_assert_eq(rc, TIDE_ERR_NOMEM, "allocation %ld: %s", n, tide_status_name(rc));
        cr_assert_null(c);
        failed++;
    }
    cr_expect(failed > 3);
    tide_layout_t *o = layout(3, 2, 3, 3), *n = layout(2, 2, 2, 3);
    n->worker[0] = 40; /* a fresh worker */
    uint8_t alive[41];
    memset(alive, 1, sizeof alive);
    alive[0] = 0;
    /* Plan, plan_for, lower bound, validation and layout calls. */
    for (int what = 0; what < 5; what++) {
        failed = 0;
        for (long k = 1;; k++) {
            tide_plan_t *p = NULL;
            tide_layout_t *l = NULL;
            uint64_t lb;
            tide_alloc_fail_at(k, what == 4);
            tide_status rc;
            if (what == 0)
                rc = tide_reshard_plan(o, n, c, alive, sizeof alive, &p);
            else if (what == 1)
                rc = tide_reshard_plan_for(o, n, c, alive, sizeof alive, 40, &p);
            else if (what == 2)
                rc = tide_reshard_lower_bound(o, n, c, &lb);
            else if (what == 3)
                rc = tide_layout_copy(&l, o);
            else
                rc = tide_layout_validate(o, c);
            tide_alloc_fail_at(0, 0);
            if (rc == TIDE_OK) {
                tide_plan_destroy(&p);
                tide_layout_destroy(&l);
                break;
            }
            cr_assert_eq(rc, TIDE_ERR_NOMEM, "call %d allocation %ld: %s (%s)", what, k,
                         tide_status_name(rc), tide_last_error());
            cr_assert_null(p);
            cr_assert_null(l);
            failed++;
        }
        cr_expect(failed > 0, "call %d never allocated", what);
    }
    /* The validator under failure too. */
    tide_plan_t *p = NULL;
    cr_assert_eq(tide_reshard_plan(o, n, c, alive, sizeof alive, &p), TIDE_OK);
    for (long k = 1;; k++) {
        tide_alloc_fail_at(k, 0);
        tide_status rc = tide_plan_validate(o, n, c, alive, sizeof alive, p);
        tide_alloc_fail_at(0, 0);
        if (rc == TIDE_OK)
            break;
        cr_assert_eq(rc, TIDE_ERR_NOMEM);
    }
    tide_plan_destroy(&p);
    tide_layout_destroy(&o);
    tide_layout_destroy(&n);
    tide_collection_destroy(&c);
}
