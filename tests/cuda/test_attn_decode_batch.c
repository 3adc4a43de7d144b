/* test_attn_decode_batch.c — the GPU kernels of a batched decode step against their CPU twins.
 * 1. The batched decode attention (kernels/attn_decode_batch.cu) against its CPU twin
 * (core/decode_batch.h: the CPU backend's kv_append + attention per session), on random inputs
 * (never zeros), outputs poisoned with NaN first. Per case, n sessions with their own KV layers
 * of different lengths (empty ones included), some with uneven heads after a retain
 * (non-contiguous positions), a window or none, GQA 1..8 (3, 5, 6, 7 too), head_dim 64/128, and
 * a warp count that gives one warp for every segment, pieces that straddle segments, or one tile
 * a piece (the in-kernel merge of many); head_dim 96 takes the per-session fallback; 1024 KV heads
 * make the descriptors too many for the launch's arguments (the uploaded path).
 * Checks: every output finite; per session ||gpu - cpu|| / ||cpu|| < 1e-2 and per query head
 * < 3e-2, the bounds of the tensor-core decode kernel's tests (tests/cuda/test_cuda.c): the
 * queries are bf16 here (so Q's rounding is exact) and the kernel rounds P to bf16, ~3e-3
 * relative; the same call on a copy of the layers gives bit-identical outputs (the merge order
 * does not depend on which warp finishes last), and its bf16 copy of the rows (out_bf16) is each
 * output rounded to bf16, bit for bit (on the per-session fallback too); after the call each layer's row counts and host
 * positions equal the CPU's, and the GPU cache's new row and position are the appended ones.
 * Then (not with --quick) the time of one layer at the Llama-3.1-8B decode shape (8 KV heads,
 * 32 query heads, 128 dims): B sessions of `keys` rows, 20 calls back to back (as a step's
 * layers run), host clock and CUDA events, beside the per-session kv_append + attention it
 * replaces; then the kernel at 4, 8 and 16 warps a multiprocessor. Printed, never asserted.
 * 2. The greedy ids (kernels/argmax_rows.cu) against ks_argmax_rows_ref (core/decode_batch.h):
 * rows of random logits with planted ties, NaNs (at 0 and inside), infinities, -0 beside +0, at
 * widths with and without the 16-byte path (128256, 1000, 13, 1, an odd offset); the ids must be
 * equal, through the backend's argmax_rows (the download) as well. Then (not with --quick) its
 * time for 64 rows of 128256 beside downloading the rows.
 * Usage: test_attn_decode_batch [--quick | --time-only]. --time-only runs only the attention
 * times at the automatic warp count (it builds against an older kernel too: the before binary of
 * an A/B). Prints "N passed, N failed"; exits 1 on failure. */
#include "argmax_rows.cuh"
#include "backend.h"
#include "decode_batch.h"
#include "ks_cuda.h"
#include "attn_decode_batch.cuh"

#include <cuda_runtime_api.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int g_pass, g_fail, g_quick;
static ks_backend *CPU, *GPU;

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

static uint64_t g_seed = 0x5eed1234abcdull;
static float rndf(void) { /* uniform in [-1, 1), never exactly zero in practice */
    g_seed = g_seed * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((g_seed >> 40) / 8388608.0 - 1.0);
}
static float bf16r(float x) { return ks_bf16_to_f32(ks_f32_to_bf16(x)); }
static void fill_bf16(float *x, size_t n, float scale) {
    for (size_t i = 0; i < n; i++) x[i] = bf16r(scale * rndf());
}
static float *gpu_copy(const float *h, size_t n) {
    float *d = GPU->alloc(GPU, sizeof(float) * (n ? n : 1));
    if (d && h && GPU->upload(GPU, d, h, sizeof(float) * n)) { GPU->free(GPU, d); return NULL; }
    return d;
}

#define MAXS 8 /* sessions a case */

typedef struct acase {
    const char *name;
    int n, Hkv, G, D, window, warps, uneven;
    int len[MAXS];
} acase;

