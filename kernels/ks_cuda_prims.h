/* ks_cuda_prims.h — the policy primitives on the GPU: the same meaning as the CPU reference
 * in core/prims.h (read that header first: float order, ties, padding, NaN rules, errors),
 * on device arrays, queued on a stream.
 *
 * Conventions (all functions)
 *   - Every data pointer is device memory; sizes, options and flags are host values. Outputs
 *     that the CPU returns through a host pointer (unique's count, cosine's value) are written
 *     to device memory here, so nothing waits for the GPU: read them with a download.
 *   - Temporaries come from `sc` (ks_cuda_scratch): stream-ordered device allocations that a
 *     primitive frees as soon as its kernels are queued. The CUDA backend provides one
 *     (ks_cuda_backend_scratch in ks_cuda.h); functions that need none take no scratch.
 *   - Argument errors are checked on the host with the CPU's messages ("topk: k = 7 > n = 5")
 *     and return KS_ERR_ARG; failed launches KS_ERR_DEVICE; scratch exhaustion KS_ERR_OOM.
 *     Conditions that depend on device data (an index out of range in gather) cannot be
 *     reported without waiting: they are recorded in an optional device error word instead,
 *     and the kernel never reads or writes out of bounds.
 *   - Reductions accumulate in double like the CPU; top-k, argsort, sort and rank use the same
 *     order-preserving key, so their results are identical to the CPU's, ties included.
 *   - Output may alias input exactly where core/prims.h allows it.
 */
#ifndef KS_CUDA_PRIMS_H
#define KS_CUDA_PRIMS_H

#include <cuda_runtime_api.h>
#include <stdint.h>

#include "kvsieve.h"
#include "ks_cuda_scratch.h"

