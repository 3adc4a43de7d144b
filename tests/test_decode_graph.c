/* test_decode_graph.c — core/decode.c's recorded decode steps on the CPU: the whole-step graph
 * (no decode handler) and the segments of a step whose handler runs between layers, with the
 * lists of attending handlers staged (backend.h graph_begin .. attn_stage), against plain steps,
 * bit for bit.
 *
 * The CPU backend records nothing, so the test wraps it in an emulated recorder ("graph-cpu"):
 * between graph_begin (or graph_begin_seg) and graph_end the forward ops are recorded with their
 * arguments and not run, with the host effects the contract names (attn_in books its row); a run
 * replays them with the per-token values taken from the step slot as a CUDA graph's kernels take
 * them: the token id and position of graph_run, each layer's row at (recorded count + delta),
 * the attention over (recorded count + delta) rows, or over the lists attn_stage copied into the
 * layer's slot. Any other backend call while recording fails the recording (as an allocation
 * does on CUDA). What this checks is the engine's side: which steps replay, which segments, the
 * bookkeeping of the rows, the staging, the fall back to plain launches at the first layer whose
 * handler asks for something else, and re-recording; the CUDA side is tests/cuda/
 * test_cuda_policies.c ("decode handler in segments").
 *   decode_graph_whole_step         no policy: all but the first two steps replay, logits equal
 *   decode_graph_segments_noop      a handler that asks for nothing
 *   decode_graph_segments_actor     one that attends every 7th step and retains once (falls back,
 *                                   keeps the recording, re-records after the retain)
 *   decode_graph_staged_tokenselect_hit, decode_graph_staged_tokenselect, decode_graph_staged_tokenselect_cache,
 *   decode_graph_staged_quest
 *                                   TokenSelect (its hit path, its default) and Quest: their lists
 *                                   staged at every layer that attends
 *   decode_graph_recording_fails    a recording that calls an op the recorder refuses: the step
 *                                   runs plain, after two failures the session stops trying, and
 *                                   the first failure is said once (KS_LOG_INFO, with its reason)
 *   decode_graph_says_why_once      lists the backend refuses to stage: said once, with the layer
 *   decode_graph_bench_counts_replays  ks_bench_run's timed and replayed decode steps (graph%)
 *   decode_graph_held_steps         held attends (policy.h ks_action_hold): a step whose every
 *                                   layer is held is the segments joined into one graph
 *                                   (graph_join); one unheld layer or none held: no join
 *   decode_graph_join_refused       a backend that cannot join: said once, segments launched
 *   decode_graph_recorded_quest     Quest recorded within its current page (ks_action_replay_within,
 *                                   ks_attn_args.seg_page): replayed until the page fills
 *   decode_graph_recorded_tokenselect  recorded handlers (policy.h ks_action_replay): TokenSelect's default
 *                                   recorded with the step on the emulated device and replayed without Lua;
 *                                   not with trace, nor on a recorder that cannot record handlers
 *   decode_graph_recorded_tokenselect_cache  its selection cache decided on the device, recorded too:
 *                                   replayed without Lua, hits and misses as plain steps count them
 *   decode_graph_recorded_regrows   a decode longer than a recording's growth: recorded anew
 *   decode_graph_recorded_own_policy  a policy written in the test that declares replay: replayed
 *   decode_graph_recorded_refused   what a recording refuses (a pooled vote, an absolute end): said once,
 *                                   the handler run outside it, steps right */
#include "engine.h"
#include "forward.h"
#include "ktest.h"
#include "ks_lua.h"
#include "kvsieve.h"
#include "model.h"
#include "seg_policies.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TINY "models/kvsieve-tiny"
#define MAXH 64

/* ================================================================ the recorder */

enum { OP_EMBED, OP_ATTN_IN, OP_ATTENTION, OP_ATTN_OUT, OP_MLP, OP_HEAD, OP_SCORES, OP_TOPK, OP_CALL };

/* A recorded handler's fixed-size call on the emulated device (OP_CALL: TokenSelect's selection
 * cache): its entry and arguments, run again as they were at every replay. */
enum { C_COPY, C_ROPE, C_COSINE, C_COSINE_ROWS, C_GE, C_WHERE, C_CONCAT_F32, C_SUM, C_BOUND, C_PAGE_ROWS };
typedef struct call_op {
    int fn;
    const void *x, *y, *m, *z;
    void *out;
    int64_t n, n2, rows, cols, hq, hkv, d, page, r[4];
    double thr;
    int axis, nh, max_pos;
    int32_t pos;
    ks_rope rope;
} call_op;

/* A recorded handler's primitive call (OP_SCORES, OP_TOPK: on the emulated device, whose table
 * the recorder wraps while it lives): its arguments, the rotation's table copied, and the step
 * slot's delta at the recording (the growth at a run is the slot's delta less it). */
typedef struct prim_op {
    ks_scores_opts so;
    float rinv[256];
    const float *q, *x, *skip;
    const int32_t *qpos, *kpos;
    const void *k;
    int k_bf16, order;
    int64_t hq, m, hkv, n, d, rows, k_top, base, grow;
    float *out, *ov;
    int32_t *oi;
    int32_t goff;
} prim_op;

typedef struct rec_op {
    int kind;
    float *out;
    const float *in;
    const ks_weight *w0, *w1;
    const ks_layer_w *W;
    const ks_config *c;
    const ks_acts *a;
    ks_kv_layer *L;
    int n, dim, rotate, row;
    int cnt[MAXH];      /* attn_in: the rows before the append; attention: the rows it reads */
    ks_attn_args aa;    /* attention: qpos, idx and n_idx replaced at the run */
    prim_op pr;         /* OP_SCORES, OP_TOPK */
    call_op call;       /* OP_CALL */
} rec_op;

struct ks_graph {
    rec_op *ops;
    int n, cap;
    int32_t pos0;
    int joined; /* made by graph_join */
};

typedef struct lslot {
    int32_t *list[MAXH];
    const int32_t *at[MAXH]; /* device lists (idx_dev): read where they are when the attention runs, as
                                CUDA's staged slot does (a recorded handler rewrites them at every replay) */
    int inplace;
    int cnt[MAXH];
    int renumber, hkv;
    int seg, b0, b1, arel, na; /* row ranges around the lists (attn_ranges): the trailing one at
                                  (query position + 1 + arel), na rows, as CUDA's staging keeps it; */
    int page;                  /* with page > 0 (seg_page): the page of the row before (query position
                                  + 1 + arel), its end */
} lslot;

static struct {
    ks_backend w;     /* the wrapper the model runs on */
    ks_backend *cpu;  /* the real backend */
    int rec, failed, refuse_head, refuse_stage, refuse_join;
    int own;          /* recording a decode handler (graph_begin_handler): allocations are the recording's */
    ks_graph *cur;
    int32_t id, pos, delta; /* the step slot */
    lslot slot[64];
    long runs, launches, stages, joins, joined_runs;
    long rejoins; /* joins that were given an earlier join to update (graph_join's *out) */
} R;

static int rec_push(const rec_op *o) {
    ks_graph *g = R.cur;
    if (g->n == g->cap) {
        int cap = g->cap ? 2 * g->cap : 64;
        rec_op *p = realloc(g->ops, sizeof *p * cap);
        if (!p) { R.failed = 1; return -1; }
        g->ops = p;
        g->cap = cap;
    }
    g->ops[g->n++] = *o;
    return 0;
}

static ks_status refuse(const char *what) {
    R.failed = 1;
    return ks_errorf(KS_ERR_UNSUPPORTED, "graph-cpu: %s cannot be recorded", what);
}

static ks_status w_embed(ks_backend *b, float *x, const ks_weight *E, const int32_t *ids, int n, int dim) {
    if (!R.rec) return R.cpu->embed(R.cpu, x, E, ids, n, dim);
    if (n != 1) return refuse("an embed of several ids");
    rec_op o = {.kind = OP_EMBED, .out = x, .w0 = E, .n = n, .dim = dim};
    return rec_push(&o) ? KS_ERR_OOM : KS_OK;
}

