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

/* Grid size for a grid-stride loop over n items with `threads` per block. */
static inline unsigned ks_grid1d(size_t n, int threads) {
    size_t b = (n + threads - 1) / threads;
    if (b > 65535u * 16u) b = 65535u * 16u;
    return (unsigned)(b ? b : 1);
}

#endif
