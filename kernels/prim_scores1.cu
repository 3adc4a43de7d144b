/* prim_scores1.cu — ks_cuda_scores for one query row per head (m = 1), in about one read of
 * the keys: TokenSelect's head vote (decode steps and prefill fingerprints) and GemFilter's
 * selection row. prim_scores.cu calls it when the shapes allow (ks_cuda_scores1_fits); the
 * semantics are ks_cpu_scores' (core/prims_scores.c), its CPU twin.
 *
 * Two kernels (and a 4-byte-per-KV-head memset), w = ce - cb keys of the key domain:
 *   1. sc1_logits  grid (ceil(w / 256), Hkv), 8 warps a block. Each warp copies its 32 key rows
 *                  of one KV head into shared memory (cp.async, every copy in flight at once)
 *                  and multiplies them with the g <= 8 query heads of that KV head on the tensor
 *                  cores (mma m16n8k16, bf16 keys exactly; each query split into three bf16 parts
 *                  hi + mid + lo that carry its 24 bits, accumulated in float32), so every key
 *                  leaves DRAM once and the arithmetic is nearly free. Writes L (H, w) float32
 *                  (an invisible key, outside [kb, ke) or past the causal limit, is -inf). With a
 *                  softmax each block writes its partial per head (pmax = the max of its visible
 *                  logits, psum = the double sum of expf(l - pmax)), and the last block of each
 *                  KV head to finish (an atomic counter, zeroed by a memset before the launch)
 *                  combines the partials in a fixed order into M_h and 1 / Z_h
 *                  (Z_h = sum psum * exp(pmax - M_h)).
 *   2. sc1_vote    one thread per output column: per head v_h = (float)(expf(L - M_h) / Z_h)
 *                  (softmax) or L (raw), then the head reduction in double in ascending head
 *                  order, as on the CPU.
 * Bytes: the keys once, L (4 * H bytes a key: 1/16 of the bf16 keys at g = 4, d = 128) written
 * once and read once. Shapes: bf16 keys, d % 16 == 0, d <= 256, g <= 8 (others go to
 * prim_scores.cu's general kernel). Against the CPU the logits differ by float32 accumulation
 * order and the query's 2^-24 split error, expf by its ulps and Z by the rescaling's rounding
 * (~1e-7 relative); tests/cuda/test_cuda_prims.c compares at 2e-5 relative. Deterministic: the
 * tile-to-warp map and every combination order are fixed. */
#include "mma.cuh"
#include "prim_common.cuh"

#define SC1_WARPS 8
#define SC1_THREADS (SC1_WARPS * 32)
#define SC1_VOTE_THREADS 256
#define SC1_GMAX 8 /* query heads per KV head handled here: one mma n-tile */

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

/* The query block as mma B fragments (k16 x n8, "col"): for chunk kc of 16 dimensions, split
 * part sp (q = hi + mid + lo, each bf16; together they carry float32's 24 bits) and lane l,
 * the words {q[n][c], q[n][c + 1]} and {q[n][c + 8], q[n][c + 9]} with n = l / 4 (the query
 * head within the KV head's group; 0 past g) and c = kc * 16 + (l % 4) * 2. */
static __device__ __forceinline__ uint32_t sc1_split(float x0, float x1, int sp) {
    float r0 = x0, r1 = x1;
    for (int i = 0; i < sp; i++) {
        r0 -= __bfloat162float(__float2bfloat16_rn(r0));
        r1 -= __bfloat162float(__float2bfloat16_rn(r1));
    }
    return pack_bf16(r0, r1);
}

