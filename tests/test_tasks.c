/* test_tasks.c — the task generators (core/tasks.c) against tools/train/tasks.py.
 *
 *   - the README's PRNG / seed / case test vectors (tools/train/README.md);
 *   - bit-exactness on tests/fixtures/tasks/cases.json (written by tools/task_ref.py, which
 *     runs tasks.py itself with the project's tokenizer): seed, units, tokens, answer, prompt
 *     length and FNV-1a hash of every case, and the haystack document's size and hash;
 *   - the token ranges: every boundary is re-derived by tokenizing the decoded prefix, which
 *     must be the prompt's own prefix and tokenize to the prompt's own first ids, and the
 *     ranges decode to the needle / answer / question texts;
 *   - bad input (unknown task, missing corpora, bad UTF-8, length too small, bad depth).
 * Needs models/kvsieve-tiny/tokenizer.json (in the repo) and ../shared/corpora (NIAH parts
 * are skipped without it). */
#include "ktest.h"
#include "json.h"
#include "tasks.h"
#include "testutil.h"
#include "tokenizer.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define TOK_PATH "models/kvsieve-tiny/tokenizer.json"
#define FIXTURE "tests/fixtures/tasks/cases.json"
#define BASE 0xf2cb78610a862fceull

/* ---------------------------------------------------------------- helpers */

static ks_tokenizer *load_tok(void) {
    ks_tokenizer *t = NULL;
    if (ks_tokenizer_load(TOK_PATH, &t) != KS_OK) {
        fprintf(stderr, "    load %s: %s\n", TOK_PATH, ks_last_error());
        return NULL;
    }
    return t;
}

static const char *corpora_dir(char *buf, size_t n) {
    snprintf(buf, n, "%s/corpora", kt_shared_dir());
    return buf;
}

/* the shared haystack, loaded once per process (it is immutable); NULL if absent */
static ks_haystack *g_hs;
static int g_hs_tried;
static ks_haystack *haystack(void) {
    if (!g_hs_tried) {
        g_hs_tried = 1;
        char dir[512];
        if (access(corpora_dir(dir, sizeof dir), R_OK) == 0 && ks_haystack_load(dir, &g_hs) != KS_OK) {
            fprintf(stderr, "    haystack %s: %s\n", dir, ks_last_error());
            g_hs = NULL;
        }
    }
    return g_hs;
}
__attribute__((destructor)) static void free_haystack(void) { ks_haystack_free(g_hs); }

static uint64_t fnv1a64(const void *p, size_t n, uint64_t h) {
    const unsigned char *s = p;
    for (size_t i = 0; i < n; i++) h = (h ^ s[i]) * 0x100000001B3ull;
    return h;
}
#define FNV_INIT 0xCBF29CE484222325ull

static uint64_t hex64(const char *s) { return s ? strtoull(s, NULL, 16) : 0; }

static ks_json *load_fixture(void) {
    char *text;
    size_t len;
    if (ks_read_file(FIXTURE, &text, &len) != KS_OK) return NULL;
    ks_json *j = ks_json_parse(text, len);
    free(text);
    return j;
}

static ks_status make(ks_task_kind k, const ks_tokenizer *tok, int L, int index, ks_task_case *c) {
    double d = ks_task_eval_depth(index);
    return ks_task_make(k, haystack(), tok, L, d, ks_task_case_seed(BASE, k, L, d, index), c);
}

/* ---------------------------------------------------------------- PRNG and seeds */

