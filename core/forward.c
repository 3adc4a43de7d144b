/* forward.c — the blocks a forward pass is made of, shared by prefill (prefill.c) and decode
 * (decode.c): the activation buffers, then one backend forward op (backend.h) per block with the
 * profile's mark after it: a layer's q/k/v, its attention, its tail (o-projection and MLP), and
 * the head. forward.h has the shapes. */
#include "forward.h"

#include <math.h>
#include <string.h>

/* ================================================================ activations */

void ks_fwd_free(ks_backend *be, ks_fwd_buf *b) {
    float *p[] = {b->a.x, b->a.xn, b->a.q, b->a.k, b->a.v};
    for (size_t i = 0; i < sizeof p / sizeof p[0]; i++)
        if (p[i]) be->free(be, p[i]);
    memset(b, 0, sizeof *b);
}

ks_status ks_fwd_alloc(ks_backend *be, const ks_config *c, int n, int pre_rope, ks_fwd_buf *b) {
    size_t D = c->dim, QD = (size_t)c->n_heads * c->head_dim, KD = (size_t)c->n_kv_heads * c->head_dim;
    size_t W = KS_MAX(D, QD);
    memset(b, 0, sizeof *b);
    ks_acts *a = &b->a;
    a->x = be->alloc(be, sizeof(float) * n * D);
    a->xn = be->alloc(be, sizeof(float) * n * W);
    a->q = be->alloc(be, sizeof(float) * n * W);
    a->k = be->alloc(be, sizeof(float) * n * KD);
    a->v = be->alloc(be, sizeof(float) * n * KD);
    if (pre_rope) b->kpre = a->k; /* marks pre-RoPE mode: k stays unrotated */
    if (!a->x || !a->xn || !a->q || !a->k || !a->v) {
        ks_fwd_free(be, b);
        return ks_errorf(KS_ERR_OOM, "%s: out of memory for activations of %d rows (%.1f MiB)", be->name, n,
                         sizeof(float) * (double)n * (D + 2 * W + 2 * KD) / 1048576.0);
    }
    return KS_OK;
}

/* ================================================================ one layer */

ks_status ks_layer_qkv(ks_session *s, int l, ks_fwd_buf *b, int n, const int32_t *pos, int max_pos, ks_kv_layer *L) {
    ks_status st = ks_ring_restore(s, l);
    if (st) return st;
    st = s->be->attn_in(s->be, &s->m->layers[l], &s->m->cfg, &b->a, n, pos, max_pos, !b->kpre, L);
    PROF(s, KS_PH_QKV);
    return st;
}

ks_status ks_layer_qkv_at(ks_session *s, int l, ks_fwd_buf *b, const int32_t *pos, ks_kv_layer *L) {
    ks_status st = s->be->attn_in(s->be, &s->m->layers[l], &s->m->cfg, &b->a, 1, pos, pos[0], !b->kpre, L);
    PROF(s, KS_PH_QKV);
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
        aa.idx_dev = act->attend_dev;
        aa.idx_gen = act->attend_gen;
        aa.renumber = act->renumber;
        if (act->attend_seg) {
            aa.seg = 1;
            aa.seg_b0 = act->seg_b0; aa.seg_b1 = act->seg_b1;
            aa.seg_a0 = act->seg_a0; aa.seg_a1 = act->seg_a1;
            aa.seg_page = act->seg_page;
        }
    }
    return aa;
}

ks_status ks_layer_attention(ks_session *s, int l, ks_fwd_buf *b, const ks_attn_args *aa) {
    ks_status st = s->be->attention(s->be, b->a.xn, b->a.q, &s->kv[l], aa);
    PROF(s, KS_PH_ATTENTION);
    return st;
}

ks_status ks_layer_tail(ks_session *s, int l, ks_fwd_buf *b, int n) {
    ks_backend *be = s->be;
    const ks_layer_w *W = &s->m->layers[l];
    ks_status st = be->attn_out(be, W, &s->m->cfg, &b->a, n);
    PROF(s, KS_PH_OPROJ);
    if (st) return st;
    st = be->mlp(be, W, &s->m->cfg, &b->a, n);
    PROF(s, KS_PH_MLP);
    return st;
}

/* ================================================================ the head */

ks_status ks_head_compute(ks_session *s, ks_fwd_buf *b, int row, int n, float *lg) {
    ks_status st = s->be->head(s->be, s->m->final_norm, s->m->lm_head, &s->m->cfg, &b->a, row, n, lg);
    PROF(s, KS_PH_LM_HEAD);
    return st;
}

ks_status ks_head_logits(ks_session *s, ks_fwd_buf *b, int row) {
    ks_backend *be = s->be;
    const ks_config *c = &s->m->cfg;
    float *lg = be->alloc(be, sizeof(float) * c->vocab);
    if (!lg) return KS_ERR_OOM;
    PROF(s, KS_PH_ALLOC);
    ks_status st = ks_head_compute(s, b, row, 1, lg);
    if (!st) st = be->download(be, s->logits, lg, sizeof(float) * c->vocab);
    if (!st) s->logits_stale = 0;
    if (!st) st = ks_devcheck_sync(s); /* the forward's device list checks, now that it has run */
    PROF(s, KS_PH_SYNC);
    be->free(be, lg);
    return st;
}
