/* config.c — config.json -> ks_config, with every field checked. */
#include "config.h"
#include "json.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *ks_arch_name(ks_arch a) {
    switch (a) {
    case KS_ARCH_LLAMA: return "llama";
    case KS_ARCH_MISTRAL: return "mistral";
    case KS_ARCH_QWEN2: return "qwen2";
    case KS_ARCH_PHI3: return "phi3";
    }
    return "?";
}

void ks_config_free(ks_config *cfg) {
    if (!cfg) return;
    free(cfg->rope.short_factor);
    free(cfg->rope.long_factor);
    cfg->rope.short_factor = cfg->rope.long_factor = NULL;
}

/* A required positive integer field. */
static ks_status need_int(const ks_json *o, const char *key, const char *what, int *out) {
    const ks_json *v = ks_json_get(o, key);
    if (!v) return ks_errorf(KS_ERR_FORMAT, "%s: missing field \"%s\"", what, key);
    if (v->type != KS_JSON_NUMBER || !v->is_int || v->inum <= 0 || v->inum > (1 << 30))
        return ks_errorf(KS_ERR_FORMAT, "%s: field \"%s\" must be a positive integer", what, key);
    *out = (int)v->inum;
    return KS_OK;
}

static ks_status factor_list(const ks_json *arr, const char *name, int n, const char *what, float **out) {
    if (!arr || arr->type != KS_JSON_ARRAY)
        return ks_errorf(KS_ERR_FORMAT, "%s: longrope needs a \"%s\" list", what, name);
    if ((int)arr->len != n)
        return ks_errorf(KS_ERR_SHAPE, "%s: longrope %s has %zu entries, expected head_dim/2 = %d", what, name,
                         arr->len, n);
    float *f = ks_malloc(sizeof(float) * (size_t)n);
    if (!f) return KS_ERR_OOM;
    for (int i = 0; i < n; i++) {
        if (arr->items[i].type != KS_JSON_NUMBER || !(arr->items[i].num > 0)) {
            free(f);
            return ks_errorf(KS_ERR_FORMAT, "%s: longrope %s[%d] must be a positive number", what, name, i);
        }
        f[i] = (float)arr->items[i].num;
    }
    *out = f;
    return KS_OK;
}

static ks_status parse_rope(const ks_json *root, const char *what, ks_config *c) {
    ks_rope *r = &c->rope;
    r->head_dim = c->head_dim;
    r->type = KS_ROPE_DEFAULT;
    r->factor = 1;
    r->attn_factor = 1;
    r->theta = ks_json_num(root, "rope_theta", 10000.0);
    /* transformers 5: rope_parameters {rope_type, rope_theta, ...}; 4.x: rope_scaling {type|rope_type, ...} */
    const ks_json *rs = ks_json_get(root, "rope_parameters");
    if (rs && rs->type == KS_JSON_OBJECT) r->theta = ks_json_num(rs, "rope_theta", r->theta);
    const ks_json *sc = ks_json_get(root, "rope_scaling");
    if (!sc || sc->type != KS_JSON_OBJECT) sc = rs;
    if (!(r->theta > 1)) return ks_errorf(KS_ERR_FORMAT, "%s: rope_theta must be > 1", what);
    double prf = ks_json_num(root, "partial_rotary_factor", 1.0);
    if (prf != 1.0) return ks_errorf(KS_ERR_UNSUPPORTED, "%s: partial_rotary_factor %g is not supported", what, prf);
    r->orig_max_pos = (int)ks_json_int(root, "original_max_position_embeddings", c->max_pos);
    if (!sc || sc->type != KS_JSON_OBJECT) return KS_OK;
    const char *type = ks_json_str(sc, "rope_type", NULL);
    if (!type) type = ks_json_str(sc, "type", "default");
    r->factor = ks_json_num(sc, "factor", 1.0);
    r->orig_max_pos = (int)ks_json_int(sc, "original_max_position_embeddings", r->orig_max_pos);
    if (!strcmp(type, "default")) {
        r->type = KS_ROPE_DEFAULT;
    } else if (!strcmp(type, "linear")) {
        r->type = KS_ROPE_LINEAR;
        if (!(r->factor > 0)) return ks_errorf(KS_ERR_FORMAT, "%s: rope linear factor must be > 0", what);
    } else if (!strcmp(type, "llama3")) {
        r->type = KS_ROPE_LLAMA3;
        r->low_freq_factor = ks_json_num(sc, "low_freq_factor", 1.0);
        r->high_freq_factor = ks_json_num(sc, "high_freq_factor", 4.0);
        if (!(r->factor > 0) || !(r->high_freq_factor > r->low_freq_factor) || r->orig_max_pos <= 0)
            return ks_errorf(KS_ERR_FORMAT, "%s: invalid llama3 rope_scaling parameters", what);
    } else if (!strcmp(type, "longrope") || !strcmp(type, "su")) {
        r->type = KS_ROPE_LONGROPE;
        ks_status st;
        if ((st = factor_list(ks_json_get(sc, "short_factor"), "short_factor", c->head_dim / 2, what,
                              &r->short_factor)))
            return st;
        if ((st = factor_list(ks_json_get(sc, "long_factor"), "long_factor", c->head_dim / 2, what,
                              &r->long_factor)))
            return st;
        if (r->orig_max_pos <= 0) return ks_errorf(KS_ERR_FORMAT, "%s: longrope needs original_max_position_embeddings", what);
        /* HF: factor = max_position_embeddings / original_max_position_embeddings unless given;
         * attention_factor = sqrt(1 + ln(factor) / ln(original)) when factor > 1 unless given. */
        const ks_json *fj = ks_json_get(sc, "factor");
        double factor = (fj && fj->type == KS_JSON_NUMBER) ? fj->num : (double)c->max_pos / r->orig_max_pos;
        r->factor = factor;
        const ks_json *af = ks_json_get(sc, "attention_factor");
        if (af && af->type == KS_JSON_NUMBER) r->attn_factor = af->num;
        else r->attn_factor = factor <= 1.0 ? 1.0 : sqrt(1.0 + log(factor) / log((double)r->orig_max_pos));
    } else {
        return ks_errorf(KS_ERR_UNSUPPORTED, "%s: rope scaling type \"%s\" is not supported", what, type);
    }
    return KS_OK;
}

