/* cpu_gemm.c — the element rule of cpu_gemm.h in register tiles of 2 rows of x by 4 rows of W,
 * eight float lanes per accumulator (GCC vector extensions). The same source is compiled twice,
 * for AVX2 and for the baseline x86-64 target, and picked at run time: the lanes and the order
 * of every operation are those of the source, so both give the same bits (no FMA: the build
 * passes -ffp-contract=off and neither target enables contraction on its own). */
#include "cpu_gemm.h"

#include <string.h>

/* v8 values never cross a function boundary that is not inlined; the ABI note does not apply */
#pragma GCC diagnostic ignored "-Wpsabi"

typedef float v8 __attribute__((vector_size(32)));

#define INLINE static inline __attribute__((always_inline))

INLINE v8 ld8(const float *p) {
    v8 v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* The lane reduction and the tail of the element rule. */
INLINE float finish(v8 s, const float *a, const float *b, int64_t k8, int64_t k) {
    float r = ((s[0] + s[4]) + (s[2] + s[6])) + ((s[1] + s[5]) + (s[3] + s[7]));
    for (int64_t p = k8; p < k; p++) r += a[p] * b[p];
    return r;
}

/* y (R, C) with stride ldy = x (R rows, stride ldx) . W (C rows, stride ldw)^T over k. R <= 2,
 * C <= 4, both compile-time constants at every call, so the loops unroll into registers. */
INLINE void tile(float *y, int64_t ldy, const float *x, int64_t ldx, const float *W, int64_t ldw, int64_t k, int R,
                 int C) {
    v8 acc[2][4];
#pragma GCC unroll 2
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int c = 0; c < C; c++) acc[r][c] = (v8){0, 0, 0, 0, 0, 0, 0, 0};
    int64_t k8 = k & ~(int64_t)7;
    for (int64_t p = 0; p < k8; p += 8) {
        v8 xv[2], wv[4];
#pragma GCC unroll 2
        for (int r = 0; r < R; r++) xv[r] = ld8(x + r * ldx + p);
#pragma GCC unroll 4
        for (int c = 0; c < C; c++) wv[c] = ld8(W + c * ldw + p);
#pragma GCC unroll 2
        for (int r = 0; r < R; r++)
#pragma GCC unroll 4
            for (int c = 0; c < C; c++) acc[r][c] += xv[r] * wv[c];
    }
#pragma GCC unroll 2
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int c = 0; c < C; c++) y[r * ldy + c] = finish(acc[r][c], x + r * ldx, W + c * ldw, k8, k);
}

/* Every element of y (n, out) by tiles; the W tile (4 rows) stays in cache over the rows of x. */
INLINE void block(float *y, int64_t ldy, const float *x, int64_t ldx, const float *W, int64_t ldw, int64_t n,
                  int64_t k, int64_t out) {
    int64_t j = 0;
    for (; j + 4 <= out; j += 4) {
        int64_t i = 0;
        for (; i + 2 <= n; i += 2) tile(y + i * ldy + j, ldy, x + i * ldx, ldx, W + j * ldw, ldw, k, 2, 4);
        if (i < n) tile(y + i * ldy + j, ldy, x + i * ldx, ldx, W + j * ldw, ldw, k, 1, 4);
    }
    for (; j < out; j++) {
        int64_t i = 0;
        for (; i + 2 <= n; i += 2) tile(y + i * ldy + j, ldy, x + i * ldx, ldx, W + j * ldw, ldw, k, 2, 1);
        if (i < n) tile(y + i * ldy + j, ldy, x + i * ldx, ldx, W + j * ldw, ldw, k, 1, 1);
    }
}

#if defined(__x86_64__)
__attribute__((target("avx2"))) static void block_avx2(float *y, int64_t ldy, const float *x, int64_t ldx,
                                                        const float *W, int64_t ldw, int64_t n, int64_t k, int64_t out) {
    block(y, ldy, x, ldx, W, ldw, n, k, out);
}
__attribute__((target("avx2"))) static float dot_avx2(const float *a, const float *b, int64_t k) {
    float r;
    tile(&r, 1, a, 0, b, 0, k, 1, 1);
    return r;
}
#define HAVE_AVX2() __builtin_cpu_supports("avx2")
#else
#define HAVE_AVX2() 0
#define block_avx2 block_base
#define dot_avx2 dot_base
#endif

static void block_base(float *y, int64_t ldy, const float *x, int64_t ldx, const float *W, int64_t ldw, int64_t n,
                       int64_t k, int64_t out) {
    block(y, ldy, x, ldx, W, ldw, n, k, out);
}
static float dot_base(const float *a, const float *b, int64_t k) {
    float r;
    tile(&r, 1, a, 0, b, 0, k, 1, 1);
    return r;
}

float ks_dot(const float *a, const float *b, int64_t k) { return HAVE_AVX2() ? dot_avx2(a, b, k) : dot_base(a, b, k); }

void ks_gemm_nt_serial(float *y, int64_t ldy, const float *x, int64_t ldx, const float *W, int64_t ldw, int64_t n,
                       int64_t k, int64_t out) {
    if (n <= 0 || out <= 0) return;
    if (HAVE_AVX2()) block_avx2(y, ldy, x, ldx, W, ldw, n, k, out);
    else block_base(y, ldy, x, ldx, W, ldw, n, k, out);
}

/* ---------------------------------------------------------------- o += p V */

/* o (R, 8*CV) += p (R, kc) V (kc, 8*CV) for one tile: R <= 4 rows, CV <= 2 vectors of columns.
 * Each element starts from its o value and adds p[r][t] * V[t][c] for t = 0, 1, ... in order. */
