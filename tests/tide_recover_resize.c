/*
 * Part of the test_examples_tide_recover executable (tests/test_examples_tide_recover.c):
 * the resizes before the kill (resize-spare) and the switches and runs of each step that the
 * layouts call for. Rank 0's thread sends each resize through the tidectl binary; after
 * training, collectively over the survivors: the step the job ended at, each resize's switch
 * at one step with the state bit-identical across it, rank 0's recovery layout shared with
 * the survivors that took no part in it, and how often each survivor switched and each step
 * ran.
 */
#include <stdio.h>
#include <string.h>

#include "coord_harness.h"
#include "tide_recover_int.h"

/* ---- resizes before the kill ----------------------------------------------------------------- */

void *resize_thread(void *arg)
{
    resizer *rz = arg;
    void *ctx = zmq_ctx_new();
    void *s = coord_connect(ctx, rz->endpoint, NULL, NULL, NULL, 10000);
    int64_t since = -1;
    uint64_t deadline = tide_now_ns() + 80ull * 1000000000ull;
    while (s != NULL && rz->sent < g.sc.n_resizes && rz->why[0] == '\0') {
        if (tide_now_ns() > deadline) {
            snprintf(rz->why, sizeof rz->why, "resize %d not sent within 80 s", rz->sent + 1);
            break;
        }
        uint64_t gen = 0, step = 0;
        int running = 0;
        if (coord_job_state(s, JOB, &gen, &step, &running) != 0) {
            snprintf(rz->why, sizeof rz->why, "no jobs reply from tided");
            break;
        }
        if (gen != (uint64_t)rz->sent + 1 || !running) {
            tide_sleep_ms(20);
            continue;
        }
        if (since < 0)
            since = (int64_t)step;
        if ((int64_t)step < since + GAP) {
            tide_sleep_ms(20);
            continue;
        }
        const mt_layout *l = &g.sc.resize[rz->sent];
        char dp[16], tp[16], pp[16];
        snprintf(dp, sizeof dp, "%d", l->dp);
        snprintf(tp, sizeof tp, "%d", l->tp);
        snprintf(pp, sizeof pp, "%d", l->pp);
        const char *args[12] = {"resize", JOB, "--dp", dp, "--tp", tp, "--pp", pp};
        if (l->stages[0] != '\0') {
            args[8] = "--stages";
            args[9] = l->stages;
        }
        static char out[4096];
        if (coord_tidectl(rz->tidectl, rz->endpoint, args, out, sizeof out) != 0) {
            snprintf(rz->why, sizeof rz->why, "tidectl resize to (%s, %s, %s) failed: %.400s", dp,
                     tp, pp, out);
            break;
        }
        rz->sent++;
        since = -1;
    }
    if (s == NULL)
        snprintf(rz->why, sizeof rz->why, "cannot connect to %s", rz->endpoint);
    else
        zmq_close(s);
    zmq_ctx_term(ctx);
    return NULL;
}

/* The step the job ended at (scenarios with resizes end once the recovery has run a
   while): the last step any survivor ran, within MAX_STEPS; the runs of each step are
   checked against it. Collective over surv. */
int agreed_end(const record *rec, MPI_Comm surv)
{
    int last = 0, hi = 0;
    for (int k = 0; k < MAX_STEPS; k++)
        if (rec->ran[k] > 0)
            last = k + 1;
    MPI_Allreduce(&last, &hi, 1, MPI_INT, MPI_MAX, surv);
    MT_ASSERT(hi >= g.row->steps && hi < MAX_STEPS,
              "the job ended after %d steps (want from %d to %d)", hi, g.row->steps, MAX_STEPS - 1);
    return hi;
}

/* The resizes: each switch at one step on every survivor, later than the one before, and
   the whole state right after it bit-identical to the state right before. gen_at gets the
   switch steps of generations 1 .. g.kill_gen. Collective over surv. */
