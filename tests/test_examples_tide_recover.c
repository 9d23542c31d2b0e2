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
 */
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ckpt/ckpt.h"
#include "coord_harness.h"
#include "core/alloc.h"
#include "examples/mlp_mpi.h"
#include "examples/mlp_tide.h"
#include "mlp_state.h"
#include "mpi_test.h"
#include "tests/support/scenario.h"

#define JOB         "mlp-recover"
#define MAX_STEPS   64 /* the most steps of any scenario (array sizes) */
#define MAX_GEN     8  /* the most generations of any scenario */
#define GAP         3  /* steps a generation runs before the next resize is sent */
#define MAX_T       256
#define REL_TOL     1e-5
#define STATE_RTOL  1e-4 /* relative L2 of a final f32 tensor against the one-process run */
#define DETECT_S    20   /* the recovery must be committed within this long of the kill, s */
#define CKPT_WAIT_S 20   /* the victim waits this long for tided to hear of it, s */

/*
 * A failed check ends every rank at once. MPI_Abort does not under --enable-recovery
 * (mpirun then only drops the aborting rank and the others wait until ctest's timeout),
 * so the pids of the pool are known to every rank and killed directly.
 */
static int g_pids[16], g_npids;

static void fail_all(void)
{
    fflush(stderr);
    fflush(stdout);
    int me = (int)getpid();
    for (int i = 0; i < g_npids; i++)
        if (g_pids[i] > 0 && g_pids[i] != me)
            kill(g_pids[i], SIGKILL);
    _exit(1);
}

#undef MT_FAIL
#define MT_FAIL(...)                                                                               \
    do {                                                                                           \
        fprintf(stderr, "[rank %d] %s:%d: FAILED: ", mt_rank(), __FILE__, __LINE__);               \
        fprintf(stderr, __VA_ARGS__);                                                              \
        fputc('\n', stderr);                                                                       \
        fail_all();                                                                                \
    } while (0)

/* A scenario: the generic columns, then this driver's
   (tests/scenarios/test_examples_tide_recover.h). */
typedef struct recover_row {
    mt_row r;
    const char *recover; /* the layout the recovery must produce, "" when none */
    int zero1, batch, steps;
    int fit;     /* the model's fit rules refuse dp 3 and shape the recovery */
    int corrupt; /* the victim damages the checkpoint the job would roll back to */
    int request; /* nobody dies: `tidectl checkpoint` while training */
} recover_row;

static const recover_row scenarios[] = {
#define ROW(name, ranks, timeout, labels, mpi, first, resizes, kill, ckpt, gen, status, ...)       \
    {{name, ranks, timeout, labels, mpi, first, resizes, kill, ckpt, gen, status}, __VA_ARGS__},
#include "scenarios/test_examples_tide_recover.h"
#undef ROW
};

static int g_rank;

/*
 * The scenario this run plays: its row and what follows from it, set in main before the
 * join. The kill's steps count from the generation the victim dies in, so they are set
 * (set_kill_base) on every rank once it is in that generation: at the join, or at the
 * switch to it after the resizes. Read by the training thread and rank 0's watchdog.
 */
static struct {
    const recover_row *row;
    mt_scenario sc;
    mt_layout first, recover; /* recover: the first layout when the row names none */
    int micro, batch, steps;
    int spare;      /* more ranks than the first layout: a spare takes the dead rank's place */
    int halt;       /* no survivor holds the lost state and there is no checkpoint: tided
                       stalls the job and halts the survivors (status TIDE_ERR_NO_HOLDER) */
    int midstep;    /* the victim dies inside its step, before its gradient allreduce */
    int lastreduce; /* ... inside its step's last reductions */
    int stopped;    /* ... is stopped there (SIGSTOP) instead, and resumed once recovered */
    int fit, corrupt, request;
    int ckpt;           /* the recovery rolls back to the last periodic checkpoint */
    int every;          /* ckpt: a checkpoint every this many steps */
    int kill_gen;       /* the generation the victim dies in (1 + resizes) */
    int exact;          /* every allreduce of the never-failed run has at most two members, so its
                           arithmetic is the recovered job's: losses and state bit-identical */
    uint64_t final_gen; /* the generation the recovery commits */
    /* set by set_kill_base: */
    int kill_base; /* the step the victim's generation began at */
    int kill;      /* the victim dies after completing steps .. kill - 1 (inside step kill) */
    int ckpt_at;   /* ckpt: the last checkpoint before the kill holds this many steps */
    int switch_at; /* the step every survivor must switch to the recovery at */
    int done1;     /* the victim's generation ran steps .. done1 - 1 on its survivors */
    int victim;    /* pool rank of the killed member, -1 until known */
} g = {.victim = -1};

/* ckpt modes: the checkpoint root (made by rank 0), tidectl and tided's endpoint (for the
   victim, which waits for its checkpoint to be known) */
static char g_ckpt_root[256], g_endpoint[256];
static const char *g_tidectl;

/* ---- the scenario ---------------------------------------------------------------------------- */

/* The steps of the kill, once the victim's generation began at step base (every rank). */
static void set_kill_base(int base)
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
static void find_victim(const tide_layout_t *l)
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
#define DP3_REASON "dp 3 x 4 micro-batches = 12 does not divide 16 (the global batch)"

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

/* ---- tidectl ------------------------------------------------------------------------------- */

/* Runs `tidectl --endpoint E --json CMD` with stdout into out; its exit status. */
static int tidectl_json(const char *tidectl, const char *endpoint, const char *cmd, char *out,
                        size_t cap)
{
    const char *args[] = {"--json", cmd, NULL};
    return coord_tidectl(tidectl, endpoint, args, out, cap);
}

/* `tidectl --json events` for every event of this short test (tidectl lists the newest 100
   unless told otherwise), into out; its exit status. */
static int tidectl_events(const char *tidectl, const char *endpoint, char *out, size_t cap)
{
    const char *args[] = {"--json", "events", "--limit", "500", NULL};
    return coord_tidectl(tidectl, endpoint, args, out, cap);
}

