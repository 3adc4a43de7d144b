/* engine.h — sessions: the KV cache, prefill with policy events, decode steps, sampling and
 * generation. Everything runs through the backend interface (backend.h). */
#ifndef KS_ENGINE_H
#define KS_ENGINE_H

#include "model.h"
#include "policy.h"

#include <signal.h>

/* Sampling: temperature 0 = greedy (ties -> lowest id); else softmax(logits / T) restricted
 * to the smallest set whose mass reaches top_p (1 = all), drawn with a seeded PRNG. */
typedef struct ks_sampler {
    float temperature;
    float top_p;
    uint64_t seed;
    uint64_t state;
} ks_sampler;

void ks_sampler_init(ks_sampler *s, float temperature, float top_p, uint64_t seed);
int32_t ks_sample(ks_sampler *s, const float *logits, int vocab);

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
};

ks_status ks_session_new(ks_model *m, ks_session **out);
void ks_session_free_(ks_session *s);
/* Forget everything (KV rows freed, positions back to 0). */
void ks_session_reset(ks_session *s);

/* Prefill the prompt ids (appended after whatever the session holds). Fills s->logits. */
ks_status ks_session_prefill(ks_session *s, const int32_t *ids, int n);
/* One decode step with token id at position n_past. Fills s->logits. */
ks_status ks_session_decode(ks_session *s, int32_t id);

/* Streaming callback: piece is the newly completed UTF-8 text (may be ""), id the token.
 * Return non-zero to stop generation. */
typedef int (*ks_token_cb)(void *ud, int32_t id, const char *piece);

typedef struct ks_gen_params {
    int max_new;             /* tokens to generate */
    float temperature, top_p;
    uint64_t seed;
    int stop_at_eos;         /* default 1 */
} ks_gen_params;

/* Prefill ids then sample up to max_new tokens (stopping at EOS). out_ids (optional,
 * malloc'd) receives the generated ids. */
ks_status ks_session_generate(ks_session *s, const int32_t *ids, int n, const ks_gen_params *p, ks_token_cb cb,
                              void *ud, int32_t **out_ids, int *n_out);

/* Bytes of KV storage in use (rows x heads x head_dim x 2 x sizeof element). */
size_t ks_session_kv_rows(const ks_session *s, int layer);

#endif
