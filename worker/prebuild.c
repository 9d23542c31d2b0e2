/*
 * worker/prebuild: the communicators of an announced generation, built while the old
 * layout still trains, so that its switch step does not wait for them (DESIGN.md,
 * "Reconfiguration" 3). On ctl's preparation thread, every participant of a plain resize
 * (the new layout's members and the old one's, all alive when tided announced it) makes
 * the switch communicator over the participants, splits the new layout's groups off it as
 * tide_reshard would, computes its part of the plan, and all agree over the new
 * communicator that every rank has the whole set. The switch step then takes them when
 * they were made for its generation and participants, and otherwise builds its own.
 *
 * Not built ahead (the switch builds them, as before): a recovery (its old layout names a
 * member that died: the build would wait for it), a generation that connects a pool
 * launched later (the join at the switch makes the communicator they would be built on),
 * and any generation when some rank of the pool runs MPI below MPI_THREAD_MULTIPLE (the
 * preparation thread calls MPI while the main thread runs steps). Every participant
 * decides alike from the announcement and the pool-wide thread level, so they all build or
 * none does.
 *
 * Creation order: every participant creates the same communicators in the same order
 * with the same tags, as tide_reshard does: the switch communicator (a tag of its own,
 * TIDE__TAG_PREBUILT, so nothing of an abandoned build matches a switch step's), then
 * all, tp, dp, pp. Concurrency with the main thread: the build touches the pool's
 * communicator (handshakes, MPI_Comm_create_group with its own tags) and the new
 * communicators only, never one the main thread's steps use; the main thread touches the
 * new ones only once the build is over (t->pre.building, under ctl's lock, and the switch
 * waits for the preparation). Aborts: an abort of the generation, a newer layout, a halt,
 * a fence or tide_destroy sets prep_cancel and aborts what the build published, so a
 * participant that dies during the build costs milliseconds once tided notices, never the
 * switch timeout.
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
#include "worker/tide_int.h"

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

/* Publishes slot k (0: the switch communicator, 1..4: all, tp, dp, pp) of the build, so
   that an abort reaches it; one that came before it existed aborts it now. */
static void publish(tide_t *t, int k, tide_coll_comm_t *c)
{
    tide__ctl_lock(t->ctl);
    if (k == 0)
        t->pre.sw = c;
    else
        t->pre.g[k - 1] = c;
    if (c != NULL && __atomic_load_n(&t->prep_cancel, __ATOMIC_RELAXED))
        tide_coll_comm_abort(c);
    tide__ctl_unlock(t->ctl);
}

/* Everything of a build, emptied from p (the caller frees it). */
typedef struct built {
    int *parts;
    tide_coll_comm_t *c[5];
    tide_plan_t *plan;
} built;

static void take(tide__prebuilt *p, built *b)
{
    b->parts = p->parts;
    b->c[0] = p->sw;
    for (int k = 0; k < 4; k++)
        b->c[k + 1] = p->g[k];
    b->plan = p->plan;
    memset(p, 0, sizeof *p);
}

static void free_built(built *b)
{
    /* groups first: they were split off the switch communicator */
    for (int k = 4; k >= 0; k--)
        tide_coll_comm_destroy(&b->c[k]);
    tide_plan_destroy(&b->plan);
    tide_free(b->parts);
    b->parts = NULL;
}

/* 1 on every participant when all of them have the whole set (ok), 0 when one has not;
   an error when the communicator failed (aborted, a member died). Over sw, in the
   backend's memory kind. */
static tide_status agree_ok(tide_t *t, tide_coll_comm_t *sw, int ok, int *all)
{
    int32_t v = ok ? 0 : 1; /* the most failed: one rank that has not decides for all */
    if (t->be->mem_kind == TIDE_MEM_HOST) {
        TIDE_CHECK(tide_coll_allreduce(sw, &v, &v, 1, TIDE_I32, TIDE_RED_MAX, NULL));
    } else {
        void *dev = NULL;
        TIDE_CHECK(tide_coll_mem_alloc(t->be, t->device, sizeof v, &dev));
        tide_status rc = t->be->copy_host(dev, &v, sizeof v, 0, NULL);
        if (rc == TIDE_OK)
            rc = tide_coll_allreduce(sw, dev, dev, 1, TIDE_I32, TIDE_RED_MAX, NULL);
        if (rc == TIDE_OK)
            rc = t->be->copy_host(&v, dev, sizeof v, 1, NULL);
        t->be->mem_free(dev);
        TIDE_CHECK(rc);
    }
    *all = v == 0;
    return TIDE_OK;
}

