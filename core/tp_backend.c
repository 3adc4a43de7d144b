/* tp_backend.c — the tensor-parallel composite backend (tp_backend.h): the Megatron split of each
 * coarse forward op over N CPU rank backends, the host all-reduce in fixed rank order, and the
 * KV cache split by KV heads with the whole view kept for the policy events. */
#include "tp_int.h"
#include "cpu_dense.h"
#include "dense_plain.h"
#include "model.h"

#include <stdlib.h>
#include <string.h>

/* ================================================================ state */

static tp_ctx *CTX(ks_backend *b) { return b->ctx; }
static int64_t lo(int64_t total, int N, int r) { return tp_lo(total, N, r); }
static int64_t cnt(int64_t total, int N, int r) { return tp_cnt(total, N, r); }
static ks_config rank_cfg(const ks_config *c, int N, int r) { return tp_rank_cfg(c, N, r); }

ks_layer_w ks_tp_rank_w(const ks_layer_w *W, int r) {
#define S(w) ((w) ? (w)->sh[r] : NULL)
    ks_layer_w x = {S(W->attn_norm), S(W->wq), S(W->wk), S(W->wv), S(W->wo), S(W->bq), S(W->bk), S(W->bv),
                    r == 0 ? S(W->bo) : NULL, S(W->ffn_norm), S(W->w_gate), S(W->w_up), S(W->w_down)};
#undef S
    return x;
}
static ks_layer_w rank_w(const ks_layer_w *W, int r) { return ks_tp_rank_w(W, r); }

/* The ranks' matmul counters into the composite's (the bench reads b->stat_matmul_*): set the
 * ranks' timing switch from b's before an op (rank_stats_on), collect after it (rank_stats_take). */
static void rank_stats_on(ks_backend *b) {
    for (int r = 0; r < CTX(b)->N; r++) CTX(b)->rank[r]->count_stats = b->count_stats;
}
static void rank_stats_take(ks_backend *b) {
    for (int r = 0; r < CTX(b)->N; r++) {
        ks_backend *rb = CTX(b)->rank[r];
        b->stat_matmul_s += rb->stat_matmul_s;
        b->stat_matmul_flop += rb->stat_matmul_flop;
        rb->stat_matmul_s = rb->stat_matmul_flop = 0;
    }
}

ks_status ks_tp_need_shards(tp_ctx *t) {
    return t->sharded ? KS_OK
                      : ks_errorf(KS_ERR_INTERNAL, "tp: the model's weights are not split across the ranks yet "
                                                   "(ks_tp_shard_model)");
}

/* ================================================================ memory (host: the composite's own) */

static void *tp_alloc(ks_backend *b, size_t bytes) { return CTX(b)->host->alloc(CTX(b)->host, bytes); }
static void tp_free(ks_backend *b, void *p) { CTX(b)->host->free(CTX(b)->host, p); }
static ks_status tp_memcpy(ks_backend *b, void *dst, const void *src, size_t n) {
    if (n) memmove(dst, src, n);
    return KS_OK;
}
static ks_status tp_sync(ks_backend *b) {
    tp_ctx *t = CTX(b);
    for (int r = 0; r < t->N; r++) {
        ks_status st = t->rank[r]->sync(t->rank[r]);
        if (st) return st;
    }
    return KS_OK;
}

/* A rank buffer of n floats (NULL + message on failure). */
static float *ralloc(ks_backend *rb, size_t n) {
    float *p = rb->alloc(rb, sizeof(float) * (n ? n : 1));
    if (!p) ks_errorf(KS_ERR_OOM, "tp: rank out of memory for %zu floats", n);
    return p;
}
static void rfree(ks_backend *rb, void *p) {
    if (p) rb->free(rb, p);
}

/* Columns [c0, c0 + w) of the n rows of host src (row stride ss) to rank buffer dst (n, w). */
static ks_status put_cols(ks_backend *rb, float *dst, const float *src, int n, size_t ss, size_t c0, size_t w) {
    for (int i = 0; i < n; i++) {
        ks_status st = rb->upload(rb, dst + (size_t)i * w, src + (size_t)i * ss + c0, sizeof(float) * w);
        if (st) return st;
    }
    return KS_OK;
}
/* Rank buffer src (n, w) to columns [c0, c0 + w) of host dst (row stride ds). */
static ks_status get_cols(ks_backend *rb, float *dst, size_t ds, size_t c0, const float *src, int n, size_t w) {
    for (int i = 0; i < n; i++) {
        ks_status st = rb->download(rb, dst + (size_t)i * ds + c0, src + (size_t)i * w, sizeof(float) * w);
        if (st) return st;
    }
    return KS_OK;
}

/* The all-reduce's step for rank r in rank order: acc (n floats, host) = y_r for r = 0, acc += y_r
 * after. Summing in this one order on the host makes the result the same on every machine. */
static ks_status reduce_step(ks_backend *rb, int r, float *acc, const float *y, float *tmp, size_t n) {
    if (r == 0) return rb->download(rb, acc, y, sizeof(float) * n);
    ks_status st = rb->download(rb, tmp, y, sizeof(float) * n);
    if (st) return st;
    for (size_t i = 0; i < n; i++) acc[i] += tmp[i];
    return KS_OK;
}

