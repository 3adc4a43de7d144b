/* prim_ge.cu — ks_cuda_ge (ks_cuda_prims.h): a mask of 0 and 1 from a comparison with a number,
 * made where the values are, so a policy's decision on a device value (TokenSelect: the
 * fingerprint's cosine >= cache_theta) never goes to the host. CPU twin: ks_cpu_ge
 * (core/prims.c); the same comparison, the float widened to double (NaN: 0), so the same bits. */
#include "prim_common.cuh"

__global__ void ge_kernel(const float *__restrict__ x, int64_t n, double thr, float *__restrict__ out) {
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        out[i] = (double)x[i] >= thr ? 1.0f : 0.0f;
}

extern "C" ks_status ks_cuda_ge(cudaStream_t s, const float *x, int64_t n, double thr, float *out) {
    P_NONNEG("ge", "n", n);
    P_PTR("ge", "x", x, n);
    P_PTR("ge", "out", out, n);
    if (n == 0) return KS_OK;
    ge_kernel<<<ks_grid1d((size_t)n, 256), 256, 0, s>>>(x, n, thr, out);
    KS_CU_LAUNCH("ge kernel");
    return KS_OK;
}
