/* add.cu — see add.cuh. */
#include "common.cuh"
#include "add.cuh"

__global__ void add_vec4(float4 *x, const float4 *y, size_t n4) {
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n4; i += stride) {
        float4 a = x[i], b = y[i];
        x[i] = make_float4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w);
    }
}
__global__ void add_scalar(float *x, const float *y, size_t n) {
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) x[i] += y[i];
}
__global__ void add_bias_kernel(float *y, const float *__restrict__ b, int rows, int cols) {
    size_t total = (size_t)rows * cols, stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += stride) y[i] += b[i % cols];
}

extern "C" ks_status ks_cuda_add(cudaStream_t s, float *x, const float *y, size_t n) {
    if (!n) return KS_OK;
    if (n % 4 == 0 && ((uintptr_t)x | (uintptr_t)y) % 16 == 0)
        add_vec4<<<ks_grid1d(n / 4, 256), 256, 0, s>>>((float4 *)x, (const float4 *)y, n / 4);
    else
        add_scalar<<<ks_grid1d(n, 256), 256, 0, s>>>(x, y, n);
    KS_CU_LAUNCH("add kernel");
    return KS_OK;
}

extern "C" ks_status ks_cuda_add_bias(cudaStream_t s, float *y, const float *bias, int rows, int cols) {
    size_t total = (size_t)rows * cols;
    if (!total) return KS_OK;
    add_bias_kernel<<<ks_grid1d(total, 256), 256, 0, s>>>(y, bias, rows, cols);
    KS_CU_LAUNCH("bias add kernel");
    return KS_OK;
}
