/* tp_device.c — the tensor-parallel composite over GPU ranks (tp_backend.h "Device ranks"): its
 * buffers (one per rank behind each pointer the engine holds), the Megatron split of each
 * forward op with the collectives of ks_tp_dev_ops (kernels/tp_nccl.cu) on device buffers, the
 * KV cache split by KV heads, and the policy views gathered onto rank 0 when asked for. */
#include "tp_int.h"
#include "cpu_dense.h"
#include "model.h"

#include <stdlib.h>
#include <string.h>

#define USE(t, r) (t)->dev->use((t)->comm, (r))

/* ================================================================ allocations */

/* The allocation holding p (any byte of it) and p's offset in it; NULL when none does. */
static tp_buf *buf_of(tp_ctx *t, const void *p, size_t *off) {
    const char *c = p;
    for (int i = 0; p && i < t->n_buf; i++) {
        tp_buf *q = &t->buf[i];
        if (c >= q->v && c < q->v + (q->bytes ? q->bytes : 1)) {
            if (off) *off = (size_t)(c - q->v);
            return q;
        }
    }
    return NULL;
}

/* Rank r's pointer for the engine's p (the same offset in rank r's buffer); NULL for NULL or a
 * pointer that is no buffer of this composite. */
static void *rp(tp_ctx *t, int r, const void *p) {
    size_t off = 0;
    tp_buf *q = buf_of(t, p, &off);
    return q ? q->p[r] + off : NULL;
}

/* 1 when p's buffer has its own whole copy on rank 0 (the policy views), apart from rank 0's. */
static int separate(tp_ctx *t, const void *p) {
    tp_buf *q = buf_of(t, p, NULL);
    return q && q->v != q->p[0];
}

static ks_status not_ours(const char *op, const void *p) {
    return ks_errorf(KS_ERR_ARG, "tp: %s: %p is not a buffer of this backend", op, p);
}

/* The rank-local buffers (q, k, v, the attention output) hold each rank's heads packed, so only
 * the start of a buffer means the same rows on every rank: a pointer into the middle of one (a
 * batched decode step's per-row views) is refused. N = 1 packs nothing. */
static ks_status local_start(tp_ctx *t, const void *p, const char *what) {
    size_t off = 0;
    if (!p || t->N == 1) return KS_OK;
    if (!buf_of(t, p, &off)) return not_ours(what, p);
    if (off)
        return ks_errorf(KS_ERR_UNSUPPORTED, "tp: %s starts %zu bytes into its buffer (a batched decode step): GPU "
                         "ranks hold their heads packed and take whole buffers only", what, off);
    return KS_OK;
}

static void *td_alloc(ks_backend *b, size_t bytes) {
    tp_ctx *t = TPC(b);
    if (t->n_buf == t->cap_buf) {
        int cap = t->cap_buf ? 2 * t->cap_buf : 64;
        tp_buf *nb = realloc(t->buf, sizeof *nb * (size_t)cap);
        if (!nb) { ks_errorf(KS_ERR_OOM, "tp: out of memory for the buffer table"); return NULL; }
        t->buf = nb;
        t->cap_buf = cap;
    }
    tp_buf q = {.bytes = bytes};
    size_t nb = bytes ? bytes : 16;
    int r = 0;
    for (; r < t->N; r++) {
        USE(t, r);
        if (!(q.p[r] = t->rank[r]->alloc(t->rank[r], nb))) break;
    }
    q.v = q.p[0];
    if (r == t->N && t->views && t->N > 1) { /* the whole copy the policy events read */
        USE(t, 0);
        q.v = t->rank[0]->alloc(t->rank[0], nb);
    }
    if (r < t->N || !q.v) {
        for (int i = 0; i < r; i++) { USE(t, i); t->rank[i]->free(t->rank[i], q.p[i]); }
        return NULL; /* the rank's message stands */
    }
    t->buf[t->n_buf++] = q;
    return q.v;
}

static void buf_release(tp_ctx *t, tp_buf *q) {
    for (int r = 0; r < t->N; r++) { USE(t, r); t->rank[r]->free(t->rank[r], q->p[r]); }
    if (q->v != q->p[0]) { USE(t, 0); t->rank[0]->free(t->rank[0], q->v); }
}

static void td_free(ks_backend *b, void *p) {
    tp_ctx *t = TPC(b);
    size_t off = 0;
    tp_buf *q = buf_of(t, p, &off);
    if (!q || off) return;
    buf_release(t, q);
    *q = t->buf[--t->n_buf];
}

void ks_tp_dev_destroy(tp_ctx *t) {
    if (t->comm)
        for (int i = 0; i < t->n_buf; i++) buf_release(t, &t->buf[i]);
    free(t->buf);
    t->buf = NULL;
    t->n_buf = t->cap_buf = 0;
}

/* Replicated contents: every rank's buffer and the whole copy get the same bytes. */
static ks_status td_upload(ks_backend *b, void *dst, const void *src, size_t n) {
    tp_ctx *t = TPC(b);
    size_t off = 0;
    tp_buf *q = buf_of(t, dst, &off);
    if (!q) { USE(t, 0); return t->rank[0]->upload(t->rank[0], dst, src, n); } /* rank 0 memory of its own */
    ks_status st = KS_OK;
    for (int r = 0; r < t->N && !st; r++) { USE(t, r); st = t->rank[r]->upload(t->rank[r], q->p[r] + off, src, n); }
    if (!st && q->v != q->p[0]) { USE(t, 0); st = t->rank[0]->upload(t->rank[0], q->v + off, src, n); }
    return st;
}

