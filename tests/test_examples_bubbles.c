/*
 * MPI integration test of bubble filling (2 ranks, host memory): usage
 * test_examples_bubbles TIDED TIDECTL PLUGIN PROBE, PLUGIN the task_matmul plugin,
 * PROBE tests/task_probe.c's (it writes the tide_task_env it got).
 *
 * Rank 0 starts tided on a free loopback port; both ranks run train_mlp's elastic loop
 * (tide_mlp_tide_train) in a two-stage pipeline (dp 1, tp 1, pp 2) whose pipeline waits
 * go through tide_bubble_wait. Once the job has run a few steps, a controller thread on
 * rank 0 queues offline plugin jobs with `tidectl submit --offline --plugin ... --bubbles`:
 * "probe" (PROBE) writes the environment the runtime gave it, "mm" runs to its end,
 * "spin" (too long to finish) is cancelled with `tidectl cancel` while it fills bubbles,
 * and "nosuch" names a plugin no worker has: its failure shows the loader's error in
 * `tidectl logs` and in its event.
 * The ranks run on devices 3 and 5 (tide_options.device), so that a plugin told 0, -1
 * or its rank is caught: "probe" must have been given env.device == tide_device(t) of
 * the rank that ran it, gpu 0 and no stream (host memory).
 * Checked: tided gives the jobs to the pipeline's workers and their steps run inside
 * bubbles (task steps and filled time > 0, filled <= bubble time, on the ranks that
 * ran them); "mm" ends done with the same result as the plugin run to its end in one
 * go (checksum file); "spin" ends cancelled and its worker takes no more steps of it;
 * tided's status shows filled bubble time; and the online job is undisturbed: the loss
 * of every step equals the run without offline work (plain MPI, same layout), exactly
 * (bubble steps touch no training state).
 */
#include <dlfcn.h>
#include <math.h>
#include <pthread.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <tide/tide_task.h>

#include "coord_harness.h"
#include "examples/mlp_mpi.h"
#include "examples/mlp_tide.h"
#include "mpi_test.h"
#include "tests/support/scenario.h"

#define JOB       "bubbles"
#define MAX_STEPS 2000
#define MM_ARGS   "--n", "96", "--rounds", "4", "--rows", "2"

static int g_rank;
static mt_layout g_first; /* the pipeline's layout (its scenario's first) */
static coord_proc g_coord;

/* The state of offline job name in `tidectl jobs --json` ("" when not listed). */
static void job_state(const char *exe, const char *ep, const char *name, char *state, size_t cap)
{
    static char out[1 << 16];
    const char *args[] = {"jobs", "--json", NULL};
    state[0] = '\0';
    if (coord_tidectl(exe, ep, args, out, sizeof out) != 0)
        return;
    char key[160];
    snprintf(key, sizeof key, "\"name\":\"%s\"", name);
    const char *at = strstr(out, key);
    const char *end = at ? strchr(at, '}') : NULL;
    const char *st = at ? strstr(at, "\"state\":\"") : NULL;
    if (st == NULL || (end != NULL && st > end))
        return;
    st += strlen("\"state\":\"");
    size_t n = strcspn(st, "\"");
    snprintf(state, cap, "%.*s", (int)(n < cap ? n : cap - 1), st);
}

/* ---- the controller (rank 0 thread) -------------------------------------------------------- */

typedef struct ctl_state {
    const char *tidectl, *plugin, *probe;
    char endpoint[256], mm_out[320], probe_out[320];
    volatile int started; /* the job has run a few steps */
    volatile int mm_done, spin_cancelled, error;
    char why[512];
} ctl_state;

static int wait_state(ctl_state *cs, const char *job, const char *want, int ms)
{
    char st[64] = "";
    for (int i = 0; i < ms / 50; i++) {
        job_state(cs->tidectl, cs->endpoint, job, st, sizeof st);
        if (strcmp(st, want) == 0)
            return 0;
        tide_sleep_ms(50);
    }
    snprintf(cs->why, sizeof cs->why, "offline job %s is '%s', not '%s', after %d ms", job, st,
             want, ms);
    return -1;
}

