/* dense_plain.c — the forward ops composed of plain dense ops (dense_plain.h). */
#include "dense_plain.h"
#include "model.h"

ks_status ks_plain_attn_in(ks_backend *b, const ks_dense_ops *o, const ks_layer_w *W, const ks_config *c,
                           const ks_acts *a, int n, const int32_t *pos, int max_pos, int rotate, ks_kv_layer *L) {
    int D = c->dim, QD = c->n_heads * c->head_dim, KD = c->n_kv_heads * c->head_dim;
    ks_status st;
    if ((st = o->rmsnorm(b, a->xn, a->x, W->attn_norm, n, D, c->eps)) ||
        (st = o->matmul(b, a->q, a->xn, W->wq, W->bq, n, D, QD)) ||
        (st = o->matmul(b, a->k, a->xn, W->wk, W->bk, n, D, KD)) ||
        (st = o->matmul(b, a->v, a->xn, W->wv, W->bv, n, D, KD)))
        return st;
    if (rotate && ((st = o->rope(b, a->q, n, c->n_heads, pos, &c->rope, max_pos)) ||
                   (st = o->rope(b, a->k, n, c->n_kv_heads, pos, &c->rope, max_pos))))
        return st;
    return L ? b->kv_append(b, L, a->k, a->v, pos, n) : KS_OK;
}

ks_status ks_plain_attn_out(ks_backend *b, const ks_dense_ops *o, const ks_layer_w *W, const ks_config *c,
                            const ks_acts *a, int n) {
    int D = c->dim, QD = c->n_heads * c->head_dim;
    ks_status st = o->matmul(b, a->q, a->xn, W->wo, W->bo, n, QD, D); /* q is dead once attention ran */
    return st ? st : o->add(b, a->x, a->q, (size_t)n * D);
}

ks_status ks_plain_mlp(ks_backend *b, const ks_dense_ops *o, const ks_layer_w *W, const ks_config *c, const ks_acts *a,
                       int n) {
    int D = c->dim, F = c->ffn, ch = KS_MIN(n, KS_PLAIN_MLP_ROWS);
    ks_status st = o->rmsnorm(b, a->xn, a->x, W->ffn_norm, n, D, c->eps);
    if (st) return st;
    float *gate = b->alloc(b, sizeof(float) * (size_t)ch * F);
    float *up = gate ? b->alloc(b, sizeof(float) * (size_t)ch * F) : NULL;
    if (!up) {
        if (gate) b->free(b, gate);
        return ks_errorf(KS_ERR_OOM, "%s: out of memory for the MLP of %d rows", b->name, ch);
    }
    for (int r0 = 0; r0 < n && !st; r0 += KS_PLAIN_MLP_ROWS) {
        int rn = KS_MIN(KS_PLAIN_MLP_ROWS, n - r0);
        const float *h = a->xn + (size_t)r0 * D;
        if (!(st = o->matmul(b, gate, h, W->w_gate, NULL, rn, D, F)) && !(st = o->matmul(b, up, h, W->w_up, NULL, rn, D, F)) &&
            !(st = o->swiglu(b, gate, gate, up, (size_t)rn * F)))
            st = o->matmul(b, a->q + (size_t)r0 * D, gate, W->w_down, NULL, rn, F, D);
    }
    b->free(b, gate);
    b->free(b, up);
    return st ? st : o->add(b, a->x, a->q, (size_t)n * D);
}

ks_status ks_plain_head(ks_backend *b, const ks_dense_ops *o, const ks_weight *norm, const ks_weight *lm_head,
                        const ks_config *c, const ks_acts *a, int row, int n, float *logits) {
    ks_status st = o->rmsnorm(b, a->xn, a->x + (size_t)row * c->dim, norm, n, c->dim, c->eps);
    return st ? st : o->matmul(b, logits, a->xn, lm_head, NULL, n, c->dim, c->vocab);
}
