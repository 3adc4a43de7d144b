/* serve_sched.c — the scheduler thread of `kvsieve serve` (serve.h): the only thread that calls
 * the engine. Each round:
 *   1. take the jobs the HTTP side queued; tokenize each (chat: the model's template) and size it:
 *      it needs prompt + max_tokens KV rows (refused with a 400 if that exceeds the context or
 *      --max-kv-tokens);
 *   2. cancel the jobs whose client went away (their KV rows freed now);
 *   3. admit waiting jobs in arrival order while the batch has room and their rows fit beside
 *      those reserved by the active ones (a session, its own policy, a ks_seq each);
 *   4. prefill one piece (--prefill-chunk tokens) of the oldest prompt still prefilling;
 *   5. one ks_batch_step for every sequence in decode; post the new text of each (streams) and
 *      the reply of each that ended.
 * Between rounds it sleeps only when nothing is active or waiting. */
#include "serve.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct sjob {
    srv_job *job;
    int32_t *ids;
    int n;                 /* prompt tokens */
    int max_new;
    long reserve;          /* KV rows reserved: n + max_new */
    long created;
    ks_session *s;
    ks_policy *pol;
    ks_seq *q;
    int streamed;          /* chunks posted */
    struct sjob *next;
} sjob;

static void post_error(srv_state *S, sjob *j, const srv_error *e) {
    sj_buf b = {0};
    srv_error_json(e, &b);
    if (j->streamed) { /* the headers are out: the error is the stream's last event */
        srv_post(S, j->job, SRV_MSG_CHUNK, 200, b.p, 0);
        srv_post(S, j->job, SRV_MSG_END, 200, NULL, 1);
    } else {
        srv_post(S, j->job, SRV_MSG_REPLY, e->http, b.p, 1);
    }
}

/* An engine failure as a reply: the policy's and the caller's faults are 400s. */
static void engine_error(srv_error *e, ks_status st, const char *what, const char *msg_in) {
    char msg[400]; /* the first line: a Lua traceback follows it */
    snprintf(msg, sizeof msg, "%s", msg_in ? msg_in : "");
    char *nl = strchr(msg, '\n');
    if (nl) *nl = 0;
    switch (st) {
    case KS_ERR_POLICY: srv_err(e, 400, "invalid_request_error", "policy_error", "%s: %s", what, msg); break;
    case KS_ERR_ARG: srv_err(e, 400, "invalid_request_error", "invalid_value", "%s: %s", what, msg); break;
    case KS_ERR_CONTEXT: srv_err(e, 400, "invalid_request_error", "context_length_exceeded", "%s: %s", what, msg); break;
    case KS_ERR_IO: srv_err(e, 400, "invalid_request_error", "policy_not_found", "%s: %s", what, msg); break;
    case KS_ERR_FORMAT: srv_err(e, 400, "invalid_request_error", "policy_error", "%s: %s", what, msg); break;
    case KS_ERR_OOM: srv_err(e, 503, "server_error", "out_of_memory", "%s: %s", what, msg); break;
    default: srv_err(e, 500, "server_error", ks_status_name(st), "%s: %s", what, msg);
    }
}

static void sjob_free(sjob *j) {
    ks_seq_free(j->q);
    ks_session_free(j->s);
    ks_policy_free(j->pol);
    free(j->ids);
    free(j);
}

/* ---------------------------------------------------------------- 1. sizing */

