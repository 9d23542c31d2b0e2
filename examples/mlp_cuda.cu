/*
 * CUDA compute backend of train_mlp: cuBLAS sgemm (pedantic f32, no TF32, so that it
 * matches the host path within f32 tolerance) and small kernels for layernorm, GeLU,
 * bias, embedding, vocab-parallel cross-entropy and Adam. Everything runs in order on
 * the legacy default stream of the current device; copies to the host synchronise.
 *
 * Workload: micro-batches of 10^2..10^5 tokens through layers 10^2..10^4 wide. Row
 * kernels use one block per row; column reductions (layernorm and bias gradients) use
 * one thread per column looping over rows, so they are deterministic. Only the
 * embedding gradient uses atomics (rows of the same token). CUDA and cuBLAS codes are
 * translated to tide_status here and nowhere else.
 *
 * cuBLAS is loaded with dlopen on the first gemm, not linked: initialising it costs about
 * 0.5 CPU-s per process start (1.5 under AddressSanitizer) even when no device exists,
 * and every process of a CPU job on a CUDA build of tide (each rank, each tool linking
 * libtide) would pay it. cublas_v2.h is still included for its types and constants.
 */
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <libgen.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "core/error.h"
#include "examples/mlp_int.h"

#define THREADS 256
#define LN_EPS  1e-5f
#define GELU_K  0.7978845608028654f
#define GELU_C  0.044715f

static cublasHandle_t g_blas;

/* The four cuBLAS entry points the gemm uses, resolved by tide__mlp_cuda_blas_load(). */
static struct {
    cublasStatus_t (*create)(cublasHandle_t *);
    cublasStatus_t (*set_math_mode)(cublasHandle_t, cublasMath_t);
    const char *(*status_string)(cublasStatus_t);
    cublasStatus_t (*sgemm)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int,
                            const float *, const float *, int, const float *, int, const float *,
                            float *, int);
} g_cublas;

static tide_status cuda_fail(cudaError_t e, const char *what)
{
    return tide_errorf(TIDE_ERR_BACKEND, "%s failed: %s (%s)", what, cudaGetErrorString(e),
                       cudaGetErrorName(e));
}

#define CUDA_CHECK(call, what)                                                                     \
    do {                                                                                           \
        cudaError_t cuda__e = (call);                                                              \
        if (cuda__e != cudaSuccess)                                                                \
            return cuda_fail(cuda__e, what);                                                       \
    } while (0)

/* Launch errors (bad configuration) show at once; execution errors at the next sync. */
#define LAUNCHED(what) CUDA_CHECK(cudaGetLastError(), what)

static unsigned grid_for(int64_t n)
{
    int64_t b = (n + THREADS - 1) / THREADS;
    if (b < 1)
        b = 1;
    return (unsigned)(b > 65535 ? 65535 : b); /* grid-stride loops cover the rest */
}

static tide_status check_rows(int64_t rows, const char *what)
{
    if (rows > INT32_MAX)
        return tide_errorf(TIDE_ERR_RANGE, "%s: %lld rows exceed one grid", what, (long long)rows);
    return TIDE_OK;
}

/* ---- memory --------------------------------------------------------------------------- */

static tide_status d_alloc(size_t bytes, void **out)
{
    *out = NULL;
    if (bytes == 0)
        return TIDE_OK;
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, bytes);
    if (e != cudaSuccess)
        return tide_errorf(e == cudaErrorMemoryAllocation ? TIDE_ERR_NOMEM : TIDE_ERR_BACKEND,
                           "cudaMalloc of %zu bytes failed: %s", bytes, cudaGetErrorString(e));
    e = cudaMemset(p, 0, bytes);
    if (e != cudaSuccess) {
        cudaFree(p);
        return cuda_fail(e, "cudaMemset");
    }
    *out = p;
    return TIDE_OK;
}

static void d_release(void *p)
{
    if (p != NULL)
        cudaFree(p);
}

static tide_status d_zero(void *p, size_t bytes)
{
    if (bytes)
        CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, 0), "cudaMemsetAsync");
    return TIDE_OK;
}

