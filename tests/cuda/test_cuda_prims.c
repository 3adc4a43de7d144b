/* test_cuda_prims.c — the device primitives (kernels/ks_cuda_prims.h) against the CPU reference
 * (core/prims.h) on random inputs of many shapes, never zeros alone: ties, plateaus, NaN, inf
 * and signed zeros included where the order rules matter. Index results (top-k, argsort, rank,
 * unique) must equal the CPU's exactly; floats within float rounding (pooling exactly).
 * The page primitives (kernels/ks_cuda_page.h) must equal core/prims_page.c bit for bit.
 * The growing calls of recorded decode handlers (grow) against both. Also times top-k of 1M
 * floats. Usage: test_cuda_prims [--quick] [--only NAME].
 * Prints "N passed, N failed"; exits 1 on failure. */
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "ks_cuda.h"
#include "prims.h"
#include "ks_cuda_page.h"

static int g_pass, g_fail, g_quick;
static const char *g_only;
static cudaStream_t S;
static ks_cuda_scratch SC;

static void result(int ok, const char *name, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void result(int ok, const char *name, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    printf("%s %-62s ", ok ? "  ok  " : "  FAIL", name);
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
    fflush(stdout);
    if (ok) g_pass++;
    else g_fail++;
}
static int want(const char *g) { return !g_only || strstr(g, g_only); }

static uint64_t g_seed = 0xabcdef12345ull;
static uint32_t rnd32(void) {
    g_seed = g_seed * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(g_seed >> 32);
}
static float frand(void) { /* (-1, 1), never 0 */
    float u = (float)(rnd32() >> 8) / 16777216.0f * 2.0f - 1.0f;
    return u == 0.0f ? 0.25f : u;
}
static int irand(int n) { return (int)(rnd32() % (uint32_t)n); }

/* data kinds for ordering tests */
enum { D_RANDOM, D_TIES, D_SPECIAL };
static void fill_kind(float *x, int64_t n, int kind) {
    for (int64_t i = 0; i < n; i++) {
        if (kind == D_RANDOM) x[i] = frand();
        else if (kind == D_TIES) x[i] = (float)(irand(7) - 3) * 0.5f; /* few distinct values, zeros included */
        else {
            int r = irand(20);
            x[i] = r == 0 ? NAN : r == 1 ? INFINITY : r == 2 ? -INFINITY : r == 3 ? -0.0f : r == 4 ? 0.0f
                 : r < 10 ? (float)(irand(3)) : frand();
        }
    }
}

static void *dalloc(size_t bytes) {
    void *p = NULL;
    if (cudaMalloc(&p, bytes ? bytes : 4)) { fprintf(stderr, "cudaMalloc %zu failed\n", bytes); exit(2); }
    return p;
}
static void *dup_dev(const void *h, size_t bytes) {
    void *d = dalloc(bytes);
    if (bytes) cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice);
    /* a copy from pageable memory may return before its DMA lands, and S does not wait for the
     * legacy stream: finish it before work on S reads d */
    cudaDeviceSynchronize();
    return d;
}
static void poison_dev(void *d, size_t bytes) { cudaMemsetAsync(d, 0xff, bytes ? bytes : 4, S); } /* NaN / -1 patterns */
static int get(void *h, const void *d, size_t bytes) {
    cudaError_t e = cudaStreamSynchronize(S);
    if (!e && bytes) e = cudaMemcpy(h, d, bytes, cudaMemcpyDeviceToHost);
    if (e) { printf("  cuda error: %s\n", cudaGetErrorString(e)); return 0; }
    return 1;
}

/* equality of floats with NaN == NaN and, when exact, the same bits for zeros */
static double float_diff(const float *a, const float *b, int64_t n, int exact) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        if (isnan(a[i]) || isnan(b[i])) {
            if (!(isnan(a[i]) && isnan(b[i]))) return INFINITY;
            continue;
        }
        if (isinf(a[i]) || isinf(b[i])) {
            if (a[i] != b[i]) return INFINITY;
            continue;
        }
        if (exact && a[i] != b[i]) return INFINITY;
        double e = (double)a[i] - b[i];
        num += e * e;
        den += (double)b[i] * b[i];
    }
    if (den == 0) return num == 0 ? 0 : INFINITY;
    return sqrt(num / den);
}

#define CHECK_ST(st, name)                                                                          \
    do {                                                                                            \
        if (st) { result(0, name, "status %s: %s", ks_status_name(st), ks_last_error()); return; }   \
    } while (0)

/* ================================================================ scores */

typedef struct sc_case {
    const char *label;
    int H, Hkv, m, n, d;
    int token_major; /* k as (n, Hkv, d) with strides; q as (m, H, d) */
    int k_bf16;
    int use_kpos, use_qpos;
    ks_scores_opts o;
} sc_case;

static void run_scores(sc_case *c) {
    char name[200];
    snprintf(name, sizeof name, "scores %s H=%d/%d m=%d n=%d d=%d%s%s%s", c->label, c->H, c->Hkv, c->m, c->n, c->d,
             c->token_major ? " token-major" : "", c->k_bf16 ? " bf16-k" : "", c->use_kpos ? " kpos" : "");
    int64_t H = c->H, Hkv = c->Hkv, m = c->m, n = c->n, d = c->d;
    size_t qn = (size_t)H * m * d, kn = (size_t)Hkv * n * d;
    float *q = malloc(sizeof(float) * (qn + 1)), *k = malloc(sizeof(float) * (kn + 1));
    for (size_t i = 0; i < qn; i++) q[i] = frand() * 2;
    for (size_t i = 0; i < kn; i++) k[i] = frand() * 2;
    uint16_t *kb = NULL;
    if (c->k_bf16) {
        kb = malloc(2 * (kn + 1));
        for (size_t i = 0; i < kn; i++) { kb[i] = ks_f32_to_bf16(k[i]); k[i] = ks_bf16_to_f32(kb[i]); }
    }
    int32_t *kpos = malloc(sizeof(int32_t) * (n + 1)), *qpos = malloc(sizeof(int32_t) * (m + 1));
    for (int64_t j = 0, p = 5; j < n; j++) { kpos[j] = (int32_t)p; p += 1 + irand(3); }
    for (int64_t i = 0; i < m; i++) qpos[i] = n ? kpos[KS_MAX(0, n - m + i)] + (irand(2) ? 0 : 1) : (int32_t)i;
    ks_scores_opts o = c->o;
    if (c->token_major) {
        o.q_head_stride = d;
        o.q_row_stride = H * d;
        o.k_head_stride = d;
        o.k_row_stride = Hkv * d;
    }
    int64_t rows, cols;
    ks_status st = ks_scores_out_shape(&o, H, Hkv, n, &rows, &cols);
    CHECK_ST(st, name);
    float *ref = malloc(sizeof(float) * (rows * cols + 1)), *got = malloc(sizeof(float) * (rows * cols + 1));
    st = ks_cpu_scores(q, c->use_qpos ? qpos : NULL, H, m, k, c->use_kpos ? kpos : NULL, Hkv, n, d, &o, ref);
    CHECK_ST(st, name);
    float *dq = dup_dev(q, sizeof(float) * qn);
    void *dk = c->k_bf16 ? dup_dev(kb, 2 * kn) : dup_dev(k, sizeof(float) * kn);
    int32_t *dkp = dup_dev(kpos, sizeof(int32_t) * n), *dqp = dup_dev(qpos, sizeof(int32_t) * m);
    float *dout = dalloc(sizeof(float) * rows * cols);
    poison_dev(dout, sizeof(float) * rows * cols);
    st = ks_cuda_scores(S, &SC, dq, c->use_qpos ? dqp : NULL, H, m, dk, c->k_bf16, c->use_kpos ? dkp : NULL, Hkv, n, d,
                        &o, dout);
    if (!st && get(got, dout, sizeof(float) * rows * cols)) {
        double e = float_diff(got, ref, rows * cols, 0);
        result(e < 2e-5, name, "relerr %.2e (%lld x %lld)", e, (long long)rows, (long long)cols);
    } else if (st) result(0, name, "status %s: %s", ks_status_name(st), ks_last_error());
    else result(0, name, "download failed");
    cudaFree(dq); cudaFree(dk); cudaFree(dkp); cudaFree(dqp); cudaFree(dout);
    free(q); free(k); free(kb); free(kpos); free(qpos); free(ref); free(got);
}

