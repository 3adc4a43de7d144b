/* forward.c — the blocks a forward pass is made of, shared by prefill (prefill.c) and decode
 * (decode.c): the activation buffers, a layer's q/k/v, its attention arguments, its tail
 * (o-projection and MLP), and the head (final norm, lm_head). forward.h has the shapes. */
#include "forward.h"

#include <math.h>
#include <string.h>

/* ================================================================ activations */

void ks_fwd_free(ks_backend *be, ks_fwd_buf *b) {
    float *p[] = {b->x, b->xn, b->q, b->k, b->v, b->gate, b->up};
    for (size_t i = 0; i < sizeof p / sizeof p[0]; i++)
        if (p[i]) be->free(be, p[i]);
    memset(b, 0, sizeof *b);
}

/* Bytes ks_fwd_alloc takes for n rows (for its out-of-memory message). */
static size_t fwd_bytes(const ks_config *c, int n) {
    size_t D = c->dim, QD = (size_t)c->n_heads * c->head_dim, KD = (size_t)c->n_kv_heads * c->head_dim;
    size_t W = KS_MAX(D, QD), ch = (size_t)KS_MIN(n, KS_MLP_CHUNK);
    return sizeof(float) * ((size_t)n * (D + 2 * W + 2 * KD) + 2 * ch * c->ffn);
}

ks_status ks_fwd_alloc(ks_backend *be, const ks_config *c, int n, int pre_rope, ks_fwd_buf *b) {
    size_t D = c->dim, QD = (size_t)c->n_heads * c->head_dim, KD = (size_t)c->n_kv_heads * c->head_dim;
    size_t W = KS_MAX(D, QD), ch = (size_t)KS_MIN(n, KS_MLP_CHUNK);
    memset(b, 0, sizeof *b);
    b->x = be->alloc(be, sizeof(float) * n * D);
    b->xn = be->alloc(be, sizeof(float) * n * W);
    b->q = be->alloc(be, sizeof(float) * n * W);
    b->k = be->alloc(be, sizeof(float) * n * KD);
    b->v = be->alloc(be, sizeof(float) * n * KD);
    int own_mlp = n > 1 && be->mlp; /* the backend's prefill MLP brings its own intermediates */
    if (!own_mlp) {
        b->gate = be->alloc(be, sizeof(float) * ch * c->ffn);
        b->up = be->alloc(be, sizeof(float) * ch * c->ffn);
    }
    if (pre_rope) b->kpre = b->k; /* marks pre-RoPE mode: k stays unrotated */
    if (!b->x || !b->xn || !b->q || !b->k || !b->v || (!own_mlp && (!b->gate || !b->up))) {
        ks_fwd_free(be, b);
        return ks_errorf(KS_ERR_OOM, "%s: out of memory for activations of %d rows (%.1f MiB)", be->name, n,
                         fwd_bytes(c, n) / 1048576.0);
    }
    return KS_OK;
}

/* ================================================================ one layer */

ks_status ks_layer_qkv(ks_session *s, int l, ks_fwd_buf *b, int n, const int32_t *pos, int max_pos) {
    ks_backend *be = s->be;
    const ks_config *c = &s->m->cfg;
    const ks_layer_w *W = &s->m->layers[l];
    int D = c->dim, QD = c->n_heads * c->head_dim, KD = c->n_kv_heads * c->head_dim;
    ks_status st;
    /* one row (decode), or prefill on a backend with its own prefill MLP (one bf16 copy of the
     * rows for the three projections): norm, projections and RoPE in one call, booked to qkv */
    if ((n == 1 || be->mlp) && be->matmul_qkv) {
        st = be->matmul_qkv(be, b->q, b->k, b->v, b->x, W->attn_norm, c->eps, b->xn, W->wq, W->wk, W->wv, W->bq, W->bk,
                            W->bv, n, D, c->n_heads, c->n_kv_heads, c->head_dim, pos, b->kpre ? NULL : &c->rope, max_pos);
        PROF(s, KS_PH_QKV);
        return st;
    }
    if ((st = be->rmsnorm(be, b->xn, b->x, W->attn_norm, n, D, c->eps))) return st;
    PROF(s, KS_PH_NORM);
    if ((st = be->matmul(be, b->q, b->xn, W->wq, W->bq, n, D, QD))) return st;
    if ((st = be->matmul(be, b->k, b->xn, W->wk, W->bk, n, D, KD))) return st;
    if ((st = be->matmul(be, b->v, b->xn, W->wv, W->bv, n, D, KD))) return st;
    PROF(s, KS_PH_QKV);
    if (b->kpre) return KS_OK; /* pre-RoPE mode: attention rotates q and k itself */
    if ((st = be->rope(be, b->q, n, c->n_heads, pos, &c->rope, max_pos))) return st;
    st = be->rope(be, b->k, n, c->n_kv_heads, pos, &c->rope, max_pos);
    PROF(s, KS_PH_ROPE);
    return st;
}

