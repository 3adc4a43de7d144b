/* test_wgmma.cu — the dev harness of the prefill attention kernels: standalone correctness +
 * speed program for the Hopper wgmma kernels (kernels/attn_prefill_wgmma.cu) and the mma.sync
 * flash kernels (kernels/attn_prefill.cu), the shipped ones and the variants that only this
 * harness builds (KS_KERNEL_DEV, kernels/cuda.mk).
 *
 * (1) Correctness: random non-zero bf16 K/V and float32 Q; every kernel is compared with a naive
 *     float32 reference kernel (one warp per (query row, head), exact exp); prints the max and
 *     mean absolute error of every wgmma variant, of the mma.sync variants and of the planner's
 *     choice, PASS/FAIL per case (bf16 Q and P with float32 accumulation: tolerance 3e-2
 *     absolute on outputs of magnitude <= 1; the mma.sync dev variants within 1.5x the shipped
 *     mma.sync kernel's error where that is larger). Rows
 *     past nk inside the capacity are filled with NaN to check that masked rows never leak.
 * (2) Speed (skipped with --quick): causal plain prefill H=32, Hkv=8, d=128 at n = 4096 ..
 *     131072, TFLOP/s = 4 * d * H * (visible pairs) / time, median of timed repeats.
 *
 * Usage: test_wgmma [--quick]   (--quick: a few small cases, no timing; for compute-sanitizer)
 * Exit status 1 when a case fails. */
#include <cuda_runtime.h>

#include <algorithm>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>

#include "common.cuh"
#include "attn_prefill.cuh"
#include "attn_prefill_wgmma.cuh"

#define CK(x)                                                                                                \
    do {                                                                                                     \
        cudaError_t e_ = (x);                                                                                \
        if (e_) { fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, cudaGetErrorString(e_)); exit(1); }    \
    } while (0)
#define KS(x)                                                                                                \
    do {                                                                                                     \
        ks_status s_ = (x);                                                                                  \
        if (s_) { fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, ks_last_error()); exit(1); }           \
    } while (0)

static cudaStream_t S;
static int g_fail = 0;

static uint64_t g_rng = 0x9E3779B97F4A7C15ull;
static float frand() { /* uniform [-1, 1) */
    g_rng = g_rng * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((g_rng >> 40) & 0xFFFFFF) / 8388608.0f - 1.0f;
}
static uint16_t to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7FFF + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}

template <typename T> static T *dput(const std::vector<T> &v) {
    T *d;
    CK(cudaMalloc(&d, sizeof(T) * std::max<size_t>(1, v.size())));
    if (!v.empty()) CK(cudaMemcpy(d, v.data(), sizeof(T) * v.size(), cudaMemcpyHostToDevice));
    return d;
}

/* ---------------------------------------------------------------- naive reference */

/* one warp per (query row i, head h): float32 dot products, exact exp, online softmax */
template <int D> __global__ void ref_kernel(ks_cuda_attn_params p) {
    int i = blockIdx.x, h = blockIdx.y, lane = threadIdx.x;
    int kv = h / (p.n_heads / p.n_kv_heads), nk = p.nk[kv];
    int qp = p.q_renumber ? nk - p.n + i : p.qpos[i];
    const float *q = p.q + ((size_t)i * p.n_heads + h) * D;
    const bf16 *K = (const bf16 *)p.k + (size_t)kv * p.capacity * D, *V = (const bf16 *)p.v + (size_t)kv * p.capacity * D;
    constexpr int E = D / 32;
    float qv[E], acc[E];
    for (int e = 0; e < E; e++) qv[e] = q[lane + 32 * e], acc[e] = 0.f;
    float m = -INFINITY, l = 0.f;
    for (int j = 0; j < nk; j++) {
        int kp = p.kpos && !p.renumber ? p.kpos[(size_t)kv * p.capacity + j] : j;
        if (kp > qp || (p.window > 0 && (long long)qp - kp >= p.window)) continue;
        float d = 0.f;
        for (int e = 0; e < E; e++) d += qv[e] * __bfloat162float(K[(size_t)j * D + lane + 32 * e]);
        d = warp_sum(d) * p.scale;
        float mn = fmaxf(m, d), c = expf(m - mn), w = expf(d - mn);
        l = l * c + w;
        for (int e = 0; e < E; e++) acc[e] = acc[e] * c + w * __bfloat162float(V[(size_t)j * D + lane + 32 * e]);
        m = mn;
    }
    float *o = p.out + ((size_t)i * p.n_heads + h) * D;
    for (int e = 0; e < E; e++) o[lane + 32 * e] = l > 0.f ? acc[e] / l : 0.f;
}

