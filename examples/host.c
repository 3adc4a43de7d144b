/* host.c — kvsieve embedded in a small C program through include/kvsieve.h alone:
 * open a model, create a session, load a policy (from a file or a string), set a parameter,
 * generate with a streaming callback, read the kept positions and the policy's report, free.
 *
 *   build/host MODEL_DIR [PROMPT] [POLICY_NAME_OR_PATH]
 *
 * Without a policy argument it uses an inline policy that keeps the first 4 and the last 16
 * KV rows of every layer after prefill (a tiny StreamingLLM written here as a string). */
#include "kvsieve.h"

#include <stdio.h>
#include <stdlib.h>

static const char *inline_policy =
    "return {\n"
    "  name = 'host_sinks',\n"
    "  params = { sinks = 4, recent = 16 },\n"
    "  prefill_layer_end = function(ev, p)\n"
    "    local n = ev.n\n"
    "    if n <= p.sinks + p.recent then return end\n"
    "    local ks = require 'kvsieve'\n"
    "    local keep = ks.concat(ks.arange(0, p.sinks), ks.arange(n - p.recent, n))\n"
    "    ev:retain(keep)\n"
    "    ev:report('kept', p.sinks + p.recent)\n"
    "  end,\n"
    "}\n";

static int on_token(void *ud, int32_t id, const char *piece) {
    (void)ud;
    (void)id;
    fputs(piece, stdout);
    fflush(stdout);
    return 0; /* non-zero would stop generation */
}

static int fail(const char *what) {
    fprintf(stderr, "host: %s: %s\n", what, ks_last_error());
    return 1;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s MODEL_DIR [PROMPT] [POLICY]\n", argv[0]);
        return 2;
    }
    const char *prompt = argc > 2 ? argv[2] : "Once upon a time";
    ks_model *m = NULL;
    ks_session *s = NULL;
    ks_policy *p = NULL;
    int rc = 1;
    if (ks_model_open(argv[1], "cpu", &m)) return fail("open model");
    if (ks_session_create(m, &s)) { fail("session"); goto out; }
    if (argc > 3 ? ks_policy_load(m, argv[3], &p) : ks_policy_load_string(m, "host_inline.lua", inline_policy, &p)) {
        fail("policy");
        goto out;
    }
    if (argc <= 3 && ks_policy_set(p, "recent", "12")) { fail("set"); goto out; }
    ks_session_set_policy(s, p);

    ks_generate_opts o;
    ks_generate_opts_default(&o);
    o.max_new_tokens = 32;
    printf("%s", prompt);
    if (ks_generate(s, prompt, &o, on_token, NULL)) { fail("generate"); goto out; }
    printf("\n");

    int n_ids;
    ks_result_ids(s, &n_ids);
    printf("policy %s: %d prompt tokens, %d generated, prefill %.3f s\n", ks_policy_name(p),
           ks_result_prompt_tokens(s), n_ids, ks_result_prefill_seconds(s));
    for (int l = 0; l < ks_model_n_layers(m); l++) {
        const int32_t *pos;
        int k = ks_result_kept(s, l, 0, &pos);
        printf("layer %d, KV head 0: %d rows resident (positions %d .. %d)\n", l, k, k ? pos[0] : -1, k ? pos[k - 1] : -1);
    }
    for (int i = 0; i < ks_policy_n_reports(p); i++)
        printf("report %s = %s\n", ks_policy_report_key(p, i), ks_policy_report(p, ks_policy_report_key(p, i)));
    rc = 0;
out:
    ks_policy_free(p);
    ks_session_free(s);
    ks_model_close(m);
    return rc;
}
