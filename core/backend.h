/* backend.h — the interface every compute backend implements (CPU here, CUDA in kernels/).
 *
 * The engine (core/prefill.c, decode.c, forward.c) drives a forward pass only through these
 * calls, so the same engine runs on any backend. The forward is a few coarse ops (embed,
 * attn_in, attention, attn_out, mlp, head): each backend fuses what it likes inside them, so
 * the engine never asks what was fused. Contract:
 *   - Activation buffers come from ->alloc and live in backend memory (host for CPU, device
 *     for CUDA). Activations are float32 at the interface; a backend may keep weights and
 *     the KV cache in a narrower type (CUDA: bf16) and accumulate in fp32.
 *   - Weights are ks_weight handles created from safetensors tensors (any of F32/F16/BF16 on
 *     disk); the backend converts to its storage type once, at load.
 *   - Every call returns ks_status and records a message on failure; none aborts.
 *   - Shapes are given explicitly; row-major throughout. Positions are int32 host arrays
 *     mirrored by the backend as needed.
 */
#ifndef KS_BACKEND_H
#define KS_BACKEND_H

#include "config.h"
#include "prims.h"
#include "prims_page.h"
#include "safetensors.h"

typedef struct ks_backend ks_backend;
typedef struct ks_weight ks_weight;
typedef struct ks_graph ks_graph; /* a recorded decode step (graph_begin below) */
typedef struct ks_layer_w ks_layer_w; /* one layer's weights (core/model.h) */

/* ---- backend options: everything that chooses how a backend computes, per backend (two backends
 * of one process may differ). A backend ignores the fields that are not its own. The CLI maps
 * environment variables onto them (repl/env_opts.c); nothing below repl/ reads the environment. */
typedef enum ks_prefill_attn {
    KS_PREFILL_ATTN_AUTO = 0, /* CUDA: the planner's kernel (Hopper: wgmma where it takes the shape, else mma.sync) */
    KS_PREFILL_ATTN_MMA = 1   /* CUDA: always the mma.sync flash kernel (the reference the wgmma kernel is checked against) */
} ks_prefill_attn;

typedef struct ks_backend_opts {
    int n_threads;                /* CPU: threads of the backend's pool, <= 0 = the CPUs this process may run on */
    int device;                   /* CUDA: GPU index (0 = first) */
    ks_prefill_attn prefill_attn; /* CUDA: prefill attention kernel choice */
    int decode_kernels;           /* CUDA: 1 = the one-row kernels (gemv for one-row matmuls, the tensor-core
                                     decode attention); 0 = cuBLAS and the float32 split-KV attention */
    int fused;                    /* CUDA: 1 = the fused projections inside attn_in, attn_out and mlp (norm +
                                     q|k|v + RoPE + the cache row, the residual folded into the GEMM,
                                     norm + gate|up + SwiGLU); 0 = plain kernels one by one (A/B timing) */
    int mlp;                      /* CUDA: 1 = the bf16 prefill MLP inside ->mlp; 0 = float32 intermediates */
    int pdl;                      /* CUDA: 1 = programmatic dependent launch of the decode kernels (default 0) */
    int decode_splits;            /* CUDA: split-KV blocks of the tensor-core decode attention, 0 = automatic */
    int graphs;                   /* 1 = record decode steps as graphs where the backend can (CUDA); 0 = never */
    int profile;                  /* sessions on this backend: 0 off, 1 per-phase profile from backend marks,
                                     2 the same on the host clock (syncs); printed to stderr when a session ends */
    int verbose;                  /* 1 = say on stderr why a decode step ran without its graph */
} ks_backend_opts;

/* The defaults: all threads, device 0, the planner's kernels, everything fused, graphs on,
 * PDL off, automatic splits, no profile. */
ks_backend_opts ks_backend_opts_default(void);

/* The KV rows of one layer. Rows may differ between KV heads after per-head retention, so
 * each head has its own row count and position ids. Storage is backend memory. */
