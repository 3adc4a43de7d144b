/* attn_decode_batch.cu — see attn_decode_batch.cuh. The kernel (below), its launcher, and the
 * backend entry
 * (ks_cuda_attn_decode_batch_run: descriptors uploaded once per call, the layers' host
 * bookkeeping; the per-session fallback is core/decode_batch.h's loop).
 *
 * The kernel. Block of ADB_THREADS (4 warps), for (split j, KV head h, session i), keys [t0, t1):
 *   new row     split 0 stores bf16(kn), bf16(vn), qpos at row nk of head h
 *   scores      lane = (sub 0..3, li 0..7): keys t0 + 64 s + 16 u + 4 warp + sub (u < 4: the
 *               four rows' 16-byte loads issued before any arithmetic, the same rows of V
 *               prefetched into L2 for the P V pass), dims [li D/8, +D/8);
 *               G dot products, reduced over the 8 lanes by 3 xor shuffles each -> sc[g][t]
 *   softmax     per head g (a warp each): m = max, p = exp(s - m), l = sum p (all masked: l = 0)
 *   P V         lane: D/8-lane rows, 8 dims each (one 16-byte load of bf16); slot = the row a
 *               lane group takes among the block's (4 warps x 32 / (D/8)), 8 rows' loads in
 *               flight per pass -> acc[g][8];
 *               then summed over the slots through shared memory
 *   finish      one split: out = acc / l. Else partials to the workspace; the last block of
 *               (i, h) (atomic count, after a fence) merges them: out = sum e^(m_j - M) acc_j /
 *               sum e^(m_j - M) l_j.
 * Registers: at most 128 a thread for g <= 4 (4 blocks a multiprocessor; g = 4, d = 128 spills
 * 32 bytes), unbounded for g = 8. A variant that copied each block's K and V rows into shared
 * memory first (both streams in flight) measured 12% slower on the H200 (514 against 461 us a
 * layer at B = 64, 4096 keys; bench/NOTES.md) and was removed.
 * Shared memory: sc (G, chunk) + red (slots, G, D) + ml (2, G) floats: at most 8*256*4 +
 * 16*8*64*4 or 8*8*128*4 + 64 bytes = 40 KiB. */
#include "cuda_backend_int.h"
#include "attn_decode_batch.cuh"
#include "mma.cuh"
extern "C" {
#include "decode_batch.h"
}

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define ADB_THREADS 128
#define ADB_WARPS 4

static __device__ __forceinline__ void bf8_to_f(uint4 u, float *f) {
    const __nv_bfloat162 *h = reinterpret_cast<const __nv_bfloat162 *>(&u);
#pragma unroll
    for (int e = 0; e < 4; e++) {
        float2 t = __bfloat1622float2(h[e]);
        f[2 * e] = t.x;
        f[2 * e + 1] = t.y;
    }
}

/* The end of a block (both kernels): red (SLOTS, G, D) holds the slots' partial P V sums of the
 * block's keys, ml (G, 2) each head's max and sum. One split: out = sum / l. Else the partials go
 * to the workspace and the last block of (session, head) sh (an atomic count, after a fence)
 * merges them: out = sum_j e^(m_j - M) acc_j / sum_j e^(m_j - M) l_j. */
