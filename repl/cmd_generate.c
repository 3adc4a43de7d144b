/* cmd_generate.c — `kvsieve generate` and `kvsieve tokenize`. */
#include "chat.h"
#include "cli.h"
#include "env_opts.h"
#include "engine.h"
#include "kvsieve.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int ks_cli_fail(const char *what) {
    fprintf(stderr, "kvsieve: %s%s%s\n", what ? what : "", what ? ": " : "", ks_last_error());
    return 1;
}

static int stream_print(void *ud, int32_t id, const char *piece) {
    (void)ud;
    (void)id;
    fputs(piece, stdout);
    fflush(stdout);
    return 0;
}

typedef struct gen_args {
    const char *model, *prompt, *chat, *policy, *backend, *sys;
    int n, ids, threads, quiet, n_sets;
    float temp, top_p;
    uint64_t seed;
    const char *sets[64];
    int top_k, n_stop;            /* sampling filters and stop strings (--top-k, --min-p, ...) */
    float min_p, repeat_penalty;
    const char *stop[16];
} gen_args;

static int parse_gen(int argc, char **argv, gen_args *a) {
    memset(a, 0, sizeof *a);
    a->n = 64;
    a->top_p = 1;
    a->repeat_penalty = 1;
    for (int i = 1; i < argc; i++) {
        const char *o = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
#define NEED() do { if (!v) { fprintf(stderr, "kvsieve: option %s needs a value\n", o); return -1; } i++; } while (0)
        if (!strcmp(o, "-m") || !strcmp(o, "--model")) { NEED(); a->model = v; }
        else if (!strcmp(o, "-p") || !strcmp(o, "--prompt")) { NEED(); a->prompt = v; }
        /* numbers strictly (repl/args.c): "abc", "99999999999" or "nan" is an error, not 0 or a wrap */
        else if (!strcmp(o, "-n")) { NEED(); if (ks_arg_int(o, v, 0, INT_MAX, &a->n)) return -1; }
        else if (!strcmp(o, "--temp")) { NEED(); if (ks_arg_float(o, v, 0, INFINITY, 0, &a->temp)) return -1; }
        else if (!strcmp(o, "--top-p")) { NEED(); if (ks_arg_float(o, v, 0, 1, 1, &a->top_p)) return -1; }
        else if (!strcmp(o, "--seed")) { NEED(); if (ks_arg_u64(o, v, &a->seed)) return -1; }
        else if (!strcmp(o, "--top-k")) { NEED(); if (ks_arg_int(o, v, 0, INT_MAX, &a->top_k)) return -1; }
        else if (!strcmp(o, "--min-p")) { NEED(); if (ks_arg_float(o, v, 0, 1, 0, &a->min_p)) return -1; }
        else if (!strcmp(o, "--repeat-penalty")) { NEED(); if (ks_arg_float(o, v, 0, INFINITY, 1, &a->repeat_penalty)) return -1; }
        else if (!strcmp(o, "--stop")) {
            NEED();
            if (!*v) { fprintf(stderr, "kvsieve: --stop expects a non-empty string\n"); return -1; }
            if (a->n_stop == (int)(sizeof a->stop / sizeof *a->stop)) { fprintf(stderr, "kvsieve: at most 16 --stop strings\n"); return -1; }
            a->stop[a->n_stop++] = v;
        }
        /* --chat FMT; a bare --chat (last, or before another option) is --chat auto */
        else if (!strcmp(o, "--chat")) { if (v && v[0] != '-') { NEED(); a->chat = v; } else a->chat = "auto"; }
        else if (!strcmp(o, "--system")) { NEED(); a->sys = v; }
        else if (!strcmp(o, "--policy")) { NEED(); a->policy = v; }
        else if (!strcmp(o, "--set")) { NEED(); if (a->n_sets < 64) a->sets[a->n_sets++] = v; }
        else if (!strcmp(o, "--threads")) { NEED(); if (ks_arg_int(o, v, 0, 4096, &a->threads)) return -1; }
        else if (!strcmp(o, "--backend")) { NEED(); a->backend = v; }
        else if (!strcmp(o, "--ids")) a->ids = 1;
        else if (!strcmp(o, "-q") || !strcmp(o, "--quiet")) a->quiet = 1;
        else { fprintf(stderr, "kvsieve: unknown option %s\n", o); return -1; }
#undef NEED
    }
    if (!a->model) { fprintf(stderr, "kvsieve: -m DIR is required\n"); return -1; }
    if (!a->prompt) { fprintf(stderr, "kvsieve: -p TEXT is required\n"); return -1; }
    return 0;
}

