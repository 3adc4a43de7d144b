/* prims_page.c — page primitives, CPU reference (meaning and rules: prims_page.h). */
#include "prims_page.h"

#include "common.h"

#include <math.h>
#include <stddef.h>
#include <string.h>

int64_t ks_page_count(int64_t n, int64_t page) {
    if (n <= 0 || page <= 0) return 0;
    return n / page + (n % page != 0);
}

/* ================================================================ page_reduce */

ks_status ks_page_reduce_check_args(const void *x, int x_bf16, int64_t n, int64_t h, int64_t d, int64_t row_stride,
                                    int64_t head_stride, int64_t page, int64_t p0, int64_t p1, const float *out_min,
                                    const float *out_max, const float *out_mean) {
    const char *fn = "page_reduce";
    if (n < 0 || h < 0 || d < 0)
        return ks_errorf(KS_ERR_ARG, "%s: negative size (n = %lld, h = %lld, d = %lld)", fn, (long long)n, (long long)h,
                         (long long)d);
    if (page < 1) return ks_errorf(KS_ERR_ARG, "%s: page = %lld must be >= 1", fn, (long long)page);
    int64_t np = ks_page_count(n, page);
    if (p0 < 0 || p1 < p0 || p1 > np)
        return ks_errorf(KS_ERR_ARG, "%s: pages [%lld, %lld) not within [0, %lld] (%lld rows of %lld)", fn, (long long)p0,
                         (long long)p1, (long long)np, (long long)n, (long long)page);
    if (row_stride < 0 || head_stride < 0) return ks_errorf(KS_ERR_ARG, "%s: negative stride", fn);
    if (x_bf16 != 0 && x_bf16 != 1) return ks_errorf(KS_ERR_ARG, "%s: x_bf16 = %d must be 0 or 1", fn, x_bf16);
    if (!out_min && !out_max && !out_mean) return ks_errorf(KS_ERR_ARG, "%s: no output asked for", fn);
    if (!x && p1 > p0 && h > 0 && d > 0) return ks_errorf(KS_ERR_ARG, "%s: x is NULL", fn);
    int64_t cnt;
    if (__builtin_mul_overflow(p1 - p0, h, &cnt) || __builtin_mul_overflow(cnt, d, &cnt) ||
        cnt > (int64_t)(SIZE_MAX / 8))
        return ks_errorf(KS_ERR_ARG, "%s: output of %lld x %lld x %lld is too large", fn, (long long)(p1 - p0),
                         (long long)h, (long long)d);
    return KS_OK;
}

static inline float elem(const void *x, int bf16, int64_t off) {
    return bf16 ? ks_bf16_to_f32(((const uint16_t *)x)[off]) : ((const float *)x)[off];
}

/* bf16 bits of a float rounded toward -inf (down = 1) or +inf (down = 0): the nearest bf16 on
 * that side, so a box of rounded ends still contains the float one; a bf16 value (low half 0)
 * is exact. NaN stays NaN (a quiet NaN of the same sign); +-inf and +-0 are exact. */
uint16_t ks_bf16_dir(float f, int down) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x0040u);
    uint16_t t = (uint16_t)(u >> 16); /* toward zero */
    if (!(u & 0xffffu)) return t;
    int neg = (int)(u >> 31);
    return (uint16_t)(down == neg ? t + 1 : t); /* away from zero: one ulp of magnitude (to inf at the top) */
}

