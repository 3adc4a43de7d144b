/* fuzz_encode.c — libFuzzer harness for encoding text with real tokenizers (core/tokenizer.c, tokenizer_text.c, tokenizer_bpe.c:
 * added-token matching, normalizers, PCRE2 pre-tokenization, byte-level and SentencePiece BPE
 * with byte fallback, the post-processor).
 *
 * The real tokenizer.json files (fuzz_tok_common.h) are loaded once at init. Input: byte 0
 * chooses the tokenizer (low bits) and add_special (bit 7); the rest is the text, any bytes
 * (invalid UTF-8 and NULs included). The ids must lie in [0, vocab); they are decoded again with
 * and without special tokens (the decoder chain on what the encoder made). Seeds:
 * tests/fuzz/corpus/encode (lines of real text: the tokenizer conformance corpus's kinds of
 * input, chat templates with special tokens, code, several scripts). */
#include "fuzz_tok_common.h"

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc; (void)argv;
    fz_tok_init();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    int which = (data[0] & 0x7f) % g_ntok, add_special = data[0] >> 7;
    const ks_tokenizer *t = g_tok[which];
    int32_t *ids = NULL;
    size_t n = 0;
    if (ks_tokenizer_encode(t, (const char *)data + 1, size - 1, add_special, &ids, &n) == KS_OK) {
        for (size_t i = 0; i < n; i++)
            if (ids[i] < 0 || ids[i] >= g_vocab[which]) __builtin_trap();
        for (int skip = 0; skip < 2; skip++) {
            char *txt = NULL;
            size_t tl = 0;
            if (ks_tokenizer_decode(t, ids, n, skip, &txt, &tl) != KS_OK) __builtin_trap(); /* valid ids decode */
            if (txt[tl] != 0) __builtin_trap();
            free(txt);
        }
    }
    free(ids);
    ks_clear_error();
    return 0;
}
