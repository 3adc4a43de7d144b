/* test_chat.c — the chat formats of core/chat.c:
 *   - chat_hf_<family> (llama3, chatml, mistral, phi3): against HF's apply_chat_template. The
 *     fixture tests/fixtures/chat/<family>.json (tools/chat_ref.py, run where transformers is)
 *     holds a chat_template, conversations, HF's rendered text and ids. We require that
 *     ks_chat_detect names the family from the template, that ks_chat_format renders each
 *     conversation to HF's text, that ks_chat_check accepts the tokenizer, and that kvsieve's
 *     tokenizer (add_special = 0) gives HF's ids. The tokenizer.json files are those of
 *     tests/tokenizer/setup.sh (tests/tokenizer/build/, env KS_TOKREF_DIR overrides), patched
 *     with the fixture's added_tokens (phi3). Without the fixture or the tokenizer: skipped.
 *     (env KS_CHAT_FIXDIR reads the fixtures from another folder.)
 *   - exact renderings, roles refused, recognition of templates, tokenizer_config.json reading,
 *     and the missing-token error (library and CLI, on the bundled model, which has no chat
 *     tokens). The CLI test needs KS_BIN (set by `make test`). */
#include "ktest.h"

#include "chat.h"
#include "json.h"
#include "testutil.h"
#include "tokenizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define TINY "models/kvsieve-tiny"

static const char *tokref_dir(void) {
    const char *e = getenv("KS_TOKREF_DIR");
    return e && *e ? e : "tests/tokenizer/build";
}

/* env KS_CHAT_FIXDIR overrides tests/fixtures/chat for the chat_hf_* fixtures */
static const char *fix_dir(void) {
    const char *e = getenv("KS_CHAT_FIXDIR");
    return e && *e ? e : "tests/fixtures/chat";
}

static int exists(const char *p) {
    struct stat st;
    return stat(p, &st) == 0;
}

/* `added` (a JSON array of added-token objects, or NULL) as the text of added_tokens entries,
 * each followed by a comma (contents are plain ASCII special tokens); malloc'd. */
static char *added_entries(const ks_json *added) {
    size_t n_items = added && added->type == KS_JSON_ARRAY ? added->len : 0, cap = 256 * n_items + 1, n = 0;
    char *ins = calloc(1, cap);
    for (size_t i = 0; i < n_items && ins; i++) {
        const ks_json *t = &added->items[i];
        n += (size_t)snprintf(ins + n, cap - n,
                              "{\"id\": %lld, \"content\": \"%s\", \"single_word\": %s, \"lstrip\": %s, \"rstrip\": %s, "
                              "\"normalized\": %s, \"special\": %s},",
                              (long long)ks_json_int(t, "id", -1), ks_json_str(t, "content", ""),
                              ks_json_bool(t, "single_word", 0) ? "true" : "false", ks_json_bool(t, "lstrip", 0) ? "true" : "false",
                              ks_json_bool(t, "rstrip", 0) ? "true" : "false", ks_json_bool(t, "normalized", 0) ? "true" : "false",
                              ks_json_bool(t, "special", 1) ? "true" : "false");
    }
    return ins;
}

/* The tokenizer.json at `path` with `entries` (added_entries' text; "" = none) put first in its
 * added_tokens, as tools/chat_ref.py does; *bytes is the size of the file at path. The patched
 * copy goes to tmpdir/tokenizer.json and is removed again. */
