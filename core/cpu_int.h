/* cpu_int.h — what the files of the CPU backend share; internal to core/ (the backend's users
 * see only backend.h).
 *
 *   cpu_backend.c  memory (and the ks_memtrack bookkeeping), weights, the KV cache, attention,
 *                  create / destroy
 *   cpu_dense.c    the dense ops (matmul, embed, rmsnorm, rope, swiglu, add, gather_rows) and
 *                  the coarse forward ops of backend.h composed of them (attn_in, attn_out,
 *                  mlp, head: dense_plain.h's composition)
 *   cpu_prims.c    the policy primitives table (ks_backend.prims)
 *   cpu_gemm.c     the fixed-order products every linear layer and attention uses */
#ifndef KS_CPU_INT_H
#define KS_CPU_INT_H

#include "backend.h"
#include "cpu_gemm.h"

struct ks_weight {
    float *data;   /* (rows, cols) */
    int64_t rows, cols;
    int owned;     /* data was allocated (converted or realigned) rather than mapped */
};

typedef struct cpu_ctx {
    ks_pool *pool;     /* every parallel loop of this backend */
    ks_memtrack *mem;  /* sizes of what cpu_alloc handed out (mem_stats) */
} cpu_ctx;

/* Aligned backend memory, counted by mem_stats; kind: 0 = weights / KV cache, 1 = activations
 * and temporaries. NULL with KS_ERR_OOM recorded. cpu_free(NULL) does nothing. */
void *cpu_alloc_kind(ks_backend *b, size_t bytes, int kind);
void cpu_free(ks_backend *b, void *p);

/* fn(ctx, begin, end) over [0, n) in chunks of at least `grain` items, on the backend's pool
 * (inline when n <= grain or the pool has one thread). */
typedef void (*range_fn)(void *ctx, int64_t begin, int64_t end);
void cpu_par_range(ks_backend *b, int64_t n, int64_t grain, range_fn fn, void *ctx);

/* cpu_dense.c: fills the dense and forward entries of the table (embed, attn_in, attn_out, mlp,
 * head, gather_rows, rope). */
void cpu_dense_install(ks_backend *b);

#endif
