/* test_batch_decode.c — the weight-once batched decode step (ks_sessions_decode, core/decode_batch.c)
 * on the CPU backend and the bundled model:
 *   batch_decode_b1_matches_separate   B = 1: the single-session step, logits bit for bit
 *   batch_decode_b3_matches_separate   B = 3 sessions at different prompt lengths and policies
 *   batch_decode_b8_matches_separate   B = 8: none, gemfilter, streamingllm rolling, tokenselect
 *                                      (pre-RoPE rows: a second attn_in group), snapkv, joining
 *                                      and leaving at different steps
 *       each step's logits (and so the greedy ids) of every session are bit-identical to the
 *       same session run alone with ks_session_decode (cpu_gemm.h's element rule: a row's
 *       products do not depend on the other rows of the batch)
 *   batch_decode_rope_groups_match_separate  a longrope model: sessions below and past the switch
 *                                      to the long factors, with and without pre-RoPE keys (four
 *                                      attn_in groups, a session changing group mid-run), bit for bit
 *   batch_decode_refuses_bad_calls     sessions of two models, a session twice, NULL arrays:
 *                                      KS_ERR_ARG, nothing run
 *   batch_decode_policy_failure_isolated  a policy that throws at one step: that session gets
 *                                      KS_ERR_POLICY with its message and is left as a failed
 *                                      ks_session_decode leaves it; a bad id likewise; the
 *                                      others' logits stay bit-identical to separate runs
 *   argmax_rows_ref_matches_sample     the greedy ids' CPU twin = ks_sample's greedy id (crafted
 *   batch_decode_greedy_matches_logits rows, the model's logits); ks_sessions_decode_greedy's next
 *   seq_greedy_on_device_same_ids      ids = the argmax of ks_sessions_decode's logits; ks_seq with
 *                                      greedy on the device: the same ids (each test says more) */
#include "decode_batch.h"
#include "engine.h"
#include "ktest.h"
#include "kvsieve.h"
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TINY "models/kvsieve-tiny"
#define MAXB 8

typedef struct dcase {
    int n_prompt;          /* prompt length (synthetic ids) */
    const char *policy;    /* NULL = none */
    const char *set[4];    /* "key=value" */
    int join, steps;       /* global step at which it joins; decode steps it runs */
} dcase;

static const dcase CASES[MAXB] = {
    {9, NULL, {NULL}, 0, 12},
    {37, "gemfilter", {"layer=2", "k=8", NULL}, 0, 9},
    {23, "streamingllm", {"budget=12", "sinks=2", "rolling=true"}, 1, 14},
    {41, "tokenselect", {"n_init=2", "n_local=4", "k=6", "sparse_prefill=false"}, 0, 11},
    {30, "snapkv", {"budget=10", "window=4", "kernel=3"}, 3, 8},
    {5, NULL, {NULL}, 2, 10},
    {52, "tokenselect", {"n_init=4", "n_local=8", "k=8", "sparse_prefill=false"}, 4, 6},
    {17, "streamingllm", {"budget=10", "sinks=4", "rolling=true"}, 0, 13},
};

static void prompt_ids(int32_t *ids, int n, int salt) {
    for (int i = 0; i < n; i++) ids[i] = 3 + (i * 131 + salt * 977 + i * i * 7) % 4000;
}

/* The same for a vocabulary of v ids. */
static void prompt_ids_v(int32_t *ids, int n, int salt, int v) {
    for (int i = 0; i < n; i++) ids[i] = 3 + (i * 131 + salt * 977 + i * i * 7) % (v - 3);
}

static ks_status load_policy(ks_model *m, const dcase *c, ks_policy **p) {
    *p = NULL;
    if (!c->policy) return KS_OK;
    ks_status st = ks_policy_load(m, c->policy, p);
    for (int i = 0; !st && i < 4 && c->set[i]; i++) {
        char k[64];
        const char *eq = strchr(c->set[i], '=');
        snprintf(k, sizeof k, "%.*s", (int)(eq - c->set[i]), c->set[i]);
        st = ks_policy_set(*p, k, eq + 1);
    }
    return st;
}

/* The reference of case i alone: prefill, then `steps` greedy decode steps; ids (steps) and the
 * logits after each step (steps, vocab). */