KT_TEST(tasks_prng_vectors) {
    uint64_t s = 0;
    uint64_t a = ks_splitmix_next(&s), b = ks_splitmix_next(&s), c = ks_splitmix_next(&s);
    KT_CHECK(a == 0xe220a8397b1dcdafull && b == 0x6e789e6aa1b965f4ull && c == 0x06c45d188009454full,
             "splitmix from 0: %016llx %016llx %016llx", (unsigned long long)a, (unsigned long long)b,
             (unsigned long long)c);
    uint64_t v[3] = {1, 2, 3};
    KT_CHECK(ks_task_derive_seed(v, 3) == 0x1a0f71893f2718c4ull, "derive_seed(1,2,3) = %016llx",
             (unsigned long long)ks_task_derive_seed(v, 3));
    uint64_t w[2] = {1234, 0xE7A1};
    KT_CHECK(ks_task_derive_seed(w, 2) == BASE, "held-out base %016llx", (unsigned long long)ks_task_derive_seed(w, 2));
    KT_CHECK(ks_task_derive_seed(NULL, 0) == 0, "derive_seed() = 0");
    struct { ks_task_kind k; int i; uint64_t seed; } cs[] = {
        {KS_TASK_PASSKEY, 0, 0xcd88fc898e75c360ull},
        {KS_TASK_NIAH, 0, 0x23905b645103cb45ull},
        {KS_TASK_MULTIKEY, 0, 0x2683ac812ac5704full},
        {KS_TASK_KV, 0, 0xf33b07d372d741c3ull},
    };
    for (int i = 0; i < 4; i++) {
        uint64_t got = ks_task_case_seed(BASE, cs[i].k, 4096, ks_task_eval_depth(cs[i].i), cs[i].i);
        KT_CHECK(got == cs[i].seed, "%s case seed %016llx", ks_task_name(cs[i].k), (unsigned long long)got);
    }
    /* depths of the eval grid and the rounding rules (values computed with Python) */
    KT_CHECK(ks_task_eval_depth(0) == 0.0 && ks_task_eval_depth(10) == 1.0 && ks_task_eval_depth(16) == 0.5 &&
                 ks_task_eval_depth(3) == 0.3,
             "eval depths");
    KT_CHECK(ks_task_depth_permille(0.7) == 700 && ks_task_depth_permille(0.0005) == 1 &&
                 ks_task_depth_permille(0.0004) == 0 && ks_task_depth_permille(1.0) == 1000,
             "permille");
    KT_CHECK(ks_task_insert_index(0.5, 3) == 2 && ks_task_insert_index(0.3, 5) == 2 && ks_task_insert_index(0.1, 5) == 1 &&
                 ks_task_insert_index(0.29, 5) == 1 && ks_task_insert_index(1.0, 7) == 7 &&
                 ks_task_insert_index(0.0, 7) == 0 && ks_task_insert_index(0.7, 0) == 0,
             "insert_index");
}

KT_TEST(tasks_parse_names) {
    const char *names[] = {"passkey", "niah", "multikey", "kv"};
    for (int i = 0; i < 4; i++) {
        ks_task_kind k = 0;
        KT_CHECK(ks_task_parse(names[i], &k) == KS_OK && (int)k == i + 1, "%s -> %d", names[i], (int)k);
        KT_CHECK(!strcmp(ks_task_name(k), names[i]), "name of %d", (int)k);
    }
    ks_task_kind k = KS_TASK_KV;
    KT_CHECK(ks_task_parse("haystack", &k) == KS_ERR_ARG, "unknown name accepted");
    KT_CHECK(strstr(ks_last_error(), "haystack") && strstr(ks_last_error(), "passkey, niah, multikey, kv"),
             "message: %s", ks_last_error());
    KT_CHECK(k == KS_TASK_KV, "out changed on error");
    KT_CHECK(ks_task_parse("Passkey", &k) == KS_ERR_ARG && ks_task_parse(NULL, &k) == KS_ERR_ARG, "case / NULL");
    KT_CHECK(!strcmp(ks_task_name((ks_task_kind)0), "?") && !strcmp(ks_task_name((ks_task_kind)5), "?"), "bad kind name");
}

/* ---------------------------------------------------------------- the haystack */