/* n sessions' GPU layers for a case: lengths len[i] at positions 0.., uneven heads if asked */
static ks_status build_layers(const acase *tc, ks_backend *be, ks_kv_layer *L, uint64_t seed) {
    int Hkv = tc->Hkv, D = tc->D, KD = Hkv * D;
    uint64_t keep = g_seed;
    g_seed = seed;
    ks_status st = KS_OK;
    for (int i = 0; i < tc->n && !st; i++) {
        int len = tc->len[i];
        L[i].n_kv_heads = Hkv;
        L[i].head_dim = D;
        st = be->kv_alloc(be, &L[i], len + 1);
        if (st || !len) continue;
        float *k = malloc(sizeof(float) * (size_t)len * KD), *v = malloc(sizeof(float) * (size_t)len * KD);
        int32_t *p = malloc(sizeof(int32_t) * len);
        fill_bf16(k, (size_t)len * KD, 1.0f);
        fill_bf16(v, (size_t)len * KD, 1.0f);
        for (int t = 0; t < len; t++) p[t] = t;
        float *dk = k, *dv = v;
        if (be == GPU) {
            dk = gpu_copy(k, (size_t)len * KD);
            dv = gpu_copy(v, (size_t)len * KD);
        }
        st = dk && dv ? be->kv_append(be, &L[i], dk, dv, p, len) : KS_ERR_OOM;
        if (!st && tc->uneven) { /* head h keeps rows t with t % (h + 1) == 0 (head 0: all) */
            int32_t *idx[16], cnt[16];
            for (int h = 0; h < Hkv; h++) {
                idx[h] = malloc(sizeof(int32_t) * len);
                cnt[h] = 0;
                for (int t = 0; t < len; t++)
                    if (t % (h + 1) == 0) idx[h][cnt[h]++] = t;
            }
            st = be->kv_retain(be, &L[i], (const int32_t *const *)idx, cnt, 0);
            for (int h = 0; h < Hkv; h++) free(idx[h]);
        }
        if (be == GPU) {
            GPU->free(GPU, dk);
            GPU->free(GPU, dv);
        }
        free(k);
        free(v);
        free(p);
    }
    g_seed = keep;
    return st;
}