static ks_status load_patched(const char *path, const char *entries, const char *tmpdir, ks_tokenizer **tok, long *bytes) {
    char *text;
    size_t len;
    ks_status st = ks_read_file(path, &text, &len);
    if (st) return st;
    *bytes = (long)len;
    if (!entries || !*entries) {
        free(text);
        return ks_tokenizer_load(path, tok);
    }
    char *key = strstr(text, "\"added_tokens\"");
    char *open = key ? strchr(key, '[') : NULL;
    if (!open) { free(text); return ks_errorf(KS_ERR_FORMAT, "%s has no added_tokens", path); }
    char out[512];
    snprintf(out, sizeof out, "%s/tokenizer.json", tmpdir);
    FILE *f = fopen(out, "wb");
    if (!f) { free(text); return ks_errorf(KS_ERR_IO, "cannot write %s", out); }
    size_t head = (size_t)(open + 1 - text);
    fwrite(text, 1, head, f);
    fputs(entries, f);
    fwrite(text + head, 1, len - head, f);
    fclose(f);
    free(text);
    st = ks_tokenizer_load(out, tok);
    remove(out);
    return st;
}

static void hf_family(kt_ctx *kt_, const char *fam) {
    char fix[1024];
    snprintf(fix, sizeof fix, "%s/%s.json", fix_dir(), fam);
    if (!exists(fix)) KT_SKIP("%s absent: run python3 tools/chat_ref.py where transformers is (see its header)", fix);
    char *text;
    size_t len;
    KT_CHECK(ks_read_file(fix, &text, &len) == KS_OK, "%s", ks_last_error());
    ks_json *j = ks_json_parse(text, len);
    free(text);
    KT_CHECK(j, "%s: %s", fix, ks_last_error());
    const char *tname = ks_json_str(j, "tokenizer", "");
    char tpath[1024];
    snprintf(tpath, sizeof tpath, "%s/%s", tokref_dir(), tname);
    if (!exists(tpath)) { ks_json_free(j); KT_SKIP("%s absent: run tests/tokenizer/setup.sh (node + npm)", tpath); }

    const char *det = ks_chat_detect(ks_json_str(j, "chat_template", ""));
    int ok = det && !strcmp(det, fam);
    if (!ok) ks_json_free(j);
    KT_CHECK(ok, "the %s fixture's chat_template is recognised as %s", fam, det ? det : "nothing");

    char dir[256];
    KT_CHECK(kt_tmpdir(dir, sizeof dir) == 0, "tmpdir");
    ks_tokenizer *tok = NULL;
    long bytes = 0;
    char *entries = added_entries(ks_json_get(j, "added_tokens"));
    ks_status st = entries ? load_patched(tpath, entries, dir, &tok, &bytes) : KS_ERR_OOM;
    free(entries);
    kt_rmdir(dir);
    if (st) ks_json_free(j);
    KT_CHECK(st == KS_OK, "%s: %s", tname, ks_last_error());
    long want_bytes = (long)ks_json_int(j, "tokenizer_bytes", -1);
    char why[4096] = "";
    if (bytes != want_bytes)
        snprintf(why, sizeof why, "%s is %ld bytes, the fixture was made from one of %ld", tpath, bytes, want_bytes);

    const ks_json *cases = ks_json_get(j, "cases");
    int n_cases = cases && cases->type == KS_JSON_ARRAY ? (int)cases->len : 0;
    if (!why[0] && n_cases < 4) snprintf(why, sizeof why, "%s: %d conversations, want at least 4", fix, n_cases);
    for (int c = 0; c < n_cases && !why[0]; c++) {
        const ks_json *cs = &cases->items[c];
        const char *cname = ks_json_str(cs, "name", "?");
        const ks_json *ms = ks_json_get(cs, "messages");
        ks_chat_msg msgs[16];
        int nm = ms && ms->type == KS_JSON_ARRAY ? (int)KS_MIN(ms->len, 16) : 0;
        for (int i = 0; i < nm; i++)
            msgs[i] = (ks_chat_msg){ks_json_str(&ms->items[i], "role", NULL), ks_json_str(&ms->items[i], "content", NULL)};
        char *out = NULL;
        if (ks_chat_format(fam, msgs, nm, &out)) { snprintf(why, sizeof why, "%s: format: %s", cname, ks_last_error()); break; }
        const char *want = ks_json_str(cs, "text", "");
        if (strcmp(out, want)) {
            snprintf(why, sizeof why, "%s: rendered\n  \"%s\"\nHF rendered\n  \"%s\"", cname, out, want);
            free(out);
            break;
        }
        if (ks_chat_check(fam, tok, msgs, nm)) { snprintf(why, sizeof why, "%s: check: %s", cname, ks_last_error()); free(out); break; }
        int32_t *ids = NULL;
        size_t n = 0;
        st = ks_tokenizer_encode(tok, out, strlen(out), 0, &ids, &n);
        free(out);
        if (st) { snprintf(why, sizeof why, "%s: encode: %s", cname, ks_last_error()); break; }
        const ks_json *hf = ks_json_get(cs, "ids");
        size_t nh = hf && hf->type == KS_JSON_ARRAY ? hf->len : 0;
        size_t i = 0;
        while (i < n && i < nh && ids[i] == (int32_t)hf->items[i].inum) i++;
        if (i < n || i < nh) {
            const char *a = i < n ? ks_tokenizer_token_str(tok, ids[i]) : "(end)";
            const char *b = i < nh ? ks_tokenizer_token_str(tok, (int32_t)hf->items[i].inum) : "(end)";
            snprintf(why, sizeof why, "%s: %zu ids vs HF's %zu, first difference at %zu: %d \"%s\" vs HF %d \"%s\"", cname, n,
                     nh, i, i < n ? ids[i] : -1, a ? a : "?", i < nh ? (int)hf->items[i].inum : -1, b ? b : "?");
        }
        free(ids);
    }
    ks_tokenizer_free(tok);
    ks_json_free(j);
    KT_CHECK(!why[0], "%s: %s", fam, why);
}

