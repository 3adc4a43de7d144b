/* gemv.cu — see gemv.cuh. Each warp owns ROWS output rows and walks them together, 8 bf16 of
 * every row per lane and step (16-byte streaming loads, several in flight), x read through the
 * read-only cache; a warp reduction finishes each row. Every kernel here is launched with
 * programmatic dependent launch (pdl.cuh): before its griddepcontrol.wait it touches weights
 * only (an L2 prefetch of the first bytes of its rows and the first 16-byte step in registers),
 * so its ramp overlaps the previous kernel's tail. */
#include "common.cuh"
#include "gemv.cuh"
#include "rms.cuh"
#include "pdl.cuh"

#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- prefetch */

#ifdef KS_KERNEL_DEV /* the dev harness (bench_decode) sweeps the prefetch of the whole decode step */
static int g_prefetch = KS_CUDA_GEMV_PREFETCH;
extern "C" void ks_cuda_gemv_set_prefetch(int bytes) { g_prefetch = bytes < 0 ? KS_CUDA_GEMV_PREFETCH : bytes; }
#define GEMV_PF g_prefetch
#else
#define GEMV_PF KS_CUDA_GEMV_PREFETCH
#endif

/* L2 prefetch of bytes [lo, hi) of a weight row, one 128-byte line per lane and step */
static __device__ __forceinline__ void prefetch_span(const bf16 *row, int lo, int hi, int lane) {
    const char *p = reinterpret_cast<const char *>(row);
    for (int o = lo + lane * 128; o < hi; o += 32 * 128) ks_prefetch_l2(p + o);
}

static __device__ __forceinline__ float dot8(uint4 u, float4 x0, float4 x1) {
    const __nv_bfloat162 *h = reinterpret_cast<const __nv_bfloat162 *>(&u);
    float2 a = __bfloat1622float2(h[0]), b = __bfloat1622float2(h[1]);
    float2 e = __bfloat1622float2(h[2]), f = __bfloat1622float2(h[3]);
    return a.x * x0.x + a.y * x0.y + b.x * x0.z + b.y * x0.w + e.x * x1.x + e.y * x1.y + f.x * x1.z + f.y * x1.w;
}

/* ---------------------------------------------------------------- plain gemv */

/* The 8 warps of a block form 8 / KS row groups of ROWS rows; the KS warps of a group take
 * consecutive slices of the 16-byte steps of those rows (KS == 1: a warp owns whole rows, the
 * original kernel's summation order). PDL: weights are prefetched before the wait; x, y and
 * bias are touched only after it. */
