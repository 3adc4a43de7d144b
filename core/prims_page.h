/* prims_page.h — page primitives: CPU reference implementations (float32).
 *
 * Rows of a KV cache split into pages of `page` consecutive rows, for policies that choose
 * pages rather than single rows (Quest, Tang et al. 2024, policies/quest.lua; any block-sparse
 * selection). Three calls, none of them specific to one policy:
 *
 *   ks_cpu_page_reduce   per page and channel, the min / max / mean of its rows: the page
 *                        summaries (a range of pages only, so summaries of a growing cache can
 *                        be extended without reading old pages again)
 *   ks_cpu_page_box      the same min / max as one packed 32-bit word a channel: two bf16 ends
 *                        rounded outward (half the bytes of two floats; exact for bf16 rows)
 *   ks_cpu_bound_scores  for a query and per-page boxes [lo, hi], the upper bound of q.k over
 *                        the box, sum_i max(q_i lo_i, q_i hi_i), reduced over a GQA group
 *                        (ks_cpu_bound_scores_box: the same over packed boxes)
 *   ks_cpu_page_rows     page ids -> the row ids of those pages, with fixed row ranges before
 *                        and after, ascending: an index list for ev:attend / ev:retain
 *
 * Conventions: those of core/prims.h (row-major, int64 sizes, int32 indices, caller-owned
 * outputs, KS_ERR_ARG with a message naming the primitive and the value, nothing aborts, a
 * pointer may be NULL when its count is 0). Pages: page p holds rows [p*page, min((p+1)*page, n)),
 * so there are ceil(n / page) pages and the last one may be partial. Every result below is
 * defined to the bit (min / max are exact; sums are in double in a fixed order), so a device
 * implementation gives the same bits (kernels/prim_page.cu does).
 * The CUDA twins are declared in kernels/ks_cuda_page.h (kernels/prim_page.cu), and the backend
 * table entries (core/backend.h, ks_backend_prims: page_reduce, bound_scores, page_rows) mean
 * exactly these functions.
 */
#ifndef KS_PRIMS_PAGE_H
#define KS_PRIMS_PAGE_H

#include "kvsieve.h"
#include <stdint.h>

/* The number of pages of n rows: ceil(n / page) (0 for n <= 0 or page <= 0). */
int64_t ks_page_count(int64_t n, int64_t page);

/* Page summaries of rows x of n rows, h heads, d channels:
 *   x        // (n, h, d) element (r, j, c) at x[r * row_stride + j * head_stride + c];
 *            //   x_bf16 = 0: float, 1: bf16 (uint16) elements (a bf16 KV cache); strides in
 *            //   elements, >= 0 (a KV cache (h, capacity, d) read token-major: row_stride d,
 *            //   head_stride capacity * d)
 *   pages    [p0, p1), 0 <= p0 <= p1 <= ks_page_count(n, page)
 *   out_min, out_max, out_mean  // (p1 - p0, h, d) contiguous, each optional (NULL = not
 *            //   wanted; at least one); out[p - p0, j, c] over the rows of page p
 * min / max: exact, rows in ascending order, a NaN row value makes the result NaN, -0.0 and +0.0
 * are equal (the first seen stays). mean: sum in double in ascending row order, divided by the
 * page's row count, rounded once. O((p1 - p0) * page * h * d) time, no extra memory.
 * Errors: KS_ERR_ARG for n, h or d < 0, page < 1, a bad page range, negative strides, x_bf16
 * not 0 or 1, no output, x NULL with rows to read. */
ks_status ks_cpu_page_reduce(const void *x, int x_bf16, int64_t n, int64_t h, int64_t d, int64_t row_stride,
                             int64_t head_stride, int64_t page, int64_t p0, int64_t p1, float *out_min, float *out_max,
                             float *out_mean);

