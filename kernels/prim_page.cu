/* prim_page.cu — page_reduce, bound_scores, page_rows on the GPU (ks_cuda_page.h; CPU twin and
 * meaning: core/prims_page.h). Every output is computed exactly as the CPU reference does (same
 * order, double sums, exact products), so the results are bit-identical.
 * Memory traffic: page_reduce reads its rows once (coalesced along d): where the rows allow
 * 16-byte loads (d, the strides and the address multiples of 8 bf16 / 4 floats) each thread
 * takes 8 (4) adjacent columns of one page, every row's load in flight at once; else one
 * column a thread. bound_scores: a warp a box, the lanes' partial sums in the fixed order of
 * core/prims_page.h halved through shared memory (bound_scores_warp), or one thread per output
 * for the shapes it does not take (g > 8, d % 4 != 0, d > 256, misaligned boxes). Measured on an
 * H100 (Quest at 128K: 8191 pages x 8 KV heads x 128): bench/NOTES.md, issue 14, sessions 19-20.
 * Packed boxes (page_box, bound_scores_box: two bf16 ends in one word) take the same kernels
 * with half the bytes a box. */
#include "prim_common.cuh"
#include "ks_cuda_page.h"

/* ================================================================ page_reduce */

/* ks_bf16_dir (core/prims_page.h): the bf16 bits of f rounded toward -inf (down) or +inf */
static __device__ __forceinline__ uint32_t bf16_dir(float f, bool down) {
    const uint32_t u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (u >> 16) | 0x0040u;
    const uint32_t t = u >> 16;
    if (!(u & 0xffffu)) return t;
    return down == (bool)(u >> 31) ? t + 1 : t;
}
static __device__ __forceinline__ uint32_t box_pack(float mn, float mx) { return bf16_dir(mn, true) | bf16_dir(mx, false) << 16; }

template <bool BF16>
__global__ void page_reduce_kernel(const void *__restrict__ x, int64_t n, int64_t h, int64_t d, int64_t rs, int64_t hs,
                                   int64_t page, int64_t p0, int64_t total, float *__restrict__ omin,
                                   float *__restrict__ omax, float *__restrict__ omean, uint32_t *__restrict__ obox) {
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
        if (obox) obox[e] = box_pack(mn, mx);
    }
}

/* The same for V = 16 / sizeof(element) adjacent columns a thread (one 16-byte load a row):
 * thread e holds columns c0 .. c0 + V - 1 of page p, KV head j, each reduced exactly as above
 * (same row order, same comparisons, double sums), so the outputs are the same bits. */
template <bool BF16>
__global__ void __launch_bounds__(256) page_reduce_vec(const void *__restrict__ x, int64_t n, int64_t h, int64_t d,
                                                       int64_t rs, int64_t hs, int64_t page, int64_t p0, int64_t total,
                                                       float *__restrict__ omin, float *__restrict__ omax,
                                                       float *__restrict__ omean, uint32_t *__restrict__ obox) {
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
            if (obox)
                *(uint4 *)(obox + o + i) = make_uint4(box_pack(mn[i], mx[i]), box_pack(mn[i + 1], mx[i + 1]),
                                                      box_pack(mn[i + 2], mx[i + 2]), box_pack(mn[i + 3], mx[i + 3]));
        }
        if (omean) {
            const double cnt = (double)(r1 - r0);
#pragma unroll
            for (int i = 0; i < V; i++) omean[o + i] = (float)(sum[i] / cnt);
        }
    }
}

