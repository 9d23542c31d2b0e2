/*
 * MPI integration test of train_mlp on libtide with the real tided and tidectl (8 ranks,
 * host memory, MPI_THREAD_MULTIPLE as train_mlp): usage test_examples_tide TIDED TIDECTL
 * SCENARIO [TIDE_CKPT] (TIDE_CKPT: the tide-ckpt tool, needed by the rows that convert),
 * SCENARIO a row of tests/scenarios/test_examples_tide.h (--list prints them), one of
 *   dp      (dp 2) -> (dp 4) -> (dp 1)
 *   tp      (tp 1) -> (tp 2) -> (tp 4) -> (tp 2)
 *   pp      (pp 1) -> (pp 2; stages 0-3,4-5) -> (pp 4; stages 0-0,1-2,3-4,5-5), 6 layers
 *   mixed   (2,2,2) -> (1,4,2) -> (4,1,1) -> (1,2,2; stages 0-2,3-3)   [(dp, tp, pp)]
 *   mixed-zero1   the same with the Adam moments DP-sharded (ZeRO-1)
 *   micro   (2,2,2) with 4 micro-batches per dp rank -> 2 micro-batches -> (1,2,2) with 8 ->
 *           (2,2,2) with 4 (tidectl resize --micro-batches)
 *   grow2   (1,4,2) -> (1,2,2) -> (1,1,2): the ranks that stay grow twice in a row, by more
 *           than the staging cap (16 KiB here), under TIDE_MEM_STRICT: the preparation of
 *           each grow reserves its pool blocks (a limit a switch left on the pool refused
 *           the second's: the log must never say that a preparation could not)
 *   hosts   (2,4,1) -> (1,4,2) -> (2,4,1) on 2 hosts x 4 ranks (tests/test_multihost_resize.sh
 *           runs it across the hosts of scripts/cluster.sh, tided outside the job)
 * Rank 0 starts tided on a free loopback port with a temporary state file (or, with
 * TIDE_TEST_TIDED_ENDPOINT set, uses that tided, with CURVE keys: TIDE_KEY for the ranks,
 * TIDE_TEST_ADMIN_KEY for the resizes, TIDE_SERVER_KEY); every rank
 * runs the elastic loop of train_mlp --tide (tide_mlp_tide_train) on the model; a
 * controller thread on rank 0 resizes the job with the tidectl binary while steps run,
 * a few steps after each generation started.
 * Checked: the full state gathered over the old layout's members right before each
 * reshard is bit-identical to the one gathered over the new layout right after it
 * (every tensor, moments, step counter and data cursor included; replicas agree); every
 * switch took the communicators and plan built during its preparation (stats.prepared,
 * next to no time on groups at the switch step); every participant switched at the same
 * step; in the rows that convert (mixed*: switches that change several degrees at once), at every
 * switch: the old layout's members save a checkpoint of the switch step S with
 * tide_checkpoint inside the RECONFIGURE (before the reshard: the view, buffers and step
 * are still the old layout's, at the boundary after step S), the layout's first member
 * (the publisher, whose tide_checkpoint_wait returns once the manifest is written)
 * converts it to the new layout with the real `tide-ckpt convert` (exit 0) while the
 * others wait for its status, and right after the reshard every member of the new layout
 * loads its coordinate of the converted checkpoint (step S, the new degrees and stages)
 * into fresh host buffers that must equal its live buffers byte for byte (rank 0 removes
 * both checkpoints at the end); every step ran exactly once on every member of
 * the layout active then (none lost or repeated); each generation has the requested
 * layout; the loss of every step equals on all members and matches the never-resized
 * run (the first layout over plain MPI, same steps) within relative 1e-5; the whole final
 * state (parameters, moments, step, data cursor) is the never-resized run's, integers
 * equal and floats within relative L2 1e-4 (reduction order differs between layouts).
 * Across hosts (hostnames differ between ranks) also: no tensor-parallel group of any
 * generation spans two hosts; the bytes each switch moved in all (every rank's reshard
 * counters) and across hosts (its plan over the ranks' real hostnames) are what
 * `tidectl resize --dry-run` said before the resize.
 */
#include <errno.h>
#include <ftw.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ckpt/ckpt.h"
#include "coord_harness.h"
#include "core/alloc.h"
#include "core/keyfile.h"
#include "core/log.h"
#include "examples/mlp_mpi.h"
#include "examples/mlp_statefile.h"
#include "examples/mlp_tide.h"
#include "mlp_state.h"
#include "mpi_test.h"
#include "tests/support/scenario.h"

#define JOB        "mlp-test"
#define MAX_STEPS  1000
#define MAX_GEN    6
#define MAX_T      256 /* collection tensors */
#define REL_TOL    1e-5
#define STATE_RTOL 1e-4 /* relative L2 of a float tensor of the final state */
#define GAP        3    /* steps each generation runs before the next resize is sent */
#define TAIL       4    /* steps run after the last switch */

/* A scenario: the generic columns, then this driver's (tests/scenarios/test_examples_tide.h). */
typedef struct tide_row {
    mt_row r;
    int layers, zero1;
    uint64_t cap; /* staging cap, bytes; 0: 64 KiB */
    int convert;  /* tide-ckpt convert at every switch equals the live state */
    int refuse;   /* a micro-batch count the fit rules forbid is refused first */
    int reshape;  /* shards shrink in place and grows spill to host somewhere */
} tide_row;

static const tide_row scenarios[] = {
#define ROW(name, ranks, timeout, labels, mpi, first, resizes, kill, ckpt, gen, status, ...)       \
    {{name, ranks, timeout, labels, mpi, first, resizes, kill, ckpt, gen, status}, __VA_ARGS__},
#include "scenarios/test_examples_tide.h"
#undef ROW
};

static const tide_row *g_row;
static mt_layout g_gen[MAX_GEN]; /* generation g + 1's layout: the first, then the resizes */
static int g_n_gens;
static int g_micro0 = 4; /* micro-batches per dp rank at the join (the first layout's /MICRO) */

static int g_rank;
static int g_reserve_refused;  /* preparations whose pool reservation failed (libtide's log) */
static int g_spill_unprepared; /* switches that spilled into host memory not prepared ahead */
static int g_spill_prepared;   /* preparations that prepared host spill memory */
/* rows that convert: the tide-ckpt tool, and rank 0's temporary directory (every rank knows it):
   live/ holds the checkpoints saved at the switches, out-g<G>/ the one converted for
   generation G */
static const char *g_ckpt_tool;
static char g_ckpt_dir[64];

/* libtide's log at level info, read for what the API does not say: a preparation whose
   pool reservation failed (the switch then takes fresh memory at its step), host spill
   memory prepared, and a switch that spilled into host memory allocated there (pinned on a
   GPU: cudaMallocHost on the critical path). Warnings and errors still go to stderr. */
static void log_sink(void *ctx, tide_log_level level, const char *line)
{
    (void)ctx;
    if (strstr(line, "could not prepare pool memory") != NULL)
        __atomic_add_fetch(&g_reserve_refused, 1, __ATOMIC_RELAXED);
    if (strstr(line, "host spill memory prepared") != NULL)
        __atomic_add_fetch(&g_spill_prepared, 1, __ATOMIC_RELAXED);
    if (strstr(line, "allocated at the switch step") != NULL)
        __atomic_add_fetch(&g_spill_unprepared, 1, __ATOMIC_RELAXED);
    if (level <= TIDE_LOG_WARN)
        fprintf(stderr, "%s\n", line);
}
#define HOST_LEN 64
static char (*g_hosts)[HOST_LEN]; /* by MPI rank (= worker id): the host each rank runs on */
static int g_multihost;           /* the ranks run on more than one host */

