/* attn_decode.cu — see attn_decode.cuh.
 *
 * Block = (split of the keys, KV head x chunk of its query heads, query row). Per tile of TK
 * keys: K and V rows (gathered through the index list when there is one) go to shared
 * memory, each (head, key) logit is one thread's dot product, the running max / sum per head
 * are updated by one warp per head (online softmax), and each thread accumulates its
 * (head, column) outputs over the tile. With several splits the unnormalised partial results
 * (acc, m, l) go to a workspace and a second kernel combines them. Float32 arithmetic on bf16
 * keys and values, so the result follows the CPU reference to float rounding. */
#include "common.cuh"
#include "attn_decode.cuh"
#include "pdl.cuh"

#include <math.h>

#define AD_THREADS 128
#define AD_MAXR 8 /* column pairs per thread: a block holds at most 8 * 128 * 2 = 2048 (head, column) outputs */

typedef struct ad_shape {
    int TK;      /* keys per tile */
    int dpk;     /* shared-memory row pitch of K, in elements of K's type */
    int dp;      /* shared-memory row pitch of V, in bf16 */
    int GB;      /* query heads per block */
    int hchunks; /* blocks per KV head along the query heads */
    int vec;     /* 16-byte cp.async loads, double buffered (head_dim % 8 == 0) */
    size_t kbuf, vbuf; /* bytes of one K / V tile buffer */
    size_t smem;
} ad_shape;

static __host__ __device__ size_t align16(size_t x) { return (x + 15) & ~(size_t)15; }

static int ad_shape_of(const ks_cuda_attn_params *p, ad_shape *s) {
    int d = p->head_dim, g = p->n_heads / p->n_kv_heads;
    if (d <= 0 || d > 512) return -1;
    s->TK = d <= 128 ? 32 : d <= 256 ? 16 : 8;
    s->vec = d % 8 == 0;
    s->dp = ((d + 7) / 8) * 8 + 8;
    s->dpk = p->k_f32 ? ((d + 3) / 4) * 4 + 4 : s->dp;
    s->GB = KS_MIN(g, KS_MAX(1, ((s->vec ? 2 : 1) * AD_MAXR * AD_THREADS) / d)); /* outputs fit AD_MAXR slots */
    s->hchunks = (g + s->GB - 1) / s->GB;
    s->kbuf = align16((size_t)s->TK * s->dpk * (p->k_f32 ? 4 : 2));
    s->vbuf = align16((size_t)s->TK * s->dp * 2);
    s->smem = align16((size_t)s->GB * d * 4) + 2 * s->kbuf + 2 * s->vbuf + (size_t)s->GB * s->TK * 4 +
              3 * 4 * (size_t)s->GB + 2 * 4 * (size_t)s->TK;
    return 0;
}

static __device__ __forceinline__ unsigned ad_smem_u32(const void *p) { return (unsigned)__cvta_generic_to_shared(p); }
static __device__ __forceinline__ void ad_cp16(void *dst, const void *src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(ad_smem_u32(dst)), "l"(src));
}
static __device__ __forceinline__ void ad_cp4(void *dst, const void *src) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(ad_smem_u32(dst)), "l"(src));
}
static __device__ __forceinline__ void ad_commit() { asm volatile("cp.async.commit_group;\n" ::); }
static __device__ __forceinline__ void ad_wait1() { asm volatile("cp.async.wait_group 1;\n" ::); }
static __device__ __forceinline__ void ad_wait0() { asm volatile("cp.async.wait_group 0;\n" ::); }

static __device__ __forceinline__ float to_float(bf16 v) { return __bfloat162float(v); }
static __device__ __forceinline__ float to_float(float v) { return v; }

