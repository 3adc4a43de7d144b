/* model.c — from a Hugging Face folder to backend weights, every tensor checked. */
#include "model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <sys/stat.h>

/* Find a tensor and check its shape (ndim 1 or 2). */
static ks_status find(ks_model *m, const char *name, int64_t d0, int64_t d1, const ks_st_tensor **out) {
    const ks_st_tensor *t = ks_st_find(m->st, name);
    *out = t;
    if (!t) return ks_errorf(KS_ERR_FORMAT, "%s: tensor %s is missing from the checkpoint", m->dir, name);
    int want_nd = d1 ? 2 : 1;
    if (t->ndim != want_nd || t->shape[0] != d0 || (d1 && t->shape[1] != d1)) {
        char got[96] = "", want[64];
        int o = 0;
        for (int i = 0; i < t->ndim && o < 80; i++) o += snprintf(got + o, sizeof got - o, "%s%lld", i ? ", " : "", (long long)t->shape[i]);
        if (d1) snprintf(want, sizeof want, "%lld, %lld", (long long)d0, (long long)d1);
        else snprintf(want, sizeof want, "%lld", (long long)d0);
        return ks_errorf(KS_ERR_SHAPE, "%s: tensor %s has shape [%s] but config.json implies [%s]", m->dir, name, got, want);
    }
    if (t->dtype != KS_DT_F32 && t->dtype != KS_DT_BF16 && t->dtype != KS_DT_F16)
        return ks_errorf(KS_ERR_DTYPE, "%s: tensor %s has dtype %s; expected F32, F16 or BF16", m->dir, name,
                         ks_dtype_name(t->dtype));
    return KS_OK;
}

static ks_status weight(ks_model *m, const char *name, int64_t d0, int64_t d1, ks_weight **out) {
    const ks_st_tensor *t;
    ks_status st = find(m, name, d0, d1, &t);
    if (st) return st;
    m->n_params += (size_t)d0 * (d1 ? d1 : 1);
    return m->be->weight_create(m->be, t, 0, d0, out);
}

/* A slice of rows [r0, r0+rows) of a fused tensor of shape (total, cols). */
static ks_status weight_rows(ks_model *m, const char *name, int64_t total, int64_t cols, int64_t r0, int64_t rows,
                             ks_weight **out) {
    const ks_st_tensor *t;
    ks_status st = find(m, name, total, cols, &t);
    if (st) return st;
    m->n_params += (size_t)rows * cols;
    return m->be->weight_create(m->be, t, r0, rows, out);
}

/* One layer's q|k|v and gate|up as one buffer each where the backend lays weights out that way
 * (backend.h weights_join: the same handles, used as before). */
static ks_status join_layer(ks_backend *be, ks_layer_w *L) {
    if (!be->weights_join) return KS_OK;
    ks_weight *qkv[3] = {L->wq, L->wk, L->wv}, *gu[2] = {L->w_gate, L->w_up};
    ks_status st = be->weights_join(be, qkv, 3);
    return st ? st : be->weights_join(be, gu, 2);
}

static int file_exists(const char *p) {
    struct stat s;
    return stat(p, &s) == 0;
}

