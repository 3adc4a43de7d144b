/* engine.h — sessions: the KV cache, prefill with policy events, decode steps, sampling and
 * generation. Everything runs through the backend interface (backend.h).
 *
 * The engine's files, one job each (forward.h is their shared internal header):
 *   session.c   a session: create, reset, free, its KV layers and ids
 *   prefill.c   ks_session_prefill: passes over the prompt, each "done" or "restart(idx)"
 *   decode.c    ks_session_decode: one token through every layer, plain or as a recorded graph
 *   decode_batch.c  ks_sessions_decode: one token for each of n sessions, the weights read once
 *   forward.c   the blocks both forwards are made of: activations, a layer's q/k/v, attention
 *               arguments, o-projection and MLP, the head
 *   actions.c   policy events (built, fired) and the actions a handler asks for (ks_actions)
 *   sample.c    the sampler and the repetition penalty
 *   generate.c  ks_session_generate: prefill, then sample and decode with streaming and stops
 *   profile.c   the per-phase profiler */
#ifndef KS_ENGINE_H
#define KS_ENGINE_H

#include "model.h"
#include "policy.h"
#include "session_api.h"

#include <signal.h>
#include <stdio.h>

/* Sampling: temperature 0 = greedy (ties -> lowest id); else softmax(logits / T), ranked by
 * probability (ties -> lowest id), restricted to the top_k most likely (0 = all), then to the
 * smallest prefix whose share of that mass reaches top_p (1 = all), then to the tokens at least
 * min_p x as likely as the first (0 = off), and drawn with a seeded PRNG. ks_sampler_init sets
 * top_k = min_p = 0; set them after it. With both 0 the draws are those of the sampler before
 * they existed. */
typedef struct ks_sampler {
    float temperature;
    float top_p;
    uint64_t seed;
    uint64_t state;
    int top_k;
    float min_p;
} ks_sampler;

void ks_sampler_init(ks_sampler *s, float temperature, float top_p, uint64_t seed);
int32_t ks_sample(ks_sampler *s, const float *logits, int vocab);

/* The CTRL repetition penalty on logits[0..vocab), in place: every token with seen[id] != 0 has
 * its logit divided by penalty when positive, multiplied by it otherwise. */
void ks_repeat_penalty(float *logits, const unsigned char *seen, int vocab, float penalty);

/* Byte offset of the earliest occurrence in text[0..len) of any of the n stop strings, or -1
 * (none, or n == 0). */
long ks_stop_find(const char *text, size_t len, const char *const *stop, int n);

/* ---------------------------------------------------------------- per-phase profiler
 * With profiling on, every forward (a prefill pass, a decode step) books its time to phases:
 * the interval from one mark to the next goes to the phase of the later mark, so the phases
 * of a forward add up to its time from its first mark to its last. Backends with timestamps
 * (CUDA: events on the stream, nothing waits) are timed on their own clock; otherwise the
 * engine syncs and reads the host clock after each backend call (profile option 2, the CLI's
 * KS_PROFILE=sync, forces this on CUDA: then each phase also pays its launch latency). Off, it
 * costs one branch per call. */
typedef enum ks_phase {
    KS_PH_EMBED = 0,   /* token embedding */
    KS_PH_QKV,         /* attn_in: the attention norm, q, k, v projections and their RoPE */
    KS_PH_KV_APPEND,   /* KV cache append (incl. growth) */
    KS_PH_ATTENTION,   /* attention (prefill flash / decode) */
    KS_PH_OPROJ,       /* attn_out: output projection and its residual add */
    KS_PH_MLP,         /* mlp: the MLP norm, gate, up, SwiGLU, down and the residual add */
    KS_PH_POLICY,      /* policy handlers, incl. their host copies and device primitives */
    KS_PH_KV_EDIT,     /* retain, propagate's gather, restart / discard_kv frees */
    KS_PH_LM_HEAD,     /* head: the final norm and the lm_head matmul of one row */
    KS_PH_SYNC,        /* logits download and waiting for the device */
    KS_PH_ALLOC,       /* activation buffers: alloc and free */
    KS_PH_OTHER,       /* host bookkeeping between backend calls */
    KS_PH_COUNT
} ks_phase;

