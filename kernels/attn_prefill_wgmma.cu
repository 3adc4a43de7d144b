/* attn_prefill_wgmma.cu — see attn_prefill_wgmma.cuh (layouts, descriptors and fragments are
 * documented there). Hopper only: wgmma needs the sm_90a target (kernels/cuda.mk). */
#include "common.cuh"
#include "attn_prefill_wgmma.cuh"
#include "attn_prefill.cuh"
#include "mma.cuh"

#include <limits.h>
#include <stdlib.h>

#define WG_BOUNDS_TILE KS_ATTN_BOUNDS_TILE /* keys per position-bound entry (shared with the flash kernel) */

/* ---------------------------------------------------------------- wgmma PTX wrappers */

static __device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
static __device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
static __device__ __forceinline__ void wg_wait0() { asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory"); }
static __device__ __forceinline__ void proxy_fence() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

/* keep the compiler from moving accesses of accumulator registers across a wgmma batch */
template <int R> static __device__ __forceinline__ void pin(float (&d)[R]) {
#pragma unroll
    for (int i = 0; i < R; i++) asm volatile("" : "+f"(d[i])::"memory");
}

/* SW128 descriptor (see the header): start byte address, LBO and SBO in bytes */
static __device__ __forceinline__ uint64_t wg_desc(uint32_t saddr, uint32_t lbo, uint32_t sbo) {
    return (uint64_t)((saddr & 0x3FFFFu) >> 4) | ((uint64_t)((lbo & 0x3FFFFu) >> 4) << 16) |
           ((uint64_t)((sbo & 0x3FFFFu) >> 4) << 32) | ((uint64_t)1 << 62);
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
/* D(64 x 128) (+)= A(64 x 16, smem, K-major) * B(16 x 128, smem, K-major); scale_d 0 overwrites D */
static __device__ __forceinline__ void wgmma_ss_n128(float (&d)[64], uint64_t da, uint64_t db, int scale_d) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, %64, %65, p, 1, 1, 0, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
                 : "l"(da), "l"(db), "r"(scale_d));
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
    /* row f of the (flattened) order -> query index and query head */
    auto row_q = [&](int f) -> int { return PACK ? f / G : f; };
    auto row_h = [&](int f) -> int { return PACK ? kv * G + (f - (f / G) * G) : (int)blockIdx.x; };
    const int nk = p.nk[kv], ntiles = (nk + BN - 1) / BN;
    const bf16 *Kg = (const bf16 *)p.k + (size_t)kv * p.capacity * D;
    const bf16 *Vg = (const bf16 *)p.v + (size_t)kv * p.capacity * D;
    const int32_t *KPg = (p.kpos && !p.renumber) ? p.kpos + (size_t)kv * p.capacity : nullptr;
    const int2 *TB = A.bounds + (size_t)kv * A.max_tiles;
    const int window = p.window;

    /* ---- Q: float32 -> bf16 into the SW128 layout (rows past n are zeros) */
    for (int e = tid; e < WG_BM * NCH; e += WG_THREADS) {
        int r = e / NCH, c = e - r * NCH;
        uint4 v = make_uint4(0, 0, 0, 0);
        if (q0 + r < nrows) {
            const int f = q0 + r;
            const float4 *src = reinterpret_cast<const float4 *>(p.q + ((size_t)row_q(f) * H + row_h(f)) * D + c * 8);
            float4 a = src[0], b = src[1];
            v.x = pack_bf16(a.x, a.y);
            v.y = pack_bf16(a.z, a.w);
            v.z = pack_bf16(b.x, b.y);
            v.w = pack_bf16(b.z, b.w);
        }
        *reinterpret_cast<uint4 *>(sQ + (c >> 3) * (WG_BM * 128) + r * 128 + (((c & 7) ^ (r & 7)) << 4)) = v;
    }
    /* this thread's two rows (accumulator rows g and g + 8 of its warp) and their positions */
    const int row0 = wg * 64 + wq * 16 + g;
    int qp_r[2];
#pragma unroll
    for (int hf = 0; hf < 2; hf++) {
        int f = q0 + row0 + 8 * hf, i = row_q(f);
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

    /* bounds of a BN-key tile from the 64-key entries */
    auto tile_bounds = [&](int t) -> int2 {
        int2 b = TB[t * BN / WG_BOUNDS_TILE];
        if (BN > WG_BOUNDS_TILE) {
#pragma unroll
            for (int x = 1; x < BN / WG_BOUNDS_TILE; x++) {
                int e = t * BN / WG_BOUNDS_TILE + x;
                if (e < A.max_tiles) {
                    int2 c = TB[e];
                    b.x = min(b.x, c.x);
                    b.y = max(b.y, c.y);
                }
            }
        }
        return b;
    };
    auto skipped = [&](int t) -> bool {
        int2 b = tile_bounds(t);
        return b.x > qmax || (window > 0 && (long long)qmin - b.y >= window);
    };
    auto next_tile = [&](int t) -> int {
        while (t < ntiles && skipped(t)) t++;
        return t;
    };
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

    int t = next_tile(0);
    if (t < ntiles) load_tile(t, 0);
    cp_async_commit();
    for (int it = 0; t < ntiles; it++) {
        const int buf = it & 1;
        int tn;
        if (SB) {
            cp_async_wait<0>(); /* tile t (the only group in flight) */
            proxy_fence();      /* this thread's copies are read by wgmma */
            __syncthreads();    /* also: every warp is done with buffer buf ^ 1 (tile it - 1) */
            tn = next_tile(t + 1);
            if (tn < ntiles) load_tile(tn, buf ^ 1);
            cp_async_commit();
        } else {
            tn = next_tile(t + 1);
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
#pragma unroll
        for (int ks = 0; ks < KS; ks++) {
            uint32_t off = (ks & 3) * 32; /* k16 slice within the 128-byte swizzle row */
            uint64_t da = wg_desc(qbase + (ks >> 2) * (WG_BM * 128) + off, 16, 1024);
            uint64_t db = wg_desc(kbase + (ks >> 2) * (BN * 128) + off, 16, 1024);
            wg_mma<BN>::ss(s, da, db, ks > 0);
        }
        wg_commit();
        wg_wait0();
        pin(s);

        /* ---- scale to the log2 domain; mask unless the whole tile is visible to every row */
        int2 tb = tile_bounds(t);
        bool full = (t + 1) * BN <= nk && tb.y <= qmin && (window <= 0 || (long long)qmax - tb.x < window);
        if (full) {
#pragma unroll
            for (int i = 0; i < SR; i++) s[i] *= sl2;
        } else {
            const int *kp = sKP + buf * BN;
#pragma unroll
            for (int i = 0; i < SR; i++) {
                int col = (i >> 2) * 8 + t4 * 2 + (i & 1);
                int key = kp[col];
                int qp = qp_r[(i >> 1) & 1];
                bool vis = t * BN + col < nk && key <= qp && (window <= 0 || (long long)qp - key < window);
                s[i] = vis ? s[i] * sl2 : -INFINITY;
            }
        }
        /* ---- online softmax per row (hf 0: row g, elements 4i, 4i+1; hf 1: row g+8, 4i+2, 4i+3) */
        float corr[2];
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
#pragma unroll
        for (int i = 0; i < OR; i++) o[i] *= corr[(i >> 1) & 1];

        /* ---- O += P V (P from registers) */
        uint32_t pa[PK][4];
#pragma unroll
        for (int kk = 0; kk < PK; kk++) {
            pa[kk][0] = pack_bf16(s[8 * kk + 0], s[8 * kk + 1]);
            pa[kk][1] = pack_bf16(s[8 * kk + 2], s[8 * kk + 3]);
            pa[kk][2] = pack_bf16(s[8 * kk + 4], s[8 * kk + 5]);
            pa[kk][3] = pack_bf16(s[8 * kk + 6], s[8 * kk + 7]);
        }
        pin(o);
        wg_fence();
#pragma unroll
        for (int kk = 0; kk < PK; kk++) {
            uint64_t db = wg_desc(vbase + kk * 2048, BN * 128, 1024);
            wg_mma<D>::rs(o, pa[kk], db);
        }
        wg_commit();
        wg_wait0();
        pin(o);
        if (!SB) __syncthreads(); /* buffer buf is refilled next iteration */
        t = tn;
    }
    cp_async_wait<0>();

    /* ---- normalise and store */
#pragma unroll
    for (int hf = 0; hf < 2; hf++) {
        float l = l_r[hf];
        l += __shfl_xor_sync(0xffffffffu, l, 1);
        l += __shfl_xor_sync(0xffffffffu, l, 2);
        float inv = l > 0.f ? 1.0f / l : 0.f;
        int f = q0 + row0 + 8 * hf;
        if (f < nrows) {
            float *dst = p.out + ((size_t)row_q(f) * H + row_h(f)) * D + t4 * 2;
#pragma unroll
            for (int c = 0; c < OR / 4; c++)
                *reinterpret_cast<float2 *>(dst + c * 8) = make_float2(o[4 * c + 2 * hf] * inv, o[4 * c + 2 * hf + 1] * inv);
        }
    }
}

/* ---------------------------------------------------------------- entry points */

static int g_enabled = -1; /* -1: not yet read from the environment */

extern "C" int ks_cuda_attn_prefill_wgmma_enabled(void) {
    if (g_enabled < 0) {
        /* on by default, variant 4 (a CTA serves the query heads of one KV head, one barrier per
         * key tile): 392-398 TFLOP/s at 16K-128K causal d=128 on an H200, vs 222-240 for the
         * mma.sync kernel (bench/NOTES.md); KS_CUDA_WGMMA=0 turns it off, =1/2/3 pick those variants */
        const char *e = getenv("KS_CUDA_WGMMA");
        int v = e && *e ? atoi(e) : 4;
        g_enabled = v >= 1 && v <= 4 ? v : 0;
    }
    return g_enabled;
}
extern "C" void ks_cuda_attn_prefill_wgmma_set_enabled(int v) { g_enabled = v >= 1 && v <= 4 ? v : 0; }

extern "C" int ks_cuda_attn_prefill_wgmma_supported(const ks_cuda_attn_params *p) {
    return (p->head_dim == 64 || p->head_dim == 128) && !p->idx && !p->k_f32 && p->n_kv_heads > 0 &&
           p->n_heads % p->n_kv_heads == 0 && (uintptr_t)p->k % 16 == 0 && (uintptr_t)p->v % 16 == 0;
}

extern "C" size_t ks_cuda_attn_prefill_wgmma_workspace(const ks_cuda_attn_params *p) {
    size_t tiles = (size_t)(p->max_nk + WG_BOUNDS_TILE - 1) / WG_BOUNDS_TILE;
    return (tiles ? tiles : 1) * p->n_kv_heads * sizeof(int2);
}

template <int D, int BN, int MINB, int PACK, int SB> static ks_status wg_launch(cudaStream_t s, wg_args a) {
    static int attr_done = 0; /* per process; the attribute is per device function */
    const int smem = wg_smem<D, BN>::TOTAL;
    if (!attr_done) {
        KS_CU(cudaFuncSetAttribute(wg_prefill_kernel<D, BN, MINB, PACK, SB>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem),
              "attention (wgmma) shared memory");
        attr_done = 1;
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

extern "C" ks_status ks_cuda_attn_prefill_wgmma(cudaStream_t s, const ks_cuda_attn_params *p, void *ws, int variant) {
    if (!ks_cuda_attn_prefill_wgmma_supported(p))
        return ks_errorf(KS_ERR_UNSUPPORTED, "attention (wgmma): does not take head_dim %d%s%s", p->head_dim,
                         p->idx ? " with index lists" : "", p->k_f32 ? " with float32 keys" : "");
    if (p->n <= 0) return KS_OK;
    if ((uintptr_t)p->q % 16 || (uintptr_t)p->out % 8)
        return ks_errorf(KS_ERR_ARG, "attention (wgmma): misaligned buffers");
    if (!ws) return ks_errorf(KS_ERR_ARG, "attention (wgmma): no workspace");
    wg_args a;
    a.p = *p;
    a.max_tiles = KS_MAX(1, (p->max_nk + WG_BOUNDS_TILE - 1) / WG_BOUNDS_TILE);
    a.bounds = (const int2 *)ws;
    a.scale_log2 = p->scale * 1.4426950408889634f;
    a.n_qblocks = 0;
    ks_status st = ks_cuda_attn_tile_bounds(s, p, a.max_tiles, ws); /* the flash kernel's, shared */
    if (st) return st;
    if (variant == 4) return p->head_dim == 128 ? wg_launch<128, 64, 2, 1, 1>(s, a) : wg_launch<64, 64, 2, 1, 1>(s, a);
    if (variant == 3) return p->head_dim == 128 ? wg_launch<128, 64, 2, 1, 0>(s, a) : wg_launch<64, 64, 2, 1, 0>(s, a);
    if (variant == 2) return p->head_dim == 128 ? wg_launch<128, 64, 2, 0, 0>(s, a) : wg_launch<64, 64, 2, 0, 0>(s, a);
    return p->head_dim == 128 ? wg_launch<128, 128, 1, 0, 0>(s, a) : wg_launch<64, 128, 1, 0, 0>(s, a);
}
