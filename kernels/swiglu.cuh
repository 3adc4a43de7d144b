/* swiglu.cuh — SwiGLU activation. C-callable. */
#ifndef KS_CUDA_SWIGLU_CUH
#define KS_CUDA_SWIGLU_CUH
#include <cuda_runtime_api.h>
#include <stddef.h>
#include <stdint.h>
#include "kvsieve.h"
#ifdef __cplusplus
extern "C" {
#endif

/* out (n) = silu(gate) * up = gate / (1 + exp(-gate)) * up; out may alias gate or up. */
ks_status ks_cuda_swiglu(cudaStream_t s, float *out, const float *gate, const float *up, size_t n);

#ifdef __cplusplus
}
#endif
#endif