static void test_scores(void) {
    if (!want("scores")) return;
    ks_scores_opts gem = ks_scores_opts_default();
    gem.scale_mode = KS_SCALE_ONE;
    gem.heads = KS_HEADS_SUM;
    ks_scores_opts snap = ks_scores_opts_default();
    snap.softmax = 1;
    snap.causal = 1;
    snap.heads = KS_HEADS_GROUP_SUM;
    ks_scores_opts perq = snap;
    perq.heads = KS_HEADS_NONE;
    ks_scores_opts ts = ks_scores_opts_default();
    ts.scale_mode = KS_SCALE_ONE;
    ts.softmax = 1;
    ts.heads = KS_HEADS_SUM;
    ks_scores_opts mean = snap;
    mean.heads = KS_HEADS_MEAN;
    mean.scale_mode = KS_SCALE_CUSTOM;
    mean.scale = 0.3f;
    sc_case cases[] = {
        {"gemfilter", 32, 8, 1, 3000, 128, 1, 0, 0, 0, gem},
        {"gemfilter", 8, 8, 1, 1, 64, 0, 0, 0, 0, gem},
        {"gemfilter", 4, 2, 1, 77, 8, 0, 1, 0, 0, gem},
        {"snapkv w=32", 32, 8, 32, 2000, 128, 1, 0, 0, 0, snap},
        {"snapkv w=8 cache-bf16", 16, 4, 8, 1500, 64, 0, 1, 0, 0, snap},
        {"snapkv per-head", 8, 2, 5, 300, 96, 0, 0, 0, 0, perq},
        {"snapkv kpos", 8, 1, 7, 333, 64, 1, 0, 1, 0, snap},
        {"snapkv kpos+qpos", 12, 4, 9, 500, 128, 0, 0, 1, 1, snap},
        {"tokenselect mod", 32, 8, 1, 5000, 128, 0, 1, 0, 0, ts},
        {"mean custom scale", 4, 4, 3, 100, 200, 0, 0, 0, 0, mean},
        {"m=0", 4, 2, 0, 50, 64, 0, 0, 0, 0, snap},
        /* one query row per head: prim_scores1.cu where the shapes fit, the general kernel where not */
        {"one-row tokenselect 128K", 32, 8, 1, 131072, 128, 0, 1, 0, 0, ts},
        {"one-row causal kpos+qpos", 32, 8, 1, 3001, 128, 0, 1, 1, 1, snap},
        {"one-row group-sum g=7", 28, 4, 1, 2500, 128, 1, 1, 0, 0, snap},
        {"one-row per-head", 16, 1, 1, 999, 96, 0, 0, 0, 0, perq},
        {"one-row mean d=200", 6, 3, 1, 700, 200, 0, 1, 0, 0, mean},
        {"one-row d=12 (general kernel)", 4, 2, 1, 300, 12, 0, 1, 0, 0, ts},
        {"one-row raw slice", 8, 2, 1, 1200, 64, 1, 1, 1, 0, gem},
        {"one-row g=32 (general kernel)", 32, 1, 1, 400, 64, 0, 1, 0, 0, ts},
        {"one-row g=1", 8, 8, 1, 2100, 128, 0, 1, 0, 0, ts},
        {"one-row g=8 d=64", 16, 2, 1, 1777, 64, 1, 1, 0, 0, ts},
        {"one-row g=2 d=96 kpos", 4, 2, 1, 900, 96, 0, 1, 1, 0, snap},
        {"one-row float32 keys (general kernel)", 32, 8, 1, 1500, 128, 0, 0, 0, 0, ts},
        /* a head sum or mean keeps each block's logits in its shared memory where they fit
         * (prim_scores1.cu, a.res); 900000 keys of one KV head at g = 8 do not (its logits go
         * through global memory as for the other head reductions) */
        {"one-row mean causal (resident logits)", 32, 8, 1, 5000, 128, 1, 1, 0, 0, mean},
        {"one-row sum, 900000 keys (logits in global memory)", 8, 1, 1, 900000, 16, 0, 1, 0, 0, ts},
        /* d = 16 x odd: the register tiles' last chunk from an 8-byte load (sc1_dim) */
        {"one-row d=80 (five chunks)", 8, 2, 1, 1300, 80, 0, 1, 0, 0, ts},
        {"one-row d=16 (one chunk)", 4, 4, 1, 700, 16, 0, 1, 0, 0, ts},
        {"one-row d=112 token-major", 16, 4, 1, 2049, 112, 1, 1, 0, 0, snap},
        {"one-row d=48 causal kpos", 12, 3, 1, 999, 48, 0, 1, 1, 0, snap},
        /* the queries rotated first (q_rope_inv): in the one-row kernel as it reads them, in the
         * general kernel's rotation launch before it; against the CPU's rotation then scores */
        {"one-row tokenselect, rotated queries", 32, 8, 1, 40000, 128, 1, 1, 0, 0, ts},
        {"one-row d=80, rotated queries, factor 0.8", 8, 2, 1, 1300, 80, 0, 1, 0, 0, ts},
        {"rotated queries (general kernel) m=3", 8, 2, 3, 700, 64, 1, 1, 1, 1, snap},
        {"rotated queries (general kernel) f32 keys", 32, 8, 1, 900, 128, 0, 0, 0, 0, ts},
        /* an empty key domain: no logits, only the output columns (zeros) */
        {"one-row empty domain", 32, 8, 1, 1000, 128, 0, 1, 0, 0, ts},
    };
    static float rinv[64];
    for (int i = 0; i < 64; i++) rinv[i] = powf(500000.0f, -(float)i / 64.0f);
    int nc = (int)(sizeof cases / sizeof cases[0]);
    /* domains and output slices */
    cases[3].o.out_end = 2000 - 32;
    cases[4].o.out_end = 1500 - 8;
    cases[5].o.out_end = 300 - 5;
    cases[7].o.k_begin = 17;
    cases[7].o.out_begin = 10;
    cases[7].o.out_end = 480;
    cases[8].o.gqa = KS_GQA_MOD;
    cases[8].o.k_begin = 128;
    cases[8].o.k_end = 5000 - 512;
    cases[8].o.out_begin = 128;
    cases[8].o.out_end = 5000 - 512;
    cases[9].o.out_begin = 3;
    cases[11].o.k_begin = 128;
    cases[11].o.k_end = 131072 - 512;
    cases[11].o.out_begin = 128;
    cases[11].o.out_end = 131072 - 512;
    cases[12].o.k_begin = 5;
    cases[12].o.out_begin = 40;
    cases[12].o.out_end = 2900;
    cases[13].o.gqa = KS_GQA_MOD;
    cases[17].o.k_begin = 100;
    cases[17].o.k_end = 1100;
    cases[17].o.out_begin = 50;
    cases[17].o.out_end = 1000;
    for (int i = nc - 5; i < nc - 1; i++) {
        cases[i].o.q_rope_inv = rinv;
        cases[i].o.q_rope_af = i == nc - 4 ? 0.8f : 1.0f;
        cases[i].o.q_rope_pos = i == nc - 5 ? 512 : 37 + i;
    }
    cases[nc - 5].o.k_begin = cases[nc - 5].o.out_begin = 128;
    cases[nc - 5].o.k_end = cases[nc - 5].o.out_end = 40000 - 512;
    cases[nc - 1].o.k_begin = cases[nc - 1].o.k_end = 500;
    for (int i = 0; i < nc; i++) {
        if (g_quick && cases[i].n > 2000) cases[i].n = 700, cases[i].o.k_end = cases[i].o.k_end > 0 ? 600 : cases[i].o.k_end,
                                          cases[i].o.out_end = cases[i].o.out_end > 0 ? 600 : cases[i].o.out_end;
        run_scores(&cases[i]);
    }
    /* the one-row kernel's arrival counters: the backend's scratch lends counters that are zero at
     * rest, and the last block of each KV head returns its word to zero, so the calls above (each
     * relying on zeros left by the one before) leave all of them zero; a scratch without counters
     * takes a memset first (the same results) */
    if (SC.counters) {
        unsigned *hc = malloc(sizeof(unsigned) * SC.n_counters);
        int nz = 0, ok = get(hc, SC.counters, sizeof(unsigned) * SC.n_counters);
        for (int i = 0; ok && i < SC.n_counters; i++) nz += hc[i] != 0;
        result(ok && nz == 0, "scores one-row: the scratch's arrival counters are zero after the calls", "%d of %d non-zero",
               nz, SC.n_counters);
        free(hc);
    } else result(0, "scores one-row: the scratch's arrival counters are zero after the calls", "the backend lends none");
    {
        ks_cuda_scratch keep = SC;
        SC.counters = NULL;
        SC.n_counters = 0;
        sc_case c1 = cases[11], c2 = cases[13];
        c1.label = "one-row tokenselect, a scratch without counters";
        c2.label = "one-row group-sum g=7, a scratch without counters";
        run_scores(&c1);
        run_scores(&c2);
        SC = keep;
    }
    /* an argument error is the CPU's */
    float *d = dalloc(64);
    ks_scores_opts bad = ks_scores_opts_default();
    bad.k_end = 99;
    ks_status st = ks_cuda_scores(S, &SC, d, NULL, 2, 1, d, 0, NULL, 2, 4, 2, &bad, d);
    result(st == KS_ERR_ARG && strstr(ks_last_error(), "key domain"), "scores rejects a bad key domain", "%s",
           ks_last_error());
    cudaFree(d);
}

/* ================================================================ masks: ge, where, scores' skip */

/* scores under a device mask (ks_scores_opts.skip): 0 gives the bits of no mask, 1 gives zeros
 * over a poisoned output, and the one-row kernel's counters stay zero */
static void run_skip(const char *label, int H, int Hkv, int m, int n, int d, int k_bf16, ks_scores_opts o) {
    char name[200];
    int64_t rows, cols;
    ks_status st = ks_scores_out_shape(&o, H, Hkv, n, &rows, &cols);
    snprintf(name, sizeof name, "scores skip %s H=%d/%d m=%d n=%d d=%d", label, H, Hkv, m, n, d);
    CHECK_ST(st, name);
    size_t qn = (size_t)H * m * d, kn = (size_t)Hkv * n * d;
    float *q = malloc(sizeof(float) * qn), *k = malloc(sizeof(float) * kn), *a = malloc(sizeof(float) * rows * cols),
          *b = malloc(sizeof(float) * rows * cols);
    uint16_t *kb = malloc(2 * kn);
    for (size_t i = 0; i < qn; i++) q[i] = frand() * 2;
    for (size_t i = 0; i < kn; i++) { k[i] = frand() * 2; kb[i] = ks_f32_to_bf16(k[i]); }
    float masks[2] = {0.0f, 1.0f};
    float *dq = dup_dev(q, sizeof(float) * qn), *dm = dup_dev(masks, sizeof masks);
    void *dk = k_bf16 ? dup_dev(kb, 2 * kn) : dup_dev(k, sizeof(float) * kn);
    float *dout = dalloc(sizeof(float) * rows * cols);
    st = ks_cuda_scores(S, &SC, dq, NULL, H, m, dk, k_bf16, NULL, Hkv, n, d, &o, dout);
    int ok = !st && get(a, dout, sizeof(float) * rows * cols);
    o.skip = dm;
    poison_dev(dout, sizeof(float) * rows * cols);
    if (ok) st = ks_cuda_scores(S, &SC, dq, NULL, H, m, dk, k_bf16, NULL, Hkv, n, d, &o, dout);
    ok = ok && !st && get(b, dout, sizeof(float) * rows * cols);
    int same = ok && !memcmp(a, b, sizeof(float) * rows * cols), zeros = 1;
    o.skip = dm + 1;
    poison_dev(dout, sizeof(float) * rows * cols);
    if (ok) st = ks_cuda_scores(S, &SC, dq, NULL, H, m, dk, k_bf16, NULL, Hkv, n, d, &o, dout);
    ok = ok && !st && get(b, dout, sizeof(float) * rows * cols);
    for (int64_t i = 0; ok && i < rows * cols; i++) zeros &= b[i] == 0.0f && !signbit(b[i]);
    int nz = 0;
    if (ok && SC.counters) {
        unsigned *hc = malloc(sizeof(unsigned) * SC.n_counters);
        ok = get(hc, SC.counters, sizeof(unsigned) * SC.n_counters);
        for (int i = 0; ok && i < SC.n_counters; i++) nz += hc[i] != 0;
        free(hc);
    }
    if (st) result(0, name, "status %s: %s", ks_status_name(st), ks_last_error());
    else result(ok && same && zeros && !nz, name, "mask 0 the same bits: %d, mask 1 zeros: %d, counters non-zero: %d", same, zeros, nz);
    cudaFree(dq); cudaFree(dm); cudaFree(dk); cudaFree(dout);
    free(q); free(k); free(kb); free(a); free(b);
}

