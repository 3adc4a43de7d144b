/* fuzz_tok_common.h — the real tokenizers the encode / decode harnesses load once at init
 * (fuzz_encode.c, fuzz_decode.c). Each found file is loaded; missing ones are skipped:
 *   models/kvsieve-tiny/tokenizer.json                    (in the repository: always there)
 *   tests/tokenizer/build/{llama3,qwen3,mistral}.tokenizer.json   (tests/tokenizer/setup.sh)
 *   $KS_SHARED/models/stories260K/tokenizer.json          (../shared by default)
 * Run from the repository root. */
#ifndef KS_FUZZ_TOK_COMMON_H
#define KS_FUZZ_TOK_COMMON_H

#include "fuzz_util.h"
#include "tokenizer.h"

#define FZ_MAX_TOK 8
static ks_tokenizer *g_tok[FZ_MAX_TOK];
static int g_vocab[FZ_MAX_TOK];
static int g_ntok;

static void fz_tok_add(const char *path) {
    if (g_ntok >= FZ_MAX_TOK || !fz_exists(path)) return;
    ks_tokenizer *t;
    if (ks_tokenizer_load(path, &t) != KS_OK) {
        fprintf(stderr, "fuzz: %s: %s\n", path, ks_last_error());
        abort(); /* a real tokenizer that does not load is a bug of its own */
    }
    g_vocab[g_ntok] = ks_tokenizer_vocab_size(t);
    g_tok[g_ntok++] = t;
    fprintf(stderr, "fuzz: tokenizer %d: %s (%d tokens)\n", g_ntok - 1, path, ks_tokenizer_vocab_size(t));
}

static void fz_tok_init(void) {
    char p[1024];
    fz_tok_add("models/kvsieve-tiny/tokenizer.json");
    fz_tok_add("tests/tokenizer/build/llama3.tokenizer.json");
    fz_tok_add("tests/tokenizer/build/qwen3.tokenizer.json");
    fz_tok_add("tests/tokenizer/build/mistral.tokenizer.json");
    snprintf(p, sizeof p, "%s/models/stories260K/tokenizer.json", fz_shared_dir());
    fz_tok_add(p);
    if (!g_ntok) {
        fprintf(stderr, "fuzz: no tokenizer found (run from the repository root)\n");
        abort();
    }
}

#endif
