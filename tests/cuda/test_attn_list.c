/* test_attn_list.c — one decode row's attention over DEVICE index lists, with pre-RoPE keys rotated
 * inside the tensor-core decode kernel (kernels/attn_decode_tc.cu, ks_cuda_attn_decode_tc_list;
 * the CUDA backend's attention takes it for n = 1 with ks_attn_args.idx_dev and/or .rope), as
 * TokenSelect's ev:attend(list, {renumber = true}) runs it at every decode step and layer.
 *
 * Per case (random inputs, never zeros; the CPU is given the bf16-rounded K and V the GPU stores;
 * lists ascending, as the engine's check leaves them; outputs poisoned with NaN first):
 *   cpu    the backend's attention over the device lists against the CPU backend's (the
 *          reference: core/cpu_backend.c with host lists and rope): ||gpu - cpu|| / ||cpu|| < 1e-2
 *          and every (head) row < 3e-2, the tensor-core kernels' tolerance in test_cuda.c (Q, P
 *          and the rotated K are rounded to bf16 there, float32 on the CPU: ~3e-3 typical);
 *   old    bit-identical to the path it replaces, run here from its kernels on the same inputs:
 *          ks_cuda_attn_gather (bf16, rotated) + ks_cuda_attn_rope_q + ks_cuda_attn_decode_tc over
 *          the copy (the same float32 rotation, ks_rope_rot, and the same bf16 rounding of the
 *          rotated key; the splits the backend now takes for a list, ks_cuda_attn_decode_tc_list_splits,
 *          so the same summation order);
 *   host   with lists: the backend's host-list path (which still gathers) equals it bit for bit.
 * Row ranges (ks_attn_args.seg) around a device list against the whole list: ranges_case; a
 * page tail (seg_page) staged once and run as it grows: page_case.
 * Shapes: g = 1..8, head_dim 64 and 128, lists of 0..4096 rows out of 8K..128K, renumbered or at
 * the stored positions (with gaps), shared lists and per-head lists of different lengths, a
 * window, pre-RoPE and already-rotated rows, a list-less pre-RoPE row. Refusals: a list longer
 * than its head's rows (KS_ERR_ARG, nothing runs), unsorted and duplicate device lists flagged by
 * the backend's check_idx with the CPU's word (the engine refuses them before attention reads).
 * Then (--bench, not with --quick) the time of one layer at the Llama-3.1-8B shape (32 query heads,
 * 8 KV heads, d 128), a shared renumbered list of 2688 rows of 32768 and of 131072, pre-RoPE: the
 * old composition (host buffer upload, five pool buffers, gather, query rope, kernel, combine),
 * its kernels alone (at the old automatic splits), the new backend call and the new kernel alone
 * (with and without the rotation), then the new kernel at 8..49 splits; CUDA events around 200
 * back-to-back calls, median of 5; printed, never asserted.
 * Usage: test_attn_list [--quick] [--bench | --bench-only (the timing alone, for a profiler)]. Prints "N passed,
 * N failed"; exits 1 on failure. */
#include "attn_decode_tc.cuh"
#include "attn_prep.cuh"
#include "rope_table.cuh"
#include "backend.h"
#include "config.h"
#include "ks_cuda.h"
#include "testutil.h"

#include <cuda_runtime_api.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int g_pass, g_fail, g_quick;
static ks_backend *CPU, *GPU;

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

static uint64_t g_seed = 0x5eed14;
static float frand(void) { /* uniform in (-1, 1), never exactly 0 */
    g_seed = g_seed * 6364136223846793005ull + 1442695040888963407ull;
    float u = (float)((g_seed >> 40) & 0xffffff) / 16777216.0f * 2.0f - 1.0f;
    return u == 0.0f ? 0.37f : u;
}
static int irand(int n) { /* [0, n) */
    g_seed = g_seed * 6364136223846793005ull + 1442695040888963407ull;
    return (int)((g_seed >> 33) % (uint64_t)n);
}
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
static double row_relerr(const float *out, const float *ref, size_t rows, size_t d) {
    double worst = 0;
    for (size_t r = 0; r < rows; r++) {
        double v = relerr(out + r * d, ref + r * d, d);
        if (v > worst) worst = v;
    }
    return worst;
}

static void die(const char *what) {
    fprintf(stderr, "%s: %s\n", what, ks_last_error());
    exit(2);
}
static void *gpu_up(const void *src, size_t bytes) {
    void *d = GPU->alloc(GPU, bytes + 16);
    if (!d) die("gpu alloc");
    if (src && GPU->upload(GPU, d, src, bytes)) die("upload");
    return d;
}
static void gpu_nan(float *d, size_t n) {
    float *h = malloc(sizeof(float) * n);
    for (size_t i = 0; i < n; i++) h[i] = NAN;
    if (GPU->upload(GPU, d, h, sizeof(float) * n)) die("upload");
    free(h);
}
static float *gpu_get(const float *d, size_t n) {
    float *h = malloc(sizeof(float) * n);
    if (GPU->download(GPU, h, d, sizeof(float) * n)) die("download");
    return h;
}

/* N rows at positions pos appended to a GPU layer (and, with C non-NULL, the bf16-rounded same
 * rows to a CPU layer), in chunks (the float32 staging of 128K x 8 x 128 rows would be 512 MB) */
static void kv_fill(ks_kv_layer *G, ks_kv_layer *C, int Hkv, int d, int N, const int32_t *pos) {
    memset(G, 0, sizeof *G);
    G->n_kv_heads = Hkv;
    G->head_dim = d;
    if (GPU->kv_alloc(GPU, G, N)) die("kv_alloc");
    if (C) {
        memset(C, 0, sizeof *C);
        C->n_kv_heads = Hkv;
        C->head_dim = d;
        if (CPU->kv_alloc(CPU, C, N)) die("cpu kv_alloc");
    }
    int chunk = 8192;
    size_t m = (size_t)chunk * Hkv * d;
    float *k = malloc(sizeof(float) * m), *v = malloc(sizeof(float) * m);
    float *dk = gpu_up(NULL, sizeof(float) * m), *dv = gpu_up(NULL, sizeof(float) * m);
    for (int r0 = 0; r0 < N; r0 += chunk) {
        int n = N - r0 < chunk ? N - r0 : chunk;
        size_t e = (size_t)n * Hkv * d;
        for (size_t i = 0; i < e; i++) {
            k[i] = ks_bf16_to_f32(ks_f32_to_bf16(frand()));
            v[i] = ks_bf16_to_f32(ks_f32_to_bf16(frand()));
        }
        if (GPU->upload(GPU, dk, k, sizeof(float) * e) || GPU->upload(GPU, dv, v, sizeof(float) * e) ||
            GPU->kv_append(GPU, G, dk, dv, pos + r0, n))
            die("kv_append");
        if (C && CPU->kv_append(CPU, C, k, v, pos + r0, n)) die("cpu kv_append");
    }
    if (GPU->sync(GPU)) die("sync");
    GPU->free(GPU, dk);
    GPU->free(GPU, dv);
    free(k);
    free(v);
}

