/*
 * MPI integration test: a worker of a real training job is killed and the job recovers.
 * train_mlp's elastic loop (tide_mlp_tide_train, the code path of `train_mlp --tide`)
 * runs under the real tided on (dp 2, tp 2, pp 2); after KILL_AT steps one member
 * (pp 1, dp 1, tp 1) dies by SIGKILL. Usage, under `mpirun --enable-recovery`:
 *   test_examples_tide_recover TIDED TIDECTL SCENARIO
 * SCENARIO a row of tests/scenarios/test_examples_tide_recover.h (--list prints them): its
 * first layout, resizes, kill (KILL_AT: its step), checkpoint period (CKPT_EVERY; CKPT_AT:
 * the last multiple of it up to KILL_AT), the generation the recovery commits, the status
 * of the survivors' training and the recovery's layout. The rows:
 *   replica   8 ranks: the recovery layout is dp 1 over survivors (3 survivors go idle)
 *   midstep   as replica, but the victim dies inside step KILL_AT, after its backward
 *             pass and before its gradient allreduce: the workers outside its dp group
 *             could finish their own allreduces, yet none may update its state, so that
 *             every survivor still redoes step KILL_AT from the same state
 *   lastreduce as replica, but the victim dies inside step KILL_AT after its gradient
 *             allreduce and the loss reduction over dp: half of the survivors complete
 *             the step, the others are stuck in its last reductions and must finish it
 *             alone (TIDE_STEP_FINISH), so that all switch after step KILL_AT + 1
 *   stopped   as midstep, but the victim is stopped (SIGSTOP) instead of killed, until
 *             tided has declared it failed and committed the recovery without it; then it
 *             is resumed (SIGCONT). It must learn that it was fenced (tided answers its next
 *             message so), abort its old communicators and leave: its training returns
 *             TIDE_ERR_STALE naming the fence, while the survivors finish exactly as if it
 *             had died. tided must never list it idle or hand it work (it stays failed; no
 *             worker_back event), and its late messages must not disturb the survivors
 *   spare     9 ranks, one idle in the pool: the spare takes the dead rank's place and
 *             the recovery layout keeps (dp 2, tp 2, pp 2)
 *   layout    4 ranks, (dp 4, tp 1, pp 1), a global batch of 16 in 4 micro-batches per dp
 *             rank, and the model's limits declared at join (tide_mlp_tide_fit, as
 *             train_mlp --tide): `tidectl resize --dp 3` (and --dry-run) is refused with
 *             "dp 3 x 4 micro-batches = 12 does not divide 16 (the global batch)" and exit
 *             code 1 while the job trains, changing nothing; then a member dies and the 3
 *             survivors recover to dp 2 (not dp 3, which would kill every rank), the third
 *             survivor left idle, the events saying why; losses and final state match the
 *             never-failed runs within f32 reduction-order tolerance (4-member allreduces
 *             there take another order than libtide's ring)
 *   zero1     8 ranks, Adam moments DP-sharded (ZeRO-1): the dead rank's moment shards
 *             have no replica, so the job cannot be recovered from the survivors; tided
 *             must say so (job stalled, an event naming the lost state) instead of
 *             starting recoveries that every survivor fails, and halt the survivors:
 *             each one's training returns with the reason (TIDE_ERR_NO_HOLDER naming the
 *             lost moments) and the program exits
 *   ckpt-zero1 as zero1, but the job saves a checkpoint every CKPT_EVERY (2) steps
 *             (tide_checkpoint_every under a fresh root): the lost moments have no replica,
 *             so tided rolls the job back to its last complete checkpoint (step CKPT_AT = 4,
 *             which the victim waits to see reported as a checkpoint_saved event before it
 *             dies after step KILL_AT - 1, so that the rollback target is fixed): generation 2
 *             is (dp 1, tp 2, pp 2) over the 7 survivors (3 idle) as in replica, every member
 *             loads its shards from the checkpoint, and training goes on from step CKPT_AT:
 *             step CKPT_AT runs twice (once per generation), the steps after it lost with
 *             the victim (KILL_AT - CKPT_AT = 1) are redone, no step is skipped
 *   ckpt-dp1  2 ranks, (dp 1, tp 2, pp 1): the same rollback when the victim (tp 1) holds
 *             state that no replica has at all; rank 0 goes on alone on (dp 1, tp 1, pp 1)
 *   ckpt-corrupt as ckpt-zero1, but the victim flips one byte in the middle of a shard file of
 *             the checkpoint of step CKPT_AT before it dies: the members of generation 2 that
 *             read it fail its chunk check, all participants agree the switch failed, tided
 *             refuses that checkpoint (checkpoint_refused), abandons generation 2 (resize_aborted)
 *             and rolls back to the checkpoint before it (step CKPT_AT - CKPT_EVERY = 2) in
 *             generation 3: every survivor began two switches and completed one, at step 2;
 *             steps 2 .. KILL_AT - 1 ran twice (rolled_back "steps lost: 3"); everything else as
 *             ckpt-zero1 with 2 for CKPT_AT. The damaged checkpoint stays on disk failing its
 *             check unless generation 3 saved its step again (then it checks clean)
 *   ckpt-request 2 ranks, (dp 2, tp 1, pp 1) with ZeRO-1 (both ranks write shards), REQ_STEPS
 *             steps of at least 50 ms, nobody dies and no periodic checkpoints: after step 1,
 *             rank 0 runs `tidectl checkpoint JOB` (refused: non-zero exit, "pass --dir ROOT",
 *             the job saved nothing yet), `tidectl checkpoint nosuchjob --dir /tmp/x` (refused:
 *             "no online job named nosuchjob") and `tidectl --json checkpoint JOB --dir ROOT`,
 *             which tided grants for a step S that no rank has reached and that comes before
 *             the end; at the end ROOT/step-<S>/MANIFEST exists, tidectl events shows one
 *             checkpoint_requested and one checkpoint_saved for step S, and the checkpoint,
 *             verified and loaded whole into (dp 1, tp 1, pp 1), equals byte for byte the full
 *             state gathered after S steps; each step ran once, losses and final state as the
 *             never-failed runs'
 *   resize-spare 8 ranks resized from (dp 2, tp 2, pp 2) to (dp 2, tp 1, pp 2) (4 ranks go
 *             idle) GAP steps into the job; 4 steps after that switch a member dies and an idle
 *             rank takes its place, the recovery keeping (dp 2, tp 1, pp 2). Besides the checks
 *             below: the state is bit-identical across the resize too, every rank switches
 *             once for each layout change that holds it, and, the resize's step not being
 *             known in advance, the reference is the one-process run: losses within 1e-5,
 *             final state within relative L2 1e-4; the job ends once the recovery ran 4 steps
 *             (and not before step 24)
 * tided runs with a 100 ms heartbeat and a 1.5 s failure timeout, so detection is quick.
 * Checked: tided declares exactly the victim failed and commits generation 2 (a
 * recovery) without it, as `tidectl status/jobs/events --json` show; every survivor
 * switched at the same step, which is KILL_AT (the step the survivors were inside when
 * the victim died is redone, not skipped or counted twice); each step ran exactly once
 * on every live member of the layout active then; the full state right after the
 * switch is bit-identical to the one gathered over the whole old layout right before
 * the kill (the dead rank's shards came from its replicas); the loss of every step
 * equals on all members and matches a never-failed single-process run of the same
 * model within relative 1e-5; losses and the final gathered state (parameters, moments,
 * step counter, data cursor) are bit-identical to a never-failed plain-MPI run with the
 * same layouts (every allreduce there has two members, so the arithmetic is the same);
 * nothing hangs and every survivor finishes MPI cleanly. Post-run checks use a communicator of the
 * survivors only: MPI_COMM_WORLD still names the dead rank.
 * In the ckpt modes the recovery rolls back instead, so the same checks read: every
 * survivor switched at step CKPT_AT (its view's step after the switch is the checkpoint's);
 * the state right after the switch is bit-identical to the one gathered in generation 1
 * after CKPT_AT steps; steps before CKPT_AT ran once on every survivor of generation 1,
 * steps CKPT_AT .. KILL_AT - 1 once more on every member of generation 2 (so twice on
 * rank 0, which leads both layouts), later steps once in generation 2; the losses of the
 * re-run steps equal on the members and match the single-process run (the first runs
 * too, and each re-run its first run within relative 1e-5: the layouts differ, so do
 * their reduction orders); the never-failed plain-MPI run takes the same path (generation
 * 1's layout for CKPT_AT steps, then the recovery layout from the state after them), so
 * losses and final state are again bit-identical to it; tidectl shows one checkpoint_saved
 * event for each checkpoint published (steps 2, 4, .., STEPS, both generations: the one
 * rolled back to is not saved again, the periodic saves go on after the rollback), one
 * recovery_started event "from the checkpoint of step 4", the commit as one rolled_back
 * event (instead of recovered) naming the "checkpoint of step 4" and "steps lost: 1", and
 * no stalled event; every checkpoint is on disk at the end (MANIFEST), and the root is
 * removed.
 * The driver is one executable of five sources: this file (the scenario table, tided, the
 * never-failed runs and the checks after training), tide_recover_hooks.c (what each rank
 * records, where the victim dies), tide_recover_tided.c (what tided and tidectl report,
 * the watchdog), tide_recover_ckpt.c (the checkpoint scenarios) and tide_recover_resize.c
 * (the resizes before the kill, the switches and runs they call for), sharing
 * tide_recover_int.h.
 */
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "coord_harness.h"
#include "examples/mlp_mpi.h"
#include "examples/mlp_tide.h"
#include "mpi_test.h"
#include "tests/support/scenario.h"
#include "tide_recover_int.h"

