/* rope_table.cu — see rope_table.cuh. A thread per (position, float4 of the row): two
 * frequencies' ks_rope_cs; the header from the launch's arguments. The CPU twin is the
 * rotation of core/cpu_backend.c; tests/cuda/test_attn_list.c checks the table against it
 * (within sincosf's error) and the attention over it bit for bit against the computed one. */
#include "common.cuh"
#include "rope_table.cuh"
#include "attn_prep.cuh"

#include <string.h>

struct rt_args {
    float inv[64];
    float af;
};

__global__ void rope_table_kernel(float4 *__restrict__ tab, int rows, int half, const __grid_constant__ rt_args a) {
    const int per = half / 2; /* float4s a row */
    const int hch = half / 8;
    const long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (e < KS_CUDA_ROPE_TAB_HDR * 4) {
        float *h = (float *)tab;
        float v = 0.f;
        if (e < 64) v = e < half ? a.inv[e] : 0.f;
        else if (e == 64) v = a.af;
        else if (e == 65) v = __int_as_float(half);
        else if (e == 66) v = __int_as_float(rows);
        h[e] = v;
    }
    if (e >= (long long)rows * per) return;
    const int p = (int)(e / per), q = (int)(e - (long long)p * per);
    const int i = q / hch, ch = q - i * hch, f = ch * 8 + 2 * i;
    float4 r;
    ks_rope_cs(p, a.inv[f], a.af, &r.x, &r.y);
    ks_rope_cs(p, a.inv[f + 1], a.af, &r.z, &r.w);
    tab[KS_CUDA_ROPE_TAB_HDR + e] = r;
}

extern "C" size_t ks_cuda_rope_table_bytes(int rows, int head_dim) {
    return ((size_t)KS_CUDA_ROPE_TAB_HDR + (size_t)(rows > 0 ? rows : 0) * (size_t)(head_dim / 4)) * 16;
}

extern "C" ks_status ks_cuda_rope_table(cudaStream_t s, void *tab, int rows, int head_dim, const float *inv_freq,
                                        float attn_factor) {
    if (head_dim != 64 && head_dim != 128)
        return ks_errorf(KS_ERR_UNSUPPORTED, "rope table: head_dim %d (64 or 128)", head_dim);
    if (rows < 1 || !tab || !inv_freq || (uintptr_t)tab % 16)
        return ks_errorf(KS_ERR_ARG, "rope table: %d rows, table %p", rows, tab);
    rt_args a;
    memset(&a, 0, sizeof a);
    memcpy(a.inv, inv_freq, sizeof(float) * (size_t)(head_dim / 2));
    a.af = attn_factor;
    const long long n = KS_MAX((long long)rows * (head_dim / 4), (long long)KS_CUDA_ROPE_TAB_HDR * 4);
    rope_table_kernel<<<(unsigned)((n + 255) / 256), 256, 0, s>>>((float4 *)tab, rows, head_dim / 2, a);
    KS_CU_LAUNCH("rope table kernel");
    return KS_OK;
}