/* ---- tided (rank 0, before MPI_Init) ---------------------------------------------------- */

static coord_proc g_coord;

static void start_tided(const char *exe)
{
    const char *flags[] = {"--heartbeat-ms", "100", "--miss-limit", "100", "--resize-timeout-ms",
                           "60000",          NULL};
    if (coord_tmpdir(&g_coord) != 0 || coord_start(&g_coord, exe, flags, NULL) != 0)
        g_coord.endpoint[0] = '\0'; /* every rank sees no endpoint and fails */
}

static void stop_tided(void)
{
    coord_stop(&g_coord, SIGTERM);
    coord_cleanup(&g_coord);
}

/* ---- the controller (rank 0 thread): resizes through the tidectl binary ------------------- */

typedef struct ctl_state {
    const char *tidectl;
    char endpoint[256];
    const char *admin_key, *server_key; /* external tided: key pair file and server.pub */
    volatile int error, sent;
    char why[1024];
    uint64_t dry_sent[MAX_GEN + 1], dry_cross[MAX_GEN + 1]; /* --dry-run's figures by generation */
} ctl_state;

/* The number after "key": in a JSON text, or -1. */
static long long json_u64(const char *text, const char *key)
{
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\":", key);
    const char *p = strstr(text, pat);
    return p ? strtoll(p + strlen(pat), NULL, 10) : -1;
}

/* Runs `tidectl --endpoint E resize JOB --dp .. --tp .. --pp .. [--stages ..]`; 0 on exit 0. */
static int tidectl_resize(const ctl_state *cs, const mt_layout *g)
{
    char dp[16], tp[16], pp[16];
    snprintf(dp, sizeof dp, "%d", g->dp);
    snprintf(tp, sizeof tp, "%d", g->tp);
    snprintf(pp, sizeof pp, "%d", g->pp);
    const char *args[20] = {"resize", JOB, "--dp", dp, "--tp", tp, "--pp", pp};
    int n = 8;
    if (g->stages[0] != '\0') {
        args[n++] = "--stages";
        args[n++] = g->stages;
    }
    char micro[16];
    if (g->micro > 0) {
        snprintf(micro, sizeof micro, "%d", g->micro);
        args[n++] = "--micro-batches";
        args[n++] = micro;
    }
    if (cs->admin_key != NULL) {
        args[n++] = "--key";
        args[n++] = cs->admin_key;
        args[n++] = "--server-key";
        args[n++] = cs->server_key;
    }
    return coord_tidectl(cs->tidectl, cs->endpoint, args, NULL, 0) == 0 ? 0 : -1;
}

/* The same resize with --dry-run --json: records what it says generation gen will move. */
static int tidectl_dry_run(ctl_state *cs, const mt_layout *g, int gen)
{
    char dp[16], tp[16], pp[16], out[8192];
    snprintf(dp, sizeof dp, "%d", g->dp);
    snprintf(tp, sizeof tp, "%d", g->tp);
    snprintf(pp, sizeof pp, "%d", g->pp);
    const char *args[20] = {"resize", JOB,    "--dp", dp,          "--tp",
                            tp,       "--pp", pp,     "--dry-run", "--json"};
    int n = 10;
    if (g->stages[0] != '\0') {
        args[n++] = "--stages";
        args[n++] = g->stages;
    }
    char micro[16];
    if (g->micro > 0) {
        snprintf(micro, sizeof micro, "%d", g->micro);
        args[n++] = "--micro-batches";
        args[n++] = micro;
    }
    if (cs->admin_key != NULL) {
        args[n++] = "--key";
        args[n++] = cs->admin_key;
        args[n++] = "--server-key";
        args[n++] = cs->server_key;
    }
    if (coord_tidectl(cs->tidectl, cs->endpoint, args, out, sizeof out) != 0)
        return -1;
    long long sent = json_u64(out, "bytes_sent"), cross = json_u64(out, "cross_host");
    if (sent < 0 || cross < 0)
        return -1;
    cs->dry_sent[gen] = (uint64_t)sent;
    cs->dry_cross[gen] = (uint64_t)cross;
    printf("dry run for generation %d: %lld bytes to send, %lld of them across hosts\n", gen, sent,
           cross);
    fflush(stdout);
    return 0;
}

/* Sends resize k once the job runs generation k at least GAP steps past its switch. */
/* micro mode: a micro-batch count the model's fit rules forbid (dp 2 x 32 does not
   divide the global batch 32) is refused with the rule, exit code 1, nothing changed. */
static int refuse_micro(ctl_state *cs)
{
    static char out[4096];
    const char *args[12] = {"resize", JOB, "--micro-batches", "32"};
    int n = 4;
    if (cs->admin_key != NULL) {
        args[n++] = "--key";
        args[n++] = cs->admin_key;
        args[n++] = "--server-key";
        args[n++] = cs->server_key;
    }
    int code = coord_tidectl_io(cs->tidectl, cs->endpoint, args, out, sizeof out, 1);
    if (code == 1 &&
        strstr(out, "dp 2 x 32 micro-batches = 64 does not divide 32 (the global batch)") != NULL)
        return 0;
    snprintf(cs->why, sizeof cs->why, "resize --micro-batches 32: exit %d, not the refusal: %.800s",
             code, out);
    cs->error = 1;
    return -1;
}

