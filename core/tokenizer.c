/* tokenizer.c — Hugging Face tokenizer.json (BPE models), matching the `tokenizers` library.
 *
 * Encoding, as HF does it:
 *   raw text -> split on added tokens that are not `normalized` (leftmost-longest)
 *            -> each remaining segment: normalizer -> split on `normalized` added tokens
 *            -> each remaining segment: pre-tokenizer (pieces) -> BPE model per piece
 *            -> post-processor (BOS/EOS) when add_special.
 * Decoding: ids -> token strings (skipping special ones on request) -> decoder chain -> UTF-8.
 * Nothing here keeps mutable state after loading: encode/decode may run on many threads. */
#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer.h"

#include "json.h"

#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

/* ================================================================ buffers */

typedef struct sbuf { char *p; size_t n, cap; } sbuf; /* growable bytes, kept NUL-terminated */

static int sb_reserve(sbuf *b, size_t extra) {
    if (b->n + extra + 1 <= b->cap) return 0;
    size_t c = b->cap ? b->cap : 64;
    while (c < b->n + extra + 1) c *= 2;
    char *q = ks_realloc(b->p, c);
    if (!q) return -1;
    b->p = q;
    b->cap = c;
    return 0;
}
static int sb_put(sbuf *b, const void *s, size_t n) {
    if (sb_reserve(b, n)) return -1;
    if (n) memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
    return 0;
}
static void sb_free(sbuf *b) { free(b->p); b->p = NULL; b->n = b->cap = 0; }

/* a growable array of fixed-size items */
typedef struct vec { void *v; size_t n, cap, isz; } vec;
static void *vec_push(vec *a) {
    if (a->n == a->cap) {
        size_t c = a->cap ? a->cap * 2 : 16;
        void *q = ks_realloc(a->v, c * a->isz);
        if (!q) return NULL;
        a->v = q;
        a->cap = c;
    }
    return (char *)a->v + a->isz * a->n++;
}
static void vec_free(vec *a) { free(a->v); a->v = NULL; a->n = a->cap = 0; }

typedef struct span { size_t s, e; int m; } span;        /* [s,e) and a flag (is a match / remove) */
typedef struct piece { size_t off, len; int first; } piece; /* first: starts at original offset 0 */

static int push_span(vec *a, size_t s, size_t e, int m) {
    span *x = vec_push(a);
    if (!x) return -1;
    x->s = s; x->e = e; x->m = m;
    return 0;
}
static int push_id(vec *a, int32_t id) {
    int32_t *x = vec_push(a);
    if (!x) return -1;
    *x = id;
    return 0;
}

/* ================================================================ UTF-8 */

static size_t u8_len(unsigned char c) { return c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4; }

/* Length of the well-formed sequence at s (n bytes left), or 0 with *bad = length of the
 * maximal invalid subpart (what Rust's from_utf8_lossy replaces by one U+FFFD). */
static size_t u8_seq(const unsigned char *s, size_t n, size_t *bad) {
    unsigned c = s[0], lo = 0x80, hi = 0xBF;
    size_t need;
    if (c < 0x80) return 1;
    if (c >= 0xC2 && c <= 0xDF) need = 1;
    else if (c >= 0xE0 && c <= 0xEF) { need = 2; if (c == 0xE0) lo = 0xA0; else if (c == 0xED) hi = 0x9F; }
    else if (c >= 0xF0 && c <= 0xF4) { need = 3; if (c == 0xF0) lo = 0x90; else if (c == 0xF4) hi = 0x8F; }
    else { *bad = 1; return 0; }
    for (size_t i = 1; i <= need; i++) {
        if (i >= n || s[i] < lo || s[i] > hi) { *bad = i; return 0; }
        lo = 0x80; hi = 0xBF;
    }
    return need + 1;
}

/* Decode one code point of valid UTF-8. */
static uint32_t u8_dec(const unsigned char *s, size_t *len) {
    unsigned c = s[0];
    if (c < 0x80) { *len = 1; return c; }
    if (c < 0xE0) { *len = 2; return (c & 0x1F) << 6 | (s[1] & 0x3F); }
    if (c < 0xF0) { *len = 3; return (c & 0x0F) << 12 | (s[1] & 0x3F) << 6 | (s[2] & 0x3F); }
    *len = 4;
    return (c & 0x07) << 18 | (s[1] & 0x3F) << 12 | (s[2] & 0x3F) << 6 | (s[3] & 0x3F);
}

