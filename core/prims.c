/* prims.c — CPU reference implementations of the policy primitives (see prims.h): pooling,
 * top-k and ordering (radix sorts on order-preserving float keys), index lists, gathers, small
 * numerics. The attention scores are core/prims_scores.c; the argument checks both use are in
 * core/prims_int.h. */
#include "prims_int.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ================================================================ helpers */

/* The order-preserving 32-bit key of a float (see "Float order" in prims.h): unsigned key
 * order equals float order, every NaN maps to 0 (below -inf), -0.0 maps like +0.0. */
static inline uint32_t f32_key(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    /* branch-free (random signs would mispredict): negatives flip all bits, positives the sign */
    uint32_t key = u ^ ((uint32_t)-(int32_t)(u >> 31) | 0x80000000u);
    uint32_t mag = u & 0x7fffffffu;
    key = mag == 0 ? 0x80000000u : key; /* -0.0 -> +0.0 */
    return mag > 0x7f800000u ? 0 : key; /* NaN */
}

/* Stable ascending sort of (key, val) pairs by key; val may be NULL. tk, tv: scratch of n
 * (tv unused when val is NULL). LSD radix, 8-bit digits, passes whose digit is constant skipped. */
static void radix_sort(uint32_t *key, int32_t *val, int64_t n, uint32_t *tk, int32_t *tv) {
    if (n < 2) return;
    if (n <= 32) { /* insertion sort: stable, cheaper for tiny inputs */
        for (int64_t i = 1; i < n; i++) {
            uint32_t kk = key[i];
            int32_t vv = val ? val[i] : 0;
            int64_t j = i;
            for (; j > 0 && key[j - 1] > kk; j--) {
                key[j] = key[j - 1];
                if (val) val[j] = val[j - 1];
            }
            key[j] = kk;
            if (val) val[j] = vv;
        }
        return;
    }
    int64_t cnt[4][256];
    memset(cnt, 0, sizeof cnt);
    for (int64_t i = 0; i < n; i++)
        for (int b = 0; b < 4; b++) cnt[b][(key[i] >> (8 * b)) & 255]++;
    uint32_t *sk = key, *dk = tk;
    int32_t *sv = val, *dv = tv;
    for (int b = 0; b < 4; b++) {
        if (cnt[b][(key[0] >> (8 * b)) & 255] == n) continue; /* every key has this digit */
        int64_t off[256], s = 0;
        for (int v = 0; v < 256; v++) { off[v] = s; s += cnt[b][v]; }
        for (int64_t i = 0; i < n; i++) {
            int64_t p = off[(sk[i] >> (8 * b)) & 255]++;
            dk[p] = sk[i];
            if (val) dv[p] = sv[i];
        }
        uint32_t *t = sk; sk = dk; dk = t;
        int32_t *w = sv; sv = dv; dv = w;
    }
    if (sk != key) {
        memcpy(key, sk, (size_t)n * sizeof *key);
        if (val) memcpy(val, sv, (size_t)n * sizeof *val);
    }
}

/* ================================================================ pooling */

/* NaN-propagating max (a NaN on either side wins). */
static inline float max_nan(float a, float b) { return (a > b || isnan(a)) ? a : b; }