/* What the engine reads: the whole copy on rank 0 (an activation buffer, or the KV view of a
 * layer, which rank 0's backend allocated itself). */
static ks_status td_download(ks_backend *b, void *dst, const void *src, size_t n) {
    tp_ctx *t = TPC(b);
    if (!n) return KS_OK;
    USE(t, 0);
    return t->rank[0]->download(t->rank[0], dst, src, n);
}

/* Between engine buffers: every rank's and the whole copies. Where either side is rank 0 memory
 * of its own (the KV view that a policy's tensors read), on rank 0 alone: the policies'
 * tensors live in the whole copies on rank 0 (the primitives run there). */
static ks_status td_copy(ks_backend *b, void *dst, const void *src, size_t n) {
    tp_ctx *t = TPC(b);
    if (!n) return KS_OK;
    if (!buf_of(t, dst, NULL) || !buf_of(t, src, NULL)) { USE(t, 0); return t->rank[0]->copy(t->rank[0], dst, src, n); }
    ks_status st = KS_OK;
    for (int r = 0; r < t->N && !st; r++) { USE(t, r); st = t->rank[r]->copy(t->rank[r], rp(t, r, dst), rp(t, r, src), n); }
    if (!st && separate(t, dst)) { USE(t, 0); st = t->rank[0]->copy(t->rank[0], dst, src, n); }
    return st;
}

static ks_status td_sync(ks_backend *b) {
    tp_ctx *t = TPC(b);
    for (int r = 0; r < t->N; r++) {
        USE(t, r);
        ks_status st = t->rank[r]->sync(t->rank[r]);
        if (st) return st;
    }
    return KS_OK;
}

static void *td_host_alloc(ks_backend *b, size_t bytes) {
    ks_backend *r0 = TPC(b)->rank[0];
    USE(TPC(b), 0);
    return r0->host_alloc ? r0->host_alloc(r0, bytes) : ks_malloc(bytes);
}
static void td_host_free(ks_backend *b, void *p) {
    ks_backend *r0 = TPC(b)->rank[0];
    USE(TPC(b), 0);
    if (r0->host_alloc) r0->host_free(r0, p);
    else free(p);
}

/* x (count floats, replicated) after the ranks changed theirs: the whole copy follows rank 0's. */
static ks_status publish(tp_ctx *t, float *x, size_t count) {
    if (!separate(t, x)) return KS_OK;
    USE(t, 0);
    return t->rank[0]->copy(t->rank[0], x, rp(t, 0, x), sizeof(float) * count);
}

/* x (count floats) on every rank = the sum of the ranks' x, then the whole copy. */
static ks_status reduce_x(tp_ctx *t, float *x, size_t count) {
    if (t->N > 1) {
        float *p[KS_TP_MAX];
        for (int r = 0; r < t->N; r++) p[r] = rp(t, r, x);
        ks_status st = t->dev->all_reduce(t->comm, p, count);
        if (st) return st;
    }
    return publish(t, x, count);
}

/* The whole (rows, heads * d) copy of a rank-local buffer (each rank's heads packed) on rank 0,
 * when the views are on. */
static ks_status gather_heads(tp_ctx *t, float *whole, int rows, int heads, int d) {
    if (!separate(t, whole)) return KS_OK;
    float *src[KS_TP_MAX];
    size_t col0[KS_TP_MAX], w[KS_TP_MAX], hw = (size_t)heads / t->N * d;
    for (int r = 0; r < t->N; r++) { src[r] = rp(t, r, whole); col0[r] = r * hw; w[r] = hw; }
    return t->dev->gather_cols(t->comm, whole, (size_t)heads * d, src, rows, col0, w);
}

/* ================================================================ KV cache */

/* Point L's arrays at what holds the whole layer: rank 0's layer (N = 1), the view on rank 0, or
 * the composite's own row counts and positions (no keys or values on any host or device). */
static void kv_sync(tp_ctx *t, ks_kv_layer *L, tp_kv *T) {
    const ks_kv_layer *s = t->N == 1 ? &T->r[0] : T->has_view ? &T->view : NULL;
    if (s) { L->n = s->n; L->pos = s->pos; L->capacity = s->capacity; L->k = s->k; L->v = s->v; }
    else { L->n = T->n; L->pos = T->pos; L->capacity = T->cap; L->k = L->v = NULL; }
}

static tp_kv *kv_of(tp_ctx *t, ks_kv_layer *L) {
    if (L->pos_dev) return L->pos_dev;
    tp_kv *T = ks_calloc(1, sizeof *T);
    if (!T) { ks_errorf(KS_ERR_OOM, "tp: out of memory for a KV layer"); return NULL; }
    for (int r = 0; r < t->N; r++) { T->r[r].n_kv_heads = L->n_kv_heads / t->N; T->r[r].head_dim = L->head_dim; }
    T->view.n_kv_heads = L->n_kv_heads;
    T->view.head_dim = L->head_dim;
    T->has_view = t->views && t->N > 1;
    L->pos_dev = T;
    return T;
}