/* Packed boxes: page_reduce's min and max of each (page, head, channel) as one uint32,
 *   box = bf16_down(min) | bf16_up(max) << 16
 * bf16_down / bf16_up (ks_bf16_dir): the nearest bf16 at or below / at or above the float, so
 * the packed box contains the float one and bounds computed from it are still upper bounds. For
 * rows that are bf16 already (the CUDA KV cache) min and max are bf16 values and the box is
 * exact: bound_scores over it gives the same bits as over the float min / max. A NaN end stays
 * NaN. Quest's summaries at 128K (8191 pages x 8 heads x 128) are 33.5 MB a layer this way
 * against 67 MB as two float arrays, and bound_scores reads them once a step.
 *   out_box  // (p1 - p0, h, d) contiguous
 * Errors: those of ks_cpu_page_reduce (out_box NULL: "no output"). */
uint16_t ks_bf16_dir(float f, int down);
ks_status ks_cpu_page_box(const void *x, int x_bf16, int64_t n, int64_t h, int64_t d, int64_t row_stride,
                          int64_t head_stride, int64_t page, int64_t p0, int64_t p1, uint32_t *out_box);
ks_status ks_page_box_check_args(const void *x, int x_bf16, int64_t n, int64_t h, int64_t d, int64_t row_stride,
                                 int64_t head_stride, int64_t page, int64_t p0, int64_t p1, const uint32_t *out_box);

#define KS_BOUND_PARTS 32 /* partial sums of a bound (ks_cpu_bound_scores) */

typedef enum ks_bound_reduce {
    KS_BOUND_NONE = 0,      /* out (n_q_heads, n): one row per query head */
    KS_BOUND_GROUP_MAX = 1, /* out (n_kv_heads, n): row r = max over the query heads of KV head r */
    KS_BOUND_GROUP_SUM = 2, /* out (n_kv_heads, n): row r = sum over the query heads of KV head r */
} ks_bound_reduce;

/* Upper bounds of q.k over boxes: for query head h, its KV head kv(h) = h / (n_q_heads /
 * n_kv_heads) (the model's GQA mapping) and box j,
 *   s[h, j] = sum_{i < d} max(q[h, i] * lo[j, kv(h), i], q[h, i] * hi[j, kv(h), i])
 * which is >= q[h] . k for every k with lo <= k <= hi elementwise (Quest's criticality bound).
 *   q      // (n_q_heads, d)
 *   lo, hi // (n, n_kv_heads, d) contiguous (ks_cpu_page_reduce's out_min / out_max)
 *   out    // (n_q_heads, n) or (n_kv_heads, n) by `reduce`; fully overwritten
 * Each product is exact in double; the sum runs in double in a fixed order that 32 lanes of a
 * GPU warp keep (KS_BOUND_PARTS): term i goes to partial (i / 4) % 32, each partial adds its
 * terms with i ascending, then the partials are halved, p[l] += p[l + o] for o = 16, 8, 4, 2, 1
 * (l < o), and p[0] is rounded once to float; GROUP_MAX takes the max of those floats, GROUP_SUM sums the double sums over the
 * group's heads ascending and rounds once. A NaN product (0 * inf) or input makes its sum NaN,
 * and GROUP_MAX propagates NaN. O(n_q_heads * n * d) time, no extra memory.
 * Errors: KS_ERR_ARG for n_q_heads or n_kv_heads < 1, n_q_heads % n_kv_heads != 0, d < 1,
 * n < 0, an unknown reduce. */
ks_status ks_cpu_bound_scores(const float *q, int64_t n_q_heads, const float *lo, const float *hi, int64_t n,
                              int64_t n_kv_heads, int64_t d, ks_bound_reduce reduce, float *out);

/* ks_cpu_bound_scores over packed boxes (ks_cpu_page_box): box (n, n_kv_heads, d) uint32, the
 * ends unpacked exactly (a bf16 is the high half of a float) and summed in the same order, so
 * a packed box gives the bits its unpacked float ends give. */