const char *ks_phase_name(ks_phase p);

typedef struct ks_profile {
    int on;                            /* 0 = off */
    int host_clock;                    /* 1: sync + host clock even when the backend has timestamps */
    double sec[2][KS_PH_COUNT];        /* [0] prefill, [1] decode: seconds per phase */
    long calls[2][KS_PH_COUNT];        /* marks per phase (backend calls, handler runs) */
    double wall[2];                    /* host seconds of the profiled forwards (first mark to done) */
    long forwards[2];                  /* prefills (ks_session_prefill calls) / decode steps profiled */
    int stamps;                        /* the last forward was timed with backend timestamps */
    /* running state */
    int stage;                         /* 0 prefill, 1 decode */
    double t_begin, t_last;
} ks_profile;

struct ks_session {
    ks_model *m;
    ks_backend *be;
    ks_kv_layer *kv;          /* (n_layers) */
    int n_past;               /* position of the next token */
    const ks_policy *policy;  /* not owned; NULL = full attention */
    int fallback_full;        /* on policy error: continue with full attention (and say so) */
    int policy_failed;        /* set when a fallback happened */
    char policy_error[1024];  /* the message of that failure */
    float *logits;            /* (vocab) host: logits of the last forward */
    int32_t *tokens;          /* prompt + generated ids, as given (not the restarted subset) */
    int n_tokens, cap_tokens;
    int n_prompt;
    /* what the policy did (for results and the REPL) */
    int restarted;            /* a restart happened */
    int32_t *restart_idx;     /* (n_restart) prompt indices kept by restart */
    int n_restart;
    int *prop_layer_n;        /* (n_layers) active rows after each layer in the final pass */
    int stopped_at;           /* layer where stop() ended the pass, or -1 */
    unsigned generation;
    /* timings (seconds) */
    double t_prefill, t_decode;
    int n_decoded;
    volatile sig_atomic_t *interrupt; /* checked between layers; NULL = never */
    /* results of the last ks_generate */
    int32_t *gen_ids;
    int n_gen;
    char *gen_text;
    ks_backend *owned_be;     /* (unused by sessions; models opened by name own theirs) */
    ks_profile prof;          /* per-phase times (ks_profile_enable); on at creation with the backend's opts.profile */
    int discard_kv;           /* the running prefill pass discards its KV rows (discard_kv action) */
    int graph_steps;          /* decode steps run as a recorded graph (ks_backend.graph_begin) */
    int joined_steps;         /* of those, steps run as joined graphs (every layer held, or every handler replayed) */
    int logits_stale;         /* the last step's logits are on the device only (ks_session_decode_greedy) */
    struct ks_decode_state *dec; /* decode.c: one-row buffers kept between decode steps and the
                                    recorded decode step (backend graphs); NULL until a decode */
    struct ks_list_keep *lkeep;  /* actions.c: per layer, the engine's copy of the last device attend
                                    list with a serial (reused while the policy attends the same
                                    tensor, as TokenSelect's cache hits do); NULL until one; dropped
                                    by ks_session_reset and by a change of policy (the serials are
                                    its tensors' ids) */
    struct ks_hold *hold;     /* hold.c: (n_layers) each layer's held decode attend (policy.h ks_action_hold),
                                 NULL until one; dropped by a prefill, a reset and a change of policy */
    int n_held;               /* layers with a hold */
    unsigned long long hold_gen; /* bumped by every hold placed or dropped */
    long long held_steps;     /* layer steps whose attend a hold repeated (no event fired) since the reset */
    long long replayed_steps; /* layer steps whose recorded handler replayed (no event fired) since the reset */
};

/* Sessions are made and freed by ks_session_create / ks_session_free (kvsieve.h; session.c). */
/* ks_session_reset and ks_session_kv_rows: session_api.h (lua/ calls them too). */