/* The prompt's ids and the rows the job needs; -1 with e on a bad request. */
static int size_job(srv_state *S, sjob *j, srv_error *e) {
    srv_params *p = &j->job->p;
    ks_status st;
    if (p->chat) {
        if (!S->chat_format) return srv_err(e, 400, "invalid_request_error", "no_chat_template", "%s", S->chat_why), -1;
        ks_chat_msg *m = calloc((size_t)p->n_msgs, sizeof *m);
        if (!m) return srv_err(e, 503, "server_error", "out_of_memory", "out of memory"), -1;
        for (int i = 0; i < p->n_msgs; i++) m[i] = (ks_chat_msg){p->msgs[i].role, p->msgs[i].content};
        char *text = NULL;
        st = ks_chat_check_model(S->chat_format, S->m, m, p->n_msgs);
        if (!st) st = ks_chat_format(S->chat_format, m, p->n_msgs, &text);
        free(m);
        if (st) return srv_err(e, 400, "invalid_request_error", "invalid_value", "messages: %s", ks_last_error()), -1;
        st = ks_tokenize(S->m, text, 0, &j->ids, &j->n);
        free(text);
    } else {
        st = ks_tokenize(S->m, p->prompt, 1, &j->ids, &j->n);
    }
    if (st) return srv_err(e, 400, "invalid_request_error", "invalid_value", "prompt: %s", ks_last_error()), -1;
    if (j->n < 1) return srv_err(e, 400, "invalid_request_error", "invalid_value", "the prompt tokenizes to nothing"), -1;
    int ctx = S->max_context;
    if (p->max_tokens >= 0) {
        if ((long)j->n + p->max_tokens > ctx)
            return srv_err(e, 400, "invalid_request_error", "context_length_exceeded",
                           "this model's maximum context length is %d tokens; the prompt has %d and max_tokens asks for %d",
                           ctx, j->n, p->max_tokens), -1;
        j->max_new = p->max_tokens;
    } else {
        if (j->n >= ctx)
            return srv_err(e, 400, "invalid_request_error", "context_length_exceeded",
                           "this model's maximum context length is %d tokens; the prompt has %d", ctx, j->n), -1;
        j->max_new = ctx - j->n < (p->chat ? 256 : 16) ? ctx - j->n : (p->chat ? 256 : 16); /* OpenAI's default for completions is 16 */
    }
    j->reserve = (long)j->n + j->max_new;
    if (j->reserve > S->o.max_kv_tokens)
        return srv_err(e, 400, "invalid_request_error", "context_length_exceeded",
                       "the request needs %ld KV rows (prompt %d + max_tokens %d), more than the server's --max-kv-tokens %ld",
                       j->reserve, j->n, j->max_new, S->o.max_kv_tokens), -1;
    return 0;
}

/* ---------------------------------------------------------------- 3. admission */

static int start_job(srv_state *S, sjob *j, srv_error *e) {
    srv_params *p = &j->job->p;
    ks_status st = ks_session_create(S->m, &j->s);
    if (st) return engine_error(e, st, "session", ks_last_error()), -1;
    if (p->policy) {
        if (p->policy_kind == SRV_POL_INLINE) st = ks_policy_load_string(S->m, "inline", p->policy, &j->pol);
        else st = ks_policy_load(S->m, p->policy, &j->pol);
        if (st) {
            if (p->policy_kind != SRV_POL_INLINE && (st == KS_ERR_IO || st == KS_ERR_ARG))
                srv_err(e, 400, "invalid_request_error", "policy_not_found", "kvsieve.policy: %s", ks_last_error());
            else engine_error(e, st, "kvsieve.policy", ks_last_error());
            return -1;
        }
        for (int i = 0; i < p->n_set; i++)
            if ((st = ks_policy_set(j->pol, p->set_key[i], p->set_val[i])))
                return engine_error(e, KS_ERR_ARG, "kvsieve.set", ks_last_error()), -1;
        if ((st = ks_session_set_policy(j->s, j->pol))) return engine_error(e, st, "kvsieve.policy", ks_last_error()), -1;
    }
    ks_generate_opts o;
    ks_generate_opts_default(&o);
    o.max_new_tokens = j->max_new;
    o.temperature = p->temperature;
    o.top_p = p->top_p;
    o.top_k = p->top_k;
    o.min_p = p->min_p;
    o.repeat_penalty = p->repeat_penalty;
    o.seed = p->seed;
    o.stop = (const char *const *)p->stop;
    o.n_stop = p->n_stop;
    if ((st = ks_seq_create(j->s, j->ids, j->n, &o, &j->q))) return engine_error(e, st, "request", ks_last_error()), -1;
    return 0;
}