KT_TEST(tasks_haystack_document) {
    ks_haystack *hs = haystack();
    if (!hs) KT_SKIP("%s/corpora absent", kt_shared_dir());
    ks_json *fx = load_fixture();
    KT_CHECK(fx, "cannot read %s: %s", FIXTURE, ks_last_error());
    const ks_json *h = ks_json_get(fx, "haystack");
    int64_t chars = ks_json_int(h, "chars", -1), sent = ks_json_int(h, "sentences", -1),
            bytes = ks_json_int(h, "bytes", -1);
    uint64_t want = hex64(ks_json_str(h, "fnv1a64", NULL));
    ks_json_free(fx);
    /* the README's figures, and the fixture's (the same corpora) */
    KT_CHECK(ks_haystack_n_chars(hs) == 9375783 && chars == 9375783, "chars %lld", (long long)ks_haystack_n_chars(hs));
    KT_CHECK(ks_haystack_n_sentences(hs) == 69381 && sent == 69381, "sentences %d", ks_haystack_n_sentences(hs));
    KT_CHECK((int64_t)ks_haystack_n_bytes(hs) == bytes, "bytes %zu vs %lld", ks_haystack_n_bytes(hs), (long long)bytes);
    /* the document = the sentences joined with one space: hash it that way */
    uint64_t f = FNV_INIT;
    size_t total = 0;
    for (int i = 0; i < ks_haystack_n_sentences(hs); i++) {
        size_t l;
        const char *s = ks_haystack_sentence(hs, i, &l);
        if (i) f = fnv1a64(" ", 1, f);
        f = fnv1a64(s, l, f);
        total += l + (i > 0);
        KT_CHECK(l > 0, "empty sentence %d", i);
    }
    KT_CHECK(total == ks_haystack_n_bytes(hs), "sentences cover %zu bytes", total);
    KT_CHECK(f == want, "document hash %016llx, tasks.py %016llx", (unsigned long long)f, (unsigned long long)want);
    KT_CHECK(!ks_haystack_sentence(hs, -1, NULL) && !ks_haystack_sentence(hs, ks_haystack_n_sentences(hs), NULL),
             "out-of-range sentence");
}

/* Whitespace, BOM, file order and sentence cuts, on a hand-made folder. */
KT_TEST(tasks_haystack_normalize) {
    char dir[256];
    KT_CHECK(kt_tmpdir(dir, sizeof dir) == 0, "tmpdir");
    /* b.txt sorts after a.txt; readme.md and x.txt.bak are not *.txt */
    kt_write_file(dir, "b.txt", "  x\xC2\xA0y\xE2\x80\x8Bz. \xE3\x80\x80" "End\xEF\xBB\xBF" "ing\r\n");
    kt_write_file(dir, "a.txt", "\xEF\xBB\xBFHello  world.\tHow are\r\nyou?\x0b\x1c" "Fine!a.b \xE2\x80\xA8");
    kt_write_file(dir, "readme.md", "not this.");
    kt_write_file(dir, "x.txt.bak", "nor this.");
    ks_haystack *hs = NULL;
    ks_status st = ks_haystack_load(dir, &hs);
    kt_rmdir(dir);
    KT_CHECK(st == KS_OK, "load: %s", ks_last_error());
    /* expected (Python): "Hello world. How are you? Fine!a.b x y\u200bz. Ending" */
    const char *want[] = {"Hello world.", "How are you?", "Fine!a.b x y\xE2\x80\x8Bz.", "Ending"};
    int ns = ks_haystack_n_sentences(hs);
    int ok = ns == 4;
    for (int i = 0; ok && i < 4; i++) {
        size_t l;
        const char *s = ks_haystack_sentence(hs, i, &l);
        ok = l == strlen(want[i]) && !memcmp(s, want[i], l);
        if (!ok) fprintf(stderr, "    sentence %d: '%.*s'\n", i, (int)l, s);
    }
    int64_t chars = ks_haystack_n_chars(hs);
    ks_haystack_free(hs);
    KT_CHECK(ok, "%d sentences", ns);
    KT_CHECK(chars == 48, "chars %lld", (long long)chars); /* len(doc) in Python */
}