/* One case: build, run both (the GPU twice, on two copies of the layers), compare. */
static void run_case(const acase *tc) {
    int n = tc->n, Hkv = tc->Hkv, H = Hkv * tc->G, D = tc->D, KD = Hkv * D, QD = H * D;
    ks_kv_layer Lc[MAXS], Lg[MAXS], L2[MAXS];
    memset(Lc, 0, sizeof Lc);
    memset(Lg, 0, sizeof Lg);
    memset(L2, 0, sizeof L2);
    float *q = malloc(sizeof(float) * (size_t)n * QD), *kn = malloc(sizeof(float) * (size_t)n * KD),
          *vn = malloc(sizeof(float) * (size_t)n * KD), *outc = malloc(sizeof(float) * (size_t)n * QD),
          *outg = malloc(sizeof(float) * (size_t)n * QD), *out2 = malloc(sizeof(float) * (size_t)n * QD);
    float *dq = NULL, *dk = NULL, *dv = NULL, *dout = NULL, *dout2 = NULL;
    void *dob = NULL;
    uint16_t *ob = malloc(2 * (size_t)n * QD);
    int32_t pos[MAXS];
    char why[200] = "";
    uint64_t seed = g_seed ^ 0x9e3779b97f4a7c15ull * (uint64_t)(n + 31 * tc->len[n - 1]);
    ks_status st = build_layers(tc, CPU, Lc, seed);
    if (!st) st = build_layers(tc, GPU, Lg, seed);
    if (!st) st = build_layers(tc, GPU, L2, seed);
    for (int i = 0; i < n; i++) pos[i] = tc->len[i] + 3 * i; /* positions need not follow the rows */
    if (st) { result(0, tc->name, "setup: %s", ks_last_error()); goto out; }
    fill_bf16(q, (size_t)n * QD, 1.0f); /* bf16 queries: the kernel's rounding of Q is exact */
    fill_bf16(kn, (size_t)n * KD, 1.0f);
    fill_bf16(vn, (size_t)n * KD, 1.0f);
    dq = gpu_copy(q, (size_t)n * QD);
    dk = gpu_copy(kn, (size_t)n * KD);
    dv = gpu_copy(vn, (size_t)n * KD);
    for (size_t i = 0; i < (size_t)n * QD; i++) outg[i] = NAN;
    dout = gpu_copy(outg, (size_t)n * QD);
    dout2 = gpu_copy(outg, (size_t)n * QD);
    if (!dq || !dk || !dv || !dout || !dout2) { result(0, tc->name, "device buffers: %s", ks_last_error()); goto out; }
    {
        ks_kv_layer *lc[MAXS], *lg[MAXS], *l2[MAXS];
        const float *cq[MAXS], *ck[MAXS], *cv[MAXS], *gq[MAXS], *gk[MAXS], *gv[MAXS];
        float *co[MAXS], *go[MAXS], *go2[MAXS];
        for (int i = 0; i < n; i++) {
            lc[i] = &Lc[i];
            lg[i] = &Lg[i];
            l2[i] = &L2[i];
            cq[i] = q + (size_t)i * QD; ck[i] = kn + (size_t)i * KD; cv[i] = vn + (size_t)i * KD; co[i] = outc + (size_t)i * QD;
            gq[i] = dq + (size_t)i * QD; gk[i] = dk + (size_t)i * KD; gv[i] = dv + (size_t)i * KD; go[i] = dout + (size_t)i * QD;
            go2[i] = dout2 + (size_t)i * QD;
        }
        float scale = 1.0f / sqrtf((float)D);
        st = ks_attn_decode_batch_loop(CPU, n, lc, cq, ck, cv, pos, H, scale, tc->window, co);
        if (st) { result(0, tc->name, "cpu: %s", ks_last_error()); goto out; }
        st = ks_cuda_attn_decode_batch_run(GPU, n, lg, gq, gk, gv, pos, H, scale, tc->window, go, NULL, tc->warps);
        dob = GPU->alloc(GPU, 2 * (size_t)n * QD); /* the second call also writes its rows as bf16 */
        if (!dob) st = KS_ERR_OOM;
        if (!st) st = ks_cuda_attn_decode_batch_run(GPU, n, l2, gq, gk, gv, pos, H, scale, tc->window, go2, dob, tc->warps);
        if (!st) st = GPU->sync(GPU);
        if (st) { result(0, tc->name, "gpu: %s", ks_last_error()); goto out; }
    }
    st = GPU->download(GPU, outg, dout, sizeof(float) * (size_t)n * QD);
    if (!st) st = GPU->download(GPU, out2, dout2, sizeof(float) * (size_t)n * QD);
    double worst = 0, worst_head = 0;
    for (int i = 0; i < n && !st && !why[0]; i++) {
        double num = 0, den = 0;
        for (int hq = 0; hq < H && !why[0]; hq++) {
            double hn = 0, hd = 0;
            for (int e = 0; e < D; e++) {
                size_t o = (size_t)i * QD + (size_t)hq * D + e;
                float a = outg[o], b = outc[o];
                if (!isfinite(a)) { snprintf(why, sizeof why, "session %d element %d not finite (%g)", i, hq * D + e, a); break; }
                hn += ((double)a - b) * ((double)a - b);
                hd += (double)b * b;
            }
            double hr = hd > 0 ? sqrt(hn / hd) : sqrt(hn);
            worst_head = fmax(worst_head, hr);
            if (!why[0] && hr > 3e-2) snprintf(why, sizeof why, "session %d head %d: rel err %.3g > 3e-2", i, hq, hr);
            num += hn;
            den += hd;
        }
        double rel = den > 0 ? sqrt(num / den) : sqrt(num);
        worst = fmax(worst, rel);
        if (!why[0] && rel > 1e-2) snprintf(why, sizeof why, "session %d: rel err %.3g > 1e-2", i, rel);
        /* the bookkeeping and the cache's new row */
        for (int h = 0; h < Hkv && !why[0] && !st; h++) {
            int r = Lg[i].n[h] - 1;
            if (Lg[i].n[h] != Lc[i].n[h]) snprintf(why, sizeof why, "session %d head %d: %d rows, cpu %d", i, h, Lg[i].n[h], Lc[i].n[h]);
            else if (Lg[i].pos[(size_t)h * Lg[i].capacity + r] != pos[i])
                snprintf(why, sizeof why, "session %d head %d: host position %d, want %d", i, h,
                         Lg[i].pos[(size_t)h * Lg[i].capacity + r], pos[i]);
            else {
                uint16_t row[2][128];
                int32_t dp = -1;
                size_t off = ((size_t)h * Lg[i].capacity + r) * D;
                st = GPU->download(GPU, row[0], (const uint16_t *)Lg[i].k + off, 2 * (size_t)D);
                if (!st) st = GPU->download(GPU, row[1], (const uint16_t *)Lg[i].v + off, 2 * (size_t)D);
                if (!st) st = GPU->download(GPU, &dp, (const int32_t *)Lg[i].pos_dev + (size_t)h * Lg[i].capacity + r, 4);
                for (int e = 0; e < D && !st && !why[0]; e++)
                    if (ks_bf16_to_f32(row[0][e]) != kn[(size_t)i * KD + h * D + e] ||
                        ks_bf16_to_f32(row[1][e]) != vn[(size_t)i * KD + h * D + e])
                        snprintf(why, sizeof why, "session %d head %d: cache row %d dim %d differs", i, h, r, e);
                if (!st && !why[0] && dp != pos[i])
                    snprintf(why, sizeof why, "session %d head %d: device position %d, want %d", i, h, dp, pos[i]);
            }
        }
    }
    if (!st && !why[0] && memcmp(outg, out2, sizeof(float) * (size_t)n * QD))
        snprintf(why, sizeof why, "the same call on a copy of the layers differs");
    if (!st && !why[0] && ob) { /* the bf16 copy: each output rounded, bit for bit */
        st = GPU->download(GPU, ob, dob, 2 * (size_t)n * QD);
        for (size_t e = 0; e < (size_t)n * QD && !st && !why[0]; e++)
            if (ob[e] != ks_f32_to_bf16(out2[e])) snprintf(why, sizeof why, "bf16 copy element %zu is not the output rounded", e);
    } else if (!ob) snprintf(why, sizeof why, "out of host memory");
    if (st) result(0, tc->name, "download: %s", ks_last_error());
    else result(!why[0], tc->name, "%s (worst rel err %.2g, head %.2g)", why[0] ? why : "", worst, worst_head);
out:
    for (int i = 0; i < n; i++) {
        CPU->kv_free(CPU, &Lc[i]);
        GPU->kv_free(GPU, &Lg[i]);
        GPU->kv_free(GPU, &L2[i]);
    }
    GPU->free(GPU, dq);
    GPU->free(GPU, dk);
    GPU->free(GPU, dv);
    GPU->free(GPU, dout);
    GPU->free(GPU, dout2);
    if (dob) GPU->free(GPU, dob);
    free(ob);
    free(q);
    free(kn);
    free(vn);
    free(outc);
    free(outg);
    free(out2);
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec;
}

