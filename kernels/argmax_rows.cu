/* argmax_rows.cu — see argmax_rows.cuh. The kernel, its launcher and the backend entry. */
#include "cuda_backend_int.h"
#include "argmax_rows.cuh"

#include <math.h>
#include <stdint.h>

#define ARGMAX_THREADS 512

/* (v, i) takes (w, j) when w is larger, or equal with a lower index; NaN never compares larger */
static __device__ __forceinline__ void take(float &v, int &i, float w, int j) {
    if (w > v || (w == v && j < i)) { v = w; i = j; }
}

template <bool VEC>
__global__ void __launch_bounds__(ARGMAX_THREADS) argmax_rows_kernel(const float *__restrict__ x, int cols,
                                                                     int32_t *__restrict__ out) {
    __shared__ float sv[ARGMAX_THREADS / 32];
    __shared__ int si[ARGMAX_THREADS / 32];
    const float *row = x + (size_t)blockIdx.x * cols;
    const int tid = threadIdx.x;
    float v = -INFINITY;
    int i = INT32_MAX; /* no candidate: any non-NaN value (-inf too) wins */
    if (VEC) { /* 16-byte loads, four a thread in flight before the compares */
        const float4 *r4 = reinterpret_cast<const float4 *>(row);
        const int n4 = cols / 4;
        int c = tid;
        for (; c + 3 * ARGMAX_THREADS < n4; c += 4 * ARGMAX_THREADS) {
            float4 f[4];
#pragma unroll
            for (int u = 0; u < 4; u++) f[u] = __ldcs(r4 + c + u * ARGMAX_THREADS);
#pragma unroll
            for (int u = 0; u < 4; u++) {
                int b = 4 * (c + u * ARGMAX_THREADS);
                take(v, i, f[u].x, b); take(v, i, f[u].y, b + 1); take(v, i, f[u].z, b + 2); take(v, i, f[u].w, b + 3);
            }
        }
        for (; c < n4; c += ARGMAX_THREADS) {
            float4 f = __ldcs(r4 + c);
            take(v, i, f.x, 4 * c); take(v, i, f.y, 4 * c + 1); take(v, i, f.z, 4 * c + 2); take(v, i, f.w, 4 * c + 3);
        }
        for (int e = 4 * n4 + tid; e < cols; e += ARGMAX_THREADS) take(v, i, row[e], e);
    } else {
        for (int e = tid; e < cols; e += ARGMAX_THREADS) take(v, i, row[e], e);
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        float w = __shfl_xor_sync(0xffffffffu, v, o);
        int j = __shfl_xor_sync(0xffffffffu, i, o);
        take(v, i, w, j);
    }
    if ((tid & 31) == 0) { sv[tid >> 5] = v; si[tid >> 5] = i; }
    __syncthreads();
    if (tid < 32) {
        v = tid < ARGMAX_THREADS / 32 ? sv[tid] : -INFINITY;
        i = tid < ARGMAX_THREADS / 32 ? si[tid] : INT32_MAX;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            float w = __shfl_xor_sync(0xffffffffu, v, o);
            int j = __shfl_xor_sync(0xffffffffu, i, o);
            take(v, i, w, j);
        }
        if (tid == 0) {
            float r0 = row[0];
            out[blockIdx.x] = r0 != r0 || i == INT32_MAX ? 0 : i; /* element 0 NaN: 0, as ks_sample */
        }
    }
}

extern "C" ks_status ks_cuda_argmax_rows(cudaStream_t s, const float *x, int rows, int cols, int32_t *out) {
    if (!x || !out || rows < 1 || cols < 1)
        return ks_errorf(KS_ERR_ARG, "argmax rows: %d rows of %d columns%s", rows, cols, x && out ? "" : ", NULL buffer");
    if ((uintptr_t)x % 16 == 0 && cols % 4 == 0)
        argmax_rows_kernel<true><<<rows, ARGMAX_THREADS, 0, s>>>(x, cols, out);
    else
        argmax_rows_kernel<false><<<rows, ARGMAX_THREADS, 0, s>>>(x, cols, out);
    KS_CU_LAUNCH("argmax rows kernel");
    return KS_OK;
}

extern "C" ks_status ks_cuda_argmax_rows_hook(ks_backend *b, const float *x, int rows, int cols, int32_t *out) {
    cuda_ctx *c = CTX(b);
    if (c->rec) return rec_fail(c, "argmax rows");
    if (!out) return ks_errorf(KS_ERR_ARG, "argmax rows: NULL output");
    void *d = NULL;
    ks_status st = dev_alloc(c, sizeof(int32_t) * (size_t)(rows > 0 ? rows : 1), "argmax rows ids", &d);
    if (!st) st = ks_cuda_argmax_rows(c->stream, x, rows, cols, (int32_t *)d);
    if (!st) st = b->download(b, out, d, sizeof(int32_t) * (size_t)rows);
    dev_free(c, d);
    return st;
}
