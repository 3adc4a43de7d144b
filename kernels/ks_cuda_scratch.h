/* ks_cuda_scratch.h — temporary device memory for the CUDA primitives (ks_cuda_prims.h). */
#ifndef KS_CUDA_SCRATCH_H
#define KS_CUDA_SCRATCH_H
#include <stddef.h>

/* Stream-ordered scratch: alloc returns device memory usable by work queued afterwards on
 * the primitive's stream (NULL with a recorded KS_ERR_OOM message on failure); free may be
 * called right after the kernels that use the memory are queued. */
typedef struct ks_cuda_scratch {
    void *(*alloc)(void *ud, size_t bytes);
    void (*free)(void *ud, void *p);
    void *ud;
    /* counters (n_counters of them; NULL / 0 where the owner keeps none): DEVICE words that are
     * zero at rest, for a kernel that counts its blocks' arrivals; the kernel returns each word it
     * used to zero before it ends, so a call needs no memset first (one launch less). Calls on one
     * stream are serial, so one set serves every primitive of the stream. */
    unsigned *counters;
    int n_counters;
} ks_cuda_scratch;

#endif
