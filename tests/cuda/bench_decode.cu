/* bench_decode.cu — the decode step's kernels (one token, n == 1) at the Llama-3.1-8B shape on
 * random bf16 weights, next to a measured device-to-device copy:
 *   1. each gemv shape (fused q|k|v 6144 x 4096, o_proj 4096 x 4096, fused gate|up 2 x 14336 x
 *      4096, down 4096 x 14336, lm_head 128256 x 4096): the backend's kernel alone, and 8 launches
 *      back to back with and without programmatic dependent launch (PDL), plus the plain-gemv
 *      variants (rows per warp, unroll, split-K inside a block, L2 prefetch) with their largest
 *      difference from the default kernel's output;
 *   2. decode attention (32 query heads, 8 KV heads, d 128) over 2K and 128K cache rows for
 *      several split counts;
 *   3. the whole decode sequence: per layer norm+q|k|v+RoPE(+KV append), [kv_append], attention
 *      (+combine), o_proj+residual, norm+gate|up+SwiGLU, down+residual; 32 layers then the
 *      lm_head, with and without PDL, fused or separate KV append, several prefetch sizes, and
 *      a check that PDL leaves the result bit-identical;
 *   4. that step captured once into a CUDA graph and replayed, next to the same stream launches,
 *      with one layer's weights reused and with every layer's own weights and KV cache (as the
 *      engine has them), plus the host's enqueue time and the logits download (pageable, pinned).
 * Every time is the best of 20 timed runs (CUDA events) after warm-up; memory-bound single
 * kernels rotate over copies of their weights so that L2 (50 MB) never holds them.
 * Usage: bench_decode [--quick] [--graph] [--ctx N] (--quick: fewer variants, 2K only; --graph: only 4). */
#include <cuda_runtime.h>

#include <algorithm>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>

#include "common.cuh"
#include "ks_cuda.h"

#define CK(x)                                                                                                  \
    do {                                                                                                       \
        cudaError_t e_ = (x);                                                                                  \
        if (e_) { fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, cudaGetErrorString(e_)); exit(1); }      \
    } while (0)
#define KS(x)                                                                                                  \
    do {                                                                                                       \
        ks_status s_ = (x);                                                                                    \
        if (s_) { fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, ks_last_error()); exit(1); }             \
    } while (0)

static cudaStream_t S;
static int g_quick, g_graph_only; /* --graph: only section 4 */
static int g_pdl; /* programmatic dependent launch of the calls below (each section sets it) */
static const ks_cuda_attn_params *pdl_of(ks_cuda_attn_params *p) { p->pdl = g_pdl; return p; }
static double g_copy; /* GB/s, bytes read + written */

/* best of reps after warm-up; fn(i) enqueues one timed unit */
template <typename F> static double best_ms(F fn, int warm = 3, int reps = 20) {
    for (int i = 0; i < warm; i++) fn(i);
    CK(cudaStreamSynchronize(S));
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    double best = 1e30;
    for (int i = 0; i < reps; i++) {
        CK(cudaEventRecord(a, S));
        fn(warm + i);
        CK(cudaEventRecord(b, S));
        CK(cudaEventSynchronize(b));
        float ms;
        CK(cudaEventElapsedTime(&ms, a, b));
        best = std::min(best, (double)ms);
    }
    CK(cudaGetLastError());
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    return best;
}

static void *dmalloc(size_t bytes) {
    void *p;
    CK(cudaMalloc(&p, bytes));
    return p;
}
static void *rnd_bf16(size_t n, uint64_t seed, float scale) {
    void *p = dmalloc(n * 2);
    KS(ks_cuda_random(S, p, KS_CUDA_BF16, (int64_t)(n / 64), 64, seed, scale, 0.f));
    return p;
}
static float *rnd_f32(size_t n, uint64_t seed, float scale, float offset = 0.f) {
    float *p = (float *)dmalloc(n * 4);
    KS(ks_cuda_random(S, p, KS_CUDA_F32, (int64_t)(n / 64), 64, seed, scale, offset));
    return p;
}

