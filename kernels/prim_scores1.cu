/* prim_scores1.cu — ks_cuda_scores for one query row per head (m = 1), in about one read of
 * the keys: TokenSelect's head vote (decode steps and prefill fingerprints) and GemFilter's
 * selection row. prim_scores.cu calls it when the shapes allow (ks_cuda_scores1_fits); the
 * semantics are ks_cpu_scores' (core/prims_scores.c), its CPU twin.
 *
 * One cooperative launch (and an 8-byte memset where the scratch has no counters), w = ce - cb
 * keys of the key domain, sc1_logits with grid (nx, Hkv): one wave of SC1_BLOCKS_SM blocks a
 * multiprocessor, all resident.
 *   1. Logits: each block a contiguous run of rows of one KV head and each warp a loop over its
 *      tiles of SC1_TR rows, loaded straight into registers (the next tile in flight while one
 *      is computed; no shared memory for keys, no block barrier in the loop), the dimensions
 *      taken in sc1_dim's order. The tile meets the g <= 8 query heads of that KV head on the
 *      tensor cores (mma m16n8k16, bf16 keys exactly; each query split into three bf16 parts
 *      hi + mid + lo that carry its 24 bits, accumulated in float32), so every key leaves DRAM
 *      once and the arithmetic is nearly free (the g query rows loaded before the first tile,
 *      rotated where asked (ks_scores_opts.q_rope_inv) or as they are into shared memory, then
 *      cut into fragments). Writes L (H, w) float32 (a key past the causal
 *      limit is -inf). With a softmax each lane keeps an online partial for each of the two
 *      heads it holds (max, double sum of expf), each block writes its partial per head (pmax,
 *      psum), and the last block of each KV head to finish (an atomic counter) combines the
 *      partials in a fixed order into M_h (their maxima's max) and then 1 / Z_h (Z_h = sum psum *
 *      exp(pmax - M_h), the terms independent of each other).
 *   2. A grid barrier (sc1_grid_sync).
 *   3. Every block reads M_h and 1 / Z_h and takes a grid-strided share of the output columns:
 *      per head v_h = (float)(expf(L - M_h) / Z_h) (softmax) or L (raw), the head reduction in
 *      double in ascending head order, as on the CPU (sc1_vote_col).
 * Resident logits (a.res; a head sum or mean, where they fit: SC1_RES_SMEM): in 1 each block
 * writes its logits to its shared memory, (g, run) floats, instead of L, no block combines the
 * partials before 2 (no counter, no wait on it), every block combines those of its own KV head's
 * g heads after 2 (the same bits in each), and 3 is two stages:
 * each block sums the per-head values of its g heads for its own rows in float32 (v_h =
 * e^(L - M_h) * (float)(1 / Z_h) with the e^ of sc1_exp, ascending head: pv, (Hkv, w)); a
 * second grid barrier; then
 * every block a grid-strided share of the columns, the Hkv group sums added in double in
 * ascending KV head order. Float32 arithmetic and another order than the CPU's double sum of
 * (float)(expf * 1 / Z_h): a few roundings of 2^-24 more and ex2.approx's error (~2^-22),
 * inside the tolerance below, and as fixed. The double form was bound by its float-double conversions (a quarter-rate
 * instruction): 8.5-9.2 us a call at 128K keys on an H100, 6.1-6.9 in float32. Resident logits
 * spare the 4 * H bytes a key of L written in the loop and read back after the barrier (16 MB
 * each way at 128K keys); pv is 4 * Hkv bytes a key each way (bench/NOTES.md, issue 14,
 * session 26).
 * A growing call (ks_cuda_scores_grow, a recorded decode handler's: a.gd) adds the step slot's
 * delta (less the one at the recording) to w, hi and ncols where it starts; the host splits the
 * rows for the most keys the recording allows (a.wl, which also bounds the loads, so they need not
 * wait for the delta): where a plain call of the grown count takes the same loop count, a block's
 * rows are that call's, the blocks past them add empty softmax partials, and the bits are the
 * same (tests/cuda/test_cuda_prims.c, grow).
 * Under a nonzero mask (ks_scores_opts.skip, one device float) every block writes its share of
 * the zero result and leaves before 1: no key read, no counter touched, no barrier reached.
 * The counters (Hkv per KV head, then the barriers' arrivals and the blocks that left) are the
 * scratch's, zero at rest: each kernel returns the words it used to zero. Until session 23, 3
 * was a second kernel: the same arithmetic in the same order (the same bits), one launch less
 * (bench/NOTES.md, issue 14 session 23). Code size matters here: the kernel runs its code once
 * a launch, so instruction fetches are paid by every block (one call site of the rotation; the
 * vote in batches of 8, where 16 measured slower).
 * Bytes: the keys once, L (4 * H bytes a key: 1/16 of the bf16 keys at g = 4, d = 128) written
 * once and read once. Shapes: bf16 keys, d % 16 == 0, d <= 128, g <= 8, rows 16-byte aligned
 * (others go to prim_scores.cu's general kernel). Against the CPU the logits differ by float32
 * accumulation order and the query's 2^-24 split error, expf by its ulps and Z by the
 * rescalings' rounding (~1e-7 relative); tests/cuda/test_cuda_prims.c compares at 2e-5
 * relative. Deterministic: the tile-to-warp map and every combination order are fixed.
 * Measured against the structures tried before it: bench/NOTES.md "The scores kernel". */
#include "mma.cuh"
#include "prim_common.cuh"
#include "attn_prep.cuh"

