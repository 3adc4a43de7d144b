/* test_json_api.c — kvsieve.h's JSON reader through the public header only: parsing, walking a
 * tree with the accessors (every kind, document order, duplicate keys, NUL bytes in strings and
 * keys, int64 edges), the "line L, column C: what" errors of bad input, NULL arguments, and the
 * documented default of every accessor on every kind it does not read. core/json.c's own cases
 * (escapes, numbers, depth, mutations) are tests/test_json.c's. */
#include "kvsieve.h"
#include "ktest.h"

#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Parse from an exactly sized heap copy that is freed at once: ASan catches a read past len,
 * and a tree pointing into the text would be caught reading freed memory. */
static ks_json *parse(const char *s, size_t len) {
    char *buf = malloc(len ? len : 1);
    if (!buf) return NULL;
    memcpy(buf, s, len);
    ks_json *j = ks_json_parse(buf, len);
    free(buf);
    return j;
}

/* A compact rewrite of v made with the accessors alone: strings and keys with non-printable
 * bytes as \xNN, numbers as i:VALUE (integers) or d:%.17g. */
typedef struct { char s[2048]; size_t n; } text;
static void put(text *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(text *t, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(t->s + t->n, sizeof t->s - t->n, fmt, ap);
    va_end(ap);
    if (k > 0) t->n = t->n + (size_t)k < sizeof t->s ? t->n + (size_t)k : sizeof t->s - 1;
}
static void put_bytes(text *t, const char *s, size_t n) {
    put(t, "\"");
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x20 && c < 0x7f) put(t, "%c", c);
        else put(t, "\\x%02x", c);
    }
    put(t, "\"");
}
static void dump(text *t, const ks_json *v) {
    size_t n;
    int is_int;
    switch (ks_json_kind(v)) {
    case KS_JSON_NULL: put(t, "null"); break;
    case KS_JSON_BOOL: put(t, ks_json_boolean(v) ? "true" : "false"); break;
    case KS_JSON_NUMBER: {
        int64_t i = ks_json_integer(v, &is_int);
        if (is_int) put(t, "i:%lld", (long long)i);
        else put(t, "d:%.17g", ks_json_number(v));
        break;
    }
    case KS_JSON_STRING: {
        const char *s = ks_json_string(v, &n);
        put_bytes(t, s, n);
        break;
    }
    case KS_JSON_ARRAY:
        put(t, "[");
        for (size_t i = 0; i < ks_json_count(v); i++) {
            if (i) put(t, ",");
            dump(t, ks_json_item(v, i));
        }
        put(t, "]");
        break;
    case KS_JSON_OBJECT:
        put(t, "{");
        for (size_t i = 0; i < ks_json_count(v); i++) {
            if (i) put(t, ",");
            const char *k = ks_json_key(v, i, &n);
            put_bytes(t, k, n);
            put(t, ":");
            dump(t, ks_json_item(v, i));
        }
        put(t, "}");
        break;
    }
}

