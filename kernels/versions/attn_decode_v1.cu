/* attn_decode.cu — see attn_decode.cuh.
 *
 * Block = (split of the keys, KV head x chunk of its query heads, query row). Per tile of TK
 * keys: K and V rows (gathered through the index list when there is one) go to shared
 * memory, each (head, key) logit is one thread's dot product, the running max / sum per head
 * are updated by one warp per head (online softmax), and each thread accumulates its
 * (head, column) outputs over the tile. With several splits the unnormalised partial results
 * (acc, m, l) go to a workspace and a second kernel combines them. Float32 arithmetic on bf16
 * keys and values, so the result follows the CPU reference to float rounding. */
#include "common.cuh"
#include "attn_decode.cuh"

#include <math.h>

#define AD_THREADS 128
#define AD_MAXR 16 /* outputs per thread: a block holds at most 16 * 128 = 2048 (head, column) pairs */

typedef struct ad_shape {
    int TK;      /* keys per tile */
    int dp;      /* shared-memory row pitch of K and V, in bf16 */
    int GB;      /* query heads per block */
    int hchunks; /* blocks per KV head along the query heads */
    int vec;     /* head_dim % 8 == 0: 16-byte loads */
    size_t smem;
} ad_shape;

static __host__ __device__ size_t align16(size_t x) { return (x + 15) & ~(size_t)15; }

static int ad_shape_of(const ks_cuda_attn_params *p, ad_shape *s) {
    int d = p->head_dim, g = p->n_heads / p->n_kv_heads;
    if (d <= 0 || d > 512) return -1;
    s->TK = d <= 128 ? 64 : d <= 256 ? 32 : 16;
    s->vec = d % 8 == 0;
    s->dp = ((d + 7) / 8) * 8 + 8;
    s->GB = KS_MIN(g, KS_MAX(1, (AD_MAXR * AD_THREADS) / d));
    s->hchunks = (g + s->GB - 1) / s->GB;
    s->smem = align16((size_t)s->GB * d * 4) + 2 * align16((size_t)s->TK * s->dp * 2) + (size_t)s->GB * s->TK * 4 +
              3 * 4 * (size_t)s->GB + 4 * (size_t)s->TK;
    return 0;
}

