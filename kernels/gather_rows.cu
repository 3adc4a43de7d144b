/* gather_rows.cu — see gather_rows.cuh. Block per output row. */
#include "common.cuh"
#include "gather_rows.cuh"

template <bool VEC>
__global__ void gather_rows_kernel(float *__restrict__ out, const float *__restrict__ x, const int32_t *__restrict__ idx,
                                   int d) {
    const float *src = x + (size_t)idx[blockIdx.x] * d;
    float *dst = out + (size_t)blockIdx.x * d;
    if (VEC) {
        for (int c = threadIdx.x * 4; c < d; c += blockDim.x * 4)
            *reinterpret_cast<float4 *>(dst + c) = *reinterpret_cast<const float4 *>(src + c);
    } else {
        for (int c = threadIdx.x; c < d; c += blockDim.x) dst[c] = src[c];
    }
}

extern "C" ks_status ks_cuda_gather_rows(cudaStream_t s, float *out, const float *x, const int32_t *idx, int k, int d) {
    for (int i0 = 0; i0 < k; i0 += 65535) {
        int cnt = KS_MIN(65535, k - i0);
        if (d % 4 == 0 && ((uintptr_t)out | (uintptr_t)x) % 16 == 0)
            gather_rows_kernel<true><<<cnt, 128, 0, s>>>(out + (size_t)i0 * d, x, idx + i0, d);
        else
            gather_rows_kernel<false><<<cnt, 128, 0, s>>>(out + (size_t)i0 * d, x, idx + i0, d);
        KS_CU_LAUNCH("gather_rows kernel");
    }
    return KS_OK;
}
