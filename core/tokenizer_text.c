/* tokenizer_text.c — the tokenizer's text transforms (tokenizer_int.h): HF's regexes on PCRE2,
 * find-matches over a regex / literal / character predicate, the normalizers and the
 * pre-tokenizers. Nothing here keeps state between calls. */
#include "tokenizer_int.h"

#include <utf8proc.h>

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

struct ks_rx { pcre2_code *code; };

void tok_rxctx_free(rxctx *c) {
    if (c->md) pcre2_match_data_free(c->md);
    if (c->mc) pcre2_match_context_free(c->mc);
    if (c->js) pcre2_jit_stack_free(c->js);
    memset(c, 0, sizeof *c);
}

ks_status tok_rx_compile(const char *pat, size_t len, ks_rx **out) {
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

void tok_rx_free(ks_rx *rx) {
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
 * tok_find_matches: spans covering the whole string, each a match or a gap, in order (HF's
 * Pattern::find_matches). Three kinds of pattern: regex, literal string, char predicate. */

ks_status tok_find_matches(const pattern *pt, rxctx *c, const char *s, size_t n, vec *out) {
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

/* ================================================================ normalizers */

static int norm_inert(uint32_t c);
static ks_status unicode_norm(const char *in, size_t n, int opt, sbuf *out);

static ks_status norm_one(const knorm *nm, rxctx *c, const char *in, size_t n, sbuf *out) {
    switch (nm->type) {
    case N_SEQ: {
        sbuf a = {0}, b = {0};
        if (sb_put(&a, in, n)) return KS_ERR_OOM;
        for (size_t i = 0; i < nm->nk; i++) {
            b.n = 0;
            ks_status st = tok_norm_apply(&nm->kids[i], c, a.p, a.n, &b);
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
        size_t i = 0, run = 0, l = 0; /* l: set before use; = 0 quiets GCC's inlined analysis */
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
        ks_status st = tok_find_matches(&pt, c, in, n, &m);
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
ks_status tok_norm_apply(const knorm *nm, rxctx *c, const char *in, size_t n, sbuf *out) {
    if (!nm) return sb_put(out, in, n) ? KS_ERR_OOM : KS_OK;
    return norm_one(nm, c, in, n, out);
}

/* ================================================================ pre-tokenizers */

/* HF NormalizedString::split: turn tok_find_matches spans into pieces per behaviour. Reads
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

static int pred_char(uint32_t c, const void *arg) { return c == *(const uint32_t *)arg; }
static int pred_numeric(uint32_t c, const void *arg) { (void)arg; return is_numeric(c); }

/* One stage: (buf, pcs) -> (buf, pcs). */
ks_status tok_pre_apply(const ks_tokenizer *t, const kpre *p, ectx *c, sbuf *buf, vec *pcs) {
    if (p->type == P_SEQ) {
        for (size_t i = 0; i < p->nk; i++) {
            ks_status st = tok_pre_apply(t, &p->kids[i], c, buf, pcs);
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
                st = tok_find_matches(&pt, &c->rc, c->tmp.p, c->tmp.n, &c->spans);
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
            st = tok_find_matches(&pt, &c->rc, s, pc.len, &c->spans);
            if (!st) st = split_by_behavior(&c->spans, p->behavior, p->invert, buf->p, pc.off, pc.first, &out, &opcs, &c->spans2);
            break;
        }
        case P_DIGITS: {
            pattern pt = {.pred = pred_numeric};
            st = tok_find_matches(&pt, &c->rc, s, pc.len, &c->spans);
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
                st = tok_find_matches(&pt, &c->rc, c->tmp.p, c->tmp.n, &c->spans);
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
