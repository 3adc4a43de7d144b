/* prims.h — the policy primitives: CPU reference implementations (float32).
 *
 * These are the native operations a pruning policy composes (DESIGN.md, "Native primitives"):
 * attention scores without an n x n matrix, 1-D pooling, top-k, sorting, set operations on
 * index lists, gathers and small reductions. They are the reference the CUDA kernels are
 * checked against and what the Lua binding exposes; the meaning of every call below is the
 * same on every backend.
 *
 * Conventions (all functions)
 *   - Arrays are row-major and contiguous unless a stride says otherwise; shapes are given in
 *     comments as `// (rows, cols)`. Sizes are int64_t; index lists and positions are int32_t,
 *     so anything that produces or consumes indices needs n <= INT32_MAX.
 *   - Caller-owned outputs: the caller allocates every output with the size documented.
 *     Whether an output may alias an input is stated per function; otherwise it may not.
 *   - Errors: invalid arguments (negative sizes, k > n, NULL where data is needed, unknown
 *     enum values, bad index lists) return KS_ERR_ARG with a message that names the
 *     primitive and the bad value ("topk: k = 7 > n = 5"); a failed temporary allocation
 *     returns KS_ERR_OOM. Nothing aborts. A pointer may be NULL when its element count is 0.
 *   - Float order (topk, argsort, sort, rank): ascending order is -inf < ... < +inf, with
 *     every NaN below -inf (NaNs compare equal to each other) and -0.0 == +0.0. Equal values
 *     keep index order: ties always go to the lower index, so results are deterministic and
 *     identical across backends. A NaN score therefore never wins a top-k slot over a number.
 *   - Reductions accumulate in double and round once to float.
 *   - No primitive keeps state or global buffers; all are thread-safe. Only ks_cpu_scores
 *     starts threads (see ks_scores_opts.n_threads); its result does not depend on them.
 */
#ifndef KS_PRIMS_H
#define KS_PRIMS_H

#include "kvsieve.h"
#include <stdint.h>

/* "Up to n": as the end of a range in ks_scores_opts, stands for the key count n. */
#define KS_END (-1)

/* ================================================================ attention scores */

typedef enum ks_scale_mode {
    KS_SCALE_RSQRT_D = 0, /* logits = q.k / sqrt(d)   (SnapKV, FastKV, ASL) */
    KS_SCALE_ONE = 1,     /* logits = q.k             (GemFilter, TokenSelect) */
    KS_SCALE_CUSTOM = 2,  /* logits = q.k * opts.scale */
} ks_scale_mode;

typedef enum ks_head_reduce {
    KS_HEADS_NONE = 0,      /* out (n_q_heads, n_out): one row per query head */
    KS_HEADS_GROUP_SUM = 1, /* out (n_kv_heads, n_out): row r = sum of the query heads mapped to KV head r */
    KS_HEADS_SUM = 2,       /* out (n_out): sum over all query heads */
    KS_HEADS_MEAN = 3,      /* out (n_out): KS_HEADS_SUM / n_q_heads */
} ks_head_reduce;

typedef enum ks_gqa_map {
    KS_GQA_DIV = 0, /* query head h reads KV head h / g, g = n_q_heads / n_kv_heads (the model's mapping) */
    KS_GQA_MOD = 1, /* query head h reads KV head h % n_kv_heads (TokenSelect's released kernel; reproduction only) */
} ks_gqa_map;

/* Options of ks_cpu_scores. Start from ks_scores_opts_default() and change fields; a NULL
 * options pointer means the defaults. */