ks_attn_args ks_layer_attn_args(const ks_session *s, const ks_fwd_buf *b, int n, const int32_t *qpos, int max_pos,
                                const ks_actions *act) {
    const ks_config *c = &s->m->cfg;
    ks_attn_args aa = {.n = n, .n_heads = c->n_heads, .qpos = qpos, .scale = 1.0f / sqrtf((float)c->head_dim),
                       .window = c->sliding_window};
    if (b->kpre) { aa.rope = &c->rope; aa.rope_max_pos = max_pos; }
    if (act && act->attend) {
        aa.idx = (const int32_t *const *)act->attend_idx;
        aa.n_idx = act->n_attend;
        aa.renumber = act->renumber;
    }
    return aa;
}

ks_status ks_layer_tail(ks_session *s, int l, ks_fwd_buf *b, int n) {
    ks_backend *be = s->be;
    const ks_config *c = &s->m->cfg;
    const ks_layer_w *W = &s->m->layers[l];
    int D = c->dim, QD = c->n_heads * c->head_dim, F = c->ffn;
    float *out = b->q; /* q is dead once attention ran */
    /* one row (decode): the residual adds fold into the projections, gate/up/SwiGLU in one call */
    int acc = n == 1 && be->matmul_add, fsw = n == 1 && be->matmul_swiglu;
    /* a backend with its own prefill MLP also folds the o-projection's residual into the GEMM */
    int acc_o = acc || (n > 1 && be->mlp && be->matmul_add);
    ks_status st;
    if (acc_o) {
        if ((st = be->matmul_add(be, b->x, b->xn, W->wo, W->bo, n, QD, D))) return st;
        PROF(s, KS_PH_OPROJ);
    } else {
        if ((st = be->matmul(be, out, b->xn, W->wo, W->bo, n, QD, D))) return st;
        PROF(s, KS_PH_OPROJ);
        if ((st = be->add(be, b->x, out, (size_t)n * D))) return st;
        PROF(s, KS_PH_ELEMWISE);
    }
    if (!fsw) { /* (fused: the norm runs inside matmul_swiglu) */
        if ((st = be->rmsnorm(be, b->xn, b->x, W->ffn_norm, n, D, c->eps))) return st;
        PROF(s, KS_PH_NORM);
    }
    if (n > 1 && be->mlp) { /* the backend's own prefill MLP (residual folded in) */
        st = be->mlp(be, b->x, b->xn, W->w_gate, W->w_up, W->w_down, n, D, F);
        PROF(s, KS_PH_MLP);
        return st;
    }
    for (int r0 = 0; r0 < n; r0 += KS_MLP_CHUNK) {
        int rn = KS_MIN(KS_MLP_CHUNK, n - r0);
        const float *xin = b->xn + (size_t)r0 * D;
        if (fsw) { /* n == 1: one chunk */
            st = be->matmul_swiglu(be, b->gate, b->x, W->ffn_norm, c->eps, b->xn, W->w_gate, W->w_up, b->up, rn, D, F);
            if (st) return st;
            PROF(s, KS_PH_MLP);
        } else {
            if ((st = be->matmul(be, b->gate, xin, W->w_gate, NULL, rn, D, F))) return st;
            if ((st = be->matmul(be, b->up, xin, W->w_up, NULL, rn, D, F))) return st;
            PROF(s, KS_PH_MLP);
            if ((st = be->swiglu(be, b->gate, b->gate, b->up, (size_t)rn * F))) return st;
            PROF(s, KS_PH_ELEMWISE);
        }
        if (acc) st = be->matmul_add(be, b->x + (size_t)r0 * D, b->gate, W->w_down, NULL, rn, F, D);
        else st = be->matmul(be, out + (size_t)r0 * D, b->gate, W->w_down, NULL, rn, F, D);
        if (st) return st;
        PROF(s, KS_PH_MLP);
    }
    if (acc) return KS_OK;
    st = be->add(be, b->x, out, (size_t)n * D);
    PROF(s, KS_PH_ELEMWISE);
    return st;
}

/* ================================================================ the head */

ks_status ks_head_compute(ks_session *s, ks_fwd_buf *b, int row, float *lg) {
    ks_backend *be = s->be;
    const ks_config *c = &s->m->cfg;
    ks_status st;
    float *xr = b->x + (size_t)row * c->dim;
    if ((st = be->rmsnorm(be, b->xn, xr, s->m->final_norm, 1, c->dim, c->eps))) return st;
    PROF(s, KS_PH_NORM);
    st = be->matmul(be, lg, b->xn, s->m->lm_head, NULL, 1, c->dim, c->vocab);
    PROF(s, KS_PH_LM_HEAD);
    return st;
}

ks_status ks_head_logits(ks_session *s, ks_fwd_buf *b, int row) {
    ks_backend *be = s->be;
    const ks_config *c = &s->m->cfg;
    float *lg = be->alloc(be, sizeof(float) * c->vocab);
    if (!lg) return KS_ERR_OOM;
    PROF(s, KS_PH_ALLOC);
    ks_status st = ks_head_compute(s, b, row, lg);
    if (!st) st = be->download(be, s->logits, lg, sizeof(float) * c->vocab);
    PROF(s, KS_PH_SYNC);
    be->free(be, lg);
    return st;
}
