/* test_bench_batch.c — the batched bench row (ks_bench_batch_run, core/bench_batch.c) on the CPU
 * backend and the bundled model:
 *   bench_batch_ids_match_separate   B = 3 distinct prompts, 2 warm-up + 5 timed steps: every
 *                                    sequence's kept ids equal the same prompt run alone
 *                                    (ks_session_prefill, then greedy ks_session_decode), id for id
 *                                    (CPU: bit-identical logits, decode_batch.c); the A/B switches
 *                                    (attention per session; the host's argmax over downloaded
 *                                    logits instead of the step's own) give the same ids too
 *   bench_batch_figures_present      every figure of a row with --ttft-under-load is there: a
 *                                    positive time per step, the median among them, the host
 *                                    sampling time inside the steps' total with host_argmax and 0
 *                                    without (the argmax is inside the step), tokens/s =
 *                                    B * gen / their sum, the KV bytes of exactly the rows held
 *                                    (B sessions x layers x KV heads x (prompt + steps)), the
 *                                    newcomer's rounds = ceil(n / chunk) and positive TTFTs; no
 *                                    wall-clock bounds
 *   bench_batch_hook_path_matches_separate  the same with the engine's batched-attention path on:
 *                                    the CPU backend given ks_attn_decode_batch_loop (the hook's
 *                                    reference, core/decode_batch.h) as its attn_decode_batch; and
 *                                    a mixed step (two plain sessions through the hook, one with
 *                                    TokenSelect's decode event and pre-RoPE keys one by one) gives
 *                                    each session's ids alone; the A/B switch restores the hook
 *   bench_batch_refuses_bad_calls    batch 0, gen 0, a zero chunk, a prompt that with its steps
 *                                    exceeds the context, an id outside the vocabulary, NULL
 *                                    pointers: KS_ERR_ARG with a message, and the result zeroed */
#include "decode_batch.h"
#include "engine.h"
#include "ktest.h"
#include "kvsieve.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define TINY "models/kvsieve-tiny"

/* prompts (np, n): distinct rows */
static void prompts(int32_t *ids, int np, int n, int vocab) {
    for (int p = 0; p < np; p++)
        for (int i = 0; i < n; i++) ids[(size_t)p * n + i] = 3 + (i * 131 + p * 977 + i * i * 7) % (vocab - 3);
}

/* TokenSelect with a decode event on every step (pre-RoPE keys), or NULL */
static ks_status tokenselect(ks_model *m, ks_policy **p) {
    const char *set[][2] = {{"n_init", "2"}, {"n_local", "4"}, {"k", "6"}, {"sparse_prefill", "false"}};
    ks_status st = ks_policy_load(m, "tokenselect", p);
    for (int i = 0; !st && i < 4; i++) st = ks_policy_set(*p, set[i][0], set[i][1]);
    return st;
}

/* prompt ids[0..n) alone (with TokenSelect when ts): `steps` greedy ids */
static ks_status run_alone_p(ks_model *m, const int32_t *ids, int n, int steps, int ts, int32_t *out) {
    ks_session *s = NULL;
    ks_policy *p = NULL;
    ks_status st = ks_session_create(m, &s);
    if (!st && ts) st = tokenselect(m, &p);
    if (!st && p) st = ks_session_set_policy(s, p);
    if (!st) st = ks_session_prefill(s, ids, n);
    ks_sampler smp;
    ks_sampler_init(&smp, 0, 1, 0);
    for (int t = 0; !st && t < steps; t++) {
        out[t] = ks_sample(&smp, s->logits, m->cfg.vocab);
        st = ks_session_decode(s, out[t]);
    }
    ks_session_free(s);
    ks_policy_free(p);
    return st;
}
static ks_status run_alone(ks_model *m, const int32_t *ids, int n, int steps, int32_t *out) {
    return run_alone_p(m, ids, n, steps, 0, out);
}

