/* prim_index.cu — gather, concat, arange (ks_cuda_prims.h). */
#include "prim_common.cuh"

template <typename T>
__global__ void gather_kernel(const T *__restrict__ x, int64_t n, int64_t d, const int32_t *__restrict__ idx, int64_t k,
                              T *__restrict__ out, unsigned long long *err, T bad) {
    int64_t total = k * d, stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += stride) {
        int64_t i = e / d, c = e - i * d;
        int32_t j = idx[i];
        if (j < 0 || j >= n) {
            out[e] = bad;
            if (err && c == 0) atomicMin(err, (unsigned long long)i);
        } else {
            out[e] = x[(int64_t)j * d + c];
        }
    }
}

/* err is an int64 holding -1 (no error) or the lowest bad position: as unsigned, -1 is the
 * largest value, so atomicMin keeps the lowest position. */
extern "C" ks_status ks_cuda_gather(cudaStream_t s, const float *x, int64_t n, int64_t d, const int32_t *idx, int64_t k,
                                    float *out, int64_t *err) {
    P_NONNEG("gather", "n", n);
    P_NONNEG("gather", "d", d);
    P_NONNEG("gather", "k", k);
    int64_t tmp;
    ks_status st;
    if ((st = p_mul_size("gather", n, d, &tmp)) || (st = p_mul_size("gather", k, d, &tmp))) return st;
    P_PTR("gather", "idx", idx, k);
    P_PTR("gather", "out", out, k * d);
    P_PTR("gather", "x", x, n * d);
    if (k * d == 0) return KS_OK;
    gather_kernel<float><<<ks_grid1d((size_t)(k * d), 256), 256, 0, s>>>(x, n, d, idx, k, out,
                                                                          (unsigned long long *)err, NAN);
    KS_CU_LAUNCH("gather kernel");
    return KS_OK;
}

extern "C" ks_status ks_cuda_gather_i32(cudaStream_t s, const int32_t *x, int64_t n, const int32_t *idx, int64_t k,
                                        int32_t *out, int64_t *err) {
    P_NONNEG("gather", "n", n);
    P_NONNEG("gather", "k", k);
    P_PTR("gather", "idx", idx, k);
    P_PTR("gather", "out", out, k);
    P_PTR("gather", "x", x, n);
    if (k == 0) return KS_OK;
    gather_kernel<int32_t><<<ks_grid1d((size_t)k, 256), 256, 0, s>>>(x, n, 1, idx, k, out, (unsigned long long *)err,
                                                                      INT32_MIN);
    KS_CU_LAUNCH("gather kernel (int32)");
    return KS_OK;
}

static ks_status concat_impl(cudaStream_t s, const char *prim, const void *a, int64_t na, const void *b, int64_t nb,
                             size_t es, void *out) {
    P_NONNEG(prim, "na", na);
    P_NONNEG(prim, "nb", nb);
    P_PTR(prim, "a", a, na);
    P_PTR(prim, "b", b, nb);
    P_PTR(prim, "out", out, na + nb);
    if (na && out != a) KS_CU(cudaMemcpyAsync(out, a, (size_t)na * es, cudaMemcpyDeviceToDevice, s), "concat copy");
    if (nb) KS_CU(cudaMemcpyAsync((char *)out + (size_t)na * es, b, (size_t)nb * es, cudaMemcpyDeviceToDevice, s), "concat copy");
    return KS_OK;
}
extern "C" ks_status ks_cuda_concat_i32(cudaStream_t s, const int32_t *a, int64_t na, const int32_t *b, int64_t nb,
                                        int32_t *out) {
    return concat_impl(s, "concat", a, na, b, nb, 4, out);
}
extern "C" ks_status ks_cuda_concat_f32(cudaStream_t s, const float *a, int64_t na, const float *b, int64_t nb,
                                        float *out) {
    return concat_impl(s, "concat", a, na, b, nb, 4, out);
}

__global__ void arange_kernel(int64_t start, int64_t step, int64_t len, int32_t *out) {
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < len; i += stride) out[i] = (int32_t)(start + i * step);
}

extern "C" ks_status ks_cuda_arange(cudaStream_t s, int64_t start, int64_t stop, int64_t step, int32_t *out) {
    if (step == 0) return ks_errorf(KS_ERR_ARG, "arange: step is 0");
    int64_t len = ks_arange_len(start, stop, step);
    if (len == 0) return KS_OK;
    P_PTR("arange", "out", out, len);
    int64_t last = 0;
    if (start < INT32_MIN || start > INT32_MAX || len > IDX_MAX + 1 || __builtin_mul_overflow(len - 1, step, &last) ||
        (last += start) < INT32_MIN || last > INT32_MAX)
        return ks_errorf(KS_ERR_ARG, "arange: values of arange(%lld, %lld, %lld) leave the int32 range", (long long)start,
                         (long long)stop, (long long)step);
    arange_kernel<<<ks_grid1d((size_t)len, 256), 256, 0, s>>>(start, step, len, out);
    KS_CU_LAUNCH("arange kernel");
    return KS_OK;
}
