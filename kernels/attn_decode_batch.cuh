/* attn_decode_batch.cuh — one decode row of each of n sessions in ONE launch (the batched
 * decode step, core/decode_batch.c, through ks_backend.attn_decode_batch): each session's new
 * key / value row is written into its own KV layer and its queries attend over that layer's
 * rows, new row included. The sessions' layers are separate allocations of separate sizes; a
 * device array of descriptors (pointers, capacity, query position) and a host-made work split
 * tell the kernel where each one is.
 *
 * Design (tensor cores, as kernels/attn_decode_tc.cu). A segment is one (session i, KV head h):
 * its rows 0..nk-1 from the cache and the new row nk, cut into 16-key tiles. All segments' tiles
 * in order (session-major, head-minor) form one sequence of T tiles, and the launch's W warps
 * take equal contiguous runs of it: warp w has tiles [w T / W, (w+1) T / W) (a stream-K split,
 * so ragged sessions balance to a tile). A warp's run crosses segment boundaries; each piece of
 * it (its tiles of one segment) streams K and V tiles through the warp's own shared-memory ring
 * with cp.async (no block-wide barrier anywhere), the segment's g = n_heads / n_kv_heads query
 * heads as rows of one m16 tile of bf16 A fragments (rows g..15 zero), S = Q K^T and O += P V on
 * mma.sync m16n8k16 with an online softmax in float32 (log2 domain). A segment done by one piece
 * is written as the result; otherwise each piece leaves (max, sum, unnormalised O) in the
 * workspace, and the segment's last piece to finish (an atomic count per segment, after a fence)
 * merges them in piece order, so results do not depend on which warp finishes last. The new row
 * is read from the float32 input rounded to bf16 (as the cache stores it) by the warp whose tile
 * holds it, which also stores it and its position into the cache; nobody reads that row from the
 * cache in this launch.
 *
 * Semantics: those of kv_append(1 row) then attention(n = 1) per session (core/backend.h): a key
 * is visible iff its position <= the query's and (window == 0 || q - k < window); a query that
 * sees no key gets zeros. Q and P are rounded to bf16 for the tensor cores (as the single-session
 * tensor-core decode kernel), accumulation is float32: the result follows the float32 reference
 * to ~3e-3 relative (P's rounding; tests/cuda/test_attn_decode_batch.c gives bf16 queries, so Q's
 * rounding is exact there). The CPU twin is the CPU backend's kv_append + attention per session
 * (ks_attn_decode_batch_loop, core/decode_batch.h). Deterministic for a given warp count. */
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
    const float *q;         /* (n_heads, head_dim) its queries (8-byte aligned) */
    const float *kn, *vn;   /* (n_kv_heads, head_dim) its new key and value row */
    float *out;             /* (n_heads * head_dim) */
    void *out_bf16;         /* NULL, or (n_heads * head_dim) bf16: the output again, rounded */
    int capacity;           /* rows per head allocated (> every head's row count) */
    int qpos;               /* the new row's (and the query's) position */
} ks_cuda_adb_seq;

/* 1 when the kernel takes the shape: head_dim 64 or 128, n_heads / n_kv_heads in 1..8. */
int ks_cuda_attn_decode_batch_supported(int n_heads, int n_kv_heads, int head_dim);

/* The backend's ks_backend.attn_decode_batch (core/backend.h) = ks_cuda_attn_decode_batch_run
 * with warps 0. Shapes the kernel does not take, layers of differing head counts, the backend's
 * basic decode path (opts.decode_kernels = 0) and misaligned queries run as kv_append +
 * attention per session instead (ks_attn_decode_batch_loop: same results to float rounding; a
 * requested out_bf16 is then converted from out in one launch). Host bookkeeping as kv_append:
 * each layer grows when full, its per-head row counts and host positions advance. The
 * descriptors, row counts and split ride in the launch's arguments (up to ADB_INLINE bytes: the
 * 8B shape's B = 64 is 13 KiB; beyond, one upload); the pieces' counters are the backend's
 * (cuda_ctx.adb_cnt, zero between launches); one workspace from the stream pool, one launch.
 * Fails while a graph records. */
ks_status ks_cuda_attn_decode_batch_hook(ks_backend *b, int n, ks_kv_layer *const *L, const float *const *q,
                                         const float *const *k, const float *const *v, const int32_t *pos, int n_heads,
                                         float scale, int window, float *const *out, void *out_bf16);
/* The same with the launch's warp count W: 0 = every multiprocessor full at the kernel's
 * occupancy (at least 16 tiles a warp), else min(warps, T) (tests and tuning: 1 = one warp walks
 * every segment; T = one tile a piece). warps < 0 is KS_ERR_ARG. */
ks_status ks_cuda_attn_decode_batch_run(ks_backend *b, int n, ks_kv_layer *const *L, const float *const *q,
                                        const float *const *k, const float *const *v, const int32_t *pos, int n_heads,
                                        float scale, int window, float *const *out, void *out_bf16, int warps);

#ifdef __cplusplus
}
#endif
#endif