/* One layer at the Llama-3.1-8B decode shape: B sessions of `keys` rows, the kernel with
 * `warps` (0: its own choice) for reps calls back to back, each appending a row (host clock
 * around them, and CUDA events on the stream), and with per_session the per-session kv_append +
 * attention it replaces, the same way. */
static void time_shape(int B, int keys, int reps, int warps, int per_session) {
    int Hkv = 8, H = 32, D = 128, KD = Hkv * D, QD = H * D;
    ks_kv_layer *L = calloc((size_t)B, sizeof *L);
    float *h = malloc(sizeof(float) * (size_t)keys * KD);
    fill_bf16(h, (size_t)keys * KD, 1.0f);
    float *dkv = gpu_copy(h, (size_t)keys * KD);
    free(h);
    int32_t *p = malloc(sizeof(int32_t) * keys), *pos = malloc(sizeof(int32_t) * B);
    for (int t = 0; t < keys; t++) p[t] = t;
    float *qh = malloc(sizeof(float) * (size_t)B * QD);
    for (size_t i = 0; i < (size_t)B * QD; i++) qh[i] = rndf();
    float *dq = gpu_copy(qh, (size_t)B * QD), *dn = gpu_copy(qh, (size_t)B * KD), *dout = gpu_copy(NULL, (size_t)B * QD);
    free(qh);
    ks_kv_layer **lp = malloc(sizeof *lp * B);
    const float **q = malloc(sizeof *q * B), **kn = malloc(sizeof *kn * B);
    float **o = malloc(sizeof *o * B);
    ks_status st = dkv && dq && dn && dout ? KS_OK : KS_ERR_OOM;
    for (int i = 0; i < B && !st; i++) {
        L[i].n_kv_heads = Hkv;
        L[i].head_dim = D;
        st = GPU->kv_alloc(GPU, &L[i], keys + 2 * (reps + 1) + 8);
        if (!st) st = GPU->kv_append(GPU, &L[i], dkv, dkv, p, keys);
        lp[i] = &L[i];
        q[i] = dq + (size_t)i * QD;
        kn[i] = dn + (size_t)i * KD;
        o[i] = dout + (size_t)i * QD;
    }
    cudaStream_t cs = ks_cuda_backend_stream(GPU);
    cudaEvent_t e0 = NULL, e1 = NULL;
    if (!st && (cudaEventCreate(&e0) != cudaSuccess || cudaEventCreate(&e1) != cudaSuccess)) st = KS_ERR_DEVICE;
    double tl = 0, ts = 0, sub = 0;
    float gl = 0, gs = 0;
    float scale = 1.0f / sqrtf((float)D);
    for (int phase = per_session ? 1 : 2; phase < 3 && !st; phase++) { /* per session, the kernel */
        for (int warm = 1; warm >= 0 && !st; warm--) {
            int calls = warm ? 1 : reps;
            st = GPU->sync(GPU);
            double t0 = now_s();
            cudaEventRecord(e0, cs);
            for (int r = 0; r < calls && !st; r++) {
                for (int i = 0; i < B; i++) pos[i] = L[i].n[0];
                if (phase == 2) st = ks_cuda_attn_decode_batch_run(GPU, B, lp, q, kn, kn, pos, H, scale, 0, o, NULL, warps);
                else
                    for (int i = 0; i < B && !st; i++) {
                        ks_attn_args a = {.n = 1, .n_heads = H, .qpos = &pos[i], .scale = scale};
                        st = GPU->kv_append(GPU, &L[i], kn[i], kn[i], &pos[i], 1);
                        if (!st) st = GPU->attention(GPU, o[i], q[i], &L[i], &a);
                    }
            }
            cudaEventRecord(e1, cs);
            if (!warm && phase == 2) sub = now_s() - t0; /* the host's part: the calls queued, not waited for */
            if (!st) st = GPU->sync(GPU);
            float ms = 0;
            if (!st && cudaEventElapsedTime(&ms, e0, e1) != cudaSuccess) st = KS_ERR_DEVICE;
            if (!warm) {
                *(phase == 1 ? &tl : &ts) = now_s() - t0;
                *(phase == 1 ? &gl : &gs) = ms * 1e-3f;
            }
        }
    }
    char name[96];
    snprintf(name, sizeof name, "time: 8B layer, B = %d, %d keys, warps %d", B, keys, warps);
    if (st) result(0, name, "%s", ks_last_error());
    else {
        double bytes = (double)B * Hkv * (keys + 1 + (per_session ? 2 : 1) * reps / 2.0) * D * 2 * 2; /* K and V, bf16 */
        printf("  time  %-44s kernel %7.1f us (%4.0f GB/s), events %7.1f us (%4.0f GB/s)", name, 1e6 * ts / reps,
               bytes / (ts / reps) / 1e9, 1e6 * gs / reps, bytes / (gs / reps) / 1e9);
        printf(", host %6.1f us", 1e6 * sub / reps);
        if (per_session) printf(" | per session %7.1f us (%4.0f GB/s)", 1e6 * tl / reps, bytes / (tl / reps) / 1e9);
        printf("\n");
        fflush(stdout);
    }
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
    for (int i = 0; i < B; i++) GPU->kv_free(GPU, &L[i]);
    GPU->free(GPU, dkv);
    GPU->free(GPU, dq);
    GPU->free(GPU, dn);
    GPU->free(GPU, dout);
    free(L); free(p); free(pos); free(lp); free(q); free(kn); free(o);
}

