/* prim_topk.cu — top-k by radix select (ks_cuda_prims.h).
 *
 * Per row, on the order-preserving 32-bit key (prim_common.cuh): three histogram passes over
 * 11 / 11 / 10-bit digits, most significant first, each counting only the keys that match
 * the digits chosen so far; after each pass one block scans the histogram from the top and
 * fixes the digit holding the k-th largest key (state kept on the device, so nothing waits).
 * That yields the k-th largest key `thr` and `need`, how many keys equal to thr are taken.
 * The digit choice and the scan of the chunk counts run in the last block of the kernel before
 * them (an arrival counter per row), so a call is 6 launches: init, 3 histograms, count, scatter.
 * A stable compaction then writes, in index order, every key > thr and the first `need` keys
 * == thr: exactly the CPU's set (ties to the lower index). KS_TOPK_BY_VALUE sorts the k
 * winners by descending key with a stable radix sort (CUB), so equal values stay in index
 * order. Cost: 4 passes over the row plus O(k log) for the value order.
 *
 * Rows of at most TK1_MAX_N keys (Quest's page bounds: one row of a few thousand pages per KV
 * head) take one launch instead: a block of 1024 threads a row runs the same three passes and
 * the same compaction with its state and histogram in shared memory (the row is re-read from
 * L2 each pass). The two paths choose the same digits and write the same lists. Measured on the
 * H200 (bench/NOTES.md): the multi-launch path took 44.8 / 45.3 us for one row of 32K / 128K keys
 * (launch and drain of 6 kernels, whatever n is), one block 48.4 / 147.9 us (one SM's passes),
 * and Quest's 8 rows of 2K-8K pages gain ~0.7 ms a step; so only short rows take one block.
 *
 * Longer rows, up to TKC_MAX_BLOCKS blocks in all, take one cooperative launch (tk_coop: the
 * same passes and compaction, the blocks of a row meeting at a counter barrier instead of
 * ending a kernel), after one memset; more rows than that take the six kernels. */
#include "prim_common.cuh"

#include <cub/cub.cuh>

#define TK_BINS 2048
#define TK_CHUNK 2048 /* elements per compaction block: 256 threads x 8 */
#define TK_IPT 8

struct tk_state {
    uint32_t prefix, mask;
    int32_t need;
    unsigned arrived; /* blocks of the current launch done with this row (the last one finishes it) */
};

/* state and histograms of every row, zeroed */
__global__ void tk_init(tk_state *st, unsigned *__restrict__ ghist, int rows, int32_t need) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, stride = (int64_t)gridDim.x * blockDim.x;
    if (i < rows) st[i] = tk_state{0u, 0u, need, 0u};
    for (int64_t e = i; e < (int64_t)rows * TK_BINS; e += stride) ghist[e] = 0u;
}

/* Is this block the last of its row's gridDim.x to get here? (after a fence, so the last one
 * sees every other block's global writes) */
static __device__ __forceinline__ bool tk_last_block(tk_state *st, int row) {
    __shared__ bool last;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(&st[row].arrived, 1u) == gridDim.x - 1;
    __syncthreads();
    if (last) __threadfence();
    return last;
}

/* Add to the shared histogram h (nb bins) the keys of row xr (n keys) that match the digits
 * fixed so far (key & mask == prefix), binned by (key >> shift) & (nb - 1): this thread's warp
 * walks the keys start + lane, start + step + lane, ... (start the warp's first index, step all
 * the walkers' threads), eight loads in flight before the first is used. The bound is
 * warp-uniform, so lanes with the same digit merge into one shared-memory atomic (clustered
 * scores hit few bins). */
static __device__ __forceinline__ void tk_count_bins(const float *__restrict__ xr, int64_t n, int64_t start,
                                                     int64_t step, uint32_t prefix, uint32_t mask, int shift, int nb,
                                                     unsigned *h) {
    const int lane = threadIdx.x & 31;
    for (int64_t i0 = start; i0 < n; i0 += 8 * step) {
        float v[8];
#pragma unroll
        for (int u = 0; u < 8; u++) {
            const int64_t i = i0 + u * step + lane;
            v[u] = i < n ? __ldcg(xr + i) : 0.f;
        }
#pragma unroll
        for (int u = 0; u < 8; u++) {
            const int64_t i = i0 + u * step + lane;
            int bin = -1;
            if (i < n) {
                const uint32_t key = f32_key(v[u]);
                if ((key & mask) == prefix) bin = (int)((key >> shift) & (nb - 1));
            }
            const unsigned peers = __match_any_sync(0xffffffffu, bin);
            if (bin >= 0 && lane == __ffs(peers) - 1) atomicAdd(&h[bin], (unsigned)__popc(peers));
        }
    }
}

