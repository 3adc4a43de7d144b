/* cuda_kv.cu — the CUDA backend's KV cache (cuda_backend_int.h): per layer, bf16 keys and values
 * and int32 positions on the device, (n_kv_heads, capacity) rows, with the positions mirrored on
 * the host (ks_kv_layer.pos). Plain cudaMalloc, so freeing a cache really returns the memory. */
#include "cuda_backend_int.h"

#include <stdlib.h>
#include <string.h>

static void kv_release(cuda_ctx *c, ks_kv_layer *L) {
    raw_free(c, L->k);
    raw_free(c, L->v);
    raw_free(c, L->pos_dev);
    free(L->pos);
    L->k = L->v = L->pos_dev = NULL;
    L->pos = NULL;
}

/* L's storage replaced by k, v (bf16), pd (device positions) and pos (host), of capacity rows
 * per head; the old storage is released. Row counts stay the caller's. */
static void kv_adopt(cuda_ctx *c, ks_kv_layer *L, void *k, void *v, void *pd, int32_t *pos, int capacity) {
    kv_release(c, L);
    L->k = k;
    L->v = v;
    L->pos_dev = pd;
    L->pos = pos;
    L->capacity = capacity;
}

/* (Re)allocate to `capacity` rows per head, keeping min(n[h], capacity) rows of each head. */
static ks_status cu_kv_alloc(ks_backend *b, ks_kv_layer *L, int capacity) {
    cuda_ctx *c = CTX(b);
    int H = L->n_kv_heads, d = L->head_dim;
    if (capacity < 1) capacity = 1;
    size_t rows = (size_t)H * capacity, rb = (size_t)d * 2;
    void *k = NULL, *v = NULL, *pd = NULL;
    int32_t *pos = (int32_t *)ks_malloc(rows * sizeof(int32_t));
    if (!pos) return KS_ERR_OOM;
    ks_status st = raw_alloc(c, rows * rb, "KV cache (keys)", &k);
    if (!st) st = raw_alloc(c, rows * rb, "KV cache (values)", &v);
    if (!st) st = raw_alloc(c, rows * sizeof(int32_t), "KV cache (positions)", &pd);
    if (!st && !L->n) {
        L->n = (int *)ks_calloc(H, sizeof(int));
        if (!L->n) st = KS_ERR_OOM;
    }
    if (!st && L->k) {
        int keep = KS_MIN(capacity, L->capacity), mrows = 0;
        for (int h = 0; h < H; h++) {
            L->n[h] = KS_MIN(L->n[h], keep);
            mrows = KS_MAX(mrows, L->n[h]);
            memcpy(pos + (size_t)h * capacity, L->pos + (size_t)h * L->capacity, sizeof(int32_t) * L->n[h]);
        }
        if (mrows > 0) {
            cudaError_t e = cudaMemcpy2DAsync(k, capacity * rb, L->k, L->capacity * rb, mrows * rb, H,
                                              cudaMemcpyDeviceToDevice, c->stream);
            if (!e) e = cudaMemcpy2DAsync(v, capacity * rb, L->v, L->capacity * rb, mrows * rb, H,
                                          cudaMemcpyDeviceToDevice, c->stream);
            if (!e) e = cudaMemcpy2DAsync(pd, capacity * sizeof(int32_t), L->pos_dev, L->capacity * sizeof(int32_t),
                                          mrows * sizeof(int32_t), H, cudaMemcpyDeviceToDevice, c->stream);
            if (!e) e = cudaStreamSynchronize(c->stream);
            if (e) st = ks_cuda_status(e, "KV cache reallocation");
        }
    }
    if (st) {
        raw_free(c, k);
        raw_free(c, v);
        raw_free(c, pd);
        free(pos);
        return st;
    }
    kv_adopt(c, L, k, v, pd, pos, capacity);
    return KS_OK;
}

static void cu_kv_free(ks_backend *b, ks_kv_layer *L) {
    cuda_ctx *c = CTX(b);
    if (L->k || L->v || L->pos_dev) cudaStreamSynchronize(c->stream);
    kv_release(c, L);
    free(L->n);
    L->n = NULL;
    L->capacity = 0;
}