/* tidectl ARGS' output into out; 0 when it exited 0 and out holds every string of want. */
static int tidectl_shows(ctl_state *cs, const char *const *args, const char *const *want,
                         char *out, size_t cap)
{
    if (coord_tidectl(cs->tidectl, cs->endpoint, args, out, cap) != 0)
        return -1;
    for (; *want != NULL; want++)
        if (strstr(out, *want) == NULL)
            return -1;
    return 0;
}

/* A plugin no worker has: its one attempt (--max-attempts 1) fails, and the loader's error
   is where an operator looks, `tidectl logs` and the attempt's event, not only in the
   training job's stderr. */
static int missing_plugin_is_explained(ctl_state *cs)
{
    const char *sub[] = {"submit", "--offline", "--name",           "nosuch",
                         "--bubbles", "--plugin", "tide_no_such_task", NULL};
    if (coord_tidectl(cs->tidectl, cs->endpoint, sub, NULL, 0) != 0) {
        snprintf(cs->why, sizeof cs->why, "tidectl submit nosuch failed");
        return -1;
    }
    if (wait_state(cs, "nosuch", "failed", 30000) != 0)
        return -1;
    static char out[1 << 16];
    const char *logs[] = {"logs", "nosuch", NULL};
    const char *in_logs[] = {"failed, exit code 127", "cannot load plugin tide_no_such_task",
                             "libtide_no_such_task.so", NULL};
    if (tidectl_shows(cs, logs, in_logs, out, sizeof out) != 0) {
        snprintf(cs->why, sizeof cs->why, "tidectl logs nosuch lacks the loader's error: %.400s",
                 out);
        return -1;
    }
    const char *events[] = {"events", "--json", NULL};
    const char *in_event[] = {"(exit code 127): [tide: cannot load plugin tide_no_such_task",
                              NULL};
    if (tidectl_shows(cs, events, in_event, out, sizeof out) != 0) {
        snprintf(cs->why, sizeof cs->why, "the failed attempt's event lacks the loader's error");
        return -1;
    }
    return 0;
}

static void *controller(void *arg)
{
    ctl_state *cs = arg;
    while (!cs->started)
        tide_sleep_ms(10);
    const char *probe[] = {"submit",  "--offline", "--name", "probe",       "--bubbles", "--plugin",
                           cs->probe, "--",        "--out",  cs->probe_out, NULL};
    if (coord_tidectl(cs->tidectl, cs->endpoint, probe, NULL, 0) != 0) {
        snprintf(cs->why, sizeof cs->why, "tidectl submit probe failed");
        cs->error = 1;
        return NULL;
    }
    if (wait_state(cs, "probe", "done", 30000) != 0) {
        cs->error = 1;
        return NULL;
    }
    const char *mm[] = {"submit",   "--offline", "--name", "mm",    "--bubbles", "--plugin",
                        cs->plugin, "--",        MM_ARGS,  "--out", cs->mm_out,  NULL};
    if (coord_tidectl(cs->tidectl, cs->endpoint, mm, NULL, 0) != 0) {
        snprintf(cs->why, sizeof cs->why, "tidectl submit mm failed");
        cs->error = 1;
        return NULL;
    }
    if (wait_state(cs, "mm", "done", 60000) != 0) {
        cs->error = 1;
        return NULL;
    }
    cs->mm_done = 1;
    /* a job far too long to finish, cancelled while it fills bubbles */
    const char *spin[] = {"submit",   "--offline", "--name", "spin", "--bubbles",
                          "--plugin", cs->plugin,  "--",     "--n",  "64",
                          "--rounds", "1000000",   NULL};
    if (coord_tidectl(cs->tidectl, cs->endpoint, spin, NULL, 0) != 0 ||
        wait_state(cs, "spin", "running", 30000) != 0) {
        snprintf(cs->why + strlen(cs->why), sizeof cs->why - strlen(cs->why), " (submitting spin)");
        cs->error = 1;
        return NULL;
    }
    tide_sleep_ms(300); /* let it fill a few bubbles */
    const char *cancel[] = {"cancel", "spin", NULL};
    if (coord_tidectl(cs->tidectl, cs->endpoint, cancel, NULL, 0) != 0 ||
        wait_state(cs, "spin", "cancelled", 30000) != 0) {
        cs->error = 1;
        return NULL;
    }
    if (missing_plugin_is_explained(cs) != 0) {
        cs->error = 1;
        return NULL;
    }
    cs->spin_cancelled = 1;
    return NULL;
}