/* ================================================================ weights */

static ks_status tp_weight_create(ks_backend *b, const ks_st_tensor *t, int64_t row0, int64_t rows, ks_weight **out) {
    if (t->ndim < 1 || t->ndim > 2) return ks_errorf(KS_ERR_SHAPE, "tensor %s: expected 1 or 2 dims, has %d", t->name, t->ndim);
    if (row0 < 0 || rows < 0 || row0 + rows > t->shape[0])
        return ks_errorf(KS_ERR_SHAPE, "tensor %s: rows [%lld, %lld) out of its %lld rows", t->name, (long long)row0,
                         (long long)(row0 + rows), (long long)t->shape[0]);
    if (t->dtype != KS_DT_F32 && t->dtype != KS_DT_BF16 && t->dtype != KS_DT_F16)
        return ks_errorf(KS_ERR_DTYPE, "tensor %s: dtype %s is not a float type (F32, F16 or BF16)", t->name,
                         ks_dtype_name(t->dtype));
    ks_weight *w = ks_calloc(1, sizeof *w);
    if (!w) return KS_ERR_OOM;
    w->rows = rows;
    w->cols = t->ndim == 1 ? 1 : t->shape[1];
    w->t = t;
    w->row0 = row0;
    *out = w;
    return KS_OK;
}

/* Random weights: the host CPU backend's own generator (the values of an unsplit CPU model with
 * the same seed), read back row by row through its embedding lookup. */
static ks_status tp_weight_random(ks_backend *b, int64_t rows, int64_t cols, uint64_t seed, float scale, float offset,
                                  ks_weight **out) {
    if (CTX(b)->dev) { /* device ranks: each shard drawn on its rank (make_shard) */
        if (rows < 0 || cols < 1)
            return ks_errorf(KS_ERR_SHAPE, "weight_random: bad shape (%lld, %lld)", (long long)rows, (long long)cols);
        ks_weight *w = ks_calloc(1, sizeof *w);
        if (!w) return KS_ERR_OOM;
        *w = (ks_weight){.rows = rows, .cols = cols, .rnd = 1, .seed = seed, .scale = scale, .offset = offset};
        *out = w;
        return KS_OK;
    }
    ks_backend *h = CTX(b)->host;
    ks_weight *whole = NULL;
    ks_status st = h->weight_random(h, rows, cols, seed, scale, offset, &whole);
    if (st) return st;
    ks_weight *w = ks_calloc(1, sizeof *w);
    float *data = ks_malloc(sizeof(float) * (size_t)rows * (size_t)cols);
    if (!w || !data) { free(w); free(data); h->weight_free(h, whole); return KS_ERR_OOM; }
    for (int64_t r = 0; r < rows && !st; r++) {
        int32_t id = (int32_t)r;
        st = ks_cpu_embed(h, data + (size_t)r * cols, whole, &id, 1, (int)cols);
    }
    h->weight_free(h, whole);
    if (st) { free(w); free(data); return st; }
    w->rows = rows;
    w->cols = cols;
    w->host = data;
    *out = w;
    return KS_OK;
}

static void tp_weight_free(ks_backend *b, ks_weight *w) {
    if (!w) return;
    tp_ctx *t = CTX(b);
    for (int r = 0; r < t->N; r++) {
        if (t->dev) t->dev->use(t->comm, r);
        if (w->sh[r]) t->rank[r]->weight_free(t->rank[r], w->sh[r]);
        if (w->stage[r]) { ks_memtrack_remove(t->stage_mem[r], w->stage[r]); free(w->stage[r]); }
    }
    free(w->host);
    free(w);
}

/* Element (i, j) of the whole weight as float32. */
static float w_at(const ks_weight *w, int64_t i, int64_t j) {
    if (w->host) return w->host[(size_t)i * w->cols + j];
    const ks_st_tensor *t = w->t;
    size_t e = (size_t)(w->row0 + i) * (size_t)w->cols + (size_t)j;
    const uint8_t *p = (const uint8_t *)t->data;
    if (t->dtype == KS_DT_F32) { float f; memcpy(&f, p + 4 * e, 4); return f; }
    uint16_t u;
    memcpy(&u, p + 2 * e, 2);
    return t->dtype == KS_DT_BF16 ? ks_bf16_to_f32(u) : ks_f16_to_f32(u);
}

/* Rank r's shard: rows [r0, r0 + nr) x columns [c0, c0 + nc) of w. Rows of a checkpoint tensor
 * go to the rank's weight_create as they are (it converts them as it would unsplit); anything
 * else is copied to a float32 tensor first, kept for the rank (the CPU backend reads a float32
 * tensor in place: the copy is the shard). */