static ks_status run_alone(ks_model *m, int i, const dcase *c, int32_t *ids, float *lg) {
    int vocab = m->cfg.vocab;
    ks_session *s = NULL;
    ks_policy *p = NULL;
    int32_t pr[64];
    prompt_ids(pr, c->n_prompt, i);
    ks_status st = ks_session_create(m, &s);
    if (!st) st = load_policy(m, c, &p);
    if (!st) st = ks_session_set_policy(s, p);
    if (!st) st = ks_session_prefill(s, pr, c->n_prompt);
    ks_sampler smp;
    ks_sampler_init(&smp, 0, 1, 0);
    for (int t = 0; !st && t < c->steps; t++) {
        ids[t] = ks_sample(&smp, s->logits, vocab);
        st = ks_session_decode(s, ids[t]);
        if (!st) memcpy(lg + (size_t)t * vocab, s->logits, sizeof(float) * vocab);
    }
    ks_session_free(s);
    ks_policy_free(p);
    return st;
}

/* Cases cs[0..B) run together: case k joins at its step (its prompt prefilled alone), then every
 * joined case with steps left decodes in one ks_sessions_decode per global step. Each step's
 * logits and ids are compared with run_alone's. why: the first difference or failure. */
static void run_batched(ks_model *m, const int *cs, int B, char *why, size_t cap) {
    int vocab = m->cfg.vocab;
    int32_t *ref_ids[MAXB] = {0};
    float *ref_lg[MAXB] = {0};
    ks_session *ss[MAXB] = {0};
    ks_policy *pp[MAXB] = {0};
    int done[MAXB] = {0}, joined[MAXB] = {0};
    ks_sampler smp;
    ks_sampler_init(&smp, 0, 1, 0);
    for (int k = 0; k < B && !why[0]; k++) {
        const dcase *c = &CASES[cs[k]];
        ref_ids[k] = malloc(sizeof(int32_t) * c->steps);
        ref_lg[k] = malloc(sizeof(float) * (size_t)c->steps * vocab);
        if (run_alone(m, cs[k], c, ref_ids[k], ref_lg[k]))
            snprintf(why, cap, "case %d alone: %s", cs[k], ks_last_error());
        else if (ks_session_create(m, &ss[k]) || load_policy(m, c, &pp[k]) || ks_session_set_policy(ss[k], pp[k]))
            snprintf(why, cap, "case %d: %s", cs[k], ks_last_error());
    }
    int batched_steps = 0;
    for (int g = 0; g < 64 && !why[0]; g++) {
        ks_session *bs[MAXB];
        int32_t bid[MAXB];
        int who[MAXB], nb = 0, left = 0;
        for (int k = 0; k < B && !why[0]; k++) {
            const dcase *c = &CASES[cs[k]];
            if (!joined[k] && g >= c->join) {
                int32_t pr[64];
                prompt_ids(pr, c->n_prompt, cs[k]);
                if (ks_session_prefill(ss[k], pr, c->n_prompt)) snprintf(why, cap, "case %d prefill: %s", cs[k], ks_last_error());
                joined[k] = 1;
            }
            if (!joined[k] || done[k] == c->steps) { left += !joined[k]; continue; }
            bid[nb] = ks_sample(&smp, ss[k]->logits, vocab);
            if (bid[nb] != ref_ids[k][done[k]])
                snprintf(why, cap, "case %d step %d: id %d batched, %d alone", cs[k], done[k], bid[nb], ref_ids[k][done[k]]);
            bs[nb] = ss[k];
            who[nb++] = k;
        }
        if (why[0]) break;
        if (!nb && !left) break;
        ks_status st[MAXB];
        char *msg[MAXB];
        if (ks_sessions_decode(bs, bid, nb, st, msg)) { snprintf(why, cap, "step %d: %s", g, ks_last_error()); break; }
        batched_steps += nb > 1;
        for (int j = 0; j < nb; j++) {
            int k = who[j];
            if (st[j] && !why[0]) snprintf(why, cap, "case %d step %d: %s", cs[k], done[k], msg[j] ? msg[j] : "?");
            else if (!why[0] && memcmp(ss[k]->logits, ref_lg[k] + (size_t)done[k] * vocab, sizeof(float) * vocab)) {
                int at = 0;
                while (ss[k]->logits[at] == ref_lg[k][(size_t)done[k] * vocab + at]) at++;
                snprintf(why, cap, "case %d (%s) step %d in a batch of %d: logit %d is %.9g batched, %.9g alone", cs[k],
                         CASES[cs[k]].policy ? CASES[cs[k]].policy : "none", done[k], nb, at, ss[k]->logits[at],
                         ref_lg[k][(size_t)done[k] * vocab + at]);
            }
            free(msg[j]);
            done[k]++;
        }
    }
    for (int k = 0; k < B && !why[0]; k++)
        if (done[k] != CASES[cs[k]].steps) snprintf(why, cap, "case %d ran %d of %d steps", cs[k], done[k], CASES[cs[k]].steps);
    if (!why[0] && B > 1 && batched_steps == 0) snprintf(why, cap, "no step had more than one session");
    for (int k = 0; k < B; k++) {
        ks_session_free(ss[k]);
        ks_policy_free(pp[k]);
        free(ref_ids[k]);
        free(ref_lg[k]);
    }
}