static void *controller(void *arg)
{
    ctl_state *cs = arg;
    void *ctx = zmq_ctx_new();
    void *s = NULL;
    if (cs->admin_key != NULL) {
        tide_keyfile k;
        char srv[TIDE_KEY_Z85_LEN + 1];
        if (tide_keyfile_read_pair(cs->admin_key, &k) == TIDE_OK &&
            tide_keyfile_server_key(cs->server_key, srv) == TIDE_OK)
            s = coord_connect(ctx, cs->endpoint, k.public_key, k.secret_key, srv, 10000);
    } else {
        s = coord_connect(ctx, cs->endpoint, NULL, NULL, NULL, 10000);
    }
    int next = 1;
    int64_t since = -1;
    uint64_t deadline = tide_now_ns() + 80ull * 1000000000ull;
    while (s != NULL && next < g_n_gens && tide_now_ns() < deadline && !cs->error) {
        tide_msg_t q, r;
        tide_msg_init(&q, TIDE_MSG_JOBS);
        if (coord_call(s, &q, &r) != 0 || r.type != TIDE_MSG_JOBS_REPLY) {
            snprintf(cs->why, sizeof cs->why, "no jobs reply from tided");
            cs->error = 1;
            tide_msg_clear(&r);
            break;
        }
        int go = 0;
        for (uint32_t i = 0; i < r.u.jobs_reply.n_rows; i++) {
            const tide_proto_job_row_t *row = &r.u.jobs_reply.rows[i];
            if (strcmp(row->name, JOB) != 0 || row->gen != (uint64_t)next ||
                row->state != TIDE_JOB_RUNNING)
                continue;
            if (since < 0)
                since = (int64_t)row->step;
            go = (int64_t)row->step >= since + GAP;
        }
        tide_msg_clear(&r);
        if (!go) {
            tide_sleep_ms(20);
            continue;
        }
        if (next == 1 && g_row->refuse && refuse_micro(cs) != 0)
            break;
        if (tidectl_dry_run(cs, &g_gen[next], next + 1) != 0 ||
            tidectl_resize(cs, &g_gen[next]) != 0) {
            snprintf(cs->why, sizeof cs->why, "tidectl resize to generation %d failed", next + 1);
            cs->error = 1;
            break;
        }
        cs->sent = next++;
        since = -1;
    }
    if (s == NULL) {
        snprintf(cs->why, sizeof cs->why, "cannot connect to %s", cs->endpoint);
        cs->error = 1;
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
    double loss[MAX_STEPS];
    int ran[MAX_STEPS];
    int64_t switch_at[MAX_GEN + 1]; /* by generation; -1 unknown */
    int64_t gen_size[MAX_GEN + 1];
    uint64_t before[MAX_GEN + 1][MAX_T], after[MAX_GEN + 1][MAX_T]; /* state hashes */
    int64_t last_switch;                                            /* current generation's */
    uint64_t sent[MAX_GEN + 1];  /* bytes this rank's reshard sent, by generation */
    uint64_t cross[MAX_GEN + 1]; /* bytes the switch's plan moves across hosts (first rank) */
    /* bytes over every switch of this rank: new shards kept, shrunk in place, rebuilt
       in pool blocks; old shards spilled to host memory */
    uint64_t kept, shrunk, rebuilt, spilled;
    double groups_ms; /* the switch steps' time on the new layout's communicators, ms */
    /* the switch running now: this rank's buffers before it, and per tensor whether its
       new shard is exactly its old one (the same elements) */
    void *old_ptr[MAX_T];
    uint8_t same[MAX_T];
    uint64_t n_same; /* over every switch: shards that did not change (each kept its buffer) */
    /* the convert check (rows that convert), by generation: the step this rank (an old member)
       checkpointed before switching to it (-1 none), and 1 when, as a member of it, its
       live shards equalled the converted checkpoint's */
    int64_t ck_saved[MAX_GEN + 1];
    int ck_checked[MAX_GEN + 1];
    uint64_t ck_bytes; /* bytes this rank compared over every switch */
} record;

/* Every tensor-parallel group of l on one host. */
static void check_tp_in_host(const tide_layout_t *l, uint64_t gen)
{
    for (int p = 0; p < l->pp; p++)
        for (int d = 0; d < l->dp; d++) {
            const int32_t *g = &l->worker[((size_t)p * (size_t)l->dp + (size_t)d) * (size_t)l->tp];
            for (int t = 1; t < l->tp; t++)
                MT_ASSERT(strcmp(g_hosts[g[t]], g_hosts[g[0]]) == 0,
                          "generation %llu: the TP group of stage %d replica %d spans hosts %s "
                          "(worker %d) and %s (worker %d)",
                          (unsigned long long)gen, p, d, g_hosts[g[0]], (int)g[0], g_hosts[g[t]],
                          (int)g[t]);
        }
}

/* Bytes of the plan from old to new that go between workers on different hosts. */
static uint64_t plan_cross_bytes(const tide_layout_t *old_l, const tide_layout_t *new_l,
                                 const tide_collection_t *c)
{
    tide_plan_t *plan = NULL;
    MT_OK(tide_reshard_plan(old_l, new_l, c, NULL, 0, &plan));
    uint64_t bytes = 0;
    for (size_t i = 0; i < plan->n; i++) {
        const tide_xfer *x = &plan->items[i];
        if (x->src != x->dst && strcmp(g_hosts[x->src], g_hosts[x->dst]) != 0)
            bytes += x->run * x->count;
    }
    tide_plan_destroy(&plan);
    return bytes;
}

/* The full state over the members of the current view, hashed on the root. */
static void hash_state(tide_t *t, const tide_mlp_t *m, uint64_t *out)
{
    MT_OK(mlp_state_hashes(t, m, tide_view_get(t), out));
}

static tide_status h_on_step(void *ctx, tide_t *t, const tide_mlp_t *m, int64_t step, double loss,
                             double secs)
{
    record *r = ctx;
    MT_ASSERT(step >= 0 && step < MAX_STEPS, "step %lld out of range", (long long)step);
    r->loss[step] = loss;
    r->ran[step]++;
    tide_sleep_ms(5); /* a few steps per heartbeat however fast the machine */
    return TIDE_OK;
}

/* ---- tide-ckpt convert against the live switch (rows that convert) ------------------------ */

/* Before the switch to tide_view_next(t), on every participant: the old layout's members
   save the state of step S = tide_view_get(t)->step under g_ckpt_dir/live (idle ranks
   return at once). Inside the RECONFIGURE is a step boundary like any other here: step S
   ended, the next has not begun, and tide_reshard has not yet touched the buffers, so this
   is exactly the state the switch moves. Its first member, the publisher (its
   tide_checkpoint_wait returns once the manifest is written; the others' once their own
   shard is), converts it with tide-ckpt into the new layout under g_ckpt_dir/out-g<G>
   and broadcasts the exit status to the other members; the new layout's members that
   were idle join tide_reshard, whose switch communicator every old member must reach
   first, so they too find the conversion complete after it. */
static void ckpt_save_convert(record *r, tide_t *t)
{
    const tide_view *v = tide_view_get(t), *nv = tide_view_next(t);
    char root[128], out[128];
    snprintf(root, sizeof root, "%s/live", g_ckpt_dir);
    snprintf(out, sizeof out, "%s/out-g%llu", g_ckpt_dir, (unsigned long long)nv->generation);
    MT_OK(tide_checkpoint(t, root));
    MT_OK(tide_checkpoint_wait(t));
    if (!v->member)
        return;
    r->ck_saved[nv->generation] = v->step;
    int code = 0;
    if (tide_coll_comm_rank(v->all) == 0) {
        const tide_layout_t *nl = nv->layout;
        char dir[256], dp[16], tp[16], pp[16], micro[16], stages[256] = "";
        tide_ckpt_step_dir(root, v->step, dir, sizeof dir);
        snprintf(dp, sizeof dp, "%d", nl->dp);
        snprintf(tp, sizeof tp, "%d", nl->tp);
        snprintf(pp, sizeof pp, "%d", nl->pp);
        snprintf(micro, sizeof micro, "%d", nl->micro_batches);
        for (int p = 0; p < nl->pp; p++)
            snprintf(stages + strlen(stages), sizeof stages - strlen(stages), "%s%d-%d",
                     p ? "," : "", nl->stage_start[p], nl->stage_start[p + 1] - 1);
        /* the new layout, stages as inclusive layer ranges */
        const char *argv[16] = {g_ckpt_tool, "convert", dir, out, "--dp", dp, "--tp", tp};
        int n = 8;
        argv[n++] = "--pp";
        argv[n++] = pp;
        argv[n++] = "--stages";
        argv[n++] = stages;
        argv[n++] = "--micro-batches";
        argv[n++] = micro;
        static char said[8192];
        code = coord_run_io(argv, said, sizeof said, 1);
        MT_ASSERT(code == 0,
                  "generation %llu: tide-ckpt convert %s %s --dp %s --tp %s --pp %s --stages %s "
                  "exited %d: %s",
                  (unsigned long long)nv->generation, dir, out, dp, tp, pp, stages, code, said);
        printf("generation %llu: rank %d: tide-ckpt convert of step %lld into dp %s tp %s pp %s "
               "stages %s: %s",
               (unsigned long long)nv->generation, tide_pool_rank(t), (long long)v->step, dp, tp,
               pp, stages, said);
        fflush(stdout);
    }
    MT_OK(tide_coll_broadcast(v->all, &code, sizeof code, 0, NULL));
    MT_ASSERT(code == 0, "generation %llu: the convert failed on the layout's first member (%d)",
              (unsigned long long)nv->generation, code);
}

/* After the switch, on a member of the new layout: its coordinate of the converted
   checkpoint, loaded into fresh host buffers, is its live state byte for byte, and the
   checkpoint is of the switch step, with the new layout. */
static void ckpt_compare(record *r, tide_t *t, const tide_mlp_t *m)
{
    const tide_view *v = tide_view_get(t);
    uint64_t g = v->generation;
    int me = tide_pool_rank(t);
    char out[128], dir[256], want_dir[256];
    snprintf(out, sizeof out, "%s/out-g%llu", g_ckpt_dir, (unsigned long long)g);
    int64_t step = -1;
    MT_ASSERT(tide_ckpt_find(out, INT64_MAX, dir, sizeof dir, &step) == TIDE_OK,
              "rank %d: generation %llu: no complete converted checkpoint under %s: %s", me,
              (unsigned long long)g, out, tide_last_error());
    tide_ckpt_step_dir(out, v->step, want_dir, sizeof want_dir);
    MT_ASSERT(step == v->step && strcmp(dir, want_dir) == 0 &&
                  (r->ck_saved[g] < 0 || r->ck_saved[g] == v->step),
              "rank %d: generation %llu: converted checkpoint %s of step %lld; the switch was at "
              "step %lld (this rank saved step %lld)",
              me, (unsigned long long)g, dir, (long long)step, (long long)v->step,
              (long long)r->ck_saved[g]);
    tide_ckpt_t *ck = NULL;
    MT_OK(tide_ckpt_open(&ck, dir));
    MT_ASSERT(tide_ckpt_step(ck) == v->step, "rank %d: %s says step %lld, the switch was at %lld",
              me, dir, (long long)tide_ckpt_step(ck), (long long)v->step);
    const tide_collection_t *c = tide_mlp_collection(m);
    MT_OK(tide_ckpt_check_collection(ck, c));
    const tide_layout_t *cl = tide_ckpt_layout(ck), *l = v->layout;
    MT_ASSERT(cl->dp == l->dp && cl->tp == l->tp && cl->pp == l->pp &&
                  memcmp(cl->stage_start, l->stage_start, (size_t)(l->pp + 1) * sizeof(int)) == 0,
              "rank %d: generation %llu: %s holds (dp %d, tp %d, pp %d), the job (%d, %d, %d) "
              "or other stages",
              me, (unsigned long long)g, dir, cl->dp, cl->tp, cl->pp, l->dp, l->tp, l->pp);
    MT_ASSERT(tide_buffer_kind(t) == TIDE_MEM_HOST, "the state is not in host memory");
    void *const *live = tide_buffers(t);
    MT_ASSERT(live != NULL, "rank %d: a member without buffers", me);
    size_t n = tide_collection_size(c);
    void *bufs[MAX_T] = {NULL};
    uint64_t bytes[MAX_T] = {0};
    for (size_t i = 0; i < n; i++) {
        bytes[i] = tide_shard_bytes(l, c, i, v->pp_rank, v->dp_rank, v->tp_rank);
        if (bytes[i] == 0)
            continue;
        bufs[i] = malloc(bytes[i]);
        MT_ASSERT(bufs[i] != NULL, "out of memory");
        memset(bufs[i], 0x5a, bytes[i]); /* a byte the load left alone shows */
    }
    MT_OK(tide_ckpt_load(ck, l, v->pp_rank, v->dp_rank, v->tp_rank, bufs, NULL));
    for (size_t i = 0; i < n; i++) {
        if (bytes[i] == 0)
            continue;
        const char *name = tide_collection_tensor(c, i)->name;
        MT_ASSERT(live[i] != NULL, "rank %d: generation %llu: no live buffer of tensor %s", me,
                  (unsigned long long)g, name);
        if (memcmp(bufs[i], live[i], bytes[i]) != 0) {
            const unsigned char *a = live[i], *b = bufs[i];
            uint64_t k = 0;
            while (a[k] == b[k])
                k++;
            MT_FAIL("rank %d (p %d, d %d, t %d): generation %llu (switch at step %lld): tensor %s "
                    "differs from tide-ckpt convert's %s at byte %llu of %llu (live %02x, "
                    "converted %02x)",
                    me, v->pp_rank, v->dp_rank, v->tp_rank, (unsigned long long)g,
                    (long long)v->step, name, dir, (unsigned long long)k,
                    (unsigned long long)bytes[i], a[k], b[k]);
        }
        r->ck_bytes += bytes[i];
        free(bufs[i]);
    }
    tide_ckpt_close(&ck);
    r->ck_checked[g] = 1;
}

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)flag;
    (void)ftw;
    return remove(path) == 0 ? 0 : -1;
}