KT_TEST(tasks_haystack_errors) {
    ks_haystack *hs = (ks_haystack *)1;
    KT_CHECK(ks_haystack_load("no/such/corpora", &hs) == KS_ERR_IO && hs == NULL, "missing folder");
    KT_CHECK(strstr(ks_last_error(), "no/such/corpora"), "message: %s", ks_last_error());
    char dir[256];
    KT_CHECK(kt_tmpdir(dir, sizeof dir) == 0, "tmpdir");
    kt_write_file(dir, "notes.md", "text.");
    ks_status st = ks_haystack_load(dir, &hs);
    int named = strstr(ks_last_error(), "no *.txt") != NULL;
    KT_CHECK(st == KS_ERR_IO && !hs && named, "no *.txt: %d %s", st, ks_last_error());
    kt_write_file(dir, "a.txt", "fine.");
    kt_write_file(dir, "bad.txt", "ok \xC3\x28 then"); /* invalid continuation at byte 3 */
    st = ks_haystack_load(dir, &hs);
    named = strstr(ks_last_error(), "bad.txt") && strstr(ks_last_error(), "UTF-8") && strstr(ks_last_error(), "byte 3");
    KT_CHECK(st == KS_ERR_FORMAT && !hs && named, "bad UTF-8: %d %s", st, ks_last_error());
    /* overlong, surrogate, beyond U+10FFFF: Python's decoder refuses them too */
    const char *bad[] = {"\xC0\xAF", "\xED\xA0\x80", "\xF4\x90\x80\x80", "\xE2\x82", "\xFF"};
    for (int i = 0; i < 5; i++) {
        kt_write_file(dir, "bad.txt", bad[i]);
        st = ks_haystack_load(dir, &hs);
        if (st != KS_ERR_FORMAT) break;
    }
    kt_rmdir(dir);
    KT_CHECK(st == KS_ERR_FORMAT && !hs, "strict UTF-8");
}

/* ---------------------------------------------------------------- the README's case vectors */

KT_TEST(tasks_readme_vectors) {
    ks_tokenizer *tok = load_tok();
    KT_CHECK(tok, "tokenizer");
    ks_task_case c;
    ks_status st = make(KS_TASK_PASSKEY, tok, 4096, 0, &c);
    int ok = !st && !strcmp(c.answer, " 55788") && strstr(c.prompt, "The pass key is 55788. Remember it. 55788 is the pass key.") &&
             c.n_tokens == 4077 && c.seed == 0xcd88fc898e75c360ull;
    if (!st) fprintf(stderr, "    passkey: %s, %d tokens\n", c.answer, c.n_tokens);
    ks_task_case_free(&c);
    if (!ok) ks_tokenizer_free(tok);
    KT_CHECK(ok, "passkey 55788 (%s)", st ? ks_last_error() : "wrong case");

    st = make(KS_TASK_KV, tok, 4096, 0, &c);
    ok = !st && !strcmp(c.answer, "5a6affa5-9a15-1b82-6fd0-ab10d40302fb") &&
         !strncmp(strchr(c.prompt, '{'), "{\"cade8d41-af2c-1118-35f6-6b8d40275d7f\": \"5a6affa5-9a15-1b82-6fd0-ab10d40302fb\", \"", 82) &&
         strstr(c.prompt, "\nAnswer: \"cade8d41-af2c-1118-35f6-6b8d40275d7f\": \"") && c.target == 0;
    ks_task_case_free(&c);
    if (!ok) ks_tokenizer_free(tok);
    KT_CHECK(ok, "kv pair 0 (%s)", st ? ks_last_error() : "wrong case");

    if (!haystack()) {
        ks_tokenizer_free(tok);
        KT_SKIP("niah/multikey: %s/corpora absent", kt_shared_dir());
    }
    struct { ks_task_kind k; int i; const char *word, *answer, *others; } v[] = {
        {KS_TASK_NIAH, 0, "copper", " 1358853", NULL},
        {KS_TASK_NIAH, 5, "timber", " 1884327", NULL},
        {KS_TASK_MULTIKEY, 0, "jacket", " 3343416", "desert is: 3209593.|wolf is: 9422302.|tiger is: 5069226."},
    };
    for (int i = 0; i < 3; i++) {
        st = make(v[i].k, tok, 4096, v[i].i, &c);
        char q[256], nd[256];
        snprintf(q, sizeof q, "\nWhat is the special magic number for %s? The special magic number for %s is:", v[i].word, v[i].word);
        snprintf(nd, sizeof nd, "The special magic number for %s is:%s.", v[i].word, v[i].answer);
        ok = !st && !strcmp(c.answer, v[i].answer) && strstr(c.prompt, nd) && strlen(c.prompt) > strlen(q) &&
             !strcmp(c.prompt + strlen(c.prompt) - strlen(q), q);
        for (const char *o = v[i].others; ok && o; o = strchr(o, '|') ? strchr(o, '|') + 1 : NULL) {
            char one[64];
            size_t l = strchr(o, '|') ? (size_t)(strchr(o, '|') - o) : strlen(o);
            snprintf(one, sizeof one, "for %.*s", (int)l, o);
            ok = strstr(c.prompt, one) != NULL;
        }
        ks_task_case_free(&c);
        if (!ok) ks_tokenizer_free(tok);
        KT_CHECK(ok, "%s i=%d %s%s (%s)", ks_task_name(v[i].k), v[i].i, v[i].word, v[i].answer, st ? ks_last_error() : "wrong case");
    }
    ks_tokenizer_free(tok);
}

