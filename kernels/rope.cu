/* rope.cu — see rope.cuh. One thread per (row, pair k), looping over the heads (of up to three
 * runs: q, k, v of a joined projection), so cos and sin are computed once per row and frequency. The angle, cos and sin are float32 with the accurate
 * sincosf, products rounded separately (no FMA), following the CPU arithmetic up to the last
 * bit of cos/sin. */
#include "common.cuh"
#include "rope.cuh"

/* Up to three consecutive runs of heads of a source row, each to its own contiguous output:
 * rotated (q, k) or copied (v). */
struct rope_segs {
    float *dst[3];
    int heads[3];
    int rotate[3];
    int nseg;
};

__global__ void rope_kernel(const rope_segs S, const float *src, int64_t srs, int n, int d, int half,
                            const int32_t *__restrict__ pos, const float *__restrict__ inv, float af) {
    size_t total = (size_t)n * half, stride = (size_t)gridDim.x * blockDim.x;
    for (size_t t = (size_t)blockIdx.x * blockDim.x + threadIdx.x; t < total; t += stride) {
        int k = (int)(t % half), i = (int)(t / half);
        float a = __fmul_rn((float)pos[i], inv[k]);
        float sn, cs;
        sincosf(a, &sn, &cs);
        float c = __fmul_rn(cs, af), s = __fmul_rn(sn, af);
        const float *u = src + (size_t)i * srs; /* in place: u == v, each pair read before it is written */
        for (int g = 0; g < S.nseg; g++) {
            float *v = S.dst[g] + (size_t)i * S.heads[g] * d;
            for (int h = 0; h < S.heads[g]; h++, u += d, v += d) {
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

static ks_status rope_launch(cudaStream_t s, const rope_segs &S, const float *src, int64_t srs, int n, int head_dim,
                             const int32_t *pos, const float *inv, float af) {
    int half = head_dim / 2;
    size_t total = (size_t)n * half;
    if (!total || S.nseg <= 0) return KS_OK;
    rope_kernel<<<ks_grid1d(total, 128), 128, 0, s>>>(S, src, srs, n, head_dim, half, pos, inv, af);
    KS_CU_LAUNCH("rope kernel");
    return KS_OK;
}

extern "C" ks_status ks_cuda_rope_qkv(cudaStream_t s, float *q, float *k, float *v, const float *y, int n, int n_heads,
                                      int n_kv_heads, int head_dim, const int32_t *pos, const float *inv_freq,
                                      float attn_factor) {
    rope_segs S = {{q, k, v}, {n_heads, n_kv_heads, n_kv_heads}, {1, 1, 0}, 3};
    return rope_launch(s, S, y, (int64_t)(n_heads + 2 * n_kv_heads) * head_dim, n, head_dim, pos, inv_freq, attn_factor);
}

extern "C" ks_status ks_cuda_rope(cudaStream_t s, float *x, int n, int n_heads, int head_dim, const int32_t *pos,
                                  const float *inv_freq, float attn_factor) {
    rope_segs S = {{x, NULL, NULL}, {n_heads, 0, 0}, {1, 0, 0}, n_heads > 0};
    return rope_launch(s, S, x, (int64_t)n_heads * head_dim, n, head_dim, pos, inv_freq, attn_factor);
}