static size_t u8_enc(uint32_t cp, char *o) {
    if (cp < 0x80) { o[0] = (char)cp; return 1; }
    if (cp < 0x800) { o[0] = (char)(0xC0 | cp >> 6); o[1] = (char)(0x80 | (cp & 0x3F)); return 2; }
    if (cp < 0x10000) {
        o[0] = (char)(0xE0 | cp >> 12); o[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (char)(0xF0 | cp >> 18); o[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3F)); o[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

static int u8_valid(const char *s, size_t n, size_t *bad_at) {
    const unsigned char *p = (const unsigned char *)s;
    size_t i = 0, bad;
    while (i < n) {
        if (p[i] < 0x80) { i++; continue; }
        size_t k = u8_seq(p + i, n - i, &bad);
        if (!k) { *bad_at = i; return 0; }
        i += k;
    }
    return 1;
}

static size_t u8_count(const char *s, size_t n) {
    size_t c = 0;
    for (size_t i = 0; i < n; i++) c += ((unsigned char)s[i] & 0xC0) != 0x80;
    return c;
}

/* Append s with invalid sequences replaced by U+FFFD, like String::from_utf8_lossy. */
static int u8_lossy(sbuf *o, const char *s, size_t n) {
    const unsigned char *p = (const unsigned char *)s;
    size_t i = 0, run = 0, bad;
    while (i < n) {
        size_t k = p[i] < 0x80 ? 1 : u8_seq(p + i, n - i, &bad);
        if (k) { i += k; continue; }
        if (sb_put(o, s + run, i - run) || sb_put(o, "\xEF\xBF\xBD", 3)) return -1;
        i += bad;
        run = i;
    }
    return sb_put(o, s + run, n - run);
}

/* Unicode White_Space (what Rust's char::is_whitespace and regex \s use). */
static int is_ws(uint32_t c) {
    return (c >= 9 && c <= 13) || c == 32 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
           c == 0x3000;
}
/* Rust regex's Unicode \w (Unicode 16): alphabetic, marks, decimal digits, connector
 * punctuation, join controls. utf8proc's categories plus the Other_Alphabetic symbols and the
 * word characters added after utf8proc's Unicode version (measured against HF). */
static int is_word(uint32_t c) {
    static const uint32_t extra[][2] = {
        {0x897, 0x897}, {0x1C89, 0x1C8A}, {0x200C, 0x200D}, {0x24B6, 0x24E9}, {0xA7CB, 0xA7CD}, {0xA7DA, 0xA7DC},
        {0x105C0, 0x105F3}, {0x10D40, 0x10D65}, {0x10D69, 0x10D6D}, {0x10D6F, 0x10D85}, {0x10EC2, 0x10EC4},
        {0x10EFC, 0x10EFC}, {0x11380, 0x11389}, {0x1138B, 0x1138B}, {0x1138E, 0x1138E}, {0x11390, 0x113B5},
        {0x113B7, 0x113C0}, {0x113C2, 0x113C2}, {0x113C5, 0x113C5}, {0x113C7, 0x113CA}, {0x113CC, 0x113D3},
        {0x113E1, 0x113E2}, {0x116D0, 0x116E3}, {0x11BC0, 0x11BE0}, {0x11BF0, 0x11BF9}, {0x11F5A, 0x11F5A},
        {0x13460, 0x143FA}, {0x16100, 0x16139}, {0x16D40, 0x16D6C}, {0x16D70, 0x16D79}, {0x18CFF, 0x18CFF},
        {0x1CCF0, 0x1CCF9}, {0x1E5D0, 0x1E5FA}, {0x1F130, 0x1F149}, {0x1F150, 0x1F169}, {0x1F170, 0x1F189},
        {0x2EBF0, 0x2EE5D}};
    for (size_t i = 0; i < sizeof extra / sizeof extra[0]; i++)
        if (c >= extra[i][0] && c <= extra[i][1]) return 1;
    switch (utf8proc_category((utf8proc_int32_t)c)) {
    case UTF8PROC_CATEGORY_LU: case UTF8PROC_CATEGORY_LL: case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM: case UTF8PROC_CATEGORY_LO: case UTF8PROC_CATEGORY_MN:
    case UTF8PROC_CATEGORY_MC: case UTF8PROC_CATEGORY_ME: case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_NL: case UTF8PROC_CATEGORY_PC: return 1;
    default: return 0;
    }
}
/* Rust char::is_numeric: general categories Nd, Nl, No (Rust's std is at Unicode 17; utf8proc
 * may be older, so the numbers added since Unicode 14 are listed; measured against HF). */
static int is_numeric(uint32_t c) {
    static const uint32_t added[][2] = {{0x10D40, 0x10D49}, {0x116D0, 0x116E3}, {0x11BF0, 0x11BF9}, {0x11F50, 0x11F59},
                                        {0x16130, 0x16139}, {0x16D70, 0x16D79}, {0x1CCF0, 0x1CCF9}, {0x1D2C0, 0x1D2D3},
                                        {0x1E4F0, 0x1E4F9}, {0x1E5F1, 0x1E5FA}, {0x11DE0, 0x11DE9}, {0x16FF4, 0x16FF6}};
    int k = utf8proc_category((utf8proc_int32_t)c);
    if (k == UTF8PROC_CATEGORY_ND || k == UTF8PROC_CATEGORY_NL || k == UTF8PROC_CATEGORY_NO) return 1;
    for (size_t i = 0; i < sizeof added / sizeof added[0]; i++)
        if (c >= added[i][0] && c <= added[i][1]) return 1;
    return 0;
}

/* ================================================================ hashing, maps */

static uint64_t hash_bytes(const void *p, size_t n) {
    const unsigned char *s = p;
    uint64_t h = 0x9E3779B97F4A7C15ull ^ (n * 0xC2B2AE3D27D4EB4Full);
    while (n >= 8) {
        uint64_t v;
        memcpy(&v, s, 8);
        h = (h ^ v) * 0xFF51AFD7ED558CCDull;
        h ^= h >> 32;
        s += 8;
        n -= 8;
    }
    uint64_t v = 0;
    memcpy(&v, s, n);
    h = (h ^ v) * 0xC4CEB9FE1A85EC53ull;
    h ^= h >> 29;
    h *= 0x9E3779B97F4A7C15ull;
    return h ^ (h >> 31);
}

/* string -> int32, open addressing; keys live in an arena addressed by offset */
typedef struct sm_slot { uint32_t off, len, hash; int32_t val; } sm_slot; /* len == UINT32_MAX: empty */
typedef struct strmap { sm_slot *s; size_t mask; } strmap;

static int sm_init(strmap *m, size_t count) {
    size_t cap = 16;
    while (cap < count * 2 + 1) cap *= 2;
    m->s = ks_malloc(cap * sizeof *m->s);
    if (!m->s) return -1;
    for (size_t i = 0; i < cap; i++) m->s[i].len = UINT32_MAX;
    m->mask = cap - 1;
    return 0;
}
/* The slot holding key, or the empty slot where it would go (*h32: the key's hash tag). */
static sm_slot *sm_slot_for(const strmap *m, const char *base, const char *k, size_t n, uint32_t *h32) {
    uint64_t h = hash_bytes(k, n);
    *h32 = (uint32_t)(h >> 32);
    for (size_t i = (size_t)h & m->mask;; i = (i + 1) & m->mask) {
        sm_slot *x = &m->s[i];
        if (x->len == UINT32_MAX) return x;
        if (x->hash == *h32 && x->len == n && memcmp(base + x->off, k, n) == 0) return x;
    }
}
static int32_t sm_get(const strmap *m, const char *base, const char *k, size_t n) {
    if (!m->s) return -1;
    uint32_t h;
    sm_slot *x = sm_slot_for(m, base, k, n, &h);
    return x->len == UINT32_MAX ? -1 : x->val;
}

/* (id, id) -> (rank, new id) */
typedef struct pairmap { uint64_t *key; uint32_t *rank; int32_t *nid; size_t mask; } pairmap;
#define PM_EMPTY UINT64_MAX

static int pm_init(pairmap *m, size_t count) {
    size_t cap = 16;
    while (cap < count * 2 + 1) cap *= 2;
    m->key = ks_malloc(cap * sizeof *m->key);
    m->rank = ks_malloc(cap * sizeof *m->rank);
    m->nid = ks_malloc(cap * sizeof *m->nid);
    if (!m->key || !m->rank || !m->nid) return -1;
    for (size_t i = 0; i < cap; i++) m->key[i] = PM_EMPTY;
    m->mask = cap - 1;
    return 0;
}
static size_t pm_index(const pairmap *m, uint64_t k) {
    uint64_t h = k * 0x9E3779B97F4A7C15ull;
    h ^= h >> 29;
    for (size_t i = (size_t)(h >> 16) & m->mask;; i = (i + 1) & m->mask)
        if (m->key[i] == k || m->key[i] == PM_EMPTY) return i;
}
static int pm_get(const pairmap *m, int32_t a, int32_t b, uint32_t *rank, int32_t *nid) {
    if (!m->key) return 0;
    uint64_t k = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
    size_t i = pm_index(m, k);
    if (m->key[i] == PM_EMPTY) return 0;
    *rank = m->rank[i];
    *nid = m->nid[i];
    return 1;
}

/* ================================================================ regex (PCRE2) */

/* Oniguruma (what HF uses) reads \s as Unicode White_Space; PCRE2's UCP \s also takes
 * U+180E. Spell the set out so both agree. */
#define WS_SET "\\t\\n\\x{0B}\\f\\r\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}"

/* HF's Oniguruma has Unicode 16 tables; PCRE2 10.42 has Unicode 14's. For the properties the
 * split regexes use, these are the code points Unicode 16 has and PCRE2 10.42 lacks (PCRE2
 * never has extra ones; a newer PCRE2 already has some of these, which is harmless). The
 * rewrite below turns \p{L} into [\p{L}<these>], etc. Measured by running both engines over
 * every code point. */
static const struct uprop { const char *name; const char *extra; } UPROPS[] = {
    {"L",
     "\\x{1C89}-\\x{1C8A}\\x{A7CB}-\\x{A7CD}\\x{A7DA}-\\x{A7DC}\\x{105C0}-\\x{105F3}"
     "\\x{10D4A}-\\x{10D65}\\x{10D6F}-\\x{10D85}\\x{10EC2}-\\x{10EC4}\\x{1123F}-\\x{11240}"
     "\\x{11380}-\\x{11389}\\x{1138B}\\x{1138E}\\x{11390}-\\x{113B5}\\x{113B7}\\x{113D1}\\x{113D3}"
     "\\x{11BC0}-\\x{11BE0}\\x{11F02}\\x{11F04}-\\x{11F10}\\x{11F12}-\\x{11F33}\\x{1342F}"
     "\\x{13441}-\\x{13446}\\x{13460}-\\x{143FA}\\x{16100}-\\x{1611D}\\x{16D40}-\\x{16D6C}\\x{18CFF}"
     "\\x{1B132}\\x{1B155}\\x{1DF25}-\\x{1DF2A}\\x{1E030}-\\x{1E06D}\\x{1E4D0}-\\x{1E4EB}"
     "\\x{1E5D0}-\\x{1E5ED}\\x{1E5F0}\\x{2B739}\\x{2EBF0}-\\x{2EE5D}\\x{31350}-\\x{323AF}"},
    {"N",
     "\\x{10D40}-\\x{10D49}\\x{116D0}-\\x{116E3}\\x{11BF0}-\\x{11BF9}\\x{11F50}-\\x{11F59}"
     "\\x{16130}-\\x{16139}\\x{16D70}-\\x{16D79}\\x{1CCF0}-\\x{1CCF9}\\x{1D2C0}-\\x{1D2D3}"
     "\\x{1E4F0}-\\x{1E4F9}\\x{1E5F1}-\\x{1E5FA}"},
    {"M",
     "\\x{897}\\x{CF3}\\x{ECE}\\x{10D69}-\\x{10D6D}\\x{10EFC}-\\x{10EFF}\\x{11241}"
     "\\x{113B8}-\\x{113C0}\\x{113C2}\\x{113C5}\\x{113C7}-\\x{113CA}\\x{113CC}-\\x{113D0}\\x{113D2}"
     "\\x{113E1}-\\x{113E2}\\x{11F00}-\\x{11F01}\\x{11F03}\\x{11F34}-\\x{11F3A}\\x{11F3E}-\\x{11F42}"
     "\\x{11F5A}\\x{13440}\\x{13447}-\\x{13455}\\x{1611E}-\\x{1612F}\\x{1E08F}\\x{1E4EC}-\\x{1E4EF}"
     "\\x{1E5EE}-\\x{1E5EF}"},
    {"Lu",
     "\\x{1C89}\\x{A7CB}-\\x{A7CC}\\x{A7DA}\\x{A7DC}\\x{10D50}-\\x{10D65}"},
    {"Ll",
     "\\x{1C8A}\\x{A7CD}\\x{A7DB}\\x{10D70}-\\x{10D85}\\x{1DF25}-\\x{1DF2A}"},
    {"Lm",
     "\\x{10D4E}\\x{10D6F}\\x{16D40}-\\x{16D42}\\x{16D6B}-\\x{16D6C}\\x{1E030}-\\x{1E06D}\\x{1E4EB}"},
    {"Lo",
     "\\x{105C0}-\\x{105F3}\\x{10D4A}-\\x{10D4D}\\x{10D4F}\\x{10EC2}-\\x{10EC4}\\x{1123F}-\\x{11240}"
     "\\x{11380}-\\x{11389}\\x{1138B}\\x{1138E}\\x{11390}-\\x{113B5}\\x{113B7}\\x{113D1}\\x{113D3}"
     "\\x{11BC0}-\\x{11BE0}\\x{11F02}\\x{11F04}-\\x{11F10}\\x{11F12}-\\x{11F33}\\x{1342F}"
     "\\x{13441}-\\x{13446}\\x{13460}-\\x{143FA}\\x{16100}-\\x{1611D}\\x{16D43}-\\x{16D6A}\\x{18CFF}"
     "\\x{1B132}\\x{1B155}\\x{1E4D0}-\\x{1E4EA}\\x{1E5D0}-\\x{1E5ED}\\x{1E5F0}\\x{2B739}"
     "\\x{2EBF0}-\\x{2EE5D}\\x{31350}-\\x{323AF}"},
    {"Nd",
     "\\x{10D40}-\\x{10D49}\\x{116D0}-\\x{116E3}\\x{11BF0}-\\x{11BF9}\\x{11F50}-\\x{11F59}"
     "\\x{16130}-\\x{16139}\\x{16D70}-\\x{16D79}\\x{1CCF0}-\\x{1CCF9}\\x{1E4F0}-\\x{1E4F9}"
     "\\x{1E5F1}-\\x{1E5FA}"},
};

typedef struct ks_rx { pcre2_code *code; } ks_rx;

/* per-call matching state (match data, JIT stack): encode/decode stay thread-safe */
typedef struct rxctx { pcre2_match_data *md; pcre2_match_context *mc; pcre2_jit_stack *js; } rxctx;

static void rxctx_free(rxctx *c) {
    if (c->md) pcre2_match_data_free(c->md);
    if (c->mc) pcre2_match_context_free(c->mc);
    if (c->js) pcre2_jit_stack_free(c->js);
    memset(c, 0, sizeof *c);
}

static ks_status rx_compile(const char *pat, size_t len, ks_rx **out) {
    *out = NULL;
    sbuf p = {0};
    int in_class = 0;
    for (size_t i = 0; i < len; i++) {
        char c = pat[i];
        int r = 0;
        if (c == '\\' && i + 1 < len) {
            char d = pat[i + 1];
            i++;
            const char *name = NULL, *extra = NULL;
            size_t nlen = 0, skip = 0;
            if ((d == 'p' || d == 'P') && i + 1 < len) { /* \p{Name} or \pX */
                if (pat[i + 1] == '{') {
                    const char *e = memchr(pat + i + 2, '}', len - i - 2);
                    if (e) { name = pat + i + 2; nlen = (size_t)(e - name); skip = nlen + 2; }
                } else { name = pat + i + 1; nlen = 1; skip = 1; }
            } else if (d == 'd' || d == 'D') { name = "Nd"; nlen = 2; }
            for (size_t k = 0; name && k < sizeof UPROPS / sizeof UPROPS[0]; k++)
                if (strlen(UPROPS[k].name) == nlen && !memcmp(UPROPS[k].name, name, nlen)) extra = UPROPS[k].extra;
            int neg = d == 'P' || d == 'D';
            if (extra && !(in_class && neg)) { /* a class of the property plus what PCRE2 lacks */
                if (!in_class) r |= sb_put(&p, neg ? "[^" : "[", neg ? 2 : 1);
                if (d == 'd' || d == 'D') r |= sb_put(&p, "\\d", 2);
                else { r |= sb_put(&p, "\\p", 2); r |= sb_put(&p, pat + i + 1, skip); }
                r |= sb_put(&p, extra, strlen(extra));
                if (!in_class) r |= sb_put(&p, "]", 1);
                i += skip;
            } else if (d == 's') r = in_class ? sb_put(&p, WS_SET, strlen(WS_SET)) : sb_put(&p, "[" WS_SET "]", strlen(WS_SET) + 2);
            else if (d == 'S' && !in_class) r = sb_put(&p, "[^" WS_SET "]", strlen(WS_SET) + 3);
            else if (d == 'Q') { /* quoted literal up to \E: copy through */
                const char *e = NULL;
                for (size_t j = i + 1; j + 1 < len; j++)
                    if (pat[j] == '\\' && pat[j + 1] == 'E') { e = pat + j; break; }
                size_t stop = e ? (size_t)(e - pat) + 2 : len;
                r = sb_put(&p, pat + i - 1, stop - (i - 1));
                i = stop - 1;
            } else {
                char two[2] = {c, d};
                r = sb_put(&p, two, 2);
            }
        } else if (in_class) {
            if (c == '[' && i + 1 < len && pat[i + 1] == ':') { /* POSIX class [:name:] */
                const char *e = NULL;
                for (size_t j = i + 2; j + 1 < len; j++)
                    if (pat[j] == ':' && pat[j + 1] == ']') { e = pat + j; break; }
                size_t stop = e ? (size_t)(e - pat) + 2 : i + 1;
                r = sb_put(&p, pat + i, stop - i);
                i = stop - 1;
            } else {
                if (c == ']') in_class = 0;
                r = sb_put(&p, &c, 1);
            }
        } else {
            r = sb_put(&p, &c, 1);
            if (c == '[') { /* a ']' right after '[' or '[^' is a literal */
                in_class = 1;
                if (i + 1 < len && pat[i + 1] == '^') { r |= sb_put(&p, "^", 1); i++; }
                if (i + 1 < len && pat[i + 1] == ']') { r |= sb_put(&p, "]", 1); i++; }
            }
        }
        if (r) { sb_free(&p); return KS_ERR_OOM; }
    }
    if (!p.p && sb_put(&p, "", 0)) return KS_ERR_OOM;
    int err;
    PCRE2_SIZE eoff;
    pcre2_code *code = pcre2_compile((PCRE2_SPTR)p.p, p.n, PCRE2_UTF | PCRE2_UCP | PCRE2_MULTILINE, &err, &eoff, NULL);
    sb_free(&p);
    if (!code) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(err, msg, sizeof msg);
        return ks_errorf(KS_ERR_FORMAT, "cannot compile regex /%.*s/: %s", (int)KS_MIN(len, 200), pat, (char *)msg);
    }
    pcre2_jit_compile(code, PCRE2_JIT_COMPLETE); /* optional: the interpreter is the fallback */
    ks_rx *rx = ks_calloc(1, sizeof *rx);
    if (!rx) { pcre2_code_free(code); return KS_ERR_OOM; }
    rx->code = code;
    *out = rx;
    return KS_OK;
}

static void rx_free(ks_rx *rx) {
    if (!rx) return;
    pcre2_code_free(rx->code);
    free(rx);
}

/* First match at or after `from`: 1 found, 0 none, -1 error (recorded). */
static int rx_search(const ks_rx *rx, rxctx *c, const char *s, size_t n, size_t from, size_t *ms, size_t *me) {
    if (!c->md) {
        c->md = pcre2_match_data_create(1, NULL);
        c->mc = pcre2_match_context_create(NULL);
        c->js = pcre2_jit_stack_create(32 * 1024, 16 * 1024 * 1024, NULL);
        if (!c->md || !c->mc) { ks_errorf(KS_ERR_OOM, "out of memory for regex matching"); return -1; }
        if (c->js) pcre2_jit_stack_assign(c->mc, NULL, c->js);
    }
    int rc = pcre2_match(rx->code, (PCRE2_SPTR)s, n, from, PCRE2_NO_UTF_CHECK, c->md, c->mc);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT)
        rc = pcre2_match(rx->code, (PCRE2_SPTR)s, n, from, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, c->md, c->mc);
    if (rc == PCRE2_ERROR_NOMATCH) return 0;
    if (rc < 0) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(rc, msg, sizeof msg);
        ks_errorf(KS_ERR_ARG, "regex matching failed at byte %zu of a %zu-byte piece: %s", from, n, (char *)msg);
        return -1;
    }
    PCRE2_SIZE *ov = pcre2_get_ovector_pointer(c->md);
    *ms = ov[0];
    *me = ov[1];
    return 1;
}

/* ---------------------------------------------------------------- patterns
 * find_matches: spans covering the whole string, each a match or a gap, in order (HF's
 * Pattern::find_matches). Three kinds of pattern: regex, literal string, char predicate. */

typedef struct pattern { const ks_rx *rx; const char *lit; size_t lit_len; int (*pred)(uint32_t, const void *); const void *arg; } pattern;

static ks_status find_matches(const pattern *pt, rxctx *c, const char *s, size_t n, vec *out) {
    out->n = 0;
    if (n == 0) return push_span(out, 0, 0, 0) ? KS_ERR_OOM : KS_OK;
    size_t prev = 0;
    if (pt->rx) { /* iteration as in the onig/regex crates: no empty match right after a match */
        size_t pos = 0, last = 0, ms, me;
        int have_last = 0;
        while (pos <= n) {
            int r = rx_search(pt->rx, c, s, n, pos, &ms, &me);
            if (r < 0) return KS_ERR_ARG;
            if (r == 0) break;
            if (ms == me) {
                pos = me + (me < n ? u8_len((unsigned char)s[me]) : 1);
                if (have_last && last == me) continue;
            } else pos = me;
            have_last = 1;
            last = me;
            if (prev != ms && push_span(out, prev, ms, 0)) return KS_ERR_OOM;
            if (push_span(out, ms, me, 1)) return KS_ERR_OOM;
            prev = me;
        }
    } else if (pt->lit) {
        size_t pos = 0;
        while (pos + pt->lit_len <= n) {
            const char *f = memmem(s + pos, n - pos, pt->lit, pt->lit_len);
            if (!f) break;
            size_t ms = (size_t)(f - s), me = ms + pt->lit_len;
            if (prev != ms && push_span(out, prev, ms, 0)) return KS_ERR_OOM;
            if (push_span(out, ms, me, 1)) return KS_ERR_OOM;
            prev = pos = me;
        }
    } else {
        size_t i = 0, l;
        while (i < n) {
            uint32_t cp = u8_dec((const unsigned char *)s + i, &l);
            if (pt->pred(cp, pt->arg)) {
                if (prev < i && push_span(out, prev, i, 0)) return KS_ERR_OOM;
                if (push_span(out, i, i + l, 1)) return KS_ERR_OOM;
                prev = i + l;
            }
            i += l;
        }
    }
    if (prev != n && push_span(out, prev, n, 0)) return KS_ERR_OOM;
    return KS_OK;
}

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

