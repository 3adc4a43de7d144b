/* rmsnorm.cuh — RMSNorm of float32 rows. C-callable. */
#ifndef KS_CUDA_RMSNORM_CUH
#define KS_CUDA_RMSNORM_CUH
#include <cuda_runtime_api.h>
#include <stddef.h>
#include <stdint.h>
#include "kvsieve.h"
#ifdef __cplusplus
extern "C" {
#endif

/* out (n, dim) = x / sqrt(mean(x^2) + eps) * w, with w (dim) float32; the sum of squares is
 * accumulated in double like the CPU reference. out may alias x. */
ks_status ks_cuda_rmsnorm(cudaStream_t s, float *out, const float *x, const float *w, int n, int dim, float eps);

/* The same, also writing out_bf16 (n, dim) bf16 = each value of out rounded to nearest even (what
 * ks_cuda_convert gives, bit for bit), in the same launch: the input of the bf16 GEMMs after the
 * norm, without a conversion launch. out_bf16 must not alias x or out. */
ks_status ks_cuda_rmsnorm_bf16(cudaStream_t s, float *out, void *out_bf16, const float *x, const float *w, int n, int dim,
                               float eps);

#ifdef __cplusplus
}
#endif
#endif
