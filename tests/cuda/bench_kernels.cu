/* bench_kernels.cu — per-kernel benchmark of the CUDA backend next to two measured ceilings:
 * a device-to-device copy (GB/s, bytes read + written) and a cuBLAS bf16 GEMM 8192^3
 * (TFLOP/s). Each number is the median of timed repeats (CUDA events) after warm-up, on
 * random data (never zeros); memory-bound kernels rotate over several buffers so that repeats
 * do not run out of L2. Prints one table; "--quick" runs smaller sizes.
 *
 * FLOP conventions: attention = 4 * d * (visible query-key pairs) per head (QK^T and PV),
 * so causal attention counts the causal half, as FlashAttention reports it. */
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>

#include "common.cuh"
#include "ks_cuda.h"
#include "ks_cuda_page.h"
#include "rope_table.cuh"
#ifdef KS_PH
extern "C" void ks_ph_read(unsigned long long *h);
#endif

static int g_quick;
static cudaStream_t S;

#define CK(x)                                                                                   \
    do {                                                                                        \
        cudaError_t e_ = (x);                                                                   \
        if (e_) { fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, cudaGetErrorString(e_)); exit(1); } \
    } while (0)
#define KS(x)                                                                                   \
    do {                                                                                        \
        ks_status s_ = (x);                                                                     \
        if (s_) { fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, ks_last_error()); exit(1); } \
    } while (0)

template <typename F> static double time_ms(F fn, int warm = 3, int reps = 15) {
    for (int i = 0; i < warm; i++) fn(i);
    CK(cudaStreamSynchronize(S));
    std::vector<double> t;
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    for (int i = 0; i < reps; i++) {
        CK(cudaEventRecord(a, S));
        fn(warm + i);
        CK(cudaEventRecord(b, S));
        CK(cudaEventSynchronize(b));
        float ms;
        CK(cudaEventElapsedTime(&ms, a, b));
        t.push_back(ms);
    }
    CK(cudaGetLastError());
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
}

/* The device time of fn a call: 20 calls captured in one graph, the replay timed as above, over
 * 20 (no host launch gaps: short kernels such as the top-k cost the host more than the GPU). */
template <typename F> static double graph_ms(F fn) {
    const int calls = 20;
    cudaGraph_t g;
    cudaGraphExec_t ge;
    CK(cudaStreamBeginCapture(S, cudaStreamCaptureModeThreadLocal));
    for (int i = 0; i < calls; i++) fn();
    CK(cudaStreamEndCapture(S, &g));
    CK(cudaGraphInstantiate(&ge, g, 0));
    const double ms = time_ms([&](int) { CK(cudaGraphLaunch(ge, S)); }) / calls;
    cudaGraphExecDestroy(ge);
    cudaGraphDestroy(g);
    return ms;
}

static void *dmalloc(size_t bytes) {
    void *p;
    CK(cudaMalloc(&p, bytes));
    return p;
}
static void *drand_bf16(size_t n, uint64_t seed, float scale) {
    void *p = dmalloc(n * 2);
    KS(ks_cuda_random(S, p, KS_CUDA_BF16, (int64_t)(n / 64), 64, seed, scale, 0.f));
    return p;
}
static float *drand_f32(size_t n, uint64_t seed, float scale) {
    float *p = (float *)dmalloc(n * 4);
    KS(ks_cuda_random(S, p, KS_CUDA_F32, (int64_t)(n / 64), 64, seed, scale, 0.f));
    return p;
}
static int32_t *dints(const std::vector<int32_t> &v) {
    int32_t *p = (int32_t *)dmalloc(v.size() * 4 + 4);
    CK(cudaMemcpy(p, v.data(), v.size() * 4, cudaMemcpyHostToDevice));
    return p;
}

struct row { char name[96]; double ms, val; const char *unit; double pct; };
static std::vector<row> rows;
static double g_copy_gbs, g_gemm_tflops;

static void report(const char *name, double ms, double val, const char *unit) {
    row r;
    snprintf(r.name, sizeof r.name, "%s", name);
    r.ms = ms;
    r.val = val;
    r.unit = unit;
    r.pct = !strcmp(unit, "GB/s") ? (g_copy_gbs > 0 ? 100 * val / g_copy_gbs : 0)
          : !strcmp(unit, "TFLOP/s") ? (g_gemm_tflops > 0 ? 100 * val / g_gemm_tflops : 0) : 0;
    rows.push_back(r);
    printf("%-64s %10.4f ms %10.1f %-8s %5.0f%%\n", r.name, ms, val, unit, r.pct);
    fflush(stdout);
}

/* ---------------------------------------------------------------- ceilings */