ks_status ks_cpu_pool1d(const float *x, int64_t rows, int64_t n, int64_t kernel, ks_pool_mode mode, float *out) {
    NEED_NONNEG("pool1d", "rows", rows);
    NEED_NONNEG("pool1d", "n", n);
    if (kernel < 1) return ks_errorf(KS_ERR_ARG, "pool1d: kernel = %lld must be >= 1", (long long)kernel);
    if (kernel % 2 == 0)
        return ks_errorf(KS_ERR_ARG,
                         "pool1d: kernel = %lld is even; only odd kernels keep the output length n with padding kernel/2",
                         (long long)kernel);
    if ((unsigned)mode > KS_POOL_MAX) return ks_errorf(KS_ERR_ARG, "pool1d: unknown mode %d", (int)mode);
    int64_t total;
    ks_status st = mul_size("pool1d", rows, n, &total);
    if (st) return st;
    if (kernel > IDX_MAX) return ks_errorf(KS_ERR_ARG, "pool1d: kernel = %lld is too large", (long long)kernel);
    NEED_PTR("pool1d", "x", x, total);
    NEED_PTR("pool1d", "out", out, total);
    if (total == 0) return KS_OK;
    if (kernel == 1) {
        if (out != x) memmove(out, x, (size_t)total * sizeof *out);
        return KS_OK;
    }
    /* Over the padded row p[0 .. n + 2r), window i is p[i .. i + kernel). Split p into blocks
     * of `kernel`; G = prefix within the block, H = suffix within the block. A window starting
     * at a block boundary is G at its last tap; any other window is H[i] (+) G[i + kernel - 1],
     * two disjoint parts of the window. Every partial holds only taps of its window, so
     * inf/NaN behave as in a direct sum or max. */
    int64_t r = kernel / 2, P = n + 2 * r;
    if (r >= n - 1) { /* every window covers the whole row */
        for (int64_t row = 0; row < rows; row++) {
            const float *xr = x + row * n;
            double s = 0;
            float mx = -INFINITY;
            for (int64_t i = 0; i < n; i++) { s += xr[i]; mx = max_nan(mx, xr[i]); }
            float v = mode == KS_POOL_AVG ? (float)(s / (double)kernel) : mx;
            for (int64_t i = 0; i < n; i++) out[row * n + i] = v;
        }
        return KS_OK;
    }
    double *G = ks_malloc((size_t)P * 2 * sizeof *G);
    if (!G) return KS_ERR_OOM;
    double *H = G + P;
    const double pad = mode == KS_POOL_AVG ? 0.0 : -INFINITY;
    for (int64_t row = 0; row < rows; row++) {
        const float *xr = x + row * n;
        float *yr = out + row * n;
#define PV(p) (((p) < r || (p) >= r + n) ? pad : (double)xr[(p) - r])
        for (int64_t b0 = 0; b0 < P; b0 += kernel) {
            int64_t b1 = KS_MIN(b0 + kernel, P);
            for (int64_t p = b0; p < b1; p++) {
                double v = PV(p);
                G[p] = p == b0 ? v : mode == KS_POOL_AVG ? G[p - 1] + v : (double)max_nan((float)G[p - 1], (float)v);
            }
            for (int64_t p = b1 - 1; p >= b0; p--) {
                double v = PV(p);
                H[p] = p == b1 - 1 ? v : mode == KS_POOL_AVG ? H[p + 1] + v : (double)max_nan((float)v, (float)H[p + 1]);
            }
        }
#undef PV
        for (int64_t i = 0; i < n; i++) {
            int64_t e = i + kernel - 1;
            if (mode == KS_POOL_AVG) {
                double s = i % kernel == 0 ? G[e] : H[i] + G[e];
                yr[i] = (float)(s / (double)kernel);
            } else {
                yr[i] = i % kernel == 0 ? (float)G[e] : max_nan((float)H[i], (float)G[e]);
            }
        }
    }
    free(G);
    return KS_OK;
}

/* ================================================================ top-k and ordering */

/* Top k of one row (0 < k < n, or k == n). oi receives the winners (+ base) in ascending index
 * order; kk (k) their keys; tk/tv (k) scratch for the value-order sort; hist (65536) scratch. */
