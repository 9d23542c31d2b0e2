/*
 * Part of the test_examples_tide_recover executable (tests/test_examples_tide_recover.c):
 * the training hooks of tide_mlp_tide_train on every rank. What each rank records (the
 * losses and runs of each step, the switches, the state hashed before the kill and after
 * each switch) and where the victim dies: after step KILL_AT - 1 (SIGKILL), inside step
 * KILL_AT before its gradient allreduce (midstep) or in its last reductions (lastreduce), or
 * stopped there (SIGSTOP, stopped mode).
 */
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "core/clock.h"
#include "examples/mlp_tide.h"
#include "mlp_state.h"
#include "tide_recover_int.h"

/* ---- what each rank records ---------------------------------------------------------------- */

/* Frees the layouts the record copied. */
void record_free_layouts(record *r)
{
    tide_layout_destroy(&r->recover);
    for (int k = 0; k <= MAX_GEN; k++)
        tide_layout_destroy(&r->layouts[k]);
}

/* The full state over the members of the current view, hashed on the root. */
static void hash_state(tide_t *t, const tide_mlp_t *m, uint64_t *out)
{
    MT_OK(mlp_state_hashes(t, m, tide_view_get(t), out));
}

tide_status h_on_step(void *ctx, tide_t *t, const tide_mlp_t *m, int64_t step, double loss,
                      double secs)
{
    (void)secs;
    record *r = ctx;
    /* with resizes the job ends once the recovery ran a few steps (h_done), within MAX_STEPS */
    MT_ASSERT(step >= 0 && step < (g.sc.n_resizes > 0 ? MAX_STEPS - 1 : g.steps),
              "step %lld out of range", (long long)step);
    r->loss[step] = loss;
    r->ran[step]++;
    const tide_view *v = tide_view_get(t);
    if ((int)v->generation == g.kill_gen) {
        r->loss1[step] = loss;
        r->ran1[step]++;
    }
    if (g.fit && step == 1 && v->generation == 1 && r->wd != NULL && !r->refused_checked) {
        check_refused_resize(r->wd->tidectl, r->wd->endpoint);
        r->refused_checked = 1;
    }
    if (g.request) {
        if (step == 1 && v->generation == 1 && g_rank == 0)
            request_checkpoint(r, (int)step + 1);
        if (step >= 2)
            keep_requested_state(t, m, r, step);
        return TIDE_OK; /* h_at slows the steps down */
    }
    if (g.ckpt && step == g.switch_at - 1 && (int)v->generation == g.kill_gen)
        hash_state(t, m, r->pre); /* the state the checkpoint the job rolls back to holds */
    if (step == g.kill - 1 && (int)v->generation == g.kill_gen) {
        /* the whole state after g.kill steps, over every member (the victim included) */
        if (!g.ckpt)
            hash_state(t, m, r->pre);
        if (tide_pool_rank(t) == g.victim && !g.midstep && !g.lastreduce && !g.stopped) {
            if (g.ckpt)
                wait_checkpoint_known(t, g.ckpt_at);
            if (g.corrupt)
                damage_checkpoint(g.ckpt_at);
            fprintf(stderr, "[rank %d] killing myself after step %d\n", g_rank, g.kill - 1);
            fflush(stderr);
            raise(SIGKILL);
        }
        if (r->wd != NULL)
            r->wd->killed_ns = tide_now_ns();
    }
    tide_sleep_ms(5); /* a few steps per heartbeat however fast the machine */
    return TIDE_OK;
}

/* midstep mode: the victim dies between its backward pass and its gradient allreduce;
   lastreduce mode: after the loss reduction over dp, before those over pp and tp. */
tide_status h_at(void *ctx, tide_t *t, const tide_mlp_t *m, int64_t step,
                 tide_mlp_point point)
{
    (void)ctx;
    (void)m;
    /* ckpt-request: tided reckons how far the job runs before a request reaches it from the
       time its workers spend inside steps (begin to end), so the delay goes in there: 50 ms
       a step keeps the step it picks well before the job's end, however fast the machine */
    if (g.request && point == TIDE_MLP_AT_GRADS)
        tide_sleep_ms(50);
    if (g.request && point == TIDE_MLP_AT_GRADS && step == 0) {
        /* half a step's state is no step's: a save from inside a step is refused */
        tide_status crc = tide_checkpoint(t, g_ckpt_root);
        MT_ASSERT(crc == TIDE_ERR_INVALID && strstr(tide_last_error(), "inside step 0") != NULL,
                  "tide_checkpoint inside a step must be refused; got %s: %s", tide_strerror(crc),
                  tide_last_error());
    }
    int want = g.midstep || g.stopped ? point == TIDE_MLP_AT_GRADS
               : g.lastreduce         ? point == TIDE_MLP_AT_LOSS
                                      : 0;
    if (want && step == g.kill && (int)tide_view_get(t)->generation == g.kill_gen &&
        tide_pool_rank(t) == g.victim && g.stopped) {
        fprintf(stderr,
                "[rank %d] stopping myself inside step %d, before its gradient "
                "allreduce (SIGSTOP)\n",
                g_rank, g.kill);
        fflush(stderr);
        raise(SIGSTOP);
        fprintf(stderr, "[rank %d] resumed inside step %d\n", g_rank, g.kill);
        fflush(stderr);
        return TIDE_OK; /* on into the old generation's allreduce, as a slow rank would */
    }
    if (want && step == g.kill && (int)tide_view_get(t)->generation == g.kill_gen &&
        tide_pool_rank(t) == g.victim) {
        fprintf(stderr, "[rank %d] killing myself inside step %d, %s\n", g_rank, g.kill,
                g.midstep ? "before its gradient allreduce" : "inside its last reductions");
        fflush(stderr);
        raise(SIGKILL);
    }
    return TIDE_OK;
}