/* The composite's own positions: room for n more rows in every head. */
static ks_status pos_reserve(tp_kv *T, int H, int n) {
    int most = 0;
    for (int h = 0; T->n && h < H; h++) most = KS_MAX(most, T->n[h]);
    if (T->n && most + n <= T->cap) return KS_OK;
    int cap = KS_MAX(KS_MAX(most + n, 2 * T->cap), 256);
    int32_t *p = ks_malloc(sizeof(int32_t) * (size_t)H * cap);
    int *cn = T->n ? T->n : ks_calloc((size_t)H, sizeof(int));
    if (!p || !cn) { free(p); if (!T->n) free(cn); return KS_ERR_OOM; }
    for (int h = 0; T->pos && h < H; h++) memcpy(p + (size_t)h * cap, T->pos + (size_t)h * T->cap, sizeof(int32_t) * cn[h]);
    free(T->pos);
    T->pos = p;
    T->n = cn;
    T->cap = cap;
    return KS_OK;
}

/* The whole layer after the ranks appended n rows (k, v: the engine's buffers, whole on rank 0
 * with the views). */
static ks_status whole_append(tp_ctx *t, ks_kv_layer *L, tp_kv *T, const float *k, const float *v, const int32_t *pos,
                              int n) {
    ks_status st = KS_OK;
    if (t->N > 1 && T->has_view) {
        USE(t, 0);
        st = t->rank[0]->kv_append(t->rank[0], &T->view, k, v, pos, n);
    } else if (t->N > 1) {
        int H = L->n_kv_heads;
        if (!(st = pos_reserve(T, H, n)))
            for (int h = 0; h < H; h++) {
                memcpy(T->pos + (size_t)h * T->cap + T->n[h], pos, sizeof(int32_t) * n);
                T->n[h] += n;
            }
    }
    kv_sync(t, L, T);
    return st;
}

static ks_status td_kv_alloc(ks_backend *b, ks_kv_layer *L, int capacity) {
    tp_ctx *t = TPC(b);
    tp_kv *T = kv_of(t, L);
    if (!T) return KS_ERR_OOM;
    ks_status st = KS_OK;
    for (int r = 0; r < t->N && !st; r++) { USE(t, r); st = t->rank[r]->kv_alloc(t->rank[r], &T->r[r], capacity); }
    if (!st && t->N > 1 && T->has_view) { USE(t, 0); st = t->rank[0]->kv_alloc(t->rank[0], &T->view, capacity); }
    else if (!st && t->N > 1 && !T->n) st = pos_reserve(T, L->n_kv_heads, capacity);
    kv_sync(t, L, T);
    return st;
}

static void td_kv_free(ks_backend *b, ks_kv_layer *L) {
    tp_ctx *t = TPC(b);
    tp_kv *T = L->pos_dev;
    if (T) {
        for (int r = 0; r < t->N; r++) { USE(t, r); t->rank[r]->kv_free(t->rank[r], &T->r[r]); }
        if (T->has_view) { USE(t, 0); t->rank[0]->kv_free(t->rank[0], &T->view); }
        free(T->n);
        free(T->pos);
        free(T);
    }
    L->pos_dev = NULL;
    L->n = NULL;
    L->pos = NULL;
    L->k = L->v = NULL;
    L->capacity = 0;
}

/* k, v: rank-local (each rank's KV heads packed, as attn_in wrote them). */
static ks_status td_kv_append(ks_backend *b, ks_kv_layer *L, const float *k, const float *v, const int32_t *pos, int n) {
    tp_ctx *t = TPC(b);
    tp_kv *T = kv_of(t, L);
    if (!T) return KS_ERR_OOM;
    ks_status st = local_start(t, k, "kv_append's keys");
    if (!st) st = local_start(t, v, "kv_append's values");
    for (int r = 0; r < t->N && !st; r++) {
        USE(t, r);
        st = t->rank[r]->kv_append(t->rank[r], &T->r[r], rp(t, r, k), rp(t, r, v), pos, n);
    }
    return st ? st : whole_append(t, L, T, k, v, pos, n);
}

/* Lists per KV head of the whole layer: rank r applies lists h0 .. h0 + Hkv/N. */
static ks_status td_kv_retain(ks_backend *b, ks_kv_layer *L, const int32_t *const *idx, const int *cn, int shrink) {
    tp_ctx *t = TPC(b);
    tp_kv *T = kv_of(t, L);
    if (!T) return KS_ERR_OOM;
    ks_status st = KS_OK;
    for (int r = 0; r < t->N && !st; r++) {
        int h0 = r * T->r[r].n_kv_heads;
        USE(t, r);
        st = t->rank[r]->kv_retain(t->rank[r], &T->r[r], idx + h0, cn + h0, shrink);
    }
    if (!st && t->N > 1 && T->has_view) {
        USE(t, 0);
        st = t->rank[0]->kv_retain(t->rank[0], &T->view, idx, cn, shrink);
    } else if (!st && t->N > 1 && T->n) {
        for (int h = 0; h < L->n_kv_heads; h++) {
            int32_t *p = T->pos + (size_t)h * T->cap;
            for (int i = 0; i < cn[h]; i++) p[i] = p[idx[h][i]];
            T->n[h] = cn[h];
        }
    }
    kv_sync(t, L, T);
    return st;
}

