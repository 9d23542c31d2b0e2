/*
 * quickstart: the smallest elastic program on libtide, built out of the source tree
 * against the installed package (CMake's find_package(tide) or pkg-config's tide).
 *
 * Data parallel: every rank of the layout holds the whole weight vector "w" and its
 * momentum "v", computes the gradient of its share of the global batch, allreduces it
 * over dp and applies SGD with momentum. Gradients are small integers, so their sum is
 * exact in any order, and every rank applies the same update to the same values: the
 * state is bit-identical whatever dp is and however often the job was resized. At the
 * end, the first member prints the state's FNV-1a fingerprint.
 *
 * The runtime owns the state's buffers (tide_give_buffers): a switch rebuilds them in
 * place inside the memory the rank already holds (tide_reshard(t, NULL, ...)), and the
 * program takes them again from tide_buffers after each one. MPI_THREAD_MULTIPLE lets
 * libtide build an announced layout's communicators while the steps run.
 *
 *   tided &
 *   mpirun -np 2 quickstart --job q --dp 2 --steps 200 --step-ms 20 &
 *   tidectl resize q --dp 1      # rank 1 goes idle, rank 0 trains on alone
 *   tidectl resize q --dp 2      # rank 1 takes its replica back
 *
 * Checkpoints: --ckpt ROOT --ckpt-every N saves every N steps in the background
 * (tide_checkpoint_every); --resume ROOT starts from the newest complete checkpoint there,
 * whatever dp it was saved under (tide_checkpoint_find for its step, tide_checkpoint_load
 * into the buffers before they are handed over). `tidectl checkpoint q --dir ROOT` works too.
 */
#define _POSIX_C_SOURCE 200809L /* nanosleep under -std=c11 */

#include <inttypes.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <tide/tide.h>

typedef struct args {
    const char *job;
    int dp;
    int64_t steps;
    int step_ms;        /* sleep per step, ms: makes room for an operator's resize */
    int64_t n;          /* elements of w and v */
    int batch;          /* global batch: samples per step, split over dp */
    const char *ckpt;   /* checkpoint root of periodic saves (NULL: none) */
    int ckpt_every;     /* steps between saves */
    const char *resume; /* checkpoint root or directory to start from (NULL: fresh) */
} args;

static int usage(const char *msg)
{
    fprintf(stderr,
            "quickstart: %s\n"
            "usage: quickstart --job NAME [--dp N] [--steps N] [--step-ms MS] [--n N] "
            "[--batch N] [--ckpt ROOT --ckpt-every N] [--resume ROOT]\n",
            msg);
    return 2;
}

static int parse(int argc, char **argv, args *a)
{
    *a = (args){"quickstart", 1, 100, 0, 4096, 8, NULL, 0, NULL};
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i];
        if (i + 1 >= argc)
            return usage("every flag takes a value");
        const char *v = argv[++i];
        char *end = NULL;
        long long x = strtoll(v, &end, 10);
        int num = end != v && *end == '\0';
        if (strcmp(f, "--job") == 0)
            a->job = v;
        else if (strcmp(f, "--ckpt") == 0)
            a->ckpt = v;
        else if (strcmp(f, "--resume") == 0)
            a->resume = v;
        else if (!num || x < 0)
            return usage("flag values must be non-negative integers");
        else if (strcmp(f, "--dp") == 0 && x >= 1)
            a->dp = (int)x;
        else if (strcmp(f, "--steps") == 0)
            a->steps = x;
        else if (strcmp(f, "--step-ms") == 0)
            a->step_ms = (int)x;
        else if (strcmp(f, "--n") == 0 && x >= 1)
            a->n = x;
        else if (strcmp(f, "--batch") == 0 && x >= 1)
            a->batch = (int)x;
        else if (strcmp(f, "--ckpt-every") == 0 && x >= 1)
            a->ckpt_every = (int)x;
        else
            return usage("unknown flag or value out of range");
    }
    return 0;
}