static void bench_ceilings(cublasHandle_t h) {
    size_t bytes = (size_t)(g_quick ? 256 : 2048) << 20;
    void *a = dmalloc(bytes), *b = dmalloc(bytes);
    KS(ks_cuda_random(S, a, KS_CUDA_F32, (int64_t)(bytes / 4 / 64), 64, 1, 1.f, 0.f));
    double ms = time_ms([&](int) { CK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, S)); });
    g_copy_gbs = 2.0 * bytes / (ms * 1e-3) / 1e9;
    report("ceiling: device-to-device copy (read + write)", ms, g_copy_gbs, "GB/s");
    cudaFree(a);
    cudaFree(b);

    int N = g_quick ? 4096 : 8192;
    void *A = drand_bf16((size_t)N * N, 2, 1.f), *B = drand_bf16((size_t)N * N, 3, 1.f);
    void *C = dmalloc((size_t)N * N * 4);
    float one = 1, zero = 0;
    char name[96];
    ms = time_ms([&](int) {
        cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, N, N, N, &one, A, CUDA_R_16BF, N, B, CUDA_R_16BF, N, &zero, C,
                     CUDA_R_16BF, N, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    });
    g_gemm_tflops = 2.0 * N * N * (double)N / (ms * 1e-3) / 1e12;
    snprintf(name, sizeof name, "ceiling: cuBLAS bf16 GEMM %d^3 (bf16 out)", N);
    report(name, ms, g_gemm_tflops, "TFLOP/s");
    ms = time_ms([&](int) {
        cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, N, N, N, &one, A, CUDA_R_16BF, N, B, CUDA_R_16BF, N, &zero, C,
                     CUDA_R_32F, N, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    });
    snprintf(name, sizeof name, "cuBLAS bf16 GEMM %d^3 (f32 out, the backend's matmul)", N);
    report(name, ms, 2.0 * N * N * (double)N / (ms * 1e-3) / 1e12, "TFLOP/s");
    cudaFree(A);
    cudaFree(B);
    cudaFree(C);
}

/* ---------------------------------------------------------------- attention */

/* one KV cache of Hkv heads x cap rows, positions 0..cap-1 */
struct cache { void *k, *v; int32_t *pos, *nk; int cap, Hkv, d; };
static cache make_cache(int Hkv, int cap, int d, uint64_t seed) {
    cache c;
    c.cap = cap;
    c.Hkv = Hkv;
    c.d = d;
    c.k = drand_bf16((size_t)Hkv * cap * d, seed, 1.f);
    c.v = drand_bf16((size_t)Hkv * cap * d, seed + 1, 1.f);
    std::vector<int32_t> pos((size_t)Hkv * cap), nk(Hkv, cap);
    for (int h = 0; h < Hkv; h++)
        for (int j = 0; j < cap; j++) pos[(size_t)h * cap + j] = j;
    c.pos = dints(pos);
    c.nk = dints(nk);
    return c;
}
static void free_cache(cache &c) {
    cudaFree(c.k);
    cudaFree(c.v);
    cudaFree(c.pos);
    cudaFree(c.nk);
}

static void bench_prefill(int n, int H, int Hkv, int d, int causal, int window, int variant = 1) {
    cache c = make_cache(Hkv, n, d, 10);
    float *q = drand_f32((size_t)n * H * d, 20, 1.f), *out = (float *)dmalloc((size_t)n * H * d * 4);
    std::vector<int32_t> qp(n);
    for (int i = 0; i < n; i++) qp[i] = causal ? i : n - 1;
    int32_t *dq = dints(qp);
    ks_cuda_attn_params p;
    memset(&p, 0, sizeof p);
    p.out = out; p.q = q; p.k = c.k; p.v = c.v; p.kpos = c.pos; p.qpos = dq; p.nk = c.nk;
    p.n = n; p.n_heads = H; p.n_kv_heads = Hkv; p.head_dim = d; p.capacity = n; p.max_nk = n;
    p.scale = 1.0f / sqrtf((float)d); p.window = window;
    void *ws = dmalloc(ks_cuda_attn_prefill_workspace(&p));
    double pairs = 0;
    for (int i = 0; i < n; i++) {
        int lo = 0, hi = causal ? i : n - 1;
        if (window > 0) lo = std::max(0, qp[i] - window + 1);
        pairs += hi - lo + 1;
    }
    double ms = time_ms([&](int) { KS(ks_cuda_attn_prefill_mma_variant(S, &p, ws, variant)); }, 2, g_quick ? 5 : 10);
    char name[96];
    snprintf(name, sizeof name, "flash v%d prefill n=%d H=%d/%d d=%d %s%s", variant, n, H, Hkv, d,
             causal ? "causal" : "full", window ? " window" : "");
    report(name, ms, 4.0 * d * pairs * H / (ms * 1e-3) / 1e12, "TFLOP/s");
    cudaFree(ws);
    cudaFree(q);
    cudaFree(out);
    cudaFree(dq);
    free_cache(c);
}