static void line(const char *name, double ms, double bytes) {
    double gbs = bytes / (ms * 1e-3) / 1e9;
    printf("%-72s %9.4f ms %8.0f GB/s %5.1f%% of copy\n", name, ms, gbs, g_copy > 0 ? 100 * gbs / g_copy : 0);
    fflush(stdout);
}

/* ---------------------------------------------------------------- model-shaped buffers */

enum { DIM = 4096, NH = 32, NKV = 8, HD = 128, KD = NKV * HD, FFN = 14336, VOCAB = 128256, LAYERS = 32 };

struct layer_w {
    void *wq, *wk, *wv, *wo, *wg, *wu, *wd;
    float *attn_norm, *ffn_norm;
};

static layer_w make_layer(uint64_t seed) {
    layer_w w;
    float a = 1.0f / sqrtf((float)DIM), f = 1.0f / sqrtf((float)FFN);
    w.wq = rnd_bf16((size_t)DIM * DIM, seed + 1, a);
    w.wk = rnd_bf16((size_t)KD * DIM, seed + 2, a);
    w.wv = rnd_bf16((size_t)KD * DIM, seed + 3, a);
    w.wo = rnd_bf16((size_t)DIM * DIM, seed + 4, a);
    w.wg = rnd_bf16((size_t)FFN * DIM, seed + 5, a);
    w.wu = rnd_bf16((size_t)FFN * DIM, seed + 6, a);
    w.wd = rnd_bf16((size_t)DIM * FFN, seed + 7, f);
    w.attn_norm = rnd_f32(DIM, seed + 8, 0.1f, 1.0f);
    w.ffn_norm = rnd_f32(DIM, seed + 9, 0.1f, 1.0f);
    return w;
}
static void free_layer(layer_w &w) {
    void *p[] = {w.wq, w.wk, w.wv, w.wo, w.wg, w.wu, w.wd, w.attn_norm, w.ffn_norm};
    for (void *q : p) cudaFree(q);
}

struct acts {
    float *x, *xn, *q, *k, *v, *att, *gate, *logits;
};
static acts make_acts() {
    acts a;
    a.x = rnd_f32(DIM, 77, 1.0f);
    a.xn = (float *)dmalloc(DIM * 4);
    a.q = (float *)dmalloc(DIM * 4);
    a.k = (float *)dmalloc(KD * 4);
    a.v = (float *)dmalloc(KD * 4);
    a.att = (float *)dmalloc(DIM * 4);
    a.gate = (float *)dmalloc(FFN * 4);
    a.logits = (float *)dmalloc((size_t)VOCAB * 4);
    return a;
}

struct kv_cache {
    void *k, *v;
    int32_t *pos;
    int cap, rows; /* rows in use (the new row goes to index rows) */
    int n[NKV];
};
static kv_cache make_cache(int rows) {
    kv_cache c;
    c.cap = rows + 64;
    c.rows = rows;
    c.k = rnd_bf16((size_t)NKV * c.cap * HD, 501, 1.0f);
    c.v = rnd_bf16((size_t)NKV * c.cap * HD, 502, 1.0f);
    std::vector<int32_t> pos((size_t)NKV * c.cap);
    for (int h = 0; h < NKV; h++)
        for (int i = 0; i < c.cap; i++) pos[(size_t)h * c.cap + i] = i;
    c.pos = (int32_t *)dmalloc(pos.size() * 4);
    CK(cudaMemcpy(c.pos, pos.data(), pos.size() * 4, cudaMemcpyHostToDevice));
    for (int h = 0; h < NKV; h++) c.n[h] = rows;
    return c;
}
static void free_cache(kv_cache &c) {
    cudaFree(c.k);
    cudaFree(c.v);
    cudaFree(c.pos);
}

static float *g_inv; /* (HD/2) RoPE inverse frequencies, theta 500000 */