ks_status ks_tp_views_ready(ks_backend *b, const ks_kv_layer *kv, int n_layers) {
    if (!ks_tp_ranks(b) || !TPC(b)->dev || TPC(b)->N == 1 || !TPC(b)->views) return KS_OK;
    for (int l = 0; l < n_layers; l++) {
        const tp_kv *T = kv[l].pos_dev;
        if (T && !T->has_view)
            return ks_errorf(KS_ERR_UNSUPPORTED, "tp: this session's KV cache was built before a policy was set on the "
                             "model, so rank 0 keeps no whole copy of it for the policy to read (layer %d): reset the "
                             "session, or set the policy before its first prompt", l);
    }
    return KS_OK;
}

/* ================================================================ the forward ops */

/* The rank-r activations behind a (NULL stays NULL; no bf16 copy: the ranks' attn_out converts). */
static ks_acts acts_r(tp_ctx *t, int r, const ks_acts *a) {
    return (ks_acts){rp(t, r, a->x), rp(t, r, a->xn), rp(t, r, a->q), rp(t, r, a->k), rp(t, r, a->v), NULL};
}

/* Vocab-parallel: rank r looks up the ids in its rows and writes zeros for the others (its rows
 * embedded compactly, then spread by a row gather from them plus one zero row); all-reduce. */
static ks_status td_embed(ks_backend *b, float *x, const ks_weight *E, const int32_t *ids, int n, int dim) {
    tp_ctx *t = TPC(b);
    ks_status st = ks_tp_need_shards(t);
    if (st) return st;
    if (!buf_of(t, x, NULL)) return not_ours("embed", x);
    int64_t V = E->rows;
    for (int i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= V)
            return ks_errorf(KS_ERR_ARG, "embed: token id %d out of range [0, %lld)", ids[i], (long long)V);
    int32_t *lid = ks_malloc(sizeof(int32_t) * (size_t)(n ? n : 1)), *map = ks_malloc(sizeof(int32_t) * (size_t)(n ? n : 1));
    if (!lid || !map) { free(lid); free(map); return KS_ERR_OOM; }
    size_t row = sizeof(float) * (size_t)dim;
    for (int r = 0; r < t->N && !st; r++) {
        ks_backend *rb = t->rank[r];
        int64_t v0 = tp_lo(V, t->N, r), vn = tp_cnt(V, t->N, r);
        int k = 0;
        for (int i = 0; i < n; i++) {
            map[i] = -1;
            if (ids[i] >= v0 && ids[i] < v0 + vn) { lid[k] = ids[i] - (int32_t)v0; map[i] = k++; }
        }
        float *xr = rp(t, r, x);
        USE(t, r);
        if (k == n) { st = rb->embed(rb, xr, E->sh[r], lid, n, dim); continue; }
        if (k == 0) { st = t->dev->zero(t->comm, r, xr, row * n); continue; }
        float *S = rb->alloc(rb, row * (size_t)(k + 1));
        if (!S) { st = KS_ERR_OOM; break; }
        for (int i = 0; i < n; i++) if (map[i] < 0) map[i] = k;
        if (!(st = rb->embed(rb, S, E->sh[r], lid, k, dim)) && !(st = t->dev->zero(t->comm, r, S + (size_t)k * dim, row)))
            st = rb->gather_rows(rb, xr, S, map, n, dim);
        rb->free(rb, S);
    }
    free(lid);
    free(map);
    return st ? st : reduce_x(t, x, (size_t)n * dim);
}

/* Column-parallel q|k|v: each rank its heads (packed in its q, k, v), its KV heads' rows into its
 * layer; then the views (whole q, k, v on rank 0) and the whole layer's rows. */
static ks_status td_attn_in(ks_backend *b, const ks_layer_w *W, const ks_config *c, const ks_acts *a, int n,
                            const int32_t *pos, int max_pos, int rotate, ks_kv_layer *L) {
    tp_ctx *t = TPC(b);
    ks_status st = ks_tp_need_shards(t);
    tp_kv *T = L ? kv_of(t, L) : NULL;
    if (L && !T) return KS_ERR_OOM;
    if (!st) st = local_start(t, a->q, "attn_in's q");
    if (!st) st = local_start(t, a->k, "attn_in's k");
    if (!st) st = local_start(t, a->v, "attn_in's v");
    for (int r = 0; r < t->N && !st; r++) {
        ks_config cr = tp_rank_cfg(c, t->N, r);
        ks_layer_w Wr = ks_tp_rank_w(W, r);
        ks_acts ar = acts_r(t, r, a);
        USE(t, r);
        st = t->rank[r]->attn_in(t->rank[r], &Wr, &cr, &ar, n, pos, max_pos, rotate, T ? &T->r[r] : NULL);
    }
    if (!st) st = gather_heads(t, a->q, n, c->n_heads, c->head_dim);
    if (!st) st = gather_heads(t, a->k, n, c->n_kv_heads, c->head_dim);
    if (!st) st = gather_heads(t, a->v, n, c->n_kv_heads, c->head_dim);
    if (!st && L) st = whole_append(t, L, T, a->k, a->v, pos, n);
    return st;
}