KT_TEST(json_api_walk_every_kind) {
    const char doc[] = "\xEF\xBB\xBF {\"n\": null, \"t\": true, \"f\": false, \"i\": -12, \"d\": 1.5e3, \"two\": 2.0,\n"
                       " \"s\": \"h\\u00e9\\u0000!\", \"a\": [1, [2], {}, []], \"o\": {\"x\": {\"y\": \"z\"}},\n"
                       " \"k\\u0000ey\": 1, \"i\": \"second\", \"e\": \"\"} ";
    ks_json *j = parse(doc, sizeof doc - 1);
    KT_CHECK(j, "parse: %s", ks_last_error());
    text t = {.n = 0};
    dump(&t, j);
    const char *want = "{\"n\":null,\"t\":true,\"f\":false,\"i\":i:-12,\"d\":d:1500,\"two\":d:2,"
                       "\"s\":\"h\\xc3\\xa9\\x00!\",\"a\":[i:1,[i:2],{},[]],\"o\":{\"x\":{\"y\":\"z\"}},"
                       "\"k\\x00ey\":i:1,\"i\":\"second\",\"e\":\"\"}";
    KT_CHECK(!strcmp(t.s, want), "walk gave\n  %s\nwant\n  %s", t.s, want);
    KT_CHECK(ks_json_kind(j) == KS_JSON_OBJECT && ks_json_count(j) == 12, "root: kind %d, %zu members", ks_json_kind(j),
             ks_json_count(j));

    /* by key: the first of duplicates; a key holding a NUL matches no C string */
    KT_CHECK(ks_json_integer(ks_json_get(j, "i"), NULL) == -12, "first 'i'");
    KT_CHECK(!ks_json_get(j, "k") && !ks_json_get(j, "k\0ey") && !ks_json_get(j, "missing"), "NUL key or absent matched");
    KT_CHECK(ks_json_get(j, "e") && !strcmp(ks_json_string(ks_json_get(j, "e"), NULL), ""), "empty string");
    size_t n = 99;
    const char *s = ks_json_string(ks_json_get(j, "s"), &n);
    KT_CHECK(s && n == 5 && !memcmp(s, "h\xc3\xa9\0!", 6), "string with a NUL: %zu bytes", n);
    const char *z = ks_json_string(ks_json_get(ks_json_get(ks_json_get(j, "o"), "x"), "y"), NULL);
    KT_CHECK(z && !strcmp(z, "z"), "chained get");
    KT_CHECK(!ks_json_get(ks_json_get(ks_json_get(j, "o"), "nope"), "y"), "a chain through a missing member is NULL");
    const ks_json *a = ks_json_get(j, "a");
    KT_CHECK(ks_json_count(a) == 4 && ks_json_kind(ks_json_item(a, 2)) == KS_JSON_OBJECT &&
                 ks_json_count(ks_json_item(a, 2)) == 0 && ks_json_item(ks_json_item(a, 1), 0) &&
                 ks_json_integer(ks_json_item(ks_json_item(a, 1), 0), NULL) == 2,
             "array items");
    /* keys: in document order, with their byte lengths */
    KT_CHECK(!strcmp(ks_json_key(j, 0, &n), "n") && n == 1, "first key");
    KT_CHECK(ks_json_key(j, 9, &n) && n == 4 && !memcmp(ks_json_key(j, 9, NULL), "k\0ey", 5), "NUL key: %zu bytes", n);
    KT_CHECK(ks_json_kind(ks_json_item(j, 0)) == KS_JSON_NULL && ks_json_item(j, 0) != NULL, "a null member is a value");
    /* out of range */
    KT_CHECK(!ks_json_item(j, 12) && !ks_json_item(a, 4) && !ks_json_item(a, (size_t)-1), "item out of range");
    n = 7;
    KT_CHECK(!ks_json_key(j, 12, &n) && n == 0, "key out of range");
    ks_json_free(j);

    /* a scalar root */
    j = parse(" \"only\" ", 8);
    KT_CHECK(j && ks_json_kind(j) == KS_JSON_STRING && !strcmp(ks_json_string(j, NULL), "only"), "string root");
    ks_json_free(j);
}

KT_TEST(json_api_numbers) {
    struct { const char *in; int is_int; long long i; double d; } c[] = {
        {"0", 1, 0, 0.0},
        {"-0", 1, 0, -0.0},
        {"42", 1, 42, 42.0},
        {"9223372036854775807", 1, INT64_MAX, 9223372036854775807.0},
        {"-9223372036854775808", 1, INT64_MIN, -9223372036854775808.0},
        {"9223372036854775808", 0, 0, 9223372036854775808.0},  /* 2^63: beyond int64 */
        {"-9223372036854775809", 0, 0, -9223372036854775809.0},
        {"2.0", 0, 0, 2.0},
        {"1e3", 0, 0, 1000.0},
        {"-1.5", 0, 0, -1.5},
        {"1e-400", 0, 0, 0.0}, /* underflow rounds to 0 */
        {"9007199254740993", 1, 9007199254740993LL, 9007199254740992.0}, /* 2^53 + 1: exact as an integer only */
    };
    for (size_t k = 0; k < sizeof c / sizeof *c; k++) {
        ks_json *j = parse(c[k].in, strlen(c[k].in));
        KT_CHECK(j && ks_json_kind(j) == KS_JSON_NUMBER, "%s: %s", c[k].in, ks_last_error());
        int is_int = -1;
        long long i = ks_json_integer(j, &is_int);
        double d = ks_json_number(j);
        KT_CHECK(is_int == c[k].is_int && i == c[k].i, "%s: integer %lld, is_int %d", c[k].in, i, is_int);
        KT_CHECK(d == c[k].d && signbit(d) == signbit(c[k].d), "%s: number %.17g", c[k].in, d);
        ks_json_free(j);
    }
    ks_json *j = parse("1e309", 5);
    KT_CHECK(!j && strstr(ks_last_error(), "line 1, column 1: number out of range of a double"), "1e309: %s",
             j ? "parsed" : ks_last_error());
}

