/* cpu_backend.c — the reference backend: float32 everywhere, the fixed-order products of
 * cpu_gemm.h for the linear layers and attention, and a sleeping thread pool (pool.h) for every
 * parallel loop. It is also the embedded default.
 *
 * Determinism: every value an op writes is computed by one thread with the same operations
 * whatever its row, the thread count or the CPU (no BLAS, no FMA), so identical input rows give
 * bit-identical output rows, and a run gives the same bits on every machine with this binary. */
#include "cpu_int.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- memory accounting */

/* Open addressing over pointer keys (linear probing, tombstones); the counters follow every
 * add/remove, the peak is taken at each add. */
#define MT_EMPTY ((uintptr_t)0)
#define MT_TOMB ((uintptr_t)1)
struct ks_memtrack {
    pthread_mutex_t mu;
    uintptr_t *key;      /* (cap) */
    size_t *bytes;       /* (cap) */
    unsigned char *kind; /* (cap) */
    size_t cap, used;    /* slots; slots not empty (live + tombstones) */
    size_t cur[2], peak, peak_split[2];
};

ks_memtrack *ks_memtrack_create(void) {
    ks_memtrack *t = ks_calloc(1, sizeof *t);
    if (!t) return NULL;
    pthread_mutex_init(&t->mu, NULL);
    return t;
}

void ks_memtrack_free(ks_memtrack *t) {
    if (!t) return;
    pthread_mutex_destroy(&t->mu);
    free(t->key);
    free(t->bytes);
    free(t->kind);
    free(t);
}

static size_t mt_hash(uintptr_t k, size_t cap) {
    uint64_t h = (uint64_t)k * 0x9e3779b97f4a7c15ull;
    return (size_t)(h >> 17) & (cap - 1);
}

static int mt_grow(ks_memtrack *t) {
    size_t ncap = t->cap ? t->cap * 2 : 256;
    uintptr_t *nk = calloc(ncap, sizeof *nk);
    size_t *nb = calloc(ncap, sizeof *nb);
    unsigned char *nd = calloc(ncap, 1);
    if (!nk || !nb || !nd) { free(nk); free(nb); free(nd); return -1; }
    size_t used = 0;
    for (size_t i = 0; i < t->cap; i++) {
        if (t->key[i] <= MT_TOMB) continue;
        size_t j = mt_hash(t->key[i], ncap);
        while (nk[j]) j = (j + 1) & (ncap - 1);
        nk[j] = t->key[i];
        nb[j] = t->bytes[i];
        nd[j] = t->kind[i];
        used++;
    }
    free(t->key); free(t->bytes); free(t->kind);
    t->key = nk; t->bytes = nb; t->kind = nd;
    t->cap = ncap;
    t->used = used;
    return 0;
}

ks_status ks_memtrack_add(ks_memtrack *t, const void *p, size_t bytes, int kind) {
    if (!t || !p) return KS_OK;
    uintptr_t k = (uintptr_t)p;
    kind = kind ? 1 : 0;
    pthread_mutex_lock(&t->mu);
    if ((t->used + 1) * 2 > t->cap && mt_grow(t)) {
        pthread_mutex_unlock(&t->mu);
        return ks_errorf(KS_ERR_OOM, "memory accounting: cannot grow its table");
    }
    size_t j = mt_hash(k, t->cap), tomb = (size_t)-1;
    for (;; j = (j + 1) & (t->cap - 1)) {
        if (t->key[j] == k) { /* re-registered pointer: replace */
            t->cur[t->kind[j]] -= t->bytes[j];
            break;
        }
        if (t->key[j] == MT_TOMB && tomb == (size_t)-1) tomb = j;
        if (t->key[j] == MT_EMPTY) {
            if (tomb != (size_t)-1) j = tomb;
            else t->used++;
            break;
        }
    }
    t->key[j] = k;
    t->bytes[j] = bytes;
    t->kind[j] = (unsigned char)kind;
    t->cur[kind] += bytes;
    if (t->cur[0] + t->cur[1] > t->peak) {
        t->peak = t->cur[0] + t->cur[1];
        t->peak_split[0] = t->cur[0];
        t->peak_split[1] = t->cur[1];
    }
    pthread_mutex_unlock(&t->mu);
    return KS_OK;
}

