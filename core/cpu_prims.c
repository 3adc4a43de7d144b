/* cpu_prims.c — the CPU backend's table of policy primitives (ks_backend.prims): core/prims.c on
 * host buffers, with the conventions every backend's table follows (backend.h):
 *   - unique / union write their count, cosine its value, through the output pointer (here host
 *     memory, so nothing to download);
 *   - union takes its lists in any order (the sorted distinct values of both);
 *   - gather with an error word: a bad index makes its row NaN words and puts the lowest bad
 *     position in *err (the caller set it to -1); the call succeeds. err NULL: core/prims.c's
 *     own check (KS_ERR_ARG naming the index);
 *   - scores refuses bf16 keys (host keys are float32).
 * The backend argument is not used: the table is the same for every CPU backend, and lua/ uses
 * it for host tensors that belong to no backend. Results are core/prims.c's, bit for bit. */
#include "backend.h"

#include <string.h>

static ks_status c_scores(ks_backend *b, const float *q, const int32_t *qpos, int64_t hq, int64_t m, const void *k,
                          int k_bf16, const int32_t *kpos, int64_t hkv, int64_t n, int64_t d, const ks_scores_opts *o,
                          float *out) {
    if (k_bf16) return ks_errorf(KS_ERR_UNSUPPORTED, "scores: the CPU backend has no bf16 keys");
    return ks_cpu_scores(q, qpos, hq, m, k, kpos, hkv, n, d, o, out);
}
static ks_status c_pool1d(ks_backend *b, const float *x, int64_t rows, int64_t n, int64_t kernel, ks_pool_mode mode,
                          float *out) {
    return ks_cpu_pool1d(x, rows, n, kernel, mode, out);
}
static ks_status c_topk(ks_backend *b, const float *x, int64_t rows, int64_t n, int64_t k, int64_t base,
                        ks_topk_order order,
                        int32_t *oi, float *ov, const float *skip, int64_t grow) {
    (void)grow; /* nothing is recorded here: a call that runs now has grown by 0 */
    return ks_cpu_topk_masked(skip, x, rows, n, k, base, order, oi, ov);
}
static ks_status c_argsort(ks_backend *b, const float *x, int64_t n, int desc, int32_t *oi) {
    return ks_cpu_argsort(x, n, desc, oi);
}
static ks_status c_sort_f32(ks_backend *b, const float *x, int64_t n, int desc, float *out) {
    return ks_cpu_sort_f32(x, n, desc, out);
}
static ks_status c_sort_i32(ks_backend *b, const int32_t *x, int64_t n, int32_t *out) { return ks_cpu_sort_i32(x, n, out); }
static ks_status c_rank(ks_backend *b, const float *x, int64_t n, int32_t *out) { return ks_cpu_rank(x, n, out); }
static ks_status c_unique(ks_backend *b, const int32_t *x, int64_t n, int32_t *out, int64_t *n_out) {
    return ks_cpu_unique(x, n, out, n_out);
}

static int strictly_ascending(const int32_t *x, int64_t n) {
    for (int64_t i = 1; i < n; i++)
        if (x[i] <= x[i - 1]) return 0;
    return 1;
}
/* out // (na + nb): ascending inputs merge (ks_cpu_union); others are concatenated, then made
 * unique (sorted). Both give the sorted distinct values of a and b. */
static ks_status c_union(ks_backend *b, const int32_t *a, int64_t na, const int32_t *bb, int64_t nb, int32_t *out,
                         int64_t *n_out) {
    if (na < 0 || nb < 0 || (!a && na) || (!bb && nb) || (strictly_ascending(a, na) && strictly_ascending(bb, nb)))
        return ks_cpu_union(a, na, bb, nb, out, n_out); /* its checks name a bad argument */
    ks_status st = ks_cpu_concat_i32(a, na, bb, nb, out);
    return st ? st : ks_cpu_unique(out, na + nb, out, n_out);
}
static ks_status c_concat_i32(ks_backend *b, const int32_t *a, int64_t na, const int32_t *bb, int64_t nb, int32_t *out) {
    return ks_cpu_concat_i32(a, na, bb, nb, out);
}
static ks_status c_concat_f32(ks_backend *b, const float *a, int64_t na, const float *bb, int64_t nb, float *out) {
    return ks_cpu_concat_f32(a, na, bb, nb, out);
}
static ks_status c_arange(ks_backend *b, int64_t start, int64_t stop, int64_t step, int32_t *out) {
    return ks_cpu_arange(start, stop, step, out);
}