/* ---------------------------------------------------------------- bit-exactness vs tasks.py */

KT_TEST(tasks_fixture_bitexact) {
    ks_json *fx = load_fixture();
    KT_CHECK(fx, "cannot read %s: %s", FIXTURE, ks_last_error());
    KT_CHECK(ks_json_int(fx, "version", 0) == 1, "fixture version");
    ks_tokenizer *tok = load_tok();
    if (!tok) ks_json_free(fx);
    KT_CHECK(tok, "tokenizer");
    const ks_json *cases = ks_json_get(fx, "cases");
    int n = cases ? (int)cases->len : 0, done = 0, skipped = 0, bad = 0;
    for (int i = 0; i < n; i++) {
        const ks_json *e = &cases->items[i];
        ks_task_kind k;
        if (ks_task_parse(ks_json_str(e, "task", ""), &k)) { bad++; continue; }
        if ((k == KS_TASK_NIAH || k == KS_TASK_MULTIKEY) && !haystack()) { skipped++; continue; }
        int L = (int)ks_json_int(e, "length", 0), idx = (int)ks_json_int(e, "index", 0);
        double d = ks_json_num(e, "depth", -1);
        uint64_t seed = ks_task_case_seed(BASE, k, L, d, idx);
        const char *where = ks_json_str(e, "task", "");
        if (d != ks_task_eval_depth(idx) || seed != hex64(ks_json_str(e, "seed", NULL))) {
            fprintf(stderr, "    %s L=%d i=%d: seed %016llx, tasks.py %s\n", where, L, idx, (unsigned long long)seed,
                    ks_json_str(e, "seed", ""));
            bad++;
            continue;
        }
        ks_task_case c;
        if (ks_task_make(k, haystack(), tok, L, d, seed, &c)) {
            fprintf(stderr, "    %s L=%d i=%d: %s\n", where, L, idx, ks_last_error());
            bad++;
            continue;
        }
        uint64_t h = fnv1a64(c.prompt, c.prompt_len, FNV_INIT);
        int ok = c.n_units == ks_json_int(e, "n_units", -1) && c.n_tokens == ks_json_int(e, "n_tokens", -1) &&
                 !strcmp(c.answer, ks_json_str(e, "answer", "")) &&
                 (int64_t)c.prompt_len == ks_json_int(e, "prompt_bytes", -1) &&
                 h == hex64(ks_json_str(e, "prompt_fnv1a64", NULL)) && c.n_tokens <= L;
        if (!ok) {
            fprintf(stderr,
                    "    %s L=%d i=%d depth %.1f:\n      C:       units %d tokens %d answer '%s' bytes %zu hash %016llx\n"
                    "      tasks.py units %lld tokens %lld answer '%s' bytes %lld hash %s\n"
                    "      C head '%.80s'\n      C tail '%s'\n      py head '%s'\n      py tail '%s'\n",
                    where, L, idx, d, c.n_units, c.n_tokens, c.answer, c.prompt_len, (unsigned long long)h,
                    (long long)ks_json_int(e, "n_units", -1), (long long)ks_json_int(e, "n_tokens", -1),
                    ks_json_str(e, "answer", ""), (long long)ks_json_int(e, "prompt_bytes", -1),
                    ks_json_str(e, "prompt_fnv1a64", ""), c.prompt,
                    c.prompt_len > 80 ? c.prompt + c.prompt_len - 80 : c.prompt, ks_json_str(e, "head", ""),
                    ks_json_str(e, "tail", ""));
            bad++;
        }
        ks_task_case_free(&c);
        done++;
    }
    ks_json_free(fx);
    ks_tokenizer_free(tok);
    KT_CHECK(n >= 20, "fixture has %d cases", n);
    KT_CHECK(!bad, "%d of %d cases differ from tasks.py", bad, n);
    if (skipped) KT_SKIP("%d NIAH cases skipped (%s/corpora absent); %d checked", skipped, kt_shared_dir(), done);
    fprintf(stderr, "    %d cases identical to tasks.py\n", done);
}

