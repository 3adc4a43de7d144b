/* attn_prefill.cu — see attn_prefill.cuh. Flash attention (FA2 style) on mma.sync m16n8k16.
 *
 * Block: 8 warps, 128 query rows of one query head (16 rows per warp), K/V tiles of 64 keys
 * of its KV head streamed through shared memory with cp.async, double buffered. Per tile:
 * S = Q K^T (bf16 in, float32 accumulators), mask by position ids where the tile is not
 * fully visible, online softmax in the log2 domain, P (bf16, from the S registers) times V
 * into float32 O accumulators. Shared-memory rows are XOR-swizzled in 16-byte chunks so that
 * ldmatrix and cp.async are free of bank conflicts. Tiles that no row of the block can see
 * (all keys after the block's last position, or all before its window) are skipped using
 * per-tile position bounds computed by a small kernel first; positions need not be sorted.
 * Query blocks are launched heaviest (latest positions) first. */
#include "common.cuh"
#include "attn_prefill.cuh"

#include <limits.h>
#include <math.h>

#define FP_BM 128  /* query rows per block */
#define FP_BN 64   /* keys per tile */
#define FP_WARPS 8
#define FP_THREADS (FP_WARPS * 32)

/* ---------------------------------------------------------------- PTX helpers */

static __device__ __forceinline__ unsigned smem_u32(const void *p) { return (unsigned)__cvta_generic_to_shared(p); }

static __device__ __forceinline__ void cp_async16(void *dst, const void *src, int src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(dst)), "l"(src), "r"(src_bytes));
}
static __device__ __forceinline__ void cp_async4(void *dst, const void *src, int src_bytes) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_u32(dst)), "l"(src), "r"(src_bytes));
}
static __device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N> static __device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

static __device__ __forceinline__ void ldsm_x4(uint32_t r[4], const void *p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_u32(p)));
}
static __device__ __forceinline__ void ldsm_x4_t(uint32_t r[4], const void *p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_u32(p)));
}
static __device__ __forceinline__ void mma16816(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
static __device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&v);
}
static __device__ __forceinline__ float fast_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

/* Element offset (in bf16) of 16-byte chunk `ch` of row `r` in a swizzled tile of D columns. */
template <int D> static __device__ __forceinline__ int swz(int r, int ch) { return r * D + ((ch ^ (r & 7)) << 3); }

/* ---------------------------------------------------------------- tile bounds */

/* bounds[kv * max_tiles + t] = (min, max) position of the valid rows of key tile t of head kv;
 * (INT_MAX, INT_MIN) when the tile holds none. */
__global__ void tile_bounds_kernel(int2 *__restrict__ bounds, const int32_t *__restrict__ kpos,
                                   const int32_t *__restrict__ nk, int n_kv, int capacity, int max_tiles) {
    int e = blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= n_kv * max_tiles) return;
    int kv = e / max_tiles, t = e - kv * max_tiles;
    int j0 = t * FP_BN, j1 = min(nk[kv], j0 + FP_BN);
    int lo = INT_MAX, hi = INT_MIN;
    const int32_t *P = kpos ? kpos + (size_t)kv * capacity : nullptr;
    for (int j = j0; j < j1; j++) {
        int v = P ? P[j] : j;
        lo = min(lo, v);
        hi = max(hi, v);
    }
    bounds[e] = make_int2(lo, hi);
}

/* ---------------------------------------------------------------- the kernel */

struct fp_args {
    ks_cuda_attn_params p;
    const int2 *bounds;
    int max_tiles, n_qblocks;
    float scale_log2; /* scale * log2(e) */
};