ks_status ks_model_load(const char *dir, ks_backend *be, int require_tokenizer, ks_model **out) {
    *out = NULL;
    struct stat sd;
    if (stat(dir, &sd) != 0 || !S_ISDIR(sd.st_mode))
        return ks_errorf(KS_ERR_IO, "model folder %s does not exist or is not a directory", dir);
    ks_model *m = ks_calloc(1, sizeof *m);
    if (!m) return KS_ERR_OOM;
    m->be = be;
    m->dir = ks_strdup(dir);
    ks_status st = ks_config_load(dir, &m->cfg);
    if (st) { free(m->dir); free(m); return st; }
    char path[4096];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    if (file_exists(path)) {
        if ((st = ks_tokenizer_load(path, &m->tok))) goto fail;
        int tv = ks_tokenizer_vocab_size(m->tok);
        if (tv > m->cfg.vocab) {
            st = ks_errorf(KS_ERR_SHAPE, "%s: tokenizer has %d tokens but vocab_size is %d", dir, tv, m->cfg.vocab);
            goto fail;
        }
    } else if (require_tokenizer) {
        st = ks_errorf(KS_ERR_IO, "%s: tokenizer.json is missing", dir);
        goto fail;
    }
    if ((st = ks_st_open_dir(dir, &m->st))) goto fail;

    const ks_config *c = &m->cfg;
    int64_t D = c->dim, qd = (int64_t)c->n_heads * c->head_dim, kd = (int64_t)c->n_kv_heads * c->head_dim, F = c->ffn;
    if ((st = weight(m, "model.embed_tokens.weight", c->vocab, D, &m->embed))) goto fail;
    if ((st = weight(m, "model.norm.weight", D, 0, &m->final_norm))) goto fail;
    if (c->tied) {
        m->lm_head = m->embed;
    } else {
        if (!ks_st_find(m->st, "lm_head.weight")) {
            st = ks_errorf(KS_ERR_FORMAT, "%s: lm_head.weight is missing and tie_word_embeddings is false", dir);
            goto fail;
        }
        if ((st = weight(m, "lm_head.weight", c->vocab, D, &m->lm_head))) goto fail;
    }
    m->layers = ks_calloc(c->n_layers, sizeof *m->layers);
    if (!m->layers) { st = KS_ERR_OOM; goto fail; }
    for (int l = 0; l < c->n_layers; l++) {
        ks_layer_w *L = &m->layers[l];
        char n[256];
#define P(suffix) (snprintf(n, sizeof n, "model.layers.%d.%s", l, suffix), n)
        if ((st = weight(m, P("input_layernorm.weight"), D, 0, &L->attn_norm))) goto fail;
        if ((st = weight(m, P("post_attention_layernorm.weight"), D, 0, &L->ffn_norm))) goto fail;
        if (c->arch == KS_ARCH_PHI3) {
            if ((st = weight_rows(m, P("self_attn.qkv_proj.weight"), qd + 2 * kd, D, 0, qd, &L->wq)) ||
                (st = weight_rows(m, P("self_attn.qkv_proj.weight"), qd + 2 * kd, D, qd, kd, &L->wk)) ||
                (st = weight_rows(m, P("self_attn.qkv_proj.weight"), qd + 2 * kd, D, qd + kd, kd, &L->wv)) ||
                (st = weight_rows(m, P("mlp.gate_up_proj.weight"), 2 * F, D, 0, F, &L->w_gate)) ||
                (st = weight_rows(m, P("mlp.gate_up_proj.weight"), 2 * F, D, F, F, &L->w_up)))
                goto fail;
        } else {
            if ((st = weight(m, P("self_attn.q_proj.weight"), qd, D, &L->wq)) ||
                (st = weight(m, P("self_attn.k_proj.weight"), kd, D, &L->wk)) ||
                (st = weight(m, P("self_attn.v_proj.weight"), kd, D, &L->wv)) ||
                (st = weight(m, P("mlp.gate_proj.weight"), F, D, &L->w_gate)) ||
                (st = weight(m, P("mlp.up_proj.weight"), F, D, &L->w_up)))
                goto fail;
        }
        if ((st = weight(m, P("self_attn.o_proj.weight"), D, qd, &L->wo)) ||
            (st = weight(m, P("mlp.down_proj.weight"), D, F, &L->w_down)))
            goto fail;
        if (c->qkv_bias) {
            if ((st = weight(m, P("self_attn.q_proj.bias"), qd, 0, &L->bq)) ||
                (st = weight(m, P("self_attn.k_proj.bias"), kd, 0, &L->bk)) ||
                (st = weight(m, P("self_attn.v_proj.bias"), kd, 0, &L->bv)))
                goto fail;
        }
        if (c->o_bias && (st = weight(m, P("self_attn.o_proj.bias"), D, 0, &L->bo))) goto fail;
        if (c->mlp_bias) {
            st = ks_errorf(KS_ERR_UNSUPPORTED, "%s: mlp_bias is not supported", dir);
            goto fail;
        }
        if ((st = join_layer(m->be, L))) goto fail;
#undef P
    }
    *out = m;
    return KS_OK;
fail:
    ks_model_free(m);
    return st;
}

void ks_model_free(ks_model *m) {
    if (!m) return;
    ks_backend *be = m->be;
    if (m->layers) {
        for (int l = 0; l < m->cfg.n_layers; l++) {
            ks_layer_w *L = &m->layers[l];
            ks_weight *ws[] = {L->attn_norm, L->wq, L->wk, L->wv, L->wo, L->bq, L->bk, L->bv, L->bo,
                               L->ffn_norm, L->w_gate, L->w_up, L->w_down};
            for (size_t i = 0; i < sizeof ws / sizeof ws[0]; i++)
                if (ws[i]) be->weight_free(be, ws[i]);
        }
        free(m->layers);
    }
    if (m->lm_head && m->lm_head != m->embed) be->weight_free(be, m->lm_head);
    if (m->embed) be->weight_free(be, m->embed);
    if (m->final_norm) be->weight_free(be, m->final_norm);
    ks_st_close(m->st);
    ks_tokenizer_free(m->tok);
    ks_config_free(&m->cfg);
    free(m->dir);
    free(m);
}

