/* prim_page.cu — page_reduce, bound_scores, page_rows on the GPU (ks_cuda_page.h; CPU twin and
 * meaning: core/prims_page.h). One thread per output element, each computing it exactly as the
 * CPU reference does (same order, double sums, exact products), so the results are bit-identical.
 * Memory traffic: page_reduce reads its rows once (coalesced along d); bound_scores reads the
 * boxes once per query head of the group (from L1 / L2 after the first). */
#include "prim_common.cuh"
#include "ks_cuda_page.h"

/* ================================================================ page_reduce */

template <bool BF16>
__global__ void page_reduce_kernel(const void *__restrict__ x, int64_t n, int64_t h, int64_t d, int64_t rs, int64_t hs,
                                   int64_t page, int64_t p0, int64_t total, float *__restrict__ omin,
                                   float *__restrict__ omax, float *__restrict__ omean) {
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += stride) {
        int64_t c = e % d, j = (e / d) % h, p = p0 + e / (d * h);
        int64_t r0 = p * page, r1 = min(n, r0 + page), base = j * hs + c;
        float mn, mx;
        double sum;
#define PR_LOAD(r) (BF16 ? __bfloat162float(((const bf16 *)x)[(r) * rs + base]) : ((const float *)x)[(r) * rs + base])
        mn = mx = PR_LOAD(r0);
        sum = mn;
        for (int64_t r = r0 + 1; r < r1; r++) {
            float v = PR_LOAD(r);
            if (v < mn || isnan(v)) mn = isnan(mn) ? mn : v;
            if (v > mx || isnan(v)) mx = isnan(mx) ? mx : v;
            sum += v;
        }
#undef PR_LOAD
        if (omin) omin[e] = mn;
        if (omax) omax[e] = mx;
        if (omean) omean[e] = (float)(sum / (double)(r1 - r0));
    }
}

extern "C" ks_status ks_cuda_page_reduce(cudaStream_t s, const void *x, int x_bf16, int64_t n, int64_t h, int64_t d,
                                         int64_t row_stride, int64_t head_stride, int64_t page, int64_t p0, int64_t p1,
                                         float *out_min, float *out_max, float *out_mean) {
    ks_status st = ks_page_reduce_check_args(x, x_bf16, n, h, d, row_stride, head_stride, page, p0, p1, out_min, out_max,
                                             out_mean);
    if (st) return st;
    int64_t total = (p1 - p0) * h * d;
    if (total == 0) return KS_OK;
    unsigned grid = ks_grid1d((size_t)total, 256);
    if (x_bf16)
        page_reduce_kernel<true><<<grid, 256, 0, s>>>(x, n, h, d, row_stride, head_stride, page, p0, total, out_min,
                                                       out_max, out_mean);
    else
        page_reduce_kernel<false><<<grid, 256, 0, s>>>(x, n, h, d, row_stride, head_stride, page, p0, total, out_min,
                                                        out_max, out_mean);
    KS_CU_LAUNCH("page_reduce kernel");
    return KS_OK;
}

/* ================================================================ bound_scores */

static __device__ __forceinline__ double bound_one(const float *__restrict__ q, const float *__restrict__ lo,
                                                   const float *__restrict__ hi, int64_t d) {
    double s = 0;
    for (int64_t i = 0; i < d; i++) {
        double a = (double)q[i] * (double)lo[i], b = (double)q[i] * (double)hi[i]; /* exact: 24 + 24 bits */
        s += (a > b || isnan(a)) ? a : b;
    }
    return s;
}

