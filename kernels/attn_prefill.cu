/* attn_prefill.cu — see attn_prefill.cuh. Flash attention (FA2 style) on mma.sync m16n8k16.
 *
 * Block: 4 warps, 128 query rows of one query head (32 rows per warp, two m16 tiles), K/V tiles
 * of 64 keys of its KV head streamed through shared memory with cp.async, double buffered. Per tile:
 * S = Q K^T (bf16 in, float32 accumulators), mask by position ids where the tile is not
 * fully visible, online softmax in the log2 domain, P (bf16, from the S registers) times V
 * into float32 O accumulators. Shared-memory rows are XOR-swizzled in 16-byte chunks so that
 * ldmatrix and cp.async are free of bank conflicts. Tiles that no row of the block can see
 * (all keys after the block's last position, or all before its window) are skipped using
 * per-tile position bounds computed by a small kernel first; positions need not be sorted.
 * Query blocks are launched heaviest (latest positions) first. */
#include "common.cuh"
#include "attn_prefill.cuh"
#include "mma.cuh"
#include "attn_prefill_wgmma.cuh"

#include <limits.h>
#include <math.h>

#define FP_BN 64   /* keys per tile */
static_assert(FP_BN == KS_ATTN_BOUNDS_TILE, "the tile bounds are per 64-key tile");

/* ---------------------------------------------------------------- tile bounds */

__global__ void tile_bounds_kernel(int2 *__restrict__ bounds, const int32_t *__restrict__ kpos,
                                   const int32_t *__restrict__ nk, int n_kv, int capacity, int max_tiles) {
    int e = blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= n_kv * max_tiles) return;
    int kv = e / max_tiles, t = e - kv * max_tiles;
    int j0 = t * KS_ATTN_BOUNDS_TILE, j1 = min(nk[kv], j0 + KS_ATTN_BOUNDS_TILE);
    int lo = INT_MAX, hi = INT_MIN;
    const int32_t *P = kpos ? kpos + (size_t)kv * capacity : nullptr;
    for (int j = j0; j < j1; j++) {
        int v = P ? P[j] : j;
        lo = min(lo, v);
        hi = max(hi, v);
    }
    bounds[e] = make_int2(lo, hi);
}

extern "C" ks_status ks_cuda_attn_tile_bounds(cudaStream_t s, const ks_cuda_attn_params *p, int max_tiles, void *bounds) {
    int total = max_tiles * p->n_kv_heads;
    tile_bounds_kernel<<<ks_cdiv(total, 128), 128, 0, s>>>((int2 *)bounds, p->renumber ? NULL : p->kpos, p->nk,
                                                           p->n_kv_heads, p->capacity, max_tiles);
    KS_CU_LAUNCH("attention tile bounds kernel");
    return KS_OK;
}

/* ---------------------------------------------------------------- the kernel */

struct fp_args {
    ks_cuda_attn_params p;
    const int2 *bounds;
    int max_tiles, n_qblocks;
    float scale_log2; /* scale * log2(e) */
};

/* W warps, each owning MT m16 tiles (16 * MT query rows) of a block of BM = 16 * W * MT rows.
 * v1: W = 8, MT = 1 (every warp reads all of K and V from shared memory for 16 rows);
 * v2: W = 4, MT = 2 (each K/V fragment feeds two MMAs: half the ldmatrix traffic per FLOP,
 * Q fragments reloaded from shared memory per k-step to stay within 255 registers). */
