/* prim_scores.cu — attention scores without an (m x n) matrix (ks_cuda_prims.h, semantics of
 * ks_cpu_scores in core/prims.h). One query row per head goes to prim_scores1.cu (one read of
 * the keys) where its shapes fit; this kernel does every other case.
 *
 * A block owns one tile of keys of one KV head, holds it in shared memory (float32), and
 * loops over the query heads mapped to that KV head and over the query rows in chunks of 8.
 * With a softmax the logits are computed in three passes, never stored: (1) per-tile row
 * maxima -> row max M; (2) per-tile sums of expf(l - M) in double -> 1 / Z; (3) the window
 * sums sum_i expf(l - M_i) / Z_i per key, in double, rounded to float per head. Raw logits
 * need pass 3 only. The head reduction (group sum, sum, mean) is done in double in ascending
 * head order, as on the CPU. */
#include "prim_common.cuh"
#include "attn_prep.cuh"

#define SC_THREADS 256
#define SC_QT 8

enum { SC_MAX = 0, SC_SUM = 1, SC_ACC = 2 };

struct sc_args {
    const float *q;
    const void *k;
    const int32_t *qpos, *kpos;
    int64_t hq, hkv, g, m, n, d;
    int64_t qhs, qrs, khs, krs;
    int64_t kb, ke, ob, oe;
    int64_t r0, r1;   /* key range of this pass */
    int64_t ntiles;   /* tiles of [cb, ce) (the partial arrays' stride) */
    int TK;
    float scale;
    int causal, softmax, gqa_mod;
    float *pmax;      /* (hq, m, ntiles) */
    double *pz;       /* (hq, m, ntiles) */
    const float *M;   /* (hq, m) */
    const double *iZ; /* (hq, m) */
    float *acc;       /* (hq, oe - ob) */
    const float *skip; /* NULL or one device float: nonzero = every pass returns at once (acc stays the zeros
                        * of its clear, so out is zeros) */
};

