/* test_decode.c — the public decode keeps special tokens on request (issue 12, "Fidelity
 * bugs"): HF's decode(ids, skip_special_tokens=False) gives back a text holding Qwen's
 * "<|endoftext|>", and so must ks_detokenize_ex(KS_DECODE_SPECIAL) and the Lua binding's
 * m:decode(ids, {special = true}). The tokenizer is Qwen 3's real tokenizer.json, fetched by
 * tests/tokenizer/setup.sh (KS_TOKREF_DIR overrides its folder); the model under it is a tiny
 * random one whose vocabulary covers the tokenizer's ids. */
#include "kvsieve.h"
#include "ks_lua.h"
#include "ktest.h"
#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Qwen 3: 151643 vocab entries and 26 added tokens (<|endoftext|> = 151643 ...) */
#define QWEN_VOCAB 151669

static const char *tokref_dir(void) {
    const char *e = getenv("KS_TOKREF_DIR");
    return e && *e ? e : "tests/tokenizer/build";
}

/* A tiny model folder with Qwen 3's tokenizer.json copied in; 0 on success, 1 when the
 * tokenizer is absent (skip), -1 on error. */
static int qwen_model(char *dir, size_t n) {
    char src[512];
    snprintf(src, sizeof src, "%s/qwen3.tokenizer.json", tokref_dir());
    if (access(src, R_OK) != 0) return 1;
    if (kt_tmpdir(dir, n)) return -1;
    kt_tiny_cfg c = kt_tiny_default();
    c.dim = 8;
    c.n_layers = 1;
    c.n_heads = 2;
    c.n_kv_heads = 1;
    c.ffn = 8;
    c.vocab = QWEN_VOCAB;
    c.tied = 1;
    if (kt_write_tiny_model(dir, &c)) return -1;
    char cmd[1200], out[1024];
    snprintf(cmd, sizeof cmd, "cp '%s' '%s/tokenizer.json'", src, dir);
    return kt_sh(cmd, out, sizeof out) == 0 ? 0 : -1;
}

#define OPEN_QWEN(dir, m)                                                                               \
    do {                                                                                                \
        int r_ = qwen_model(dir, sizeof dir);                                                           \
        if (r_ == 1) KT_SKIP("%s/qwen3.tokenizer.json absent: run tests/tokenizer/setup.sh", tokref_dir()); \
        KT_CHECK(r_ == 0, "cannot write the tiny Qwen model in %s", dir);                               \
        KT_CHECK(ks_model_open(dir, "cpu", &m) == KS_OK, "%s", ks_last_error());                        \
    } while (0)

/* text with special tokens inside, at the start and at the end */
static const char TEXT[] = "<|im_start|>user\nHello<|endoftext|> world, caf\xC3\xA9<|im_end|>\n<|endoftext|>";

KT_TEST(detokenize_special_round_trips_qwen_endoftext) {
    char dir[256];
    ks_model *m = NULL;
    OPEN_QWEN(dir, m);
    int32_t *ids = NULL;
    int n = 0;
    KT_CHECK(ks_tokenize(m, TEXT, 0, &ids, &n) == KS_OK, "%s", ks_last_error());
    int has_eot = 0;
    for (int i = 0; i < n; i++) has_eot |= ids[i] == 151643;
    char *keep = NULL, *skip = NULL, *plain = NULL;
    ks_status s1 = ks_detokenize_ex(m, ids, n, KS_DECODE_SPECIAL, &keep);
    ks_status s2 = ks_detokenize_ex(m, ids, n, 0, &skip);
    ks_status s3 = ks_detokenize(m, ids, n, &plain);
    free(ids);
    ks_model_close(m);
    kt_rmdir(dir);
    KT_CHECK(has_eot, "<|endoftext|> did not encode to its id 151643");
    KT_CHECK(s1 == KS_OK && s2 == KS_OK && s3 == KS_OK, "decode failed: %s", ks_last_error());
    /* HF: decode(encode(x, add_special_tokens=False), skip_special_tokens=False) == x */
    int ok_keep = !strcmp(keep, TEXT);
    /* skip_special_tokens=True (the default) drops them all, as before */
    int ok_skip = !strcmp(skip, "user\nHello world, caf\xC3\xA9\n") && !strcmp(plain, skip);
    char msg[512];
    snprintf(msg, sizeof msg, "keep \"%s\", skip \"%s\", plain \"%s\"", keep, skip, plain);
    free(keep);
    free(skip);
    free(plain);
    KT_CHECK(ok_keep, "special tokens not kept: %s", msg);
    KT_CHECK(ok_skip, "special tokens not skipped by default: %s", msg);
}

KT_TEST(detokenize_ex_refuses_unknown_flags_and_bad_lists) {
    char dir[256];
    ks_model *m = NULL;
    OPEN_QWEN(dir, m);
    int32_t id = 151643;
    char *t = (char *)1;
    ks_status a = ks_detokenize_ex(m, &id, 1, 0x80, &t);
    int a_null = t == NULL;
    ks_status b = ks_detokenize_ex(m, &id, -1, KS_DECODE_SPECIAL, &t);
    ks_status c = ks_detokenize_ex(m, NULL, 3, 0, &t);
    int32_t bad = QWEN_VOCAB;
    ks_status d = ks_detokenize_ex(m, &bad, 1, KS_DECODE_SPECIAL, &t);
    ks_model_close(m);
    kt_rmdir(dir);
    KT_CHECK(a == KS_ERR_ARG && a_null, "unknown flag: status %d", a);
    KT_CHECK(b == KS_ERR_ARG, "negative count: status %d", b);
    KT_CHECK(c == KS_ERR_ARG, "NULL ids: status %d", c);
    KT_CHECK(d == KS_ERR_ARG, "id beyond the vocabulary: status %d", d);
}

KT_TEST(lua_decode_special_option_round_trips_qwen_endoftext) {
    char dir[256];
    ks_model *m = NULL;
    OPEN_QWEN(dir, m);
    ks_model_close(m);
    lua_State *L = ks_lua_host_state();
    KT_CHECK(L, "no Lua state");
    lua_pushstring(L, dir);
    lua_setglobal(L, "DIR");
    lua_pushstring(L, TEXT);
    lua_setglobal(L, "TEXT");
    static const char code[] =
        "local ks = require 'kvsieve'\n"
        "local m = ks.load(DIR)\n"
        "local ids = m:encode(TEXT, {special = false})\n"
        "local keep = m:decode(ids, {special = true})\n"
        "assert(keep == TEXT, 'special = true: ' .. keep)\n"
        "local skip = m:decode(ids)\n"
        "assert(not skip:find('<|endoftext|>', 1, true), 'default keeps specials: ' .. skip)\n"
        "assert(m:decode(ids, {special = false}) == skip, 'special = false differs from the default')\n"
        "assert(m:decode(ks.tensor(ids), {special = true}) == TEXT, 'tensor ids')\n"
        "local ok, err = pcall(m.decode, m, ids, {specials = true})\n"
        "assert(not ok and tostring(err):find('specials'), 'unknown option accepted: ' .. tostring(err))\n"
        "m:close()\n";
    char err[2048] = "";
    if (luaL_dostring(L, code) != LUA_OK) snprintf(err, sizeof err, "%s", lua_tostring(L, -1));
    ks_lua_host_close(L);
    kt_rmdir(dir);
    KT_CHECK(!err[0], "%s", err);
}
