/* list_stage.cu — ks_cuda_list_stage (list_stage.cuh): one grid-stride copy of the lists, 16
 * bytes a thread where both ends allow it, and block 0 writing the descriptor words from the
 * launch's by-value arguments (__grid_constant__: no host buffer that a later staging could
 * rewrite before this one ran). */
#include "common.cuh"
#include "list_stage.cuh"

struct stage_words {
    int32_t w[KS_CUDA_STAGE_MAX_WORDS];
};

__global__ void list_stage_kernel(int32_t *__restrict__ dst, const int32_t *__restrict__ src, size_t n, int vec,
                                  int32_t *__restrict__ desc, const __grid_constant__ stage_words W, int nwords) {
    const size_t t0 = (size_t)blockIdx.x * blockDim.x + threadIdx.x, stride = (size_t)gridDim.x * blockDim.x;
    if (blockIdx.x == 0)
        for (int i = threadIdx.x; i < nwords; i += blockDim.x) desc[i] = W.w[i];
    if (vec) {
        const size_t n4 = n / 4;
        for (size_t i = t0; i < n4; i += stride) ((int4 *)dst)[i] = __ldg((const int4 *)src + i);
        for (size_t i = 4 * n4 + t0; i < n; i += stride) dst[i] = src[i];
    } else {
        for (size_t i = t0; i < n; i += stride) dst[i] = src[i];
    }
}

extern "C" ks_status ks_cuda_list_stage(cudaStream_t s, int32_t *dst, const int32_t *src, size_t n, int32_t *desc,
                                        const int32_t *words, int nwords) {
    if (nwords < 0 || nwords > KS_CUDA_STAGE_MAX_WORDS)
        return ks_errorf(KS_ERR_ARG, "list_stage: %d descriptor words (at most %d)", nwords, KS_CUDA_STAGE_MAX_WORDS);
    if ((n && (!dst || !src)) || (nwords && (!desc || !words))) return ks_errorf(KS_ERR_ARG, "list_stage: NULL data");
    if (!n && !nwords) return KS_OK;
    stage_words W;
    if (nwords) memcpy(W.w, words, sizeof(int32_t) * (size_t)nwords);
    const int vec = (uintptr_t)dst % 16 == 0 && (uintptr_t)src % 16 == 0;
    const unsigned grid = n ? ks_grid1d(vec ? (n + 3) / 4 : n, 256) : 1;
    list_stage_kernel<<<grid, 256, 0, s>>>(dst, src, n, vec, desc, W, nwords);
    KS_CU_LAUNCH("list_stage kernel");
    return KS_OK;
}