template <int D>
__global__ void __launch_bounds__(FP_THREADS, 1) flash_prefill_kernel(const fp_args A) {
    extern __shared__ __align__(128) unsigned char smem[];
    constexpr int NCH = D / 8;       /* 16-byte chunks per row */
    constexpr int KS = D / 16;       /* k16 steps over the head dimension */
    constexpr int DT = D / 8;        /* n8 tiles of the output */
    constexpr int NT = FP_BN / 8;    /* n8 tiles of S */
    bf16 *sQ = (bf16 *)smem;                                  /* (BM, D) */
    bf16 *sK = sQ + FP_BM * D;                                /* 2 x (BN, D) */
    bf16 *sV = sK + 2 * FP_BN * D;                            /* 2 x (BN, D) */
    int *sKP = (int *)(sV + 2 * FP_BN * D);                   /* 2 x BN key positions */
    int *sQP = sKP + 2 * FP_BN;                               /* BM query positions */
    int *sRed = sQP + FP_BM;                                  /* 2 x FP_WARPS */

    const ks_cuda_attn_params &p = A.p;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, tig = lane & 3;
    const int h = blockIdx.x, kv = h / (p.n_heads / p.n_kv_heads);
    const int qb = A.n_qblocks - 1 - blockIdx.y; /* heaviest first */
    const int q0 = qb * FP_BM, H = p.n_heads;
    const int nk = p.nk[kv], ntiles = (nk + FP_BN - 1) / FP_BN;
    const bf16 *Kg = (const bf16 *)p.k + (size_t)kv * p.capacity * D;
    const bf16 *Vg = (const bf16 *)p.v + (size_t)kv * p.capacity * D;
    /* key positions: the cache's, or the row index (kpos NULL or renumbered keys) */
    const int32_t *KPg = (p.kpos && !p.renumber) ? p.kpos + (size_t)kv * p.capacity : nullptr;
    const int2 *TB = A.bounds + (size_t)kv * A.max_tiles;

    /* ---- Q: float32 -> bf16, swizzled; query positions and the block's bounds */
    for (int e = tid; e < FP_BM * NCH; e += FP_THREADS) {
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
    if (tid < FP_BM) {
        int qp = q0 + tid >= p.n ? INT_MIN : p.q_renumber ? nk - p.n + q0 + tid : p.qpos[q0 + tid];
        sQP[tid] = qp;
        if (q0 + tid < p.n) { qlo = qp; qhi = qp; }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        qlo = min(qlo, __shfl_xor_sync(0xffffffffu, qlo, o));
        qhi = max(qhi, __shfl_xor_sync(0xffffffffu, qhi, o));
    }
    if (lane == 0) { sRed[warp] = qlo; sRed[FP_WARPS + warp] = qhi; }
    __syncthreads();
    int qmin = INT_MAX, qmax = INT_MIN;
#pragma unroll
    for (int w = 0; w < FP_WARPS; w++) { qmin = min(qmin, sRed[w]); qmax = max(qmax, sRed[FP_WARPS + w]); }
    const int window = p.window;
    const int r_lo = warp * 16 + g, r_hi = r_lo + 8;
    const int qp_lo = sQP[r_lo], qp_hi = sQP[r_hi];

    auto skipped = [&](int t) -> bool {
        int2 b = TB[t];
        return b.x > qmax || (window > 0 && (long long)qmin - b.y >= window);
    };
    auto next_tile = [&](int t) -> int {
        while (t < ntiles && skipped(t)) t++;
        return t;
    };
    auto load_tile = [&](int t, int buf) {
        bf16 *dk = sK + buf * FP_BN * D, *dv = sV + buf * FP_BN * D;
        for (int e = tid; e < FP_BN * NCH; e += FP_THREADS) {
            int r = e / NCH, ch = e - r * NCH;
            int j = t * FP_BN + r;
            int ok = j < nk;
            size_t off = (size_t)(ok ? j : 0) * D + ch * 8;
            cp_async16(dk + swz<D>(r, ch), Kg + off, ok ? 16 : 0);
            cp_async16(dv + swz<D>(r, ch), Vg + off, ok ? 16 : 0);
        }
        if (tid < FP_BN) {
            int j = t * FP_BN + tid;
            if (KPg) cp_async4(sKP + buf * FP_BN + tid, KPg + (j < nk ? j : 0), j < nk ? 4 : 0);
            else sKP[buf * FP_BN + tid] = j;
        }
    };

    /* ---- Q fragments for this warp's 16 rows, kept in registers */
    uint32_t qf[KS][4];
    __syncthreads();
#pragma unroll
    for (int ks = 0; ks < KS; ks++) {
        int r = warp * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
        int ch = ks * 2 + (lane >> 4);
        ldsm_x4(qf[ks], sQ + swz<D>(r, ch));
    }

    float o[DT][4];
#pragma unroll
    for (int i = 0; i < DT; i++) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
    float m_lo = -INFINITY, m_hi = -INFINITY, l_lo = 0.f, l_hi = 0.f;
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

        const bf16 *cK = sK + buf * FP_BN * D, *cV = sV + buf * FP_BN * D;
        /* S = Q K^T */
        float s[NT][4];
#pragma unroll
        for (int j = 0; j < NT; j++) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;
#pragma unroll
        for (int ks = 0; ks < KS; ks++) {
#pragma unroll
            for (int jp = 0; jp < NT / 2; jp++) {
                uint32_t b[4];
                int r = jp * 16 + (lane & 7) + (lane >> 4) * 8;
                int ch = ks * 2 + ((lane >> 3) & 1);
                ldsm_x4(b, cK + swz<D>(r, ch));
                mma16816(s[2 * jp], qf[ks], b[0], b[1]);
                mma16816(s[2 * jp + 1], qf[ks], b[2], b[3]);
            }
        }
        /* scale to the log2 domain; mask unless the whole tile is visible to every row */
        int2 tb = TB[t];
        bool full = (t + 1) * FP_BN <= nk && tb.y <= qmin && (window <= 0 || (long long)qmax - tb.x < window);
        if (full) {
#pragma unroll
            for (int j = 0; j < NT; j++)
#pragma unroll
                for (int e = 0; e < 4; e++) s[j][e] *= sl2;
        } else {
            const int *kp = sKP + buf * FP_BN;
#pragma unroll
            for (int j = 0; j < NT; j++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    int col = j * 8 + tig * 2 + (e & 1);
                    int key = kp[col];
                    int qp = e < 2 ? qp_lo : qp_hi;
                    bool vis = t * FP_BN + col < nk && key <= qp && (window <= 0 || (long long)qp - key < window);
                    s[j][e] = vis ? s[j][e] * sl2 : -INFINITY;
                }
        }
        /* online softmax (rows r_lo: elements 0,1; r_hi: elements 2,3) */
        float mx_lo = -INFINITY, mx_hi = -INFINITY;
#pragma unroll
        for (int j = 0; j < NT; j++) {
            mx_lo = fmaxf(mx_lo, fmaxf(s[j][0], s[j][1]));
            mx_hi = fmaxf(mx_hi, fmaxf(s[j][2], s[j][3]));
        }
        mx_lo = fmaxf(mx_lo, __shfl_xor_sync(0xffffffffu, mx_lo, 1));
        mx_lo = fmaxf(mx_lo, __shfl_xor_sync(0xffffffffu, mx_lo, 2));
        mx_hi = fmaxf(mx_hi, __shfl_xor_sync(0xffffffffu, mx_hi, 1));
        mx_hi = fmaxf(mx_hi, __shfl_xor_sync(0xffffffffu, mx_hi, 2));
        float mn_lo = fmaxf(m_lo, mx_lo), mn_hi = fmaxf(m_hi, mx_hi);
        float base_lo = mn_lo == -INFINITY ? 0.f : mn_lo, base_hi = mn_hi == -INFINITY ? 0.f : mn_hi;
        float c_lo = fast_exp2(m_lo - base_lo), c_hi = fast_exp2(m_hi - base_hi); /* -inf -> 0 */
        m_lo = mn_lo;
        m_hi = mn_hi;
        float ps_lo = 0.f, ps_hi = 0.f;
#pragma unroll
        for (int j = 0; j < NT; j++) {
            s[j][0] = fast_exp2(s[j][0] - base_lo);
            s[j][1] = fast_exp2(s[j][1] - base_lo);
            s[j][2] = fast_exp2(s[j][2] - base_hi);
            s[j][3] = fast_exp2(s[j][3] - base_hi);
            ps_lo += s[j][0] + s[j][1];
            ps_hi += s[j][2] + s[j][3];
        }
        l_lo = l_lo * c_lo + ps_lo;
        l_hi = l_hi * c_hi + ps_hi;
#pragma unroll
        for (int i = 0; i < DT; i++) {
            o[i][0] *= c_lo;
            o[i][1] *= c_lo;
            o[i][2] *= c_hi;
            o[i][3] *= c_hi;
        }
        /* O += P V */
#pragma unroll
        for (int kk = 0; kk < FP_BN / 16; kk++) {
            uint32_t a[4];
            a[0] = pack_bf16(s[2 * kk][0], s[2 * kk][1]);
            a[1] = pack_bf16(s[2 * kk][2], s[2 * kk][3]);
            a[2] = pack_bf16(s[2 * kk + 1][0], s[2 * kk + 1][1]);
            a[3] = pack_bf16(s[2 * kk + 1][2], s[2 * kk + 1][3]);
#pragma unroll
            for (int dp = 0; dp < DT / 2; dp++) {
                uint32_t b[4];
                int r = kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
                int ch = dp * 2 + (lane >> 4);
                ldsm_x4_t(b, cV + swz<D>(r, ch));
                mma16816(o[2 * dp], a, b[0], b[1]);
                mma16816(o[2 * dp + 1], a, b[2], b[3]);
            }
        }
        __syncthreads();
        t = tn;
    }
    cp_async_wait<0>();

    /* ---- normalise and store */
    l_lo += __shfl_xor_sync(0xffffffffu, l_lo, 1);
    l_lo += __shfl_xor_sync(0xffffffffu, l_lo, 2);
    l_hi += __shfl_xor_sync(0xffffffffu, l_hi, 1);
    l_hi += __shfl_xor_sync(0xffffffffu, l_hi, 2);
    float inv_lo = l_lo > 0.f ? 1.0f / l_lo : 0.f, inv_hi = l_hi > 0.f ? 1.0f / l_hi : 0.f;
    if (q0 + r_lo < p.n) {
        float *dst = p.out + ((size_t)(q0 + r_lo) * H + h) * D + tig * 2;
#pragma unroll
        for (int i = 0; i < DT; i++)
            *reinterpret_cast<float2 *>(dst + i * 8) = make_float2(o[i][0] * inv_lo, o[i][1] * inv_lo);
    }
    if (q0 + r_hi < p.n) {
        float *dst = p.out + ((size_t)(q0 + r_hi) * H + h) * D + tig * 2;
#pragma unroll
        for (int i = 0; i < DT; i++)
            *reinterpret_cast<float2 *>(dst + i * 8) = make_float2(o[i][2] * inv_hi, o[i][3] * inv_hi);
    }
}

