/* forward.h — the engine's own seam between its files (not for lua/ or repl/: they use engine.h).
 *
 * One request, as the engine runs it (engine.h has the session and the calls around it):
 *   ks_session_generate (generate.c)
 *     ks_session_prefill (prefill.c)   passes over the prompt: each ends "done" or "restart(idx)"
 *     ks_sample (sample.c)             the next id from s->logits
 *     ks_session_decode (decode.c)     one row through every layer, plain or as a recorded graph
 * and several requests stepped together (batch.c) decode through ks_sessions_decode
 * (decode_batch.c): one row per session, the dense blocks over all rows at once, attention and
 * policy events per session.
 * Both forwards are made of the blocks below (forward.c), each one call of the backend's coarse
 * forward ops (backend.h): a layer's q/k/v (attn_in), its attention, its tail (attn_out, mlp)
 * and the head. What a backend fuses inside them is its own business. Policy events are built and fired by
 * actions.c, which also validates and records the actions a handler asks for (ks_actions, a value
 * that the forward carries through the layer and frees). Per-phase timing: profile.c. */
#ifndef KS_FORWARD_H
#define KS_FORWARD_H

#include "engine.h"

/* ---------------------------------------------------------------- activations (forward.c)
 * The activations of a forward over n rows: the backend buffers of ks_acts (backend.h has what
 * each holds when), plus the pre-RoPE mark. kpre is not a buffer: it equals a.k in pre-RoPE
 * mode (the policy wants keys before RoPE; they stay unrotated and attention rotates q and k
 * itself), NULL otherwise. Scratch beyond these (the MLP's intermediates) is each backend's. */
typedef struct ks_fwd_buf {
    ks_acts a;
    float *kpre;
} ks_fwd_buf;

/* Backend buffers for n rows (b zeroed first; on failure nothing stays allocated). */
ks_status ks_fwd_alloc(ks_backend *be, const ks_config *c, int n, int pre_rope, ks_fwd_buf *b);
/* Frees what b holds and zeroes it (a zeroed b is fine). */
void ks_fwd_free(ks_backend *be, ks_fwd_buf *b);

/* ---------------------------------------------------------------- layer blocks (forward.c)
 * The backend's forward ops (backend.h) with the profile's marks; one call each, no choices. */

/* be->attn_in of layer l for n rows at pos (n): norm, q/k/v, RoPE unless pre-RoPE mode (b->kpre),
 * and with L non-NULL the rows appended to L. Layer l's rows are put back in logical order first
 * when a KV ring rotated them (ks_ring_restore): prefill and plain decode see them as always. */
ks_status ks_layer_qkv(ks_session *s, int l, ks_fwd_buf *b, int n, const int32_t *pos, int max_pos, ks_kv_layer *L);
/* The same for one decode row whose cache row goes to L as given: a ring step's view of layer l
 * (decode.c), whose row counts name the row to overwrite; the rows stay rotated. */
ks_status ks_layer_qkv_at(ks_session *s, int l, ks_fwd_buf *b, const int32_t *pos, ks_kv_layer *L);
/* Attention arguments for n query rows at qpos (n), the largest being max_pos; act's attend
 * lists (NULL or no attend: every row of the layer). The arguments point into c, qpos and act. */
ks_attn_args ks_layer_attn_args(const ks_session *s, const ks_fwd_buf *b, int n, const int32_t *qpos, int max_pos,
                                const ks_actions *act);
/* be->attention of layer l: q over the layer's KV rows, the output into xn. */
ks_status ks_layer_attention(ks_session *s, int l, ks_fwd_buf *b, const ks_attn_args *aa);
/* The layer after attention (its output in xn): be->attn_out then be->mlp. x (n, dim) updated. */
ks_status ks_layer_tail(ks_session *s, int l, ks_fwd_buf *b, int n);
/* be->head of rows row .. row+n-1 of x into lg (n, vocab, backend memory). */
ks_status ks_head_compute(ks_session *s, ks_fwd_buf *b, int row, int n, float *lg);
/* Row `row`'s logits into s->logits (vocab, host). */
ks_status ks_head_logits(ks_session *s, ks_fwd_buf *b, int row);

/* ---------------------------------------------------------------- events and actions (actions.c) */

/* An event of `kind` at layer (-1: none) of pass with n active rows, the model's sizes filled in;
 * the caller sets the views (q, k, pos, kv, ...) the kind carries. */
void ks_event_init(ks_session *s, ks_event *ev, ks_event_kind kind, int layer, int pass, int n);
/* Run the policy's handler for ev (none: KS_OK). A failure becomes a policy error naming the
 * policy; policy errors, interrupts and OOM stay as they are. What the handler asked for is in
 * ev->act, also after a failure. */
ks_status ks_event_fire(ks_session *s, ks_event *ev);
/* Move the actions out of ev (ev->act is left empty). */
ks_actions ks_actions_take(ks_event *ev);
/* Free the lists of a (per-head ones have n_kv_heads entries) and empty it. */
void ks_actions_free(ks_actions *a, int n_kv_heads);
/* a's retain lists, checked against layer l as it is now, applied to its KV rows (a device list
 * is downloaded and checked here). */
