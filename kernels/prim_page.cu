/* prim_page.cu — page_reduce, bound_scores, page_rows on the GPU (ks_cuda_page.h; CPU twin and
 * meaning: core/prims_page.h). Every output computed exactly as the CPU reference does (same
 * order, double sums, exact products), so the results are bit-identical.
 * Memory traffic: page_reduce reads its rows once (coalesced along d): where the rows allow
 * 16-byte loads (d, the strides and the address multiples of 8 bf16 / 4 floats) each thread
 * takes 8 (4) adjacent columns of one page, every row's load in flight at once; else one
 * column a thread. bound_scores (G = n_q_heads / n_kv_heads <= 8, d % 4 == 0, aligned boxes):
 * bound_scores_fast, a thread a box summing all G query heads of its group (each box element
 * loaded and widened to double once; q * max(lo, hi) or q * min(lo, hi) by the sign of q, as two
 * fma with max(q, 0) / min(q, 0): no compare, no per-head conversion), or a thread a query head
 * where there are too few boxes to fill the GPU; the boxes reach shared memory through cp.async
 * in chunks of 16 elements, double-buffered; inf / NaN in q or a box: that box (or block) redone
 * term for term as the CPU does. Other shapes: one thread per output reading the boxes from L1 /
 * L2 (bound_scores_kernel). Measured on an H100 SXM (bench_kernels --quest, Quest's
 * Llama-3.1-8B shape, group_max; bench/results/s18/bounds/): 128K (8191 pages, 67 MB of lo + hi)
 * 36.4 us against 48.8-49.1 us for the kernel before (staging 32 boxes, a warp a query head,
 * two conversions and a compare a term); 32K (2047 pages, 16.7 MB, L2-resident in the bench)
 * 16.3-17.5 us against 14.7-15.1 us (a thread a query head there). At 128K the kernel is bound
 * by the bytes in flight (ncu, before the L2::128B hint: 40 us, DRAM 54-58% of peak, 3.8 warps a
 * scheduler issuing 0.4 a cycle, stalled on the chunk loads): one 16 KB chunk in flight a block
 * and 4 blocks an SM (shared memory) is too little; the floor is ~22 us (3 TB/s). */
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

/* The fast kernel. Block b takes KV head kv = b % hkv (KV head fastest: the blocks in flight
 * read one stretch of lo / hi) and NB consecutive boxes; TPB = G / HPT threads a box, thread
 * (box, part) summing HPT of the group's G query heads (HPT = G: each box element loaded,
 * compared and widened once for the whole group; HPT = 1 where there are too few boxes to fill
 * the GPU). The boxes go through shared memory in chunks of BSF_C elements (cp.async, 16 bytes
 * a lane, each box's chunk one contiguous stretch; double-buffered, the next chunk in flight
 * while this one is summed; rows padded to BSF_C + 4 floats: a warp's float4 reads across its
 * boxes meet no bank conflict; 128 threads a block, 4 blocks an SM at G = 4, d = 128). The term
 * of query head t, max(q lo, q hi), is q * max(lo, hi) for q > 0 and q * min(lo, hi) for q < 0
 * (two products exact in double: the larger is the one with the larger / smaller factor), so
 * with qp = max(q, 0) and qn = min(q, 0) as doubles in shared memory the step is
 * s = fma(qn, mn, fma(qp, mx, s)): one fma adds the exact product (the same rounding as
 * s += term) and the other adds +-0 (s never is -0.0: it starts at +0.0). That holds only where
 * no product is NaN and the box values are finite (0 * inf, or a NaN, picks differently): query
 * rows with an inf / NaN (the block sees it while staging them), or a box with an inf / NaN
 * element (fma(x, 0, chk) turns chk NaN), are recomputed with bound_one, term for term the CPU's.
 * The group's reductions take the per-head double sums in head order (through shared memory
 * where a box has several threads). G <= 8, d % 4 == 0, 16-byte aligned lo / hi. */
#define BSF_T 128 /* threads a block (at most) */
#define BSF_C 16  /* box elements a chunk */
#define BSF_RS (BSF_C + 4)

/* 16 bytes global -> shared, bypassing L1; L2::128B: a miss fetches the whole 128-byte line (the
 * row's next chunk) from DRAM in one go (measured: 36.4 us at 128K against 40.3-41.2 without the
 * hint and 43.5-45.6 with L2::256B, which crowds the L2) */
static __device__ __forceinline__ void bsf_cp16(void *dst, const void *src) {
    asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16;\n" ::"r"((uint32_t)__cvta_generic_to_shared(dst)),
                 "l"(src)
                 : "memory");
}
static __device__ __forceinline__ void bsf_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
static __device__ __forceinline__ void bsf_wait0() { asm volatile("cp.async.wait_group 0;\n" ::: "memory"); }

template <int G, int HPT> struct bsf_shape {
    static constexpr int TPB = G / HPT;     /* threads a box */
    static constexpr int NB = BSF_T / TPB;  /* boxes a block */
};