/* The build itself, into t->pre (published as it goes); TIDE_OK with *kept when every
   participant has the whole set. */
static tide_status build(tide_t *t, uint64_t gen, const tide_layout_t *prev,
                         const tide_layout_t *nl, int *kept)
{
    *kept = 0;
    tide__prebuilt *p = &t->pre;
    tide_coll_comm_t *sw = NULL, *g[4] = {NULL, NULL, NULL, NULL};
    tide_coll_comm_params cp = {p->parts, p->np, tide__gen_tag(gen, TIDE__TAG_PREBUILT),
                                (uint32_t)t->opts.switch_timeout_ms, &t->prep_cancel};
    TIDE_CHECK(tide_coll_comm_new(&sw, t->be, t->pool, &cp));
    publish(t, 0, sw);
    tide_view v;
    tide__fill_view(&v, gen, nl, t->rank, 0);
    /* as tide__build_groups at a switch: all off the switch communicator (every
       participant, the ones outside nl with no colour), then tp, dp, pp off all */
    int key = v.member ? (int)tide_layout_index(nl, v.pp_rank, v.dp_rank, v.tp_rank) : 0;
    TIDE_CHECK(tide_coll_comm_split(sw, v.member ? 0 : -1, key, &g[0]));
    publish(t, 1, g[0]);
    if (v.member) {
        const int color[3] = {v.pp_rank * nl->dp + v.dp_rank, v.pp_rank * nl->tp + v.tp_rank,
                              v.dp_rank * nl->tp + v.tp_rank};
        const int k3[3] = {v.tp_rank, v.dp_rank, v.pp_rank};
        for (int k = 0; k < 3; k++) {
            TIDE_CHECK(tide_coll_comm_split(g[0], color[k], k3[k], &g[k + 1]));
            publish(t, k + 2, g[k + 1]);
        }
    }
    /* this rank's part of the plan, every participant alive (the switch uses it only for
       exactly these participants) */
    size_t nw = (size_t)t->size;
    uint8_t *alive = tide_malloc(nw ? nw : 1);
    tide_status prc = alive != NULL ? TIDE_OK : tide_errorf(TIDE_ERR_NOMEM, "out of memory");
    if (alive != NULL) {
        memset(alive, 1, nw);
        tide_plan_t *plan = NULL;
        prc = tide_reshard_plan_for(prev, nl, t->coll, alive, nw, t->rank, &plan);
        tide__ctl_lock(t->ctl);
        p->plan = plan;
        tide__ctl_unlock(t->ctl);
        tide_free(alive);
    }
    if (prc != TIDE_OK)
        TIDE_WARN(SUBSYS, "rank %d: planning generation %llu ahead failed: %s", t->rank,
                  (unsigned long long)gen, tide_last_error());
    /* a rank that could not plan says so here, and nobody keeps a partial set (the switch
       step must find the same set on every participant, or none) */
    return agree_ok(t, sw, prc == TIDE_OK, kept);
}