static ks_status make_shard(tp_ctx *t, ks_weight *w, int r, int64_t r0, int64_t nr, int64_t c0, int64_t nc) {
    ks_backend *rb = t->rank[r];
    if (t->dev) t->dev->use(t->comm, r);
    if (w->t && c0 == 0 && nc == w->cols) return rb->weight_create(rb, w->t, w->row0 + r0, nr, &w->sh[r]);
    if (w->rnd) { /* device ranks: drawn on the rank; a replicated weight gets the same values everywhere */
        uint64_t seed = w->split == SPLIT_REPL || r == 0 ? w->seed : w->seed ^ (0x9e3779b97f4a7c15ull * (uint64_t)(r + 1));
        return rb->weight_random(rb, nr, nc, seed, w->scale, w->offset, &w->sh[r]);
    }
    size_t bytes = sizeof(float) * (size_t)nr * (size_t)nc;
    float *s = NULL;
    if (posix_memalign((void **)&s, 64, bytes ? bytes : 64)) return ks_errorf(KS_ERR_OOM, "tp: out of memory for a shard");
    for (int64_t i = 0; i < nr; i++)
        for (int64_t j = 0; j < nc; j++) s[(size_t)i * nc + j] = w_at(w, r0 + i, c0 + j);
    ks_st_tensor ft = {.name = w->t ? w->t->name : "random", .dtype = KS_DT_F32, .ndim = 2, .shape = {nr, nc},
                       .data = s, .nbytes = bytes, .file = w->t ? w->t->file : ""};
    ks_status st = rb->weight_create(rb, &ft, 0, nr, &w->sh[r]);
    if (t->dev && !rb->host_memory) { free(s); return st; } /* a device rank made its own copy */
    if (!st) st = ks_memtrack_add(t->stage_mem[r], s, bytes, 0);
    if (st) { free(s); return st; }
    w->stage[r] = s;
    return KS_OK;
}

/* Cut w by `split`: rows or columns of `total` units of `unit` rows/columns each, by rank. */
static ks_status shard(tp_ctx *t, ks_weight *w, int split, int64_t total, int64_t unit) {
    if (!w || w->split) return KS_OK; /* absent, or already cut (a tied lm_head is the embedding) */
    ks_status st = KS_OK;
    w->split = split;
    for (int r = 0; r < t->N && !st; r++) {
        int64_t a = lo(total, t->N, r) * unit, n = cnt(total, t->N, r) * unit;
        if (split == SPLIT_REPL) st = make_shard(t, w, r, 0, w->rows, 0, w->cols);
        else if (split == SPLIT_ROWS) st = make_shard(t, w, r, a, n, 0, w->cols);
        else st = make_shard(t, w, r, 0, w->rows, a, n);
    }
    if (st) { w->split = SPLIT_NONE; return st; }
    free(w->host);
    w->host = NULL;
    return KS_OK;
}

ks_status ks_tp_shard_model(ks_backend *b, ks_model *m) {
    if (!ks_tp_ranks(b)) return ks_errorf(KS_ERR_ARG, "ks_tp_shard_model: not a tensor-parallel backend");
    tp_ctx *t = CTX(b);
    const ks_config *c = &m->cfg;
    int N = t->N;
    if (c->n_kv_heads % N)
        return ks_errorf(KS_ERR_UNSUPPORTED, "tensor parallel over %d ranks: the model's %d KV heads do not divide "
                         "among %d ranks (KV heads are not replicated; use a rank count that divides %d)",
                         N, c->n_kv_heads, N, c->n_kv_heads);
    if (c->ffn < N || c->vocab < N)
        return ks_errorf(KS_ERR_UNSUPPORTED, "tensor parallel over %d ranks: ffn %d or vocab %d is smaller than that",
                         N, c->ffn, c->vocab);
    int64_t d = c->head_dim;
    ks_status st;
    if ((st = shard(t, m->embed, SPLIT_ROWS, c->vocab, 1)) || (st = shard(t, m->lm_head, SPLIT_ROWS, c->vocab, 1)) ||
        (st = shard(t, m->final_norm, SPLIT_REPL, 0, 0)))
        return st;
    for (int l = 0; l < c->n_layers; l++) {
        ks_layer_w *W = &m->layers[l];
        if ((st = shard(t, W->attn_norm, SPLIT_REPL, 0, 0)) || (st = shard(t, W->ffn_norm, SPLIT_REPL, 0, 0)) ||
            (st = shard(t, W->wq, SPLIT_ROWS, c->n_heads, d)) || (st = shard(t, W->bq, SPLIT_ROWS, c->n_heads, d)) ||
            (st = shard(t, W->wk, SPLIT_ROWS, c->n_kv_heads, d)) || (st = shard(t, W->bk, SPLIT_ROWS, c->n_kv_heads, d)) ||
            (st = shard(t, W->wv, SPLIT_ROWS, c->n_kv_heads, d)) || (st = shard(t, W->bv, SPLIT_ROWS, c->n_kv_heads, d)) ||
            (st = shard(t, W->wo, SPLIT_COLS, c->n_heads, d)) || (st = shard(t, W->bo, SPLIT_REPL, 0, 0)) ||
            (st = shard(t, W->w_gate, SPLIT_ROWS, c->ffn, 1)) || (st = shard(t, W->w_up, SPLIT_ROWS, c->ffn, 1)) ||
            (st = shard(t, W->w_down, SPLIT_COLS, c->ffn, 1)))
            return st;
    }
    t->sharded = 1;
    return KS_OK;
}

/* ================================================================ KV cache: rank layers + the whole view */

