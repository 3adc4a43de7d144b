/* random.cuh — seeded random weights on the device (kvsieve bench --random-weights). C-callable. */
#ifndef KS_CUDA_RANDOM_CUH
#define KS_CUDA_RANDOM_CUH
#include <cuda_runtime_api.h>
#include <stdint.h>
#include "kvsieve.h"
#ifdef __cplusplus
extern "C" {
#endif

/* dst (rows, cols) of type KS_CUDA_F32 or KS_CUDA_BF16 (convert.cuh) = offset + scale * u with
 * u in (-0.5, 0.5) never 0, drawn exactly as the CPU backend's weight_random draws it (one
 * xorshift64 stream per row, seeded from seed and the row), then rounded to the storage type. */
ks_status ks_cuda_random(cudaStream_t s, void *dst, int dst_type, int64_t rows, int64_t cols, uint64_t seed, float scale,
                         float offset);

#ifdef __cplusplus
}
#endif
#endif