static tide_status d_copy(void *dst, const void *src, size_t bytes, mlp_copy_kind kind)
{
    if (bytes == 0 || dst == src)
        return TIDE_OK;
    cudaMemcpyKind k = kind == MLP_H2D   ? cudaMemcpyHostToDevice
                       : kind == MLP_D2H ? cudaMemcpyDeviceToHost
                                         : cudaMemcpyDeviceToDevice;
    CUDA_CHECK(cudaMemcpy(dst, src, bytes, k), "cudaMemcpy");
    return TIDE_OK;
}

static tide_status d_sync(void)
{
    CUDA_CHECK(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    return TIDE_OK;
}

/* ---- gemm ----------------------------------------------------------------------------- */

#define CUBLAS_SONAME_(major) "libcublas.so." #major
#define CUBLAS_SONAME(major)  CUBLAS_SONAME_(major)

/* Opens cuBLAS by its soname (LD_LIBRARY_PATH, this object's RUNPATH, the system's
 * paths), else from the folder the loaded CUDA runtime came from, where the toolkit
 * keeps it. */
static void *blas_open(char *why, size_t why_len)
{
    const char *name = CUBLAS_SONAME(CUBLAS_VER_MAJOR);
    void *h = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (h != NULL)
        return h;
    snprintf(why, why_len, "%s", dlerror());
    Dl_info info;
    if (dladdr((void *)cudaGetDeviceCount, &info) == 0 || info.dli_fname == NULL)
        return NULL;
    char dir[4096], path[4200];
    snprintf(dir, sizeof dir, "%s", info.dli_fname);
    snprintf(path, sizeof path, "%s/%s", dirname(dir), name);
    h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (h == NULL)
        snprintf(why + strlen(why), why_len - strlen(why), "; %s", dlerror());
    return h;
}

tide_status tide__mlp_cuda_blas_load(void)
{
    if (g_cublas.sgemm != NULL)
        return TIDE_OK;
    char why[1024] = "";
    void *h = blas_open(why, sizeof why);
    if (h == NULL)
        return tide_errorf(TIDE_ERR_BACKEND, "cannot load cuBLAS (%s): %s",
                           CUBLAS_SONAME(CUBLAS_VER_MAJOR), why);
    /* the _v2 names are what cublas_v2.h maps cublasCreate and cublasSgemm to */
    void *create = dlsym(h, "cublasCreate_v2"), *mode = dlsym(h, "cublasSetMathMode");
    void *str = dlsym(h, "cublasGetStatusString"), *sgemm = dlsym(h, "cublasSgemm_v2");
    if (create == NULL || mode == NULL || str == NULL || sgemm == NULL) {
        dlclose(h);
        return tide_errorf(TIDE_ERR_BACKEND,
                           "%s lacks cublasCreate_v2, cublasSetMathMode, cublasGetStatusString "
                           "or cublasSgemm_v2",
                           CUBLAS_SONAME(CUBLAS_VER_MAJOR));
    }
    g_cublas.create = reinterpret_cast<decltype(g_cublas.create)>(create);
    g_cublas.set_math_mode = reinterpret_cast<decltype(g_cublas.set_math_mode)>(mode);
    g_cublas.status_string = reinterpret_cast<decltype(g_cublas.status_string)>(str);
    g_cublas.sgemm = reinterpret_cast<decltype(g_cublas.sgemm)>(sgemm);
    return TIDE_OK; /* h stays open for the life of the process */
}

static tide_status blas_handle(void)
{
    if (g_blas != NULL)
        return TIDE_OK;
    TIDE_CHECK(tide__mlp_cuda_blas_load());
    cublasStatus_t s = g_cublas.create(&g_blas);
    if (s != CUBLAS_STATUS_SUCCESS) {
        g_blas = NULL;
        return tide_errorf(TIDE_ERR_BACKEND, "cublasCreate failed: %s", g_cublas.status_string(s));
    }
    /* Plain f32 FMA math: TF32 tensor cores would differ from the host by ~1e-3. */
    s = g_cublas.set_math_mode(g_blas, CUBLAS_PEDANTIC_MATH);
    if (s != CUBLAS_STATUS_SUCCESS)
        return tide_errorf(TIDE_ERR_BACKEND, "cublasSetMathMode failed: %s",
                           g_cublas.status_string(s));
    return TIDE_OK;
}

static tide_status d_gemm(int ta, int tb, int64_t m, int64_t n, int64_t k, float alpha,
                          const float *a, const float *b, float beta, float *c)
{
    if (m <= 0 || n <= 0)
        return TIDE_OK;
    if (m > INT32_MAX || n > INT32_MAX || k > INT32_MAX)
        return tide_errorf(TIDE_ERR_RANGE, "gemm %lld x %lld x %lld exceeds cuBLAS int range",
                           (long long)m, (long long)n, (long long)k);
    TIDE_CHECK(blas_handle());
    /* Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T. */
    cublasStatus_t s = g_cublas.sgemm(
        g_blas, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N, (int)n, (int)m,
        (int)k, &alpha, b, tb ? (int)k : (int)n, a, ta ? (int)m : (int)k, &beta, c, (int)n);
    if (s != CUBLAS_STATUS_SUCCESS)
        return tide_errorf(TIDE_ERR_BACKEND, "cublasSgemm(%lld, %lld, %lld) failed: %s",
                           (long long)m, (long long)n, (long long)k, g_cublas.status_string(s));
    return TIDE_OK;
}

/* ---- reductions ------------------------------------------------------------------------- */

/* Sum (max when is_max) of v over the block; every thread gets the result. */
__device__ float block_reduce(float v, bool is_max)
{
    __shared__ float buf[THREADS];
    __syncthreads(); /* buf may still be read by a previous call */
    buf[threadIdx.x] = v;
    __syncthreads();
    for (unsigned s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s)
            buf[threadIdx.x] = is_max ? fmaxf(buf[threadIdx.x], buf[threadIdx.x + s])
                                      : buf[threadIdx.x] + buf[threadIdx.x + s];
        __syncthreads();
    }
    return buf[0];
}