ks_status kv_reserve(ks_backend *b, ks_kv_layer *L, int n) {
    int H = L->n_kv_heads, need = 0;
    for (int h = 0; h < H; h++) need = KS_MAX(need, (L->n ? L->n[h] : 0) + n);
    if (!L->k || !L->n || need > L->capacity) {
        /* room for 1024 more rows (a prefill is followed by decode steps), growing by at least a
         * quarter: amortised O(1) appends without doubling a long cache */
        int64_t cap = KS_MAX((int64_t)need + 1024, (int64_t)L->capacity + L->capacity / 4 + 256);
        if (cap > INT32_MAX) return ks_errorf(KS_ERR_OOM, "KV cache: %lld rows per head is too many", (long long)cap);
        return cu_kv_alloc(b, L, (int)cap);
    }
    return KS_OK;
}

ks_status cu_kv_append(ks_backend *b, ks_kv_layer *L, const float *k, const float *v, const int32_t *pos, int n) {
    cuda_ctx *c = CTX(b);
    int H = L->n_kv_heads;
    if (n <= 0) return KS_OK;
    ks_status st = kv_reserve(b, L, n);
    if (st) return st;
    if (n == 1 && H <= KS_CUDA_KV1_MAX_HEADS) { /* decode: position and rows as kernel arguments */
        st = ks_cuda_kv_append1(c->stream, L->k, L->v, (int32_t *)L->pos_dev, L->capacity, H, L->head_dim, k, v, pos[0],
                                L->n, c->o.pdl);
        if (st) return st;
        for (int h = 0; h < H; h++) L->pos[(size_t)h * L->capacity + L->n[h]++] = pos[0];
        return KS_OK;
    }
    /* positions (n) then each head's first free row (H) */
    size_t bytes = sizeof(int32_t) * ((size_t)n + H);
    int32_t *h_buf = (int32_t *)ks_malloc(bytes);
    if (!h_buf) return KS_ERR_OOM;
    memcpy(h_buf, pos, sizeof(int32_t) * n);
    for (int h = 0; h < H; h++) h_buf[n + h] = L->n[h];
    void *d_buf;
    st = upload_tmp(c, h_buf, bytes, "KV append positions", &d_buf);
    free(h_buf);
    if (st) return st;
    st = ks_cuda_kv_append(c->stream, L->k, L->v, (int32_t *)L->pos_dev, L->capacity, H, L->head_dim, k, v,
                           (const int32_t *)d_buf, (const int32_t *)d_buf + n, n);
    dev_free(c, d_buf);
    if (st) return st;
    for (int h = 0; h < H; h++) {
        memcpy(L->pos + (size_t)h * L->capacity + L->n[h], pos, sizeof(int32_t) * n);
        L->n[h] += n;
    }
    return KS_OK;
}