KT_TEST(chat_hf_llama3) { hf_family(kt_, "llama3"); }
KT_TEST(chat_hf_chatml) { hf_family(kt_, "chatml"); }
KT_TEST(chat_hf_mistral) { hf_family(kt_, "mistral"); }
KT_TEST(chat_hf_phi3) { hf_family(kt_, "phi3"); }

/* Exact renderings of the two formats added for issue 15, llama3's trim, and the roles each
 * format refuses. */
KT_TEST(chat_formats_render) {
    ks_chat_msg m[] = {{"system", "Be brief."}, {"user", "Hi"}, {"assistant", "Hello."}, {"user", "Bye"}};
    char *s;
    KT_CHECK(ks_chat_format("mistral", m, 4, &s) == KS_OK, "%s", ks_last_error());
    int ok = !strcmp(s, "<s>[INST] Be brief.\n\nHi [/INST]Hello.</s>[INST] Bye [/INST]");
    KT_CHECK(ok, "mistral: %s", s);
    free(s);
    KT_CHECK(ks_chat_format("mistral", m + 1, 1, &s) == KS_OK, "%s", ks_last_error());
    ok = !strcmp(s, "<s>[INST] Hi [/INST]");
    KT_CHECK(ok, "mistral, user only: %s", s);
    free(s);
    KT_CHECK(ks_chat_format("phi3", m, 4, &s) == KS_OK, "%s", ks_last_error());
    ok = !strcmp(s, "<|system|>\nBe brief.<|end|>\n<|user|>\nHi<|end|>\n<|assistant|>\nHello.<|end|>\n<|user|>\nBye<|end|>\n"
                    "<|assistant|>\n");
    KT_CHECK(ok, "phi3: %s", s);
    free(s);
    ks_chat_msg sp[] = {{"user", " \t padded \n"}};
    KT_CHECK(ks_chat_format("llama3", sp, 1, &s) == KS_OK, "%s", ks_last_error());
    ok = !strcmp(s, "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\npadded<|eot_id|>"
                    "<|start_header_id|>assistant<|end_header_id|>\n\n");
    KT_CHECK(ok, "llama3 trims like the template's | trim: %s", s);
    free(s);
    KT_CHECK(ks_chat_format("chatml", sp, 1, &s) == KS_OK, "%s", ks_last_error());
    ok = !strcmp(s, "<|im_start|>user\n \t padded \n<|im_end|>\n<|im_start|>assistant\n");
    KT_CHECK(ok, "chatml keeps the text as it is: %s", s);
    free(s);
    /* refused: mistral out of alternation, a lone system message; phi3 with another role */
    ks_chat_msg two_users[] = {{"user", "a"}, {"user", "b"}};
    KT_CHECK(ks_chat_format("mistral", two_users, 2, &s) == KS_ERR_ARG && !s, "mistral took two user turns in a row");
    KT_CHECK(strstr(ks_last_error(), "expected \"assistant\""), "%s", ks_last_error());
    KT_CHECK(ks_chat_format("mistral", m, 1, &s) == KS_ERR_ARG, "mistral took a system message alone");
    ks_chat_msg tool[] = {{"tool", "42"}};
    KT_CHECK(ks_chat_format("phi3", tool, 1, &s) == KS_ERR_ARG, "phi3 took a tool role");
    KT_CHECK(strstr(ks_last_error(), "\"tool\""), "%s", ks_last_error());
    KT_CHECK(ks_chat_format("jinja", m, 2, &s) == KS_ERR_ARG, "unknown format accepted");
    KT_CHECK(strstr(ks_last_error(), "llama3, chatml, mistral, phi3"), "%s", ks_last_error());
}

