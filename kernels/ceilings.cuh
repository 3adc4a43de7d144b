// ceilings.cuh — measured GEMM and copy rates of the current device (kvsieve bench).
#ifndef KS_CEILINGS_CUH
#define KS_CEILINGS_CUH
#include "kvsieve.h"
#ifdef __cplusplus
extern "C" {
#endif
/* A cuBLAS bf16 GEMM (8192^3, fp32 accumulation; TFLOP/s) and a 1 GiB device-to-device copy
 * (GB/s counting bytes read + written), 5 timed repetitions after a warm-up, on the default
 * stream of the current device. Needs ~1.5 GiB of free device memory for a moment.
 * Errors: KS_ERR_DEVICE with the CUDA/cuBLAS failure. */
ks_status ks_cuda_ceilings(double *gemm_tflops, double *copy_gbs);
#ifdef __cplusplus
}
#endif
#endif
