/* fuzz_tokenizer_load.c — libFuzzer harness for tokenizer.json loading (core/tokenizer_load.c, with
 * core/json.c under it): the model (BPE vocab and merges, byte fallback), normalizers,
 * pre-tokenizers (PCRE2 split regexes), decoders, the post-processor and added tokens.
 *
 * Input: a whole tokenizer.json, written to a private temp file and loaded with
 * ks_tokenizer_load (the library reads tokenizers from files only). A tokenizer that loads is
 * then exercised a little: a few fixed texts are encoded (with and without special tokens), the
 * ids must lie in [0, vocab) and are decoded again (keeping and skipping specials), every id
 * below 512 is decoded alone and looked up with token_str / token_id / is_special, and an id out
 * of range must be refused. Seeds: tests/fuzz/corpus/tokenizer_load (the real tokenizer.json of
 * models/kvsieve-tiny and of Llama 3, Qwen 3 and Mistral, trimmed to a few hundred tokens by
 * tests/fuzz/make_corpus.py). */
#include "fuzz_util.h"
#include "tokenizer.h"

static const char *kTexts[] = {"Hello world", " the  cat\n\tsat.", "<s>a</s><|endoftext|>", "\xc3\xa9t\xc3\xa9 \xe4\xb8\xad 123",
                               "\xff\xfe broken utf8 \xc3", ""};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *dir = fz_workdir();
    char path[700];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    if (fz_write(dir, "tokenizer.json", data, size)) return 0;
    ks_tokenizer *t = NULL;
    ks_status lrc = ks_tokenizer_load(path, &t);
    if (getenv("FUZZ_VERBOSE")) fprintf(stderr, "load: %s\n", lrc ? ks_last_error() : "ok");
    if (lrc != KS_OK) {
        if (t) __builtin_trap();
        ks_clear_error();
        return 0;
    }
    int vocab = ks_tokenizer_vocab_size(t);
    if (vocab < 0) __builtin_trap();
    for (size_t i = 0; i < sizeof kTexts / sizeof *kTexts; i++)
        for (int sp = 0; sp < 2; sp++) {
            int32_t *ids = NULL;
            size_t n = 0;
            if (ks_tokenizer_encode(t, kTexts[i], strlen(kTexts[i]), sp, &ids, &n) == KS_OK) {
                for (size_t j = 0; j < n; j++)
                    if (ids[j] < 0 || ids[j] >= vocab) __builtin_trap();
                char *txt = NULL;
                size_t tl = 0;
                if (ks_tokenizer_decode(t, ids, n, sp, &txt, &tl) == KS_OK && txt[tl] != 0) __builtin_trap();
                free(txt);
            }
            free(ids);
        }
    for (int32_t id = 0; id < vocab && id < 512; id++) {
        char *txt = NULL;
        size_t tl = 0;
        if (ks_tokenizer_decode(t, &id, 1, id & 1, &txt, &tl) == KS_OK && txt[tl] != 0) __builtin_trap();
        free(txt);
        const char *s = ks_tokenizer_token_str(t, id);
        if (s) (void)ks_tokenizer_token_id(t, s);
        (void)ks_tokenizer_is_special(t, id);
    }
    int32_t bad[2] = {vocab, -1};
    char *txt = NULL;
    size_t tl = 0;
    if (ks_tokenizer_decode(t, bad, 2, 0, &txt, &tl) == KS_OK) __builtin_trap(); /* out of range */
    free(txt);
    ks_tokenizer_free(t);
    ks_clear_error();
    return 0;
}