#define SC1_WARPS 8
#define SC1_TR 16     /* key rows of a staged tile (one m16 tile) */
#define SC1_MT (SC1_TR / 16) /* m16 tiles of a staged tile */
#define SC1_THREADS (SC1_WARPS * 32)
#define SC1_VOTE_BATCH 8 /* heads whose logits a column's thread loads at once */
#define SC1_GS_BATCH 4  /* heads whose resident logits a row's group sum loads at once */
#define SC1_GMAX 8      /* query heads per KV head handled here */
#define SC1_BLOCKS_SM 2 /* resident blocks a multiprocessor */
#define SC1_RES_SMEM (100 * 1024) /* dynamic shared memory a block at most with resident logits (2 an SM) */

struct sc1_args {
    const float *q;       /* (H, d) at q + h * qhs */
    const void *k;        /* KV head kv, key j at k + kv * khs + j * krs (elements) */
    const int32_t *kpos;  /* (n) or NULL = j */
    const int32_t *qpos;  /* (1) or NULL */
    int64_t hq, hkv, g, d, qhs, khs, krs, n;
    int64_t kb, ke, cb, w; /* key domain [kb, ke); logits computed for [cb, cb + w) */
    int64_t nx;           /* blocks per KV head (gridDim.x of sc1_logits) */
    int64_t wl;           /* the most keys a launch covers (w, or w + the growth): rows it may load */
    int iters;            /* loop steps a warp */
    float scale;
    int causal, softmax, gqa_mod;
    float *L;             /* (H, w), or NULL with res */
    int res;              /* 1: each block keeps its logits in shared memory (g, run) at byte ls_off, and the
                           * head sum goes through pv (see the file's comment) */
    int64_t run;          /* rows a block covers (SC1_WARPS * SC1_TR * iters) */
    size_t ls_off;        /* dynamic shared memory offset of the resident logits */
    float *pv;            /* (Hkv, w) with res: each KV head's group of heads summed (float) */
    float *pmax;          /* (H, nx) */
    double *psum;         /* (H, nx) */
    float *M;             /* (H) */
    double *iZ;           /* (H) */
    unsigned *done;       /* (Hkv + 4) blocks finished per KV head, then the grid barriers' arrivals and the
                           * blocks that left (two words; two more unused): zero at the launch, zero
                           * again after it */
    const float *skip;    /* NULL or one device float: nonzero = every block writes its share of zeros and
                           * leaves (ks_scores_opts.skip: no key read, no counter touched) */
    const int32_t *gd;    /* NULL, or (a recorded handler, ks_scores_opts.grow) the step slot's delta: the call
                           * covers w + (*gd - goff) keys, hi and ncols as much more (the split and the
                           * scratch sized for the growth) */
    int32_t goff;
    int rope;             /* 1: the queries rotated at rpos as they are read (ks_scores_opts.q_rope_inv) */
    int32_t rpos;
    float raf;
    float rinv[64];       /* (d / 2) */
};

/* The query's causal limit (key j is visible iff pos(j) <= it), as ks_cpu_scores: qpos[0], else
 * the last key's position; no limit without causal. */
static __device__ __forceinline__ int64_t sc1_lim(const sc1_args &a) {
    if (!a.causal) return INT64_MAX;
    return a.qpos ? (int64_t)a.qpos[0] : a.kpos ? (int64_t)a.kpos[a.n - 1] : a.n - 1;
}

static __device__ __forceinline__ int64_t sc1_head(const sc1_args &a, int64_t kv, int t) {
    return a.gqa_mod ? kv + (int64_t)t * a.hkv : kv * a.g + t;
}

/* e^x for x <= 0 from the multiprocessor's ex2.approx.f32 (subnormal results kept, unlike
 * __expf's .ftz): within ~2^-22 relative of expf plus x's rounding times log2(e), a few ulps
 * for the exponents the vote's top-k looks at, inside the CPU comparison's 2e-5; equal inputs
 * give equal bits, so exact ties stay ties. The group sums' accurate expf bounded that stage
 * (bench/NOTES.md, issue 14, session 31). */
static __device__ __forceinline__ float sc1_exp(float x) {
    float y;
    asm("ex2.approx.f32 %0, %1;" : "=f"(y) : "f"(x * 1.44269504088896341f));
    return y;
}

/* A head's term of a group sum (resident logits): 0 for a masked key (-inf), else e^(L - M_h) *
 * (float)(1 / Z_h) (softmax) or L (raw); the product is rounded before the caller adds it (never
 * fused into the add). */
static __device__ __forceinline__ float sc1_gv(float lg, float mh, float izf, int softmax) {
    return lg == -INFINITY ? 0.f : softmax ? __fmul_rn(sc1_exp(lg - mh), izf) : lg;
}

/* Head h's softmax over the whole row from the blocks' nx partials (pmax, psum), by the warp
 * that calls it: M_h the max of the partials' maxima, then Z_h = sum psum * exp(pmax - M_h),
 * each lane its partials (lane-strided) and the lanes in a fixed butterfly (a + b == b + a:
 * every lane ends with the same bits, and every caller with the same inputs too). No exp waits
 * for another: the merge tree before chained ten double exps (bench/NOTES.md, issue 14,
 * session 31). */
static __device__ __forceinline__ void sc1_combine(const sc1_args &a, int64_t h, int64_t nxk, int lane, float &M, double &Z) {
    constexpr int PR = 4; /* partials a lane keeps in registers (nx <= 128); more are read again */
    float pmr[PR];
    double psr[PR];
    float m = -INFINITY;
#pragma unroll
    for (int i = 0; i < PR; i++) {
        const int64_t b = lane + 32 * i;
        pmr[i] = b < nxk ? __ldcg(a.pmax + h * a.nx + b) : -INFINITY;
        psr[i] = b < nxk ? __ldcg(a.psum + h * a.nx + b) : 0.0;
        m = max_nan(m, pmr[i]);
    }
    for (int64_t b = lane + 32 * PR; b < nxk; b += 32) m = max_nan(m, __ldcg(a.pmax + h * a.nx + b));
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) m = max_nan(m, __shfl_xor_sync(0xffffffffu, m, o));
    double sm = 0;
    if (m != -INFINITY) {
#pragma unroll
        for (int i = 0; i < PR; i++)
            if (pmr[i] != -INFINITY) sm += psr[i] * exp((double)pmr[i] - (double)m);
        for (int64_t b = lane + 32 * PR; b < nxk; b += 32) {
            const float pm = __ldcg(a.pmax + h * a.nx + b);
            if (pm != -INFINITY) sm += __ldcg(a.psum + h * a.nx + b) * exp((double)pm - (double)m);
        }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) sm += __shfl_xor_sync(0xffffffffu, sm, o);
    M = m;
    Z = sm;
}

