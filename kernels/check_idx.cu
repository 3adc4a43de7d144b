/* check_idx.cu — the CUDA backend's check_idx (core/backend.h): index lists in device memory
 * checked without waiting for them. Lists (rows, k), row r strictly ascending with values in
 * [0, lim[r]); the first bad entry in list order goes to one 64-bit word as
 * (r*k + i) << 34 | why << 32 | (uint32)value (why 1 out of range, 2 below its predecessor,
 * 3 equal to it) by atomicMin, so the word is the same whatever the thread order; out-of-range
 * entries are then 0, so the attention that reads the list next stays in bounds. The CPU twin is
 * cpu_check_idx in core/cpu_backend.c (tests/cuda/test_cuda.c compares them).
 *
 * Races are harmless: a thread may read its predecessor after that thread replaced it with 0,
 * but only when the predecessor was out of range, whose own word is lower and wins the minimum. */
#include "common.cuh"

#include <stdint.h>
#include <string.h>

#define CHECK_IDX_MAX_ROWS 128

struct check_idx_lims {
    int lim[CHECK_IDX_MAX_ROWS];
};

__global__ void check_idx_kernel(int32_t *__restrict__ x, int rows, int k, const __grid_constant__ check_idx_lims L,
                                 unsigned long long *__restrict__ slot) {
    int64_t total = (int64_t)rows * k;
    for (int64_t j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; j < total; j += (int64_t)gridDim.x * blockDim.x) {
        int r = (int)(j / k), i = (int)(j - (int64_t)r * k);
        int32_t v = x[j];
        int why = 0;
        if (v < 0 || v >= L.lim[r]) why = 1;
        else if (i) {
            int32_t p = x[j - 1];
            why = v < p ? 2 : v == p ? 3 : 0;
        }
        if (why) {
            atomicMin(slot, (unsigned long long)j << 34 | (unsigned long long)why << 32 | (uint32_t)v);
            if (why == 1) x[j] = 0;
        }
    }
}

extern "C" ks_status ks_cuda_check_idx(cudaStream_t s, int32_t *x, int rows, int k, const int *lim, uint64_t *slot) {
    if (rows > CHECK_IDX_MAX_ROWS) return ks_errorf(KS_ERR_UNSUPPORTED, "check_idx: %d lists (at most %d)", rows, CHECK_IDX_MAX_ROWS);
    check_idx_lims L;
    memset(&L, 0, sizeof L);
    for (int r = 0; r < rows; r++) L.lim[r] = lim[r];
    KS_CU(cudaMemsetAsync(slot, 0xff, sizeof(uint64_t), s), "check_idx");
    int64_t total = (int64_t)rows * k;
    if (total <= 0) return KS_OK;
    unsigned blocks = (unsigned)KS_MIN((total + 255) / 256, (int64_t)1024);
    check_idx_kernel<<<blocks, 256, 0, s>>>(x, rows, k, L, (unsigned long long *)slot);
    KS_CU_LAUNCH("check_idx kernel");
    return KS_OK;
}