static void topk_row(const float *x, int64_t n, int64_t k, int64_t base, ks_topk_order order, int32_t *oi, float *ov, uint32_t *kk,
                     uint32_t *tk, int32_t *tv, uint32_t *hist) {
    uint32_t thr = 0; /* the k-th largest key */
    int64_t need = k; /* how many keys equal to thr are taken (lowest indices first) */
    if (k < n) {
        /* Radix select, most significant digit first, among keys that match the prefix so far.
         * Long rows use 2 x 16-bit digits (fewer passes, and a wide first histogram so that
         * same-bucket increments do not serialise); short rows 4 x 8-bit (small histogram). */
        int bits = n >= (1 << 16) ? 16 : 8;
        uint32_t nb = 1u << bits, prefix = 0, mask = 0;
        for (int shift = 32 - bits; shift >= 0; shift -= bits) {
            memset(hist, 0, nb * sizeof *hist);
            if (mask == 0)
                for (int64_t i = 0; i < n; i++) hist[f32_key(x[i]) >> shift]++;
            else
                for (int64_t i = 0; i < n; i++) {
                    uint32_t u = f32_key(x[i]);
                    if ((u & mask) == prefix) hist[(u >> shift) & (nb - 1)]++;
                }
            uint32_t v = nb - 1;
            for (; v > 0 && hist[v] < need; v--) need -= hist[v];
            prefix |= v << shift;
            mask |= (nb - 1) << shift;
        }
        thr = prefix;
    }
    int64_t t = 0;
    for (int64_t i = 0; i < n && t < k; i++) { /* branch-free: slot t is written, kept if taken */
        uint32_t u = f32_key(x[i]);
        int eq = u == thr, take = (u > thr) | (eq & (need > 0));
        need -= eq & take;
        oi[t] = (int32_t)i;
        kk[t] = ~u; /* ascending ~key == descending value */
        t += take;
    }
    if (order == KS_TOPK_BY_VALUE) radix_sort(kk, oi, k, tk, tv); /* stable: ties stay index-ascending */
    if (ov)
        for (int64_t j = 0; j < k; j++) ov[j] = x[oi[j]];
    if (base)
        for (int64_t j = 0; j < k; j++) oi[j] += (int32_t)base;
}

/* ks_cpu_topk's argument checks (the masked call checks what the unmasked would) */
static ks_status topk_check(const float *x, int64_t rows, int64_t n, int64_t k, int64_t base, ks_topk_order order,
                            int32_t *out_idx, int64_t *ktotal_out) {
    NEED_NONNEG("topk", "rows", rows);
    NEED_NONNEG("topk", "n", n);
    NEED_IDX_RANGE("topk", "n", n);
    NEED_NONNEG("topk", "k", k);
    if (k > n) return ks_errorf(KS_ERR_ARG, "topk: k = %lld > n = %lld", (long long)k, (long long)n);
    if (base < 0 || base > (int64_t)INT32_MAX + 1 - n)
        return ks_errorf(KS_ERR_ARG, "topk: base %lld + n %lld leaves the int32 index range", (long long)base, (long long)n);
    if ((unsigned)order > KS_TOPK_BY_INDEX) return ks_errorf(KS_ERR_ARG, "topk: unknown order %d", (int)order);
    int64_t total, ktotal;
    ks_status st;
    if ((st = mul_size("topk", rows, n, &total)) || (st = mul_size("topk", rows, k, &ktotal))) return st;
    NEED_PTR("topk", "x", x, total);
    NEED_PTR("topk", "out_idx", out_idx, ktotal);
    *ktotal_out = ktotal;
    return KS_OK;
}

ks_status ks_cpu_topk_masked(const float *skip, const float *x, int64_t rows, int64_t n, int64_t k, int64_t base,
                             ks_topk_order order, int32_t *out_idx, float *out_val) {
    if (!skip || *skip == 0.0f) return ks_cpu_topk(x, rows, n, k, base, order, out_idx, out_val);
    int64_t ktotal;
    ks_status st = topk_check(x, rows, n, k, base, order, out_idx, &ktotal);
    if (st) return st;
    for (int64_t e = 0; e < ktotal; e++) {
        out_idx[e] = (int32_t)(base + e % k);
        if (out_val) out_val[e] = 0.0f;
    }
    return KS_OK;
}

ks_status ks_cpu_topk(const float *x, int64_t rows, int64_t n, int64_t k, int64_t base, ks_topk_order order,
                      int32_t *out_idx, float *out_val) {
    int64_t ktotal;
    ks_status st = topk_check(x, rows, n, k, base, order, out_idx, &ktotal);
    if (st) return st;
    if (ktotal == 0) return KS_OK;
    uint32_t *kk = ks_malloc((size_t)k * 2 * sizeof *kk);
    int32_t *tv = ks_malloc((size_t)k * sizeof *tv);
    uint32_t *hist = ks_malloc((n >= (1 << 16) ? 65536 : 256) * sizeof *hist);
    if (!kk || !tv || !hist) { free(kk); free(tv); free(hist); return KS_ERR_OOM; }
    for (int64_t r = 0; r < rows; r++)
        topk_row(x + r * n, n, k, base, order, out_idx + r * k, out_val ? out_val + r * k : NULL, kk, kk + k, tv, hist);
    free(kk);
    free(tv);
    free(hist);
    return KS_OK;
}

