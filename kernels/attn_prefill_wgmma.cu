/* attn_prefill_wgmma.cu — see attn_prefill_wgmma.cuh (layouts, descriptors and fragments are
 * documented there). Hopper only: wgmma needs the sm_90a target (kernels/cuda.mk). */
#include "common.cuh"
#include "attn_prefill_wgmma.cuh"
#include "attn_prefill.cuh"
#include "mma.cuh"
#include "hopper.cuh"

#include <cuda.h>
#include <cudaTypedefs.h>
#include <limits.h>
#include <string.h>
#include <stdlib.h>

#define WG_BOUNDS_TILE KS_ATTN_BOUNDS_TILE /* keys per position-bound entry (shared with the flash kernel) */

/* ---------------------------------------------------------------- wgmma PTX wrappers (more in hopper.cuh) */

template <int K> static __device__ __forceinline__ void pin_u(uint32_t (&a)[K][4]) {
#pragma unroll
    for (int i = 0; i < K; i++)
#pragma unroll
        for (int e = 0; e < 4; e++) asm volatile("" : "+r"(a[i][e])::"memory");
}


/* D(64 x 64) (+)= A(64 x 16, smem, K-major) * B(16 x 64, smem, K-major); scale_d 0 overwrites D */
static __device__ __forceinline__ void wgmma_ss_n64(float (&d)[32], uint64_t da, uint64_t db, int scale_d) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, %32, %33, p, 1, 1, 0, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
                 : "l"(da), "l"(db), "r"(scale_d));
}
/* D(64 x 64) += A(64 x 16, registers) * B(16 x 64, smem, MN-major: imm-trans-b = 1) */
static __device__ __forceinline__ void wgmma_rs_n64(float (&d)[32], const uint32_t (&a)[4], uint64_t db, int scale_d) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, {%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(scale_d));
}
/* D(64 x 128) += A(64 x 16, registers) * B(16 x 128, smem, MN-major: imm-trans-b = 1) */
static __device__ __forceinline__ void wgmma_rs_n128(float (&d)[64], const uint32_t (&a)[4], uint64_t db, int scale_d) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(scale_d));
}

template <int N> struct wg_mma;
template <> struct wg_mma<64> {
    static __device__ __forceinline__ void ss(float (&d)[32], uint64_t a, uint64_t b, int sc) { wgmma_ss_n64(d, a, b, sc); }
    static __device__ __forceinline__ void rs(float (&d)[32], const uint32_t (&a)[4], uint64_t b) { wgmma_rs_n64(d, a, b, 1); }
};
template <> struct wg_mma<128> {
    static __device__ __forceinline__ void ss(float (&d)[64], uint64_t a, uint64_t b, int sc) { wgmma_ss_n128(d, a, b, sc); }
    static __device__ __forceinline__ void rs(float (&d)[64], const uint32_t (&a)[4], uint64_t b) { wgmma_rs_n128(d, a, b, 1); }
};

/* Issue S (64 x BN) = Q K^T of one key tile as KS k16 wgmmas: Q at qbase (BM-row slabs of 128
 * bytes a row, 128-byte swizzle), K at kbase (BN-row slabs). Issue only: the caller fences,
 * commits and waits. */
template <int BN, int KS, int BM, int SR>
static __device__ __forceinline__ void qk_issue(float (&s)[SR], uint32_t qbase, uint32_t kbase) {
#pragma unroll
    for (int ks = 0; ks < KS; ks++) {
        uint32_t off = (ks & 3) * 32; /* k16 slice within the 128-byte swizzle row */
        uint64_t da = wg_desc(qbase + (ks >> 2) * (BM * 128) + off, 16, 1024);
        uint64_t db = wg_desc(kbase + (ks >> 2) * (BN * 128) + off, 16, 1024);
        wg_mma<BN>::ss(s, da, db, ks > 0);
    }
}

/* Issue O (64 x D) += P V of one key tile as PK k16 wgmmas: P in registers (pack_p), V at vbase
 * (BN rows, MN-major). Issue only, as qk_issue. */
template <int D, int PK, int BN, int OR>
static __device__ __forceinline__ void pv_issue(float (&o)[OR], const uint32_t (&pa)[PK][4], uint32_t vbase) {
#pragma unroll
    for (int kk = 0; kk < PK; kk++) {
        uint64_t db = wg_desc(vbase + kk * 2048, BN * 128, 1024);
        wg_mma<D>::rs(o, pa[kk], db);
    }
}

/* ---------------------------------------------------------------- the kernel */

struct wg_args {
    ks_cuda_attn_params p;
    const int2 *bounds; /* (n_kv_heads, max_tiles) per 64-key tile */
    int max_tiles, n_qblocks;
    float scale_log2; /* scale * log2(e) */
};

#define WG_BM 128      /* query rows per CTA (2 warpgroups x 64) */
#define WG_THREADS 256

template <int D, int BN> struct wg_smem {
    static constexpr int Q = WG_BM * D * 2;   /* bytes of the Q tile */
    static constexpr int KV = BN * D * 2;     /* bytes of one K (or V) tile */
    static constexpr int TOTAL = 1024 /* alignment slack */ + Q + 4 * KV + 2 * BN * 4 + 2 * 8 * 4;
};