static void bench_decode(int ctx, int H, int Hkv, int d, int n_idx, int tc = 1) {
    /* rotate over several caches so the total exceeds L2 several times */
    size_t one = (size_t)Hkv * ctx * d * 2 * 2;
    int nc = (int)std::max<size_t>(1, std::min<size_t>(16, ((size_t)512 << 20) / one + 1));
    std::vector<cache> cs;
    for (int i = 0; i < nc; i++) cs.push_back(make_cache(Hkv, ctx, d, 100 + 2 * i));
    float *q = drand_f32((size_t)H * d, 30, 1.f), *out = (float *)dmalloc((size_t)H * d * 4);
    std::vector<int32_t> qp(1, ctx - 1);
    int32_t *dq = dints(qp);
    int32_t *didx = NULL, *doff = NULL, *dnk = NULL;
    if (n_idx) { /* TokenSelect-like: a spread subset of each head's rows */
        std::vector<int32_t> idx, off, nk;
        for (int h = 0; h < Hkv; h++) {
            off.push_back((int32_t)idx.size());
            for (int t = 0; t < n_idx; t++) idx.push_back((int32_t)((long long)t * ctx / n_idx));
            nk.push_back(n_idx);
        }
        didx = dints(idx);
        doff = dints(off);
        dnk = dints(nk);
    }
    ks_cuda_attn_params p;
    memset(&p, 0, sizeof p);
    p.out = out; p.q = q; p.qpos = dq; p.n = 1; p.n_heads = H; p.n_kv_heads = Hkv; p.head_dim = d;
    p.capacity = ctx; p.max_nk = n_idx ? n_idx : ctx; p.scale = 1.0f / sqrtf((float)d);
    p.idx = didx; p.idx_off = doff;
    int nsm;
    CK(cudaDeviceGetAttribute(&nsm, cudaDevAttrMultiProcessorCount, 0));
    int splits;
    tc = tc && ks_cuda_attn_decode_tc_supported(&p);
    size_t wsb = tc ? ks_cuda_attn_decode_tc_workspace(&p, nsm, &splits) : ks_cuda_attn_decode_workspace(&p, nsm, &splits);
    void *ws = wsb ? dmalloc(wsb) : NULL;
    double ms = time_ms([&](int i) {
        cache &c = cs[i % nc];
        ks_cuda_attn_params pp = p;
        pp.k = c.k; pp.v = c.v; pp.kpos = c.pos; pp.nk = dnk ? dnk : c.nk;
        if (tc) KS(ks_cuda_attn_decode_tc(S, &pp, splits, ws));
        else KS(ks_cuda_attn_decode(S, &pp, splits, ws));
    }, 3, 30);
    double rows_read = n_idx ? n_idx : ctx;
    double bytes = rows_read * Hkv * d * 2 * 2 + rows_read * Hkv * 4;
    char name[96];
    snprintf(name, sizeof name, "decode %s ctx=%d H=%d/%d d=%d%s (splits %d)", tc ? "tensor-core" : "f32 split-KV",
             ctx, H, Hkv, d, n_idx ? " idx" : "", splits);
    report(name, ms, bytes / (ms * 1e-3) / 1e9, "GB/s");
    if (ws) cudaFree(ws);
    cudaFree(q); cudaFree(out); cudaFree(dq);
    if (didx) { cudaFree(didx); cudaFree(doff); cudaFree(dnk); }
    for (auto &c : cs) free_cache(c);
}

/* ---------------------------------------------------------------- dense ops */

static void bench_matmul(cublasHandle_t h, int n, int in, int out) {
    size_t wbytes = (size_t)in * out * 2; /* rotate weights for the bandwidth-bound GEMV (beyond L2) */
    int nb = n == 1 ? (int)std::max<size_t>(1, std::min<size_t>(8, ((size_t)512 << 20) / wbytes)) : 1;
    std::vector<void *> W;
    for (int i = 0; i < nb; i++) W.push_back(drand_bf16((size_t)in * out, 40 + i, 0.1f));
    float *x = drand_f32((size_t)n * in, 50, 1.f), *y = (float *)dmalloc((size_t)n * out * 4);
    void *xb = dmalloc((size_t)n * in * 2);
    float one = 1, zero = 0;
    double ms = time_ms([&](int i) {
        KS(ks_cuda_convert(S, xb, KS_CUDA_BF16, x, KS_CUDA_F32, (size_t)n * in));
        cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, out, n, in, &one, W[i % nb], CUDA_R_16BF, in, xb, CUDA_R_16BF, in,
                     &zero, y, CUDA_R_32F, out, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    });
    char name[96];
    snprintf(name, sizeof name, "matmul (convert + cuBLAS) n=%d in=%d out=%d", n, in, out);
    if (n == 1) report(name, ms, ((double)in * out * 2 + in * 4 + out * 4) / (ms * 1e-3) / 1e9, "GB/s");
    else report(name, ms, 2.0 * n * in * out / (ms * 1e-3) / 1e12, "TFLOP/s");
    if (n == 1 && ks_cuda_gemv_supported(W[0], in)) {
        ms = time_ms([&](int i) { KS(ks_cuda_gemv(S, y, x, W[i % nb], NULL, in, out, 0)); });
        snprintf(name, sizeof name, "gemv kernel (the backend's n=1 path) in=%d out=%d", in, out);
        report(name, ms, ((double)in * out * 2 + in * 4 + out * 4) / (ms * 1e-3) / 1e9, "GB/s");
    }
    for (void *w : W) cudaFree(w);
    cudaFree(x); cudaFree(y); cudaFree(xb);
}

