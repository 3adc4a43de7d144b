/* cpu_backend.c — the reference backend: float32 everywhere, OpenBLAS sgemm for the linear
 * layers, OpenMP threads for attention and elementwise work. It is also the embedded default. */
#include "backend.h"

#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

struct ks_weight {
    float *data;   /* (rows, cols) */
    int64_t rows, cols;
    int owned;     /* data was allocated (converted or realigned) rather than mapped */
};

typedef struct cpu_ctx { int n_threads; } cpu_ctx;

/* ---------------------------------------------------------------- memory */

static void *cpu_alloc(ks_backend *b, size_t bytes) {
    void *p = NULL;
    if (posix_memalign(&p, 64, bytes ? bytes : 64)) {
        ks_errorf(KS_ERR_OOM, "cpu: out of memory allocating %zu bytes", bytes);
        return NULL;
    }
    return p;
}
static void cpu_free(ks_backend *b, void *p) { free(p); }
static ks_status cpu_memcpy(ks_backend *b, void *dst, const void *src, size_t n) {
    if (n) memmove(dst, src, n);
    return KS_OK;
}
static ks_status cpu_sync(ks_backend *b) { return KS_OK; }

/* ---------------------------------------------------------------- weights */

static ks_status cpu_weight_create(ks_backend *b, const ks_st_tensor *t, int64_t row0, int64_t rows, ks_weight **out) {
    int64_t cols = t->ndim == 1 ? 1 : t->shape[1];
    int64_t trows = t->shape[0];
    if (t->ndim < 1 || t->ndim > 2) return ks_errorf(KS_ERR_SHAPE, "tensor %s: expected 1 or 2 dims, has %d", t->name, t->ndim);
    if (row0 < 0 || rows < 0 || row0 + rows > trows)
        return ks_errorf(KS_ERR_SHAPE, "tensor %s: rows [%lld, %lld) out of its %lld rows", t->name, (long long)row0,
                         (long long)(row0 + rows), (long long)trows);
    ks_weight *w = ks_calloc(1, sizeof *w);
    if (!w) return KS_ERR_OOM;
    w->rows = rows;
    w->cols = cols;
    size_t n = (size_t)rows * (size_t)cols, esz = ks_dtype_size(t->dtype);
    const uint8_t *src = (const uint8_t *)t->data + (size_t)row0 * cols * esz;
    if (t->dtype == KS_DT_F32 && ((uintptr_t)src % 4) == 0) {
        w->data = (float *)src; /* mapped, zero copy */
        *out = w;
        return KS_OK;
    }
    w->data = cpu_alloc(b, n * sizeof(float));
    if (!w->data) { free(w); return KS_ERR_OOM; }
    w->owned = 1;
    switch (t->dtype) {
    case KS_DT_F32: memcpy(w->data, src, n * 4); break;
    case KS_DT_BF16:
        for (size_t i = 0; i < n; i++) { uint16_t h; memcpy(&h, src + 2 * i, 2); w->data[i] = ks_bf16_to_f32(h); }
        break;
    case KS_DT_F16:
        for (size_t i = 0; i < n; i++) { uint16_t h; memcpy(&h, src + 2 * i, 2); w->data[i] = ks_f16_to_f32(h); }
        break;
    default:
        free(w->data);
        free(w);
        return ks_errorf(KS_ERR_DTYPE, "tensor %s: dtype %s is not a float type (F32, F16 or BF16)", t->name,
                         ks_dtype_name(t->dtype));
    }
    *out = w;
    return KS_OK;
}

