/* gemv.cuh — y = W x (+ bias) for one input row: bf16 weights streamed once, float32 input and
 * accumulation (the decode path; more exact than rounding x to bf16 for cuBLAS). C-callable. */
#ifndef KS_CUDA_GEMV_CUH
#define KS_CUDA_GEMV_CUH
#include <cuda_runtime_api.h>
#include "kvsieve.h"
#ifdef __cplusplus
extern "C" {
#endif

/* 1 when ks_cuda_gemv takes the shape: in % 8 == 0 and W 16-byte aligned. */
int ks_cuda_gemv_supported(const void *W, int in);

/* y (out) = W (out, in) bf16 @ x (in) float32 [+ bias (out) float32]. */
ks_status ks_cuda_gemv(cudaStream_t s, float *y, const float *x, const void *W, const float *bias, int in, int out);

#ifdef __cplusplus
}
#endif
#endif
