/* prim_pool1d.cu — 1-D avg / max pooling, stride 1, padding kernel/2 (ks_cuda_prims.h).
 *
 * The CPU reference's O(n) block scans, in parallel: the padded row is cut into blocks of
 * `kernel` taps; one thread per block computes the prefix (G) and suffix (H) within its block
 * (double for avg, float max for max), then one thread per output combines H[i] and
 * G[i + kernel - 1] exactly as the CPU does, so the results are the CPU's bit for bit. */
#include "prim_common.cuh"

__global__ void pool_scan_kernel(const float *__restrict__ x, int64_t rows, int64_t n, int64_t kernel, int mode,
                                 double *__restrict__ G, double *__restrict__ H) {
    int64_t r = kernel / 2, P = n + 2 * r, nb = (P + kernel - 1) / kernel;
    int64_t total = rows * nb, stride = (int64_t)gridDim.x * blockDim.x;
    const double pad = mode == KS_POOL_AVG ? 0.0 : -INFINITY;
    for (int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; t < total; t += stride) {
        int64_t row = t / nb, b0 = (t - row * nb) * kernel, b1 = KS_MIN(b0 + kernel, P);
        const float *xr = x + row * n;
        double *g = G + row * P, *h = H + row * P;
#define PV(p) (((p) < r || (p) >= r + n) ? pad : (double)xr[(p) - r])
        double acc = 0;
        for (int64_t p = b0; p < b1; p++) {
            double v = PV(p);
            acc = p == b0 ? v : mode == KS_POOL_AVG ? acc + v : (double)max_nan((float)acc, (float)v);
            g[p] = acc;
        }
        for (int64_t p = b1 - 1; p >= b0; p--) {
            double v = PV(p);
            acc = p == b1 - 1 ? v : mode == KS_POOL_AVG ? acc + v : (double)max_nan((float)v, (float)acc);
            h[p] = acc;
        }
#undef PV
    }
}

__global__ void pool_out_kernel(int64_t rows, int64_t n, int64_t kernel, int mode, const double *__restrict__ G,
                                const double *__restrict__ H, float *out) {
    int64_t P = n + 2 * (kernel / 2), total = rows * n, stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; t < total; t += stride) {
        int64_t row = t / n, i = t - row * n, e = i + kernel - 1;
        const double *g = G + row * P, *h = H + row * P;
        if (mode == KS_POOL_AVG) {
            double s = i % kernel == 0 ? g[e] : h[i] + g[e];
            out[t] = (float)(s / (double)kernel);
        } else {
            out[t] = i % kernel == 0 ? (float)g[e] : max_nan((float)h[i], (float)g[e]);
        }
    }
}

/* every window covers the whole row: one block per row */
__global__ void pool_whole_kernel(const float *x, int64_t n, int64_t kernel, int mode, float *out) {
    __shared__ double ss[8];
    __shared__ float sm[8];
    const float *xr = x + (int64_t)blockIdx.x * n;
    double s = 0;
    float mx = -INFINITY;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
        s += xr[i];
        mx = max_nan(mx, xr[i]);
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        s += __shfl_xor_sync(0xffffffffu, s, o);
        mx = max_nan(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    }
    if ((threadIdx.x & 31) == 0) { ss[threadIdx.x >> 5] = s; sm[threadIdx.x >> 5] = mx; }
    __syncthreads();
    s = 0;
    mx = -INFINITY;
    for (int w = 0; w < (int)(blockDim.x >> 5); w++) { s += ss[w]; mx = max_nan(mx, sm[w]); }
    __syncthreads(); /* everyone has read the row before it is overwritten (in place) */
    float v = mode == KS_POOL_AVG ? (float)(s / (double)kernel) : mx;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) out[(int64_t)blockIdx.x * n + i] = v;
}

extern "C" ks_status ks_cuda_pool1d(cudaStream_t s, const ks_cuda_scratch *sc, const float *x, int64_t rows, int64_t n,
                                    int64_t kernel, ks_pool_mode mode, float *out) {
    P_NONNEG("pool1d", "rows", rows);
    P_NONNEG("pool1d", "n", n);
    if (kernel < 1) return ks_errorf(KS_ERR_ARG, "pool1d: kernel = %lld must be >= 1", (long long)kernel);
    if (kernel % 2 == 0)
        return ks_errorf(KS_ERR_ARG,
                         "pool1d: kernel = %lld is even; only odd kernels keep the output length n with padding kernel/2",
                         (long long)kernel);
    if ((unsigned)mode > KS_POOL_MAX) return ks_errorf(KS_ERR_ARG, "pool1d: unknown mode %d", (int)mode);
    int64_t total;
    ks_status st = p_mul_size("pool1d", rows, n, &total);
    if (st) return st;
    if (kernel > IDX_MAX) return ks_errorf(KS_ERR_ARG, "pool1d: kernel = %lld is too large", (long long)kernel);
    P_PTR("pool1d", "x", x, total);
    P_PTR("pool1d", "out", out, total);
    if (total == 0) return KS_OK;
    if (kernel == 1) {
        if (out != x) KS_CU(cudaMemcpyAsync(out, x, (size_t)total * 4, cudaMemcpyDeviceToDevice, s), "pool1d copy");
        return KS_OK;
    }
    int64_t r = kernel / 2, P = n + 2 * r;
    if (r >= n - 1) {
        for (int64_t r0 = 0; r0 < rows; r0 += 65535) {
            unsigned cnt = (unsigned)KS_MIN((int64_t)65535, rows - r0);
            pool_whole_kernel<<<cnt, 256, 0, s>>>(x + r0 * n, n, kernel, (int)mode, out + r0 * n);
            KS_CU_LAUNCH("pool1d kernel (whole rows)");
        }
        return KS_OK;
    }
    scratch_set ss(sc);
    double *G, *H;
    P_SCRATCH(G, ss, (size_t)rows * P * sizeof(double), "pool1d");
    P_SCRATCH(H, ss, (size_t)rows * P * sizeof(double), "pool1d");
    int64_t nb = rows * ((P + kernel - 1) / kernel);
    pool_scan_kernel<<<ks_grid1d((size_t)nb, 256), 256, 0, s>>>(x, rows, n, kernel, (int)mode, G, H);
    KS_CU_LAUNCH("pool1d scan kernel");
    pool_out_kernel<<<ks_grid1d((size_t)total, 256), 256, 0, s>>>(rows, n, kernel, (int)mode, G, H, out);
    KS_CU_LAUNCH("pool1d kernel");
    return KS_OK;
}
