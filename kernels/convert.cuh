/* convert.cuh — dtype conversion of a flat array on the device (weights at load, matmul inputs).
 * C-callable. */
#ifndef KS_CUDA_CONVERT_CUH
#define KS_CUDA_CONVERT_CUH
#include <cuda_runtime_api.h>
#include <stddef.h>
#include "kvsieve.h"
#ifdef __cplusplus
extern "C" {
#endif

/* Element types understood by the conversion (same codes as ks_dtype in core/safetensors.h). */
enum { KS_CUDA_F32 = 0, KS_CUDA_F16 = 1, KS_CUDA_BF16 = 2 };

/* dst (n) = src (n) converted: src F32/F16/BF16 -> dst F32/BF16 (round to nearest even).
 * dst and src must not overlap unless they are the same type and address. */
ks_status ks_cuda_convert(cudaStream_t s, void *dst, int dst_type, const void *src, int src_type, size_t n);

#ifdef __cplusplus
}
#endif
#endif