/* Per rank over its heads and its own KV rows; the output packed per rank (attn_out reads it). */
static ks_status td_attention(ks_backend *b, float *out, const float *q, const ks_kv_layer *L, const ks_attn_args *a) {
    tp_ctx *t = TPC(b);
    const tp_kv *T = L->pos_dev;
    if (!T) return ks_errorf(KS_ERR_INTERNAL, "tp: attention over a layer that holds no KV rows");
    ks_status st = local_start(t, q, "attention's q");
    if (!st) st = local_start(t, out, "attention's output");
    /* attend lists a policy built on the device (rank 0, the primitives' side): to the host, and
     * each rank uploads its heads' (Hkv lists of at most a few thousand rows: small) */
    int Hkv = L->n_kv_heads;
    const int32_t *hidx[KS_TP_MAX * 64], **idx = (const int32_t **)a->idx;
    int32_t *host = NULL;
    if (!st && a->idx && a->idx_dev && t->N > 1) {
        if (Hkv > KS_TP_MAX * 64) return ks_errorf(KS_ERR_UNSUPPORTED, "tp: %d KV heads with device attend lists", Hkv);
        const int32_t *lo = a->idx[0], *hi = a->idx[0] + a->n_idx[0];
        for (int h = 1; h < Hkv; h++) {
            if (a->idx[h] < lo) lo = a->idx[h];
            if (a->idx[h] + a->n_idx[h] > hi) hi = a->idx[h] + a->n_idx[h];
        }
        size_t words = (size_t)(hi - lo);
        if (!(host = ks_malloc(sizeof(int32_t) * (words ? words : 1)))) return KS_ERR_OOM;
        USE(t, 0);
        st = t->rank[0]->download(t->rank[0], host, lo, sizeof(int32_t) * words);
        for (int h = 0; h < Hkv; h++) hidx[h] = host + (a->idx[h] - lo);
        idx = hidx;
    }
    for (int r = 0; r < t->N && !st; r++) {
        ks_attn_args ar = *a;
        ar.n_heads = a->n_heads / t->N;
        if (a->idx) {
            int h0 = r * T->r[r].n_kv_heads;
            ar.idx = idx + h0;
            ar.n_idx = a->n_idx + h0;
            ar.idx_dev = a->idx_dev && t->N == 1;
        }
        USE(t, r);
        st = t->rank[r]->attention(t->rank[r], rp(t, r, out), rp(t, r, q), &T->r[r], &ar);
    }
    free(host);
    return st;
}

/* Row-parallel: rank 0 adds its partial to the real x (with bo), every other rank its partial to
 * zeros; the all-reduce then leaves x + the sum of the partials on every rank. */
static ks_status td_attn_out(ks_backend *b, const ks_layer_w *W, const ks_config *c, const ks_acts *a, int n) {
    tp_ctx *t = TPC(b);
    ks_status st = ks_tp_need_shards(t);
    if (!st) st = local_start(t, a->xn, "attn_out's input");
    for (int r = 0; r < t->N && !st; r++) {
        ks_config cr = tp_rank_cfg(c, t->N, r);
        ks_layer_w Wr = ks_tp_rank_w(W, r);
        ks_acts ar = acts_r(t, r, a);
        USE(t, r);
        if (r > 0) st = t->dev->zero(t->comm, r, ar.x, sizeof(float) * (size_t)n * c->dim);
        if (!st) st = t->rank[r]->attn_out(t->rank[r], &Wr, &cr, &ar, n);
    }
    return st ? st : reduce_x(t, a->x, (size_t)n * c->dim);
}

/* Gate and up column-parallel, down row-parallel over the ffn units: rank 0's own MLP on the real
 * x, the others' partial alone (ks_tp_dev_ops.mlp_partial); all-reduce. */
static ks_status td_mlp(ks_backend *b, const ks_layer_w *W, const ks_config *c, const ks_acts *a, int n) {
    tp_ctx *t = TPC(b);
    ks_status st = ks_tp_need_shards(t);
    for (int r = 0; r < t->N && !st; r++) {
        ks_config cr = tp_rank_cfg(c, t->N, r);
        ks_layer_w Wr = ks_tp_rank_w(W, r);
        ks_acts ar = acts_r(t, r, a);
        USE(t, r);
        st = r == 0 ? t->rank[0]->mlp(t->rank[0], &Wr, &cr, &ar, n) : t->dev->mlp_partial(t->rank[r], &Wr, &cr, &ar, n);
    }
    return st ? st : reduce_x(t, a->x, (size_t)n * c->dim);
}