template <int ROWS, bool ACC, int UNR, int KS>
__global__ void __launch_bounds__(256) gemv_kernel(float *__restrict__ y, const float *__restrict__ x,
                                                   const bf16 *__restrict__ W, const float *__restrict__ bias, int in,
                                                   int out, int pf) {
    constexpr int RG = 8 / KS;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int kq = warp % KS, rg = warp / KS;
    const int row0 = (blockIdx.x * RG + rg) * ROWS;
    const bool live = row0 < out;
    const int steps = in / 8; /* 16-byte chunks per row */
    const int c_lo = (int)((long long)kq * steps / KS), c_hi = (int)((long long)(kq + 1) * steps / KS);
    const uint4 *Wv[ROWS];
#pragma unroll
    for (int r = 0; r < ROWS; r++) Wv[r] = reinterpret_cast<const uint4 *>(W + (size_t)min(row0 + r, out - 1) * in);
    if (live && pf > 0) {
        const int lo = c_lo * 16, hi = min(c_hi * 16, lo + pf);
#pragma unroll
        for (int r = 0; r < ROWS; r++)
            if (row0 + r < out) prefetch_span(W + (size_t)(row0 + r) * in, lo, hi, lane);
    }
    /* the first step's weights in registers before the wait too (peeled: same summation order) */
    const bool first = live && c_lo + lane < c_hi;
    uint4 u0[ROWS];
#pragma unroll
    for (int r = 0; r < ROWS; r++) u0[r] = first ? __ldcs(Wv[r] + c_lo + lane) : make_uint4(0, 0, 0, 0);
    ks_pdl_trigger();
    ks_pdl_wait();
    if (KS == 1 && !live) return;
    float acc[ROWS];
#pragma unroll
    for (int r = 0; r < ROWS; r++) acc[r] = 0.f;
    const float4 *xv = reinterpret_cast<const float4 *>(x);
    if (first) {
        const int c = c_lo + lane;
        float4 x0 = __ldg(xv + 2 * c), x1 = __ldg(xv + 2 * c + 1);
#pragma unroll
        for (int r = 0; r < ROWS; r++) acc[r] += dot8(u0[r], x0, x1);
    }
    if (live) {
#pragma unroll UNR
        for (int c = c_lo + lane + 32; c < c_hi; c += 32) {
            float4 x0 = __ldg(xv + 2 * c), x1 = __ldg(xv + 2 * c + 1);
            uint4 u[ROWS];
#pragma unroll
            for (int r = 0; r < ROWS; r++) u[r] = __ldcs(Wv[r] + c);
#pragma unroll
            for (int r = 0; r < ROWS; r++) acc[r] += dot8(u[r], x0, x1);
        }
    }
    if constexpr (KS == 1) {
#pragma unroll
        for (int r = 0; r < ROWS; r++) {
            float v = warp_sum(acc[r]);
            if (lane == 0 && row0 + r < out) {
                float t = bias ? v + bias[row0 + r] : v;
                y[row0 + r] = ACC ? y[row0 + r] + t : t;
            }
        }
    } else { /* every warp reaches the barrier (no early exit when KS > 1) */
        __shared__ float part[8][ROWS];
#pragma unroll
        for (int r = 0; r < ROWS; r++) {
            float v = warp_sum(acc[r]);
            if (lane == 0) part[warp][r] = v;
        }
        __syncthreads();
        if (kq == 0 && lane < ROWS && row0 + lane < out) {
            float v = 0.f;
#pragma unroll
            for (int q = 0; q < KS; q++) v += part[rg * KS + q][lane];
            float t = bias ? v + bias[row0 + lane] : v;
            y[row0 + lane] = ACC ? y[row0 + lane] + t : t;
        }
    }
}

extern "C" int ks_cuda_gemv_supported(const void *W, int in) { return in % 8 == 0 && (uintptr_t)W % 16 == 0; }

template <int ROWS, bool ACC, int UNR, int KS>
static ks_status gemv_go(cudaStream_t s, float *y, const float *x, const void *W, const float *bias, int in, int out,
                         int pf, int pdl) {
    unsigned blocks = ks_cdiv(out, (size_t)(8 / KS) * ROWS);
    KS_CU(ks_pdl_launch(gemv_kernel<ROWS, ACC, UNR, KS>, dim3(blocks), dim3(256), 0, s, pdl, y, x, (const bf16 *)W, bias, in,
                        out, pf),
          "gemv kernel");
    return KS_OK;
}

static ks_status gemv_check(const float *x, const void *W, int in) {
    if (!ks_cuda_gemv_supported(W, in) || (uintptr_t)x % 16)
        return ks_errorf(KS_ERR_INTERNAL, "gemv: in = %d not a multiple of 8 or misaligned operands", in);
    return KS_OK;
}

template <bool ACC>
static ks_status gemv_launch(cudaStream_t s, float *y, const float *x, const void *W, const float *bias, int in, int out,
                             int pdl) {
    if (out <= 0) return KS_OK;
    ks_status st = gemv_check(x, W, in);
    if (st) return st;
    /* enough blocks to fill the GPU: fewer rows per warp for narrow outputs; narrow outputs also
     * split K over the warps of a block (measured with tests/cuda/bench_decode: bench/NOTES.md) */
    if (out >= 32768) return gemv_go<4, ACC, 4, 1>(s, y, x, W, bias, in, out, GEMV_PF, pdl);
    if (out >= 8192) return gemv_go<2, ACC, 4, 1>(s, y, x, W, bias, in, out, GEMV_PF, pdl);
    if (in <= 8192) return gemv_go<4, ACC, 8, 4>(s, y, x, W, bias, in, out, GEMV_PF, pdl);
    return gemv_go<1, ACC, 8, 2>(s, y, x, W, bias, in, out, GEMV_PF, pdl);
}

extern "C" ks_status ks_cuda_gemv(cudaStream_t s, float *y, const float *x, const void *W, const float *bias, int in,
                                  int out, int pdl) {
    return gemv_launch<false>(s, y, x, W, bias, in, out, pdl);
}

