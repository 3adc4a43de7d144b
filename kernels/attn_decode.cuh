/* attn_decode.cuh — attention over a bf16 KV cache, general form: any query count, per-KV-head
 * row counts, optional per-KV-head index lists (TokenSelect's attend) with optional position
 * renumbering, causal masking by position ids, sliding window, GQA. Split-KV: the keys of
 * each head are cut into n_splits chunks processed by separate blocks, then combined. This is
 * the decode path (and the fallback for shapes the flash prefill kernel does not take).
 * C-callable. */
#ifndef KS_CUDA_ATTN_DECODE_CUH
#define KS_CUDA_ATTN_DECODE_CUH
#include <cuda_runtime_api.h>
#include <stddef.h>
#include <stdint.h>
#include "kvsieve.h"
#ifdef __cplusplus
extern "C" {
#endif

/* One attention call; every pointer is device memory. Query head h reads KV head
 * h / (n_heads / n_kv_heads). Key t of KV head kv is row j = idx ? idx[idx_off[kv] + t] : t, for
 * t < nk[kv], at position renumber ? t : (kpos ? kpos[kv * capacity + j] : j). Query row i (of n)
 * sits at position q_renumber ? nk[kv] - n + i : qpos[i]. A key is visible iff its position
 * <= the query's and (window == 0 || query - key < window). A query row that sees no key gets
 * zeros. (The backend's renumbered attend sets renumber and q_renumber, as core/cpu_backend.c
 * does; after gathering the listed rows into a compact copy it sets q_renumber only.) */
typedef struct ks_cuda_attn_params {
    float *out;            /* (n, n_heads * head_dim) float32 */
    const float *q;        /* (n, n_heads, head_dim) float32 */
    const void *k, *v;     /* (n_kv_heads, capacity, head_dim): v bf16; k bf16, or float32 with k_f32 */
    const int32_t *kpos;   /* (n_kv_heads, capacity), or NULL: positions = row index */
    const int32_t *qpos;   /* (n) */
    const int32_t *nk;     /* (n_kv_heads) keys per KV head (rows in use, or list lengths) */
    const int32_t *idx;    /* NULL, or the lists concatenated */
    const int32_t *const *idx_at; /* tensor-core decode, recorded over staged lists (_tc_rec) only: NULL, or
                              DEVICE memory holding the lists' base address, read when the kernel runs
                              (then idx is unused) */
    const int32_t *idx_off;/* (n_kv_heads) start of each head's list in idx */
    int n, n_heads, n_kv_heads, head_dim, capacity;
    int max_nk;            /* max over heads of nk (host copy, sizes the grid) */
    float scale;
    int window, renumber, q_renumber;
    int k_f32;             /* k is float32 (split-KV kernel only) */
    int pdl;               /* launch with programmatic dependent launch where the kernel supports it
                              (kernels/pdl.cuh; the backend's ks_backend_opts.pdl) */
    int splits;            /* tensor-core decode: split-KV blocks per KV head wanted, 0 = automatic
                              (the backend's ks_backend_opts.decode_splits) */
    /* tensor-core decode, one row over lists (ks_cuda_attn_decode_tc_list / _tc_rec): row ranges
     * around each head's list (ks_attn_args.seg): key t < nb is row b0 + t, then the list's
     * entries, then the last na keys are rows a0, a0 + 1, ... (the counts include all three).
     * By value: seg_b0, seg_nb, seg_a0, seg_na; a recorded launch reads seg_dev (DEVICE
     * {b0, nb, arel, na, page}, a0 = qpos + 1 + arel when it runs; page > 0: a page tail, its end
     * e = qpos + 1 + arel, a0 = (e - 1) / page * page, na = e - a0, and each head's count nk[h]
     * (staged with the staging step's na) grown by the difference) instead. Zeros / NULL: no
     * ranges. */
    int seg_b0, seg_nb, seg_a0, seg_na;
    const int32_t *seg_dev;
    /* tensor-core decode over a list: NULL, or the weights the step reads next (the layer's
     * o-projection, pf_bytes of them): each block prefetches its share into L2 before it waits for
     * its lists (ks_cuda_attn_decode_tc_waits_late), while the DRAM idles under the policy's
     * top-k. Only a hint: no result depends on it. */
    const void *pf;
    size_t pf_bytes;
    /* tensor-core decode over a list: 1 where its blocks start behind a decode handler's last
     * kernel through a programmatic edge (set on the graph node: ks_cuda_attn_decode_tc_node_edge),
     * so they stage the query while they wait for the lists and look up their first rows after;
     * 0: they look up their first rows and issue those copies before staging the query. The same
     * results either way. */
    int behind;
} ks_cuda_attn_params;

/* Work decomposition for p on a device with n_sm multiprocessors: *n_splits and the
 * workspace bytes ks_cuda_attn_decode needs (0 when n_splits == 1). */
size_t ks_cuda_attn_decode_workspace(const ks_cuda_attn_params *p, int n_sm, int *n_splits);

/* Merge split-KV partials: for each of `rows` (query row, head) pairs, ws_acc (rows, n_splits,
 * head_dim) unnormalised outputs and ws_ml (rows, n_splits, 2) (max logit in natural-log units,
 * sum of exp) -> out (rows, head_dim). Rows that saw no key get zeros. pdl: as in the params. */
ks_status ks_cuda_attn_combine(cudaStream_t s, float *out, const float *ws_acc, const float *ws_ml, size_t rows,
                               int n_splits, int head_dim, int pdl);

/* Run; ws of the size above (NULL when 0). */
ks_status ks_cuda_attn_decode(cudaStream_t s, const ks_cuda_attn_params *p, int n_splits, void *ws);

#ifdef __cplusplus
}
#endif
#endif
