/* tokenizer_load.c — reading tokenizer.json into a ks_tokenizer (tokenizer_int.h), and
 * ks_tokenizer_free. Anything the file holds that encode/decode would not honour is refused
 * with KS_ERR_UNSUPPORTED naming it; malformed input is KS_ERR_FORMAT with its JSON path. */
#include "tokenizer_int.h"

#include "json.h"

#include <stdio.h>

/* ================================================================ freeing */

static void norm_free(knorm *n) {
    if (!n) return;
    for (size_t i = 0; i < n->nk; i++) norm_free(&n->kids[i]);
    free(n->kids);
    free(n->a);
    free(n->b);
    tok_rx_free(n->rx);
}
static void pre_free(kpre *p) {
    if (!p) return;
    for (size_t i = 0; i < p->nk; i++) pre_free(&p->kids[i]);
    free(p->kids);
    tok_rx_free(p->rx);
    free(p->lit);
}
static void dec_free(kdec *d) {
    if (!d) return;
    for (size_t i = 0; i < d->nk; i++) dec_free(&d->kids[i]);
    free(d->kids);
    free(d->lit);
    free(d->content);
    tok_rx_free(d->rx);
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

/* ================================================================ loading */

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
        st = tok_rx_compile(r->str, r->len, rx);
        return st ? ks_error_prefix(st, "%s", where) : KS_OK;
    }
    return ks_errorf(KS_ERR_FORMAT, "%s: expected {\"String\": ...} or {\"Regex\": ...}", where);
}

static const char *type_of(const ks_json *o) {
    const ks_json *ty = ks_json_get(o, "type");
    return ty && ty->type == KS_JSON_STRING ? ty->str : NULL;
}

/* ---------------------------------------------------------------- components */

/* The start of every component loader: j must be an object no deeper than 32 components, and *ty
 * receives its "type" (NULL when absent: the caller says what that means for its kind). */
static ks_status comp_type(const ks_json *j, const char *where, int depth, const char **ty) {
    *ty = NULL;
    if (depth > 32) return ks_errorf(KS_ERR_FORMAT, "%s: nested too deeply", where);
    ks_status st = want(j, KS_JSON_OBJECT, where);
    if (!st) *ty = type_of(j);
    return st;
}

/* A "Sequence" normalizer, pre-tokenizer, decoder or post-processor: j[key] is an array of parts of
 * the same kind, each `size` bytes, loaded by `load` (at depth + 1, named where.key[i] in
 * messages) into an array this allocates. *parts receives the array and *nk the number of parts
 * loaded so far, also after a failure, so the caller's free releases exactly those. */
typedef ks_status (*part_loader)(const ks_json *j, void *part, const char *where, int depth);

static ks_status load_seq(const ks_json *j, const char *key, const char *where, int depth, size_t size,
                          part_loader load, void **parts, size_t *nk) {
    char sub[256];
    const ks_json *a = ks_json_get(j, key);
    snprintf(sub, sizeof sub, "%s.%s", where, key);
    ks_status st = want(a, KS_JSON_ARRAY, sub);
    if (st) return st;
    unsigned char *kids = ks_calloc(a->len ? a->len : 1, size);
    if (!kids) return KS_ERR_OOM;
    *parts = kids;
    for (size_t i = 0; i < a->len; i++) {
        snprintf(sub, sizeof sub, "%s.%s[%zu]", where, key, i);
        *nk = i + 1;
        if ((st = load(&a->items[i], kids + i * size, sub, depth + 1))) return st;
    }
    return KS_OK;
}

/* ---------------------------------------------------------------- normalizer */

static ks_status load_norm(const ks_json *j, knorm *n, const char *where, int depth);
static ks_status norm_part(const ks_json *j, void *part, const char *where, int depth) {
    return load_norm(j, part, where, depth);
}

