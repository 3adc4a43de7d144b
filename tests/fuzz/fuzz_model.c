/* fuzz_model.c — libFuzzer harness for model loading (core/model.c through ks_model_load, with
 * core/config.c, core/safetensors.c and core/tokenizer.c behind it) on the CPU backend.
 *
 * Input: the model folder as parts cut at the separator line "\n--ks-file--\n":
 *   part 0  config.json
 *   part 1  model.safetensors
 *   part 2  tokenizer.json (optional; when present ks_model_load must also load it)
 * The parts are written to a private temp folder and loaded with ks_model_load(dir, cpu, 0):
 * every tensor's presence, shape and dtype is checked against the config there. A model that
 * loads is queried (layers, KV heads, vocabulary, context) and freed; nothing is computed. Seeds:
 * tests/fuzz/corpus/model (tests/fuzz/make_corpus.py: the real config.json files of
 * tests/fixtures/hf shrunk to tiny dimensions, with matching random weights, F32 and BF16,
 * tied and untied, Qwen2 biases, Phi-3 fused projections; some with a trimmed real tokenizer). */
#include "fuzz_util.h"
#include "model.h"

#define SEP "\n--ks-file--\n"

static ks_backend *g_cpu;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc; (void)argv;
    ks_backend_opts bo = ks_backend_opts_default();
    bo.n_threads = 1;
    if (ks_cpu_backend_create(&bo, &g_cpu) != KS_OK) {
        fprintf(stderr, "fuzz_model: cpu backend: %s\n", ks_last_error());
        abort();
    }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *dir = fz_workdir();
    fz_clear(dir);
    const uint8_t *part[3];
    size_t len[3];
    int np = fz_split(data, size, SEP, part, len, 3);
    static const char *names[3] = {"config.json", "model.safetensors", "tokenizer.json"};
    for (int i = 0; i < np; i++) fz_write(dir, names[i], part[i], len[i]);
    ks_model *m = NULL;
    ks_status rc = ks_model_load(dir, g_cpu, 0, &m);
    if (getenv("FUZZ_VERBOSE")) fprintf(stderr, "load: %s\n", rc ? ks_last_error() : "ok");
    if (rc == KS_OK) {
        if (!m) __builtin_trap();
        if (ks_model_n_layers(m) != m->cfg.n_layers || ks_model_n_kv_heads(m) != m->cfg.n_kv_heads) __builtin_trap();
        (void)ks_model_vocab(m);
        (void)ks_model_max_context(m);
        if (np > 2 && !m->tok) __builtin_trap(); /* a tokenizer.json given is loaded or refused */
        ks_model_free(m);
    }
    ks_clear_error();
    return 0;
}
