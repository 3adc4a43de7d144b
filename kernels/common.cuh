/* common.cuh — shared by every CUDA kernel file: core headers (C linkage), error mapping,
 * bf16 helpers, warp reductions. Internal to kernels/. */
#ifndef KS_CUDA_COMMON_CUH
#define KS_CUDA_COMMON_CUH

#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

extern "C" {
#include "common.h"
}

/* A CUDA runtime failure as a ks_status: out-of-memory is KS_ERR_OOM, anything else
 * KS_ERR_DEVICE; the message names what failed ("rmsnorm kernel: invalid argument"). */
static inline ks_status ks_cuda_status(cudaError_t e, const char *what) {
    if (e == cudaSuccess) return KS_OK;
    return ks_errorf(e == cudaErrorMemoryAllocation ? KS_ERR_OOM : KS_ERR_DEVICE, "cuda: %s: %s (%s)", what,
                     cudaGetErrorString(e), cudaGetErrorName(e));
}

/* Return from the calling function when a CUDA call fails. */
#define KS_CU(call, what)                                                  \
    do {                                                                   \
        cudaError_t ks_e_ = (call);                                        \
        if (ks_e_ != cudaSuccess) return ks_cuda_status(ks_e_, what);      \
    } while (0)

/* After a kernel launch: the launch error (bad configuration, no kernel image, ...). */
#define KS_CU_LAUNCH(what) KS_CU(cudaGetLastError(), what)

typedef __nv_bfloat16 bf16;

static __device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
static __device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

static inline unsigned ks_cdiv(size_t a, size_t b) { return (unsigned)((a + b - 1) / b); }

/* kernel<<<grid, block, smem, s>>>(args...) with the launch attributes at[0..nat) (cudaLaunchKernelEx).
 * Returns the launch error. */
template <typename... KArgs, typename... Args>
static inline cudaError_t ks_launch_ex(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t s,
                                       cudaLaunchAttribute *at, int nat, Args &&...args) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = s;
    cfg.attrs = at;
    cfg.numAttrs = nat;
    return cudaLaunchKernelEx(&cfg, kernel, static_cast<Args &&>(args)...);
}

/* The same in thread-block clusters of (1, grid.y, 1) when grid.y > 1 (the split-K GEMMs: the CTAs
 * of one output tile add their partial sums through distributed shared memory). */
template <typename... KArgs, typename... Args>
static inline cudaError_t ks_launch_ycluster(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t s,
                                             Args &&...args) {
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeClusterDimension;
    at[0].val.clusterDim.x = 1;
    at[0].val.clusterDim.y = grid.y;
    at[0].val.clusterDim.z = 1;
    return ks_launch_ex(kernel, grid, block, smem, s, at, grid.y > 1 ? 1 : 0, static_cast<Args &&>(args)...);
}

/* Grid size for a grid-stride loop over n items with `threads` per block. */
static inline unsigned ks_grid1d(size_t n, int threads) {
    size_t b = (n + threads - 1) / threads;
    if (b > 65535u * 16u) b = 65535u * 16u;
    return (unsigned)(b ? b : 1);
}

#endif
