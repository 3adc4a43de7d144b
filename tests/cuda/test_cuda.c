/* test_cuda.c — parity of the CUDA backend (kernels/) with the CPU reference backend.
 *
 * Every backend operation runs on both backends on the same random inputs (never zeros),
 * many shapes (n = 1, odd sizes, sizes that are no multiple of any tile, GQA 1/4/8, head_dim
 * 8/64/96/128), outputs poisoned with NaN before each run; floats are compared by relative
 * error ||gpu - cpu|| / ||cpu||. Where the GPU stores bf16 (weights, KV cache) the CPU is
 * given the same bf16-rounded values, so the remaining difference is the GPU's own rounding
 * (bf16 activations into the GEMM; bf16 Q and P in the flash kernel) and a tight bound
 * catches indexing and masking bugs; per-row errors are checked too. End to end: the tiny
 * random model (tests/testutil.h) and stories260K on both backends, prefill logits compared
 * and greedy tokens reported.
 *
 * Usage: test_cuda [--quick] [--only NAME] [--stories DIR]     (env KS_STORIES = DIR too)
 * Prints "N passed, N failed" last; exits 1 on any failure. --quick: fewer and smaller
 * shapes (for compute-sanitizer). */
#include <stdarg.h>
#include "backend.h"
#include "engine.h"
#include "cpu_dense.h"
#include "ks_cuda.h"
#include "ks_cuda_dense.h"
#include "kv_cache.cuh"
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ================================================================ harness */

static int g_pass, g_fail, g_quick;
static const char *g_only;
/* GPU: the CUDA backend with the options of the command line; GPU_MMA: a second one in the same
 * process with the mma.sync prefill kernel, graphs off and PDL on (two backends, own options) */
static ks_backend *CPU, *GPU, *GPU_MMA;

static void result(int ok, const char *name, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void result(int ok, const char *name, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    printf("%s %-58s ", ok ? "  ok  " : "  FAIL", name);
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
    fflush(stdout);
    if (ok) g_pass++;
    else g_fail++;
}

/* an informational line, neither pass nor fail */
static void note(const char *name, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void note(const char *name, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    printf("  note %-58s ", name);
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
    fflush(stdout);
}

static int want(const char *group) { return !g_only || strstr(group, g_only); }

static uint64_t g_seed = 0x1234567;
static float frand(void) { /* uniform in (-1, 1), never exactly 0 */
    g_seed = g_seed * 6364136223846793005ull + 1442695040888963407ull;
    float u = (float)((g_seed >> 40) & 0xffffff) / 16777216.0f * 2.0f - 1.0f;
    return u == 0.0f ? 0.37f : u;
}
static void fill(float *x, size_t n, float scale) {
    for (size_t i = 0; i < n; i++) x[i] = scale * frand();
}
static float bf16r(float x) { return ks_bf16_to_f32(ks_f32_to_bf16(x)); }
static void round_bf16(float *x, size_t n) {
    for (size_t i = 0; i < n; i++) x[i] = bf16r(x[i]);
}
static int irand(int n) { /* [0, n) */
    g_seed = g_seed * 6364136223846793005ull + 1442695040888963407ull;
    return (int)((g_seed >> 33) % (uint64_t)n);
}

/* relative error; NaN or a shape of zeros gives +inf */
static double relerr(const float *out, const float *ref, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)out[i] - ref[i];
        num += d * d;
        den += (double)ref[i] * ref[i];
    }
    if (!(num == num) || !(den == den)) return INFINITY;
    if (den == 0) return num == 0 ? 0 : INFINITY;
    return sqrt(num / den);
}
/* largest relative error of any row of length d */
static double row_relerr(const float *out, const float *ref, size_t rows, size_t d) {
    double worst = 0;
    for (size_t r = 0; r < rows; r++) {
        double num = 0, den = 0;
        for (size_t i = 0; i < d; i++) {
            double e = (double)out[r * d + i] - ref[r * d + i];
            num += e * e;
            den += (double)ref[r * d + i] * ref[r * d + i];
        }
        double v = den > 0 ? sqrt(num / den) : (num > 0 ? INFINITY : 0);
        if (!(num == num)) v = INFINITY;
        if (v > worst) worst = v;
    }
    return worst;
}

/* device buffer holding host data (or NaN-poisoned when src is NULL) */
static float *gpu_buf(const float *src, size_t n) {
    float *d = GPU->alloc(GPU, n * sizeof(float));
    if (!d) { fprintf(stderr, "gpu alloc failed: %s\n", ks_last_error()); exit(2); }
    float *h = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) h[i] = src ? src[i] : NAN;
    if (GPU->upload(GPU, d, h, n * sizeof(float))) { fprintf(stderr, "upload: %s\n", ks_last_error()); exit(2); }
    free(h);
    return d;
}
/* n int32 words on the GPU, copied bit for bit (gpu_buf goes through float values) */
static int32_t *gpu_ibuf(const int32_t *src, size_t n) {
    int32_t *d = GPU->alloc(GPU, n * sizeof(int32_t) + 8);
    if (!d) { fprintf(stderr, "gpu alloc failed: %s\n", ks_last_error()); exit(2); }
    if (src && GPU->upload(GPU, d, src, n * sizeof(int32_t))) { fprintf(stderr, "upload: %s\n", ks_last_error()); exit(2); }
    return d;
}
static float *gpu_get(const float *d, size_t n) {
    float *h = malloc(n * sizeof(float));
    if (GPU->download(GPU, h, d, n * sizeof(float))) {
        fprintf(stderr, "download: %s\n", ks_last_error());
        for (size_t i = 0; i < n; i++) h[i] = NAN;
    }
    return h;
}

/* A safetensors tensor over host memory in dtype dt ("F32", "BF16", "F16"), from floats. */
typedef struct tensor_buf { ks_st_tensor t; void *mem; } tensor_buf;

static uint16_t f32_to_f16(float f) {
    union { float f; uint32_t u; } v = {f};
    uint32_t sign = (v.u >> 16) & 0x8000, e = (v.u >> 23) & 0xff, m = v.u & 0x7fffff;
    int ee = (int)e - 127 + 15;
    if (ee <= 0) return (uint16_t)sign; /* tiny -> 0 (test values are not subnormal) */
    if (ee >= 31) return (uint16_t)(sign | 0x7c00);
    uint32_t r = (uint32_t)(ee << 10) | (m >> 13);
    uint32_t rest = m & 0x1fff;
    if (rest > 0x1000 || (rest == 0x1000 && (r & 1))) r++;
    return (uint16_t)(sign | r);
}

static tensor_buf make_tensor(const char *name, const char *dt, int ndim, int64_t d0, int64_t d1, const float *vals) {
    tensor_buf b;
    memset(&b, 0, sizeof b);
    size_t n = (size_t)d0 * (ndim == 2 ? d1 : 1);
    b.t.name = name;
    b.t.ndim = ndim;
    b.t.shape[0] = d0;
    b.t.shape[1] = d1;
    b.t.file = "test";
    if (!strcmp(dt, "F32")) {
        b.t.dtype = KS_DT_F32;
        b.mem = malloc(n * 4);
        memcpy(b.mem, vals, n * 4);
        b.t.nbytes = n * 4;
    } else {
        uint16_t *h = malloc(n * 2);
        int bf = !strcmp(dt, "BF16");
        for (size_t i = 0; i < n; i++) h[i] = bf ? ks_f32_to_bf16(vals[i]) : f32_to_f16(vals[i]);
        b.t.dtype = bf ? KS_DT_BF16 : KS_DT_F16;
        b.mem = h;
        b.t.nbytes = n * 2;
    }
    b.t.data = b.mem;
    return b;
}

#define NEED(call, what)                                                                \
    do {                                                                                \
        ks_status need_st_ = (call);                                                    \
        if (need_st_ != KS_OK) {                                                        \
            result(0, what, "status %s: %s", ks_status_name(need_st_), ks_last_error()); \
            return;                                                                     \
        }                                                                               \
    } while (0)

/* ================================================================ dense ops */

static void test_matmul_one(int n, int in, int out, const char *dt, int bias) {
    char name[160];
    snprintf(name, sizeof name, "matmul n=%d in=%d out=%d %s%s", n, in, out, dt, bias ? " +bias" : "");
    float *W = malloc(sizeof(float) * in * out), *B = malloc(sizeof(float) * out), *x = malloc(sizeof(float) * n * in);
    fill(W, (size_t)in * out, 0.5f);
    fill(B, out, 1.0f);
    fill(x, (size_t)n * in, 1.0f);
    tensor_buf tw = make_tensor("W", dt, 2, out, in, W), tb = make_tensor("b", "F32", 1, out, 0, B);
    /* the CPU gets the weights the GPU stores: bf16-rounded */
    float *Wr = malloc(sizeof(float) * in * out);
    for (size_t i = 0; i < (size_t)in * out; i++)
        Wr[i] = bf16r(tw.t.dtype == KS_DT_F32 ? W[i] : tw.t.dtype == KS_DT_BF16 ? bf16r(W[i]) : ks_f16_to_f32(f32_to_f16(W[i])));
    tensor_buf twr = make_tensor("Wr", "F32", 2, out, in, Wr);
    ks_weight *cw, *cb, *gw, *gb;
    NEED(CPU->weight_create(CPU, &twr.t, 0, out, &cw), name);
    NEED(CPU->weight_create(CPU, &tb.t, 0, out, &cb), name);
    NEED(GPU->weight_create(GPU, &tw.t, 0, out, &gw), name);
    NEED(GPU->weight_create(GPU, &tb.t, 0, out, &gb), name);
    float *yc = malloc(sizeof(float) * n * out);
    NEED(ks_cpu_matmul(CPU, yc, x, cw, bias ? cb : NULL, n, in, out), name);
    float *dx = gpu_buf(x, (size_t)n * in), *dy = gpu_buf(NULL, (size_t)n * out);
    ks_status st = ks_cuda_dense_matmul(GPU, dy, dx, gw, bias ? gb : NULL, n, in, out);
    NEED(st, name);
    float *yg = gpu_get(dy, (size_t)n * out);
    double e = relerr(yg, yc, (size_t)n * out), er = row_relerr(yg, yc, n, out);
    /* bf16 activations (2^-9 relative each) into an fp32-accumulated dot: ~3e-3 */
    result(e < 1e-2 && er < 2e-2, name, "relerr %.2e (worst row %.2e)", e, er);
    GPU->free(GPU, dx);
    GPU->free(GPU, dy);
    CPU->weight_free(CPU, cw);
    CPU->weight_free(CPU, cb);
    GPU->weight_free(GPU, gw);
    GPU->weight_free(GPU, gb);
    free(W); free(B); free(x); free(Wr); free(yc); free(yg);
    free(tw.mem); free(tb.mem); free(twr.mem);
}

static void test_matmul(void) {
    if (!want("matmul")) return;
    test_matmul_one(1, 64, 96, "F32", 0);   /* n = 1: the gemv kernel */
    test_matmul_one(1, 256, 1000, "BF16", 1);
    test_matmul_one(1, 172, 64, "F16", 1);  /* in % 8 != 0: cuBLAS */
    test_matmul_one(7, 33, 17, "BF16", 1);
    test_matmul_one(5, 172, 64, "F16", 0);
    test_matmul_one(64, 256, 512, "BF16", 1);
    test_matmul_one(130, 1000, 300, "F32", 0);
    if (!g_quick) {
        test_matmul_one(1, 4096, 4096, "BF16", 0);
        test_matmul_one(1, 4096, 40000, "BF16", 0);
        test_matmul_one(1, 14336, 4096, "BF16", 1);
        test_matmul_one(257, 512, 1024, "BF16", 1);
        test_matmul_one(1025, 768, 3072, "F32", 1);
        /* the bf16 copy of x is converted in row chunks of 64 MiB: 9000 x 4096 is two chunks */
        test_matmul_one(9000, 4096, 72, "BF16", 1);
    }
}

static void test_embed(void) {
    if (!want("embed")) return;
    int shapes[][3] = {{1, 64, 8}, {17, 512, 64}, {300, 1000, 100}, {4, 32000, 4096}};
    const char *dts[] = {"BF16", "F32", "F16", "BF16"};
    for (int s = 0; s < 4; s++) {
        int n = shapes[s][0], vocab = shapes[s][1], dim = shapes[s][2];
        char name[128];
        snprintf(name, sizeof name, "embed n=%d vocab=%d dim=%d %s", n, vocab, dim, dts[s]);
        float *E = malloc(sizeof(float) * vocab * dim);
        fill(E, (size_t)vocab * dim, 2.0f);
        tensor_buf te = make_tensor("E", dts[s], 2, vocab, dim, E);
        float *Er = malloc(sizeof(float) * vocab * dim);
        for (size_t i = 0; i < (size_t)vocab * dim; i++)
            Er[i] = bf16r(te.t.dtype == KS_DT_F16 ? ks_f16_to_f32(f32_to_f16(E[i])) : E[i]);
        tensor_buf ter = make_tensor("Er", "F32", 2, vocab, dim, Er);
        int32_t *ids = malloc(sizeof(int32_t) * n);
        for (int i = 0; i < n; i++) ids[i] = i == 0 ? vocab - 1 : i == 1 ? 0 : irand(vocab);
        ks_weight *ce, *ge;
        NEED(CPU->weight_create(CPU, &ter.t, 0, vocab, &ce), name);
        NEED(GPU->weight_create(GPU, &te.t, 0, vocab, &ge), name);
        float *oc = malloc(sizeof(float) * n * dim), *dout = gpu_buf(NULL, (size_t)n * dim);
        NEED(CPU->embed(CPU, oc, ce, ids, n, dim), name);
        NEED(GPU->embed(GPU, dout, ge, ids, n, dim), name);
        float *og = gpu_get(dout, (size_t)n * dim);
        double e = relerr(og, oc, (size_t)n * dim);
        result(e == 0, name, "relerr %.2e (exact expected)", e);
        /* a bad id is an error, not a crash */
        ids[0] = vocab;
        ks_status st = GPU->embed(GPU, dout, ge, ids, n, dim);
        if (s == 0) result(st == KS_ERR_ARG, "embed rejects an out-of-range id", "status %s: %s", ks_status_name(st), ks_last_error());
        GPU->free(GPU, dout);
        CPU->weight_free(CPU, ce);
        GPU->weight_free(GPU, ge);
        free(E); free(Er); free(ids); free(oc); free(og); free(te.mem); free(ter.mem);
    }
}

