/* prim_reduce.cu — softmax, sum / mean / var over an axis, cosine similarity (ks_cuda_prims.h).
 * Double accumulation as in core/prims.c; one block per reduced row, or one thread per column
 * (coalesced) for axis-0 reductions. */
#include "prim_common.cuh"

#define RT 256

/* block-wide sum of a double (every thread gets the result) */
static __device__ double block_sum_d(double v, double *sh) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    __syncthreads();
    if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = v;
    __syncthreads();
    double t = 0;
    for (int w = 0; w < (int)(blockDim.x >> 5); w++) t += sh[w];
    return t;
}

/* ---------------------------------------------------------------- softmax */

__global__ void softmax_kernel(const float *x, int64_t n, float *out) {
    __shared__ double shd[RT / 32];
    __shared__ float shm[RT / 32];
    __shared__ int shn[RT / 32];
    const float *xr = x + (int64_t)blockIdx.x * n;
    float *yr = out + (int64_t)blockIdx.x * n;
    float mx = -INFINITY;
    int nan = 0;
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
        float v = xr[j];
        if (isnan(v)) nan = 1;
        else mx = fmaxf(mx, v);
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
        nan |= __shfl_xor_sync(0xffffffffu, nan, o);
    }
    if ((threadIdx.x & 31) == 0) { shm[threadIdx.x >> 5] = mx; shn[threadIdx.x >> 5] = nan; }
    __syncthreads();
    mx = -INFINITY;
    nan = 0;
    for (int w = 0; w < (int)(blockDim.x >> 5); w++) { mx = fmaxf(mx, shm[w]); nan |= shn[w]; }
    if (nan || mx == INFINITY) {
        for (int64_t j = threadIdx.x; j < n; j += blockDim.x) yr[j] = NAN;
        return;
    }
    if (mx == -INFINITY) {
        for (int64_t j = threadIdx.x; j < n; j += blockDim.x) yr[j] = 0.0f;
        return;
    }
    double z = 0;
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
        float e = expf(xr[j] - mx);
        yr[j] = e;
        z += e;
    }
    z = block_sum_d(z, shd);
    double inv = 1.0 / z;
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) yr[j] = (float)((double)yr[j] * inv);
}

extern "C" ks_status ks_cuda_softmax(cudaStream_t s, const float *x, int64_t rows, int64_t n, float *out) {
    P_NONNEG("softmax", "rows", rows);
    P_NONNEG("softmax", "n", n);
    int64_t total;
    ks_status st = p_mul_size("softmax", rows, n, &total);
    if (st) return st;
    P_PTR("softmax", "x", x, total);
    P_PTR("softmax", "out", out, total);
    for (int64_t r0 = 0; r0 < rows && n > 0; r0 += 65535) {
        unsigned cnt = (unsigned)KS_MIN((int64_t)65535, rows - r0);
        softmax_kernel<<<cnt, RT, 0, s>>>(x + r0 * n, n, out + r0 * n);
        KS_CU_LAUNCH("softmax kernel");
    }
    return KS_OK;
}

/* ---------------------------------------------------------------- sum / mean / var */

/* axis 1: one block per row. var: two passes (mean, then squared deviations). */
__global__ void reduce_rows_kernel(const float *x, int64_t cols, double div, int var, int64_t ddof, float *out) {
    __shared__ double sh[RT / 32];
    const float *xr = x + (int64_t)blockIdx.x * cols;
    double s = 0;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) s += xr[c];
    s = block_sum_d(s, sh);
    if (!var) {
        if (threadIdx.x == 0) out[blockIdx.x] = (float)(s / div);
        return;
    }
    double mu = s / (double)cols, ss = 0;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
        double e = xr[c] - mu;
        ss += e * e;
    }
    ss = block_sum_d(ss, sh);
    if (threadIdx.x == 0) out[blockIdx.x] = (float)(ss / (double)(cols - ddof));
}

/* axis 0: one thread per column, rows in order. */
__global__ void reduce_cols_kernel(const float *x, int64_t rows, int64_t cols, double div, int var, int64_t ddof,
                                   float *out) {
    int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= cols) return;
    double s = 0;
    for (int64_t r = 0; r < rows; r++) s += x[r * cols + c];
    if (!var) {
        out[c] = (float)(s / div);
        return;
    }
    double mu = s / (double)rows, ss = 0;
    for (int64_t r = 0; r < rows; r++) {
        double e = x[r * cols + c] - mu;
        ss += e * e;
    }
    out[c] = (float)(ss / (double)(rows - ddof));
}

