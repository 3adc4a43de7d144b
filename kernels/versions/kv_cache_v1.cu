/* kv_cache.cu — see kv_cache.cuh. */
#include "common.cuh"
#include "kv_cache.cuh"

/* One thread per (row, head, 4 columns) when head_dim % 4 == 0, else per column. */
template <int W>
__global__ void kv_append_kernel(bf16 *__restrict__ K, bf16 *__restrict__ V, int32_t *__restrict__ P, int cap, int H,
                                 int d, const float *__restrict__ k, const float *__restrict__ v,
                                 const int32_t *__restrict__ pos, const int32_t *__restrict__ row0, int n) {
    int units = d / W;
    size_t total = (size_t)n * H * units, stride = (size_t)gridDim.x * blockDim.x;
    for (size_t t = (size_t)blockIdx.x * blockDim.x + threadIdx.x; t < total; t += stride) {
        int u = (int)(t % units);
        size_t ih = t / units;
        int h = (int)(ih % H), i = (int)(ih / H);
        size_t dst = ((size_t)h * cap + row0[h] + i) * d + (size_t)u * W;
        const float *ks = k + ih * d + (size_t)u * W, *vs = v + ih * d + (size_t)u * W;
#pragma unroll
        for (int w = 0; w < W; w++) {
            K[dst + w] = __float2bfloat16_rn(ks[w]);
            V[dst + w] = __float2bfloat16_rn(vs[w]);
        }
        if (u == 0) P[(size_t)h * cap + row0[h] + i] = pos[i];
    }
}

/* grid (row blocks, heads); VEC: 16-byte units (head_dim % 8 == 0). */
template <typename U>
__global__ void kv_gather_kernel(U *__restrict__ dK, U *__restrict__ dV, int32_t *__restrict__ dP, int dcap,
                                  const U *__restrict__ sK, const U *__restrict__ sV, const int32_t *__restrict__ sP,
                                  int scap, int units, const int32_t *__restrict__ idx, const int32_t *__restrict__ off) {
    int h = blockIdx.y;
    int b = off[h], cnt = off[h + 1] - b;
    size_t total = (size_t)cnt * units;
    for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += (size_t)gridDim.x * blockDim.x) {
        int t = (int)(e / units), u = (int)(e % units);
        int j = idx[b + t];
        size_t so = ((size_t)h * scap + j) * units + u, dof = ((size_t)h * dcap + t) * units + u;
        dK[dof] = sK[so];
        dV[dof] = sV[so];
        if (u == 0) dP[(size_t)h * dcap + t] = sP[(size_t)h * scap + j];
    }
}

extern "C" ks_status ks_cuda_kv_append(cudaStream_t s, void *K, void *V, int32_t *P, int capacity, int n_kv_heads,
                                       int head_dim, const float *k, const float *v, const int32_t *pos,
                                       const int32_t *row0, int n) {
    if (n <= 0) return KS_OK;
    if (head_dim % 4 == 0) {
        size_t total = (size_t)n * n_kv_heads * (head_dim / 4);
        kv_append_kernel<4><<<ks_grid1d(total, 256), 256, 0, s>>>((bf16 *)K, (bf16 *)V, P, capacity, n_kv_heads,
                                                                   head_dim, k, v, pos, row0, n);
    } else {
        size_t total = (size_t)n * n_kv_heads * head_dim;
        kv_append_kernel<1><<<ks_grid1d(total, 256), 256, 0, s>>>((bf16 *)K, (bf16 *)V, P, capacity, n_kv_heads,
                                                                   head_dim, k, v, pos, row0, n);
    }
    KS_CU_LAUNCH("kv_append kernel");
    return KS_OK;
}

extern "C" ks_status ks_cuda_kv_gather(cudaStream_t s, void *dK, void *dV, int32_t *dP, int dst_capacity, const void *sK,
                                       const void *sV, const int32_t *sP, int src_capacity, int n_kv_heads,
                                       int head_dim, const int32_t *idx, const int32_t *off, int max_cnt) {
    if (max_cnt <= 0 || n_kv_heads <= 0) return KS_OK;
    if (head_dim % 8 == 0) {
        int units = head_dim / 8;
        dim3 grid(KS_MIN(ks_cdiv((size_t)max_cnt * units, 256), 4096u), n_kv_heads);
        kv_gather_kernel<uint4><<<grid, 256, 0, s>>>((uint4 *)dK, (uint4 *)dV, dP, dst_capacity, (const uint4 *)sK,
                                                     (const uint4 *)sV, sP, src_capacity, units, idx, off);
    } else {
        int units = head_dim;
        dim3 grid(KS_MIN(ks_cdiv((size_t)max_cnt * units, 256), 4096u), n_kv_heads);
        kv_gather_kernel<uint16_t><<<grid, 256, 0, s>>>((uint16_t *)dK, (uint16_t *)dV, dP, dst_capacity,
                                                        (const uint16_t *)sK, (const uint16_t *)sV, sP, src_capacity,
                                                        units, idx, off);
    }
    KS_CU_LAUNCH("kv_gather kernel");
    return KS_OK;
}
