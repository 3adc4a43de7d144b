/* host.c — kvsieve embedded in a small C program through include/kvsieve.h alone:
 * install a log callback, open a model with options, create a session, load a policy (from a
 * file or a string) or build one in C, set a parameter, generate with a streaming callback,
 * read the kept positions, the policy's report and the last step's top logprobs, free.
 *
 *   build/host MODEL_DIR [PROMPT] [POLICY_NAME_OR_PATH | c]
 *
 * Against an installed kvsieve (make install PREFIX=...):
 *   cc examples/host.c $(pkg-config --cflags --libs kvsieve) -o host
 *
 * Without a policy argument it uses an inline Lua policy that keeps the first 4 and the last 12
 * KV rows of every layer after prefill (a tiny StreamingLLM written here as a string); "c" runs
 * the same policy written in C (ks_policy_create_c), with the same kept rows. */
#include "kvsieve.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

/* The library never prints: its messages (a policy's print(), a policy failure's first note)
 * come here. */
static void on_log(void *user, ks_log_level level, const char *msg) {
    (void)user;
    static const char *names[] = {"error", "warn", "info", "debug"};
    fprintf(stderr, "host: kvsieve %s: %s\n", (unsigned)level < 4 ? names[level] : "?", msg);
}

/* The inline policy in C: after each layer's prefill keep the first 4 and the last 12 rows. */
static ks_status c_sinks_layer_end(void *user, ks_event *ev) {
    (void)user;
    const int sinks = 4, recent = 12;
    int n = ks_event_rows(ev);
    if (n <= sinks + recent) return KS_OK;
    int32_t keep[16];
    for (int i = 0; i < sinks; i++) keep[i] = i;
    for (int i = 0; i < recent; i++) keep[sinks + i] = n - recent + i;
    return ks_action_retain(ev, keep, sinks + recent);
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
    printf("kvsieve %s (header %d.%d.%d)\n", ks_version(), KS_VERSION_MAJOR, KS_VERSION_MINOR, KS_VERSION_PATCH);
    ks_set_log(on_log, NULL);
    ks_model_opts mo;
    ks_model_opts_default(&mo);
    mo.backend = "cpu";
    mo.threads = 2; /* the CPU backend's own pool: results are the same bits for any count */
    if (ks_model_open_ex(argv[1], &mo, &m)) return fail("open model");
    if (ks_session_create(m, &s)) { fail("session"); goto out; }
    int c_policy = argc > 3 && !strcmp(argv[3], "c");
    ks_policy_handlers h = {.name = "host_sinks", .prefill_layer_end = c_sinks_layer_end};
    if (c_policy ? ks_policy_create_c(&h, &p)
                 : argc > 3 ? ks_policy_load(m, argv[3], &p)
                            : ks_policy_load_string(m, "host_inline.lua", inline_policy, &p)) {
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
    int32_t top[3];
    float lp[3];
    if (ks_session_top_logprobs(s, 3, top, lp)) { fail("logprobs"); goto out; }
    printf("last step's top 3:");
    for (int i = 0; i < 3; i++) printf(" %d (%.3f)", top[i], lp[i]);
    printf("\n");
    rc = 0;
out:
    ks_policy_free(p);
    ks_session_free(s);
    ks_model_close(m);
    return rc;
}