/* k distinct rows of [0, n), ascending (selection sampling) */
static void pick_sorted(int32_t *out, int k, int n) {
    int got = 0;
    for (int i = 0; i < n && got < k; i++)
        if ((long long)irand(n - i) < k - got) out[got++] = i;
}

/* The path this file's kernel replaced, from its kernels: the host buffer of cu_attention's
 * general path (qpos, nk, idx_off, inv_freq) uploaded, the attended rows gathered (rotated, bf16)
 * into a compact copy, the queries rotated, the tensor-core kernel over the copy. out (H, d). */
/* the backend's rotation mode for a pre-RoPE list (cuda_attn.cu list_rope_mode): 2 (the rope
 * table's split count) for renumbered lists at head_dim 64 / 128, else 1 */
static int rope_mode(int renumber, int d) { return renumber && (d == 64 || d == 128) ? 2 : 1; }

/* A rope table (rope_table.cuh) of `rows` rows for rope r at head_dim d, built on the backend's
 * stream; af_delta != 0 builds it for attn_factor + af_delta (a table the kernel must not use). */
static void *table_up(const ks_rope *r, int max_pos, int d, int rows, float af_delta) {
    float inv[64];
    ks_rope_inv_freq(r, max_pos, inv);
    void *t = GPU->alloc(GPU, ks_cuda_rope_table_bytes(rows, d));
    if (!t || ks_cuda_rope_table(ks_cuda_backend_stream(GPU), t, rows, d, inv, (float)r->attn_factor + af_delta)) die("rope table");
    return t;
}

typedef struct old_bufs {
    int32_t *pin; /* pinned host staging (the backend stages uploads through pinned memory too) */
    void *hb_dev, *kc, *vc, *pc, *qr, *ws;
} old_bufs;
/* alloc: the buffers from the backend's pool for this call (as cu_attention did), else b's.
 * list_splits: the kernel's splits as the backend now chooses them for a list
 * (ks_cuda_attn_decode_tc_list_splits: the bit-identity checks), else the automatic choice the
 * old path made (the timing of the old composition). */
static ks_status old_path(cudaStream_t s, float *out, const float *q, const ks_kv_layer *L, int H, int nsm,
                          const int32_t *dbase, const int *nk, const int *off, int qpos, int renumber, int window,
                          const ks_rope *rope, int rope_max_pos, int alloc, int list_splits, old_bufs *b) {
    int Hkv = L->n_kv_heads, d = L->head_dim, half = d / 2, max_nk = 0;
    int32_t *hb = b->pin; /* (1 + 2 Hkv + half) */
    hb[0] = qpos;
    for (int h = 0; h < Hkv; h++) {
        hb[1 + h] = nk[h];
        hb[1 + Hkv + h] = off[h];
        if (nk[h] > max_nk) max_nk = nk[h];
    }
    ks_rope_inv_freq(rope, rope_max_pos, (float *)(hb + 1 + 2 * Hkv));
    size_t words = 1 + 2 * (size_t)Hkv + half, rows = (size_t)Hkv * max_nk;
    ks_cuda_attn_params p;
    memset(&p, 0, sizeof p);
    p.out = out;
    p.q = q;
    p.k = L->k;
    p.v = L->v;
    p.kpos = (const int32_t *)L->pos_dev;
    p.n = 1;
    p.n_heads = H;
    p.n_kv_heads = Hkv;
    p.head_dim = d;
    p.capacity = L->capacity;
    p.scale = 1.0f / sqrtf((float)d);
    p.window = window;
    p.max_nk = max_nk;
    p.renumber = p.q_renumber = renumber;
    if (list_splits) p.splits = ks_cuda_attn_decode_tc_list_splits(&p, nsm, rope_mode(renumber, d));
    int splits;
    size_t wsb = ks_cuda_attn_decode_tc_workspace(&p, nsm, &splits);
    if (alloc) {
        b->ws = NULL;
        if (!(b->hb_dev = GPU->alloc(GPU, sizeof(int32_t) * words)) || !(b->kc = GPU->alloc(GPU, rows * d * 2)) ||
            !(b->vc = GPU->alloc(GPU, rows * d * 2)) || !(b->pc = GPU->alloc(GPU, rows * 4)) ||
            !(b->qr = GPU->alloc(GPU, sizeof(float) * H * d)) || (wsb && !(b->ws = GPU->alloc(GPU, wsb))))
            return ks_errorf(KS_ERR_OOM, "old path: allocation");
    }
    if (cudaMemcpyAsync(b->hb_dev, hb, sizeof(int32_t) * words, cudaMemcpyHostToDevice, s))
        return ks_errorf(KS_ERR_INTERNAL, "old path: upload");
    const int32_t *dq = (const int32_t *)b->hb_dev;
    const float *d_inv = (const float *)(dq + 1 + 2 * Hkv);
    p.qpos = dq;
    p.nk = dq + 1;
    p.idx_off = dq + 1 + Hkv;
    p.idx = dbase;
    ks_status st = ks_cuda_attn_gather(s, &p, d_inv, (float)rope->attn_factor, b->kc, 0, b->vc, (int32_t *)b->pc, max_nk);
    if (!st) st = ks_cuda_attn_rope_q(s, (float *)b->qr, q, 1, H, Hkv, d, p.qpos, p.nk, renumber, d_inv,
                                      (float)rope->attn_factor);
    p.k = b->kc;
    p.v = b->vc;
    p.kpos = (const int32_t *)b->pc;
    p.capacity = max_nk;
    p.idx = NULL;
    p.renumber = 0;
    p.q = (const float *)b->qr;
    if (!st) st = ks_cuda_attn_decode_tc(s, &p, splits, b->ws);
    if (alloc) {
        GPU->free(GPU, b->hb_dev);
        GPU->free(GPU, b->kc);
        GPU->free(GPU, b->vc);
        GPU->free(GPU, b->pc);
        GPU->free(GPU, b->qr);
        if (b->ws) GPU->free(GPU, b->ws);
    }
    return st;
}

typedef struct lcase {
    int Hkv, g, d, N;
    int k;        /* list length (per-head lists: the longest; -1: no list) */
    int renumber; /* keys at list slots 0..k-1 and the query at k - 1, else stored positions */
    int rope;     /* pre-RoPE rows and query */
    int per_head; /* per-head lists of different lengths (one of them empty) instead of a shared one */
    int gaps;     /* stored positions with gaps from 1000 */
    int window;
} lcase;

