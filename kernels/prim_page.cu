/* prim_page.cu — page_reduce, bound_scores, page_rows on the GPU (ks_cuda_page.h; CPU twin and
 * meaning: core/prims_page.h). One thread per output element, each computing it exactly as the
 * CPU reference does (same order, double sums, exact products), so the results are bit-identical.
 * Memory traffic: page_reduce reads its rows once (coalesced along d): where the rows allow
 * 16-byte loads (d, the strides and the address multiples of 8 bf16 / 4 floats) each thread
 * takes 8 (4) adjacent columns of one page, every row's load in flight at once; else one
 * column a thread. bound_scores stages 32 boxes of one KV head in shared memory (16-byte loads),
 * then warp t computes query head t of the group for the 32 boxes (the query element a
 * broadcast), each thread summing its box in the CPU's order; shapes it does not take (g > 8,
 * d % 4 != 0, d > ~150) run one thread per output reading the boxes from L1 / L2. Measured on
 * the H200 (Quest at 128K: 8191 pages x 8 KV heads x 128; bench_kernels --quest): bench/NOTES.md. */
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

/* The same for V = 16 / sizeof(element) adjacent columns a thread (one 16-byte load a row):
 * thread e holds columns c0 .. c0 + V - 1 of page p, KV head j, each reduced exactly as above
 * (same row order, same comparisons, double sums), so the outputs are the same bits. */