/* PACK 0: the CTA's 128 rows are 128 consecutive queries of query head blockIdx.x.
 * PACK 1 (variant 3, "GQA packing"): the CTA serves KV head blockIdx.x; its rows are 128
 * consecutive entries of the flattened (query i, head of the group) order f = i * G + (h % G),
 * G = n_heads / n_kv_heads, so one K/V tile feeds all G query heads of the group.
 * SB 1 (variant 4): one __syncthreads per key tile instead of two: the next tile's copies are
 * issued after the barrier that starts a tile (when every warp is done with the other buffer),
 * instead of before it with a second barrier at the end of the tile. */
/* ---------------------------------------------------------------- pieces shared by the kernels */

/* A CTA's rows: q0 .. q0 + BM - 1 of the order f (flattened (query, head of the group) when
 * pack, else the queries of query head `head`) */
struct wg_rows {
    int q0, nrows, G, kv, H, pack, head;
    __device__ int q(int f) const { return pack ? f / G : f; }
    __device__ int h(int f) const { return pack ? kv * G + (f - (f / G) * G) : head; }
};

/* Rows r0 .. r0 + nr - 1 of the CTA's (BM, D) Q tile: float32 -> bf16 in the SW128 layout, rows
 * past nrows zero; thread t of nt */
template <int D, int BM>
static __device__ __forceinline__ void stage_q(unsigned char *sQ, const float *q, const wg_rows &R, int r0, int nr, int t,
                                               int nt) {
    constexpr int NCH = D / 8;
    for (int e = t; e < nr * NCH; e += nt) {
        int r = r0 + e / NCH, c = e % NCH;
        uint4 v = make_uint4(0, 0, 0, 0);
        if (R.q0 + r < R.nrows) {
            const int f = R.q0 + r;
            const float4 *src = reinterpret_cast<const float4 *>(q + ((size_t)R.q(f) * R.H + R.h(f)) * D + c * 8);
            float4 a = src[0], b = src[1];
            v.x = pack_bf16(a.x, a.y);
            v.y = pack_bf16(a.z, a.w);
            v.z = pack_bf16(b.x, b.y);
            v.w = pack_bf16(b.z, b.w);
        }
        *reinterpret_cast<uint4 *>(sQ + (c >> 3) * (BM * 128) + r * 128 + (((c & 7) ^ (r & 7)) << 4)) = v;
    }
}

/* The walk over BN-key tiles: bounds from the 64-key entries, tiles no row can see skipped,
 * tiles every row sees whole ("full": no mask) */
template <int BN> struct tile_walk {
    const int2 *TB;
    int max_tiles, ntiles, nk, qmin, qmax, window;
    __device__ int2 bounds(int t) const {
        int2 b = TB[t * BN / WG_BOUNDS_TILE];
        if (BN > WG_BOUNDS_TILE) {
#pragma unroll
            for (int x = 1; x < BN / WG_BOUNDS_TILE; x++) {
                int e = t * BN / WG_BOUNDS_TILE + x;
                if (e < max_tiles) {
                    int2 c = TB[e];
                    b.x = min(b.x, c.x);
                    b.y = max(b.y, c.y);
                }
            }
        }
        return b;
    }
    __device__ int next(int t) const { /* the first tile >= t some row sees (ntiles: none) */
        for (; t < ntiles; t++) {
            int2 b = bounds(t);
            if (!(b.x > qmax || (window > 0 && (long long)qmin - b.y >= window))) break;
        }
        return t;
    }
    __device__ bool full(int t) const {
        int2 tb = bounds(t);
        return (t + 1) * BN <= nk && tb.y <= qmin && (window <= 0 || (long long)qmax - tb.x < window);
    }
};

/* One S tile (this thread's SR accumulators, rows g and g + 8 of its warp): scale to the log2
 * domain, mask unless `full` (key(col) gives the position of the tile's key col), and the online
 * softmax update (hf 0: row g, elements 4i, 4i+1; hf 1: row g+8, 4i+2, 4i+3): s becomes P,
 * corr[hf] the factor for the row's earlier sums */
template <int SR, int BN, typename KEY>
static __device__ __forceinline__ void softmax_tile(float (&s)[SR], bool full, float sl2, int t, int nk, int window,
                                                    const int (&qp_r)[2], int t4, KEY key, float (&m_r)[2],
                                                    float (&l_r)[2], float (&corr)[2]) {
    if (full) {
#pragma unroll
        for (int i = 0; i < SR; i++) s[i] *= sl2;
    } else {
#pragma unroll
        for (int i = 0; i < SR; i++) {
            int col = (i >> 2) * 8 + t4 * 2 + (i & 1);
            int k = key(col);
            int qp = qp_r[(i >> 1) & 1];
            bool vis = t * BN + col < nk && k <= qp && (window <= 0 || (long long)qp - k < window);
            s[i] = vis ? s[i] * sl2 : -INFINITY;
        }
    }
#pragma unroll
    for (int hf = 0; hf < 2; hf++) {
        float mx = -INFINITY;
#pragma unroll
        for (int i = 0; i < SR / 4; i++) mx = fmaxf(mx, fmaxf(s[4 * i + 2 * hf], s[4 * i + 2 * hf + 1]));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        float mn = fmaxf(m_r[hf], mx);
        float base = mn == -INFINITY ? 0.f : mn;
        corr[hf] = fast_exp2(m_r[hf] - base); /* -inf -> 0 */
        m_r[hf] = mn;
        float ps = 0.f;
#pragma unroll
        for (int i = 0; i < SR / 4; i++) {
            s[4 * i + 2 * hf] = fast_exp2(s[4 * i + 2 * hf] - base);
            s[4 * i + 2 * hf + 1] = fast_exp2(s[4 * i + 2 * hf + 1] - base);
            ps += s[4 * i + 2 * hf] + s[4 * i + 2 * hf + 1];
        }
        l_r[hf] = l_r[hf] * corr[hf] + ps;
    }
}

