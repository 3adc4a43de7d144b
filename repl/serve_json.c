/* serve_json.c — the server's JSON: a small escaping writer for replies, and the request parser
 * (kvsieve.h's JSON reader -> srv_params), where every field is checked for its type and range
 * and anything unknown is refused by name. No engine calls: the fuzz harness runs it alone. */
#include "serve.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- writer */

void sj_raw(sj_buf *b, const char *s, size_t n) {
    if (b->oom) return;
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n + 1) cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) { b->oom = 1; return; }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}

void sj_cat(sj_buf *b, const char *s) { sj_raw(b, s, strlen(s)); }

void sj_printf(sj_buf *b, const char *fmt, ...) {
    char tmp[256];
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (k < 0) return;
    if ((size_t)k < sizeof tmp) { sj_raw(b, tmp, (size_t)k); return; }
    char *big = malloc((size_t)k + 1);
    if (!big) { b->oom = 1; return; }
    va_start(ap, fmt);
    vsnprintf(big, (size_t)k + 1, fmt, ap);
    va_end(ap);
    sj_raw(b, big, (size_t)k);
    free(big);
}

/* Control characters and the two specials escaped; bytes >= 0x80 pass (the text is the
 * tokenizer's UTF-8). */
void sj_strn(sj_buf *b, const char *s, size_t n) {
    sj_raw(b, "\"", 1);
    size_t run = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x20 && c != '"' && c != '\\') continue;
        sj_raw(b, s + run, i - run);
        run = i + 1;
        char e[8];
        switch (c) {
        case '"': sj_raw(b, "\\\"", 2); break;
        case '\\': sj_raw(b, "\\\\", 2); break;
        case '\n': sj_raw(b, "\\n", 2); break;
        case '\r': sj_raw(b, "\\r", 2); break;
        case '\t': sj_raw(b, "\\t", 2); break;
        default: snprintf(e, sizeof e, "\\u%04x", c); sj_raw(b, e, 6);
        }
    }
    sj_raw(b, s + run, n - run);
    sj_raw(b, "\"", 1);
}

void sj_str(sj_buf *b, const char *s) {
    if (!s) sj_cat(b, "null");
    else sj_strn(b, s, strlen(s));
}

void sj_free(sj_buf *b) {
    free(b->p);
    memset(b, 0, sizeof *b);
}

/* ---------------------------------------------------------------- errors */

void srv_err(srv_error *e, int http, const char *type, const char *code, const char *fmt, ...) {
    e->http = http;
    e->type = type;
    e->code = code;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->msg, sizeof e->msg, fmt, ap);
    va_end(ap);
}

void srv_error_json(const srv_error *e, sj_buf *b) {
    sj_cat(b, "{\"error\": {\"message\": ");
    sj_str(b, e->msg);
    sj_cat(b, ", \"type\": ");
    sj_str(b, e->type);
    sj_cat(b, ", \"param\": null, \"code\": ");
    sj_str(b, e->code);
    sj_cat(b, "}}");
}

/* ---------------------------------------------------------------- request parsing */

void srv_params_free(srv_params *p) {
    free(p->prompt);
    for (int i = 0; i < p->n_msgs; i++) { free(p->msgs[i].role); free(p->msgs[i].content); }
    free(p->msgs);
    free(p->model);
    for (int i = 0; i < p->n_stop; i++) free(p->stop[i]);
    free(p->policy);
    for (int i = 0; i < p->n_set; i++) { free(p->set_key[i]); free(p->set_val[i]); }
    memset(p, 0, sizeof *p);
}

static const char *type_name(ks_json_type t) {
    static const char *n[] = {"null", "a boolean", "a number", "a string", "an array", "an object"};
    return n[t];
}

#define BAD(...) (srv_err(e, 400, "invalid_request_error", "invalid_value", __VA_ARGS__), -1)
#define BADTYPE(key, want, v) (srv_err(e, 400, "invalid_request_error", "invalid_type", \
                                       "'%s' must be %s, got %s", key, want, type_name(ks_json_kind(v))), -1)

