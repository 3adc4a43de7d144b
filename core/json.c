/* json.c — strict JSON (RFC 8259) parser.
 *
 * One pass, recursive descent (depth bounded by KS_JSON_MAX_DEPTH). Finished values of an
 * open array/object wait on a growable stack; when the container closes they are copied
 * once into a chunked arena, so the whole tree lives in a few large blocks (no per-node
 * malloc) and parsing is linear in the input size.
 *
 * Choices beyond the RFC:
 *   - Input must be valid UTF-8 (overlong forms, raw surrogates and code points above
 *     U+10FFFF are rejected). A leading UTF-8 byte-order mark is skipped.
 *   - Escaped lone surrogates (\uD800 without a following \uDC00..\uDFFF, or a lone low
 *     surrogate) are rejected, as Hugging Face's own (serde_json) loader does.
 *   - \u0000 is kept as a NUL byte; string `len` is authoritative.
 *   - Numbers whose magnitude overflows a double are rejected; underflow rounds to 0.
 *   - Duplicate object keys are kept; ks_json_get returns the first.
 *   - Error positions are 1-based lines and 1-based byte columns. */
#include "json.h"
#include "common.h"

#include <errno.h>
#include <locale.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define KS_JSON_MAX_DEPTH 512

/* ------------------------------------------------------------------ arena */

typedef struct jblock {
    struct jblock *next;
    size_t cap, used;
    max_align_t data[];
} jblock;

/* The allocation behind a root: the arena's blocks plus the root node itself. */
typedef struct jdoc {
    jblock *blocks;   /* head = the block being bump-allocated from */
    size_t next_cap;  /* size of the next bump block (doubles) */
    ks_json root;
} jdoc;

#define JALIGN 16

static jblock *jblock_new(size_t cap) {
    jblock *b = ks_malloc(sizeof(jblock) + cap);
    if (!b) return NULL;
    b->next = NULL;
    b->cap = cap;
    b->used = 0;
    return b;
}

static void *jarena_alloc(jdoc *d, size_t n) {
    n = (n + JALIGN - 1) & ~(size_t)(JALIGN - 1);
    if (n == 0) n = JALIGN;
    jblock *h = d->blocks;
    if (h && h->cap - h->used >= n) {
        void *p = (char *)h->data + h->used;
        h->used += n;
        return p;
    }
    if (h && n > d->next_cap / 4) {
        /* big request: a dedicated block linked behind the head, so the head keeps its space */
        jblock *b = jblock_new(n);
        if (!b) return NULL;
        b->used = n;
        b->next = h->next;
        h->next = b;
        return b->data;
    }
    size_t cap = KS_MAX(d->next_cap, n);
    jblock *b = jblock_new(cap);
    if (!b) return NULL;
    d->next_cap = cap * 2;
    b->next = h;
    d->blocks = b;
    b->used = n;
    return b->data;
}

static void jdoc_free(jdoc *d) {
    jblock *b = d->blocks;
    while (b) {
        jblock *n = b->next;
        free(b);
        b = n;
    }
    free(d);
}

/* ----------------------------------------------------------------- parser */

typedef struct jp {
    const char *beg, *cur, *end;
    jdoc *doc;
    ks_json *vs;              /* pending values of open containers */
    size_t vn, vcap;
    const char **ks;          /* pending keys of open objects */
    size_t *kl;
    size_t kn, kcap;
    int depth;
    char dec;                 /* the C library's decimal point (locale) */
} jp;

/* A byte that needs no attention inside a string: printable ASCII other than '"' and '\\'. */
static inline int str_plain(unsigned char c) { return c >= 0x20 && c < 0x80 && c != '"' && c != '\\'; }

