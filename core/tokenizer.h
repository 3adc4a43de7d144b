/* tokenizer.h — Hugging Face tokenizer.json, implemented here:
 *   - byte-level BPE (GPT-2 byte<->unicode map) with the split regexes of Llama 3 and
 *     Qwen2 (PCRE2, UTF + UCP), Qwen's NFC normalizer;
 *   - SentencePiece-style BPE (Metaspace / Prepend+Replace "▁" normalizers) with byte
 *     fallback (<0xNN> tokens): Llama 2, Mistral, stories260K;
 *   - added / special tokens (matched before the model, honouring lstrip/rstrip/
 *     single_word/normalized), the TemplateProcessing post-processor (BOS/EOS), decoding
 *     through the tokenizer's decoder chain.
 * Anything in the file we do not understand is refused with KS_ERR_UNSUPPORTED naming it,
 * never silently ignored. */
#ifndef KS_TOKENIZER_H
#define KS_TOKENIZER_H

#include "common.h"

typedef struct ks_tokenizer ks_tokenizer;

/* Load tokenizer.json from a file path. */
ks_status ks_tokenizer_load(const char *path, ks_tokenizer **out);
void ks_tokenizer_free(ks_tokenizer *tok);

/* Encode UTF-8 text. add_special != 0 applies the post-processor (e.g. BOS), exactly like
 * HF's encode(text, add_special_tokens=True). *ids is malloc'd; free() it. */
ks_status ks_tokenizer_encode(const ks_tokenizer *tok, const char *text, size_t len,
                              int add_special, int32_t **ids, size_t *n_ids);
/* Decode ids to UTF-8 like HF's decode(ids, skip_special_tokens=skip_special).
 * *text is malloc'd and NUL-terminated. Ids out of range are KS_ERR_ARG. */
ks_status ks_tokenizer_decode(const ks_tokenizer *tok, const int32_t *ids, size_t n,
                              int skip_special, char **text, size_t *len);

int ks_tokenizer_vocab_size(const ks_tokenizer *tok);  /* model vocab + added tokens */
/* Id of a token string (vocab or added), or -1. */
int32_t ks_tokenizer_token_id(const ks_tokenizer *tok, const char *token);
/* The raw token string of an id (as in the vocab, e.g. "Ġhello" or "▁the"), or NULL. */
const char *ks_tokenizer_token_str(const ks_tokenizer *tok, int32_t id);
int ks_tokenizer_is_special(const ks_tokenizer *tok, int32_t id);

#endif
