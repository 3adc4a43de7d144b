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
 *   - Handles are opaque, and every one has one way in and one way out, named by a rule:
 *       ks_<noun>_open  -> ks_<noun>_close  a handle tied to files on disk
 *                                           (ks_model_open, ks_model_open_ex -> ks_model_close)
 *       ks_<noun>_create, ks_<noun>_load*  -> ks_<noun>_free  an object built in memory
 *                                           (ks_session_create -> ks_session_free;
 *                                           ks_policy_load*, ks_policy_create_c -> ks_policy_free;
 *                                           ks_eval_create -> ks_eval_free; ks_json_parse -> ks_json_free)
 *     Each way out accepts NULL and does nothing then.
 *   - Token ids are int32_t; positions are int32_t.
 *   - The library never prints: what it has to say (a policy's print(), the first failure of a
 *     kind in a policy, debug notes) goes to the log callback of ks_set_log, or nowhere.
 *
 * Building a host against an installed kvsieve (`make install PREFIX=...`):
 *     cc host.c $(pkg-config --cflags --libs kvsieve)             # shared: libkvsieve.so
 *     cc host.c $(pkg-config --static --cflags --libs kvsieve)    # static: libkvsieve.a
 * libkvsieve.so carries PCRE2 and utf8proc inside (statically, not exported) and loads the
 * system's Lua 5.4 (liblua5.4.so.0); it exports only the functions below. With a PREFIX off the
 * loader's path, run the host with LD_LIBRARY_PATH=PREFIX/lib (or link with
 * -Wl,-rpath,PREFIX/lib). examples/host.c is a complete host.
 */
#ifndef KVSIEVE_H
#define KVSIEVE_H

#include <signal.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Every function below is exported from libkvsieve.so; everything else in it is hidden. */
#if defined(__GNUC__)
#define KS_API __attribute__((visibility("default")))
#else
#define KS_API
#endif

/* ---------------------------------------------------------------- version
 * The version of this header; ks_version() is that of the library actually linked. While the
 * major version is 0, a minor release may change the ABI (the soname is libkvsieve.so.0.MINOR). */
#define KS_VERSION_MAJOR 0
#define KS_VERSION_MINOR 12
#define KS_VERSION_PATCH 0
/* "MAJOR.MINOR.PATCH" of the library, e.g. "0.12.0" (static storage). */
KS_API const char *ks_version(void);

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
KS_API const char *ks_last_error(void);
/* A short constant name for a status ("io", "format", ...). */
KS_API const char *ks_status_name(ks_status s);

/* ---------------------------------------------------------------- log
 * The library writes nothing to stdout or stderr. Whatever it has to say goes to one process-wide
 * callback, set by the host; without one (the default) it is dropped. Levels:
 *   KS_LOG_ERROR  not used for failures (those are returned statuses + ks_last_error)
 *   KS_LOG_WARN   something went wrong but the request went on, e.g. "policy NAME: first
 *                 failure of kind 'error' (later ones are only counted): ..."
 *   KS_LOG_INFO   output a user asked for: a policy's print() as "[policy NAME] text", the
 *                 profile table of a session with profiling on
 *   KS_LOG_DEBUG  notes for developers, e.g. "decode graph not recorded: ..."
 * msg has no trailing newline (a multi-line text such as a profile table has inner ones) and is
 * valid only during the call. The callback may run on any thread that calls into the library
 * (one at a time per session; two sessions on two threads may log concurrently), must not call
 * ks_set_log itself, and should return quickly. ks_set_log(NULL, NULL) restores silence; it is
 * safe to call at any time from any thread. The kvsieve CLI installs one that prints
 * "kvsieve: MSG" (a policy's print() verbatim) on stderr. */
typedef enum ks_log_level { KS_LOG_ERROR = 0, KS_LOG_WARN = 1, KS_LOG_INFO = 2, KS_LOG_DEBUG = 3 } ks_log_level;
typedef void (*ks_log_fn)(void *user, ks_log_level level, const char *msg);
KS_API void ks_set_log(ks_log_fn fn, void *user);


/* ---------------------------------------------------------------- models and sessions */

typedef struct ks_model ks_model;       /* weights + config + tokenizer on one backend */
typedef struct ks_session ks_session;   /* one conversation: KV cache, positions, policy */
typedef struct ks_policy ks_policy;     /* a token-pruning policy (Lua script or C struct) */

/* Open a Hugging Face model folder (config.json, tokenizer.json, *.safetensors).
 * backend: "cpu" (default when NULL) or "cuda" (when built with CUDA). */
KS_API ks_status ks_model_open(const char *dir, const char *backend, ks_model **out);
KS_API void ks_model_close(ks_model *m);

/* Options of ks_model_open_ex; fill with ks_model_opts_default, then set what you need. The
 * backend belongs to the model: two models opened with different options in one process keep
 * their own settings (nothing here is process-wide). */
typedef struct ks_model_opts {
    const char *backend;    /* "cpu" (also NULL, the default) or "cuda" (builds with CUDA) */
    int threads;            /* CPU backend: worker threads in all, the calling one included;
                             * 0 = one per CPU this process may run on (default). Results are
                             * bit-identical for every thread count. Ignored by "cuda". */
    int device;             /* CUDA device index (default 0); ignored by "cpu" */
} ks_model_opts;
KS_API void ks_model_opts_default(ks_model_opts *o);
/* ks_model_open with options (o NULL = the defaults). Negative threads or device, or an unknown
 * backend, is KS_ERR_ARG. ks_model_open(dir, b, out) is ks_model_open_ex with backend b, and
 * ks_model_open_ex(dir, o, out) is ks_model_open_tuned(dir, o, NULL, out). */
KS_API ks_status ks_model_open_ex(const char *dir, const ks_model_opts *o, ks_model **out);

/* The values of ks_model_tuning's switches. A zero-filled struct holds KS_DEFAULT everywhere. */
enum { KS_DEFAULT = 0, KS_ON = 1, KS_OFF = -1 };

/* How the backend computes, beyond ks_model_opts: the CUDA backend's kernel choices (for A/B
 * timing and for isolating a kernel; every choice gives results within the CUDA tests'
 * tolerances; ignored by "cpu"), the per-phase profile and debug notes. Its own struct, so that
 * ks_model_opts keeps its layout for hosts built against it. Fill with ks_model_tuning_default
 * (all zero: every default). Each switch is KS_DEFAULT, KS_ON or KS_OFF. */