/* The query block as mma B fragments (k16 x n8, "col"): for chunk kc of 16 dimensions, split
 * part sp (q = hi + mid + lo, each bf16; together they carry float32's 24 bits) and lane l,
 * the words {q[n][c], q[n][c + 1]} and {q[n][c + 8], q[n][c + 9]} with n = l / 4 (the query
 * head within the KV head's group; 0 past g) and c = kc * 16 + (l % 4) * 2. */
static __device__ __forceinline__ uint32_t sc1_split(float x0, float x1, int sp) {
    float r0 = x0, r1 = x1;
    for (int i = 0; i < sp; i++) {
        r0 -= __bfloat162float(__float2bfloat16_rn(r0));
        r1 -= __bfloat162float(__float2bfloat16_rn(r1));
    }
    return pack_bf16(r0, r1);
}

/* The dimension that fragment column c (0..15) of 16-dimension chunk kc stands for, for lane
 * group gq = (c % 8) / 2: the mma sums over a chunk's columns, so any one-to-one map of the
 * dimensions gives the same dot products (in another float32 order), and this one lets a lane
 * take its A fragments straight from 16-byte loads of its rows: chunks 2p and 2p + 1 are the
 * 32 dimensions [32 p, 32 p + 32), lane group gq loads dimensions 32 p + 8 gq .. + 7 of both
 * its rows and gives chunk 2p + h the four at 32 p + 8 gq + 4 h (columns 2 gq, 2 gq + 1 the
 * first two, 2 gq + 8, 2 gq + 9 the other two); an odd last chunk takes dimensions 16 kc +
 * 4 gq .. + 3 from an 8-byte load. */
static __device__ __forceinline__ int sc1_dim(int kc, int gq, int nkc) {
    return kc < (nkc & ~1) ? 32 * (kc >> 1) + 8 * gq + 4 * (kc & 1) : 16 * kc + 4 * gq;
}

/* Output column x (key j = ob + x): the per-head values v_h = (float)(expf(L - M_h) / Z_h)
 * (softmax) or L (raw) and their reduction in double in ascending head order, as on the CPU.
 * The L loads of SC1_VOTE_BATCH heads are issued before any is used (L2 latency bounds this). */
static __device__ __forceinline__ void sc1_vote_col(const sc1_args &a, int64_t W, const double *iz, const float *mh,
                                                    int64_t ob, int64_t ncols, int64_t lo, int64_t hi, int heads,
                                                    float *__restrict__ out, int64_t x) {
    const int64_t j = ob + x;
    const bool in = j >= lo && j < hi;
    const float *lc = a.L + (j - a.cb);
    const int64_t rows = heads == KS_HEADS_GROUP_SUM ? a.hkv : 1;
    for (int64_t r = 0; r < rows; r++) {
        double s = 0;
        for (int64_t h0 = 0; h0 < a.hq; h0 += SC1_VOTE_BATCH) {
            float lg[SC1_VOTE_BATCH];
#pragma unroll
            for (int e = 0; e < SC1_VOTE_BATCH; e++) lg[e] = in && h0 + e < a.hq ? __ldcg(lc + (h0 + e) * W) : -INFINITY;
#pragma unroll
            for (int e = 0; e < SC1_VOTE_BATCH; e++) {
                const int64_t h = h0 + e;
                if (h >= a.hq) break;
                float v = lg[e] == -INFINITY ? 0.f : a.softmax ? (float)((double)expf(lg[e] - mh[h]) * iz[h]) : lg[e];
                if (heads == KS_HEADS_NONE) { out[h * ncols + x] = v; continue; }
                if (heads == KS_HEADS_GROUP_SUM && (a.gqa_mod ? h % a.hkv : h / a.g) != r) continue;
                s += v;
            }
        }
        if (heads != KS_HEADS_NONE) out[r * ncols + x] = (float)(heads == KS_HEADS_MEAN ? s / (double)a.hq : s);
    }
}

/* The k-th grid barrier of a launch (k = 1, 2): every block of the grid arrives before any goes
 * on (the launch is cooperative: all blocks are resident). c[0] counts the launch's arrivals
 * (one a block a barrier, never reset in between): thread 0 adds its block's with a release and
 * polls with acquire loads until k nb have come. Writes before it are visible after it to every
 * block (the readers load through L2, __ldcg). sc1_leave returns the words to zero. One add a
 * block a barrier and no sleep in the poll: 1.34 us a barrier on an H100 at 264 blocks, against
 * 1.94 us for the arrive / depart pair with fences and 64 ns sleeps it replaced (bench/NOTES.md,
 * issue 14, session 32, bench/results/s32/gridbar). */
static __device__ __forceinline__ void sc1_grid_sync(unsigned *c, unsigned nb, unsigned k) {
    __syncthreads();
    if (threadIdx.x == 0) {
        asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(c) : "memory");
        unsigned v;
        do asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(c) : "memory");
        while (v < k * nb);
    }
    __syncthreads();
}