#ifdef __cplusplus
extern "C" {
#endif
#include "prims.h" /* ks_scores_opts, ks_pool_mode, ks_topk_order (C linkage) */

/* ================================================================ attention scores */

/* ks_cpu_scores on the GPU. q float32 (strides in opts); k float32 (k_bf16 = 0) or bf16
 * (k_bf16 = 1, e.g. the KV cache: k_head_stride = capacity * d, k_row_stride = d);
 * qpos (m) and kpos (n) int32 device arrays or NULL (same meaning as the CPU); out (rows,
 * n_out) float32 (ks_scores_out_shape). opts->n_threads is ignored. The logits are computed
 * three times for a softmax (max, normaliser, sum), never stored: memory O(n_q_heads *
 * (m * n / 64 + n_out)). head_dim up to 512. */
ks_status ks_cuda_scores(cudaStream_t s, const ks_cuda_scratch *sc, const float *q, const int32_t *qpos,
                         int64_t n_q_heads, int64_t m, const void *k, int k_bf16, const int32_t *kpos,
                         int64_t n_kv_heads, int64_t n, int64_t d, const ks_scores_opts *opts, float *out);
/* The same for a call recorded in a decode handler's graph (opts->grow > 0): when it runs,
 * delta = *gd - goff (gd: the step slot's delta word, device memory) rows were added since the
 * recording, and n, k_end, out_end and out's columns are each the recorded value + delta (<=
 * grow; out has room for them). Only the one-row kernel's shapes (prim_scores1.cu), no
 * positions and no causal mask: KS_ERR_UNSUPPORTED (nothing queued) otherwise. */
ks_status ks_cuda_scores_grow(cudaStream_t s, const ks_cuda_scratch *sc, const float *q, const int32_t *qpos,
                              int64_t n_q_heads, int64_t m, const void *k, int k_bf16, const int32_t *kpos,
                              int64_t n_kv_heads, int64_t n, int64_t d, const ks_scores_opts *opts, float *out,
                              const int32_t *gd, int32_t goff);

/* ================================================================ pooling */

/* ks_cpu_pool1d: x, out (rows, n) float32; out may alias x. */
ks_status ks_cuda_pool1d(cudaStream_t s, const ks_cuda_scratch *sc, const float *x, int64_t rows, int64_t n,
                         int64_t kernel, ks_pool_mode mode, float *out);

/* ================================================================ top-k and ordering */

/* ks_cpu_topk by radix select (3 histogram passes over 11/11/10-bit digits of the key, then
 * a stable compaction; KS_TOPK_BY_VALUE sorts the k winners with a stable radix sort).
 * x (rows, n); out_idx (rows, k) int32; out_val (rows, k) or NULL. */
ks_status ks_cuda_topk(cudaStream_t s, const ks_cuda_scratch *sc, const float *x, int64_t rows, int64_t n, int64_t k,
                       int64_t base, ks_topk_order order, int32_t *out_idx, float *out_val);
/* The same under a device mask (ks_cpu_topk_masked): *skip != 0 -> the top k of rows of zeros
 * (base .. base + k - 1, values 0), x unread; skip NULL = ks_cuda_topk. */
ks_status ks_cuda_topk_skip(cudaStream_t s, const ks_cuda_scratch *sc, const float *x, int64_t rows, int64_t n, int64_t k,
                            int64_t base, ks_topk_order order, int32_t *out_idx, float *out_val, const float *skip);
/* The same for one row recorded in a decode handler's graph: when it runs the row holds n +
 * (*gd - goff) keys (<= n + grow; gd the step slot's delta word). The cluster kernel only:
 * KS_ERR_UNSUPPORTED (nothing queued) where it does not take n + grow keys. */
ks_status ks_cuda_topk_grow(cudaStream_t s, const ks_cuda_scratch *sc, const float *x, int64_t n, int64_t k, int64_t base,
                            ks_topk_order order, int32_t *out_idx, float *out_val, const float *skip, int64_t grow,
                            const int32_t *gd, int32_t goff);

/* ks_cpu_argsort / ks_cpu_sort_f32 / ks_cpu_sort_i32 / ks_cpu_rank (stable radix sorts).
 * sort_f32 and sort_i32 may work in place (out == x). */
ks_status ks_cuda_argsort(cudaStream_t s, const ks_cuda_scratch *sc, const float *x, int64_t n, int descending,
                          int32_t *out_idx);
ks_status ks_cuda_sort_f32(cudaStream_t s, const ks_cuda_scratch *sc, const float *x, int64_t n, int descending,
                           float *out);
ks_status ks_cuda_sort_i32(cudaStream_t s, const ks_cuda_scratch *sc, const int32_t *x, int64_t n, int32_t *out);
ks_status ks_cuda_rank(cudaStream_t s, const ks_cuda_scratch *sc, const float *x, int64_t n, int32_t *out_rank);

/* ================================================================ index lists */

/* ks_cpu_unique: out (n) receives the sorted distinct values; n_out (device int64) their count.
 * out may alias x. */
ks_status ks_cuda_unique(cudaStream_t s, const ks_cuda_scratch *sc, const int32_t *x, int64_t n, int32_t *out,
                         int64_t *n_out);
/* ks_cpu_union of two ascending lists: out (na + nb), n_out (device int64). Computed as the
 * sorted distinct values of a and b together, so unlike the CPU it does not reject inputs
 * that are not strictly ascending (it returns their sorted union). out must not overlap. */
ks_status ks_cuda_union(cudaStream_t s, const ks_cuda_scratch *sc, const int32_t *a, int64_t na, const int32_t *b,
                        int64_t nb, int32_t *out, int64_t *n_out);
/* ks_cpu_concat_i32 / _f32 (out may alias a). */
ks_status ks_cuda_concat_i32(cudaStream_t s, const int32_t *a, int64_t na, const int32_t *b, int64_t nb, int32_t *out);
ks_status ks_cuda_concat_f32(cudaStream_t s, const float *a, int64_t na, const float *b, int64_t nb, float *out);
/* ks_cpu_arange: out (ks_arange_len(start, stop, step)). */
ks_status ks_cuda_arange(cudaStream_t s, int64_t start, int64_t stop, int64_t step, int32_t *out);

/* Row gather out (k, d) = x (n, d) [idx (k)]. An index outside [0, n) leaves its output row
 * as NaN and, when err is not NULL, stores into *err (device int64, set it to -1 first) the
 * lowest such position; the host-side message then is the CPU's ("gather: index 17 at
 * position 3 out of range [0, 12)") once the caller has read err. out must not overlap x. */
ks_status ks_cuda_gather(cudaStream_t s, const float *x, int64_t n, int64_t d, const int32_t *idx, int64_t k,
                         float *out, int64_t *err);
ks_status ks_cuda_gather_i32(cudaStream_t s, const int32_t *x, int64_t n, const int32_t *idx, int64_t k, int32_t *out,
                             int64_t *err);

/* ================================================================ small numerics */

/* ks_cpu_softmax (rows, n); out may alias x. */
ks_status ks_cuda_softmax(cudaStream_t s, const float *x, int64_t rows, int64_t n, float *out);
/* ks_cpu_sum / _mean / _var over axis 0 (out (cols)) or 1 (out (rows)). */
ks_status ks_cuda_sum(cudaStream_t s, const float *x, int64_t rows, int64_t cols, int axis, float *out);
ks_status ks_cuda_mean(cudaStream_t s, const float *x, int64_t rows, int64_t cols, int axis, float *out);
ks_status ks_cuda_var(cudaStream_t s, const float *x, int64_t rows, int64_t cols, int axis, int64_t ddof, float *out);
/* ks_cpu_cosine (out: one device float) and ks_cpu_cosine_rows (out (rows)). */
ks_status ks_cuda_cosine(cudaStream_t s, const float *a, const float *b, int64_t n, float *out);
ks_status ks_cuda_cosine_rows(cudaStream_t s, const float *a, const float *b, int64_t rows, int64_t d, float *out);

/* ================================================================ masks */

/* ks_cpu_ge and ks_cpu_where (core/prims.h), every pointer device memory (kernels/prim_ge.cu,
 * kernels/prim_where.cu). */
ks_status ks_cuda_ge(cudaStream_t s, const float *x, int64_t n, double thr, float *out);
ks_status ks_cuda_where(cudaStream_t s, const float *mask, int64_t nm, const void *a, const void *b, int64_t n, void *out);

#ifdef __cplusplus
}
#endif
#endif
