/* rope.cu — see rope.cuh. One thread per (row, pair k), looping over the heads, so cos and sin
 * are computed once per row and frequency. The angle, cos and sin are float32 with the accurate
 * sincosf, products rounded separately (no FMA), following the CPU arithmetic up to the last
 * bit of cos/sin. */
#include "common.cuh"
#include "rope.cuh"

__global__ void rope_kernel(float *__restrict__ dst, const float *src, int64_t srs, int n, int n_heads, int d, int half,
                            const int32_t *__restrict__ pos, const float *__restrict__ inv, float af) {
    size_t total = (size_t)n * half, stride = (size_t)gridDim.x * blockDim.x;
    for (size_t t = (size_t)blockIdx.x * blockDim.x + threadIdx.x; t < total; t += stride) {
        int k = (int)(t % half), i = (int)(t / half);
        float a = __fmul_rn((float)pos[i], inv[k]);
        float sn, cs;
        sincosf(a, &sn, &cs);
        float c = __fmul_rn(cs, af), s = __fmul_rn(sn, af);
        const float *u = src + (size_t)i * srs; /* in place: u == v, each pair read before it is written */
        float *v = dst + (size_t)i * n_heads * d;
        for (int h = 0; h < n_heads; h++, u += d, v += d) {
            float x0 = u[k], x1 = u[k + half];
            v[k] = __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s));
            v[k + half] = __fadd_rn(__fmul_rn(x1, c), __fmul_rn(x0, s));
        }
    }
}

extern "C" ks_status ks_cuda_rope_rows(cudaStream_t s, float *dst, const float *src, int64_t src_row_stride, int n,
                                       int n_heads, int head_dim, const int32_t *pos, const float *inv_freq,
                                       float attn_factor) {
    int half = head_dim / 2;
    size_t total = (size_t)n * half;
    if (!total || n_heads <= 0) return KS_OK;
    rope_kernel<<<ks_grid1d(total, 128), 128, 0, s>>>(dst, src, src_row_stride, n, n_heads, head_dim, half, pos,
                                                      inv_freq, attn_factor);
    KS_CU_LAUNCH("rope kernel");
    return KS_OK;
}

extern "C" ks_status ks_cuda_rope(cudaStream_t s, float *x, int n, int n_heads, int head_dim, const int32_t *pos,
                                  const float *inv_freq, float attn_factor) {
    return ks_cuda_rope_rows(s, x, x, (int64_t)n_heads * head_dim, n, n_heads, head_dim, pos, inv_freq, attn_factor);
}