/* The prompt as ids: raw ids (--ids), a chat template, or plain text. */
static int prompt_ids(ks_model *m, const gen_args *a, int32_t **ids, int *n) {
    if (a->ids) {
        return ks_arg_ids("-p (with --ids)", a->prompt, ids, n);
    }
    if (a->chat) {
        ks_chat_msg msgs[2];
        int k = 0;
        if (a->sys) msgs[k++] = (ks_chat_msg){"system", a->sys};
        msgs[k++] = (ks_chat_msg){"user", a->prompt};
        char *text;
        /* auto: the format of the model's tokenizer_config.json chat_template; then the model
         * must have the format's special tokens, checked before any work (core/chat.h) */
        const char *fmt = a->chat;
        if (!strcmp(fmt, "auto") && ks_chat_from_model_dir(a->model, &fmt)) return ks_cli_fail("chat"), -1;
        if (ks_chat_check(fmt, m->tok, msgs, k)) return ks_cli_fail("chat"), -1;
        if (ks_chat_format(fmt, msgs, k, &text)) return ks_cli_fail("chat"), -1;
        ks_status st = ks_tokenize(m, text, 0, ids, n);
        free(text);
        if (st) return ks_cli_fail("tokenize"), -1;
        return 0;
    }
    if (ks_tokenize(m, a->prompt, 1, ids, n)) return ks_cli_fail("tokenize"), -1;
    if (*n == 0) { free(*ids); fprintf(stderr, "kvsieve: the prompt tokenizes to nothing\n"); return -1; }
    return 0;
}

/* Provided by the Lua layer (lua/policy_lua.c): load a policy by name or path with --set overrides. */
ks_status ks_policy_load(ks_model *m, const char *name_or_path, ks_policy **out);
ks_status ks_policy_set(ks_policy *p, const char *key, const char *value);
void ks_policy_free(ks_policy *p);

int ks_cli_generate(int argc, char **argv) {
    gen_args a;
    if (parse_gen(argc, argv, &a)) return 2;
    ks_model *m;
    if (ks_cli_model_open(a.model, &(ks_model_opts){.backend = a.backend}, &m)) return ks_cli_fail("cannot load model");
    int32_t *ids = NULL;
    int n = 0, rc = 0;
    ks_session *s = NULL;
    ks_policy *pol = NULL;
    if (prompt_ids(m, &a, &ids, &n)) { rc = 1; goto out; }
    if (ks_session_create(m, &s)) { rc = ks_cli_fail("session"); goto out; }
    if (a.policy) {
        if (ks_cli_policy_load(m, a.policy, &pol)) { rc = ks_cli_fail("policy"); goto out; }
        for (int i = 0; i < a.n_sets; i++) {
            char key[256];
            const char *eq = strchr(a.sets[i], '=');
            if (!eq || eq == a.sets[i] || (size_t)(eq - a.sets[i]) >= sizeof key) {
                fprintf(stderr, "kvsieve: --set expects key=value, got \"%s\"\n", a.sets[i]);
                rc = 2;
                goto out;
            }
            memcpy(key, a.sets[i], eq - a.sets[i]);
            key[eq - a.sets[i]] = 0;
            if (ks_policy_set(pol, key, eq + 1)) { rc = ks_cli_fail("--set"); goto out; }
        }
        ks_session_set_policy(s, pol);
    } else if (a.n_sets) {
        fprintf(stderr, "kvsieve: --set needs --policy\n");
        rc = 2;
        goto out;
    }
    ks_generate_opts o;
    ks_generate_opts_default(&o);
    o.max_new_tokens = a.n;
    o.temperature = a.temp;
    o.top_p = a.top_p;
    o.seed = a.seed;
    o.top_k = a.top_k;
    o.min_p = a.min_p;
    o.repeat_penalty = a.repeat_penalty;
    o.stop = a.stop;
    o.n_stop = a.n_stop;
    if (!a.quiet && !a.ids && !a.chat) { fputs(a.prompt, stdout); fflush(stdout); } /* the text continues the prompt */
    ks_status st = ks_generate_ids(s, ids, n, &o, a.quiet ? NULL : stream_print, NULL);
    if (!a.quiet) printf("\n");
    fflush(stdout);
    if (st) { rc = ks_cli_fail("generate"); goto out; }
    if (*ks_result_policy_error(s))
        fprintf(stderr, "kvsieve: the policy failed and the request fell back to full attention: %s\n",
                ks_result_policy_error(s));
    int ng;
    ks_result_ids(s, &ng);
    double tp = ks_result_prefill_seconds(s), td = ks_result_decode_seconds(s);
    fprintf(stderr, "[kvsieve] prompt %d tokens in %.3f s (%.1f tok/s) | generated %d tokens, decode %.1f tok/s | peak memory %.1f MiB\n",
            n, tp, tp > 0 ? n / tp : 0.0, ng, (ng > 1 && td > 0) ? (ng - 1) / td : 0.0,
            ks_peak_rss() / 1048576.0);
out:
    free(ids);
    ks_session_free(s);
    if (pol) ks_policy_free(pol);
    ks_model_close(m);
    return rc;
}

int ks_cli_tokenize(int argc, char **argv) {
    gen_args a;
    if (parse_gen(argc, argv, &a)) return 2;
    ks_model *m;
    if (ks_model_open(a.model, "cpu", &m)) return ks_cli_fail("cannot load model");
    int32_t *ids;
    int n, rc = 0;
    if (prompt_ids(m, &a, &ids, &n)) rc = 1;
    else {
        for (int i = 0; i < n; i++) printf("%s%d", i ? " " : "", ids[i]);
        printf("\n");
        free(ids);
    }
    ks_model_close(m);
    return rc;
}
