/* test_gemm_rows.c — the n-row GEMMs (kernels/gemm_rows.cu, kernels/gemm_wg.cu) against their CPU twin, and their time.
 * 1. ks_cuda_gemm_rows against the CPU backend's matmul (ks_cpu_matmul) given the same bf16
 * weights and x rounded to bf16 (the kernel rounds float32 x as it reads it): rows n from 1 to 64
 * (8-row tiles full and ragged), in multiples of 8 with and without a ragged 32-column step,
 * outputs narrow and wide, one and three segments, with and without biases, the K split chosen
 * and forced (1, 2, 3, 8: the cluster's sum through distributed shared memory). Outputs are
 * poisoned with NaN first. Tolerance per output: |gpu - cpu| <= 1e-5 * (sum_k |x_k w_k| + |bias|)
 * — products are exact in float32 on both sides, only the order of float32 accumulation differs
 * (the tensor cores' and the CPU's), far inside 1e-5 of the absolute sum at these sizes; a wrong
 * index or a lost partial is O(1) of it. Every call is repeated: the bits must be equal.
 * 2. Refusals: n 0 and 65, in not a multiple of 8, x misaligned, four segments -> one-line
 * KS_ERR_UNSUPPORTED, nothing launched.
 * 3. The backend's fused q|k|v projection (ks_cuda_dense_qkv, the op that takes it for 2..16
 * rows) with biases against the CPU's matmuls at n = 5, 16 and 64 (the last: cuBLAS).
 * 4. The wgmma gate|up + SwiGLU (kernels/gemm_wg.cu) against the CPU's matmuls over the same bf16 x
 * and weights, SwiGLU in double: rows 2..64, ragged K (a partial 64-column step), ragged outputs (a
 * partial tile), shapes whose few tiles split K over a cluster (the pieces added in rank order) and
 * shapes with a tile a CTA; every call repeated for equal bits; its refusals. Bound: the bf16
 * rounding of the output (2^-9 of |h|, doubled) plus the float32 sums' error (1e-5 of sum |x w|,
 * as in 1) carried through silu(g) u. The backend's n-row MLP (gate|up + SwiGLU, then down +=)
 * against the CPU's matmuls: the bf16 h's rounding carried through the down projection (2^-8 of
 * sum |w h|).
 * 5. (--bench, GPU machine) the Llama-3.1-8B decode shapes at n = 1, 4, 16, 64: per op the path
 * the engine takes without the kernels (float32 x converted to bf16, cuBLAS GEMMs), cuBLAS's GEMMs
 * alone on bf16 x, the skinny kernel and (gate|up) the wgmma kernel, in GB/s of weights beside a device copy;
 * weights rotated beyond L2. Printed, never asserted.
 * Usage: test_gemm_rows [--quick] [--bench]. Prints "N passed, N failed"; exits 1 on failure. */
#include "backend.h"
#include "cpu_dense.h"
#include "gemm_rows.cuh"
#include "gemm_wg.cuh"
#include "rmsnorm.cuh"
#include "ks_cuda.h"
#include "ks_cuda_dense.h"
#include "safetensors.h"
#include "testutil.h"

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int g_pass, g_fail;
static ks_backend *CPU, *GPU;

static void result(int ok, const char *name, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void result(int ok, const char *name, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    printf("%s %-62s ", ok ? "  ok  " : "  FAIL", name);
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
    fflush(stdout);
    if (ok) g_pass++;
    else g_fail++;
}

static uint64_t g_seed = 0x9e3779b97f4a7c15ull;
static float rndf(void) { /* uniform in [-1, 1) */
    g_seed = g_seed * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((g_seed >> 40) / 8388608.0 - 1.0);
}
static float bf16r(float x) { return ks_bf16_to_f32(ks_f32_to_bf16(x)); }

static void *dput(const void *h, size_t bytes) {
    void *d = GPU->alloc(GPU, bytes ? bytes : 16);
    if (d && h && GPU->upload(GPU, d, h, bytes)) { GPU->free(GPU, d); return NULL; }
    return d;
}

/* a (rows, cols) bf16 weight on both backends, and its values as float */
typedef struct wpair { ks_weight *c, *g; float *f; uint16_t *h; void *d; int rows, cols; } wpair;
static int wmake(wpair *w, int rows, int cols, float scale) {
    memset(w, 0, sizeof *w);
    w->rows = rows;
    w->cols = cols;
    size_t n = (size_t)rows * cols;
    w->h = malloc(n * 2);
    w->f = malloc(n * 4);
    for (size_t i = 0; i < n; i++) {
        w->h[i] = ks_f32_to_bf16(scale * rndf());
        w->f[i] = ks_bf16_to_f32(w->h[i]);
    }
    ks_st_tensor t;
    memset(&t, 0, sizeof t);
    t.name = "w";
    t.dtype = KS_DT_BF16;
    t.ndim = cols == 1 ? 1 : 2;
    t.shape[0] = rows;
    t.shape[1] = cols;
    t.data = w->h;
    t.nbytes = n * 2;
    if (cols == 1) { /* a vector (bias): float32 on both */
        t.dtype = KS_DT_F32;
        t.data = w->f;
        t.nbytes = n * 4;
    }
    w->d = dput(t.data, t.nbytes); /* the same values as a plain device array, for the kernel */
    return !w->d || CPU->weight_create(CPU, &t, 0, rows, &w->c) || GPU->weight_create(GPU, &t, 0, rows, &w->g) ? -1 : 0;
}
static void wfree(wpair *w) {
    if (w->c) CPU->weight_free(CPU, w->c);
    if (w->g) GPU->weight_free(GPU, w->g);
    if (w->d) GPU->free(GPU, w->d);
    free(w->f);
    free(w->h);
}

/* sum_k |x_k w_k| per output (n, out): the scale of each dot's rounding */
static double *abs_dots(const float *x, const float *W, int n, int in, int out) {
    double *s = malloc(sizeof(double) * (size_t)n * out);
    for (int r = 0; r < n; r++)
        for (int o = 0; o < out; o++) {
            double a = 0;
            for (int k = 0; k < in; k++) a += fabs((double)x[(size_t)r * in + k] * W[(size_t)o * in + k]);
            s[(size_t)r * out + o] = a;
        }
    return s;
}

/* max over outputs of |g - c| / (tol scale); ok when <= 1 and all finite */
static double worst(const float *g, const float *c, const double *scale, const float *extra, size_t n, double rel) {
    double w = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(g[i])) return INFINITY;
        double lim = rel * (scale[i] + (extra ? fabs(extra[i]) : 0)) + 1e-30;
        double e = fabs((double)g[i] - c[i]) / lim;
        if (e > w) w = e;
    }
    return w;
}