static int count_of(const char *hay, const char *needle)
{
    int n = 0;
    for (const char *p = strstr(hay, needle); p != NULL; p = strstr(p + 1, needle))
        n++;
    return n;
}

/* The JSON object ({...}) of hay around p (a position in it), copied into out. */
static void object_at(const char *hay, const char *p, char *out, size_t cap)
{
    const char *a = p, *b = p;
    while (a > hay && *a != '{')
        a--;
    while (*b != '\0' && *b != '}')
        b++;
    size_t n = (size_t)(b - a) + 1 < cap ? (size_t)(b - a) + 1 : cap - 1;
    memcpy(out, a, n);
    out[n] = '\0';
}

/* The JSON object of hay that contains needle (its first), copied into out; 0 when none. */
static int object_with(const char *hay, const char *needle, char *out, size_t cap)
{
    const char *p = strstr(hay, needle);
    if (p == NULL)
        return 0;
    object_at(hay, p, out, cap);
    return 1;
}

/* Whether s holds text, a number that ends text matched whole ("step 4" is not in "step
   40", nor "steps lost: 1" in "steps lost: 12"). */
static int has_text(const char *s, const char *text)
{
    size_t n = strlen(text);
    int num = n > 0 && isdigit((unsigned char)text[n - 1]);
    for (const char *p = strstr(s, text); p != NULL; p = strstr(p + 1, text))
        if (!num || !isdigit((unsigned char)p[n]))
            return 1;
    return 0;
}

/* The number of events of kind in a `tidectl --json events` reply whose object holds text
   (has_text). */
static int events_with(const char *events, const char *kind, const char *text)
{
    char needle[96], obj[2048];
    snprintf(needle, sizeof needle, "\"kind\":\"%s\"", kind);
    int n = 0;
    for (const char *p = strstr(events, needle); p != NULL; p = strstr(p + 1, needle)) {
        object_at(events, p, obj, sizeof obj);
        n += has_text(obj, text);
    }
    return n;
}

/* ckpt modes: the first checkpoint step (every g.every up to STEPS) that a `tidectl
   --json events` reply does not show exactly once as a checkpoint_saved event; -1 when
   none. */
static int unreported_checkpoint(const char *events)
{
    char want[32];
    for (int k = g.every; k <= g.steps; k += g.every) {
        snprintf(want, sizeof want, "step %d", k);
        int n = events_with(events, "checkpoint_saved", want);
        /* ckpt-corrupt: generation 3 redoes the step of the refused checkpoint, and may save
           it again (remove_checkpoints checks the files agree) */
        if (n != 1 && !(g.corrupt && k == g.ckpt_at && n == 2))
            return k;
    }
    return -1;
}

/* ckpt-corrupt: whether the damaged checkpoint was saved again when generation 3 redid its
   step (two checkpoint_saved events for it), as rank 0 saw in check_tidectl */
static int g_resaved;

/* Rank 0, after the job's last step and before any bye: what tidectl reports. */
static tide_t *g_t; /* rank 0's runtime, for the victim's worker id */