typedef struct ks_kv_layer {
    int n_kv_heads, head_dim;
    int capacity;        /* rows allocated per head */
    int *n;              /* (n_kv_heads) rows in use per head (host) */
    int32_t *pos;        /* (n_kv_heads, capacity) position id of each row (host) */
    void *k;             /* (n_kv_heads, capacity, head_dim) backend storage */
    void *v;             /* (n_kv_heads, capacity, head_dim) backend storage */
    void *pos_dev;       /* backend mirror of pos (NULL on CPU) */
} ks_kv_layer;

/* The activations of a forward over n rows: backend buffers the engine allocates (forward.h) and
 * the forward ops below read and write. Which op reads and writes which is said at each op; a
 * layer never needs more at once (QD = n_heads*head_dim, KD = n_kv_heads*head_dim).
 * (The attention output can't take q's buffer: attention reads q while writing it.) */
typedef struct ks_acts {
    float *x;     /* (n, dim) the residual stream */
    float *xn;    /* (n, max(dim, QD)) normalised rows; then the attention output */
    float *q;     /* (n, max(dim, QD)) queries; then scratch of attn_out and mlp */
    float *k, *v; /* (n, KD) keys and values of these rows */
    void *xn_bf16; /* NULL, or xn's n attention-output rows again as bf16 (n, QD), written by the
                      attn_decode_batch just before (its out_bf16): attn_out may read them instead of
                      converting xn. Only a batched decode step sets it, for its attn_out call. */
} ks_acts;

/* Attention description shared by prefill and decode. Query row i (of n) sits at position
 * qpos[i]; key row j of head kv is visible iff pos[kv][j] <= qpos[i] (and, with a sliding
 * window w > 0, qpos[i] - pos[kv][j] < w). Query head h reads KV head h / (n_heads/n_kv).
 * Optional per-KV-head index lists restrict the keys (TokenSelect's attend). */
typedef struct ks_attn_args {
    int n;                       /* query rows */
    int n_heads;                 /* query heads */
    const int32_t *qpos;         /* (n) query positions (host) */
    float scale;                 /* usually 1/sqrt(head_dim) */
    int window;                  /* sliding window, 0 = none */
    const int32_t *const *idx;   /* NULL, or (n_kv_heads) lists of row indices to attend (host) */
    const int *n_idx;            /* (n_kv_heads) lengths of those lists (host) */
    int idx_dev;                 /* 1: idx[h] point into ONE backend allocation that starts at the lowest
                                    of them (idx[h] - min idx: each head's offset; a shared list: all
                                    equal), already checked (or checked by the engine later: entries
                                    are in range whatever the check finds), read where they are */
    int renumber;                /* with idx: keys take positions 0..n_idx-1 (queries n_idx-n+i) */
    const ks_rope *rope;         /* non-NULL: q and the KV rows are pre-RoPE; rotate each query and
                                    key at its effective position (renumbered or stored) first */
    int rope_max_pos;            /* largest position of the request (longrope's factor choice) */
    int staged;                  /* 0, or 1 + the attn_stage slot that holds this attention's lists:
                                    while a step is recorded (graph_begin_seg), the attention reads
                                    them there when it runs (idx / n_idx unused) */
    int seg;                     /* 1 (backends with attn_ranges, device lists): each KV head's keys
                                    are the rows [seg_b0, seg_b1), then its list idx[h] (n_idx[h]
                                    entries, all in [seg_b1, seg_a0)), then the rows [seg_a0,
                                    seg_a1): the list the engine would otherwise build with
                                    page_rows, read in place (renumbered slots run over all three) */
    int32_t seg_b0, seg_b1, seg_a0, seg_a1;
    int32_t seg_page;            /* with seg, one decode row: 0, or P >= 1: the trailing range is the
                                    current page of P rows, seg_a0 = (seg_a1 - 1) / P * P and seg_a1
                                    the layer's rows (Quest's newest page). A staged slot keeps it so:
                                    at a replay the trailing range is the page of that step's newest
                                    row, its length (1 .. P) and the lists' counts following it; the
                                    split count is chosen for the longest (P rows), plain or staged,
                                    so both give the same bits */
    uint64_t idx_gen;            /* device lists: 0, or an id of their contents, unique on this backend
                                    (ks_backend.list_gen): the same id again means the same lists at the
                                    same addresses (a hint: the CUDA backend reads lists in place and
                                    needs none) */
} ks_attn_args;