/* dot of a float32 query row (shared) with a key row (shared, bf16 or float32), 8 at a time */
static __device__ __forceinline__ float dot8(const float *qh, const bf16 *kr, int d) {
    float a0 = 0.f, a1 = 0.f;
    for (int c = 0; c < d; c += 8) {
        uint4 u = *reinterpret_cast<const uint4 *>(kr + c);
        const __nv_bfloat162 *k2 = reinterpret_cast<const __nv_bfloat162 *>(&u);
        float4 q0 = *reinterpret_cast<const float4 *>(qh + c);
        float4 q1 = *reinterpret_cast<const float4 *>(qh + c + 4);
        float2 f0 = __bfloat1622float2(k2[0]), f1 = __bfloat1622float2(k2[1]);
        float2 f2 = __bfloat1622float2(k2[2]), f3 = __bfloat1622float2(k2[3]);
        a0 += q0.x * f0.x + q0.y * f0.y + q0.z * f1.x + q0.w * f1.y;
        a1 += q1.x * f2.x + q1.y * f2.y + q1.z * f3.x + q1.w * f3.y;
    }
    return a0 + a1;
}
static __device__ __forceinline__ float dot8(const float *qh, const float *kr, int d) {
    float a0 = 0.f, a1 = 0.f;
    for (int c = 0; c < d; c += 8) {
        float4 k0 = *reinterpret_cast<const float4 *>(kr + c), k1 = *reinterpret_cast<const float4 *>(kr + c + 4);
        float4 q0 = *reinterpret_cast<const float4 *>(qh + c), q1 = *reinterpret_cast<const float4 *>(qh + c + 4);
        a0 += q0.x * k0.x + q0.y * k0.y + q0.z * k0.z + q0.w * k0.w;
        a1 += q1.x * k1.x + q1.y * k1.y + q1.z * k1.z + q1.w * k1.w;
    }
    return a0 + a1;
}