/* One radix pass: the histogram of the row's keys that match the digits fixed so far; the last
 * block of the row then scans it from the top bin down, fixes the digit where the count reaches
 * `need`, and clears the histogram and the counter for the next pass. 256 threads. */
__global__ void __launch_bounds__(256) tk_hist(const float *__restrict__ x, int64_t n, tk_state *st, int shift,
                                               int bits, unsigned *ghist) {
    typedef cub::BlockScan<unsigned, 256> scan_t;
    __shared__ unsigned h[TK_BINS];
    __shared__ typename scan_t::TempStorage tmp;
    const int row = blockIdx.y, nb = 1 << bits, t = threadIdx.x;
    for (int i = t; i < nb; i += blockDim.x) h[i] = 0;
    __syncthreads();
    const uint32_t prefix = st[row].prefix, mask = st[row].mask;
    const float *xr = x + (int64_t)row * n;
    tk_count_bins(xr, n, (int64_t)blockIdx.x * blockDim.x + (t & ~31), (int64_t)gridDim.x * blockDim.x, prefix, mask,
                  shift, nb, h);
    __syncthreads();
    unsigned *hr = ghist + (int64_t)row * TK_BINS;
    for (int i = t; i < nb; i += blockDim.x)
        if (h[i]) atomicAdd(&hr[i], h[i]);
    if (!tk_last_block(st, row)) return;
    /* thread t holds the reversed bins q = 8t .. 8t + 7 (q = 0 is the top bin) */
    unsigned c[8], v[8];
#pragma unroll
    for (int j = 0; j < 8; j++) {
        int q = t * 8 + j;
        c[j] = q < nb ? __ldcg(&hr[nb - 1 - q]) : 0u;
    }
    scan_t(tmp).InclusiveSum(c, v);
    const int32_t need = st[row].need;
    __syncthreads(); /* every thread has read need */
#pragma unroll
    for (int j = 0; j < 8; j++) {
        int q = t * 8 + j;
        unsigned prev = v[j] - c[j];
        if (q < nb && prev < (unsigned)need && v[j] >= (unsigned)need) {
            uint32_t b = (uint32_t)(nb - 1 - q);
            st[row].prefix = prefix | b << shift;
            st[row].mask = mask | (uint32_t)(nb - 1) << shift;
            st[row].need = need - (int32_t)prev;
        }
        if (q < nb) hr[nb - 1 - q] = 0u;
    }
    if (t == 0) st[row].arrived = 0u;
}

/* Counts of keys > thr and == thr per chunk; the last block of the row turns them into
 * exclusive prefix sums (the chunks' output offsets) and clears the counter. */
__global__ void __launch_bounds__(256) tk_count(const float *__restrict__ x, int64_t n, tk_state *st, int nch,
                                                int2 *cnt) {
    typedef cub::BlockReduce<int, 256> red_t;
    typedef cub::BlockScan<int, 256> scan_t;
    __shared__ union {
        typename red_t::TempStorage red;
        typename scan_t::TempStorage scan;
    } tmp;
    __shared__ int carry_g, carry_e;
    const int row = blockIdx.y, c = blockIdx.x;
    const uint32_t thr = st[row].prefix;
    const float *xr = x + (int64_t)row * n;
    int packed = 0; /* gt in the high 16 bits, eq in the low */
    for (int j = 0; j < TK_IPT; j++) {
        int64_t i = (int64_t)c * TK_CHUNK + j * 256 + threadIdx.x;
        if (i < n) {
            uint32_t u = f32_key(xr[i]);
            packed += (u > thr ? 0x10000 : 0) + (u == thr ? 1 : 0);
        }
    }
    int tot = red_t(tmp.red).Sum(packed);
    int2 *cr = cnt + (int64_t)row * nch;
    if (threadIdx.x == 0) cr[c] = make_int2(tot >> 16, tot & 0xffff);
    if (!tk_last_block(st, row)) return;
    if (threadIdx.x == 0) { carry_g = 0; carry_e = 0; }
    __syncthreads();
    for (int base = 0; base < nch; base += 256) {
        int i = base + threadIdx.x;
        int2 v = i < nch ? __ldcg(&cr[i]) : make_int2(0, 0);
        int g, e, tg, te;
        scan_t(tmp.scan).ExclusiveSum(v.x, g, tg);
        __syncthreads();
        scan_t(tmp.scan).ExclusiveSum(v.y, e, te);
        int cg = carry_g, ce = carry_e;
        if (i < nch) cr[i] = make_int2(g + cg, e + ce);
        __syncthreads();
        if (threadIdx.x == 0) { carry_g = cg + tg; carry_e = ce + te; }
        __syncthreads();
    }
    if (threadIdx.x == 0) st[row].arrived = 0u;
}