typedef struct kcase { int n, in, out, nseg, bias, splits; } kcase;

static void run_kcase(const kcase *k) {
    int n = k->n, in = k->in, nseg = k->nseg, outs[3] = {k->out, k->out / 2 + 8, k->out / 2 + 8};
    char name[160];
    snprintf(name, sizeof name, "n=%d in=%d out=%d seg=%d%s split=%d", n, in, k->out, nseg, k->bias ? " bias" : "", k->splits);
    wpair W[3], B[3];
    memset(W, 0, sizeof W);
    memset(B, 0, sizeof B);
    float *x = malloc(sizeof(float) * (size_t)n * in), *xr = malloc(sizeof(float) * (size_t)n * in);
    for (size_t i = 0; i < (size_t)n * in; i++) xr[i] = bf16r(x[i] = rndf() * 2.0f);
    int bad = 0;
    for (int i = 0; i < nseg; i++) {
        bad |= wmake(&W[i], outs[i], in, 0.5f);
        if (k->bias) bad |= wmake(&B[i], outs[i], 1, 1.0f);
    }
    float *dx = bad ? NULL : dput(x, sizeof(float) * (size_t)n * in);
    float *dy[3] = {0}, *gy[3] = {0}, *cy[3] = {0};
    ks_gemm_rows_args a;
    memset(&a, 0, sizeof a);
    a.x = dx;
    a.n = n;
    a.in = in;
    a.n_seg = nseg;
    a.splits = k->splits;
    for (int i = 0; i < nseg && !bad; i++) {
        size_t m = (size_t)n * outs[i];
        gy[i] = malloc(sizeof(float) * m);
        cy[i] = malloc(sizeof(float) * m);
        for (size_t j = 0; j < m; j++) cy[i][j] = NAN;
        dy[i] = dput(cy[i], sizeof(float) * m); /* poisoned */
        if (!dy[i]) bad = 1;
        a.W[i] = W[i].d;
        a.bias[i] = k->bias ? (const float *)B[i].d : NULL;
        a.y[i] = dy[i];
        a.rows[i] = outs[i];
    }
    cudaStream_t s = ks_cuda_backend_stream(GPU);
    int nsm = ks_cuda_backend_sm_count(GPU);
    ks_status st = bad || !dx ? KS_ERR_OOM : ks_cuda_gemm_rows(s, &a, nsm);
    for (int i = 0; i < nseg && !st; i++) st = GPU->download(GPU, gy[i], dy[i], sizeof(float) * (size_t)n * outs[i]);
    if (st) { result(0, name, "%s", ks_last_error()); goto out; }
    double w = 0;
    for (int i = 0; i < nseg && !st; i++) {
        size_t m = (size_t)n * outs[i];
        st = ks_cpu_matmul(CPU, cy[i], xr, W[i].c, k->bias ? B[i].c : NULL, n, in, outs[i]);
        double *sc = abs_dots(xr, W[i].f, n, in, outs[i]);
        float *extra = malloc(sizeof(float) * m);
        for (size_t j = 0; j < m; j++) extra[j] = k->bias ? B[i].f[j % outs[i]] : 0;
        double wi = st ? INFINITY : worst(gy[i], cy[i], sc, extra, m, 1e-5);
        if (wi > w) w = wi;
        free(sc);
        free(extra);
    }
    /* the same call again: the same bits */
    int same = 1;
    if (!st) st = ks_cuda_gemm_rows(s, &a, nsm);
    for (int i = 0; i < nseg && !st; i++) {
        size_t m = (size_t)n * outs[i];
        float *g2 = malloc(sizeof(float) * m);
        st = GPU->download(GPU, g2, dy[i], sizeof(float) * m);
        if (!st && memcmp(g2, gy[i], sizeof(float) * m)) same = 0;
        free(g2);
    }
    result(!st && w <= 1.0 && same, name, "err/bound %.3g%s", w, same ? "" : ", runs differ");
out:
    for (int i = 0; i < 3; i++) {
        if (dy[i]) GPU->free(GPU, dy[i]);
        free(gy[i]);
        free(cy[i]);
        wfree(&W[i]);
        wfree(&B[i]);
    }
    if (dx) GPU->free(GPU, dx);
    free(x);
    free(xr);
}

