/* gemm_wg.cuh — h (n, out) = bf16(silu(x Wg^T) * (x Wu^T)) for 1 <= n <= 64 rows of bf16 x: the
 * gate and up projections of the batched decode step's MLP and its SwiGLU in one launch, on
 * Hopper's wgmma. The rows of x are the MMA's M = 64 (rows past n are zeros that TMA fills in); a
 * tile is 64 gate rows and the same 64 up rows, the MMA's N = 128, so the thread that holds an
 * output's gate sum holds its up sum too. C-callable.
 *
 * Work: a CTA (one warpgroup) streams its tile's k-steps through a ring of shared-memory stages
 * filled by TMA (x tile 64 x 64 and W tile 128 x 64, bf16, 128-byte swizzle; one mbarrier a stage)
 * and multiplies each stage with four m64n128k16 wgmma, float32 accumulation: each weight byte is
 * read from memory once. Where the tiles are too few to fill a wave (2 CTAs a multiprocessor) the K
 * dimension is split over the S <= 8 CTAs of a cluster (the S that gives the fewest k-steps a CTA
 * times waves of clusters, cudaOccupancyMaxActiveClusters); the partial sums meet in the cluster's
 * shared memory and are added in rank (= k) order: the same bits on every run, no workspace.
 *
 * Where it pays (bench/NOTES.md, session 17; H100): the 8B shape's gate|up at 64 rows, 89 us against
 * cuBLAS's strided-batched pair (98 us) and the SwiGLU launch after it; in the engine the B = 64
 * step 19.24 -> 19.07 ms. The same kernel with float32 epilogues for q|k|v, o, down and lm_head
 * lost to cuBLAS inside the engine and was removed (branch exp/gemm-wg-s17).
 *
 * The CPU twin: the CPU backend's matmuls over the same bf16 x and weights, then SwiGLU in double
 * (tests/cuda/test_gemm_rows.c): products are exact in float32 on both sides, only the order of the
 * float32 sums differs, then one bf16 rounding. */
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

typedef struct ks_gemm_wg_args {
    const void *x;  /* (n, in) bf16 row-major, device, 16-byte aligned */
    int n, in;      /* 1 <= n <= KS_GEMM_WG_ROWS; in >= 8, in % 8 == 0 */
    const void *Wg; /* (out, in) bf16, device, 16-byte aligned: the gate weights */
    const void *Wu; /* (out, in) bf16, device, 16-byte aligned: the up weights */
    int out;        /* >= 8, out % 8 == 0 */
    void *y;        /* (n, out) bf16, row stride out, 4-byte aligned: silu(gate) * up; must not alias x or the weights */
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
