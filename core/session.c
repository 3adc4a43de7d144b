/* session.c — sessions: creation, reset and free, the KV layers they hold, the ids they were given. */
#include "forward.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void ks_session_kv_clear(ks_session *s, int l) {
    s->be->kv_free(s->be, &s->kv[l]);
    s->kv[l].n_kv_heads = s->m->cfg.n_kv_heads;
    s->kv[l].head_dim = s->m->cfg.head_dim;
}

ks_status ks_session_check_interrupt(ks_session *s) {
    if (s->interrupt && *s->interrupt) return ks_errorf(KS_ERR_INTERRUPTED, "interrupted");
    return KS_OK;
}

/* ks_session_create / ks_session_free: the public pair (kvsieve.h), the only one */
ks_status ks_session_create(ks_model *m, ks_session **out) {
    if (!m) return ks_errorf(KS_ERR_ARG, "ks_session_create: no model");
    ks_session *s = ks_calloc(1, sizeof *s);
    if (!s) return KS_ERR_OOM;
    s->m = m;
    s->be = m->be;
    s->stopped_at = -1;
    const ks_config *c = &m->cfg;
    s->kv = ks_calloc(c->n_layers, sizeof *s->kv);
    s->logits = m->be->host_alloc ? m->be->host_alloc(m->be, sizeof(float) * c->vocab)
                                  : ks_malloc(sizeof(float) * c->vocab);
    s->prop_layer_n = ks_calloc(c->n_layers, sizeof(int));
    if (!s->kv || !s->logits || !s->prop_layer_n) { ks_session_free(s); return KS_ERR_OOM; }
    for (int l = 0; l < c->n_layers; l++) {
        s->kv[l].n_kv_heads = c->n_kv_heads;
        s->kv[l].head_dim = c->head_dim;
    }
    if (m->be->opts.profile) ks_profile_enable(s, m->be->opts.profile); /* the backend's option */
    *out = s;
    return KS_OK;
}

void ks_session_reset(ks_session *s) {
    ks_decode_free(s);
    ks_hold_free(s);
    s->held_steps = 0;
    s->replayed_steps = 0;
    ks_list_keep_free(s); /* tensor ids are unique only within one policy's state */
    for (int l = 0; l < s->m->cfg.n_layers; l++) ks_session_kv_clear(s, l);
    s->n_past = 0;
    s->n_tokens = 0;
    s->n_prompt = 0;
    s->restarted = 0;
    free(s->restart_idx);
    s->restart_idx = NULL;
    s->n_restart = 0;
    s->stopped_at = -1;
    s->policy_failed = 0;
    s->policy_error[0] = 0;
    s->t_prefill = s->t_decode = 0;
    s->n_decoded = 0;
    s->graph_steps = 0;
}

void ks_session_free(ks_session *s) {
    if (!s) return;
    if (s->prof.on && s->be->opts.profile && ks_log_on()) { /* profiled by the backend's option: the table goes to the host's log */
        char *t = NULL;
        size_t tn = 0;
        FILE *f = open_memstream(&t, &tn);
        if (f) {
            ks_profile_print(&s->prof, f, "session");
            if (!fclose(f) && tn) ks_logf(KS_LOG_INFO, "%s", t);
        }
        free(t);
    }
    ks_hold_free(s);
    if (s->kv) {
        for (int l = 0; l < s->m->cfg.n_layers; l++) s->be->kv_free(s->be, &s->kv[l]);
        free(s->kv);
    }
    ks_decode_free(s);
    ks_list_keep_free(s);
    if (s->logits) {
        if (s->be->host_alloc) s->be->host_free(s->be, s->logits);
        else free(s->logits);
    }
    free(s->tokens);
    free(s->restart_idx);
    free(s->prop_layer_n);
    free(s->gen_ids);
    free(s->gen_text);
    free(s);
}

ks_status ks_session_push_tokens(ks_session *s, const int32_t *ids, int n) {
    if (s->n_tokens + n > s->cap_tokens) {
        int cap = KS_MAX(s->n_tokens + n, s->cap_tokens * 2 + 64);
        int32_t *t = ks_realloc(s->tokens, sizeof(int32_t) * cap);
        if (!t) return KS_ERR_OOM;
        s->tokens = t;
        s->cap_tokens = cap;
    }
    memcpy(s->tokens + s->n_tokens, ids, sizeof(int32_t) * n);
    s->n_tokens += n;
    return KS_OK;
}

size_t ks_session_kv_rows(const ks_session *s, int layer) {
    size_t r = 0;
    const ks_kv_layer *L = &s->kv[layer];
    if (!L->n) return 0;
    for (int h = 0; h < L->n_kv_heads; h++) r += L->n[h];
    return r;
}