template <bool BF16>
__global__ void __launch_bounds__(SC_THREADS) scores_kernel(const sc_args a, int pass) {
    if (a.skip && *a.skip != 0.0f) return; /* skipped: no key read (ks_scores_opts.skip) */
    extern __shared__ __align__(16) unsigned char smem[];
    const int TK = a.TK, d = (int)a.d, dp = d + 1;
    float *Ks = (float *)smem;                 /* (TK, d + 1) */
    float *Qs = Ks + TK * dp;                  /* (QT, d) */
    float *L = Qs + SC_QT * d;                 /* (QT, TK) */
    double *R = (double *)(L + SC_QT * TK);    /* (SC_THREADS) */
    long long *KP = (long long *)(R + SC_THREADS); /* (TK) key positions */
    long long *QP = KP + TK;                   /* (QT) query limits */
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int64_t kv = blockIdx.y;
    const int64_t j0 = a.r0 + (int64_t)blockIdx.x * TK;
    const int tn = (int)KS_MIN((int64_t)TK, a.r1 - j0);
    const int64_t tile = (j0 - a.r0) / TK; /* passes 1-2: r0 == cb, so this is the partial index */

    for (int e = tid; e < tn * d; e += SC_THREADS) {
        int jj = e / d, c = e - jj * d;
        int64_t off = kv * a.khs + (j0 + jj) * a.krs + c;
        Ks[jj * dp + c] = BF16 ? __bfloat162float(((const bf16 *)a.k)[off]) : ((const float *)a.k)[off];
    }
    for (int jj = tid; jj < TK; jj += SC_THREADS) KP[jj] = jj < tn ? (a.kpos ? a.kpos[j0 + jj] : j0 + jj) : 0;
    /* in pass 3 this thread's key column is tid % TK in every step (256 is a multiple of TK) */
    double accd = 0;

    for (int64_t h = 0; h < a.hq; h++) {
        if ((a.gqa_mod ? h % a.hkv : h / a.g) != kv) continue;
        for (int64_t i0 = 0; i0 < a.m; i0 += SC_QT) {
            const int qn = (int)KS_MIN((int64_t)SC_QT, a.m - i0);
            __syncthreads(); /* previous chunk done with Qs / L */
            for (int e = tid; e < qn * d; e += SC_THREADS) {
                int ii = e / d, c = e - ii * d;
                Qs[ii * d + c] = a.q[h * a.qhs + (i0 + ii) * a.qrs + c];
            }
            if (tid < SC_QT) {
                long long lim = LLONG_MAX;
                if (a.causal && tid < qn) {
                    int64_t i = i0 + tid;
                    lim = a.qpos ? a.qpos[i] : a.kpos ? a.kpos[a.n - a.m + i] : a.n - a.m + i;
                }
                QP[tid] = lim;
            }
            __syncthreads();
            for (int e = tid; e < SC_QT * TK; e += SC_THREADS) {
                const int ii = e / TK, jj = e - ii * TK;
                const int64_t j = j0 + jj, hi = h * a.m + i0 + ii;
                bool vis = ii < qn && jj < tn && j >= a.kb && j < a.ke && KP[jj] <= QP[ii];
                float l = 0.f;
                if (vis) {
                    const float *qr = Qs + ii * d, *kr = Ks + jj * dp;
                    float s0 = 0.f, s1 = 0.f;
                    int c = 0;
                    for (; c + 1 < d; c += 2) { s0 += qr[c] * kr[c]; s1 += qr[c + 1] * kr[c + 1]; }
                    if (c < d) s0 += qr[c] * kr[c];
                    l = a.scale * (s0 + s1);
                }
                if (pass == SC_MAX) L[e] = vis ? l : -INFINITY;
                else if (pass == SC_SUM) L[e] = vis ? expf(l - a.M[hi]) : 0.f;
                else if (vis) accd += a.softmax ? (double)expf(l - a.M[hi]) * a.iZ[hi] : (double)l;
            }
            if (pass != SC_ACC) {
                __syncthreads();
                if (warp < qn) { /* one warp per query row of the chunk */
                    const int ii = warp;
                    if (pass == SC_MAX) {
                        float mx = -INFINITY;
                        for (int jj = lane; jj < TK; jj += 32) mx = max_nan(mx, L[ii * TK + jj]);
#pragma unroll
                        for (int o = 16; o > 0; o >>= 1) mx = max_nan(mx, __shfl_xor_sync(0xffffffffu, mx, o));
                        if (lane == 0) a.pmax[(h * a.m + i0 + ii) * a.ntiles + tile] = mx;
                    } else {
                        double z = 0;
                        for (int jj = lane; jj < TK; jj += 32) z += (double)L[ii * TK + jj];
#pragma unroll
                        for (int o = 16; o > 0; o >>= 1) z += __shfl_xor_sync(0xffffffffu, z, o);
                        if (lane == 0) a.pz[(h * a.m + i0 + ii) * a.ntiles + tile] = z;
                    }
                }
            }
        }
        if (pass == SC_ACC) {
            /* sum the partial window sums of the threads sharing this key column */
            __syncthreads();
            R[tid] = accd;
            __syncthreads();
            if (tid < TK && tid < tn) {
                double t = 0;
                for (int u = tid; u < SC_THREADS; u += TK) t += R[u];
                int64_t j = j0 + tid;
                if (j >= a.ob && j < a.oe) a.acc[h * (a.oe - a.ob) + (j - a.ob)] = (float)t;
            }
            accd = 0;
        }
    }
}

/* M (hq*m) = max over tiles; with pass 2 done, iZ = 1 / sum over tiles */
__global__ void scores_rowmax_kernel(const float *__restrict__ pmax, int64_t rows, int64_t ntiles, float *__restrict__ M,
                                     const float *skip) {
    int64_t r = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= rows || (skip && *skip != 0.0f)) return; /* skipped: no partials were written */
    float mx = -INFINITY;
    for (int64_t t = 0; t < ntiles; t++) mx = max_nan(mx, pmax[r * ntiles + t]);
    M[r] = mx;
}
__global__ void scores_rowsum_kernel(const double *__restrict__ pz, int64_t rows, int64_t ntiles,
                                     double *__restrict__ iZ, const float *skip) {
    int64_t r = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= rows || (skip && *skip != 0.0f)) return;
    double z = 0;
    for (int64_t t = 0; t < ntiles; t++) z += pz[r * ntiles + t];
    iZ[r] = 1.0 / z;
}