/* A block that passed its last barrier leaves: c[1] counts them, and the last one returns c[0]
 * and c[1] to zero (no block polls any more), so the words are zero at rest
 * (ks_cuda_scratch.counters). */
static __device__ __forceinline__ void sc1_leave(unsigned *c, unsigned nb) {
    if (threadIdx.x == 0) {
        unsigned o;
        asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], 1;" : "=r"(o) : "l"(c + 1) : "memory");
        if (o == nb - 1) {
            c[0] = 0;
            c[1] = 0;
        }
    }
}

static __host__ __device__ constexpr size_t sc1_frag_bytes(int nkc) { return sizeof(uint2) * 3 * (size_t)nkc * 32; }

/* Block = a run of rows of one KV head, SC1_WARPS warps. Each warp takes the tiles w, w + W,
 * w + 2W, ... of the run (SC1_TR = 16 rows each: one m16 tile) and loads them straight into
 * registers, lane l rows l / 4 and l / 4 + 8 (16-byte pieces, so a warp load is eight rows' 64
 * contiguous bytes), the next tile's loads in flight while this one meets the group's query
 * heads as the n8 tile (three mma a 16-dimension chunk: the query's three bf16 parts, in
 * sc1_dim's order). No shared memory holds keys and no barrier runs in the loop (a per-warp
 * cp.async ring through shared memory read the keys slower: bench/NOTES.md, issue 14, session
 * 19). Lane l holds rows l / 4 (+ 8) for heads 2 (l % 4) and 2 (l % 4) + 1, and keeps one
 * online softmax partial per head it holds: per tile the max of its visible logits, the running
 * sum in double rescaled when the max grows, the tile's terms summed in float first. NKC: the
 * 16-dimension chunks of a row (d = 16 NKC <= 128). */
template <int NKC>
__global__ void __launch_bounds__(SC1_THREADS, SC1_BLOCKS_SM) sc1_logits(const sc1_args a, int64_t ob, int64_t ncols0, int64_t lo,
                                                                          int64_t hi0, int heads, float *__restrict__ out) {
    constexpr int NP = NKC / 2, ODD = NKC & 1; /* 32-dimension pairs of chunks; an odd last chunk */
    /* the keys, reported columns and their end as recorded, plus the rows added since (a.gd) */
    const int64_t dl = a.gd ? (int64_t)(*a.gd - a.goff) : 0;
    const int64_t W = a.w + dl, ncols = ncols0 + dl, hi = hi0 + dl;
    /* the split of the rows is the host's, made for the most keys (a.wl): the rows a block
     * covers are a plain call's of W keys wherever both take the same loop count, and a block
     * past W adds an empty partial (no change to any sum): the same bits */
    const int iters = a.iters;
    const int64_t nxk = a.nx, run = a.run;
    if (a.skip && *a.skip != 0.0f) { /* the same decision in every block: zeros, and no barrier is reached */
        const int64_t rows = heads == KS_HEADS_NONE ? a.hq : heads == KS_HEADS_GROUP_SUM ? a.hkv : 1;
        const int64_t nthr = (int64_t)gridDim.x * gridDim.y * SC1_THREADS;
        for (int64_t e = ((int64_t)blockIdx.y * gridDim.x + blockIdx.x) * SC1_THREADS + threadIdx.x; e < rows * ncols; e += nthr)
            out[e] = 0.0f;
        return;
    }
    extern __shared__ __align__(16) unsigned char smem[];
    __shared__ float wm[SC1_WARPS][8];
    __shared__ double ws[SC1_WARPS][8];
    __shared__ float bm[8];
    __shared__ int last;
    const int g = (int)a.g, lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nkc = NKC;
    const int gq = lane & 3, rl = lane >> 2; /* lane group; the lane's rows rl, rl + 8 of a tile */
    uint2 *Bf = (uint2 *)smem; /* (3, nkc, 32) fragments */
    const int64_t kv = blockIdx.y;
    const int64_t r0b = (int64_t)blockIdx.x * SC1_WARPS * SC1_TR * iters; /* the block's first row */
    const unsigned char *kbase = (const unsigned char *)a.k + (size_t)(kv * a.khs + a.cb * a.krs) * 2;
    const size_t rbytes = (size_t)a.krs * 2;
    const int64_t lim = sc1_lim(a);

    auto base_of = [&](int t) { return r0b + ((int64_t)t * SC1_WARPS + warp) * SC1_TR; };
    uint4 cur[2][NP > 0 ? NP : 1], nxt[2][NP > 0 ? NP : 1];
    uint2 ctl[2], ntl[2];
    /* tile t's rows into (p, tl): zeros past w or past the warp's tiles */
    auto load = [&](int t, uint4 (&p)[2][NP > 0 ? NP : 1], uint2 (&tl)[2]) {
        const int64_t base = base_of(t);
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int64_t row = base + rl + 8 * h;
            const bool in = t < iters && row < a.wl; /* rows up to wl exist: loads need not wait for W */
            const unsigned char *rp = kbase + (size_t)(in ? row : 0) * rbytes;
#pragma unroll
            for (int pp = 0; pp < NP; pp++)
                p[h][pp] = in ? __ldcs((const uint4 *)(rp + 64 * pp + 16 * gq)) : make_uint4(0u, 0u, 0u, 0u);
            if (ODD) tl[h] = in ? __ldcs((const uint2 *)(rp + 64 * NP + 8 * gq)) : make_uint2(0u, 0u);
        }
    };
    /* the group's g query rows into shared memory, rotated (a.rope) or as they are, a rotate-half
     * pair (k, k + d / 2) a thread in turn, before the fragments are cut from them (the region the
     * vote uses later). Their loads are issued before the first tile's 4 KB a warp, which they
     * waited behind before (a 32K call's prologue 5.8 -> 5.3 us; the query still comes back ~2.6
     * us after its loads leave: bench/NOTES.md, issue 14, session 34) */
    constexpr int QPT = (SC1_GMAX * 64 + SC1_THREADS - 1) / SC1_THREADS; /* pairs a thread at most (d <= 128) */
    float *qrot = (float *)(smem + sc1_frag_bytes(NKC)); /* (g, d) */
    const int qd = (int)a.d, qhalf = qd / 2;
    float qa[QPT], qb[QPT];