static void check_tidectl(const char *tidectl, const char *endpoint, const tide_layout_t *now)
{
    static char buf[1 << 18];
    char obj[2048], want[400];
    MT_ASSERT(tidectl_json(tidectl, endpoint, "status", buf, sizeof buf) == 0,
              "tidectl status failed: %s", buf);
    int size = 0;
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    MT_ASSERT(count_of(buf, "\"worker\":") == size, "tidectl status lists %d workers, want %d: %s",
              count_of(buf, "\"worker\":"), size, buf);
    MT_ASSERT(count_of(buf, "\"state\":\"failed\"") == 1,
              "tidectl status shows %d failed workers, want exactly the victim: %s",
              count_of(buf, "\"state\":\"failed\""), buf);
    MT_ASSERT(count_of(buf, "\"job\":\"" JOB "\"") == (int)tide_layout_size(now),
              "tidectl status shows %d workers in the job, want the %zu of the recovery layout: "
              "%s",
              count_of(buf, "\"job\":\"" JOB "\""), tide_layout_size(now), buf);

    MT_ASSERT(tidectl_json(tidectl, endpoint, "jobs", buf, sizeof buf) == 0,
              "tidectl jobs failed: %s", buf);
    MT_ASSERT(object_with(buf, "\"name\":\"" JOB "\"", obj, sizeof obj), "no job %s in %s", JOB,
              buf);
    snprintf(want, sizeof want, "\"gen\":%llu,\"dp\":%d,\"tp\":%d,\"pp\":%d",
             (unsigned long long)g.final_gen, now->dp, now->tp, now->pp);
    MT_ASSERT(strstr(obj, want) != NULL && strstr(obj, "\"state\":\"running\"") != NULL,
              "tidectl jobs: want %s, running; got %s", want, obj);

    /* ckpt modes: the last checkpoints' reports may still be on their way (rank 0, their
       publisher, waited until they were published, not until tided heard of them) */
    uint64_t deadline = tide_now_ns() + 10 * 1000000000ull;
    for (;;) {
        MT_ASSERT(tidectl_events(tidectl, endpoint, buf, sizeof buf) == 0,
                  "tidectl events failed: %s", buf);
        if (!g.ckpt || unreported_checkpoint(buf) < 0 || tide_now_ns() >= deadline)
            break;
        tide_sleep_ms(50);
    }
    MT_ASSERT(object_with(buf, "\"kind\":\"worker_failed\"", obj, sizeof obj),
              "no worker_failed event: %s", buf);
    snprintf(want, sizeof want, " rank %d on ", g.victim);
    MT_ASSERT(strstr(obj, want) != NULL && strstr(obj, "no message for") != NULL,
              "the failed worker is not rank %d (missed heartbeats): %s", g.victim, obj);
    MT_ASSERT(count_of(buf, "\"kind\":\"worker_failed\"") == 1, "more than one worker failed: %s",
              buf);
    /* the commit's event: a rollback's is rolled_back (checked below) */
    const char *commit = g.ckpt ? "rolled_back" : "recovered";
    char committed[64];
    snprintf(want, sizeof want, "\"kind\":\"%s\"", commit);
    snprintf(committed, sizeof committed,
             "generation %llu committed: ", (unsigned long long)g.final_gen);
    MT_ASSERT(object_with(buf, want, obj, sizeof obj) && strstr(obj, committed) != NULL,
              "no %s event for generation %llu: %s", commit, (unsigned long long)g.final_gen, buf);
    snprintf(want, sizeof want, "from step %d,", g.switch_at);
    MT_ASSERT(g.ckpt || strstr(obj, want) != NULL, "recovered event: want %s in %s", want, obj);
    /* ckpt-corrupt: generation 2, whose checkpoint no member could load, was abandoned */
    MT_ASSERT(count_of(buf, "\"kind\":\"resize_aborted\"") == g.corrupt &&
                  (!g.corrupt || events_with(buf, "resize_aborted", "generation 2 abandoned: ")),
              "want %d resize_aborted events%s: %s", g.corrupt,
              g.corrupt ? " (\"generation 2 abandoned: \")" : "", buf);
    /* a rank that comes back after the job recovered without it never rejoins the pool */
    MT_ASSERT(count_of(buf, "\"kind\":\"worker_back\"") == 0,
              "a failed worker was taken back (stopped mode: the resumed rank must be fenced): %s",
              buf);
    snprintf(want, sizeof want, "on worker %d ", tide_pool_worker_id(g_t, g.victim));
    MT_ASSERT(!object_with(buf, want, obj, sizeof obj) ||
                  strstr(obj, "\"kind\":\"offline_assigned\"") == NULL,
              "offline work was given to the failed worker: %s", obj);
    MT_ASSERT(count_of(buf, "\"kind\":\"resize_started\"") == g.sc.n_resizes,
              "want %d resize_started events, one per resize of the scenario (the refused dp 3 "
              "must change nothing): %s",
              g.sc.n_resizes, buf);
    MT_ASSERT(count_of(buf, "\"kind\":\"stalled\"") == 0, "the job was stalled: %s", buf);
    if (g.ckpt) {
        /* one event for each checkpoint published, in both generations: the one the job
           rolled back to was not saved again, and the periodic saves went on after it */
        int k = unreported_checkpoint(buf);
        snprintf(want, sizeof want, "step %d", g.ckpt_at);
        g_resaved = g.corrupt && events_with(buf, "checkpoint_saved", want) == 2;
        MT_ASSERT(k < 0,
                  "want one checkpoint_saved event with \"step %d\" (every %d steps, each "
                  "published once) within 10 s of its publication: %s",
                  k, g.every, buf);
        snprintf(want, sizeof want, "from the checkpoint of step %d", g.ckpt_at);
        MT_ASSERT(count_of(buf, "\"kind\":\"recovery_started\"") == 1 + g.corrupt &&
                      events_with(buf, "recovery_started", want) == 1,
                  "want %d recovery_started events, one \"%s\": %s", 1 + g.corrupt, want, buf);
        if (g.corrupt) {
            /* the damaged checkpoint is refused and the next recovery starts from the one
               before it */
            snprintf(want, sizeof want, "from the checkpoint of step %d", g.switch_at);
            MT_ASSERT(events_with(buf, "recovery_started", want) == 1,
                      "want a second recovery_started event, \"%s\": %s", want, buf);
            snprintf(want, sizeof want, "the checkpoint of step %d (%s/step-%012d)", g.ckpt_at,
                     g_ckpt_root, g.ckpt_at);
            MT_ASSERT(count_of(buf, "\"kind\":\"checkpoint_refused\"") == 1 &&
                          object_with(buf, "\"kind\":\"checkpoint_refused\"", obj, sizeof obj) &&
                          strstr(obj, want) != NULL && strstr(obj, "could not be loaded") != NULL,
                      "want one checkpoint_refused event, \"%s ... could not be loaded\": %s", want,
                      buf);
            /* and the members that read the damaged shard say which file, in the events */
            MT_ASSERT(object_with(buf, "\"kind\":\"checkpoint_failed\"", obj, sizeof obj) &&
                          strstr(obj, "shard-") != NULL && strstr(obj, "is corrupted") != NULL,
                      "want a checkpoint_failed event naming the damaged shard file: %s", buf);
        } else {
            MT_ASSERT(count_of(buf, "\"kind\":\"checkpoint_refused\"") == 0,
                      "a checkpoint was refused: %s", buf);
        }
        MT_ASSERT(count_of(buf, "\"kind\":\"rolled_back\"") == 1,
                  "want exactly one rolled_back event: %s", buf);
        MT_ASSERT(object_with(buf, "\"kind\":\"rolled_back\"", obj, sizeof obj), "no rolled_back");
        snprintf(want, sizeof want, "from the checkpoint of step %d (%s/step-%012d)", g.switch_at,
                 g_ckpt_root, g.switch_at);
        MT_ASSERT(strstr(obj, want) != NULL, "the rolled_back event must name the %s: %s",
                  want + strlen("from the "), obj);
        snprintf(want, sizeof want, "steps lost: %d (the job had completed %d)",
                 g.kill - g.switch_at, g.kill);
        MT_ASSERT(has_text(obj, want), "the rolled_back event must say \"%s\": %s", want, obj);
    }
    if (g.fit) {
        MT_ASSERT(object_with(buf, "\"kind\":\"job_created\"", obj, sizeof obj) &&
                      strstr(obj, "fit: dp x micro-batches divides 16 (the global batch); tp "
                                  "divides 256 (the FFN width); tp divides 64 (the "
                                  "vocabulary)") != NULL,
                  "the job's limits are not in its job_created event: %s", obj);
        MT_ASSERT(object_with(buf, "\"kind\":\"recovery_started\"", obj, sizeof obj) &&
                      strstr(obj, "dp 2 instead of 4") != NULL &&
                      strstr(obj, "the job's program cannot run dp 3: " DP3_REASON) != NULL &&
                      strstr(obj, "1 worker left idle for offline work") != NULL,
                  "the recovery event must say why dp 2 and what is left idle: %s", obj);
    }
}