/* P (bf16 A fragments of O += P V) from the softmaxed S (see the header's fragment map) */
template <int PK, int SR>
static __device__ __forceinline__ void pack_p(uint32_t (&pa)[PK][4], const float (&s)[SR]) {
#pragma unroll
    for (int kk = 0; kk < PK; kk++) {
        pa[kk][0] = pack_bf16(s[8 * kk + 0], s[8 * kk + 1]);
        pa[kk][1] = pack_bf16(s[8 * kk + 2], s[8 * kk + 3]);
        pa[kk][2] = pack_bf16(s[8 * kk + 4], s[8 * kk + 5]);
        pa[kk][3] = pack_bf16(s[8 * kk + 6], s[8 * kk + 7]);
    }
}

/* Normalise and store this thread's two rows (f0 and f0 + 8 of the order) */
template <int D, int OR>
static __device__ __forceinline__ void store_rows(const float (&o)[OR], const float (&l_r)[2], float *out, const wg_rows &R,
                                                  int f0, int t4) {
#pragma unroll
    for (int hf = 0; hf < 2; hf++) {
        float l = l_r[hf];
        l += __shfl_xor_sync(0xffffffffu, l, 1);
        l += __shfl_xor_sync(0xffffffffu, l, 2);
        float inv = l > 0.f ? 1.0f / l : 0.f;
        int f = f0 + 8 * hf;
        if (f < R.nrows) {
            float *dst = out + ((size_t)R.q(f) * R.H + R.h(f)) * D + t4 * 2;
#pragma unroll
            for (int c = 0; c < OR / 4; c++)
                *reinterpret_cast<float2 *>(dst + c * 8) = make_float2(o[4 * c + 2 * hf] * inv, o[4 * c + 2 * hf + 1] * inv);
        }
    }
}

#ifdef KS_KERNEL_DEV
/* Variants 1 .. 4 (dev harness only): two warpgroups of 64 rows, CTA barriers per key tile. */
template <int D, int BN, int MINB, int PACK, int SB>
__global__ void __launch_bounds__(WG_THREADS, MINB) wg_prefill_kernel(const wg_args A) {
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    constexpr int NCH = D / 8;    /* 16-byte chunks per row */
    constexpr int KS = D / 16;    /* k16 steps of S = Q K^T */
    constexpr int PK = BN / 16;   /* k16 steps of O += P V */
    constexpr int SR = BN / 2;    /* S accumulators per thread */
    constexpr int OR = D / 2;     /* O accumulators per thread */
    typedef wg_smem<D, BN> L;
    unsigned char *smem = smem_raw + ((1024u - (smem_u32(smem_raw) & 1023u)) & 1023u);
    unsigned char *sQ = smem;                       /* SW128 (128, D) */
    unsigned char *sK = sQ + L::Q;                  /* 2 x SW128 (BN, D) */
    unsigned char *sV = sK + 2 * L::KV;             /* 2 x SW128 (BN, D) */
    int *sKP = (int *)(sV + 2 * L::KV);             /* 2 x BN key positions */
    int *sRed = sKP + 2 * BN;                       /* 2 x 8 */

    const ks_cuda_attn_params &p = A.p;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wg = warp >> 2, wq = warp & 3;        /* warpgroup, warp within it */
    const int g = lane >> 2, t4 = lane & 3;
    const int G = p.n_heads / p.n_kv_heads;
    const int kv = PACK ? (int)blockIdx.x : (int)blockIdx.x / G;
    const int qb = A.n_qblocks - 1 - blockIdx.y;    /* heaviest first */
    const int q0 = qb * WG_BM, H = p.n_heads;       /* q0: first row (flattened when PACK) */
    const int nrows = PACK ? p.n * G : p.n;
    const wg_rows R = {q0, nrows, G, kv, H, PACK, (int)blockIdx.x};
    const int nk = p.nk[kv], ntiles = (nk + BN - 1) / BN;
    const bf16 *Kg = (const bf16 *)p.k + (size_t)kv * p.capacity * D;
    const bf16 *Vg = (const bf16 *)p.v + (size_t)kv * p.capacity * D;
    const int32_t *KPg = (p.kpos && !p.renumber) ? p.kpos + (size_t)kv * p.capacity : nullptr;
    const int window = p.window;

    stage_q<D, WG_BM>(sQ, p.q, R, 0, WG_BM, tid, WG_THREADS); /* Q: float32 -> bf16, SW128 */
    /* this thread's two rows (accumulator rows g and g + 8 of its warp) and their positions */
    const int row0 = wg * 64 + wq * 16 + g;
    int qp_r[2];
#pragma unroll
    for (int hf = 0; hf < 2; hf++) {
        int f = q0 + row0 + 8 * hf, i = R.q(f);
        qp_r[hf] = f >= nrows ? INT_MIN : p.q_renumber ? nk - p.n + i : p.qpos[i];
    }
    /* block-wide bounds of the valid query positions */
    int qlo = INT_MAX, qhi = INT_MIN;
#pragma unroll
    for (int hf = 0; hf < 2; hf++)
        if (q0 + row0 + 8 * hf < nrows) { qlo = min(qlo, qp_r[hf]); qhi = max(qhi, qp_r[hf]); }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        qlo = min(qlo, __shfl_xor_sync(0xffffffffu, qlo, o));
        qhi = max(qhi, __shfl_xor_sync(0xffffffffu, qhi, o));
    }
    if (lane == 0) { sRed[warp] = qlo; sRed[8 + warp] = qhi; }
    proxy_fence(); /* the Q stores are read by wgmma */
    __syncthreads();
    int qmin = INT_MAX, qmax = INT_MIN;