static void test_rmsnorm(void) {
    if (!want("rmsnorm")) return;
    int shapes[][2] = {{1, 8}, {5, 64}, {64, 4096}, {300, 1000}, {3, 5120}};
    for (int s = 0; s < 5; s++) {
        int n = shapes[s][0], dim = shapes[s][1];
        char name[128];
        snprintf(name, sizeof name, "rmsnorm n=%d dim=%d", n, dim);
        float *w = malloc(sizeof(float) * dim), *x = malloc(sizeof(float) * n * dim);
        for (int i = 0; i < dim; i++) w[i] = 1.0f + 0.3f * frand();
        fill(x, (size_t)n * dim, 3.0f);
        tensor_buf tw = make_tensor("w", "F32", 1, dim, 0, w);
        ks_weight *cw, *gw;
        NEED(CPU->weight_create(CPU, &tw.t, 0, dim, &cw), name);
        NEED(GPU->weight_create(GPU, &tw.t, 0, dim, &gw), name);
        float *oc = malloc(sizeof(float) * n * dim);
        NEED(ks_cpu_rmsnorm(CPU, oc, x, cw, n, dim, 1e-5f), name);
        float *dx = gpu_buf(x, (size_t)n * dim), *dout = gpu_buf(NULL, (size_t)n * dim);
        NEED(ks_cuda_dense_rmsnorm(GPU, dout, dx, gw, n, dim, 1e-5f), name);
        float *og = gpu_get(dout, (size_t)n * dim);
        double e = relerr(og, oc, (size_t)n * dim);
        result(e < 1e-6, name, "relerr %.2e", e);
        GPU->free(GPU, dx);
        GPU->free(GPU, dout);
        CPU->weight_free(CPU, cw);
        GPU->weight_free(GPU, gw);
        free(w); free(x); free(oc); free(og); free(tw.mem);
    }
}

static void test_rope(void) {
    if (!want("rope")) return;
    static float sf[64], lf[64];
    for (int i = 0; i < 64; i++) { sf[i] = 1.0f + 0.1f * i; lf[i] = 1.0f + 0.5f * i; }
    struct { ks_rope_type type; int hd; int n, H, maxp; } cases[] = {
        {KS_ROPE_DEFAULT, 8, 1, 4, 10}, {KS_ROPE_DEFAULT, 64, 37, 8, 5000}, {KS_ROPE_LINEAR, 128, 19, 4, 3000},
        {KS_ROPE_LLAMA3, 128, 65, 8, 131000}, {KS_ROPE_LONGROPE, 96, 9, 3, 2000}, {KS_ROPE_LONGROPE, 96, 9, 3, 100000},
        {KS_ROPE_DEFAULT, 64, 1500, 2, 5000}, /* more rows than positions by value: the uploaded positions */
    };
    const size_t last = sizeof cases / sizeof cases[0] - 1;
    for (size_t c = 0; c <= last; c++) {
        /* the last case (added in session 22) draws from its own copy of the generator, so the
         * tests after it see the inputs they saw before it was added (the e2e tiny models' greedy
         * comparisons are sensitive to their token ids: bench/NOTES.md, session 22) */
        const uint64_t seed_keep = g_seed;
        ks_rope r;
        memset(&r, 0, sizeof r);
        r.type = cases[c].type;
        r.head_dim = cases[c].hd;
        r.theta = cases[c].type == KS_ROPE_LLAMA3 ? 500000.0 : 10000.0;
        r.factor = cases[c].type == KS_ROPE_LINEAR ? 4.0 : 8.0;
        r.low_freq_factor = 1.0;
        r.high_freq_factor = 4.0;
        r.orig_max_pos = cases[c].type == KS_ROPE_LONGROPE ? 4096 : 8192;
        r.attn_factor = cases[c].type == KS_ROPE_LONGROPE ? 1.19 : 1.0;
        r.short_factor = sf;
        r.long_factor = lf;
        int n = cases[c].n, H = cases[c].H, d = cases[c].hd;
        char name[128];
        snprintf(name, sizeof name, "rope type=%d hd=%d n=%d heads=%d max_pos=%d", (int)r.type, d, n, H, cases[c].maxp);
        float *x = malloc(sizeof(float) * n * H * d);
        fill(x, (size_t)n * H * d, 2.0f);
        int32_t *pos = malloc(sizeof(int32_t) * n);
        for (int i = 0; i < n; i++) pos[i] = i == n - 1 ? cases[c].maxp : irand(cases[c].maxp + 1);
        float *dx = gpu_buf(x, (size_t)n * H * d);
        NEED(CPU->rope(CPU, x, n, H, pos, &r, cases[c].maxp), name);
        NEED(GPU->rope(GPU, dx, n, H, pos, &r, cases[c].maxp), name);
        float *og = gpu_get(dx, (size_t)n * H * d);
        double e = relerr(og, x, (size_t)n * H * d);
        /* cos/sin differ by an ulp or two between libm and CUDA at large angles */
        result(e < 2e-6, name, "relerr %.2e", e);
        GPU->free(GPU, dx);
        free(x); free(pos); free(og);
        if (c == last) g_seed = seed_keep;
    }
}

/* ================================================================ fused dense ops (ks_cuda_dense.h:
 * matmul_add, qkv, swiglu_proj; what attn_in, attn_out and mlp run with opts.fused): each against
 * the GPU's own composition of plain calls (same kernels' arithmetic: near-bitwise) and against
 * the CPU's composition (cpu_dense.h) */

/* The CPU backend's float32 weights point into the tensor's memory (as into a mapped file), so
 * that memory must outlive them: kept here and freed by keep_free() after the fused tests. */
static void *g_keep[512];
static int g_nkeep;
static void *keep(void *p) {
    if (g_nkeep < (int)(sizeof g_keep / sizeof g_keep[0])) g_keep[g_nkeep++] = p;
    return p;
}
static void keep_free(void) {
    while (g_nkeep) free(g_keep[--g_nkeep]);
}

static ks_weight *gw_make(ks_backend *be, const char *name, int rows, int cols, const float *vals) {
    tensor_buf t = make_tensor(name, cols ? "BF16" : "F32", cols ? 2 : 1, rows, cols, vals);
    ks_weight *w = NULL;
    if (be->weight_create(be, &t.t, 0, rows, &w)) fprintf(stderr, "weight %s: %s\n", name, ks_last_error());
    if (be == CPU) keep(t.mem);
    else free(t.mem);
    return w;
}
/* bf16-rounded copy (what the GPU stores) for the CPU reference */
static float *bf16_copy(const float *x, size_t n) {
    float *r = malloc(sizeof(float) * n);
    for (size_t i = 0; i < n; i++) r[i] = bf16r(x[i]);
    return r;
}

static void test_fused_qkv(int in, int H, int Hkv, int hd, int bias, int rope, int pos, int norm) {
    char name[160];
    snprintf(name, sizeof name, "qkv in=%d heads=%d/%d hd=%d%s%s%s pos=%d", in, H, Hkv, hd, bias ? " +bias" : "",
             rope ? " +rope" : "", norm ? " +norm" : "", pos);
    int QD = H * hd, KD = Hkv * hd, rows[3] = {QD, KD, KD};
    ks_rope r = kt_rope_llama3(hd);
    float *x = malloc(sizeof(float) * in), *nwh = malloc(sizeof(float) * in), *x_raw = malloc(sizeof(float) * in);
    fill(x, in, 1.0f);
    for (int i = 0; i < in; i++) nwh[i] = 1.0f + 0.2f * frand();
    memcpy(x_raw, x, sizeof(float) * in);
    ks_weight *gnw = gw_make(GPU, "norm", in, 0, nwh), *cnw = gw_make(CPU, "norm", in, 0, nwh);
    if (norm) NEED(ks_cpu_rmsnorm(CPU, x, x_raw, cnw, 1, in, 1e-5f), name); /* the CPU reference reads the normalised x */
    float *Wh[3], *Bh[3], *Wr[3];
    ks_weight *gw[3], *gb[3], *cw[3], *cb[3];
    float *yc[3], *dyf[3], *dyp[3];
    for (int i = 0; i < 3; i++) {
        Wh[i] = malloc(sizeof(float) * rows[i] * in);
        Bh[i] = malloc(sizeof(float) * rows[i]);
        fill(Wh[i], (size_t)rows[i] * in, 0.5f);
        fill(Bh[i], rows[i], 1.0f);
        Wr[i] = bf16_copy(Wh[i], (size_t)rows[i] * in);
        gw[i] = gw_make(GPU, "W", rows[i], in, Wh[i]);
        gb[i] = gw_make(GPU, "b", rows[i], 0, Bh[i]);
        tensor_buf tr = make_tensor("Wr", "F32", 2, rows[i], in, Wr[i]), tb = make_tensor("b", "F32", 1, rows[i], 0, Bh[i]);
        NEED(CPU->weight_create(CPU, &tr.t, 0, rows[i], &cw[i]), name);
        NEED(CPU->weight_create(CPU, &tb.t, 0, rows[i], &cb[i]), name);
        keep(tr.mem); /* the CPU weights point into it */
        keep(tb.mem);
        if (!gw[i] || !gb[i]) { result(0, name, "weight create failed"); return; }
        yc[i] = malloc(sizeof(float) * rows[i]);
        NEED(ks_cpu_matmul(CPU, yc[i], x, cw[i], bias ? cb[i] : NULL, 1, in, rows[i]), name);
        dyf[i] = gpu_buf(NULL, rows[i]);
        dyp[i] = gpu_buf(NULL, rows[i]);
    }
    int32_t p32 = pos;
    if (rope) {
        NEED(CPU->rope(CPU, yc[0], 1, H, &p32, &r, pos), name);
        NEED(CPU->rope(CPU, yc[1], 1, Hkv, &p32, &r, pos), name);
    }
    float *dx = gpu_buf(norm ? x_raw : x, in), *dxn = gpu_buf(NULL, in), *dxn2 = gpu_buf(NULL, in);
    /* fused */
    NEED(ks_cuda_dense_qkv(GPU, NULL, dyf[0], dyf[1], dyf[2], dx, norm ? gnw : NULL, 1e-5f, dxn, gw[0], gw[1], gw[2],
                         bias ? gb[0] : NULL, bias ? gb[1] : NULL, bias ? gb[2] : NULL, 1, in, H, Hkv, hd, &p32,
                         rope ? &r : NULL, pos),
         name);
    /* composed from plain calls */
    const float *xin = dx;
    if (norm) {
        NEED(ks_cuda_dense_rmsnorm(GPU, dxn2, dx, gnw, 1, in, 1e-5f), name);
        xin = dxn2;
    }
    for (int i = 0; i < 3; i++) NEED(ks_cuda_dense_matmul(GPU, dyp[i], xin, gw[i], bias ? gb[i] : NULL, 1, in, rows[i]), name);
    if (rope) {
        NEED(GPU->rope(GPU, dyp[0], 1, H, &p32, &r, pos), name);
        NEED(GPU->rope(GPU, dyp[1], 1, Hkv, &p32, &r, pos), name);
    }
    double e_self = 0, e_cpu = 0;
    for (int i = 0; i < 3; i++) {
        float *f = gpu_get(dyf[i], rows[i]), *pp = gpu_get(dyp[i], rows[i]);
        e_self = fmax(e_self, relerr(f, pp, rows[i]));
        e_cpu = fmax(e_cpu, relerr(f, yc[i], rows[i]));
        free(f);
        free(pp);
    }
    if (norm) { /* the normalised row written back equals ->rmsnorm's */
        float *a = gpu_get(dxn, in), *bb = gpu_get(dxn2, in);
        e_self = fmax(e_self, relerr(a, bb, in));
        free(a);
        free(bb);
    }
    result(e_self < 1e-6 && e_cpu < 1e-2, name, "relerr vs plain GPU calls %.2e, vs CPU %.2e", e_self, e_cpu);
    GPU->free(GPU, dx);
    GPU->free(GPU, dxn);
    GPU->free(GPU, dxn2);
    GPU->weight_free(GPU, gnw);
    CPU->weight_free(CPU, cnw);
    free(nwh);
    free(x_raw);
    for (int i = 0; i < 3; i++) {
        GPU->free(GPU, dyf[i]);
        GPU->free(GPU, dyp[i]);
        GPU->weight_free(GPU, gw[i]);
        GPU->weight_free(GPU, gb[i]);
        CPU->weight_free(CPU, cw[i]);
        CPU->weight_free(CPU, cb[i]);
        free(Wh[i]); free(Bh[i]); free(Wr[i]); free(yc[i]);
    }
    free(x);
}

/* qkv with a KV layer (the decode gemv storing the cache row) vs qkv without, then kv_append: the
 * same q, k, v and bit-identical caches (rows, positions, counts), over `steps` decode steps
 * after `prefill` rows in a cache of exactly that capacity (the first step grows it); with
 * uneven, heads keep different row counts (a per-head retain) before the steps. */