/* The kernel's times: B = 1, 4, 16, 64 x 4096 keys and 16 x 32768 at its own warp count (with
 * the per-session path beside, except at 32768 keys); then unless time_only, 64 and 16 x 4096
 * at 4, 8 and 16 warps a multiprocessor, and 1 and 4 x 4096 at 1, 4, 16 and 64 warps a
 * segment (where the small batches' time goes: streaming by few warps or merging many pieces). */
static void times(int time_only) {
    static const int shapes[][2] = {{1, 4096}, {4, 4096}, {16, 4096}, {64, 4096}, {16, 32768}};
    for (int i = 0; i < 5; i++) time_shape(shapes[i][0], shapes[i][1], 20, 0, shapes[i][1] == 4096);
    if (time_only) return;
    int dev = 0, nsm = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&nsm, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess)
        return;
    for (int b = 64; b >= 16; b /= 4)
        for (int w = 4; w <= 16; w *= 2) time_shape(b, 4096, 20, w * nsm, 0);
    for (int b = 1; b <= 4; b *= 4)
        for (int w = 1; w <= 64; w *= 4) time_shape(b, 4096, 20, w * 8 * b, 0);
}

/* ---------------------------------------------------------------- greedy ids */

/* rows (rows, cols) of logits from seed: random, with planted ties of the maximum, NaNs, +-inf,
 * -0 beside +0 (by row, so each row has its own trap) */