__global__ void __launch_bounds__(SC1_THREADS) sc1_logits(const sc1_args a) {
    extern __shared__ __align__(16) unsigned char smem[];
    __shared__ float wm[SC1_WARPS][8];
    __shared__ double ws[SC1_WARPS][8];
    __shared__ float bm[8];
    __shared__ int last;
    const int d = (int)a.d, g = (int)a.g, lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nkc = d / 16;
    const int rs = 2 * d + 16;                                   /* padded row stride (bytes) */
    uint2 *Bf = (uint2 *)smem;                                   /* (3, nkc, 32) fragments */
    unsigned char *buf = smem + sizeof(uint2) * 3 * nkc * 32 + (size_t)warp * 32 * rs; /* this warp's 32 rows */
    const int64_t kv = blockIdx.y;
    const int64_t r0 = ((int64_t)blockIdx.x * SC1_WARPS + warp) * 32; /* first row (offset in [0, w)) */
    const int nr = (int)KS_MAX((int64_t)0, KS_MIN((int64_t)32, a.w - r0));

    /* every copy of the warp's rows in flight at once (rows past nr stay garbage: their
     * results are never used), then the query fragments */
    const unsigned char *kbase = (const unsigned char *)a.k + (size_t)(kv * a.khs) * 2;
    const int cpr = d / 8;
    for (int e = lane; e < nr * cpr; e += 32) {
        int r = e / cpr, c = e - r * cpr;
        cp_async16(buf + r * rs + c * 16, kbase + (size_t)(a.cb + r0 + r) * a.krs * 2 + c * 16, 16);
    }
    cp_async_commit();
    for (int e = threadIdx.x; e < 3 * nkc * 32; e += SC1_THREADS) {
        const int sp = e / (nkc * 32), kc = (e / 32) % nkc, l = e % 32, n = l / 4, c = kc * 16 + (l % 4) * 2;
        uint2 v = make_uint2(0u, 0u);
        if (n < g) {
            const float *qr = a.q + sc1_head(a, kv, n) * a.qhs;
            v.x = sc1_split(qr[c], qr[c + 1], sp);
            v.y = sc1_split(qr[c + 8], qr[c + 9], sp);
        }
        Bf[e] = v;
    }
    cp_async_wait<0>();
    __syncthreads();

    /* lane l: rows mt * 16 + l / 4 (+ 8) of its two 16-row tiles, heads (l % 4) * 2 (+ 1) */
    float l[2][4];
    const int lim_heads = g;
#pragma unroll
    for (int mt = 0; mt < 2; mt++) {
        float acc[4] = {0.f, 0.f, 0.f, 0.f};
        const unsigned char *arow = buf + (mt * 16 + (lane & 15)) * rs + (lane >> 4) * 16;
        for (int kc = 0; kc < nkc; kc++) {
            uint32_t af[4];
            ldsm_x4(af, arow + kc * 32);
#pragma unroll
            for (int sp = 2; sp >= 0; sp--) { /* the small parts first */
                const uint2 b = Bf[(sp * nkc + kc) * 32 + lane];
                mma16816(acc, af, b.x, b.y);
            }
        }
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int row = mt * 16 + (lane >> 2) + (e >> 1) * 8, hh = (lane & 3) * 2 + (e & 1);
            const int64_t j = a.cb + r0 + row;
            bool vis = row < nr && hh < lim_heads;
            if (vis) {
                const int64_t pj = a.kpos ? (int64_t)a.kpos[j] : j;
                vis = j >= a.kb && j < a.ke && pj <= sc1_lim(a);
            }
            l[mt][e] = vis ? a.scale * acc[e] : -INFINITY;
            if (row < nr && hh < g) a.L[sc1_head(a, kv, hh) * a.w + r0 + row] = l[mt][e];
        }
    }
    if (!a.softmax) return;

    /* this block's softmax partial per head: m_b = the max of its visible logits, s_b = the
     * double sum of expf(l - m_b) (one expf a logit; no double exp on this path). Lanes with
     * the same l % 4 hold the same two heads: reduce over l / 4 (xor 4, 8, 16). */