KT_TEST(bench_batch_ids_match_separate) {
    ks_model *m;
    KT_CHECK(ks_model_open(TINY, "cpu", &m) == KS_OK, "%s", ks_last_error());
    enum { B = 3, N = 29 };
    int32_t ids[B * N], ref[B][7];
    prompts(ids, B, N, m->cfg.vocab);
    for (int i = 0; i < B; i++) KT_CHECK(run_alone(m, ids + i * N, N, 7, ref[i]) == KS_OK, "%s", ks_last_error());
    for (int ab = 0; ab < 3; ab++) {
        ks_bench_batch_opts o;
        ks_bench_batch_opts_default(&o);
        o.gen = 5;
        o.warmup = 2;
        o.keep_ids = 1;
        o.per_session_attention = ab == 1;
        o.host_argmax = ab == 2;
        ks_bench_batch_result r;
        ks_status st = ks_bench_batch_run(m, ids, N, B, &o, &r);
        KT_CHECK(st == KS_OK, "%s", ks_last_error());
        KT_CHECK(r.n_ids == 7 && r.ids, "kept %d ids", r.n_ids);
        for (int i = 0; i < B; i++)
            for (int t = 0; t < 7; t++)
                KT_CHECK(r.ids[i * 7 + t] == ref[i][t], "A/B %d: sequence %d step %d: %d batched, %d alone", ab, i, t,
                         r.ids[i * 7 + t], ref[i][t]);
        ks_bench_batch_result_free(&r);
        KT_CHECK(r.ids == NULL && r.step_s == NULL, "the result is zeroed by free");
    }
    ks_model_close(m);
}

/* the reference hook, counting the rows it is given (and the rows it is asked to copy to bf16,
 * which it does as the contract says: each output rounded) */
static long g_hook_rows, g_hook_bf16_rows;
static ks_status counting_hook(ks_backend *b, int n, ks_kv_layer *const *L, const float *const *q, const float *const *k,
                               const float *const *v, const int32_t *pos, int n_heads, float scale, int window,
                               float *const *out, void *out_bf16) {
    g_hook_rows += n;
    ks_status st = ks_attn_decode_batch_loop(b, n, L, q, k, v, pos, n_heads, scale, window, out);
    if (!st && out_bf16) {
        size_t qd = (size_t)n_heads * L[0]->head_dim;
        for (int i = 0; i < n; i++)
            for (size_t e = 0; e < qd; e++) ((uint16_t *)out_bf16)[i * qd + e] = ks_f32_to_bf16(out[i][e]);
        g_hook_bf16_rows += n;
    }
    return st;
}

