/* ks_cuda.h — the CUDA backend (kernels/), C-callable.
 *
 * ks_cuda_backend_create returns a ks_backend (core/backend.h) whose buffers live on one GPU:
 * weights in bf16 (vectors such as norm weights and biases in float32), the KV cache in bf16
 * with position ids mirrored on the device (ks_kv_layer.pos_dev, int32 (n_kv_heads, capacity)),
 * activations float32, accumulation float32 everywhere. Every call is queued on the backend's
 * own stream (non-blocking) and returns a status; download and sync wait for it and report
 * errors from earlier kernels (upload, weight creation and moving a KV cache to a larger one
 * wait too). Activation buffers come from a stream-ordered memory pool, so alloc/free cost no
 * synchronisation; KV caches and weights use plain cudaMalloc, so freeing them really returns
 * the memory. Out of device memory is KS_ERR_OOM.
 *
 * The backend itself is the cuda_*.cu files (context, dense ops, KV cache, attention,
 * profiling, decode graphs, primitives table; cuda_backend_int.h says which holds what). The
 * kernel entry points (ks_cuda_<name>, one kernel per .cu/.cuh pair; the policy primitives in
 * ks_cuda_prims.h) are declared in the headers included below; each takes a stream and device
 * pointers and returns a status.
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
#include "gemm_rows.cuh"
#include "gemv.cuh"
#include "ks_cuda_prims.h"
#include "ks_cuda_scratch.h"
#include "kv_cache.cuh"
#include "list_stage.cuh"
#include "random.cuh"
#include "rmsnorm.cuh"
#include "rope.cuh"
#include "swiglu.cuh"

#ifdef __cplusplus
extern "C" {
#endif

struct ks_backend;
struct ks_backend_opts;

/* A CUDA backend on GPU opts->device (0 = first) with its own kernel choices, PDL, decode
 * split count, graphs and profiling (core/backend.h; opts NULL = ks_backend_opts_default()).
 * Nothing it chooses is process-wide: two backends of one process may differ. KS_ERR_DEVICE
 * when there is no usable GPU. */
ks_status ks_cuda_backend_create(const struct ks_backend_opts *opts, struct ks_backend **out);

/* The stream every operation of backend b is queued on (for primitives called directly,
 * e.g. ks_cuda_prims.h from the Lua binding). b must be a CUDA backend. */
cudaStream_t ks_cuda_backend_stream(struct ks_backend *b);
/* Stream-ordered scratch memory from the backend's pool, for ks_cuda_prims.h. The struct
 * refers to b: valid while b lives. */
ks_cuda_scratch ks_cuda_backend_scratch(struct ks_backend *b);
/* Number of multiprocessors of the backend's GPU (work sizing). */
int ks_cuda_backend_sm_count(struct ks_backend *b);

/* Attention path of backend b, for tests and benchmarks (per backend, default AUTO). */
typedef enum ks_cuda_attn_path {
    KS_CUDA_ATTN_AUTO = 0,    /* a prefill kernel (the planner's, attn_prefill.cuh) for prefill-sized calls of
                                 head_dim 64/128, else the tensor-core decode kernel where it takes the shape
                                 (with opts.decode_kernels), else the float32 split-KV kernel */
    KS_CUDA_ATTN_SPLITKV = 1, /* always the float32 split-KV kernel */
    KS_CUDA_ATTN_FLASH = 2,   /* the planner's prefill kernel whenever the head_dim allows */
    KS_CUDA_ATTN_TC = 3       /* the tensor-core decode kernel where it takes the shape */
} ks_cuda_attn_path;
void ks_cuda_backend_set_attn_path(struct ks_backend *b, ks_cuda_attn_path path);
/* Prefill attention launches of backend b with kernel k since it was created (tests: which
 * kernel the planner chose under b's options). */
long ks_cuda_backend_prefill_calls(struct ks_backend *b, ks_cuda_prefill_kernel k);
/* Programmatic edges backend b's decode-step joins made since it was created: a list attention
 * started behind a decode handler's last kernel (kernels/cuda_graph.cu graph_inline; tests). */
int ks_cuda_backend_prog_edges(struct ks_backend *b);
/* Of those list attentions, the ones given the layer's o-projection to prefetch into L2 while
 * they wait (ks_cuda_attn_params.pf; tests). */
int ks_cuda_backend_prefetch_nodes(struct ks_backend *b);

#ifdef __cplusplus
}
#endif
#endif
