/* ks_cuda_page.h — the page primitives of core/prims_page.h on the GPU (kernels/prim_page.cu):
 * the same meaning and the same bits as the CPU reference (min / max exact, sums in double in
 * the CPU's order, one thread per output), on device arrays, queued on a stream. Conventions of
 * ks_cuda_prims.h: host-side argument checks with the CPU's messages (KS_ERR_ARG), failed
 * launches KS_ERR_DEVICE, and what depends on device data (a bad page id) reported through a
 * device error word instead of a wait. */
#ifndef KS_CUDA_PAGE_H
#define KS_CUDA_PAGE_H

#include <cuda_runtime_api.h>
#include <stdint.h>

#include "kvsieve.h"

#ifdef __cplusplus
extern "C" {
#endif
#include "prims_page.h"

/* ks_cpu_page_reduce: x float (x_bf16 = 0) or bf16 (1), strided; outputs (p1 - p0, h, d). */
ks_status ks_cuda_page_reduce(cudaStream_t s, const void *x, int x_bf16, int64_t n, int64_t h, int64_t d,
                              int64_t row_stride, int64_t head_stride, int64_t page, int64_t p0, int64_t p1,
                              float *out_min, float *out_max, float *out_mean);

/* ks_cpu_page_box: packed boxes (p1 - p0, h, d) uint32, the same bits. */
ks_status ks_cuda_page_box(cudaStream_t s, const void *x, int x_bf16, int64_t n, int64_t h, int64_t d,
                           int64_t row_stride, int64_t head_stride, int64_t page, int64_t p0, int64_t p1,
                           uint32_t *out_box);

/* ks_cpu_bound_scores_box: q (n_q_heads, d), box (n, n_kv_heads, d) packed, out (rows, n). */
ks_status ks_cuda_bound_scores_box(cudaStream_t s, const float *q, int64_t n_q_heads, const uint32_t *box, int64_t n,
                                   int64_t n_kv_heads, int64_t d, ks_bound_reduce reduce, float *out);

/* ks_cpu_bound_scores: q (n_q_heads, d), lo / hi (n, n_kv_heads, d), out (rows, n). */
ks_status ks_cuda_bound_scores(cudaStream_t s, const float *q, int64_t n_q_heads, const float *lo, const float *hi,
                               int64_t n, int64_t n_kv_heads, int64_t d, ks_bound_reduce reduce, float *out);

/* ks_cpu_page_rows: pages (lists, k), out (lists, w). A bad entry (out of range, not ascending)
 * stores its lowest flat position list * k + position into *err (device int64, set it to -1
 * first; NULL = unchecked, for lists valid by construction) and leaves out undefined; the caller
 * gets the CPU's message by running ks_cpu_page_rows on a host copy of the pages. */
ks_status ks_cuda_page_rows(cudaStream_t s, const int32_t *pages, int64_t lists, int64_t k, int64_t page, int64_t n,
                            int64_t before_begin, int64_t before_end, int64_t after_begin, int64_t after_end,
                            int32_t *out, int64_t *err);

#ifdef __cplusplus
}
#endif
#endif
