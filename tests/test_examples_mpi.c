/*
 * MPI integration tests of train_mlp's model (tide_mlp over the MPI comm), run under
 * mpirun with 2 or 8 ranks: test_examples_mpi SCENARIO, a row of
 * tests/scenarios/test_examples_mpi.h (--list prints them), each one of these runs:
 *   layouts   the loss of every step in each layout that fits the world matches the
 *             single-process run within relative 1e-5 and is identical on every rank
 *   converge  the default model's loss goes down over 30 steps in (dp 2, tp 2, pp 2)
 *   relayout  a run moved across layouts (gather / new buffers / scatter) keeps its
 *             state bit for bit and follows the never-moved run's losses
 * Small model (hidden 64, ffn 256, vocab 64, seq 16, 4 layers): seconds per mode.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "examples/mlp.h"
#include "examples/mlp_mpi.h"
#include "mpi_test.h"
#include "tests/support/scenario.h"

#define MAX_STEPS 128
#define REL_TOL   1e-5

typedef struct spec {
    int dp, tp, pp, micro, zero1;
    const char *stages;
} spec;

static int g_rank, g_size;

static void reference(const tide_mlp_config *cfg, int steps, double *loss)
{
    /* The single-process run, on rank 0, shared with everyone. */
    if (g_rank == 0) {
        tide_layout_t *l = NULL;
        tide_mlp_t *m = NULL;
        tide_mlp_comm self;
        tide_mlp_comm_self(&self);
        MT_OK(tide_layout_new(&l, 1, 1, 1, cfg->layers, 1));
        MT_OK(tide_mlp_new(&m, cfg, l, 0, TIDE_MLP_CPU));
        MT_OK(tide_mlp_init(m));
        for (int s = 0; s < steps; s++)
            MT_OK(tide_mlp_step(m, &self, &loss[s]));
        tide_mlp_destroy(&m);
        tide_layout_destroy(&l);
    }
    MPI_Bcast(loss, steps, MPI_DOUBLE, 0, MPI_COMM_WORLD);
}

static tide_layout_t *make_layout(const tide_mlp_config *cfg, const spec *sp)
{
    tide_layout_t *l = NULL;
    MT_OK(tide_layout_new(&l, sp->dp, sp->tp, sp->pp, cfg->layers, sp->micro));
    if (sp->stages != NULL)
        MT_OK(tide_layout_parse_stages(l, sp->stages));
    return l;
}

