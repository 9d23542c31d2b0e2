/*
 * tide-ckpt: inspects, verifies and converts tide checkpoints offline (no MPI, no GPU).
 *
 *   tide-ckpt info DIR        step, layout, tensors and shard files of a checkpoint
 *   tide-ckpt verify DIR      reads every shard and checks every checksum
 *   tide-ckpt convert DIR OUT --dp N --tp N --pp N [--stages 0-1,2-3] [--micro-batches N]
 *                             writes the same state as a checkpoint of another layout
 *                             under the root OUT (OUT/step-N), loading each new shard
 *                             with exactly the reads a relaunched rank would do
 *
 * DIR is a checkpoint directory (it holds a MANIFEST) or a root of step-N directories
 * (the newest complete one is used). Exit status: 0 ok, 1 the checkpoint is bad, 2 usage.
 * On a terminal, verify and convert redraw a progress line on stderr as they go (GiBs
 * take minutes) and erase it at the end; into a pipe or a file they print nothing more.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ckpt/ckpt.h"
#include "core/alloc.h"
#include "core/clock.h"
#include "core/error.h"
#include "core/opts.h"
#include "core/version.h"

#define PATH_LEN 4096

#define PROGRESS_NS 100000000ull /* redraw at most 10 times a second */

/* The progress line of one operation; off unless stderr is a terminal. */
typedef struct progress {
    int on, shown;
    const char *what; /* "verify", "convert" */
    uint64_t t0, last;
} progress;

static void progress_init(progress *p, const char *what)
{
    memset(p, 0, sizeof *p);
    p->on = isatty(STDERR_FILENO);
    p->what = what;
    p->t0 = tide_now_ns();
}

/* Redraws "what: done of total (pct), rate" with extra after it, when the last redraw is
   old enough or the work is done. */
static void progress_show(progress *p, uint64_t done, uint64_t total, const char *extra)
{
    if (!p->on)
        return;
    uint64_t now = tide_now_ns();
    if (p->shown && done < total && now - p->last < PROGRESS_NS)
        return;
    p->last = now;
    p->shown = 1;
    double unit = total >= (1ull << 30) ? 1073741824.0 : 1048576.0;
    const char *uname = total >= (1ull << 30) ? "GiB" : "MiB";
    double s = (double)(now - p->t0) * 1e-9;
    fprintf(stderr, "\r\033[K%s: %.1f of %.1f %s (%.0f%%)%s, %.0f MiB/s", p->what,
            (double)done / unit, (double)total / unit, uname,
            total ? 100.0 * (double)done / (double)total : 100.0, extra ? extra : "",
            s > 0 ? (double)done / 1048576.0 / s : 0.0);
    fflush(stderr);
}

/* Erases the line, so that what follows reads as it would without a terminal. */
static void progress_end(progress *p)
{
    if (p->shown) {
        fputs("\r\033[K", stderr);
        fflush(stderr);
    }
}

static void verify_progress(void *arg, uint64_t done, uint64_t total)
{
    progress_show(arg, done, total, NULL);
}

static int fail(const char *what)
{
    fprintf(stderr, "tide-ckpt: %s: %s\n", what, tide_last_error());
    return 1;
}

static int open_any(const char *arg, tide_ckpt_t **ck)
{
    char dir[PATH_LEN];
    int64_t step = 0;
    if (tide_ckpt_find(arg, INT64_MAX, dir, sizeof dir, &step) != TIDE_OK)
        return fail(arg);
    if (tide_ckpt_open(ck, dir) != TIDE_OK)
        return fail(dir);
    return 0;
}

static int cmd_info(const char *arg)
{
    tide_ckpt_t *ck = NULL;
    if (open_any(arg, &ck) != 0)
        return 1;
    const tide_collection_t *c = tide_ckpt_collection(ck);
    char lbuf[512];
    uint64_t total = 0;
    for (size_t k = 0; k < tide_ckpt_num_shards(ck); k++) {
        int p, d, t;
        uint64_t b;
        const char *f;
        tide_ckpt_shard_info(ck, k, &p, &d, &t, &b, &f);
        total += b;
    }
    printf("checkpoint %s\n  format version %d, step %" PRId64 "\n  layout %s\n"
           "  %zu tensors, %d layers, %.3f MiB of state; %zu shard files, %.3f MiB\n",
           tide_ckpt_dir(ck), tide_ckpt_format(ck), tide_ckpt_step(ck),
           tide_layout_format(tide_ckpt_layout(ck), lbuf, sizeof lbuf), tide_collection_size(c),
           tide_collection_num_layers(c), (double)tide_collection_bytes(c) / 1048576.0,
           tide_ckpt_num_shards(ck), (double)total / 1048576.0);
    for (size_t k = 0; k < tide_ckpt_num_shards(ck); k++) {
        int p, d, t;
        uint64_t b;
        const char *f;
        tide_ckpt_shard_info(ck, k, &p, &d, &t, &b, &f);
        printf("  %-24s (p %d, d %d, t %d) %12" PRIu64 " bytes\n", f, p, d, t, b);
    }
    for (size_t i = 0; i < tide_collection_size(c); i++) {
        const tide_tensor_desc *t = tide_collection_tensor(c, i);
        printf("  tensor %-32s %-4s [", t->name, tide_dtype_name(t->dtype));
        for (int k = 0; k < t->ndim; k++)
            printf("%s%" PRId64, k ? ", " : "", t->shape[k]);
        printf("] layer %d, tp %s, dp %s\n", t->layer, t->tp == TIDE_TP_SPLIT ? "split" : "repl",
               t->dp == TIDE_DP_SHARDED ? "sharded" : "repl");
    }
    tide_ckpt_close(&ck);
    return 0;
}