static void page_reduce_launch(cudaStream_t s, const void *x, int x_bf16, int64_t n, int64_t h, int64_t d,
                               int64_t row_stride, int64_t head_stride, int64_t page, int64_t p0, int64_t p1,
                               float *out_min, float *out_max, float *out_mean, uint32_t *out_box) {
    int64_t total = (p1 - p0) * h * d;
    const int v = x_bf16 ? 8 : 4; /* elements a 16-byte load */
    if (d % v == 0 && row_stride % v == 0 && head_stride % v == 0 && (uintptr_t)x % 16 == 0 &&
        (!out_min || (uintptr_t)out_min % 16 == 0) && (!out_max || (uintptr_t)out_max % 16 == 0) &&
        (!out_mean || (uintptr_t)out_mean % 16 == 0) && (!out_box || (uintptr_t)out_box % 16 == 0)) {
        unsigned g = ks_grid1d((size_t)(total / v), 256);
        if (x_bf16)
            page_reduce_vec<true><<<g, 256, 0, s>>>(x, n, h, d, row_stride, head_stride, page, p0, total / v, out_min,
                                                    out_max, out_mean, out_box);
        else
            page_reduce_vec<false><<<g, 256, 0, s>>>(x, n, h, d, row_stride, head_stride, page, p0, total / v, out_min,
                                                     out_max, out_mean, out_box);
        return;
    }
    unsigned grid = ks_grid1d((size_t)total, 256);
    if (x_bf16)
        page_reduce_kernel<true><<<grid, 256, 0, s>>>(x, n, h, d, row_stride, head_stride, page, p0, total, out_min,
                                                       out_max, out_mean, out_box);
    else
        page_reduce_kernel<false><<<grid, 256, 0, s>>>(x, n, h, d, row_stride, head_stride, page, p0, total, out_min,
                                                        out_max, out_mean, out_box);
}

extern "C" ks_status ks_cuda_page_reduce(cudaStream_t s, const void *x, int x_bf16, int64_t n, int64_t h, int64_t d,
                                         int64_t row_stride, int64_t head_stride, int64_t page, int64_t p0, int64_t p1,
                                         float *out_min, float *out_max, float *out_mean) {
    ks_status st = ks_page_reduce_check_args(x, x_bf16, n, h, d, row_stride, head_stride, page, p0, p1, out_min, out_max,
                                             out_mean);
    if (st) return st;
    if ((p1 - p0) * h * d == 0) return KS_OK;
    page_reduce_launch(s, x, x_bf16, n, h, d, row_stride, head_stride, page, p0, p1, out_min, out_max, out_mean, NULL);
    KS_CU_LAUNCH("page_reduce kernel");
    return KS_OK;
}

extern "C" ks_status ks_cuda_page_box(cudaStream_t s, const void *x, int x_bf16, int64_t n, int64_t h, int64_t d,
                                      int64_t row_stride, int64_t head_stride, int64_t page, int64_t p0, int64_t p1,
                                      uint32_t *out_box) {
    ks_status st = ks_page_box_check_args(x, x_bf16, n, h, d, row_stride, head_stride, page, p0, p1, out_box);
    if (st) return st;
    if ((p1 - p0) * h * d == 0) return KS_OK;
    page_reduce_launch(s, x, x_bf16, n, h, d, row_stride, head_stride, page, p0, p1, NULL, NULL, NULL, out_box);
    KS_CU_LAUNCH("page_reduce kernel");
    return KS_OK;
}

/* ================================================================ bound_scores */

/* The ends of box element i: float lo / hi, or a packed bf16 pair (box != NULL; core/prims_page.h) */
static __device__ __forceinline__ void box_at(const float *__restrict__ lo, const float *__restrict__ hi,
                                              const uint32_t *__restrict__ box, int64_t i, float &l, float &u) {
    if (box) {
        const uint32_t v = box[i];
        l = __uint_as_float(v << 16);
        u = __uint_as_float(v & 0xffff0000u);
    } else {
        l = lo[i];
        u = hi[i];
    }
}

/* One bound in the fixed order of core/prims_page.h (ks_cpu_bound_scores): term i into partial
 * (i / 4) % 32, i ascending within a partial, then the partials halved. */
