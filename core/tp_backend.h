/* tp_backend.h — tensor parallelism: one ks_backend made of N rank backends (issue 17).
 *
 * The engine and the policies see one backend; inside it every coarse forward op runs on N
 * ranks with the Megatron split of each layer:
 *   attn_in    column-parallel: rank r holds the rows of Wq (and bq) of its query heads
 *              [r*H/N, (r+1)*H/N) and of Wk, Wv (bk, bv) of its KV heads [r*Hkv/N, (r+1)*Hkv/N);
 *              each rank norms the whole x itself (the norm weight is replicated), projects,
 *              rotates and appends its KV heads' rows to its own KV layer.
 *   attention  per rank over its heads and its own KV rows (query head h reads KV head
 *              h / (H/Hkv), which is on the same rank because both divide by N).
 *   attn_out   row-parallel: rank r holds the columns of Wo of its query heads and computes a
 *              partial (n, dim); an all-reduce (sum) of the partials is added to x. The bias bo,
 *              if any, is added once, by rank 0.
 *   mlp        Wgate, Wup column-parallel over the ffn units [F*r/N, F*(r+1)/N), Wdown
 *              row-parallel over the same units; an all-reduce (sum) of the partials.
 *   embed      vocab-parallel: rank r holds the rows [V*r/N, V*(r+1)/N) of the table and
 *              writes the rows of the ids in its range, zeros elsewhere; all-reduce (sum).
 *   head       rank r holds the same vocab rows of lm_head; its logits gathered into place.
 * The KV cache is split by KV heads: rank r's KV layer holds only its heads' rows. The engine's
 * ks_kv_layer keeps the whole per-head row counts and positions (the engine and the policies
 * index them as on one backend) and, where the policies need it, a whole copy of the keys and
 * values (the view the policy events read); the rank layers hang off ks_kv_layer.pos_dev.
 *
 * Two kinds of ranks share the weights, the split and this interface:
 *
 * CPU ranks (ks_tp_backend_create; tp_backend.c) are CPU backends (simulated ranks in one
 * process, run one after another), each KV layer has its whole host view, and the all-reduce is a host sum in fixed rank order ((p0 + p1) + p2) + ..., so a run gives
 * the same bits on every machine and thread count. The composite's own buffers (activations,
 * the KV view, logits) are host memory (ks_backend.host_memory = 1, so lua/ and bench.c read
 * them in place; its name is "tp") and its policy primitives are the CPU table. Results
 * equal the unsplit CPU backend's up to float summation order: embed, the head's logits (each
 * a whole dot product on one rank) and attention are bit-identical for identical inputs; the
 * two reductions per layer differ from the unsplit dot products by summation order only.
 *
 * Device ranks (ks_tp_backend_create_dev; tp_device.c) are CUDA backends, rank r on GPU
 * device + r, driven from one host thread (every call queued on the ranks' own streams), with
 * every collective through NCCL on device buffers (ks_tp_dev_ops, kernels/tp_nccl.cu); no host
 * round trip in the dense path. Each pointer the engine holds stands for one buffer per rank of
 * the same size (x replicated: the all-reduce hands every rank the same bits; q, k, v and the
 * attention output hold each rank's heads packed, so a pointer into the middle of those - a
 * batched decode step's later rows - is refused). attn_out and mlp: rank 0 adds its partial to
 * the real x (with bo), the other ranks theirs to zeros (mlp: ks_tp_dev_ops.mlp_partial, the
 * same kernels without the residual); one float32 all-reduce each. embed: each rank its ids'
 * rows, zeros elsewhere; all-reduce. head: each rank its vocab slice, copied into place on rank
 * 0 (the engine downloads logits from rank 0). The engine's download reads rank 0.
 *   Policies, the simplest correct design: after ks_session_set_policy (ks_tp_want_views,
 *   sticky) every activation buffer gets a whole copy on rank 0 and every new KV layer a whole
 *   bf16 view on rank 0 (a CUDA KV layer of all heads). Gathered per layer: q, k, v (n rows of
 *   (H + 2 Hkv) * head_dim floats) from every rank into the whole copies (peer copies through
 *   a staging buffer on rank 0), the new KV rows appended to the view, x copied after each
 *   all-reduce (n * dim floats, on rank 0). Cost: rank 0 holds a second copy of the whole KV
 *   cache (tokens * layers * 2 * Hkv * head_dim * 2 bytes: 10.7 GB at 32K on the 70B shape) and
 *   of the activations, and the copies run on rank 0's stream before the event. The composite
 *   has no device primitive table, so the policy events read host copies of those views
 *   (lua/events.c, as for a backend without primitives); actions apply on every rank (retain:
 *   each rank its KV heads' lists; attend: the lists of its heads; propagate: every copy of x).
 *   Without a policy nothing is gathered and the whole layer keeps only row counts and
 *   positions (host). ks_tp_host_ops runs this same code on CPU ranks (host buffers, the views
 *   float32 and read in place) for the CPU tests.
 *
 * Refused (KS_ERR_UNSUPPORTED, at ks_tp_shard_model): n_kv_heads not divisible by N (KV heads
 * are not replicated). N must be 2..KS_TP_MAX on CPU ranks, 1..KS_TP_MAX on device ranks. */
#ifndef KS_TP_BACKEND_H
#define KS_TP_BACKEND_H

#include "backend.h"

#define KS_TP_MAX 8

typedef struct ks_model ks_model;

/* ---- device ranks. The collectives and the few device steps the composite needs beyond the
 * ranks' own backend tables, implemented over NCCL and the CUDA runtime in kernels/tp_nccl.cu
 * (built only with CUDA=1; ks_tp_nccl_ops() is NULL-free there and absent from CPU builds).
 * Every call is queued on the ranks' own streams (nothing waits) and returns a status. */
