/* tokenizer_int.h — what the files of the tokenizer share; internal to core/ (its users see only
 * tokenizer.h).
 *
 *   tokenizer.c       encode and decode (the pipelines below), the UTF-8 checks of their input
 *                     and output, the queries (vocab size, token id / string, is_special)
 *   tokenizer_text.c  text transforms: regex (PCRE2, rewritten to HF's Unicode tables),
 *                     find-matches over a pattern, normalizers, pre-tokenizers
 *   tokenizer_bpe.c   the string and pair hash maps, the BPE model (merging one pre-token),
 *                     added tokens (byte trie, leftmost-longest matching with HF's rules)
 *   tokenizer_load.c  reading tokenizer.json into the structures below; ks_tokenizer_free
 *
 * Encoding, as HF does it:
 *   raw text -> split on added tokens that are not `normalized` (tok_find_added, trie_raw)
 *            -> each remaining segment: normalizer (tok_norm_apply) -> split on `normalized`
 *               added tokens (trie_norm)
 *            -> each remaining segment: pre-tokenizer (tok_pre_apply: pieces) -> BPE model per
 *               piece (tok_bpe_word)
 *            -> post-processor (BOS/EOS) when add_special.
 * Decoding: ids -> token strings (skipping special ones on request) -> decoder chain -> UTF-8.
 *
 * Everything below is immutable after loading except the per-call state (rxctx, ectx), which
 * each encode / decode call owns: encode/decode may run on many threads. An allocation failure
 * is -1 (int results) or KS_ERR_OOM (ks_status results). Functions shared between the files
 * carry the tok_ prefix; the small ones every file uses (buffers, UTF-8 stepping) are static
 * inline here; everything else stays static in its file. */
#ifndef KS_TOKENIZER_INT_H
#define KS_TOKENIZER_INT_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer.h"

#include <pcre2.h>
#include <stdlib.h>
#include <string.h>

/* ================================================================ buffers */

typedef struct sbuf { char *p; size_t n, cap; } sbuf; /* growable bytes, kept NUL-terminated */

static inline int sb_reserve(sbuf *b, size_t extra) {
    if (b->n + extra + 1 <= b->cap) return 0;
    size_t c = b->cap ? b->cap : 64;
    while (c < b->n + extra + 1) c *= 2;
    char *q = ks_realloc(b->p, c);
    if (!q) return -1;
    b->p = q;
    b->cap = c;
    return 0;
}
static inline int sb_put(sbuf *b, const void *s, size_t n) {
    if (sb_reserve(b, n)) return -1;
    if (n) memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
    return 0;
}
static inline void sb_free(sbuf *b) { free(b->p); b->p = NULL; b->n = b->cap = 0; }

/* a growable array of fixed-size items */
typedef struct vec { void *v; size_t n, cap, isz; } vec;
static inline void *vec_push(vec *a) {
    if (a->n == a->cap) {
        size_t c = a->cap ? a->cap * 2 : 16;
        void *q = ks_realloc(a->v, c * a->isz);
        if (!q) return NULL;
        a->v = q;
        a->cap = c;
    }
    return (char *)a->v + a->isz * a->n++;
}
static inline void vec_free(vec *a) { free(a->v); a->v = NULL; a->n = a->cap = 0; }

typedef struct span { size_t s, e; int m; } span;        /* [s,e) and a flag (is a match / remove) */
typedef struct piece { size_t off, len; int first; } piece; /* first: starts at original offset 0 */

static inline int push_span(vec *a, size_t s, size_t e, int m) {
    span *x = vec_push(a);
    if (!x) return -1;
    x->s = s; x->e = e; x->m = m;
    return 0;
}
static inline int push_id(vec *a, int32_t id) {
    int32_t *x = vec_push(a);
    if (!x) return -1;
    *x = id;
    return 0;
}
static inline int push_piece(vec *pcs, size_t off, size_t len, int first) {
    piece *p = vec_push(pcs);
    if (!p) return -1;
    p->off = off; p->len = len; p->first = first;
    return 0;
}

/* ================================================================ UTF-8 stepping */

/* Length of the sequence a lead byte starts (valid UTF-8: encode checks its input first). */
static inline size_t u8_len(unsigned char c) { return c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4; }

/* Decode one code point of valid UTF-8. */
static inline uint32_t u8_dec(const unsigned char *s, size_t *len) {
    unsigned c = s[0];
    if (c < 0x80) { *len = 1; return c; }
    if (c < 0xE0) { *len = 2; return (c & 0x1F) << 6 | (s[1] & 0x3F); }
    if (c < 0xF0) { *len = 3; return (c & 0x0F) << 12 | (s[1] & 0x3F) << 6 | (s[2] & 0x3F); }
    *len = 4;
    return (c & 0x07) << 18 | (s[1] & 0x3F) << 12 | (s[2] & 0x3F) << 6 | (s[3] & 0x3F);
}

