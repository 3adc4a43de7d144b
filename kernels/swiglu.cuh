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

/* The same on bf16 arrays (the prefill MLP's intermediates): out (n) = bf16(silu(g) * u) with
 * g, u widened to float32 and the float32 formula above; out may alias gate or up. */
ks_status ks_cuda_swiglu_bf16(cudaStream_t s, void *out, const void *gate, const void *up, size_t n);

#ifdef __cplusplus
}
#endif
#endif