typedef struct ks_model_tuning {
    int decode_kernels;     /* the one-row kernels of decode (gemv matmuls, tensor-core decode
                             * attention); off: cuBLAS and the float32 split-KV attention. Default on */
    int fused;              /* the fused projections (norm + q|k|v + RoPE + the cache row, the
                             * residual folded into the GEMM, norm + gate|up + SwiGLU); off: plain
                             * kernels one by one. Default on */
    int mlp;                /* the bf16 prefill MLP; off: float32 intermediates. Default on */
    int graphs;             /* decode steps recorded once and replayed as graphs. Default on */
    int pdl;                /* programmatic dependent launch of the decode kernels. Default off */
    int prefill_attn_mma;   /* on: always the mma.sync flash prefill attention; default (or off):
                             * the planner's kernel (Hopper: wgmma where it takes the shape) */
    int decode_splits;      /* split-KV blocks of the tensor-core decode attention, 0 = automatic
                             * (default); >= 0 */
    /* Both backends: */
    int profile;            /* sessions on this model: 0 = no profile (default); 1 = a per-phase
                             * profile (ks_bench_run reads it; the backend's timestamps where it has
                             * them); 2 = the same on the host clock (each phase synced). A session
                             * with a profile logs its table (KS_LOG_INFO) when it is freed */
    int verbose;            /* 1: the backend's debug notes (KS_LOG_DEBUG), e.g. why a decode step
                             * ran without its graph; 0 (default) none */
    /* Tensor parallelism (issue 17; the CLI's --tp N): */
    int tp;                 /* 0 or 1 (default): one backend, as always. N in 2..8: each layer split
                             * across N ranks (heads and KV heads, ffn units and vocab rows divided
                             * among them; docs/DESIGN.md "Tensor parallel"). This build's ranks are
                             * simulated CPU ranks of the "cpu" backend in one process (another
                             * backend with tp > 1 is KS_ERR_UNSUPPORTED); ids and kept sets equal
                             * the unsplit run's, logits to float32 rounding. A model whose KV heads
                             * do not divide among N is refused (KS_ERR_UNSUPPORTED). */
} ks_model_tuning;
KS_API void ks_model_tuning_default(ks_model_tuning *t);
/* ks_model_open_ex with tuning t (NULL = the defaults). Negative decode_splits, a switch other
 * than KS_DEFAULT / KS_ON / KS_OFF, profile outside 0..2, verbose outside 0..1 or tp outside 0..8
 * is KS_ERR_ARG naming the field. */
KS_API ks_status ks_model_open_tuned(const char *dir, const ks_model_opts *o, const ks_model_tuning *t, ks_model **out);
/* A model of seeded random weights (never zero; norms near 1) in the shape of a config.json
 * (`config`: the file, or a folder holding one), for speed measurements at any shape without a
 * checkpoint; o and t as for ks_model_open_tuned (NULL = defaults). It has no tokenizer
 * (ks_tokenize fails). Close with ks_model_close. */
KS_API ks_status ks_model_open_random(const char *config, const ks_model_opts *o, const ks_model_tuning *t, uint64_t seed,
                                      ks_model **out);

/* Tokenize UTF-8 text (add_special: BOS etc. as the tokenizer's post-processor says).
 * *ids is malloc'd (free it). Decode returns a malloc'd NUL-terminated string. */
KS_API ks_status ks_tokenize(ks_model *m, const char *text, int add_special, int32_t **ids, int *n);
/* Decode, dropping special tokens (HF's decode(ids, skip_special_tokens=True)). Ids outside
 * the tokenizer's vocabulary are KS_ERR_ARG. */
KS_API ks_status ks_detokenize(ks_model *m, const int32_t *ids, int n, char **text);

/* Flags of ks_detokenize_ex (OR them; 0 behaves as ks_detokenize). */
enum {
    /* Keep special tokens in the text, as HF's decode(ids, skip_special_tokens=False):
     * then the text of ks_tokenize(m, x, 0, ...) decodes back to x even where x holds a
     * special token such as Qwen's "<|endoftext|>" or Llama's "<s>". */
    KS_DECODE_SPECIAL = 1u << 0,
};
/* Decode with flags; an unknown flag bit is KS_ERR_ARG. */
KS_API ks_status ks_detokenize_ex(ks_model *m, const int32_t *ids, int n, unsigned flags, char **text);

KS_API ks_status ks_session_create(ks_model *m, ks_session **out);
KS_API void ks_session_free(ks_session *s);

/* Attach a policy (NULL = full attention). The session does not own it. On a model split over
 * GPU ranks (ks_model_tuning.tp > 1, CUDA) the policy's events read whole copies kept on rank 0,
 * which exist only for KV built after the first policy was set: a session that already holds KV
 * from before gets KS_ERR_UNSUPPORTED (ks_session_reset it first). */
KS_API ks_status ks_session_set_policy(ks_session *s, ks_policy *p);
/* On a policy failure: 0 = stop the request with the error (default); 1 = fall back to
 * full attention for the rest of the request and report it in the result. */
KS_API void ks_session_set_fallback(ks_session *s, int fallback_full);

/* ---------------------------------------------------------------- generation */

typedef struct ks_generate_opts {  /* checked by ks_generate*: out of range is KS_ERR_ARG */
    int max_new_tokens;     /* >= 0, default 64 */
    float temperature;      /* finite, >= 0; 0 = greedy (default) */
    float top_p;            /* in (0, 1], default 1 */
    uint64_t seed;          /* default 0 */
    int add_special;        /* tokenize the prompt with BOS etc. (default 1) */
    /* Sampling filters, applied in this order: the repetition penalty to the logits, then
     * softmax(logits / temperature), then top_k, top_p (of the top_k mass), min_p; one token is
     * drawn from what is left. A zero-filled struct has them all off; with them off, greedy
     * and seeded sampling give exactly the tokens they gave before they existed. */
    int top_k;              /* >= 0: keep the k most likely tokens; 0 = all (default) */
    float min_p;            /* in [0, 1]: drop tokens less likely than min_p x the most likely; 0 = off */
    float repeat_penalty;   /* finite, >= 0; 0 or 1 = off (default 1). CTRL-style: the logit of every
                             * token already in the context (this request's prompt and output) is
                             * divided by it when positive, multiplied when negative; > 1 discourages
                             * repeats. It applies to greedy decoding too. */
    const char *const *stop; /* n_stop non-empty strings (borrowed for the call), or NULL */
    int n_stop;             /* >= 0: generation ends at the first point where the decoded text
                             * holds any stop string; that string and anything after it are neither
                             * streamed nor in ks_result_text (ks_result_ids keeps every token) */
} ks_generate_opts;

/* Fill opts with the defaults above. */
KS_API void ks_generate_opts_default(ks_generate_opts *o);

/* Called for each generated token with the newly completed text (may be ""); return
 * non-zero to stop. */
typedef int (*ks_stream_fn)(void *ud, int32_t id, const char *piece);

/* Generate a reply to `prompt` from a fresh state (the session is reset first).
 * On return, results are readable with the ks_result_* calls below until the next
 * generate or reset. */
KS_API ks_status ks_generate(ks_session *s, const char *prompt, const ks_generate_opts *o, ks_stream_fn cb, void *ud);
/* Same, from token ids. */
KS_API ks_status ks_generate_ids(ks_session *s, const int32_t *ids, int n, const ks_generate_opts *o, ks_stream_fn cb,
                          void *ud);

/* ---------------------------------------------------------------- results */

KS_API const int32_t *ks_result_ids(const ks_session *s, int *n);        /* generated ids */
KS_API const char *ks_result_text(const ks_session *s);                   /* generated text */
KS_API int ks_result_prompt_tokens(const ks_session *s);
KS_API double ks_result_prefill_seconds(const ks_session *s);
KS_API double ks_result_decode_seconds(const ks_session *s);
/* KV rows resident at a layer and KV head, with their token positions, in the cache's row order
 * (position order after a generation; right after plain ks_session_decode calls on a KV ring
 * (ks.kv_ring) the same rows may be rotated) (owned by the session; valid until the next call
 * that changes it). Returns the row count, -1 on bad args. */
