/*
 * Host compute backend of train_mlp: plain C kernels, and OpenBLAS sgemm when the
 * build found it (TIDE_MLP_HAVE_OPENBLAS). Workload: micro-batches of a few hundred to
 * a few thousand tokens through layers a few hundred to a few thousand wide; one
 * thread per rank (ranks are processes, so BLAS threading is turned off).
 */
#include <math.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "examples/mlp_int.h"

#ifdef TIDE_MLP_HAVE_OPENBLAS
#include <cblas.h>
#endif

#define LN_EPS 1e-5f
#define GELU_K 0.7978845608028654f /* sqrt(2 / pi) */
#define GELU_C 0.044715f

void tide__mlp_host_single_thread(void)
{
#ifdef TIDE_MLP_HAVE_OPENBLAS
    openblas_set_num_threads(1);
#endif
}

static tide_status h_alloc(size_t bytes, void **out)
{
    *out = NULL;
    if (bytes == 0)
        return TIDE_OK;
    *out = tide_calloc(1, bytes);
    if (*out == NULL)
        return tide_errorf(TIDE_ERR_NOMEM, "out of host memory allocating %zu bytes", bytes);
    return TIDE_OK;
}

static void h_release(void *p)
{
    tide_free(p);
}

static tide_status h_zero(void *p, size_t bytes)
{
    if (bytes)
        memset(p, 0, bytes);
    return TIDE_OK;
}

static tide_status h_copy(void *dst, const void *src, size_t bytes, mlp_copy_kind kind)
{
    (void)kind;
    if (bytes && dst != src)
        memmove(dst, src, bytes);
    return TIDE_OK;
}

static tide_status h_sync(void)
{
    return TIDE_OK;
}

#ifndef TIDE_MLP_HAVE_OPENBLAS
/* Loop orders keep the innermost loop contiguous in memory for each transpose case. */
static void plain_gemm(int ta, int tb, int64_t m, int64_t n, int64_t k, float alpha, const float *a,
                       const float *b, float *c)
{
    if (!ta && !tb) {
        for (int64_t i = 0; i < m; i++)
            for (int64_t q = 0; q < k; q++) {
                float s = alpha * a[i * k + q];
                const float *br = b + q * n;
                float *cr = c + i * n;
                for (int64_t j = 0; j < n; j++)
                    cr[j] += s * br[j];
            }
    } else if (!ta && tb) {
        for (int64_t i = 0; i < m; i++)
            for (int64_t j = 0; j < n; j++) {
                const float *ar = a + i * k, *br = b + j * k;
                float s = 0.0f;
                for (int64_t q = 0; q < k; q++)
                    s += ar[q] * br[q];
                c[i * n + j] += alpha * s;
            }
    } else if (ta && !tb) {
        for (int64_t q = 0; q < k; q++)
            for (int64_t i = 0; i < m; i++) {
                float s = alpha * a[q * m + i];
                const float *br = b + q * n;
                float *cr = c + i * n;
                for (int64_t j = 0; j < n; j++)
                    cr[j] += s * br[j];
            }
    } else {
        for (int64_t i = 0; i < m; i++)
            for (int64_t j = 0; j < n; j++) {
                float s = 0.0f;
                for (int64_t q = 0; q < k; q++)
                    s += a[q * m + i] * b[j * k + q];
                c[i * n + j] += alpha * s;
            }
    }
}
#endif

static tide_status h_gemm(int ta, int tb, int64_t m, int64_t n, int64_t k, float alpha,
                          const float *a, const float *b, float beta, float *c)
{
    if (m <= 0 || n <= 0)
        return TIDE_OK;
#ifdef TIDE_MLP_HAVE_OPENBLAS
    if (m > INT32_MAX || n > INT32_MAX || k > INT32_MAX)
        return tide_errorf(TIDE_ERR_RANGE, "gemm %lld x %lld x %lld exceeds BLAS int range",
                           (long long)m, (long long)n, (long long)k);
    if (k <= 0) {
        for (int64_t i = 0; i < m * n; i++)
            c[i] = beta == 0.0f ? 0.0f : beta * c[i];
        return TIDE_OK;
    }
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
                (int)m, (int)n, (int)k, alpha, a, ta ? (int)m : (int)k, b, tb ? (int)k : (int)n,
                beta, c, (int)n);
#else
    /* beta == 0 must not propagate NaN or Inf from an uninitialised C (BLAS semantics). */
    for (int64_t i = 0; i < m * n; i++)
        c[i] = beta == 0.0f ? 0.0f : beta * c[i];
    if (k > 0)
        plain_gemm(ta, tb, m, n, k, alpha, a, b, c);