/* shared memory: (G, d + 1) (qp, qn) pairs, 2 buffers x (lo, hi) x NB x BSF_RS floats, and the
 * (NB, G) per-head sums where a box has several threads */
static size_t bsf_smem(int g, int hpt, int64_t d) {
    const int tpb = g / hpt, nb = BSF_T / tpb;
    return sizeof(double2) * g * (d + 1) + sizeof(float) * 2 * 2 * nb * BSF_RS + (tpb > 1 ? sizeof(double) * nb * g : 0);
}

template <int G, int HPT>
__global__ void __launch_bounds__(BSF_T) bound_scores_fast(const float *__restrict__ q, const float *__restrict__ lo,
                                                           const float *__restrict__ hi, int64_t n, int hkv, int d,
                                                           int reduce, float *__restrict__ out) {
    constexpr int TPB = bsf_shape<G, HPT>::TPB, NB = bsf_shape<G, HPT>::NB;
    extern __shared__ __align__(16) unsigned char bsf_sm[];
    const int qstride = d + 1; /* double2 units: rows of different heads in different banks */
    double2 *qs = (double2 *)bsf_sm;
    float *stage = (float *)(qs + G * qstride);
    double *res = (double *)(stage + 2 * 2 * NB * BSF_RS);
    const int kv = (int)(blockIdx.x % (unsigned)hkv);
    const int64_t j0 = (int64_t)(blockIdx.x / (unsigned)hkv) * NB;
    const int nb = (int)min((int64_t)NB, n - j0), tid = threadIdx.x, b = tid / TPB, t0 = (tid % TPB) * HPT;
    const int64_t j = j0 + b;
    const float *qg = q + (int64_t)kv * G * d;
    const float *l = lo + (j * hkv + kv) * d, *u = hi + (j * hkv + kv) * d;
    const int nthr = NB * TPB, d4 = d / 4, nc = (d + BSF_C - 1) / BSF_C;
    /* chunk c of the block's boxes into buffer c & 1: lane e copies float4 k of box bb's row */
    auto issue = [&](int c) {
        const int i0 = c * BSF_C, w4 = min(BSF_C / 4, d4 - i0 / 4), per = nb * w4;
        float *dst = stage + (c & 1) * 2 * NB * BSF_RS;
        for (int e = tid; e < 2 * per; e += nthr) {
            const int arr = e >= per, r = e - arr * per;
            const int bb = w4 == BSF_C / 4 ? r / (BSF_C / 4) : r / w4, k = r - bb * w4;
            const float *src = (arr ? hi : lo) + ((j0 + bb) * hkv + kv) * d + i0 + 4 * k;
            bsf_cp16(dst + (arr * NB + bb) * BSF_RS + 4 * k, src);
        }
        bsf_commit();
    };
    issue(0);
    int bad = 0;
    for (int e = tid; e < G * d; e += nthr) {
        const float v = __ldg(qg + e);
        bad |= !isfinite(v);
        qs[(e / d) * qstride + e % d] = make_double2(v > 0.f ? (double)v : 0.0, v < 0.f ? (double)v : 0.0);
    }
    const int q_bad = __syncthreads_or(bad);
    double s[HPT];
#pragma unroll
    for (int h = 0; h < HPT; h++) s[h] = 0;
    float chk_l = 0.f, chk_u = 0.f; /* NaN once a box value is inf / NaN */
    for (int c = 0; c < nc; c++) {
        bsf_wait0();
        __syncthreads(); /* chunk c landed for every thread; every thread is done with chunk c - 1 */
        if (c + 1 < nc) issue(c + 1);
        if (b >= nb || q_bad) continue;
        const int i0 = c * BSF_C, w = min(BSF_C, d - i0);
        const float *rl = stage + (c & 1) * 2 * NB * BSF_RS + b * BSF_RS, *rh = rl + NB * BSF_RS;
#pragma unroll
        for (int i = 0; i < BSF_C; i += 4) {
            if (i >= w) break;
            const float4 l4 = *(const float4 *)(rl + i), u4 = *(const float4 *)(rh + i);
            const float lv[4] = {l4.x, l4.y, l4.z, l4.w}, uv[4] = {u4.x, u4.y, u4.z, u4.w};
#pragma unroll
            for (int k = 0; k < 4; k++) {
                chk_l = fmaf(lv[k], 0.f, chk_l);
                chk_u = fmaf(uv[k], 0.f, chk_u);
                const double mx = (double)fmaxf(lv[k], uv[k]), mn = (double)fminf(lv[k], uv[k]);
#pragma unroll
                for (int h = 0; h < HPT; h++) {
                    const double2 qq = qs[(t0 + h) * qstride + i0 + i + k];
                    s[h] = fma(qq.y, mn, fma(qq.x, mx, s[h]));
                }
            }
        }
    }
    if (b < nb && (q_bad || isnan(chk_l) || isnan(chk_u))) {
#pragma unroll
        for (int h = 0; h < HPT; h++) s[h] = bound_one(qg + (t0 + h) * d, l, u, d);
    }
    if (reduce == KS_BOUND_NONE) {
        if (b < nb) {
#pragma unroll
            for (int h = 0; h < HPT; h++) out[((int64_t)kv * G + t0 + h) * n + j] = (float)s[h];
        }
        return;
    }
    double gs[G]; /* the group's G sums of box jb, in head order */
    int jb;
    if constexpr (TPB == 1) {
#pragma unroll
        for (int t = 0; t < G; t++) gs[t] = s[t % HPT]; /* HPT == G */
        jb = b;
    } else {
        if (b < nb) {
#pragma unroll
            for (int h = 0; h < HPT; h++) res[b * G + t0 + h] = s[h];
        }
        __syncthreads();
        jb = tid;
        if (jb >= nb) return;
#pragma unroll
        for (int t = 0; t < G; t++) gs[t] = res[jb * G + t];
    }
    if (reduce == KS_BOUND_GROUP_MAX) {
        float m = (float)gs[0];
#pragma unroll
        for (int t = 1; t < G; t++) {
            const float v = (float)gs[t];
            if (v > m || isnan(v)) m = isnan(m) ? m : v;
        }
        out[(int64_t)kv * n + j0 + jb] = m;
    } else {
        double sum = 0;
#pragma unroll
        for (int t = 0; t < G; t++) sum += gs[t];
        out[(int64_t)kv * n + j0 + jb] = (float)sum;
    }
}