/* ---------------------------------------------------------------- replies */

static void reply_head(srv_state *S, sjob *j, sj_buf *b, int chunk) {
    int chat = j->job->p.chat;
    sj_printf(b, "{\"id\": \"%s-%ld\", \"object\": \"%s\", \"created\": %ld, \"model\": ", chat ? "chatcmpl" : "cmpl",
              j->job->id, chat ? (chunk ? "chat.completion.chunk" : "chat.completion") : "text_completion", j->created);
    sj_str(b, S->model_name);
}

static void usage_json(sjob *j, sj_buf *b) {
    int ng = 0;
    ks_seq_ids(j->q, &ng);
    sj_printf(b, "\"usage\": {\"prompt_tokens\": %d, \"completion_tokens\": %d, \"total_tokens\": %d}", j->n, ng, j->n + ng);
}

/* The kvsieve block: generated ids, the policy's name, reports, restart indices and (asked)
 * the kept positions per layer and KV head. */
static void kvsieve_json(srv_state *S, sjob *j, sj_buf *b) {
    int ng = 0;
    const int32_t *ids = ks_seq_ids(j->q, &ng);
    sj_cat(b, "\"kvsieve\": {\"ids\": [");
    for (int i = 0; i < ng; i++) sj_printf(b, i ? ", %d" : "%d", ids[i]);
    sj_cat(b, "], \"policy\": ");
    sj_str(b, j->pol ? ks_policy_name(j->pol) : NULL);
    if (j->pol) {
        sj_cat(b, ", \"reports\": {");
        for (int i = 0; i < ks_policy_n_reports(j->pol); i++) {
            const char *k = ks_policy_report_key(j->pol, i);
            if (i) sj_cat(b, ", ");
            sj_str(b, k);
            sj_cat(b, ": ");
            sj_str(b, ks_policy_report(j->pol, k));
        }
        sj_cat(b, "}");
        const int32_t *ri;
        int nr = ks_result_restart(j->s, &ri);
        if (nr > 0) {
            sj_cat(b, ", \"restart\": [");
            for (int i = 0; i < nr; i++) sj_printf(b, i ? ", %d" : "%d", ri[i]);
            sj_cat(b, "]");
        }
    }
    if (j->job->p.report_kept) {
        sj_cat(b, ", \"kept\": [");
        int nl = ks_model_n_layers(S->m), nh = ks_model_n_kv_heads(S->m);
        for (int l = 0; l < nl; l++) {
            sj_cat(b, l ? ", [" : "[");
            for (int h = 0; h < nh; h++) {
                const int32_t *pos = NULL;
                int k = ks_result_kept(j->s, l, h, &pos);
                sj_cat(b, h ? ", [" : "[");
                for (int i = 0; i < k; i++) sj_printf(b, i ? ", %d" : "%d", pos[i]);
                sj_cat(b, "]");
            }
            sj_cat(b, "]");
        }
        sj_cat(b, "]");
    }
    sj_cat(b, "}");
}

/* The end of a reply: the usage and kvsieve blocks when `blocks`, then the closing brace. The
 * text (malloc'd), or NULL when out of memory (b freed). */
static char *reply_close(srv_state *S, sjob *j, sj_buf *b, int blocks) {
    if (blocks) {
        sj_cat(b, ", ");
        usage_json(j, b);
        sj_cat(b, ", ");
        kvsieve_json(S, j, b);
    }
    sj_cat(b, "}");
    if (b->oom) { sj_free(b); return NULL; }
    return b->p;
}