#pragma unroll
    for (int w = 0; w < 8; w++) { qmin = min(qmin, sRed[w]); qmax = max(qmax, sRed[8 + w]); }

    const tile_walk<BN> W = {A.bounds + (size_t)kv * A.max_tiles, A.max_tiles, ntiles, nk, qmin, qmax, window};
    auto load_tile = [&](int t, int buf) {
        unsigned char *dk = sK + buf * L::KV, *dv = sV + buf * L::KV;
        for (int e = tid; e < BN * NCH; e += WG_THREADS) {
            int r = e / NCH, c = e - r * NCH;
            int j = t * BN + r;
            int ok = j < nk;
            size_t off = (size_t)(ok ? j : 0) * D + c * 8;
            int so = (c >> 3) * (BN * 128) + r * 128 + (((c & 7) ^ (r & 7)) << 4);
            cp_async16(dk + so, Kg + off, ok ? 16 : 0);
            cp_async16(dv + so, Vg + off, ok ? 16 : 0);
        }
        for (int r = tid; r < BN; r += WG_THREADS) {
            int j = t * BN + r;
            if (KPg) cp_async4(sKP + buf * BN + r, KPg + (j < nk ? j : 0), j < nk ? 4 : 0);
            else sKP[buf * BN + r] = j;
        }
    };

    float o[OR];
#pragma unroll
    for (int i = 0; i < OR; i++) o[i] = 0.f;
    float m_r[2] = {-INFINITY, -INFINITY}, l_r[2] = {0.f, 0.f};
    const float sl2 = A.scale_log2;
    const uint32_t qbase = smem_u32(sQ) + wg * 64 * 128;

    int t = W.next(0);
    if (t < ntiles) load_tile(t, 0);
    cp_async_commit();
    for (int it = 0; t < ntiles; it++) {
        const int buf = it & 1;
        int tn;
        if (SB) {
            cp_async_wait<0>(); /* tile t (the only group in flight) */
            proxy_fence();      /* this thread's copies are read by wgmma */
            __syncthreads();    /* also: every warp is done with buffer buf ^ 1 (tile it - 1) */
            tn = W.next(t + 1);
            if (tn < ntiles) load_tile(tn, buf ^ 1);
            cp_async_commit();
        } else {
            tn = W.next(t + 1);
            if (tn < ntiles) load_tile(tn, buf ^ 1);
            cp_async_commit();
            cp_async_wait<1>();
            proxy_fence(); /* this thread's copies are read by wgmma */
            __syncthreads();
        }

        /* ---- S = Q K^T */
        const uint32_t kbase = smem_u32(sK + buf * L::KV), vbase = smem_u32(sV + buf * L::KV);
        float s[SR];
        pin(s);
        wg_fence();
        qk_issue<BN, KS, WG_BM>(s, qbase, kbase);
        wg_commit();
        wg_wait0();
        pin(s);

        /* ---- mask unless the whole tile is visible to every row, online softmax */
        const int *kp = sKP + buf * BN;
        float corr[2];
        softmax_tile<SR, BN>(s, W.full(t), sl2, t, nk, window, qp_r, t4, [&](int col) { return kp[col]; }, m_r, l_r, corr);
#pragma unroll
        for (int i = 0; i < OR; i++) o[i] *= corr[(i >> 1) & 1];

        /* ---- O += P V (P from registers) */
        uint32_t pa[PK][4];
        pack_p(pa, s);
        pin(o);
        wg_fence();
        pv_issue<D, PK, BN>(o, pa, vbase);
        wg_commit();
        wg_wait0();
        pin(o);
        if (!SB) __syncthreads(); /* buffer buf is refilled next iteration */
        t = tn;
    }
    cp_async_wait<0>();

    store_rows<D>(o, l_r, p.out, R, q0 + row0, t4);
}

#endif /* KS_KERNEL_DEV */

/* ---------------------------------------------------------------- warp-specialised kernels (variants 8 .. 12) */


