/* api.c — the public embedding API (include/kvsieve.h) over models, sessions and the engine. */
#include "engine.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

ks_status ks_backend_create(const char *name, ks_backend **out) {
    *out = NULL;
    if (!name || !strcmp(name, "cpu")) return ks_cpu_backend_create(0, out);
    if (!strcmp(name, "cuda")) {
#ifdef KS_HAVE_CUDA
        extern ks_status ks_cuda_backend_create(int device, ks_backend **out);
        return ks_cuda_backend_create(0, out);
#else
        return ks_errorf(KS_ERR_UNSUPPORTED, "this build has no CUDA backend (build with make CUDA=1)");
#endif
    }
    return ks_errorf(KS_ERR_ARG, "unknown backend \"%s\" (cpu or cuda)", name);
}

ks_status ks_model_open(const char *dir, const char *backend, ks_model **out) {
    *out = NULL;
    if (!dir) return ks_errorf(KS_ERR_ARG, "ks_model_open: no model folder given");
    ks_backend *be = NULL;
    ks_status st = ks_backend_create(backend, &be);
    if (st) return st;
    st = ks_model_load(dir, be, 0, out);
    if (st) { be->destroy(be); return st; }
    return KS_OK;
}

void ks_model_close(ks_model *m) {
    if (!m) return;
    ks_backend *be = m->be;
    ks_model_free(m);
    if (be) be->destroy(be);
}

ks_status ks_tokenize(ks_model *m, const char *text, int add_special, int32_t **ids, int *n) {
    if (!ids || !n) return ks_errorf(KS_ERR_ARG, "ks_tokenize: NULL output pointer");
    *ids = NULL;
    *n = 0;
    if (!m || !text) return ks_errorf(KS_ERR_ARG, "ks_tokenize: no %s", m ? "text" : "model");
    if (!m->tok) return ks_errorf(KS_ERR_IO, "%s: model has no tokenizer.json", m->dir);
    size_t nn = 0;
    ks_status st = ks_tokenizer_encode(m->tok, text, strlen(text), add_special, ids, &nn);
    if (!st && nn > INT32_MAX) { /* the count is an int */
        free(*ids);
        *ids = NULL;
        return ks_errorf(KS_ERR_ARG, "ks_tokenize: the text gives %zu tokens, more than %d", nn, INT32_MAX);
    }
    *n = (int)nn;
    return st;
}

ks_status ks_detokenize_ex(ks_model *m, const int32_t *ids, int n, unsigned flags, char **text) {
    if (!text) return ks_errorf(KS_ERR_ARG, "ks_detokenize: NULL text pointer");
    *text = NULL;
    if (!m) return ks_errorf(KS_ERR_ARG, "ks_detokenize: no model");
    if (n < 0 || (n > 0 && !ids)) return ks_errorf(KS_ERR_ARG, "ks_detokenize: bad id list (%d ids at %p)", n, (const void *)ids);
    if (flags & ~(unsigned)KS_DECODE_SPECIAL) return ks_errorf(KS_ERR_ARG, "ks_detokenize: unknown flags 0x%x", flags);
    if (!m->tok) return ks_errorf(KS_ERR_IO, "%s: model has no tokenizer.json", m->dir);
    size_t len;
    /* HF's decode(ids, skip_special_tokens=not KS_DECODE_SPECIAL) */
    return ks_tokenizer_decode(m->tok, ids, (size_t)n, !(flags & KS_DECODE_SPECIAL), text, &len);
}

ks_status ks_detokenize(ks_model *m, const int32_t *ids, int n, char **text) {
    return ks_detokenize_ex(m, ids, n, 0, text);
}

ks_status ks_session_create(ks_model *m, ks_session **out) {
    if (!m) return ks_errorf(KS_ERR_ARG, "ks_session_create: no model");
    return ks_session_new(m, out);
}

void ks_session_free(ks_session *s) {
    if (!s) return;
    free(s->gen_ids);
    free(s->gen_text);
    ks_session_free_(s);
}

ks_status ks_session_set_policy(ks_session *s, ks_policy *p) {
    s->policy = p;
    return KS_OK;
}

void ks_session_set_fallback(ks_session *s, int fallback_full) { s->fallback_full = fallback_full; }

void ks_generate_opts_default(ks_generate_opts *o) {
    memset(o, 0, sizeof *o);
    o->max_new_tokens = 64;
    o->top_p = 1;
    o->add_special = 1;
}