/* A streamed chunk of text (fin: the last one, with finish_reason, usage and the kvsieve block). */
static char *chunk_json(srv_state *S, sjob *j, const char *piece, const char *fin) {
    sj_buf b = {0};
    reply_head(S, j, &b, 1);
    sj_cat(&b, ", \"choices\": [{\"index\": 0, ");
    if (j->job->p.chat) {
        sj_cat(&b, "\"delta\": {");
        if (!j->streamed) sj_cat(&b, "\"role\": \"assistant\", ");
        sj_cat(&b, "\"content\": ");
        sj_str(&b, piece);
        sj_cat(&b, "}");
    } else {
        sj_cat(&b, "\"text\": ");
        sj_str(&b, piece);
    }
    sj_cat(&b, ", \"logprobs\": null, \"finish_reason\": ");
    sj_str(&b, fin);
    sj_cat(&b, "}]");
    return reply_close(S, j, &b, fin != NULL);
}

static char *final_json(srv_state *S, sjob *j, const char *fin) {
    sj_buf b = {0};
    reply_head(S, j, &b, 0);
    sj_cat(&b, ", \"choices\": [{\"index\": 0, ");
    if (j->job->p.chat) {
        sj_cat(&b, "\"message\": {\"role\": \"assistant\", \"content\": ");
        sj_str(&b, ks_result_text(j->s));
        sj_cat(&b, "}");
    } else {
        sj_cat(&b, "\"text\": ");
        sj_str(&b, ks_result_text(j->s));
    }
    sj_cat(&b, ", \"logprobs\": null, \"finish_reason\": ");
    sj_str(&b, fin);
    sj_cat(&b, "}]");
    return reply_close(S, j, &b, 1);
}

/* The sequence ended: post its reply. */
static void finish_job(srv_state *S, sjob *j) {
    const char *fin = ks_seq_finish(j->q);
    if (!strcmp(fin, "cancelled")) { srv_post(S, j->job, SRV_MSG_END, 200, NULL, 1); return; }
    if (!strcmp(fin, "error")) {
        srv_error e;
        engine_error(&e, ks_seq_status(j->q), "generation", ks_seq_error(j->q));
        post_error(S, j, &e);
        return;
    }
    if (j->job->p.stream) {
        srv_post(S, j->job, SRV_MSG_CHUNK, 200, chunk_json(S, j, "", fin), 0);
        srv_post(S, j->job, SRV_MSG_END, 200, NULL, 1);
    } else {
        srv_post(S, j->job, SRV_MSG_REPLY, 200, final_json(S, j, fin), 1);
    }
}

/* ---------------------------------------------------------------- the loop */