/* out (rows, ncols) from acc (hq, ncols): heads GROUP_SUM / SUM / MEAN, double, ascending heads */
__global__ void scores_heads_kernel(const float *__restrict__ acc, int64_t hq, int64_t hkv, int64_t ncols, int heads,
                                    int gqa_mod, float *__restrict__ out) {
    int64_t rows = heads == KS_HEADS_GROUP_SUM ? hkv : 1, total = rows * ncols, g = hq / hkv;
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += stride) {
        int64_t r = e / ncols, x = e - r * ncols;
        double s = 0;
        for (int64_t h = 0; h < hq; h++) {
            if (heads == KS_HEADS_GROUP_SUM && (gqa_mod ? h % hkv : h / g) != r) continue;
            s += acc[h * ncols + x];
        }
        out[e] = (float)(heads == KS_HEADS_MEAN ? s / (double)hq : s);
    }
}

/* The queries rotated at one position (ks_scores_opts.q_rope_inv) into a contiguous (H, m, d)
 * copy, for this file's kernel (prim_scores1.cu rotates where it reads them): ks_rope_rot, the
 * arithmetic of the engine's rotation (attn_prep.cuh), so the same bits as ks.rope on the GPU. */
struct sc_rope_args {
    float inv[256]; /* d / 2 <= 256 (d <= 512 here) */
    float af;
    int32_t pos;
};
__global__ void sc_rope_q_kernel(const __grid_constant__ sc_rope_args r, const float *__restrict__ q, int64_t hq, int64_t m,
                                 int64_t d, int64_t qhs, int64_t qrs, float *__restrict__ out) {
    const int64_t half = d / 2, total = hq * m * half, stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; t < total; t += stride) {
        const int64_t k = t % half, i = t / half % m, h = t / half / m;
        const float *u = q + h * qhs + i * qrs;
        float *v = out + (h * m + i) * d;
        ks_rope_rot(u[k], u[k + half], r.pos, r.inv[k], r.af, &v[k], &v[k + half]);
    }
}

template <bool BF16> static ks_status sc_launch(cudaStream_t s, const sc_args &a, int pass, size_t smem) {
    static unsigned attr = 0; /* bit g: set on GPU g (the attribute is per device function) */
    int dev = 0;
    KS_CU(cudaGetDevice(&dev), "scores kernel device");
    if (!(attr >> (dev & 31) & 1u)) {
        KS_CU(cudaFuncSetAttribute(scores_kernel<BF16>, cudaFuncAttributeMaxDynamicSharedMemorySize, 64 * 1024),
              "scores kernel attribute");
        attr |= 1u << (dev & 31);
    }
    int64_t tiles = (a.r1 - a.r0 + a.TK - 1) / a.TK; /* < 2^27: n <= INT32_MAX, TK >= 16 */
    scores_kernel<BF16><<<dim3((unsigned)tiles, (unsigned)a.hkv), SC_THREADS, smem, s>>>(a, pass);
    KS_CU_LAUNCH("scores kernel");
    return KS_OK;
}

static ks_status scores_impl(cudaStream_t s, const ks_cuda_scratch *sc, const float *q, const int32_t *qpos,
                             int64_t n_q_heads, int64_t m, const void *k, int k_bf16, const int32_t *kpos,
                             int64_t n_kv_heads, int64_t n, int64_t d, const ks_scores_opts *opts, float *out,
                             const int32_t *gd, int32_t goff);

extern "C" ks_status ks_cuda_scores(cudaStream_t s, const ks_cuda_scratch *sc, const float *q, const int32_t *qpos,
                                    int64_t n_q_heads, int64_t m, const void *k, int k_bf16, const int32_t *kpos,
                                    int64_t n_kv_heads, int64_t n, int64_t d, const ks_scores_opts *opts, float *out) {
    return scores_impl(s, sc, q, qpos, n_q_heads, m, k, k_bf16, kpos, n_kv_heads, n, d, opts, out, NULL, 0);
}