static void run_case(const lcase *c) {
    int Hkv = c->Hkv, g = c->g, H = Hkv * g, d = c->d, N = c->N;
    char name[200];
    snprintf(name, sizeof name, "g=%d Hkv=%d d=%d N=%d %s%s%s%s%s", g, Hkv, d, N,
             c->k < 0 ? "no list" : c->per_head ? "per-head lists" : "shared list", c->renumber ? " renumbered" : "",
             c->rope ? " pre-RoPE" : " rotated", c->gaps ? " gaps" : "", c->window ? " window" : "");
    char kname[48];
    snprintf(kname, sizeof kname, " k=%d", c->k);
    if (c->k >= 0 && strlen(name) + strlen(kname) < sizeof name) strcat(name, kname);
    int32_t *pos = malloc(sizeof(int32_t) * (N + 1));
    for (int i = 0, cur = c->gaps ? 1000 : 0; i <= N; i++) { pos[i] = cur; cur += c->gaps ? 1 + irand(3) : 1; }
    ks_kv_layer G, C;
    kv_fill(&G, &C, Hkv, d, N, pos);
    size_t qn = (size_t)H * d;
    float *q = malloc(sizeof(float) * qn);
    for (size_t i = 0; i < qn; i++) q[i] = frand() * 2.0f;
    ks_rope rope = kt_rope_llama3(d);
    int32_t qpos = pos[N]; /* the query after the last row */
    ks_attn_args a = {.n = 1, .n_heads = H, .qpos = &qpos, .scale = 1.0f / sqrtf((float)d), .window = c->window};
    if (c->rope) {
        a.rope = &rope;
        a.rope_max_pos = qpos;
    }
    /* lists: shared (every head the same pointer, as TokenSelect's one list) or per head */
    int32_t **idx = NULL, *cat = NULL, *dcat = NULL;
    const int32_t **didx = NULL;
    int *nidx = NULL, *off = NULL;
    if (c->k >= 0) {
        idx = calloc(Hkv, sizeof *idx);
        didx = calloc(Hkv, sizeof *didx);
        nidx = calloc(Hkv, sizeof *nidx);
        off = calloc(Hkv, sizeof *off);
        int lists = c->per_head ? Hkv : 1;
        cat = malloc(sizeof(int32_t) * ((size_t)lists * (c->k + 1)));
        size_t o = 0;
        for (int l = 0; l < lists; l++) {
            int k = !c->per_head ? c->k : l == 0 ? c->k : l == 1 ? 0 : 1 + irand(c->k);
            pick_sorted(cat + o, k, N);
            for (int h = c->per_head ? l : 0; h < (c->per_head ? l + 1 : Hkv); h++) {
                idx[h] = cat + o;
                nidx[h] = k;
                off[h] = (int)o;
            }
            o += k;
        }
        dcat = gpu_up(cat, sizeof(int32_t) * (o ? o : 1));
        for (int h = 0; h < Hkv; h++) didx[h] = dcat + off[h];
        a.idx = (const int32_t *const *)idx;
        a.n_idx = nidx;
        a.renumber = c->renumber;
    }
    /* the reference: the CPU backend with host lists */
    float *oc = malloc(sizeof(float) * qn);
    if (CPU->attention(CPU, oc, q, &C, &a)) die("cpu attention");
    /* the new path: the backend's attention, device lists */
    float *dq = gpu_up(q, sizeof(float) * qn), *dout = gpu_up(NULL, sizeof(float) * qn);
    gpu_nan(dout, qn);
    ks_attn_args ad = a;
    if (idx) {
        ad.idx = didx;
        ad.idx_dev = 1;
    }
    ks_status st = GPU->attention(GPU, dout, dq, &G, &ad);
    if (!st) st = GPU->sync(GPU);
    float *og = st ? NULL : gpu_get(dout, qn);
    if (st) {
        result(0, name, "%s", ks_last_error());
        goto done;
    }
    double e = relerr(og, oc, qn), er = row_relerr(og, oc, H, d);
    result(e < 1e-2 && er < 3e-2, name, "cpu: relerr %.2e (worst head %.2e)", e, er);
    char sub[240];
    if (c->rope && c->k != 0) { /* the old path from its kernels (no list: the rows in order): bit-identical */
        int nk[64], offs[64];
        for (int h = 0; h < Hkv; h++) { nk[h] = idx ? nidx[h] : N; offs[h] = idx ? off[h] : 0; }
        old_bufs b;
        memset(&b, 0, sizeof b);
        if (cudaMallocHost((void **)&b.pin, 4096)) die("cudaMallocHost");
        gpu_nan(dout, qn);
        cudaStream_t s = ks_cuda_backend_stream(GPU);
        st = old_path(s, dout, dq, &G, H, ks_cuda_backend_sm_count(GPU), dcat, nk, offs, qpos, c->renumber, c->window,
                      &rope, a.rope_max_pos, 1, 1, &b);
        if (!st) st = GPU->sync(GPU);
        cudaFreeHost(b.pin);
        snprintf(sub, sizeof sub, "%s: old gather path", name);
        if (st) result(0, sub, "%s", ks_last_error());
        else {
            float *oo = gpu_get(dout, qn);
            result(!memcmp(oo, og, sizeof(float) * qn), sub, "bit-identical: %s (relerr %.2e)",
                   memcmp(oo, og, sizeof(float) * qn) ? "no" : "yes", relerr(oo, og, qn));
            free(oo);
        }
    }
    if (idx && c->k > 0) { /* the backend's host-list path (gather + query rope + the same kernel) */
        gpu_nan(dout, qn);
        st = GPU->attention(GPU, dout, dq, &G, &a);
        if (!st) st = GPU->sync(GPU);
        snprintf(sub, sizeof sub, "%s: host lists", name);
        if (st) result(0, sub, "%s", ks_last_error());
        else {
            float *oh = gpu_get(dout, qn);
            result(!memcmp(oh, og, sizeof(float) * qn), sub, "bit-identical: %s (relerr %.2e)",
                   memcmp(oh, og, sizeof(float) * qn) ? "no" : "yes", relerr(oh, og, qn));
            free(oh);
        }
    }
    if ((idx && c->k > 0) || (!idx && c->rope)) { /* the recorded step's entry: counts from device memory */
        /* staged lists: counts, offsets and the query position uploaded as a recording's slot
         * holds them; no list: the counts + the step slot's delta (0 here) */
        ks_cuda_attn_params p;
        memset(&p, 0, sizeof p);
        p.out = dout;
        p.q = dq;
        p.k = G.k;
        p.v = G.v;
        p.kpos = (const int32_t *)G.pos_dev;
        p.n = 1;
        p.n_heads = H;
        p.n_kv_heads = Hkv;
        p.head_dim = d;
        p.capacity = G.capacity;
        p.scale = a.scale;
        p.window = c->window;
        int32_t hd[2 * 64 + 2], nk[64];
        for (int h = 0; h < Hkv; h++) {
            nk[h] = idx ? nidx[h] : N;
            hd[h] = nk[h];
            hd[Hkv + h] = idx ? off[h] : 0;
            p.max_nk = nk[h] > p.max_nk ? nk[h] : p.max_nk;
        }
        hd[2 * Hkv] = qpos;
        hd[2 * Hkv + 1] = 0;
        int32_t *dd = gpu_up(hd, sizeof hd);
        if (idx) {
            p.idx = dcat;
            p.nk = dd;
            p.idx_off = dd + Hkv;
            p.qpos = dd + 2 * Hkv;
            p.renumber = p.q_renumber = c->renumber;
        }
        p.splits = ks_cuda_attn_decode_tc_list_splits(&p, ks_cuda_backend_sm_count(GPU),
                                                      c->rope ? rope_mode(p.renumber, d) : 0);
        int splits;
        size_t wsb = ks_cuda_attn_decode_tc_workspace(&p, ks_cuda_backend_sm_count(GPU), &splits);
        void *ws = wsb ? GPU->alloc(GPU, wsb) : NULL;
        ks_cuda_attn_rope rr;
        memset(&rr, 0, sizeof rr);
        if (c->rope) {
            ks_rope_inv_freq(&rope, a.rope_max_pos, rr.inv_freq);
            rr.attn_factor = (float)rope.attn_factor;
        }
        gpu_nan(dout, qn);
        st = ks_cuda_attn_decode_tc_rec(ks_cuda_backend_stream(GPU), &p, idx ? NULL : nk, idx ? NULL : dd + 2 * Hkv,
                                        c->rope ? &rr : NULL, splits, ws);
        if (!st) st = GPU->sync(GPU);
        snprintf(sub, sizeof sub, "%s: recorded entry (%s)", name, idx ? "staged lists" : "counts + step slot");
        if (st) result(0, sub, "%s", ks_last_error());
        else {
            float *orc = gpu_get(dout, qn);
            result(!memcmp(orc, og, sizeof(float) * qn), sub, "bit-identical to the by-value launch: %s (relerr %.2e)",
                   memcmp(orc, og, sizeof(float) * qn) ? "no" : "yes", relerr(orc, og, qn));
            free(orc);
        }
        if (c->rope && p.renumber) {
            /* the same launch rotating with a (cos, sin) table: one covering every slot, one of
             * half the slots (the rest computed), one built for another attn_factor (the kernel
             * must see the header differ and compute): all the same bits as computing */
            static const char *tv[3] = {"every slot", "half the slots", "another rope's"};
            for (int vb = 0; vb < 6 && !st; vb++) { /* each table twice: blocks as in a held step, then as
                                                      * behind a handler (p.behind: the first tiles' table
                                                      * rows before the wait) */
                const int v = vb / 2;
                int rows = v == 1 ? (p.max_nk + 1) / 2 : p.max_nk;
                void *tab = table_up(&rope, a.rope_max_pos, d, rows, v == 2 ? 0.5f : 0.0f);
                rr.tab = tab;
                p.behind = vb % 2;
                gpu_nan(dout, qn);
                ks_status s2 = ks_cuda_attn_decode_tc_rec(ks_cuda_backend_stream(GPU), &p, NULL, NULL, &rr, splits, ws);
                if (!s2) s2 = GPU->sync(GPU);
                p.behind = 0;
                rr.tab = NULL;
                GPU->free(GPU, tab);
                snprintf(sub, sizeof sub, "%s: recorded, %s rope table%s", name, tv[v], vb % 2 ? ", as behind a handler" : "");
                if (s2) { result(0, sub, "%s", ks_last_error()); continue; }
                float *ot = gpu_get(dout, qn);
                result(!memcmp(ot, og, sizeof(float) * qn), sub, "bit-identical to the by-value launch: %s (relerr %.2e)",
                       memcmp(ot, og, sizeof(float) * qn) ? "no" : "yes", relerr(ot, og, qn));
                free(ot);
            }
        }
        if (ws) GPU->free(GPU, ws);
        GPU->free(GPU, dd);
    }
done:
    free(og);
    GPU->free(GPU, dq);
    GPU->free(GPU, dout);
    if (dcat) GPU->free(GPU, dcat);
    GPU->kv_free(GPU, &G);
    CPU->kv_free(CPU, &C);
    free(idx); free(didx); free(nidx); free(off); free(cat);
    free(q); free(oc); free(pos);
}