void *srv_sched_main(void *arg) {
    srv_state *S = arg;
    sjob *wait_h = NULL, *wait_t = NULL; /* sized, waiting for room (arrival order) */
    int cap = S->o.max_batch;
    sjob **act = calloc((size_t)cap, sizeof *act);
    ks_seq **qs = calloc((size_t)cap, sizeof *qs);
    int na = 0, n_wait = 0;
    long reserved = 0;
    if (!act || !qs) { free(act); free(qs); return NULL; }
    for (;;) {
        /* 1. new jobs */
        pthread_mutex_lock(&S->mu);
        while (!S->stopping && na == 0 && !S->q_head && !wait_h) pthread_cond_wait(&S->cv, &S->mu);
        int stopping = S->stopping;
        srv_job *in = S->q_head;
        S->q_head = S->q_tail = NULL;
        pthread_mutex_unlock(&S->mu);
        long n_err = 0, n_done = 0, n_cancel = 0, n_tok = 0;
        for (srv_job *jb = in, *nx; jb; jb = nx) {
            nx = jb->next;
            sjob *j = calloc(1, sizeof *j);
            srv_error e;
            if (!j) {
                srv_err(&e, 503, "server_error", "out_of_memory", "out of memory");
                sjob tmp = {.job = jb};
                post_error(S, &tmp, &e);
                n_err++;
                continue;
            }
            j->job = jb;
            j->created = (long)time(NULL);
            if (size_job(S, j, &e)) { post_error(S, j, &e); sjob_free(j); n_err++; continue; }
            if (wait_t) wait_t->next = j; else wait_h = j;
            wait_t = j;
            n_wait++;
        }
        if (stopping) { /* cancel everything; the HTTP side answers no more */
            for (int i = 0; i < na; i++) { ks_seq_cancel(act[i]->q); srv_post(S, act[i]->job, SRV_MSG_END, 200, NULL, 1); sjob_free(act[i]); }
            for (sjob *j = wait_h, *nx; j; j = nx) { nx = j->next; srv_post(S, j->job, SRV_MSG_END, 200, NULL, 1); sjob_free(j); }
            break;
        }
        /* 2. clients gone */
        for (int i = 0; i < na; i++)
            if (atomic_load(&act[i]->job->cancelled)) ks_seq_cancel(act[i]->q);
        for (sjob **pp = &wait_h, *prev = NULL; *pp;) {
            sjob *j = *pp;
            if (!atomic_load(&j->job->cancelled)) { prev = j; pp = &j->next; continue; }
            *pp = j->next;
            if (wait_t == j) wait_t = prev;
            srv_post(S, j->job, SRV_MSG_END, 200, NULL, 1);
            sjob_free(j);
            n_wait--;
            n_cancel++;
        }
        /* 3. admission */
        while (wait_h && na < cap && reserved + wait_h->reserve <= S->o.max_kv_tokens) {
            sjob *j = wait_h;
            wait_h = j->next;
            if (!wait_h) wait_t = NULL;
            j->next = NULL;
            n_wait--;
            srv_error e;
            if (start_job(S, j, &e)) { post_error(S, j, &e); sjob_free(j); n_err++; continue; }
            act[na++] = j;
            reserved += j->reserve;
        }
        /* 4. one prefill piece */
        for (int i = 0; i < na; i++)
            if (ks_seq_get_state(act[i]->q) == KS_SEQ_PREFILL) {
                ks_seq_prefill(act[i]->q, S->o.prefill_chunk); /* a failure ends the sequence: below */
                break;
            }
        /* 5. one decode step for all */
        int nq = 0;
        for (int i = 0; i < na; i++)
            if (ks_seq_get_state(act[i]->q) == KS_SEQ_DECODE) qs[nq++] = act[i]->q;
        if (nq) ks_batch_step(qs, nq);
        long kv = 0;
        sjob *ended = NULL; /* replied to after the stats say so: a client that has its reply sees
                               /health without its sequence */
        for (int i = 0; i < na;) {
            sjob *j = act[i];
            const char *piece = ks_seq_piece(j->q);
            if (j->job->p.stream && *piece && ks_seq_get_state(j->q) != KS_SEQ_PREFILL) {
                srv_post(S, j->job, SRV_MSG_CHUNK, 200, chunk_json(S, j, piece, NULL), 0);
                j->streamed = 1;
            }
            if (ks_seq_get_state(j->q) != KS_SEQ_DONE) { kv += (long)ks_seq_kv_rows(j->q); i++; continue; }
            int ng = 0;
            ks_seq_ids(j->q, &ng);
            n_tok += ng;
            const char *fin = ks_seq_finish(j->q);
            if (!strcmp(fin, "error")) n_err++;
            else if (!strcmp(fin, "cancelled")) n_cancel++;
            else n_done++;
            reserved -= j->reserve;
            j->next = ended;
            ended = j;
            act[i] = act[--na];
        }
        pthread_mutex_lock(&S->mu);
        S->st.active = na;
        if (nq > S->st.peak_active) S->st.peak_active = nq;
        S->st.kv_rows = kv;
        S->st.kv_reserved = reserved;
        S->st.completed += n_done;
        S->st.cancelled += n_cancel;
        S->st.errors += n_err;
        S->st.tokens_generated += n_tok;
        S->st.queued = n_wait; /* and those the HTTP side queued since the round began */
        for (srv_job *jb = S->q_head; jb; jb = jb->next) S->st.queued++;
        pthread_mutex_unlock(&S->mu);
        for (sjob *j = ended, *nx; j; j = nx) {
            nx = j->next;
            finish_job(S, j);
            sjob_free(j);
        }
    }
    free(act);
    free(qs);
    return NULL;
}