size_t ks_memtrack_remove(ks_memtrack *t, const void *p) {
    if (!t || !p) return 0;
    uintptr_t k = (uintptr_t)p;
    size_t r = 0;
    pthread_mutex_lock(&t->mu);
    if (t->cap)
        for (size_t j = mt_hash(k, t->cap), probes = 0; probes < t->cap; j = (j + 1) & (t->cap - 1), probes++) {
            if (t->key[j] == MT_EMPTY) break;
            if (t->key[j] == k) {
                r = t->bytes[j];
                t->cur[t->kind[j]] -= r;
                t->key[j] = MT_TOMB;
                break;
            }
        }
    pthread_mutex_unlock(&t->mu);
    return r;
}

void ks_memtrack_stats(ks_memtrack *t, ks_mem_stats *o, int reset_peak) {
    memset(o, 0, sizeof *o);
    if (!t) return;
    pthread_mutex_lock(&t->mu);
    if (reset_peak) {
        t->peak = t->cur[0] + t->cur[1];
        t->peak_split[0] = t->cur[0];
        t->peak_split[1] = t->cur[1];
    }
    o->fixed = t->cur[0];
    o->scratch = t->cur[1];
    o->cur = o->fixed + o->scratch;
    o->peak = t->peak;
    o->peak_fixed = t->peak_split[0];
    o->peak_scratch = t->peak_split[1];
    pthread_mutex_unlock(&t->mu);
}

/* ---------------------------------------------------------------- memory */

/* kind: 0 = weights / KV cache, 1 = activations and temporaries (mem_stats' split; cpu_int.h) */
void *cpu_alloc_kind(ks_backend *b, size_t bytes, int kind) {
    void *p = NULL;
    if (posix_memalign(&p, 64, bytes ? bytes : 64)) {
        ks_errorf(KS_ERR_OOM, "cpu: out of memory allocating %zu bytes", bytes);
        return NULL;
    }
    if (ks_memtrack_add(((cpu_ctx *)b->ctx)->mem, p, bytes, kind)) {
        free(p);
        return NULL;
    }
    return p;
}
static void *cpu_alloc(ks_backend *b, size_t bytes) { return cpu_alloc_kind(b, bytes, 1); }
void cpu_free(ks_backend *b, void *p) {
    if (!p) return;
    ks_memtrack_remove(((cpu_ctx *)b->ctx)->mem, p);
    free(p);
}
static void cpu_mem_stats(ks_backend *b, ks_mem_stats *out, int reset_peak) {
    ks_memtrack_stats(((cpu_ctx *)b->ctx)->mem, out, reset_peak);
}
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
    w->data = cpu_alloc_kind(b, n * sizeof(float), 0);
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
        cpu_free(b, w->data);
        free(w);
        return ks_errorf(KS_ERR_DTYPE, "tensor %s: dtype %s is not a float type (F32, F16 or BF16)", t->name,
                         ks_dtype_name(t->dtype));
    }
    *out = w;
    return KS_OK;
}

/* ---------------------------------------------------------------- parallel ranges */

/* cpu_par_range (cpu_int.h): the range cut into at most 4 chunks a thread */
typedef struct range_job { range_fn fn; void *ctx; int64_t n, chunk; } range_job;

static void range_task(void *c, int64_t t, int thread) {
    const range_job *j = c;
    int64_t b0 = t * j->chunk;
    j->fn(j->ctx, b0, KS_MIN(j->n, b0 + j->chunk));
}

