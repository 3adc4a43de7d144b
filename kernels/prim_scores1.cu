/* prim_scores1.cu — ks_cuda_scores for one query row per head (m = 1), in about one read of
 * the keys: TokenSelect's head vote (decode steps and prefill fingerprints) and GemFilter's
 * selection row. prim_scores.cu calls it when the shapes allow (ks_cuda_scores1_fits); the
 * semantics are ks_cpu_scores' (core/prims_scores.c), its CPU twin.
 *
 * Two kernels (and a 4-byte-per-KV-head memset), w = ce - cb keys of the key domain:
 *   1. sc1_logits  grid (ceil(w / 256), Hkv), 8 warps a block. Each warp copies its 32 key rows
 *                  of one KV head into shared memory (cp.async, every copy in flight at once),
 *                  then lane i computes row i's logits for all g query heads of that KV head, so
 *                  every key leaves DRAM once. Writes L (H, w) float32 (an invisible key, outside
 *                  [kb, ke) or past the causal limit, is -inf). With a softmax each block writes
 *                  its partial per head (pmax = the max of its visible logits, psum = the double
 *                  sum of expf(l - pmax)), and the last block of each KV head to finish (an
 *                  atomic counter, zeroed by a memset before the launch) combines the partials in
 *                  index order into M_h and 1 / Z_h (Z_h = sum psum * exp(pmax - M_h)).
 *   2. sc1_vote    one thread per output column: per head v_h = (float)(expf(L - M_h) / Z_h)
 *                  (softmax) or L (raw), then the head reduction in double in ascending head
 *                  order, as on the CPU.
 * Bytes: the keys once, L (4 * H bytes a key: 1/16 of the bf16 keys at g = 4, d = 128) written
 * once and read once. A logit is scale * (s0 + s1) with s0 summing the even and s1 the odd
 * dimensions by fused multiply-adds in ascending order: the same bits as prim_scores.cu's
 * general kernel. Against the CPU (which sums expf(l - M) directly) the logits differ by FMA
 * rounding, expf by its ulps and Z by the rescaling's rounding (~1e-7 relative);
 * tests/cuda/test_cuda_prims.c compares at 2e-5 relative. Deterministic: the tile-to-warp map
 * and every combination order are fixed. */
#include "mma.cuh"
#include "prim_common.cuh"

#define SC1_WARPS 8
#define SC1_THREADS (SC1_WARPS * 32)
#define SC1_VOTE_THREADS 256
#define SC1_GMAX 16 /* query heads per KV head handled here */

struct sc1_args {
    const float *q;       /* (H, d) at q + h * qhs */
    const void *k;        /* KV head kv, key j at k + kv * khs + j * krs (elements) */
    const int32_t *kpos;  /* (n) or NULL = j */
    const int32_t *qpos;  /* (1) or NULL */
    int64_t hq, hkv, g, d, qhs, khs, krs, n;
    int64_t kb, ke, cb, w; /* key domain [kb, ke); logits computed for [cb, cb + w) */
    int64_t nx;           /* blocks per KV head (gridDim.x of sc1_logits) */
    float scale;
    int causal, softmax, gqa_mod;
    float *L;             /* (H, w) */
    float *pmax;          /* (H, nx) */
    double *psum;         /* (H, nx) */
    unsigned *done;       /* (Hkv) blocks finished, zeroed before the launch */
    float *M;             /* (H) */
    double *iZ;           /* (H) */
};

/* The query's causal limit (key j is visible iff pos(j) <= it), as ks_cpu_scores: qpos[0], else
 * the last key's position; no limit without causal. */
static __device__ __forceinline__ int64_t sc1_lim(const sc1_args &a) {
    if (!a.causal) return INT64_MAX;
    return a.qpos ? (int64_t)a.qpos[0] : a.kpos ? (int64_t)a.kpos[a.n - 1] : a.n - 1;
}

static __device__ __forceinline__ int64_t sc1_head(const sc1_args &a, int64_t kv, int t) {
    return a.gqa_mod ? kv + (int64_t)t * a.hkv : kv * a.g + t;
}