/* ---------------------------------------------------------------- token ranges */

/* Token boundary `idx` (BOS-prefixed index) of prompt ids ids[0..n) (no BOS): the decoded
 * prefix must be the prompt's own first bytes and tokenize to exactly ids[0..idx-1). */
static int check_boundary(const ks_tokenizer *tok, const ks_task_case *c, const int32_t *ids, size_t n, int idx,
                          const char *what) {
    if (idx < 1 || (size_t)idx > n + 1) {
        fprintf(stderr, "    %s: boundary %d outside [1, %zu]\n", what, idx, n + 1);
        return 0;
    }
    char *pre = NULL;
    size_t pl = 0;
    int32_t *pid = NULL;
    size_t np = 0;
    int ok = ks_tokenizer_decode(tok, ids, (size_t)idx - 1, 0, &pre, &pl) == KS_OK && pl <= c->prompt_len &&
             !memcmp(pre, c->prompt, pl) && ks_tokenizer_encode(tok, c->prompt, pl, 0, &pid, &np) == KS_OK &&
             np == (size_t)idx - 1 && (np == 0 || !memcmp(pid, ids, np * sizeof *ids));
    if (!ok) fprintf(stderr, "    %s: boundary %d is not a clean prefix of the prompt ids\n", what, idx);
    free(pre);
    free(pid);
    return ok;
}

/* decode ids[b-1 .. e-1) (BOS-prefixed [b, e)) and compare with want */
static int range_is(const ks_tokenizer *tok, const int32_t *ids, int b, int e, const char *want, const char *what) {
    char *t = NULL;
    size_t l = 0;
    int ok = b >= 1 && e >= b && ks_tokenizer_decode(tok, ids + b - 1, (size_t)(e - b), 0, &t, &l) == KS_OK &&
             l == strlen(want) && !memcmp(t, want, l);
    if (!ok) fprintf(stderr, "    %s [%d, %d) decodes to '%.*s', want '%s'\n", what, b, e, (int)l, t ? t : "", want);
    free(t);
    return ok;
}

