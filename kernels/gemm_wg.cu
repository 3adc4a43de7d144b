/* gemm_wg.cu — see gemm_wg.cuh (tiles, the K split, the epilogue). Hopper only (sm_90a: wgmma,
 * TMA, clusters). */
#include "common.cuh"
#include "gemm_wg.cuh"
#include "hopper.cuh"

#include <cooperative_groups.h>

#include <stdlib.h>
#include <string.h>

namespace cg = cooperative_groups;

#define GW_M 64                  /* rows of x: the wgmma M */
#define GW_BN 128                /* W rows a tile: the wgmma N */
#define GW_BK 64                 /* k columns a stage: one 128-byte swizzled row */
#define GW_ST 4                  /* stages of the ring */
#define GW_XB (GW_M * GW_BK * 2) /* bytes of a stage's x tile (8 KiB) */
#define GW_WB (GW_BN * GW_BK * 2) /* bytes of a stage's W tile (16 KiB) */
#define GW_SB (GW_XB + GW_WB)
#define GW_SMEM (1024 + GW_ST * GW_SB + 8 * GW_ST) /* alignment slack, the stages, the mbarriers */
#define GW_CTAS_SM 2             /* CTAs a multiprocessor (shared memory: 2 x 97 KiB) */
#define GW_MAX_SPLIT 8           /* CTAs of a tile: a portable cluster */

struct gw_params {
    void *y;
    int n, out, ks, S;
};

static __device__ __forceinline__ float silu_mul(float g, float u) { return __fmul_rn(__fdiv_rn(g, 1.0f + expf(-g)), u); }

/* Fragment of m64n128 (thread tid = 32 w + l): register i holds row 16 w + l / 4 + 8 ((i / 2) % 2),
 * column 8 (i / 4) + 2 (l % 4) + i % 2 of the tile. */
static __device__ __forceinline__ int gw_row(int i, int tid) { return (tid >> 5) * 16 + ((tid & 31) >> 2) + 8 * ((i >> 1) & 1); }
static __device__ __forceinline__ int gw_col(int i, int tid) { return 8 * (i >> 2) + 2 * (tid & 3) + (i & 1); }

/* the epilogue of one output (row r of x, column col of the outputs): the gate's sum g, the up
 * projection's sum u */
static __device__ __forceinline__ void gw_put(const gw_params &p, int r, int col, float g, float u) {
    if (r < p.n && col < p.out) static_cast<bf16 *>(p.y)[(size_t)r * p.out + col] = __float2bfloat16_rn(silu_mul(g, u));
}

/* Grid (tiles, S), clusters of (1, S): CTA (t, r) sums k-steps [r ks / S, (r + 1) ks / S) of tile t
 * (64 gate rows and the same 64 up rows) through the TMA ring; with S > 1 the cluster's partial
 * sums meet in shared memory and CTA r adds, in rank order, the gate's fragment registers
 * [r 32 / S, (r + 1) 32 / S) of all S with the up's 32 further, and stores those outputs. */
__global__ void __launch_bounds__(128, GW_CTAS_SM) gemm_wg_kernel(const gw_params p, const __grid_constant__ CUtensorMap tx,
                                                                  const __grid_constant__ CUtensorMap tw,
                                                                  const __grid_constant__ CUtensorMap tw2) {
    extern __shared__ unsigned char gw_smem[];
    const uint32_t sbase = (uint32_t)__cvta_generic_to_shared(gw_smem);
    const uint32_t base = (sbase + 1023u) & ~1023u;
    const uint32_t bar = base + GW_ST * GW_SB;
    const int tid = threadIdx.x, t = blockIdx.x, r = blockIdx.y;
    const int k0 = (int)((long long)r * p.ks / p.S), k1 = (int)((long long)(r + 1) * p.ks / p.S), nk = k1 - k0;
    /* TMA of k-step k into stage s: 64 gate rows and the same 64 up rows, then x's 64 columns,
     * all on the stage's barrier */
    auto issue = [&](int k, int s) {
        const uint32_t xs = base + s * GW_SB, ws = xs + GW_XB, b = bar + 8 * s;
        mbar_expect_tx(b, GW_SB);
        tma_load2(ws, &tw, k * GW_BK, t * 64, b);
        tma_load2(ws + GW_WB / 2, &tw2, k * GW_BK, t * 64, b);
        tma_load2(xs, &tx, k * GW_BK, 0, b);
    };
    if (tid == 0) {
        asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<uint64_t>(&tw)) : "memory");
        asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<uint64_t>(&tx)) : "memory");
        for (int s = 0; s < GW_ST; s++) mbar_init(bar + 8 * s, 1);
        mbar_init_fence();
        for (int i = 0; i < GW_ST && i < nk; i++) issue(k0 + i, i);
    }
    __syncthreads();
    float d[64];