ks_status ks_model_random(const char *config, ks_backend *be, uint64_t seed, ks_model **out) {
    *out = NULL;
    ks_model *m = ks_calloc(1, sizeof *m);
    if (!m) return KS_ERR_OOM;
    m->be = be;
    m->dir = ks_strdup(config);
    struct stat sd;
    ks_status st;
    if (stat(config, &sd) == 0 && S_ISDIR(sd.st_mode)) st = ks_config_load(config, &m->cfg);
    else {
        char *text;
        size_t len;
        st = ks_read_file(config, &text, &len);
        if (!st) { st = ks_config_parse(text, len, config, &m->cfg); free(text); }
    }
    if (st) { free(m->dir); free(m); return st; }
    const ks_config *c = &m->cfg;
    int64_t D = c->dim, qd = (int64_t)c->n_heads * c->head_dim, kd = (int64_t)c->n_kv_heads * c->head_dim, F = c->ffn;
    /* Every weight below is allocated and written: refuse sizes the machine cannot hold up
     * front, with a named error, rather than let the allocator abort (ASan) or the OOM
     * killer end the process halfway. The count is a double: config.c bounds the dimensions,
     * and an estimate is all this needs. The CPU backend keeps float32 weights; another
     * backend's device memory is its own allocator's to refuse. */
    double per_layer = 2.0 * D + 2.0 * qd * D + 2.0 * kd * D + 3.0 * F * D +
                       (c->qkv_bias ? (double)qd + 2.0 * kd : 0) + (c->o_bias ? (double)D : 0);
    double n_params = (double)c->vocab * D * (c->tied ? 1 : 2) + D + per_layer * c->n_layers;
    size_t mem = ks_mem_limit();
    if (be->host_memory && mem && n_params * sizeof(float) > (double)mem) {
        st = ks_errorf(KS_ERR_OOM, "%s: random weights need %.3g GiB (%.3g parameters as float32), more than this "
                       "machine's %.3g GiB of memory", config, n_params * sizeof(float) / 1073741824.0, n_params,
                       (double)mem / 1073741824.0);
        goto fail;
    }
    uint64_t k = seed * 1000;
    /* weights ~ U(-s/2, s/2) with s ~ 2/sqrt(fan_in) keeps activations O(1) through the layers */
#define RW(dst, rows, cols, scale, off)                                                       \
    do {                                                                                      \
        if ((st = be->weight_random(be, rows, cols, ++k, scale, off, &(dst)))) goto fail;     \
        m->n_params += (size_t)(rows) * (cols);                                               \
    } while (0)
    RW(m->embed, c->vocab, D, 2.0f, 0.0f);
    RW(m->final_norm, D, 1, 0.2f, 1.0f);
    if (c->tied) m->lm_head = m->embed;
    else RW(m->lm_head, c->vocab, D, 2.0f / sqrtf((float)D), 0.0f);
    m->layers = ks_calloc(c->n_layers, sizeof *m->layers);
    if (!m->layers) { st = KS_ERR_OOM; goto fail; }
    for (int l = 0; l < c->n_layers; l++) {
        ks_layer_w *L = &m->layers[l];
        float sD = 2.0f / sqrtf((float)D), sQ = 2.0f / sqrtf((float)qd), sF = 2.0f / sqrtf((float)F);
        RW(L->attn_norm, D, 1, 0.2f, 1.0f);
        RW(L->ffn_norm, D, 1, 0.2f, 1.0f);
        RW(L->wq, qd, D, sD, 0.0f);
        RW(L->wk, kd, D, sD, 0.0f);
        RW(L->wv, kd, D, sD, 0.0f);
        RW(L->wo, D, qd, sQ, 0.0f);
        RW(L->w_gate, F, D, sD, 0.0f);
        RW(L->w_up, F, D, sD, 0.0f);
        RW(L->w_down, D, F, sF, 0.0f);
        if (c->qkv_bias) {
            RW(L->bq, qd, 1, 0.1f, 0.0f);
            RW(L->bk, kd, 1, 0.1f, 0.0f);
            RW(L->bv, kd, 1, 0.1f, 0.0f);
        }
        if (c->o_bias) RW(L->bo, D, 1, 0.1f, 0.0f);
        if ((st = join_layer(be, L))) goto fail;
    }
#undef RW
    *out = m;
    return KS_OK;
fail:
    ks_model_free(m);
    return st;
}