/* L's rank layers, created empty on first use (NULL + message on failure). */
static tp_kv *kv_ranks(ks_backend *b, ks_kv_layer *L) {
    if (L->pos_dev) return L->pos_dev;
    tp_kv *T = ks_calloc(1, sizeof *T);
    if (!T) { ks_errorf(KS_ERR_OOM, "tp: out of memory for a KV layer"); return NULL; }
    for (int r = 0; r < CTX(b)->N; r++) {
        T->r[r].n_kv_heads = L->n_kv_heads / CTX(b)->N;
        T->r[r].head_dim = L->head_dim;
    }
    L->pos_dev = T;
    return T;
}

static ks_status tp_kv_alloc(ks_backend *b, ks_kv_layer *L, int capacity) {
    tp_ctx *t = CTX(b);
    tp_kv *T = kv_ranks(b, L);
    if (!T) return KS_ERR_OOM;
    for (int r = 0; r < t->N; r++) {
        ks_status st = t->rank[r]->kv_alloc(t->rank[r], &T->r[r], capacity);
        if (st) return st;
    }
    void *keep = L->pos_dev;
    ks_status st = t->host->kv_alloc(t->host, L, capacity);
    L->pos_dev = keep;
    return st;
}

static void tp_kv_free(ks_backend *b, ks_kv_layer *L) {
    tp_ctx *t = CTX(b);
    tp_kv *T = L->pos_dev;
    if (T)
        for (int r = 0; r < t->N; r++) t->rank[r]->kv_free(t->rank[r], &T->r[r]);
    free(T);
    L->pos_dev = NULL;
    t->host->kv_free(t->host, L);
}

/* The view's rows: the host CPU backend's KV code on the whole layer (it leaves pos_dev alone). */
static ks_status view_append(ks_backend *b, ks_kv_layer *L, const float *k, const float *v, const int32_t *pos, int n) {
    return CTX(b)->host->kv_append(CTX(b)->host, L, k, v, pos, n);
}

/* k, v (n, Hkv, d) whole: each rank appends its KV heads' columns to its layer, then the view. */
static ks_status tp_kv_append(ks_backend *b, ks_kv_layer *L, const float *k, const float *v, const int32_t *pos, int n) {
    tp_ctx *t = CTX(b);
    tp_kv *T = kv_ranks(b, L);
    if (!T) return KS_ERR_OOM;
    size_t d = L->head_dim, KD = (size_t)L->n_kv_heads * d;
    ks_status st = KS_OK;
    for (int r = 0; r < t->N && !st; r++) {
        ks_backend *rb = t->rank[r];
        size_t w = (size_t)T->r[r].n_kv_heads * d, c0 = (size_t)r * w;
        float *kr = ralloc(rb, (size_t)n * w), *vr = kr ? ralloc(rb, (size_t)n * w) : NULL;
        if (!vr) st = KS_ERR_OOM;
        if (!st) st = put_cols(rb, kr, k, n, KD, c0, w);
        if (!st) st = put_cols(rb, vr, v, n, KD, c0, w);
        if (!st) st = rb->kv_append(rb, &T->r[r], kr, vr, pos, n);
        rfree(rb, kr);
        rfree(rb, vr);
    }
    return st ? st : view_append(b, L, k, v, pos, n);
}

static ks_status tp_kv_retain(ks_backend *b, ks_kv_layer *L, const int32_t *const *idx, const int *cn, int shrink) {
    tp_ctx *t = CTX(b);
    tp_kv *T = kv_ranks(b, L);
    if (!T) return KS_ERR_OOM;
    for (int r = 0; r < t->N; r++) {
        int h0 = r * T->r[r].n_kv_heads;
        ks_status st = t->rank[r]->kv_retain(t->rank[r], &T->r[r], idx + h0, cn + h0, shrink);
        if (st) return st;
    }
    return t->host->kv_retain(t->host, L, idx, cn, shrink);
}

const int *ks_tp_kv_rank_rows(const ks_kv_layer *L, int r, int *n_heads) {
    const tp_kv *T = L ? L->pos_dev : NULL;
    if (n_heads) *n_heads = T && r >= 0 && r < KS_TP_MAX ? T->r[r].n_kv_heads : 0;
    return T && r >= 0 && r < KS_TP_MAX ? T->r[r].n : NULL;
}

/* ================================================================ the forward ops */

