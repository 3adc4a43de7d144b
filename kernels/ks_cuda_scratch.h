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
} ks_cuda_scratch;

#endif