/* min / max / mean of each (page, head, channel), and the packed box (min down | max up << 16) */
static void reduce_pages(const void *x, int x_bf16, int64_t n, int64_t h, int64_t d, int64_t row_stride,
                         int64_t head_stride, int64_t page, int64_t p0, int64_t p1, float *out_min, float *out_max,
                         float *out_mean, uint32_t *out_box) {
    for (int64_t p = p0; p < p1; p++) {
        int64_t r0 = p * page, r1 = KS_MIN(n, r0 + page);
        for (int64_t j = 0; j < h; j++)
            for (int64_t c = 0; c < d; c++) {
                int64_t base = j * head_stride + c;
                float mn = elem(x, x_bf16, r0 * row_stride + base), mx = mn;
                double sum = mn;
                for (int64_t r = r0 + 1; r < r1; r++) {
                    float v = elem(x, x_bf16, r * row_stride + base);
                    if (v < mn || isnan(v)) mn = isnan(mn) ? mn : v;
                    if (v > mx || isnan(v)) mx = isnan(mx) ? mx : v;
                    sum += v;
                }
                int64_t o = ((p - p0) * h + j) * d + c;
                if (out_min) out_min[o] = mn;
                if (out_max) out_max[o] = mx;
                if (out_mean) out_mean[o] = (float)(sum / (double)(r1 - r0));
                if (out_box) out_box[o] = (uint32_t)ks_bf16_dir(mn, 1) | (uint32_t)ks_bf16_dir(mx, 0) << 16;
            }
    }
}

ks_status ks_cpu_page_reduce(const void *x, int x_bf16, int64_t n, int64_t h, int64_t d, int64_t row_stride,
                             int64_t head_stride, int64_t page, int64_t p0, int64_t p1, float *out_min, float *out_max,
                             float *out_mean) {
    ks_status st = ks_page_reduce_check_args(x, x_bf16, n, h, d, row_stride, head_stride, page, p0, p1, out_min, out_max,
                                             out_mean);
    if (st) return st;
    reduce_pages(x, x_bf16, n, h, d, row_stride, head_stride, page, p0, p1, out_min, out_max, out_mean, NULL);
    return KS_OK;
}

ks_status ks_page_box_check_args(const void *x, int x_bf16, int64_t n, int64_t h, int64_t d, int64_t row_stride,
                                 int64_t head_stride, int64_t page, int64_t p0, int64_t p1, const uint32_t *out_box) {
    if (!out_box) return ks_errorf(KS_ERR_ARG, "page_box: no output");
    /* the same sizes and rules; out_box stands for the one output (only its presence is checked) */
    return ks_page_reduce_check_args(x, x_bf16, n, h, d, row_stride, head_stride, page, p0, p1, (const float *)out_box,
                                     NULL, NULL);
}

ks_status ks_cpu_page_box(const void *x, int x_bf16, int64_t n, int64_t h, int64_t d, int64_t row_stride,
                          int64_t head_stride, int64_t page, int64_t p0, int64_t p1, uint32_t *out_box) {
    ks_status st = ks_page_box_check_args(x, x_bf16, n, h, d, row_stride, head_stride, page, p0, p1, out_box);
    if (st) return st;
    reduce_pages(x, x_bf16, n, h, d, row_stride, head_stride, page, p0, p1, NULL, NULL, NULL, out_box);
    return KS_OK;
}

/* ================================================================ bound_scores */

ks_status ks_bound_scores_check_args(int64_t n_q_heads, int64_t n, int64_t n_kv_heads, int64_t d, ks_bound_reduce reduce) {
    const char *fn = "bound_scores";
    if (n_q_heads < 1 || n_kv_heads < 1)
        return ks_errorf(KS_ERR_ARG, "%s: n_q_heads = %lld and n_kv_heads = %lld must be >= 1", fn, (long long)n_q_heads,
                         (long long)n_kv_heads);
    if (n_q_heads % n_kv_heads)
        return ks_errorf(KS_ERR_ARG, "%s: n_q_heads = %lld is not a multiple of n_kv_heads = %lld", fn,
                         (long long)n_q_heads, (long long)n_kv_heads);
    if (d < 1) return ks_errorf(KS_ERR_ARG, "%s: d = %lld must be >= 1", fn, (long long)d);
    if (n < 0) return ks_errorf(KS_ERR_ARG, "%s: n = %lld is negative", fn, (long long)n);
    if (reduce != KS_BOUND_NONE && reduce != KS_BOUND_GROUP_MAX && reduce != KS_BOUND_GROUP_SUM)
        return ks_errorf(KS_ERR_ARG, "%s: unknown reduce %d", fn, (int)reduce);
    int64_t cnt;
    if (__builtin_mul_overflow(n, n_kv_heads, &cnt) || __builtin_mul_overflow(cnt, d, &cnt) ||
        __builtin_mul_overflow(n, n_q_heads, &cnt) || cnt > (int64_t)(SIZE_MAX / 8))
        return ks_errorf(KS_ERR_ARG, "%s: %lld boxes are too many", fn, (long long)n);
    return KS_OK;
}