static ks_cuda_attn_params attn_params(const acts &a, const kv_cache &c, int rows) {
    ks_cuda_attn_params p;
    memset(&p, 0, sizeof p);
    p.out = a.att;
    p.q = a.q;
    p.k = c.k;
    p.v = c.v;
    p.kpos = c.pos;
    p.n = 1;
    p.n_heads = NH;
    p.n_kv_heads = NKV;
    p.head_dim = HD;
    p.capacity = c.cap;
    p.max_nk = rows;
    p.scale = 1.0f / sqrtf((float)HD);
    return p;
}

/* ---------------------------------------------------------------- 1. gemv shapes */

static void bench_gemv_shapes(void) {
    printf("\n== gemv shapes (one token; weights bf16, x float32) ==\n");
    float *x = rnd_f32(FFN, 11, 1.0f), *y = (float *)dmalloc((size_t)VOCAB * 4);
    float *nw = rnd_f32(DIM, 12, 0.1f, 1.0f), *xn = (float *)dmalloc(DIM * 4);
    float *yk = (float *)dmalloc(KD * 4), *yv = (float *)dmalloc(KD * 4), *yq = (float *)dmalloc(DIM * 4);
    struct shape { const char *name; int out, in, kind; } shapes[] = {
        {"qkv (norm + q|k|v + RoPE) 6144x4096", 6144, DIM, 1},
        {"o_proj (+residual) 4096x4096", DIM, DIM, 0},
        {"gate|up (norm + SwiGLU) 2 x 14336x4096", 2 * FFN, DIM, 2},
        {"down (+residual) 4096x14336", DIM, FFN, 0},
        {"lm_head 128256x4096", VOCAB, DIM, 3},
    };
    std::vector<float> h_ref, h_out;
    for (const shape &sh : shapes) {
        size_t bytes = (size_t)sh.out * sh.in * 2;
        int nb = (int)std::max<size_t>(1, ((size_t)160 << 20) / bytes + 1); /* copies: > 3x L2 in rotation */
        std::vector<void *> W(nb);
        for (int i = 0; i < nb; i++) W[i] = rnd_bf16((size_t)sh.out * sh.in, 100 + i, 1.0f / sqrtf((float)sh.in));
        auto run = [&](int i) {
            void *w = W[i % nb];
            if (sh.kind == 1) {
                const bf16 *b = (const bf16 *)w;
                float *ys[3] = {yq, yk, yv};
                const void *ws[3] = {b, b + (size_t)DIM * DIM, b + (size_t)(DIM + KD) * DIM};
                const float *bs[3] = {NULL, NULL, NULL};
                int rows[3] = {DIM, KD, KD}, rope[3] = {1, 1, 0};
                KS(ks_cuda_gemv_qkv(S, x, nw, 1e-5f, xn, DIM, 3, ys, ws, bs, rows, rope, HD, 1000, g_inv, 1.0f, g_pdl));
            } else if (sh.kind == 2) {
                const bf16 *b = (const bf16 *)w;
                KS(ks_cuda_gemv_swiglu(S, y, x, nw, 1e-5f, xn, b, b + (size_t)FFN * DIM, DIM, FFN, g_pdl));
            } else if (sh.kind == 3) {
                KS(ks_cuda_gemv(S, y, x, w, NULL, sh.in, sh.out, g_pdl));
            } else {
                KS(ks_cuda_gemv_acc(S, y, x, w, NULL, sh.in, sh.out, g_pdl));
            }
        };
        char name[160];
        for (int pdl = 0; pdl < 2; pdl++) {
            g_pdl = pdl;
            double one = best_ms([&](int i) { run(i); });
            snprintf(name, sizeof name, "%s: one launch%s", sh.name, pdl ? " (PDL attr)" : "");
            line(name, one, (double)bytes);
            double eight = best_ms([&](int i) { for (int j = 0; j < 8; j++) run(i * 8 + j); }) / 8;
            snprintf(name, sizeof name, "%s: 8 back to back, PDL %s", sh.name, pdl ? "on" : "off");
            line(name, eight, (double)bytes);
        }
        g_pdl = 0;
        if (sh.kind == 0 || sh.kind == 3) { /* plain gemv variants vs the default kernel's output */
            KS(ks_cuda_gemv(S, y, x, W[0], NULL, sh.in, sh.out, g_pdl));
            h_ref.resize(sh.out);
            h_out.resize(sh.out);
            CK(cudaMemcpy(h_ref.data(), y, sh.out * 4, cudaMemcpyDeviceToHost));
            int rows_o[] = {1, 2, 4}, unr_o[] = {4, 8}, ks_o[] = {1, 2, 4}, pf_o[] = {0, 2048};
            for (int r : rows_o)
                for (int u : unr_o)
                    for (int k : ks_o)
                        for (int pf : pf_o) {
                            if (g_quick && (u == 8 || pf == 0)) continue;
                            ks_cuda_gemv_variant v = {r, u, k, pf, 0};
                            KS(ks_cuda_gemv_var(S, &v, y, x, W[0], sh.in, sh.out, 0));
                            CK(cudaMemcpy(h_out.data(), y, sh.out * 4, cudaMemcpyDeviceToHost));
                            double md = 0, mx = 0;
                            for (int i = 0; i < sh.out; i++) {
                                md = std::max(md, (double)fabsf(h_out[i] - h_ref[i]));
                                mx = std::max(mx, (double)fabsf(h_ref[i]));
                            }
                            g_pdl = 1;
                            v.pdl = 1;
                            double ms = best_ms([&](int i) {
                                for (int j = 0; j < 8; j++) KS(ks_cuda_gemv_var(S, &v, y, x, W[(i * 8 + j) % nb], sh.in, sh.out, 0));
                            }) / 8;
                            g_pdl = 0;
                            snprintf(name, sizeof name, "  variant rows %d unroll %d ksplit %d prefetch %4d (x8 PDL; maxdiff %.1e of %.1e)",
                                     r, u, k, pf, md, mx);
                            line(name, ms, (double)bytes);
                        }
        }
        for (void *p : W) cudaFree(p);
    }
    void *p[] = {x, y, nw, xn, yk, yv, yq};
    for (void *q : p) cudaFree(q);
}