static ks_status w_attn_in(ks_backend *b, const ks_layer_w *W, const ks_config *c, const ks_acts *a, int n, const int32_t *pos,
                           int max_pos, int rotate, ks_kv_layer *L) {
    if (!R.rec) return R.cpu->attn_in(R.cpu, W, c, a, n, pos, max_pos, rotate, L);
    if (n != 1 || !L || L->n_kv_heads > MAXH) return refuse("attn_in without its cache row");
    rec_op o = {.kind = OP_ATTN_IN, .W = W, .c = c, .a = a, .L = L, .n = n, .rotate = rotate};
    for (int h = 0; h < L->n_kv_heads; h++) { /* the host effect: the row is booked */
        if (L->n[h] + 1 > L->capacity) return refuse("an append past the capacity");
        o.cnt[h] = L->n[h];
        L->pos[(size_t)h * L->capacity + L->n[h]++] = pos[0];
    }
    return rec_push(&o) ? KS_ERR_OOM : KS_OK;
}

/* The CPU attention over each KV head's [b0, b1) ++ idx[h] ++ [a0, a1) written out (the
 * recorder takes row ranges, ks_attn_args.seg, as CUDA does; the CPU backend reads whole lists). */
static ks_status attention_ranges(float *out, const float *q, const ks_kv_layer *L, const ks_attn_args *a,
                                  const int32_t *const *idx, const int *n_idx, int b0, int b1, int a0, int a1) {
    int32_t *w[MAXH] = {0};
    int cnt[MAXH];
    ks_status st = KS_OK;
    for (int h = 0; h < L->n_kv_heads && !st; h++) {
        cnt[h] = (b1 - b0) + n_idx[h] + (a1 - a0);
        if (!(w[h] = malloc(sizeof(int32_t) * (cnt[h] + 1)))) { st = KS_ERR_OOM; break; }
        int o = 0;
        for (int j = b0; j < b1; j++) w[h][o++] = j;
        memcpy(w[h] + o, idx[h], sizeof(int32_t) * n_idx[h]);
        o += n_idx[h];
        for (int j = a0; j < a1; j++) w[h][o++] = j;
    }
    ks_attn_args aa = *a;
    aa.idx = (const int32_t *const *)w;
    aa.n_idx = cnt;
    aa.idx_dev = 0;
    aa.seg = 0;
    aa.staged = 0;
    if (!st) st = R.cpu->attention(R.cpu, out, q, L, &aa);
    for (int h = 0; h < L->n_kv_heads; h++) free(w[h]);
    return st;
}

static ks_status w_attention(ks_backend *b, float *out, const float *q, const ks_kv_layer *L, const ks_attn_args *a) {
    if (!R.rec) {
        if (a->staged) return ks_errorf(KS_ERR_INTERNAL, "graph-cpu: staged lists outside a recording");
        if (a->seg) return attention_ranges(out, q, L, a, a->idx, a->n_idx, a->seg_b0, a->seg_b1, a->seg_a0, a->seg_a1);
        return R.cpu->attention(R.cpu, out, q, L, a);
    }
    if (a->n != 1 || L->n_kv_heads > MAXH) return refuse("attention of several rows");
    if (!a->staged && a->idx) return refuse("attention over lists that were not staged");
    if (a->staged && (a->staged > 64 || R.slot[a->staged - 1].hkv != L->n_kv_heads)) return refuse("an empty list slot");
    rec_op o = {.kind = OP_ATTENTION, .out = out, .in = q, .L = (ks_kv_layer *)L, .aa = *a};
    for (int h = 0; h < L->n_kv_heads; h++) o.cnt[h] = L->n[h];
    return rec_push(&o) ? KS_ERR_OOM : KS_OK;
}

static ks_status w_attn_out(ks_backend *b, const ks_layer_w *W, const ks_config *c, const ks_acts *a, int n) {
    if (!R.rec) return R.cpu->attn_out(R.cpu, W, c, a, n);
    rec_op o = {.kind = OP_ATTN_OUT, .W = W, .c = c, .a = a, .n = n};
    return rec_push(&o) ? KS_ERR_OOM : KS_OK;
}

static ks_status w_mlp(ks_backend *b, const ks_layer_w *W, const ks_config *c, const ks_acts *a, int n) {
    if (!R.rec) return R.cpu->mlp(R.cpu, W, c, a, n);
    rec_op o = {.kind = OP_MLP, .W = W, .c = c, .a = a, .n = n};
    return rec_push(&o) ? KS_ERR_OOM : KS_OK;
}

static ks_status w_head(ks_backend *b, const ks_weight *norm, const ks_weight *lm, const ks_config *c, const ks_acts *a, int row,
                        int n, float *logits) {
    if (!R.rec) return R.cpu->head(R.cpu, norm, lm, c, a, row, n, logits);
    if (R.refuse_head) return refuse("the head (the test's injected refusal)");
    rec_op o = {.kind = OP_HEAD, .w0 = norm, .w1 = lm, .c = c, .a = a, .row = row, .n = n, .out = logits};
    return rec_push(&o) ? KS_ERR_OOM : KS_OK;
}

/* memory calls while recording fail it, as a stream-ordered allocation fails a CUDA capture */
static void own_add(ks_backend *be, void *p);
static int own_user_free(void *p);
static void *w_alloc(ks_backend *b, size_t n) {
    if (R.rec && !R.own) { refuse("an allocation"); return NULL; }
    void *p = R.cpu->alloc(R.cpu, n);
    if (p && R.rec) own_add(b, p); /* a handler's recording owns what it allocates */
    return p;
}
static void w_free(ks_backend *b, void *p) {
    if (p && own_user_free(p)) return;
    R.cpu->free(R.cpu, p);
}

/* ---------------------------------------------------------------- recorded handlers
 * The emulated device's primitive table and memory calls wrapped (lua/emu_device.c; the policy
 * runs with _device = emulate): outside a handler's recording they run; inside it
 * (graph_begin_handler) scores and top-k are recorded with their growth, the fixed-size calls
 * of TokenSelect's selection cache (copy, a one-row rotation, cosine, ge, where, f32 concat,
 * sum) as they are, and pool1d and i32 concat fail the recording, as a call CUDA could not
 * capture would. Memory allocated while
 * a handler records belongs to the recording (kept until both its user freed it and its graph
 * was freed), as on CUDA. At a run a growing call covers its recorded sizes + (the slot's delta
 * less the one at its recording), the meaning of ks_scores_opts.grow. */
static const ks_backend_prims *EMU_P;
static ks_backend_prims W_PRIMS;
static void *(*emu_alloc0)(ks_backend *, size_t);
static void (*emu_free0)(ks_backend *, void *);
static struct owned {
    void *p;
    ks_backend *be;
    ks_graph *g;
    int user, pending;
} OWN[4096];
static int n_own;

static void own_add(ks_backend *be, void *p) {
    if (n_own == (int)(sizeof OWN / sizeof OWN[0])) { R.failed = 1; return; }
    OWN[n_own++] = (struct owned){.p = p, .be = be, .user = 1, .pending = 1};
}
static void own_really_free(struct owned *o) {
    if (o->be == ks_lua_emu_backend()) emu_free0(o->be, o->p);
    else R.cpu->free(R.cpu, o->p);
}
static void own_drop(int i) {
    if (OWN[i].user || OWN[i].g || OWN[i].pending) return;
    own_really_free(&OWN[i]);
    OWN[i] = OWN[--n_own];
}
/* 1 when p is owned by a recording (its user's free then only says so) */
static int own_user_free(void *p) {
    for (int i = n_own - 1; i >= 0; i--)
        if (OWN[i].p == p) {
            OWN[i].user = 0;
            own_drop(i);
            return 1;
        }
    return 0;
}
static void own_graph(ks_graph *g) { /* the recording that just ended (g NULL: it failed) */
    for (int i = n_own - 1; i >= 0; i--)
        if (OWN[i].pending) {
            OWN[i].pending = 0;
            OWN[i].g = g;
            own_drop(i);
        }
}
static void own_graph_free(ks_graph *g) {
    for (int i = n_own - 1; i >= 0; i--)
        if (OWN[i].g == g) {
            OWN[i].g = NULL;
            own_drop(i);
        }
}