KT_TEST(bench_batch_hook_path_matches_separate) {
    ks_model *m;
    KT_CHECK(ks_model_open(TINY, "cpu", &m) == KS_OK, "%s", ks_last_error());
    enum { B = 3, N = 23, T = 6 };
    int32_t ids[B * N], ref[B][T];
    prompts(ids, B, N, m->cfg.vocab);
    for (int i = 0; i < B; i++) KT_CHECK(run_alone_p(m, ids + i * N, N, T, i == 1, ref[i]) == KS_OK, "%s", ks_last_error());
    m->be->attn_decode_batch = counting_hook;
    /* the bench: plain sessions (references 0 and 2 are plain; 1 is TokenSelect's, not used here) */
    int32_t plain[2 * N];
    memcpy(plain, ids, sizeof(int32_t) * N);
    memcpy(plain + N, ids + 2 * N, sizeof(int32_t) * N);
    for (int ab = 0; ab < 2; ab++) {
        ks_bench_batch_opts o;
        ks_bench_batch_opts_default(&o);
        o.gen = T - 2;
        o.keep_ids = 1;
        o.per_session_attention = ab;
        ks_bench_batch_result r;
        g_hook_rows = g_hook_bf16_rows = 0;
        KT_CHECK(ks_bench_batch_run(m, plain, N, 2, &o, &r) == KS_OK, "%s", ks_last_error());
        long want = ab ? 0 : 2L * T * m->cfg.n_layers; /* 2 rows a layer a step; none with the switch */
        KT_CHECK(g_hook_rows == want, "A/B %d: the hook took %ld rows, want %ld", ab, g_hook_rows, want);
        /* every row of the step went through the hook: it was asked for their bf16 copy each time */
        KT_CHECK(g_hook_bf16_rows == want, "A/B %d: bf16 copies of %ld rows, want %ld", ab, g_hook_bf16_rows, want);
        for (int t = 0; t < T; t++)
            KT_CHECK(r.ids[t] == ref[0][t] && r.ids[T + t] == ref[2][t], "A/B %d step %d: %d %d batched, %d %d alone", ab,
                     t, r.ids[t], r.ids[T + t], ref[0][t], ref[2][t]);
        ks_bench_batch_result_free(&r);
        KT_CHECK(m->be->attn_decode_batch == counting_hook, "the hook is back after the row");
    }
    /* a mixed step: 0 and 2 through the hook, 1 (a decode event, pre-RoPE keys) one by one */
    ks_session *ss[B] = {0};
    ks_policy *p = NULL;
    ks_status st = KS_OK;
    for (int i = 0; i < B && !st; i++) st = ks_session_create(m, &ss[i]);
    if (!st) st = tokenselect(m, &p);
    if (!st) st = ks_session_set_policy(ss[1], p);
    for (int i = 0; i < B && !st; i++) st = ks_session_prefill(ss[i], ids + i * N, N);
    ks_sampler smp;
    ks_sampler_init(&smp, 0, 1, 0);
    char why[160] = "";
    g_hook_rows = g_hook_bf16_rows = 0;
    for (int t = 0; t < T && !st && !why[0]; t++) {
        int32_t tok[B];
        ks_status sts[B];
        for (int i = 0; i < B; i++) {
            tok[i] = ks_sample(&smp, ss[i]->logits, m->cfg.vocab);
            if (tok[i] != ref[i][t] && !why[0])
                snprintf(why, sizeof why, "session %d step %d: %d batched, %d alone", i, t, tok[i], ref[i][t]);
        }
        st = ks_sessions_decode(ss, tok, B, sts, NULL);
        for (int i = 0; i < B && !st; i++) st = sts[i];
    }
    for (int i = 0; i < B; i++) ks_session_free(ss[i]);
    ks_policy_free(p);
    m->be->attn_decode_batch = NULL;
    int layers = m->cfg.n_layers;
    ks_model_close(m);
    KT_CHECK(!st, "%s", ks_last_error());
    KT_CHECK(!why[0], "%s", why);
    KT_CHECK(g_hook_rows == 2L * T * layers, "mixed: the hook took %ld rows, want %ld (sessions 0 and 2 only)",
             g_hook_rows, 2L * T * layers);
    KT_CHECK(g_hook_bf16_rows == 0, "mixed: bf16 copies of %ld rows, want none (not every row's attention is the hook's)",
             g_hook_bf16_rows);
}

