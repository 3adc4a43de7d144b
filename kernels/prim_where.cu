/* prim_where.cu — ks_cuda_where (ks_cuda_prims.h): 32-bit words picked from a or b by a mask,
 * on the device: the cached or the new selection of TokenSelect's cache by a decision the device
 * made, with no value read by the host. CPU twin: ks_cpu_where (core/prims.c); bits are copied,
 * so the results are identical. */
#include "prim_common.cuh"

__global__ void where_kernel(const float *__restrict__ mask, int64_t nm, const uint32_t *a, const uint32_t *b, int64_t n,
                             uint32_t *out) {
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        out[i] = mask[nm == 1 ? 0 : i] != 0.0f ? a[i] : b[i]; /* out may alias a or b: each word read, then written */
}

extern "C" ks_status ks_cuda_where(cudaStream_t s, const float *mask, int64_t nm, const void *a, const void *b, int64_t n,
                                   void *out) {
    P_NONNEG("where", "n", n);
    if (nm != 1 && nm != n)
        return ks_errorf(KS_ERR_ARG, "where: the mask has %lld entries for %lld values (want 1 or %lld)", (long long)nm,
                         (long long)n, (long long)n);
    P_PTR("where", "mask", mask, nm);
    P_PTR("where", "a", a, n);
    P_PTR("where", "b", b, n);
    P_PTR("where", "out", out, n);
    if (n == 0) return KS_OK;
    where_kernel<<<ks_grid1d((size_t)n, 256), 256, 0, s>>>(mask, nm, (const uint32_t *)a, (const uint32_t *)b, n,
                                                            (uint32_t *)out);
    KS_CU_LAUNCH("where kernel");
    return KS_OK;
}