/* 1 when view a's shard of tensor i and view b's are the same elements of it: the full
   tensor numbered word by word (4 bytes) and both shards cut from it compare equal. */
static int same_shard(const tide_collection_t *c, size_t i, const tide_view *a, const tide_view *b)
{
    if (!a->member || !b->member)
        return 0;
    uint64_t na = tide_shard_bytes(a->layout, c, i, a->pp_rank, a->dp_rank, a->tp_rank);
    uint64_t nb = tide_shard_bytes(b->layout, c, i, b->pp_rank, b->dp_rank, b->tp_rank);
    if (na != nb || na == 0)
        return 0;
    uint64_t bytes = tide_tensor_bytes(tide_collection_tensor(c, i));
    uint32_t *full = malloc(bytes + 4);
    unsigned char *sa = malloc(na), *sb = malloc(nb);
    MT_ASSERT(full != NULL && sa != NULL && sb != NULL, "out of memory");
    for (uint64_t k = 0; k < bytes / 4 + 1; k++)
        full[k] = (uint32_t)k;
    tide_shard_extract(a->layout, c, i, a->pp_rank, a->dp_rank, a->tp_rank, full, sa);
    tide_shard_extract(b->layout, c, i, b->pp_rank, b->dp_rank, b->tp_rank, full, sb);
    int same = memcmp(sa, sb, na) == 0;
    free(full);
    free(sa);
    free(sb);
    return same;
}

static tide_status h_before(void *ctx, tide_t *t, const tide_mlp_t *m)
{
    record *r = ctx;
    const tide_view *nv = tide_view_next(t);
    const tide_view *v = tide_view_get(t);
    void *const *b = tide_buffers(t);
    for (size_t i = 0; i < r->n_tensors; i++) {
        r->old_ptr[i] = v->member && b != NULL ? b[i] : NULL;
        r->same[i] = (uint8_t)same_shard(tide_mlp_collection(m), i, v, nv);
    }
    MT_ASSERT(nv->generation <= MAX_GEN, "generation %llu", (unsigned long long)nv->generation);
    if (tide_view_get(t)->member)
        hash_state(t, m, r->before[nv->generation]);
    if (g_rank == 0)
        r->cross[nv->generation] =
            plan_cross_bytes(tide_view_get(t)->layout, nv->layout, tide_mlp_collection(m));
    if (g_ckpt_tool != NULL)
        ckpt_save_convert(r, t);
    return TIDE_OK;
}