static void argmax_rows_fill(float *x, int rows, int cols) {
    for (int r = 0; r < rows; r++) {
        float *l = x + (size_t)r * cols;
        for (int i = 0; i < cols; i++) l[i] = 8.0f * rndf();
        int a = (int)((unsigned)(r * 7919 + 13) % (unsigned)cols), b = (int)((unsigned)(r * 104729 + 7) % (unsigned)cols);
        switch (r % 8) {
        case 0: l[a] = 9.5f; l[b] = 9.5f; break;                          /* a tie: the lower wins */
        case 1: l[0] = NAN; l[a] = 10.f; break;                           /* NaN at 0: id 0 */
        case 2: for (int i = 1; i < cols; i += 3) l[i] = NAN; l[a] = 9.f; break; /* NaNs inside */
        case 3: for (int i = 0; i < cols; i++) l[i] = -INFINITY; break;   /* all -inf: 0 */
        case 4: l[a] = INFINITY; l[b] = INFINITY; break;                   /* +inf twice */
        case 5: for (int i = 0; i < cols; i++) l[i] = i % 2 ? -0.0f : -1.f; if (cols > 2) l[cols - 1] = 0.0f; break;
        case 6: l[cols - 1] = 20.f; break;                                 /* the last element */
        default: break;                                                    /* plain */
        }
    }
}

/* one width: rows at offset `off` floats into the device buffer (off 1: not 16-byte aligned) */
static void argmax_case(int rows, int cols, int off) {
    char name[96];
    snprintf(name, sizeof name, "argmax rows: %d x %d, offset %d", rows, cols, off);
    size_t n = (size_t)rows * cols;
    float *x = malloc(sizeof(float) * (n + off));
    int32_t *want = malloc(sizeof(int32_t) * rows), *got = malloc(sizeof(int32_t) * rows),
            *hook = malloc(sizeof(int32_t) * rows);
    for (int i = 0; i < off; i++) x[i] = 0;
    argmax_rows_fill(x + off, rows, cols);
    ks_argmax_rows_ref(x + off, rows, cols, want);
    float *dx = gpu_copy(x, n + off);
    int32_t *dout = (int32_t *)GPU->alloc(GPU, sizeof(int32_t) * rows);
    ks_status st = dx && dout ? KS_OK : KS_ERR_OOM;
    for (int r = 0; r < rows; r++) got[r] = hook[r] = -7;
    if (!st) st = ks_cuda_argmax_rows(ks_cuda_backend_stream(GPU), dx + off, rows, cols, dout);
    if (!st) st = GPU->download(GPU, got, dout, sizeof(int32_t) * rows);
    if (!st) st = GPU->argmax_rows ? GPU->argmax_rows(GPU, dx + off, rows, cols, hook) : KS_ERR_UNSUPPORTED;
    char why[160] = "";
    for (int r = 0; r < rows && !st && !why[0]; r++)
        if (got[r] != want[r] || hook[r] != want[r])
            snprintf(why, sizeof why, "row %d (kind %d): kernel %d, hook %d, twin %d", r, r % 8, got[r], hook[r], want[r]);
    if (st) result(0, name, "%s", ks_last_error());
    else result(!why[0], name, "%s", why);
    GPU->free(GPU, dx);
    GPU->free(GPU, dout);
    free(x); free(want); free(got); free(hook);
}