/* ---- layernorm --------------------------------------------------------------------------- */

__global__ void k_ln_fwd(int64_t h, const float *x, const float *w, const float *b, float *y,
                         float *mean, float *rstd)
{
    const float *xr = x + (int64_t)blockIdx.x * h;
    float s = 0.0f;
    for (int64_t j = threadIdx.x; j < h; j += blockDim.x)
        s += xr[j];
    float mu = block_reduce(s, false) / (float)h;
    float v = 0.0f;
    for (int64_t j = threadIdx.x; j < h; j += blockDim.x) {
        float d = xr[j] - mu;
        v += d * d;
    }
    float rs = rsqrtf(block_reduce(v, false) / (float)h + LN_EPS);
    float *yr = y + (int64_t)blockIdx.x * h;
    for (int64_t j = threadIdx.x; j < h; j += blockDim.x)
        yr[j] = (xr[j] - mu) * rs * w[j] + b[j];
    if (threadIdx.x == 0) {
        mean[blockIdx.x] = mu;
        rstd[blockIdx.x] = rs;
    }
}

static tide_status d_ln_fwd(int64_t rows, int64_t h, const float *x, const float *w, const float *b,
                            float *y, float *mean, float *rstd)
{
    if (rows <= 0)
        return TIDE_OK;
    TIDE_CHECK(check_rows(rows, "layernorm"));
    k_ln_fwd<<<(unsigned)rows, THREADS>>>(h, x, w, b, y, mean, rstd);
    LAUNCHED("layernorm forward");
    return TIDE_OK;
}

