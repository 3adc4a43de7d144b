/* gemv.cuh — y = W x (+ bias) for one input row: bf16 weights streamed once, float32 input and
 * accumulation (the decode path; more exact than rounding x to bf16 for cuBLAS). C-callable. */
#ifndef KS_CUDA_GEMV_CUH
#define KS_CUDA_GEMV_CUH
#include <cuda_runtime_api.h>
#include <stdint.h>
#include "kvsieve.h"
#ifdef __cplusplus
extern "C" {
#endif

/* 1 when ks_cuda_gemv takes the shape: in % 8 == 0 and W 16-byte aligned. */
int ks_cuda_gemv_supported(const void *W, int in);

/* Every launch below takes `pdl`: non-zero = programmatic dependent launch (kernels/pdl.cuh),
 * the backend's ks_backend_opts.pdl. */

/* y (out) = W (out, in) bf16 @ x (in) float32 [+ bias (out) float32]. */
ks_status ks_cuda_gemv(cudaStream_t s, float *y, const float *x, const void *W, const float *bias, int in, int out, int pdl);

/* y (out) += W (out, in) bf16 @ x (in) [+ bias]: the residual add folded into the gemv (each
 * y[r] is read and written by one thread; y must not alias x). Same rounding as ks_cuda_gemv
 * followed by an add: y[r] + (dot + bias[r]). */
ks_status ks_cuda_gemv_acc(cudaStream_t s, float *y, const float *x, const void *W, const float *bias, int in, int out,
                           int pdl);

/* The fused gemvs below may also apply the layer's rmsnorm first (norm_w non-NULL): x is then
 * the un-normalised row, each block normalises it into shared memory with ks_cuda_rmsnorm's
 * arithmetic (same values), and xn (in), when non-NULL, receives the normalised row. Needs
 * in % 8 == 0, in <= KS_CUDA_GEMV_NORM_MAX, x, norm_w and xn 16-byte aligned. */
#define KS_CUDA_GEMV_NORM_MAX 8192 /* rmsnorm.cu keeps rows of up to 8192 in registers: the same sum order */
int ks_cuda_gemv_norm_supported(const float *x, const float *norm_w, int in);

/* The q, k, v projections of one row in one launch, RoPE fused: for segment i < n_seg (1..3),
 * y[i] (rows[i]) = W[i] (rows[i], in) bf16 @ x (in) [+ bias[i]]; with rope[i] the result is then
 * rotated in place as ks_cuda_rope (rope.cuh) does at position pos: rows[i] a multiple of
 * head_dim (even), inv_freq (head_dim/2) float32 on the device. Every W 16-byte aligned,
 * in % 8 == 0, x 16-byte aligned; y[i] must not alias x. */
ks_status ks_cuda_gemv_qkv(cudaStream_t s, const float *x, const float *norm_w, float eps, float *xn, int in, int n_seg,
                           float *const *y, const void *const *W, const float *const *bias, const int *rows,
                           const int *rope, int head_dim, int pos, const float *inv_freq, float attn_factor, int pdl);

/* ks_cuda_gemv_qkv plus the KV-cache append of the finished k and v rows (decode): head h's
 * k row (after RoPE) and v row are also stored, rounded to bf16 as ks_cuda_kv_append1 rounds
 * them, at row row0[h] of the cache, and that row's position is set to pos; the float32 y[1],
 * y[2] are still written. Needs n_seg == 3, rows[1] == rows[2] == n_kv_heads * head_dim,
 * n_kv_heads <= KS_CUDA_GEMV_KV_MAX_HEADS. The caller grows the cache and books the rows. */
#define KS_CUDA_GEMV_KV_MAX_HEADS 64
typedef struct ks_cuda_kv_row {
    void *k, *v;        /* (n_kv_heads, capacity, head_dim) bf16, device */
    int32_t *pos;       /* (n_kv_heads, capacity) int32, device */
    int capacity, n_kv_heads;
    const int *row0;    /* (n_kv_heads) HOST: the row each head's new entry goes to (< capacity) */
    const int32_t *dyn; /* NULL, or DEVICE {pos, delta} read when the kernel runs (a CUDA graph
                           replays the launch for later tokens): the position is dyn[0] instead of
                           the pos argument, the rows row0[h] + dyn[1]; the caller keeps them
                           below capacity */
} ks_cuda_kv_row;
ks_status ks_cuda_gemv_qkv_kv(cudaStream_t s, const float *x, const float *norm_w, float eps, float *xn, int in, int n_seg,
                              float *const *y, const void *const *W, const float *const *bias, const int *rows,
                              const int *rope, int head_dim, int pos, const float *inv_freq, float attn_factor,
                              const ks_cuda_kv_row *kv, int pdl);

/* y (out) = silu(Wg x) * (Wu x) for one row (the gate and up projections and the SwiGLU in one
 * pass): Wg, Wu (out, in) bf16, x (in) float32; the activation as swiglu.cu computes it. */
ks_status ks_cuda_gemv_swiglu(cudaStream_t s, float *y, const float *x, const float *norm_w, float eps, float *xn,
                              const void *Wg, const void *Wu, int in, int out, int pdl);

/* ---- tuning and benchmark hooks (tests/cuda/bench_decode.cu) ----
 * Every kernel above can prefetch the first bytes of its weight rows into L2 before it waits
 * for the previous kernel (with PDL): KS_CUDA_GEMV_PREFETCH bytes per row (0: prefetching
 * slowed the step, bench/NOTES.md). The dev harness alone (KS_KERNEL_DEV) may change it for
 * the whole process with ks_cuda_gemv_set_prefetch (< 0 = back to the default). */
#define KS_CUDA_GEMV_PREFETCH 0
#ifdef KS_KERNEL_DEV
void ks_cuda_gemv_set_prefetch(int bytes);
#endif

/* A variant of ks_cuda_gemv(_acc) for the benchmark: rows output rows per warp (1, 2, 4),
 * unroll 4 or 8 of the 16-byte step loop, ksplit warps of a block (1, 2, 4) sharing the same
 * rows over slices of in (partial sums reduced in shared memory, in a fixed order; the
 * summation order, hence rounding, differs from ksplit 1), prefetch bytes per row. */
typedef struct ks_cuda_gemv_variant {
    int rows, unroll, ksplit, prefetch;
    int pdl; /* programmatic dependent launch */
} ks_cuda_gemv_variant;
ks_status ks_cuda_gemv_var(cudaStream_t s, const ks_cuda_gemv_variant *v, float *y, const float *x, const void *W,
                           int in, int out, int acc);

#ifdef __cplusplus
}
#endif
#endif
