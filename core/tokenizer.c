/* tokenizer.c — Hugging Face tokenizer.json (BPE models), matching the `tokenizers` library:
 * encode, decode and the queries (tokenizer.h). The pipeline, the shared structures and which
 * file holds what: tokenizer_int.h. Nothing here keeps mutable state after loading:
 * encode/decode may run on many threads. */
#include "tokenizer_int.h"

/* ================================================================ UTF-8 checks */

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

/* ================================================================ encode */

static void ectx_free(ectx *c) {
    tok_rxctx_free(&c->rc);
    vec_free(&c->spans);
    vec_free(&c->spans2);
    sb_free(&c->tmp);
    vec_free(&c->syms);
    vec_free(&c->heap);
    sb_free(&c->word);
}

/* normalized segment -> pre-tokenizer -> model */
static ks_status encode_plain(const ks_tokenizer *t, ectx *c, const char *s, size_t n, int first, vec *ids) {
    sbuf buf = {0};
    vec pcs = {.isz = sizeof(piece)};
    ks_status st = KS_OK;
    if (sb_put(&buf, s, n) || push_piece(&pcs, 0, n, first)) st = KS_ERR_OOM;
    if (!st && t->pre) st = tok_pre_apply(t, t->pre, c, &buf, &pcs);
    for (size_t i = 0; !st && i < pcs.n; i++) {
        piece *p = (piece *)pcs.v + i;
        st = tok_bpe_word(t, c, buf.p + p->off, p->len, ids);
    }
    sb_free(&buf);
    vec_free(&pcs);
    return st;
}

static ks_status encode_text(const ks_tokenizer *t, ectx *c, const char *text, size_t len, vec *ids) {
    vec seg = {.isz = sizeof(span)}, seg2 = {.isz = sizeof(span)};
    sbuf nbuf = {0};
    ks_status st = tok_find_added(t, &t->trie_raw, text, len, &seg);
    for (size_t i = 0; !st && i < seg.n; i++) {
        span x = ((span *)seg.v)[i];
        if (x.e == x.s) continue;
        if (x.m) { if (push_id(ids, t->added[x.m - 1].id)) st = KS_ERR_OOM; continue; }
        nbuf.n = 0;
        if (sb_put(&nbuf, "", 0)) { st = KS_ERR_OOM; break; }
        st = tok_norm_apply(t->norm, &c->rc, text + x.s, x.e - x.s, &nbuf);
        if (!st) st = tok_find_added(t, &t->trie_norm, nbuf.p, nbuf.n, &seg2);
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
            st = tok_find_matches(&pt, rc, s, SL_LEN(in, i), &m);
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
    tok_rxctx_free(&rc);
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
    int32_t id = tok_sm_get(&tok->added_map, ARENA(tok), token, n);
    return id >= 0 ? id : tok_sm_get(&tok->vocab, ARENA(tok), token, n);
}

const char *ks_tokenizer_token_str(const ks_tokenizer *tok, int32_t id) {
    if (!tok || id < 0 || id >= tok->n_ids || !(tok->ids[id].flags & ID_PRESENT)) return NULL;
    return ARENA(tok) + tok->ids[id].off;
}

int ks_tokenizer_is_special(const ks_tokenizer *tok, int32_t id) {
    if (!tok || id < 0 || id >= tok->n_ids) return 0;
    return (tok->ids[id].flags & ID_SPECIAL) != 0;
}