/* one thread per output (row r, box j): r is a query head (NONE) or a KV head (GROUP_*) */
__global__ void bound_scores_kernel(const float *__restrict__ q, const float *__restrict__ lo, const float *__restrict__ hi,
                                    int64_t n, int64_t hkv, int64_t g, int64_t d, int reduce, int64_t rows,
                                    float *__restrict__ out) {
    int64_t total = rows * n, stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += stride) {
        int64_t r = e / n, j = e - r * n;
        int64_t kv = reduce == KS_BOUND_NONE ? r / g : r;
        const float *l = lo + (j * hkv + kv) * d, *u = hi + (j * hkv + kv) * d;
        if (reduce == KS_BOUND_NONE) {
            out[e] = (float)bound_one(q + r * d, l, u, d);
        } else if (reduce == KS_BOUND_GROUP_MAX) {
            float m = 0;
            for (int64_t t = 0; t < g; t++) {
                float v = (float)bound_one(q + (kv * g + t) * d, l, u, d);
                if (t == 0 || v > m || isnan(v)) m = (t > 0 && isnan(m)) ? m : v;
            }
            out[e] = m;
        } else {
            double sum = 0;
            for (int64_t t = 0; t < g; t++) sum += bound_one(q + (kv * g + t) * d, l, u, d);
            out[e] = (float)sum;
        }
    }
}

extern "C" ks_status ks_cuda_bound_scores(cudaStream_t s, const float *q, int64_t n_q_heads, const float *lo,
                                          const float *hi, int64_t n, int64_t n_kv_heads, int64_t d,
                                          ks_bound_reduce reduce, float *out) {
    ks_status st = ks_bound_scores_check_args(n_q_heads, n, n_kv_heads, d, reduce);
    if (st) return st;
    if (n == 0) return KS_OK;
    if (!q || !lo || !hi || !out) return ks_errorf(KS_ERR_ARG, "bound_scores: NULL data");
    int64_t rows = reduce == KS_BOUND_NONE ? n_q_heads : n_kv_heads;
    bound_scores_kernel<<<ks_grid1d((size_t)(rows * n), 128), 128, 0, s>>>(q, lo, hi, n, n_kv_heads, n_q_heads / n_kv_heads,
                                                                          d, (int)reduce, rows, out);
    KS_CU_LAUNCH("bound_scores kernel");
    return KS_OK;
}

/* ================================================================ page_rows */

/* one thread per output row id; the first thread of each page entry also checks that entry */
__global__ void page_rows_kernel(const int32_t *__restrict__ pages, int64_t lists, int64_t k, int64_t page, int64_t w,
                                 int64_t bb, int64_t be, int64_t ab, int64_t lo_row, int64_t hi_row,
                                 int32_t *__restrict__ out, unsigned long long *err) {
    int64_t total = lists * w, stride = (int64_t)gridDim.x * blockDim.x, nb = be - bb;
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += stride) {
        int64_t l = e / w, o = e - l * w;
        int64_t v;
        if (o < nb) v = bb + o;
        else if (o < nb + k * page) {
            int64_t t = (o - nb) / page, r = (o - nb) - t * page;
            int64_t p = pages[l * k + t];
            v = p * page + r;
            if (r == 0 && err) {
                int bad = p < 0 || p * page < lo_row || (p + 1) * page > hi_row || (t > 0 && p <= pages[l * k + t - 1]);
                if (bad) atomicMin(err, (unsigned long long)(l * k + t));
            }
        } else v = ab + (o - nb - k * page);
        out[e] = (int32_t)v;
    }
}

extern "C" ks_status ks_cuda_page_rows(cudaStream_t s, const int32_t *pages, int64_t lists, int64_t k, int64_t page,
                                       int64_t n, int64_t before_begin, int64_t before_end, int64_t after_begin,
                                       int64_t after_end, int32_t *out, int64_t *err) {
    int64_t w;
    ks_status st = ks_page_rows_check_args(lists, k, page, n, before_begin, before_end, after_begin, after_end, &w);
    if (st) return st;
    if (lists * w == 0) return KS_OK;
    if (!out || (k > 0 && !pages)) return ks_errorf(KS_ERR_ARG, "page_rows: NULL data");
    int64_t lo_row = before_end > before_begin ? before_end : 0;
    int64_t hi_row = after_end > after_begin ? after_begin : n;
    page_rows_kernel<<<ks_grid1d((size_t)(lists * w), 256), 256, 0, s>>>(pages, lists, k, page, w, before_begin, before_end,
                                                                        after_begin, lo_row, hi_row, out,
                                                                        (unsigned long long *)err);
    KS_CU_LAUNCH("page_rows kernel");
    return KS_OK;
}