static void test_qkv_append(int in, int H, int Hkv, int hd, int prefill, int uneven, int steps) {
    char name[160];
    snprintf(name, sizeof name, "qkv + cache row in=%d heads=%d/%d hd=%d prefill=%d%s steps=%d", in, H, Hkv, hd,
             prefill, uneven ? " uneven" : "", steps);
    int QD = H * hd, KD = Hkv * hd, rows[3] = {QD, KD, KD};
    ks_rope r = kt_rope_llama3(hd);
    float *nwh = malloc(sizeof(float) * in), *xh = malloc(sizeof(float) * in);
    for (int i = 0; i < in; i++) nwh[i] = 1.0f + 0.2f * frand();
    ks_weight *gnw = gw_make(GPU, "norm", in, 0, nwh), *gw[3];
    for (int i = 0; i < 3; i++) {
        float *Wh = malloc(sizeof(float) * rows[i] * in);
        fill(Wh, (size_t)rows[i] * in, 0.5f);
        gw[i] = gw_make(GPU, "W", rows[i], in, Wh);
        free(Wh);
        if (!gw[i]) { result(0, name, "weight create failed"); return; }
    }
    ks_kv_layer L[2];
    memset(L, 0, sizeof L);
    float *pk = malloc(sizeof(float) * (size_t)(prefill > 0 ? prefill : 1) * KD), *pv = malloc(sizeof(float) * (size_t)(prefill > 0 ? prefill : 1) * KD);
    fill(pk, (size_t)(prefill > 0 ? prefill : 1) * KD, 1.0f);
    fill(pv, (size_t)(prefill > 0 ? prefill : 1) * KD, 1.0f);
    int32_t *ppos = malloc(sizeof(int32_t) * (prefill > 0 ? prefill : 1));
    for (int i = 0; i < prefill; i++) ppos[i] = i;
    float *dpk = gpu_buf(pk, (size_t)(prefill > 0 ? prefill : 1) * KD), *dpv = gpu_buf(pv, (size_t)(prefill > 0 ? prefill : 1) * KD);
    for (int j = 0; j < 2; j++) {
        L[j].n_kv_heads = Hkv;
        L[j].head_dim = hd;
        if (prefill > 0) {
            NEED(GPU->kv_alloc(GPU, &L[j], prefill), name);
            NEED(GPU->kv_append(GPU, &L[j], dpk, dpv, ppos, prefill), name);
        }
        if (uneven && prefill > Hkv) { /* head h keeps its first prefill - h rows */
            int32_t **idx = malloc(sizeof(int32_t *) * Hkv);
            int *cnt = malloc(sizeof(int) * Hkv);
            for (int h = 0; h < Hkv; h++) {
                cnt[h] = prefill - h;
                idx[h] = malloc(sizeof(int32_t) * cnt[h]);
                for (int t = 0; t < cnt[h]; t++) idx[h][t] = t;
            }
            NEED(GPU->kv_retain(GPU, &L[j], (const int32_t *const *)idx, cnt, 0), name);
            for (int h = 0; h < Hkv; h++) free(idx[h]);
            free(idx);
            free(cnt);
        }
    }
    float *dx = gpu_buf(NULL, in), *dxn = gpu_buf(NULL, in), *dy[2][3];
    for (int j = 0; j < 2; j++)
        for (int i = 0; i < 3; i++) dy[j][i] = gpu_buf(NULL, rows[i]);
    double e_out = 0;
    for (int st = 0; st < steps; st++) {
        int32_t pos = prefill + st;
        fill(xh, in, 1.0f);
        NEED(GPU->upload(GPU, dx, xh, sizeof(float) * in), name);
        NEED(ks_cuda_dense_qkv(GPU, &L[0], dy[0][0], dy[0][1], dy[0][2], dx, gnw, 1e-5f, dxn, gw[0], gw[1], gw[2],
                                    NULL, NULL, NULL, 1, in, H, Hkv, hd, &pos, &r, pos),
             name);
        NEED(ks_cuda_dense_qkv(GPU, NULL, dy[1][0], dy[1][1], dy[1][2], dx, gnw, 1e-5f, dxn, gw[0], gw[1], gw[2], NULL, NULL, NULL,
                             1, in, H, Hkv, hd, &pos, &r, pos),
             name);
        NEED(GPU->kv_append(GPU, &L[1], dy[1][1], dy[1][2], &pos, 1), name);
        for (int i = 0; i < 3; i++) {
            float *a = gpu_get(dy[0][i], rows[i]), *b = gpu_get(dy[1][i], rows[i]);
            e_out = fmax(e_out, relerr(a, b, rows[i]));
            free(a);
            free(b);
        }
    }
    /* the caches: counts, host positions, and each head's rows (bf16 keys, values) and device positions */
    int bad = 0;
    if (L[0].capacity != L[1].capacity) bad = 1;
    size_t rb = (size_t)hd * 2;
    for (int h = 0; h < Hkv && !bad; h++) {
        int n0 = L[0].n[h];
        if (n0 != L[1].n[h]) { bad = 2; break; }
        size_t off = (size_t)h * L[0].capacity;
        if (memcmp(L[0].pos + off, L[1].pos + off, sizeof(int32_t) * n0)) { bad = 3; break; }
        unsigned char *a = malloc(rb * n0 + 1), *b = malloc(rb * n0 + 1);
        for (int t = 0; t < 3 && !bad; t++) {
            const unsigned char *s0 = t == 0 ? L[0].k : t == 1 ? L[0].v : L[0].pos_dev;
            const unsigned char *s1 = t == 0 ? L[1].k : t == 1 ? L[1].v : L[1].pos_dev;
            size_t bytes = t < 2 ? rb * n0 : sizeof(int32_t) * n0, o = t < 2 ? off * rb : off * sizeof(int32_t);
            if (GPU->download(GPU, a, s0 + o, bytes) || GPU->download(GPU, b, s1 + o, bytes) || memcmp(a, b, bytes))
                bad = 4 + t;
        }
        free(a);
        free(b);
    }
    result(!bad && e_out == 0, name, "q/k/v relerr %.2e, cache %s (code %d)", e_out, bad ? "DIFFERS" : "identical", bad);
    for (int j = 0; j < 2; j++) {
        GPU->kv_free(GPU, &L[j]);
        for (int i = 0; i < 3; i++) GPU->free(GPU, dy[j][i]);
    }
    for (int i = 0; i < 3; i++) GPU->weight_free(GPU, gw[i]);
    GPU->weight_free(GPU, gnw);
    GPU->free(GPU, dx);
    GPU->free(GPU, dxn);
    GPU->free(GPU, dpk);
    GPU->free(GPU, dpv);
    free(pk);
    free(pv);
    free(ppos);
    free(nwh);
    free(xh);
}

static void test_fused_swiglu(int n, int in, int out, int norm) {
    char name[128];
    snprintf(name, sizeof name, "swiglu_proj n=%d in=%d out=%d%s", n, in, out, norm ? " +norm" : "");
    float *Wg = malloc(sizeof(float) * out * in), *Wu = malloc(sizeof(float) * out * in), *x = malloc(sizeof(float) * n * in);
    fill(Wg, (size_t)out * in, 0.5f);
    fill(Wu, (size_t)out * in, 0.5f);
    fill(x, (size_t)n * in, 1.0f);
    float *nwh = malloc(sizeof(float) * in), *x_raw = malloc(sizeof(float) * n * in);
    for (int i = 0; i < in; i++) nwh[i] = 1.0f + 0.2f * frand();
    memcpy(x_raw, x, sizeof(float) * n * in);
    ks_weight *gnw = gw_make(GPU, "norm", in, 0, nwh), *cnw = gw_make(CPU, "norm", in, 0, nwh);
    if (norm) NEED(ks_cpu_rmsnorm(CPU, x, x_raw, cnw, n, in, 1e-5f), name);
    ks_weight *gg = gw_make(GPU, "Wg", out, in, Wg), *gu = gw_make(GPU, "Wu", out, in, Wu);
    float *Wgr = bf16_copy(Wg, (size_t)out * in), *Wur = bf16_copy(Wu, (size_t)out * in);
    tensor_buf tg = make_tensor("Wg", "F32", 2, out, in, Wgr), tu = make_tensor("Wu", "F32", 2, out, in, Wur);
    ks_weight *cg, *cu;
    NEED(CPU->weight_create(CPU, &tg.t, 0, out, &cg), name);
    NEED(CPU->weight_create(CPU, &tu.t, 0, out, &cu), name);
    size_t no = (size_t)n * out;
    float *g = malloc(sizeof(float) * no), *u = malloc(sizeof(float) * no);
    NEED(ks_cpu_matmul(CPU, g, x, cg, NULL, n, in, out), name);
    NEED(ks_cpu_matmul(CPU, u, x, cu, NULL, n, in, out), name);
    NEED(ks_cpu_swiglu(CPU, g, g, u, no), name);
    float *dx = gpu_buf(norm ? x_raw : x, (size_t)n * in), *dy = gpu_buf(NULL, no), *dt = gpu_buf(NULL, no),
          *dg = gpu_buf(NULL, no), *du = gpu_buf(NULL, no), *dxn = gpu_buf(NULL, (size_t)n * in),
          *dxn2 = gpu_buf(NULL, (size_t)n * in);
    NEED(ks_cuda_dense_swiglu_proj(GPU, dy, dx, norm ? gnw : NULL, 1e-5f, dxn, gg, gu, dt, n, in, out), name);
    const float *xin = dx;
    if (norm) {
        NEED(ks_cuda_dense_rmsnorm(GPU, dxn2, dx, gnw, n, in, 1e-5f), name);
        xin = dxn2;
    }
    NEED(ks_cuda_dense_matmul(GPU, dg, xin, gg, NULL, n, in, out), name);
    NEED(ks_cuda_dense_matmul(GPU, du, xin, gu, NULL, n, in, out), name);
    NEED(ks_cuda_dense_swiglu(GPU, dg, dg, du, no), name);
    float *yf = gpu_get(dy, no), *yp = gpu_get(dg, no);
    double e_self = relerr(yf, yp, no), e_cpu = relerr(yf, g, no);
    if (norm) {
        float *a = gpu_get(dxn, (size_t)n * in), *bb = gpu_get(dxn2, (size_t)n * in);
        e_self = fmax(e_self, relerr(a, bb, (size_t)n * in));
        free(a);
        free(bb);
    }
    result(e_self < 1e-6 && e_cpu < 2e-2, name, "relerr vs plain GPU calls %.2e, vs CPU %.2e", e_self, e_cpu);
    float *bufs[] = {dx, dy, dt, dg, du, dxn, dxn2};
    for (int i = 0; i < 7; i++) GPU->free(GPU, bufs[i]);
    GPU->weight_free(GPU, gnw);
    CPU->weight_free(CPU, cnw);
    free(nwh);
    free(x_raw);
    GPU->weight_free(GPU, gg);
    GPU->weight_free(GPU, gu);
    CPU->weight_free(CPU, cg);
    CPU->weight_free(CPU, cu);
    free(Wg); free(Wu); free(x); free(Wgr); free(Wur); free(tg.mem); free(tu.mem); free(g); free(u); free(yf); free(yp);
}

static void test_fused_add(int n, int in, int out, int bias) {
    char name[128];
    snprintf(name, sizeof name, "matmul_add n=%d in=%d out=%d%s", n, in, out, bias ? " +bias" : "");
    float *W = malloc(sizeof(float) * out * in), *B = malloc(sizeof(float) * out), *x = malloc(sizeof(float) * n * in),
          *y0 = malloc(sizeof(float) * n * out);
    fill(W, (size_t)out * in, 0.5f);
    fill(B, out, 1.0f);
    fill(x, (size_t)n * in, 1.0f);
    fill(y0, (size_t)n * out, 3.0f);
    ks_weight *gw = gw_make(GPU, "W", out, in, W), *gb = gw_make(GPU, "b", out, 0, B);
    size_t no = (size_t)n * out;
    float *dx = gpu_buf(x, (size_t)n * in), *dy = gpu_buf(y0, no), *dp = gpu_buf(y0, no), *dt = gpu_buf(NULL, no);
    NEED(ks_cuda_dense_matmul_add(GPU, dy, dx, gw, bias ? gb : NULL, n, in, out), name);
    NEED(ks_cuda_dense_matmul(GPU, dt, dx, gw, bias ? gb : NULL, n, in, out), name);
    NEED(ks_cuda_dense_add(GPU, dp, dt, no), name);
    float *yf = gpu_get(dy, no), *yp = gpu_get(dp, no);
    double e = relerr(yf, yp, no);
    /* n = 1: the same rounding; cuBLAS with beta = 1 rounds once less */
    result(e < (n == 1 ? 1e-7 : 1e-5), name, "relerr vs matmul + add %.2e", e);
    GPU->free(GPU, dx); GPU->free(GPU, dy); GPU->free(GPU, dp); GPU->free(GPU, dt);
    GPU->weight_free(GPU, gw);
    GPU->weight_free(GPU, gb);
    free(W); free(B); free(x); free(y0); free(yf); free(yp);
}

static void test_fused(void) {
    if (!want("fused")) return;
    test_fused_qkv(256, 4, 2, 64, 0, 1, 1000, 0);
    test_fused_qkv(256, 4, 2, 64, 1, 1, 131000, 1);
    test_fused_qkv(256, 4, 2, 64, 1, 0, 7, 0);
    test_fused_qkv(256, 4, 2, 64, 0, 0, 7, 1);
    test_fused_qkv(96, 3, 1, 8, 1, 1, 3, 1);      /* small head_dim */
    test_fused_qkv(172, 2, 1, 64, 1, 1, 50, 1);   /* in % 8 != 0: the composed fallback */
    test_fused_qkv(8200, 2, 1, 64, 0, 1, 50, 1);  /* in > 8192: rmsnorm apart, then the fused gemv */
    test_qkv_append(256, 4, 2, 64, 0, 0, 3);     /* empty cache: the first step allocates */
    test_qkv_append(256, 4, 2, 64, 37, 0, 3);    /* capacity 37: the first step grows the cache */
    test_qkv_append(256, 8, 4, 64, 40, 1, 2);    /* per-head row counts differ */
    test_qkv_append(96, 3, 1, 8, 5, 0, 2);       /* small head_dim */
    test_qkv_append(172, 2, 1, 64, 5, 0, 2);     /* in % 8 != 0: qkv then kv_append */
    test_fused_swiglu(1, 256, 1000, 0);
    test_fused_swiglu(1, 256, 1000, 1);
    test_fused_swiglu(1, 172, 100, 1);            /* fallback */
    test_fused_swiglu(3, 256, 64, 1);             /* n > 1: fallback */
    test_fused_add(1, 256, 300, 1);
    test_fused_add(1, 256, 300, 0);
    test_fused_add(5, 256, 64, 1);                /* cuBLAS, beta = 1 */
    if (!g_quick) {
        test_fused_qkv(4096, 32, 8, 128, 0, 1, 131055, 1);
        test_fused_qkv(3584, 28, 4, 128, 1, 1, 9000, 1); /* qwen2-7B shape: biases */
        test_qkv_append(4096, 32, 8, 128, 300, 1, 3);    /* llama-3.1-8B shape */
        test_fused_swiglu(1, 4096, 14336, 1);
        test_fused_add(1, 14336, 4096, 0);
    }
    keep_free();
}