static void *h_alloc(ks_backend *b, size_t n) {
    void *p = emu_alloc0(b, n);
    if (p && R.rec && R.own) own_add(b, p);
    return p;
}
static void h_free(ks_backend *b, void *p) {
    if (p && own_user_free(p)) return;
    emu_free0(b, p);
}

static ks_status run_prim(const prim_op *o, int kind) {
    ks_backend *emu = ks_lua_emu_backend();
    const int64_t dl = o->grow > 0 ? R.delta - o->goff : 0;
    if (kind == OP_TOPK) return EMU_P->topk(emu, o->x, o->rows, o->n + dl, o->k_top, o->base, (ks_topk_order)o->order, o->oi,
                                            o->ov, o->skip, 0);
    ks_scores_opts so = o->so;
    if (so.q_rope_inv) so.q_rope_inv = o->rinv;
    so.grow = 0;
    if (dl && so.k_end != KS_END) so.k_end += dl;
    if (dl && so.out_end != KS_END) so.out_end += dl;
    return EMU_P->scores(emu, o->q, o->qpos, o->hq, o->m, o->k, o->k_bf16, o->kpos, o->hkv, o->n + dl, o->d, &so, o->out);
}

static ks_status h_scores(ks_backend *b, const float *q, const int32_t *qpos, int64_t hq, int64_t m, const void *k, int k_bf16,
                          const int32_t *kpos, int64_t hkv, int64_t n, int64_t d, const ks_scores_opts *o, float *out) {
    if (!(R.rec && R.own)) return EMU_P->scores(b, q, qpos, hq, m, k, k_bf16, kpos, hkv, n, d, o, out);
    if (!o || (o->q_rope_inv && d / 2 > 256)) return refuse("these scores");
    rec_op op = {.kind = OP_SCORES};
    op.pr = (prim_op){.so = *o, .q = q, .qpos = qpos, .kpos = kpos, .k = k, .k_bf16 = k_bf16, .hq = hq, .m = m, .hkv = hkv,
                      .n = n, .d = d, .out = out, .grow = o->grow, .goff = R.delta};
    if (o->q_rope_inv) memcpy(op.pr.rinv, o->q_rope_inv, sizeof(float) * (size_t)(d / 2));
    return rec_push(&op) ? KS_ERR_OOM : KS_OK;
}
static ks_status h_topk(ks_backend *b, const float *x, int64_t rows, int64_t n, int64_t k, int64_t base, ks_topk_order order,
                        int32_t *oi, float *ov, const float *skip, int64_t grow) {
    if (!(R.rec && R.own)) return EMU_P->topk(b, x, rows, n, k, base, order, oi, ov, skip, grow);
    if (grow > 0 && rows != 1) return refuse("a top-k of several growing rows");
    rec_op op = {.kind = OP_TOPK};
    op.pr = (prim_op){.x = x, .rows = rows, .n = n, .k_top = k, .base = base, .order = (int)order, .oi = oi, .ov = ov,
                      .skip = skip, .grow = grow, .goff = R.delta};
    return rec_push(&op) ? KS_ERR_OOM : KS_OK;
}
/* the fixed-size calls of TokenSelect's selection cache (its fingerprint's rotation, the cosine,
 * the mask, the writes in place, the hit counter's sum): recorded, run again at every replay */
static ks_status (*emu_copy0)(ks_backend *, void *, const void *, size_t);
static ks_status (*emu_rope0)(ks_backend *, float *, int, int, const int32_t *, const ks_rope *, int);

static ks_status run_call(const call_op *o) {
    ks_backend *emu = ks_lua_emu_backend();
    switch (o->fn) {
    case C_COPY: return emu_copy0(emu, o->out, o->x, (size_t)o->n);
    case C_ROPE: return emu_rope0(emu, o->out, 1, o->nh, &o->pos, &o->rope, o->max_pos);
    case C_COSINE: return EMU_P->cosine(emu, o->x, o->y, o->n, o->out);
    case C_COSINE_ROWS: return EMU_P->cosine_rows(emu, o->x, o->y, o->rows, o->n, o->out);
    case C_GE: return EMU_P->ge(emu, o->x, o->n, o->thr, o->out);
    case C_WHERE: return EMU_P->where(emu, o->m, o->n2, o->x, o->y, o->n, o->out);
    case C_CONCAT_F32: return EMU_P->concat_f32(emu, o->x, o->n, o->y, o->n2, o->out);
    case C_SUM: return EMU_P->sum(emu, o->x, o->rows, o->cols, o->axis, o->out);
    case C_BOUND:
        return EMU_P->bound_scores(emu, o->x, o->hq, o->y, o->m, o->z, o->n, o->hkv, o->d, (ks_bound_reduce)o->axis, o->out);
    case C_PAGE_ROWS:
        return EMU_P->page_rows(emu, o->x, o->rows, o->cols, o->page, o->n, o->r[0], o->r[1], o->r[2], o->r[3], o->out, NULL);
    }
    return KS_ERR_INTERNAL;
}
static ks_status rec_call(const call_op *c) {
    rec_op op = {.kind = OP_CALL, .call = *c};
    return rec_push(&op) ? KS_ERR_OOM : KS_OK;
}
#define REC_OR_RUN(...) \
    do { if (R.rec && R.own) return rec_call(&(call_op){__VA_ARGS__}); } while (0)
static ks_status h_copy(ks_backend *b, void *dst, const void *src, size_t n) {
    REC_OR_RUN(.fn = C_COPY, .out = dst, .x = src, .n = (int64_t)n);
    return emu_copy0(b, dst, src, n);
}
static ks_status h_rope(ks_backend *b, float *x, int n, int nh, const int32_t *pos, const ks_rope *r, int max_pos) {
    if (R.rec && R.own && n != 1) return refuse("a rotation of several rows");
    REC_OR_RUN(.fn = C_ROPE, .out = x, .nh = nh, .pos = pos[0], .rope = *r, .max_pos = max_pos);
    return emu_rope0(b, x, n, nh, pos, r, max_pos);
}
static ks_status h_cosine(ks_backend *b, const float *a, const float *bb, int64_t n, float *out) {
    REC_OR_RUN(.fn = C_COSINE, .x = a, .y = bb, .n = n, .out = out);
    return EMU_P->cosine(b, a, bb, n, out);
}
static ks_status h_cosine_rows(ks_backend *b, const float *a, const float *bb, int64_t rows, int64_t d, float *out) {
    REC_OR_RUN(.fn = C_COSINE_ROWS, .x = a, .y = bb, .rows = rows, .n = d, .out = out);
    return EMU_P->cosine_rows(b, a, bb, rows, d, out);
}
static ks_status h_ge(ks_backend *b, const float *x, int64_t n, double thr, float *out) {
    REC_OR_RUN(.fn = C_GE, .x = x, .n = n, .thr = thr, .out = out);
    return EMU_P->ge(b, x, n, thr, out);
}
static ks_status h_where(ks_backend *b, const float *mask, int64_t nm, const void *a, const void *bb, int64_t n, void *out) {
    REC_OR_RUN(.fn = C_WHERE, .m = mask, .n2 = nm, .x = a, .y = bb, .n = n, .out = out);
    return EMU_P->where(b, mask, nm, a, bb, n, out);
}
static ks_status h_concat_f32(ks_backend *b, const float *a, int64_t na, const float *bb, int64_t nb, float *out) {
    REC_OR_RUN(.fn = C_CONCAT_F32, .x = a, .n = na, .y = bb, .n2 = nb, .out = out);
    return EMU_P->concat_f32(b, a, na, bb, nb, out);
}
static ks_status h_sum(ks_backend *b, const float *x, int64_t rows, int64_t cols, int axis, float *out) {
    REC_OR_RUN(.fn = C_SUM, .x = x, .rows = rows, .cols = cols, .axis = axis, .out = out);
    return EMU_P->sum(b, x, rows, cols, axis, out);
}
/* Quest's bound and its chosen pages' rows (valid by construction: no error word) */
static ks_status h_bound(ks_backend *b, const float *q, int64_t hq, const float *lo, const float *hi, const uint32_t *box,
                         int64_t n, int64_t hkv, int64_t d, ks_bound_reduce red, float *out) {
    REC_OR_RUN(.fn = C_BOUND, .x = q, .hq = hq, .y = lo, .m = hi, .z = box, .n = n, .hkv = hkv, .d = d, .axis = (int)red,
               .out = out);
    return EMU_P->bound_scores(b, q, hq, lo, hi, box, n, hkv, d, red, out);
}
static ks_status h_page_rows(ks_backend *b, const int32_t *pages, int64_t lists, int64_t k, int64_t page, int64_t n,
                             int64_t bb, int64_t be, int64_t ab, int64_t ae, int32_t *out, int64_t *err) {
    if (R.rec && R.own && err) return refuse("page_rows with an error word");
    REC_OR_RUN(.fn = C_PAGE_ROWS, .x = pages, .rows = lists, .cols = k, .page = page, .n = n, .r = {bb, be, ab, ae},
               .out = out);
    return EMU_P->page_rows(b, pages, lists, k, page, n, bb, be, ab, ae, out, err);
}
/* pool1d and i32 concat fail a handler's recording (a pooled vote follows the rows; the
 * runtime refuses it before it gets here, this is the backend's side) */
