/* attn_decode_tc.cu — see attn_decode_tc.cuh.
 *
 * Block = (split of the keys, KV head). Its M = n * g query rows (row r = i * g + hh: query row
 * i, head hh of the group) are one m16 tile held as bf16 A fragments in every warp. Warp w of
 * the block takes the 16-key tiles w, w + 4, w + 8, ... of the split, each staged through its
 * own ring of NS shared-memory stages with cp.async (zero-filled past the end), and keeps its own
 * online-softmax state (log2 domain). Over the cache rows (LST false) NS is 2. Over a list (an
 * index list and / or row ranges: LST) the warp first looks up the rows of its next TC_RB tiles
 * at once (four independent index loads a lane, into shared memory), so no tile's copies wait on
 * an index load, and NS is TC_LIST_STAGES: a list's few tiles a warp are all in flight (Quest's
 * 4096-row lists: 13.1 -> 10.7 us a call, bench/NOTES.md, issue 14 session 22). A list's tiles
 * are staged unswizzled with a 16-byte pad a row (tc_kp), so each lane's copies of a tile go
 * to fixed offsets with no per-chunk index arithmetic (the swizzled copy loop took ~630
 * instructions a warp a tile, ncu), and the tile's table rows (RM 2) are one contiguous run:
 * TokenSelect's list attention 15.9 / 16.2 -> 14.0 / 14.1 us a call at 32K / 128K on the H100
 * (bench/NOTES.md, issue 14 session 33). At the end the four warps' (max, sum, O) are merged
 * in shared memory and the block writes either the final rows or an unnormalised partial for
 * attn_combine (attn_decode.cu).
 *
 * ROPE (pre-RoPE q and keys): the prologue rotates each query row in float32 before rounding it
 * to bf16, and each warp rotates its staged key tile in shared memory in place, once its copies
 * have landed: a lane takes 16-byte chunk ch of the first half of a row and its rotate-half
 * partner ch + NCH / 2 (ch = lane % (NCH / 2) for every row it takes, so its 8 frequencies stay
 * in registers), 32 sincosf a lane per 16-key tile at d = 128, each (key, frequency) once. The
 * tile then holds exactly the rows ks_cuda_attn_gather would have written, and the loop below
 * is the same as without ROPE. With a table over a renumbered list (RM 2) a tile whose 16 slots
 * all lie inside the table reads its (c, s) from the staged table rows; any other tile goes
 * through tc_rot_tile (sincosf, the same bits), out of line so that the loop's code stays
 * small (the instruction cache was the first stall of the inlined version, ncu, session 33).
 * The rotation is the costly part (sincosf, each with its branch to the slow path, back to back
 * in a lane), so the ROPE kernels stay at the registers of 3 blocks an SM (__launch_bounds__)
 * and a call over a list takes more splits than one block an SM
 * (ks_cuda_attn_decode_tc_list_splits): more resident warps to hide it.
 *
 * PREFETCH (p.pf, list instances): before anything else thread 0 of each block issues L2 bulk
 * prefetches of its share of p.pf_bytes (TC_PF_PIECE at a time). A joined decode step sets it
 * (ks_cuda_attn_decode_tc_node_edge) where the blocks start behind a policy's top-k and wait for it
 * with the DRAM idle: the layer's o-projection, which the gemv after this attention then reads
 * from L2 (TokenSelect's TPOT on an H100 -0.05 ms at 32K, -0.1 ms at 128K: bench/NOTES.md, issue
 * 14, session 37). A list's K and V rows are read once, so their copies carry an L2 evict-first
 * policy, and more of the prefetched lines outlive them: under ncu the gemv reads 19.9-20.7 MB
 * of the matrix's 33.5 from DRAM, against 22.0-24.8 without the policy, and TokenSelect's TPOT at
 * 128K falls ~0.2 ms (session 39). Keeping the prefetch itself at evict-last lost more than it
 * kept (session 39).
 *
 * ONE TILE A WARP (RM 2 lists, NS 1): a renumbered list over the rope table takes as many splits
 * as its 64-row quanta where three blocks an SM hold them all (ks_cuda_attn_decode_tc_list_splits),
 * so every warp computes one tile and all of them at once (TokenSelect's 2688 rows at 32K: 42
 * splits a KV head; the list attention -1.5 to -2 us a call on an H100, bench/NOTES.md, issue 14,
 * session 38). A block whose keys all lie in the row ranges reads no list and skips
 * griddepcontrol.wait: behind a policy's top-k it computes while the top-k runs. */
#include "common.cuh"
#include "attn_decode_tc.cuh"
#include "mma.cuh"
#include "pdl.cuh"
#include "attn_prep.cuh"
#include "rope_table.cuh"

#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define TC_WARPS 4
#define TC_KT 16     /* keys per warp tile */
#define TC_RB 8      /* tiles whose rows a warp looks up at once (list calls) */
/* stages a warp keeps in flight: 2 over the cache rows (one block an SM streams them best), more
 * over a list, whose rows come from anywhere and whose few tiles a warp should all be loading at
 * once (bench/NOTES.md, issue 14 session 22) */
/* bytes of one L2 bulk prefetch of the next weights (ks_cuda_attn_params.pf): pieces of 256 KB were
 * served, one of 2 MB dropped (bench/NOTES.md, issue 14 session 32) */
#define TC_PF_PIECE ((size_t)128 * 1024)
#define TC_LIST_STAGES 3 /* 2 and 4 within 2% of it (session 22, bench/results/s22/alist-h200) */

/* RM, how the kernel treats pre-RoPE inputs: 0 none (rows already rotated), 1 rotated with
 * sincosf, 2 rotated with the (cos, sin) table of kernels/rope_table.cuh where it applies */
/* bf16 elements from one staged K or V row to the next: D over the cache rows (16-byte chunks
 * XOR-swizzled, swz), D + 8 over a list (rows unswizzled, so a lane's copies land at fixed
 * offsets: the 16-byte pad puts the 8 rows an ldmatrix reads on distinct banks) */
template <int D, bool LST> static __host__ __device__ constexpr int tc_kp() { return LST ? D + 8 : D; }
/* bytes of one warp's region (a multiple of 16): NS stages x (K, V tiles) + key positions + the
 * rows of TC_RB tiles (+ RM 2: stages x the tile's table rows, KT x D / 4 float4s) */
template <int D, int RM, int NS, bool LST> static __host__ __device__ constexpr size_t tc_wregion() {
    return (size_t)NS * (2 * TC_KT * tc_kp<D, LST>() * 2) + NS * TC_KT * 4 + TC_RB * TC_KT * 4 +
           (RM == 2 ? (size_t)NS * TC_KT * D * 4 : 0);
}
template <int D, int RM, int NS, bool LST> static constexpr size_t tc_smem() {
    return (size_t)16 * D * 2 + TC_WARPS * tc_wregion<D, RM, NS, LST>() + TC_WARPS * 16 * 2 * 4;
}

