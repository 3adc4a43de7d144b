/* api.c — the public embedding API (include/kvsieve.h) over models, sessions and the engine:
 * version, the log sink, models with options, sessions, generation, results, logits, C policies
 * (ks_policy_create_c, the event accessors) and ks_policy_free / ks_policy_check for policies of
 * every kind. */
#include "engine.h"
#include "gen_begin.h"
#include "tp_backend.h"
#include "forward.h"

#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define KS_STR_(x) #x
#define KS_STR(x) KS_STR_(x)
const char *ks_version(void) {
    return KS_STR(KS_VERSION_MAJOR) "." KS_STR(KS_VERSION_MINOR) "." KS_STR(KS_VERSION_PATCH);
}

/* ---------------------------------------------------------------- log sink
 * One process-wide (callback, user) pair under a mutex; ks_logf copies it out and calls it
 * unlocked, so a slow callback never blocks ks_set_log or another thread's message. */
static pthread_mutex_t g_log_mu = PTHREAD_MUTEX_INITIALIZER;
static ks_log_fn g_log_fn;
static void *g_log_user;

void ks_set_log(ks_log_fn fn, void *user) {
    pthread_mutex_lock(&g_log_mu);
    g_log_fn = fn;
    g_log_user = fn ? user : NULL;
    pthread_mutex_unlock(&g_log_mu);
}

int ks_log_on(void) {
    pthread_mutex_lock(&g_log_mu);
    int on = g_log_fn != NULL;
    pthread_mutex_unlock(&g_log_mu);
    return on;
}