static int fail(jp *p, const char *at, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(jp *p, const char *at, const char *fmt, ...) {
    int line = 1;
    const char *ls = p->beg;
    if (at > p->end) at = p->end;
    for (const char *q = p->beg; q < at; q++)
        if (*q == '\n') { line++; ls = q + 1; }
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    ks_errorf(KS_ERR_FORMAT, "line %d, column %d: %s", line, (int)(at - ls) + 1, msg);
    return -1;
}

/* Describe the byte at `at` for messages: 'x' or 0xNN. */
static const char *show_char(const jp *p, const char *at, char buf[16]) {
    if (at >= p->end) return "end of input";
    unsigned char c = (unsigned char)*at;
    if (c > 0x20 && c < 0x7f) snprintf(buf, 16, "'%c'", c);
    else snprintf(buf, 16, "byte 0x%02X", c);
    return buf;
}

static void skip_ws(jp *p) {
    const char *c = p->cur, *e = p->end;
    while (c < e && (*c == ' ' || *c == '\n' || *c == '\r' || *c == '\t')) c++;
    p->cur = c;
}

/* Length of the valid UTF-8 sequence at s (s[0] >= 0x80), or 0 if invalid. */
static size_t utf8_seq(const unsigned char *s, const unsigned char *e) {
    unsigned c = s[0];
    size_t n;
    unsigned lo = 0x80, hi = 0xBF;
    if (c < 0xC2) return 0;
    else if (c < 0xE0) n = 2;
    else if (c < 0xF0) { n = 3; if (c == 0xE0) lo = 0xA0; else if (c == 0xED) hi = 0x9F; }
    else if (c < 0xF5) { n = 4; if (c == 0xF0) lo = 0x90; else if (c == 0xF4) hi = 0x8F; }
    else return 0;
    if ((size_t)(e - s) < n) return 0;
    if (s[1] < lo || s[1] > hi) return 0;
    for (size_t i = 2; i < n; i++)
        if ((s[i] & 0xC0) != 0x80) return 0;
    return n;
}

static int hex4(const char *s, unsigned *out) {
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        unsigned c = (unsigned char)s[i], d;
        if (c >= '0' && c <= '9') d = c - '0';
        else if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
        else if (c >= 'A' && c <= 'F') d = c - 'A' + 10;
        else return -1;
        v = v * 16 + d;
    }
    *out = v;
    return 0;
}

static char *put_utf8(char *o, unsigned cp) {
    if (cp < 0x80) *o++ = (char)cp;
    else if (cp < 0x800) { *o++ = (char)(0xC0 | cp >> 6); *o++ = (char)(0x80 | (cp & 0x3F)); }
    else if (cp < 0x10000) {
        *o++ = (char)(0xE0 | cp >> 12); *o++ = (char)(0x80 | ((cp >> 6) & 0x3F));
        *o++ = (char)(0x80 | (cp & 0x3F));
    } else {
        *o++ = (char)(0xF0 | cp >> 18); *o++ = (char)(0x80 | ((cp >> 12) & 0x3F));
        *o++ = (char)(0x80 | ((cp >> 6) & 0x3F)); *o++ = (char)(0x80 | (cp & 0x3F));
    }
    return o;
}

/* p->cur is at the opening quote. Decoded text goes to the arena. */
static int parse_string(jp *p, const char **out, size_t *out_len) {
    const unsigned char *q = (const unsigned char *)p->cur + 1, *e = (const unsigned char *)p->end;
    int esc = 0;
    /* pass 1: find the closing quote, validating UTF-8 and rejecting raw control chars */
    for (;;) {
        while (q < e && str_plain(*q)) q++;
        if (q >= e) return fail(p, p->cur, "unterminated string");
        if (*q == '"') break;
        if (*q == '\\') {
            if (q + 1 >= e) return fail(p, p->cur, "unterminated string");
            esc = 1;
            q += 2;
        } else if (*q < 0x20) {
            return fail(p, (const char *)q, "control character 0x%02X in a string (must be escaped)", *q);
        } else {
            size_t n = utf8_seq(q, e);
            if (!n) return fail(p, (const char *)q, "invalid UTF-8 byte 0x%02X in a string", *q);
            q += n;
        }
    }
    const char *s = p->cur + 1, *close = (const char *)q;
    size_t raw = (size_t)(close - s);
    char *dst = jarena_alloc(p->doc, raw + 1);
    if (!dst) return -1;
    if (!esc) {
        memcpy(dst, s, raw);
        dst[raw] = 0;
        *out = dst;
        *out_len = raw;
        p->cur = close + 1;
        return 0;
    }
    /* pass 2: decode escapes (decoded length never exceeds the raw length) */
    char *o = dst;
    while (s < close) {
        const char *bs = memchr(s, '\\', (size_t)(close - s));
        if (!bs) bs = close;
        memcpy(o, s, (size_t)(bs - s));
        o += bs - s;
        s = bs;
        if (s >= close) break;
        char c = s[1];
        switch (c) {
        case '"': *o++ = '"'; s += 2; break;
        case '\\': *o++ = '\\'; s += 2; break;
        case '/': *o++ = '/'; s += 2; break;
        case 'b': *o++ = '\b'; s += 2; break;
        case 'f': *o++ = '\f'; s += 2; break;
        case 'n': *o++ = '\n'; s += 2; break;
        case 'r': *o++ = '\r'; s += 2; break;
        case 't': *o++ = '\t'; s += 2; break;
        case 'u': {
            unsigned cp, lo;
            if (close - s < 6 || hex4(s + 2, &cp))
                return fail(p, s, "invalid \\u escape: expected 4 hex digits");
            if (cp >= 0xDC00 && cp <= 0xDFFF)
                return fail(p, s, "lone low surrogate \\u%04X in a string", cp);
            if (cp >= 0xD800 && cp <= 0xDBFF) {
                if (close - s < 12 || s[6] != '\\' || s[7] != 'u' || hex4(s + 8, &lo) || lo < 0xDC00 ||
                    lo > 0xDFFF)
                    return fail(p, s, "lone high surrogate \\u%04X in a string (not followed by \\uDC00-\\uDFFF)",
                                cp);
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                s += 6;
            }
            o = put_utf8(o, cp);
            s += 6;
            break;
        }
        default:
            if ((unsigned char)c > 0x20 && (unsigned char)c < 0x7f)
                return fail(p, s, "invalid escape '\\%c' in a string", c);
            return fail(p, s, "invalid escape: '\\' followed by byte 0x%02X in a string", (unsigned char)c);
        }
    }
    *o = 0;
    *out = dst;
    *out_len = (size_t)(o - dst);
    p->cur = close + 1;
    return 0;
}