static int cmd_verify(const char *arg)
{
    tide_ckpt_t *ck = NULL;
    if (open_any(arg, &ck) != 0)
        return 1;
    uint64_t t0 = tide_now_ns();
    progress pr;
    progress_init(&pr, "verify");
    tide_status rc = tide_ckpt_verify_progress(ck, verify_progress, &pr);
    progress_end(&pr);
    if (rc != TIDE_OK) {
        tide_ckpt_close(&ck);
        return fail("verify");
    }
    printf("checkpoint %s (step %" PRId64 "): %zu shard files, every checksum matches "
           "(%.0f ms)\n",
           tide_ckpt_dir(ck), tide_ckpt_step(ck), tide_ckpt_num_shards(ck),
           (double)(tide_now_ns() - t0) * 1e-6);
    tide_ckpt_close(&ck);
    return 0;
}

/* Bytes of the shard of coordinate (p, d, t) of l. */
static uint64_t coord_bytes(const tide_layout_t *l, const tide_collection_t *c, int p, int d,
                            int t)
{
    uint64_t b = 0;
    for (size_t i = 0; i < tide_collection_size(c); i++)
        if (tide_ckpt_saves(l, c, i, p, d, t))
            b += tide_shard_bytes(l, c, i, p, d, t);
    return b;
}

/* Loads coordinate (p, d, t) of l from ck into fresh host buffers and writes its shard. */
static tide_status convert_one(const tide_ckpt_t *ck, const tide_layout_t *l, int p, int d, int t,
                               const char *dir, uint64_t save_id)
{
    const tide_collection_t *c = tide_ckpt_collection(ck);
    size_t n = tide_collection_size(c);
    void **bufs = tide_calloc(n ? n : 1, sizeof *bufs);
    tide_status rc = TIDE_OK;
    TIDE_CHECK_ALLOC_GOTO(bufs, rc, out);
    for (size_t i = 0; i < n; i++)
        if (tide_ckpt_saves(l, c, i, p, d, t)) {
            bufs[i] = tide_malloc(tide_shard_bytes(l, c, i, p, d, t));
            TIDE_CHECK_ALLOC_GOTO(bufs[i], rc, out);
        }
    TIDE_CHECK_GOTO(tide_ckpt_load(ck, l, p, d, t, bufs, NULL), rc, out);
    TIDE_CHECK_GOTO(tide_ckpt_write_shard(dir, l, c, p, d, t, (const void *const *)bufs, save_id),
                    rc, out);
out:
    for (size_t i = 0; bufs != NULL && i < n; i++)
        tide_free(bufs[i]);
    tide_free(bufs);
    return rc;
}