/* The ends of box element i: float lo / hi arrays, or packed bf16 pairs (box != NULL). */
static inline void box_at(const float *lo, const float *hi, const uint32_t *box, int64_t i, float *l, float *u) {
    if (box) {
        uint32_t a = box[i] << 16, b = box[i] & 0xffff0000u;
        memcpy(l, &a, 4);
        memcpy(u, &b, 4);
    } else {
        *l = lo[i];
        *u = hi[i];
    }
}

/* sum_i max(q_i lo_i, q_i hi_i) in double, in the fixed order of core/prims_page.h: term i into
 * partial (i / 4) % 32, i ascending within a partial, then the 32 partials halved (p[l] += p[l + o]
 * for o = 16, 8, 4, 2, 1). The products are exact in double, so only the additions round. */
static double bound_one(const float *q, const float *lo, const float *hi, const uint32_t *box, int64_t d) {
    double p[KS_BOUND_PARTS] = {0};
    for (int64_t i = 0; i < d; i++) {
        float l, u;
        box_at(lo, hi, box, i, &l, &u);
        double a = (double)q[i] * l, b = (double)q[i] * u;
        p[(i >> 2) % KS_BOUND_PARTS] += (a > b || isnan(a)) ? a : b;
    }
    for (int o = KS_BOUND_PARTS / 2; o > 0; o >>= 1)
        for (int l = 0; l < o; l++) p[l] += p[l + o];
    return p[0];
}

static void bounds(const float *q, int64_t n_q_heads, const float *lo, const float *hi, const uint32_t *box, int64_t n,
                   int64_t n_kv_heads, int64_t d, ks_bound_reduce reduce, float *out) {
    int64_t g = n_q_heads / n_kv_heads;
    for (int64_t j = 0; j < n; j++)
        for (int64_t kv = 0; kv < n_kv_heads; kv++) {
            int64_t o = (j * n_kv_heads + kv) * d;
            const float *l = lo ? lo + o : NULL, *u = hi ? hi + o : NULL;
            const uint32_t *bx = box ? box + o : NULL;
            if (reduce == KS_BOUND_NONE) {
                for (int64_t t = 0; t < g; t++) {
                    int64_t h = kv * g + t;
                    out[h * n + j] = (float)bound_one(q + h * d, l, u, bx, d);
                }
            } else if (reduce == KS_BOUND_GROUP_MAX) {
                float m = 0;
                for (int64_t t = 0; t < g; t++) {
                    float v = (float)bound_one(q + (kv * g + t) * d, l, u, bx, d);
                    if (t == 0 || v > m || isnan(v)) m = (t > 0 && isnan(m)) ? m : v;
                }
                out[kv * n + j] = m;
            } else {
                double s = 0;
                for (int64_t t = 0; t < g; t++) s += bound_one(q + (kv * g + t) * d, l, u, bx, d);
                out[kv * n + j] = (float)s;
            }
        }
}

ks_status ks_cpu_bound_scores(const float *q, int64_t n_q_heads, const float *lo, const float *hi, int64_t n,
                              int64_t n_kv_heads, int64_t d, ks_bound_reduce reduce, float *out) {
    ks_status st = ks_bound_scores_check_args(n_q_heads, n, n_kv_heads, d, reduce);
    if (st) return st;
    if (n > 0 && (!q || !lo || !hi || !out)) return ks_errorf(KS_ERR_ARG, "bound_scores: NULL data");
    bounds(q, n_q_heads, lo, hi, NULL, n, n_kv_heads, d, reduce, out);
    return KS_OK;
}

