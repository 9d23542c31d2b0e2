/*
 * worker/prebuild: the communicators of an announced generation, built while the old
 * layout still trains, so that its switch step does not wait for them (DESIGN.md,
 * "Reconfiguration" 3). On the preparation thread (prep.c), every participant of a plain
 * resize (the new layout's members and the old one's, all alive when tided announced it)
 * makes the switch communicator over the participants, splits the new layout's groups off
 * it as the switch would (groups.c), computes its part of the plan, and all agree over
 * the new communicator that every rank has the whole set. The switch step then takes them
 * when they were made for its generation and participants, and otherwise builds its own.
 *
 * Not built ahead (the switch builds them, as before): a recovery (its old layout names a
 * member that died: the build would wait for it), a generation that connects a pool
 * launched later (the join at the switch makes the communicator they would be built on),
 * a release, and any generation when some rank of the pool runs MPI below
 * MPI_THREAD_MULTIPLE (the preparation thread calls MPI while the main thread runs steps).
 * Every participant decides alike from the announcement and the pool-wide thread level, so
 * they all build or none does.
 *
 * Creation order: every participant creates the same communicators in the same order with
 * the same tags: the switch communicator (a tag of its own, TIDE__TAG_PREBUILT, so nothing
 * of an abandoned build matches a switch step's), then all, tp, dp, pp. They touch the
 * pool's communicator (handshakes, MPI_Comm_create_group with its own tags) and the new
 * communicators only, never one the main thread's steps use. Aborts: every one of them
 * watches the generation's abort word, which tided's abort of the generation, a newer
 * layout, a halt, a fence or tide_destroy sets, so a participant that dies during the
 * build costs milliseconds once tided notices, never the switch timeout.
 *
 * Workload: once per announced resize; a handful of communicator creations (milliseconds
 * to tens of milliseconds on one host).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/clock.h"
#include "core/error.h"
#include "core/log.h"
#include "worker/groups.h"
#include "worker/prep.h"

#define SUBSYS "worker"

int tide__participants(const tide_layout_t *prev, const tide_layout_t *l, const uint8_t *alive,
                       int size, int *parts)
{
    uint8_t *is = tide_calloc(size > 0 ? (size_t)size : 1, 1);
    if (is == NULL)
        return -1;
    for (size_t i = 0; i < tide_layout_size(l); i++)
        if (l->worker[i] >= 0 && l->worker[i] < size)
            is[l->worker[i]] = 1;
    for (size_t i = 0; prev != NULL && i < tide_layout_size(prev); i++) {
        int32_t r = prev->worker[i];
        if (r >= 0 && r < size && (alive == NULL || alive[r]))
            is[r] = 1;
    }
    int n = 0;
    for (int r = 0; r < size; r++)
        if (is[r])
            parts[n++] = r;
    tide_free(is);
    return n;
}

void tide__prebuilt_free(tide__prebuilt *b)
{
    for (int k = 3; k >= 0; k--)
        tide_coll_comm_destroy(&b->g[k]);
    tide_coll_comm_destroy(&b->sw);
    tide_plan_destroy(&b->plan);
    tide_free(b->parts);
    memset(b, 0, sizeof *b);
}

/* 1 on every participant when all of them have the whole set (ok), 0 when one has not;
   an error when a participant never answered (timeout, or the generation's word). In
   host memory over the pool's MPI communicator, never a device collective: the training
   thread's collectives run on the same device meanwhile, and two ranks could enqueue the
   two in opposite orders and wait on each other. */
static tide_status agree_ok(const tide__prep_base *b, uint64_t gen, const tide__prebuilt *out,
                            const int *word, int ok, int *all)
{
    int32_t mine = ok ? 0 : 1, *votes = tide_malloc((size_t)out->np * sizeof *votes);
    if (votes == NULL)
        return tide_errorf(TIDE_ERR_NOMEM, "out of memory agreeing on the build");
    tide_status rc = tide_coll_pool_allgather(
        b->pool, out->parts, out->np, tide__gen_tag(gen, TIDE__TAG_PREBUILT_AGREE),
        (uint32_t)b->switch_timeout_ms, word, &mine, sizeof mine, votes);
    int32_t worst = 0;
    for (int i = 0; rc == TIDE_OK && i < out->np; i++)
        worst = votes[i] > worst ? votes[i] : worst;
    tide_free(votes);
    *all = rc == TIDE_OK && worst == 0; /* the most failed: one rank that has not decides */
    return rc;
}

/* The build itself, into *out; TIDE_OK with *kept when every participant has the whole
   set. */
