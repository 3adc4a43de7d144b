/* attn_decode_batch.cu — see attn_decode_batch.cuh. The kernel, then the backend entry
 * (ks_cuda_attn_decode_batch_run: the host-made split, carried in the launch's arguments, the
 * layers' bookkeeping; the per-session fallback is core/decode_batch.h's loop).
 *
 * The kernel. Blocks of ADB_WARPS independent warps (they share nothing but the launch); warp w
 * of W: tiles [w T / W, (w+1) T / W) of the sequence of all segments' 16-key tiles (segment s =
 * session s / Hkv, KV head s % Hkv; tstart (nseg + 1) its first tiles; wseg[w] the segment of the
 * warp's first tile, found on the host). For each piece (its tiles of one segment):
 *   Q       the segment's g query heads as rows 0..g-1 of an m16 A tile: each lane packs its
 *           two bf16 pairs of row gq per 16 dims straight from q (rows 8..15 are zero registers)
 *   stream  ADB_STAGES-deep ring of (K tile, V tile, 16 positions) in the warp's shared memory,
 *           filled with cp.async (16 bytes a copy, 16-byte chunks XOR-swizzled by row: ldmatrix
 *           reads them without bank conflicts); rows past the segment are zero-filled; the new
 *           row (index nk) is converted from kn / vn and stored by plain stores, here and into
 *           the cache (with its position)
 *   S       = Q K^T: D/16 ldmatrix.x4 + 2 D/16 mma.m16n8k16 a tile; masked (piece end,
 *           position <= qpos, window), scaled into log2 units
 *   softmax online per row: m, l (l summed in float32 before P is rounded), O rescaled
 *   O      += P V: P (bf16) reuses the S accumulator layout as the A fragment; V through
 *           ldmatrix.trans, D/16 ldmatrix.x4 + D/8 mma a tile
 *   finish  a segment of one piece: out = O / l. Else the piece's (O, m, l) to its workspace
 *           slot w + s (unique: along the runs both w and s only grow and one of them steps);
 *           the last of the segment's pieces (atomic count, fences) merges its slots in order:
 *           out = sum_j 2^(m_j - M) O_j / sum_j 2^(m_j - M) l_j, and zeroes the count for the
 *           next launch (the counts are the backend's, kept). With out_bf16, out is also written
 *           rounded to bf16 there (the o-projection's GEMM input).
 *           (adb_merge: the slots' factors into the warp's idle ring, then every row's O with
 *           two slots' loads in flight; a merging warp then goes on with its next piece).
 * Only row gq < g of the C fragments (c0, c1) carries data; c2, c3 (rows 8..15) stay zero.
 * Shared memory: ADB_WARPS x ADB_STAGES x (2 x 16 x D x 2 + 64) bytes = 66 KiB at d 128 (187
 * registers: 2 blocks, 8 warps a multiprocessor on Hopper), 33 KiB at d 64. Warps: 8 a
 * multiprocessor and at least 16 tiles a warp (the small batches' best in the W sweeps).
 * Measured on an H200 (bench/NOTES.md, "batched decode attention on the tensor cores"), one 8B
 * layer: B = 64 x 4096 keys 274 us (3.9 TB/s; the kernel before 431), 16 x 32768 504 us (4.3
 * TB/s). A/B builds not taken: the merge in a second kernel (the same merge; 1-10% slower), rows
 * copied with cp.async.bulk into padded rows (with the first merge: 3% faster at B = 64, 3%
 * slower at 16 x 32K), a 3-stage ring (slower at every size). */
#include "cuda_backend_int.h"
#include "attn_decode_batch.cuh"
#include "mma.cuh"
extern "C" {
#include "decode_batch.h"
}

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define ADB_WARPS 4
#define ADB_KT 16      /* keys a tile */
#define ADB_STAGES 2   /* tiles in a warp's ring (3 measured slower at every size) */
#define ADB_MIN_TILES 16 /* the automatic warp count leaves at least this many tiles a warp */