/* HPT = G where there are boxes enough for a thread each to fill the GPU (~300 a SM), else 1 */
template <int G>
static ks_status bsf_launch(cudaStream_t st, const float *q, const float *lo, const float *hi, int64_t n, int64_t hkv,
                            int64_t d, int reduce, float *out, int nsm) {
    const bool wide = G == 1 || n * hkv >= (int64_t)nsm * 300;
    const int hpt = wide ? G : 1, nb = BSF_T / (G / hpt), thr = nb * (G / hpt);
    const size_t smem = bsf_smem(G, hpt, d);
    const unsigned blocks = (unsigned)(((n + nb - 1) / nb) * hkv);
    auto kern = wide ? bound_scores_fast<G, G> : bound_scores_fast<G, 1>;
    static size_t allowed[2][64]; /* the dynamic shared memory opted in, per kernel and device */
    int dev = 0;
    KS_CU(cudaGetDevice(&dev), "bound_scores device");
    if (smem > 48 * 1024 && (dev >= 64 || allowed[wide][dev] < smem)) {
        KS_CU(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem),
              "bound_scores shared memory");
        if (dev < 64) allowed[wide][dev] = smem;
    }
    kern<<<blocks, thr, smem, st>>>(q, lo, hi, n, (int)hkv, (int)d, reduce, out);
    KS_CU_LAUNCH("bound_scores kernel");
    return KS_OK;
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
    if (g <= 8 && d % 4 == 0 && (uintptr_t)lo % 16 == 0 && (uintptr_t)hi % 16 == 0 &&
        bsf_smem((int)g, 1, d) <= 96 * 1024 && bsf_smem((int)g, (int)g, d) <= 96 * 1024 &&
        (n + BSF_T - 1) / (BSF_T / g) * n_kv_heads <= INT32_MAX) {
        static int nsms[64];
        int dev = 0, nsm = 132;
        if (!cudaGetDevice(&dev) && dev < 64 && !nsms[dev])
            if (cudaDeviceGetAttribute(&nsms[dev], cudaDevAttrMultiProcessorCount, dev) || nsms[dev] < 1) nsms[dev] = 132;
        if (dev < 64 && nsms[dev] > 0) nsm = nsms[dev];
        switch (g) {
        case 1: return bsf_launch<1>(s, q, lo, hi, n, n_kv_heads, d, (int)reduce, out, nsm);
        case 2: return bsf_launch<2>(s, q, lo, hi, n, n_kv_heads, d, (int)reduce, out, nsm);
        case 3: return bsf_launch<3>(s, q, lo, hi, n, n_kv_heads, d, (int)reduce, out, nsm);
        case 4: return bsf_launch<4>(s, q, lo, hi, n, n_kv_heads, d, (int)reduce, out, nsm);
        case 5: return bsf_launch<5>(s, q, lo, hi, n, n_kv_heads, d, (int)reduce, out, nsm);
        case 6: return bsf_launch<6>(s, q, lo, hi, n, n_kv_heads, d, (int)reduce, out, nsm);
        case 7: return bsf_launch<7>(s, q, lo, hi, n, n_kv_heads, d, (int)reduce, out, nsm);
        default: return bsf_launch<8>(s, q, lo, hi, n, n_kv_heads, d, (int)reduce, out, nsm);
        }
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
