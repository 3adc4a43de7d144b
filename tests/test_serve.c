/* test_serve.c — continuous batching and `kvsieve serve` (issue 16).
 *
 * The step API (core/batch.c), on the bundled model, no binary needed:
 *   batch_ids_match_separate_runs   B sequences with mixed options and policies, started at
 *                                   different steps, their prompts prefilled in pieces, give the
 *                                   ids, text and kept positions of B separate ks_generate_ids runs
 *   batch_cancel_frees_rows         a cancelled sequence's session holds no KV rows; the others go on
 *   batch_bad_arguments             bad options / prompts / calls are KS_ERR_* with a message
 *
 * The server (KS_BIN, started on a free loopback port; tests/serve/setup.sh for the npm client)
 * is tested further below. */
#include "ktest.h"
#include "kvsieve.h"
#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TINY "models/kvsieve-tiny"

/* ================================================================ the step API */

typedef struct bcase {
    const char *prompt;
    const char *policy;     /* NULL = full attention */
    const char *set[2];     /* "key=value" */
    float temperature, top_p;
    int top_k, max_new;
    float repeat_penalty;
    uint64_t seed;
    const char *stop;       /* NULL = none */
} bcase;

static const bcase CASES[] = {
    {"Once upon a time", NULL, {NULL}, 0, 1, 0, 24, 1, 0, NULL},
    {"The grass is green. The sky is", NULL, {NULL}, 0.8f, 0.9f, 0, 20, 1, 7, NULL},
    {"The grass is green. The grass is green. The grass is green. Where is the cat?", "gemfilter",
     {"layer=2", "k=8"}, 0, 1, 0, 16, 1, 0, NULL},
    {"A little dog ran", NULL, {NULL}, 1.0f, 1, 5, 18, 1.3f, 3, NULL},
    {"She said hello and", "streamingllm", {"budget=8", "rolling=true"}, 0, 1, 0, 22, 1, 0, NULL},
    {"Once upon a time there was", NULL, {NULL}, 0, 1, 0, 30, 1, 0, "."},
};
#define NCASES ((int)(sizeof CASES / sizeof CASES[0]))

static ks_status load_case_policy(ks_model *m, const bcase *c, ks_policy **p) {
    *p = NULL;
    if (!c->policy) return KS_OK;
    ks_status st = ks_policy_load(m, c->policy, p);
    for (int i = 0; !st && i < 2 && c->set[i]; i++) {
        char k[64];
        const char *eq = strchr(c->set[i], '=');
        snprintf(k, sizeof k, "%.*s", (int)(eq - c->set[i]), c->set[i]);
        st = ks_policy_set(*p, k, eq + 1);
    }
    return st;
}

static void case_opts(const bcase *c, ks_generate_opts *o, const char **stop) {
    ks_generate_opts_default(o);
    o->max_new_tokens = c->max_new;
    o->temperature = c->temperature;
    o->top_p = c->top_p;
    o->top_k = c->top_k;
    o->repeat_penalty = c->repeat_penalty;
    o->seed = c->seed;
    if (c->stop) { stop[0] = c->stop; o->stop = stop; o->n_stop = 1; }
}