/* bytes of one warp's ring: stages x (K tile, V tile, positions) */
template <int D> static __host__ __device__ constexpr size_t adb_wregion() {
    return (size_t)ADB_STAGES * (2 * ADB_KT * D * 2 + ADB_KT * 4);
}

/* The host-made arrays, one block of bytes: descriptors (n), then int32 row counts nk (nseg), first
 * tiles tstart (nseg + 1, then T), warps' first segments wseg (W); at byte offsets o_nk, o_tstart,
 * o_wseg. Up to ADB_INLINE bytes ride in the launch's arguments (no upload, no copy in the
 * stream); more are uploaded and read at gdesc. */
#define ADB_INLINE 22528
struct adb_args {
    const unsigned char *gdesc; /* the uploaded block, or NULL: the arguments' inline block */
    int o_nk, o_tstart, o_wseg;
    unsigned *cnt;              /* (nseg) pieces finished: zero at the start, left zero (the backend's, kept) */
    float *ws;                  /* (W + nseg) slots of adb_slot_floats: O (G, D), then (m, l) (G) */
    int Hkv, G, W, T;
    float sl2;                  /* scale * log2(e) */
    int window;
};
template <bool INL> struct adb_params;
template <> struct adb_params<false> { adb_args a; };
template <> struct adb_params<true> {
    adb_args a;
    alignas(16) unsigned char desc[ADB_INLINE];
};
static __device__ __forceinline__ const unsigned char *adb_desc(const adb_params<false> &P) { return P.a.gdesc; }
static __device__ __forceinline__ const unsigned char *adb_desc(const adb_params<true> &P) { return P.desc; }

/* floats of one workspace slot: O (G, D), then (m, l) (G), rounded up to 16 bytes (the merge
 * reads O with 16-byte loads; g = 3 would leave odd slots misaligned) */
static __host__ __device__ __forceinline__ size_t adb_slot_floats(int G, int D) {
    return ((size_t)G * (D + 2) + 3) & ~(size_t)3;
}

/* the warp whose run holds tile t */
static __host__ __device__ __forceinline__ int adb_warp_of(long long t, int W, int T) {
    return (int)(((t + 1) * W - 1) / T);
}

#define ADB_MERGE_CHUNK 128 /* slots whose factors the merge holds in shared memory at once */

/* The merge of a segment's np partial slots (ws0: the first; slot j at ws0 + j adb_slot_floats)
 * into out (G, D) (and, with ob non-NULL, its bf16 copy ob), by one warp, with fs (ADB_MERGE_CHUNK x 8 floats of shared memory the warp
 * owns): each row's max M over the slots (lanes take slots, all rows' loads at once), then per
 * chunk of slots each slot's factor f = 2^(m - M) into fs and the denominator sum f l, then lane
 * sums dims [lane D/32, +D/32) of every row over the chunk's slots in order, two slots' loads in
 * flight (no load waits on another: the factors come from fs). Deterministic. */