static __device__ __forceinline__ double bound_term(float q, float l, float u) {
    const double a = (double)q * (double)l, b = (double)q * (double)u; /* exact: 24 + 24 bits */
    return (a > b || isnan(a)) ? a : b;
}
static __device__ double bound_one(const float *__restrict__ q, const float *__restrict__ lo,
                                   const float *__restrict__ hi, const uint32_t *__restrict__ box, int64_t d) {
    double p[KS_BOUND_PARTS];
    for (int l = 0; l < KS_BOUND_PARTS; l++) p[l] = 0;
    for (int64_t i = 0; i < d; i++) {
        float l, u;
        box_at(lo, hi, box, i, l, u);
        p[(i >> 2) % KS_BOUND_PARTS] += bound_term(q[i], l, u);
    }
    for (int o = KS_BOUND_PARTS / 2; o > 0; o >>= 1)
        for (int l = 0; l < o; l++) p[l] += p[l + o];
    return p[0];
}

/* one thread per output (row r, box j): r is a query head (NONE) or a KV head (GROUP_*); the
 * shapes bound_scores_warp does not take. Boxes: lo / hi, or packed (box). */
__global__ void bound_scores_kernel(const float *__restrict__ q, const float *__restrict__ lo, const float *__restrict__ hi,
                                    const uint32_t *__restrict__ box, int64_t n, int64_t hkv, int64_t g, int64_t d,
                                    int reduce, int64_t rows, float *__restrict__ out) {
    int64_t total = rows * n, stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += stride) {
        int64_t r = e / n, j = e - r * n;
        int64_t kv = reduce == KS_BOUND_NONE ? r / g : r, o = (j * hkv + kv) * d;
        const float *l = box ? NULL : lo + o, *u = box ? NULL : hi + o;
        const uint32_t *bx = box ? box + o : NULL;
        if (reduce == KS_BOUND_NONE) {
            out[e] = (float)bound_one(q + r * d, l, u, bx, d);
        } else if (reduce == KS_BOUND_GROUP_MAX) {
            float m = 0;
            for (int64_t t = 0; t < g; t++) {
                float v = (float)bound_one(q + (kv * g + t) * d, l, u, bx, d);
                if (t == 0 || v > m || isnan(v)) m = (t > 0 && isnan(m)) ? m : v;
            }
            out[e] = m;
        } else {
            double sum = 0;
            for (int64_t t = 0; t < g; t++) sum += bound_one(q + (kv * g + t) * d, l, u, bx, d);
            out[e] = (float)sum;
        }
    }
}

/* A 16-byte piece of a box row: four channels' ends, as two float4 (lo, hi) or one uint4 of
 * packed pairs (BOX), loaded with streaming loads and unpacked to floats exactly. */
template <bool BOX> struct bw_piece;
template <> struct bw_piece<false> {
    float4 l, u;
    __device__ __forceinline__ void load(const float *lo, const float *hi, const uint32_t *, int64_t off, int c) {
        l = __ldcs((const float4 *)(lo + off) + c);
        u = __ldcs((const float4 *)(hi + off) + c);
    }
    __device__ __forceinline__ void zero() { l = u = make_float4(0.f, 0.f, 0.f, 0.f); }
    __device__ __forceinline__ void ends(float l4[4], float u4[4]) const {
        l4[0] = l.x, l4[1] = l.y, l4[2] = l.z, l4[3] = l.w;
        u4[0] = u.x, u4[1] = u.y, u4[2] = u.z, u4[3] = u.w;
    }
};
template <> struct bw_piece<true> {
    uint4 b;
    __device__ __forceinline__ void load(const float *, const float *, const uint32_t *box, int64_t off, int c) {
        b = __ldcs((const uint4 *)(box + off) + c);
    }
    __device__ __forceinline__ void zero() { b = make_uint4(0u, 0u, 0u, 0u); }
    __device__ __forceinline__ void ends(float l4[4], float u4[4]) const {
        const uint32_t v[4] = {b.x, b.y, b.z, b.w};
#pragma unroll
        for (int e = 0; e < 4; e++) {
            l4[e] = __uint_as_float(v[e] << 16);
            u4[e] = __uint_as_float(v[e] & 0xffff0000u);
        }
    }
};