/* Row ranges around a device list (ks_attn_args.seg, TokenSelect's [0, nb) ++ sel ++ [N - na, N)):
 * the backend's attention with the middle list and the ranges against the same with the whole
 * list written out: bit-identical on the one-row tensor-core path (read in place) and on a path
 * that writes the list out first (the prefill planner's kernel, pinned), and within the
 * tensor-core tolerance of the CPU backend over the whole host list. */
static void ranges_case(int Hkv, int g, int d, int N, int nb, int k, int na, int rope_on) {
    int H = Hkv * g;
    char name[160];
    snprintf(name, sizeof name, "ranges g=%d Hkv=%d d=%d N=%d: [0, %d) ++ %d rows ++ the last %d%s", g, Hkv, d, N, nb, k,
             na, rope_on ? " pre-RoPE" : "");
    int32_t *pos = malloc(sizeof(int32_t) * (N + 1));
    for (int i = 0; i <= N; i++) pos[i] = i;
    ks_kv_layer G, C;
    kv_fill(&G, &C, Hkv, d, N, pos);
    size_t qn = (size_t)H * d;
    float *q = malloc(sizeof(float) * qn);
    for (size_t i = 0; i < qn; i++) q[i] = frand() * 2.0f;
    int w = nb + k + na;
    int32_t *whole = malloc(sizeof(int32_t) * w);
    for (int i = 0; i < nb; i++) whole[i] = i;
    pick_sorted(whole + nb, k, N - na - nb);
    for (int i = 0; i < k; i++) whole[nb + i] += nb;
    for (int i = 0; i < na; i++) whole[nb + k + i] = N - na + i;
    int32_t *dwhole = gpu_up(whole, sizeof(int32_t) * w), *dmid = gpu_up(whole + nb, sizeof(int32_t) * (k ? k : 1));
    ks_rope rope = kt_rope_llama3(d);
    int32_t qpos = N;
    const int32_t **hw = calloc(Hkv, sizeof *hw), **dw = calloc(Hkv, sizeof *dw), **dm = calloc(Hkv, sizeof *dm);
    int *nw = calloc(Hkv, sizeof *nw), *nm = calloc(Hkv, sizeof *nm);
    for (int h = 0; h < Hkv; h++) { hw[h] = whole; dw[h] = dwhole; dm[h] = dmid; nw[h] = w; nm[h] = k; }
    ks_attn_args a = {.n = 1, .n_heads = H, .qpos = &qpos, .scale = 1.0f / sqrtf((float)d), .renumber = 1};
    if (rope_on) { a.rope = &rope; a.rope_max_pos = qpos; }
    float *oc = malloc(sizeof(float) * qn);
    a.idx = hw; a.n_idx = nw;
    if (CPU->attention(CPU, oc, q, &C, &a)) die("cpu attention");
    float *dq = gpu_up(q, sizeof(float) * qn), *dout = gpu_up(NULL, sizeof(float) * qn);
    for (int path = 0; path < 2; path++) { /* 0: automatic (one row: read in place), 1: the prefill kernel, pinned */
        ks_cuda_backend_set_attn_path(GPU, path ? KS_CUDA_ATTN_FLASH : KS_CUDA_ATTN_AUTO);
        ks_attn_args aw = a, ar = a;
        aw.idx = dw; aw.n_idx = nw; aw.idx_dev = 1;
        ar.idx = dm; ar.n_idx = nm; ar.idx_dev = 1;
        ar.seg = 1; ar.seg_b0 = 0; ar.seg_b1 = nb; ar.seg_a0 = N - na; ar.seg_a1 = N;
        gpu_nan(dout, qn);
        ks_status st = GPU->attention(GPU, dout, dq, &G, &aw);
        if (!st) st = GPU->sync(GPU);
        float *ow = st ? NULL : gpu_get(dout, qn);
        gpu_nan(dout, qn);
        if (!st) st = GPU->attention(GPU, dout, dq, &G, &ar);
        if (!st) st = GPU->sync(GPU);
        char sub[220];
        snprintf(sub, sizeof sub, "%s, %s", name, path ? "prefill kernel (list written out)" : "one-row kernel (in place)");
        if (st) result(0, sub, "%s", ks_last_error());
        else {
            float *orr = gpu_get(dout, qn);
            double e = relerr(orr, oc, qn);
            int same = !memcmp(orr, ow, sizeof(float) * qn);
            result(same && e < 1e-2, sub, "bit-identical to the whole list: %s; cpu relerr %.2e", same ? "yes" : "no", e);
            free(orr);
        }
        free(ow);
    }
    ks_cuda_backend_set_attn_path(GPU, KS_CUDA_ATTN_AUTO);
    GPU->free(GPU, dq);
    GPU->free(GPU, dout);
    GPU->free(GPU, dwhole);
    GPU->free(GPU, dmid);
    GPU->kv_free(GPU, &G);
    CPU->kv_free(CPU, &C);
    free(hw); free(dw); free(dm); free(nw); free(nm);
    free(whole); free(q); free(oc); free(pos);
}