template <int D, int W, int MT, int BN>
__global__ void __launch_bounds__(W * 32, 8 / W) flash_prefill_kernel(const fp_args A) {
    extern __shared__ __align__(128) unsigned char smem[];
    constexpr int BM = 16 * W * MT;  /* query rows per block */
    constexpr int THREADS = W * 32;
    constexpr int NCH = D / 8;       /* 16-byte chunks per row */
    constexpr int KS = D / 16;       /* k16 steps over the head dimension */
    constexpr int DT = D / 8;        /* n8 tiles of the output */
    constexpr int NT = BN / 8;    /* n8 tiles of S */
    constexpr bool QREG = MT == 1;   /* Q fragments held in registers */
    bf16 *sQ = (bf16 *)smem;                                  /* (BM, D) */
    bf16 *sK = sQ + BM * D;                                   /* 2 x (BN, D) */
    bf16 *sV = sK + 2 * BN * D;                            /* 2 x (BN, D) */
    int *sKP = (int *)(sV + 2 * BN * D);                   /* 2 x BN key positions */
    int *sQP = sKP + 2 * BN;                               /* BM query positions */
    int *sRed = sQP + BM;                                     /* 2 x W */

    const ks_cuda_attn_params &p = A.p;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, tig = lane & 3;
    const int h = blockIdx.x, kv = h / (p.n_heads / p.n_kv_heads);
    const int qb = A.n_qblocks - 1 - blockIdx.y; /* heaviest first */
    const int q0 = qb * BM, H = p.n_heads;
    const int nk = p.nk[kv], ntiles = (nk + BN - 1) / BN;
    const bf16 *Kg = (const bf16 *)p.k + (size_t)kv * p.capacity * D;
    const bf16 *Vg = (const bf16 *)p.v + (size_t)kv * p.capacity * D;
    /* key positions: the cache's, or the row index (kpos NULL or renumbered keys) */
    const int32_t *KPg = (p.kpos && !p.renumber) ? p.kpos + (size_t)kv * p.capacity : nullptr;
    const int2 *TB = A.bounds + (size_t)kv * A.max_tiles;

    /* ---- Q: float32 -> bf16, swizzled; query positions and the block's bounds */
    for (int e = tid; e < BM * NCH; e += THREADS) {
        int r = e / NCH, ch = e - r * NCH;
        uint4 v = make_uint4(0, 0, 0, 0);
        if (q0 + r < p.n) {
            const float4 *src = reinterpret_cast<const float4 *>(p.q + ((size_t)(q0 + r) * H + h) * D + ch * 8);
            float4 a = src[0], b = src[1];
            v.x = pack_bf16(a.x, a.y);
            v.y = pack_bf16(a.z, a.w);
            v.z = pack_bf16(b.x, b.y);
            v.w = pack_bf16(b.z, b.w);
        }
        *reinterpret_cast<uint4 *>(sQ + swz<D>(r, ch)) = v;
    }
    int qlo = INT_MAX, qhi = INT_MIN;
    for (int r = tid; r < BM; r += THREADS) {
        int qp = q0 + r >= p.n ? INT_MIN : p.q_renumber ? nk - p.n + q0 + r : p.qpos[q0 + r];
        sQP[r] = qp;
        if (q0 + r < p.n) { qlo = min(qlo, qp); qhi = max(qhi, qp); }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        qlo = min(qlo, __shfl_xor_sync(0xffffffffu, qlo, o));
        qhi = max(qhi, __shfl_xor_sync(0xffffffffu, qhi, o));
    }
    if (lane == 0) { sRed[warp] = qlo; sRed[W + warp] = qhi; }
    __syncthreads();
    int qmin = INT_MAX, qmax = INT_MIN;
#pragma unroll
    for (int w = 0; w < W; w++) { qmin = min(qmin, sRed[w]); qmax = max(qmax, sRed[W + w]); }
    const int window = p.window;
    int qp_r[MT][2]; /* positions of this thread's rows: m-tile mt, rows g and g + 8 */
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
        qp_r[mt][0] = sQP[warp * 16 * MT + mt * 16 + g];
        qp_r[mt][1] = sQP[warp * 16 * MT + mt * 16 + g + 8];
    }

    auto skipped = [&](int t) -> bool {
        int2 b = TB[t * BN / FP_BN]; /* bounds are kept per 64-key tile: a superset for BN = 32 */
        return b.x > qmax || (window > 0 && (long long)qmin - b.y >= window);
    };
    auto next_tile = [&](int t) -> int {
        while (t < ntiles && skipped(t)) t++;
        return t;
    };
    auto load_tile = [&](int t, int buf) {
        bf16 *dk = sK + buf * BN * D, *dv = sV + buf * BN * D;
        for (int e = tid; e < BN * NCH; e += THREADS) {
            int r = e / NCH, ch = e - r * NCH;
            int j = t * BN + r;
            int ok = j < nk;
            size_t off = (size_t)(ok ? j : 0) * D + ch * 8;
            cp_async16(dk + swz<D>(r, ch), Kg + off, ok ? 16 : 0);
            cp_async16(dv + swz<D>(r, ch), Vg + off, ok ? 16 : 0);
        }
        for (int r = tid; r < BN; r += THREADS) {
            int j = t * BN + r;
            if (KPg) cp_async4(sKP + buf * BN + r, KPg + (j < nk ? j : 0), j < nk ? 4 : 0);
            else sKP[buf * BN + r] = j;
        }
    };
    /* A fragment (16 rows x 16 of the head dim) of m-tile mt at k-step ks */
    auto load_q = [&](uint32_t a[4], int mt, int ks) {
        int r = warp * 16 * MT + mt * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
        int ch = ks * 2 + (lane >> 4);
        ldsm_x4(a, sQ + swz<D>(r, ch));
    };

    uint32_t qf[QREG ? KS : 1][4];
    __syncthreads();
    if (QREG) {
#pragma unroll
        for (int ks = 0; ks < KS; ks++) load_q(qf[QREG ? ks : 0], 0, ks);
    }

    float o[MT][DT][4];
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int i = 0; i < DT; i++) o[mt][i][0] = o[mt][i][1] = o[mt][i][2] = o[mt][i][3] = 0.f;
    float m_r[MT][2], l_r[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; mt++) m_r[mt][0] = m_r[mt][1] = -INFINITY, l_r[mt][0] = l_r[mt][1] = 0.f;
    const float sl2 = A.scale_log2;

    int t = next_tile(0);
    if (t < ntiles) load_tile(t, 0);
    cp_async_commit();
    for (int it = 0; t < ntiles; it++) {
        const int buf = it & 1;
        const int tn = next_tile(t + 1);
        if (tn < ntiles) load_tile(tn, buf ^ 1);
        cp_async_commit();
        cp_async_wait<1>();
        __syncthreads();

        const bf16 *cK = sK + buf * BN * D, *cV = sV + buf * BN * D;
        /* S = Q K^T */
        float s[MT][NT][4];
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int j = 0; j < NT; j++) s[mt][j][0] = s[mt][j][1] = s[mt][j][2] = s[mt][j][3] = 0.f;
#pragma unroll
        for (int ks = 0; ks < KS; ks++) {
            uint32_t a[MT][4];
            if (QREG) {
#pragma unroll
                for (int x = 0; x < 4; x++) a[0][x] = qf[QREG ? ks : 0][x];
            } else {
#pragma unroll
                for (int mt = 0; mt < MT; mt++) load_q(a[mt], mt, ks);
            }
#pragma unroll
            for (int jp = 0; jp < NT / 2; jp++) {
                uint32_t b[4];
                int r = jp * 16 + (lane & 7) + (lane >> 4) * 8;
                int ch = ks * 2 + ((lane >> 3) & 1);
                ldsm_x4(b, cK + swz<D>(r, ch));
#pragma unroll
                for (int mt = 0; mt < MT; mt++) {
                    mma16816(s[mt][2 * jp], a[mt], b[0], b[1]);
                    mma16816(s[mt][2 * jp + 1], a[mt], b[2], b[3]);
                }
            }
        }
        /* scale to the log2 domain; mask unless the whole tile is visible to every row */
        int2 tb = TB[t * BN / FP_BN];
        bool full = (t + 1) * BN <= nk && tb.y <= qmin && (window <= 0 || (long long)qmax - tb.x < window);
        if (full) {
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int j = 0; j < NT; j++)
#pragma unroll
                    for (int e = 0; e < 4; e++) s[mt][j][e] *= sl2;
        } else {
            const int *kp = sKP + buf * BN;
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int j = 0; j < NT; j++)
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        int col = j * 8 + tig * 2 + (e & 1);
                        int key = kp[col];
                        int qp = qp_r[mt][e >> 1];
                        bool vis = t * BN + col < nk && key <= qp && (window <= 0 || (long long)qp - key < window);
                        s[mt][j][e] = vis ? s[mt][j][e] * sl2 : -INFINITY;
                    }
        }
        /* online softmax, per row (elements 0,1: row g; 2,3: row g + 8) */