extern "C" ks_status ks_cuda_gemv_acc(cudaStream_t s, float *y, const float *x, const void *W, const float *bias, int in,
                                      int out, int pdl) {
    return gemv_launch<true>(s, y, x, W, bias, in, out, pdl);
}

template <int ROWS, bool ACC>
static ks_status gemv_var_ks(cudaStream_t s, const ks_cuda_gemv_variant *v, float *y, const float *x, const void *W,
                             int in, int out) {
    int pf = v->prefetch;
    if (v->unroll == 8) {
        if (v->ksplit == 4) return gemv_go<ROWS, ACC, 8, 4>(s, y, x, W, NULL, in, out, pf, v->pdl);
        if (v->ksplit == 2) return gemv_go<ROWS, ACC, 8, 2>(s, y, x, W, NULL, in, out, pf, v->pdl);
        return gemv_go<ROWS, ACC, 8, 1>(s, y, x, W, NULL, in, out, pf, v->pdl);
    }
    if (v->ksplit == 4) return gemv_go<ROWS, ACC, 4, 4>(s, y, x, W, NULL, in, out, pf, v->pdl);
    if (v->ksplit == 2) return gemv_go<ROWS, ACC, 4, 2>(s, y, x, W, NULL, in, out, pf, v->pdl);
    return gemv_go<ROWS, ACC, 4, 1>(s, y, x, W, NULL, in, out, pf, v->pdl);
}

template <bool ACC>
static ks_status gemv_var_rows(cudaStream_t s, const ks_cuda_gemv_variant *v, float *y, const float *x, const void *W,
                               int in, int out) {
    if (v->rows == 4) return gemv_var_ks<4, ACC>(s, v, y, x, W, in, out);
    if (v->rows == 2) return gemv_var_ks<2, ACC>(s, v, y, x, W, in, out);
    return gemv_var_ks<1, ACC>(s, v, y, x, W, in, out);
}

extern "C" ks_status ks_cuda_gemv_var(cudaStream_t s, const ks_cuda_gemv_variant *v, float *y, const float *x,
                                      const void *W, int in, int out, int acc) {
    if (out <= 0) return KS_OK;
    if ((v->rows != 1 && v->rows != 2 && v->rows != 4) || (v->unroll != 4 && v->unroll != 8) ||
        (v->ksplit != 1 && v->ksplit != 2 && v->ksplit != 4))
        return ks_errorf(KS_ERR_ARG, "gemv variant: rows %d (1, 2, 4), unroll %d (4, 8), ksplit %d (1, 2, 4)", v->rows,
                         v->unroll, v->ksplit);
    ks_status st = gemv_check(x, W, in);
    if (st) return st;
    return acc ? gemv_var_rows<true>(s, v, y, x, W, in, out) : gemv_var_rows<false>(s, v, y, x, W, in, out);
}

/* ---------------------------------------------------------------- fused gemvs (see gemv.cuh) */

/* Each warp owns a unit of two weight rows (ra of Wa, rb of Wb), streams both with the same x
 * chunk and reduces them; the epilogue then combines the two dot products:
 *   QKV:    up to 3 segments; a rope segment's unit is the pair (h*d + k, h*d + k + d/2), rotated
 *           at position pos after the bias, a plain segment's unit two consecutive rows; with
 *           kv_on, segments 1 (k) and 2 (v) also store their rows in the KV cache;
 *   SWIGLU: row u of the gate and row u of the up projection -> silu(g) * u (one output).
 * PDL: the unit's rows are derived from the arguments and prefetched before the wait; x (and
 * the norm prologue), y, xn and the cache are touched only after it. */
enum { GF_QKV = 0, GF_SWIGLU = 1 };

