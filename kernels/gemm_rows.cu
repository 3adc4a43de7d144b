/* gemm_rows.cu — see gemm_rows.cuh.
 *
 * Layout. A block is 8 warps and owns a tile of 256 output rows (the segments concatenated) over
 * one K range (its split). A warp owns 32 rows as two m16 tiles.
 *
 * Fragments without a shared-memory tile of W. mma m16n8k16 takes A (16 x 16) as four 32-bit
 * registers per lane (g = lane / 4, t = lane % 4): rows g and g + 8, k columns {2t, 2t+1} and
 * {2t+8, 2t+9}; B (16 x 8) as two: k {2t, 2t+1} and {2t+8, 2t+9} of column g. The dot products do
 * not care which physical k each logical k is, as long as A and B agree, so over 32 columns of K a
 * lane takes the 8 contiguous columns [8t, 8t+8) of its two weight rows (two 16-byte loads) and of
 * its x row g (one 16-byte shared load): physical columns 8t+0..3 feed the first mma (logical 2t,
 * 2t+1, 2t+8, 2t+9), 8t+4..7 the second.
 *
 * x is staged once per block and K sub-range in shared memory, rounded to bf16 (zeros past n and
 * past in), rows 64 mod 128 bytes apart so that the two rows a quarter-warp reads hit different
 * banks: a B fragment is one 16-byte shared load. The weights go straight from memory into
 * registers (ld.global.cs, streamed once), two stages of U steps, the next stage's loads issued
 * before each barrier so that they stay in flight across it. One block a multiprocessor.
 * Measured against the paths it replaced (bench/NOTES.md): x read per fragment from global memory
 * (1.3-2x slower at 16 and 64 rows), the weights through a cp.async ring in shared memory (3 or 5
 * stages: slower than the two register stages here).
 *
 * Split K. With s > 1 the s blocks of a cluster share a tile: each writes its partial sums to its
 * shared memory (over x, after a barrier), and after a cluster barrier block r adds, for
 * every s-th output, the s partials in rank order through distributed shared memory, adds the
 * bias and stores. */
#include "common.cuh"
#include "gemm_rows.cuh"
#include "mma.cuh"

#include <cooperative_groups.h>
#include <string.h>

namespace cg = cooperative_groups;

#define GR_WARPS 8
#define GR_TILE (GR_WARPS * 32) /* output rows of a block */
#define GR_MAX_SPLIT 8          /* portable cluster size */
#define GR_U 4                  /* 32-column steps a stage (two stages of registers) */
#define GR_XS_BYTES (160 * 1024) /* shared memory for x (after the K loop: the partials) */

struct gr_p {
    const float *x;
    int n, in, nseg;
    const bf16 *W[3];
    const float *bias[3];
    float *y[3];
    int off[4];           /* prefix sums of the segments' rows */
    int steps, steps_per; /* 32-column steps of K, and per split */
    int xsteps, xsb;      /* steps of x staged at a time (a multiple of GR_U), row stride in bytes */
};

/* Tile row rt of tile `tile`: its segment and row there, or -1 (past the end) */
static __device__ __forceinline__ int gr_row(const gr_p &p, int tile, int rt, int *seg) {
    int R = tile * GR_TILE + rt;
#pragma unroll
    for (int i = 0; i < 3; i++)
        if (i < p.nseg && R < p.off[i + 1]) { *seg = i; return R - p.off[i]; }
    *seg = 0;
    return -1;
}

/* output (segment, row r, x row c) = v + bias */
static __device__ __forceinline__ void gr_store(const gr_p &p, int seg, int r, int c, float v) {
    if (p.bias[seg]) v += p.bias[seg][r];
    p.y[seg][(size_t)c * (p.off[seg + 1] - p.off[seg]) + r] = v;
}

/* 8 consecutive values of x row `row` from column col as bf16 pairs (zeros when !ok) */
static __device__ __forceinline__ uint4 gr_xfrag(const gr_p &p, int row, int col, bool ok) {
    if (!ok) return make_uint4(0, 0, 0, 0);
    const float4 *q = reinterpret_cast<const float4 *>(p.x + (size_t)row * p.in + col);
    float4 a = __ldg(q), b = __ldg(q + 1);
    return make_uint4(pack_bf16(a.x, a.y), pack_bf16(a.z, a.w), pack_bf16(b.x, b.y), pack_bf16(b.z, b.w));
}

static __device__ __forceinline__ uint4 gr_wload(const bf16 *w, int col, bool ok) {
    if (!ok || !w) return make_uint4(0, 0, 0, 0);
    return __ldcs(reinterpret_cast<const uint4 *>(w + col));
}