/* one query row's key counts, list offsets and position by value (ks_cuda_attn_decode_tc1,
 * _tc_list): on == 0 reads p.nk / p.idx_off / p.qpos from device memory instead */
struct tc_byval {
    int on, qpos;
    int nk[KS_CUDA_ATTN_BYVAL_HEADS];
    int off[KS_CUDA_ATTN_BYVAL_HEADS]; /* on: start of each head's list in p.idx */
    const int32_t *dyn; /* on: NULL, or device {qpos, delta}: qpos from here, delta added to nk */
};

/* the rope frequencies by value: only the ROPE kernels carry them */
template <int RM> struct tc_rope { ks_cuda_attn_rope r; };
template <> struct tc_rope<0> { int unused; };

static __device__ __forceinline__ float bf_lo(uint32_t x) { return __uint_as_float(x << 16); }
static __device__ __forceinline__ float bf_hi(uint32_t x) { return __uint_as_float(x & 0xffff0000u); }

/* x: 4 x 2 bf16 columns c..c+7 of the first half, y: their partners; f: the 8 frequencies */
static __device__ __forceinline__ void rot8(uint32_t *x, uint32_t *y, int32_t pos, const float *f, float af) {
#pragma unroll
    for (int i = 0; i < 4; i++) {
        float a0, a1, c0, c1;
        ks_rope_rot(bf_lo(x[i]), bf_lo(y[i]), pos, f[2 * i], af, &a0, &c0);
        ks_rope_rot(bf_hi(x[i]), bf_hi(y[i]), pos, f[2 * i + 1], af, &a1, &c1);
        x[i] = pack_bf16(a0, a1);
        y[i] = pack_bf16(c0, c1);
    }
}

/* the same with the 8 (c, s) pairs of one table row chunk: cs[i] = (c, s) of columns 2i, 2i + 1 */
static __device__ __forceinline__ void rot8_cs(uint32_t *x, uint32_t *y, const float4 *cs) {
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const float4 f = cs[i];
        float a0, a1, c0, c1;
        ks_rope_apply(bf_lo(x[i]), bf_lo(y[i]), f.x, f.y, &a0, &c0);
        ks_rope_apply(bf_hi(x[i]), bf_hi(y[i]), f.z, f.w, &a1, &c1);
        x[i] = pack_bf16(a0, a1);
        y[i] = pack_bf16(c0, c1);
    }
}

/* Rotate a staged key tile tk in place: lane takes 16-byte chunk rch = lane % (D / 16) of the
 * first half of each row r it visits and its rotate-half partner, rot(r, x, y) rotating the 8
 * columns (4 x 2 bf16) in x with their partners in y; at(r, ch) is chunk ch of row r's offset. */
template <int D, typename At, typename Rot>
static __device__ __forceinline__ void tc_rot_rows(bf16 *tk, int lane, At at, Rot rot) {
    constexpr int HCH = D / 16;
    const int rch = lane % HCH;
#pragma unroll
    for (int e = lane; e < TC_KT * HCH; e += 32) {
        const int r = e / HCH;
        uint4 *lo = reinterpret_cast<uint4 *>(tk + at(r, rch));
        uint4 *hi = reinterpret_cast<uint4 *>(tk + at(r, rch + HCH));
        uint4 a = *lo, b = *hi;
        rot(r, &a.x, &b.x);
        *lo = a;
        *hi = b;
    }
}

/* RM 2 over a list: a staged tile whose positions lie past the table's rows, rotated with sincosf
 * (the same bits as the table: rope_table.cuh); out of line, so the table's loop stays compact */
template <int D, int KP>
static __device__ __noinline__ void tc_rot_tile(bf16 *tk, const int *kp, const float *inv_freq, float af, int lane) {
    const int rch = lane % (D / 16);
    float fr[8];
#pragma unroll
    for (int c = 0; c < 8; c++) fr[c] = inv_freq[rch * 8 + c];
    tc_rot_rows<D>(tk, lane, [](int r, int ch) { return r * KP + ch * 8; },
                   [&](int r, uint32_t *x, uint32_t *y) { rot8(x, y, kp[r], fr, af); });
}

/* RG: row ranges around the lists (ks_cuda_attn_params.seg_*): their own instances, since the
 * index arithmetic of every tile costs the calls without ranges ~3% of a 32K decode step (H100) */
