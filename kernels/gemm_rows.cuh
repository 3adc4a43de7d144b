/* gemm_rows.cuh — y (n, out) = x (n, in) @ W^T + bias for a few rows of x (1 <= n <= 64): bf16
 * weights streamed once with 16-byte loads, a stage in flight a lane, meeting all n rows of x
 * (staged in shared memory as bf16) in tensor-core mma.sync m16n8k16 (the weights as the A operand: 16 output rows; x as the B
 * operand: 8 rows a tile), float32 accumulation. x is float32, rounded to bf16 as it is read, so
 * no conversion launch precedes the GEMM. C-callable.
 *
 * One launch computes up to three weight segments that share x (the q|k|v projection: three
 * outputs, three optional biases). Where the output is narrow the K dimension is split over the
 * blocks of a thread-block cluster (<= 8) whose partial sums are added through distributed shared
 * memory in a fixed order: no atomics, no workspace, the same bits on every run.
 *
 * Where it pays (bench/NOTES.md, "the batched step's dense layers"; H200): the q|k|v projection of
 * 4 to 16 rows, ~1.5x faster than converting x and three cuBLAS GEMMs (25.8 against 41.6 us at 4
 * rows, 28.3 against 40.4 at 16). On the wide shapes (o, gate|up, down, lm_head) and at 64 rows
 * cuBLAS is faster (78-87% of copy on lm_head at 4-16 rows against cuBLAS's 93-96%; at 64 rows the
 * mma.sync work a weight byte bounds it at ~47%): kernels/cuda_dense.cu uses cuBLAS there.
 *
 * The CPU twin is the CPU backend's matmul given x rounded to bf16 (tests/cuda/test_gemm_rows.c):
 * the products are exact in float32 on both sides; only the summation order differs. */
#ifndef KS_CUDA_GEMM_ROWS_CUH
#define KS_CUDA_GEMM_ROWS_CUH
#include <cuda_runtime_api.h>
#include <stdint.h>
#include "kvsieve.h"
#ifdef __cplusplus
extern "C" {
#endif

#define KS_CUDA_GEMM_ROWS_MAX 64 /* rows of x one launch takes */

typedef struct ks_gemm_rows_args {
    const float *x;       /* (n, in) row-major float32, device, 16-byte aligned */
    int n, in;            /* 1 <= n <= KS_CUDA_GEMM_ROWS_MAX, in % 8 == 0 */
    int n_seg;            /* 1..3 */
    const void *W[3];     /* (rows[i], in) bf16, device, 16-byte aligned */
    const float *bias[3]; /* (rows[i]) float32 or NULL */
    float *y[3];          /* (n, rows[i]) float32: y[i] = x W[i]^T + bias[i]; must not alias x */
    int rows[3];
    int splits;           /* blocks over K per output tile, 1..8; 0 = chosen from the shape and n_sm */
} ks_gemm_rows_args;

/* 1 when ks_cuda_gemm_rows takes the call (shape, alignment), else 0 with *why set. */
int ks_cuda_gemm_rows_supported(const ks_gemm_rows_args *a, const char **why);

/* Queue the GEMM on s. n_sm: the device's multiprocessors (sizes the K split). Returns
 * KS_ERR_UNSUPPORTED for a call ks_cuda_gemm_rows_supported refuses. */
ks_status ks_cuda_gemm_rows(cudaStream_t s, const ks_gemm_rows_args *a, int n_sm);

#ifdef __cplusplus
}
#endif
#endif