static void refusals(void) {
    float *d = GPU->alloc(GPU, 4096);
    ks_gemm_rows_args a;
    memset(&a, 0, sizeof a);
    a.x = d;
    a.n = 4;
    a.in = 64;
    a.n_seg = 1;
    a.W[0] = d;
    a.y[0] = d;
    a.rows[0] = 8;
    cudaStream_t s = ks_cuda_backend_stream(GPU);
    struct { const char *name; int n, in, off, nseg; } c[] = {
        {"n 0 refused", 0, 64, 0, 1}, {"n 65 refused", 65, 64, 0, 1}, {"in 12 refused", 4, 12, 0, 1},
        {"x misaligned refused", 4, 64, 1, 1}, {"four segments refused", 4, 64, 0, 4}};
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
        ks_gemm_rows_args b = a;
        b.n = c[i].n;
        b.in = c[i].in;
        b.x = d + c[i].off;
        b.n_seg = c[i].nseg;
        ks_status st = ks_cuda_gemm_rows(s, &b, 132);
        result(st == KS_ERR_UNSUPPORTED && !strchr(ks_last_error(), '\n'), c[i].name, "%s", ks_last_error());
    }
    GPU->free(GPU, d);
}

/* the backend's fused q|k|v projection at n rows (the skinny GEMM up to 16 rows, cuBLAS above)
 * against the CPU's matmuls; D = 4096 at 64 rows is the batched step's shape (three cuBLAS GEMMs) */
static void backend_ops(int n, int D) {
    int QD = D, KD = D / 4;
    char name[120];
    wpair Wq, Wk, Wv, bq, bk, bv;
    int bad = wmake(&Wq, QD, D, 0.3f) | wmake(&Wk, KD, D, 0.3f) | wmake(&Wv, KD, D, 0.3f) | wmake(&bq, QD, 1, 1.f) |
              wmake(&bk, KD, 1, 1.f) | wmake(&bv, KD, 1, 1.f);
    size_t mx = (size_t)n * QD;
    float *x = malloc(sizeof(float) * n * D), *xr = malloc(sizeof(float) * n * D), *c1 = malloc(sizeof(float) * mx),
          *c2 = malloc(sizeof(float) * mx), *g1 = malloc(sizeof(float) * mx);
    for (int i = 0; i < n * D; i++) xr[i] = bf16r(x[i] = rndf());
    float *dx = dput(x, sizeof(float) * n * D), *d1 = dput(NULL, sizeof(float) * mx), *d2 = dput(NULL, sizeof(float) * mx),
          *d3 = dput(NULL, sizeof(float) * mx);
    ks_status st = bad || !dx || !d1 || !d2 || !d3 ? KS_ERR_OOM : KS_OK;
    /* q|k|v with biases, no norm, no rope, no cache: D / 64 query heads and D / 256 KV heads of 64 */
    if (!st) st = ks_cuda_dense_qkv(GPU, NULL, d1, d2, d3, dx, NULL, 0, NULL, Wq.g, Wk.g, Wv.g, bq.g, bk.g, bv.g, n, D, QD / 64, KD / 64, 64, NULL, NULL, 0);
    double w = 0;
    const wpair *ws[3] = {&Wq, &Wk, &Wv}, *bs[3] = {&bq, &bk, &bv};
    float *ds[3] = {d1, d2, d3};
    int os[3] = {QD, KD, KD};
    for (int i = 0; i < 3 && !st; i++) {
        if ((st = GPU->download(GPU, g1, ds[i], sizeof(float) * n * os[i])) ||
            (st = ks_cpu_matmul(CPU, c1, xr, ws[i]->c, bs[i]->c, n, D, os[i])))
            break;
        double *sc = abs_dots(xr, ws[i]->f, n, D, os[i]);
        for (int j = 0; j < n * os[i]; j++) c2[j] = bs[i]->f[j % os[i]];
        double wi = worst(g1, c1, sc, c2, (size_t)n * os[i], 1e-5);
        if (wi > w) w = wi;
        free(sc);
    }
    snprintf(name, sizeof name, "backend q|k|v + biases, n=%d, in=%d", n, D);
    result(!st && w <= 1, name, "err/bound %.3g %s", w, st ? ks_last_error() : "");
    wfree(&Wq), wfree(&Wk), wfree(&Wv), wfree(&bq), wfree(&bk), wfree(&bv);
    GPU->free(GPU, dx), GPU->free(GPU, d1), GPU->free(GPU, d2), GPU->free(GPU, d3);
    free(x), free(xr), free(c1), free(c2), free(g1);
}

/* q|k|v over joined weights (backend weights_join: one GEMM, q and k rotated out of its columns,
 * v copied out; cuda_dense.cu qkv_joined) against the CPU's matmuls and RoPE. The bound of a
 * rotated value is its pair's two bounds summed (the rotation mixes them). */
