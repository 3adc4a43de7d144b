/* embed.cuh — embedding rows gathered from a bf16 table into float32 activations. C-callable. */
#ifndef KS_CUDA_EMBED_CUH
#define KS_CUDA_EMBED_CUH
#include <cuda_runtime_api.h>
#include <stddef.h>
#include <stdint.h>
#include "kvsieve.h"
#ifdef __cplusplus
extern "C" {
#endif

/* out (n, dim) float = E[ids] with E (rows, dim) bf16 and ids (n) on the device. The ids
 * must be in [0, rows) (the backend checks them on the host first). */
ks_status ks_cuda_embed(cudaStream_t s, float *out, const void *E, const int32_t *ids, int n, int dim);

#ifdef __cplusplus
}
#endif
#endif
