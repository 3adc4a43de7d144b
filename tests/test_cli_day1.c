/* test_cli_day1.c — issue 15's command-line promises, as a user meets them: --help for every
 * subcommand and --version; a 50K-character prompt from a file and from stdin (and a prompt
 * past the context refused before any work); one-line errors (tracebacks only with -v) and
 * policy parameters that cannot take effect on the model refused by name; eval checks every
 * argument before its first case, survives Ctrl-C (SIGINT) with its finished cases written,
 * and --resume completes the run to the same JSON as an uninterrupted one; bench --json with
 * the spread over repeats. Needs KS_BIN and the bundled model models/kvsieve-tiny (8 layers,
 * context 16384). */
#include "common.h"
#include "json.h"
#include "kvsieve.h"
#include "ktest.h"
#include "testutil.h"

#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static int have_model(void) {
    FILE *f = fopen("models/kvsieve-tiny/model.safetensors", "rb");
    if (f) fclose(f);
    return f != NULL;
}

static ks_json *read_json(const char *path) {
    size_t n;
    char *t = kt_slurp(path, &n);
    if (!t) return NULL;
    ks_json *j = ks_json_parse(t, n);
    free(t);
    return j;
}

/* lines in s (a last line without "\n" counts) */
static int count_lines(const char *s) {
    int n = 0;
    for (const char *p = s; *p; p++) n += *p == '\n';
    size_t len = strlen(s);
    return n + (len && s[len - 1] != '\n');
}

#define SKIP_UNLESS_READY()                                                  \
    do {                                                                     \
        if (!kt_bin()) KT_SKIP("KS_BIN not set (run through make test)");       \
        if (!have_model()) KT_SKIP("models/kvsieve-tiny absent");            \
    } while (0)

/* ---------------------------------------------------------------- help and version */

KT_TEST(cli_help_for_every_subcommand) {
    if (!kt_bin()) KT_SKIP("KS_BIN not set (run through make test)");
    /* every command of repl/main.c; what its help must name (options a user needs) */
    static const struct { const char *cmd, *must[6]; } cmds[] = {
        {"generate", {"-f FILE", "-p -", "--policy", "--set", "-q", "example:"}},
        {"tokenize", {"-m DIR", "-p TEXT", "-f FILE", "example:", NULL}},
        {"bench", {"--lengths", "--repeat", "--json", "(default 3)", "example:", NULL}},
        {"eval", {"--corpora", "-q, --quiet", "--resume", "--png", "(default 1)", "example:"}},
        {"repl", {"-m DIR", "example:", NULL}},
        {"run", {"SCRIPT", "example:", NULL}},
        {"serve", {"-m, --model DIR", "--port P", "--max-batch N", "--no-inline-policies", "example:", NULL}},
        {"version", {"example:", NULL}},
        {"help", {"example:", NULL}},
    };
    static const char *flags[] = {"--help", "-h"};
    char cmd[1024], out[16384];
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++)
        for (int f = 0; f < 2; f++) {
            /* stdout only: the help is for reading and piping */
            snprintf(cmd, sizeof cmd, "%s %s %s 2>/dev/null", kt_bin(), cmds[i].cmd, flags[f]);
            int rc = kt_sh(cmd, out, sizeof out);
            KT_CHECK(rc == 0, "kvsieve %s %s: exit %d: %s", cmds[i].cmd, flags[f], rc, out);
            char want[64];
            snprintf(want, sizeof want, "usage: kvsieve %s", cmds[i].cmd);
            KT_CHECK(strstr(out, want), "kvsieve %s %s: no \"%s\" on stdout: %s", cmds[i].cmd, flags[f], want, out);
            for (int k = 0; k < 6 && cmds[i].must[k]; k++)
                KT_CHECK(strstr(out, cmds[i].must[k]), "kvsieve %s %s: the help lacks \"%s\": %s", cmds[i].cmd, flags[f],
                         cmds[i].must[k], out);
        }
    /* after other options too, and `kvsieve help CMD` */
    snprintf(cmd, sizeof cmd, "%s generate -m models/kvsieve-tiny --help 2>/dev/null", kt_bin());
    KT_CHECK(kt_sh(cmd, out, sizeof out) == 0 && strstr(out, "usage: kvsieve generate"), "generate -m DIR --help: %s", out);
    snprintf(cmd, sizeof cmd, "%s help eval 2>/dev/null", kt_bin());
    KT_CHECK(kt_sh(cmd, out, sizeof out) == 0 && strstr(out, "usage: kvsieve eval"), "help eval: %s", out);
    /* the version, both spellings, on stdout */
    for (int v = 0; v < 2; v++) {
        snprintf(cmd, sizeof cmd, "%s %s 2>/dev/null", kt_bin(), v ? "version" : "--version");
        int rc = kt_sh(cmd, out, sizeof out);
        int a = -1, b = -1, c = -1;
        KT_CHECK(rc == 0 && sscanf(out, "kvsieve %d.%d.%d", &a, &b, &c) == 3 && a >= 0 && b >= 0 && c >= 0,
                 "%s: exit %d: %s", v ? "version" : "--version", rc, out);
    }
    /* the overview lists every command */
    snprintf(cmd, sizeof cmd, "%s --help 2>/dev/null", kt_bin());
    KT_CHECK(kt_sh(cmd, out, sizeof out) == 0, "--help: %s", out);
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++)
        KT_CHECK(strstr(out, cmds[i].cmd), "the overview lacks %s: %s", cmds[i].cmd, out);
}