typedef struct ks_scores_opts {
    ks_scale_mode scale_mode;   /* default KS_SCALE_RSQRT_D */
    float scale;                /* the factor for KS_SCALE_CUSTOM (finite); ignored otherwise */
    int causal;                 /* default 0. 1: key j is visible to query i iff kpos[j] <= qpos[i] */
    int softmax;                /* default 0 (raw scaled logits). 1: probabilities, see below */
    int64_t k_begin, k_end;     /* the key domain [k_begin, k_end), default [0, KS_END = n): keys
                                 * outside it are masked, exactly like causally hidden keys, and the
                                 * softmax normalises over the visible keys of this domain only */
    int64_t out_begin, out_end; /* the key columns reported [out_begin, out_end), default [0, n);
                                 * n_out = out_end - out_begin. Independent of the domain: a column
                                 * outside the domain reports 0. Slicing here does NOT renormalise */
    ks_head_reduce heads;       /* default KS_HEADS_NONE */
    ks_gqa_map gqa;             /* default KS_GQA_DIV */
    int64_t q_head_stride, q_row_stride; /* in floats; 0 = contiguous (m*d, d). A token-major
                                          * (m, n_q_heads, d) buffer: (d, n_q_heads*d) */
    int64_t k_head_stride, k_row_stride; /* in floats; 0 = contiguous (n*d, d). A KV cache
                                          * (n_kv_heads, capacity, d): (capacity*d, d) */
    int n_threads;              /* default 0 = automatic (online CPUs, 1 for small problems);
                                 * 1 = the calling thread only. Capped at 16 and at n_q_heads
                                 * (work is split by query head) */
    const float *q_rope_inv;    /* default NULL: the queries as given. Else (d / 2) floats in HOST
                                 * memory: every query row is first rotated at position q_rope_pos,
                                 * rotate-half pairs (k, k + d/2) by the float32 angle q_rope_pos *
                                 * q_rope_inv[k], cos and sin times q_rope_af, each product rounded
                                 * (the rotation of the engine and of ks.rope; ks_rope_inv_freq gives
                                 * a model's table). d must be even, <= 1024. On a GPU the rotation happens
                                 * where the queries are read: one launch, not a copy and a rope */
    float q_rope_af;            /* the cos / sin factor with q_rope_inv (1 but for longrope) */
    int32_t q_rope_pos;         /* >= 0 */
    double deadline;            /* default 0 = none. > 0: a ks_now() time; the host scores
                                 * check it between tiles of query rows and, once it has passed,
                                 * stop with KS_ERR_INTERRUPTED (out is then undefined). A policy's
                                 * _seconds budget reaches a long call this way */
    const float *skip;          /* default NULL. Else one float in the memory of the backend that
                                 * runs the call (host memory here): when it is nonzero the call
                                 * reads no query or key and out is all zeros. A branch on a
                                 * decision the device made (ks_cpu_ge) without the host reading
                                 * it: TokenSelect's selection cache skips its scores on a hit and
                                 * keeps its list with ks_cpu_where. The arguments are checked
                                 * either way */
    int64_t grow;               /* default 0. > 0 on a backend recording a decode handler (backend.h
                                 * graph_begin_handler; ignored elsewhere: a call that runs now
                                 * has grown by 0): n, k_end and out_end (so the output's columns,
                                 * laid out (rows, n_out + delta)) follow the layer's rows, each
                                 * the recorded value + delta at a replay, delta <= grow the rows
                                 * the step slot says were added since the recording */
} ks_scores_opts;

ks_scores_opts ks_scores_opts_default(void);

/* The output shape of ks_cpu_scores for these options: out is (*rows, *cols) floats, with
 * *rows = n_q_heads (NONE), n_kv_heads (GROUP_SUM) or 1 (SUM, MEAN) and *cols = n_out.
 * Validates the options like ks_cpu_scores does. */
ks_status ks_scores_out_shape(const ks_scores_opts *opts, int64_t n_q_heads, int64_t n_kv_heads, int64_t n,
                              int64_t *rows, int64_t *cols);

