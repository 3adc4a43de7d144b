/* test_serve_json.c — `kvsieve serve`'s request parser (repl/serve_json.c, compiled in here as the
 * fuzz harness does: it is the CLI's, not the library's) without a server: every field of a
 * completions and a chat body lands in srv_params as the OpenAI API means it, refusals name the
 * field, and repeated fields are refused (they once overfilled srv_params' fixed arrays: two
 * "stop" lists of 8 wrote a ninth pointer over n_stop, and leaked the first value of any string
 * field). tests/test_serve.c checks the same parser through HTTP. */
#include "ktest.h"

#include "serve_json.c"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Parse body (strlen) as chat or completions: srv_parse_request's status, e cleared first. */
static int parse(const char *body, int chat, srv_params *p, srv_error *e) {
    memset(e, 0, sizeof *e);
    return srv_parse_request(body, strlen(body), chat, p, e);
}

/* A body the parser must refuse with 400 and a message holding msg. */
typedef struct refusal { int chat; const char *body, *msg; } refusal;

/* The first case of c[0..n) not refused as it says, described in why; -1 when all are. */
static int first_wrong(const refusal *c, size_t n, char *why, size_t cap) {
    for (size_t k = 0; k < n; k++) {
        srv_params p;
        srv_error e;
        int rc = parse(c[k].body, c[k].chat, &p, &e);
        if (!rc) srv_params_free(&p);
        if (rc != -1 || e.http != 400 || !strstr(e.msg, c[k].msg)) {
            snprintf(why, cap, "case %zu (%.120s): rc %d, \"%s\", want \"%s\"", k, c[k].body, rc, e.msg, c[k].msg);
            return (int)k;
        }
    }
    return -1;
}

KT_TEST(serve_request_completions_fields) {
    const char *body =
        "{\"model\": \"m\", \"prompt\": [\"once upon\"], \"max_tokens\": 7, \"temperature\": 0.5, \"top_p\": 0.25,"
        " \"top_k\": -1, \"min_p\": 0.125, \"repetition_penalty\": 1.5, \"seed\": 9007199254740993, \"stop\": [\"a\", \"bc\"],"
        " \"stream\": true, \"stream_options\": {\"include_usage\": true}, \"user\": null, \"n\": 1, \"echo\": false,"
        " \"logit_bias\": {}, \"frequency_penalty\": 0,"
        " \"kvsieve\": {\"policy\": \"snapkv\", \"set\": {\"budget\": 8, \"flag\": true, \"r\": 0.1, \"s\": \"x y\", \"k\": 1e3},"
        " \"report_kept\": true}}";
    srv_params p;
    srv_error e;
    KT_CHECK(parse(body, 0, &p, &e) == 0, "refused: %s", e.msg);
    int ok = !strcmp(p.model, "m") && !strcmp(p.prompt, "once upon") && p.max_tokens == 7 && p.temperature == 0.5f &&
             p.top_p == 0.25f && p.top_k == 0 && p.min_p == 0.125f && p.repeat_penalty == 1.5f &&
             p.seed == 9007199254740993ull && p.n_stop == 2 && !strcmp(p.stop[0], "a") && !strcmp(p.stop[1], "bc") &&
             p.stream == 1 && p.policy_kind == SRV_POL_NAME && !strcmp(p.policy, "snapkv") && p.report_kept == 1 &&
             p.n_set == 5 && !p.msgs;
    const char *keys[] = {"budget", "flag", "r", "s", "k"}, *vals[] = {"8", "true", "0.10000000000000001", "x y", "1000"};
    for (int i = 0; ok && i < 5; i++) ok = !strcmp(p.set_key[i], keys[i]) && !strcmp(p.set_val[i], vals[i]);
    srv_params_free(&p);
    KT_CHECK(ok, "fields not as sent");
    /* defaults */
    KT_CHECK(parse("{\"prompt\": \"\"}", 0, &p, &e) == 0, "refused: %s", e.msg);
    ok = !strcmp(p.prompt, "") && !p.model && p.max_tokens == -1 && p.temperature == 1 && p.top_p == 1 && p.top_k == 0 &&
         p.repeat_penalty == 1 && p.n_stop == 0 && !p.stream && p.policy_kind == SRV_POL_NONE && !p.policy;
    srv_params_free(&p);
    KT_CHECK(ok, "defaults");
}