ks_status ks_cpu_bound_scores_box(const float *q, int64_t n_q_heads, const uint32_t *box, int64_t n,
                                  int64_t n_kv_heads, int64_t d, ks_bound_reduce reduce, float *out) {
    ks_status st = ks_bound_scores_check_args(n_q_heads, n, n_kv_heads, d, reduce);
    if (st) return st;
    if (n > 0 && (!q || !box || !out)) return ks_errorf(KS_ERR_ARG, "bound_scores: NULL data");
    bounds(q, n_q_heads, NULL, NULL, box, n, n_kv_heads, d, reduce, out);
    return KS_OK;
}

/* ================================================================ page_rows */

ks_status ks_page_rows_check_args(int64_t lists, int64_t k, int64_t page, int64_t n, int64_t before_begin,
                                  int64_t before_end, int64_t after_begin, int64_t after_end, int64_t *w) {
    const char *fn = "page_rows";
    if (lists < 0 || k < 0 || n < 0)
        return ks_errorf(KS_ERR_ARG, "%s: negative size (lists = %lld, k = %lld, n = %lld)", fn, (long long)lists,
                         (long long)k, (long long)n);
    if (page < 1) return ks_errorf(KS_ERR_ARG, "%s: page = %lld must be >= 1", fn, (long long)page);
    if (n > (int64_t)INT32_MAX + 1) return ks_errorf(KS_ERR_ARG, "%s: n = %lld exceeds the int32 index range", fn, (long long)n);
    if (before_begin < 0 || before_end < before_begin || before_end > n)
        return ks_errorf(KS_ERR_ARG, "%s: before = [%lld, %lld) is not within [0, %lld]", fn, (long long)before_begin,
                         (long long)before_end, (long long)n);
    if (after_begin < 0 || after_end < after_begin || after_end > n)
        return ks_errorf(KS_ERR_ARG, "%s: after = [%lld, %lld) is not within [0, %lld]", fn, (long long)after_begin,
                         (long long)after_end, (long long)n);
    if (before_end > before_begin && after_end > after_begin && after_begin < before_end)
        return ks_errorf(KS_ERR_ARG, "%s: after = [%lld, %lld) starts before the end of before = [%lld, %lld)", fn,
                         (long long)after_begin, (long long)after_end, (long long)before_begin, (long long)before_end);
    int64_t rows, width, cnt;
    if (__builtin_mul_overflow(k, page, &rows) || rows > n)
        return ks_errorf(KS_ERR_ARG, "%s: %lld pages of %lld rows exceed the %lld rows", fn, (long long)k, (long long)page,
                         (long long)n);
    width = (before_end - before_begin) + rows + (after_end - after_begin);
    if (width > n)
        return ks_errorf(KS_ERR_ARG, "%s: %lld rows per list exceed the %lld rows (the ranges overlap the pages)", fn,
                         (long long)width, (long long)n);
    if (__builtin_mul_overflow(lists, width, &cnt) || cnt > (int64_t)(SIZE_MAX / 8))
        return ks_errorf(KS_ERR_ARG, "%s: %lld lists of %lld rows are too many", fn, (long long)lists, (long long)width);
    *w = width;
    return KS_OK;
}