static void test_elementwise(void) {
    if (!want("elementwise")) return;
    size_t sizes[] = {1, 7, 4096, 100003, (size_t)3 << 20};
    for (int s = 0; s < 5; s++) {
        size_t n = sizes[s];
        char name[128];
        float *g = malloc(sizeof(float) * n), *u = malloc(sizeof(float) * n), *o = malloc(sizeof(float) * n);
        fill(g, n, 6.0f);
        fill(u, n, 2.0f);
        float *dg = gpu_buf(g, n), *du = gpu_buf(u, n), *dout = gpu_buf(NULL, n);
        snprintf(name, sizeof name, "swiglu n=%zu", n);
        NEED(ks_cpu_swiglu(CPU, o, g, u, n), name);
        NEED(ks_cuda_dense_swiglu(GPU, dout, dg, du, n), name);
        float *og = gpu_get(dout, n);
        double e = relerr(og, o, n);
        result(e < 1e-6, name, "relerr %.2e", e);
        free(og);
        snprintf(name, sizeof name, "swiglu in place (out = gate) n=%zu", n);
        NEED(ks_cuda_dense_swiglu(GPU, dg, dg, du, n), name);
        og = gpu_get(dg, n);
        e = relerr(og, o, n);
        result(e < 1e-6, name, "relerr %.2e", e);
        free(og);
        snprintf(name, sizeof name, "add n=%zu", n);
        GPU->upload(GPU, dg, g, n * sizeof(float));
        NEED(ks_cpu_add(CPU, g, u, n), name);
        NEED(ks_cuda_dense_add(GPU, dg, du, n), name);
        og = gpu_get(dg, n);
        e = relerr(og, g, n);
        result(e == 0, name, "relerr %.2e", e);
        free(og);
        /* unaligned sub-buffers (the engine passes row offsets) */
        if (n > 8) {
            snprintf(name, sizeof name, "add unaligned n=%zu", n - 3);
            NEED(ks_cpu_add(CPU, g + 1, u + 2, n - 3), name);
            NEED(ks_cuda_dense_add(GPU, dg + 1, du + 2, n - 3), name);
            og = gpu_get(dg, n);
            e = relerr(og, g, n);
            result(e == 0, name, "relerr %.2e", e);
            free(og);
        }
        GPU->free(GPU, dg);
        GPU->free(GPU, du);
        GPU->free(GPU, dout);
        free(g); free(u); free(o);
    }
}

static void test_gather(void) {
    if (!want("gather")) return;
    int shapes[][3] = {{10, 4, 8}, {1000, 333, 64}, {513, 512, 4096}, {7, 1, 3}};
    for (int s = 0; s < 4; s++) {
        int n = shapes[s][0], k = shapes[s][1], d = shapes[s][2];
        char name[128];
        float *x = malloc(sizeof(float) * n * d), *o = malloc(sizeof(float) * k * d);
        fill(x, (size_t)n * d, 1.0f);
        int32_t *idx = malloc(sizeof(int32_t) * k);
        for (int i = 0; i < k; i++) idx[i] = irand(n);
        float *dx = gpu_buf(x, (size_t)n * d), *dout = gpu_buf(NULL, (size_t)k * d);
        snprintf(name, sizeof name, "gather_rows n=%d k=%d d=%d", n, k, d);
        NEED(CPU->gather_rows(CPU, o, x, idx, k, d), name);
        NEED(GPU->gather_rows(GPU, dout, dx, idx, k, d), name);
        float *og = gpu_get(dout, (size_t)k * d);
        double e = relerr(og, o, (size_t)k * d);
        result(e == 0, name, "relerr %.2e", e);
        free(og);
        /* in place with ascending indices, as the engine's propagate does */
        for (int i = 0, j = 0; i < k; i++) { j += 1 + irand(KS_MAX(1, (n - j) / (k - i + 1))); idx[i] = KS_MIN(j - 1, n - k + i); }
        for (int i = 1; i < k; i++) if (idx[i] <= idx[i - 1]) idx[i] = idx[i - 1] + 1;
        snprintf(name, sizeof name, "gather_rows in place n=%d k=%d d=%d", n, k, d);
        NEED(CPU->gather_rows(CPU, x, x, idx, k, d), name);
        NEED(GPU->gather_rows(GPU, dx, dx, idx, k, d), name);
        og = gpu_get(dx, (size_t)k * d);
        e = relerr(og, x, (size_t)k * d);
        result(e == 0, name, "relerr %.2e", e);
        free(og);
        GPU->free(GPU, dx);
        GPU->free(GPU, dout);
        free(x); free(o); free(idx);
    }
}

/* ================================================================ KV cache and attention */

typedef struct kv_pair { ks_kv_layer c, g; } kv_pair;

static void kv_init(kv_pair *p, int Hkv, int d) {
    memset(p, 0, sizeof *p);
    p->c.n_kv_heads = p->g.n_kv_heads = Hkv;
    p->c.head_dim = p->g.head_dim = d;
}
static void kv_done(kv_pair *p) {
    CPU->kv_free(CPU, &p->c);
    GPU->kv_free(GPU, &p->g);
}

/* append n rows at positions pos to both caches (bf16-rounded values for the CPU) */
static ks_status kv_append_both(kv_pair *p, int n, const int32_t *pos) {
    int Hkv = p->c.n_kv_heads, d = p->c.head_dim;
    size_t m = (size_t)n * Hkv * d;
    float *k = calloc(m + 1, sizeof(float)), *v = calloc(m + 1, sizeof(float));
    fill(k, m, 1.0f);
    fill(v, m, 1.0f);
    float *dk = gpu_buf(k, m), *dv = gpu_buf(v, m);
    round_bf16(k, m);
    round_bf16(v, m);
    ks_status st = CPU->kv_append(CPU, &p->c, k, v, pos, n);
    if (!st) st = GPU->kv_append(GPU, &p->g, dk, dv, pos, n);
    GPU->free(GPU, dk);
    GPU->free(GPU, dv);
    free(k);
    free(v);
    return st;
}

/* the GPU cache (downloaded) equals the CPU cache: rows, positions host and device */
static int kv_same(const kv_pair *p, char *why, size_t wn) {
    const ks_kv_layer *C = &p->c, *G = &p->g;
    int Hkv = C->n_kv_heads, d = C->head_dim;
    size_t rows = (size_t)Hkv * G->capacity;
    uint16_t *k = malloc(rows * d * 2), *v = malloc(rows * d * 2);
    int32_t *pd = malloc(rows * 4);
    int ok = GPU->download(GPU, k, G->k, rows * d * 2) == KS_OK && GPU->download(GPU, v, G->v, rows * d * 2) == KS_OK &&
             GPU->download(GPU, pd, G->pos_dev, rows * 4) == KS_OK;
    if (!ok) snprintf(why, wn, "download failed: %s", ks_last_error());
    for (int h = 0; ok && h < Hkv; h++) {
        if (C->n[h] != G->n[h]) { snprintf(why, wn, "head %d: %d rows vs %d", h, G->n[h], C->n[h]); ok = 0; break; }
        for (int i = 0; ok && i < C->n[h]; i++) {
            int32_t pc = C->pos[(size_t)h * C->capacity + i];
            if (G->pos[(size_t)h * G->capacity + i] != pc || pd[(size_t)h * G->capacity + i] != pc) {
                snprintf(why, wn, "head %d row %d: position %d/%d vs %d", h, i, G->pos[(size_t)h * G->capacity + i],
                         pd[(size_t)h * G->capacity + i], pc);
                ok = 0;
            }
            for (int c = 0; ok && c < d; c++) {
                float kc = ((float *)C->k)[((size_t)h * C->capacity + i) * d + c];
                float vc = ((float *)C->v)[((size_t)h * C->capacity + i) * d + c];
                if (ks_bf16_to_f32(k[((size_t)h * G->capacity + i) * d + c]) != kc ||
                    ks_bf16_to_f32(v[((size_t)h * G->capacity + i) * d + c]) != vc) {
                    snprintf(why, wn, "head %d row %d col %d differs", h, i, c);
                    ok = 0;
                }
            }
        }
    }
    free(k); free(v); free(pd);
    if (ok) snprintf(why, wn, "capacity %d", G->capacity);
    return ok;
}

/* retain a random ascending subset of each head (different counts per head) on both */
static ks_status kv_retain_both(kv_pair *p, int shrink, int shared) {
    int Hkv = p->c.n_kv_heads;
    int32_t **idx = calloc(Hkv, sizeof *idx);
    int *cnt = calloc(Hkv, sizeof *cnt);
    int nmin = p->c.n[0];
    for (int h = 1; h < Hkv; h++) nmin = KS_MIN(nmin, p->c.n[h]);
    for (int h = 0; h < Hkv; h++) {
        int n = shared ? nmin : p->c.n[h]; /* a shared list must fit every head */
        idx[h] = malloc(sizeof(int32_t) * (n ? n : 1));
        int keep = shared && h ? cnt[0] : 0;
        if (shared && h) memcpy(idx[h], idx[0], sizeof(int32_t) * keep);
        else {
            int frac = 2 + irand(4); /* keep about 1/frac, at least 1 */
            for (int i = 0; i < n; i++)
                if (i == n - 1 || irand(frac) == 0) idx[h][keep++] = i;
        }
        cnt[h] = keep;
    }
    ks_status st = CPU->kv_retain(CPU, &p->c, (const int32_t *const *)idx, cnt, shrink);
    if (!st) st = GPU->kv_retain(GPU, &p->g, (const int32_t *const *)idx, cnt, shrink);
    for (int h = 0; h < Hkv; h++) free(idx[h]);
    free(idx);
    free(cnt);
    return st;
}

/* ks_cuda_put (host bytes as a kernel argument, three argument sizes, 16-byte stores where the
 * destination is aligned): every size class edge, aligned and not, the bytes around untouched,
 * and a size over the limit refused. */
static void test_put(void) {
    if (!want("put")) return;
    const int sizes[] = {1, 17, 511, 512, 513, 4095, 4096, 4097, 20000, KS_CUDA_PUT_MAX};
    const size_t cap = KS_CUDA_PUT_MAX + 64;
    unsigned char *src = malloc(cap), *got = malloc(cap), *want_b = malloc(cap);
    unsigned char *d = NULL;
    if (cudaMalloc((void **)&d, cap) != cudaSuccess) { result(0, "put", "cudaMalloc failed"); free(src); free(got); free(want_b); return; }
    cudaStream_t s = ks_cuda_backend_stream(GPU);
    for (size_t i = 0; i < cap; i++) src[i] = (unsigned char)(i * 131 + 7);
    for (int off = 0; off <= 3; off += 3)
        for (size_t c = 0; c < sizeof sizes / sizeof sizes[0]; c++) {
            const int n = sizes[c];
            char name[96];
            snprintf(name, sizeof name, "put %d bytes at offset %d", n, off);
            memset(want_b, 0xa5, cap);
            memcpy(want_b + off, src, (size_t)n);
            ks_status st = cudaMemset(d, 0xa5, cap) ? KS_ERR_DEVICE : ks_cuda_put(s, d + off, src, (size_t)n, 0);
            memset(src, 0, 4); /* the caller may reuse src at once */
            if (!st && (cudaStreamSynchronize(s) || cudaMemcpy(got, d, cap, cudaMemcpyDeviceToHost))) st = KS_ERR_DEVICE;
            for (size_t i = 0; i < 4; i++) src[i] = (unsigned char)(i * 131 + 7);
            result(!st && !memcmp(got, want_b, cap), name, "%s", st ? ks_last_error() : "bytes and surroundings as expected");
        }
    ks_status st = ks_cuda_put(s, d, src, (size_t)KS_CUDA_PUT_MAX + 1, 0);
    result(st == KS_ERR_INTERNAL && strstr(ks_last_error(), "put"), "put over the limit refused", "%s", ks_last_error());
    cudaFree(d);
    free(src), free(got), free(want_b);
}

static void test_kv(void) {
    if (!want("kv")) return;
    int cfg[][2] = {{1, 8}, {2, 64}, {8, 128}, {3, 96}, {2, 12}};
    for (int c = 0; c < 5; c++) {
        int Hkv = cfg[c][0], d = cfg[c][1];
        char name[128], why[256];
        kv_pair p;
        kv_init(&p, Hkv, d);
        int n1 = 37 + irand(100), total = 0;
        int32_t *pos = malloc(sizeof(int32_t) * 4096);
        for (int i = 0; i < 4096; i++) pos[i] = i;
        snprintf(name, sizeof name, "kv_append Hkv=%d d=%d n=%d", Hkv, d, n1);
        NEED(kv_append_both(&p, n1, pos), name);
        total += n1;
        result(kv_same(&p, why, sizeof why), name, "%s", why);
        for (int s = 0; s < 5; s++) { /* decode-like single appends */
            NEED(kv_append_both(&p, 1, pos + total), name);
            total++;
        }
        snprintf(name, sizeof name, "kv_append x5 single rows Hkv=%d d=%d", Hkv, d);
        result(kv_same(&p, why, sizeof why), name, "%s", why);
        snprintf(name, sizeof name, "kv_retain per head, no shrink Hkv=%d d=%d", Hkv, d);
        NEED(kv_retain_both(&p, 0, 0), name);
        result(kv_same(&p, why, sizeof why), name, "%s", why);
        NEED(kv_append_both(&p, 300, pos + total), name);
        total += 300;
        snprintf(name, sizeof name, "kv_append after retain Hkv=%d d=%d", Hkv, d);
        result(kv_same(&p, why, sizeof why), name, "%s", why);
        int cap0 = p.g.capacity;
        snprintf(name, sizeof name, "kv_retain shrink Hkv=%d d=%d", Hkv, d);
        NEED(kv_retain_both(&p, 1, c & 1), name);
        int ok = kv_same(&p, why, sizeof why);
        int maxn = 0;
        for (int h = 0; h < Hkv; h++) maxn = KS_MAX(maxn, p.g.n[h]);
        result(ok && (maxn >= cap0 / 2 || p.g.capacity == maxn), name, "%s (was %d, max rows %d)", why, cap0, maxn);
        NEED(kv_append_both(&p, 3, pos + total), name);
        snprintf(name, sizeof name, "kv_append after shrink Hkv=%d d=%d", Hkv, d);
        result(kv_same(&p, why, sizeof why), name, "%s", why);
        kv_done(&p);
        result(p.g.k == NULL && p.g.n == NULL && p.g.capacity == 0, "kv_free clears the layer", "ok");
        free(pos);
    }
}

