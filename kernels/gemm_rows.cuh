/* gemm_rows.cuh — y (n, out) = x (n, in) @ W^T for a few rows (2 <= n <= 64: the batched decode
 * step's dense layers), at the weight-streaming floor: every bf16 weight byte is read once from
 * memory with 16-byte loads, several in flight per lane, and meets all n rows of x in tensor-core
 * mma.sync m16n8k16 (the weights as the A operand: 16 output rows, x as the B operand: 8 input rows
 * per tile), float32 accumulation. x (float32 or bf16) is read through L1 and rounded to bf16 in
 * registers, so no conversion launch precedes the GEMM. C-callable.
 *
 * One launch computes up to three weight segments that share x (q|k|v: concatenated output rows),
 * or the gate and up projections with SwiGLU applied before the store (y = silu(x Wg^T) * (x Wu^T),
 * as swiglu.cu computes it). Where the output is narrow the K dimension is split over the blocks of
 * a thread-block cluster (<= 8) whose partial sums are added through distributed shared memory in
 * a fixed order: no atomics, no workspace, the same bits on every run.
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

typedef enum ks_gemm_rows_mode {
    KS_GEMM_ROWS_STORE = 0,  /* y[i] = x W[i]^T + bias[i] */
    KS_GEMM_ROWS_ACC = 1,    /* y[i] = y[i] + (x W[i]^T + bias[i]) (the residual add folded in) */
    KS_GEMM_ROWS_SWIGLU = 2  /* two segments of equal rows, no bias: y[0] = silu(x W[0]^T) * (x W[1]^T) */
} ks_gemm_rows_mode;

typedef struct ks_gemm_rows_args {
    const void *x;        /* (n, in) row-major, device, 16-byte aligned; float32 or bf16 (x_bf16) */
    int x_bf16;
    int n, in;            /* 1 <= n <= KS_CUDA_GEMM_ROWS_MAX, in % 8 == 0 */
    int n_seg;            /* 1..3 (SWIGLU: 2) */
    const void *W[3];     /* (rows[i], in) bf16, device, 16-byte aligned */
    const float *bias[3]; /* (rows[i]) float32 or NULL */
    float *y[3];          /* (n, rows[i]) float32, must not alias x (SWIGLU: y[0] alone) */
    int rows[3];
    int mode;             /* ks_gemm_rows_mode */
    int splits;           /* blocks over K per output tile, 1..8; 0 = chosen from the shape and n_sm */
    int impl;             /* A/B of this session's benchmark: 0 = default (2), 1 = weights into registers, 2 = through a
                             shared-memory ring, 3 = the ring with 64 rows a warp */
} ks_gemm_rows_args;

/* 1 when ks_cuda_gemm_rows takes the call (shape, alignment, mode), else 0 with *why set. */
int ks_cuda_gemm_rows_supported(const ks_gemm_rows_args *a, const char **why);

/* Queue the GEMM on s. n_sm: the device's multiprocessors (sizes the K split). Returns
 * KS_ERR_UNSUPPORTED for a call ks_cuda_gemm_rows_supported refuses. */
ks_status ks_cuda_gemm_rows(cudaStream_t s, const ks_gemm_rows_args *a, int n_sm);

#ifdef __cplusplus
}
#endif
#endif
