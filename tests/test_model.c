/* test_model.c — end to end on real weights (stories260K golden story) and the bad-input
 * paths of model loading: each gives its named error and a non-zero status, never a crash. */
#include "engine.h"
#include "ktest.h"
#include "testutil.h"

#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const int32_t golden_ids[] = {1, 403, 407, 261, 378, 432, 383, 286, 261, 376, 298, 315, 421, 395, 317, 426, 338, 401, 396, 267};
static const char *golden_text =
    "Once upon a time, there was a little girl named Lily. She loved to play outside in the park. One day, she saw a big, "
    "red ball. She wanted to play with it, but it was too high.";

static int stories_dir(char *out, size_t n) {
    snprintf(out, n, "%s/models/stories260K", kt_shared_dir());
    struct stat s;
    return stat(out, &s) == 0;
}

KT_TEST(stories260k_greedy_golden) {
    char dir[512];
    if (!stories_dir(dir, sizeof dir)) KT_SKIP("%s absent (KS_SHARED, default ../shared)", dir);
    ks_model *m;
    KT_CHECK(ks_model_open(dir, "cpu", &m) == KS_OK, "%s", ks_last_error());
    ks_session *s;
    KT_CHECK(ks_session_create(m, &s) == KS_OK, "%s", ks_last_error());
    ks_generate_opts o;
    ks_generate_opts_default(&o);
    o.max_new_tokens = 64;
    int32_t bos = 1;
    ks_status st = ks_generate_ids(s, &bos, 1, &o, NULL, NULL);
    KT_CHECK(st == KS_OK, "%s", ks_last_error());
    int n;
    const int32_t *ids = ks_result_ids(s, &n);
    /* golden ids list includes the BOS prompt id first */
    KT_CHECK(n >= 19, "only %d tokens generated", n);
    for (int i = 0; i < 19; i++) KT_CHECK(ids[i] == golden_ids[i + 1], "token %d: got %d want %d", i, ids[i], golden_ids[i + 1]);
    const char *text = ks_result_text(s);
    KT_CHECK(strncmp(text, golden_text, strlen(golden_text)) == 0, "text differs:\n got: %s\nwant: %s", text, golden_text);
    ks_session_free(s);
    ks_model_close(m);
}

KT_TEST(stories260k_prompt_then_decode_matches_full_prefill) {
    /* logits after prefill(a) + decode(b) == logits after prefill(a b): the KV cache is right */
    char dir[512];
    if (!stories_dir(dir, sizeof dir)) KT_SKIP("%s absent", dir);
    ks_model *m;
    KT_CHECK(ks_model_open(dir, "cpu", &m) == KS_OK, "%s", ks_last_error());
    ks_session *s;
    KT_CHECK(ks_session_create(m, &s) == KS_OK, "%s", ks_last_error());
    int32_t ids[] = {1, 403, 407, 261, 378, 432, 383, 286, 261, 376};
    KT_CHECK(ks_session_prefill(s, ids, 10) == KS_OK, "%s", ks_last_error());
    float *full = malloc(sizeof(float) * 512);
    memcpy(full, s->logits, sizeof(float) * 512);
    ks_session_reset(s);
    KT_CHECK(ks_session_prefill(s, ids, 6) == KS_OK, "%s", ks_last_error());
    for (int i = 6; i < 10; i++) KT_CHECK(ks_session_decode(s, ids[i]) == KS_OK, "%s", ks_last_error());
    double md = 0;
    for (int i = 0; i < 512; i++) md = fmax(md, fabs(full[i] - s->logits[i]));
    free(full);
    KT_CHECK(md < 1e-4, "max |diff| %g", md);
    ks_session_free(s);
    ks_model_close(m);
}

KT_TEST(model_missing_folder) {
    ks_model *m;
    ks_status st = ks_model_open("no/such/model", "cpu", &m);
    KT_CHECK(st == KS_ERR_IO, "status %d", st);
    KT_CHECK(strstr(ks_last_error(), "no/such/model"), "message: %s", ks_last_error());
}

