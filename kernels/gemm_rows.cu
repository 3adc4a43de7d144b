/* gemm_rows.cu — see gemm_rows.cuh.
 *
 * Layout. A block is 8 warps and owns a tile of 256 output rows (the concatenated segments; for
 * SWIGLU 128 gate rows and the same 128 up rows) over one K range (its split). A warp owns 32
 * rows as two m16 tiles: for SWIGLU its first tile is 16 gate rows and its second the same 16 up
 * rows, so one thread holds both values of an output and applies SwiGLU from registers.
 *
 * Fragments without shared memory. mma m16n8k16 takes A (16 x 16) as four 32-bit registers
 * per lane (g = lane / 4, t = lane % 4): rows g and g + 8, k columns {2t, 2t+1} and {2t+8, 2t+9};
 * B (16 x 8) as two: k {2t, 2t+1} and {2t+8, 2t+9} of column g. The dot products do not care
 * which physical k each logical k is, as long as A and B agree, so over 32 columns of K a lane
 * reads the 8 contiguous columns [8t, 8t+8) of its two weight rows (two 16-byte loads) and of its
 * x row g (one 16-byte load, or two for float32): physical columns 8t+0..3 feed the first mma
 * (logical 2t, 2t+1, 2t+8, 2t+9), 8t+4..7 the second. The weights go straight from memory to
 * registers (ld.global.cs, streamed once), a stage of U steps of 32 columns in flight while the
 * previous stage is multiplied; x (tiny, read by every warp) comes through L1.
 *
 * Split K. With s > 1 the s blocks of a cluster share a tile: each writes its partial sums to
 * its shared memory, and after a cluster barrier block r adds, for every s-th output, the s
 * partials in rank order through distributed shared memory and applies the epilogue. */
#include "common.cuh"
#include "gemm_rows.cuh"
#include "mma.cuh"

#include <cooperative_groups.h>
#include <string.h>

namespace cg = cooperative_groups;

#define GR_WARPS 8
#define GR_MAX_SPLIT 8 /* portable cluster size */
#define GR_STAGES 3    /* smem ring: stages per lane (two in flight while one is multiplied) */
#define GR_RU 2        /* smem ring: 32-column steps a stage */

/* Output rows of a block: 8 warps of MT m16 tiles */
template <int MT> struct gr_shape {
    static constexpr int WR = 16 * MT, TR = GR_WARPS * WR;
    static constexpr size_t RING = (size_t)GR_WARPS * GR_STAGES * GR_RU * 2 * MT * 32 * 16; /* bytes */
};

struct gr_p {
    const void *x;
    int n, in, nseg, mode;
    const bf16 *W[3];
    const float *bias[3];
    float *y[3];
    int rows[3], off[4]; /* off: prefix sums of rows (plain modes) */
    int steps, steps_per; /* 32-column steps of K, and per split */
    int xsteps, xsb;      /* x in shared memory (impl 4): steps staged at a time, row stride in bytes */
};

/* Tile row rt of tile `tile`: the weight segment and its row, or -1 (past the end). SWIGLU: a
 * warp's first MT/2 m16 tiles are gate rows, its last MT/2 the same up rows. */
template <int MT> static __device__ __forceinline__ int gr_row(const gr_p &p, int tile, int rt, int *seg) {
    using S = gr_shape<MT>;
    if (p.mode == KS_GEMM_ROWS_SWIGLU) {
        int w = rt / S::WR, m = (rt / 16) % MT;
        int r = tile * (S::TR / 2) + w * (S::WR / 2) + (m % (MT / 2)) * 16 + rt % 16;
        *seg = m >= MT / 2;
        return r < p.rows[0] ? r : -1;
    }
    int R = tile * S::TR + rt;
#pragma unroll
    for (int i = 0; i < 3; i++)
        if (i < p.nseg && R < p.off[i + 1]) { *seg = i; return R - p.off[i]; }
    *seg = 0;
    return -1;
}

static __device__ __forceinline__ float gr_silu_mul(float g, float u) { return __fmul_rn(__fdiv_rn(g, 1.0f + expf(-g)), u); }