static int cmd_convert(int argc, char **argv)
{
    long long dp, tp, pp, micro;
    const char *stages = NULL;
    const tide_opt opts[] = {
        {"dp", NULL, TIDE_OPT_INT, &dp, "1", "data-parallel degree of the output", 1, 1 << 16},
        {"tp", NULL, TIDE_OPT_INT, &tp, "1", "tensor-parallel degree of the output", 1, 1 << 16},
        {"pp", NULL, TIDE_OPT_INT, &pp, "1", "pipeline stages of the output", 1, 1 << 16},
        {"stages", NULL, TIDE_OPT_STRING, &stages, NULL,
         "layer ranges per stage, e.g. 0-2,3-3 (default: even)", 0, 0},
        {"micro-batches", NULL, TIDE_OPT_INT, &micro, "0",
         "micro-batches recorded in the output (0: the input's)", 0, 1 << 20},
        {NULL, NULL, 0, NULL, NULL, NULL, 0, 0},
    };
    int npos = 0, help = 0;
    tide_status prc = tide_opts_parse(opts, argc, argv, &npos, &help);
    if (prc == TIDE_OK && help == TIDE_OPTS_VERSION) {
        tide_version_print(stdout, "tide-ckpt");
        return 0;
    }
    if (prc != TIDE_OK || help || npos != 2) {
        if (!help)
            fprintf(stderr, "tide-ckpt convert: %s\n",
                    npos != 2 ? "needs DIR and OUT" : tide_last_error());
        tide_opts_usage(help ? stdout : stderr, "tide-ckpt convert",
                        "DIR OUT --dp N --tp N --pp N [--stages ...]", opts);
        return help ? 0 : 2;
    }
    const char *in = argv[1], *out_root = argv[2];
    tide_ckpt_t *ck = NULL;
    if (open_any(in, &ck) != 0)
        return 1;
    const tide_collection_t *c = tide_ckpt_collection(ck);
    const tide_layout_t *ol = tide_ckpt_layout(ck);
    tide_layout_t *l = NULL;
    int code = 1;
    uint64_t t0 = tide_now_ns();
    char dir[PATH_LEN], lbuf[512], obuf[512];
    uint64_t save_id = tide_now_ns() ^ ((uint64_t)getpid() << 32);
    if (tide_layout_new(&l, (int)dp, (int)tp, (int)pp, tide_collection_num_layers(c),
                        micro > 0 ? (int)micro : ol->micro_batches) != TIDE_OK ||
        (stages != NULL && tide_layout_parse_stages(l, stages) != TIDE_OK) ||
        tide_layout_validate(l, c) != TIDE_OK) {
        code = fail("the output layout");
        goto out;
    }
    tide_ckpt_step_dir(out_root, tide_ckpt_step(ck), dir, sizeof dir);
    progress pr;
    progress_init(&pr, "convert");
    uint64_t total = 0, done = 0;
    for (int p = 0; p < l->pp; p++)
        for (int d = 0; d < l->dp; d++)
            for (int t = 0; t < l->tp; t++)
                total += coord_bytes(l, c, p, d, t);
    int n_shards = l->pp * l->dp * l->tp, k = 0;
    for (int p = 0; p < l->pp; p++)
        for (int d = 0; d < l->dp; d++)
            for (int t = 0; t < l->tp; t++) {
                char extra[64];
                snprintf(extra, sizeof extra, ", shard %d of %d", k + 1, n_shards);
                progress_show(&pr, done, total, extra);
                if (convert_one(ck, l, p, d, t, dir, save_id) != TIDE_OK) {
                    progress_end(&pr);
                    code = fail("convert");
                    goto out;
                }
                done += coord_bytes(l, c, p, d, t);
                k++;
            }
    char fin[64];
    snprintf(fin, sizeof fin, ", %d shards", n_shards);
    progress_show(&pr, done, total, fin);
    progress_end(&pr);
    if (tide_ckpt_publish(dir, l, c, tide_ckpt_step(ck), save_id, 0) != TIDE_OK) {
        code = fail("publish");
        goto out;
    }
    printf("converted %s (step %" PRId64 ", %s) into %s (%s) in %.0f ms\n", tide_ckpt_dir(ck),
           tide_ckpt_step(ck), tide_layout_format(ol, obuf, sizeof obuf), dir,
           tide_layout_format(l, lbuf, sizeof lbuf), (double)(tide_now_ns() - t0) * 1e-6);
    code = 0;
out:
    tide_layout_destroy(&l);
    tide_ckpt_close(&ck);
    return code;
}

static void usage(FILE *f)
{
    fprintf(f, "usage: tide-ckpt info DIR\n"
               "       tide-ckpt verify DIR\n"
               "       tide-ckpt convert DIR OUT --dp N --tp N --pp N [--stages 0-1,2-3]\n"
               "       tide-ckpt --version\n"
               "DIR: a checkpoint directory or a root of step-N directories (newest complete)\n");
}

int main(int argc, char **argv)
{
    if (argc >= 2 && (strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0)) {
        usage(stdout);
        return 0;
    }
    if (argc >= 2 && strcmp(argv[1], "--version") == 0) {
        tide_version_print(stdout, "tide-ckpt");
        return 0;
    }
    if (argc == 3 && strcmp(argv[1], "info") == 0)
        return cmd_info(argv[2]);
    if (argc == 3 && strcmp(argv[1], "verify") == 0)
        return cmd_verify(argv[2]);
    if (argc >= 2 && strcmp(argv[1], "convert") == 0)
        return cmd_convert(argc - 1, argv + 1);
    usage(stderr);
    return 2;
}
