/* tasks.h — the long-context retrieval tasks (passkey, NIAH, multi-key NIAH, KV retrieval),
 * generated bit for bit as tools/train/tasks.py does (spec: tools/train/README.md, "Task
 * format specification"). For the same seed, length, depth and tokenizer the prompt, the
 * answer and the number of filler units are identical to the Python's (tests/test_tasks.c
 * checks this against a fixture written by tools/task_ref.py).
 *
 * A case is produced from (kind, length L, depth d, seed):
 *   - seed: usually ks_task_case_seed(base, kind, L, d, index) (eval case `index`);
 *   - the prompt is the one with the largest number n of units (filler copies, haystack
 *     sentences, KV pairs) whose token count 1 (BOS) + len(encode(prompt)) is <= L; the
 *     search is the Python's own (an estimate from per-unit token counts, then steps with
 *     full tokenizations), so the chosen n is the Python's even where the count is not
 *     monotone in n;
 *   - the needle goes at insert_index(d, n) = min(max(floor(d * n + 0.5), 0), n).
 * One deliberate difference: where even the smallest prompt (n = 0; KV: n = 1) is longer than
 * L, tasks.py returns it anyway; here that is an error (KS_ERR_ARG naming the minimum).
 *
 * Nothing here has global state; a haystack and a tokenizer may be shared by many threads. */
#ifndef KS_TASKS_H
#define KS_TASKS_H

#include "common.h"
#include "tokenizer.h"

#include <stdint.h>

/* Task ids: the numbers are part of the seed derivation (TASK_IDS in tasks.py). */
typedef enum { KS_TASK_PASSKEY = 1, KS_TASK_NIAH = 2, KS_TASK_MULTIKEY = 3, KS_TASK_KV = 4 } ks_task_kind;

/* "passkey" | "niah" | "multikey" | "kv" -> *out. Anything else (or NULL) is KS_ERR_ARG with a
 * message listing the valid names. */
ks_status ks_task_parse(const char *name, ks_task_kind *out);
/* The name of a kind ("passkey", ...), or "?" for an invalid value. */
const char *ks_task_name(ks_task_kind k);

/* ---------------------------------------------------------------- SplitMix64 and seeds */

/* SplitMix64 step: *state += 0x9E3779B97F4A7C15, returns mix64(*state). */
uint64_t ks_splitmix_next(uint64_t *state);
/* The SplitMix64 output function (Stafford variant 13). */
uint64_t ks_splitmix_mix64(uint64_t z);
/* derive_seed(v[0], ..., v[n-1]): x = 0; for each v: x = mix64(x ^ v) + GOLDEN (mod 2^64).
 * Signed values enter as their two's complement (as Python's `v & M64`). */
uint64_t ks_task_derive_seed(const uint64_t *v, int n);
/* floor(depth * 1000 + 0.5) in double arithmetic, as tasks.depth_permille (depth >= 0). */
int64_t ks_task_depth_permille(double depth);
/* The seed of eval case `index` of (kind, length, depth):
 * derive_seed(base, kind, length, depth_permille(depth), index). */
uint64_t ks_task_case_seed(uint64_t base, ks_task_kind k, int length, double depth, int index);
/* Depth of eval case `index` of the standard grid: (index mod 11) / 10.0. */
double ks_task_eval_depth(int index);
/* min(max(floor(depth * n + 0.5), 0), n) in double arithmetic, as tasks.insert_index. */
int ks_task_insert_index(double depth, int n);

/* ---------------------------------------------------------------- the haystack */

/* The NIAH haystack: the `*.txt` files of a corpora folder in byte order of their names, each
 * decoded as strict UTF-8, U+FEFF removed, runs of (Python str.isspace) whitespace turned into
 * one space, no leading/trailing space, files joined with one space; cut into sentences at
 * every space preceded by '.', '!' or '?'. Immutable once loaded. */
typedef struct ks_haystack ks_haystack;