static void batch_case(kt_ctx *kt_, const int *cs, int B) {
    ks_model *m = NULL;
    KT_CHECK(ks_model_open(TINY, "cpu", &m) == KS_OK, "%s", ks_last_error());
    char why[512] = "";
    run_batched(m, cs, B, why, sizeof why);
    ks_model_close(m);
    KT_CHECK(!why[0], "%s", why);
}

KT_TEST(batch_decode_b1_matches_separate) {
    static const int cs[] = {3};
    batch_case(kt_, cs, 1);
}

KT_TEST(batch_decode_b3_matches_separate) {
    static const int cs[] = {0, 2, 3};
    batch_case(kt_, cs, 3);
}

KT_TEST(batch_decode_b8_matches_separate) {
    static const int cs[] = {0, 1, 2, 3, 4, 5, 6, 7};
    batch_case(kt_, cs, 8);
}

KT_TEST(batch_decode_refuses_bad_calls) {
    ks_model *m1 = NULL, *m2 = NULL;
    KT_CHECK(ks_model_open(TINY, "cpu", &m1) == KS_OK, "%s", ks_last_error());
    ks_session *a = NULL, *b = NULL, *c = NULL;
    char why[256] = "";
    int32_t pr[8];
    prompt_ids(pr, 8, 1);
    if (ks_model_open(TINY, "cpu", &m2) || ks_session_create(m1, &a) || ks_session_create(m1, &b) ||
        ks_session_create(m2, &c) || ks_session_prefill(a, pr, 8) || ks_session_prefill(b, pr, 8) ||
        ks_session_prefill(c, pr, 8))
        snprintf(why, sizeof why, "setup: %s", ks_last_error());
    ks_status st[3] = {KS_ERR_INTERNAL, KS_ERR_INTERNAL, KS_ERR_INTERNAL};
    int32_t ids[3] = {5, 6, 7};
    if (!why[0]) {
        ks_session *two[3] = {a, b, c}, *twice[2] = {a, a}, *nul[2] = {a, NULL};
        ks_status r1 = ks_sessions_decode(two, ids, 3, st, NULL);
        const char *e1 = ks_last_error();
        int other = r1 == KS_ERR_ARG && strstr(e1, "another model");
        ks_status r2 = ks_sessions_decode(twice, ids, 2, st, NULL);
        ks_status r3 = ks_sessions_decode(nul, ids, 2, st, NULL);
        ks_status r4 = ks_sessions_decode(two, NULL, 2, st, NULL);
        ks_status r5 = ks_sessions_decode(two, ids, 2, NULL, NULL);
        ks_status r6 = ks_sessions_decode(two, ids, -1, st, NULL);
        if (!other) snprintf(why, sizeof why, "two models: status %d, \"%s\"", r1, e1);
        else if (r2 != KS_ERR_ARG || r3 != KS_ERR_ARG || r4 != KS_ERR_ARG || r5 != KS_ERR_ARG || r6 != KS_ERR_ARG)
            snprintf(why, sizeof why, "bad calls gave %d %d %d %d %d", r2, r3, r4, r5, r6);
        else if (a->n_past != 8 || b->n_past != 8 || c->n_past != 8 || st[0] != KS_ERR_INTERNAL)
            snprintf(why, sizeof why, "a refused call ran something (n_past %d %d %d)", a->n_past, b->n_past, c->n_past);
        else if (ks_sessions_decode(two, ids, 0, st, NULL) != KS_OK)
            snprintf(why, sizeof why, "n = 0: %s", ks_last_error());
    }
    ks_session_free(a);
    ks_session_free(b);
    ks_session_free(c);
    ks_model_close(m1);
    ks_model_close(m2);
    KT_CHECK(!why[0], "%s", why);
}

/* A policy that throws in decode_qkv at layer 3 of its third decode step. */
static const char BOOM[] =
    "local calls = 0\n"
    "return { name = 'boom', params = {},\n"
    "  decode_qkv = function(ev, p)\n"
    "    if ev.layer == 3 then calls = calls + 1; if calls == 3 then error('boom at step 3', 0) end end\n"
    "  end }\n";