static void bench_elementwise() {
    size_t n = (size_t)(g_quick ? 16 : 64) << 20; /* floats */
    float *a = drand_f32(n, 60, 1.f), *b = drand_f32(n, 61, 1.f), *c = (float *)dmalloc(n * 4);
    double ms = time_ms([&](int) { KS(ks_cuda_add(S, a, b, n)); });
    report("add (x += y)", ms, 3.0 * n * 4 / (ms * 1e-3) / 1e9, "GB/s");
    ms = time_ms([&](int) { KS(ks_cuda_swiglu(S, c, a, b, n)); });
    report("swiglu", ms, 3.0 * n * 4 / (ms * 1e-3) / 1e9, "GB/s");
    int dim = 4096, rows_ = (int)(n / dim);
    float *w = drand_f32(dim, 62, 1.f);
    ms = time_ms([&](int) { KS(ks_cuda_rmsnorm(S, c, a, w, rows_, dim, 1e-5f)); });
    report("rmsnorm dim=4096", ms, 2.0 * n * 4 / (ms * 1e-3) / 1e9, "GB/s");
    int hd = 128, heads = (int)(n / hd / 4096);
    std::vector<int32_t> pos(4096), inv(hd / 2);
    for (int i = 0; i < 4096; i++) pos[i] = i;
    int32_t *dpos = dints(pos);
    float *dinv = (float *)dmalloc(hd / 2 * 4);
    std::vector<float> invf(hd / 2);
    for (int k = 0; k < hd / 2; k++) invf[k] = powf(10000.f, -2.f * k / hd);
    CK(cudaMemcpy(dinv, invf.data(), hd / 2 * 4, cudaMemcpyHostToDevice));
    ms = time_ms([&](int) { KS(ks_cuda_rope(S, a, 4096, heads, hd, dpos, 0, dinv, 1.f)); });
    report("rope hd=128 (in place)", ms, 2.0 * 4096 * heads * hd * 4 / (ms * 1e-3) / 1e9, "GB/s");
    /* kv append of 4096 rows, 8 heads, d 128 */
    int H = 8, d = 128, m = 4096, cap = 8192;
    void *K = dmalloc((size_t)H * cap * d * 2), *V = dmalloc((size_t)H * cap * d * 2);
    int32_t *P = (int32_t *)dmalloc((size_t)H * cap * 4);
    std::vector<int32_t> r0(H, 0);
    int32_t *dr0 = dints(r0);
    ms = time_ms([&](int) { KS(ks_cuda_kv_append(S, K, V, P, cap, H, d, a, b, dpos, dr0, m)); });
    report("kv_append 4096 rows x 8 heads x 128", ms, ((double)m * H * d * (8 + 4)) / (ms * 1e-3) / 1e9, "GB/s");
    cudaFree(K); cudaFree(V); cudaFree(P); cudaFree(dr0);
    cudaFree(a); cudaFree(b); cudaFree(c); cudaFree(w); cudaFree(dpos); cudaFree(dinv);
}

/* TokenSelect's decode selection at one layer (Llama-3.1-8B shape: 32 query heads, 8 KV heads,
 * d 128, bf16 keys in the cache layout (Hkv, capacity, d)): the head vote over the candidates
 * [128, ctx - 512) (ks_cuda_scores, softmax, sum over heads) and the top-2048 of it
 * (ks_cuda_topk), each alone and together. Bytes: the candidate keys once. */
static void *sel_alloc(void *, size_t bytes) {
    void *p = NULL;
    return cudaMallocAsync(&p, bytes, S) ? NULL : p;
}
static void sel_free(void *, void *p) { cudaFreeAsync(p, S); }

static void bench_select(int ctx) {
    /* keep freed scratch in the pool, as the backend's pool does */
    cudaMemPool_t pool;
    CK(cudaDeviceGetDefaultMemPool(&pool, 0));
    uint64_t keep = UINT64_MAX;
    CK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep));
    const int H = 32, Hkv = 8, d = 128, cap = ctx + 64, lo = 128, hi = ctx - 512, k = 2048;
    void *K = drand_bf16((size_t)Hkv * cap * d, 70, 1.f);
    float *q = drand_f32((size_t)H * d, 71, 1.f), *vote = (float *)dmalloc(sizeof(float) * (hi - lo));
    int32_t *top = (int32_t *)dmalloc(sizeof(int32_t) * k);
    ks_cuda_scratch sc = {sel_alloc, sel_free, NULL};
    ks_scores_opts o = ks_scores_opts_default();
    o.scale_mode = KS_SCALE_ONE;
    o.softmax = 1;
    o.heads = KS_HEADS_SUM;
    o.k_head_stride = (int64_t)cap * d;
    o.k_row_stride = d;
    o.k_begin = lo;
    o.k_end = hi;
    o.out_begin = lo;
    o.out_end = hi;
    double kb = (double)Hkv * (hi - lo) * d * 2;
    char name[96];
    double ms = time_ms([&](int) { KS(ks_cuda_scores(S, &sc, q, NULL, H, 1, K, 1, NULL, Hkv, ctx, d, &o, vote)); });
    snprintf(name, sizeof name, "select: scores (vote) ctx=%d", ctx);
    report(name, ms, kb / (ms * 1e-3) / 1e9, "GB/s");
    ms = time_ms([&](int) { KS(ks_cuda_topk(S, &sc, vote, 1, hi - lo, k, 0, KS_TOPK_BY_INDEX, top, NULL)); });
    snprintf(name, sizeof name, "select: topk %d of %d", k, hi - lo);
    report(name, ms, (double)(hi - lo) * 4 * 5 / (ms * 1e-3) / 1e9, "GB/s");
    ms = graph_ms([&] { KS(ks_cuda_topk(S, &sc, vote, 1, hi - lo, k, 0, KS_TOPK_BY_INDEX, top, NULL)); });
    snprintf(name, sizeof name, "select: topk %d of %d, graph of 20 (a call)", k, hi - lo);
    report(name, ms, (double)(hi - lo) * 4 * 5 / (ms * 1e-3) / 1e9, "GB/s");
    ms = time_ms([&](int) {
        KS(ks_cuda_scores(S, &sc, q, NULL, H, 1, K, 1, NULL, Hkv, ctx, d, &o, vote));
        KS(ks_cuda_topk(S, &sc, vote, 1, hi - lo, k, 0, KS_TOPK_BY_INDEX, top, NULL));
    });
    snprintf(name, sizeof name, "select: scores + topk ctx=%d", ctx);
    report(name, ms, kb / (ms * 1e-3) / 1e9, "GB/s");
    /* the same launches replayed from a graph: the device time without the host's launch gaps */
    cudaGraph_t g;
    cudaGraphExec_t ge;
    CK(cudaStreamBeginCapture(S, cudaStreamCaptureModeThreadLocal));
    KS(ks_cuda_scores(S, &sc, q, NULL, H, 1, K, 1, NULL, Hkv, ctx, d, &o, vote));
    KS(ks_cuda_topk(S, &sc, vote, 1, hi - lo, k, 0, KS_TOPK_BY_INDEX, top, NULL));
    CK(cudaStreamEndCapture(S, &g));
    CK(cudaGraphInstantiate(&ge, g, 0));
    ms = time_ms([&](int) { CK(cudaGraphLaunch(ge, S)); });
    snprintf(name, sizeof name, "select: scores + topk ctx=%d, graph replay", ctx);
    report(name, ms, kb / (ms * 1e-3) / 1e9, "GB/s");
    cudaGraphExecDestroy(ge);
    cudaGraphDestroy(g);
    cudaFree(K); cudaFree(q); cudaFree(vote); cudaFree(top);
}