__global__ void k_ln_bwd_dx(int64_t h, const float *x, const float *w, const float *mean,
                            const float *rstd, const float *dy, float *dx)
{
    int64_t r = blockIdx.x;
    const float *xr = x + r * h, *dyr = dy + r * h;
    float mu = mean[r], rs = rstd[r];
    float s1 = 0.0f, s2 = 0.0f;
    for (int64_t j = threadIdx.x; j < h; j += blockDim.x) {
        float xh = (xr[j] - mu) * rs, dxh = dyr[j] * w[j];
        s1 += dxh;
        s2 += dxh * xh;
    }
    s1 = block_reduce(s1, false) / (float)h;
    s2 = block_reduce(s2, false) / (float)h;
    float *dxr = dx + r * h;
    for (int64_t j = threadIdx.x; j < h; j += blockDim.x) {
        float xh = (xr[j] - mu) * rs;
        dxr[j] = rs * (dyr[j] * w[j] - s1 - xh * s2);
    }
}

__global__ void k_ln_bwd_dw(int64_t rows, int64_t h, const float *x, const float *mean,
                            const float *rstd, const float *dy, float *dw, float *db)
{
    for (int64_t j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; j < h;
         j += (int64_t)gridDim.x * blockDim.x) {
        float sw = 0.0f, sb = 0.0f;
        for (int64_t r = 0; r < rows; r++) {
            float g = dy[r * h + j];
            sw += g * (x[r * h + j] - mean[r]) * rstd[r];
            sb += g;
        }
        dw[j] += sw;
        db[j] += sb;
    }
}

static tide_status d_ln_bwd(int64_t rows, int64_t h, const float *x, const float *w,
                            const float *mean, const float *rstd, const float *dy, float *dx,
                            float *dw, float *db)
{
    if (rows <= 0)
        return TIDE_OK;
    TIDE_CHECK(check_rows(rows, "layernorm backward"));
    k_ln_bwd_dx<<<(unsigned)rows, THREADS>>>(h, x, w, mean, rstd, dy, dx);
    LAUNCHED("layernorm backward (dx)");
    k_ln_bwd_dw<<<grid_for(h), THREADS>>>(rows, h, x, mean, rstd, dy, dw, db);
    LAUNCHED("layernorm backward (dw, db)");
    return TIDE_OK;
}

/* ---- elementwise -------------------------------------------------------------------------- */

#define GRID_LOOP(i, n)                                                                            \
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n);                      \
         i += (int64_t)gridDim.x * blockDim.x)

__global__ void k_gelu_fwd(int64_t n, const float *a, float *g)
{
    GRID_LOOP(i, n)
    {
        float x = a[i];
        g[i] = 0.5f * x * (1.0f + tanhf(GELU_K * (x + GELU_C * x * x * x)));
    }
}

__global__ void k_gelu_bwd(int64_t n, const float *a, float *dg)
{
    GRID_LOOP(i, n)
    {
        float x = a[i];
        float th = tanhf(GELU_K * (x + GELU_C * x * x * x));
        dg[i] *= 0.5f * (1.0f + th) +
                 0.5f * x * (1.0f - th * th) * GELU_K * (1.0f + 3.0f * GELU_C * x * x);
    }
}

__global__ void k_bias_add(int64_t rows, int64_t cols, float *y, const float *b)
{
    GRID_LOOP(i, rows * cols)
    y[i] += b[i % cols];
}

__global__ void k_bias_grad(int64_t rows, int64_t cols, const float *dy, float *db)
{
    GRID_LOOP(c, cols)
    {
        float s = 0.0f;
        for (int64_t r = 0; r < rows; r++)
            s += dy[r * cols + c];
        db[c] += s;
    }
}

__global__ void k_add(int64_t n, float *y, const float *x)
{
    GRID_LOOP(i, n)
    y[i] += x[i];
}

__global__ void k_embed_fwd(int64_t n, int64_t h, const int32_t *tok, const float *table,
                            int64_t lo, int64_t rows, float *x)
{
    GRID_LOOP(i, n * h)
    {
        int64_t r = i / h, j = i % h, row = (int64_t)tok[r] - lo;
        x[i] = (row >= 0 && row < rows) ? table[row * h + j] : 0.0f;
    }
}

__global__ void k_embed_bwd(int64_t n, int64_t h, const int32_t *tok, const float *dx, int64_t lo,
                            int64_t rows, float *dtable)
{
    GRID_LOOP(i, n * h)
    {
        int64_t r = i / h, j = i % h, row = (int64_t)tok[r] - lo;
        if (row >= 0 && row < rows)
            atomicAdd(&dtable[row * h + j], dx[i]);
    }
}

