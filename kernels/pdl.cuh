/* pdl.cuh — programmatic dependent launch (Hopper) for the decode-path kernels.
 *
 * A kernel launched with ks_pdl_launch may be scheduled while the kernel before it in the
 * stream is still running (once every block of that one has executed ks_pdl_trigger, or
 * exited). The contract every such kernel keeps:
 *   - ks_pdl_wait() (griddepcontrol.wait: blocks until the previous grid has completed and its
 *     memory is visible) runs in every block BEFORE any read of data an earlier kernel may have
 *     produced AND before any global write (the previous kernel may still read what we would
 *     overwrite, e.g. a pool buffer freed and handed out again). Only immutable data (weights,
 *     norm weights, inv_freq tables) may be touched before it; prefetches of weights are the
 *     point of the early start.
 *   - ks_pdl_trigger() (griddepcontrol.launch_dependents) early, so the next kernel's blocks are
 *     scheduled while this one streams. It does not make this kernel's writes visible: the next
 *     kernel still waits for the whole grid.
 * Both are no-ops for a kernel launched without the attribute, so a kernel written this way is
 * also correct when launched with <<<>>> or with PDL switched off. Because each kernel's wait
 * covers its predecessor's completion, and that one waited for its own predecessor, passing the
 * wait means every earlier kernel in the stream has completed (as long as every block waits).
 *
 * Whether a launch uses the attribute is the caller's argument `pdl`, from the backend's option
 * (ks_backend_opts.pdl: off by default, measured slower: bench/NOTES.md); nothing process-wide
 * decides it. Internal to kernels/. */
#ifndef KS_CUDA_PDL_CUH
#define KS_CUDA_PDL_CUH

#include <cuda_runtime.h>
#include "common.cuh"
#include <utility>

static __device__ __forceinline__ void ks_pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

static __device__ __forceinline__ void ks_pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

/* Hint: bring the 128-byte line at p into L2 (weights only, see above). */
static __device__ __forceinline__ void ks_prefetch_l2(const void *p) {
    asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
}

/* kernel<<<grid, block, smem, s>>>(args...), with the programmatic-serialisation attribute when
 * pdl is non-zero (the kernel must then keep the contract above). Returns the launch error. */
template <typename... KArgs, typename... Args>
static inline cudaError_t ks_pdl_launch(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t s,
                                        int pdl, Args &&...args) {
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    return ks_launch_ex(kernel, grid, block, smem, s, at, pdl ? 1 : 0, std::forward<Args>(args)...);
}

#endif
