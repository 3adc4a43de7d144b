/* gemv.cu — see gemv.cuh. Each warp owns ROWS output rows and walks them together, 8 bf16 of
 * every row per lane and step (16-byte streaming loads, several in flight), x read through the
 * read-only cache; a warp reduction finishes each row. */
#include "common.cuh"
#include "gemv.cuh"

#include <string.h>

template <int ROWS, bool ACC>
__global__ void __launch_bounds__(256) gemv_kernel(float *__restrict__ y, const float *__restrict__ x,
                                                   const bf16 *__restrict__ W, const float *__restrict__ bias, int in,
                                                   int out) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int row0 = (blockIdx.x * 8 + warp) * ROWS;
    if (row0 >= out) return;
    float acc[ROWS];
#pragma unroll
    for (int r = 0; r < ROWS; r++) acc[r] = 0.f;
    const uint4 *Wv[ROWS];
#pragma unroll
    for (int r = 0; r < ROWS; r++) Wv[r] = reinterpret_cast<const uint4 *>(W + (size_t)min(row0 + r, out - 1) * in);
    const float4 *xv = reinterpret_cast<const float4 *>(x);
    const int steps = in / 8; /* 16-byte chunks per row */
#pragma unroll 4
    for (int c = lane; c < steps; c += 32) {
        float4 x0 = __ldg(xv + 2 * c), x1 = __ldg(xv + 2 * c + 1);
        uint4 u[ROWS];
#pragma unroll
        for (int r = 0; r < ROWS; r++) u[r] = __ldcs(Wv[r] + c);
#pragma unroll
        for (int r = 0; r < ROWS; r++) {
            const __nv_bfloat162 *h = reinterpret_cast<const __nv_bfloat162 *>(&u[r]);
            float2 a = __bfloat1622float2(h[0]), b = __bfloat1622float2(h[1]);
            float2 e = __bfloat1622float2(h[2]), f = __bfloat1622float2(h[3]);
            acc[r] += a.x * x0.x + a.y * x0.y + b.x * x0.z + b.y * x0.w + e.x * x1.x + e.y * x1.y + f.x * x1.z + f.y * x1.w;
        }
    }
#pragma unroll
    for (int r = 0; r < ROWS; r++) {
        float v = warp_sum(acc[r]);
        if (lane == 0 && row0 + r < out) {
            float t = bias ? v + bias[row0 + r] : v;
            y[row0 + r] = ACC ? y[row0 + r] + t : t;
        }
    }
}

extern "C" int ks_cuda_gemv_supported(const void *W, int in) { return in % 8 == 0 && (uintptr_t)W % 16 == 0; }

template <bool ACC>
static ks_status gemv_launch(cudaStream_t s, float *y, const float *x, const void *W, const float *bias, int in, int out) {
    if (out <= 0) return KS_OK;
    if (!ks_cuda_gemv_supported(W, in) || (uintptr_t)x % 16)
        return ks_errorf(KS_ERR_INTERNAL, "gemv: in = %d not a multiple of 8 or misaligned operands", in);
    /* enough blocks to fill the GPU: fewer rows per warp for narrow outputs */
    if (out >= 32768) gemv_kernel<4, ACC><<<ks_cdiv(out, 32), 256, 0, s>>>(y, x, (const bf16 *)W, bias, in, out);
    else if (out >= 8192) gemv_kernel<2, ACC><<<ks_cdiv(out, 16), 256, 0, s>>>(y, x, (const bf16 *)W, bias, in, out);
    else gemv_kernel<1, ACC><<<ks_cdiv(out, 8), 256, 0, s>>>(y, x, (const bf16 *)W, bias, in, out);
    KS_CU_LAUNCH("gemv kernel");
    return KS_OK;
}

extern "C" ks_status ks_cuda_gemv(cudaStream_t s, float *y, const float *x, const void *W, const float *bias, int in,
                                  int out) {
    return gemv_launch<false>(s, y, x, W, bias, in, out);
}

