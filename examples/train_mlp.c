/*
 * train_mlp: trains the tide_mlp model (Megatron-style MLP blocks) on the synthetic
 * next-token task in one (dp, tp, pp) layout, launched as
 *   mpirun -np <dp*tp*pp> train_mlp --dp 2 --tp 2 --pp 2 [--stages 0-2,3-3] ...
 * Worker id = MPI rank (tp fastest, then dp, then pp); extra ranks stay idle. Rank 0
 * prints step, loss (the global mean of the batch, identical on every rank), layout and
 * throughput, and writes "step loss" lines to --loss-out. Until libtide exists the
 * layout is fixed for the run; the model is already laid out for live resharding.
 */
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/clock.h"
#include "core/error.h"
#include "core/log.h"
#include "core/opts.h"
#include "examples/mlp.h"
#include "examples/mlp_mpi.h"

#define SUBSYS "train_mlp"

static int g_rank;

static void die(tide_status rc, const char *what)
{
    fprintf(stderr, "train_mlp: rank %d: %s: %s: %s\n", g_rank, what, tide_strerror(rc),
            tide_last_error());
    fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 2);
    exit(2);
}

#define RUN(expr, what)                                                                            \
    do {                                                                                           \
        tide_status run__rc = (expr);                                                              \
        if (run__rc != TIDE_OK)                                                                    \
            die(run__rc, what);                                                                    \
    } while (0)

