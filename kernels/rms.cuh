/* rms.cuh — the inverse RMS of a row as rmsnorm.cu and the fused gemv's norm prologue (gemv.cu)
 * both reduce it, so that their normalised values agree bit for bit: a block of KS_RMS_THREADS
 * threads, each with its double sum of squares ss, reduced per warp (xor shuffles), then over
 * the warps in order. part: KS_RMS_THREADS / 32 doubles of shared memory. Device code only. */
#ifndef KS_CUDA_RMS_CUH
#define KS_CUDA_RMS_CUH

#define KS_RMS_THREADS 256

static __device__ __forceinline__ float ks_rms_inverse(double ss, int dim, float eps, double *part) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = ss;
    __syncthreads();
    double t = 0;
#pragma unroll
    for (int k = 0; k < KS_RMS_THREADS / 32; k++) t += part[k];
    return 1.0f / sqrtf((float)(t / dim) + eps);
}

#endif