int g_pids[16], g_npids;

void fail_all(void)
{
    fflush(stderr);
    fflush(stdout);
    int me = (int)getpid();
    for (int i = 0; i < g_npids; i++)
        if (g_pids[i] > 0 && g_pids[i] != me)
            kill(g_pids[i], SIGKILL);
    _exit(1);
}

static const recover_row scenarios[] = {
#define ROW(name, ranks, timeout, labels, mpi, first, resizes, kill, ckpt, gen, status, ...)       \
    {{name, ranks, timeout, labels, mpi, first, resizes, kill, ckpt, gen, status}, __VA_ARGS__},
#include "scenarios/test_examples_tide_recover.h"
#undef ROW
};

int g_rank;

/* the scenario this run plays (tide_recover_int.h) */
struct recover_plan g = {.victim = -1};

char g_ckpt_root[256], g_endpoint[256];
const char *g_tidectl;

/* ---- the scenario ---------------------------------------------------------------------------- */

/* The steps of the kill, once the victim's generation began at step base (every rank). */
void set_kill_base(int base)
{
    g.kill_base = base;
    g.kill = g.request ? g.steps : base + g.sc.kill.step;
    g.ckpt_at = g.ckpt ? g.kill / g.every * g.every : 0;
    g.switch_at = g.lastreduce ? g.kill + 1 : g.kill;
    if (g.ckpt) /* the checkpoint's step: the steps after it are redone */
        g.switch_at = g.corrupt ? g.ckpt_at - g.every : g.ckpt_at;
    if (g.request) /* no failure: one layout from the first step to the last */
        g.switch_at = g.steps;
    g.done1 = g.ckpt ? g.kill : g.switch_at;
}