template <int D, int G>
static __device__ __forceinline__ void adb_finish(const float *red, const float *ml, float *out, size_t sh, size_t nsh,
                                                  int j, int splits, int S, float *ws) {
    constexpr int SLOTS = ADB_WARPS * (32 / (D / 8));
    __shared__ int last;
    const int tid = threadIdx.x;
    if (splits == 1) {
        for (int o = tid; o < G * D; o += ADB_THREADS) {
            float a = 0.f;
#pragma unroll
            for (int s2 = 0; s2 < SLOTS; s2++) a += red[(size_t)s2 * G * D + o];
            float l = ml[2 * (o / D) + 1];
            out[o] = l > 0.f ? a / l : 0.f;
        }
        return;
    }
    float *wacc = ws, *wml = ws + nsh * S * G * D;
    unsigned *cnt = reinterpret_cast<unsigned *>(wml + nsh * S * G * 2);
    for (int o = tid; o < G * D; o += ADB_THREADS) {
        float a = 0.f;
#pragma unroll
        for (int s2 = 0; s2 < SLOTS; s2++) a += red[(size_t)s2 * G * D + o];
        wacc[(sh * S + j) * G * D + o] = a;
    }
    if (tid < 2 * G) wml[(sh * S + j) * G * 2 + tid] = ml[tid];
    __threadfence();
    __syncthreads();
    if (tid == 0) last = atomicAdd(&cnt[sh], 1u) == (unsigned)splits - 1;
    __syncthreads();
    if (!last) return;
    __threadfence();
    for (int o = tid; o < G * D; o += ADB_THREADS) {
        int g = o / D;
        float M = -INFINITY;
        for (int s2 = 0; s2 < splits; s2++) M = fmaxf(M, __ldcg(&wml[(sh * S + s2) * G * 2 + 2 * g]));
        float num = 0.f, den = 0.f;
        if (M != -INFINITY)
            for (int s2 = 0; s2 < splits; s2++) {
                float m = __ldcg(&wml[(sh * S + s2) * G * 2 + 2 * g]);
                if (m == -INFINITY) continue;
                float w = __expf(m - M);
                num += w * __ldcg(&wacc[(sh * S + s2) * G * D + o]);
                den += w * __ldcg(&wml[(sh * S + s2) * G * 2 + 2 * g + 1]);
            }
        out[o] = den > 0.f ? num / den : 0.f;
    }
}

