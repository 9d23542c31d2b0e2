/*
 * Unit tests of examples/ (the train_mlp model): the collection it declares, the
 * synthetic data, every host kernel against finite differences or a naive reference,
 * each model piece (embedding, MLP block shard, head + cross-entropy) and the whole
 * forward/backward against finite differences, error paths and allocation failures.
 * Single process, tp = pp = dp = 1 (the MPI tests cover the parallel forms). Seconds.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "core/alloc.h"
#include "examples/mlp.h"
#include "examples/mlp_int.h"
#include "examples/mlp_statefile.h"

#define OK(expr)                                                                                   \
    do {                                                                                           \
        tide_status ok__rc = (expr);                                                               \
        cr_assert_eq(ok__rc, TIDE_OK, "%s -> %s: %s", #expr, tide_strerror(ok__rc),                \
                     tide_last_error());                                                           \
    } while (0)

static const mlp_ops *H = &tide__mlp_host_ops;

static uint64_t rng_state = 88172645463325252ull;
static float frand(void) /* uniform in [-1, 1) */
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (float)((rng_state >> 40) * (1.0 / 8388608.0) - 1.0);
}

static float *rand_vec(int64_t n, float scale)
{
    float *v = malloc((size_t)n * sizeof(float));
    cr_assert(v != NULL);
    for (int64_t i = 0; i < n; i++)
        v[i] = scale * frand();
    return v;
}

static double dot(const float *a, const float *b, int64_t n)
{
    double s = 0.0;
    for (int64_t i = 0; i < n; i++)
        s += (double)a[i] * (double)b[i];
    return s;
}

/* |fd - an| within an absolute floor plus a relative part of the scale. */
static void expect_close(double fd, double an, double abs_tol, double rel_tol, const char *what,
                         int64_t i)
{
    double tol = abs_tol + rel_tol * fmax(fabs(fd), fabs(an));
    cr_expect(fabs(fd - an) <= tol, "%s[%lld]: finite difference %.7g vs analytic %.7g", what,
              (long long)i, fd, an);
}

/* ---- collection and data ------------------------------------------------------------------ */

Test(examples, collection_matches_gpt_builder)
{
    for (int zero1 = 0; zero1 <= 1; zero1++) {
        tide_mlp_config cfg;
        tide_mlp_config_default(&cfg);
        cfg.zero1 = zero1;
        tide_collection_t *mine = NULL, *ref = NULL;
        OK(tide_mlp_collection_new(&cfg, &mine));
        tide_model_spec spec = {.layers = cfg.layers,
                                .hidden = cfg.hidden,
                                .ffn = cfg.ffn,
                                .vocab = cfg.vocab,
                                .attention = 0,
                                .adam = 1,
                                .zero1 = zero1,
                                .dtype = TIDE_F32};
        OK(tide_collection_build_gpt(&ref, &spec));
        /* The builder's tensors, in its order, then the data cursor. */
        cr_assert_eq(tide_collection_size(mine), tide_collection_size(ref) + 1);
        for (size_t i = 0; i < tide_collection_size(ref); i++) {
            const tide_tensor_desc *a = tide_collection_tensor(mine, i);
            const tide_tensor_desc *b = tide_collection_tensor(ref, i);
            cr_expect_str_eq(a->name, b->name);
            cr_expect_eq(a->dtype, b->dtype, "%s dtype", a->name);
            cr_expect_eq(a->ndim, b->ndim, "%s ndim", a->name);
            for (int k = 0; k < a->ndim; k++)
                cr_expect_eq(a->shape[k], b->shape[k], "%s shape[%d]", a->name, k);
            cr_expect_eq(a->layer, b->layer, "%s layer", a->name);
            cr_expect_eq(a->tp, b->tp, "%s tp rule", a->name);
            if (a->tp == TIDE_TP_SPLIT)
                cr_expect_eq(a->tp_dim, b->tp_dim, "%s tp dim", a->name);
            cr_expect_eq(a->dp, b->dp, "%s dp rule", a->name);
        }
        const tide_tensor_desc *cur = tide_collection_tensor(mine, tide_collection_size(mine) - 1);
        cr_expect_str_eq(cur->name, "data.cursor");
        cr_expect_eq(cur->layer, TIDE_LAYER_ALL);
        tide_collection_destroy(&mine);
        tide_collection_destroy(&ref);
    }
}