/* One attention comparison. path: 1 = float32 split-KV kernel, 2 = flash (variant 1-3),
 * 3 = tensor-core decode. */
typedef struct attn_case {
    int n, ctx, H, Hkv, d;   /* query rows; rows already in the cache before them */
    int window;
    int idx;                 /* 1 = index lists, 2 = with renumbering */
    int retain;              /* per-head retention before attending (rows differ per head) */
    float qscale;            /* 1 = soft, larger = peaky attention */
    int gaps;                /* positions with gaps and a shared offset */
    int rope;                /* q and K pre-RoPE: attention rotates them (TokenSelect) */
} attn_case;

/* path: ks_cuda_attn_path; mma: on GPU_MMA (the mma.sync prefill kernel) instead of GPU */
static void run_attn(const attn_case *ac, ks_cuda_attn_path path, int mma) {
    char name[200];
    char tag[32];
    snprintf(tag, sizeof tag, "%s", path == KS_CUDA_ATTN_SPLITKV ? "splitkv" : path == KS_CUDA_ATTN_TC ? "tc-decode"
                                    : mma ? "flash-mma" : "flash");
    ks_backend *G = mma ? GPU_MMA : GPU;
    int n = ac->n, H = ac->H, Hkv = ac->Hkv, d = ac->d;
    snprintf(name, sizeof name, "attention[%s] n=%d ctx=%d H=%d/%d d=%d%s%s%s%s%s%s", tag, n,
             ac->ctx, H, Hkv, d, ac->window ? " window" : "", ac->idx == 1 ? " idx" : ac->idx == 2 ? " idx+renum" : "",
             ac->retain ? " retained" : "", ac->qscale > 1 ? " peaky" : "", ac->gaps ? " gaps" : "",
             ac->rope ? " pre-rope" : "");
    kv_pair p;
    kv_init(&p, Hkv, d);
    int total = ac->ctx + n;
    int32_t *pos = malloc(sizeof(int32_t) * total);
    for (int i = 0, cur = ac->gaps ? 1000 : 0; i < total; i++) { pos[i] = cur; cur += ac->gaps ? 1 + irand(3) : 1; }
    if (ac->ctx) NEED(kv_append_both(&p, ac->ctx, pos), name);
    if (ac->retain && ac->ctx) NEED(kv_retain_both(&p, 0, 0), name);
    NEED(kv_append_both(&p, n, pos + ac->ctx), name);
    float *q = malloc(sizeof(float) * n * H * d);
    fill(q, (size_t)n * H * d, ac->qscale);
    if (path != KS_CUDA_ATTN_SPLITKV && !ac->rope) round_bf16(q, (size_t)n * H * d); /* the mma kernels read q in bf16 */
    ks_attn_args a = {.n = n, .n_heads = H, .qpos = pos + ac->ctx, .scale = 1.0f / sqrtf((float)d), .window = ac->window};
    ks_rope rope;
    memset(&rope, 0, sizeof rope);
    rope.type = KS_ROPE_DEFAULT;
    rope.head_dim = d;
    rope.theta = 10000.0;
    rope.attn_factor = 1.0;
    if (ac->rope) {
        a.rope = &rope;
        a.rope_max_pos = pos[total - 1];
    }
    int32_t **idx = NULL;
    int *nidx = NULL;
    if (ac->idx) {
        idx = calloc(Hkv, sizeof *idx);
        nidx = calloc(Hkv, sizeof *nidx);
        for (int h = 0; h < Hkv; h++) {
            int rows = p.c.n[h], k = 0;
            idx[h] = malloc(sizeof(int32_t) * rows);
            for (int i = 0; i < rows; i++)
                if (i < 2 || i >= rows - 3 || irand(3) == 0) idx[h][k++] = i;
            nidx[h] = k;
        }
        a.idx = (const int32_t *const *)idx;
        a.n_idx = nidx;
        a.renumber = ac->idx == 2; /* keys at 0..k-1, queries at k - n + i (per KV head) */
    }
    float *oc = malloc(sizeof(float) * n * H * d);
    NEED(CPU->attention(CPU, oc, q, &p.c, &a), name);
    float *dq = gpu_buf(q, (size_t)n * H * d), *dout = gpu_buf(NULL, (size_t)n * H * d);
    ks_cuda_backend_set_attn_path(G, path);
    /* GPU_MMA reads GPU's buffers (one device): GPU's stream has finished writing them first */
    ks_status st = G != GPU ? GPU->sync(GPU) : KS_OK;
    if (!st) st = G->attention(G, dout, dq, &p.g, &a);
    if (!st) st = G->sync(G);
    ks_cuda_backend_set_attn_path(G, KS_CUDA_ATTN_AUTO);
    NEED(st, name);
    float *og = gpu_get(dout, (size_t)n * H * d);
    if (idx) { /* the same lists in device memory (ks_attn_args.idx_dev, issue 14): read in place, the same output */
        size_t tot = 0;
        for (int h = 0; h < Hkv; h++) tot += nidx[h];
        int32_t *cat = malloc(sizeof(int32_t) * tot), **dptr = calloc(Hkv, sizeof *dptr);
        for (int h = 0, o = 0; h < Hkv; o += nidx[h], h++) memcpy(cat + o, idx[h], sizeof(int32_t) * nidx[h]);
        int32_t *dl = gpu_ibuf(cat, tot);
        for (int h = 0, o = 0; h < Hkv; o += nidx[h], h++) dptr[h] = dl + o;
        ks_attn_args ad = a;
        ad.idx = (const int32_t *const *)dptr;
        ad.idx_dev = 1;
        ks_cuda_backend_set_attn_path(G, path);
        st = G != GPU ? GPU->sync(GPU) : KS_OK;
        if (!st) st = G->attention(G, dout, dq, &p.g, &ad);
        if (!st) st = G->sync(G);
        ks_cuda_backend_set_attn_path(G, KS_CUDA_ATTN_AUTO);
        char dname[220];
        snprintf(dname, sizeof dname, "%s device lists", name);
        float *od = st ? NULL : gpu_get(dout, (size_t)n * H * d);
        result(!st && !memcmp(od, og, sizeof(float) * n * H * d), dname, "%s",
               st ? ks_last_error() : "bit-identical to host lists: no");
        free(od);
        GPU->free(GPU, dl);
        free(cat);
        free(dptr);
    }
    double e = relerr(og, oc, (size_t)n * H * d), er = row_relerr(og, oc, (size_t)n * H, d);
    /* split-KV: float32 math on the same bf16 K/V (rotated keys kept in float32) -> float
     * rounding only; flash and tensor-core decode: Q, P (and rotated K) in bf16 -> ~3e-3 */
    double tol = path == KS_CUDA_ATTN_SPLITKV ? 1e-5 : 1e-2, rtol = path == KS_CUDA_ATTN_SPLITKV ? 1e-4 : 3e-2;
    result(e < tol && er < rtol, name, "relerr %.2e (worst row %.2e)", e, er);
    if (idx) {
        for (int h = 0; h < Hkv; h++) free(idx[h]);
        free(idx);
        free(nidx);
    }
    GPU->free(GPU, dq);
    GPU->free(GPU, dout);
    kv_done(&p);
    free(pos); free(q); free(oc); free(og);
}

/* check_idx (backend.h, kernels/check_idx.cu) against the CPU backend's: random ascending lists
 * with one injected fault (or none) at a random place, the same word and the same lists after
 * (out-of-range entries replaced by 0). */
static void test_check_idx(void) {
    if (!want("check_idx")) return;
    for (int t = 0; t < (g_quick ? 12 : 60); t++) {
        int rows = 1 + irand(8), k = 1 + irand(t % 3 == 0 ? 5000 : 300), lim[8];
        size_t nw = (size_t)rows * k;
        int32_t *x = malloc(sizeof(int32_t) * nw);
        for (int r = 0; r < rows; r++) {
            int v = irand(3);
            for (int i = 0; i < k; i++) { x[(size_t)r * k + i] = v; v += 1 + irand(3); }
            lim[r] = v + irand(2) - 1 > 0 ? v + irand(2) - 1 : 1; /* the last entry sometimes out of range */
        }
        int fault = t % 5; /* 0 none, 1 out of range, 2 unsorted, 3 duplicate, 4 negative */
        size_t at = nw > 1 ? 1 + (size_t)irand((int)nw - 1) : 0;
        if (fault == 1) x[at] = lim[at / k] + irand(100);
        if (fault == 2 && at % k) x[at] = x[at - 1] - 1;
        if (fault == 3 && at % k) x[at] = x[at - 1];
        if (fault == 4) x[at] = -1 - irand(100);
        char name[120];
        snprintf(name, sizeof name, "check_idx rows=%d k=%d fault=%d", rows, k, fault);
        int32_t *dx = gpu_ibuf(x, nw);
        uint64_t *dslot = (uint64_t *)gpu_ibuf(NULL, 2), wc = 0, wg = 0;
        NEED(CPU->check_idx(CPU, x, rows, k, lim, &wc), name);
        NEED(GPU->check_idx(GPU, dx, rows, k, lim, dslot), name);
        NEED(GPU->download(GPU, &wg, dslot, 8), name);
        int32_t *xg = (int32_t *)gpu_get((float *)dx, nw);
        result(wg == wc && !memcmp(xg, x, sizeof(int32_t) * nw), name, "word %llx (cpu %llx)%s", (unsigned long long)wg,
               (unsigned long long)wc, memcmp(xg, x, sizeof(int32_t) * nw) ? ", lists differ" : "");
        GPU->free(GPU, dx);
        GPU->free(GPU, dslot);
        free(x);
        free(xg);
    }
}

static void test_attention(void) {
    if (!want("attention")) return;
    attn_case cases[] = {
        /* decode */
        {1, 0, 4, 4, 64, 0, 0, 0, 1, 0, 0},
        {1, 100, 8, 2, 8, 0, 0, 0, 1, 0, 0},
        {1, 1000, 32, 8, 128, 0, 0, 0, 1, 0, 0},
        {1, 4097, 32, 4, 128, 0, 0, 0, 4, 0, 0},
        {1, 3000, 8, 1, 64, 0, 0, 0, 1, 1, 0},
        {1, 777, 28, 4, 128, 300, 0, 0, 1, 0, 0},
        {1, 2000, 32, 8, 128, 0, 1, 0, 1, 0, 0},
        {1, 2000, 32, 8, 128, 0, 2, 0, 1, 0, 0},
        {1, 1500, 16, 4, 64, 0, 0, 1, 4, 0, 0},
        {1, 1500, 16, 4, 64, 0, 1, 1, 1, 0, 0},
        {1, 500, 24, 8, 96, 0, 0, 0, 1, 0, 0},
        {1, 300, 32, 1, 128, 0, 0, 0, 1, 0, 0},
        {3, 200, 8, 8, 64, 0, 2, 0, 1, 0, 0},
        {4, 1000, 16, 4, 128, 0, 0, 0, 1, 0, 0}, /* decode-like n > 1 with a full m16 tile */
        {2, 700, 16, 2, 64, 0, 1, 0, 4, 1, 0},
        {1, 300, 8, 2, 20, 0, 0, 1, 1, 0, 0},  /* head_dim not a multiple of 8: scalar path */
        {1, 257, 6, 3, 12, 0, 1, 0, 1, 0, 0},
        /* prefill */
        {1, 0, 8, 8, 128, 0, 0, 0, 1, 0, 0},
        {7, 0, 4, 1, 64, 0, 0, 0, 1, 0, 0},
        {64, 0, 8, 2, 128, 0, 0, 0, 1, 0, 0},
        {65, 0, 8, 8, 64, 0, 0, 0, 4, 0, 0},
        {129, 0, 16, 4, 128, 0, 0, 0, 1, 0, 0},
        {300, 0, 32, 8, 128, 0, 0, 0, 4, 0, 0},
        {300, 0, 8, 8, 64, 100, 0, 0, 1, 0, 0},
        {257, 100, 8, 2, 128, 0, 0, 0, 1, 0, 0},
        {200, 333, 8, 1, 64, 0, 0, 1, 1, 0, 0},
        {500, 0, 4, 4, 128, 0, 0, 0, 1, 1, 0},
        {333, 50, 12, 4, 96, 0, 0, 0, 1, 0, 0},
        {100, 0, 4, 2, 8, 0, 0, 0, 1, 0, 0},
        {50, 0, 4, 2, 12, 5, 0, 0, 1, 0, 0},
        {1024, 0, 8, 1, 128, 0, 0, 0, 1, 0, 0},
        {2000, 0, 8, 8, 64, 257, 0, 0, 4, 0, 0},
        /* pre-RoPE (TokenSelect), attend lists in prefill */
        {1, 500, 8, 2, 128, 0, 0, 0, 1, 0, 1},
        {1, 800, 16, 4, 64, 0, 2, 0, 1, 1, 1},
        {1, 300, 8, 8, 64, 0, 1, 1, 1, 0, 1},
        {100, 50, 8, 2, 128, 0, 0, 0, 1, 0, 1},
        {70, 300, 8, 4, 64, 0, 2, 0, 1, 0, 1},
        {130, 200, 8, 4, 64, 0, 1, 0, 1, 0, 0},
        {90, 100, 8, 8, 128, 0, 2, 0, 4, 0, 0},
        {65, 40, 6, 3, 96, 0, 2, 0, 1, 0, 1},
    };
    int nc = (int)(sizeof cases / sizeof cases[0]);
    for (int c = 0; c < nc; c++) {
        if (g_quick && (cases[c].n * (cases[c].n + cases[c].ctx) > 300000 || cases[c].ctx > 2000)) continue;
        run_attn(&cases[c], KS_CUDA_ATTN_SPLITKV, 0);
        if (cases[c].d == 64 || cases[c].d == 128) {
            /* the prefill kernels (gathered rows with idx / pre-RoPE): the planner's on GPU, and
             * without --quick the mma.sync kernel on GPU_MMA before and after it */
            for (int v = 1; v <= 3; v++)
                if (v == 2 || !g_quick) run_attn(&cases[c], KS_CUDA_ATTN_FLASH, v != 2);
            if (cases[c].n * (cases[c].H / cases[c].Hkv) <= 16) run_attn(&cases[c], KS_CUDA_ATTN_TC, 0);
        }
    }
}