static ks_status tp_embed(ks_backend *b, float *x, const ks_weight *E, const int32_t *ids, int n, int dim) {
    tp_ctx *t = CTX(b);
    ks_status st = ks_tp_need_shards(t);
    if (st) return st;
    int64_t V = E->rows;
    for (int i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= V)
            return ks_errorf(KS_ERR_ARG, "embed: token id %d out of range [0, %lld)", ids[i], (long long)V);
    size_t nd = (size_t)n * dim;
    float *part = ks_malloc(sizeof(float) * (nd ? nd : 1));
    int32_t *lid = ks_malloc(sizeof(int32_t) * (size_t)(n ? n : 1));
    int *row = ks_malloc(sizeof(int) * (size_t)(n ? n : 1));
    if (!part || !lid || !row) { free(part); free(lid); free(row); return KS_ERR_OOM; }
    for (int r = 0; r < t->N && !st; r++) {
        ks_backend *rb = t->rank[r];
        int64_t v0 = lo(V, t->N, r), vn = cnt(V, t->N, r);
        int k = 0;
        for (int i = 0; i < n; i++)
            if (ids[i] >= v0 && ids[i] < v0 + vn) { lid[k] = ids[i] - (int32_t)v0; row[k++] = i; }
        memset(part, 0, sizeof(float) * nd); /* rank r's partial: its rows, zeros elsewhere */
        float *er = k ? ralloc(rb, (size_t)k * dim) : NULL;
        if (k && !er) st = KS_ERR_OOM;
        if (!st && k) st = rb->embed(rb, er, E->sh[r], lid, k, dim);
        for (int j = 0; j < k && !st; j++)
            st = rb->download(rb, part + (size_t)row[j] * dim, er + (size_t)j * dim, sizeof(float) * dim);
        rfree(rb, er);
        if (st) break;
        if (r == 0) memcpy(x, part, sizeof(float) * nd); /* the all-reduce, in rank order */
        else for (size_t i = 0; i < nd; i++) x[i] += part[i];
    }
    free(part);
    free(lid);
    free(row);
    return st;
}

static ks_status tp_attn_in_run(ks_backend *b, const ks_layer_w *W, const ks_config *c, const ks_acts *a, int n,
                            const int32_t *pos, int max_pos, int rotate, ks_kv_layer *L) {
    tp_ctx *t = CTX(b);
    ks_status st = ks_tp_need_shards(t);
    if (st) return st;
    tp_kv *T = L ? kv_ranks(b, L) : NULL;
    if (L && !T) return KS_ERR_OOM;
    size_t D = c->dim, d = c->head_dim, QD = (size_t)c->n_heads * d, KD = (size_t)c->n_kv_heads * d;
    for (int r = 0; r < t->N && !st; r++) {
        ks_backend *rb = t->rank[r];
        ks_config cr = rank_cfg(c, t->N, r);
        ks_layer_w Wr = rank_w(W, r);
        size_t qw = (size_t)cr.n_heads * d, kw = (size_t)cr.n_kv_heads * d, wide = KS_MAX(D, qw);
        ks_acts ar = {ralloc(rb, (size_t)n * D), ralloc(rb, (size_t)n * wide), ralloc(rb, (size_t)n * wide),
                      ralloc(rb, (size_t)n * kw), ralloc(rb, (size_t)n * kw), NULL};
        if (!ar.x || !ar.xn || !ar.q || !ar.k || !ar.v) st = KS_ERR_OOM;
        if (!st) st = rb->upload(rb, ar.x, a->x, sizeof(float) * (size_t)n * D);
        if (!st) st = ks_plain_attn_in(rb, &t->ops, &Wr, &cr, &ar, n, pos, max_pos, rotate, T ? &T->r[r] : NULL);
        if (!st) st = get_cols(rb, a->q, QD, (size_t)r * qw, ar.q, n, qw);
        if (!st) st = get_cols(rb, a->k, KD, (size_t)r * kw, ar.k, n, kw);
        if (!st) st = get_cols(rb, a->v, KD, (size_t)r * kw, ar.v, n, kw);
        if (!st && r == 0) st = get_cols(rb, a->xn, D, 0, ar.xn, n, D); /* the norm, the same on every rank */
        float *p[] = {ar.x, ar.xn, ar.q, ar.k, ar.v};
        for (int i = 0; i < 5; i++) rfree(rb, p[i]);
    }
    if (!st && L) st = view_append(b, L, a->k, a->v, pos, n); /* the ranks appended their heads' rows */
    return st;
}

static ks_status tp_attention(ks_backend *b, float *out, const float *q, const ks_kv_layer *L, const ks_attn_args *a) {
    tp_ctx *t = CTX(b);
    const tp_kv *T = L->pos_dev;
    if (!T) return ks_errorf(KS_ERR_INTERNAL, "tp: attention over a layer that holds no KV rows");
    size_t d = L->head_dim, QD = (size_t)a->n_heads * d;
    int n = a->n;
    ks_status st = KS_OK;
    for (int r = 0; r < t->N && !st; r++) {
        ks_backend *rb = t->rank[r];
        int hr = a->n_heads / t->N, h0 = r * T->r[r].n_kv_heads;
        size_t qw = (size_t)hr * d;
        ks_attn_args ar = *a;
        ar.n_heads = hr;
        if (a->idx) { ar.idx = a->idx + h0; ar.n_idx = a->n_idx + h0; }
        float *qr = ralloc(rb, (size_t)n * qw), *orr = qr ? ralloc(rb, (size_t)n * qw) : NULL;
        if (!orr) st = KS_ERR_OOM;
        if (!st) st = put_cols(rb, qr, q, n, QD, (size_t)r * qw, qw);
        if (!st) st = rb->attention(rb, orr, qr, &T->r[r], &ar);
        if (!st) st = get_cols(rb, out, QD, (size_t)r * qw, orr, n, qw);
        rfree(rb, qr);
        rfree(rb, orr);
    }
    return st;
}