static tide_status h_after(void *ctx, tide_t *t, const tide_mlp_t *m,
                           const tide_mlp_switch_stats *st)
{
    record *r = ctx;
    const tide_view *v = tide_view_get(t);
    uint64_t g = v->generation;
    MT_ASSERT(g >= 2 && g <= (uint64_t)g_n_gens, "unexpected generation %llu",
              (unsigned long long)g);
    r->switch_at[g] = v->step;
    r->last_switch = v->step;
    r->gen_size[g] = (int64_t)tide_layout_size(v->layout);
    r->sent[g] = st->rs.bytes_sent;
    check_tp_in_host(v->layout, g);
    const mt_layout *want = &g_gen[g - 1];
    tide_layout_t *l = NULL;
    MT_OK(tide_layout_new(&l, want->dp, want->tp, want->pp, g_row->layers, 1));
    if (want->stages[0] != '\0')
        MT_OK(tide_layout_parse_stages(l, want->stages));
    int micro = g_micro0; /* the join's; each resize that names a count changes it */
    for (uint64_t k = 1; k < g; k++)
        if (g_gen[k].micro > 0)
            micro = g_gen[k].micro;
    MT_ASSERT(
        v->layout->dp == want->dp && v->layout->tp == want->tp && v->layout->pp == want->pp &&
            v->layout->micro_batches == micro &&
            memcmp(v->layout->stage_start, l->stage_start, (size_t)(l->pp + 1) * sizeof(int)) == 0,
        "generation %llu has another layout than requested (micro-batches %d, want %d)",
        (unsigned long long)g, v->layout->micro_batches, micro);
    tide_layout_destroy(&l);
    MT_ASSERT(tide_mlp_active(m) == v->member, "model and view disagree on membership");
    /* in place: at most the staging cap plus what the new shards needed beyond the old
       ones (page rounding of shrunk buffers aside), never past the strict limit */
    uint64_t slack = (uint64_t)r->n_tensors * 4096;
    MT_ASSERT(st->rs.peak_extra <= st->rs.staging_cap + st->rs.no_room + slack,
              "rank %d: generation %llu took %llu bytes more (cap %llu, no room %llu)",
              (int)tide_pool_rank(t), (unsigned long long)g, (unsigned long long)st->rs.peak_extra,
              (unsigned long long)st->rs.staging_cap, (unsigned long long)st->rs.no_room);
    r->kept += st->rs.bytes_kept;
    r->shrunk += st->rs.bytes_shrunk;
    r->rebuilt += st->rs.bytes_rebuilt;
    r->spilled += st->rs.bytes_spilled;
    /* tide_buffer_moved says exactly which buffers changed address, and every shard that
       did not change kept its buffer */
    void *const *b = tide_buffers(t);
    for (size_t i = 0; i < r->n_tensors; i++) {
        void *now = v->member && b != NULL ? b[i] : NULL;
        MT_ASSERT(tide_buffer_moved(t, i) == (now != r->old_ptr[i]),
                  "rank %d: generation %llu: tensor %s %s address (%p -> %p), but "
                  "tide_buffer_moved says %d",
                  (int)tide_pool_rank(t), (unsigned long long)g,
                  tide_collection_tensor(r->coll, i)->name,
                  now != r->old_ptr[i] ? "changed" : "kept its", r->old_ptr[i], now,
                  tide_buffer_moved(t, i));
        MT_ASSERT(!r->same[i] || now == r->old_ptr[i],
                  "rank %d: generation %llu: tensor %s's shard did not change, yet its buffer "
                  "did (%p -> %p)",
                  (int)tide_pool_rank(t), (unsigned long long)g,
                  tide_collection_tensor(r->coll, i)->name, r->old_ptr[i], now);
        r->n_same += r->same[i];
    }
    MT_ASSERT(st->rs.bytes_kept + st->rs.bytes_shrunk + st->rs.bytes_rebuilt == st->rs.state_new,
              "rank %d: new shards kept %llu + shrunk %llu + rebuilt %llu != %llu",
              (int)tide_pool_rank(t), (unsigned long long)st->rs.bytes_kept,
              (unsigned long long)st->rs.bytes_shrunk, (unsigned long long)st->rs.bytes_rebuilt,
              (unsigned long long)st->rs.state_new);
    MT_ASSERT(st->rs.plan_ms >= 0 && st->rs.move_ms >= 0 && st->rs.sync_ms >= 0 &&
                  st->rs.groups_ms >= 0 && st->rs.total_ms >= st->rs.move_ms,
              "inconsistent switch timings");
    /* every resize here is a plain one, every participant alive, on MPI_THREAD_MULTIPLE:
       its communicators and plan were made while the old layout trained, and the switch
       step made none (groups_ms: taking them; making them here costs three splits) */
    MT_ASSERT(st->rs.prepared == 1,
              "rank %d: generation %llu switched without communicators built ahead",
              (int)tide_pool_rank(t), (unsigned long long)g);
    MT_ASSERT(st->rs.groups_ms < 20.0,
              "rank %d: generation %llu spent %.3f ms on the new layout's communicators at the "
              "switch step, though they were built ahead",
              (int)tide_pool_rank(t), (unsigned long long)g, st->rs.groups_ms);
    r->groups_ms += st->rs.groups_ms;
    if (v->member)
        hash_state(t, m, r->after[g]);
    if (g_ckpt_tool != NULL && v->member)
        ckpt_compare(r, t, m);
    return TIDE_OK;
}

static int h_done(void *ctx, const tide_view *v)
{
    const record *r = ctx;
    if (v->step >= MAX_STEPS - 1)
        return 1; /* the resizes did not happen: fails below */
    return v->generation == (uint64_t)g_n_gens && v->step >= r->last_switch + TAIL;
}

/* ---- the never-resized run ---------------------------------------------------------------- */

/* Rank 0: every worker row of `tidectl status --json` reports its share of its host's
   RAM (the host's RAM over the ranks on that host), not the whole RAM once per rank. */
static void check_status_memory(const ctl_state *cs, int size)
{
    static char out[1 << 17];
    const char *args[8] = {"status", "--json"};
    int n = 2;
    if (cs->admin_key != NULL) {
        args[n++] = "--key";
        args[n++] = cs->admin_key;
        args[n++] = "--server-key";
        args[n++] = cs->server_key;
    }
    MT_ASSERT(coord_tidectl(cs->tidectl, cs->endpoint, args, out, sizeof out) == 0,
              "tidectl status --json failed: %s", out);
    long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
    uint64_t ram = (uint64_t)pages * (uint64_t)psz;
    int rows = 0;
    for (const char *p = strstr(out, "{\"worker\":"); p != NULL;
         p = strstr(p + 1, "{\"worker\":")) {
        const char *h = strstr(p, "\"host\":\""), *mb = strstr(p, "\"mem_bytes\":");
        MT_ASSERT(h != NULL && mb != NULL, "a status row without host or memory: %.200s", p);
        char host[HOST_LEN] = "";
        sscanf(h + 8, "%63[^\"]", host);
        int on_host = 0;
        for (int i = 0; i < size; i++)
            on_host += strcmp(g_hosts[i], host) == 0;
        uint64_t got = strtoull(mb + 12, NULL, 10);
        MT_ASSERT(on_host > 0 && got == ram / (uint64_t)on_host,
                  "worker row on %s reports %llu bytes; want the host's %llu over its %d ranks",
                  host, (unsigned long long)got, (unsigned long long)ram, on_host);
        rows++;
    }
    MT_ASSERT(rows == size, "tidectl status shows %d workers, want %d", rows, size);
}