/* Stable argsort into out_idx; shared by argsort, sort_f32 and rank. */
static ks_status argsort_impl(const char *prim, const float *x, int64_t n, int descending, int32_t *out_idx) {
    NEED_NONNEG(prim, "n", n);
    NEED_IDX_RANGE(prim, "n", n);
    NEED_PTR(prim, "x", x, n);
    NEED_PTR(prim, "output", out_idx, n);
    if (n == 0) return KS_OK;
    uint32_t *key = ks_malloc((size_t)n * 2 * sizeof *key);
    int32_t *tv = ks_malloc((size_t)n * sizeof *tv);
    if (!key || !tv) { free(key); free(tv); return KS_ERR_OOM; }
    for (int64_t i = 0; i < n; i++) {
        uint32_t u = f32_key(x[i]);
        key[i] = descending ? ~u : u;
        out_idx[i] = (int32_t)i;
    }
    radix_sort(key, out_idx, n, key + n, tv);
    free(key);
    free(tv);
    return KS_OK;
}

ks_status ks_cpu_argsort(const float *x, int64_t n, int descending, int32_t *out_idx) {
    return argsort_impl("argsort", x, n, descending, out_idx);
}

ks_status ks_cpu_sort_f32(const float *x, int64_t n, int descending, float *out) {
    NEED_PTR("sort", "out", out, n);
    if (n <= 0) return argsort_impl("sort", x, n, descending, NULL);
    int32_t *idx = NULL;
    if (n <= IDX_MAX && !(idx = ks_malloc((size_t)n * sizeof *idx))) return KS_ERR_OOM;
    ks_status st = argsort_impl("sort", x, n, descending, idx);
    if (st) { free(idx); return st; }
    float *tmp = ks_malloc((size_t)n * sizeof *tmp);
    if (!tmp) { free(idx); return KS_ERR_OOM; }
    for (int64_t i = 0; i < n; i++) tmp[i] = x[idx[i]];
    memcpy(out, tmp, (size_t)n * sizeof *out);
    free(tmp);
    free(idx);
    return KS_OK;
}

ks_status ks_cpu_sort_i32(const int32_t *x, int64_t n, int32_t *out) {
    NEED_NONNEG("sort", "n", n);
    NEED_PTR("sort", "x", x, n);
    NEED_PTR("sort", "out", out, n);
    if (n == 0) return KS_OK;
    uint32_t *key = ks_malloc((size_t)n * 2 * sizeof *key);
    if (!key) return KS_ERR_OOM;
    for (int64_t i = 0; i < n; i++) key[i] = (uint32_t)x[i] ^ 0x80000000u; /* signed order as unsigned */
    radix_sort(key, NULL, n, key + n, NULL);
    for (int64_t i = 0; i < n; i++) out[i] = (int32_t)(key[i] ^ 0x80000000u);
    free(key);
    return KS_OK;
}

ks_status ks_cpu_rank(const float *x, int64_t n, int32_t *out_rank) {
    NEED_NONNEG("rank", "n", n);
    NEED_IDX_RANGE("rank", "n", n);
    NEED_PTR("rank", "out_rank", out_rank, n);
    if (n == 0) return KS_OK;
    int32_t *idx = ks_malloc((size_t)n * sizeof *idx);
    if (!idx) return KS_ERR_OOM;
    ks_status st = argsort_impl("rank", x, n, 1, idx);
    if (!st)
        for (int64_t p = 0; p < n; p++) out_rank[idx[p]] = (int32_t)(p + 1);
    free(idx);
    return st;
}

/* ================================================================ index lists */

ks_status ks_cpu_unique(const int32_t *x, int64_t n, int32_t *out, int64_t *n_out) {
    NEED_PTR("unique", "n_out", n_out, 1);
    ks_status st = ks_cpu_sort_i32(x, n, out);
    if (st) return ks_error_prefix(st, "unique");
    int64_t u = 0;
    for (int64_t i = 0; i < n; i++)
        if (u == 0 || out[i] != out[u - 1]) out[u++] = out[i];
    *n_out = u;
    return KS_OK;
}

/* The first position where `a` is not strictly ascending, or -1. */
static int64_t not_ascending_at(const int32_t *a, int64_t n) {
    for (int64_t i = 1; i < n; i++)
        if (a[i] <= a[i - 1]) return i;
    return -1;
}

