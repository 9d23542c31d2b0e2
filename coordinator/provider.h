/*
 * coordinator/provider: where an online job's nodes come from. tided grows a job by
 * asking a provider for more nodes; the provider's scheduler starts the job's launch
 * command there, and its pools join the job like any launch (join.c). A provider is a
 * versioned table of functions (tide_provider_v1) over an object of its own:
 *   - "none" (tided's default): nodes come only from launches an operator starts; a grow
 *     is refused with what to do instead;
 *   - "slurm" (slurm.c): a grow submits the job's batch script again (sbatch), watches the
 *     allocation until it starts or Slurm refuses it, and cancels what an ended job still
 *     waits for.
 * Every member is called on tided's loop thread and never blocks: a provider that talks
 * to its scheduler does it through child processes (child.h) that tick() polls. What it
 * learns comes back as events through the sink given at creation.
 */
#ifndef TIDE_COORD_PROVIDER_H
#define TIDE_COORD_PROVIDER_H

#include <stddef.h>
#include <stdint.h>

#include <tide/status.h>

#ifdef __cplusplus
extern "C" {
#endif

#define TIDE_ALLOC_ID_MAX 32 /* bytes of a scheduler's allocation id, NUL included */

/* Where a provider's findings go: an event of kind `kind` about online job `job` (detail
 * is one line). Called on the loop thread, from inside a provider call. */
typedef void (*tide_provider_event_fn)(void *ctx, const char *job, const char *kind,
                                       const char *detail);

typedef struct tide_provider_v1 {
    const char *name; /* "none", "slurm" */

    /* Asks for `nodes` more nodes for online job `job`, launched as the job's allocation
     * `alloc` was (its id with the scheduler: the same script, folder and partition).
     * Returns at once: TIDE_OK once asked (the outcome arrives as events), TIDE_ERR_BUSY
     * while an earlier request for the job has not started, TIDE_ERR_UNSUPPORTED for the
     * "none" provider, TIDE_ERR_INVALID for a bad count; why (len bytes) says what was
     * done or why not, for the requester. */
    tide_status (*grow)(void *self, const char *job, const char *alloc, int nodes, char *why,
                        size_t len);

    /* Allocation `alloc` of job `job` is giving its nodes back to the scheduler ahead of
     * losing them (a preemption or time limit with a grace signal): watch it, and say with
     * events when it waits and when it starts again. */
    void (*watch)(void *self, const char *job, const char *alloc);

    /* Online job `job` ended: cancel every allocation requested for it that has not
     * started. */
    void (*job_ended)(void *self, const char *job);

    /* Writes one line about job's allocations the provider is waiting for ("slurm 14
     * pending (Resources)"), "" when none. */
    void (*describe)(void *self, const char *job, char *out, size_t len);

    /* Polls child processes and timers at monotonic time now_ns. */
    void (*tick)(void *self, uint64_t now_ns);

    /* Stops what still runs (children killed) and frees self. */
    void (*destroy)(void *self);
} tide_provider_v1;

/* A provider: its table and its object. */
typedef struct tide_provider {
    const tide_provider_v1 *ops;
    void *self;
} tide_provider_t;

/* Settings of the Slurm provider (tided's --slurm-* flags). */
typedef struct tide_slurm_config {
    char bin[1024];      /* folder of sbatch, scontrol, squeue, scancel; "" for PATH */
    uint64_t poll_ms;    /* how often squeue is asked about allocations waited for */
    uint64_t pending_ms; /* a requested allocation still pending after this long is
                            cancelled (0: it waits as long as Slurm keeps it) */
    uint64_t cmd_ms;     /* deadline of one Slurm command */
} tide_slurm_config;

/* The "none" provider. Never fails. */
void tide_provider_none(tide_provider_t *out);

/* The Slurm provider with cfg (copied); events go to sink(ctx, ...). Caller destroys it
 * with out->ops->destroy(out->self). TIDE_ERR_NOMEM. */
tide_status tide_provider_slurm(tide_provider_t *out, const tide_slurm_config *cfg,
                                tide_provider_event_fn sink, void *ctx);

/* Parses tided's --provider value ("none" or "slurm") into *slurm (0 or 1); TIDE_ERR_INVALID
 * naming the choices otherwise. */
tide_status tide_provider_parse(const char *text, int *slurm);

/* ---- Slurm's text (pure; slurm.c uses them, tests call them) ----------------------------- */

/* The value of key in `scontrol show job -o` output (one line of Key=Value pairs; a value
 * runs to the next " Key=") into out (len bytes); TIDE_ERR_NOT_FOUND when absent,
 * TIDE_ERR_RANGE when it does not fit. "(null)" counts as absent. */
tide_status tide_slurm_field(const char *line, const char *key, char *out, size_t len);

/* The job id sbatch --parsable printed ("123" or "123;cluster") into out; TIDE_ERR_PROTOCOL
 * when the output is no id. */
tide_status tide_slurm_parsable_id(const char *text, char *out, size_t len);

/* 1 when a pending job's Slurm reason means it can never start as asked (a partition or
 * association limit, a node count the partition cannot hold), 0 when it waits for nodes,
 * priority or time. */
int tide_slurm_reason_fatal(const char *reason);

/* 1 when id is a Slurm job id as tided accepts one (1..31 chars of [0-9_]). */
int tide_slurm_id_ok(const char *id);

#ifdef __cplusplus
}
#endif

#endif /* TIDE_COORD_PROVIDER_H */
