/* session_api.c — the accessors of session_api.h: one field read (or write) each. */
#include "session_api.h"

#include "engine.h"

ks_model *ks_session_model(const ks_session *s) { return s->m; }

int ks_session_n_tokens(const ks_session *s) { return s->n_tokens; }

const int32_t *ks_session_prompt_ids(const ks_session *s, int *n) {
    *n = KS_MIN(s->n_prompt, s->n_tokens);
    return s->tokens;
}

int ks_session_active_rows(const ks_session *s, int layer) { return s->prop_layer_n[layer]; }

int ks_session_stopped_at(const ks_session *s) { return s->stopped_at; }
long long ks_session_held_steps(const ks_session *s) { return s->held_steps; }
long long ks_session_replayed_steps(const ks_session *s) { return s->replayed_steps; }

volatile sig_atomic_t *ks_session_interrupt(const ks_session *s) { return s->interrupt; }

void ks_session_set_interrupt(ks_session *s, volatile sig_atomic_t *flag) { s->interrupt = flag; }

const ks_config *ks_model_config(const ks_model *m) { return &m->cfg; }

const char *ks_model_dir(const ks_model *m) { return m->dir; }

const ks_tokenizer *ks_model_tokenizer(const ks_model *m) { return m->tok; }