template <bool VEC>
__global__ void __launch_bounds__(AD_THREADS)
attn_decode_kernel(ks_cuda_attn_params p, ad_shape sh, int n_splits, float *__restrict__ ws_acc, float *__restrict__ ws_ml) {
    extern __shared__ __align__(16) unsigned char smem[];
    const int d = p.head_dim, H = p.n_heads, g = H / p.n_kv_heads, TK = sh.TK, dp = sh.dp;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    unsigned char *sp = smem;
    float *Qs = (float *)sp;             sp += align16((size_t)sh.GB * d * 4);
    bf16 *Ks = (bf16 *)sp;               sp += align16((size_t)TK * dp * 2);
    bf16 *Vs = (bf16 *)sp;               sp += align16((size_t)TK * dp * 2);
    float *S = (float *)sp;              sp += (size_t)sh.GB * TK * 4;
    float *Ms = (float *)sp, *Ls = Ms + sh.GB, *Cs = Ls + sh.GB;
    int *Vis = (int *)(Cs + sh.GB);

    const int kv = blockIdx.y / sh.hchunks, hc = blockIdx.y % sh.hchunks;
    const int gb = min(sh.GB, g - hc * sh.GB), h0 = kv * g + hc * sh.GB;
    const int split = blockIdx.x;
    const int nkh = p.nk[kv];
    int per = (nkh + n_splits - 1) / n_splits;
    per = (per + TK - 1) / TK * TK;
    const int tb = split * per, te = min(nkh, tb + per);
    const int32_t *ix = p.idx ? p.idx + p.idx_off[kv] : nullptr;
    const bf16 *Kh = (const bf16 *)p.k + (size_t)kv * p.capacity * d;
    const bf16 *Vh = (const bf16 *)p.v + (size_t)kv * p.capacity * d;
    const int32_t *Ph = p.kpos + (size_t)kv * p.capacity;
    const int R = (gb * d + AD_THREADS - 1) / AD_THREADS;

    for (int i = blockIdx.z; i < p.n; i += gridDim.z) {
        const int qp = p.qpos[i];
        const float *qrow = p.q + ((size_t)i * H + h0) * d;
        for (int e = tid; e < gb * d; e += AD_THREADS) Qs[e] = qrow[e];
        if (tid < gb) { Ms[tid] = -INFINITY; Ls[tid] = 0.f; }
        float acc[AD_MAXR];
#pragma unroll
        for (int r = 0; r < AD_MAXR; r++) acc[r] = 0.f;
        __syncthreads();

        for (int t0 = tb; t0 < te; t0 += TK) {
            const int tn = min(TK, te - t0);
            if (VEC) {
                const int upr = d >> 3;
                for (int u = tid; u < tn * upr; u += AD_THREADS) {
                    int rr = u / upr, c = (u - rr * upr) << 3;
                    int j = ix ? ix[t0 + rr] : t0 + rr;
                    *reinterpret_cast<uint4 *>(Ks + rr * dp + c) = *reinterpret_cast<const uint4 *>(Kh + (size_t)j * d + c);
                    *reinterpret_cast<uint4 *>(Vs + rr * dp + c) = *reinterpret_cast<const uint4 *>(Vh + (size_t)j * d + c);
                }
            } else {
                for (int u = tid; u < tn * d; u += AD_THREADS) {
                    int rr = u / d, c = u - rr * d;
                    int j = ix ? ix[t0 + rr] : t0 + rr;
                    Ks[rr * dp + c] = Kh[(size_t)j * d + c];
                    Vs[rr * dp + c] = Vh[(size_t)j * d + c];
                }
            }
            for (int rr = tid; rr < TK; rr += AD_THREADS) {
                int vis = 0;
                if (rr < tn) {
                    int j = ix ? ix[t0 + rr] : t0 + rr;
                    int kp = (ix && p.renumber) ? t0 + rr : Ph[j];
                    vis = kp <= qp && (p.window <= 0 || (long long)qp - kp < p.window);
                }
                Vis[rr] = vis;
            }
            __syncthreads();

            /* logits: one (head, key) dot product per thread and step */
            for (int e = tid; e < gb * TK; e += AD_THREADS) {
                int hh = e / TK, jj = e - hh * TK;
                float sc = -INFINITY;
                if (Vis[jj]) {
                    const float *qh = Qs + hh * d;
                    const bf16 *kr = Ks + jj * dp;
                    float a0 = 0.f, a1 = 0.f;
                    if (VEC) {
                        for (int c = 0; c < d; c += 8) {
                            uint4 u = *reinterpret_cast<const uint4 *>(kr + c);
                            const __nv_bfloat162 *k2 = reinterpret_cast<const __nv_bfloat162 *>(&u);
                            float4 q0 = *reinterpret_cast<const float4 *>(qh + c);
                            float4 q1 = *reinterpret_cast<const float4 *>(qh + c + 4);
                            float2 f0 = __bfloat1622float2(k2[0]), f1 = __bfloat1622float2(k2[1]);
                            float2 f2 = __bfloat1622float2(k2[2]), f3 = __bfloat1622float2(k2[3]);
                            a0 += q0.x * f0.x + q0.y * f0.y + q0.z * f1.x + q0.w * f1.y;
                            a1 += q1.x * f2.x + q1.y * f2.y + q1.z * f3.x + q1.w * f3.y;
                        }
                    } else {
                        for (int c = 0; c < d; c++) a0 += qh[c] * __bfloat162float(kr[c]);
                    }
                    sc = (a0 + a1) * p.scale;
                }
                S[hh * TK + jj] = sc;
            }
            __syncthreads();

            /* online softmax: one warp per head */
            for (int hh = warp; hh < gb; hh += AD_THREADS / 32) {
                float *Sh = S + hh * TK;
                float mx = -INFINITY;
                for (int jj = lane; jj < TK; jj += 32) mx = fmaxf(mx, Sh[jj]);
                mx = warp_max(mx);
                float mo = Ms[hh], mn = fmaxf(mo, mx), sum = 0.f;
                for (int jj = lane; jj < TK; jj += 32) {
                    float s = Sh[jj];
                    float pr = s == -INFINITY ? 0.f : expf(s - mn);
                    Sh[jj] = pr;
                    sum += pr;
                }
                sum = warp_sum(sum);
                if (lane == 0) {
                    float c = mo == -INFINITY ? 0.f : expf(mo - mn);
                    Cs[hh] = c;
                    Ls[hh] = Ls[hh] * c + sum;
                    Ms[hh] = mn;
                }
            }
            __syncthreads();

            /* P V */
#pragma unroll
            for (int r = 0; r < AD_MAXR; r++) {
                int o = tid + r * AD_THREADS;
                if (r < R && o < gb * d) {
                    int hh = o / d, c = o - hh * d;
                    const float *Sh = S + hh * TK;
                    float a = acc[r] * Cs[hh];
                    for (int jj = 0; jj < tn; jj++) a += Sh[jj] * __bfloat162float(Vs[jj * dp + c]);
                    acc[r] = a;
                }
            }
            __syncthreads();
        }

#pragma unroll
        for (int r = 0; r < AD_MAXR; r++) {
            int o = tid + r * AD_THREADS;
            if (r < R && o < gb * d) {
                int hh = o / d, c = o - hh * d;
                if (n_splits == 1) {
                    float l = Ls[hh];
                    p.out[((size_t)i * H + h0) * d + o] = l > 0.f ? acc[r] * (1.0f / l) : 0.f;
                } else {
                    size_t base = ((size_t)i * H + h0 + hh) * n_splits + split;
                    ws_acc[base * d + c] = acc[r];
                    if (c == 0) { ws_ml[2 * base] = Ms[hh]; ws_ml[2 * base + 1] = Ls[hh]; }
                }
            }
        }
        __syncthreads();
    }
}