/* layout mode, rank 0 while the job trains in generation 1: `tidectl resize --dp 3`, with
   and without --dry-run, is refused with the model's reason and exit code 1. */
static void check_refused_resize(const char *tidectl, const char *endpoint)
{
    static char out[8192];
    const char *dry[] = {"resize", JOB, "--dp", "3", "--dry-run", NULL};
    const char *real[] = {"resize", JOB, "--dp", "3", NULL};
    const char *const *cmds[] = {dry, real};
    for (int i = 0; i < 2; i++) {
        int code = coord_tidectl_io(tidectl, endpoint, cmds[i], out, sizeof out, 1);
        MT_ASSERT(code == 1 && strstr(out, DP3_REASON) != NULL,
                  "tidectl resize --dp 3%s must be refused (exit 1) with \"" DP3_REASON
                  "\"; exit %d: %s",
                  i == 0 ? " --dry-run" : "", code, out);
    }
    printf("recover-layout: tidectl resize --dp 3 refused while training: %s", out);
    fflush(stdout);
}

/* ---- watchdog (rank 0 thread): the recovery must come, not a hang --------------------------- */

typedef struct watch {
    char endpoint[256];
    const char *tidectl;
    volatile int stop;
    volatile uint64_t killed_ns; /* set when the victim's last step was recorded */
    /* stopped mode */
    int victim_pid;       /* the stopped rank's process */
    int32_t victim_id;    /* its tided worker id */
    volatile int resumed; /* SIGCONT sent, after the recovery committed */
    volatile int fenced;  /* tided fenced it and its process is gone */
    char why[512];        /* what went wrong in the watchdog (stopped mode), "" when nothing */
} watch;

/* zero1 mode, rank 0's thread (its main thread waits in the step like every survivor, until
   tided's halt ends it): once tided stalled the job, checks what it says. */
static void check_stalled(watch *w)
{
    static char buf[1 << 18];
    char obj[2048];
    uint64_t deadline = tide_now_ns() + DETECT_S * 1000000000ull;
    while (w->killed_ns == 0 || !strstr(buf, "\"kind\":\"stalled\"")) {
        MT_ASSERT(w->killed_ns == 0 || tide_now_ns() < deadline,
                  "tided did not stall the job within %d s of the kill: %s", DETECT_S, buf);
        tide_sleep_ms(100);
        if (w->killed_ns != 0)
            MT_ASSERT(tidectl_json(w->tidectl, w->endpoint, "events", buf, sizeof buf) == 0,
                      "tidectl events failed: %s", buf);
    }
    tide_sleep_ms(1500); /* a recovery started after the stall would show by now */
    MT_ASSERT(tidectl_json(w->tidectl, w->endpoint, "events", buf, sizeof buf) == 0,
              "tidectl events failed: %s", buf);
    MT_ASSERT(count_of(buf, "\"kind\":\"recovery_started\"") == 0,
              "tided started %d recoveries that cannot succeed (the lost ZeRO-1 moments have no "
              "replica): %s",
              count_of(buf, "\"kind\":\"recovery_started\""), buf);
    MT_ASSERT(count_of(buf, "\"kind\":\"stalled\"") == 1, "one stalled event: %s", buf);
    MT_ASSERT(object_with(buf, "\"kind\":\"stalled\"", obj, sizeof obj) &&
                  strstr(obj, "cannot be rebuilt from the survivors") != NULL &&
                  strstr(obj, ".exp_avg") != NULL && strstr(obj, "checkpoint") != NULL,
              "the stalled event must name the lost moments and the way out: %s", obj);
    MT_ASSERT(tidectl_json(w->tidectl, w->endpoint, "jobs", buf, sizeof buf) == 0,
              "tidectl jobs failed: %s", buf);
    MT_ASSERT(object_with(buf, "\"name\":\"" JOB "\"", obj, sizeof obj) &&
                  strstr(obj, "\"gen\":1,") != NULL &&
                  strstr(obj, "\"state\":\"stalled\"") != NULL,
              "the stalled job stays at generation 1, listed stalled: %s", obj);
    printf("recover-zero1: rank %d killed after step %d; tided stalled the job: no live replica "
           "of its ZeRO-1 moments; no recovery started\n",
           g.victim, g.kill - 1);
    fflush(stdout);
}

/* The state tided lists for worker id in a status reply (a tidectl --json status), copied
   into out; "" when it is not listed. */
static void worker_state_of(const char *status, int32_t id, char *out, size_t cap)
{
    char needle[48], obj[1024];
    snprintf(needle, sizeof needle, "\"worker\":%d,", (int)id);
    out[0] = '\0';
    if (!object_with(status, needle, obj, sizeof obj))
        return;
    const char *p = strstr(obj, "\"state\":\"");
    if (p == NULL)
        return;
    p += strlen("\"state\":\"");
    size_t n = strcspn(p, "\"");
    n = n < cap - 1 ? n : cap - 1;
    memcpy(out, p, n);
    out[n] = '\0';
}

/* stopped mode, rank 0's thread: once tided committed the recovery without the stopped
   rank, resumes it; from then on tided must list it failed (never idle: it would be handed
   offline work while its program is stuck in a step of the old generation) until it has
   been told it was fenced and its process has left. */
