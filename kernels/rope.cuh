/* rope.cuh — rotary embedding, rotate-half pairing, in place or from strided rows. C-callable. */
#ifndef KS_CUDA_ROPE_CUH
#define KS_CUDA_ROPE_CUH
#include <cuda_runtime_api.h>
#include <stddef.h>
#include <stdint.h>
#include "kvsieve.h"
#ifdef __cplusplus
extern "C" {
#endif

/* x (n, n_heads, head_dim) float rotated in place: for k < head_dim/2, angle = (float)pos[i] *
 * inv_freq[k] (float32, as HF and the CPU backend compute it), c = cos * attn_factor,
 * s = sin * attn_factor; (x[k], x[k+half]) -> (x[k] c - x[k+half] s, x[k+half] c + x[k] s).
 * pos (n) and inv_freq (head_dim/2) live on the device. */
ks_status ks_cuda_rope(cudaStream_t s, float *x, int n, int n_heads, int head_dim, const int32_t *pos,
                       const float *inv_freq, float attn_factor);

/* The same rotation from rows of another buffer: row i of src (its n_heads * head_dim values at
 * src + i * src_row_stride, e.g. the q or k columns of a joined q|k|v GEMM's output) rotated into
 * row i of dst (n, n_heads, head_dim), contiguous. src == dst with src_row_stride = n_heads *
 * head_dim is ks_cuda_rope. */
ks_status ks_cuda_rope_rows(cudaStream_t s, float *dst, const float *src, int64_t src_row_stride, int n, int n_heads,
                            int head_dim, const int32_t *pos, const float *inv_freq, float attn_factor);

#ifdef __cplusplus
}
#endif
#endif
