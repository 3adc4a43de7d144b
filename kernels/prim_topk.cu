/* prim_topk.cu — top-k by radix select (ks_cuda_prims.h).
 *
 * Every path selects on the order-preserving 32-bit key (prim_common.cuh) the k-th largest key
 * `thr` and `need`, how many keys equal to thr are taken, then compacts stably: in index order,
 * every key > thr and the first `need` keys == thr, exactly the CPU's set (ties to the lower
 * index). KS_TOPK_BY_VALUE then sorts the k winners by descending key with a stable radix sort
 * (CUB), so equal values stay in index order.
 *
 * Rows of up to 262138 keys (16 blocks of 16384, less the worst misalignment) take one launch
 * (tk_clu): a thread-block cluster a row, each block of 256 threads (1024 for one row of 64K keys
 * or more: tkq_threads) holding its slice of the row as keys in registers (read once), four 8-bit
 * radix passes with an early stop, the blocks' histograms summed through distributed shared
 * memory with one cluster barrier a pass, and the compaction with the offsets of the blocks
 * before. It replaced a block of 1024 threads a row
 * with the row in shared memory (rows up to 16384) and a cooperative launch with global
 * barriers (longer rows): on an H100, Quest's 8 rows x 8191 pages 11.2-13.2 -> 8.2-10.0 us,
 * TokenSelect's one row of 32128 votes 20.9 -> 11.3 us and of 130432 22.8 -> 18.5 us, device time
 * a call replayed from a graph (bench/NOTES.md, "top-k on a cluster").
 *
 * Longer rows take six kernels: init, three histogram passes over 11 / 11 / 10-bit digits (most
 * significant first, each counting only the keys that match the digits chosen so far; the last
 * block of a row scans the histogram from the top and fixes the digit, the state kept on the
 * device so nothing waits), a count of each chunk's keys > thr / == thr, and the scatter. Cost:
 * 4 passes over the row plus O(k log) for the value order.
 *
 * Under a nonzero mask (ks_cuda_topk_skip; ks_cpu_topk_masked) every kernel of either path reads
 * the mask first: tk_clu writes the top k of zeros (base .. base + k - 1, with their keys for the
 * value sort) and leaves before its first cluster barrier, the histogram and count kernels leave
 * at once, tk_scatter writes the same result per chunk and tk_values writes zeros.
 *
 * A growing row (ks_cuda_topk_grow, a recorded decode handler's: policy.h ks_action_replay) takes
 * tk_clu alone, its cluster, block and rounds chosen for the most keys the recording allows; the
 * kernel adds the step slot's delta (less the one at the recording) to n where it starts. The set
 * does not depend on the cluster's size, so a replay selects what a plain call over the grown row
 * would. */
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
                                               int bits, unsigned *ghist, const float *skip) {
    if (skip && *skip != 0.0f) return; /* skipped: tk_scatter writes the result of a row of zeros */
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
                                                int2 *cnt, const float *skip) {
    if (skip && *skip != 0.0f) return;
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
__global__ void tk_scatter(const float *__restrict__ x, int64_t n, int64_t k, int64_t base, const tk_state *__restrict__ st,
                           int nch,
                           const int2 *__restrict__ off, int32_t *__restrict__ out_idx, uint32_t *__restrict__ out_key,
                           const float *skip) {
    typedef cub::BlockScan<int, 256> scan_t;
    __shared__ typename scan_t::TempStorage tmp;
    const int row = blockIdx.y, c = blockIdx.x;
    if (skip && *skip != 0.0f) { /* the top k of a row of zeros: the first k indices, in order */
        for (int64_t i = (int64_t)c * TK_CHUNK + threadIdx.x; i < KS_MIN(k, (int64_t)(c + 1) * TK_CHUNK); i += blockDim.x) {
            out_idx[(int64_t)row * k + i] = (int32_t)(i + base);
            if (out_key) out_key[(int64_t)row * k + i] = ~f32_key(0.0f);
        }
        return;
    }
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
            oi[pos] = (int32_t)(i + base);
            if (ok) ok[pos] = ~u[j];
        }
        gt += g;
        eq += e;
    }
}

/* ---------------------------------------------------------------- a cluster of small blocks a row, the row in registers */