ks_status ks_cpu_page_rows(const int32_t *pages, int64_t lists, int64_t k, int64_t page, int64_t n,
                           int64_t before_begin, int64_t before_end, int64_t after_begin, int64_t after_end,
                           int32_t *out) {
    int64_t w;
    ks_status st = ks_page_rows_check_args(lists, k, page, n, before_begin, before_end, after_begin, after_end, &w);
    if (st) return st;
    if (lists > 0 && w > 0 && !out) return ks_errorf(KS_ERR_ARG, "page_rows: out is NULL");
    if (lists > 0 && k > 0 && !pages) return ks_errorf(KS_ERR_ARG, "page_rows: pages is NULL");
    /* the rows a page may cover: [lo_row, hi_row) */
    int64_t lo_row = before_end > before_begin ? before_end : 0;
    int64_t hi_row = after_end > after_begin ? after_begin : n;
    for (int64_t l = 0; l < lists; l++) {
        const int32_t *pl = pages + l * k;
        int32_t *o = out + l * w;
        for (int64_t t = 0; t < k; t++) {
            int64_t p = pl[t];
            if (p < 0 || p * page < lo_row || (p + 1) * page > hi_row)
                return ks_errorf(KS_ERR_ARG,
                                 "page_rows: page %lld at (list %lld, position %lld) out of range: its rows must lie in "
                                 "[%lld, %lld) (pages of %lld rows)",
                                 (long long)p, (long long)l, (long long)t, (long long)lo_row, (long long)hi_row,
                                 (long long)page);
            if (t > 0 && p <= pl[t - 1])
                return ks_errorf(KS_ERR_ARG, "page_rows: page %lld at (list %lld, position %lld) follows %d (not ascending)",
                                 (long long)p, (long long)l, (long long)t, pl[t - 1]);
        }
        for (int64_t r = before_begin; r < before_end; r++) *o++ = (int32_t)r;
        for (int64_t t = 0; t < k; t++)
            for (int64_t r = 0; r < page; r++) *o++ = (int32_t)(pl[t] * page + r);
        for (int64_t r = after_begin; r < after_end; r++) *o++ = (int32_t)r;
    }
    return KS_OK;
}

/* ================================================================ the CPU table's entries */

ks_status ks_cpu_page_reduce_entry(struct ks_backend *b, const void *x, int x_bf16, int64_t n, int64_t h, int64_t d,
                                   int64_t row_stride, int64_t head_stride, int64_t page, int64_t p0, int64_t p1,
                                   float *out_min, float *out_max, float *out_mean, uint32_t *out_box) {
    if (out_box) {
        if (out_min || out_max || out_mean) return ks_errorf(KS_ERR_ARG, "page_reduce: boxes are asked for alone");
        return ks_cpu_page_box(x, x_bf16, n, h, d, row_stride, head_stride, page, p0, p1, out_box);
    }
    return ks_cpu_page_reduce(x, x_bf16, n, h, d, row_stride, head_stride, page, p0, p1, out_min, out_max, out_mean);
}

ks_status ks_cpu_bound_scores_entry(struct ks_backend *b, const float *q, int64_t n_q_heads, const float *lo,
                                    const float *hi, const uint32_t *box, int64_t n, int64_t n_kv_heads, int64_t d,
                                    ks_bound_reduce reduce, float *out) {
    if (box) {
        if (lo || hi) return ks_errorf(KS_ERR_ARG, "bound_scores: boxes come as lo / hi or packed, not both");
        return ks_cpu_bound_scores_box(q, n_q_heads, box, n, n_kv_heads, d, reduce, out);
    }
    return ks_cpu_bound_scores(q, n_q_heads, lo, hi, n, n_kv_heads, d, reduce, out);
}

ks_status ks_cpu_page_rows_entry(struct ks_backend *b, const int32_t *pages, int64_t lists, int64_t k, int64_t page,
                                 int64_t n, int64_t before_begin, int64_t before_end, int64_t after_begin,
                                 int64_t after_end, int32_t *out, int64_t *err) {
    ks_status st = ks_cpu_page_rows(pages, lists, k, page, n, before_begin, before_end, after_begin, after_end, out);
    if (st != KS_ERR_ARG || !err) return st;
    /* argument errors stay errors; a bad entry is reported through the word, like a device */
    int64_t w;
    if (ks_page_rows_check_args(lists, k, page, n, before_begin, before_end, after_begin, after_end, &w)) return st;
    if ((lists > 0 && w > 0 && !out) || (lists > 0 && k > 0 && !pages)) return st;
    int64_t lo_row = before_end > before_begin ? before_end : 0;
    int64_t hi_row = after_end > after_begin ? after_begin : n;
    for (int64_t e = 0; e < lists * k; e++) {
        int64_t t = e % k, p = pages[e];
        if (p < 0 || p * page < lo_row || (p + 1) * page > hi_row || (t > 0 && p <= pages[e - 1])) {
            *err = e;
            return KS_OK;
        }
    }
    return st;
}
