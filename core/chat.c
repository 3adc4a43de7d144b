/* chat.c — the llama3, chatml, mistral and phi3 prompt formats, their recognition from a
 * tokenizer_config.json chat_template, and the check that a tokenizer has their special tokens.
 * tests/test_chat.c compares the ids of each format with HF's apply_chat_template
 * (fixtures from tools/chat_ref.py). */
#include "chat.h"

#include "json.h"
#include "model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *const ks_chat_formats = "llama3, chatml, mistral, phi3";

const char *ks_chat_format_names(void) { return ks_chat_formats; }

typedef enum { F_LLAMA3, F_CHATML, F_MISTRAL, F_PHI3, F_NONE } chat_fmt;
static const char *const fmt_names[] = {"llama3", "chatml", "mistral", "phi3"};

static chat_fmt fmt_of(const char *name) {
    for (int f = 0; f < F_NONE; f++)
        if (name && !strcmp(name, fmt_names[f])) return (chat_fmt)f;
    return F_NONE;
}

/* ---------------------------------------------------------------- a growing string */

typedef struct sbuf { char *p; size_t n, cap; int oom; } sbuf;

static void putn(sbuf *b, const char *s, size_t k) {
    if (b->oom) return;
    if (b->n + k + 1 > b->cap) {
        size_t cap = (b->n + k + 1) * 2;
        char *q = ks_realloc(b->p, cap);
        if (!q) { b->oom = 1; return; }
        b->p = q;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, k);
    b->n += k;
    b->p[b->n] = 0;
}
static void put(sbuf *b, const char *s) { putn(b, s, strlen(s)); }

/* Jinja's `trim` (Python's str.strip()) on ASCII whitespace: the text without leading and
 * trailing spaces, tabs, newlines, CR, VT, FF. Unicode spaces (U+00A0 ...) are kept, where
 * Python would strip them too; chat text rarely starts or ends with one. */
static void put_trimmed(sbuf *b, const char *s) {
    static const char ws[] = " \t\n\r\v\f";
    size_t k = strlen(s), i = 0;
    while (i < k && strchr(ws, s[i])) i++;
    while (k > i && strchr(ws, s[k - 1])) k--;
    putn(b, s + i, k - i);
}

/* ---------------------------------------------------------------- rendering */

/* mistral: [INST] ... [/INST] pairs. An optional leading system message is put in front of the
 * first user message ("SYSTEM\n\nUSER"); then user and assistant alternate, from user. */
static ks_status render_mistral(sbuf *b, const ks_chat_msg *m, int n) {
    int i = 0;
    const char *sys = NULL;
    if (n > 0 && !strcmp(m[0].role, "system")) { sys = m[0].content; i = 1; }
    put(b, "<s>");
    for (int turn = 0; i < n; i++, turn++) {
        const char *want = turn % 2 == 0 ? "user" : "assistant";
        if (strcmp(m[i].role, want))
            return ks_errorf(KS_ERR_ARG, "chat format mistral: message %d has role \"%s\", expected \"%s\" "
                             "(an optional system message first, then user and assistant alternating)", i, m[i].role, want);
        if (turn % 2 == 0) {
            put(b, "[INST] ");
            if (sys && *sys && turn == 0) { put(b, sys); put(b, "\n\n"); } /* an empty one adds nothing */
            put(b, m[i].content);
            put(b, " [/INST]");
        } else {
            put(b, m[i].content);
            put(b, "</s>");
        }
    }
    if (sys && n == 1) return ks_errorf(KS_ERR_ARG, "chat format mistral: a system message needs a user message after it");
    return KS_OK;
}

ks_status ks_chat_format(const char *format, const ks_chat_msg *msgs, int n, char **out) {
    if (!out) return ks_errorf(KS_ERR_ARG, "chat format: NULL output pointer");
    *out = NULL;
    chat_fmt f = fmt_of(format);
    if (f == F_NONE) return ks_errorf(KS_ERR_ARG, "unknown chat format \"%s\" (%s)", format ? format : "", ks_chat_formats);
    if (n < 0 || (n > 0 && !msgs)) return ks_errorf(KS_ERR_ARG, "no chat messages");
    for (int i = 0; i < n; i++)
        if (!msgs[i].role || !msgs[i].content) return ks_errorf(KS_ERR_ARG, "chat message %d has no role or content", i);
    sbuf b = {0};
    put(&b, "");
    ks_status st = KS_OK;
    switch (f) {
    case F_LLAMA3:
        put(&b, "<|begin_of_text|>");
        for (int i = 0; i < n; i++) {
            put(&b, "<|start_header_id|>"); put(&b, msgs[i].role); put(&b, "<|end_header_id|>\n\n");
            put_trimmed(&b, msgs[i].content); put(&b, "<|eot_id|>");
        }
        put(&b, "<|start_header_id|>assistant<|end_header_id|>\n\n");
        break;
    case F_CHATML:
        for (int i = 0; i < n; i++) {
            put(&b, "<|im_start|>"); put(&b, msgs[i].role); put(&b, "\n");
            put(&b, msgs[i].content); put(&b, "<|im_end|>\n");
        }
        put(&b, "<|im_start|>assistant\n");
        break;
    case F_MISTRAL:
        st = render_mistral(&b, msgs, n);
        break;
    case F_PHI3:
        for (int i = 0; i < n && !st; i++) {
            const char *r = msgs[i].role;
            if (strcmp(r, "system") && strcmp(r, "user") && strcmp(r, "assistant"))
                st = ks_errorf(KS_ERR_ARG, "chat format phi3: message %d has role \"%s\" (system, user or assistant)", i, r);
            put(&b, "<|"); put(&b, r); put(&b, "|>\n"); put(&b, msgs[i].content); put(&b, "<|end|>\n");
        }
        put(&b, "<|assistant|>\n");
        break;
    case F_NONE:
        break;
    }
    if (!st && b.oom) st = KS_ERR_OOM;
    if (st) { free(b.p); return st; }
    *out = b.p;
    return KS_OK;
}