/* stable compaction: thread t of chunk c holds elements c*CHUNK + t*IPT .. + IPT (blocked) */
__global__ void tk_scatter(const float *__restrict__ x, int64_t n, int64_t k, const tk_state *__restrict__ st, int nch,
                           const int2 *__restrict__ off, int32_t *__restrict__ out_idx, uint32_t *__restrict__ out_key) {
    typedef cub::BlockScan<int, 256> scan_t;
    __shared__ typename scan_t::TempStorage tmp;
    const int row = blockIdx.y, c = blockIdx.x;
    const uint32_t thr = st[row].prefix;
    const int64_t need = st[row].need;
    const float *xr = x + (int64_t)row * n;
    const int64_t i0 = (int64_t)c * TK_CHUNK + threadIdx.x * TK_IPT;
    uint32_t u[TK_IPT];
    int packed = 0;
#pragma unroll
    for (int j = 0; j < TK_IPT; j++) {
        int64_t i = i0 + j;
        u[j] = i < n ? f32_key(xr[i]) : 0u;
        if (i < n) packed += (u[j] > thr ? 0x10000 : 0) + (u[j] == thr ? 1 : 0);
    }
    int before;
    scan_t(tmp).ExclusiveSum(packed, before);
    int2 o = off[(int64_t)row * nch + c];
    int64_t gt = o.x + (before >> 16), eq = o.y + (before & 0xffff);
    int32_t *oi = out_idx + (int64_t)row * k;
    uint32_t *ok = out_key ? out_key + (int64_t)row * k : nullptr;
#pragma unroll
    for (int j = 0; j < TK_IPT; j++) {
        int64_t i = i0 + j;
        if (i >= n) break;
        bool g = u[j] > thr, e = u[j] == thr;
        if (g || (e && eq < need)) {
            int64_t pos = gt + (eq < need ? eq : need);
            oi[pos] = (int32_t)i;
            if (ok) ok[pos] = ~u[j];
        }
        gt += g;
        eq += e;
    }
}

/* ---------------------------------------------------------------- one cooperative launch */

#define TKC_THREADS 256
#define TKC_MAX_BLOCKS 128 /* rows x blocks a row: every block co-resident (one an SM is enough) */

/* Every block of row blockIdx.y arrives, then waits until all gridDim.x have (phase-th time). */
static __device__ __forceinline__ void tkc_barrier(unsigned *bar, unsigned target) {
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        atomicAdd(bar, 1u);
        while (*(volatile unsigned *)bar < target) __nanosleep(64);
        __threadfence();
    }
    __syncthreads();
}

/* The same selection as the kernels above in one launch: gridDim.x blocks a row, all resident
 * (a cooperative launch), meeting at a counter barrier instead of ending the kernel. Each pass
 * adds the blocks' histograms into its own zeroed global histogram; after the barrier every
 * block reads it and fixes the same digit itself (no last block, no state in memory). Then each
 * block counts > thr / == thr over its contiguous range, meets the others, takes its offsets as
 * the sums of the ranges before it, and compacts its range in chunks of TK_CHUNK (a block scan
 * each). hist (rows, 3, TK_BINS) and bar (rows) are zero on entry; cnt (rows, gridDim.x). */