static ks_status h_pool1d(ks_backend *b, const float *x, int64_t rows, int64_t n, int64_t kernel, ks_pool_mode mode, float *out) {
    if (R.rec && R.own) return refuse("pool1d");
    return EMU_P->pool1d(b, x, rows, n, kernel, mode, out);
}
static ks_status h_concat_i32(ks_backend *b, const int32_t *a, int64_t na, const int32_t *bb, int64_t nb, int32_t *out) {
    if (R.rec && R.own) return refuse("concat");
    return EMU_P->concat_i32(b, a, na, bb, nb, out);
}

static void emu_wrap(void) {
    ks_backend *e = ks_lua_emu_backend();
    if (e->prims == &W_PRIMS) return;
    EMU_P = e->prims;
    W_PRIMS = *EMU_P;
    W_PRIMS.scores = h_scores;
    W_PRIMS.topk = h_topk;
    W_PRIMS.pool1d = h_pool1d;
    W_PRIMS.concat_i32 = h_concat_i32;
    W_PRIMS.cosine = h_cosine;
    W_PRIMS.cosine_rows = h_cosine_rows;
    W_PRIMS.ge = h_ge;
    W_PRIMS.where = h_where;
    W_PRIMS.concat_f32 = h_concat_f32;
    W_PRIMS.sum = h_sum;
    W_PRIMS.bound_scores = h_bound;
    W_PRIMS.page_rows = h_page_rows;
    e->prims = &W_PRIMS;
    emu_alloc0 = e->alloc;
    emu_free0 = e->free;
    emu_copy0 = e->copy;
    emu_rope0 = e->rope;
    e->alloc = h_alloc;
    e->free = h_free;
    e->copy = h_copy;
    e->rope = h_rope;
}
static void emu_unwrap(void) {
    ks_backend *e = ks_lua_emu_backend();
    if (e->prims != &W_PRIMS) return;
    for (int i = 0; i < n_own; i++) own_really_free(&OWN[i]); /* none should be left */
    n_own = 0;
    e->prims = EMU_P;
    e->alloc = emu_alloc0;
    e->free = emu_free0;
    e->copy = emu_copy0;
    e->rope = emu_rope0;
}

/* one recorded op with the slot's values */
static ks_status run_op(const rec_op *o) {
    int32_t id = R.id, pos = R.pos;
    switch (o->kind) {
    case OP_EMBED: return R.cpu->embed(R.cpu, o->out, o->w0, &id, 1, o->dim);
    case OP_ATTN_IN: { /* the row at (recorded count + delta), written through a view: no booking */
        int nv[MAXH];
        ks_kv_layer V = *o->L;
        for (int h = 0; h < V.n_kv_heads; h++) nv[h] = o->cnt[h] + R.delta;
        V.n = nv;
        return R.cpu->attn_in(R.cpu, o->W, o->c, o->a, 1, &pos, pos, o->rotate, &V);
    }
    case OP_ATTENTION: {
        int nv[MAXH];
        ks_kv_layer V = *o->L;
        for (int h = 0; h < V.n_kv_heads; h++) nv[h] = o->cnt[h] + R.delta;
        V.n = nv;
        ks_attn_args aa = o->aa;
        aa.qpos = &pos;
        aa.rope_max_pos = pos;
        if (aa.staged) { /* the lists the step staged last */
            const lslot *s = &R.slot[aa.staged - 1];
            aa.idx = s->inplace ? (const int32_t *const *)s->at : (const int32_t *const *)s->list;
            aa.n_idx = s->cnt;
            aa.idx_dev = 0;
            aa.renumber = s->renumber;
            aa.staged = 0;
            if (s->seg && s->page) { /* the current page of this step's query */
                const int end = pos + 1 + s->arel, a0 = (end - 1) / s->page * s->page;
                return attention_ranges(o->out, o->in, &V, &aa, aa.idx, aa.n_idx, s->b0, s->b1, a0, end);
            }
            if (s->seg) /* the trailing range where this step's query is */
                return attention_ranges(o->out, o->in, &V, &aa, aa.idx, aa.n_idx, s->b0, s->b1, pos + 1 + s->arel,
                                        pos + 1 + s->arel + s->na);
        }
        return R.cpu->attention(R.cpu, o->out, o->in, &V, &aa);
    }
    case OP_ATTN_OUT: return R.cpu->attn_out(R.cpu, o->W, o->c, o->a, o->n);
    case OP_MLP: return R.cpu->mlp(R.cpu, o->W, o->c, o->a, o->n);
    case OP_HEAD: return R.cpu->head(R.cpu, o->w0, o->w1, o->c, o->a, o->row, o->n, o->out);
    case OP_SCORES: case OP_TOPK: return run_prim(&o->pr, o->kind);
    case OP_CALL: return run_call(&o->call);
    }
    return KS_ERR_INTERNAL;
}

static ks_status run_graph(const ks_graph *g) {
    for (int i = 0; i < g->n; i++) {
        ks_status st = run_op(&g->ops[i]);
        if (st) return st;
    }
    return KS_OK;
}

