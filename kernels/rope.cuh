/* rope.cuh — rotary embedding, rotate-half pairing: in place, or out of a joined q|k|v row. C-callable. */
#ifndef KS_CUDA_ROPE_CUH
#define KS_CUDA_ROPE_CUH
#include <cuda_runtime_api.h>
#include <stddef.h>
#include <stdint.h>
#include "kvsieve.h"
#ifdef __cplusplus
extern "C" {
#endif

#define KS_CUDA_ROPE_POS_INLINE 1024 /* positions ks_cuda_rope(_qkv) take from the host, by value */

/* x (n, n_heads, head_dim) float rotated in place: for k < head_dim/2, angle = (float)pos[i] *
 * inv_freq[k] (float32, as HF and the CPU backend compute it), c = cos * attn_factor,
 * s = sin * attn_factor; (x[k], x[k+half]) -> (x[k] c - x[k+half] s, x[k+half] c + x[k] s).
 * inv_freq (head_dim/2) lives on the device; pos (n) too, or with pos_on_host on the host (n <=
 * KS_CUDA_ROPE_POS_INLINE: passed as a kernel argument, no upload; else KS_ERR_INTERNAL). */
ks_status ks_cuda_rope(cudaStream_t s, float *x, int n, int n_heads, int head_dim, const int32_t *pos,
                       int pos_on_host, const float *inv_freq, float attn_factor);

/* The rows of a joined q|k|v GEMM's output y (n, (n_heads + 2 n_kv_heads) * head_dim) split in
 * one launch: q (n, n_heads, head_dim) and k (n, n_kv_heads, head_dim) rotated as above, v
 * (n, n_kv_heads, head_dim) copied. pos (n): on the device, or with pos_on_host on the host (n
 * <= KS_CUDA_ROPE_POS_INLINE: passed as a kernel argument, no upload; else KS_ERR_INTERNAL). */
ks_status ks_cuda_rope_qkv(cudaStream_t s, float *q, float *k, float *v, const float *y, int n, int n_heads,
                           int n_kv_heads, int head_dim, const int32_t *pos, int pos_on_host, const float *inv_freq,
                           float attn_factor);

#ifdef __cplusplus
}
#endif
#endif
