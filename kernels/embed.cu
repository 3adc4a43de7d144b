/* embed.cu — see embed.cuh. Block per row; 8 bf16 (16 bytes) per thread when dim allows. */
#include "common.cuh"
#include "embed.cuh"

template <bool VEC>
__global__ void embed_kernel(float *__restrict__ out, const bf16 *__restrict__ E, const int32_t *__restrict__ ids,
                             int dim) {
    int i = blockIdx.x;
    const bf16 *row = E + (size_t)ids[i] * dim;
    float *o = out + (size_t)i * dim;
    if (VEC) {
        for (int c = threadIdx.x * 8; c < dim; c += blockDim.x * 8) {
            uint4 u = *reinterpret_cast<const uint4 *>(row + c);
            const __nv_bfloat162 *h = reinterpret_cast<const __nv_bfloat162 *>(&u);
            float2 a = __bfloat1622float2(h[0]), b = __bfloat1622float2(h[1]);
            float2 e = __bfloat1622float2(h[2]), f = __bfloat1622float2(h[3]);
            *reinterpret_cast<float4 *>(o + c) = make_float4(a.x, a.y, b.x, b.y);
            *reinterpret_cast<float4 *>(o + c + 4) = make_float4(e.x, e.y, f.x, f.y);
        }
    } else {
        for (int c = threadIdx.x; c < dim; c += blockDim.x) o[c] = __bfloat162float(row[c]);
    }
}

extern "C" ks_status ks_cuda_embed(cudaStream_t s, float *out, const void *E, const int32_t *ids, int n, int dim) {
    if (n <= 0) return KS_OK;
    for (int i0 = 0; i0 < n; i0 += 65535) {
        int cnt = KS_MIN(65535, n - i0);
        if (dim % 8 == 0 && ((uintptr_t)out | (uintptr_t)E) % 16 == 0)
            embed_kernel<true><<<cnt, 128, 0, s>>>(out + (size_t)i0 * dim, (const bf16 *)E, ids + i0, dim);
        else
            embed_kernel<false><<<cnt, 128, 0, s>>>(out + (size_t)i0 * dim, (const bf16 *)E, ids + i0, dim);
        KS_CU_LAUNCH("embed kernel");
    }
    return KS_OK;
}
