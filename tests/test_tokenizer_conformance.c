/* test_tokenizer_conformance.c — our tokenizer against the official Hugging Face library
 * (npm package `tokenizers`) on the real tokenizer.json files of Llama 3, Qwen 3 and
 * Mistral 7B, over a corpus of several hundred KB of varied text (prose, code, numbers,
 * CJK, emoji, odd whitespace, NFC/NFD accents, contractions, special-token strings inside
 * text, RTL, Cyrillic, mixed scripts, long runs), one document at a time.
 *
 * The inputs are made by tests/tokenizer/setup.sh (node + npm) under tests/tokenizer/build/
 * (env KS_TOKREF_DIR overrides): corpus.bin (see make_corpus.js), <name>.tokenizer.json and
 * <name>.ref (see gen_ref.js). Without them the tests skip and say how to make them.
 *
 * Per document we require, exactly:
 *   encode(x, add_special=1) == HF ids        encode(x, add_special=0) == HF ids
 *   decode(HF ids0, skip_special=0) == HF     decode(HF ids1, skip_special=1 and 0) == HF
 *   decode(encode(x, 0), 0) == x wherever HF itself round-trips. HF does not for Qwen on
 *   non-NFC text (its NFC normalizer: the result is NFC(x)), nor for Mistral where x holds
 *   "▁" (decoded as a space) or text right after a special token string (each segment
 *   after an added token gets its own "▁" prefix, decoded as a space). gen_ref.js prints
 *   those counts; here they are covered by the decode == HF checks.
 * A failure prints, for the first failing document of each text class, the text around the
 * divergence and both id sequences with their token strings, then a table of failures. */
#include "ktest.h"

#include "common.h"
#include "tokenizer.h"

#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define TC_MIN_BYTES (200u * 1024u)
#define TC_MAX_CLASSES 32
#define TC_MAX_DETAILED 12

static const char *tc_dir(void) {
    const char *e = getenv("KS_TOKREF_DIR");
    return e && *e ? e : "tests/tokenizer/build";
}

static uint32_t tc_fnv1a32(const char *p, size_t n) {
    uint32_t h = 0x811c9dc5u;
    for (size_t i = 0; i < n; i++) h = (h ^ (uint8_t)p[i]) * 0x01000193u;
    return h;
}

/* ------------------------------------------------------------ a cursor over a buffer */

typedef struct {
    const char *p, *end, *file;
    char err[512];
} tc_cur;