KS_API int ks_result_kept(const ks_session *s, int layer, int kv_head, const int32_t **positions);
/* Prompt indices kept by a restart (GemFilter, two-pass ASL), or 0 if none happened. */
KS_API int ks_result_restart(const ks_session *s, const int32_t **prompt_idx);
/* Non-empty when a policy failed and the request fell back to full attention. */
KS_API const char *ks_result_policy_error(const ks_session *s);

/* ---------------------------------------------------------------- logits
 * The logits of the last position the session computed: after ks_generate*, those the last
 * generated token was drawn from, as the model gave them (before temperature, top_k, top_p,
 * min_p and repeat_penalty); with max_new_tokens = 0, the next-token logits after the prompt.
 * Greedy generation without a repeat penalty picks their argmax (lowest id on ties). */

/* *logits points at `vocab` floats owned by the session, valid until its next generate, reset
 * or free; *n = ks_model_vocab. KS_ERR_ARG before the session has run anything. */
KS_API ks_status ks_session_logits(const ks_session *s, const float **logits, int *n);
/* The k most likely next tokens: ids[i] and their log-probabilities log softmax(logits)[id]
 * (temperature 1), most likely first, ties to the lower id; NaN logits count as -inf. k in
 * [1, vocab], ids and logprobs hold k entries (logprobs may be NULL); else KS_ERR_ARG. */
KS_API ks_status ks_session_top_logprobs(const ks_session *s, int k, int32_t *ids, float *logprobs);

/* ---------------------------------------------------------------- policies
 * A policy is a Lua 5.4 file returning {name, params, handlers...}; see lua/policy_lua.h for
 * the file format, the event object and the sandbox. Each policy runs in its own sandboxed
 * Lua state; errors come back as KS_ERR_POLICY with "policy NAME: EVENT (layer L): FILE:LINE: ...". */

/* Load by name (policies/NAME.lua in ./policies, then <exe>/../policies) or by path. m may be
 * NULL (then the policy sees no model config). */
KS_API ks_status ks_policy_load(ks_model *m, const char *name_or_path, ks_policy **out);
/* The same, a name looked up first in each folder of search_path (colon-separated; NULL or ""
 * = none; the CLI passes $KVSIEVE_POLICY_PATH). */
KS_API ks_status ks_policy_load_path(ks_model *m, const char *name_or_path, const char *search_path, ks_policy **out);
/* Load from source text; chunkname names it in messages. */
KS_API ks_status ks_policy_load_string(ks_model *m, const char *chunkname, const char *source, ks_policy **out);
/* Set a parameter from text, parsed by the type of its default; unknown keys are KS_ERR_ARG. */
KS_API ks_status ks_policy_set(ks_policy *p, const char *key, const char *value);
/* A parameter's current value as text. */
KS_API ks_status ks_policy_get(const ks_policy *p, const char *key, char *buf, size_t n);
KS_API int ks_policy_n_params(const ks_policy *p);
KS_API const char *ks_policy_param_name(const ks_policy *p, int i);
KS_API const char *ks_policy_name(const ks_policy *p);
/* What the policy reported during the last request (ev:report), e.g. "selection_layer". */
KS_API const char *ks_policy_report(const ks_policy *p, const char *key);
KS_API int ks_policy_n_reports(const ks_policy *p);
KS_API const char *ks_policy_report_key(const ks_policy *p, int i);
/* Free a policy of any kind (Lua or C; NULL is a no-op). Detach it from sessions first, and free
 * it before closing its model (device tensors a Lua policy keeps between events live in the
 * model's backend memory). */
KS_API void ks_policy_free(ks_policy *p);

/* ---------------------------------------------------------------- C policies
 * A policy written in C: a struct of handlers, one per engine event, each optional (NULL = the
 * event is not handled and costs nothing). A handler gets the `user` pointer and the event,
 * reads it with the ks_event_* accessors, may ask for actions with ks_action_*, and returns
 * KS_OK or a failure (ks_status; the request then stops with KS_ERR_POLICY, or falls back to full
 * attention under ks_session_set_fallback). The event and every pointer read from it are valid
 * only during the call.
 *
 * Events (in the order one request meets them):
 *   prefill_qkv        each layer of each prefill pass, after RoPE: the active rows' q, k, v
 *   prefill_layer_end  each layer, after its MLP: the rows' hidden states
 *   prefill_end        after the last layer, before the first token is sampled (layer -1)
 *   decode_qkv         each layer of each decode step, after the new KV row was appended
 *   token              each sampled token (ks_event_token)
 * Actions (checked when asked: legal in this event, indices in range, no duplicates; a bad one is
 * KS_ERR_POLICY naming the action, the event and the value; index lists in any order, copied):
 *   ks_action_retain(ev, idx, k)     prefill_qkv / prefill_layer_end / decode_qkv: the layer keeps
 *                                    only these KV rows (indices into ks_event_kv_rows's rows);
 *                                    _heads: one list per KV head
 *   ks_action_propagate(ev, idx, k)  prefill_*: after this layer only these active rows go on
 *   ks_action_restart(ev, idx, k)    prefill_qkv of pass 0: prefill again on the prompt rows idx
 *   ks_action_attend(ev, idx, k, renumber)  decode_qkv / prefill_qkv: this step attends only
 *                                    these rows of the layer; renumber: key positions 0..k-1
 *   ks_action_stop(ev)               any prefill event: end the forward pass here
 *   ks_action_discard_kv(ev)         prefill_qkv, layer 0, pass 0: this pass's KV rows are freed
 *                                    after each layer's attention (a restart must follow) */
typedef struct ks_event ks_event;   /* one engine event, seen by a handler */
typedef ks_status (*ks_policy_fn)(void *user, ks_event *ev);
typedef struct ks_policy_handlers {
    const char *name;               /* the policy's name in messages (copied; NULL = "c_policy") */
    void *user;                     /* passed to every handler */
    ks_policy_fn prefill_qkv, prefill_layer_end, prefill_end, decode_qkv, token;
    /* called at the start of each request (fresh session state), before any event; may be NULL */
    ks_status (*begin)(void *user, ks_session *s);
    void (*free_user)(void *user);  /* called once by ks_policy_free; may be NULL */
    int pre_rope_keys;              /* 1: the KV cache holds keys before RoPE, q and k in events
                                     * are pre-RoPE, attention rotates at the (renumbered) positions */
    int prefill_chunk;              /* > 0: prefill in chunks of this many tokens (restart refused) */
} ks_policy_handlers;
/* Create a C policy from h (copied; h->user is not owned unless free_user frees it). A negative
 * prefill_chunk, or restart wanted with chunks, is KS_ERR_ARG. Parameters and reports
 * (ks_policy_set, ks_policy_report, ...) are Lua-only: on a C policy they report none. Free with
 * ks_policy_free. */
KS_API ks_status ks_policy_create_c(const ks_policy_handlers *h, ks_policy **out);

/* What a handler sees. Rows are the event's active rows (prefill: the prompt rows still going
 * through the layer; decode: the one new row). */