/* Checks that v is the same number on every active rank; returns it on every rank. */
static double same_everywhere(int active, double v, const char *what)
{
    double lo = active ? v : INFINITY, hi = active ? v : -INFINITY;
    MPI_Allreduce(MPI_IN_PLACE, &lo, 1, MPI_DOUBLE, MPI_MIN, MPI_COMM_WORLD);
    MPI_Allreduce(MPI_IN_PLACE, &hi, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    MT_ASSERT(lo == hi, "%s differs across ranks: %.9g vs %.9g", what, lo, hi);
    return lo;
}

static void run_layouts(int steps)
{
    tide_mlp_config base;
    tide_mlp_config_default(&base);
    double ref[MAX_STEPS];
    reference(&base, steps, ref);
    const spec specs[] = {
        {1, 1, 1, 4, 0, NULL},          {2, 1, 1, 2, 0, NULL}, {1, 2, 1, 1, 0, NULL},
        {1, 1, 2, 4, 0, NULL},          {2, 2, 2, 4, 0, NULL}, {1, 4, 2, 4, 0, NULL},
        {1, 1, 3, 2, 0, "0-1,2-2,3-3"}, {2, 1, 4, 8, 0, NULL}, {8, 1, 1, 4, 0, NULL},
        {2, 2, 2, 2, 1, NULL},          {4, 2, 1, 2, 1, NULL}, {2, 1, 1, 1, 1, NULL},
    };
    int ran = 0;
    for (size_t k = 0; k < sizeof specs / sizeof specs[0]; k++) {
        const spec *sp = &specs[k];
        if (sp->dp * sp->tp * sp->pp > g_size)
            continue;
        tide_mlp_config cfg = base;
        cfg.zero1 = sp->zero1;
        tide_layout_t *l = make_layout(&cfg, sp);
        tide_mlp_t *m = NULL;
        tide_mlp_mpi_t *mpi = NULL;
        MT_OK(tide_mlp_new(&m, &cfg, l, g_rank, TIDE_MLP_CPU));
        MT_OK(tide_mlp_init(m));
        MT_OK(tide_mlp_mpi_new(&mpi, MPI_COMM_WORLD, l));
        int active = tide_mlp_active(m);
        double worst = 0.0;
        for (int s = 0; s < steps; s++) {
            double loss = 0.0;
            if (active)
                MT_OK(tide_mlp_step(m, tide_mlp_mpi_comm(mpi), &loss));
            loss = same_everywhere(active, loss, "loss");
            double rel = fabs(loss - ref[s]) / fabs(ref[s]);
            worst = fmax(worst, rel);
            MT_ASSERT(rel <= REL_TOL,
                      "layout dp %d tp %d pp %d (M %d, zero1 %d) step %d: loss %.9g vs "
                      "single-process %.9g (rel %.2e)",
                      sp->dp, sp->tp, sp->pp, sp->micro, sp->zero1, s, loss, ref[s], rel);
        }
        if (g_rank == 0) {
            char buf[128];
            printf("layout %-40s M %d zero1 %d: %d steps, max rel diff %.2e\n",
                   tide_layout_format(l, buf, sizeof buf), sp->micro, sp->zero1, steps, worst);
            fflush(stdout);
        }
        ran++;
        tide_mlp_mpi_destroy(&mpi);
        tide_mlp_destroy(&m);
        tide_layout_destroy(&l);
    }
    MT_ASSERT(ran >= 3, "only %d layouts fit %d ranks", ran, g_size);
}

static void run_converge(int steps)
{
    tide_mlp_config cfg;
    tide_mlp_config_default(&cfg);
    spec sp = {2, 2, 2, 4, 0, NULL};
    if (g_size < 8)
        sp.dp = sp.tp = 1;
    tide_layout_t *l = make_layout(&cfg, &sp);
    tide_mlp_t *m = NULL;
    tide_mlp_mpi_t *mpi = NULL;
    MT_OK(tide_mlp_new(&m, &cfg, l, g_rank, TIDE_MLP_CPU));
    MT_OK(tide_mlp_init(m));
    MT_OK(tide_mlp_mpi_new(&mpi, MPI_COMM_WORLD, l));
    int active = tide_mlp_active(m);
    double first = 0.0, last = 0.0, best_first5 = INFINITY;
    for (int s = 0; s < steps; s++) {
        double loss = 0.0;
        if (active)
            MT_OK(tide_mlp_step(m, tide_mlp_mpi_comm(mpi), &loss));
        loss = same_everywhere(active, loss, "loss");
        if (s == 0)
            first = loss;
        if (s < 5)
            best_first5 = fmin(best_first5, loss);
        last = loss;
    }
    if (g_rank == 0)
        printf("converge: loss %.4f -> %.4f over %d steps (log vocab = %.4f)\n", first, last, steps,
               log((double)cfg.vocab));
    MT_ASSERT(fabs(first - log((double)cfg.vocab)) < 0.5, "initial loss %g far from log(V)", first);
    MT_ASSERT(last < 0.75 * first && last < best_first5, "loss did not go down: %g -> %g", first,
              last);
    tide_mlp_mpi_destroy(&mpi);
    tide_mlp_destroy(&m);
    tide_layout_destroy(&l);
}

static int states_equal(const tide_collection_t *c, void **a, void **b)
{
    for (size_t i = 0; i < tide_collection_size(c); i++)
        if (memcmp(a[i], b[i], tide_tensor_bytes(tide_collection_tensor(c, i))) != 0) {
            fprintf(stderr, "tensor %s differs\n", tide_collection_tensor(c, i)->name);
            return 0;
        }
    return 1;
}

static void run_relayout(int per)
{
    tide_mlp_config cfg;
    tide_mlp_config_default(&cfg);
    const spec seq8[] = {{2, 2, 2, 4, 0, NULL},
                         {1, 4, 2, 2, 0, "0-0,1-3"},
                         {4, 1, 1, 2, 0, NULL},
                         {1, 2, 2, 4, 0, NULL}};
    const spec seq2[] = {{1, 1, 2, 2, 0, NULL}, {2, 1, 1, 1, 0, NULL}, {1, 2, 1, 4, 0, NULL}};
    const spec *seq = g_size >= 8 ? seq8 : seq2;
    int n = g_size >= 8 ? 4 : 3;
    double ref[MAX_STEPS];
    reference(&cfg, n * per, ref);
    tide_layout_t *l = make_layout(&cfg, &seq[0]);
    tide_mlp_t *m = NULL;
    tide_mlp_mpi_t *mpi = NULL;
    MT_OK(tide_mlp_new(&m, &cfg, l, g_rank, TIDE_MLP_CPU));
    MT_OK(tide_mlp_init(m));
    tide_layout_destroy(&l);
    int step = 0;
    for (int k = 0; k < n; k++) {
        if (k > 0) {
            void **before = NULL, **after = NULL;
            MT_OK(tide_mlp_gather(m, MPI_COMM_WORLD, 0, &before));
            l = make_layout(&cfg, &seq[k]);
            MT_OK(tide_mlp_relayout_via_root(m, MPI_COMM_WORLD, 0, l));
            tide_layout_destroy(&l);
            MT_OK(tide_mlp_gather(m, MPI_COMM_WORLD, 0, &after));
            if (g_rank == 0)
                MT_ASSERT(states_equal(tide_mlp_collection(m), before, after),
                          "state changed across the move to layout %d", k);
            tide_mlp_full_free(tide_mlp_collection(m), &before);
            tide_mlp_full_free(tide_mlp_collection(m), &after);
        }
        MT_OK(tide_mlp_mpi_new(&mpi, MPI_COMM_WORLD, tide_mlp_layout(m)));
        int active = tide_mlp_active(m);
        if (active)
            MT_ASSERT(tide_mlp_step_count(m) == step, "step counter %lld, expected %d",
                      (long long)tide_mlp_step_count(m), step);
        for (int s = 0; s < per; s++, step++) {
            double loss = 0.0;
            if (active)
                MT_OK(tide_mlp_step(m, tide_mlp_mpi_comm(mpi), &loss));
            loss = same_everywhere(active, loss, "loss");
            double rel = fabs(loss - ref[step]) / fabs(ref[step]);
            MT_ASSERT(rel <= REL_TOL, "layout %d step %d: loss %.9g vs never-moved %.9g", k, step,
                      loss, ref[step]);
        }
        if (g_rank == 0) {
            char buf[128];
            printf("relayout: %s ran steps %d-%d matching the never-moved run\n",
                   tide_layout_format(tide_mlp_layout(m), buf, sizeof buf), step - per, step - 1);
            fflush(stdout);
        }
        tide_mlp_mpi_destroy(&mpi);
    }
    tide_mlp_destroy(&m);
}

/* A scenario: the generic columns, then the run and its steps. */
typedef struct mpi_row {
    mt_row r;
    void (*run)(int steps);
    int steps;
} mpi_row;

static const mpi_row scenarios[] = {
#define ROW(name, ranks, timeout, labels, mpi, first, resizes, kill, ckpt, gen, status, ...)       \
    {{name, ranks, timeout, labels, mpi, first, resizes, kill, ckpt, gen, status}, __VA_ARGS__},
#include "scenarios/test_examples_mpi.h"
#undef ROW
};

int main(int argc, char **argv)
{
    const mt_row *row = NULL;
    if (MT_ROWS_SELECT(argc, argv, 1, scenarios, &row))
        return 0; /* --list */
    if (row == NULL) {
        fprintf(stderr, "usage: test_examples_mpi SCENARIO\n");
        return 2;
    }
    const mpi_row *sc = (const mpi_row *)(const void *)row;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &g_size);
    MT_ASSERT(g_size == row->ranks, "run scenario %s with %d ranks, not %d", row->name, row->ranks,
              g_size);
    MT_ASSERT(sc->steps > 0 && sc->steps <= 32, "steps %d out of range", sc->steps);
    char name[64];
    snprintf(name, sizeof name, "examples_mpi %s (np %d)", row->name, g_size);
    sc->run(sc->steps);
    mt_pass(name);
    MPI_Finalize();
    return 0;
}