/* The policy primitives on backend buffers: the meaning of core/prims.h, the same results
 * (index results identical, floats to rounding). Every pointer is backend memory; a result
 * core/prims.h returns through a host pointer (unique/union's count: int64, cosine: float)
 * is written to backend memory, so nothing waits for the device until it is downloaded.
 * gather's index check likewise goes to `err` (backend int64, set to -1 first; receives the
 * lowest bad position), NULL = unchecked (indices known valid). */
#define KS_BACKEND_PRIMS 1
typedef struct ks_backend_prims {
    ks_status (*scores)(ks_backend *b, const float *q, const int32_t *qpos, int64_t n_q_heads, int64_t m,
                        const void *k, int k_bf16, const int32_t *kpos, int64_t n_kv_heads, int64_t n, int64_t d,
                        const ks_scores_opts *opts, float *out);
    ks_status (*pool1d)(ks_backend *b, const float *x, int64_t rows, int64_t n, int64_t kernel, ks_pool_mode mode,
                        float *out);
    ks_status (*topk)(ks_backend *b, const float *x, int64_t rows, int64_t n, int64_t k, int64_t base,
                      ks_topk_order order, int32_t *out_idx, float *out_val,
                      const float *skip, /* ks_cpu_topk_masked: NULL or one backend float */
                      int64_t grow);     /* 0, or (one row, recording a handler: graph_begin_handler)
                                          * n follows the layer's rows as ks_scores_opts.grow says */
    ks_status (*argsort)(ks_backend *b, const float *x, int64_t n, int descending, int32_t *out_idx);
    ks_status (*sort_f32)(ks_backend *b, const float *x, int64_t n, int descending, float *out);
    ks_status (*sort_i32)(ks_backend *b, const int32_t *x, int64_t n, int32_t *out);
    ks_status (*rank)(ks_backend *b, const float *x, int64_t n, int32_t *out_rank);
    ks_status (*unique)(ks_backend *b, const int32_t *x, int64_t n, int32_t *out, int64_t *n_out);
    ks_status (*union_)(ks_backend *b, const int32_t *a, int64_t na, const int32_t *bb, int64_t nb, int32_t *out,
                        int64_t *n_out);
    ks_status (*concat_i32)(ks_backend *b, const int32_t *a, int64_t na, const int32_t *bb, int64_t nb, int32_t *out);
    ks_status (*concat_f32)(ks_backend *b, const float *a, int64_t na, const float *bb, int64_t nb, float *out);
    ks_status (*arange)(ks_backend *b, int64_t start, int64_t stop, int64_t step, int32_t *out);
    ks_status (*gather)(ks_backend *b, const float *x, int64_t n, int64_t d, const int32_t *idx, int64_t k,
                        float *out, int64_t *err);
    ks_status (*gather_i32)(ks_backend *b, const int32_t *x, int64_t n, const int32_t *idx, int64_t k, int32_t *out,
                            int64_t *err);
    ks_status (*softmax)(ks_backend *b, const float *x, int64_t rows, int64_t n, float *out);
    ks_status (*sum)(ks_backend *b, const float *x, int64_t rows, int64_t cols, int axis, float *out);
    ks_status (*mean)(ks_backend *b, const float *x, int64_t rows, int64_t cols, int axis, float *out);
    ks_status (*var)(ks_backend *b, const float *x, int64_t rows, int64_t cols, int axis, int64_t ddof, float *out);
    ks_status (*cosine)(ks_backend *b, const float *a, const float *bb, int64_t n, float *out);
    ks_status (*cosine_rows)(ks_backend *b, const float *a, const float *bb, int64_t rows, int64_t d, float *out);
    /* page primitives (core/prims_page.h; page_rows' err as gather's) */
    ks_status (*page_reduce)(ks_backend *b, const void *x, int x_bf16, int64_t n, int64_t h, int64_t d, int64_t row_stride,
                             int64_t head_stride, int64_t page, int64_t p0, int64_t p1, float *out_min, float *out_max,
                             float *out_mean, uint32_t *out_box); /* out_box alone: ks_cpu_page_box */
    ks_status (*bound_scores)(ks_backend *b, const float *q, int64_t n_q_heads, const float *lo, const float *hi,
                              const uint32_t *box, int64_t n, int64_t n_kv_heads, int64_t d, ks_bound_reduce reduce,
                              float *out); /* box (lo, hi NULL): ks_cpu_bound_scores_box */
    ks_status (*page_rows)(ks_backend *b, const int32_t *pages, int64_t lists, int64_t k, int64_t page, int64_t n,
                           int64_t before_begin, int64_t before_end, int64_t after_begin, int64_t after_end, int32_t *out,
                           int64_t *err);
    /* masks (core/prims.h): decisions made and followed where the data is */
    ks_status (*ge)(ks_backend *b, const float *x, int64_t n, double thr, float *out);
    ks_status (*where)(ks_backend *b, const float *mask, int64_t nm, const void *a, const void *bb, int64_t n, void *out);
} ks_backend_prims;

