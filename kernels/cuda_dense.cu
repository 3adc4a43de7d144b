/* cuda_dense.cu — the CUDA backend's weights and dense operations (ks_cuda_dense.h): weight
 * upload and conversion, matmul (cuBLAS GEMMs, the one-row gemv), the fused norm + q|k|v + RoPE
 * (+ KV row) and norm + gate|up + SwiGLU projections, the chunked bf16 prefill MLP, embed,
 * rmsnorm, rope (with the device inv_freq cache), swiglu, add and gather_rows. The forward ops
 * of backend.h are composed of these in cuda_layer.cu.
 *
 * Weights are bf16 (vectors float32), activations float32. GEMMs: cuBLAS bf16 x bf16 -> float32
 * with float32 compute, the float32 activations converted to bf16 in a scratch buffer first;
 * except the q|k|v projection of 2..16 rows (a batched decode step of up to 16 sessions), which
 * takes the skinny GEMM (gemm_rows.cuh: one launch for the three projections and their biases,
 * x rounded to bf16 as it is staged). Measured on an H200 (bench/NOTES.md, "the batched step's
 * dense layers"): 25.8 against 41.6 us at 4 rows, 28.3 against 40.4 us at 16; at 64 rows, and
 * for the o, gate|up, down and lm_head shapes at any row count, cuBLAS was as fast or faster.
 * Weights joined by the model (weights_join: q|k|v back to back, gate|up back to back) are taken
 * as one matrix where that pays: q|k|v of 17..QKV_JOIN_ROWS rows as one GEMM (qkv_joined), and
 * the n-row MLP's gate and up as one strided-batched GEMM (bench/NOTES.md "Joined weights"); for
 * 2..64 rows (a batched decode step) the MLP's gate|up and SwiGLU are one wgmma launch instead
 * (gemm_wg.cuh; bench/NOTES.md, session 17), the down projection cuBLAS. */
#include "cuda_backend_int.h"
#include "gemm_rows.cuh"
#include "gemm_wg.cuh"
#include "gemv.cuh"
#include "rmsnorm.cuh"

#include <stdlib.h>
#include <string.h>

#define MM_CONV_BYTES ((size_t)64 << 20) /* bf16 copy of a matmul's input: converted in row chunks of this size */
#define QKV_SKINNY_ROWS 16 /* q|k|v of up to this many rows: the skinny GEMM (measured: header) */
#define QKV_JOIN_ROWS 1024 /* q|k|v of more rows, up to this many: one GEMM over joined weights (batched
                            * decode, short prefill chunks; its (n, QD + 2 KD) temporary stays small) */

/* ================================================================ weights */

static int st_type(ks_dtype dt) {
    return dt == KS_DT_F32 ? KS_CUDA_F32 : dt == KS_DT_F16 ? KS_CUDA_F16 : dt == KS_DT_BF16 ? KS_CUDA_BF16 : -1;
}

static ks_status cu_weight_create(ks_backend *b, const ks_st_tensor *t, int64_t row0, int64_t rows, ks_weight **out) {
    cuda_ctx *c = CTX(b);
    *out = NULL;
    if (t->ndim < 1 || t->ndim > 2) return ks_errorf(KS_ERR_SHAPE, "tensor %s: expected 1 or 2 dims, has %d", t->name, t->ndim);
    int64_t cols = t->ndim == 1 ? 1 : t->shape[1], trows = t->shape[0];
    if (row0 < 0 || rows < 0 || row0 + rows > trows)
        return ks_errorf(KS_ERR_SHAPE, "tensor %s: rows [%lld, %lld) out of its %lld rows", t->name, (long long)row0,
                         (long long)(row0 + rows), (long long)trows);
    int src = st_type(t->dtype);
    if (src < 0)
        return ks_errorf(KS_ERR_DTYPE, "tensor %s: dtype %s is not a float type (F32, F16 or BF16)", t->name,
                         ks_dtype_name(t->dtype));
    ks_weight *w = (ks_weight *)ks_calloc(1, sizeof *w);
    if (!w) return KS_ERR_OOM;
    w->rows = rows;
    w->cols = cols;
    w->type = cols == 1 ? KS_CUDA_F32 : KS_CUDA_BF16;
    size_t n = (size_t)rows * cols, esz = ks_dtype_size(t->dtype), osz = w->type == KS_CUDA_F32 ? 4 : 2;
    const unsigned char *sp = (const unsigned char *)t->data + (size_t)row0 * cols * esz;
    ks_status st = raw_alloc(c, n * osz, t->name, &w->data);
    if (st) { free(w); return st; }
    if (src == w->type) {
        cudaError_t e = cudaMemcpyAsync(w->data, sp, n * esz, cudaMemcpyHostToDevice, c->stream);
        if (!e) e = cudaStreamSynchronize(c->stream);
        if (e) st = ks_cuda_status(e, "weight upload");
    } else {
        /* convert on the device, in chunks of up to 64 MiB of source */
        size_t chunk = ((size_t)64 << 20) / esz;
        void *tmp = NULL;
        st = dev_alloc(c, KS_MIN(chunk, n) * esz, "weight conversion", &tmp);
        for (size_t i = 0; !st && i < n; i += chunk) {
            size_t m = KS_MIN(chunk, n - i);
            cudaError_t e = cudaMemcpyAsync(tmp, sp + i * esz, m * esz, cudaMemcpyHostToDevice, c->stream);
            if (e) { st = ks_cuda_status(e, "weight upload"); break; }
            st = ks_cuda_convert(c->stream, (unsigned char *)w->data + i * osz, w->type, tmp, src, m);
            if (!st) st = ks_cuda_status(cudaStreamSynchronize(c->stream), "weight conversion");
        }
        dev_free(c, tmp);
    }
    if (st) { raw_free(c, w->data); free(w); return ks_error_prefix(st, "tensor %s", t->name); }
    *out = w;
    return KS_OK;
}