static ks_status cu_kv_retain(ks_backend *b, ks_kv_layer *L, const int32_t *const *idx, const int *cnt, int shrink) {
    cuda_ctx *c = CTX(b);
    int H = L->n_kv_heads, d = L->head_dim, maxc = 0, moves = 0;
    size_t total = 0;
    for (int h = 0; h < H; h++) {
        if (cnt[h] < 0 || cnt[h] > L->n[h]) return ks_errorf(KS_ERR_ARG, "kv_retain: %d rows asked of head %d (%d rows)", cnt[h], h, L->n[h]);
        unsigned char *seen = NULL; /* rows taken, once a list is not ascending (a permutation) */
        for (int i = 0; i < cnt[h]; i++) {
            int j = idx[h][i], dup = 0;
            if (!seen && i && j <= idx[h][i - 1] && j >= 0 && j < L->n[h]) {
                if (!(seen = (unsigned char *)ks_calloc((size_t)L->n[h], 1))) return KS_ERR_OOM;
                for (int t = 0; t < i; t++) seen[idx[h][t]] = 1;
            }
            if (seen && j >= 0 && j < L->n[h]) dup = seen[j]++;
            if (j < 0 || j >= L->n[h] || dup) {
                free(seen);
                return ks_errorf(KS_ERR_ARG, "kv_retain: head %d: index %d at position %d is out of range [0, %d) or repeated",
                                 h, j, i, L->n[h]);
            }
            if (j != i) moves = 1;
        }
        free(seen);
        total += cnt[h];
        maxc = KS_MAX(maxc, cnt[h]);
    }
    /* reallocate only when at least half the capacity goes: a decode-time retain of one row
     * per step (StreamingLLM) must not reallocate at every step */
    int realloc_to = shrink && maxc < L->capacity / 2 ? KS_MAX(maxc, 1) : 0;
    if (moves || realloc_to) {
        /* host index buffer: offsets (H + 1) then the lists */
        int32_t *h_buf = (int32_t *)ks_malloc(sizeof(int32_t) * (H + 1 + total));
        if (!h_buf) return KS_ERR_OOM;
        int32_t *off = h_buf, *cat = h_buf + H + 1;
        off[0] = 0;
        for (int h = 0; h < H; h++) {
            memcpy(cat + off[h], idx[h], sizeof(int32_t) * cnt[h]);
            off[h + 1] = off[h] + cnt[h];
        }
        void *d_buf = NULL, *nk = NULL, *nv = NULL, *np = NULL;
        int ncap = realloc_to ? realloc_to : maxc; /* without reallocation: a compact temporary */
        size_t rb = (size_t)d * 2;
        ks_status st = upload_tmp(c, h_buf, sizeof(int32_t) * (H + 1 + total), "kv_retain indices", &d_buf);
        free(h_buf);
        if (st) return st;
        if (realloc_to) {
            st = raw_alloc(c, (size_t)H * ncap * rb, "KV cache (keys)", &nk);
            if (!st) st = raw_alloc(c, (size_t)H * ncap * rb, "KV cache (values)", &nv);
            if (!st) st = raw_alloc(c, (size_t)H * ncap * 4, "KV cache (positions)", &np);
        } else {
            st = dev_alloc(c, (size_t)H * ncap * rb, "kv_retain temporary", &nk);
            if (!st) st = dev_alloc(c, (size_t)H * ncap * rb, "kv_retain temporary", &nv);
            if (!st) st = dev_alloc(c, (size_t)H * ncap * 4, "kv_retain temporary", &np);
        }
        if (!st)
            st = ks_cuda_kv_gather(c->stream, nk, nv, (int32_t *)np, ncap, L->k, L->v, (const int32_t *)L->pos_dev,
                                   L->capacity, H, d, (const int32_t *)d_buf + H + 1, (const int32_t *)d_buf, maxc);
        if (!st && !realloc_to && maxc > 0) {
            cudaError_t e = cudaMemcpy2DAsync(L->k, L->capacity * rb, nk, ncap * rb, maxc * rb, H,
                                              cudaMemcpyDeviceToDevice, c->stream);
            if (!e) e = cudaMemcpy2DAsync(L->v, L->capacity * rb, nv, ncap * rb, maxc * rb, H,
                                          cudaMemcpyDeviceToDevice, c->stream);
            if (!e) e = cudaMemcpy2DAsync(L->pos_dev, L->capacity * 4, np, ncap * 4, maxc * 4, H,
                                          cudaMemcpyDeviceToDevice, c->stream);
            if (e) st = ks_cuda_status(e, "kv_retain copy back");
        }
        dev_free(c, d_buf);
        if (realloc_to) {
            int32_t *pos = NULL;
            if (!st && !(pos = (int32_t *)ks_malloc(sizeof(int32_t) * (size_t)H * ncap))) st = KS_ERR_OOM;
            if (!st) st = ks_cuda_status(cudaStreamSynchronize(c->stream), "kv_retain");
            if (st) {
                free(pos);
                raw_free(c, nk);
                raw_free(c, nv);
                raw_free(c, np);
                return st;
            }
            for (int h = 0; h < H; h++)
                for (int i = 0; i < cnt[h]; i++) pos[(size_t)h * ncap + i] = L->pos[(size_t)h * L->capacity + idx[h][i]];
            kv_adopt(c, L, nk, nv, np, pos, ncap);
            for (int h = 0; h < H; h++) L->n[h] = cnt[h];
            return KS_OK;
        }
        dev_free(c, nk);
        dev_free(c, nv);
        dev_free(c, np);
        if (st) return st;
    }
    for (int h = 0; h < H; h++) {
        int32_t *pb = L->pos + (size_t)h * L->capacity;
        int asc = 1;
        for (int i = 1; i < cnt[h] && asc; i++) asc = idx[h][i] > idx[h][i - 1];
        if (asc) /* idx[i] >= i: in place */
            for (int i = 0; i < cnt[h]; i++) pb[i] = pb[idx[h][i]];
        else { /* a permutation: from a copy */
            int32_t *t = (int32_t *)ks_malloc(sizeof(int32_t) * ((size_t)L->n[h] + 1));
            if (!t) return KS_ERR_OOM;
            memcpy(t, pb, sizeof(int32_t) * (size_t)L->n[h]);
            for (int i = 0; i < cnt[h]; i++) pb[i] = t[idx[h][i]];
            free(t);
        }
        L->n[h] = cnt[h];
    }
    return KS_OK;
}

void cuda_kv_install(ks_backend *b) {
    b->kv_alloc = cu_kv_alloc;
    b->kv_free = cu_kv_free;
    b->kv_append = cu_kv_append;
    b->kv_retain = cu_kv_retain;
}