/* Unicode White_Space (what Rust's char::is_whitespace and regex \s use). */
static inline int is_ws(uint32_t c) {
    return (c >= 9 && c <= 13) || c == 32 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
           c == 0x3000;
}

/* ================================================================ maps (tokenizer_bpe.c) */

/* string -> int32, open addressing; keys live in an arena addressed by offset */
typedef struct sm_slot { uint32_t off, len, hash; int32_t val; } sm_slot; /* len == UINT32_MAX: empty */
typedef struct strmap { sm_slot *s; size_t mask; } strmap;

/* (id, id) -> (rank, new id) */
typedef struct pairmap { uint64_t *key; uint32_t *rank; int32_t *nid; size_t mask; } pairmap;
#define PM_EMPTY UINT64_MAX

/* A map for `count` keys (all slots empty). -1 when out of memory. */
int tok_sm_init(strmap *m, size_t count);
/* The slot holding key k[0..n) (keys at base + off), or the empty slot where it would go;
 * *h32: the key's hash tag, to store in a slot being filled. */
sm_slot *tok_sm_slot_for(const strmap *m, const char *base, const char *k, size_t n, uint32_t *h32);
/* The value of key k[0..n), or -1 (also for a map never initialised). */
int32_t tok_sm_get(const strmap *m, const char *base, const char *k, size_t n);
/* A pair map for `count` pairs (all keys PM_EMPTY). -1 when out of memory. */
int tok_pm_init(pairmap *m, size_t count);
/* The slot of key k = a << 32 | b (uint32 ids): where it is, or the empty slot where it goes. */
size_t tok_pm_index(const pairmap *m, uint64_t k);

/* ================================================================ regex, patterns (tokenizer_text.c) */

typedef struct ks_rx ks_rx; /* a compiled PCRE2 pattern; immutable, shared by all calls */
/* per-call matching state (match data, JIT stack): encode/decode stay thread-safe */
typedef struct rxctx { pcre2_match_data *md; pcre2_match_context *mc; pcre2_jit_stack *js; } rxctx;

typedef struct pattern { const ks_rx *rx; const char *lit; size_t lit_len; int (*pred)(uint32_t, const void *); const void *arg; } pattern;

/* Compile an HF (Oniguruma) regex pat[0..len) for PCRE2 (UTF + UCP): \s, \p{..} and \d are
 * rewritten to HF's Unicode tables. KS_ERR_FORMAT naming the pattern when it does not compile. */
ks_status tok_rx_compile(const char *pat, size_t len, ks_rx **out);
void tok_rx_free(ks_rx *rx);            /* NULL: nothing */
void tok_rxctx_free(rxctx *c);          /* frees and zeroes; a zeroed rxctx is ready for use */
/* HF's Pattern::find_matches over s[0..n): *out (a vec of span, emptied first) gets spans that
 * cover s in order, m = 1 for a match and 0 for a gap; an empty s gives one empty gap.
 * KS_ERR_ARG (recorded) when the regex engine fails. */
ks_status tok_find_matches(const pattern *pt, rxctx *c, const char *s, size_t n, vec *out);

/* ================================================================ components */

enum { N_SEQ, N_NFC, N_NFD, N_NFKC, N_NFKD, N_PREPEND, N_REPLACE, N_STRIP };
typedef struct knorm {
    int type;
    char *a; size_t alen;       /* prepend text / replace literal */
    char *b; size_t blen;       /* replace content */
    ks_rx *rx;                  /* replace regex */
    int left, right;            /* strip */
    struct knorm *kids; size_t nk;
} knorm;

enum { P_SEQ, P_BYTELEVEL, P_SPLIT, P_METASPACE, P_DIGITS };
enum { B_REMOVED, B_ISOLATED, B_MERGED_PREV, B_MERGED_NEXT, B_CONTIGUOUS };
enum { PS_ALWAYS, PS_FIRST, PS_NEVER };
typedef struct kpre {
    int type;
    int add_prefix_space, use_regex; /* ByteLevel */
    ks_rx *rx; char *lit; size_t lit_len; int behavior, invert; /* Split */
    char repl[8]; size_t repl_len; uint32_t repl_cp; int scheme, split; /* Metaspace */
    int individual; /* Digits */
    struct kpre *kids; size_t nk;
} kpre;