/* The epilogue of one output: (segment, row r, x row c) += / = v + bias */
static __device__ __forceinline__ void gr_store(const gr_p &p, int seg, int r, int c, float v) {
    float *y = p.y[seg] + (size_t)c * p.rows[seg] + r;
    if (p.bias[seg]) v += p.bias[seg][r];
    *y = p.mode == KS_GEMM_ROWS_ACC ? *y + v : v;
}

/* 8 consecutive values of x row `row` from column col, as bf16 pairs (zeros when !ok) */
template <bool XB> static __device__ __forceinline__ uint4 gr_xfrag(const gr_p &p, int row, int col, bool ok) {
    if (!ok) return make_uint4(0, 0, 0, 0);
    if (XB) return __ldg(reinterpret_cast<const uint4 *>(static_cast<const bf16 *>(p.x) + (size_t)row * p.in + col));
    const float4 *q = reinterpret_cast<const float4 *>(static_cast<const float *>(p.x) + (size_t)row * p.in + col);
    float4 a = __ldg(q), b = __ldg(q + 1);
    return make_uint4(pack_bf16(a.x, a.y), pack_bf16(a.z, a.w), pack_bf16(b.x, b.y), pack_bf16(b.z, b.w));
}

static __device__ __forceinline__ uint4 gr_wload(const bf16 *w, int col, bool ok) {
    if (!ok || !w) return make_uint4(0, 0, 0, 0);
    return __ldcs(reinterpret_cast<const uint4 *>(w + col));
}

/* After the K loop: the tile's outputs from acc (one split), or the cluster's sum of every block's
 * partials (gr_part: TR x (NT * 8 + 1) floats of shared memory, free for it now) */
template <int NT, int MT>
static __device__ __forceinline__ void gr_finish(const gr_p &p, float (&acc)[MT][NT][4], float *gr_part, int tile, int nsplit) {
    using S = gr_shape<MT>;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int swiglu = p.mode == KS_GEMM_ROWS_SWIGLU;
    constexpr int HM = MT / 2; /* SWIGLU: tile m pairs with tile m + HM */
    if (nsplit == 1) {
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int c = j * 8 + 2 * t + (e & 1), hi = e >> 1;
                if (c >= p.n) continue;
#pragma unroll
                for (int m = 0; m < MT; m++) {
                    int seg, r = gr_row<MT>(p, tile, warp * S::WR + m * 16 + hi * 8 + g, &seg);
                    if (r < 0) continue;
                    if (!swiglu) gr_store(p, seg, r, c, acc[m][j][e]);
                    else if (m < HM) p.y[0][(size_t)c * p.rows[0] + r] = gr_silu_mul(acc[m][j][e], acc[m + HM][j][e]);
                }
            }
        return;
    }
    const int ps = NT * 8 + 1; /* partial row stride (floats) */
#pragma unroll
    for (int m = 0; m < MT; m++)
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                gr_part[(warp * S::WR + m * 16 + (e >> 1) * 8 + g) * ps + j * 8 + 2 * t + (e & 1)] = acc[m][j][e];
    cg::cluster_group cl = cg::this_cluster();
    cl.sync();
    const int rank = (int)cl.block_rank(), n = p.n;
    const int outs = swiglu ? S::TR / 2 : S::TR; /* output rows of the tile (x n) */
    for (int e = rank * blockDim.x + threadIdx.x; e < outs * n; e += nsplit * blockDim.x) {
        int hr = e / n, c = e % n;
        /* SWIGLU: half-row hr is gate tile row (warp, m < HM, i), its up row HM m16 tiles later */
        int rt = swiglu ? (hr / (S::WR / 2)) * S::WR + hr % (S::WR / 2) : hr;
        float v = 0.f, u = 0.f;
        for (int q = 0; q < nsplit; q++) { /* rank order: the same sum on every run */
            const float *pq = cl.map_shared_rank(gr_part, q);
            v += pq[rt * ps + c];
            if (swiglu) u += pq[(rt + HM * 16) * ps + c];
        }
        int seg, r = gr_row<MT>(p, tile, rt, &seg);
        if (r < 0) continue;
        if (swiglu) p.y[0][(size_t)c * p.rows[0] + r] = gr_silu_mul(v, u);
        else gr_store(p, seg, r, c, v);
    }
    cl.sync(); /* no block leaves while another still reads its partials */
}

