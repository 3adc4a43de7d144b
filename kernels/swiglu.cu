/* swiglu.cu — see swiglu.cuh. Grid-stride, 4 floats per step when aligned. */
#include "common.cuh"
#include "swiglu.cuh"

static __device__ __forceinline__ float silu_mul(float g, float u) { return __fmul_rn(__fdiv_rn(g, 1.0f + expf(-g)), u); }

__global__ void swiglu_vec4(float4 *out, const float4 *gate, const float4 *up, size_t n4) {
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n4; i += stride) {
        float4 g = gate[i], u = up[i];
        out[i] = make_float4(silu_mul(g.x, u.x), silu_mul(g.y, u.y), silu_mul(g.z, u.z), silu_mul(g.w, u.w));
    }
}
__global__ void swiglu_scalar(float *out, const float *gate, const float *up, size_t n) {
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) out[i] = silu_mul(gate[i], up[i]);
}

extern "C" ks_status ks_cuda_swiglu(cudaStream_t s, float *out, const float *gate, const float *up, size_t n) {
    if (!n) return KS_OK;
    if (n % 4 == 0 && ((uintptr_t)out | (uintptr_t)gate | (uintptr_t)up) % 16 == 0)
        swiglu_vec4<<<ks_grid1d(n / 4, 256), 256, 0, s>>>((float4 *)out, (const float4 *)gate, (const float4 *)up, n / 4);
    else
        swiglu_scalar<<<ks_grid1d(n, 256), 256, 0, s>>>(out, gate, up, n);
    KS_CU_LAUNCH("swiglu kernel");
    return KS_OK;
}

/* bf16: 8 values (16 bytes) per step when aligned */
__global__ void swiglu_bf16_vec8(uint4 *out, const uint4 *gate, const uint4 *up, size_t n8) {
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n8; i += stride) {
        uint4 g = gate[i], u = up[i], o;
        const __nv_bfloat162 *g2 = reinterpret_cast<const __nv_bfloat162 *>(&g), *u2 = reinterpret_cast<const __nv_bfloat162 *>(&u);
        __nv_bfloat162 *o2 = reinterpret_cast<__nv_bfloat162 *>(&o);
#pragma unroll
        for (int k = 0; k < 4; k++) {
            float2 a = __bfloat1622float2(g2[k]), b = __bfloat1622float2(u2[k]);
            o2[k] = __floats2bfloat162_rn(silu_mul(a.x, b.x), silu_mul(a.y, b.y));
        }
        out[i] = o;
    }
}
__global__ void swiglu_bf16_scalar(bf16 *out, const bf16 *gate, const bf16 *up, size_t n) {
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        out[i] = __float2bfloat16_rn(silu_mul(__bfloat162float(gate[i]), __bfloat162float(up[i])));
}

extern "C" ks_status ks_cuda_swiglu_bf16(cudaStream_t s, void *out, const void *gate, const void *up, size_t n) {
    if (!n) return KS_OK;
    if (n % 8 == 0 && ((uintptr_t)out | (uintptr_t)gate | (uintptr_t)up) % 16 == 0)
        swiglu_bf16_vec8<<<ks_grid1d(n / 8, 256), 256, 0, s>>>((uint4 *)out, (const uint4 *)gate, (const uint4 *)up, n / 8);
    else
        swiglu_bf16_scalar<<<ks_grid1d(n, 256), 256, 0, s>>>((bf16 *)out, (const bf16 *)gate, (const bf16 *)up, n);
    KS_CU_LAUNCH("swiglu (bf16) kernel");
    return KS_OK;
}