#pragma unroll
    for (int i = 0; i < 64; i++) d[i] = 0.0f;
    pin(d);
    for (int i = 0; i < nk; i++) {
        const int s = i % GW_ST;
        mbar_wait(bar + 8 * s, (uint32_t)(i / GW_ST) & 1u);
        const uint32_t xs = base + s * GW_SB, ws = xs + GW_XB;
        wg_fence();
#pragma unroll
        for (int kk = 0; kk < GW_BK / 16; kk++)
            wgmma_ss_n128(d, wg_desc(xs + 32 * kk, 16, 1024), wg_desc(ws + 32 * kk, 16, 1024), i != 0 || kk != 0);
        wg_commit();
        wg_wait1(); /* k-step i - 1's MMAs are done: its stage may be refilled */
        __syncthreads();
        if (tid == 0 && i >= 1 && i - 1 + GW_ST < nk) issue(k0 + i - 1 + GW_ST, (i - 1) % GW_ST);
    }
    wg_wait0();
    pin(d);
    const int tc = t * 64; /* the tile's first output: its columns 0..63 are the gate's, 64..127 the up's */
    if (p.S == 1) {
#pragma unroll
        for (int i = 0; i < 64; i++)
            if (i < 32) gw_put(p, gw_row(i, tid), tc + gw_col(i, tid), d[i], d[(i + 32) & 63]);
        return;
    }
    /* the partial sums, fragment-major, over the drained stages: red[i * 128 + tid] */
    float *red = reinterpret_cast<float *>(gw_smem + (base - sbase));
#pragma unroll
    for (int i = 0; i < 64; i++) red[i * 128 + tid] = d[i];
    cg::cluster_group cl = cg::this_cluster();
    cl.sync();
    const int i0 = r * 32 / p.S, i1 = (r + 1) * 32 / p.S; /* the gate's registers; the up's are 32 further */
    for (int i = i0; i < i1; i++) {
        float v = 0.0f, u = 0.0f;
        for (int q = 0; q < p.S; q++) { /* rank order: the same sums on every run */
            const float *rq = cl.map_shared_rank(red, q);
            v += rq[i * 128 + tid];
            u += rq[(i + 32) * 128 + tid];
        }
        gw_put(p, gw_row(i, tid), tc + gw_col(i, tid), v, u);
    }
    cl.sync(); /* no CTA leaves while another reads its shared memory */
}

/* ---------------------------------------------------------------- host */

/* (rows, cols) bf16 row-major as a TMA tensor map with (64, box_rows) boxes, 128-byte swizzle;
 * reads past the edges give zeros */