template <int D, int RM, bool RG, bool LST, int NS>
__global__ void __launch_bounds__(TC_WARPS * 32, RM == 1 || (RM == 2 && LST && NS == 1) ? 3 : RM == 2 ? 1 : 0)
attn_decode_tc_kernel(const ks_cuda_attn_params p, int n_splits, float sl2, float *__restrict__ ws_acc,
                      float *__restrict__ ws_ml, const __grid_constant__ tc_byval bv,
                      const __grid_constant__ tc_rope<RM> rp) {
    constexpr bool ROPE = RM != 0;
    static_assert(LST || (!RG && NS == 2), "row ranges come with a list; the cache rows take 2 stages");
    /* PDL (pdl.cuh): q, the cache and the lists come from earlier kernels, out / ws are written.
     * Over a list the kernel waits later, after its query rows (ks_cuda_attn_decode_tc_waits_late):
     * it is never launched with the attribute (tc_launch_ns), and a joined step (cuda_graph.cu)
     * gives it a programmatic edge only behind a decode handler's last kernel, which writes
     * policy memory alone (no view of the engine's q or cache is ever a primitive's output);
     * the counts, row ranges and position come from the staged descriptor and the step slot
     * (written before the step and by its first node) and the rope table is built once. So the
     * block sets up and rotates its query while the policy's top-k runs. */
    ks_pdl_trigger();
    if constexpr (!LST) ks_pdl_wait();
    if constexpr (LST) { /* the next weights into L2 (p.pf): thread 0, this block's share in 128 KB pieces */
        if (p.pf && threadIdx.x == 0) {
            const size_t nb = (size_t)n_splits * gridDim.y, tot = p.pf_bytes & ~(size_t)15;
            const size_t per = (tot / nb + 15) & ~(size_t)15, b0 = ((size_t)blockIdx.y * n_splits + blockIdx.x) * per;
            const size_t b1 = b0 + per < tot ? b0 + per : tot;
            for (size_t o = b0; o < b1; o += TC_PF_PIECE) {
                const unsigned sz = (unsigned)(b1 - o < TC_PF_PIECE ? b1 - o : TC_PF_PIECE);
                asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"((const char *)p.pf + o), "r"(sz) : "memory");
            }
        }
    }
    extern __shared__ __align__(128) unsigned char smem[];
    constexpr int NCH = D / 8, KS = D / 16, DT = D / 8, KP = tc_kp<D, LST>();
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int gq = lane >> 2, tig = lane & 3;
    const int H = p.n_heads, g = H / p.n_kv_heads, M = p.n * g;
    const int kv = blockIdx.y, split = blockIdx.x;
    bf16 *sQ = (bf16 *)smem;                                                  /* (16, D) */
    unsigned char *wr = smem + 16 * D * 2 + (size_t)warp * tc_wregion<D, RM, NS, LST>(); /* this warp's region */
    bf16 *wK = (bf16 *)wr;                                                    /* stages x (KT, KP) */
    bf16 *wV = wK + NS * TC_KT * KP;                                          /* stages x (KT, KP) */
    int *wP = (int *)(wV + NS * TC_KT * KP);                                  /* stages x KT */
    int *wR = wP + NS * TC_KT;                                                /* (RB, KT) rows of tiles */
    float4 *wT = (float4 *)(wR + TC_RB * TC_KT);                              /* RM 2: stages x (KT, D / 4) */
    float *sML = (float *)(smem + 16 * D * 2 + TC_WARPS * tc_wregion<D, RM, NS, LST>()); /* (warps, 16, 2) */
    /* a staged K / V tile's 16-byte chunk ch of row r (elements from the stage's start) */
    auto kix = [](int r, int ch) {
        if constexpr (LST) return r * KP + ch * 8;
        else return swz<D>(r, ch);
    };
    /* RM 2: the rope table's header words, loaded by every warp at its start (checked in tab_check) */
    uint32_t hw[D / 64], hx[3] = {0u, 0u, 0u};
    if constexpr (RM == 2) {
        const float *hd = (const float *)rp.r.tab;
        const bool on = hd != nullptr && p.renumber;
#pragma unroll
        for (int j = 0; j < D / 64; j++) hw[j] = on ? __float_as_uint(hd[lane + 32 * j]) : 0u;
        if (on && lane == 0) hx[0] = __float_as_uint(hd[64]), hx[1] = __float_as_uint(hd[65]), hx[2] = __float_as_uint(hd[66]);
    }

    /* row ranges around the list (p.seg_*): keys [0, snb) are rows sb0.., keys [nkh - sna, nkh)
     * rows sa0.., the keys between the list's entries. A staged page tail (seg_dev[4] = P > 0) is
     * the page of the row before its end: its length and the head's count follow the step */
    int sb0 = 0, snb = 0, sa0 = 0, sna = 0, grown = 0;
    if constexpr (RG) {
        sb0 = p.seg_b0, snb = p.seg_nb, sa0 = p.seg_a0, sna = p.seg_na;
        if (!bv.on && p.seg_dev) {
            sb0 = p.seg_dev[0];
            snb = p.seg_dev[1];
            sna = p.seg_dev[3];
            const int pg = p.seg_dev[4];
            if (pg > 0) {
                const int end = p.qpos[0] + 1 + p.seg_dev[2];
                sa0 = (end - 1) / pg * pg;
                grown = (end - sa0) - sna; /* the staged count held the staging step's tail */
                sna = end - sa0;
            } else {
                sa0 = p.qpos[0] + 1 + p.seg_dev[2];
            }
        }
    }
    const int nkh = bv.on ? bv.nk[kv] + (bv.dyn ? bv.dyn[1] : 0) : p.nk[kv] + grown;
    const int qpos1 = bv.dyn ? bv.dyn[0] : bv.qpos;
    const int quantum = TC_WARPS * TC_KT;
    int per = (nkh + n_splits - 1) / n_splits;
    per = (per + quantum - 1) / quantum * quantum;
    const int tb = split * per, te = min(nkh, tb + per);
    /* RM 2: the rows of a table that holds this call's rope, bit for bit (0: compute), each warp
     * checking the header words itself where it first needs the table (before its first tiles'
     * table rows: in list_first behind a handler, else before the loop), so no block barrier stands
     * before those copies */
    int tab_rows = 0;
    bool tab_done = RM != 2;
    auto tab_check = [&]() {
        if constexpr (RM == 2) {
            if (tab_done) return;
            tab_done = true;
            bool ok = rp.r.tab != nullptr && p.renumber;
#pragma unroll
            for (int j = 0; j < D / 64; j++) ok = ok && hw[j] == __float_as_uint(rp.r.inv_freq[lane + 32 * j]);
            if (lane == 0) ok = ok && hx[0] == __float_as_uint(rp.r.attn_factor) && (int)hx[1] == D / 2;
            ok = __all_sync(0xffffffffu, ok);
            tab_rows = __shfl_sync(0xffffffffu, ok ? (int)hx[2] : 0, 0);
        }
    };
    const int32_t *ib = p.idx_at ? *p.idx_at : p.idx; /* a recorded step's lists: where the slot says now */
    const int32_t *ix = ib ? ib + (bv.on ? bv.off[kv] : p.idx_off[kv]) : nullptr;
    const int sl1 = nkh - sna; /* first key of the trailing range */
    auto row_of = [&](int t) {
        if constexpr (RG) return t < snb ? sb0 + t : t >= sl1 ? sa0 + (t - sl1) : ix[t - snb];
        else return ix ? ix[t] : t;
    };
    const bf16 *Kh = (const bf16 *)p.k + (size_t)kv * p.capacity * D;
    const bf16 *Vh = (const bf16 *)p.v + (size_t)kv * p.capacity * D;
    const int32_t *Ph = (p.kpos && !p.renumber) ? p.kpos + (size_t)kv * p.capacity : nullptr;

    /* ---- this warp's tiles u = 0..nt-1: keys t0 = tb + (warp + TC_WARPS * u) * KT. Over a list
     * (an index list or row ranges) the rows of TC_RB tiles are looked up at once into wR (four
     * independent loads a lane), so a tile's copies start without waiting on its index load; NS - 1
     * tiles are in flight while one is computed. */
    constexpr int TW = TC_WARPS * TC_KT;
    const int nt = te - tb - warp * TC_KT > 0 ? (te - tb - warp * TC_KT + TW - 1) / TW : 0;
    int rbat = -1; /* the batch of tiles whose rows wR holds */
    auto rows = [&](int u) {
        if (!LST || u / TC_RB == rbat) return;
        rbat = u / TC_RB;
        int j[TC_RB * TC_KT / 32];
#pragma unroll
        for (int i = 0; i < TC_RB * TC_KT / 32; i++) {
            const int e = lane + 32 * i;
            const int t = tb + (warp + TC_WARPS * (rbat * TC_RB + e / TC_KT)) * TC_KT + e % TC_KT;
            j[i] = t < te ? row_of(t) : 0;
        }
        __syncwarp(); /* the copies issued from the previous batch have read their rows */
#pragma unroll
        for (int i = 0; i < TC_RB * TC_KT / 32; i++) wR[lane + 32 * i] = j[i];
        __syncwarp();
    };
    /* a list tile's K and V rows and their positions (LST): 16-byte cp.async copies, lane l taking
     * chunk l % NCH of rows l / NCH + (32 / NCH) i (the destinations fixed offsets) */
    auto load_kv = [&](int u) {
        if constexpr (LST) {
            const int st = u % NS, t0 = tb + (warp + TC_WARPS * u) * TC_KT;
            const int *rw = wR + (u % TC_RB) * TC_KT;
            rows(u);
            bf16 *dk = wK + st * TC_KT * KP, *dv = wV + st * TC_KT * KP;
            constexpr int RP = 32 / NCH;
            const int ch = lane % NCH;
            uint64_t pol; /* read once: evict first, before the next weights prefetched into L2 (p.pf) */
            asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
#pragma unroll
            for (int i = 0; i < TC_KT / RP; i++) {
                const int r = i * RP + lane / NCH;
                const bool ok = t0 + r < te;
                const size_t off = (size_t)(ok ? rw[r] : 0) * D + ch * 8;
                cp_async16_pol(dk + r * KP + ch * 8, Kh + off, ok ? 16 : 0, pol);
                cp_async16_pol(dv + r * KP + ch * 8, Vh + off, ok ? 16 : 0, pol);
            }
            if (lane < TC_KT) {
                int t = t0 + lane;
                bool ok = t < te;
                int j = !ok ? 0 : rw[lane];
                if (Ph) cp_async4(wP + st * TC_KT + lane, Ph + j, ok ? 4 : 0);
                else wP[st * TC_KT + lane] = p.renumber ? t : j;
            }
        }
    };
    /* a list tile's rope table rows (RM 2, where the table holds the tile's 16 positions): one contiguous
     * run, key t at row t */
    auto load_tab = [&](int u) {
        if constexpr (LST && RM == 2) {
            const int st = u % NS, t0 = tb + (warp + TC_WARPS * u) * TC_KT;
            if (tab_rows > 0 && t0 + TC_KT <= tab_rows) {
                const float4 *src = (const float4 *)rp.r.tab + KS_CUDA_ROPE_TAB_HDR + (size_t)t0 * (D / 4) + lane;
                float4 *dst = wT + st * TC_KT * (D / 4) + lane;
#pragma unroll
                for (int i = 0; i < TC_KT * (D / 4) / 32; i++) cp_async16(dst + 32 * i, src + 32 * i, 16);
            }
        }
    };
    /* Over a list the first tiles' rows (NE: tile 0, or the NS - 1 tiles of the prologue) are looked
     * up and their K and V copies issued by list_first. A block that reads a list waits for it first
     * (the policy's kernels wrote it); a block whose keys all lie in the row ranges reads no list and
     * does not wait: behind a policy's top-k it computes while the top-k runs (TokenSelect's leading
     * and trailing rows). Where the blocks start behind a decode handler's last kernel (p.behind)
     * they stage the query first and meanwhile wait; elsewhere (the held steps of TokenSelect's
     * selection cache, plain launches) nothing precedes them that they wait for, and they issue the
     * copies before staging the query, which needs none of them: its loads and rotation overlap the
     * rows' round trips (its last block ~0.85 us sooner a call, the hit path at 128K on an H200: bench/NOTES.md, issue
     * 14 session 43). Their rope table rows (RM 2: 8 KB a tile, as much as its K and V rows, from L2)
     * go out behind a handler before the wait, while the L2 idles under the top-k (TokenSelect's
     * step -0.04 ms at 32K and -0.05 at 128K, Quest's -0.1 to -0.25 at 128K on an H200: issue 14
     * session 44); elsewhere right after the K and V copies, before the query is rotated and staged
     * (they went after the block's barrier until session 45: the hit path's step -0.02 to -0.07 ms on
     * an H200). A load a warp issues after 8 KB of copies comes back after them, so the order matters:
     * the query's pairs are loaded first (below), then the list's rows are looked up and their copies
     * issued, then the table rows; issued before the lookups, the table rows queued them (+0.8 us a
     * call, session 44). */
    constexpr int NE = NS > 1 ? NS - 1 : 1;
    const bool first_early = LST && !p.behind;
    auto list_first = [&]() {
        if constexpr (LST) {
            for (int o = 0; o < 2; o++) { /* behind a handler the table rows first, else the K and V copies */
                if (o == (p.behind ? 0 : 1)) {
                    tab_check();
#pragma unroll
                    for (int u = 0; u < NE; u++)
                        if (u < nt) load_tab(u);
                } else {
                    if (!RG || !(te <= snb || tb >= sl1)) ks_pdl_wait();
#pragma unroll
                    for (int u = 0; u < NE; u++)
                        if (u < nt) load_kv(u);
                }
            }
        }
    };
    auto row_pos = [&](int i) { return p.q_renumber ? nkh - p.n + i : bv.on ? qpos1 : p.qpos[i]; };
    /* ROPE: the query's first QH pairs this thread rotates (all of them for a decode step's M = g <= 4
     * at d = 128, <= 8 at d = 64), loaded before anything is copied: a load issued after a warp's
     * copies comes back after them */
    constexpr int QH = 2;
    float qx0[ROPE ? QH : 1], qx1[ROPE ? QH : 1];
    if constexpr (ROPE) {
#pragma unroll
        for (int j = 0; j < QH; j++) {
            const int e = tid + j * TC_WARPS * 32, r = e / (D / 2), k = e - r * (D / 2), i = r / g, hh = r - i * g;
            const bool in = e < M * (D / 2);
            const float *src = p.q + ((size_t)(in ? i : 0) * H + kv * g + (in ? hh : 0)) * D;
            qx0[j] = in ? src[k] : 0.f;
            qx1[j] = in ? src[k + D / 2] : 0.f;
        }
    }
    for (int pass = 0; pass < 2; pass++) { /* one copy of each: list_first before or after the query */
        if (pass == (first_early ? 0 : 1)) list_first();
        if (pass == 1) break;
        /* ---- Q rows (bf16, swizzled; rows >= M are zeros) */
        if constexpr (!ROPE) {
            for (int e = tid; e < 16 * NCH; e += TC_WARPS * 32) {
                int r = e / NCH, ch = e - r * NCH;
                uint4 v = make_uint4(0, 0, 0, 0);
                if (r < M) {
                    int i = r / g, hh = r - i * g;
                    const float4 *src = reinterpret_cast<const float4 *>(p.q + ((size_t)i * H + kv * g + hh) * D + ch * 8);
                    float4 a = src[0], b = src[1];
                    v.x = pack_bf16(a.x, a.y);
                    v.y = pack_bf16(a.z, a.w);
                    v.z = pack_bf16(b.x, b.y);
                    v.w = pack_bf16(b.z, b.w);
                }
                *reinterpret_cast<uint4 *>(sQ + swz<D>(r, ch)) = v;
            }
        } else {
            /* the M real rows, a rotate-half pair (k, k + D / 2) a thread in turn (M * D / 2 pairs over
             * the block's threads: every warp takes its share), rotated in float32, then bf16 (the
             * same rounding as pack_bf16); rows M..15 are zeros */
            for (int e = tid, j = 0; e < M * (D / 2); e += TC_WARPS * 32, j++) {
                const int r = e / (D / 2), k = e - r * (D / 2), i = r / g, hh = r - i * g;
                float x0, x1;
                if (j < QH) { /* (selected, so that the array stays in registers) */
                    x0 = qx0[0];
                    x1 = qx1[0];
#pragma unroll
                    for (int u = 1; u < QH; u++)
                        if (j == u) x0 = qx0[u], x1 = qx1[u];
                } else {
                    const float *src = p.q + ((size_t)i * H + kv * g + hh) * D;
                    x0 = src[k];
                    x1 = src[k + D / 2];
                }
                float y0, y1;
                ks_rope_rot(x0, x1, row_pos(i), rp.r.inv_freq[k], rp.r.attn_factor, &y0, &y1);
                sQ[swz<D>(r, k / 8) + (k & 7)] = __float2bfloat16_rn(y0);
                sQ[swz<D>(r, k / 8 + NCH / 2) + (k & 7)] = __float2bfloat16_rn(y1);
            }
            for (int e = tid; e < (16 - M) * NCH; e += TC_WARPS * 32) {
                const int r = M + e / NCH, ch = e - (r - M) * NCH;
                *reinterpret_cast<uint4 *>(sQ + swz<D>(r, ch)) = make_uint4(0, 0, 0, 0);
            }
        }
    }
    int qp[2];
#pragma unroll
    for (int hf = 0; hf < 2; hf++) {
        int r = gq + 8 * hf;
        qp[hf] = r >= M ? INT_MIN : row_pos(r / g);
    }
    /* ROPE: this lane's chunk of the first half of a key row and its 8 frequencies */
    constexpr int HCH = NCH / 2;
    const int rch = lane % HCH;
    float fr[ROPE ? 8 : 1];
    if constexpr (ROPE) {
#pragma unroll
        for (int c = 0; c < 8; c++) fr[c] = rp.r.inv_freq[rch * 8 + c];
    }
    __syncthreads();
    uint32_t qf[KS][4];
#pragma unroll
    for (int ks = 0; ks < KS; ks++) {
        int r = (lane & 7) + ((lane >> 3) & 1) * 8, ch = ks * 2 + (lane >> 4);
        ldsm_x4(qf[ks], sQ + swz<D>(r, ch));
    }
    tab_check(); /* (where it has not run yet: list_first runs it behind a handler) */

    auto load = [&](int u) {
        const int st = u % NS, t0 = tb + (warp + TC_WARPS * u) * TC_KT;
        bf16 *dk = wK + st * TC_KT * KP, *dv = wV + st * TC_KT * KP;
        if constexpr (LST) {
            if (u >= NE) load_kv(u); /* the first NE tiles' rows went with list_first, */
            if (u >= NE) load_tab(u); /* and their table rows */
        } else { /* the cache rows: 16-byte cp.async copies into the swizzled tile */
            for (int e = lane; e < TC_KT * NCH; e += 32) {
                int r = e / NCH, ch = e - r * NCH;
                int t = t0 + r;
                bool ok = t < te;
                int j = ok ? t : 0;
                size_t off = (size_t)j * D + ch * 8;
                cp_async16(dk + swz<D>(r, ch), Kh + off, ok ? 16 : 0);
                cp_async16(dv + swz<D>(r, ch), Vh + off, ok ? 16 : 0);
            }
            if (lane < TC_KT) {
                int t = t0 + lane;
                bool ok = t < te;
                int j = ok ? t : 0;
                if (Ph) cp_async4(wP + st * TC_KT + lane, Ph + j, ok ? 4 : 0);
                else wP[st * TC_KT + lane] = p.renumber ? t : j;
            }
            if constexpr (RM == 2) { /* renumbered: key t sits at position t, the table's row t */
                if (tab_rows > 0) {
                    constexpr int RW = D / 4; /* float4s a table row */
                    const float4 *tb4 = (const float4 *)rp.r.tab + KS_CUDA_ROPE_TAB_HDR;
                    float4 *dt = wT + st * TC_KT * RW;
                    for (int e = lane; e < TC_KT * RW; e += 32) {
                        const int r = e / RW, t = t0 + r;
                        const bool ok = t < te && t < tab_rows;
                        cp_async16(dt + e, tb4 + (size_t)(ok ? t : 0) * RW + (e - r * RW), ok ? 16 : 0);
                    }
                }
            }
        }
    };

    float o[DT][4];
#pragma unroll
    for (int i = 0; i < DT; i++) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
    float m_r[2] = {-INFINITY, -INFINITY}, l_r[2] = {0.f, 0.f};
    const int window = p.window;

#pragma unroll
    for (int u = 0; u < NS - 1; u++) {
        if (u < nt) load(u);
        cp_async_commit();
    }
    for (int u = 0; u < nt; u++) {
        const int st = u % NS, t0 = tb + (warp + TC_WARPS * u) * TC_KT;
        if (u + NS - 1 < nt) load(u + NS - 1); /* into the stage computed last round */
        cp_async_commit();
        cp_async_wait<NS - 1>();
        __syncwarp();
        const bf16 *cK = wK + st * TC_KT * KP, *cV = wV + st * TC_KT * KP;
        const int *kp = wP + st * TC_KT;
        if constexpr (ROPE && RM == 2 && LST) { /* renumbered: key t at the table's row t, decided a tile */
            bf16 *tk = wK + st * TC_KT * KP;
            if (tab_rows > 0 && t0 + TC_KT <= tab_rows) {
                const float4 *ct = wT + st * TC_KT * (D / 4) + rch;
                tc_rot_rows<D>(tk, lane, kix, [&](int r, uint32_t *x, uint32_t *y) {
                    const float4 *cs = ct + r * (D / 4);
                    const float4 f4[4] = {cs[0], cs[HCH], cs[2 * HCH], cs[3 * HCH]};
                    rot8_cs(x, y, f4);
                });
            } else {
                tc_rot_tile<D, KP>(tk, kp, rp.r.inv_freq, rp.r.attn_factor, lane);
            }
            __syncwarp();
        } else if constexpr (ROPE) { /* rotate the staged keys in place (rows past the end are zeros) */
            bf16 *tk = wK + st * TC_KT * KP;
            tc_rot_rows<D>(tk, lane, kix, [&](int r, uint32_t *x, uint32_t *y) {
                if constexpr (RM == 2) {
                    if (kp[r] < tab_rows) { /* the table's (c, s): same bits as computing them */
                        const float4 *cs = wT + st * TC_KT * (D / 4) + r * (D / 4) + rch;
                        const float4 f4[4] = {cs[0], cs[HCH], cs[2 * HCH], cs[3 * HCH]};
                        rot8_cs(x, y, f4);
                    } else {
                        rot8(x, y, kp[r], fr, rp.r.attn_factor);
                    }
                } else {
                    rot8(x, y, kp[r], fr, rp.r.attn_factor);
                }
            });
            __syncwarp();
        }

        float s[2][4];
#pragma unroll
        for (int j = 0; j < 2; j++) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;
#pragma unroll
        for (int ks = 0; ks < KS; ks++) {
            uint32_t b[4];
            int r = (lane & 7) + (lane >> 4) * 8, ch = ks * 2 + ((lane >> 3) & 1);
            ldsm_x4(b, cK + kix(r, ch));
            mma16816(s[0], qf[ks], b[0], b[1]);
            mma16816(s[1], qf[ks], b[2], b[3]);
        }
#pragma unroll
        for (int j = 0; j < 2; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int col = j * 8 + tig * 2 + (e & 1);
                int key = kp[col], q = qp[e >> 1];
                bool vis = t0 + col < te && key <= q && (window <= 0 || (long long)q - key < window);
                s[j][e] = vis ? s[j][e] * sl2 : -INFINITY;
            }
#pragma unroll
        for (int hf = 0; hf < 2; hf++) {
            float mx = fmaxf(fmaxf(s[0][2 * hf], s[0][2 * hf + 1]), fmaxf(s[1][2 * hf], s[1][2 * hf + 1]));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
            float mn = fmaxf(m_r[hf], mx);
            float base = mn == -INFINITY ? 0.f : mn;
            float c = fast_exp2(m_r[hf] - base);
            m_r[hf] = mn;
            float ps = 0.f;
#pragma unroll
            for (int j = 0; j < 2; j++) {
                s[j][2 * hf] = fast_exp2(s[j][2 * hf] - base);
                s[j][2 * hf + 1] = fast_exp2(s[j][2 * hf + 1] - base);
                ps += s[j][2 * hf] + s[j][2 * hf + 1];
            }
            l_r[hf] = l_r[hf] * c + ps;
#pragma unroll
            for (int i = 0; i < DT; i++) {
                o[i][2 * hf] *= c;
                o[i][2 * hf + 1] *= c;
            }
        }
        uint32_t a[4];
        a[0] = pack_bf16(s[0][0], s[0][1]);
        a[1] = pack_bf16(s[0][2], s[0][3]);
        a[2] = pack_bf16(s[1][0], s[1][1]);
        a[3] = pack_bf16(s[1][2], s[1][3]);
#pragma unroll
        for (int dp = 0; dp < DT / 2; dp++) {
            uint32_t b[4];
            int r = (lane & 7) + ((lane >> 3) & 1) * 8, ch = dp * 2 + (lane >> 4);
            ldsm_x4_t(b, cV + kix(r, ch));
            mma16816(o[2 * dp], a, b[0], b[1]);
            mma16816(o[2 * dp + 1], a, b[2], b[3]);
        }
        __syncwarp(); /* the next load overwrites this stage */
    }
    cp_async_wait<0>();
    __syncwarp();

    /* ---- merge the warps: each writes (m, l) per row and its O into its own region */
#pragma unroll
    for (int hf = 0; hf < 2; hf++) {
        float l = l_r[hf];
        l += __shfl_xor_sync(0xffffffffu, l, 1);
        l += __shfl_xor_sync(0xffffffffu, l, 2);
        if (tig == 0) {
            sML[(warp * 16 + gq + 8 * hf) * 2] = m_r[hf];
            sML[(warp * 16 + gq + 8 * hf) * 2 + 1] = l;
        }
    }
    float *wO = (float *)wr; /* (16, D + 4) floats fit in the warp's region */
#pragma unroll
    for (int i = 0; i < DT; i++) {
        *reinterpret_cast<float2 *>(wO + gq * (D + 4) + i * 8 + tig * 2) = make_float2(o[i][0], o[i][1]);
        *reinterpret_cast<float2 *>(wO + (gq + 8) * (D + 4) + i * 8 + tig * 2) = make_float2(o[i][2], o[i][3]);
    }
    __syncthreads();
    for (int e = tid; e < M * D; e += TC_WARPS * 32) {
        int r = e / D, c = e - r * D;
        float mw[TC_WARPS], mx = -INFINITY;
#pragma unroll
        for (int w = 0; w < TC_WARPS; w++) { mw[w] = sML[(w * 16 + r) * 2]; mx = fmaxf(mx, mw[w]); }
        float L = 0.f, O = 0.f;
        if (mx != -INFINITY) {
#pragma unroll
            for (int w = 0; w < TC_WARPS; w++) {
                if (mw[w] == -INFINITY) continue;
                float f = fast_exp2(mw[w] - mx);
                L += sML[(w * 16 + r) * 2 + 1] * f;
                O += ((const float *)(smem + 16 * D * 2 + (size_t)w * tc_wregion<D, RM, NS, LST>()))[r * (D + 4) + c] * f;
            }
        }
        int i = r / g, h = kv * g + (r - i * g);
        if (n_splits == 1) {
            p.out[((size_t)i * H + h) * D + c] = L > 0.f ? O * (1.0f / L) : 0.f;
        } else {
            size_t base = ((size_t)i * H + h) * n_splits + split;
            ws_acc[base * D + c] = O;
            if (c == 0) {
                ws_ml[2 * base] = mx == -INFINITY ? -INFINITY : mx * 0.69314718055994531f; /* natural-log units */
                ws_ml[2 * base + 1] = L;
            }
        }
    }
}

