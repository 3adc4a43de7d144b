/* cpu_gemm.h — the CPU backend's matrix products, with one fixed summation order per element.
 *
 * Why not BLAS: an optimised sgemm sums each dot product in an order that depends on where the
 * element falls in the kernel's register and cache blocks, and on which kernel the library
 * picked for the CPU. Two identical input rows at different positions then get keys that differ
 * in the last bits, an exact score tie between them breaks differently from machine to machine,
 * and a policy's kept set follows (issue 12: red CI on a Haswell-kernel EPYC).
 *
 * The element rule, the only arithmetic here: for a and b of length k,
 *     lane l in [0, 8):  s_l = sum over blocks j = 0, 1, ... of a[8j + l] * b[8j + l]
 *                        (in order of j; only whole blocks of 8)
 *     s = ((s_0 + s_4) + (s_2 + s_6)) + ((s_1 + s_5) + (s_3 + s_7))
 *     then s += a[p] * b[p] for the tail p = 8 * floor(k / 8), ..., k - 1, in order.
 * Products and sums are separate float32 operations (the build passes -ffp-contract=off, so no
 * fused multiply-add), which makes the result the same bits whatever the vector width the
 * compiler or the CPU dispatch used (AVX2 and SSE run the same lanes), whatever tile or thread
 * computed the element, and whatever row of the matrix it is in.
 *
 * ks_dot is that rule for one pair. ks_gemm_nt applies it to every (row of x, row of W) pair. */
#ifndef KS_CPU_GEMM_H
#define KS_CPU_GEMM_H

#include "pool.h"

/* The element rule above. */
float ks_dot(const float *a, const float *b, int64_t k);

/* y (n, out) = x (n, in) W (out, in)^T: y[i][j] = ks_dot(x + i * in, W + j * in, in).
 * Row strides are in and out. The pool may be NULL (serial); large products are split over
 * its threads by blocks of rows and columns, which changes no bit. */
void ks_gemm_nt(ks_pool *p, float *y, const float *x, const float *W, int64_t n, int64_t in, int64_t out);

/* The same with explicit row strides: y[i * ldy + j] = ks_dot(x + i * ldx, W + j * ldw, k).
 * Serial (for use inside a pool task). */
void ks_gemm_nt_serial(float *y, int64_t ldy, const float *x, int64_t ldx, const float *W, int64_t ldw, int64_t n,
                       int64_t k, int64_t out);

/* o (R, d) += p (R, kc; row stride ldp) V (kc, d): each o[r][c] adds p[r][t] * V[t][c] to its
 * value for t = 0, 1, ..., kc - 1 in order (attention's P V: the order of keys, whatever the row).
 * Serial. */
void ks_gemm_nn_acc_serial(float *o, const float *p, int64_t ldp, const float *V, int64_t R, int64_t kc, int64_t d);

#endif