/* ---------------------------------------------------------------- 2. attention */

static void bench_attention(int rows) {
    printf("\n== decode attention, %d cache rows (32 q heads, 8 KV heads, d 128) ==\n", rows);
    acts a = make_acts();
    KS(ks_cuda_random(S, a.q, KS_CUDA_F32, DIM / 64, 64, 9, 1.0f, 0.f));
    kv_cache c = make_cache(rows);
    ks_cuda_attn_params p = attn_params(a, c, rows);
    int nsm = 0;
    CK(cudaDeviceGetAttribute(&nsm, cudaDevAttrMultiProcessorCount, 0));
    int def;
    ks_cuda_attn_decode_tc_workspace(&p, nsm, &def);
    size_t wsb = (size_t)NH * 1024 * (HD + 2) * 4;
    void *ws = dmalloc(wsb);
    double bytes = 2.0 * NKV * rows * HD * 2;
    char name[160];
    std::vector<int> splits = {def, 1, 2, 4, 8, 16, 32, 64, 128};
    for (size_t k = 0; k < splits.size(); k++) {
        int sp = splits[k];
        if (k > 0 && sp == def) continue;
        if (sp > 1024 || (sp != def && (sp > 4 * def || sp < def / 16)) || (g_quick && sp != def && sp != def / 2)) continue;
        for (int pdl = 0; pdl < 2; pdl++) {
            g_pdl = pdl;
            double ms = best_ms([&](int) {
                for (int j = 0; j < 8; j++) KS(ks_cuda_attn_decode_tc1(S, pdl_of(&p), c.n, rows, NULL, sp, sp > 1 ? ws : NULL));
            }) / 8;
            snprintf(name, sizeof name, "attention %d rows, %d splits%s, x8 PDL %s", rows, sp, sp == def ? " (default)" : "",
                     pdl ? "on" : "off");
            line(name, ms, bytes);
        }
    }
    g_pdl = 0;
    cudaFree(ws);
    free_cache(c);
    void *q[] = {a.x, a.xn, a.q, a.k, a.v, a.att, a.gate, a.logits};
    for (void *r : q) cudaFree(r);
}