/* Vocab-parallel head: each rank the logits of its vocab rows, gathered into place on rank 0. */
static ks_status td_head(ks_backend *b, const ks_weight *norm, const ks_weight *lm_head, const ks_config *c,
                         const ks_acts *a, int row, int n, float *logits) {
    tp_ctx *t = TPC(b);
    ks_status st = ks_tp_need_shards(t);
    if (st) return st;
    if (!buf_of(t, logits, NULL)) return not_ours("head", logits);
    float *lr[KS_TP_MAX] = {0};
    size_t col0[KS_TP_MAX], w[KS_TP_MAX];
    for (int r = 0; r < t->N && !st; r++) {
        ks_backend *rb = t->rank[r];
        ks_config cr = tp_rank_cfg(c, t->N, r);
        ks_acts ar = acts_r(t, r, a);
        col0[r] = (size_t)tp_lo(c->vocab, t->N, r);
        w[r] = (size_t)cr.vocab;
        USE(t, r);
        if (t->N == 1) lr[r] = rp(t, 0, logits);
        else if (!(lr[r] = rb->alloc(rb, sizeof(float) * (size_t)n * w[r]))) { st = KS_ERR_OOM; break; }
        st = rb->head(rb, norm->sh[r], lm_head->sh[r], &cr, &ar, row, n, lr[r]);
    }
    if (!st && t->N > 1) st = t->dev->gather_cols(t->comm, logits, (size_t)c->vocab, lr, n, col0, w);
    else if (!st) st = publish(t, logits, (size_t)n * c->vocab);
    for (int r = 0; r < t->N && t->N > 1; r++)
        if (lr[r]) { USE(t, r); t->rank[r]->free(t->rank[r], lr[r]); }
    return st;
}

/* Replicated rows (propagate on x): every rank, and the whole copy. */
static ks_status td_gather_rows(ks_backend *b, float *out, const float *x, const int32_t *idx, int k, int d) {
    tp_ctx *t = TPC(b);
    if (!buf_of(t, out, NULL) || !buf_of(t, x, NULL)) return not_ours("gather_rows", buf_of(t, out, NULL) ? x : out);
    ks_status st = KS_OK;
    for (int r = 0; r < t->N && !st; r++) {
        USE(t, r);
        st = t->rank[r]->gather_rows(t->rank[r], rp(t, r, out), rp(t, r, x), idx, k, d);
    }
    if (!st && separate(t, out)) { USE(t, 0); st = t->rank[0]->gather_rows(t->rank[0], out, x, idx, k, d); }
    return st;
}

/* The ks.rope primitive on an engine buffer: every copy of it. */
static ks_status td_rope(ks_backend *b, float *x, int n, int n_heads, const int32_t *pos, const ks_rope *ro, int max_pos) {
    tp_ctx *t = TPC(b);
    if (!buf_of(t, x, NULL)) return not_ours("rope", x);
    ks_status st = KS_OK;
    for (int r = 0; r < t->N && !st; r++) { USE(t, r); st = t->rank[r]->rope(t->rank[r], rp(t, r, x), n, n_heads, pos, ro, max_pos); }
    if (!st && separate(t, x)) { USE(t, 0); st = t->rank[0]->rope(t->rank[0], x, n, n_heads, pos, ro, max_pos); }
    return st;
}

/* ================================================================ policy primitives: rank 0's table
 * The policy's tensors are the whole copies (rank 0) and what it computes from them (allocated
 * through this backend: one buffer per rank, the primitives write the whole copy); every
 * primitive runs on rank 0's backend. */

