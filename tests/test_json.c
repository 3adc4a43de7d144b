/* test_json.c — core/json.c: every value type, escapes, malformed input, depth, getters,
 * a randomized mutation test, and the real stories260K config/tokenizer files. */
#include "ktest.h"
#include "common.h"
#include "json.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Parse a C string (without its NUL) from an exactly sized heap copy, so ASan catches any
 * read past `len`. */
static ks_json *parse_exact(const char *s, size_t len) {
    char *buf = malloc(len ? len : 1);
    if (!buf) return NULL;
    memcpy(buf, s, len);
    ks_json *j = ks_json_parse(buf, len);
    free(buf); /* the tree must not point into the input */
    return j;
}
static ks_json *parse_str(const char *s) { return parse_exact(s, strlen(s)); }

KT_TEST(json_all_types) {
    ks_json *j = parse_str(" {\"n\": null, \"t\": true, \"f\": false, \"i\": -12, \"d\": 1.5e3,\n"
                           "  \"s\": \"hi\", \"a\": [1, [2], {}], \"o\": {\"x\": {\"y\": []}}, \"e\": \"\"} ");
    KT_CHECK(j, "parse failed: %s", ks_last_error());
    KT_CHECK(j->type == KS_JSON_OBJECT && j->len == 9, "root type %d len %zu", j->type, j->len);
    KT_CHECK(strcmp(j->keys[0], "n") == 0 && j->key_lens[0] == 1, "first key");
    KT_CHECK(ks_json_get(j, "n")->type == KS_JSON_NULL, "null");
    KT_CHECK(ks_json_get(j, "t")->type == KS_JSON_BOOL && ks_json_get(j, "t")->boolean == 1, "true");
    KT_CHECK(ks_json_get(j, "f")->type == KS_JSON_BOOL && ks_json_get(j, "f")->boolean == 0, "false");
    const ks_json *i = ks_json_get(j, "i");
    KT_CHECK(i->type == KS_JSON_NUMBER && i->is_int && i->inum == -12 && i->num == -12.0, "int");
    const ks_json *d = ks_json_get(j, "d");
    KT_CHECK(d->type == KS_JSON_NUMBER && !d->is_int && d->num == 1500.0, "double %g", d->num);
    const ks_json *s = ks_json_get(j, "s");
    KT_CHECK(s->type == KS_JSON_STRING && s->len == 2 && strcmp(s->str, "hi") == 0, "string");
    const ks_json *e = ks_json_get(j, "e");
    KT_CHECK(e->type == KS_JSON_STRING && e->len == 0 && e->str && e->str[0] == 0, "empty string");
    const ks_json *a = ks_json_get(j, "a");
    KT_CHECK(a->type == KS_JSON_ARRAY && a->len == 3, "array");
    KT_CHECK(a->items[0].inum == 1 && a->items[1].type == KS_JSON_ARRAY && a->items[1].len == 1 &&
                 a->items[1].items[0].inum == 2 && a->items[2].type == KS_JSON_OBJECT && a->items[2].len == 0,
             "array contents");
    const ks_json *y = ks_json_get(ks_json_get(ks_json_get(j, "o"), "x"), "y");
    KT_CHECK(y && y->type == KS_JSON_ARRAY && y->len == 0, "nested empty array");
    ks_json_free(j);

    /* scalars at top level */
    const char *tops[] = {"null", "true", "false", "0", "\"x\"", "[]", "{}", " \t\r\n7 \n"};
    for (size_t k = 0; k < sizeof tops / sizeof tops[0]; k++) {
        ks_json *t = parse_str(tops[k]);
        KT_CHECK(t, "top-level %s: %s", tops[k], ks_last_error());
        ks_json_free(t);
    }
    ks_json_free(NULL);
}