/* workspace layout: acc (n, Hkv, S, G, D) floats, ml (n, Hkv, S, G, 2), count (n, Hkv) */
template <int D, int G>
__global__ void __launch_bounds__(ADB_THREADS, G >= 8 ? 1 : 4) adb_kernel(const ks_cuda_adb_seq *__restrict__ seqs,
                                                         const int32_t *__restrict__ nks, int Hkv, float scale,
                                                         int window, int chunk, int S, float *ws) {
    constexpr int KL = D / 8;         /* dims per lane in the score phase */
    constexpr int VL = D / 8;         /* lanes per value row (8 dims each) */
    constexpr int RPW = 32 / VL;      /* value rows per warp */
    constexpr int SLOTS = ADB_WARPS * RPW;
    extern __shared__ float smem[];
    float *sc = smem;                        /* (G, chunk) */
    float *red = sc + G * chunk;             /* (SLOTS, G, D) */
    float *ml = red + SLOTS * G * D;         /* (G, 2) */
    const int j = blockIdx.x, h = blockIdx.y, i = blockIdx.z;
    const ks_cuda_adb_seq sd = seqs[i];
    const int n0 = nks[sd.nk_off + h], total = n0 + 1;
    const int splits = (total + chunk - 1) / chunk;
    if (j >= splits) return;
    const int t0 = j * chunk, t1 = min(t0 + chunk, total), len = t1 - t0;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const bf16 *K = (const bf16 *)sd.k + (size_t)h * sd.capacity * D;
    const bf16 *V = (const bf16 *)sd.v + (size_t)h * sd.capacity * D;
    const int32_t *P = sd.kpos + (size_t)h * sd.capacity;
    const float *kn = sd.kn + (size_t)h * D, *vn = sd.vn + (size_t)h * D;
    const int qpos = sd.qpos;
    if (j == 0) { /* the new row into the cache (nobody reads it from there in this launch) */
        bf16 *Kw = (bf16 *)sd.k + ((size_t)h * sd.capacity + n0) * D;
        bf16 *Vw = (bf16 *)sd.v + ((size_t)h * sd.capacity + n0) * D;
        for (int e = tid; e < D; e += ADB_THREADS) {
            Kw[e] = __float2bfloat16(kn[e]);
            Vw[e] = __float2bfloat16(vn[e]);
        }
        if (tid == 0) sd.kpos[(size_t)h * sd.capacity + n0] = qpos;
    }
    /* ---- scores */
    const int sub = lane >> 3, li = lane & 7;
    float qr[G][KL];
#pragma unroll
    for (int g = 0; g < G; g++) {
        const float *qg = sd.q + (size_t)(h * G + g) * D + li * KL;
#pragma unroll
        for (int c = 0; c < KL; c += 4) {
            float4 f = *reinterpret_cast<const float4 *>(qg + c);
            qr[g][c] = f.x; qr[g][c + 1] = f.y; qr[g][c + 2] = f.z; qr[g][c + 3] = f.w;
        }
    }
    constexpr int KU = 4, KV16 = KL / 8; /* keys a lane group per pass (raw loads first), 16-byte loads a key */
    for (int tb = t0 + warp * 4; tb < t1; tb += KU * 4 * ADB_WARPS) {
        uint4 raw[KU][KV16];
#pragma unroll
        for (int u = 0; u < KU; u++) {
            int t = tb + u * 4 * ADB_WARPS + sub;
            const uint4 *src = reinterpret_cast<const uint4 *>(K + (size_t)t * D + li * KL);
#pragma unroll
            for (int c = 0; c < KV16; c++) raw[u][c] = t < t1 && t < n0 ? __ldcs(src + c) : make_uint4(0, 0, 0, 0);
            if (t < t1 && t < n0) /* this lane's part of the same row of V into L2: P V below reads it from there */
                asm volatile("prefetch.global.L2 [%0];" ::"l"(V + (size_t)t * D + li * KL));
        }
#pragma unroll
        for (int u = 0; u < KU; u++) {
            int t = tb + u * 4 * ADB_WARPS + sub;
            float kf[KL];
            if (t == n0) /* the new row, as the cache will hold it */
#pragma unroll
                for (int c = 0; c < KL; c++) kf[c] = __bfloat162float(__float2bfloat16(kn[li * KL + c]));
            else
#pragma unroll
                for (int c = 0; c < KV16; c++) bf8_to_f(raw[u][c], &kf[c * 8]);
            float d[G];
#pragma unroll
            for (int g = 0; g < G; g++) {
                float a = 0.f;
#pragma unroll
                for (int c = 0; c < KL; c++) a += qr[g][c] * kf[c];
                a += __shfl_xor_sync(0xffffffffu, a, 4);
                a += __shfl_xor_sync(0xffffffffu, a, 2);
                a += __shfl_xor_sync(0xffffffffu, a, 1);
                d[g] = a;
            }
            if (li == 0 && t < t1) {
                int kp = t < n0 ? P[t] : qpos;
                int vis = kp <= qpos && (window <= 0 || qpos - kp < window);
#pragma unroll
                for (int g = 0; g < G; g++) sc[g * chunk + (t - t0)] = vis ? d[g] * scale : -INFINITY;
            }
        }
    }
    __syncthreads();
    /* ---- softmax of the chunk, per head */
    for (int g = warp; g < G; g += ADB_WARPS) {
        float m = -INFINITY;
        for (int t = lane; t < len; t += 32) m = fmaxf(m, sc[g * chunk + t]);
        m = warp_max(m);
        float l = 0.f;
        for (int t = lane; t < len; t += 32) {
            float p = m == -INFINITY ? 0.f : __expf(sc[g * chunk + t] - m);
            sc[g * chunk + t] = p;
            l += p;
        }
        l = warp_sum(l);
        if (lane == 0) { ml[2 * g] = m; ml[2 * g + 1] = l; }
    }
    __syncthreads();
    /* ---- P V */
    const int slot = warp * RPW + lane / VL, dl = (lane % VL) * 8;
    float acc[G][8];
#pragma unroll
    for (int g = 0; g < G; g++)
#pragma unroll
        for (int e = 0; e < 8; e++) acc[g][e] = 0.f;
    constexpr int VU = 8; /* value rows a lane group per pass (raw loads first) */
    for (int tb = t0 + slot; tb < t1; tb += VU * SLOTS) {
        uint4 raw[VU];
#pragma unroll
        for (int u = 0; u < VU; u++) {
            int t = tb + u * SLOTS;
            raw[u] = t < t1 && t < n0 ? __ldcs(reinterpret_cast<const uint4 *>(V + (size_t)t * D + dl)) : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int u = 0; u < VU; u++) {
            int t = tb + u * SLOTS;
            if (t >= t1) break;
            float vf[8];
            if (t < n0) bf8_to_f(raw[u], vf);
            else
#pragma unroll
                for (int e = 0; e < 8; e++) vf[e] = __bfloat162float(__float2bfloat16(vn[dl + e]));
#pragma unroll
            for (int g = 0; g < G; g++) {
                float p = sc[g * chunk + (t - t0)];
#pragma unroll
                for (int e = 0; e < 8; e++) acc[g][e] += p * vf[e];
            }
        }
    }
#pragma unroll
    for (int g = 0; g < G; g++)
#pragma unroll
        for (int e = 0; e < 8; e += 4)
            *reinterpret_cast<float4 *>(&red[((size_t)slot * G + g) * D + dl + e]) =
                make_float4(acc[g][e], acc[g][e + 1], acc[g][e + 2], acc[g][e + 3]);
    __syncthreads();
    adb_finish<D, G>(red, ml, sd.out + (size_t)h * G * D, (size_t)i * Hkv + h, (size_t)gridDim.z * Hkv, j, splits, S, ws);
}

