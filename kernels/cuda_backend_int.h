/* cuda_backend_int.h — what the files of the CUDA backend (ks_cuda.h) share; internal to kernels/.
 *
 *   cuda_ctx.cu    context: device, stream, memory pool, pinned staging, cuBLAS, allocation
 *                  helpers, memory ops, memory statistics, pinned host memory, create/destroy
 *   cuda_dense.cu  weights, matmul/gemv (plain and fused), embed, rmsnorm, rope, swiglu, add,
 *                  gather_rows (ks_cuda_dense.h)
 *   cuda_layer.cu  the forward ops (attn_in, attn_out, mlp, head): fused or plain by the options
 *   cuda_kv.cu     the KV cache: alloc, free, append, retain
 *   cuda_attn.cu   attention: the path planner (decode, tensor-core decode, prefill) and its launches
 *   cuda_prof.cu   profiling marks and the roofline ceilings
 *   cuda_graph.cu  decode-step graphs (record, replay)
 *   cuda_prims.cu  the policy primitives table (ks_backend.prims)
 *
 * Each file fills its own entries of the ks_backend table (cuda_<job>_install), called once by
 * ks_cuda_backend_create after the context is set up. */
#ifndef KS_CUDA_BACKEND_INT_H
#define KS_CUDA_BACKEND_INT_H

#include "common.cuh"
#include "ks_cuda.h"

#include <cublas_v2.h>

extern "C" {
#include "backend.h"
#include "config.h"
}
#include "ks_cuda_dense.h"
#include "attn_decode_tc.cuh"

struct ks_weight {
    void *data;            /* (rows, cols) bf16, or float32 for vectors (cols == 1) */
    int64_t rows, cols;
    int type;              /* KS_CUDA_BF16 or KS_CUDA_F32 */
    int view;              /* 1: data lies in another weight's buffer (weights_join), not freed here */
};

#define ROPE_CACHE 4 /* rope configurations whose inv_freq stays on the device */

/* One staged-list slot (attn_stage): the fixed descriptor a recorded attention over lists reads
 * when it runs. The lists themselves stay where the action holds them (its own copy, or a lent
 * tensor): the action is freed in stream order after the segment that reads them, so they live
 * until that attention ran, and the descriptor holds their address. */
typedef struct cu_lslot {
    int32_t *desc;     /* device: (2, KS_CUDA_LSLOT_HEADS) counts (row ranges included), then offsets from
                          the lists' base, then KS_CUDA_LSLOT_SEG words {b0, nb, arel, na, page, 0}:
                          ks_cuda_attn_params.seg_dev, then the base address (two words at KS_CUDA_LSLOT_PTR,
                          8-byte aligned): ks_cuda_attn_params.idx_at */
    int32_t *hdesc;    /* host copy of the descriptor last written (ks_cuda_list_stage's arguments) */
    int hkv, max_nk;   /* of the last staging (host: the recording's split choice) */
    int renumber;      /* the last staging's lists take positions 0..count-1 */
    int seg;           /* the last staging had row ranges around its lists (desc's seg words) */
} cu_lslot;

/* A block of decode handlers' recordings (cuda_ctx.own; cuda_ctx.cu own_alloc). */
typedef struct cu_owned {
    void *p;
    size_t bytes;
    int user;            /* held by its user (else free for a later recording's allocation) */
} cu_owned;

/* The o-projection a KV layer's one-row attn_in read last (cuda_layer.cu), found by the layer's
 * key storage (ks_kv_layer.k) in a small open-addressed table: a joined decode step's list
 * attention behind a policy's top-k prefetches it into L2 while it waits (cuda_graph.cu,
 * ks_cuda_attn_params.pf). */
#define KS_CUDA_WNEXT 256
typedef struct cu_wnext {
    const void *k;
    const void *w;
    size_t bytes;
} cu_wnext;