template <int D>
static __device__ __forceinline__ void adb_merge(const float *ws0, int np, int G, float *out, bf16 *ob, int lane, float *fs) {
    constexpr int DL = D / 32;
    const size_t SS = adb_slot_floats(G, D);
    float M[8], den[8], acc[8][DL];
#pragma unroll
    for (int r = 0; r < 8; r++) {
        M[r] = -INFINITY;
        den[r] = 0.f;
#pragma unroll
        for (int e = 0; e < DL; e++) acc[r][e] = 0.f;
    }
    for (int j = lane; j < np; j += 32) {
        float mv[8];
#pragma unroll
        for (int r = 0; r < 8; r++) mv[r] = r < G ? __ldcg(ws0 + j * SS + G * D + 2 * r) : -INFINITY;
#pragma unroll
        for (int r = 0; r < 8; r++) M[r] = fmaxf(M[r], mv[r]);
    }
#pragma unroll
    for (int r = 0; r < 8; r++) M[r] = warp_max(M[r]);
    for (int c0 = 0; c0 < np; c0 += ADB_MERGE_CHUNK) {
        const int cn = min(np - c0, ADB_MERGE_CHUNK);
        __syncwarp(); /* the chunk before has read fs */
        for (int j = lane; j < cn; j += 32) {
            float2 ml[8];
#pragma unroll
            for (int r = 0; r < 8; r++)
                ml[r] = r < G ? __ldcg(reinterpret_cast<const float2 *>(ws0 + (c0 + j) * SS + G * D + 2 * r))
                              : make_float2(-INFINITY, 0.f);
#pragma unroll
            for (int r = 0; r < 8; r++) {
                const float f = ml[r].x == -INFINITY ? 0.f : fast_exp2(ml[r].x - M[r]);
                fs[j * 8 + r] = f;
                den[r] += f * ml[r].y;
            }
        }
        __syncwarp();
#pragma unroll 2
        for (int j = 0; j < cn; j++) {
            const float *sl = ws0 + (c0 + j) * SS + lane * DL;
            float v[8][DL];
#pragma unroll
            for (int r = 0; r < 8; r++) {
                if constexpr (DL == 4) {
                    const float4 x = r < G ? __ldcg(reinterpret_cast<const float4 *>(sl + r * D)) : make_float4(0.f, 0.f, 0.f, 0.f);
                    v[r][0] = x.x; v[r][1] = x.y; v[r][2] = x.z; v[r][3] = x.w;
                } else {
                    const float2 x = r < G ? __ldcg(reinterpret_cast<const float2 *>(sl + r * D)) : make_float2(0.f, 0.f);
                    v[r][0] = x.x; v[r][1] = x.y;
                }
            }
#pragma unroll
            for (int r = 0; r < 8; r++) {
                const float f = fs[j * 8 + r];
#pragma unroll
                for (int e = 0; e < DL; e++) acc[r][e] += f * v[r][e];
            }
        }
    }
    __syncwarp(); /* fs is the caller's again */
#pragma unroll
    for (int r = 0; r < 8; r++) {
        const float dn = warp_sum(den[r]);
        if (r >= G) continue;
        const float inv = dn > 0.f ? 1.f / dn : 0.f;
#pragma unroll
        for (int e = 0; e < DL; e++) {
            out[r * D + lane * DL + e] = acc[r][e] * inv;
            if (ob) ob[r * D + lane * DL + e] = __float2bfloat16_rn(acc[r][e] * inv);
        }
    }
}

