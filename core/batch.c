/* batch.c — sequences stepped together (kvsieve.h, "batched stepping"): the engine side of
 * continuous batching. A ks_seq is ks_session_generate's loop (generate.c) turned inside out:
 * its state (sampler, penalty marks, ids, streamed bytes) lives in the struct, and one call of
 * ks_batch_step runs one iteration of that loop for every sequence in decode. The iteration is
 * the same as generate.c's, so the ids are those of ks_generate_ids:
 *     sample from s->logits -> token event -> EOS / stop strings / max_new -> decode(id)
 * The decode calls of a step are gathered in batch_decode(): one ks_sessions_decode (decode_batch.c)
 * for all of them, the weights read once per step. A greedy sequence with greedy_on_device takes
 * its next id from that call (ks_sessions_decode_greedy: the argmax where the logits are) and
 * skips the sampler's pass over the logits, which the step then leaves on the device. */
#include "decode_batch.h"
#include "forward.h"
#include "gen_begin.h"

#include <stdlib.h>
#include <string.h>

struct ks_seq {
    ks_session *s;
    ks_seq_state state;
    ks_status st;            /* the failure that ended it ("error"), else KS_OK */
    char *err;               /* its message (malloc'd), NULL otherwise */
    const char *finish;      /* static: "stop", "length", "cancelled", "error"; NULL while running */
    /* the prompt */
    int32_t *prompt;         /* (n_prompt) */
    int n_prompt, n_prefilled;
    /* the options */
    int max_new;
    float repeat_penalty;
    char **stop;             /* (n_stop) copies */
    int n_stop;
    ks_sampler smp;
    unsigned char *seen;     /* (vocab) tokens of the context, with a repeat penalty; else NULL */
    float *plog;             /* (vocab) penalised logits, with a repeat penalty */
    /* the output */
    int32_t *gen;            /* (cap) generated ids */
    int n_gen, cap;
    int32_t token;           /* last sampled id, -1 before the first */
    size_t emitted;          /* bytes of decoded output already given as pieces */
    char *piece;             /* the last step's piece (malloc'd), NULL = "" */
    int on_device;           /* ks_seq_set_greedy_on_device */
    int32_t next;            /* has_next: the id the last batched step computed for it */
    int has_next;
};

/* ---------------------------------------------------------------- lifecycle */

void ks_seq_free(ks_seq *q) {
    if (!q) return;
    free(q->err);
    free(q->prompt);
    for (int i = 0; i < q->n_stop; i++) free(q->stop[i]);
    free(q->stop);
    free(q->seen);
    free(q->plog);
    free(q->gen);
    free(q->piece);
    free(q);
}

ks_status ks_seq_create(ks_session *s, const int32_t *ids, int n, const ks_generate_opts *o, ks_seq **out) {
    if (!out) return ks_errorf(KS_ERR_ARG, "ks_seq_create: no output pointer");
    *out = NULL;
    if (!s) return ks_errorf(KS_ERR_ARG, "ks_seq_create: no session");
    if (!ids || n < 1) return ks_errorf(KS_ERR_ARG, "ks_seq_create: empty prompt");
    ks_generate_opts def;
    if (!o) { ks_generate_opts_default(&def); o = &def; }
    ks_status st = ks_generate_opts_check(o, "ks_seq_create");
    if (st) return st;
    const ks_config *c = &s->m->cfg;
    if (n > c->max_pos)
        return ks_errorf(KS_ERR_CONTEXT, "prompt of %d tokens exceeds the model's context of %d tokens", n, c->max_pos);
    for (int i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= c->vocab)
            return ks_errorf(KS_ERR_ARG, "ks_seq_create: token id %d at index %d out of range [0, %d)", ids[i], i, c->vocab);
    ks_seq *q = ks_calloc(1, sizeof *q);
    if (!q) return KS_ERR_OOM;
    q->s = s;
    q->token = -1;
    q->max_new = o->max_new_tokens;
    q->repeat_penalty = o->repeat_penalty;
    q->n_prompt = n;
    q->cap = KS_MIN(q->max_new, 255) + 1;
    q->prompt = ks_malloc(sizeof(int32_t) * (size_t)n);
    q->gen = ks_malloc(sizeof(int32_t) * (size_t)q->cap);
    q->stop = o->n_stop ? ks_calloc((size_t)o->n_stop, sizeof(char *)) : NULL;
    if (!q->prompt || !q->gen || (o->n_stop && !q->stop)) { ks_seq_free(q); return KS_ERR_OOM; }
    memcpy(q->prompt, ids, sizeof(int32_t) * (size_t)n);
    for (; q->n_stop < o->n_stop; q->n_stop++)
        if (!(q->stop[q->n_stop] = ks_strdup(o->stop[q->n_stop]))) { ks_seq_free(q); return KS_ERR_OOM; }
    if (o->repeat_penalty > 0 && o->repeat_penalty != 1) {
        q->seen = ks_calloc((size_t)c->vocab, 1);
        q->plog = ks_malloc(sizeof(float) * (size_t)c->vocab);
        if (!q->seen || !q->plog) { ks_seq_free(q); return KS_ERR_OOM; }
        for (int i = 0; i < n; i++) q->seen[ids[i]] = 1;
    }
    ks_sampler_init(&q->smp, o->temperature, o->top_p, o->seed);
    q->smp.top_k = o->top_k;
    q->smp.min_p = o->min_p;
    ks_generate_fresh(s); /* as ks_generate_ids starts */
    q->state = KS_SEQ_PREFILL;
    *out = q;
    return KS_OK;
}