static void watch_stopped(watch *w)
{
    static char buf[1 << 18];
    char st[32];
    uint64_t deadline = 0;
    while (!w->stop) {
        tide_sleep_ms(50);
        if (w->killed_ns == 0)
            continue;
        if (deadline == 0)
            deadline = tide_now_ns() + 2ull * DETECT_S * 1000000000ull;
        if (tide_now_ns() > deadline) {
            snprintf(w->why, sizeof w->why,
                     "%s within %d s of the stop (victim worker %d, last state '%s')",
                     w->resumed ? "the resumed rank was not fenced and gone"
                                : "no recovery committed",
                     2 * DETECT_S, (int)w->victim_id, st);
            return;
        }
        if (tidectl_json(w->tidectl, w->endpoint, "status", buf, sizeof buf) != 0)
            continue;
        worker_state_of(buf, w->victim_id, st, sizeof st);
        if (!w->resumed) {
            if (tidectl_json(w->tidectl, w->endpoint, "jobs", buf, sizeof buf) != 0)
                continue;
            char obj[1024];
            char gen[32];
            snprintf(gen, sizeof gen, "\"gen\":%llu,", (unsigned long long)g.final_gen);
            if (!object_with(buf, "\"name\":\"" JOB "\"", obj, sizeof obj) ||
                strstr(obj, gen) == NULL || strstr(obj, "\"state\":\"running\"") == NULL)
                continue;
            if (strcmp(st, "failed") != 0) {
                snprintf(w->why, sizeof w->why,
                         "the recovery committed but the stopped worker %d is '%s', not failed",
                         (int)w->victim_id, st);
                return;
            }
            fprintf(stderr, "[rank 0] generation %llu committed without rank %d: resuming it\n",
                    (unsigned long long)g.final_gen, g.victim);
            kill(w->victim_pid, SIGCONT);
            w->resumed = 1;
            continue;
        }
        if (st[0] != '\0' && strcmp(st, "failed") != 0) {
            snprintf(w->why, sizeof w->why,
                     "tided lists the resumed (fenced) worker %d as '%s': it must stay failed",
                     (int)w->victim_id, st);
            return;
        }
        if (kill(w->victim_pid, 0) != 0 &&
            tidectl_json(w->tidectl, w->endpoint, "events", buf, sizeof buf) == 0) {
            char want[64], obj[2048];
            snprintf(want, sizeof want, "\"kind\":\"worker_fenced\"");
            snprintf(st, sizeof st, "worker %d ", (int)w->victim_id);
            if (!object_with(buf, want, obj, sizeof obj) || strstr(obj, st) == NULL) {
                snprintf(w->why, sizeof w->why,
                         "the resumed rank left but tided recorded no worker_fenced event for "
                         "worker %d",
                         (int)w->victim_id);
                return;
            }
            w->fenced = 1;
            return;
        }
    }
}

static void *watchdog(void *arg)
{
    watch *w = arg;
    if (g.stopped) {
        watch_stopped(w);
        return NULL;
    }
    if (g.halt) {
        check_stalled(w);
        return NULL;
    }
    void *ctx = zmq_ctx_new();
    void *s = coord_connect(ctx, w->endpoint, NULL, NULL, NULL, 5000);
    while (s != NULL && !w->stop) {
        tide_sleep_ms(100);
        if (w->killed_ns == 0 || tide_now_ns() - w->killed_ns < DETECT_S * 1000000000ull)
            continue;
        tide_msg_t q, r;
        tide_msg_init(&q, TIDE_MSG_JOBS);
        uint64_t gen = 0;
        if (coord_call(s, &q, &r) == 0 && r.type == TIDE_MSG_JOBS_REPLY)
            for (uint32_t i = 0; i < r.u.jobs_reply.n_rows; i++)
                if (strcmp(r.u.jobs_reply.rows[i].name, JOB) == 0)
                    gen = r.u.jobs_reply.rows[i].gen;
        tide_msg_clear(&r);
        if (gen <= (uint64_t)g.kill_gen && !w->stop) {
            static char ev[1 << 18]; /* what tided did instead */
            if (tidectl_events(w->tidectl, w->endpoint, ev, sizeof ev) != 0)
                ev[0] = '\0';
            MT_FAIL("no recovery committed %d s after rank %d was killed (job at generation "
                    "%llu); tided's events: %s",
                    DETECT_S, g.victim, (unsigned long long)gen, ev);
        }
        break;
    }
    if (s != NULL)
        zmq_close(s);
    zmq_ctx_term(ctx);
    return NULL;
}

/* ---- what each rank records ---------------------------------------------------------------- */

typedef struct record {
    tide_collection_t *coll;
    size_t n_tensors;
    double loss[MAX_STEPS];  /* of each step's last run on this rank */
    int ran[MAX_STEPS];      /* runs of each step on this rank */
    double loss1[MAX_STEPS]; /* of each step's run in the victim's generation */
    int ran1[MAX_STEPS];     /* runs of each step in the victim's generation */
    int64_t switch_at;       /* the recovery's switch step on this rank; -1 none */
    /* the generations before the recovery (1 .. g.kill_gen): their switch steps on this
       rank (-1 none), their layouts, and the whole state right before and after each
       resize (hashes, on the new layout's first member) */
    int64_t gen_at[MAX_GEN + 1];
    tide_layout_t *layouts[MAX_GEN + 1];
    uint64_t before[MAX_GEN + 1][MAX_T], after[MAX_GEN + 1][MAX_T];
    int switches;           /* switches seen */
    int spare;              /* pool rank idle in the first layout (spare mode), else -1 */
    uint64_t pre[MAX_T];    /* state hashes before the kill (old layout's first member; ckpt
                               modes: after g.ckpt_at steps, the checkpoint's state) */
    uint64_t post[MAX_T];   /* right after the recovery (new layout's first member) */
    tide_layout_t *recover; /* the recovery's layout */
    watch *wd;
    int refused_checked; /* layout mode: the dp 3 resize was refused (rank 0) */
    int befores;         /* switches begun (the before_switch hook) */
    uint64_t before_gen; /* the generation of the last one begun */
    /* ckpt-request */
    int64_t req_step; /* rank 0: the step tided chose for the requested checkpoint; 0 none */
    void **at_req;    /* rank 0: the full state after req_step completed steps */
} record;

/* Frees the layouts the record copied. */
static void record_free_layouts(record *r)
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

/* ckpt modes, the victim before it dies: its own shard of the checkpoint of step is on
   disk, and tided has heard that the checkpoint is complete (its checkpoint_saved event),
   so that the job rolls back to that checkpoint however the ranks are scheduled. */
