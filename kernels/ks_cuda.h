/* ks_cuda.h — the CUDA backend (kernels/), C-callable.
 *
 * ks_cuda_backend_create returns a ks_backend (core/backend.h) whose buffers live on one GPU:
 * weights in bf16 (vectors such as norm weights and biases in float32), the KV cache in bf16
 * with position ids mirrored on the device (ks_kv_layer.pos_dev, int32 (n_kv_heads, capacity)),
 * activations float32, accumulation float32 everywhere. Every call is queued on the backend's
 * own stream (non-blocking) and returns a status; download and sync wait for it and report
 * errors from earlier kernels. Activation buffers come from a stream-ordered memory pool,
 * so alloc/free cost no synchronisation; KV caches and weights use plain cudaMalloc, so
 * freeing them really returns the memory. Out of device memory is KS_ERR_OOM.
 *
 * The kernel entry points (ks_cuda_<name>, one per .cu/.cuh pair) are declared in the
 * headers included below; each takes a stream and device pointers and returns a status.
 */
#ifndef KS_CUDA_H
#define KS_CUDA_H

#include <cuda_runtime_api.h>
#include "kvsieve.h"

#include "add.cuh"
#include "attn_decode.cuh"
#include "attn_decode_tc.cuh"
#include "attn_prefill.cuh"
#include "attn_prep.cuh"
#include "convert.cuh"
#include "embed.cuh"
#include "gather_rows.cuh"
#include "gemv.cuh"
#include "ks_cuda_prims.h"
#include "ks_cuda_scratch.h"
#include "kv_cache.cuh"
#include "random.cuh"
#include "rmsnorm.cuh"
#include "rope.cuh"
#include "swiglu.cuh"

#ifdef __cplusplus
extern "C" {
#endif

struct ks_backend;

/* A CUDA backend on GPU `device` (0 = first). KS_ERR_DEVICE when there is no usable GPU. */
ks_status ks_cuda_backend_create(int device, struct ks_backend **out);

/* The stream every operation of backend b is queued on (for primitives called directly,
 * e.g. ks_cuda_prims.h from the Lua binding). b must be a CUDA backend. */
cudaStream_t ks_cuda_backend_stream(struct ks_backend *b);
/* Stream-ordered scratch memory from the backend's pool, for ks_cuda_prims.h. The struct
 * refers to b: valid while b lives. */
ks_cuda_scratch ks_cuda_backend_scratch(struct ks_backend *b);
/* Number of multiprocessors of the backend's GPU (work sizing). */
int ks_cuda_backend_sm_count(struct ks_backend *b);

/* Attention path selection, for tests and benchmarks: 0 = automatic (flash kernel for
 * prefill-sized calls of head_dim 64/128, else the tensor-core decode kernel where it takes
 * the shape, else the float32 split-KV kernel), 1 = always the float32 split-KV kernel,
 * 2 = flash whenever the head_dim allows, 3 = tensor-core decode where it takes the shape. */
void ks_cuda_backend_set_attn_path(struct ks_backend *b, int path);

/* 1 when b uses the kernels not yet validated on a GPU (KS_CUDA_NEW; see cuda_backend.cu):
 * tensor-core decode, flash variant 2, gemv for one-row matmuls. */
int ks_cuda_backend_new_kernels(struct ks_backend *b);

#ifdef __cplusplus
}
#endif
#endif