#pragma unroll
    for (int c = 0; c < 2; c++) {
        float m = max_nan(max_nan(l[0][c], l[0][c + 2]), max_nan(l[1][c], l[1][c + 2]));
#pragma unroll
        for (int o = 4; o < 32; o <<= 1) m = max_nan(m, __shfl_xor_sync(0xffffffffu, m, o));
        if (lane < 4) wm[warp][lane * 2 + c] = m;
    }
    __syncthreads();
    if ((int)threadIdx.x < g) {
        float m = wm[0][threadIdx.x];
        for (int u = 1; u < SC1_WARPS; u++) m = max_nan(m, wm[u][threadIdx.x]);
        bm[threadIdx.x] = m;
    }
    __syncthreads();
#pragma unroll
    for (int c = 0; c < 2; c++) {
        const int hh = (lane & 3) * 2 + c;
        const float mb = hh < g ? bm[hh] : 0.f;
        double z = 0;
#pragma unroll
        for (int e = c; e < 4; e += 2)
#pragma unroll
            for (int mt = 0; mt < 2; mt++)
                if (l[mt][e] != -INFINITY) z += (double)expf(l[mt][e] - mb);
#pragma unroll
        for (int o = 4; o < 32; o <<= 1) z += __shfl_xor_sync(0xffffffffu, z, o);
        if (lane < 4) ws[warp][lane * 2 + c] = z;
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

static size_t sc1_smem(int64_t d) {
    return sizeof(uint2) * 3 * (size_t)(d / 16) * 32 + (size_t)SC1_WARPS * 32 * (size_t)(2 * d + 16);
}

extern "C" int ks_cuda_scores1_fits(int64_t n_q_heads, int64_t n_kv_heads, int64_t m, const void *k, int k_bf16,
                                    int64_t d, const sc_plan &p) {
    if (m != 1 || !k_bf16 || n_kv_heads < 1 || n_q_heads % n_kv_heads || n_q_heads / n_kv_heads > SC1_GMAX) return 0;
    if (d % 16 || d > 256 || ((uintptr_t)k & 15) || p.khs % 8 || p.krs % 8) return 0;
    return sc1_smem(d) <= 200 * 1024;
}

/* The caller (ks_cuda_scores) has checked the arguments and ks_cuda_scores1_fits. */
ks_status ks_cuda_scores1(cudaStream_t s, const ks_cuda_scratch *sc, const float *q, const int32_t *qpos,
                          int64_t n_q_heads, const void *k, const int32_t *kpos, int64_t n_kv_heads, int64_t n,
                          int64_t d, const sc_plan &p, int64_t ncols, float *out) {
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
    a.qhs = p.qhs;
    a.khs = p.khs;
    a.krs = p.krs;
    a.kb = p.kb;
    a.ke = p.ke;
    a.scale = p.scale;
    a.causal = p.causal;
    a.softmax = p.softmax;
    a.gqa_mod = p.gqa_mod;
    const int64_t ob = p.ob, lo = p.lo, hi = p.hi;
    a.cb = p.cb;
    a.w = hi > lo ? p.ce - p.cb : 0; /* nothing reported: no logits needed */

    scratch_set ss(sc);
    if (a.w > 0) {
        int dev = 0;
        KS_CU(cudaGetDevice(&dev), "scores (one row) device");
        static unsigned attr = 0; /* bit g: set on GPU g (the attribute is per device function) */
        if (!(attr >> (dev & 31) & 1u)) {
            KS_CU(cudaFuncSetAttribute(sc1_logits, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 * 1024),
                  "scores (one row) kernel attribute");
            attr |= 1u << (dev & 31);
        }
        size_t smem = sc1_smem(d);
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
        sc1_logits<<<dim3((unsigned)a.nx, (unsigned)a.hkv), SC1_THREADS, smem, s>>>(a);
        KS_CU_LAUNCH("scores (one row) logits kernel");
    }
    sc1_vote<<<ks_cdiv((size_t)ncols, SC1_VOTE_THREADS), SC1_VOTE_THREADS, (sizeof(double) + sizeof(float)) * n_q_heads,
               s>>>(a, ob, ncols, lo, hi, p.heads, out);
    KS_CU_LAUNCH("scores (one row) vote kernel");
    return KS_OK;
}
