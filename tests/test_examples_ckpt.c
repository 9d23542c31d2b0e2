/*
 * MPI integration test of train_mlp's distributed checkpoints (examples/mlp_ckpt.h), 8
 * ranks, host memory: a run in (dp 2, tp 2, pp 2) saves after 6 steps; a relaunched
 * model in (dp 1, tp 4, pp 2; stages 0-2,3-3) loads it. Checked, with and without
 * ZeRO-1: the full state gathered after the load is bit-identical to the one gathered
 * before the save (step counter and data cursor included); the resumed run's losses
 * match the never-stopped run's within relative 1e-5; a missing checkpoint, one of
 * another model and a truncated shard file are refused with the right status.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/alloc.h"
#include "examples/mlp_ckpt.h"
#include "examples/mlp_mpi.h"
#include "mpi_test.h"

#define SAVE_AT 6
#define STEPS   10
#define REL_TOL 1e-5

static int g_rank;

static tide_layout_t *layout(const tide_mlp_config *cfg, int dp, int tp, int pp, const char *stages)
{
    tide_layout_t *l = NULL;
    MT_OK(tide_layout_new(&l, dp, tp, pp, cfg->layers, 4));
    if (stages != NULL)
        MT_OK(tide_layout_parse_stages(l, stages));
    return l;
}

/* Runs steps [from, to) of m over mpi; loss[s] on every rank. */
static void run(tide_mlp_t *m, tide_mlp_mpi_t *mpi, int from, int to, double *loss)
{
    for (int s = from; s < to; s++) {
        double v = 0.0;
        if (tide_mlp_active(m))
            MT_OK(tide_mlp_step(m, tide_mlp_mpi_comm(mpi), &v));
        MPI_Allreduce(&v, &loss[s], 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    }
}

static void round_trip(int zero1, const char *dir)
{
    tide_mlp_config cfg;
    tide_mlp_config_default(&cfg);
    cfg.zero1 = zero1;
    double ref[STEPS], got[STEPS];

    /* the never-stopped run */
    tide_layout_t *la = layout(&cfg, 2, 2, 2, NULL);
    tide_mlp_t *m = NULL;
    tide_mlp_mpi_t *mpi = NULL;
    MT_OK(tide_mlp_new(&m, &cfg, la, g_rank, TIDE_MLP_CPU));
    MT_OK(tide_mlp_init(m));
    MT_OK(tide_mlp_mpi_new(&mpi, MPI_COMM_WORLD, la));
    run(m, mpi, 0, STEPS, ref);
    tide_mlp_mpi_destroy(&mpi);
    tide_mlp_destroy(&m);

    /* the stopped run: SAVE_AT steps, gather, save */
    MT_OK(tide_mlp_new(&m, &cfg, la, g_rank, TIDE_MLP_CPU));
    MT_OK(tide_mlp_init(m));
    MT_OK(tide_mlp_mpi_new(&mpi, MPI_COMM_WORLD, la));
    run(m, mpi, 0, SAVE_AT, got);
    void **before = NULL;
    MT_OK(tide_mlp_gather(m, MPI_COMM_WORLD, 0, &before));
    MT_OK(tide_mlp_ckpt_save(m, g_rank, dir));
    tide_mlp_mpi_destroy(&mpi);
    tide_mlp_destroy(&m);
    MPI_Barrier(MPI_COMM_WORLD); /* every shard file is written */

    /* the relaunch under another layout */
    tide_layout_t *lb = layout(&cfg, 1, 4, 2, "0-2,3-3");
    MT_OK(tide_mlp_new(&m, &cfg, lb, g_rank, TIDE_MLP_CPU));
    MT_OK(tide_mlp_ckpt_load(m, g_rank, dir));
    MT_ASSERT(tide_mlp_step_count(m) == SAVE_AT, "loaded step %lld",
              (long long)tide_mlp_step_count(m));
    void **after = NULL;
    MT_OK(tide_mlp_gather(m, MPI_COMM_WORLD, 0, &after));
    const tide_collection_t *c = tide_mlp_collection(m);
    if (g_rank == 0)
        for (size_t i = 0; i < tide_collection_size(c); i++)
            MT_ASSERT(
                memcmp(before[i], after[i], tide_tensor_bytes(tide_collection_tensor(c, i))) == 0,
                "zero1 %d: tensor %s differs after the checkpoint round trip", zero1,
                tide_collection_tensor(c, i)->name);
    tide_mlp_full_free(c, &before);
    tide_mlp_full_free(c, &after);
    MT_OK(tide_mlp_mpi_new(&mpi, MPI_COMM_WORLD, lb));
    run(m, mpi, SAVE_AT, STEPS, got);
    for (int s = 0; s < STEPS; s++) {
        double rel = fabs(got[s] - ref[s]) / fabs(ref[s]);
        MT_ASSERT(rel <= REL_TOL, "zero1 %d step %d: loss %.9g resumed vs %.9g never stopped",
                  zero1, s, got[s], ref[s]);
    }
    tide_mlp_mpi_destroy(&mpi);
    tide_mlp_destroy(&m);

    /* refusals, on rank 0 alone (loading is local): a (1,1,1) model reads every file */
    if (g_rank == 0) {
        tide_layout_t *l1 = layout(&cfg, 1, 1, 1, NULL);
        MT_OK(tide_mlp_new(&m, &cfg, l1, 0, TIDE_MLP_CPU));
        MT_OK(tide_mlp_ckpt_load(m, 0, dir));
        MT_ASSERT(tide_mlp_step_count(m) == SAVE_AT, "single-rank load");
        char missing[600];
        snprintf(missing, sizeof missing, "%s/nothing-here", dir);
        tide_status rc = tide_mlp_ckpt_load(m, 0, missing);
        MT_ASSERT(rc == TIDE_ERR_NOT_FOUND && strstr(tide_last_error(), "layout.ckpt") != NULL,
                  "missing checkpoint: %s (%s)", tide_status_name(rc), tide_last_error());
        tide_mlp_destroy(&m);
        tide_mlp_config other = cfg;
        other.hidden = 32;
        MT_OK(tide_mlp_new(&m, &other, l1, 0, TIDE_MLP_CPU));
        rc = tide_mlp_ckpt_load(m, 0, dir);
        MT_ASSERT(rc == TIDE_ERR_INVALID && strstr(tide_last_error(), "--hidden") != NULL,
                  "checkpoint of another model: %s (%s)", tide_status_name(rc), tide_last_error());
        tide_mlp_destroy(&m);
        char shard[600];
        snprintf(shard, sizeof shard, "%s/rank-5.ckpt", dir);
        MT_ASSERT(truncate(shard, 1000) == 0, "truncate %s", shard);
        MT_OK(tide_mlp_new(&m, &cfg, l1, 0, TIDE_MLP_CPU));
        rc = tide_mlp_ckpt_load(m, 0, dir);
        MT_ASSERT(rc == TIDE_ERR_IO && strstr(tide_last_error(), "rank-5.ckpt") != NULL,
                  "truncated shard: %s (%s)", tide_status_name(rc), tide_last_error());
        tide_mlp_destroy(&m);
        tide_layout_destroy(&l1);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    tide_layout_destroy(&la);
    tide_layout_destroy(&lb);
}

int main(int argc, char **argv)
{
    int prov = 0, size = 0;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &prov);
    MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    MT_ASSERT(size == 8, "run with 8 ranks, not %d", size);
    char dir[256] = "";
    if (g_rank == 0) {
        snprintf(dir, sizeof dir, "/tmp/tide-ckpt-XXXXXX");
        MT_ASSERT(mkdtemp(dir) != NULL, "mkdtemp");
    }
    MPI_Bcast(dir, sizeof dir, MPI_CHAR, 0, MPI_COMM_WORLD);
    for (int zero1 = 0; zero1 <= 1; zero1++) {
        char sub[300];
        snprintf(sub, sizeof sub, "%s/z%d", dir, zero1); /* created by the save */
        round_trip(zero1, sub);
    }
    if (g_rank == 0) {
        char cmd[400];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
        MT_ASSERT(system(cmd) == 0, "rm %s", dir);
    }
    mt_pass("test_examples_ckpt");
    MPI_Finalize();
    return 0;
}