/* ---------------------------------------------------------------- 3. the decode sequence */

static void bench_sequence(int rows) {
    printf("\n== decode step: %d layers x (qkv, [kv_append], attention, o_proj, swiglu, down) + lm_head, %d cache rows ==\n",
           LAYERS, rows);
    layer_w w = make_layer(1000);
    void *lm = rnd_bf16((size_t)VOCAB * DIM, 2000, 1.0f / sqrtf((float)DIM));
    acts a = make_acts();
    float *x0 = (float *)dmalloc(DIM * 4);
    CK(cudaMemcpy(x0, a.x, DIM * 4, cudaMemcpyDeviceToDevice));
    kv_cache c = make_cache(rows);
    ks_cuda_attn_params p = attn_params(a, c, rows);
    int nsm = 0, splits;
    CK(cudaDeviceGetAttribute(&nsm, cudaDevAttrMultiProcessorCount, 0));
    size_t wsb = ks_cuda_attn_decode_tc_workspace(&p, nsm, &splits);
    void *ws = wsb ? dmalloc(wsb) : NULL;
    double wbytes = (double)LAYERS * 2 * ((double)(DIM + 2 * KD) * DIM + (double)DIM * DIM + 3.0 * FFN * DIM) +
                    2.0 * VOCAB * DIM;
    double kvbytes = (double)LAYERS * 2 * NKV * rows * HD * 2;
    int fused_kv = 1;
    auto step = [&]() {
        CK(cudaMemcpyAsync(a.x, x0, DIM * 4, cudaMemcpyDeviceToDevice, S));
        for (int l = 0; l < LAYERS; l++) {
            float *ys[3] = {a.q, a.k, a.v};
            const void *wsg[3] = {w.wq, w.wk, w.wv};
            const float *bs[3] = {NULL, NULL, NULL};
            int rws[3] = {DIM, KD, KD}, rope[3] = {1, 1, 0};
            int row0[NKV];
            for (int h = 0; h < NKV; h++) row0[h] = rows;
            if (fused_kv) {
                ks_cuda_kv_row kr = {c.k, c.v, c.pos, c.cap, NKV, row0, NULL};
                KS(ks_cuda_gemv_qkv_kv(S, a.x, w.attn_norm, 1e-5f, a.xn, DIM, 3, ys, wsg, bs, rws, rope, HD, rows, g_inv,
                                       1.0f, &kr, g_pdl));
            } else {
                KS(ks_cuda_gemv_qkv(S, a.x, w.attn_norm, 1e-5f, a.xn, DIM, 3, ys, wsg, bs, rws, rope, HD, rows, g_inv, 1.0f, g_pdl));
                KS(ks_cuda_kv_append1(S, c.k, c.v, c.pos, c.cap, NKV, HD, a.k, a.v, rows, row0, g_pdl));
            }
            int nk[NKV];
            for (int h = 0; h < NKV; h++) nk[h] = rows + 1;
            KS(ks_cuda_attn_decode_tc1(S, pdl_of(&p), nk, rows, NULL, splits, ws));
            KS(ks_cuda_gemv_acc(S, a.x, a.att, w.wo, NULL, DIM, DIM, g_pdl));
            KS(ks_cuda_gemv_swiglu(S, a.gate, a.x, w.ffn_norm, 1e-5f, a.xn, w.wg, w.wu, DIM, FFN, g_pdl));
            KS(ks_cuda_gemv_acc(S, a.x, a.gate, w.wd, NULL, FFN, DIM, g_pdl));
        }
        KS(ks_cuda_gemv(S, a.logits, a.x, lm, NULL, DIM, VOCAB, g_pdl));
    };
    std::vector<float> h_off(VOCAB), h_on(VOCAB);
    char name[200];
    int pf_o[] = {0, 1024, 2048, 4096};
    for (int fk = 1; fk >= 0; fk--) {
        fused_kv = fk;
        for (int pdl = 0; pdl < 2; pdl++)
            for (int pf : pf_o) {
                if (g_quick && pf != 2048 && pf != 0) continue;
                if (!pdl && pf != 0 && pf != KS_CUDA_GEMV_PREFETCH) continue;
                g_pdl = pdl;
                ks_cuda_gemv_set_prefetch(pf);
                double ms = best_ms([&](int) { step(); }, 2, g_quick ? 5 : 20);
                snprintf(name, sizeof name, "step: KV append %s, PDL %s, prefetch %4d B/row (weights+KV)",
                         fk ? "fused" : "apart", pdl ? "on " : "off", pf);
                line(name, ms, wbytes + kvbytes);
                if (pf == KS_CUDA_GEMV_PREFETCH) {
                    CK(cudaStreamSynchronize(S));
                    CK(cudaMemcpy(pdl ? h_on.data() : h_off.data(), a.logits, (size_t)VOCAB * 4, cudaMemcpyDeviceToHost));
                }
            }
        int same = !memcmp(h_on.data(), h_off.data(), (size_t)VOCAB * 4), finite = 1;
        for (float f : h_on) finite &= isfinite(f) ? 1 : 0;
        printf("  KV append %s: logits with PDL on %s those with PDL off (all finite: %s)\n", fk ? "fused" : "apart",
               same ? "bit-identical to" : "DIFFER FROM", finite ? "yes" : "no");
    }
    g_pdl = 0;
    ks_cuda_gemv_set_prefetch(-1);
    printf("  floor at the copy rate: %.3f ms (weights %.2f GB + KV %.2f GB)\n", (wbytes + kvbytes) / (g_copy * 1e9) * 1e3,
           wbytes / 1e9, kvbytes / 1e9);
    cudaFree(ws);
    cudaFree(lm);
    cudaFree(x0);
    free_cache(c);
    free_layer(w);
    void *q[] = {a.x, a.xn, a.q, a.k, a.v, a.att, a.gate, a.logits};
    for (void *r : q) cudaFree(r);
}