/* Variant 8: warp specialisation. 3 warpgroups: warpgroup 0 produces (cp.async of K, V and key
 * positions into an NST-slot ring; each slot has a "full" mbarrier that the 128 producer threads
 * arrive on when their copies land, and an "empty" one that each consumer warpgroup arrives on
 * when its GEMMs are done with the slot), warpgroups 1 and 2 consume 64 query rows each with the
 * pipelined loop of variants 5 .. 7 (S_j and P_{j-1} V_{j-1} in flight together, softmax of S_j
 * under the P V GEMM). No CTA-wide barrier inside the loop: each side waits only on the slot it
 * needs. Both sides walk the same sequence of non-skipped tiles. */
template <int D, int BN, int NST> struct ws_smem {
    static constexpr int BM = 128;
    static constexpr int Q = BM * D * 2;
    static constexpr int KV = BN * D * 2;
    static constexpr int TOTAL = 1024 + Q + NST * 2 * KV + NST * BN * 4 + 2 * NST * 8 + 2 * 12 * 4;
};


/* TMA 0: the producer warpgroup's 128 threads copy with cp.async (variants 8, 9);
 * TMA 1 (variant 10): one producer thread issues TMA box copies of whole tiles (the tensor maps
 * tmK / tmV describe the cache as (n_kv_heads, capacity, D) bf16 with 64 x BN boxes and the
 * 128-byte swizzle), except a tile that reaches past nk: the producer warp copies it with
 * zero-filling cp.async, so garbage rows past nk (NaN in the tests) never meet P = 0 in P V.
 * With TMA, masked tiles read key positions from global memory (L1) instead of shared. */