static void test_oom(void) {
    if (!want("oom") || g_quick) return; /* --quick (compute-sanitizer) skips it: the sanitizer reports the intended OOMs */
    void *p = GPU->alloc(GPU, (size_t)1 << 50);
    ks_status st = p ? KS_OK : KS_ERR_OOM;
    result(p == NULL && strstr(ks_last_error(), "out of device memory") != NULL, "alloc of 1 PiB fails with a clear error",
           "%s: %s", ks_status_name(st), ks_last_error());
    kv_pair kp;
    kv_init(&kp, 64, 128);
    float dummy[1] = {0};
    int32_t pos = 0;
    st = GPU->kv_append(GPU, &kp.g, dummy, dummy, &pos, 1 << 24);
    result(st == KS_ERR_OOM, "KV cache too large for the GPU is KS_ERR_OOM", "%s: %s", ks_status_name(st), ks_last_error());
    GPU->kv_free(GPU, &kp.g);
    float *d = gpu_buf(dummy, 1);
    st = GPU->sync(GPU);
    result(st == KS_OK && d != NULL, "the backend works after an OOM", "%s", st ? ks_last_error() : "");
    GPU->free(GPU, d);
}

/* ================================================================ end to end */

typedef struct pol_state { int layer; } pol_state;

/* A C policy exercising retain (prefill and decode) and attend with renumbering. */
static ks_status pol_layer_end(void *ud, ks_event *ev) {
    if (ev->layer != 0 || ev->n < 8) return KS_OK;
    int n = ev->kv->n[0], k = 0;
    int32_t *idx = malloc(sizeof(int32_t) * n);
    for (int i = 0; i < n; i++)
        if (i % 3 != 1 || i >= n - 4) idx[k++] = i;
    ks_status st = ks_action_retain(ev, idx, k);
    free(idx);
    return st;
}
static ks_status pol_decode(void *ud, ks_event *ev) {
    int H = ev->n_kv_heads;
    int32_t **l = calloc(H, sizeof *l);
    int *cnt = calloc(H, sizeof *cnt);
    for (int h = 0; h < H; h++) {
        int n = ev->kv->n[h];
        l[h] = malloc(sizeof(int32_t) * n);
        for (int i = 0; i < n; i++)
            if ((i + h) % 2 == 0 || i >= n - 2 || i < 1) l[h][cnt[h]++] = i;
    }
    ks_status st = ev->layer % 2 ? ks_action_attend_heads(ev, (const int32_t *const *)l, cnt, 1)
                                 : ks_action_attend_heads(ev, (const int32_t *const *)l, cnt, 0);
    for (int h = 0; h < H; h++) free(l[h]);
    free(l);
    free(cnt);
    return st;
}

/* cpu's logits favour a over b by less than 3x the rms difference between the backends */
static int near_tie(const float *cpu, const float *gpu, int V, int a, int b) {
    double ss = 0;
    for (int i = 0; i < V; i++) ss += ((double)gpu[i] - cpu[i]) * ((double)gpu[i] - cpu[i]);
    return (double)cpu[a] - cpu[b] <= 3.0 * sqrt(ss / V) + 1e-6;
}