KT_TEST(model_bad_inputs) {
    char dir[256];
    KT_CHECK(kt_tmpdir(dir, sizeof dir) == 0, "mkdtemp");
    ks_model *m;
    /* no config.json */
    KT_CHECK(ks_model_open(dir, "cpu", &m) == KS_ERR_IO, "%s", ks_last_error());
    KT_CHECK(strstr(ks_last_error(), "config.json"), "%s", ks_last_error());
    /* malformed JSON */
    kt_write_file(dir, "config.json", "{\"model_type\": \"llama\", \"hidden_size\": 16,,}");
    KT_CHECK(ks_model_open(dir, "cpu", &m) == KS_ERR_FORMAT, "%s", ks_last_error());
    KT_CHECK(strstr(ks_last_error(), "line"), "%s", ks_last_error());
    /* unknown architecture */
    kt_write_file(dir, "config.json", "{\"model_type\": \"gpt_neox\", \"hidden_size\": 16}");
    KT_CHECK(ks_model_open(dir, "cpu", &m) == KS_ERR_UNSUPPORTED, "%s", ks_last_error());
    KT_CHECK(strstr(ks_last_error(), "gpt_neox"), "%s", ks_last_error());
    /* a valid tiny model, then corruptions of it */
    kt_tiny_cfg cfg = kt_tiny_default();
    KT_CHECK(kt_write_tiny_model(dir, &cfg) == 0, "writing tiny model");
    KT_CHECK(ks_model_open(dir, "cpu", &m) == KS_OK, "%s", ks_last_error());
    ks_model_close(m);
    /* shape disagreeing with config.json */
    cfg.bad_shape = 1;
    KT_CHECK(kt_write_tiny_model(dir, &cfg) == 0, "writing");
    KT_CHECK(ks_model_open(dir, "cpu", &m) == KS_ERR_SHAPE, "%s", ks_last_error());
    KT_CHECK(strstr(ks_last_error(), "config.json implies"), "%s", ks_last_error());
    cfg.bad_shape = 0;
    /* integer dtype for a weight */
    cfg.bad_dtype = 1;
    KT_CHECK(kt_write_tiny_model(dir, &cfg) == 0, "writing");
    KT_CHECK(ks_model_open(dir, "cpu", &m) == KS_ERR_DTYPE, "%s", ks_last_error());
    cfg.bad_dtype = 0;
    /* a missing tensor */
    cfg.drop_tensor = 1;
    KT_CHECK(kt_write_tiny_model(dir, &cfg) == 0, "writing");
    KT_CHECK(ks_model_open(dir, "cpu", &m) == KS_ERR_FORMAT, "%s", ks_last_error());
    KT_CHECK(strstr(ks_last_error(), "missing"), "%s", ks_last_error());
    cfg.drop_tensor = 0;
    /* truncated safetensors */
    KT_CHECK(kt_write_tiny_model(dir, &cfg) == 0, "writing");
    KT_CHECK(kt_truncate(dir, "model.safetensors", 100) == 0, "truncate");
    KT_CHECK(ks_model_open(dir, "cpu", &m) == KS_ERR_FORMAT, "%s", ks_last_error());
    /* header length larger than the file */
    KT_CHECK(kt_write_tiny_model(dir, &cfg) == 0, "writing");
    KT_CHECK(kt_poke_u64(dir, "model.safetensors", 0, 1ull << 40) == 0, "poke");
    KT_CHECK(ks_model_open(dir, "cpu", &m) == KS_ERR_FORMAT, "%s", ks_last_error());
    KT_CHECK(strstr(ks_last_error(), "header"), "%s", ks_last_error());
    kt_rmdir(dir);
}

KT_TEST(prompt_longer_than_context) {
    char dir[256];
    KT_CHECK(kt_tmpdir(dir, sizeof dir) == 0, "mkdtemp");
    kt_tiny_cfg cfg = kt_tiny_default();
    KT_CHECK(kt_write_tiny_model(dir, &cfg) == 0, "writing tiny model");
    ks_model *m;
    KT_CHECK(ks_model_open(dir, "cpu", &m) == KS_OK, "%s", ks_last_error());
    ks_session *s;
    KT_CHECK(ks_session_create(m, &s) == KS_OK, "%s", ks_last_error());
    int n = ks_model_max_context(m) + 1;
    int32_t *ids = calloc(n, sizeof *ids);
    for (int i = 0; i < n; i++) ids[i] = i % ks_model_vocab(m);
    ks_status st = ks_generate_ids(s, ids, n, NULL, NULL, NULL);
    free(ids);
    KT_CHECK(st == KS_ERR_CONTEXT, "status %d: %s", st, ks_last_error());
    KT_CHECK(strstr(ks_last_error(), "context"), "%s", ks_last_error());
    int32_t bad = 100000;
    st = ks_generate_ids(s, &bad, 1, NULL, NULL, NULL);
    KT_CHECK(st == KS_ERR_ARG, "status %d: %s", st, ks_last_error());
    ks_session_free(s);
    ks_model_close(m);
    kt_rmdir(dir);
}