KT_TEST(batch_decode_policy_failure_isolated) {
    ks_model *m = NULL;
    KT_CHECK(ks_model_open(TINY, "cpu", &m) == KS_OK, "%s", ks_last_error());
    int vocab = m->cfg.vocab, NL = m->cfg.n_layers;
    /* sessions: 0 full attention (case 0), 1 the throwing policy, 2 tokenselect (case 3), 3 a bad id
     * at step 2; 0 and 2 are compared with their separate runs */
    enum { N = 4, STEPS = 5 };
    char why[512] = "";
    int32_t ref_ids[2][16];
    float *ref_lg[2] = {malloc(sizeof(float) * 16 * vocab), malloc(sizeof(float) * 16 * vocab)};
    dcase c0 = CASES[0], c2 = CASES[3];
    c0.steps = c2.steps = STEPS;
    if (run_alone(m, 0, &c0, ref_ids[0], ref_lg[0]) || run_alone(m, 3, &c2, ref_ids[1], ref_lg[1]))
        snprintf(why, sizeof why, "alone: %s", ks_last_error());
    ks_session *ss[N] = {0};
    ks_policy *boom = NULL, *ts = NULL;
    for (int i = 0; i < N && !why[0]; i++)
        if (ks_session_create(m, &ss[i])) snprintf(why, sizeof why, "session: %s", ks_last_error());
    if (!why[0] && (ks_policy_load_string(m, "boom", BOOM, &boom) || ks_session_set_policy(ss[1], boom) ||
                    load_policy(m, &c2, &ts) || ks_session_set_policy(ss[2], ts)))
        snprintf(why, sizeof why, "policies: %s", ks_last_error());
    const int np[N] = {c0.n_prompt, 12, c2.n_prompt, 7}, salt[N] = {0, 5, 3, 6};
    for (int i = 0; i < N && !why[0]; i++) {
        int32_t pr[64];
        prompt_ids(pr, np[i], salt[i]);
        if (ks_session_prefill(ss[i], pr, np[i])) snprintf(why, sizeof why, "prefill %d: %s", i, ks_last_error());
    }
    ks_sampler smp;
    ks_sampler_init(&smp, 0, 1, 0);
    int failed1 = 0, failed3 = 0;
    for (int t = 0; t < STEPS && !why[0]; t++) {
        ks_session *bs[N];
        int32_t ids[N];
        int who[N], nb = 0;
        for (int i = 0; i < N; i++) {
            if ((i == 1 && failed1) || (i == 3 && failed3)) continue;
            ids[nb] = ks_sample(&smp, ss[i]->logits, vocab);
            if (i == 3 && t == 2) ids[nb] = vocab + 7; /* out of range */
            bs[nb] = ss[i];
            who[nb++] = i;
        }
        int past1 = ss[1]->n_past, rows1[16];
        for (int l = 0; l < NL; l++) rows1[l] = (int)ks_session_kv_rows(ss[1], l);
        ks_status st[N];
        char *msg[N];
        if (ks_sessions_decode(bs, ids, nb, st, msg)) { snprintf(why, sizeof why, "step %d: %s", t, ks_last_error()); break; }
        for (int j = 0; j < nb; j++) {
            int i = who[j];
            if (why[0]) { free(msg[j]); continue; }
            int want_fail = (i == 1 && t == 2) || (i == 3 && t == 2);
            if (!want_fail && st[j]) snprintf(why, sizeof why, "session %d step %d failed: %s", i, t, msg[j] ? msg[j] : "?");
            else if (want_fail && i == 1) {
                failed1 = 1;
                /* the policy's error, and what a failed single step leaves: the row appended at
                 * layers 0..3 (the failing event's layer included), not after; n_past unchanged */
                int rows_ok = 1;
                for (int l = 0; l < NL; l++)
                    rows_ok &= (int)ks_session_kv_rows(ss[1], l) == rows1[l] + (l <= 3 ? m->cfg.n_kv_heads : 0);
                if (st[j] != KS_ERR_POLICY || !msg[j] || !strstr(msg[j], "boom at step 3") || !strstr(msg[j], "policy boom"))
                    snprintf(why, sizeof why, "the throwing policy: status %d, \"%s\"", st[j], msg[j] ? msg[j] : "(none)");
                else if (ss[1]->n_past != past1 || !rows_ok)
                    snprintf(why, sizeof why, "the failed session: n_past %d (was %d), rows not as a failed single step", ss[1]->n_past, past1);
            } else if (want_fail && i == 3) {
                failed3 = 1;
                if (st[j] != KS_ERR_ARG || !msg[j] || !strstr(msg[j], "out of range"))
                    snprintf(why, sizeof why, "the bad id: status %d, \"%s\"", st[j], msg[j] ? msg[j] : "(none)");
            } else if (i == 0 || i == 2) {
                int r = i == 0 ? 0 : 1;
                if (ids[j] != ref_ids[r][t] || memcmp(ss[i]->logits, ref_lg[r] + (size_t)t * vocab, sizeof(float) * vocab))
                    snprintf(why, sizeof why, "session %d step %d differs from its separate run", i, t);
            }
            free(msg[j]);
        }
    }
    if (!why[0] && (!failed1 || !failed3)) snprintf(why, sizeof why, "the failures did not happen (%d %d)", failed1, failed3);
    for (int i = 0; i < N; i++) ks_session_free(ss[i]);
    ks_policy_free(boom);
    ks_policy_free(ts);
    free(ref_lg[0]);
    free(ref_lg[1]);
    ks_model_close(m);
    KT_CHECK(!why[0], "%s", why);
}

