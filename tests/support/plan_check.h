/*
 * Checking reshard plans in tests (tests/support/plan_check.c): a validator that proves
 * a plan byte by byte against its layouts, and a simulator that executes one on host
 * buffers. Test support only: the planner ships without them.
 */
#ifndef TIDE_TESTS_SUPPORT_PLAN_CHECK_H
#define TIDE_TESTS_SUPPORT_PLAN_CHECK_H

#include "reshard/reshard.h"

#ifdef __cplusplus
extern "C" {
#endif

/*
 * Proves the plan: every byte of every new local buffer written exactly once,
 * from an alive worker whose old buffer holds that same global byte, all
 * offsets in range. TIDE_ERR_INVALID with the first violation otherwise.
 * Test-sized plans (memory per run); any thread.
 */
tide_status tide_plan_validate(const tide_layout_t *old_l, const tide_layout_t *new_l,
                               const tide_collection_t *c, const uint8_t *alive, size_t n_alive,
                               const tide_plan_t *plan);

/*
 * Executes the plan on host memory: old_bufs[w][i] / new_bufs[w][i] are worker
 * w's old and new local buffers of tensor i (NULL where not held), for w up to
 * the largest worker id in either layout. Single thread.
 */
void tide_plan_simulate(const tide_plan_t *plan, void *const *const *old_bufs,
                        void *const *const *new_bufs);

#ifdef __cplusplus
}
#endif

#endif /* TIDE_TESTS_SUPPORT_PLAN_CHECK_H */