extern "C" int ks_cuda_attn_decode_tc_supported(const ks_cuda_attn_params *p) {
    if (p->n_kv_heads < 1 || p->n_heads % p->n_kv_heads) return 0;
    return (p->head_dim == 64 || p->head_dim == 128) && !p->k_f32 && p->n >= 1 &&
           (long long)p->n * (p->n_heads / p->n_kv_heads) <= 16;
}

extern "C" size_t ks_cuda_attn_decode_tc_workspace(const ks_cuda_attn_params *p, int wave, int *n_splits) {
    /* one wave of blocks, the caller's: one an SM streamed the cache best in session 9's
     * tests/cuda/bench_decode.cu, two an SM in an H200's decode step of session 41
     * (cuda_ctx.attn_bps; bench/NOTES.md) */
    size_t target = (size_t)(wave > 0 ? wave : 132);
    int splits = (int)(target / p->n_kv_heads); /* floor: a partial second wave would double the time */
    int most = (p->max_nk + 2 * TC_WARPS * TC_KT - 1) / (2 * TC_WARPS * TC_KT); /* >= 2 tiles per warp */
    splits = KS_MAX(1, KS_MIN(splits, most));
    /* p->splits = N (the backend's decode_splits option, for tuning): N splits, at most one per
     * tile of each warp */
    if (p->splits > 0) splits = KS_MAX(1, KS_MIN(p->splits, (p->max_nk + TC_WARPS * TC_KT - 1) / (TC_WARPS * TC_KT)));
    *n_splits = splits;
    if (splits == 1) return 0;
    size_t rh = (size_t)p->n * p->n_heads * splits;
    return rh * p->head_dim * sizeof(float) + rh * 2 * sizeof(float);
}

