/* session_api.h — what the layers above core/ (lua/) read of a session and a model, as calls.
 *
 * struct ks_session (engine.h) and struct ks_model (model.h) are core's own: their fields move
 * and change with the engine. The Lua binding goes through these accessors instead, so it
 * depends on the engine's API, not on its structs. Each is a plain read (or, for the interrupt
 * flag, a plain write) of the field named in its comment; none allocates, fails or has any
 * other effect. A session's values are those after its last request (ks_generate*): results
 * in the sense of kvsieve.h's ks_result_* calls, which this header completes for lua/.
 * Implemented in core/session_api.c. */
#ifndef KS_SESSION_API_H
#define KS_SESSION_API_H

#include "kvsieve.h"

#include "config.h"
#include "tokenizer.h"

#include <signal.h>
#include <stdint.h>

/* ---------------------------------------------------------------- sessions */

/* Forget everything (KV rows freed, positions back to 0): the start of a new conversation. */
void ks_session_reset(ks_session *s);
/* KV rows in use at a layer, summed over its KV heads (s->kv[layer]). */
size_t ks_session_kv_rows(const ks_session *s, int layer);
/* The model the session runs (s->m). */
ks_model *ks_session_model(const ks_session *s);
/* Prompt and generated ids held, as given (s->n_tokens). */
int ks_session_n_tokens(const ks_session *s);
/* The ids of the last request's prompt, as given (not the restarted subset): *n of them
 * (min(s->n_prompt, s->n_tokens)); the pointer is valid until the session runs again. */
const int32_t *ks_session_prompt_ids(const ks_session *s, int *n);
/* Rows that went on after layer `layer` in the last prefill's final pass (s->prop_layer_n);
 * layer must be in [0, n_layers). */
int ks_session_active_rows(const ks_session *s, int layer);
/* The layer where a policy's stop() ended the last pass, or -1 (s->stopped_at). */
int ks_session_stopped_at(const ks_session *s);
/* The flag the session checks between layers (Ctrl-C), NULL = none (s->interrupt). */
volatile sig_atomic_t *ks_session_interrupt(const ks_session *s);
void ks_session_set_interrupt(ks_session *s, volatile sig_atomic_t *flag);

/* Drop the held decode attend of layer `layer` (< 0: of every layer; policy.h ks_action_hold):
 * that layer's decode event fires again from the next step. No hold: nothing happens. */
void ks_hold_drop(ks_session *s, int layer);
/* Layer steps whose attend a hold repeated without firing the event, since the last reset
 * (s->held_steps). */
long long ks_session_held_steps(const ks_session *s);
/* Layer steps whose recorded decode handler replayed without firing the event (policy.h
 * ks_action_replay) since the session's last reset (s->replayed_steps). */
long long ks_session_replayed_steps(const ks_session *s);

/* ---------------------------------------------------------------- models */

/* The model's configuration (&m->cfg): dimensions, RoPE, architecture name. */
const ks_config *ks_model_config(const ks_model *m);
/* The folder it was loaded from (m->dir). */
const char *ks_model_dir(const ks_model *m);
/* Its tokenizer, or NULL when the folder has none (m->tok). */
const ks_tokenizer *ks_model_tokenizer(const ks_model *m);

#endif