/* Attention scores of m chosen query rows against n keys, reduced over the query rows and
 * (optionally) over heads, without materialising any (m, n) or (n, n) matrix.
 *
 *   q     // (n_q_heads, m, d)   queries, strides in opts
 *   qpos  // (m)   absolute position of each query row; only read when opts->causal.
 *         //       NULL: the queries are the last m rows of the key sequence,
 *         //       qpos[i] = kpos[n - m + i] (or n - m + i without kpos); then m <= n is required
 *   k     // (n_kv_heads, n, d)  keys, strides in opts
 *   kpos  // (n)   position of each key row; NULL: kpos[j] = j. Shared by all KV heads
 *   out   // (rows, n_out)       see ks_scores_out_shape; fully overwritten
 *
 * For each query head h, with its KV head kv(h) (opts->gqa), and each query row i:
 *   l[j]     = scale * dot(q[h, i, :], k[kv(h), j, :])           for j in the domain
 *   V(i)     = { j in [k_begin, k_end) : !causal || kpos[j] <= qpos[i] }   (visible keys)
 *   s[h,i,j] = softmax ? exp(l[j] - max_V l) / sum_{j' in V} exp(l[j'] - max_V l)   (j in V)
 *            :           l[j]                                                        (j in V)
 *            : 0                                                                     (j not in V)
 *   r[h, j]  = sum_i s[h, i, j]                       (always summed over the query rows)
 * then out[., c] = (head reduction of r)[., out_begin + c]. Masked entries add 0 (raw logits
 * too). A query row that sees no key of the domain adds 0 everywhere (no NaN). The softmax
 * is fp32 with max subtraction and a double denominator; the window sum is accumulated in
 * double and rounded per head, the head reduction is done in double in ascending head order,
 * so the result is bit-identical for any n_threads. Cost O(n_q_heads * m * |domain| * d) time;
 * extra memory per thread O(min(m, 8) * |domain| + n_out), plus (n_q_heads, n_out) floats
 * when heads are reduced. NaN/inf in q or k propagate.
 *
 * The policies (POLICIES.md), with n keys and the last query rows of the prompt:
 *   GemFilter   q = last token (H, 1, d); scale_mode ONE, softmax 0, causal 0, heads SUM
 *               -> (n) raw logits summed over all heads.
 *   SnapKV      q = last w queries (H, w, d); RSQRT_D, softmax 1, causal 1 (qpos NULL: the
 *               window's own positions), domain [0, n) = ALL keys (the reference normalises
 *               over prefix + window), out [0, n - w) = the prefix slice of those
 *               probabilities (not renormalised), heads GROUP_SUM -> (Hkv, n - w);
 *               its `per_query_head` option: heads NONE -> (H, n - w).
 *   FastKV      SnapKV with w = 8 and GROUP_SUM per layer; the TSP layer pools each row and
 *               then sums the rows (ks_cpu_sum axis 0): max pooling does not commute with
 *               the head sum, so heads SUM would be wrong there.
 *   ASL         SnapKV with w = 32, then avg pool and a sum over all heads (avg pooling is
 *               linear: heads SUM then pool == pool then sum, up to rounding).
 *   TokenSelect q = fingerprint (H, 1, d) (ks_cpu_mean axis 0 of the chunk's token-major
 *               (c, H*d) queries, then RoPE); ONE, softmax 1, causal 0, domain = out =
 *               [n_init, N - n_local) (softmax over the candidates only), heads SUM;
 *               gqa MOD reproduces the released kernel.
 * Errors: KS_ERR_ARG for n_q_heads or n_kv_heads < 1, n_q_heads % n_kv_heads != 0, d < 1,
 * m or n < 0, a range without 0 <= begin <= end <= n (KS_END = n), negative strides or n_threads,
 * a non-finite custom scale, causal with qpos NULL and m > n; KS_ERR_OOM. */
