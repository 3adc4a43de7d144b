/* cpu_dense.h — the CPU backend's plain dense ops, the pieces its forward ops (attn_in, attn_out,
 * mlp, head in backend.h) are composed of. The engine never calls them; they are here so that
 * the CUDA tests can hold each CUDA kernel against its CPU twin (tests/cuda/test_cuda.c).
 * b is a CPU backend (ks_cpu_backend_create); every buffer is host memory; shapes row-major.
 * Each result element is computed by one thread in a fixed order (cpu_backend.c's rule). */
#ifndef KS_CPU_DENSE_H
#define KS_CPU_DENSE_H

#include "backend.h"

/* y (n, out) = x (n, in) @ W^T (W: (out, in)) [+ bias (out)] */
ks_status ks_cpu_matmul(ks_backend *b, float *y, const float *x, const ks_weight *W, const ks_weight *bias, int n,
                        int in, int out);
/* out (n, dim) = E[ids] (ids: (n) host); KS_ERR_ARG for an id outside the table */
ks_status ks_cpu_embed(ks_backend *b, float *out, const ks_weight *E, const int32_t *ids, int n, int dim);
/* out (n, dim) = x / rms(x) * w */
ks_status ks_cpu_rmsnorm(ks_backend *b, float *out, const float *x, const ks_weight *w, int n, int dim, float eps);
/* in place: x (n, n_heads, head_dim) rotated at positions pos (n) with rotate-half pairing */
ks_status ks_cpu_rope(ks_backend *b, float *x, int n, int n_heads, const int32_t *pos, const ks_rope *r, int max_pos);
/* out (n) = silu(gate) * up elementwise (out may alias gate) */
ks_status ks_cpu_swiglu(ks_backend *b, float *out, const float *gate, const float *up, size_t n);
/* x += y over n floats */
ks_status ks_cpu_add(ks_backend *b, float *x, const float *y, size_t n);
/* out (k, d) = x[idx] (out may be x) */
ks_status ks_cpu_gather_rows(ks_backend *b, float *out, const float *x, const int32_t *idx, int k, int d);

#endif