/* NT tiles of 8 x rows (n <= 8 NT), MT m16 tiles of weight rows a warp, x bf16 (XB) or float32.
 * RING: the weights go through a per-lane ring in shared memory with cp.async (each lane copies
 * the 16-byte pieces it will itself read: no barrier), GR_STAGES stages of GR_RU steps; else
 * straight into registers, two stages of U steps. */
template <int NT, int MT, int U, bool XB, bool RING>
__global__ void __launch_bounds__(GR_WARPS * 32, RING && MT == 2 ? 2 : 1) gemm_rows_k(const gr_p p) {
    using S = gr_shape<MT>;
    extern __shared__ __align__(16) unsigned char gr_smem[];
    float *gr_part = reinterpret_cast<float *>(gr_smem); /* (TR, NT * 8 + 1) partial sums, split > 1 only */
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int tile = blockIdx.x, split = blockIdx.y, nsplit = gridDim.y;
    const bf16 *wr[MT][2]; /* [m16 tile][row g, g + 8] */
#pragma unroll
    for (int m = 0; m < MT; m++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            int seg, r = gr_row<MT>(p, tile, warp * S::WR + m * 16 + h * 8 + g, &seg);
            wr[m][h] = r >= 0 ? p.W[seg] + (size_t)r * p.in : nullptr;
        }
    const int s0 = split * p.steps_per, s1 = min(p.steps, s0 + p.steps_per);
    float acc[MT][NT][4];
#pragma unroll
    for (int m = 0; m < MT; m++)
#pragma unroll
        for (int j = 0; j < NT; j++) acc[m][j][0] = acc[m][j][1] = acc[m][j][2] = acc[m][j][3] = 0.f;

    /* one 32-column step: w[m][h] the lane's 8 columns of rows g (h 0) and g + 8 (h 1) of m tile m */
    auto step = [&](const uint4 (&w)[MT][2], int col) {
        bool cok = col < p.in;
#pragma unroll
        for (int j = 0; j < NT; j++) {
            uint4 xv = gr_xfrag<XB>(p, j * 8 + g, col, cok && j * 8 + g < p.n);
#pragma unroll
            for (int m = 0; m < MT; m++) {
                uint32_t a0[4] = {w[m][0].x, w[m][1].x, w[m][0].y, w[m][1].y};
                uint32_t a1[4] = {w[m][0].z, w[m][1].z, w[m][0].w, w[m][1].w};
                mma16816(acc[m][j], a0, xv.x, xv.y);
                mma16816(acc[m][j], a1, xv.z, xv.w);
            }
        }
    };
    if (RING) {
        constexpr int SLOT = GR_RU * 2 * MT * 32; /* uint4 of one stage of one warp */
        uint4 *ring = reinterpret_cast<uint4 *>(gr_smem) + (size_t)warp * GR_STAGES * SLOT;
        auto issue = [&](int st) { /* stage st (steps s0 + st * GR_RU ..) into its slot; always one commit */
            uint4 *slot = ring + (st % GR_STAGES) * SLOT;
#pragma unroll
            for (int u = 0; u < GR_RU; u++) {
                int sx = s0 + st * GR_RU + u, col = sx * 32 + 8 * t;
                bool ok = sx < s1 && col < p.in;
#pragma unroll
                for (int m = 0; m < MT; m++)
#pragma unroll
                    for (int h = 0; h < 2; h++) {
                        bool v = ok && wr[m][h];
                        cp_async16(slot + ((u * MT + m) * 2 + h) * 32 + lane, v ? (const void *)(wr[m][h] + col) : p.W[0],
                                   v ? 16 : 0);
                    }
            }
            cp_async_commit();
        };
        const int nst = (s1 - s0 + GR_RU - 1) / GR_RU;
#pragma unroll
        for (int i = 0; i < GR_STAGES - 1; i++) issue(i);
        for (int st = 0; st < nst; st++) {
            cp_async_wait<GR_STAGES - 2>(); /* this lane's copies of stage st have landed */
            issue(st + GR_STAGES - 1);       /* into the slot stage st - 1 used */
            const uint4 *slot = ring + (st % GR_STAGES) * SLOT;
#pragma unroll
            for (int u = 0; u < GR_RU; u++) {
                int sx = s0 + st * GR_RU + u;
                if (sx >= s1) break;
                uint4 w[MT][2];
#pragma unroll
                for (int m = 0; m < MT; m++)
#pragma unroll
                    for (int h = 0; h < 2; h++) w[m][h] = slot[((u * MT + m) * 2 + h) * 32 + lane];
                step(w, sx * 32 + 8 * t);
            }
        }
        cp_async_wait<0>();
        __syncthreads(); /* the partials below reuse the rings of other warps */
    } else {
        uint4 wa[MT][2][U], wb[MT][2][U];
        auto load = [&](uint4 (&w)[MT][2][U], int s) {
#pragma unroll
            for (int u = 0; u < U; u++) {
                int col = (s + u) * 32 + 8 * t;
                bool ok = s + u < s1 && col < p.in;
#pragma unroll
                for (int m = 0; m < MT; m++)
#pragma unroll
                    for (int h = 0; h < 2; h++) w[m][h][u] = gr_wload(wr[m][h], col, ok);
            }
        };
        auto compute = [&](const uint4 (&w)[MT][2][U], int s) {
#pragma unroll
            for (int u = 0; u < U; u++) {
                if (s + u >= s1) break;
                uint4 wu[MT][2];
#pragma unroll
                for (int m = 0; m < MT; m++) wu[m][0] = w[m][0][u], wu[m][1] = w[m][1][u];
                step(wu, (s + u) * 32 + 8 * t);
            }
        };
        load(wa, s0);
        for (int s = s0; s < s1; s += 2 * U) { /* two stages a trip: one in flight while the other is multiplied */
            load(wb, s + U);
            compute(wa, s);
            load(wa, s + 2 * U);
            compute(wb, s + U);
        }
    }

    gr_finish<NT, MT>(p, acc, gr_part, tile, nsplit);
}

