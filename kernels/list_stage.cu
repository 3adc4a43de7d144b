/* list_stage.cu — ks_cuda_list_stage (list_stage.cuh): one block writing the descriptor words
 * from the launch's by-value arguments (__grid_constant__: no host buffer that a later staging
 * could rewrite before this one ran). */
#include "common.cuh"
#include "list_stage.cuh"

#include <string.h>

struct stage_words {
    int32_t w[KS_CUDA_STAGE_MAX_WORDS];
};

__global__ void list_stage_kernel(int32_t *__restrict__ desc, const __grid_constant__ stage_words W, int nwords) {
    for (int i = threadIdx.x; i < nwords; i += blockDim.x) desc[i] = W.w[i];
}

extern "C" ks_status ks_cuda_list_stage(cudaStream_t s, int32_t *desc, const int32_t *words, int nwords) {
    if (nwords < 0 || nwords > KS_CUDA_STAGE_MAX_WORDS)
        return ks_errorf(KS_ERR_ARG, "list_stage: %d descriptor words (at most %d)", nwords, KS_CUDA_STAGE_MAX_WORDS);
    if (nwords && (!desc || !words)) return ks_errorf(KS_ERR_ARG, "list_stage: NULL data");
    if (!nwords) return KS_OK;
    stage_words W;
    memcpy(W.w, words, sizeof(int32_t) * (size_t)nwords);
    list_stage_kernel<<<1, 160, 0, s>>>(desc, W, nwords);
    KS_CU_LAUNCH("list_stage kernel");
    return KS_OK;
}
