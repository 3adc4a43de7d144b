/* test_bench_api.c — kvsieve.h's speed measurements and model options, through the public header
 * only, on the bundled model: ks_model_tuning's switches (checked, and profile reaching the
 * sessions), ks_model_open_random, ks_model_get_info, memory counts, ceilings, a session's
 * profile switch, and ks_bench_run's runs, counters, profile and named errors. No timing is
 * asserted beyond "measured" (positive and finite). */
#include "kvsieve.h"
#include "ktest.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TINY "models/kvsieve-tiny"

static int have_tiny(void) {
    FILE *f = fopen(TINY "/model.safetensors", "rb");
    if (f) fclose(f);
    return f != NULL;
}

KT_TEST(model_tuning_switches_are_checked) {
    ks_model_tuning t;
    ks_model_tuning_default(&t);
    KT_CHECK(t.decode_kernels == KS_DEFAULT && t.fused == KS_DEFAULT && t.mlp == KS_DEFAULT && t.graphs == KS_DEFAULT &&
                 t.pdl == KS_DEFAULT && t.prefill_attn_mma == KS_DEFAULT && !t.decode_splits && !t.profile && !t.verbose,
             "the defaults are all zero");
    ks_model_tuning_default(NULL);
    ks_model *m = (ks_model *)&t; /* must be cleared on failure */
    t.fused = 2;
    KT_CHECK(ks_model_open_tuned(TINY, NULL, &t, &m) == KS_ERR_ARG && !m && strstr(ks_last_error(), "fused must be"), "%s",
             ks_last_error());
    ks_model_tuning_default(&t);
    t.prefill_attn_mma = -2;
    KT_CHECK(ks_model_open_tuned(TINY, NULL, &t, &m) == KS_ERR_ARG && strstr(ks_last_error(), "prefill_attn_mma"), "%s",
             ks_last_error());
    ks_model_tuning_default(&t);
    t.decode_splits = -1;
    KT_CHECK(ks_model_open_tuned(TINY, NULL, &t, &m) == KS_ERR_ARG && strstr(ks_last_error(), "decode_splits"), "%s",
             ks_last_error());
    ks_model_tuning_default(&t);
    t.profile = 3;
    KT_CHECK(ks_model_open_tuned(TINY, NULL, &t, &m) == KS_ERR_ARG && strstr(ks_last_error(), "profile must be"), "%s",
             ks_last_error());
    ks_model_tuning_default(&t);
    t.verbose = 2;
    KT_CHECK(ks_model_open_random(TINY, NULL, &t, 1, &m) == KS_ERR_ARG && strstr(ks_last_error(), "verbose must be"), "%s",
             ks_last_error());
    ks_model_opts o;
    ks_model_opts_default(&o);
    o.threads = -1;
    KT_CHECK(ks_model_open_tuned(TINY, &o, NULL, &m) == KS_ERR_ARG && strstr(ks_last_error(), "threads must be"), "%s",
             ks_last_error());
    KT_CHECK(ks_model_open_tuned(NULL, NULL, NULL, &m) == KS_ERR_ARG && strstr(ks_last_error(), "no model folder"), "%s",
             ks_last_error());
    KT_CHECK(ks_model_open_random(NULL, NULL, NULL, 1, &m) == KS_ERR_ARG && strstr(ks_last_error(), "no model config"), "%s",
             ks_last_error());
    KT_CHECK(ks_model_open_random(TINY, NULL, NULL, 1, NULL) == KS_ERR_ARG, "NULL output");
    KT_CHECK(ks_model_open_random("/nonexistent/config.json", NULL, NULL, 1, &m) != KS_OK && !m, "a missing config");
    if (!have_tiny()) KT_SKIP(TINY " absent");
    /* every CUDA switch set: the CPU backend takes and ignores them */
    ks_model_tuning_default(&t);
    t.decode_kernels = t.fused = t.mlp = t.graphs = KS_OFF;
    t.pdl = t.prefill_attn_mma = KS_ON;
    t.decode_splits = 4;
    t.profile = 1;
    t.verbose = 1;
    KT_CHECK(ks_model_open_tuned(TINY, NULL, &t, &m) == KS_OK, "%s", ks_last_error());
    ks_session *s;
    KT_CHECK(ks_session_create(m, &s) == KS_OK, "%s", ks_last_error());
    KT_CHECK(ks_session_profiling(s) == 1, "profile = 1 reaches the session");
    ks_session_set_profile(s, 0);
    KT_CHECK(ks_session_profiling(s) == 0 && ks_session_profiling(NULL) == 0, "switched off");
    ks_session_free(s);
    ks_model_close(m);
    /* without tuning, sessions start without a profile */
    KT_CHECK(ks_model_open_tuned(TINY, NULL, NULL, &m) == KS_OK && ks_session_create(m, &s) == KS_OK, "%s", ks_last_error());
    KT_CHECK(ks_session_profiling(s) == 0, "no profile by default");
    ks_session_free(s);
    ks_model_close(m);
}

