/* list_stage.cuh — the staging of a recorded decode attention's lists in one launch
 * (kernels/cuda_attn.cu, cuda_attn_stage): the slot's descriptor words (counts, offsets, row
 * ranges and the lists' base address: cu_lslot in cuda_backend_int.h) written from the launch's
 * own arguments. The lists are read where the action holds them; nothing else is copied. Before,
 * the staging also copied the lists into a slot buffer, and earlier still it was a
 * device-to-device copy plus a host-to-device copy from pinned memory: each copy a gap of its
 * own in the stream between the handler's kernels and the next recorded segment (bench/NOTES.md,
 * issue 14, sessions 20 and 22). The CPU twin is a memcpy; test_cuda_prims ("stage") compares
 * the two. C-callable. */
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

/*   desc   // (nwords) int32, device: the slot's descriptor; words[0 .. nwords) host values
 * nwords = 0 queues nothing. KS_ERR_ARG for nwords outside [0, KS_CUDA_STAGE_MAX_WORDS] or NULL
 * pointers with words to write; a failed launch KS_ERR_DEVICE. */
ks_status ks_cuda_list_stage(cudaStream_t s, int32_t *desc, const int32_t *words, int nwords);

#ifdef __cplusplus
}
#endif
#endif