static ks_status w_graph_begin(ks_backend *b, int32_t id, int32_t pos) {
    if (R.rec) return ks_errorf(KS_ERR_INTERNAL, "graph-cpu: graph_begin while recording");
    R.cur = calloc(1, sizeof *R.cur);
    if (!R.cur) return KS_ERR_OOM;
    R.cur->pos0 = pos;
    R.id = id, R.pos = pos, R.delta = 0;
    R.rec = 1;
    R.failed = 0;
    return KS_OK;
}
static ks_status w_graph_begin_seg(ks_backend *b) {
    if (R.rec) return ks_errorf(KS_ERR_INTERNAL, "graph-cpu: graph_begin_seg while recording");
    R.cur = calloc(1, sizeof *R.cur);
    if (!R.cur) return KS_ERR_OOM;
    R.cur->pos0 = R.pos - R.delta;
    R.rec = 1;
    R.failed = 0;
    return KS_OK;
}
static ks_status w_graph_begin_handler(ks_backend *b) {
    ks_status st = w_graph_begin_seg(b);
    if (!st) R.own = 1;
    return st;
}
static void w_graph_free(ks_backend *b, ks_graph *g) {
    if (!g) return;
    own_graph_free(g);
    free(g->ops);
    free(g);
}
static ks_status w_graph_end(ks_backend *b, ks_graph **out) {
    *out = NULL;
    if (!R.rec) return ks_errorf(KS_ERR_INTERNAL, "graph-cpu: graph_end without graph_begin");
    R.rec = 0;
    int own = R.own;
    R.own = 0;
    ks_graph *g = R.cur;
    R.cur = NULL;
    if (R.failed) { /* the refused call's message stands, as on CUDA */
        if (own) own_graph(NULL);
        w_graph_free(b, g);
        return KS_ERR_UNSUPPORTED;
    }
    if (own) own_graph(g);
    *out = g;
    return KS_OK;
}
static ks_status w_graph_run(ks_backend *b, ks_graph *g, int32_t id, int32_t pos) {
    if (R.rec) return ks_errorf(KS_ERR_INTERNAL, "graph-cpu: graph_run while recording");
    R.id = id, R.pos = pos, R.delta = pos - g->pos0;
    R.runs++;
    R.joined_runs += g->joined;
    return run_graph(g);
}
static ks_status w_graph_launch(ks_backend *b, ks_graph *g) {
    if (R.rec) return ks_errorf(KS_ERR_INTERNAL, "graph-cpu: graph_launch while recording");
    R.launches++;
    return run_graph(g);
}
/* The segments' ops in order as one graph (run by graph_run, as CUDA's joined graph is). */
static ks_status w_graph_join(ks_backend *b, ks_graph *const *segs, int n, ks_graph **out) {
    if (*out) { /* an earlier join given up (the backend's now): made anew here, counted */
        w_graph_free(b, *out);
        R.rejoins++;
    }
    *out = NULL;
    if (R.rec) return ks_errorf(KS_ERR_INTERNAL, "graph-cpu: graph_join while recording");
    if (R.refuse_join) return ks_errorf(KS_ERR_UNSUPPORTED, "graph-cpu refuses to join segments (the test's choice)");
    ks_graph *g = calloc(1, sizeof *g);
    if (!g) return KS_ERR_OOM;
    g->pos0 = segs[0]->pos0;
    g->joined = 1;
    for (int i = 0; i < n; i++)
        for (int j = 0; j < segs[i]->n; j++) {
            if (g->n == g->cap) {
                int cap = g->cap ? 2 * g->cap : 64;
                rec_op *p = realloc(g->ops, sizeof *p * cap);
                if (!p) { w_graph_free(b, g); return KS_ERR_OOM; }
                g->ops = p;
                g->cap = cap;
            }
            g->ops[g->n++] = segs[i]->ops[j];
        }
    R.joins++;
    *out = g;
    return KS_OK;
}
static ks_status w_attn_stage(ks_backend *b, int slot, const ks_kv_layer *L, const ks_attn_args *a) {
    if (R.rec) return ks_errorf(KS_ERR_INTERNAL, "graph-cpu: attn_stage while recording");
    if (R.refuse_stage) return ks_errorf(KS_ERR_UNSUPPORTED, "graph-cpu refuses to stage lists (the test's choice)");
    if (slot < 0 || slot >= 64 || a->n != 1 || !a->idx || L->n_kv_heads > MAXH)
        return ks_errorf(KS_ERR_UNSUPPORTED, "graph-cpu: these lists cannot be staged");
    lslot *s = &R.slot[slot];
    s->inplace = a->idx_dev;
    for (int h = 0; h < L->n_kv_heads; h++) {
        if (a->n_idx[h] > L->n[h]) return ks_errorf(KS_ERR_ARG, "graph-cpu: %d indices for %d rows", a->n_idx[h], L->n[h]);
        s->at[h] = a->idx[h];
        int32_t *p = realloc(s->list[h], sizeof(int32_t) * (a->n_idx[h] + 1));
        if (!p) return KS_ERR_OOM;
        memcpy(p, a->idx[h], sizeof(int32_t) * a->n_idx[h]);
        s->list[h] = p;
        s->cnt[h] = a->n_idx[h];
    }
    s->hkv = L->n_kv_heads;
    s->renumber = a->renumber;
    s->seg = a->seg;
    if (a->seg) {
        s->b0 = a->seg_b0, s->b1 = a->seg_b1;
        s->arel = (a->seg_page ? a->seg_a1 : a->seg_a0) - (a->qpos[0] + 1), s->na = a->seg_a1 - a->seg_a0;
        s->page = a->seg_page;
    }
    R.stages++;
    return KS_OK;
}

/* The recorder around a fresh CPU backend (single-threaded: the reference is too, so both sum
 * in the same order). */
static int g_refuse_stage; /* the next recorder refuses attn_stage */
static int g_refuse_join;  /* ... graph_join */
static int g_no_handlers;  /* ... has no graph_begin_handler */
static ks_backend *recorder_create(void) {
    memset(&R, 0, sizeof R);
    R.refuse_stage = g_refuse_stage;
    R.refuse_join = g_refuse_join;
    emu_wrap();
    ks_backend_opts o = ks_backend_opts_default();
    o.n_threads = 1;
    if (ks_cpu_backend_create(&o, &R.cpu)) return NULL;
    R.w = *R.cpu;
    R.w.name = "graph-cpu";
    R.w.embed = w_embed;
    R.w.attn_in = w_attn_in;
    R.w.attention = w_attention;
    R.w.attn_out = w_attn_out;
    R.w.mlp = w_mlp;
    R.w.head = w_head;
    R.w.alloc = w_alloc;
    R.w.free = w_free;
    R.w.graph_begin = w_graph_begin;
    R.w.graph_end = w_graph_end;
    R.w.graph_run = w_graph_run;
    R.w.graph_free = w_graph_free;
    R.w.graph_begin_seg = w_graph_begin_seg;
    R.w.graph_launch = w_graph_launch;
    R.w.attn_stage = w_attn_stage;
    R.w.graph_join = w_graph_join;
    R.w.graph_begin_handler = g_no_handlers ? NULL : w_graph_begin_handler;
    R.w.attn_ranges = 1; /* row ranges around device lists, expanded here (w_attention) */
    R.w.destroy = NULL;
    return &R.w;
}
static void recorder_free(void) {
    emu_unwrap();
    for (int i = 0; i < 64; i++)
        for (int h = 0; h < MAXH; h++) free(R.slot[i].list[h]);
    ks_backend_free(R.cpu);
}

/* ================================================================ runs */

typedef struct drun {
    int steps, graph_steps;
    long long replayed; /* layer steps whose recorded handler replayed */
    long joins_unreplayed; /* the recorder's joins made by the end of the last step before any replay */
    int32_t ids[128];
    float *lg; /* (steps, vocab) */
    char rep[3][32]; /* the policy's reports REPS at the end ("" where none) */
} drun;

static const char *const REPS[3] = {"selections", "cache_hits", "cache_misses"};

/* prompt (n) then `steps` steps of greedy decoding (force: those ids instead) on model m with the
 * policy `name` (src: its source; NULL: none) and params "k=v,...", the token event fired before
 * each step and once after the last, as ks_generate fires it */
static ks_status drun_one(ks_model *m, const char *name, const char *src, const char *params, int n, int steps,
                          const int32_t *force, drun *r, char *err, size_t errn) {
    memset(r, 0, sizeof *r);
    int vocab = m->cfg.vocab;
    r->lg = calloc((size_t)steps * vocab, sizeof(float));
    int32_t prompt[256];
    for (int i = 0; i < n; i++) prompt[i] = (i * 37 + 11) % 4000 + 3;
    ks_policy *p = NULL;
    ks_session *s = NULL;
    ks_status st = KS_OK;
    if (name) st = src ? ks_policy_load_string(m, name, src, &p) : ks_policy_load(m, name, &p);
    if (!st && p) st = seg_set_params(p, params);
    if (!st) st = ks_session_create(m, &s);
    if (!st && p) st = ks_session_set_policy(s, p);
    if (!st) st = ks_session_prefill(s, prompt, n);
    ks_sampler g;
    ks_sampler_init(&g, 0, 1, 0);
    for (int t = 0; !st && t <= steps; t++) {
        int32_t id = t == steps ? 0 : force ? force[t] : ks_sample(&g, s->logits, vocab);
        st = seg_fire_token(s, id); /* as ks_generate fires it: the policy counts then */
        if (st || t == steps) break;
        r->ids[t] = id;
        st = ks_session_decode(s, id);
        if (!st) memcpy(r->lg + (size_t)t * vocab, s->logits, sizeof(float) * vocab);
        if (!st && !ks_session_replayed_steps(s)) r->joins_unreplayed = R.joins;
        r->steps = t + 1;
    }
    if (st) snprintf(err, errn, "%s: %s", name ? name : "none", ks_last_error());
    if (s) r->graph_steps = s->graph_steps;
    if (s) r->replayed = ks_session_replayed_steps(s);
    for (int i = 0; p && i < 3; i++) {
        const char *v = ks_policy_report(p, REPS[i]);
        snprintf(r->rep[i], sizeof r->rep[i], "%s", v ? v : "");
    }
    ks_session_free(s);
    ks_policy_free(p);
    return st;
}