#define TKQ_THREADS 256   /* threads a block, and 1024 (TKQ_WIDE) for one long row */
#define TKQ_WIDE 1024
#define TKQ_WIDE_N 65536   /* a row of at least this many keys (and the only row) takes TKQ_WIDE blocks */
#define TKQ_ROUNDS(T) (4096 / (T)) /* groups of 4 keys a thread at most: 16384 keys a block */
#define TKQ_MAX_CLUSTER 16 /* blocks a row at most (above 8 where the device allows it) */
#define TKQ_MAX_CLUSTER_ROWS 8 /* ... when there are several rows (a cluster of 16 needs a whole GPC) */
#define TKQ_KEYS_CTA 512   /* keys a block aimed at: the cluster size is n / this, within those bounds */
#define TKQ_WAVE 128       /* blocks of one call at most, where fewer blocks a cluster can keep it so */
#define TKQ_BINS 256       /* 8-bit digits, 4 passes */
#define TKQ_BWARPS (TKQ_BINS / 32) /* the warps whose threads own a bin each (thread t < TKQ_BINS: bin t) */

/* 0x10000 if key > thr, 1 if key == thr, 0 if neither or i is not an index of the row */
static __device__ __forceinline__ unsigned tkq_flags(uint32_t key, int i, int n, uint32_t thr) {
    return (unsigned)i < (unsigned)n ? (key > thr ? 0x10000u : 0u) + (key == thr ? 1u : 0u) : 0u;
}

/* The cluster barrier: every thread of every block arrives (release) and waits (acquire). */
static __device__ __forceinline__ void tkq_sync() {
    __cluster_barrier_arrive();
    __cluster_barrier_wait();
}

/* Add v to the word at p (in this block's shared memory) in block `rank` of the cluster,
 * without waiting for it (distributed shared memory; made visible by the next barrier). */
static __device__ __forceinline__ void tkq_red(const uint32_t *p, unsigned rank, uint32_t v) {
    uint32_t a = (uint32_t)__cvta_generic_to_shared(p), r;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(rank));
    asm volatile("red.shared::cluster.add.u32 [%0], %1;" ::"r"(r), "r"(v) : "memory");
}

/* Row blockIdx.y over a cluster of C = gridDim.x blocks of T threads (rank blockIdx.x). The
 * row's groups of 4 keys (group g = the elements 4g - pad .. 4g - pad + 3, pad the row's
 * misalignment in floats, so a whole group is one aligned float4) are split into C contiguous
 * slices of ceil(G / C) groups; thread t of block q holds the groups q * slice + t + T r,
 * r < R <= RM (the instance: 1, 2, 4, 8 or 16 rounds; T * RM <= 4096), as keys in its registers
 * (read once; slots outside the row or the slice hold key 0, the bottom of every pass, so they
 * never move the chosen digit, only the count of a bin below everything taken). Up to four radix
 * passes over 8-bit digits, most significant first: each thread counts its keys that match the
 * digits fixed so far into 256 bins x 32 lane copies (bin b, lane l at word 32b + l: a warp's
 * atomics never meet, however clustered the keys); then thread t < 256 (the first 8 warps) sums
 * bin t's 32 copies (8 16-byte loads in an order rotated by lane, so a quarter warp never shares
 * a bank), clears them, and adds the total into word t of the pass's histogram in
 * every block of the cluster (distributed shared memory reductions, nothing waited for). One
 * cluster barrier later each block holds the row's histogram locally; thread t reads bin t and
 * clears it for the pass after next (the two histograms alternate; a block clears one before it
 * arrives at the barrier after which the others add into it again), and the block scans the
 * 256 counts from the top bin down (a warp scan, the warp totals through shared memory, two
 * __syncthreads). The one thread whose bin holds the need-th largest key publishes it, and every
 * block fixes the same digit (the same sums everywhere). A pass stops the select early when the
 * chosen bin holds exactly the keys still needed (thr = the bin's lowest key - 1, need = 0: the
 * same set). The compaction: each thread's counts of keys > thr and == thr a round (16 + 16
 * bits: a block holds < 2^16 keys), scanned in the warp and over the warps; each block adds its
 * totals into the offsets of the blocks of higher rank; after a last cluster barrier each block
 * writes its winners in index order from its offsets. No block touches another's shared memory
 * after that barrier, so each leaves when done. Barriers: one at the start (arrive after the
 * clearing, wait before the first remote add), one a pass, one before the writes. The output
 * is the CPU's set in index order, whatever C; ibase is added to every index written. */