/* ---- the training loop's hooks ------------------------------------------------------------- */

typedef struct record {
    ctl_state *cs;
    tide_t *t;
    double loss[MAX_STEPS];
    int ran[MAX_STEPS];
    int64_t end; /* the step the job ends at (agreed at run time), or -1 */
    uint64_t spin_steps_after;
} record;

static tide_status h_on_step(void *ctx, tide_t *t, const tide_mlp_t *m, int64_t step, double loss,
                             double seconds)
{
    (void)t;
    (void)m;
    (void)seconds;
    record *r = ctx;
    if (step >= 0 && step < MAX_STEPS) {
        r->loss[step] = loss;
        r->ran[step]++;
    }
    return TIDE_OK;
}

/* Both ranks are members and call this at every step: the job ends a few steps after
   the controller saw both offline jobs end and no rank runs offline work any more (a
   cancelled job stops at a worker's next step boundary), or at once on an error. */
static int h_done(void *ctx, const tide_view *v)
{
    record *r = ctx;
    tide_bubble_stats bs;
    tide_bubble_stats_get(r->t, &bs);
    int mine[2] = {0, bs.task[0] != '\0'}, all[2];
    if (g_rank == 0) {
        if (v->step == 3)
            r->cs->started = 1;
        mine[0] = r->cs->error;
        mine[1] |= !(r->cs->mm_done && r->cs->spin_cancelled);
    }
    MPI_Allreduce(mine, all, 2, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if ((all[0] || !all[1]) && r->end < 0)
        r->end = v->step + 3;
    return (r->end >= 0 && v->step >= r->end) || v->step >= MAX_STEPS - 1;
}

/* ---- references ------------------------------------------------------------------------------ */

static void reference_losses(const tide_mlp_config *cfg, int64_t steps, double *loss)
{
    tide_layout_t *l = NULL;
    tide_mlp_t *m = NULL;
    tide_mlp_mpi_t *mpi = NULL;
    MT_OK(tide_layout_new(&l, g_first.dp, g_first.tp, g_first.pp, cfg->layers, 4));
    MT_OK(tide_mlp_new(&m, cfg, l, g_rank, TIDE_MLP_CPU));
    MT_OK(tide_mlp_init(m));
    MT_OK(tide_mlp_mpi_new(&mpi, MPI_COMM_WORLD, l));
    for (int64_t s = 0; s < steps; s++)
        MT_OK(tide_mlp_step(m, tide_mlp_mpi_comm(mpi), &loss[s]));
    MPI_Bcast(loss, (int)steps, MPI_DOUBLE, 0, MPI_COMM_WORLD);
    tide_mlp_mpi_destroy(&mpi);
    tide_mlp_destroy(&m);
    tide_layout_destroy(&l);
}

/* The plugin run to its end in one go, in this process: its output file's text. */
static void reference_task(const char *plugin, const char *out_path, char *text, size_t cap)
{
    void *h = dlopen(plugin, RTLD_NOW | RTLD_LOCAL);
    MT_ASSERT(h != NULL, "dlopen %s: %s", plugin, dlerror());
    tide_task_v1_get_fn get = (tide_task_v1_get_fn)(uintptr_t)dlsym(h, "tide_task_v1_get");
    MT_ASSERT(get != NULL, "no tide_task_v1_get in %s", plugin);
    const tide_task_v1 *ops = get();
    char *argv[] = {MM_ARGS, "--out", (char *)out_path};
    tide_task_env env = {"ref", 0, 0, 0, 1, NULL};
    void *state = NULL;
    MT_OK(ops->init(&state, (int)(sizeof argv / sizeof argv[0]), argv, &env));
    int done = 0;
    double progress = 0;
    while (!done)
        MT_OK(ops->step(state, &done, &progress));
    ops->fini(state);
    dlclose(h);
    FILE *f = fopen(out_path, "r");
    MT_ASSERT(f != NULL && fgets(text, (int)cap, f) != NULL, "reference task wrote no %s",
              out_path);
    fclose(f);
    unlink(out_path);
}

/* ---- the test -------------------------------------------------------------------------------- */

/* The scenario (tests/scenarios/test_examples_bubbles.h): one row. */
static const mt_row scenarios[] = {
#define ROW(name, ranks, timeout, labels, mpi, first, resizes, kill, ckpt, gen, status)            \
    {name, ranks, timeout, labels, mpi, first, resizes, kill, ckpt, gen, status},
#include "scenarios/test_examples_bubbles.h"
#undef ROW
};

int main(int argc, char **argv)
{
    const mt_row *row = NULL;
    if (MT_ROWS_SELECT(argc, argv, 1, scenarios, &row))
        return 0; /* --list */
    mt_scenario sc;
    if (argc < 5 || row == NULL || mt_scenario_parse(row, &sc) != TIDE_OK || !sc.has_first) {
        fprintf(stderr, "usage: test_examples_bubbles TIDED TIDECTL PLUGIN PROBE (its scenario "
                        "needs a first layout)\n");
        return 2;
    }
    g_first = sc.first;
    const char *rank_env = getenv("OMPI_COMM_WORLD_RANK");
    int is_root = rank_env != NULL && strcmp(rank_env, "0") == 0;
    static ctl_state cs;
    if (is_root) {
        /* before MPI_Init: fork is safe here */
        const char *extra[] = {"--heartbeat-ms", "100", "--miss-limit", "100",
                               "--max-attempts", "1",   NULL};
        if (coord_tmpdir(&g_coord) != 0 || coord_start(&g_coord, argv[1], extra, NULL) != 0) {
            fprintf(stderr, "test_examples_bubbles: tided did not start\n");
            return 1;
        }
        snprintf(cs.endpoint, sizeof cs.endpoint, "%s", g_coord.endpoint);
        snprintf(cs.mm_out, sizeof cs.mm_out, "%s/mm.out", g_coord.dir);
        snprintf(cs.probe_out, sizeof cs.probe_out, "%s/probe.env", g_coord.dir);
    }
    int prov = 0, size = 0;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &prov);
    MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    MT_ASSERT(size == row->ranks, "run with %d ranks, not %d", row->ranks, size);
    MPI_Bcast(cs.endpoint, sizeof cs.endpoint, MPI_CHAR, 0, MPI_COMM_WORLD);
    MPI_Bcast(g_coord.dir, sizeof g_coord.dir, MPI_CHAR, 0, MPI_COMM_WORLD);
    setenv("TIDE_TASK_DIR", g_coord.dir, 1); /* preempted tasks save their blobs here */
    cs.tidectl = argv[2];
    /* tided names plugins, never paths: libNAME.so in the workers' TIDE_PLUGIN_DIR, here
       a directory of links to the two plugins */
    static char dir[400], name[2][128];
    snprintf(dir, sizeof dir, "%s/plugins", g_coord.dir);
    if (g_rank == 0)
        MT_ASSERT(mkdir(dir, 0700) == 0, "mkdir %s", dir);
    for (int k = 0; k < 2; k++) {
        const char *path = argv[3 + k], *base = strrchr(path, '/');
        MT_ASSERT(base != NULL && strncmp(base + 1, "lib", 3) == 0, "plugin path %s", path);
        snprintf(name[k], sizeof name[k], "%s", base + 4);
        name[k][strcspn(name[k], ".")] = '\0';
        char link[600];
        snprintf(link, sizeof link, "%s%s", dir, base);
        if (g_rank == 0)
            MT_ASSERT(symlink(path, link) == 0, "symlink %s", link);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    setenv("TIDE_PLUGIN_DIR", dir, 1);
    cs.plugin = name[0];
    cs.probe = name[1];

    tide_mlp_config cfg;
    tide_mlp_config_default(&cfg);
    cfg.layers = 4;
    tide_collection_t *coll = NULL;
    MT_OK(tide_mlp_collection_new(&cfg, &coll));
    tide_options o;
    tide_options_init(&o);
    o.endpoint = cs.endpoint;
    o.register_timeout_ms = 20000;
    o.device = 3 + 2 * g_rank; /* neither 0 nor the rank: what a plugin must be told */
    tide_t *t = NULL;
    MT_OK(tide_new(&t, &o, MPI_COMM_WORLD));
    int devices[2] = {-1, -1}, mine_dev = tide_device(t);
    MT_ASSERT(mine_dev == o.device, "tide_device %d, options said %d", mine_dev, o.device);
    MPI_Allgather(&mine_dev, 1, MPI_INT, devices, 1, MPI_INT, MPI_COMM_WORLD);
    tide_join_req jr = {JOB, coll, g_first.dp, g_first.tp, g_first.pp, 4, 0, NULL, 0};
    MT_OK(tide_join(t, &jr));
    const tide_view *v = tide_view_get(t);
    MT_ASSERT(v->member && v->layout->pp == 2, "both ranks are the pipeline's two stages");
    tide_mlp_t *m = NULL;
    MT_OK(tide_mlp_new(&m, &cfg, v->layout, tide_pool_rank(t), TIDE_MLP_CPU));
    MT_OK(tide_mlp_init(m));
    MT_OK(tide_set_buffers(t, tide_mlp_buffers(m)));

    static record rec;
    rec.cs = &cs;
    rec.t = t;
    rec.end = -1;
    pthread_t th;
    if (g_rank == 0)
        pthread_create(&th, NULL, controller, &cs);
    tide_mlp_tide_hooks hk = {&rec, h_on_step, NULL, NULL, h_done, 0, NULL};
    MT_OK(tide_mlp_tide_train(t, m, &hk));
    if (g_rank == 0) {
        pthread_join(th, NULL);
        MT_ASSERT(!cs.error, "controller: %s", cs.why);
    }
    tide_bubble_stats bs;
    tide_bubble_stats_get(t, &bs);
    MPI_Barrier(MPI_COMM_WORLD);

    /* tided measured the pipeline's bubbles (heartbeats carry them) */
    if (g_rank == 0) {
        static char status[1 << 16];
        const char *args[] = {"status", "--json", NULL};
        MT_ASSERT(coord_tidectl(cs.tidectl, cs.endpoint, args, status, sizeof status) == 0,
                  "tidectl status");
        int with_bubbles = 0;
        for (const char *p = strstr(status, "\"bubble_pct\":"); p != NULL;
             p = strstr(p + 1, "\"bubble_pct\":"))
            with_bubbles += atof(p + strlen("\"bubble_pct\":")) > 0.0;
        MT_ASSERT(with_bubbles == 2, "tidectl status shows bubbles on %d of 2 workers: %s",
                  with_bubbles, status);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    tide_destroy(&t);
    tide_mlp_destroy(&m);

    /* the offline work ran inside bubbles, on this machine's pipeline */
    uint64_t steps_all = 0;
    double filled_all = 0, bubble_all = 0;
    MPI_Allreduce(&bs.task_steps, &steps_all, 1, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD);
    MPI_Allreduce(&bs.filled_ms, &filled_all, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    MPI_Allreduce(&bs.bubble_ms, &bubble_all, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    MT_ASSERT(bs.filled_ms <= bs.bubble_ms, "rank %d: filled %.3f ms > bubbles %.3f ms", g_rank,
              bs.filled_ms, bs.bubble_ms);
    MT_ASSERT(steps_all > 0 && filled_all > 0,
              "no offline task step ran inside a bubble (%llu steps, %.3f of %.3f ms)",
              (unsigned long long)steps_all, filled_all, bubble_all);
    MT_ASSERT(bs.task[0] == '\0', "rank %d still runs offline job %s after the cancel", g_rank,
              bs.task);

    /* "probe" was told the device of the worker that ran it */
    if (g_rank == 0) {
        char line[256] = "";
        FILE *f = fopen(cs.probe_out, "r");
        MT_ASSERT(f != NULL && fgets(line, sizeof line, f) != NULL, "probe wrote no %s",
                  cs.probe_out);
        fclose(f);
        unlink(cs.probe_out);
        int r = -1, dev = -1, gpu = -1;
        char stream[16] = "";
        MT_ASSERT(sscanf(line, "rank=%d device=%d gpu=%d stream=%15s", &r, &dev, &gpu, stream) ==
                          4 &&
                      r >= 0 && r < 2,
                  "probe's line: %s", line);
        MT_ASSERT(dev == devices[r],
                  "the plugin on rank %d was told device %d; the worker's device is %d", r, dev,
                  devices[r]);
        MT_ASSERT(gpu == 0 && strcmp(stream, "null") == 0,
                  "a host-memory worker gave its plugin gpu=%d stream=%s", gpu, stream);
        printf("probe: the plugin ran on rank %d with env.device %d = tide_device\n", r, dev);
    }

    /* "mm" computed what the plugin computes run in one go */
    if (g_rank == 0) {
        char got[256] = "", want[256] = "", ref_path[400];
        FILE *f = fopen(cs.mm_out, "r");
        MT_ASSERT(f != NULL && fgets(got, sizeof got, f) != NULL, "mm wrote no %s", cs.mm_out);
        fclose(f);
        unlink(cs.mm_out);
        snprintf(ref_path, sizeof ref_path, "%s/mm-ref.out", g_coord.dir);
        reference_task(argv[3], ref_path, want, sizeof want);
        MT_ASSERT(strcmp(got, want) == 0, "mm's result '%s' differs from the plugin run alone '%s'",
                  got, want);
    }

    /* the online job is undisturbed: every step once, losses of the plain run */
    int64_t end = rec.end;
    MT_ASSERT(end > 0 && end < MAX_STEPS - 1, "the job ended at step %lld", (long long)end);
    static double ref[MAX_STEPS];
    reference_losses(&cfg, end, ref);
    for (int64_t k = 0; k < end; k++) {
        MT_ASSERT(rec.ran[k] == 1, "step %lld ran %d times on rank %d", (long long)k, rec.ran[k],
                  g_rank);
        MT_ASSERT(rec.loss[k] == ref[k], "step %lld: loss %.9g with bubble filling, %.9g without",
                  (long long)k, rec.loss[k], ref[k]);
    }
    if (g_rank == 0) {
        printf("bubbles: %lld steps; %llu offline task steps filled %.1f of %.1f ms of bubbles "
               "(%.0f%%)\n",
               (long long)end, (unsigned long long)steps_all, filled_all, bubble_all,
               bubble_all > 0 ? 100.0 * filled_all / bubble_all : 0.0);
        fflush(stdout);
    }
    tide_collection_destroy(&coll);
    mt_pass("test_examples_bubbles");
    MPI_Finalize();
    if (is_root) {
        char blob[400];
        snprintf(blob, sizeof blob, "%s/spin.ckpt", g_coord.dir);
        unlink(blob);
        for (int k = 0; k < 2; k++) {
            char link[600];
            snprintf(link, sizeof link, "%s%s", dir, strrchr(argv[3 + k], '/'));
            unlink(link);
        }
        rmdir(dir);
        coord_stop(&g_coord, SIGTERM);
        coord_cleanup(&g_coord);
    }
    return 0;
}
