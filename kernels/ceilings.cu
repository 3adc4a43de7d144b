// ceilings.cu — what this GPU can do, measured now, for `kvsieve bench`: a bf16 GEMM through
// cuBLAS (fp32 accumulation, the engine's precision) and a device-to-device copy. The bench
// prints every phase's rate next to these two numbers.
#include "ceilings.cuh"

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

extern "C" {
#include "common.h"
}

#define CK(x, what)                                                                                   \
    do {                                                                                              \
        cudaError_t e_ = (x);                                                                         \
        if (e_ != cudaSuccess) {                                                                      \
            st = ks_errorf(KS_ERR_DEVICE, "ceilings: %s: %s", what, cudaGetErrorString(e_));          \
            goto out;                                                                                 \
        }                                                                                             \
    } while (0)

extern "C" ks_status ks_cuda_ceilings(double *gemm_tflops, double *copy_gbs) {
    ks_status st = KS_OK;
    const int N = 8192;                        // (N x N) @ (N x N): 1.1 TFLOP
    const size_t copy_bytes = (size_t)1 << 30; // 1 GiB copied = 2 GiB of traffic
    void *a = NULL, *bm = NULL, *c = NULL, *src = NULL, *dst = NULL;
    cublasHandle_t h = NULL;
    cudaEvent_t e0 = NULL, e1 = NULL;
    float ms = 0, alpha = 1, beta = 0;
    *gemm_tflops = *copy_gbs = 0;
    CK(cudaMalloc(&a, (size_t)N * N * 2), "GEMM operand");
    CK(cudaMalloc(&bm, (size_t)N * N * 2), "GEMM operand");
    CK(cudaMalloc(&c, (size_t)N * N * 2), "GEMM result");
    CK(cudaMemset(a, 0x3c, (size_t)N * N * 2), "fill");   // 0x3c3c: bf16 ~0.0115, never zero
    CK(cudaMemset(bm, 0x3c, (size_t)N * N * 2), "fill");
    CK(cudaEventCreate(&e0), "event");
    CK(cudaEventCreate(&e1), "event");
    if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) { st = ks_errorf(KS_ERR_DEVICE, "ceilings: cublasCreate failed"); goto out; }
    for (int rep = 0; rep < 2; rep++) { // rep 0 warms up
        CK(cudaEventRecord(e0), "event");
        for (int i = 0; i < 5; i++)
            if (cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, N, N, N, &alpha, a, CUDA_R_16BF, N, bm, CUDA_R_16BF, N, &beta, c,
                             CUDA_R_16BF, N, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) != CUBLAS_STATUS_SUCCESS) {
                st = ks_errorf(KS_ERR_DEVICE, "ceilings: cublasGemmEx failed");
                goto out;
            }
        CK(cudaEventRecord(e1), "event");
        CK(cudaEventSynchronize(e1), "GEMM");
    }
    CK(cudaEventElapsedTime(&ms, e0, e1), "event");
    *gemm_tflops = 5.0 * 2.0 * N * (double)N * N / (ms * 1e-3) / 1e12;
    cudaFree(a); cudaFree(bm); cudaFree(c);
    a = bm = c = NULL;
    CK(cudaMalloc(&src, copy_bytes), "copy source");
    CK(cudaMalloc(&dst, copy_bytes), "copy destination");
    CK(cudaMemset(src, 1, copy_bytes), "fill");
    for (int rep = 0; rep < 2; rep++) {
        CK(cudaEventRecord(e0), "event");
        for (int i = 0; i < 5; i++) CK(cudaMemcpyAsync(dst, src, copy_bytes, cudaMemcpyDeviceToDevice), "copy");
        CK(cudaEventRecord(e1), "event");
        CK(cudaEventSynchronize(e1), "copy");
    }
    CK(cudaEventElapsedTime(&ms, e0, e1), "event");
    *copy_gbs = 5.0 * 2.0 * (double)copy_bytes / (ms * 1e-3) / 1e9;
out:
    if (h) cublasDestroy(h);
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
    cudaFree(a); cudaFree(bm); cudaFree(c); cudaFree(src); cudaFree(dst);
    return st;
}