static int adb_slots(int d) { return ADB_WARPS * (32 / (d / 8)); }

extern "C" int ks_cuda_attn_decode_batch_supported(int n_heads, int n_kv_heads, int head_dim) {
    if (n_kv_heads < 1 || n_heads % n_kv_heads) return 0;
    int g = n_heads / n_kv_heads;
    return (head_dim == 64 || head_dim == 128) && (g == 1 || g == 2 || g == 4 || g == 8);
}

extern "C" size_t ks_cuda_attn_decode_batch_workspace(int n, int n_heads, int n_kv_heads, int head_dim, int max_rows,
                                                     int chunk) {
    int S = (max_rows + chunk - 1) / chunk, g = n_heads / n_kv_heads;
    if (S <= 1) return 0;
    size_t nsh = (size_t)n * n_kv_heads;
    return sizeof(float) * nsh * S * g * (head_dim + 2) + sizeof(unsigned) * nsh;
}

template <int D, int G>
static ks_status adb_launch(cudaStream_t s, const ks_cuda_adb_seq *seq, const int32_t *nk, int n, int Hkv, float scale,
                            int window, int chunk, int S, void *ws) {
    dim3 grid(S, Hkv, n);
    size_t smem = sizeof(float) * ((size_t)G * chunk + (size_t)adb_slots(D) * G * D + 2 * G);
    adb_kernel<D, G><<<grid, ADB_THREADS, smem, s>>>(seq, nk, Hkv, scale, window, chunk, S, (float *)ws);
    KS_CU_LAUNCH("batched decode attention kernel");
    return KS_OK;
}

extern "C" ks_status ks_cuda_attn_decode_batch(cudaStream_t s, const ks_cuda_adb_seq *seq, const int32_t *nk, int n,
                                               int n_heads, int n_kv_heads, int head_dim, int max_rows, float scale,
                                               int window, int chunk, void *ws) {
    if (!ks_cuda_attn_decode_batch_supported(n_heads, n_kv_heads, head_dim))
        return ks_errorf(KS_ERR_UNSUPPORTED, "batched decode attention: %d heads over %d KV heads of %d dims", n_heads,
                         n_kv_heads, head_dim);
    if (chunk < 16 || chunk > 256 || chunk % 16 || n < 1 || n > 65535 || n_kv_heads > 65535 || max_rows < 1)
        return ks_errorf(KS_ERR_ARG, "batched decode attention: chunk %d, %d sessions, %d KV heads, %d rows", chunk, n,
                         n_kv_heads, max_rows);
    int S = (max_rows + chunk - 1) / chunk;
    if (S > 1 && !ws) return ks_errorf(KS_ERR_ARG, "batched decode attention: %d splits need a workspace", S);
    if (S > 1) { /* the per-(session, head) counts start at zero */
        size_t nsh = (size_t)n * n_kv_heads, g = n_heads / n_kv_heads;
        KS_CU(cudaMemsetAsync((float *)ws + nsh * S * g * (head_dim + 2), 0, sizeof(unsigned) * nsh, s),
              "batched decode attention counts");
    }
    int g = n_heads / n_kv_heads;
#define ADB_CASE(DD, GG) \
    if (head_dim == DD && g == GG) return adb_launch<DD, GG>(s, seq, nk, n, n_kv_heads, scale, window, chunk, S, ws);
    ADB_CASE(64, 1) ADB_CASE(64, 2) ADB_CASE(64, 4) ADB_CASE(64, 8)
    ADB_CASE(128, 1) ADB_CASE(128, 2) ADB_CASE(128, 4) ADB_CASE(128, 8)
#undef ADB_CASE
    return ks_errorf(KS_ERR_INTERNAL, "batched decode attention: no instance for head_dim %d, group %d", head_dim, g);
}

/* ================================================================ the backend entry */