KT_TEST(serve_request_chat_fields) {
    const char *body = "{\"messages\": [{\"role\": \"system\", \"content\": \"be brief\", \"name\": \"s\"},"
                       " {\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"a\"}, {\"type\": \"text\", \"text\": \"b\"}]}],"
                       " \"max_completion_tokens\": 3, \"stop\": \"z\","
                       " \"kvsieve\": {\"policy\": \"return {name = 'x'}\", \"set\": {\"q\": \"1\"}}}";
    srv_params p;
    srv_error e;
    KT_CHECK(parse(body, 1, &p, &e) == 0, "refused: %s", e.msg);
    int ok = p.chat && p.n_msgs == 2 && !strcmp(p.msgs[0].role, "system") && !strcmp(p.msgs[0].content, "be brief") &&
             !strcmp(p.msgs[1].role, "user") && !strcmp(p.msgs[1].content, "ab") && p.max_tokens == 3 && p.n_stop == 1 &&
             !strcmp(p.stop[0], "z") && p.policy_kind == SRV_POL_INLINE && p.n_set == 1 && !p.prompt;
    srv_params_free(&p);
    KT_CHECK(ok, "fields not as sent");
    KT_CHECK(parse("{\"messages\": [{\"role\": \"u\", \"content\": \"x\"}], \"kvsieve\": {\"policy\": \"policies/a.lua\"}}", 1,
                   &p, &e) == 0 && p.policy_kind == SRV_POL_PATH,
             "a .lua path: %s", e.msg);
    srv_params_free(&p);
}

KT_TEST(serve_request_refusals_name_the_field) {
    const refusal c[] = {
        {0, "{\"prompt\": \"x\", \"max_tokens\": 2.0}", "'max_tokens' must be an integer, got a number"},
        {0, "{\"prompt\": \"x\", \"seed\": -1}", "'seed' must be in [0, 9223372036854775807], got -1"},
        {0, "{\"prompt\": \"x\", \"top_p\": 0}", "'top_p' must be in (0, 1], got 0"},
        {0, "{\"prompt\": \"a\\u0000b\"}", "'prompt' holds a NUL character"},
        {0, "{\"prompt\": \"x\", \"a\\u0000\": 1}", "a field name holds a NUL character"},
        {0, "{\"prompt\": [\"a\", \"b\"]}", "'prompt' as an array must hold exactly one string"},
        {0, "{\"prompt\": \"x\", \"stop\": [\"1\",\"2\",\"3\",\"4\",\"5\",\"6\",\"7\",\"8\",\"9\"]}", "'stop' has 9 strings, at most 8"},
        {0, "{\"prompt\": \"x\", \"stop\": \"\"}", "'stop' holds an empty string"},
        {0, "{\"prompt\": \"x\", \"best_of\": 2}", "'best_of' is not supported by kvsieve serve"},
        {0, "{\"prompt\": \"x\", \"logprobs\": true}", "'logprobs' is not supported by kvsieve serve"},
        {0, "{\"prompt\": \"x\", \"kvsieve\": {\"policy\": \"a b\"}}", "kvsieve.policy \"a b\" is neither"},
        {0, "{\"prompt\": \"x\", \"kvsieve\": {\"policy\": \"p\", \"set\": {\"k\": [1]}}}",
         "kvsieve.set.k must be a string, number or boolean, got an array"},
        {0, "{\"prompt\": \"x\", \"kvsieve\": {\"report_kept\": 1}}", "'kvsieve.report_kept' must be a boolean, got a number"},
        {0, "{\"messages\": []}", "unknown field 'messages'"},
        {1, "{\"messages\": []}", "'messages' is empty"},
        {1, "{\"messages\": [{\"role\": \"u\", \"content\": [{\"type\": \"image\"}]}]}",
         "messages[0].content[0] must be {\"type\": \"text\", \"text\": STRING}"},
        {1, "{\"messages\": [{\"role\": \"u\", \"content\": \"x\", \"tool\": 1}]}", "unknown field 'messages[0].tool'"},
        {1, "{\"messages\": [{\"role\": 1, \"content\": \"x\"}]}", "'messages[0].role' must be a string, got a number"},
        {0, "[]", "'the body' must be an object, got an array"},
        {0, "{\"prompt\": ", "the body is not valid JSON: line 1, column 12: unexpected end of input"},
    };
    char why[1024];
    KT_CHECK(first_wrong(c, sizeof c / sizeof *c, why, sizeof why) < 0, "%s", why);
}

