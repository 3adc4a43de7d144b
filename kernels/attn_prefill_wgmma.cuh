/* attn_prefill_wgmma.cuh — flash attention for prefill on Hopper warpgroup MMA (wgmma.mma_async,
 * sm_90a). Same semantics as ks_cuda_attn_prefill (attn_prefill.cuh) and ks_cuda_attn_params
 * (attn_decode.cuh): bf16 Q (rounded from the float32 queries while staging), bf16 K/V rows of
 * the cache (capacity stride per KV head), GQA, causal by position ids (qpos / kpos, q_renumber,
 * renumber), sliding window, float32 online softmax and accumulation, float32 output
 * (n, n_heads, head_dim). No index lists, no float32 keys. head_dim 64 or 128. C-callable.
 *
 * ---- Work decomposition
 * One CTA = 2 warpgroups (256 threads) = 128 query rows of one query head; warpgroup w owns rows
 * 64w .. 64w+63 of the block, warp k of a warpgroup (k = warp % 4) rows 16k .. 16k+15 of those.
 * Key tiles of BN keys (variant 1: BN = 128, 1 CTA per SM; variant 2: BN = 64, 2 CTAs per SM so
 * that one CTA's softmax overlaps the other's MMAs). K/V tiles are copied global -> shared with
 * cp.async (16 bytes per thread, zero-filled past nk), double buffered; tiles that no row of
 * the block can see are skipped (per-64-key tile position bounds computed by a small kernel
 * into the workspace), fully visible tiles are not masked. Per tile and warpgroup:
 *   S(64 x BN)  = Q(64 x D) K^T      wgmma m64nBNk16, A and B from shared memory, D/16 steps
 *   mask, online softmax (log2 domain, f32), O *= correction
 *   O(64 x D)  += P(64 x BN) V(BN x D)  wgmma m64nDk16, A (P, bf16) from registers, BN/16 steps
 * Query blocks are launched heaviest (latest positions) first.
 * Variant 3 ("GQA packing") = variant 2 with the CTA's 128 rows taken from all G = H / Hkv
 * query heads of one KV head: grid (n_kv_heads, ceil(n * G / 128)), row f of the flattened
 * order f = i * G + (h % G) is query i of head (kv * G + f % G), so a CTA covers 128 / G
 * consecutive queries and every K/V tile it loads serves G heads. Per flop this reads 1/G of
 * the K/V bytes of variants 1/2 (which stream K/V into the SMs mostly from DRAM once the sweep
 * of keys no longer fits in L2: bench/NOTES.md); rows and Q/out
 * addresses: Q/out row of f is ((f / G) * H + kv * G + f % G) * D, contiguous over a group.
 * Masking is per row (each row has its own position), so nothing else changes.
 * Variant 4 = variant 3 with one __syncthreads per key tile instead of two (the next tile's
 * cp.async copies are issued right after the barrier that opens a tile, which proves that every
 * warp has finished the previous tile and so its buffer; cp.async.wait_group 0 before it).
 * Variant 10 (the shipped kernel) = GQA packing with warp specialisation, one CTA of 3 warpgroups per
 * SM: warpgroup 0 produces (one thread issues TMA copies of 128-key K and V tiles into a 3-slot
 * ring; "full" / "empty" mbarriers per slot; setmaxnreg gives its registers to the consumers),
 * warpgroups 1 and 2 consume 64 rows each; a consumer issues S_j = Q K_j^T and O += P_{j-1} V_{j-1}
 * together, waits for S_j only and runs tile j's mask and softmax while P_{j-1} V_{j-1} runs
 * (FlashAttention-3's intra-warpgroup pipelining), then releases tile j - 1's slot. The one tile
 * that reaches past nk is copied with zero-filling cp.async instead (garbage rows never meet
 * P = 0). Variants 1 .. 4, 8, 9, 11, 12 are the steps measured on the way (bench/NOTES.md):
 * only the dev harness builds them (KS_KERNEL_DEV, below).
 *
 * ---- Shared-memory tiles: 128-byte swizzle ("SW128"), the layout TMA writes with
 * CU_TENSOR_MAP_SWIZZLE_128B and wgmma reads with descriptor layout type 1.
 * A tile of R rows x D bf16 columns (D contiguous in global memory) is stored as D/64 "boxes"
 * of 64 columns; box b starts at b * R * 128 bytes; within a box, row r is 128 bytes at
 * r * 128, and its 16-byte chunk c (columns 8c .. 8c+7 of the box) sits at chunk position
 * c ^ (r & 7). Every tile starts 1024-byte aligned, so the XOR term equals address bits [7:9]
 * and the hardware's swizzle (address bits [4:6] ^= bits [7:9]) inverts ours exactly.
 * Q: (128 rows, D) 2 * 128 * D bytes; K and V: (BN rows, D) each, two buffers each.
 *
 * ---- Matrix descriptors (64-bit; PTX "matrix descriptor format")
 *   bits  0-13  start address >> 4 (shared-window byte address)
 *   bits 16-29  leading-dimension byte offset (LBO) >> 4
 *   bits 32-45  stride-dimension byte offset (SBO) >> 4
 *   bits 49-51  base offset = 0 (atoms are 1024-byte aligned)
 *   bits 62-63  layout type: 1 = 128-byte swizzle
 * K-major operand (Q as A of S = Q K^T, K as B of it: the reduction dim d is contiguous):
 *   canonical SW128 K-major ((8,m),(8,2k)) : ((64 el, SBO),(1, 8 el)); 8 rows of 128 bytes form
 *   an atom, m atoms along M/N at SBO = 1024 bytes; LBO is unused (the k16 slice, 32 bytes, lies
 *   inside one 128-byte row) and set to 16 bytes. k-step ks (d = 16ks .. 16ks+15) starts at
 *   box (ks / 4) + (ks % 4) * 32 bytes; the hardware applies the XOR on the final address, so
 *   an unaligned-to-128 start inside the atom is how k advances within a swizzle row. Warpgroup
 *   w's Q rows start 64w * 128 = 8192w bytes into each Q box.
 * MN-major operand (V as B of O += P V: N = d is contiguous, K = keys are rows), imm-trans-b 1:
 *   canonical SW128 MN-major ((8,8,m),(8,k)) : ((1, 8 el, LBO),(64 el, SBO)); 64 contiguous N
 *   elements (one box row), the next 64 N elements at LBO = one box = BN * 128 bytes; 8 K rows
 *   of 128 bytes form the atom, the next 8 keys at SBO = 1024 bytes. k-step kk (keys 16kk ..
 *   16kk+15) starts at kk * 16 * 128 = 2048kk bytes (whole atoms).
 *
 * ---- Register fragments (per warpgroup; warp k of it, lane = 4g + t)
 * Accumulator D (64 x N, f32), N/2 registers per thread: d[4i + e] holds
 *   row 16k + g + 8 * (e >> 1), column 8i + 2t + (e & 1), for column block i = 0 .. N/8-1.
 * A from registers (64 x 16 bf16), 4 x b32 per thread (two bf16 each, low half first):
 *   a0: row 16k+g, cols 2t, 2t+1;   a1: row 16k+g+8, cols 2t, 2t+1;
 *   a2: row 16k+g, cols 2t+8, 2t+9; a3: row 16k+g+8, cols 2t+8, 2t+9.
 * So P's k-step kk (keys 16kk .. 16kk+15) is built from S column blocks 2kk, 2kk+1:
 *   a0 = (s[8kk], s[8kk+1]), a1 = (s[8kk+2], s[8kk+3]), a2 = (s[8kk+4], s[8kk+5]),
 *   a3 = (s[8kk+6], s[8kk+7]). Row statistics are reduced over the 4 lanes t of a quad.
 *
 * ---- Ordering
 * Shared memory written by the threads (Q stores, cp.async) and read by wgmma (async proxy):
 * each writing thread runs fence.proxy.async.shared::cta after its copies have landed, then
 * __syncthreads. wgmma batches: wgmma.fence, the MMAs, commit_group, wait_group 0; the
 * accumulators are pinned around the batch with empty asm operands so the compiler does not
 * move their reads/writes across it. */
