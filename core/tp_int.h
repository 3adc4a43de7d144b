/* tp_int.h — what the two files of the tensor-parallel composite share (internal to core/):
 *   tp_backend.c  weights and their shards, the CPU ranks' ops (host buffers, host all-reduce),
 *                 creation, memory counts
 *   tp_device.c   the device ranks' ops (GPU ranks: device buffers, collectives through the
 *                 ks_tp_dev_ops of kernels/tp_nccl.cu)
 * tp_backend.h says what the composite computes and how each op is split. */
#ifndef KS_TP_INT_H
#define KS_TP_INT_H

#include "tp_backend.h"
#include "dense_plain.h"

enum { SPLIT_NONE = 0, SPLIT_REPL, SPLIT_ROWS, SPLIT_COLS };

/* A weight on the composite: the whole tensor (or the recipe of a random one) until it is
 * sharded, then N rank shards. */
struct ks_weight {
    int64_t rows, cols;
    const ks_st_tensor *t;     /* a checkpoint tensor (the model keeps the mapping open) ... */
    int64_t row0;              /* ... rows [row0, row0 + rows) of it */
    float *host;               /* or random values (rows, cols) (CPU ranks), freed once sharded */
    int rnd;                   /* or (device ranks) a random weight drawn per shard: */
    uint64_t seed;             /*   rank r's shard: weight_random(seed, or seed mixed with r) */
    float scale, offset;
    int split;                 /* SPLIT_*: how it was cut */
    ks_weight *sh[KS_TP_MAX];  /* rank r's shard (a weight of rank r's backend) */
    float *stage[KS_TP_MAX];   /* float32 copy a column shard (or a random one) is read from (CPU ranks) */
};

/* One allocation of a device composite: the pointer the engine holds (v, on rank 0) and each
 * rank's buffer of the same size (p[r]); p[0] == v unless the policy views are on (tp_device.c). */
typedef struct tp_buf {
    char *v;
    char *p[KS_TP_MAX];
    size_t bytes;
} tp_buf;

typedef struct tp_ctx {
    int N;
    ks_backend *rank[KS_TP_MAX]; /* owned */
    ks_backend *host;            /* CPU ranks: a CPU backend for the composite's host buffers and KV view */
    ks_dense_ops ops;            /* CPU ranks: the ranks' plain dense ops (cpu_dense.h) */
    ks_memtrack *stage_mem[KS_TP_MAX]; /* bytes of the shard copies kept for rank r */
    int sharded;
    /* device ranks (dev != NULL) */
    const ks_tp_dev_ops *dev;
    ks_tp_dev *comm;
    int views;                   /* the policy views are kept (ks_tp_want_views) */
    tp_buf *buf;                 /* (n_buf) live allocations */
    int n_buf, cap_buf;
} tp_ctx;

/* A layer's rank KV layers and the composite's own bookkeeping of the whole layer; hangs off
 * the whole layer's pos_dev. */
typedef struct tp_kv {
    ks_kv_layer r[KS_TP_MAX];
    /* device ranks: the whole layer's row counts and positions (L->n, L->pos point here), or,
     * with views, a whole KV layer on rank 0 whose arrays L points to */
    int *n;
    int32_t *pos;
    int cap;
    int has_view;
    ks_kv_layer view;
} tp_kv;

static inline tp_ctx *TPC(ks_backend *b) { return (tp_ctx *)b->ctx; }

/* [total*r/N, total*(r+1)/N): units split as evenly as they go */
static inline int64_t tp_lo(int64_t total, int N, int r) { return total * r / N; }
static inline int64_t tp_cnt(int64_t total, int N, int r) { return tp_lo(total, N, r + 1) - tp_lo(total, N, r); }

/* Rank r's view of the model's sizes: its heads, KV heads, ffn units and vocab rows. */
static inline ks_config tp_rank_cfg(const ks_config *c, int N, int r) {
    ks_config x = *c;
    x.n_heads = c->n_heads / N;
    x.n_kv_heads = c->n_kv_heads / N;
    x.ffn = (int)tp_cnt(c->ffn, N, r);
    x.vocab = (int)tp_cnt(c->vocab, N, r);
    return x;
}

/* Rank r's shards of a layer's weights (bo on rank 0 only: it is added once). */
ks_layer_w ks_tp_rank_w(const ks_layer_w *W, int r);
ks_status ks_tp_need_shards(tp_ctx *t);

/* tp_device.c: the device composite's entries of the backend table (weights and create stay
 * in tp_backend.c). */
void ks_tp_dev_install(ks_backend *b);
void ks_tp_dev_destroy(tp_ctx *t);

#endif