/* ---------------------------------------------------------------- entry points */

template <int D> static size_t fp_smem() {
    return (size_t)FP_BM * D * 2 + 4 * (size_t)FP_BN * D * 2 + 2 * FP_BN * 4 + FP_BM * 4 + 2 * FP_WARPS * 4;
}

extern "C" int ks_cuda_attn_prefill_supported(const ks_cuda_attn_params *p) {
    return (p->head_dim == 64 || p->head_dim == 128) && !p->idx && !p->k_f32 && p->n_kv_heads > 0 &&
           p->n_heads % p->n_kv_heads == 0;
}

extern "C" size_t ks_cuda_attn_prefill_workspace(const ks_cuda_attn_params *p) {
    size_t tiles = (size_t)(p->max_nk + FP_BN - 1) / FP_BN;
    return (tiles ? tiles : 1) * p->n_kv_heads * sizeof(int2);
}

template <int D> static ks_status fp_launch(cudaStream_t s, const fp_args &a) {
    static int attr_done = 0; /* per process; the attribute is per device function */
    size_t smem = fp_smem<D>();
    if (!attr_done) {
        KS_CU(cudaFuncSetAttribute(flash_prefill_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem),
              "attention (flash) shared memory");
        attr_done = 1;
    }
    dim3 grid(a.p.n_heads, a.n_qblocks);
    flash_prefill_kernel<D><<<grid, FP_THREADS, smem, s>>>(a);
    KS_CU_LAUNCH("attention (flash prefill) kernel");
    return KS_OK;
}