template <int D, int BN, int NST, int TMA, int PP = 0>
__global__ void __launch_bounds__(384, 1) wg_ws_kernel(const wg_args A, const __grid_constant__ CUtensorMap tmK,
                                                      const __grid_constant__ CUtensorMap tmV) {
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    constexpr int BM = 128, NCH = D / 8, KS = D / 16, PK = BN / 16, SR = BN / 2, OR = D / 2;
    typedef ws_smem<D, BN, NST> L;
    unsigned char *smem = smem_raw + ((1024u - (smem_u32(smem_raw) & 1023u)) & 1023u);
    unsigned char *sQ = smem;                     /* SW128 (BM, D) */
    unsigned char *sK = sQ + L::Q;                /* NST x SW128 (BN, D) */
    unsigned char *sV = sK + NST * L::KV;         /* NST x SW128 (BN, D) */
    int *sKP = (int *)(sV + NST * L::KV);         /* NST x BN key positions */
    uint64_t *bars = (uint64_t *)(sKP + NST * BN); /* full[NST], empty[NST] */
    int *sRed = (int *)(bars + 2 * NST);          /* 2 x 12 */
    const uint32_t full0 = smem_u32(bars), empty0 = smem_u32(bars + NST);

    const ks_cuda_attn_params &p = A.p;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    /* wg 0: producer; 1, 2: consumers (through a shuffle so the compiler sees a warp-uniform
     * value: wgmma in a branch it thinks divergent gets serialised) */
    const int wg = __shfl_sync(0xffffffffu, tid >> 7, 0), wq = warp & 3;
    const int g = lane >> 2, t4 = lane & 3;
    const int G = p.n_heads / p.n_kv_heads;
    const int kv = blockIdx.x;
    const int qb = A.n_qblocks - 1 - blockIdx.y;
    const int q0 = qb * BM, H = p.n_heads;
    const int nrows = p.n * G;
    const wg_rows R = {q0, nrows, G, kv, H, 1, 0};
    const int nk = p.nk[kv], ntiles = (nk + BN - 1) / BN;
    const bf16 *Kg = (const bf16 *)p.k + (size_t)kv * p.capacity * D;
    const bf16 *Vg = (const bf16 *)p.v + (size_t)kv * p.capacity * D;
    const int32_t *KPg = (p.kpos && !p.renumber) ? p.kpos + (size_t)kv * p.capacity : nullptr;
    const int window = p.window;

    /* consumer rows: warpgroup c = wg - 1 owns rows 64c .. 64c + 63 of the block */
    const int cw = wg - 1;
    const int row0 = cw * 64 + wq * 16 + g;
    int qp_r[2] = {INT_MIN, INT_MIN};
    int qlo = INT_MAX, qhi = INT_MIN;
    if (wg > 0) {
#pragma unroll
        for (int hf = 0; hf < 2; hf++) {
            int f = q0 + row0 + 8 * hf, i = R.q(f);
            qp_r[hf] = f >= nrows ? INT_MIN : p.q_renumber ? nk - p.n + i : p.qpos[i];
            if (f < nrows) { qlo = min(qlo, qp_r[hf]); qhi = max(qhi, qp_r[hf]); }
        }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        qlo = min(qlo, __shfl_xor_sync(0xffffffffu, qlo, o));
        qhi = max(qhi, __shfl_xor_sync(0xffffffffu, qhi, o));
    }
    if (lane == 0) { sRed[warp] = qlo; sRed[12 + warp] = qhi; }
    if (tid == 0) {
        for (int i = 0; i < NST; i++) {
            mbar_init(full0 + 8 * i, TMA ? 1 : 128);
            mbar_init(empty0 + 8 * i, 2);
        }
    }
    __syncthreads();
    int qmin = INT_MAX, qmax = INT_MIN;
#pragma unroll
    for (int w = 0; w < 12; w++) { qmin = min(qmin, sRed[w]); qmax = max(qmax, sRed[12 + w]); }

    const tile_walk<BN> W = {A.bounds + (size_t)kv * A.max_tiles, A.max_tiles, ntiles, nk, qmin, qmax, window};

    if (wg == 0) {
        /* ---------------- producer */
        if (BN > 64) asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n" ::: "memory");
        if (TMA) {
            if (warp != 0) return;
            int j = 0;
            for (int t = W.next(0); t < ntiles; t = W.next(t + 1), j++) {
                const int slot = j % NST;
                if (j >= NST) mbar_wait(empty0 + 8 * slot, ((j / NST) - 1) & 1);
                const uint32_t dk = smem_u32(sK + slot * L::KV), dv = smem_u32(sV + slot * L::KV);
                if ((t + 1) * BN <= nk) {
                    if (lane == 0) {
                        mbar_expect_tx(full0 + 8 * slot, 2 * L::KV);
#pragma unroll
                        for (int b = 0; b < D / 64; b++) {
                            tma_load3(dk + b * BN * 128, &tmK, b * 64, t * BN, kv, full0 + 8 * slot);
                            tma_load3(dv + b * BN * 128, &tmV, b * 64, t * BN, kv, full0 + 8 * slot);
                        }
                    }
                } else {
                    for (int e = lane; e < BN * NCH; e += 32) {
                        int r = e / NCH, c = e - r * NCH;
                        int jj = t * BN + r;
                        int ok = jj < nk;
                        size_t off = (size_t)(ok ? jj : 0) * D + c * 8;
                        int so = (c >> 3) * (BN * 128) + r * 128 + (((c & 7) ^ (r & 7)) << 4);
                        cp_async16(sK + slot * L::KV + so, Kg + off, ok ? 16 : 0);
                        cp_async16(sV + slot * L::KV + so, Vg + off, ok ? 16 : 0);
                    }
                    cp_async_commit();
                    cp_async_wait<0>();
                    __syncwarp();
                    if (lane == 0) mbar_arrive(full0 + 8 * slot);
                }
            }
            return;
        }
        int j = 0;
        for (int t = W.next(0); t < ntiles; t = W.next(t + 1), j++) {
            const int slot = j % NST;
            if (j >= NST) mbar_wait(empty0 + 8 * slot, ((j / NST) - 1) & 1);
            unsigned char *dk = sK + slot * L::KV, *dv = sV + slot * L::KV;
            for (int e = tid; e < BN * NCH; e += 128) {
                int r = e / NCH, c = e - r * NCH;
                int jj = t * BN + r;
                int ok = jj < nk;
                size_t off = (size_t)(ok ? jj : 0) * D + c * 8;
                int so = (c >> 3) * (BN * 128) + r * 128 + (((c & 7) ^ (r & 7)) << 4);
                cp_async16(dk + so, Kg + off, ok ? 16 : 0);
                cp_async16(dv + so, Vg + off, ok ? 16 : 0);
            }
            if (KPg)
                for (int r = tid; r < BN; r += 128) {
                    int jj = t * BN + r;
                    cp_async4(sKP + slot * BN + r, KPg + (jj < nk ? jj : 0), jj < nk ? 4 : 0);
                }
            mbar_cp_async_arrive(full0 + 8 * slot);
        }
        cp_async_wait<0>();
        return;
    }

    /* ---------------- consumers: Q of this warpgroup's 64 rows, float32 -> bf16 */
    if (BN > 64) asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n" ::: "memory");
    stage_q<D, BM>(sQ, p.q, R, cw * 64, 64, tid - 128 * wg, 128);
    proxy_fence();
    wg_bar(wg); /* named barrier 1 or 2: this warpgroup's Q rows are in place */

    float o[OR];
#pragma unroll
    for (int i = 0; i < OR; i++) o[i] = 0.f;
    float m_r[2] = {-INFINITY, -INFINITY}, l_r[2] = {0.f, 0.f};
    const float sl2 = A.scale_log2;
    const uint32_t qbase = smem_u32(sQ) + cw * 64 * 128;
    uint32_t pa[PK][4];
    const bool leader = (tid & 127) == 0;
    int j = 0, pslot = 0;
    if (PP && cw == 1) bar_arrive_n(3, 256); /* warpgroup 1 issues its GEMMs first */
    for (int t = W.next(0); t < ntiles; t = W.next(t + 1), j++) {
        const int slot = j % NST;
        mbar_wait(full0 + 8 * slot, (j / NST) & 1);
        proxy_fence();
        const uint32_t kbase = smem_u32(sK + slot * L::KV);
        float s[SR];
        pin(s);
        pin(o);
        if (PP) bar_sync_n(3 + cw, 256); /* my turn on the tensor cores */
        wg_fence();
        qk_issue<BN, KS, BM>(s, qbase, kbase);
        wg_commit();
        if (j > 0) pv_issue<D, PK, BN>(o, pa, smem_u32(sV + pslot * L::KV));
        wg_commit();
        if (PP) bar_arrive_n(3 + (1 - cw), 256); /* the other warpgroup's turn */
        asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");
        pin(s);

        const int *kp = sKP + slot * BN;
        float corr[2];
        softmax_tile<SR, BN>(s, W.full(t), sl2, t, nk, window, qp_r, t4, [&](int col) {
            int jj = t * BN + col;
            return !KPg ? jj : TMA ? (jj < nk ? __ldg(KPg + jj) : INT_MAX) : kp[col];
        }, m_r, l_r, corr);
        wg_wait0(); /* P_{j-1} V_{j-1} done */
        pin(o);
        pin_u(pa);
        pin(s);
        if (j > 0) {
            __syncwarp();
            if (leader) mbar_arrive(empty0 + 8 * pslot); /* slot of tile j - 1: K and V read */
        }
#pragma unroll
        for (int i = 0; i < OR; i++) o[i] *= corr[(i >> 1) & 1];
        pack_p(pa, s);
        pslot = slot;
    }
    if (j > 0) {
        pin(o);
        wg_fence();
        pv_issue<D, PK, BN>(o, pa, smem_u32(sV + pslot * L::KV));
        wg_commit();
        wg_wait0();
        pin(o);
    }

    store_rows<D>(o, l_r, p.out, R, q0 + row0, t4);
}