/* A page tail (ks_attn_args.seg_page, Quest's current page): per-head lists of k rows below the
 * page ++ the rows [(N - 1) / P * P, N), at the stored positions. The descriptor is staged once, at
 * N0 rows (a recording's slot: counts with the tail's na0, {0, 0, arel, na0, P}), then the
 * recorded entry runs it at N = N0 + delta rows (the step's query position from device memory)
 * for every delta to the page's end and one row past it (the next page, one row): each run
 * bit-identical to the backend's by-value attention with seg_page at that N (the same split count:
 * chosen for a full page), and within the tensor-core tolerance of the CPU over the whole lists. */
static void page_case(int Hkv, int g, int d, int N0, int k, int P) {
    int H = Hkv * g, p0 = (N0 - 1) / P * P, Nmax = p0 + P + 1;
    char name[160];
    int32_t *pos = malloc(sizeof(int32_t) * (Nmax + 1));
    for (int i = 0; i <= Nmax; i++) pos[i] = i;
    ks_kv_layer G, C;
    kv_fill(&G, &C, Hkv, d, Nmax, pos);
    size_t qn = (size_t)H * d;
    float *q = malloc(sizeof(float) * qn), *oc = malloc(sizeof(float) * qn);
    for (size_t i = 0; i < qn; i++) q[i] = frand() * 2.0f;
    int32_t *lists = malloc(sizeof(int32_t) * (size_t)Hkv * k);
    for (int h = 0; h < Hkv; h++) pick_sorted(lists + (size_t)h * k, k, p0);
    int32_t *dl = gpu_up(lists, sizeof(int32_t) * (size_t)Hkv * k);
    float *dq = gpu_up(q, sizeof(float) * qn), *dout = gpu_up(NULL, sizeof(float) * qn);
    const int32_t **dm = calloc(Hkv, sizeof *dm), **hw = calloc(Hkv, sizeof *hw);
    int *nm = calloc(Hkv, sizeof *nm), *nw = calloc(Hkv, sizeof *nw);
    int32_t *whole = malloc(sizeof(int32_t) * (size_t)Hkv * (k + P + 1));
    /* the staged descriptor at N0: counts, offsets, then the seg words, then the query position */
    const int na0 = N0 - p0;
    int32_t hd[2 * 64 + 6 + 1];
    for (int h = 0; h < Hkv; h++) { hd[h] = k + na0; hd[Hkv + h] = h * k; }
    int32_t seg0[6] = {0, 0, N0 - N0 /* a1 - (qpos + 1), qpos = N - 1 */, na0, P, 0};
    memcpy(hd + 2 * Hkv, seg0, sizeof seg0);
    ks_cuda_attn_params p;
    memset(&p, 0, sizeof p);
    p.out = dout; p.q = dq; p.k = G.k; p.v = G.v; p.kpos = (const int32_t *)G.pos_dev;
    p.n = 1; p.n_heads = H; p.n_kv_heads = Hkv; p.head_dim = d; p.capacity = G.capacity;
    p.scale = 1.0f / sqrtf((float)d);
    p.max_nk = k + P; /* a full page: the split count the backend takes for a page tail */
    int splits;
    size_t wsb = ks_cuda_attn_decode_tc_workspace(&p, ks_cuda_backend_sm_count(GPU), &splits);
    void *ws = wsb ? GPU->alloc(GPU, wsb) : NULL;
    for (int N = N0; N <= Nmax; N++) {
        int32_t qpos = N - 1, a0 = (N - 1) / P * P;
        snprintf(name, sizeof name, "page tail g=%d Hkv=%d d=%d P=%d: staged at %d rows, run at %d ([%d, %d))", g, Hkv, d, P,
                 N0, N, a0, N);
        int nv[64];
        for (int h = 0; h < Hkv; h++) nv[h] = N;
        ks_kv_layer GN = G, CN = C;
        GN.n = nv; CN.n = nv;
        for (int h = 0; h < Hkv; h++) {
            int32_t *w = whole + (size_t)h * (k + P + 1);
            memcpy(w, lists + (size_t)h * k, sizeof(int32_t) * k);
            for (int r = a0; r < N; r++) w[k + r - a0] = r;
            hw[h] = w; nw[h] = k + N - a0;
            dm[h] = dl + (size_t)h * k; nm[h] = k;
        }
        ks_attn_args a = {.n = 1, .n_heads = H, .qpos = &qpos, .scale = p.scale};
        a.idx = hw; a.n_idx = nw;
        if (CPU->attention(CPU, oc, q, &CN, &a)) die("cpu attention");
        ks_attn_args ar = a;
        ar.idx = dm; ar.n_idx = nm; ar.idx_dev = 1;
        ar.seg = 1; ar.seg_a0 = a0; ar.seg_a1 = N; ar.seg_page = P;
        gpu_nan(dout, qn);
        ks_status st = GPU->attention(GPU, dout, dq, &GN, &ar);
        if (!st) st = GPU->sync(GPU);
        float *ob = st ? NULL : gpu_get(dout, qn);
        /* the staged run: the query position of this step, the rest as staged at N0 */
        hd[2 * Hkv + 6] = qpos;
        int32_t *dd = gpu_up(hd, sizeof hd);
        p.idx = dl; p.nk = dd; p.idx_off = dd + Hkv; p.seg_dev = dd + 2 * Hkv; p.qpos = dd + 2 * Hkv + 6;
        gpu_nan(dout, qn);
        if (!st) st = ks_cuda_attn_decode_tc_rec(ks_cuda_backend_stream(GPU), &p, NULL, NULL, NULL, splits, ws);
        if (!st) st = GPU->sync(GPU);
        if (st) result(0, name, "%s", ks_last_error());
        else {
            float *os = gpu_get(dout, qn);
            double e = relerr(ob, oc, qn);
            int same = !memcmp(os, ob, sizeof(float) * qn);
            result(same && e < 1e-2, name, "staged run bit-identical to the by-value call: %s; cpu relerr %.2e",
                   same ? "yes" : "no", e);
            free(os);
        }
        if (N == N0) { /* the per-head lists written out with their tail (a path that does not read ranges) */
            ks_cuda_backend_set_attn_path(GPU, KS_CUDA_ATTN_FLASH);
            gpu_nan(dout, qn);
            ks_status s2 = GPU->attention(GPU, dout, dq, &GN, &ar);
            if (!s2) s2 = GPU->sync(GPU);
            ks_cuda_backend_set_attn_path(GPU, KS_CUDA_ATTN_AUTO);
            snprintf(name, sizeof name, "page tail g=%d Hkv=%d d=%d P=%d at %d rows: per-head lists written out (prefill kernel)",
                     g, Hkv, d, P, N);
            if (s2) result(0, name, "%s", ks_last_error());
            else {
                float *ow = gpu_get(dout, qn);
                double e = relerr(ow, oc, qn);
                result(e < 1e-2, name, "cpu relerr %.2e", e);
                free(ow);
            }
        }
        free(ob);
        GPU->free(GPU, dd);
    }
    if (ws) GPU->free(GPU, ws);
    GPU->free(GPU, dq);
    GPU->free(GPU, dout);
    GPU->free(GPU, dl);
    GPU->kv_free(GPU, &G);
    CPU->kv_free(CPU, &C);
    free(dm); free(hw); free(nm); free(nw); free(whole); free(lists);
    free(q); free(oc); free(pos);
}

