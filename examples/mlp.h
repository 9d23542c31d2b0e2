/*
 * tide_mlp: the model of examples/train_mlp, a Megatron-style stack of MLP blocks
 * (embedding, L x [layernorm, fc1 column-parallel, GeLU, fc2 row-parallel, residual],
 * final layernorm, head, softmax cross-entropy) trained with Adam on a deterministic
 * synthetic task, in any (dp, tp, pp) layout with a 1F1B pipeline schedule.
 *
 * Workload: small to medium models (a few MiB to a few GiB of state), f32, one
 * process per device, one step at a time from the main thread. The state (parameters,
 * Adam moments, step counter, data cursor) lives in one buffer per collection tensor in
 * exactly the shard geometry of reshard/reshard.h, so libtide can reshard it live.
 * Communication goes through tide_mlp_comm (a table of blocking callbacks), so the same
 * model runs on plain MPI (mlp_mpi.h) and on libtide's communicators (mlp_tide.h).
 *
 * Determinism: parameters are a pure function of (seed, tensor name, global element
 * index) and sample k of the data stream a pure function of (seed, k), so the global
 * batch, its sample order and the initial model are the same in every layout; losses
 * of different layouts agree up to f32 reduction order.
 */
#ifndef TIDE_EXAMPLES_MLP_H
#define TIDE_EXAMPLES_MLP_H

#include <stddef.h>
#include <stdint.h>

#include <tide/status.h>

#include "reshard/reshard.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Model size, task and optimiser settings; identical on every rank of a job. */
typedef struct tide_mlp_config {
    int layers;                   /* MLP blocks */
    int64_t hidden;               /* model width */
    int64_t ffn;                  /* fc1 output width */
    int64_t vocab;                /* tokens; embedding and head rows */
    int64_t seq;                  /* tokens per sample */
    int64_t global_batch;         /* samples per step over all dp ranks */
    uint64_t seed;                /* parameters, task rule and data stream */
    double lr, beta1, beta2, eps; /* Adam */
    int zero1;                    /* 1: Adam moments DP-sharded (ZeRO-1) */
} tide_mlp_config;

/* Fills cfg with the default small model (4 x 64/256, vocab 64, seq 16, batch 32). */
void tide_mlp_config_default(tide_mlp_config *cfg);

/* Checks sizes and ranges; TIDE_ERR_INVALID with the offending field otherwise. */
tide_status tide_mlp_config_check(const tide_mlp_config *cfg);

/*
 * The job's tensor collection, in this order: for every parameter P (model order:
 * "embed.weight", per block i "layer.i.ln2.{weight,bias}", "layer.i.fc1.{weight,bias}",
 * "layer.i.fc2.{weight,bias}", then "final_ln.{weight,bias}", "head.weight") the three
 * tensors P, "P.exp_avg", "P.exp_avg_sq"; then "step" and "data.cursor" (i64 [1], ALL,
 * replicated). Names and rules follow tide_collection_build_gpt(attention = 0), with
 * these rules spelled out: embed.weight [vocab, hidden] and head.weight [vocab, hidden]
 * split along vocab (dim 0); fc1.weight [ffn, hidden] and fc1.bias split along dim 0;
 * fc2.weight [hidden, ffn] split along dim 1; layernorms and fc2.bias replicated.
 * Moments follow their parameter, DP-sharded when cfg->zero1. Caller owns *out.
 */
tide_status tide_mlp_collection_new(const tide_mlp_config *cfg, tide_collection_t **out);

/* Where the compute runs. */
typedef enum tide_mlp_device {
    TIDE_MLP_CPU = 0,  /* host memory, plain C or OpenBLAS */
    TIDE_MLP_CUDA = 1, /* device memory of the current CUDA device, cuBLAS + kernels */
} tide_mlp_device;

/* Parses "cpu" / "cuda"; TIDE_ERR_INVALID otherwise. */
tide_status tide_mlp_device_parse(const char *text, tide_mlp_device *out);

/* True when this build has the CUDA path (built with TIDE_HAVE_CUDA). */
int tide_mlp_have_cuda(void);

/* Makes device number local_index modulo the devices present current for the calling
 * thread (CUDA), so that the ranks of one host spread over its GPUs; no-op for the CPU.
 * TIDE_ERR_NO_DEVICE when CUDA has no device. */
tide_status tide_mlp_select_device(tide_mlp_device device, int local_index);

/* ---- communication ------------------------------------------------------------------ */

typedef enum tide_mlp_group {
    TIDE_MLP_GROUP_TP = 0, /* same (pp, dp) coordinate: the tensor-parallel peers */
    TIDE_MLP_GROUP_DP = 1, /* same (pp, tp): the data-parallel replicas */
    TIDE_MLP_GROUP_PP = 2, /* same (dp, tp): one rank per stage */
} tide_mlp_group;

