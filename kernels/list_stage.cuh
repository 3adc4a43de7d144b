/* list_stage.cuh — the staging of a recorded decode attention's lists in one launch
 * (kernels/cuda_attn.cu, cuda_attn_stage): n int32 of index lists copied from src into the
 * slot's buffer dst, and the slot's descriptor words (counts, offsets, row ranges: cu_lslot in
 * cuda_backend_int.h) written from the launch's own arguments. Before, the same staging was a
 * device-to-device copy of the lists and a host-to-device copy of the descriptor from pinned
 * memory: two copies in the stream between the handler's kernels and the next recorded
 * segment, each a gap of its own (bench/NOTES.md, issue 14, session 20). Either part may be
 * empty (n = 0: lists the slot holds already; nwords = 0: an unchanged descriptor).
 * The CPU twin is two memcpy's (the contents are copied, nothing is computed); test_cuda_prims
 * ("stage") compares the two. C-callable. */
#ifndef KS_CUDA_LIST_STAGE_CUH
#define KS_CUDA_LIST_STAGE_CUH
#include <cuda_runtime_api.h>
#include <stddef.h>
#include <stdint.h>
#include "kvsieve.h"
#ifdef __cplusplus
extern "C" {
#endif

#define KS_CUDA_STAGE_MAX_WORDS 160 /* descriptor words a launch writes (>= KS_CUDA_LSLOT_WORDS) */

/*   dst    // (n) int32, device: the slot's list buffer
 *   src    // (n) int32, device: the lists as the action left them
 *   desc   // (nwords) int32, device: the slot's descriptor; words[0 .. nwords) host values
 * KS_ERR_ARG for nwords outside [0, KS_CUDA_STAGE_MAX_WORDS] or NULL pointers with work to do;
 * a failed launch KS_ERR_DEVICE. */
ks_status ks_cuda_list_stage(cudaStream_t s, int32_t *dst, const int32_t *src, size_t n, int32_t *desc,
                             const int32_t *words, int nwords);

#ifdef __cplusplus
}
#endif
#endif