static ks_status load_norm(const ks_json *j, knorm *n, const char *where, int depth) {
    memset(n, 0, sizeof *n);
    const char *ty;
    ks_status st = comp_type(j, where, depth, &ty);
    if (st) return st;
    if (!ty) return ks_errorf(KS_ERR_FORMAT, "%s: missing \"type\"", where);
    char sub[256];
    if (!strcmp(ty, "Sequence")) {
        n->type = N_SEQ;
        void *kids = NULL;
        st = load_seq(j, "normalizers", where, depth, sizeof *n->kids, norm_part, &kids, &n->nk);
        n->kids = kids;
        return st;
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

/* ByteLevel's split regex when use_regex (GPT-2's) */
static const char GPT2_PATTERN[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

static ks_status load_pre(const ks_json *j, kpre *p, const char *where, int depth);
static ks_status pre_part(const ks_json *j, void *part, const char *where, int depth) {
    return load_pre(j, part, where, depth);
}

static ks_status load_pre(const ks_json *j, kpre *p, const char *where, int depth) {
    memset(p, 0, sizeof *p);
    const char *ty;
    ks_status st = comp_type(j, where, depth, &ty);
    if (st) return st;
    if (!ty) return ks_errorf(KS_ERR_FORMAT, "%s: missing \"type\"", where);
    char sub[256];
    if (!strcmp(ty, "Sequence")) {
        p->type = P_SEQ;
        void *kids = NULL;
        st = load_seq(j, "pretokenizers", where, depth, sizeof *p->kids, pre_part, &kids, &p->nk);
        p->kids = kids;
        return st;
    }
    if (!strcmp(ty, "ByteLevel")) {
        p->type = P_BYTELEVEL;
        if ((st = jbool(j, "add_prefix_space", 1, &p->add_prefix_space, where))) return st;
        if ((st = jbool(j, "use_regex", 1, &p->use_regex, where))) return st;
        if (p->use_regex && (st = tok_rx_compile(GPT2_PATTERN, strlen(GPT2_PATTERN), &p->rx))) return st;
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

static ks_status load_dec(const ks_json *j, kdec *d, const char *where, int depth);
static ks_status dec_part(const ks_json *j, void *part, const char *where, int depth) {
    return load_dec(j, part, where, depth);
}

static ks_status load_dec(const ks_json *j, kdec *d, const char *where, int depth) {
    memset(d, 0, sizeof *d);
    const char *ty;
    ks_status st = comp_type(j, where, depth, &ty);
    if (st) return st;
    if (!ty) return ks_errorf(KS_ERR_UNSUPPORTED, "%s: a decoder without \"type\" (legacy format) is not supported", where);
    char sub[256];
    if (!strcmp(ty, "Sequence")) {
        d->type = D_SEQ;
        void *kids = NULL;
        st = load_seq(j, "decoders", where, depth, sizeof *d->kids, dec_part, &kids, &d->nk);
        d->kids = kids;
        return st;
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

static ks_status load_post(const ks_json *j, kpost *p, const char *where, int depth);
static ks_status post_part(const ks_json *j, void *part, const char *where, int depth) {
    return load_post(j, part, where, depth);
}

static ks_status load_post(const ks_json *j, kpost *p, const char *where, int depth) {
    memset(p, 0, sizeof *p);
    const char *ty;
    ks_status st = comp_type(j, where, depth, &ty);
    if (st) return st;
    if (!ty) return ks_errorf(KS_ERR_FORMAT, "%s: missing \"type\"", where);
    char sub[256];
    if (!strcmp(ty, "Sequence")) {
        p->is_seq = 1;
        void *kids = NULL;
        st = load_seq(j, "processors", where, depth, sizeof *p->kids, post_part, &kids, &p->nk);
        p->kids = kids;
        return st;
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
    if (tok_sm_init(&t->vocab, vocab->len)) return KS_ERR_OOM;
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
        sm_slot *x = tok_sm_slot_for(&t->vocab, ARENA(t), vocab->keys[i], vocab->key_lens[i], &h);
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
        t->byte_id[b] = tok_sm_get(&t->vocab, ARENA(t), name, 6);
    }

    /* merges: "a b" strings or ["a", "b"] pairs; rank = index */
    if (tok_pm_init(&t->merges, merges->len)) return KS_ERR_OOM;
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
        int32_t ia = tok_sm_get(&t->vocab, ARENA(t), a, al), ib = tok_sm_get(&t->vocab, ARENA(t), b, bl);
        const char *miss = ia < 0 ? a : ib < 0 ? b : NULL;
        size_t missl = ia < 0 ? al : bl;
        if (miss) {
            sb_free(&joined);
            return ks_errorf(KS_ERR_FORMAT, "model.merges[%zu]: token \"%.*s\" is not in the vocab", i, (int)KS_MIN(missl, 200), miss);
        }
        size_t skip = t->has_prefix ? KS_MIN(t->prefix_len, bl) : 0;
        joined.n = 0;
        if (sb_put(&joined, a, al) || sb_put(&joined, b + skip, bl - skip)) { sb_free(&joined); return KS_ERR_OOM; }
        int32_t nid = tok_sm_get(&t->vocab, ARENA(t), joined.p, joined.n);
        if (nid < 0) {
            ks_errorf(KS_ERR_FORMAT, "model.merges[%zu]: merged token \"%.*s\" is not in the vocab", i, (int)KS_MIN(joined.n, 200), joined.p);
            sb_free(&joined);
            return KS_ERR_FORMAT;
        }
        uint64_t k = (uint64_t)(uint32_t)ia << 32 | (uint32_t)ib;
        size_t slot = tok_pm_index(&t->merges, k);
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
    if (!t->added || tok_sm_init(&t->added_map, arr->len)) return KS_ERR_OOM;
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
        int32_t id = tok_sm_get(&t->added_map, ARENA(t), content->str, content->len);
        int repeated = id >= 0; /* only a repeated content can land on an existing entry */
        if (id < 0) id = tok_sm_get(&t->vocab, ARENA(t), content->str, content->len);
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
            if ((st = tok_norm_apply(t->norm, &rc, content->str, content->len, &nb))) { ks_error_prefix(st, "%s", where); break; }
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
        sm_slot *x = tok_sm_slot_for(&t->added_map, ARENA(t), content->str, content->len, &h);
        if (x->len == UINT32_MAX) { x->off = a.off; x->len = a.len; x->hash = h; }
        x->val = id;
    }
    tok_rxctx_free(&rc);
    sb_free(&nb);
    if (st) return st;
    for (size_t k = 0; k < t->n_added; k++) {
        const addtok *a = &t->added[k];
        int r = a->normalized ? tok_trie_insert(&t->trie_norm, ARENA(t) + a->noff, a->nlen, (int32_t)k)
                              : tok_trie_insert(&t->trie_raw, ARENA(t) + a->off, a->len, (int32_t)k);
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
            int32_t a = tok_sm_get(&t->added_map, ARENA(t), ARENA(t) + d->doff, d->dlen);
            if (a >= 0 && (t->ids[a].flags & ID_SPECIAL)) d->flags |= ID_SKIP;
        }
    return KS_OK;
}

/* UTF-8 bytes of code point cp into o (1..4 of them); the GPT-2 map below needs only cp < 324 */
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