KT_TEST(batch_ids_match_separate_runs) {
    ks_model *m = NULL;
    KT_CHECK(ks_model_open(TINY, "cpu", &m) == KS_OK, "%s", ks_last_error());
    /* the reference: one ks_generate_ids per case, on its own session */
    int32_t *ref_ids[NCASES] = {0}, *prompts[NCASES] = {0};
    int ref_n[NCASES] = {0}, np[NCASES] = {0}, ref_kept[NCASES] = {0};
    char *ref_text[NCASES] = {0};
    char why[512] = "";
    for (int i = 0; i < NCASES && !why[0]; i++) {
        ks_session *s = NULL;
        ks_policy *p = NULL;
        ks_generate_opts o;
        const char *stop[1];
        case_opts(&CASES[i], &o, stop);
        if (ks_tokenize(m, CASES[i].prompt, 1, &prompts[i], &np[i]) || ks_session_create(m, &s) ||
            load_case_policy(m, &CASES[i], &p) || ks_session_set_policy(s, p) ||
            ks_generate_ids(s, prompts[i], np[i], &o, NULL, NULL)) {
            snprintf(why, sizeof why, "case %d reference: %s", i, ks_last_error());
        } else {
            const int32_t *ids = ks_result_ids(s, &ref_n[i]);
            ref_ids[i] = malloc(sizeof(int32_t) * (size_t)(ref_n[i] + 1));
            memcpy(ref_ids[i], ids, sizeof(int32_t) * (size_t)ref_n[i]);
            ref_text[i] = strdup(ks_result_text(s));
            ref_kept[i] = ks_result_kept(s, 1, 0, NULL);
        }
        ks_session_free(s);
        ks_policy_free(p);
    }
    if (why[0]) {
        for (int i = 0; i < NCASES; i++) { free(ref_ids[i]); free(ref_text[i]); free(prompts[i]); }
        ks_model_close(m);
        KT_CHECK(0, "%s", why);
    }
    /* the batch: sequence i joins at step 2*i, its prompt prefilled in pieces of 3 tokens, one
     * piece per step (a policy takes the whole prompt at once) */
    ks_session *ss[NCASES] = {0};
    ks_policy *pp[NCASES] = {0};
    ks_seq *qs[NCASES] = {0};
    int nq = 0, steps = 0;
    const char *stops[NCASES][1];
    for (int i = 0; i < NCASES && !why[0]; i++)
        if (ks_session_create(m, &ss[i]) || load_case_policy(m, &CASES[i], &pp[i]) || ks_session_set_policy(ss[i], pp[i]))
            snprintf(why, sizeof why, "case %d: %s", i, ks_last_error());
    char *text[NCASES] = {0};
    size_t tlen[NCASES] = {0};
    for (; !why[0] && steps < 400; steps++) {
        if (steps % 2 == 0 && nq < NCASES) {
            ks_generate_opts o;
            case_opts(&CASES[nq], &o, stops[nq]);
            if (ks_seq_create(ss[nq], prompts[nq], np[nq], &o, &qs[nq])) { snprintf(why, sizeof why, "create %d: %s", nq, ks_last_error()); break; }
            nq++;
        }
        int live = nq < NCASES;
        for (int i = 0; i < nq; i++)
            if (ks_seq_get_state(qs[i]) == KS_SEQ_PREFILL && ks_seq_prefill(qs[i], 3))
                snprintf(why, sizeof why, "prefill %d: %s", i, ks_last_error());
        if (ks_batch_step(qs, nq)) snprintf(why, sizeof why, "step: %s", ks_last_error());
        for (int i = 0; i < nq; i++) {
            const char *pc = ks_seq_piece(qs[i]);
            size_t k = strlen(pc);
            text[i] = realloc(text[i], tlen[i] + k + 1);
            memcpy(text[i] + tlen[i], pc, k + 1);
            tlen[i] += k;
            if (ks_seq_get_state(qs[i]) != KS_SEQ_DONE) live = 1;
        }
        if (!live) break;
    }
    for (int i = 0; i < NCASES && !why[0]; i++) {
        int n;
        const int32_t *ids = ks_seq_ids(qs[i], &n);
        const char *fin = ks_seq_finish(qs[i]);
        if (!fin || !strcmp(fin, "error") || !strcmp(fin, "cancelled"))
            snprintf(why, sizeof why, "case %d: finish %s: %s", i, fin ? fin : "(running)", ks_seq_error(qs[i]));
        else if (n != ref_n[i] || memcmp(ids, ref_ids[i], sizeof(int32_t) * (size_t)n))
            snprintf(why, sizeof why, "case %d: %d ids in the batch, %d alone, or different ids", i, n, ref_n[i]);
        else if (strcmp(ks_result_text(ss[i]), ref_text[i]) || strcmp(text[i] ? text[i] : "", ref_text[i]))
            snprintf(why, sizeof why, "case %d: text \"%s\" / pieces \"%s\", alone \"%s\"", i, ks_result_text(ss[i]),
                     text[i] ? text[i] : "", ref_text[i]);
        else if (ks_result_kept(ss[i], 1, 0, NULL) != ref_kept[i])
            snprintf(why, sizeof why, "case %d: %d rows kept at layer 1, %d alone", i, ks_result_kept(ss[i], 1, 0, NULL), ref_kept[i]);
    }
    /* the cases meant to stop early did: the stop string ended case 5 before its 30 tokens */
    if (!why[0] && ref_n[5] >= 30) snprintf(why, sizeof why, "case 5 did not stop at its stop string (%d ids)", ref_n[5]);
    for (int i = 0; i < NCASES; i++) {
        ks_seq_free(qs[i]);
        ks_session_free(ss[i]);
        ks_policy_free(pp[i]);
        free(text[i]);
    }
    for (int i = 0; i < NCASES; i++) { free(ref_ids[i]); free(ref_text[i]); free(prompts[i]); }
    ks_model_close(m);
    KT_CHECK(!why[0], "%s", why);
}

