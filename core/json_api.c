/* json_api.c — the read-only accessors of kvsieve.h's JSON reader over core/json.c's tree.
 * Each takes NULL and values of another kind and gives the default kvsieve.h documents. */
#include "json.h"

#include <math.h>

ks_json_type ks_json_kind(const ks_json *v) { return v ? v->type : KS_JSON_NULL; }

size_t ks_json_count(const ks_json *v) {
    return v && (v->type == KS_JSON_ARRAY || v->type == KS_JSON_OBJECT) ? v->len : 0;
}

const ks_json *ks_json_item(const ks_json *v, size_t i) { return i < ks_json_count(v) ? &v->items[i] : NULL; }

const char *ks_json_key(const ks_json *v, size_t i, size_t *len) {
    int ok = v && v->type == KS_JSON_OBJECT && i < v->len;
    if (len) *len = ok ? v->key_lens[i] : 0;
    return ok ? v->keys[i] : NULL;
}

const char *ks_json_string(const ks_json *v, size_t *len) {
    int ok = v && v->type == KS_JSON_STRING;
    if (len) *len = ok ? v->len : 0;
    return ok ? v->str : NULL;
}

double ks_json_number(const ks_json *v) { return v && v->type == KS_JSON_NUMBER ? v->num : NAN; }

int64_t ks_json_integer(const ks_json *v, int *is_int) {
    int ok = v && v->type == KS_JSON_NUMBER && v->is_int;
    if (is_int) *is_int = ok;
    return ok ? v->inum : 0;
}

int ks_json_boolean(const ks_json *v) { return v && v->type == KS_JSON_BOOL && v->boolean; }
