/* test_cli.c — the kvsieve binary as a user runs it: exit codes and one-line messages on bad
 * input, the timing line, sampling flags. Needs KS_BIN (set by `make test`). */
#include "chat.h"
#include "engine.h"
#include "ktest.h"
#include "testutil.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

KT_TEST(cli_bad_inputs_exit_nonzero_with_message) {
    if (!kt_bin()) KT_SKIP("KS_BIN not set (run through make test)");
    char dir[256], cmd[1024], out[8192];
    KT_CHECK(kt_tmpdir(dir, sizeof dir) == 0, "tmpdir");
    struct { const char *setup, *args, *want; } cases[] = {
        {NULL, "generate -m /nonexistent/model -p hi", "does not exist"},
        {"{\"model_type\": \"llama\",", "generate -m %s -p hi", "line"},
        {"{\"model_type\": \"bloom\", \"hidden_size\": 8}", "generate -m %s -p hi", "unknown architecture"},
        {NULL, "generate -p hi", "-m DIR is required"},
        {NULL, "frobnicate", "unknown command"},
        {NULL, "generate -m %s -p 1,2 --ids -n -3", "-n expects an integer in 0..2147483647"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        if (cases[i].setup) kt_write_file(dir, "config.json", cases[i].setup);
        char args[512];
        snprintf(args, sizeof args, cases[i].args, dir);
        snprintf(cmd, sizeof cmd, "%s %s", kt_bin(), args);
        int rc = kt_sh(cmd, out, sizeof out);
        KT_CHECK(rc != 0 && rc < 128, "case %zu: exit %d (crash or success): %s", i, rc, out);
        KT_CHECK(strstr(out, cases[i].want), "case %zu: message lacks \"%s\": %s", i, cases[i].want, out);
    }
    /* a tiny valid model (no tokenizer): shape errors, context overflow, good run */
    kt_tiny_cfg cfg = kt_tiny_default();
    cfg.max_pos = 8;
    kt_write_tiny_model(dir, &cfg);
    snprintf(cmd, sizeof cmd, "%s generate -m %s --ids -p 1,2,3,4,5,6,7,8,9 -n 2", kt_bin(), dir);
    int rc = kt_sh(cmd, out, sizeof out);
    KT_CHECK(rc == 1 && strstr(out, "context"), "context overflow: exit %d: %s", rc, out);
    snprintf(cmd, sizeof cmd, "%s generate -m %s --ids -p 1,2,3 -n 3", kt_bin(), dir);
    rc = kt_sh(cmd, out, sizeof out);
    KT_CHECK(rc == 0 && strstr(out, "prompt 3 tokens") && strstr(out, "peak memory"), "good run: exit %d: %s", rc, out);
    cfg.bad_shape = 1;
    kt_write_tiny_model(dir, &cfg);
    rc = kt_sh(cmd, out, sizeof out);
    KT_CHECK(rc == 1 && strstr(out, "shape"), "bad shape: exit %d: %s", rc, out);
    cfg.bad_shape = 0;
    kt_write_tiny_model(dir, &cfg);
    kt_truncate(dir, "model.safetensors", 300);
    rc = kt_sh(cmd, out, sizeof out);
    KT_CHECK(rc == 1 && strstr(out, "kvsieve:"), "truncated: exit %d: %s", rc, out);
    kt_rmdir(dir);
}

KT_TEST(cli_stories_generate_and_sampling) {
    if (!kt_bin()) KT_SKIP("KS_BIN not set (run through make test)");
    char cmd[1024], out[8192], out2[8192];
    snprintf(cmd, sizeof cmd, "%s/models/stories260K", kt_shared_dir());
    FILE *f = fopen(cmd, "r");
    if (!f) KT_SKIP("../shared/models/stories260K absent");
    fclose(f);
    snprintf(cmd, sizeof cmd, "%s generate -m %s/models/stories260K -p 'Once upon a time' -n 24", kt_bin(), kt_shared_dir());
    KT_CHECK(kt_sh(cmd, out, sizeof out) == 0, "%s", out);
    KT_CHECK(strstr(out, "there was a little girl named Lily"), "greedy text: %s", out);
    /* seeded sampling is reproducible, and differs from greedy */
    snprintf(cmd, sizeof cmd, "%s generate -m %s/models/stories260K -p 'Once upon a time' -n 24 --temp 1 --top-p 0.9 --seed 5 -q",
             kt_bin(), kt_shared_dir());
    KT_CHECK(kt_sh(cmd, out, sizeof out) == 0, "%s", out);
    KT_CHECK(kt_sh(cmd, out2, sizeof out2) == 0, "%s", out2);
    /* -q prints no text, only the timing line, so compare ids via tokenize-free path: rerun with text */
    snprintf(cmd, sizeof cmd, "%s generate -m %s/models/stories260K -p 'Once upon a time' -n 24 --temp 1 --seed 5",
             kt_bin(), kt_shared_dir());
    KT_CHECK(kt_sh(cmd, out, sizeof out) == 0, "%s", out);
    KT_CHECK(kt_sh(cmd, out2, sizeof out2) == 0, "%s", out2);
    char *t1 = strstr(out, "[kvsieve]"), *t2 = strstr(out2, "[kvsieve]");
    if (t1) *t1 = 0;
    if (t2) *t2 = 0;
    KT_CHECK(strcmp(out, out2) == 0, "same seed, different text:\n%s\n%s", out, out2);
    snprintf(cmd, sizeof cmd, "%s generate -m %s/models/stories260K -p 'Once upon a time' -n 24 --temp 1 --seed 6",
             kt_bin(), kt_shared_dir());
    KT_CHECK(kt_sh(cmd, out2, sizeof out2) == 0, "%s", out2);
    t2 = strstr(out2, "[kvsieve]");
    if (t2) *t2 = 0;
    KT_CHECK(strcmp(out, out2) != 0, "different seeds gave the same text: %s", out);
}

KT_TEST(chat_templates) {
    ks_chat_msg msgs[] = {{"system", "Be brief."}, {"user", "Hi"}};
    char *s;
    KT_CHECK(ks_chat_format("llama3", msgs, 2, &s) == KS_OK, "%s", ks_last_error());
    KT_CHECK(!strcmp(s, "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
                        "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
                        "<|start_header_id|>assistant<|end_header_id|>\n\n"), "llama3: %s", s);
    free(s);
    KT_CHECK(ks_chat_format("chatml", msgs, 2, &s) == KS_OK, "%s", ks_last_error());
    KT_CHECK(!strcmp(s, "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"),
             "chatml: %s", s);
    free(s);
    KT_CHECK(ks_chat_format("jinja", msgs, 2, &s) == KS_ERR_ARG, "unknown format accepted");
}

KT_TEST(sampler_properties) {
    float logits[5] = {1.0f, 3.0f, 2.9f, -1.0f, 0.5f};
    ks_sampler g;
    ks_sampler_init(&g, 0, 1, 0);
    KT_CHECK(ks_sample(&g, logits, 5) == 1, "greedy picks the max");
    /* top-p small: only the best token */
    ks_sampler t;
    ks_sampler_init(&t, 1.0f, 0.01f, 3);
    for (int i = 0; i < 50; i++) KT_CHECK(ks_sample(&t, logits, 5) == 1, "top-p 0.01 must keep only the best");
    /* top-p 1 at high temperature visits several tokens, deterministically per seed */
    int seen[5] = {0}, a[40], b[40];
    ks_sampler_init(&t, 5.0f, 1.0f, 9);
    for (int i = 0; i < 40; i++) { a[i] = ks_sample(&t, logits, 5); seen[a[i]] = 1; }
    ks_sampler_init(&t, 5.0f, 1.0f, 9);
    for (int i = 0; i < 40; i++) b[i] = ks_sample(&t, logits, 5);
    KT_CHECK(!memcmp(a, b, sizeof a), "same seed, different draws");
    KT_CHECK(seen[0] + seen[1] + seen[2] + seen[3] + seen[4] >= 4, "high temperature should reach most tokens");
}

/* greedy = the scalar rule `if (l[i] > l[best]) best = i` (first maximum, NaNs skipped unless at 0)
 * on vocabularies of every length mod 8, with ties, infinities and NaNs */
KT_TEST(sampler_greedy_matches_scalar_rule) {
    static float l[1031];
    uint64_t r = 12345;
    ks_sampler g;
    ks_sampler_init(&g, 0, 1, 0);
    for (int trial = 0; trial < 400; trial++) {
        int n = 1 + trial % 1031;
        for (int i = 0; i < n; i++) {
            r = r * 6364136223846793005ull + 1442695040888963407ull;
            int u = (int)(r >> 33) % 1000;
            l[i] = (float)(u % 37) - 18.0f; /* many ties */
            if (trial % 5 == 1 && u < 30) l[i] = NAN;
            if (trial % 7 == 2 && u < 5) l[i] = INFINITY;
            if (trial % 11 == 3) l[i] = -INFINITY;
        }
        if (trial % 13 == 4) l[0] = NAN;
        int32_t want = 0;
        for (int i = 1; i < n; i++)
            if (l[i] > l[want]) want = i;
        int32_t got = ks_sample(&g, l, n);
        KT_CHECK(got == want, "n %d trial %d: greedy %d, scalar rule %d", n, trial, got, want);
    }
}

KT_TEST(example_host_embeds_the_library) {
    const char *host = getenv("KS_HOST");
    if (!host || !*host) KT_SKIP("KS_HOST not set (run through make test)");
    char cmd[1024], out[16384];
    snprintf(cmd, sizeof cmd, "%s/models/stories260K", kt_shared_dir());
    FILE *f = fopen(cmd, "r");
    if (!f) KT_SKIP("../shared/models/stories260K absent");
    fclose(f);
    snprintf(cmd, sizeof cmd,
             "%s %s/models/stories260K 'Once upon a time there was a little girl named Lily. She loved to play "
             "outside in the park with her friends.'", host, kt_shared_dir());
    int rc = kt_sh(cmd, out, sizeof out);
    KT_CHECK(rc == 0, "exit %d: %s", rc, out);
    KT_CHECK(strstr(out, "policy host_sinks"), "no policy line: %s", out);
    /* 4 sinks + 12 recent rows kept after prefill, plus one row per decode step after it */
    KT_CHECK(strstr(out, "layer 0, KV head 0: 47 rows resident (positions 0 .. 65)"), "kept rows: %s", out);
    KT_CHECK(strstr(out, "report kept = 16"), "report: %s", out);
    snprintf(cmd, sizeof cmd, "%s %s/models/stories260K hi no_such_policy", host, kt_shared_dir());
    rc = kt_sh(cmd, out, sizeof out);
    KT_CHECK(rc == 1 && strstr(out, "no_such_policy"), "bad policy: exit %d: %s", rc, out);
}