#ifndef KS_CUDA_ATTN_PREFILL_WGMMA_CUH
#define KS_CUDA_ATTN_PREFILL_WGMMA_CUH
#include <cuda_runtime_api.h>
#include <stddef.h>
#include <stdint.h>
#include "kvsieve.h"
#include "attn_decode.cuh"
#ifdef __cplusplus
extern "C" {
#endif

/* 1 when the wgmma kernel takes these parameters: head_dim 64 or 128, no index lists, bf16 keys,
 * n_heads a multiple of n_kv_heads, k/v 16-byte aligned. */
int ks_cuda_attn_prefill_wgmma_supported(const ks_cuda_attn_params *p);

/* Workspace bytes (per-64-key-tile position bounds per KV head); equals
 * ks_cuda_attn_prefill_workspace(p), so a flash workspace can be passed as is. */
size_t ks_cuda_attn_prefill_wgmma_workspace(const ks_cuda_attn_params *p);

/* The shipped kernel, variant 10 (the planner's KS_CUDA_PREFILL_WGMMA, attn_prefill.cuh). Errors:
 * KS_ERR_UNSUPPORTED for shapes it does not take, KS_ERR_ARG for misaligned buffers or no
 * workspace, KS_ERR_DEVICE for launch failures. n <= 0 is a no-op. */
ks_status ks_cuda_attn_prefill_wgmma(cudaStream_t s, const ks_cuda_attn_params *p, void *ws);

#ifdef KS_KERNEL_DEV
/* Dev harness only (tests/cuda/test_wgmma validates each, bench_kernels times them; never in
 * libkvsieve): the steps measured on the way to variant 10 (bench/NOTES.md).
 * 1 (BN = 128), 2 (BN = 64, 2 CTAs per SM), 3 (variant 2 with the G query heads of a KV head
 * packed into one CTA's rows), 4 (variant 3 with one barrier per key tile); 8 and 9:
 * warp-specialised (a producer warpgroup fills the ring, two consumer warpgroups, mbarriers
 * instead of CTA barriers; 8: BN = 64, 5 slots; 9: BN = 128, 3 slots); 10 and 11: 9 and 8 with
 * TMA tile copies issued by one producer thread; 12: 10 with "ping-pong" (the consumer
 * warpgroups take turns issuing their GEMMs through named barriers, so one's softmax runs under
 * the other's GEMMs). Numbers 5 .. 7 are unused (superseded designs, removed). Another value:
 * KS_ERR_ARG. */
#define KS_WGMMA_VARIANTS 12
#define KS_WGMMA_LIVE(v) ((v) >= 1 && (v) <= KS_WGMMA_VARIANTS && ((v) < 5 || (v) > 7))
#define KS_WGMMA_SHIPPED 10
ks_status ks_cuda_attn_prefill_wgmma_variant(cudaStream_t s, const ks_cuda_attn_params *p, void *ws, int variant);
#endif

#ifdef __cplusplus
}
#endif
#endif