/* ---------------------------------------------------------------- issue 12: sizes and files */

/* The tiny model's config.json with eos_token_id 2 replaced by an id outside its vocabulary:
 * greedy decoding then never stops early, and a run goes on to the end of the context. */
static int drop_eos(const char *dir) {
    char path[512], *text;
    size_t len;
    snprintf(path, sizeof path, "%s/config.json", dir);
    if (ks_read_file(path, &text, &len)) return -1;
    char *e = strstr(text, "\"eos_token_id\": 2}");
    int rc = -1;
    if (e) {
        *e = 0;
        char out[2048];
        snprintf(out, sizeof out, "%s\"eos_token_id\": 1000000}", text);
        rc = kt_write_file(dir, "config.json", out);
    }
    free(text);
    return rc;
}

/* A directory where a file is expected: fopen succeeds on Linux and ftell said LLONG_MAX, so
 * the reader asked for 9.2e18 bytes. Now: one named error. */
KT_TEST(read_file_of_a_directory_says_is_a_directory) {
    char dir[256];
    KT_CHECK(kt_tmpdir(dir, sizeof dir) == 0, "tmpdir");
    char *data = (char *)1;
    size_t len = 7;
    ks_status st = ks_read_file(dir, &data, &len);
    char msg[512];
    snprintf(msg, sizeof msg, "%s", ks_last_error());
    kt_rmdir(dir);
    KT_CHECK(st == KS_ERR_IO && !data && len == 0, "status %d", st);
    KT_CHECK(strstr(msg, "is a directory"), "message: %s", msg);
}

/* Dimensions that are positive integers but overflow the engine's int products (heads x
 * head_dim) or describe no real model are refused by name while parsing config.json. */
