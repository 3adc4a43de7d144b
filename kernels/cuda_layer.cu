/* cuda_layer.cu — the CUDA backend's forward ops (core/backend.h: attn_in, attn_out, mlp, head),
 * composed of the dense operations of cuda_dense.cu (ks_cuda_dense.h). This file is where the
 * backend chooses, from its own options (ks_backend_opts), what runs fused:
 *   opts.fused  one row (decode): norm + q|k|v + RoPE + the cache row in one gemv launch, the
 *               o-projection's and the down projection's residual add inside their gemv, norm +
 *               gate|up + SwiGLU in one launch. Prefill with opts.mlp: the rows converted to
 *               bf16 once for q|k|v, the o-projection's residual folded into its GEMM (beta = 1).
 *   opts.mlp    prefill: the bf16 MLP (bf16 intermediates in row chunks, residual folded in).
 * Off, each step runs as its plain kernels one by one (the A/B reference). A new fused path
 * changes this file and cuda_dense.cu, never the engine. */
#include "cuda_backend_int.h"

extern "C" {
#include "dense_plain.h"
#include "rmsnorm.cuh"
#include "model.h"
}

/* Off the fused paths: the plain composition every backend shares (core/dense_plain.h). */
static const ks_dense_ops cuda_ops = {ks_cuda_dense_matmul, ks_cuda_dense_rmsnorm, ks_cuda_dense_rope,
                                      ks_cuda_dense_swiglu, ks_cuda_dense_add};

/* opts.fused and a call shape it fuses: one row, or prefill rows with the bf16 MLP path on */
static int fused_rows(const cuda_ctx *c, int n) { return c->o.fused && (n == 1 || c->o.mlp); }

static ks_status cu_attn_in(ks_backend *b, const ks_layer_w *W, const ks_config *cf, const ks_acts *a, int n,
                            const int32_t *pos, int max_pos, int rotate, ks_kv_layer *L) {
    cuda_ctx *c = CTX(b);
    int D = cf->dim, H = cf->n_heads, Hkv = cf->n_kv_heads, hd = cf->head_dim;
    const ks_rope *r = rotate ? &cf->rope : NULL;
    if (n == 1 && L) cu_wnext_note(c, L, W->wo);
    if (fused_rows(c, n)) /* the new cache row (rotated or pre-RoPE: r NULL) written by the projection */
        return ks_cuda_dense_qkv(b, L, a->q, a->k, a->v, a->x, W->attn_norm, cf->eps, a->xn, W->wq, W->wk, W->wv, W->bq,
                                 W->bk, W->bv, n, D, H, Hkv, hd, pos, r, max_pos);
    return ks_plain_attn_in(b, &cuda_ops, W, cf, a, n, pos, max_pos, rotate, L);
}

static ks_status cu_attn_out(ks_backend *b, const ks_layer_w *W, const ks_config *cf, const ks_acts *a, int n) {
    int D = cf->dim, QD = cf->n_heads * cf->head_dim;
    if (fused_rows(CTX(b), n) && a->xn_bf16 && n > 1 && W->wo->type == KS_CUDA_BF16) /* the rows as bf16 already */
        return ks_cuda_dense_matmul_add_bf16x(b, a->x, a->xn_bf16, W->wo, W->bo, n, QD, D);
    if (fused_rows(CTX(b), n)) return ks_cuda_dense_matmul_add(b, a->x, a->xn, W->wo, W->bo, n, QD, D);
    return ks_plain_attn_out(b, &cuda_ops, W, cf, a, n);
}

/* One row's MLP intermediates (2, ffn) of the fused path, kept by the backend: a recorded decode
 * step reads them, so they are allocated outside a recording (the step before it) and replaced
 * only when a model with a larger ffn comes (recorded steps then go stale, as for a replaced
 * rope table). */
static ks_status row_mlp(cuda_ctx *c, int ffn, float **gate, float **up) {
    size_t fr = ((size_t)ffn + 3) & ~(size_t)3; /* up 16-byte aligned too */
    if (fr > c->row_mlp_n) {
        if (c->rec) return rec_fail(c, "the one-row MLP buffers grew");
        void *p;
        ks_status st = raw_alloc(c, sizeof(float) * 2 * fr, "one row's MLP intermediates", &p);
        if (st) return st;
        if (c->row_mlp) c->rc_gen++; /* graphs that read the old buffers are stale */
        raw_free(c, c->row_mlp);
        c->row_mlp = (float *)p;
        c->row_mlp_n = fr;
    }
    *gate = c->row_mlp;
    *up = c->row_mlp + c->row_mlp_n;
    return KS_OK;
}

static ks_status cu_mlp(ks_backend *b, const ks_layer_w *W, const ks_config *cf, const ks_acts *a, int n) {
    cuda_ctx *c = CTX(b);
    int D = cf->dim, F = cf->ffn;
    ks_status st;
    if (n == 1 && c->o.fused) { /* norm + gate|up + SwiGLU in one launch, the down projection adds into x */
        float *gate = NULL, *up = NULL;
        if ((st = row_mlp(c, F, &gate, &up)) ||
            (st = ks_cuda_dense_swiglu_proj(b, gate, a->x, W->ffn_norm, cf->eps, a->xn, W->w_gate, W->w_up, up, 1, D, F)))
            return st;
        return ks_cuda_dense_matmul_add(b, a->x, gate, W->w_down, NULL, 1, F, D);
    }
    if (n == 1 || !c->o.mlp) return ks_plain_mlp(b, &cuda_ops, W, cf, a, n);
    /* n rows: the bf16 MLP, residual folded into the down projection; up to one chunk of rows, the
     * norm writes the GEMMs' bf16 input too (no conversion launch) */
    void *xb = NULL;
    if (n <= KS_CUDA_MLP_ROWS && W->ffn_norm->type == KS_CUDA_F32 && W->ffn_norm->rows * W->ffn_norm->cols == D &&
        W->w_gate->type == KS_CUDA_BF16 && W->w_up->type == KS_CUDA_BF16 && W->w_down->type == KS_CUDA_BF16) {
        if ((st = dev_alloc(c, (size_t)n * D * 2, "mlp input (bf16)", &xb))) return st;
        st = ks_cuda_rmsnorm_bf16(c->stream, a->xn, xb, a->x, (const float *)W->ffn_norm->data, n, D, cf->eps);
    } else st = ks_cuda_dense_rmsnorm(b, a->xn, a->x, W->ffn_norm, n, D, cf->eps);
    if (!st) st = ks_cuda_dense_mlp_bf16(b, a->x, a->xn, xb, W->w_gate, W->w_up, W->w_down, n, D, F);
    dev_free(c, xb);
    return st;
}

static ks_status cu_head(ks_backend *b, const ks_weight *norm, const ks_weight *lm_head, const ks_config *cf,
                         const ks_acts *a, int row, int n, float *logits) {
    /* one row: the lm_head gemv (its fused path); several: one GEMM */
    return ks_plain_head(b, &cuda_ops, norm, lm_head, cf, a, row, n, logits);
}

void cuda_layer_install(ks_backend *b) {
    b->attn_in = cu_attn_in;
    b->attn_out = cu_attn_out;
    b->mlp = cu_mlp;
    b->head = cu_head;
}