ks_status ks_actions_apply_retain(ks_session *s, int l, const ks_actions *a);
/* A propagate device list (a->prop_dbuf) downloaded into a->prop_idx and checked against the
 * n_rows rows of the pass (layer l names it in messages); nothing without one. */
ks_status ks_actions_host_propagate(ks_session *s, int l, int n_rows, ks_actions *a);

/* Deferred checks of attend device lists (actions.c, policy.h "Device lists"): at most this
 * many lists per check (more: checked on the host at once). */
#define KS_DEVCHECK_HEADS 128
typedef struct ks_devcheck ks_devcheck;
/* The checks queued since the last sync: their words downloaded (the stream is drained: the
 * caller just downloaded the logits), the first failure as a policy error naming the policy. */
ks_status ks_devcheck_sync(ks_session *s);
/* Forget the checks queued (a forward begins; a failed one left some). */
void ks_devcheck_reset(ks_session *s);
void ks_devcheck_free(ks_backend *be, ks_devcheck *c);

/* ---------------------------------------------------------------- session helpers (session.c) */

/* Free layer l's KV rows and leave it empty, ready for the next append. */
void ks_session_kv_clear(ks_session *s, int l);
/* Append n ids to s->tokens. */
ks_status ks_session_push_tokens(ks_session *s, const int32_t *ids, int n);
/* KS_ERR_INTERRUPTED when the session's interrupt flag is up. */
ks_status ks_session_check_interrupt(ks_session *s);

/* ---------------------------------------------------------------- generated text (generate.c)
 * Shared by ks_session_generate and the batch stepper (batch.c). */

/* Bytes at the end of text[0..len) that are a proper prefix of some stop string (the longest
 * such suffix): they may become a stop string with the next token, so they wait. */
size_t ks_stop_holdback(const char *text, size_t len, const char *const *stop, int n);
/* Longest prefix of s (len n) that is complete UTF-8. */
size_t ks_utf8_complete(const char *s, size_t n);
/* id is one of the model's end-of-sequence ids. */
int ks_is_eos(const ks_config *c, int32_t id);

/* ---------------------------------------------------------------- decode state (decode.c) */

/* Drop the recorded decode step (the KV cache changes under it). */
void ks_decode_drop_graph(ks_session *s);
/* Free the decode state (buffers and graph); s->dec becomes NULL. */
void ks_decode_free(ks_session *s);
/* Free the kept attend lists (actions.c); s->lkeep becomes NULL. */
void ks_list_keep_free(ks_session *s);
/* Held attends (hold.c; policy.h ks_action_hold). ks_hold_commit: the hold that act asked for
 * (act->hold) at layer l, replacing the layer's previous one (done by the decode loop after the
 * event). ks_hold_replay: with a hold at ev's layer (ev a DECODE_QKV event made by ks_event_init
 * with its kv), its attend into ev->act, 1; 0 without a hold, or when the attend no longer fits
 * the layer (the hold is dropped, nothing set: fire the event); -1 out of memory. ks_hold_on: layer l has a hold;
 * ks_holds_all: every layer has one. ks_hold_free: every hold dropped and the table freed. */
ks_status ks_hold_commit(ks_session *s, int layer, const ks_actions *act);
int ks_hold_replay(ks_session *s, ks_event *ev);
int ks_hold_on(const ks_session *s, int layer);
/* Layer l's hold has a trailing range that moves with the rows. */
int ks_hold_moves(const ks_session *s, int layer);
int ks_holds_all(const ks_session *s);
void ks_hold_free(ks_session *s);
/* Where the session's deferred checks live (in the decode state, created here if needed; NULL:
 * out of memory). */
ks_devcheck **ks_decode_devcheck(ks_session *s);

/* ---------------------------------------------------------------- KV ring (decode.c)
 * The request's ring (policy.h ks_policy.ring_sinks / ring_budget): single-session decode steps
 * overwrite a full layer's oldest row after the sinks in place, so its rows sit rotated. Every
 * other user of a layer's rows calls ks_ring_restore first (ks_layer_qkv, ks_event_fire,
 * ks_actions_apply_retain do; a generation ends with ks_ring_restore_all). */

/* The ring runs for this session's decode steps: its policy declared one and the backend is no
 * tensor-parallel composite (whose rank layers keep their own row counts). */
int ks_ring_on(const ks_session *s);
/* Layer l's rows in logical order again (one kv_retain permutation; nothing when not rotated). */
ks_status ks_ring_restore(ks_session *s, int l);
/* Every layer's, and the ring forgotten until the next ring step. */
ks_status ks_ring_restore_all(ks_session *s);

/* ---------------------------------------------------------------- profiler (profile.c) */

/* Start (stage 0: prefill, 1: decode) and end one profiled forward; nothing when profiling is off. */
void ks_prof_begin(ks_session *s, int stage);
void ks_prof_end(ks_session *s);
/* Book the time since the previous mark to phase ph (profiling on). */
void ks_prof_mark(ks_session *s, ks_phase ph);
/* one branch when profiling is off */
#define PROF(s, ph) do { if ((s)->prof.on) ks_prof_mark((s), (ph)); } while (0)

#endif