typedef struct cuda_ctx {
    int device, n_sm;
    cudaStream_t stream;
    cublasHandle_t blas;
    void *blas_ws;
    cudaMemPool_t pool;
    unsigned char *pin;    /* pinned staging ring for small host -> device copies */
    size_t pin_cap, pin_off;
    int sm_major;          /* compute capability (major): the prefill planner's architecture family */
    int attn_bps;          /* blocks a multiprocessor of the split-KV decode attention over the cache rows: 2
                            * where the memory's peak rate is >= 30 GB/s a multiprocessor (an H200: 37), else
                            * 1 (an H100: 25). Two made full attention's steady step 0.7-1.5% faster at
                            * 32K and 128K keys on an H200 (bench/NOTES.md, issue 14 session 41; likely
                            * more bytes in flight for its rate, not measured); one was measured best on an
                            * H100 (session 9) */
    ks_backend_opts o;     /* this backend's options (kernel choices, PDL, splits; ks_backend.opts too) */
    ks_cuda_attn_path attn_path; /* tests: ks_cuda_backend_set_attn_path */
    long prefill_calls[3]; /* prefill attention launches per ks_cuda_prefill_kernel (tests) */
    ks_memtrack *mem;      /* sizes of our device allocations (mem_stats) */
    /* profiling marks (prof_mark / prof_collect): events recorded on the stream, resolved in
     * batches; pacc holds the seconds of intervals already resolved, per tag */
    cudaEvent_t *pev;      /* (pcap) */
    int *ptag;             /* (pcap) tag of the interval ending at each event */
    int pn, pcap;
    double pacc[KS_PROF_TAGS];
    /* inv_freq tables on the device, one per rope configuration seen (rope_inv_dev) */
    struct rope_cache {
        struct rope_key {
            int type, head_dim, orig_max_pos, use_long;
            double theta, factor, low, high, attn_factor;
            const float *short_factor, *long_factor;
        } key;
        float *dev; /* (head_dim/2) */
    } rc[ROPE_CACHE];
    int rc_next;
    unsigned rc_gen;       /* bumped when a table is replaced (graphs that read the old one are stale) */
    /* decode-step graphs (graph_begin .. graph_end): while `rec`, calls record instead of run */
    int rec, rec_failed;
    int prog_edges;        /* programmatic edges the joins made (cuda_graph.cu graph_inline; tests) */
    int pf_nodes;          /* of their list attentions, those given a prefetch (ks_cuda_attn_params.pf; tests) */
    /* rec_own: the recording is a decode handler's (graph_begin_handler): allocations are
     * blocks of own[] (cuda_ctx.cu own_alloc), reused by later recordings once their users free
     * them, returned to the device when own_graphs (live graphs that may launch them) is 0 */
    int rec_own;
    cu_owned *own;
    int n_own, cap_own, own_graphs;
    int32_t *h_step;       /* pinned {id, pos, delta, pos, 0} (KS_CUDA_STEP_WORDS; cuda_graph.cu): written by
                              graph_run, copied by the graph's first node */
    int32_t *d_step;       /* device copy the recorded kernels read */
    void *gws;             /* attention split workspace of recorded steps (GRAPH_WS bytes) */
    void *zc;              /* (KS_CUDA_COUNTERS) unsigned, zero at rest: the primitives' arrival counters
                              (ks_cuda_scratch.counters) */
    unsigned *adb_cnt;     /* (adb_cnt_n) the batched decode attention's piece counters, zero between launches */
    struct ks_gemm_wg_cache *gwg_maps; /* the n-row wgmma GEMM's tensor maps, encoded once (gemm_wg.cuh) */
    int adb_cnt_n;
    /* the (cos, sin) table of renumbered list attention (rope_table.cuh, KS_CUDA_ROPE_TAB_ROWS rows at
     * head_dim rtab_d), built for the rope whose inv_freq / attn_factor rtab_key holds (cuda_attn.cu) */
    void *rtab;
    int rtab_d;
    float rtab_key[KS_CUDA_ATTN_ROPE_HALF + 1];
    float *row_mlp;        /* (2, row_mlp_n) one row's MLP gate and up (cuda_layer.cu; kept: a recorded step reads it) */
    size_t row_mlp_n;
    /* staged attend lists (attn_stage, cuda_attn.cu): slot i's fixed buffers, which a recorded
     * attention over lists reads when it runs; (n_lslot) */
    cu_lslot *lslot;
    int n_lslot;
    cu_wnext wnext[KS_CUDA_WNEXT]; /* per KV layer: its o-projection (see cu_wnext) */
} cuda_ctx;

#define KS_CUDA_LSLOT_HEADS 64      /* KV heads a staged list slot holds (KS_CUDA_ATTN_BYVAL_HEADS) */
#define KS_CUDA_LSLOT_SEG 6         /* words of a slot's row ranges (ks_attn_args.seg) after the counts and offsets:
                                       {b0, nb, arel, na, page, 0} (ks_cuda_attn_params.seg_dev) */