static ks_status cpu_weight_random(ks_backend *b, int64_t rows, int64_t cols, uint64_t seed, float scale, float offset,
                                   ks_weight **out) {
    ks_weight *w = ks_calloc(1, sizeof *w);
    if (!w) return KS_ERR_OOM;
    size_t n = (size_t)rows * (size_t)cols;
    w->data = cpu_alloc(b, n * sizeof(float));
    if (!w->data) { free(w); return KS_ERR_OOM; }
    w->rows = rows;
    w->cols = cols;
    w->owned = 1;
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        uint64_t st = seed * 0x9e3779b97f4a7c15ull + (uint64_t)r * 0xbf58476d1ce4e5b9ull + 1;
        for (int64_t c = 0; c < cols; c++) {
            st ^= st << 13; st ^= st >> 7; st ^= st << 17; /* xorshift64 */
            float u = (float)((st >> 40) + 1) / 16777218.0f - 0.5f; /* (-0.5, 0.5), never exactly 0 */
            w->data[r * cols + c] = offset + scale * u;
        }
    }
    *out = w;
    return KS_OK;
}

static void cpu_weight_free(ks_backend *b, ks_weight *w) {
    if (!w) return;
    if (w->owned) free(w->data);
    free(w);
}

/* ---------------------------------------------------------------- dense ops */

static ks_status cpu_matmul(ks_backend *b, float *y, const float *x, const ks_weight *W, const ks_weight *bias, int n,
                            int in, int out) {
    if (W->cols != in || W->rows != out)
        return ks_errorf(KS_ERR_INTERNAL, "matmul: weight is (%lld, %lld), expected (%d, %d)", (long long)W->rows,
                         (long long)W->cols, out, in);
    double t0 = b->count_stats ? ks_now() : 0;
    if (n == 1) cblas_sgemv(CblasRowMajor, CblasNoTrans, out, in, 1.0f, W->data, in, x, 1, 0.0f, y, 1);
    else cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, out, in, 1.0f, x, in, W->data, in, 0.0f, y, out);
    if (bias) {
        const float *bb = bias->data;
#pragma omp parallel for if (n > 16)
        for (int i = 0; i < n; i++)
            for (int j = 0; j < out; j++) y[(size_t)i * out + j] += bb[j];
    }
    if (b->count_stats) {
        b->stat_matmul_s += ks_now() - t0;
        b->stat_matmul_flop += 2.0 * n * in * out;
    }
    return KS_OK;
}

static ks_status cpu_embed(ks_backend *b, float *out, const ks_weight *E, const int32_t *ids, int n, int dim) {
    for (int i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= E->rows)
            return ks_errorf(KS_ERR_ARG, "embed: token id %d out of range [0, %lld)", ids[i], (long long)E->rows);
        memcpy(out + (size_t)i * dim, E->data + (size_t)ids[i] * dim, sizeof(float) * dim);
    }
    return KS_OK;
}

static ks_status cpu_rmsnorm(ks_backend *b, float *out, const float *x, const ks_weight *w, int n, int dim, float eps) {
#pragma omp parallel for if (n > 8)
    for (int i = 0; i < n; i++) {
        const float *xi = x + (size_t)i * dim;
        float *oi = out + (size_t)i * dim;
        double ss = 0;
        for (int j = 0; j < dim; j++) ss += (double)xi[j] * xi[j];
        float r = 1.0f / sqrtf((float)(ss / dim) + eps);
        for (int j = 0; j < dim; j++) oi[j] = w->data[j] * (xi[j] * r);
    }
    return KS_OK;
}

static ks_status cpu_rope(ks_backend *b, float *x, int n, int n_heads, const int32_t *pos, const ks_rope *r, int max_pos) {
    int d = r->head_dim, half = d / 2;
    float inv[512];
    if (half > 512) return ks_errorf(KS_ERR_UNSUPPORTED, "rope: head_dim %d too large", d);
    ks_rope_inv_freq(r, max_pos, inv);
    float af = (float)r->attn_factor;
#pragma omp parallel for if (n > 8)
    for (int i = 0; i < n; i++) {
        float c[512], s[512];
        for (int k = 0; k < half; k++) {
            float a = (float)pos[i] * inv[k]; /* float32 angle, as HF computes it */
            c[k] = cosf(a) * af;
            s[k] = sinf(a) * af;
        }
        for (int h = 0; h < n_heads; h++) {
            float *v = x + ((size_t)i * n_heads + h) * d;
            for (int k = 0; k < half; k++) {
                float x0 = v[k], x1 = v[k + half];
                v[k] = x0 * c[k] - x1 * s[k];
                v[k + half] = x1 * c[k] + x0 * s[k];
            }
        }
    }
    return KS_OK;
}

