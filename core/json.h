/* json.h — the inside of the strict JSON (RFC 8259) parser (core/json.c) that reads config.json,
 * tokenizer.json, safetensors headers and fixture files. kvsieve.h declares its public face: the
 * opaque ks_json, the ks_json_type kinds, ks_json_parse / ks_json_free, ks_json_get and the
 * read-only accessors (core/json_api.c), with the parsing rules. Core code may read the struct
 * below directly, and has the keyed getters declared here.
 *
 * A tree is immutable and allocated in one arena behind its root; strings are decoded to UTF-8
 * and NUL-terminated but may contain embedded NULs, so `len` is authoritative. Errors:
 * ks_json_parse returns NULL and records KS_ERR_FORMAT with "line L, column C: what". */
#ifndef KS_JSON_H
#define KS_JSON_H

#include "kvsieve.h"

#include <stddef.h>
#include <stdint.h>

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

/* ks_json_parse (max nesting depth 512), ks_json_free and ks_json_get (object member by key,
 * first match, or NULL): kvsieve.h. */

/* Convenience typed getters: return `def` when absent, null, or of another type.
 * ks_json_int also reads numbers written with a fraction/exponent whose value is an
 * integer in int64 range (2.0, 1e3); other non-integers give `def`. */
double ks_json_num(const ks_json *obj, const char *key, double def);
int64_t ks_json_int(const ks_json *obj, const char *key, int64_t def);
const char *ks_json_str(const ks_json *obj, const char *key, const char *def);
int ks_json_bool(const ks_json *obj, const char *key, int def);

#endif