KT_TEST(config_dimensions_out_of_range_are_refused_by_name) {
    static const struct { const char *json, *want; } cases[] = {
        {"{\"model_type\": \"llama\", \"hidden_size\": 1073741824, \"num_hidden_layers\": 1, \"num_attention_heads\": 1, "
         "\"intermediate_size\": 8, \"vocab_size\": 8, \"head_dim\": 8}", "hidden_size 1073741824 is out of range"},
        {"{\"model_type\": \"llama\", \"hidden_size\": 64, \"num_hidden_layers\": 1, \"num_attention_heads\": 65536, "
         "\"intermediate_size\": 8, \"vocab_size\": 8, \"head_dim\": 1024}", "num_attention_heads x head_dim 67108864 is out of range"},
        {"{\"model_type\": \"llama\", \"hidden_size\": 64, \"num_hidden_layers\": 1, \"num_attention_heads\": 8, "
         "\"intermediate_size\": 8, \"vocab_size\": 134217728}", "vocab_size 134217728 is out of range"},
        {"{\"model_type\": \"llama\", \"hidden_size\": 64, \"num_hidden_layers\": 1, \"num_attention_heads\": 8, "
         "\"intermediate_size\": 8, \"vocab_size\": 8, \"max_position_embeddings\": 4294967297}", "bad max_position_embeddings"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        ks_config c;
        ks_status st = ks_config_parse(cases[i].json, strlen(cases[i].json), "config.json", &c);
        if (!st) ks_config_free(&c);
        KT_CHECK(st == KS_ERR_FORMAT, "case %zu: status %d", i, st);
        KT_CHECK(strstr(ks_last_error(), cases[i].want), "case %zu: message: %s", i, ks_last_error());
    }
}

/* bench --random-weights with dimensions no machine holds: refused with a named error before
 * the first allocation (the allocator aborted under ASan, or the OOM killer struck) */
KT_TEST(model_random_beyond_memory_is_refused_before_allocating) {
    char dir[256], path[300];
    KT_CHECK(kt_tmpdir(dir, sizeof dir) == 0, "tmpdir");
    kt_write_file(dir, "big.json",
                  "{\"model_type\": \"llama\", \"hidden_size\": 1048576, \"num_hidden_layers\": 65536, "
                  "\"num_attention_heads\": 16384, \"intermediate_size\": 1048576, \"vocab_size\": 67108864}");
    snprintf(path, sizeof path, "%s/big.json", dir);
    ks_backend *be;
    KT_CHECK(ks_backend_create("cpu", &be) == KS_OK, "%s", ks_last_error());
    ks_model *m = NULL;
    size_t rss0 = ks_peak_rss();
    ks_status st = ks_model_random(path, be, 1, &m);
    size_t rss1 = ks_peak_rss();
    if (m) ks_model_free(m);
    ks_backend_free(be);
    kt_rmdir(dir);
    KT_CHECK(st == KS_ERR_OOM && !m, "status %d", st);
    KT_CHECK(strstr(ks_last_error(), "random weights need") && strstr(ks_last_error(), "GiB of memory"), "message: %s",
             ks_last_error());
    KT_CHECK(rss1 - rss0 < (64u << 20), "peak RSS grew by %zu MiB before the refusal", (rss1 - rss0) >> 20);
}

/* max_new_tokens = INT_MAX asks for "until EOS or the end of the context": the id buffer of
 * max_new + 1 entries overflowed int; now it grows, and the request ends at the context */
KT_TEST(generate_int_max_tokens_ends_at_the_context_without_overflow) {
    char dir[256];
    KT_CHECK(kt_tmpdir(dir, sizeof dir) == 0, "tmpdir");
    kt_tiny_cfg c = kt_tiny_default();
    c.max_pos = 300; /* more than the buffer's first 256 ids: it must grow once */
    KT_CHECK(kt_write_tiny_model(dir, &c) == 0 && drop_eos(dir) == 0, "tiny model");
    ks_model *m;
    KT_CHECK(ks_model_open(dir, "cpu", &m) == KS_OK, "%s", ks_last_error());
    ks_session *s;
    KT_CHECK(ks_session_create(m, &s) == KS_OK, "%s", ks_last_error());
    ks_generate_opts o;
    ks_generate_opts_default(&o);
    o.max_new_tokens = 2147483647;
    int32_t prompt[] = {1, 2, 3};
    ks_status st = ks_generate_ids(s, prompt, 3, &o, NULL, NULL);
    int n;
    ks_result_ids(s, &n);
    ks_session_free(s);
    ks_model_close(m);
    kt_rmdir(dir);
    /* no EOS: prompt 3 + 297 decoded rows fill the context; the 298th
     * sampled token finds no room */
    KT_CHECK(st == KS_ERR_CONTEXT, "status %d: %s", st, ks_last_error());
    KT_CHECK(n == 298, "%d ids generated, want 298", n);
}

/* the public generate names a bad option instead of reinterpreting it (the CLI's strict
 * parsing has a twin here for hosts and Lua) */
KT_TEST(generate_api_refuses_bad_sampling_options) {
    char dir[256];
    KT_CHECK(kt_tmpdir(dir, sizeof dir) == 0, "tmpdir");
    kt_tiny_cfg c = kt_tiny_default();
    KT_CHECK(kt_write_tiny_model(dir, &c) == 0, "tiny model");
    ks_model *m;
    KT_CHECK(ks_model_open(dir, "cpu", &m) == KS_OK, "%s", ks_last_error());
    ks_session *s;
    KT_CHECK(ks_session_create(m, &s) == KS_OK, "%s", ks_last_error());
    static const struct { int n; float temp, top_p; const char *want; } cases[] = {
        {-1, 0, 1, "max_new_tokens must be >= 0"},  {4, NAN, 1, "temperature must be"}, {4, -1, 1, "temperature must be"},
        {4, INFINITY, 1, "temperature must be"},    {4, 1, 0, "top_p must be in (0, 1]"}, {4, 1, 5, "top_p must be"},
        {4, 1, NAN, "top_p must be"},
    };
    int32_t prompt[] = {1, 2};
    int bad = -1;
    char msg[512] = "";
    for (size_t i = 0; i < sizeof cases / sizeof cases[0] && bad < 0; i++) {
        ks_generate_opts o;
        ks_generate_opts_default(&o);
        o.max_new_tokens = cases[i].n;
        o.temperature = cases[i].temp;
        o.top_p = cases[i].top_p;
        ks_status st = ks_generate_ids(s, prompt, 2, &o, NULL, NULL);
        if (st != KS_ERR_ARG || !strstr(ks_last_error(), cases[i].want)) {
            bad = (int)i;
            snprintf(msg, sizeof msg, "status %d: %s", st, ks_last_error());
        }
    }
    ks_session_free(s);
    ks_model_close(m);
    kt_rmdir(dir);
    KT_CHECK(bad < 0, "case %d: %s", bad, msg);
}