/* The failure with its detail (what tide_errorf said: the tensor, the file, the path). */
static int fail(const char *what, tide_status rc)
{
    const char *detail = tide_last_error();
    fprintf(stderr, "quickstart: %s: %s%s%s\n", what, tide_strerror(rc), detail[0] ? ": " : "",
            detail);
    return 1;
}

/* The state: w and v, replicated over dp, one layer. */
static tide_status make_collection(tide_collection_t **out, int64_t n)
{
    tide_status rc = tide_collection_new(out, 1);
    const char *names[2] = {"w", "v"};
    for (int i = 0; rc == TIDE_OK && i < 2; i++) {
        tide_tensor_desc d;
        memset(&d, 0, sizeof d);
        snprintf(d.name, sizeof d.name, "%s", names[i]);
        d.dtype = TIDE_F64;
        d.ndim = 1;
        d.shape[0] = n;
        d.layer = 0;
        d.tp = TIDE_TP_REPLICATED;
        d.tp_segments = 1;
        d.dp = TIDE_DP_REPLICATED;
        rc = tide_collection_add(*out, &d);
    }
    return rc;
}

/* Sample s's gradient of element j at step k: an integer in [-4, 4]. */
static double grad(int64_t s, int64_t j, int64_t k)
{
    return (double)((s * 131 + j * 7 + k * 13) % 9) - 4.0;
}

/* One step of this rank: its samples' gradient, the dp allreduce, then the update. */
static tide_status train_step(const tide_view *view, const args *a, double *w, double *v, double *g)
{
    int per = a->batch / view->layout->dp;
    int64_t s0 = (int64_t)view->dp_rank * per;
    for (int64_t j = 0; j < a->n; j++) {
        double sum = 0.0;
        for (int64_t s = s0; s < s0 + per; s++)
            sum += grad(s, j, view->step);
        g[j] = sum;
    }
    tide_status rc =
        tide_coll_allreduce(view->dp, g, g, (size_t)a->n, TIDE_F64, TIDE_RED_SUM, NULL);
    if (rc != TIDE_OK)
        return rc; /* a peer died: nothing changed, the runtime recovers */
    for (int64_t j = 0; j < a->n; j++) {
        v[j] = 0.5 * v[j] + g[j] / (double)a->batch;
        w[j] -= v[j] / 64.0;
    }
    return TIDE_OK;
}

static uint64_t fingerprint(const double *w, const double *v, int64_t n)
{
    uint64_t h = 1469598103934665603ull;
    const unsigned char *p[2] = {(const unsigned char *)w, (const unsigned char *)v};
    for (int k = 0; k < 2; k++)
        for (size_t i = 0; i < (size_t)n * sizeof(double); i++)
            h = (h ^ p[k][i]) * 1099511628211ull;
    return h;
}

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