static void test_masks(void) {
    if (!want("masks")) return;
    /* ge: the CPU's bits, special values included, at thresholds a float comparison would get wrong */
    const int64_t n = g_quick ? 5000 : 300000;
    float *x = malloc(sizeof(float) * n), *r = malloc(sizeof(float) * n), *g = malloc(sizeof(float) * n);
    fill_kind(x, n, D_SPECIAL);
    x[0] = 0.1f;
    float *dx = dup_dev(x, sizeof(float) * n), *dout = dalloc(sizeof(float) * n);
    const double thr[] = {0.1, 0.10000001, 0.0, -INFINITY, NAN};
    for (int t = 0; t < 5; t++) {
        char name[96];
        snprintf(name, sizeof name, "ge n=%lld thr=%.9g", (long long)n, thr[t]);
        ks_cpu_ge(x, n, thr[t], r);
        poison_dev(dout, sizeof(float) * n);
        ks_status st = ks_cuda_ge(S, dx, n, thr[t], dout);
        int ok = !st && get(g, dout, sizeof(float) * n);
        result(ok && !memcmp(g, r, sizeof(float) * n), name, "%s", st ? ks_last_error() : "");
    }
    /* where: one mask value and one each, floats and int32 bits, into a */
    int32_t *ia = malloc(sizeof(int32_t) * n), *ib = malloc(sizeof(int32_t) * n), *ir = malloc(sizeof(int32_t) * n),
            *ig = malloc(sizeof(int32_t) * n);
    for (int64_t i = 0; i < n; i++) { ia[i] = (int32_t)rnd32(); ib[i] = (int32_t)rnd32(); }
    int32_t *da = dup_dev(ia, sizeof(int32_t) * n), *db = dup_dev(ib, sizeof(int32_t) * n);
    for (int c = 0; c < 3; c++) {
        const int64_t nm = c == 2 ? n : 1;
        const float one[1] = {c == 0 ? 1.0f : 0.0f};
        const float *hm = c == 2 ? x : one;
        float *dm = dup_dev(hm, sizeof(float) * nm);
        ks_cpu_where(hm, nm, ia, ib, n, ir);
        ks_status st = ks_cuda_where(S, dm, nm, da, db, n, c == 2 ? (void *)da : (void *)dout);
        int ok = !st && get(ig, c == 2 ? (void *)da : (void *)dout, sizeof(int32_t) * n);
        const char *names[3] = {"where mask 1", "where mask 0", "where per element (NaN nonzero), into a"};
        result(ok && !memcmp(ig, ir, sizeof(int32_t) * n), names[c], "%s", st ? ks_last_error() : "");
        cudaFree(dm);
    }
    ks_status st = ks_cuda_where(S, dx, 2, da, db, n, dout);
    result(st == KS_ERR_ARG && strstr(ks_last_error(), "where: the mask has 2 entries"), "where refuses a mask of 2 values",
           "%s", ks_last_error());
    cudaFree(dx); cudaFree(dout); cudaFree(da); cudaFree(db);
    free(x); free(r); free(g); free(ia); free(ib); free(ir); free(ig);
    /* the scores' skip in each kernel: the one-row kernel (TokenSelect's vote, a per-head and a
     * group-sum row) and the general kernel (several query rows, float keys) */
    ks_scores_opts ts = ks_scores_opts_default();
    ts.scale_mode = KS_SCALE_ONE;
    ts.softmax = 1;
    ts.heads = KS_HEADS_SUM;
    ts.k_begin = ts.out_begin = 128;
    ts.k_end = ts.out_end = (g_quick ? 4000 : 131072) - 512;
    run_skip("one-row tokenselect", 32, 8, 1, g_quick ? 4000 : 131072, 128, 1, ts);
    ks_scores_opts snap = ks_scores_opts_default();
    snap.softmax = 1;
    snap.causal = 1;
    snap.heads = KS_HEADS_GROUP_SUM;
    run_skip("one-row group-sum", 16, 4, 1, 2000, 64, 1, snap);
    snap.heads = KS_HEADS_NONE;
    run_skip("one-row per-head", 8, 2, 1, 900, 128, 1, snap);
    run_skip("general m=6", 8, 2, 6, 1500, 64, 1, snap);
    run_skip("general float keys", 32, 8, 1, 1200, 128, 0, ts.k_end < 1200 ? ts : snap);
    /* top-k under a mask, on each path (one cluster launch; the multi-kernel rows past 262138 keys;
     * by value through the sort): 1 -> the CPU's top k of zeros over NaN rows, 0 -> the CPU's top k */
    const int64_t ns[3] = {130432, g_quick ? 300000 : 1000000, 5000};
    const int64_t rows_of[3] = {1, 1, 3};
    for (int c = 0; c < 3; c++) {
        const int64_t nn = ns[c], R = rows_of[c], kk = 2048, tot = R * nn;
        const ks_topk_order ord = c == 2 ? KS_TOPK_BY_VALUE : KS_TOPK_BY_INDEX;
        float *hx = malloc(sizeof(float) * tot), *hv = malloc(sizeof(float) * R * kk), *rv = malloc(sizeof(float) * R * kk);
        int32_t *hi = malloc(sizeof(int32_t) * R * kk), *ri = malloc(sizeof(int32_t) * R * kk);
        fill_kind(hx, tot, D_TIES);
        float mk[2] = {0.0f, 1.0f};
        float *ddx = dup_dev(hx, sizeof(float) * tot), *dmk = dup_dev(mk, sizeof mk), *dv = dalloc(sizeof(float) * R * kk);
        int32_t *di = dalloc(sizeof(int32_t) * R * kk);
        for (int m = 0; m < 2; m++) {
            char name[128];
            snprintf(name, sizeof name, "topk skip %s, %lld x %lld keys, mask %d", c == 2 ? "by value" : "by index",
                     (long long)R, (long long)nn, m);
            if (m) for (int64_t i = 0; i < tot; i++) hx[i] = NAN; /* the CPU's masked call reads nothing either */
            ks_cpu_topk_masked(&mk[m], hx, R, nn, kk, 3, ord, ri, rv);
            poison_dev(di, sizeof(int32_t) * R * kk);
            ks_status st2 = ks_cuda_topk_skip(S, &SC, ddx, R, nn, kk, 3, ord, di, dv, dmk + m);
            int ok = !st2 && get(hi, di, sizeof(int32_t) * R * kk) && get(hv, dv, sizeof(float) * R * kk);
            result(ok && !memcmp(hi, ri, sizeof(int32_t) * R * kk) && !memcmp(hv, rv, sizeof(float) * R * kk), name, "%s",
                   st2 ? ks_last_error() : "");
        }
        cudaFree(ddx); cudaFree(dmk); cudaFree(dv); cudaFree(di);
        free(hx); free(hv); free(rv); free(hi); free(ri);
    }
}

/* ================================================================ pooling */

static void test_pool(void) {
    if (!want("pool")) return;
    int64_t ns[] = {1, 2, 5, 7, 100, 4099, 100003};
    int64_t ks[] = {1, 3, 5, 7, 31, 201};
    for (int a = 0; a < 7; a++)
        for (int b = 0; b < 6; b++)
            for (int mode = 0; mode < 2; mode++) {
                int64_t n = ns[a], kern = ks[b], rows = 1 + irand(3);
                if (g_quick && n > 5000) continue;
                char name[160];
                int kind = (a + b) % 3 == 2 ? D_SPECIAL : D_RANDOM;
                snprintf(name, sizeof name, "pool1d %s rows=%lld n=%lld kernel=%lld%s", mode ? "max" : "avg",
                         (long long)rows, (long long)n, (long long)kern, kind == D_SPECIAL ? " nan/inf" : "");
                size_t t = (size_t)(rows * n);
                float *x = malloc(4 * t), *ref = malloc(4 * t), *got = malloc(4 * t);
                fill_kind(x, rows * n, kind);
                ks_status st = ks_cpu_pool1d(x, rows, n, kern, (ks_pool_mode)mode, ref);
                CHECK_ST(st, name);
                float *dx = dup_dev(x, 4 * t), *dout = dalloc(4 * t);
                poison_dev(dout, 4 * t);
                int inplace = (b & 1) == 1;
                st = ks_cuda_pool1d(S, &SC, dx, rows, n, kern, (ks_pool_mode)mode, inplace ? dx : dout);
                CHECK_ST(st, name);
                if (!get(got, inplace ? dx : dout, 4 * t)) { result(0, name, "download"); continue; }
                int whole = kern / 2 >= n - 1; /* sum order differs there */
                double e = float_diff(got, ref, rows * n, !whole || mode == 1);
                result(e <= (whole ? 1e-6 : 0), name, "%s%s", e == 0 ? "exact" : "diff", inplace ? " (in place)" : "");
                cudaFree(dx); cudaFree(dout);
                free(x); free(ref); free(got);
            }
    ks_status st = ks_cuda_pool1d(S, &SC, NULL, 0, 0, 4, KS_POOL_AVG, NULL);
    result(st == KS_ERR_ARG && strstr(ks_last_error(), "even"), "pool1d rejects an even kernel", "%s", ks_last_error());
}

/* ================================================================ top-k */

/* top-k's data kinds beyond fill_kind's: every key equal (+0.0 and -0.0 mixed), scores clustered
 * in one octave like TokenSelect's votes (4096 distinct values: the same top digits everywhere),
 * every value a NaN */
enum { T_EQUAL = D_SPECIAL + 1, T_CLUSTER, T_ALLNAN, T_KINDS };
static void topk_fill(float *x, int64_t n, int kind) {
    if (kind <= D_SPECIAL) { fill_kind(x, n, kind); return; }
    for (int64_t i = 0; i < n; i++)
        x[i] = kind == T_EQUAL ? (irand(2) ? -0.0f : 0.0f)
             : kind == T_CLUSTER ? 1e-3f * (1.0f + (float)irand(4096) / 65536.0f) : NAN;
}
static const char *const topk_kind_name[T_KINDS] = {"random", "ties", "nan/inf/-0", "all equal", "clustered",
                                                    "all nan"};

/* base: added to every index (ks.topk's base option) */
static void run_topk_b(int64_t rows, int64_t n, int64_t k, int kind, ks_topk_order order, int vals, int64_t base) {
    char name[200], bs[40] = "";
    if (base) snprintf(bs, sizeof bs, " base %lld", (long long)base);
    snprintf(name, sizeof name, "topk rows=%lld n=%lld k=%lld %s %s%s%s", (long long)rows, (long long)n, (long long)k,
             topk_kind_name[kind], order ? "by-index" : "by-value", vals ? " +values" : "", bs);
    size_t t = (size_t)(rows * n), kt = (size_t)(rows * k);
    float *x = malloc(4 * (t + 1));
    topk_fill(x, rows * n, kind);
    int32_t *ri = malloc(4 * (kt + 1)), *gi = malloc(4 * (kt + 1));
    float *rv = malloc(4 * (kt + 1)), *gv = malloc(4 * (kt + 1));
    ks_status st = ks_cpu_topk(x, rows, n, k, base, order, ri, rv);
    CHECK_ST(st, name);
    float *dx = dup_dev(x, 4 * t), *dv = dalloc(4 * kt);
    int32_t *di = dalloc(4 * kt);
    poison_dev(di, 4 * kt);
    poison_dev(dv, 4 * kt);
    st = ks_cuda_topk(S, &SC, dx, rows, n, k, base, order, di, vals ? dv : NULL);
    CHECK_ST(st, name);
    int ok = get(gi, di, 4 * kt) && (!vals || get(gv, dv, 4 * kt));
    int64_t bad = -1;
    for (size_t i = 0; ok && i < kt; i++)
        if (gi[i] != ri[i]) { bad = (int64_t)i; break; }
    int vok = !vals || float_diff(gv, rv, (int64_t)kt, 1) == 0;
    if (bad >= 0) result(0, name, "index %lld: %d vs cpu %d", (long long)bad, gi[bad], ri[bad]);
    else result(ok && vok, name, "%s", ok ? (vok ? "identical to the CPU" : "values differ") : "download failed");
    cudaFree(dx); cudaFree(dv); cudaFree(di);
    free(x); free(ri); free(gi); free(rv); free(gv);
}
static void run_topk(int64_t rows, int64_t n, int64_t k, int kind, ks_topk_order order, int vals) {
    run_topk_b(rows, n, k, kind, order, vals, 0);
}