typedef enum tide_mlp_redop {
    TIDE_MLP_SUM = 0,
    TIDE_MLP_MAX = 1,
} tide_mlp_redop;

/*
 * The communication the model needs, as blocking callbacks that return 0 or a
 * tide_status. Buffers are in host memory unless device_memory is 1 (then they are in
 * the model's device memory; a host-only backend leaves it 0 and the model stages).
 * Every member of a group calls the same collectives in the same order; results must
 * be identical on every member. The model never calls a collective for a group of
 * size 1. Main thread only.
 */
/* Points inside tide_mlp_step (tide_mlp_comm.at). */
typedef enum tide_mlp_point {
    TIDE_MLP_AT_GRADS = 0, /* after the backward pass, before the gradient allreduce */
    TIDE_MLP_AT_LOSS = 1,  /* after the loss reduction over dp, before those over pp, tp */
} tide_mlp_point;

typedef struct tide_mlp_comm {
    void *ctx;
    int device_memory;
    /* In place over group: n elements of dtype (TIDE_F32 or TIDE_F64). */
    tide_status (*allreduce)(void *ctx, tide_mlp_group group, void *buf, size_t n, tide_dtype dtype,
                             tide_mlp_redop op);
    /*
     * Sends send_n floats to pipeline neighbour send_peer and receives recv_n floats
     * from recv_peer at the same time (peer: +1 next stage, -1 previous stage, 0 no
     * transfer on that side); returns when both are complete. Same dp and tp rank.
     */
    tide_status (*exchange)(void *ctx, int send_peer, const float *send_buf, size_t send_n,
                            int recv_peer, float *recv_buf, size_t recv_n);
    /* Optional (NULL: none): called by tide_mlp_step at the points of tide_mlp_point,
       with the number of steps completed before this one; an error fails the step
       there. Tests use it to kill a worker mid-step. */
    tide_status (*at)(void *ctx, int64_t step, tide_mlp_point point);
    /* Optional (NULL: none): called by tide_mlp_step once this worker's update needs no
       peer any more (its gradient allreduce is done and ZeRO-1 does not share the
       update): from then on tide_mlp_finish_step can complete the step alone. */
    void (*can_finish)(void *ctx);
} tide_mlp_comm;

/* A comm for a layout of one worker (dp = tp = pp = 1): every call is an error. */
void tide_mlp_comm_self(tide_mlp_comm *out);

/* ---- the model ------------------------------------------------------------------------ */

typedef struct tide_mlp tide_mlp_t;

/*
 * Creates worker's part of the model under layout l (validated against the collection:
 * tp must divide vocab and ffn, dp * micro_batches must divide global_batch) with every
 * local buffer zero-filled; call tide_mlp_init or load a state next. A worker that is
 * not in l holds nothing (idle) until tide_mlp_adopt gives it a coordinate. Copies l.
 * For TIDE_MLP_CUDA the current CUDA device is used. Caller owns *out.
 */
tide_status tide_mlp_new(tide_mlp_t **out, const tide_mlp_config *cfg, const tide_layout_t *l,
                         int32_t worker, tide_mlp_device device);

/* Frees *self_p (buffers included) and sets it to NULL; NULL is fine. */
void tide_mlp_destroy(tide_mlp_t **self_p);

/* Writes the initial state (deterministic from cfg->seed) into the local buffers. */
tide_status tide_mlp_init(tide_mlp_t *m);

/* True when the worker holds a coordinate of the current layout. */
int tide_mlp_active(const tide_mlp_t *m);

/* The current layout (borrowed, valid until the next tide_mlp_adopt). */
const tide_layout_t *tide_mlp_layout(const tide_mlp_t *m);

/* This worker's coordinate; TIDE_ERR_NOT_FOUND when idle. */
tide_status tide_mlp_coord(const tide_mlp_t *m, int *p, int *d, int *t);

/* The collection (borrowed, lives as long as m). */
const tide_collection_t *tide_mlp_collection(const tide_mlp_t *m);

/* Steps completed so far (the "step" tensor). */
int64_t tide_mlp_step_count(const tide_mlp_t *m);

/*
 * One training step: the global batch of samples [step * B, (step + 1) * B) through the
 * 1F1B schedule, gradient allreduce over dp, the loss reduction over the whole layout,
 * Adam on the local shards. *loss receives the global mean loss of the batch before the
 * update, identical on every worker of the layout. The state changes only after every
 * collective of the step, so a step that fails on a collective (a peer died) left the
 * state as it was and may be redone; except under ZeRO-1 (sharded moments), whose
 * updated values are shared by one more allreduce after the update. Blocking and
 * collective over the layout; main thread.
 */