struct gemv_fused_args {
    const float *x;
    int in;
    const bf16 *W[3];
    const float *bias[3];
    float *y[3];
    int rows[3];
    int rope[3];
    int ustart[4];   /* first unit of each segment; ustart[n_seg] = total units */
    int n_seg;
    int head_dim, half, pos;
    const float *inv; /* (half) device */
    float af;
    const float *nw;  /* NORM: rmsnorm weight (in), x is then the un-normalised row */
    float eps;
    float *xn;        /* NORM: the normalised row is also written here (block 0), or NULL */
    int pf;           /* bytes of each weight row prefetched before the PDL wait */
    /* QKV with kv_on: the cache row of each KV head (ks_cuda_kv_row) */
    int kv_on, kv_cap;
    bf16 *kc, *vc;    /* (n_kv_heads, kv_cap, head_dim) */
    int32_t *pc;      /* (n_kv_heads, kv_cap) */
    int row0[KS_CUDA_GEMV_KV_MAX_HEADS];
    const int32_t *dyn; /* NULL, or device {pos, row offset} (ks_cuda_kv_row.dyn) */
};

/* The block's copy of rmsnorm(x) * w in shared memory, with rmsnorm.cu's arithmetic (256
 * threads, float4 j = t + k*256, double sum of squares reduced per warp then over the 8 warps
 * in order), so the values equal ks_cuda_rmsnorm's bit for bit. in % 4 == 0, x aligned. */
static __device__ void norm_prologue(float4 *xs, const float *x, const float *__restrict__ w, int in, float eps,
                                     float *xn) {
    __shared__ double part[8];
    const float4 *xi = reinterpret_cast<const float4 *>(x);
    const float4 *w4 = reinterpret_cast<const float4 *>(w);
    const int n4 = in / 4;
    double ss = 0;
    for (int j = threadIdx.x; j < n4; j += 256) {
        float4 v = xi[j];
        xs[j] = v;
        ss += (double)v.x * v.x + (double)v.y * v.y + (double)v.z * v.z + (double)v.w * v.w;
    }
    float r = ks_rms_inverse(ss, in, eps, part);
    float4 *xo = reinterpret_cast<float4 *>(xn);
    for (int j = threadIdx.x; j < n4; j += 256) {
        float4 v = xs[j], g = w4[j];
        float4 o = make_float4(__fmul_rn(g.x, __fmul_rn(v.x, r)), __fmul_rn(g.y, __fmul_rn(v.y, r)),
                               __fmul_rn(g.z, __fmul_rn(v.z, r)), __fmul_rn(g.w, __fmul_rn(v.w, r)));
        xs[j] = o;
        if (xn && blockIdx.x == 0) xo[j] = o;
    }
    __syncthreads();
}

static __device__ __forceinline__ float silu_mul_g(float g, float u) { return __fmul_rn(__fdiv_rn(g, 1.0f + expf(-g)), u); }

/* a[s] for s < 3 without indexing the parameter struct dynamically (that copies it to local memory) */
template <typename T>
static __device__ __forceinline__ T pick3(int s, const T (&a)[3]) { return s == 0 ? a[0] : s == 1 ? a[1] : a[2]; }

/* element r (< n_kv_heads * head_dim) of the new k or v row -> the cache, as kv_append1 rounds it */
static __device__ __forceinline__ void kv_store(const gemv_fused_args &a, bf16 *base, int r, int off, float v) {
    int h = r / a.head_dim, dd = r - h * a.head_dim;
    base[((size_t)h * a.kv_cap + a.row0[h] + off) * a.head_dim + dd] = __float2bfloat16_rn(v);
}

/* one warp's unit: its rows and segment (pure arithmetic on the arguments) */
struct fused_unit {
    const bf16 *Wa, *Wb;
    int s, u, ra, rb, kk;
    bool has_b;
};

template <int MODE>
static __device__ __forceinline__ fused_unit unit_of(const gemv_fused_args &a, int unit) {
    fused_unit f;
    f.s = (a.n_seg > 1 && unit >= a.ustart[1]) + (a.n_seg > 2 && unit >= a.ustart[2]);
    f.u = unit - (f.s == 0 ? 0 : f.s == 1 ? a.ustart[1] : a.ustart[2]);
    f.kk = 0;
    f.has_b = true;
    if (MODE == GF_SWIGLU) {
        f.Wa = a.W[0];
        f.Wb = a.W[1];
        f.ra = f.rb = f.u;
    } else if (pick3(f.s, a.rope)) {
        f.Wa = f.Wb = pick3(f.s, a.W);
        int h = f.u / a.half;
        f.kk = f.u - h * a.half;
        f.ra = h * a.head_dim + f.kk;
        f.rb = f.ra + a.half;
    } else {
        f.Wa = f.Wb = pick3(f.s, a.W);
        f.ra = 2 * f.u;
        f.rb = f.ra + 1;
        f.has_b = f.rb < pick3(f.s, a.rows);
        if (!f.has_b) f.rb = f.ra;
    }
    return f;
}