Test(examples, data_is_a_pure_function_of_seed_and_index)
{
    tide_mlp_config cfg;
    tide_mlp_config_default(&cfg);
    int32_t in[16], tg[16], in2[16], tg2[16];
    int follows = 0, total = 0;
    for (int64_t k = 0; k < 200; k++) {
        tide__mlp_sample(&cfg, k, in, tg);
        tide__mlp_sample(&cfg, k, in2, tg2);
        cr_assert(memcmp(in, in2, sizeof in) == 0 && memcmp(tg, tg2, sizeof tg) == 0);
        for (int j = 0; j < 16; j++) {
            cr_assert(in[j] >= 0 && in[j] < cfg.vocab && tg[j] >= 0 && tg[j] < cfg.vocab);
            if (j + 1 < 16)
                cr_assert_eq(in[j + 1], tg[j], "targets are the next inputs");
            follows += tg[j] == tide__mlp_rule(&cfg, in[j]);
            total++;
        }
    }
    /* The rule holds 3/4 of the time (plus the 1/vocab chance of a random hit). */
    double frac = (double)follows / total;
    cr_expect(frac > 0.70 && frac < 0.82, "rule followed %.3f of the time", frac);
    tide__mlp_sample(&cfg, 1, in2, tg2);
    tide__mlp_sample(&cfg, 0, in, tg);
    cr_expect(memcmp(in, in2, sizeof in) != 0, "different samples differ");
    cfg.seed++;
    tide__mlp_sample(&cfg, 0, in2, tg2);
    cr_expect(memcmp(in, in2, sizeof in) != 0, "different seeds differ");
}

/* ---- host kernels --------------------------------------------------------------------------- */

Test(examples, gemm_matches_naive_for_every_transpose)
{
    const int64_t m = 7, n = 5, k = 9;
    float *a = rand_vec(m * k, 1.0f), *b = rand_vec(k * n, 1.0f);
    for (int ta = 0; ta <= 1; ta++)
        for (int tb = 0; tb <= 1; tb++) {
            float *c = rand_vec(m * n, 1.0f), *c0 = malloc(m * n * sizeof(float));
            memcpy(c0, c, m * n * sizeof(float));
            OK(H->gemm(ta, tb, m, n, k, 0.5f, a, b, 2.0f, c));
            for (int64_t i = 0; i < m; i++)
                for (int64_t j = 0; j < n; j++) {
                    double s = 0.0;
                    for (int64_t q = 0; q < k; q++)
                        s += (double)(ta ? a[q * m + i] : a[i * k + q]) *
                             (double)(tb ? b[j * k + q] : b[q * n + j]);
                    double want = 0.5 * s + 2.0 * c0[i * n + j];
                    cr_expect(fabs(c[i * n + j] - want) < 1e-5, "ta=%d tb=%d (%lld,%lld)", ta, tb,
                              (long long)i, (long long)j);
                }
            free(c);
            free(c0);
        }
    free(a);
    free(b);
}

/* L = sum(r * layernorm(x)); checks dx, dw, db by central differences. */
Test(examples, layernorm_gradients)
{
    const int64_t rows = 3, h = 12;
    float *x = rand_vec(rows * h, 2.0f), *w = rand_vec(h, 1.0f), *b = rand_vec(h, 1.0f);
    float *r = rand_vec(rows * h, 1.0f), *y = malloc(rows * h * 4), *dx = malloc(rows * h * 4);
    float mean[3], rstd[3], dw[12] = {0}, db[12] = {0};
    OK(H->ln_fwd(rows, h, x, w, b, y, mean, rstd));
    OK(H->ln_bwd(rows, h, x, w, mean, rstd, r, dx, dw, db));
    const float eps = 1e-2f;
    float *vars[3] = {x, w, b}, *grads[3] = {dx, dw, db};
    int64_t sizes[3] = {rows * h, h, h};
    const char *names[3] = {"dx", "dw", "db"};
    for (int v = 0; v < 3; v++)
        for (int64_t i = 0; i < sizes[v]; i++) {
            float keep = vars[v][i];
            vars[v][i] = keep + eps;
            OK(H->ln_fwd(rows, h, x, w, b, y, mean, rstd));
            double lp = dot(r, y, rows * h);
            vars[v][i] = keep - eps;
            OK(H->ln_fwd(rows, h, x, w, b, y, mean, rstd));
            double lm = dot(r, y, rows * h);
            vars[v][i] = keep;
            expect_close((lp - lm) / (2 * eps), grads[v][i], 2e-3, 2e-2, names[v], i);
        }
    free(x), free(w), free(b), free(r), free(y), free(dx);
}

Test(examples, gelu_gradient)
{
    const int64_t n = 41;
    float a[41], g[41], gp[41], gm[41], d[41];
    for (int64_t i = 0; i < n; i++) {
        a[i] = -4.0f + 0.2f * (float)i;
        d[i] = 1.0f;
    }
    OK(H->gelu_fwd(n, a, g));
    cr_expect(fabsf(g[20]) < 1e-6f, "gelu(0) = 0");
    cr_expect(fabsf(g[40] - 4.0f) < 1e-3f, "gelu(4) ~ 4");
    OK(H->gelu_bwd(n, a, d));
    const float eps = 1e-3f;
    float ap[41], am[41];
    for (int64_t i = 0; i < n; i++) {
        ap[i] = a[i] + eps;
        am[i] = a[i] - eps;
    }
    OK(H->gelu_fwd(n, ap, gp));
    OK(H->gelu_fwd(n, am, gm));
    for (int64_t i = 0; i < n; i++)
        expect_close((gp[i] - gm[i]) / (2.0 * eps), d[i], 2e-3, 1e-2, "gelu'", i);
}