/* Writes the whole state of m (gathered by the caller; NULL off the gathering rank) to
   path; collective only in that the caller gathered. */
static void write_state(const char *path, const tide_collection_t *c, void **full)
{
    if (full == NULL)
        return;
    MT_OK(tide_mlp_state_write(path, c, full));
}

/* The never-resized run: the first layout over plain MPI for the same steps; its losses
   into loss (every rank) and its final state into the file state_path (rank 0). */
static void reference(const tide_mlp_config *cfg, int64_t steps, double *loss,
                      const char *state_path)
{
    const mt_layout *g = &g_gen[0];
    tide_layout_t *l = NULL;
    tide_mlp_t *m = NULL;
    tide_mlp_mpi_t *mpi = NULL;
    MT_OK(tide_layout_new(&l, g->dp, g->tp, g->pp, cfg->layers, g_micro0));
    MT_OK(tide_mlp_new(&m, cfg, l, g_rank, TIDE_MLP_CPU));
    MT_OK(tide_mlp_init(m));
    MT_OK(tide_mlp_mpi_new(&mpi, MPI_COMM_WORLD, l));
    for (int64_t s = 0; s < steps; s++) {
        loss[s] = 0.0;
        if (tide_mlp_active(m))
            MT_OK(tide_mlp_step(m, tide_mlp_mpi_comm(mpi), &loss[s]));
    }
    /* every active rank has the same losses; rank 0 is active in every first layout */
    MPI_Bcast(loss, (int)steps, MPI_DOUBLE, 0, MPI_COMM_WORLD);
    void **full = NULL;
    MT_OK(tide_mlp_gather(m, MPI_COMM_WORLD, 0, &full));
    write_state(state_path, tide_mlp_collection(m), full);
    tide_mlp_full_free(tide_mlp_collection(m), &full);
    tide_mlp_mpi_destroy(&mpi);
    tide_mlp_destroy(&m);
    tide_layout_destroy(&l);
}

/* ---- the test -------------------------------------------------------------------------------- */