#pragma unroll
        for (int mt = 0; mt < MT; mt++) {
#pragma unroll
            for (int hf = 0; hf < 2; hf++) {
                float mx = -INFINITY;
#pragma unroll
                for (int j = 0; j < NT; j++) mx = fmaxf(mx, fmaxf(s[mt][j][2 * hf], s[mt][j][2 * hf + 1]));
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
                float mn = fmaxf(m_r[mt][hf], mx);
                float base = mn == -INFINITY ? 0.f : mn;
                float c = fast_exp2(m_r[mt][hf] - base); /* -inf -> 0 */
                m_r[mt][hf] = mn;
                float ps = 0.f;
#pragma unroll
                for (int j = 0; j < NT; j++) {
                    s[mt][j][2 * hf] = fast_exp2(s[mt][j][2 * hf] - base);
                    s[mt][j][2 * hf + 1] = fast_exp2(s[mt][j][2 * hf + 1] - base);
                    ps += s[mt][j][2 * hf] + s[mt][j][2 * hf + 1];
                }
                l_r[mt][hf] = l_r[mt][hf] * c + ps;
#pragma unroll
                for (int i = 0; i < DT; i++) {
                    o[mt][i][2 * hf] *= c;
                    o[mt][i][2 * hf + 1] *= c;
                }
            }
        }
        /* O += P V */