int layout_has(const tide_layout_t *l, int rank)
{
    for (size_t i = 0; i < tide_layout_size(l); i++)
        if (l->worker[i] == rank)
            return 1;
    return 0;
}

tide_status h_before(void *ctx, tide_t *t, const tide_mlp_t *m)
{
    record *r = ctx;
    const tide_view *nv = tide_view_next(t);
    /* the resizes (generations 2 .. g.kill_gen), then the recovery; ckpt-corrupt: the
       recovery's generation fails (its checkpoint cannot be loaded) and the next one rolls
       back further */
    uint64_t want = 2 + (uint64_t)r->befores;
    MT_ASSERT(nv->generation == want && want <= g.final_gen,
              "switch %d to generation %llu: only %d resizes, then %s expected", r->befores + 1,
              (unsigned long long)nv->generation, g.sc.n_resizes,
              g.corrupt ? "the refused recovery, then the one from the checkpoint before it, are"
                        : "the recovery is");
    if (nv->generation <= (uint64_t)g.kill_gen) { /* a resize, every rank alive */
        if (tide_view_get(t)->member)
            hash_state(t, m, r->before[nv->generation]);
    } else {
        MT_ASSERT(!layout_has(nv->layout, g.victim), "the recovery layout still holds rank %d",
                  g.victim);
    }
    r->befores++;
    r->before_gen = nv->generation;
    return TIDE_OK;
}

/* A resize's switch (generations 2 .. g.kill_gen): the layout asked for, its switch step
   and its state; entering the victim's generation fixes the kill's steps and the victim. */
static tide_status after_resize(record *r, tide_t *t, const tide_mlp_t *m)
{
    const tide_view *v = tide_view_get(t);
    uint64_t gen = v->generation;
    const tide_layout_t *l = v->layout;
    const mt_layout *want = &g.sc.resize[gen - 2];
    MT_ASSERT(r->before_gen == gen && l->dp == want->dp && l->tp == want->tp && l->pp == want->pp,
              "generation %llu (begun: %llu) is (dp %d, tp %d, pp %d), not the resize's "
              "(%d, %d, %d)",
              (unsigned long long)gen, (unsigned long long)r->before_gen, l->dp, l->tp, l->pp,
              want->dp, want->tp, want->pp);
    MT_ASSERT(tide_mlp_active(m) == v->member, "model and view disagree on membership");
    r->gen_at[gen] = v->step;
    MT_OK(tide_layout_copy(&r->layouts[gen], l));
    if (v->member)
        hash_state(t, m, r->after[gen]);
    if (gen == (uint64_t)g.kill_gen) {
        set_kill_base((int)v->step);
        find_victim(l);
        if (r->wd != NULL) { /* rank 0: the watchdog watches the victim from now on */
            r->wd->victim_pid = g_pids[g.victim];
            r->wd->victim_id = tide_pool_worker_id(t, g.victim);
        }
    }
    return TIDE_OK;
}

tide_status h_after(void *ctx, tide_t *t, const tide_mlp_t *m,
                    const tide_mlp_switch_stats *st)
{
    (void)st;
    record *r = ctx;
    const tide_view *v = tide_view_get(t);
    r->switches++;
    if (v->generation <= (uint64_t)g.kill_gen)
        return after_resize(r, t, m);
    r->switch_at = v->step;
    MT_ASSERT(v->generation == g.final_gen && r->before_gen == g.final_gen,
              "switched to generation %llu (begun: %llu), want %llu",
              (unsigned long long)v->generation, (unsigned long long)r->before_gen,
              (unsigned long long)g.final_gen);
    const tide_layout_t *l = v->layout;
    MT_ASSERT(l->dp == g.recover.dp && l->tp == g.recover.tp && l->pp == g.recover.pp &&
                  (!g.spare || layout_has(l, r->spare)),
              "the %d survivors of (dp %d, tp %d, pp %d)%s recover to (dp %d, tp %d, pp %d)%s; "
              "got (%d, %d, %d)",
              g.row->r.ranks - 1, r->layouts[g.kill_gen]->dp, r->layouts[g.kill_gen]->tp,
              r->layouts[g.kill_gen]->pp,
              g.fit ? " with a batch of 16 in 4 micro-batches (the one layout they hold that the "
                      "model can run)"
                    : "",
              g.recover.dp, g.recover.tp, g.recover.pp,
              g.spare ? ", the spare taking the dead rank's place" : "", l->dp, l->tp, l->pp);
    MT_ASSERT(tide_mlp_active(m) == v->member, "model and view disagree on membership");
    if (r->recover == NULL) {
        MT_OK(tide_layout_new(&r->recover, l->dp, l->tp, l->pp, l->num_layers, l->micro_batches));
        MT_OK(tide_layout_set_stages(r->recover, l->stage_start));
        memcpy(r->recover->worker, l->worker, tide_layout_size(l) * sizeof *l->worker);
    }
    if (v->member)
        hash_state(t, m, r->post);
    return TIDE_OK;
}

int h_done(void *ctx, const tide_view *v)
{
    const record *r = ctx;
    if (g.sc.n_resizes == 0)
        return v->step >= g.steps;
    /* the resizes and the kill come when they come: the job ends once the recovery ran a
       few steps, and no sooner than the row's step count */
    int64_t end = r->switch_at + 4 > g.steps ? r->switch_at + 4 : g.steps;
    return v->generation == g.final_gen && r->switch_at >= 0 && v->step >= end;
}