/* One unit per warp (the default grid: one block per 8 units). PDL: the unit's rows are derived
 * from the arguments; before the wait the kernel only prefetches them (L2) and loads their first
 * 16 bytes per lane into registers (weights are immutable); x, the norm, y, xn and the cache are
 * touched after it. The peeled first step keeps the summation order of the plain loop. */
template <int MODE, bool NORM>
__global__ void __launch_bounds__(256) gemv_fused_kernel(const __grid_constant__ gemv_fused_args a) {
    extern __shared__ float4 xs_sh[];
    const int lane = threadIdx.x & 31;
    const int unit = blockIdx.x * 8 + (threadIdx.x >> 5);
    const bool live = unit < a.ustart[a.n_seg];
    const int s = (a.n_seg > 1 && unit >= a.ustart[1]) + (a.n_seg > 2 && unit >= a.ustart[2]);
    const int u = unit - (s == 0 ? 0 : s == 1 ? a.ustart[1] : a.ustart[2]);
    const bf16 *Ws = pick3(s, a.W);
    const int rope_s = pick3(s, a.rope), rows_s = pick3(s, a.rows);
    const bf16 *Wa, *Wb;
    int ra, rb, kk = 0;
    bool has_b = true;
    if (MODE == GF_SWIGLU) {
        Wa = a.W[0];
        Wb = a.W[1];
        ra = rb = u;
    } else if (rope_s) {
        Wa = Wb = Ws;
        int h = u / a.half;
        kk = u - h * a.half;
        ra = h * a.head_dim + kk;
        rb = ra + a.half;
    } else {
        Wa = Wb = Ws;
        ra = 2 * u;
        rb = ra + 1;
        has_b = rb < rows_s;
        if (!has_b) rb = ra;
    }
    if (live && a.pf > 0) {
        const int hi = min(a.in * 2, a.pf);
        prefetch_span(Wa + (size_t)ra * a.in, 0, hi, lane);
        if (has_b) prefetch_span(Wb + (size_t)rb * a.in, 0, hi, lane);
    }
    const uint4 *wa = reinterpret_cast<const uint4 *>(Wa + (size_t)ra * a.in);
    const uint4 *wb = reinterpret_cast<const uint4 *>(Wb + (size_t)rb * a.in);
    const int steps = a.in / 8;
    const bool first = live && lane < steps;
    uint4 f0 = make_uint4(0, 0, 0, 0), f1 = f0;
    if (first) {
        f0 = __ldcs(wa + lane);
        f1 = __ldcs(wb + lane);
    }
    ks_pdl_trigger();
    ks_pdl_wait();
    if (NORM) norm_prologue(xs_sh, a.x, a.nw, a.in, a.eps, a.xn); /* every thread: it synchronises */
    if (!live) return;
    const float4 *xv = NORM ? xs_sh : reinterpret_cast<const float4 *>(a.x);
    float acc0 = 0.f, acc1 = 0.f;
    if (first) {
        float4 x0, x1;
        if (NORM) { x0 = xv[2 * lane]; x1 = xv[2 * lane + 1]; }
        else { x0 = __ldg(xv + 2 * lane); x1 = __ldg(xv + 2 * lane + 1); }
        acc0 += dot8(f0, x0, x1);
        acc1 += dot8(f1, x0, x1);
    }
#pragma unroll 4
    for (int c = lane + 32; c < steps; c += 32) { /* (lane >= steps when !first: nothing left) */
        float4 x0, x1;
        if (NORM) { x0 = xv[2 * c]; x1 = xv[2 * c + 1]; }
        else { x0 = __ldg(xv + 2 * c); x1 = __ldg(xv + 2 * c + 1); }
        uint4 u0 = __ldcs(wa + c), u1 = __ldcs(wb + c);
        acc0 += dot8(u0, x0, x1);
        acc1 += dot8(u1, x0, x1);
    }
    float va = warp_sum(acc0), vb = warp_sum(acc1);
    if (lane) return;
    if (MODE == GF_SWIGLU) {
        a.y[0][u] = silu_mul_g(va, vb);
        return;
    }
    const float *bias = pick3(s, a.bias);
    if (bias) {
        va = va + bias[ra];
        vb = vb + bias[rb];
    }
    float *y = pick3(s, a.y);
    int pos = a.pos, off = 0; /* position and cache-row offset: by value, or from the graph's step slot */
    if (a.dyn) { pos = a.dyn[0]; off = a.dyn[1]; }
    if (rope_s) { /* the arithmetic of rope.cu's kernel */
        float ang = __fmul_rn((float)pos, a.inv[kk]);
        float sn, cs;
        sincosf(ang, &sn, &cs);
        float c = __fmul_rn(cs, a.af), sv = __fmul_rn(sn, a.af);
        float ta = __fsub_rn(__fmul_rn(va, c), __fmul_rn(vb, sv));
        float tb = __fadd_rn(__fmul_rn(vb, c), __fmul_rn(va, sv));
        va = ta;
        vb = tb;
    }
    y[ra] = va;
    if (has_b) y[rb] = vb;
    if (a.kv_on && s > 0) { /* the new cache row: k (rotated) or v, rounded to bf16 */
        bf16 *base = s == 1 ? a.kc : a.vc;
        kv_store(a, base, ra, off, va);
        if (has_b) kv_store(a, base, rb, off, vb);
        if (s == 1 && ra % a.head_dim == 0) {
            int h = ra / a.head_dim;
            a.pc[(size_t)h * a.kv_cap + a.row0[h] + off] = pos;
        }
    }
}

