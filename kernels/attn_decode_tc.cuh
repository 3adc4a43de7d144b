/* attn_decode_tc.cuh — decode attention on the tensor cores: the n * g query rows that share a
 * KV head (n query rows x g heads of the group, at most 16) form one m16 tile, so each key and
 * value row is read once for the whole GQA group; split-KV over blocks and over the 4 warps of
 * a block, each warp streaming its own 16-key tiles through shared memory with cp.async (no
 * block-wide barrier in the loop). Q and P are rounded to bf16 (like the flash prefill kernel),
 * accumulation is float32. Same parameters and semantics as ks_cuda_attn_params
 * (attn_decode.cuh): index lists, row ranges around them (seg_*), renumbering, positions, window.
 * Pre-RoPE queries and keys (TokenSelect) are rotated inside the kernel at their attended
 * positions (ks_cuda_attn_decode_tc_list; renumbered lists from a (cos, sin) table where one is
 * given, rope_table.cuh), so a decode row reads the listed K and V rows where they are, with no
 * gathered copy. The splits are merged by ks_cuda_attn_combine (attn_decode.cuh). C-callable. */
#ifndef KS_CUDA_ATTN_DECODE_TC_CUH
#define KS_CUDA_ATTN_DECODE_TC_CUH
#include <cuda_runtime_api.h>
#include <stddef.h>
#include "kvsieve.h"
#include "attn_decode.cuh"
#ifdef __cplusplus
extern "C" {
#endif

/* 1 when the kernel takes p: head_dim 64 or 128, n * (n_heads / n_kv_heads) <= 16, bf16 keys. */
int ks_cuda_attn_decode_tc_supported(const ks_cuda_attn_params *p);

/* *n_splits and workspace bytes (0 when n_splits == 1) for a wave of `wave` blocks (the
 * multiprocessors times the blocks each runs at once: cuda_ctx.attn_bps over the cache rows). */
size_t ks_cuda_attn_decode_tc_workspace(const ks_cuda_attn_params *p, int wave, int *n_splits);

/* The splits to ask for (ks_cuda_attn_params.splits) for one decode row over pre-RoPE rows
 * (rope 1: the kernel rotates them with sincosf): 1.5 blocks an SM (24 at 8 KV heads on 132 SMs),
 * at most one 16-key tile a warp, where the rotation's sincosf want more resident warps than the
 * one block an SM that streams a cache best; 0 (the automatic choice) without rope (0). With a
 * rope table (2: ks_cuda_attn_rope.tab) one split a 64-row quantum, so every warp computes one
 * tile in one stage at 3 blocks an SM, where 3 blocks an SM hold them all (42 splits a KV head for
 * TokenSelect's 2688 rows at 8 KV heads on 132 SMs; session 38), else 0. Measured on an H200 for
 * 2688 rows at 8 KV heads (bench/NOTES.md, fusedattn): rotating 27.0 / 24.9 / 25.6 / 26.0 us at 16 /
 * 24 / 33 / 42 splits, without the rotation 14.8 / 16.5 / 17.3 / 21.1 us (before the table). */
int ks_cuda_attn_decode_tc_list_splits(const ks_cuda_attn_params *p, int n_sm, int rope);

ks_status ks_cuda_attn_decode_tc(cudaStream_t s, const ks_cuda_attn_params *p, int n_splits, void *ws);

/* 1 when func (a kernel node's function, cudaKernelNodeParams.func) is one of this file's
 * kernels over a list, which read the query, the staged descriptor, the step slot and the rope
 * table before griddepcontrol.wait (kernels/pdl.cuh) and the lists after it: a joined decode
 * step (cuda_graph.cu) may start one behind a decode handler's last kernel (which never writes
 * the query) through a programmatic edge. Never launched with the PDL attribute itself. */
int ks_cuda_attn_decode_tc_waits_late(const void *func);

/* A graph's kernel node of one of those kernels (waits_late on its function): the key rows it
 * reads (its params' k: the layer's cache), and its params marked as behind a programmatic edge
 * (ks_cuda_attn_params.behind) with their prefetch (.pf) set to w, bytes (w NULL: none). The
 * join calls them where it gives the node a programmatic edge: only there do its blocks wait for
 * the policy's top-k, and the DRAM idles meanwhile. cudaErrorInvalidValue for a node of another
 * kernel. */
cudaError_t ks_cuda_attn_decode_tc_node_k(cudaGraphNode_t node, const void **k);
cudaError_t ks_cuda_attn_decode_tc_node_edge(cudaGraphNode_t node, const void *w, size_t bytes);

/* The same for one query row over the cache rows themselves (p->n == 1, no index list, no
 * renumbering, n_kv_heads <= KS_CUDA_ATTN_BYVAL_HEADS) with each KV head's key count nk_host
 * (n_kv_heads, HOST) and the query position passed by value: p->nk and p->qpos are not read
 * (may be NULL), so a decode step uploads nothing. The kernels use programmatic dependent
 * launch (kernels/pdl.cuh), as ks_cuda_attn_decode_tc's do. With dyn (DEVICE {pos, delta}, or
 * NULL) the kernel reads the query position from dyn[0] and takes nk_host[h] + dyn[1] keys when
 * it runs (a CUDA graph replays the launch for later tokens; the caller keeps the counts within
 * the capacity). */
#define KS_CUDA_ATTN_BYVAL_HEADS 64
ks_status ks_cuda_attn_decode_tc1(cudaStream_t s, const ks_cuda_attn_params *p, const int *nk_host, int qpos,
                                  const int32_t *dyn, int n_splits, void *ws);

/* Pre-RoPE attention inputs, rotated in the kernel: a host value the launch passes by value
 * (nothing uploaded). inv_freq (head_dim / 2) as ks_rope_inv_freq gives it. tab: NULL, or a
 * DEVICE table of the rotation's (cos, sin) factors (kernels/rope_table.cuh) that renumbered
 * lists (p->renumber) read instead of computing sincosf: used where its header holds exactly
 * inv_freq and attn_factor and the position is one of its rows, so the bits are the same either
 * way; a call over a table runs one block an SM (the table tiles take the shared memory). */
#define KS_CUDA_ATTN_ROPE_HALF 64
typedef struct ks_cuda_attn_rope {
    float inv_freq[KS_CUDA_ATTN_ROPE_HALF];
    float attn_factor;
    const void *tab;
} ks_cuda_attn_rope;

/* One query row (p->n == 1, n_kv_heads <= KS_CUDA_ATTN_BYVAL_HEADS) over the cache rows or over
 * DEVICE index lists, every count by value as for ks_cuda_attn_decode_tc1: nk_host (n_kv_heads,
 * HOST) keys per KV head (list lengths with p->idx), idx_off_host (n_kv_heads, HOST) the start of
 * each head's list in p->idx (NULL without lists), qpos the query position; p->nk, p->idx_off,
 * p->qpos are not read. p->renumber and p->q_renumber as in ks_cuda_attn_params (set both or
 * neither). rope non-NULL: q and the cache rows are pre-RoPE; the kernel rotates the query at its
 * position and each attended key at its position (list slot t with renumbering, else its stored
 * position) with ks_rope_rot (attn_prep.cuh) and rounds the rotated key to bf16, so the result
 * is bit-identical to ks_cuda_attn_gather (bf16) + ks_cuda_attn_rope_q + ks_cuda_attn_decode_tc
 * over the copy. The entries of the lists must be rows < capacity (the caller checked them). */
ks_status ks_cuda_attn_decode_tc_list(cudaStream_t s, const ks_cuda_attn_params *p, const int *nk_host,
                                      const int *idx_off_host, int qpos, const ks_cuda_attn_rope *rope, int n_splits,
                                      void *ws);

/* The same for a recorded step (a CUDA graph replays the launch for later tokens, with other
 * lists):
 * - without lists (p->idx and p->idx_at NULL; pre-RoPE rows, rope non-NULL): nk_host[h] + dyn[1]
 *   keys and the query position dyn[0], dyn DEVICE {pos, delta} read when the kernel runs (as
 *   _tc1's dyn);
 * - over staged lists (p->idx_at: where the lists' base address is, or p->idx: a fixed buffer):
 *   the base address, the per-head counts p->nk, list offsets p->idx_off and the query position
 *   p->qpos[0] read from DEVICE memory when the kernel runs (nk_host and dyn unused: NULL); the
 *   lists must hold until the kernel ran; p->renumber and p->q_renumber as for _tc_list
 *   (both or neither). n_splits is fixed at the launch, the counts may
 *   change between runs (each split takes its share of whatever count it reads). */
ks_status ks_cuda_attn_decode_tc_rec(cudaStream_t s, const ks_cuda_attn_params *p, const int *nk_host, const int32_t *dyn,
                                     const ks_cuda_attn_rope *rope, int n_splits, void *ws);

#ifdef __cplusplus
}
#endif
#endif