/* Templates recognised by their special tokens: ours for mistral and phi3, fragments of the
 * official llama3 and chatml ones, and templates that are none of them. */
KT_TEST(chat_detect_templates) {
    static const char *const fams[] = {"mistral", "phi3"};
    for (int i = 0; i < 2; i++) {
        char p[256], *text;
        size_t len;
        snprintf(p, sizeof p, "tests/fixtures/chat/templates/%s.tokenizer_config.json", fams[i]);
        KT_CHECK(ks_read_file(p, &text, &len) == KS_OK, "%s", ks_last_error());
        ks_json *j = ks_json_parse(text, len);
        free(text);
        KT_CHECK(j, "%s: %s", p, ks_last_error());
        const char *d = ks_chat_detect(ks_json_str(j, "chat_template", ""));
        int ok = d && !strcmp(d, fams[i]);
        ks_json_free(j);
        KT_CHECK(ok, "%s recognised as %s", p, d ? d : "nothing");
    }
    const char *d = ks_chat_detect("{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' }}");
    KT_CHECK(d && !strcmp(d, "llama3"), "llama3: %s", d ? d : "nothing");
    d = ks_chat_detect("{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}");
    KT_CHECK(d && !strcmp(d, "chatml"), "chatml: %s", d ? d : "nothing");
    KT_CHECK(!ks_chat_detect("{{ '<start_of_turn>user\\n' }}"), "a Gemma template recognised as one of ours");
    KT_CHECK(!ks_chat_detect("{{ '<|user|>' }}"), "<|user|> without <|end|> taken for phi3");
    KT_CHECK(!ks_chat_detect(""), "an empty template recognised");
}

/* ks_chat_from_model_dir: a chat_template string, a list with a "default", chat_template.jinja,
 * and the errors for none and for an unknown one. */
