/* attn_prefill.cuh — flash attention for prefill on the tensor cores: bf16 Q (converted from
 * the float32 queries), bf16 K/V from the cache, float32 online softmax and accumulation, no
 * (n x n) matrix, key tiles that no query of a block can see are skipped. Same semantics as
 * ks_cuda_attn_params (attn_decode.cuh) without index lists. C-callable. */
#ifndef KS_CUDA_ATTN_PREFILL_CUH
#define KS_CUDA_ATTN_PREFILL_CUH
#include <cuda_runtime_api.h>
#include <stddef.h>
#include <stdint.h>
#include "kvsieve.h"
#include "attn_decode.cuh"
#ifdef __cplusplus
extern "C" {
#endif

/* 1 when the flash kernel takes these parameters (head_dim 64 or 128, no index lists). */
int ks_cuda_attn_prefill_supported(const ks_cuda_attn_params *p);

/* Workspace bytes ks_cuda_attn_prefill needs (per-tile position bounds). */
size_t ks_cuda_attn_prefill_workspace(const ks_cuda_attn_params *p);

ks_status ks_cuda_attn_prefill(cudaStream_t s, const ks_cuda_attn_params *p, void *ws);

/* Position bounds of every 64-key tile of every KV head into bounds (n_kv_heads, max_tiles):
 * (min, max) position of the tile's valid rows, (INT_MAX, INT_MIN) when it holds none; with
 * p->renumber the positions are the row indices. Shared by the mma.sync and wgmma prefill
 * kernels (they skip fully masked tiles with it). */
#define KS_ATTN_BOUNDS_TILE 64
ks_status ks_cuda_attn_tile_bounds(cudaStream_t s, const ks_cuda_attn_params *p, int max_tiles, void *bounds);

/* Kernel variant for benchmarks and tests (process-wide): 1 = 8 warps x 16 rows, 64-key tiles;
 * 2 = 4 warps x 32 rows, 64-key tiles (default); 3 = 4 warps x 32 rows, 32-key tiles. */
void ks_cuda_attn_prefill_set_variant(int variant);

#ifdef __cplusplus
}
#endif
#endif