static void test_topk(void) {
    if (!want("topk")) return;
    /* the cluster path (kernels/prim_topk.cu tk_clu) takes rows of up to 262138 keys: 16 blocks of
     * 16384 with the worst misalignment (3 floats); 262139 and longer take the six kernels. The
     * lengths below give every instance of it (1, 2, 4, 8 and 16 rounds of 4 keys a thread) and
     * cluster sizes 1 to 16 */
    int64_t ns[] = {1, 5, 1000, 2047, 8191, 16385, 30080, 65537, 262138, 262139, 1 << 20, (1 << 20) + 7};
    for (int a = 0; a < 12; a++) {
        int64_t n = ns[a];
        if (g_quick && n > 70000) continue;
        int64_t kk[] = {0, 1, 7, n / 3, n - 1, n, 2048};
        for (int b = 0; b < 7; b++) {
            int64_t k = kk[b];
            if (k < 0 || k > n) continue;
            for (int kind = 0; kind < T_ALLNAN; kind++) {
                if (g_quick && kind > D_SPECIAL && b != 1 && b != 4 && b != 6) continue;
                int rows = n > 100000 ? 1 : 1 + irand(4);
                run_topk(rows, n, k, kind, (ks_topk_order)((a + b + kind) & 1), (b + kind) % 2);
            }
        }
    }
    /* the shapes of the selection policies: Quest (8 KV heads x 8191 pages, 255 pages; 2047 at
     * 32K), TokenSelect (32K context: 30080 candidates, 2048 tokens; 128K: 130432) */
    run_topk(8, 8191, 255, D_RANDOM, KS_TOPK_BY_INDEX, 0);
    run_topk(8, 8191, 255, T_CLUSTER, KS_TOPK_BY_INDEX, 0);
    run_topk(8, 2047, 255, T_CLUSTER, KS_TOPK_BY_INDEX, 0);
    run_topk(1, 30080, 2048, T_CLUSTER, KS_TOPK_BY_INDEX, 0);
    run_topk(1, 30080, 2048, D_RANDOM, KS_TOPK_BY_VALUE, 1);
    run_topk(1, 130432, 2048, T_CLUSTER, KS_TOPK_BY_INDEX, 0);
    /* one row of 65536 keys or more takes blocks of 1024 threads (tkq_threads): at its first
     * length, misaligned, with ties cut inside a block, special values and the value order */
    run_topk(1, 65536, 2048, D_TIES, KS_TOPK_BY_INDEX, 1);
    run_topk(1, 65537, 30000, D_SPECIAL, KS_TOPK_BY_VALUE, 1);
    run_topk(1, 200001, 7, T_CLUSTER, KS_TOPK_BY_VALUE, 0);
    run_topk_b(1, 130432, 2048, D_TIES, KS_TOPK_BY_INDEX, 1, 128);
    /* base (TokenSelect's candidates start at row n_init): the cluster kernel, the six kernels and
     * the value sort, each against the CPU with the same base */
    run_topk_b(1, 32128, 2048, D_RANDOM, KS_TOPK_BY_INDEX, 0, 128);
    run_topk_b(8, 8191, 255, T_CLUSTER, KS_TOPK_BY_VALUE, 1, 7);
    run_topk_b(2, (1 << 20) + 7, 999, D_TIES, KS_TOPK_BY_INDEX, 1, 100000);
    run_topk_b(1, 5000, 100, D_RANDOM, KS_TOPK_BY_INDEX, 0, (int64_t)INT32_MAX + 1 - 5000);
    /* several rows, misaligned by 1, 2 and 3 floats, at the cluster path's limit; ties cut
     * inside a middle block; all NaN */
    run_topk(4, 262137, 4095, D_TIES, KS_TOPK_BY_INDEX, 1);
    run_topk(3, 16384, 2048, D_TIES, KS_TOPK_BY_VALUE, 1);
    run_topk(3, 16383, 4095, D_SPECIAL, KS_TOPK_BY_INDEX, 1);
    run_topk(3, 16385, 4095, T_CLUSTER, KS_TOPK_BY_VALUE, 1);
    run_topk(5, 16381, 16380, T_CLUSTER, KS_TOPK_BY_INDEX, 1);
    run_topk(2, 777, 300, T_ALLNAN, KS_TOPK_BY_VALUE, 1);
    run_topk(2, 16384, 16383, T_ALLNAN, KS_TOPK_BY_INDEX, 1);
    /* more rows than multiprocessors (fewer blocks a cluster, clusters of 1), many small rows */
    run_topk(32, 8191, 255, D_RANDOM, KS_TOPK_BY_INDEX, 0);
    run_topk(300, 3001, 100, D_TIES, KS_TOPK_BY_VALUE, 1);
    run_topk(8, 131072, 13107, D_TIES, KS_TOPK_BY_INDEX, 0); /* per KV head, FastKV-like */
    run_topk(129, 16385, 100, D_TIES, KS_TOPK_BY_INDEX, 0);
    run_topk(129, 16385, 2048, D_RANDOM, KS_TOPK_BY_VALUE, 1);
    run_topk(2, 262139, 2048, D_RANDOM, KS_TOPK_BY_INDEX, 1); /* the six kernels */
    ks_status st = ks_cuda_topk(S, &SC, NULL, 1, 5, 7, 0, KS_TOPK_BY_VALUE, NULL, NULL);
    result(st == KS_ERR_ARG && !strcmp(ks_last_error(), "topk: k = 7 > n = 5"), "topk rejects k > n", "%s",
           ks_last_error());
    st = ks_cuda_topk(S, &SC, NULL, 1, 5, 2, -1, KS_TOPK_BY_VALUE, NULL, NULL);
    result(st == KS_ERR_ARG && !strcmp(ks_last_error(), "topk: base -1 + n 5 leaves the int32 index range"),
           "topk rejects a negative base", "%s", ks_last_error());
    /* time: 1M floats, k = 2048 */
    if (!g_quick) {
        int64_t n = 1 << 20, k = 2048;
        float *x = malloc(4 * n);
        fill_kind(x, n, D_RANDOM);
        float *dx = dup_dev(x, 4 * n);
        int32_t *di = dalloc(4 * k);
        cudaEvent_t e0, e1;
        cudaEventCreate(&e0);
        cudaEventCreate(&e1);
        float best[2] = {1e30f, 1e30f};
        for (int ord = 0; ord < 2; ord++)
            for (int r = 0; r < 25; r++) {
                cudaEventRecord(e0, S);
                ks_cuda_topk(S, &SC, dx, 1, n, k, 0, (ks_topk_order)ord, di, NULL);
                cudaEventRecord(e1, S);
                cudaEventSynchronize(e1);
                float ms;
                cudaEventElapsedTime(&ms, e0, e1);
                if (r >= 5 && ms < best[ord]) best[ord] = ms;
            }
        printf("  time  topk 1M floats k=2048: by-index %.1f us, by-value %.1f us (best of 20 after warm-up; "
               "target <= 100 us)\n", best[1] * 1000, best[0] * 1000);
        cudaFree(dx);
        cudaFree(di);
        free(x);
    }
}

/* ================================================================ ordering, index lists */

