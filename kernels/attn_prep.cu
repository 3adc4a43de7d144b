/* attn_prep.cu — see attn_prep.cuh. One thread per (row, pair of rotated columns). */
#include "common.cuh"
#include "attn_prep.cuh"

/* grid (row blocks, kv heads); thread: (t, k) with k < half (rotation) or k < d (copy only) */
__global__ void attn_gather_kernel(const ks_cuda_attn_params p, const float *__restrict__ inv, float af,
                                   void *__restrict__ k_out, int k_f32, bf16 *__restrict__ v_out,
                                   int32_t *__restrict__ pos_out, int maxk) {
    const int kv = blockIdx.y, d = p.head_dim, half = d / 2;
    const int nk = p.nk[kv];
    const int32_t *ix = p.idx ? p.idx + p.idx_off[kv] : nullptr;
    const bf16 *K = (const bf16 *)p.k + (size_t)kv * p.capacity * d;
    const bf16 *V = (const bf16 *)p.v + (size_t)kv * p.capacity * d;
    const int32_t *P = p.kpos ? p.kpos + (size_t)kv * p.capacity : nullptr;
    const int per = inv ? half : d; /* threads per row */
    size_t total = (size_t)nk * per;
    for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += (size_t)gridDim.x * blockDim.x) {
        int t = (int)(e / per), k = (int)(e - (size_t)t * per);
        int j = ix ? ix[t] : t;
        int32_t pos = p.renumber ? t : P ? P[j] : j;
        const bf16 *kr = K + (size_t)j * d;
        size_t o = ((size_t)kv * maxk + t) * d;
        if (inv) {
            float y0, y1;
            ks_rope_rot(__bfloat162float(kr[k]), __bfloat162float(kr[k + half]), pos, inv[k], af, &y0, &y1);
            if (k_f32) { ((float *)k_out)[o + k] = y0; ((float *)k_out)[o + k + half] = y1; }
            else { ((bf16 *)k_out)[o + k] = __float2bfloat16_rn(y0); ((bf16 *)k_out)[o + k + half] = __float2bfloat16_rn(y1); }
            v_out[o + k] = V[(size_t)j * d + k];
            v_out[o + k + half] = V[(size_t)j * d + k + half];
            if (d & 1 && k == 0) { /* odd head_dim: the last column is not rotated */
                if (k_f32) ((float *)k_out)[o + d - 1] = __bfloat162float(kr[d - 1]);
                else ((bf16 *)k_out)[o + d - 1] = kr[d - 1];
                v_out[o + d - 1] = V[(size_t)j * d + d - 1];
            }
        } else {
            if (k_f32) ((float *)k_out)[o + k] = __bfloat162float(kr[k]);
            else ((bf16 *)k_out)[o + k] = kr[k];
            v_out[o + k] = V[(size_t)j * d + k];
        }
        if (k == 0) pos_out[(size_t)kv * maxk + t] = pos;
    }
}

__global__ void attn_rope_q_kernel(float *__restrict__ out, const float *__restrict__ q, int n, int H, int g, int d,
                                   const int32_t *__restrict__ qpos, const int32_t *__restrict__ nk, int q_renumber,
                                   const float *__restrict__ inv, float af) {
    const int half = d / 2;
    size_t total = (size_t)n * H * half, stride = (size_t)gridDim.x * blockDim.x;
    for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += stride) {
        int k = (int)(e % half);
        size_t ih = e / half;
        int h = (int)(ih % H), i = (int)(ih / H);
        int32_t pos = q_renumber ? nk[h / g] - n + i : qpos[i];
        const float *src = q + ih * d;
        float *dst = out + ih * d;
        ks_rope_rot(src[k], src[k + half], pos, inv[k], af, dst + k, dst + k + half);
        if (d & 1 && k == 0) dst[d - 1] = src[d - 1];
    }
}

extern "C" ks_status ks_cuda_attn_gather(cudaStream_t s, const ks_cuda_attn_params *p, const float *inv_freq,
                                         float attn_factor, void *k_out, int k_f32, void *v_out, int32_t *pos_out,
                                         int maxk) {
    if (p->max_nk <= 0) return KS_OK;
    size_t per = inv_freq ? p->head_dim / 2 : p->head_dim;
    if (per == 0) per = 1;
    dim3 grid(KS_MIN(ks_cdiv((size_t)p->max_nk * per, 256), 8192u), p->n_kv_heads);
    attn_gather_kernel<<<grid, 256, 0, s>>>(*p, inv_freq, attn_factor, k_out, k_f32, (bf16 *)v_out, pos_out, maxk);
    KS_CU_LAUNCH("attention gather kernel");
    return KS_OK;
}

extern "C" ks_status ks_cuda_attn_rope_q(cudaStream_t s, float *q_out, const float *q, int n, int n_heads,
                                         int n_kv_heads, int d, const int32_t *qpos, const int32_t *nk, int q_renumber,
                                         const float *inv_freq, float attn_factor) {
    size_t total = (size_t)n * n_heads * (d / 2);
    if (!total) {
        if (n > 0) KS_CU(cudaMemcpyAsync(q_out, q, sizeof(float) * n * n_heads * d, cudaMemcpyDeviceToDevice, s), "rope q copy");
        return KS_OK;
    }
    attn_rope_q_kernel<<<ks_grid1d(total, 256), 256, 0, s>>>(q_out, q, n, n_heads, n_heads / n_kv_heads, d, qpos, nk,
                                                             q_renumber, inv_freq, attn_factor);
    KS_CU_LAUNCH("attention query rope kernel");
    return KS_OK;
}