extern "C" int ks_cuda_attn_decode_tc_list_splits(const ks_cuda_attn_params *p, int n_sm, int rope) {
    if ((rope != 1 && rope != 2) || p->n_kv_heads < 1) return 0;
    int tiles = (p->max_nk + TC_WARPS * TC_KT - 1) / (TC_WARPS * TC_KT);
    if (rope == 2) { /* a tile a warp where 3 blocks an SM hold them all (tc_launch's NS 1), else the automatic choice */
        int slots = 3 * (n_sm > 0 ? n_sm : 132) / p->n_kv_heads;
        return tiles <= slots ? KS_MAX(1, tiles) : 0;
    }
    int blocks = KS_MAX(1, 3 * (n_sm > 0 ? n_sm : 132) / (2 * p->n_kv_heads)); /* 1.5 blocks an SM */
    return KS_MAX(1, KS_MIN(blocks, tiles));
}

template <int D, int RM, bool RG, bool LST, int NS>
static ks_status tc_launch_ns(cudaStream_t s, const ks_cuda_attn_params *p, int n_splits, float *acc, float *ml,
                              const tc_byval &bv, const tc_rope<RM> &rp) {
    static_assert(tc_smem<D, RM, NS, LST>() <= 227 * 1024, "the shared memory of one block");
    static_assert(tc_wregion<D, RM, NS, LST>() % 16 == 0, "16-byte copies into every warp's region");
    static unsigned attr = 0; /* bit g: set on GPU g (the attribute is per device function) */
    int dev = 0;
    cudaGetDevice(&dev);
    if (!(attr >> (dev & 31) & 1u)) {
        KS_CU(cudaFuncSetAttribute(attn_decode_tc_kernel<D, RM, RG, LST, NS>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                   (int)tc_smem<D, RM, NS, LST>()),
              "attention (decode, tensor cores) shared memory");
        attr |= 1u << (dev & 31);
    }
    dim3 grid(n_splits, p->n_kv_heads);
    KS_CU(ks_pdl_launch(attn_decode_tc_kernel<D, RM, RG, LST, NS>, grid, dim3(TC_WARPS * 32), tc_smem<D, RM, NS, LST>(), s, p->pdl && !LST,
                        *p, n_splits, p->scale * 1.4426950408889634f, acc, ml, bv, rp),
          "attention (decode, tensor cores) kernel");
    return KS_OK;
}