KS_API int ks_event_layer(const ks_event *ev);          /* layer index, -1 for prefill_end / token */
KS_API int ks_event_pass(const ks_event *ev);           /* 0, or 1 after a restart */
KS_API int ks_event_rows(const ks_event *ev);           /* active rows (decode: 1) */
KS_API int ks_event_prompt_tokens(const ks_event *ev);  /* tokens in the prompt as given */
KS_API const int32_t *ks_event_positions(const ks_event *ev); /* (rows) positions, or NULL */
KS_API const int32_t *ks_event_ids(const ks_event *ev);       /* (rows) token ids, or NULL */
KS_API int32_t ks_event_token(const ks_event *ev);      /* token: the sampled id; else -1 */
/* The KV rows the event's layer holds now for one KV head (decode_qkv: the new row included),
 * the indices ks_action_retain takes, and their positions (positions may be NULL); -1 when the
 * event has no layer or kv_head is out of range. */
KS_API int ks_event_kv_rows(const ks_event *ev, int kv_head, const int32_t **positions);
/* Copy one of the event's tensors to host memory, row-major:
 *   KS_TENSOR_Q (rows, n_heads, head_dim)  KS_TENSOR_K, KS_TENSOR_V (rows, n_kv_heads, head_dim)
 *   KS_TENSOR_HIDDEN (rows, dim; prefill_layer_end only)
 * cap is dst's size in floats; too small, or a tensor the event lacks, is KS_ERR_ARG.
 * ks_event_tensor_size gives the float count (0 if absent). */
typedef enum ks_event_tensor { KS_TENSOR_Q = 0, KS_TENSOR_K = 1, KS_TENSOR_V = 2, KS_TENSOR_HIDDEN = 3 } ks_event_tensor;
KS_API size_t ks_event_tensor_size(const ks_event *ev, ks_event_tensor t);
KS_API ks_status ks_event_copy(const ks_event *ev, ks_event_tensor t, float *dst, size_t cap);

KS_API ks_status ks_action_restart(ks_event *ev, const int32_t *idx, int k);
KS_API ks_status ks_action_propagate(ks_event *ev, const int32_t *idx, int k);
KS_API ks_status ks_action_retain(ks_event *ev, const int32_t *idx, int k);
KS_API ks_status ks_action_retain_heads(ks_event *ev, const int32_t *const *idx, const int *k);
KS_API ks_status ks_action_attend(ks_event *ev, const int32_t *idx, int k, int renumber);
KS_API ks_status ks_action_attend_heads(ks_event *ev, const int32_t *const *idx, const int *k, int renumber);
KS_API ks_status ks_action_stop(ks_event *ev);
KS_API ks_status ks_action_discard_kv(ks_event *ev);

/* ---------------------------------------------------------------- chat prompts
 * The chat prompt formats of four model families, written in C (no Jinja engine):
 *   "llama3"  <|begin_of_text|><|start_header_id|>ROLE<|end_header_id|>\n\nTEXT<|eot_id|> ...
 *             <|start_header_id|>assistant<|end_header_id|>\n\n   (Llama 3 / 3.x instruct; TEXT is
 *             trimmed of surrounding whitespace, as the official template's `| trim`)
 *   "chatml"  <|im_start|>ROLE\nTEXT<|im_end|>\n ... <|im_start|>assistant\n       (Qwen 2/3 ...)
 *   "mistral" <s>[INST] USER [/INST]ANSWER</s>[INST] USER [/INST]   (Mistral 7B instruct v0.1/v0.2
 *             spacing; a system message goes in front of the first user message, "SYSTEM\n\nUSER")
 *   "phi3"    <|system|>\nTEXT<|end|>\n<|user|>\nTEXT<|end|>\n ... <|assistant|>\n  (Phi-3 instruct)
 * Every rendering ends with the open assistant turn (HF's add_generation_prompt=True) and already
 * holds any BOS: tokenize it with add_special = 0 (ks_generate_opts.add_special = 0), as HF's
 * apply_chat_template does. */
typedef struct ks_chat_msg { const char *role, *content; } ks_chat_msg;

/* "llama3, chatml, mistral, phi3": the formats ks_chat_format takes (static storage). */
KS_API const char *ks_chat_format_names(void);
/* Render msgs[0..n) in `format`; *out is malloc'd (free it). Unknown format, NULL pointers, a
 * message without role or content: KS_ERR_ARG. Roles: llama3 and chatml take any role string;
 * mistral an optional first "system", then "user" and "assistant" alternating from "user"; phi3
 * system, user and assistant. A message outside those rules is KS_ERR_ARG naming it. */
KS_API ks_status ks_chat_format(const char *format, const ks_chat_msg *msgs, int n, char **out);
/* The format a Jinja chat_template renders, recognised by its special tokens:
 * "<|start_header_id|>" -> llama3, "<|im_start|>" -> chatml, "<|user|>" with "<|end|>" -> phi3,
 * "[INST]" -> mistral. NULL when it is none of these (or t is NULL). Static storage. */
KS_API const char *ks_chat_detect(const char *chat_template);
/* The format of the model folder `dir`: its tokenizer_config.json's chat_template (a string, or
 * a list of {name, template} where "default" is taken), else a chat_template.jinja beside it.
 * *format is static. No template, or one that is none of the four: KS_ERR_ARG; a malformed
 * tokenizer_config.json: KS_ERR_FORMAT. */
KS_API ks_status ks_chat_from_model_dir(const char *dir, const char **format);
/* Check that model m's tokenizer turns each special-token string that rendering msgs in
 * `format` writes into exactly one token: without them the prompt would be tokenized as plain
 * text and the model would answer junk. KS_ERR_ARG naming the first missing one, e.g. `the
 * model's tokenizer has no token "<|im_start|>" (needed by the chatml chat format)`; a model
 * without a tokenizer, an unknown format or NULL pointers are KS_ERR_ARG too. */
KS_API ks_status ks_chat_check_model(const char *format, const ks_model *m, const ks_chat_msg *msgs, int n);

/* ---------------------------------------------------------------- speed measurements
 * What `kvsieve bench` measures, for any host: a model's shape, its backend's memory, the
 * backend's ceilings, and one row of the bench (prefill and decode times of a prompt, repeated). */

/* A model's shape and where it runs. Strings are static or owned by the model. */
typedef struct ks_model_info {
    const char *arch;           /* "llama", "qwen2", ... */
    const char *backend;        /* "cpu" or "cuda" */
    int n_layers, dim, n_heads, n_kv_heads, head_dim, ffn, vocab, max_context;
    size_t n_params;            /* weights in all */
    int elem_bytes;             /* bytes per weight and per KV element on the backend: 4 (CPU,
                                 * float32) or 2 (CUDA, bf16) */
} ks_model_info;
/* NULL pointers are KS_ERR_ARG. */
KS_API ks_status ks_model_get_info(const ks_model *m, ks_model_info *out);

/* The backend's own memory (weights, KV rows, workspaces), in bytes. "fixed" is long-lived
 * (weights, KV), "scratch" the activations of a forward. */
typedef struct ks_model_memory {
    size_t cur;                 /* now */
    size_t peak;                /* the most at once since the last reset (reset_peak) */
    size_t peak_fixed, peak_scratch; /* the split of that peak */
    size_t pool_used_high, pool_reserved_high; /* CUDA: the memory pool's own high-water marks of
                                 * used and reserved bytes (driver); 0 on the CPU */
} ks_model_memory;
/* The counts now; reset_peak != 0 then starts a new peak. KS_ERR_UNSUPPORTED when the backend
 * keeps none; NULL pointers are KS_ERR_ARG. */
