/* rmsnorm.cu — see rmsnorm.cuh. One block of 256 threads per row; double sum of squares. */
#include "common.cuh"
#include "rmsnorm.cuh"

__global__ void rmsnorm_kernel(float *out, const float *x, const float *__restrict__ w, int dim, float eps) {
    __shared__ double part[8];
    __shared__ float rs;
    const float *xi = x + (size_t)blockIdx.x * dim;
    float *oi = out + (size_t)blockIdx.x * dim;
    double ss = 0;
    for (int j = threadIdx.x; j < dim; j += blockDim.x) ss += (double)xi[j] * xi[j];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = ss;
    __syncthreads();
    if (threadIdx.x == 0) {
        double t = 0;
        for (int k = 0; k < (int)(blockDim.x >> 5); k++) t += part[k];
        rs = 1.0f / sqrtf((float)(t / dim) + eps);
    }
    __syncthreads();
    float r = rs;
    for (int j = threadIdx.x; j < dim; j += blockDim.x) oi[j] = __fmul_rn(w[j], __fmul_rn(xi[j], r));
}

extern "C" ks_status ks_cuda_rmsnorm(cudaStream_t s, float *out, const float *x, const float *w, int n, int dim,
                                     float eps) {
    for (int i0 = 0; i0 < n; i0 += 65535) {
        int cnt = KS_MIN(65535, n - i0);
        rmsnorm_kernel<<<cnt, 256, 0, s>>>(out + (size_t)i0 * dim, x + (size_t)i0 * dim, w, dim, eps);
        KS_CU_LAUNCH("rmsnorm kernel");
    }
    return KS_OK;
}
