/* prim_sort.cu — argsort, sort, rank, unique, union (ks_cuda_prims.h). Stable LSD radix sorts
 * (CUB) on the CPU's order-preserving key, so the orders are the CPU's, ties included. */
#include "prim_common.cuh"

#include <cub/cub.cuh>

__global__ void keys_iota_kernel(const float *__restrict__ x, int64_t n, int descending, uint32_t *__restrict__ key,
                                 int32_t *__restrict__ idx) {
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        uint32_t u = f32_key(x[i]);
        key[i] = descending ? ~u : u;
        idx[i] = (int32_t)i;
    }
}
__global__ void gather_f32_kernel(const float *__restrict__ x, const int32_t *__restrict__ idx, int64_t n,
                                  float *__restrict__ out) {
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) out[i] = x[idx[i]];
}
__global__ void rank_kernel(const int32_t *__restrict__ idx, int64_t n, int32_t *__restrict__ rank) {
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t p = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; p < n; p += stride) rank[idx[p]] = (int32_t)(p + 1);
}
__global__ void store_count_kernel(const int *__restrict__ c, int64_t *__restrict__ out) { *out = *c; }

/* idx (n) = stable argsort of x; scratch from ss */
static ks_status argsort_into(cudaStream_t s, scratch_set &ss, const char *prim, const float *x, int64_t n,
                              int descending, int32_t *idx) {
    uint32_t *k0, *k1;
    int32_t *i0;
    void *tmp = NULL;
    size_t bytes = 0;
    P_SCRATCH(k0, ss, sizeof(uint32_t) * n, prim);
    P_SCRATCH(k1, ss, sizeof(uint32_t) * n, prim);
    P_SCRATCH(i0, ss, sizeof(int32_t) * n, prim);
    cub::DeviceRadixSort::SortPairs(NULL, bytes, k0, k1, i0, idx, (int)n, 0, 32, s);
    P_SCRATCH(tmp, ss, bytes, prim);
    keys_iota_kernel<<<ks_grid1d((size_t)n, 256), 256, 0, s>>>(x, n, descending, k0, i0);
    KS_CU_LAUNCH("argsort keys kernel");
    KS_CU(cub::DeviceRadixSort::SortPairs(tmp, bytes, k0, k1, i0, idx, (int)n, 0, 32, s), "argsort (cub radix sort)");
    return KS_OK;
}

static ks_status sort_check(const char *prim, const void *x, int64_t n, const void *out) {
    P_NONNEG(prim, "n", n);
    P_IDX_RANGE(prim, "n", n);
    P_PTR(prim, "x", x, n);
    P_PTR(prim, "output", out, n);
    return KS_OK;
}

extern "C" ks_status ks_cuda_argsort(cudaStream_t s, const ks_cuda_scratch *sc, const float *x, int64_t n,
                                     int descending, int32_t *out_idx) {
    ks_status st = sort_check("argsort", x, n, out_idx);
    if (st || n == 0) return st;
    scratch_set ss(sc);
    return argsort_into(s, ss, "argsort", x, n, descending, out_idx);
}

extern "C" ks_status ks_cuda_sort_f32(cudaStream_t s, const ks_cuda_scratch *sc, const float *x, int64_t n,
                                      int descending, float *out) {
    ks_status st = sort_check("sort", x, n, out);
    if (st || n == 0) return st;
    scratch_set ss(sc);
    int32_t *idx;
    float *tmp;
    P_SCRATCH(idx, ss, sizeof(int32_t) * n, "sort");
    P_SCRATCH(tmp, ss, sizeof(float) * n, "sort");
    if ((st = argsort_into(s, ss, "sort", x, n, descending, idx))) return st;
    gather_f32_kernel<<<ks_grid1d((size_t)n, 256), 256, 0, s>>>(x, idx, n, tmp);
    KS_CU_LAUNCH("sort gather kernel");
    KS_CU(cudaMemcpyAsync(out, tmp, sizeof(float) * n, cudaMemcpyDeviceToDevice, s), "sort copy");
    return KS_OK;
}

/* sorted copy of int32 x into dst (dst may be x) */
static ks_status sort_i32_into(cudaStream_t s, scratch_set &ss, const char *prim, const int32_t *x, int64_t n,
                               int32_t *dst) {
    int32_t *k1;
    void *tmp = NULL;
    size_t bytes = 0;
    P_SCRATCH(k1, ss, sizeof(int32_t) * n, prim);
    cub::DeviceRadixSort::SortKeys(NULL, bytes, x, k1, (int)n, 0, 32, s);
    P_SCRATCH(tmp, ss, bytes, prim);
    KS_CU(cub::DeviceRadixSort::SortKeys(tmp, bytes, x, k1, (int)n, 0, 32, s), "sort (cub radix sort)");
    KS_CU(cudaMemcpyAsync(dst, k1, sizeof(int32_t) * n, cudaMemcpyDeviceToDevice, s), "sort copy");
    return KS_OK;
}