/* The rope table against the CPU twin (core/cpu_backend.c's rotation: cos / sin of the float32
 * angle pos * inv_freq, times attn_factor): every (c, s) within 1e-6 of that product computed in
 * double (|c|, |s| <= 1.25 here: sincosf's 2 ulp plus one rounding is ~4e-7; a wrong layout or
 * frequency is off by O(1)), the header words exact; head_dim 64 and 128, positions 0..rows-1 at
 * rows 1 and 3000. The bits the kernel rotates with are checked against computing them in
 * run_case (the table variants of the recorded entry). */
static void table_values(void) {
    static const int dims[2] = {64, 128}, nrows[2] = {1, 3000};
    for (int di = 0; di < 2; di++)
        for (int ri = 0; ri < 2; ri++) {
            int d = dims[di], rows = nrows[ri], half = d / 2, hch = d / 16;
            ks_rope rope = kt_rope_llama3(d);
            rope.attn_factor = 1.25;
            float inv[64];
            ks_rope_inv_freq(&rope, 8192, inv);
            void *t = table_up(&rope, 8192, d, rows, 0.0f);
            size_t nf = ks_cuda_rope_table_bytes(rows, d) / 4;
            float *h = gpu_get((float *)t, nf);
            GPU->free(GPU, t);
            int bad_hdr = 0;
            double worst = 0;
            for (int f = 0; f < 64; f++) bad_hdr |= memcmp(&h[f], f < half ? &inv[f] : &(float){0.f}, 4) != 0;
            float af = 1.25f;
            int32_t hh = half, hr = rows;
            bad_hdr |= memcmp(&h[64], &af, 4) || memcmp(&h[65], &hh, 4) || memcmp(&h[66], &hr, 4);
            for (int p = 0; p < rows; p++)
                for (int q = 0; q < d / 4; q++) {
                    int i = q / hch, ch = q % hch;
                    for (int j = 0; j < 2; j++) {
                        int f = ch * 8 + 2 * i + j;
                        float ang = (float)p * inv[f];
                        const float *g = h + 4 * KS_CUDA_ROPE_TAB_HDR + (size_t)p * d + 4 * q + 2 * j;
                        worst = fmax(worst, fabs(g[0] - cos((double)ang) * af));
                        worst = fmax(worst, fabs(g[1] - sin((double)ang) * af));
                    }
                }
            free(h);
            char name[96];
            snprintf(name, sizeof name, "rope table d=%d rows=%d against the CPU's cos / sin", d, rows);
            result(worst <= 1e-6 && !bad_hdr, name, "worst |error| %.2e, header %s", worst, bad_hdr ? "wrong" : "exact");
        }
}

/* Refused input: a list longer than its head's rows; unsorted / duplicate device lists flagged by
 * check_idx exactly as the CPU backend flags them (the engine's check before attention). */
static void refusals(void) {
    int Hkv = 2, d = 128, H = 8, N = 100;
    int32_t *pos = malloc(sizeof(int32_t) * N);
    for (int i = 0; i < N; i++) pos[i] = i;
    ks_kv_layer G;
    kv_fill(&G, NULL, Hkv, d, N, pos);
    int32_t *list = malloc(sizeof(int32_t) * (N + 1));
    for (int i = 0; i <= N; i++) list[i] = i < N ? i : N - 1;
    int32_t *dl = gpu_up(list, sizeof(int32_t) * (N + 1));
    const int32_t *didx[2] = {dl, dl};
    int nidx[2] = {N + 1, 3};
    float *dq = gpu_up(NULL, sizeof(float) * H * d), *dout = gpu_up(NULL, sizeof(float) * H * d);
    ks_rope rope;
    memset(&rope, 0, sizeof rope);
    rope.type = KS_ROPE_DEFAULT;
    rope.head_dim = d;
    rope.theta = 10000.0;
    rope.attn_factor = 1.0;
    int32_t qpos = N;
    ks_attn_args a = {.n = 1, .n_heads = H, .qpos = &qpos, .scale = 0.1f, .idx = didx, .n_idx = nidx, .idx_dev = 1,
                      .renumber = 1, .rope = &rope, .rope_max_pos = N};
    ks_status st = GPU->attention(GPU, dout, dq, &G, &a);
    result(st == KS_ERR_ARG && strstr(ks_last_error(), "indices"), "a list longer than its head's rows is refused", "%s: %s",
           ks_status_name(st), ks_last_error());
    rope.head_dim = 64;
    nidx[0] = 3;
    st = GPU->attention(GPU, dout, dq, &G, &a);
    result(st == KS_ERR_UNSUPPORTED, "rope over fewer dims than the head is refused", "%s: %s", ks_status_name(st),
           ks_last_error());
    for (int fault = 0; fault < 3; fault++) { /* 0 ascending, 1 unsorted, 2 duplicate */
        int k = 40, lim[1] = {N};
        int32_t x[40];
        pick_sorted(x, k, N);
        if (fault == 1) { int32_t t = x[10]; x[10] = x[20]; x[20] = t; }
        if (fault == 2) x[30] = x[29];
        int32_t *dx = gpu_up(x, sizeof x);
        uint64_t *slot = gpu_up(NULL, 8), wc = 0, wg = 0;
        if (CPU->check_idx(CPU, x, 1, k, lim, &wc) || GPU->check_idx(GPU, dx, 1, k, lim, slot) ||
            GPU->download(GPU, &wg, slot, 8))
            die("check_idx");
        char nm[80];
        snprintf(nm, sizeof nm, "check_idx flags a%s device list as the CPU does",
                 fault == 0 ? "n ascending (no fault)" : fault == 1 ? "n unsorted" : " duplicate");
        /* all ones: no fault; else the fault's kind and place */
        result(wg == wc && (fault == 0) == (wg == ~0ull), nm, "word %llx (cpu %llx)", (unsigned long long)wg,
               (unsigned long long)wc);
        GPU->free(GPU, dx);
        GPU->free(GPU, slot);
    }
    GPU->free(GPU, dl);
    GPU->free(GPU, dq);
    GPU->free(GPU, dout);
    GPU->kv_free(GPU, &G);
    free(list);
    free(pos);
}