/* Every object the parser reads refuses a repeated field, wherever the repeat stands. */
KT_TEST(serve_request_repeated_fields_refused) {
    char stops[256] = "{\"prompt\": \"x\", \"stop\": [\"1\",\"2\",\"3\",\"4\",\"5\",\"6\",\"7\",\"8\"], "
                      "\"stop\": [\"1\",\"2\",\"3\",\"4\",\"5\",\"6\",\"7\",\"8\"]}";
    char sets[2048], half[1024] = "";
    for (int i = 0; i < SRV_MAX_SET; i++)
        snprintf(half + strlen(half), sizeof half - strlen(half), "%s\"k%d\": %d", i ? ", " : "", i, i);
    snprintf(sets, sizeof sets, "{\"prompt\": \"x\", \"kvsieve\": {\"policy\": \"p\", \"set\": {%s}, \"set\": {%s}}}", half, half);
    const refusal c[] = {
        {0, stops, "duplicate field 'stop'"},
        {0, "{\"prompt\": \"a\", \"prompt\": \"b\"}", "duplicate field 'prompt'"},
        {0, "{\"model\": \"a\", \"prompt\": \"x\", \"model\": \"a\"}", "duplicate field 'model'"},
        {0, "{\"prompt\": \"x\", \"seed\": 1, \"seed\": 1}", "duplicate field 'seed'"},
        {0, "{\"prompt\": \"x\", \"kvsieve\": {}, \"kvsieve\": {}}", "duplicate field 'kvsieve'"},
        {0, "{\"prompt\": \"x\", \"kvsieve\": {\"policy\": \"a\", \"policy\": \"b\"}}", "duplicate field 'kvsieve.policy'"},
        {0, sets, "duplicate field 'kvsieve.set'"},
        {0, "{\"prompt\": \"x\", \"kvsieve\": {\"policy\": \"a\", \"set\": {\"k\": 1, \"k\": 2}}}", "duplicate field 'kvsieve.set.k'"},
        {0, "{\"prompt\": \"x\", \"kvsieve\": {\"policy\": \"a\", \"policy\\u0000x\": \"b\"}}", "a field name holds a NUL character"},
        {1, "{\"messages\": [{\"role\": \"u\", \"content\": \"x\"}], \"messages\": [{\"role\": \"u\", \"content\": \"x\"}]}",
         "duplicate field 'messages'"},
        {1, "{\"messages\": [{\"role\": \"u\", \"content\": \"x\"}, {\"role\": \"a\", \"role\": \"b\", \"content\": \"y\"}]}",
         "duplicate field 'messages[1].role'"},
        {1, "{\"messages\": [{\"role\": \"u\", \"content\": \"x\", \"content\": [{\"type\": \"text\", \"text\": \"y\"}]}]}",
         "duplicate field 'messages[0].content'"},
        {1, "{\"messages\": [{\"role\": \"u\", \"content\\u0000\": \"x\"}]}", "a field name holds a NUL character"},
    };
    char why[1024];
    KT_CHECK(first_wrong(c, sizeof c / sizeof *c, why, sizeof why) < 0, "%s", why);
    /* the same key in two different objects is no repeat */
    srv_params p;
    srv_error e;
    KT_CHECK(parse("{\"messages\": [{\"role\": \"u\", \"content\": \"x\"}, {\"role\": \"a\", \"content\": \"y\"}]}", 1, &p, &e) == 0,
             "two messages: %s", e.msg);
    srv_params_free(&p);
}
