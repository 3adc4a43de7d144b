/* json.h — a small strict JSON (RFC 8259) parser for config.json, tokenizer.json,
 * safetensors headers and fixture files. Parses to an immutable tree allocated in
 * one arena; freed with ks_json_free on the root.
 *
 * Strings are decoded to UTF-8 (\uXXXX escapes and surrogate pairs included) and
 * NUL-terminated; they may contain embedded NULs, so `len` is authoritative.
 * Errors: ks_json_parse returns NULL, records KS_ERR_FORMAT with "line L, column C: what"
 * (1-based line, 1-based byte column). Strict: input must be UTF-8; escaped lone surrogates,
 * raw control characters in strings, trailing garbage, leading zeros, "1." / ".5", numbers
 * overflowing a double and nesting deeper than 512 are rejected. A leading BOM is skipped.
 * The tree never points into `text`. ks_json_free takes the root only. */
#ifndef KS_JSON_H
#define KS_JSON_H

#include <stddef.h>
#include <stdint.h>

typedef enum ks_json_type {
    KS_JSON_NULL, KS_JSON_BOOL, KS_JSON_NUMBER, KS_JSON_STRING, KS_JSON_ARRAY, KS_JSON_OBJECT
} ks_json_type;

typedef struct ks_json ks_json;
struct ks_json {
    ks_json_type type;
    int boolean;          /* KS_JSON_BOOL */
    double num;           /* KS_JSON_NUMBER */
    int is_int;           /* number written without fraction/exponent, fits int64 */
    int64_t inum;         /* KS_JSON_NUMBER when is_int */
    const char *str;      /* KS_JSON_STRING: UTF-8, NUL-terminated */
    size_t len;           /* KS_JSON_STRING: byte length; ARRAY/OBJECT: element count */
    ks_json *items;       /* ARRAY: elements; OBJECT: values (len of them) */
    const char **keys;    /* OBJECT: keys, in document order (len of them) */
    size_t *key_lens;     /* OBJECT: byte lengths of keys */
};

/* Parse `len` bytes of `text`. Max nesting depth 512. Returns NULL on error. */
ks_json *ks_json_parse(const char *text, size_t len);
void ks_json_free(ks_json *root);

/* Object member by key (first match), or NULL if absent or `obj` is not an object. */
const ks_json *ks_json_get(const ks_json *obj, const char *key);
/* Convenience typed getters: return `def` when absent, null, or of another type.
 * ks_json_int also reads numbers written with a fraction/exponent whose value is an
 * integer in int64 range (2.0, 1e3); other non-integers give `def`. */
double ks_json_num(const ks_json *obj, const char *key, double def);
int64_t ks_json_int(const ks_json *obj, const char *key, int64_t def);
const char *ks_json_str(const ks_json *obj, const char *key, const char *def);
int ks_json_bool(const ks_json *obj, const char *key, int def);

#endif