static int tc_fail(tc_cur *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int tc_fail(tc_cur *c, const char *fmt, ...) {
    if (c->err[0]) return -1;
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    snprintf(c->err, sizeof c->err, "%s: %s (rerun tests/tokenizer/setup.sh)", c->file, msg);
    return -1;
}

/* The next space- or newline-delimited word into w (NUL-terminated); skips one separator. */
static int tc_word(tc_cur *c, char *w, size_t wn) {
    size_t k = 0;
    while (c->p < c->end && *c->p != ' ' && *c->p != '\n') {
        if (k + 1 >= wn) return tc_fail(c, "word too long");
        w[k++] = *c->p++;
    }
    w[k] = 0;
    if (c->p >= c->end) return tc_fail(c, "unexpected end of file");
    c->p++;
    return k ? 0 : tc_fail(c, "empty field");
}

static int tc_expect(tc_cur *c, const char *tag) {
    char w[64];
    if (tc_word(c, w, sizeof w)) return -1;
    return strcmp(w, tag) ? tc_fail(c, "expected '%s', found '%s'", tag, w) : 0;
}

static int tc_u64(tc_cur *c, uint64_t *v) {
    char w[32], *e;
    if (tc_word(c, w, sizeof w)) return -1;
    errno = 0;
    unsigned long long x = strtoull(w, &e, 10);
    if (*e || errno || w[0] == '-') return tc_fail(c, "bad number '%s'", w);
    *v = x;
    return 0;
}

static int tc_skip_line(tc_cur *c) {
    const char *nl = memchr(c->p, '\n', (size_t)(c->end - c->p));
    if (!nl) return tc_fail(c, "unexpected end of file");
    c->p = nl + 1;
    return 0;
}

/* "<tag> <n> v1 ... vn\n" into a malloc'd array. */
static int tc_ints(tc_cur *c, const char *tag, int32_t **out, size_t *n_out) {
    uint64_t n, v;
    if (tc_expect(c, tag) || tc_u64(c, &n)) return -1;
    if (n > (uint64_t)(c->end - c->p)) return tc_fail(c, "%s: count %llu too large", tag, (unsigned long long)n);
    int32_t *a = malloc((n ? n : 1) * sizeof *a);
    if (!a) return tc_fail(c, "out of memory");
    for (uint64_t i = 0; i < n; i++) {
        if (tc_u64(c, &v)) { free(a); return -1; }
        if (v > INT32_MAX) { free(a); return tc_fail(c, "%s: value %llu out of range", tag, (unsigned long long)v); }
        a[i] = (int32_t)v;
    }
    *out = a;
    *n_out = (size_t)n;
    return 0;
}

/* "<tag> <nbytes>\n<bytes>\n": points into the buffer. */
static int tc_blob(tc_cur *c, const char *tag, const char **p, size_t *n) {
    uint64_t len;
    if (tc_expect(c, tag) || tc_u64(c, &len)) return -1;
    if (len + 1 > (uint64_t)(c->end - c->p) || c->p[len] != '\n') return tc_fail(c, "%s: bad length %llu", tag, (unsigned long long)len);
    *p = c->p;
    *n = (size_t)len;
    c->p += len + 1;
    return 0;
}

/* ------------------------------------------------------------ corpus and reference */

typedef struct {
    const char *text;
    size_t len;
    char cls[32];
    int32_t *ids1, *ids0, *off0;
    size_t n1, n0, noff;
    const char *dec0, *dec1s, *dec1;
    size_t ldec0, ldec1s, ldec1;
} tc_doc;

typedef struct {
    char *cbuf, *rbuf;
    size_t clen, rlen;
    tc_doc *docs;
    size_t n, total;
    char err[600];
} tc_data;

static void tc_data_free(tc_data *d) {
    if (d->docs)
        for (size_t i = 0; i < d->n; i++) { free(d->docs[i].ids1); free(d->docs[i].ids0); free(d->docs[i].off0); }
    free(d->docs);
    free(d->cbuf);
    free(d->rbuf);
    memset(d, 0, sizeof *d);
}

static int tc_load_corpus(tc_data *d, const char *path) {
    size_t len;
    if (ks_read_file(path, &d->cbuf, &len) != KS_OK) {
        snprintf(d->err, sizeof d->err, "%s", ks_last_error());
        return -1;
    }
    d->clen = len;
    tc_cur c = {d->cbuf, d->cbuf + len, path, {0}};
    uint64_t n, total, idx, nb;
    char cls[32];
    if (tc_expect(&c, "kvsieve-tokenizer-corpus") || tc_expect(&c, "1") || tc_u64(&c, &n) || tc_u64(&c, &total)) goto bad;
    if (n == 0 || n > len) { tc_fail(&c, "bad document count"); goto bad; }
    d->docs = calloc((size_t)n, sizeof *d->docs);
    if (!d->docs) { tc_fail(&c, "out of memory"); goto bad; }
    d->n = (size_t)n;
    size_t sum = 0;
    for (size_t i = 0; i < d->n; i++) {
        if (tc_expect(&c, "doc") || tc_u64(&c, &idx) || tc_u64(&c, &nb) || tc_word(&c, cls, sizeof cls)) goto bad;
        if (idx != i) { tc_fail(&c, "document %zu numbered %llu", i, (unsigned long long)idx); goto bad; }
        if (nb + 1 > (uint64_t)(c.end - c.p) || c.p[nb] != '\n') { tc_fail(&c, "document %zu: bad length", i); goto bad; }
        tc_doc *D = &d->docs[i];
        D->text = c.p;
        D->len = (size_t)nb;
        snprintf(D->cls, sizeof D->cls, "%s", cls);
        c.p += nb + 1;
        sum += (size_t)nb;
    }
    if (sum != total) { tc_fail(&c, "documents hold %zu bytes, header says %llu", sum, (unsigned long long)total); goto bad; }
    d->total = sum;
    return 0;
bad:
    snprintf(d->err, sizeof d->err, "%s", c.err);
    return -1;
}

static int tc_load_ref(tc_data *d, const char *path, const char *name, const char *tok_path) {
    size_t len;
    if (ks_read_file(path, &d->rbuf, &len) != KS_OK) {
        snprintf(d->err, sizeof d->err, "%s", ks_last_error());
        return -1;
    }
    d->rlen = len;
    tc_cur c = {d->rbuf, d->rbuf + len, path, {0}};
    char w[128], hash[32];
    uint64_t n, total, idx;
    if (tc_expect(&c, "kvsieve-tokenizer-ref") || tc_expect(&c, "1")) goto bad;
    if (tc_expect(&c, "tokenizer") || tc_expect(&c, name) || tc_word(&c, w, sizeof w) || tc_word(&c, hash, sizeof hash)) goto bad;
    {
        char *tj = NULL;
        size_t tl = 0;
        if (ks_read_file(tok_path, &tj, &tl) != KS_OK) { tc_fail(&c, "%s", ks_last_error()); goto bad; }
        char mine[16];
        snprintf(mine, sizeof mine, "%08x", tc_fnv1a32(tj, tl));
        free(tj);
        if (strcmp(mine, hash)) { tc_fail(&c, "made from another %s (hash %s, file has %s): stale", tok_path, hash, mine); goto bad; }
    }
    if (tc_expect(&c, "library") || tc_skip_line(&c)) goto bad;
    if (tc_expect(&c, "corpus") || tc_u64(&c, &n) || tc_u64(&c, &total) || tc_word(&c, hash, sizeof hash)) goto bad;
    {
        char mine[16];
        snprintf(mine, sizeof mine, "%08x", tc_fnv1a32(d->cbuf, d->clen));
        if (n != d->n || total != d->total || strcmp(mine, hash)) {
            tc_fail(&c, "made from another corpus.bin (%llu docs, %llu bytes, hash %s; corpus.bin has %zu, %zu, %s): stale",
                    (unsigned long long)n, (unsigned long long)total, hash, d->n, d->total, mine);
            goto bad;
        }
    }
    for (size_t i = 0; i < d->n; i++) {
        tc_doc *D = &d->docs[i];
        size_t noff;
        if (tc_expect(&c, "doc") || tc_u64(&c, &idx)) goto bad;
        if (idx != i) { tc_fail(&c, "document %zu numbered %llu", i, (unsigned long long)idx); goto bad; }
        if (tc_ints(&c, "ids1", &D->ids1, &D->n1) || tc_ints(&c, "ids0", &D->ids0, &D->n0) ||
            tc_ints(&c, "off0", &D->off0, &noff))
            goto bad;
        D->noff = noff;
        if (noff != D->n0) { tc_fail(&c, "document %zu: %zu offsets for %zu ids", i, noff, D->n0); goto bad; }
        if (tc_blob(&c, "dec0", &D->dec0, &D->ldec0) || tc_blob(&c, "dec1s", &D->dec1s, &D->ldec1s) ||
            tc_blob(&c, "dec1", &D->dec1, &D->ldec1))
            goto bad;
    }
    if (tc_expect(&c, "end")) goto bad;
    return 0;
bad:
    snprintf(d->err, sizeof d->err, "%s", c.err);
    return -1;
}

/* ------------------------------------------------------------ readable diffs */

/* Print bytes [a, b) of s, escaping controls, quotes and invalid bytes; UTF-8 stays raw. */
static void tc_put_escaped(const char *s, size_t a, size_t b) {
    for (size_t i = a; i < b; i++) {
        unsigned char ch = (unsigned char)s[i];
        if (ch == '\n') fputs("\\n", stderr);
        else if (ch == '\r') fputs("\\r", stderr);
        else if (ch == '\t') fputs("\\t", stderr);
        else if (ch == '"' || ch == '\\') fprintf(stderr, "\\%c", ch);
        else if (ch < 0x20 || ch == 0x7f) fprintf(stderr, "\\x%02x", ch);
        else fputc(ch, stderr);
    }
}

/* Move i back to the start of a UTF-8 character. */
static size_t tc_char_start(const char *s, size_t n, size_t i) {
    if (i > n) i = n;
    size_t k = 0;
    while (i > 0 && i < n && ((unsigned char)s[i] & 0xC0) == 0x80 && k++ < 3) i--;
    return i;
}

static void tc_snippet(const char *label, const char *s, size_t n, size_t at) {
    size_t a = tc_char_start(s, n, at > 48 ? at - 48 : 0), m = tc_char_start(s, n, at),
           b = tc_char_start(s, n, at + 48 < n ? at + 48 : n);
    fprintf(stderr, "      %s (%zu bytes) near byte %zu: \"%s", label, n, at, a > 0 ? "..." : "");
    tc_put_escaped(s, a, m);
    fputs("\u27e6HERE\u27e7", stderr);
    tc_put_escaped(s, m, b);
    fprintf(stderr, "%s\"\n", b < n ? "..." : "");
}

static void tc_ids_window(const ks_tokenizer *tok, const char *label, const int32_t *ids, size_t n, size_t k) {
    size_t a = k > 3 ? k - 3 : 0, b = k + 6 < n ? k + 6 : n;
    fprintf(stderr, "      %-5s %zu ids, #%zu..: %s", label, n, a, a > 0 ? "... " : "");
    for (size_t i = a; i < b; i++) {
        const char *t = ks_tokenizer_token_str(tok, ids[i]);
        fprintf(stderr, "%s%d \"", i == k ? "\u27e6" : "", ids[i]);
        if (t) tc_put_escaped(t, 0, strlen(t));
        else fputs("?", stderr);
        fprintf(stderr, "\"%s ", i == k ? "\u27e7" : "");
    }
    fprintf(stderr, "%s\n", b < n ? "..." : "");
}

/* Byte offset in the document of token k of an HF id sequence: ids1 is ids0 with special
 * tokens around it, so find where ids0 sits inside it. */
static size_t tc_text_offset(const tc_doc *D, int is_ids1, size_t k) {
    size_t p = 0;
    if (is_ids1) {
        if (D->n1 < D->n0) return 0;
        for (p = 0; p + D->n0 <= D->n1; p++)
            if (!D->n0 || !memcmp(D->ids1 + p, D->ids0, D->n0 * sizeof(int32_t))) break;
        if (p + D->n0 > D->n1) return 0;
        if (k < p) return 0;
        k -= p;
    }
    return k < D->noff ? (size_t)D->off0[k] : D->len;
}

/* ------------------------------------------------------------ the comparison */

enum { K_ENC1, K_ENC0, K_DEC0, K_DEC1S, K_DEC1, K_RT, K_N };
static const char *const tc_kind_names[K_N] = {"encode(add_special=1)", "encode(add_special=0)",
                                               "decode(ids0,skip=0)", "decode(ids1,skip=1)",
                                               "decode(ids1,skip=0)", "decode(encode(x))==x"};
static const char *const tc_kind_short[K_N] = {"enc1", "enc0", "dec0", "dec1s", "dec1", "rt"};

typedef struct {
    char cls[32];
    int docs, failed_docs, kind_fail[K_N], detailed;
    size_t bytes;
    int first_bad;
} tc_cls;

static tc_cls *tc_class(tc_cls *cl, int *ncl, const char *name) {
    for (int i = 0; i < *ncl; i++)
        if (!strcmp(cl[i].cls, name)) return &cl[i];
    if (*ncl >= TC_MAX_CLASSES) return &cl[TC_MAX_CLASSES - 1];
    tc_cls *c = &cl[(*ncl)++];
    memset(c, 0, sizeof *c);
    snprintf(c->cls, sizeof c->cls, "%s", name);
    c->first_bad = -1;
    return c;
}

static int tc_ids_equal(const int32_t *a, size_t na, const int32_t *b, size_t nb, size_t *k) {
    size_t i = 0;
    while (i < na && i < nb && a[i] == b[i]) i++;
    *k = i;
    return na == nb && i == na;
}

static size_t tc_first_diff(const char *a, size_t na, const char *b, size_t nb) {
    size_t i = 0;
    while (i < na && i < nb && a[i] == b[i]) i++;
    return i;
}

static void tc_header(int *printed, const char *name, size_t di, const tc_doc *D) {
    if (*printed) return;
    *printed = 1;
    fprintf(stderr, "\n    %s: document %zu (class %s, %zu bytes) differs from HF tokenizers:\n", name, di, D->cls, D->len);
}

static void tc_run(kt_ctx *kt_, const char *name) {
    char corpus_path[1024], ref_path[1024], tok_path[1024];
    const char *dir = tc_dir();
    snprintf(corpus_path, sizeof corpus_path, "%s/corpus.bin", dir);
    snprintf(ref_path, sizeof ref_path, "%s/%s.ref", dir, name);
    snprintf(tok_path, sizeof tok_path, "%s/%s.tokenizer.json", dir, name);
    struct stat st;
    const char *paths[3] = {corpus_path, ref_path, tok_path};
    for (int i = 0; i < 3; i++)
        if (stat(paths[i], &st) != 0)
            KT_SKIP("%s absent: run tests/tokenizer/setup.sh (needs node >= 18 and npm; it installs the pinned "
                    "HF `tokenizers` and the tokenizer.json packages, builds the corpus and the reference ids)",
                    paths[i]);

    tc_data d;
    memset(&d, 0, sizeof d);
    int ok = tc_load_corpus(&d, corpus_path) == 0 && tc_load_ref(&d, ref_path, name, tok_path) == 0;
    if (!ok) {
        char msg[sizeof d.err];
        memcpy(msg, d.err, sizeof msg);
        tc_data_free(&d);
        KT_CHECK(ok, "%s", msg);
    }

    ks_tokenizer *tok = NULL;
    ks_status lst = ks_tokenizer_load(tok_path, &tok);
    if (lst != KS_OK) {
        tc_data_free(&d);
        KT_CHECK(lst == KS_OK, "ks_tokenizer_load(%s): %s: %s", tok_path, ks_status_name(lst), ks_last_error());
    }

    tc_cls cl[TC_MAX_CLASSES];
    int ncl = 0, detailed = 0, bad_docs = 0;
    int kind_total[K_N] = {0};
    size_t bytes = 0, ids_compared = 0;
    double t_enc = 0;

    for (size_t di = 0; di < d.n; di++) {
        const tc_doc *D = &d.docs[di];
        tc_cls *C = tc_class(cl, &ncl, D->cls);
        C->docs++;
        C->bytes += D->len;
        bytes += D->len;
        int fail[K_N] = {0};
        int show = detailed < TC_MAX_DETAILED && !C->detailed;
        int printed = 0;

        /* encodes */
        int32_t *ours0 = NULL;
        size_t n_ours0 = 0;
        for (int add = 1; add >= 0; add--) {
            int kind = add ? K_ENC1 : K_ENC0;
            const int32_t *ref = add ? D->ids1 : D->ids0;
            size_t nref = add ? D->n1 : D->n0, n = 0, k = 0;
            int32_t *ids = NULL;
            double t0 = ks_now();
            ks_status est = ks_tokenizer_encode(tok, D->text, D->len, add, &ids, &n);
            t_enc += ks_now() - t0;
            ids_compared += nref;
            if (est != KS_OK) {
                fail[kind] = 1;
                if (show) {
                    tc_header(&printed, name, di, D);
                    fprintf(stderr, "      %s failed: %s: %s\n", tc_kind_names[kind], ks_status_name(est), ks_last_error());
                }
                free(ids);
                continue;
            }
            if (!tc_ids_equal(ids, n, ref, nref, &k)) {
                fail[kind] = 1;
                if (show) {
                    tc_header(&printed, name, di, D);
                    fprintf(stderr, "      %s: first difference at id #%zu (ours %zu ids, HF %zu)\n", tc_kind_names[kind], k, n, nref);
                    tc_snippet("text", D->text, D->len, tc_text_offset(D, add, k));
                    tc_ids_window(tok, "HF", ref, nref, k);
                    tc_ids_window(tok, "ours", ids, n, k);
                }
            }
            if (add) free(ids);
            else { ours0 = ids; n_ours0 = n; }
        }

        /* decodes of HF's ids */
        struct { int kind; const int32_t *ids; size_t n; int skip; const char *ref; size_t lref; } dq[3] = {
            {K_DEC0, D->ids0, D->n0, 0, D->dec0, D->ldec0},
            {K_DEC1S, D->ids1, D->n1, 1, D->dec1s, D->ldec1s},
            {K_DEC1, D->ids1, D->n1, 0, D->dec1, D->ldec1},
        };
        for (int q = 0; q < 3; q++) {
            char *text = NULL;
            size_t len = 0;
            ks_status dst = ks_tokenizer_decode(tok, dq[q].ids, dq[q].n, dq[q].skip, &text, &len);
            if (dst != KS_OK) {
                fail[dq[q].kind] = 1;
                if (show) {
                    tc_header(&printed, name, di, D);
                    fprintf(stderr, "      %s failed: %s: %s\n", tc_kind_names[dq[q].kind], ks_status_name(dst), ks_last_error());
                }
            } else if (len != dq[q].lref || memcmp(text, dq[q].ref, len)) {
                fail[dq[q].kind] = 1;
                if (show) {
                    size_t at = tc_first_diff(text, len, dq[q].ref, dq[q].lref);
                    tc_header(&printed, name, di, D);
                    fprintf(stderr, "      %s of HF's ids: first difference at byte %zu\n", tc_kind_names[dq[q].kind], at);
                    tc_snippet("HF  ", dq[q].ref, dq[q].lref, at);
                    tc_snippet("ours", text, len, at);
                }
            }
            free(text);
        }

        /* round trip, where HF round-trips */
        if (D->ldec0 == D->len && !memcmp(D->dec0, D->text, D->len) && ours0) {
            char *text = NULL;
            size_t len = 0;
            ks_status rst = ks_tokenizer_decode(tok, ours0, n_ours0, 0, &text, &len);
            if (rst != KS_OK || len != D->len || memcmp(text, D->text, len)) {
                fail[K_RT] = 1;
                if (show) {
                    tc_header(&printed, name, di, D);
                    if (rst != KS_OK) fprintf(stderr, "      %s: decode failed: %s\n", tc_kind_names[K_RT], ks_last_error());
                    else {
                        size_t at = tc_first_diff(text, len, D->text, D->len);
                        fprintf(stderr, "      %s: first difference at byte %zu\n", tc_kind_names[K_RT], at);
                        tc_snippet("x   ", D->text, D->len, at);
                        tc_snippet("ours", text, len, at);
                    }
                }
            }
            free(text);
        }
        free(ours0);

        int any = 0;
        for (int k = 0; k < K_N; k++) {
            if (fail[k]) { any = 1; C->kind_fail[k]++; kind_total[k]++; }
        }
        if (any) {
            bad_docs++;
            C->failed_docs++;
            if (C->first_bad < 0) C->first_bad = (int)di;
            if (printed) { C->detailed = 1; detailed++; }
        }
    }
    ks_tokenizer_free(tok);

    fprintf(stderr, "\n    %s: %zu documents, %zu bytes, %zu HF ids; encode %.1f MB/s; %d documents differ\n", name, d.n,
            bytes, ids_compared, t_enc > 0 ? 2.0 * (double)bytes / t_enc / 1e6 : 0.0, bad_docs);
    if (bad_docs) {
        fprintf(stderr, "      checks: enc1/enc0 = ids of encode(x, add_special=1/0); dec0 = decode(HF ids0, skip_special=0);\n"
                        "      dec1s/dec1 = decode(HF ids1, skip_special=1/0); rt = decode(encode(x, 0), 0) == x where HF round-trips\n");
        fprintf(stderr, "      %-13s %5s %6s %5s  %s\n", "class", "docs", "bytes", "bad", "failing documents per check (first bad doc)");
        for (int i = 0; i < ncl; i++) {
            if (!cl[i].failed_docs) continue;
            fprintf(stderr, "      %-13s %5d %6zu %5d ", cl[i].cls, cl[i].docs, cl[i].bytes, cl[i].failed_docs);
            for (int k = 0; k < K_N; k++)
                if (cl[i].kind_fail[k]) fprintf(stderr, " %s:%d", tc_kind_short[k], cl[i].kind_fail[k]);
            if (cl[i].first_bad >= 0) fprintf(stderr, " (doc %d)", cl[i].first_bad);
            fputc('\n', stderr);
        }
        fprintf(stderr, "      (the other classes: no failures)\n");
    }
    size_t n_docs = d.n;
    if (bad_docs == 0 && bytes >= TC_MIN_BYTES) fprintf(stderr, "  %-44s ", ""); /* realign the runner's "ok" */
    tc_data_free(&d);
    KT_CHECK(bytes >= TC_MIN_BYTES, "only %zu bytes compared, need %u", bytes, TC_MIN_BYTES);
    KT_CHECK(bad_docs == 0, "%s: %d of %zu documents differ from HF tokenizers (%d encode+special, %d encode, "
             "%d decode ids0, %d decode skip_special, %d decode ids1, %d round trip)", name, bad_docs, n_docs,
             kind_total[K_ENC1], kind_total[K_ENC0], kind_total[K_DEC0], kind_total[K_DEC1S], kind_total[K_DEC1],
             kind_total[K_RT]);
}

KT_TEST(tokenizer_conformance_llama3) { tc_run(kt_, "llama3"); }
KT_TEST(tokenizer_conformance_qwen3) { tc_run(kt_, "qwen3"); }
KT_TEST(tokenizer_conformance_mistral) { tc_run(kt_, "mistral"); }
