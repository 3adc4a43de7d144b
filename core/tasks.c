/* tasks.c — the retrieval task generators, a C port of tools/train/tasks.py (see tasks.h and
 * tools/train/README.md). Every choice below mirrors a line of the Python: the draws and
 * their order, the texts, the joining, and the length search (estimate, then steps). */
#include "tasks.h"

#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define GOLDEN 0x9E3779B97F4A7C15ull

/* ================================================================ names */

static const char *const g_names[] = {NULL, "passkey", "niah", "multikey", "kv"};

ks_status ks_task_parse(const char *name, ks_task_kind *out) {
    for (int k = 1; k <= 4; k++)
        if (name && !strcmp(name, g_names[k])) {
            if (out) *out = (ks_task_kind)k;
            return KS_OK;
        }
    return ks_errorf(KS_ERR_ARG, "unknown task \"%s\" (valid: passkey, niah, multikey, kv)", name ? name : "(null)");
}

const char *ks_task_name(ks_task_kind k) { return k >= 1 && k <= 4 ? g_names[k] : "?"; }

/* ================================================================ SplitMix64, seeds, positions */

uint64_t ks_splitmix_mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

uint64_t ks_splitmix_next(uint64_t *state) {
    *state += GOLDEN;
    return ks_splitmix_mix64(*state);
}

static uint64_t below(uint64_t *st, uint64_t n) { return ks_splitmix_next(st) % n; }
static double uniform01(uint64_t *st) { return (double)(ks_splitmix_next(st) >> 11) * (1.0 / 9007199254740992.0); }

uint64_t ks_task_derive_seed(const uint64_t *v, int n) {
    uint64_t x = 0;
    for (int i = 0; i < n; i++) x = ks_splitmix_mix64(x ^ v[i]) + GOLDEN;
    return x;
}

/* floor(a * b + 0.5) for a non-negative product, with the product rounded to double before
 * the addition as in Python (volatile: no fused multiply-add). */
static int64_t round_half_up(double a, double b) {
    volatile double p = a * b;
    double s = p + 0.5;
    return (int64_t)s; /* truncation == floor for s >= 0, as Python's int() */
}

int64_t ks_task_depth_permille(double depth) { return round_half_up(depth, 1000.0); }

uint64_t ks_task_case_seed(uint64_t base, ks_task_kind k, int length, double depth, int index) {
    uint64_t v[5] = {base, (uint64_t)(int64_t)k, (uint64_t)(int64_t)length,
                     (uint64_t)ks_task_depth_permille(depth), (uint64_t)(int64_t)index};
    return ks_task_derive_seed(v, 5);
}

double ks_task_eval_depth(int index) { return (double)(((index % 11) + 11) % 11) / 10.0; }

int ks_task_insert_index(double depth, int n) {
    int64_t k = round_half_up(depth, (double)n);
    if (k < 0) k = 0;
    if (k > n) k = n;
    return (int)k;
}

/* ================================================================ string builder */

typedef struct sb { char *p; size_t n, cap; } sb;

static int sb_put(sb *b, const char *s, size_t n) {
    if (b->n + n + 1 > b->cap) {
        size_t c = b->cap ? b->cap : 256;
        while (c < b->n + n + 1) c *= 2;
        char *q = ks_realloc(b->p, c);
        if (!q) return -1;
        b->p = q;
        b->cap = c;
    }
    if (n) memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
    return 0;
}
static int sb_puts(sb *b, const char *s) { return sb_put(b, s, strlen(s)); }

/* ================================================================ the haystack */

struct ks_haystack {
    char *doc;        /* the document, NUL-terminated */
    size_t n_bytes;
    int64_t n_chars;
    int n_sent;
    size_t *off, *len; /* (n_sent) sentence byte ranges in doc */
};

