/* rmsnorm.cu — see rmsnorm.cuh. One block of 256 threads per row; double sum of squares.
 * Rows of up to 8192 floats (dim % 4 == 0, aligned) stay in registers between the two passes
 * (one read of x); other shapes read x twice. */
#include "common.cuh"
#include "rms.cuh"
#include "rmsnorm.cuh"

#define RN_THREADS KS_RMS_THREADS

/* VPT float4 per thread held in registers */
template <int VPT>
__global__ void __launch_bounds__(RN_THREADS) rmsnorm_reg_kernel(float *out, bf16 *ob, const float *x,
                                                                  const float *__restrict__ w, int dim, float eps) {
    __shared__ double part[RN_THREADS / 32];
    const float4 *xi = reinterpret_cast<const float4 *>(x + (size_t)blockIdx.x * dim);
    float4 *oi = reinterpret_cast<float4 *>(out + (size_t)blockIdx.x * dim);
    const float4 *w4 = reinterpret_cast<const float4 *>(w);
    const int n4 = dim / 4;
    float4 v[VPT];
    double ss = 0;
#pragma unroll
    for (int k = 0; k < VPT; k++) {
        int j = threadIdx.x + k * RN_THREADS;
        v[k] = j < n4 ? xi[j] : make_float4(0.f, 0.f, 0.f, 0.f);
        ss += (double)v[k].x * v[k].x + (double)v[k].y * v[k].y + (double)v[k].z * v[k].z + (double)v[k].w * v[k].w;
    }
    float r = ks_rms_inverse(ss, dim, eps, part);
#pragma unroll
    for (int k = 0; k < VPT; k++) {
        int j = threadIdx.x + k * RN_THREADS;
        if (j < n4) {
            float4 g = w4[j];
            const float4 o = make_float4(__fmul_rn(g.x, __fmul_rn(v[k].x, r)), __fmul_rn(g.y, __fmul_rn(v[k].y, r)),
                                         __fmul_rn(g.z, __fmul_rn(v[k].z, r)), __fmul_rn(g.w, __fmul_rn(v[k].w, r)));
            oi[j] = o;
            if (ob) { /* 4 bf16 = 8 bytes at element 4j of the row */
                __nv_bfloat162 lo = __floats2bfloat162_rn(o.x, o.y), hi = __floats2bfloat162_rn(o.z, o.w);
                uint2 pk;
                pk.x = *reinterpret_cast<uint32_t *>(&lo);
                pk.y = *reinterpret_cast<uint32_t *>(&hi);
                reinterpret_cast<uint2 *>(ob + (size_t)blockIdx.x * dim)[j] = pk;
            }
        }
    }
}

__global__ void __launch_bounds__(RN_THREADS) rmsnorm_kernel(float *out, bf16 *ob, const float *x,
                                                              const float *__restrict__ w, int dim, float eps) {
    __shared__ double part[RN_THREADS / 32];
    const float *xi = x + (size_t)blockIdx.x * dim;
    float *oi = out + (size_t)blockIdx.x * dim;
    double ss = 0;
    for (int j = threadIdx.x; j < dim; j += blockDim.x) ss += (double)xi[j] * xi[j];
    float r = ks_rms_inverse(ss, dim, eps, part);
    for (int j = threadIdx.x; j < dim; j += blockDim.x) {
        const float o = __fmul_rn(w[j], __fmul_rn(xi[j], r));
        oi[j] = o;
        if (ob) ob[(size_t)blockIdx.x * dim + j] = __float2bfloat16_rn(o);
    }
}

static ks_status rmsnorm_run(cudaStream_t s, float *out, bf16 *ob, const float *x, const float *w, int n, int dim,
                             float eps) {
    bool vec = dim % 4 == 0 && ((uintptr_t)out | (uintptr_t)x | (uintptr_t)w) % 16 == 0 && (uintptr_t)ob % 8 == 0;
    int n4 = dim / 4;
    for (int i0 = 0; i0 < n; i0 += 65535) {
        int cnt = KS_MIN(65535, n - i0);
        float *o = out + (size_t)i0 * dim;
        bf16 *b = ob ? ob + (size_t)i0 * dim : NULL;
        const float *xi = x + (size_t)i0 * dim;
        if (vec && n4 <= RN_THREADS * 2) rmsnorm_reg_kernel<2><<<cnt, RN_THREADS, 0, s>>>(o, b, xi, w, dim, eps);
        else if (vec && n4 <= RN_THREADS * 4) rmsnorm_reg_kernel<4><<<cnt, RN_THREADS, 0, s>>>(o, b, xi, w, dim, eps);
        else if (vec && n4 <= RN_THREADS * 8) rmsnorm_reg_kernel<8><<<cnt, RN_THREADS, 0, s>>>(o, b, xi, w, dim, eps);
        else rmsnorm_kernel<<<cnt, RN_THREADS, 0, s>>>(o, b, xi, w, dim, eps);
        KS_CU_LAUNCH("rmsnorm kernel");
    }
    return KS_OK;
}

extern "C" ks_status ks_cuda_rmsnorm(cudaStream_t s, float *out, const float *x, const float *w, int n, int dim,
                                     float eps) {
    return rmsnorm_run(s, out, NULL, x, w, n, dim, eps);
}

extern "C" ks_status ks_cuda_rmsnorm_bf16(cudaStream_t s, float *out, void *out_bf16, const float *x, const float *w, int n,
                                          int dim, float eps) {
    return rmsnorm_run(s, out, (bf16 *)out_bf16, x, w, n, dim, eps);
}
