/* kvsieve.h — the public embedding API.
 *
 * kvsieve is an LLM inference engine (CPU reference backend, CUDA backend) whose
 * token-pruning policies are Lua 5.4 scripts. This header is the whole surface a
 * host program needs: opaque handles, create/free pairs, int status codes and a
 * per-thread error text. Nothing here ever calls exit() or aborts on bad input.
 *
 * Conventions
 *   - Every function that can fail returns ks_status (KS_OK == 0). On failure the
 *     text of the error is available from ks_last_error() on the same thread until
 *     the next failing call on that thread.
 *   - Handles are opaque; each ks_<noun>_create/_open has a matching _free.
 *   - Token ids are int32_t; positions are int32_t.
 */
#ifndef KVSIEVE_H
#define KVSIEVE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------- status */

typedef enum ks_status {
    KS_OK = 0,
    KS_ERR_IO = 1,          /* a file is missing or unreadable */
    KS_ERR_FORMAT = 2,      /* a file is malformed (JSON, safetensors, tokenizer) */
    KS_ERR_SHAPE = 3,       /* a tensor's shape disagrees with the config */
    KS_ERR_DTYPE = 4,       /* unsupported or mismatched dtype */
    KS_ERR_UNSUPPORTED = 5, /* an architecture or feature we do not implement */
    KS_ERR_OOM = 6,         /* host or device memory exhausted */
    KS_ERR_ARG = 7,         /* an invalid argument from the caller */
    KS_ERR_CONTEXT = 8,     /* the prompt (plus generation) exceeds the context */
    KS_ERR_POLICY = 9,      /* a policy failed (script error, invalid action) */
    KS_ERR_INTERRUPTED = 10,/* the request was interrupted (Ctrl-C, stop) */
    KS_ERR_DEVICE = 11,     /* a GPU / backend runtime error */
    KS_ERR_INTERNAL = 12,   /* a bug: an invariant was violated */
} ks_status;

/* The message of the last error recorded on this thread ("" if none). */
const char *ks_last_error(void);
/* A short constant name for a status ("io", "format", ...). */
const char *ks_status_name(ks_status s);


/* ---------------------------------------------------------------- models and sessions */

typedef struct ks_model ks_model;       /* weights + config + tokenizer on one backend */
typedef struct ks_session ks_session;   /* one conversation: KV cache, positions, policy */
typedef struct ks_policy ks_policy;     /* a token-pruning policy (Lua script or C struct) */

/* Open a Hugging Face model folder (config.json, tokenizer.json, *.safetensors).
 * backend: "cpu" (default when NULL) or "cuda" (when built with CUDA). */
ks_status ks_model_open(const char *dir, const char *backend, ks_model **out);
void ks_model_close(ks_model *m);

/* Tokenize UTF-8 text (add_special: BOS etc. as the tokenizer's post-processor says).
 * *ids is malloc'd (free it). Decode returns a malloc'd NUL-terminated string. */
ks_status ks_tokenize(ks_model *m, const char *text, int add_special, int32_t **ids, int *n);
/* Decode, dropping special tokens (HF's decode(ids, skip_special_tokens=True)). Ids outside
 * the tokenizer's vocabulary are KS_ERR_ARG. */
ks_status ks_detokenize(ks_model *m, const int32_t *ids, int n, char **text);

/* Flags of ks_detokenize_ex (OR them; 0 behaves as ks_detokenize). */
enum {
    /* Keep special tokens in the text, as HF's decode(ids, skip_special_tokens=False):
     * then the text of ks_tokenize(m, x, 0, ...) decodes back to x even where x holds a
     * special token such as Qwen's "<|endoftext|>" or Llama's "<s>". */
    KS_DECODE_SPECIAL = 1u << 0,
};
/* Decode with flags; an unknown flag bit is KS_ERR_ARG. */
ks_status ks_detokenize_ex(ks_model *m, const int32_t *ids, int n, unsigned flags, char **text);

ks_status ks_session_create(ks_model *m, ks_session **out);
void ks_session_free(ks_session *s);

/* Attach a policy (NULL = full attention). The session does not own it. */
ks_status ks_session_set_policy(ks_session *s, ks_policy *p);
/* On a policy failure: 0 = stop the request with the error (default); 1 = fall back to
 * full attention for the rest of the request and report it in the result. */