/* Bytes of a backend's own allocations (ks_backend.mem_stats). "fixed" is long-lived memory
 * (weights, KV cache, library workspaces), "scratch" activations and temporaries (CUDA: the
 * stream-ordered pool, counted in stream order). Host arrays (positions, index lists) and
 * what the runtime itself holds (CUDA context, cuBLAS handle) are not counted. */
typedef struct ks_mem_stats {
    size_t cur, fixed, scratch;          /* bytes now: all, long-lived, scratch */
    size_t peak;                         /* most bytes at once since the last reset */
    size_t peak_fixed, peak_scratch;     /* the split of that peak */
    size_t pool_used_high;               /* CUDA: the pool's own high-water mark of used bytes (driver); 0 on CPU */
    size_t pool_reserved_high;           /* CUDA: ... of bytes the pool reserved from the device; 0 on CPU */
} ks_mem_stats;

/* Pointer -> size bookkeeping behind mem_stats (core/cpu_backend.c; used by both backends).
 * Thread-safe. kind: 0 = fixed, 1 = scratch. add returns KS_ERR_OOM (nothing recorded) when
 * its table cannot grow; remove of an unknown pointer does nothing and returns 0. */
typedef struct ks_memtrack ks_memtrack;
ks_memtrack *ks_memtrack_create(void);
void ks_memtrack_free(ks_memtrack *t);
ks_status ks_memtrack_add(ks_memtrack *t, const void *p, size_t bytes, int kind);
size_t ks_memtrack_remove(ks_memtrack *t, const void *p);
/* Current and peak counters; reset_peak: the peak starts again from the current bytes. */
void ks_memtrack_stats(ks_memtrack *t, ks_mem_stats *out, int reset_peak);

struct ks_backend {
    const char *name;            /* "cpu", "cuda", "tp" */
    int host_memory;             /* 1: its buffers (activations, KV rows, weights) are host memory that the
                                    engine and policies may read in place (the CPU backend and the
                                    tensor-parallel composite of CPU ranks); 0: device memory */
    int attn_ranges;             /* 1: attention takes ks_attn_args.seg (row ranges around a device
                                    list) itself; 0: the engine builds the whole list first */
    uint64_t list_gen;           /* the engine's count of the device lists it keeps on this backend
                                    (ks_attn_args.idx_gen), never reused */
    void *ctx;
    ks_backend_opts opts;        /* what it was created with (CPU: n_threads the pool's real count) */

    /* ---- memory */
    void *(*alloc)(ks_backend *b, size_t bytes);            /* NULL + KS_ERR_OOM */
    void (*free)(ks_backend *b, void *p);
    ks_status (*upload)(ks_backend *b, void *dst, const void *src, size_t bytes);
    ks_status (*download)(ks_backend *b, void *dst, const void *src, size_t bytes);
    ks_status (*copy)(ks_backend *b, void *dst, const void *src, size_t bytes);
    ks_status (*sync)(ks_backend *b);