static ks_status cpu_swiglu(ks_backend *b, float *out, const float *gate, const float *up, size_t n) {
#pragma omp parallel for if (n > 65536)
    for (size_t i = 0; i < n; i++) {
        float g = gate[i];
        out[i] = g / (1.0f + expf(-g)) * up[i];
    }
    return KS_OK;
}

static ks_status cpu_add(ks_backend *b, float *x, const float *y, size_t n) {
#pragma omp parallel for if (n > 65536)
    for (size_t i = 0; i < n; i++) x[i] += y[i];
    return KS_OK;
}

static ks_status cpu_gather_rows(ks_backend *b, float *out, const float *x, const int32_t *idx, int k, int d) {
    for (int i = 0; i < k; i++) memmove(out + (size_t)i * d, x + (size_t)idx[i] * d, sizeof(float) * d);
    return KS_OK;
}

/* ---------------------------------------------------------------- KV cache */

static ks_status cpu_kv_alloc(ks_backend *b, ks_kv_layer *L, int capacity) {
    size_t rows = (size_t)L->n_kv_heads * capacity;
    float *k = cpu_alloc(b, rows * L->head_dim * sizeof(float));
    float *v = cpu_alloc(b, rows * L->head_dim * sizeof(float));
    int32_t *pos = ks_malloc(rows * sizeof(int32_t));
    if (!k || !v || !pos) { free(k); free(v); free(pos); return KS_ERR_OOM; }
    /* move existing rows (per head) into the new layout */
    if (L->k) {
        int keep = KS_MIN(capacity, L->capacity);
        for (int h = 0; h < L->n_kv_heads; h++) {
            int nh = KS_MIN(L->n[h], keep);
            memcpy(k + (size_t)h * capacity * L->head_dim, (float *)L->k + (size_t)h * L->capacity * L->head_dim,
                   sizeof(float) * nh * L->head_dim);
            memcpy(v + (size_t)h * capacity * L->head_dim, (float *)L->v + (size_t)h * L->capacity * L->head_dim,
                   sizeof(float) * nh * L->head_dim);
            memcpy(pos + (size_t)h * capacity, L->pos + (size_t)h * L->capacity, sizeof(int32_t) * nh);
            L->n[h] = nh;
        }
        free(L->k);
        free(L->v);
        free(L->pos);
    } else {
        if (!L->n) L->n = ks_calloc(L->n_kv_heads, sizeof(int));
        if (!L->n) { free(k); free(v); free(pos); return KS_ERR_OOM; }
    }
    L->k = k;
    L->v = v;
    L->pos = pos;
    L->capacity = capacity;
    return KS_OK;
}

static void cpu_kv_free(ks_backend *b, ks_kv_layer *L) {
    free(L->k);
    free(L->v);
    free(L->pos);
    free(L->n);
    L->k = L->v = NULL;
    L->pos = NULL;
    L->n = NULL;
    L->capacity = 0;
}

static ks_status cpu_kv_append(ks_backend *b, ks_kv_layer *L, const float *k, const float *v, const int32_t *pos, int n) {
    int need = 0;
    for (int h = 0; h < L->n_kv_heads; h++) need = KS_MAX(need, (L->n ? L->n[h] : 0) + n);
    if (!L->k || need > L->capacity) {
        int cap = KS_MAX(need, L->capacity * 2);
        ks_status st = cpu_kv_alloc(b, L, cap);
        if (st) return st;
    }
    int d = L->head_dim, H = L->n_kv_heads;
    for (int h = 0; h < H; h++) {
        float *kd = (float *)L->k + ((size_t)h * L->capacity + L->n[h]) * d;
        float *vd = (float *)L->v + ((size_t)h * L->capacity + L->n[h]) * d;
        int32_t *pd = L->pos + (size_t)h * L->capacity + L->n[h];
        for (int i = 0; i < n; i++) {
            memcpy(kd + (size_t)i * d, k + ((size_t)i * H + h) * d, sizeof(float) * d);
            memcpy(vd + (size_t)i * d, v + ((size_t)i * H + h) * d, sizeof(float) * d);
            pd[i] = pos[i];
        }
        L->n[h] += n;
    }
    return KS_OK;
}