static int is_digit(char c) { return c >= '0' && c <= '9'; }

static int parse_number(jp *p, ks_json *v) {
    const char *st = p->cur, *c = st, *e = p->end;
    int neg = 0;
    if (c < e && *c == '-') { neg = 1; c++; }
    if (c >= e || !is_digit(*c)) return fail(p, c, "invalid number: expected a digit");
    if (*c == '0') {
        c++;
        if (c < e && is_digit(*c)) return fail(p, st, "invalid number: leading zero");
    } else {
        while (c < e && is_digit(*c)) c++;
    }
    const char *int_end = c;
    int real = 0;
    if (c < e && *c == '.') {
        c++;
        if (c >= e || !is_digit(*c)) return fail(p, c, "invalid number: expected a digit after '.'");
        while (c < e && is_digit(*c)) c++;
        real = 1;
    }
    if (c < e && (*c == 'e' || *c == 'E')) {
        c++;
        if (c < e && (*c == '+' || *c == '-')) c++;
        if (c >= e || !is_digit(*c)) return fail(p, c, "invalid number: expected a digit in the exponent");
        while (c < e && is_digit(*c)) c++;
        real = 1;
    }
    p->cur = c;
    v->type = KS_JSON_NUMBER;
    if (!real) {
        /* integer fast path with exact int64 range check */
        uint64_t u = 0, lim = neg ? (uint64_t)INT64_MAX + 1 : (uint64_t)INT64_MAX;
        int ok = 1;
        for (const char *d = st + neg; d < int_end; d++) {
            unsigned dig = (unsigned)(*d - '0');
            if (u > (lim - dig) / 10) { ok = 0; break; }
            u = u * 10 + dig;
        }
        if (ok) {
            v->is_int = 1;
            v->inum = neg ? (u == (uint64_t)INT64_MAX + 1 ? INT64_MIN : -(int64_t)u) : (int64_t)u;
            v->num = neg && u == 0 ? -0.0 : (double)v->inum;
            return 0;
        }
    }
    /* general case: strtod on a NUL-terminated copy, with the locale's decimal point */
    size_t n = (size_t)(c - st);
    char sbuf[64], *buf = n < sizeof sbuf ? sbuf : ks_malloc(n + 1);
    if (!buf) return -1;
    memcpy(buf, st, n);
    buf[n] = 0;
    if (p->dec != '.')
        for (size_t i = 0; i < n; i++)
            if (buf[i] == '.') buf[i] = p->dec;
    errno = 0;
    double d = strtod(buf, NULL);
    int range = errno == ERANGE && isinf(d);
    if (buf != sbuf) free(buf);
    if (range) return fail(p, st, "number out of range of a double");
    v->num = d;
    return 0;
}

static int push_value(jp *p, const ks_json *v) {
    if (p->vn == p->vcap) {
        size_t nc = p->vcap ? p->vcap * 2 : 256;
        ks_json *n = ks_realloc(p->vs, nc * sizeof *n);
        if (!n) return -1;
        p->vs = n;
        p->vcap = nc;
    }
    p->vs[p->vn++] = *v;
    return 0;
}