ks_status ks_cpu_union(const int32_t *a, int64_t na, const int32_t *b, int64_t nb, int32_t *out, int64_t *n_out) {
    NEED_NONNEG("union", "na", na);
    NEED_NONNEG("union", "nb", nb);
    NEED_PTR("union", "a", a, na);
    NEED_PTR("union", "b", b, nb);
    NEED_PTR("union", "out", out, na + nb);
    NEED_PTR("union", "n_out", n_out, 1);
    int64_t p;
    if ((p = not_ascending_at(a, na)) >= 0)
        return ks_errorf(KS_ERR_ARG, "union: first list is not strictly ascending: %d at position %lld follows %d",
                         a[p], (long long)p, a[p - 1]);
    if ((p = not_ascending_at(b, nb)) >= 0)
        return ks_errorf(KS_ERR_ARG, "union: second list is not strictly ascending: %d at position %lld follows %d",
                         b[p], (long long)p, b[p - 1]);
    int64_t i = 0, j = 0, t = 0;
    while (i < na && j < nb) {
        if (a[i] < b[j]) out[t++] = a[i++];
        else if (b[j] < a[i]) out[t++] = b[j++];
        else { out[t++] = a[i++]; j++; }
    }
    while (i < na) out[t++] = a[i++];
    while (j < nb) out[t++] = b[j++];
    *n_out = t;
    return KS_OK;
}

static ks_status concat_impl(const char *prim, const void *a, int64_t na, const void *b, int64_t nb, size_t es,
                             void *out) {
    NEED_NONNEG(prim, "na", na);
    NEED_NONNEG(prim, "nb", nb);
    NEED_PTR(prim, "a", a, na);
    NEED_PTR(prim, "b", b, nb);
    NEED_PTR(prim, "out", out, na + nb);
    if (na && out != a) memmove(out, a, (size_t)na * es);
    if (nb) memmove((char *)out + (size_t)na * es, b, (size_t)nb * es);
    return KS_OK;
}

ks_status ks_cpu_concat_i32(const int32_t *a, int64_t na, const int32_t *b, int64_t nb, int32_t *out) {
    return concat_impl("concat", a, na, b, nb, sizeof *a, out);
}

ks_status ks_cpu_concat_f32(const float *a, int64_t na, const float *b, int64_t nb, float *out) {
    return concat_impl("concat", a, na, b, nb, sizeof *a, out);
}

int64_t ks_arange_len(int64_t start, int64_t stop, int64_t step) {
    if (step == 0) return -1;
    if (step > 0 ? stop <= start : stop >= start) return 0;
    /* magnitudes in uint64: exact for any int64 arguments */
    uint64_t span = step > 0 ? (uint64_t)stop - (uint64_t)start : (uint64_t)start - (uint64_t)stop;
    uint64_t ustep = step > 0 ? (uint64_t)step : 0 - (uint64_t)step;
    uint64_t len = (span - 1) / ustep + 1;
    return len > (uint64_t)INT64_MAX ? INT64_MAX : (int64_t)len;
}

ks_status ks_cpu_arange(int64_t start, int64_t stop, int64_t step, int32_t *out) {
    if (step == 0) return ks_errorf(KS_ERR_ARG, "arange: step is 0");
    int64_t len = ks_arange_len(start, stop, step);
    if (len == 0) return KS_OK;
    NEED_PTR("arange", "out", out, len);
    int64_t last = 0;
    if (start < INT32_MIN || start > INT32_MAX || len > IDX_MAX + 1 || __builtin_mul_overflow(len - 1, step, &last) ||
        (last += start) < INT32_MIN || last > INT32_MAX)
        return ks_errorf(KS_ERR_ARG, "arange: values of arange(%lld, %lld, %lld) leave the int32 range",
                         (long long)start, (long long)stop, (long long)step);
    for (int64_t i = 0; i < len; i++) out[i] = (int32_t)(start + i * step);
    return KS_OK;
}

/* The first index of idx // (k) outside [0, n), or -1. */
static int64_t out_of_range_at(const int32_t *idx, int64_t k, int64_t n) {
    for (int64_t i = 0; i < k; i++)
        if (idx[i] < 0 || idx[i] >= n) return i;
    return -1;
}

