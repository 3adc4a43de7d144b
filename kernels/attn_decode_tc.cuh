/* attn_decode_tc.cuh — decode attention on the tensor cores: the n * g query rows that share a
 * KV head (n query rows x g heads of the group, at most 16) form one m16 tile, so each key and
 * value row is read once for the whole GQA group; split-KV over blocks and over the 4 warps of
 * a block, each warp streaming its own 16-key tiles through shared memory with cp.async (no
 * block-wide barrier in the loop). Q and P are rounded to bf16 (like the flash prefill kernel),
 * accumulation is float32. Same parameters and semantics as ks_cuda_attn_params
 * (attn_decode.cuh): index lists, renumbering, positions, window. C-callable. */
#ifndef KS_CUDA_ATTN_DECODE_TC_CUH
#define KS_CUDA_ATTN_DECODE_TC_CUH
#include <cuda_runtime_api.h>
#include <stddef.h>
#include "kvsieve.h"
#include "attn_decode.cuh"
#ifdef __cplusplus
extern "C" {
#endif

/* 1 when the kernel takes p: head_dim 64 or 128, n * (n_heads / n_kv_heads) <= 16, bf16 keys. */
int ks_cuda_attn_decode_tc_supported(const ks_cuda_attn_params *p);

/* *n_splits and workspace bytes (0 when n_splits == 1) on a GPU of n_sm multiprocessors. */
size_t ks_cuda_attn_decode_tc_workspace(const ks_cuda_attn_params *p, int n_sm, int *n_splits);

ks_status ks_cuda_attn_decode_tc(cudaStream_t s, const ks_cuda_attn_params *p, int n_splits, void *ws);

/* The same for one query row over the cache rows themselves (p->n == 1, no index list, no
 * renumbering, n_kv_heads <= KS_CUDA_ATTN_BYVAL_HEADS) with each KV head's key count nk_host
 * (n_kv_heads, HOST) and the query position passed by value: p->nk and p->qpos are not read
 * (may be NULL), so a decode step uploads nothing. The kernels use programmatic dependent
 * launch (kernels/pdl.cuh), as ks_cuda_attn_decode_tc's do. With dyn (DEVICE {pos, delta}, or
 * NULL) the kernel reads the query position from dyn[0] and takes nk_host[h] + dyn[1] keys when
 * it runs (a CUDA graph replays the launch for later tokens; the caller keeps the counts within
 * the capacity). */
#define KS_CUDA_ATTN_BYVAL_HEADS 64
ks_status ks_cuda_attn_decode_tc1(cudaStream_t s, const ks_cuda_attn_params *p, const int *nk_host, int qpos,
                                  const int32_t *dyn, int n_splits, void *ws);

#ifdef __cplusplus
}
#endif
#endif