/* NT tiles of 8 x rows (n <= 8 NT) */
template <int NT> __global__ void __launch_bounds__(GR_WARPS * 32, 1) gemm_rows_k(const __grid_constant__ gr_p p) {
    constexpr int U = GR_U;
    extern __shared__ __align__(16) unsigned char gr_smem[];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int tile = blockIdx.x, split = blockIdx.y, nsplit = gridDim.y;
    const bf16 *wr[2][2]; /* [m16 tile][row g, g + 8] */
#pragma unroll
    for (int m = 0; m < 2; m++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            int seg, r = gr_row(p, tile, warp * 32 + m * 16 + h * 8 + g, &seg);
            wr[m][h] = r >= 0 ? p.W[seg] + (size_t)r * p.in : nullptr;
        }
    const int s0 = split * p.steps_per, s1 = min(p.steps, s0 + p.steps_per);
    float acc[2][NT][4];
#pragma unroll
    for (int m = 0; m < 2; m++)
#pragma unroll
        for (int j = 0; j < NT; j++) acc[m][j][0] = acc[m][j][1] = acc[m][j][2] = acc[m][j][3] = 0.f;
    uint4 wa[2][2][U], wb[2][2][U];
    auto load = [&](uint4 (&w)[2][2][U], int s) {
#pragma unroll
        for (int u = 0; u < U; u++) {
            int col = (s + u) * 32 + 8 * t;
            bool ok = s + u < s1 && col < p.in;
#pragma unroll
            for (int m = 0; m < 2; m++)
#pragma unroll
                for (int h = 0; h < 2; h++) w[m][h][u] = gr_wload(wr[m][h], col, ok);
        }
    };
    auto stage_x = [&](int sb) { /* steps [sb, sb + xsteps) of x into shared memory */
        __syncthreads(); /* every warp is done with the previous sub-range */
        const int c8n = p.xsteps * 4, c0 = sb * 32, cend = min(p.in, s1 * 32);
        for (int i = threadIdx.x; i < NT * 8 * c8n; i += blockDim.x) {
            int r = i / c8n, c = c0 + (i % c8n) * 8;
            *reinterpret_cast<uint4 *>(gr_smem + (size_t)r * p.xsb + (i % c8n) * 16) = gr_xfrag(p, r, c, r < p.n && c < cend);
        }
        __syncthreads();
    };
    auto compute = [&](const uint4 (&w)[2][2][U], int s) {
        const int sub = s0 + (s - s0) / p.xsteps * p.xsteps; /* first step of the staged sub-range */
#pragma unroll
        for (int u = 0; u < U; u++) {
            if (s + u >= s1) break;
            const unsigned char *xr = gr_smem + (size_t)g * p.xsb + ((s + u - sub) * 32 + 8 * t) * 2;
#pragma unroll
            for (int j = 0; j < NT; j++) {
                uint4 xv = *reinterpret_cast<const uint4 *>(xr + (size_t)j * 8 * p.xsb);
#pragma unroll
                for (int m = 0; m < 2; m++) {
                    uint32_t a0[4] = {w[m][0][u].x, w[m][1][u].x, w[m][0][u].y, w[m][1][u].y};
                    uint32_t a1[4] = {w[m][0][u].z, w[m][1][u].z, w[m][0][u].w, w[m][1][u].w};
                    mma16816(acc[m][j], a0, xv.x, xv.y);
                    mma16816(acc[m][j], a1, xv.z, xv.w);
                }
            }
        }
    };
    load(wa, s0);
    for (int s = s0; s < s1; s += 2 * U) { /* xsteps is a multiple of U: sub-ranges start on a stage */
        if ((s - s0) % p.xsteps == 0) stage_x(s);
        load(wb, s + U);
        compute(wa, s);
        if (s + U < s1 && (s + U - s0) % p.xsteps == 0) stage_x(s + U);
        load(wa, s + 2 * U);
        compute(wb, s + U);
    }

    if (nsplit == 1) { /* c0, c1: row g, x rows 2t, 2t+1; c2, c3: row g + 8 */
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int c = j * 8 + 2 * t + (e & 1);
                if (c >= p.n) continue;
#pragma unroll
                for (int m = 0; m < 2; m++) {
                    int seg, r = gr_row(p, tile, warp * 32 + m * 16 + (e >> 1) * 8 + g, &seg);
                    if (r >= 0) gr_store(p, seg, r, c, acc[m][j][e]);
                }
            }
        return;
    }
    __syncthreads(); /* the partials go over x */
    float *part = reinterpret_cast<float *>(gr_smem); /* (GR_TILE, NT * 8 + 1) */
    const int ps = NT * 8 + 1;
