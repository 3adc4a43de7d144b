/* decode_batch.h — the reference of ks_backend.attn_decode_batch (core/backend.h), for any
 * backend: kv_append of each session's new row, then its one-row attention, session by session
 * (what core/decode_batch.c does without the hook). It is the CPU twin of the CUDA kernel
 * (kernels/attn_decode_batch.cu): tests install it as a CPU backend's hook to run the engine's
 * batched-attention path, and compare the kernel with it; the CUDA backend falls back to it for
 * shapes its kernel does not take. Same arguments and contract as the hook. */
#ifndef KS_DECODE_BATCH_H
#define KS_DECODE_BATCH_H

#include "backend.h"

ks_status ks_attn_decode_batch_loop(ks_backend *b, int n, ks_kv_layer *const *L, const float *const *q,
                                    const float *const *k, const float *const *v, const int32_t *pos, int n_heads,
                                    float scale, int window, float *const *out);

#endif
