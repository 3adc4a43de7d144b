/* convert.cu — see convert.cuh. One thread per 4 elements, grid-stride. */
#include "common.cuh"
#include "convert.cuh"

template <typename T> __device__ __forceinline__ float to_f32(T v);
template <> __device__ __forceinline__ float to_f32<float>(float v) { return v; }
template <> __device__ __forceinline__ float to_f32<__half>(__half v) { return __half2float(v); }
template <> __device__ __forceinline__ float to_f32<bf16>(bf16 v) { return __bfloat162float(v); }

template <typename D> __device__ __forceinline__ D from_f32(float v);
template <> __device__ __forceinline__ float from_f32<float>(float v) { return v; }
template <> __device__ __forceinline__ bf16 from_f32<bf16>(float v) { return __float2bfloat16_rn(v); }

template <typename S, typename D>
__global__ void convert_kernel(D *__restrict__ dst, const S *__restrict__ src, size_t n) {
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        dst[i] = from_f32<D>(to_f32<S>(src[i]));
}

/* float -> bf16 with 16-byte loads: 4 floats in, 4 bf16 out (the matmul input path). */
__global__ void f32_to_bf16_vec4(bf16 *__restrict__ dst, const float *__restrict__ src, size_t n4) {
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n4; i += stride) {
        float4 v = reinterpret_cast<const float4 *>(src)[i];
        __nv_bfloat162 a = __floats2bfloat162_rn(v.x, v.y), b = __floats2bfloat162_rn(v.z, v.w);
        uint2 o;
        o.x = *reinterpret_cast<uint32_t *>(&a);
        o.y = *reinterpret_cast<uint32_t *>(&b);
        reinterpret_cast<uint2 *>(dst)[i] = o;
    }
}

template <typename S, typename D> static ks_status launch(cudaStream_t s, void *dst, const void *src, size_t n) {
    convert_kernel<S, D><<<ks_grid1d(n, 256), 256, 0, s>>>((D *)dst, (const S *)src, n);
    KS_CU_LAUNCH("convert kernel");
    return KS_OK;
}

extern "C" ks_status ks_cuda_convert(cudaStream_t s, void *dst, int dst_type, const void *src, int src_type, size_t n) {
    if (n == 0) return KS_OK;
    if (dst_type == KS_CUDA_BF16 && src_type == KS_CUDA_F32 && ((uintptr_t)src % 16) == 0 &&
        ((uintptr_t)dst % 8) == 0 && n % 4 == 0) {
        f32_to_bf16_vec4<<<ks_grid1d(n / 4, 256), 256, 0, s>>>((bf16 *)dst, (const float *)src, n / 4);
        KS_CU_LAUNCH("convert kernel (f32 -> bf16)");
        return KS_OK;
    }
    if (dst_type == KS_CUDA_F32) {
        switch (src_type) {
        case KS_CUDA_F32: KS_CU(cudaMemcpyAsync(dst, src, n * 4, cudaMemcpyDeviceToDevice, s), "convert copy"); return KS_OK;
        case KS_CUDA_F16: return launch<__half, float>(s, dst, src, n);
        case KS_CUDA_BF16: return launch<bf16, float>(s, dst, src, n);
        }
    } else if (dst_type == KS_CUDA_BF16) {
        switch (src_type) {
        case KS_CUDA_F32: return launch<float, bf16>(s, dst, src, n);
        case KS_CUDA_F16: return launch<__half, bf16>(s, dst, src, n);
        case KS_CUDA_BF16: KS_CU(cudaMemcpyAsync(dst, src, n * 2, cudaMemcpyDeviceToDevice, s), "convert copy"); return KS_OK;
        }
    }
    return ks_errorf(KS_ERR_DTYPE, "convert: unsupported conversion %d -> %d", src_type, dst_type);
}