/* ---------------------------------------------------------------- one problem */

struct problem {
    int n, H, Hkv, d, nk, cap, window, explicit_kpos;
    ks_cuda_attn_params p;
    float *q, *out;
    void *k, *v, *ws;
    int32_t *kpos, *qpos, *nkd;
};

/* n queries at positions nk - n .. nk - 1 over nk keys at positions 0 .. nk - 1 (plain causal
 * prefill when nk == n); rows nk .. cap - 1 of each KV head hold NaN. */
static problem make_problem(int n, int H, int Hkv, int d, int nk, int cap, int window, int explicit_kpos, float qscale) {
    problem P;
    memset(&P, 0, sizeof P);
    P.n = n, P.H = H, P.Hkv = Hkv, P.d = d, P.nk = nk, P.cap = cap, P.window = window, P.explicit_kpos = explicit_kpos;
    std::vector<float> q((size_t)n * H * d);
    for (auto &x : q) x = qscale * frand();
    std::vector<uint16_t> k((size_t)Hkv * cap * d), v((size_t)Hkv * cap * d);
    for (int kv = 0; kv < Hkv; kv++)
        for (int j = 0; j < cap; j++)
            for (int c = 0; c < d; c++) {
                size_t e = ((size_t)kv * cap + j) * d + c;
                k[e] = j < nk ? to_bf16(frand()) : 0x7FC1; /* NaN past nk */
                v[e] = j < nk ? to_bf16(frand()) : 0x7FC1;
            }
    std::vector<int32_t> kp((size_t)Hkv * cap), qp(n), nkv(Hkv, nk);
    for (int kv = 0; kv < Hkv; kv++)
        for (int j = 0; j < cap; j++) kp[(size_t)kv * cap + j] = j;
    for (int i = 0; i < n; i++) qp[i] = nk - n + i;
    P.q = dput(q);
    P.k = dput(k);
    P.v = dput(v);
    P.kpos = dput(kp);
    P.qpos = dput(qp);
    P.nkd = dput(nkv);
    CK(cudaMalloc(&P.out, sizeof(float) * (size_t)n * H * d));
    ks_cuda_attn_params &p = P.p;
    memset(&p, 0, sizeof p);
    p.out = P.out; p.q = P.q; p.k = P.k; p.v = P.v;
    p.kpos = explicit_kpos ? P.kpos : NULL;
    p.qpos = P.qpos; p.nk = P.nkd;
    p.n = n; p.n_heads = H; p.n_kv_heads = Hkv; p.head_dim = d; p.capacity = cap; p.max_nk = nk;
    p.scale = 1.0f / sqrtf((float)d);
    p.window = window;
    size_t wsb = std::max(ks_cuda_attn_prefill_workspace(&p), ks_cuda_attn_prefill_wgmma_workspace(&p));
    if (ks_cuda_attn_prefill_wgmma_workspace(&p) != ks_cuda_attn_prefill_workspace(&p)) {
        printf("FAIL workspace sizes differ (%zu vs %zu): the dispatch hook passes the flash workspace\n",
               ks_cuda_attn_prefill_wgmma_workspace(&p), ks_cuda_attn_prefill_workspace(&p));
        g_fail = 1;
    }
    CK(cudaMalloc(&P.ws, wsb));
    return P;
}

static void free_problem(problem &P) {
    cudaFree(P.q); cudaFree(P.out); cudaFree(P.k); cudaFree(P.v); cudaFree(P.ws);
    cudaFree(P.kpos); cudaFree(P.qpos); cudaFree(P.nkd);
}

/* kind: 0 = reference, 1 .. NV = wgmma variant (dev harness; 10 is the shipped one),
 * K_FLASH1 .. K_FLASH3 = mma.sync variants 1 .. 3 (K_FLASH = 2, the shipped one), K_HOOK = the
 * planner's kernel through ks_cuda_attn_prefill, as the backend runs it on this GPU */