KT_TEST(model_info_memory_ceilings) {
    ks_model_info info;
    ks_model_memory mem;
    double g, c;
    KT_CHECK(ks_model_get_info(NULL, &info) == KS_ERR_ARG && ks_model_memory_stats(NULL, 0, &mem) == KS_ERR_ARG &&
                 ks_model_ceilings(NULL, &g, &c) == KS_ERR_ARG,
             "NULL model");
    if (!have_tiny()) KT_SKIP(TINY " absent");
    ks_model *m;
    KT_CHECK(ks_model_open(TINY, "cpu", &m) == KS_OK, "%s", ks_last_error());
    KT_CHECK(ks_model_get_info(m, NULL) == KS_ERR_ARG, "NULL info");
    KT_CHECK(ks_model_get_info(m, &info) == KS_OK, "%s", ks_last_error());
    /* models/kvsieve-tiny/config.json */
    KT_CHECK(!strcmp(info.arch, "llama") && !strcmp(info.backend, "cpu") && info.n_layers == 8 && info.dim == 512 &&
                 info.n_kv_heads == ks_model_n_kv_heads(m) && info.vocab == ks_model_vocab(m) &&
                 info.max_context == ks_model_max_context(m) && info.head_dim * info.n_heads >= info.dim / 2 &&
                 info.elem_bytes == 4 && info.n_params == 19931648,
             "info: %s %s %d layers dim %d, %zu params", info.arch, info.backend, info.n_layers, info.dim, info.n_params);
    KT_CHECK(ks_model_memory_stats(m, 1, &mem) == KS_OK && mem.cur > 0 && mem.peak >= mem.cur && !mem.pool_reserved_high,
             "memory: %zu now, %zu peak", mem.cur, mem.peak);
    KT_CHECK(ks_model_memory_stats(m, 0, NULL) == KS_ERR_ARG, "NULL memory");
    KT_CHECK(ks_model_ceilings(m, &g, &c) == KS_ERR_UNSUPPORTED && g == 0 && c == 0, "the CPU backend measures none");
    KT_CHECK(ks_model_ceilings(m, NULL, &c) == KS_ERR_ARG, "NULL rate");
    ks_model_close(m);

    /* random weights in the same shape: the same info, no tokenizer */
    KT_CHECK(ks_model_open_random(TINY "/config.json", NULL, NULL, 7, &m) == KS_OK, "%s", ks_last_error());
    ks_model_info ri;
    KT_CHECK(ks_model_get_info(m, &ri) == KS_OK && ri.n_layers == info.n_layers && ri.dim == info.dim &&
                 ri.n_params == info.n_params && ri.vocab == info.vocab,
             "random model's shape");
    int32_t *ids = NULL;
    int n = 0;
    KT_CHECK(ks_tokenize(m, "hi", 1, &ids, &n) != KS_OK && !ids, "no tokenizer");
    ks_model_close(m);
}