void cpu_par_range(ks_backend *b, int64_t n, int64_t grain, range_fn fn, void *ctx) {
    ks_pool *p = ((cpu_ctx *)b->ctx)->pool;
    int nt = ks_pool_threads(p);
    if (n <= grain || nt == 1) {
        if (n > 0) fn(ctx, 0, n);
        return;
    }
    int64_t chunks = KS_MIN((n + grain - 1) / grain, 4 * (int64_t)nt);
    range_job j = {fn, ctx, n, (n + chunks - 1) / chunks};
    ks_pool_run(p, (n + j.chunk - 1) / j.chunk, range_task, &j);
}

/* ---------------------------------------------------------------- random weights */

typedef struct rand_job { float *data; int64_t cols; uint64_t seed; float scale, offset; } rand_job;

static void rand_rows(void *c, int64_t r0, int64_t r1) {
    const rand_job *j = c;
    for (int64_t r = r0; r < r1; r++) {
        uint64_t st = j->seed * 0x9e3779b97f4a7c15ull + (uint64_t)r * 0xbf58476d1ce4e5b9ull + 1;
        for (int64_t c2 = 0; c2 < j->cols; c2++) {
            st ^= st << 13; st ^= st >> 7; st ^= st << 17; /* xorshift64 */
            float u = (float)((st >> 40) + 1) / 16777218.0f - 0.5f; /* (-0.5, 0.5), never exactly 0 */
            j->data[r * j->cols + c2] = j->offset + j->scale * u;
        }
    }
}

static ks_status cpu_weight_random(ks_backend *b, int64_t rows, int64_t cols, uint64_t seed, float scale, float offset,
                                   ks_weight **out) {
    ks_weight *w = ks_calloc(1, sizeof *w);
    if (!w) return KS_ERR_OOM;
    size_t n = (size_t)rows * (size_t)cols;
    w->data = cpu_alloc_kind(b, n * sizeof(float), 0);
    if (!w->data) { free(w); return KS_ERR_OOM; }
    w->rows = rows;
    w->cols = cols;
    w->owned = 1;
    rand_job j = {w->data, cols, seed, scale, offset};
    cpu_par_range(b, rows, KS_MAX(1, 65536 / KS_MAX(cols, 1)), rand_rows, &j);
    *out = w;
    return KS_OK;
}

static void cpu_weight_free(ks_backend *b, ks_weight *w) {
    if (!w) return;
    if (w->owned) cpu_free(b, w->data);
    free(w);
}

/* ---------------------------------------------------------------- KV cache */

static ks_status cpu_kv_alloc(ks_backend *b, ks_kv_layer *L, int capacity) {
    size_t rows = (size_t)L->n_kv_heads * capacity;
    float *k = cpu_alloc_kind(b, rows * L->head_dim * sizeof(float), 0);
    float *v = cpu_alloc_kind(b, rows * L->head_dim * sizeof(float), 0);
    int32_t *pos = ks_malloc(rows * sizeof(int32_t));
    if (!k || !v || !pos) { cpu_free(b, k); cpu_free(b, v); free(pos); return KS_ERR_OOM; }
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
        cpu_free(b, L->k);
        cpu_free(b, L->v);
        free(L->pos);
    } else {
        if (!L->n) L->n = ks_calloc(L->n_kv_heads, sizeof(int));
        if (!L->n) { cpu_free(b, k); cpu_free(b, v); free(pos); return KS_ERR_OOM; }
    }
    L->k = k;
    L->v = v;
    L->pos = pos;
    L->capacity = capacity;
    return KS_OK;
}