/* The session's results as ks_generate leaves them: the ids, and their text without the EOS and
 * cut before a stop string. */
static void publish(ks_seq *q) {
    ks_session *s = q->s;
    free(s->gen_ids);
    free(s->gen_text);
    s->gen_text = NULL;
    s->n_gen = 0;
    s->gen_ids = ks_malloc(sizeof(int32_t) * (size_t)(q->n_gen ? q->n_gen : 1));
    if (!s->gen_ids) return;
    memcpy(s->gen_ids, q->gen, sizeof(int32_t) * (size_t)q->n_gen);
    s->n_gen = q->n_gen;
    if (!s->m->tok) return;
    int ng = q->n_gen;
    if (ng > 0 && ks_is_eos(&s->m->cfg, q->gen[ng - 1])) ng--;
    size_t len;
    if (ks_tokenizer_decode(s->m->tok, q->gen, (size_t)ng, 1, &s->gen_text, &len) != KS_OK) { s->gen_text = NULL; return; }
    long at = ks_stop_find(s->gen_text, len, (const char *const *)q->stop, q->n_stop);
    if (at >= 0) s->gen_text[at] = 0;
}

static void finish(ks_seq *q, const char *why) {
    q->state = KS_SEQ_DONE;
    q->finish = why;
    ks_status sr = ks_ring_restore_all(q->s); /* a KV ring's rows in logical order, as generate.c leaves them */
    if (sr && !q->st) { q->st = sr; free(q->err); q->err = ks_strdup(ks_last_error()); q->finish = "error"; }
    publish(q);
}

static ks_status fail(ks_seq *q, ks_status st) {
    if (q->state == KS_SEQ_DONE) return st;
    q->st = st ? st : KS_ERR_INTERNAL;
    free(q->err);
    const char *e = ks_last_error();
    q->err = ks_strdup(e && *e ? e : ks_status_name(q->st));
    finish(q, "error");
    return q->st;
}

void ks_seq_cancel(ks_seq *q) {
    if (!q || q->state == KS_SEQ_DONE) return;
    q->state = KS_SEQ_DONE;
    q->finish = "cancelled";
    ks_session_reset(q->s); /* its KV rows go back now */
}

/* ---------------------------------------------------------------- prefill */

ks_status ks_seq_prefill(ks_seq *q, int max_rows) {
    if (!q) return ks_errorf(KS_ERR_ARG, "ks_seq_prefill: no sequence");
    if (q->state != KS_SEQ_PREFILL) return ks_errorf(KS_ERR_ARG, "ks_seq_prefill: the prompt is already prefilled");
    if (max_rows < 0) return ks_errorf(KS_ERR_ARG, "ks_seq_prefill: max_rows must be >= 0, got %d", max_rows);
    ks_session *s = q->s;
    int left = q->n_prompt - q->n_prefilled;
    int k = (max_rows == 0 || s->policy) ? left : KS_MIN(max_rows, left);
    ks_status st = ks_session_prefill(s, q->prompt + q->n_prefilled, k);
    if (st) return fail(q, st);
    q->n_prefilled += k;
    if (q->n_prefilled == q->n_prompt) {
        s->n_prompt = q->n_prompt; /* the first piece's count otherwise */
        if (q->max_new == 0) finish(q, "length");
        else q->state = KS_SEQ_DECODE;
    }
    return KS_OK;
}