/* A warp a box (page j, KV head kv). Warp w always serves KV head w % hkv (boxes j = w / hkv + i
 * wpk), so the group's query values of its lanes' dimensions sit in registers as doubles, loaded
 * once. Lane l loads the 16-byte pieces c = l, l + 32, ... (NC) of the box's row into registers
 * (lo and hi rows, or the packed row: BOX), U boxes at once: each warp load is whole lines, the
 * pattern that reads at the streaming rate (cp.async or bulk copies of the same rows into shared
 * memory read slower: bench/NOTES.md, issue 14, session 19). A piece is four channels either
 * way, so lane l sums partial l of the fixed order (piece c's four terms ascending, then piece
 * c + 32's) for the G heads of the group; the (U x G) x 32 partials go through shared memory
 * and lane u * G + h halves box u's partials of head h in the fixed order, so a bound is one
 * lane's sum (no shuffle tree). Term max(q lo, q hi): with q, lo and hi finite it is
 * q * max(lo, hi) for q > 0 and q * min(lo, hi) otherwise (both products exact; where q is +-0
 * the term is +-0, and a partial is never -0, so either zero adds the same): one fma, q > 0
 * tested on the double's high word (one 32-bit compare: a double made from a float is > 0 exactly
 * where that word is). A lane with an inf / NaN among a chunk's values (CB boxes; or among its
 * query's) takes bound_term, the CPU's rule, term for term for the chunk (the same terms where the
 * values are finite); the check comes first and branch-free, so with CB = U the batch's sums are
 * straight-line code (-7% a call at 128K on an H200, bench/NOTES.md, issue 14 session 42). GP: the
 * group size rounded up to a power of two (padded heads have q = 0 and are not written); NC:
 * pieces a lane (d <= 128 NC); GP * NC <= 8 (the query registers). Packed boxes are half the
 * bytes a box, so twice as many are loaded together (U) by half as many warps a block, which
 * keeps the bytes in flight an SM those of the float boxes. */