    /* ---- weights: rows [row0, row0+rows) of a 1-D or 2-D safetensors tensor */
    ks_status (*weight_create)(ks_backend *b, const ks_st_tensor *t, int64_t row0, int64_t rows, ks_weight **out);
    void (*weight_free)(ks_backend *b, ks_weight *w);
    /* a (rows, cols) weight of seeded uniform random values offset +- scale/2, never zero
     * (benchmarks with --random-weights; no checkpoint needed) */
    ks_status (*weight_random)(ks_backend *b, int64_t rows, int64_t cols, uint64_t seed, float scale, float offset,
                               ks_weight **out);
    /* Optional (NULL: not done). Lay the n weights (2-D, same cols and type) out as one
     * contiguous buffer in this order, each handle still valid and used as before, so an op can
     * take them as one matrix of their summed rows (the CUDA backend's n-row q|k|v: one GEMM
     * instead of three). An optimisation only: where it cannot (out of memory, mixed types) it
     * leaves them as they are and returns KS_OK. */
    ks_status (*weights_join)(ks_backend *b, ks_weight *const *ws, int n);

    /* ---- the forward pass, in the coarse steps of the picture (docs/DESIGN.md): embed, a
     * layer's attention input (attn_in), attention, its output projection (attn_out), its MLP
     * block (mlp), the head. Each takes the layer's weights and the model's sizes and works on
     * the activations in a (ks_acts above); how it computes inside (which kernels, what is
     * fused, what scratch it needs) is the backend's own choice, from its ks_backend_opts. */
    /* x (n, dim) = E[ids] (ids: (n) host); the forward passes a->x */
    ks_status (*embed)(ks_backend *b, float *x, const ks_weight *E, const int32_t *ids, int n, int dim);
    /* A layer's attention input: a->xn = rmsnorm(a->x, W->attn_norm), then a->q (n, n_heads*head_dim)
     * = xn Wq^T [+ bq] and a->k, a->v (n, n_kv_heads*head_dim) likewise. rotate: q and k are then
     * rotated at positions pos (n, host) by c->rope (max_pos: the request's largest position,
     * longrope's factor choice); 0: they stay pre-RoPE. L non-NULL: then the rows are appended to
     * L as kv_append(L, a->k, a->v, pos, n) does. q, k and v are written in every case (policy
     * events read them). */
    ks_status (*attn_in)(ks_backend *b, const ks_layer_w *W, const ks_config *c, const ks_acts *a, int n,
                         const int32_t *pos, int max_pos, int rotate, ks_kv_layer *L);
    /* a->x += a->xn Wo^T [+ bo]: the attention output (n, n_heads*head_dim) in xn projected back
     * and added to the residual stream. a->q is scratch. */
    ks_status (*attn_out)(ks_backend *b, const ks_layer_w *W, const ks_config *c, const ks_acts *a, int n);
    /* A layer's MLP block: a->x += W_down (silu(W_gate h) * (W_up h)), h = rmsnorm(a->x, W->ffn_norm)
     * for each of the n rows. a->xn and a->q are scratch. */
    ks_status (*mlp)(ks_backend *b, const ks_layer_w *W, const ks_config *c, const ks_acts *a, int n);
    /* logits (n, vocab, backend memory) = lm_head rmsnorm(rows row .. row+n-1 of a->x, norm): the
     * last prompt row (n = 1), one decode row, or the n rows of a batched decode step (the
     * lm_head read once for all). a->xn (n rows of dim) is scratch. */
    ks_status (*head)(ks_backend *b, const ks_weight *norm, const ks_weight *lm_head, const ks_config *c,
                      const ks_acts *a, int row, int n, float *logits);
    /* rows: out (k, d) = x[idx] (idx: (k) host, ascending or not; out may be x: propagate) */
    ks_status (*gather_rows)(ks_backend *b, float *out, const float *x, const int32_t *idx, int k, int d);
    /* in place: x (n, n_heads, head_dim) rotated by positions pos (n, host) with rotate-half
     * pairing. The forward never calls it (attn_in rotates); it is the ks.rope policy primitive. */
    ks_status (*rope)(ks_backend *b, float *x, int n, int n_heads, const int32_t *pos, const ks_rope *r, int max_pos);

