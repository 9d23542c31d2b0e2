/*
 * proto: every tide control-plane message, with msgpack encode and strict decode, and
 * every structure tide writes to a disk (records: see "records" below). proto is the one
 * encoder and decoder of each: a layout, a tensor collection, a pool list, a fit rule, a
 * checkpoint list or manifest has one schema here, whoever sends or stores it.
 *
 * Wire format: one message = one msgpack map holding exactly
 *   "v"    : 1 (TIDE_PROTO_VERSION; any other value is refused),
 *   "type" : the message type name ("heartbeat", "layout", ...),
 *   and the typed fields listed beside each struct below, nothing else.
 * Map keys are strings. Field order on the wire is free; a key may appear once.
 *
 * Strictness wins: the decoder refuses unknown types, a wrong or missing "v",
 * missing fields, unknown extra fields, duplicated keys, values of the wrong
 * msgpack type, out-of-range numbers, oversize arrays and strings, NUL bytes
 * inside strings, truncated input and trailing bytes after the map. Each refusal
 * is TIDE_ERR_PROTOCOL with a detail naming the message and field, e.g.
 * "heartbeat: field 'step' must be a non-negative integer". A peer that wants a
 * new field needs a new schema version; there are no optional fields, only
 * fields whose value may be empty ("" / [] / nil where stated).
 *
 * Number rules: integer fields accept msgpack integers only; "double" fields
 * accept float32/float64 and integers, must be finite and within their range.
 * Worker ids are int32 >= 0 (the reshard/ layout's worker ids). All byte counts
 * are uint64 bytes, all durations are ms, all wall-clock times are ms since the
 * Unix epoch.
 *
 * Workload: tided decodes ~10^4 heartbeats per second (a few hundred bytes
 * each) plus rare large messages (a layout of up to 2^20 workers, a status reply
 * with one row per GPU). Encode and decode are reentrant and thread-safe on
 * distinct buffers and messages; no global state.
 */
#ifndef TIDE_PROTO_H
#define TIDE_PROTO_H

#include <stddef.h>
#include <stdint.h>

#include <tide/status.h>

