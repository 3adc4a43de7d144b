/* cmd_generate.c — `kvsieve generate` and `kvsieve tokenize`.
 *
 * The prompt comes from -p TEXT, from stdin (-p - or -f -) or from a file (-f FILE): any size
 * up to the model's context, which is checked once the prompt is tokenized, before the policy
 * or the prefill runs. A prompt read from a file is not echoed (the output is the continuation
 * alone); -p TEXT is echoed, so that the text reads on. */
#include "cli.h"
#include "env_opts.h"
#include "kvsieve.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int stream_print(void *ud, int32_t id, const char *piece) {
    (void)ud;
    (void)id;
    fputs(piece, stdout);
    fflush(stdout);
    return 0;
}

typedef struct gen_args {
    const char *model, *prompt, *chat, *policy, *backend, *sys;
    const char *file;  /* -f FILE (or -p -: "-"): the prompt is read from it */
    char *text;        /* the prompt read from file / stdin (malloc'd; a->prompt points to it) */
    int n, ids, threads, quiet, n_sets;
    int tp;            /* --tp N: tensor-parallel ranks (ks_model_tuning.tp), 0 = none */
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
        else if (!strcmp(o, "-f") || !strcmp(o, "--file")) { NEED(); a->file = v; }
        else if (ks_cli_is_help(o)) return 1;
        else if (ks_cli_is_verbose(o)) ks_cli_set_verbose();
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
        else if (!strcmp(o, "--tp")) { NEED(); if (ks_arg_int(o, v, 1, 8, &a->tp)) return -1; }
        else if (!strcmp(o, "--backend")) { NEED(); a->backend = v; }
        else if (!strcmp(o, "--ids")) a->ids = 1;
        else if (!strcmp(o, "-q") || !strcmp(o, "--quiet")) a->quiet = 1;
        else { fprintf(stderr, "kvsieve: unknown option %s\n", o); return -1; }
#undef NEED
    }
    if (!a->model) { fprintf(stderr, "kvsieve: -m DIR is required\n"); return -1; }
    if (a->file && a->prompt) { fprintf(stderr, "kvsieve: give -p TEXT or -f FILE, not both\n"); return -1; }
    if (a->prompt && !strcmp(a->prompt, "-")) { a->file = "-"; a->prompt = NULL; } /* -p -: stdin */
    if (!a->prompt && !a->file) { fprintf(stderr, "kvsieve: -p TEXT (or -f FILE, or -p - for stdin) is required\n"); return -1; }
    if (a->file) { /* read before the model loads: a wrong path costs no loading time */
        if (ks_cli_read_text(a->file, &a->text, NULL)) return -1;
        a->prompt = a->text;
    }
    return 0;
}

/* parse_gen's result as an exit status (-1: 2, the command line was wrong; 1: help shown) */
static int parse_status(int r, const char *cmd) {
    if (r > 0) ks_cli_help(cmd);
    return r > 0 ? 0 : 2;
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
         * must have the format's special tokens, checked before any work (kvsieve.h) */
        const char *fmt = a->chat;
        if (!strcmp(fmt, "auto") && ks_chat_from_model_dir(a->model, &fmt)) return ks_cli_fail("chat"), -1;
        if (ks_chat_check_model(fmt, m, msgs, k)) return ks_cli_fail("chat"), -1;
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

int ks_cli_generate(int argc, char **argv) {
    gen_args a;
    int pr = parse_gen(argc, argv, &a);
    if (pr) { free(a.text); return parse_status(pr, "generate"); }
    ks_model *m;
    ks_model_opts mo; /* --threads reaches the CPU backend */
    ks_model_opts_default(&mo);
    mo.backend = a.backend;
    mo.threads = a.threads;
    ks_model_tuning tu; /* the environment's tuning, and --tp */
    ks_model_tuning_default(&tu);
    ks_cli_model_tuning(&tu);
    tu.tp = a.tp;
    if (ks_model_open_tuned(a.model, &mo, &tu, &m)) { free(a.text); return ks_cli_fail("cannot load model"); }
    int32_t *ids = NULL;
    int n = 0, rc = 0;
    ks_session *s = NULL;
    ks_policy *pol = NULL;
    if (prompt_ids(m, &a, &ids, &n)) { rc = 1; goto out; }
    /* the whole prompt must fit the context (generation then stops at the context): said now,
     * not after a prefill of minutes */
    if (n > ks_model_max_context(m)) {
        fprintf(stderr, "kvsieve: the prompt is %d tokens, more than the model's context of %d tokens\n", n,
                ks_model_max_context(m));
        rc = 1;
        goto out;
    }
    if (ks_session_create(m, &s)) { rc = ks_cli_fail("session"); goto out; }
    if (a.policy) {
        if (ks_cli_policy_load(m, a.policy, &pol)) { rc = ks_cli_fail("policy"); goto out; }
        /* "key=value" or "NAME.key=value"; then the parameters against the model (a layer
         * past the last one is an error), before anything is printed or computed */
        if (ks_cli_apply_sets(pol, ks_policy_name(pol), a.sets, a.n_sets, 1)) { rc = 2; goto out; }
        if (ks_cli_check_policy(m, pol, "")) { rc = 2; goto out; }
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
    if (!a.quiet && !a.ids && !a.chat && !a.file) { fputs(a.prompt, stdout); fflush(stdout); } /* the text continues the prompt */
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
            ks_cli_peak_rss() / 1048576.0);
out:
    free(ids);
    ks_session_free(s);
    if (pol) ks_policy_free(pol);
    ks_model_close(m);
    free(a.text);
    return rc;
}

int ks_cli_tokenize(int argc, char **argv) {
    gen_args a;
    int pr = parse_gen(argc, argv, &a);
    if (pr) { free(a.text); return parse_status(pr, "tokenize"); }
    ks_model *m;
    if (ks_model_open(a.model, "cpu", &m)) { free(a.text); return ks_cli_fail("cannot load model"); }
    int32_t *ids;
    int n, rc = 0;
    if (prompt_ids(m, &a, &ids, &n)) rc = 1;
    else {
        for (int i = 0; i < n; i++) printf("%s%d", i ? " " : "", ids[i]);
        printf("\n");
        free(ids);
    }
    ks_model_close(m);
    free(a.text);
    return rc;
}