/* (m, s) <- the softmax partial (m, s) combined with (m2, s2); -inf maxima carry nothing */
static __device__ __forceinline__ void sc1_merge(float &m, double &s, float m2, double s2) {
    if (m2 == -INFINITY) return;
    if (m == -INFINITY) { m = m2; s = s2; return; }
    float mn = max_nan(m, m2);
    s = s * exp((double)m - (double)mn) + s2 * exp((double)m2 - (double)mn);
    m = mn;
}

static __device__ __forceinline__ double sc1_warp_sum(double v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
static __device__ __forceinline__ float sc1_warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = max_nan(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* DC: the head dimension when known at compile time (64, 128: the loops unroll), else 0 */
template <bool BF16, int GM, int DC>
__global__ void __launch_bounds__(SC1_THREADS) sc1_logits(const sc1_args a) {
    extern __shared__ __align__(16) unsigned char smem[];
    __shared__ float wm[SC1_WARPS][GM];
    __shared__ double ws[SC1_WARPS][GM];
    __shared__ int last;
    const int d = DC ? DC : (int)a.d, g = GM == 1 ? 1 : (int)a.g, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int esz = BF16 ? 2 : 4, rb = d * esz, rs = rb + 16, cpr = rb / 16; /* row bytes, padded stride, chunks */
    float *Qs = (float *)smem;                                   /* (g, d); g * d * 4: a 32-byte multiple */
    unsigned char *buf = smem + sizeof(float) * g * d + (size_t)warp * 32 * rs; /* this warp's 32 rows */
    const int64_t kv = blockIdx.y;
    const int64_t r0 = ((int64_t)blockIdx.x * SC1_WARPS + warp) * 32; /* first row (offset in [0, w)) */
    const int nr = (int)KS_MAX((int64_t)0, KS_MIN((int64_t)32, a.w - r0));

    /* every copy of the warp's rows in flight at once, then the queries */
    const unsigned char *kbase = (const unsigned char *)a.k + (size_t)(kv * a.khs) * esz;
    for (int e = lane; e < nr * cpr; e += 32) {
        int r = e / cpr, c = e - r * cpr;
        cp_async16(buf + r * rs + c * 16, kbase + (size_t)(a.cb + r0 + r) * a.krs * esz + c * 16, 16);
    }
    cp_async_commit();
    for (int e = threadIdx.x; e < g * d; e += SC1_THREADS) {
        int t = e / d, c = e - t * d;
        Qs[t * d + c] = a.q[sc1_head(a, kv, t) * a.qhs + c];
    }
    cp_async_wait<0>();
    __syncthreads();

    float l[GM];
#pragma unroll
    for (int t = 0; t < GM; t++) l[t] = -INFINITY;
    if (lane < nr) {
        const int64_t j = a.cb + r0 + lane;
        const int64_t pj = a.kpos ? (int64_t)a.kpos[j] : j;
        const bool vis = j >= a.kb && j < a.ke && pj <= sc1_lim(a);
        float s0[GM], s1[GM];
#pragma unroll
        for (int t = 0; t < GM; t++) s0[t] = s1[t] = 0.f;
        const unsigned char *row = buf + lane * rs;
#pragma unroll
        for (int c = 0; c < d; c += 8) {
            float kx[8];
            if (BF16) {
                uint4 u = *(const uint4 *)(row + c * 2);
                const bf16 *h = (const bf16 *)&u;
#pragma unroll
                for (int e = 0; e < 8; e++) kx[e] = __bfloat162float(h[e]);
            } else {
                float4 u0 = *(const float4 *)(row + c * 4), u1 = *(const float4 *)(row + c * 4 + 16);
                kx[0] = u0.x; kx[1] = u0.y; kx[2] = u0.z; kx[3] = u0.w;
                kx[4] = u1.x; kx[5] = u1.y; kx[6] = u1.z; kx[7] = u1.w;
            }
#pragma unroll
            for (int t = 0; t < GM; t++) {
                if (t < g) {
                    float4 q0 = *(const float4 *)(Qs + t * d + c), q1 = *(const float4 *)(Qs + t * d + c + 4);
                    s0[t] = fmaf(q0.x, kx[0], s0[t]); s1[t] = fmaf(q0.y, kx[1], s1[t]);
                    s0[t] = fmaf(q0.z, kx[2], s0[t]); s1[t] = fmaf(q0.w, kx[3], s1[t]);
                    s0[t] = fmaf(q1.x, kx[4], s0[t]); s1[t] = fmaf(q1.y, kx[5], s1[t]);
                    s0[t] = fmaf(q1.z, kx[6], s0[t]); s1[t] = fmaf(q1.w, kx[7], s1[t]);
                }
            }
        }
#pragma unroll
        for (int t = 0; t < GM; t++) {
            if (vis) l[t] = a.scale * (s0[t] + s1[t]);
            if (t < g) a.L[sc1_head(a, kv, t) * a.w + r0 + lane] = l[t];
        }
    }
    if (!a.softmax) return;

    /* this block's softmax partial per head: m_b = the max of its visible logits, s_b = the
     * double sum of expf(l - m_b) (one expf a logit; no double exp on this path) */
    __shared__ float bm[GM];
#pragma unroll
    for (int t = 0; t < GM; t++) {
        const float mt = sc1_warp_max(l[t]);
        if (lane == 0) wm[warp][t] = mt;
    }
    __syncthreads();
    if ((int)threadIdx.x < g) {
        float m = wm[0][threadIdx.x];
        for (int u = 1; u < SC1_WARPS; u++) m = max_nan(m, wm[u][threadIdx.x]);
        bm[threadIdx.x] = m;
    }
    __syncthreads();
#pragma unroll
    for (int t = 0; t < GM; t++) {
        const double st = sc1_warp_sum(l[t] == -INFINITY ? 0.0 : (double)expf(l[t] - bm[t < g ? t : 0]));
        if (lane == 0) ws[warp][t] = st;
    }
    __syncthreads();
    if ((int)threadIdx.x < g) {
        const int t = threadIdx.x;
        double sm = 0;
        for (int u = 0; u < SC1_WARPS; u++) sm += ws[u][t];
        const int64_t h = sc1_head(a, kv, t);
        a.pmax[h * a.nx + blockIdx.x] = bm[t];
        a.psum[h * a.nx + blockIdx.x] = sm;
    }
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(&a.done[kv], 1u) == (unsigned)(a.nx - 1);
    __syncthreads();
    if (!last) return;
    __threadfence();
    /* the last block of this KV head: warp t combines head t's nx partials, lane-strided, then
     * the lanes in a fixed tree (the same order on every run) */
    for (int t = warp; t < g; t += SC1_WARPS) {
        const int64_t h = sc1_head(a, kv, t);
        float m = -INFINITY;
        double sm = 0;
        for (int64_t b = lane; b < a.nx; b += 32) {
            float mb = ((volatile float *)a.pmax)[h * a.nx + b];
            double sb = ((volatile double *)a.psum)[h * a.nx + b];
            sc1_merge(m, sm, mb, sb);
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            float m2 = __shfl_xor_sync(0xffffffffu, m, o);
            double s2 = __shfl_xor_sync(0xffffffffu, sm, o);
            /* merge in lane order so both partners compute the same value */
            if (lane & o) { float mm = m2; double ss = s2; sc1_merge(mm, ss, m, sm); m = mm; sm = ss; }
            else sc1_merge(m, sm, m2, s2);
        }
        if (lane == 0) {
            a.M[h] = m;
            a.iZ[h] = 1.0 / sm;
        }
    }
}

/* One thread per output column x (key j = ob + x): the per-head values and their reduction.
 * The L loads of 8 heads are issued before they are used (the kernel is latency-bound). */
__global__ void __launch_bounds__(SC1_VOTE_THREADS) sc1_vote(const sc1_args a, int64_t ob, int64_t ncols, int64_t lo,
                                                             int64_t hi, int heads, float *__restrict__ out) {
    extern __shared__ double iz[]; /* (H) 1 / Z_h, then (H) M_h as float */
    float *mh = (float *)(iz + a.hq);
    if (a.softmax && a.w > 0)
        for (int64_t h = threadIdx.x; h < a.hq; h += SC1_VOTE_THREADS) {
            iz[h] = a.iZ[h];
            mh[h] = a.M[h];
        }
    __syncthreads();
    const int64_t x = (int64_t)blockIdx.x * SC1_VOTE_THREADS + threadIdx.x;
    if (x >= ncols) return;
    const int64_t j = ob + x;
    const bool in = j >= lo && j < hi;
    const float *lc = a.L + (j - a.cb);
    const int64_t rows = heads == KS_HEADS_GROUP_SUM ? a.hkv : 1;
    for (int64_t r = 0; r < rows; r++) {
        double s = 0;
        for (int64_t h0 = 0; h0 < a.hq; h0 += 8) {
            float lg[8];
#pragma unroll
            for (int e = 0; e < 8; e++) lg[e] = in && h0 + e < a.hq ? lc[(h0 + e) * a.w] : -INFINITY;
#pragma unroll
            for (int e = 0; e < 8; e++) {
                const int64_t h = h0 + e;
                if (h >= a.hq) break;
                float v = lg[e] == -INFINITY ? 0.f : a.softmax ? (float)((double)expf(lg[e] - mh[h]) * iz[h]) : lg[e];
                if (heads == KS_HEADS_NONE) { out[h * ncols + x] = v; continue; }
                if (heads == KS_HEADS_GROUP_SUM && (a.gqa_mod ? h % a.hkv : h / a.g) != r) continue;
                s += v;
            }
        }
        if (heads != KS_HEADS_NONE) out[r * ncols + x] = (float)(heads == KS_HEADS_MEAN ? s / (double)a.hq : s);
    }
}

static size_t sc1_smem(int64_t g, int64_t d, int bf16) {
    return sizeof(float) * (size_t)g * d + (size_t)SC1_WARPS * 32 * (size_t)(d * (bf16 ? 2 : 4) + 16);
}

extern "C" int ks_cuda_scores1_fits(int64_t n_q_heads, int64_t n_kv_heads, int64_t m, const void *k, int k_bf16,
                                    int64_t d, const ks_scores_opts *o) {
    if (m != 1 || n_kv_heads < 1 || n_q_heads % n_kv_heads || n_q_heads / n_kv_heads > SC1_GMAX) return 0;
    if (d % 8 || d > 256 || ((uintptr_t)k & 15)) return 0;
    int64_t khs = o->k_head_stride, krs = o->k_row_stride;
    if ((khs && khs % 8) || (krs && krs % 8)) return 0;
    return sc1_smem(n_q_heads / n_kv_heads, d, k_bf16) <= 200 * 1024;
}

typedef void (*sc1_kernel)(const sc1_args);

template <bool BF16, int GM, int DC> static sc1_kernel sc1_get(int dev, ks_status *st) {
    static unsigned attr = 0; /* bit g: set on GPU g (the attribute is per device function) */
    if (!(attr >> (dev & 31) & 1u)) {
        cudaError_t e =
            cudaFuncSetAttribute(sc1_logits<BF16, GM, DC>, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 * 1024);
        if (e) { *st = ks_cuda_status(e, "scores (one row) kernel attribute"); return NULL; }
        attr |= 1u << (dev & 31);
    }
    return sc1_logits<BF16, GM, DC>;
}

template <bool BF16, int DC> static sc1_kernel sc1_pick_g(int64_t g, int dev, ks_status *st) {
    return g <= 1 ? sc1_get<BF16, 1, DC>(dev, st) : g <= 2 ? sc1_get<BF16, 2, DC>(dev, st)
         : g <= 4 ? sc1_get<BF16, 4, DC>(dev, st) : g <= 8 ? sc1_get<BF16, 8, DC>(dev, st)
                  : sc1_get<BF16, 16, DC>(dev, st);
}

template <bool BF16> static sc1_kernel sc1_pick(int64_t g, int64_t d, int dev, ks_status *st) {
    return d == 128 ? sc1_pick_g<BF16, 128>(g, dev, st) : d == 64 ? sc1_pick_g<BF16, 64>(g, dev, st)
                    : sc1_pick_g<BF16, 0>(g, dev, st);
}

/* The caller (ks_cuda_scores) has checked the arguments and ks_cuda_scores1_fits. */
extern "C" ks_status ks_cuda_scores1(cudaStream_t s, const ks_cuda_scratch *sc, const float *q, const int32_t *qpos,
                                     int64_t n_q_heads, const void *k, int k_bf16, const int32_t *kpos,
                                     int64_t n_kv_heads, int64_t n, int64_t d, const ks_scores_opts *o, int64_t rows,
                                     int64_t ncols, float *out) {
    sc1_args a;
    memset(&a, 0, sizeof a);
    a.q = q;
    a.k = k;
    a.kpos = kpos;
    a.qpos = qpos;
    a.hq = n_q_heads;
    a.hkv = n_kv_heads;
    a.g = n_q_heads / n_kv_heads;
    a.d = d;
    a.n = n;
    a.qhs = o->q_head_stride ? o->q_head_stride : d;
    a.khs = o->k_head_stride ? o->k_head_stride : n * d;
    a.krs = o->k_row_stride ? o->k_row_stride : d;
    a.kb = o->k_begin;
    a.ke = o->k_end == KS_END ? n : o->k_end;
    int64_t ob = o->out_begin, oe = o->out_end == KS_END ? n : o->out_end;
    a.scale = o->scale_mode == KS_SCALE_RSQRT_D ? (float)(1.0 / sqrt((double)d))
            : o->scale_mode == KS_SCALE_ONE     ? 1.0f
                                                : o->scale;
    a.causal = o->causal != 0;
    a.softmax = o->softmax != 0;
    a.gqa_mod = o->gqa == KS_GQA_MOD;
    int64_t cb = a.softmax ? a.kb : KS_MAX(a.kb, ob), ce = a.softmax ? a.ke : KS_MIN(a.ke, oe);
    if (ce < cb) ce = cb;
    int64_t lo = KS_MAX(cb, ob), hi = KS_MIN(ce, oe);
    a.cb = cb;
    a.w = hi > lo ? ce - cb : 0; /* nothing reported: no logits needed */

    scratch_set ss(sc);
    if (a.w > 0) {
        ks_status st = KS_OK;
        int dev = 0;
        KS_CU(cudaGetDevice(&dev), "scores (one row) device");
        sc1_kernel kern = k_bf16 ? sc1_pick<true>(a.g, d, dev, &st) : sc1_pick<false>(a.g, d, dev, &st);
        if (!kern) return st;
        size_t smem = sc1_smem(a.g, d, k_bf16);
        a.nx = (a.w + 32 * SC1_WARPS - 1) / (32 * SC1_WARPS); /* blocks per KV head: 32 rows a warp */
        P_SCRATCH(a.L, ss, sizeof(float) * n_q_heads * a.w, "scores");
        if (a.softmax) {
            P_SCRATCH(a.pmax, ss, sizeof(float) * n_q_heads * a.nx, "scores");
            P_SCRATCH(a.psum, ss, sizeof(double) * n_q_heads * a.nx, "scores");
            P_SCRATCH(a.M, ss, sizeof(float) * n_q_heads, "scores");
            P_SCRATCH(a.iZ, ss, sizeof(double) * n_q_heads, "scores");
            P_SCRATCH(a.done, ss, sizeof(unsigned) * n_kv_heads, "scores");
            KS_CU(cudaMemsetAsync(a.done, 0, sizeof(unsigned) * n_kv_heads, s), "scores (one row) counters");
        }
        kern<<<dim3((unsigned)a.nx, (unsigned)a.hkv), SC1_THREADS, smem, s>>>(a);
        KS_CU_LAUNCH("scores (one row) logits kernel");
    }
    (void)rows;
    sc1_vote<<<ks_cdiv((size_t)ncols, SC1_VOTE_THREADS), SC1_VOTE_THREADS, (sizeof(double) + sizeof(float)) * n_q_heads,
               s>>>(a, ob, ncols, lo, hi, (int)o->heads, out);
    KS_CU_LAUNCH("scores (one row) vote kernel");
    return KS_OK;
}