static int push_key(jp *p, const char *k, size_t len) {
    if (p->kn == p->kcap) {
        size_t nc = p->kcap ? p->kcap * 2 : 256;
        const char **a = ks_realloc(p->ks, nc * sizeof *a);
        if (!a) return -1;
        p->ks = a;
        size_t *b = ks_realloc(p->kl, nc * sizeof *b);
        if (!b) return -1;
        p->kl = b;
        p->kcap = nc;
    }
    p->ks[p->kn] = k;
    p->kl[p->kn++] = len;
    return 0;
}

static int parse_value(jp *p, ks_json *v);

/* Move the pending values (and keys) above `vb` / `kb` into the arena as v's children. */
static int close_container(jp *p, ks_json *v, size_t vb, size_t kb, int object) {
    size_t n = p->vn - vb;
    v->len = n;
    if (n) {
        v->items = jarena_alloc(p->doc, n * sizeof(ks_json));
        if (!v->items) return -1;
        memcpy(v->items, p->vs + vb, n * sizeof(ks_json));
        if (object) {
            v->keys = jarena_alloc(p->doc, n * sizeof(const char *));
            v->key_lens = jarena_alloc(p->doc, n * sizeof(size_t));
            if (!v->keys || !v->key_lens) return -1;
            memcpy(v->keys, p->ks + kb, n * sizeof(const char *));
            memcpy(v->key_lens, p->kl + kb, n * sizeof(size_t));
        }
    }
    p->vn = vb;
    p->kn = kb;
    p->depth--;
    return 0;
}

static int parse_array(jp *p, ks_json *v) {
    const char *open = p->cur;
    if (++p->depth > KS_JSON_MAX_DEPTH) return fail(p, open, "nesting deeper than %d levels", KS_JSON_MAX_DEPTH);
    v->type = KS_JSON_ARRAY;
    size_t vb = p->vn;
    p->cur++;
    skip_ws(p);
    if (p->cur < p->end && *p->cur == ']') { p->cur++; return close_container(p, v, vb, p->kn, 0); }
    for (;;) {
        ks_json item;
        if (parse_value(p, &item) || push_value(p, &item)) return -1;
        skip_ws(p);
        if (p->cur >= p->end) return fail(p, open, "unterminated array (end of input before ']')");
        char c = *p->cur;
        if (c == ']') { p->cur++; break; }
        if (c != ',') {
            char buf[16];
            return fail(p, p->cur, "expected ',' or ']' after an array element, found %s", show_char(p, p->cur, buf));
        }
        p->cur++;
        skip_ws(p);
        if (p->cur < p->end && *p->cur == ']') return fail(p, p->cur, "trailing comma before ']'");
    }
    return close_container(p, v, vb, p->kn, 0);
}

static int parse_object(jp *p, ks_json *v) {
    const char *open = p->cur;
    if (++p->depth > KS_JSON_MAX_DEPTH) return fail(p, open, "nesting deeper than %d levels", KS_JSON_MAX_DEPTH);
    v->type = KS_JSON_OBJECT;
    size_t vb = p->vn, kb = p->kn;
    p->cur++;
    skip_ws(p);
    if (p->cur < p->end && *p->cur == '}') { p->cur++; return close_container(p, v, vb, kb, 1); }
    for (;;) {
        char buf[16];
        if (p->cur >= p->end) return fail(p, open, "unterminated object (end of input before '}')");
        if (*p->cur != '"')
            return fail(p, p->cur, "expected a string key in an object, found %s", show_char(p, p->cur, buf));
        const char *key;
        size_t klen;
        if (parse_string(p, &key, &klen) || push_key(p, key, klen)) return -1;
        skip_ws(p);
        if (p->cur >= p->end || *p->cur != ':')
            return fail(p, p->cur, "expected ':' after an object key, found %s", show_char(p, p->cur, buf));
        p->cur++;
        ks_json item;
        if (parse_value(p, &item) || push_value(p, &item)) return -1;
        skip_ws(p);
        if (p->cur >= p->end) return fail(p, open, "unterminated object (end of input before '}')");
        char c = *p->cur;
        if (c == '}') { p->cur++; break; }
        if (c != ',')
            return fail(p, p->cur, "expected ',' or '}' after an object member, found %s", show_char(p, p->cur, buf));
        p->cur++;
        skip_ws(p);
        if (p->cur < p->end && *p->cur == '}') return fail(p, p->cur, "trailing comma before '}'");
    }
    return close_container(p, v, vb, kb, 1);
}