/* the instance for p: row ranges where p has them (a list's index array is then required); over a
 * list TC_LIST_STAGES stages (2 with sincosf rotation, whose 3 blocks an SM hide the latency) */
template <int D, int RM>
static ks_status tc_launch(cudaStream_t s, const ks_cuda_attn_params *p, int n_splits, float *acc, float *ml,
                           const tc_byval &bv, const tc_rope<RM> &rp) {
    constexpr int NL = RM == 1 ? 2 : RM == 2 && TC_LIST_STAGES > 3 ? 3 : TC_LIST_STAGES; /* RM 2: 3 fit */
    const bool rg = bv.on ? p->seg_nb > 0 || p->seg_na > 0 : p->seg_dev != nullptr;
    const bool lists = p->idx || p->idx_at;
    if (rg && !lists) return ks_errorf(KS_ERR_ARG, "attention (decode, tensor cores): row ranges without a list");
    /* RM 2 with at most one tile a warp: one stage, 3 blocks an SM */
    if constexpr (RM == 2) {
        if ((rg || lists) && (int64_t)n_splits * TC_WARPS * TC_KT >= (int64_t)p->max_nk)
            return rg ? tc_launch_ns<D, RM, true, true, 1>(s, p, n_splits, acc, ml, bv, rp)
                      : tc_launch_ns<D, RM, false, true, 1>(s, p, n_splits, acc, ml, bv, rp);
    }
    if (rg) return tc_launch_ns<D, RM, true, true, NL>(s, p, n_splits, acc, ml, bv, rp);
    if (lists) return tc_launch_ns<D, RM, false, true, NL>(s, p, n_splits, acc, ml, bv, rp);
    return tc_launch_ns<D, RM, false, false, 2>(s, p, n_splits, acc, ml, bv, rp);
}