template <bool VEC, typename KT>
__global__ void __launch_bounds__(AD_THREADS)
attn_decode_kernel(ks_cuda_attn_params p, ad_shape sh, int n_splits, float *__restrict__ ws_acc, float *__restrict__ ws_ml) {
    extern __shared__ __align__(16) unsigned char smem[];
    constexpr int KPC = 16 / sizeof(KT); /* K elements per 16-byte chunk */
    const int d = p.head_dim, H = p.n_heads, g = H / p.n_kv_heads, TK = sh.TK, dp = sh.dp, dpk = sh.dpk;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    unsigned char *sp = smem;
    float *Qs = (float *)sp;             sp += align16((size_t)sh.GB * d * 4);
    KT *Ks = (KT *)sp;                   sp += 2 * sh.kbuf; /* 2 buffers */
    bf16 *Vs = (bf16 *)sp;               sp += 2 * sh.vbuf;
    float *S = (float *)sp;              sp += (size_t)sh.GB * TK * 4;
    float *Ms = (float *)sp, *Ls = Ms + sh.GB, *Cs = Ls + sh.GB;
    int *KP = (int *)(Cs + sh.GB);       /* 2 x TK key positions */
    const size_t kstride = sh.kbuf / sizeof(KT), vstride = sh.vbuf / 2;

    const int kv = blockIdx.y / sh.hchunks, hc = blockIdx.y % sh.hchunks;
    const int gb = min(sh.GB, g - hc * sh.GB), h0 = kv * g + hc * sh.GB;
    const int split = blockIdx.x;
    const int nkh = p.nk[kv];
    int per = (nkh + n_splits - 1) / n_splits;
    per = (per + TK - 1) / TK * TK;
    const int tb = split * per, te = min(nkh, tb + per);
    const int32_t *ix = p.idx ? p.idx + p.idx_off[kv] : nullptr;
    const KT *Kh = (const KT *)p.k + (size_t)kv * p.capacity * d;
    const bf16 *Vh = (const bf16 *)p.v + (size_t)kv * p.capacity * d;
    const int32_t *Ph = p.kpos ? p.kpos + (size_t)kv * p.capacity : nullptr;
    const bool kp_loaded = !p.renumber && Ph;
    const int nout = VEC ? gb * d / 2 : gb * d;

    /* queue the loads of keys [t0, t0 + TK) into buffer b (cp.async when VEC, else plain) */
    auto issue = [&](int t0, int b) {
        const int tn = min(TK, te - t0);
        KT *kd = Ks + b * kstride;
        bf16 *vd = Vs + b * vstride;
        if (VEC) {
            const int kpr = d / KPC, upr = d >> 3;
            for (int u = tid; u < tn * kpr; u += AD_THREADS) {
                int rr = u / kpr, c = (u - rr * kpr) * KPC;
                int j = ix ? ix[t0 + rr] : t0 + rr;
                ad_cp16(kd + rr * dpk + c, Kh + (size_t)j * d + c);
            }
            for (int u = tid; u < tn * upr; u += AD_THREADS) {
                int rr = u / upr, c = (u - rr * upr) << 3;
                int j = ix ? ix[t0 + rr] : t0 + rr;
                ad_cp16(vd + rr * dp + c, Vh + (size_t)j * d + c);
            }
            for (int rr = tid; rr < tn; rr += AD_THREADS) {
                int j = ix ? ix[t0 + rr] : t0 + rr;
                if (kp_loaded) ad_cp4(KP + b * TK + rr, Ph + j);
                else KP[b * TK + rr] = p.renumber ? t0 + rr : j;
            }
        } else {
            for (int u = tid; u < tn * d; u += AD_THREADS) {
                int rr = u / d, c = u - rr * d;
                int j = ix ? ix[t0 + rr] : t0 + rr;
                kd[rr * dpk + c] = Kh[(size_t)j * d + c];
                vd[rr * dp + c] = Vh[(size_t)j * d + c];
            }
            for (int rr = tid; rr < tn; rr += AD_THREADS) {
                int j = ix ? ix[t0 + rr] : t0 + rr;
                KP[b * TK + rr] = kp_loaded ? Ph[j] : p.renumber ? t0 + rr : j;
            }
        }
    };

    for (int i = blockIdx.z; i < p.n; i += gridDim.z) {
        const int qp = p.q_renumber ? nkh - p.n + i : p.qpos[i];
        const float *qrow = p.q + ((size_t)i * H + h0) * d;
        for (int e = tid; e < gb * d; e += AD_THREADS) Qs[e] = qrow[e];
        if (tid < gb) { Ms[tid] = -INFINITY; Ls[tid] = 0.f; }
        float acc[AD_MAXR][2];
#pragma unroll
        for (int r = 0; r < AD_MAXR; r++) acc[r][0] = acc[r][1] = 0.f;
        __syncthreads();

        if (tb < te) issue(tb, 0);
        ad_commit();
        for (int t0 = tb, it = 0; t0 < te; t0 += TK, it++) {
            const int b = it & 1, tn = min(TK, te - t0);
            if (t0 + TK < te) issue(t0 + TK, b ^ 1);
            ad_commit();
            ad_wait1();
            __syncthreads();
            const KT *kb = Ks + b * kstride;
            const bf16 *vb = Vs + b * vstride;
            const int *kp = KP + b * TK;

            /* logits: one (head, key) dot product per thread and step */
            for (int e = tid; e < gb * TK; e += AD_THREADS) {
                int hh = e / TK, jj = e - hh * TK;
                float sc = -INFINITY;
                int key = kp[jj];
                if (jj < tn && key <= qp && (p.window <= 0 || (long long)qp - key < p.window)) {
                    const float *qh = Qs + hh * d;
                    const KT *kr = kb + jj * dpk;
                    float a;
                    if (VEC) a = dot8(qh, kr, d);
                    else {
                        a = 0.f;
                        for (int c = 0; c < d; c++) a += qh[c] * to_float(kr[c]);
                    }
                    sc = a * p.scale;
                }
                S[hh * TK + jj] = sc;
            }
            __syncthreads();

            /* online softmax: one warp per head */
            for (int hh = warp; hh < gb; hh += AD_THREADS / 32) {
                float *Sh = S + hh * TK;
                float mx = -INFINITY;
                for (int jj = lane; jj < TK; jj += 32) mx = fmaxf(mx, Sh[jj]);
                mx = warp_max(mx);
                float mo = Ms[hh], mn = fmaxf(mo, mx), sum = 0.f;
                for (int jj = lane; jj < TK; jj += 32) {
                    float s = Sh[jj];
                    float pr = s == -INFINITY ? 0.f : expf(s - mn);
                    Sh[jj] = pr;
                    sum += pr;
                }
                sum = warp_sum(sum);
                if (lane == 0) {
                    float c = mo == -INFINITY ? 0.f : expf(mo - mn);
                    Cs[hh] = c;
                    Ls[hh] = Ls[hh] * c + sum;
                    Ms[hh] = mn;
                }
            }
            __syncthreads();

            /* P V: each thread owns (head, column pair) outputs, or single columns for odd d */
#pragma unroll
            for (int r = 0; r < AD_MAXR; r++) {
                int o = tid + r * AD_THREADS;
                if (o < nout) {
                    if (VEC) {
                        int hh = (2 * o) / d, c = 2 * o - hh * d;
                        const float *Sh = S + hh * TK;
                        float cr = Cs[hh], a0 = acc[r][0] * cr, a1 = acc[r][1] * cr;
                        for (int jj = 0; jj < tn; jj++) {
                            float2 v = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162 *>(vb + jj * dp + c));
                            float pr = Sh[jj];
                            a0 += pr * v.x;
                            a1 += pr * v.y;
                        }
                        acc[r][0] = a0;
                        acc[r][1] = a1;
                    } else {
                        int hh = o / d, c = o - hh * d;
                        const float *Sh = S + hh * TK;
                        float a = acc[r][0] * Cs[hh];
                        for (int jj = 0; jj < tn; jj++) a += Sh[jj] * __bfloat162float(vb[jj * dp + c]);
                        acc[r][0] = a;
                    }
                }
            }
            __syncthreads();
        }
        ad_wait0();

#pragma unroll
        for (int r = 0; r < AD_MAXR; r++) {
            int o = tid + r * AD_THREADS;
            if (o < nout) {
                int w = VEC ? 2 : 1;
                int hh = (w * o) / d, c = w * o - hh * d;
                if (n_splits == 1) {
                    float l = Ls[hh], inv = l > 0.f ? 1.0f / l : 0.f;
                    float *dst = p.out + ((size_t)i * H + h0 + hh) * d + c;
                    dst[0] = acc[r][0] * inv;
                    if (VEC) dst[1] = acc[r][1] * inv;
                } else {
                    size_t base = ((size_t)i * H + h0 + hh) * n_splits + split;
                    ws_acc[base * d + c] = acc[r][0];
                    if (VEC) ws_acc[base * d + c + 1] = acc[r][1];
                    if (c == 0) { ws_ml[2 * base] = Ms[hh]; ws_ml[2 * base + 1] = Ls[hh]; }
                }
            }
        }
        __syncthreads();
    }
}