/* Prefill the prompt ids (appended after whatever the session holds). Fills s->logits. */
ks_status ks_session_prefill(ks_session *s, const int32_t *ids, int n);
/* One decode step with token id at position n_past. Fills s->logits. */
ks_status ks_session_decode(ks_session *s, int32_t id);
/* The same, and *next = the step's greedy id (ks_sample's at temperature 0: the lowest index of
 * the largest logit). On a device backend with argmax_rows (CUDA) the argmax runs on the device
 * and only the id comes back: s->logits are not filled then (s->logits_stale), and
 * ks_session_logits_fill downloads them on demand until the next step. ~512 KB less to download
 * and no host scan of a 128K vocabulary a step (bench/NOTES.md, issue 14 session 24). */
ks_status ks_session_decode_greedy(ks_session *s, int32_t id, int32_t *next);
/* s->logits filled where a greedy step left them on the device (nothing to do otherwise). */
ks_status ks_session_logits_fill(ks_session *s);
/* One decode step for n sessions of ONE model at once (decode_batch.c): session s[i] takes token
 * ids[i] at its own position n_past, with its own policy, KV rows and logits, exactly as
 * ks_session_decode(s[i], ids[i]) would; the dense ops (q/k/v, o-projection, MLP) run over the
 * n rows in one call each, so the weights are read once per step for all of them, and
 * attention runs per session over its own rows. n == 1 (and a session being profiled) takes
 * ks_session_decode itself. CPU: the logits are bit-identical to separate steps; CUDA: to
 * bf16 rounding (the n-row GEMM path rounds unlike the one-row gemv; decode_batch.c).
 * Each session's outcome goes to st[i] (n entries): KS_OK, its logits in s[i]->logits and
 * n_past advanced; else its own failure (a bad id, the context full, its policy, or a shared op
 * that failed for all), after which it is left as a failed ks_session_decode leaves it, and
 * msg (NULL, or n entries) receives a malloc'd copy of its message (NULL where KS_OK; the
 * caller frees). The other sessions go on. Returns KS_OK when the step ran (whatever st says);
 * KS_ERR_ARG with nothing run and st untouched: NULL s, ids or st, n < 0, a NULL session, a
 * session twice, sessions of different models; KS_ERR_OOM: no room to start. */
ks_status ks_sessions_decode(ks_session *const *s, const int32_t *ids, int n, ks_status *st, char **msg);

/* Streaming callback: piece is the newly completed UTF-8 text (may be ""), id the token.
 * Return non-zero to stop generation. */
typedef int (*ks_token_cb)(void *ud, int32_t id, const char *piece);

typedef struct ks_gen_params {
    int max_new;             /* tokens to generate */
    float temperature, top_p;
    uint64_t seed;
    int stop_at_eos;         /* default 1 */
    int top_k;               /* 0 = all (see ks_sampler) */
    float min_p;             /* 0 = off */
    float repeat_penalty;    /* 0 or 1 = off; the context is this call's ids and its output */
    const char *const *stop; /* n_stop stop strings: generation ends at the first one the decoded
                              * output holds; the streamed text stops before it, and text that may
                              * be the start of one is held back until it is known not to be */
    int n_stop;
} ks_gen_params;

/* Prefill ids then sample up to max_new tokens (stopping at EOS). out_ids (optional,
 * malloc'd) receives the generated ids. */
ks_status ks_session_generate(ks_session *s, const int32_t *ids, int n, const ks_gen_params *p, ks_token_cb cb,
                              void *ud, int32_t **out_ids, int *n_out);


/* Profiling: on = 1 turns it on (the backend's timestamps where it has them), 2 = on with sync +
 * host clock, 0 = off. Counters are kept; ks_profile_reset clears them. */
void ks_profile_enable(ks_session *s, int on);
void ks_profile_reset(ks_session *s);
/* The per-phase table of a profile (s->prof, or a copy): seconds per prefill and ms per decode
 * step, % of the stage's total, calls; then the phases' sum next to the host wall time.
 * `title` heads the table. Nothing is printed when nothing was profiled. */
void ks_profile_print(const ks_profile *p, FILE *f, const char *title);

#endif