    /* ---- KV cache */
    ks_status (*kv_alloc)(ks_backend *b, ks_kv_layer *L, int capacity);
    void (*kv_free)(ks_backend *b, ks_kv_layer *L);
    /* append rows: k, v (n, n_kv_heads, head_dim) float32 with positions pos (n) to every head */
    ks_status (*kv_append)(ks_backend *b, ks_kv_layer *L, const float *k, const float *v, const int32_t *pos, int n);
    /* keep only rows idx[h][0..cnt[h]) of each head (unique; in the order given: ascending keeps
     * the rows' order, any other order moves them so, e.g. a KV ring put back in order), compacting
     * in place; with shrink, reallocate to the new size so the memory is really returned */
    ks_status (*kv_retain)(ks_backend *b, ks_kv_layer *L, const int32_t *const *idx, const int *cnt, int shrink);
    /* attention of q (n, n_heads, head_dim) over the layer's rows -> out (n, n_heads*head_dim) */
    ks_status (*attention)(ks_backend *b, float *out, const float *q, const ks_kv_layer *L, const ks_attn_args *a);
    /* Check index lists in backend memory without waiting: `rows` lists of k entries, row-major
     * (lists (rows, k)); list r must be strictly ascending with values in [0, lim[r]) (lim: host,
     * rows entries). *slot (backend memory, 8 bytes) is first set to all ones, then receives the
     * minimum over the bad entries of (r*k + i) << 34 | why << 32 | (uint32)value, why = 1 out of
     * range, 2 below its predecessor, 3 equal to it (deterministic: the first bad entry in list
     * order); every out-of-range entry is then replaced by 0 (so a reader stays in bounds).
     * rows * k < 2^30. KS_ERR_UNSUPPORTED (nothing queued): more rows than the backend takes
     * by value; the caller checks on the host. NULL = none (the engine checks on the host). */
    ks_status (*check_idx)(ks_backend *b, int32_t *lists, int rows, int k, const int *lim, uint64_t *slot);

    void (*destroy)(ks_backend *b);

    /* ---- policy primitives on backend buffers; NULL on the CPU (use core/prims.h directly) */
    const ks_backend_prims *prims;

    /* ---- counters (bench): FLOPs of every matmul since the last reset; with count_stats also
     * the seconds spent in them (a timed matmul synchronises) */
    double stat_matmul_s, stat_matmul_flop;
    int count_stats;              /* 0: don't time */

    /* ---- memory accounting (optional, NULL = none): bytes of the backend's own allocations now
     * and at their peak; reset_peak starts a new peak from now (bench: once per row) and lets
     * a caching allocator return what it caches (CUDA: waits for the stream, trims the pool) */
    void (*mem_stats)(ks_backend *b, ks_mem_stats *out, int reset_peak);

    /* ---- measured ceilings for the bench (optional, NULL = not measured): the rate of a large
     * GEMM in the weights' precision through the vendor library (TFLOP/s) and of a large
     * device-to-device copy (GB/s, bytes read + written), measured now on this device */
    ks_status (*ceilings)(ks_backend *b, double *gemm_tflops, double *copy_gbs);

    /* ---- profiling timestamps (optional; NULL = the engine syncs and reads the host clock).
     * prof_mark records a timestamp in the backend's execution order (CUDA: an event on the
     * stream; nothing waits); the interval from the previous mark to this one is booked to
     * `tag` (0 <= tag < KS_PROF_TAGS; tag < 0: a start mark, the interval is dropped).
     * prof_collect waits for the marks, adds the seconds of each tag's intervals to
     * sec[0..n_tags) and forgets them. Errors: KS_ERR_DEVICE / KS_ERR_OOM with a message. */
    ks_status (*prof_mark)(ks_backend *b, int tag);
    ks_status (*prof_collect)(ks_backend *b, double *sec, int n_tags);

    /* ---- page-locked host memory (optional; NULL = malloc / free) for host buffers that are
     * downloaded into every step (the logits): CUDA's cudaMallocHost, so a download is one DMA
     * (several times faster than into pageable memory: bench/NOTES.md). */
    void *(*host_alloc)(ks_backend *b, size_t bytes);
    void (*host_free)(ks_backend *b, void *p);