/* ---------------------------------------------------------------- 4. graph and distinct weights */

/* The same step with every layer's own weights and KV cache (as in the engine: 15 GB of weights,
 * nothing reused) and/or replayed from a CUDA graph captured once (no per-kernel launch from the
 * host); logits compared bit for bit with the plain stream's. */
static void bench_graph(int rows) {
    printf("\n== decode step as a CUDA graph, shared vs distinct per-layer weights, %d cache rows ==\n", rows);
    size_t fr = 0, tot = 0;
    CK(cudaMemGetInfo(&fr, &tot));
    double need = (double)LAYERS * (2.0 * ((double)(DIM + 2 * KD) * DIM + (double)DIM * DIM + 3.0 * FFN * DIM) +
                                    2.0 * 2 * NKV * (rows + 64.0) * HD) + 4e9;
    int can_distinct = need < (double)fr;
    std::vector<layer_w> W;
    std::vector<kv_cache> C;
    for (int l = 0; l < (can_distinct ? LAYERS : 1); l++) {
        W.push_back(make_layer(1000 + 10 * l));
        C.push_back(make_cache(rows));
    }
    void *lm = rnd_bf16((size_t)VOCAB * DIM, 2000, 1.0f / sqrtf((float)DIM));
    acts a = make_acts();
    float *x0 = (float *)dmalloc(DIM * 4);
    CK(cudaMemcpy(x0, a.x, DIM * 4, cudaMemcpyDeviceToDevice));
    int nsm = 0, splits;
    CK(cudaDeviceGetAttribute(&nsm, cudaDevAttrMultiProcessorCount, 0));
    ks_cuda_attn_params p0 = attn_params(a, C[0], rows);
    size_t wsb = ks_cuda_attn_decode_tc_workspace(&p0, nsm, &splits);
    void *ws = wsb ? dmalloc(wsb) : NULL;
    double wbytes = (double)LAYERS * 2 * ((double)(DIM + 2 * KD) * DIM + (double)DIM * DIM + 3.0 * FFN * DIM) +
                    2.0 * VOCAB * DIM;
    double kvbytes = (double)LAYERS * 2 * NKV * rows * HD * 2;
    int distinct = 0;
    auto step = [&]() {
        CK(cudaMemcpyAsync(a.x, x0, DIM * 4, cudaMemcpyDeviceToDevice, S));
        for (int l = 0; l < LAYERS; l++) {
            const layer_w &w = W[distinct ? l : 0];
            const kv_cache &c = C[distinct ? l : 0];
            float *ys[3] = {a.q, a.k, a.v};
            const void *wsg[3] = {w.wq, w.wk, w.wv};
            const float *bs[3] = {NULL, NULL, NULL};
            int rws[3] = {DIM, KD, KD}, rope[3] = {1, 1, 0};
            int row0[NKV], nk[NKV];
            for (int h = 0; h < NKV; h++) { row0[h] = rows; nk[h] = rows + 1; }
            ks_cuda_kv_row kr = {c.k, c.v, c.pos, c.cap, NKV, row0, NULL};
            KS(ks_cuda_gemv_qkv_kv(S, a.x, w.attn_norm, 1e-5f, a.xn, DIM, 3, ys, wsg, bs, rws, rope, HD, rows, g_inv, 1.0f,
                                   &kr, g_pdl));
            ks_cuda_attn_params p = attn_params(a, c, rows);
            KS(ks_cuda_attn_decode_tc1(S, pdl_of(&p), nk, rows, NULL, splits, ws));
            KS(ks_cuda_gemv_acc(S, a.x, a.att, w.wo, NULL, DIM, DIM, g_pdl));
            KS(ks_cuda_gemv_swiglu(S, a.gate, a.x, w.ffn_norm, 1e-5f, a.xn, w.wg, w.wu, DIM, FFN, g_pdl));
            KS(ks_cuda_gemv_acc(S, a.x, a.gate, w.wd, NULL, FFN, DIM, g_pdl));
        }
        KS(ks_cuda_gemv(S, a.logits, a.x, lm, NULL, DIM, VOCAB, g_pdl));
    };
    std::vector<float> h_ref(VOCAB), h_g(VOCAB);
    char name[200];
    for (int d = 0; d < (can_distinct ? 2 : 1); d++) {
        distinct = d;
        /* host enqueue time of one step (no sync inside) */
        CK(cudaStreamSynchronize(S));
        double t0 = ks_now();
        step();
        double th = ks_now() - t0;
        CK(cudaStreamSynchronize(S));
        double ms = best_ms([&](int) { step(); }, 2, g_quick ? 5 : 20);
        snprintf(name, sizeof name, "step, %s weights, stream launches (host enqueue %.2f ms)", d ? "distinct" : "shared",
                 th * 1e3);
        line(name, ms, wbytes + kvbytes);
        CK(cudaStreamSynchronize(S));
        CK(cudaMemcpy(h_ref.data(), a.logits, (size_t)VOCAB * 4, cudaMemcpyDeviceToHost));
        cudaGraph_t g;
        cudaGraphExec_t ge;
        CK(cudaStreamBeginCapture(S, cudaStreamCaptureModeThreadLocal));
        step();
        CK(cudaStreamEndCapture(S, &g));
        CK(cudaGraphInstantiate(&ge, g, 0));
        size_t nn = 0;
        CK(cudaGraphGetNodes(g, NULL, &nn));
        t0 = ks_now();
        CK(cudaGraphLaunch(ge, S));
        th = ks_now() - t0;
        ms = best_ms([&](int) { CK(cudaGraphLaunch(ge, S)); }, 2, g_quick ? 5 : 20);
        snprintf(name, sizeof name, "step, %s weights, CUDA graph of %zu nodes (host launch %.3f ms)",
                 d ? "distinct" : "shared", nn, th * 1e3);
        line(name, ms, wbytes + kvbytes);
        CK(cudaStreamSynchronize(S));
        CK(cudaMemcpy(h_g.data(), a.logits, (size_t)VOCAB * 4, cudaMemcpyDeviceToHost));
        printf("  graph logits %s the stream's\n",
               !memcmp(h_g.data(), h_ref.data(), (size_t)VOCAB * 4) ? "bit-identical to" : "DIFFER FROM");
        /* the turnaround the engine adds: logits to pageable vs pinned host memory */
        float *pin = NULL;
        CK(cudaMallocHost((void **)&pin, (size_t)VOCAB * 4));
        double dm = best_ms([&](int) { CK(cudaMemcpyAsync(h_g.data(), a.logits, (size_t)VOCAB * 4, cudaMemcpyDeviceToHost, S)); });
        double dp = best_ms([&](int) { CK(cudaMemcpyAsync(pin, a.logits, (size_t)VOCAB * 4, cudaMemcpyDeviceToHost, S)); });
        printf("  logits download: pageable %.4f ms, pinned %.4f ms\n", dm, dp);
        CK(cudaFreeHost(pin));
        CK(cudaGraphExecDestroy(ge));
        CK(cudaGraphDestroy(g));
    }
    if (!can_distinct) printf("  (distinct weights skipped: %.1f GB free, %.1f GB needed)\n", fr / 1e9, need / 1e9);
    cudaFree(ws);
    cudaFree(lm);
    cudaFree(x0);
    for (auto &c : C) free_cache(c);
    for (auto &w : W) free_layer(w);
    void *q[] = {a.x, a.xn, a.q, a.k, a.v, a.att, a.gate, a.logits};
    for (void *r : q) cudaFree(r);
}