KT_TEST(json_api_bad_input) {
    struct { const char *in; const char *msg; } c[] = {
        {"", "line 1, column 1: unexpected end of input (expected a value)"},
        {"   \n  ", "line 2, column 3: unexpected end of input (expected a value)"},
        {"{\"a\": 1,}", "line 1, column 9: trailing comma before '}'"},
        {"[1 2]", "line 1, column 4: expected ',' or ']' after an array element, found '2'"},
        {"{\"a\" 1}", "line 1, column 6: expected ':' after an object key, found '1'"},
        {"{\n  \"a\": tru}", "line 2, column 8: invalid literal (expected 'true')"},
        {"01", "line 1, column 1: invalid number: leading zero"},
        {"1.", "line 1, column 3: invalid number: expected a digit after '.'"},
        {"\"a\tb\"", "line 1, column 3: control character 0x09 in a string (must be escaped)"},
        {"\"\\ud800\"", "line 1, column 2: lone high surrogate \\uD800"},
        {"\"\xff\"", "line 1, column 2: invalid UTF-8 byte 0xFF in a string"},
        {"\"abc", "line 1, column 1: unterminated string"},
        {"[1] x", "line 1, column 5: trailing characters after the JSON value"},
        {"{\"a\": [}", "line 1, column 8: unexpected '}' (expected a value)"},
        {"nul", "line 1, column 1: invalid literal (expected 'null')"},
    };
    for (size_t k = 0; k < sizeof c / sizeof *c; k++) {
        ks_json *j = parse(c[k].in, strlen(c[k].in));
        KT_CHECK(!j, "case %zu (%s) parsed", k, c[k].in);
        KT_CHECK(strstr(ks_last_error(), c[k].msg), "case %zu (%s): error \"%s\", want \"%s\"", k, c[k].in, ks_last_error(),
                 c[k].msg);
    }
    /* nesting: 512 levels parse, 513 do not */
    char deep[1100];
    for (int depth = 512; depth <= 513; depth++) {
        for (int i = 0; i < depth; i++) { deep[i] = '['; deep[2 * depth - 1 - i] = ']'; }
        ks_json *j = parse(deep, (size_t)(2 * depth));
        KT_CHECK(depth == 512 ? j != NULL : !j && strstr(ks_last_error(), "nesting deeper than 512 levels"), "depth %d: %s",
                 depth, j ? "parsed" : ks_last_error());
        ks_json_free(j);
    }
    /* an embedded NUL byte in the text is a character like any other: refused where it stands */
    ks_json *j = parse("[1,\0 2]", 7);
    KT_CHECK(!j && strstr(ks_last_error(), "line 1, column 4: unexpected byte 0x00 (expected a value)"), "NUL in text: %s",
             j ? "parsed" : ks_last_error());
    /* len bounds the text: what follows is never read */
    j = ks_json_parse("[1]garbage", 3);
    KT_CHECK(j && ks_json_count(j) == 1, "len not honoured: %s", j ? "" : ks_last_error());
    ks_json_free(j);
}