/* Rows of d 32-bit words (i32: the 1-D int32 gather, one word a row). One core call; when it
 * refuses a bad index and the caller gave an error word, the rows again one core call each (its
 * checks still apply) with the bad ones NaN words. */
static ks_status gather_words(const void *x, int64_t n, int64_t d, int i32, const int32_t *idx, int64_t k, void *out,
                              int64_t *err) {
    ks_status st = i32 ? ks_cpu_gather_i32(x, n, idx, k, out) : ks_cpu_gather(x, n, d, idx, k, out);
    int64_t bad = -1, w = i32 ? 1 : d;
    if (st != KS_ERR_ARG || !err || !idx || w < 0 || (!out && w)) return st;
    for (int64_t i = 0; i < k && bad < 0; i++)
        if (idx[i] < 0 || idx[i] >= n) bad = i;
    if (bad < 0) return st; /* refused for another reason */
    for (int64_t i = 0; i < k; i++) {
        uint32_t *o = (uint32_t *)out + i * w;
        if (idx[i] < 0 || idx[i] >= n) {
            for (int64_t j = 0; j < w; j++) o[j] = 0x7fc00000u; /* the quiet NaN */
            continue;
        }
        st = i32 ? ks_cpu_gather_i32(x, n, idx + i, 1, (int32_t *)o) : ks_cpu_gather(x, n, d, idx + i, 1, (float *)o);
        if (st) return st;
    }
    *err = bad;
    return KS_OK;
}
static ks_status c_gather(ks_backend *b, const float *x, int64_t n, int64_t d, const int32_t *idx, int64_t k, float *out,
                          int64_t *err) {
    return gather_words(x, n, d, 0, idx, k, out, err);
}
static ks_status c_gather_i32(ks_backend *b, const int32_t *x, int64_t n, const int32_t *idx, int64_t k, int32_t *out,
                              int64_t *err) {
    return gather_words(x, n, 1, 1, idx, k, out, err);
}

static ks_status c_softmax(ks_backend *b, const float *x, int64_t rows, int64_t n, float *out) {
    return ks_cpu_softmax(x, rows, n, out);
}
static ks_status c_sum(ks_backend *b, const float *x, int64_t rows, int64_t cols, int axis, float *out) {
    return ks_cpu_sum(x, rows, cols, axis, out);
}
static ks_status c_mean(ks_backend *b, const float *x, int64_t rows, int64_t cols, int axis, float *out) {
    return ks_cpu_mean(x, rows, cols, axis, out);
}
static ks_status c_var(ks_backend *b, const float *x, int64_t rows, int64_t cols, int axis, int64_t ddof, float *out) {
    return ks_cpu_var(x, rows, cols, axis, ddof, out);
}
static ks_status c_cosine(ks_backend *b, const float *a, const float *bb, int64_t n, float *out) {
    return ks_cpu_cosine(a, bb, n, out);
}
static ks_status c_cosine_rows(ks_backend *b, const float *a, const float *bb, int64_t rows, int64_t d, float *out) {
    return ks_cpu_cosine_rows(a, bb, rows, d, out);
}
static ks_status c_ge(ks_backend *b, const float *x, int64_t n, double thr, float *out) { return ks_cpu_ge(x, n, thr, out); }
static ks_status c_where(ks_backend *b, const float *mask, int64_t nm, const void *a, const void *bb, int64_t n, void *out) {
    return ks_cpu_where(mask, nm, a, bb, n, out);
}

/* In the order of ks_backend_prims (backend.h); entries added there are added here at the end. */
static const ks_backend_prims cpu_prims = {
    .scores = c_scores,
    .pool1d = c_pool1d,
    .topk = c_topk,
    .argsort = c_argsort,
    .sort_f32 = c_sort_f32,
    .sort_i32 = c_sort_i32,
    .rank = c_rank,
    .unique = c_unique,
    .union_ = c_union,
    .concat_i32 = c_concat_i32,
    .concat_f32 = c_concat_f32,
    .arange = c_arange,
    .gather = c_gather,
    .gather_i32 = c_gather_i32,
    .softmax = c_softmax,
    .sum = c_sum,
    .mean = c_mean,
    .var = c_var,
    .cosine = c_cosine,
    .cosine_rows = c_cosine_rows,
    .page_reduce = ks_cpu_page_reduce_entry, /* core/prims_page.c */
    .bound_scores = ks_cpu_bound_scores_entry,
    .page_rows = ks_cpu_page_rows_entry,
    .ge = c_ge,
    .where = c_where,
};

const ks_backend_prims *ks_cpu_prims(void) { return &cpu_prims; }