/* The victim: the worker at the kill's coordinate of l, the layout it dies in. */
void find_victim(const tide_layout_t *l)
{
    const mt_kill *k = &g.sc.kill;
    if (g.request)
        return;
    MT_ASSERT(k->p < l->pp && k->d < l->dp && k->t < l->tp,
              "the kill's coordinate (p %d, d %d, t %d) is outside (dp %d, tp %d, pp %d)", k->p,
              k->d, k->t, l->dp, l->tp, l->pp);
    g.victim = l->worker[tide_layout_index(l, k->p, k->d, k->t)];
    MT_ASSERT(g.victim != 0, "rank 0 runs tided and the checks: it must not be the victim");
}

/* Sets g from the scenario's row; 0, or -1 with the reason on stderr. */
static int plan_scenario(const mt_row *row)
{
    g.row = (const recover_row *)(const void *)row;
    const char *w = NULL, *why = NULL;
    if (mt_scenario_parse(row, &g.sc) != TIDE_OK ||
        (g.row->recover[0] != '\0' && mt_layout_parse(g.row->recover, &g.recover) != TIDE_OK)) {
        why = tide_last_error();
        goto bad;
    }
    g.first = g.sc.first;
    if (g.row->recover[0] == '\0')
        g.recover = g.first;
    g.micro = g.first.micro > 0 ? g.first.micro : 4;
    g.batch = g.row->batch;
    g.steps = g.row->steps;
    g.fit = g.row->fit;
    g.corrupt = g.row->corrupt;
    g.request = g.row->request;
    g.every = row->ckpt_every;
    g.ckpt = g.every > 0;
    w = g.sc.kill.when;
    g.midstep = strcmp(w, "grads") == 0;
    g.lastreduce = strcmp(w, "loss") == 0;
    g.stopped = strcmp(w, "stop") == 0;
    g.spare = row->ranks > g.first.dp * g.first.tp * g.first.pp;
    g.halt = row->status == TIDE_ERR_NO_HOLDER;
    g.kill_gen = 1 + g.sc.n_resizes;
    g.final_gen = (uint64_t)row->gen;
    g.exact = g.sc.n_resizes == 0 && g.first.dp <= 2 && g.first.tp <= 2 && g.first.pp <= 2 &&
              g.recover.dp <= 2 && g.recover.tp <= 2 && g.recover.pp <= 2;
    if (!g.sc.has_first || g.steps > MAX_STEPS || g.kill_gen + 2 > MAX_GEN)
        why = "want a first layout, at most MAX_STEPS steps and MAX_GEN generations";
    else if (g.request ? w[0] != '\0'
                       : (strcmp(w, "after") != 0 && !g.midstep && !g.lastreduce && !g.stopped) ||
                             g.sc.kill.step < 1 || g.sc.kill.rank >= 0)
        why = "the kill is \"after|grads|loss|stop STEP at pPdDtT\" (none with request)";
    else if (g.halt ? row->gen != 1 : !g.request && row->gen != g.kill_gen + 1 + g.corrupt)
        why = "the generation is the recovery's (the victim's + 1, + 1 more when the "
              "checkpoint is damaged), or 1 when tided halts the job";
    if (why != NULL)
        goto bad;
    if (g.kill_gen == 1)
        set_kill_base(0);
    return 0;
bad:
    fprintf(stderr, "test_examples_tide_recover: scenario %s: %s\n", row->name, why);
    return -1;
}

/* ---- tided (rank 0, before MPI_Init) ---------------------------------------------------- */

static coord_proc g_coord;

/* failure after 15 missed heartbeats of 100 ms: detected within ~1.5 s, with room for a
   starved heartbeat thread on an oversubscribed machine. ckpt-request (no failure) beats
   once a second: tided's view of the job's step lags it by many steps, as on a loaded
   machine, and the step it proposes first may be one the ranks have passed already. */
static void start_tided(const char *exe)
{
    const char *flags[] = {"--heartbeat-ms", g.request ? "1000" : "100", "--miss-limit", "15",
                           "--resize-timeout-ms", "30000", NULL};
    if (coord_tmpdir(&g_coord) != 0 || coord_start(&g_coord, exe, flags, NULL) != 0)
        g_coord.endpoint[0] = '\0'; /* every rank sees no endpoint and fails */
}

static void stop_tided(void)
{
    coord_stop(&g_coord, SIGTERM);
    coord_cleanup(&g_coord);
}

/* ---- the never-failed runs ------------------------------------------------------------------ */

/* The loss of every step of the model trained in one process (the layout-free truth);
   with full_out, its final state too (caller frees with tide_mlp_full_free). Rank 0. */
static void reference_single(const tide_mlp_config *cfg, double *loss, void ***full_out)
{
    tide_layout_t *l = NULL;
    tide_mlp_t *m = NULL;
    tide_mlp_comm self;
    tide_mlp_comm_self(&self);
    MT_OK(tide_layout_new(&l, 1, 1, 1, cfg->layers, g.micro));
    MT_OK(tide_mlp_new(&m, cfg, l, 0, TIDE_MLP_CPU));
    MT_OK(tide_mlp_init(m));
    for (int64_t s = 0; s < g.steps; s++)
        MT_OK(tide_mlp_step(m, &self, &loss[s]));
    if (full_out != NULL)
        MT_OK(tide_mlp_gather(m, MPI_COMM_SELF, 0, full_out));
    tide_mlp_destroy(&m);
    tide_layout_destroy(&l);
}