static long long g_replayed; /* the recorder's run in the last compare: layer steps of replayed handlers */
static long g_rejoins;       /* and its joins given an earlier one to update */
static long g_joins_unreplayed; /* and its joins made before the first replay (by the recording step) */
static char g_rep[3][32];    /* and its reports REPS */

/* The same policy on the plain CPU backend and on the recorder: logits bit-equal at every step,
 * at least min_graph steps replayed and min_stages lists staged. 0, or -1 with the reason in msg. */
static int compare(const char *name, const char *src, const char *params, int n, int steps, int min_graph, long min_stages,
                   char *msg, size_t msgn) {
    ks_model *plain = NULL, *rec = NULL;
    ks_backend *wb = recorder_create();
    ks_backend_opts o = ks_backend_opts_default();
    o.n_threads = 1;
    ks_backend *cpu = NULL;
    char err[1024] = "";
    const char *nm = name ? name : "none", *pm = params ? params : "";
    int rc = -1;
    drun a, b;
    memset(&a, 0, sizeof a);
    memset(&b, 0, sizeof b);
    if (!wb || ks_cpu_backend_create(&o, &cpu) || ks_model_load(TINY, cpu, 0, &plain) || ks_model_load(TINY, wb, 0, &rec)) {
        snprintf(msg, msgn, "open: %s", ks_last_error());
        goto out;
    }
    ks_status st = drun_one(plain, name, src, params, n, steps, NULL, &a, err, sizeof err);
    if (!st) st = drun_one(rec, name, src, params, n, steps, a.ids, &b, err, sizeof err);
    if (st) { snprintf(msg, msgn, "%s", err); goto out; }
    int first = steps, vocab = plain->cfg.vocab;
    for (int t = 0; t < steps && first == steps; t++)
        if (memcmp(a.lg + (size_t)t * vocab, b.lg + (size_t)t * vocab, sizeof(float) * vocab)) first = t;
    if (first < steps) { snprintf(msg, msgn, "%s %s: logits differ from plain steps at step %d", nm, pm, first); goto out; }
    if (a.graph_steps != 0 || b.graph_steps < min_graph) {
        snprintf(msg, msgn, "%s %s: %d of %d steps replayed (at least %d; plain %d)", nm, pm, b.graph_steps, steps, min_graph,
                 a.graph_steps);
        goto out;
    }
    for (int i = 0; i < 3; i++)
        if (strcmp(a.rep[i], b.rep[i])) {
            snprintf(msg, msgn, "%s %s: report %s \"%s\", plain steps' \"%s\"", nm, pm, REPS[i], b.rep[i], a.rep[i]);
            goto out;
        }
    g_replayed = b.replayed;
    g_rejoins = R.rejoins;
    g_joins_unreplayed = b.joins_unreplayed;
    memcpy(g_rep, b.rep, sizeof g_rep);
    if (a.replayed) { snprintf(msg, msgn, "%s %s: the plain run replayed %lld handlers", nm, pm, a.replayed); goto out; }
    snprintf(msg, msgn, "%s %s: %d of %d steps replayed, %ld lists staged (at least %ld), %lld layer steps of recorded "
             "handlers", nm, pm, b.graph_steps, steps, R.stages, min_stages, b.replayed);
    if (R.stages < min_stages) goto out;
    rc = 0;
out:
    free(a.lg);
    free(b.lg);
    ks_model_free(plain);
    ks_model_free(rec);
    ks_backend_free(cpu);
    recorder_free();
    return rc;
}

#define COMPARE(...)                                                                   \
    do {                                                                               \
        char msg_[1200];                                                               \
        KT_CHECK(compare(__VA_ARGS__, msg_, sizeof msg_) == 0, "%s", msg_);            \
    } while (0)

KT_TEST(decode_graph_whole_step) {
    COMPARE(NULL, NULL, NULL, 20, 40, 38, 0);
}

KT_TEST(decode_graph_segments_noop) {
    COMPARE("noop", NULL, NULL, 20, 40, 38, 0);
}

KT_TEST(decode_graph_segments_actor) {
    /* steps 3, 10, 17, 24, 31, 38 attend at layer 1 (staged: the recording at step 2 had none
     * there, so they fall back from that layer) and step 20 retains at layer 0; the retain makes
     * the next step plain and the one after it record */
    COMPARE("actor", SEG_ACTOR, NULL, 20, 40, 28, 0);
}

/* each replayed step stages its lists at every layer that attends (the tiny model: 8 layers;
 * Quest's first 2 are dense) */
/* the hit path holds its attends (policy.h ks_action_hold): once every layer holds, a step is
 * the segments joined into one graph (graph_join), one run and no launch of a segment */
KT_TEST(decode_graph_staged_tokenselect_hit) {
    COMPARE("tokenselect", NULL, "n_init=4,n_local=16,k=16,cache_theta=-1", 30, 40, 30, 30 * 6);
    KT_CHECK(R.joins >= 1 && R.joined_runs >= 25, "%ld joins, %ld joined runs of 40 steps", R.joins, R.joined_runs);
}

/* SEG_HOLDER (tests/seg_policies.h): every layer held, joined; one layer unheld (its handler
 * runs between segments every step, no join); one that releases the holds once (the next step
 * falls back at layer 0 and re-records) */
KT_TEST(decode_graph_held_steps) {
    COMPARE("holder", SEG_HOLDER, "hold=true", 120, 30, 26, 0);
    KT_CHECK(R.joins >= 1 && R.joined_runs >= 24, "all held: %ld joins, %ld joined runs", R.joins, R.joined_runs);
    COMPARE("holder", SEG_HOLDER, "hold=true,free_layer=2", 120, 30, 26, 0);
    KT_CHECK(R.joins == 0 && R.joined_runs == 0, "one layer unheld: %ld joins, %ld joined runs", R.joins, R.joined_runs);
    COMPARE("holder", SEG_HOLDER, "hold=false", 120, 30, 26, 0);
    KT_CHECK(R.joins == 0, "nothing held: %ld joins", R.joins);
    /* device lists (emulated) read in place around row ranges: after a joined step, the next
     * one stages nothing (its slots say the same, the trailing range relative to the query) */
    COMPARE("holder", SEG_HOLDER, "hold=true,_device=emulate", 120, 30, 26, 0);
    KT_CHECK(R.joins == 2 && R.joined_runs >= 26 && R.stages <= 2 * 8,
             "device lists: %ld joins (two graphs), %ld joined runs, %ld lists staged (the recording's and the first joined step's: "
             "at most 2 x 8 layers)", R.joins, R.joined_runs, R.stages);
}

/* the library's log, captured: INFO lines that name the decode graph */
static int g_said;
static char g_said_msg[700];
static const char *g_said_what; /* NULL: the recording's failure */
static void capture_log(void *user, ks_log_level level, const char *msg) {
    (void)user;
    if (level == KS_LOG_INFO && strstr(msg, g_said_what ? g_said_what : "cannot replay as a recorded graph")) {
        g_said++;
        snprintf(g_said_msg, sizeof g_said_msg, "%s", msg);
    }
}

KT_TEST(decode_graph_recording_fails) {
    /* the head refuses to be recorded: no step replays, every step is right, the session stops
     * recording after two failures (graph_run ran the first segment of each), and says why once */
    ks_backend *wb = recorder_create();
    ks_model *m = NULL;
    KT_CHECK(wb && !ks_model_load(TINY, wb, 0, &m), "open: %s", ks_last_error());
    R.refuse_head = 1;
    g_said = 0;
    ks_set_log(capture_log, NULL);
    drun r;
    char err[512] = "";
    ks_status st = drun_one(m, "noop", NULL, NULL, 20, 12, NULL, &r, err, sizeof err);
    ks_set_log(NULL, NULL);
    free(r.lg);
    ks_model_free(m);
    recorder_free();
    KT_CHECK(st == KS_OK, "%s", err);
    KT_CHECK(r.graph_steps == 0 && R.runs <= 2, "graph steps %d, recordings run %ld", r.graph_steps, R.runs);
    KT_CHECK(g_said == 1 && strstr(g_said_msg, "the head") && strstr(g_said_msg, "plain launches"), "said %d times: %s",
             g_said, g_said_msg);
}