static void backend_joined(int n, int D, int rope) {
    int QD = D, KD = D / 4, hd = 64, H = QD / hd, Hkv = KD / hd, maxp = 9000;
    char name[120];
    wpair Wq, Wk, Wv;
    int bad = wmake(&Wq, QD, D, 0.3f) | wmake(&Wk, KD, D, 0.3f) | wmake(&Wv, KD, D, 0.3f);
    size_t mx = (size_t)n * QD;
    float *x = malloc(sizeof(float) * n * D), *xr = malloc(sizeof(float) * n * D), *c1 = malloc(sizeof(float) * mx),
          *g1 = malloc(sizeof(float) * mx);
    int32_t *pos = malloc(sizeof(int32_t) * n);
    for (int i = 0; i < n * D; i++) xr[i] = bf16r(x[i] = rndf());
    for (int i = 0; i < n; i++) pos[i] = maxp - 3 * (n - 1 - i);
    float *dx = dput(x, sizeof(float) * n * D), *d[3] = {dput(NULL, sizeof(float) * mx), dput(NULL, sizeof(float) * mx),
                                                       dput(NULL, sizeof(float) * mx)};
    ks_rope r = kt_rope_llama3(hd);
    ks_weight *js[3] = {Wq.g, Wk.g, Wv.g};
    ks_status st = bad || !dx || !d[0] || !d[1] || !d[2] ? KS_ERR_OOM : KS_OK;
    if (!st) st = GPU->weights_join ? GPU->weights_join(GPU, js, 3) : KS_ERR_UNSUPPORTED;
    if (!st) st = ks_cuda_dense_qkv(GPU, NULL, d[0], d[1], d[2], dx, NULL, 0, NULL, Wq.g, Wk.g, Wv.g, NULL, NULL, NULL, n, D, H,
                                    Hkv, hd, pos, rope ? &r : NULL, maxp);
    double w = 0;
    const wpair *ws[3] = {&Wq, &Wk, &Wv};
    const int os[3] = {QD, KD, KD}, hs[3] = {H, Hkv, Hkv};
    for (int i = 0; i < 3 && !st; i++) {
        if ((st = GPU->download(GPU, g1, d[i], sizeof(float) * n * os[i])) ||
            (st = ks_cpu_matmul(CPU, c1, xr, ws[i]->c, NULL, n, D, os[i])) ||
            (rope && i < 2 && (st = CPU->rope(CPU, c1, n, hs[i], pos, &r, maxp))))
            break;
        double *sc = abs_dots(xr, ws[i]->f, n, D, os[i]);
        if (rope && i < 2)
            for (size_t e = 0; e < (size_t)n * os[i]; e += hd)
                for (int k = 0; k < hd / 2; k++) sc[e + k] = sc[e + k + hd / 2] = sc[e + k] + sc[e + k + hd / 2];
        double wi = worst(g1, c1, sc, NULL, (size_t)n * os[i], 1e-5);
        if (wi > w) w = wi;
        free(sc);
    }
    snprintf(name, sizeof name, "backend q|k|v, joined weights%s, n=%d, in=%d", rope ? " + rope" : "", n, D);
    result(!st && w <= 1, name, "err/bound %.3g %s", w, st ? ks_last_error() : "");
    wfree(&Wq), wfree(&Wk), wfree(&Wv);
    for (int i = 0; i < 3; i++) GPU->free(GPU, d[i]);
    GPU->free(GPU, dx);
    free(x), free(xr), free(c1), free(g1), free(pos);
}

/* ks_cuda_rmsnorm_bf16 (the norm writing the next GEMM's bf16 input in the same launch) against
 * ks_cuda_rmsnorm then ks_cuda_convert: both outputs bit for bit (dim 4096: the register kernel;
 * dim 200 at an odd row offset: the plain one). */
static void rmsnorm_bf16_case(int n, int dim, int off) {
    char name[120];
    size_t m = (size_t)n * dim;
    float *x = malloc(sizeof(float) * (m + off)), *w = malloc(sizeof(float) * dim), *o1 = malloc(sizeof(float) * m),
          *o2 = malloc(sizeof(float) * m);
    uint16_t *b1 = malloc(2 * m), *b2 = malloc(2 * m);
    for (size_t i = 0; i < m + off; i++) x[i] = 3.0f * rndf();
    for (int i = 0; i < dim; i++) w[i] = 1.0f + 0.5f * rndf();
    float *dx = dput(x, sizeof(float) * (m + off)), *dw = dput(w, sizeof(float) * dim), *d1 = dput(NULL, sizeof(float) * m),
          *d2 = dput(NULL, sizeof(float) * m);
    void *db1 = dput(NULL, 2 * m), *db2 = dput(NULL, 2 * m);
    cudaStream_t s = ks_cuda_backend_stream(GPU);
    ks_status st = !dx || !dw || !d1 || !d2 || !db1 || !db2 ? KS_ERR_OOM : KS_OK;
    if (!st) st = ks_cuda_rmsnorm_bf16(s, d1, db1, dx + off, dw, n, dim, 1e-5f);
    if (!st) st = ks_cuda_rmsnorm(s, d2, dx + off, dw, n, dim, 1e-5f);
    if (!st) st = ks_cuda_convert(s, db2, KS_CUDA_BF16, d2, KS_CUDA_F32, m);
    if (!st && (cudaStreamSynchronize(s) || cudaMemcpy(o1, d1, sizeof(float) * m, cudaMemcpyDeviceToHost) ||
                cudaMemcpy(o2, d2, sizeof(float) * m, cudaMemcpyDeviceToHost) ||
                cudaMemcpy(b1, db1, 2 * m, cudaMemcpyDeviceToHost) || cudaMemcpy(b2, db2, 2 * m, cudaMemcpyDeviceToHost)))
        st = KS_ERR_DEVICE;
    snprintf(name, sizeof name, "rmsnorm with the bf16 copy, n=%d dim=%d offset=%d", n, dim, off);
    result(!st && !memcmp(o1, o2, sizeof(float) * m) && !memcmp(b1, b2, 2 * m), name, "%s",
           st ? ks_last_error() : "float32 and bf16 outputs bit-equal to rmsnorm + convert");
    GPU->free(GPU, dx), GPU->free(GPU, dw), GPU->free(GPU, d1), GPU->free(GPU, d2), GPU->free(GPU, db1), GPU->free(GPU, db2);
    free(x), free(w), free(o1), free(o2), free(b1), free(b2);
}