#endif
    return TIDE_OK;
}

static tide_status h_ln_fwd(int64_t rows, int64_t h, const float *x, const float *w, const float *b,
                            float *y, float *mean, float *rstd)
{
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * h;
        float s = 0.0f;
        for (int64_t j = 0; j < h; j++)
            s += xr[j];
        float mu = s / (float)h;
        float v = 0.0f;
        for (int64_t j = 0; j < h; j++) {
            float dlt = xr[j] - mu;
            v += dlt * dlt;
        }
        float rs = 1.0f / sqrtf(v / (float)h + LN_EPS);
        mean[r] = mu;
        rstd[r] = rs;
        float *yr = y + r * h;
        for (int64_t j = 0; j < h; j++)
            yr[j] = (xr[j] - mu) * rs * w[j] + b[j];
    }
    return TIDE_OK;
}

static tide_status h_ln_bwd(int64_t rows, int64_t h, const float *x, const float *w,
                            const float *mean, const float *rstd, const float *dy, float *dx,
                            float *dw, float *db)
{
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * h, *dyr = dy + r * h;
        float mu = mean[r], rs = rstd[r];
        float s1 = 0.0f, s2 = 0.0f; /* sum dxhat, sum dxhat * xhat */
        for (int64_t j = 0; j < h; j++) {
            float xh = (xr[j] - mu) * rs;
            float dxh = dyr[j] * w[j];
            s1 += dxh;
            s2 += dxh * xh;
            dw[j] += dyr[j] * xh;
            db[j] += dyr[j];
        }
        s1 /= (float)h;
        s2 /= (float)h;
        float *dxr = dx + r * h;
        for (int64_t j = 0; j < h; j++) {
            float xh = (xr[j] - mu) * rs;
            dxr[j] = rs * (dyr[j] * w[j] - s1 - xh * s2);
        }
    }
    return TIDE_OK;
}

static tide_status h_gelu_fwd(int64_t n, const float *a, float *g)
{
    for (int64_t i = 0; i < n; i++) {
        float x = a[i];
        g[i] = 0.5f * x * (1.0f + tanhf(GELU_K * (x + GELU_C * x * x * x)));
    }
    return TIDE_OK;
}

static tide_status h_gelu_bwd(int64_t n, const float *a, float *dg)
{
    for (int64_t i = 0; i < n; i++) {
        float x = a[i];
        float th = tanhf(GELU_K * (x + GELU_C * x * x * x));
        float d = 0.5f * (1.0f + th) +
                  0.5f * x * (1.0f - th * th) * GELU_K * (1.0f + 3.0f * GELU_C * x * x);
        dg[i] *= d;
    }
    return TIDE_OK;
}

static tide_status h_bias_add(int64_t rows, int64_t cols, float *y, const float *b)
{
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++)
            y[r * cols + c] += b[c];
    return TIDE_OK;
}

static tide_status h_bias_grad(int64_t rows, int64_t cols, const float *dy, float *db)
{
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++)
            db[c] += dy[r * cols + c];
    return TIDE_OK;
}

static tide_status h_add(int64_t n, float *y, const float *x)
{
    for (int64_t i = 0; i < n; i++)
        y[i] += x[i];
    return TIDE_OK;
}

static tide_status h_embed_fwd(int64_t n, int64_t h, const int32_t *tok, const float *table,
                               int64_t lo, int64_t rows, float *x)
{
    for (int64_t r = 0; r < n; r++) {
        int64_t row = (int64_t)tok[r] - lo;
        if (row >= 0 && row < rows)
            memcpy(x + r * h, table + row * h, (size_t)h * sizeof(float));
        else
            memset(x + r * h, 0, (size_t)h * sizeof(float));
    }
    return TIDE_OK;
}

static tide_status h_embed_bwd(int64_t n, int64_t h, const int32_t *tok, const float *dx,
                               int64_t lo, int64_t rows, float *dtable)
{
    for (int64_t r = 0; r < n; r++) {
        int64_t row = (int64_t)tok[r] - lo;
        if (row < 0 || row >= rows)
            continue;
        for (int64_t j = 0; j < h; j++)
            dtable[row * h + j] += dx[r * h + j];
    }
    return TIDE_OK;
}

static tide_status h_xent_max(int64_t n, int64_t v, const float *logits, float *rowmax)
{
    for (int64_t r = 0; r < n; r++) {
        float mx = -INFINITY;
        for (int64_t c = 0; c < v; c++)
            mx = fmaxf(mx, logits[r * v + c]);
        rowmax[r] = mx;
    }
    return TIDE_OK;
}