/* A handler that attends (all rows but the first, at layer 2, once there are more than 24)
 * while the backend refuses to stage lists (as CUDA refuses host lists): the session says so
 * once, naming the layer and the backend's reason, stops recording after two tries, and its
 * steps equal plain ones. */
static const char *ATTENDER =
    "local ks = require 'kvsieve'\n"
    "return { name = 'attender',\n"
    "  decode_qkv = function(ev)\n"
    "    local rows = ev.kv_rows[1]\n"
    "    if ev.layer == 2 and rows > 24 then ev:attend(ks.arange(1, rows)) end\n"
    "  end }\n";

KT_TEST(decode_graph_says_why_once) {
    g_said = 0;
    ks_set_log(capture_log, NULL);
    char msg[1200];
    g_refuse_stage = 1;
    int rc = compare("attender", ATTENDER, NULL, 20, 30, 3, 0, msg, sizeof msg);
    g_refuse_stage = 0;
    ks_set_log(NULL, NULL);
    KT_CHECK(rc == 0, "%s", msg);
    KT_CHECK(g_said == 1 && strstr(g_said_msg, "layer 2") && strstr(g_said_msg, "refuses to stage"),
             "said %d times: %s (%s)", g_said, g_said_msg, msg);
}

/* ks_bench_run counts the timed decode steps and those that replayed a recorded graph (the
 * bench's graph% column): on the recorder all but the first two steps of each run (a plain step,
 * then the recording), on the plain CPU backend none; its warm-up decodes three steps untimed. */
KT_TEST(decode_graph_bench_counts_replays) {
    ks_backend *wb = recorder_create();
    ks_backend_opts o = ks_backend_opts_default();
    o.n_threads = 1;
    ks_backend *cpu = NULL;
    ks_model *rec = NULL, *plain = NULL;
    KT_CHECK(wb && !ks_cpu_backend_create(&o, &cpu) && !ks_model_load(TINY, wb, 0, &rec) && !ks_model_load(TINY, cpu, 0, &plain),
             "open: %s", ks_last_error());
    int32_t ids[24];
    for (int i = 0; i < 24; i++) ids[i] = (i * 37 + 11) % 4000 + 3;
    ks_bench_opts bo;
    ks_bench_opts_default(&bo);
    bo.gen = 10;
    bo.repeat = 2;
    ks_bench_result rr, rp;
    memset(&rr, 0, sizeof rr);
    memset(&rp, 0, sizeof rp);
    ks_session *sr = NULL, *sp = NULL;
    ks_status st = ks_session_create(rec, &sr);
    if (!st) st = ks_bench_run(sr, ids, 24, &bo, NULL, &rr);
    if (!st) st = ks_session_create(plain, &sp);
    if (!st) st = ks_bench_run(sp, ids, 24, &bo, NULL, &rp);
    long rt = rr.timed_steps, rg = rr.graph_steps, pt = rp.timed_steps, pg = rp.graph_steps, runs = R.runs;
    ks_bench_result_free(&rr);
    ks_bench_result_free(&rp);
    ks_session_free(sr);
    ks_session_free(sp);
    ks_model_free(rec);
    ks_model_free(plain);
    ks_backend_free(cpu);
    recorder_free();
    KT_CHECK(st == KS_OK, "%s", ks_last_error());
    KT_CHECK(rt == 20 && rg >= 16 && rg <= 20, "recorder: %ld of %ld timed steps replayed", rg, rt);
    /* the warm-up's three untimed decode steps: a plain one, the recording, a replay */
    KT_CHECK(runs == rg + 2, "recorder: %ld graph runs, %ld of them timed (the warm-up's 2 untimed)", runs, rg);
    KT_CHECK(pt == 20 && pg == 0, "plain CPU: %ld of %ld timed steps replayed", pg, pt);
    /* TokenSelect's recorded handlers (its default and its selection cache on the emulated
     * device): the layer steps they replayed, counted; none on the plain CPU */
    static const char *const ts[] = {"n_init=4,n_local=16,k=4,_device=emulate",
                                     "n_init=4,n_local=16,k=4,cache_theta=0.5,_device=emulate"};
    for (int i = 0; i < 2; i++) {
        long rep[2] = {-1, -1};
        for (int side = 0; side < 2; side++) {
            ks_backend *b2 = side ? NULL : recorder_create();
            ks_backend *c2 = NULL;
            ks_model *m2 = NULL;
            ks_policy *p = NULL;
            ks_session *s2 = NULL;
            if (side) KT_CHECK(!ks_cpu_backend_create(&o, &c2), "cpu");
            st = ks_model_load(TINY, side ? c2 : b2, 0, &m2);
            if (!st) st = ks_policy_load(m2, "tokenselect", &p);
            if (!st) st = seg_set_params(p, ts[i]);
            if (!st) st = ks_session_create(m2, &s2);
            if (!st) st = ks_session_set_policy(s2, p);
            ks_bench_result r2;
            memset(&r2, 0, sizeof r2);
            if (!st) st = ks_bench_run(s2, ids, 24, &bo, NULL, &r2);
            rep[side] = r2.replayed_steps;
            ks_bench_result_free(&r2);
            ks_session_free(s2);
            ks_policy_free(p);
            ks_model_free(m2);
            ks_backend_free(c2);
            if (!side) recorder_free();
            KT_CHECK(st == KS_OK, "%s: %s", ts[i], ks_last_error());
        }
        KT_CHECK(rep[0] >= 8 * 8 && rep[1] == 0, "%s: %ld layer steps replayed on the recorder (at least 64), %ld on the CPU",
                 ts[i], rep[0], rep[1]);
    }
}

/* a backend that cannot join the segments: said once, the held steps launch them one by one */
KT_TEST(decode_graph_join_refused) {
    g_refuse_join = 1;
    g_said = 0;
    g_said_what = "launch their";
    ks_set_log(capture_log, NULL);
    char msg[1200];
    int rc = compare("holder", SEG_HOLDER, "hold=true", 120, 30, 26, 0, msg, sizeof msg);
    ks_set_log(NULL, NULL);
    g_refuse_join = 0;
    g_said_what = NULL;
    KT_CHECK(rc == 0, "%s", msg);
    KT_CHECK(R.joined_runs == 0 && R.launches >= 24 * 8, "%ld joined runs, %ld segment launches", R.joined_runs, R.launches);
    KT_CHECK(g_said == 1 && strstr(g_said_msg, "graph-cpu refuses to join"), "said %d times: %s", g_said, g_said_msg);
}

KT_TEST(decode_graph_staged_tokenselect) {
    COMPARE("tokenselect", NULL, "n_init=4,n_local=16,k=16", 30, 40, 30, 30 * 6);
}

/* the selection cache decided on the device (ks.ge, skipped scores and top-k, ks.where): the same
 * launches whichever way a layer decides, so every replayed step stages its list and equals the
 * plain one */
KT_TEST(decode_graph_staged_tokenselect_cache) {
    COMPARE("tokenselect", NULL, "n_init=4,n_local=16,k=16,cache_theta=0.5", 30, 40, 30, 30 * 6);
}

KT_TEST(decode_graph_staged_quest) {
    COMPARE("quest", NULL, "page=4,budget=32", 60, 40, 36, 36 * 5);
}

/* Quest declares replay within the rows its current page can still take (ks_action_replay_within;
 * the dense layers through ev:replay): the step after a plain one records, the steps after it
 * replay until the page is full (page 8: 1 plain, 1 recorded and 6 replayed steps a page), the
 * attended tail following the page (ks_attn_args.seg_page). Logits bit-equal to plain CPU steps
 * at every step, "selections" equal (the token event adds the replayed layer steps). */
