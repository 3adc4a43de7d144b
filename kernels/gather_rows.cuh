/* gather_rows.cuh — row gather of float32 rows. C-callable. */
#ifndef KS_CUDA_GATHER_ROWS_CUH
#define KS_CUDA_GATHER_ROWS_CUH
#include <cuda_runtime_api.h>
#include <stddef.h>
#include <stdint.h>
#include "kvsieve.h"
#ifdef __cplusplus
extern "C" {
#endif

/* out (k, d) = x[idx] with idx (k) on the device, every index valid. out must not overlap x
 * (the backend gathers through a temporary when the engine gathers in place). */
ks_status ks_cuda_gather_rows(cudaStream_t s, float *out, const float *x, const int32_t *idx, int k, int d);

#ifdef __cplusplus
}
#endif
#endif
