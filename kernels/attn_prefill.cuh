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

/* Workspace bytes ks_cuda_attn_prefill needs (per-tile position bounds); the same for every
 * prefill kernel below. */
size_t ks_cuda_attn_prefill_workspace(const ks_cuda_attn_params *p);

/* The prefill attention kernels of the shipped build, one per architecture family:
 *   KS_CUDA_PREFILL_WGMMA  Hopper (sm_90): the warp-specialised wgmma kernel (attn_prefill_wgmma.cuh)
 *   KS_CUDA_PREFILL_MMA    any other GPU, and on Hopper the shapes the wgmma kernel does not take
 *                          (unaligned K/V): the mma.sync flash kernel, 4 warps x 32 rows, 64-key tiles */
typedef enum ks_cuda_prefill_kernel {
    KS_CUDA_PREFILL_NONE = 0, /* neither takes p (head_dim, index lists, float32 keys): use a decode kernel */
    KS_CUDA_PREFILL_MMA = 1,
    KS_CUDA_PREFILL_WGMMA = 2
} ks_cuda_prefill_kernel;

/* The planner: the kernel for p on a GPU of compute capability major sm_major; mma_only (a
 * backend option) keeps to the mma.sync kernel (the reference the wgmma one is checked against). */
ks_cuda_prefill_kernel ks_cuda_attn_prefill_plan(const ks_cuda_attn_params *p, int sm_major, int mma_only);

/* Run the planned kernel k on p with workspace ws (ks_cuda_attn_prefill_workspace bytes).
 * KS_ERR_UNSUPPORTED when k does not take p. */
ks_status ks_cuda_attn_prefill(cudaStream_t s, const ks_cuda_attn_params *p, void *ws, ks_cuda_prefill_kernel k);

/* Position bounds of every 64-key tile of every KV head into bounds (n_kv_heads, max_tiles):
 * (min, max) position of the tile's valid rows, (INT_MAX, INT_MIN) when it holds none; with
 * p->renumber the positions are the row indices. Shared by the mma.sync and wgmma prefill
 * kernels (they skip fully masked tiles with it). */
#define KS_ATTN_BOUNDS_TILE 64
ks_status ks_cuda_attn_tile_bounds(cudaStream_t s, const ks_cuda_attn_params *p, int max_tiles, void *bounds);

#ifdef KS_KERNEL_DEV
/* Dev harness only (tests/cuda/test_wgmma, bench_kernels; never in libkvsieve): the mma.sync
 * kernel's variants, 1 = 8 warps x 16 rows, 64-key tiles; 2 = 4 warps x 32 rows, 64-key tiles
 * (the shipped one); 3 = 4 warps x 32 rows, 32-key tiles. */
ks_status ks_cuda_attn_prefill_mma_variant(cudaStream_t s, const ks_cuda_attn_params *p, void *ws, int variant);
#endif

#ifdef __cplusplus
}
#endif
#endif
