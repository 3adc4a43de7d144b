/* random.cu — see random.cuh. One thread per row (the stream is sequential along a row). */
#include "common.cuh"
#include "convert.cuh"
#include "random.cuh"

template <typename T> __device__ __forceinline__ T store_as(float v);
template <> __device__ __forceinline__ float store_as<float>(float v) { return v; }
template <> __device__ __forceinline__ bf16 store_as<bf16>(float v) { return __float2bfloat16_rn(v); }

template <typename T>
__global__ void random_kernel(T *__restrict__ dst, int64_t rows, int64_t cols, uint64_t seed, float scale, float offset) {
    int64_t r = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= rows) return;
    uint64_t st = seed * 0x9e3779b97f4a7c15ull + (uint64_t)r * 0xbf58476d1ce4e5b9ull + 1;
    T *row = dst + r * cols;
    for (int64_t c = 0; c < cols; c++) {
        st ^= st << 13; st ^= st >> 7; st ^= st << 17;
        float u = __fsub_rn(__fdiv_rn((float)((st >> 40) + 1), 16777218.0f), 0.5f);
        row[c] = store_as<T>(__fadd_rn(offset, __fmul_rn(scale, u))); /* no FMA: as the CPU rounds */
    }
}

extern "C" ks_status ks_cuda_random(cudaStream_t s, void *dst, int dst_type, int64_t rows, int64_t cols, uint64_t seed,
                                    float scale, float offset) {
    if (rows <= 0 || cols <= 0) return KS_OK;
    unsigned grid = ks_cdiv((size_t)rows, 128);
    if (dst_type == KS_CUDA_BF16) random_kernel<bf16><<<grid, 128, 0, s>>>((bf16 *)dst, rows, cols, seed, scale, offset);
    else if (dst_type == KS_CUDA_F32) random_kernel<float><<<grid, 128, 0, s>>>((float *)dst, rows, cols, seed, scale, offset);
    else return ks_errorf(KS_ERR_DTYPE, "random: unsupported storage type %d", dst_type);
    KS_CU_LAUNCH("random kernel");
    return KS_OK;
}