/* Vocab-parallel cross-entropy: two "tp ranks" holding halves of the vocabulary,
 * combined by hand as the allreduces would, give the loss and gradient of the full
 * softmax, and the gradient matches finite differences. */
Test(examples, cross_entropy_vocab_parallel)
{
    const int64_t n = 4, v = 10, half = 5;
    float *logits = rand_vec(n * v, 3.0f);
    int32_t tgt[4] = {0, 7, 4, 9};
    float full_grad[40], rowloss[4], stats[12];
    memcpy(full_grad, logits, sizeof full_grad);
    OK(H->xent_max(n, v, full_grad, stats));
    OK(H->xent_sum(n, v, full_grad, tgt, 0, stats, stats + n));
    OK(H->xent_grad(n, v, full_grad, tgt, 0, stats, stats + n, 1.0f, rowloss));
    /* Reference loss in double. */
    for (int64_t r = 0; r < n; r++) {
        double mx = -INFINITY, s = 0.0;
        for (int64_t c = 0; c < v; c++)
            mx = fmax(mx, logits[r * v + c]);
        for (int64_t c = 0; c < v; c++)
            s += exp(logits[r * v + c] - mx);
        double want = log(s) + mx - logits[r * v + tgt[r]];
        cr_expect(fabs(rowloss[r] - want) < 1e-5, "row %lld loss %g vs %g", (long long)r,
                  rowloss[r], want);
        /* FD of the row loss. */
        for (int64_t c = 0; c < v; c++) {
            const double e = 1e-3;
            double lp = 0, lm = 0;
            for (int sign = -1; sign <= 1; sign += 2) {
                double m2 = -INFINITY, s2 = 0.0;
                for (int64_t q = 0; q < v; q++) {
                    double lv = logits[r * v + q] + (q == c ? sign * e : 0.0);
                    m2 = fmax(m2, lv);
                }
                for (int64_t q = 0; q < v; q++)
                    s2 += exp(logits[r * v + q] + (q == c ? sign * e : 0.0) - m2);
                double l = log(s2) + m2 - (logits[r * v + tgt[r]] + (tgt[r] == c ? sign * e : 0));
                if (sign < 0)
                    lm = l;
                else
                    lp = l;
            }
            expect_close((lp - lm) / (2 * e), full_grad[r * v + c], 1e-4, 1e-3, "dlogits",
                         r * v + c);
        }
    }
    /* The split version. */
    float part[2][20], pst[2][12];
    for (int t = 0; t < 2; t++) {
        for (int64_t r = 0; r < n; r++)
            memcpy(part[t] + r * half, logits + r * v + t * half, half * sizeof(float));
        OK(H->xent_max(n, half, part[t], pst[t]));
    }
    for (int64_t r = 0; r < n; r++)
        pst[0][r] = pst[1][r] = fmaxf(pst[0][r], pst[1][r]); /* allreduce max */
    for (int t = 0; t < 2; t++)
        OK(H->xent_sum(n, half, part[t], tgt, t * half, pst[t], pst[t] + n));
    for (int64_t i = n; i < 3 * n; i++)
        pst[0][i] = pst[1][i] = pst[0][i] + pst[1][i]; /* allreduce sum */
    float rl[2][4];
    for (int t = 0; t < 2; t++) {
        OK(H->xent_grad(n, half, part[t], tgt, t * half, pst[t], pst[t] + n, 1.0f, rl[t]));
        for (int64_t r = 0; r < n; r++) {
            cr_expect(fabsf(rl[t][r] - rowloss[r]) < 1e-5f, "split loss rank %d row %lld", t,
                      (long long)r);
            for (int64_t c = 0; c < half; c++)
                cr_expect(fabsf(part[t][r * half + c] - full_grad[r * v + t * half + c]) < 1e-6f,
                          "split gradient");
        }
    }
    free(logits);
}