/* ------------------------------------------------------------------ the wgmma n-row GEMM */

static double silu_d(double g) { return g / (1.0 + exp(-g)); }

/* ks_cuda_gemm_wg at (n, in, out) against ks_cpu_matmul over the same bf16 values, SwiGLU in double */
static void run_wgcase(int n, int in, int out) {
    char name[160];
    snprintf(name, sizeof name, "wgmma gate|up + SwiGLU n=%d in=%d out=%d", n, in, out);
    wpair W, W2;
    memset(&W, 0, sizeof W);
    memset(&W2, 0, sizeof W2);
    size_t m = (size_t)n * out, nx = (size_t)n * in;
    uint16_t *xh = malloc(2 * nx), *gh = malloc(2 * m), *g2 = malloc(2 * m);
    float *xr = malloc(sizeof(float) * nx), *c1 = malloc(sizeof(float) * m), *c2 = malloc(sizeof(float) * m);
    for (size_t i = 0; i < nx; i++) xr[i] = ks_bf16_to_f32(xh[i] = ks_f32_to_bf16(2.0f * rndf()));
    for (size_t i = 0; i < m; i++) gh[i] = 0x7fc0; /* poison: NaN */
    int bad = wmake(&W, out, in, 0.5f) | wmake(&W2, out, in, 0.5f);
    void *dx = bad ? NULL : dput(xh, 2 * nx), *dy = bad ? NULL : dput(gh, 2 * m);
    ks_gemm_wg_args a = {dx, n, in, W.d, W2.d, out, dy};
    cudaStream_t s = ks_cuda_backend_stream(GPU);
    int nsm = ks_cuda_backend_sm_count(GPU);
    ks_status st = !dx || !dy ? KS_ERR_OOM : KS_OK;
    if (!st) st = ks_cuda_gemm_wg(s, &a, NULL, nsm);
    if (!st) st = GPU->download(GPU, gh, dy, 2 * m);
    if (!st) st = ks_cpu_matmul(CPU, c1, xr, W.c, NULL, n, in, out);
    if (!st) st = ks_cpu_matmul(CPU, c2, xr, W2.c, NULL, n, in, out);
    double w = INFINITY;
    if (!st) {
        double *sc = abs_dots(xr, W.f, n, in, out), *sc2 = abs_dots(xr, W2.f, n, in, out);
        w = 0;
        for (size_t i = 0; i < m; i++) { /* h = silu(g) u; |silu'| <= 1.1; the bf16 rounding 2^-9, doubled */
            double gg = c1[i], uu = c2[i], eg = 1e-5 * sc[i], eu = 1e-5 * sc2[i];
            double ref = silu_d(gg) * uu, g = ks_bf16_to_f32(gh[i]);
            double lim = fabs(ref) / 256.0 + 1.1 * fabs(uu) * eg + (fabs(silu_d(gg)) + 1.1 * eg) * eu + 1e-30;
            double e = isfinite(g) ? fabs(g - ref) / lim : INFINITY;
            if (e > w) w = e;
        }
        free(sc);
        free(sc2);
    }
    int same = 1; /* the same call again: the same bits */
    if (!st) st = ks_cuda_gemm_wg(s, &a, NULL, nsm);
    if (!st) st = GPU->download(GPU, g2, dy, 2 * m);
    if (!st) same = !memcmp(g2, gh, 2 * m);
    result(!st && w <= 1.0 && same, name, "err/bound %.3g%s %s (split %d)", w, same ? "" : ", runs differ",
           st ? ks_last_error() : "", st ? 0 : ks_cuda_gemm_wg_split(&a, nsm));
    wfree(&W);
    wfree(&W2);
    if (dx) GPU->free(GPU, dx);
    if (dy) GPU->free(GPU, dy);
    free(xh), free(gh), free(g2), free(xr), free(c1), free(c2);
}