extern "C" ks_status ks_cuda_scores_grow(cudaStream_t s, const ks_cuda_scratch *sc, const float *q, const int32_t *qpos,
                                         int64_t n_q_heads, int64_t m, const void *k, int k_bf16, const int32_t *kpos,
                                         int64_t n_kv_heads, int64_t n, int64_t d, const ks_scores_opts *opts, float *out,
                                         const int32_t *gd, int32_t goff) {
    if (!opts || opts->grow <= 0 || !gd) return ks_errorf(KS_ERR_ARG, "scores: a growing call needs a growth and a step slot");
    if (opts->causal || qpos || kpos) return ks_errorf(KS_ERR_UNSUPPORTED, "scores: a growing call takes no positions");
    return scores_impl(s, sc, q, qpos, n_q_heads, m, k, k_bf16, kpos, n_kv_heads, n, d, opts, out, gd, goff);
}

static ks_status scores_impl(cudaStream_t s, const ks_cuda_scratch *sc, const float *q, const int32_t *qpos,
                             int64_t n_q_heads, int64_t m, const void *k, int k_bf16, const int32_t *kpos,
                             int64_t n_kv_heads, int64_t n, int64_t d, const ks_scores_opts *opts, float *out,
                             const int32_t *gd, int32_t goff) {
    ks_scores_opts def = ks_scores_opts_default();
    const ks_scores_opts *o = opts ? opts : &def;
    int64_t rows, ncols, tmp;
    ks_status st = ks_scores_out_shape(o, n_q_heads, n_kv_heads, n, &rows, &ncols);
    if (st) return st;
    P_NONNEG("scores", "m", m);
    P_IDX_RANGE("scores", "m", m);
    if (d < 1) return ks_errorf(KS_ERR_ARG, "scores: d = %lld must be >= 1", (long long)d);
    if (d > 512) return ks_errorf(KS_ERR_UNSUPPORTED, "scores: d = %lld > 512 is not supported on the GPU", (long long)d);
    if ((st = p_mul_size("scores", rows, ncols, &tmp)) || (st = p_mul_size("scores", n_q_heads, ncols, &tmp)) ||
        (st = p_mul_size("scores", m, d, &tmp)) || (st = p_mul_size("scores", n, d, &tmp)))
        return st;
    P_PTR("scores", "out", out, rows * ncols);
    P_PTR("scores", "q", q, m);
    P_PTR("scores", "k", k, n);
    if (o->causal && !qpos && m > n)
        return ks_errorf(KS_ERR_ARG,
                         "scores: causal with implicit query positions needs m <= n (m = %lld, n = %lld); pass qpos",
                         (long long)m, (long long)n);
    if (rows * ncols == 0) return KS_OK;
    sc_plan pl = sc_plan_of(o, m, n, d);
    if (pl.rinv && (d % 2 || pl.rpos < 0 || !isfinite(pl.raf)))
        return ks_errorf(KS_ERR_ARG, "scores: query rotation at position %d, factor %g, d = %lld (a position >= 0, a finite "
                         "factor, an even d)", (int)pl.rpos, (double)pl.raf, (long long)d);
    if (gd) { /* a recorded handler's growing call: the one-row kernel alone splits its rows on the device */
        pl.gd = gd;
        pl.goff = goff;
        pl.grow = o->grow;
        if (!ks_cuda_scores1_fits(n_q_heads, n_kv_heads, m, k, k_bf16, d, pl))
            return ks_errorf(KS_ERR_UNSUPPORTED, "scores: a growing call needs the one-row kernel's shapes");
        st = ks_cuda_scores1(s, sc, q, qpos, n_q_heads, k, kpos, n_kv_heads, n, d, pl, ncols, out);
        if (st == KS_ERR_UNSUPPORTED) return ks_errorf(st, "scores: a growing call of these shapes");
        return st;
    }
    if (ks_cuda_scores1_fits(n_q_heads, n_kv_heads, m, k, k_bf16, d, pl)) {
        st = ks_cuda_scores1(s, sc, q, qpos, n_q_heads, k, kpos, n_kv_heads, n, d, pl, ncols, out);
        if (st != KS_ERR_UNSUPPORTED) return st; /* unsupported, with nothing queued: more KV heads than resident blocks */
    }
    scratch_set ss(sc);
    if (pl.rinv && m > 0) { /* rotate first: the kernel below reads the rotated copy */
        sc_rope_args r;
        memcpy(r.inv, pl.rinv, sizeof(float) * (size_t)(d / 2));
        r.af = pl.raf;
        r.pos = pl.rpos;
        float *qr;
        P_SCRATCH(qr, ss, sizeof(float) * (size_t)(n_q_heads * m * d), "scores");
        const int64_t total = n_q_heads * m * (d / 2);
        sc_rope_q_kernel<<<(unsigned)KS_MIN(ks_cdiv((size_t)total, 256), (size_t)4096), 256, 0, s>>>(r, q, n_q_heads, m, d, pl.qhs,
                                                                                                    pl.qrs, qr);
        KS_CU_LAUNCH("scores query rotation kernel");
        q = qr;
        pl.qhs = m * d;
        pl.qrs = d;
    }

    sc_args a;
    memset(&a, 0, sizeof a);
    a.q = q;
    a.k = k;
    a.qpos = qpos;
    a.kpos = kpos;
    a.hq = n_q_heads;
    a.hkv = n_kv_heads;
    a.g = n_q_heads / n_kv_heads;
    a.m = m;
    a.n = n;
    a.d = d;
    a.qhs = pl.qhs;
    a.qrs = pl.qrs;
    a.khs = pl.khs;
    a.krs = pl.krs;
    a.kb = pl.kb;
    a.ke = pl.ke;
    a.ob = pl.ob;
    a.oe = pl.oe;
    a.scale = pl.scale;
    a.causal = pl.causal;
    a.softmax = pl.softmax;
    a.gqa_mod = pl.gqa_mod;
    a.skip = pl.skip;
    a.TK = d <= 128 ? 64 : d <= 256 ? 32 : 16;
    const int64_t cb = pl.cb, ce = pl.ce, lo = pl.lo, hi = pl.hi;
    size_t smem = sizeof(float) * ((size_t)a.TK * (d + 1) + SC_QT * d + SC_QT * a.TK) + sizeof(double) * SC_THREADS +
                  sizeof(long long) * (a.TK + SC_QT);

    if (o->heads == KS_HEADS_NONE) a.acc = out;
    else P_SCRATCH(a.acc, ss, sizeof(float) * n_q_heads * ncols, "scores");
    KS_CU(cudaMemsetAsync(a.acc, 0, sizeof(float) * n_q_heads * ncols, s), "scores clear");
    if (m > 0 && hi > lo) {
        if (a.softmax) {
            a.ntiles = (ce - cb + a.TK - 1) / a.TK;
            int64_t hm = n_q_heads * m;
            P_SCRATCH(a.pmax, ss, sizeof(float) * hm * a.ntiles, "scores");
            P_SCRATCH(a.pz, ss, sizeof(double) * hm * a.ntiles, "scores");
            float *M;
            double *iZ;
            P_SCRATCH(M, ss, sizeof(float) * hm, "scores");
            P_SCRATCH(iZ, ss, sizeof(double) * hm, "scores");
            a.M = M;
            a.iZ = iZ;
            a.r0 = cb;
            a.r1 = ce;
            st = k_bf16 ? sc_launch<true>(s, a, SC_MAX, smem) : sc_launch<false>(s, a, SC_MAX, smem);
            if (st) return st;
            scores_rowmax_kernel<<<ks_cdiv((size_t)hm, 128), 128, 0, s>>>(a.pmax, hm, a.ntiles, M, a.skip);
            KS_CU_LAUNCH("scores row max kernel");
            st = k_bf16 ? sc_launch<true>(s, a, SC_SUM, smem) : sc_launch<false>(s, a, SC_SUM, smem);
            if (st) return st;
            scores_rowsum_kernel<<<ks_cdiv((size_t)hm, 128), 128, 0, s>>>(a.pz, hm, a.ntiles, iZ, a.skip);
            KS_CU_LAUNCH("scores row sum kernel");
        }
        a.r0 = lo;
        a.r1 = hi;
        st = k_bf16 ? sc_launch<true>(s, a, SC_ACC, smem) : sc_launch<false>(s, a, SC_ACC, smem);
        if (st) return st;
    }
    if (o->heads != KS_HEADS_NONE) {
        scores_heads_kernel<<<ks_grid1d((size_t)(rows * ncols), 256), 256, 0, s>>>(a.acc, n_q_heads, n_kv_heads, ncols,
                                                                                   (int)o->heads, a.gqa_mod, out);
        KS_CU_LAUNCH("scores head reduction kernel");
    }
    return KS_OK;
}