template <int RM, int T>
__global__ void __launch_bounds__(T) tk_clu(const float *__restrict__ x, int n, int k, int ibase,
                                                       int32_t *__restrict__ out_idx, uint32_t *__restrict__ out_key,
                                                       const float *skip, const int32_t *gd, int goff) {
    if (gd) n += *gd - goff; /* a recorded handler's row: the keys added since the recording (one row) */
    if (skip && *skip != 0.0f) { /* the top k of a row of zeros, x unread; every block leaves before any barrier */
        for (int i = (int)blockIdx.x * T + (int)threadIdx.x; i < k; i += (int)gridDim.x * T) {
            out_idx[(int64_t)blockIdx.y * k + i] = ibase + i;
            if (out_key) out_key[(int64_t)blockIdx.y * k + i] = ~f32_key(0.0f);
        }
        return;
    }
    __shared__ __align__(16) uint32_t hist[TKQ_BINS * 32]; /* lane copies; the compaction's warp totals afterwards */
    __shared__ uint32_t xch[2][TKQ_BINS];                   /* a pass's bins over the cluster (alternating) */
    __shared__ uint32_t wt[TKQ_BWARPS];                     /* the pick's warp totals */
    __shared__ uint32_t sel[3];                             /* the chosen bin, the keys above it, its count */
    __shared__ uint32_t offs[2];                            /* keys > thr and == thr in the blocks of lower rank */
    const int t = threadIdx.x, lane = t & 31, w = t >> 5, C = (int)gridDim.x, q = (int)blockIdx.x;
    const float *xr = x + (int64_t)blockIdx.y * n;
    const int pad = (int)(((uintptr_t)xr >> 2) & 3u);
    const int G = (n + pad + 3) >> 2, per = (G + C - 1) / C;
    const int g0 = KS_MIN(G, q * per), g1 = KS_MIN(G, g0 + per);
    const int R = (g1 - g0 + T - 1) / T;
    const float4 *xa = (const float4 *)(xr - pad); /* aligned; only whole groups are read through it */
    float4 v[RM];
#pragma unroll
    for (int r = 0; r < RM; r++) {
        const int g = g0 + t + r * T, i0 = 4 * g - pad;
        v[r] = make_float4(0.f, 0.f, 0.f, 0.f);
        if (r < R && g < g1 && i0 >= 0 && i0 + 4 <= n) v[r] = __ldg(xa + g);
    }
    for (int i = t; i < TKQ_BINS * 32 / 4; i += T) ((uint4 *)hist)[i] = make_uint4(0u, 0u, 0u, 0u);
    for (int i = t; i < 2 * TKQ_BINS; i += T) (&xch[0][0])[i] = 0u;
    if (t < 2) offs[t] = 0u;
    __cluster_barrier_arrive(); /* this block's histograms and offsets are clear (waited for below) */
    uint4 kv[RM];
#pragma unroll
    for (int r = 0; r < RM; r++) {
        const int g = g0 + t + r * T, i0 = 4 * g - pad;
        kv[r] = make_uint4(0u, 0u, 0u, 0u);
        if (r < R && g < g1) {
            if (i0 >= 0 && i0 + 4 <= n) {
                kv[r] = make_uint4(f32_key(v[r].x), f32_key(v[r].y), f32_key(v[r].z), f32_key(v[r].w));
            } else { /* the row's first or last group: part of it outside the row (key 0 there) */
                kv[r].x = (unsigned)i0 < (unsigned)n ? f32_key(xr[i0]) : 0u;
                kv[r].y = (unsigned)(i0 + 1) < (unsigned)n ? f32_key(xr[i0 + 1]) : 0u;
                kv[r].z = (unsigned)(i0 + 2) < (unsigned)n ? f32_key(xr[i0 + 2]) : 0u;
                kv[r].w = (unsigned)(i0 + 3) < (unsigned)n ? f32_key(xr[i0 + 3]) : 0u;
            }
        }
    }
    __syncthreads();
    uint32_t thr = 0u;
    unsigned need = 0xffffffffu; /* k == n: every key */
    bool waited = false;          /* the start barrier */
    if (k < n) {
        uint32_t prefix = 0u, mask = 0u;
        need = (unsigned)k;
#pragma unroll 1
        for (int p = 0, shift = 24;; p++, shift -= 8) {
#pragma unroll
            for (int r = 0; r < RM; r++)
                if (r < R) {
                    const uint32_t kk[4] = {kv[r].x, kv[r].y, kv[r].z, kv[r].w};
#pragma unroll
                    for (int c = 0; c < 4; c++)
                        if ((kk[c] & mask) == prefix) atomicAdd(&hist[((kk[c] >> shift) & 255u) * 32 + lane], 1u);
                }
            __syncthreads();
            const bool bo = T == TKQ_BINS || t < TKQ_BINS; /* this thread owns bin t (warp-uniform) */
            unsigned bt = 0u;
            if (bo) {
                uint4 *hb = (uint4 *)(hist + t * 32); /* bin t's 32 copies */
#pragma unroll
                for (int j = 0; j < 8; j++) {
                    const uint4 h = hb[(j + lane) & 7];
                    bt += h.x + h.y + h.z + h.w;
                }
#pragma unroll
                for (int j = 0; j < 8; j++) hb[(j + lane) & 7] = make_uint4(0u, 0u, 0u, 0u);
            }
            uint32_t *xb = xch[p & 1];
            if (!waited) {
                __cluster_barrier_wait();
                waited = true;
            }
            if (bt)
                for (int r = 0; r < C; r++) tkq_red(xb + t, (unsigned)r, bt);
            tkq_sync();
            unsigned gc = 0u, s = 0u;
            if (bo) {
                gc = xb[t]; /* bin t's count over the cluster */
                xb[t] = 0u; /* clear for the pass after next */
                s = gc;     /* the warp's bins t .. 32w + 31, summed */
#pragma unroll
                for (int d = 1; d < 32; d <<= 1) {
                    const unsigned y = __shfl_down_sync(0xffffffffu, s, d);
                    if (lane + d < 32) s += y;
                }
                if (lane == 0) wt[w] = s;
            }
            __syncthreads();
            if (bo) {
                unsigned above = s - gc; /* keys in the bins above t */
#pragma unroll
                for (int u = 0; u < TKQ_BWARPS; u++)
                    if (u > w) above += wt[u];
                if (above < need && above + gc >= need) {
                    sel[0] = (uint32_t)t;
                    sel[1] = above;
                    sel[2] = gc;
                }
            }
            __syncthreads();
            const uint32_t bin = sel[0], before = sel[1], cb = sel[2];
            prefix |= bin << shift;
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
    if (!waited) __cluster_barrier_wait();

    /* compaction: pk[r] = this thread's counts in round r (> thr in the high 16 bits, == thr in
     * the low), then their inclusive scan in the warp; the warp totals of round r at hist[8r + w] */
    unsigned pk[RM];
#pragma unroll
    for (int r = 0; r < RM; r++) {
        pk[r] = 0u;
        if (r >= R) continue;
        const int g = g0 + t + r * T, i0 = 4 * g - pad;
        if (g < g1)
            pk[r] = tkq_flags(kv[r].x, i0, n, thr) + tkq_flags(kv[r].y, i0 + 1, n, thr) +
                    tkq_flags(kv[r].z, i0 + 2, n, thr) + tkq_flags(kv[r].w, i0 + 3, n, thr);
#pragma unroll
        for (int d = 1; d < 32; d <<= 1) {
            const unsigned y = __shfl_up_sync(0xffffffffu, pk[r], d);
            if (lane >= d) pk[r] += y;
        }
        if (lane == 31) hist[r * (T / 32) + w] = pk[r];
    }
    __syncthreads();
    unsigned base[RM], carry = 0u; /* this thread's warp's start in round r, within the block */
#pragma unroll
    for (int r = 0; r < RM; r++) {
        base[r] = 0u;
        if (r >= R) continue;
        const unsigned wv = lane < T / 32 ? hist[r * (T / 32) + lane] : 0u;
        unsigned wi = wv;
#pragma unroll
        for (int d = 1; d < T / 32; d <<= 1) {
            const unsigned y = __shfl_up_sync(0xffffffffu, wi, d);
            if (lane >= d) wi += y;
        }
        base[r] = carry + __shfl_sync(0xffffffffu, wi - wv, w);
        carry += __shfl_sync(0xffffffffu, wi, T / 32 - 1);
    }
    if (w == 0 && lane > q && lane < C) { /* this block's totals go to the blocks after it */
        if (carry >> 16) tkq_red(&offs[0], (unsigned)lane, carry >> 16);
        if (carry & 0xffffu) tkq_red(&offs[1], (unsigned)lane, carry & 0xffffu);
    }
    tkq_sync();
    const unsigned gbase = offs[0], ebase = offs[1];
    int32_t *oi = out_idx + (int64_t)blockIdx.y * k;
    uint32_t *ok = out_key ? out_key + (int64_t)blockIdx.y * k : nullptr;
#pragma unroll
    for (int r = 0; r < RM; r++) {
        if (r >= R) continue;
        const int g = g0 + t + r * T, i0 = 4 * g - pad;
        if (g >= g1) continue;
        const uint32_t kk[4] = {kv[r].x, kv[r].y, kv[r].z, kv[r].w};
        unsigned f[4], own = 0u;
#pragma unroll
        for (int c = 0; c < 4; c++) {
            f[c] = tkq_flags(kk[c], i0 + c, n, thr);
            own += f[c];
        }
        unsigned at = base[r] + pk[r] - own;
#pragma unroll
        for (int c = 0; c < 4; c++) {
            const unsigned gt = gbase + (at >> 16), eq = ebase + (at & 0xffffu);
            if ((f[c] >> 16) || (f[c] && eq < need)) {
                const unsigned pos = gt + (eq < need ? eq : need);
                oi[pos] = i0 + c + ibase;
                if (ok) ok[pos] = ~kk[c];
            }
            at += f[c];
        }
    }
}

/* Threads a block of tk_clu for `rows` rows of n keys: TKQ_WIDE for one row of at least
 * TKQ_WIDE_N keys (a thread then counts a quarter of the keys in each pass: TokenSelect's 130432
 * votes 15.5 -> 12.4 us a call on an H200, while 32128 took 9.7 -> 11.8 us with the wide blocks:
 * bench/NOTES.md, issue 14 session 26), else TKQ_THREADS. */
static int tkq_threads(int64_t rows, int64_t n) { return rows == 1 && n >= TKQ_WIDE_N ? TKQ_WIDE : TKQ_THREADS; }

/* The rounds a thread of tk_clu holds for rows of n keys in clusters of C blocks of T threads:
 * the instance used (1, 2, 4, 8 or 16 rounds of 4 keys, at most TKQ_ROUNDS(T); 0 if a block's
 * slice is more than 16384 keys). Each instance is as small as its rows need: the kernel's
 * straight-line code runs once a launch, so its length is paid in instruction fetches. */
static int tkq_rounds(int64_t n, int C, int T) {
    const int64_t G = (n + 6) / 4, per = (G + C - 1) / C, r = (per + T - 1) / T;
    return r > TKQ_ROUNDS(T) ? 0 : r <= 1 ? 1 : r <= 2 ? 2 : r <= 4 ? 4 : r <= 8 ? 8 : 16;
}

template <int RM, int T> static cudaError_t tkq_allow(int C) {
    return C > 8 ? cudaFuncSetAttribute(tk_clu<RM, T>, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) : cudaSuccess;
}

/* Whether tk_clu runs C blocks of T threads a cluster on this device (asked once per device, C
 * and T, on the instance with the most registers; above 8 after allowing non-portable sizes on
 * every instance). A failed query is not remembered, so a later call asks again. */
static bool tkq_runs(int dev, int C, int T) {
    static signed char ok[64][2][TKQ_MAX_CLUSTER + 1]; /* 0 unknown, 1 yes, -1 no */
    const int wide = T == TKQ_WIDE;
    if (!ok[dev][wide][C]) {
        int m = 0;
        cudaError_t e;
        if (wide) {
            e = tkq_allow<1, TKQ_WIDE>(C);
            if (e == cudaSuccess) e = tkq_allow<2, TKQ_WIDE>(C);
            if (e == cudaSuccess) e = tkq_allow<4, TKQ_WIDE>(C);
        } else {
            e = tkq_allow<1, TKQ_THREADS>(C);
            if (e == cudaSuccess) e = tkq_allow<2, TKQ_THREADS>(C);
            if (e == cudaSuccess) e = tkq_allow<4, TKQ_THREADS>(C);
            if (e == cudaSuccess) e = tkq_allow<8, TKQ_THREADS>(C);
            if (e == cudaSuccess) e = tkq_allow<16, TKQ_THREADS>(C);
        }
        if (e == cudaSuccess) {
            cudaLaunchConfig_t cfg = {};
            cfg.gridDim = dim3((unsigned)C, 1);
            cfg.blockDim = dim3((unsigned)T);
            cudaLaunchAttribute at[1];
            at[0].id = cudaLaunchAttributeClusterDimension;
            at[0].val.clusterDim.x = (unsigned)C;
            at[0].val.clusterDim.y = 1;
            at[0].val.clusterDim.z = 1;
            cfg.attrs = at;
            cfg.numAttrs = 1;
            e = wide ? cudaOccupancyMaxActiveClusters(&m, tk_clu<4, TKQ_WIDE>, &cfg)
                     : cudaOccupancyMaxActiveClusters(&m, tk_clu<16, TKQ_THREADS>, &cfg);
        }
        if (e != cudaSuccess) {
            cudaGetLastError();
            return false;
        }
        ok[dev][wide][C] = m >= 1 ? 1 : -1;
    }
    return ok[dev][wide][C] > 0;
}

/* Blocks a cluster for `rows` rows of n keys (0: the cluster kernel does not take them). At
 * least enough for a block's 16384 keys with the worst padding (cmin); aimed at n / 512 keys a
 * block, at most 16 for one row and 8 for several (eight clusters of 16 did not find eight
 * whole GPCs on an H100: one doubled up and the call took 35 us instead of 25 with 9); then
 * fewer while the call has more than 128 blocks; and the largest such size the device runs.
 * Measured choices (H100, bench/NOTES.md, "top-k on a cluster"): Quest's 8 x 8191 -> 8,
 * 8 x 2047 -> 4, TokenSelect's one row of 32K or 128K -> 16, 32 x 8191 -> 4. */
static int tkq_cluster(int64_t rows, int64_t n) {
    const int64_t G = (n + 6) / 4, cap = 4096; /* groups a block at most (16384 keys), <= 3 keys of padding */
    const int cmin = (int)KS_MAX((int64_t)1, (G + cap - 1) / cap);
    if (cmin > TKQ_MAX_CLUSTER) return 0;
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) return 0;
    const int64_t cap_c = rows == 1 ? TKQ_MAX_CLUSTER : TKQ_MAX_CLUSTER_ROWS;
    int C = (int)KS_MAX((int64_t)cmin, KS_MIN((n + TKQ_KEYS_CTA - 1) / TKQ_KEYS_CTA, cap_c));
    while (C > cmin && rows * C > TKQ_WAVE) C--;
    for (; C >= cmin; C--)
        if (tkq_runs(dev, C, tkq_threads(rows, n))) return C;
    return 0;
}

/* Launch tk_clu for rows of n keys in clusters of C blocks (the instance for its rounds and
 * block size). */
static cudaError_t tkq_launch(cudaStream_t s, int C, const float *x, int64_t rows, int64_t n, int64_t nmax, int64_t k,
                              int64_t base, int32_t *out_idx, uint32_t *keys, const float *skip, const int32_t *gd,
                              int goff) {
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeClusterDimension;
    at[0].val.clusterDim.x = (unsigned)C;
    at[0].val.clusterDim.y = 1;
    at[0].val.clusterDim.z = 1;
    const int T = tkq_threads(rows, nmax);
    const dim3 grid((unsigned)C, (unsigned)rows), block((unsigned)T);
#define TKQ_GO(RM, TT) \
    ks_launch_ex(tk_clu<RM, TT>, grid, block, 0, s, at, 1, x, (int)n, (int)k, (int)base, out_idx, keys, skip, gd, goff)
    if (T == TKQ_WIDE) switch (tkq_rounds(nmax, C, T)) {
        case 1: return TKQ_GO(1, TKQ_WIDE);
        case 2: return TKQ_GO(2, TKQ_WIDE);
        case 4: return TKQ_GO(4, TKQ_WIDE);
        default: return cudaErrorInvalidValue;
        }
    switch (tkq_rounds(nmax, C, T)) {
    case 1: return TKQ_GO(1, TKQ_THREADS);
    case 2: return TKQ_GO(2, TKQ_THREADS);
    case 4: return TKQ_GO(4, TKQ_THREADS);
    case 8: return TKQ_GO(8, TKQ_THREADS);
    case 16: return TKQ_GO(16, TKQ_THREADS);
    default: return cudaErrorInvalidValue;
    }
#undef TKQ_GO
}

__global__ void tk_values(const float *__restrict__ x, int64_t n, int64_t k, int64_t rows, int64_t base,
                          const int32_t *__restrict__ idx, float *__restrict__ val, const float *skip) {
    int64_t total = rows * k, stride = (int64_t)gridDim.x * blockDim.x;
    const bool zero = skip && *skip != 0.0f;
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += stride)
        val[e] = zero ? 0.0f : x[(e / k) * n + idx[e] - base];
}