__global__ void __launch_bounds__(TKC_THREADS) tk_coop(const float *__restrict__ x, int64_t n, int64_t k,
                                                       unsigned *hist, unsigned *bar, int2 *cnt,
                                                       int32_t *__restrict__ out_idx, uint32_t *__restrict__ out_key) {
    typedef cub::BlockScan<unsigned, TKC_THREADS> scan_t;
    typedef cub::BlockReduce<int, TKC_THREADS> red_t;
    __shared__ unsigned h[TK_BINS];
    __shared__ union {
        typename scan_t::TempStorage scan;
        typename red_t::TempStorage red;
    } tmp;
    __shared__ uint32_t s_prefix, s_mask;
    __shared__ unsigned s_need, s_gt, s_eq;
    const int row = blockIdx.y, bx = gridDim.x, b = blockIdx.x, t = threadIdx.x, lane = t & 31;
    const float *xr = x + (int64_t)row * n;
    unsigned *hr = hist + (size_t)row * 3 * TK_BINS, *br = bar + row;
    unsigned phase = 0;
    if (t == 0) { s_prefix = 0u; s_mask = 0u; s_need = k == n ? 0xffffffffu : (unsigned)k; }
    __syncthreads();
    if (k < n) {
        const int shifts[3] = {21, 10, 0}, bits[3] = {11, 11, 10};
#pragma unroll 1
        for (int p = 0; p < 3; p++) {
            const int shift = shifts[p], nb = 1 << bits[p];
            for (int i = t; i < nb; i += TKC_THREADS) h[i] = 0u;
            __syncthreads();
            const uint32_t prefix = s_prefix, mask = s_mask;
            tk_count_bins(xr, n, (int64_t)b * TKC_THREADS + (t - lane), (int64_t)bx * TKC_THREADS, prefix, mask, shift,
                          nb, h);
            __syncthreads();
            unsigned *hp = hr + (size_t)p * TK_BINS;
            for (int i = t; i < nb; i += TKC_THREADS)
                if (h[i]) atomicAdd(&hp[i], h[i]);
            tkc_barrier(br, ++phase * (unsigned)bx);
            /* every block: thread t holds the reversed bins q = 8t .. 8t + 7 (q = 0 the top bin) */
            unsigned c[8], cum[8];
#pragma unroll
            for (int j = 0; j < 8; j++) {
                const int q = t * 8 + j;
                c[j] = q < nb ? __ldcg(&hp[nb - 1 - q]) : 0u;
            }
            scan_t(tmp.scan).InclusiveSum(c, cum);
            const unsigned need = s_need;
            __syncthreads(); /* every thread has read s_need */
#pragma unroll
            for (int j = 0; j < 8; j++) {
                const int q = t * 8 + j;
                const unsigned prev = cum[j] - c[j];
                if (q < nb && prev < need && cum[j] >= need) {
                    s_prefix = prefix | (uint32_t)(nb - 1 - q) << shift;
                    s_mask = mask | (uint32_t)(nb - 1) << shift;
                    s_need = need - prev;
                }
            }
            __syncthreads();
        }
    }
    const uint32_t thr = s_prefix;
    const unsigned need = s_need;
    /* this block's range [b0, b1), whole chunks of TK_CHUNK */
    const int64_t per = ((n + bx - 1) / bx + TK_CHUNK - 1) / TK_CHUNK * TK_CHUNK;
    const int64_t b0 = KS_MIN(n, (int64_t)b * per), b1 = KS_MIN(n, b0 + per);
    int g = 0, e = 0;
    for (int64_t i = b0 + t; i < b1; i += TKC_THREADS) {
        const uint32_t u = f32_key(__ldcg(xr + i));
        g += u > thr;
        e += u == thr;
    }
    const int tg = red_t(tmp.red).Sum(g);
    __syncthreads();
    const int te = red_t(tmp.red).Sum(e);
    int2 *cr = cnt + (size_t)row * bx;
    if (t == 0) cr[b] = make_int2(tg, te);
    tkc_barrier(br, ++phase * (unsigned)bx);
    if (t == 0) {
        unsigned sg = 0, se = 0;
        for (int u = 0; u < b; u++) {
            const int2 v = __ldcg(&cr[u]);
            sg += (unsigned)v.x;
            se += (unsigned)v.y;
        }
        s_gt = sg;
        s_eq = se;
    }
    __syncthreads();
    int32_t *oi = out_idx + (int64_t)row * k;
    uint32_t *ok = out_key ? out_key + (int64_t)row * k : nullptr;
    for (int64_t c0 = b0; c0 < b1; c0 += TK_CHUNK) {
        const int64_t i0 = c0 + (int64_t)t * TK_IPT;
        uint32_t u[TK_IPT];
        unsigned packed = 0; /* > thr in the high 16 bits, == thr in the low (a chunk is 2048) */
#pragma unroll
        for (int j = 0; j < TK_IPT; j++) {
            const int64_t i = i0 + j;
            u[j] = i < b1 ? f32_key(__ldcg(xr + i)) : 0u;
            if (i < b1) packed += (u[j] > thr ? 0x10000u : 0u) + (u[j] == thr ? 1u : 0u);
        }
        unsigned before, total;
        scan_t(tmp.scan).ExclusiveSum(packed, before, total);
        unsigned gt = s_gt + (before >> 16), eq = s_eq + (before & 0xffffu);
        __syncthreads(); /* every thread has read the carries */
        if (t == 0) { s_gt += total >> 16; s_eq += total & 0xffffu; }
#pragma unroll
        for (int j = 0; j < TK_IPT; j++) {
            const int64_t i = i0 + j;
            if (i >= b1) break;
            const bool gg = u[j] > thr, ee = u[j] == thr;
            if (gg || (ee && eq < need)) {
                const unsigned pos = gt + (eq < need ? eq : need);
                oi[pos] = (int32_t)i;
                if (ok) ok[pos] = ~u[j];
            }
            gt += gg;
            eq += ee;
        }
        __syncthreads(); /* the carries are updated before the next chunk reads them */
    }
}