extern "C" ks_status ks_cuda_attn_decode_batch_run(ks_backend *b, int n, ks_kv_layer *const *L, const float *const *q,
                                                   const float *const *k, const float *const *v, const int32_t *pos,
                                                   int n_heads, float scale, int window, float *const *out, int chunk) {
    cuda_ctx *c = CTX(b);
    if (n <= 0) return KS_OK;
    if (!L || !q || !k || !v || !pos || !out) return ks_errorf(KS_ERR_ARG, "batched decode attention: NULL argument");
    if (c->rec) return rec_fail(c, "batched decode attention");
    int Hkv = L[0]->n_kv_heads, d = L[0]->head_dim, same = 1;
    for (int i = 0; i < n; i++) /* the kernel reads q with 16-byte loads */
        same &= L[i]->n_kv_heads == Hkv && L[i]->head_dim == d && (uintptr_t)q[i] % 16 == 0;
    if (!same || !c->o.decode_kernels || !ks_cuda_attn_decode_batch_supported(n_heads, Hkv, d) || n > 65535)
        return ks_attn_decode_batch_loop(b, n, L, q, k, v, pos, n_heads, scale, window, out); /* per session */
    ks_status st = KS_OK;
    for (int i = 0; i < n && !st; i++) st = kv_reserve(b, L[i], 1);
    if (st) return st;
    /* host: descriptors (n), then row counts (n, Hkv) */
    size_t dbytes = sizeof(ks_cuda_adb_seq) * (size_t)n, bytes = dbytes + sizeof(int32_t) * (size_t)n * Hkv;
    unsigned char *hb = (unsigned char *)ks_malloc(bytes);
    if (!hb) return KS_ERR_OOM;
    ks_cuda_adb_seq *sd = (ks_cuda_adb_seq *)hb;
    int32_t *nk = (int32_t *)(hb + dbytes);
    int max_rows = 1;
    long long keys = 0;
    for (int i = 0; i < n; i++) {
        memset(&sd[i], 0, sizeof sd[i]);
        sd[i].k = L[i]->k;
        sd[i].v = L[i]->v;
        sd[i].kpos = (int32_t *)L[i]->pos_dev;
        sd[i].q = q[i];
        sd[i].kn = k[i];
        sd[i].vn = v[i];
        sd[i].out = out[i];
        sd[i].capacity = L[i]->capacity;
        sd[i].qpos = pos[i];
        sd[i].nk_off = i * Hkv;
        for (int h = 0; h < Hkv; h++) {
            nk[(size_t)i * Hkv + h] = L[i]->n[h];
            max_rows = KS_MAX(max_rows, L[i]->n[h] + 1);
            keys += L[i]->n[h] + 1;
        }
    }
    if (chunk <= 0) { /* blocks enough for 4 per multiprocessor, 64..256 keys each */
        long long want = keys / (4LL * KS_MAX(c->n_sm, 1));
        chunk = 64;
        while (chunk < 256 && chunk < want) chunk *= 2;
    }
    void *db = NULL, *ws = NULL;
    size_t wsb = ks_cuda_attn_decode_batch_workspace(n, n_heads, Hkv, d, max_rows, chunk);
    st = upload_tmp(c, hb, bytes, "batched decode attention descriptors", &db);
    free(hb);
    if (!st && wsb) st = dev_alloc(c, wsb, "batched decode attention workspace", &ws);
    if (!st)
        st = ks_cuda_attn_decode_batch(c->stream, (const ks_cuda_adb_seq *)db, (const int32_t *)((unsigned char *)db + dbytes),
                                       n, n_heads, Hkv, d, max_rows, scale, window, chunk, ws);
    dev_free(c, ws);
    dev_free(c, db);
    if (st) return st;
    for (int i = 0; i < n; i++)
        for (int h = 0; h < Hkv; h++) L[i]->pos[(size_t)h * L[i]->capacity + L[i]->n[h]++] = pos[i];
    return KS_OK;
}

extern "C" ks_status ks_cuda_attn_decode_batch_hook(ks_backend *b, int n, ks_kv_layer *const *L, const float *const *q,
                                                    const float *const *k, const float *const *v, const int32_t *pos,
                                                    int n_heads, float scale, int window, float *const *out) {
    return ks_cuda_attn_decode_batch_run(b, n, L, q, k, v, pos, n_heads, scale, window, out, 0);
}