int main(int argc, char **argv)
{
    args a;
    int prc = parse(argc, argv, &a);
    if (prc != 0)
        return prc;
    int level = 0;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &level);
    int ret = 1;
    tide_t *t = NULL;
    tide_collection_t *coll = NULL;
    void **bufs = NULL;
    double *g = calloc((size_t)a.n, sizeof *g);
    tide_options o;
    tide_options_init(&o);
    tide_status rc = g == NULL ? TIDE_ERR_NOMEM : make_collection(&coll, a.n);
    if (rc != TIDE_OK) {
        ret = fail("collection", rc);
        goto out;
    }
    if ((rc = tide_new(&t, &o, MPI_COMM_WORLD)) != TIDE_OK) {
        ret = fail("tide_new", rc);
        goto out;
    }
    /* resuming: the job starts at the checkpoint's step */
    char ckpt_dir[4096];
    int64_t start = 0;
    if (a.resume != NULL &&
        (rc = tide_checkpoint_find(a.resume, ckpt_dir, sizeof ckpt_dir, &start)) != TIDE_OK) {
        ret = fail("--resume", rc);
        goto out;
    }
    tide_join_req req = {a.job, coll, a.dp, 1, 1, 1, start, NULL, 0};
    if ((rc = tide_join(t, &req)) != TIDE_OK) {
        ret = fail("tide_join", rc);
        goto out;
    }
    const tide_view *view = tide_view_get(t);
    /* fresh state: zeros (tide_alloc_buffers zero-fills), or the checkpoint's, handed to
       the runtime. Every rank gives its table: an idle rank's holds NULLs, and a later
       layout that takes the rank gets its buffers from the runtime. */
    if ((rc = tide_alloc_buffers(t, view, &bufs)) != TIDE_OK ||
        (a.resume != NULL && (rc = tide_checkpoint_load(t, ckpt_dir, bufs)) != TIDE_OK) ||
        (rc = tide_give_buffers(t, &bufs)) != TIDE_OK) {
        ret = fail("buffers", rc);
        goto out;
    }
    if (a.resume != NULL && view->member && view->dp_rank == 0)
        printf("quickstart: resumed at step %" PRId64 " from %s\n", start, ckpt_dir);
    if (a.ckpt != NULL && (rc = tide_checkpoint_every(t, a.ckpt, a.ckpt_every, 0)) != TIDE_OK) {
        ret = fail("--ckpt", rc);
        goto out;
    }
    for (;;) {
        tide_step_action act;
        if ((rc = tide_step_begin(t, &act)) != TIDE_OK) {
            ret = fail("tide_step_begin", rc);
            goto out;
        }
        if (act == TIDE_STEP_FINISHED)
            break;
        if (act == TIDE_STEP_RECONFIGURE) {
            /* rebuilt in place; tide_buffers(t) has the new layout's (tide_buffer_moved says
               which changed address) */
            if ((rc = tide_reshard(t, NULL, NULL)) != TIDE_OK) {
                ret = fail("switch", rc);
                goto out;
            }
            view = tide_view_get(t);
            if (view->member && view->dp_rank == 0)
                printf("quickstart: generation %" PRIu64 " dp %d from step %" PRId64 "\n",
                       view->generation, view->layout->dp, view->step);
            fflush(stdout);
            continue;
        }
        view = tide_view_get(t);
        if (act == TIDE_STEP_FINISH) {
            /* unreachable here: this program never calls tide_step_can_finish */
            ret = fail("step", TIDE_ERR_INTERNAL);
            goto out;
        }
        double *const *state = (double *const *)tide_buffers(t); /* w, v: the runtime's */
        if (view->step >= a.steps) {
            if (view->dp_rank == 0)
                printf("quickstart: step %" PRId64 " fingerprint %016" PRIx64 "\n", view->step,
                       fingerprint(state[0], state[1], a.n));
            fflush(stdout);
            tide_finish(t); /* releases the idle ranks */
            break;
        }
        if (a.batch % view->layout->dp != 0) {
            ret = fail("dp must divide --batch", TIDE_ERR_INVALID);
            goto out;
        }
        tide_status step_rc = train_step(view, &a, state[0], state[1], g);
        if ((rc = tide_step_end(t, step_rc)) != TIDE_OK) {
            ret = fail("tide_step_end", rc);
            goto out;
        }
        if (step_rc == TIDE_OK && view->dp_rank == 0 && view->step % 10 == 0) {
            printf("quickstart: step %" PRId64 "\n", view->step);
            fflush(stdout);
        }
        if (a.step_ms > 0)
            sleep_ms(a.step_ms);
    }
    ret = 0;
out:
    if (t != NULL)
        tide_free_buffers(t, &bufs); /* not given (a failed start); tide_destroy frees those */
    tide_destroy(&t);
    tide_collection_destroy(&coll);
    free(g);
    MPI_Finalize();
    return ret;
}