__global__ void k_adam(int64_t n, float *p, const float *g, float *m, float *v, float lr,
                       float beta1, float beta2, float eps, float bc1, float bc2)
{
    GRID_LOOP(i, n)
    {
        float gi = g[i];
        float mi = beta1 * m[i] + (1.0f - beta1) * gi;
        float vi = beta2 * v[i] + (1.0f - beta2) * gi * gi;
        m[i] = mi;
        v[i] = vi;
        p[i] -= lr * (mi / bc1) / (sqrtf(vi / bc2) + eps);
    }
}

static tide_status d_gelu_fwd(int64_t n, const float *a, float *g)
{
    k_gelu_fwd<<<grid_for(n), THREADS>>>(n, a, g);
    LAUNCHED("gelu forward");
    return TIDE_OK;
}

static tide_status d_gelu_bwd(int64_t n, const float *a, float *dg)
{
    k_gelu_bwd<<<grid_for(n), THREADS>>>(n, a, dg);
    LAUNCHED("gelu backward");
    return TIDE_OK;
}

static tide_status d_bias_add(int64_t rows, int64_t cols, float *y, const float *b)
{
    k_bias_add<<<grid_for(rows * cols), THREADS>>>(rows, cols, y, b);
    LAUNCHED("bias add");
    return TIDE_OK;
}

static tide_status d_bias_grad(int64_t rows, int64_t cols, const float *dy, float *db)
{
    k_bias_grad<<<grid_for(cols), THREADS>>>(rows, cols, dy, db);
    LAUNCHED("bias gradient");
    return TIDE_OK;
}

static tide_status d_add(int64_t n, float *y, const float *x)
{
    k_add<<<grid_for(n), THREADS>>>(n, y, x);
    LAUNCHED("add");
    return TIDE_OK;
}

static tide_status d_embed_fwd(int64_t n, int64_t h, const int32_t *tok, const float *table,
                               int64_t lo, int64_t rows, float *x)
{
    k_embed_fwd<<<grid_for(n * h), THREADS>>>(n, h, tok, table, lo, rows, x);
    LAUNCHED("embedding forward");
    return TIDE_OK;
}

static tide_status d_embed_bwd(int64_t n, int64_t h, const int32_t *tok, const float *dx,
                               int64_t lo, int64_t rows, float *dtable)
{
    k_embed_bwd<<<grid_for(n * h), THREADS>>>(n, h, tok, dx, lo, rows, dtable);
    LAUNCHED("embedding backward");
    return TIDE_OK;
}

static tide_status d_adam(int64_t n, float *p, const float *g, float *m, float *v, float lr,
                          float beta1, float beta2, float eps, float bc1, float bc2)
{
    if (n <= 0)
        return TIDE_OK;
    k_adam<<<grid_for(n), THREADS>>>(n, p, g, m, v, lr, beta1, beta2, eps, bc1, bc2);
    LAUNCHED("adam");
    return TIDE_OK;
}

/* ---- cross-entropy ------------------------------------------------------------------------ */

__global__ void k_xent_max(int64_t v, const float *logits, float *rowmax)
{
    const float *lr = logits + (int64_t)blockIdx.x * v;
    float mx = -INFINITY;
    for (int64_t c = threadIdx.x; c < v; c += blockDim.x)
        mx = fmaxf(mx, lr[c]);
    mx = block_reduce(mx, true);
    if (threadIdx.x == 0)
        rowmax[blockIdx.x] = mx;
}

__global__ void k_xent_sum(int64_t n, int64_t v, const float *logits, const int32_t *tgt,
                           int64_t lo, const float *rowmax, float *sz)
{
    int64_t r = blockIdx.x;
    const float *lr = logits + r * v;
    float mx = rowmax[r], s = 0.0f;
    for (int64_t c = threadIdx.x; c < v; c += blockDim.x)
        s += expf(lr[c] - mx);
    s = block_reduce(s, false);
    if (threadIdx.x == 0) {
        int64_t c = (int64_t)tgt[r] - lo;
        sz[r] = s;
        sz[n + r] = (c >= 0 && c < v) ? lr[c] : 0.0f;
    }
}