#define R0(t) (USE((t), 0), (t)->rank[0])
#define P0(b) (TPC(b)->rank[0]->prims)
static ks_status p_scores(ks_backend *b, const float *q, const int32_t *qpos, int64_t nq, int64_t m, const void *k, int k_bf16,
                          const int32_t *kpos, int64_t nkv, int64_t n, int64_t d, const ks_scores_opts *o, float *out) {
    ks_backend *r = R0(TPC(b));
    return P0(b)->scores(r, q, qpos, nq, m, k, k_bf16, kpos, nkv, n, d, o, out);
}
static ks_status p_pool1d(ks_backend *b, const float *x, int64_t rows, int64_t n, int64_t kernel, ks_pool_mode mode,
                          float *out) {
    return P0(b)->pool1d(R0(TPC(b)), x, rows, n, kernel, mode, out);
}
static ks_status p_topk(ks_backend *b, const float *x, int64_t rows, int64_t n, int64_t k, int64_t base,
                        ks_topk_order order,
                        int32_t *oi, float *ov, const float *skip, int64_t grow) {
    return P0(b)->topk(R0(TPC(b)), x, rows, n, k, base, order, oi, ov, skip, grow);
}
static ks_status p_argsort(ks_backend *b, const float *x, int64_t n, int desc, int32_t *o) {
    return P0(b)->argsort(R0(TPC(b)), x, n, desc, o);
}
static ks_status p_sort_f32(ks_backend *b, const float *x, int64_t n, int desc, float *o) {
    return P0(b)->sort_f32(R0(TPC(b)), x, n, desc, o);
}
static ks_status p_sort_i32(ks_backend *b, const int32_t *x, int64_t n, int32_t *o) { return P0(b)->sort_i32(R0(TPC(b)), x, n, o); }
static ks_status p_rank(ks_backend *b, const float *x, int64_t n, int32_t *o) { return P0(b)->rank(R0(TPC(b)), x, n, o); }
static ks_status p_unique(ks_backend *b, const int32_t *x, int64_t n, int32_t *o, int64_t *no) {
    return P0(b)->unique(R0(TPC(b)), x, n, o, no);
}
static ks_status p_union(ks_backend *b, const int32_t *a, int64_t na, const int32_t *bb, int64_t nb, int32_t *o, int64_t *no) {
    return P0(b)->union_(R0(TPC(b)), a, na, bb, nb, o, no);
}
static ks_status p_concat_i32(ks_backend *b, const int32_t *a, int64_t na, const int32_t *bb, int64_t nb, int32_t *o) {
    return P0(b)->concat_i32(R0(TPC(b)), a, na, bb, nb, o);
}
static ks_status p_concat_f32(ks_backend *b, const float *a, int64_t na, const float *bb, int64_t nb, float *o) {
    return P0(b)->concat_f32(R0(TPC(b)), a, na, bb, nb, o);
}
static ks_status p_arange(ks_backend *b, int64_t start, int64_t stop, int64_t step, int32_t *o) {
    return P0(b)->arange(R0(TPC(b)), start, stop, step, o);
}
static ks_status p_gather(ks_backend *b, const float *x, int64_t n, int64_t d, const int32_t *idx, int64_t k, float *o,
                          int64_t *err) {
    return P0(b)->gather(R0(TPC(b)), x, n, d, idx, k, o, err);
}
static ks_status p_gather_i32(ks_backend *b, const int32_t *x, int64_t n, const int32_t *idx, int64_t k, int32_t *o,
                              int64_t *err) {
    return P0(b)->gather_i32(R0(TPC(b)), x, n, idx, k, o, err);
}
static ks_status p_softmax(ks_backend *b, const float *x, int64_t rows, int64_t n, float *o) {
    return P0(b)->softmax(R0(TPC(b)), x, rows, n, o);
}
static ks_status p_sum(ks_backend *b, const float *x, int64_t rows, int64_t cols, int axis, float *o) {
    return P0(b)->sum(R0(TPC(b)), x, rows, cols, axis, o);
}
static ks_status p_mean(ks_backend *b, const float *x, int64_t rows, int64_t cols, int axis, float *o) {
    return P0(b)->mean(R0(TPC(b)), x, rows, cols, axis, o);
}
static ks_status p_var(ks_backend *b, const float *x, int64_t rows, int64_t cols, int axis, int64_t ddof, float *o) {
    return P0(b)->var(R0(TPC(b)), x, rows, cols, axis, ddof, o);
}
static ks_status p_cosine(ks_backend *b, const float *a, const float *bb, int64_t n, float *o) {
    return P0(b)->cosine(R0(TPC(b)), a, bb, n, o);
}
static ks_status p_cosine_rows(ks_backend *b, const float *a, const float *bb, int64_t rows, int64_t d, float *o) {
    return P0(b)->cosine_rows(R0(TPC(b)), a, bb, rows, d, o);
}
static ks_status p_page_reduce(ks_backend *b, const void *x, int x_bf16, int64_t n, int64_t h, int64_t d, int64_t rs,
                               int64_t hs, int64_t page, int64_t p0, int64_t p1, float *omin, float *omax, float *omean,
                               uint32_t *obox) {
    return P0(b)->page_reduce(R0(TPC(b)), x, x_bf16, n, h, d, rs, hs, page, p0, p1, omin, omax, omean, obox);
}
static ks_status p_bound_scores(ks_backend *b, const float *q, int64_t nq, const float *lo, const float *hi,
                                const uint32_t *box, int64_t n, int64_t nkv, int64_t d, ks_bound_reduce red, float *o) {
    return P0(b)->bound_scores(R0(TPC(b)), q, nq, lo, hi, box, n, nkv, d, red, o);
}
static ks_status p_page_rows(ks_backend *b, const int32_t *pages, int64_t lists, int64_t k, int64_t page, int64_t n,
                             int64_t bb, int64_t be, int64_t ab, int64_t ae, int32_t *o, int64_t *err) {
    return P0(b)->page_rows(R0(TPC(b)), pages, lists, k, page, n, bb, be, ab, ae, o, err);
}
static ks_status p_ge(ks_backend *b, const float *x, int64_t n, double thr, float *o) {
    return P0(b)->ge(R0(TPC(b)), x, n, thr, o);
}
static ks_status p_where(ks_backend *b, const float *m, int64_t nm, const void *a, const void *bb, int64_t n, void *o) {
    return P0(b)->where(R0(TPC(b)), m, nm, a, bb, n, o);
}
#undef R0
#undef P0

static const ks_backend_prims td_prims = {p_scores, p_pool1d, p_topk, p_argsort, p_sort_f32, p_sort_i32, p_rank,
                                          p_unique, p_union, p_concat_i32, p_concat_f32, p_arange, p_gather,
                                          p_gather_i32, p_softmax, p_sum, p_mean, p_var, p_cosine, p_cosine_rows,
                                          p_page_reduce, p_bound_scores, p_page_rows, p_ge, p_where};

static ks_status td_ceilings(ks_backend *b, double *gemm_tflops, double *copy_gbs) {
    tp_ctx *t = TPC(b);
    USE(t, 0);
    return t->rank[0]->ceilings ? t->rank[0]->ceilings(t->rank[0], gemm_tflops, copy_gbs)
                                : ks_errorf(KS_ERR_UNSUPPORTED, "tp: rank 0 measures no ceilings");
}