void ks_logf(ks_log_level level, const char *fmt, ...) {
    pthread_mutex_lock(&g_log_mu);
    ks_log_fn fn = g_log_fn;
    void *user = g_log_user;
    pthread_mutex_unlock(&g_log_mu);
    if (!fn) return; /* nobody listens: not even formatted */
    char small[512], *msg = small;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(small, sizeof small, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if ((size_t)n >= sizeof small) { /* a long text (a profile table): format it again, whole */
        char *big = malloc((size_t)n + 1);
        if (big) {
            va_start(ap, fmt);
            vsnprintf(big, (size_t)n + 1, fmt, ap);
            va_end(ap);
            msg = big;
        }
    }
    size_t len = strlen(msg); /* the callback's contract: no trailing newline */
    while (len > 0 && msg[len - 1] == '\n') msg[--len] = 0;
    fn(user, level, msg);
    if (msg != small) free(msg);
}

ks_status ks_backend_create_opts(const char *name, const ks_backend_opts *opts, ks_backend **out) {
    *out = NULL;
    if (!name || !strcmp(name, "cpu")) return ks_cpu_backend_create(opts, out);
    if (!strcmp(name, "cuda")) {
#ifdef KS_HAVE_CUDA
        extern ks_status ks_cuda_backend_create(const ks_backend_opts *opts, ks_backend **out);
        return ks_cuda_backend_create(opts, out);
#else
        return ks_errorf(KS_ERR_UNSUPPORTED, "this build has no CUDA backend (build with make CUDA=1)");
#endif
    }
    return ks_errorf(KS_ERR_ARG, "unknown backend \"%s\" (cpu or cuda)", name);
}

ks_status ks_backend_create(const char *name, ks_backend **out) { return ks_backend_create_opts(name, NULL, out); }

void ks_backend_free(ks_backend *b) {
    if (b) b->destroy(b);
}

void ks_model_opts_default(ks_model_opts *o) {
    if (o) memset(o, 0, sizeof *o); /* cpu, threads from the affinity mask, device 0 */
}

void ks_model_tuning_default(ks_model_tuning *t) {
    if (t) memset(t, 0, sizeof *t); /* every switch KS_DEFAULT, automatic splits, no profile */
}

/* The backend options of o and t, checked (KS_ERR_ARG naming the field; `what` names the caller). */
static ks_status backend_opts_of(const ks_model_opts *o, const ks_model_tuning *t, const char *what, ks_backend_opts *bo) {
    if (o->threads < 0) return ks_errorf(KS_ERR_ARG, "%s: threads must be >= 0, got %d", what, o->threads);
    if (o->device < 0) return ks_errorf(KS_ERR_ARG, "%s: device must be >= 0, got %d", what, o->device);
    if (t->decode_splits < 0) return ks_errorf(KS_ERR_ARG, "%s: decode_splits must be >= 0, got %d", what, t->decode_splits);
    if (t->profile < 0 || t->profile > 2) return ks_errorf(KS_ERR_ARG, "%s: profile must be 0, 1 or 2, got %d", what, t->profile);
    if (t->verbose < 0 || t->verbose > 1) return ks_errorf(KS_ERR_ARG, "%s: verbose must be 0 or 1, got %d", what, t->verbose);
    if (t->tp < 0 || t->tp > KS_TP_MAX) return ks_errorf(KS_ERR_ARG, "%s: tp must be 0..%d, got %d", what, KS_TP_MAX, t->tp);
    const struct { const char *name; int v; } sw[] = {{"decode_kernels", t->decode_kernels}, {"fused", t->fused},
        {"mlp", t->mlp}, {"graphs", t->graphs}, {"pdl", t->pdl}, {"prefill_attn_mma", t->prefill_attn_mma}};
    for (size_t i = 0; i < sizeof sw / sizeof *sw; i++)
        if (sw[i].v != KS_DEFAULT && sw[i].v != KS_ON && sw[i].v != KS_OFF)
            return ks_errorf(KS_ERR_ARG, "%s: %s must be KS_DEFAULT (0), KS_ON (1) or KS_OFF (-1), got %d", what, sw[i].name,
                             sw[i].v);
    *bo = ks_backend_opts_default();
    bo->n_threads = o->threads;
    bo->device = o->device;
#define SWITCH(field, v) if ((v) != KS_DEFAULT) bo->field = (v) == KS_ON
    SWITCH(decode_kernels, t->decode_kernels);
    SWITCH(fused, t->fused);
    SWITCH(mlp, t->mlp);
    SWITCH(graphs, t->graphs);
    SWITCH(pdl, t->pdl);
#undef SWITCH
    if (t->prefill_attn_mma == KS_ON) bo->prefill_attn = KS_PREFILL_ATTN_MMA;
    bo->decode_splits = t->decode_splits;
    bo->profile = t->profile;
    bo->verbose = t->verbose;
    return KS_OK;
}

/* The model of `path` on a backend made from o and t: a checkpoint folder, or random weights in
 * the shape of a config (random != 0). */
static ks_status model_open(const char *path, const ks_model_opts *o, const ks_model_tuning *t, int random, uint64_t seed,
                            const char *what, ks_model **out) {
    if (!out) return ks_errorf(KS_ERR_ARG, "%s: NULL output pointer", what);
    *out = NULL;
    ks_model_opts def;
    ks_model_tuning tdef;
    if (!o) { ks_model_opts_default(&def); o = &def; }
    if (!t) { ks_model_tuning_default(&tdef); t = &tdef; }
    if (!path) return ks_errorf(KS_ERR_ARG, "%s: no model %s given", what, random ? "config" : "folder");
    ks_backend_opts bo;
    ks_status st = backend_opts_of(o, t, what, &bo);
    if (st) return st;
    ks_backend *be = NULL;
    if (t->tp > 1) { /* tensor parallel (tp_backend.h): CPU ranks (simulated), or GPU ranks over NCCL */
        if (o->backend && !strcmp(o->backend, "cuda")) {
#ifdef KS_HAVE_CUDA
            st = ks_tp_backend_create_dev(t->tp, &bo, ks_tp_nccl_ops(), &be);
#else
            st = ks_tp_backend_create_dev(t->tp, &bo, NULL, &be);
#endif
        } else if (o->backend && strcmp(o->backend, "cpu")) {
            return ks_errorf(KS_ERR_UNSUPPORTED, "%s: tp %d: tensor parallel runs on CPU or CUDA ranks, not on the %s "
                             "backend", what, t->tp, o->backend);
        } else {
            st = ks_tp_backend_create(t->tp, &bo, &be);
        }
    } else {
        st = ks_backend_create_opts(o->backend, &bo, &be);
    }
    if (st) return st;
    st = random ? ks_model_random(path, be, seed, out) : ks_model_load(path, be, 0, out);
    if (!st && t->tp > 1 && (st = ks_tp_shard_model(be, *out))) { ks_model_free(*out); *out = NULL; }
    if (st) { ks_backend_free(be); return st; }
    return KS_OK;
}

ks_status ks_model_open_ex(const char *dir, const ks_model_opts *o, ks_model **out) {
    return model_open(dir, o, NULL, 0, 0, "ks_model_open", out);
}

ks_status ks_model_open_tuned(const char *dir, const ks_model_opts *o, const ks_model_tuning *t, ks_model **out) {
    return model_open(dir, o, t, 0, 0, "ks_model_open", out);
}

ks_status ks_model_open_random(const char *config, const ks_model_opts *o, const ks_model_tuning *t, uint64_t seed,
                               ks_model **out) {
    return model_open(config, o, t, 1, seed, "ks_model_open_random", out);
}

int ks_model_tp_ranks(const ks_model *m) { return m ? ks_tp_ranks(m->be) : 0; }

ks_status ks_model_rank_memory_stats(ks_model *m, int rank, int reset_peak, ks_model_memory *out) {
    if (!m || !out) return ks_errorf(KS_ERR_ARG, "rank memory stats: NULL %s", m ? "output" : "model");
    memset(out, 0, sizeof *out);
    if (rank < 0 || rank >= ks_tp_ranks(m->be))
        return ks_errorf(KS_ERR_ARG, "rank memory stats: the model has no rank %d (%d ranks)", rank, ks_tp_ranks(m->be));
    ks_mem_stats ms;
    ks_status st = ks_tp_rank_mem_stats(m->be, rank, &ms, reset_peak != 0);
    if (st) return st;
    out->cur = ms.cur;
    out->peak = ms.peak;
    out->peak_fixed = ms.peak_fixed;
    out->peak_scratch = ms.peak_scratch;
    return KS_OK;
}

ks_status ks_model_open(const char *dir, const char *backend, ks_model **out) {
    ks_model_opts o;
    ks_model_opts_default(&o);
    o.backend = backend;
    return ks_model_open_ex(dir, &o, out);
}

void ks_model_close(ks_model *m) {
    if (!m) return;
    ks_backend *be = m->be;
    ks_model_free(m);
    ks_backend_free(be);
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

ks_status ks_session_set_policy(ks_session *s, ks_policy *p) {
    if (p) { /* GPU ranks: keep the whole q, k, v and KV copies the events read (tp_backend.h) */
        ks_tp_want_views(s->m->be);
        ks_status st = ks_tp_views_ready(s->m->be, s->kv, s->m->cfg.n_layers);
        if (st) return st;
    }
    if (p != s->policy) ks_hold_free(s);
    if (p != s->policy) ks_list_keep_free(s); /* kept lists are known by ids of the old policy's tensors */
    s->policy = p;
    return KS_OK;
}

void ks_session_set_fallback(ks_session *s, int fallback_full) { s->fallback_full = fallback_full; }

/* A negative count, a NaN or negative temperature, a top_p outside (0, 1] is the caller's mistake,
 * named, never reinterpreted. */
ks_status ks_generate_opts_check(const ks_generate_opts *o, const char *who) {
    if (o->max_new_tokens < 0) return ks_errorf(KS_ERR_ARG, "%s: max_new_tokens must be >= 0, got %d", who, o->max_new_tokens);
    if (!(o->temperature >= 0) || isinf(o->temperature))
        return ks_errorf(KS_ERR_ARG, "%s: temperature must be a finite number >= 0, got %g", who, (double)o->temperature);
    if (!(o->top_p > 0 && o->top_p <= 1)) return ks_errorf(KS_ERR_ARG, "%s: top_p must be in (0, 1], got %g", who, (double)o->top_p);
    if (o->top_k < 0) return ks_errorf(KS_ERR_ARG, "%s: top_k must be >= 0, got %d", who, o->top_k);
    if (!(o->min_p >= 0 && o->min_p <= 1)) return ks_errorf(KS_ERR_ARG, "%s: min_p must be in [0, 1], got %g", who, (double)o->min_p);
    if (!(o->repeat_penalty >= 0) || isinf(o->repeat_penalty))
        return ks_errorf(KS_ERR_ARG, "%s: repeat_penalty must be a finite number >= 0, got %g", who, (double)o->repeat_penalty);
    if (o->n_stop < 0 || (o->n_stop > 0 && !o->stop))
        return ks_errorf(KS_ERR_ARG, "%s: n_stop must be >= 0 with that many stop strings, got %d", who, o->n_stop);
    for (int i = 0; i < o->n_stop; i++)
        if (!o->stop[i] || !o->stop[i][0]) return ks_errorf(KS_ERR_ARG, "%s: stop string %d is empty", who, i);
    return KS_OK;
}

void ks_generate_fresh(ks_session *s) {
    ks_session_reset(s);
    free(s->gen_ids);
    free(s->gen_text);
    s->gen_ids = NULL;
    s->gen_text = NULL;
    s->n_gen = 0;
}

void ks_generate_opts_default(ks_generate_opts *o) {
    memset(o, 0, sizeof *o);
    o->max_new_tokens = 64;
    o->top_p = 1;
    o->add_special = 1;
    o->repeat_penalty = 1;
}

ks_status ks_generate_ids(ks_session *s, const int32_t *ids, int n, const ks_generate_opts *o, ks_stream_fn cb,
                          void *ud) {
    ks_generate_opts def;
    if (!o) { ks_generate_opts_default(&def); o = &def; }
    if (!s) return ks_errorf(KS_ERR_ARG, "ks_generate: no session");
    ks_status st = ks_generate_opts_check(o, "ks_generate");
    if (st) return st;
    ks_generate_fresh(s);
    ks_gen_params p = {.max_new = o->max_new_tokens, .temperature = o->temperature, .top_p = o->top_p,
                       .seed = o->seed, .stop_at_eos = 1, .top_k = o->top_k, .min_p = o->min_p,
                       .repeat_penalty = o->repeat_penalty, .stop = o->stop, .n_stop = o->n_stop};
    const ks_policy *pol = s->policy;
    st = ks_session_generate(s, ids, n, &p, cb, ud, &s->gen_ids, &s->n_gen);
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
        /* a stop string ended the generation: the text ends before it (same search as there) */
        long at = st2 ? -1 : ks_stop_find(s->gen_text, len, o->stop, o->n_stop);
        if (at >= 0) s->gen_text[at] = 0;
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

/* ---------------------------------------------------------------- logits */

ks_status ks_session_logits(const ks_session *s, const float **logits, int *n) {
    if (logits) *logits = NULL;
    if (n) *n = 0;
    if (!s || !logits) return ks_errorf(KS_ERR_ARG, "ks_session_logits: no %s", s ? "output pointer" : "session");
    if (s->n_past <= 0 || !s->logits) return ks_errorf(KS_ERR_ARG, "ks_session_logits: the session has not run yet");
    ks_status st = ks_session_logits_fill((ks_session *)s); /* a greedy step left them on the device */
    if (st) return st;
    *logits = s->logits;
    if (n) *n = s->m->cfg.vocab;
    return KS_OK;
}

ks_status ks_session_top_logprobs(const ks_session *s, int k, int32_t *ids, float *logprobs) {
    const float *lg;
    int vocab;
    ks_status st = ks_session_logits(s, &lg, &vocab);
    if (st) return st;
    if (k < 1 || k > vocab) return ks_errorf(KS_ERR_ARG, "ks_session_top_logprobs: k must be in [1, %d], got %d", vocab, k);
    if (!ids) return ks_errorf(KS_ERR_ARG, "ks_session_top_logprobs: no ids array");
    /* the k best by insertion into a sorted list (k is small next to the vocabulary); strictly
     * greater to move up, so of equal logits the lower id stays ahead */
    int m = 0;
    double mx = -INFINITY;
    for (int32_t i = 0; i < vocab; i++) {
        float v = lg[i];
        if (isnan(v)) continue;
        if (v > mx) mx = v;
        if (m == k && !(v > lg[ids[k - 1]])) continue;
        int j = m < k ? m++ : k - 1;
        while (j > 0 && v > lg[ids[j - 1]]) { ids[j] = ids[j - 1]; j--; }
        ids[j] = i;
    }
    for (int j = m; j < k; j++) ids[j] = -1; /* only NaNs were left: no such token */
    if (!logprobs) return KS_OK;
    /* log softmax in double: logit - (max + log sum exp(logit - max)) */
    double sum = 0;
    if (isfinite(mx))
        for (int32_t i = 0; i < vocab; i++)
            if (!isnan(lg[i])) sum += exp((double)lg[i] - mx);
    double lse = mx + log(sum);
    for (int j = 0; j < k; j++) {
        if (ids[j] < 0) logprobs[j] = -INFINITY;
        else if (!isfinite(mx)) logprobs[j] = (mx > 0 && lg[ids[j]] == mx) ? 0.0f : -INFINITY;
        else logprobs[j] = (float)((double)lg[ids[j]] - lse);
    }
    return KS_OK;
}

/* ---------------------------------------------------------------- policies of every kind */

void ks_policy_free(ks_policy *p) {
    if (p && p->free) p->free(p->ud);
}

ks_status ks_policy_check(ks_policy *p, ks_model *m) {
    if (!p || !m) return ks_errorf(KS_ERR_ARG, "policy check: NULL %s", p ? "model" : "policy");
    if (!p->begin) return KS_OK;
    /* begin is what every request runs first (fresh session state); it validates the
     * parameters, the model's layer count included (ks.config in a policy). A real request
     * calls it again. */
    ks_session *s;
    ks_status st = ks_session_create(m, &s);
    if (st) return st;
    st = p->begin(p->ud, s);
    ks_session_free(s);
    return st;
}

/* A C policy: the engine's ks_policy, whose handlers are trampolines onto the host's struct. */
typedef struct cpol {
    ks_policy pol;          /* pol.ud == this */
    ks_policy_handlers h;
    char *name;
} cpol;

#define CPOL_TRAMPOLINE(field)                                                  \
    static ks_status cpol_##field(void *ud, ks_event *ev) {                     \
        const cpol *c = ud;                                                     \
        return c->h.field(c->h.user, ev);                                       \
    }
CPOL_TRAMPOLINE(prefill_qkv)
CPOL_TRAMPOLINE(prefill_layer_end)
CPOL_TRAMPOLINE(prefill_end)
CPOL_TRAMPOLINE(decode_qkv)
CPOL_TRAMPOLINE(token)

static ks_status cpol_begin(void *ud, ks_session *s) {
    const cpol *c = ud;
    return c->h.begin(c->h.user, s);
}

static void cpol_free(void *ud) {
    cpol *c = ud;
    if (c->h.free_user) c->h.free_user(c->h.user);
    free(c->name);
    free(c);
}

ks_status ks_policy_create_c(const ks_policy_handlers *h, ks_policy **out) {
    if (!out) return ks_errorf(KS_ERR_ARG, "ks_policy_create_c: NULL output pointer");
    *out = NULL;
    if (!h) return ks_errorf(KS_ERR_ARG, "ks_policy_create_c: no handlers");
    const char *name = h->name ? h->name : "c_policy";
    if (h->prefill_chunk < 0)
        return ks_errorf(KS_ERR_ARG, "ks_policy_create_c: policy %s: prefill_chunk must be >= 0, got %d", name,
                         h->prefill_chunk);
    cpol *c = ks_calloc(1, sizeof *c);
    if (!c) return KS_ERR_OOM;
    if (!(c->name = ks_strdup(name))) { free(c); return KS_ERR_OOM; }
    c->h = *h;
    c->h.name = c->name;
    c->pol.name = c->name;
    c->pol.ud = c;
    c->pol.on[KS_EV_PREFILL_QKV] = h->prefill_qkv ? cpol_prefill_qkv : NULL;
    c->pol.on[KS_EV_PREFILL_LAYER_END] = h->prefill_layer_end ? cpol_prefill_layer_end : NULL;
    c->pol.on[KS_EV_PREFILL_END] = h->prefill_end ? cpol_prefill_end : NULL;
    c->pol.on[KS_EV_DECODE_QKV] = h->decode_qkv ? cpol_decode_qkv : NULL;
    c->pol.on[KS_EV_TOKEN] = h->token ? cpol_token : NULL;
    c->pol.begin = h->begin ? cpol_begin : NULL;
    c->pol.want_pre_rope_keys = h->pre_rope_keys != 0;
    c->pol.prefill_chunk = h->prefill_chunk;
    c->pol.free = cpol_free;
    *out = &c->pol;
    return KS_OK;
}

/* ---------------------------------------------------------------- what a handler sees */

int ks_event_layer(const ks_event *ev) { return ev ? ev->layer : -1; }
int ks_event_pass(const ks_event *ev) { return ev ? ev->pass : 0; }
int ks_event_rows(const ks_event *ev) { return ev ? ev->n : 0; }
int ks_event_prompt_tokens(const ks_event *ev) { return ev ? ev->n_prompt : 0; }
const int32_t *ks_event_positions(const ks_event *ev) { return ev ? ev->pos : NULL; }
const int32_t *ks_event_ids(const ks_event *ev) { return ev ? ev->ids : NULL; }
int32_t ks_event_token(const ks_event *ev) { return ev && ev->kind == KS_EV_TOKEN ? ev->token : -1; }

int ks_event_kv_rows(const ks_event *ev, int kv_head, const int32_t **positions) {
    if (positions) *positions = NULL;
    if (!ev || !ev->kv || kv_head < 0 || kv_head >= ev->n_kv_heads) return -1;
    if (!ev->kv->n) return 0; /* nothing allocated yet */
    if (positions) *positions = ev->kv->pos + (size_t)kv_head * ev->kv->capacity;
    return ev->kv->n[kv_head];
}

static const float *event_tensor(const ks_event *ev, ks_event_tensor t, size_t *count) {
    size_t rows = ev->n > 0 ? (size_t)ev->n : 0;
    switch (t) {
    case KS_TENSOR_Q: *count = rows * ev->n_heads * ev->head_dim; return ev->q;
    case KS_TENSOR_K: *count = rows * ev->n_kv_heads * ev->head_dim; return ev->k;
    case KS_TENSOR_V: *count = rows * ev->n_kv_heads * ev->head_dim; return ev->v;
    case KS_TENSOR_HIDDEN: *count = rows * ev->dim; return ev->hidden;
    }
    *count = 0;
    return NULL;
}

size_t ks_event_tensor_size(const ks_event *ev, ks_event_tensor t) {
    size_t count = 0;
    if (!ev || !event_tensor(ev, t, &count)) return 0;
    return count;
}

ks_status ks_event_copy(const ks_event *ev, ks_event_tensor t, float *dst, size_t cap) {
    if (!ev) return ks_errorf(KS_ERR_ARG, "ks_event_copy: no event");
    size_t count = 0;
    const float *src = event_tensor(ev, t, &count);
    if (!src) return ks_errorf(KS_ERR_ARG, "ks_event_copy: a %s event has no tensor %d", ks_event_name(ev->kind), (int)t);
    if (cap < count || !dst)
        return ks_errorf(KS_ERR_ARG, "ks_event_copy: tensor %d has %zu floats, the buffer holds %zu", (int)t, count,
                         dst ? cap : 0);
    if (!count) return KS_OK;
    ks_backend *be = (ks_backend *)ev->be; /* download only reads the backend's memory */
    return be->download(be, dst, src, sizeof(float) * count);
}