static int argmax(const float *x, int n) {
    int b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

/* ks_session_decode_greedy on the GPU: the argmax on the device gives the ids that ks_sample
 * gives on the downloaded logits (two sessions of one model, the same steps), the logits stay on
 * the device (logits_stale) until asked where the backend records graphs (its decode buffers
 * outlive the step; --no-graphs: they are downloaded every step), and then are the plain run's,
 * bit for bit. */
static void greedy_on_device(const char *dir, const int32_t *ids, int n, int steps) {
    const char *name = "e2e stories260K: greedy on the device (ks_session_decode_greedy)";
    ks_model *m = NULL;
    ks_session *sa = NULL, *sb = NULL;
    ks_status st = ks_model_load(dir, GPU, 0, &m);
    if (!st) st = ks_session_create(m, &sa);
    if (!st) st = ks_session_create(m, &sb);
    if (!st) st = ks_session_prefill(sa, ids, n);
    if (!st) st = ks_session_prefill(sb, ids, n);
    int same = 1, stale = 1, V = m ? m->cfg.vocab : 0;
    const int kept = m && m->be->graph_begin != NULL; /* the logits may stay on the device */
    ks_sampler g;
    ks_sampler_init(&g, 0, 1, 0);
    int32_t ta = st ? 0 : ks_sample(&g, sa->logits, V), tb = ta;
    for (int t = 0; !st && t < steps; t++) {
        if ((st = ks_session_decode(sa, ta)) || (st = ks_session_decode_greedy(sb, tb, &tb))) break;
        ta = ks_sample(&g, sa->logits, V);
        same = same && ta == tb;
        stale = stale && sb->logits_stale == kept;
    }
    const float *lg = NULL;
    int nv = 0;
    if (!st) st = ks_session_logits(sb, &lg, &nv);
    if (st) result(0, name, "%s: %s", ks_status_name(st), ks_last_error());
    else
        result(same && stale && nv == V && !memcmp(lg, sa->logits, sizeof(float) * V) && !sb->logits_stale, name,
               "ids %s over %d steps, logits %s %s, then filled %s", same ? "equal" : "DIFFER", steps,
               kept ? "left on the device" : "downloaded (no graphs)", stale ? "every step" : "NOT every step", lg && !memcmp(lg, sa->logits, sizeof(float) * V) ? "bit-equal" : "DIFFERENT");
    ks_session_free(sa);
    ks_session_free(sb);
    ks_model_free(m);
}

/* Prefill `ids` on both backends, compare logits; then greedy-decode `steps` tokens on each
 * (each backend following its own argmax) and report agreement. */
/* seed 0: load the folder's checkpoint; else random weights (ks_model_random) for its config.
 * tol: bound on the logits' relative error (bf16 weights, activations and KV cache). */
static void e2e(const char *label, const char *dir, uint64_t seed, double tol, const int32_t *ids, int n, int steps,
                int use_policy) {
    char name[200];
    ks_model *mc = NULL, *mg = NULL;
    ks_session *sc = NULL, *sg = NULL;
    snprintf(name, sizeof name, "e2e %s: load on both backends", label);
    ks_status st = seed ? ks_model_random(dir, CPU, seed, &mc) : ks_model_load(dir, CPU, 0, &mc);
    if (!st) st = seed ? ks_model_random(dir, GPU, seed, &mg) : ks_model_load(dir, GPU, 0, &mg);
    if (!st) st = ks_session_create(mc, &sc);
    if (!st) st = ks_session_create(mg, &sg);
    if (st) {
        result(0, name, "%s: %s", ks_status_name(st), ks_last_error());
        goto out;
    }
    ks_policy pol;
    memset(&pol, 0, sizeof pol);
    pol.name = "test-retain-attend";
    pol.on[KS_EV_PREFILL_LAYER_END] = pol_layer_end;
    pol.on[KS_EV_DECODE_QKV] = pol_decode;
    pol.want_pre_rope_keys = use_policy == 2; /* keys cached before RoPE; attention rotates */
    if (use_policy) { sc->policy = &pol; sg->policy = &pol; }
    int V = mc->cfg.vocab;
    snprintf(name, sizeof name, "e2e %s: prefill logits (%d tokens)", label, n);
    st = ks_session_prefill(sc, ids, n);
    if (!st) st = ks_session_prefill(sg, ids, n);
    if (st) { result(0, name, "%s: %s", ks_status_name(st), ks_last_error()); goto out; }
    double e = relerr(sg->logits, sc->logits, V);
    int ac = argmax(sc->logits, V), ag = argmax(sg->logits, V);
    int tie = ac != ag && near_tie(sc->logits, sg->logits, V, ac, ag);
    if (tol == 0) note(name, "relerr %.2e, argmax %d vs %d (report only)", e, ag, ac);
    else result(e < tol && (ac == ag || tie), name, "relerr %.2e, argmax %d vs %d%s", e, ag, ac, tie ? " (near tie)" : "");
    /* greedy decode, both sessions fed the CPU's tokens so that every step compares like with
     * like; a differing argmax is accepted only where the measured logit error explains it */
    int agree = 0, ties = 0, bad = -1;
    double worst = e;
    int32_t tok = ac;
    for (int t = 0; t < steps; t++) {
        if ((st = ks_session_decode(sc, tok)) || (st = ks_session_decode(sg, tok))) break;
        double et = relerr(sg->logits, sc->logits, V);
        if (et > worst) worst = et;
        int a = argmax(sc->logits, V), b = argmax(sg->logits, V);
        if (a == b) agree++;
        else if (near_tie(sc->logits, sg->logits, V, a, b)) ties++;
        else if (bad < 0) bad = t;
        tok = a;
    }
    snprintf(name, sizeof name, "e2e %s: greedy %d tokens", label, steps);
    if (st) result(0, name, "%s: %s", ks_status_name(st), ks_last_error());
    else if (tol == 0)
        note(name, "argmax agrees %d/%d (%d near-tie flips, %s), worst logits relerr %.2e (report only)", agree, steps,
             ties, bad >= 0 ? "and a clear disagreement" : "no clear disagreement", worst);
    else
        result(worst < 2 * tol && bad < 0, name, "argmax agrees %d/%d (%d near-tie flips), worst logits relerr %.2e%s",
               agree, steps, ties, worst, bad >= 0 ? ", a clear disagreement" : "");
    if (use_policy) {
        int same = 1;
        for (int l = 0; l < mc->cfg.n_layers; l++)
            for (int h = 0; h < mc->cfg.n_kv_heads; h++)
                if (sc->kv[l].n[h] != sg->kv[l].n[h]) same = 0;
        snprintf(name, sizeof name, "e2e %s: retained rows per layer and head", label);
        result(same, name, "%s", same ? "same on both" : "differ");
    }
out:
    if (sc) ks_session_free(sc);
    if (sg) ks_session_free(sg);
    if (mc) ks_model_free(mc);
    if (mg) ks_model_free(mg);
}

/* Random-weight models of each architecture (ks_model_random: the same weights on both backends,
 * bf16-rounded on the GPU; activations O(1)): test_e2e and test_graph. */
static const char *const random_cfgs[][2] = {
    {"llama g=4 hd=64 llama3-rope",
     "{\"model_type\": \"llama\", \"hidden_size\": 512, \"num_hidden_layers\": 4, \"num_attention_heads\": 8,"
     " \"num_key_value_heads\": 2, \"intermediate_size\": 1024, \"vocab_size\": 1000,"
     " \"max_position_embeddings\": 8192, \"rms_norm_eps\": 1e-5, \"rope_theta\": 500000.0,"
     " \"tie_word_embeddings\": false, \"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8.0,"
     " \"low_freq_factor\": 1.0, \"high_freq_factor\": 4.0, \"original_max_position_embeddings\": 1024}}"},
    {"llama g=8 hd=128",
     "{\"model_type\": \"llama\", \"hidden_size\": 1024, \"num_hidden_layers\": 3, \"num_attention_heads\": 8,"
     " \"num_key_value_heads\": 1, \"intermediate_size\": 2048, \"vocab_size\": 2000,"
     " \"max_position_embeddings\": 4096, \"rms_norm_eps\": 1e-5, \"rope_theta\": 10000.0,"
     " \"tie_word_embeddings\": true}"},
    {"qwen2 biases g=2 hd=64",
     "{\"model_type\": \"qwen2\", \"hidden_size\": 256, \"num_hidden_layers\": 2, \"num_attention_heads\": 4,"
     " \"num_key_value_heads\": 2, \"intermediate_size\": 512, \"vocab_size\": 500,"
     " \"max_position_embeddings\": 4096, \"rms_norm_eps\": 1e-6, \"rope_theta\": 1000000.0,"
     " \"tie_word_embeddings\": true}"},
    {"mistral window 48 hd=128",
     "{\"model_type\": \"mistral\", \"hidden_size\": 512, \"head_dim\": 128, \"num_hidden_layers\": 2,"
     " \"num_attention_heads\": 8, \"num_key_value_heads\": 2, \"intermediate_size\": 1024,"
     " \"vocab_size\": 800, \"max_position_embeddings\": 4096, \"rms_norm_eps\": 1e-5,"
     " \"rope_theta\": 1000000.0, \"sliding_window\": 48, \"tie_word_embeddings\": false}"},
};

static void test_e2e(const char *stories) {
    if (!want("e2e")) return;
    struct { int dim, heads, kv, ffn, layers, n; } tiny[] = {
        {32, 4, 2, 48, 2, 20}, {64, 8, 2, 96, 2, 33}, {256, 4, 4, 512, 2, 100}, {512, 4, 1, 768, 2, 150},
    };
    for (int t = 0; t < 4; t++) {
        if (g_quick && t > 1) break;
        char dir[256], label[128];
        if (kt_tmpdir(dir, sizeof dir)) { result(0, "e2e tiny: temp folder", "mkdtemp failed"); return; }
        kt_tiny_cfg c = kt_tiny_default();
        c.dim = tiny[t].dim;
        c.n_heads = tiny[t].heads;
        c.n_kv_heads = tiny[t].kv;
        c.ffn = tiny[t].ffn;
        c.n_layers = tiny[t].layers;
        c.max_pos = 1024;
        c.seed = 11 + t;
        if (kt_write_tiny_model(dir, &c)) { result(0, "e2e tiny: write model", "failed"); kt_rmdir(dir); return; }
        int n = tiny[t].n;
        int32_t *ids = malloc(sizeof(int32_t) * n);
        for (int i = 0; i < n; i++) ids[i] = irand(c.vocab);
        snprintf(label, sizeof label, "tiny dim=%d H=%d/%d hd=%d", c.dim, c.n_heads, c.n_kv_heads, c.dim / c.n_heads);
        /* kt_write_tiny_model's weights (q/k of scale 1 at any width) make attention nearly
         * one-hot, which amplifies bf16 rounding: run 2 saw logits relerr 1e-2 at dim 32-64 and
         * 0.1-0.5 at dim 256-512 with every argmax agreeing. A loose bound for the small ones,
         * report only for the wide ones; the well-conditioned random models below (relerr
         * ~3e-3) carry the tight end-to-end check */
        double tol = c.dim >= 256 ? 0 : 1e-1; /* 0: report only */
        e2e(label, dir, 0, tol, ids, n, 20, 0);
        snprintf(label, sizeof label, "tiny dim=%d H=%d/%d hd=%d +retain/attend policy", c.dim, c.n_heads, c.n_kv_heads,
                 c.dim / c.n_heads);
        e2e(label, dir, 0, tol, ids, n, 10, 1);
        snprintf(label, sizeof label, "tiny dim=%d H=%d/%d hd=%d +policy, pre-RoPE keys", c.dim, c.n_heads, c.n_kv_heads,
                 c.dim / c.n_heads);
        e2e(label, dir, 0, tol, ids, n, 10, 2);
        free(ids);
        kt_rmdir(dir);
    }
    /* random-weight models of each architecture */
    for (size_t t = 0; t < sizeof random_cfgs / sizeof random_cfgs[0]; t++) {
        if (g_quick && t > 1) break;
        char dir[256], label[160];
        if (kt_tmpdir(dir, sizeof dir) || kt_write_file(dir, "config.json", random_cfgs[t][1])) {
            result(0, "e2e random model: config", "cannot write a temp folder");
            return;
        }
        int n = g_quick ? 70 : 200 + 37 * (int)t, V = t == 1 ? 2000 : t == 2 ? 500 : t == 3 ? 800 : 1000;
        int32_t *ids = malloc(sizeof(int32_t) * n);
        for (int i = 0; i < n; i++) ids[i] = irand(V);
        snprintf(label, sizeof label, "random %s", random_cfgs[t][0]);
        e2e(label, dir, 42 + t, 2e-2, ids, n, 20, 0);
        if (t == 0) {
            snprintf(label, sizeof label, "random %s +retain/attend policy", random_cfgs[t][0]);
            e2e(label, dir, 42 + t, 2e-2, ids, n, 20, 1);
            snprintf(label, sizeof label, "random %s +policy, pre-RoPE keys", random_cfgs[t][0]);
            e2e(label, dir, 42 + t, 2e-2, ids, n, 20, 2);
        }
        free(ids);
        kt_rmdir(dir);
    }
    if (!stories) { result(1, "e2e stories260K", "skipped: no folder (give --stories DIR or KS_STORIES)"); g_pass--; return; }
    ks_model *m = NULL;
    ks_status st = ks_model_load(stories, CPU, 0, &m);
    if (st) { result(0, "e2e stories260K: load", "%s (%s)", ks_last_error(), stories); return; }
    int32_t *ids = NULL;
    size_t n = 0;
    const char *prompt = "Once upon a time, there was a little girl named Lily. She loved to play outside";
    if (m->tok) st = ks_tokenizer_encode(m->tok, prompt, strlen(prompt), 1, &ids, &n);
    else st = ks_errorf(KS_ERR_IO, "no tokenizer");
    ks_model_free(m);
    if (st || n == 0) { result(0, "e2e stories260K: tokenize", "%s", ks_last_error()); free(ids); return; }
    e2e("stories260K", stories, 0, 2e-2, ids, (int)n, 20, 0);
    e2e("stories260K +retain/attend policy", stories, 0, 2e-2, ids, (int)n, 20, 1);
    e2e("stories260K +policy, pre-RoPE keys", stories, 0, 2e-2, ids, (int)n, 20, 2);
    greedy_on_device(stories, ids, (int)n, 24);
    free(ids);
}

/* ================================================================ memory accounting, profiler, discard_kv */

static void test_mem_stats(void) {
    if (!want("mem")) return;
    const char *name = "mem_stats: alloc/free/KV counted exactly, peak and reset";
    if (!GPU->mem_stats) { result(0, name, "the CUDA backend has no mem_stats"); return; }
    ks_mem_stats a, b, c2, d;
    GPU->sync(GPU);
    GPU->mem_stats(GPU, &a, 1);
    size_t sz = (size_t)3 << 20;
    void *p = GPU->alloc(GPU, sz);
    GPU->mem_stats(GPU, &b, 0);
    kv_pair kp;
    kv_init(&kp, 2, 64);
    float kvv[2 * 64 * 5];
    fill(kvv, 2 * 64 * 5, 1.0f);
    int32_t pos[5] = {0, 1, 2, 3, 4};
    float *dk = gpu_buf(kvv, 2 * 64 * 5), *dv = gpu_buf(kvv, 2 * 64 * 5);
    ks_status st = GPU->kv_append(GPU, &kp.g, dk, dv, pos, 5);
    GPU->mem_stats(GPU, &c2, 0);
    size_t kvb = (size_t)2 * kp.g.capacity * 64 * 2 * 2 + (size_t)2 * kp.g.capacity * 4;
    GPU->kv_free(GPU, &kp.g);
    GPU->free(GPU, p);
    GPU->free(GPU, dk);
    GPU->free(GPU, dv);
    GPU->mem_stats(GPU, &d, 0);
    int ok = !st && p && b.scratch == a.scratch + sz && b.cur == a.cur + sz && b.peak >= b.cur &&
             c2.fixed == a.fixed + kvb && d.cur == a.cur && d.peak >= c2.cur && b.pool_used_high >= sz;
    GPU->mem_stats(GPU, &d, 1);
    ok = ok && d.peak == d.cur;
    result(ok, name, "scratch +%zu (want %zu), KV +%zu (want %zu), back to %zu (from %zu), peak %zu, pool used high %zu",
           b.scratch - a.scratch, sz, c2.fixed - a.fixed, kvb, d.cur, a.cur, c2.peak, b.pool_used_high);
}

static double prof_total(const ks_profile *p, int stage) {
    double t = 0;
    for (int i = 0; i < KS_PH_COUNT; i++) t += p->sec[stage][i];
    return t;
}

/* GemFilter-like C policy (as in tests/test_engine.c): at layer 2 of the first pass restart on
 * the 9 rows whose keys score highest against the last query (head 0), reading q and k from
 * the device; optionally discard_kv at layer 0. */
static int g_discard;
static ks_status pol_gem(void *ud, ks_event *ev) {
    if (ev->pass) return KS_OK;
    if (ev->layer == 0 && g_discard) {
        ks_status st = ks_action_discard_kv(ev);
        if (st) return st;
    }
    if (ev->layer != 2) return KS_OK;
    int n = ev->n, d = ev->head_dim, H = ev->n_heads, Hkv = ev->n_kv_heads, K = 9;
    float *q = malloc(sizeof(float) * d), *k = malloc(sizeof(float) * (size_t)n * Hkv * d), *sc = malloc(sizeof(float) * n);
    ks_backend *be = (ks_backend *)ev->be;
    ks_status st = be->download(be, q, ev->q + (size_t)(n - 1) * H * d, sizeof(float) * d);
    if (!st) st = be->download(be, k, ev->k, sizeof(float) * (size_t)n * Hkv * d);
    int32_t idx[9];
    for (int j = 0; !st && j < n; j++) {
        double a = 0;
        for (int t = 0; t < d; t++) a += (double)q[t] * k[(size_t)j * Hkv * d + t];
        sc[j] = (float)a;
    }
    for (int i = 0; !st && i < K; i++) {
        int best = -1;
        for (int j = 0; j < n; j++)
            if (sc[j] > -1e30f && (best < 0 || sc[j] > sc[best])) best = j;
        idx[i] = best;
        sc[best] = -1e31f;
    }
    free(q); free(k); free(sc);
    return st ? st : ks_action_restart(ev, idx, K);
}

static void test_engine_perf(void) {
    if (!want("engine")) return;
    char dir[256];
    static const char *cfg =
        "{\"model_type\": \"llama\", \"hidden_size\": 512, \"num_hidden_layers\": 5, \"num_attention_heads\": 8,"
        " \"num_key_value_heads\": 2, \"intermediate_size\": 1024, \"vocab_size\": 1000,"
        " \"max_position_embeddings\": 8192, \"rms_norm_eps\": 1e-5, \"rope_theta\": 10000.0,"
        " \"tie_word_embeddings\": false}";
    if (kt_tmpdir(dir, sizeof dir) || kt_write_file(dir, "config.json", cfg)) {
        result(0, "engine: config", "cannot write a temp folder");
        return;
    }
    ks_model *m = NULL;
    ks_session *s = NULL;
    ks_status st = ks_model_random(dir, GPU, 5, &m);
    if (!st) st = ks_session_create(m, &s);
    if (st) { result(0, "engine: random model on the GPU", "%s", ks_last_error()); goto out; }
    int n = g_quick ? 300 : 3000, steps = 8;
    int32_t *ids = malloc(sizeof(int32_t) * n);
    for (int i = 0; i < n; i++) ids[i] = irand(1000);
    /* profiler: event stamps, then sync + host clock */
    for (int mode = 1; mode <= 2; mode++) {
        char name[160];
        snprintf(name, sizeof name, "profile (%s): phases sum to the wall time", mode == 1 ? "CUDA events" : "sync + host clock");
        ks_session_reset(s);
        ks_profile_enable(s, mode);
        st = ks_session_prefill(s, ids, n);
        ks_sampler smp;
        ks_sampler_init(&smp, 0, 1, 0);
        for (int t = 0; !st && t < steps; t++) st = ks_session_decode(s, ks_sample(&smp, s->logits, m->cfg.vocab));
        const ks_profile *p = &s->prof;
        double sp = prof_total(p, 0), sd = prof_total(p, 1);
        int ok = !st && p->stamps == (mode == 1) && fabs(sp - p->wall[0]) <= 0.05 * p->wall[0] + 5e-4 &&
                 fabs(sd - p->wall[1]) <= 0.05 * p->wall[1] + 5e-4 * steps && p->sec[0][KS_PH_ATTENTION] > 0 &&
                 p->sec[0][KS_PH_MLP] > 0 && p->sec[0][KS_PH_QKV] > 0 && p->sec[1][KS_PH_ATTENTION] > 0 &&
                 p->calls[1][KS_PH_ATTENTION] == (long)steps * m->cfg.n_layers && sp <= s->t_prefill * 1.05 + 1e-3;
        result(ok, name, "%s prefill %.2f ms (wall %.2f, session %.2f), decode %.3f ms/step (wall %.3f); attention %.2f ms, mlp %.2f ms",
               st ? ks_last_error() : "", 1e3 * sp, 1e3 * p->wall[0], 1e3 * s->t_prefill, 1e3 * sd / steps,
               1e3 * p->wall[1] / steps, 1e3 * p->sec[0][KS_PH_ATTENTION], 1e3 * p->sec[0][KS_PH_MLP]);
        if (!g_quick) ks_profile_print(p, stdout, name);
        ks_profile_enable(s, 0);
        if (st) break;
    }
    /* discard_kv: the same kept tokens and logits, a lower peak */
    {
        ks_policy pol;
        memset(&pol, 0, sizeof pol);
        pol.name = "gem";
        pol.on[KS_EV_PREFILL_QKV] = pol_gem;
        float *lg[2] = {malloc(sizeof(float) * 1000), malloc(sizeof(float) * 1000)};
        int32_t kept[2][9];
        size_t peak[2] = {0, 0};
        for (int mode = 0; mode < 2 && !st; mode++) {
            g_discard = mode;
            ks_session_reset(s);
            s->policy = &pol;
            ks_mem_stats ms;
            GPU->sync(GPU);
            GPU->mem_stats(GPU, &ms, 1);
            st = ks_session_prefill(s, ids, n);
            for (int t = 0; !st && t < 3; t++) st = ks_session_decode(s, 7 + t);
            GPU->mem_stats(GPU, &ms, 0);
            peak[mode] = ms.peak;
            s->policy = NULL;
            if (!st && (!s->restarted || s->n_restart != 9)) st = ks_errorf(KS_ERR_INTERNAL, "no restart recorded");
            if (!st) {
                memcpy(lg[mode], s->logits, sizeof(float) * 1000);
                memcpy(kept[mode], s->restart_idx, sizeof kept[mode]);
            }
        }
        size_t kvl = (size_t)m->cfg.n_kv_heads * n * m->cfg.head_dim * 2 * 2; /* one layer, bf16 K and V */
        double e = st ? INFINITY : relerr(lg[1], lg[0], 1000);
        int ok = !st && !memcmp(kept[0], kept[1], sizeof kept[0]) && e < 1e-6 && peak[0] >= peak[1] + kvl;
        result(ok, "discard_kv: same kept tokens and logits, peak lower by >= one layer's KV",
               "%s kept %s, logits relerr %.1e, peak %.2f MiB -> %.2f MiB (one layer's KV %.2f MiB)", st ? ks_last_error() : "",
               st || memcmp(kept[0], kept[1], sizeof kept[0]) ? "differ" : "same", e, peak[0] / 1048576.0,
               peak[1] / 1048576.0, kvl / 1048576.0);
        free(lg[0]);
        free(lg[1]);
    }
    free(ids);
out:
    if (s) ks_session_free(s);
    if (m) ks_model_free(m);
    kt_rmdir(dir);
}

/* ================================================================ main */

static int is_dir(const char *p) {
    FILE *f;
    char buf[1024];
    snprintf(buf, sizeof buf, "%s/config.json", p);
    if (!(f = fopen(buf, "r"))) return 0;
    fclose(f);
    return 1;
}

/* ================================================================ decode graphs */

/* per-head retention at prefill (layers 0 and 2): each KV head keeps a different row count */
static ks_status pol_retain_heads(void *ud, ks_event *ev) {
    if (ev->layer % 2 || ev->n < 8) return KS_OK;
    int H = ev->n_kv_heads;
    int32_t **l = calloc(H, sizeof *l);
    int *cnt = calloc(H, sizeof *cnt);
    for (int h = 0; h < H; h++) {
        int n = ev->kv->n[h];
        l[h] = malloc(sizeof(int32_t) * n);
        for (int i = 0; i < n; i++)
            if ((i + h) % (3 + h) != 0 || i >= n - 4) l[h][cnt[h]++] = i;
    }
    ks_status st = ks_action_retain_heads(ev, (const int32_t *const *)l, cnt);
    for (int h = 0; h < H; h++) free(l[h]);
    free(l);
    free(cnt);
    return st;
}

/* Prefill then `steps` decode steps fed fixed tokens; logits of every step into out (steps, V).
 * graphs 0: the backend's graph hooks hidden (plain launches). */
static ks_status graph_run_session(ks_model *m, const ks_policy *pol, const int32_t *ids, int n, int steps, int graphs,
                                   float *out, int *graph_steps, int *rows0) {
    ks_backend *be = m->be;
    ks_status (*gb)(ks_backend *, int32_t, int32_t) = be->graph_begin;
    if (!graphs) be->graph_begin = NULL;
    ks_session *s = NULL;
    ks_status st = ks_session_create(m, &s);
    int V = m->cfg.vocab;
    if (!st) {
        s->policy = pol;
        st = ks_session_prefill(s, ids, n);
        if (!st && rows0) { /* rows of layer 0's heads after the prefill */
            for (int h = 0; h < m->cfg.n_kv_heads; h++) rows0[h] = s->kv[0].n[h];
        }
        for (int t = 0; !st && t < steps; t++) {
            st = ks_session_decode(s, ids[(7 * t + 3) % n]);
            if (!st) memcpy(out + (size_t)t * V, s->logits, sizeof(float) * V);
        }
        *graph_steps = s->graph_steps;
    }
    if (s) ks_session_free(s);
    be->graph_begin = gb;
    return st;
}

static void test_graph(void) {
    if (!want("graph")) return;
    if (!GPU->graph_begin) { result(1, "decode graph", "skipped: the backend records no graphs (--no-graphs, --plain, --basic-decode)"); g_pass--; return; }
    static const int which[] = {0, 2, 3}; /* random_cfgs: llama3 rope g=4, qwen2 biases, mistral window */
    const int steps = 12;
    for (size_t w = 0; w < sizeof which / sizeof which[0]; w++) {
        const char *const *cfg = random_cfgs[which[w]];
        char dir[256], name[200];
        if (kt_tmpdir(dir, sizeof dir) || kt_write_file(dir, "config.json", cfg[1])) {
            result(0, "decode graph: config", "cannot write a temp folder");
            return;
        }
        ks_model *m = NULL;
        ks_status st = ks_model_random(dir, GPU, 77 + w, &m);
        if (st) { result(0, "decode graph: model", "%s", ks_last_error()); kt_rmdir(dir); return; }
        int V = m->cfg.vocab, n = 90 + 13 * (int)w;
        int32_t *ids = malloc(sizeof(int32_t) * n);
        for (int i = 0; i < n; i++) ids[i] = irand(V);
        float *a = malloc(sizeof(float) * steps * V), *b = malloc(sizeof(float) * steps * V);
        ks_policy heads, hook;
        memset(&heads, 0, sizeof heads);
        heads.name = "test-retain-heads";
        heads.on[KS_EV_PREFILL_LAYER_END] = pol_retain_heads;
        memset(&hook, 0, sizeof hook);
        hook.name = "test-retain-attend";
        hook.on[KS_EV_PREFILL_LAYER_END] = pol_layer_end;
        hook.on[KS_EV_DECODE_QKV] = pol_decode;
        struct { const char *what; const ks_policy *pol; int want_graph; } cases[] = {
            {"full KV", NULL, 1}, {"per-head retention", &heads, 1}, {"decode-time handler", &hook, 0}};
        for (int k = 0; k < 3; k++) {
            int ga = 0, gb = 0, rows[64] = {0};
            st = graph_run_session(m, cases[k].pol, ids, n, steps, 1, a, &ga, rows);
            if (!st) st = graph_run_session(m, cases[k].pol, ids, n, steps, 0, b, &gb, NULL);
            snprintf(name, sizeof name, "decode graph %s, %s: %d steps vs plain launches", cfg[0], cases[k].what, steps);
            if (st) { result(0, name, "%s: %s", ks_status_name(st), ks_last_error()); continue; }
            int same = !memcmp(a, b, sizeof(float) * steps * V), finite = 1;
            for (size_t i = 0; i < (size_t)steps * V; i++) finite &= isfinite(a[i]) ? 1 : 0;
            int want_g = cases[k].want_graph ? steps - 1 : 0;
            int distinct = 0; /* heads of layer 0 with row counts unlike head 0's */
            for (int h = 1; h < m->cfg.n_kv_heads; h++) distinct += rows[h] != rows[0];
            int rows_ok = k != 1 || distinct > 0;
            result(same && finite && ga == want_g && gb == 0 && rows_ok, name,
                   "logits %s, %d of %d steps from a graph (want %d), layer 0 rows %d/%d%s", same ? "bit-identical" : "DIFFER",
                   ga, steps, want_g, rows[0], rows[1], finite ? "" : ", non-finite values");
        }
        free(a);
        free(b);
        free(ids);
        ks_model_free(m);
        kt_rmdir(dir);
    }
}

/* Two CUDA backends of one process with different options (GPU: the command line's; GPU_MMA:
 * mma.sync prefill, graphs off, PDL on) run the same random model in turns A, B, A: each uses
 * its own prefill kernel and graph setting, B's logits match A's within the flash tolerance,
 * and A's second run is bit-identical to its first (B changed nothing of A's). */
static void test_two_backends(void) {
    if (!want("two backends")) return;
    const char *const *cfg = random_cfgs[0]; /* hd 64, g = 4 */
    char dir[256];
    if (kt_tmpdir(dir, sizeof dir) || kt_write_file(dir, "config.json", cfg[1])) {
        result(0, "two backends: config", "cannot write a temp folder");
        return;
    }
    ks_model *ma = NULL, *mb = NULL;
    ks_status st = ks_model_random(dir, GPU, 91, &ma);
    if (!st) st = ks_model_random(dir, GPU_MMA, 91, &mb);
    if (st) { result(0, "two backends: models", "%s", ks_last_error()); ks_model_free(ma); kt_rmdir(dir); return; }
    const int n = 160, steps = 8, V = ma->cfg.vocab;
    int32_t *ids = malloc(sizeof(int32_t) * n);
    for (int i = 0; i < n; i++) ids[i] = irand(V);
    float *a = malloc(sizeof(float) * steps * V), *b = malloc(sizeof(float) * steps * V), *a2 = malloc(sizeof(float) * steps * V);
    long wa0 = ks_cuda_backend_prefill_calls(GPU, KS_CUDA_PREFILL_WGMMA), fa0 = ks_cuda_backend_prefill_calls(GPU, KS_CUDA_PREFILL_MMA);
    long wb0 = ks_cuda_backend_prefill_calls(GPU_MMA, KS_CUDA_PREFILL_WGMMA), fb0 = ks_cuda_backend_prefill_calls(GPU_MMA, KS_CUDA_PREFILL_MMA);
    int ga = 0, gb = 0, ga2 = 0;
    st = graph_run_session(ma, NULL, ids, n, steps, 1, a, &ga, NULL);
    long wa = ks_cuda_backend_prefill_calls(GPU, KS_CUDA_PREFILL_WGMMA) - wa0, fa = ks_cuda_backend_prefill_calls(GPU, KS_CUDA_PREFILL_MMA) - fa0;
    if (!st) st = graph_run_session(mb, NULL, ids, n, steps, 1, b, &gb, NULL);
    if (!st) st = graph_run_session(ma, NULL, ids, n, steps, 1, a2, &ga2, NULL);
    long wb = ks_cuda_backend_prefill_calls(GPU_MMA, KS_CUDA_PREFILL_WGMMA) - wb0, fb = ks_cuda_backend_prefill_calls(GPU_MMA, KS_CUDA_PREFILL_MMA) - fb0;
    if (st) {
        result(0, "two backends: runs", "%s: %s", ks_status_name(st), ks_last_error());
    } else {
        int hopper = 0;
        int major = 0;
        if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0) == cudaSuccess) hopper = major == 9;
        /* A: the planner's kernel (wgmma on Hopper) for every prefill attention; B: mma.sync only */
        int a_wg = GPU->opts.prefill_attn != KS_PREFILL_ATTN_MMA && hopper;
        int a_ok = a_wg ? (wa >= ma->cfg.n_layers && fa == 0) : (wa == 0 && fa >= ma->cfg.n_layers);
        result(a_ok && wb == 0 && fb >= mb->cfg.n_layers, "two backends: each its own prefill attention kernel",
               "A wgmma %ld mma %ld (want %s), B wgmma %ld mma %ld (%d layers)", wa, fa, a_wg ? "wgmma" : "mma", wb, fb,
               ma->cfg.n_layers);
        int want_ga = GPU->graph_begin ? steps - 1 : 0;
        result(ga == want_ga && ga2 == want_ga && gb == 0 && !GPU_MMA->graph_begin, "two backends: each its own decode graphs",
               "A %d and %d of %d steps from a graph (want %d), B %d", ga, ga2, steps, want_ga, gb);
        int argmax_ok = 1;
        for (int t = 0; t < steps; t++) {
            int x = argmax(a + (size_t)t * V, V), y = argmax(b + (size_t)t * V, V);
            if (x != y && !near_tie(a + (size_t)t * V, b + (size_t)t * V, V, x, y)) argmax_ok = 0;
        }
        double e = relerr(b, a, (size_t)steps * V);
        result(e < 2e-2 && argmax_ok && !memcmp(a, a2, sizeof(float) * steps * V), "two backends: same logits",
               "B vs A relerr %.2e, argmax %s; A again %s", e, argmax_ok ? "agrees" : "DIFFERS",
               memcmp(a, a2, sizeof(float) * steps * V) ? "DIFFERS" : "bit-identical");
    }
    free(a); free(b); free(a2); free(ids);
    ks_model_free(mb);
    ks_model_free(ma);
    kt_rmdir(dir);
}