#define KS_CUDA_LSLOT_PTR (2 * KS_CUDA_LSLOT_HEADS + KS_CUDA_LSLOT_SEG) /* the lists' base address (2 words) */
#define KS_CUDA_LSLOT_WORDS (KS_CUDA_LSLOT_PTR + 2)

#define KS_CUDA_STEP_WORDS 8        /* int32 words of the decode graphs' step slot */
#define GRAPH_WS ((size_t)8 << 20) /* split-KV workspace of a recorded decode step */
#define KS_CUDA_COUNTERS 256        /* arrival counters of the primitives (cuda_ctx.zc) */

static inline cuda_ctx *CTX(ks_backend *b) { return (cuda_ctx *)b->ctx; }

/* cu_wnext: the slot of the layer whose keys are at k (its own, or the free one where it would
 * go; NULL when the table is full), then note its o-projection (a bf16 matrix) / read it back
 * (NULL if none) */
static inline cu_wnext *cu_wnext_slot(cuda_ctx *c, const void *k) {
    size_t h = (size_t)(((uintptr_t)k >> 4) * 0x9e3779b97f4a7c15ull >> 56) % KS_CUDA_WNEXT;
    for (int i = 0; i < KS_CUDA_WNEXT; i++, h = (h + 1) % KS_CUDA_WNEXT)
        if (c->wnext[h].k == k || !c->wnext[h].k) return &c->wnext[h];
    return NULL;
}
static inline void cu_wnext_note(cuda_ctx *c, const ks_kv_layer *L, const ks_weight *wo) {
    cu_wnext *e = L->k ? cu_wnext_slot(c, L->k) : NULL;
    if (!e || !wo || wo->type != KS_CUDA_BF16 || ((uintptr_t)wo->data & 15)) return;
    e->k = L->k;
    e->w = wo->data;
    e->bytes = (size_t)wo->rows * (size_t)wo->cols * 2;
}
static inline const cu_wnext *cu_wnext_of(cuda_ctx *c, const void *k) {
    const cu_wnext *e = k ? cu_wnext_slot(c, k) : NULL;
    return e && e->k == k ? e : NULL;
}

/* ---- cuda_ctx.cu: allocation and staging */

/* While a decode step is being recorded (graph_begin): a call or path that cannot be replayed
 * (it would bake per-token values into the graph, allocate, or wait) fails the recording. */
ks_status rec_fail(cuda_ctx *c, const char *what);
ks_status blas_status(cublasStatus_t s, const char *what);
/* Stream-ordered scratch from the pool (dev_alloc / dev_free); long-lived memory such as
 * weights and KV caches with plain cudaMalloc (raw_alloc / raw_free). */
ks_status dev_alloc(cuda_ctx *c, size_t bytes, const char *what, void **out);
void dev_free(cuda_ctx *c, void *p);
ks_status raw_alloc(cuda_ctx *c, size_t bytes, const char *what, void **out);
void raw_free(cuda_ctx *c, void *p);
/* A device copy of a host array; free with dev_free after the kernels that read it are queued. */
ks_status upload_tmp(cuda_ctx *c, const void *src, size_t bytes, const char *what, void **out);
/* d = +1 / -1: a graph that may launch handlers' blocks was made / freed (cuda_graph.cu); at 0
 * the blocks no user holds go back to the device. cuda_own_free_all: every block (destroy). */
void cuda_own_graphs(cuda_ctx *c, int d);
void cuda_own_free_all(cuda_ctx *c);

/* ---- cuda_kv.cu: used by the fused q|k|v projection (cuda_dense.cu) */

/* room for n more rows in every head (allocates L->n on first use) */
ks_status kv_reserve(ks_backend *b, ks_kv_layer *L, int n);
ks_status cu_kv_append(ks_backend *b, ks_kv_layer *L, const float *k, const float *v, const int32_t *pos, int n);

/* ---- each file's entries of the backend table (b->opts holds the options) */

void cuda_dense_install(ks_backend *b);
void cuda_layer_install(ks_backend *b); /* opts.fused, opts.mlp are read at each call */
void cuda_kv_install(ks_backend *b);
void cuda_attn_install(ks_backend *b);
/* backend.h attn_stage (cuda_attn.cu), installed with the graphs by cuda_graph_install */
ks_status cuda_attn_stage(ks_backend *b, int slot, const ks_kv_layer *L, const ks_attn_args *a);
void cuda_prof_install(ks_backend *b);
void cuda_graph_install(ks_backend *b); /* opts.graphs (and opts.fused: the plain ops don't record) */
void cuda_prims_install(ks_backend *b);

#endif