KS_API ks_status ks_model_memory_stats(ks_model *m, int reset_peak, ks_model_memory *out);
/* Tensor parallel (ks_model_tuning.tp): the number of ranks of m (0: unsplit), and rank r's own
 * bytes (its weight shards, its KV heads' rows, its scratch; ks_model_memory_stats counts every
 * rank and the composite's host buffers together). A rank m does not have is KS_ERR_ARG. */
KS_API int ks_model_tp_ranks(const ks_model *m);
KS_API ks_status ks_model_rank_memory_stats(ks_model *m, int rank, int reset_peak, ks_model_memory *out);
/* The backend's measured ceilings: the rate of a large GEMM (TFLOP/s) and of a device copy
 * (GB/s). It allocates and runs for a moment; KS_ERR_UNSUPPORTED where the backend measures
 * none (the CPU backend). */
KS_API ks_status ks_model_ceilings(ks_model *m, double *gemm_tflops, double *copy_gbs);

/* A session's per-phase profile (ks_model_tuning.profile turns it on for every session): on != 0
 * turns it on (2: the host clock), 0 off; the counters start again. ks_session_profiling says
 * whether it is on. */
KS_API void ks_session_set_profile(ks_session *s, int on);
KS_API int ks_session_profiling(const ks_session *s);

typedef struct ks_bench_opts {
    int gen;                    /* decode steps after each prefill, >= 0 (default 16) */
    int repeat;                 /* timed runs, >= 1 (default 3) */
    int gemm_ceiling;           /* 1: also measure the CPU GEMM alone on the model's linear shapes
                                 * with as many rows as the prompt (CPU backend only; default 0) */
} ks_bench_opts;
KS_API void ks_bench_opts_default(ks_bench_opts *o);

/* One bench row. Arrays are malloc'd: free them with ks_bench_result_free (not r itself). */
typedef struct ks_bench_result {
    int runs;                   /* timed runs finished (repeat, on success) */
    double *prefill_s;          /* (runs) seconds of each run's prefill: its time to first token */
    double *decode_s;           /* (runs) seconds of each run's gen decode steps */
    double best_prefill_s, best_decode_s; /* the fastest of each */
    double linear_gflops;       /* matmul GFLOP/s of prefill: with a profile, all timed prefills'
                                 * matmul FLOPs over their matmul phases; else (CPU) the fastest
                                 * prefill's own matmul counters; NaN where neither exists */
    double gemm_gflops;         /* opts.gemm_ceiling: the CPU GEMM alone; NaN otherwise */
    double prefill_flop;        /* matmul FLOPs of all timed prefills */
    size_t kv_rows;             /* KV rows over every layer and KV head after the last run */
    int has_memory;             /* the backend keeps memory counts: */
    ks_model_memory memory;     /*   the peak over the timed runs (ks_model_memory_stats) */
    /* with the session's profile on (ks_session_profiling): */
    int profiled;
    long prefill_forwards, decode_steps;        /* profiled */
    double prefill_linear_s, prefill_attention_s; /* summed over them: q/k/v, o, MLP and head */
    double decode_linear_s, decode_attention_s;   /*   matmuls; attention */
    char *profile_text;         /* the per-phase table, titled `title` (malloc'd), or NULL */
    long timed_steps;           /* decode steps of the timed runs (runs x gen) */
    long graph_steps;           /* how many of them replayed a recorded graph (the whole step, or
                                 * its segments around a decode handler); 0 on a backend without
                                 * graphs (the CPU) or with them off */
    long replayed_steps;        /* layer steps of them whose recorded decode handler replayed without
                                 * calling the policy (ks_session_replayed_steps) */
    double *step_p50_s;         /* (runs) the median of each run's gen decode steps, each timed on its
                                 * own (ks_session_decode_greedy returns with the step's token): the
                                 * steady state, where decode_s / gen also spreads the first steps'
                                 * one-time work (a plain step, a graph's recording) over the run;
                                 * NaN with gen 0 */
    double best_step_p50_s;     /* the smallest of them */
} ks_bench_result;

/* Measure prompt ids[0..n) on session s (its policy included): one untimed warm-up prefill of
 * min(n, 16) tokens and, with gen > 0, three greedy decode steps after it (the first launches'
 * one-time work, such as the backend loading its kernels, stays out of the timed steps), then
 * opts.repeat times: a fresh prefill of the n ids, timed, and gen greedy
 * decode steps, timed. The memory peak and the profile cover the timed runs only; the profile
 * counters are reset first. n + gen beyond the model's context, bad options or NULL pointers are
 * KS_ERR_ARG; an engine failure stops the runs with its status (*out then holds what finished
 * and must still be freed). title names the profile table (may be NULL). */
KS_API ks_status ks_bench_run(ks_session *s, const int32_t *ids, int n, const ks_bench_opts *o, const char *title,
                              ks_bench_result *out);
/* Free the arrays and text of r and zero it (NULL is a no-op). */
KS_API void ks_bench_result_free(ks_bench_result *r);

/* One batched row of the bench (core/bench_batch.c, `kvsieve bench --batch B,...`): B sessions
 * of model m, each prefilled with its own prompt (one after another, untimed but for
 * prefill_s), then opts.warmup untimed and opts.gen timed batched decode steps: every step one
 * ks_sessions_decode of all B (the weights read once; what ks_batch_step runs), greedy ids
 * (argmax, EOS ignored: every step has B rows). With ttft_under_load, one more prompt arrives
 * after the timed steps and is prefilled in pieces of prefill_chunk rows, one piece per round
 * before that round's batched step of the B others (serve's order, repl/serve_sched.c); its
 * TTFT is from its arrival to its last piece's logits, the others' steps included. ttft_alone_s
 * is the same piecewise prefill with nobody decoding. */
typedef struct ks_bench_batch_opts {
    int gen;                    /* timed batched steps, >= 1 (default 16) */
    int warmup;                 /* untimed batched steps first, >= 0 (default 2) */
    int ttft_under_load;        /* 1: the TTFT of one more prompt while the B decode (default 0) */
    int prefill_chunk;          /* rows per prefill piece of that prompt, >= 1 (default 256, serve's) */
    int per_session_attention;  /* A/B: 1 = attention session by session even where the backend has a
                                 * batched decode attention (default 0) */
    int keep_ids;               /* 1: keep every sequence's generated ids in the result (default 0) */
    int host_argmax;            /* A/B: 1 = every session's logits downloaded each step and their argmax
                                 * taken on the host (what sampling sequences do); 0 = the argmax where
                                 * the logits are, B ids downloaded (default 0; same ids) */
} ks_bench_batch_opts;
KS_API void ks_bench_batch_opts_default(ks_bench_batch_opts *o);