/* ---- --bench: one layer at the 8B shape */

static int cmp_f(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}

typedef struct bench_ctx {
    ks_kv_layer *L;
    float *out, *q;
    const int32_t *dl; /* the shared device list */
    int H, k, nsm;
    ks_rope *rope;
    old_bufs ob;       /* preallocated: the old kernels alone */
    void *ws;          /* the new kernel's workspace */
    void *tab;         /* a rope table (rope_table.cuh) for mode 5 */
    int splits;
} bench_ctx;

/* us per call: median over 5 runs of `iters` back-to-back calls between two events; want_splits:
 * the new kernel's splits for modes 3 and 4 (0: the backend's choice for this list) */
static float time_it(const char *label, bench_ctx *b, int mode, int want_splits, int iters, int *splits_used) {
    cudaStream_t s = ks_cuda_backend_stream(GPU);
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    int Hkv = b->L->n_kv_heads, nk[64], off[64];
    for (int h = 0; h < Hkv; h++) { nk[h] = b->k; off[h] = 0; }
    const int32_t *didx[64];
    for (int h = 0; h < Hkv; h++) didx[h] = b->dl;
    int32_t qpos = b->L->n[0];
    ks_attn_args a = {.n = 1, .n_heads = b->H, .qpos = &qpos, .scale = 1.0f / sqrtf((float)b->L->head_dim),
                      .idx = didx, .n_idx = nk, .idx_dev = 1, .renumber = 1, .rope = b->rope, .rope_max_pos = qpos};
    ks_cuda_attn_params p;
    memset(&p, 0, sizeof p);
    p.out = b->out;
    p.q = b->q;
    p.k = b->L->k;
    p.v = b->L->v;
    p.kpos = (const int32_t *)b->L->pos_dev;
    p.n = 1;
    p.n_heads = b->H;
    p.n_kv_heads = Hkv;
    p.head_dim = b->L->head_dim;
    p.capacity = b->L->capacity;
    p.scale = a.scale;
    p.max_nk = b->k;
    p.idx = b->dl;
    p.renumber = p.q_renumber = 1;
    p.splits = want_splits ? want_splits : ks_cuda_attn_decode_tc_list_splits(&p, b->nsm, mode == 4 ? 0 : mode == 5 ? 2 : 1);
    int splits;
    ks_cuda_attn_decode_tc_workspace(&p, b->nsm, &splits);
    if (splits_used) *splits_used = splits;
    ks_cuda_attn_rope rr;
    memset(&rr, 0, sizeof rr);
    ks_rope_inv_freq(b->rope, qpos, rr.inv_freq);
    rr.attn_factor = (float)b->rope->attn_factor;
    ks_cuda_attn_rope rt = rr;
    rt.tab = b->tab;
    float t[5];
    ks_status st = KS_OK;
    old_bufs fresh = b->ob; /* mode 0: its own buffers each call, only the staging shared */
    for (int rep = -1; rep < 5 && !st; rep++) { /* rep -1: warm-up */
        cudaEventRecord(e0, s);
        for (int i = 0; i < iters && !st; i++) {
            switch (mode) {
            case 0: st = old_path(s, b->out, b->q, b->L, b->H, b->nsm, b->dl, nk, off, qpos, 1, 0, b->rope, qpos, 1, 0, &fresh); break;
            case 1: st = old_path(s, b->out, b->q, b->L, b->H, b->nsm, b->dl, nk, off, qpos, 1, 0, b->rope, qpos, 0, 0, &b->ob); break;
            case 2: st = GPU->attention(GPU, b->out, b->q, b->L, &a); break;
            case 3: st = ks_cuda_attn_decode_tc_list(s, &p, nk, off, qpos, &rr, splits, b->ws); break;
            case 4: st = ks_cuda_attn_decode_tc_list(s, &p, nk, off, qpos, NULL, splits, b->ws); break;
            case 5: st = ks_cuda_attn_decode_tc_list(s, &p, nk, off, qpos, &rt, splits, b->ws); break;
            }
        }
        cudaEventRecord(e1, s);
        cudaEventSynchronize(e1);
        float ms = 0;
        cudaEventElapsedTime(&ms, e0, e1);
        if (rep >= 0) t[rep] = ms * 1000.0f / iters;
    }
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    if (st) {
        result(0, label, "%s", ks_last_error());
        return -1;
    }
    qsort(t, 5, sizeof t[0], cmp_f);
    return t[2];
}