/* out row (i, h) = sum_s acc_s e^(m_s - M) / sum_s l_s e^(m_s - M); zeros when nothing was visible. */
__global__ void attn_combine_kernel(float *__restrict__ out, const float *__restrict__ ws_acc,
                                    const float *__restrict__ ws_ml, int n_splits, int d) {
    size_t rh = blockIdx.x;
    const float *ml = ws_ml + rh * n_splits * 2;
    float M = -INFINITY;
    for (int s = 0; s < n_splits; s++) M = fmaxf(M, ml[2 * s]);
    float L = 0.f;
    if (M != -INFINITY)
        for (int s = 0; s < n_splits; s++)
            if (ml[2 * s] != -INFINITY) L += ml[2 * s + 1] * expf(ml[2 * s] - M);
    float inv = L > 0.f ? 1.0f / L : 0.f;
    for (int c = threadIdx.x; c < d; c += blockDim.x) {
        float o = 0.f;
        if (L > 0.f)
            for (int s = 0; s < n_splits; s++)
                if (ml[2 * s] != -INFINITY) o += ws_acc[(rh * n_splits + s) * d + c] * expf(ml[2 * s] - M);
        out[rh * d + c] = o * inv;
    }
}

extern "C" size_t ks_cuda_attn_decode_workspace(const ks_cuda_attn_params *p, int n_sm, int *n_splits) {
    ad_shape sh;
    *n_splits = 1;
    if (ad_shape_of(p, &sh)) return 0;
    size_t row_blocks = (size_t)KS_MIN(p->n, 65535) * p->n_kv_heads * sh.hchunks;
    size_t target = (size_t)4 * (n_sm > 0 ? n_sm : 132);
    int splits = 1;
    if (row_blocks < target) {
        splits = (int)((target + row_blocks - 1) / row_blocks);
        int most = (p->max_nk + 255) / 256; /* at least 256 keys per split */
        splits = KS_MAX(1, KS_MIN(splits, most));
    }
    *n_splits = splits;
    if (splits == 1) return 0;
    size_t rh = (size_t)p->n * p->n_heads * splits;
    return rh * p->head_dim * sizeof(float) + rh * 2 * sizeof(float);
}

extern "C" ks_status ks_cuda_attn_decode(cudaStream_t s, const ks_cuda_attn_params *p, int n_splits, void *ws) {
    ad_shape sh;
    if (p->n <= 0) return KS_OK;
    if (p->n_kv_heads <= 0 || p->n_heads % p->n_kv_heads)
        return ks_errorf(KS_ERR_ARG, "attention: %d query heads are not a multiple of %d KV heads", p->n_heads,
                         p->n_kv_heads);
    if (ad_shape_of(p, &sh)) return ks_errorf(KS_ERR_UNSUPPORTED, "attention: head_dim %d not supported (1..512)", p->head_dim);
    if (n_splits < 1) n_splits = 1;
    if (n_splits > 1 && !ws) return ks_errorf(KS_ERR_INTERNAL, "attention: split-KV without a workspace");
    float *ws_acc = (float *)ws;
    float *ws_ml = ws_acc ? ws_acc + (size_t)p->n * p->n_heads * n_splits * p->head_dim : nullptr;
    dim3 grid(n_splits, p->n_kv_heads * sh.hchunks, KS_MIN(p->n, 65535));
    if (sh.vec) attn_decode_kernel<true><<<grid, AD_THREADS, sh.smem, s>>>(*p, sh, n_splits, ws_acc, ws_ml);
    else attn_decode_kernel<false><<<grid, AD_THREADS, sh.smem, s>>>(*p, sh, n_splits, ws_acc, ws_ml);
    KS_CU_LAUNCH("attention (decode) kernel");
    if (n_splits > 1) {
        size_t rows = (size_t)p->n * p->n_heads;
        attn_combine_kernel<<<(unsigned)rows, 128, 0, s>>>(p->out, ws_acc, ws_ml, n_splits, p->head_dim);
        KS_CU_LAUNCH("attention combine kernel");
    }
    return KS_OK;
}