KT_TEST(json_numbers) {
    struct { const char *in; int is_int; int64_t i; double d; } cases[] = {
        {"0", 1, 0, 0.0},
        {"-0", 1, 0, -0.0},
        {"123456789", 1, 123456789, 123456789.0},
        {"9223372036854775807", 1, INT64_MAX, 9223372036854775807.0},
        {"-9223372036854775808", 1, INT64_MIN, -9223372036854775808.0},
        {"9223372036854775808", 0, 0, 9223372036854775808.0},
        {"-9223372036854775809", 0, 0, -9223372036854775809.0},
        {"1.25", 0, 0, 1.25},
        {"-0.5", 0, 0, -0.5},
        {"1E+2", 0, 0, 100.0},
        {"2.5e-3", 0, 0, 2.5e-3},
        {"1e-05", 0, 0, 1e-5},
        {"10000.0", 0, 0, 10000.0},
        {"1e-400", 0, 0, 0.0},
        {"123456789012345678901234567890", 0, 0, 1.2345678901234568e29},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        ks_json *j = parse_str(cases[k].in);
        KT_CHECK(j && j->type == KS_JSON_NUMBER, "%s: %s", cases[k].in, ks_last_error());
        KT_CHECK(j->is_int == cases[k].is_int, "%s: is_int %d", cases[k].in, j->is_int);
        if (cases[k].is_int) KT_CHECK(j->inum == cases[k].i, "%s: inum %lld", cases[k].in, (long long)j->inum);
        KT_CHECK(j->num == cases[k].d, "%s: num %.17g", cases[k].in, j->num);
        ks_json_free(j);
    }
    ks_json *z = parse_str("-0");
    KT_CHECK(z && signbit(z->num), "-0 keeps its sign");
    ks_json_free(z);
    /* numbers at the very end of an exactly sized buffer (no NUL after them) */
    const char *tail[] = {"7", "-3.5", "1e9", "18446744073709551616"};
    for (size_t k = 0; k < 4; k++) {
        ks_json *t = parse_exact(tail[k], strlen(tail[k]));
        KT_CHECK(t && t->type == KS_JSON_NUMBER, "%s", tail[k]);
        ks_json_free(t);
    }
}

KT_TEST(json_strings_and_escapes) {
    ks_json *j = parse_str("[\"\\\"\\\\\\/\\b\\f\\n\\r\\t\", \"\\u00e9\", \"\\u20AC\", \"\\uD83D\\uDE00\","
                           " \"a\\u0000b\", \"\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80\", \"\\u0041\\u007f\","
                           " \"x\\uDBFF\\uDFFFy\"]");
    KT_CHECK(j && j->type == KS_JSON_ARRAY && j->len == 8, "parse: %s", ks_last_error());
    KT_CHECK(j->items[0].len == 8 && memcmp(j->items[0].str, "\"\\/\b\f\n\r\t", 8) == 0, "simple escapes");
    KT_CHECK(j->items[1].len == 2 && memcmp(j->items[1].str, "\xC3\xA9", 2) == 0, "\\u00e9");
    KT_CHECK(j->items[2].len == 3 && memcmp(j->items[2].str, "\xE2\x82\xAC", 3) == 0, "\\u20AC");
    KT_CHECK(j->items[3].len == 4 && memcmp(j->items[3].str, "\xF0\x9F\x98\x80", 4) == 0, "surrogate pair");
    KT_CHECK(j->items[4].len == 3 && memcmp(j->items[4].str, "a\0b", 4) == 0, "embedded NUL keeps len");
    KT_CHECK(j->items[5].len == 9 && strcmp(j->items[5].str, "\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80") == 0,
             "raw UTF-8");
    KT_CHECK(j->items[6].len == 2 && strcmp(j->items[6].str, "A\x7f") == 0, "\\u0041\\u007f");
    KT_CHECK(j->items[7].len == 6 && memcmp(j->items[7].str, "x\xF4\x8F\xBF\xBFy", 6) == 0, "U+10FFFF");
    ks_json_free(j);

    /* escaped keys */
    ks_json *o = parse_str("{\"k\\u00e9y\": 1, \"a\\u0000b\": 2}");
    KT_CHECK(o && o->len == 2, "escaped keys: %s", ks_last_error());
    KT_CHECK(o->key_lens[0] == 4 && strcmp(o->keys[0], "k\xC3\xA9y") == 0, "escaped key");
    KT_CHECK(o->key_lens[1] == 3 && memcmp(o->keys[1], "a\0b", 3) == 0, "key with NUL");
    KT_CHECK(ks_json_int(o, "k\xC3\xA9y", -1) == 1, "get escaped key");
    KT_CHECK(ks_json_get(o, "a") == NULL, "a key with a NUL does not match its prefix");
    ks_json_free(o);
}

