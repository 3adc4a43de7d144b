/* fuzz_decode.c — libFuzzer harness for decoding id arrays with real tokenizers
 * (core/tokenizer.c: the decoder chains — ByteLevel, Metaspace / Replace + ByteFallback + Fuse +
 * Strip — special-token skipping, incomplete UTF-8 at the end).
 *
 * The real tokenizer.json files (fuzz_tok_common.h) are loaded once at init. Input: byte 0
 * chooses the tokenizer (low bits) and skip_special (bit 7); then 3 bytes per id: an id in
 * [0, vocab) mostly, and when the top bit of the third byte is set an edge value (-1, INT32_MIN,
 * INT32_MAX, vocab, vocab - 1, 0) so out-of-range ids are exercised too: they must be refused
 * (KS_ERR_ARG), valid ones must decode. Each id is also decoded alone (the streaming path
 * decodes one id at a time) and looked up with token_str / is_special. Seeds:
 * tests/fuzz/corpus/decode (ids of real text encoded with these tokenizers). */
#include "fuzz_tok_common.h"

#include <limits.h>

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc; (void)argv;
    fz_tok_init();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    int which = (data[0] & 0x7f) % g_ntok, skip = data[0] >> 7, V = g_vocab[which];
    const ks_tokenizer *t = g_tok[which];
    size_t n = (size - 1) / 3;
    int32_t *ids = malloc(sizeof(int32_t) * (n ? n : 1));
    int bad = 0;
    for (size_t i = 0; i < n; i++) {
        const uint8_t *b = data + 1 + 3 * i;
        uint32_t v = b[0] | (uint32_t)b[1] << 8 | (uint32_t)(b[2] & 0x7f) << 16;
        if (b[2] & 0x80) {
            static const int edge[6] = {-1, INT_MIN, INT_MAX, 0, 0, 0};
            int k = v % 6;
            ids[i] = k == 3 ? V : k == 4 ? V - 1 : edge[k];
        } else ids[i] = (int32_t)(v % (uint32_t)V);
        if (ids[i] < 0 || ids[i] >= V) bad = 1;
    }
    char *txt = NULL;
    size_t tl = 0;
    ks_status st = ks_tokenizer_decode(t, ids, n, skip, &txt, &tl);
    if (bad ? st == KS_OK : st != KS_OK) __builtin_trap();
    if (st == KS_OK && txt[tl] != 0) __builtin_trap();
    free(txt);
    for (size_t i = 0; i < n && i < 64; i++) {
        txt = NULL;
        st = ks_tokenizer_decode(t, &ids[i], 1, skip, &txt, &tl);
        if (st == KS_OK) free(txt);
        (void)ks_tokenizer_token_str(t, ids[i]);
        (void)ks_tokenizer_is_special(t, ids[i]);
    }
    free(ids);
    ks_clear_error();
    return 0;
}