extern "C" ks_status ks_cuda_sort_i32(cudaStream_t s, const ks_cuda_scratch *sc, const int32_t *x, int64_t n,
                                      int32_t *out) {
    P_NONNEG("sort", "n", n);
    P_IDX_RANGE("sort", "n", n);
    P_PTR("sort", "x", x, n);
    P_PTR("sort", "out", out, n);
    if (n == 0) return KS_OK;
    scratch_set ss(sc);
    return sort_i32_into(s, ss, "sort", x, n, out);
}

extern "C" ks_status ks_cuda_rank(cudaStream_t s, const ks_cuda_scratch *sc, const float *x, int64_t n,
                                  int32_t *out_rank) {
    P_NONNEG("rank", "n", n);
    P_IDX_RANGE("rank", "n", n);
    P_PTR("rank", "out_rank", out_rank, n);
    P_PTR("rank", "x", x, n);
    if (n == 0) return KS_OK;
    scratch_set ss(sc);
    int32_t *idx;
    P_SCRATCH(idx, ss, sizeof(int32_t) * n, "rank");
    ks_status st = argsort_into(s, ss, "rank", x, n, 1, idx);
    if (st) return st;
    rank_kernel<<<ks_grid1d((size_t)n, 256), 256, 0, s>>>(idx, n, out_rank);
    KS_CU_LAUNCH("rank kernel");
    return KS_OK;
}

/* distinct values of the sorted array `sorted` (n) into out, count into n_out (device int64) */
static ks_status unique_sorted(cudaStream_t s, scratch_set &ss, const char *prim, const int32_t *sorted, int64_t n,
                               int32_t *out, int64_t *n_out) {
    int *cnt;
    void *tmp = NULL;
    size_t bytes = 0;
    P_SCRATCH(cnt, ss, sizeof(int), prim);
    cub::DeviceSelect::Unique(NULL, bytes, sorted, out, cnt, (int)n, s);
    P_SCRATCH(tmp, ss, bytes, prim);
    KS_CU(cub::DeviceSelect::Unique(tmp, bytes, sorted, out, cnt, (int)n, s), "unique (cub select)");
    store_count_kernel<<<1, 1, 0, s>>>(cnt, n_out);
    KS_CU_LAUNCH("unique count kernel");
    return KS_OK;
}

extern "C" ks_status ks_cuda_unique(cudaStream_t s, const ks_cuda_scratch *sc, const int32_t *x, int64_t n,
                                    int32_t *out, int64_t *n_out) {
    P_PTR("unique", "n_out", n_out, 1);
    P_NONNEG("unique", "n", n);
    P_IDX_RANGE("unique", "n", n);
    P_PTR("unique", "x", x, n);
    P_PTR("unique", "out", out, n);
    if (n == 0) {
        KS_CU(cudaMemsetAsync(n_out, 0, sizeof(int64_t), s), "unique");
        return KS_OK;
    }
    scratch_set ss(sc);
    int32_t *sorted;
    P_SCRATCH(sorted, ss, sizeof(int32_t) * n, "unique");
    ks_status st = sort_i32_into(s, ss, "unique", x, n, sorted);
    if (st) return st;
    return unique_sorted(s, ss, "unique", sorted, n, out, n_out);
}

extern "C" ks_status ks_cuda_union(cudaStream_t s, const ks_cuda_scratch *sc, const int32_t *a, int64_t na,
                                   const int32_t *b, int64_t nb, int32_t *out, int64_t *n_out) {
    P_NONNEG("union", "na", na);
    P_NONNEG("union", "nb", nb);
    P_PTR("union", "a", a, na);
    P_PTR("union", "b", b, nb);
    P_PTR("union", "out", out, na + nb);
    P_PTR("union", "n_out", n_out, 1);
    int64_t n = na + nb;
    P_IDX_RANGE("union", "na + nb", n);
    if (n == 0) {
        KS_CU(cudaMemsetAsync(n_out, 0, sizeof(int64_t), s), "union");
        return KS_OK;
    }
    scratch_set ss(sc);
    int32_t *cat;
    P_SCRATCH(cat, ss, sizeof(int32_t) * n, "union");
    if (na) KS_CU(cudaMemcpyAsync(cat, a, sizeof(int32_t) * na, cudaMemcpyDeviceToDevice, s), "union copy");
    if (nb) KS_CU(cudaMemcpyAsync(cat + na, b, sizeof(int32_t) * nb, cudaMemcpyDeviceToDevice, s), "union copy");
    ks_status st = sort_i32_into(s, ss, "union", cat, n, cat);
    if (st) return st;
    return unique_sorted(s, ss, "union", cat, n, out, n_out);
}