INLINE void pv_tile(float *o, int64_t ldo, const float *p, int64_t ldp, const float *V, int64_t ldv, int64_t kc, int R,
                    int CV) {
    v8 acc[4][2];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 2
        for (int c = 0; c < CV; c++) acc[r][c] = ld8(o + r * ldo + 8 * c);
    for (int64_t t = 0; t < kc; t++) {
        v8 vv[2];
#pragma GCC unroll 2
        for (int c = 0; c < CV; c++) vv[c] = ld8(V + t * ldv + 8 * c);
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            float s = p[r * ldp + t];
            v8 sv = {s, s, s, s, s, s, s, s};
#pragma GCC unroll 2
            for (int c = 0; c < CV; c++) acc[r][c] += sv * vv[c];
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 2
        for (int c = 0; c < CV; c++) memcpy(o + r * ldo + 8 * c, &acc[r][c], sizeof(v8));
}

INLINE void pv_block(float *o, const float *p, int64_t ldp, const float *V, int64_t R, int64_t kc, int64_t d) {
    int64_t r = 0;
    for (; r < R; r += 4) {
        int rr = (int)KS_MIN(4, R - r);
        float *orow = o + r * d;
        const float *prow = p + r * ldp;
        int64_t c = 0;
        for (; c + 16 <= d; c += 16) {
            if (rr == 4) pv_tile(orow + c, d, prow, ldp, V + c, d, kc, 4, 2);
            else if (rr == 3) pv_tile(orow + c, d, prow, ldp, V + c, d, kc, 3, 2);
            else if (rr == 2) pv_tile(orow + c, d, prow, ldp, V + c, d, kc, 2, 2);
            else pv_tile(orow + c, d, prow, ldp, V + c, d, kc, 1, 2);
        }
        for (; c + 8 <= d; c += 8) {
            if (rr == 4) pv_tile(orow + c, d, prow, ldp, V + c, d, kc, 4, 1);
            else if (rr == 3) pv_tile(orow + c, d, prow, ldp, V + c, d, kc, 3, 1);
            else if (rr == 2) pv_tile(orow + c, d, prow, ldp, V + c, d, kc, 2, 1);
            else pv_tile(orow + c, d, prow, ldp, V + c, d, kc, 1, 1);
        }
        for (; c < d; c++) /* a head width that is not a multiple of 8: the same rule per element */
            for (int i = 0; i < rr; i++) {
                float acc = orow[i * d + c];
                for (int64_t t = 0; t < kc; t++) acc += prow[i * ldp + t] * V[t * d + c];
                orow[i * d + c] = acc;
            }
    }
}

#if defined(__x86_64__)
__attribute__((target("avx2"))) static void pv_avx2(float *o, const float *p, int64_t ldp, const float *V, int64_t R,
                                                     int64_t kc, int64_t d) {
    pv_block(o, p, ldp, V, R, kc, d);
}
#else
#define pv_avx2 pv_base
#endif
static void pv_base(float *o, const float *p, int64_t ldp, const float *V, int64_t R, int64_t kc, int64_t d) {
    pv_block(o, p, ldp, V, R, kc, d);
}

void ks_gemm_nn_acc_serial(float *o, const float *p, int64_t ldp, const float *V, int64_t R, int64_t kc, int64_t d) {
    if (R <= 0 || kc <= 0 || d <= 0) return;
    if (HAVE_AVX2()) pv_avx2(o, p, ldp, V, R, kc, d);
    else pv_base(o, p, ldp, V, R, kc, d);
}

/* ---------------------------------------------------------------- over the pool */

typedef struct gemm_job {
    float *y;
    const float *x, *W;
    int64_t n, in, out;
    int64_t ib, jb;   /* rows of x and of W per task */
    int64_t nib;      /* row blocks */
} gemm_job;

static void gemm_task(void *ctx, int64_t t, int thread) {
    const gemm_job *g = ctx;
    int64_t i0 = (t % g->nib) * g->ib, j0 = (t / g->nib) * g->jb; /* neighbours share a W block */
    int64_t rows = KS_MIN(g->ib, g->n - i0), cols = KS_MIN(g->jb, g->out - j0);
    ks_gemm_nt_serial(g->y + i0 * g->out + j0, g->out, g->x + i0 * g->in, g->in, g->W + j0 * g->in, g->in, rows, g->in,
                      cols);
}

void ks_gemm_nt(ks_pool *p, float *y, const float *x, const float *W, int64_t n, int64_t in, int64_t out) {
    if (n <= 0 || out <= 0) return;
    int nt = ks_pool_threads(p);
    /* below ~64K multiply-adds (a 256 KB weight: ~15 us of streaming) a wake-up of the workers
     * costs about what it saves */
    if (nt == 1 || (double)n * in * out < (double)(1 << 16)) {
        ks_gemm_nt_serial(y, out, x, in, W, in, n, in, out);
        return;
    }
    /* blocks: about 64 KB of x rows and 256 KB of W rows per task, tiles whole */
    gemm_job g = {y, x, W, n, in, out, 0, 0, 0};
    g.ib = KS_MAX(2, KS_MIN(64, (16384 / KS_MAX(in, 1)) & ~(int64_t)1));
    g.jb = KS_MAX(4, KS_MIN(256, (65536 / KS_MAX(in, 1)) & ~(int64_t)3));
    g.nib = (n + g.ib - 1) / g.ib;
    int64_t njb = (out + g.jb - 1) / g.jb;
    /* enough tasks for every thread to have several (decode: one row, split the columns finer) */
    while (g.nib * njb < 4 * nt && g.jb > 4) {
        g.jb = KS_MAX(4, (g.jb / 2) & ~(int64_t)3);
        njb = (out + g.jb - 1) / g.jb;
    }
    ks_pool_run(p, g.nib * njb, gemm_task, &g);
}