Test(examples, embedding_vocab_parallel_and_adam)
{
    const int64_t n = 5, h = 3, rows = 4, lo = 4; /* this rank holds tokens 4..7 */
    int32_t tok[5] = {4, 1, 7, 4, 8};
    float *table = rand_vec(rows * h, 1.0f), x[15], dtab[12] = {0};
    float *dx = rand_vec(n * h, 1.0f);
    OK(H->embed_fwd(n, h, tok, table, lo, rows, x));
    for (int64_t j = 0; j < h; j++) {
        cr_expect_eq(x[0 * h + j], table[0 * h + j]);
        cr_expect_eq(x[1 * h + j], 0.0f, "token outside the shard gives zeros");
        cr_expect_eq(x[2 * h + j], table[3 * h + j]);
        cr_expect_eq(x[4 * h + j], 0.0f);
    }
    OK(H->embed_bwd(n, h, tok, dx, lo, rows, dtab));
    for (int64_t j = 0; j < h; j++) {
        cr_expect(fabsf(dtab[0 * h + j] - (dx[0 * h + j] + dx[3 * h + j])) < 1e-6f);
        cr_expect_eq(dtab[1 * h + j], 0.0f);
        cr_expect(fabsf(dtab[3 * h + j] - dx[2 * h + j]) < 1e-6f);
    }
    /* Adam, two steps against the formula in double. */
    float p[2] = {1.0f, -2.0f}, g[2] = {0.5f, -0.25f}, m1[2] = {0}, m2[2] = {0};
    double P[2] = {1.0, -2.0}, M1[2] = {0}, M2[2] = {0};
    for (int t = 1; t <= 2; t++) {
        float bc1 = (float)(1 - pow(0.9, t)), bc2 = (float)(1 - pow(0.999, t));
        OK(H->adam(2, p, g, m1, m2, 0.1f, 0.9f, 0.999f, 1e-8f, bc1, bc2));
        for (int i = 0; i < 2; i++) {
            M1[i] = 0.9 * M1[i] + 0.1 * g[i];
            M2[i] = 0.999 * M2[i] + 0.001 * g[i] * g[i];
            P[i] -= 0.1 * (M1[i] / bc1) / (sqrt(M2[i] / bc2) + 1e-8);
            cr_expect(fabs(p[i] - P[i]) < 1e-5 * fabs(P[i]), "adam step %d elem %d: %g vs %g", t, i,
                      p[i], P[i]);
        }
    }
    free(table);
    free(dx);
}

/* ---- model pieces -----------------------------------------------------------------------------
 */

static tide_mlp_config tiny(void)
{
    tide_mlp_config cfg;
    tide_mlp_config_default(&cfg);
    cfg.layers = 2;
    cfg.hidden = 8;
    cfg.ffn = 16;
    cfg.vocab = 12;
    cfg.seq = 3;
    cfg.global_batch = 4;
    return cfg;
}

static tide_mlp_t *single(const tide_mlp_config *cfg, int micro)
{
    tide_layout_t *l = NULL;
    OK(tide_layout_new(&l, 1, 1, 1, cfg->layers, micro));
    tide_mlp_t *m = NULL;
    OK(tide_mlp_new(&m, cfg, l, 0, TIDE_MLP_CPU));
    OK(tide_mlp_init(m));
    tide_layout_destroy(&l);
    return m;
}

/* One MLP block shard: L = sum(r * out), FD over its input and every parameter. */
Test(examples, block_gradients)
{
    tide_mlp_config cfg = tiny();
    tide_mlp_t *m = single(&cfg, 1);
    tide_mlp_comm comm;
    tide_mlp_comm_self(&comm);
    const int64_t n = m->n, h = m->h;
    mlp_slot *sl = &m->slots[0];
    mlp_block_act *act = &sl->act[0];
    float *x0 = rand_vec(n * h, 1.5f), *r = rand_vec(n * h, 1.0f);
    float *out = malloc(n * h * sizeof(float)), *dx = malloc(n * h * sizeof(float));
    /* Non-trivial layernorm and biases so that every path carries signal. */
    for (int64_t j = 0; j < h; j++) {
        m->blk[0].ln_w[j] = 1.0f + 0.3f * frand();
        m->blk[0].ln_b[j] = 0.2f * frand();
        m->blk[0].fc2_b[j] = 0.2f * frand();
    }
    for (int64_t j = 0; j < m->ft; j++)
        m->blk[0].fc1_b[j] = 0.3f * frand();
    memcpy(act->x, x0, n * h * sizeof(float));
    OK(tide__mlp_block_fwd(m, &comm, &m->blk[0], act, out));
    OK(H->zero(m->grads, m->grad_elems * sizeof(float)));
    OK(tide__mlp_block_bwd(m, &comm, &m->blk[0], act, r, &m->gblk[0], dx));

    struct {
        float *v, *g;
        int64_t n;
        const char *name;
    } vars[] = {
        {act->x, dx, n * h, "dx"},
        {m->blk[0].ln_w, m->gblk[0].ln_w, h, "ln_w"},
        {m->blk[0].ln_b, m->gblk[0].ln_b, h, "ln_b"},
        {m->blk[0].fc1_w, m->gblk[0].fc1_w, m->ft * h, "fc1_w"},
        {m->blk[0].fc1_b, m->gblk[0].fc1_b, m->ft, "fc1_b"},
        {m->blk[0].fc2_w, m->gblk[0].fc2_w, h * m->ft, "fc2_w"},
        {m->blk[0].fc2_b, m->gblk[0].fc2_b, h, "fc2_b"},
    };
    float *xs = malloc(n * h * sizeof(float));
    const float eps = 1e-2f;
    for (size_t v = 0; v < sizeof vars / sizeof vars[0]; v++)
        for (int64_t i = 0; i < vars[v].n; i++) {
            float keep = vars[v].v[i];
            double l[2];
            for (int s = 0; s < 2; s++) {
                vars[v].v[i] = keep + (s ? eps : -eps);
                memcpy(xs, act->x, n * h * sizeof(float));
                OK(tide__mlp_block_fwd(m, &comm, &m->blk[0], act, out));
                memcpy(act->x, xs, n * h * sizeof(float));
                l[s] = dot(r, out, n * h);
            }
            vars[v].v[i] = keep;
            expect_close((l[1] - l[0]) / (2 * eps), vars[v].g[i], 3e-3, 2e-2, vars[v].name, i);
        }
    free(x0), free(r), free(out), free(dx), free(xs);
    tide_mlp_destroy(&m);
}