/* ---------------------------------------------------------------- long prompts */

/* 50,000 characters: "The grass is green. " x 2500 (12,502 tokens with the BOS on the bundled
 * model). GemFilter at layer 0 keeps the run cheap (the whole prompt goes through layer 0, then
 * 32 tokens through the model) while every token of the file reaches the model. */
KT_TEST(cli_prompt_50k_chars_from_file_and_stdin) {
    SKIP_UNLESS_READY();
    char dir[256], path[512], cmd[2048], out[16384], out2[16384];
    KT_CHECK(kt_tmpdir(dir, sizeof dir) == 0, "tmpdir");
    snprintf(path, sizeof path, "%s/prompt.txt", dir);
    FILE *f = fopen(path, "w");
    KT_CHECK(f, "cannot write %s", path);
    for (int i = 0; i < 2500; i++) fputs("The grass is green. ", f);
    fputc('\n', f); /* an editor's final newline: dropped */
    fclose(f);
    size_t n;
    free(kt_slurp(path, &n));
    KT_CHECK(n == 50001, "the prompt file has %zu bytes", n);

    /* the token count, from the same file */
    snprintf(cmd, sizeof cmd, "%s tokenize -m models/kvsieve-tiny -f %s 2>&1", kt_bin(), path);
    static char ids[200000];
    KT_CHECK(kt_sh(cmd, ids, sizeof ids) == 0, "tokenize -f: %.300s", ids);
    int ntok = 0;
    for (char *p = ids; *p; p++) ntok += *p == ' ';
    ntok++;
    KT_CHECK(ntok > 10000 && ntok < 16384, "50K characters are %d tokens", ntok);
    char want[64];
    snprintf(want, sizeof want, "prompt %d tokens", ntok);

    const char *gen = "generate -m models/kvsieve-tiny -n 2 --policy gemfilter --set layer=0 --set k=32";
    snprintf(cmd, sizeof cmd, "%s %s -f %s", kt_bin(), gen, path);
    int rc = kt_sh(cmd, out, sizeof out);
    KT_CHECK(rc == 0 && strstr(out, want), "-f FILE: exit %d, want \"%s\": %s", rc, want, out);
    KT_CHECK(!strstr(out, "The grass is green. The grass"), "a prompt from a file is not echoed: %.300s", out);
    snprintf(cmd, sizeof cmd, "%s %s -p - < %s", kt_bin(), gen, path);
    rc = kt_sh(cmd, out2, sizeof out2);
    KT_CHECK(rc == 0 && strstr(out2, want), "-p - (stdin): exit %d, want \"%s\": %s", rc, want, out2);
    /* the same tokens in, the same text out (the text is the first line) */
    KT_CHECK(strcspn(out, "\n") == strcspn(out2, "\n") && !strncmp(out, out2, strcspn(out, "\n")),
             "file and stdin give different text: %s | %s", out, out2);
    snprintf(cmd, sizeof cmd, "%s %s -f - < %s", kt_bin(), gen, path);
    rc = kt_sh(cmd, out2, sizeof out2);
    KT_CHECK(rc == 0 && strstr(out2, want), "-f - (stdin): exit %d: %s", rc, out2);

    /* twice as long: 25,000 tokens > the context of 16,384, refused before any work in one line */
    f = fopen(path, "w");
    KT_CHECK(f, "cannot write %s", path);
    for (int i = 0; i < 5000; i++) fputs("The grass is green. ", f);
    fclose(f);
    snprintf(cmd, sizeof cmd, "%s %s -f %s", kt_bin(), gen, path);
    rc = kt_sh(cmd, out, sizeof out);
    KT_CHECK(rc == 1 && strstr(out, "kvsieve: the prompt is") && strstr(out, "context of 16384 tokens") &&
                 count_lines(out) == 1 && !strstr(out, "[kvsieve] prompt"),
             "over the context: exit %d: %s", rc, out);
    /* a missing file, a NUL byte, -p and -f together: one line each */
    snprintf(cmd, sizeof cmd, "%s %s -f %s/nonexistent.txt", kt_bin(), gen, dir);
    rc = kt_sh(cmd, out, sizeof out);
    KT_CHECK(rc == 2 && strstr(out, "nonexistent.txt") && count_lines(out) == 1, "missing file: exit %d: %s", rc, out);
    snprintf(cmd, sizeof cmd, "printf 'a\\0b' | %s %s -p -", kt_bin(), gen);
    rc = kt_sh(cmd, out, sizeof out);
    KT_CHECK(rc == 2 && strstr(out, "NUL") && count_lines(out) == 1, "NUL byte: exit %d: %s", rc, out);
    snprintf(cmd, sizeof cmd, "%s %s -p hi -f %s", kt_bin(), gen, path);
    rc = kt_sh(cmd, out, sizeof out);
    KT_CHECK(rc == 2 && strstr(out, "not both"), "-p and -f: exit %d: %s", rc, out);
    kt_rmdir(dir);
}