#ifdef __cplusplus
extern "C" {
#endif

#define TIDE_PROTO_VERSION 1

/* ---- limits (decode refuses anything larger; encode too) ------------------------ */

#define TIDE_PROTO_MAX_MSG_BYTES   (32u << 20) /* bytes of one encoded message */
#define TIDE_PROTO_MAX_OBJECTS     (1u << 22)  /* msgpack objects (values, keys) in one message */
#define TIDE_PROTO_MAX_DEPTH       8           /* nesting of maps and arrays */
#define TIDE_PROTO_NAME_MAX        127         /* job, pool and plugin names (chars) */
#define TIDE_PROTO_HOST_MAX        255         /* host names (chars) */
#define TIDE_PROTO_TEXT_MAX        1023        /* reasons, messages, event details (chars) */
#define TIDE_PROTO_TAIL_MAX        8191        /* the end of an offline command's output */
#define TIDE_PROTO_TENSOR_NAME_MAX 95          /* = reshard's TIDE_NAME_MAX - 1 */
#define TIDE_PROTO_DEGREE_MAX      65536       /* each of dp, tp, pp */
#define TIDE_PROTO_WORKERS_MAX     (1u << 20)  /* dp * tp * pp, pool size */
#define TIDE_PROTO_LAYERS_MAX      (1u << 20)  /* layers of a model */
#define TIDE_PROTO_MICRO_MAX       65536       /* micro-batches per step */
#define TIDE_PROTO_TENSORS_MAX     (1u << 17)  /* tensors in a join's collection */
#define TIDE_PROTO_FIT_MAX         32          /* fit rules of a join (= TIDE_FIT_RULES_MAX) */
#define TIDE_PROTO_FIT_WHAT_MAX    95 /* chars of a fit rule's what (= TIDE_FIT_WHAT_MAX - 1) */
#define TIDE_PROTO_FIT_N_MAX       (INT64_C(1) << 62) /* a fit rule's n */
#define TIDE_PROTO_DIMS_MAX        4                  /* tensor rank */
#define TIDE_PROTO_ARGV_MAX        256                /* argv entries of an offline command */
#define TIDE_PROTO_PROCS_MAX       4194304 /* max_procs of an offline command (pid_max's limit) */
#define TIDE_PROTO_ARG_MAX         4095               /* bytes of one argv entry */
#define TIDE_PROTO_ROWS_MAX        (1u << 16)         /* rows of a status or jobs reply */
#define TIDE_PROTO_HOST_BEATS_MAX  1024               /* heartbeats in one host_heartbeat */
#define TIDE_PROTO_EVENTS_MAX      10000 /* rows of an events reply, and events limit */
#define TIDE_PROTO_ATTEMPTS_MAX    100   /* rows of a logs reply */
#define TIDE_PROTO_DEVICE_MAX      1023  /* local device index */
#define TIDE_PROTO_MS_MAX          1e12  /* any duration in ms (~31 years) */

/* Job names: 1..NAME_MAX chars of [A-Za-z0-9._:-]. Hosts: 1..HOST_MAX chars,
 * printable ASCII without spaces. Pool ids and plugin names: like job names.
 * Texts: 0..TEXT_MAX bytes, any byte but NUL. */

/* ---- enums carried as strings on the wire ------------------------------------------ */

typedef enum tide_proto_device_kind {
    TIDE_DEVICE_CPU = 0, /* "cpu": host-memory worker */
    TIDE_DEVICE_GPU = 1, /* "gpu" */
} tide_proto_device_kind_t;

typedef enum tide_proto_worker_state {
    TIDE_WORKER_IDLE = 0,     /* "idle": registered, holds no job */
    TIDE_WORKER_ONLINE = 1,   /* "online": in an online job's layout */
    TIDE_WORKER_OFFLINE = 2,  /* "offline": running offline work */
    TIDE_WORKER_FAILED = 3,   /* "failed": missed heartbeats or reported failure */
    TIDE_WORKER_DRAINING = 4, /* "draining": leaves its job, takes no new work */
    TIDE_WORKER_LEFT = 5,     /* "left": said bye; forgotten after tided's retention */
} tide_proto_worker_state_t;

typedef enum tide_proto_job_kind {
    TIDE_JOB_ONLINE = 0,  /* "online": a training job holding a layout */
    TIDE_JOB_COMMAND = 1, /* "command": offline child process */
    TIDE_JOB_PLUGIN = 2,  /* "plugin": offline in-process task plugin (tide_task.h) */
} tide_proto_job_kind_t;

typedef enum tide_proto_job_state {
    TIDE_JOB_QUEUED = 0,     /* "queued" */
    TIDE_JOB_RUNNING = 1,    /* "running" */
    TIDE_JOB_RESIZING = 2,   /* "resizing": a generation switch is in flight */
    TIDE_JOB_RECOVERING = 3, /* "recovering": after a worker loss */
    TIDE_JOB_PREEMPTED = 4,  /* "preempted": offline work gave its GPU back, requeued */
    TIDE_JOB_DONE = 5,       /* "done" */
    TIDE_JOB_FAILED = 6,     /* "failed" */
    TIDE_JOB_CANCELLED = 7,  /* "cancelled" */
    TIDE_JOB_STALLED = 8,    /* "stalled": cannot recover (or resize) until something changes;
                                its stalled event says what */
} tide_proto_job_state_t;

typedef enum tide_proto_placement {
    TIDE_PLACEMENT_DEFAULT = 0, /* "default": rank order */
    TIDE_PLACEMENT_OPTIMAL = 1, /* "optimal": minimise planned bytes, TP inside a host */
} tide_proto_placement_t;

/* ---- shared sub-structures ------------------------------------------------------------ */

/*
 * A parallel layout, the same shape as reshard/'s tide_layout_t (copy the arrays
 * across). Wire: map {"gen","dp","tp","pp","layers","micro","stages","workers"}.
 * Checks: dp, tp, pp in [1, 65536] with dp*tp*pp <= 2^20; layers in
 * [pp, 2^20]; micro in [1, 65536]; stages has pp + 1 entries, stages[0] = 0,
 * strictly increasing, stages[pp] = layers; workers has dp*tp*pp entries, each
 * in [0, INT32_MAX] (uniqueness is reshard's tide_layout_validate's job).
 */
typedef struct tide_proto_layout {
    uint64_t gen; /* generation this layout belongs to */
    int dp, tp, pp;
    int num_layers;    /* "layers" */
    int micro_batches; /* "micro" */
    int *stage_start;  /* "stages": pp + 1 entries; owned (see tide_msg_clear) */
    int32_t *worker;   /* "workers": index ((p * dp) + d) * tp + t; owned */
} tide_proto_layout_t;

/*
 * One tensor of a job's collection (reshard/'s tide_tensor_desc), in a join or a
 * checkpoint manifest. Wire: map {"name","dtype","shape","layer","tp","tp_dim","seg","dp"}.
 * name: 1..95 bytes, any but NUL (as a collection takes); dtype: a tide_dtype value in
 * [0, 6]; shape: 1..4 entries >= 1; layer: >= -3 (PRE -1, POST -2, ALL -3) and < the
 * model's layers; tp: 0 replicated / 1 split; tp_dim in [0, ndim) (0 when replicated);
 * seg >= 1; dp: 0 replicated / 1 sharded. (The collection checks the rest: seg divides
 * the split dimension, at most 2^56 bytes.)
 */
typedef struct tide_proto_tensor {
    char name[TIDE_PROTO_TENSOR_NAME_MAX + 1];
    int dtype;
    int ndim;
    int64_t shape[TIDE_PROTO_DIMS_MAX];
    int layer;
    int tp;
    int tp_dim;
    int tp_segments; /* "seg" */
    int dp;
} tide_proto_tensor_t;

/*
 * One fit rule of a job (include/tide/collection.h's tide_fit_rule): the degree must
 * divide n. Wire: map {"degree","n","what"}; degree "dp" | "tp" | "pp"; n in [1, 2^62];
 * what 0..95 chars of printable ASCII (spaces allowed): what n counts, for refusals.
 */
typedef struct tide_proto_fit {
    int degree;                             /* "degree": 0 dp, 1 tp, 2 pp (tide_degree) */
    int64_t n;                              /* "n" */
    char what[TIDE_PROTO_FIT_WHAT_MAX + 1]; /* "what" */
} tide_proto_fit_t;

/*
 * A launch's allocation with a batch scheduler, as its worker read it from its environment
 * at registration (Slurm: SLURM_JOB_ID, SLURM_JOB_NODELIST, SLURMD_NODENAME,
 * SLURM_STEP_GPUS or SLURM_JOB_GPUS, SLURM_JOB_PARTITION, SLURM_RESTART_COUNT). Wire: map
 * {"sched","id","nodes","node","gpus","partition","restarts"}. sched "" (no scheduler):
 * every other field empty or 0. sched "slurm": id 1..31 chars of [0-9_] (not starting
 * with '_'); the others may be "" where Slurm did not say. nodes, node, gpus, partition:
 * printable ASCII without spaces.
 */
#define TIDE_PROTO_ALLOC_ID_MAX 31  /* chars of a scheduler's job id */
#define TIDE_PROTO_GPUS_MAX     255 /* chars of a GPU list ("0,1,2,3") */
typedef struct tide_proto_alloc {
    char sched[16];                          /* "sched": "" or "slurm" */
    char id[TIDE_PROTO_ALLOC_ID_MAX + 1];    /* "id" */
    char nodes[TIDE_PROTO_TEXT_MAX + 1];     /* "nodes": the allocation's (Slurm hostlist) */
    char node[TIDE_PROTO_HOST_MAX + 1];      /* "node": this launch's node, as Slurm names it */
    char gpus[TIDE_PROTO_GPUS_MAX + 1];      /* "gpus": GPUs Slurm gave the launch */
    char partition[TIDE_PROTO_NAME_MAX + 1]; /* "partition" */
    int restarts;                            /* "restarts": times requeued, [0, INT32_MAX] */
} tide_proto_alloc_t;

/* ---- worker <-> tided ------------------------------------------------------------------- */

/* "register" worker -> tided: a pool process announces its device. */
typedef struct tide_proto_register {
    char pool[TIDE_PROTO_NAME_MAX + 1]; /* "pool": id shared by one mpirun launch */
    int rank;                           /* "rank": MPI rank, [0, size) */
    int size;                           /* "size": pool size, [1, 2^20] */
    char host[TIDE_PROTO_HOST_MAX + 1]; /* "host" */
    int device;                         /* "device": local index, [0, 1023] */
    uint64_t mem_bytes;                 /* "mem": device memory, bytes */
    tide_proto_device_kind_t kind;      /* "kind": "cpu" | "gpu" */
    int pid;                            /* "pid": [1, INT32_MAX] */
    tide_proto_alloc_t alloc;           /* "alloc": the launch's scheduler allocation */
} tide_proto_register_t;

/* "register_ok" tided -> worker. fail_ms is how long tided waits for a message from the
   worker before it declares it failed: a worker silent that long (stopped, starved) must
   assume it was fenced (its lease ran out) and touch no peer again. */
typedef struct tide_proto_register_ok {
    int32_t worker;   /* "worker": id assigned by tided */
    int heartbeat_ms; /* "heartbeat_ms": [10, 600000] */
    int fail_ms;      /* "fail_ms": [heartbeat_ms, INT32_MAX], the failure timeout, ms */
} tide_proto_register_ok_t;

/* "heartbeat" worker -> tided, every heartbeat_ms. Durations cover the last interval. */
typedef struct tide_proto_heartbeat {
    int32_t worker;   /* "worker" */
    uint64_t step;    /* "step": training step (0 when no job) */
    uint64_t gen;     /* "gen": generation the worker runs (0 when none) */
    double idle_ms;   /* "idle_ms": time with no work at all, ms */
    double bubble_ms; /* "bubble_ms": pipeline idle windows inside steps, ms */
    double filled_ms; /* "filled_ms": part of bubble_ms spent in offline task steps, ms */
    double step_ms;   /* "step_ms": mean step time, ms (0 when no step ran) */
    double in_step_ms; /* "in_step_ms" (optional, 0 when absent): how long the step the rank
                          is inside has run, ms (0 outside a step): a stalled collective */
} tide_proto_heartbeat_t;

/*
 * "host_heartbeat" worker -> tided, every heartbeat_ms, from the leader of the ranks of one
 * host (the lowest local rank whose control thread runs): the heartbeats of the ranks of
 * the host whose own control threads published one since the last host heartbeat, each
 * exactly a "heartbeat" map. tided handles each entry as that rank's heartbeat; a rank
 * left out is not renewed. beats: 1..1024 entries in strictly increasing worker order,
 * the sender's own among them.
 */
typedef struct tide_proto_host_heartbeat {
    int32_t worker;                /* "worker": the sending rank (the host's leader) */
    tide_proto_heartbeat_t *beats; /* "beats": array of heartbeat maps; owned */
    uint32_t n_beats;
} tide_proto_host_heartbeat_t;

/* "bye" worker -> tided: orderly exit, no failure handling. */
typedef struct tide_proto_bye {
    int32_t worker; /* "worker" */
    uint64_t step;  /* "step": steps the worker's job completed when it left (0 when no job):
                       the job's last step, which the last heartbeat may not have carried */
} tide_proto_bye_t;

/*
 * "join" worker -> tided: the worker runs online job `job` and describes its state.
 * Every worker of the job sends it; tided creates the job on the first one. tensors may
 * be empty (tided can then estimate moves only from total_bytes). Requested initial
 * degrees: dp*tp*pp <= 2^20, pp <= num_layers. fit: what layouts the program can run
 * (0..32 rules; [] when it declared none); that the requested degrees keep them is
 * tided's check, not the decoder's (a refusal then names the rule). min, max, priority:
 * the job's elastic declaration made at launch (coordinator/elastic.h), optional (left
 * out when 0, absent from workers of before them: no bounds, priority 0); min and max
 * are both 0 or both set; that a layout of the job meets them is tided's check.
 */
typedef struct tide_proto_join {
    int32_t worker;                    /* "worker" */
    char job[TIDE_PROTO_NAME_MAX + 1]; /* "job" */
    uint64_t total_bytes;              /* "total_bytes": one replica of the state, bytes */
    int num_layers;                    /* "layers": [1, 2^20] */
    int dp, tp, pp;                    /* "dp","tp","pp": requested initial layout */
    int micro_batches;                 /* "micro": [1, 65536] */
    tide_proto_tensor_t *tensors;      /* "tensors": array of tensor maps; owned */
    uint32_t n_tensors;                /* <= TIDE_PROTO_TENSORS_MAX */
    tide_proto_fit_t *fit;             /* "fit": array of fit rule maps; owned */
    uint32_t n_fit;                    /* <= TIDE_PROTO_FIT_MAX */
    int32_t min_gpus, max_gpus;        /* "min","max": bounds in GPUs, [0, 2^20]; 0: none */
    int32_t priority;                  /* "priority": [0, 100]; 0 when not declared */
} tide_proto_join_t;

/*
 * "layout" tided -> worker: the job's layout for generation layout.gen, and the
 * previous generation's layout to reshard from ("prev": nil for a job's first
 * layout, has_prev = 0; else prev.gen < layout.gen).
 * Layouts name workers by job rank: a job spans one or more pools (mpirun launches),
 * each a range of job ranks starting at its base; the first pool's base is 0. "base"
 * is the receiving worker's pool's base and "world" the job ranks of every pool
 * connected once this generation runs. A generation that connects a pool launched
 * later lists the job ranks of both sides of the connection: "join_old" (the ranks
 * already connected that take part, sorted) and "join_new" (the joining pool's, sorted);
 * both are empty otherwise. A generation that holds no rank of one or more connected
 * pools releases them (their launches leave the job) and lists the live job ranks of the
 * launches that stay ("stay", sorted; the layout's ranks are among them) and of those
 * that leave ("leave", sorted): at the switch each side makes a communicator of its own
 * ranks and drops the other's. Both are empty otherwise; a generation never both
 * connects and releases.
 * "recover" says at announcement that the generation is a recovery after a worker loss
 * (its prev names a dead member), as its commit will: a worker builds the communicators
 * of a plain resize while the old layout still trains, and must not wait there for a
 * member that died.
 */
typedef struct tide_proto_layout_msg {
    char job[TIDE_PROTO_NAME_MAX + 1]; /* "job" */
    tide_proto_layout_t layout;        /* "layout" */
    int has_prev;
    tide_proto_layout_t prev; /* "prev": map or nil */
    int32_t base;             /* "base": [0, 2^20) */
    int32_t world;            /* "world": [1, 2^20], > base */
    int32_t *join_old;        /* "join_old": owned */
    uint32_t n_join_old;      /* <= TIDE_PROTO_WORKERS_MAX */
    int32_t *join_new;        /* "join_new": owned */
    uint32_t n_join_new;      /* <= TIDE_PROTO_WORKERS_MAX */
    int32_t *stay;            /* "stay": owned */
    uint32_t n_stay;          /* <= TIDE_PROTO_WORKERS_MAX */
    int32_t *leave;           /* "leave": owned */
    uint32_t n_leave;         /* <= TIDE_PROTO_WORKERS_MAX */
    int recover;              /* "recover": bool, a recovery (see above) */
    /* "ckpt": a recovery whose lost state no survivor holds rolls back to the job's last
       complete checkpoint: its directory (as the workers reported it, "saved"), from which
       every member of the new layout loads its shards; "" for any other generation (state
       from the old layout's holders). Given only with "recover" and "prev". */
    char ckpt[TIDE_PROTO_TEXT_MAX + 1];
    uint64_t ckpt_step; /* "ckpt_step": that checkpoint's step (the new layout's first step);
                           0 when "ckpt" is "" */
} tide_proto_layout_msg_t;

/* "job_end" tided -> worker: the job this idle rank joined has ended (a member said bye
   with no switch pending, or every rank of it is gone) after `step` steps; the rank stops
   waiting for a layout. */
typedef struct tide_proto_job_end {
    char job[TIDE_PROTO_NAME_MAX + 1]; /* "job" */
    uint64_t step;                     /* "step": steps the job completed */
    char why[TIDE_PROTO_TEXT_MAX + 1]; /* "why": tided's job_ended event, for the rank's log */
} tide_proto_job_end_t;

/* "release" tided -> worker: generation gen of the job, committed, released every rank of
   this worker's pool and dropped its connection to the job's other pools (the pool was
   in the generation's "leave"): the rank stops waiting for a layout, its program
   finishes and its mpirun may exit without disturbing the job. */
typedef struct tide_proto_release {
    char job[TIDE_PROTO_NAME_MAX + 1]; /* "job" */
    uint64_t gen;                      /* "gen": the generation that released the pool */
} tide_proto_release_t;

/* "join_port" worker -> tided -> workers: the MPI port name the connected side of a
   join accepts on (MPI_Open_port), sent by its lowest job rank and relayed by tided to
   the joining pool's ranks, which connect to it (MPI_Comm_connect). */
typedef struct tide_proto_join_port {
    int32_t worker;                     /* "worker": the sender (tided: the receiver) */
    char job[TIDE_PROTO_NAME_MAX + 1];  /* "job" */
    uint64_t gen;                       /* "gen": the generation that connects */
    char port[TIDE_PROTO_TEXT_MAX + 1]; /* "port": MPI port name */
} tide_proto_join_port_t;

/* "prepare" tided -> workers: stop at the proposed step boundary for generation gen. */
typedef struct tide_proto_prepare {
    char job[TIDE_PROTO_NAME_MAX + 1]; /* "job" */
    uint64_t gen;                      /* "gen": the new generation */
    uint64_t step;                     /* "step": proposed switch step */
} tide_proto_prepare_t;

/* "prepare_ack" worker -> tided: where the worker is now (tided takes the max). */
typedef struct tide_proto_prepare_ack {
    int32_t worker;                    /* "worker" */
    char job[TIDE_PROTO_NAME_MAX + 1]; /* "job" */
    uint64_t gen;                      /* "gen" */
    uint64_t step;                     /* "step": the worker's current step */
} tide_proto_prepare_ack_t;

/* "commit" tided -> workers: switch to generation gen after finishing step `step`. */
typedef struct tide_proto_commit {
    char job[TIDE_PROTO_NAME_MAX + 1]; /* "job" */
    uint64_t gen;                      /* "gen" */
    uint64_t step;                     /* "step": the agreed switch step */
    int recover;                       /* "recover": bool, a recovery after a worker loss (the
                                          old layout's collectives cannot complete) */
} tide_proto_commit_t;

/* "abort" tided -> workers: give up generation gen, keep/restore the old layout. */
typedef struct tide_proto_abort {
    char job[TIDE_PROTO_NAME_MAX + 1];    /* "job" */
    uint64_t gen;                         /* "gen": the generation abandoned */
    char reason[TIDE_PROTO_TEXT_MAX + 1]; /* "reason" */
} tide_proto_abort_t;

/* "halt" tided -> worker: job `job` cannot go on from generation gen (its lost state has
   no live replica, say): the worker stops taking steps and its program gets code and the
   reason. Sent to the job's surviving workers; permanent for that job. */
typedef struct tide_proto_halt {
    char job[TIDE_PROTO_NAME_MAX + 1];    /* "job" */
    uint64_t gen;                         /* "gen": the generation that cannot go on */
    int code;                             /* "code": a tide_status, [-1000, -1] */
    char reason[TIDE_PROTO_TEXT_MAX + 1]; /* "reason" */
} tide_proto_halt_t;

/* "save" tided -> worker: an operator's checkpoint request (`tidectl checkpoint`), agreed
   in two phases so that no member can have passed its step. PROPOSE: request `id` asks
   every rank of job `job` to save its registered buffers under root `dir` at the step
   boundary where it has completed `step` steps; each answers "save_ack" at once with the
   steps it has completed, and a member that reaches that boundary before tided's decision
   waits there for it (bounded). GO: every member acked before reaching `step`: each saves
   there (as tide_checkpoint) and trains on. DROP: tided gave the request up (a member had
   passed the step and tided proposes again with a new id, or a member never answered). A
   rank that hears GO after passing the step reports "saved" with an error. */
#define TIDE_PROTO_SAVES_MAX 8 /* requests a rank holds until their steps (tided asks no more) */
enum {
    TIDE_PROTO_SAVE_PROPOSE = 0, /* left out on the wire */
    TIDE_PROTO_SAVE_GO = 1,
    TIDE_PROTO_SAVE_DROP = 2,
};
typedef struct tide_proto_save {
    char job[TIDE_PROTO_NAME_MAX + 1]; /* "job" */
    char dir[TIDE_PROTO_TEXT_MAX + 1]; /* "dir": the checkpoint root, 1.. chars */
    uint64_t step;                     /* "step": steps completed by the saved state */
    uint64_t id;                       /* "id": the request, unique per tided run; 0 is none */
    uint32_t phase;                    /* "phase": TIDE_PROTO_SAVE_* */
} tide_proto_save_t;

/* "save_ack" worker -> tided: this rank heard PROPOSE `id` (for `step`) of job `job` having
   completed `done` steps, as a member of the job's layout (`member`) or not. It can save at
   `step` only when done < step (it checks for requests at each boundary after this one). */
typedef struct tide_proto_save_ack {
    int32_t worker;                    /* "worker" */
    char job[TIDE_PROTO_NAME_MAX + 1]; /* "job" */
    uint64_t id;                       /* "id" */
    uint64_t step;                     /* "step": the proposed step, echoed */
    uint64_t done;                     /* "done": steps completed when it heard the proposal */
    int member;                        /* "member" */
} tide_proto_save_ack_t;

/* "saved" worker -> tided: a checkpoint of job `job` with `step` steps ended: code 0: it is
   complete in directory `dir` (ROOT/step-<012 step>; sent by its publisher, the layout's
   first member); else the save failed on this worker (its reason; dir: the root). */
typedef struct tide_proto_saved {
    int32_t worker;                       /* "worker" */
    char job[TIDE_PROTO_NAME_MAX + 1];    /* "job" */
    uint64_t step;                        /* "step" */
    char dir[TIDE_PROTO_TEXT_MAX + 1];    /* "dir": 1.. chars */
    int code;                             /* "code": a tide_status, [-1000, 0] */
    char reason[TIDE_PROTO_TEXT_MAX + 1]; /* "reason": "" when code is 0 */
} tide_proto_saved_t;

/* "fenced" tided -> worker: tided declared this worker failed while it held a coordinate
   of online job `job` (or took part in its switch), and the job went on without it (it
   runs generation gen now). The worker must touch none of its old peers again and leave;
   tided keeps it failed and answers every further message of this process so. */
typedef struct tide_proto_fenced {
    int32_t worker;                       /* "worker": the fenced worker's id */
    char job[TIDE_PROTO_NAME_MAX + 1];    /* "job": the job it was fenced from ("" if gone) */
    uint64_t gen;                         /* "gen": the job's generation now (0 if unknown) */
    char reason[TIDE_PROTO_TEXT_MAX + 1]; /* "reason": why it was declared failed */
} tide_proto_fenced_t;

/* "liveness" worker -> tided: which of job `job`'s ranks are alive members of it now. A
   switch asks it for the old members that leave the layout (their state comes from
   replicas when they are gone); an exact answer for exactly these ranks, whatever the
   size of the cluster. ranks: 1..2^20 job ranks, strictly increasing. */
typedef struct tide_proto_liveness {
    int32_t worker;                    /* "worker": the asking worker */
    char job[TIDE_PROTO_NAME_MAX + 1]; /* "job" */
    int32_t *ranks;                    /* "ranks": owned */
    uint32_t n_ranks;
} tide_proto_liveness_t;

/* "liveness_reply" tided -> worker: alive[i] is 1 when job rank ranks[i] is held by a
   worker that is neither failed nor gone and still holds a coordinate of (or a part in) the
   job, else 0. ranks echoes the request; alive has as many entries. */
typedef struct tide_proto_liveness_reply {
    char job[TIDE_PROTO_NAME_MAX + 1]; /* "job" */
    int32_t *ranks;                    /* "ranks": owned, as asked */
    uint32_t n_ranks;
    int32_t *alive; /* "alive": owned, 0 or 1 per rank */
    uint32_t n_alive;
} tide_proto_liveness_reply_t;

/* "done" worker -> tided: the worker finished (or failed) switching to gen. */
typedef struct tide_proto_done {
    int32_t worker;                    /* "worker" */
    char job[TIDE_PROTO_NAME_MAX + 1]; /* "job" */
    uint64_t gen;                      /* "gen" */
    int status;                        /* "status": a tide_status, 0 ok, [-1000, 0] */
    uint64_t bytes_moved;              /* "bytes": bytes this worker sent, bytes */
    double ms;                         /* "ms": switch duration, ms */
} tide_proto_done_t;

/* "failure" worker -> tided: the worker hit an error it cannot recover from. */
typedef struct tide_proto_failure {
    int32_t worker;                       /* "worker" */
    char job[TIDE_PROTO_NAME_MAX + 1];    /* "job": "" when none */
    uint64_t gen;                         /* "gen": 0 when none */
    int code;                             /* "code": a tide_status, [-1000, 0] */
    char reason[TIDE_PROTO_TEXT_MAX + 1]; /* "reason" */
} tide_proto_failure_t;

/* "leave" worker -> tided: the worker's launch must give its node back soon (its scheduler
   signalled a preemption or a time limit): tided shrinks the job off the launch as a
   planned change and releases it. Every rank of the launch may send it; once per launch
   counts. */
typedef struct tide_proto_leave {
    int32_t worker;                       /* "worker" */
    char reason[TIDE_PROTO_TEXT_MAX + 1]; /* "reason": for events ("SIGUSR1 from Slurm") */
} tide_proto_leave_t;

/*
 * "offline_assign" tided -> worker: run offline job `job` on this worker. Command jobs
 * carry argv (1..256 entries, each 1..4095 bytes, no NUL) and an empty plugin; plugin
 * jobs carry plugin (a name) and argv as its arguments (may be empty).
 */
typedef struct tide_proto_offline_assign {
    char job[TIDE_PROTO_NAME_MAX + 1];    /* "job" */
    tide_proto_job_kind_t kind;           /* "kind": "command" | "plugin" */
    char plugin[TIDE_PROTO_NAME_MAX + 1]; /* "plugin": "" for commands */
    char **argv;                          /* "argv": owned, each entry owned */
    uint32_t argc;
    int priority;     /* "priority": [-1000, 1000], higher first */
    uint64_t mem_cap; /* "mem_cap": bytes, 0 = no cap */
    int bubbles;      /* "bubbles": bool, run inside pipeline bubbles */
    uint32_t attempt; /* "attempt": 1 for the first run */
    int grace_ms;     /* "grace_ms": [0, 600000], SIGTERM -> SIGKILL when the worker stops
                         the command itself (it leaves or dies) */
    uint64_t max_memory; /* "max_memory": host memory of a command's attempt, bytes; 0 (left
                            out, as older tided sends it): no limit */
    uint32_t max_procs;  /* "max_procs": [0, TIDE_PROTO_PROCS_MAX] processes of a command's
                            attempt; 0 (left out): no limit */
} tide_proto_offline_assign_t;

/* "preempt" tided -> worker: stop offline job `job` within grace_ms. */
typedef struct tide_proto_preempt {
    char job[TIDE_PROTO_NAME_MAX + 1]; /* "job" */
    int grace_ms;                      /* "grace_ms": [0, 600000] */
} tide_proto_preempt_t;

/* "offline_status" worker -> tided: attempt `attempt` of offline job `job` runs or ended.
 * A command's output is in the file `log` on the worker's host; the report of its end
 * carries the file's last bytes in `tail` (the whole file when it is that short). */
typedef struct tide_proto_offline_status {
    int32_t worker;                     /* "worker" */
    char job[TIDE_PROTO_NAME_MAX + 1];  /* "job" */
    uint32_t attempt;                   /* "attempt": from offline_assign, >= 1 */
    tide_proto_job_state_t state;       /* "state" */
    int exit_code;                      /* "exit_code": [-255, 255]; -N = killed by signal N */
    double progress;                    /* "progress": [0, 1] */
    char log[TIDE_PROTO_TEXT_MAX + 1];  /* "log": path of the output file, "" when none */
    char tail[TIDE_PROTO_TAIL_MAX + 1]; /* "tail": the output's last bytes, "" while running */
} tide_proto_offline_status_t;

/* "bubble" worker -> tided: summary of pipeline idle windows over `steps` steps. */
typedef struct tide_proto_bubble {
    int32_t worker;                    /* "worker" */
    char job[TIDE_PROTO_NAME_MAX + 1]; /* "job" */
    uint64_t gen;                      /* "gen" */
    uint32_t steps;                    /* "steps": steps summarised, >= 1 */
    uint32_t windows;                  /* "windows": idle windows per step */
    double total_ms;                   /* "total_ms": idle time in windows, all steps, ms */
    double mean_ms;                    /* "mean_ms": mean window length, ms */
    double max_ms;                     /* "max_ms": longest window, ms */
} tide_proto_bubble_t;

/* ---- tidectl <-> tided --------------------------------------------------------------------- */

/* "status" tidectl (or any reader) -> tided: one page of the worker table, the workers
   with id >= from in id order, at most limit rows (0: as many as tided puts in one reply,
   its --status-page). Workers that left are listed only with all. job: "" for every
   worker, else only job `job`'s: the ranks of the launches (pools) of an online job that
   have not left it, or the worker running an offline job; an unknown job is an error.
   "jobs": no fields. */
typedef struct tide_proto_status {
    int32_t from;                      /* "from": first worker id of the page, [0, INT32_MAX] */
    uint32_t limit;                    /* "limit": [0, 65536] rows */
    int all;                           /* "all": bool, list workers that left too */
    char job[TIDE_PROTO_NAME_MAX + 1]; /* "job": "" or a job name */
} tide_proto_status_t;

/* One GPU (worker) row of a status reply. */
typedef struct tide_proto_gpu_row {
    int32_t worker;                        /* "worker" */
    char host[TIDE_PROTO_HOST_MAX + 1];    /* "host" */
    int32_t pid;                           /* "pid": its process on host, [0, INT32_MAX], 0
                                              when tided does not know it */
    char pool[TIDE_PROTO_NAME_MAX + 1];    /* "pool": its launch (register's pool), or "" */
    int32_t pool_rank;                     /* "pool_rank": its MPI rank in the pool */
    int device;                            /* "device" */
    tide_proto_device_kind_t kind;         /* "kind" */
    tide_proto_worker_state_t state;       /* "state" */
    uint64_t mem_bytes;                    /* "mem" */
    char job[TIDE_PROTO_NAME_MAX + 1];     /* "job": online job, "" when none */
    int stage, dp_rank, tp_rank;           /* "stage","dp_rank","tp_rank": -1 when none */
    uint64_t step;                         /* "step" */
    double bubble_pct;                     /* "bubble_pct": [0, 100], of recent intervals */
    char offline[TIDE_PROTO_NAME_MAX + 1]; /* "offline": offline job, "" when none */
    int64_t last_seen_ms;                  /* "last_seen_ms": wall clock of last heartbeat */
    char alloc[64]; /* "alloc": its launch's allocation, "slurm 12", "" when none (printable
                       ASCII, spaces allowed) */
} tide_proto_gpu_row_t;

/* "status_reply": "time_ms" (tided's wall clock), "rows" (array of row maps, ascending
   worker ids), "total" (rows of the whole listing now, every page together) and "next" (the
   `from` of the next page, -1 when this page ends the listing). Never cut silently: a
   listing longer than one reply comes in pages, each saying where the next one starts. */
typedef struct tide_proto_status_reply {
    int64_t time_ms;
    char ompi_server[TIDE_PROTO_TEXT_MAX + 1]; /* "ompi_server": the URI pools that join a
                                                  running job are launched with, "" if unset */
    tide_proto_gpu_row_t *rows;                /* owned */
    uint32_t n_rows; /* <= TIDE_PROTO_ROWS_MAX, <= total; >= 1 unless next is -1 */
    uint32_t total;  /* "total": [0, INT32_MAX] */
    int32_t next;    /* "next": [-1, INT32_MAX], above every row's worker id */
    double state_degraded_ms; /* "state_degraded_ms": how long tided has been unable to write
                                 its state file (degraded: it decides in memory and refuses
                                 operators' changes); 0, left out: it can */
} tide_proto_status_reply_t;

/* One job row of a jobs reply. Online-only fields are 0 for offline jobs and vice versa. */
typedef struct tide_proto_job_row {
    char name[TIDE_PROTO_NAME_MAX + 1]; /* "name" */
    tide_proto_job_kind_t kind;         /* "kind" */
    tide_proto_job_state_t state;       /* "state" */
    uint64_t gen;                       /* "gen" */
    int dp, tp, pp;                     /* "dp","tp","pp": [0, 65536] (0 for offline) */
    uint32_t workers;                   /* "workers": workers held */
    uint64_t step;                      /* "step" */
    double throughput;                  /* "throughput": steps/s, >= 0 */
    int priority;                       /* "priority": [-1000, 1000] */
    uint32_t attempts;                  /* "attempts" */
    int32_t min_gpus, max_gpus;         /* "min","max" (optional, online): elastic bounds in
                                           GPUs, 0 when the job has none */
    int32_t hold;                       /* "hold" (optional, online): why the policy leaves it
                                           alone: 0 free, 1 pinned, 2 an operator's resize */
    char allocs[TIDE_PROTO_TEXT_MAX + 1]; /* "allocs": the scheduler allocations its launches
                                             run in and those it waits for ("slurm 12 h[1-2];
                                             slurm 14 pending (Resources)"), "" when none */
} tide_proto_job_row_t;

/* "jobs_reply": "rows" (array of job row maps). */
typedef struct tide_proto_jobs_reply {
    tide_proto_job_row_t *rows; /* owned */
    uint32_t n_rows;            /* <= TIDE_PROTO_ROWS_MAX */
} tide_proto_jobs_reply_t;

/*
 * "resize" tidectl -> tided. stages: empty (tided splits layers evenly) or pp + 1
 * boundaries (stages[0] = 0, strictly increasing; tided checks the last = layers).
 */
typedef struct tide_proto_resize {
    char job[TIDE_PROTO_NAME_MAX + 1]; /* "job" */
    int dp, tp, pp;                    /* "dp","tp","pp" */
    int *stage_start;                  /* "stages": owned */
    uint32_t n_stages;                 /* 0 or pp + 1 */
    int dry_run;                       /* "dry_run": bool */
    tide_proto_placement_t placement;  /* "placement": "default" | "optimal" */
    int tp_across_hosts;               /* "tp_across_hosts": bool, the job allows TP groups
                                          to span hosts */
    int micro_batches;                 /* "micro": micro-batches per step of each dp rank in the
                                          new layout, [0, TIDE_PROTO_MICRO_MAX]; 0: the job's */
} tide_proto_resize_t;

/*
 * "resize_reply" tided -> tidectl: the planned (dry run) or started resize, with the
 * reshard plan summary from reshard/'s tide_plan_summary.
 */
typedef struct tide_proto_resize_reply {
    char job[TIDE_PROTO_NAME_MAX + 1]; /* "job" */
    int dry_run;                       /* "dry_run": bool */
    tide_proto_layout_t layout;        /* "layout": the new layout (gen = new generation) */
    uint64_t bytes_sent;               /* "bytes_sent": over the network, bytes */
    uint64_t bytes_local;              /* "bytes_local": copied on-device, bytes */
    uint64_t max_send;                 /* "max_send": largest per-worker send, bytes */
    uint64_t messages;                 /* "messages": (src, dst) pairs */
    double est_ms;                     /* "est_ms": estimated switch time, ms */
    uint32_t preempted;                /* "preempted": offline jobs preempted (or to be) */
    uint64_t bytes_default;      /* "bytes_default": bytes_sent under the plain rank order over the
                                    same kind of workers (for comparing placements), bytes */
    uint64_t cross_host;         /* "cross_host": part of bytes_sent between workers on
                                    different hosts (as registered), bytes */
    uint64_t cross_host_default; /* "cross_host_default": the same under the rank order */
} tide_proto_resize_reply_t;

/* "submit" tidectl -> tided: queue an offline job (same argv/plugin rules as assign). */
typedef struct tide_proto_submit {
    char name[TIDE_PROTO_NAME_MAX + 1];   /* "name" */
    tide_proto_job_kind_t kind;           /* "kind": "command" | "plugin" */
    char plugin[TIDE_PROTO_NAME_MAX + 1]; /* "plugin" */
    char **argv;                          /* "argv": owned */
    uint32_t argc;
    int priority;     /* "priority": [-1000, 1000] */
    uint64_t mem_cap; /* "mem_cap": bytes, 0 = no cap */
    int bubbles;      /* "bubbles": bool */
    uint64_t max_memory; /* "max_memory": host memory per attempt, bytes; 0 (left out, as
                            older tidectl sends it): tided's --offline-max-memory */
    uint32_t max_procs;  /* "max_procs": processes per attempt; 0 (left out): tided's
                            --offline-max-procs */
} tide_proto_submit_t;

/* "cancel" tidectl -> tided: cancel a job (offline: stop it; online: refused by policy). */
typedef struct tide_proto_cancel {
    char job[TIDE_PROTO_NAME_MAX + 1]; /* "job" */
} tide_proto_cancel_t;

/* "checkpoint" tidectl -> tided: have online job `job` save a checkpoint under root `dir`
   ("" : the root its last reported checkpoint lies under) at a step its members have not
   reached yet (tided's "ok" names the step; "checkpoint_saved" follows in the events). */
typedef struct tide_proto_checkpoint {
    char job[TIDE_PROTO_NAME_MAX + 1]; /* "job" */
    char dir[TIDE_PROTO_TEXT_MAX + 1]; /* "dir": absolute, or "" */
} tide_proto_checkpoint_t;

/* "grow" tidectl -> tided: ask tided's provider of nodes (Slurm) for `nodes` more nodes for
   online job `job`; their launches join the job when the scheduler starts them. */
typedef struct tide_proto_grow {
    char job[TIDE_PROTO_NAME_MAX + 1]; /* "job" */
    int nodes;                         /* "nodes": [1, 4096] */
} tide_proto_grow_t;

/* "drain" tidectl -> tided: move work off a worker and give it no more. */
typedef struct tide_proto_drain {
    int32_t worker; /* "worker" */
} tide_proto_drain_t;

/*
 * "elastic" tidectl -> tided: change an online job's elastic declaration (coordinator/
 * elastic.h): its bounds (min_gpus..max_gpus, both 0: unchanged), its priority (-1:
 * unchanged), its pin (1 pin, 0 unpin, -1 unchanged) and the steps it will run in all
 * (for the policy's gain estimate; -1: unchanged, 0: unknown).
 */
typedef struct tide_proto_elastic {
    char job[TIDE_PROTO_NAME_MAX + 1]; /* "job" */
    int32_t min_gpus;                  /* "min": [0, 2^20] */
    int32_t max_gpus;                  /* "max": [0, 2^20] */
    int32_t priority;                  /* "priority": [-1, 100] */
    int32_t pin;                       /* "pin": [-1, 1] */
    int64_t steps;                     /* "steps": [-1, INT64_MAX] */
} tide_proto_elastic_t;

/*
 * "events" tidectl -> tided: the events with id > since_id, since_ms <= time < until_ms
 * (until_ms 0: no end), of job `job` ("": any) and of a kind matching `kind` ("": any; a
 * glob: "resize*", "offline_?ailed"). newest = 1: the newest `limit` of them, newest first;
 * 0: the oldest `limit`, oldest first (a cursor: since_id = the last id seen).
 */
typedef struct tide_proto_events {
    uint64_t since_id;                  /* "since_id" */
    int64_t since_ms;                   /* "since_ms": >= 0 */
    int64_t until_ms;                   /* "until_ms": >= 0, 0 = no end */
    uint32_t limit;                     /* "limit": [1, 10000] */
    char job[TIDE_PROTO_NAME_MAX + 1];  /* "job": "" for every job */
    char kind[TIDE_PROTO_NAME_MAX + 1]; /* "kind": [A-Za-z0-9._:*?-], "" for every kind */
    int newest;                         /* "newest": bool */
} tide_proto_events_t;

#define TIDE_PROTO_REASON_MAX 255 /* chars of an event's reason */

/*
 * An event's typed fields besides its sentence (each 0, -1 or "" when it does not apply):
 * what a tool draws or filters on. For a layout (layout, resized, recovered, rolled_back,
 * resize_started, recovery_started) workers is the new layout's map in coordinate order
 * (index ((p * dp) + d) * tp + t) and dp/tp/pp its degrees, from_* the layout before; for
 * an event about workers (worker_failed, offline_assigned, preempted, ...) the workers
 * concerned, the first one's host in host. Also a record ("event_fields"): tided's state
 * file keeps it beside the event's row.
 */
typedef struct tide_proto_event_fields {
    uint64_t gen;                           /* "gen": the generation concerned, 0: none */
    int dp, tp, pp;                         /* "dp","tp","pp": the layout after, 0: none */
    int from_dp, from_tp, from_pp;          /* "from_dp",...: the layout before, 0: none */
    int32_t *workers;                       /* "workers": owned, ids >= 0 */
    uint32_t n_workers;                     /* <= TIDE_PROTO_WORKERS_MAX */
    char host[TIDE_PROTO_HOST_MAX + 1];     /* "host": "" for none */
    int64_t step;                           /* "step": the switch/checkpoint step, -1: none */
    int64_t steps_lost;                     /* "steps_lost": >= 0 */
    uint64_t bytes;                         /* "bytes": state moved */
    double ms;                              /* "ms": how long it took (downtime), 0: none */
    double downtime_ms; /* "downtime_ms" (optional, 0 when absent): a committed switch's
                           longest worker switch, the training time it cost, ms */
    int bubbles;                            /* "bubbles": bool, offline work in bubbles */
    char reason[TIDE_PROTO_REASON_MAX + 1]; /* "reason": one line, "" for none */
} tide_proto_event_fields_t;

typedef struct tide_proto_event_row {
    uint64_t id;                          /* "id": increasing */
    int64_t time_ms;                      /* "time_ms" */
    char job[TIDE_PROTO_NAME_MAX + 1];    /* "job": "" for cluster events */
    char kind[TIDE_PROTO_NAME_MAX + 1];   /* "kind": like a job name ("resize", "worker_failed") */
    char detail[TIDE_PROTO_TEXT_MAX + 1]; /* "detail" */
    tide_proto_event_fields_t fields;     /* "fields" */
} tide_proto_event_row_t;

/* "events_reply": "rows" (array of event row maps). */
typedef struct tide_proto_events_reply {
    tide_proto_event_row_t *rows; /* owned */
    uint32_t n_rows;              /* <= TIDE_PROTO_EVENTS_MAX */
} tide_proto_events_reply_t;

/* "logs" tidectl -> tided: offline job `job`'s attempts as their workers reported them
 * (attempt 0: the latest TIDE_PROTO_ATTEMPTS_MAX). */
typedef struct tide_proto_logs {
    char job[TIDE_PROTO_NAME_MAX + 1]; /* "job" */
    uint32_t attempt;                  /* "attempt": 0 = all, else that one */
} tide_proto_logs_t;

typedef struct tide_proto_attempt_row {
    uint32_t attempt;                   /* "attempt" */
    int32_t worker;                     /* "worker" */
    char host[TIDE_PROTO_HOST_MAX + 1]; /* "host": the worker's host, where log lies */
    char log[TIDE_PROTO_TEXT_MAX + 1];  /* "log": the output file's path there, "" when none */
    tide_proto_job_state_t state;       /* "state": as last reported (running: no end yet) */
    int exit_code;                      /* "exit_code": [-255, 255] */
    int64_t time_ms;                    /* "time_ms": wall clock of the last report */
    char tail[TIDE_PROTO_TAIL_MAX + 1]; /* "tail": the output's last bytes at the end */
} tide_proto_attempt_row_t;

/*
 * An offline attempt's output file: DIR/JOB.ATTEMPT.PID.log on the worker's host. The
 * worker writes it (tide_proto_attempt_log_path) and reports the path; tided keeps only a
 * path of that form for the job and attempt reported (tide_proto_attempt_log_ok), and
 * tidectl reads only such a path: a worker-role client cannot make an operator's tidectl
 * print another file. Both are pure; any thread.
 */
/* Writes DIR/JOB.ATTEMPT.PID.log into out (size n); TIDE_ERR_RANGE when it does not fit. */
tide_status tide_proto_attempt_log_path(char *out, size_t n, const char *dir, const char *job,
                                        uint32_t attempt, int pid);
/* 1 when path is absolute, has no "." or ".." component, and its last component is
   JOB.ATTEMPT.PID.log for this job and attempt (PID: decimal digits); else 0. */
int tide_proto_attempt_log_ok(const char *path, const char *job, uint32_t attempt);

/* "logs_reply" tided -> tidectl: "job", "rows" (array of attempt rows, oldest first). */
typedef struct tide_proto_logs_reply {
    char job[TIDE_PROTO_NAME_MAX + 1]; /* "job" */
    tide_proto_attempt_row_t *rows;    /* owned */
    uint32_t n_rows;                   /* <= TIDE_PROTO_ATTEMPTS_MAX */
} tide_proto_logs_reply_t;

/* "ok" tided -> anyone: a request succeeded. */
typedef struct tide_proto_ok {
    char job[TIDE_PROTO_NAME_MAX + 1];     /* "job": the job concerned, "" when none */
    char message[TIDE_PROTO_TEXT_MAX + 1]; /* "message": for humans, may be "" */
    uint64_t gen; /* "gen" (optional, 0 when absent): the generation of the switch the
                     request started (drain, bounds...), for tidectl --wait */
} tide_proto_ok_t;

/* "error" tided -> anyone: a request was refused. */
typedef struct tide_proto_error {
    int code;                              /* "code": a tide_status, [-1000, -1] */
    char message[TIDE_PROTO_TEXT_MAX + 1]; /* "message": says what to do */
} tide_proto_error_t;

/* ---- records: what reaches a disk (their structs need the shared ones above) ---------- */

#include "proto/proto_record.h"

/* ---- the tagged union ---------------------------------------------------------------------- */

/* X(ENUM, "wire name", union member or none) -- the message catalogue. */
#define TIDE_MSG_TYPE_MAP(X)                                                                       \
    X(REGISTER, "register", reg)                                                                   \
    X(REGISTER_OK, "register_ok", register_ok)                                                     \
    X(HEARTBEAT, "heartbeat", heartbeat)                                                           \
    X(HOST_HEARTBEAT, "host_heartbeat", host_heartbeat)                                            \
    X(BYE, "bye", bye)                                                                             \
    X(JOIN, "join", join)                                                                          \
    X(LAYOUT, "layout", layout)                                                                    \
    X(JOIN_PORT, "join_port", join_port)                                                           \
    X(JOB_END, "job_end", job_end)                                                                 \
    X(RELEASE, "release", release)                                                                 \
    X(PREPARE, "prepare", prepare)                                                                 \
    X(PREPARE_ACK, "prepare_ack", prepare_ack)                                                     \
    X(COMMIT, "commit", commit)                                                                    \
    X(ABORT, "abort", abort_)                                                                      \
    X(HALT, "halt", halt)                                                                          \
    X(SAVE, "save", save)                                                                          \
    X(SAVED, "saved", saved)                                                                       \
    X(DONE, "done", done)                                                                          \
    X(FENCED, "fenced", fenced)                                                                    \
    X(LIVENESS, "liveness", liveness)                                                              \
    X(LIVENESS_REPLY, "liveness_reply", liveness_reply)                                            \
    X(FAILURE, "failure", failure)                                                                 \
    X(LEAVE, "leave", leave)                                                                       \
    X(OFFLINE_ASSIGN, "offline_assign", offline_assign)                                            \
    X(PREEMPT, "preempt", preempt)                                                                 \
    X(OFFLINE_STATUS, "offline_status", offline_status)                                            \
    X(BUBBLE, "bubble", bubble)                                                                    \
    X(STATUS, "status", status)                                                                    \
    X(STATUS_REPLY, "status_reply", status_reply)                                                  \
    X(JOBS, "jobs", jobs)                                                                          \
    X(JOBS_REPLY, "jobs_reply", jobs_reply)                                                        \
    X(RESIZE, "resize", resize)                                                                    \
    X(RESIZE_REPLY, "resize_reply", resize_reply)                                                  \
    X(SUBMIT, "submit", submit)                                                                    \
    X(CANCEL, "cancel", cancel)                                                                    \
    X(DRAIN, "drain", drain)                                                                       \
    X(ELASTIC, "elastic", elastic)                                                                 \
    X(GROW, "grow", grow)                                                                          \
    X(CHECKPOINT, "checkpoint", checkpoint)                                                        \
    X(EVENTS, "events", events)                                                                    \
    X(EVENTS_REPLY, "events_reply", events_reply)                                                  \
    X(LOGS, "logs", logs)                                                                          \
    X(LOGS_REPLY, "logs_reply", logs_reply)                                                        \
    X(OK, "ok", ok)                                                                                \
    X(ERROR, "error", error)                                                                       \
    X(JOB_LAYOUT, "job_layout", job_layout)                                                        \
    X(JOB_POOLS, "job_pools", job_pools)                                                           \
    X(JOB_FIT, "job_fit", job_fit)                                                                 \
    X(JOB_CKPTS, "job_ckpts", job_ckpts)                                                           \
    X(JOB_ARGV, "job_argv", job_argv)                                                              \
    X(CKPT_MANIFEST, "ckpt_manifest", ckpt_manifest)                                               \
    X(CKPT_SUM, "ckpt_sum", ckpt_sum)                                                              \
    X(EVENT_FIELDS, "event_fields", event_fields)                                                  \
    X(SAVE_ACK, "save_ack", save_ack)

typedef enum tide_msg_type {
    TIDE_MSG_NONE = 0, /* a cleared message; never on the wire */
#define TIDE__MSG_ENUM(e, name, member) TIDE_MSG_##e,
    TIDE_MSG_TYPE_MAP(TIDE__MSG_ENUM)
#undef TIDE__MSG_ENUM
        TIDE_MSG__COUNT
} tide_msg_type_t;

/* Who may send a message type: tided enforces it against the sender's key role. */
typedef enum tide_msg_role {
    TIDE_ROLE_COORDINATOR = 0, /* only tided sends it (replies, layout, prepare, ...) */
    TIDE_ROLE_WORKER = 1,      /* a worker key may send it (register and reports) */
    TIDE_ROLE_ADMIN = 2,       /* an admin key may send it (tidectl requests that act) */
    TIDE_ROLE_READER = 3,      /* any known key, worker or admin: read-only cluster views
                                  (status, jobs) */
    TIDE_ROLE_RECORD = 4,      /* nobody: a record (stored, never sent); tided refuses it */
} tide_msg_role_t;

/* An empty struct for the field-less requests (jobs). */
typedef struct tide_proto_empty {
    char unused_;
} tide_proto_empty_t;

/*
 * One message. Arrays inside are owned by the message once decoded: tide_msg_clear
 * frees them with tide_free. A message built by hand for encoding may point at the
 * caller's arrays; then the caller must not tide_msg_clear it (or must have allocated
 * those arrays with tide_malloc/tide_strdup).
 */
typedef struct tide_msg {
    tide_msg_type_t type;
    union {
        tide_proto_register_t reg;
        tide_proto_register_ok_t register_ok;
        tide_proto_heartbeat_t heartbeat;
        tide_proto_host_heartbeat_t host_heartbeat;
        tide_proto_bye_t bye;
        tide_proto_join_t join;
        tide_proto_layout_msg_t layout;
        tide_proto_join_port_t join_port;
        tide_proto_job_end_t job_end;
        tide_proto_release_t release;
        tide_proto_prepare_t prepare;
        tide_proto_prepare_ack_t prepare_ack;
        tide_proto_commit_t commit;
        tide_proto_abort_t abort_;
        tide_proto_halt_t halt;
        tide_proto_save_t save;
        tide_proto_saved_t saved;
        tide_proto_save_ack_t save_ack;
        tide_proto_done_t done;
        tide_proto_fenced_t fenced;
        tide_proto_liveness_t liveness;
        tide_proto_liveness_reply_t liveness_reply;
        tide_proto_failure_t failure;
        tide_proto_leave_t leave;
        tide_proto_offline_assign_t offline_assign;
        tide_proto_preempt_t preempt;
        tide_proto_offline_status_t offline_status;
        tide_proto_bubble_t bubble;
        tide_proto_status_t status;
        tide_proto_status_reply_t status_reply;
        tide_proto_empty_t jobs;
        tide_proto_jobs_reply_t jobs_reply;
        tide_proto_resize_t resize;
        tide_proto_resize_reply_t resize_reply;
        tide_proto_submit_t submit;
        tide_proto_cancel_t cancel;
        tide_proto_drain_t drain;
        tide_proto_elastic_t elastic;
        tide_proto_grow_t grow;
        tide_proto_checkpoint_t checkpoint;
        tide_proto_events_t events;
        tide_proto_events_reply_t events_reply;
        tide_proto_logs_t logs;
        tide_proto_logs_reply_t logs_reply;
        tide_proto_ok_t ok;
        tide_proto_error_t error;
        tide_proto_job_layout_t job_layout;
        tide_proto_job_pools_t job_pools;
        tide_proto_job_fit_t job_fit;
        tide_proto_job_ckpts_t job_ckpts;
        tide_proto_job_argv_t job_argv;
        tide_proto_ckpt_manifest_t ckpt_manifest;
        tide_proto_ckpt_sum_t ckpt_sum;
        tide_proto_event_fields_t event_fields;
    } u;
} tide_msg_t;

/* ---- byte buffer (caller-owned storage, msgpack sbuffer style) ------------------------------ */

typedef struct tide_proto_buf {
    uint8_t *data; /* len valid bytes; owned; grown with tide_realloc */
    size_t len;
    size_t cap;
} tide_proto_buf_t;

/* Makes buf empty with no storage; never fails. */
void tide_proto_buf_init(tide_proto_buf_t *buf);

/* Frees buf's storage and re-inits it; safe on an inited or destroyed buf. */
void tide_proto_buf_destroy(tide_proto_buf_t *buf);

/* Hands buf's bytes to the caller (free with tide_free) and re-inits buf. */
uint8_t *tide_proto_buf_release(tide_proto_buf_t *buf, size_t *len);

/* ---- messages ----------------------------------------------------------------------------- */

/* Zeroes msg and sets its type; never fails; msg owns nothing afterwards. */
void tide_msg_init(tide_msg_t *msg, tide_msg_type_t type);

/* Frees every array msg owns (tide_free) and re-inits it as TIDE_MSG_NONE; NULL is fine. */
void tide_msg_clear(tide_msg_t *msg);

/* Static wire name of type ("heartbeat"), "?" when out of range; any thread. */
const char *tide_msg_type_name(tide_msg_type_t type);

/* Parses a wire name into *out; TIDE_ERR_NOT_FOUND when unknown; any thread. */
tide_status tide_msg_type_parse(const char *name, tide_msg_type_t *out);

/* Who may send type; tided checks a request's role before acting on it. */
tide_msg_role_t tide_msg_type_role(tide_msg_type_t type);

/*
 * Checks msg against every rule decode enforces (ranges, lengths, array sizes,
 * layout shape). TIDE_ERR_INVALID with a detail like decode's; any thread.
 */
tide_status tide_msg_validate(const tide_msg_t *msg);

/*
 * Encodes msg into buf: buf's previous contents are replaced by exactly one
 * message. Validates first (TIDE_ERR_INVALID + detail, buf emptied). Allocation
 * failure: TIDE_ERR_NOMEM. Never blocks; any thread on distinct bufs.
 */
tide_status tide_proto_encode(const tide_msg_t *msg, tide_proto_buf_t *buf);

/*
 * Decodes exactly one message from data[0, len) into *out (which need not be
 * initialised; any previous content is NOT freed). On success the caller owns
 * out's arrays (tide_msg_clear). On failure *out holds nothing to free
 * (TIDE_MSG_NONE) and the detail says what was wrong: TIDE_ERR_PROTOCOL for bad
 * input, TIDE_ERR_NOMEM for allocation failure. Any thread.
 */
tide_status tide_proto_decode(const void *data, size_t len, tide_msg_t *out);

/*
 * tide_proto_encode for a record (a type of role TIDE_ROLE_RECORD; else TIDE_ERR_INVALID),
 * whose limit is TIDE_PROTO_RECORD_MAX_BYTES instead of TIDE_PROTO_MAX_MSG_BYTES. Any thread.
 */
tide_status tide_proto_encode_record(const tide_msg_t *msg, tide_proto_buf_t *buf);

/*
 * tide_proto_decode for a record read back from a disk: up to TIDE_PROTO_RECORD_MAX_BYTES,
 * and it must be of `type` (a record type), else TIDE_ERR_PROTOCOL naming what it holds.
 * Ownership and failures as tide_proto_decode. Any thread.
 */
tide_status tide_proto_decode_record(const void *data, size_t len, tide_msg_type_t type,
                                     tide_msg_t *out);

/*
 * Brings a "join" message stored by a tided from before joins carried "fit" (a state
 * file's first join of a job) to the current schema: the same map with "fit": [] (no
 * rules, as then) added; one that has "fit" is copied unchanged. The result must then
 * decode (tide_proto_decode), else TIDE_ERR_PROTOCOL with its reason: nothing but the
 * missing field is forgiven. *out is tide_malloc'd (caller frees). Any thread.
 */
tide_status tide_proto_join_upgrade(const void *data, size_t len, uint8_t **out, size_t *out_len);

/* ---- enum names (wire strings), "?" when out of range ------------------------------------- */

const char *tide_proto_device_kind_name(tide_proto_device_kind_t v);
const char *tide_proto_worker_state_name(tide_proto_worker_state_t v);
const char *tide_proto_job_kind_name(tide_proto_job_kind_t v);
const char *tide_proto_job_state_name(tide_proto_job_state_t v);
const char *tide_proto_placement_name(tide_proto_placement_t v);

/* Parses the wire strings above; TIDE_ERR_NOT_FOUND when unknown; any thread. */
tide_status tide_proto_placement_parse(const char *s, tide_proto_placement_t *out);

#ifdef __cplusplus
}
#endif

#endif /* TIDE_PROTO_H */
