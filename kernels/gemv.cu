/* gemv.cu — see gemv.cuh. Each warp owns ROWS output rows and walks them together, 8 bf16 of
 * every row per lane and step (16-byte streaming loads, several in flight), x read through the
 * read-only cache; a warp reduction finishes each row. */
#include "common.cuh"
#include "gemv.cuh"

template <int ROWS>
__global__ void __launch_bounds__(256) gemv_kernel(float *__restrict__ y, const float *__restrict__ x,
                                                   const bf16 *__restrict__ W, const float *__restrict__ bias, int in,
                                                   int out) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int row0 = (blockIdx.x * 8 + warp) * ROWS;
    if (row0 >= out) return;
    float acc[ROWS];
#pragma unroll
    for (int r = 0; r < ROWS; r++) acc[r] = 0.f;
    const uint4 *Wv[ROWS];
#pragma unroll
    for (int r = 0; r < ROWS; r++) Wv[r] = reinterpret_cast<const uint4 *>(W + (size_t)min(row0 + r, out - 1) * in);
    const float4 *xv = reinterpret_cast<const float4 *>(x);
    const int steps = in / 8; /* 16-byte chunks per row */
#pragma unroll 4
    for (int c = lane; c < steps; c += 32) {
        float4 x0 = __ldg(xv + 2 * c), x1 = __ldg(xv + 2 * c + 1);
        uint4 u[ROWS];
#pragma unroll
        for (int r = 0; r < ROWS; r++) u[r] = __ldcs(Wv[r] + c);
#pragma unroll
        for (int r = 0; r < ROWS; r++) {
            const __nv_bfloat162 *h = reinterpret_cast<const __nv_bfloat162 *>(&u[r]);
            float2 a = __bfloat1622float2(h[0]), b = __bfloat1622float2(h[1]);
            float2 e = __bfloat1622float2(h[2]), f = __bfloat1622float2(h[3]);
            acc[r] += a.x * x0.x + a.y * x0.y + b.x * x0.z + b.y * x0.w + e.x * x1.x + e.y * x1.y + f.x * x1.z + f.y * x1.w;
        }
    }
#pragma unroll
    for (int r = 0; r < ROWS; r++) {
        float v = warp_sum(acc[r]);
        if (lane == 0 && row0 + r < out) y[row0 + r] = bias ? v + bias[row0 + r] : v;
    }
}

extern "C" int ks_cuda_gemv_supported(const void *W, int in) { return in % 8 == 0 && (uintptr_t)W % 16 == 0; }

extern "C" ks_status ks_cuda_gemv(cudaStream_t s, float *y, const float *x, const void *W, const float *bias, int in,
                                  int out) {
    if (out <= 0) return KS_OK;
    if (!ks_cuda_gemv_supported(W, in) || (uintptr_t)x % 16)
        return ks_errorf(KS_ERR_INTERNAL, "gemv: in = %d not a multiple of 8 or misaligned operands", in);
    /* enough blocks to fill the GPU: fewer rows per warp for narrow outputs */
    if (out >= 32768) gemv_kernel<4><<<ks_cdiv(out, 32), 256, 0, s>>>(y, x, (const bf16 *)W, bias, in, out);
    else if (out >= 8192) gemv_kernel<2><<<ks_cdiv(out, 16), 256, 0, s>>>(y, x, (const bf16 *)W, bias, in, out);
    else gemv_kernel<1><<<ks_cdiv(out, 8), 256, 0, s>>>(y, x, (const bf16 *)W, bias, in, out);
    KS_CU_LAUNCH("gemv kernel");
    return KS_OK;
}