/* x += all-reduce of the ranks' o-projections of their heads' attention output (in xn). */
static ks_status tp_attn_out_run(ks_backend *b, const ks_layer_w *W, const ks_config *c, const ks_acts *a, int n) {
    tp_ctx *t = CTX(b);
    ks_status st = ks_tp_need_shards(t);
    if (st) return st;
    size_t D = c->dim, d = c->head_dim, QD = (size_t)c->n_heads * d, nd = (size_t)n * D;
    float *acc = a->q, *tmp = ks_malloc(sizeof(float) * (nd ? nd : 1)); /* q is dead once attention ran */
    if (!tmp) return KS_ERR_OOM;
    for (int r = 0; r < t->N && !st; r++) {
        ks_backend *rb = t->rank[r];
        ks_layer_w Wr = rank_w(W, r);
        size_t qw = QD / t->N;
        float *xr = ralloc(rb, (size_t)n * qw), *yr = xr ? ralloc(rb, nd) : NULL;
        if (!yr) st = KS_ERR_OOM;
        if (!st) st = put_cols(rb, xr, a->xn, n, QD, (size_t)r * qw, qw);
        if (!st) st = t->ops.matmul(rb, yr, xr, Wr.wo, Wr.bo, n, (int)qw, (int)D);
        if (!st) st = reduce_step(rb, r, acc, yr, tmp, nd);
        rfree(rb, xr);
        rfree(rb, yr);
    }
    free(tmp);
    if (!st)
        for (size_t i = 0; i < nd; i++) a->x[i] += acc[i];
    return st;
}

/* x += all-reduce of the ranks' down projections of their ffn units. */
static ks_status tp_mlp_run(ks_backend *b, const ks_layer_w *W, const ks_config *c, const ks_acts *a, int n) {
    tp_ctx *t = CTX(b);
    ks_status st = ks_tp_need_shards(t);
    if (st) return st;
    size_t D = c->dim, nd = (size_t)n * D;
    int ch = KS_MIN(n, KS_PLAIN_MLP_ROWS);
    float *acc = a->q, *tmp = ks_malloc(sizeof(float) * (nd ? nd : 1));
    if (!tmp) return KS_ERR_OOM;
    for (int r = 0; r < t->N && !st; r++) {
        ks_backend *rb = t->rank[r];
        ks_layer_w Wr = rank_w(W, r);
        int F = (int)cnt(c->ffn, t->N, r);
        float *xr = ralloc(rb, nd), *h = xr ? ralloc(rb, nd) : NULL, *yr = h ? ralloc(rb, nd) : NULL;
        float *gate = yr ? ralloc(rb, (size_t)ch * F) : NULL, *up = gate ? ralloc(rb, (size_t)ch * F) : NULL;
        if (!up) st = KS_ERR_OOM;
        if (!st) st = rb->upload(rb, xr, a->x, sizeof(float) * nd);
        if (!st) st = t->ops.rmsnorm(rb, h, xr, Wr.ffn_norm, n, (int)D, c->eps);
        for (int r0 = 0; r0 < n && !st; r0 += KS_PLAIN_MLP_ROWS) {
            int rn = KS_MIN(KS_PLAIN_MLP_ROWS, n - r0);
            const float *hr = h + (size_t)r0 * D;
            if (!(st = t->ops.matmul(rb, gate, hr, Wr.w_gate, NULL, rn, (int)D, F)) &&
                !(st = t->ops.matmul(rb, up, hr, Wr.w_up, NULL, rn, (int)D, F)) &&
                !(st = t->ops.swiglu(rb, gate, gate, up, (size_t)rn * F)))
                st = t->ops.matmul(rb, yr + (size_t)r0 * D, gate, Wr.w_down, NULL, rn, F, (int)D);
        }
        if (!st) st = reduce_step(rb, r, acc, yr, tmp, nd);
        float *p[] = {xr, h, yr, gate, up};
        for (int i = 0; i < 5; i++) rfree(rb, p[i]);
    }
    free(tmp);
    if (!st)
        for (size_t i = 0; i < nd; i++) a->x[i] += acc[i];
    return st;
}

/* logits (n, vocab) = all-gather of the ranks' logits of their vocab rows. */
static ks_status tp_head_run(ks_backend *b, const ks_weight *norm, const ks_weight *lm_head, const ks_config *c,
                         const ks_acts *a, int row, int n, float *logits) {
    tp_ctx *t = CTX(b);
    ks_status st = ks_tp_need_shards(t);
    if (st) return st;
    size_t D = c->dim, V = (size_t)c->vocab;
    for (int r = 0; r < t->N && !st; r++) {
        ks_backend *rb = t->rank[r];
        ks_config cr = rank_cfg(c, t->N, r);
        size_t vr = (size_t)cr.vocab;
        ks_acts ar = {.x = ralloc(rb, (size_t)n * D), .xn = ralloc(rb, (size_t)n * D)};
        float *lr = ralloc(rb, (size_t)n * vr);
        if (!ar.x || !ar.xn || !lr) st = KS_ERR_OOM;
        if (!st) st = rb->upload(rb, ar.x, a->x + (size_t)row * D, sizeof(float) * D * (size_t)n);
        if (!st) st = ks_plain_head(rb, &t->ops, norm->sh[r], lm_head->sh[r], &cr, &ar, 0, n, lr);
        for (int i = 0; i < n && !st; i++) /* row i's slice to its place in (n, vocab) */
            st = rb->download(rb, logits + (size_t)i * V + lo(c->vocab, t->N, r), lr + (size_t)i * vr,
                              sizeof(float) * vr);
        rfree(rb, ar.x);
        rfree(rb, ar.xn);
        rfree(rb, lr);
    }
    return st;
}

