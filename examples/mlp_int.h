/*
 * Internals of the train_mlp model: the compute backend table (host C/OpenBLAS and
 * CUDA/cuBLAS implement the same kernels), the model structure, the per-piece forward
 * and backward functions (embedding, one MLP block shard, final layernorm + head +
 * vocab-parallel cross-entropy) that the schedule in mlp_schedule.c strings together,
 * and the synthetic data stream. Only examples/ and its tests include this.
 *
 * All matrices are dense row-major f32; sizes in elements unless marked bytes.
 */
#ifndef TIDE_EXAMPLES_MLP_INT_H
#define TIDE_EXAMPLES_MLP_INT_H

#include <stddef.h>
#include <stdint.h>

#include "examples/mlp.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- compute backend ---------------------------------------------------------------- */

typedef enum mlp_copy_kind {
    MLP_H2D = 0, /* host to backend memory */
    MLP_D2H = 1, /* backend memory to host */
    MLP_D2D = 2, /* within backend memory */
} mlp_copy_kind;

/*
 * One compute backend. Every pointer argument is backend memory unless named host.
 * Calls are ordered (a CUDA backend runs them on one stream); results are visible to
 * the host after copy(MLP_D2H) or sync. Main thread only.
 */
typedef struct mlp_ops {
    tide_mlp_device device;
    const char *name;
    tide_status (*alloc)(size_t bytes, void **out); /* zero-filled; NULL for bytes 0 */
    void (*release)(void *p);                       /* NULL is fine */
    tide_status (*zero)(void *p, size_t bytes);
    tide_status (*copy)(void *dst, const void *src, size_t bytes, mlp_copy_kind kind);
    tide_status (*sync)(void);
    /* C[m,n] = alpha * op(A) op(B) + beta * C; op(A) is [m,k], op(B) [k,n]; ta/tb: 1 =
     * the stored matrix is the transpose (A stored [k,m], B stored [n,k]). */
    tide_status (*gemm)(int ta, int tb, int64_t m, int64_t n, int64_t k, float alpha,
                        const float *a, const float *b, float beta, float *c);
    /* y = (x - mean) * rstd * w + b per row of [rows, h]; mean, rstd [rows] saved. */
    tide_status (*ln_fwd)(int64_t rows, int64_t h, const float *x, const float *w, const float *b,
                          float *y, float *mean, float *rstd);
    /* dx = d/dx (overwritten); dw += , db += (accumulated). */
    tide_status (*ln_bwd)(int64_t rows, int64_t h, const float *x, const float *w,
                          const float *mean, const float *rstd, const float *dy, float *dx,
                          float *dw, float *db);
    tide_status (*gelu_fwd)(int64_t n, const float *a, float *g);
    /* dg *= gelu'(a), in place. */
    tide_status (*gelu_bwd)(int64_t n, const float *a, float *dg);
    /* y[r, c] += b[c]. */
    tide_status (*bias_add)(int64_t rows, int64_t cols, float *y, const float *b);
    /* db[c] += sum_r dy[r, c]. */
    tide_status (*bias_grad)(int64_t rows, int64_t cols, const float *dy, float *db);
    /* y += x. */
    tide_status (*add)(int64_t n, float *y, const float *x);
    /* x[r] = table[tok[r] - lo] when lo <= tok[r] < lo + rows, else 0; x [n, h]. */
    tide_status (*embed_fwd)(int64_t n, int64_t h, const int32_t *tok, const float *table,
                             int64_t lo, int64_t rows, float *x);
    /* dtable[tok[r] - lo] += dx[r] for the rows of tokens in range. */
    tide_status (*embed_bwd)(int64_t n, int64_t h, const int32_t *tok, const float *dx, int64_t lo,
                             int64_t rows, float *dtable);
    /* rowmax[r] = max_c logits[r, c] over this rank's [n, v] slice. */
    tide_status (*xent_max)(int64_t n, int64_t v, const float *logits, float *rowmax);
    /* sz[r] = sum_c exp(logits[r,c] - rowmax[r]); sz[n + r] = logits[r, tgt[r] - lo]
     * when the target is in this slice, else 0. */
    tide_status (*xent_sum)(int64_t n, int64_t v, const float *logits, const int32_t *tgt,
                            int64_t lo, const float *rowmax, float *sz);
    /* With global rowmax m and global sz: rowloss[r] = log(sz[r]) + m[r] - sz[n + r];
     * logits becomes the gradient (softmax - onehot) * scale, in place. */
    tide_status (*xent_grad)(int64_t n, int64_t v, float *logits, const int32_t *tgt, int64_t lo,
                             const float *rowmax, const float *sz, float scale, float *rowloss);
    /* Adam on n elements: m, v moments; bc1 = 1 - beta1^t, bc2 = 1 - beta2^t. */
    tide_status (*adam)(int64_t n, float *p, const float *g, float *m, float *v, float lr,
                        float beta1, float beta2, float eps, float bc1, float bc2);
} mlp_ops;