/* every instance of one head_dim and rotation mode over a list (tc_launch's) */
template <int D, int RM> static bool tc_list_kernel(const void *f) {
    constexpr int NL = RM == 1 ? 2 : RM == 2 && TC_LIST_STAGES > 3 ? 3 : TC_LIST_STAGES;
    return f == (const void *)attn_decode_tc_kernel<D, RM, true, true, NL> ||
           f == (const void *)attn_decode_tc_kernel<D, RM, false, true, NL> ||
           (RM == 2 && (f == (const void *)attn_decode_tc_kernel<D, 2, true, true, 1> ||
                        f == (const void *)attn_decode_tc_kernel<D, 2, false, true, 1>));
}

extern "C" int ks_cuda_attn_decode_tc_waits_late(const void *func) {
    return func && (tc_list_kernel<128, 0>(func) || tc_list_kernel<128, 1>(func) || tc_list_kernel<128, 2>(func) ||
                    tc_list_kernel<64, 0>(func) || tc_list_kernel<64, 1>(func) || tc_list_kernel<64, 2>(func));
}

/* the list kernels' arguments: (p, n_splits, sl2, ws_acc, ws_ml, bv, rp) */
#define TC_NARGS 7

extern "C" cudaError_t ks_cuda_attn_decode_tc_node_k(cudaGraphNode_t node, const void **k) {
    cudaKernelNodeParams kp;
    cudaError_t e = cudaGraphKernelNodeGetParams(node, &kp);
    if (e) return e;
    if (!ks_cuda_attn_decode_tc_waits_late(kp.func) || !kp.kernelParams) return cudaErrorInvalidValue;
    *k = ((const ks_cuda_attn_params *)kp.kernelParams[0])->k;
    return cudaSuccess;
}

extern "C" cudaError_t ks_cuda_attn_decode_tc_node_edge(cudaGraphNode_t node, const void *w, size_t bytes) {
    cudaKernelNodeParams kp;
    cudaError_t e = cudaGraphKernelNodeGetParams(node, &kp);
    if (e) return e;
    if (!ks_cuda_attn_decode_tc_waits_late(kp.func) || !kp.kernelParams) return cudaErrorInvalidValue;
    ks_cuda_attn_params p = *(const ks_cuda_attn_params *)kp.kernelParams[0];
    p.behind = 1;
    p.pf = ((uintptr_t)w & 15) ? NULL : w;
    p.pf_bytes = p.pf ? bytes : 0;
    void *args[TC_NARGS];
    for (int i = 0; i < TC_NARGS; i++) args[i] = kp.kernelParams[i];
    args[0] = &p;
    kp.kernelParams = args;
    kp.extra = NULL;
    return cudaGraphKernelNodeSetParams(node, &kp); /* the argument values are copied */
}