/* one block per 8 units (a persistent one-wave grid with warps looping over units was measured
 * slower on an H200: bench/NOTES.md, seventh run) */
template <int MODE, bool NORM>
static cudaError_t fused_go(cudaStream_t s, const gemv_fused_args &a, size_t units, size_t smem, int pdl) {
    return ks_pdl_launch(gemv_fused_kernel<MODE, NORM>, dim3(ks_cdiv(units, 8)), dim3(256), smem, s, pdl, a);
}

template <int MODE>
static ks_status fused_launch(cudaStream_t s, const gemv_fused_args &a, size_t units, const char *what, int pdl) {
    size_t smem = a.nw ? sizeof(float) * a.in : 0;
    cudaError_t e = a.nw ? fused_go<MODE, true>(s, a, units, smem, pdl) : fused_go<MODE, false>(s, a, units, smem, pdl);
    KS_CU(e, what);
    return KS_OK;
}

extern "C" int ks_cuda_gemv_norm_supported(const float *x, const float *w, int in) {
    return in % 8 == 0 && in <= KS_CUDA_GEMV_NORM_MAX && ((uintptr_t)x | (uintptr_t)w) % 16 == 0;
}

static int fused_ok(const void *W, const float *x, int in) { return ks_cuda_gemv_supported(W, in) && (uintptr_t)x % 16 == 0; }

/* *a zeroed, then the input x (in) of n_seg segments and the fused norm (nw NULL: none) */
static ks_status fused_args_init(gemv_fused_args *a, const float *x, const float *nw, float eps, float *xn, int in,
                                 int n_seg) {
    memset(a, 0, sizeof *a);
    a->x = x;
    a->in = in;
    a->n_seg = n_seg;
    if (!nw) return KS_OK;
    if (!ks_cuda_gemv_norm_supported(x, nw, in) || (uintptr_t)xn % 16)
        return ks_errorf(KS_ERR_INTERNAL, "gemv: fused rmsnorm over %d values unsupported or misaligned", in);
    a->nw = nw;
    a->eps = eps;
    a->xn = xn;
    return KS_OK;
}