void tide__prebuild(tide_t *t, uint64_t gen, const tide_proto_layout_msg_t *pl)
{
    if (!pl->has_prev || pl->recover || pl->n_join_new > 0 || pl->n_leave > 0)
        return; /* a first layout, a recovery, a join, a release: built at the switch step */
    if (!t->multi) {
        if (!t->prebuild_said)
            TIDE_INFO(SUBSYS,
                      "rank %d: communicators of announced layouts are built at the switch "
                      "step, not ahead: a rank of the pool initialised MPI below "
                      "MPI_THREAD_MULTIPLE (building them on the preparation thread needs it)",
                      t->rank);
        t->prebuild_said = 1;
        return;
    }
    uint64_t t0 = tide_now_ns();
    tide_layout_t *prev = NULL, *nl = NULL;
    int *parts = NULL;
    built stale, mine;
    memset(&stale, 0, sizeof stale);
    memset(&mine, 0, sizeof mine);
    if (pl->world != t->size || tide__layout_from_proto(&pl->prev, &prev) != TIDE_OK ||
        tide__layout_from_proto(&pl->layout, &nl) != TIDE_OK ||
        tide_layout_validate(prev, t->coll) != TIDE_OK ||
        tide_layout_validate(nl, t->coll) != TIDE_OK) {
        tide_error_clear(); /* the switch step finds and reports it */
        goto out;
    }
    parts = tide_malloc((size_t)t->size * sizeof *parts);
    int np = parts != NULL ? tide__participants(prev, nl, NULL, t->size, parts) : -1;
    int in = 0;
    for (int k = 0; k < np; k++) {
        in |= parts[k] == t->rank;
        if (tide_coll_pool_comm_rank(t->pool, parts[k]) < 0)
            np = -1; /* not connected: the switch step fails on it */
    }
    if (np <= 0 || !in)
        goto out;
    /* the generation is still pending: from here an abort of it reaches the build. Its
       switch may have come (the ack went out at the end of a step): the main thread waits
       for this preparation before it switches, so it finds the build whole. */
    tide__ctl_lock(t->ctl);
    tide__agree *a = tide__ctl_agree(t->ctl);
    int pending = a->p_gen == gen && !a->p_failed && !a->p_aborted;
    if (pending) {
        if (t->pre.gen != 0) /* built for a generation that went away */
            take(&t->pre, &stale);
        __atomic_store_n(&t->prep_cancel, 0, __ATOMIC_RELAXED);
        t->pre.gen = gen;
        t->pre.building = 1;
        t->pre.parts = parts;
        t->pre.np = np;
        parts = NULL;
    }
    tide__ctl_unlock(t->ctl);
    free_built(&stale);
    if (!pending)
        goto out;
    int kept = 0;
    tide_status rc = build(t, gen, prev, nl, &kept);
    tide__ctl_lock(t->ctl);
    int cancelled = __atomic_load_n(&t->prep_cancel, __ATOMIC_RELAXED);
    t->pre.building = 0;
    t->pre.ms = (double)(tide_now_ns() - t0) / 1e6;
    if (rc != TIDE_OK || !kept || cancelled)
        take(&t->pre, &mine);
    tide__ctl_unlock(t->ctl);
    if (rc == TIDE_OK && kept && !cancelled)
        TIDE_INFO(SUBSYS, "rank %d: generation %llu's communicators built ahead in %.1f ms",
                  t->rank, (unsigned long long)gen, (double)(tide_now_ns() - t0) / 1e6);
    else
        TIDE_INFO(SUBSYS,
                  "rank %d: generation %llu's communicators were not built ahead (%s); its "
                  "switch step builds them",
                  t->rank, (unsigned long long)gen,
                  cancelled       ? "the generation was aborted or replaced"
                  : rc != TIDE_OK ? tide_last_error()
                                  : "a participant could not plan");
    free_built(&mine);
out:
    tide_free(parts);
    tide_layout_destroy(&prev);
    tide_layout_destroy(&nl);
}

void tide__prebuilt_cancel_locked(tide_t *t)
{
    __atomic_store_n(&t->prep_cancel, 1, __ATOMIC_RELAXED);
    if (!t->pre.building)
        return; /* whole and idle: freed cleanly by the main thread */
    if (t->pre.sw != NULL)
        tide_coll_comm_abort(t->pre.sw);
    for (int k = 0; k < 4; k++)
        if (t->pre.g[k] != NULL)
            tide_coll_comm_abort(t->pre.g[k]);
}

void tide__prebuilt_drop(tide_t *t, int all)
{
    built b;
    memset(&b, 0, sizeof b);
    if (t->ctl != NULL)
        tide__ctl_lock(t->ctl);
    const tide__agree *a = t->ctl != NULL ? tide__ctl_agree(t->ctl) : NULL;
    int pending = a != NULL && t->pre.gen == a->p_gen && !a->p_failed &&
                  !__atomic_load_n(&t->prep_cancel, __ATOMIC_RELAXED);
    if (t->pre.gen != 0 && !t->pre.building && (all || !pending))
        take(&t->pre, &b);
    if (t->ctl != NULL)
        tide__ctl_unlock(t->ctl);
    if (b.c[0] != NULL || b.plan != NULL || b.parts != NULL)
        TIDE_DEBUG(SUBSYS,
                   "rank %d: freed the communicators built ahead for a generation that "
                   "went away",
                   t->rank);
    free_built(&b);
}

int tide__prebuilt_take_locked(tide_t *t, uint64_t gen, const int *parts, int np,
                               tide_coll_comm_t **sw, tide_coll_comm_t **g, tide_plan_t **plan)
{
    tide__prebuilt *p = &t->pre;
    if (p->gen != gen || p->building || p->sw == NULL || p->np != np ||
        memcmp(p->parts, parts, (size_t)np * sizeof *parts) != 0 || tide_coll_comm_aborted(p->sw))
        return 0;
    for (int k = 0; k < 4; k++)
        if (p->g[k] != NULL && tide_coll_comm_aborted(p->g[k]))
            return 0;
    built b;
    take(p, &b);
    *sw = b.c[0];
    for (int k = 0; k < 4; k++)
        g[k] = b.c[k + 1];
    *plan = b.plan;
    tide_free(b.parts);
    return 1;
}