/* ks_cuda_topk alone on one row of random floats, by index: the rows either side of the
 * cluster path's limit (262138 keys: 16 blocks of 16384 in registers; 262139 takes the six
 * kernels). */
static void bench_topk_row(int n, int k) {
    cudaMemPool_t pool;
    CK(cudaDeviceGetDefaultMemPool(&pool, 0));
    uint64_t keep = UINT64_MAX;
    CK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep));
    float *x = drand_f32(((size_t)n + 63) / 64 * 64, 90, 1.f);
    int32_t *top = (int32_t *)dmalloc(sizeof(int32_t) * k);
    ks_cuda_scratch sc = {sel_alloc, sel_free, NULL};
    double ms = time_ms([&](int) { KS(ks_cuda_topk(S, &sc, x, 1, n, k, 0, KS_TOPK_BY_INDEX, top, NULL)); });
    char name[96];
    snprintf(name, sizeof name, "topk %d of %d random (1 row)", k, n);
    report(name, ms, (double)n * 4 / (ms * 1e-3) / 1e9, "GB/s");
    cudaFree(x);
    cudaFree(top);
}

/* Quest's decode selection at one layer (policies/quest.lua; Llama-3.1-8B shape, page 16, budget
 * 4096): min / max summaries of the complete pages of the cached keys (ks_cuda_page_reduce over
 * the cache layout (Hkv, capacity, d), bf16), their upper bounds for the 32 query heads combined
 * by the group max (ks_cuda_bound_scores), the top 255 pages per KV head (ks_cuda_topk) and their
 * rows plus the current page's (ks_cuda_page_rows); each alone, then together. The bounds are
 * also timed over RB copies of the summaries in turn, as f32 lo / hi and as packed bf16 boxes
 * (ks_cuda_page_box, ks_cuda_bound_scores_box), so that no repeat finds them in L2 (in a
 * decode step a layer's summaries were last read a whole step before). */