KT_TEST(batch_cancel_frees_rows) {
    ks_model *m = NULL;
    KT_CHECK(ks_model_open(TINY, "cpu", &m) == KS_OK, "%s", ks_last_error());
    ks_session *s[2] = {0};
    ks_seq *q[2] = {0};
    int32_t ids[] = {0, 100, 200, 300, 400};
    ks_generate_opts o;
    ks_generate_opts_default(&o);
    o.max_new_tokens = 40;
    char why[256] = "";
    for (int i = 0; i < 2 && !why[0]; i++)
        if (ks_session_create(m, &s[i]) || ks_seq_create(s[i], ids, 5, &o, &q[i]) || ks_seq_prefill(q[i], 0))
            snprintf(why, sizeof why, "%d: %s", i, ks_last_error());
    for (int t = 0; t < 4 && !why[0]; t++)
        if (ks_batch_step(q, 2)) snprintf(why, sizeof why, "step: %s", ks_last_error());
    size_t before = why[0] ? 0 : ks_seq_kv_rows(q[0]);
    size_t per_token = (size_t)ks_model_n_layers(m) * (size_t)ks_model_n_kv_heads(m);
    if (!why[0] && before != per_token * (5 + 4))
        snprintf(why, sizeof why, "%zu rows after 5 prompt tokens and 4 steps, expected %zu", before, per_token * 9);
    if (!why[0]) {
        ks_seq_cancel(q[0]);
        ks_batch_step(q, 2);
        if (ks_seq_kv_rows(q[0]) != 0) snprintf(why, sizeof why, "cancelled: %zu rows left", ks_seq_kv_rows(q[0]));
        else if (strcmp(ks_seq_finish(q[0]), "cancelled")) snprintf(why, sizeof why, "finish %s", ks_seq_finish(q[0]));
        else if (ks_seq_get_state(q[1]) != KS_SEQ_DECODE || ks_seq_kv_rows(q[1]) != per_token * 10)
            snprintf(why, sizeof why, "the other sequence: state %d, %zu rows", ks_seq_get_state(q[1]), ks_seq_kv_rows(q[1]));
    }
    for (int i = 0; i < 2; i++) { ks_seq_free(q[i]); ks_session_free(s[i]); }
    ks_model_close(m);
    KT_CHECK(!why[0], "%s", why);
}

KT_TEST(batch_bad_arguments) {
    ks_model *m = NULL;
    KT_CHECK(ks_model_open(TINY, "cpu", &m) == KS_OK, "%s", ks_last_error());
    ks_session *s = NULL;
    KT_CHECK(ks_session_create(m, &s) == KS_OK, "%s", ks_last_error());
    ks_seq *q = NULL;
    int32_t ids[] = {0, 5, 6};
    ks_generate_opts o;
    ks_generate_opts_default(&o);
    char why[256] = "";
    o.temperature = -1;
    if (ks_seq_create(s, ids, 3, &o, &q) != KS_ERR_ARG || q || !strstr(ks_last_error(), "temperature"))
        snprintf(why, sizeof why, "temperature -1: %s", ks_last_error());
    ks_generate_opts_default(&o);
    int32_t bad[] = {0, 99999};
    if (!why[0] && (ks_seq_create(s, bad, 2, &o, &q) != KS_ERR_ARG || !strstr(ks_last_error(), "99999")))
        snprintf(why, sizeof why, "id 99999: %s", ks_last_error());
    if (!why[0] && ks_seq_create(s, ids, 0, &o, &q) != KS_ERR_ARG) snprintf(why, sizeof why, "empty prompt accepted");
    if (!why[0] && ks_batch_step(NULL, 1) != KS_ERR_ARG) snprintf(why, sizeof why, "NULL batch accepted");
    if (!why[0] && ks_seq_create(s, ids, 3, &o, &q)) snprintf(why, sizeof why, "good: %s", ks_last_error());
    if (!why[0] && (ks_seq_prefill(q, -1) != KS_ERR_ARG)) snprintf(why, sizeof why, "max_rows -1 accepted");
    if (!why[0] && (ks_seq_prefill(q, 0) || ks_seq_prefill(q, 0) != KS_ERR_ARG))
        snprintf(why, sizeof why, "a second prefill of a prefilled prompt: %s", ks_last_error());
    ks_seq_free(q);
    ks_session_free(s);
    ks_model_close(m);
    KT_CHECK(!why[0], "%s", why);
}