/* ---------------------------------------------------------------- one-line errors */

KT_TEST(cli_policy_errors_are_one_line_and_name_the_parameter) {
    SKIP_UNLESS_READY();
    char cmd[1024], out[16384];
    /* a layer the 8-layer model does not have, per policy: one line, no traceback, no text */
    static const struct { const char *args, *want; } cases[] = {
        {"--policy gemfilter", "parameter layer = 13 is out of range: the model has 8 layers"},
        {"--policy gemfilter --set layer=8 --set k=16", "parameter layer = 8 is out of range"},
        {"--policy fastkv --set tsp_layer=15", "parameter tsp_layer = 15 is out of range: the model has 8 layers"},
        {"--policy fastkv", "parameter tsp_layer = 15 is out of range"},
        {"--policy asl", "parameter L_min = 10 is out of range: the model has 8 layers"},
        {"--policy asl --set L_min=7 --set L_obs=3 --set fallback_layer=9", "parameter fallback_layer = 9 is out of range"},
        {"--policy snapkv --set nosuchkey=1", "nosuchkey"},
        {"--policy gemfilter --set snapkv.budget=3", "not snapkv"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        snprintf(cmd, sizeof cmd, "%s generate -m models/kvsieve-tiny -p 'Once upon a time' -n 2 %s", kt_bin(), cases[i].args);
        int rc = kt_sh(cmd, out, sizeof out);
        KT_CHECK(rc == 2, "case %zu (%s): exit %d: %s", i, cases[i].args, rc, out);
        KT_CHECK(strstr(out, cases[i].want), "case %zu (%s): lacks \"%s\": %s", i, cases[i].args, cases[i].want, out);
        KT_CHECK(count_lines(out) == 1 && !strncmp(out, "kvsieve: ", 9), "case %zu (%s): not one \"kvsieve: \" line: %s", i,
                 cases[i].args, out);
    }
    /* the traceback and the library's first-failure note with -v (before or after the command) */
    snprintf(cmd, sizeof cmd, "%s -v generate -m models/kvsieve-tiny -p hi -n 2 --policy gemfilter", kt_bin());
    int rc = kt_sh(cmd, out, sizeof out);
    KT_CHECK(rc == 2 && strstr(out, "stack traceback") && strstr(out, "gemfilter.lua"), "-v: exit %d: %s", rc, out);
    snprintf(cmd, sizeof cmd, "%s generate -m models/kvsieve-tiny -p hi -n 2 --policy gemfilter --verbose", kt_bin());
    rc = kt_sh(cmd, out, sizeof out);
    KT_CHECK(rc == 2 && strstr(out, "stack traceback"), "--verbose: exit %d: %s", rc, out);
    /* in range: runs */
    snprintf(cmd, sizeof cmd, "%s generate -m models/kvsieve-tiny -p 'Once upon a time' -n 2 --policy fastkv --set tsp_layer=7 -q", kt_bin());
    rc = kt_sh(cmd, out, sizeof out);
    KT_CHECK(rc == 0 && strstr(out, "generated 2 tokens"), "tsp_layer=7: exit %d: %s", rc, out);
    /* unknown command / option: one line */
    snprintf(cmd, sizeof cmd, "%s generate -m models/kvsieve-tiny -p hi --frobnicate", kt_bin());
    rc = kt_sh(cmd, out, sizeof out);
    KT_CHECK(rc == 2 && count_lines(out) == 1 && strstr(out, "kvsieve: unknown option --frobnicate"), "exit %d: %s", rc, out);
    snprintf(cmd, sizeof cmd, "%s frobnicate", kt_bin());
    rc = kt_sh(cmd, out, sizeof out);
    KT_CHECK(rc == 2 && count_lines(out) == 1 && strstr(out, "kvsieve: unknown command"), "exit %d: %s", rc, out);
}

/* ---------------------------------------------------------------- eval as a long job */

/* The grid of these tests: passkey at 512 tokens, 3 depths, full next to GemFilter (layer 2,
 * k 64): 6 runs, about 0.2 s each. */
#define GRID "--model models/kvsieve-tiny --task passkey --lengths 512 --depths 3 --compare full,gemfilter " \
             "--set gemfilter.layer=2 --set gemfilter.k=64"

KT_TEST(eval_checks_every_argument_before_the_first_case) {
    SKIP_UNLESS_READY();
    char dir[256], cmd[2048], out[16384];
    KT_CHECK(kt_tmpdir(dir, sizeof dir) == 0, "tmpdir");
    snprintf(cmd, sizeof cmd, "%s/r.json", dir);
    kt_write_file(dir, "other.json",
                  "{\"model\": \"models/kvsieve-tiny\", \"task\": \"passkey\", \"seed_base\": \"0xf2cb78610a862fce\", "
                  "\"cases_per_cell\": 1, \"lengths\": [512], \"depths\": [0, 1], \"cases\": [], \"policies\": []}");
    struct { const char *args, *want; } cases[] = {
        /* issue 15: GemFilter's default layer 13 on an 8-layer model, after a full-attention policy */
        {"--model models/kvsieve-tiny --task passkey --lengths 512 --depths 0 --compare full,gemfilter",
         "parameter layer = 13 is out of range"},
        {"--model models/kvsieve-tiny --task passkey --lengths 512 --depths 0 --compare full,fastkv --set fastkv.tsp_layer=15",
         "tsp_layer = 15"},
        {"--model models/kvsieve-tiny --task passkey --lengths 512 --depths 0 --png /nonexistent/x.png", "/nonexistent/x.png"},
        {"--model models/kvsieve-tiny --task passkey --lengths 512 --depths 0 --out /nonexistent/r.json", "/nonexistent/r.json"},
        {"--model models/kvsieve-tiny --task passkey --lengths 512 --depths 0 --compare full,nosuchpolicy", "nosuchpolicy"},
        {"--model models/kvsieve-tiny --task passkey --lengths 512 --depths 0,0.5 --resume %s/other.json", "depths differ"},
        {"--model models/kvsieve-tiny --task passkey --lengths 512 --depths 0,1 --seed 7 --resume %s/other.json", "seed base"},
        {"--model models/kvsieve-tiny --task passkey --lengths 512 --depths 0 --resume %s/missing.json", "missing.json"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char args[1024];
        snprintf(args, sizeof args, cases[i].args, dir);
        snprintf(cmd, sizeof cmd, "%s eval %s", kt_bin(), args);
        int rc = kt_sh(cmd, out, sizeof out);
        KT_CHECK(rc == 2, "case %zu (%s): exit %d: %s", i, args, rc, out);
        KT_CHECK(strstr(out, cases[i].want), "case %zu (%s): lacks \"%s\": %s", i, args, cases[i].want, out);
        /* before any case: no case line, no progress, one line */
        KT_CHECK(!strstr(out, "[eval]") && count_lines(out) == 1 && !strncmp(out, "kvsieve: ", 9),
                 "case %zu (%s): not one line before any case: %s", i, args, out);
    }
    KT_CHECK(access("/nonexistent/x.png", F_OK) != 0, "nothing written");
    kt_rmdir(dir);
}

/* Start `sh -c CMD` with stdout and stderr to files; returns the pid (the shell execs kvsieve). */
static pid_t spawn(const char *cmd, const char *out_path, const char *err_path) {
    pid_t pid = fork();
    if (pid != 0) return pid;
    int o = open(out_path, O_WRONLY | O_CREAT | O_TRUNC, 0644), e = open(err_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (o < 0 || e < 0) _exit(127);
    dup2(o, 1);
    dup2(e, 2);
    execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
    _exit(127);
}

/* Compare two eval JSONs: the grid, every case record and every cell, timing fields aside. */
static int same_eval(const ks_json *a, const ks_json *b, char *why, size_t n) {
    static const char *top[] = {"model", "task", "backend", "seed_base"};
    for (int i = 0; i < 4; i++)
        if (strcmp(ks_json_str(a, top[i], "?"), ks_json_str(b, top[i], "!"))) return snprintf(why, n, "%s", top[i]), 0;
    const ks_json *ca = ks_json_get(a, "cases"), *cb = ks_json_get(b, "cases");
    if (!ca || !cb || ca->len != cb->len) return snprintf(why, n, "case count"), 0;
    for (size_t i = 0; i < ca->len; i++) {
        const ks_json *x = &ca->items[i], *y = &cb->items[i];
        if (x->len != y->len) return snprintf(why, n, "case %zu: fields", i), 0;
        for (size_t k = 0; k < x->len; k++) {
            const char *key = x->keys[k];
            if (!strcmp(key, "prefill_s")) continue; /* a timing */
            const ks_json *u = &x->items[k], *v = ks_json_get(y, key);
            int eq = v && u->type == v->type;
            if (eq && u->type == KS_JSON_STRING) eq = !strcmp(u->str, v->str);
            if (eq && u->type == KS_JSON_NUMBER) eq = u->num == v->num;
            if (eq && u->type == KS_JSON_BOOL) eq = u->boolean == v->boolean;
            if (eq && u->type == KS_JSON_ARRAY) {
                eq = u->len == v->len;
                for (size_t m = 0; eq && m < u->len; m++) eq = u->items[m].num == v->items[m].num;
            }
            if (!eq) return snprintf(why, n, "case %zu: %s", i, key), 0;
        }
    }
    const ks_json *pa = ks_json_get(a, "policies"), *pb = ks_json_get(b, "policies");
    if (!pa || !pb || pa->len != pb->len) return snprintf(why, n, "policies"), 0;
    for (size_t p = 0; p < pa->len; p++) {
        const ks_json *xa = ks_json_get(&pa->items[p], "cells"), *xb = ks_json_get(&pb->items[p], "cells");
        if (!xa || !xb || xa->len != xb->len) return snprintf(why, n, "cells of policy %zu", p), 0;
        for (size_t c = 0; c < xa->len; c++) {
            static const char *keys[] = {"length", "depth", "cases", "exact_match", "value_kept", "mean_tokens", "mean_kept"};
            for (int k = 0; k < 7; k++)
                if (ks_json_num(&xa->items[c], keys[k], -1) != ks_json_num(&xb->items[c], keys[k], -2))
                    return snprintf(why, n, "policy %zu cell %zu: %s", p, c, keys[k]), 0;
        }
    }
    return 1;
}

KT_TEST(eval_sigint_then_resume_equals_an_uninterrupted_run) {
    SKIP_UNLESS_READY();
    char dir[256], cmd[2048], out[65536], p_out[512], p_err[512], p_json[512], p_tmp[512], p_ref[512];
    KT_CHECK(kt_tmpdir(dir, sizeof dir) == 0, "tmpdir");
    snprintf(p_out, sizeof p_out, "%s/stdout", dir);
    snprintf(p_err, sizeof p_err, "%s/stderr", dir);
    snprintf(p_json, sizeof p_json, "%s/r.json", dir);
    snprintf(p_tmp, sizeof p_tmp, "%s/r.json.tmp", dir);
    snprintf(p_ref, sizeof p_ref, "%s/ref.json", dir);

    /* 1. interrupted: the process sends itself SIGINT once its first run is finished (5 runs are
     * left then; KS_EVAL_INTERRUPT_AFTER, so the point does not depend on the machine's speed) */
    snprintf(cmd, sizeof cmd, "KS_EVAL_INTERRUPT_AFTER=1 exec %s eval " GRID " --out %s --png %s/r.png", kt_bin(), p_json,
             dir);
    pid_t pid = spawn(cmd, p_out, p_err);
    KT_CHECK(pid > 0, "fork");
    int st = 0;
    waitpid(pid, &st, 0);
    char *err = kt_slurp(p_err, NULL), *so = kt_slurp(p_out, NULL);
    KT_CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 130, "exit %d (signal %d), want 130: %s", WIFEXITED(st) ? WEXITSTATUS(st) : -1,
             WIFSIGNALED(st) ? WTERMSIG(st) : 0, err ? err : "");
    KT_CHECK(err && strstr(err, "kvsieve: eval: interrupted:") && strstr(err, "--resume"), "the interrupt line: %s", err);
    KT_CHECK(so && strstr(so, "full") && strstr(so, "results: "), "the table and the JSON on Ctrl-C: %s", so);
    free(err);
    free(so);
    KT_CHECK(access(p_tmp, F_OK) != 0, "%s left behind", p_tmp);
    ks_json *part = read_json(p_json);
    KT_CHECK(part, "the partial JSON does not parse");
    const ks_json *pc = ks_json_get(part, "cases");
    size_t n_part = pc ? pc->len : 0;
    KT_CHECK(n_part >= 1 && n_part < 6 && ks_json_bool(part, "complete", 1) == 0, "partial: %zu runs, complete %d", n_part,
             ks_json_bool(part, "complete", -1));
    ks_json_free(part);
    char png[512];
    snprintf(png, sizeof png, "%s/r.png", dir);
    KT_CHECK(access(png, F_OK) == 0, "the partial heatmap");

    /* 2. resumed into the same file: only the missing runs run */
    snprintf(cmd, sizeof cmd, "%s eval " GRID " --out %s --resume %s", kt_bin(), p_json, p_json);
    int rc = kt_sh(cmd, out, sizeof out);
    KT_CHECK(rc == 0, "resume: exit %d: %s", rc, out);
    int ran = 0;
    for (const char *p = out; (p = strstr(p, " tok  ")); p++) ran++;
    KT_CHECK(ran == 6 - (int)n_part, "resume ran %d runs, %zu were done", ran, n_part);

    /* 3. uninterrupted, quiet (no case lines, no progress) */
    snprintf(cmd, sizeof cmd, "%s eval " GRID " --out %s -q", kt_bin(), p_ref);
    rc = kt_sh(cmd, out, sizeof out);
    KT_CHECK(rc == 0 && !strstr(out, "[eval]"), "reference: exit %d: %s", rc, out);

    ks_json *a = read_json(p_json), *b = read_json(p_ref);
    KT_CHECK(a && b, "JSON");
    char why[256] = "";
    KT_CHECK(ks_json_get(a, "cases")->len == 6 && ks_json_bool(a, "complete", 0), "resumed run is complete");
    KT_CHECK(same_eval(a, b, why, sizeof why), "resumed != uninterrupted: %s", why);
    ks_json_free(a);
    ks_json_free(b);

    /* 4. a resume of a finished file runs nothing; a mismatched grid is refused by name */
    snprintf(cmd, sizeof cmd, "%s eval " GRID " --resume %s", kt_bin(), p_ref);
    rc = kt_sh(cmd, out, sizeof out);
    KT_CHECK(rc == 0 && !strstr(out, " tok  ") && strstr(out, "exact match 3/3"), "resume of a full file: %d: %s", rc, out);
    snprintf(cmd, sizeof cmd, "%s eval " GRID " --set gemfilter.k=32 --resume %s", kt_bin(), p_ref);
    rc = kt_sh(cmd, out, sizeof out);
    KT_CHECK(rc == 2 && strstr(out, "gemfilter.k = 64 there, 32 here"), "mismatched parameter: %d: %s", rc, out);
    kt_rmdir(dir);
}

/* ---------------------------------------------------------------- bench --json */

KT_TEST(bench_json_has_every_row_and_the_spread) {
    SKIP_UNLESS_READY();
    char dir[256], cmd[2048], out[16384], path[512];
    KT_CHECK(kt_tmpdir(dir, sizeof dir) == 0, "tmpdir");
    snprintf(path, sizeof path, "%s/b.json", dir);
    snprintf(cmd, sizeof cmd, "%s bench -m models/kvsieve-tiny --lengths 32,64 --gen 2 --repeat 3 --json %s", kt_bin(), path);
    int rc = kt_sh(cmd, out, sizeof out);
    KT_CHECK(rc == 0, "bench: exit %d: %s", rc, out);
    ks_json *j = read_json(path);
    KT_CHECK(j, "bench JSON does not parse");
    KT_CHECK(ks_json_int(j, "repeat", -1) == 3 && ks_json_int(j, "n_layers", -1) == 8 && ks_json_bool(j, "complete", 0),
             "header");
    const ks_json *rows = ks_json_get(j, "rows");
    KT_CHECK(rows && rows->len == 2, "two rows");
    static const char *spreads[] = {"ttft_s", "prefill_tok_s", "tpot_ms", "decode_tok_s", "step_p50_ms"};
    for (size_t i = 0; i < rows->len; i++) {
        const ks_json *r = &rows->items[i];
        KT_CHECK(ks_json_int(r, "tokens", -1) == (i ? 64 : 32) && !strcmp(ks_json_str(r, "policy", "?"), "none"), "row %zu", i);
        for (int k = 0; k < 5; k++) {
            const ks_json *s = ks_json_get(r, spreads[k]);
            double lo = ks_json_num(s, "min", NAN), md = ks_json_num(s, "median", NAN), hi = ks_json_num(s, "max", NAN);
            KT_CHECK(lo > 0 && lo <= md && md <= hi, "row %zu %s: min %g median %g max %g", i, spreads[k], lo, md, hi);
        }
        /* two steps: a run's median step is their mean, inside its decode time over 2 (TPOT) */
        double st_lo = ks_json_num(ks_json_get(r, "step_p50_ms"), "min", NAN);
        double tp_lo = ks_json_num(ks_json_get(r, "tpot_ms"), "min", NAN);
        KT_CHECK(st_lo <= tp_lo, "row %zu: fastest median step %g ms above the fastest TPOT %g ms", i, st_lo, tp_lo);
        KT_CHECK(ks_json_num(r, "kv_rows_per_head", -1) >= 32, "row %zu kv rows", i);
    }
    ks_json_free(j);
    /* an unwritable --json is refused before any work */
    snprintf(cmd, sizeof cmd, "%s bench -m models/kvsieve-tiny --lengths 32 --json /nonexistent/b.json", kt_bin());
    rc = kt_sh(cmd, out, sizeof out);
    KT_CHECK(rc == 2 && count_lines(out) == 1 && strstr(out, "/nonexistent/b.json"), "bad --json: exit %d: %s", rc, out);
    kt_rmdir(dir);
}