static int local_rank(void)
{
    MPI_Comm node;
    int r = 0;
    if (MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node) !=
        MPI_SUCCESS)
        return 0;
    MPI_Comm_rank(node, &r);
    MPI_Comm_free(&node);
    return r;
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int size = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);

    tide_mlp_config cfg;
    tide_mlp_config_default(&cfg);
    long long layers, hidden, ffn, vocab, seq, batch, micro, steps, seed, dp, tp, pp, every;
    double lr;
    int zero1 = 0;
    const char *stages = NULL, *device = NULL, *loss_out = NULL, *log_level = NULL;
    const tide_opt opts[] = {
        {"layers", "TIDE_MLP_LAYERS", TIDE_OPT_INT, &layers, "4", "MLP blocks", 1, 100000},
        {"hidden", "TIDE_MLP_HIDDEN", TIDE_OPT_INT, &hidden, "64", "model width", 1, 1 << 20},
        {"ffn", "TIDE_MLP_FFN", TIDE_OPT_INT, &ffn, "256", "fc1 output width", 1, 1 << 22},
        {"vocab", "TIDE_MLP_VOCAB", TIDE_OPT_INT, &vocab, "64", "tokens", 2, 1 << 24},
        {"seq", "TIDE_MLP_SEQ", TIDE_OPT_INT, &seq, "16", "tokens per sample", 1, 1 << 20},
        {"global-batch", "TIDE_MLP_GLOBAL_BATCH", TIDE_OPT_INT, &batch, "32",
         "samples per step over all dp ranks", 1, 1 << 24},
        {"micro-batches", "TIDE_MLP_MICRO_BATCHES", TIDE_OPT_INT, &micro, "4",
         "micro-batches per step and dp rank", 1, 1 << 20},
        {"steps", "TIDE_MLP_STEPS", TIDE_OPT_INT, &steps, "30", "training steps", 0, 1 << 30},
        {"lr", "TIDE_MLP_LR", TIDE_OPT_DOUBLE, &lr, "0.003", "Adam learning rate", 0, 0},
        {"seed", "TIDE_MLP_SEED", TIDE_OPT_INT, &seed, "1234", "model, task and data seed", 0,
         INT64_MAX},
        {"dp", "TIDE_MLP_DP", TIDE_OPT_INT, &dp, "1", "data-parallel degree", 1, 1 << 16},
        {"tp", "TIDE_MLP_TP", TIDE_OPT_INT, &tp, "1", "tensor-parallel degree", 1, 1 << 16},
        {"pp", "TIDE_MLP_PP", TIDE_OPT_INT, &pp, "1", "pipeline stages", 1, 1 << 16},
        {"stages", "TIDE_MLP_STAGES", TIDE_OPT_STRING, &stages, NULL,
         "layer ranges per stage, e.g. 0-2,3-3 (default: even)", 0, 0},
        {"zero1", "TIDE_MLP_ZERO1", TIDE_OPT_BOOL, &zero1, "0",
         "shard Adam moments over dp (ZeRO-1)", 0, 0},
        {"device", "TIDE_MLP_DEVICE", TIDE_OPT_STRING, &device, "cpu", "cpu or cuda", 0, 0},
        {"print-every", "TIDE_MLP_PRINT_EVERY", TIDE_OPT_INT, &every, "1",
         "print every N steps (and the last)", 1, 1 << 30},
        {"loss-out", "TIDE_MLP_LOSS_OUT", TIDE_OPT_STRING, &loss_out, NULL,
         "write 'step loss' lines here (rank 0)", 0, 0},
        {"log", "TIDE_LOG", TIDE_OPT_STRING, &log_level, NULL, "error, warn, info, debug", 0, 0},
        {NULL, NULL, 0, NULL, NULL, NULL, 0, 0},
    };
    int help = 0, npos = 0;
    tide_status rc = tide_opts_parse(opts, argc, argv, &npos, &help);
    if (rc == TIDE_OK && npos > 0)
        rc = tide_errorf(TIDE_ERR_INVALID, "unexpected argument '%s'", argv[1]);
    if (rc == TIDE_OK && log_level != NULL) {
        tide_log_level lv;
        rc = tide_log_parse_level(log_level, &lv);
        if (rc == TIDE_OK)
            tide_log_set_level(lv);
        else
            rc = tide_errorf(TIDE_ERR_INVALID, "--log '%s': expected error, warn, info, debug",
                             log_level);
    }
    if (rc != TIDE_OK || help) {
        if (g_rank == 0) {
            if (rc != TIDE_OK)
                fprintf(stderr, "train_mlp: %s\n", tide_last_error());
            tide_opts_usage(rc != TIDE_OK ? stderr : stdout, "train_mlp",
                            "[--dp N --tp N --pp N] [options]  (under mpirun -np dp*tp*pp)", opts);
        }
        MPI_Finalize();
        return rc != TIDE_OK ? 2 : 0;
    }
    if (g_rank == 0)
        tide_opts_log(SUBSYS, opts);

    cfg.layers = (int)layers;
    cfg.hidden = hidden;
    cfg.ffn = ffn;
    cfg.vocab = vocab;
    cfg.seq = seq;
    cfg.global_batch = batch;
    cfg.seed = (uint64_t)seed;
    cfg.lr = lr;
    cfg.zero1 = zero1;
    tide_mlp_device dev;
    RUN(tide_mlp_device_parse(device, &dev), "--device");
    RUN(tide_mlp_config_check(&cfg), "model flags");
    if ((long long)size < dp * tp * pp) {
        RUN(tide_errorf(TIDE_ERR_INVALID,
                        "layout dp %lld x tp %lld x pp %lld needs %lld ranks; "
                        "mpirun started %d",
                        dp, tp, pp, dp * tp * pp, size),
            "layout");
    }

    tide_layout_t *layout = NULL;
    RUN(tide_layout_new(&layout, (int)dp, (int)tp, (int)pp, cfg.layers, (int)micro), "layout");
    if (stages != NULL)
        RUN(tide_layout_parse_stages(layout, stages), "--stages");
    RUN(tide_mlp_select_device(dev, local_rank()), "--device");

    tide_mlp_t *model = NULL;
    tide_mlp_mpi_t *mpi = NULL;
    RUN(tide_mlp_new(&model, &cfg, layout, g_rank, dev), "model");
    RUN(tide_mlp_init(model), "model init");
    RUN(tide_mlp_mpi_new(&mpi, MPI_COMM_WORLD, layout), "MPI groups");

    char lbuf[256];
    tide_layout_format(layout, lbuf, sizeof lbuf);
    uint64_t state_bytes = tide_collection_bytes(tide_mlp_collection(model));
    if (g_rank == 0) {
        printf("train_mlp: %d layers, hidden %lld, ffn %lld, vocab %lld, seq %lld, global batch "
               "%lld, %lld micro-batches, state %.2f MiB, device %s, layout %s, %d ranks (%d "
               "idle)\n",
               cfg.layers, hidden, ffn, vocab, seq, batch, micro,
               (double)state_bytes / (1024.0 * 1024.0), device, lbuf, size,
               size - (int)(dp * tp * pp));
        fflush(stdout);
    }
    FILE *lf = NULL;
    if (g_rank == 0 && loss_out != NULL) {
        lf = fopen(loss_out, "w");
        if (lf == NULL)
            RUN(tide_errorf(TIDE_ERR_IO, "cannot write --loss-out %s", loss_out), "--loss-out");
    }

    double first = NAN, last = NAN, timed_s = 0.0;
    long long timed_steps = 0;
    int active = tide_mlp_active(model);
    for (long long s = 0; s < steps && active; s++) {
        double loss = 0.0;
        uint64_t t0 = tide_now_ns();
        RUN(tide_mlp_step(model, tide_mlp_mpi_comm(mpi), &loss), "step");
        double dt = (double)(tide_now_ns() - t0) * 1e-9;
        if (s > 0) { /* the first step pays for page faults and warm-up */
            timed_s += dt;
            timed_steps++;
        }
        if (s == 0)
            first = loss;
        last = loss;
        if (g_rank == 0) {
            if (lf != NULL)
                fprintf(lf, "%lld %.9g\n", s, loss);
            if (s % every == 0 || s + 1 == steps) {
                printf("step %5lld  loss %.6f  layout %s  %.1f samples/s\n", s, loss, lbuf,
                       (double)batch / dt);
                fflush(stdout);
            }
        }
    }
    /* The loss must be the same number on every rank of the layout. */
    double lo = active ? last : INFINITY, hi = active ? last : -INFINITY;
    MPI_Allreduce(MPI_IN_PLACE, &lo, 1, MPI_DOUBLE, MPI_MIN, MPI_COMM_WORLD);
    MPI_Allreduce(MPI_IN_PLACE, &hi, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    int code = 0;
    if (g_rank == 0) {
        if (lf != NULL)
            fclose(lf);
        if (steps > 0) {
            printf("train_mlp: loss %.6f -> %.6f over %lld steps; %.1f samples/s (mean of steps "
                   "1..%lld); final loss identical on all ranks: %s\n",
                   first, last, steps, timed_steps ? (double)batch * timed_steps / timed_s : 0.0,
                   steps - 1, lo == hi ? "yes" : "NO");
            code = lo == hi ? 0 : 1;
        }
        fflush(stdout);
    }
    MPI_Bcast(&code, 1, MPI_INT, 0, MPI_COMM_WORLD);
    tide_mlp_mpi_destroy(&mpi);
    tide_mlp_destroy(&model);
    tide_layout_destroy(&layout);
    MPI_Finalize();
    return code;
}