#define BW_WARPS(box) ((box) ? 4 : 8)
#define BW_U(gp, box) ((box) ? ((gp) >= 8 ? 4 : 8) : ((gp) >= 8 ? 2 : 4)) /* boxes loaded together (U * GP <= 32) */
#define BW_BLOCKS_SM(box) ((box) ? 4 : 2)
#define BW_PS (KS_BOUND_PARTS + 1) /* padded row of partials (doubles) */
static_assert(KS_BOUND_PARTS == 32, "bound_scores_warp halves 32 partials");
template <int GP, int NC, bool BOX>
__global__ void __launch_bounds__(BW_WARPS(BOX) * 32, BW_BLOCKS_SM(BOX))
    bound_scores_warp(const float *__restrict__ q, const float *__restrict__ lo, const float *__restrict__ hi,
                      const uint32_t *__restrict__ box, int64_t n, int hkv, int g, int d, int64_t wpk, int reduce,
                      float *__restrict__ out) {
    constexpr int U = BW_U(GP, BOX), WARPS = BW_WARPS(BOX);
    /* boxes checked and summed together: the whole batch at the shape measured (packed boxes, GP
     * 4, d <= 128: -7% a call, bench/NOTES.md, issue 14 session 42); a box at a time elsewhere
     * (the batch's straight-line sums spill at several other shapes) */
    constexpr int CB = BOX && GP == 4 && NC == 1 ? U : 1;
    __shared__ double red[WARPS][U * GP][BW_PS];
    const int lane = threadIdx.x & 31, wi = threadIdx.x >> 5, d4 = d >> 2;
    const int64_t w = (int64_t)blockIdx.x * WARPS + wi;
    if (w >= wpk * hkv) return; /* warp-uniform; no block barrier below */
    const int kv = (int)(w % hkv);
    const int64_t bs = (int64_t)hkv * d, jw = w / hkv; /* elements from a page's box to the next; the warp's first box */
    double qd[GP][NC][4];
    bool qfin = true;
#pragma unroll
    for (int t = 0; t < GP; t++)
#pragma unroll
        for (int m = 0; m < NC; m++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int c = lane + 32 * m;
                float v = 0.f;
                if (t < g && c < d4) v = __ldg(q + ((int64_t)kv * g + t) * d + 4 * c + e);
                qfin = qfin && isfinite(v);
                qd[t][m][e] = (double)v;
            }
    /* the U boxes j0, j0 + wpk, .. into pc */
#define BW_LOAD(j0, pc)                                                                    \
    _Pragma("unroll") for (int b = 0; b < U; b++) {                                        \
        const int64_t j = (j0) + b * wpk;                                                  \
        _Pragma("unroll") for (int m = 0; m < NC; m++) {                                   \
            const int c = lane + 32 * m;                                                   \
            if (j < n && c < d4) pc[b][m].load(lo, hi, box, j * bs + (int64_t)kv * d, c);  \
            else pc[b][m].zero();                                                          \
        }                                                                                  \
    }
    bw_piece<BOX> pc[U][NC];
    BW_LOAD(jw, pc)
    for (int64_t j0 = jw; j0 < n; j0 += U * wpk) {
#pragma unroll
        for (int b0 = 0; b0 < U; b0 += CB) { /* CB boxes checked, then summed, together */
            bool fin = qfin;
#pragma unroll
            for (int b = b0; b < b0 + CB; b++)
#pragma unroll
                for (int m = 0; m < NC; m++) {
                    float l4[4], u4[4];
                    pc[b][m].ends(l4, u4);
#pragma unroll
                    for (int e = 0; e < 4; e++) fin = fin & isfinite(l4[e]) & isfinite(u4[e]);
                }
            /* box b's partials of the GP heads into red, term(s, m, e, lo, hi) adding each term */
            auto box_sums = [&](int b, auto term) {
                double s[GP];
#pragma unroll
                for (int h = 0; h < GP; h++) s[h] = 0;
#pragma unroll
                for (int m = 0; m < NC; m++) {
                    float l4[4], u4[4];
                    pc[b][m].ends(l4, u4);
#pragma unroll
                    for (int e = 0; e < 4; e++) term(s, m, e, l4[e], u4[e]);
                }
#pragma unroll
                for (int h = 0; h < GP; h++) red[wi][b * GP + h][lane] = s[h];
            };
            if (fin) {
#pragma unroll
                for (int b = b0; b < b0 + CB; b++)
                    box_sums(b, [&](double *s, int m, int e, float l, float u) {
                        const double mx = (double)fmaxf(l, u), mn = (double)fminf(l, u);
#pragma unroll
                        for (int h = 0; h < GP; h++) s[h] = fma(qd[h][m][e], __double2hiint(qd[h][m][e]) > 0 ? mx : mn, s[h]);
                    });
            } else {
#pragma unroll
                for (int b = b0; b < b0 + CB; b++)
                    box_sums(b, [&](double *s, int m, int e, float l, float u) {
#pragma unroll
                        for (int h = 0; h < GP; h++) s[h] += bound_term((float)qd[h][m][e], l, u);
                    });
            }
        }
        __syncwarp();
        /* lane r = b * GP + h: box b's bound of head h, its 32 partials halved in the fixed order */
        double tot = 0;
        if (lane < U * GP) {
            const double *pr = red[wi][lane];
            double v[KS_BOUND_PARTS / 2];
#pragma unroll
            for (int l = 0; l < KS_BOUND_PARTS / 2; l++) v[l] = pr[l] + pr[l + KS_BOUND_PARTS / 2];
#pragma unroll
            for (int l = 0; l < 8; l++) v[l] += v[l + 8];
#pragma unroll
            for (int l = 0; l < 4; l++) v[l] += v[l + 4];
#pragma unroll
            for (int l = 0; l < 2; l++) v[l] += v[l + 2];
            tot = v[0] + v[1];
        }
        __syncwarp(); /* red is free for the next boxes */
        const int bb = lane / GP, hh = lane % GP;
        const int64_t jb = j0 + (int64_t)bb * wpk;
        if (reduce == KS_BOUND_NONE) {
            if (lane < U * GP && hh < g && jb < n) out[((int64_t)kv * g + hh) * n + jb] = (float)tot;
        } else {
            /* lane b < U: box b's group reduction, the CPU's (heads ascending) */
            const int b = lane < U ? lane : 0;
            float mx = 0;
            double sum = 0;
#pragma unroll
            for (int h = 0; h < GP; h++) {
                const double v = __shfl_sync(0xffffffffu, tot, b * GP + h);
                if (h >= g) continue;
                const float f = (float)v;
                if (h == 0 || f > mx || isnan(f)) mx = (h > 0 && isnan(mx)) ? mx : f;
                sum += v;
            }
            const int64_t j = j0 + (int64_t)lane * wpk;
            if (lane < U && j < n) out[(int64_t)kv * n + j] = reduce == KS_BOUND_GROUP_MAX ? mx : (float)sum;
        }
        BW_LOAD(j0 + U * wpk, pc)
    }
#undef BW_LOAD
}