static void wg_refusals(void) {
    void *d = GPU->alloc(GPU, 1 << 16);
    ks_gemm_wg_args a = {d, 4, 64, d, d, 64, d};
    cudaStream_t s = ks_cuda_backend_stream(GPU);
    struct { const char *name; int n, in, out, off, nowu; } c[] = {
        {"wgmma: n 0 refused", 0, 64, 64, 0, 0},      {"wgmma: n 65 refused", 65, 64, 64, 0, 0},
        {"wgmma: in 12 refused", 4, 12, 64, 0, 0},     {"wgmma: out 12 refused", 4, 64, 12, 0, 0},
        {"wgmma: x misaligned refused", 4, 64, 64, 2, 0}, {"wgmma: no up weights refused", 4, 64, 64, 0, 1}};
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
        ks_gemm_wg_args b = a;
        b.n = c[i].n;
        b.in = c[i].in;
        b.out = c[i].out;
        b.x = (char *)d + c[i].off;
        b.Wu = c[i].nowu ? NULL : d;
        ks_status st = ks_cuda_gemm_wg(s, &b, NULL, 132);
        result(st == KS_ERR_UNSUPPORTED && !strchr(ks_last_error(), '\n'), c[i].name, "%s", ks_last_error());
    }
    GPU->free(GPU, d);
}

/* the backend's n-row MLP (ks_cuda_dense_mlp_bf16: x += down(silu(xn Wg^T) * (xn Wu^T))) against
 * the CPU's matmuls with h unrounded: the GPU's h is bf16 (2^-9 of |h|), carried through down */
static void backend_mlp(int n, int dim, int ffn) {
    char name[120];
    wpair Wg, Wu, Wd;
    int bad = wmake(&Wg, ffn, dim, 0.3f) | wmake(&Wu, ffn, dim, 0.3f) | wmake(&Wd, dim, ffn, 0.3f);
    size_t nx = (size_t)n * dim, nh = (size_t)n * ffn;
    float *xn = malloc(sizeof(float) * nx), *xr = malloc(sizeof(float) * nx), *x0 = malloc(sizeof(float) * nx),
          *gx = malloc(sizeof(float) * nx), *cg = malloc(sizeof(float) * nh), *cu = malloc(sizeof(float) * nh),
          *h = malloc(sizeof(float) * nh), *cy = malloc(sizeof(float) * nx);
    for (size_t i = 0; i < nx; i++) {
        xr[i] = bf16r(xn[i] = rndf());
        x0[i] = 2.0f * rndf();
    }
    float *dxn = dput(xn, sizeof(float) * nx), *dx = dput(x0, sizeof(float) * nx);
    ks_status st = bad || !dxn || !dx ? KS_ERR_OOM : KS_OK;
    if (!st) st = ks_cuda_dense_mlp_bf16(GPU, dx, dxn, NULL, Wg.g, Wu.g, Wd.g, n, dim, ffn);
    if (!st) st = GPU->download(GPU, gx, dx, sizeof(float) * nx);
    if (!st) st = ks_cpu_matmul(CPU, cg, xr, Wg.c, NULL, n, dim, ffn);
    if (!st) st = ks_cpu_matmul(CPU, cu, xr, Wu.c, NULL, n, dim, ffn);
    for (size_t i = 0; i < nh && !st; i++) h[i] = (float)(silu_d(cg[i]) * cu[i]);
    if (!st) st = ks_cpu_matmul(CPU, cy, h, Wd.c, NULL, n, ffn, dim);
    double w = INFINITY;
    if (!st) {
        double *sc = abs_dots(h, Wd.f, n, ffn, dim);
        w = 0;
        for (size_t i = 0; i < nx; i++) {
            double lim = sc[i] / 256.0 + 1e-5 * (sc[i] + fabs(x0[i])) + 1e-30;
            double e = isfinite(gx[i]) ? fabs(gx[i] - ((double)x0[i] + cy[i])) / lim : INFINITY;
            if (e > w) w = e;
        }
        free(sc);
    }
    snprintf(name, sizeof name, "backend n-row MLP (gate|up + SwiGLU, down +=), n=%d dim=%d ffn=%d", n, dim, ffn);
    result(!st && w <= 1, name, "err/bound %.3g %s", w, st ? ks_last_error() : "");
    wfree(&Wg), wfree(&Wu), wfree(&Wd);
    GPU->free(GPU, dxn), GPU->free(GPU, dx);
    free(xn), free(xr), free(x0), free(gx), free(cg), free(cu), free(h), free(cy);
}

/* ------------------------------------------------------------------ timing (--bench) */

static cudaStream_t S;
static double g_copy;

typedef void (*op_fn)(void *ctx, int rep);
static double time_ms(op_fn f, void *ctx, int reps) {
    cudaEvent_t a, b;
    cudaEventCreate(&a);
    cudaEventCreate(&b);
    for (int i = 0; i < 3; i++) f(ctx, i);
    float best[64];
    for (int i = 0; i < reps; i++) {
        cudaEventRecord(a, S);
        f(ctx, i);
        cudaEventRecord(b, S);
        cudaEventSynchronize(b);
        cudaEventElapsedTime(&best[i], a, b);
    }
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    for (int i = 1; i < reps; i++) /* median */
        for (int j = i; j > 0 && best[j] < best[j - 1]; j--) { float t = best[j]; best[j] = best[j - 1]; best[j - 1] = t; }
    return best[reps / 2];
}

typedef struct bop {
    int nseg, in, rows[3];
    int n, nw, splits;
    ks_gemm_wg_cache *cache; /* the wgmma kernel's tensor maps (NULL: encoded every call) */
    void *W[8][3];
    float *x, *y[3];
    void *xb;
    cublasHandle_t h;
} bop;