/* Python's str.isspace() code points (unicodedata of CPython 3.11) */
static int py_isspace(uint32_t c) {
    return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

/* Strict UTF-8 (as Python's decoder: no overlongs, surrogates or > U+10FFFF). Returns the
 * sequence length and the code point, or 0 when invalid. */
static int utf8_next(const unsigned char *s, size_t n, uint32_t *cp) {
    unsigned b = s[0];
    if (b < 0x80) { *cp = b; return 1; }
    int len;
    unsigned lo = 0x80, hi = 0xBF;
    if (b >= 0xC2 && b <= 0xDF) len = 2;
    else if (b >= 0xE0 && b <= 0xEF) { len = 3; if (b == 0xE0) lo = 0xA0; if (b == 0xED) hi = 0x9F; }
    else if (b >= 0xF0 && b <= 0xF4) { len = 4; if (b == 0xF0) lo = 0x90; if (b == 0xF4) hi = 0x8F; }
    else return 0;
    if ((size_t)len > n) return 0;
    if (s[1] < lo || s[1] > hi) return 0;
    uint32_t c = b & (0xFF >> (len + 1));
    c = (c << 6) | (s[1] & 0x3F);
    for (int i = 2; i < len; i++) {
        if ((s[i] & 0xC0) != 0x80) return 0;
        c = (c << 6) | (s[i] & 0x3F);
    }
    *cp = c;
    return len;
}

/* Append one file's text, normalised (" ".join(text.replace("\ufeff", "").split())), to b. */
static ks_status append_normalized(sb *b, const char *path, const char *data, size_t n, int64_t *n_chars) {
    const unsigned char *s = (const unsigned char *)data;
    int pending = 0, any = 0;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        int l = utf8_next(s + i, n - i, &cp);
        if (!l) return ks_errorf(KS_ERR_FORMAT, "%s: invalid UTF-8 at byte %zu", path, i);
        if (cp == 0) return ks_errorf(KS_ERR_FORMAT, "%s: NUL character at byte %zu (not supported)", path, i);
        if (cp == 0xFEFF) { /* removed before the split: it separates nothing */
        } else if (py_isspace(cp)) {
            pending = any;
        } else {
            if (pending) {
                if (sb_put(b, " ", 1)) return KS_ERR_OOM;
                (*n_chars)++;
                pending = 0;
            }
            if (sb_put(b, data + i, (size_t)l)) return KS_ERR_OOM;
            (*n_chars)++;
            any = 1;
        }
        i += (size_t)l;
    }
    return KS_OK;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

ks_status ks_haystack_load(const char *corpora_dir, ks_haystack **out) {
    if (!out) return ks_errorf(KS_ERR_ARG, "ks_haystack_load: out is NULL");
    *out = NULL;
    if (!corpora_dir || !*corpora_dir) return ks_errorf(KS_ERR_ARG, "haystack: no corpora folder given");
    DIR *d = opendir(corpora_dir);
    if (!d) return ks_errorf(KS_ERR_IO, "haystack: cannot open corpora folder %s: %s", corpora_dir, strerror(errno));
    char **names = NULL;
    size_t nn = 0, cap = 0;
    ks_status st = KS_OK;
    struct dirent *e;
    while ((e = readdir(d))) {
        size_t l = strlen(e->d_name);
        if (l < 4 || strcmp(e->d_name + l - 4, ".txt")) continue;
        if (nn == cap) {
            size_t c = cap ? cap * 2 : 16;
            char **q = ks_realloc(names, c * sizeof *q);
            if (!q) { st = KS_ERR_OOM; break; }
            names = q;
            cap = c;
        }
        if (!(names[nn] = ks_strdup(e->d_name))) { st = KS_ERR_OOM; break; }
        nn++;
    }
    closedir(d);
    ks_haystack *h = NULL;
    sb doc = {0};
    if (!st && !nn) st = ks_errorf(KS_ERR_IO, "haystack: no *.txt files in %s", corpora_dir);
    if (!st) qsort(names, nn, sizeof *names, cmp_str); /* byte order == code point order */
    if (!st && !(h = ks_calloc(1, sizeof *h))) st = KS_ERR_OOM;
    for (size_t i = 0; !st && i < nn; i++) {
        size_t pl = strlen(corpora_dir) + strlen(names[i]) + 2;
        char *path = ks_malloc(pl), *data = NULL;
        size_t len = 0;
        if (!path) { st = KS_ERR_OOM; break; }
        snprintf(path, pl, "%s/%s", corpora_dir, names[i]);
        st = ks_read_file(path, &data, &len);
        if (st) st = ks_error_prefix(st, "haystack");
        if (!st && i > 0) { /* files joined with one space */
            if (sb_put(&doc, " ", 1)) st = KS_ERR_OOM;
            else h->n_chars++;
        }
        if (!st) st = append_normalized(&doc, path, data, len, &h->n_chars);
        free(data);
        free(path);
    }
    for (size_t i = 0; i < nn; i++) free(names[i]);
    free(names);
    if (!st && !doc.p && sb_put(&doc, "", 0)) st = KS_ERR_OOM;
    if (st) {
        free(doc.p);
        if (h) free(h);
        return st;
    }
    h->doc = doc.p;
    h->n_bytes = doc.n;
    /* sentences: cut at each space after '.', '!' or '?' (from index 1, as the Python loop) */
    size_t ns = 1;
    for (size_t i = 1; i < doc.n; i++)
        if (doc.p[i] == ' ' && strchr(".!?", doc.p[i - 1]) && doc.p[i - 1]) ns++;
    if (ns > (size_t)0x7fffffff) { ks_haystack_free(h); return ks_errorf(KS_ERR_ARG, "haystack: too many sentences"); }
    h->off = ks_malloc(ns * sizeof *h->off);
    h->len = ks_malloc(ns * sizeof *h->len);
    if (!h->off || !h->len) { ks_haystack_free(h); return KS_ERR_OOM; }
    size_t start = 0, k = 0;
    for (size_t i = 1; i < doc.n; i++)
        if (doc.p[i] == ' ' && strchr(".!?", doc.p[i - 1]) && doc.p[i - 1]) {
            h->off[k] = start;
            h->len[k++] = i - start;
            start = i + 1;
        }
    h->off[k] = start;
    h->len[k++] = doc.n - start;
    h->n_sent = (int)k;
    *out = h;
    return KS_OK;
}

void ks_haystack_free(ks_haystack *h) {
    if (!h) return;
    free(h->doc);
    free(h->off);
    free(h->len);
    free(h);
}

int ks_haystack_n_sentences(const ks_haystack *h) { return h ? h->n_sent : 0; }
int64_t ks_haystack_n_chars(const ks_haystack *h) { return h ? h->n_chars : 0; }
size_t ks_haystack_n_bytes(const ks_haystack *h) { return h ? h->n_bytes : 0; }

const char *ks_haystack_sentence(const ks_haystack *h, int i, size_t *len) {
    if (!h || i < 0 || i >= h->n_sent) {
        if (len) *len = 0;
        return NULL;
    }
    if (len) *len = h->len[i];
    return h->doc + h->off[i];
}

/* ================================================================ fixed texts (tasks.py) */

static const char PASSKEY_HEADER[] =
    "There is a pass key hidden in the following text. Find it and remember it; you will be asked for it at the end.";
static const char PASSKEY_FILLER[] =
    "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again.";
static const char PASSKEY_QUESTION[] = "What is the pass key? The pass key is";

static const char NIAH_HEADER[] = "One or more special magic numbers are hidden in the following text. Remember them; "
                                  "you will be asked about one of them at the end.";

static const char KV_HEADER[] = "Extract the value corresponding to the specified key in the JSON object below.\nJSON data:";

static const char *const WORDS[128] = {
    "apple", "anchor", "arrow", "badge", "basket", "beacon", "bottle", "bridge", "bucket", "button", "cabin",
    "camera", "candle", "canvas", "carpet", "castle", "cellar", "chair", "chimney", "circle", "cloud", "compass",
    "copper", "cotton", "cradle", "crystal", "curtain", "dagger", "desert", "diamond", "dragon", "drum", "eagle",
    "engine", "falcon", "feather", "fence", "fiddle", "forest", "fountain", "garden", "garlic", "glacier", "goblet",
    "granite", "harbor", "harvest", "helmet", "hammer", "honey", "island", "ivory", "jacket", "jungle", "kettle",
    "ladder", "lantern", "lemon", "letter", "lizard", "magnet", "mango", "marble", "meadow", "mirror", "monkey",
    "mountain", "needle", "nickel", "oyster", "paddle", "palace", "panther", "parrot", "pebble", "pencil", "pepper",
    "pillow", "pirate", "planet", "pocket", "puzzle", "quartz", "rabbit", "radish", "ribbon", "river", "rocket",
    "saddle", "salmon", "satchel", "shadow", "shovel", "silver", "spider", "spoon", "statue", "sugar", "summit",
    "teapot", "temple", "thunder", "ticket", "tiger", "timber", "tomato", "tower", "trumpet", "tulip", "tunnel",
    "turtle", "velvet", "violin", "wagon", "walnut", "wizard", "window", "winter", "wolf", "yogurt", "zebra",
    "acorn", "almond", "bamboo", "barrel", "blanket", "breeze", "cactus"};

#define MAX_NEEDLES 4 /* 1 + 3 distractors (multikey) */

/* ================================================================ generation state */

typedef struct gen {
    ks_task_kind kind;
    const ks_haystack *hs;
    const ks_tokenizer *tok;
    double depth;
    uint64_t rng;
    /* passkey */
    char needle[128], answer[48];
    /* niah / multikey */
    int n_needles, start;
    char needles[MAX_NEEDLES][96], question[192];
    double u[MAX_NEEDLES]; /* distractor depths (index 1..) */
    /* kv: pairs drawn lazily in index order */
    char (*keys)[40], (*vals)[40];
    int n_pairs, cap_pairs;
    /* the prompt of the last build(n) and where its parts are */
    sb buf;
    size_t needle_off, needle_len, q_off;
    int target;
    sb tmp; /* scratch for unit costs */
} gen;

static void gen_free(gen *g) {
    free(g->buf.p);
    free(g->tmp.p);
    free(g->keys);
    free(g->vals);
}

/* Token count of text (no specials). */
static ks_status count_tokens(const gen *g, const char *s, size_t n, int *out) {
    int32_t *ids = NULL;
    size_t ni = 0;
    ks_status st = ks_tokenizer_encode(g->tok, s, n, 0, &ids, &ni);
    free(ids);
    if (st) return st;
    *out = (int)ni;
    return KS_OK;
}

/* cost(prefix + text): the tokens of a unit as it appears after its separator */
static ks_status cost2(gen *g, const char *prefix, const char *s, size_t n, int *out) {
    g->tmp.n = 0;
    if (sb_puts(&g->tmp, prefix) || sb_put(&g->tmp, s, n)) return KS_ERR_OOM;
    return count_tokens(g, g->tmp.p, g->tmp.n, out);
}

static void uuid_like(uint64_t *rng, char out[40]) {
    uint64_t a = ks_splitmix_next(rng), b = ks_splitmix_next(rng);
    char h[33];
    snprintf(h, sizeof h, "%016llx%016llx", (unsigned long long)a, (unsigned long long)b);
    snprintf(out, 40, "%.8s-%.4s-%.4s-%.4s-%.12s", h, h + 8, h + 12, h + 16, h + 20);
}

/* make sure pairs 0..n-1 exist (each: key then value, two draws each) */
static ks_status kv_ensure(gen *g, int n) {
    if (n > g->cap_pairs) {
        int c = g->cap_pairs ? g->cap_pairs : 64;
        while (c < n) c *= 2;
        void *k = ks_realloc(g->keys, (size_t)c * sizeof *g->keys);
        if (!k) return KS_ERR_OOM;
        g->keys = k;
        void *v = ks_realloc(g->vals, (size_t)c * sizeof *g->vals);
        if (!v) return KS_ERR_OOM;
        g->vals = v;
        g->cap_pairs = c;
    }
    while (g->n_pairs < n) {
        uuid_like(&g->rng, g->keys[g->n_pairs]);
        uuid_like(&g->rng, g->vals[g->n_pairs]);
        g->n_pairs++;
    }
    return KS_OK;
}

static int put_pair(sb *b, const gen *g, int i) {
    return sb_put(b, "\"", 1) || sb_puts(b, g->keys[i]) || sb_put(b, "\": \"", 4) || sb_puts(b, g->vals[i]) ||
           sb_put(b, "\"", 1);
}

/* prompt(n) into g->buf, with the target needle's place and the question's start */
static ks_status build(gen *g, int n) {
    sb *b = &g->buf;
    b->n = 0;
    int oom = 0;
    if (g->kind == KS_TASK_PASSKEY) {
        int k = ks_task_insert_index(g->depth, n);
        g->target = k;
        oom |= sb_puts(b, PASSKEY_HEADER) || sb_put(b, "\n", 1);
        for (int i = 0; i <= n && !oom; i++) {
            if (i) oom |= sb_put(b, " ", 1);
            if (i == k) {
                g->needle_off = b->n;
                g->needle_len = strlen(g->needle);
                oom |= sb_puts(b, g->needle);
            } else {
                oom |= sb_puts(b, PASSKEY_FILLER);
            }
        }
        oom |= sb_put(b, "\n", 1);
        g->q_off = b->n;
        oom |= sb_puts(b, PASSKEY_QUESTION);
    } else if (g->kind == KS_TASK_NIAH || g->kind == KS_TASK_MULTIKEY) {
        int pos[MAX_NEEDLES];
        pos[0] = ks_task_insert_index(g->depth, n);
        for (int j = 1; j < g->n_needles; j++) pos[j] = ks_task_insert_index(g->u[j], n);
        g->target = pos[0];
        oom |= sb_puts(b, NIAH_HEADER) || sb_put(b, "\n", 1);
        int first = 1;
        for (int i = 0; i <= n && !oom; i++) {
            for (int j = 0; j < g->n_needles; j++) /* sorted by (pos, j) */
                if (pos[j] == i) {
                    if (!first) oom |= sb_put(b, " ", 1);
                    first = 0;
                    if (j == 0) {
                        g->needle_off = b->n;
                        g->needle_len = strlen(g->needles[0]);
                    }
                    oom |= sb_puts(b, g->needles[j]);
                }
            if (i < n) {
                size_t sl;
                int ns = g->hs->n_sent;
                const char *s = ks_haystack_sentence(g->hs, (int)(((int64_t)g->start + i) % ns), &sl);
                if (!first) oom |= sb_put(b, " ", 1);
                first = 0;
                oom |= sb_put(b, s, sl);
            }
        }
        oom |= sb_put(b, "\n", 1);
        g->q_off = b->n;
        oom |= sb_puts(b, g->question);
    } else { /* KV */
        if (n > 0) {
            ks_status st = kv_ensure(g, n);
            if (st) return st;
        }
        int t = n > 0 ? ks_task_insert_index(g->depth, n - 1) : 0;
        const char *key = n > 0 ? g->keys[t] : "";
        g->target = t;
        oom |= sb_puts(b, KV_HEADER) || sb_put(b, "\n{", 2);
        for (int i = 0; i < n && !oom; i++) {
            if (i) oom |= sb_put(b, ", ", 2);
            if (i == t) g->needle_off = b->n;
            oom |= put_pair(b, g, i);
            if (i == t) g->needle_len = b->n - g->needle_off;
        }
        oom |= sb_put(b, "}\n", 2);
        g->q_off = b->n;
        oom |= sb_puts(b, "What is the value of the key \"") || sb_puts(b, key) ||
               sb_puts(b, "\" in the JSON object above?\nAnswer: \"") || sb_puts(b, key) || sb_puts(b, "\": \"");
    }
    return oom ? KS_ERR_OOM : KS_OK;
}

/* The search state: the ids of the best fitting build seen so far, to spare one tokenization. */
typedef struct fit {
    int length;
    int best_n;        /* n of ids below, or -1 */
    int32_t *ids;      /* encode(prompt(best_n)) */
    size_t n_ids;
} fit;

/* ntokens(prompt(n)) = 1 + len(encode(prompt(n))) */
static ks_status ntokens(gen *g, fit *f, int n, int *out) {
    ks_status st = build(g, n);
    if (st) return st;
    int32_t *ids = NULL;
    size_t ni = 0;
    if ((st = ks_tokenizer_encode(g->tok, g->buf.p, g->buf.n, 0, &ids, &ni))) return st;
    *out = 1 + (int)ni;
    if (*out <= f->length) {
        free(f->ids);
        f->ids = ids;
        f->n_ids = ni;
        f->best_n = n;
    } else {
        free(ids);
    }
    return KS_OK;
}

/* tasks.TaskGen._largest: from the estimate, down while too long, then up while n+1 fits. */
static ks_status largest(gen *g, fit *f, int est, int *out) {
    int n = est > 0 ? est : 0, nt;
    ks_status st;
    while (n > 0) {
        if ((st = ntokens(g, f, n, &nt))) return st;
        if (nt <= f->length) break;
        n--;
    }
    for (;;) {
        if (n == 0x7fffffff) return ks_errorf(KS_ERR_ARG, "task: length search does not terminate");
        if ((st = ntokens(g, f, n + 1, &nt))) return st;
        if (nt > f->length) break;
        n++;
    }
    *out = n;
    return KS_OK;
}

static int64_t floordiv(int64_t a, int64_t b) {
    int64_t q = a / b;
    if ((a % b != 0) && ((a < 0) != (b < 0))) q--;
    return q;
}

/* ---------------------------------------------------------------- token ranges */

static int ids_equal(const int32_t *a, const int32_t *b, size_t n) { return !n || !memcmp(a, b, n * sizeof *a); }

/* The index (in BOS-prefixed ids) of the token boundary at byte `cut` of the prompt p (whose
 * ids, without BOS, are ids[0..n)). Proof that `cut` is a boundary of the prompt's own
 * tokenization: some part of the prompt that ends (or starts) at `cut` and at a known
 * boundary tokenizes to exactly the prompt's ids there (token ids stand for fixed byte
 * strings). Tried in turn: the window p[anchor:cut] after a verified boundary `anchor` at
 * ids index `anchor_tok` (cheap: the needle's boundaries lie close together), then the
 * shorter of encode(p[:cut]) == ids[:m] and encode(p[cut:]) == ids[n-m:], then the other.
 * When none holds the boundary lies inside a token: begin cuts take the first token that
 * differs from the prefix's, end cuts the last that differs from the suffix's (the range
 * grows to the tokens that overlap it) and *exact = 0. *proved says whether it was exact. */
static ks_status cut_index(const ks_tokenizer *tok, const char *p, size_t plen, size_t cut, const int32_t *ids,
                           size_t n, int is_end, size_t anchor, size_t anchor_tok, int *idx, int *exact, int *proved) {
    int32_t *a = NULL, *b = NULL;
    size_t na = 0, nb = 0;
    ks_status st = KS_OK;
    *proved = 1;
    if (anchor != (size_t)-1 && cut >= anchor) {
        if ((st = ks_tokenizer_encode(tok, p + anchor, cut - anchor, 0, &a, &na))) goto out;
        if (anchor_tok + na <= n && ids_equal(a, ids + anchor_tok, na)) { *idx = 1 + (int)(anchor_tok + na); goto out; }
        free(a);
        a = NULL;
        na = 0;
    }
    int prefix_first = cut <= plen - cut;
    for (int pass = 0; pass < 2; pass++) {
        int use_prefix = pass == 0 ? prefix_first : !prefix_first;
        if (use_prefix) {
            if ((st = ks_tokenizer_encode(tok, p, cut, 0, &a, &na))) goto out;
            if (na <= n && ids_equal(a, ids, na)) { *idx = 1 + (int)na; goto out; }
        } else {
            if ((st = ks_tokenizer_encode(tok, p + cut, plen - cut, 0, &b, &nb))) goto out;
            if (nb <= n && ids_equal(b, ids + (n - nb), nb)) { *idx = 1 + (int)(n - nb); goto out; }
        }
    }
    *exact = 0;
    *proved = 0;
    size_t c = 0, s = 0;
    while (c < na && c < n && a[c] == ids[c]) c++;
    while (s < nb && s < n && b[nb - 1 - s] == ids[n - 1 - s]) s++;
    *idx = is_end ? 1 + (int)(n - s) : 1 + (int)c;
out:
    free(a);
    free(b);
    return st;
}

/* ---------------------------------------------------------------- ks_task_make */

ks_status ks_task_make(ks_task_kind kind, const ks_haystack *hs, const ks_tokenizer *tok, int length,
                       double depth, uint64_t seed, ks_task_case *out) {
    if (!out) return ks_errorf(KS_ERR_ARG, "ks_task_make: out is NULL");
    memset(out, 0, sizeof *out);
    if (kind < KS_TASK_PASSKEY || kind > KS_TASK_KV) return ks_errorf(KS_ERR_ARG, "task: invalid task kind %d", (int)kind);
    const char *name = ks_task_name(kind);
    if (!tok) return ks_errorf(KS_ERR_ARG, "%s: no tokenizer", name);
    if ((kind == KS_TASK_NIAH || kind == KS_TASK_MULTIKEY) && (!hs || hs->n_sent < 1))
        return ks_errorf(KS_ERR_ARG, "%s: needs a haystack (ks_haystack_load of the corpora folder)", name);
    if (length <= 0) return ks_errorf(KS_ERR_ARG, "%s: length must be positive, got %d", name, length);
    if (!(depth >= 0.0 && depth <= 1.0)) return ks_errorf(KS_ERR_ARG, "%s: depth must be in [0, 1], got %g", name, depth);

    gen g;
    memset(&g, 0, sizeof g);
    g.kind = kind;
    g.hs = hs;
    g.tok = tok;
    g.depth = depth;
    g.rng = seed;
    fit f = {length, -1, NULL, 0};
    ks_status st = KS_OK;
    int est = 0, n = 0, fixed, c;
    const char *answer = NULL;

    if (kind == KS_TASK_PASSKEY) {
        unsigned key = 10000 + (unsigned)below(&g.rng, 90000);
        snprintf(g.needle, sizeof g.needle, "The pass key is %u. Remember it. %u is the pass key.", key, key);
        snprintf(g.answer, sizeof g.answer, " %u", key);
        answer = g.answer;
        if ((st = ntokens(&g, &f, 0, &fixed))) goto fail;
        if ((st = cost2(&g, " ", PASSKEY_FILLER, strlen(PASSKEY_FILLER), &c))) goto fail;
        est = (int)floordiv((int64_t)length - fixed, c > 1 ? c : 1);
        if ((st = largest(&g, &f, est, &n))) goto fail;
    } else if (kind == KS_TASK_NIAH || kind == KS_TASK_MULTIKEY) {
        g.n_needles = kind == KS_TASK_MULTIKEY ? 4 : 1;
        const char *words[MAX_NEEDLES];
        for (int j = 0; j < g.n_needles; j++) {
            const char *w;
            for (;;) { /* redraw while the word is taken */
                w = WORDS[below(&g.rng, 128)];
                int taken = 0;
                for (int i = 0; i < j; i++) taken |= words[i] == w;
                if (!taken) break;
            }
            words[j] = w;
            unsigned num = 1000000 + (unsigned)below(&g.rng, 9000000);
            snprintf(g.needles[j], sizeof g.needles[j], "The special magic number for %s is: %u.", w, num);
            if (j == 0) snprintf(g.answer, sizeof g.answer, " %u", num);
        }
        for (int j = 1; j < g.n_needles; j++) g.u[j] = uniform01(&g.rng);
        g.start = (int)below(&g.rng, (uint64_t)hs->n_sent);
        snprintf(g.question, sizeof g.question,
                 "What is the special magic number for %s? The special magic number for %s is:", words[0], words[0]);
        answer = g.answer;
        if ((st = ntokens(&g, &f, 0, &fixed))) goto fail;
        int64_t budget = (int64_t)length - fixed;
        int ns = hs->n_sent;
        while (budget > 0 && est < ns) {
            size_t sl;
            const char *s = ks_haystack_sentence(hs, (int)(((int64_t)g.start + est) % ns), &sl);
            if ((st = cost2(&g, " ", s, sl, &c))) goto fail;
            budget -= c;
            if (budget >= 0) est++;
        }
        if ((st = largest(&g, &f, est, &n))) goto fail;
    } else { /* KV */
        if ((st = kv_ensure(&g, 1))) goto fail;
        if ((st = ntokens(&g, &f, 0, &fixed))) goto fail;
        if ((st = count_tokens(&g, g.keys[0], strlen(g.keys[0]), &c))) goto fail;
        fixed += 2 * c; /* the key, twice in the question */
        int64_t budget = (int64_t)length - fixed;
        sb pt = {0};
        while (budget > 0) {
            if ((st = kv_ensure(&g, est + 1))) break;
            pt.n = 0;
            if (sb_put(&pt, ", ", 2) || put_pair(&pt, &g, est)) { st = KS_ERR_OOM; break; }
            if ((st = count_tokens(&g, pt.p, pt.n, &c))) break;
            budget -= c;
            if (budget >= 0) est++;
        }
        free(pt.p);
        if (st) goto fail;
        if (est < 1) est = 1;
        if ((st = largest(&g, &f, est, &n))) goto fail;
        if (n < 1) n = 1;
    }

    /* the chosen prompt and its ids */
    if ((st = build(&g, n))) goto fail;
    if (f.best_n != n) {
        free(f.ids);
        f.ids = NULL;
        f.best_n = n;
        if ((st = ks_tokenizer_encode(tok, g.buf.p, g.buf.n, 0, &f.ids, &f.n_ids))) goto fail;
    }
    if (1 + (int64_t)f.n_ids > length) {
        st = ks_errorf(KS_ERR_ARG, "%s: length %d is too small: the shortest prompt has %d tokens (BOS included)", name,
                       length, 1 + (int)f.n_ids);
        goto fail;
    }
    if (kind == KS_TASK_KV) answer = g.vals[g.target];

    out->kind = kind;
    out->length = length;
    out->depth = depth;
    out->seed = seed;
    out->n_tokens = 1 + (int)f.n_ids;
    out->n_units = n;
    out->target = g.target;
    out->prompt_len = g.buf.n;
    out->prompt = g.buf.p;
    g.buf.p = NULL;
    g.buf.n = g.buf.cap = 0;
    if (!(out->answer = ks_strdup(answer))) { st = KS_ERR_OOM; goto fail; }

    /* token ranges: boundaries just before the separator that precedes the needle, after the
     * needle (kv: after the `,` / `}` that follows the pair), around the answer's first
     * occurrence in the needle, and after the newline before the question */
    const char *p = out->prompt;
    size_t plen = out->prompt_len;
    size_t nb = g.needle_off - 1, ne = g.needle_off + g.needle_len + (kind == KS_TASK_KV ? 1 : 0);
    const char *v = memmem(p + g.needle_off, g.needle_len, out->answer, strlen(out->answer));
    if (!v) { st = ks_errorf(KS_ERR_INTERNAL, "%s: the answer is not inside the needle", name); goto fail; }
    size_t vb = (size_t)(v - p), ve = vb + strlen(out->answer);
    out->ranges_exact = 1;
    int proved;
    size_t none = (size_t)-1;
    if ((st = cut_index(tok, p, plen, nb, f.ids, f.n_ids, 0, none, 0, &out->needle_tok_begin, &out->ranges_exact, &proved)))
        goto fail;
    /* the needle's other boundaries: windows after its verified begin */
    size_t anc = proved ? nb : none, anc_tok = (size_t)out->needle_tok_begin - 1;
    if ((st = cut_index(tok, p, plen, vb, f.ids, f.n_ids, 0, anc, anc_tok, &out->value_tok_begin, &out->ranges_exact, &proved)) ||
        (st = cut_index(tok, p, plen, ve, f.ids, f.n_ids, 1, anc, anc_tok, &out->value_tok_end, &out->ranges_exact, &proved)) ||
        (st = cut_index(tok, p, plen, ne, f.ids, f.n_ids, 1, anc, anc_tok, &out->needle_tok_end, &out->ranges_exact, &proved)) ||
        (st = cut_index(tok, p, plen, g.q_off, f.ids, f.n_ids, 0, none, 0, &out->question_tok_begin, &out->ranges_exact,
                        &proved)))
        goto fail;

    free(f.ids);
    gen_free(&g);
    return KS_OK;
fail:
    free(f.ids);
    gen_free(&g);
    ks_task_case_free(out);
    return st;
}

void ks_task_case_free(ks_task_case *c) {
    if (!c) return;
    free(c->prompt);
    free(c->answer);
    memset(c, 0, sizeof *c);
}