extern "C" ks_status ks_cuda_gemv_qkv_kv(cudaStream_t s, const float *x, const float *norm_w, float eps, float *xn, int in,
                                         int n_seg, float *const *y, const void *const *W, const float *const *bias,
                                         const int *rows, const int *rope, int head_dim, int pos, const float *inv_freq,
                                         float attn_factor, const ks_cuda_kv_row *kv, int pdl) {
    if (n_seg < 1 || n_seg > 3) return ks_errorf(KS_ERR_INTERNAL, "gemv_qkv: %d segments (1 to 3)", n_seg);
    gemv_fused_args a;
    ks_status st = fused_args_init(&a, x, norm_w, eps, xn, in, n_seg);
    if (st) return st;
    a.head_dim = head_dim;
    a.half = head_dim / 2;
    a.pos = pos;
    a.inv = inv_freq;
    a.af = attn_factor;
    a.pf = GEMV_PF;
    size_t units = 0;
    for (int i = 0; i < n_seg; i++) {
        if (!fused_ok(W[i], x, in)) return ks_errorf(KS_ERR_INTERNAL, "gemv_qkv: in = %d not a multiple of 8 or misaligned operands", in);
        if (rope[i] && (head_dim < 2 || head_dim % 2 || rows[i] % head_dim || !inv_freq))
            return ks_errorf(KS_ERR_INTERNAL, "gemv_qkv: rope over %d rows with head_dim %d", rows[i], head_dim);
        a.W[i] = (const bf16 *)W[i];
        a.bias[i] = bias[i];
        a.y[i] = y[i];
        a.rows[i] = rows[i];
        a.rope[i] = rope[i];
        a.ustart[i] = (int)units;
        units += rope[i] ? (size_t)rows[i] / 2 : ((size_t)rows[i] + 1) / 2;
    }
    if (kv) {
        int H = kv->n_kv_heads;
        if (n_seg != 3 || H < 1 || H > KS_CUDA_GEMV_KV_MAX_HEADS || head_dim < 2 || head_dim % 2 ||
            rows[1] != H * head_dim || rows[2] != H * head_dim || !kv->k || !kv->v || !kv->pos || !kv->row0)
            return ks_errorf(KS_ERR_INTERNAL, "gemv_qkv: KV append of %d heads x %d dims does not match the k/v rows (%d, %d)",
                             H, head_dim, n_seg > 1 ? rows[1] : 0, n_seg > 2 ? rows[2] : 0);
        for (int h = 0; h < H; h++) {
            if (kv->row0[h] < 0 || kv->row0[h] >= kv->capacity)
                return ks_errorf(KS_ERR_INTERNAL, "gemv_qkv: KV row %d of head %d outside the capacity %d", kv->row0[h], h,
                                 kv->capacity);
            a.row0[h] = kv->row0[h];
        }
        a.kv_on = 1;
        a.kv_cap = kv->capacity;
        a.kc = (bf16 *)kv->k;
        a.vc = (bf16 *)kv->v;
        a.pc = kv->pos;
        a.dyn = kv->dyn;
    }
    if (units > INT32_MAX / 2) return ks_errorf(KS_ERR_INTERNAL, "gemv_qkv: %zu units", units);
    a.ustart[n_seg] = (int)units;
    if (!units) return KS_OK;
    return fused_launch<GF_QKV>(s, a, units, "gemv_qkv kernel", pdl);
}

extern "C" ks_status ks_cuda_gemv_qkv(cudaStream_t s, const float *x, const float *norm_w, float eps, float *xn, int in,
                                      int n_seg, float *const *y, const void *const *W, const float *const *bias,
                                      const int *rows, const int *rope, int head_dim, int pos, const float *inv_freq,
                                      float attn_factor, int pdl) {
    return ks_cuda_gemv_qkv_kv(s, x, norm_w, eps, xn, in, n_seg, y, W, bias, rows, rope, head_dim, pos, inv_freq,
                               attn_factor, NULL, pdl);
}

extern "C" ks_status ks_cuda_gemv_swiglu(cudaStream_t s, float *y, const float *x, const float *norm_w, float eps, float *xn,
                                         const void *Wg, const void *Wu, int in, int out, int pdl) {
    if (out <= 0) return KS_OK;
    if (!fused_ok(Wg, x, in) || !fused_ok(Wu, x, in))
        return ks_errorf(KS_ERR_INTERNAL, "gemv_swiglu: in = %d not a multiple of 8 or misaligned operands", in);
    gemv_fused_args a;
    ks_status st = fused_args_init(&a, x, norm_w, eps, xn, in, 1);
    if (st) return st;
    a.W[0] = (const bf16 *)Wg;
    a.W[1] = (const bf16 *)Wu;
    a.y[0] = y;
    a.rows[0] = out;
    a.ustart[1] = out;
    a.pf = GEMV_PF;
    return fused_launch<GF_SWIGLU>(s, a, (size_t)out, "gemv_swiglu kernel", pdl);
}