/* out row (i, h) = sum_s acc_s e^(m_s - M) / sum_s l_s e^(m_s - M); zeros when nothing was visible.
 * A block of CMB_WARPS warps a row; warp w takes the splits s = w, w + W, ... and lane l the
 * column groups l, l + 32, ... (4 columns a group where head_dim % 4 == 0, else 1). Its first CMB_LD splits' columns are loaded at the start beside
 * the (m, l) pairs, before M is known, so a row of up to W * CMB_LD splits (64) and 128 columns
 * costs one round trip to L2 (42 splits at 32K on an H100: the serial merge 5.6 us a call, 4 warps
 * with their loads behind M 4.4, this 2.7, the wait for the attention included: bench/NOTES.md,
 * issue 14, sessions 37-38). M: each thread the
 * max of its splits (s = t, t + T, ...), then the block's (a max is exact in any order). The
 * weights e^(m_s - M) go to shared memory; L: each thread its splits' l_s e^(m_s - M), the block's
 * partials added in a fixed tree (warp butterfly, then the warps in order). A split with nothing
 * visible (m_s = -inf) adds nothing, whatever its columns hold. The warps' column sums are added in
 * warp order. Every order is fixed: the same bits at every launch. */
#define CMB_WARPS 16
#define CMB_T (CMB_WARPS * 32)
#define CMB_LD 4 /* splits a lane's loads cover at once */
/* VW columns of one split, loaded as one float4 (VW 4: head_dim % 4 == 0) or one float (VW 1) */
template <int VW> struct cmb_v {
    float x[VW];
};
template <int VW> static __device__ __forceinline__ cmb_v<VW> cmb_ld(const float *p) {
    cmb_v<VW> r;
    if constexpr (VW == 4) {
        const float4 f = *reinterpret_cast<const float4 *>(p);
        r.x[0] = f.x, r.x[1] = f.y, r.x[2] = f.z, r.x[3] = f.w;
    } else {
        r.x[0] = *p;
    }
    return r;
}
template <int VW> static __device__ __forceinline__ cmb_v<VW> cmb_zero() {
    cmb_v<VW> r;
#pragma unroll
    for (int i = 0; i < VW; i++) r.x[i] = 0.f;
    return r;
}
template <int VW>
__global__ void __launch_bounds__(CMB_T) attn_combine_kernel(float *__restrict__ out, const float *__restrict__ ws_acc,
                                                              const float *__restrict__ ws_ml, int n_splits, int d) {
    ks_pdl_trigger(); /* PDL (pdl.cuh): the partials come from the kernel before */
    ks_pdl_wait();
    extern __shared__ float4 cmb4[]; /* weight (n_splits, padded to 4), then the warps' column sums (CMB_WARPS, d) */
    float *se = reinterpret_cast<float *>(cmb4), *ws = se + ((n_splits + 3) & ~3);
    __shared__ float red[CMB_WARPS];
    const int t = threadIdx.x, lane = t & 31, w = t >> 5;
    const size_t rh = blockIdx.x;
    const float *ml = ws_ml + rh * n_splits * 2;
    const int dv = d / VW; /* column groups */
    const float *acc = ws_acc + rh * n_splits * d; /* (n_splits, d) */
    cmb_v<VW> a0[CMB_LD]; /* the first pass's columns (group lane, s = w + j W), in flight during M and L */
#pragma unroll
    for (int j = 0; j < CMB_LD; j++) {
        const int s = w + j * CMB_WARPS;
        a0[j] = lane < dv && s < n_splits ? cmb_ld<VW>(acc + (size_t)s * d + lane * VW) : cmb_zero<VW>();
    }
    float mx = -INFINITY;
    for (int s = t; s < n_splits; s += CMB_T) mx = fmaxf(mx, ml[2 * s]);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    if (lane == 0) red[w] = mx;
    __syncthreads();
    float M = red[0];
#pragma unroll
    for (int i = 1; i < CMB_WARPS; i++) M = fmaxf(M, red[i]);
    __syncthreads(); /* red is reused for L */
    float lp = 0.f;
    for (int s = t; s < n_splits; s += CMB_T) {
        const float m = ml[2 * s];
        const float e = m != -INFINITY ? expf(m - M) : 0.f;
        se[s] = e;
        if (m != -INFINITY) lp += ml[2 * s + 1] * e;
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) lp += __shfl_xor_sync(0xffffffffu, lp, o);
    if (lane == 0) red[w] = lp;
    __syncthreads(); /* red and se complete */
    float L = 0.f;
    if (M != -INFINITY)
#pragma unroll
        for (int i = 0; i < CMB_WARPS; i++) L += red[i];
    const float inv = L > 0.f ? 1.0f / L : 0.f;
    for (int cv = lane; cv < dv; cv += 32) {
        cmb_v<VW> o = cmb_zero<VW>();
        for (int s0 = w; s0 < n_splits; s0 += CMB_WARPS * CMB_LD) {
            const bool first = cv == lane && s0 == w;
            cmb_v<VW> a[CMB_LD];
            float e[CMB_LD];
#pragma unroll
            for (int j = 0; j < CMB_LD; j++) {
                const int s = s0 + j * CMB_WARPS;
                e[j] = s < n_splits ? se[s] : 0.f;
                a[j] = first ? a0[j] : s < n_splits ? cmb_ld<VW>(acc + (size_t)s * d + cv * VW) : cmb_zero<VW>();
            }
#pragma unroll
            for (int j = 0; j < CMB_LD; j++)
                if (e[j] != 0.f) {
#pragma unroll
                    for (int i = 0; i < VW; i++) o.x[i] += a[j].x[i] * e[j];
                }
        }
#pragma unroll
        for (int i = 0; i < VW; i++) ws[w * d + cv * VW + i] = o.x[i];
    }
    __syncthreads();
    for (int c = t; c < d; c += CMB_T) {
        float o = 0.f;
#pragma unroll
        for (int i = 0; i < CMB_WARPS; i++) o += ws[i * d + c];
        out[rh * d + c] = L > 0.f ? o * inv : 0.f;
    }
}