typedef struct ks_bench_batch_result {
    int batch, tokens, gen;     /* B, prompt length, timed steps */
    double prefill_s;           /* the B prompts' prefills, one after another */
    double *step_s;             /* (gen) seconds of each timed step (host clock, the step's logits
                                 * downloaded) */
    double step_median_s;       /* their median */
    double decode_tok_s;        /* B * gen / the timed steps' seconds: aggregate tokens/s */
    double sample_s;            /* of those seconds, the host's argmax over the B sessions' logits
                                 * (ks_sample) outside the batched decode: host_argmax only (0 else:
                                 * the argmax is then inside the step, on the backend) */
    double kv_bytes;            /* KV bytes the B sessions held at the last timed step (all layers,
                                 * keys and values, in the backend's element type) */
    /* ttft_under_load (else 0): */
    double ttft_s;              /* the new prompt's TTFT with the B decoding */
    double ttft_alone_s;        /* the same pieces with nobody decoding */
    int ttft_rounds;            /* rounds (pieces) it took */
    double ttft_step_s;         /* mean seconds of the B others' batched steps in those rounds */
    int32_t *ids;               /* keep_ids: (batch, warmup + gen) generated ids, row per sequence */
    int n_ids;                  /* warmup + gen with keep_ids, else 0 */
    int has_memory;
    ks_model_memory memory;     /* the backend's peak over the row (ks_model_memory_stats) */
} ks_bench_batch_result;

/* Run the row on m: ids (n_prompts, n), one prompt per sequence, n_prompts = batch +
 * (ttft_under_load ? 1 : 0); the row's sessions are created and freed here. batch < 1, n < 1,
 * n + warmup + gen (+ rounds) beyond the context, ids out of the vocabulary, bad options or NULL
 * pointers are KS_ERR_ARG; an engine failure stops the row with its status and message (*out
 * must still be freed). */
KS_API ks_status ks_bench_batch_run(ks_model *m, const int32_t *ids, int n, int batch, const ks_bench_batch_opts *o,
                                    ks_bench_batch_result *out);
KS_API void ks_bench_batch_result_free(ks_bench_batch_result *r);

/* ---------------------------------------------------------------- policy checks */

/* Run the policy's begin handler against model m on a scratch session, as every request does
 * first: a Lua policy checks its parameters there (a layer the model lacks, ks.config included).
 * KS_OK when it accepts (or has no begin), else its status and message. Either argument NULL is
 * KS_ERR_ARG. */
KS_API ks_status ks_policy_check(ks_policy *p, ks_model *m);

/* ---------------------------------------------------------------- eval: retrieval grids
 * A grid of long-context retrieval cases, each run under one or several policies and scored by
 * exact match: the library side of `kvsieve eval` (the CLI adds argument parsing, a progress
 * line, tables, heatmaps). Tasks (generated bit for bit as tools/train/tasks.py does):
 *   "passkey"   a 5-digit key hidden in repeated filler text
 *   "niah"      a 7-digit number in a haystack of real text (needs corpora)
 *   "multikey"  niah with 3 distractor needles (needs corpora)
 *   "kv"        the value of one key of a JSON object of UUID pairs
 * A run is (length L, depth d, case index i, policy p). Its case seed is derived from (seed, task,
 * L, d, i), its prompt is the longest one of at most L tokens (BOS included) with the needle at
 * depth d, and it is right when the next len(tokens(answer)) greedy tokens equal tokens(answer).
 * It also records which of the needle's value tokens the policy kept: the restart set (GemFilter,
 * two-pass ASL), else the union over KV heads of the last layer's resident prompt rows.
 * Runs are numbered in the order they run: ((li * n_depths + di) * cases + i) * n_policies + p.
 * Everything is deterministic: two runs of one grid give the same records, timings aside.
 *
 * Use: ks_eval_opts_default, set the fields; ks_eval_create (checks everything, loads the
 * haystack); optionally ks_eval_resume (an earlier file's runs count as done); ks_eval_run
 * (runs what is not done yet; call it again after an interrupt to go on); read
 * ks_eval_record_at / ks_eval_cell_at; ks_eval_write_json; ks_eval_free. */

/* The seed base of the grids (held out from the bundled model's training). */
#define KS_EVAL_SEED 0xf2cb78610a862fceull

typedef struct ks_eval ks_eval;          /* one grid: its options, policies, records */

/* One finished run. Strings and arrays are owned by the ks_eval (valid until ks_eval_free);
 * prompt_ids and kept_positions only during the on_run callback (NULL elsewhere). */
typedef struct ks_eval_record {
    int policy, length_index, depth_index, index; /* the run's place in the grid */
    const char *policy_name;
    int length;                 /* L, the cell's length (tokens, BOS included) */
    double depth;               /* d in [0, 1] */
    uint64_t seed;              /* the case's seed */
    int tokens;                 /* prompt tokens (BOS included), <= length */
    int correct;                /* 1: the answer's tokens came out exactly */
    int kept;                   /* prompt positions kept (see above; all of them for full attention) */
    int value_in, value_n;      /* of the needle's value_n value tokens, value_in were kept */
    double value_kept;          /* value_in / value_n; NaN when value_n is 0 */
    int needle_begin, needle_end; /* token ranges [begin, end) in the prompt ids (index 0 = BOS) */
    int value_begin, value_end;
    double prefill_s, decode_s; /* seconds (decode_s is 0 for a resumed run: files lack it) */
    const char *answer, *output; /* the expected answer and the generated text */
    int resumed;                /* 1: read by ks_eval_resume, not run here */
    const int32_t *prompt_ids;  /* (tokens) the prompt's ids; on_run only */
    const int32_t *kept_positions; /* (kept) sorted prompt positions kept; on_run only */
} ks_eval_record;

/* Called after each run finishes (resumed runs excepted), with the record and done / total: the
 * runs finished by this ks_eval and those that it must run in all (resumed ones excluded).
 * Return non-zero to stop: ks_eval_run then returns KS_ERR_INTERRUPTED after this run. */
typedef int (*ks_eval_run_fn)(void *user, const ks_eval_record *r, long done, long total);

typedef struct ks_eval_opts {
    const char *task;           /* "passkey", "niah", "multikey" or "kv" (required) */
    const int *lengths;         /* n_lengths prompt lengths >= 1, each + 64 <= the model's context;
                                 * NULL / 0: 512, 1024, 2048, 4096 (copied by ks_eval_create) */
    int n_lengths;
    const double *depths;       /* n_depths needle depths in [0, 1]; NULL / 0: 0, 0.25, 0.5, 0.75, 1 */
    int n_depths;
    int cases;                  /* cases per cell, 1 .. 100000 (default 1) */
    uint64_t seed;              /* seed base (default KS_EVAL_SEED) */
    ks_policy *const *policies; /* n_policies policies, borrowed until ks_eval_free; an entry NULL
                                 * (or policies NULL) = full attention */
    const char *const *policy_names; /* their names in records and files (copied); NULL, or an
                                 * entry NULL: ks_policy_name, "full" for a NULL policy. Distinct. */
    int n_policies;             /* >= 0; 0: one policy, full attention, named "full" */
    const char *corpora;        /* folder of *.txt files, the haystack of niah / multikey (required
                                 * for them, ignored otherwise) */
    const char *model_label;    /* "model" in the JSON and what a resume file must name (its folder
                                 * name suffices); NULL: the model's folder as opened */
    volatile sig_atomic_t *interrupt; /* NULL, or a flag (a signal handler's): once non-zero, the
                                 * running case stops between layers and ks_eval_run returns
                                 * KS_ERR_INTERRUPTED; that run is dropped, finished ones kept */
    ks_eval_run_fn on_run;      /* NULL, or called after each finished run */
    void *user;                 /* passed to on_run */
} ks_eval_opts;