#pragma unroll
        for (int kk = 0; kk < BN / 16; kk++) {
            uint32_t a[MT][4];
#pragma unroll
            for (int mt = 0; mt < MT; mt++) {
                a[mt][0] = pack_bf16(s[mt][2 * kk][0], s[mt][2 * kk][1]);
                a[mt][1] = pack_bf16(s[mt][2 * kk][2], s[mt][2 * kk][3]);
                a[mt][2] = pack_bf16(s[mt][2 * kk + 1][0], s[mt][2 * kk + 1][1]);
                a[mt][3] = pack_bf16(s[mt][2 * kk + 1][2], s[mt][2 * kk + 1][3]);
            }
#pragma unroll
            for (int dp = 0; dp < DT / 2; dp++) {
                uint32_t b[4];
                int r = kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
                int ch = dp * 2 + (lane >> 4);
                ldsm_x4_t(b, cV + swz<D>(r, ch));
#pragma unroll
                for (int mt = 0; mt < MT; mt++) {
                    mma16816(o[mt][2 * dp], a[mt], b[0], b[1]);
                    mma16816(o[mt][2 * dp + 1], a[mt], b[2], b[3]);
                }
            }
        }
        __syncthreads();
        t = tn;
    }
    cp_async_wait<0>();

    /* ---- normalise and store */
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int hf = 0; hf < 2; hf++) {
            float l = l_r[mt][hf];
            l += __shfl_xor_sync(0xffffffffu, l, 1);
            l += __shfl_xor_sync(0xffffffffu, l, 2);
            float inv = l > 0.f ? 1.0f / l : 0.f;
            int r = warp * 16 * MT + mt * 16 + g + 8 * hf;
            if (q0 + r < p.n) {
                float *dst = p.out + ((size_t)(q0 + r) * H + h) * D + tig * 2;
#pragma unroll
                for (int i = 0; i < DT; i++)
                    *reinterpret_cast<float2 *>(dst + i * 8) =
                        make_float2(o[mt][i][2 * hf] * inv, o[mt][i][2 * hf + 1] * inv);
            }
        }
}

/* ---------------------------------------------------------------- entry points */

template <int D, int W, int MT, int BN> static size_t fp_smem() {
    return (size_t)16 * W * MT * D * 2 + 4 * (size_t)BN * D * 2 + 2 * BN * 4 + 16 * W * MT * 4 + 2 * W * 4;
}

extern "C" int ks_cuda_attn_prefill_supported(const ks_cuda_attn_params *p) {
    return (p->head_dim == 64 || p->head_dim == 128) && !p->idx && !p->k_f32 && p->n_kv_heads > 0 &&
           p->n_heads % p->n_kv_heads == 0;
}

extern "C" size_t ks_cuda_attn_prefill_workspace(const ks_cuda_attn_params *p) {
    size_t tiles = (size_t)(p->max_nk + FP_BN - 1) / FP_BN;
    return (tiles ? tiles : 1) * p->n_kv_heads * sizeof(int2);
}