/* Rotary embedding of m rows of H heads (rotate-half pairs (k, k + d/2)), row i at position
 * pos[i] (pos NULL: every row at `one`): float32 angle pos * inv[k], c = cosf * af, s = sinf * af,
 * y0 = x0 c - x1 s, y1 = x1 c + x0 s, each product rounded (the engine's CPU rotation, ks.rope's
 * and ks_scores_opts.q_rope_inv's). Element (h, i, j) is x[h * xhs + i * xrs + j] and
 * out[h * ohs + i * ors + j]; out may be x itself (same strides), else must not overlap it. d even and
 * <= 1024, inv (d / 2). */
void ks_rope_rows_f32(float *out, int64_t ohs, int64_t ors, const float *x, int64_t xhs, int64_t xrs, int64_t H, int64_t m,
                      int64_t d, const int32_t *pos, int32_t one, const float *inv, float af);

ks_status ks_cpu_scores(const float *q, const int32_t *qpos, int64_t n_q_heads, int64_t m,
                        const float *k, const int32_t *kpos, int64_t n_kv_heads, int64_t n, int64_t d,
                        const ks_scores_opts *opts, float *out);

/* ================================================================ pooling */

typedef enum ks_pool_mode {
    KS_POOL_AVG = 0, /* torch avg_pool1d(count_include_pad=True): padding counts as 0, divide by kernel */
    KS_POOL_MAX = 1, /* torch max_pool1d: padding is -inf, i.e. ignored */
} ks_pool_mode;

/* 1-D pooling of each row, stride 1, padding kernel/2 on both sides, output length n:
 *   x   // (rows, n)
 *   out // (rows, n)   may alias x (in-place pooling is allowed)
 * out[r, i] = reduce(x[r, i - kernel/2 .. i + kernel/2]) with out-of-range taps being the
 * padding value; AVG divides by kernel at the edges too (an edge token of kernel 5 is
 * divided by 5), MAX ignores the padding. kernel may exceed n. Only odd kernels are
 * accepted: with padding kernel/2 an even kernel yields n + 1 outputs in torch (there is no
 * centred window), so it is refused rather than given an invented meaning. kernel 1 copies.
 * NaN propagates to every window containing it (both modes, as in torch).
 * O(rows * n) time whatever the kernel (block prefix/suffix scans), O(n + kernel) memory.
 * Errors: KS_ERR_ARG for rows or n < 0, kernel < 1 or even, an unknown mode. */
ks_status ks_cpu_pool1d(const float *x, int64_t rows, int64_t n, int64_t kernel, ks_pool_mode mode, float *out);

/* ================================================================ top-k and ordering */

typedef enum ks_topk_order {
    KS_TOPK_BY_VALUE = 0, /* descending value, ties by ascending index (the selection order) */
    KS_TOPK_BY_INDEX = 1, /* the same set, indices ascending (what retain/restart/attend want) */
} ks_topk_order;

/* The k largest entries of each row, ties broken towards the lower index:
 *   x       // (rows, n)
 *   out_idx // (rows, k)   column indices within the row, plus base (base >= 0, base + n - 1 an
 *                          int32: the rows of a slice of keys that starts at row base, with no
 *                          second pass to shift them)
 *   out_val // (rows, k)   the values x[r, out_idx[r, t] - base], or NULL if not wanted
 * The selected set is exactly the first k of the stable descending order (float order in
 * the header comment: NaN below -inf, so NaNs are taken last). k = n returns every index;
 * k = 0 writes nothing. O(rows * (n + k)) time: a radix select on the order-preserving 32-bit
 * key (2 passes of 16 bits for n >= 65536, else 4 of 8 bits), one collecting pass, then a
 * stable radix sort of the k winners; O(k) extra memory plus a 256 KiB histogram.
 * Errors: KS_ERR_ARG for rows < 0, n < 0 or n > INT32_MAX, k < 0, k > n, base < 0 or base + n
 * past the int32 range, unknown order. */
ks_status ks_cpu_topk(const float *x, int64_t rows, int64_t n, int64_t k, int64_t base, ks_topk_order order,
                      int32_t *out_idx, float *out_val);