/* Final layernorm + head + cross-entropy: FD of the summed loss over the stage input,
 * the final layernorm and the head. */
Test(examples, head_gradients)
{
    tide_mlp_config cfg = tiny();
    tide_mlp_t *m = single(&cfg, 1);
    tide_mlp_comm comm;
    tide_mlp_comm_self(&comm);
    const int64_t n = m->n, h = m->h;
    mlp_slot *sl = &m->slots[0];
    for (int64_t r = 0; r < n; r++)
        m->host_tgt[r] = (int32_t)(r * 5 % cfg.vocab);
    memcpy(sl->tgt, m->host_tgt, n * sizeof(int32_t));
    float *x = rand_vec(n * h, 1.5f);
    for (int64_t j = 0; j < h; j++) {
        m->fln_w[j] = 1.0f + 0.3f * frand();
        m->fln_b[j] = 0.2f * frand();
    }
    memcpy(sl->out, x, n * h * sizeof(float));
    double base = 0.0;
    OK(H->zero(m->grads, m->grad_elems * sizeof(float)));
    OK(tide__mlp_head_fwd(m, &comm, sl, &base));
    float *dx = malloc(n * h * sizeof(float));
    OK(tide__mlp_head_bwd(m, &comm, sl, dx));
    /* The loss is scaled by 1 / (global batch * seq) = 1 / n here. */
    const double scale = 1.0 / (double)(cfg.global_batch * cfg.seq);
    struct {
        float *v, *g;
        int64_t n;
        const char *name;
    } vars[] = {
        {sl->out, dx, n * h, "dx"},
        {m->fln_w, m->gfln_w, h, "final_ln.w"},
        {m->fln_b, m->gfln_b, h, "final_ln.b"},
        {m->head, m->ghead, m->vt * h, "head"},
    };
    const float eps = 1e-2f;
    for (size_t v = 0; v < sizeof vars / sizeof vars[0]; v++)
        for (int64_t i = 0; i < vars[v].n; i++) {
            float keep = vars[v].v[i];
            double l[2];
            for (int s = 0; s < 2; s++) {
                vars[v].v[i] = keep + (s ? eps : -eps);
                l[s] = 0.0;
                OK(tide__mlp_head_fwd(m, &comm, sl, &l[s]));
            }
            vars[v].v[i] = keep;
            expect_close((l[1] - l[0]) * scale / (2 * eps), vars[v].g[i], 1e-4, 2e-2, vars[v].name,
                         i);
        }
    free(x);
    free(dx);
    tide_mlp_destroy(&m);
}

/* The whole model, two micro-batches through the schedule: FD of the step loss for
 * elements of every parameter tensor, written through tide_mlp_write. */
Test(examples, model_gradients)
{
    tide_mlp_config cfg = tiny();
    tide_mlp_t *m = single(&cfg, 2);
    tide_mlp_comm comm;
    tide_mlp_comm_self(&comm);
    double loss = 0.0;
    OK(tide_mlp_forward_backward(m, &comm, &loss));
    cr_expect(loss > 1.5 && loss < 4.0, "initial loss %g near log(vocab) = %g", loss,
              log((double)cfg.vocab));
    const tide_collection_t *c = tide_mlp_collection(m);
    for (size_t k = 0; k < m->nparams; k++) {
        size_t i = m->params[k].index;
        uint64_t bytes = 0;
        tide_mlp_buffer(m, i, &bytes);
        int64_t ne = (int64_t)(bytes / sizeof(float));
        float *p = malloc(bytes), *g = malloc(bytes);
        OK(tide_mlp_read(m, i, p, bytes));
        OK(tide_mlp_read_grad(m, i, g, bytes));
        for (int64_t e = 0; e < ne; e += 1 + ne / 7) {
            float keep = p[e];
            const float eps = 3e-3f;
            double l[2];
            for (int s = 0; s < 2; s++) {
                p[e] = keep + (s ? eps : -eps);
                OK(tide_mlp_write(m, i, p, bytes));
                OK(tide_mlp_forward_backward(m, &comm, &l[s]));
            }
            p[e] = keep;
            OK(tide_mlp_write(m, i, p, bytes));
            expect_close((l[1] - l[0]) / (2 * eps), g[e], 2e-4, 3e-2,
                         tide_collection_tensor(c, i)->name, e);
        }
        free(p);
        free(g);
    }
    tide_mlp_destroy(&m);
}

