/* add.cuh — residual add and bias add. C-callable. */
#ifndef KS_CUDA_ADD_CUH
#define KS_CUDA_ADD_CUH
#include <cuda_runtime_api.h>
#include <stddef.h>
#include <stdint.h>
#include "kvsieve.h"
#ifdef __cplusplus
extern "C" {
#endif

/* x (n) += y (n). */
ks_status ks_cuda_add(cudaStream_t s, float *x, const float *y, size_t n);
/* y (rows, cols) += bias (cols) broadcast over rows. */
ks_status ks_cuda_add_bias(cudaStream_t s, float *y, const float *bias, int rows, int cols);

#ifdef __cplusplus
}
#endif
#endif