void ks_session_set_fallback(ks_session *s, int fallback_full);

/* ---------------------------------------------------------------- generation */

typedef struct ks_generate_opts {  /* checked by ks_generate*: out of range is KS_ERR_ARG */
    int max_new_tokens;     /* >= 0, default 64 */
    float temperature;      /* finite, >= 0; 0 = greedy (default) */
    float top_p;            /* in (0, 1], default 1 */
    uint64_t seed;          /* default 0 */
    int add_special;        /* tokenize the prompt with BOS etc. (default 1) */
} ks_generate_opts;

/* Fill opts with the defaults above. */
void ks_generate_opts_default(ks_generate_opts *o);

/* Called for each generated token with the newly completed text (may be ""); return
 * non-zero to stop. */
typedef int (*ks_stream_fn)(void *ud, int32_t id, const char *piece);

/* Generate a reply to `prompt` from a fresh state (the session is reset first).
 * On return, results are readable with the ks_result_* calls below until the next
 * generate or reset. */
ks_status ks_generate(ks_session *s, const char *prompt, const ks_generate_opts *o, ks_stream_fn cb, void *ud);
/* Same, from token ids. */
ks_status ks_generate_ids(ks_session *s, const int32_t *ids, int n, const ks_generate_opts *o, ks_stream_fn cb,
                          void *ud);

/* ---------------------------------------------------------------- results */

const int32_t *ks_result_ids(const ks_session *s, int *n);        /* generated ids */
const char *ks_result_text(const ks_session *s);                   /* generated text */
int ks_result_prompt_tokens(const ks_session *s);
double ks_result_prefill_seconds(const ks_session *s);
double ks_result_decode_seconds(const ks_session *s);
/* KV rows resident at a layer and KV head, with their token positions (owned by the
 * session; valid until the next call that changes it). Returns the row count, -1 on bad args. */
int ks_result_kept(const ks_session *s, int layer, int kv_head, const int32_t **positions);
/* Prompt indices kept by a restart (GemFilter, two-pass ASL), or 0 if none happened. */
int ks_result_restart(const ks_session *s, const int32_t **prompt_idx);
/* Non-empty when a policy failed and the request fell back to full attention. */
const char *ks_result_policy_error(const ks_session *s);

/* ---------------------------------------------------------------- policies
 * A policy is a Lua 5.4 file returning {name, params, handlers...}; see lua/policy_lua.h for
 * the file format, the event object and the sandbox. Each policy runs in its own sandboxed
 * Lua state; errors come back as KS_ERR_POLICY with "policy NAME: EVENT (layer L): FILE:LINE: ...". */

/* Load by name (policies/NAME.lua on $KVSIEVE_POLICY_PATH, ./policies, <exe>/../policies) or
 * by path. m may be NULL (then the policy sees no model config). */
ks_status ks_policy_load(ks_model *m, const char *name_or_path, ks_policy **out);
/* Load from source text; chunkname names it in messages. */
ks_status ks_policy_load_string(ks_model *m, const char *chunkname, const char *source, ks_policy **out);
/* Set a parameter from text, parsed by the type of its default; unknown keys are KS_ERR_ARG. */
ks_status ks_policy_set(ks_policy *p, const char *key, const char *value);
/* A parameter's current value as text. */
ks_status ks_policy_get(const ks_policy *p, const char *key, char *buf, size_t n);
int ks_policy_n_params(const ks_policy *p);
const char *ks_policy_param_name(const ks_policy *p, int i);
const char *ks_policy_name(const ks_policy *p);
/* What the policy reported during the last request (ev:report), e.g. "selection_layer". */
const char *ks_policy_report(const ks_policy *p, const char *key);
int ks_policy_n_reports(const ks_policy *p);
const char *ks_policy_report_key(const ks_policy *p, int i);
void ks_policy_free(ks_policy *p);

/* Model facts. */
int ks_model_n_layers(const ks_model *m);
int ks_model_n_kv_heads(const ks_model *m);
int ks_model_vocab(const ks_model *m);
int ks_model_max_context(const ks_model *m);

#ifdef __cplusplus
}
#endif
#endif /* KVSIEVE_H */