#define NV KS_WGMMA_VARIANTS
#define K_FLASH1 (NV + 1)
#define K_FLASH (NV + 2)
#define K_FLASH3 (NV + 3)
#define K_HOOK (NV + 4)
static int g_sm_major;
static void run(problem &P, int kind) {
    if (kind == 0) {
        dim3 grid(P.n, P.H);
        if (P.d == 128) ref_kernel<128><<<grid, 32, 0, S>>>(P.p);
        else ref_kernel<64><<<grid, 32, 0, S>>>(P.p);
        CK(cudaGetLastError());
    } else if (kind >= 1 && kind <= NV) {
        KS(ks_cuda_attn_prefill_wgmma_variant(S, &P.p, P.ws, kind));
    } else if (kind >= K_FLASH1 && kind <= K_FLASH3) {
        KS(ks_cuda_attn_prefill_mma_variant(S, &P.p, P.ws, kind - NV));
    } else {
        KS(ks_cuda_attn_prefill(S, &P.p, P.ws, ks_cuda_attn_prefill_plan(&P.p, g_sm_major, 0)));
    }
}

static std::vector<float> get_out(problem &P) {
    std::vector<float> o((size_t)P.n * P.H * P.d);
    CK(cudaStreamSynchronize(S));
    CK(cudaMemcpy(o.data(), P.out, sizeof(float) * o.size(), cudaMemcpyDeviceToHost));
    return o;
}

static void err(const std::vector<float> &a, const std::vector<float> &r, double *mx, double *mean) {
    double m = 0, s = 0;
    for (size_t i = 0; i < a.size(); i++) {
        double e = fabs((double)a[i] - r[i]);
        if (!(e == e)) e = INFINITY; /* NaN */
        m = std::max(m, e);
        s += e;
    }
    *mx = m;
    *mean = a.empty() ? 0 : s / a.size();
}

static void check_case(int n, int H, int Hkv, int d, int nk, int cap, int window, int explicit_kpos, const char *what) {
    problem P = make_problem(n, H, Hkv, d, nk, cap, window, explicit_kpos, 3.0f);
    CK(cudaMemset(P.out, 0xFF, sizeof(float) * (size_t)n * H * d)); /* NaN: unwritten rows show */
    run(P, 0);
    std::vector<float> ref = get_out(P);
    const double tol = 3e-2;
    double e[K_HOOK + 1], em[K_HOOK + 1];
    for (int kind = 1; kind <= K_HOOK; kind++) {
        if (kind <= NV && !KS_WGMMA_LIVE(kind)) { e[kind] = em[kind] = 0; continue; }
        CK(cudaMemset(P.out, 0xFF, sizeof(float) * (size_t)n * H * d));
        run(P, kind);
        err(get_out(P), ref, &e[kind], &em[kind]);
    }
    bool ok = e[K_HOOK] < tol;
    for (int v = 1; v <= NV; v++) ok = ok && e[v] < tol;
    /* the mma.sync dev variants: as close as the shipped one (its own error is reported) */
    double ftol = std::max(tol, 1.5 * e[K_FLASH]);
    ok = ok && e[K_FLASH1] < ftol && e[K_FLASH3] < ftol;
    printf("%s n=%-6d H=%d/%d d=%-3d nk=%-6d cap=%-6d win=%-4d %s: wgmma", ok ? "PASS" : "FAIL", n, H, Hkv, d, nk, cap,
           window, what);
    for (int v = 1; v <= NV; v++)
        if (KS_WGMMA_LIVE(v)) printf(" v%d max %.2e mean %.1e |", v, e[v], em[v]);
    printf(" flash max %.2e mean %.1e (v1 %.2e, v3 %.2e) | hook max %.2e  %s\n", e[K_FLASH], em[K_FLASH], e[K_FLASH1],
           e[K_FLASH3], e[K_HOOK], e[K_FLASH] >= tol ? "(flash over tol too)" : "");
    fflush(stdout);
    if (!ok) g_fail = 1;
    free_problem(P);
}

/* ---------------------------------------------------------------- timing */