/* ---------------------------------------------------------------- recognition */

const char *ks_chat_detect(const char *t) {
    if (!t) return NULL;
    /* the most specific markers first: a template names its own header tokens, and none of the
     * four writes another family's */
    if (strstr(t, "<|start_header_id|>")) return "llama3";
    if (strstr(t, "<|im_start|>")) return "chatml";
    if (strstr(t, "<|user|>") && strstr(t, "<|end|>")) return "phi3";
    if (strstr(t, "[INST]")) return "mistral";
    return NULL;
}

ks_status ks_chat_from_model_dir(const char *dir, const char **format) {
    if (!format) return ks_errorf(KS_ERR_ARG, "chat format: NULL output pointer");
    *format = NULL;
    if (!dir) return ks_errorf(KS_ERR_ARG, "chat format: no model folder given");
    char path[4096];
    if (snprintf(path, sizeof path, "%s/tokenizer_config.json", dir) >= (int)sizeof path)
        return ks_errorf(KS_ERR_ARG, "model path too long");
    char *text = NULL, *jinja = NULL;
    size_t len = 0;
    ks_json *root = NULL;
    const char *tmpl = NULL;
    ks_status st = ks_read_file(path, &text, &len);
    if (st == KS_OK) {
        root = ks_json_parse(text, len);
        if (!root) { st = ks_errorf(KS_ERR_FORMAT, "%s: %s", path, ks_last_error()); goto out; }
        const ks_json *ct = ks_json_get(root, "chat_template");
        if (ct && ct->type == KS_JSON_STRING) tmpl = ct->str;
        else if (ct && ct->type == KS_JSON_ARRAY) /* [{"name": "default", "template": "..."}, ...] */
            for (size_t i = 0; i < ct->len && !tmpl; i++)
                if (!strcmp(ks_json_str(&ct->items[i], "name", ""), "default")) tmpl = ks_json_str(&ct->items[i], "template", NULL);
    }
    if (!tmpl) { /* newer exports keep it in its own file */
        char jp[4096];
        snprintf(jp, sizeof jp, "%s/chat_template.jinja", dir);
        size_t jl;
        if (ks_read_file(jp, &jinja, &jl) == KS_OK) tmpl = jinja;
    }
    if (!tmpl) {
        st = ks_errorf(KS_ERR_ARG, "the model has no chat_template (in %s/tokenizer_config.json or chat_template.jinja): "
                       "name the format with --chat FMT (%s)", dir, ks_chat_formats);
        goto out;
    }
    *format = ks_chat_detect(tmpl);
    st = *format ? KS_OK
                 : ks_errorf(KS_ERR_ARG, "the model's chat_template is none of %s (recognised by their special "
                             "tokens): name the format with --chat FMT", ks_chat_formats);
out:
    ks_json_free(root);
    free(text);
    free(jinja);
    return st;
}

/* ---------------------------------------------------------------- special tokens */

/* One string must encode to exactly one token (an added/special token, matched in text). */
static ks_status need_token(const ks_tokenizer *tok, const char *s, const char *format) {
    int32_t *ids = NULL;
    size_t n = 0;
    ks_status st = ks_tokenizer_encode(tok, s, strlen(s), 0, &ids, &n);
    int one = st == KS_OK && n == 1 && ids[0] == ks_tokenizer_token_id(tok, s);
    free(ids);
    if (st == KS_ERR_OOM) return st;
    if (!one) return ks_errorf(KS_ERR_ARG, "the model's tokenizer has no token \"%s\" (needed by the %s chat format)", s, format);
    return KS_OK;
}

ks_status ks_chat_check(const char *format, const ks_tokenizer *tok, const ks_chat_msg *msgs, int n) {
    static const char *const need[F_NONE][4] = {
        [F_LLAMA3] = {"<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"},
        [F_CHATML] = {"<|im_start|>", "<|im_end|>"},
        [F_MISTRAL] = {"<s>", "</s>"},
        [F_PHI3] = {"<|user|>", "<|assistant|>", "<|end|>"},
    };
    chat_fmt f = fmt_of(format);
    if (f == F_NONE) return ks_errorf(KS_ERR_ARG, "unknown chat format \"%s\" (%s)", format ? format : "", ks_chat_formats);
    if (!tok) return ks_errorf(KS_ERR_ARG, "the model has no tokenizer");
    ks_status st = KS_OK;
    for (int i = 0; i < 4 && need[f][i] && !st; i++) st = need_token(tok, need[f][i], format);
    /* phi3 writes <|system|> only for a system message (and mistral's [INST] is plain text in
     * the v0.1 vocabulary, one token in later ones: either way the tokenizer handles it) */
    for (int i = 0; f == F_PHI3 && i < n && !st; i++)
        if (msgs[i].role && !strcmp(msgs[i].role, "system")) st = need_token(tok, "<|system|>", format);
    return st;
}

ks_status ks_chat_check_model(const char *format, const ks_model *m, const ks_chat_msg *msgs, int n) {
    if (!m) return ks_errorf(KS_ERR_ARG, "chat check: NULL model");
    if (n < 0 || (n > 0 && !msgs)) return ks_errorf(KS_ERR_ARG, "no chat messages");
    return ks_chat_check(format, m->tok, msgs, n);
}