/* Load from a folder. Errors (message names the folder or file, and the byte offset for bad
 * UTF-8): KS_ERR_IO (folder missing or unreadable, no *.txt in it, a file unreadable),
 * KS_ERR_FORMAT (a file is not valid UTF-8, or holds a NUL character), KS_ERR_OOM. *out is set only on
 * success; free with ks_haystack_free. */
ks_status ks_haystack_load(const char *corpora_dir, ks_haystack **out);
void ks_haystack_free(ks_haystack *h);
/* Number of sentences; the document's length in characters (code points) and in bytes. */
int ks_haystack_n_sentences(const ks_haystack *h);
int64_t ks_haystack_n_chars(const ks_haystack *h);
size_t ks_haystack_n_bytes(const ks_haystack *h);
/* Sentence i (0 <= i < n_sentences; else NULL): pointer into the document (not
 * NUL-terminated) and its byte length. Owned by the haystack. */
const char *ks_haystack_sentence(const ks_haystack *h, int i, size_t *len);

/* ---------------------------------------------------------------- cases */

typedef struct ks_task_case {
    ks_task_kind kind;
    int length;                 /* L the case was fitted to */
    double depth;               /* needle depth in [0, 1] */
    uint64_t seed;
    char *prompt, *answer;      /* NUL-terminated, owned (ks_task_case_free). answer: " 55788"
                                   (passkey), " 1358853" (niah/multikey), the value UUID (kv) */
    size_t prompt_len;          /* strlen(prompt) */
    int n_tokens;               /* 1 (BOS) + len(encode(prompt)) <= length */
    int n_units;                /* passkey: filler copies; niah/multikey: sentences; kv: pairs */
    int target;                 /* passkey: filler copies before the needle; niah/multikey: the
                                   sentence index the target needle precedes; kv: target pair */
    /* Token ranges [begin, end) in the BOS-prefixed prompt ids (index 0 = BOS):
     *   needle: the target needle sentence, from the token of the space (or newline) before it
     *           to its final "."; kv: the target `"key": "value"` pair, from the token of the space
     *           (pair 0: the `{`) before it to the one holding the `,` or `}` after it;
     *   value:  the answer's text at its first occurrence inside that needle (passkey/niah:
     *           " NUMBER" including its space; kv: the value without quotes);
     *   question_tok_begin: first token of the question (the text after the last part
     *           separator "\n" before it; kv: "What is the value ...", two lines).
     * Each range boundary is a place where the full prompt's tokenization is cut: it is checked
     * by tokenizing the text before (or after) it and comparing with the prompt's ids. With
     * byte-level BPE tokenizers (kvsieve-tiny, Llama 3, Qwen2) every boundary is exact and
     * ranges_exact is 1; where a tokenizer merges across a boundary the range is widened to
     * the tokens that overlap it and ranges_exact is 0. */
    int needle_tok_begin, needle_tok_end;
    int value_tok_begin, value_tok_end;
    int question_tok_begin;
    int ranges_exact;
} ks_task_case;

/* Generate one case into *out (zeroed first; on error it holds nothing to free).
 *   hs: the haystack, required for NIAH and multi-key (3 distractors), ignored otherwise;
 *   tok: the tokenizer that measures lengths (no special tokens; +1 for the BOS);
 *   length: L >= the smallest prompt's token count; depth in [0, 1].
 * Errors: KS_ERR_ARG (unknown kind, NULL tok/out, missing haystack, length <= 0 or too small,
 * depth outside [0, 1] or NaN), tokenizer errors, KS_ERR_OOM. Cost: three full tokenizations
 * of the prompt (n = 0, the estimate, the estimate + 1), one small one per unit, and for the
 * ranges min(d, 1 - d) of a full one (the needle's begin) plus a few small windows; about
 * 0.05-0.1 s at 32K tokens and 0.25-0.7 s at 128K on one core. */
ks_status ks_task_make(ks_task_kind kind, const ks_haystack *hs, const ks_tokenizer *tok, int length,
                       double depth, uint64_t seed, ks_task_case *out);
void ks_task_case_free(ks_task_case *c);

#endif