/* Member i's key of obj (a request object, whose keys are compared as C strings) must hold no
 * NUL and not repeat an earlier member's key: a repeated field is refused, since taking one of the
 * two would be a guess and each field fills its slot of srv_params once. The scan is short: every
 * caller refuses an unknown key when it meets it, so i stays below the number of names it knows
 * (kvsieve.set: below SRV_MAX_SET). `in` prefixes the name in the message ("kvsieve."). */
static int check_key(const ks_json *obj, size_t i, const char *in, srv_error *e) {
    size_t n, m;
    const char *k = ks_json_key(obj, i, &n);
    if (strlen(k) != n) return BAD("a field name holds a NUL character");
    for (size_t j = 0; j < i; j++) {
        const char *o = ks_json_key(obj, j, &m);
        if (m == n && !memcmp(o, k, n)) return BAD("duplicate field '%s%.80s'", in, k);
    }
    return 0;
}

/* A string without embedded NULs, copied. */
static int get_str(const ks_json *v, const char *key, char **out, srv_error *e) {
    size_t n;
    const char *s = ks_json_string(v, &n);
    if (!s) return BADTYPE(key, "a string", v);
    if (strlen(s) != n) return BAD("'%s' holds a NUL character", key);
    if (!(*out = strdup(s))) return BAD("out of memory");
    return 0;
}

static int get_num(const ks_json *v, const char *key, double lo, double hi, double *out, srv_error *e) {
    if (ks_json_kind(v) != KS_JSON_NUMBER) return BADTYPE(key, "a number", v);
    double d = ks_json_number(v);
    if (!(d >= lo && d <= hi)) return BAD("'%s' must be in [%g, %g], got %g", key, lo, hi, d);
    *out = d;
    return 0;
}

static int get_int(const ks_json *v, const char *key, int64_t lo, int64_t hi, int64_t *out, srv_error *e) {
    int is_int;
    int64_t n = ks_json_integer(v, &is_int);
    if (!is_int) return BADTYPE(key, "an integer", v);
    if (n < lo || n > hi) return BAD("'%s' must be in [%lld, %lld], got %lld", key, (long long)lo, (long long)hi, (long long)n);
    *out = n;
    return 0;
}

/* A policy parameter's value as the text ks_policy_set parses: strings as they are, numbers as
 * written, booleans as true / false. */
static int set_value(const ks_json *v, const char *key, char **out, srv_error *e) {
    char tmp[64];
    int is_int;
    switch (ks_json_kind(v)) {
    case KS_JSON_STRING: return get_str(v, key, out, e);
    case KS_JSON_BOOL: snprintf(tmp, sizeof tmp, "%s", ks_json_boolean(v) ? "true" : "false"); break;
    case KS_JSON_NUMBER: {
        int64_t n = ks_json_integer(v, &is_int);
        if (is_int) snprintf(tmp, sizeof tmp, "%lld", (long long)n);
        else snprintf(tmp, sizeof tmp, "%.17g", ks_json_number(v));
        break;
    }
    default: return BAD("kvsieve.set.%s must be a string, number or boolean, got %s", key, type_name(ks_json_kind(v)));
    }
    if (!(*out = strdup(tmp))) return BAD("out of memory");
    return 0;
}

/* A policy given as text: a path when it ends in ".lua" and holds no blank; else inline Lua
 * source when it has a newline or "return"; else a path when it holds a '/'; else a name
 * (letters, digits, '_', '-'). */