template <int D, int W, int MT, int BN> static ks_status fp_launch(cudaStream_t s, fp_args a) {
    static unsigned attr_done = 0; /* bit g: set on GPU g (the attribute is per device function) */
    size_t smem = fp_smem<D, W, MT, BN>();
    int dev = 0;
    cudaGetDevice(&dev);
    if (!(attr_done >> (dev & 31) & 1u)) {
        KS_CU(cudaFuncSetAttribute(flash_prefill_kernel<D, W, MT, BN>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem),
              "attention (flash) shared memory");
        attr_done |= 1u << (dev & 31);
    }
    const int bm = 16 * W * MT;
    a.n_qblocks = (a.p.n + bm - 1) / bm;
    if (a.n_qblocks > 65535) return ks_errorf(KS_ERR_UNSUPPORTED, "attention (flash): %d query rows is too many", a.p.n);
    dim3 grid(a.p.n_heads, a.n_qblocks);
    flash_prefill_kernel<D, W, MT, BN><<<grid, W * 32, smem, s>>>(a);
    KS_CU_LAUNCH("attention (flash prefill) kernel");
    return KS_OK;
}

/* Checks, the launch arguments and the tile bounds (into ws) of the mma.sync kernel */
static ks_status fp_prepare(cudaStream_t s, const ks_cuda_attn_params *p, void *ws, fp_args *a) {
    if (!ks_cuda_attn_prefill_supported(p))
        return ks_errorf(KS_ERR_UNSUPPORTED, "attention: flash prefill does not take head_dim %d%s", p->head_dim,
                         p->idx ? " with index lists" : "");
    if ((uintptr_t)p->q % 16 || (uintptr_t)p->out % 8 || (uintptr_t)p->k % 16 || (uintptr_t)p->v % 16)
        return ks_errorf(KS_ERR_ARG, "attention (flash): misaligned buffers");
    a->p = *p;
    a->max_tiles = KS_MAX(1, (p->max_nk + FP_BN - 1) / FP_BN);
    a->bounds = (const int2 *)ws;
    a->scale_log2 = p->scale * 1.4426950408889634f;
    return ks_cuda_attn_tile_bounds(s, p, a->max_tiles, ws);
}

extern "C" ks_cuda_prefill_kernel ks_cuda_attn_prefill_plan(const ks_cuda_attn_params *p, int sm_major, int mma_only) {
    if (!ks_cuda_attn_prefill_supported(p)) return KS_CUDA_PREFILL_NONE;
    if (sm_major == 9 && !mma_only && ks_cuda_attn_prefill_wgmma_supported(p)) return KS_CUDA_PREFILL_WGMMA;
    return KS_CUDA_PREFILL_MMA;
}

extern "C" ks_status ks_cuda_attn_prefill(cudaStream_t s, const ks_cuda_attn_params *p, void *ws, ks_cuda_prefill_kernel k) {
    if (k == KS_CUDA_PREFILL_WGMMA) return ks_cuda_attn_prefill_wgmma(s, p, ws);
    if (k != KS_CUDA_PREFILL_MMA) return ks_errorf(KS_ERR_UNSUPPORTED, "attention: no prefill kernel planned");
    if (p->n <= 0) return KS_OK;
    fp_args a;
    ks_status st = fp_prepare(s, p, ws, &a);
    if (st) return st;
    return p->head_dim == 128 ? fp_launch<128, 4, 2, 64>(s, a) : fp_launch<64, 4, 2, 64>(s, a);
}

#ifdef KS_KERNEL_DEV
extern "C" ks_status ks_cuda_attn_prefill_mma_variant(cudaStream_t s, const ks_cuda_attn_params *p, void *ws, int variant) {
    if (p->n <= 0) return KS_OK;
    fp_args a;
    ks_status st = fp_prepare(s, p, ws, &a);
    if (st) return st;
    if (variant == 1) return p->head_dim == 128 ? fp_launch<128, 8, 1, 64>(s, a) : fp_launch<64, 8, 1, 64>(s, a);
    if (variant == 3) return p->head_dim == 128 ? fp_launch<128, 4, 2, 32>(s, a) : fp_launch<64, 4, 2, 32>(s, a);
    return p->head_dim == 128 ? fp_launch<128, 4, 2, 64>(s, a) : fp_launch<64, 4, 2, 64>(s, a);
}
#endif
