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
    KT_CHECK(ks_session_new(m, &s) == KS_OK, "%s", ks_last_error());
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
    ks_session_free_(s);
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
