/* rope_table.cuh — the rotary embedding's (cos, sin) factors for positions 0..rows-1, tabulated
 * once on the device so that a kernel rotating many keys at small positions (the tensor-core
 * decode over a renumbered list: TokenSelect's keys sit at list slots 0..k-1 every layer and
 * step) reads them instead of running a sincosf per (key, frequency). Each entry is ks_rope_cs
 * (attn_prep.cuh) itself, so rotating with the table gives the same bits as computing.
 *
 * Layout (float4 units), for head_dim d (half = d / 2 frequencies, hch = d / 16 chunks of 8
 * columns in the first half):
 *   [0, KS_CUDA_ROPE_TAB_HDR)   header: floats 0..63 inv_freq (zeros past half), 64 attn_factor,
 *                               65 half, 66 rows (both as int bits), 67 zero
 *   then row p (d / 4 float4s): float4 i * hch + ch (i < 4, ch < hch) holds
 *                               (c, s) of frequency ch * 8 + 2 i and (c, s) of ch * 8 + 2 i + 1,
 *                               c = cos(p * inv) * af, s = sin(p * inv) * af as ks_rope_cs rounds
 *                               them: a lane that owns chunk ch reads its 8 pairs as 4 float4s,
 *                               and the 8 lanes of a quarter warp read 128 consecutive bytes.
 * A reader checks the header against its own inv_freq / attn_factor / half (bit for bit) and
 * computes where they differ, so a table rebuilt for another rope never gives wrong rotations.
 * C-callable. */
#ifndef KS_CUDA_ROPE_TABLE_CUH
#define KS_CUDA_ROPE_TABLE_CUH
#include <cuda_runtime_api.h>
#include <stddef.h>
#include "kvsieve.h"
#ifdef __cplusplus
extern "C" {
#endif

#define KS_CUDA_ROPE_TAB_HDR 17   /* float4s of header */
#define KS_CUDA_ROPE_TAB_ROWS 8192 /* the backend's table: lists of up to 8192 renumbered rows */

/* Bytes of a table of `rows` positions at head_dim d (16-byte aligned size). */
size_t ks_cuda_rope_table_bytes(int rows, int head_dim);

/* Fill tab (DEVICE, ks_cuda_rope_table_bytes(rows, head_dim) bytes, 16-byte aligned) for
 * inv_freq (HOST, head_dim / 2 floats) and attn_factor, on stream s. head_dim: 64 or 128
 * (KS_ERR_UNSUPPORTED otherwise), rows >= 1. */
ks_status ks_cuda_rope_table(cudaStream_t s, void *tab, int rows, int head_dim, const float *inv_freq, float attn_factor);

#ifdef __cplusplus
}
#endif
#endif