KS_API void ks_eval_opts_default(ks_eval_opts *o);
/* The checks that need no model: task name, axes, cases, policy names (distinct). KS_ERR_ARG
 * naming the first bad field. ks_eval_create runs them too. */
KS_API ks_status ks_eval_opts_check(const ks_eval_opts *o);
/* A grid on model m (which needs a tokenizer). Everything is checked before any run: the
 * options, the lengths against the context, the haystack (KS_ERR_IO / KS_ERR_FORMAT), each
 * policy against the model (ks_policy_check), the resume file. The model and the policies must
 * outlive the ks_eval. *out is set only on success. */
KS_API ks_status ks_eval_create(ks_model *m, const ks_eval_opts *o, ks_eval **out);
/* Take the runs of an earlier ks_eval_write_json file of this grid as done (before ks_eval_run;
 * they are not run again, and a finished resumed grid equals an uninterrupted one, timings
 * aside). Task, seed, lengths, depths, cases, model (label or folder name), the policies (in
 * order) and each one's parameters must match: the first difference is KS_ERR_ARG naming it,
 * e.g. "FILE: depths differ from this run's (depths)", the field named last; KS_ERR_IO / KS_ERR_FORMAT for an unreadable or
 * malformed file. On error no run is marked. */
KS_API ks_status ks_eval_resume(ks_eval *e, const char *path);
/* Run every run not done yet, in order. KS_OK when all are done; KS_ERR_INTERRUPTED (interrupt
 * flag, or on_run returned non-zero); or the first failing run's status, its message naming
 * policy, length, depth and case. Finished records stay readable in every case. */
KS_API ks_status ks_eval_run(ks_eval *e);
KS_API void ks_eval_free(ks_eval *e);

/* The grid's shape: runs in all (n_lengths * n_depths * cases * n_policies) and those done. */
KS_API long ks_eval_n_runs(const ks_eval *e);
KS_API long ks_eval_n_done(const ks_eval *e);
/* Run i (0 <= i < ks_eval_n_runs), or NULL when it is not done or i is out of range. */
KS_API const ks_eval_record *ks_eval_record_at(const ks_eval *e, long i);

/* One cell (policy p, length li, depth di) over its finished runs. */
typedef struct ks_eval_cell {
    int cases;                  /* finished runs in the cell */
    int correct;                /* of which right */
    int n_value;                /* runs with a value_kept (value_n > 0) */
    double value_kept_sum;      /* sum of their value_kept */
    double prefill_sum;         /* seconds */
    long long tokens_sum, kept_sum;
    double exact_match;         /* correct / cases; NaN with no runs */
    double value_kept;          /* value_kept_sum / n_value; NaN when n_value is 0 */
} ks_eval_cell;
/* Indices out of range, or NULL pointers, are KS_ERR_ARG. */
KS_API ks_status ks_eval_cell_at(const ks_eval *e, int p, int li, int di, ks_eval_cell *out);

/* Write the grid and its finished runs as JSON (model, task, backend, seed_base,
 * cases_per_cell, complete, lengths, depths, cases[], policies[] with params and cells[]): to
 * PATH.tmp, then renamed to PATH, so no half-written file is left. "complete" is false while
 * runs are missing; such a file is what opts.resume takes. KS_ERR_IO when it cannot be written. */
KS_API ks_status ks_eval_write_json(const ks_eval *e, const char *path);

/* Model facts. */
KS_API int ks_model_n_layers(const ks_model *m);
KS_API int ks_model_n_kv_heads(const ks_model *m);
KS_API int ks_model_vocab(const ks_model *m);
KS_API int ks_model_max_context(const ks_model *m);

/* ---------------------------------------------------------------- batched stepping (core/batch.c)
 * Several requests generated together, one token each per step: what a server runs (continuous
 * batching). A sequence (ks_seq) is one request on one session: its prompt, its sampling options,
 * its output so far. The host creates a sequence when a request arrives, prefills its prompt
 * (in pieces if it likes, between steps of the others), then steps it together with every other
 * sequence in decode until each is done; cancelling one frees its KV rows at once.
 *
 *   ks_seq_create(s, ids, n, o, &q)      the session is reset; nothing runs yet (state PREFILL)
 *   ks_seq_prefill(q, max_rows)          up to max_rows more prompt tokens through the model
 *                                        (0 = the rest); the last piece moves q to DECODE
 *   ks_batch_step(qs, n)                 one token for each sequence of qs in DECODE
 *   ks_seq_token / ks_seq_piece          what the last step gave: the id, the new text
 *   ks_seq_cancel(q)                     DONE now, "cancelled"; its KV rows freed
 *   ks_seq_free(q)                       the sequence (not the session)
 *
 * The ids are those of ks_generate_ids with the same session, policy and options, token for token
 * (the same sampler, token events, EOS and stop strings), whatever else is in the batch and
 * however the prompt was split into prefill pieces. When a sequence ends, the session holds its
 * results as after ks_generate (ks_result_ids, _text, _kept, _restart; the policy's reports).
 * Differences from ks_generate: a policy failure ends the sequence with the error (no fallback
 * to full attention), and reaching the model's context ends it with "length" instead of
 * KS_ERR_CONTEXT. A policy sees the whole prompt in one prefill: with a policy attached,
 * ks_seq_prefill ignores max_rows (chunking is then the policy's own prefill_chunk).
 *
 * ks_batch_step samples every sequence, then runs their decode steps as one weight-once batched
 * forward (core/decode_batch.c): the dense ops of a layer (q/k/v, o-projection, MLP) and the
 * final norm and lm_head run once over all B rows; the sequences without a decode-time policy
 * append their rows and attend over their own rows in one backend call per layer (CUDA: one
 * launch), the others one by one with their policies. On the CPU the ids and logits are those
 * of B separate runs, bit for bit; on CUDA the B-row products take the GEMM path, so they equal
 * one-row runs to bf16 rounding. Each sequence's logits (a vocabulary of floats) come back to
 * the host every step for its sampler, unless ks_seq_set_greedy_on_device is on (below).
 * Sequences may be on different sessions of one model only. Not thread-safe: one thread steps a
 * batch and owns its sessions. */
typedef struct ks_seq ks_seq;
typedef enum ks_seq_state {
    KS_SEQ_PREFILL = 0,     /* prompt tokens left to prefill */
    KS_SEQ_DECODE = 1,      /* generating: the next ks_batch_step gives it a token */
    KS_SEQ_DONE = 2,        /* finished (ks_seq_finish says why) */
} ks_seq_state;

/* A sequence generating a reply to ids[0..n) on s, with options o (NULL = defaults; checked as
 * ks_generate_ids checks them; n < 1, a prompt over the model's context: KS_ERR_ARG /
 * KS_ERR_CONTEXT). The session is reset and must stay alive and unused otherwise until the
 * sequence is freed; ids and o (its stop strings too) are copied. */
KS_API ks_status ks_seq_create(ks_session *s, const int32_t *ids, int n, const ks_generate_opts *o, ks_seq **out);
/* Prefill up to max_rows more prompt tokens (0 = all that are left; a policy: all). A failure
 * (policy error, out of memory...) ends the sequence ("error") and is returned. KS_ERR_ARG when
 * the sequence is not in PREFILL. */