int main(int argc, char **argv) {
    const char *stories = getenv("KS_STORIES");
    ks_backend_opts go = ks_backend_opts_default(); /* GPU's options, from the command line */
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick")) g_quick = 1;
        else if (!strcmp(argv[i], "--only") && i + 1 < argc) g_only = argv[++i];
        else if (!strcmp(argv[i], "--stories") && i + 1 < argc) stories = argv[++i];
        else if (!strcmp(argv[i], "--pdl")) go.pdl = 1;
        else if (!strcmp(argv[i], "--no-graphs")) go.graphs = 0;
        else if (!strcmp(argv[i], "--mma-prefill")) go.prefill_attn = KS_PREFILL_ATTN_MMA;
        else if (!strcmp(argv[i], "--basic-decode")) go.decode_kernels = 0;
        else if (!strcmp(argv[i], "--plain")) go.fused = go.mlp = 0; /* the forward ops' plain compositions */
        else {
            fprintf(stderr, "usage: %s [--quick] [--only NAME] [--stories DIR] [--pdl] [--no-graphs] [--mma-prefill] "
                            "[--basic-decode] [--plain]\n", argv[0]);
            return 2;
        }
    }
    if (!stories) {
        const char *cands[] = {".data/stories260K", "../shared/models/stories260K", "shared/models/stories260K"};
        for (int i = 0; i < 3; i++)
            if (is_dir(cands[i])) { stories = cands[i]; break; }
    }
    ks_backend_opts mo = go;
    mo.prefill_attn = KS_PREFILL_ATTN_MMA;
    mo.graphs = 0;
    mo.pdl = 1;
    if (ks_cpu_backend_create(NULL, &CPU)) { fprintf(stderr, "cpu backend: %s\n", ks_last_error()); return 2; }
    if (ks_cuda_backend_create(&go, &GPU) || ks_cuda_backend_create(&mo, &GPU_MMA)) {
        fprintf(stderr, "cuda backend: %s\n", ks_last_error());
        return 2;
    }
    printf("kernels: prefill %s, decode %s, PDL %s, graphs %s, %s\n",
           go.prefill_attn == KS_PREFILL_ATTN_MMA ? "mma.sync" : "planner",
           go.decode_kernels ? "gemv + tensor-core attention" : "cuBLAS + split-KV", go.pdl ? "on" : "off",
           go.graphs ? "on" : "off", go.fused ? "fused forward ops" : "plain forward ops (--plain)");
    test_matmul();
    test_embed();
    test_rmsnorm();
    test_rope();
    test_fused();
    test_elementwise();
    test_gather();
    test_put();
    test_kv();
    test_check_idx();
    test_attention();
    test_oom();
    test_mem_stats();
    test_engine_perf();
    test_graph();
    test_two_backends();
    test_e2e(stories);
    ks_backend_free(GPU_MMA);
    ks_backend_free(GPU);
    ks_backend_free(CPU);
    printf("%d passed, %d failed\n", g_pass, g_fail);
    return g_fail ? 1 : 0;
}