static void bench_quest(int ctx) {
    cudaMemPool_t pool;
    CK(cudaDeviceGetDefaultMemPool(&pool, 0));
    uint64_t keep = UINT64_MAX;
    CK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep));
    const int H = 32, Hkv = 8, d = 128, cap = ctx + 64, P = 16, N = ctx, last = (N - 1) / P, K = 4096 / P - 1;
    const int w = K * P + (N - last * P);
    void *Kc = drand_bf16((size_t)Hkv * cap * d, 80, 1.f);
    float *q = drand_f32((size_t)H * d, 81, 1.f);
    float *lo = (float *)dmalloc(sizeof(float) * (size_t)last * Hkv * d), *hi = (float *)dmalloc(sizeof(float) * (size_t)last * Hkv * d);
    float *bound = (float *)dmalloc(sizeof(float) * (size_t)Hkv * last);
    int32_t *top = (int32_t *)dmalloc(sizeof(int32_t) * Hkv * K), *rows = (int32_t *)dmalloc(sizeof(int32_t) * (size_t)Hkv * w);
    ks_cuda_scratch sc = {sel_alloc, sel_free, NULL};
    double kb = (double)last * P * Hkv * d * 2, sb = (double)last * Hkv * d * 4 * 2;
    char name[96];
    auto reduce = [&] { KS(ks_cuda_page_reduce(S, Kc, 1, N, Hkv, d, d, (int64_t)cap * d, P, 0, last, lo, hi, NULL)); };
    auto bounds = [&] { KS(ks_cuda_bound_scores(S, q, H, lo, hi, last, Hkv, d, KS_BOUND_GROUP_MAX, bound)); };
    auto topk = [&] { KS(ks_cuda_topk(S, &sc, bound, Hkv, last, K, 0, KS_TOPK_BY_INDEX, top, NULL)); };
    auto prows = [&] { KS(ks_cuda_page_rows(S, top, Hkv, K, P, N, 0, 0, (int64_t)last * P, N, rows, NULL)); };
    double ms = time_ms([&](int) { reduce(); });
    snprintf(name, sizeof name, "quest: page_reduce minmax ctx=%d (%d pages)", ctx, last);
    report(name, ms, (kb + sb) / (ms * 1e-3) / 1e9, "GB/s");
    ms = time_ms([&](int) { bounds(); });
    snprintf(name, sizeof name, "quest: bound_scores group_max ctx=%d", ctx);
    report(name, ms, sb / (ms * 1e-3) / 1e9, "GB/s");
    ms = time_ms([&](int) { topk(); });
    snprintf(name, sizeof name, "quest: topk %d of %d pages x %d heads", K, last, Hkv);
    report(name, ms, (double)Hkv * last * 4 / (ms * 1e-3) / 1e9, "GB/s");
    ms = graph_ms([&] { topk(); });
    snprintf(name, sizeof name, "quest: topk %d of %d pages x %d heads, graph of 20 (a call)", K, last, Hkv);
    report(name, ms, (double)Hkv * last * 4 / (ms * 1e-3) / 1e9, "GB/s");
    ms = time_ms([&](int) { prows(); });
    snprintf(name, sizeof name, "quest: page_rows %d rows x %d heads", w, Hkv);
    report(name, ms, (double)Hkv * w * 4 / (ms * 1e-3) / 1e9, "GB/s");
    ms = time_ms([&](int) { reduce(); bounds(); topk(); prows(); });
    snprintf(name, sizeof name, "quest: all four ctx=%d", ctx);
    report(name, ms, (kb + 2 * sb) / (ms * 1e-3) / 1e9, "GB/s");
    ms = time_ms([&](int) { bounds(); topk(); prows(); });
    snprintf(name, sizeof name, "quest: bounds + topk + page_rows (summaries kept) ctx=%d", ctx);
    report(name, ms, sb / (ms * 1e-3) / 1e9, "GB/s");
    /* rotating copies: RB x the summaries > 2 x L2 at 32K too */
    enum { RB = 8 };
    float *rlo[RB], *rhi[RB];
    uint32_t *rbox[RB];
    for (int i = 0; i < RB; i++) {
        rlo[i] = (float *)dmalloc(sizeof(float) * (size_t)last * Hkv * d);
        rhi[i] = (float *)dmalloc(sizeof(float) * (size_t)last * Hkv * d);
        rbox[i] = (uint32_t *)dmalloc(sizeof(uint32_t) * (size_t)last * Hkv * d);
        KS(ks_cuda_page_reduce(S, Kc, 1, N, Hkv, d, d, (int64_t)cap * d, P, 0, last, rlo[i], rhi[i], NULL));
        KS(ks_cuda_page_box(S, Kc, 1, N, Hkv, d, d, (int64_t)cap * d, P, 0, last, rbox[i]));
    }
    ms = time_ms([&](int i) { KS(ks_cuda_bound_scores(S, q, H, rlo[i % RB], rhi[i % RB], last, Hkv, d, KS_BOUND_GROUP_MAX, bound)); });
    snprintf(name, sizeof name, "quest: bound_scores f32 lo/hi, %d copies in turn ctx=%d", (int)RB, ctx);
    report(name, ms, sb / (ms * 1e-3) / 1e9, "GB/s");
    ms = time_ms([&](int i) { KS(ks_cuda_bound_scores_box(S, q, H, rbox[i % RB], last, Hkv, d, KS_BOUND_GROUP_MAX, bound)); });
    snprintf(name, sizeof name, "quest: bound_scores packed boxes, %d copies in turn ctx=%d", (int)RB, ctx);
    report(name, ms, sb / 2 / (ms * 1e-3) / 1e9, "GB/s");
    int turn = 0; /* the same in a graph of 20 (the device time a call, no launch gaps) */
    ms = graph_ms([&] { KS(ks_cuda_bound_scores_box(S, q, H, rbox[turn++ % RB], last, Hkv, d, KS_BOUND_GROUP_MAX, bound)); });
    snprintf(name, sizeof name, "quest: bound_scores packed boxes, %d copies in turn, graph of 20 (a call) ctx=%d", (int)RB, ctx);
    report(name, ms, sb / 2 / (ms * 1e-3) / 1e9, "GB/s");
    ms = time_ms([&](int i) { KS(ks_cuda_page_box(S, Kc, 1, N, Hkv, d, d, (int64_t)cap * d, P, 0, last, rbox[i % RB])); });
    snprintf(name, sizeof name, "quest: page_box ctx=%d (%d pages)", ctx, last);
    report(name, ms, (kb + sb / 2) / (ms * 1e-3) / 1e9, "GB/s");
    for (int i = 0; i < RB; i++) { cudaFree(rlo[i]); cudaFree(rhi[i]); cudaFree(rbox[i]); }
    cudaFree(Kc); cudaFree(q); cudaFree(lo); cudaFree(hi); cudaFree(bound); cudaFree(top); cudaFree(rows);
}