#pragma unroll
    for (int i = 0; i < QPT; i++) {
        const int e = (int)threadIdx.x + SC1_THREADS * i, n = e / qhalf, k = e - n * qhalf;
        const float *qr = a.q + sc1_head(a, kv, e < g * qhalf ? n : 0) * a.qhs;
        qa[i] = e < g * qhalf ? qr[k] : 0.f;
        qb[i] = e < g * qhalf ? qr[k + qhalf] : 0.f;
    }
    load(0, cur, ctl);
#pragma unroll
    for (int i = 0; i < QPT; i++) {
        const int e = (int)threadIdx.x + SC1_THREADS * i, n = e / qhalf, k = e - n * qhalf;
        if (e >= g * qhalf) break;
        if (a.rope) {
            ks_rope_rot(qa[i], qb[i], a.rpos, a.rinv[k], a.raf, &qrot[n * qd + k], &qrot[n * qd + k + qhalf]);
        } else {
            qrot[n * qd + k] = qa[i];
            qrot[n * qd + k + qhalf] = qb[i];
        }
    }
    __syncthreads();
    for (int e = threadIdx.x; e < 3 * nkc * 32; e += SC1_THREADS) {
        const int sp = e / (nkc * 32), kc = (e / 32) % nkc, l = e % 32, n = l / 4, c = sc1_dim(kc, l % 4, nkc);
        uint2 v = make_uint2(0u, 0u);
        if (n < g) {
            const float *qr = qrot + n * qd;
            v.x = sc1_split(qr[c], qr[c + 1], sp);
            v.y = sc1_split(qr[c + 2], qr[c + 3], sp);
        }
        Bf[e] = v;
    }
    __syncthreads();

    float pm[2] = {-INFINITY, -INFINITY}; /* per head this lane holds (2 (l % 4) + p) */
    double ps[2] = {0, 0};
    for (int t = 0; t < iters; t++) {
        const int64_t base = base_of(t); /* offset in [0, w) */
        if (base >= W) break;
        load(t + 1, nxt, ntl); /* the next tile in flight while this one is computed */
        float acc[SC1_MT][4];
#pragma unroll
        for (int mt = 0; mt < SC1_MT; mt++) {
#pragma unroll
            for (int e = 0; e < 4; e++) acc[mt][e] = 0.f;
        }
#pragma unroll
        for (int kc = 0; kc < NKC; kc++) {
            uint32_t af[SC1_MT][4];
            if (kc < 2 * NP) {
                const uint4 &p0 = cur[0][kc >> 1], &p8 = cur[1][kc >> 1];
                const int h = kc & 1;
                af[0][0] = h ? p0.z : p0.x;
                af[0][1] = h ? p8.z : p8.x;
                af[0][2] = h ? p0.w : p0.y;
                af[0][3] = h ? p8.w : p8.y;
            } else {
                af[0][0] = ctl[0].x, af[0][1] = ctl[1].x, af[0][2] = ctl[0].y, af[0][3] = ctl[1].y;
            }
#pragma unroll
            for (int sp = 2; sp >= 0; sp--) { /* the small parts first */
                const uint2 b = Bf[(sp * nkc + kc) * 32 + lane];
#pragma unroll
                for (int mt = 0; mt < SC1_MT; mt++) mma16816(acc[mt], af[mt], b.x, b.y);
            }
        }
#pragma unroll
        for (int h = 0; h < 2; h++) {
#pragma unroll
            for (int pp = 0; pp < NP; pp++) cur[h][pp] = nxt[h][pp];
            ctl[h] = ntl[h];
        }
        /* logits, L, and the partials of the two heads this lane holds */
#pragma unroll
        for (int p = 0; p < 2; p++) {
            const int hh = (lane & 3) * 2 + p;
            if (hh >= g) continue;
            const int64_t h = sc1_head(a, kv, hh);
            float l[2 * SC1_MT];
#pragma unroll
            for (int q = 0; q < 2 * SC1_MT; q++) { /* (mt, half) = (q >> 1, q & 1): row mt * 16 + lane / 4 + 8 half */
                const int64_t row = base + (q >> 1) * 16 + (lane >> 2) + (q & 1) * 8, j = a.cb + row;
                bool vis = row < W;
                if (vis && a.causal) vis = (a.kpos ? (int64_t)a.kpos[j] : j) <= lim;
                l[q] = vis ? a.scale * acc[q >> 1][(q & 1) * 2 + p] : -INFINITY;
                if (row < W) {
                    if (a.res) ((float *)(smem + a.ls_off))[hh * run + (row - r0b)] = l[q];
                    else a.L[h * W + row] = l[q];
                }
            }
            if (!a.softmax) continue;
            float mx = l[0];
#pragma unroll
            for (int q = 1; q < 2 * SC1_MT; q++) mx = max_nan(mx, l[q]);
            if (mx > pm[p] || isnan(mx)) {
                if (pm[p] != -INFINITY) ps[p] *= (double)expf(pm[p] - mx);
                pm[p] = mx;
            }
            if (pm[p] != -INFINITY) {
                float z = 0.f;
#pragma unroll
                for (int q = 0; q < 2 * SC1_MT; q++)
                    if (l[q] != -INFINITY) z += expf(l[q] - pm[p]);
                ps[p] += (double)z;
            }
        }
    }
    if (a.softmax && W > 0) {
        /* the block's partial per head: the max over the lanes holding it (l % 4 fixed: xor 4, 8,
         * 16) and over the warps, then the lanes' sums rescaled to it, each in a fixed order */
#pragma unroll
        for (int p = 0; p < 2; p++) {
            float m = pm[p];
#pragma unroll
            for (int o = 4; o < 32; o <<= 1) m = max_nan(m, __shfl_xor_sync(0xffffffffu, m, o));
            if (lane < 4) wm[warp][lane * 2 + p] = m;
        }
        __syncthreads();
        if ((int)threadIdx.x < g) {
            float m = wm[0][threadIdx.x];
            for (int w = 1; w < SC1_WARPS; w++) m = max_nan(m, wm[w][threadIdx.x]);
            bm[threadIdx.x] = m;
        }
        __syncthreads();
#pragma unroll
        for (int p = 0; p < 2; p++) {
            const int hh = (lane & 3) * 2 + p;
            const float mb = hh < g ? bm[hh] : 0.f;
            double z = hh < g && pm[p] != -INFINITY ? ps[p] * (double)expf(pm[p] - mb) : 0.0;
#pragma unroll
            for (int o = 4; o < 32; o <<= 1) z += __shfl_xor_sync(0xffffffffu, z, o);
            if (lane < 4) ws[warp][lane * 2 + p] = z;
        }
        __syncthreads();
        if ((int)threadIdx.x < g) {
            const int t = threadIdx.x;
            double sm = 0;
            for (int w = 0; w < SC1_WARPS; w++) sm += ws[w][t];
            const int64_t h = sc1_head(a, kv, t);
            a.pmax[h * a.nx + blockIdx.x] = bm[t];
            a.psum[h * a.nx + blockIdx.x] = sm;
        }
        if (!a.res) {
            /* the columns' vote needs every head's M_h and 1 / Z_h: the last block of each KV head
             * to finish (an atomic counter) combines that head group's partials for all */
            __threadfence();
            __syncthreads();
            if (threadIdx.x == 0) last = atomicAdd(&a.done[kv], 1u) == (unsigned)(nxk - 1);
            __syncthreads();
            if (last) {
                if (threadIdx.x == 0) a.done[kv] = 0; /* every block of this KV head has counted: zero at rest again */
                __threadfence();
                for (int t = warp; t < g; t += SC1_WARPS) {
                    const int64_t h = sc1_head(a, kv, t);
                    float m;
                    double sm;
                    sc1_combine(a, h, nxk, lane, m, sm);
                    if (lane == 0) {
                        a.M[h] = m;
                        a.iZ[h] = 1.0 / sm;
                    }
                }
            }
        }
    }
    sc1_grid_sync(a.done + a.hkv, gridDim.x * gridDim.y, 1);

    /* every block: M_h and 1 / Z_h of every head, then its share of the output columns */
    double *iz = (double *)(smem + sc1_frag_bytes(NKC)); /* (H) 1 / Z_h, then (H) M_h as float */
    float *mh = (float *)(iz + a.hq);
    if (a.softmax && W > 0) {
        if (a.res) { /* only this KV head's g heads: each block combines their partials itself (the
                      * same bits in every block), indexed t = 0..g-1 */
            if (warp < g) {
                float m;
                double sm;
                sc1_combine(a, sc1_head(a, kv, warp), nxk, lane, m, sm);
                if (lane == 0) {
                    iz[warp] = 1.0 / sm;
                    mh[warp] = m;
                }
            }
        } else {
            for (int64_t h = threadIdx.x; h < a.hq; h += SC1_THREADS) {
                iz[h] = __ldcg(a.iZ + h);
                mh[h] = __ldcg(a.M + h);
            }
        }
    }
    __syncthreads();
    const int64_t nthr = (int64_t)gridDim.x * gridDim.y * SC1_THREADS;
    const int64_t x0 = ((int64_t)blockIdx.y * gridDim.x + blockIdx.x) * SC1_THREADS + threadIdx.x;
    if (a.res) {
        /* each block: its rows' group sums from its own logits, then every block a share of the
         * columns: the Hkv group sums in ascending KV head order (a second barrier between) */
        const float *Ls = (const float *)(smem + a.ls_off);
        float izf[SC1_GMAX], mhg[SC1_GMAX]; /* the group's heads: 1 / Z_h rounded to float, M_h */
#pragma unroll
        for (int t = 0; t < SC1_GMAX; t++) {
            izf[t] = t < g && a.softmax ? (float)iz[t] : 0.f;
            mhg[t] = t < g && a.softmax ? mh[t] : 0.f;
        }
        /* two rows a thread at a time and four heads at once, every load issued before any is
         * used (the head-by-head form waited for each head's load and exponential in turn: one
         * dependent chain a row). Where every M_h of the group is finite (so Z_h >= 1), a masked
         * key's term e^(-inf - M_h) * (1 / Z_h) is already +0 and a head past g adds e^(-inf) * 0
         * = +0, so the terms need no test; otherwise (and for raw logits) each is tested as
         * before. The same sums in the same order: the same bits. */
        const int64_t rend = KS_MIN(run, W - r0b);
        bool fin = a.softmax != 0;
#pragma unroll
        for (int t = 0; t < SC1_GMAX; t++)
            if (t < g) fin = fin && isfinite(mhg[t]);
        if (fin) {
            for (int64_t r = threadIdx.x; r < rend; r += 2 * SC1_THREADS) {
                const int64_t r1 = r + SC1_THREADS, j0 = a.cb + r0b + r, j1 = j0 + SC1_THREADS;
                const bool in0 = j0 >= lo && j0 < hi, in1 = r1 < rend && j1 >= lo && j1 < hi;
                float s0 = 0.f, s1 = 0.f;
#pragma unroll
                for (int t0 = 0; t0 < SC1_GMAX; t0 += SC1_GS_BATCH) {
                    if (t0 >= g) break;
                    float l0[SC1_GS_BATCH], l1[SC1_GS_BATCH];
#pragma unroll
                    for (int e = 0; e < SC1_GS_BATCH; e++) {
                        const bool h = t0 + e < g;
                        l0[e] = h && in0 ? Ls[(t0 + e) * run + r] : -INFINITY;
                        l1[e] = h && in1 ? Ls[(t0 + e) * run + r1] : -INFINITY;
                    }
#pragma unroll
                    for (int e = 0; e < SC1_GS_BATCH; e++) {
                        s0 += __fmul_rn(sc1_exp(l0[e] - mhg[t0 + e]), izf[t0 + e]); /* not fused into the add: */
                        s1 += __fmul_rn(sc1_exp(l1[e] - mhg[t0 + e]), izf[t0 + e]); /* the same rounding as before */
                    }
                }
                a.pv[kv * W + r0b + r] = s0;
                if (r1 < rend) a.pv[kv * W + r0b + r1] = s1;
            }
        } else {
            for (int64_t r = threadIdx.x; r < rend; r += SC1_THREADS) {
                const int64_t j = a.cb + r0b + r;
                float sg = 0.f;
                if (j >= lo && j < hi)
#pragma unroll
                    for (int t = 0; t < SC1_GMAX; t++) {
                        if (t >= g) break;
                        sg += sc1_gv(Ls[t * run + r], mhg[t], izf[t], a.softmax);
                    }
                a.pv[kv * W + r0b + r] = sg;
            }
        }
        sc1_grid_sync(a.done + a.hkv, gridDim.x * gridDim.y, 2);
        /* two columns a thread at a time, the loads of both batches issued at once */
        for (int64_t x = x0; x < ncols; x += 2 * nthr) {
            const int64_t x1 = x + nthr, j0 = ob + x, j1 = ob + x1, c0 = j0 - a.cb, c1 = j1 - a.cb;
            const bool ok0 = j0 >= lo && j0 < hi && c0 >= 0 && c0 < W;
            const bool ok1 = x1 < ncols && j1 >= lo && j1 < hi && c1 >= 0 && c1 < W;
            double s0 = 0, s1 = 0;
            for (int64_t r0 = 0; r0 < a.hkv; r0 += SC1_VOTE_BATCH) {
                float p0[SC1_VOTE_BATCH], p1[SC1_VOTE_BATCH];
#pragma unroll
                for (int e = 0; e < SC1_VOTE_BATCH; e++) {
                    const bool h = r0 + e < a.hkv;
                    p0[e] = h && ok0 ? __ldcg(a.pv + (r0 + e) * W + c0) : 0.f;
                    p1[e] = h && ok1 ? __ldcg(a.pv + (r0 + e) * W + c1) : 0.f;
                }
#pragma unroll
                for (int e = 0; e < SC1_VOTE_BATCH; e++)
                    if (r0 + e < a.hkv) {
                        s0 += (double)p0[e];
                        s1 += (double)p1[e];
                    }
            }
            out[x] = (float)(heads == KS_HEADS_MEAN ? s0 / (double)a.hq : s0);
            if (x1 < ncols) out[x1] = (float)(heads == KS_HEADS_MEAN ? s1 / (double)a.hq : s1);
        }
        sc1_leave(a.done + a.hkv, gridDim.x * gridDim.y);
        return;
    }
    for (int64_t x = x0; x < ncols; x += nthr)
        sc1_vote_col(a, W, iz, mh, ob, ncols, lo, hi, heads, out, x);
    sc1_leave(a.done + a.hkv, gridDim.x * gridDim.y);
}

