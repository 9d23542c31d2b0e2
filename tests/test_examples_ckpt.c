/*
 * MPI integration test of train_mlp's checkpoints (examples/mlp_ckpt.h on ckpt/), 8
 * ranks, host memory, 6 layers: a run in (dp 2, tp 2, pp 2) saves asynchronously after
 * 4 steps (training on meanwhile) and synchronously after 6; relaunched models in
 * (1, 4, 2; stages 0-3,4-5), (4, 1, 2) and (1, 2, 4; stages 0-0,1-2,3-3,4-5) load it.
 * Checked, with and without ZeRO-1: the full state gathered after each load is
 * bit-identical to the one gathered before the save (step counter and data cursor
 * included); each resumed run's losses match the never-stopped run's within relative
 * 1e-5; a missing checkpoint, one of another model, a bit-flipped and a truncated shard
 * are refused naming the file, and the checkpoint before the damaged one still loads.
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
#include "tests/support/scenario.h"

#define SAVE_AT 6
#define STEPS   10
#define REL_TOL 1e-5

static int g_rank;
static mt_layout g_first; /* the layout saved from (its scenario's first) */

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
    cfg.layers = 6;
    double ref[STEPS], got[STEPS];

    /* the never-stopped run */
    tide_layout_t *la =
        layout(&cfg, g_first.dp, g_first.tp, g_first.pp, g_first.stages[0] ? g_first.stages : NULL);
    tide_mlp_t *m = NULL;
    tide_mlp_mpi_t *mpi = NULL;
    MT_OK(tide_mlp_new(&m, &cfg, la, g_rank, TIDE_MLP_CPU));
    MT_OK(tide_mlp_init(m));
    MT_OK(tide_mlp_mpi_new(&mpi, MPI_COMM_WORLD, la));
    run(m, mpi, 0, STEPS, ref);
    tide_mlp_mpi_destroy(&mpi);
    tide_mlp_destroy(&m);

    /* the stopped run: a checkpoint at SAVE_AT - 2 (asynchronous) and one at SAVE_AT */
    MT_OK(tide_mlp_new(&m, &cfg, la, g_rank, TIDE_MLP_CPU));
    MT_OK(tide_mlp_init(m));
    MT_OK(tide_mlp_mpi_new(&mpi, MPI_COMM_WORLD, la));
    run(m, mpi, 0, SAVE_AT - 2, got);
    tide_ckpt_saver_t *saver = NULL;
    MT_OK(tide_ckpt_saver_new(&saver));
    MT_OK(tide_mlp_ckpt_save_async(saver, m, g_rank, dir, NULL));
    run(m, mpi, SAVE_AT - 2, SAVE_AT, got); /* training goes on while it is written */
    MT_OK(tide_ckpt_saver_wait(saver));
    tide_ckpt_saver_destroy(&saver);
    void **before = NULL;
    MT_OK(tide_mlp_gather(m, MPI_COMM_WORLD, 0, &before));
    MT_OK(tide_mlp_ckpt_save(m, g_rank, dir, NULL));
    tide_mlp_mpi_destroy(&mpi);
    tide_mlp_destroy(&m);
    MPI_Barrier(MPI_COMM_WORLD); /* the checkpoint is published */

    /* relaunches under other layouts and uneven stages */
    const struct {
        int dp, tp, pp;
        const char *stages;
    } to[] = {{1, 4, 2, "0-3,4-5"}, {4, 1, 2, NULL}, {1, 2, 4, "0-0,1-2,3-3,4-5"}};
    tide_collection_t *c = NULL;
    MT_OK(tide_mlp_collection_new(&cfg, &c));
    for (size_t k = 0; k < sizeof to / sizeof to[0]; k++) {
        tide_layout_t *lb = layout(&cfg, to[k].dp, to[k].tp, to[k].pp, to[k].stages);
        MT_OK(tide_mlp_new(&m, &cfg, lb, g_rank, TIDE_MLP_CPU));
        int64_t loaded = -1;
        MT_OK(tide_mlp_ckpt_load(m, g_rank, dir, INT64_MAX, &loaded));
        MT_ASSERT(!tide_mlp_active(m) || (loaded == SAVE_AT && tide_mlp_step_count(m) == SAVE_AT),
                  "loaded step %lld", (long long)loaded);
        void **after = NULL;
        MT_OK(tide_mlp_gather(m, MPI_COMM_WORLD, 0, &after));
        if (g_rank == 0)
            for (size_t i = 0; i < tide_collection_size(c); i++)
                MT_ASSERT(memcmp(before[i], after[i],
                                 tide_tensor_bytes(tide_collection_tensor(c, i))) == 0,
                          "zero1 %d: tensor %s differs after loading into (%d, %d, %d)", zero1,
                          tide_collection_tensor(c, i)->name, to[k].dp, to[k].tp, to[k].pp);
        tide_mlp_full_free(c, &after);
        MT_OK(tide_mlp_mpi_new(&mpi, MPI_COMM_WORLD, lb));
        run(m, mpi, SAVE_AT, STEPS, got);
        for (int s = 0; s < STEPS; s++) {
            double rel = fabs(got[s] - ref[s]) / fabs(ref[s]);
            MT_ASSERT(rel <= REL_TOL,
                      "zero1 %d (%d, %d, %d) step %d: loss %.9g resumed vs %.9g never stopped",
                      zero1, to[k].dp, to[k].tp, to[k].pp, s, got[s], ref[s]);
        }
        tide_mlp_mpi_destroy(&mpi);
        tide_mlp_destroy(&m);
        tide_layout_destroy(&lb);
    }

    /* refusals, on rank 0 alone (loading is local): a (1,1,1) model reads every file */
    if (g_rank == 0) {
        tide_layout_t *l1 = layout(&cfg, 1, 1, 1, NULL);
        MT_OK(tide_mlp_new(&m, &cfg, l1, 0, TIDE_MLP_CPU));
        MT_OK(tide_mlp_ckpt_load(m, 0, dir, INT64_MAX, NULL));
        MT_ASSERT(tide_mlp_step_count(m) == SAVE_AT, "single-rank load");
        char missing[600];
        snprintf(missing, sizeof missing, "%s/nothing-here", dir);
        tide_status rc = tide_mlp_ckpt_load(m, 0, missing, INT64_MAX, NULL);
        MT_ASSERT(rc == TIDE_ERR_NOT_FOUND && strstr(tide_last_error(), missing) != NULL,
                  "missing checkpoint: %s (%s)", tide_status_name(rc), tide_last_error());
        tide_mlp_destroy(&m);
        tide_mlp_config other = cfg;
        other.hidden = 32;
        MT_OK(tide_mlp_new(&m, &other, l1, 0, TIDE_MLP_CPU));
        rc = tide_mlp_ckpt_load(m, 0, dir, INT64_MAX, NULL);
        MT_ASSERT(rc == TIDE_ERR_INVALID && strstr(tide_last_error(), "--hidden") != NULL,
                  "checkpoint of another model: %s (%s)", tide_status_name(rc), tide_last_error());
        tide_mlp_destroy(&m);
        char shard[700];
        snprintf(shard, sizeof shard, "%s/step-%012d/shard-p1-d0-t1.bin", dir, SAVE_AT);
        FILE *f = fopen(shard, "r+b");
        MT_ASSERT(f != NULL && fseek(f, 100, SEEK_SET) == 0, "open %s", shard);
        int ch = fgetc(f);
        MT_ASSERT(fseek(f, 100, SEEK_SET) == 0 && fputc(ch ^ 0x10, f) != EOF, "flip %s", shard);
        fclose(f);
        MT_OK(tide_mlp_new(&m, &cfg, l1, 0, TIDE_MLP_CPU));
        rc = tide_mlp_ckpt_load(m, 0, dir, INT64_MAX, NULL);
        MT_ASSERT(rc == TIDE_ERR_INVALID && strstr(tide_last_error(), shard) != NULL &&
                      strstr(tide_last_error(), "corrupted") != NULL,
                  "bit-flipped shard: %s (%s)", tide_status_name(rc), tide_last_error());
        MT_ASSERT(truncate(shard, 1000) == 0, "truncate %s", shard);
        rc = tide_mlp_ckpt_load(m, 0, dir, INT64_MAX, NULL);
        MT_ASSERT(rc == TIDE_ERR_INVALID && strstr(tide_last_error(), shard) != NULL &&
                      strstr(tide_last_error(), "truncated") != NULL,
                  "truncated shard: %s (%s)", tide_status_name(rc), tide_last_error());
        /* the checkpoint before it still loads */
        int64_t loaded = -1;
        MT_OK(tide_mlp_ckpt_load(m, 0, dir, SAVE_AT, &loaded));
        MT_ASSERT(loaded == SAVE_AT - 2 && tide_mlp_step_count(m) == SAVE_AT - 2,
                  "fallback loaded step %lld", (long long)loaded);
        tide_mlp_destroy(&m);
        tide_layout_destroy(&l1);
    }
    tide_mlp_full_free(c, &before);
    tide_collection_destroy(&c);
    MPI_Barrier(MPI_COMM_WORLD);
    tide_layout_destroy(&la);
}

/* The scenario (tests/scenarios/test_examples_ckpt.h): one row. */
static const mt_row scenarios[] = {
#define ROW(name, ranks, timeout, labels, mpi, first, resizes, kill, ckpt, gen, status)            \
    {name, ranks, timeout, labels, mpi, first, resizes, kill, ckpt, gen, status},
#include "scenarios/test_examples_ckpt.h"
#undef ROW
};

int main(int argc, char **argv)
{
    const mt_row *row = NULL;
    if (MT_ROWS_SELECT(argc, argv, 1, scenarios, &row))
        return 0; /* --list */
    mt_scenario sc;
    if (row == NULL || mt_scenario_parse(row, &sc) != TIDE_OK || !sc.has_first) {
        fprintf(stderr, "test_examples_ckpt: its scenario needs a first layout\n");
        return 2;
    }
    g_first = sc.first;
    int prov = 0, size = 0;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &prov);
    MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    MT_ASSERT(size == row->ranks, "run with %d ranks, not %d", row->ranks, size);
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