typedef struct ks_tp_dev ks_tp_dev;
typedef struct ks_tp_dev_ops {
    const char *rank_backend; /* the ranks' backend: "cuda" (NCCL), "cpu" (ks_tp_host_ops: tests) */
    /* One communicator per rank over ranks[0..n) (CUDA backends; rank r on its opts.device),
     * their streams, peer access between their memory pools. */
    ks_status (*init)(ks_backend *const *ranks, int n, ks_tp_dev **out);
    void (*fini)(ks_tp_dev *d);
    /* Make rank r's device current (before any call of rank r's backend). */
    void (*use)(ks_tp_dev *d, int r);
    /* In place on every rank: buf[r] (count floats) = the sum over ranks of buf[*] (ncclAllReduce,
     * float32; every rank receives the same bits). */
    ks_status (*all_reduce)(ks_tp_dev *d, float *const *buf, size_t count);
    /* Onto rank 0: dst (rows, ld) columns [col0[r], col0[r] + w[r]) = src[r] (rows, w[r]) of rank r,
     * after the work queued on each rank so far; rank r's later work waits for the copies. */
    ks_status (*gather_cols)(ks_tp_dev *d, float *dst, size_t ld, float *const *src, int rows, const size_t *col0,
                             const size_t *w);
    /* bytes of rank r's p = 0 */
    ks_status (*zero)(ks_tp_dev *d, int r, void *p, size_t bytes);
    /* The MLP of backend.h on rank backend rb with the residual left out: a->xn = rmsnorm(a->x),
     * then a->x = W_down (silu(W_gate xn) * (W_up xn)) (the partial product alone; the same
     * kernels as rb->mlp under rb's options). a->q is scratch. */
    ks_status (*mlp_partial)(ks_backend *rb, const ks_layer_w *W, const ks_config *c, const ks_acts *a, int n);
} ks_tp_dev_ops;
const ks_tp_dev_ops *ks_tp_nccl_ops(void); /* kernels/tp_nccl.cu (CUDA builds only) */
/* The same services on CPU rank backends in host memory (core/tp_device.c): the device ranks'
 * code path run without a GPU, so CI tests its buffers, views, KV bookkeeping and collectives
 * (all-reduce: a host sum in rank order, so the same bits on every machine). */
const ks_tp_dev_ops *ks_tp_host_ops(void);

/* A composite of n_ranks (1..KS_TP_MAX) device ranks: backends dev->rank_backend (CUDA: on GPUs
 * opts->device + r), each made with opts, collectives through dev (ks_tp_nccl_ops()). n_ranks = 1 is the plain CUDA
 * backend behind the composite (its test: the same outputs). Then as ks_tp_backend_create. */
ks_status ks_tp_backend_create_dev(int n_ranks, const ks_backend_opts *opts, const ks_tp_dev_ops *dev, ks_backend **out);

/* Device ranks: keep the policy views from now on (sticky; ks_session_set_policy calls it): every
 * activation buffer and KV layer allocated after it also gets its whole copy on rank 0 that the
 * policy events read (tp_backend.h above: what is gathered and its cost). No-op on CPU ranks
 * (their views always exist) and on other backends. */
void ks_tp_want_views(ks_backend *b);

/* Device ranks with the views on: KS_OK when every layer of kv (n_layers) either holds nothing
 * yet or has its view; else KS_ERR_UNSUPPORTED with a one-line message (the session's KV was
 * built before a policy was set on the model: it has no whole copy for the policy to read; reset
 * the session). KS_OK on CPU ranks, one rank and other backends. */
ks_status ks_tp_views_ready(ks_backend *b, const ks_kv_layer *kv, int n_layers);

/* A composite of n_ranks CPU rank backends, each created with opts (NULL = the defaults; each
 * rank gets its own pool of opts->n_threads threads; the ranks run one after another). Weights
 * created on it are views of their tensors until ks_tp_shard_model cuts them into the ranks'
 * shards; no forward op runs before that. Free with ks_backend_free. */
ks_status ks_tp_backend_create(int n_ranks, const ks_backend_opts *opts, ks_backend **out);

/* Cut every weight of m (loaded or random on the composite) into its ranks' shards by its role
 * (the split above) and release the whole copies the composite held (random weights). Checks
 * the shape first: n_kv_heads % N != 0 is KS_ERR_UNSUPPORTED with a one-line message. */
ks_status ks_tp_shard_model(ks_backend *b, ks_model *m);

/* The number of ranks of b, or 0 when b is no tensor-parallel composite. */
int ks_tp_ranks(const ks_backend *b);

/* Bytes of rank r (0 <= r < ks_tp_ranks(b)): its backend's own allocations (its weight shards,
 * its KV heads' rows, its scratch) plus the float32 shard copies the composite keeps for it
 * (the CPU backend reads float32 tensors in place, so those copies are the shards' storage).
 * KS_ERR_ARG for a bad rank or a backend that is no composite. */
ks_status ks_tp_rank_mem_stats(ks_backend *b, int r, ks_mem_stats *out, int reset_peak);

/* Bytes the composite itself holds on the host: the whole activations the engine allocates and
 * the whole KV view of the policy events (a simulation cost; device ranks keep no view). */
ks_status ks_tp_view_mem_stats(ks_backend *b, ks_mem_stats *out, int reset_peak);

/* Rank r's KV rows of layer L per KV head of that rank (Hkv/N of them): *n_heads receives the
 * count, the return value points to the rank's row counts (NULL when L holds no rows yet). For
 * the tests and the memory report: the KV cache split by heads. */
const int *ks_tp_kv_rank_rows(const ks_kv_layer *L, int r, int *n_heads);

#endif