static void parse_eos(const ks_json *v, ks_config *c) {
    if (!v) return;
    if (v->type == KS_JSON_NUMBER && v->is_int) c->eos[c->n_eos++] = (int)v->inum;
    else if (v->type == KS_JSON_ARRAY)
        for (size_t i = 0; i < v->len && c->n_eos < KS_MAX_EOS; i++)
            if (v->items[i].type == KS_JSON_NUMBER && v->items[i].is_int) c->eos[c->n_eos++] = (int)v->items[i].inum;
}

ks_status ks_config_parse(const char *text, size_t len, const char *what, ks_config *c) {
    memset(c, 0, sizeof *c);
    ks_json *root = ks_json_parse(text, len);
    if (!root) return ks_error_prefix(KS_ERR_FORMAT, "%s", what);
    ks_status st = KS_OK;
    if (root->type != KS_JSON_OBJECT) { st = ks_errorf(KS_ERR_FORMAT, "%s: not a JSON object", what); goto out; }
    const char *mt = ks_json_str(root, "model_type", NULL);
    if (!mt) { st = ks_errorf(KS_ERR_FORMAT, "%s: missing field \"model_type\"", what); goto out; }
    snprintf(c->model_type, sizeof c->model_type, "%s", mt);
    if (!strcmp(mt, "llama")) c->arch = KS_ARCH_LLAMA;
    else if (!strcmp(mt, "mistral")) c->arch = KS_ARCH_MISTRAL;
    else if (!strcmp(mt, "qwen2")) c->arch = KS_ARCH_QWEN2;
    else if (!strcmp(mt, "phi3")) c->arch = KS_ARCH_PHI3;
    else {
        st = ks_errorf(KS_ERR_UNSUPPORTED, "%s: unknown architecture model_type \"%s\" (supported: llama, mistral, qwen2, phi3)", what, mt);
        goto out;
    }
    if ((st = need_int(root, "hidden_size", what, &c->dim)) || (st = need_int(root, "num_hidden_layers", what, &c->n_layers)) ||
        (st = need_int(root, "num_attention_heads", what, &c->n_heads)) ||
        (st = need_int(root, "intermediate_size", what, &c->ffn)) || (st = need_int(root, "vocab_size", what, &c->vocab)))
        goto out;
    c->n_kv_heads = (int)ks_json_int(root, "num_key_value_heads", c->n_heads);
    if (c->n_kv_heads <= 0 || c->n_heads % c->n_kv_heads) {
        st = ks_errorf(KS_ERR_FORMAT, "%s: num_attention_heads %d is not a multiple of num_key_value_heads %d", what,
                       c->n_heads, c->n_kv_heads);
        goto out;
    }
    const ks_json *hd = ks_json_get(root, "head_dim");
    if (hd && hd->type == KS_JSON_NUMBER) {
        if (!hd->is_int || hd->inum <= 0 || hd->inum > 1024) { st = ks_errorf(KS_ERR_FORMAT, "%s: bad head_dim", what); goto out; }
        c->head_dim = (int)hd->inum;
    } else {
        if (c->dim % c->n_heads) { st = ks_errorf(KS_ERR_FORMAT, "%s: hidden_size not divisible by heads", what); goto out; }
        c->head_dim = c->dim / c->n_heads;
    }
    if (c->head_dim % 2) { st = ks_errorf(KS_ERR_FORMAT, "%s: head_dim %d must be even", what, c->head_dim); goto out; }
    {
        /* Bounds far above every released model (Llama 3 405B: hidden 16384, intermediate
         * 53248, 126 layers, 128 heads; vocabularies up to ~256K) that keep the products the
         * engine forms in int (heads x head_dim, rows x width) and the parameter count in
         * int64 from overflowing: with them, nothing is allocated from a wrapped size. */
        static const struct { const char *key; int64_t max; } lim[] = {
            {"hidden_size", 1 << 20}, {"intermediate_size", 1 << 20}, {"num_hidden_layers", 1 << 16},
            {"num_attention_heads", 1 << 16}, {"vocab_size", 1 << 26}, {"num_attention_heads x head_dim", 1 << 20}};
        const int64_t val[] = {c->dim, c->ffn, c->n_layers, c->n_heads, c->vocab, (int64_t)c->n_heads * c->head_dim};
        for (size_t i = 0; i < sizeof lim / sizeof lim[0]; i++)
            if (val[i] > lim[i].max) {
                st = ks_errorf(KS_ERR_FORMAT, "%s: %s %lld is out of range (at most %lld)", what, lim[i].key,
                               (long long)val[i], (long long)lim[i].max);
                goto out;
            }
    }
    int64_t mp = ks_json_int(root, "max_position_embeddings", 4096); /* range-checked before the cast to int */
    if (mp <= 0 || mp > (1 << 30)) { st = ks_errorf(KS_ERR_FORMAT, "%s: bad max_position_embeddings (1 .. 2^30)", what); goto out; }
    c->max_pos = (int)mp;
    c->eps = (float)ks_json_num(root, "rms_norm_eps", 1e-6);
    if (!(c->eps > 0)) { st = ks_errorf(KS_ERR_FORMAT, "%s: rms_norm_eps must be > 0", what); goto out; }
    c->tied = ks_json_bool(root, "tie_word_embeddings", c->arch == KS_ARCH_QWEN2 ? 0 : 0);
    c->qkv_bias = c->arch == KS_ARCH_QWEN2 || ks_json_bool(root, "attention_bias", 0);
    c->o_bias = c->arch != KS_ARCH_QWEN2 && ks_json_bool(root, "attention_bias", 0);
    c->mlp_bias = ks_json_bool(root, "mlp_bias", 0);
    const char *act = ks_json_str(root, "hidden_act", "silu");
    if (strcmp(act, "silu") && strcmp(act, "swish")) {
        st = ks_errorf(KS_ERR_UNSUPPORTED, "%s: hidden_act \"%s\" is not supported (only silu)", what, act);
        goto out;
    }
    const ks_json *sw = ks_json_get(root, "sliding_window");
    if (sw && sw->type == KS_JSON_NUMBER && sw->is_int && sw->inum > 0) {
        /* qwen2 writes sliding_window but only applies it with use_sliding_window */
        int use = c->arch == KS_ARCH_QWEN2 ? ks_json_bool(root, "use_sliding_window", 0) : 1;
        if (use && sw->inum < c->max_pos) c->sliding_window = (int)sw->inum;
    }
    const ks_json *bos = ks_json_get(root, "bos_token_id");
    c->bos = (bos && bos->type == KS_JSON_NUMBER && bos->is_int) ? (int)bos->inum : -1;
    parse_eos(ks_json_get(root, "eos_token_id"), c);
    if ((st = parse_rope(root, what, c))) goto out;
out:
    ks_json_free(root);
    if (st) ks_config_free(c);
    return st;
}