/* impl 4: x in shared memory. The block stages x (rows rounded to bf16, zeros past n and past
 * in) for p.xsteps steps of its K range at a time (one barrier pair a sub-range); the weights go
 * straight into registers, two stages of U steps, the next stage's loads issued before the
 * barrier so they stay in flight across it. B fragments are then one 16-byte shared load
 * (rows p.xsb bytes apart, = 64 mod 128: the two rows of a quarter-warp hit different banks). */
template <int NT, int U> __global__ void __launch_bounds__(GR_WARPS * 32, 1) gemm_rows_xs_k(const gr_p p) {
    constexpr int MT = 2;
    using S = gr_shape<MT>;
    extern __shared__ __align__(16) unsigned char gr_smem[];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int tile = blockIdx.x, split = blockIdx.y, nsplit = gridDim.y;
    const bf16 *wr[MT][2];
#pragma unroll
    for (int m = 0; m < MT; m++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            int seg, r = gr_row<MT>(p, tile, warp * S::WR + m * 16 + h * 8 + g, &seg);
            wr[m][h] = r >= 0 ? p.W[seg] + (size_t)r * p.in : nullptr;
        }
    const int s0 = split * p.steps_per, s1 = min(p.steps, s0 + p.steps_per);
    float acc[MT][NT][4];
#pragma unroll
    for (int m = 0; m < MT; m++)
#pragma unroll
        for (int j = 0; j < NT; j++) acc[m][j][0] = acc[m][j][1] = acc[m][j][2] = acc[m][j][3] = 0.f;
    uint4 wa[MT][2][U], wb[MT][2][U];
    auto load = [&](uint4 (&w)[MT][2][U], int s) {
#pragma unroll
        for (int u = 0; u < U; u++) {
            int col = (s + u) * 32 + 8 * t;
            bool ok = s + u < s1 && col < p.in;
#pragma unroll
            for (int m = 0; m < MT; m++)
#pragma unroll
                for (int h = 0; h < 2; h++) w[m][h][u] = gr_wload(wr[m][h], col, ok);
        }
    };
    auto stage_x = [&](int sb) { /* steps [sb, sb + xsteps) of x into shared memory */
        __syncthreads(); /* every warp is done with the previous sub-range */
        const int c8n = p.xsteps * 4, c0 = sb * 32, cend = min(p.in, s1 * 32);
        for (int i = threadIdx.x; i < NT * 8 * c8n; i += blockDim.x) {
            int r = i / c8n, c = c0 + (i % c8n) * 8;
            uint4 v = gr_xfrag<false>(p, r, c, r < p.n && c < cend);
            *reinterpret_cast<uint4 *>(gr_smem + (size_t)r * p.xsb + (i % c8n) * 16) = v;
        }
        __syncthreads();
    };
    auto compute = [&](const uint4 (&w)[MT][2][U], int s) {
        const int sub = s0 + (s - s0) / p.xsteps * p.xsteps; /* first step of the staged sub-range */
#pragma unroll
        for (int u = 0; u < U; u++) {
            if (s + u >= s1) break;
            const unsigned char *xr = gr_smem + (size_t)g * p.xsb + ((s + u - sub) * 32 + 8 * t) * 2;
#pragma unroll
            for (int j = 0; j < NT; j++) {
                uint4 xv = *reinterpret_cast<const uint4 *>(xr + (size_t)j * 8 * p.xsb);
#pragma unroll
                for (int m = 0; m < MT; m++) {
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
    __syncthreads(); /* the partials reuse the x tile */
    gr_finish<NT, MT>(p, acc, reinterpret_cast<float *>(gr_smem), tile, nsplit);
}

/* impl 5: x in shared memory (as impl 4, sub-ranges of at most GR_XR_X bytes) and the weights
 * through a deep per-lane cp.async ring (GR_XR_STAGES stages of GR_RU steps: more bytes in flight
 * than registers can hold). One block a multiprocessor. */
#define GR_XR_STAGES 5
#define GR_XR_X (48 * 1024)
#define GR_XR_SLOT (GR_RU * 4 * 32) /* uint4 of one stage of one warp */
#define GR_XR_RING ((size_t)GR_WARPS * GR_XR_STAGES * GR_XR_SLOT * 16)
template <int NT> __global__ void __launch_bounds__(GR_WARPS * 32, 1) gemm_rows_xr_k(const __grid_constant__ gr_p p) {
    constexpr int MT = 2;
    using S = gr_shape<MT>;
    extern __shared__ __align__(16) unsigned char gr_smem[];
    unsigned char *xs = gr_smem + GR_XR_RING; /* x after the ring */
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int tile = blockIdx.x, split = blockIdx.y, nsplit = gridDim.y;
    const bf16 *wr[MT][2];
#pragma unroll
    for (int m = 0; m < MT; m++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            int seg, r = gr_row<MT>(p, tile, warp * S::WR + m * 16 + h * 8 + g, &seg);
            wr[m][h] = r >= 0 ? p.W[seg] + (size_t)r * p.in : nullptr;
        }
    const int s0 = split * p.steps_per, s1 = min(p.steps, s0 + p.steps_per);
    float acc[MT][NT][4];
#pragma unroll
    for (int m = 0; m < MT; m++)
#pragma unroll
        for (int j = 0; j < NT; j++) acc[m][j][0] = acc[m][j][1] = acc[m][j][2] = acc[m][j][3] = 0.f;
    uint4 *ring = reinterpret_cast<uint4 *>(gr_smem) + (size_t)warp * GR_XR_STAGES * GR_XR_SLOT;
    auto issue = [&](int st) {
        uint4 *slot = ring + (st % GR_XR_STAGES) * GR_XR_SLOT;
#pragma unroll
        for (int u = 0; u < GR_RU; u++) {
            int sx = s0 + st * GR_RU + u, col = sx * 32 + 8 * t;
            bool ok = sx < s1 && col < p.in;
#pragma unroll
            for (int m = 0; m < MT; m++)
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    bool v = ok && wr[m][h];
                    cp_async16(slot + ((u * MT + m) * 2 + h) * 32 + lane, v ? (const void *)(wr[m][h] + col) : p.W[0], v ? 16 : 0);
                }
        }
        cp_async_commit();
    };
    auto stage_x = [&](int sb) {
        __syncthreads();
        const int c8n = p.xsteps * 4, c0 = sb * 32, cend = min(p.in, s1 * 32);
        for (int i = threadIdx.x; i < NT * 8 * c8n; i += blockDim.x) {
            int r = i / c8n, c = c0 + (i % c8n) * 8;
            *reinterpret_cast<uint4 *>(xs + (size_t)r * p.xsb + (i % c8n) * 16) = gr_xfrag<false>(p, r, c, r < p.n && c < cend);
        }
        __syncthreads();
    };
    const int nst = (s1 - s0 + GR_RU - 1) / GR_RU;
#pragma unroll
    for (int i = 0; i < GR_XR_STAGES - 1; i++) issue(i);
    for (int st = 0; st < nst; st++) {
        const int sb = s0 + st * GR_RU;
        if ((sb - s0) % p.xsteps == 0) stage_x(sb); /* xsteps is a multiple of GR_RU */
        cp_async_wait<GR_XR_STAGES - 2>();
        issue(st + GR_XR_STAGES - 1);
        const uint4 *slot = ring + (st % GR_XR_STAGES) * GR_XR_SLOT;
        const int sub = s0 + (sb - s0) / p.xsteps * p.xsteps;
#pragma unroll
        for (int u = 0; u < GR_RU; u++) {
            int sx = sb + u;
            if (sx >= s1) break;
            uint4 w[MT][2];
#pragma unroll
            for (int m = 0; m < MT; m++)
#pragma unroll
                for (int h = 0; h < 2; h++) w[m][h] = slot[((u * MT + m) * 2 + h) * 32 + lane];
            const unsigned char *xr = xs + (size_t)g * p.xsb + ((sx - sub) * 32 + 8 * t) * 2;
#pragma unroll
            for (int j = 0; j < NT; j++) {
                uint4 xv = *reinterpret_cast<const uint4 *>(xr + (size_t)j * 8 * p.xsb);
#pragma unroll
                for (int m = 0; m < MT; m++) {
                    uint32_t a0[4] = {w[m][0].x, w[m][1].x, w[m][0].y, w[m][1].y};
                    uint32_t a1[4] = {w[m][0].z, w[m][1].z, w[m][0].w, w[m][1].w};
                    mma16816(acc[m][j], a0, xv.x, xv.y);
                    mma16816(acc[m][j], a1, xv.z, xv.w);
                }
            }
        }
    }
    cp_async_wait<0>();
    __syncthreads(); /* the partials reuse the rings */
    gr_finish<NT, MT>(p, acc, reinterpret_cast<float *>(gr_smem), tile, nsplit);
}

template <int NT> static cudaError_t gr_launch_xr(gr_p &p, dim3 grid, cudaStream_t s) {
    auto k = gemm_rows_xr_k<NT>;
    int fit = (GR_XR_X - 64) / (NT * 8 * 64) / GR_RU * GR_RU;
    p.xsteps = KS_MAX(GR_RU, KS_MIN(fit, (p.steps_per + GR_RU - 1) / GR_RU * GR_RU));
    p.xsb = (p.xsteps * 64 + 127) / 128 * 128 + 64;
    size_t smem = GR_XR_RING + (size_t)NT * 8 * p.xsb;
    cudaError_t e = cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e) return e;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = dim3(GR_WARPS * 32);
    cfg.dynamicSmemBytes = smem;
    cfg.stream = s;
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeClusterDimension;
    at[0].val.clusterDim.x = 1;
    at[0].val.clusterDim.y = grid.y;
    at[0].val.clusterDim.z = 1;
    cfg.attrs = at;
    cfg.numAttrs = grid.y > 1 ? 1 : 0;
    return cudaLaunchKernelEx(&cfg, k, p);
}

extern "C" int ks_cuda_gemm_rows_supported(const ks_gemm_rows_args *a, const char **why) {
    const char *w = NULL;
    if (a->n < 1 || a->n > KS_CUDA_GEMM_ROWS_MAX) w = "rows of x outside 1..64";
    else if (a->in < 8 || a->in % 8) w = "in not a positive multiple of 8";
    else if ((uintptr_t)a->x % 16) w = "x not 16-byte aligned";
    else if (a->mode < 0 || a->mode > 2) w = "unknown mode";
    else if (a->n_seg < 1 || a->n_seg > 3 || (a->mode == KS_GEMM_ROWS_SWIGLU && a->n_seg != 2)) w = "bad segment count";
    else if (a->splits < 0 || a->splits > GR_MAX_SPLIT) w = "splits outside 0..8";
    else if (a->impl < 0 || a->impl > 5) w = "impl outside 0..5";
    else if (a->mode == KS_GEMM_ROWS_SWIGLU && (a->rows[0] != a->rows[1] || a->bias[0] || a->bias[1]))
        w = "SwiGLU needs two segments of equal rows and no bias";
    for (int i = 0; !w && i < a->n_seg; i++)
        if (!a->W[i] || (uintptr_t)a->W[i] % 16 || a->rows[i] < 1 || !a->y[i]) w = "a segment without aligned weights, rows or output";
    if (why) *why = w;
    return !w;
}

template <int NT, int MT, bool XB, bool RING> static cudaError_t gr_launch(const gr_p &p, dim3 grid, cudaStream_t s) {
    constexpr int U = NT > 2 ? 2 : 4;
    auto k = gemm_rows_k<NT, MT, U, XB, RING>;
    size_t smem = grid.y > 1 ? (size_t)gr_shape<MT>::TR * (NT * 8 + 1) * sizeof(float) : 0;
    if (RING) smem = KS_MAX(smem, gr_shape<MT>::RING);
    if (smem > 48 * 1024) {
        cudaError_t e = cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        if (e) return e;
    }
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = dim3(GR_WARPS * 32);
    cfg.dynamicSmemBytes = smem;
    cfg.stream = s;
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeClusterDimension;
    at[0].val.clusterDim.x = 1;
    at[0].val.clusterDim.y = grid.y;
    at[0].val.clusterDim.z = 1;
    cfg.attrs = at;
    cfg.numAttrs = grid.y > 1 ? 1 : 0;
    return cudaLaunchKernelEx(&cfg, k, p);
}

#define GR_XS_BYTES (160 * 1024) /* impl 4: shared memory for x (and, after the loop, the partials) */

template <int NT> static cudaError_t gr_launch_xs(gr_p &p, dim3 grid, cudaStream_t s) {
    constexpr int U = 4;
    auto k = gemm_rows_xs_k<NT, U>;
    /* stage the split's whole K range when it fits, else the most steps (a multiple of U) that do */
    int fit = (GR_XS_BYTES - 64) / (NT * 8 * 64) / U * U;
    p.xsteps = KS_MAX(U, KS_MIN(fit, (p.steps_per + U - 1) / U * U));
    p.xsb = (p.xsteps * 64 + 127) / 128 * 128 + 64;
    size_t smem = (size_t)NT * 8 * p.xsb;
    if (grid.y > 1) smem = KS_MAX(smem, (size_t)gr_shape<2>::TR * (NT * 8 + 1) * sizeof(float));
    cudaError_t e = cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e) return e;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = dim3(GR_WARPS * 32);
    cfg.dynamicSmemBytes = smem;
    cfg.stream = s;
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeClusterDimension;
    at[0].val.clusterDim.x = 1;
    at[0].val.clusterDim.y = grid.y;
    at[0].val.clusterDim.z = 1;
    cfg.attrs = at;
    cfg.numAttrs = grid.y > 1 ? 1 : 0;
    return cudaLaunchKernelEx(&cfg, k, p);
}

template <int MT, bool XB, bool RING> static cudaError_t gr_dispatch(const gr_p &p, dim3 grid, cudaStream_t s) {
    int nt = (p.n + 7) / 8;
    if (nt <= 1) return gr_launch<1, MT, XB, RING>(p, grid, s);
    if (nt <= 2) return gr_launch<2, MT, XB, RING>(p, grid, s);
    if (nt <= 4) return gr_launch<4, MT, XB, RING>(p, grid, s);
    return gr_launch<8, MT, XB, RING>(p, grid, s);
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
    p.mode = a->mode;
    for (int i = 0; i < a->n_seg; i++) {
        p.W[i] = static_cast<const bf16 *>(a->W[i]);
        p.bias[i] = a->bias[i];
        p.y[i] = a->y[i];
        p.rows[i] = a->rows[i];
        p.off[i + 1] = p.off[i] + a->rows[i];
    }
    /* impl 1: registers, 32 rows a warp; 2: ring, 32 rows; 3: ring, 64 rows */
    int impl = a->impl ? a->impl : 2, MT = impl == 3 ? 4 : 2, TR = GR_WARPS * 16 * MT;
    if (impl >= 4 && a->x_bf16) return ks_errorf(KS_ERR_UNSUPPORTED, "gemm_rows: impl %d takes float32 x", impl);
    int tiles = a->mode == KS_GEMM_ROWS_SWIGLU ? (a->rows[0] + TR / 2 - 1) / (TR / 2) : (p.off[a->n_seg] + TR - 1) / TR;
    p.steps = (a->in + 31) / 32;
    /* split K until the grid covers about the blocks resident at once (impl 2: two a
     * multiprocessor, ~100-128 registers a thread and 96 KiB of ring; 1 and 3: one), at most 8
     * (one cluster), each split a whole number of stages where the K range allows */
    int U = impl == 4 ? 4 : impl != 1 ? GR_RU : (a->n + 7) / 8 > 2 ? 2 : 4; /* as gr_launch's template choice */
    if (impl == 5) U = GR_RU;
    int slots = KS_MAX(n_sm, 1) * (impl == 2 ? 2 : 1);
    int sp = a->splits ? a->splits : KS_MAX(1, KS_MIN(GR_MAX_SPLIT, slots / tiles));
    sp = KS_MIN(sp, p.steps);
    int per = (p.steps + sp - 1) / sp;
    if (!a->splits) per = KS_MIN(p.steps, (per + 2 * U - 1) / (2 * U) * (2 * U));
    p.steps_per = per;
    sp = (p.steps + per - 1) / per;
    dim3 grid(tiles, sp);
    cudaError_t e;
    if (impl == 1) e = a->x_bf16 ? gr_dispatch<2, true, false>(p, grid, s) : gr_dispatch<2, false, false>(p, grid, s);
    else if (impl == 2) e = a->x_bf16 ? gr_dispatch<2, true, true>(p, grid, s) : gr_dispatch<2, false, true>(p, grid, s);
    else if (impl == 3) e = a->x_bf16 ? gr_dispatch<4, true, true>(p, grid, s) : gr_dispatch<4, false, true>(p, grid, s);
    else if (impl == 5) {
        int nt = (p.n + 7) / 8;
        e = nt <= 1 ? gr_launch_xr<1>(p, grid, s) : nt <= 2 ? gr_launch_xr<2>(p, grid, s) : nt <= 4 ? gr_launch_xr<4>(p, grid, s)
                                                                                          : gr_launch_xr<8>(p, grid, s);
    } else {
        int nt = (p.n + 7) / 8;
        e = nt <= 1 ? gr_launch_xs<1>(p, grid, s) : nt <= 2 ? gr_launch_xs<2>(p, grid, s) : nt <= 4 ? gr_launch_xs<4>(p, grid, s)
                                                                                          : gr_launch_xs<8>(p, grid, s);
    }
    KS_CU(e, "gemm_rows kernel launch");
    KS_CU_LAUNCH("gemm_rows kernel");
    return KS_OK;
}
