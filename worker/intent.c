/*
 * worker/intent: a generation's intent (tide_int.h), copied by value out of tided's layout
 * message at the step boundary that decides the switch. Pure; any thread.
 */
#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "worker/tide_int.h"

static int32_t *dup_ranks(const int32_t *a, uint32_t n)
{
    int32_t *c = tide_malloc((n ? n : 1) * sizeof *c);
    if (c != NULL && n > 0)
        memcpy(c, a, n * sizeof *c);
    return c;
}

tide_status tide__intent_from_msg(tide__intent *in, uint64_t gen, const tide_proto_layout_msg_t *pl,
                                  int old_member)
{
    memset(in, 0, sizeof *in);
    tide_status rc = tide__layout_from_proto(&pl->prev, &in->prev);
    if (rc == TIDE_OK)
        rc = tide__layout_from_proto(&pl->layout, &in->next);
    if (rc == TIDE_OK && pl->n_join_new > 0) {
        in->world = pl->world;
        in->n_join_old = pl->n_join_old;
        in->n_join_new = pl->n_join_new;
        in->join_old = dup_ranks(pl->join_old, pl->n_join_old);
        in->join_new = dup_ranks(pl->join_new, pl->n_join_new);
        if (in->join_old == NULL || in->join_new == NULL)
            rc = tide_errorf(TIDE_ERR_NOMEM, "out of memory for generation %llu's join",
                             (unsigned long long)gen);
    }
    if (rc == TIDE_OK && pl->n_leave > 0) {
        in->n_stay = pl->n_stay;
        in->n_leave = pl->n_leave;
        in->stay = dup_ranks(pl->stay, pl->n_stay);
        in->leave = dup_ranks(pl->leave, pl->n_leave);
        if (in->stay == NULL || in->leave == NULL)
            rc = tide_errorf(TIDE_ERR_NOMEM, "out of memory for generation %llu's release",
                             (unsigned long long)gen);
    }
    if (rc != TIDE_OK) {
        tide__intent_clear(in);
        in->gen = gen;
        return rc;
    }
    in->gen = gen;
    in->old_member = old_member;
    snprintf(in->ckpt, sizeof in->ckpt, "%s", pl->ckpt);
    in->ckpt_step = in->ckpt[0] != '\0' ? (int64_t)pl->ckpt_step : 0;
    return TIDE_OK;
}

void tide__intent_clear(tide__intent *in)
{
    tide_layout_destroy(&in->prev);
    tide_layout_destroy(&in->next);
    tide_free(in->join_old);
    tide_free(in->join_new);
    tide_free(in->stay);
    tide_free(in->leave);
    memset(in, 0, sizeof *in);
}