/* ks_cpu_topk under a mask (a device decision's branch, ks_cpu_ge): skip NULL or *skip == 0 is
 * ks_cpu_topk; *skip != 0 (NaN included) gives the top k of rows of zeros without reading x:
 * every row base, base + 1, ..., base + k - 1 (a valid ascending list) and values 0. The
 * arguments are checked either way. */
ks_status ks_cpu_topk_masked(const float *skip, const float *x, int64_t rows, int64_t n, int64_t k, int64_t base,
                             ks_topk_order order, int32_t *out_idx, float *out_val);

/* Stable argsort: out_idx // (n) a permutation of 0..n-1 that orders x ascending (descending = 0)
 * or descending (descending = 1); equal values keep ascending index order in both directions.
 * O(n) time (LSD radix), O(n) memory. Errors: n < 0 or n > INT32_MAX. */
ks_status ks_cpu_argsort(const float *x, int64_t n, int descending, int32_t *out_idx);

/* Sorted copy of floats: out // (n) = x[argsort(x, descending)], values bit-exact (NaNs first
 * when ascending, last when descending). out may alias x. */
ks_status ks_cpu_sort_f32(const float *x, int64_t n, int descending, float *out);

/* Ascending sort of int32 (index lists): out // (n); out may alias x. O(n) time and memory. */
ks_status ks_cpu_sort_i32(const int32_t *x, int64_t n, int32_t *out);

/* Ranks, 1 = highest: out_rank // (n), out_rank[j] = 1 + position of j in the stable
 * descending order, so ties give the lower index the better (smaller) rank and the ranks
 * are a permutation of 1..n. Errors: n < 0 or n > INT32_MAX. */
ks_status ks_cpu_rank(const float *x, int64_t n, int32_t *out_rank);

/* ================================================================ index lists */

/* Sorted unique values of x // (n): out // (n) (capacity) receives *n_out <= n values,
 * strictly ascending. out may alias x. */
ks_status ks_cpu_unique(const int32_t *x, int64_t n, int32_t *out, int64_t *n_out);

/* Union of two strictly ascending lists a // (na) and b // (nb): out // (na + nb) (capacity)
 * receives *n_out values, strictly ascending. out must not overlap a or b.
 * Errors: KS_ERR_ARG when an input is not strictly ascending (unsorted or duplicated). */
ks_status ks_cpu_union(const int32_t *a, int64_t na, const int32_t *b, int64_t nb, int32_t *out, int64_t *n_out);

/* out // (na + nb) = a followed by b. out may alias a (appending b in place). */
ks_status ks_cpu_concat_i32(const int32_t *a, int64_t na, const int32_t *b, int64_t nb, int32_t *out);
ks_status ks_cpu_concat_f32(const float *a, int64_t na, const float *b, int64_t nb, float *out);

/* The number of values of arange(start, stop, step) (Python's range): ceil((stop - start) / step)
 * clamped at 0; -1 when step == 0. */
int64_t ks_arange_len(int64_t start, int64_t stop, int64_t step);
/* out // (ks_arange_len(...)) = start, start + step, ... (excluding stop).
 * Errors: step == 0, a value outside int32. */
ks_status ks_cpu_arange(int64_t start, int64_t stop, int64_t step, int32_t *out);

/* Row gather: out // (k, d) = x // (n, d) [idx // (k)]. Indices may repeat and need not be
 * sorted. out must not overlap x. Errors: KS_ERR_ARG for an index outside [0, n)
 * ("gather: index 17 at position 3 out of range [0, 12)"), negative sizes. */
ks_status ks_cpu_gather(const float *x, int64_t n, int64_t d, const int32_t *idx, int64_t k, float *out);
/* The same for a 1-D int32 array (token ids, positions): out // (k) = x // (n) [idx]. */
ks_status ks_cpu_gather_i32(const int32_t *x, int64_t n, const int32_t *idx, int64_t k, int32_t *out);