static void test_order(void) {
    if (!want("order")) return;
    int64_t ns[] = {1, 33, 4096, 100001};
    for (int a = 0; a < 4; a++)
        for (int kind = 0; kind < 3; kind++) {
            int64_t n = ns[a];
            char name[160];
            float *x = malloc(4 * n), *rf = malloc(4 * n), *gf = malloc(4 * n);
            int32_t *ri = malloc(4 * n), *gi = malloc(4 * n);
            fill_kind(x, n, kind);
            float *dx = dup_dev(x, 4 * n), *df = dalloc(4 * n);
            int32_t *di = dalloc(4 * n);
            for (int desc = 0; desc < 2; desc++) {
                snprintf(name, sizeof name, "argsort n=%lld kind=%d %s", (long long)n, kind, desc ? "desc" : "asc");
                ks_cpu_argsort(x, n, desc, ri);
                ks_status st = ks_cuda_argsort(S, &SC, dx, n, desc, di);
                CHECK_ST(st, name);
                result(get(gi, di, 4 * n) && !memcmp(gi, ri, 4 * n), name, "%s", "identical");
                snprintf(name, sizeof name, "sort_f32 n=%lld kind=%d %s", (long long)n, kind, desc ? "desc" : "asc");
                ks_cpu_sort_f32(x, n, desc, rf);
                st = ks_cuda_sort_f32(S, &SC, dx, n, desc, df);
                CHECK_ST(st, name);
                result(get(gf, df, 4 * n) && !memcmp(gf, rf, 4 * n), name, "bit-exact");
            }
            snprintf(name, sizeof name, "rank n=%lld kind=%d", (long long)n, kind);
            ks_cpu_rank(x, n, ri);
            ks_status st = ks_cuda_rank(S, &SC, dx, n, di);
            CHECK_ST(st, name);
            result(get(gi, di, 4 * n) && !memcmp(gi, ri, 4 * n), name, "%s", "identical");
            /* sort_f32 in place */
            snprintf(name, sizeof name, "sort_f32 in place n=%lld kind=%d", (long long)n, kind);
            ks_cpu_sort_f32(x, n, 0, rf);
            st = ks_cuda_sort_f32(S, &SC, dx, n, 0, dx);
            CHECK_ST(st, name);
            result(get(gf, dx, 4 * n) && !memcmp(gf, rf, 4 * n), name, "%s", "identical");
            cudaFree(dx); cudaFree(df); cudaFree(di);
            free(x); free(rf); free(gf); free(ri); free(gi);
        }
    /* int lists */
    int64_t ls[] = {0, 1, 17, 5000, 300000};
    for (int a = 0; a < 5; a++) {
        int64_t n = ls[a], nb = n / 2 + 1;
        char name[160];
        int32_t *x = malloc(4 * (n + 1)), *r = malloc(4 * (n + nb + 1)), *g = malloc(4 * (n + nb + 1));
        int32_t *b = malloc(4 * (nb + 1));
        for (int64_t i = 0; i < n; i++) x[i] = irand(2) ? (int32_t)irand(1000) : (int32_t)rnd32();
        int32_t *dx = dup_dev(x, 4 * n), *dout = dalloc(4 * (n + nb));
        int64_t *dn = dalloc(8), rn = 0, gn = -5;
        snprintf(name, sizeof name, "sort_i32 n=%lld", (long long)n);
        ks_cpu_sort_i32(x, n, r);
        ks_status st = ks_cuda_sort_i32(S, &SC, dx, n, dout);
        CHECK_ST(st, name);
        result(get(g, dout, 4 * n) && !memcmp(g, r, 4 * n), name, "%s", "identical");
        snprintf(name, sizeof name, "unique n=%lld", (long long)n);
        ks_cpu_unique(x, n, r, &rn);
        st = ks_cuda_unique(S, &SC, dx, n, dout, dn);
        CHECK_ST(st, name);
        int ok = get(&gn, dn, 8) && gn == rn && get(g, dout, 4 * rn) && !memcmp(g, r, 4 * rn);
        result(ok, name, "%lld distinct (cpu %lld)", (long long)gn, (long long)rn);
        /* union of two strictly ascending lists */
        int64_t na = rn;
        int32_t *ua = malloc(4 * (na + 1));
        memcpy(ua, r, 4 * na);
        int64_t m2 = 0;
        for (int64_t i = 0; i < nb; i++) {
            int32_t v = (int32_t)(i * 3 + irand(3));
            if (!m2 || v > b[m2 - 1]) b[m2++] = v;
        }
        snprintf(name, sizeof name, "union %lld + %lld", (long long)na, (long long)m2);
        ks_cpu_union(ua, na, b, m2, r, &rn);
        int32_t *da = dup_dev(ua, 4 * na), *db = dup_dev(b, 4 * m2);
        st = ks_cuda_union(S, &SC, da, na, db, m2, dout, dn);
        CHECK_ST(st, name);
        ok = get(&gn, dn, 8) && gn == rn && get(g, dout, 4 * rn) && !memcmp(g, r, 4 * rn);
        result(ok, name, "%lld values (cpu %lld)", (long long)gn, (long long)rn);
        snprintf(name, sizeof name, "concat_i32 %lld + %lld", (long long)na, (long long)m2);
        ks_cpu_concat_i32(ua, na, b, m2, r);
        st = ks_cuda_concat_i32(S, da, na, db, m2, dout);
        CHECK_ST(st, name);
        result(get(g, dout, 4 * (na + m2)) && !memcmp(g, r, 4 * (na + m2)), name, "%s", "identical");
        cudaFree(dx); cudaFree(dout); cudaFree(dn); cudaFree(da); cudaFree(db);
        free(x); free(r); free(g); free(b); free(ua);
    }
    /* arange */
    int64_t ar[][3] = {{0, 10, 1}, {5, -7, -3}, {3, 3, 1}, {-100, 100000, 7}};
    for (int a = 0; a < 4; a++) {
        int64_t len = ks_arange_len(ar[a][0], ar[a][1], ar[a][2]);
        char name[96];
        snprintf(name, sizeof name, "arange(%lld, %lld, %lld)", (long long)ar[a][0], (long long)ar[a][1], (long long)ar[a][2]);
        int32_t *r = malloc(4 * (len + 1)), *g = malloc(4 * (len + 1)), *d = dalloc(4 * (len + 1));
        ks_cpu_arange(ar[a][0], ar[a][1], ar[a][2], r);
        ks_status st = ks_cuda_arange(S, ar[a][0], ar[a][1], ar[a][2], d);
        CHECK_ST(st, name);
        result(get(g, d, 4 * len) && !memcmp(g, r, 4 * len), name, "%lld values", (long long)len);
        cudaFree(d);
        free(r); free(g);
    }
}

static void test_gather(void) {
    if (!want("gather")) return;
    int64_t shapes[][3] = {{10, 3, 4}, {1000, 64, 333}, {5, 4096, 2}};
    for (int a = 0; a < 3; a++) {
        int64_t n = shapes[a][0], d = shapes[a][1], k = shapes[a][2];
        char name[128];
        snprintf(name, sizeof name, "gather n=%lld d=%lld k=%lld", (long long)n, (long long)d, (long long)k);
        float *x = malloc(4 * n * d), *r = malloc(4 * k * d), *g = malloc(4 * k * d);
        int32_t *idx = malloc(4 * k);
        for (int64_t i = 0; i < n * d; i++) x[i] = frand();
        for (int64_t i = 0; i < k; i++) idx[i] = irand((int)n);
        ks_cpu_gather(x, n, d, idx, k, r);
        float *dx = dup_dev(x, 4 * n * d), *dout = dalloc(4 * k * d);
        int32_t *di = dup_dev(idx, 4 * k);
        int64_t *derr = dalloc(8), err = -1;
        cudaMemcpy(derr, &err, 8, cudaMemcpyHostToDevice);
        ks_status st = ks_cuda_gather(S, dx, n, d, di, k, dout, derr);
        CHECK_ST(st, name);
        int ok = get(g, dout, 4 * k * d) && !memcmp(g, r, 4 * k * d) && get(&err, derr, 8) && err == -1;
        result(ok, name, "err %lld", (long long)err);
        /* a bad index: flagged with its lowest position, nothing out of bounds */
        idx[k / 2] = (int32_t)n;
        if (k > 1) idx[k - 1] = -1;
        cudaMemcpy(di, idx, 4 * k, cudaMemcpyHostToDevice);
        err = -1;
        cudaMemcpy(derr, &err, 8, cudaMemcpyHostToDevice);
        st = ks_cuda_gather(S, dx, n, d, di, k, dout, derr);
        CHECK_ST(st, name);
        ok = get(&err, derr, 8) && err == k / 2;
        snprintf(name, sizeof name, "gather flags a bad index n=%lld k=%lld", (long long)n, (long long)k);
        result(ok, name, "err %lld (expected %lld)", (long long)err, (long long)(k / 2));
        /* int32 */
        int32_t *xi = malloc(4 * n), *ri = malloc(4 * k), *gi = malloc(4 * k);
        for (int64_t i = 0; i < n; i++) xi[i] = (int32_t)rnd32();
        idx[k / 2] = 0;
        if (k > 1) idx[k - 1] = (int32_t)(n - 1);
        ks_cpu_gather_i32(xi, n, idx, k, ri);
        int32_t *dxi = dup_dev(xi, 4 * n), *dgi = dalloc(4 * k);
        cudaMemcpy(di, idx, 4 * k, cudaMemcpyHostToDevice);
        st = ks_cuda_gather_i32(S, dxi, n, di, k, dgi, NULL);
        CHECK_ST(st, name);
        snprintf(name, sizeof name, "gather_i32 n=%lld k=%lld", (long long)n, (long long)k);
        result(get(gi, dgi, 4 * k) && !memcmp(gi, ri, 4 * k), name, "%s", "identical");
        cudaFree(dx); cudaFree(dout); cudaFree(di); cudaFree(derr); cudaFree(dxi); cudaFree(dgi);
        free(x); free(r); free(g); free(idx); free(xi); free(ri); free(gi);
    }
}

/* ================================================================ numerics */

static void test_numerics(void) {
    if (!want("numerics")) return;
    int64_t shapes[][2] = {{1, 1}, {3, 7}, {32, 4096}, {1000, 33}, {2, 300001}};
    for (int a = 0; a < 5; a++) {
        int64_t rows = shapes[a][0], cols = shapes[a][1], t = rows * cols;
        char name[160];
        float *x = malloc(4 * t), *r = malloc(4 * t), *g = malloc(4 * t);
        for (int64_t i = 0; i < t; i++) x[i] = frand() * 10;
        if (a == 1) { x[2] = -INFINITY; x[8] = NAN; for (int c = 14; c < 21; c++) x[c] = -INFINITY; } /* row rules */
        float *dx = dup_dev(x, 4 * t), *dout = dalloc(4 * t);
        snprintf(name, sizeof name, "softmax %lld x %lld", (long long)rows, (long long)cols);
        ks_cpu_softmax(x, rows, cols, r);
        ks_status st = ks_cuda_softmax(S, dx, rows, cols, dout);
        CHECK_ST(st, name);
        double e = get(g, dout, 4 * t) ? float_diff(g, r, t, 0) : INFINITY;
        result(e < 1e-6, name, "relerr %.2e", e);
        for (int axis = 0; axis < 2; axis++) {
            int64_t no = axis ? rows : cols;
            snprintf(name, sizeof name, "sum axis %d %lld x %lld", axis, (long long)rows, (long long)cols);
            ks_cpu_sum(x, rows, cols, axis, r);
            st = ks_cuda_sum(S, dx, rows, cols, axis, dout);
            CHECK_ST(st, name);
            e = get(g, dout, 4 * no) ? float_diff(g, r, no, 0) : INFINITY;
            result(a == 1 || e < 1e-6, name, "relerr %.2e", e);
            snprintf(name, sizeof name, "mean axis %d %lld x %lld", axis, (long long)rows, (long long)cols);
            ks_cpu_mean(x, rows, cols, axis, r);
            st = ks_cuda_mean(S, dx, rows, cols, axis, dout);
            CHECK_ST(st, name);
            e = get(g, dout, 4 * no) ? float_diff(g, r, no, 0) : INFINITY;
            result(a == 1 || e < 1e-6, name, "relerr %.2e", e);
            int64_t count = axis ? cols : rows;
            for (int ddof = 0; ddof < 2; ddof++) {
                if (count - ddof <= 0) continue;
                snprintf(name, sizeof name, "var axis %d ddof %d %lld x %lld", axis, ddof, (long long)rows, (long long)cols);
                ks_cpu_var(x, rows, cols, axis, ddof, r);
                st = ks_cuda_var(S, dx, rows, cols, axis, ddof, dout);
                CHECK_ST(st, name);
                e = get(g, dout, 4 * no) ? float_diff(g, r, no, 0) : INFINITY;
                result(a == 1 || e < 1e-6, name, "relerr %.2e", e);
            }
        }
        if (a != 1) {
            float *y = malloc(4 * t);
            for (int64_t i = 0; i < t; i++) y[i] = i % 5 ? frand() : x[i];
            float *dy = dup_dev(y, 4 * t);
            snprintf(name, sizeof name, "cosine_rows %lld x %lld", (long long)rows, (long long)cols);
            ks_cpu_cosine_rows(x, y, rows, cols, r);
            st = ks_cuda_cosine_rows(S, dx, dy, rows, cols, dout);
            CHECK_ST(st, name);
            e = get(g, dout, 4 * rows) ? float_diff(g, r, rows, 0) : INFINITY;
            result(e < 1e-6, name, "relerr %.2e", e);
            snprintf(name, sizeof name, "cosine n=%lld", (long long)t);
            ks_cpu_cosine(x, y, t, r);
            st = ks_cuda_cosine(S, dx, dy, t, dout);
            CHECK_ST(st, name);
            e = get(g, dout, 4) ? float_diff(g, r, 1, 0) : INFINITY;
            result(e < 1e-6, name, "%.7f vs %.7f", g[0], r[0]);
            cudaFree(dy);
            free(y);
        }
        cudaFree(dx); cudaFree(dout);
        free(x); free(r); free(g);
    }
    ks_status st = ks_cuda_var(S, NULL, 1, 0, 1, 0, NULL);
    result(st == KS_ERR_ARG, "var of an empty axis is an error", "%s", ks_last_error());
}