ks_status ks_cpu_bound_scores_box(const float *q, int64_t n_q_heads, const uint32_t *box, int64_t n,
                                  int64_t n_kv_heads, int64_t d, ks_bound_reduce reduce, float *out);

/* The rows of pages, as index lists: for each of `lists` lists of k page ids,
 *   pages // (lists, k)   each list strictly ascending; page p covers rows [p*page, (p+1)*page)
 *   out   // (lists, w), w = (before_end - before_begin) + k * page + (after_end - after_begin):
 *         //   rows [before_begin, before_end), then each page's rows in list order, then rows
 *         //   [after_begin, after_end)
 * Every list is strictly ascending and inside [0, n) by construction, which the checks below
 * guarantee: 0 <= before_begin <= before_end <= (first page) * page, every page whole and
 * below the next, (last page + 1) * page <= after_begin <= after_end <= n (empty ranges
 * impose nothing), and n <= INT32_MAX + 1.
 * Errors: KS_ERR_ARG for negative sizes, page < 1, a range that is not 0 <= begin <= end <= n, and
 * for the first bad entry in list order: "page_rows: page 9 at (list 1, position 2) ..." (out
 * of range, not ascending, or overlapping a range), with out undefined. */
ks_status ks_cpu_page_rows(const int32_t *pages, int64_t lists, int64_t k, int64_t page, int64_t n,
                           int64_t before_begin, int64_t before_end, int64_t after_begin, int64_t after_end,
                           int32_t *out);

/* Validation shared by ks_cpu_page_rows and its device twin (no data read): the sizes and
 * ranges above; the width w on success. */
ks_status ks_page_rows_check_args(int64_t lists, int64_t k, int64_t page, int64_t n, int64_t before_begin,
                                  int64_t before_end, int64_t after_begin, int64_t after_end, int64_t *w);
/* The same for ks_cpu_page_reduce / ks_cpu_bound_scores (a device twin checks with these). */
ks_status ks_page_reduce_check_args(const void *x, int x_bf16, int64_t n, int64_t h, int64_t d, int64_t row_stride,
                                    int64_t head_stride, int64_t page, int64_t p0, int64_t p1, const float *out_min,
                                    const float *out_max, const float *out_mean);
ks_status ks_bound_scores_check_args(int64_t n_q_heads, int64_t n, int64_t n_kv_heads, int64_t d, ks_bound_reduce reduce);

/* The CPU backend's table entries (core/cpu_prims.c: ks_backend_prims.page_reduce, bound_scores,
 * page_rows): the functions above with the table's backend argument (unused). page_reduce with
 * out_box (and no other output) is ks_cpu_page_box; bound_scores with box (lo, hi NULL) is
 * ks_cpu_bound_scores_box. page_rows with an
 * error word follows the tables' convention (gather's): a bad entry puts its lowest flat position
 * in *err (the caller set it to -1) and the call succeeds; err NULL: the message above. */
struct ks_backend;
ks_status ks_cpu_page_reduce_entry(struct ks_backend *b, const void *x, int x_bf16, int64_t n, int64_t h, int64_t d,
                                   int64_t row_stride, int64_t head_stride, int64_t page, int64_t p0, int64_t p1,
                                   float *out_min, float *out_max, float *out_mean, uint32_t *out_box);
ks_status ks_cpu_bound_scores_entry(struct ks_backend *b, const float *q, int64_t n_q_heads, const float *lo,
                                    const float *hi, const uint32_t *box, int64_t n, int64_t n_kv_heads, int64_t d,
                                    ks_bound_reduce reduce, float *out);
ks_status ks_cpu_page_rows_entry(struct ks_backend *b, const int32_t *pages, int64_t lists, int64_t k, int64_t page,
                                 int64_t n, int64_t before_begin, int64_t before_end, int64_t after_begin,
                                 int64_t after_end, int32_t *out, int64_t *err);

#endif /* KS_PRIMS_PAGE_H */