void ks_tp_dev_install(ks_backend *b) {
    b->alloc = td_alloc;
    b->free = td_free;
    b->upload = td_upload;
    b->download = td_download;
    b->copy = td_copy;
    b->sync = td_sync;
    b->host_alloc = td_host_alloc;
    b->host_free = td_host_free;
    b->embed = td_embed;
    b->attn_in = td_attn_in;
    b->attention = td_attention;
    b->attn_out = td_attn_out;
    b->mlp = td_mlp;
    b->head = td_head;
    b->gather_rows = td_gather_rows;
    b->rope = td_rope;
    b->kv_alloc = td_kv_alloc;
    b->kv_free = td_kv_free;
    b->kv_append = td_kv_append;
    b->kv_retain = td_kv_retain;
    b->ceilings = td_ceilings;
    /* rank 0's primitives on the whole copies, where rank 0 has a table (GPU ranks; CPU ranks
     * read their host views in place and take the CPU primitives there); check_idx NULL: index
     * lists are checked on the host; no decode graphs, no profiling marks */
    if (TPC(b)->rank[0]->prims && !b->host_memory) b->prims = &td_prims;
}

/* ================================================================ the services on CPU ranks (tests)
 * ks_tp_host_ops: the device ranks' code path over CPU rank backends, their buffers host memory.
 * The all-reduce sums in rank order ((b0 + b1) + b2) + ... and hands every rank the same bits. */

struct ks_tp_dev { /* this file's own (kernels/tp_nccl.cu defines its own): the two are never mixed */
    int n;
};

static ks_status h_init(ks_backend *const *ranks, int n, ks_tp_dev **out) {
    for (int r = 0; r < n; r++)
        if (!ranks[r]->host_memory) return ks_errorf(KS_ERR_ARG, "tp: host services over a rank in device memory");
    ks_tp_dev *d = ks_calloc(1, sizeof *d);
    if (!d) return KS_ERR_OOM;
    d->n = n;
    *out = d;
    return KS_OK;
}
static void h_fini(ks_tp_dev *d) { free(d); }
static void h_use(ks_tp_dev *d, int r) { (void)d; (void)r; }

static ks_status h_all_reduce(ks_tp_dev *d, float *const *buf, size_t count) {
    for (int r = 1; r < d->n; r++)
        for (size_t i = 0; i < count; i++) buf[0][i] += buf[r][i];
    for (int r = 1; r < d->n; r++) memcpy(buf[r], buf[0], sizeof(float) * count);
    return KS_OK;
}

static ks_status h_gather_cols(ks_tp_dev *d, float *dst, size_t ld, float *const *src, int rows, const size_t *col0,
                               const size_t *w) {
    for (int r = 0; r < d->n; r++)
        for (int i = 0; i < rows; i++) memcpy(dst + (size_t)i * ld + col0[r], src[r] + (size_t)i * w[r], sizeof(float) * w[r]);
    return KS_OK;
}

static ks_status h_zero(ks_tp_dev *d, int r, void *p, size_t bytes) {
    (void)d; (void)r;
    memset(p, 0, bytes);
    return KS_OK;
}

/* The plain MLP (dense_plain.h) with the residual left out: norm, x = 0, then x += each chunk. */
static ks_status h_mlp_partial(ks_backend *rb, const ks_layer_w *W, const ks_config *c, const ks_acts *a, int n) {
    size_t D = c->dim, F = c->ffn;
    int ch = KS_MIN(n, KS_PLAIN_MLP_ROWS);
    ks_status st = ks_cpu_rmsnorm(rb, a->xn, a->x, W->ffn_norm, n, (int)D, c->eps);
    if (st) return st;
    memset(a->x, 0, sizeof(float) * (size_t)n * D);
    float *gate = ks_malloc(sizeof(float) * (size_t)ch * F), *up = ks_malloc(sizeof(float) * (size_t)ch * F);
    if (!gate || !up) st = KS_ERR_OOM;
    for (int r0 = 0; r0 < n && !st; r0 += KS_PLAIN_MLP_ROWS) {
        int rn = KS_MIN(KS_PLAIN_MLP_ROWS, n - r0);
        const float *h = a->xn + (size_t)r0 * D;
        float *y = a->q + (size_t)r0 * D;
        if (!(st = ks_cpu_matmul(rb, gate, h, W->w_gate, NULL, rn, (int)D, (int)F)) &&
            !(st = ks_cpu_matmul(rb, up, h, W->w_up, NULL, rn, (int)D, (int)F)) &&
            !(st = ks_cpu_swiglu(rb, gate, gate, up, (size_t)rn * F)) &&
            !(st = ks_cpu_matmul(rb, y, gate, W->w_down, NULL, rn, (int)F, (int)D)))
            st = ks_cpu_add(rb, a->x + (size_t)r0 * D, y, (size_t)rn * D);
    }
    free(gate);
    free(up);
    return st;
}

static const ks_tp_dev_ops host_ops = {"cpu", h_init, h_fini, h_use, h_all_reduce, h_gather_cols, h_zero, h_mlp_partial};

const ks_tp_dev_ops *ks_tp_host_ops(void) { return &host_ops; }