/* Validate an index list that an action (retain, propagate, restart, attend) hands to the
 * engine: idx // (k) must lie in [0, n), hold no duplicate and, with require_sorted, be
 * strictly ascending. `what` (e.g. "retain"; NULL -> "indices") prefixes the message:
 *   "retain: 20 indices for 12 rows"   "retain: index 17 at position 3 out of range [0, 12)"
 *   "retain: duplicate index 5 (positions 1 and 4)"   "retain: index 7 at position 4 follows 9 (not ascending)"
 * O(k) time; without require_sorted, O(n) bits of scratch. Returns KS_OK, KS_ERR_ARG, KS_ERR_OOM. */
ks_status ks_check_indices(const int32_t *idx, int64_t k, int64_t n, int require_sorted, const char *what);

/* ================================================================ small numerics */

/* Row softmax: out // (rows, n) = softmax(x // (rows, n)) per row, max-subtracted, double
 * denominator. out may alias x. -inf entries get 0; a row that is entirely -inf gives all
 * zeros (not NaN); a NaN in a row makes that row NaN. */
ks_status ks_cpu_softmax(const float *x, int64_t rows, int64_t n, float *out);

/* Sum / mean over one axis of x // (rows, cols):
 *   axis 0 -> out // (cols), reducing the rows;   axis 1 -> out // (rows), reducing the columns.
 * The sum of an empty axis is 0; the mean of an empty axis is an error (KS_ERR_ARG). */
ks_status ks_cpu_sum(const float *x, int64_t rows, int64_t cols, int axis, float *out);
ks_status ks_cpu_mean(const float *x, int64_t rows, int64_t cols, int axis, float *out);

/* Variance over one axis (same axes as ks_cpu_sum): sum((x - mean)^2) / (count - ddof),
 * two-pass in double. ddof = 0 is the population variance (numpy's default; what ASL uses),
 * ddof = 1 the sample variance (torch.var's default). Errors: ddof < 0, count - ddof <= 0. */
ks_status ks_cpu_var(const float *x, int64_t rows, int64_t cols, int axis, int64_t ddof, float *out);

/* Cosine similarity of a // (n) and b // (n): *out = a.b / (|a| |b|), in double; 0 when either
 * vector is all zeros (torch's eps clamp gives the same). n = 0 -> 0. */
ks_status ks_cpu_cosine(const float *a, const float *b, int64_t n, float *out);
/* Rowwise: out // (rows) = cosine(a[r, :], b[r, :]) for a, b // (rows, d). */
ks_status ks_cpu_cosine_rows(const float *a, const float *b, int64_t rows, int64_t d, float *out);

/* ================================================================ masks: decisions that stay on the device
 *
 * A mask is floats of 0 and 1. A policy that branches on a value it computed on a GPU makes the
 * decision there (ks_cpu_ge), lets a costly primitive skip its work under it
 * (ks_scores_opts.skip) and picks between two results by it (ks_cpu_where): no value goes to
 * the host, so the step never waits. */

/* out // (n) = 1 where (double)x[i] >= thr, else 0 (NaN: 0). The comparison of the float
 * widened to double is the one Lua makes of the same float against the same number, so a
 * decision taken here is the one a policy would take on the host. out may alias x. */
ks_status ks_cpu_ge(const float *x, int64_t n, double thr, float *out);

/* out // (n) 32-bit words = a[i] where mask[i % nm] != 0, else b[i] (nm = 1: one decision for
 * all, or nm = n). Bits are copied (int32 lists or floats); a NaN mask word counts as nonzero.
 * out may alias a or b. Errors: nm not 1 or n. */
ks_status ks_cpu_where(const float *mask, int64_t nm, const void *a, const void *b, int64_t n, void *out);

#endif /* KS_PRIMS_H */