ks_status ks_generate_ids(ks_session *s, const int32_t *ids, int n, const ks_generate_opts *o, ks_stream_fn cb,
                          void *ud) {
    ks_generate_opts def;
    if (!o) { ks_generate_opts_default(&def); o = &def; }
    if (!s) return ks_errorf(KS_ERR_ARG, "ks_generate: no session");
    /* the options are checked before anything runs: a negative count, a NaN or negative
     * temperature, a top_p outside (0, 1] is the caller's mistake, named, never reinterpreted */
    if (o->max_new_tokens < 0)
        return ks_errorf(KS_ERR_ARG, "ks_generate: max_new_tokens must be >= 0, got %d", o->max_new_tokens);
    if (!(o->temperature >= 0) || isinf(o->temperature))
        return ks_errorf(KS_ERR_ARG, "ks_generate: temperature must be a finite number >= 0, got %g", (double)o->temperature);
    if (!(o->top_p > 0 && o->top_p <= 1))
        return ks_errorf(KS_ERR_ARG, "ks_generate: top_p must be in (0, 1], got %g", (double)o->top_p);
    ks_session_reset(s);
    free(s->gen_ids);
    free(s->gen_text);
    s->gen_ids = NULL;
    s->gen_text = NULL;
    s->n_gen = 0;
    ks_gen_params p = {.max_new = o->max_new_tokens, .temperature = o->temperature, .top_p = o->top_p,
                       .seed = o->seed, .stop_at_eos = 1};
    const ks_policy *pol = s->policy;
    ks_status st = ks_session_generate(s, ids, n, &p, cb, ud, &s->gen_ids, &s->n_gen);
    if (st == KS_ERR_POLICY && s->fallback_full && pol) {
        /* the policy failed: say so and answer with full attention */
        snprintf(s->policy_error, sizeof s->policy_error, "%s", ks_last_error());
        s->policy_failed = 1;
        char keep[sizeof s->policy_error];
        memcpy(keep, s->policy_error, sizeof keep);
        ks_session_reset(s);
        memcpy(s->policy_error, keep, sizeof keep);
        s->policy_failed = 1;
        free(s->gen_ids);
        s->gen_ids = NULL;
        s->policy = NULL;
        st = ks_session_generate(s, ids, n, &p, cb, ud, &s->gen_ids, &s->n_gen);
        s->policy = pol;
    }
    if (s->m->tok && s->gen_ids) {
        size_t len;
        int ng = s->n_gen;
        /* the EOS token is not part of the text */
        if (ng > 0) {
            for (int i = 0; i < s->m->cfg.n_eos; i++)
                if (s->gen_ids[ng - 1] == s->m->cfg.eos[i]) { ng--; break; }
        }
        ks_status st2 = ks_tokenizer_decode(s->m->tok, s->gen_ids, (size_t)ng, 1, &s->gen_text, &len);
        if (!st && st2) st = st2;
    }
    return st;
}

ks_status ks_generate(ks_session *s, const char *prompt, const ks_generate_opts *o, ks_stream_fn cb, void *ud) {
    ks_generate_opts def;
    if (!o) { ks_generate_opts_default(&def); o = &def; }
    int32_t *ids;
    int n;
    ks_status st = ks_tokenize(s->m, prompt, o->add_special, &ids, &n);
    if (st) return st;
    if (n == 0) { free(ids); return ks_errorf(KS_ERR_ARG, "generate: the prompt tokenizes to nothing"); }
    st = ks_generate_ids(s, ids, n, o, cb, ud);
    free(ids);
    return st;
}

const int32_t *ks_result_ids(const ks_session *s, int *n) {
    if (n) *n = s->n_gen;
    return s->gen_ids;
}
const char *ks_result_text(const ks_session *s) { return s->gen_text ? s->gen_text : ""; }
int ks_result_prompt_tokens(const ks_session *s) { return s->n_prompt; }
double ks_result_prefill_seconds(const ks_session *s) { return s->t_prefill; }
double ks_result_decode_seconds(const ks_session *s) { return s->t_decode; }

int ks_result_kept(const ks_session *s, int layer, int kv_head, const int32_t **positions) {
    if (layer < 0 || layer >= s->m->cfg.n_layers || kv_head < 0 || kv_head >= s->m->cfg.n_kv_heads) return -1;
    const ks_kv_layer *L = &s->kv[layer];
    if (!L->n) { if (positions) *positions = NULL; return 0; }
    if (positions) *positions = L->pos + (size_t)kv_head * L->capacity;
    return L->n[kv_head];
}

int ks_result_restart(const ks_session *s, const int32_t **prompt_idx) {
    if (prompt_idx) *prompt_idx = s->restart_idx;
    return s->restarted ? s->n_restart : 0;
}

const char *ks_result_policy_error(const ks_session *s) { return s->policy_failed ? s->policy_error : ""; }

int ks_model_n_layers(const ks_model *m) { return m->cfg.n_layers; }
int ks_model_n_kv_heads(const ks_model *m) { return m->cfg.n_kv_heads; }
int ks_model_vocab(const ks_model *m) { return m->cfg.vocab; }
int ks_model_max_context(const ks_model *m) { return m->cfg.max_pos; }