static void wait_checkpoint_known(tide_t *t, int step)
{
    static char buf[1 << 18];
    char want[32];
    MT_OK(tide_checkpoint_wait(t));
    snprintf(want, sizeof want, "step %d", step);
    uint64_t deadline = tide_now_ns() + CKPT_WAIT_S * 1000000000ull;
    for (;;) {
        int rc = tidectl_events(g_tidectl, g_endpoint, buf, sizeof buf);
        if (rc == 0 && events_with(buf, "checkpoint_saved", want) > 0)
            break;
        MT_ASSERT(tide_now_ns() < deadline,
                  "no checkpoint_saved event with \"%s\" within %d s (tidectl exit %d): %s", want,
                  CKPT_WAIT_S, rc, buf);
        tide_sleep_ms(50);
    }
    fprintf(stderr, "[rank %d] the checkpoint of step %d is complete and known to tided\n", g_rank,
            step);
    fflush(stderr);
}

/* ckpt-corrupt, the victim before it dies: flips one byte in the middle of a shard file of
   the checkpoint of step (the first shard-*.bin by name), so that the rollback to it fails
   its chunk check on whichever member reads that chunk. */
static void damage_checkpoint(int step)
{
    char dir[512], path[1024], best[256] = "";
    tide_ckpt_step_dir(g_ckpt_root, step, dir, sizeof dir);
    DIR *d = opendir(dir);
    MT_ASSERT(d != NULL, "cannot open %s: %s", dir, strerror(errno));
    for (struct dirent *e = readdir(d); e != NULL; e = readdir(d)) {
        size_t n = strlen(e->d_name);
        if (strncmp(e->d_name, "shard-", 6) == 0 && n > 4 &&
            strcmp(e->d_name + n - 4, ".bin") == 0 &&
            (best[0] == '\0' || strcmp(e->d_name, best) < 0))
            snprintf(best, sizeof best, "%s", e->d_name);
    }
    closedir(d);
    MT_ASSERT(best[0] != '\0', "no shard-*.bin in %s", dir);
    snprintf(path, sizeof path, "%s/%s", dir, best);
    int fd = open(path, O_RDWR);
    MT_ASSERT(fd >= 0, "cannot open %s: %s", path, strerror(errno));
    struct stat st;
    MT_ASSERT(fstat(fd, &st) == 0 && st.st_size > 0, "%s is empty", path);
    off_t at = st.st_size / 2;
    unsigned char b = 0;
    MT_ASSERT(pread(fd, &b, 1, at) == 1, "cannot read %s: %s", path, strerror(errno));
    b ^= 0x5a;
    MT_ASSERT(pwrite(fd, &b, 1, at) == 1 && fsync(fd) == 0, "cannot damage %s: %s", path,
              strerror(errno));
    close(fd);
    fprintf(stderr, "[rank %d] flipped byte %lld of %lld of %s\n", g_rank, (long long)at,
            (long long)st.st_size, path);
    fflush(stderr);
}

/* ckpt-request, rank 0 in generation 1 after `completed` steps: `tidectl checkpoint` without
   a root (the job saved none yet) and for an unknown job is refused with what to do; with
   --dir it is granted for a step no rank has reached yet, which goes into r->req_step. */
static void request_checkpoint(record *r, int completed)
{
    static char out[8192];
    const char *nodir[] = {"checkpoint", JOB, NULL};
    int code = coord_tidectl_io(g_tidectl, g_endpoint, nodir, out, sizeof out, 1);
    MT_ASSERT(code != 0 && strstr(out, "pass --dir ROOT") != NULL,
              "tidectl checkpoint %s without --dir, before any checkpoint: want a non-zero exit "
              "and \"pass --dir ROOT\"; exit %d: %s",
              JOB, code, out);
    const char *nojob[] = {"checkpoint", "nosuchjob", "--dir", "/tmp/x", NULL};
    code = coord_tidectl_io(g_tidectl, g_endpoint, nojob, out, sizeof out, 1);
    MT_ASSERT(code != 0 && strstr(out, "no online job named nosuchjob") != NULL,
              "tidectl checkpoint nosuchjob: want a non-zero exit and \"no online job named "
              "nosuchjob\"; exit %d: %s",
              code, out);
    const char *ask[] = {"--json", "checkpoint", JOB, "--dir", g_ckpt_root, NULL};
    code = coord_tidectl_io(g_tidectl, g_endpoint, ask, out, sizeof out, 1);
    const char *at = strstr(out, "\"message\":\"job " JOB " saves the checkpoint of step ");
    MT_ASSERT(code == 0 && strstr(out, "{\"job\":\"" JOB "\",") == out && at != NULL,
              "tidectl --json checkpoint %s --dir %s: want exit 0 and {\"job\":\"%s\", "
              "\"message\":\"job %s saves the checkpoint of step S ...\"}; exit %d: %s",
              JOB, g_ckpt_root, JOB, JOB, code, out);
    char *end = NULL;
    long long s =
        strtoll(at + strlen("\"message\":\"job " JOB " saves the checkpoint of step "), &end, 10);
    char under[320];
    snprintf(under, sizeof under, " under %s (about ", g_ckpt_root);
    MT_ASSERT(end != NULL && strncmp(end, under, strlen(under)) == 0 &&
                  strstr(end, "`tidectl events` says checkpoint_saved when it is complete") != NULL,
              "tidectl checkpoint's message must name the root and say how to follow the save: "
              "%s",
              out);
    MT_ASSERT(s > completed && s < g.steps,
              "tided chose step %lld for the checkpoint; rank 0 has completed %d steps and the job "
              "ends after %d: the step must lie between (if it does not, the test's steps are too "
              "fast for the request to land before the job ends)",
              s, completed, g.steps);
    r->req_step = s;
    printf("recover-ckpt-request: after %d steps, %s", completed, out);
    fflush(stdout);
}

/* ckpt-request, every member after each step from 2 on: the full state gathered; rank 0
   keeps the one after r->req_step completed steps. */
static void keep_requested_state(tide_t *t, const tide_mlp_t *m, record *r, int64_t step)
{
    void **full = NULL;
    MT_OK(tide_mlp_tide_gather(t, m, tide_view_get(t), &full));
    if (full != NULL && r->req_step > 0 && step == r->req_step - 1) {
        r->at_req = full;
        return;
    }
    tide_mlp_full_free(r->coll, &full);
}