KT_TEST(decode_graph_recorded_quest) {
    COMPARE("quest", NULL, "page=8,budget=32,_device=emulate", 60, 40, 36, 8);
    /* 40 steps from 61 rows: 27 replayed here (8 layers each); a page's 8 steps hold 6 replays */
    KT_CHECK(g_replayed >= 25 * 8, "%lld layer steps of recorded handlers replayed (at least 25 x 8)", g_replayed);
    /* each page's recording joined by updating the last page's joins (three graphs each) */
    KT_CHECK(g_rejoins >= 3 * 3, "%ld joins made from an earlier one (at least 3 pages x 3)", g_rejoins);
    KT_CHECK(ks_lua_emu_live() == 0, "%ld emulated device blocks left", ks_lua_emu_live());
}

/* TokenSelect's default declares replay (policy.h ks_action_replay): once every layer's handler
 * did, the next step records the handlers' work with the step (graph_begin_handler: scores and
 * top-k on the emulated device, recorded with their growth) and the steps after it replay the
 * lot without firing decode_qkv (no Lua), the vote and the top-k rewritten in place at every
 * replay over the rows the layer has then (the candidates end n_local rows before the layer's
 * end). Logits bit-equal to plain CPU steps at every step. Then: with trace (no replay
 * declared) nothing is recorded; on a recorder without graph_begin_handler the handler runs
 * between segments at every step as before; past the growth a recording allows (the tiny
 * model's cache leaves little room) it is recorded anew. */
KT_TEST(decode_graph_recorded_tokenselect) {
    COMPARE("tokenselect", NULL, "n_init=4,n_local=16,k=16,_device=emulate", 30, 40, 30, 8);
    KT_CHECK(g_replayed >= 25 * 8, "%lld layer steps of recorded handlers replayed (at least 25 x 8)", g_replayed);
    KT_CHECK(R.joins >= 2 && R.joined_runs >= 25, "%ld joins, %ld joined runs", R.joins, R.joined_runs);
    /* the recording step joins its graphs after its last launch (while a device would still run
     * it), so the first replay launches the joins at once */
    KT_CHECK(g_joins_unreplayed == 3, "%ld joins made before the first replay (3: the recording step's)", g_joins_unreplayed);
    KT_CHECK(ks_lua_emu_live() == 0, "%ld emulated device blocks left", ks_lua_emu_live());
    COMPARE("tokenselect", NULL, "n_init=4,n_local=16,k=16,_device=emulate,trace=true", 30, 40, 30, 30 * 6);
    KT_CHECK(g_replayed == 0, "with trace: %lld replayed", g_replayed);
    g_no_handlers = 1;
    char msg[1200];
    int rc = compare("tokenselect", NULL, "n_init=4,n_local=16,k=16,_device=emulate", 30, 40, 30, 30 * 6, msg, sizeof msg);
    g_no_handlers = 0;
    KT_CHECK(rc == 0 && g_replayed == 0, "no graph_begin_handler: %s", msg);
}

/* TokenSelect's selection cache decided on the device (0 < cache_theta, no trace): its list, its
 * fingerprint and its hit counter written in place (ks.where / ks.add's into), the candidates
 * given from the layer's end, so it declares replay too: recorded with the cosine, the mask, the
 * scores and top-k skipped under it and the writes, then replayed without Lua, each replay
 * deciding hit or miss on the device. Logits bit-equal to plain steps, and the reported hits,
 * misses and selections equal to theirs (the token event reads the counter and adds the
 * replayed layer steps). theta 0.5 hits and misses on the tiny model; 2 never hits. */
KT_TEST(decode_graph_recorded_tokenselect_cache) {
    COMPARE("tokenselect", NULL, "n_init=4,n_local=16,k=16,cache_theta=0.5,_device=emulate", 30, 40, 30, 8);
    KT_CHECK(g_replayed >= 25 * 8, "theta 0.5: %lld layer steps of recorded handlers replayed (at least 25 x 8)", g_replayed);
    KT_CHECK(atoi(g_rep[1]) >= 20 && atoi(g_rep[2]) >= 20, "theta 0.5: %s hits, %s misses (both at least 20)", g_rep[1],
             g_rep[2]);
    KT_CHECK(ks_lua_emu_live() == 0, "%ld emulated device blocks left", ks_lua_emu_live());
    COMPARE("tokenselect", NULL, "n_init=4,n_local=16,k=16,cache_theta=2,_device=emulate", 30, 40, 30, 8);
    KT_CHECK(g_replayed >= 25 * 8, "theta 2: %lld layer steps of recorded handlers replayed (at least 25 x 8)", g_replayed);
    KT_CHECK(!strcmp(g_rep[1], "0") && atoi(g_rep[2]) >= 25 * 8, "theta 2: %s hits, %s misses", g_rep[1], g_rep[2]);
}

/* A long decode on a cache with room: past HREC_GROW rows (core/decode.c) the recording is made
 * anew, the replays on both sides of it bit-equal to plain steps. */
KT_TEST(decode_graph_recorded_regrows) {
    COMPARE("tokenselect", NULL, "n_init=4,n_local=16,k=16,_device=emulate", 30, 120, 100, 8);
    KT_CHECK(g_replayed >= 100 * 8, "%lld layer steps of recorded handlers replayed (at least 100 x 8)", g_replayed);
}

/* A policy written here (not one of policies/) that declares replay: its own vote over the
 * candidates [2, N - 8), top-8, attended with the first 2 and last 8 rows. mode "ok": recorded
 * and replayed as TokenSelect is; "pool": it max-pools the vote, which a recording refuses
 * (only ks.scores and ks.topk take a row that follows the layer's rows); "abs": it gives the
 * candidates' end as an absolute row, which a recording refuses too; "pos": it reads the rows'
 * positions on the host (ev:kv_pos), which follow the rows as well. A refused recording is said
 * once (KS_LOG_INFO, naming the layer and why), the handler runs again outside it, every step is
 * still right, and after two refusals the session stops trying. */
static const char *REPLAYER =
    "local ks = require 'kvsieve'\n"
    "return { name = 'replayer', params = { mode = 'ok' },\n"
    "  decode_qkv = function(ev, p)\n"
    "    local N = ev.kv_rows[1]\n"
    "    if N < 40 then return end\n"
    "    local hi = p.mode == 'abs' and N - 8 or -8\n"
    "    local v = ks.scores(ev.q:reshape(ev.n_heads, ev.head_dim), ev:kv_keys(), { softmax = true, key_range = { 2, hi },\n"
    "                        out = { 2, hi }, reduce = 'sum' })\n"
    "    if p.mode == 'pool' then v = ks.pool1d(v, 3, 'max') end\n"
    "    if p.mode == 'pos' and ev:kv_pos(0):tolist()[N] < 0 then error('bad positions') end\n"
    "    ev:attend(ks.topk(v, 8, { values = false, base = 2 }), { before = { 0, 2 }, after = { N - 8, N }, replay = true })\n"
    "  end }\n";

KT_TEST(decode_graph_recorded_own_policy) {
    COMPARE("replayer", REPLAYER, "mode=ok,_device=emulate", 30, 40, 30, 8);
    KT_CHECK(g_replayed >= 20 * 8, "%lld layer steps of recorded handlers replayed (at least 20 x 8)", g_replayed);
}

KT_TEST(decode_graph_recorded_refused) {
    static const char *modes[] = {"mode=pool,_device=emulate", "mode=abs,_device=emulate", "mode=pos,_device=emulate"};
    static const char *why[] = {"only ks.scores and ks.topk take it", "give them from the end", "only ks.scores and ks.topk take it"};
    for (int i = 0; i < 3; i++) {
        g_said = 0;
        g_said_what = "declared replay but cannot be recorded";
        ks_set_log(capture_log, NULL);
        char msg[1200];
        int rc = compare("replayer", REPLAYER, modes[i], 30, 40, 30, 8, msg, sizeof msg);
        ks_set_log(NULL, NULL);
        g_said_what = NULL;
        KT_CHECK(rc == 0 && g_replayed == 0, "%s: %s (replayed %lld)", modes[i], msg, g_replayed);
        KT_CHECK(g_said == 1 && strstr(g_said_msg, "layer 0") && strstr(g_said_msg, why[i]), "%s: said %d times: %s", modes[i],
                 g_said, g_said_msg);
    }
}
