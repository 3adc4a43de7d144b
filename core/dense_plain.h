/* dense_plain.h — the forward ops of backend.h (attn_in, attn_out, mlp, head) composed of a
 * backend's plain dense ops, written once for every backend: the CPU backend's forward is
 * exactly this (core/cpu_dense.c), and the CUDA backend runs it when its fused kernels are off
 * (kernels/cuda_layer.cu). Each op is the meaning backend.h gives it, in this order:
 *   attn_in   rmsnorm(x) -> xn; q, k, v = xn W^T [+ b]; rope q, k (rotate); kv_append (L)
 *   attn_out  q = xn Wo^T [+ bo]; x += q
 *   mlp       rmsnorm(x) -> xn; per chunk of KS_PLAIN_MLP_ROWS rows gate = h Wg^T, up = h Wu^T,
 *             gate = silu(gate) * up, q rows = gate Wd^T; then x += q
 *   head      rmsnorm(x[row]) -> xn; logits = xn lm_head^T
 * The MLP's gate and up, (min(n, KS_PLAIN_MLP_ROWS), ffn) each, come from b->alloc per call. */
#ifndef KS_DENSE_PLAIN_H
#define KS_DENSE_PLAIN_H

#include "backend.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KS_PLAIN_MLP_ROWS 1024 /* rows per MLP chunk: never n x ffn intermediates at once */

/* A backend's plain dense ops, on its own buffers (float32 activations; pos host arrays). */
typedef struct ks_dense_ops {
    /* y (n, out) = x (n, in) @ W^T [+ bias (out)] */
    ks_status (*matmul)(ks_backend *b, float *y, const float *x, const ks_weight *W, const ks_weight *bias, int n,
                        int in, int out);
    /* out (n, dim) = x / rms(x) * w */
    ks_status (*rmsnorm)(ks_backend *b, float *out, const float *x, const ks_weight *w, int n, int dim, float eps);
    /* in place: x (n, n_heads, head_dim) rotated at pos (n) */
    ks_status (*rope)(ks_backend *b, float *x, int n, int n_heads, const int32_t *pos, const ks_rope *r, int max_pos);
    /* out (n) = silu(gate) * up (out may alias gate) */
    ks_status (*swiglu)(ks_backend *b, float *out, const float *gate, const float *up, size_t n);
    /* x += y over n floats */
    ks_status (*add)(ks_backend *b, float *x, const float *y, size_t n);
} ks_dense_ops;

ks_status ks_plain_attn_in(ks_backend *b, const ks_dense_ops *o, const ks_layer_w *W, const ks_config *c,
                           const ks_acts *a, int n, const int32_t *pos, int max_pos, int rotate, ks_kv_layer *L);
ks_status ks_plain_attn_out(ks_backend *b, const ks_dense_ops *o, const ks_layer_w *W, const ks_config *c,
                            const ks_acts *a, int n);
ks_status ks_plain_mlp(ks_backend *b, const ks_dense_ops *o, const ks_layer_w *W, const ks_config *c, const ks_acts *a,
                       int n);
ks_status ks_plain_head(ks_backend *b, const ks_dense_ops *o, const ks_weight *norm, const ks_weight *lm_head,
                        const ks_config *c, const ks_acts *a, int row, int n, float *logits);

#ifdef __cplusplus
}
#endif
#endif