/* ---------------------------------------------------------------- one step */

/* Sample q's next token and decide whether it ends the sequence (generate.c's loop body up to
 * its decode). Returns 1 when q needs a decode step with q->token. */
static int step_sample(ks_seq *q) {
    ks_session *s = q->s;
    const ks_config *c = &s->m->cfg;
    const float *lg = s->logits;
    if (q->seen) {
        memcpy(q->plog, s->logits, sizeof(float) * (size_t)c->vocab);
        ks_repeat_penalty(q->plog, q->seen, c->vocab, q->repeat_penalty);
        lg = q->plog;
    }
    int32_t id = q->has_next ? q->next : ks_sample(&q->smp, lg, c->vocab);
    q->has_next = 0;
    if (q->seen && id >= 0 && id < c->vocab) q->seen[id] = 1;
    if (q->n_gen == q->cap) {
        int32_t *g2 = ks_realloc(q->gen, sizeof(int32_t) * (size_t)q->cap * 2);
        if (!g2) return fail(q, KS_ERR_OOM), 0;
        q->gen = g2;
        q->cap *= 2;
    }
    q->gen[q->n_gen++] = id;
    q->token = id;
    if (s->policy && s->policy->on[KS_EV_TOKEN]) {
        ks_event ev;
        ks_event_init(s, &ev, KS_EV_TOKEN, -1, 0, 1);
        ev.token = id;
        ks_status st = ks_event_fire(s, &ev);
        ks_actions_free(&ev.act, ev.n_kv_heads);
        if (st) return fail(q, st), 0;
    }
    int eos = ks_is_eos(c, id);
    int last = eos || q->n_gen == q->max_new, hit = 0;
    /* the output so far, decoded (without the EOS: with stop strings, the text held back is
     * given at the EOS) */
    size_t nd = eos ? (q->n_stop > 0 ? (size_t)q->n_gen - 1 : 0) : (size_t)q->n_gen;
    if (s->m->tok && nd > 0) {
        char *text = NULL;
        size_t len = 0;
        if (ks_tokenizer_decode(s->m->tok, q->gen, nd, 1, &text, &len) == KS_OK) {
            size_t ok = ks_utf8_complete(text, len);
            if (q->n_stop > 0) {
                long at = ks_stop_find(text, ok, (const char *const *)q->stop, q->n_stop);
                if (at >= 0) { ok = (size_t)at; hit = 1; }
                else if (!last) ok -= ks_stop_holdback(text, ok, (const char *const *)q->stop, q->n_stop);
            }
            if (ok > q->emitted) {
                memmove(text, text + q->emitted, ok - q->emitted);
                text[ok - q->emitted] = 0;
                q->piece = text;
                q->emitted = ok;
                text = NULL;
            }
        }
        free(text);
    }
    if (hit || eos) { finish(q, "stop"); return 0; }
    if (q->n_gen == q->max_new || s->n_past + 1 > c->max_pos) { finish(q, "length"); return 0; }
    if (s->interrupt && *s->interrupt) { fail(q, ks_errorf(KS_ERR_INTERRUPTED, "interrupted")); return 0; }
    return 1;
}

/* Whether q's next id may come from the step's argmax: greedy, no repeat penalty, asked for. */
static int device_greedy(const ks_seq *q) { return q->on_device && q->smp.temperature <= 0 && !q->seen; }

void ks_seq_set_greedy_on_device(ks_seq *q, int on) {
    if (q) q->on_device = on != 0;
}

/* The decode steps of one batch step: row i is q[i]->token at its session's next position, all
 * in one weight-once forward (ks_sessions_decode: the dense ops over the n rows at once,
 * attention per session; ks_sessions_decode_greedy when some sequence takes its next id from
 * the step). A failure ends only that sequence, with its own status and message. */