KT_TEST(bench_batch_figures_present) {
    ks_model *m;
    KT_CHECK(ks_model_open(TINY, "cpu", &m) == KS_OK, "%s", ks_last_error());
    enum { B = 4, N = 37 };
    int32_t ids[(B + 1) * N];
    prompts(ids, B + 1, N, m->cfg.vocab);
    ks_bench_batch_opts o;
    ks_bench_batch_opts_default(&o);
    o.gen = 4;
    o.warmup = 1;
    o.ttft_under_load = 1;
    o.prefill_chunk = 8;
    ks_bench_batch_result r;
    for (int host = 0; host < 2; host++) {
    o.host_argmax = host;
    KT_CHECK(ks_bench_batch_run(m, ids, N, B, &o, &r) == KS_OK, "%s", ks_last_error());
    KT_CHECK(r.batch == B && r.tokens == N && r.gen == 4, "row %d x %d tokens x %d steps", r.batch, r.tokens, r.gen);
    double sum = 0, lo = 1e30, hi = 0;
    for (int g = 0; g < r.gen; g++) {
        KT_CHECK(r.step_s[g] > 0 && isfinite(r.step_s[g]), "step %d took %g s", g, r.step_s[g]);
        sum += r.step_s[g];
        lo = fmin(lo, r.step_s[g]);
        hi = fmax(hi, r.step_s[g]);
    }
    KT_CHECK(r.step_median_s >= lo && r.step_median_s <= hi, "median %g outside [%g, %g]", r.step_median_s, lo, hi);
    KT_CHECK(fabs(r.decode_tok_s - B * r.gen / sum) <= 1e-9 * r.decode_tok_s, "tokens/s %g, B * gen / sum %g",
             r.decode_tok_s, B * r.gen / sum);
    double rows = (double)B * m->cfg.n_layers * m->cfg.n_kv_heads * (N + o.warmup + o.gen);
    double want = rows * m->cfg.head_dim * 2 * 4; /* keys and values, float32 on the CPU */
    KT_CHECK(r.kv_bytes == want, "KV bytes %.0f, want %.0f", r.kv_bytes, want);
    KT_CHECK(r.prefill_s > 0, "prefill %g s", r.prefill_s);
    if (host) KT_CHECK(r.sample_s > 0 && r.sample_s < sum, "sampling %g s of the steps' %g s", r.sample_s, sum);
    else KT_CHECK(r.sample_s == 0, "host sampling %g s with the step's own argmax", r.sample_s);
    KT_CHECK(r.ttft_rounds == (N + 7) / 8, "%d rounds for %d tokens in pieces of 8", r.ttft_rounds, N);
    KT_CHECK(r.ttft_s > 0 && r.ttft_alone_s > 0 && r.ttft_step_s > 0, "TTFT %g, alone %g, step under load %g", r.ttft_s,
             r.ttft_alone_s, r.ttft_step_s);
    KT_CHECK(r.has_memory && r.memory.peak > 0, "memory peak %zu", r.memory.peak);
    KT_CHECK(r.ids == NULL && r.n_ids == 0, "ids kept without keep_ids");
    ks_bench_batch_result_free(&r);
    }
    ks_model_close(m);
}

KT_TEST(bench_batch_refuses_bad_calls) {
    ks_model *m;
    KT_CHECK(ks_model_open(TINY, "cpu", &m) == KS_OK, "%s", ks_last_error());
    int32_t ids[2 * 16];
    prompts(ids, 2, 16, m->cfg.vocab);
    ks_bench_batch_opts o, bad;
    ks_bench_batch_opts_default(&o);
    o.gen = 2;
    ks_bench_batch_result r;
    KT_CHECK(ks_bench_batch_run(m, ids, 16, 0, &o, &r) == KS_ERR_ARG && strstr(ks_last_error(), "batch 0"), "batch 0: %s",
             ks_last_error());
    bad = o;
    bad.gen = 0;
    KT_CHECK(ks_bench_batch_run(m, ids, 16, 2, &bad, &r) == KS_ERR_ARG && strstr(ks_last_error(), "gen 0"), "gen 0: %s",
             ks_last_error());
    bad = o;
    bad.prefill_chunk = 0;
    KT_CHECK(ks_bench_batch_run(m, ids, 16, 2, &bad, &r) == KS_ERR_ARG, "chunk 0: %s", ks_last_error());
    bad = o;
    bad.gen = m->cfg.max_pos;
    KT_CHECK(ks_bench_batch_run(m, ids, 16, 2, &bad, &r) == KS_ERR_ARG && strstr(ks_last_error(), "context"),
             "over the context: %s", ks_last_error());
    ids[20] = m->cfg.vocab;
    KT_CHECK(ks_bench_batch_run(m, ids, 16, 2, &o, &r) == KS_ERR_ARG && strstr(ks_last_error(), "prompt 1 at 4"),
             "bad id: %s", ks_last_error());
    KT_CHECK(ks_bench_batch_run(NULL, ids, 16, 2, &o, &r) == KS_ERR_ARG, "NULL model");
    KT_CHECK(ks_bench_batch_run(m, NULL, 16, 2, &o, &r) == KS_ERR_ARG, "NULL prompts");
    KT_CHECK(ks_bench_batch_run(m, ids, 16, 2, &o, NULL) == KS_ERR_ARG, "NULL result");
    KT_CHECK(r.step_s == NULL && r.batch == 0, "a refused call leaves the result zeroed");
    ks_model_close(m);
}
