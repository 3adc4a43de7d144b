/* tokenizer_bpe.c — the tokenizer's model side (tokenizer_int.h): the hash maps of the vocab,
 * the added tokens and the merges, the BPE model (one pre-token -> ids, lowest merge rank
 * first), and the added tokens (a byte trie and HF's leftmost-longest matching with
 * single_word / lstrip / rstrip). */
#include "tokenizer_int.h"

#include <utf8proc.h>

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

int tok_sm_init(strmap *m, size_t count) {
    size_t cap = 16;
    while (cap < count * 2 + 1) cap *= 2;
    m->s = ks_malloc(cap * sizeof *m->s);
    if (!m->s) return -1;
    for (size_t i = 0; i < cap; i++) m->s[i].len = UINT32_MAX;
    m->mask = cap - 1;
    return 0;
}
/* The slot holding key, or the empty slot where it would go (*h32: the key's hash tag). */
sm_slot *tok_sm_slot_for(const strmap *m, const char *base, const char *k, size_t n, uint32_t *h32) {
    uint64_t h = hash_bytes(k, n);
    *h32 = (uint32_t)(h >> 32);
    for (size_t i = (size_t)h & m->mask;; i = (i + 1) & m->mask) {
        sm_slot *x = &m->s[i];
        if (x->len == UINT32_MAX) return x;
        if (x->hash == *h32 && x->len == n && memcmp(base + x->off, k, n) == 0) return x;
    }
}
int32_t tok_sm_get(const strmap *m, const char *base, const char *k, size_t n) {
    if (!m->s) return -1;
    uint32_t h;
    sm_slot *x = tok_sm_slot_for(m, base, k, n, &h);
    return x->len == UINT32_MAX ? -1 : x->val;
}

int tok_pm_init(pairmap *m, size_t count) {
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
size_t tok_pm_index(const pairmap *m, uint64_t k) {
    uint64_t h = k * 0x9E3779B97F4A7C15ull;
    h ^= h >> 29;
    for (size_t i = (size_t)(h >> 16) & m->mask;; i = (i + 1) & m->mask)
        if (m->key[i] == k || m->key[i] == PM_EMPTY) return i;
}
static int pm_get(const pairmap *m, int32_t a, int32_t b, uint32_t *rank, int32_t *nid) {
    if (!m->key) return 0;
    uint64_t k = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
    size_t i = tok_pm_index(m, k);
    if (m->key[i] == PM_EMPTY) return 0;
    *rank = m->rank[i];
    *nid = m->nid[i];
    return 1;
}

/* ================================================================ BPE model */

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
ks_status tok_bpe_word(const ks_tokenizer *t, ectx *c, const char *w, size_t n, vec *ids) {
    if (n == 0) return KS_OK;
    const char *A = ARENA(t);
    if (t->ignore_merges) {
        int32_t id = tok_sm_get(&t->vocab, A, w, n);
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
        int32_t id = tok_sm_get(&t->vocab, A, s, sl);
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
                int32_t uid = tok_sm_get(&t->vocab, A, A + t->unk_off, t->unk_len);
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

int tok_trie_insert(trie *tr, const char *s, size_t n, int32_t tok) {
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
ks_status tok_find_added(const ks_tokenizer *t, const trie *tr, const char *s, size_t n, vec *out) {
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