void check_resizes(const record *rec, MPI_Comm surv, int64_t *gen_at)
{
    int64_t lo[MAX_GEN + 1];
    MPI_Allreduce(rec->gen_at, lo, MAX_GEN + 1, MPI_INT64_T, MPI_MIN, surv);
    MPI_Allreduce(rec->gen_at, gen_at, MAX_GEN + 1, MPI_INT64_T, MPI_MAX, surv);
    static uint64_t before[MAX_GEN + 1][MAX_T], after[MAX_GEN + 1][MAX_T];
    MPI_Allreduce(rec->before, before, (MAX_GEN + 1) * MAX_T, MPI_UINT64_T, MPI_MAX, surv);
    MPI_Allreduce(rec->after, after, (MAX_GEN + 1) * MAX_T, MPI_UINT64_T, MPI_MAX, surv);
    for (int gen = 2; gen <= g.kill_gen; gen++) {
        MT_ASSERT(lo[gen] == gen_at[gen] && gen_at[gen] > gen_at[gen - 1],
                  "generation %d: switch steps differ between survivors (%lld..%lld) or do not "
                  "follow generation %d's (%lld)",
                  gen, (long long)lo[gen], (long long)gen_at[gen], gen - 1,
                  (long long)gen_at[gen - 1]);
        for (size_t i = 0; i < rec->n_tensors; i++)
            MT_ASSERT(before[gen][i] != 0 && before[gen][i] == after[gen][i],
                      "generation %d (resize at step %lld): tensor %s differs after the reshard "
                      "(hash %016llx before, %016llx after)",
                      gen, (long long)gen_at[gen], tide_collection_tensor(rec->coll, i)->name,
                      (unsigned long long)before[gen][i], (unsigned long long)after[gen][i]);
    }
}

/* Rank 0's copy of the recovery's layout to the survivors that took no part in it (idle
   ranks in neither of its layouts). Collective over surv, whose rank 0 is rank 0. */
void share_recovery_layout(record *rec, MPI_Comm surv)
{
    int hdr[5] = {0};
    const tide_layout_t *l = rec->recover;
    if (g_rank == 0) {
        MT_ASSERT(l != NULL, "rank 0 recorded no recovery layout");
        hdr[0] = l->dp, hdr[1] = l->tp, hdr[2] = l->pp, hdr[3] = l->num_layers;
        hdr[4] = l->micro_batches;
    }
    MPI_Bcast(hdr, 5, MPI_INT, 0, surv);
    tide_layout_t *mine = NULL;
    MT_OK(tide_layout_new(&mine, hdr[0], hdr[1], hdr[2], hdr[3], hdr[4]));
    if (g_rank == 0) {
        MT_OK(tide_layout_set_stages(mine, l->stage_start));
        memcpy(mine->worker, l->worker, tide_layout_size(l) * sizeof *l->worker);
    }
    MPI_Bcast(mine->stage_start, hdr[2] + 1, MPI_INT, 0, surv);
    MPI_Bcast(mine->worker, (int)tide_layout_size(mine), MPI_INT32_T, 0, surv);
    if (rec->recover != NULL) {
        const tide_layout_t *a = rec->recover;
        MT_ASSERT(a->dp == mine->dp && a->tp == mine->tp && a->pp == mine->pp &&
                      memcmp(a->stage_start, mine->stage_start,
                             (size_t)(a->pp + 1) * sizeof *a->stage_start) == 0 &&
                      memcmp(a->worker, mine->worker, tide_layout_size(a) * sizeof *a->worker) == 0,
                  "this survivor's recovery layout is not rank 0's");
        tide_layout_destroy(&mine);
        return;
    }
    rec->recover = mine;
}

/* The switches pool rank r takes part in: each whose old or new layout holds it. */
int switches_of(const record *rec, int r)
{
    int n = 0;
    for (int gen = 2; gen <= g.kill_gen; gen++)
        n += layout_has(rec->layouts[gen - 1], r) || layout_has(rec->layouts[gen], r);
    return n + (layout_has(rec->layouts[g.kill_gen], r) || layout_has(rec->recover, r));
}

/* How often step k must have run on the survivors: once on every live member of each
   generation that ran it (the victim's generation up to g.done1: with a rollback, the
   steps after the checkpoint's run there and again after the recovery). */
int runs_of(const record *rec, const int64_t *gen_at, int k)
{
    int runs = 0;
    for (int gen = 1; gen <= g.kill_gen; gen++) {
        int64_t to = gen < g.kill_gen ? gen_at[gen + 1] : g.done1;
        if (k >= gen_at[gen] && k < to)
            runs +=
                (int)tide_layout_size(rec->layouts[gen]) - layout_has(rec->layouts[gen], g.victim);
    }
    if (k >= g.switch_at)
        runs += (int)tide_layout_size(rec->recover);
    return runs;
}