KS_API ks_status ks_seq_prefill(ks_seq *q, int max_rows);
/* One step: each sequence of qs[0..n) in DECODE samples a token, fires the token event, checks
 * EOS, stop strings and max_new_tokens, and, unless that ended it, runs its decode step; others
 * are left as they are. A sequence that fails ends with "error" and its own status (ks_seq_status);
 * the others go on, and the call returns KS_OK. KS_ERR_ARG: NULL qs, n < 0, a NULL entry, or
 * sequences of different models. */
KS_API ks_status ks_batch_step(ks_seq *const *qs, int n);
/* on != 0: while q samples greedily (temperature 0, no repeat penalty), each batched step takes
 * its next id as the argmax computed where the logits are (the backend's, in one call for the
 * step: B ids come back instead of B rows of logits) and its session's logits are then NOT
 * updated (ks_session_logits holds an earlier step's). The ids are the same. For a host that
 * reads no logits (no logprobs); default off. Other sampling settings ignore it. */
KS_API void ks_seq_set_greedy_on_device(ks_seq *q, int on);
/* End the sequence now (DONE, "cancelled") and free its session's KV rows; nothing else runs for
 * it. No-op when it is already DONE. */
KS_API void ks_seq_cancel(ks_seq *q);
KS_API void ks_seq_free(ks_seq *q);

KS_API ks_seq_state ks_seq_get_state(const ks_seq *q);
KS_API ks_session *ks_seq_session(const ks_seq *q);
/* The id the last step sampled (-1 before the first), and the text it completed: UTF-8 that is
 * complete, with stop strings (and text that may begin one) held back as ks_generate's stream
 * does; "" when none. Valid until the next step or free. */
KS_API int32_t ks_seq_token(const ks_seq *q);
KS_API const char *ks_seq_piece(const ks_seq *q);
/* The ids generated so far (valid until the next step or free); the prompt's token count. */
KS_API const int32_t *ks_seq_ids(const ks_seq *q, int *n);
KS_API int ks_seq_prompt_tokens(const ks_seq *q);
/* Why it ended: NULL while running; "stop" (EOS or a stop string), "length" (max_new_tokens or
 * the context), "cancelled", "error" (then ks_seq_status / ks_seq_error say what). */
KS_API const char *ks_seq_finish(const ks_seq *q);
KS_API ks_status ks_seq_status(const ks_seq *q);
KS_API const char *ks_seq_error(const ks_seq *q);   /* "" unless "error" */
/* KV rows the session holds now, summed over layers and KV heads. */
KS_API size_t ks_seq_kv_rows(const ks_seq *q);

/* ---------------------------------------------------------------- JSON reader (core/json.c)
 * The strict JSON (RFC 8259) parser the library reads config.json, tokenizer.json and safetensors
 * headers with, for a host that reads JSON of its own (kvsieve serve parses request bodies with
 * it): parse once, then walk the tree read-only.
 *
 *   ks_json_parse(text, len)      the root of an immutable tree, or NULL
 *   ks_json_kind(v)               which of the six kinds v is
 *   ks_json_count / _item / _key  an array's elements, an object's members (in document order)
 *   ks_json_get(obj, key)         an object's member by key
 *   ks_json_string / _number / _integer / _boolean   a scalar's value
 *   ks_json_free(root)            the whole tree
 *
 * Parsing is strict: the text must be UTF-8 (a leading byte-order mark is skipped); raw control
 * characters in strings, escaped lone surrogates, text after the value, leading zeros, "1." and
 * ".5", numbers beyond the range of a double and nesting deeper than 512 levels are refused.
 * Strings are decoded to UTF-8 and NUL-terminated; "\u0000" decodes to a NUL byte, so a string
 * (or a key) may hold NULs and its byte length is the authority. Duplicate keys are kept.
 * The tree is one allocation behind its root and never points into `text`: every pointer read
 * from it (values, strings, keys) is valid until ks_json_free of that root, and a tree may be
 * read from several threads at once.
 *
 * Every accessor accepts NULL and a value of another kind, and then returns its documented
 * default instead of failing, so lookups chain: ks_json_get(ks_json_get(root, "a"), "b") is NULL
 * when any step is missing, and a missing value reads as JSON null. */
typedef struct ks_json ks_json;   /* one JSON value; a root owns its whole tree */
typedef enum ks_json_type {
    KS_JSON_NULL = 0,
    KS_JSON_BOOL = 1,
    KS_JSON_NUMBER = 2,
    KS_JSON_STRING = 3,
    KS_JSON_ARRAY = 4,
    KS_JSON_OBJECT = 5,
} ks_json_type;

/* Parse len bytes of text (no NUL needed; len 0 is an empty document, an error). NULL on failure,
 * with ks_last_error() = "line L, column C: what" (1-based line, 1-based byte column; malformed
 * input), a NULL text with len > 0 named as a bad argument, or out of memory. */
KS_API ks_json *ks_json_parse(const char *text, size_t len);
/* Free a tree: its root only (never a value inside it); NULL does nothing. */
KS_API void ks_json_free(ks_json *root);
/* v's kind; KS_JSON_NULL when v is NULL (a missing value reads as null). */
KS_API ks_json_type ks_json_kind(const ks_json *v);
/* The number of elements of an array or members of an object; 0 for any other kind and NULL. */
KS_API size_t ks_json_count(const ks_json *v);
/* Element i of an array, or the value of member i of an object (i < ks_json_count(v)); NULL
 * when i is out of range or v is neither. */
KS_API const ks_json *ks_json_item(const ks_json *v, size_t i);
/* The key of member i of an object, NUL-terminated, with its byte length in *len (len may be
 * NULL; a key may hold NUL bytes). NULL and *len = 0 when v is not an object or i is out of
 * range. */
KS_API const char *ks_json_key(const ks_json *v, size_t i, size_t *len);
/* The value of the first member of obj whose key is exactly `key` (a NUL-terminated string, so a
 * key holding NUL bytes never matches); NULL when there is none, obj is not an object or key is
 * NULL. */
KS_API const ks_json *ks_json_get(const ks_json *obj, const char *key);
/* A string's bytes, NUL-terminated, with its byte length in *len (len may be NULL; the text may
 * hold NUL bytes before *len). NULL and *len = 0 when v is not a string. */
KS_API const char *ks_json_string(const ks_json *v, size_t *len);
/* A number's value as a double (an integer beyond 2^53 rounded); NaN when v is not a number
 * (JSON cannot write NaN, so NaN means exactly that). */
KS_API double ks_json_number(const ks_json *v);
/* A number written as an integer (no fraction, no exponent) that fits int64_t: its exact value,
 * *is_int = 1. Any other number (2.0, 1e3, 1.5, 2^63), another kind or NULL: 0, *is_int = 0.
 * is_int may be NULL. */
KS_API int64_t ks_json_integer(const ks_json *v, int *is_int);
/* 1 for true; 0 for false, for any other kind and for NULL. */
KS_API int ks_json_boolean(const ks_json *v);

#ifdef __cplusplus
}
#endif
#endif /* KVSIEVE_H */
