/* gemm_wg.cuh — y (n, out) = x (n, in) W^T for 1 <= n <= 64 rows of bf16 x (the batched decode
 * step's dense layers), on Hopper's wgmma: the rows of x are the MMA's M = 64 (rows past n are
 * zeros that TMA fills in), 128 rows of W its N. C-callable.
 *
 * Why it exists: at 64 rows cuBLAS streams these skinny shapes' weights at 39-79% of the copy rate
 * (bench/NOTES.md, "Joined weights ..."): its tiles leave multiprocessors idle on the narrow
 * outputs. Here a tile is 128 rows of W against all rows of x; where the tiles are too few to fill
 * one wave (2 CTAs a multiprocessor) the K dimension is split over the S <= 8 CTAs of a cluster.
 * A CTA (one warpgroup) streams its k-steps through a ring of shared-memory stages filled by TMA
 * (x tile 64 x 64 and W tile 128 x 64, bf16, 128-byte swizzle; one mbarrier a stage) and multiplies
 * each stage with four m64n128k16 wgmma, float32 accumulation, so each weight byte is read from
 * memory once. The S partial sums meet in the cluster's shared memory and are added in rank (= k)
 * order: the same bits on every run, no workspace, no atomics.
 *
 * Epilogues (mode):
 *   KS_GEMM_WG_F32     y (n, out) float32 = x W^T
 *   KS_GEMM_WG_F32_ADD y (n, out) float32 += x W^T         (the residual add of o and down)
 *   KS_GEMM_WG_SWIGLU  y (n, out) bf16 = silu(x W^T) * (x W2^T)   (gate W, up W2: a tile is 64
 *                      gate rows and the same 64 up rows, so a thread holds both of an output)
 *
 * The CPU twin is the CPU backend's matmul over the same bf16 x and W (tests/cuda/test_gemm_rows.c):
 * products are exact in float32 on both sides, only the order of the float32 sums differs. */
#ifndef KS_CUDA_GEMM_WG_CUH
#define KS_CUDA_GEMM_WG_CUH
#include <cuda_runtime_api.h>
#include <stddef.h>
#include <stdint.h>
#include "kvsieve.h"
#ifdef __cplusplus
extern "C" {
#endif

#define KS_GEMM_WG_ROWS 64 /* rows of x one launch takes */

typedef enum ks_gemm_wg_mode { KS_GEMM_WG_F32 = 0, KS_GEMM_WG_F32_ADD = 1, KS_GEMM_WG_SWIGLU = 2 } ks_gemm_wg_mode;

typedef struct ks_gemm_wg_args {
    const void *x;  /* (n, in) bf16 row-major, device, 16-byte aligned */
    int n, in;      /* 1 <= n <= KS_GEMM_WG_ROWS; in >= 8, in % 8 == 0 */
    const void *W;  /* (out, in) bf16, device, 16-byte aligned (SWIGLU: the gate weights) */
    const void *W2; /* SWIGLU: the up weights (out, in); else NULL */
    int out;        /* >= 8, out % 8 == 0 */
    int mode;       /* ks_gemm_wg_mode */
    void *y;        /* (n, out), row stride out: float32 (F32, F32_ADD) or bf16 (SWIGLU); 8-byte aligned;
                       must not alias x or the weights */
} ks_gemm_wg_args;

/* 1 when ks_cuda_gemm_wg takes the call (shape, alignment, the driver's tensor maps), else 0 with
 * *why set (a static string). */
int ks_cuda_gemm_wg_supported(const ks_gemm_wg_args *a, const char **why);

/* The CTAs a launch splits K over (1..8: a cluster), as ks_cuda_gemm_wg chooses it; 0 for a call
 * it refuses. For the benchmarks' reports. */
int ks_cuda_gemm_wg_split(const ks_gemm_wg_args *a, int n_sm);

/* Host memory of TMA tensor maps already encoded, by (address, shape, box): encoding a map costs
 * microseconds of host time, and a step asks for the same maps (weights; activations from the
 * stream-ordered pool at the same addresses) every time. One per context; not thread-safe. */
typedef struct ks_gemm_wg_cache ks_gemm_wg_cache;
ks_gemm_wg_cache *ks_cuda_gemm_wg_cache_create(void); /* NULL: out of memory */
void ks_cuda_gemm_wg_cache_free(ks_gemm_wg_cache *c);

/* Queue the GEMM on s. cache: the maps (NULL: encode every map); n_sm: the device's
 * multiprocessors (sizes the K split). Returns KS_ERR_UNSUPPORTED for a call
 * ks_cuda_gemm_wg_supported refuses, nothing queued. */
ks_status ks_cuda_gemm_wg(cudaStream_t s, const ks_gemm_wg_args *a, ks_gemm_wg_cache *cache, int n_sm);

#ifdef __cplusplus
}
#endif
#endif