KT_TEST(json_malformed) {
    struct { const char *in; size_t len; const char *msg; } cases[] = {
        {"", 0, "end of input"},
        {"   \n ", 0, "line 2, column 2: unexpected end of input"},
        {"[1,2", 0, "unterminated array"},
        {"[1 2]", 0, "expected ',' or ']'"},
        {"[1,]", 0, "trailing comma"},
        {"[,1]", 0, "unexpected ','"},
        {"{\"a\" 1}", 0, "expected ':'"},
        {"{a:1}", 0, "expected a string key"},
        {"{\"a\":1,}", 0, "trailing comma"},
        {"{\"a\":1 \"b\":2}", 0, "expected ',' or '}'"},
        {"{\"a\":", 0, "end of input"},
        {"{", 0, "unterminated object"},
        {"01", 0, "leading zero"},
        {"-01", 0, "leading zero"},
        {"[00]", 0, "leading zero"},
        {"1.", 0, "digit after '.'"},
        {"1.e5", 0, "digit after '.'"},
        {".5", 0, "unexpected '.'"},
        {"1e", 0, "exponent"},
        {"1e+", 0, "exponent"},
        {"-", 0, "expected a digit"},
        {"-a", 0, "expected a digit"},
        {"+1", 0, "unexpected '+'"},
        {"1e400", 0, "out of range"},
        {"-1e400", 0, "out of range"},
        {"NaN", 0, "unexpected 'N'"},
        {"Infinity", 0, "unexpected 'I'"},
        {"1 2", 0, "trailing characters"},
        {"[1] x", 0, "trailing characters"},
        {"{} {}", 0, "trailing characters"},
        {"1x", 0, "trailing characters"},
        {"tru", 0, "invalid literal"},
        {"nul", 0, "invalid literal"},
        {"True", 0, "unexpected 'T'"},
        {"nulll", 0, "trailing characters"},
        {"\"abc", 0, "unterminated string"},
        {"\"abc\\", 0, "unterminated string"},
        {"\"a\\qb\"", 0, "invalid escape '\\q'"},
        {"\"a\\'\"", 0, "invalid escape"},
        {"\"\\u12\"", 0, "4 hex digits"},
        {"\"\\uZZZZ\"", 0, "4 hex digits"},
        {"\"\\u12G4\"", 0, "4 hex digits"},
        {"\"\\uD800\"", 0, "lone high surrogate"},
        {"\"\\uD800x\"", 0, "lone high surrogate"},
        {"\"\\uD800\\u0041\"", 0, "lone high surrogate"},
        {"\"\\uD800\\uD800\"", 0, "lone high surrogate"},
        {"\"\\uDC00\"", 0, "lone low surrogate"},
        {"\"\\uDFFF\\uD800\"", 0, "lone low surrogate"},
        {"\"a\nb\"", 0, "control character 0x0A"},
        {"\"\t\"", 0, "control character 0x09"},
        {"\"\x01\"", 0, "control character 0x01"},
        {"\"\xff\"", 0, "invalid UTF-8"},
        {"\"\xc0\xaf\"", 0, "invalid UTF-8"},       /* overlong */
        {"\"\xe0\x80\xaf\"", 0, "invalid UTF-8"},   /* overlong */
        {"\"\xed\xa0\x80\"", 0, "invalid UTF-8"},   /* raw surrogate */
        {"\"\xf4\x90\x80\x80\"", 0, "invalid UTF-8"},/* above U+10FFFF */
        {"\"\xe2\x82\"", 0, "invalid UTF-8"},       /* truncated sequence */
        {"\"\x80\"", 0, "invalid UTF-8"},           /* stray continuation */
        {"[1,\0 2]", 7, "byte 0x00"},
        {"[1]\0", 4, "trailing characters"},
        {"\xEF\xBB\xBF", 3, "end of input"},
        {"{\n  \"a\": 01\n}", 0, "line 2, column 8: invalid number: leading zero"},
        {"[\n\n   ]]", 0, "line 3, column 5: trailing characters"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        size_t len = cases[k].len ? cases[k].len : strlen(cases[k].in);
        ks_clear_error();
        ks_json *j = parse_exact(cases[k].in, len);
        KT_CHECK(!j, "case %zu (%s) parsed but should fail", k, cases[k].in);
        const char *err = ks_last_error();
        KT_CHECK(strncmp(err, "line ", 5) == 0, "case %zu (%s): error without a position: %s", k, cases[k].in, err);
        KT_CHECK(strstr(err, cases[k].msg), "case %zu (%s): error \"%s\" lacks \"%s\"", k, cases[k].in, err,
                 cases[k].msg);
    }
    /* a UTF-8 BOM before a value is skipped */
    ks_json *b = parse_str("\xEF\xBB\xBF{\"a\":1}");
    KT_CHECK(b && ks_json_int(b, "a", 0) == 1, "BOM: %s", ks_last_error());
    ks_json_free(b);
    KT_CHECK(ks_json_parse(NULL, 5) == NULL, "NULL text with a length is refused");
}

static char *nested(int depth, int objects) {
    char *s = malloc((size_t)depth * 6 + 8);
    size_t o = 0;
    for (int i = 0; i < depth; i++) {
        if (objects) { memcpy(s + o, "{\"k\":", 5); o += 5; }
        else s[o++] = '[';
    }
    s[o++] = '1';
    for (int i = 0; i < depth; i++) s[o++] = objects ? '}' : ']';
    s[o] = 0;
    return s;
}

KT_TEST(json_depth) {
    for (int objects = 0; objects < 2; objects++) {
        char *ok = nested(512, objects), *bad = nested(513, objects), *huge = nested(200000, objects);
        ks_json *j = ks_json_parse(ok, strlen(ok));
        int ok_parsed = j != NULL;
        if (j) {
            const ks_json *v = j;
            int d = 0;
            while (v->type != KS_JSON_NUMBER) { v = &v->items[0]; d++; }
            ok_parsed = d == 512 && v->inum == 1;
        }
        ks_json_free(j);
        ks_json *jb = ks_json_parse(bad, strlen(bad));
        int bad_ok = !jb && strstr(ks_last_error(), "nesting deeper than 512");
        ks_json_free(jb);
        ks_json *jh = ks_json_parse(huge, strlen(huge));
        int huge_ok = !jh && strstr(ks_last_error(), "nesting deeper than 512");
        ks_json_free(jh);
        free(ok);
        free(bad);
        free(huge);
        KT_CHECK(ok_parsed, "depth 512 (%s) must parse: %s", objects ? "objects" : "arrays", ks_last_error());
        KT_CHECK(bad_ok, "depth 513 must fail with a depth error: %s", ks_last_error());
        KT_CHECK(huge_ok, "depth 200000 must fail with a depth error: %s", ks_last_error());
    }
}

KT_TEST(json_getters) {
    ks_json *j = parse_str("{\"i\": 7, \"d\": 2.5, \"w\": 2.0, \"big\": 1e300, \"s\": \"v\", \"b\": true,"
                           " \"z\": null, \"dup\": 1, \"dup\": 2, \"arr\": [1]}");
    KT_CHECK(j, "%s", ks_last_error());
    KT_CHECK(ks_json_int(j, "i", -1) == 7 && ks_json_num(j, "i", -1) == 7.0, "int");
    KT_CHECK(ks_json_num(j, "d", -1) == 2.5 && ks_json_int(j, "d", -1) == -1, "fractional is not an int");
    KT_CHECK(ks_json_int(j, "w", -1) == 2, "2.0 reads as int 2");
    KT_CHECK(ks_json_int(j, "big", -1) == -1, "1e300 out of int64 range");
    KT_CHECK(strcmp(ks_json_str(j, "s", "def"), "v") == 0, "str");
    KT_CHECK(ks_json_bool(j, "b", 0) == 1, "bool");
    KT_CHECK(ks_json_int(j, "z", 5) == 5 && ks_json_bool(j, "z", 1) == 1 && !strcmp(ks_json_str(j, "z", "d"), "d"),
             "null gives defaults");
    KT_CHECK(ks_json_int(j, "s", 9) == 9 && ks_json_str(j, "i", NULL) == NULL && ks_json_bool(j, "i", 3) == 3,
             "other types give defaults");
    KT_CHECK(ks_json_num(j, "missing", 1.5) == 1.5, "missing gives default");
    KT_CHECK(ks_json_int(j, "dup", 0) == 1, "first duplicate wins");
    KT_CHECK(ks_json_get(ks_json_get(j, "arr"), "x") == NULL, "get on an array");
    KT_CHECK(ks_json_get(NULL, "x") == NULL && ks_json_int(NULL, "x", 4) == 4, "NULL object");
    ks_json_free(j);
}

/* Walk a tree checking its invariants; returns the node count, or -1 when broken. */
static long walk(const ks_json *v, int depth) {
    if (depth > 513) return -1;
    switch (v->type) {
    case KS_JSON_NULL: case KS_JSON_BOOL: case KS_JSON_NUMBER: return 1;
    case KS_JSON_STRING: return v->str && v->str[v->len] == 0 ? 1 : -1;
    case KS_JSON_ARRAY: case KS_JSON_OBJECT: {
        long n = 1;
        for (size_t i = 0; i < v->len; i++) {
            if (v->type == KS_JSON_OBJECT && v->keys[i][v->key_lens[i]] != 0) return -1;
            long c = walk(&v->items[i], depth + 1);
            if (c < 0) return -1;
            n += c;
        }
        return n;
    }
    }
    return -1;
}

static uint64_t rng_next(uint64_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

KT_TEST(json_fuzz_mutations) {
    const char *seeds[] = {
        "{\"version\": \"1.0\", \"added_tokens\": [{\"id\": 0, \"content\": \"<unk>\", \"special\": true}],"
        " \"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 1, \"\\u00e9\": 2, \"\\uD83D\\uDE00\": 3},"
        " \"merges\": [\"a b\", \"\xE2\x96\x81 t\"]}, \"x\": [1.5e-3, -0, null, false]}",
        "[[[[[]]]], {\"a\": {\"b\": {\"c\": [1, 2, 3]}}}, \"s\\n\\t\\\"\", 123456789012345678901]",
        "{\"dtype\":\"BF16\",\"shape\":[2,3],\"data_offsets\":[0,12]}",
    };
    uint64_t rng = 0x9E3779B97F4A7C15ull;
    int trees = 0, errors = 0;
    for (int it = 0; it < 2000; it++) {
        const char *seed = seeds[it % 3];
        size_t n = strlen(seed);
        char *buf = malloc(n + 16);
        memcpy(buf, seed, n);
        int muts = 1 + (int)(rng_next(&rng) % 4);
        for (int m = 0; m < muts; m++) {
            uint64_t r = rng_next(&rng);
            size_t pos = n ? (size_t)(r >> 8) % n : 0;
            switch (r % 5) {
            case 0: if (n) buf[pos] = (char)(rng_next(&rng) & 0xff); break;           /* random byte */
            case 1: if (n) buf[pos] = "{}[]\",:\\u0e-.9 "[rng_next(&rng) % 16]; break; /* JSON-ish byte */
            case 2: if (n) { memmove(buf + pos, buf + pos + 1, n - pos - 1); n--; } break; /* delete */
            case 3: if (n < strlen(seed) + 15) { memmove(buf + pos + 1, buf + pos, n - pos); buf[pos] = (char)r; n++; } break;
            case 4: n = pos; break;                                                  /* truncate */
            }
        }
        char *exact = malloc(n ? n : 1);
        memcpy(exact, buf, n);
        free(buf);
        ks_clear_error();
        ks_json *j = ks_json_parse(exact, n);
        free(exact);
        if (j) {
            long c = walk(j, 0);
            ks_json_free(j);
            KT_CHECK(c > 0, "iteration %d: parsed tree is inconsistent", it);
            trees++;
        } else {
            KT_CHECK(ks_last_error()[0] != 0, "iteration %d: NULL without an error message", it);
            errors++;
        }
    }
    KT_CHECK(trees > 0 && errors > 0, "mutations should give both outcomes (trees %d, errors %d)", trees, errors);
}

/* A synthetic tokenizer.json-sized document (128K vocab, 280K merges) parses to the right
 * tree. No wall-clock bound (it flakes under ASan on a busy machine): speed is `kvsieve
 * bench`'s business. */
KT_TEST(json_large_document) {
    size_t cap = 16u << 20, o = 0;
    char *s = malloc(cap);
    KT_CHECK(s, "malloc");
    o += (size_t)snprintf(s + o, cap - o, "{\"model\": {\"type\": \"BPE\", \"vocab\": {");
    for (int i = 0; i < 128000; i++)
        o += (size_t)snprintf(s + o, cap - o, "%s\"\xC4\xA0tok%d\\u00e9\": %d", i ? ", " : "", i, i);
    o += (size_t)snprintf(s + o, cap - o, "}, \"merges\": [");
    for (int i = 0; i < 280000; i++)
        o += (size_t)snprintf(s + o, cap - o, "%s\"t%d \xC4\xA0x%d\"", i ? ", " : "", i % 977, i);
    o += (size_t)snprintf(s + o, cap - o, "]}}");
    ks_json *j = ks_json_parse(s, o);
    free(s);
    KT_CHECK(j, "%s", ks_last_error());
    const ks_json *m = ks_json_get(j, "model");
    const ks_json *v = ks_json_get(m, "vocab"), *mg = ks_json_get(m, "merges");
    int ok = v && v->len == 128000 && mg && mg->len == 280000 && v->items[127999].inum == 127999 &&
             strcmp(v->keys[5], "\xC4\xA0tok5\xC3\xA9") == 0 && strcmp(mg->items[3].str, "t3 \xC4\xA0x3") == 0;
    ks_json_free(j);
    KT_CHECK(ok, "large document contents");
}

KT_TEST(json_stories260K_files) {
    char path[1024];
    snprintf(path, sizeof path, "%s/models/stories260K/tokenizer.json", kt_shared_dir());
    char *text;
    size_t len;
    if (ks_read_file(path, &text, &len)) KT_SKIP("%s absent", path);
    ks_json *tok = ks_json_parse(text, len);
    free(text);
    KT_CHECK(tok, "%s: %s", path, ks_last_error());
    const ks_json *model = ks_json_get(tok, "model");
    const ks_json *vocab = ks_json_get(model, "vocab"), *merges = ks_json_get(model, "merges");
    int ok = model && !strcmp(ks_json_str(model, "type", ""), "BPE") && ks_json_bool(model, "byte_fallback", 0) == 1 &&
             vocab && vocab->type == KS_JSON_OBJECT && vocab->len == 512 && ks_json_int(vocab, "<unk>", -1) == 0 &&
             ks_json_int(vocab, "<0x00>", -1) == 3 && merges && merges->type == KS_JSON_ARRAY && merges->len == 165 &&
             !strcmp(merges->items[0].str, "\xE2\x96\x81 t") && ks_json_get(tok, "truncation")->type == KS_JSON_NULL;
    ks_json_free(tok);
    KT_CHECK(ok, "tokenizer.json values");

    snprintf(path, sizeof path, "%s/models/stories260K/config.json", kt_shared_dir());
    if (ks_read_file(path, &text, &len)) KT_SKIP("%s absent", path);
    ks_json *cfg = ks_json_parse(text, len);
    free(text);
    KT_CHECK(cfg, "%s: %s", path, ks_last_error());
    const ks_json *arch = ks_json_get(cfg, "architectures");
    ok = ks_json_int(cfg, "hidden_size", 0) == 64 && ks_json_int(cfg, "num_hidden_layers", 0) == 5 &&
         ks_json_int(cfg, "num_key_value_heads", 0) == 4 && ks_json_num(cfg, "rms_norm_eps", 0) == 1e-5 &&
         ks_json_num(cfg, "rope_theta", 0) == 10000.0 && ks_json_bool(cfg, "tie_word_embeddings", 0) == 1 &&
         arch && arch->len == 1 && !strcmp(arch->items[0].str, "LlamaForCausalLM");
    ks_json_free(cfg);
    KT_CHECK(ok, "config.json values");
}