extern "C" ks_status ks_cuda_attn_combine(cudaStream_t s, float *out, const float *ws_acc, const float *ws_ml,
                                          size_t rows, int n_splits, int head_dim, int pdl) {
    if (!rows) return KS_OK;
    if (n_splits < 1 || n_splits > 4096)
        return ks_errorf(KS_ERR_INTERNAL, "attention combine: %d splits (1..4096)", n_splits);
    const size_t sm = sizeof(float) * ((size_t)((n_splits + 3) & ~3) + (size_t)CMB_WARPS * head_dim);
    if (sm > 47 * 1024) /* with red[]: within the 48 KB a block takes without opting in */
        return ks_errorf(KS_ERR_INTERNAL, "attention combine: %d splits x head_dim %d need %zu bytes of shared memory",
                         n_splits, head_dim, sm);
    if (head_dim % 4)
        KS_CU(ks_pdl_launch(attn_combine_kernel<1>, dim3((unsigned)rows), dim3(CMB_T), sm, s, pdl, out, ws_acc, ws_ml,
                            n_splits, head_dim),
              "attention combine kernel");
    else
        KS_CU(ks_pdl_launch(attn_combine_kernel<4>, dim3((unsigned)rows), dim3(CMB_T), sm, s, pdl, out, ws_acc, ws_ml,
                            n_splits, head_dim),
              "attention combine kernel");
    return KS_OK;
}