/* ---------------------------------------------------------------- one block a row */

#define TK1_THREADS 1024
#define TK1_IPT 8                             /* compaction: elements a thread per tile */
#define TK1_TILE (TK1_THREADS * TK1_IPT)      /* 8192: tile counts fit 16 bits */
#define TK1_MAX_N 16384 /* one block beats 6 launches below ~32K keys (see the header) */

/* Row blockIdx.x: k-th largest key by three histogram passes (digits 11/11/10 as above), then
 * the stable compaction in tiles of TK1_TILE, each tile's offsets from one block scan. */
__global__ void __launch_bounds__(TK1_THREADS) tk_one(const float *__restrict__ x, int n, int k,
                                                       int32_t *__restrict__ out_idx, uint32_t *__restrict__ out_key) {
    typedef cub::BlockScan<unsigned, TK1_THREADS> scan_t;
    __shared__ unsigned h[TK_BINS];
    __shared__ typename scan_t::TempStorage tmp;
    __shared__ uint32_t s_prefix, s_mask;
    __shared__ int s_need;
    __shared__ unsigned s_gt, s_eq; /* compaction: outputs written before this tile */
    const int t = threadIdx.x, lane = t & 31;
    const float *xr = x + (int64_t)blockIdx.x * n;
    if (t == 0) { s_prefix = 0u; s_mask = 0u; s_need = k == n ? INT32_MAX : k; s_gt = 0u; s_eq = 0u; }
    __syncthreads();
    if (k < n) {
        const int shifts[3] = {21, 10, 0}, bits[3] = {11, 11, 10};
#pragma unroll 1
        for (int p = 0; p < 3; p++) {
            const int shift = shifts[p], nb = 1 << bits[p];
            for (int i = t; i < nb; i += TK1_THREADS) h[i] = 0u;
            __syncthreads();
            const uint32_t prefix = s_prefix, mask = s_mask;
            tk_count_bins(xr, n, t - lane, TK1_THREADS, prefix, mask, shift, nb, h);
            __syncthreads();
            /* thread t holds the reversed bins q = 2t, 2t + 1 (q = 0 is the top bin) */
            unsigned c[2], cum[2];
#pragma unroll
            for (int j = 0; j < 2; j++) {
                const int q = t * 2 + j;
                c[j] = q < nb ? h[nb - 1 - q] : 0u;
            }
            scan_t(tmp).InclusiveSum(c, cum);
            const int need = s_need;
            __syncthreads(); /* every thread has read s_need and the bins */
#pragma unroll
            for (int j = 0; j < 2; j++) {
                const int q = t * 2 + j;
                const unsigned prev = cum[j] - c[j];
                if (q < nb && prev < (unsigned)need && cum[j] >= (unsigned)need) {
                    s_prefix = prefix | (uint32_t)(nb - 1 - q) << shift;
                    s_mask = mask | (uint32_t)(nb - 1) << shift;
                    s_need = need - (int)prev;
                }
            }
            __syncthreads();
        }
    }
    const uint32_t thr = s_prefix;
    const unsigned need = (unsigned)s_need;
    int32_t *oi = out_idx + (int64_t)blockIdx.x * k;
    uint32_t *ok = out_key ? out_key + (int64_t)blockIdx.x * k : nullptr;
    for (int base = 0; base < n; base += TK1_TILE) {
        const int i0 = base + t * TK1_IPT;
        uint32_t u[TK1_IPT];
        unsigned packed = 0; /* > thr in the high 16 bits, == thr in the low */
#pragma unroll
        for (int j = 0; j < TK1_IPT; j++) {
            const int i = i0 + j;
            u[j] = i < n ? f32_key(__ldcg(xr + i)) : 0u;
            if (i < n) packed += (u[j] > thr ? 0x10000u : 0u) + (u[j] == thr ? 1u : 0u);
        }
        unsigned before, tile;
        scan_t(tmp).ExclusiveSum(packed, before, tile);
        unsigned gt = s_gt + (before >> 16), eq = s_eq + (before & 0xffffu);
        __syncthreads(); /* every thread has read the carries */
        if (t == 0) { s_gt += tile >> 16; s_eq += tile & 0xffffu; }
#pragma unroll
        for (int j = 0; j < TK1_IPT; j++) {
            const int i = i0 + j;
            if (i >= n) break;
            const bool g = u[j] > thr, e = u[j] == thr;
            if (g || (e && eq < need)) {
                const unsigned pos = gt + (eq < need ? eq : need);
                oi[pos] = i;
                if (ok) ok[pos] = ~u[j];
            }
            gt += g;
            eq += e;
        }
        __syncthreads(); /* the carries are updated before the next tile reads them; tmp reused */
    }
}