    /* ---- decode-step graphs (optional; NULL = none; CUDA: CUDA graphs). Between graph_begin
     * and graph_end the backend records the device work of the calls made in between instead of
     * running it; their host effects still happen (attn_in with L books its row in L->n and
     * L->pos). What can be recorded is one decode step: embed of one id, attn_in with rotate and
     * L (the cache row written by the projection), one-row attention over the cache, attn_out,
     * mlp and head; a backend that cannot record under some of its options leaves these NULL.
     * The per-token values (the token id, the position, each head's row count) are read from a
     * device slot when the graph runs:
     * graph_run(g, id, pos) sets that slot (id, pos, delta = pos - the position given to
     * graph_begin) and launches the whole step with one call. Row counts run as recorded + delta
     * and the new row goes to row (recorded count + delta). A KV ring's step (core/policy.h)
     * records attn_in on a view of the layer whose counts name the row it overwrites, inside
     * the layer: that row + delta is written, and the attention over the layer, whose newest
     * row is then not its last, keeps the recorded counts. The caller guarantees that at every
     * run each layer the step touched holds exactly that many rows per head with room for one
     * more (a ring layer: the recorded rows, the row written inside them), in the same storage,
     * and that the buffers passed while recording are still allocated; it downloads the results
     * itself.
     * graph_end: KS_ERR_UNSUPPORTED (message set) when a call between could not be recorded
     * (that call returned KS_ERR_UNSUPPORTED too); nothing ran and *out is NULL; the caller
     * undoes the host effects. graph_run: KS_ERR_UNSUPPORTED when the graph went stale inside the
     * backend (a device table it read was replaced); nothing ran, record anew. */
    ks_status (*graph_begin)(ks_backend *b, int32_t id, int32_t pos);
    ks_status (*graph_end)(ks_backend *b, ks_graph **out);
    ks_status (*graph_run)(ks_backend *b, ks_graph *g, int32_t id, int32_t pos);
    void (*graph_free)(ks_backend *b, ks_graph *g);
    /* Segments of one step (optional; NULL = none): a step whose decode-time policy handler
     * runs on the host between layers is recorded as several graphs, the first begun with
     * graph_begin and run with graph_run (which sets the step slot), each later one begun with
     * graph_begin_seg and launched with graph_launch, after the previous one was launched.
     * Neither touches the slot: a segment's kernels read what the step's graph_run set, so
     * segments run in the order they were recorded within one step, with plain calls (the
     * handler's own work) allowed between them. graph_end and graph_free serve both. The same
     * errors as graph_begin and graph_run. */
    ks_status (*graph_begin_seg)(ks_backend *b);
    ks_status (*graph_launch)(ks_backend *b, ks_graph *g);
    /* A segment that records a decode handler's device work (optional; NULL = handlers are not
     * recorded: policy.h ks_action_replay): begun as graph_begin_seg, with two differences while
     * it records. Memory allocated belongs to the recording: it stays allocated (and its
     * addresses valid for every launch) until both its user freed it and the graph was freed
     * (graph_free). Primitives given a growth (ks_scores_opts.grow, topk's grow) read, when the
     * graph runs, delta = the rows added since this recording (the step slot's delta less the
     * one at this recording) and work on their recorded sizes + delta. The caller replays it
     * only where delta <= that growth. */
    ks_status (*graph_begin_handler)(ks_backend *b);
    /* ---- one graph of a step's segments (optional; NULL = none): *out runs segs[0 .. n) in
     * that order as one launch, through graph_run (which sets the step slot as it would for
     * segs[0]); freed with graph_free, the segments stay the caller's. For a step whose every
     * layer's attend is held (no host work between the segments: core/decode.c). *out on entry:
     * NULL, or an earlier join the caller gives up (it is the backend's from then on, whatever
     * the result): the backend may make the new join by updating it (CUDA: where the graphs
     * differ only in their kernels' arguments, much cheaper than a new one), else frees it. The
     * same errors as graph_end; KS_ERR_UNSUPPORTED (message set) where these cannot be joined. */
    ks_status (*graph_join)(ks_backend *b, ks_graph *const *segs, int n, ks_graph **out);
    /* Lists for a recorded attention (optional; NULL = a step whose handler attends is not
     * recorded): point slot `slot`'s fixed descriptor at the one-row attend lists of `a` (device
     * lists, a->idx_dev, checked against L's rows) where they are: their counts, offsets and
     * address, queued on the stream, outside a recording. A recording's attention with
     * a->staged = slot + 1 reads the slot, and through it the lists, when it runs, so each replay
     * of a step stages its lists first, and the caller keeps the lists alive (stream-ordered)
     * until the segment that reads them was launched. With row ranges (a->seg) the slot keeps
     * the trailing range relative to the query position (a->qpos[0] + 1), so the same lists and
     * ranges one step later, the trailing range moved by the step's row, need no staging again
     * (core/decode.c's joined steps count on it). KS_ERR_UNSUPPORTED: these lists cannot be
     * staged (nothing queued). */
    ks_status (*attn_stage)(ks_backend *b, int slot, const ks_kv_layer *L, const ks_attn_args *a);