Test(examples, training_reduces_loss_single_process)
{
    tide_mlp_config cfg;
    tide_mlp_config_default(&cfg);
    cfg.layers = 2;
    tide_mlp_t *m = single(&cfg, 2);
    tide_mlp_comm comm;
    tide_mlp_comm_self(&comm);
    double first = 0.0, loss = 0.0;
    for (int s = 0; s < 30; s++) {
        OK(tide_mlp_step(m, &comm, &loss));
        if (s == 0)
            first = loss;
    }
    cr_expect_eq(tide_mlp_step_count(m), 30);
    cr_expect(loss < 0.75 * first, "loss %g -> %g after 30 steps", first, loss);
    /* The counters live in their tensors too (they move with a reshard). */
    size_t is = 0, ic = 0;
    OK(tide_collection_find(tide_mlp_collection(m), "step", &is));
    OK(tide_collection_find(tide_mlp_collection(m), "data.cursor", &ic));
    int64_t v = 0;
    OK(tide_mlp_read(m, is, &v, sizeof v));
    cr_expect_eq(v, 30);
    OK(tide_mlp_read(m, ic, &v, sizeof v));
    cr_expect_eq(v, 30 * cfg.global_batch);
    tide_mlp_destroy(&m);
}

/* Same seed, same state; the state is what the step sees: a copy of the buffers into a
 * second model makes it continue with the same losses. */
Test(examples, state_buffers_are_the_whole_state)
{
    tide_mlp_config cfg = tiny();
    tide_mlp_t *a = single(&cfg, 2), *b = single(&cfg, 2);
    tide_mlp_comm comm;
    tide_mlp_comm_self(&comm);
    double la = 0, lb = 0;
    for (int s = 0; s < 3; s++)
        OK(tide_mlp_step(a, &comm, &la));
    size_t n = tide_collection_size(tide_mlp_collection(a));
    for (size_t i = 0; i < n; i++) {
        uint64_t bytes = 0;
        tide_mlp_buffer(a, i, &bytes);
        void *tmp = malloc(bytes);
        OK(tide_mlp_read(a, i, tmp, bytes));
        OK(tide_mlp_write(b, i, tmp, bytes));
        free(tmp);
    }
    cr_expect_eq(tide_mlp_step_count(b), 3);
    for (int s = 0; s < 3; s++) {
        OK(tide_mlp_step(a, &comm, &la));
        OK(tide_mlp_step(b, &comm, &lb));
        cr_expect_eq(la, lb, "step %d: %.9g vs %.9g", s, la, lb);
    }
    tide_mlp_destroy(&a);
    tide_mlp_destroy(&b);
}

/* ---- errors, idle workers, adopt, allocation failures ------------------------------------ */

Test(examples, bad_layouts_and_flags_are_refused_with_a_reason)
{
    tide_mlp_config cfg = tiny();
    tide_layout_t *l = NULL;
    tide_mlp_t *m = NULL;
    OK(tide_layout_new(&l, 1, 3, 1, cfg.layers, 1)); /* 3 does not divide ffn 16 */
    cr_expect_eq(tide_mlp_new(&m, &cfg, l, 0, TIDE_MLP_CPU), TIDE_ERR_INVALID);
    cr_expect(strstr(tide_last_error(), "tp=3") != NULL, "detail: %s", tide_last_error());
    cr_expect_null(m);
    tide_layout_destroy(&l);
    OK(tide_layout_new(&l, 3, 1, 1, cfg.layers, 1)); /* 3 does not divide batch 4 */
    cr_expect_eq(tide_mlp_new(&m, &cfg, l, 0, TIDE_MLP_CPU), TIDE_ERR_INVALID);
    cr_expect(strstr(tide_last_error(), "global batch") != NULL, "detail: %s", tide_last_error());
    tide_layout_destroy(&l);
    cfg.vocab = 1;
    OK(tide_layout_new(&l, 1, 1, 1, cfg.layers, 1));
    cr_expect_eq(tide_mlp_new(&m, &cfg, l, 0, TIDE_MLP_CPU), TIDE_ERR_INVALID);
    cr_expect(strstr(tide_last_error(), "vocab") != NULL, "detail: %s", tide_last_error());
    tide_mlp_device dev;
    cr_expect_eq(tide_mlp_device_parse("tpu", &dev), TIDE_ERR_INVALID);
    OK(tide_mlp_device_parse("CUDA", &dev));
    cr_expect_eq(dev, TIDE_MLP_CUDA);
    tide_layout_destroy(&l);
}