ks_status ks_config_load(const char *dir, ks_config *cfg) {
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", dir);
    char *text;
    size_t len;
    ks_status st = ks_read_file(path, &text, &len);
    if (st) return st;
    st = ks_config_parse(text, len, path, cfg);
    free(text);
    return st;
}

void ks_rope_inv_freq(const ks_rope *r, int max_pos, float *inv_freq) {
    int half = r->head_dim / 2;
    for (int i = 0; i < half; i++) {
        double f = 1.0 / pow(r->theta, (2.0 * i) / r->head_dim);
        switch (r->type) {
        case KS_ROPE_DEFAULT: break;
        case KS_ROPE_LINEAR: f /= r->factor; break;
        case KS_ROPE_LLAMA3: {
            double low_wl = r->orig_max_pos / r->low_freq_factor, high_wl = r->orig_max_pos / r->high_freq_factor;
            double wl = 2 * M_PI / f;
            if (wl < high_wl) {
            } else if (wl > low_wl) f /= r->factor;
            else {
                double s = (r->orig_max_pos / wl - r->low_freq_factor) / (r->high_freq_factor - r->low_freq_factor);
                f = (1 - s) * f / r->factor + s * f;
            }
            break;
        }
        case KS_ROPE_LONGROPE: {
            const float *ext = (max_pos + 1 > r->orig_max_pos) ? r->long_factor : r->short_factor;
            f = f / ext[i];
            break;
        }
        }
        inv_freq[i] = (float)f;
    }
}