extern "C" size_t ks_cuda_attn_decode_workspace(const ks_cuda_attn_params *p, int n_sm, int *n_splits) {
    ad_shape sh;
    *n_splits = 1;
    if (ad_shape_of(p, &sh)) return 0;
    size_t row_blocks = (size_t)KS_MIN(p->n, 65535) * p->n_kv_heads * sh.hchunks;
    size_t target = (size_t)4 * (n_sm > 0 ? n_sm : 132);
    int splits = 1;
    if (row_blocks < target) {
        splits = (int)((target + row_blocks - 1) / row_blocks);
        int most = (p->max_nk + 255) / 256; /* at least 256 keys per split */
        splits = KS_MAX(1, KS_MIN(splits, most));
    }
    *n_splits = splits;
    if (splits == 1) return 0;
    size_t rh = (size_t)p->n * p->n_heads * splits;
    return rh * p->head_dim * sizeof(float) + rh * 2 * sizeof(float);
}

extern "C" ks_status ks_cuda_attn_decode(cudaStream_t s, const ks_cuda_attn_params *p, int n_splits, void *ws) {
    ad_shape sh;
    if (p->n <= 0) return KS_OK;
    if (p->n_kv_heads <= 0 || p->n_heads % p->n_kv_heads)
        return ks_errorf(KS_ERR_ARG, "attention: %d query heads are not a multiple of %d KV heads", p->n_heads,
                         p->n_kv_heads);
    if (ad_shape_of(p, &sh)) return ks_errorf(KS_ERR_UNSUPPORTED, "attention: head_dim %d not supported (1..512)", p->head_dim);
    if (n_splits < 1) n_splits = 1;
    if (n_splits > 1 && !ws) return ks_errorf(KS_ERR_INTERNAL, "attention: split-KV without a workspace");
    float *ws_acc = (float *)ws;
    float *ws_ml = ws_acc ? ws_acc + (size_t)p->n * p->n_heads * n_splits * p->head_dim : nullptr;
    dim3 grid(n_splits, p->n_kv_heads * sh.hchunks, KS_MIN(p->n, 65535));
    static unsigned attr_done = 0; /* bit g: set on GPU g (the attribute is per device function) */
    int dev = 0;
    cudaGetDevice(&dev);
    if (!(attr_done >> (dev & 31) & 1u)) {
        const void *fns[4] = {(const void *)attn_decode_kernel<true, bf16>, (const void *)attn_decode_kernel<false, bf16>,
                              (const void *)attn_decode_kernel<true, float>, (const void *)attn_decode_kernel<false, float>};
        for (int f = 0; f < 4; f++)
            KS_CU(cudaFuncSetAttribute(fns[f], cudaFuncAttributeMaxDynamicSharedMemorySize, 96 * 1024),
                  "attention (decode) shared memory");
        attr_done |= 1u << (dev & 31);
    }
    if (p->k_f32) {
        if (sh.vec) attn_decode_kernel<true, float><<<grid, AD_THREADS, sh.smem, s>>>(*p, sh, n_splits, ws_acc, ws_ml);
        else attn_decode_kernel<false, float><<<grid, AD_THREADS, sh.smem, s>>>(*p, sh, n_splits, ws_acc, ws_ml);
    } else {
        if (sh.vec) attn_decode_kernel<true, bf16><<<grid, AD_THREADS, sh.smem, s>>>(*p, sh, n_splits, ws_acc, ws_ml);
        else attn_decode_kernel<false, bf16><<<grid, AD_THREADS, sh.smem, s>>>(*p, sh, n_splits, ws_acc, ws_ml);
    }
    KS_CU_LAUNCH("attention (decode) kernel");
    if (n_splits > 1) {
        size_t rows = (size_t)p->n * p->n_heads;
        return ks_cuda_attn_combine(s, p->out, ws_acc, ws_ml, rows, n_splits, p->head_dim, p->pdl);
    }
    return KS_OK;
}