extern "C" ks_status ks_cuda_topk(cudaStream_t s, const ks_cuda_scratch *sc, const float *x, int64_t rows, int64_t n,
                                  int64_t k, int64_t base, ks_topk_order order, int32_t *out_idx, float *out_val) {
    return ks_cuda_topk_skip(s, sc, x, rows, n, k, base, order, out_idx, out_val, NULL);
}

extern "C" ks_status ks_cuda_topk_skip(cudaStream_t s, const ks_cuda_scratch *sc, const float *x, int64_t rows, int64_t n,
                                       int64_t k, int64_t base, ks_topk_order order, int32_t *out_idx, float *out_val,
                                       const float *skip) {
    P_NONNEG("topk", "rows", rows);
    P_NONNEG("topk", "n", n);
    P_IDX_RANGE("topk", "n", n);
    P_NONNEG("topk", "k", k);
    if (k > n) return ks_errorf(KS_ERR_ARG, "topk: k = %lld > n = %lld", (long long)k, (long long)n);
    if (base < 0 || base > (int64_t)INT32_MAX + 1 - n)
        return ks_errorf(KS_ERR_ARG, "topk: base %lld + n %lld leaves the int32 index range", (long long)base, (long long)n);
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
    int C;
    if ((C = tkq_cluster(rows, n)) > 0) { /* one launch: a cluster a row, the row in its registers */
        KS_CU(tkq_launch(s, C, x, rows, n, n, k, base, out_idx, keys, skip, NULL, 0), "topk kernel");
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
                tk_hist<<<dim3(bx, (unsigned)rows), 256, 0, s>>>(x, n, state, shifts[p], bits[p], hist, skip);
                KS_CU_LAUNCH("topk histogram kernel");
            }
        }
        tk_count<<<dim3(nch, (unsigned)rows), 256, 0, s>>>(x, n, state, nch, cnt, skip);
        KS_CU_LAUNCH("topk count kernel");
        tk_scatter<<<dim3(nch, (unsigned)rows), 256, 0, s>>>(x, n, k, base, state, nch, cnt, out_idx, keys, skip);
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
        tk_values<<<ks_grid1d((size_t)ktotal, 256), 256, 0, s>>>(x, n, k, rows, base, out_idx, out_val, skip);
        KS_CU_LAUNCH("topk values kernel");
    }
    return KS_OK;
}