/* A policy that keeps keys before RoPE and does nothing else (its rows are a group of their own). */
static const char PRE[] = "return { name = 'pre', pre_rope_keys = true, params = {}, decode_qkv = function(ev, p) end }\n";

KT_TEST(batch_decode_rope_groups_match_separate) {
    char dir[256];
    KT_CHECK(kt_tmpdir(dir, sizeof dir) == 0, "no temporary folder");
    kt_tiny_cfg c = kt_tiny_default(); /* head_dim 8: 4 factors */
    c.n_layers = 3;
    char cfg[1024];
    snprintf(cfg, sizeof cfg,
             "{\"model_type\": \"llama\", \"hidden_size\": %d, \"num_hidden_layers\": %d, \"num_attention_heads\": %d,"
             " \"num_key_value_heads\": %d, \"intermediate_size\": %d, \"vocab_size\": %d,"
             " \"max_position_embeddings\": %d, \"rms_norm_eps\": 1e-5, \"rope_theta\": 10000.0,"
             " \"rope_scaling\": {\"type\": \"longrope\", \"short_factor\": [1.0, 1.5, 2.0, 2.5],"
             " \"long_factor\": [3.0, 5.0, 9.0, 17.0], \"original_max_position_embeddings\": 16},"
             " \"tie_word_embeddings\": false, \"hidden_act\": \"silu\", \"bos_token_id\": 1, \"eos_token_id\": 2}",
             c.dim, c.n_layers, c.n_heads, c.n_kv_heads, c.ffn, c.vocab, c.max_pos);
    ks_model *m = NULL;
    char why[512] = "";
    if (kt_write_tiny_model(dir, &c) || kt_write_file(dir, "config.json", cfg) || ks_model_open(dir, "cpu", &m))
        snprintf(why, sizeof why, "model: %s", ks_last_error());
    if (!why[0] && m->cfg.rope.type != KS_ROPE_LONGROPE) snprintf(why, sizeof why, "the model is not longrope");
    /* prompts of 6 (crosses the switch at step 9), 20 (past it) with and without pre-RoPE keys */
    enum { N = 4, STEPS = 14 };
    const int np[N] = {6, 20, 6, 21}, pre[N] = {0, 0, 1, 1};
    int vocab = m ? m->cfg.vocab : 0;
    float *ref = m ? malloc(sizeof(float) * N * STEPS * vocab) : NULL;
    int32_t ref_id[N][STEPS];
    ks_session *ss[N] = {0};
    ks_policy *pp[N] = {0};
    ks_sampler smp;
    ks_sampler_init(&smp, 0, 1, 0);
    for (int i = 0; i < N && !why[0]; i++) { /* alone */
        int32_t pr[32];
        prompt_ids_v(pr, np[i], i, vocab);
        if (ks_session_create(m, &ss[i]) || (pre[i] && ks_policy_load_string(m, "pre", PRE, &pp[i])) ||
            ks_session_set_policy(ss[i], pp[i]) || ks_session_prefill(ss[i], pr, np[i])) {
            snprintf(why, sizeof why, "session %d: %s", i, ks_last_error());
            break;
        }
        for (int t = 0; t < STEPS && !why[0]; t++) {
            ref_id[i][t] = ks_sample(&smp, ss[i]->logits, vocab);
            if (ks_session_decode(ss[i], ref_id[i][t])) snprintf(why, sizeof why, "alone %d: %s", i, ks_last_error());
            memcpy(ref + ((size_t)i * STEPS + t) * vocab, ss[i]->logits, sizeof(float) * vocab);
        }
        ks_session_reset(ss[i]);
        if (!why[0] && ks_session_prefill(ss[i], pr, np[i])) snprintf(why, sizeof why, "prefill %d: %s", i, ks_last_error());
    }
    for (int t = 0; t < STEPS && !why[0]; t++) { /* together */
        int32_t ids[N];
        ks_status st[N];
        for (int i = 0; i < N; i++) ids[i] = ks_sample(&smp, ss[i]->logits, vocab);
        if (ks_sessions_decode(ss, ids, N, st, NULL)) { snprintf(why, sizeof why, "step %d: %s", t, ks_last_error()); break; }
        for (int i = 0; i < N && !why[0]; i++)
            if (st[i] || ids[i] != ref_id[i][t] ||
                memcmp(ss[i]->logits, ref + ((size_t)i * STEPS + t) * vocab, sizeof(float) * vocab))
                snprintf(why, sizeof why, "session %d (prompt %d, %s) step %d differs from its separate run (status %d)", i,
                         np[i], pre[i] ? "pre-RoPE" : "rotated", t, st[i]);
    }
    for (int i = 0; i < N; i++) {
        ks_session_free(ss[i]);
        ks_policy_free(pp[i]);
    }
    free(ref);
    ks_model_close(m);
    kt_rmdir(dir);
    KT_CHECK(!why[0], "%s", why);
}