template <typename F> static double time_ms(F fn, int warm, int reps) {
    for (int i = 0; i < warm; i++) fn();
    CK(cudaStreamSynchronize(S));
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    std::vector<double> t;
    for (int i = 0; i < reps; i++) {
        CK(cudaEventRecord(a, S));
        fn();
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

static void bench(int n, int H, int Hkv, int d) {
    size_t need = (size_t)n * H * d * 4 * 2 + (size_t)Hkv * n * d * 2 * 2 + ((size_t)64 << 20);
    size_t fr = 0, tot = 0;
    CK(cudaMemGetInfo(&fr, &tot));
    if (need > fr) { printf("bench n=%d: skipped (needs %.1f GiB, %.1f free)\n", n, need / 1073741824.0, fr / 1073741824.0); return; }
    problem P = make_problem(n, H, Hkv, d, n, n, 0, 1, 3.0f);
    double flops = 4.0 * d * H * ((double)n * (n + 1) / 2);
    int reps = n >= 65536 ? 3 : 5;
    double ms[K_FLASH + 1];
    for (int kind = 1; kind <= K_FLASH; kind++)
        ms[kind] = (kind <= NV && !KS_WGMMA_LIVE(kind)) || kind == K_FLASH1 ? INFINITY : time_ms([&] { run(P, kind); }, 1, reps);
    /* agreement of the fast kernels at this size (no reference: too slow) */
    run(P, K_FLASH);
    std::vector<float> of = get_out(P);
    double dmax[NV + 1], dmean, best = ms[1];
    for (int kind = 1; kind <= NV; kind++) {
        if (!KS_WGMMA_LIVE(kind)) { dmax[kind] = 0; continue; }
        run(P, kind);
        err(get_out(P), of, &dmax[kind], &dmean);
        best = std::min(best, ms[kind]);
    }
    printf("bench n=%-6d H=%d/%d d=%d causal:", n, H, Hkv, d);
    for (int v = 1; v <= NV; v++)
        if (KS_WGMMA_LIVE(v)) printf(" wgmma v%d %7.2f ms %6.1f TFLOP/s |", v, ms[v], flops / (ms[v] * 1e9));
    printf(" flash %7.2f ms %6.1f TFLOP/s | best wgmma speedup %.2fx | max diff vs flash:", ms[K_FLASH],
           flops / (ms[K_FLASH] * 1e9), ms[K_FLASH] / best);
    for (int v = 1; v <= NV; v++)
        if (KS_WGMMA_LIVE(v)) printf(" v%d %.1e", v, dmax[v]);
    printf("\n");
    fflush(stdout);
    free_problem(P);
}

int main(int argc, char **argv) {
    int quick = argc > 1 && !strcmp(argv[1], "--quick");
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    printf("device: %s (sm_%d%d, %d SMs)\n", prop.name, prop.major, prop.minor, prop.multiProcessorCount);
    if (prop.major != 9) { printf("SKIP: wgmma needs a Hopper GPU (sm_90)\n"); return 0; }
    g_sm_major = prop.major;
    CK(cudaStreamCreate(&S));

    const int hs[3][2] = {{32, 8}, {8, 8}, {28, 4}};
    if (quick) {
        check_case(1, 8, 8, 128, 1, 8, 0, 1, "plain");
        check_case(17, 32, 8, 128, 17, 24, 0, 1, "plain");
        check_case(129, 28, 4, 128, 129, 136, 0, 0, "plain kpos=NULL");
        check_case(129, 8, 8, 64, 129, 129, 0, 1, "plain");
        check_case(17, 8, 8, 128, 300, 307, 0, 1, "continuation");
        check_case(200, 8, 8, 128, 200, 200, 50, 1, "window");
        check_case(45, 28, 4, 128, 300, 307, 0, 1, "continuation");
        check_case(200, 32, 8, 64, 200, 200, 50, 1, "window");
    } else {
        const int ns[] = {1, 17, 64, 127, 128, 129, 1000, 4096};
        for (int n : ns)
            for (auto &hh : hs) check_case(n, hh[0], hh[1], 128, n, n + 7, 0, 1, "plain");
        const int ns64[] = {1, 129, 1000};
        for (int n : ns64) check_case(n, 32, 8, 64, n, n + 3, 0, 1, "plain");
        check_case(1000, 32, 8, 128, 1000, 1000, 0, 0, "kpos=NULL cap=n");
        check_case(17, 32, 8, 128, 1000, 1007, 0, 1, "continuation");
        check_case(300, 28, 4, 128, 2000, 2000, 0, 1, "continuation");
        check_case(1000, 8, 8, 128, 1000, 1000, 100, 1, "window");
        check_case(1000, 8, 8, 64, 1000, 1000, 300, 1, "window");
        check_case(1000, 32, 8, 128, 1000, 1000, 100, 1, "window");
        check_case(1000, 28, 4, 64, 1000, 1003, 300, 1, "window");
        check_case(333, 28, 4, 128, 333, 340, 0, 0, "kpos=NULL");
    }
    printf("correctness: %s\n", g_fail ? "FAIL" : "all PASS");
    fflush(stdout);

    if (!quick) {
        const int bn[] = {4096, 16384, 32768, 65536, 131072};
        for (int n : bn) bench(n, 32, 8, 128);
    }
    CK(cudaStreamDestroy(S));
    return g_fail;
}