template <int D, bool INL>
__global__ void __launch_bounds__(ADB_WARPS * 32, D == 128 ? 2 : 3) adb_kernel(const __grid_constant__ adb_params<INL> P) {
    const adb_args &a = P.a;
    const unsigned char *db = adb_desc(P);
    const ks_cuda_adb_seq *const seq = reinterpret_cast<const ks_cuda_adb_seq *>(db);
    const int32_t *const nkv = reinterpret_cast<const int32_t *>(db + a.o_nk);
    const int32_t *const tstart = reinterpret_cast<const int32_t *>(db + a.o_tstart);
    const int32_t *const wseg = reinterpret_cast<const int32_t *>(db + a.o_wseg);
    extern __shared__ __align__(128) unsigned char smem[];
    constexpr int NCH = D / 8, KS = D / 16, DT = D / 8;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int gw = blockIdx.x * ADB_WARPS + warp;
    if (gw >= a.W) return;
    const int gq = lane >> 2, tig = lane & 3, G = a.G;
    const bool rowok = gq < G;
    bf16 *wK = (bf16 *)(smem + (size_t)warp * adb_wregion<D>()); /* stages x (KT, D) */
    bf16 *wV = wK + ADB_STAGES * ADB_KT * D;                     /* stages x (KT, D) */
    int *wP = (int *)(wV + ADB_STAGES * ADB_KT * D);            /* stages x KT */
    int tb = (int)((long long)gw * a.T / a.W);
    const int tend = (int)((long long)(gw + 1) * a.T / a.W);
    for (int s = wseg[gw]; tb < tend; s++) {
        const int ts = tstart[s], tse = tstart[s + 1], pe = min(tend, tse);
        const int i = s / a.Hkv, h = s - i * a.Hkv;
        const ks_cuda_adb_seq *sd = seq + i;
        const int n0 = nkv[s], cap = sd->capacity, qpos = sd->qpos;
        const size_t hrow = (size_t)h * cap;
        const bf16 *Kh = (const bf16 *)sd->k + hrow * D, *Vh = (const bf16 *)sd->v + hrow * D;
        const int32_t *Ph = sd->kpos + hrow;
        const float *kn = sd->kn + (size_t)h * D, *vn = sd->vn + (size_t)h * D;
        const int k0 = (tb - ts) * ADB_KT, k1 = min((pe - ts) * ADB_KT, n0 + 1); /* this piece's keys */
        const int nt = (k1 - k0 + ADB_KT - 1) / ADB_KT;

        /* Q: row gq of the tile = query head h * G + gq, bf16 pairs (dims 16 ks + 2 tig, + 8) */
        uint32_t qf[KS][2];
        {
            const float *qg = sd->q + (size_t)(h * G + (rowok ? gq : 0)) * D + 2 * tig;
#pragma unroll
            for (int ks = 0; ks < KS; ks++) {
                float2 x = rowok ? *reinterpret_cast<const float2 *>(qg + ks * 16) : make_float2(0.f, 0.f);
                float2 y = rowok ? *reinterpret_cast<const float2 *>(qg + ks * 16 + 8) : make_float2(0.f, 0.f);
                qf[ks][0] = pack_bf16(x.x, x.y);
                qf[ks][1] = pack_bf16(y.x, y.y);
            }
        }

        /* tile of keys [t0, t0 + 16) into ring stage st */
        auto load = [&](int t0, int st) {
            bf16 *dk = wK + st * ADB_KT * D, *dv = wV + st * ADB_KT * D;
#pragma unroll
            for (int e = lane; e < ADB_KT * NCH; e += 32) {
                const int r = e / NCH, ch = e - r * NCH, t = t0 + r;
                if (t == n0) { /* the new row: bf16 of the input, into the tile and the cache */
                    const float *kr = kn + ch * 8, *vr = vn + ch * 8;
                    uint4 kk = make_uint4(pack_bf16(kr[0], kr[1]), pack_bf16(kr[2], kr[3]), pack_bf16(kr[4], kr[5]),
                                          pack_bf16(kr[6], kr[7]));
                    uint4 vv = make_uint4(pack_bf16(vr[0], vr[1]), pack_bf16(vr[2], vr[3]), pack_bf16(vr[4], vr[5]),
                                          pack_bf16(vr[6], vr[7]));
                    *reinterpret_cast<uint4 *>(dk + swz<D>(r, ch)) = kk;
                    *reinterpret_cast<uint4 *>(dv + swz<D>(r, ch)) = vv;
                    *reinterpret_cast<uint4 *>((bf16 *)sd->k + (hrow + n0) * D + ch * 8) = kk;
                    *reinterpret_cast<uint4 *>((bf16 *)sd->v + (hrow + n0) * D + ch * 8) = vv;
                } else {
                    const bool ok = t < n0;
                    const size_t off = (size_t)(ok ? t : 0) * D + ch * 8;
                    cp_async16(dk + swz<D>(r, ch), Kh + off, ok ? 16 : 0);
                    cp_async16(dv + swz<D>(r, ch), Vh + off, ok ? 16 : 0);
                }
            }
            if (lane < ADB_KT) {
                const int t = t0 + lane;
                if (t < n0) cp_async4(wP + st * ADB_KT + lane, Ph + t, 4);
                else wP[st * ADB_KT + lane] = qpos; /* the new row (rows past it are masked) */
                if (t == n0) sd->kpos[hrow + n0] = qpos;
            }
        };

        float o[DT][4];
#pragma unroll
        for (int d = 0; d < DT; d++) o[d][0] = o[d][1] = o[d][2] = o[d][3] = 0.f;
        float m_r = -INFINITY, l_r = 0.f;
#pragma unroll
        for (int p = 0; p < ADB_STAGES - 1; p++) {
            if (p < nt) load(k0 + p * ADB_KT, p);
            cp_async_commit();
        }
        for (int it = 0; it < nt; it++) {
            if (it + ADB_STAGES - 1 < nt) load(k0 + (it + ADB_STAGES - 1) * ADB_KT, (it + ADB_STAGES - 1) % ADB_STAGES);
            cp_async_commit();
            cp_async_wait<ADB_STAGES - 1>();
            __syncwarp();
            const int st = it % ADB_STAGES, t0 = k0 + it * ADB_KT;
            const bf16 *cK = wK + st * ADB_KT * D, *cV = wV + st * ADB_KT * D;
            const int *kp = wP + st * ADB_KT;

            float sc[2][4];
#pragma unroll
            for (int j = 0; j < 2; j++) sc[j][0] = sc[j][1] = sc[j][2] = sc[j][3] = 0.f;
#pragma unroll
            for (int ks = 0; ks < KS; ks++) {
                uint32_t b[4], qa[4] = {qf[ks][0], 0u, qf[ks][1], 0u};
                ldsm_x4(b, cK + swz<D>((lane & 7) + (lane >> 4) * 8, ks * 2 + ((lane >> 3) & 1)));
                mma16816(sc[0], qa, b[0], b[1]);
                mma16816(sc[1], qa, b[2], b[3]);
            }
            float mx = -INFINITY;
#pragma unroll
            for (int j = 0; j < 2; j++)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    const int col = j * 8 + tig * 2 + e, key = kp[col];
                    const bool vis = rowok && t0 + col < k1 && key <= qpos &&
                                     (a.window <= 0 || (long long)qpos - key < a.window);
                    sc[j][e] = vis ? sc[j][e] * a.sl2 : -INFINITY;
                    mx = fmaxf(mx, sc[j][e]);
                }
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
            const float mn = fmaxf(m_r, mx), base = mn == -INFINITY ? 0.f : mn, c = fast_exp2(m_r - base);
            m_r = mn;
            float ps = 0.f;
#pragma unroll
            for (int j = 0; j < 2; j++)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    sc[j][e] = fast_exp2(sc[j][e] - base);
                    ps += sc[j][e];
                }
            l_r = l_r * c + ps;
#pragma unroll
            for (int d = 0; d < DT; d++) {
                o[d][0] *= c;
                o[d][1] *= c;
            }
            const uint32_t pa[4] = {pack_bf16(sc[0][0], sc[0][1]), 0u, pack_bf16(sc[1][0], sc[1][1]), 0u};
#pragma unroll
            for (int dp = 0; dp < DT / 2; dp++) {
                uint32_t b[4];
                ldsm_x4_t(b, cV + swz<D>((lane & 7) + ((lane >> 3) & 1) * 8, dp * 2 + (lane >> 4)));
                mma16816(o[2 * dp], pa, b[0], b[1]);
                mma16816(o[2 * dp + 1], pa, b[2], b[3]);
            }
            __syncwarp(); /* a later load overwrites this stage */
        }
        cp_async_wait<0>();
        __syncwarp();

        /* ---- finish the piece */
        l_r += __shfl_xor_sync(0xffffffffu, l_r, 1);
        l_r += __shfl_xor_sync(0xffffffffu, l_r, 2);
        const int wf = adb_warp_of(ts, a.W, a.T), wl = adb_warp_of(tse - 1, a.W, a.T);
        float *out = sd->out + (size_t)h * G * D;
        bf16 *ob = sd->out_bf16 ? static_cast<bf16 *>(sd->out_bf16) + (size_t)h * G * D : nullptr;
        if (wf == wl) { /* the whole segment was this piece */
            if (rowok) {
                const float inv = l_r > 0.f ? 1.f / l_r : 0.f;
#pragma unroll
                for (int d = 0; d < DT; d++) {
                    const float2 r = make_float2(o[d][0] * inv, o[d][1] * inv);
                    *reinterpret_cast<float2 *>(out + gq * D + d * 8 + 2 * tig) = r;
                    if (ob) *reinterpret_cast<__nv_bfloat162 *>(ob + gq * D + d * 8 + 2 * tig) = __floats2bfloat162_rn(r.x, r.y);
                }
            }
        } else {
            float *slot = a.ws + (size_t)(gw + s) * adb_slot_floats(G, D);
            if (rowok) {
#pragma unroll
                for (int d = 0; d < DT; d++)
                    *reinterpret_cast<float2 *>(slot + gq * D + d * 8 + 2 * tig) = make_float2(o[d][0], o[d][1]);
                if (tig == 0) *reinterpret_cast<float2 *>(slot + G * D + 2 * gq) = make_float2(m_r, l_r);
            }
            __threadfence();
            __syncwarp();
            unsigned done = 0;
            if (lane == 0) done = atomicAdd(&a.cnt[s], 1u);
            done = __shfl_sync(0xffffffffu, done, 0);
            if (done == (unsigned)(wl - wf)) { /* the last piece: merge the slots wf + s .. wl + s */
                if (lane == 0) a.cnt[s] = 0u; /* every piece has counted: zero for the next launch */
                __threadfence();
                adb_merge<D>(a.ws + (size_t)(wf + s) * adb_slot_floats(G, D), wl - wf + 1, G, out, ob, lane, (float *)wK);
            }
        }
        tb = pe;
    }
}