extern "C" ks_status ks_cuda_topk_grow(cudaStream_t s, const ks_cuda_scratch *sc, const float *x, int64_t n, int64_t k,
                                       int64_t base, ks_topk_order order, int32_t *out_idx, float *out_val,
                                       const float *skip, int64_t grow, const int32_t *gd, int32_t goff) {
    if (grow < 1 || !gd) return ks_errorf(KS_ERR_ARG, "topk: a growing row needs a growth and a step slot");
    P_NONNEG("topk", "n", n);
    P_IDX_RANGE("topk", "n", n + grow);
    P_NONNEG("topk", "k", k);
    if (k > n) return ks_errorf(KS_ERR_ARG, "topk: k = %lld > n = %lld", (long long)k, (long long)n);
    if (base < 0 || base > (int64_t)INT32_MAX + 1 - (n + grow))
        return ks_errorf(KS_ERR_ARG, "topk: base %lld + n %lld leaves the int32 index range", (long long)base, (long long)(n + grow));
    P_PTR("topk", "x", x, n);
    P_PTR("topk", "out_idx", out_idx, k);
    if (order != KS_TOPK_BY_INDEX || out_val || k < 1)
        return ks_errorf(KS_ERR_UNSUPPORTED, "topk: a growing row gives its indices in index order, without values");
    const int C = tkq_cluster(1, n + grow);
    if (C <= 0) return ks_errorf(KS_ERR_UNSUPPORTED, "topk: a growing row of %lld keys", (long long)(n + grow));
    (void)sc;
    KS_CU(tkq_launch(s, C, x, 1, n, n + grow, k, base, out_idx, NULL, skip, gd, (int)goff), "topk kernel (growing row)");
    return KS_OK;
}