static ks_status axis_reduce(cudaStream_t s, const char *prim, const float *x, int64_t rows, int64_t cols, int axis,
                             int kind /* 0 sum, 1 mean, 2 var */, int64_t ddof, float *out) {
    P_NONNEG(prim, "rows", rows);
    P_NONNEG(prim, "cols", cols);
    if (axis != 0 && axis != 1) return ks_errorf(KS_ERR_ARG, "%s: axis = %d must be 0 or 1", prim, axis);
    int64_t total;
    ks_status st = p_mul_size(prim, rows, cols, &total);
    if (st) return st;
    P_PTR(prim, "x", x, total);
    P_PTR(prim, "out", out, axis == 0 ? cols : rows);
    int64_t count = axis == 0 ? rows : cols, nout = axis == 0 ? cols : rows;
    if (kind == 1 && count == 0 && nout > 0)
        return ks_errorf(KS_ERR_ARG, "mean: axis %d is empty (shape %lld x %lld)", axis, (long long)rows, (long long)cols);
    if (kind == 2) {
        P_NONNEG("var", "ddof", ddof);
        if (nout == 0) return KS_OK;
        if (count - ddof <= 0)
            return ks_errorf(KS_ERR_ARG, "var: %lld values with ddof = %lld leave no degrees of freedom", (long long)count,
                             (long long)ddof);
    }
    if (nout == 0) return KS_OK;
    double div = kind == 1 ? (double)count : 1.0;
    if (axis == 1) {
        for (int64_t r0 = 0; r0 < rows; r0 += 65535) {
            unsigned cnt = (unsigned)KS_MIN((int64_t)65535, rows - r0);
            reduce_rows_kernel<<<cnt, RT, 0, s>>>(x + r0 * cols, cols, div, kind == 2, ddof, out + r0);
            KS_CU_LAUNCH("reduce kernel (rows)");
        }
    } else {
        reduce_cols_kernel<<<ks_cdiv((size_t)cols, RT), RT, 0, s>>>(x, rows, cols, div, kind == 2, ddof, out);
        KS_CU_LAUNCH("reduce kernel (columns)");
    }
    return KS_OK;
}

extern "C" ks_status ks_cuda_sum(cudaStream_t s, const float *x, int64_t rows, int64_t cols, int axis, float *out) {
    return axis_reduce(s, "sum", x, rows, cols, axis, 0, 0, out);
}
extern "C" ks_status ks_cuda_mean(cudaStream_t s, const float *x, int64_t rows, int64_t cols, int axis, float *out) {
    return axis_reduce(s, "mean", x, rows, cols, axis, 1, 0, out);
}
extern "C" ks_status ks_cuda_var(cudaStream_t s, const float *x, int64_t rows, int64_t cols, int axis, int64_t ddof,
                                 float *out) {
    return axis_reduce(s, "var", x, rows, cols, axis, 2, ddof, out);
}

/* ---------------------------------------------------------------- cosine */

/* One block a row. Each thread sums its elements i = tid, tid + RT, ... in that order; their
 * loads are issued COS_BATCH at a time ahead of the sums (one load's latency a batch, not one an
 * element: a fingerprint of 4096 floats took 8 us with a load waited for at each element). */
#define COS_BATCH 8
__global__ void cosine_kernel(const float *a, const float *b, int64_t d, float *out) {
    __shared__ double sh[RT / 32];
    const float *ar = a + (int64_t)blockIdx.x * d, *br = b + (int64_t)blockIdx.x * d;
    double ab = 0, aa = 0, bb = 0;
    int64_t i = threadIdx.x;
    for (; i + (COS_BATCH - 1) * RT < d; i += COS_BATCH * RT) {
        float x[COS_BATCH], y[COS_BATCH];
#pragma unroll
        for (int j = 0; j < COS_BATCH; j++) {
            x[j] = ar[i + j * RT];
            y[j] = br[i + j * RT];
        }
#pragma unroll
        for (int j = 0; j < COS_BATCH; j++) {
            double xd = x[j], yd = y[j];
            ab += xd * yd;
            aa += xd * xd;
            bb += yd * yd;
        }
    }
    for (; i < d; i += RT) {
        double x = ar[i], y = br[i];
        ab += x * y;
        aa += x * x;
        bb += y * y;
    }
    ab = block_sum_d(ab, sh);
    aa = block_sum_d(aa, sh);
    bb = block_sum_d(bb, sh);
    if (threadIdx.x == 0) out[blockIdx.x] = (aa == 0 || bb == 0) ? 0.0f : (float)(ab / (sqrt(aa) * sqrt(bb)));
}

extern "C" ks_status ks_cuda_cosine(cudaStream_t s, const float *a, const float *b, int64_t n, float *out) {
    P_NONNEG("cosine", "n", n);
    P_PTR("cosine", "a", a, n);
    P_PTR("cosine", "b", b, n);
    P_PTR("cosine", "out", out, 1);
    cosine_kernel<<<1, RT, 0, s>>>(a, b, n, out);
    KS_CU_LAUNCH("cosine kernel");
    return KS_OK;
}

extern "C" ks_status ks_cuda_cosine_rows(cudaStream_t s, const float *a, const float *b, int64_t rows, int64_t d,
                                         float *out) {
    P_NONNEG("cosine", "rows", rows);
    P_NONNEG("cosine", "d", d);
    int64_t total;
    ks_status st = p_mul_size("cosine", rows, d, &total);
    if (st) return st;
    P_PTR("cosine", "a", a, total);
    P_PTR("cosine", "b", b, total);
    P_PTR("cosine", "out", out, rows);
    for (int64_t r0 = 0; r0 < rows; r0 += 65535) {
        unsigned cnt = (unsigned)KS_MIN((int64_t)65535, rows - r0);
        cosine_kernel<<<cnt, RT, 0, s>>>(a + r0 * d, b + r0 * d, d, out + r0);
        KS_CU_LAUNCH("cosine kernel");
    }
    return KS_OK;
}
