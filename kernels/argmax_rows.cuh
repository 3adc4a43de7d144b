/* argmax_rows.cuh — the greedy ids of a batched decode step on the device: for each row of the
 * step's logits (rows, cols) float32, the lowest index of its largest value, NaN never the
 * largest, 0 for a row whose element 0 is NaN (ks_sample's greedy rule, core/sample.c). One
 * launch for all rows; only the rows' ids come back to the host (B int32 instead of B rows of
 * a vocabulary of floats: 513 KB each for Llama-3's 128256).
 *
 * Work: block r (ARGMAX_THREADS threads) takes row r: each thread scans its strided share
 * (16-byte loads, four in flight, where the row is 16-byte aligned; else one float at a time)
 * keeping a (value, index) pair, then the pairs meet in a warp and block reduction by the rule
 * "the larger value, or the equal value with the lower index" (the order of merging does not
 * change the result, so the ids are those of the CPU twin, ks_argmax_rows_ref in
 * core/decode_batch.h, on every row: tests/cuda/test_attn_decode_batch.c compares them). */
#ifndef KS_CUDA_ARGMAX_ROWS_CUH
#define KS_CUDA_ARGMAX_ROWS_CUH
#include <cuda_runtime_api.h>
#include <stdint.h>
#ifdef __cplusplus
extern "C" {
#endif
#include "backend.h"

/* out (rows, device) = the argmax of each row of x (rows, cols, device); rows, cols >= 1. Queued
 * on s; nothing waits. */
ks_status ks_cuda_argmax_rows(cudaStream_t s, const float *x, int rows, int cols, int32_t *out);

/* ks_backend.argmax_rows (core/backend.h): the launch on the backend's stream into scratch, then
 * the rows' ids downloaded into out (host) with one wait. Fails while a graph records. */
ks_status ks_cuda_argmax_rows_hook(ks_backend *b, const float *x, int rows, int cols, int32_t *out);

#ifdef __cplusplus
}
#endif
#endif