/* All ranges of one case; returns 1 when right. */
static int check_ranges(const ks_tokenizer *tok, const ks_task_case *c) {
    int32_t *ids = NULL;
    size_t n = 0;
    if (ks_tokenizer_encode(tok, c->prompt, c->prompt_len, 0, &ids, &n) || 1 + (int)n != c->n_tokens) {
        free(ids);
        return 0;
    }
    char needle[256], question[256];
    const char *nl = strrchr(c->prompt, '\n');
    if (c->kind == KS_TASK_KV) {
        /* the question's key, from the prompt's last two lines */
        const char *q = strstr(c->prompt, "\nWhat is the value of the key \"");
        const char *key = q ? q + 31 : "";
        int kl = q ? (int)(strchr(key, '"') - key) : 0;
        snprintf(needle, sizeof needle, "%s\"%.*s\": \"%s\"%s", c->target == 0 ? "{" : " ", kl, key, c->answer,
                 c->target == c->n_units - 1 ? "}" : ",");
        snprintf(question, sizeof question, "%s", q ? q + 1 : "");
    } else if (c->kind == KS_TASK_PASSKEY) {
        snprintf(needle, sizeof needle, "%sThe pass key is %s. Remember it. %s is the pass key.",
                 c->target == 0 ? "\n" : " ", c->answer + 1, c->answer + 1);
        snprintf(question, sizeof question, "%s", nl + 1);
    } else {
        const char *w = strstr(nl, "number for ") + 11;
        int wl = (int)(strchr(w, '?') - w);
        char tmp[160];
        snprintf(tmp, sizeof tmp, "The special magic number for %.*s is:%s.", wl, w, c->answer);
        const char *at = strstr(c->prompt, tmp);
        snprintf(needle, sizeof needle, "%c%s", at && at > c->prompt ? at[-1] : '?', tmp);
        snprintf(question, sizeof question, "%s", nl + 1);
    }
    int ok = c->ranges_exact == 1 && c->needle_tok_begin < c->value_tok_begin && c->value_tok_end <= c->needle_tok_end &&
             c->needle_tok_end <= c->question_tok_begin && c->question_tok_begin < c->n_tokens;
    if (!ok) fprintf(stderr, "    ranges out of order or inexact\n");
    ok = ok && range_is(tok, ids, c->needle_tok_begin, c->needle_tok_end, needle, "needle");
    ok = ok && range_is(tok, ids, c->value_tok_begin, c->value_tok_end, c->answer, "value");
    ok = ok && range_is(tok, ids, c->question_tok_begin, c->n_tokens, question, "question");
    ok = ok && check_boundary(tok, c, ids, n, c->needle_tok_begin, "needle begin");
    ok = ok && check_boundary(tok, c, ids, n, c->needle_tok_end, "needle end");
    ok = ok && check_boundary(tok, c, ids, n, c->value_tok_begin, "value begin");
    ok = ok && check_boundary(tok, c, ids, n, c->value_tok_end, "value end");
    ok = ok && check_boundary(tok, c, ids, n, c->question_tok_begin, "question begin");
    free(ids);
    return ok;
}

KT_TEST(tasks_token_ranges) {
    ks_tokenizer *tok = load_tok();
    KT_CHECK(tok, "tokenizer");
    int lengths[] = {512, 1024}, indices[] = {0, 2, 5, 9, 10}, bad = 0, done = 0;
    for (int k = 1; k <= 4; k++) {
        if ((k == KS_TASK_NIAH || k == KS_TASK_MULTIKEY) && !haystack()) continue;
        for (int li = 0; li < 2; li++)
            for (int ii = 0; ii < 5; ii++) {
                ks_task_case c;
                if (make((ks_task_kind)k, tok, lengths[li], indices[ii], &c)) {
                    fprintf(stderr, "    %s: %s\n", ks_task_name(k), ks_last_error());
                    bad++;
                    continue;
                }
                if (!check_ranges(tok, &c)) {
                    fprintf(stderr, "    ^ %s L=%d i=%d (target %d of %d units)\n", ks_task_name(k), lengths[li],
                            indices[ii], c.target, c.n_units);
                    bad++;
                }
                ks_task_case_free(&c);
                done++;
            }
    }
    ks_tokenizer_free(tok);
    KT_CHECK(!bad, "%d of %d cases have wrong token ranges", bad, done);
    if (!haystack()) KT_SKIP("niah/multikey ranges: %s/corpora absent (%d cases checked)", kt_shared_dir(), done);
}

/* ---------------------------------------------------------------- bad input */