/*
 * The same layouts as the recovered job, over plain MPI on every rank while all are
 * alive, and no failure: the first layout for g.switch_at steps (ckpt modes: g.ckpt_at,
 * the steps the checkpoint holds; the rolled-back steps after it are never run here),
 * then the layout the recovery must produce (moved through the root). Every allreduce
 * has at most two members, so the arithmetic is the recovered job's, and its final state
 * must equal this one bit for bit. Collective over world; rank 0 gets the final state in
 * *full_out.
 */
static void reference_layouts(const tide_mlp_config *cfg, double *loss, void ***full_out)
{
    tide_layout_t *l = NULL, *l2 = NULL;
    tide_mlp_t *m = NULL;
    tide_mlp_mpi_t *mpi = NULL;
    MT_OK(tide_layout_new(&l, g.first.dp, g.first.tp, g.first.pp, cfg->layers, g.micro));
    MT_OK(tide_layout_new(&l2, g.recover.dp, g.recover.tp, g.recover.pp, cfg->layers, g.micro));
    MT_OK(tide_mlp_new(&m, cfg, l, g_rank, TIDE_MLP_CPU));
    MT_OK(tide_mlp_init(m));
    MT_OK(tide_mlp_mpi_new(&mpi, MPI_COMM_WORLD, l));
    for (int64_t s = 0; s < g.steps; s++) {
        if (s == g.switch_at) {
            tide_mlp_mpi_destroy(&mpi);
            MT_OK(tide_mlp_relayout_via_root(m, MPI_COMM_WORLD, 0, l2));
            MT_OK(tide_mlp_mpi_new(&mpi, MPI_COMM_WORLD, l2));
        }
        loss[s] = 0.0;
        if (tide_mlp_active(m))
            MT_OK(tide_mlp_step(m, tide_mlp_mpi_comm(mpi), &loss[s]));
    }
    MT_OK(tide_mlp_gather(m, MPI_COMM_WORLD, 0, full_out));
    tide_mlp_mpi_destroy(&mpi);
    tide_mlp_destroy(&m);
    tide_layout_destroy(&l);
    tide_layout_destroy(&l2);
}

/* The relative difference of two f32 tensors of n elements as a whole: |a - b| / |b| (L2
   norms; an element near zero that the other reduction order moved does not dominate). */
static double rel_l2_f32(const float *a, const float *b, uint64_t n)
{
    double d2 = 0.0, b2 = 0.0;
    for (uint64_t k = 0; k < n; k++) {
        double d = (double)a[k] - (double)b[k];
        d2 += d * d;
        b2 += (double)b[k] * (double)b[k];
    }
    return b2 > 0 ? sqrt(d2 / b2) : sqrt(d2);
}

/* The recovered job's final state against the never-failed run's: bit for bit, or in
   layout mode (other reduction orders) within rel_tol for f32 tensors and exactly for the
   rest (step counter, data cursor). */
double compare_state(const tide_collection_t *c, void *const *got, void *const *want,
                     double rel_tol)
{
    double worst = 0.0;
    for (size_t i = 0; i < tide_collection_size(c); i++) {
        const tide_tensor_desc *d = tide_collection_tensor(c, i);
        uint64_t b = tide_tensor_bytes(d);
        if (memcmp(got[i], want[i], b) == 0)
            continue;
        if (rel_tol > 0 && d->dtype == TIDE_F32) {
            double rel = rel_l2_f32(got[i], want[i], b / sizeof(float));
            MT_ASSERT(rel <= rel_tol, "final %s differs from the never-failed run's by rel %.2e",
                      d->name, rel);
            worst = fmax(worst, rel);
            continue;
        }
        uint64_t k = 0;
        if (d->dtype == TIDE_F32)
            while (k + 1 < b / sizeof(float) &&
                   ((const float *)got[i])[k] == ((const float *)want[i])[k])
                k++;
        MT_FAIL("final %s differs from the never-failed run's (first at element %llu)", d->name,
                (unsigned long long)k);
    }
    return worst;
}

/* The end of a run whose checks all held on every survivor: the pass line (rank 0),
   the survivors' communicator and the collection freed, MPI finalized, tided stopped by
   the rank that started it. Returns the exit status. */
int pass(MPI_Comm *surv, tide_collection_t **coll, int is_root)
{
    if (g_rank == 0) {
        printf("test_examples_tide_recover: passed\n");
        fflush(stdout);
    }
    MPI_Comm_free(surv);
    tide_collection_destroy(coll);
    MPI_Finalize();
    if (is_root)
        stop_tided();
    return 0;
}

/* ---- the test -------------------------------------------------------------------------------- */