/* ================================================================ normalizers */

static ks_status norm_apply(const knorm *nm, rxctx *c, const char *in, size_t n, sbuf *out);
static int norm_inert(uint32_t c);
static ks_status unicode_norm(const char *in, size_t n, int opt, sbuf *out);

static ks_status norm_one(const knorm *nm, rxctx *c, const char *in, size_t n, sbuf *out) {
    switch (nm->type) {
    case N_SEQ: {
        sbuf a = {0}, b = {0};
        if (sb_put(&a, in, n)) return KS_ERR_OOM;
        for (size_t i = 0; i < nm->nk; i++) {
            b.n = 0;
            ks_status st = norm_apply(&nm->kids[i], c, a.p, a.n, &b);
            if (st) { sb_free(&a); sb_free(&b); return st; }
            sbuf t = a; a = b; b = t;
        }
        int r = sb_put(out, a.p, a.n);
        sb_free(&a);
        sb_free(&b);
        return r ? KS_ERR_OOM : KS_OK;
    }
    case N_NFC: case N_NFD: case N_NFKC: case N_NFKD: {
        int opt = UTF8PROC_STABLE;
        opt |= (nm->type == N_NFC || nm->type == N_NFKC) ? UTF8PROC_COMPOSE : UTF8PROC_DECOMPOSE;
        if (nm->type == N_NFKC || nm->type == N_NFKD) opt |= UTF8PROC_COMPAT;
        /* characters HF's tables do not know are inert starters: normalize around them */
        size_t i = 0, run = 0, l;
        while (i <= n) {
            if (i < n && !norm_inert(u8_dec((const unsigned char *)in + i, &l))) { i += l; continue; }
            ks_status st = unicode_norm(in + run, i - run, opt, out);
            if (st) return st;
            if (i == n) break;
            if (sb_put(out, in + i, l)) return KS_ERR_OOM;
            i += l;
            run = i;
        }
        return KS_OK;
    }
    case N_PREPEND:
        if (n && sb_put(out, nm->a, nm->alen)) return KS_ERR_OOM;
        return sb_put(out, in, n) ? KS_ERR_OOM : KS_OK;
    case N_REPLACE: {
        vec m = {.isz = sizeof(span)};
        pattern pt = {.rx = nm->rx, .lit = nm->a, .lit_len = nm->alen};
        ks_status st = find_matches(&pt, c, in, n, &m);
        for (size_t i = 0; !st && i < m.n; i++) {
            span *x = (span *)m.v + i;
            if (x->m ? sb_put(out, nm->b, nm->blen) : sb_put(out, in + x->s, x->e - x->s)) st = KS_ERR_OOM;
        }
        vec_free(&m);
        return st;
    }
    case N_STRIP: {
        size_t s = 0, e = n, l;
        if (nm->left)
            while (s < e && is_ws(u8_dec((const unsigned char *)in + s, &l))) s += l;
        if (nm->right)
            while (e > s) {
                size_t b = e - 1;
                while (b > s && ((unsigned char)in[b] & 0xC0) == 0x80) b--;
                if (!is_ws(u8_dec((const unsigned char *)in + b, &l))) break;
                e = b;
            }
        return sb_put(out, in + s, e - s) ? KS_ERR_OOM : KS_OK;
    }
    }
    return ks_errorf(KS_ERR_INTERNAL, "unknown normalizer kind %d", nm->type);
}

/* HF normalizes with the tables of the `unicode-normalization-alignments` crate, which
 * predate Unicode 11: characters utf8proc (Unicode 15) normalizes but those tables do not
 * know are, for HF, starters without decomposition or composition. Measured over every code
 * point (alone, after "a" before U+0301, before U+0308 U+0323) in NFC/NFD/NFKC/NFKD. */
static int norm_inert(uint32_t c) {
    static const uint32_t r[][2] = {
        {0x7FD, 0x7FD}, {0x898, 0x89F}, {0x8CA, 0x8D3}, {0x9FE, 0x9FE}, {0xC3C, 0xC3C}, {0xD3B, 0xD3C},
        {0xEBA, 0xEBA}, {0x1715, 0x1715}, {0x1ABF, 0x1ACE}, {0x1DF6, 0x1DFA}, {0x32FF, 0x32FF},
        {0xA7F2, 0xA7F4}, {0xA82C, 0xA82C}, {0xAB69, 0xAB69}, {0x10781, 0x10785}, {0x10787, 0x107B0},
        {0x107B2, 0x107BA}, {0x10D24, 0x10D27}, {0x10EAB, 0x10EAC}, {0x10EFD, 0x10EFF}, {0x10F46, 0x10F50},
        {0x10F82, 0x10F85}, {0x11070, 0x11070}, {0x1133B, 0x1133B}, {0x1145E, 0x1145E}, {0x11839, 0x1183A},
        {0x11938, 0x11938}, {0x1193D, 0x1193E}, {0x11943, 0x11943}, {0x119E0, 0x119E0}, {0x11A34, 0x11A34},
        {0x11A47, 0x11A47}, {0x11A99, 0x11A99}, {0x11D42, 0x11D42}, {0x11D44, 0x11D45}, {0x11D97, 0x11D97},
        {0x11F41, 0x11F42}, {0x16FF0, 0x16FF1}, {0x1E030, 0x1E06D}, {0x1E08F, 0x1E08F}, {0x1E130, 0x1E136},
        {0x1E2AE, 0x1E2AE}, {0x1E2EC, 0x1E2EF}, {0x1E4EC, 0x1E4EF}, {0x1F16C, 0x1F16C}, {0x1FBF0, 0x1FBF9}};
    if (c < 0x7FD) return 0;
    size_t lo = 0, hi = sizeof r / sizeof r[0];
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (c < r[mid][0]) hi = mid;
        else if (c > r[mid][1]) lo = mid + 1;
        else return 1;
    }
    return 0;
}

static ks_status unicode_norm(const char *in, size_t n, int opt, sbuf *out) {
    if (n == 0) return KS_OK;
    utf8proc_uint8_t *dst = NULL;
    utf8proc_ssize_t r = utf8proc_map((const utf8proc_uint8_t *)in, (utf8proc_ssize_t)n, &dst, (utf8proc_option_t)opt);
    if (r < 0) return ks_errorf(KS_ERR_ARG, "unicode normalization failed: %s", utf8proc_errmsg(r));
    int e = sb_put(out, dst, (size_t)r);
    free(dst);
    return e ? KS_ERR_OOM : KS_OK;
}

/* Appends the normalized form of in[0..n) to out. A NULL normalizer copies. */
static ks_status norm_apply(const knorm *nm, rxctx *c, const char *in, size_t n, sbuf *out) {
    if (!nm) return sb_put(out, in, n) ? KS_ERR_OOM : KS_OK;
    return norm_one(nm, c, in, n, out);
}

/* ================================================================ pre-tokenizers */

/* working state of one encode call */
typedef struct ectx {
    rxctx rc;
    vec spans;     /* span scratch */
    vec spans2;
    sbuf tmp;
    vec syms, heap; /* BPE scratch */
    sbuf word;     /* BPE: prefixed/suffixed char */
} ectx;

static void ectx_free(ectx *c) {
    rxctx_free(&c->rc);
    vec_free(&c->spans);
    vec_free(&c->spans2);
    sb_free(&c->tmp);
    vec_free(&c->syms);
    vec_free(&c->heap);
    sb_free(&c->word);
}

static int push_piece(vec *pcs, size_t off, size_t len, int first) {
    piece *p = vec_push(pcs);
    if (!p) return -1;
    p->off = off; p->len = len; p->first = first;
    return 0;
}

/* HF NormalizedString::split: turn find_matches spans into pieces per behaviour. Reads
 * `m` (spans of a string at `base` in `src`) and appends the kept pieces to out/opcs. */
static ks_status split_by_behavior(vec *m, int behavior, int invert, const char *src, size_t base, int first,
                                   sbuf *out, vec *opcs, vec *tmp) {
    span *v = m->v;
    if (invert)
        for (size_t i = 0; i < m->n; i++) v[i].m = !v[i].m;
    tmp->n = 0;
    /* tmp: (s, e, remove) */
    switch (behavior) {
    case B_ISOLATED:
        for (size_t i = 0; i < m->n; i++) if (push_span(tmp, v[i].s, v[i].e, 0)) return KS_ERR_OOM;
        break;
    case B_REMOVED:
        for (size_t i = 0; i < m->n; i++) if (push_span(tmp, v[i].s, v[i].e, v[i].m)) return KS_ERR_OOM;
        break;
    case B_CONTIGUOUS: {
        int prevm = 0;
        for (size_t i = 0; i < m->n; i++) {
            if (v[i].m == prevm && tmp->n) ((span *)tmp->v)[tmp->n - 1].e = v[i].e;
            else if (push_span(tmp, v[i].s, v[i].e, 0)) return KS_ERR_OOM;
            prevm = v[i].m;
        }
        break;
    }
    case B_MERGED_PREV: {
        int prevm = 0;
        for (size_t i = 0; i < m->n; i++) {
            if (v[i].m && !prevm && tmp->n) ((span *)tmp->v)[tmp->n - 1].e = v[i].e;
            else if (push_span(tmp, v[i].s, v[i].e, 0)) return KS_ERR_OOM;
            prevm = v[i].m;
        }
        break;
    }
    case B_MERGED_NEXT: {
        int prevm = 0;
        for (size_t k = m->n; k-- > 0;) {
            if (v[k].m && !prevm && tmp->n) ((span *)tmp->v)[tmp->n - 1].s = v[k].s;
            else if (push_span(tmp, v[k].s, v[k].e, 0)) return KS_ERR_OOM;
            prevm = v[k].m;
        }
        span *t = tmp->v; /* reverse into order */
        for (size_t i = 0, j = tmp->n ? tmp->n - 1 : 0; i < j; i++, j--) { span x = t[i]; t[i] = t[j]; t[j] = x; }
        break;
    }
    }
    span *t = tmp->v;
    for (size_t i = 0; i < tmp->n; i++) {
        if (t[i].m || t[i].e == t[i].s) continue;
        size_t off = out->n;
        if (sb_put(out, src + base + t[i].s, t[i].e - t[i].s)) return KS_ERR_OOM;
        if (push_piece(opcs, off, t[i].e - t[i].s, first && t[i].s == 0)) return KS_ERR_OOM;
    }
    return KS_OK;
}

static int pred_char(uint32_t c, const void *arg) { return c == *(const uint32_t *)arg; }
static int pred_numeric(uint32_t c, const void *arg) { (void)arg; return is_numeric(c); }