/* The list attention of TokenSelect's held steps at ctx keys (the hit path, cache_theta = -1), as
 * a recorded step launches it (ks_cuda_attn_decode_tc_rec over a staged descriptor: counts, offsets,
 * the row ranges and the query position read from device memory, renumbered pre-RoPE rows rotated
 * from the rope table): 128 leading rows, a list of 2048, 512 trailing rows a KV head. The list's rows
 * are (a) 2048 random rows of the middle, a list a head, eight lists in turn (88 MB: past the L2);
 * (b) 2048 consecutive rows a head, eight such runs in turn; (c) one random list every call (its
 * 11 MB of rows stay in L2); (d) as (a), the combine launched for programmatic dependent launch. The
 * combine is part of each call. */
static void bench_list(int ctx) {
    const int Hkv = 8, H = 32, d = 128, nb = 128, na = 512, k = 2048, NL = 8;
    cache c = make_cache(Hkv, ctx, d, 90);
    float *q = drand_f32((size_t)H * d, 91, 1.f), *out = (float *)dmalloc((size_t)H * d * 4);
    ks_cuda_attn_rope rope;
    memset(&rope, 0, sizeof rope);
    for (int i = 0; i < d / 2; i++) rope.inv_freq[i] = powf(500000.f, -2.f * i / d);
    rope.attn_factor = 1.f;
    void *tab = dmalloc(ks_cuda_rope_table_bytes(KS_CUDA_ROPE_TAB_ROWS, d));
    KS(ks_cuda_rope_table(S, tab, KS_CUDA_ROPE_TAB_ROWS, d, rope.inv_freq, rope.attn_factor));
    rope.tab = tab;
    uint64_t rs = 12345;
    auto rnd = [&] { rs = rs * 6364136223846793005ull + 1442695040888963407ull; return (uint32_t)(rs >> 33); };
    /* lists: (variant, turn) -> Hkv lists of k rows in [nb, ctx - na) */
    std::vector<int32_t *> lists[2];
    for (int v = 0; v < 2; v++)
        for (int t = 0; t < NL; t++) {
            std::vector<int32_t> idx;
            for (int h = 0; h < Hkv; h++) {
                std::vector<int32_t> r;
                if (v == 0) {
                    std::vector<char> taken(ctx, 0);
                    while ((int)r.size() < k) {
                        int j = nb + (int)(rnd() % (uint32_t)(ctx - na - nb));
                        if (!taken[j]) { taken[j] = 1; r.push_back(j); }
                    }
                    std::sort(r.begin(), r.end());
                } else {
                    int b0 = nb + t * ((ctx - na - nb - k) / NL);
                    for (int i = 0; i < k; i++) r.push_back(b0 + i);
                }
                idx.insert(idx.end(), r.begin(), r.end());
            }
            lists[v].push_back(dints(idx));
        }
    /* the staged descriptor: counts, offsets, {b0, nb, arel, na, page, 0} */
    std::vector<int32_t> desc;
    for (int h = 0; h < Hkv; h++) desc.push_back(nb + k + na);
    for (int h = 0; h < Hkv; h++) desc.push_back(h * k);
    desc.push_back(0); desc.push_back(nb); desc.push_back(-na); desc.push_back(na); desc.push_back(0); desc.push_back(0);
    int32_t *ddesc = dints(desc);
    std::vector<int32_t> qp(1, ctx - 1);
    int32_t *dq = dints(qp);
    const int32_t **at = (const int32_t **)dmalloc(sizeof(void *) * 2 * NL);
    std::vector<const int32_t *> hat;
    for (int v = 0; v < 2; v++)
        for (int t = 0; t < NL; t++) hat.push_back(lists[v][t]);
    CK(cudaMemcpy(at, hat.data(), sizeof(void *) * 2 * NL, cudaMemcpyHostToDevice));
    ks_cuda_attn_params p;
    memset(&p, 0, sizeof p);
    p.out = out; p.q = q; p.k = c.k; p.v = c.v; p.kpos = c.pos; p.qpos = dq;
    p.nk = ddesc; p.idx_off = ddesc + Hkv; p.seg_dev = ddesc + 2 * Hkv;
    p.n = 1; p.n_heads = H; p.n_kv_heads = Hkv; p.head_dim = d; p.capacity = ctx; p.max_nk = nb + k + na;
    p.scale = 1.0f / sqrtf((float)d); p.renumber = p.q_renumber = 1;
    int nsm;
    CK(cudaDeviceGetAttribute(&nsm, cudaDevAttrMultiProcessorCount, 0));
    p.splits = ks_cuda_attn_decode_tc_list_splits(&p, nsm, 2);
    int splits;
    size_t wsb = ks_cuda_attn_decode_tc_workspace(&p, nsm, &splits);
    void *ws = wsb ? dmalloc(wsb) : NULL;
    const double bytes = (double)Hkv * (nb + k + na) * d * 2 * 2;
    const char *what[4] = {"random x8", "consecutive x8", "random x1, in L2", "random x8, combine PDL"};
    for (int v = 0; v < 4; v++) {
        int turn = 0;
        double ms = graph_ms([&] {
            ks_cuda_attn_params pp = p;
            pp.pdl = v == 3;
            pp.idx_at = at + (v == 1 ? NL : 0) + (v == 2 ? 0 : turn++ % NL);
            KS(ks_cuda_attn_decode_tc_rec(S, &pp, NULL, NULL, &rope, splits, ws));
        });
        char name[128];
        snprintf(name, sizeof name, "held list attn ctx=%d %s (%d splits), graph (a call)", ctx, what[v], splits);
        report(name, ms, bytes / (ms * 1e-3) / 1e9, "GB/s");
#ifdef KS_PH
        { /* the last call's stamps: us from its first block's start, median [min, max] over blocks */
            static unsigned long long hb[1024][10];
            ks_ph_read(&hb[0][0]);
            const int nbk = splits * Hkv;
            unsigned long long t0 = ~0ull;
            for (int b = 0; b < nbk; b++) t0 = std::min(t0, hb[b][0]);
            const char *pn[10] = {"start", "desc read", "rows looked up, copies issued", "query staged", "barrier", "tile 0 landed", "loop end", "end", "", "query loaded"};
            const int order[9] = {0, 1, 2, 9, 3, 4, 5, 6, 7};
            for (int w = 0; w < 2; w++) {
                for (int oi = 0; oi < 9; oi++) {
                    const int k2 = order[oi];
                    std::vector<double> x;
                    for (int b = 0; b < nbk; b++)
                        if ((int)hb[b][8] == w && hb[b][k2]) x.push_back((hb[b][k2] - t0) / 1000.0);
                    if (x.empty()) continue;
                    std::sort(x.begin(), x.end());
                    printf("  PH %s %-30s %7.2f [%7.2f %7.2f] (%d blocks)\n", w ? "list  " : "ranges", pn[k2], x[x.size() / 2], x[0], x.back(), (int)x.size());
                }
            }
        }
#endif
    }
    if (ws) cudaFree(ws);
    for (int v = 0; v < 2; v++)
        for (auto x : lists[v]) cudaFree(x);
    cudaFree((void *)at); cudaFree(ddesc); cudaFree(dq); cudaFree(tab); cudaFree(q); cudaFree(out);
    free_cache(c);
}