static ks_status cpu_kv_retain(ks_backend *b, ks_kv_layer *L, const int32_t *const *idx, const int *cnt, int shrink) {
    int d = L->head_dim, maxc = 0;
    for (int h = 0; h < L->n_kv_heads; h++) {
        float *kb = (float *)L->k + (size_t)h * L->capacity * d, *vb = (float *)L->v + (size_t)h * L->capacity * d;
        int32_t *pb = L->pos + (size_t)h * L->capacity;
        for (int i = 0; i < cnt[h]; i++) { /* idx ascending, so idx[i] >= i: moving down is safe */
            int j = idx[h][i];
            if (j != i) {
                memcpy(kb + (size_t)i * d, kb + (size_t)j * d, sizeof(float) * d);
                memcpy(vb + (size_t)i * d, vb + (size_t)j * d, sizeof(float) * d);
                pb[i] = pb[j];
            }
        }
        L->n[h] = cnt[h];
        maxc = KS_MAX(maxc, cnt[h]);
    }
    if (shrink && maxc < L->capacity) return cpu_kv_alloc(b, L, KS_MAX(maxc, 1));
    return KS_OK;
}

/* Rotate one head vector v (d) at position p with precomputed inverse frequencies. */
static void rope_vec(float *v, int d, int32_t p, const float *inv, float af) {
    int half = d / 2;
    for (int k = 0; k < half; k++) {
        float a = (float)p * inv[k], c = cosf(a) * af, s = sinf(a) * af;
        float x0 = v[k], x1 = v[k + half];
        v[k] = x0 * c - x1 * s;
        v[k + half] = x1 * c + x0 * s;
    }
}

/* Attention of each (query row, head) pair over the visible keys, online softmax.
 * Pre-RoPE mode (a->rope): keys are rotated once per KV head into a scratch copy at their
 * effective positions, queries per (row, head). */