KT_TEST(json_api_null_arguments) {
    ks_json *j = ks_json_parse(NULL, 4);
    KT_CHECK(!j && strstr(ks_last_error(), "NULL text"), "NULL text with a length: %s", j ? "parsed" : ks_last_error());
    j = ks_json_parse(NULL, 0);
    KT_CHECK(!j && strstr(ks_last_error(), "line 1, column 1: unexpected end of input"), "NULL text, len 0: %s",
             j ? "parsed" : ks_last_error());
    ks_json_free(NULL);
    size_t n = 5;
    int is_int = 5;
    KT_CHECK(ks_json_kind(NULL) == KS_JSON_NULL, "kind(NULL)");
    KT_CHECK(ks_json_count(NULL) == 0 && ks_json_item(NULL, 0) == NULL, "count / item of NULL");
    KT_CHECK(ks_json_key(NULL, 0, &n) == NULL && n == 0, "key of NULL");
    KT_CHECK(ks_json_get(NULL, "a") == NULL, "get on NULL");
    n = 5;
    KT_CHECK(ks_json_string(NULL, &n) == NULL && n == 0, "string of NULL");
    KT_CHECK(isnan(ks_json_number(NULL)), "number of NULL");
    KT_CHECK(ks_json_integer(NULL, &is_int) == 0 && is_int == 0, "integer of NULL");
    KT_CHECK(ks_json_boolean(NULL) == 0, "boolean of NULL");
    /* NULL for the optional out-parameters and the key */
    j = parse("{\"a\": \"b\", \"n\": 7}", 18);
    KT_CHECK(j, "parse: %s", ks_last_error());
    KT_CHECK(ks_json_get(j, NULL) == NULL, "get with a NULL key");
    KT_CHECK(!strcmp(ks_json_key(j, 0, NULL), "a") && !strcmp(ks_json_string(ks_json_get(j, "a"), NULL), "b"),
             "NULL len");
    KT_CHECK(ks_json_integer(ks_json_get(j, "n"), NULL) == 7, "NULL is_int");
    ks_json_free(j);
}

/* Every accessor on every kind it does not read gives its documented default. */
KT_TEST(json_api_wrong_kind_defaults) {
    const char doc[] = "[null, true, 3, \"s\", [1], {\"k\": 1}]";
    ks_json *j = parse(doc, sizeof doc - 1);
    KT_CHECK(j && ks_json_count(j) == 6, "parse: %s", j ? "" : ks_last_error());
    for (size_t k = 0; k < 6; k++) {
        const ks_json *v = ks_json_item(j, k);
        ks_json_type kind = ks_json_kind(v);
        KT_CHECK(kind == (ks_json_type)k, "item %zu is of kind %d", k, kind);
        size_t n = 99;
        int is_int = 99;
        if (kind != KS_JSON_ARRAY && kind != KS_JSON_OBJECT)
            KT_CHECK(ks_json_count(v) == 0 && ks_json_item(v, 0) == NULL, "%zu: count / item", k);
        if (kind != KS_JSON_OBJECT) {
            KT_CHECK(ks_json_key(v, 0, &n) == NULL && n == 0, "%zu: key", k);
            KT_CHECK(ks_json_get(v, "k") == NULL, "%zu: get", k);
        }
        n = 99;
        if (kind != KS_JSON_STRING) KT_CHECK(ks_json_string(v, &n) == NULL && n == 0, "%zu: string", k);
        if (kind != KS_JSON_NUMBER) {
            KT_CHECK(isnan(ks_json_number(v)), "%zu: number", k);
            KT_CHECK(ks_json_integer(v, &is_int) == 0 && is_int == 0, "%zu: integer", k);
        }
        if (kind != KS_JSON_BOOL) KT_CHECK(ks_json_boolean(v) == 0, "%zu: boolean", k);
    }
    /* and the kinds they do read, for contrast */
    KT_CHECK(ks_json_boolean(ks_json_item(j, 1)) == 1, "true");
    KT_CHECK(ks_json_number(ks_json_item(j, 2)) == 3.0, "3");
    KT_CHECK(ks_json_count(ks_json_item(j, 4)) == 1 && ks_json_count(ks_json_item(j, 5)) == 1, "counts");
    KT_CHECK(ks_json_get(ks_json_item(j, 5), "k") && !ks_json_get(ks_json_item(j, 4), "k"), "get on object vs array");
    ks_json_free(j);
}