__global__ void k_xent_grad(int64_t n, int64_t v, float *logits, const int32_t *tgt, int64_t lo,
                            const float *rowmax, const float *sz, float scale, float *rowloss)
{
    int64_t r = blockIdx.x;
    float *lr = logits + r * v;
    float mx = rowmax[r], inv = 1.0f / sz[r];
    int64_t tc = (int64_t)tgt[r] - lo;
    if (threadIdx.x == 0)
        rowloss[r] = logf(sz[r]) + mx - sz[n + r];
    for (int64_t c = threadIdx.x; c < v; c += blockDim.x) {
        float pr = expf(lr[c] - mx) * inv;
        lr[c] = (pr - (c == tc ? 1.0f : 0.0f)) * scale;
    }
}

static tide_status d_xent_max(int64_t n, int64_t v, const float *logits, float *rowmax)
{
    if (n <= 0)
        return TIDE_OK;
    TIDE_CHECK(check_rows(n, "cross-entropy"));
    k_xent_max<<<(unsigned)n, THREADS>>>(v, logits, rowmax);
    LAUNCHED("cross-entropy max");
    return TIDE_OK;
}

static tide_status d_xent_sum(int64_t n, int64_t v, const float *logits, const int32_t *tgt,
                              int64_t lo, const float *rowmax, float *sz)
{
    if (n <= 0)
        return TIDE_OK;
    TIDE_CHECK(check_rows(n, "cross-entropy"));
    k_xent_sum<<<(unsigned)n, THREADS>>>(n, v, logits, tgt, lo, rowmax, sz);
    LAUNCHED("cross-entropy sum");
    return TIDE_OK;
}

static tide_status d_xent_grad(int64_t n, int64_t v, float *logits, const int32_t *tgt, int64_t lo,
                               const float *rowmax, const float *sz, float scale, float *rowloss)
{
    if (n <= 0)
        return TIDE_OK;
    TIDE_CHECK(check_rows(n, "cross-entropy"));
    k_xent_grad<<<(unsigned)n, THREADS>>>(n, v, logits, tgt, lo, rowmax, sz, scale, rowloss);
    LAUNCHED("cross-entropy gradient");
    return TIDE_OK;
}

/* ---- the table ------------------------------------------------------------------------------ */

static mlp_ops make_ops(void)
{
    mlp_ops o;
    o.device = TIDE_MLP_CUDA;
    o.name = "cuda (cuBLAS)";
    o.alloc = d_alloc;
    o.release = d_release;
    o.zero = d_zero;
    o.copy = d_copy;
    o.sync = d_sync;
    o.gemm = d_gemm;
    o.ln_fwd = d_ln_fwd;
    o.ln_bwd = d_ln_bwd;
    o.gelu_fwd = d_gelu_fwd;
    o.gelu_bwd = d_gelu_bwd;
    o.bias_add = d_bias_add;
    o.bias_grad = d_bias_grad;
    o.add = d_add;
    o.embed_fwd = d_embed_fwd;
    o.embed_bwd = d_embed_bwd;
    o.xent_max = d_xent_max;
    o.xent_sum = d_xent_sum;
    o.xent_grad = d_xent_grad;
    o.adam = d_adam;
    return o;
}

static const mlp_ops g_cuda_ops = make_ops();

const mlp_ops *tide__mlp_cuda_ops(void)
{
    return &g_cuda_ops;
}

tide_status tide_mlp_select_device(tide_mlp_device device, int local_index)
{
    if (device == TIDE_MLP_CPU)
        return TIDE_OK;
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0)
        return tide_errorf(TIDE_ERR_NO_DEVICE, "--device cuda: no CUDA device (%s)",
                           e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
    CUDA_CHECK(cudaSetDevice(local_index % n), "cudaSetDevice");
    return TIDE_OK;
}
