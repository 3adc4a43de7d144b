/* rope.cu — see rope.cuh. One thread per (row, pair k, group of heads): cos and sin are
 * computed once per row, frequency and group. A launch has as many groups as it takes to give
 * the GPU ~256K threads: one group of all heads for a prefill's thousands of rows, one head a
 * group for a batched decode step's few rows (64 rows x 64 pairs alone are 4096 threads: one
 * block on 32 multiprocessors, each thread walking 48 heads). The angle, cos and sin are float32
 * with the accurate sincosf, products rounded separately (no FMA), following the CPU arithmetic
 * up to the last bit of cos/sin; a value's result does not depend on the grouping. */
#include "common.cuh"
#include "rope.cuh"

#include <string.h>

#define ROPE_THREADS ((size_t)1 << 18) /* threads a launch aims for (about 2 per resident thread slot) */

/* Up to three consecutive runs of heads of a source row, each to its own contiguous output:
 * rotated (q, k) or copied (v). Positions by value (pin non-zero: the first n of pos_inl) or
 * through the device pointer pos. */
struct rope_segs {
    float *dst[3];
    int heads[3];
    int rotate[3];
    int nseg;
    int hg, ngroup; /* heads a group, groups a row (ceil(all heads / hg)) */
    const int32_t *pos;
    int pin;
    int32_t pos_inl[KS_CUDA_ROPE_POS_INLINE];
};

__global__ void rope_kernel(const __grid_constant__ rope_segs S, const float *src, int64_t srs, int n, int d, int half,
                            const float *__restrict__ inv, float af) {
    size_t total = (size_t)n * half * S.ngroup, stride = (size_t)gridDim.x * blockDim.x;
    for (size_t t = (size_t)blockIdx.x * blockDim.x + threadIdx.x; t < total; t += stride) {
        const int k = (int)(t % half), grp = (int)(t / half % S.ngroup), i = (int)(t / half / S.ngroup);
        const int32_t p = S.pin ? S.pos_inl[i] : S.pos[i];
        float a = __fmul_rn((float)p, inv[k]);
        float sn, cs;
        sincosf(a, &sn, &cs);
        float c = __fmul_rn(cs, af), s = __fmul_rn(sn, af);
        int h0 = grp * S.hg, h1 = h0 + S.hg; /* this group's heads, counted over the runs */
        const float *u = src + (size_t)i * srs + (size_t)h0 * d; /* in place: u == v, each pair read before it is written */
        for (int g = 0, base = 0; g < S.nseg && base < h1; base += S.heads[g], g++) {
            const int a0 = max(h0, base), a1 = min(h1, base + S.heads[g]);
            float *v = S.dst[g] + ((size_t)i * S.heads[g] + (a0 - base)) * d;
            for (int h = a0; h < a1; h++, u += d, v += d) {
                float x0 = u[k], x1 = u[k + half];
                if (S.rotate[g]) {
                    v[k] = __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s));
                    v[k + half] = __fadd_rn(__fmul_rn(x1, c), __fmul_rn(x0, s));
                } else {
                    v[k] = x0;
                    v[k + half] = x1;
                }
            }
        }
    }
}

/* hpos: positions on the host (n <= KS_CUDA_ROPE_POS_INLINE: passed by value), or NULL with dpos
 * on the device */
static ks_status rope_launch(cudaStream_t s, rope_segs &S, const float *src, int64_t srs, int n, int head_dim,
                             const int32_t *hpos, const int32_t *dpos, const float *inv, float af) {
    int half = head_dim / 2, all = 0;
    for (int g = 0; g < S.nseg; g++) all += S.heads[g];
    size_t rows = (size_t)n * half;
    if (!rows || S.nseg <= 0 || all <= 0) return KS_OK;
    if (hpos && n > KS_CUDA_ROPE_POS_INLINE)
        return ks_errorf(KS_ERR_INTERNAL, "rope: %d positions by value (at most %d)", n, KS_CUDA_ROPE_POS_INLINE);
    S.ngroup = (int)KS_MIN((size_t)all, KS_MAX((size_t)1, ROPE_THREADS / rows));
    S.hg = (all + S.ngroup - 1) / S.ngroup;
    S.ngroup = (all + S.hg - 1) / S.hg;
    S.pos = dpos;
    S.pin = hpos != NULL;
    if (hpos) memcpy(S.pos_inl, hpos, sizeof(int32_t) * (size_t)n);
    size_t total = rows * S.ngroup;
    rope_kernel<<<ks_grid1d(total, 128), 128, 0, s>>>(S, src, srs, n, head_dim, half, inv, af);
    KS_CU_LAUNCH("rope kernel");
    return KS_OK;
}

extern "C" ks_status ks_cuda_rope_qkv(cudaStream_t s, float *q, float *k, float *v, const float *y, int n, int n_heads,
                                      int n_kv_heads, int head_dim, const int32_t *pos, int pos_on_host,
                                      const float *inv_freq, float attn_factor) {
    rope_segs S;
    memset(&S, 0, offsetof(rope_segs, pos_inl));
    S.dst[0] = q, S.dst[1] = k, S.dst[2] = v;
    S.heads[0] = n_heads, S.heads[1] = S.heads[2] = n_kv_heads;
    S.rotate[0] = S.rotate[1] = 1;
    S.nseg = 3;
    return rope_launch(s, S, y, (int64_t)(n_heads + 2 * n_kv_heads) * head_dim, n, head_dim, pos_on_host ? pos : NULL,
                       pos_on_host ? NULL : pos, inv_freq, attn_factor);
}

extern "C" ks_status ks_cuda_rope(cudaStream_t s, float *x, int n, int n_heads, int head_dim, const int32_t *pos,
                                  int pos_on_host, const float *inv_freq, float attn_factor) {
    rope_segs S;
    memset(&S, 0, offsetof(rope_segs, pos_inl));
    S.dst[0] = x;
    S.heads[0] = n_heads;
    S.rotate[0] = 1;
    S.nseg = n_heads > 0;
    return rope_launch(s, S, x, (int64_t)n_heads * head_dim, n, head_dim, pos_on_host ? pos : NULL,
                       pos_on_host ? NULL : pos, inv_freq, attn_factor);
}