KT_TEST(chat_from_model_dir) {
    char dir[256];
    KT_CHECK(kt_tmpdir(dir, sizeof dir) == 0, "tmpdir");
    const char *f = NULL;
    int ok = 0;
    ks_status st;
    kt_write_file(dir, "tokenizer_config.json", "{\"chat_template\": \"{{ '<|im_start|>' + m }}\"}");
    st = ks_chat_from_model_dir(dir, &f);
    ok = st == KS_OK && f && !strcmp(f, "chatml");
    if (ok) {
        kt_write_file(dir, "tokenizer_config.json",
                      "{\"chat_template\": [{\"name\": \"tool_use\", \"template\": \"<|im_start|>\"},"
                      " {\"name\": \"default\", \"template\": \"[INST]\"}]}");
        st = ks_chat_from_model_dir(dir, &f);
        ok = st == KS_OK && f && !strcmp(f, "mistral");
    }
    if (ok) {
        kt_write_file(dir, "tokenizer_config.json", "{\"bos_token\": \"<s>\"}");
        kt_write_file(dir, "chat_template.jinja", "<|user|>\n{{ m }}<|end|>\n");
        st = ks_chat_from_model_dir(dir, &f);
        ok = st == KS_OK && f && !strcmp(f, "phi3");
    }
    char p[300];
    snprintf(p, sizeof p, "%s/chat_template.jinja", dir);
    remove(p);
    int none_ok = 0, unknown_ok = 0;
    if (ok) {
        st = ks_chat_from_model_dir(dir, &f);
        none_ok = st == KS_ERR_ARG && !f && strstr(ks_last_error(), "has no chat_template") && strstr(ks_last_error(), "--chat");
        kt_write_file(dir, "tokenizer_config.json", "{\"chat_template\": \"<start_of_turn>\"}");
        st = ks_chat_from_model_dir(dir, &f);
        unknown_ok = st == KS_ERR_ARG && strstr(ks_last_error(), "is none of llama3, chatml, mistral, phi3");
    }
    kt_rmdir(dir);
    KT_CHECK(ok, "a template was not recognised: %s", ks_last_error());
    KT_CHECK(none_ok, "no template: %s", ks_last_error());
    KT_CHECK(unknown_ok, "an unknown template: %s", ks_last_error());
}

/* The bundled model's tokenizer has none of the four formats' special tokens: each format is
 * refused naming its first missing token, and so is the CLI, in one line, before generating. */
KT_TEST(chat_missing_tokens) {
    ks_tokenizer *tok;
    KT_CHECK(ks_tokenizer_load(TINY "/tokenizer.json", &tok) == KS_OK, "%s", ks_last_error());
    static const char *const want[][2] = {
        {"llama3", "\"<|begin_of_text|>\""}, {"chatml", "\"<|im_start|>\""}, {"mistral", "\"<s>\""}, {"phi3", "\"<|user|>\""}};
    ks_chat_msg m[] = {{"user", "hi"}};
    char why[512] = "";
    for (int i = 0; i < 4 && !why[0]; i++) {
        ks_status st = ks_chat_check(want[i][0], tok, m, 1);
        if (st != KS_ERR_ARG || !strstr(ks_last_error(), want[i][1]) || !strstr(ks_last_error(), want[i][0]))
            snprintf(why, sizeof why, "%s: status %d, \"%s\"", want[i][0], (int)st, ks_last_error());
    }
    /* with chatml's two tokens added, the same tokenizer passes: the check is about the tokens */
    int vocab = ks_tokenizer_vocab_size(tok);
    ks_tokenizer_free(tok);
    KT_CHECK(!why[0], "%s", why);
    char entries[512], dir[256];
    snprintf(entries, sizeof entries,
             "{\"id\": %d, \"content\": \"<|im_start|>\", \"single_word\": false, \"lstrip\": false, \"rstrip\": false, "
             "\"normalized\": false, \"special\": true},"
             "{\"id\": %d, \"content\": \"<|im_end|>\", \"single_word\": false, \"lstrip\": false, \"rstrip\": false, "
             "\"normalized\": false, \"special\": true},", vocab, vocab + 1);
    KT_CHECK(kt_tmpdir(dir, sizeof dir) == 0, "tmpdir");
    long bytes;
    ks_status st = load_patched(TINY "/tokenizer.json", entries, dir, &tok, &bytes);
    kt_rmdir(dir);
    KT_CHECK(st == KS_OK, "%s", ks_last_error());
    st = ks_chat_check("chatml", tok, m, 1);
    ks_status st2 = ks_chat_check("llama3", tok, m, 1);
    ks_tokenizer_free(tok);
    KT_CHECK(st == KS_OK, "chatml's tokens added, still refused: %s", ks_last_error());
    KT_CHECK(st2 == KS_ERR_ARG, "llama3 accepted with only chatml's tokens");

    const char *b = getenv("KS_BIN");
    if (!b || !*b) KT_SKIP("KS_BIN not set (run through make test): the CLI part did not run");
    char cmd[1024], out[4096];
    snprintf(cmd, sizeof cmd, "%s generate -m " TINY " --chat chatml -p hi -n 4", b);
    int rc = kt_sh(cmd, out, sizeof out);
    KT_CHECK(rc != 0, "generate --chat chatml on a model without its tokens succeeded: %s", out);
    KT_CHECK(!strncmp(out, "kvsieve: chat: the model's tokenizer has no token \"<|im_start|>\"", 63) &&
                 strchr(out, '\n') == out + strlen(out) - 1,
             "not the one-line error naming the token: %s", out);
    snprintf(cmd, sizeof cmd, "%s generate -m " TINY " --chat -p hi -n 4", b);
    rc = kt_sh(cmd, out, sizeof out);
    KT_CHECK(rc != 0 && strstr(out, "has no chat_template") && strchr(out, '\n') == out + strlen(out) - 1,
             "a bare --chat on a model without a chat_template: rc %d, %s", rc, out);
    snprintf(cmd, sizeof cmd, "%s generate -m " TINY " --chat vicuna -p hi -n 4", b);
    rc = kt_sh(cmd, out, sizeof out);
    KT_CHECK(rc != 0 && strstr(out, "unknown chat format \"vicuna\""), "an unknown --chat: rc %d, %s", rc, out);
}

