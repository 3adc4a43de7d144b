/* cpu_dense.c — the CPU backend's dense ops (cpu_dense.h) and the forward ops of backend.h built
 * from them by the plain composition of dense_plain.h: attn_in (norm, q/k/v projections, RoPE,
 * the cache rows), attn_out (o-projection and residual), mlp (norm, gate/up, SwiGLU, down,
 * residual) and head (final norm, lm_head).
 * Float32 throughout; every element is computed by one thread in a fixed order (cpu_gemm.h), so
 * identical rows give identical bits whatever the thread count. */
#include "cpu_dense.h"
#include "cpu_int.h"
#include "dense_plain.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ================================================================ dense ops */


ks_status ks_cpu_matmul(ks_backend *b, float *y, const float *x, const ks_weight *W, const ks_weight *bias, int n,
                            int in, int out) {
    if (W->cols != in || W->rows != out)
        return ks_errorf(KS_ERR_INTERNAL, "matmul: weight is (%lld, %lld), expected (%d, %d)", (long long)W->rows,
                         (long long)W->cols, out, in);
    double t0 = b->count_stats ? ks_now() : 0;
    ks_gemm_nt(((cpu_ctx *)b->ctx)->pool, y, x, W->data, n, in, out);
    if (bias) {
        const float *bb = bias->data;
        for (int i = 0; i < n; i++)
            for (int j = 0; j < out; j++) y[(size_t)i * out + j] += bb[j];
    }
    if (b->count_stats) b->stat_matmul_s += ks_now() - t0;
    b->stat_matmul_flop += 2.0 * n * in * out;
    return KS_OK;
}

ks_status ks_cpu_embed(ks_backend *b, float *out, const ks_weight *E, const int32_t *ids, int n, int dim) {
    for (int i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= E->rows)
            return ks_errorf(KS_ERR_ARG, "embed: token id %d out of range [0, %lld)", ids[i], (long long)E->rows);
        memcpy(out + (size_t)i * dim, E->data + (size_t)ids[i] * dim, sizeof(float) * dim);
    }
    return KS_OK;
}

typedef struct norm_job { float *out; const float *x, *w; int dim; float eps; } norm_job;

static void norm_rows(void *c, int64_t i0, int64_t i1) {
    const norm_job *j = c;
    for (int64_t i = i0; i < i1; i++) {
        const float *xi = j->x + (size_t)i * j->dim;
        float *oi = j->out + (size_t)i * j->dim;
        double ss = 0;
        for (int k = 0; k < j->dim; k++) ss += (double)xi[k] * xi[k];
        float r = 1.0f / sqrtf((float)(ss / j->dim) + j->eps);
        for (int k = 0; k < j->dim; k++) oi[k] = j->w[k] * (xi[k] * r);
    }
}

ks_status ks_cpu_rmsnorm(ks_backend *b, float *out, const float *x, const ks_weight *w, int n, int dim, float eps) {
    norm_job j = {out, x, w->data, dim, eps};
    cpu_par_range(b, n, KS_MAX(1, 32768 / KS_MAX(dim, 1)), norm_rows, &j);
    return KS_OK;
}

typedef struct rope_job { float *x; int n_heads, d; const int32_t *pos; const float *inv; float af; } rope_job;

static void rope_rows(void *c, int64_t i0, int64_t i1) {
    const rope_job *j = c;
    int half = j->d / 2;
    float cs[512], sn[512];
    for (int64_t i = i0; i < i1; i++) {
        for (int k = 0; k < half; k++) {
            float a = (float)j->pos[i] * j->inv[k]; /* float32 angle, as HF computes it */
            cs[k] = cosf(a) * j->af;
            sn[k] = sinf(a) * j->af;
        }
        for (int h = 0; h < j->n_heads; h++) {
            float *v = j->x + ((size_t)i * j->n_heads + h) * j->d;
            for (int k = 0; k < half; k++) {
                float x0 = v[k], x1 = v[k + half];
                v[k] = x0 * cs[k] - x1 * sn[k];
                v[k + half] = x1 * cs[k] + x0 * sn[k];
            }
        }
    }
}