static void bench(int N) {
    int Hkv = 8, H = 32, d = 128, k = 2688, iters = 200; /* g = 4 */
    int32_t *pos = malloc(sizeof(int32_t) * N);
    for (int i = 0; i < N; i++) pos[i] = i;
    ks_kv_layer L;
    kv_fill(&L, NULL, Hkv, d, N, pos);
    int32_t *list = malloc(sizeof(int32_t) * k);
    /* TokenSelect's shape: 128 leading rows, 2048 selected, 512 trailing */
    for (int i = 0; i < 128; i++) list[i] = i;
    pick_sorted(list + 128, 2048, N - 640);
    for (int i = 128; i < 2176; i++) list[i] += 128;
    for (int i = 0; i < 512; i++) list[2176 + i] = N - 512 + i;
    float *q = malloc(sizeof(float) * H * d);
    for (int i = 0; i < H * d; i++) q[i] = frand();
    ks_rope rope = kt_rope_llama3(d);
    bench_ctx b;
    memset(&b, 0, sizeof b);
    b.L = &L;
    b.H = H;
    b.k = k;
    b.nsm = ks_cuda_backend_sm_count(GPU);
    b.rope = &rope;
    b.dl = gpu_up(list, sizeof(int32_t) * k);
    b.q = gpu_up(q, sizeof(float) * H * d);
    b.out = gpu_up(NULL, sizeof(float) * H * d);
    ks_cuda_attn_params p;
    memset(&p, 0, sizeof p);
    p.n = 1;
    p.n_heads = H;
    p.n_kv_heads = Hkv;
    p.head_dim = d;
    p.max_nk = k;
    p.splits = 64; /* the workspace of the most splits timed below */
    size_t wsb = ks_cuda_attn_decode_tc_workspace(&p, b.nsm, &b.splits), rows = (size_t)Hkv * k;
    b.ws = wsb ? gpu_up(NULL, wsb) : NULL;
    b.ob.hb_dev = gpu_up(NULL, 4096);
    b.ob.kc = gpu_up(NULL, rows * d * 2);
    b.ob.vc = gpu_up(NULL, rows * d * 2);
    b.ob.pc = gpu_up(NULL, rows * 4);
    b.ob.qr = gpu_up(NULL, sizeof(float) * H * d);
    b.ob.ws = b.ws;
    if (cudaMallocHost((void **)&b.ob.pin, 4096)) die("cudaMallocHost");
    double mb = 2.0 * rows * d * 2 / 1e6; /* K and V rows read */
    b.tab = table_up(&rope, N, d, KS_CUDA_ROPE_TAB_ROWS, 0.0f);
    static const char *what[] = {"old: upload + 5 buffers + gather + rope q + kernel", "old kernels alone (buffers kept)",
                                 "new: backend attention (device list)", "new kernel alone (rotating, sincosf)",
                                 "new kernel alone, no rotation (rows as if rotated)", "new kernel alone, rope table"};
    float us[6];
    int used[6] = {0};
    for (int m = 0; m < 6; m++) {
        char label[160];
        snprintf(label, sizeof label, "bench N=%d k=%d: %s", N, k, what[m]);
        us[m] = time_it(label, &b, m, 0, iters, &used[m]);
        if (us[m] >= 0)
            printf("  time %-70s %8.2f us  (%.1f MB of K+V: %.2f TB/s)\n", label, us[m], mb, mb / us[m]);
    }
    printf("  time bench N=%d: new kernel %d splits (sincosf) / %d (table) on %d SMs (the old path: 16 at one block an "
           "SM); new backend call %.2fx of the old composition\n", N, used[3], used[5], b.nsm, us[0] > 0 ? us[2] / us[0] : 0.0);
    /* the new kernel at other split counts (one block an SM: 16 at 8 KV heads on 132 SMs) */
    static const int sweep[] = {8, 16, 24, 33, 42, 49};
    for (int i = 0; i < 6; i++) {
        int u3 = 0, u4 = 0, u5 = 0;
        float r = time_it("sweep", &b, 3, sweep[i], iters, &u3), n0 = time_it("sweep", &b, 4, sweep[i], iters, &u4);
        float tt = time_it("sweep", &b, 5, sweep[i], iters, &u5);
        printf("  time bench N=%d k=%d: splits %2d (ran %2d): rotating %8.2f us, table %8.2f us, no rotation %8.2f us\n",
               N, k, sweep[i], u3, r, tt, n0);
    }
    fflush(stdout);
    GPU->sync(GPU);
    GPU->free(GPU, (void *)b.dl);
    GPU->free(GPU, b.tab);
    GPU->free(GPU, b.q);
    GPU->free(GPU, b.out);
    if (b.ws) GPU->free(GPU, b.ws);
    GPU->free(GPU, b.ob.hb_dev);
    GPU->free(GPU, b.ob.kc);
    GPU->free(GPU, b.ob.vc);
    GPU->free(GPU, b.ob.pc);
    GPU->free(GPU, b.ob.qr);
    cudaFreeHost(b.ob.pin);
    GPU->kv_free(GPU, &L);
    free(list);
    free(q);
    free(pos);
}

int main(int argc, char **argv) {
    int want_bench = 0, bench_only = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick")) g_quick = 1;
        else if (!strcmp(argv[i], "--bench")) want_bench = 1;
        else if (!strcmp(argv[i], "--bench-only")) want_bench = bench_only = 1;
        else { fprintf(stderr, "usage: %s [--quick] [--bench | --bench-only]\n", argv[0]); return 2; }
    }
    ks_backend_opts go = ks_backend_opts_default();
    go.graphs = 0;
    if (ks_cpu_backend_create(NULL, &CPU) || ks_cuda_backend_create(&go, &GPU)) {
        fprintf(stderr, "backends: %s\n", ks_last_error());
        return 2;
    }
    static const lcase cases[] = {
        /* Hkv g d N k renumber rope per_head gaps window */
        {8, 4, 128, 32768, 2688, 1, 1, 0, 0, 0},   /* TokenSelect at the 8B shape */
        {2, 4, 128, 131072, 2688, 1, 1, 0, 0, 0},
        {1, 8, 128, 131072, 4096, 0, 1, 0, 0, 0},  /* stored positions past 105615: sincosf's slow path */
        {2, 1, 64, 8192, 1, 1, 1, 0, 0, 0},
        {2, 2, 64, 8192, 4096, 0, 1, 1, 1, 0},
        {4, 3, 128, 16384, 777, 1, 1, 1, 0, 0},
        {3, 5, 64, 10000, 100, 0, 1, 0, 1, 0},
        {2, 6, 128, 8192, 3000, 1, 0, 0, 0, 0},    /* device lists over rotated rows */
        {2, 7, 64, 20000, 513, 0, 0, 1, 1, 0},
        {1, 8, 64, 65536, 2048, 1, 1, 1, 0, 0},
        {4, 2, 128, 8192, 1000, 0, 1, 0, 1, 3000}, /* a window over stored positions */
        {2, 4, 128, 8192, 0, 1, 1, 0, 0, 0},       /* empty lists: zeros */
        {2, 4, 128, 8192, -1, 0, 1, 0, 1, 0},      /* one pre-RoPE row over the whole cache */
        {8, 1, 64, 12000, -1, 0, 1, 0, 0, 0},
    };
    int skipped = 0;
    for (size_t i = 0; !bench_only && i < sizeof cases / sizeof cases[0]; i++) {
        if (g_quick && (long long)cases[i].N * cases[i].Hkv > 100000) { skipped++; continue; }
        run_case(&cases[i]);
    }
    if (skipped) printf("  skip %d cases of more than 100000 rows (--quick)\n", skipped);
    if (!bench_only) {
        ranges_case(8, 4, 128, 32768, 128, 2048, 512, 1); /* TokenSelect at the 8B shape */
        ranges_case(2, 2, 64, 5000, 3, 700, 17, 1);
        ranges_case(2, 4, 128, 3000, 10, 1, 0, 0);          /* rotated rows, no trailing range */
        ranges_case(1, 8, 128, 3000, 0, 40, 33, 1);         /* no leading range */
        page_case(8, 4, 128, 32770, 4080, 16);              /* Quest at the 8B shape (budget 4096) */
        page_case(2, 2, 64, 1003, 40, 8);                   /* fewer splits: the tail's length counts */
        table_values();
        refusals();
    }
    if (want_bench && !g_quick) {
        bench(32768);
        bench(131072);
    }
    printf("%d passed, %d failed\n", g_pass, g_fail);
    ks_backend_free(GPU);
    ks_backend_free(CPU);
    return g_fail ? 1 : 0;
}