/* rope: NULL, or the table the kernel rotates pre-RoPE q and keys with */
static ks_status tc_run(cudaStream_t s, const ks_cuda_attn_params *p, int n_splits, void *ws, const tc_byval &bv,
                        const ks_cuda_attn_rope *rope) {
    if ((uintptr_t)p->q % 16 || (uintptr_t)p->k % 16 || (uintptr_t)p->v % 16)
        return ks_errorf(KS_ERR_ARG, "attention (decode, tensor cores): misaligned buffers");
    if (n_splits < 1) n_splits = 1;
    if (n_splits > 1 && !ws) return ks_errorf(KS_ERR_INTERNAL, "attention: split-KV without a workspace");
    float *acc = (float *)ws;
    float *ml = acc ? acc + (size_t)p->n * p->n_heads * n_splits * p->head_dim : nullptr;
    ks_status st;
    if (rope && rope->tab) {
        if ((uintptr_t)rope->tab % 16) return ks_errorf(KS_ERR_ARG, "attention (decode, tensor cores): misaligned rope table");
        tc_rope<2> rp;
        rp.r = *rope;
        st = p->head_dim == 128 ? tc_launch<128, 2>(s, p, n_splits, acc, ml, bv, rp)
                                : tc_launch<64, 2>(s, p, n_splits, acc, ml, bv, rp);
    } else if (rope) {
        tc_rope<1> rp;
        rp.r = *rope;
        st = p->head_dim == 128 ? tc_launch<128, 1>(s, p, n_splits, acc, ml, bv, rp)
                                : tc_launch<64, 1>(s, p, n_splits, acc, ml, bv, rp);
    } else {
        tc_rope<0> rp = {0};
        st = p->head_dim == 128 ? tc_launch<128, 0>(s, p, n_splits, acc, ml, bv, rp)
                                : tc_launch<64, 0>(s, p, n_splits, acc, ml, bv, rp);
    }
    if (st || n_splits == 1) return st;
    return ks_cuda_attn_combine(s, p->out, acc, ml, p->n * p->n_heads, n_splits, p->head_dim, p->pdl);
}

extern "C" ks_status ks_cuda_attn_decode_tc(cudaStream_t s, const ks_cuda_attn_params *p, int n_splits, void *ws) {
    if (!ks_cuda_attn_decode_tc_supported(p))
        return ks_errorf(KS_ERR_UNSUPPORTED, "attention: the tensor-core decode kernel does not take this shape");
    if (p->n <= 0) return KS_OK;
    tc_byval bv;
    memset(&bv, 0, sizeof bv);
    return tc_run(s, p, n_splits, ws, bv, NULL);
}

/* the one-row entries: counts (and list offsets) by value */
static ks_status tc1_run(cudaStream_t s, const ks_cuda_attn_params *p, const int *nk_host, const int *off_host,
                         int qpos, const int32_t *dyn, const ks_cuda_attn_rope *rope, int n_splits, void *ws) {
    if (!ks_cuda_attn_decode_tc_supported(p) || p->n != 1 || !p->idx != !off_host || p->idx_at || p->renumber != p->q_renumber ||
        p->n_kv_heads > KS_CUDA_ATTN_BYVAL_HEADS)
        return ks_errorf(KS_ERR_UNSUPPORTED, "attention: the one-row tensor-core decode does not take this call "
                                             "(n %d, %d KV heads, index list %s)", p->n, p->n_kv_heads, p->idx ? "yes" : "no");
    tc_byval bv;
    memset(&bv, 0, sizeof bv);
    bv.on = 1;
    bv.qpos = qpos;
    bv.dyn = dyn;
    for (int h = 0; h < p->n_kv_heads; h++) {
        if (nk_host[h] < 0 || nk_host[h] > p->capacity)
            return ks_errorf(KS_ERR_ARG, "attention: %d keys for KV head %d (capacity %d)", nk_host[h], h, p->capacity);
        bv.nk[h] = nk_host[h];
        bv.off[h] = off_host ? off_host[h] : 0;
    }
    return tc_run(s, p, n_splits, ws, bv, rope);
}

extern "C" ks_status ks_cuda_attn_decode_tc1(cudaStream_t s, const ks_cuda_attn_params *p, const int *nk_host, int qpos,
                                             const int32_t *dyn, int n_splits, void *ws) {
    if (p->idx || p->renumber || p->q_renumber)
        return ks_errorf(KS_ERR_UNSUPPORTED, "attention: the one-row tensor-core decode over the cache takes no index list");
    return tc1_run(s, p, nk_host, NULL, qpos, dyn, NULL, n_splits, ws);
}

extern "C" ks_status ks_cuda_attn_decode_tc_list(cudaStream_t s, const ks_cuda_attn_params *p, const int *nk_host,
                                                 const int *idx_off_host, int qpos, const ks_cuda_attn_rope *rope,
                                                 int n_splits, void *ws) {
    if (rope && p->head_dim / 2 > KS_CUDA_ATTN_ROPE_HALF)
        return ks_errorf(KS_ERR_UNSUPPORTED, "attention: rope over head_dim %d in the kernel", p->head_dim);
    return tc1_run(s, p, nk_host, idx_off_host, qpos, NULL, rope, n_splits, ws);
}

extern "C" ks_status ks_cuda_attn_decode_tc_rec(cudaStream_t s, const ks_cuda_attn_params *p, const int *nk_host,
                                                const int32_t *dyn, const ks_cuda_attn_rope *rope, int n_splits, void *ws) {
    if (rope && p->head_dim / 2 > KS_CUDA_ATTN_ROPE_HALF)
        return ks_errorf(KS_ERR_UNSUPPORTED, "attention: rope over head_dim %d in the kernel", p->head_dim);
    if (!p->idx && !p->idx_at) {
        if (!dyn || !nk_host) return ks_errorf(KS_ERR_INTERNAL, "attention (recorded): no counts");
        return tc1_run(s, p, nk_host, NULL, 0, dyn, rope, n_splits, ws);
    }
    if (!ks_cuda_attn_decode_tc_supported(p) || p->n != 1 || !p->nk || !p->idx_off || !p->qpos || p->renumber != p->q_renumber)
        return ks_errorf(KS_ERR_UNSUPPORTED, "attention (recorded, staged lists): the tensor-core decode does not take this call");
    tc_byval bv;
    memset(&bv, 0, sizeof bv); /* on = 0: counts, offsets and position from p when the kernel runs */
    return tc_run(s, p, n_splits, ws, bv, rope);
}