template <int GP, int NC, bool BOX>
static void bound_launch(cudaStream_t s, int n_sm, const float *q, const float *lo, const float *hi,
                         const uint32_t *box, int64_t n, int hkv, int g, int d, int reduce, float *out) {
    /* one wave of BW_BLOCKS_SM blocks an SM, warp w serving KV head w % hkv: wpk warps a KV head,
     * each with the same number of loop steps */
    constexpr int U = BW_U(GP, BOX), WARPS = BW_WARPS(BOX);
    const int64_t wpk0 = KS_MAX((int64_t)1, (int64_t)n_sm * BW_BLOCKS_SM(BOX) * WARPS / hkv);
    const int64_t steps = (n + U * wpk0 - 1) / (U * wpk0);
    const int64_t wpk = (n + U * steps - 1) / (U * steps); /* warps a KV head */
    const unsigned grid = (unsigned)ks_cdiv((size_t)(wpk * hkv), WARPS);
    bound_scores_warp<GP, NC, BOX><<<grid, WARPS * 32, 0, s>>>(q, lo, hi, box, n, hkv, g, d, wpk, reduce, out);
}

template <bool BOX>
static ks_status bound_dispatch(cudaStream_t s, const float *q, int64_t n_q_heads, const float *lo, const float *hi,
                                const uint32_t *box, int64_t n, int64_t n_kv_heads, int64_t d, ks_bound_reduce reduce,
                                float *out) {
    const int64_t rows = reduce == KS_BOUND_NONE ? n_q_heads : n_kv_heads, g = n_q_heads / n_kv_heads;
    const int gp = g <= 1 ? 1 : g <= 2 ? 2 : g <= 4 ? 4 : 8, nc = d <= 128 ? 1 : 2;
    const bool aligned = BOX ? (uintptr_t)box % 16 == 0 : (uintptr_t)lo % 16 == 0 && (uintptr_t)hi % 16 == 0;
    if (g <= 8 && gp * nc <= 8 && d % 4 == 0 && d <= 256 && aligned && n_kv_heads <= (1 << 20)) {
        int dev = 0, n_sm = 0;
        KS_CU(cudaGetDevice(&dev), "bound_scores device");
        KS_CU(cudaDeviceGetAttribute(&n_sm, cudaDevAttrMultiProcessorCount, dev), "bound_scores device");
        const int hk = (int)n_kv_heads, gi = (int)g, di = (int)d, r = (int)reduce;
        if (gp == 1 && nc == 1) bound_launch<1, 1, BOX>(s, n_sm, q, lo, hi, box, n, hk, gi, di, r, out);
        else if (gp == 1) bound_launch<1, 2, BOX>(s, n_sm, q, lo, hi, box, n, hk, gi, di, r, out);
        else if (gp == 2 && nc == 1) bound_launch<2, 1, BOX>(s, n_sm, q, lo, hi, box, n, hk, gi, di, r, out);
        else if (gp == 2) bound_launch<2, 2, BOX>(s, n_sm, q, lo, hi, box, n, hk, gi, di, r, out);
        else if (gp == 4 && nc == 1) bound_launch<4, 1, BOX>(s, n_sm, q, lo, hi, box, n, hk, gi, di, r, out);
        else if (gp == 4) bound_launch<4, 2, BOX>(s, n_sm, q, lo, hi, box, n, hk, gi, di, r, out);
        else bound_launch<8, 1, BOX>(s, n_sm, q, lo, hi, box, n, hk, gi, di, r, out);
        KS_CU_LAUNCH("bound_scores kernel");
        return KS_OK;
    }
    bound_scores_kernel<<<ks_grid1d((size_t)(rows * n), 128), 128, 0, s>>>(q, BOX ? NULL : lo, BOX ? NULL : hi,
                                                                          BOX ? box : NULL, n, n_kv_heads, g, d,
                                                                          (int)reduce, rows, out);
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
    return bound_dispatch<false>(s, q, n_q_heads, lo, hi, NULL, n, n_kv_heads, d, reduce, out);
}