/* ---------------------------------------------------------------- greedy ids where the logits are */

/* ks_sample's greedy id of row l (the host argmax every sampler pass starts with) */
static int32_t greedy_id(const float *l, int n) {
    ks_sampler g;
    ks_sampler_init(&g, 0, 1, 0);
    return ks_sample(&g, l, n);
}

/* argmax_rows_ref_matches_sample: ks_argmax_rows_ref (the CPU twin of kernels/argmax_rows.cu)
 * gives ks_sample's greedy id on rows made to break it (ties, NaN at 0 and inside, all -inf,
 * +0 beside -0, the maximum last, a tail shorter than 8) and on the bundled model's logits after
 * prefills and decode steps of several prompts. */
KT_TEST(argmax_rows_ref_matches_sample) {
    enum { C = 13 };
    const float nan = NAN, inf = INFINITY;
    const float rows[][C] = {
        {1, 2, 3, 3, 2, 1, 0, 3, 1, 1, 1, 1, 1},             /* tie: lowest id */
        {nan, 5, 6, 7, 8, 9, 1, 1, 1, 1, 1, 1, 1},          /* NaN at 0: 0 */
        {1, nan, 6, nan, 8, 9, 1, nan, 1, 1, 1, 1, 9},      /* NaN inside: never the largest */
        {-inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf},
        {-1, -0.0f, 0, -2, 0, -0.0f, -3, -4, -5, -6, -7, -8, -9}, /* -0 == +0: the first */
        {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1e-30f},       /* the maximum last, in the tail */
        {-inf, nan, nan, nan, nan, nan, nan, nan, nan, nan, nan, nan, nan}, /* only element 0 */
        {3, 1, 2, inf, 4, inf, nan, 1, 1, 1, 1, 1, 1},
    };
    int nr = (int)(sizeof rows / sizeof rows[0]);
    int32_t got[16];
    ks_argmax_rows_ref(&rows[0][0], nr, C, got);
    for (int r = 0; r < nr; r++) KT_CHECK(got[r] == greedy_id(rows[r], C), "row %d: twin %d, ks_sample %d", r, got[r], greedy_id(rows[r], C));
    for (int w = 1; w <= C; w++) /* every width, so both the 8-lane body and the tail of ks_sample's scan are hit */
        for (int r = 0; r < nr; r++) {
            int32_t one;
            ks_argmax_rows_ref(rows[r], 1, w, &one);
            KT_CHECK(one == greedy_id(rows[r], w), "row %d width %d: twin %d, ks_sample %d", r, w, one, greedy_id(rows[r], w));
        }
    ks_model *m;
    KT_CHECK(ks_model_open(TINY, "cpu", &m) == KS_OK, "%s", ks_last_error());
    int V = m->cfg.vocab, checked = 0;
    for (int p = 0; p < 4; p++) {
        ks_session *s = NULL;
        int32_t pr[40];
        prompt_ids_v(pr, 7 + 9 * p, p, V);
        ks_status st = ks_session_create(m, &s);
        if (!st) st = ks_session_prefill(s, pr, 7 + 9 * p);
        for (int t = 0; !st && t < 6; t++) {
            int32_t tw;
            ks_argmax_rows_ref(s->logits, 1, V, &tw);
            int32_t want = greedy_id(s->logits, V);
            KT_CHECK(tw == want, "prompt %d step %d: twin %d, ks_sample %d", p, t, tw, want);
            checked++;
            st = ks_session_decode(s, want);
        }
        ks_session_free(s);
        KT_CHECK(!st, "%s", ks_last_error());
    }
    ks_model_close(m);
    KT_CHECK(checked == 24, "%d rows of logits checked", checked);
}