ks_status ks_cpu_rope(ks_backend *b, float *x, int n, int n_heads, const int32_t *pos, const ks_rope *r, int max_pos) {
    int d = r->head_dim, half = d / 2;
    float inv[512];
    if (half > 512) return ks_errorf(KS_ERR_UNSUPPORTED, "rope: head_dim %d too large", d);
    ks_rope_inv_freq(r, max_pos, inv);
    rope_job j = {x, n_heads, d, pos, inv, (float)r->attn_factor};
    cpu_par_range(b, n, 8, rope_rows, &j);
    return KS_OK;
}

typedef struct ew_job { float *out; const float *a, *b; } ew_job;

static void swiglu_range(void *c, int64_t i0, int64_t i1) {
    const ew_job *j = c;
    for (int64_t i = i0; i < i1; i++) {
        float g = j->a[i];
        j->out[i] = g / (1.0f + expf(-g)) * j->b[i];
    }
}

ks_status ks_cpu_swiglu(ks_backend *b, float *out, const float *gate, const float *up, size_t n) {
    ew_job j = {out, gate, up};
    cpu_par_range(b, (int64_t)n, 65536, swiglu_range, &j);
    return KS_OK;
}

static void add_range(void *c, int64_t i0, int64_t i1) {
    const ew_job *j = c;
    for (int64_t i = i0; i < i1; i++) j->out[i] += j->a[i];
}

ks_status ks_cpu_add(ks_backend *b, float *x, const float *y, size_t n) {
    ew_job j = {x, y, NULL};
    cpu_par_range(b, (int64_t)n, 262144, add_range, &j);
    return KS_OK;
}

ks_status ks_cpu_gather_rows(ks_backend *b, float *out, const float *x, const int32_t *idx, int k, int d) {
    for (int i = 0; i < k; i++) memmove(out + (size_t)i * d, x + (size_t)idx[i] * d, sizeof(float) * d);
    return KS_OK;
}

/* ================================================================ forward ops (backend.h) */

/* The forward ops are the plain composition (dense_plain.h) of the ops above. */
static const ks_dense_ops cpu_ops = {ks_cpu_matmul, ks_cpu_rmsnorm, ks_cpu_rope, ks_cpu_swiglu, ks_cpu_add};

static ks_status cpu_attn_in(ks_backend *b, const ks_layer_w *W, const ks_config *c, const ks_acts *a, int n,
                             const int32_t *pos, int max_pos, int rotate, ks_kv_layer *L) {
    return ks_plain_attn_in(b, &cpu_ops, W, c, a, n, pos, max_pos, rotate, L);
}
static ks_status cpu_attn_out(ks_backend *b, const ks_layer_w *W, const ks_config *c, const ks_acts *a, int n) {
    return ks_plain_attn_out(b, &cpu_ops, W, c, a, n);
}
static ks_status cpu_mlp(ks_backend *b, const ks_layer_w *W, const ks_config *c, const ks_acts *a, int n) {
    return ks_plain_mlp(b, &cpu_ops, W, c, a, n);
}
static ks_status cpu_head(ks_backend *b, const ks_weight *norm, const ks_weight *lm_head, const ks_config *c,
                          const ks_acts *a, int row, int n, float *logits) {
    return ks_plain_head(b, &cpu_ops, norm, lm_head, c, a, row, n, logits);
}

void cpu_dense_install(ks_backend *b) {
    b->embed = ks_cpu_embed;
    b->attn_in = cpu_attn_in;
    b->attn_out = cpu_attn_out;
    b->mlp = cpu_mlp;
    b->head = cpu_head;
    b->gather_rows = ks_cpu_gather_rows;
    b->rope = ks_cpu_rope;
}