static ks_status tp_attn_in(ks_backend *b, const ks_layer_w *W, const ks_config *c, const ks_acts *a, int n,
                            const int32_t *pos, int max_pos, int rotate, ks_kv_layer *L) {
    rank_stats_on(b);
    ks_status st = tp_attn_in_run(b, W, c, a, n, pos, max_pos, rotate, L);
    rank_stats_take(b);
    return st;
}
static ks_status tp_attn_out(ks_backend *b, const ks_layer_w *W, const ks_config *c, const ks_acts *a, int n) {
    rank_stats_on(b);
    ks_status st = tp_attn_out_run(b, W, c, a, n);
    rank_stats_take(b);
    return st;
}
static ks_status tp_mlp(ks_backend *b, const ks_layer_w *W, const ks_config *c, const ks_acts *a, int n) {
    rank_stats_on(b);
    ks_status st = tp_mlp_run(b, W, c, a, n);
    rank_stats_take(b);
    return st;
}
static ks_status tp_head(ks_backend *b, const ks_weight *norm, const ks_weight *lm_head, const ks_config *c,
                         const ks_acts *a, int row, int n, float *logits) {
    rank_stats_on(b);
    ks_status st = tp_head_run(b, norm, lm_head, c, a, row, n, logits);
    rank_stats_take(b);
    return st;
}

/* On the whole host buffers, as the CPU backend does them. */
static ks_status tp_gather_rows(ks_backend *b, float *out, const float *x, const int32_t *idx, int k, int d) {
    return CTX(b)->host->gather_rows(CTX(b)->host, out, x, idx, k, d);
}
static ks_status tp_rope(ks_backend *b, float *x, int n, int n_heads, const int32_t *pos, const ks_rope *r, int max_pos) {
    return CTX(b)->host->rope(CTX(b)->host, x, n, n_heads, pos, r, max_pos);
}

/* ================================================================ memory counts */

static void add_stats(ks_mem_stats *o, const ks_mem_stats *s) {
    o->cur += s->cur; o->fixed += s->fixed; o->scratch += s->scratch;
    o->peak += s->peak; o->peak_fixed += s->peak_fixed; o->peak_scratch += s->peak_scratch;
}

ks_status ks_tp_rank_mem_stats(ks_backend *b, int r, ks_mem_stats *out, int reset_peak) {
    memset(out, 0, sizeof *out);
    if (!ks_tp_ranks(b) || r < 0 || r >= CTX(b)->N)
        return ks_errorf(KS_ERR_ARG, "tp: no rank %d on this backend", r);
    ks_backend *rb = CTX(b)->rank[r];
    if (CTX(b)->dev) CTX(b)->dev->use(CTX(b)->comm, r);
    if (rb->mem_stats) rb->mem_stats(rb, out, reset_peak);
    ks_mem_stats s;
    ks_memtrack_stats(CTX(b)->stage_mem[r], &s, reset_peak);
    add_stats(out, &s);
    return KS_OK;
}

ks_status ks_tp_view_mem_stats(ks_backend *b, ks_mem_stats *out, int reset_peak) {
    memset(out, 0, sizeof *out);
    if (!ks_tp_ranks(b)) return ks_errorf(KS_ERR_ARG, "tp: not a tensor-parallel backend");
    ks_backend *h = CTX(b)->host;
    if (h) h->mem_stats(h, out, reset_peak); /* device ranks: no host view (zeros) */
    return KS_OK;
}

/* All of it: every rank and the view. The peak is the sum of each part's own peak (an upper
 * bound of the peak of the sum). */
static void tp_mem_stats(ks_backend *b, ks_mem_stats *out, int reset_peak) {
    ks_mem_stats s;
    if (CTX(b)->host) ks_tp_view_mem_stats(b, out, reset_peak);
    else memset(out, 0, sizeof *out);
    for (int r = 0; r < CTX(b)->N; r++) {
        ks_tp_rank_mem_stats(b, r, &s, reset_peak);
        add_stats(out, &s);
    }
}

/* ================================================================ create / destroy */

static void tp_destroy(ks_backend *b) {
    if (!b) return;
    tp_ctx *t = b->ctx;
    if (t) {
        if (t->dev) ks_tp_dev_destroy(t); /* the allocations left and the communicators */
        for (int r = 0; r < t->N; r++) {
            if (t->dev && t->comm) t->dev->use(t->comm, r);
            ks_backend_free(t->rank[r]);
            ks_memtrack_free(t->stage_mem[r]);
        }
        if (t->dev && t->comm) t->dev->fini(t->comm);
        ks_backend_free(t->host);
        free(t);
    }
    free(b);
}