Test(examples, idle_worker_and_adopt)
{
    tide_mlp_config cfg = tiny();
    tide_layout_t *one = NULL, *two = NULL;
    OK(tide_layout_new(&one, 1, 1, 1, cfg.layers, 1));
    OK(tide_layout_new(&two, 1, 2, 1, cfg.layers, 1));
    tide_mlp_t *m = NULL;
    OK(tide_mlp_new(&m, &cfg, one, 5, TIDE_MLP_CPU)); /* worker 5 is not in the layout */
    OK(tide_mlp_init(m));
    cr_expect(!tide_mlp_active(m));
    tide_mlp_comm comm;
    tide_mlp_comm_self(&comm);
    double loss;
    cr_expect_eq(tide_mlp_step(m, &comm, &loss), TIDE_ERR_INVALID);
    int p, d, t;
    cr_expect_eq(tide_mlp_coord(m, &p, &d, &t), TIDE_ERR_NOT_FOUND);
    tide_mlp_destroy(&m);

    /* Adopt: buffers of the wrong layout are refused and the model stays usable. */
    OK(tide_mlp_new(&m, &cfg, one, 0, TIDE_MLP_CPU));
    OK(tide_mlp_init(m));
    void **bufs = NULL;
    OK(tide_mlp_alloc_buffers(m, one, 1, &bufs)); /* worker 1: idle in `one`, all NULL */
    cr_expect_eq(tide_mlp_adopt(m, one, 0, &bufs), TIDE_ERR_INVALID);
    cr_expect_not_null(bufs, "the caller keeps its buffers on failure");
    tide_mlp_free_buffers(m, &bufs);
    OK(tide_mlp_step(m, &comm, &loss));
    /* Worker 1 under (tp 2): tp rank 1 holds half of fc1 and none of the replicas' extra. */
    OK(tide_mlp_alloc_buffers(m, two, 1, &bufs));
    OK(tide_mlp_adopt(m, two, 1, &bufs));
    cr_expect_null(bufs);
    OK(tide_mlp_coord(m, &p, &d, &t));
    cr_expect(p == 0 && d == 0 && t == 1);
    size_t i = 0;
    OK(tide_collection_find(tide_mlp_collection(m), "layer.0.fc1.weight", &i));
    uint64_t bytes = 0;
    cr_expect_not_null(tide_mlp_buffer(m, i, &bytes));
    cr_expect_eq(bytes, (uint64_t)(cfg.ffn / 2 * cfg.hidden * 4));
    cr_expect_eq(tide_mlp_step_count(m), 0, "fresh buffers hold step 0");
    cr_expect_eq(tide_mlp_buffers(m)[i], tide_mlp_buffer(m, i, &bytes));
    tide_mlp_destroy(&m);
    tide_layout_destroy(&one);
    tide_layout_destroy(&two);
}

Test(examples, allocation_failures_are_clean)
{
    tide_mlp_config cfg = tiny();
    tide_layout_t *l = NULL;
    OK(tide_layout_new(&l, 1, 1, 1, cfg.layers, 2));
    int failed = 0;
    for (long k = 1; k < 400; k++) {
        tide_mlp_t *m = NULL;
        tide_alloc_fail_at(k, 0);
        tide_status rc = tide_mlp_new(&m, &cfg, l, 0, TIDE_MLP_CPU);
        if (rc == TIDE_OK)
            rc = tide_mlp_init(m);
        long hits = tide_alloc_failures();
        tide_alloc_fail_at(0, 0);
        if (hits == 0) { /* past the last allocation: everything succeeded */
            cr_expect_eq(rc, TIDE_OK);
            tide_mlp_destroy(&m);
            break;
        }
        cr_expect_eq(rc, TIDE_ERR_NOMEM, "allocation %ld: %s", k, tide_strerror(rc));
        failed++;
        tide_mlp_destroy(&m);
    }
    cr_expect(failed > 10, "%d allocation sites exercised", failed);
    tide_layout_destroy(&l);
}

/* ---- the whole-state file (train_mlp --state-out, mlp_state_diff) ------------------------- */

/* Writes the state of collection c filled from seed to path; returns the buffers. */
static void **write_state_file(const tide_collection_t *c, const char *path)
{
    size_t n = tide_collection_size(c);
    void **full = calloc(n, sizeof *full);
    cr_assert(full != NULL);
    for (size_t i = 0; i < n; i++) {
        const tide_tensor_desc *d = tide_collection_tensor(c, i);
        uint64_t bytes = tide_tensor_bytes(d);
        full[i] = calloc(1, (size_t)bytes);
        cr_assert(full[i] != NULL);
        if (d->dtype == TIDE_F32)
            for (uint64_t k = 0; k < bytes / 4; k++)
                ((float *)full[i])[k] = frand();
        else
            memset(full[i], (int)(i + 1), (size_t)bytes);
    }
    OK(tide_mlp_state_write(path, c, full));
    return full;
}

static void free_state(const tide_collection_t *c, void **full)
{
    for (size_t i = 0; i < tide_collection_size(c); i++)
        free(full[i]);
    free(full);
}

