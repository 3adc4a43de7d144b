/* kv_cache.cuh — the bf16 KV cache of one layer on the device: append rows, gather (compact)
 * rows per KV head. Layout (ks_kv_layer): k, v // (n_kv_heads, capacity, head_dim) bf16,
 * pos // (n_kv_heads, capacity) int32. C-callable. */
#ifndef KS_CUDA_KV_CACHE_CUH
#define KS_CUDA_KV_CACHE_CUH
#include <cuda_runtime_api.h>
#include <stdint.h>
#include "kvsieve.h"
#ifdef __cplusplus
extern "C" {
#endif

/* Append n rows: head h's row i goes to slot row0[h] + i, converted to bf16.
 *   k, v   // (n, n_kv_heads, head_dim) float32     pos // (n) int32
 *   row0   // (n_kv_heads) int32, first free row of each head; all device pointers. */
ks_status ks_cuda_kv_append(cudaStream_t s, void *K, void *V, int32_t *P, int capacity, int n_kv_heads, int head_dim,
                            const float *k, const float *v, const int32_t *pos, const int32_t *row0, int n);

/* Gather rows per head: dst row t of head h = src row idx[off[h] + t], t < off[h+1] - off[h].
 *   idx // (off[n_kv_heads]) int32, off // (n_kv_heads + 1) int32, device pointers;
 *   max_cnt: the largest per-head count. dst and src must not overlap. */
ks_status ks_cuda_kv_gather(cudaStream_t s, void *dK, void *dV, int32_t *dP, int dst_capacity, const void *sK,
                            const void *sV, const int32_t *sP, int src_capacity, int n_kv_heads, int head_dim,
                            const int32_t *idx, const int32_t *off, int max_cnt);

/* Append one row (decode) with the position and each head's first free row passed by value
 * (no upload): k, v // (n_kv_heads, head_dim) float32 device, row0 // (n_kv_heads) HOST array.
 * n_kv_heads <= KS_CUDA_KV1_MAX_HEADS. pdl: programmatic dependent launch (kernels/pdl.cuh). */
#define KS_CUDA_KV1_MAX_HEADS 64
ks_status ks_cuda_kv_append1(cudaStream_t s, void *K, void *V, int32_t *P, int capacity, int n_kv_heads, int head_dim,
                             const float *k, const float *v, int32_t pos, const int *row0, int pdl);

/* Copy up to KS_CUDA_PUT_MAX bytes of host memory to the device in stream order, the bytes
 * travelling as a kernel argument (an upload without a copy-engine transfer and the gap it leaves
 * between the kernels around it; src may be reused at once). Three argument sizes (512 bytes,
 * 4 KiB, 24 KiB: the smallest that holds them; Hopper takes up to 32 KiB of arguments), 16-byte
 * stores where dst is aligned. */
#define KS_CUDA_PUT_MAX 24576
ks_status ks_cuda_put(cudaStream_t s, void *dst, const void *src, size_t bytes, int pdl);

#ifdef __cplusplus
}
#endif
#endif