static long g_argmax_rows;
static ks_status counting_argmax(ks_backend *b, const float *x, int rows, int cols, int32_t *out) {
    g_argmax_rows += rows;
    ks_argmax_rows_ref(x, rows, cols, out);
    return KS_OK;
}

/* batch_decode_greedy_matches_logits: ks_sessions_decode_greedy over B = 4 sessions (one of them
 * with TokenSelect, one of them not greedy) gives each greedy session's next id equal to the
 * argmax of the logits ks_sessions_decode gives the same sessions (run beside them step by step),
 * leaves a greedy session's logits as they were and fills the non-greedy one's bit for bit; on
 * the CPU fallback (no argmax_rows: the twin in place) and with the twin installed as the
 * backend's argmax_rows (called once a step, for the step's rows); one session alone (n = 1)
 * and a bad id (next -1, its own status) too; NULL next is refused. */
KT_TEST(batch_decode_greedy_matches_logits) {
    ks_model *m;
    KT_CHECK(ks_model_open(TINY, "cpu", &m) == KS_OK, "%s", ks_last_error());
    enum { B = 4, T = 5 };
    int V = m->cfg.vocab;
    for (int hook = 0; hook < 2; hook++) {
        m->be->argmax_rows = hook ? counting_argmax : NULL;
        g_argmax_rows = 0;
        ks_session *a[B] = {0}, *r[B] = {0}; /* a: greedy path, r: the reference (logits) */
        ks_policy *pa = NULL, *pr = NULL;
        static const dcase ts = {0, "tokenselect", {"n_init=2", "n_local=4", "k=6", "sparse_prefill=false"}, 0, 0};
        ks_status st = load_policy(m, &ts, &pa);
        if (!st) st = load_policy(m, &ts, &pr);
        for (int i = 0; i < B && !st; i++) st = ks_session_create(m, &a[i]);
        for (int i = 0; i < B && !st; i++) st = ks_session_create(m, &r[i]);
        if (!st) st = ks_session_set_policy(a[2], pa);
        if (!st) st = ks_session_set_policy(r[2], pr);
        int32_t pids[B][40];
        for (int i = 0; i < B && !st; i++) {
            prompt_ids_v(pids[i], 11 + 7 * i, i + 5, V);
            st = ks_session_prefill(a[i], pids[i], 11 + 7 * i);
            if (!st) st = ks_session_prefill(r[i], pids[i], 11 + 7 * i);
        }
        KT_CHECK(!st, "%s", ks_last_error());
        const unsigned char greedy[B] = {1, 1, 1, 0};
        int32_t tok[B];
        for (int i = 0; i < B; i++) tok[i] = greedy_id(a[i]->logits, V);
        char why[200] = "";
        float *keep = malloc(sizeof(float) * V);
        KT_CHECK(keep != NULL, "out of memory");
        for (int t = 0; t < T && !st && !why[0]; t++) {
            int32_t next[B], rt[B];
            ks_status sa[B], sr[B];
            memcpy(keep, a[0]->logits, sizeof(float) * V);
            memcpy(rt, tok, sizeof rt);
            st = ks_sessions_decode_greedy(a, tok, B, greedy, next, sa, NULL);
            if (!st) st = ks_sessions_decode(r, rt, B, sr, NULL);
            for (int i = 0; i < B && !st; i++) st = sa[i] ? sa[i] : sr[i];
            for (int i = 0; i < B && !st && !why[0]; i++) {
                int32_t want = greedy_id(r[i]->logits, V);
                if (greedy[i] && next[i] != want)
                    snprintf(why, sizeof why, "hook %d step %d session %d: next %d, argmax of the logits %d", hook, t, i,
                             next[i], want);
                else if (!greedy[i] && (next[i] != -1 || memcmp(a[i]->logits, r[i]->logits, sizeof(float) * V)))
                    snprintf(why, sizeof why, "hook %d step %d: the non-greedy session's logits differ (next %d)", hook, t,
                             next[i]);
                tok[i] = want;
            }
            if (!st && !why[0] && memcmp(keep, a[0]->logits, sizeof(float) * V))
                snprintf(why, sizeof why, "hook %d step %d: a greedy session's logits were written", hook, t);
        }
        KT_CHECK(!st, "%s", ks_last_error());
        KT_CHECK(!why[0], "%s", why);
        KT_CHECK(g_argmax_rows == (hook ? (long)B * T : 0), "hook %d: argmax_rows took %ld rows, want %d", hook,
                 g_argmax_rows, hook ? B * T : 0);
        /* one session alone, and a bad id beside a good one */
        int32_t one, two[2];
        ks_status s1, s2[2];
        KT_CHECK(ks_sessions_decode_greedy(a, tok, 1, NULL, &one, &s1, NULL) == KS_OK && s1 == KS_OK, "n = 1: %s",
                 ks_last_error());
        KT_CHECK(one == greedy_id(a[0]->logits, V), "n = 1: next %d, argmax %d", one, greedy_id(a[0]->logits, V));
        int32_t bad[2] = {tok[1], V};
        KT_CHECK(ks_sessions_decode_greedy(a + 1, bad, 2, NULL, two, s2, NULL) == KS_OK, "%s", ks_last_error());
        KT_CHECK(s2[0] == KS_OK && two[0] >= 0 && s2[1] == KS_ERR_ARG && two[1] == -1, "bad id: %d %d, next %d %d", s2[0],
                 s2[1], two[0], two[1]);
        KT_CHECK(ks_sessions_decode_greedy(a, tok, 2, NULL, NULL, s2, NULL) == KS_ERR_ARG, "NULL next accepted");
        free(keep);
        for (int i = 0; i < B; i++) { ks_session_free(a[i]); ks_session_free(r[i]); }
        ks_policy_free(pa);
        ks_policy_free(pr);
    }
    m->be->argmax_rows = NULL;
    ks_model_close(m);
}