/* The public chat calls of kvsieve.h on a model handle: the format list, the check of a model's
 * tokenizer (the bundled model has no chat tokens: refused by name), and NULL arguments. */
KT_TEST(chat_public_api_on_a_model) {
    KT_CHECK(!strcmp(ks_chat_format_names(), "llama3, chatml, mistral, phi3"), "%s", ks_chat_format_names());
    ks_chat_msg msgs[] = {{"system", "Be brief."}, {"user", "Hi"}};
    char *out = (char *)"x";
    KT_CHECK(ks_chat_format("chatml", msgs, 2, NULL) == KS_ERR_ARG, "NULL output pointer");
    KT_CHECK(ks_chat_format("chatml", NULL, 2, &out) == KS_ERR_ARG && out == NULL, "NULL messages");
    const char *fmt = "x";
    KT_CHECK(ks_chat_from_model_dir(NULL, &fmt) == KS_ERR_ARG && fmt == NULL, "NULL folder");
    KT_CHECK(ks_chat_from_model_dir("models/kvsieve-tiny", NULL) == KS_ERR_ARG, "NULL format pointer");
    KT_CHECK(ks_chat_detect(NULL) == NULL, "NULL template");
    KT_CHECK(ks_chat_check_model("chatml", NULL, msgs, 2) == KS_ERR_ARG, "NULL model");
    FILE *f = fopen("models/kvsieve-tiny/model.safetensors", "rb");
    if (!f) KT_SKIP("models/kvsieve-tiny absent");
    fclose(f);
    ks_model *m;
    KT_CHECK(ks_model_open("models/kvsieve-tiny", "cpu", &m) == KS_OK, "%s", ks_last_error());
    ks_status st = ks_chat_check_model("chatml", m, msgs, 2);
    KT_CHECK(st == KS_ERR_ARG && strstr(ks_last_error(), "has no token \"<|im_start|>\""), "%d %s", st, ks_last_error());
    st = ks_chat_check_model("phi3", m, msgs, 2);
    KT_CHECK(st == KS_ERR_ARG && strstr(ks_last_error(), "phi3 chat format"), "%s", ks_last_error());
    KT_CHECK(ks_chat_check_model("jinja", m, msgs, 2) == KS_ERR_ARG && strstr(ks_last_error(), "unknown chat format"), "%s",
             ks_last_error());
    KT_CHECK(ks_chat_check_model("chatml", m, NULL, 2) == KS_ERR_ARG, "NULL messages");
    ks_model_close(m);
}