template <bool BF16>
__global__ void __launch_bounds__(256) page_reduce_vec(const void *__restrict__ x, int64_t n, int64_t h, int64_t d,
                                                       int64_t rs, int64_t hs, int64_t page, int64_t p0, int64_t total,
                                                       float *__restrict__ omin, float *__restrict__ omax,
                                                       float *__restrict__ omean) {
    constexpr int V = BF16 ? 8 : 4;
    const int64_t dv = d / V, stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += stride) {
        const int64_t cv = e % dv, j = (e / dv) % h, p = p0 + e / (dv * h);
        const int64_t r0 = p * page, r1 = min(n, r0 + page), base = j * hs + cv * V;
        float mn[V], mx[V];
        double sum[V];
#pragma unroll 8
        for (int64_t r = r0; r < r1; r++) {
            const uint4 raw = __ldg((const uint4 *)((const char *)x + (size_t)(r * rs + base) * (BF16 ? 2 : 4)));
            float v[V];
            if (BF16) {
                const bf16 *b = (const bf16 *)&raw;
#pragma unroll
                for (int i = 0; i < V; i++) v[i] = __bfloat162float(b[i]);
            } else {
                const float *f = (const float *)&raw;
#pragma unroll
                for (int i = 0; i < V; i++) v[i] = f[i];
            }
#pragma unroll
            for (int i = 0; i < V; i++) {
                if (r == r0) {
                    mn[i] = mx[i] = v[i];
                    sum[i] = v[i];
                } else {
                    if (v[i] < mn[i] || isnan(v[i])) mn[i] = isnan(mn[i]) ? mn[i] : v[i];
                    if (v[i] > mx[i] || isnan(v[i])) mx[i] = isnan(mx[i]) ? mx[i] : v[i];
                    sum[i] += v[i];
                }
            }
        }
        const int64_t o = e * V;
#pragma unroll
        for (int i = 0; i < V; i += 4) {
            if (omin) *(float4 *)(omin + o + i) = make_float4(mn[i], mn[i + 1], mn[i + 2], mn[i + 3]);
            if (omax) *(float4 *)(omax + o + i) = make_float4(mx[i], mx[i + 1], mx[i + 2], mx[i + 3]);
        }
        if (omean) {
            const double cnt = (double)(r1 - r0);
#pragma unroll
            for (int i = 0; i < V; i++) omean[o + i] = (float)(sum[i] / cnt);
        }
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
    const int v = x_bf16 ? 8 : 4; /* elements a 16-byte load */
    if (d % v == 0 && row_stride % v == 0 && head_stride % v == 0 && (uintptr_t)x % 16 == 0 &&
        (!out_min || (uintptr_t)out_min % 16 == 0) && (!out_max || (uintptr_t)out_max % 16 == 0) &&
        (!out_mean || (uintptr_t)out_mean % 16 == 0)) {
        unsigned g = ks_grid1d((size_t)(total / v), 256);
        if (x_bf16)
            page_reduce_vec<true><<<g, 256, 0, s>>>(x, n, h, d, row_stride, head_stride, page, p0, total / v, out_min,
                                                    out_max, out_mean);
        else
            page_reduce_vec<false><<<g, 256, 0, s>>>(x, n, h, d, row_stride, head_stride, page, p0, total / v, out_min,
                                                     out_max, out_mean);
        KS_CU_LAUNCH("page_reduce kernel");
        return KS_OK;
    }
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

/* Tiled: block (x, kv) takes boxes j0 = 32 x .. j0 + 31 of KV head kv, staged in shared memory
 * with 16-byte loads (rows padded to d + 4 floats: a thread reads its box's row 4 floats at a
 * time without bank conflicts across the warp's 32 boxes), with the g query rows of the group
 * as doubles; warp t is query head kv * g + t, lane b box j0 + b, so each query element is one
 * broadcast. Each (head, box) sum is bound_one's, term by term in its order (d % 4 == 0). */
#define BS_TILE 32
__global__ void __launch_bounds__(256) bound_scores_tiled(const float *__restrict__ q, const float *__restrict__ lo,
                                                          const float *__restrict__ hi, int64_t n, int64_t hkv, int g,
                                                          int d, int reduce, float *__restrict__ out) {
    extern __shared__ double bs_smem[];
    const int ds = d + 4;                              /* padded row stride (floats) */
    double *res = bs_smem;                             /* (g, 32) per-head sums (group reductions) */
    double *qs = res + (size_t)g * BS_TILE;            /* (g, d) the group's query rows */
    float *sl = (float *)(qs + (size_t)g * d);         /* (32, ds) boxes' lo */
    float *sh = sl + BS_TILE * ds;                     /* (32, ds) boxes' hi */
    const int64_t kv = blockIdx.y, j0 = (int64_t)blockIdx.x * BS_TILE;
    const int nb = (int)min((int64_t)BS_TILE, n - j0), d4 = d / 4, t = threadIdx.x >> 5, lane = threadIdx.x & 31;
    /* warp w copies boxes w, w + g, ... (one 16-byte load a lane per row quarter) */
    for (int b = t; b < nb; b += g) {
        const float4 *gl = (const float4 *)(lo + ((j0 + b) * hkv + kv) * d);
        const float4 *gh = (const float4 *)(hi + ((j0 + b) * hkv + kv) * d);
        for (int c = lane; c < d4; c += 32) {
            *(float4 *)(sl + b * ds + 4 * c) = __ldg(gl + c);
            *(float4 *)(sh + b * ds + 4 * c) = __ldg(gh + c);
        }
    }
    for (int e = threadIdx.x; e < g * d; e += blockDim.x) qs[e] = (double)__ldg(q + kv * g * (int64_t)d + e);
    __syncthreads();
    const int b = lane;
    double acc = 0;
    if (b < nb) {
        const float *l = sl + b * ds, *u = sh + b * ds;
        const double *qh = qs + t * d;
        for (int i = 0; i < d; i += 4) {
            const float4 l4 = *(const float4 *)(l + i), u4 = *(const float4 *)(u + i);
            const float lv[4] = {l4.x, l4.y, l4.z, l4.w}, uv[4] = {u4.x, u4.y, u4.z, u4.w};
#pragma unroll
            for (int k = 0; k < 4; k++) {
                const double qi = qh[i + k];
                const double a = qi * (double)lv[k], c = qi * (double)uv[k]; /* exact: 24 + 24 bits */
                acc += (a > c || isnan(a)) ? a : c;
            }
        }
        if (reduce == KS_BOUND_NONE) out[(kv * g + t) * n + j0 + b] = (float)acc;
    }
    if (reduce == KS_BOUND_NONE) return;
    res[t * BS_TILE + b] = acc;
    __syncthreads();
    if (t != 0 || b >= nb) return;
    if (reduce == KS_BOUND_GROUP_MAX) {
        float m = 0;
        for (int s2 = 0; s2 < g; s2++) {
            float v = (float)res[s2 * BS_TILE + b];
            if (s2 == 0 || v > m || isnan(v)) m = (s2 > 0 && isnan(m)) ? m : v;
        }
        out[kv * n + j0 + b] = m;
    } else {
        double sum = 0;
        for (int s2 = 0; s2 < g; s2++) sum += res[s2 * BS_TILE + b];
        out[kv * n + j0 + b] = (float)sum;
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
    const int64_t g = n_q_heads / n_kv_heads;
    const size_t smem = sizeof(double) * g * (BS_TILE + d) + sizeof(float) * 2 * BS_TILE * (d + 4);
    if (g <= 8 && d % 4 == 0 && (uintptr_t)q % 16 == 0 && (uintptr_t)lo % 16 == 0 && (uintptr_t)hi % 16 == 0 &&
        smem <= 48 * 1024 && n_kv_heads <= 65535) {
        dim3 grid((unsigned)((n + BS_TILE - 1) / BS_TILE), (unsigned)n_kv_heads);
        bound_scores_tiled<<<grid, (unsigned)(32 * g), smem, s>>>(q, lo, hi, n, n_kv_heads, (int)g, (int)d, (int)reduce, out);
        KS_CU_LAUNCH("bound_scores kernel");
        return KS_OK;
    }
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