static int gw_encode(CUtensorMap *m, const void *p, int rows, int cols, int box_rows) {
    PFN_cuTensorMapEncodeTiled_v12000 enc = tmap_encoder();
    if (!enc) return 0;
    cuuint64_t dims[2] = {(cuuint64_t)cols, (cuuint64_t)rows};
    cuuint64_t strides[1] = {(cuuint64_t)cols * 2};
    cuuint32_t box[2] = {GW_BK, (cuuint32_t)box_rows}, es[2] = {1, 1};
    return enc(m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<void *>(p), dims, strides, box, es,
               CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
               CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

/* The maps already encoded, direct-mapped by (address, rows, cols, box rows): a map is a pure
 * function of its key, so an entry is never stale; a collision re-encodes. */
#define GW_CACHE 1024
struct ks_gemm_wg_cache {
    struct { const void *p; int rows, cols, box; } key[GW_CACHE];
    CUtensorMap map[GW_CACHE];
};

extern "C" ks_gemm_wg_cache *ks_cuda_gemm_wg_cache_create(void) {
    return static_cast<ks_gemm_wg_cache *>(calloc(1, sizeof(ks_gemm_wg_cache)));
}
extern "C" void ks_cuda_gemm_wg_cache_free(ks_gemm_wg_cache *c) { free(c); }

static int gw_tmap(ks_gemm_wg_cache *c, CUtensorMap *m, const void *p, int rows, int cols, int box_rows) {
    if (!c) return gw_encode(m, p, rows, cols, box_rows);
    const size_t h = ((uintptr_t)p >> 8 ^ (size_t)rows * 40503u ^ (size_t)cols * 2654435761u ^ (size_t)box_rows) % GW_CACHE;
    if (c->key[h].p != p || c->key[h].rows != rows || c->key[h].cols != cols || c->key[h].box != box_rows) {
        if (!gw_encode(&c->map[h], p, rows, cols, box_rows)) {
            c->key[h].p = NULL;
            return 0;
        }
        c->key[h].p = p;
        c->key[h].rows = rows;
        c->key[h].cols = cols;
        c->key[h].box = box_rows;
    }
    *m = c->map[h];
    return 1;
}

/* clusters of S CTAs resident at once (one wave) on device dev, asked of the driver once per device
 * and S; without an answer, the multiprocessors' CTA slots over S */
static int gw_max_clusters(int S, int dev, int n_sm) {
    static int mc[32][GW_MAX_SPLIT + 1];
    int *m = &mc[dev & 31][S];
    if (!*m) {
        cudaLaunchConfig_t cfg = {};
        cfg.gridDim = dim3(1, S);
        cfg.blockDim = dim3(128);
        cfg.dynamicSmemBytes = GW_SMEM;
        cudaLaunchAttribute at[1];
        at[0].id = cudaLaunchAttributeClusterDimension;
        at[0].val.clusterDim.x = 1;
        at[0].val.clusterDim.y = S;
        at[0].val.clusterDim.z = 1;
        cfg.attrs = at;
        cfg.numAttrs = 1;
        int n = 0;
        if (cudaOccupancyMaxActiveClusters(&n, gemm_wg_kernel, &cfg) != cudaSuccess || n < 1) {
            (void)cudaGetLastError();
            n = KS_MAX(1, GW_CTAS_SM * KS_MAX(n_sm, 1) / S);
        }
        *m = n;
    }
    return *m;
}

/* the kernel's shared-memory attribute, set once per device; *dev: the current device */
static cudaError_t gw_attr(int *dev) {
    static unsigned attr_done = 0; /* bit g: set on GPU g (the attribute is per device and function) */
    cudaError_t e = cudaGetDevice(dev);
    if (!e && !(attr_done >> (*dev & 31) & 1u)) {
        e = cudaFuncSetAttribute(gemm_wg_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, GW_SMEM);
        if (!e) attr_done |= 1u << (*dev & 31);
    }
    return e;
}

/* the K split: the S (<= a cluster, <= the k-steps) with the fewest k-steps a CTA times waves of
 * clusters (a cluster's CTAs share a GPC, so one wave holds fewer of larger clusters); ties go to
 * the smaller S (less to add) */
static int gw_split(int tiles, int ks, int dev, int n_sm) {
    int S = 1;
    long long best = -1;
    for (int s = 1; s <= KS_MIN(GW_MAX_SPLIT, ks); s++) {
        const int mc = gw_max_clusters(s, dev, n_sm);
        const long long cost = (long long)((tiles + mc - 1) / mc) * ((ks + s - 1) / s);
        if (best < 0 || cost < best) {
            best = cost;
            S = s;
        }
    }
    return S;
}

static int gw_tiles(const ks_gemm_wg_args *a) {
    return (a->out + 63) / 64;
}

extern "C" int ks_cuda_gemm_wg_split(const ks_gemm_wg_args *a, int n_sm) {
    int dev = 0;
    if (!ks_cuda_gemm_wg_supported(a, NULL) || gw_attr(&dev)) return 0;
    return gw_split(gw_tiles(a), (a->in + GW_BK - 1) / GW_BK, dev, n_sm);
}

extern "C" int ks_cuda_gemm_wg_supported(const ks_gemm_wg_args *a, const char **why) {
    const char *w = NULL;
    if (!a) w = "no arguments";
    else if (a->n < 1 || a->n > KS_GEMM_WG_ROWS) w = "rows of x outside 1..64";
    else if (a->in < 8 || a->in % 8) w = "in is not a positive multiple of 8";
    else if (a->out < 8 || a->out % 8) w = "out is not a positive multiple of 8";
    else if (!a->x || !a->Wg || !a->Wu || !a->y || (uintptr_t)a->x % 16 || (uintptr_t)a->Wg % 16 ||
             (uintptr_t)a->Wu % 16 || (uintptr_t)a->y % 4)
        w = "a NULL or misaligned buffer";
    else if (gw_tiles(a) > 2147483647 / 2) w = "too many output tiles";
    else if (!tmap_encoder()) w = "the driver has no tensor maps";
    if (why) *why = w;
    return w == NULL;
}

extern "C" ks_status ks_cuda_gemm_wg(cudaStream_t s, const ks_gemm_wg_args *a, ks_gemm_wg_cache *cache, int n_sm) {
    const char *why;
    if (!ks_cuda_gemm_wg_supported(a, &why)) return ks_errorf(KS_ERR_UNSUPPORTED, "gemm_wg: %s", why);
    CUtensorMap mx, mw, mw2;
    memset(&mx, 0, sizeof mx);
    memset(&mw, 0, sizeof mw);
    memset(&mw2, 0, sizeof mw2);
    if (!gw_tmap(cache, &mx, a->x, a->n, a->in, GW_M) || !gw_tmap(cache, &mw, a->Wg, a->out, a->in, 64) ||
        !gw_tmap(cache, &mw2, a->Wu, a->out, a->in, 64))
        return ks_errorf(KS_ERR_UNSUPPORTED, "gemm_wg: the driver refused a tensor map (%d x %d bf16)", a->out, a->in);
    gw_params p;
    p.y = a->y;
    p.n = a->n;
    p.out = a->out;
    p.ks = (a->in + GW_BK - 1) / GW_BK;
    const int tiles = gw_tiles(a);
    int dev = 0;
    KS_CU(gw_attr(&dev), "gemm_wg shared memory");
    p.S = gw_split(tiles, p.ks, dev, n_sm);
    KS_CU(ks_launch_ycluster(gemm_wg_kernel, dim3(tiles, p.S), dim3(128), GW_SMEM, s, p, mx, mw, mw2), "gemm_wg kernel launch");
    KS_CU_LAUNCH("gemm_wg kernel");
    return KS_OK;
}