enum { D_SEQ, D_BYTELEVEL, D_METASPACE, D_REPLACE, D_BYTEFALLBACK, D_FUSE, D_STRIP };
typedef struct kdec {
    int type;
    char repl[8]; size_t repl_len; uint32_t repl_cp; int scheme; /* Metaspace */
    char *lit; size_t lit_len; ks_rx *rx; char *content; size_t clen; /* Replace */
    uint32_t strip_cp; size_t start, stop; /* Strip */
    struct kdec *kids; size_t nk;
} kdec;

/* post-processor: a flat template; -1 stands for the sequence itself */
typedef struct kpost { int32_t *items; size_t n; struct kpost *kids; size_t nk; int is_seq; } kpost;

typedef struct addtok {
    uint32_t off, len;   /* content (arena) */
    uint32_t noff, nlen; /* content after the normalizer (normalized tokens) */
    int32_t id;
    uint8_t single_word, lstrip, rstrip, normalized, special;
} addtok;

/* byte trie for leftmost-longest matching of added tokens */
typedef struct tnode { int32_t child, sibling, tok; uint8_t byte; } tnode;
typedef struct trie { tnode *v; size_t n, cap; int32_t root[256]; } trie; /* n == 0: no tokens */

typedef struct idinfo { uint32_t off, len, doff, dlen; uint8_t flags; } idinfo;
#define ID_PRESENT 1
#define ID_SPECIAL 2
#define ID_ADDED 4
#define ID_SKIP 8 /* decode(skip_special) drops it: its decode string is a special token's content */

struct ks_tokenizer {
    sbuf arena; /* every string the tokenizer keeps, NUL-terminated */
    /* BPE model */
    strmap vocab;
    size_t vocab_count;
    pairmap merges;
    int has_unk; uint32_t unk_off, unk_len;
    int fuse_unk, byte_fallback, ignore_merges;
    int has_prefix, has_suffix; uint32_t prefix_off, prefix_len, suffix_off, suffix_len;
    int32_t byte_id[256]; /* "<0xNN>" ids, -1 if absent */
    /* ids */
    idinfo *ids; int32_t n_ids;
    /* added tokens */
    addtok *added; size_t n_added;
    strmap added_map;
    trie trie_raw, trie_norm;
    /* pipeline */
    knorm *norm; kpre *pre; kpost *post; kdec *dec;
    /* GPT-2 byte <-> unicode map */
    char bl_enc[256][2]; uint8_t bl_len[256]; int16_t bl_rev[324];
};

#define ARENA(t) ((t)->arena.p)

/* ================================================================ encode scratch */

/* working state of one encode call */
typedef struct ectx {
    rxctx rc;
    vec spans;     /* span scratch */
    vec spans2;
    sbuf tmp;
    vec syms, heap; /* BPE scratch */
    sbuf word;     /* BPE: prefixed/suffixed char */
} ectx;

/* BPE: the word as a linked list of symbols (token id c, byte length; len 0: merged away) and
 * the heap of candidate merges (the pair starting at syms[pos], its rank and merged id) */
typedef struct sym { int32_t c, prev, next; uint32_t len; } sym;
typedef struct hent { uint32_t rank, pos; int32_t nid; } hent;

/* ================================================================ pipeline stages */

/* tokenizer_text.c: appends the normalized form of in[0..n) to out (a NULL normalizer copies). */
ks_status tok_norm_apply(const knorm *nm, rxctx *c, const char *in, size_t n, sbuf *out);
/* tokenizer_text.c: one pre-tokenizer (a Sequence: each in turn) over all pieces:
 * (buf, pcs) -> (buf, pcs); each piece is buf[off..off+len). On error both stay freeable. */
ks_status tok_pre_apply(const ks_tokenizer *t, const kpre *p, ectx *c, sbuf *buf, vec *pcs);
/* tokenizer_bpe.c: the BPE model over one pre-token w[0..n), appending its ids to ids. */
ks_status tok_bpe_word(const ks_tokenizer *t, ectx *c, const char *w, size_t n, vec *ids);
/* tokenizer_bpe.c: adds s[0..n) with token index tok (n == 0: nothing). -1 when out of memory. */
int tok_trie_insert(trie *tr, const char *s, size_t n, int32_t tok);
/* tokenizer_bpe.c: HF AddedVocabulary::find_matches over s[0..n) with the tokens of tr: spans
 * covering s with m = index into t->added + 1 for a token, 0 for text. */
ks_status tok_find_added(const ks_tokenizer *t, const trie *tr, const char *s, size_t n, vec *out);

#endif