static int parse_literal(jp *p, const char *word, size_t n) {
    if ((size_t)(p->end - p->cur) < n || memcmp(p->cur, word, n) != 0)
        return fail(p, p->cur, "invalid literal (expected '%s')", word);
    p->cur += n;
    return 0;
}

static int parse_value(jp *p, ks_json *v) {
    memset(v, 0, sizeof *v);
    skip_ws(p);
    if (p->cur >= p->end) return fail(p, p->cur, "unexpected end of input (expected a value)");
    char c = *p->cur;
    switch (c) {
    case '{': return parse_object(p, v);
    case '[': return parse_array(p, v);
    case '"':
        v->type = KS_JSON_STRING;
        return parse_string(p, &v->str, &v->len);
    case 't': v->type = KS_JSON_BOOL; v->boolean = 1; return parse_literal(p, "true", 4);
    case 'f': v->type = KS_JSON_BOOL; v->boolean = 0; return parse_literal(p, "false", 5);
    case 'n': v->type = KS_JSON_NULL; return parse_literal(p, "null", 4);
    default:
        if (c == '-' || is_digit(c)) return parse_number(p, v);
        {
            char buf[16];
            return fail(p, p->cur, "unexpected %s (expected a value)", show_char(p, p->cur, buf));
        }
    }
}

ks_json *ks_json_parse(const char *text, size_t len) {
    if (!text && len) {
        ks_errorf(KS_ERR_ARG, "ks_json_parse: NULL text with length %zu", len);
        return NULL;
    }
    if (!text) text = "";
    jp p = {0};
    p.beg = p.cur = text;
    p.end = text + len;
    const char *dp = localeconv()->decimal_point;
    p.dec = dp && dp[0] ? dp[0] : '.';
    p.doc = ks_calloc(1, sizeof(jdoc));
    if (!p.doc) return NULL;
    /* first block sized from the input (untouched pages of a large malloc cost nothing) */
    size_t guess = len > ((size_t)1 << 28) ? ((size_t)1 << 30) : len * 4;
    p.doc->next_cap = KS_MAX(guess, (size_t)4096);
    if (len >= 3 && memcmp(text, "\xEF\xBB\xBF", 3) == 0) p.cur += 3;
    int rc = parse_value(&p, &p.doc->root);
    if (!rc) {
        skip_ws(&p);
        if (p.cur < p.end) rc = fail(&p, p.cur, "trailing characters after the JSON value");
    }
    free(p.vs);
    free(p.ks);
    free(p.kl);
    if (rc) {
        jdoc_free(p.doc);
        return NULL;
    }
    return &p.doc->root;
}

void ks_json_free(ks_json *root) {
    if (!root) return;
    jdoc_free((jdoc *)((char *)root - offsetof(jdoc, root)));
}

/* ---------------------------------------------------------------- getters */

const ks_json *ks_json_get(const ks_json *obj, const char *key) {
    if (!obj || obj->type != KS_JSON_OBJECT || !key) return NULL;
    size_t n = strlen(key);
    for (size_t i = 0; i < obj->len; i++)
        if (obj->key_lens[i] == n && memcmp(obj->keys[i], key, n) == 0) return &obj->items[i];
    return NULL;
}

double ks_json_num(const ks_json *obj, const char *key, double def) {
    const ks_json *v = ks_json_get(obj, key);
    return v && v->type == KS_JSON_NUMBER ? v->num : def;
}

/* Integers written as such, or numbers with an exactly integral value in range (2.0, 1e3). */
int64_t ks_json_int(const ks_json *obj, const char *key, int64_t def) {
    const ks_json *v = ks_json_get(obj, key);
    if (!v || v->type != KS_JSON_NUMBER) return def;
    if (v->is_int) return v->inum;
    if (isfinite(v->num) && v->num == floor(v->num) && v->num >= -9223372036854775808.0 &&
        v->num < 9223372036854775808.0)
        return (int64_t)v->num;
    return def;
}

const char *ks_json_str(const ks_json *obj, const char *key, const char *def) {
    const ks_json *v = ks_json_get(obj, key);
    return v && v->type == KS_JSON_STRING ? v->str : def;
}

int ks_json_bool(const ks_json *obj, const char *key, int def) {
    const ks_json *v = ks_json_get(obj, key);
    return v && v->type == KS_JSON_BOOL ? v->boolean : def;
}