KT_TEST(tasks_bad_input) {
    ks_tokenizer *tok = load_tok();
    KT_CHECK(tok, "tokenizer");
    ks_task_case c;
    struct { ks_task_kind k; int L; double d; const char *msg; } bad[] = {
        {(ks_task_kind)9, 512, 0.5, "invalid task kind"},
        {KS_TASK_PASSKEY, 0, 0.5, "length must be positive"},
        {KS_TASK_PASSKEY, 40, 0.5, "too small"},
        {KS_TASK_KV, 60, 0.0, "too small"},
        {KS_TASK_PASSKEY, 512, -0.1, "depth"},
        {KS_TASK_KV, 512, 1.5, "depth"},
        {KS_TASK_PASSKEY, 512, NAN, "depth"},
        {KS_TASK_NIAH, 512, 0.5, "haystack"}, /* NULL haystack */
    };
    for (int i = 0; i < (int)(sizeof bad / sizeof *bad); i++) {
        memset(&c, 0x5a, sizeof c);
        ks_status st = ks_task_make(bad[i].k, NULL, tok, bad[i].L, bad[i].d, 1, &c);
        int ok = st == KS_ERR_ARG && strstr(ks_last_error(), bad[i].msg) && !c.prompt && !c.answer;
        if (!ok) ks_tokenizer_free(tok);
        KT_CHECK(ok, "case %d: status %d, message '%s', want '%s'", i, st, ks_last_error(), bad[i].msg);
    }
    KT_CHECK(ks_task_make(KS_TASK_KV, NULL, NULL, 512, 0.5, 1, &c) == KS_ERR_ARG, "NULL tokenizer");
    /* the shortest passkey prompt (no filler): L = its token count gives it, one less fails */
    int min_tokens = 0, units = -1, exact = 0;
    for (int L = 20; L < 200 && !min_tokens; L++)
        if (ks_task_make(KS_TASK_PASSKEY, NULL, tok, L, 0.5, 7, &c) == KS_OK) {
            min_tokens = L;
            units = c.n_units;
            exact = c.n_tokens == L;
            ks_task_case_free(&c);
        }
    ks_tokenizer_free(tok);
    KT_CHECK(min_tokens > 0 && units == 0 && exact, "shortest passkey prompt: L %d, units %d", min_tokens, units);
    fprintf(stderr, "    shortest passkey prompt: %d tokens\n", min_tokens);
}

/* ---------------------------------------------------------------- speed at long lengths */

KT_TEST(tasks_speed_long) {
    ks_tokenizer *tok = load_tok();
    KT_CHECK(tok, "tokenizer");
    int lengths[] = {4096, 32768};
    for (int k = 1; k <= 4; k++) {
        if ((k == KS_TASK_NIAH || k == KS_TASK_MULTIKEY) && !haystack()) continue;
        for (int li = 0; li < 2; li++) {
            ks_task_case c;
            double t0 = ks_now();
            ks_status st = make((ks_task_kind)k, tok, lengths[li], 5, &c);
            double ms = (ks_now() - t0) * 1e3;
            if (st) ks_tokenizer_free(tok);
            KT_CHECK(!st, "%s L=%d: %s", ks_task_name(k), lengths[li], ks_last_error());
            /* the fitted prompt is close to L: within one unit (a NIAH sentence may be long) */
            int slack = k == KS_TASK_PASSKEY ? 25 : k == KS_TASK_KV ? 80 : lengths[li] / 5;
            int ok = c.n_tokens <= lengths[li] && c.n_tokens > lengths[li] - slack && c.ranges_exact;
            fprintf(stderr, "    %-8s L=%-6d %7.1f ms  %d tokens, %d units\n", ks_task_name(k), lengths[li], ms,
                    c.n_tokens, c.n_units);
            if (lengths[li] == 32768 && ok) ok = check_ranges(tok, &c);
            int nt = c.n_tokens;
            ks_task_case_free(&c);
            if (!ok) ks_tokenizer_free(tok);
            KT_CHECK(ok, "%s L=%d: %d tokens", ks_task_name(k), lengths[li], nt);
        }
    }
    ks_tokenizer_free(tok);
}