ks_status ks_cpu_gather(const float *x, int64_t n, int64_t d, const int32_t *idx, int64_t k, float *out) {
    NEED_NONNEG("gather", "n", n);
    NEED_NONNEG("gather", "d", d);
    NEED_NONNEG("gather", "k", k);
    int64_t tmp;
    ks_status st;
    if ((st = mul_size("gather", n, d, &tmp)) || (st = mul_size("gather", k, d, &tmp))) return st;
    NEED_PTR("gather", "idx", idx, k);
    NEED_PTR("gather", "out", out, k * d);
    NEED_PTR("gather", "x", x, n * d);
    int64_t p = out_of_range_at(idx, k, n);
    if (p >= 0)
        return ks_errorf(KS_ERR_ARG, "gather: index %d at position %lld out of range [0, %lld)", idx[p], (long long)p,
                         (long long)n);
    for (int64_t i = 0; i < k; i++) memcpy(out + i * d, x + (int64_t)idx[i] * d, (size_t)d * sizeof *out);
    return KS_OK;
}

ks_status ks_cpu_gather_i32(const int32_t *x, int64_t n, const int32_t *idx, int64_t k, int32_t *out) {
    NEED_NONNEG("gather", "n", n);
    NEED_NONNEG("gather", "k", k);
    NEED_PTR("gather", "idx", idx, k);
    NEED_PTR("gather", "out", out, k);
    NEED_PTR("gather", "x", x, n);
    int64_t p = out_of_range_at(idx, k, n);
    if (p >= 0)
        return ks_errorf(KS_ERR_ARG, "gather: index %d at position %lld out of range [0, %lld)", idx[p], (long long)p,
                         (long long)n);
    for (int64_t i = 0; i < k; i++) out[i] = x[idx[i]];
    return KS_OK;
}

ks_status ks_check_indices(const int32_t *idx, int64_t k, int64_t n, int require_sorted, const char *what) {
    const char *w = what ? what : "indices";
    if (k < 0) return ks_errorf(KS_ERR_ARG, "%s: index count %lld is negative", w, (long long)k);
    if (n < 0) return ks_errorf(KS_ERR_ARG, "%s: row count %lld is negative", w, (long long)n);
    if (!idx && k > 0) return ks_errorf(KS_ERR_ARG, "%s: index list is NULL", w);
    if (k > n) return ks_errorf(KS_ERR_ARG, "%s: %lld indices for %lld rows", w, (long long)k, (long long)n);
    int64_t p = out_of_range_at(idx, k, n);
    if (p >= 0)
        return ks_errorf(KS_ERR_ARG, "%s: index %d at position %lld out of range [0, %lld)", w, idx[p], (long long)p,
                         (long long)n);
    if (require_sorted) {
        for (int64_t i = 1; i < k; i++) {
            if (idx[i] == idx[i - 1])
                return ks_errorf(KS_ERR_ARG, "%s: duplicate index %d (positions %lld and %lld)", w, idx[i],
                                 (long long)(i - 1), (long long)i);
            if (idx[i] < idx[i - 1])
                return ks_errorf(KS_ERR_ARG, "%s: index %d at position %lld follows %d (not ascending)", w, idx[i],
                                 (long long)i, idx[i - 1]);
        }
        return KS_OK;
    }
    if (k < 2) return KS_OK;
    int64_t nbits = KS_MIN(n, IDX_MAX + 1); /* valid int32 indices never reach further */
    uint64_t *seen = ks_calloc((size_t)(nbits + 63) / 64, sizeof *seen);
    if (!seen) return ks_error_prefix(KS_ERR_OOM, "%s", w);
    ks_status st = KS_OK;
    for (int64_t i = 0; i < k; i++) {
        uint32_t v = (uint32_t)idx[i];
        if (seen[v >> 6] >> (v & 63) & 1) {
            int64_t first = 0;
            while (idx[first] != idx[i]) first++;
            st = ks_errorf(KS_ERR_ARG, "%s: duplicate index %d (positions %lld and %lld)", w, idx[i], (long long)first,
                           (long long)i);
            break;
        }
        seen[v >> 6] |= (uint64_t)1 << (v & 63);
    }
    free(seen);
    return st;
}