Test(examples, state_file_round_trip_and_compare)
{
    tide_mlp_config cfg;
    tide_mlp_config_default(&cfg);
    cfg.layers = 2;
    cfg.hidden = 8;
    cfg.ffn = 16;
    cfg.vocab = 8;
    tide_collection_t *c = NULL;
    OK(tide_mlp_collection_new(&cfg, &c));
    char dir[] = "/tmp/tide-state-XXXXXX";
    cr_assert(mkdtemp(dir) != NULL);
    char a[128], b[128];
    snprintf(a, sizeof a, "%s/a", dir);
    snprintf(b, sizeof b, "%s/b", dir);
    void **full = write_state_file(c, a);
    OK(tide_mlp_state_write(b, c, full));
    tide_mlp_state_diff d;
    OK(tide_mlp_state_compare(a, b, 0.0, &d));
    cr_assert_eq(d.tensors, tide_collection_size(c));
    cr_assert_eq(d.identical, d.tensors, "a file read back is bit-identical to itself");
    /* one float element off by 1e-3 of the tensor's norm: within 1e-2, not within 1e-4 */
    size_t f = 0;
    while (tide_collection_tensor(c, f)->dtype != TIDE_F32)
        f++;
    const tide_tensor_desc *fd = tide_collection_tensor(c, f);
    float *x = full[f];
    double norm = 0.0;
    for (uint64_t k = 0; k < tide_tensor_bytes(fd) / 4; k++)
        norm += (double)x[k] * x[k];
    x[0] += (float)(1e-3 * sqrt(norm));
    OK(tide_mlp_state_write(b, c, full));
    OK(tide_mlp_state_compare(b, a, 1e-2, &d));
    cr_assert_eq(d.identical, d.tensors - 1);
    cr_assert(fabs(d.worst_rel - 1e-3) < 1e-4, "relative difference %g", d.worst_rel);
    cr_assert_str_eq(d.worst, fd->name);
    cr_assert_eq(tide_mlp_state_compare(b, a, 1e-4, &d), TIDE_ERR_RANGE);
    cr_assert(strstr(tide_last_error(), fd->name) != NULL, "%s", tide_last_error());
    x[0] -= (float)(1e-3 * sqrt(norm));
    /* an integer tensor (the step counter) must be equal */
    size_t s = 0;
    while (tide_collection_tensor(c, s)->dtype == TIDE_F32)
        s++;
    ((unsigned char *)full[s])[0] ^= 1;
    OK(tide_mlp_state_write(b, c, full));
    cr_assert_eq(tide_mlp_state_compare(a, b, 1.0, &d), TIDE_ERR_INVALID);
    cr_assert(strstr(tide_last_error(), tide_collection_tensor(c, s)->name) != NULL, "%s",
              tide_last_error());
    /* a flipped byte and a truncated file are refused on reading */
    FILE *fp = fopen(b, "r+b");
    cr_assert(fp != NULL);
    fseek(fp, -1, SEEK_END);
    int last = fgetc(fp);
    fseek(fp, -1, SEEK_END);
    fputc(last ^ 0x40, fp);
    fclose(fp);
    cr_assert_eq(tide_mlp_state_compare(a, b, 1.0, &d), TIDE_ERR_IO);
    cr_assert(strstr(tide_last_error(), "does not match its hash") != NULL, "%s",
              tide_last_error());
    cr_assert_eq(truncate(b, 100), 0);
    cr_assert_eq(tide_mlp_state_compare(a, b, 1.0, &d), TIDE_ERR_IO);
    cr_assert_eq(tide_mlp_state_compare(a, dir, 1.0, &d), TIDE_ERR_IO);
    free_state(c, full);
    remove(a);
    remove(b);
    rmdir(dir);
    tide_collection_destroy(&c);
}

/* "libcublas" mapped into this process (/proc/self/maps), -1 when that cannot be read. */
static int cublas_mapped(void)
{
    FILE *f = fopen("/proc/self/maps", "r");
    if (f == NULL)
        return -1;
    char line[4096];
    int found = 0;
    while (!found && fgets(line, sizeof line, f) != NULL)
        found = strstr(line, "/libcublas") != NULL;
    fclose(f);
    return found;
}

/* A CPU job on a CUDA build must not pay cuBLAS's initialisation (about 0.5 CPU-s per
 * process): cuBLAS is opened by the CUDA backend's first gemm, and opening it needs no
 * device, so the loading path is checked here too. */
Test(examples, cublas_is_opened_at_first_use_not_at_start)
{
    cr_assert_eq(cublas_mapped(), 0, "cuBLAS is loaded before any GPU gemm");
    tide_status st = tide__mlp_cuda_blas_load();
    if (!tide_mlp_have_cuda()) {
        cr_assert_eq(st, TIDE_ERR_UNSUPPORTED);
        return;
    }
    cr_assert_eq(st, TIDE_OK, "%s", tide_last_error());
    cr_assert_eq(cublas_mapped(), 1, "the load returned OK but cuBLAS is not mapped");
    cr_assert_eq(tide__mlp_cuda_blas_load(), TIDE_OK, "a second load");
}
