/* rope.cu — see rope.cuh. One thread per (row, head, pair); the angle, cos and sin are
 * computed in float32 with the accurate cosf/sinf, products rounded separately (no FMA) so
 * the result follows the CPU arithmetic up to the last bit of cos/sin. */
#include "common.cuh"
#include "rope.cuh"

__global__ void rope_kernel(float *__restrict__ x, int n, int n_heads, int d, int half, const int32_t *__restrict__ pos,
                            const float *__restrict__ inv, float af) {
    size_t total = (size_t)n * n_heads * half, stride = (size_t)gridDim.x * blockDim.x;
    for (size_t t = (size_t)blockIdx.x * blockDim.x + threadIdx.x; t < total; t += stride) {
        int k = (int)(t % half);
        size_t ih = t / half; /* row * n_heads + head */
        int i = (int)(ih / n_heads);
        float a = __fmul_rn((float)pos[i], inv[k]);
        float sn, cs;
        sincosf(a, &sn, &cs);
        float c = __fmul_rn(cs, af), s = __fmul_rn(sn, af);
        float *v = x + ih * (size_t)d;
        float x0 = v[k], x1 = v[k + half];
        v[k] = __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s));
        v[k + half] = __fadd_rn(__fmul_rn(x1, c), __fmul_rn(x0, s));
    }
}

extern "C" ks_status ks_cuda_rope(cudaStream_t s, float *x, int n, int n_heads, int head_dim, const int32_t *pos,
                                  const float *inv_freq, float attn_factor) {
    int half = head_dim / 2;
    size_t total = (size_t)n * n_heads * half;
    if (!total) return KS_OK;
    rope_kernel<<<ks_grid1d(total, 256), 256, 0, s>>>(x, n, n_heads, head_dim, half, pos, inv_freq, attn_factor);
    KS_CU_LAUNCH("rope kernel");
    return KS_OK;
}