tide_status tide_mlp_step(tide_mlp_t *m, const tide_mlp_comm *comm, double *loss);

/*
 * Completes the step whose tide_mlp_step failed after comm->can_finish was called (in
 * its last reduction, a peer having died): applies the update from the summed gradients
 * it kept, without any collective. TIDE_ERR_INVALID when there is no such step.
 * Blocking; main thread.
 */
tide_status tide_mlp_finish_step(tide_mlp_t *m);

/*
 * Forward and backward of the current step's batch without reducing or applying the
 * gradients (for checks): afterwards tide_mlp_read_grad gives this worker's local
 * gradient sums. *loss as for tide_mlp_step (needs the dp/pp loss allreduce).
 */
tide_status tide_mlp_forward_backward(tide_mlp_t *m, const tide_mlp_comm *comm, double *loss);

/*
 * Local buffer of collection tensor i: its address (host or device memory, per the
 * device), or NULL with *bytes 0 when this worker does not hold it. Borrowed; valid
 * until tide_mlp_adopt or destroy. This is what libtide registers for resharding.
 */
void *tide_mlp_buffer(const tide_mlp_t *m, size_t i, uint64_t *bytes);

/* The table of local buffers, one per collection tensor (NULL where not held), in
 * collection order: what libtide's tide_set_buffers takes. Borrowed, like above. */
void *const *tide_mlp_buffers(const tide_mlp_t *m);

/* Copies local tensor i into host memory dst (bytes = tide_shard_bytes); any device. */
tide_status tide_mlp_read(const tide_mlp_t *m, size_t i, void *dst, uint64_t bytes);

/* Copies host memory src into local tensor i (bytes = tide_shard_bytes). */
tide_status tide_mlp_write(tide_mlp_t *m, size_t i, const void *src, uint64_t bytes);

/* Copies the local gradient of parameter tensor i (its tp shard, f32) into host dst. */
tide_status tide_mlp_read_grad(const tide_mlp_t *m, size_t i, float *dst, uint64_t bytes);

/*
 * Allocates zero-filled local buffers for worker's coordinate in new_l in the model's
 * memory space (NULL where not held); *bufs_out has tide_collection_size entries.
 * Free with tide_mlp_free_buffers unless handed to tide_mlp_adopt.
 */
tide_status tide_mlp_alloc_buffers(const tide_mlp_t *m, const tide_layout_t *new_l, int32_t worker,
                                   void ***bufs_out);

/* Frees buffers from tide_mlp_alloc_buffers and sets *bufs_p to NULL; NULL is fine. */
void tide_mlp_free_buffers(const tide_mlp_t *m, void ***bufs_p);

/*
 * Switches the model to new_l: frees the old local buffers and takes ownership of bufs
 * (from tide_mlp_alloc_buffers for the same layout and worker, already filled with the
 * state, for example by a reshard plan); *bufs_p becomes NULL. On failure the model is
 * unchanged and bufs stay the caller's.
 */
tide_status tide_mlp_adopt(tide_mlp_t *m, const tide_layout_t *new_l, int32_t worker,
                           void ***bufs_p);

/* The old big buffers (state, gradients, activations) of a model that adopted new ones. */
typedef struct tide_mlp_garbage tide_mlp_garbage;

/*
 * tide_mlp_adopt that does not free the old big buffers: *garbage gets them, to be
 * released later with tide_mlp_garbage_free (host memory: from any thread, e.g. while
 * the first step in the new layout runs; device memory: the main thread). Freeing GiBs
 * takes ~0.1 s, which a switch need not wait for. On failure *garbage is NULL.
 */
tide_status tide_mlp_adopt_defer(tide_mlp_t *m, const tide_layout_t *new_l, int32_t worker,
                                 void ***bufs_p, tide_mlp_garbage **garbage);

/*
 * Switches the model to new_l over buffers it does not own: bufs (a collection-sized
 * table, copied; NULL entries where not held, or bufs NULL on an idle worker) hold the
 * state and stay their owner's (libtide's, after tide_give_buffers), who must keep them
 * until the next adopt or destroy; the model never frees them. The old local buffers
 * are released unless they were borrowed too. On failure the model is unchanged.
 */
tide_status tide_mlp_adopt_borrowed(tide_mlp_t *m, const tide_layout_t *new_l, int32_t worker,
                                    void *const *bufs);

/* Releases what tide_mlp_adopt_defer kept; sets *g_p to NULL; NULL is fine. */
void tide_mlp_garbage_free(tide_mlp_garbage **g_p);

#ifdef __cplusplus
}
#endif

#endif /* TIDE_EXAMPLES_MLP_H */
