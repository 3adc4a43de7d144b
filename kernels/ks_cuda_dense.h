/* ks_cuda_dense.h — the CUDA backend's dense operations (kernels/cuda_dense.cu), C-callable: the
 * pieces its forward ops (attn_in, attn_out, mlp, head of core/backend.h, composed in
 * cuda_layer.cu) are made of. The engine never calls them; tests/cuda/test_cuda.c holds each
 * against its CPU twin (core/cpu_dense.h) and each fused one against its plain composition.
 *
 * b is a CUDA backend; every buffer is device memory on b, activations float32; positions are
 * host arrays. Each call is queued on b's stream and returns a status. While b records a decode
 * step (graph_begin) a call that cannot be replayed fails the recording (KS_ERR_UNSUPPORTED). */
#ifndef KS_CUDA_DENSE_H
#define KS_CUDA_DENSE_H

#include "backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* y (n, out) = x (n, in) @ W^T [+ bias]: the one-row gemv (opts.decode_kernels) or cuBLAS */
ks_status ks_cuda_dense_matmul(ks_backend *b, float *y, const float *x, const ks_weight *W, const ks_weight *bias, int n,
                               int in, int out);
/* y (n, out) += x (n, in) @ W^T [+ bias]: matmul then add, without the temporary */
ks_status ks_cuda_dense_matmul_add(ks_backend *b, float *y, const float *x, const ks_weight *W, const ks_weight *bias,
                                   int n, int in, int out);
/* The same from x already bf16 (n, in) (ks_acts.xn_bf16: the batched attention wrote it): one
 * cuBLAS GEMM, no conversion launch. W bf16. */
ks_status ks_cuda_dense_matmul_add_bf16x(ks_backend *b, float *y, const void *xb, const ks_weight *W, const ks_weight *bias,
                                         int n, int in, int out);
/* The attention projections, fused: with norm non-NULL xn (n, in) = rmsnorm(x, norm, eps) first
 * and the projections read it; q (n, H*hd) = x @ Wq^T [+ bq], k, v (n, Hkv*hd) likewise (biases
 * may be NULL); with r non-NULL q and k rotated at pos (n) as rope does (r->head_dim == hd); with
 * L non-NULL the rows then appended as kv_append(L, k, v, pos, n) (one row on the gemv path: the
 * kernel stores it). One launch for one row (gemv); 2..16 rows (batched decode, short prefills): one
 * skinny-GEMM launch for the three projections and their biases (gemm_rows.cuh); more rows are
 * converted to bf16 once for cuBLAS. */
ks_status ks_cuda_dense_qkv(ks_backend *b, ks_kv_layer *L, float *q, float *k, float *v, const float *x,
                            const ks_weight *norm, float eps, float *xn, const ks_weight *Wq, const ks_weight *Wk,
                            const ks_weight *Wv, const ks_weight *bq, const ks_weight *bk, const ks_weight *bv, int n,
                            int in, int H, int Hkv, int hd, const int32_t *pos, const ks_rope *r, int max_pos);
/* y (n, out) = silu(x @ Wg^T) * (x @ Wu^T); norm, eps, xn as for ks_cuda_dense_qkv; tmp (n, out)
 * scratch; y, x, xn and tmp distinct. One launch for one row. */
ks_status ks_cuda_dense_swiglu_proj(ks_backend *b, float *y, const float *x, const ks_weight *norm, float eps, float *xn,
                                    const ks_weight *Wg, const ks_weight *Wu, float *tmp, int n, int in, int out);
#define KS_CUDA_MLP_ROWS 4096 /* rows per n-row MLP chunk: bf16 gate and up of this many x ffn each */
/* x (n, dim) += W_down (silu(W_gate xn) * (W_up xn)) with bf16 intermediates in row chunks (as a
 * bf16 model computes them); float32 weights take float32 ones. xn_bf16: xn already rounded to
 * bf16 (n, dim) (ks_cuda_rmsnorm_bf16), used instead of converting where all rows fit one chunk;
 * or NULL. */
ks_status ks_cuda_dense_mlp_bf16(ks_backend *b, float *x, const float *xn, const void *xn_bf16, const ks_weight *Wg,
                                 const ks_weight *Wu, const ks_weight *Wd, int n, int dim, int ffn);
ks_status ks_cuda_dense_embed(ks_backend *b, float *out, const ks_weight *E, const int32_t *ids, int n, int dim);
ks_status ks_cuda_dense_rmsnorm(ks_backend *b, float *out, const float *x, const ks_weight *w, int n, int dim, float eps);
ks_status ks_cuda_dense_rope(ks_backend *b, float *x, int n, int n_heads, const int32_t *pos, const ks_rope *r,
                             int max_pos);
ks_status ks_cuda_dense_swiglu(ks_backend *b, float *out, const float *gate, const float *up, size_t n);
ks_status ks_cuda_dense_add(ks_backend *b, float *x, const float *y, size_t n);
ks_status ks_cuda_dense_gather_rows(ks_backend *b, float *out, const float *x, const int32_t *idx, int k, int d);

#ifdef __cplusplus
}
#endif
#endif