static void cpu_kv_free(ks_backend *b, ks_kv_layer *L) {
    cpu_free(b, L->k);
    cpu_free(b, L->v);
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
        int asc = 1;
        for (int i = 1; i < cnt[h] && asc; i++) asc = idx[h][i] > idx[h][i - 1];
        if (!asc) { /* another order (a KV ring put back in order): through a copy of the head's rows */
            size_t rows = (size_t)L->n[h];
            float *t = ks_malloc(sizeof(float) * (2 * rows * d + 1));
            int32_t *tp = ks_malloc(sizeof(int32_t) * (rows + 1));
            if (!t || !tp) { free(t); free(tp); return KS_ERR_OOM; }
            memcpy(t, kb, sizeof(float) * rows * d);
            memcpy(t + rows * d, vb, sizeof(float) * rows * d);
            memcpy(tp, pb, sizeof(int32_t) * rows);
            for (int i = 0; i < cnt[h]; i++) {
                int j = idx[h][i];
                memcpy(kb + (size_t)i * d, t + (size_t)j * d, sizeof(float) * d);
                memcpy(vb + (size_t)i * d, t + (rows + j) * d, sizeof(float) * d);
                pb[i] = tp[j];
            }
            free(t);
            free(tp);
        }
        for (int i = 0; asc && i < cnt[h]; i++) { /* idx ascending, so idx[i] >= i: moving down is safe */
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

/* check_idx (backend.h): the first bad entry in list order, then out-of-range entries set to 0
 * (kernels/check_idx.cu is its CUDA twin). */
static ks_status cpu_check_idx(ks_backend *b, int32_t *x, int rows, int k, const int *lim, uint64_t *slot) {
    (void)b;
    uint64_t key = UINT64_MAX;
    for (int r = 0; r < rows && key == UINT64_MAX; r++)
        for (int i = 0; i < k; i++) {
            int32_t v = x[(size_t)r * k + i], p = i ? x[(size_t)r * k + i - 1] : INT32_MIN;
            int why = v < 0 || v >= lim[r] ? 1 : i && v < p ? 2 : i && v == p ? 3 : 0;
            if (why) { key = (uint64_t)((int64_t)r * k + i) << 34 | (uint64_t)why << 32 | (uint32_t)v; break; }
        }
    for (int r = 0; r < rows; r++)
        for (int i = 0; i < k; i++)
            if (x[(size_t)r * k + i] < 0 || x[(size_t)r * k + i] >= lim[r]) x[(size_t)r * k + i] = 0;
    *slot = key;
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

/* Attention, blocked: for each KV head and block of query rows, S = Q K^T and O = P V run over
 * key chunks with an online softmax across chunks (flash-attention's recurrence at block
 * granularity), so no n x n matrix exists. Keys come straight from the cache, or from a gathered
 * copy when an index list or pre-RoPE rotation is in play. Masking is by position: key visible
 * iff kpos <= qpos (and within the sliding window). Each score is ks_dot (scaled after), each
 * output element sums its chunk's terms in key order: a row's result depends on its own query
 * and the keys it sees, never on its block, task or thread. */
#define ATT_QB 64     /* query rows per block */
#define ATT_KC 1024   /* keys per chunk */

/* Per-thread scratch of the attention tasks. */
typedef struct att_scratch {
    float *Qb;   /* (g * QB, d) the block's queries, by (query head in the group, row) */
    float *S;    /* (g * QB, KC) scores, then probabilities */
    float *Ob;   /* (g * QB, d) unnormalised output */
    float *mx, *sm; /* (g * QB) running max and sum */
    int32_t *qp; /* (g * QB) query positions */
} att_scratch;

typedef struct att_job {
    float *out;
    const float *q;
    const ks_kv_layer *L;
    const ks_attn_args *a;
    int d, H, Hkv, g, n, nqb, maxk, gathered;
    const float *kg, *vg;  /* (Hkv, maxk, d) gathered keys / values, or NULL */
    const int32_t *pg;     /* (Hkv, maxk) key positions */
    const float *inv;
    float af;
    att_scratch *scr;      /* (threads) */
} att_job;

typedef struct gather_job {
    const att_job *A;
    int h;
    float *kg, *vg;
    int32_t *pg;
} gather_job;

static void gather_keys(void *c, int64_t t0, int64_t t1) {
    const gather_job *G = c;
    const att_job *A = G->A;
    const ks_attn_args *a = A->a;
    const ks_kv_layer *L = A->L;
    int h = G->h, d = A->d;
    const int32_t *ix = a->idx ? a->idx[h] : NULL;
    const float *K = (const float *)L->k + (size_t)h * L->capacity * d;
    const float *V = (const float *)L->v + (size_t)h * L->capacity * d;
    const int32_t *P = L->pos + (size_t)h * L->capacity;
    for (int64_t t = t0; t < t1; t++) {
        int j = ix ? ix[t] : (int)t;
        int32_t p = (ix && a->renumber) ? (int32_t)t : P[j];
        G->pg[(size_t)h * A->maxk + t] = p;
        if (A->gathered) {
            float *kd = G->kg + ((size_t)h * A->maxk + t) * d;
            memcpy(kd, K + (size_t)j * d, sizeof(float) * d);
            memcpy(G->vg + ((size_t)h * A->maxk + t) * d, V + (size_t)j * d, sizeof(float) * d);
            if (a->rope) rope_vec(kd, d, p, A->inv, A->af);
        }
    }
}

/* One task: KV head h = task / nqb, query block qb = task % nqb. */
static void att_task(void *c, int64_t task, int thread) {
    const att_job *A = c;
    const ks_attn_args *a = A->a;
    const ks_kv_layer *L = A->L;
    const att_scratch *W = &A->scr[thread];
    int d = A->d, H = A->H, g = A->g, n = A->n;
    int h = (int)(task / A->nqb), qb = (int)(task % A->nqb);
    int i0 = qb * ATT_QB, rows = KS_MIN(ATT_QB, n - i0), RR = g * rows;
    int nk = a->idx ? a->n_idx[h] : L->n[h];
    const float *K = A->gathered ? A->kg + (size_t)h * A->maxk * d : (const float *)L->k + (size_t)h * L->capacity * d;
    const float *V = A->gathered ? A->vg + (size_t)h * A->maxk * d : (const float *)L->v + (size_t)h * L->capacity * d;
    const int32_t *P = A->pg + (size_t)h * A->maxk;
    float *Qb = W->Qb, *S = W->S, *Ob = W->Ob, *mx = W->mx, *sm = W->sm;
    int32_t *qp = W->qp;
    int32_t qmax = INT32_MIN, qmin = INT32_MAX;
    /* row r = gg * rows + i: query head h*g+gg, query row i0+i */
    for (int gg = 0; gg < g; gg++)
        for (int i = 0; i < rows; i++) {
            int r = gg * rows + i;
            const float *src = A->q + ((size_t)(i0 + i) * H + h * g + gg) * d;
            int32_t p = (a->idx && a->renumber) ? nk - n + i0 + i : a->qpos[i0 + i];
            qp[r] = p;
            qmax = KS_MAX(qmax, p);
            qmin = KS_MIN(qmin, p);
            memcpy(Qb + (size_t)r * d, src, sizeof(float) * d);
            if (a->rope) rope_vec(Qb + (size_t)r * d, d, p, A->inv, A->af);
            mx[r] = -INFINITY;
            sm[r] = 0;
        }
    memset(Ob, 0, sizeof(float) * (size_t)RR * d);
    for (int k0 = 0; k0 < nk; k0 += ATT_KC) {
        int kc = KS_MIN(ATT_KC, nk - k0);
        /* skip chunks no query of the block can see (positions usually ascend) */
        int32_t pmin = INT32_MAX, pmax = INT32_MIN;
        for (int t = 0; t < kc; t++) { pmin = KS_MIN(pmin, P[k0 + t]); pmax = KS_MAX(pmax, P[k0 + t]); }
        if (pmin > qmax) continue;
        if (a->window > 0 && qmin - pmax >= a->window) continue;
        /* keys at the chunk's end that every query of the block is before add exactly nothing */
        while (kc > 1 && P[k0 + kc - 1] > qmax) kc--;
        ks_gemm_nt_serial(S, kc, Qb, d, K + (size_t)k0 * d, d, RR, d, kc);
        for (int r = 0; r < RR; r++) {
            float *sr = S + (size_t)r * kc, m_new = mx[r];
            for (int t = 0; t < kc; t++) {
                int32_t kp = P[k0 + t];
                if (kp > qp[r] || (a->window > 0 && qp[r] - kp >= a->window)) sr[t] = -INFINITY;
                else {
                    sr[t] *= a->scale;
                    if (sr[t] > m_new) m_new = sr[t];
                }
            }
            if (m_new == -INFINITY) { /* nothing visible in this chunk */
                for (int t = 0; t < kc; t++) sr[t] = 0;
                continue;
            }
            float corr = expf(mx[r] - m_new), sum = 0;
            for (int t = 0; t < kc; t++) {
                float e = sr[t] == -INFINITY ? 0.0f : expf(sr[t] - m_new);
                sr[t] = e;
                sum += e;
            }
            sm[r] = sm[r] * corr + sum;
            mx[r] = m_new;
            if (corr != 1.0f) {
                float *o = Ob + (size_t)r * d;
                for (int c2 = 0; c2 < d; c2++) o[c2] *= corr;
            }
        }
        ks_gemm_nn_acc_serial(Ob, S, kc, V + (size_t)k0 * d, RR, kc, d);
    }
    for (int gg = 0; gg < g; gg++)
        for (int i = 0; i < rows; i++) {
            int r = gg * rows + i;
            float il = sm[r] > 0 ? 1.0f / sm[r] : 0.0f;
            float *o = A->out + ((size_t)(i0 + i) * H + h * g + gg) * d;
            for (int c2 = 0; c2 < d; c2++) o[c2] = Ob[(size_t)r * d + c2] * il;
        }
}

static ks_status cpu_attention(ks_backend *b, float *out, const float *q, const ks_kv_layer *L, const ks_attn_args *a) {
    int d = L->head_dim, H = a->n_heads, Hkv = L->n_kv_heads, g = H / Hkv, n = a->n;
    if (d > 1024) return ks_errorf(KS_ERR_UNSUPPORTED, "attention: head_dim %d > 1024", d);
    ks_pool *pool = ((cpu_ctx *)b->ctx)->pool;
    float inv[512], af = 1.0f;
    if (a->rope) {
        ks_rope_inv_freq(a->rope, a->rope_max_pos, inv);
        af = (float)a->rope->attn_factor;
    }
    att_job A = {out, q, L, a, d, H, Hkv, g, n, (n + ATT_QB - 1) / ATT_QB, 0, a->idx || a->rope,
                 NULL, NULL, NULL, inv, af, NULL};
    for (int h = 0; h < Hkv; h++) A.maxk = KS_MAX(A.maxk, a->idx ? a->n_idx[h] : L->n[h]);
    A.maxk = KS_MAX(A.maxk, 1);
    /* per KV head: contiguous keys/values (cache rows or a gathered copy) and their positions */
    int nt = ks_pool_threads(pool), R = g * ATT_QB;
    ks_status st = KS_OK;
    float *kg = NULL, *vg = NULL;
    int32_t *pg = ks_malloc(sizeof(int32_t) * (size_t)Hkv * A.maxk);
    att_scratch *scr = ks_calloc((size_t)nt, sizeof *scr);
    if (!pg || !scr) { st = KS_ERR_OOM; goto done; }
    if (A.gathered) {
        kg = cpu_alloc(b, sizeof(float) * (size_t)Hkv * A.maxk * d);
        vg = cpu_alloc(b, sizeof(float) * (size_t)Hkv * A.maxk * d);
        if (!kg || !vg) { st = KS_ERR_OOM; goto done; }
    }
    for (int t = 0; t < nt; t++) {
        att_scratch *w = &scr[t];
        w->Qb = ks_malloc(sizeof(float) * (size_t)R * d);
        w->S = ks_malloc(sizeof(float) * (size_t)R * ATT_KC);
        w->Ob = ks_malloc(sizeof(float) * (size_t)R * d);
        w->mx = ks_malloc(sizeof(float) * R);
        w->sm = ks_malloc(sizeof(float) * R);
        w->qp = ks_malloc(sizeof(int32_t) * R);
        if (!w->Qb || !w->S || !w->Ob || !w->mx || !w->sm || !w->qp) {
            st = ks_errorf(KS_ERR_OOM, "attention: out of memory for scratch");
            goto done;
        }
    }
    A.kg = kg;
    A.vg = vg;
    A.pg = pg;
    A.scr = scr;
    for (int h = 0; h < Hkv; h++) {
        gather_job G = {&A, h, kg, vg, pg};
        cpu_par_range(b, a->idx ? a->n_idx[h] : L->n[h], 2048, gather_keys, &G);
    }
    ks_pool_run(pool, (int64_t)Hkv * A.nqb, att_task, &A);
done:
    if (scr)
        for (int t = 0; t < nt; t++) {
            free(scr[t].Qb); free(scr[t].S); free(scr[t].Ob);
            free(scr[t].mx); free(scr[t].sm); free(scr[t].qp);
        }
    free(scr);
    cpu_free(b, kg);
    cpu_free(b, vg);
    free(pg);
    return st;
}

static void cpu_destroy(ks_backend *b) {
    if (!b) return;
    if (b->ctx) {
        ks_pool_free(((cpu_ctx *)b->ctx)->pool);
        ks_memtrack_free(((cpu_ctx *)b->ctx)->mem);
    }
    free(b->ctx);
    free(b);
}

ks_backend_opts ks_backend_opts_default(void) {
    ks_backend_opts o;
    memset(&o, 0, sizeof o);
    o.prefill_attn = KS_PREFILL_ATTN_AUTO;
    o.decode_kernels = 1;
    o.fused = 1;
    o.mlp = 1;
    o.graphs = 1;
    return o;
}

ks_status ks_cpu_backend_create(const ks_backend_opts *opts, ks_backend **out) {
    *out = NULL;
    ks_backend_opts o = opts ? *opts : ks_backend_opts_default();
    ks_backend *b = ks_calloc(1, sizeof *b);
    cpu_ctx *c = ks_calloc(1, sizeof *c);
    if (!b || !c) { free(b); free(c); return KS_ERR_OOM; }
    if (!(c->mem = ks_memtrack_create())) { free(b); free(c); return KS_ERR_OOM; }
    ks_status st = ks_pool_create(o.n_threads, &c->pool); /* this backend's own threads */
    if (st) { ks_memtrack_free(c->mem); free(b); free(c); return st; }
    o.n_threads = ks_pool_threads(c->pool);
    b->name = "cpu";
    b->host_memory = 1;
    b->ctx = c;
    b->opts = o;
    b->alloc = cpu_alloc;
    b->free = cpu_free;
    b->upload = cpu_memcpy;
    b->download = cpu_memcpy;
    b->copy = cpu_memcpy;
    b->sync = cpu_sync;
    b->weight_create = cpu_weight_create;
    b->weight_free = cpu_weight_free;
    b->weight_random = cpu_weight_random;
    b->kv_alloc = cpu_kv_alloc;
    b->kv_free = cpu_kv_free;
    b->kv_append = cpu_kv_append;
    b->kv_retain = cpu_kv_retain;
    b->attention = cpu_attention;
    b->check_idx = cpu_check_idx;
    cpu_dense_install(b); /* cpu_dense.c: embed, attn_in, attn_out, mlp, head, gather_rows, rope */
    b->destroy = cpu_destroy;
    b->mem_stats = cpu_mem_stats;
    b->prims = ks_cpu_prims(); /* core/cpu_prims.c */
    *out = b;
    return KS_OK;
}
