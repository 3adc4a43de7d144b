/* kv_cache.cu — see kv_cache.cuh. */
#include "common.cuh"
#include "kv_cache.cuh"
#include "pdl.cuh"

#include <string.h>

/* 8 columns of a key and a value row, float32 -> bf16: 2 x 16-byte loads and one 16-byte store
 * per tensor (ks, vs, Kd, Vd 16-byte aligned) */
static __device__ __forceinline__ void store_kv8(bf16 *Kd, bf16 *Vd, const float *ks, const float *vs) {
    float4 k0 = reinterpret_cast<const float4 *>(ks)[0], k1 = reinterpret_cast<const float4 *>(ks)[1];
    float4 v0 = reinterpret_cast<const float4 *>(vs)[0], v1 = reinterpret_cast<const float4 *>(vs)[1];
    __nv_bfloat162 kb[4] = {__floats2bfloat162_rn(k0.x, k0.y), __floats2bfloat162_rn(k0.z, k0.w),
                            __floats2bfloat162_rn(k1.x, k1.y), __floats2bfloat162_rn(k1.z, k1.w)};
    __nv_bfloat162 vb[4] = {__floats2bfloat162_rn(v0.x, v0.y), __floats2bfloat162_rn(v0.z, v0.w),
                            __floats2bfloat162_rn(v1.x, v1.y), __floats2bfloat162_rn(v1.z, v1.w)};
    *reinterpret_cast<uint4 *>(Kd) = *reinterpret_cast<uint4 *>(kb);
    *reinterpret_cast<uint4 *>(Vd) = *reinterpret_cast<uint4 *>(vb);
}

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
        if (W == 8) {
            store_kv8(K + dst, V + dst, ks, vs);
        } else {
#pragma unroll
            for (int w = 0; w < W; w++) {
                K[dst + w] = __float2bfloat16_rn(ks[w]);
                V[dst + w] = __float2bfloat16_rn(vs[w]);
            }
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
    if (head_dim % 8 == 0 && ((uintptr_t)k | (uintptr_t)v | (uintptr_t)K | (uintptr_t)V) % 16 == 0) {
        size_t total = (size_t)n * n_kv_heads * (head_dim / 8);
        kv_append_kernel<8><<<ks_grid1d(total, 256), 256, 0, s>>>((bf16 *)K, (bf16 *)V, P, capacity, n_kv_heads,
                                                                   head_dim, k, v, pos, row0, n);
    } else if (head_dim % 4 == 0) {
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

/* ---------------------------------------------------------------- one-row append, small copies */

struct kv_row0_args {
    int32_t row0[KS_CUDA_KV1_MAX_HEADS];
};

/* one row: thread per (head, 8 columns) or (head, column); positions and first free rows by value */
template <int W>
__global__ void kv_append1_kernel(bf16 *__restrict__ K, bf16 *__restrict__ V, int32_t *__restrict__ P, int cap, int H,
                                  int d, const float *__restrict__ k, const float *__restrict__ v, int pos,
                                  const __grid_constant__ kv_row0_args r) {
    ks_pdl_trigger(); /* PDL (pdl.cuh): k, v come from the previous kernel */
    ks_pdl_wait();
    int units = d / W;
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= H * units) return;
    int h = t / units, u = t - h * units;
    size_t dst = ((size_t)h * cap + r.row0[h]) * d + (size_t)u * W;
    const float *ks = k + (size_t)h * d + (size_t)u * W, *vs = v + (size_t)h * d + (size_t)u * W;
    if (W == 8) {
        store_kv8(K + dst, V + dst, ks, vs);
    } else {
        K[dst] = __float2bfloat16_rn(ks[0]);
        V[dst] = __float2bfloat16_rn(vs[0]);
    }
    if (u == 0) P[(size_t)h * cap + r.row0[h]] = pos;
}

extern "C" ks_status ks_cuda_kv_append1(cudaStream_t s, void *K, void *V, int32_t *P, int capacity, int n_kv_heads,
                                        int head_dim, const float *k, const float *v, int32_t pos, const int *row0, int pdl) {
    if (n_kv_heads < 1 || n_kv_heads > KS_CUDA_KV1_MAX_HEADS)
        return ks_errorf(KS_ERR_INTERNAL, "kv_append1: %d KV heads (at most %d)", n_kv_heads, KS_CUDA_KV1_MAX_HEADS);
    kv_row0_args r;
    for (int h = 0; h < n_kv_heads; h++) r.row0[h] = row0[h];
    if (head_dim % 8 == 0 && ((uintptr_t)k | (uintptr_t)v | (uintptr_t)K | (uintptr_t)V) % 16 == 0) {
        int total = n_kv_heads * (head_dim / 8);
        KS_CU(ks_pdl_launch(kv_append1_kernel<8>, dim3(ks_cdiv(total, 128)), dim3(128), 0, s, pdl, (bf16 *)K, (bf16 *)V, P,
                            capacity, n_kv_heads, head_dim, k, v, (int)pos, r),
              "kv_append1 kernel");
    } else {
        int total = n_kv_heads * head_dim;
        KS_CU(ks_pdl_launch(kv_append1_kernel<1>, dim3(ks_cdiv(total, 128)), dim3(128), 0, s, pdl, (bf16 *)K, (bf16 *)V, P,
                            capacity, n_kv_heads, head_dim, k, v, (int)pos, r),
              "kv_append1 kernel");
    }
    return KS_OK;
}

template <int N> struct put_args {
    alignas(16) unsigned char b[N];
};

template <int N>
__global__ void __launch_bounds__(256) put_kernel(unsigned char *__restrict__ dst, const __grid_constant__ put_args<N> a,
                                                  int bytes) {
    ks_pdl_trigger(); /* PDL: dst may be pool memory an earlier kernel still reads until the wait */
    ks_pdl_wait();
    int i = threadIdx.x;
    if (((uintptr_t)dst & 15) == 0) {
        for (; i < bytes / 16; i += blockDim.x) reinterpret_cast<uint4 *>(dst)[i] = reinterpret_cast<const uint4 *>(a.b)[i];
        i = bytes / 16 * 16 + threadIdx.x;
    }
    for (; i < bytes; i += blockDim.x) dst[i] = a.b[i];
}

template <int N> static ks_status put_n(cudaStream_t s, void *dst, const void *src, size_t bytes, int pdl) {
    put_args<N> a;
    memcpy(a.b, src, bytes);
    KS_CU(ks_pdl_launch(put_kernel<N>, dim3(1), dim3(256), 0, s, pdl, (unsigned char *)dst, a, (int)bytes), "put kernel");
    return KS_OK;
}

extern "C" ks_status ks_cuda_put(cudaStream_t s, void *dst, const void *src, size_t bytes, int pdl) {
    if (!bytes) return KS_OK;
    if (bytes > KS_CUDA_PUT_MAX) return ks_errorf(KS_ERR_INTERNAL, "put: %zu bytes (at most %d)", bytes, KS_CUDA_PUT_MAX);
    return bytes <= 512 ? put_n<512>(s, dst, src, bytes, pdl) : bytes <= 4096 ? put_n<4096>(s, dst, src, bytes, pdl)
                                                                : put_n<KS_CUDA_PUT_MAX>(s, dst, src, bytes, pdl);
}