static ks_status cpu_attention(ks_backend *b, float *out, const float *q, const ks_kv_layer *L, const ks_attn_args *a) {
    int d = L->head_dim, H = a->n_heads, Hkv = L->n_kv_heads, g = H / Hkv;
    if (d > 1024) return ks_errorf(KS_ERR_UNSUPPORTED, "attention: head_dim %d > 1024", d);
    float inv[512];
    float *krot = NULL;      /* (Hkv, maxk, d) rotated keys in pre-RoPE mode */
    int maxk = 0;
    float af = 1.0f;
    if (a->rope) {
        ks_rope_inv_freq(a->rope, a->rope_max_pos, inv);
        af = (float)a->rope->attn_factor;
        for (int h = 0; h < Hkv; h++) maxk = KS_MAX(maxk, a->idx ? a->n_idx[h] : L->n[h]);
        krot = cpu_alloc(b, sizeof(float) * (size_t)Hkv * KS_MAX(maxk, 1) * d);
        if (!krot) return KS_ERR_OOM;
        for (int h = 0; h < Hkv; h++) {
            const int32_t *ix = a->idx ? a->idx[h] : NULL;
            int nk = ix ? a->n_idx[h] : L->n[h];
            const float *K = (const float *)L->k + (size_t)h * L->capacity * d;
            const int32_t *P = L->pos + (size_t)h * L->capacity;
#pragma omp parallel for if (nk > 256)
            for (int t = 0; t < nk; t++) {
                int j = ix ? ix[t] : t;
                float *dst = krot + ((size_t)h * maxk + t) * d;
                memcpy(dst, K + (size_t)j * d, sizeof(float) * d);
                rope_vec(dst, d, (ix && a->renumber) ? t : P[j], inv, af);
            }
        }
    }
#pragma omp parallel for collapse(2) schedule(dynamic, 4)
    for (int i = 0; i < a->n; i++) {
        for (int h = 0; h < H; h++) {
            int kv = h / g;
            const float *K = (const float *)L->k + (size_t)kv * L->capacity * d;
            const float *V = (const float *)L->v + (size_t)kv * L->capacity * d;
            const int32_t *P = L->pos + (size_t)kv * L->capacity;
            const int32_t *ix = a->idx ? a->idx[kv] : NULL;
            int nk = ix ? a->n_idx[kv] : L->n[kv];
            int32_t qp = (ix && a->renumber) ? nk - a->n + i : a->qpos[i];
            float qbuf[1024], acc[1024];
            const float *qi = q + ((size_t)i * H + h) * d;
            if (krot) {
                memcpy(qbuf, qi, sizeof(float) * d);
                rope_vec(qbuf, d, qp, inv, af);
                qi = qbuf;
            }
            float m = -INFINITY, l = 0;
            for (int t = 0; t < d; t++) acc[t] = 0;
            for (int t = 0; t < nk; t++) {
                int j = ix ? ix[t] : t;
                int32_t kp = (ix && a->renumber) ? t : P[j];
                if (kp > qp) continue;
                if (a->window > 0 && qp - kp >= a->window) continue;
                const float *kj = krot ? krot + ((size_t)kv * maxk + t) * d : K + (size_t)j * d;
                float s = 0;
                for (int c = 0; c < d; c++) s += qi[c] * kj[c];
                s *= a->scale;
                const float *vj = V + (size_t)j * d;
                if (s > m) {
                    float corr = expf(m - s);
                    l = l * corr + 1.0f;
                    for (int c = 0; c < d; c++) acc[c] = acc[c] * corr + vj[c];
                    m = s;
                } else {
                    float p = expf(s - m);
                    l += p;
                    for (int c = 0; c < d; c++) acc[c] += p * vj[c];
                }
            }
            float *oi = out + ((size_t)i * H + h) * d;
            float inv_l = l > 0 ? 1.0f / l : 0.0f;
            for (int c = 0; c < d; c++) oi[c] = acc[c] * inv_l;
        }
    }
    free(krot);
    return KS_OK;
}

static void cpu_destroy(ks_backend *b) {
    if (!b) return;
    free(b->ctx);
    free(b);
}

ks_status ks_cpu_backend_create(int n_threads, ks_backend **out) {
    ks_backend *b = ks_calloc(1, sizeof *b);
    cpu_ctx *c = ks_calloc(1, sizeof *c);
    if (!b || !c) { free(b); free(c); return KS_ERR_OOM; }
    if (n_threads > 0) {
        omp_set_num_threads(n_threads);
        openblas_set_num_threads(n_threads);
    }
    c->n_threads = n_threads > 0 ? n_threads : omp_get_max_threads();
    b->name = "cpu";
    b->ctx = c;
    b->alloc = cpu_alloc;
    b->free = cpu_free;
    b->upload = cpu_memcpy;
    b->download = cpu_memcpy;
    b->copy = cpu_memcpy;
    b->sync = cpu_sync;
    b->weight_create = cpu_weight_create;
    b->weight_free = cpu_weight_free;
    b->weight_random = cpu_weight_random;
    b->matmul = cpu_matmul;
    b->embed = cpu_embed;
    b->rmsnorm = cpu_rmsnorm;
    b->rope = cpu_rope;
    b->swiglu = cpu_swiglu;
    b->add = cpu_add;
    b->gather_rows = cpu_gather_rows;
    b->kv_alloc = cpu_kv_alloc;
    b->kv_free = cpu_kv_free;
    b->kv_append = cpu_kv_append;
    b->kv_retain = cpu_kv_retain;
    b->attention = cpu_attention;
    b->destroy = cpu_destroy;
    *out = b;
    return KS_OK;
}