int main(int argc, char **argv) {
    int only_select = 0, only_quest = 0, only_list = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick")) g_quick = 1;
        if (!strcmp(argv[i], "--select")) only_select = 1;
        if (!strcmp(argv[i], "--quest")) only_quest = 1;
        if (!strcmp(argv[i], "--list")) only_list = 1;
    }
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    printf("device: %s, %d SMs, %.0f MB L2, %.0f GB\n", prop.name, prop.multiProcessorCount, prop.l2CacheSize / 1e6,
           prop.totalGlobalMem / 1e9);
    CK(cudaStreamCreateWithFlags(&S, cudaStreamNonBlocking));
    cublasHandle_t h;
    if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) { fprintf(stderr, "cublasCreate failed\n"); return 1; }
    cublasSetStream(h, S);
    printf("%-64s %13s %10s %-8s %6s\n", "kernel", "median", "rate", "", "of ceil");
    bench_ceilings(h);
    if (only_list) {
        bench_list(32768);
        bench_list(131072);
        cublasDestroy(h);
        return 0;
    }
    if (only_select || only_quest) {
        if (only_select) {
            bench_select(32768);
            bench_select(131072);
            bench_topk_row(262138, 2048);
            bench_topk_row(262139, 2048);
        }
        if (only_quest) {
            bench_quest(32768);
            bench_quest(131072);
        }
        cublasDestroy(h);
        return 0;
    }
    bench_matmul(h, 1, 4096, 14336);
    bench_matmul(h, 1, 14336, 4096);
    bench_matmul(h, 1, 4096, 128256);
    bench_matmul(h, 4096, 4096, 14336);
    bench_elementwise();
    int big = g_quick ? 4096 : 16384;
    for (int v = 1; v <= 3; v++) bench_prefill(big, 32, 8, 128, 1, 0, v);
    for (int v = 1; v <= 3; v++) bench_prefill(big, 32, 8, 64, 1, 0, v);
    bench_prefill(4096, 32, 8, 128, 1, 0);
    if (!g_quick) {
        bench_prefill(32768, 32, 8, 128, 1, 0);
        bench_prefill(16384, 32, 8, 128, 0, 0);
        bench_prefill(16384, 32, 8, 128, 1, 4096);
    }
    for (int tc = 1; tc >= 0; tc--) {
        bench_decode(4096, 32, 8, 128, 0, tc);
        bench_decode(32768, 32, 8, 128, 0, tc);
        if (!g_quick) bench_decode(131072, 32, 8, 128, 0, tc);
        bench_decode(32768, 32, 8, 128, 2048 + 640, tc);
        bench_decode(32768, 32, 32, 128, 0, tc);
        bench_decode(32768, 64, 8, 128, 0, tc);
    }
    cublasDestroy(h);
    printf("\nsummary (median ms; %% of the measured copy bandwidth or cuBLAS bf16 GEMM rate)\n");
    for (auto &r : rows) printf("%-64s %10.4f ms %10.1f %-8s %5.0f%%\n", r.name, r.ms, r.val, r.unit, r.pct);
    return 0;
}