static tide_status h_xent_sum(int64_t n, int64_t v, const float *logits, const int32_t *tgt,
                              int64_t lo, const float *rowmax, float *sz)
{
    for (int64_t r = 0; r < n; r++) {
        float s = 0.0f;
        for (int64_t c = 0; c < v; c++)
            s += expf(logits[r * v + c] - rowmax[r]);
        sz[r] = s;
        int64_t c = (int64_t)tgt[r] - lo;
        sz[n + r] = (c >= 0 && c < v) ? logits[r * v + c] : 0.0f;
    }
    return TIDE_OK;
}

static tide_status h_xent_grad(int64_t n, int64_t v, float *logits, const int32_t *tgt, int64_t lo,
                               const float *rowmax, const float *sz, float scale, float *rowloss)
{
    for (int64_t r = 0; r < n; r++) {
        float mx = rowmax[r], inv = 1.0f / sz[r];
        rowloss[r] = logf(sz[r]) + mx - sz[n + r];
        int64_t tc = (int64_t)tgt[r] - lo;
        for (int64_t c = 0; c < v; c++) {
            float pr = expf(logits[r * v + c] - mx) * inv;
            logits[r * v + c] = (pr - (c == tc ? 1.0f : 0.0f)) * scale;
        }
    }
    return TIDE_OK;
}

static tide_status h_adam(int64_t n, float *p, const float *g, float *m, float *v, float lr,
                          float beta1, float beta2, float eps, float bc1, float bc2)
{
    for (int64_t i = 0; i < n; i++) {
        m[i] = beta1 * m[i] + (1.0f - beta1) * g[i];
        v[i] = beta2 * v[i] + (1.0f - beta2) * g[i] * g[i];
        float mh = m[i] / bc1, vh = v[i] / bc2;
        p[i] -= lr * mh / (sqrtf(vh) + eps);
    }
    return TIDE_OK;
}

const mlp_ops tide__mlp_host_ops = {
    .device = TIDE_MLP_CPU,
#ifdef TIDE_MLP_HAVE_OPENBLAS
    .name = "cpu (OpenBLAS)",
#else
    .name = "cpu (plain C)",
#endif
    .alloc = h_alloc,
    .release = h_release,
    .zero = h_zero,
    .copy = h_copy,
    .sync = h_sync,
    .gemm = h_gemm,
    .ln_fwd = h_ln_fwd,
    .ln_bwd = h_ln_bwd,
    .gelu_fwd = h_gelu_fwd,
    .gelu_bwd = h_gelu_bwd,
    .bias_add = h_bias_add,
    .bias_grad = h_bias_grad,
    .add = h_add,
    .embed_fwd = h_embed_fwd,
    .embed_bwd = h_embed_bwd,
    .xent_max = h_xent_max,
    .xent_sum = h_xent_sum,
    .xent_grad = h_xent_grad,
    .adam = h_adam,
};

tide_status tide__mlp_ops_for(tide_mlp_device device, const mlp_ops **out)
{
    *out = NULL;
    if (device == TIDE_MLP_CPU) {
        *out = &tide__mlp_host_ops;
        return TIDE_OK;
    }
    if (device == TIDE_MLP_CUDA) {
        *out = tide__mlp_cuda_ops();
        if (*out == NULL)
            return tide_errorf(TIDE_ERR_UNSUPPORTED,
                               "--device cuda: this build has no CUDA support (configure "
                               "with the CUDA toolkit and NCCL present)");
        return TIDE_OK;
    }
    return tide_errorf(TIDE_ERR_INVALID, "unknown device %d", (int)device);
}

int tide_mlp_have_cuda(void)
{
    return tide__mlp_cuda_ops() != NULL;
}

#ifndef TIDE_MLP_HAVE_CUDA
const mlp_ops *tide__mlp_cuda_ops(void)
{
    return NULL;
}

tide_status tide__mlp_cuda_blas_load(void)
{
    return tide_errorf(TIDE_ERR_UNSUPPORTED, "this build has no CUDA support");
}
#endif

#ifndef TIDE_MLP_HAVE_CUDA
tide_status tide_mlp_select_device(tide_mlp_device device, int local_index)
{
    (void)local_index;
    if (device == TIDE_MLP_CPU)
        return TIDE_OK;
    return tide_errorf(TIDE_ERR_UNSUPPORTED, "--device cuda: this build has no CUDA support");
}
#endif