/* ---------------------------------------------------------------- entry points */

extern "C" int ks_cuda_attn_prefill_wgmma_supported(const ks_cuda_attn_params *p) {
    return (p->head_dim == 64 || p->head_dim == 128) && !p->idx && !p->k_f32 && p->n_kv_heads > 0 &&
           p->n_heads % p->n_kv_heads == 0 && (uintptr_t)p->k % 16 == 0 && (uintptr_t)p->v % 16 == 0;
}

extern "C" size_t ks_cuda_attn_prefill_wgmma_workspace(const ks_cuda_attn_params *p) {
    size_t tiles = (size_t)(p->max_nk + WG_BOUNDS_TILE - 1) / WG_BOUNDS_TILE;
    return (tiles ? tiles : 1) * p->n_kv_heads * sizeof(int2);
}

#ifdef KS_KERNEL_DEV
template <int D, int BN, int MINB, int PACK, int SB> static ks_status wg_launch(cudaStream_t s, wg_args a) {
    static unsigned attr_done = 0; /* bit g: set on GPU g (the attribute is per device function) */
    const int smem = wg_smem<D, BN>::TOTAL;
    int dev = 0;
    cudaGetDevice(&dev);
    if (!(attr_done >> (dev & 31) & 1u)) {
        KS_CU(cudaFuncSetAttribute(wg_prefill_kernel<D, BN, MINB, PACK, SB>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem),
              "attention (wgmma) shared memory");
        attr_done |= 1u << (dev & 31);
    }
    long long rows = PACK ? (long long)a.p.n * (a.p.n_heads / a.p.n_kv_heads) : a.p.n;
    if ((rows + WG_BM - 1) / WG_BM > 65535)
        return ks_errorf(KS_ERR_UNSUPPORTED, "attention (wgmma): %d query rows is too many", a.p.n);
    a.n_qblocks = (int)((rows + WG_BM - 1) / WG_BM);
    dim3 grid(PACK ? a.p.n_kv_heads : a.p.n_heads, a.n_qblocks);
    wg_prefill_kernel<D, BN, MINB, PACK, SB><<<grid, WG_THREADS, smem, s>>>(a);
    KS_CU_LAUNCH("attention (wgmma prefill) kernel");
    return KS_OK;
}

#endif /* KS_KERNEL_DEV */