extern "C" ks_status ks_cuda_bound_scores_box(cudaStream_t s, const float *q, int64_t n_q_heads, const uint32_t *box,
                                              int64_t n, int64_t n_kv_heads, int64_t d, ks_bound_reduce reduce,
                                              float *out) {
    ks_status st = ks_bound_scores_check_args(n_q_heads, n, n_kv_heads, d, reduce);
    if (st) return st;
    if (n == 0) return KS_OK;
    if (!q || !box || !out) return ks_errorf(KS_ERR_ARG, "bound_scores: NULL data");
    return bound_dispatch<true>(s, q, n_q_heads, NULL, NULL, box, n, n_kv_heads, d, reduce, out);
}

/* ================================================================ page_rows */

/* one thread per output row id; the first thread of each page entry also checks that entry. I:
 * the type of the output index and of its divisions (uint32_t when lists * w and the page fit:
 * a 64-bit division is a long software sequence, the kernel's main cost at Quest's 8 x 4111 rows) */
template <typename I>
__global__ void page_rows_kernel(const int32_t *__restrict__ pages, int64_t lists, int64_t k, int64_t page, int64_t w,
                                 int64_t bb, int64_t be, int64_t ab, int64_t lo_row, int64_t hi_row,
                                 int32_t *__restrict__ out, unsigned long long *err) {
    const I total = (I)(lists * w), stride = (I)gridDim.x * blockDim.x, nb = (I)(be - bb), pg = (I)page, kp = (I)(k * page);
    for (I e = (I)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += stride) {
        const I l = e / (I)w, o = e - l * (I)w;
        int64_t v;
        if (o < nb) v = bb + (int64_t)o;
        else if (o < nb + kp) {
            const I t = (o - nb) / pg, r = (o - nb) - t * pg;
            const int64_t p = pages[(int64_t)l * k + t];
            v = p * page + (int64_t)r;
            if (r == 0 && err) {
                int bad = p < 0 || p * page < lo_row || (p + 1) * page > hi_row || (t > 0 && p <= pages[(int64_t)l * k + t - 1]);
                if (bad) atomicMin(err, (unsigned long long)((int64_t)l * k + t));
            }
        } else v = ab + (int64_t)(o - nb - kp);
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
    const dim3 grid(ks_grid1d((size_t)(lists * w), 256));
    if (lists * w <= (int64_t)INT32_MAX && k * page <= (int64_t)INT32_MAX) /* k * page <= n (checked) */
        page_rows_kernel<uint32_t><<<grid, 256, 0, s>>>(pages, lists, k, page, w, before_begin, before_end, after_begin,
                                                        lo_row, hi_row, out, (unsigned long long *)err);
    else
        page_rows_kernel<int64_t><<<grid, 256, 0, s>>>(pages, lists, k, page, w, before_begin, before_end, after_begin,
                                                       lo_row, hi_row, out, (unsigned long long *)err);
    KS_CU_LAUNCH("page_rows kernel");
    return KS_OK;
}