/* ================================================================ page primitives (ks_cuda_page.h) */

/* page_reduce (f32 and bf16 token-major views of a cache, page ranges, partial last pages),
 * bound_scores (every reduce) and page_rows (ranges; a bad entry's error word) against
 * core/prims_page.c: all bit-identical (same order, double sums). */
static void test_page(void) {
    if (!want("page")) return;
    const int64_t shapes[][5] = {{1, 1, 1, 1, 1}, {37, 2, 8, 16, 4}, {1000, 8, 128, 16, 32}, {130, 4, 64, 7, 8}, {4096, 2, 64, 16, 8}};
    for (int s = 0; s < 5; s++) {
        int64_t n = shapes[s][0], h = shapes[s][1], d = shapes[s][2], page = shapes[s][3], H = shapes[s][4], cap = n + 5;
        char name[200];
        size_t cn = (size_t)h * cap * d;
        float *cache = malloc(4 * cn);
        uint16_t *cb = malloc(2 * cn);
        for (size_t i = 0; i < cn; i++) {
            cb[i] = ks_f32_to_bf16(i % 97 == 3 ? 0.5f : frand() * 3);
            cache[i] = ks_bf16_to_f32(cb[i]);
        }
        int64_t np = ks_page_count(n, page), p0 = np / 4, p1 = np, cnt = (p1 - p0) * h * d;
        float *r[3], *g[3], *dout[3];
        for (int i = 0; i < 3; i++) {
            r[i] = malloc(4 * (cnt + 1)); g[i] = malloc(4 * (cnt + 1)); dout[i] = dalloc(4 * (cnt + 1));
            poison_dev(dout[i], 4 * (cnt + 1));
        }
        float *dc = dup_dev(cache, 4 * cn);
        uint16_t *dcb = dup_dev(cb, 2 * cn);
        for (int bf = 0; bf < 2; bf++) {
            snprintf(name, sizeof name, "page_reduce n=%lld h=%lld d=%lld page=%lld pages [%lld, %lld)%s", (long long)n,
                     (long long)h, (long long)d, (long long)page, (long long)p0, (long long)p1, bf ? " bf16" : "");
            ks_status st = ks_cpu_page_reduce(cache, 0, n, h, d, d, cap * d, page, p0, p1, r[0], r[1], r[2]);
            CHECK_ST(st, name);
            st = ks_cuda_page_reduce(S, bf ? (const void *)dcb : (const void *)dc, bf, n, h, d, d, cap * d, page, p0, p1,
                                     dout[0], dout[1], dout[2]);
            CHECK_ST(st, name);
            int ok = get(g[0], dout[0], 4 * cnt) && get(g[1], dout[1], 4 * cnt) && get(g[2], dout[2], 4 * cnt) &&
                     !memcmp(g[0], r[0], 4 * cnt) && !memcmp(g[1], r[1], 4 * cnt) && !memcmp(g[2], r[2], 4 * cnt);
            result(ok, name, "%s", ok ? "min, max, mean identical" : "DIFFER");
        }
        /* packed boxes: from the bf16 cache, its f32 copy, and f32 rows that are not bf16 values
         * (the outward rounding), against ks_cpu_page_box */
        float *craw = malloc(4 * cn);
        for (size_t i = 0; i < cn; i++) craw[i] = frand() * 3;
        float *dcr = dup_dev(craw, 4 * cn);
        uint32_t *rb = malloc(4 * (cnt + 1)), *gb = malloc(4 * (cnt + 1)), *db = dalloc(4 * (cnt + 1));
        {
            snprintf(name, sizeof name, "page_box n=%lld h=%lld d=%lld page=%lld pages [%lld, %lld) bf16", (long long)n,
                     (long long)h, (long long)d, (long long)page, (long long)p0, (long long)p1);
            ks_status st = ks_cpu_page_box(cb, 1, n, h, d, d, cap * d, page, p0, p1, rb);
            CHECK_ST(st, name);
            poison_dev(db, 4 * (cnt + 1));
            st = ks_cuda_page_box(S, dcb, 1, n, h, d, d, cap * d, page, p0, p1, db); /* kept for bound_scores_box */
            CHECK_ST(st, name);
            int ok = get(gb, db, 4 * cnt) && !memcmp(gb, rb, 4 * cnt);
            result(ok, name, "%s", ok ? "identical" : "DIFFER");
        }
        /* bound scores over the min / max boxes just made (contiguous (pages, h, d)) */
        int64_t nb = p1 - p0;
        float *q = malloc(4 * H * d), *rs = malloc(4 * (H * nb + 1)), *gs = malloc(4 * (H * nb + 1));
        for (int64_t i = 0; i < H * d; i++) q[i] = frand();
        float *dq = dup_dev(q, 4 * H * d), *ds = dalloc(4 * (H * nb + 1));
        static const char *rn[3] = {"none", "group_max", "group_sum"};
        for (int red = 0; red < 3; red++) {
            int64_t rows = red == KS_BOUND_NONE ? H : h;
            snprintf(name, sizeof name, "bound_scores %s H=%lld/%lld boxes=%lld d=%lld", rn[red], (long long)H, (long long)h,
                     (long long)nb, (long long)d);
            ks_status st = ks_cpu_bound_scores(q, H, r[0], r[1], nb, h, d, (ks_bound_reduce)red, rs);
            CHECK_ST(st, name);
            poison_dev(ds, 4 * (H * nb + 1));
            st = ks_cuda_bound_scores(S, dq, H, dout[0], dout[1], nb, h, d, (ks_bound_reduce)red, ds);
            CHECK_ST(st, name);
            int ok = get(gs, ds, 4 * rows * nb) && !memcmp(gs, rs, 4 * rows * nb);
            result(ok, name, "%s", ok ? "identical" : "DIFFER");
            /* the same bounds from the packed boxes of the bf16 cache (exact: the same bits) */
            snprintf(name, sizeof name, "bound_scores_box %s H=%lld/%lld boxes=%lld d=%lld", rn[red], (long long)H,
                     (long long)h, (long long)nb, (long long)d);
            poison_dev(ds, 4 * (H * nb + 1));
            st = ks_cuda_bound_scores_box(S, dq, H, db, nb, h, d, (ks_bound_reduce)red, ds);
            CHECK_ST(st, name);
            ok = get(gs, ds, 4 * rows * nb) && !memcmp(gs, rs, 4 * rows * nb);
            result(ok, name, "%s", ok ? "identical to the f32 min / max bounds" : "DIFFER");
        }
        for (int v = 1; v < 3; v++) { /* the f32 inputs' boxes */
            const void *hx = v == 1 ? (const void *)cache : (const void *)craw;
            const void *dx = v == 1 ? (const void *)dc : (const void *)dcr;
            snprintf(name, sizeof name, "page_box n=%lld h=%lld d=%lld page=%lld %s", (long long)n, (long long)h,
                     (long long)d, (long long)page, v == 1 ? "f32" : "f32 not bf16 (rounded outward)");
            ks_status st = ks_cpu_page_box(hx, 0, n, h, d, d, cap * d, page, p0, p1, rb);
            CHECK_ST(st, name);
            poison_dev(db, 4 * (cnt + 1));
            st = ks_cuda_page_box(S, dx, 0, n, h, d, d, cap * d, page, p0, p1, db);
            CHECK_ST(st, name);
            int ok = get(gb, db, 4 * cnt) && !memcmp(gb, rb, 4 * cnt);
            result(ok, name, "%s", ok ? "identical" : "DIFFER");
        }
        cudaFree(dcr); cudaFree(db); free(craw); free(rb); free(gb);
        cudaFree(dq); cudaFree(ds); free(q); free(rs); free(gs);
        for (int i = 0; i < 3; i++) { cudaFree(dout[i]); free(r[i]); free(g[i]); }
        cudaFree(dc); cudaFree(dcb); free(cache); free(cb);
    }
    /* page_rows: lists of ascending pages (as ks.topk gives them) with before / after ranges */
    const int64_t pr[][6] = {{1, 3, 4, 64, 0, 60}, {8, 250, 16, 4096, 16, 4080}, {2, 0, 8, 40, 0, 32}, {3, 5, 1, 9, 2, 9}};
    for (int c = 0; c < 4; c++) {
        int64_t lists = pr[c][0], k = pr[c][1], page = pr[c][2], n = pr[c][3], bb = 0, be = pr[c][4], ab = pr[c][5], ae = n;
        int64_t lo_page = (be + page - 1) / page, hi_page = ab / page, w = be + k * page + (ae - ab);
        int32_t *pages = malloc(4 * (lists * k + 1)), *ro = malloc(4 * (lists * w + 1)), *go = malloc(4 * (lists * w + 1));
        for (int64_t l = 0; l < lists; l++) { /* k distinct ascending pages of [lo_page, hi_page) */
            int64_t avail = hi_page - lo_page, chosen = 0;
            for (int64_t p = lo_page; p < hi_page && chosen < k; p++)
                if (irand((int)avail) < k - chosen || hi_page - p <= k - chosen) pages[l * k + chosen++] = (int32_t)p;
        }
        char name[200];
        snprintf(name, sizeof name, "page_rows lists=%lld k=%lld page=%lld n=%lld", (long long)lists, (long long)k,
                 (long long)page, (long long)n);
        ks_status st = ks_cpu_page_rows(pages, lists, k, page, n, bb, be, ab, ae, ro);
        CHECK_ST(st, name);
        int32_t *dp = dup_dev(pages, 4 * (lists * k + 1)), *dout = dalloc(4 * (lists * w + 1));
        int64_t m1 = -1, bad = 0, *derr = dup_dev(&m1, 8);
        st = ks_cuda_page_rows(S, dp, lists, k, page, n, bb, be, ab, ae, dout, derr);
        CHECK_ST(st, name);
        int ok = get(go, dout, 4 * lists * w) && get(&bad, derr, 8) && !memcmp(go, ro, 4 * lists * w) && bad == -1;
        result(ok, name, "%s (error word %lld)", ok ? "identical" : "DIFFER", (long long)bad);
        if (lists * k >= 2) { /* a repeated page at the last entry: the error word points at it */
            pages[lists * k - 1] = pages[lists * k - 2];
            cudaMemcpy(dp, pages, 4 * lists * k, cudaMemcpyHostToDevice);
            cudaMemcpy(derr, &m1, 8, cudaMemcpyHostToDevice);
            cudaDeviceSynchronize(); /* pageable copies may still be in flight: S does not wait for them */
            st = ks_cuda_page_rows(S, dp, lists, k, page, n, bb, be, ab, ae, dout, derr);
            CHECK_ST(st, name);
            ks_status cst = ks_cpu_page_rows(pages, lists, k, page, n, bb, be, ab, ae, ro);
            snprintf(name, sizeof name, "page_rows lists=%lld k=%lld: a bad entry", (long long)lists, (long long)k);
            int got = get(&bad, derr, 8); /* before result(): its arguments have no evaluation order */
            result(got && bad == lists * k - 1 && cst == KS_ERR_ARG, name, "error word %lld; cpu: %s", (long long)bad,
                   ks_last_error());
        }
        cudaFree(dp); cudaFree(dout); cudaFree(derr); free(pages); free(ro); free(go);
    }
    ks_status st = ks_cuda_page_reduce(S, NULL, 0, 8, 1, 1, 1, 0, 0, 0, 1, NULL, NULL, NULL);
    result(st == KS_ERR_ARG, "page_reduce: bad arguments are refused on the host", "%s", ks_last_error());
}