static void batch_decode(ks_seq *const *q, int n) {
    if (n < 1) return;
    ks_session *ss_[64], **ss = n <= 64 ? ss_ : ks_malloc(sizeof(ks_session *) * (size_t)n);
    int32_t id_[64], *ids = n <= 64 ? id_ : ks_malloc(sizeof(int32_t) * (size_t)n);
    ks_status st_[64], *sts = n <= 64 ? st_ : ks_malloc(sizeof(ks_status) * (size_t)n);
    char *m_[64], **msg = n <= 64 ? m_ : ks_calloc((size_t)n, sizeof(char *));
    int32_t nx_[64], *nx = n <= 64 ? nx_ : ks_malloc(sizeof(int32_t) * (size_t)n);
    unsigned char g_[64], *g = n <= 64 ? g_ : ks_malloc((size_t)n);
    ks_status st = (!ss || !ids || !sts || !msg || !nx || !g) ? KS_ERR_OOM : KS_OK;
    int ng = 0;
    if (!st) {
        for (int i = 0; i < n; i++) {
            ss[i] = q[i]->s;
            ids[i] = q[i]->token;
            msg[i] = NULL;
            ng += g[i] = (unsigned char)device_greedy(q[i]);
        }
        st = ng ? ks_sessions_decode_greedy(ss, ids, n, g, nx, sts, msg) : ks_sessions_decode(ss, ids, n, sts, msg);
    }
    for (int i = 0; i < n; i++) {
        if (st) { fail(q[i], st); continue; } /* nothing ran (out of memory): no messages */
        if (sts[i]) {
            fail(q[i], sts[i]);
            if (msg[i]) { free(q[i]->err); q[i]->err = msg[i]; msg[i] = NULL; } /* its own message */
        } else {
            q[i]->s->n_decoded++;
            q[i]->has_next = ng && g[i] && nx[i] >= 0;
            q[i]->next = q[i]->has_next ? nx[i] : -1;
        }
        free(msg[i]);
    }
    if (ss != ss_) free(ss);
    if (ids != id_) free(ids);
    if (sts != st_) free(sts);
    if (msg != m_) free(msg);
    if (nx != nx_) free(nx);
    if (g != g_) free(g);
}

ks_status ks_batch_step(ks_seq *const *qs, int n) {
    if (!qs || n < 0) return ks_errorf(KS_ERR_ARG, "ks_batch_step: %s", qs ? "n must be >= 0" : "no sequences");
    for (int i = 0; i < n; i++) {
        if (!qs[i]) return ks_errorf(KS_ERR_ARG, "ks_batch_step: sequence %d is NULL", i);
        if (qs[i]->s->m != qs[0]->s->m) return ks_errorf(KS_ERR_ARG, "ks_batch_step: sequence %d is on another model", i);
    }
    ks_seq *stack[64], **dec = n <= 64 ? stack : ks_malloc(sizeof(ks_seq *) * (size_t)n);
    if (!dec) return KS_ERR_OOM;
    int nd = 0;
    for (int i = 0; i < n; i++) { /* every piece is this step's: "" for those not in decode */
        free(qs[i]->piece);
        qs[i]->piece = NULL;
    }
    for (int i = 0; i < n; i++)
        if (qs[i]->state == KS_SEQ_DECODE && step_sample(qs[i])) dec[nd++] = qs[i];
    batch_decode(dec, nd);
    if (dec != stack) free(dec);
    return KS_OK;
}

/* ---------------------------------------------------------------- accessors */

ks_seq_state ks_seq_get_state(const ks_seq *q) { return q ? q->state : KS_SEQ_DONE; }
ks_session *ks_seq_session(const ks_seq *q) { return q ? q->s : NULL; }
int32_t ks_seq_token(const ks_seq *q) { return q ? q->token : -1; }
const char *ks_seq_piece(const ks_seq *q) { return q && q->piece ? q->piece : ""; }
const int32_t *ks_seq_ids(const ks_seq *q, int *n) {
    if (n) *n = q ? q->n_gen : 0;
    return q ? q->gen : NULL;
}
int ks_seq_prompt_tokens(const ks_seq *q) { return q ? q->n_prompt : 0; }
const char *ks_seq_finish(const ks_seq *q) { return q ? q->finish : NULL; }
ks_status ks_seq_status(const ks_seq *q) { return q ? q->st : KS_ERR_ARG; }
const char *ks_seq_error(const ks_seq *q) { return q && q->err ? q->err : ""; }

size_t ks_seq_kv_rows(const ks_seq *q) {
    if (!q) return 0;
    size_t r = 0;
    for (int l = 0; l < q->s->m->cfg.n_layers; l++) r += ks_session_kv_rows(q->s, l);
    return r;
}