KT_TEST(bench_run_rows) {
    if (!have_tiny()) KT_SKIP(TINY " absent");
    ks_model *m;
    KT_CHECK(ks_model_open(TINY, "cpu", &m) == KS_OK, "%s", ks_last_error());
    ks_session *s;
    KT_CHECK(ks_session_create(m, &s) == KS_OK, "%s", ks_last_error());
    int32_t ids[48];
    for (int i = 0; i < 48; i++) ids[i] = (int32_t)(1 + i * 37 % (ks_model_vocab(m) - 1));
    ks_bench_opts o;
    ks_bench_opts_default(&o);
    KT_CHECK(o.gen == 16 && o.repeat == 3 && !o.gemm_ceiling, "defaults");
    ks_bench_result r;
    /* named errors, and a result that holds nothing to free */
    KT_CHECK(ks_bench_run(s, ids, 48, &o, NULL, NULL) == KS_ERR_ARG, "NULL result");
    KT_CHECK(ks_bench_run(NULL, ids, 48, &o, NULL, &r) == KS_ERR_ARG && !r.prefill_s, "NULL session");
    KT_CHECK(ks_bench_run(s, NULL, 48, &o, NULL, &r) == KS_ERR_ARG, "NULL prompt");
    KT_CHECK(ks_bench_run(s, ids, 0, &o, NULL, &r) == KS_ERR_ARG, "no tokens");
    o.repeat = 0;
    KT_CHECK(ks_bench_run(s, ids, 48, &o, NULL, &r) == KS_ERR_ARG && strstr(ks_last_error(), "repeat 0"), "%s", ks_last_error());
    o.repeat = 2;
    o.gen = ks_model_max_context(m);
    KT_CHECK(ks_bench_run(s, ids, 48, &o, NULL, &r) == KS_ERR_ARG && strstr(ks_last_error(), "exceeds the model's context"),
             "%s", ks_last_error());
    o.gen = 3;
    ids[5] = ks_model_vocab(m);
    KT_CHECK(ks_bench_run(s, ids, 48, &o, NULL, &r) == KS_ERR_ARG && strstr(ks_last_error(), "outside the vocabulary"), "%s",
             ks_last_error());
    ids[5] = 5;
    ks_bench_result_free(NULL);

    /* a row without a profile: two runs, the matmul counters, the GEMM ceiling */
    o.gemm_ceiling = 1;
    KT_CHECK(ks_bench_run(s, ids, 48, &o, "x", &r) == KS_OK, "%s", ks_last_error());
    KT_CHECK(r.runs == 2 && r.prefill_s[0] > 0 && r.prefill_s[1] > 0 && r.decode_s[0] > 0 && r.decode_s[1] > 0, "two runs");
    KT_CHECK(r.best_prefill_s == fmin(r.prefill_s[0], r.prefill_s[1]) && r.best_decode_s == fmin(r.decode_s[0], r.decode_s[1]),
             "best of the runs");
    int n_kv = ks_model_n_layers(m) * ks_model_n_kv_heads(m);
    KT_CHECK(r.kv_rows == (size_t)n_kv * (48 + 3), "KV rows %zu, want %d per head", r.kv_rows, 48 + 3);
    KT_CHECK(isfinite(r.linear_gflops) && r.linear_gflops > 0 && r.prefill_flop > 0, "the CPU's matmul counters: %g",
             r.linear_gflops);
    KT_CHECK(isfinite(r.gemm_gflops) && r.gemm_gflops > 0, "the GEMM ceiling: %g", r.gemm_gflops);
    KT_CHECK(r.has_memory && r.memory.peak >= r.memory.peak_fixed && r.memory.peak_fixed > 0, "the memory peak");
    KT_CHECK(!r.profiled && !r.profile_text && !ks_session_profiling(s), "no profile");
    ks_bench_result_free(&r);
    KT_CHECK(!r.prefill_s && !r.runs, "freed and zeroed");

    /* with the session's profile on: the phases, the table, and the counters reset after the row */
    ks_session_set_profile(s, 1);
    o.gemm_ceiling = 0;
    KT_CHECK(ks_bench_run(s, ids, 48, &o, "tiny, 48 tokens", &r) == KS_OK, "%s", ks_last_error());
    KT_CHECK(r.profiled && r.prefill_forwards == 2 && r.decode_steps == 6, "profiled %ld prefills, %ld decode steps",
             r.prefill_forwards, r.decode_steps);
    KT_CHECK(r.prefill_linear_s > 0 && r.prefill_attention_s > 0 && r.decode_linear_s > 0, "the phases");
    KT_CHECK(r.profile_text && strstr(r.profile_text, "profile: tiny, 48 tokens") && strstr(r.profile_text, "attention"),
             "table: %s", r.profile_text ? r.profile_text : "(none)");
    KT_CHECK(isnan(r.gemm_gflops), "no ceiling asked");
    ks_bench_result_free(&r);
    ks_session_free(s);
    ks_model_close(m);
}