static void run_cublas(void *p, int rep) { /* the engine's path without the kernel: convert, then the GEMMs */
    bop *o = p;
    ks_cuda_convert(S, o->xb, KS_CUDA_BF16, o->x, KS_CUDA_F32, (size_t)o->n * o->in);
    float one = 1, zero = 0;
    for (int i = 0; i < o->nseg; i++)
        cublasGemmEx(o->h, CUBLAS_OP_T, CUBLAS_OP_N, o->rows[i], o->n, o->in, &one, o->W[rep % o->nw][i], CUDA_R_16BF, o->in,
                     o->xb, CUDA_R_16BF, o->in, &zero, o->y[i], CUDA_R_32F, o->rows[i], CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
}
static void run_gemm_only(void *p, int rep) { /* cuBLAS's GEMMs alone on bf16 x */
    bop *o = p;
    float one = 1, zero = 0;
    for (int i = 0; i < o->nseg; i++)
        cublasGemmEx(o->h, CUBLAS_OP_T, CUBLAS_OP_N, o->rows[i], o->n, o->in, &one, o->W[rep % o->nw][i], CUDA_R_16BF, o->in,
                     o->xb, CUDA_R_16BF, o->in, &zero, o->y[i], CUDA_R_32F, o->rows[i], CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
}
static void run_skinny(void *p, int rep) {
    bop *o = p;
    ks_gemm_rows_args a;
    memset(&a, 0, sizeof a);
    a.x = o->x;
    a.n = o->n;
    a.in = o->in;
    a.n_seg = o->nseg;
    a.splits = o->splits;
    for (int i = 0; i < o->nseg; i++) {
        a.W[i] = o->W[rep % o->nw][i];
        a.y[i] = o->y[i];
        a.rows[i] = o->rows[i];
    }
    if (ks_cuda_gemm_rows(S, &a, ks_cuda_backend_sm_count(GPU))) fprintf(stderr, "skinny: %s\n", ks_last_error());
}

static void run_wg(void *p, int rep) {
    bop *o = p;
    ks_gemm_wg_args a = {o->xb, o->n, o->in, o->W[rep % o->nw][0], o->W[rep % o->nw][1], o->rows[0], o->y[0]};
    if (ks_cuda_gemm_wg(S, &a, o->cache, ks_cuda_backend_sm_count(GPU))) fprintf(stderr, "wgmma: %s\n", ks_last_error());
}

static void line(const char *name, int n, const char *what, double ms, double gb) {
    char l[160];
    snprintf(l, sizeof l, "%s n=%d: %s", name, n, what);
    printf("%-60s %9.1f us %7.0f GB/s %4.0f%%\n", l, ms * 1e3, gb / (ms * 1e-3), 100 * gb / (ms * 1e-3) / g_copy);
}

static void bench_op(cublasHandle_t h, const char *name, int nseg, int in, const int *rows, int n) {
    bop o;
    memset(&o, 0, sizeof o);
    o.nseg = nseg;
    o.in = in;
    o.n = n;
    o.h = h;
    size_t wb = 0;
    for (int i = 0; i < nseg; i++) { o.rows[i] = rows[i]; wb += (size_t)rows[i] * in * 2; }
    o.nw = (int)KS_MIN((size_t)8, ((size_t)400 << 20) / wb + 1); /* rotate: > 400 MB of weights, beyond any L2 */
    for (int c = 0; c < o.nw; c++)
        for (int i = 0; i < nseg; i++) {
            cudaMalloc(&o.W[c][i], (size_t)rows[i] * in * 2);
            ks_cuda_random(S, o.W[c][i], KS_CUDA_BF16, rows[i], in, 100 + c * 3 + i, 0.1f, 0.f);
        }
    cudaMalloc((void **)&o.x, sizeof(float) * n * in);
    ks_cuda_random(S, o.x, KS_CUDA_F32, n, in, 7, 1.f, 0.f);
    cudaMalloc(&o.xb, 2 * (size_t)n * in);
    for (int i = 0; i < nseg; i++) cudaMalloc((void **)&o.y[i], sizeof(float) * n * rows[i]);
    double gb = wb / 1e9;
    if (n >= 2) line(name, n, "convert + cuBLAS", time_ms(run_cublas, &o, 21), gb); /* one row: the engine's gemv */
    ks_cuda_convert(S, o.xb, KS_CUDA_BF16, o.x, KS_CUDA_F32, (size_t)n * in);
    line(name, n, "cuBLAS GEMM alone (bf16 x)", time_ms(run_gemm_only, &o, 21), gb);
    if (nseg != 2 && n <= 16) line(name, n, "skinny (split auto)", time_ms(run_skinny, &o, 21), gb);
    if (n >= 2 && nseg == 2) { /* gate|up: the wgmma kernel with the SwiGLU */
        o.cache = ks_cuda_gemm_wg_cache_create();
        ks_gemm_wg_args a = {o.xb, n, in, o.W[0][0], o.W[0][1], rows[0], o.y[0]};
        char what[48];
        snprintf(what, sizeof what, "wgmma (+ SwiGLU), split %d", ks_cuda_gemm_wg_split(&a, ks_cuda_backend_sm_count(GPU)));
        line(name, n, what, time_ms(run_wg, &o, 21), gb);
        ks_cuda_gemm_wg_cache_free(o.cache);
    }
    fflush(stdout);
    for (int c = 0; c < o.nw; c++)
        for (int i = 0; i < nseg; i++) cudaFree(o.W[c][i]);
    for (int i = 0; i < nseg; i++) cudaFree(o.y[i]);
    cudaFree(o.x), cudaFree(o.xb);
}

static void bench(void) {
    S = ks_cuda_backend_stream(GPU);
    size_t bytes = (size_t)1 << 30;
    void *a, *b;
    cudaMalloc(&a, bytes);
    cudaMalloc(&b, bytes);
    cudaMemsetAsync(a, 1, bytes, S);
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    float best = 1e9;
    for (int i = 0; i < 10; i++) {
        cudaEventRecord(e0, S);
        cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, S);
        cudaEventRecord(e1, S);
        cudaEventSynchronize(e1);
        float ms;
        cudaEventElapsedTime(&ms, e0, e1);
        if (i >= 2 && ms < best) best = ms;
    }
    g_copy = 2.0 * bytes / (best * 1e-3) / 1e9;
    cudaFree(a);
    cudaFree(b);
    struct cudaDeviceProp prop;
    cudaGetDeviceProperties(&prop, 0);
    printf("\ndevice: %s, %d SMs; copy (read + write) %.0f GB/s (best of 8, 1 GiB); %% = of that\n", prop.name,
           prop.multiProcessorCount, g_copy);
    cublasHandle_t h;
    if (cublasCreate(&h)) { printf("cublasCreate failed\n"); return; }
    cublasSetStream(h, S);
    int qkv[3] = {4096, 1024, 1024}, qkvj[1] = {6144}, o[1] = {4096}, gu[3] = {14336, 14336}, dn[1] = {4096}, lm[1] = {128256};
    int ns[] = {1, 4, 16, 64};
    for (int i = 0; i < 4; i++) {
        bench_op(h, "q|k|v 4096->4096+1024+1024", 3, 4096, qkv, ns[i]);
        bench_op(h, "q|k|v joined 4096->6144", 1, 4096, qkvj, ns[i]);
        bench_op(h, "o 4096->4096", 1, 4096, o, ns[i]);
        bench_op(h, "gate|up 4096->2x14336", 2, 4096, gu, ns[i]);
        bench_op(h, "down 14336->4096", 1, 14336, dn, ns[i]);
        bench_op(h, "lm_head 4096->128256", 1, 4096, lm, ns[i]);
    }
    cublasDestroy(h);
}

int main(int argc, char **argv) {
    int quick = 0, do_bench = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick")) quick = 1;
        else if (!strcmp(argv[i], "--bench")) do_bench = 1;
        else { fprintf(stderr, "usage: %s [--quick] [--bench]\n", argv[0]); return 2; }
    }
    ks_backend_opts go = ks_backend_opts_default();
    go.graphs = 0;
    if (ks_cpu_backend_create(NULL, &CPU) || ks_cuda_backend_create(&go, &GPU)) {
        fprintf(stderr, "backends: %s\n", ks_last_error());
        return 2;
    }
    static const kcase cs[] = {
        {2, 64, 16, 1, 0, 0},    {16, 256, 300, 1, 1, 0},  {64, 4096, 256, 1, 0, 0}, {64, 4096, 256, 1, 0, 8},
        {17, 200, 1000, 1, 1, 3}, {33, 520, 37, 1, 1, 0},  {9, 4096, 1000, 1, 0, 0}, {5, 1024, 512, 3, 1, 0},
        {64, 1024, 600, 3, 0, 2}, {16, 4096, 1536, 3, 1, 8}, {1, 128, 100, 1, 1, 0},  {3, 14336, 64, 1, 0, 0},
        {40, 8, 33, 1, 0, 1},    {24, 2048, 520, 2, 1, 4},
    };
    int nc = (int)(sizeof cs / sizeof cs[0]);
    for (int i = 0; i < nc; i++)
        if (!quick || cs[i].in <= 4096) run_kcase(&cs[i]);
    refusals();
    backend_ops(5, 256);
    backend_ops(16, 256);
    backend_ops(64, 256);
    backend_ops(64, 4096);
    backend_joined(64, 256, 0);
    backend_joined(33, 256, 1);
    backend_joined(64, 4096, 1);
    rmsnorm_bf16_case(64, 4096, 0);
    rmsnorm_bf16_case(5, 200, 1);
    static const int wc[][3] = {
        {2, 64, 128},    {64, 256, 512},  {5, 200, 72},    {33, 520, 136}, {17, 1032, 264},
        {16, 64, 8},     {64, 14336, 64}, {64, 4096, 1024}, {48, 2048, 8000},
    };
    for (size_t i = 0; i < sizeof wc / sizeof wc[0]; i++)
        if (!quick || (double)wc[i][0] * wc[i][1] * wc[i][2] <= 2e8) run_wgcase(wc[i][0], wc[i][1], wc[i][2]);
    wg_refusals();
    backend_mlp(64, 256, 512);
    backend_mlp(9, 520, 264);
    printf("%d passed, %d failed\n", g_pass, g_fail);
    if (do_bench) bench();
    GPU->destroy(GPU);
    CPU->destroy(CPU);
    return g_fail ? 1 : 0;
}