int main(int argc, char **argv)
{
    const mt_row *row = NULL;
    if (MT_ROWS_SELECT(argc, argv, 3, scenarios, &row))
        return 0; /* --list */
    if (row == NULL || argc < 4) {
        fprintf(stderr, "usage: test_examples_tide_recover TIDED TIDECTL SCENARIO\n");
        return 2;
    }
    if (plan_scenario(row) != 0)
        return 2;
    int want_size = row->ranks;
    const char *rank_env = getenv("OMPI_COMM_WORLD_RANK");
    int is_root = rank_env != NULL && strcmp(rank_env, "0") == 0;
    if (is_root)
        start_tided(argv[1]); /* before MPI_Init: fork is safe here */
    int prov = 0, size = 0;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &prov);
    MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    MT_ASSERT(size == want_size, "run scenario %s with %d ranks, not %d", argv[3], want_size, size);

    int mypid = (int)getpid();
    MPI_Allgather(&mypid, 1, MPI_INT, g_pids, 1, MPI_INT, MPI_COMM_WORLD);
    g_npids = size;

    char endpoint[256] = "";
    if (g_rank == 0)
        snprintf(endpoint, sizeof endpoint, "%s", g_coord.endpoint);
    MPI_Bcast(endpoint, sizeof endpoint, MPI_CHAR, 0, MPI_COMM_WORLD);
    MT_ASSERT(endpoint[0] != '\0', "tided did not start (no endpoint file)");
    snprintf(g_endpoint, sizeof g_endpoint, "%s", endpoint);
    g_tidectl = argv[2];
    if (g.ckpt || g.request) {
        if (g_rank == 0) {
            snprintf(g_ckpt_root, sizeof g_ckpt_root, "/tmp/tide-recover-ckpt-XXXXXX");
            if (mkdtemp(g_ckpt_root) == NULL)
                g_ckpt_root[0] = '\0';
        }
        MPI_Bcast(g_ckpt_root, sizeof g_ckpt_root, MPI_CHAR, 0, MPI_COMM_WORLD);
        MT_ASSERT(g_ckpt_root[0] != '\0', "no checkpoint root (mkdtemp in /tmp failed)");
    }

    tide_mlp_config cfg;
    tide_mlp_config_default(&cfg);
    /* ckpt-request: both dp ranks write a shard (their moments), and the publisher waits
       for the other's */
    cfg.zero1 = g.row->zero1;
    cfg.global_batch = g.batch;
    static record rec;
    rec.switch_at = -1;
    rec.spare = -1;
    MT_OK(tide_mlp_collection_new(&cfg, &rec.coll));
    rec.n_tensors = tide_collection_size(rec.coll);
    MT_ASSERT(rec.n_tensors <= MAX_T, "%zu tensors", rec.n_tensors);

    /* the never-failed run with the same layouts, while every rank is alive (with resizes
       their steps are not known before: the one-process run below stands in for it) */
    static double ref[MAX_STEPS], ref_layouts[MAX_STEPS];
    void **want = NULL; /* rank 0: the never-failed run's final state */
    int same_layouts = !g.halt && g.sc.n_resizes == 0;
    if (same_layouts)
        reference_layouts(&cfg, ref_layouts, &want);

    tide_options o;
    tide_options_init(&o);
    o.endpoint = endpoint;
    o.register_timeout_ms = 20000;
    o.switch_timeout_ms = 30000;
    o.staging_cap = 64 << 10; /* every recovery within old/new state + this, or it fails */
    o.mem_strict = 1;
    tide_t *t = NULL;
    MT_OK(tide_new(&t, &o, MPI_COMM_WORLD));
    g_t = t;
    /* the model's limits, declared as train_mlp --tide declares them */
    tide_fit_rule fit[TIDE_MLP_FIT_RULES];
    int n_fit = 0;
    MT_OK(tide_mlp_tide_fit(&cfg, g.micro, fit, &n_fit));
    tide_join_req jr = {JOB, rec.coll, g.first.dp, g.first.tp, g.first.pp, g.micro, 0, fit, n_fit};
    /* tided starts the job with the first 8 workers whose join arrives: in spare mode the
       others give rank 0 (which runs the checks and must lead both layouts) a head start,
       so that the spare is never rank 0, however slowly rank 0 runs (sanitizers) */
    if (g.spare && g_rank != 0)
        tide_sleep_ms(1000);
    MT_OK(tide_join(t, &jr));
    const tide_view *v = tide_view_get(t);
    MT_ASSERT(v->generation == 1 && v->layout->dp == g.first.dp && v->layout->tp == g.first.tp &&
                  v->layout->pp == g.first.pp,
              "first layout as requested");
    if (g.kill_gen == 1)
        find_victim(v->layout);
    for (int r = 0; r < size; r++)
        if (!layout_has(v->layout, r))
            rec.spare = r;
    MT_ASSERT(g.spare ? rec.spare >= 0 : rec.spare < 0, "spare rank %d", rec.spare);
    for (int k = 0; k <= MAX_GEN; k++)
        rec.gen_at[k] = -1;
    rec.gen_at[1] = 0;
    MT_OK(tide_layout_copy(&rec.layouts[1], v->layout));
    tide_mlp_t *m = NULL;
    MT_OK(tide_mlp_new(&m, &cfg, v->layout, tide_pool_rank(t), TIDE_MLP_CPU));
    if (v->member)
        MT_OK(tide_mlp_init(m));
    /* as train_mlp: the runtime owns the state and recovers it in place */
    MT_OK(tide_mlp_tide_give(t, m));
    /* as train_mlp --ckpt-save ROOT --ckpt-every 2 --ckpt-keep 0: the checkpoints the job
       rolls back to when no survivor holds the lost state */
    if (g.ckpt)
        MT_OK(tide_checkpoint_every(t, g_ckpt_root, g.every, 0));
    static watch wd;
    pthread_t th;
    if (g_rank == 0 && !g.request) {
        snprintf(wd.endpoint, sizeof wd.endpoint, "%s", endpoint);
        wd.tidectl = argv[2];
        if (g.victim >= 0) { /* else known at the switch to its generation */
            wd.victim_pid = g_pids[g.victim];
            wd.victim_id = tide_pool_worker_id(t, g.victim);
        }
        rec.wd = &wd;
        pthread_create(&th, NULL, watchdog, &wd);
    }
    static resizer rz;
    pthread_t rth;
    if (g_rank == 0 && g.sc.n_resizes > 0) {
        snprintf(rz.endpoint, sizeof rz.endpoint, "%s", endpoint);
        rz.tidectl = argv[2];
        pthread_create(&rth, NULL, resize_thread, &rz);
    }

    tide_mlp_tide_hooks h = {&rec, h_on_step, h_before, h_after, h_done, 0, h_at};
    tide_status trc = tide_mlp_tide_train(t, m, &h);
    if (g.stopped && g_rank == g.victim) {
        /* resumed after the job recovered without it: it must have been told so, and leave
           without another message to its old peers (no MPI_Finalize: that would progress
           what its aborted operations left behind) */
        const char *why = tide_last_error();
        MT_ASSERT(trc == TIDE_ERR_STALE && strstr(why, "fenced") != NULL,
                  "the resumed rank's training must end with its fence (TIDE_ERR_STALE naming "
                  "it); it ended with %s: %s",
                  tide_strerror(trc), why);
        fprintf(stderr, "[rank %d] leaving: %s\n", g_rank, why);
        fflush(stderr);
        tide_destroy(&t);
        tide_mlp_destroy(&m);
        _exit(0);
    }
    MT_ASSERT(g_rank != g.victim, "the victim is still alive");
    if (g_rank == 0 && g.sc.n_resizes > 0) {
        pthread_join(rth, NULL);
        MT_ASSERT(rz.why[0] == '\0', "%s", rz.why);
        MT_ASSERT(rz.sent == g.sc.n_resizes, "%d of %d resizes sent", rz.sent, g.sc.n_resizes);
    }
    if (g.request) {
        MT_OK(trc);
        if (g_rank == 0)
            reference_single(&cfg, ref, NULL);
        return finish_request(t, m, &rec, ref, ref_layouts, &want, is_root);
    }
    if (g.corrupt && trc != TIDE_OK)
        MT_FAIL("survivor %d: training ended with %s: %s (the switch to the recovery fails "
                "everywhere when its checkpoint cannot be loaded; the old generation must go on so "
                "that the next one rolls back to the checkpoint before it)",
                g_rank, tide_strerror(trc), tide_last_error());
    if (g.halt) {
        /* tided halts the job it cannot recover: every survivor's training ends with the
           reason instead of waiting for an operator */
        const char *why = tide_last_error();
        MT_ASSERT(trc == TIDE_ERR_NO_HOLDER && strstr(why, "halted") != NULL &&
                      strstr(why, "exp_avg") != NULL,
                  "survivor %d: training must end with tided's halt naming the lost moments; it "
                  "ended with %s: %s",
                  g_rank, tide_strerror(trc), why);
    } else {
        MT_ASSERT(trc == g.row->r.status, "survivor %d: training ended with %s, want %s: %s",
                  g_rank, tide_status_name(trc), tide_status_name(g.row->r.status),
                  tide_last_error());
    }
    if (g.ckpt) /* the periodic saves after the rollback are written (and published) */
        MT_OK(tide_checkpoint_wait(t));

    /* From here on only the survivors: MPI_COMM_WORLD still names the dead rank, so every
       check runs over a communicator of the others (created among them only). */
    MPI_Group wg, sg;
    MPI_Comm surv = MPI_COMM_NULL;
    MPI_Comm_group(MPI_COMM_WORLD, &wg);
    MPI_Group_excl(wg, 1, &g.victim, &sg);
    MT_ASSERT(MPI_Comm_create_group(MPI_COMM_WORLD, sg, 4711, &surv) == MPI_SUCCESS,
              "communicator of the survivors");
    MPI_Group_free(&sg);
    MPI_Group_free(&wg);
    int nsurv = 0;
    MPI_Comm_size(surv, &nsurv);
    if (g.halt) {
        if (g_rank == 0)
            pthread_join(th, NULL); /* check_stalled: tided's events say why */
        MPI_Barrier(surv);
        tide_destroy(&t);
        tide_mlp_destroy(&m);
        if (g_rank == 0)
            printf("recover-zero1: the %d survivors were halted with the reason and exit\n", nsurv);
        record_free_layouts(&rec);
        return pass(&surv, &rec.coll, is_root);
    }

    /* with resizes: every survivor ended at one step, the run's length from here on */
    if (g.sc.n_resizes > 0)
        g.steps = agreed_end(&rec, surv);
    if (g_rank == 0)
        reference_single(&cfg, ref, g.sc.n_resizes > 0 ? &want : NULL);

    /* every survivor took part in each switch whose old or new layout holds it: without
       resizes that is every survivor, once, in the recovery (the old members and the
       spare); ckpt-corrupt: and began one switch more, to the recovery that failed */
    static int64_t gen_at[MAX_GEN + 1];
    check_resizes(&rec, surv, gen_at);
    if (g.sc.n_resizes > 0) /* the victim's generation began there on every survivor */
        set_kill_base((int)gen_at[g.kill_gen]);
    share_recovery_layout(&rec, surv);
    int n_sw = switches_of(&rec, g_rank);
    MT_ASSERT(g.sc.n_resizes > 0 || n_sw == 1, "survivor %d is in neither layout of the recovery",
              g_rank);
    int off[2] = {rec.switches - n_sw, rec.befores - n_sw - g.corrupt}, off_lo[2], off_hi[2];
    MPI_Allreduce(off, off_lo, 2, MPI_INT, MPI_MIN, surv);
    MPI_Allreduce(off, off_hi, 2, MPI_INT, MPI_MAX, surv);
    MT_ASSERT(off_lo[0] == 0 && off_hi[0] == 0,
              "each survivor switched as often as the layouts that held it call for (%d here: "
              "%d); off by %d..%d",
              n_sw, rec.switches, off_lo[0], off_hi[0]);
    MT_ASSERT(!g.ckpt || (off_lo[1] == 0 && off_hi[1] == 0),
              "each survivor began %d switches (here %d; off by %d..%d on the others)",
              n_sw + g.corrupt, rec.befores, off_lo[1], off_hi[1]);
    /* (a survivor in neither layout of the recovery took no part: it never switched) */
    int in_rec = layout_has(rec.layouts[g.kill_gen], g_rank) || layout_has(rec.recover, g_rank);
    int64_t at = in_rec              ? rec.switch_at
                 : rec.switch_at < 0 ? g.switch_at
                                     : -2,
            at_lo = 0, at_hi = 0;
    MPI_Allreduce(&at, &at_lo, 1, MPI_INT64_T, MPI_MIN, surv);
    MPI_Allreduce(&at, &at_hi, 1, MPI_INT64_T, MPI_MAX, surv);
    MT_ASSERT(at_lo == g.switch_at && at_hi == g.switch_at,
              "the recovery switched at steps %lld..%lld, want %d on every survivor: the step "
              "running when rank %d died must be redone, neither skipped nor counted twice",
              (long long)at_lo, (long long)at_hi, g.switch_at, g.victim);
    const tide_layout_t *nl = rec.recover;
    MT_ASSERT(nl != NULL, "no recovery layout recorded");
    const tide_view *fv = tide_view_get(t);
    /* (a survivor that took no part in the recovery still has the generation before it) */
    uint64_t end_gen = in_rec ? g.final_gen : (uint64_t)g.kill_gen;
    MT_ASSERT(fv->generation == end_gen, "the job ended in generation %llu here, want %llu",
              (unsigned long long)fv->generation, (unsigned long long)end_gen);
    MT_ASSERT(fv->member == layout_has(nl, g_rank), "membership after the recovery");

    /* tided's view, before anyone says bye (rank 0 is a member: it finished the job) */
    if (g_rank == 0) {
        if (!g.stopped)
            wd.stop = 1; /* stopped mode: its watchdog ends once the resumed rank is gone */
        pthread_join(th, NULL);
        MT_ASSERT(wd.why[0] == '\0', "%s", wd.why);
        MT_ASSERT(!g.stopped || wd.fenced, "the resumed rank was not seen fenced and gone");
        MT_ASSERT(fv->member && nl->worker[0] == 0, "rank 0 leads the recovered layout");
        check_tidectl(argv[2], endpoint, nl);
    }

    /* the state right after the recovery is the whole state before the kill, bit for bit
       (lastreduce: the step the victim died in was completed, so no state before it was
       gathered; the final state against the never-failed run checks it; ckpt modes: the
       state after g.ckpt_at steps, which the checkpoint holds) */
    static uint64_t pre[MAX_T], post[MAX_T];
    MPI_Allreduce(rec.pre, pre, MAX_T, MPI_UINT64_T, MPI_MAX, surv);
    MPI_Allreduce(rec.post, post, MAX_T, MPI_UINT64_T, MPI_MAX, surv);
    for (size_t i = 0; i < rec.n_tensors && !g.lastreduce; i++)
        MT_ASSERT(pre[i] != 0 && pre[i] == post[i],
                  "tensor %s after the recovery differs from the state before the kill (hash "
                  "%016llx before, %016llx after)",
                  tide_collection_tensor(rec.coll, i)->name, (unsigned long long)pre[i],
                  (unsigned long long)post[i]);

    /* each step ran once on every live member of the layout active then (ckpt modes: the
       steps from the checkpoint's to the kill in both generations) */
    static int total[MAX_STEPS];
    MPI_Allreduce(rec.ran, total, g.steps, MPI_INT, MPI_SUM, surv);
    for (int k = 0; k < g.steps; k++) {
        int runs = runs_of(&rec, gen_at, k);
        MT_ASSERT(total[k] == runs,
                  "step %d ran %d times on the survivors, want %d (%s the recovery at step %d)", k,
                  total[k], runs,
                  k < g.switch_at ? "before"
                  : k < g.done1   ? "before and after (rolled back)"
                                  : "after",
                  g.switch_at);
    }
    if (g.ckpt && g_rank == 0)
        for (int k = 0; k < g.steps; k++)
            MT_ASSERT(rec.ran[k] == 1 + (k >= g.switch_at && k < g.done1),
                      "step %d ran %d times on rank 0, which leads both layouts: want %d", k,
                      rec.ran[k], 1 + (k >= g.switch_at && k < g.done1));

    /* losses: equal on every member, and those of the never-failed run */
    static double llo[MAX_STEPS], lhi[MAX_STEPS], flo[MAX_STEPS], fhi[MAX_STEPS];
    for (int k = 0; k < g.steps; k++) {
        /* NaN: a survivor that finished the step alone never saw its loss; ckpt modes: a
           rolled-back step's loss is its run in generation 2 (its first run's, below) */
        int redone = k >= g.switch_at && k < g.done1;
        int seen = rec.ran[k] > (redone ? rec.ran1[k] : 0) && !isnan(rec.loss[k]);
        llo[k] = seen ? rec.loss[k] : INFINITY;
        lhi[k] = seen ? rec.loss[k] : -INFINITY;
        int first = redone && rec.ran1[k] && !isnan(rec.loss1[k]);
        flo[k] = first ? rec.loss1[k] : INFINITY;
        fhi[k] = first ? rec.loss1[k] : -INFINITY;
    }
    MPI_Allreduce(MPI_IN_PLACE, llo, g.steps, MPI_DOUBLE, MPI_MIN, surv);
    MPI_Allreduce(MPI_IN_PLACE, lhi, g.steps, MPI_DOUBLE, MPI_MAX, surv);
    MPI_Allreduce(MPI_IN_PLACE, flo, g.steps, MPI_DOUBLE, MPI_MIN, surv);
    MPI_Allreduce(MPI_IN_PLACE, fhi, g.steps, MPI_DOUBLE, MPI_MAX, surv);

    /* the final state, gathered over the recovered layout, against the never-failed run's */
    void **full = NULL;
    if (fv->member)
        MT_OK(tide_mlp_tide_gather(t, m, fv, &full));
    double worst_loss = 0.0;
    if (g_rank == 0) {
        MT_ASSERT(full != NULL, "rank 0 gathered nothing");
        for (int k = 0; k < g.steps; k++) {
            MT_ASSERT(llo[k] == lhi[k], "step %d: loss differs between members (%.9g vs %.9g)", k,
                      llo[k], lhi[k]);
            double rel = fabs(llo[k] - ref[k]) / fabs(ref[k]);
            worst_loss = fmax(worst_loss, rel);
            MT_ASSERT(rel <= REL_TOL,
                      "step %d: loss %.9g of the recovered run vs %.9g never failed (rel %.2e)", k,
                      llo[k], ref[k], rel);
            if (!same_layouts) /* resizes: the one-process run above is the reference */
                continue;
            if (!g.exact) /* 4-member allreduces: another order in the reference */
                MT_ASSERT(fabs(llo[k] - ref_layouts[k]) <= REL_TOL * fabs(ref_layouts[k]),
                          "step %d: loss %.17g of the recovered run vs %.17g of the never-failed "
                          "run with the same layouts",
                          k, llo[k], ref_layouts[k]);
            else
                MT_ASSERT(llo[k] == ref_layouts[k],
                          "step %d: loss %.17g of the recovered run vs %.17g of the never-failed "
                          "run with the same layouts (bit-identical arithmetic)",
                          k, llo[k], ref_layouts[k]);
        }
        /* ckpt modes: the first runs of the rolled-back steps, on generation 1's layout (no
           reference ran them there: the reference switched at the checkpoint's step) */
        for (int k = g.switch_at; k < g.done1; k++) {
            MT_ASSERT(flo[k] == fhi[k],
                      "step %d's first run: loss differs between members (%.9g vs %.9g)", k, flo[k],
                      fhi[k]);
            double rel = fabs(flo[k] - ref[k]) / fabs(ref[k]);
            worst_loss = fmax(worst_loss, rel);
            MT_ASSERT(rel <= REL_TOL,
                      "step %d: loss %.9g of its first run vs %.9g never failed (rel %.2e)", k,
                      flo[k], ref[k], rel);
            MT_ASSERT(fabs(llo[k] - flo[k]) <= REL_TOL * fabs(flo[k]),
                      "step %d: loss %.17g after the rollback vs %.17g in its first run (on the "
                      "old layout)",
                      k, llo[k], flo[k]);
        }
        MT_ASSERT(ref[g.steps - 1] < ref[0], "the loss went down (%.4f -> %.4f)", ref[0],
                  ref[g.steps - 1]);
        /* resizes: against the one-process run, f32 tensors within relative L2 STATE_RTOL
           (reduction orders differ between layouts) */
        double tol = !same_layouts ? STATE_RTOL : g.exact ? 0.0 : 1e-5;
        double state_rel = compare_state(rec.coll, full, want, tol);
        if (tol > 0)
            printf("recover-%s: final state within rel %.2e (L2, per tensor) of the "
                   "never-failed run\n",
                   argv[3], state_rel);
        MT_ASSERT(!g.fit || rec.refused_checked, "the dp 3 resize was never tried");
    }
    tide_mlp_full_free(rec.coll, &full);
    tide_mlp_full_free(rec.coll, &want);

    /* everyone is out of the runtime before anyone says bye */
    MPI_Barrier(surv);
    tide_destroy(&t);
    tide_mlp_destroy(&m);
    if (g_rank == 0 && g.ckpt) {
        char refused[160] = "";
        if (g.corrupt)
            snprintf(refused, sizeof refused,
                     " (its checkpoint of step %d damaged: refused, generation 2 abandoned; %s)",
                     g.ckpt_at,
                     g_resaved ? "saved again in generation 3"
                               : "not saved again in generation 3: the damaged copy stays");
        printf("recover-%s: rank %d killed after step %d%s; tided rolled the job back to the "
               "checkpoint of step %d and recovered to (dp %d, tp %d, pp %d) on %d survivors in "
               "generation %llu; switch at step %d on all; state bit-identical to generation 1's "
               "after %d steps; max loss rel diff %.2e to one process; losses and final state "
               "bit-identical to a never-failed run of the same layouts\n",
               argv[3], g.victim, g.kill - 1, refused, g.switch_at, nl ? nl->dp : 0,
               nl ? nl->tp : 0, nl ? nl->pp : 0, nsurv, (unsigned long long)g.final_gen,
               g.switch_at, g.switch_at, worst_loss);
        fflush(stdout);
    } else if (g_rank == 0) {
        printf("recover-%s: rank %d killed %s step %d; tided recovered to (dp %d, tp %d, pp "
               "%d) on %d survivors; switch at step %d on all;%s max loss rel diff %.2e to one "
               "process; losses and final state %s a never-failed run %s\n",
               argv[3], g.victim,
               g.midstep || g.lastreduce ? "inside"
               : g.stopped               ? "(stopped, then resumed and fenced) inside"
                                         : "after",
               g.midstep || g.lastreduce || g.stopped ? g.kill : g.kill - 1, nl ? nl->dp : 0,
               nl ? nl->tp : 0, nl ? nl->pp : 0, nsurv, g.switch_at,
               g.lastreduce ? "" : " state bit-identical across the recovery;", worst_loss,
               g.exact ? "bit-identical to" : "within f32 reduction-order tolerance of",
               same_layouts ? "of the same layouts" : "in one process (after the resizes)");
        fflush(stdout);
    }
    record_free_layouts(&rec);
    MPI_Barrier(surv);
    if (g.ckpt && g_rank == 0)
        remove_checkpoints(g_ckpt_root);
    return pass(&surv, &rec.coll, is_root);
}
