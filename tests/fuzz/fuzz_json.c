/* fuzz_json.c — libFuzzer harness for the JSON parser (core/json.c).
 *
 * Drives ks_json_parse on the raw input, then walks the whole tree it returns (every string
 * read to its length, every object looked up by each of its keys through ks_json_get and the
 * typed getters), so a tree pointing outside its arena or a wrong len / key_lens shows up under
 * AddressSanitizer; ks_json_free then releases it (LeakSanitizer checks nothing stays). Seeds:
 * tests/fuzz/corpus/json (real config.json / index / safetensors-header / tokenizer snippets). */
#include "json.h"

#include <stdint.h>
#include <string.h>

static volatile size_t g_sink;

static void walk(const ks_json *j, int depth) {
    switch (j->type) {
    case KS_JSON_STRING:
        for (size_t i = 0; i < j->len; i++) g_sink += (unsigned char)j->str[i];
        g_sink += (unsigned char)j->str[j->len]; /* the terminating NUL is promised */
        break;
    case KS_JSON_NUMBER: g_sink += j->is_int ? (size_t)j->inum : (size_t)(j->num == j->num); break;
    case KS_JSON_BOOL: g_sink += (size_t)j->boolean; break;
    case KS_JSON_ARRAY:
        for (size_t i = 0; i < j->len; i++) walk(&j->items[i], depth + 1);
        break;
    case KS_JSON_OBJECT:
        for (size_t i = 0; i < j->len; i++) {
            const char *k = j->keys[i];
            g_sink += j->key_lens[i] + (unsigned char)k[j->key_lens[i]];
            /* lookups by a NUL-terminated key: the first member whose key matches */
            const ks_json *m = ks_json_get(j, k);
            /* a present key without an embedded NUL must be found */
            if (!m && strlen(k) == j->key_lens[i]) __builtin_trap();
            g_sink += (size_t)ks_json_int(j, k, 0) + (size_t)ks_json_bool(j, k, 0);
            g_sink += (size_t)(ks_json_num(j, k, 0) != 0) + strlen(ks_json_str(j, k, ""));
            walk(&j->items[i], depth + 1);
        }
        break;
    default: break;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    ks_json *root = ks_json_parse((const char *)data, size);
    if (!root) return 0;
    walk(root, 0);
    (void)ks_json_get(root, "");
    ks_json_free(root);
    return 0;
}