static ks_status cu_weight_random(ks_backend *b, int64_t rows, int64_t cols, uint64_t seed, float scale, float offset,
                                  ks_weight **out) {
    cuda_ctx *c = CTX(b);
    *out = NULL;
    if (rows < 0 || cols < 1) return ks_errorf(KS_ERR_SHAPE, "weight_random: bad shape (%lld, %lld)", (long long)rows, (long long)cols);
    ks_weight *w = (ks_weight *)ks_calloc(1, sizeof *w);
    if (!w) return KS_ERR_OOM;
    w->rows = rows;
    w->cols = cols;
    w->type = cols == 1 ? KS_CUDA_F32 : KS_CUDA_BF16;
    size_t n = (size_t)rows * cols;
    ks_status st = raw_alloc(c, n * (w->type == KS_CUDA_F32 ? 4 : 2), "random weight", &w->data);
    if (!st) st = ks_cuda_random(c->stream, w->data, w->type, rows, cols, seed, scale, offset);
    if (!st) st = ks_cuda_status(cudaStreamSynchronize(c->stream), "random weight");
    if (st) { raw_free(c, w->data); free(w); return st; }
    *out = w;
    return KS_OK;
}

static void cu_weight_free(ks_backend *b, ks_weight *w) {
    if (!w) return;
    cuda_ctx *c = CTX(b);
    cudaStreamSynchronize(c->stream);
    if (!w->view) raw_free(c, w->data);
    free(w);
}

/* backend.h weights_join: one buffer for ws[0..n) in order (device copies, then the old buffers
 * freed); ws[0] owns it, the others are views. Out of memory or unlike weights: left as they are. */
static ks_status cu_weights_join(ks_backend *b, ks_weight *const *ws, int n) {
    cuda_ctx *c = CTX(b);
    size_t total = 0;
    for (int i = 0; i < n; i++) {
        if (!ws[i] || ws[i]->view || ws[i]->type != KS_CUDA_BF16 || ws[i]->cols != ws[0]->cols || ws[i]->cols < 2)
            return KS_OK;
        total += (size_t)ws[i]->rows * ws[i]->cols * 2;
    }
    void *buf = NULL;
    if (n < 2 || raw_alloc(c, total, "joined weights", &buf)) {
        ks_clear_error();
        return KS_OK;
    }
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        size_t bytes = (size_t)ws[i]->rows * ws[i]->cols * 2;
        cudaError_t e = cudaMemcpyAsync((char *)buf + off, ws[i]->data, bytes, cudaMemcpyDeviceToDevice, c->stream);
        if (e) { cudaStreamSynchronize(c->stream); raw_free(c, buf); return ks_cuda_status(e, "joining weights"); }
        off += bytes;
    }
    cudaError_t e = cudaStreamSynchronize(c->stream);
    if (e) { raw_free(c, buf); return ks_cuda_status(e, "joining weights"); }
    off = 0;
    for (int i = 0; i < n; i++) {
        raw_free(c, ws[i]->data);
        ws[i]->data = (char *)buf + off;
        ws[i]->view = i > 0;
        off += (size_t)ws[i]->rows * ws[i]->cols * 2;
    }
    return KS_OK;
}

/* Do the bf16 weights W[0..n) lie back to back in one buffer (weights_join), so that they can be
 * one matrix? */
static int weights_adjacent(const ks_weight *const *W, int n) {
    if (W[0]->type != KS_CUDA_BF16) return 0;
    for (int i = 1; i < n; i++)
        if (W[i]->type != W[0]->type || W[i]->cols != W[0]->cols ||
            (const char *)W[i]->data != (const char *)W[i - 1]->data + (size_t)W[i - 1]->rows * W[i - 1]->cols * 2)
            return 0;
    return 1;
}

/* ================================================================ dense ops */

/* The gate and up GEMMs of joined weights (weights_join: W_up right after W_gate, both (out, in))
 * as one strided-batched call: y (n, out) bf16 = x W_gate^T, then y + n * out = x W_up^T. */