static tide_status h_on_step(void *ctx, tide_t *t, const tide_mlp_t *m, int64_t step, double loss,
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
static tide_status h_at(void *ctx, tide_t *t, const tide_mlp_t *m, int64_t step,
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

static int layout_has(const tide_layout_t *l, int rank)
{
    for (size_t i = 0; i < tide_layout_size(l); i++)
        if (l->worker[i] == rank)
            return 1;
    return 0;
}

static tide_status h_before(void *ctx, tide_t *t, const tide_mlp_t *m)
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

static tide_status h_after(void *ctx, tide_t *t, const tide_mlp_t *m,
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

static int h_done(void *ctx, const tide_view *v)
{
    const record *r = ctx;
    if (g.sc.n_resizes == 0)
        return v->step >= g.steps;
    /* the resizes and the kill come when they come: the job ends once the recovery ran a
       few steps, and no sooner than the row's step count */
    int64_t end = r->switch_at + 4 > g.steps ? r->switch_at + 4 : g.steps;
    return v->generation == g.final_gen && r->switch_at >= 0 && v->step >= end;
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
static double compare_state(const tide_collection_t *c, void *const *got, void *const *want,
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

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)flag;
    (void)ftw;
    return remove(path) == 0 ? 0 : -1;
}

/* ckpt modes, rank 0 once every survivor left the runtime: every checkpoint is complete
   on disk (keep 0: none pruned; the one the job rolled back to among them), then the whole
   root goes. */
static void remove_checkpoints(const char *root)
{
    char manifest[512];
    struct stat st;
    for (int k = g.every; k <= g.steps && !g.request; k += g.every) {
        snprintf(manifest, sizeof manifest, "%s/step-%012d/MANIFEST", root, k);
        MT_ASSERT(stat(manifest, &st) == 0, "no %s after the run", manifest);
        /* ckpt-corrupt: the damaged one fails its check unless it was saved again */
        tide_ckpt_t *ck = NULL;
        snprintf(manifest, sizeof manifest, "%s/step-%012d", root, k);
        MT_OK(tide_ckpt_open(&ck, manifest));
        tide_status rc = tide_ckpt_verify(ck);
        tide_ckpt_close(&ck);
        if (g.corrupt && k == g.ckpt_at && !g_resaved)
            MT_ASSERT(rc == TIDE_ERR_INVALID && strstr(tide_last_error(), "shard-") != NULL,
                      "the damaged checkpoint %s (not saved again) must fail its check naming "
                      "the shard; got %s: %s",
                      manifest, tide_strerror(rc), tide_last_error());
        else
            MT_ASSERT(rc == TIDE_OK, "checkpoint %s: %s", manifest, tide_last_error());
    }
    MT_ASSERT(nftw(root, remove_entry, 16, FTW_DEPTH | FTW_PHYS) == 0, "cannot remove %s", root);
}

/* The end of a run whose checks all held on every survivor: the pass line (rank 0),
   the survivors' communicator and the collection freed, MPI finalized, tided stopped by
   the rank that started it. Returns the exit status. */
static int pass(MPI_Comm *surv, tide_collection_t **coll, int is_root)
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

/* ckpt-request, rank 0 after the job ended: the checkpoint tided was asked for (step
   rec->req_step under g_ckpt_root) is complete, reported, and holds exactly the state
   gathered after that many steps. */
static void check_requested(record *rec)
{
    static char buf[1 << 18];
    char want[64], dir[512], manifest[600];
    const int64_t s = rec->req_step;
    MT_ASSERT(s > 0 && rec->at_req != NULL, "rank 0 kept no state for the requested step %lld",
              (long long)s);
    /* the publisher waited until the checkpoint was published, not until tided heard */
    snprintf(want, sizeof want, "step %lld", (long long)s);
    tide_ckpt_step_dir(g_ckpt_root, s, dir, sizeof dir);
    uint64_t deadline = tide_now_ns() + 10 * 1000000000ull;
    for (;;) {
        MT_ASSERT(tidectl_events(g_tidectl, g_endpoint, buf, sizeof buf) == 0,
                  "tidectl events failed: %s", buf);
        if (events_with(buf, "checkpoint_saved", want) > 0 || tide_now_ns() >= deadline)
            break;
        tide_sleep_ms(50);
    }
    MT_ASSERT(count_of(buf, "\"kind\":\"checkpoint_requested\"") == 1 &&
                  events_with(buf, "checkpoint_requested", want) == 1,
              "want one checkpoint_requested event, \"%s\": %s", want, buf);
    char obj[2048];
    MT_ASSERT(count_of(buf, "\"kind\":\"checkpoint_saved\"") == 1 &&
                  object_with(buf, "\"kind\":\"checkpoint_saved\"", obj, sizeof obj) &&
                  has_text(obj, want) && strstr(obj, dir) != NULL,
              "want one checkpoint_saved event, \"%s saved in %s\", within 10 s of the end of the "
              "save: %s",
              want, dir, buf);
    MT_ASSERT(count_of(buf, "\"kind\":\"checkpoint_failed\"") == 0, "a checkpoint failed: %s", buf);
    snprintf(manifest, sizeof manifest, "%s/MANIFEST", dir);
    struct stat st;
    MT_ASSERT(stat(manifest, &st) == 0, "no %s after the run", manifest);

    /* its content, read whole into one process's layout, is the state after s steps */
    const tide_collection_t *c = rec->coll;
    tide_ckpt_t *ck = NULL;
    MT_OK(tide_ckpt_open(&ck, dir));
    MT_ASSERT(tide_ckpt_step(ck) == s, "%s holds step %lld, want %lld", dir,
              (long long)tide_ckpt_step(ck), (long long)s);
    MT_OK(tide_ckpt_verify(ck));
    MT_OK(tide_ckpt_check_collection(ck, c));
    tide_layout_t *l = NULL;
    MT_OK(tide_layout_new(&l, 1, 1, 1, tide_collection_num_layers(c), g.micro));
    size_t n = tide_collection_size(c);
    void **bufs = tide_calloc(n, sizeof *bufs);
    MT_ASSERT(bufs != NULL, "out of memory");
    for (size_t i = 0; i < n; i++) {
        uint64_t b = tide_shard_bytes(l, c, i, 0, 0, 0);
        MT_ASSERT(b == tide_tensor_bytes(tide_collection_tensor(c, i)),
                  "tensor %zu: %llu bytes on (1, 1, 1)", i, (unsigned long long)b);
        bufs[i] = tide_malloc(b ? (size_t)b : 1);
        MT_ASSERT(bufs[i] != NULL, "out of memory");
    }
    tide_ckpt_load_stats ls;
    MT_OK(tide_ckpt_load(ck, l, 0, 0, 0, bufs, &ls));
    for (size_t i = 0; i < n; i++) {
        const tide_tensor_desc *d = tide_collection_tensor(c, i);
        MT_ASSERT(memcmp(bufs[i], rec->at_req[i], tide_tensor_bytes(d)) == 0,
                  "tensor %s of the checkpoint of step %lld differs from the state gathered "
                  "after %lld steps",
                  d->name, (long long)s, (long long)s);
        tide_free(bufs[i]);
    }
    tide_free(bufs);
    tide_layout_destroy(&l);
    printf("recover-ckpt-request: %s (%zu shard files, %llu bytes read; checkpoint_requested "
           "and checkpoint_saved reported) holds the state after %lld steps bit for bit\n",
           dir, tide_ckpt_num_shards(ck), (unsigned long long)ls.bytes_read, (long long)s);
    fflush(stdout);
    tide_ckpt_close(&ck);
}

/* ckpt-request, every rank after training: each step ran once, losses as the never-failed
   runs', final state as the same-layout run's, the requested checkpoint checked (rank 0),
   and the end of the run. Returns the exit status. */
static int finish_request(tide_t *t, tide_mlp_t *m, record *rec, const double *ref,
                          const double *ref_layouts, void ***want, int is_root)
{
    MT_OK(tide_checkpoint_wait(t)); /* this rank's shard written (and published, rank 0) */
    MPI_Comm all = MPI_COMM_NULL;
    MPI_Comm_dup(MPI_COMM_WORLD, &all);
    const tide_view *v = tide_view_get(t);
    MT_ASSERT(v->generation == 1 && rec->switches == 0 && rec->befores == 0,
              "no switch expected (generation %llu, %d switches)",
              (unsigned long long)v->generation, rec->switches);
    static double lo[MAX_STEPS], hi[MAX_STEPS];
    for (int k = 0; k < g.steps; k++) {
        MT_ASSERT(rec->ran[k] == 1, "step %d ran %d times on rank %d", k, rec->ran[k], g_rank);
        lo[k] = hi[k] = rec->loss[k];
    }
    MPI_Allreduce(MPI_IN_PLACE, lo, g.steps, MPI_DOUBLE, MPI_MIN, all);
    MPI_Allreduce(MPI_IN_PLACE, hi, g.steps, MPI_DOUBLE, MPI_MAX, all);
    void **full = NULL;
    MT_OK(tide_mlp_tide_gather(t, m, v, &full));
    if (g_rank == 0) {
        double worst = 0.0;
        for (int k = 0; k < g.steps; k++) {
            MT_ASSERT(lo[k] == hi[k] && lo[k] == ref_layouts[k],
                      "step %d: loss %.17g..%.17g on the ranks vs %.17g of the same layout over "
                      "plain MPI",
                      k, lo[k], hi[k], ref_layouts[k]);
            double rel = fabs(lo[k] - ref[k]) / fabs(ref[k]);
            worst = fmax(worst, rel);
            MT_ASSERT(rel <= REL_TOL, "step %d: loss %.9g vs %.9g in one process (rel %.2e)", k,
                      lo[k], ref[k], rel);
        }
        MT_ASSERT(full != NULL, "rank 0 gathered nothing");
        compare_state(rec->coll, full, *want, 0.0);
        check_requested(rec);
        printf("recover-ckpt-request: %d steps on (dp %d, tp %d, pp %d); max loss rel diff %.2e "
               "to one process; losses and final state bit-identical to plain MPI\n",
               g.steps, g.first.dp, g.first.tp, g.first.pp, worst);
        fflush(stdout);
    }
    tide_mlp_full_free(rec->coll, &full);
    tide_mlp_full_free(rec->coll, &rec->at_req);
    tide_mlp_full_free(rec->coll, want);
    MPI_Barrier(all);
    tide_destroy(&t);
    tide_mlp_destroy(&m);
    MPI_Barrier(all);
    if (g_rank == 0)
        remove_checkpoints(g_ckpt_root);
    record_free_layouts(rec);
    return pass(&all, &rec->coll, is_root);
}

/* ---- resizes before the kill ------------------------------------------------------------------
 */

/* Rank 0's thread in scenarios with resizes: resize k goes out through the tidectl binary
   once the job has run GAP steps of generation k. */
typedef struct resizer {
    const char *tidectl;
    char endpoint[256];
    volatile int sent;
    char why[512]; /* what went wrong, "" when nothing */
} resizer;

static void *resize_thread(void *arg)
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
static int agreed_end(const record *rec, MPI_Comm surv)
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
static void check_resizes(const record *rec, MPI_Comm surv, int64_t *gen_at)
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
static void share_recovery_layout(record *rec, MPI_Comm surv)
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
static int switches_of(const record *rec, int r)
{
    int n = 0;
    for (int gen = 2; gen <= g.kill_gen; gen++)
        n += layout_has(rec->layouts[gen - 1], r) || layout_has(rec->layouts[gen], r);
    return n + (layout_has(rec->layouts[g.kill_gen], r) || layout_has(rec->recover, r));
}

/* How often step k must have run on the survivors: once on every live member of each
   generation that ran it (the victim's generation up to g.done1: with a rollback, the
   steps after the checkpoint's run there and again after the recovery). */
static int runs_of(const record *rec, const int64_t *gen_at, int k)
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