static int policy_kind(const char *s, srv_error *e) {
    if (!*s) return BAD("kvsieve.policy is empty");
    size_t n = strlen(s);
    if (n > 4 && !strcmp(s + n - 4, ".lua") && !strpbrk(s, " \t\r\n")) return SRV_POL_PATH;
    if (strchr(s, '\n') || strstr(s, "return")) return SRV_POL_INLINE;
    if (strchr(s, '/')) return SRV_POL_PATH;
    for (const char *c = s; *c; c++)
        if (!((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') || *c == '_' || *c == '-'))
            return BAD("kvsieve.policy \"%.60s\" is neither a policy name, a .lua path nor Lua source", s);
    return SRV_POL_NAME;
}

static int parse_kvsieve(const ks_json *k, srv_params *p, srv_error *e) {
    if (ks_json_kind(k) != KS_JSON_OBJECT) return BADTYPE("kvsieve", "an object", k);
    for (size_t i = 0; i < ks_json_count(k); i++) {
        const char *key = ks_json_key(k, i, NULL);
        const ks_json *v = ks_json_item(k, i);
        if (check_key(k, i, "kvsieve.", e)) return -1;
        if (!strcmp(key, "policy")) {
            if (ks_json_kind(v) == KS_JSON_NULL) continue;
            if (get_str(v, "kvsieve.policy", &p->policy, e)) return -1;
            if ((p->policy_kind = policy_kind(p->policy, e)) < 0) return -1;
        } else if (!strcmp(key, "set")) {
            if (ks_json_kind(v) != KS_JSON_OBJECT) return BADTYPE("kvsieve.set", "an object", v);
            size_t n = ks_json_count(v);
            if (n > SRV_MAX_SET) return BAD("kvsieve.set has %zu entries, at most %d", n, SRV_MAX_SET);
            for (size_t j = 0; j < n; j++) {
                size_t klen;
                const char *sk = ks_json_key(v, j, &klen);
                if (strlen(sk) != klen || !sk[0]) return BAD("kvsieve.set has an empty or NUL key");
                if (check_key(v, j, "kvsieve.set.", e)) return -1;
                if (!(p->set_key[p->n_set] = strdup(sk))) return BAD("out of memory");
                p->n_set++;
                if (set_value(ks_json_item(v, j), sk, &p->set_val[p->n_set - 1], e)) return -1;
            }
        } else if (!strcmp(key, "report_kept")) {
            if (ks_json_kind(v) != KS_JSON_BOOL) return BADTYPE("kvsieve.report_kept", "a boolean", v);
            p->report_kept = ks_json_boolean(v);
        } else {
            return srv_err(e, 400, "invalid_request_error", "unknown_field",
                           "unknown field 'kvsieve.%.60s' (known: policy, set, report_kept)", key), -1;
        }
    }
    if (p->n_set && !p->policy) return BAD("kvsieve.set without kvsieve.policy");
    return 0;
}

static int parse_messages(const ks_json *v, srv_params *p, srv_error *e) {
    if (ks_json_kind(v) != KS_JSON_ARRAY) return BADTYPE("messages", "an array", v);
    size_t n = ks_json_count(v);
    if (n == 0) return BAD("'messages' is empty");
    if (n > 4096) return BAD("'messages' has %zu entries, at most 4096", n);
    if (!(p->msgs = calloc(n, sizeof *p->msgs))) return BAD("out of memory");
    for (size_t i = 0; i < n; i++) {
        const ks_json *m = ks_json_item(v, i);
        char key[64];
        snprintf(key, sizeof key, "messages[%zu]", i);
        if (ks_json_kind(m) != KS_JSON_OBJECT) return BADTYPE(key, "an object", m);
        p->n_msgs++;
        for (size_t j = 0; j < ks_json_count(m); j++) {
            const ks_json *f = ks_json_item(m, j);
            const char *fk = ks_json_key(m, j, NULL);
            snprintf(key, sizeof key, "messages[%zu].", i);
            if (check_key(m, j, key, e)) return -1;
            snprintf(key, sizeof key, "messages[%zu].%.20s", i, fk);
            if (!strcmp(fk, "role")) {
                if (get_str(f, key, &p->msgs[i].role, e)) return -1;
            } else if (!strcmp(fk, "content")) {
                if (ks_json_kind(f) == KS_JSON_ARRAY) { /* [{"type": "text", "text": ...}, ...]: the texts joined */
                    sj_buf b = {0};
                    for (size_t t = 0; t < ks_json_count(f); t++) {
                        const ks_json *part = ks_json_item(f, t);
                        const char *ty = ks_json_string(ks_json_get(part, "type"), NULL);
                        size_t txn;
                        const char *tx = ks_json_string(ks_json_get(part, "text"), &txn);
                        if (!ty || strcmp(ty, "text") || !tx || strlen(tx) != txn) {
                            sj_free(&b);
                            return BAD("%s[%zu] must be {\"type\": \"text\", \"text\": STRING} (only text is supported)", key, t);
                        }
                        sj_raw(&b, tx, txn);
                    }
                    if (b.oom) { sj_free(&b); return BAD("out of memory"); }
                    p->msgs[i].content = b.p ? b.p : strdup("");
                } else if (get_str(f, key, &p->msgs[i].content, e)) {
                    return -1;
                }
            } else if (!strcmp(fk, "name")) {
                if (ks_json_kind(f) != KS_JSON_STRING) return BADTYPE(key, "a string", f);
            } else {
                return srv_err(e, 400, "invalid_request_error", "unknown_field", "unknown field '%s'", key), -1;
            }
        }
        if (!p->msgs[i].role || !p->msgs[i].content)
            return BAD("messages[%zu] needs a 'role' and a 'content'", i);
    }
    return 0;
}

/* OpenAI fields we know but do not implement: accepted only at the value that means "off". */
static int unsupported(const char *key, const ks_json *v, srv_error *e) {
    ks_json_type t = ks_json_kind(v);
    int off = t == KS_JSON_NULL || (t == KS_JSON_BOOL && !ks_json_boolean(v)) || ks_json_number(v) == 0 ||
              (t == KS_JSON_OBJECT && ks_json_count(v) == 0);
    if (!strcmp(key, "n") || !strcmp(key, "best_of")) off = t == KS_JSON_NULL || ks_json_number(v) == 1;
    if (off) return 0;
    return srv_err(e, 400, "invalid_request_error", "unsupported_field", "'%s' is not supported by kvsieve serve", key), -1;
}

int srv_parse_request(const char *body, size_t len, int chat, srv_params *p, srv_error *e) {
    memset(p, 0, sizeof *p);
    p->chat = chat;
    p->max_tokens = -1;
    p->temperature = 1; /* OpenAI's default */
    p->top_p = 1;
    p->repeat_penalty = 1;
    ks_json *root = ks_json_parse(body ? body : "", body ? len : 0);
    if (!root) {
        srv_err(e, 400, "invalid_request_error", "invalid_json", "the body is not valid JSON: %s", ks_last_error());
        return -1;
    }
    int rc = 0;
    if (ks_json_kind(root) != KS_JSON_OBJECT) rc = BADTYPE("the body", "an object", root);
    int have_input = 0;
    for (size_t i = 0; !rc && i < ks_json_count(root); i++) {
        const char *key = ks_json_key(root, i, NULL);
        const ks_json *v = ks_json_item(root, i);
        ks_json_type t = ks_json_kind(v);
        double d;
        int64_t n;
        if ((rc = check_key(root, i, "", e))) break;
        if (!strcmp(key, "model")) {
            rc = get_str(v, key, &p->model, e);
        } else if (!chat && !strcmp(key, "prompt")) {
            have_input = 1;
            if (t == KS_JSON_ARRAY) { /* ["text"]: exactly one string */
                if (ks_json_count(v) != 1 || ks_json_kind(ks_json_item(v, 0)) != KS_JSON_STRING) {
                    rc = BAD("'prompt' as an array must hold exactly one string");
                    break;
                }
                v = ks_json_item(v, 0);
            }
            rc = get_str(v, "prompt", &p->prompt, e);
        } else if (chat && !strcmp(key, "messages")) {
            have_input = 1;
            rc = parse_messages(v, p, e);
        } else if (!strcmp(key, "max_tokens") || !strcmp(key, "max_completion_tokens")) {
            if (t == KS_JSON_NULL) continue;
            if (!(rc = get_int(v, key, 0, 1 << 30, &n, e))) p->max_tokens = (int)n;
        } else if (!strcmp(key, "temperature")) {
            if (t == KS_JSON_NULL) continue;
            if (!(rc = get_num(v, key, 0, 100, &d, e))) p->temperature = (float)d;
        } else if (!strcmp(key, "top_p")) {
            if (t == KS_JSON_NULL) continue;
            if (!(rc = get_num(v, key, 0, 1, &d, e))) {
                if (d <= 0) rc = BAD("'top_p' must be in (0, 1], got %g", d);
                p->top_p = (float)d;
            }
        } else if (!strcmp(key, "top_k")) {
            if (t == KS_JSON_NULL) continue;
            if (!(rc = get_int(v, key, -1, 1 << 30, &n, e))) p->top_k = n < 0 ? 0 : (int)n; /* -1: all (vLLM) */
        } else if (!strcmp(key, "min_p")) {
            if (t == KS_JSON_NULL) continue;
            if (!(rc = get_num(v, key, 0, 1, &d, e))) p->min_p = (float)d;
        } else if (!strcmp(key, "repetition_penalty")) {
            if (t == KS_JSON_NULL) continue;
            if (!(rc = get_num(v, key, 0, 100, &d, e))) p->repeat_penalty = (float)d;
        } else if (!strcmp(key, "seed")) {
            if (t == KS_JSON_NULL) continue;
            if (!(rc = get_int(v, key, 0, INT64_MAX, &n, e))) p->seed = (uint64_t)n;
        } else if (!strcmp(key, "stop")) {
            if (t == KS_JSON_NULL) continue;
            size_t cnt = t == KS_JSON_ARRAY ? ks_json_count(v) : 1;
            if (cnt > SRV_MAX_STOP) { rc = BAD("'stop' has %zu strings, at most %d", cnt, SRV_MAX_STOP); break; }
            for (size_t j = 0; !rc && j < cnt; j++) {
                if ((rc = get_str(t == KS_JSON_ARRAY ? ks_json_item(v, j) : v, "stop", &p->stop[p->n_stop], e))) break;
                p->n_stop++;
                if (!p->stop[p->n_stop - 1][0]) rc = BAD("'stop' holds an empty string");
            }
        } else if (!strcmp(key, "stream")) {
            if (t == KS_JSON_NULL) continue;
            if (t != KS_JSON_BOOL) rc = BADTYPE(key, "a boolean", v);
            else p->stream = ks_json_boolean(v);
        } else if (!strcmp(key, "stream_options")) {
            if (t != KS_JSON_NULL && t != KS_JSON_OBJECT) rc = BADTYPE(key, "an object", v);
            /* usage is always sent in the last chunk */
        } else if (!strcmp(key, "user")) {
            if (t != KS_JSON_STRING && t != KS_JSON_NULL) rc = BADTYPE(key, "a string", v);
        } else if (!strcmp(key, "kvsieve")) {
            rc = parse_kvsieve(v, p, e);
        } else if (!strcmp(key, "n") || !strcmp(key, "best_of") || !strcmp(key, "logprobs") || !strcmp(key, "top_logprobs") ||
                   !strcmp(key, "echo") || !strcmp(key, "suffix") || !strcmp(key, "frequency_penalty") ||
                   !strcmp(key, "presence_penalty") || !strcmp(key, "logit_bias") || !strcmp(key, "tools") ||
                   !strcmp(key, "tool_choice") || !strcmp(key, "response_format") || !strcmp(key, "parallel_tool_calls")) {
            rc = unsupported(key, v, e);
        } else {
            rc = (srv_err(e, 400, "invalid_request_error", "unknown_field", "unknown field '%.80s'", key), -1);
        }
    }
    if (!rc && !have_input) rc = BAD("'%s' is required", chat ? "messages" : "prompt");
    ks_json_free(root);
    if (rc) srv_params_free(p);
    return rc ? -1 : 0;
}