extern const mlp_ops tide__mlp_host_ops;

/* The CUDA backend (NULL when built without CUDA); first use creates the cuBLAS handle. */
const mlp_ops *tide__mlp_cuda_ops(void);

/* Opens cuBLAS (not linked: the CUDA backend's first gemm calls this) and resolves what
 * the gemm uses; needs no device. TIDE_ERR_BACKEND naming the library when it cannot,
 * TIDE_ERR_UNSUPPORTED in a build without CUDA. Idempotent; training thread. */
tide_status tide__mlp_cuda_blas_load(void);

/* The backend for device; TIDE_ERR_UNSUPPORTED when this build lacks it. */
tide_status tide__mlp_ops_for(tide_mlp_device device, const mlp_ops **out);

/* Limits the host BLAS to one thread (ranks are processes); any thread, idempotent. */
void tide__mlp_host_single_thread(void);

/* ---- synthetic data --------------------------------------------------------------------- */

/*
 * Sample k of the stream: seq + 1 tokens; inputs are tokens [0, seq), targets [1, seq].
 * Token 0 is uniform; token j + 1 is rule(token j) with probability 3/4, else uniform,
 * from a counter-based generator of (seed, k, j): the same in every layout.
 */
void tide__mlp_sample(const tide_mlp_config *cfg, int64_t k, int32_t *inputs, int32_t *targets);

/* The fixed next-token rule of the task for seed. */
int32_t tide__mlp_rule(const tide_mlp_config *cfg, int32_t token);

/* Initial value of global element e of the named tensor (pure function of the seed). */
float tide__mlp_init_value(const tide_mlp_config *cfg, const char *name, int64_t e);

/* ---- the model ------------------------------------------------------------------------- */

/* Parameters of one MLP block shard (or their gradients). */
typedef struct mlp_block {
    float *ln_w, *ln_b;   /* [h] */
    float *fc1_w, *fc1_b; /* [ft, h], [ft] (this tp rank's rows) */
    float *fc2_w, *fc2_b; /* [h, ft] (this tp rank's columns), [h] */
} mlp_block;

/* What one block's backward needs from its forward, for one micro-batch of n tokens. */
typedef struct mlp_block_act {
    float *x;           /* [n, h] block input (the residual stream) */
    float *y;           /* [n, h] layernorm output */
    float *mean, *rstd; /* [n] */
    float *a, *g;       /* [n, ft] fc1 output before and after GeLU */
} mlp_block_act;

/* Activations of one in-flight micro-batch on this stage. */
typedef struct mlp_slot {
    int32_t *tok, *tgt;        /* [n] backend memory: inputs (first stage), targets (last) */
    mlp_block_act *act;        /* one per local layer */
    float *out;                /* [n, h] output of the last local layer */
    float *yf, *meanf, *rstdf; /* last stage: final layernorm */
    float *logits;             /* last stage: [n, vt], then its gradient */
} mlp_slot;

/* One parameter of the model and where its gradient and moments are. */
typedef struct mlp_param {
    size_t index; /* collection index; exp_avg at index + 1, exp_avg_sq at index + 2 */
    int64_t n;    /* elements in this worker's tp shard; 0 when the stage lacks it */
    int64_t lo;   /* moment range [lo, lo + cnt) of the tp shard (zero1: this dp rank's) */
    int64_t cnt;
    float *grad; /* [n] in the gradient arena */
} mlp_param;