static void argmax_cases(void) {
    argmax_case(64, 128256, 0);
    argmax_case(17, 128256, 1);
    argmax_case(9, 1000, 0);
    argmax_case(8, 13, 0);
    argmax_case(8, 1, 0);
    ks_status st = ks_cuda_argmax_rows(NULL, NULL, 0, 5, NULL);
    result(st == KS_ERR_ARG, "argmax rows: 0 rows refused", "%s", ks_last_error());
}

/* the step's greedy ids of `rows` rows of `cols` logits: the hook (launch + ids download) beside
 * downloading every row (what the host argmax needs first) */
static void argmax_time(int rows, int cols, int reps) {
    size_t n = (size_t)rows * cols;
    float *x = malloc(sizeof(float) * n), *h = NULL;
    argmax_rows_fill(x, rows, cols);
    float *dx = gpu_copy(x, n);
    int32_t *ids = malloc(sizeof(int32_t) * rows);
    ks_status st = dx ? KS_OK : KS_ERR_OOM;
    h = GPU->host_alloc ? GPU->host_alloc(GPU, sizeof(float) * cols) : malloc(sizeof(float) * cols);
    double ta = 0, td = 0;
    for (int r = -1; r < reps && !st; r++) {
        double t0 = now_s();
        st = GPU->argmax_rows(GPU, dx, rows, cols, ids);
        double t1 = now_s();
        for (int i = 0; i < rows && !st; i++) st = GPU->download(GPU, h, dx + (size_t)i * cols, sizeof(float) * cols);
        if (r >= 0) { ta += t1 - t0; td += now_s() - t1; }
    }
    char name[96];
    snprintf(name, sizeof name, "time: argmax of %d rows x %d", rows, cols);
    if (st) result(0, name, "%s", ks_last_error());
    else printf("  time  %-40s on the GPU %7.1f us (ids back) | %d row downloads %8.1f us\n", name, 1e6 * ta / reps, rows,
                1e6 * td / reps);
    if (GPU->host_free) GPU->host_free(GPU, h);
    else free(h);
    GPU->free(GPU, dx);
    free(x); free(ids);
}