/* ================================================================ small numerics */

ks_status ks_cpu_softmax(const float *x, int64_t rows, int64_t n, float *out) {
    NEED_NONNEG("softmax", "rows", rows);
    NEED_NONNEG("softmax", "n", n);
    int64_t total;
    ks_status st = mul_size("softmax", rows, n, &total);
    if (st) return st;
    NEED_PTR("softmax", "x", x, total);
    NEED_PTR("softmax", "out", out, total);
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * n;
        float *yr = out + r * n;
        float mx = -INFINITY;
        int nan = 0;
        for (int64_t j = 0; j < n; j++) {
            if (isnan(xr[j])) nan = 1;
            else if (xr[j] > mx) mx = xr[j];
        }
        if (nan || mx == INFINITY) { /* NaN in, NaN out; +inf makes inf - inf */
            for (int64_t j = 0; j < n; j++) yr[j] = NAN;
            continue;
        }
        if (mx == -INFINITY) { /* all -inf: nothing to attend, all zeros */
            for (int64_t j = 0; j < n; j++) yr[j] = 0.0f;
            continue;
        }
        double z = 0;
        for (int64_t j = 0; j < n; j++) {
            yr[j] = expf(xr[j] - mx);
            z += yr[j];
        }
        double inv = 1.0 / z;
        for (int64_t j = 0; j < n; j++) yr[j] = (float)((double)yr[j] * inv);
    }
    return KS_OK;
}

/* Shared checks of the axis reductions; *count = length of the reduced axis. */
static ks_status axis_check(const char *prim, const float *x, int64_t rows, int64_t cols, int axis, const float *out,
                            int64_t *count) {
    NEED_NONNEG(prim, "rows", rows);
    NEED_NONNEG(prim, "cols", cols);
    if (axis != 0 && axis != 1) return ks_errorf(KS_ERR_ARG, "%s: axis = %d must be 0 or 1", prim, axis);
    int64_t total;
    ks_status st = mul_size(prim, rows, cols, &total);
    if (st) return st;
    NEED_PTR(prim, "x", x, total);
    NEED_PTR(prim, "out", out, axis == 0 ? cols : rows);
    *count = axis == 0 ? rows : cols;
    return KS_OK;
}

/* out = sum over the axis, divided by `div` (1 for sum). */
static ks_status axis_sum(const float *x, int64_t rows, int64_t cols, int axis, double div, float *out) {
    if (axis == 1) {
        for (int64_t r = 0; r < rows; r++) {
            double s = 0;
            for (int64_t c = 0; c < cols; c++) s += x[r * cols + c];
            out[r] = (float)(s / div);
        }
        return KS_OK;
    }
    double *acc = ks_calloc((size_t)cols, sizeof *acc);
    if (!acc) return KS_ERR_OOM;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++) acc[c] += x[r * cols + c];
    for (int64_t c = 0; c < cols; c++) out[c] = (float)(acc[c] / div);
    free(acc);
    return KS_OK;
}

ks_status ks_cpu_sum(const float *x, int64_t rows, int64_t cols, int axis, float *out) {
    int64_t count;
    ks_status st = axis_check("sum", x, rows, cols, axis, out, &count);
    return st ? st : axis_sum(x, rows, cols, axis, 1.0, out);
}

ks_status ks_cpu_mean(const float *x, int64_t rows, int64_t cols, int axis, float *out) {
    int64_t count;
    ks_status st = axis_check("mean", x, rows, cols, axis, out, &count);
    if (st) return st;
    if (count == 0 && (axis == 0 ? cols : rows) > 0)
        return ks_errorf(KS_ERR_ARG, "mean: axis %d is empty (shape %lld x %lld)", axis, (long long)rows,
                         (long long)cols);
    return axis_sum(x, rows, cols, axis, (double)count, out);
}

