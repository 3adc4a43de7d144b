/* cuda_prims.cu — the CUDA backend's table of policy primitives (ks_backend.prims): each entry
 * runs the device primitive of ks_cuda_prims.h on the backend's stream, with scratch memory from
 * its pool (cuda_backend_int.h). */
#include "cuda_backend_int.h"
#include "ks_cuda_page.h"

#ifdef KS_BACKEND_PRIMS
#define PRIM_CTX(b) cuda_ctx *c_ = CTX(b); ks_cuda_scratch sc_ = ks_cuda_backend_scratch(b); (void)sc_
static ks_status pr_scores(ks_backend *b, const float *q, const int32_t *qpos, int64_t hq, int64_t m, const void *k,
                           int k_bf16, const int32_t *kpos, int64_t hkv, int64_t n, int64_t d, const ks_scores_opts *o,
                           float *out) {
    PRIM_CTX(b);
    if (o && o->grow > 0 && c_->rec && c_->rec_own) { /* a recorded handler's call: its sizes follow the layer's rows */
        ks_status st = ks_cuda_scores_grow(c_->stream, &sc_, q, qpos, hq, m, k, k_bf16, kpos, hkv, n, d, o, out,
                                           c_->d_step + 2, c_->h_step[2]);
        if (st == KS_ERR_UNSUPPORTED) c_->rec_failed = 1;
        return st;
    }
    return ks_cuda_scores(c_->stream, &sc_, q, qpos, hq, m, k, k_bf16, kpos, hkv, n, d, o, out);
}
static ks_status pr_pool1d(ks_backend *b, const float *x, int64_t rows, int64_t n, int64_t kernel, ks_pool_mode mode,
                           float *out) {
    PRIM_CTX(b);
    return ks_cuda_pool1d(c_->stream, &sc_, x, rows, n, kernel, mode, out);
}
static ks_status pr_topk(ks_backend *b, const float *x, int64_t rows, int64_t n, int64_t k, int64_t base,
                         ks_topk_order order,
                         int32_t *oi, float *ov, const float *skip, int64_t grow) {
    PRIM_CTX(b);
    if (grow > 0 && c_->rec && c_->rec_own) { /* a recorded handler's row: n follows the layer's rows */
        if (rows != 1) return rec_fail(c_, "a top-k of several growing rows");
        ks_status st = ks_cuda_topk_grow(c_->stream, &sc_, x, n, k, base, order, oi, ov, skip, grow, c_->d_step + 2,
                                         c_->h_step[2]);
        if (st == KS_ERR_UNSUPPORTED) c_->rec_failed = 1;
        return st;
    }
    return ks_cuda_topk_skip(c_->stream, &sc_, x, rows, n, k, base, order, oi, ov, skip);
}
static ks_status pr_argsort(ks_backend *b, const float *x, int64_t n, int desc, int32_t *oi) {
    PRIM_CTX(b);
    return ks_cuda_argsort(c_->stream, &sc_, x, n, desc, oi);
}
static ks_status pr_sort_f32(ks_backend *b, const float *x, int64_t n, int desc, float *out) {
    PRIM_CTX(b);
    return ks_cuda_sort_f32(c_->stream, &sc_, x, n, desc, out);
}
static ks_status pr_sort_i32(ks_backend *b, const int32_t *x, int64_t n, int32_t *out) {
    PRIM_CTX(b);
    return ks_cuda_sort_i32(c_->stream, &sc_, x, n, out);
}
static ks_status pr_rank(ks_backend *b, const float *x, int64_t n, int32_t *out) {
    PRIM_CTX(b);
    return ks_cuda_rank(c_->stream, &sc_, x, n, out);
}
static ks_status pr_unique(ks_backend *b, const int32_t *x, int64_t n, int32_t *out, int64_t *n_out) {
    PRIM_CTX(b);
    return ks_cuda_unique(c_->stream, &sc_, x, n, out, n_out);
}
static ks_status pr_union(ks_backend *b, const int32_t *a, int64_t na, const int32_t *bb, int64_t nb, int32_t *out,
                          int64_t *n_out) {
    PRIM_CTX(b);
    return ks_cuda_union(c_->stream, &sc_, a, na, bb, nb, out, n_out);
}
static ks_status pr_concat_i32(ks_backend *b, const int32_t *a, int64_t na, const int32_t *bb, int64_t nb, int32_t *out) {
    return ks_cuda_concat_i32(CTX(b)->stream, a, na, bb, nb, out);
}
static ks_status pr_concat_f32(ks_backend *b, const float *a, int64_t na, const float *bb, int64_t nb, float *out) {
    return ks_cuda_concat_f32(CTX(b)->stream, a, na, bb, nb, out);
}
static ks_status pr_arange(ks_backend *b, int64_t start, int64_t stop, int64_t step, int32_t *out) {
    return ks_cuda_arange(CTX(b)->stream, start, stop, step, out);
}
static ks_status pr_gather(ks_backend *b, const float *x, int64_t n, int64_t d, const int32_t *idx, int64_t k, float *out,
                           int64_t *err) {
    return ks_cuda_gather(CTX(b)->stream, x, n, d, idx, k, out, err);
}
static ks_status pr_gather_i32(ks_backend *b, const int32_t *x, int64_t n, const int32_t *idx, int64_t k, int32_t *out,
                               int64_t *err) {
    return ks_cuda_gather_i32(CTX(b)->stream, x, n, idx, k, out, err);
}
static ks_status pr_softmax(ks_backend *b, const float *x, int64_t rows, int64_t n, float *out) {
    return ks_cuda_softmax(CTX(b)->stream, x, rows, n, out);
}
static ks_status pr_sum(ks_backend *b, const float *x, int64_t rows, int64_t cols, int axis, float *out) {
    return ks_cuda_sum(CTX(b)->stream, x, rows, cols, axis, out);
}
static ks_status pr_mean(ks_backend *b, const float *x, int64_t rows, int64_t cols, int axis, float *out) {
    return ks_cuda_mean(CTX(b)->stream, x, rows, cols, axis, out);
}
static ks_status pr_var(ks_backend *b, const float *x, int64_t rows, int64_t cols, int axis, int64_t ddof, float *out) {
    return ks_cuda_var(CTX(b)->stream, x, rows, cols, axis, ddof, out);
}
static ks_status pr_cosine(ks_backend *b, const float *a, const float *bb, int64_t n, float *out) {
    return ks_cuda_cosine(CTX(b)->stream, a, bb, n, out);
}
static ks_status pr_cosine_rows(ks_backend *b, const float *a, const float *bb, int64_t rows, int64_t d, float *out) {
    return ks_cuda_cosine_rows(CTX(b)->stream, a, bb, rows, d, out);
}
static ks_status pr_page_reduce(ks_backend *b, const void *x, int bf16, int64_t n, int64_t h, int64_t d, int64_t rs,
                                int64_t hs, int64_t page, int64_t p0, int64_t p1, float *mn, float *mx, float *me,
                                uint32_t *box) {
    if (box) {
        if (mn || mx || me) return ks_errorf(KS_ERR_ARG, "page_reduce: boxes are asked for alone");
        return ks_cuda_page_box(CTX(b)->stream, x, bf16, n, h, d, rs, hs, page, p0, p1, box);
    }
    return ks_cuda_page_reduce(CTX(b)->stream, x, bf16, n, h, d, rs, hs, page, p0, p1, mn, mx, me);
}
static ks_status pr_bound_scores(ks_backend *b, const float *q, int64_t hq, const float *lo, const float *hi,
                                 const uint32_t *box, int64_t n, int64_t hkv, int64_t d, ks_bound_reduce red, float *out) {
    if (box) {
        if (lo || hi) return ks_errorf(KS_ERR_ARG, "bound_scores: boxes come as lo / hi or packed, not both");
        return ks_cuda_bound_scores_box(CTX(b)->stream, q, hq, box, n, hkv, d, red, out);
    }
    return ks_cuda_bound_scores(CTX(b)->stream, q, hq, lo, hi, n, hkv, d, red, out);
}
static ks_status pr_page_rows(ks_backend *b, const int32_t *pages, int64_t lists, int64_t k, int64_t page, int64_t n,
                              int64_t bb, int64_t be, int64_t ab, int64_t ae, int32_t *out, int64_t *err) {
    return ks_cuda_page_rows(CTX(b)->stream, pages, lists, k, page, n, bb, be, ab, ae, out, err);
}
static ks_status pr_ge(ks_backend *b, const float *x, int64_t n, double thr, float *out) {
    return ks_cuda_ge(CTX(b)->stream, x, n, thr, out);
}
static ks_status pr_where(ks_backend *b, const float *mask, int64_t nm, const void *a, const void *bb, int64_t n, void *out) {
    return ks_cuda_where(CTX(b)->stream, mask, nm, a, bb, n, out);
}
static const ks_backend_prims cuda_prims = {
    pr_scores, pr_pool1d, pr_topk, pr_argsort, pr_sort_f32, pr_sort_i32, pr_rank, pr_unique, pr_union,
    pr_concat_i32, pr_concat_f32, pr_arange, pr_gather, pr_gather_i32, pr_softmax, pr_sum, pr_mean, pr_var,
    pr_cosine, pr_cosine_rows,
    pr_page_reduce, pr_bound_scores, pr_page_rows, pr_ge, pr_where,
};
#endif

void cuda_prims_install(ks_backend *b) {
#ifdef KS_BACKEND_PRIMS
    b->prims = &cuda_prims;
#endif
}
