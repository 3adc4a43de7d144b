/* attn_decode_batch.cuh — one decode row of each of n sessions in ONE launch (the batched
 * decode step, core/decode_batch.c, through ks_backend.attn_decode_batch): each session's new
 * key / value row is written into its own KV layer and its queries attend over that layer's
 * rows, new row included. The sessions' layers are separate allocations of separate sizes: a
 * device array of descriptors (pointers, capacity, query position) and each head's row count
 * tells the kernel where each one is.
 *
 * The kernel loads K rows into registers a few at a time and prefetches V into L2 (chunk <= 256).
 * Measured on an H200 (bench/NOTES.md, batched decode with greedy ids on the device): one 8B
 * layer, B = 64 x 4096 keys, 461 us; B = 16, 158 us. A variant that copied each block's K and V
 * into shared memory first (chunk <= 128) took 514 / 172 us and was removed; the next try is more
 * keys a block through a ring of tiles (fewer splits).
 * Work: block (split j, KV head h, session i) takes keys [j*chunk, (j+1)*chunk) of head h of
 * session i (rows 0..nk-1 of the cache, then the new row, read from the float32 input rounded
 * to bf16 as the cache stores it) for the g = n_heads / n_kv_heads query heads that share h, so
 * each key and value row is read once per group. Scores in float32 (8 lanes a key, a warp 4
 * keys at once), the chunk's softmax in shared memory, then P V with 16-byte value loads. With
 * several splits the partials (unnormalised output, max, sum) go to a workspace and the last
 * block of (i, h) to finish (an atomic count) combines them: one launch, no second kernel.
 * Split 0's block also stores the new row (and its position) into the cache; no block reads
 * that row from the cache, so the store races with nothing.
 *
 * Semantics: those of kv_append(1 row) then attention(n = 1) per session (core/backend.h):
 * a key is visible iff its position <= the query's and (window == 0 || q - k < window); a query
 * that sees no key gets zeros. Float32 arithmetic on bf16 keys and values (q is not rounded), so
 * the result follows the CPU reference to float rounding. The CPU twin is that reference: the
 * CPU backend's kv_append + attention per session (ks_attn_decode_batch_loop,
 * core/decode_batch.h); tests/cuda/test_attn_decode_batch.c compares the two. */
#ifndef KS_CUDA_ATTN_DECODE_BATCH_CUH
#define KS_CUDA_ATTN_DECODE_BATCH_CUH
#include <cuda_runtime_api.h>
#include <stddef.h>
#include <stdint.h>
#ifdef __cplusplus
extern "C" {
#endif
#include "backend.h"

/* One session of the launch; every pointer is device memory. */
typedef struct ks_cuda_adb_seq {
    void *k, *v;            /* (n_kv_heads, capacity, head_dim) bf16: its KV layer */
    int32_t *kpos;          /* (n_kv_heads, capacity) positions of the rows */
    const float *q;         /* (n_heads, head_dim) its queries */
    const float *kn, *vn;   /* (n_kv_heads, head_dim) its new key and value row */
    float *out;             /* (n_heads * head_dim) */
    int capacity;           /* rows per head allocated (> every nk) */
    int qpos;               /* the new row's (and the query's) position */
    int nk_off;             /* its heads' row counts before the append: nk[nk_off .. + n_kv_heads) */
    int pad_;
} ks_cuda_adb_seq;

/* 1 when the kernel takes the shape: head_dim 64 or 128, n_heads / n_kv_heads in {1, 2, 4, 8}. */
int ks_cuda_attn_decode_batch_supported(int n_heads, int n_kv_heads, int head_dim);

/* Bytes of workspace for n sessions whose largest head holds max_rows rows after the append,
 * with chunk keys per block (0 when every head fits one chunk). */
size_t ks_cuda_attn_decode_batch_workspace(int n, int n_heads, int n_kv_heads, int head_dim, int max_rows, int chunk);

/* Launch for sessions seq[0..n) (device array) with row counts nk (device); chunk a multiple of
 * 16 in [16, 256]; ws of the size above (NULL when 0). */
ks_status ks_cuda_attn_decode_batch(cudaStream_t s, const ks_cuda_adb_seq *seq, const int32_t *nk, int n, int n_heads,
                                    int n_kv_heads, int head_dim, int max_rows, float scale, int window, int chunk,
                                    void *ws);

/* The backend's ks_backend.attn_decode_batch (core/backend.h): the kernel with chunk keys
 * per block (0 = chosen from the sizes: enough blocks to fill the GPU, at most 256 keys each).
 * Shapes the kernel does not take, and layers of differing head counts, run as kv_append + attention per
 * session instead (same results). Host bookkeeping as kv_append: each layer grows when full,
 * its per-head row counts and host positions advance. Fails while a graph records. With the
 * backend's basic decode path (opts.decode_kernels = 0) or unaligned queries: per session too. */
ks_status ks_cuda_attn_decode_batch_hook(ks_backend *b, int n, ks_kv_layer *const *L, const float *const *q,
                                         const float *const *k, const float *const *v, const int32_t *pos, int n_heads,
                                         float scale, int window, float *const *out); /* chunk 0 */
ks_status ks_cuda_attn_decode_batch_run(ks_backend *b, int n, ks_kv_layer *const *L, const float *const *q,
                                        const float *const *k, const float *const *v, const int32_t *pos, int n_heads,
                                        float scale, int window, float *const *out, int chunk);

#ifdef __cplusplus
}
#endif
#endif