static tide_status build(const tide__prep_base *b, uint64_t gen, const tide_layout_t *prev,
                         const tide_layout_t *nl, const int *word, tide__prebuilt *out, int *kept)
{
    *kept = 0;
    tide_coll_comm_params cp = {
        out->parts, out->np, tide__gen_tag(gen, TIDE__TAG_PREBUILT), (uint32_t)b->switch_timeout_ms,
        word,       word};
    TIDE_CHECK(tide_coll_comm_new(&out->sw, b->be, b->pool, &cp));
    tide_view v;
    tide__fill_view(&v, gen, nl, b->rank, 0);
    /* as at a switch: all off the switch communicator (every participant, the ones
       outside nl with no colour), then tp, dp, pp off all; the switch communicator stays
       (it carries the switch's data) */
    tide__group_ctx gc = {b->be, b->pool, (uint32_t)b->switch_timeout_ms, word};
    TIDE_CHECK(tide__build_groups(&gc, nl, &v, &out->sw, 1, out->g));
    /* this rank's part of the plan, every participant alive (the switch uses it only for
       exactly these participants) */
    size_t nw = (size_t)b->size;
    uint8_t *alive = tide_malloc(nw ? nw : 1);
    tide_status prc = alive != NULL ? TIDE_OK : tide_errorf(TIDE_ERR_NOMEM, "out of memory");
    if (alive != NULL) {
        memset(alive, 1, nw);
        prc = tide_reshard_plan_for(prev, nl, b->coll, alive, nw, b->rank, &out->plan);
        tide_free(alive);
    }
    if (prc != TIDE_OK)
        TIDE_WARN(SUBSYS, "rank %d: planning generation %llu ahead failed: %s", b->rank,
                  (unsigned long long)gen, tide_last_error());
    /* a rank that could not plan says so here, and nobody keeps a partial set (the switch
       step must find the same set on every participant, or none) */
    return agree_ok(b, gen, out, word, prc == TIDE_OK, kept);
}

/* 1 when gen's switch can use communicators built ahead, and this rank takes part in it
   (prev and nl made, parts filled); 0 otherwise (the switch step builds them). */
static int wanted(const tide__prep_base *b, const tide_proto_layout_msg_t *pl, tide_layout_t **prev,
                  tide_layout_t **nl, tide__prebuilt *out)
{
    if (!pl->has_prev || pl->recover || pl->n_join_new > 0 || pl->n_leave > 0)
        return 0; /* a first layout, a recovery, a join, a release: built at the switch step */
    if (pl->world != b->size || tide__layout_from_proto(&pl->prev, prev) != TIDE_OK ||
        tide__layout_from_proto(&pl->layout, nl) != TIDE_OK ||
        tide_layout_validate(*prev, b->coll) != TIDE_OK ||
        tide_layout_validate(*nl, b->coll) != TIDE_OK) {
        tide_error_clear(); /* the switch step finds and reports it */
        return 0;
    }
    out->parts = tide_malloc((size_t)b->size * sizeof *out->parts);
    out->np = out->parts != NULL ? tide__participants(*prev, *nl, NULL, b->size, out->parts) : -1;
    int in = 0;
    for (int k = 0; k < out->np; k++) {
        in |= out->parts[k] == b->rank;
        if (tide_coll_pool_comm_rank(b->pool, out->parts[k]) < 0)
            return 0; /* not connected: the switch step fails on it */
    }
    return out->np > 0 && in;
}

void tide__prebuild(const tide__prep_base *b, uint64_t gen, const tide_proto_layout_msg_t *pl,
                    const tide__gen_t *word, tide__prebuilt *out)
{
    memset(out, 0, sizeof *out);
    if (pl->has_prev && !pl->recover && pl->n_join_new == 0 && pl->n_leave == 0 && !b->multi)
        return; /* said once by the runtime at its start */
    uint64_t t0 = tide_now_ns();
    tide_layout_t *prev = NULL, *nl = NULL;
    if (!wanted(b, pl, &prev, &nl, out) || tide__gen_aborted(word)) {
        tide__prebuilt_free(out);
        tide_layout_destroy(&prev);
        tide_layout_destroy(&nl);
        return;
    }
    int kept = 0;
    tide_status rc = build(b, gen, prev, nl, tide__gen_word(word), out, &kept);
    int aborted = tide__gen_aborted(word);
    if (rc == TIDE_OK && kept && !aborted) {
        out->gen = gen;
        TIDE_INFO(SUBSYS, "rank %d: generation %llu's communicators built ahead in %.1f ms",
                  b->rank, (unsigned long long)gen, (double)(tide_now_ns() - t0) / 1e6);
    } else {
        TIDE_INFO(SUBSYS,
                  "rank %d: generation %llu's communicators were not built ahead (%s); its "
                  "switch step builds them",
                  b->rank, (unsigned long long)gen,
                  aborted         ? "the generation was aborted or replaced"
                  : rc != TIDE_OK ? tide_last_error()
                                  : "a participant could not plan");
        tide__prebuilt_free(out);
    }
    tide_layout_destroy(&prev);
    tide_layout_destroy(&nl);
}