extern "C" ks_status ks_cuda_gemv_acc(cudaStream_t s, float *y, const float *x, const void *W, const float *bias, int in,
                                      int out) {
    return gemv_launch<true>(s, y, x, W, bias, in, out);
}

/* ---------------------------------------------------------------- fused gemvs (see gemv.cuh) */

/* Each warp owns a unit of two weight rows (ra of Wa, rb of Wb), streams both with the same x
 * chunk and reduces them; the epilogue then combines the two dot products:
 *   QKV:    up to 3 segments; a rope segment's unit is the pair (h*d + k, h*d + k + d/2), rotated
 *           at position pos after the bias, a plain segment's unit two consecutive rows;
 *   SWIGLU: row u of the gate and row u of the up projection -> silu(g) * u (one output). */
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
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = ss;
    __syncthreads();
    double t = 0;
#pragma unroll
    for (int k = 0; k < 8; k++) t += part[k];
    float r = 1.0f / sqrtf((float)(t / in) + eps);
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

template <int MODE, bool NORM>
__global__ void __launch_bounds__(256) gemv_fused_kernel(const gemv_fused_args a) {
    extern __shared__ float4 xs_sh[];
    const int lane = threadIdx.x & 31;
    const int unit = blockIdx.x * 8 + (threadIdx.x >> 5);
    if (NORM) norm_prologue(xs_sh, a.x, a.nw, a.in, a.eps, a.xn); /* every thread: it synchronises */
    if (unit >= a.ustart[a.n_seg]) return;
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
    const uint4 *wa = reinterpret_cast<const uint4 *>(Wa + (size_t)ra * a.in);
    const uint4 *wb = reinterpret_cast<const uint4 *>(Wb + (size_t)rb * a.in);
    const float4 *xv = NORM ? xs_sh : reinterpret_cast<const float4 *>(a.x);
    const int steps = a.in / 8;
    float acc0 = 0.f, acc1 = 0.f;
#pragma unroll 4
    for (int c = lane; c < steps; c += 32) {
        float4 x0, x1;
        if (NORM) { x0 = xv[2 * c]; x1 = xv[2 * c + 1]; }
        else { x0 = __ldg(xv + 2 * c); x1 = __ldg(xv + 2 * c + 1); }
        uint4 u0 = __ldcs(wa + c), u1 = __ldcs(wb + c);
        {
            const __nv_bfloat162 *h = reinterpret_cast<const __nv_bfloat162 *>(&u0);
            float2 p = __bfloat1622float2(h[0]), q = __bfloat1622float2(h[1]);
            float2 e = __bfloat1622float2(h[2]), f = __bfloat1622float2(h[3]);
            acc0 += p.x * x0.x + p.y * x0.y + q.x * x0.z + q.y * x0.w + e.x * x1.x + e.y * x1.y + f.x * x1.z + f.y * x1.w;
        }
        {
            const __nv_bfloat162 *h = reinterpret_cast<const __nv_bfloat162 *>(&u1);
            float2 p = __bfloat1622float2(h[0]), q = __bfloat1622float2(h[1]);
            float2 e = __bfloat1622float2(h[2]), f = __bfloat1622float2(h[3]);
            acc1 += p.x * x0.x + p.y * x0.y + q.x * x0.z + q.y * x0.w + e.x * x1.x + e.y * x1.y + f.x * x1.z + f.y * x1.w;
        }
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
    if (rope_s) { /* the arithmetic of rope.cu's kernel */
        float ang = __fmul_rn((float)a.pos, a.inv[kk]);
        float sn, cs;
        sincosf(ang, &sn, &cs);
        float c = __fmul_rn(cs, a.af), sv = __fmul_rn(sn, a.af);
        y[ra] = __fsub_rn(__fmul_rn(va, c), __fmul_rn(vb, sv));
        y[rb] = __fadd_rn(__fmul_rn(vb, c), __fmul_rn(va, sv));
    } else {
        y[ra] = va;
        if (has_b) y[rb] = vb;
    }
}

template <int MODE>
static ks_status fused_launch(cudaStream_t s, const gemv_fused_args &a, unsigned blocks, const char *what) {
    if (a.nw) gemv_fused_kernel<MODE, true><<<blocks, 256, sizeof(float) * a.in, s>>>(a);
    else gemv_fused_kernel<MODE, false><<<blocks, 256, 0, s>>>(a);
    KS_CU_LAUNCH(what);
    return KS_OK;
}

extern "C" int ks_cuda_gemv_norm_supported(const float *x, const float *w, int in) {
    return in % 8 == 0 && in <= KS_CUDA_GEMV_NORM_MAX && ((uintptr_t)x | (uintptr_t)w) % 16 == 0;
}

static int fused_ok(const void *W, const float *x, int in) { return ks_cuda_gemv_supported(W, in) && (uintptr_t)x % 16 == 0; }

static ks_status norm_args(gemv_fused_args *a, const float *x, const float *nw, float eps, float *xn, int in) {
    if (!nw) return KS_OK;
    if (!ks_cuda_gemv_norm_supported(x, nw, in) || (uintptr_t)xn % 16)
        return ks_errorf(KS_ERR_INTERNAL, "gemv: fused rmsnorm over %d values unsupported or misaligned", in);
    a->nw = nw;
    a->eps = eps;
    a->xn = xn;
    return KS_OK;
}

extern "C" ks_status ks_cuda_gemv_qkv(cudaStream_t s, const float *x, const float *norm_w, float eps, float *xn, int in,
                                      int n_seg, float *const *y, const void *const *W, const float *const *bias,
                                      const int *rows, const int *rope, int head_dim, int pos, const float *inv_freq,
                                      float attn_factor) {
    if (n_seg < 1 || n_seg > 3) return ks_errorf(KS_ERR_INTERNAL, "gemv_qkv: %d segments (1 to 3)", n_seg);
    gemv_fused_args a;
    memset(&a, 0, sizeof a);
    ks_status st = norm_args(&a, x, norm_w, eps, xn, in);
    if (st) return st;
    a.x = x;
    a.in = in;
    a.n_seg = n_seg;
    a.head_dim = head_dim;
    a.half = head_dim / 2;
    a.pos = pos;
    a.inv = inv_freq;
    a.af = attn_factor;
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
    if (units > INT32_MAX / 2) return ks_errorf(KS_ERR_INTERNAL, "gemv_qkv: %zu units", units);
    a.ustart[n_seg] = (int)units;
    if (!units) return KS_OK;
    return fused_launch<GF_QKV>(s, a, ks_cdiv(units, 8), "gemv_qkv kernel");
    return KS_OK;
}

extern "C" ks_status ks_cuda_gemv_swiglu(cudaStream_t s, float *y, const float *x, const float *norm_w, float eps, float *xn,
                                         const void *Wg, const void *Wu, int in, int out) {
    if (out <= 0) return KS_OK;
    if (!fused_ok(Wg, x, in) || !fused_ok(Wu, x, in))
        return ks_errorf(KS_ERR_INTERNAL, "gemv_swiglu: in = %d not a multiple of 8 or misaligned operands", in);
    gemv_fused_args a;
    memset(&a, 0, sizeof a);
    ks_status st = norm_args(&a, x, norm_w, eps, xn, in);
    if (st) return st;
    a.x = x;
    a.in = in;
    a.n_seg = 1;
    a.W[0] = (const bf16 *)Wg;
    a.W[1] = (const bf16 *)Wu;
    a.y[0] = y;
    a.rows[0] = out;
    a.ustart[1] = out;
    return fused_launch<GF_SWIGLU>(s, a, ks_cdiv(out, 8), "gemv_swiglu kernel");
    return KS_OK;
}