/* seq_greedy_on_device_same_ids: ks_batch_step over three greedy sequences (one with a repeat
 * penalty, which keeps the host sampler) with ks_seq_set_greedy_on_device gives the ids it gives
 * without, token for token, until each ends. */
KT_TEST(seq_greedy_on_device_same_ids) {
    ks_model *m;
    KT_CHECK(ks_model_open(TINY, "cpu", &m) == KS_OK, "%s", ks_last_error());
    enum { B = 3 };
    int V = m->cfg.vocab;
    int32_t out[2][B][40];
    int nout[2][B];
    for (int dev = 0; dev < 2; dev++) {
        ks_session *s[B] = {0};
        ks_seq *q[B] = {0};
        ks_status st = KS_OK;
        for (int i = 0; i < B && !st; i++) {
            int32_t pr[30];
            prompt_ids_v(pr, 9 + 5 * i, i + 11, V);
            ks_generate_opts o;
            ks_generate_opts_default(&o);
            o.max_new_tokens = 12 + 4 * i;
            if (i == 2) o.repeat_penalty = 1.3f;
            st = ks_session_create(m, &s[i]);
            if (!st) st = ks_seq_create(s[i], pr, 9 + 5 * i, &o, &q[i]);
            if (!st) st = ks_seq_prefill(q[i], 0);
            if (q[i]) ks_seq_set_greedy_on_device(q[i], dev);
        }
        for (int k = 0; k < 40 && !st; k++) st = ks_batch_step(q, B);
        for (int i = 0; i < B && !st; i++) {
            KT_CHECK(ks_seq_get_state(q[i]) == KS_SEQ_DONE, "dev %d: sequence %d not done (%s)", dev, i, ks_seq_error(q[i]));
            const int32_t *g = ks_seq_ids(q[i], &nout[dev][i]);
            memcpy(out[dev][i], g, sizeof(int32_t) * nout[dev][i]);
        }
        for (int i = 0; i < B; i++) { ks_seq_free(q[i]); ks_session_free(s[i]); }
        KT_CHECK(!st, "%s", ks_last_error());
    }
    for (int i = 0; i < B; i++) {
        KT_CHECK(nout[0][i] == nout[1][i] && nout[0][i] > 0, "sequence %d: %d ids, %d on device", i, nout[0][i], nout[1][i]);
        for (int t = 0; t < nout[0][i]; t++)
            KT_CHECK(out[0][i][t] == out[1][i][t], "sequence %d token %d: %d, %d on device", i, t, out[0][i][t], out[1][i][t]);
    }
    ks_model_close(m);
}