int main(int argc, char **argv)
{
    const mt_row *row = NULL;
    if (MT_ROWS_SELECT(argc, argv, 3, scenarios, &row))
        return 0; /* --list */
    if (row == NULL || argc < 4) {
        fprintf(stderr, "usage: test_examples_tide TIDED TIDECTL SCENARIO [TIDE_CKPT]\n");
        return 2;
    }
    g_row = (const tide_row *)(const void *)row;
    mt_scenario sc;
    if (mt_scenario_parse(row, &sc) != TIDE_OK || !sc.has_first || sc.n_resizes + 1 > MAX_GEN ||
        row->gen != sc.n_resizes + 1 || sc.kill.when[0] != '\0') {
        fprintf(stderr,
                "test_examples_tide: scenario %s: %s (want a first layout, up to %d "
                "resizes, generation 1 + resizes, nobody killed)\n",
                row->name, tide_last_error(), MAX_GEN - 1);
        return 2;
    }
    g_n_gens = row->gen;
    g_gen[0] = sc.first;
    if (sc.first.micro > 0)
        g_micro0 = sc.first.micro;
    memcpy(&g_gen[1], sc.resize, (size_t)sc.n_resizes * sizeof sc.resize[0]);
    if (g_row->convert) {
        if (argc < 5) {
            fprintf(stderr,
                    "test_examples_tide: scenario %s needs the tide-ckpt tool (TIDE_CKPT)\n",
                    row->name);
            return 2;
        }
        g_ckpt_tool = argv[4];
    }
    const char *rank_env = getenv("OMPI_COMM_WORLD_RANK");
    const char *external = getenv("TIDE_TEST_TIDED_ENDPOINT");
    int is_root = rank_env != NULL && strcmp(rank_env, "0") == 0 && external == NULL;
    if (is_root)
        start_tided(argv[1]); /* before MPI_Init: fork is safe here */
    int prov = 0, size = 0;
    /* as train_mlp: libtide builds the communicators of an announced layout on its
       preparation thread while the steps run, which needs MPI_THREAD_MULTIPLE */
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &prov);
    MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    MT_ASSERT(size == 8, "run with 8 ranks, not %d", size);
    MT_ASSERT(prov == MPI_THREAD_MULTIPLE, "MPI gives thread level %d, not MPI_THREAD_MULTIPLE",
              prov);

    static ctl_state cs;
    cs.tidectl = argv[2];
    if (external != NULL) {
        cs.admin_key = getenv("TIDE_TEST_ADMIN_KEY");
        cs.server_key = getenv("TIDE_SERVER_KEY");
        MT_ASSERT(cs.admin_key != NULL && cs.server_key != NULL,
                  "TIDE_TEST_TIDED_ENDPOINT needs TIDE_TEST_ADMIN_KEY and TIDE_SERVER_KEY");
    }
    g_hosts = calloc((size_t)size, HOST_LEN);
    char me[HOST_LEN] = "";
    gethostname(me, sizeof me - 1);
    MPI_Allgather(me, HOST_LEN, MPI_CHAR, g_hosts, HOST_LEN, MPI_CHAR, MPI_COMM_WORLD);
    for (int i = 1; i < size; i++)
        g_multihost |= strcmp(g_hosts[i], g_hosts[0]) != 0;
    if (g_rank == 0 && external != NULL)
        snprintf(cs.endpoint, sizeof cs.endpoint, "%s", external);
    else if (g_rank == 0)
        snprintf(cs.endpoint, sizeof cs.endpoint, "%s", g_coord.endpoint);
    MPI_Bcast(cs.endpoint, sizeof cs.endpoint, MPI_CHAR, 0, MPI_COMM_WORLD);
    MT_ASSERT(cs.endpoint[0] != '\0', "tided did not start (no endpoint file)");

    tide_mlp_config cfg;
    tide_mlp_config_default(&cfg);
    cfg.layers = g_row->layers;
    cfg.zero1 = g_row->zero1;
    static record rec;
    rec.last_switch = 0;
    for (int g = 0; g <= MAX_GEN; g++)
        rec.switch_at[g] = rec.ck_saved[g] = -1;
    if (g_ckpt_tool != NULL) {
        if (g_rank == 0 && mkdtemp(strcpy(g_ckpt_dir, "/tmp/tide-convert.XXXXXX")) == NULL)
            g_ckpt_dir[0] = '\0';
        MPI_Bcast(g_ckpt_dir, sizeof g_ckpt_dir, MPI_CHAR, 0, MPI_COMM_WORLD);
        MT_ASSERT(g_ckpt_dir[0] != '\0', "no checkpoint directory (mkdtemp in /tmp failed)");
    }
    MT_OK(tide_mlp_collection_new(&cfg, &rec.coll));
    rec.n_tensors = tide_collection_size(rec.coll);
    MT_ASSERT(rec.n_tensors <= MAX_T, "%zu tensors", rec.n_tensors);

    tide_log_set_sink(log_sink, NULL);
    tide_log_set_level(TIDE_LOG_INFO);
    tide_options o;
    tide_options_init(&o);
    o.endpoint = cs.endpoint;
    o.register_timeout_ms = 20000;
    /* every switch within the larger of a rank's old and new state plus the staging cap,
       or it fails (a small cap, so that the bound is tight) */
    o.staging_cap = g_row->cap ? g_row->cap : 64 << 10;
    o.mem_strict = 1;
    tide_t *t = NULL;
    MT_OK(tide_new(&t, &o, MPI_COMM_WORLD));
    const mt_layout *g0 = &g_gen[0];
    /* the model's limits, as train_mlp --tide declares them: every resize is checked */
    tide_fit_rule fit[TIDE_MLP_FIT_RULES];
    int n_fit = 0;
    MT_OK(tide_mlp_tide_fit(&cfg, g_micro0, fit, &n_fit));
    tide_join_req jr = {JOB, rec.coll, g0->dp, g0->tp, g0->pp, g_micro0, 0, fit, n_fit};
    MT_OK(tide_join(t, &jr));
    const tide_view *v = tide_view_get(t);
    MT_ASSERT(v->generation == 1 && v->layout->dp == g0->dp && v->layout->tp == g0->tp &&
                  v->layout->pp == g0->pp,
              "first layout as requested");
    rec.switch_at[1] = 0;
    rec.gen_size[1] = (int64_t)tide_layout_size(v->layout);
    check_tp_in_host(v->layout, 1);
    if (g_rank == 0)
        check_status_memory(&cs, size);
    tide_mlp_t *m = NULL;
    MT_OK(tide_mlp_new(&m, &cfg, v->layout, tide_pool_rank(t), TIDE_MLP_CPU));
    if (v->member)
        MT_OK(tide_mlp_init(m));
    /* the runtime owns the state and rebuilds it in place at every switch */
    MT_OK(tide_mlp_tide_give(t, m));
    pthread_t th;
    if (g_rank == 0)
        pthread_create(&th, NULL, controller, &cs);

    tide_mlp_tide_hooks h = {&rec, h_on_step, h_before, h_after, h_done, 0, NULL};
    MT_OK(tide_mlp_tide_train(t, m, &h));
    if (g_rank == 0) {
        pthread_join(th, NULL);
        MT_ASSERT(!cs.error, "controller: %s", cs.why);
        MT_ASSERT(cs.sent == g_n_gens - 1, "controller sent %d resizes", cs.sent);
    }
    /* the final state, gathered over the last layout, into a file rank 0 compares with the
       never-resized run's (the ranks share a file system, also across the test cluster's
       hosts) */
    char state_dir[64] = "";
    if (g_rank == 0)
        MT_ASSERT(mkdtemp(strcpy(state_dir, "/tmp/tide-state.XXXXXX")) != NULL, "mkdtemp");
    MPI_Bcast(state_dir, sizeof state_dir, MPI_CHAR, 0, MPI_COMM_WORLD);
    char resized_path[128], ref_path[128];
    snprintf(resized_path, sizeof resized_path, "%s/resized.state", state_dir);
    snprintf(ref_path, sizeof ref_path, "%s/never-resized.state", state_dir);
    {
        const tide_view *last = tide_view_get(t);
        void **full = NULL;
        if (last->member)
            MT_OK(tide_mlp_tide_gather(t, m, last, &full));
        write_state(resized_path, tide_mlp_collection(m), full);
        tide_mlp_full_free(tide_mlp_collection(m), &full);
    }
    /* everyone is out of the runtime before anyone says bye */
    MPI_Barrier(MPI_COMM_WORLD);
    tide_destroy(&t);
    tide_mlp_destroy(&m);
    int n_gens = g_n_gens;

    /* one agreed switch step per generation, on every participant */
    int64_t lo[MAX_GEN + 1], hi[MAX_GEN + 1], sz[MAX_GEN + 1], tmp[MAX_GEN + 1];
    for (int g = 0; g <= MAX_GEN; g++)
        tmp[g] = rec.switch_at[g] < 0 ? INT64_MAX : rec.switch_at[g];
    MPI_Allreduce(tmp, lo, MAX_GEN + 1, MPI_INT64_T, MPI_MIN, MPI_COMM_WORLD);
    MPI_Allreduce(rec.switch_at, hi, MAX_GEN + 1, MPI_INT64_T, MPI_MAX, MPI_COMM_WORLD);
    MPI_Allreduce(rec.gen_size, sz, MAX_GEN + 1, MPI_INT64_T, MPI_MAX, MPI_COMM_WORLD);
    for (int g = 2; g <= n_gens; g++)
        MT_ASSERT(hi[g] > hi[g - 1] && lo[g] == hi[g],
                  "generation %d: switch steps differ between ranks (%lld..%lld) or do not "
                  "follow generation %d's (%lld)",
                  g, (long long)lo[g], (long long)hi[g], g - 1, (long long)hi[g - 1]);
    /* every way of rebuilding ran where the resizes call for it: dp replicas keep their
       buffers, tp/ZeRO shards that shrink are rebuilt inside theirs, and a grow past the
       limit (tp 4 -> 2, tp/pp -> one rank holding it all) spills old shards to host */
    uint64_t ways[4] = {rec.kept, rec.shrunk, rec.rebuilt, rec.spilled}, all_ways[4];
    MPI_Allreduce(ways, all_ways, 4, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD);
    /* every preparation reserved its pool blocks (TIDE_MEM_STRICT refuses past a limit) */
    int logged[3] = {__atomic_load_n(&g_reserve_refused, __ATOMIC_RELAXED),
                     __atomic_load_n(&g_spill_unprepared, __ATOMIC_RELAXED),
                     __atomic_load_n(&g_spill_prepared, __ATOMIC_RELAXED)},
        all_logged[3];
    MPI_Allreduce(logged, all_logged, 3, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    MT_ASSERT(all_logged[0] == 0,
              "%d preparations could not reserve pool memory (a limit left on the pool by the "
              "switch before?)",
              all_logged[0]);
    /* every spill went into host memory prepared ahead (none of these is a recovery) */
    MT_ASSERT(all_logged[1] == 0 && (all_ways[3] == 0 || all_logged[2] > 0),
              "%d switches spilled into host memory allocated at the switch step (%d "
              "preparations prepared some; %llu bytes spilled)",
              all_logged[1], all_logged[2], (unsigned long long)all_ways[3]);
    MT_ASSERT(all_ways[0] > 0, "no switch kept a buffer");
    uint64_t all_same = 0;
    MPI_Allreduce(&rec.n_same, &all_same, 1, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD);
    MT_ASSERT(all_same > 0, "no switch left a shard unchanged: the kept buffers are not checked");
    MT_ASSERT(!g_row->reshape || all_ways[1] > 0, "no shard shrank in place");
    MT_ASSERT(!g_row->reshape || all_ways[3] > 0, "no grow spilled an old shard");
    int64_t end = hi[n_gens] + TAIL;
    MT_ASSERT(end < MAX_STEPS, "the job ran to the step limit");
    /* the members' byes carried the last step: tided's job_ended says it, not the step of
       a heartbeat a period older */
    if (g_rank == 0) {
        static char ev[1 << 16];
        const char *args[9] = {"events", "--json", "--limit", "1000"}; /* NULL-ended */
        int n = 4;
        if (cs.admin_key != NULL) {
            args[n++] = "--key";
            args[n++] = cs.admin_key;
            args[n++] = "--server-key";
            args[n++] = cs.server_key;
        }
        char want[64];
        snprintf(want, sizeof want, "the job ends at step %lld ", (long long)end);
        /* the byes may still travel, and a loaded machine slows both ends: up to 30 s */
        int found = 0, rc = -1;
        for (uint64_t until = tide_now_ns() + 30000000000ull; !found && tide_now_ns() < until;) {
            rc = coord_tidectl_io(cs.tidectl, cs.endpoint, args, ev, sizeof ev, 1);
            found = rc == 0 && strstr(ev, want) != NULL;
            if (!found)
                usleep(100000);
        }
        MT_ASSERT(found, "no job_ended event saying \"%s\" (tidectl exit %d): %s", want, rc, ev);
    }

    /* each step ran once on every member of the layout active then */
    static int total[MAX_STEPS];
    MPI_Allreduce(rec.ran, total, MAX_STEPS, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    for (int64_t k = 0; k < MAX_STEPS; k++) {
        int g = 1;
        for (int x = 1; x <= n_gens; x++)
            if (hi[x] <= k)
                g = x;
        int want = k < end ? (int)sz[g] : 0;
        MT_ASSERT(total[k] == want, "step %lld ran %d times, want %d (generation %d)", (long long)k,
                  total[k], want, g);
    }

    /* the full state right after each switch is the state right before it, bit for bit */
    static uint64_t before[MAX_GEN + 1][MAX_T], after[MAX_GEN + 1][MAX_T];
    MPI_Allreduce(rec.before, before, (MAX_GEN + 1) * MAX_T, MPI_UINT64_T, MPI_MAX, MPI_COMM_WORLD);
    MPI_Allreduce(rec.after, after, (MAX_GEN + 1) * MAX_T, MPI_UINT64_T, MPI_MAX, MPI_COMM_WORLD);
    for (int g = 2; g <= n_gens; g++)
        for (size_t i = 0; i < rec.n_tensors; i++)
            MT_ASSERT(before[g][i] != 0 && before[g][i] == after[g][i],
                      "generation %d (switch at step %lld): tensor %s differs after the reshard "
                      "(hash %016llx before, %016llx after)",
                      g, (long long)hi[g], tide_collection_tensor(rec.coll, i)->name,
                      (unsigned long long)before[g][i], (unsigned long long)after[g][i]);

    /* tide-ckpt convert's output was the live state on every member of every new layout */
    uint64_t ck_bytes = 0;
    if (g_ckpt_tool != NULL) {
        int checked[MAX_GEN + 1];
        MPI_Allreduce(rec.ck_checked, checked, MAX_GEN + 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
        MPI_Reduce(&rec.ck_bytes, &ck_bytes, 1, MPI_UINT64_T, MPI_SUM, 0, MPI_COMM_WORLD);
        for (int g = 2; g <= n_gens; g++)
            MT_ASSERT(checked[g] == sz[g],
                      "generation %d: %d of its %lld members compared their state with the "
                      "converted checkpoint",
                      g, checked[g], (long long)sz[g]);
        if (g_rank == 0)
            MT_ASSERT(nftw(g_ckpt_dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS) == 0,
                      "cannot remove %s", g_ckpt_dir);
    }

    /* what moved is what --dry-run said: in all, and across hosts */
    static uint64_t sent[MAX_GEN + 1];
    MPI_Reduce(rec.sent, sent, MAX_GEN + 1, MPI_UINT64_T, MPI_SUM, 0, MPI_COMM_WORLD);
    for (int g = 2; g <= n_gens && g_rank == 0; g++) {
        MT_ASSERT(sent[g] == cs.dry_sent[g],
                  "generation %d: the ranks sent %llu bytes; tidectl resize --dry-run said %llu", g,
                  (unsigned long long)sent[g], (unsigned long long)cs.dry_sent[g]);
        MT_ASSERT(rec.cross[g] == cs.dry_cross[g],
                  "generation %d: %llu bytes crossed hosts; tidectl resize --dry-run said %llu", g,
                  (unsigned long long)rec.cross[g], (unsigned long long)cs.dry_cross[g]);
        if (g_multihost)
            printf("generation %d: %llu bytes sent, %llu across hosts, as --dry-run said\n", g,
                   (unsigned long long)sent[g], (unsigned long long)rec.cross[g]);
    }

    /* losses: the same on every member, and those of the never-resized run */
    static double llo[MAX_STEPS], lhi[MAX_STEPS], ref[MAX_STEPS];
    for (int64_t k = 0; k < MAX_STEPS; k++) {
        llo[k] = rec.ran[k] ? rec.loss[k] : INFINITY;
        lhi[k] = rec.ran[k] ? rec.loss[k] : -INFINITY;
    }
    MPI_Allreduce(MPI_IN_PLACE, llo, MAX_STEPS, MPI_DOUBLE, MPI_MIN, MPI_COMM_WORLD);
    MPI_Allreduce(MPI_IN_PLACE, lhi, MAX_STEPS, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    reference(&cfg, end, ref, ref_path);
    double worst = 0.0;
    for (int64_t k = 0; k < end; k++) {
        MT_ASSERT(llo[k] == lhi[k], "step %lld: loss differs between members (%.9g vs %.9g)",
                  (long long)k, llo[k], lhi[k]);
        double rel = fabs(llo[k] - ref[k]) / fabs(ref[k]);
        worst = fmax(worst, rel);
        MT_ASSERT(rel <= REL_TOL,
                  "step %lld: loss %.9g of the resized run vs %.9g never resized (rel %.2e)",
                  (long long)k, llo[k], ref[k], rel);
    }
    MT_ASSERT(ref[end - 1] < ref[0], "the loss went down (%.4f -> %.4f)", ref[0], ref[end - 1]);
    if (g_rank == 0) {
        tide_mlp_state_diff d;
        tide_status src = tide_mlp_state_compare(resized_path, ref_path, STATE_RTOL, &d);
        MT_ASSERT(src == TIDE_OK, "the final state is not the never-resized run's: %s",
                  tide_last_error());
        printf("final state equals the never-resized run's: %zu tensors, %zu bit-identical, "
               "worst relative L2 difference %.3g\n",
               d.tensors, d.identical, d.worst_rel);
        unlink(resized_path);
        unlink(ref_path);
        rmdir(state_dir);
    }
    if (g_rank == 0) {
        printf("%s: switches at steps", g_row->r.name);
        for (int g = 2; g <= n_gens; g++)
            printf(" %lld", (long long)hi[g]);
        printf("; %lld steps; state bit-identical across %d reshards; max loss rel diff %.2e; "
               "communicators built ahead, %.3f ms on them at rank 0's switch steps; %llu "
               "unchanged shards kept their buffers\n",
               (long long)end, n_gens - 1, worst, rec.groups_ms, (unsigned long long)all_same);
        if (g_ckpt_tool != NULL)
            printf("%s: tide-ckpt convert's output equalled the live state after all %d "
                   "switches (%llu bytes compared)\n",
                   g_row->r.name, n_gens - 1, (unsigned long long)ck_bytes);
        fflush(stdout);
    }
    tide_collection_destroy(&rec.coll);
    free(g_hosts);
    mt_pass("test_examples_tide");
    MPI_Finalize();
    if (is_root)
        stop_tided();
    return 0;
}