/* The cache (n_kv_heads, capacity, D) bf16 as a TMA tensor map with (64, BN, 1) boxes, SW128 */
static int tmap_kv(CUtensorMap *m, const void *base, int D, int cap, int hkv, int BN) {
    PFN_cuTensorMapEncodeTiled_v12000 enc = tmap_encoder();
    if (!enc || (uintptr_t)base % 16) return 0;
    cuuint64_t dims[3] = {(cuuint64_t)D, (cuuint64_t)cap, (cuuint64_t)hkv};
    cuuint64_t strides[2] = {(cuuint64_t)D * 2, (cuuint64_t)cap * D * 2};
    cuuint32_t box[3] = {64, (cuuint32_t)BN, 1}, es[3] = {1, 1, 1};
    return enc(m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, (void *)base, dims, strides, box, es, CU_TENSOR_MAP_INTERLEAVE_NONE,
               CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

template <int D, int BN, int NST, int TMA, int PP = 0> static ks_status ws_launch(cudaStream_t s, wg_args a) {
    static unsigned attr_done = 0; /* bit g: set on GPU g (the attribute is per device function) */
    const int smem = ws_smem<D, BN, NST>::TOTAL;
    CUtensorMap mk, mv;
    memset(&mk, 0, sizeof mk);
    memset(&mv, 0, sizeof mv);
    if (TMA && !(tmap_kv(&mk, a.p.k, D, a.p.capacity, a.p.n_kv_heads, BN) &&
                 tmap_kv(&mv, a.p.v, D, a.p.capacity, a.p.n_kv_heads, BN)))
        return ws_launch<D, BN, NST, 0, PP>(s, a); /* no tensor maps here: the cp.async producer */
    int dev = 0;
    cudaGetDevice(&dev);
    if (!(attr_done >> (dev & 31) & 1u)) {
        KS_CU(cudaFuncSetAttribute(wg_ws_kernel<D, BN, NST, TMA, PP>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem),
              "attention (wgmma, warp-specialised) shared memory");
        attr_done |= 1u << (dev & 31);
    }
    long long rows = (long long)a.p.n * (a.p.n_heads / a.p.n_kv_heads);
    if ((rows + 127) / 128 > 65535)
        return ks_errorf(KS_ERR_UNSUPPORTED, "attention (wgmma): %d query rows is too many", a.p.n);
    a.n_qblocks = (int)((rows + 127) / 128);
    dim3 grid(a.p.n_kv_heads, a.n_qblocks);
    wg_ws_kernel<D, BN, NST, TMA, PP><<<grid, 384, smem, s>>>(a, mk, mv);
    KS_CU_LAUNCH("attention (wgmma warp-specialised prefill) kernel");
    return KS_OK;
}

/* Checks and launch arguments; the tile bounds go to ws (the flash kernel's, shared) */
static ks_status wg_prepare(cudaStream_t s, const ks_cuda_attn_params *p, void *ws, wg_args *a) {
    if (!ks_cuda_attn_prefill_wgmma_supported(p))
        return ks_errorf(KS_ERR_UNSUPPORTED, "attention (wgmma): does not take head_dim %d%s%s", p->head_dim,
                         p->idx ? " with index lists" : "", p->k_f32 ? " with float32 keys" : "");
    if ((uintptr_t)p->q % 16 || (uintptr_t)p->out % 8)
        return ks_errorf(KS_ERR_ARG, "attention (wgmma): misaligned buffers");
    if (!ws) return ks_errorf(KS_ERR_ARG, "attention (wgmma): no workspace");
    a->p = *p;
    a->max_tiles = KS_MAX(1, (p->max_nk + WG_BOUNDS_TILE - 1) / WG_BOUNDS_TILE);
    a->bounds = (const int2 *)ws;
    a->scale_log2 = p->scale * 1.4426950408889634f;
    a->n_qblocks = 0;
    return ks_cuda_attn_tile_bounds(s, p, a->max_tiles, ws);
}

/* The shipped kernel (variant 10): warp-specialised, a TMA producer, 128-key tiles, 3 slots */
extern "C" ks_status ks_cuda_attn_prefill_wgmma(cudaStream_t s, const ks_cuda_attn_params *p, void *ws) {
    if (p->n <= 0 && ks_cuda_attn_prefill_wgmma_supported(p)) return KS_OK;
    wg_args a;
    ks_status st = wg_prepare(s, p, ws, &a);
    if (st) return st;
    return p->head_dim == 128 ? ws_launch<128, 128, 3, 1>(s, a) : ws_launch<64, 128, 3, 1>(s, a);
}

#ifdef KS_KERNEL_DEV
extern "C" ks_status ks_cuda_attn_prefill_wgmma_variant(cudaStream_t s, const ks_cuda_attn_params *p, void *ws, int variant) {
    if (!KS_WGMMA_LIVE(variant)) return ks_errorf(KS_ERR_ARG, "attention (wgmma): no variant %d", variant);
    if (p->n <= 0 && ks_cuda_attn_prefill_wgmma_supported(p)) return KS_OK;
    wg_args a;
    ks_status st = wg_prepare(s, p, ws, &a);
    if (st) return st;
    if (variant == 8) return p->head_dim == 128 ? ws_launch<128, 64, 5, 0>(s, a) : ws_launch<64, 64, 5, 0>(s, a);
    if (variant == 9) return p->head_dim == 128 ? ws_launch<128, 128, 3, 0>(s, a) : ws_launch<64, 128, 3, 0>(s, a);
    if (variant == 10) return p->head_dim == 128 ? ws_launch<128, 128, 3, 1>(s, a) : ws_launch<64, 128, 3, 1>(s, a);
    if (variant == 12) return p->head_dim == 128 ? ws_launch<128, 128, 3, 1, 1>(s, a) : ws_launch<64, 128, 3, 1, 1>(s, a);
    if (variant == 11) return p->head_dim == 128 ? ws_launch<128, 64, 5, 1>(s, a) : ws_launch<64, 64, 5, 1>(s, a);
    if (variant == 4) return p->head_dim == 128 ? wg_launch<128, 64, 2, 1, 1>(s, a) : wg_launch<64, 64, 2, 1, 1>(s, a);
    if (variant == 3) return p->head_dim == 128 ? wg_launch<128, 64, 2, 1, 0>(s, a) : wg_launch<64, 64, 2, 1, 0>(s, a);
    if (variant == 2) return p->head_dim == 128 ? wg_launch<128, 64, 2, 0, 0>(s, a) : wg_launch<64, 64, 2, 0, 0>(s, a);
    return p->head_dim == 128 ? wg_launch<128, 128, 1, 0, 0>(s, a) : wg_launch<64, 128, 1, 0, 0>(s, a);
}
#endif