extern "C" ks_status ks_cuda_attn_prefill(cudaStream_t s, const ks_cuda_attn_params *p, void *ws) {
    if (!ks_cuda_attn_prefill_supported(p))
        return ks_errorf(KS_ERR_UNSUPPORTED, "attention: flash prefill does not take head_dim %d%s", p->head_dim,
                         p->idx ? " with index lists" : "");
    if (p->n <= 0) return KS_OK;
    if ((uintptr_t)p->q % 16 || (uintptr_t)p->out % 8 || (uintptr_t)p->k % 16 || (uintptr_t)p->v % 16)
        return ks_errorf(KS_ERR_ARG, "attention (flash): misaligned buffers");
    fp_args a;
    a.p = *p;
    a.max_tiles = KS_MAX(1, (p->max_nk + FP_BN - 1) / FP_BN);
    a.n_qblocks = (p->n + FP_BM - 1) / FP_BM;
    a.bounds = (const int2 *)ws;
    a.scale_log2 = p->scale * 1.4426950408889634f;
    if (a.n_qblocks > 65535) return ks_errorf(KS_ERR_UNSUPPORTED, "attention (flash): %d query rows is too many", p->n);
    int total = a.max_tiles * p->n_kv_heads;
    tile_bounds_kernel<<<ks_cdiv(total, 128), 128, 0, s>>>((int2 *)ws, p->renumber ? NULL : p->kpos, p->nk, p->n_kv_heads, p->capacity,
                                                           a.max_tiles);
    KS_CU_LAUNCH("attention tile bounds kernel");
    return p->head_dim == 128 ? fp_launch<128>(s, a) : fp_launch<64>(s, a);
}
