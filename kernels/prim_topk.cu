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
 * Rows of at most TKS_MAX_N = 16384 keys (Quest's page bounds: one row of a few thousand pages
 * per KV head) take one launch instead (tk_smem): a block of 1024 threads a row reads the row
 * once into shared memory as keys and runs up to four passes over 8-bit digits there (256 bins
 * x 32 lane copies, so a warp's shared atomics never collide), stopping early when the chosen
 * bin is exactly what is still needed; then the same stable compaction from shared memory
 * (counts scanned in the warps, one barrier). It writes the same lists as the other paths.
 * Measured on one H100 (bench_kernels --quest, median of 15 single calls timed with events, so
 * the host's launch is in them; two runs each): Quest's 8 rows x 8191 pages, k = 255: 20.9 /
 * 19.4 us (the three-pass block it replaced, which re-read the row from L2: 27.1 / 29.8 us);
 * 8 x 2047: 14.5 / 13.2 us (18.4 / 18.0). A trivial row costs ~9.5 us timed that way (~5.5 us
 * back to back), so the <= 8 us aimed at is out of reach of one launch on that machine. The kernel holds up to 48K keys in Hopper's 227 KB,
 * but one multiprocessor a row lost to the cooperative launch there: one row of 32128 softmax
 * votes (TokenSelect at 32K) took 24.9 us back to back in it, and scores + top-k replayed from a
 * graph took 80.8 us against 72.8 us with the cooperative path; loading and compacting 32K keys
 * on one multiprocessor alone took ~19 us (k = n: every key written). Counting with a two-entry register cache per
 * thread or with __match_any_sync into per-warp bins instead of the lane copies was slower on
 * every shape tried (random, ties, votes, Quest bounds). A cluster of blocks (the row split over
 * several multiprocessors' shared memory) is the way to speed up the longer rows.
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

/* ---------------------------------------------------------------- one block a row, the row in shared memory */

#define TKS_THREADS 1024
/* Keys a row: 64 KB of keys + 33 KB of bins. The kernel is written for up to 48K keys (the row
 * and the bins within Hopper's 227 KB a block), but one multiprocessor a row lost to the
 * cooperative launch on the longer rows (H100, see the header), so it takes what tk_one took. */
#define TKS_MAX_N 16384
#define TKS_BINS 256    /* 8-bit digits, 4 passes */
#define TKS_ROUNDS ((TKS_MAX_N + 3 + 4 * TKS_THREADS - 1) / (4 * TKS_THREADS)) /* groups a thread at most */
#define TKS_FIXED_BYTES (sizeof(uint32_t) * (TKS_BINS * 32 + TKS_BINS))

/* Dynamic shared memory for rows of n keys: the bins, their totals and the keys in groups of 4
 * (up to 3 slots of padding in front, so that each group is one aligned float4 of the row). */
static size_t tks_smem_bytes(int64_t n) { return TKS_FIXED_BYTES + sizeof(uint4) * (size_t)((n + 3 + 3) / 4); }

/* 0x10000 if key > thr, 1 if key == thr, 0 if neither or i is not an index of the row */
static __device__ __forceinline__ unsigned tks_flags(uint32_t key, int i, int n, uint32_t thr) {
    return (unsigned)i < (unsigned)n ? (key > thr ? 0x10000u : 0u) + (key == thr ? 1u : 0u) : 0u;
}

/* Row blockIdx.x (n <= TKS_MAX_N keys), 1024 threads. The row is read once, as keys, into shared
 * memory: group g (4 keys) holds the row's elements 4g - pad .. 4g - pad + 3, pad = the row's
 * misalignment in floats, so every whole group is one aligned float4; the slots outside the row
 * hold key 0. Then up to 4 radix passes over 8-bit digits, most significant first, over shared
 * memory: the keys that match the digits chosen so far are counted into 256 bins x 32 copies,
 * copy = lane (bin b lane l at word 32b + l: a warp's atomics never meet each other nor share a
 * bank, however clustered the scores); each warp then sums 8 bins over their copies (one
 * reduction each) and clears them, and every warp scans the 256 totals from the top itself
 * (no third barrier) and picks the digit holding the need-th largest key. The padding keys are
 * 0, the bottom of every pass, so they never move the chosen digit nor need (only the count of a
 * bin below everything that is taken). A pass stops the select early when the chosen bin holds
 * exactly the keys still needed: then thr = the bin's lowest key - 1 and need = 0 (the same set).
 * Then the stable compaction: thread t's group in round r is t + 1024 r (the row in index
 * order, round by round), its counts of keys > thr and == thr packed in 16 + 16 bits (n < 2^16)
 * and scanned in the warp, the warps' totals of every round scanned by every warp after one
 * barrier; each key > thr and each of the first `need` keys == thr goes to its place. */
__global__ void __launch_bounds__(TKS_THREADS) tk_smem(const float *__restrict__ x, int n, int k,
                                                       int32_t *__restrict__ out_idx, uint32_t *__restrict__ out_key) {
    extern __shared__ uint4 tks_sm[];
    uint32_t *hist = (uint32_t *)tks_sm;  /* [TKS_BINS][32]; the compaction's warp totals afterwards */
    uint32_t *tot = hist + TKS_BINS * 32; /* [TKS_BINS] */
    uint4 *keys = tks_sm + TKS_FIXED_BYTES / sizeof(uint4);
    const int t = threadIdx.x, lane = t & 31, w = t >> 5;
    const float *xr = x + (int64_t)blockIdx.x * n;
    const int pad = (int)(((uintptr_t)xr >> 2) & 3u);
    const int G = (n + pad + 3) >> 2, R = (G + TKS_THREADS - 1) / TKS_THREADS;
    const float4 *xa = (const float4 *)(xr - pad); /* aligned; only whole groups are read through it */

    for (int i = t; i < TKS_BINS * 32 / 4; i += TKS_THREADS) tks_sm[i] = make_uint4(0u, 0u, 0u, 0u);
    for (int g0 = t; g0 < G; g0 += 4 * TKS_THREADS) {
        float4 v[4];
#pragma unroll
        for (int u = 0; u < 4; u++) {
            const int g = g0 + u * TKS_THREADS, i0 = 4 * g - pad;
            if (g < G && i0 >= 0 && i0 + 4 <= n) v[u] = __ldg(xa + g);
        }
#pragma unroll
        for (int u = 0; u < 4; u++) {
            const int g = g0 + u * TKS_THREADS, i0 = 4 * g - pad;
            if (g >= G) break;
            uint4 kv;
            if (i0 >= 0 && i0 + 4 <= n) {
                kv = make_uint4(f32_key(v[u].x), f32_key(v[u].y), f32_key(v[u].z), f32_key(v[u].w));
            } else { /* the first or the last group: part of it outside the row */
                kv.x = (unsigned)i0 < (unsigned)n ? f32_key(xr[i0]) : 0u;
                kv.y = (unsigned)(i0 + 1) < (unsigned)n ? f32_key(xr[i0 + 1]) : 0u;
                kv.z = (unsigned)(i0 + 2) < (unsigned)n ? f32_key(xr[i0 + 2]) : 0u;
                kv.w = (unsigned)(i0 + 3) < (unsigned)n ? f32_key(xr[i0 + 3]) : 0u;
            }
            keys[g] = kv;
        }
    }
    __syncthreads();

    uint32_t thr = 0u;
    unsigned need = 0xffffffffu; /* k == n: every key (> 0, and all the NaNs' 0s) */
    if (k < n) {
        uint32_t prefix = 0u, mask = 0u;
        need = (unsigned)k;
#pragma unroll 1
        for (int shift = 24;; shift -= 8) {
            for (int g = t; g < G; g += TKS_THREADS) {
                const uint4 v = keys[g];
                const uint32_t kk[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
                for (int c = 0; c < 4; c++)
                    if ((kk[c] & mask) == prefix) atomicAdd(&hist[((kk[c] >> shift) & 255u) * 32 + lane], 1u);
            }
            __syncthreads();
#pragma unroll
            for (int j = 0; j < 8; j++) {
                const int b = w * 8 + j;
                const unsigned c = __reduce_add_sync(0xffffffffu, hist[b * 32 + lane]);
                hist[b * 32 + lane] = 0u;
                if (lane == 0) tot[b] = c;
            }
            __syncthreads();
            /* lane l: the bins 255 - 8l .. 248 - 8l (top down) */
            unsigned c[8], sum = 0u;
#pragma unroll
            for (int j = 0; j < 8; j++) {
                c[j] = tot[TKS_BINS - 1 - 8 * lane - j];
                sum += c[j];
            }
            unsigned incl = sum;
#pragma unroll
            for (int d = 1; d < 32; d <<= 1) {
                const unsigned y = __shfl_up_sync(0xffffffffu, incl, d);
                if (lane >= d) incl += y;
            }
            const unsigned excl = incl - sum;
            const int src = __ffs(__ballot_sync(0xffffffffu, excl < need && incl >= need)) - 1;
            int bin = 0;
            unsigned before = excl, cb = 0u;
            bool found = false;
#pragma unroll
            for (int j = 0; j < 8; j++)
                if (!found) {
                    if (before + c[j] >= need) {
                        found = true;
                        bin = TKS_BINS - 1 - 8 * lane - j;
                        cb = c[j];
                    } else {
                        before += c[j];
                    }
                }
            bin = __shfl_sync(0xffffffffu, bin, src);
            before = __shfl_sync(0xffffffffu, before, src);
            cb = __shfl_sync(0xffffffffu, cb, src);
            prefix |= (uint32_t)bin << shift;
            mask |= 255u << shift;
            need -= before;
            if (cb == need && prefix != 0u) { /* the whole bin is taken: every key >= prefix */
                thr = prefix - 1u;
                need = 0u;
                break;
            }
            if (shift == 0) {
                thr = prefix;
                break;
            }
        }
    }

    /* compaction: pk[r] = this thread's counts in round r, then their inclusive scan in the warp */
    unsigned pk[TKS_ROUNDS];
#pragma unroll
    for (int r = 0; r < TKS_ROUNDS; r++) {
        pk[r] = 0u;
        if (r >= R) continue;
        const int g = t + r * TKS_THREADS, i0 = 4 * g - pad;
        if (g < G) {
            const uint4 v = keys[g];
            pk[r] = tks_flags(v.x, i0, n, thr) + tks_flags(v.y, i0 + 1, n, thr) + tks_flags(v.z, i0 + 2, n, thr) +
                    tks_flags(v.w, i0 + 3, n, thr);
        }
#pragma unroll
        for (int d = 1; d < 32; d <<= 1) {
            const unsigned y = __shfl_up_sync(0xffffffffu, pk[r], d);
            if (lane >= d) pk[r] += y;
        }
        if (lane == 31) hist[r * 32 + w] = pk[r];
    }
    __syncthreads();
    int32_t *oi = out_idx + (int64_t)blockIdx.x * k;
    uint32_t *ok = out_key ? out_key + (int64_t)blockIdx.x * k : nullptr;
    unsigned carry = 0u; /* counts of the rounds before */
#pragma unroll
    for (int r = 0; r < TKS_ROUNDS; r++) {
        if (r >= R) continue;
        const unsigned wv = hist[r * 32 + lane]; /* warp lane's total in round r */
        unsigned wi = wv;
#pragma unroll
        for (int d = 1; d < 32; d <<= 1) {
            const unsigned y = __shfl_up_sync(0xffffffffu, wi, d);
            if (lane >= d) wi += y;
        }
        const unsigned wbefore = __shfl_sync(0xffffffffu, wi - wv, w), rtot = __shfl_sync(0xffffffffu, wi, 31);
        const int g = t + r * TKS_THREADS, i0 = 4 * g - pad;
        if (g < G) {
            const uint4 v = keys[g];
            const uint32_t kk[4] = {v.x, v.y, v.z, v.w};
            unsigned f[4], own = 0u;
#pragma unroll
            for (int c = 0; c < 4; c++) {
                f[c] = tks_flags(kk[c], i0 + c, n, thr);
                own += f[c];
            }
            unsigned at = carry + wbefore + pk[r] - own; /* > thr in the high 16 bits, == thr in the low */
#pragma unroll
            for (int c = 0; c < 4; c++) {
                const unsigned gt = at >> 16, eq = at & 0xffffu;
                if ((f[c] >> 16) || (f[c] && eq < need)) {
                    const unsigned pos = gt + (eq < need ? eq : need);
                    oi[pos] = i0 + c;
                    if (ok) ok[pos] = ~kk[c];
                }
                at += f[c];
            }
        }
        carry += rtot;
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

/* Whether rows of n keys take tk_smem on this device: n <= TKS_MAX_N and their shared memory
 * within what the device lends a block (every n <= TKS_MAX_N on Hopper). The kernel's
 * limit is raised to that once per device. */
static bool tks_fits(int64_t n) {
    static int optin[64]; /* per device: the limit set, in bytes (0: not yet) */
    if (n > TKS_MAX_N) return false;
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) return false;
    if (!optin[dev]) {
        int b = 0;
        if (cudaDeviceGetAttribute(&b, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess ||
            cudaFuncSetAttribute(tk_smem, cudaFuncAttributeMaxDynamicSharedMemorySize, b) != cudaSuccess) {
            cudaGetLastError();
            return false;
        }
        optin[dev] = b;
    }
    return tks_smem_bytes(n) <= (size_t)optin[dev];
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
    if (tks_fits(n)) { /* one launch: a block a row, the row in shared memory */
        tk_smem<<<(unsigned)rows, TKS_THREADS, tks_smem_bytes(n), s>>>(x, (int)n, (int)k, out_idx, keys);
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