extern "C" int ks_cuda_attn_decode_batch_supported(int n_heads, int n_kv_heads, int head_dim) {
    if (n_kv_heads < 1 || n_heads % n_kv_heads) return 0;
    int g = n_heads / n_kv_heads;
    return (head_dim == 64 || head_dim == 128) && g >= 1 && g <= 8;
}

/* blocks a multiprocessor holds (the shared-memory attribute set first), per device; 0 on error */
template <int D, bool INL> static int adb_occupancy(void) {
    static int occ[64]; /* per device: the kernel's attributes and occupancy do not change */
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) return 0;
    if (!occ[dev]) {
        int nb = 0;
        if (cudaFuncSetAttribute(adb_kernel<D, INL>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 (int)(ADB_WARPS * adb_wregion<D>())) != cudaSuccess ||
            cudaFuncSetAttribute(adb_kernel<D, INL>, cudaFuncAttributePreferredSharedMemoryCarveout,
                                 cudaSharedmemCarveoutMaxShared) != cudaSuccess ||
            cudaOccupancyMaxActiveBlocksPerMultiprocessor(&nb, adb_kernel<D, INL>, ADB_WARPS * 32,
                                                          ADB_WARPS * adb_wregion<D>()) != cudaSuccess)
            return 0;
        occ[dev] = nb;
    }
    return occ[dev];
}