/* ================================================================ bound_scores (ks_cuda_page.h) */

/* the same floats bit for bit, any NaN equal to any NaN (the device's NaN payloads differ) */
static int same_bits_nan(const float *a, const float *b, int64_t n, int64_t *first) {
    for (int64_t i = 0; i < n; i++)
        if (!(isnan(a[i]) && isnan(b[i])) && memcmp(&a[i], &b[i], 4)) { *first = i; return 0; }
    return 1;
}

/* box / query contents: page summaries (lo <= hi, as page_reduce makes them), unordered pairs
 * (lo > hi too), magnitudes 2^-30 .. 2^30 of both signs (the double sums round and cancel, so a
 * term out of order shows), specials in the boxes (+-inf, NaN, +-0, denormals, 3e38) with zeros
 * and denormals in q (0 * inf), and inf / NaN in the query rows of some groups */
enum { B_SUMMARY, B_UNORDERED, B_SPREAD, B_SPECIAL_BOX, B_SPECIAL_Q, B_KINDS };
static const char *const bound_kind_name[B_KINDS] = {"summaries", "unordered", "2^+-30 spread", "box inf/nan/0/denormal",
                                                     "q inf/nan/0"};
static float bound_val(int kind) {
    if (kind == B_SPREAD) return ldexpf(frand(), irand(61) - 30);
    return frand() * 3;
}
static float bound_special(void) {
    static const float sp[8] = {INFINITY, -INFINITY, NAN, 0.0f, -0.0f, 1e-40f, -3e-42f, 3e38f};
    return sp[irand(8)];
}

/* ks_cuda_bound_scores against ks_cpu_bound_scores for every reduce: q (H, d), boxes (n, h, d);
 * lo_off > 0 places lo that many floats past a 16-byte boundary (a misaligned view) */
static void run_bound(int64_t H, int64_t h, int64_t d, int64_t n, int kind, int lo_off, const char *note) {
    size_t bn = (size_t)(n * h * d);
    float *q = malloc(4 * H * d), *lo = malloc(4 * (bn + 1)), *hi = malloc(4 * (bn + 1));
    for (int64_t i = 0; i < H * d; i++) {
        q[i] = bound_val(kind);
        if (kind >= B_SPECIAL_BOX && irand(16) == 0) q[i] = irand(2) ? 0.0f : irand(2) ? -0.0f : 2e-39f;
    }
    if (kind == B_SPECIAL_Q) { /* group 0: an inf; the last group: a NaN (when there are two) */
        q[irand((int)d)] = irand(2) ? INFINITY : -INFINITY;
        if (h > 1) q[(H - 1) * d + irand((int)d)] = NAN;
    }
    for (size_t i = 0; i < bn; i++) {
        float a = bound_val(kind), b = bound_val(kind);
        lo[i] = kind == B_SUMMARY || kind == B_SPECIAL_Q ? fminf(a, b) : a;
        hi[i] = kind == B_SUMMARY || kind == B_SPECIAL_Q ? fmaxf(a, b) : b;
    }
    if (kind == B_SPECIAL_BOX || kind == B_SPECIAL_Q)
        for (int64_t b = 0; b < n * h; b++)
            if (irand(6) == 0) (irand(2) ? lo : hi)[b * d + irand((int)d)] = bound_special();
    float *dq = dup_dev(q, 4 * H * d), *dhi = dup_dev(hi, 4 * bn), *dlo_base = dalloc(4 * (bn + (size_t)lo_off));
    cudaMemcpy(dlo_base + lo_off, lo, 4 * bn, cudaMemcpyHostToDevice);
    cudaDeviceSynchronize();
    float *dout = dalloc(4 * (H * n + 1)), *r = malloc(4 * (H * n + 1)), *g = malloc(4 * (H * n + 1));
    /* the same boxes packed (rounded outward; lo_off misaligns them too) */
    uint32_t *bx = malloc(4 * (bn + 1)), *dbx_base = dalloc(4 * (bn + (size_t)lo_off + 1));
    for (size_t i = 0; i < bn; i++) bx[i] = (uint32_t)ks_bf16_dir(lo[i], 1) | (uint32_t)ks_bf16_dir(hi[i], 0) << 16;
    cudaMemcpy(dbx_base + lo_off, bx, 4 * bn, cudaMemcpyHostToDevice);
    cudaDeviceSynchronize();
    static const char *rn[3] = {"none", "group_max", "group_sum"};
    /* reduce red % 3, boxes as f32 lo / hi (red < 3) or packed (red >= 3) */
    for (int red = 0; red < 6; red++) {
        const int packed = red >= 3;
        const ks_bound_reduce rd = (ks_bound_reduce)(red % 3);
        char name[200];
        snprintf(name, sizeof name, "bound_scores%s %s H=%lld/%lld d=%lld boxes=%lld %s%s", packed ? "_box" : "", rn[rd],
                 (long long)H, (long long)h, (long long)d, (long long)n, bound_kind_name[kind], note);
        int64_t rows = rd == KS_BOUND_NONE ? H : h;
        ks_status st = packed ? ks_cpu_bound_scores_box(q, H, bx, n, h, d, rd, r) : ks_cpu_bound_scores(q, H, lo, hi, n, h, d, rd, r);
        CHECK_ST(st, name);
        poison_dev(dout, 4 * (H * n + 1));
        st = packed ? ks_cuda_bound_scores_box(S, dq, H, dbx_base + lo_off, n, h, d, rd, dout)
                    : ks_cuda_bound_scores(S, dq, H, dlo_base + lo_off, dhi, n, h, d, rd, dout);
        CHECK_ST(st, name);
        int64_t nan = 0, first = -1;
        for (int64_t i = 0; i < rows * n; i++) nan += isnan(r[i]);
        int ok = get(g, dout, 4 * rows * n) && same_bits_nan(g, r, rows * n, &first);
        if (ok) result(1, name, "identical (%lld NaN)", (long long)nan);
        else if (first >= 0) result(0, name, "DIFFER at %lld: %.9g vs cpu %.9g", (long long)first, g[first], r[first]);
        else result(0, name, "DIFFER");
    }
    cudaFree(dq); cudaFree(dlo_base); cudaFree(dhi); cudaFree(dout); cudaFree(dbx_base);
    free(q); free(lo); free(hi); free(r); free(g); free(bx);
}

/* The fast kernel's shapes (G <= 8 query heads a KV head, d % 4 == 0, aligned boxes) and the
 * ones it refuses (the generic kernel): Quest's Llama-3.1-8B shapes (32 / 8 heads, d 128, 2047
 * and 8191 pages), groups of 1 .. 8, d 4 .. 256 (chunks of 16 and a partial one), box counts on
 * and off the block sizes, both thread layouts (a thread a query head below ~300 boxes an SM, a
 * thread a box above). --only bound runs these alone. */
static void test_bound(void) {
    if (!want("bound")) return;
    const struct { int64_t H, h, d, n; } fast[] = {
        {32, 8, 128, 2047}, {32, 8, 128, 8191}, {8, 8, 128, 1000}, {4, 2, 64, 33}, {14, 2, 96, 31},  {8, 2, 4, 1000},
        {2, 1, 64, 1},      {7, 1, 96, 33},     {4, 4, 4, 31},     {6, 2, 64, 65}, {10, 2, 128, 64}, {12, 2, 32, 100},
        {16, 2, 256, 33},   {3, 1, 16, 1},      {1, 1, 4, 1},      {8, 2, 36, 33}, {4, 1, 20, 130},
        /* >= 300 boxes an SM (132 SMs): a thread a box for the whole group */
        {16, 8, 64, 5000}, {56, 8, 96, 5000}, {24, 8, 32, 4999}, {64, 8, 4, 5001}, {16, 8, 20, 5003}, {8, 8, 128, 5000}};
    for (size_t c = 0; c < sizeof fast / sizeof fast[0]; c++)
        for (int kind = 0; kind < B_KINDS; kind++) {
            if (fast[c].n >= 4999 && kind != B_SUMMARY && kind != B_SPECIAL_BOX && kind != B_SPREAD) continue;
            run_bound(fast[c].H, fast[c].h, fast[c].d, fast[c].n, kind, 0, "");
        }
    /* refused by the fast kernel: g > 8, d % 4 != 0, misaligned lo, query rows over 48 KB of doubles */
    run_bound(16, 1, 128, 100, B_SUMMARY, 0, " (fallback: g 16)");
    run_bound(16, 1, 64, 33, B_SPECIAL_BOX, 0, " (fallback: g 16)");
    run_bound(8, 2, 5, 100, B_SPREAD, 0, " (fallback: d 5)");
    run_bound(7, 7, 7, 31, B_SPECIAL_BOX, 0, " (fallback: d 7)");
    run_bound(32, 8, 128, 200, B_SUMMARY, 1, " (fallback: lo misaligned)");
    run_bound(8, 1, 1024, 33, B_SPECIAL_Q, 0, " (fallback: 8 x 1024 query doubles)");
    float *z = dalloc(64);
    ks_status st = ks_cuda_bound_scores(S, z, 6, z, z, 1, 4, 4, KS_BOUND_GROUP_MAX, z);
    result(st == KS_ERR_ARG, "bound_scores: 6 query heads over 4 KV heads refused", "%s", ks_last_error());
    st = ks_cuda_bound_scores(S, z, 4, z, z, 0, 4, 4, KS_BOUND_GROUP_MAX, z);
    result(st == KS_OK, "bound_scores: no boxes is a no-op", "%s", st ? ks_last_error() : "ok");
    st = ks_cuda_bound_scores_box(S, z, 6, (const uint32_t *)z, 1, 4, 4, KS_BOUND_GROUP_MAX, z);
    result(st == KS_ERR_ARG, "bound_scores_box: 6 query heads over 4 KV heads refused", "%s", ks_last_error());
    st = ks_cuda_page_box(S, z, 0, 8, 1, 1, 1, 0, 2, 0, 4, NULL);
    result(st == KS_ERR_ARG, "page_box: no output refused", "%s", ks_last_error());
    cudaFree(z);
}

