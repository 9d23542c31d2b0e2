/*
 * The internals of test_examples_tide_recover, shared by its sources: the driver
 * (test_examples_tide_recover.c: the scenario table, tided, the never-failed runs, main's
 * checks; its opening comment says what each scenario checks), the training hooks
 * (tide_recover_hooks.c), what tided and tidectl report (tide_recover_tided.c), the
 * checkpoint scenarios (tide_recover_ckpt.c) and the resizes (tide_recover_resize.c). Not a
 * fixture: the scenario this run plays (g), the ranks' pids and the endpoints are state of
 * the one process, defined once (test_examples_tide_recover.c, tide_recover_tided.c) and
 * declared here, so every source reads the same copy.
 */
#ifndef TIDE_TESTS_TIDE_RECOVER_INT_H
#define TIDE_TESTS_TIDE_RECOVER_INT_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "examples/mlp_tide.h"
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
extern int g_pids[16], g_npids;
void fail_all(void);

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

extern int g_rank;

/*
 * The scenario this run plays: its row and what follows from it, set in main before the
 * join. The kill's steps count from the generation the victim dies in, so they are set
 * (set_kill_base) on every rank once it is in that generation: at the join, or at the
 * switch to it after the resizes. Read by the training thread and rank 0's watchdog.
 */
struct recover_plan {
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
};
extern struct recover_plan g;

/* ckpt modes: the checkpoint root (made by rank 0), tidectl and tided's endpoint (for the
   victim, which waits for its checkpoint to be known) */
extern char g_ckpt_root[256], g_endpoint[256];
extern const char *g_tidectl;

/* rank 0's runtime, for the victim's worker id (tide_recover_tided.c) */
extern tide_t *g_t;
/* ckpt-corrupt: the damaged checkpoint was saved again (tide_recover_tided.c) */
extern int g_resaved;

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

/* ---- resizes before the kill ----------------------------------------------------------------- */

/* Rank 0's thread in scenarios with resizes: resize k goes out through the tidectl binary
   once the job has run GAP steps of generation k. */
typedef struct resizer {
    const char *tidectl;
    char endpoint[256];
    volatile int sent;
    char why[512]; /* what went wrong, "" when nothing */
} resizer;

/* ---- across the sources (each defined with its contract where it lives) ------------------- */

/* test_examples_tide_recover.c: the scenario, the never-failed run, the end */
void set_kill_base(int base);
void find_victim(const tide_layout_t *l);
double compare_state(const tide_collection_t *c, void *const *got, void *const *want,
                     double rel_tol);
int pass(MPI_Comm *surv, tide_collection_t **coll, int is_root);

/* tide_recover_hooks.c: the training hooks and what each rank records */
void record_free_layouts(record *r);
int layout_has(const tide_layout_t *l, int rank);
tide_status h_on_step(void *ctx, tide_t *t, const tide_mlp_t *m, int64_t step, double loss,
                      double secs);
tide_status h_at(void *ctx, tide_t *t, const tide_mlp_t *m, int64_t step, tide_mlp_point point);
tide_status h_before(void *ctx, tide_t *t, const tide_mlp_t *m);
tide_status h_after(void *ctx, tide_t *t, const tide_mlp_t *m, const tide_mlp_switch_stats *st);
int h_done(void *ctx, const tide_view *v);

/* tide_recover_tided.c: tidectl's replies, rank 0's checks of them, the watchdog */
int tidectl_events(const char *tidectl, const char *endpoint, char *out, size_t cap);
int count_of(const char *hay, const char *needle);
int object_with(const char *hay, const char *needle, char *out, size_t cap);
int has_text(const char *s, const char *text);
int events_with(const char *events, const char *kind, const char *text);
void check_tidectl(const char *tidectl, const char *endpoint, const tide_layout_t *now);
void check_refused_resize(const char *tidectl, const char *endpoint);
void *watchdog(void *arg);

/* tide_recover_ckpt.c: the checkpoint scenarios */
int unreported_checkpoint(const char *events);
void wait_checkpoint_known(tide_t *t, int step);
void damage_checkpoint(int step);
void request_checkpoint(record *r, int completed);
void keep_requested_state(tide_t *t, const tide_mlp_t *m, record *r, int64_t step);
void remove_checkpoints(const char *root);
int finish_request(tide_t *t, tide_mlp_t *m, record *rec, const double *ref,
                   const double *ref_layouts, void ***want, int is_root);

/* tide_recover_resize.c: the resizes, the switches and runs the layouts call for */
void *resize_thread(void *arg);
int agreed_end(const record *rec, MPI_Comm surv);
void check_resizes(const record *rec, MPI_Comm surv, int64_t *gen_at);
void share_recovery_layout(record *rec, MPI_Comm surv);
int switches_of(const record *rec, int r);
int runs_of(const record *rec, const int64_t *gen_at, int k);

#endif