/* the query fragments, then (g, d) rotated query rows (a rotation) or later (H) 1 / Z_h as double
 * and (H) M_h as float */
static size_t sc1_smem(int64_t d, int64_t hq) {
    return sc1_frag_bytes((int)(d / 16)) + KS_MAX((sizeof(double) + sizeof(float)) * (size_t)hq, sizeof(float) * SC1_GMAX * (size_t)d);
}

extern "C" int ks_cuda_scores1_fits(int64_t n_q_heads, int64_t n_kv_heads, int64_t m, const void *k, int k_bf16,
                                    int64_t d, const sc_plan &p) {
    if (m != 1 || !k_bf16 || n_kv_heads < 1 || n_q_heads % n_kv_heads || n_q_heads / n_kv_heads > SC1_GMAX) return 0;
    return d % 16 == 0 && d <= 128 && !((uintptr_t)k & 15) && p.khs % 8 == 0 &&
           p.krs % 8 == 0;
}

/* The caller (ks_cuda_scores) has checked the arguments and ks_cuda_scores1_fits. */
ks_status ks_cuda_scores1(cudaStream_t s, const ks_cuda_scratch *sc, const float *q, const int32_t *qpos,
                          int64_t n_q_heads, const void *k, const int32_t *kpos, int64_t n_kv_heads, int64_t n,
                          int64_t d, const sc_plan &p, int64_t ncols, float *out) {
    sc1_args a;
    memset(&a, 0, sizeof a);
    a.q = q;
    a.k = k;
    a.kpos = kpos;
    a.qpos = qpos;
    a.hq = n_q_heads;
    a.hkv = n_kv_heads;
    a.g = n_q_heads / n_kv_heads;
    a.d = d;
    a.n = n;
    a.qhs = p.qhs;
    a.khs = p.khs;
    a.krs = p.krs;
    a.kb = p.kb;
    a.ke = p.ke;
    a.scale = p.scale;
    a.causal = p.causal;
    a.softmax = p.softmax;
    a.gqa_mod = p.gqa_mod;
    a.skip = p.skip;
    if (p.rinv) { /* d <= 128 here (ks_cuda_scores1_fits) */
        a.rope = 1;
        a.rpos = p.rpos;
        a.raf = p.raf;
        memcpy(a.rinv, p.rinv, sizeof(float) * (size_t)(d / 2));
    }
    const int64_t ob = p.ob, lo = p.lo, hi = p.hi;
    a.cb = p.cb;
    a.w = hi > lo ? p.ce - p.cb : 0; /* nothing reported: no logits needed */
    if (p.gd && a.w == 0) return KS_ERR_UNSUPPORTED; /* a growing call reports from its recording on */
    a.gd = p.gd;
    a.goff = p.goff;
    const int64_t wp = a.w + (p.gd ? p.grow : 0); /* the most keys a run of this launch covers */

    scratch_set ss(sc);
    /* one wave of at most SC1_BLOCKS_SM blocks a multiprocessor over all KV heads (all resident:
     * the launch is cooperative, the blocks meet at a grid barrier), each warp looping over
     * a.iters tiles */
    int dev = 0, n_sm = 0, occ = 0;
    KS_CU(cudaGetDevice(&dev), "scores (one row) device");
    KS_CU(cudaDeviceGetAttribute(&n_sm, cudaDevAttrMultiProcessorCount, dev), "scores (one row) device");
    void (*kern)(const sc1_args, int64_t, int64_t, int64_t, int64_t, int, float *) = nullptr;
    switch (d / 16) {
    case 1: kern = sc1_logits<1>; break;
    case 2: kern = sc1_logits<2>; break;
    case 3: kern = sc1_logits<3>; break;
    case 4: kern = sc1_logits<4>; break;
    case 5: kern = sc1_logits<5>; break;
    case 6: kern = sc1_logits<6>; break;
    case 7: kern = sc1_logits<7>; break;
    default: kern = sc1_logits<8>; break;
    }
    size_t sm = sc1_smem(d, n_q_heads);
    KS_CU(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, kern, SC1_THREADS, sm), "scores (one row) occupancy");
    const int64_t cap = (int64_t)n_sm * KS_MIN(occ, SC1_BLOCKS_SM); /* blocks that can be resident at once */
    if (n_kv_heads > cap) return KS_ERR_UNSUPPORTED; /* a block a KV head cannot all be resident: the general kernel */
    const int64_t step = (int64_t)SC1_WARPS * SC1_TR; /* rows a block's loop step */
    const int64_t want = KS_MAX((int64_t)1, cap / n_kv_heads);
    if (a.w > 0) {
        a.iters = (int)KS_MAX((int64_t)1, (wp + want * step - 1) / (want * step));
        a.nx = (wp + step * a.iters - 1) / (step * a.iters); /* blocks per KV head */
        a.run = step * a.iters;
        a.wl = wp;
        /* the logits resident: for a head sum, where a block's (g, run) floats fit beside the rest
         * at the same blocks a multiprocessor */
        const size_t ls = sizeof(float) * (size_t)a.g * (size_t)a.run, sm_res = (sm + 15) / 16 * 16 + ls;
        if ((p.heads == KS_HEADS_SUM || p.heads == KS_HEADS_MEAN) && sm_res <= SC1_RES_SMEM) {
            int occ_res = 0;
            /* always the same cap (never a call's own size), so that two threads launching this
             * kernel at once cannot lower it under each other's launch */
            cudaError_t e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, SC1_RES_SMEM);
            if (e == cudaSuccess) e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ_res, kern, SC1_THREADS, sm_res);
            if (e != cudaSuccess) cudaGetLastError(); /* not taken: the logits go through global memory */
            else if (KS_MIN(occ_res, SC1_BLOCKS_SM) >= KS_MIN(occ, SC1_BLOCKS_SM)) {
                a.res = 1;
                a.ls_off = (sm + 15) / 16 * 16;
                sm = sm_res;
            }
        }
        if (a.res) P_SCRATCH(a.pv, ss, sizeof(float) * n_kv_heads * wp, "scores");
        else P_SCRATCH(a.L, ss, sizeof(float) * n_q_heads * wp, "scores");
        if (a.softmax) {
            P_SCRATCH(a.pmax, ss, sizeof(float) * n_q_heads * a.nx, "scores");
            P_SCRATCH(a.psum, ss, sizeof(double) * n_q_heads * a.nx, "scores");
            P_SCRATCH(a.M, ss, sizeof(float) * n_q_heads, "scores");
            P_SCRATCH(a.iZ, ss, sizeof(double) * n_q_heads, "scores");
        }
    } else {
        a.nx = KS_MIN(want, KS_MAX((int64_t)1, ncols / ((int64_t)SC1_THREADS * n_kv_heads))); /* the output columns alone */
    }
    if (sc->counters && sc->n_counters >= n_kv_heads + 4) {
        a.done = sc->counters; /* zero at rest: no memset */
    } else {
        P_SCRATCH(a.done, ss, sizeof(unsigned) * (n_kv_heads + 4), "scores");
        KS_CU(cudaMemsetAsync(a.done, 0, sizeof(unsigned) * (n_kv_heads + 4), s), "scores (one row) counters");
    }
    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeCooperative;
    at[0].val.cooperative = 1;
    cfg.gridDim = dim3((unsigned)a.nx, (unsigned)a.hkv);
    cfg.blockDim = dim3(SC1_THREADS);
    cfg.dynamicSmemBytes = sm;
    cfg.stream = s;
    cfg.attrs = at;
    cfg.numAttrs = 1;
    const int heads = p.heads;
    KS_CU(cudaLaunchKernelEx(&cfg, kern, a, ob, ncols, lo, hi, heads, out), "scores (one row) kernel");
    return KS_OK;
}