/* ================================================================ list_stage (list_stage.cuh) */

/* The staging launch against its CPU twin (a memcpy of the words): descriptors of several sizes;
 * nothing past them is written, and no words queue nothing. */
static void test_stage(void) {
    if (!want("stage")) return;
    const int nw[] = {0, 1, 3, 134, KS_CUDA_STAGE_MAX_WORDS};
    for (size_t t = 0; t < sizeof nw / sizeof nw[0]; t++) {
        int32_t w[KS_CUDA_STAGE_MAX_WORDS + 1], gw[KS_CUDA_STAGE_MAX_WORDS + 1];
        for (int i = 0; i <= KS_CUDA_STAGE_MAX_WORDS; i++) w[i] = irand(1 << 20) - (1 << 19);
        int32_t *dw = dalloc(4 * (KS_CUDA_STAGE_MAX_WORDS + 1));
        poison_dev(dw, 4 * (KS_CUDA_STAGE_MAX_WORDS + 1));
        int32_t poison;
        get(&poison, dw, 4);
        ks_status st = ks_cuda_list_stage(S, dw, w, nw[t]);
        char name[160];
        snprintf(name, sizeof name, "list_stage words=%d", nw[t]);
        CHECK_ST(st, name);
        int ok = get(gw, dw, 4 * (KS_CUDA_STAGE_MAX_WORDS + 1)) && !memcmp(gw, w, 4 * (size_t)nw[t]);
        for (int i = nw[t]; ok && i <= KS_CUDA_STAGE_MAX_WORDS; i++) ok = gw[i] == poison;
        result(ok, name, "%s", ok ? "words as memcpy, nothing else written" : "DIFFER");
        cudaFree(dw);
    }
    int32_t w[1] = {0};
    ks_status st = ks_cuda_list_stage(S, NULL, w, KS_CUDA_STAGE_MAX_WORDS + 1);
    result(st == KS_ERR_ARG, "list_stage: too many descriptor words refused", "%s", ks_last_error());
    st = ks_cuda_list_stage(S, NULL, NULL, 4);
    result(st == KS_ERR_ARG, "list_stage: NULL descriptor refused", "%s", ks_last_error());
}


/* ================================================================ growing calls (recorded handlers)
 * ks_cuda_scores_grow and ks_cuda_topk_grow as a recorded decode handler launches them
 * (policy.h ks_action_replay): made for n_rec keys of a KV cache of capacity cap, run with the
 * step slot's delta word saying delta rows were added since (word = goff + delta). Each against
 * the CPU on n_rec + delta keys (the key domain's and the output's ends moved by delta), and the
 * vote against the plain GPU call on n_rec + delta keys bit for bit: a growing call splits its
 * grown count as a plain call of that count does, so a replay computes what a plain step would. */
static void run_grow(const char *label, int H, int Hkv, int d, int cap, int n_rec, int n_init, int n_local, int k,
                     int grow, const int *deltas, int nd) {
    const int64_t g0 = 7; /* the slot's delta at the recording */
    uint16_t *kb = malloc(2 * (size_t)Hkv * cap * d);
    float *kf = malloc(sizeof(float) * (size_t)Hkv * cap * d), *q = malloc(sizeof(float) * (size_t)H * d);
    for (size_t i = 0; i < (size_t)Hkv * cap * d; i++) { kb[i] = ks_f32_to_bf16(frand() * 2); kf[i] = ks_bf16_to_f32(kb[i]); }
    for (int i = 0; i < H * d; i++) q[i] = frand() * 2;
    static float rinv[64];
    for (int i = 0; i < d / 2; i++) rinv[i] = powf(500000.0f, -(float)i / (float)(d / 2));
    ks_scores_opts o = ks_scores_opts_default();
    o.scale_mode = KS_SCALE_ONE;
    o.softmax = 1;
    o.heads = KS_HEADS_SUM;
    o.k_head_stride = (int64_t)cap * d;
    o.k_row_stride = d;
    o.q_rope_inv = rinv;
    o.q_rope_pos = n_local;
    o.q_rope_af = 1.0f;
    o.k_begin = o.out_begin = n_init;
    o.k_end = o.out_end = n_rec - n_local;
    o.grow = grow;
    const int64_t w_rec = n_rec - n_local - n_init, wmax = w_rec + grow;
    float *dq = dup_dev(q, sizeof(float) * H * d);
    void *dk = dup_dev(kb, 2 * (size_t)Hkv * cap * d);
    int32_t *slot = dalloc(sizeof(int32_t)), *di = dalloc(sizeof(int32_t) * k);
    float *dv = dalloc(sizeof(float) * wmax), *dp = dalloc(sizeof(float) * wmax);
    float *ref = malloc(sizeof(float) * wmax), *got = malloc(sizeof(float) * wmax), *pl = malloc(sizeof(float) * wmax);
    int32_t *ri = malloc(sizeof(int32_t) * k), *gi = malloc(sizeof(int32_t) * k);
    for (int t = 0; t < nd; t++) {
        const int delta = deltas[t];
        const int64_t n = n_rec + delta, w = w_rec + delta;
        char name[200];
        snprintf(name, sizeof name, "grow %s H=%d/%d d=%d: recorded at %d keys (grow %d), run at +%d", label, H, Hkv, d, n_rec,
                 grow, delta);
        int32_t word = (int32_t)(g0 + delta);
        cudaMemcpy(slot, &word, sizeof word, cudaMemcpyHostToDevice);
        cudaDeviceSynchronize();
        poison_dev(dv, sizeof(float) * wmax);
        ks_status st = ks_cuda_scores_grow(S, &SC, dq, NULL, H, 1, dk, 1, NULL, Hkv, n_rec, d, &o, dv, slot, (int32_t)g0);
        if (!st) st = ks_cuda_topk_grow(S, &SC, dv, w_rec, k, n_init, KS_TOPK_BY_INDEX, di, NULL, NULL, grow, slot, (int32_t)g0);
        ks_scores_opts op = o; /* the plain call on n keys: the CPU's and the GPU's */
        op.grow = 0;
        op.k_end = op.out_end = n - n_local;
        if (!st) st = ks_cuda_scores(S, &SC, dq, NULL, H, 1, dk, 1, NULL, Hkv, n, d, &op, dp);
        ks_status sc = ks_cpu_scores(q, NULL, H, 1, kf, NULL, Hkv, n, d, &op, ref);
        if (!sc) sc = ks_cpu_topk(ref, 1, w, k, n_init, KS_TOPK_BY_INDEX, ri, NULL);
        if (st || sc) { result(0, name, "status %s / %s: %s", ks_status_name(st), ks_status_name(sc), ks_last_error()); continue; }
        if (!get(got, dv, sizeof(float) * w) || !get(pl, dp, sizeof(float) * w) || !get(gi, di, sizeof(int32_t) * k)) {
            result(0, name, "download failed");
            continue;
        }
        double e = float_diff(got, ref, w, 0);
        int same = !memcmp(got, pl, sizeof(float) * w), idx = !memcmp(gi, ri, sizeof(int32_t) * k);
        result(e < 2e-5 && same && idx, name, "vote relerr %.2e against the CPU over %lld columns, %s the plain call's bits; "
               "top-%d %s the CPU's", e, (long long)w, same ? "equal to" : "NOT", k, idx ? "equal to" : "DIFFERS from");
    }
    { /* under the mask (a selection cache's hit): the top k of zeros, base .. base + k - 1, whatever
       * the row holds (poisoned) */
        char name[200];
        snprintf(name, sizeof name, "grow %s H=%d/%d d=%d: top-%d under a set mask", label, H, Hkv, d, k);
        const float one = 1.0f;
        float *dskip = dup_dev(&one, sizeof one);
        poison_dev(dv, sizeof(float) * wmax);
        ks_status st = ks_cuda_topk_grow(S, &SC, dv, w_rec, k, n_init, KS_TOPK_BY_INDEX, di, NULL, dskip, grow, slot, (int32_t)g0);
        int ok = !st && get(gi, di, sizeof(int32_t) * k), bad = -1;
        for (int i = 0; ok && i < k && bad < 0; i++)
            if (gi[i] != n_init + i) bad = i;
        result(ok && bad < 0, name, "%s", st ? ks_last_error() : !ok ? "download failed" : bad < 0 ? "base .. base + k - 1" : "a wrong index");
        cudaFree(dskip);
    }
    cudaFree(dq); cudaFree(dk); cudaFree(slot); cudaFree(di); cudaFree(dv); cudaFree(dp);
    free(kb); free(kf); free(q); free(ref); free(got); free(pl); free(ri); free(gi);
}

static void test_grow(void) {
    if (!want("grow")) return;
    static const int big[] = {0, 1, 200, 256}, small[] = {0, 3, 64, 130, 256};
    /* TokenSelect's shapes (Llama-3.1-8B: 32 / 8 heads, d 128; n_init 128, n_local 512, k 2048) */
    run_grow("tokenselect", 32, 8, 128, g_quick ? 40000 : 131072 + 300, g_quick ? 33000 : 131040, 128, 512, 2048, 256, big, 4);
    /* few candidates: the split grows from one block a KV head to several */
    run_grow("small", 8, 2, 64, 600, 40, 4, 16, 16, 256, small, 5);
}

int main(int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick")) g_quick = 1;
        else if (!strcmp(argv[i], "--only") && i + 1 < argc) g_only = argv[++i];
        else { fprintf(stderr, "usage: %s [--quick] [--only NAME]\n", argv[0]); return 2; }
    }
    ks_backend *gpu;
    if (ks_cuda_backend_create(NULL, &gpu)) { fprintf(stderr, "cuda backend: %s\n", ks_last_error()); return 2; }
    S = ks_cuda_backend_stream(gpu);
    SC = ks_cuda_backend_scratch(gpu);
    test_scores();
    test_masks();
    test_pool();
    test_topk();
    test_order();
    test_gather();
    test_numerics();
    test_page();
    test_bound();
    test_stage();
    test_grow();
    cudaStreamSynchronize(S);
    ks_backend_free(gpu);
    printf("%d passed, %d failed\n", g_pass, g_fail);
    return g_fail ? 1 : 0;
}