ks_status ks_cpu_var(const float *x, int64_t rows, int64_t cols, int axis, int64_t ddof, float *out) {
    int64_t count;
    ks_status st = axis_check("var", x, rows, cols, axis, out, &count);
    if (st) return st;
    NEED_NONNEG("var", "ddof", ddof);
    int64_t nout = axis == 0 ? cols : rows;
    if (nout == 0) return KS_OK;
    if (count - ddof <= 0)
        return ks_errorf(KS_ERR_ARG, "var: %lld values with ddof = %lld leave no degrees of freedom", (long long)count,
                         (long long)ddof);
    double *mu = ks_calloc((size_t)nout * 2, sizeof *mu);
    if (!mu) return KS_ERR_OOM;
    double *ss = mu + nout;
    /* element (a, b) of the (nout, count) view: output a, reduced position b */
#define AT(a, b) (axis == 1 ? x[(a) * cols + (b)] : x[(b) * cols + (a)])
    if (axis == 1) {
        for (int64_t a = 0; a < nout; a++) {
            for (int64_t b = 0; b < count; b++) mu[a] += AT(a, b);
            mu[a] /= (double)count;
            for (int64_t b = 0; b < count; b++) { double e = AT(a, b) - mu[a]; ss[a] += e * e; }
        }
    } else { /* row-major friendly loop order for axis 0 */
        for (int64_t b = 0; b < count; b++)
            for (int64_t a = 0; a < nout; a++) mu[a] += AT(a, b);
        for (int64_t a = 0; a < nout; a++) mu[a] /= (double)count;
        for (int64_t b = 0; b < count; b++)
            for (int64_t a = 0; a < nout; a++) { double e = AT(a, b) - mu[a]; ss[a] += e * e; }
    }
#undef AT
    for (int64_t a = 0; a < nout; a++) out[a] = (float)(ss[a] / (double)(count - ddof));
    free(mu);
    return KS_OK;
}

static float cosine1(const float *a, const float *b, int64_t n) {
    double ab = 0, aa = 0, bb = 0;
    for (int64_t i = 0; i < n; i++) {
        ab += (double)a[i] * b[i];
        aa += (double)a[i] * a[i];
        bb += (double)b[i] * b[i];
    }
    if (aa == 0 || bb == 0) return 0.0f;
    return (float)(ab / (sqrt(aa) * sqrt(bb)));
}

ks_status ks_cpu_cosine(const float *a, const float *b, int64_t n, float *out) {
    NEED_NONNEG("cosine", "n", n);
    NEED_PTR("cosine", "a", a, n);
    NEED_PTR("cosine", "b", b, n);
    NEED_PTR("cosine", "out", out, 1);
    *out = cosine1(a, b, n);
    return KS_OK;
}

ks_status ks_cpu_cosine_rows(const float *a, const float *b, int64_t rows, int64_t d, float *out) {
    NEED_NONNEG("cosine", "rows", rows);
    NEED_NONNEG("cosine", "d", d);
    int64_t total;
    ks_status st = mul_size("cosine", rows, d, &total);
    if (st) return st;
    NEED_PTR("cosine", "a", a, total);
    NEED_PTR("cosine", "b", b, total);
    NEED_PTR("cosine", "out", out, rows);
    for (int64_t r = 0; r < rows; r++) out[r] = cosine1(a + r * d, b + r * d, d);
    return KS_OK;
}

/* ================================================================ masks */

ks_status ks_cpu_ge(const float *x, int64_t n, double thr, float *out) {
    NEED_NONNEG("ge", "n", n);
    NEED_PTR("ge", "x", x, n);
    NEED_PTR("ge", "out", out, n);
    for (int64_t i = 0; i < n; i++) out[i] = (double)x[i] >= thr ? 1.0f : 0.0f; /* NaN compares false */
    return KS_OK;
}

ks_status ks_cpu_where(const float *mask, int64_t nm, const void *a, const void *b, int64_t n, void *out) {
    NEED_NONNEG("where", "n", n);
    if (nm != 1 && nm != n)
        return ks_errorf(KS_ERR_ARG, "where: the mask has %lld entries for %lld values (want 1 or %lld)", (long long)nm,
                         (long long)n, (long long)n);
    NEED_PTR("where", "mask", mask, nm);
    NEED_PTR("where", "a", a, n);
    NEED_PTR("where", "b", b, n);
    NEED_PTR("where", "out", out, n);
    const uint32_t *ua = a, *ub = b;
    uint32_t *uo = out;
    for (int64_t i = 0; i < n; i++) uo[i] = mask[nm == 1 ? 0 : i] != 0.0f ? ua[i] : ub[i];
    return KS_OK;
}