template <int D, bool INL> static ks_status adb_launch(cudaStream_t s, const adb_params<INL> &P) {
    const adb_args &a = P.a;
    if (!adb_occupancy<D, INL>()) {
        cudaGetLastError();
        return ks_errorf(KS_ERR_DEVICE, "batched decode attention: the kernel's shared memory (%zu bytes) is not available",
                         ADB_WARPS * adb_wregion<D>());
    }
    adb_kernel<D, INL><<<(a.W + ADB_WARPS - 1) / ADB_WARPS, ADB_WARPS * 32, ADB_WARPS * adb_wregion<D>(), s>>>(P);
    KS_CU_LAUNCH("batched decode attention kernel");
    return KS_OK;
}

/* ================================================================ the backend entry */

extern "C" ks_status ks_cuda_attn_decode_batch_run(ks_backend *b, int n, ks_kv_layer *const *L, const float *const *q,
                                                   const float *const *k, const float *const *v, const int32_t *pos,
                                                   int n_heads, float scale, int window, float *const *out, void *out_bf16,
                                                   int warps) {
    cuda_ctx *c = CTX(b);
    if (warps < 0) return ks_errorf(KS_ERR_ARG, "batched decode attention: %d warps", warps);
    if (n <= 0) return KS_OK;
    if (!L || !q || !k || !v || !pos || !out) return ks_errorf(KS_ERR_ARG, "batched decode attention: NULL argument");
    if (c->rec) return rec_fail(c, "batched decode attention");
    int Hkv = L[0]->n_kv_heads, d = L[0]->head_dim, same = 1;
    for (int i = 0; i < n; i++) /* the kernel reads q 8 bytes at a time */
        same &= L[i]->n_kv_heads == Hkv && L[i]->head_dim == d && (uintptr_t)q[i] % 16 == 0;
    if (out_bf16)
        for (int i = 1; i < n; i++)
            if (out[i] != out[0] + (size_t)i * n_heads * d)
                return ks_errorf(KS_ERR_ARG, "batched decode attention: a bf16 copy of rows that are not contiguous");
    if (!same || !c->o.decode_kernels || !ks_cuda_attn_decode_batch_supported(n_heads, Hkv, d)) { /* per session */
        ks_status sl = ks_attn_decode_batch_loop(b, n, L, q, k, v, pos, n_heads, scale, window, out);
        if (!sl && out_bf16) sl = ks_cuda_convert(c->stream, out_bf16, KS_CUDA_BF16, out[0], KS_CUDA_F32, (size_t)n * n_heads * d);
        return sl;
    }
    ks_status st = KS_OK;
    for (int i = 0; i < n && !st; i++) st = kv_reserve(b, L[i], 1);
    if (st) return st;
    const int G = n_heads / Hkv, nseg = n * Hkv;
    long long T = 0;
    for (int i = 0; i < n; i++)
        for (int h = 0; h < Hkv; h++) T += (L[i]->n[h] + 1 + ADB_KT - 1) / ADB_KT;
    if (T > INT32_MAX / 2) return ks_errorf(KS_ERR_ARG, "batched decode attention: %lld key tiles", T);
    long long W = warps;
    if (!W) {
        int occ = d == 128 ? adb_occupancy<128, true>() : adb_occupancy<64, true>();
        W = (long long)KS_MAX(c->n_sm, 1) * KS_MAX(occ, 1) * ADB_WARPS;
        W = KS_MIN(W, KS_MAX(T / ADB_MIN_TILES, 1));
    }
    W = KS_MIN(W, T);
    /* the segments' piece counters: the backend's, zero between launches (the last piece of a
     * segment zeroes its own) */
    if (nseg > c->adb_cnt_n) {
        void *p = NULL;
        size_t cn = KS_MAX((size_t)nseg, (size_t)1024);
        if ((st = raw_alloc(c, sizeof(unsigned) * cn, "batched decode attention counters", &p))) return st;
        if (cudaMemsetAsync(p, 0, sizeof(unsigned) * cn, c->stream) != cudaSuccess) {
            raw_free(c, p);
            KS_CU(cudaGetLastError(), "batched decode attention counters");
        }
        raw_free(c, c->adb_cnt); /* cudaFree waits for the launches that used it */
        c->adb_cnt = (unsigned *)p;
        c->adb_cnt_n = (int)cn;
    }
    /* host: descriptors (n), row counts (nseg), first tiles (nseg + 1), warps' first segments (W) */
    size_t dbytes = sizeof(ks_cuda_adb_seq) * (size_t)n, ints = (size_t)2 * nseg + 1 + (size_t)W;
    size_t bytes = dbytes + sizeof(int32_t) * ints;
    const int inl = bytes <= ADB_INLINE; /* the block rides in the launch's arguments */
    static_assert(sizeof(ks_cuda_adb_seq) % 4 == 0, "descriptors keep the int32 arrays aligned");
    adb_params<true> *PI = inl ? (adb_params<true> *)ks_malloc(sizeof(adb_params<true>)) : NULL;
    unsigned char *hb = inl ? (PI ? PI->desc : NULL) : (unsigned char *)ks_malloc(bytes);
    if (!hb) {
        free(PI);
        return ks_errorf(KS_ERR_OOM, "batched decode attention: %zu bytes of descriptors", bytes);
    }
    ks_cuda_adb_seq *sd = (ks_cuda_adb_seq *)hb;
    int32_t *nk = (int32_t *)(hb + dbytes), *tstart = nk + nseg, *wseg = tstart + nseg + 1;
    int multi = 0;
    for (int i = 0, t = 0; i < n; i++) {
        memset(&sd[i], 0, sizeof sd[i]);
        sd[i].k = L[i]->k;
        sd[i].v = L[i]->v;
        sd[i].kpos = (int32_t *)L[i]->pos_dev;
        sd[i].q = q[i];
        sd[i].kn = k[i];
        sd[i].vn = v[i];
        sd[i].out = out[i];
        sd[i].out_bf16 = out_bf16 ? (bf16 *)out_bf16 + (size_t)i * n_heads * d : NULL;
        sd[i].capacity = L[i]->capacity;
        sd[i].qpos = pos[i];
        for (int h = 0; h < Hkv; h++) {
            int sg = i * Hkv + h, nt = (L[i]->n[h] + 1 + ADB_KT - 1) / ADB_KT;
            nk[sg] = L[i]->n[h];
            tstart[sg] = t;
            multi |= adb_warp_of(t, (int)W, (int)T) != adb_warp_of(t + nt - 1, (int)W, (int)T);
            t += nt;
        }
    }
    tstart[nseg] = (int32_t)T;
    for (long long w = 0, sg = 0; w < W; w++) {
        long long a0 = w * T / W;
        while (tstart[sg + 1] <= a0) sg++;
        wseg[w] = (int32_t)sg;
    }
    adb_args a;
    memset(&a, 0, sizeof a);
    a.o_nk = (int)dbytes;
    a.o_tstart = (int)(dbytes + sizeof(int32_t) * nseg);
    a.o_wseg = (int)(dbytes + sizeof(int32_t) * (2 * (size_t)nseg + 1));
    a.cnt = c->adb_cnt;
    a.Hkv = Hkv;
    a.G = G;
    a.W = (int)W;
    a.T = (int)T;
    a.sl2 = scale * 1.4426950408889634f;
    a.window = window;
    void *db = NULL, *ws = NULL;
    if (!inl) st = upload_tmp(c, hb, bytes, "batched decode attention descriptors", &db);
    if (!st && multi) st = dev_alloc(c, sizeof(float) * (size_t)(W + nseg) * adb_slot_floats(G, d), "batched decode attention workspace", &ws);
    if (!st) {
        a.ws = (float *)ws;
        if (inl) {
            PI->a = a;
            st = d == 128 ? adb_launch<128, true>(c->stream, *PI) : adb_launch<64, true>(c->stream, *PI);
        } else {
            adb_params<false> P = {a};
            P.a.gdesc = (const unsigned char *)db;
            st = d == 128 ? adb_launch<128, false>(c->stream, P) : adb_launch<64, false>(c->stream, P);
        }
    }
    if (inl) free(PI);
    else free(hb);
    dev_free(c, ws);
    dev_free(c, db);
    if (st) return st;
    for (int i = 0; i < n; i++)
        for (int h = 0; h < Hkv; h++) L[i]->pos[(size_t)h * L[i]->capacity + L[i]->n[h]++] = pos[i];
    return KS_OK;
}

extern "C" ks_status ks_cuda_attn_decode_batch_hook(ks_backend *b, int n, ks_kv_layer *const *L, const float *const *q,
                                                    const float *const *k, const float *const *v, const int32_t *pos,
                                                    int n_heads, float scale, int window, float *const *out, void *out_bf16) {
    return ks_cuda_attn_decode_batch_run(b, n, L, q, k, v, pos, n_heads, scale, window, out, out_bf16, 0);
}