#pragma unroll
    for (int m = 0; m < 2; m++)
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) part[(warp * 32 + m * 16 + (e >> 1) * 8 + g) * ps + j * 8 + 2 * t + (e & 1)] = acc[m][j][e];
    cg::cluster_group cl = cg::this_cluster();
    cl.sync();
    const int rank = (int)cl.block_rank(), n = p.n;
    for (int e = rank * blockDim.x + threadIdx.x; e < GR_TILE * n; e += nsplit * blockDim.x) {
        int rt = e / n, c = e % n;
        float v = 0.f;
        for (int q = 0; q < nsplit; q++) v += cl.map_shared_rank(part, q)[rt * ps + c]; /* rank order: the same sum on every run */
        int seg, r = gr_row(p, tile, rt, &seg);
        if (r >= 0) gr_store(p, seg, r, c, v);
    }
    cl.sync(); /* no block leaves while another still reads its partials */
}

extern "C" int ks_cuda_gemm_rows_supported(const ks_gemm_rows_args *a, const char **why) {
    const char *w = NULL;
    if (a->n < 1 || a->n > KS_CUDA_GEMM_ROWS_MAX) w = "rows of x outside 1..64";
    else if (a->in < 8 || a->in % 8) w = "in not a positive multiple of 8";
    else if (!a->x || (uintptr_t)a->x % 16) w = "x missing or not 16-byte aligned";
    else if (a->n_seg < 1 || a->n_seg > 3) w = "segments outside 1..3";
    else if (a->splits < 0 || a->splits > GR_MAX_SPLIT) w = "splits outside 0..8";
    for (int i = 0; !w && i < a->n_seg; i++)
        if (!a->W[i] || (uintptr_t)a->W[i] % 16 || a->rows[i] < 1 || !a->y[i]) w = "a segment without aligned weights, rows or output";
    if (why) *why = w;
    return !w;
}

template <int NT> static cudaError_t gr_launch(gr_p &p, dim3 grid, cudaStream_t s) {
    auto k = gemm_rows_k<NT>;
    /* stage the split's whole K range when it fits, else the most steps (a multiple of U) that do */
    int fit = (GR_XS_BYTES - 64) / (NT * 8 * 64) / GR_U * GR_U;
    p.xsteps = KS_MAX(GR_U, KS_MIN(fit, (p.steps_per + GR_U - 1) / GR_U * GR_U));
    p.xsb = (p.xsteps * 64 + 127) / 128 * 128 + 64;
    size_t smem = KS_MAX((size_t)NT * 8 * p.xsb, grid.y > 1 ? (size_t)GR_TILE * (NT * 8 + 1) * sizeof(float) : 0);
    cudaError_t e = cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e) return e;
    return ks_launch_ycluster(k, grid, dim3(GR_WARPS * 32), smem, s, p);
}

extern "C" ks_status ks_cuda_gemm_rows(cudaStream_t s, const ks_gemm_rows_args *a, int n_sm) {
    const char *why;
    if (!ks_cuda_gemm_rows_supported(a, &why)) return ks_errorf(KS_ERR_UNSUPPORTED, "gemm_rows: %s", why);
    gr_p p;
    memset(&p, 0, sizeof p);
    p.x = a->x;
    p.n = a->n;
    p.in = a->in;
    p.nseg = a->n_seg;
    for (int i = 0; i < a->n_seg; i++) {
        p.W[i] = static_cast<const bf16 *>(a->W[i]);
        p.bias[i] = a->bias[i];
        p.y[i] = a->y[i];
        p.off[i + 1] = p.off[i] + a->rows[i];
    }
    int tiles = (p.off[a->n_seg] + GR_TILE - 1) / GR_TILE;
    p.steps = (a->in + 31) / 32;
    /* split K until the grid covers the blocks resident at once (one a multiprocessor), at most 8
     * (one cluster), each split a whole number of stage pairs where the K range allows */
    int sp = a->splits ? a->splits : KS_MAX(1, KS_MIN(GR_MAX_SPLIT, KS_MAX(n_sm, 1) / tiles));
    sp = KS_MIN(sp, p.steps);
    int per = (p.steps + sp - 1) / sp;
    if (!a->splits) per = KS_MIN(p.steps, (per + 2 * GR_U - 1) / (2 * GR_U) * (2 * GR_U));
    p.steps_per = per;
    dim3 grid(tiles, (p.steps + per - 1) / per);
    int nt = (p.n + 7) / 8;
    cudaError_t e = nt <= 1 ? gr_launch<1>(p, grid, s) : nt <= 2 ? gr_launch<2>(p, grid, s)
                  : nt <= 4 ? gr_launch<4>(p, grid, s) : gr_launch<8>(p, grid, s);
    KS_CU(e, "gemm_rows kernel launch");
    KS_CU_LAUNCH("gemm_rows kernel");
    return KS_OK;
}
