/* attn_prep.cuh — attention inputs that are not in cache order: rows gathered through per-KV-
 * head index lists into a compact copy, and/or pre-RoPE queries and keys rotated at their
 * effective positions (ks_attn_args.rope: TokenSelect keeps keys before RoPE), for the kernels
 * that read neither (the prefill kernels, the float32 split-KV kernel; the tensor-core decode
 * kernel rotates in place with ks_rope_rot below). C-callable. */
#ifndef KS_CUDA_ATTN_PREP_CUH
#define KS_CUDA_ATTN_PREP_CUH
#include <cuda_runtime_api.h>
#include <stdint.h>
#include "kvsieve.h"
#include "attn_decode.cuh"
#ifdef __CUDACC__
/* One rotate-half pair (x0 at column k, x1 at column k + head_dim/2) rotated at position pos:
 * float32 angle pos * inv, cos/sin times attn_factor af, no contraction (each product rounded),
 * as core/cpu_backend.c. Every kernel that rotates attention inputs calls these, so a key
 * rotated by the gather and one rotated inside the tensor-core decode kernel are the same bits;
 * ks_rope_cs is the (c, s) factor pair alone (kernels/rope_table.cu tabulates it), ks_rope_apply
 * the rotation by a given pair. */
static __device__ __forceinline__ void ks_rope_cs(int32_t pos, float inv, float af, float *c, float *s) {
    float a = __fmul_rn((float)pos, inv), sn, cs;
    sincosf(a, &sn, &cs);
    *c = __fmul_rn(cs, af);
    *s = __fmul_rn(sn, af);
}
static __device__ __forceinline__ void ks_rope_apply(float x0, float x1, float c, float s, float *y0, float *y1) {
    *y0 = __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s));
    *y1 = __fadd_rn(__fmul_rn(x1, c), __fmul_rn(x0, s));
}
static __device__ __forceinline__ void ks_rope_rot(float x0, float x1, int32_t pos, float inv, float af, float *y0,
                                                   float *y1) {
    float c, s;
    ks_rope_cs(pos, inv, af, &c, &s);
    ks_rope_apply(x0, x1, c, s, y0, y1);
}
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* For each KV head kv and t < nk[kv] of p (p->k bf16, p->idx optional): row j (as in
 * ks_cuda_attn_params), position pos = p->renumber ? t : (p->kpos ? kpos[kv][j] : j).
 *   k_out // (n_kv_heads, maxk, d) float32 (k_f32) or bf16: K row j, rotated at pos when
 *            inv_freq != NULL (rotate-half pairing, float32 angle pos * inv_freq[k], cos/sin
 *            times attn_factor, as core/cpu_backend.c)
 *   v_out // (n_kv_heads, maxk, d) bf16: V row j          pos_out // (n_kv_heads, maxk) int32 */
ks_status ks_cuda_attn_gather(cudaStream_t s, const ks_cuda_attn_params *p, const float *inv_freq, float attn_factor,
                              void *k_out, int k_f32, void *v_out, int32_t *pos_out, int maxk);

/* q_out (n, n_heads, d) = q rotated per query head h at position
 * (q_renumber ? nk[h / g] - n + i : qpos[i]) for row i. */
ks_status ks_cuda_attn_rope_q(cudaStream_t s, float *q_out, const float *q, int n, int n_heads, int n_kv_heads, int d,
                              const int32_t *qpos, const int32_t *nk, int q_renumber, const float *inv_freq,
                              float attn_factor);

#ifdef __cplusplus
}
#endif
#endif