static ks_status gemm_bf16_pair(cuda_ctx *c, void *y, const void *xb, const ks_weight *Wg, int n, int in, int out) {
    const float one = 1.0f, zero = 0.0f;
    return blas_status(cublasGemmStridedBatchedEx(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, out, n, in, &one, Wg->data, CUDA_R_16BF,
                                                  in, (long long)out * in, xb, CUDA_R_16BF, in, 0, &zero, y, CUDA_R_16BF, out,
                                                  (long long)out * n, 2, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                       "matmul (cublasGemmStridedBatchedEx gate|up)");
}

static ks_status stats_begin(ks_backend *b, double *t0);
static ks_status stats_end(ks_backend *b, double t0, double flop);

/* y (n, out) = beta * y + x W^T: x (n, in) bf16, W (out, in) bf16, y float32 (yt CUDA_R_32F) or
 * bf16 (CUDA_R_16BF); float32 accumulation */
static ks_status gemm_bf16(cuda_ctx *c, void *y, cudaDataType yt, const void *xb, const ks_weight *W, int n, int in,
                           int out, float beta) {
    const float one = 1.0f;
    return blas_status(cublasGemmEx(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, out, n, in, &one, W->data, CUDA_R_16BF, in, xb,
                                    CUDA_R_16BF, in, &beta, y, yt, out, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                       yt == CUDA_R_16BF ? "matmul (cublasGemmEx bf16 -> bf16)" : "matmul (cublasGemmEx bf16)");
}

/* ys[i] (n, outs[i]) = beta * ys[i] + x Ws[i]^T for i < nw (bf16 weights, float32 outputs): x (n,
 * in) float32 converted to bf16 in row chunks of at most MM_CONV_BYTES (a 128K-row input would
 * otherwise need a 1 GiB temporary), each chunk once for all nw GEMMs */
static ks_status gemm_rows_bf16(cuda_ctx *c, const float *x, int n, int in, int nw, const ks_weight *const *Ws,
                                float *const *ys, const int *outs, float beta) {
    int rc = (int)KS_MAX((size_t)1, KS_MIN((size_t)n, MM_CONV_BYTES / ((size_t)in * 2)));
    void *xb = NULL;
    ks_status st = dev_alloc(c, (size_t)rc * in * 2, "matmul input (bf16)", &xb);
    for (int r0 = 0; r0 < n && !st; r0 += rc) {
        int rn = KS_MIN(rc, n - r0);
        st = ks_cuda_convert(c->stream, xb, KS_CUDA_BF16, x + (size_t)r0 * in, KS_CUDA_F32, (size_t)rn * in);
        for (int i = 0; i < nw && !st; i++)
            st = gemm_bf16(c, ys[i] + (size_t)r0 * outs[i], CUDA_R_32F, xb, Ws[i], rn, in, outs[i], beta);
    }
    dev_free(c, xb);
    return st;
}

/* y = x W^T + bias (acc = 0) or y += x W^T + bias (acc = 1) */
static ks_status matmul_impl(ks_backend *b, float *y, const float *x, const ks_weight *W, const ks_weight *bias, int n,
                             int in, int out, int acc) {
    cuda_ctx *c = CTX(b);
    if (W->cols != in || W->rows != out)
        return ks_errorf(KS_ERR_INTERNAL, "matmul: weight is (%lld, %lld), expected (%d, %d)", (long long)W->rows,
                         (long long)W->cols, out, in);
    if (n <= 0) return KS_OK;
    double t0 = 0;
    if (b->count_stats) {
        if (c->rec) return rec_fail(c, "a timed matmul (count_stats)");
        KS_CU(cudaStreamSynchronize(c->stream), "matmul (timing)");
        t0 = ks_now();
    }
    const float one = 1.0f, zero = 0.0f, *beta = acc ? &one : &zero;
    ks_status st;
    if (c->o.decode_kernels && W->type == KS_CUDA_BF16 && n == 1 && ks_cuda_gemv_supported(W->data, in) && (uintptr_t)x % 16 == 0 &&
        (!bias || bias->type == KS_CUDA_F32)) {
        /* one row (decode, logits): stream the bf16 weights once, float32 input, bias fused */
        if (bias && bias->rows * bias->cols != out)
            return ks_errorf(KS_ERR_INTERNAL, "matmul: bias of %lld values for %d outputs", (long long)(bias->rows * bias->cols), out);
        st = (acc ? ks_cuda_gemv_acc : ks_cuda_gemv)(c->stream, y, x, W->data, bias ? (const float *)bias->data : NULL, in, out,
                                                     c->o.pdl);
        if (st) return st;
        bias = NULL;
    } else if (W->type == KS_CUDA_BF16) {
        st = gemm_rows_bf16(c, x, n, in, 1, &W, &y, &out, acc ? 1.0f : 0.0f);
    } else {
        st = blas_status(cublasGemmEx(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, out, n, in, &one, W->data, CUDA_R_32F, in, x,
                                      CUDA_R_32F, in, beta, y, CUDA_R_32F, out, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                         "matmul (cublasGemmEx f32)");
    }
    if (st) return st;
    if (bias) {
        if (bias->type != KS_CUDA_F32 || bias->rows * bias->cols != out)
            return ks_errorf(KS_ERR_INTERNAL, "matmul: bias of %lld values for %d outputs", (long long)(bias->rows * bias->cols), out);
        if ((st = ks_cuda_add_bias(c->stream, y, (const float *)bias->data, n, out))) return st;
    }
    if (b->count_stats) {
        KS_CU(cudaStreamSynchronize(c->stream), "matmul (timing)");
        b->stat_matmul_s += ks_now() - t0;
    }
    b->stat_matmul_flop += 2.0 * n * in * out;
    return KS_OK;
}

ks_status ks_cuda_dense_matmul(ks_backend *b, float *y, const float *x, const ks_weight *W, const ks_weight *bias, int n,
                               int in, int out) {
    return matmul_impl(b, y, x, W, bias, n, in, out, 0);
}
ks_status ks_cuda_dense_matmul_add(ks_backend *b, float *y, const float *x, const ks_weight *W, const ks_weight *bias,
                                   int n, int in, int out) {
    return matmul_impl(b, y, x, W, bias, n, in, out, 1);
}

/* y += xb W^T + bias with xb already bf16 (n, in) (the batched attention's copy of its rows):
 * the GEMM without the conversion; bf16 weights only */
ks_status ks_cuda_dense_matmul_add_bf16x(ks_backend *b, float *y, const void *xb, const ks_weight *W, const ks_weight *bias,
                                         int n, int in, int out) {
    cuda_ctx *c = CTX(b);
    if (W->cols != in || W->rows != out || W->type != KS_CUDA_BF16)
        return ks_errorf(KS_ERR_INTERNAL, "matmul (bf16 input): weight is (%lld, %lld), expected (%d, %d) bf16",
                         (long long)W->rows, (long long)W->cols, out, in);
    if (bias && (bias->type != KS_CUDA_F32 || bias->rows * bias->cols != out))
        return ks_errorf(KS_ERR_INTERNAL, "matmul: bias of %lld values for %d outputs", (long long)(bias->rows * bias->cols), out);
    if (n <= 0) return KS_OK;
    double t0;
    ks_status st = stats_begin(b, &t0);
    if (!st) st = gemm_bf16(c, y, CUDA_R_32F, xb, W, n, in, out, 1.0f);
    if (!st && bias) st = ks_cuda_add_bias(c->stream, y, (const float *)bias->data, n, out);
    if (!st) st = stats_end(b, t0, 2.0 * n * in * out);
    return st;
}

static ks_status rope_inv_dev(cuda_ctx *c, const ks_rope *r, int max_pos, const float **out);

/* bench counters for a fused call: like matmul_impl's (a timed call synchronises) */
static ks_status stats_begin(ks_backend *b, double *t0) {
    *t0 = 0;
    if (!b->count_stats) return KS_OK;
    if (CTX(b)->rec) return rec_fail(CTX(b), "a timed matmul (count_stats)");
    KS_CU(cudaStreamSynchronize(CTX(b)->stream), "matmul (timing)");
    *t0 = ks_now();
    return KS_OK;
}
static ks_status stats_end(ks_backend *b, double t0, double flop) {
    if (b->count_stats) {
        KS_CU(cudaStreamSynchronize(CTX(b)->stream), "matmul (timing)");
        b->stat_matmul_s += ks_now() - t0;
    }
    b->stat_matmul_flop += flop;
    return KS_OK;
}

static int gemv_weight_ok(const ks_weight *W, int in, int out) {
    return W->type == KS_CUDA_BF16 && W->cols == in && W->rows == out && ks_cuda_gemv_supported(W->data, in);
}
static int vec_ok(const ks_weight *v, int n) { return !v || (v->type == KS_CUDA_F32 && v->rows * v->cols == n); }


/* A fused call's norm: into the gemv (*nw set) when the kernel takes it, else ks_cuda_rmsnorm
 * first (x then points at xn). */
static ks_status fused_norm(ks_backend *b, const float **x, const ks_weight *norm, float eps, float *xn, int n, int in,
                            int gemv, const float **nw) {
    *nw = NULL;
    if (!norm) return KS_OK;
    if (gemv && norm->type == KS_CUDA_F32 && norm->rows * norm->cols == in &&
        ks_cuda_gemv_norm_supported(*x, (const float *)norm->data, in) && (uintptr_t)xn % 16 == 0) {
        *nw = (const float *)norm->data;
        return KS_OK;
    }
    ks_status st = ks_cuda_dense_rmsnorm(b, xn, *x, norm, n, in, eps);
    *x = xn;
    return st;
}

/* q|k|v of n rows over joined weights (weights_join: Wq, Wk, Wv back to back from Wq->data): one
 * GEMM into Y (n, QD + 2 KD), then q and k rotated and v copied out of Y's columns in one launch
 * (ks_cuda_rope_qkv; three 2-D copies where there is no RoPE): one GEMM instead of three. xb: x
 * already as bf16 (the norm wrote it), or NULL (converted here). */
static ks_status qkv_joined(ks_backend *b, float *q, float *k, float *v, const float *x, const void *xb,
                            const ks_weight *Wq, int n, int in, int QD, int KD, int H, int Hkv, int hd,
                            const int32_t *pos, const ks_rope *r, int max_pos) {
    cuda_ctx *c = CTX(b);
    const int T = QD + 2 * KD;
    ks_weight J = *Wq; /* the three as one (T, in) matrix */
    J.rows = T;
    const ks_weight *Jp = &J;
    float *Y = NULL;
    void *d_pos = NULL;
    const float *inv = NULL;
    double t0;
    ks_status st = stats_begin(b, &t0);
    if (!st) st = dev_alloc(c, sizeof(float) * (size_t)n * T, "q|k|v (joined)", (void **)&Y);
    if (!st) st = xb ? gemm_bf16(c, Y, CUDA_R_32F, xb, Jp, n, in, T, 0.0f) : gemm_rows_bf16(c, x, n, in, 1, &Jp, &Y, &T, 0.0f);
    if (!st) st = stats_end(b, t0, 2.0 * n * in * T);
    if (!st && r) st = rope_inv_dev(c, r, max_pos, &inv);
    const int inl = n <= KS_CUDA_ROPE_POS_INLINE; /* the positions as the kernel's argument: no upload */
    if (!st && r && !inl) st = upload_tmp(c, pos, sizeof(int32_t) * n, "rope positions", &d_pos);
    if (!st && r)
        st = ks_cuda_rope_qkv(c->stream, q, k, v, Y, n, H, Hkv, hd, inl ? pos : (const int32_t *)d_pos, inl, inv,
                              (float)r->attn_factor);
    const float *src[3] = {Y, Y + QD, Y + QD + KD};
    float *dst[3] = {q, k, v};
    const int w[3] = {QD, KD, KD};
    for (int i = 0; i < 3 && !st && !r; i++)
        st = ks_cuda_status(cudaMemcpy2DAsync(dst[i], sizeof(float) * w[i], src[i], sizeof(float) * T, sizeof(float) * w[i],
                                              (size_t)n, cudaMemcpyDeviceToDevice, c->stream),
                            "q|k|v (joined) columns");
    dev_free(c, d_pos);
    dev_free(c, Y);
    return st;
}

/* ks_cuda_dense_qkv: the projections, and with L non-NULL then kv_append(L, k, v, pos, n); on
 * the one-row gemv path the kernel stores the new cache row itself (no kv_append launch) */
static ks_status qkv_impl(ks_backend *b, float *q, float *k, float *v, const float *x, const ks_weight *norm, float eps,
                          float *xn, const ks_weight *Wq, const ks_weight *Wk, const ks_weight *Wv, const ks_weight *bq,
                          const ks_weight *bk, const ks_weight *bv, int n, int in, int H, int Hkv, int hd,
                          const int32_t *pos, const ks_rope *r, int max_pos, ks_kv_layer *L) {
    cuda_ctx *c = CTX(b);
    int QD = H * hd, KD = Hkv * hd;
    if (r && r->head_dim != hd)
        return ks_errorf(KS_ERR_UNSUPPORTED, "q|k|v projection: rope over %d of %d head dims", r->head_dim, hd);
    ks_status st;
    int gemv = n == 1 && c->o.decode_kernels && (uintptr_t)x % 16 == 0 && gemv_weight_ok(Wq, in, QD) &&
               gemv_weight_ok(Wk, in, KD) && gemv_weight_ok(Wv, in, KD) && vec_ok(bq, QD) && vec_ok(bk, KD) &&
               vec_ok(bv, KD) && (!r || (hd % 2 == 0 && hd <= 1024));
    const ks_weight *Wj[3] = {Wq, Wk, Wv};
    const int joined = !gemv && !c->rec && n > QKV_SKINNY_ROWS && n <= QKV_JOIN_ROWS && !bq && !bk && !bv &&
                       Wq->type == KS_CUDA_BF16 && Wq->cols == in && Wq->rows == QD && Wk->rows == KD && Wv->rows == KD &&
                       weights_adjacent(Wj, 3);
    const float *nw = NULL;
    void *xb = NULL; /* joined with a norm: the norm writes the GEMM's bf16 input too (no conversion launch) */
    if (joined && norm && norm->type == KS_CUDA_F32 && norm->rows * norm->cols == in) {
        if ((st = dev_alloc(c, (size_t)n * in * 2, "q|k|v input (bf16)", &xb)) ||
            (st = ks_cuda_rmsnorm_bf16(c->stream, xn, xb, x, (const float *)norm->data, n, in, eps))) {
            dev_free(c, xb);
            return st;
        }
        x = xn;
    } else if ((st = fused_norm(b, &x, norm, eps, xn, n, in, gemv, &nw))) return st;
    if (joined) {
        st = qkv_joined(b, q, k, v, x, xb, Wq, n, in, QD, KD, H, Hkv, hd, pos, r, max_pos);
        dev_free(c, xb);
        if (st) return st;
        return L ? cu_kv_append(b, L, k, v, pos, n) : KS_OK;
    }
    if ((uintptr_t)x % 16) gemv = 0; /* normalised apart into a misaligned xn */
    if (gemv) { /* decode: one launch for the norm, the three projections and RoPE */
        const float *inv = NULL;
        if (r && (st = rope_inv_dev(c, r, max_pos, &inv))) return st;
        double t0;
        if ((st = stats_begin(b, &t0))) return st;
        float *ys[3] = {q, k, v};
        const void *ws[3] = {Wq->data, Wk->data, Wv->data};
        const float *bs[3] = {bq ? (const float *)bq->data : NULL, bk ? (const float *)bk->data : NULL,
                              bv ? (const float *)bv->data : NULL};
        int rows[3] = {QD, KD, KD}, rope[3] = {r != NULL, r != NULL, 0};
        if (L && Hkv <= KS_CUDA_GEMV_KV_MAX_HEADS) { /* the cache row written by the gemv kernel */
            if ((st = kv_reserve(b, L, 1))) return st;
            /* recorded: position and row offset from the step slot (graph_run sets them) */
            ks_cuda_kv_row kr = {L->k, L->v, (int32_t *)L->pos_dev, L->capacity, Hkv, L->n, c->rec ? c->d_step + 1 : NULL};
            st = ks_cuda_gemv_qkv_kv(c->stream, x, nw, eps, nw ? xn : NULL, in, 3, ys, ws, bs, rows, rope, hd, pos[0],
                                     inv, r ? (float)r->attn_factor : 1.0f, &kr, c->o.pdl);
            if (st) return st;
            for (int h = 0; h < Hkv; h++) L->pos[(size_t)h * L->capacity + L->n[h]++] = pos[0];
            return stats_end(b, t0, 2.0 * in * (QD + 2.0 * KD));
        }
        if (c->rec) return rec_fail(c, "the q|k|v projection without the cache row in the kernel");
        st = ks_cuda_gemv_qkv(c->stream, x, nw, eps, nw ? xn : NULL, in, 3, ys, ws, bs, rows, rope, hd, pos[0], inv,
                              r ? (float)r->attn_factor : 1.0f, c->o.pdl);
        if (st) return st;
        if ((st = stats_end(b, t0, 2.0 * in * (QD + 2.0 * KD)))) return st;
        return L ? cu_kv_append(b, L, k, v, pos, n) : KS_OK;
    }
    if (c->rec) return rec_fail(c, "the q|k|v projection off the one-row gemv path");
    if (n > 1 && Wq->type == KS_CUDA_BF16 && Wk->type == KS_CUDA_BF16 && Wv->type == KS_CUDA_BF16) {
        /* prefill: the rows converted to bf16 once per chunk for all three projections */
        const ks_weight *Ws[3] = {Wq, Wk, Wv}, *Bs[3] = {bq, bk, bv};
        float *Ys[3] = {q, k, v};
        const int outs[3] = {QD, KD, KD};
        for (int i = 0; i < 3; i++) {
            if (Ws[i]->cols != in || Ws[i]->rows != outs[i])
                return ks_errorf(KS_ERR_INTERNAL, "q|k|v projection: weight %d is (%lld, %lld), expected (%d, %d)", i,
                                 (long long)Ws[i]->rows, (long long)Ws[i]->cols, outs[i], in);
            if (Bs[i] && (Bs[i]->type != KS_CUDA_F32 || Bs[i]->rows * Bs[i]->cols != outs[i]))
                return ks_errorf(KS_ERR_INTERNAL, "q|k|v projection: bias %d of %lld values for %d outputs", i,
                                 (long long)(Bs[i]->rows * Bs[i]->cols), outs[i]);
        }
        double t0;
        if ((st = stats_begin(b, &t0))) return st;
        if (n <= QKV_SKINNY_ROWS && in % 8 == 0 && (uintptr_t)x % 16 == 0) { /* one launch, biases fused */
            ks_gemm_rows_args a;
            memset(&a, 0, sizeof a);
            a.x = x;
            a.n = n;
            a.in = in;
            a.n_seg = 3;
            for (int i = 0; i < 3; i++) {
                a.W[i] = Ws[i]->data;
                a.bias[i] = Bs[i] ? (const float *)Bs[i]->data : NULL;
                a.y[i] = Ys[i];
                a.rows[i] = outs[i];
            }
            st = ks_cuda_gemm_rows(c->stream, &a, c->n_sm);
        } else {
            st = gemm_rows_bf16(c, x, n, in, 3, Ws, Ys, outs, 0.0f);
            for (int i = 0; i < 3 && !st; i++)
                if (Bs[i]) st = ks_cuda_add_bias(c->stream, Ys[i], (const float *)Bs[i]->data, n, outs[i]);
        }
        if (st || (st = stats_end(b, t0, 2.0 * n * in * (QD + 2.0 * KD)))) return st;
    } else if ((st = ks_cuda_dense_matmul(b, q, x, Wq, bq, n, in, QD)) || (st = ks_cuda_dense_matmul(b, k, x, Wk, bk, n, in, KD)) ||
               (st = ks_cuda_dense_matmul(b, v, x, Wv, bv, n, in, KD)))
        return st;
    if (r && ((st = ks_cuda_dense_rope(b, q, n, H, pos, r, max_pos)) || (st = ks_cuda_dense_rope(b, k, n, Hkv, pos, r, max_pos)))) return st;
    return L ? cu_kv_append(b, L, k, v, pos, n) : KS_OK;
}

ks_status ks_cuda_dense_qkv(ks_backend *b, ks_kv_layer *L, float *q, float *k, float *v, const float *x,
                            const ks_weight *norm, float eps, float *xn, const ks_weight *Wq, const ks_weight *Wk,
                            const ks_weight *Wv, const ks_weight *bq, const ks_weight *bk, const ks_weight *bv, int n,
                            int in, int H, int Hkv, int hd, const int32_t *pos, const ks_rope *r, int max_pos) {
    if (L && (L->n_kv_heads != Hkv || L->head_dim != hd))
        return ks_errorf(KS_ERR_INTERNAL, "q|k|v projection: KV layer of %d heads x %d dims for %d x %d projections",
                         L->n_kv_heads, L->head_dim, Hkv, hd);
    return qkv_impl(b, q, k, v, x, norm, eps, xn, Wq, Wk, Wv, bq, bk, bv, n, in, H, Hkv, hd, pos, r, max_pos, L);
}

ks_status ks_cuda_dense_swiglu_proj(ks_backend *b, float *y, const float *x, const ks_weight *norm, float eps, float *xn,
                                    const ks_weight *Wg, const ks_weight *Wu, float *tmp, int n, int in, int out) {
    cuda_ctx *c = CTX(b);
    ks_status st;
    int gemv = n == 1 && c->o.decode_kernels && (uintptr_t)x % 16 == 0 && gemv_weight_ok(Wg, in, out) && gemv_weight_ok(Wu, in, out);
    const float *nw;
    if ((st = fused_norm(b, &x, norm, eps, xn, n, in, gemv, &nw))) return st;
    if ((uintptr_t)x % 16) gemv = 0; /* normalised apart into a misaligned xn */
    if (gemv) {
        double t0;
        if ((st = stats_begin(b, &t0))) return st;
        if ((st = ks_cuda_gemv_swiglu(c->stream, y, x, nw, eps, nw ? xn : NULL, Wg->data, Wu->data, in, out, c->o.pdl))) return st;
        return stats_end(b, t0, 4.0 * in * out);
    }
    if ((st = ks_cuda_dense_matmul(b, y, x, Wg, NULL, n, in, out)) || (st = ks_cuda_dense_matmul(b, tmp, x, Wu, NULL, n, in, out))) return st;
    return ks_cuda_dense_swiglu(b, y, y, tmp, (size_t)n * out);
}

#define MLP_ROWS KS_CUDA_MLP_ROWS

/* Prefill MLP (ks_cuda_dense.h): per chunk of rows, xn -> bf16 once, gate and up GEMMs with bf16
 * outputs, SwiGLU bf16 -> bf16 in place, the down GEMM accumulating into x (float32). Float32
 * weights take the plain matmuls with float32 intermediates. */
ks_status ks_cuda_dense_mlp_bf16(ks_backend *b, float *x, const float *xn, const void *xn_bf16, const ks_weight *Wg,
                                 const ks_weight *Wu, const ks_weight *Wd, int n, int dim, int ffn) {
    cuda_ctx *c = CTX(b);
    if (Wg->rows != ffn || Wg->cols != dim || Wu->rows != ffn || Wu->cols != dim || Wd->rows != dim || Wd->cols != ffn)
        return ks_errorf(KS_ERR_INTERNAL, "mlp: weights (%lld, %lld), (%lld, %lld), (%lld, %lld) for dim %d, ffn %d",
                         (long long)Wg->rows, (long long)Wg->cols, (long long)Wu->rows, (long long)Wu->cols,
                         (long long)Wd->rows, (long long)Wd->cols, dim, ffn);
    if (n <= 0) return KS_OK;
    ks_status st;
    int bf = Wg->type == KS_CUDA_BF16 && Wu->type == KS_CUDA_BF16 && Wd->type == KS_CUDA_BF16;
    int rc = KS_MIN(n, bf ? MLP_ROWS : 1024);
    void *xb = NULL, *g = NULL;
    size_t es = bf ? 2 : 4;
    const ks_weight *gu[2] = {Wg, Wu};
    const int pair = bf && weights_adjacent(gu, 2); /* joined: gate and up as one batched GEMM */
    const int given = bf && xn_bf16 && n <= rc; /* the input already bf16, all rows in one chunk */
    if ((st = dev_alloc(c, (size_t)2 * rc * ffn * es, "mlp gate and up", &g)) ||
        (bf && !given && (st = dev_alloc(c, (size_t)rc * dim * 2, "mlp input (bf16)", &xb)))) {
        dev_free(c, g);
        return st;
    }
    double t0 = 0;
    if (bf) st = stats_begin(b, &t0);
    for (int r0 = 0; r0 < n && !st; r0 += rc) {
        int rn = KS_MIN(rc, n - r0);
        const float *xr = xn + (size_t)r0 * dim;
        float *yr = x + (size_t)r0 * dim;
        void *u = (char *)g + (size_t)rn * ffn * es; /* (rn, ffn) right after gate's (rn, ffn) */
        if (!bf) {
            if (!(st = matmul_impl(b, (float *)g, xr, Wg, NULL, rn, dim, ffn, 0)) &&
                !(st = matmul_impl(b, (float *)u, xr, Wu, NULL, rn, dim, ffn, 0)) &&
                !(st = ks_cuda_dense_swiglu(b, (float *)g, (float *)g, (float *)u, (size_t)rn * ffn)))
                st = matmul_impl(b, yr, (float *)g, Wd, NULL, rn, ffn, dim, 1);
            continue;
        }
        if (given) xb = (void *)xn_bf16;
        else st = ks_cuda_convert(c->stream, xb, KS_CUDA_BF16, xr, KS_CUDA_F32, (size_t)rn * dim);
        /* 2..64 rows (a batched decode step): gate|up and the SwiGLU in one wgmma launch (gemm_wg.cuh)
         * into bf16 h = g, then the down projection on cuBLAS */
        ks_gemm_wg_args wa = {xb, rn, dim, Wg->data, Wu->data, ffn, g};
        if (!st && rn >= 2 && c->sm_major == 9 && c->gwg_maps && ks_cuda_gemm_wg_supported(&wa, NULL)) {
            st = ks_cuda_gemm_wg(c->stream, &wa, c->gwg_maps, c->n_sm);
            if (!st) st = gemm_bf16(c, yr, CUDA_R_32F, g, Wd, rn, ffn, dim, 1.0f);
            continue;
        }
        if (!st && pair) st = gemm_bf16_pair(c, g, xb, Wg, rn, dim, ffn);
        if (!st && !pair && !(st = gemm_bf16(c, g, CUDA_R_16BF, xb, Wg, rn, dim, ffn, 0.0f)))
            st = gemm_bf16(c, u, CUDA_R_16BF, xb, Wu, rn, dim, ffn, 0.0f);
        if (!st) st = ks_cuda_swiglu_bf16(c->stream, g, g, u, (size_t)rn * ffn);
        if (!st) st = gemm_bf16(c, yr, CUDA_R_32F, g, Wd, rn, ffn, dim, 1.0f);
    }
    if (!st && bf) st = stats_end(b, t0, 6.0 * n * dim * ffn);
    if (!given) dev_free(c, xb);
    dev_free(c, g);
    return st;
}

ks_status ks_cuda_dense_embed(ks_backend *b, float *out, const ks_weight *E, const int32_t *ids, int n, int dim) {
    cuda_ctx *c = CTX(b);
    if (E->cols != dim || E->type != KS_CUDA_BF16)
        return ks_errorf(KS_ERR_INTERNAL, "embed: table is (%lld, %lld), expected %d columns", (long long)E->rows,
                         (long long)E->cols, dim);
    for (int i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= E->rows)
            return ks_errorf(KS_ERR_ARG, "embed: token id %d out of range [0, %lld)", ids[i], (long long)E->rows);
    if (n <= 0) return KS_OK;
    if (c->rec) { /* the token id from the step slot (graph_run sets it) */
        if (n != 1) return rec_fail(c, "embed of several ids");
        return ks_cuda_embed(c->stream, out, E->data, c->d_step, 1, dim);
    }
    void *d_ids;
    ks_status st = upload_tmp(c, ids, sizeof(int32_t) * n, "embed ids", &d_ids);
    if (st) return st;
    st = ks_cuda_embed(c->stream, out, E->data, (const int32_t *)d_ids, n, dim);
    dev_free(c, d_ids);
    return st;
}

ks_status ks_cuda_dense_rmsnorm(ks_backend *b, float *out, const float *x, const ks_weight *w, int n, int dim, float eps) {
    if (w->type != KS_CUDA_F32 || w->rows * w->cols != dim)
        return ks_errorf(KS_ERR_INTERNAL, "rmsnorm: weight of %lld values for dim %d", (long long)(w->rows * w->cols), dim);
    if (n <= 0) return KS_OK;
    return ks_cuda_rmsnorm(CTX(b)->stream, out, x, (const float *)w->data, n, dim, eps);
}

/* The device inv_freq table of rope r at max_pos (longrope's factor choice): computed and
 * uploaded once per configuration, then reused (ROPE_CACHE entries, oldest replaced; a table
 * replaced is freed in stream order, after the kernels queued with it). */
static ks_status rope_inv_dev(cuda_ctx *c, const ks_rope *r, int max_pos, const float **out) {
    *out = NULL;
    int half = r->head_dim / 2;
    if (half < 1 || half > 512) return ks_errorf(KS_ERR_UNSUPPORTED, "rope: head_dim %d unsupported (2 to 1024)", r->head_dim);
    struct cuda_ctx::rope_cache::rope_key k;
    memset(&k, 0, sizeof k); /* padding too: keys compare with memcmp */
    k.type = (int)r->type;
    k.head_dim = r->head_dim;
    k.orig_max_pos = r->orig_max_pos;
    k.use_long = r->type == KS_ROPE_LONGROPE && max_pos + 1 > r->orig_max_pos;
    k.theta = r->theta;
    k.factor = r->factor;
    k.low = r->low_freq_factor;
    k.high = r->high_freq_factor;
    k.attn_factor = r->attn_factor;
    k.short_factor = r->short_factor;
    k.long_factor = r->long_factor;
    for (int i = 0; i < ROPE_CACHE; i++)
        if (c->rc[i].dev && !memcmp(&c->rc[i].key, &k, sizeof k)) { *out = c->rc[i].dev; return KS_OK; }
    float h[512];
    ks_rope_inv_freq(r, max_pos, h);
    void *d;
    ks_status st = raw_alloc(c, sizeof(float) * half, "rope inv_freq", &d);
    if (st) return st;
    cudaError_t e = cudaMemcpyAsync(d, h, sizeof(float) * half, cudaMemcpyHostToDevice, c->stream);
    if (!e) e = cudaStreamSynchronize(c->stream); /* h is on the stack; this happens once per configuration */
    if (e) { raw_free(c, d); return ks_cuda_status(e, "rope inv_freq upload"); }
    struct cuda_ctx::rope_cache *slot = &c->rc[c->rc_next];
    c->rc_next = (c->rc_next + 1) % ROPE_CACHE;
    if (slot->dev) c->rc_gen++; /* graphs that read the old table are stale */
    raw_free(c, slot->dev); /* synchronous above: nothing queued still reads it */
    slot->key = k;
    slot->dev = (float *)d;
    *out = slot->dev;
    return KS_OK;
}

ks_status ks_cuda_dense_rope(ks_backend *b, float *x, int n, int n_heads, const int32_t *pos, const ks_rope *r, int max_pos) {
    cuda_ctx *c = CTX(b);
    int d = r->head_dim, half = d / 2;
    if (half > 512) return ks_errorf(KS_ERR_UNSUPPORTED, "rope: head_dim %d too large", d);
    if (n <= 0) return KS_OK;
    const float *inv;
    ks_status st = rope_inv_dev(c, r, max_pos, &inv);
    if (st) return st;
    if (n <= KS_CUDA_ROPE_POS_INLINE) /* the positions as kernel arguments: nothing uploaded */
        return ks_cuda_rope(c->stream, x, n, n_heads, d, pos, 1, inv, (float)r->attn_factor);
    void *d_pos;
    if ((st = upload_tmp(c, pos, sizeof(int32_t) * n, "rope positions", &d_pos))) return st;
    st = ks_cuda_rope(c->stream, x, n, n_heads, d, (const int32_t *)d_pos, 0, inv, (float)r->attn_factor);
    dev_free(c, d_pos);
    return st;
}

ks_status ks_cuda_dense_swiglu(ks_backend *b, float *out, const float *gate, const float *up, size_t n) {
    return ks_cuda_swiglu(CTX(b)->stream, out, gate, up, n);
}
ks_status ks_cuda_dense_add(ks_backend *b, float *x, const float *y, size_t n) { return ks_cuda_add(CTX(b)->stream, x, y, n); }

ks_status ks_cuda_dense_gather_rows(ks_backend *b, float *out, const float *x, const int32_t *idx, int k, int d) {
    cuda_ctx *c = CTX(b);
    if (k <= 0) return KS_OK;
    int32_t mx = 0;
    for (int i = 0; i < k; i++) {
        if (idx[i] < 0) return ks_errorf(KS_ERR_ARG, "gather_rows: negative index %d at position %d", idx[i], i);
        mx = KS_MAX(mx, idx[i]);
    }
    void *d_idx;
    ks_status st = upload_tmp(c, idx, sizeof(int32_t) * k, "gather_rows indices", &d_idx);
    if (st) return st;
    size_t ob = sizeof(float) * (size_t)k * d, xb = sizeof(float) * ((size_t)mx + 1) * d;
    const char *o = (const char *)out, *s = (const char *)x;
    if (o < s + xb && s < o + ob) { /* in place (the engine's propagate): through a temporary */
        void *t;
        if (!(st = dev_alloc(c, ob, "gather_rows temporary", &t))) {
            st = ks_cuda_gather_rows(c->stream, (float *)t, x, (const int32_t *)d_idx, k, d);
            if (!st) st = ks_cuda_status(cudaMemcpyAsync(out, t, ob, cudaMemcpyDeviceToDevice, c->stream), "gather_rows copy");
            dev_free(c, t);
        }
    } else {
        st = ks_cuda_gather_rows(c->stream, out, x, (const int32_t *)d_idx, k, d);
    }
    dev_free(c, d_idx);
    return st;
}

/* ================================================================ table */

void cuda_dense_install(ks_backend *b) {
    b->weight_create = cu_weight_create;
    b->weight_free = cu_weight_free;
    b->weights_join = cu_weights_join;
    b->weight_random = cu_weight_random;
    b->embed = ks_cuda_dense_embed;
    b->gather_rows = ks_cuda_dense_gather_rows;
    b->rope = ks_cuda_dense_rope;
}