    /* ---- batched decode attention (optional; NULL = kv_append and attention per session). One
     * decode row for each of n sessions, all in one go: for each i, kv_append(L[i], k[i], v[i],
     * &pos[i], 1), then out[i] (n_heads*head_dim) = attention of q[i] over all of L[i]'s rows with
     * n = 1, qpos = &pos[i], scale and window and nothing else (no index lists, no pre-RoPE).
     * q, k, v, out: host arrays of n backend pointers; L: n distinct layers. out_bf16: NULL, or
     * (when out[i] = out[0] + i n_heads*head_dim) backend memory for the same n rows as bf16,
     * which the call then fills too (the o-projection's GEMM input: ks_acts.xn_bf16). Used by a
     * batched decode step (core/decode_batch.c) for its sessions without a decode-time policy. */
    ks_status (*attn_decode_batch)(ks_backend *b, int n, ks_kv_layer *const *L, const float *const *q,
                                   const float *const *k, const float *const *v, const int32_t *pos, int n_heads,
                                   float scale, int window, float *const *out, void *out_bf16);

    /* ---- greedy ids of a batched decode step (optional; NULL = the engine takes the argmax of
     * the logits on the host: in place where host_memory, else after one download of all rows).
     * out[r] (host, rows entries) = the lowest index of the largest of x[r][0 .. cols) (x: backend
     * memory, (rows, cols) float32); NaN is never the largest, except that a row whose element 0
     * is NaN gives 0 (ks_sample's greedy rule, core/sample.c). Returns once out is written (one
     * wait for the device). Reference: ks_argmax_rows_ref (core/decode_batch.h). */
    ks_status (*argmax_rows)(ks_backend *b, const float *x, int rows, int cols, int32_t *out);
};
#define KS_PROF_TAGS 64

/* A backend by name: "cpu" (NULL too) or "cuda" (when built with CUDA), with options (opts NULL =
 * ks_backend_opts_default()); ks_backend_create uses the defaults. */
ks_status ks_backend_create_opts(const char *name, const ks_backend_opts *opts, ks_backend **out);
ks_status ks_backend_create(const char *name, ks_backend **out);
/* Frees a backend made by any ks_*backend_create* (it calls the backend's own ->destroy); NULL
 * does nothing. Everything allocated on it must be freed first. */
void ks_backend_free(ks_backend *b);

/* The CPU backend (float32, fixed-order products: bit-identical results for identical rows on any
 * CPU and thread count; its own sleeping thread pool of opts->n_threads threads, <= 0: the CPUs
 * this process may run on). It reads n_threads, profile and verbose; opts NULL = the defaults.
 * The created backend's opts.n_threads is the pool's real thread count. */
ks_status ks_cpu_backend_create(const ks_backend_opts *opts, ks_backend **out);
/* The CPU backend's primitive table (core/cpu_prims.c): core/prims.c on host buffers, or NULL. */
const ks_backend_prims *ks_cpu_prims(void);

#endif