int main(int argc, char **argv) {
    int ctx_long = 131072;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick")) g_quick = 1;
        else if (!strcmp(argv[i], "--graph")) g_graph_only = 1;
        else if (!strcmp(argv[i], "--ctx") && i + 1 < argc) ctx_long = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: %s [--quick] [--graph] [--ctx N]\n", argv[0]);
            return 2;
        }
    }
    CK(cudaSetDevice(0));
    CK(cudaStreamCreateWithFlags(&S, cudaStreamNonBlocking));
    cudaDeviceProp pr;
    CK(cudaGetDeviceProperties(&pr, 0));
    printf("device: %s, %d SMs, L2 %d MB; PDL at start %s (each section sets its own)\n", pr.name, pr.multiProcessorCount,
           pr.l2CacheSize >> 20, g_pdl ? "on" : "off");
    {
        size_t bytes = (size_t)1 << 30;
        void *s = dmalloc(bytes), *d = dmalloc(bytes);
        CK(cudaMemset(s, 1, bytes));
        double ms = best_ms([&](int) { CK(cudaMemcpyAsync(d, s, bytes, cudaMemcpyDeviceToDevice, S)); });
        g_copy = 2.0 * bytes / (ms * 1e-3) / 1e9;
        printf("device-to-device copy (read + write): %.0f GB/s\n", g_copy);
        cudaFree(s);
        cudaFree(d);
    }
    {
        float inv[HD / 2];
        for (int i = 0; i < HD / 2; i++) inv[i] = (float)pow(500000.0, -2.0 * i / HD);
        g_inv = (float *)dmalloc(sizeof inv);
        CK(cudaMemcpy(g_inv, inv, sizeof inv, cudaMemcpyHostToDevice));
    }
    if (!g_graph_only) {
        bench_gemv_shapes();
        bench_attention(2048);
        if (!g_quick) bench_attention(ctx_long);
    }
    if (!g_graph_only) {
        bench_sequence(2048);
        if (!g_quick) bench_sequence(ctx_long);
    }
    bench_graph(2048);
    if (!g_quick) bench_graph(ctx_long);
    cudaFree(g_inv);
    CK(cudaStreamDestroy(S));
    return 0;
}