int ks_tp_ranks(const ks_backend *b) { return b && b->destroy == tp_destroy ? ((const tp_ctx *)b->ctx)->N : 0; }

void ks_tp_want_views(ks_backend *b) {
    if (ks_tp_ranks(b) && CTX(b)->dev) CTX(b)->views = 1;
}

ks_status ks_tp_backend_create_dev(int n_ranks, const ks_backend_opts *opts, const ks_tp_dev_ops *dev, ks_backend **out) {
    *out = NULL;
    if (!dev) return ks_errorf(KS_ERR_UNSUPPORTED, "tensor parallel on GPUs: this build has no NCCL (build with CUDA=1)");
    if (n_ranks < 1 || n_ranks > KS_TP_MAX)
        return ks_errorf(KS_ERR_ARG, "tensor parallel: %d ranks; 1 to %d are supported on GPUs", n_ranks, KS_TP_MAX);
    ks_backend_opts o = opts ? *opts : ks_backend_opts_default();
    ks_backend *b = ks_calloc(1, sizeof *b);
    tp_ctx *t = ks_calloc(1, sizeof *t);
    if (!b || !t) { free(b); free(t); return KS_ERR_OOM; }
    b->ctx = t;
    b->destroy = tp_destroy;
    ks_status st = KS_OK;
    for (int r = 0; r < n_ranks && !st; r++) {
        ks_backend_opts ro = o;
        ro.device = o.device + r;
        ro.graphs = 0;  /* the composite records no decode graphs */
        ro.profile = 0; /* the engine profiles the composite on the host clock */
        if ((st = ks_backend_create_opts(dev->rank_backend, &ro, &t->rank[r]))) {
            ks_error_prefix(st, "tensor parallel: rank %d (GPU %d)", r, ro.device);
            break;
        }
        t->N = r + 1;
        if (!(t->stage_mem[r] = ks_memtrack_create())) st = KS_ERR_OOM;
    }
    if (!st) st = dev->init(t->rank, n_ranks, &t->comm);
    if (!st) t->dev = dev;
    if (st) { tp_destroy(b); return st; }
    b->name = "tp";
    b->host_memory = t->rank[0]->host_memory; /* GPU ranks 0; CPU ranks (ks_tp_host_ops) 1: the views are host
                                                 memory the policies read in place, their KV float32 */
    b->opts = o;
    b->weight_create = tp_weight_create;
    b->weight_free = tp_weight_free;
    b->weight_random = tp_weight_random;
    b->mem_stats = tp_mem_stats;
    ks_tp_dev_install(b); /* tp_device.c: memory, the forward ops, the KV cache */
    *out = b;
    return KS_OK;
}

ks_status ks_tp_backend_create(int n_ranks, const ks_backend_opts *opts, ks_backend **out) {
    *out = NULL;
    if (n_ranks < 2 || n_ranks > KS_TP_MAX)
        return ks_errorf(KS_ERR_ARG, "tensor parallel: %d ranks; 2 to %d are supported", n_ranks, KS_TP_MAX);
    ks_backend_opts o = opts ? *opts : ks_backend_opts_default();
    ks_backend *b = ks_calloc(1, sizeof *b);
    tp_ctx *t = ks_calloc(1, sizeof *t);
    if (!b || !t) { free(b); free(t); return KS_ERR_OOM; }
    b->ctx = t;
    b->destroy = tp_destroy;
    ks_status st = ks_cpu_backend_create(&o, &t->host);
    for (int r = 0; r < n_ranks && !st; r++) {
        if ((st = ks_cpu_backend_create(&o, &t->rank[r]))) break;
        t->N = r + 1;
        if (!(t->stage_mem[r] = ks_memtrack_create())) st = KS_ERR_OOM;
    }
    if (st) { tp_destroy(b); return st; }
    t->ops = (ks_dense_ops){ks_cpu_matmul, ks_cpu_rmsnorm, ks_cpu_rope, ks_cpu_swiglu, ks_cpu_add};
    o.n_threads = t->rank[0]->opts.n_threads;
    b->name = "tp";
    b->host_memory = 1; /* host buffers, as the CPU backend's (tp_backend.h) */
    b->opts = o;
    b->alloc = tp_alloc;
    b->free = tp_free;
    b->upload = tp_memcpy;
    b->download = tp_memcpy;
    b->copy = tp_memcpy;
    b->sync = tp_sync;
    b->weight_create = tp_weight_create;
    b->weight_free = tp_weight_free;
    b->weight_random = tp_weight_random;
    b->embed = tp_embed;
    b->attn_in = tp_attn_in;
    b->attn_out = tp_attn_out;
    b->mlp = tp_mlp;
    b->head = tp_head;
    b->gather_rows = tp_gather_rows;
    b->rope = tp_rope;
    b->kv_alloc = tp_kv_alloc;
    b->kv_free = tp_kv_free;
    b->kv_append = tp_kv_append;
    b->kv_retain = tp_kv_retain;
    b->attention = tp_attention;
    b->prims = ks_cpu_prims();
    b->mem_stats = tp_mem_stats;
    *out = b;
    return KS_OK;
}