static const char GPT2_PATTERN[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

/* One stage: (buf, pcs) -> (buf, pcs). */
static ks_status pre_apply(const ks_tokenizer *t, const kpre *p, ectx *c, sbuf *buf, vec *pcs) {
    if (p->type == P_SEQ) {
        for (size_t i = 0; i < p->nk; i++) {
            ks_status st = pre_apply(t, &p->kids[i], c, buf, pcs);
            if (st) return st;
        }
        return KS_OK;
    }
    sbuf out = {0};
    vec opcs = {.isz = sizeof(piece)};
    ks_status st = KS_OK;
    if (sb_put(&out, "", 0)) return KS_ERR_OOM;
    for (size_t i = 0; !st && i < pcs->n; i++) {
        piece pc = ((piece *)pcs->v)[i];
        const char *s = buf->p + pc.off;
        switch (p->type) {
        case P_BYTELEVEL: {
            /* optional prefix space, optional GPT-2 split, then bytes -> unicode chars */
            c->tmp.n = 0;
            if (p->add_prefix_space && !(pc.len && s[0] == ' ') && sb_put(&c->tmp, " ", 1)) { st = KS_ERR_OOM; break; }
            if (sb_put(&c->tmp, s, pc.len)) { st = KS_ERR_OOM; break; }
            c->spans.n = 0;
            if (p->use_regex) {
                pattern pt = {.rx = p->rx};
                st = find_matches(&pt, &c->rc, c->tmp.p, c->tmp.n, &c->spans);
                if (st) break;
            } else if (push_span(&c->spans, 0, c->tmp.n, 0)) { st = KS_ERR_OOM; break; }
            for (size_t k = 0; k < c->spans.n; k++) {
                span x = ((span *)c->spans.v)[k];
                if (x.e == x.s) continue;
                size_t off = out.n;
                for (size_t j = x.s; j < x.e; j++) {
                    unsigned char b = (unsigned char)c->tmp.p[j];
                    if (sb_put(&out, t->bl_enc[b], t->bl_len[b])) { st = KS_ERR_OOM; break; }
                }
                if (st || push_piece(&opcs, off, out.n - off, pc.first && x.s == 0)) { st = st ? st : KS_ERR_OOM; break; }
            }
            break;
        }
        case P_SPLIT: {
            pattern pt = {.rx = p->rx, .lit = p->lit, .lit_len = p->lit_len};
            st = find_matches(&pt, &c->rc, s, pc.len, &c->spans);
            if (!st) st = split_by_behavior(&c->spans, p->behavior, p->invert, buf->p, pc.off, pc.first, &out, &opcs, &c->spans2);
            break;
        }
        case P_DIGITS: {
            pattern pt = {.pred = pred_numeric};
            st = find_matches(&pt, &c->rc, s, pc.len, &c->spans);
            if (!st) st = split_by_behavior(&c->spans, p->individual ? B_ISOLATED : B_CONTIGUOUS, 0, buf->p, pc.off,
                                            pc.first, &out, &opcs, &c->spans2);
            break;
        }
        case P_METASPACE: {
            /* replace ' ' by the replacement, prepend it per scheme, then split before each one */
            c->tmp.n = 0;
            /* after the replacement, does the piece start with the replacement char? */
            int starts = (pc.len && s[0] == ' ') || (pc.len >= p->repl_len && memcmp(s, p->repl, p->repl_len) == 0);
            int prepend = p->scheme == PS_ALWAYS ? !starts : p->scheme == PS_FIRST ? (!starts && pc.first) : 0;
            if (prepend && sb_put(&c->tmp, p->repl, p->repl_len)) { st = KS_ERR_OOM; break; }
            for (size_t j = 0; j < pc.len; j++) {
                if (s[j] == ' ' ? sb_put(&c->tmp, p->repl, p->repl_len) : sb_put(&c->tmp, s + j, 1)) { st = KS_ERR_OOM; break; }
            }
            if (st) break;
            if (p->split) {
                pattern pt = {.pred = pred_char, .arg = &p->repl_cp};
                st = find_matches(&pt, &c->rc, c->tmp.p, c->tmp.n, &c->spans);
                if (!st) st = split_by_behavior(&c->spans, B_MERGED_NEXT, 0, c->tmp.p, 0, pc.first, &out, &opcs, &c->spans2);
            } else if (c->tmp.n) {
                size_t off = out.n;
                if (sb_put(&out, c->tmp.p, c->tmp.n) || push_piece(&opcs, off, c->tmp.n, pc.first)) st = KS_ERR_OOM;
            }
            break;
        }
        default:
            st = ks_errorf(KS_ERR_INTERNAL, "unknown pre-tokenizer kind %d", p->type);
        }
    }
    if (st) { sb_free(&out); vec_free(&opcs); return st; }
    sb_free(buf);
    *buf = out;
    vec_free(pcs);
    *pcs = opcs;
    return KS_OK;
}

/* ================================================================ BPE model */

typedef struct sym { int32_t c, prev, next; uint32_t len; } sym;
typedef struct hent { uint32_t rank, pos; int32_t nid; } hent;

static int hless(const hent *a, const hent *b) { return a->rank != b->rank ? a->rank < b->rank : a->pos < b->pos; }

/* a 4-ary min-heap (shallower than a binary one: fewer cache misses on long words) */
static int heap_push(vec *h, hent e) {
    hent *x = vec_push(h);
    if (!x) return -1;
    hent *v = h->v;
    size_t i = h->n - 1;
    while (i > 0) {
        size_t p = (i - 1) / 4;
        if (!hless(&e, &v[p])) break;
        v[i] = v[p];
        i = p;
    }
    v[i] = e;
    return 0;
}
static hent heap_pop(vec *h) {
    hent *v = h->v, top = v[0], e = v[--h->n];
    size_t i = 0, n = h->n;
    for (;;) {
        size_t c = 4 * i + 1, m = i;
        const hent *best = &e;
        for (size_t k = c; k < c + 4 && k < n; k++)
            if (hless(&v[k], best)) { m = k; best = &v[k]; }
        if (m == i) break;
        v[i] = v[m];
        i = m;
    }
    if (n) v[i] = e;
    return top;
}

static int add_sym(vec *syms, int32_t c, uint32_t len) {
    sym *v;
    size_t n = syms->n;
    if (!(v = vec_push(syms))) return -1;
    v->c = c; v->len = len; v->next = -1;
    v->prev = n ? (int32_t)n - 1 : -1;
    if (n) ((sym *)syms->v)[n - 1].next = (int32_t)n;
    return 0;
}

/* Tokenize one pre-token w[0..n) with the BPE model, appending ids. */
static ks_status bpe_word(const ks_tokenizer *t, ectx *c, const char *w, size_t n, vec *ids) {
    if (n == 0) return KS_OK;
    const char *A = ARENA(t);
    if (t->ignore_merges) {
        int32_t id = sm_get(&t->vocab, A, w, n);
        if (id >= 0) return push_id(ids, id) ? KS_ERR_OOM : KS_OK;
    }
    vec *syms = &c->syms;
    syms->n = 0;
    int32_t unk_id = -1;
    uint32_t unk_len = 0;
    int have_unk = 0;
    size_t i = 0;
    while (i < n) {
        size_t cl = u8_len((unsigned char)w[i]);
        const char *s = w + i;
        size_t sl = cl;
        if ((t->has_prefix && i > 0) || (t->has_suffix && i + cl == n)) {
            c->word.n = 0;
            if ((t->has_prefix && i > 0 && sb_put(&c->word, A + t->prefix_off, t->prefix_len)) ||
                sb_put(&c->word, w + i, cl) ||
                (t->has_suffix && i + cl == n && sb_put(&c->word, A + t->suffix_off, t->suffix_len)))
                return KS_ERR_OOM;
            s = c->word.p;
            sl = c->word.n;
        }
        int32_t id = sm_get(&t->vocab, A, s, sl);
        if (id >= 0) {
            if (have_unk) { if (add_sym(syms, unk_id, unk_len)) return KS_ERR_OOM; have_unk = 0; }
            if (add_sym(syms, id, (uint32_t)cl)) return KS_ERR_OOM;
        } else {
            int done = 0;
            if (t->byte_fallback) {
                size_t k = 0;
                while (k < sl && t->byte_id[(unsigned char)s[k]] >= 0) k++;
                if (k == sl) {
                    for (k = 0; k < sl; k++)
                        if (add_sym(syms, t->byte_id[(unsigned char)s[k]], 1)) return KS_ERR_OOM;
                    done = 1;
                }
            }
            if (!done && t->has_unk) {
                int32_t uid = sm_get(&t->vocab, A, A + t->unk_off, t->unk_len);
                if (uid < 0)
                    return ks_errorf(KS_ERR_FORMAT, "tokenizer unk_token \"%s\" is not in the vocab", A + t->unk_off);
                if (have_unk && t->fuse_unk) unk_len += (uint32_t)cl;
                else {
                    if (have_unk && add_sym(syms, unk_id, unk_len)) return KS_ERR_OOM;
                    unk_id = uid;
                    unk_len = (uint32_t)cl;
                    have_unk = 1;
                }
            }
        }
        i += cl;
    }
    if (have_unk && add_sym(syms, unk_id, unk_len)) return KS_ERR_OOM;

    /* merge: lowest rank first, leftmost on ties; stale entries are skipped */
    vec *h = &c->heap;
    h->n = 0;
    sym *v = syms->v;
    uint32_t rank;
    int32_t nid;
    for (size_t k = 0; k + 1 < syms->n; k++)
        if (pm_get(&t->merges, v[k].c, v[k + 1].c, &rank, &nid) &&
            heap_push(h, (hent){rank, (uint32_t)k, nid})) return KS_ERR_OOM;
    while (h->n) {
        hent top = heap_pop(h);
        sym *cur = &v[top.pos];
        if (cur->len == 0 || cur->next == -1) continue;
        sym *right = &v[cur->next];
        if (!pm_get(&t->merges, cur->c, right->c, &rank, &nid) || nid != top.nid) continue;
        int32_t rnext = right->next;
        cur->c = top.nid;
        cur->len += right->len;
        cur->next = rnext;
        right->len = 0;
        if (rnext >= 0) v[rnext].prev = (int32_t)top.pos;
        if (cur->prev >= 0 && pm_get(&t->merges, v[cur->prev].c, cur->c, &rank, &nid) &&
            heap_push(h, (hent){rank, (uint32_t)cur->prev, nid})) return KS_ERR_OOM;
        if (cur->next >= 0 && pm_get(&t->merges, cur->c, v[cur->next].c, &rank, &nid) &&
            heap_push(h, (hent){rank, top.pos, nid})) return KS_ERR_OOM;
    }
    for (size_t k = 0; k < syms->n; k++)
        if (v[k].len && push_id(ids, v[k].c)) return KS_ERR_OOM;
    return KS_OK;
}

/* ================================================================ added tokens */

static int trie_node(trie *tr, uint8_t byte) {
    if (tr->n == tr->cap) {
        size_t cap = tr->cap ? tr->cap * 2 : 64;
        tnode *q = ks_realloc(tr->v, cap * sizeof *q);
        if (!q) return -1;
        tr->v = q;
        tr->cap = cap;
    }
    tr->v[tr->n] = (tnode){-1, -1, -1, byte};
    return (int)tr->n++;
}

static int trie_insert(trie *tr, const char *s, size_t n, int32_t tok) {
    if (n == 0) return 0;
    if (tr->n == 0) for (int i = 0; i < 256; i++) tr->root[i] = -1;
    uint8_t b0 = (uint8_t)s[0];
    if (tr->root[b0] < 0) {
        int k = trie_node(tr, b0);
        if (k < 0) return -1;
        tr->root[b0] = k;
    }
    int32_t cur = tr->root[b0];
    for (size_t i = 1; i < n; i++) {
        uint8_t b = (uint8_t)s[i];
        int32_t ch = tr->v[cur].child;
        while (ch >= 0 && tr->v[ch].byte != b) ch = tr->v[ch].sibling;
        if (ch < 0) {
            int k = trie_node(tr, b);
            if (k < 0) return -1;
            tr->v[k].sibling = tr->v[cur].child;
            tr->v[cur].child = k;
            ch = k;
        }
        cur = ch;
    }
    tr->v[cur].tok = tok;
    return 0;
}

/* Longest token starting at s[i]: returns its length (0 if none) and index. */
static size_t trie_longest(const trie *tr, const char *s, size_t n, size_t i, int32_t *tok) {
    if (tr->n == 0) return 0;
    int32_t cur = tr->root[(uint8_t)s[i]];
    size_t best = 0, k = i + 1;
    while (cur >= 0) {
        if (tr->v[cur].tok >= 0) { best = k - i; *tok = tr->v[cur].tok; }
        if (k >= n) break;
        uint8_t b = (uint8_t)s[k++];
        int32_t ch = tr->v[cur].child;
        while (ch >= 0 && tr->v[ch].byte != b) ch = tr->v[ch].sibling;
        cur = ch;
    }
    return best;
}

static uint32_t last_char(const char *s, size_t n) {
    size_t b = n - 1, l;
    while (b > 0 && ((unsigned char)s[b] & 0xC0) == 0x80) b--;
    return u8_dec((const unsigned char *)s + b, &l);
}

/* HF AddedVocabulary::find_matches: spans of s with m = token index + 1 (0 for text). */
static ks_status find_added(const ks_tokenizer *t, const trie *tr, const char *s, size_t n, vec *out) {
    out->n = 0;
    size_t start_off = 0, pos = 0, l;
    while (tr->n && pos < n) {
        int32_t tok = -1;
        size_t mlen = 0, ms = pos;
        for (; ms < n; ms++)
            if ((mlen = trie_longest(tr, s, n, ms, &tok))) break;
        if (!mlen) break;
        size_t start = ms, stop = ms + mlen;
        pos = stop;
        const addtok *a = &t->added[tok];
        if (a->single_word) {
            int start_space = start == 0 || !is_word(last_char(s, start));
            int stop_space = stop == n || !is_word(u8_dec((const unsigned char *)s + stop, &l));
            if (!start_space || !stop_space) continue;
        }
        if (a->lstrip) {
            size_t ns = start;
            while (ns > 0) {
                size_t b = ns - 1;
                while (b > 0 && ((unsigned char)s[b] & 0xC0) == 0x80) b--;
                if (!is_ws(u8_dec((const unsigned char *)s + b, &l))) break;
                ns = b;
            }
            start = KS_MAX(ns, start_off);
        }
        if (a->rstrip)
            while (stop < n && is_ws(u8_dec((const unsigned char *)s + stop, &l))) stop += l;
        if (start_off < start && push_span(out, start_off, start, 0)) return KS_ERR_OOM;
        if (push_span(out, start, stop, tok + 1)) return KS_ERR_OOM;
        start_off = stop;
    }
    if (start_off != n && push_span(out, start_off, n, 0)) return KS_ERR_OOM;
    return KS_OK;
}

/* ================================================================ encode */

/* normalized segment -> pre-tokenizer -> model */
static ks_status encode_plain(const ks_tokenizer *t, ectx *c, const char *s, size_t n, int first, vec *ids) {
    sbuf buf = {0};
    vec pcs = {.isz = sizeof(piece)};
    ks_status st = KS_OK;
    if (sb_put(&buf, s, n) || push_piece(&pcs, 0, n, first)) st = KS_ERR_OOM;
    if (!st && t->pre) st = pre_apply(t, t->pre, c, &buf, &pcs);
    for (size_t i = 0; !st && i < pcs.n; i++) {
        piece *p = (piece *)pcs.v + i;
        st = bpe_word(t, c, buf.p + p->off, p->len, ids);
    }
    sb_free(&buf);
    vec_free(&pcs);
    return st;
}

static ks_status encode_text(const ks_tokenizer *t, ectx *c, const char *text, size_t len, vec *ids) {
    vec seg = {.isz = sizeof(span)}, seg2 = {.isz = sizeof(span)};
    sbuf nbuf = {0};
    ks_status st = find_added(t, &t->trie_raw, text, len, &seg);
    for (size_t i = 0; !st && i < seg.n; i++) {
        span x = ((span *)seg.v)[i];
        if (x.e == x.s) continue;
        if (x.m) { if (push_id(ids, t->added[x.m - 1].id)) st = KS_ERR_OOM; continue; }
        nbuf.n = 0;
        if (sb_put(&nbuf, "", 0)) { st = KS_ERR_OOM; break; }
        st = norm_apply(t->norm, &c->rc, text + x.s, x.e - x.s, &nbuf);
        if (!st) st = find_added(t, &t->trie_norm, nbuf.p, nbuf.n, &seg2);
        for (size_t k = 0; !st && k < seg2.n; k++) {
            span y = ((span *)seg2.v)[k];
            if (y.e == y.s) continue;
            if (y.m) { if (push_id(ids, t->added[y.m - 1].id)) st = KS_ERR_OOM; continue; }
            st = encode_plain(t, c, nbuf.p + y.s, y.e - y.s, x.s == 0 && y.s == 0, ids);
        }
    }
    vec_free(&seg);
    vec_free(&seg2);
    sb_free(&nbuf);
    return st;
}

static ks_status post_apply(const kpost *p, int add_special, vec *ids) {
    if (p->is_seq) {
        for (size_t i = 0; i < p->nk; i++) {
            ks_status st = post_apply(&p->kids[i], add_special, ids);
            if (st) return st;
        }
        return KS_OK;
    }
    if (!p->items) return KS_OK; /* ByteLevel: offsets only */
    vec out = {.isz = sizeof(int32_t)};
    for (size_t i = 0; i < p->n; i++) {
        if (p->items[i] < 0) {
            for (size_t k = 0; k < ids->n; k++)
                if (push_id(&out, ((int32_t *)ids->v)[k])) { vec_free(&out); return KS_ERR_OOM; }
        } else if (add_special && push_id(&out, p->items[i])) { vec_free(&out); return KS_ERR_OOM; }
    }
    vec_free(ids);
    *ids = out;
    ids->isz = sizeof(int32_t);
    return KS_OK;
}

ks_status ks_tokenizer_encode(const ks_tokenizer *tok, const char *text, size_t len, int add_special,
                              int32_t **ids, size_t *n_ids) {
    if (!ids || !n_ids) return ks_errorf(KS_ERR_ARG, "ks_tokenizer_encode: NULL output pointer");
    *ids = NULL;
    *n_ids = 0;
    if (!tok) return ks_errorf(KS_ERR_ARG, "ks_tokenizer_encode: NULL tokenizer");
    if (!text && len) return ks_errorf(KS_ERR_ARG, "ks_tokenizer_encode: NULL text with length %zu", len);
    size_t bad;
    if (len && !u8_valid(text, len, &bad))
        return ks_errorf(KS_ERR_ARG, "text is not valid UTF-8 (byte 0x%02X at offset %zu)", (unsigned char)text[bad], bad);
    ectx c;
    memset(&c, 0, sizeof c);
    c.spans.isz = c.spans2.isz = sizeof(span);
    c.syms.isz = sizeof(sym);
    c.heap.isz = sizeof(hent);
    vec out = {.isz = sizeof(int32_t)};
    ks_status st = len ? encode_text(tok, &c, text, len, &out) : KS_OK;
    if (!st && tok->post) st = post_apply(tok->post, add_special, &out);
    ectx_free(&c);
    if (st) { vec_free(&out); return st; }
    if (!out.v) {
        out.v = ks_malloc(sizeof(int32_t));
        if (!out.v) return KS_ERR_OOM;
    }
    *ids = out.v;
    *n_ids = out.n;
    return KS_OK;
}

/* ================================================================ decode */

/* a list of strings: spans into one buffer */
typedef struct slist { sbuf b; vec s; } slist;

static int sl_add(slist *l, const char *p, size_t n) {
    span *x = vec_push(&l->s);
    if (!x) return -1;
    x->s = l->b.n;
    if (sb_put(&l->b, p, n)) return -1;
    x->e = l->b.n;
    return 0;
}
/* append to the last string */
static int sl_cat(slist *l, const char *p, size_t n) {
    if (sb_put(&l->b, p, n)) return -1;
    ((span *)l->s.v)[l->s.n - 1].e = l->b.n;
    return 0;
}
static void sl_free(slist *l) { sb_free(&l->b); vec_free(&l->s); }
#define SL_STR(l, i) ((l)->b.p + ((span *)(l)->s.v)[i].s)
#define SL_LEN(l, i) (((span *)(l)->s.v)[i].e - ((span *)(l)->s.v)[i].s)

static int hexval(char ch) {
    if (ch >= '0' && ch <= '9') return ch - '0';
    if (ch >= 'a' && ch <= 'f') return ch - 'a' + 10;
    if (ch >= 'A' && ch <= 'F') return ch - 'A' + 10;
    return -1;
}
/* "<0xNN>" -> byte (u8::from_str_radix accepts a leading '+'), else -1 */
static int byte_token(const char *s, size_t n) {
    if (n != 6 || memcmp(s, "<0x", 3) != 0 || s[5] != '>') return -1;
    int h = hexval(s[3]), l = hexval(s[4]);
    if (s[3] == '+' && l >= 0) return l;
    return h >= 0 && l >= 0 ? h * 16 + l : -1;
}

static ks_status flush_bytes(slist *out, sbuf *bytes) {
    if (!bytes->n) return KS_OK;
    size_t bad;
    if (u8_valid(bytes->p, bytes->n, &bad)) {
        if (sl_add(out, bytes->p, bytes->n)) return KS_ERR_OOM;
    } else {
        for (size_t i = 0; i < bytes->n; i++)
            if (sl_add(out, "\xEF\xBF\xBD", 3)) return KS_ERR_OOM;
    }
    bytes->n = 0;
    return KS_OK;
}

static ks_status dec_apply(const ks_tokenizer *t, const kdec *d, rxctx *rc, slist *in) {
    if (d->type == D_SEQ) {
        for (size_t i = 0; i < d->nk; i++) {
            ks_status st = dec_apply(t, &d->kids[i], rc, in);
            if (st) return st;
        }
        return KS_OK;
    }
    slist out = {.s = {.isz = sizeof(span)}};
    ks_status st = KS_OK;
    if (sb_put(&out.b, "", 0)) return KS_ERR_OOM;
    switch (d->type) {
    case D_BYTELEVEL: {
        sbuf raw = {0};
        for (size_t i = 0; !st && i < in->s.n; i++) {
            const char *s = SL_STR(in, i);
            size_t n = SL_LEN(in, i), k = 0, l;
            size_t mark = raw.n;
            while (k < n) {
                size_t bad;
                if (!u8_seq((const unsigned char *)s + k, n - k, &bad)) break;
                uint32_t cp = u8_dec((const unsigned char *)s + k, &l);
                if (cp >= 324 || t->bl_rev[cp] < 0) break;
                char b = (char)t->bl_rev[cp];
                if (sb_put(&raw, &b, 1)) { st = KS_ERR_OOM; break; }
                k += l;
            }
            if (!st && k < n) { raw.n = mark; if (sb_put(&raw, s, n)) st = KS_ERR_OOM; }
        }
        if (!st) {
            sbuf fixed = {0};
            if (u8_lossy(&fixed, raw.p ? raw.p : "", raw.n) || sl_add(&out, fixed.p ? fixed.p : "", fixed.n)) st = KS_ERR_OOM;
            sb_free(&fixed);
        }
        sb_free(&raw);
        break;
    }
    case D_METASPACE:
        for (size_t i = 0; !st && i < in->s.n; i++) {
            const char *s = SL_STR(in, i);
            size_t n = SL_LEN(in, i), k = 0, l;
            if (sl_add(&out, "", 0)) { st = KS_ERR_OOM; break; }
            while (k < n && !st) {
                uint32_t cp = u8_dec((const unsigned char *)s + k, &l);
                if (cp == d->repl_cp) {
                    if (!(i == 0 && d->scheme != PS_NEVER) && sl_cat(&out, " ", 1)) st = KS_ERR_OOM;
                } else if (sl_cat(&out, s + k, l)) st = KS_ERR_OOM;
                k += l;
            }
        }
        break;
    case D_REPLACE: {
        vec m = {.isz = sizeof(span)};
        pattern pt = {.rx = d->rx, .lit = d->lit, .lit_len = d->lit_len};
        for (size_t i = 0; !st && i < in->s.n; i++) {
            const char *s = SL_STR(in, i);
            st = find_matches(&pt, rc, s, SL_LEN(in, i), &m);
            if (!st && sl_add(&out, "", 0)) st = KS_ERR_OOM;
            for (size_t k = 0; !st && k < m.n; k++) {
                span x = ((span *)m.v)[k];
                if (x.m ? sl_cat(&out, d->content, d->clen) : sl_cat(&out, s + x.s, x.e - x.s)) st = KS_ERR_OOM;
            }
        }
        vec_free(&m);
        break;
    }
    case D_BYTEFALLBACK: {
        sbuf bytes = {0};
        for (size_t i = 0; !st && i < in->s.n; i++) {
            int b = byte_token(SL_STR(in, i), SL_LEN(in, i));
            if (b >= 0) {
                char ch = (char)b;
                if (sb_put(&bytes, &ch, 1)) st = KS_ERR_OOM;
            } else {
                st = flush_bytes(&out, &bytes);
                if (!st && sl_add(&out, SL_STR(in, i), SL_LEN(in, i))) st = KS_ERR_OOM;
            }
        }
        if (!st) st = flush_bytes(&out, &bytes);
        sb_free(&bytes);
        break;
    }
    case D_FUSE:
        if (sl_add(&out, "", 0)) { st = KS_ERR_OOM; break; }
        for (size_t i = 0; !st && i < in->s.n; i++)
            if (sl_cat(&out, SL_STR(in, i), SL_LEN(in, i))) st = KS_ERR_OOM;
        break;
    case D_STRIP:
        for (size_t i = 0; !st && i < in->s.n; i++) {
            const char *s = SL_STR(in, i);
            size_t n = SL_LEN(in, i), l, a = 0, e = n, nch = u8_count(s, n);
            for (size_t k = 0; k < d->start && a < n; k++) { /* leading */
                if (u8_dec((const unsigned char *)s + a, &l) != d->strip_cp) break;
                a += l;
            }
            for (size_t k = 0; k < d->stop && e > 0 && k < nch; k++) { /* trailing */
                size_t b = e - 1;
                while (b > 0 && ((unsigned char)s[b] & 0xC0) == 0x80) b--;
                if (u8_dec((const unsigned char *)s + b, &l) != d->strip_cp) break;
                e = b;
            }
            if (e < a) e = a; /* HF would slice an inverted range and panic; keep it empty */
            if (sl_add(&out, s + a, e - a)) st = KS_ERR_OOM;
        }
        break;
    default:
        st = ks_errorf(KS_ERR_INTERNAL, "unknown decoder kind %d", d->type);
    }
    if (st) { sl_free(&out); return st; }
    sl_free(in);
    *in = out;
    return KS_OK;
}

ks_status ks_tokenizer_decode(const ks_tokenizer *tok, const int32_t *ids, size_t n, int skip_special,
                              char **text, size_t *len) {
    if (!text) return ks_errorf(KS_ERR_ARG, "ks_tokenizer_decode: NULL output pointer");
    *text = NULL;
    if (len) *len = 0;
    if (!tok) return ks_errorf(KS_ERR_ARG, "ks_tokenizer_decode: NULL tokenizer");
    if (!ids && n) return ks_errorf(KS_ERR_ARG, "ks_tokenizer_decode: NULL ids with count %zu", n);
    for (size_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= tok->n_ids || !(tok->ids[ids[i]].flags & ID_PRESENT))
            return ks_errorf(KS_ERR_ARG, "decode: token id %d at position %zu is out of range (vocab has ids 0..%d%s)",
                             ids[i], i, tok->n_ids - 1,
                             ids[i] >= 0 && ids[i] < tok->n_ids ? ", but none with this one" : "");
    slist l = {.s = {.isz = sizeof(span)}};
    ks_status st = KS_OK;
    if (sb_put(&l.b, "", 0)) return KS_ERR_OOM;
    for (size_t i = 0; i < n && !st; i++) {
        const idinfo *d = &tok->ids[ids[i]];
        if (skip_special && (d->flags & ID_SKIP)) continue;
        if (sl_add(&l, ARENA(tok) + d->doff, d->dlen)) st = KS_ERR_OOM;
    }
    rxctx rc = {0};
    sbuf out = {0};
    if (!st && tok->dec) st = dec_apply(tok, tok->dec, &rc, &l);
    if (!st) { /* join: with "" after a decoder, with " " without one */
        if (sb_put(&out, "", 0)) st = KS_ERR_OOM;
        for (size_t i = 0; !st && i < l.s.n; i++)
            if ((!tok->dec && i && sb_put(&out, " ", 1)) || sb_put(&out, SL_STR(&l, i), SL_LEN(&l, i))) st = KS_ERR_OOM;
    }
    rxctx_free(&rc);
    sl_free(&l);
    if (st) { sb_free(&out); return st; }
    *text = out.p;
    if (len) *len = out.n;
    return KS_OK;
}

/* ================================================================ queries */

int ks_tokenizer_vocab_size(const ks_tokenizer *tok) { return tok ? tok->n_ids : 0; }

int32_t ks_tokenizer_token_id(const ks_tokenizer *tok, const char *token) {
    if (!tok || !token) return -1;
    size_t n = strlen(token);
    int32_t id = sm_get(&tok->added_map, ARENA(tok), token, n);
    return id >= 0 ? id : sm_get(&tok->vocab, ARENA(tok), token, n);
}

const char *ks_tokenizer_token_str(const ks_tokenizer *tok, int32_t id) {
    if (!tok || id < 0 || id >= tok->n_ids || !(tok->ids[id].flags & ID_PRESENT)) return NULL;
    return ARENA(tok) + tok->ids[id].off;
}

int ks_tokenizer_is_special(const ks_tokenizer *tok, int32_t id) {
    if (!tok || id < 0 || id >= tok->n_ids) return 0;
    return (tok->ids[id].flags & ID_SPECIAL) != 0;
}

/* ================================================================ loading */

static void norm_free(knorm *n) {
    if (!n) return;
    for (size_t i = 0; i < n->nk; i++) norm_free(&n->kids[i]);
    free(n->kids);
    free(n->a);
    free(n->b);
    rx_free(n->rx);
}
static void pre_free(kpre *p) {
    if (!p) return;
    for (size_t i = 0; i < p->nk; i++) pre_free(&p->kids[i]);
    free(p->kids);
    rx_free(p->rx);
    free(p->lit);
}
static void dec_free(kdec *d) {
    if (!d) return;
    for (size_t i = 0; i < d->nk; i++) dec_free(&d->kids[i]);
    free(d->kids);
    free(d->lit);
    free(d->content);
    rx_free(d->rx);
}
static void post_free(kpost *p) {
    if (!p) return;
    for (size_t i = 0; i < p->nk; i++) post_free(&p->kids[i]);
    free(p->kids);
    free(p->items);
}

void ks_tokenizer_free(ks_tokenizer *t) {
    if (!t) return;
    sb_free(&t->arena);
    free(t->vocab.s);
    free(t->added_map.s);
    free(t->merges.key);
    free(t->merges.rank);
    free(t->merges.nid);
    free(t->ids);
    free(t->added);
    free(t->trie_raw.v);
    free(t->trie_norm.v);
    norm_free(t->norm); free(t->norm);
    pre_free(t->pre); free(t->pre);
    post_free(t->post); free(t->post);
    dec_free(t->dec); free(t->dec);
    free(t);
}

/* ---------------------------------------------------------------- JSON helpers */

static const char *jtype_name(const ks_json *j) {
    if (!j) return "missing";
    static const char *names[] = {"null", "a boolean", "a number", "a string", "an array", "an object"};
    return names[j->type];
}

static ks_status want(const ks_json *j, ks_json_type ty, const char *where) {
    static const char *names[] = {"null", "a boolean", "a number", "a string", "an array", "an object"};
    if (!j || j->type != ty)
        return ks_errorf(KS_ERR_FORMAT, "%s: expected %s, found %s", where, names[ty], jtype_name(j));
    return KS_OK;
}

/* optional boolean member (absent or null -> def) */
static ks_status jbool(const ks_json *o, const char *key, int def, int *out, const char *where) {
    const ks_json *v = ks_json_get(o, key);
    *out = def;
    if (!v || v->type == KS_JSON_NULL) return KS_OK;
    if (v->type != KS_JSON_BOOL) return ks_errorf(KS_ERR_FORMAT, "%s.%s: expected a boolean, found %s", where, key, jtype_name(v));
    *out = v->boolean;
    return KS_OK;
}

static ks_status jstr(const ks_json *o, const char *key, const ks_json **out, const char *where) {
    const ks_json *v = ks_json_get(o, key);
    *out = v;
    if (!v || v->type != KS_JSON_STRING)
        return ks_errorf(KS_ERR_FORMAT, "%s.%s: expected a string, found %s", where, key, jtype_name(v));
    return KS_OK;
}

static char *dupn(const char *s, size_t n) {
    char *p = ks_malloc(n + 1);
    if (!p) return NULL;
    memcpy(p, s, n);
    p[n] = 0;
    return p;
}

/* a string that must hold exactly one character */
static ks_status one_char(const ks_json *s, char buf[8], size_t *blen, uint32_t *cp, const char *where) {
    size_t l;
    if (s->len == 0 || s->len > 4 || u8_len((unsigned char)s->str[0]) != s->len)
        return ks_errorf(KS_ERR_FORMAT, "%s: expected a single character, found \"%s\"", where, s->str);
    *cp = u8_dec((const unsigned char *)s->str, &l);
    memcpy(buf, s->str, s->len);
    buf[s->len] = 0;
    *blen = s->len;
    return KS_OK;
}

/* {"String": s} or {"Regex": r} -> literal or compiled regex */
static ks_status parse_pattern(const ks_json *pat, char **lit, size_t *lit_len, ks_rx **rx, const char *where) {
    ks_status st = want(pat, KS_JSON_OBJECT, where);
    if (st) return st;
    const ks_json *s = ks_json_get(pat, "String"), *r = ks_json_get(pat, "Regex");
    if (s && s->type == KS_JSON_STRING) {
        if (s->len == 0) return ks_errorf(KS_ERR_UNSUPPORTED, "%s: an empty String pattern is not supported", where);
        if (!(*lit = dupn(s->str, s->len))) return KS_ERR_OOM;
        *lit_len = s->len;
        return KS_OK;
    }
    if (r && r->type == KS_JSON_STRING) {
        st = rx_compile(r->str, r->len, rx);
        return st ? ks_error_prefix(st, "%s", where) : KS_OK;
    }
    return ks_errorf(KS_ERR_FORMAT, "%s: expected {\"String\": ...} or {\"Regex\": ...}", where);
}

static const char *type_of(const ks_json *o) {
    const ks_json *ty = ks_json_get(o, "type");
    return ty && ty->type == KS_JSON_STRING ? ty->str : NULL;
}

/* ---------------------------------------------------------------- normalizer */

static ks_status load_norm(const ks_json *j, knorm *n, const char *where, int depth) {
    memset(n, 0, sizeof *n);
    if (depth > 32) return ks_errorf(KS_ERR_FORMAT, "%s: nested too deeply", where);
    ks_status st = want(j, KS_JSON_OBJECT, where);
    if (st) return st;
    const char *ty = type_of(j);
    if (!ty) return ks_errorf(KS_ERR_FORMAT, "%s: missing \"type\"", where);
    char sub[256];
    if (!strcmp(ty, "Sequence")) {
        const ks_json *a = ks_json_get(j, "normalizers");
        snprintf(sub, sizeof sub, "%s.normalizers", where);
        if ((st = want(a, KS_JSON_ARRAY, sub))) return st;
        n->type = N_SEQ;
        n->kids = ks_calloc(a->len ? a->len : 1, sizeof *n->kids);
        if (!n->kids) return KS_ERR_OOM;
        for (size_t i = 0; i < a->len; i++) {
            snprintf(sub, sizeof sub, "%s.normalizers[%zu]", where, i);
            n->nk = i + 1;
            if ((st = load_norm(&a->items[i], &n->kids[i], sub, depth + 1))) return st;
        }
        return KS_OK;
    }
    if (!strcmp(ty, "NFC")) { n->type = N_NFC; return KS_OK; }
    if (!strcmp(ty, "NFD")) { n->type = N_NFD; return KS_OK; }
    if (!strcmp(ty, "NFKC")) { n->type = N_NFKC; return KS_OK; }
    if (!strcmp(ty, "NFKD")) { n->type = N_NFKD; return KS_OK; }
    if (!strcmp(ty, "Prepend")) {
        const ks_json *p;
        if ((st = jstr(j, "prepend", &p, where))) return st;
        n->type = N_PREPEND;
        if (!(n->a = dupn(p->str, p->len))) return KS_ERR_OOM;
        n->alen = p->len;
        return KS_OK;
    }
    if (!strcmp(ty, "Replace")) {
        const ks_json *c;
        n->type = N_REPLACE;
        if ((st = jstr(j, "content", &c, where))) return st;
        if (!(n->b = dupn(c->str, c->len))) return KS_ERR_OOM;
        n->blen = c->len;
        snprintf(sub, sizeof sub, "%s.pattern", where);
        return parse_pattern(ks_json_get(j, "pattern"), &n->a, &n->alen, &n->rx, sub);
    }
    if (!strcmp(ty, "Strip")) {
        n->type = N_STRIP;
        if ((st = jbool(j, "strip_left", 1, &n->left, where))) return st;
        return jbool(j, "strip_right", 1, &n->right, where);
    }
    return ks_errorf(KS_ERR_UNSUPPORTED, "%s: normalizer type \"%s\" is not supported", where, ty);
}

/* ---------------------------------------------------------------- pre-tokenizer */

static ks_status load_pre(const ks_json *j, kpre *p, const char *where, int depth) {
    memset(p, 0, sizeof *p);
    if (depth > 32) return ks_errorf(KS_ERR_FORMAT, "%s: nested too deeply", where);
    ks_status st = want(j, KS_JSON_OBJECT, where);
    if (st) return st;
    const char *ty = type_of(j);
    if (!ty) return ks_errorf(KS_ERR_FORMAT, "%s: missing \"type\"", where);
    char sub[256];
    if (!strcmp(ty, "Sequence")) {
        const ks_json *a = ks_json_get(j, "pretokenizers");
        snprintf(sub, sizeof sub, "%s.pretokenizers", where);
        if ((st = want(a, KS_JSON_ARRAY, sub))) return st;
        p->type = P_SEQ;
        p->kids = ks_calloc(a->len ? a->len : 1, sizeof *p->kids);
        if (!p->kids) return KS_ERR_OOM;
        for (size_t i = 0; i < a->len; i++) {
            snprintf(sub, sizeof sub, "%s.pretokenizers[%zu]", where, i);
            p->nk = i + 1;
            if ((st = load_pre(&a->items[i], &p->kids[i], sub, depth + 1))) return st;
        }
        return KS_OK;
    }
    if (!strcmp(ty, "ByteLevel")) {
        p->type = P_BYTELEVEL;
        if ((st = jbool(j, "add_prefix_space", 1, &p->add_prefix_space, where))) return st;
        if ((st = jbool(j, "use_regex", 1, &p->use_regex, where))) return st;
        if (p->use_regex && (st = rx_compile(GPT2_PATTERN, strlen(GPT2_PATTERN), &p->rx))) return st;
        return KS_OK;
    }
    if (!strcmp(ty, "Split")) {
        p->type = P_SPLIT;
        const ks_json *b;
        if ((st = jstr(j, "behavior", &b, where))) return st;
        static const char *bn[] = {"Removed", "Isolated", "MergedWithPrevious", "MergedWithNext", "Contiguous"};
        p->behavior = -1;
        for (int i = 0; i < 5; i++) if (!strcmp(b->str, bn[i])) p->behavior = i;
        if (p->behavior < 0) return ks_errorf(KS_ERR_UNSUPPORTED, "%s.behavior: \"%s\" is not a known split behaviour", where, b->str);
        const ks_json *inv = ks_json_get(j, "invert");
        if (!inv || inv->type != KS_JSON_BOOL) return ks_errorf(KS_ERR_FORMAT, "%s.invert: expected a boolean", where);
        p->invert = inv->boolean;
        snprintf(sub, sizeof sub, "%s.pattern", where);
        return parse_pattern(ks_json_get(j, "pattern"), &p->lit, &p->lit_len, &p->rx, sub);
    }
    if (!strcmp(ty, "Metaspace")) {
        p->type = P_METASPACE;
        const ks_json *r, *ps = ks_json_get(j, "prepend_scheme");
        if ((st = jstr(j, "replacement", &r, where))) return st;
        snprintf(sub, sizeof sub, "%s.replacement", where);
        if ((st = one_char(r, p->repl, &p->repl_len, &p->repl_cp, sub))) return st;
        p->scheme = PS_ALWAYS;
        if (ps && ps->type == KS_JSON_STRING) {
            if (!strcmp(ps->str, "always")) p->scheme = PS_ALWAYS;
            else if (!strcmp(ps->str, "first")) p->scheme = PS_FIRST;
            else if (!strcmp(ps->str, "never")) p->scheme = PS_NEVER;
            else return ks_errorf(KS_ERR_FORMAT, "%s.prepend_scheme: unknown value \"%s\"", where, ps->str);
        } else if (ps && ps->type != KS_JSON_NULL)
            return ks_errorf(KS_ERR_FORMAT, "%s.prepend_scheme: expected a string", where);
        const ks_json *aps = ks_json_get(j, "add_prefix_space");
        if (aps && aps->type == KS_JSON_BOOL && !aps->boolean) {
            if (p->scheme != PS_NEVER)
                return ks_errorf(KS_ERR_FORMAT, "%s: add_prefix_space does not match declared prepend_scheme", where);
        }
        return jbool(j, "split", 1, &p->split, where);
    }
    if (!strcmp(ty, "Digits")) {
        p->type = P_DIGITS;
        return jbool(j, "individual_digits", 0, &p->individual, where);
    }
    return ks_errorf(KS_ERR_UNSUPPORTED, "%s: pre-tokenizer type \"%s\" is not supported", where, ty);
}

/* ---------------------------------------------------------------- decoder */

static ks_status load_dec(const ks_json *j, kdec *d, const char *where, int depth) {
    memset(d, 0, sizeof *d);
    if (depth > 32) return ks_errorf(KS_ERR_FORMAT, "%s: nested too deeply", where);
    ks_status st = want(j, KS_JSON_OBJECT, where);
    if (st) return st;
    const char *ty = type_of(j);
    if (!ty) return ks_errorf(KS_ERR_UNSUPPORTED, "%s: a decoder without \"type\" (legacy format) is not supported", where);
    char sub[256];
    if (!strcmp(ty, "Sequence")) {
        const ks_json *a = ks_json_get(j, "decoders");
        snprintf(sub, sizeof sub, "%s.decoders", where);
        if ((st = want(a, KS_JSON_ARRAY, sub))) return st;
        d->type = D_SEQ;
        d->kids = ks_calloc(a->len ? a->len : 1, sizeof *d->kids);
        if (!d->kids) return KS_ERR_OOM;
        for (size_t i = 0; i < a->len; i++) {
            snprintf(sub, sizeof sub, "%s.decoders[%zu]", where, i);
            d->nk = i + 1;
            if ((st = load_dec(&a->items[i], &d->kids[i], sub, depth + 1))) return st;
        }
        return KS_OK;
    }
    if (!strcmp(ty, "ByteLevel")) { d->type = D_BYTELEVEL; return KS_OK; }
    if (!strcmp(ty, "ByteFallback")) { d->type = D_BYTEFALLBACK; return KS_OK; }
    if (!strcmp(ty, "Fuse")) { d->type = D_FUSE; return KS_OK; }
    if (!strcmp(ty, "Metaspace")) {
        d->type = D_METASPACE;
        const ks_json *r, *ps = ks_json_get(j, "prepend_scheme");
        if ((st = jstr(j, "replacement", &r, where))) return st;
        snprintf(sub, sizeof sub, "%s.replacement", where);
        if ((st = one_char(r, d->repl, &d->repl_len, &d->repl_cp, sub))) return st;
        d->scheme = PS_ALWAYS;
        if (ps && ps->type == KS_JSON_STRING) {
            if (!strcmp(ps->str, "always")) d->scheme = PS_ALWAYS;
            else if (!strcmp(ps->str, "first")) d->scheme = PS_FIRST;
            else if (!strcmp(ps->str, "never")) d->scheme = PS_NEVER;
            else return ks_errorf(KS_ERR_FORMAT, "%s.prepend_scheme: unknown value \"%s\"", where, ps->str);
        }
        const ks_json *aps = ks_json_get(j, "add_prefix_space");
        if (aps && aps->type == KS_JSON_BOOL && !aps->boolean && d->scheme != PS_NEVER)
            return ks_errorf(KS_ERR_FORMAT, "%s: add_prefix_space does not match declared prepend_scheme", where);
        return KS_OK;
    }
    if (!strcmp(ty, "Replace")) {
        d->type = D_REPLACE;
        const ks_json *c;
        if ((st = jstr(j, "content", &c, where))) return st;
        if (!(d->content = dupn(c->str, c->len))) return KS_ERR_OOM;
        d->clen = c->len;
        snprintf(sub, sizeof sub, "%s.pattern", where);
        return parse_pattern(ks_json_get(j, "pattern"), &d->lit, &d->lit_len, &d->rx, sub);
    }
    if (!strcmp(ty, "Strip")) {
        d->type = D_STRIP;
        const ks_json *c, *a = ks_json_get(j, "start"), *b = ks_json_get(j, "stop");
        char buf[8];
        size_t bl;
        if ((st = jstr(j, "content", &c, where))) return st;
        snprintf(sub, sizeof sub, "%s.content", where);
        if ((st = one_char(c, buf, &bl, &d->strip_cp, sub))) return st;
        if (!a || !a->is_int || a->inum < 0 || !b || !b->is_int || b->inum < 0)
            return ks_errorf(KS_ERR_FORMAT, "%s: start and stop must be non-negative integers", where);
        d->start = (size_t)a->inum;
        d->stop = (size_t)b->inum;
        return KS_OK;
    }
    return ks_errorf(KS_ERR_UNSUPPORTED, "%s: decoder type \"%s\" is not supported", where, ty);
}

/* ---------------------------------------------------------------- post-processor */

static ks_status post_items_add(kpost *p, int32_t v) {
    int32_t *q = ks_realloc(p->items, (p->n + 1) * sizeof *q);
    if (!q) return KS_ERR_OOM;
    p->items = q;
    p->items[p->n++] = v;
    return KS_OK;
}

/* ["[CLS]", 101] style pair -> id */
static ks_status post_pair(const ks_json *j, const char *key, int32_t *id, const char *where) {
    const ks_json *a = ks_json_get(j, key);
    *id = -1;
    if (!a || a->type != KS_JSON_ARRAY || a->len != 2 || a->items[1].type != KS_JSON_NUMBER || !a->items[1].is_int ||
        a->items[1].inum < 0 || a->items[1].inum > INT32_MAX)
        return ks_errorf(KS_ERR_FORMAT, "%s.%s: expected [token, id]", where, key);
    *id = (int32_t)a->items[1].inum;
    return KS_OK;
}

static ks_status load_post(const ks_json *j, kpost *p, const char *where, int depth) {
    memset(p, 0, sizeof *p);
    if (depth > 32) return ks_errorf(KS_ERR_FORMAT, "%s: nested too deeply", where);
    ks_status st = want(j, KS_JSON_OBJECT, where);
    if (st) return st;
    const char *ty = type_of(j);
    if (!ty) return ks_errorf(KS_ERR_FORMAT, "%s: missing \"type\"", where);
    char sub[256];
    if (!strcmp(ty, "Sequence")) {
        const ks_json *a = ks_json_get(j, "processors");
        snprintf(sub, sizeof sub, "%s.processors", where);
        if ((st = want(a, KS_JSON_ARRAY, sub))) return st;
        p->is_seq = 1;
        p->kids = ks_calloc(a->len ? a->len : 1, sizeof *p->kids);
        if (!p->kids) return KS_ERR_OOM;
        for (size_t i = 0; i < a->len; i++) {
            snprintf(sub, sizeof sub, "%s.processors[%zu]", where, i);
            p->nk = i + 1;
            if ((st = load_post(&a->items[i], &p->kids[i], sub, depth + 1))) return st;
        }
        return KS_OK;
    }
    if (!strcmp(ty, "ByteLevel")) return KS_OK;
    if (!strcmp(ty, "BertProcessing") || !strcmp(ty, "RobertaProcessing")) {
        int32_t cls, sep;
        if ((st = post_pair(j, "cls", &cls, where)) || (st = post_pair(j, "sep", &sep, where))) return st;
        if ((st = post_items_add(p, cls)) || (st = post_items_add(p, -1)) || (st = post_items_add(p, sep))) return st;
        return KS_OK;
    }
    if (!strcmp(ty, "TemplateProcessing")) {
        const ks_json *single = ks_json_get(j, "single"), *sp = ks_json_get(j, "special_tokens");
        snprintf(sub, sizeof sub, "%s.single", where);
        if ((st = want(single, KS_JSON_ARRAY, sub))) return st;
        for (size_t i = 0; i < single->len; i++) {
            const ks_json *it = &single->items[i], *seq = ks_json_get(it, "Sequence"), *spt = ks_json_get(it, "SpecialToken");
            snprintf(sub, sizeof sub, "%s.single[%zu]", where, i);
            if (seq && seq->type == KS_JSON_OBJECT) {
                const char *sid = ks_json_str(seq, "id", "");
                if (strcmp(sid, "A") != 0)
                    return ks_errorf(KS_ERR_UNSUPPORTED, "%s: the single template may only use sequence \"A\", found \"%s\"", sub, sid);
                if ((st = post_items_add(p, -1))) return st;
            } else if (spt && spt->type == KS_JSON_OBJECT) {
                const ks_json *name = ks_json_get(spt, "id");
                if (!name || name->type != KS_JSON_STRING) return ks_errorf(KS_ERR_FORMAT, "%s.SpecialToken.id: expected a string", sub);
                const ks_json *def = NULL;
                if (sp && sp->type == KS_JSON_OBJECT)
                    for (size_t k = 0; k < sp->len; k++)
                        if (sp->key_lens[k] == name->len && !memcmp(sp->keys[k], name->str, name->len)) { def = &sp->items[k]; break; }
                if (!def) return ks_errorf(KS_ERR_FORMAT, "%s: special token \"%s\" is not defined in special_tokens", sub, name->str);
                const ks_json *dids = ks_json_get(def, "ids");
                if (!dids || dids->type != KS_JSON_ARRAY)
                    return ks_errorf(KS_ERR_FORMAT, "%s: special_tokens[\"%s\"].ids: expected an array", where, name->str);
                for (size_t k = 0; k < dids->len; k++) {
                    const ks_json *x = &dids->items[k];
                    if (x->type != KS_JSON_NUMBER || !x->is_int || x->inum < 0 || x->inum > INT32_MAX)
                        return ks_errorf(KS_ERR_FORMAT, "%s: special_tokens[\"%s\"].ids[%zu]: expected a token id", where, name->str, k);
                    if ((st = post_items_add(p, (int32_t)x->inum))) return st;
                }
            } else
                return ks_errorf(KS_ERR_FORMAT, "%s: expected {\"Sequence\": ...} or {\"SpecialToken\": ...}", sub);
        }
        return KS_OK;
    }
    return ks_errorf(KS_ERR_UNSUPPORTED, "%s: post-processor type \"%s\" is not supported", where, ty);
}

/* ---------------------------------------------------------------- model */

static int arena_add(ks_tokenizer *t, const char *s, size_t n, uint32_t *off) {
    if (t->arena.n + n + 1 > UINT32_MAX) { ks_errorf(KS_ERR_FORMAT, "tokenizer strings exceed 4 GiB"); return -1; }
    *off = (uint32_t)t->arena.n;
    if (sb_put(&t->arena, s, n) || sb_put(&t->arena, "", 1)) return -1; /* keep a NUL after each string */
    return 0;
}

#define MAX_ID (1 << 26)

static ks_status load_model(ks_tokenizer *t, const ks_json *m) {
    ks_status st = want(m, KS_JSON_OBJECT, "model");
    if (st) return st;
    const char *ty = type_of(m);
    if (!ty) {
        /* HF accepts an untagged model when it has vocab + merges (BPE) */
        if (!ks_json_get(m, "merges")) return ks_errorf(KS_ERR_FORMAT, "model: missing \"type\"");
    } else if (strcmp(ty, "BPE") != 0)
        return ks_errorf(KS_ERR_UNSUPPORTED, "model: type \"%s\" is not supported (only BPE)", ty);
    const ks_json *vocab = ks_json_get(m, "vocab"), *merges = ks_json_get(m, "merges");
    if ((st = want(vocab, KS_JSON_OBJECT, "model.vocab"))) return st;
    if ((st = want(merges, KS_JSON_ARRAY, "model.merges"))) return st;
    const ks_json *dropout = ks_json_get(m, "dropout");
    if (dropout && dropout->type != KS_JSON_NULL && dropout->type != KS_JSON_NUMBER)
        return ks_errorf(KS_ERR_FORMAT, "model.dropout: expected a number or null, found %s", jtype_name(dropout));
    if (dropout && dropout->type == KS_JSON_NUMBER && dropout->num != 0.0)
        return ks_errorf(KS_ERR_UNSUPPORTED, "model.dropout = %g: BPE dropout is not supported", dropout->num);
    if ((st = jbool(m, "fuse_unk", 0, &t->fuse_unk, "model")) || (st = jbool(m, "byte_fallback", 0, &t->byte_fallback, "model")) ||
        (st = jbool(m, "ignore_merges", 0, &t->ignore_merges, "model")))
        return st;
    const ks_json *unk = ks_json_get(m, "unk_token"), *pre = ks_json_get(m, "continuing_subword_prefix"),
                  *suf = ks_json_get(m, "end_of_word_suffix");
    if (unk && unk->type == KS_JSON_STRING) {
        t->has_unk = 1;
        if (arena_add(t, unk->str, unk->len, &t->unk_off)) return KS_ERR_OOM;
        t->unk_len = (uint32_t)unk->len;
    }
    if (pre && pre->type == KS_JSON_STRING && pre->len) {
        t->has_prefix = 1;
        if (arena_add(t, pre->str, pre->len, &t->prefix_off)) return KS_ERR_OOM;
        t->prefix_len = (uint32_t)pre->len;
    }
    if (suf && suf->type == KS_JSON_STRING && suf->len) {
        t->has_suffix = 1;
        if (arena_add(t, suf->str, suf->len, &t->suffix_off)) return KS_ERR_OOM;
        t->suffix_len = (uint32_t)suf->len;
    }

    /* vocab: string -> id (a later duplicate key wins, as in HF) */
    if (sm_init(&t->vocab, vocab->len)) return KS_ERR_OOM;
    int64_t max_id = -1;
    for (size_t i = 0; i < vocab->len; i++) {
        const ks_json *v = &vocab->items[i];
        if (v->type != KS_JSON_NUMBER || !v->is_int || v->inum < 0 || v->inum >= MAX_ID)
            return ks_errorf(KS_ERR_FORMAT, "model.vocab[\"%s\"]: expected a token id in 0..%d", vocab->keys[i], MAX_ID - 1);
        /* ids are bounded by the vocabulary's real size first: the id table (build_ids) has
         * n_ids entries, so one entry with id 67108863 would cost 1.5 GB before anything else
         * rejected the file. A vocabulary of N entries numbers them 0..N-1. */
        if ((uint64_t)v->inum >= vocab->len)
            return ks_errorf(KS_ERR_FORMAT, "model.vocab[\"%s\"]: id %lld is out of range for a vocabulary of %zu entries "
                             "(ids 0..%zu)", vocab->keys[i], (long long)v->inum, vocab->len, vocab->len - 1);
        uint32_t h, off;
        sm_slot *x = sm_slot_for(&t->vocab, ARENA(t), vocab->keys[i], vocab->key_lens[i], &h);
        if (x->len == UINT32_MAX) {
            if (arena_add(t, vocab->keys[i], vocab->key_lens[i], &off)) return KS_ERR_OOM;
            x->off = off; x->len = (uint32_t)vocab->key_lens[i]; x->hash = h;
            t->vocab_count++;
        }
        x->val = (int32_t)v->inum;
        if (v->inum > max_id) max_id = v->inum;
    }
    t->n_ids = (int32_t)(max_id + 1);

    for (int b = 0; b < 256; b++) {
        char name[8];
        snprintf(name, sizeof name, "<0x%02X>", b);
        t->byte_id[b] = sm_get(&t->vocab, ARENA(t), name, 6);
    }

    /* merges: "a b" strings or ["a", "b"] pairs; rank = index */
    if (pm_init(&t->merges, merges->len)) return KS_ERR_OOM;
    sbuf joined = {0};
    size_t rank = 0;
    for (size_t i = 0; i < merges->len; i++) {
        const ks_json *e = &merges->items[i];
        if (e->type != merges->items[0].type) { /* HF takes one format or the other, never both */
            sb_free(&joined);
            return ks_errorf(KS_ERR_FORMAT, "model.merges[%zu]: mixes \"a b\" strings and [\"a\", \"b\"] pairs", i);
        }
        const char *a, *b;
        size_t al, bl;
        if (e->type == KS_JSON_STRING) {
            if (e->len >= 8 && !memcmp(e->str, "#version", 8)) continue;
            const char *sp = memchr(e->str, ' ', e->len);
            if (!sp || memchr(sp + 1, ' ', e->len - (size_t)(sp - e->str) - 1)) {
                sb_free(&joined);
                return ks_errorf(KS_ERR_FORMAT, "model.merges[%zu]: \"%s\" is not of the form \"a b\"", i, e->str);
            }
            a = e->str; al = (size_t)(sp - e->str);
            b = sp + 1; bl = e->len - al - 1;
        } else if (e->type == KS_JSON_ARRAY && e->len == 2 && e->items[0].type == KS_JSON_STRING &&
                   e->items[1].type == KS_JSON_STRING) {
            a = e->items[0].str; al = e->items[0].len;
            b = e->items[1].str; bl = e->items[1].len;
        } else {
            sb_free(&joined);
            return ks_errorf(KS_ERR_FORMAT, "model.merges[%zu]: expected \"a b\" or [\"a\", \"b\"], found %s", i, jtype_name(e));
        }
        int32_t ia = sm_get(&t->vocab, ARENA(t), a, al), ib = sm_get(&t->vocab, ARENA(t), b, bl);
        const char *miss = ia < 0 ? a : ib < 0 ? b : NULL;
        size_t missl = ia < 0 ? al : bl;
        if (miss) {
            sb_free(&joined);
            return ks_errorf(KS_ERR_FORMAT, "model.merges[%zu]: token \"%.*s\" is not in the vocab", i, (int)KS_MIN(missl, 200), miss);
        }
        size_t skip = t->has_prefix ? KS_MIN(t->prefix_len, bl) : 0;
        joined.n = 0;
        if (sb_put(&joined, a, al) || sb_put(&joined, b + skip, bl - skip)) { sb_free(&joined); return KS_ERR_OOM; }
        int32_t nid = sm_get(&t->vocab, ARENA(t), joined.p, joined.n);
        if (nid < 0) {
            ks_errorf(KS_ERR_FORMAT, "model.merges[%zu]: merged token \"%.*s\" is not in the vocab", i, (int)KS_MIN(joined.n, 200), joined.p);
            sb_free(&joined);
            return KS_ERR_FORMAT;
        }
        uint64_t k = (uint64_t)(uint32_t)ia << 32 | (uint32_t)ib;
        size_t slot = pm_index(&t->merges, k);
        t->merges.key[slot] = k; /* a repeated pair keeps its last rank, as in HF */
        t->merges.rank[slot] = (uint32_t)rank;
        t->merges.nid[slot] = nid;
        rank++;
    }
    sb_free(&joined);
    return KS_OK;
}

/* ---------------------------------------------------------------- added tokens */

static ks_status load_added(ks_tokenizer *t, const ks_json *arr) {
    if (!arr || arr->type == KS_JSON_NULL) return KS_OK;
    ks_status st = want(arr, KS_JSON_ARRAY, "added_tokens");
    if (st) return st;
    t->added = ks_calloc(arr->len ? arr->len : 1, sizeof *t->added);
    if (!t->added || sm_init(&t->added_map, arr->len)) return KS_ERR_OOM;
    /* ids as HF assigns them: the vocab id when the content is in the vocab, else the next
     * free id after the model vocab (HF ignores the "id" written in the file) */
    int64_t next_id = (int64_t)t->vocab_count;
    rxctx rc = {0};
    sbuf nb = {0};
    for (size_t i = 0; i < arr->len; i++) {
        const ks_json *o = &arr->items[i];
        char where[64];
        snprintf(where, sizeof where, "added_tokens[%zu]", i);
        if ((st = want(o, KS_JSON_OBJECT, where))) break;
        const ks_json *content, *idj = ks_json_get(o, "id");
        if ((st = jstr(o, "content", &content, where))) break;
        if (!idj || idj->type != KS_JSON_NUMBER || !idj->is_int || idj->inum < 0 || idj->inum >= MAX_ID) {
            st = ks_errorf(KS_ERR_FORMAT, "%s.id: expected a token id in 0..%d", where, MAX_ID - 1);
            break;
        }
        addtok a = {0};
        int sw, ls, rs, nz, sp;
        if ((st = jbool(o, "single_word", 0, &sw, where)) || (st = jbool(o, "lstrip", 0, &ls, where)) ||
            (st = jbool(o, "rstrip", 0, &rs, where)) || (st = jbool(o, "special", 0, &sp, where)) ||
            (st = jbool(o, "normalized", !sp, &nz, where)))
            break;
        a.single_word = (uint8_t)sw; a.lstrip = (uint8_t)ls; a.rstrip = (uint8_t)rs;
        a.normalized = (uint8_t)nz; a.special = (uint8_t)sp;
        if (content->len == 0) continue;
        int32_t id = sm_get(&t->added_map, ARENA(t), content->str, content->len);
        int repeated = id >= 0; /* only a repeated content can land on an existing entry */
        if (id < 0) id = sm_get(&t->vocab, ARENA(t), content->str, content->len);
        if (id < 0) {
            if (next_id >= MAX_ID) { st = ks_errorf(KS_ERR_FORMAT, "%s: too many tokens", where); break; }
            id = (int32_t)next_id++;
        }
        a.id = id;
        if (arena_add(t, content->str, content->len, &a.off)) { st = KS_ERR_OOM; break; }
        a.len = (uint32_t)content->len;
        a.noff = a.off;
        a.nlen = a.len;
        if (a.normalized && t->norm) {
            nb.n = 0;
            if (sb_put(&nb, "", 0)) { st = KS_ERR_OOM; break; }
            if ((st = norm_apply(t->norm, &rc, content->str, content->len, &nb))) { ks_error_prefix(st, "%s", where); break; }
            if ((nb.n != content->len || memcmp(nb.p, content->str, nb.n)) && arena_add(t, nb.p, nb.n, &a.noff)) { st = KS_ERR_OOM; break; }
            a.nlen = (uint32_t)nb.n;
        }
        /* one entry per id: a repeated content overrides the earlier properties */
        size_t k = repeated ? 0 : t->n_added;
        for (; k < t->n_added; k++) if (t->added[k].id == id) break;
        if (k < t->n_added) {
            uint8_t was_special = t->added[k].special;
            t->added[k] = a;
            t->added[k].special |= was_special; /* HF never removes from its special set */
        } else t->added[t->n_added++] = a;
        uint32_t h;
        sm_slot *x = sm_slot_for(&t->added_map, ARENA(t), content->str, content->len, &h);
        if (x->len == UINT32_MAX) { x->off = a.off; x->len = a.len; x->hash = h; }
        x->val = id;
    }
    rxctx_free(&rc);
    sb_free(&nb);
    if (st) return st;
    for (size_t k = 0; k < t->n_added; k++) {
        const addtok *a = &t->added[k];
        int r = a->normalized ? trie_insert(&t->trie_norm, ARENA(t) + a->noff, a->nlen, (int32_t)k)
                              : trie_insert(&t->trie_raw, ARENA(t) + a->off, a->len, (int32_t)k);
        if (r) return KS_ERR_OOM;
    }
    return KS_OK;
}

static ks_status build_ids(ks_tokenizer *t) {
    for (size_t k = 0; k < t->n_added; k++)
        if (t->added[k].id >= t->n_ids) t->n_ids = t->added[k].id + 1;
    t->ids = ks_calloc((size_t)(t->n_ids > 0 ? t->n_ids : 1), sizeof *t->ids);
    if (!t->ids) return KS_ERR_OOM;
    for (size_t i = 0; i <= t->vocab.mask; i++) {
        sm_slot *x = &t->vocab.s[i];
        if (x->len == UINT32_MAX) continue;
        idinfo *d = &t->ids[x->val];
        d->off = d->doff = x->off;
        d->len = d->dlen = x->len;
        d->flags = ID_PRESENT;
    }
    for (size_t k = 0; k < t->n_added; k++) {
        const addtok *a = &t->added[k];
        idinfo *d = &t->ids[a->id];
        d->off = a->off; d->len = a->len;
        d->doff = a->noff; d->dlen = a->nlen; /* decoding sees the normalized form */
        d->flags = ID_PRESENT | ID_ADDED | (a->special ? ID_SPECIAL : 0);
    }
    /* HF skips by string: a token is dropped when the string it decodes from is the content
     * of a special added token (so a normalized special token whose form changed is kept) */
    if (t->n_added)
        for (int32_t id = 0; id < t->n_ids; id++) {
            idinfo *d = &t->ids[id];
            if (!(d->flags & ID_PRESENT)) continue;
            int32_t a = sm_get(&t->added_map, ARENA(t), ARENA(t) + d->doff, d->dlen);
            if (a >= 0 && (t->ids[a].flags & ID_SPECIAL)) d->flags |= ID_SKIP;
        }
    return KS_OK;
}

static void init_bytelevel(ks_tokenizer *t) {
    int n = 0;
    for (int i = 0; i < 324; i++) t->bl_rev[i] = -1;
    for (int b = 0; b < 256; b++) {
        int keep = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
        uint32_t cp = keep ? (uint32_t)b : (uint32_t)(256 + n++);
        char buf[4];
        size_t l = u8_enc(cp, buf);
        memcpy(t->bl_enc[b], buf, l);
        t->bl_len[b] = (uint8_t)l;
        t->bl_rev[cp] = (int16_t)b;
    }
}

static ks_status load_root(ks_tokenizer *t, const ks_json *root) {
    ks_status st = want(root, KS_JSON_OBJECT, "top level");
    if (st) return st;
    const ks_json *ver = ks_json_get(root, "version");
    if (ver && ver->type == KS_JSON_STRING && strcmp(ver->str, "1.0") != 0)
        return ks_errorf(KS_ERR_UNSUPPORTED, "unknown tokenizer version \"%s\" (expected \"1.0\")", ver->str);
    const ks_json *tr = ks_json_get(root, "truncation"), *pad = ks_json_get(root, "padding");
    if (tr && tr->type != KS_JSON_NULL) return ks_errorf(KS_ERR_UNSUPPORTED, "truncation is set: encoding with truncation is not supported");
    if (pad && pad->type != KS_JSON_NULL) return ks_errorf(KS_ERR_UNSUPPORTED, "padding is set: encoding with padding is not supported");
    const ks_json *m = ks_json_get(root, "model");
    if (!m) return ks_errorf(KS_ERR_FORMAT, "missing \"model\"");
    if ((st = load_model(t, m))) return st;
    const ks_json *j;
    if ((j = ks_json_get(root, "normalizer")) && j->type != KS_JSON_NULL) {
        if (!(t->norm = ks_calloc(1, sizeof *t->norm))) return KS_ERR_OOM;
        if ((st = load_norm(j, t->norm, "normalizer", 0))) return st;
    }
    if ((j = ks_json_get(root, "pre_tokenizer")) && j->type != KS_JSON_NULL) {
        if (!(t->pre = ks_calloc(1, sizeof *t->pre))) return KS_ERR_OOM;
        if ((st = load_pre(j, t->pre, "pre_tokenizer", 0))) return st;
    }
    if ((j = ks_json_get(root, "decoder")) && j->type != KS_JSON_NULL) {
        if (!(t->dec = ks_calloc(1, sizeof *t->dec))) return KS_ERR_OOM;
        if ((st = load_dec(j, t->dec, "decoder", 0))) return st;
    }
    if ((st = load_added(t, ks_json_get(root, "added_tokens")))) return st;
    if ((j = ks_json_get(root, "post_processor")) && j->type != KS_JSON_NULL) {
        if (!(t->post = ks_calloc(1, sizeof *t->post))) return KS_ERR_OOM;
        if ((st = load_post(j, t->post, "post_processor", 0))) return st;
    }
    return build_ids(t);
}

ks_status ks_tokenizer_load(const char *path, ks_tokenizer **out) {
    if (!out) return ks_errorf(KS_ERR_ARG, "ks_tokenizer_load: NULL output pointer");
    *out = NULL;
    if (!path) return ks_errorf(KS_ERR_ARG, "ks_tokenizer_load: NULL path");
    char *data;
    size_t len;
    ks_status st = ks_read_file(path, &data, &len);
    if (st) return st;
    ks_json *root = ks_json_parse(data, len);
    free(data);
    if (!root) return ks_error_prefix(KS_ERR_FORMAT, "%s", path);
    ks_tokenizer *t = ks_calloc(1, sizeof *t);
    if (!t) { ks_json_free(root); return KS_ERR_OOM; }
    init_bytelevel(t);
    st = load_root(t, root);
    ks_json_free(root);
    if (st) {
        ks_tokenizer_free(t);
        if (st == KS_ERR_OOM) return st;
        return ks_error_prefix(st, "%s", path);
    }
    *out = t;
    return KS_OK;
}