struct tide_mlp {
    tide_mlp_config cfg;
    tide_collection_t *coll;
    const mlp_ops *ops;
    tide_layout_t *layout;
    int active;
    int borrowed; /* buf[] is not the model's to free (tide_mlp_adopt_borrowed) */
    int p, d, t;
    int first, last;        /* this stage holds the embedding / the head */
    int layer0, nlayers;    /* local layers [layer0, layer0 + nlayers) */
    int64_t h, ft, vt, vlo; /* hidden; ffn / tp; vocab / tp; first vocab row held */
    int micro;              /* micro-batches per step */
    int64_t mb;             /* samples per micro-batch */
    int64_t n;              /* tokens per micro-batch */
    size_t ntensors;
    void **buf; /* local buffer per collection tensor (NULL: not held) */
    uint64_t *bytes;
    mlp_param *params;
    size_t nparams;
    float *grads; /* arena of every local gradient, one allreduce */
    int64_t grad_elems;
    mlp_block *blk, *gblk; /* per local layer: parameter and gradient views */
    float *embed, *gembed, *fln_w, *fln_b, *gfln_w, *gfln_b, *head, *ghead;
    int nslots;
    mlp_slot *slots;
    float *slot_arena;
    /* scratch arena: f64 loss cell, [n, h] x 4, [n, ft], stats [3n], rowloss [n] */
    void *scratch;
    double *s_loss;
    float *s_z, *s_d0, *s_d1, *s_dy, *s_da, *s_stats, *s_rowloss;
    float *host_rowloss;          /* [n] host */
    int32_t *host_tok, *host_tgt; /* [n] host */
    void *stage;                  /* host staging for comms without device memory */
    size_t stage_bytes;
    int64_t step;        /* host mirror of the "step" tensor */
    int64_t grads_ready; /* the grads arena holds step `step`'s summed gradients and the
                            update needs no peer (tide_mlp_finish_step); -1 otherwise */
    int64_t cursor;      /* host mirror of "data.cursor" */
};

/* Allreduce through comm over group (skipped for a group of size 1), staging to host
 * memory when the comm needs it. */
tide_status tide__mlp_allreduce(tide_mlp_t *m, const tide_mlp_comm *comm, tide_mlp_group g,
                                void *buf, size_t n, tide_dtype dtype, tide_mlp_redop op);

/* Pipeline exchange of one [n, h] activation or gradient (see tide_mlp_comm.exchange;
 * a side with peer 0 is skipped), staging to host memory when the comm needs it.
 * Blocks until both sides are done; main thread. */
tide_status tide__mlp_exchange(tide_mlp_t *m, const tide_mlp_comm *comm, int send_peer,
                               const float *sbuf, int recv_peer, float *rbuf);

/* Embedding of slot's tokens into out [n, h] (allreduced over tp). */
tide_status tide__mlp_embed_fwd(tide_mlp_t *m, const tide_mlp_comm *comm, const int32_t *tok,
                                float *out);

/* dembed += scatter of dx [n, h] by tok. */
tide_status tide__mlp_embed_bwd(tide_mlp_t *m, const int32_t *tok, const float *dx);

/* One block shard forward: act->x is the input; writes act's other fields and out. */
tide_status tide__mlp_block_fwd(tide_mlp_t *m, const tide_mlp_comm *comm, const mlp_block *w,
                                mlp_block_act *act, float *out);

/* One block shard backward: dout [n, h] in; gw accumulated; dx [n, h] written (dx may
 * not alias dout). Uses the scratch buffers. */
tide_status tide__mlp_block_bwd(tide_mlp_t *m, const tide_mlp_comm *comm, const mlp_block *w,
                                const mlp_block_act *act, const float *dout, mlp_block *gw,
                                float *dx);

/* Final layernorm, head and cross-entropy of slot (x = slot->out): rowloss sum into
 * *loss_sum (host, this tp shard's rows: identical on all tp ranks); slot->logits left
 * holding the scaled gradient. */
tide_status tide__mlp_head_fwd(tide_mlp_t *m, const tide_mlp_comm *comm, mlp_slot *slot,
                               double *loss_sum);

/* Head and final layernorm backward of slot into dx [n, h]. */
tide_status tide__mlp_head_bwd(tide_mlp_t *m, const tide_mlp_comm *comm, mlp_slot *slot, float *dx);

/* Index of the named tensor's parameter entry; -1 when it is not a parameter. */
long tide__mlp_param_of(const tide_mlp_t *m, size_t tensor_index);

/* Writes the host mirrors of the step and the data cursor into their tensors (backend
 * copies, ordered before the next sync); needs an active model. Main thread. */
tide_status tide__mlp_store_counters(tide_mlp_t *m);

#ifdef __cplusplus
}
#endif

#endif /* TIDE_EXAMPLES_MLP_INT_H */