__global__ void tk_values(const float *__restrict__ x, int64_t n, int64_t k, int64_t rows,
                          const int32_t *__restrict__ idx, float *__restrict__ val) {
    int64_t total = rows * k, stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += stride)
        val[e] = x[(e / k) * n + idx[e]];
}

/* Blocks a row for the cooperative kernel: ~one a 2048 keys, at most 64, and rows x blocks at
 * most TKC_MAX_BLOCKS (0: too many rows for one co-resident launch). */
static int tkc_blocks(int64_t rows, int64_t n) {
    if (rows > TKC_MAX_BLOCKS) return 0;
    int64_t b = KS_MIN((n + 2047) / 2048, (int64_t)64);
    return (int)KS_MAX((int64_t)1, KS_MIN(b, (int64_t)TKC_MAX_BLOCKS / rows));
}

extern "C" ks_status ks_cuda_topk(cudaStream_t s, const ks_cuda_scratch *sc, const float *x, int64_t rows, int64_t n,
                                  int64_t k, ks_topk_order order, int32_t *out_idx, float *out_val) {
    P_NONNEG("topk", "rows", rows);
    P_NONNEG("topk", "n", n);
    P_IDX_RANGE("topk", "n", n);
    P_NONNEG("topk", "k", k);
    if (k > n) return ks_errorf(KS_ERR_ARG, "topk: k = %lld > n = %lld", (long long)k, (long long)n);
    if ((unsigned)order > KS_TOPK_BY_INDEX) return ks_errorf(KS_ERR_ARG, "topk: unknown order %d", (int)order);
    int64_t total, ktotal;
    ks_status st;
    if ((st = p_mul_size("topk", rows, n, &total)) || (st = p_mul_size("topk", rows, k, &ktotal))) return st;
    P_PTR("topk", "x", x, total);
    P_PTR("topk", "out_idx", out_idx, ktotal);
    if (ktotal == 0) return KS_OK;
    if (rows > 65535) return ks_errorf(KS_ERR_ARG, "topk: %lld rows is too many for one call (65535)", (long long)rows);

    scratch_set ss(sc);
    uint32_t *keys = NULL, *keys2 = NULL;
    int32_t *idx2 = NULL;
    void *cub_tmp = NULL;
    size_t cub_bytes = 0;
    if (order == KS_TOPK_BY_VALUE && k > 1) {
        P_SCRATCH(keys, ss, sizeof(uint32_t) * ktotal, "topk");
        P_SCRATCH(keys2, ss, sizeof(uint32_t) * k, "topk");
        P_SCRATCH(idx2, ss, sizeof(int32_t) * k, "topk");
        cub::DeviceRadixSort::SortPairs(NULL, cub_bytes, keys, keys2, out_idx, idx2, (int)k, 0, 32, s);
        P_SCRATCH(cub_tmp, ss, cub_bytes, "topk");
    }
    if (n <= TK1_MAX_N) { /* one launch: a block a row */
        tk_one<<<(unsigned)rows, TK1_THREADS, 0, s>>>(x, (int)n, (int)k, out_idx, keys);
        KS_CU_LAUNCH("topk kernel");
    } else if (tkc_blocks(rows, n) > 0) { /* one cooperative launch (and one memset) */
        const int bx = tkc_blocks(rows, n);
        unsigned *hist;
        int2 *cnt;
        const size_t zb = sizeof(unsigned) * ((size_t)rows * 3 * TK_BINS + rows);
        P_SCRATCH(hist, ss, zb, "topk");
        P_SCRATCH(cnt, ss, sizeof(int2) * (size_t)rows * bx, "topk");
        KS_CU(cudaMemsetAsync(hist, 0, zb, s), "topk (clear)");
        cudaLaunchConfig_t cfg = {};
        cfg.gridDim = dim3((unsigned)bx, (unsigned)rows);
        cfg.blockDim = dim3(TKC_THREADS);
        cfg.stream = s;
        cudaLaunchAttribute at[1];
        at[0].id = cudaLaunchAttributeCooperative;
        at[0].val.cooperative = 1;
        cfg.attrs = at;
        cfg.numAttrs = 1;
        KS_CU(cudaLaunchKernelEx(&cfg, tk_coop, x, n, k, hist, hist + (size_t)rows * 3 * TK_BINS, cnt, out_idx, keys),
              "topk kernel");
    } else {
        tk_state *state;
        unsigned *hist;
        int2 *cnt;
        const int nch = (int)((n + TK_CHUNK - 1) / TK_CHUNK);
        P_SCRATCH(state, ss, sizeof(tk_state) * rows, "topk");
        P_SCRATCH(hist, ss, sizeof(unsigned) * TK_BINS * rows, "topk");
        P_SCRATCH(cnt, ss, sizeof(int2) * nch * rows, "topk");
        tk_init<<<ks_grid1d((size_t)rows * TK_BINS, 256), 256, 0, s>>>(state, hist, (int)rows,
                                                                       k == n ? INT32_MAX : (int32_t)k);
        KS_CU_LAUNCH("topk init kernel");
        if (k < n) {
            unsigned bx = (unsigned)KS_MIN((int64_t)((n + 4095) / 4096), (int64_t)KS_MAX(1, 1024 / (int)KS_MIN(rows, 1024)));
            const int shifts[3] = {21, 10, 0}, bits[3] = {11, 11, 10};
            for (int p = 0; p < 3; p++) {
                tk_hist<<<dim3(bx, (unsigned)rows), 256, 0, s>>>(x, n, state, shifts[p], bits[p], hist);
                KS_CU_LAUNCH("topk histogram kernel");
            }
        }
        tk_count<<<dim3(nch, (unsigned)rows), 256, 0, s>>>(x, n, state, nch, cnt);
        KS_CU_LAUNCH("topk count kernel");
        tk_scatter<<<dim3(nch, (unsigned)rows), 256, 0, s>>>(x, n, k, state, nch, cnt, out_idx, keys);
        KS_CU_LAUNCH("topk scatter kernel");
    }
    if (keys) {
        for (int64_t r = 0; r < rows; r++) {
            KS_CU(cub::DeviceRadixSort::SortPairs(cub_tmp, cub_bytes, keys + r * k, keys2, out_idx + r * k, idx2, (int)k,
                                                  0, 32, s),
                  "topk sort (cub)");
            KS_CU(cudaMemcpyAsync(out_idx + r * k, idx2, sizeof(int32_t) * k, cudaMemcpyDeviceToDevice, s), "topk copy");
        }
    }
    if (out_val) {
        tk_values<<<ks_grid1d((size_t)ktotal, 256), 256, 0, s>>>(x, n, k, rows, out_idx, out_val);
        KS_CU_LAUNCH("topk values kernel");
    }
    return KS_OK;
}