int main(int argc, char **argv) {
    int time_only = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick")) g_quick = 1;
        else if (!strcmp(argv[i], "--time-only")) time_only = 1;
        else { fprintf(stderr, "usage: %s [--quick | --time-only]\n", argv[0]); return 2; }
    }
    ks_backend_opts go = ks_backend_opts_default();
    go.graphs = 0;
    if (ks_cpu_backend_create(NULL, &CPU) || ks_cuda_backend_create(&go, &GPU)) {
        fprintf(stderr, "backends: %s\n", ks_last_error());
        return 2;
    }
    if (time_only) {
        times(1);
        printf("%d passed, %d failed\n", g_pass, g_fail);
        ks_backend_free(GPU);
        ks_backend_free(CPU);
        return g_fail ? 1 : 0;
    }
    enum { ALL = 1 << 30 }; /* warps: more than any case's tiles, so one tile a piece */
    static const acase cases[] = {
        {"8B shape, automatic warps", 5, 8, 4, 128, 0, 0, 0, {0, 1, 37, 300, 1200}},
        {"8B shape, one warp walks every segment", 5, 8, 4, 128, 0, 1, 0, {0, 1, 37, 300, 1200}},
        {"8B shape, 3 warps (pieces straddle segments)", 5, 8, 4, 128, 0, 3, 0, {0, 1, 37, 300, 1200}},
        {"8B shape, one tile a piece (merges of many)", 5, 8, 4, 128, 0, ALL, 0, {0, 1, 37, 300, 1200}},
        {"8B shape, uneven heads, 7 warps", 4, 8, 4, 128, 0, 7, 1, {40, 129, 513, 1000}},
        {"g 1, d 64, window 64, 5 warps", 3, 2, 1, 64, 64, 5, 0, {5, 100, 513}},
        {"g 2, d 64, uneven heads, window 20, one tile a piece", 4, 4, 2, 64, 20, ALL, 1, {50, 60, 70, 300}},
        {"g 8, d 128, uneven heads, automatic", 2, 2, 8, 128, 0, 0, 1, {257, 1000}},
        {"g 8, d 128, one tile a piece", 3, 1, 8, 128, 0, ALL, 0, {2, 31, 600}},
        {"ragged: empty sessions among long ones, g 3, d 128", 6, 2, 3, 128, 0, 0, 0, {0, 4000, 15, 0, 1024, 16}},
        {"ragged: empty sessions among long ones, g 3, 11 warps", 6, 2, 3, 128, 0, 11, 0, {0, 4000, 15, 0, 1024, 16}},
        {"g 5, d 64, window 100, 13 warps", 3, 3, 5, 64, 100, 13, 0, {16, 17, 700}},
        {"g 6, d 128, uneven heads, 9 warps", 3, 2, 6, 128, 0, 9, 1, {33, 500, 64}},
        {"g 7, d 64, automatic", 3, 2, 7, 64, 0, 0, 0, {1, 250, 2048}},
        {"every session empty (the new rows only)", 4, 8, 4, 128, 0, 0, 0, {0, 0, 0, 0}},
        {"8 sessions, d 64, g 4, 2 warps", 8, 2, 4, 64, 0, 2, 0, {3, 900, 64, 65, 0, 48, 2000, 7}},
        {"d 96: the per-session fallback", 3, 2, 4, 96, 0, 0, 0, {7, 90, 400}},
        {"g 16: the per-session fallback", 2, 1, 16, 64, 0, 0, 0, {20, 300}},
        {"1024 KV heads: the descriptors uploaded, not inline", 3, 1024, 1, 64, 0, 0, 0, {40, 300, 0}},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) run_case(&cases[i]);
    { /* refused arguments: an error, nothing runs */
        ks_status st = ks_cuda_attn_decode_batch_run(GPU, 1, NULL, NULL, NULL, NULL, NULL, 32, 1.0f, 0, NULL, NULL, -1);
        result(st == KS_ERR_ARG, "negative warp count refused", "%s", ks_last_error());
        st = ks_cuda_attn_decode_batch_run(GPU, 1, NULL, NULL, NULL, NULL, NULL, 32, 1.0f, 0, NULL, NULL, 0);
        result(st == KS_ERR_ARG, "NULL arguments refused", "%s", ks_last_error());
        /* a bf16 copy asked for rows that are not one block (row 1 two rows past row 0): refused
         * before anything is read or launched, so the pointers are never dereferenced on the GPU */
        static float rows[4 * 32 * 128] __attribute__((aligned(16)));
        ks_kv_layer l2[2];
        memset(l2, 0, sizeof l2);
        for (int i = 0; i < 2; i++) { l2[i].n_kv_heads = 8; l2[i].head_dim = 128; }
        ks_kv_layer *lp[2] = {&l2[0], &l2[1]};
        const float *qp[2] = {rows, rows + 32 * 128};
        float *op[2] = {rows, rows + 2 * 32 * 128};
        int32_t pp[2] = {0, 0};
        uint16_t bf[1];
        st = ks_cuda_attn_decode_batch_run(GPU, 2, lp, qp, qp, qp, pp, 32, 1.0f, 0, op, bf, 0);
        result(st == KS_ERR_ARG, "bf16 copy of non-contiguous rows refused", "%s", ks_last_error());
    }
    argmax_cases();
    if (!g_quick) {
        times(0);
        argmax_time(64, 128256, 20);
    }
    printf("%d passed, %d failed\n", g_pass, g_fail);
    ks_backend_free(GPU);
    ks_backend_free(CPU);
    return g_fail ? 1 : 0;
}
