/* cmd_eval.c — `kvsieve eval`: a grid of long-context retrieval cases (core/tasks.h) run
 * under one or several policies, scored by exact match, written as JSON, a PNG heatmap
 * (repl/heatmap.h) and a table in the terminal.
 *
 *   kvsieve eval --model DIR --task passkey|niah|multikey|kv [--lengths 512,1K,4K]
 *                [--depths 0,0.5,1 | --depths 11] [--cases N] [--policy P | --compare a,b,c]
 *                [--set [policy.]key=value]... [--seed BASE] [--corpora DIR]
 *                [--out FILE.json] [--png FILE.png] [--resume FILE.json] [--backend cpu|cuda]
 *                [--quiet] [--show] [-v]
 *
 * A long job: every argument (the policies load and accept their parameters against the
 * model's layer count, output paths are writable, a --resume file matches the grid) is checked
 * before the first case runs; a progress line with an ETA goes to stderr (one updating line on
 * a terminal, a line every 10 s otherwise, none with -q); Ctrl-C (SIGINT) stops the running
 * case and writes what is finished (JSON, table, a partial heatmap), then exits 130. The JSON
 * is written only at the end (FILE.tmp, then renamed), so no empty file is ever left behind.
 * --resume FILE reads an earlier --out of the same grid (task, seed, lengths, depths, cases,
 * policies and their parameters; anything else is refused, naming the difference) and runs
 * only the cases not in it: the result equals an uninterrupted run's, timings aside.
 *
 * The grid itself (cases, runs, scoring, records, the JSON file and --resume) is the library's
 * (kvsieve.h's ks_eval_*, core/eval.c); this file parses the arguments, loads the model and
 * policies, and prints: case lines, progress, --show, the table and the heatmaps.
 *
 * A case is (task, length L, depth d, index i): its seed is derived from (BASE, task, L, d, i)
 * and its prompt the longest one of at most L tokens (BOS included). Scoring: the
 * next len(tokens(answer)) greedy tokens must equal tokens(answer) (teacher-free exact
 * match, as tools/train/tasks.py defines it). Per case the harness also records which of
 * the needle's value tokens the policy kept: the restart set (GemFilter, two-pass ASL) or
 * else the union over KV heads of the last layer's resident prompt rows. --show prints, per
 * case and policy, the kept prompt text with the needle's value marked: the GemFilter paper's
 * Figure 1, live. */
#include "cli.h"
#include "env_opts.h"
#include "heatmap.h"
#include "kvsieve.h"

#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAX_AXIS 64
#define MAX_POL 16
#define MIN(a, b) ((a) < (b) ? (a) : (b))
#define MAX(a, b) ((a) > (b) ? (a) : (b))

typedef struct eval_args {
    const char *model, *task, *policy, *compare, *corpora, *out, *png, *backend, *resume;
    int lengths[MAX_AXIS], n_len;
    double depths[MAX_AXIS];
    int n_dep, cases, quiet, show;
    uint64_t seed;
    const char *sets[64];
    int n_sets;
} eval_args;

/* "0,0.25,1" (depths in [0,1]) or "11" (that many evenly spaced depths from 0 to 1; "0" and
 * "1" alone are depths). Every number strictly (repl/args.c); prints the error. */
static int parse_depths(const char *s, double *out, int *n) {
    const char *opt = "eval --depths";
    *n = 0;
    if (!strpbrk(s, ",.")) {
        int k;
        if (ks_arg_int(opt, s, 0, MAX_AXIS, &k)) return -1;
        if (k <= 1) { out[0] = (double)k; *n = 1; return 0; } /* "0" and "1" are depths */
        for (int i = 0; i < k; i++) out[i] = (double)i / (k - 1);
        *n = k;
        return 0;
    }
    char tok[64];
    for (const char *p = s;;) {
        size_t len = strcspn(p, ",");
        if (*n >= MAX_AXIS) { fprintf(stderr, "kvsieve: %s takes at most %d depths\n", opt, MAX_AXIS); return -1; }
        snprintf(tok, sizeof tok, "%.*s", (int)MIN(len, sizeof tok - 1), p);
        if (len >= sizeof tok || ks_arg_double(opt, tok, 0, 1, 0, &out[*n])) return -1;
        (*n)++;
        if (!p[len]) return 0;
        p += len + 1;
    }
}

static int parse_eval(int argc, char **argv, eval_args *a) {
    memset(a, 0, sizeof *a);
    a->cases = 1;
    a->seed = KS_EVAL_SEED;
    ks_arg_int_list("eval --lengths", "512,1024,2048,4096", 1, 1 << 30, 1, a->lengths, MAX_AXIS, &a->n_len);
    parse_depths("0,0.25,0.5,0.75,1", a->depths, &a->n_dep);
    for (int i = 1; i < argc; i++) {
        const char *o = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
#define NEED() do { if (!v) { fprintf(stderr, "kvsieve: eval: option %s needs a value\n", o); return -1; } i++; } while (0)
        if (!strcmp(o, "-m") || !strcmp(o, "--model")) { NEED(); a->model = v; }
        else if (!strcmp(o, "--task")) { NEED(); a->task = v; }
        else if (!strcmp(o, "--lengths")) {
            NEED();
            /* strictly: 9223372036854775807K is out of range, not an overflow */
            if (ks_arg_int_list("eval --lengths", v, 1, 1 << 30, 1, a->lengths, MAX_AXIS, &a->n_len)) return -1;
        } else if (!strcmp(o, "--depths")) {
            NEED();
            if (parse_depths(v, a->depths, &a->n_dep)) return -1;
        } else if (!strcmp(o, "--cases")) {
            NEED();
            if (ks_arg_int("eval --cases", v, 1, 100000, &a->cases)) return -1;
        } else if (!strcmp(o, "--policy")) { NEED(); a->policy = v; }
        else if (!strcmp(o, "--compare")) { NEED(); a->compare = v; }
        else if (!strcmp(o, "--set")) { NEED(); if (a->n_sets < 64) a->sets[a->n_sets++] = v; }
        else if (!strcmp(o, "--seed")) {
            NEED();
            if (ks_arg_u64("eval --seed", v, &a->seed)) return -1;
        } else if (!strcmp(o, "--corpora")) { NEED(); a->corpora = v; }
        else if (!strcmp(o, "--out")) { NEED(); a->out = v; }
        else if (!strcmp(o, "--png")) { NEED(); a->png = v; }
        else if (!strcmp(o, "--resume")) { NEED(); a->resume = v; }
        else if (ks_cli_is_help(o)) return 1;
        else if (ks_cli_is_verbose(o)) ks_cli_set_verbose();
        else if (!strcmp(o, "--backend")) { NEED(); a->backend = v; }
        else if (!strcmp(o, "-q") || !strcmp(o, "--quiet")) a->quiet = 1;
        else if (!strcmp(o, "--show")) a->show = 1;
        else { fprintf(stderr, "kvsieve: eval: unknown option %s\n", o); return -1; }
#undef NEED
    }
    if (!a->model) { fprintf(stderr, "kvsieve: eval: --model DIR is required\n"); return -1; }
    if (!a->task) { fprintf(stderr, "kvsieve: eval: --task passkey|niah|multikey|kv is required\n"); return -1; }
    if (a->policy && a->compare) { fprintf(stderr, "kvsieve: eval: give --policy P or --compare A,B,..., not both\n"); return -1; }
    return 0;
}

/* A policy's parameters as "k=v k=v" (for titles) and as a JSON object. */
static void params_text(ks_policy *pol, char *buf, size_t n) {
    buf[0] = 0;
    if (!pol) return;
    size_t used = 0;
    for (int i = 0; i < ks_policy_n_params(pol) && used < n; i++) {
        char v[64];
        const char *k = ks_policy_param_name(pol, i);
        if (ks_policy_get(pol, k, v, sizeof v) || !strncmp(k, "trace", 5) || !*v) continue; /* debugging switches */
        char *end;
        double d = strtod(v, &end);
        if (end != v && !*end && strchr(v, '.')) snprintf(v, sizeof v, "%g", d); /* 0.1, not 0.10000000000000001 */
        used += snprintf(buf + used, n - used, "%s%s=%s", used ? " " : "", k, v);
    }
}

/* Print the kept prompt text: runs of consecutive kept tokens joined by " ~ ", the value
 * tokens [vb, ve) marked (reverse video on a terminal, >>...<< otherwise). */
static void show_kept(ks_model *m, const int32_t *ids, const int32_t *kept, int nk, int vb, int ve, int tty) {
    int i = 0;
    while (i < nk) {
        int j = i;
        while (j + 1 < nk && kept[j + 1] == kept[j] + 1) j++;
        if (i) fputs(tty ? "\033[2m ~ \033[0m" : " ~ ", stdout);
        /* one run, split where the value starts and ends */
        int a0 = kept[i], a1 = kept[j] + 1;
        int cut[4] = {a0, MAX(a0, MIN(vb, a1)), MAX(a0, MIN(ve, a1)), a1};
        for (int part = 0; part < 3; part++) {
            if (cut[part + 1] <= cut[part]) continue;
            int lo = cut[part], hi = cut[part + 1];
            char *t = NULL;
            if (ks_detokenize(m, ids + lo, hi - lo, &t)) continue;
            for (char *c = t; *c; c++)
                if (*c == '\n') *c = ' ';
            if (part == 1) printf(tty ? "\033[1;7m%s\033[0m" : ">>%s<<", t);
            else fputs(t, stdout);
            free(t);
        }
        i = j + 1;
    }
    putchar('\n');
}

static void length_label(int L, char *buf, size_t n) {
    if (L >= 1024 && L % 1024 == 0) snprintf(buf, n, "%dK", L / 1024);
    else snprintf(buf, n, "%d", L);
}

/* ---------------------------------------------------------------- the long job: signals, progress */

static volatile sig_atomic_t g_eval_interrupt;
/* KS_EVAL_INTERRUPT_AFTER=N (tests): the process sends itself SIGINT once N runs are finished,
 * so the Ctrl-C path is tested at a fixed point whatever the machine's speed. */
static long g_interrupt_after;

static void on_sigint(int sig) {
    (void)sig;
    g_eval_interrupt = 1; /* the running case stops between layers (ks_session.interrupt) */
}

/* "1h02m", "3m05s", "42s" */
static void fmt_dur(double s, char *buf, size_t n) {
    if (!(s >= 0) || s > 360000) { snprintf(buf, n, "?"); return; }
    long t = lround(s);
    if (t >= 3600) snprintf(buf, n, "%ldh%02ldm", t / 3600, t / 60 % 60);
    else if (t >= 60) snprintf(buf, n, "%ldm%02lds", t / 60, t % 60);
    else snprintf(buf, n, "%lds", t);
}

typedef struct progress {
    int on, tty, shown;     /* shown: an updating line is on the terminal now */
    long total, done;       /* runs to do in this invocation (resumed ones excluded), done so far */
    long resumed;
    double t0, last_print;
} progress;

/* Clear the terminal's progress line before other stderr output. */
static void progress_clear(progress *pg) {
    if (pg->shown) { fputs("\r\033[K", stderr); pg->shown = 0; }
}

static void progress_update(progress *pg, int final) {
    if (!pg->on || !pg->total) return; /* nothing ran (all resumed): nothing to tell */
    double now = ks_cli_now(), el = now - pg->t0;
    /* not a terminal: the first run, then a line every 10 s, and the last */
    if (!pg->tty && !final && pg->done != 1 && now - pg->last_print < 10) return;
    pg->last_print = now;
    char e[32], r[32];
    fmt_dur(el, e, sizeof e);
    fmt_dur(pg->done ? el / pg->done * (pg->total - pg->done) : NAN, r, sizeof r);
    char line[256];
    snprintf(line, sizeof line, "[eval] %ld/%ld runs (%.0f%%)%s, %s elapsed, ETA %s", pg->done, pg->total,
             pg->total ? 100.0 * pg->done / pg->total : 100.0, pg->resumed ? " after the resumed ones" : "", e,
             pg->done == pg->total ? "0s" : r);
    if (pg->tty) {
        fprintf(stderr, "\r\033[K%s", line);
        pg->shown = 1;
        if (final) progress_clear(pg);
    } else fprintf(stderr, "%s\n", line);
    fflush(stderr);
}

/* ---------------------------------------------------------------- the table and the heatmaps */

static void model_basename(const char *path, char *buf, size_t n) {
    const char *e = path + strlen(path);
    while (e > path && e[-1] == '/') e--; /* "models/x/" */
    const char *b = e;
    while (b > path && b[-1] != '/') b--;
    snprintf(buf, n, "%.*s", (int)MIN((size_t)(e - b), n - 1), b);
}

/* The table and the heatmap (terminal, and --png) of the finished runs; unfinished cells are
 * blank. */
static int print_results(const eval_args *a, const ks_eval *ev, const char *const *pnames, ks_policy *const *pols,
                         int nP, double *scores) {
    int nL = a->n_len, nD = a->n_dep;
    char llab[MAX_AXIS][16], dlab[MAX_AXIS][16];
    const char *lp[MAX_AXIS], *dp[MAX_AXIS];
    for (int i = 0; i < nL; i++) { length_label(a->lengths[i], llab[i], sizeof llab[i]); lp[i] = llab[i]; }
    for (int i = 0; i < nD; i++) { snprintf(dlab[i], sizeof dlab[i], "%g%%", a->depths[i] * 100); dp[i] = dlab[i]; }
    ks_heat_panel panels[MAX_POL];
    char ptitle[MAX_POL][256];
    for (int p = 0; p < nP; p++) {
        int n = 0, cor = 0, nk = 0;
        double ks = 0, pf = 0;
        for (int li = 0; li < nL; li++)
            for (int di = 0; di < nD; di++) {
                ks_eval_cell c;
                ks_eval_cell_at(ev, p, li, di, &c);
                scores[((size_t)p * nD + di) * nL + li] = c.exact_match;
                n += c.cases; cor += c.correct; nk += c.n_value; ks += c.value_kept_sum; pf += c.prefill_sum;
            }
        char pt[200];
        params_text(pols[p], pt, sizeof pt);
        snprintf(ptitle[p], sizeof ptitle[p], "%s %s  EM %.2f", pnames[p], pt, n ? (double)cor / n : 0.0);
        panels[p].title = ptitle[p];
        panels[p].score = scores + (size_t)p * nD * nL;
        printf("%-12s exact match %d/%d = %.3f | needle value tokens kept %.3f | mean prefill %.3f s\n", pnames[p], cor,
               n, n ? (double)cor / n : 0.0, nk ? ks / nk : NAN, n ? pf / n : 0.0);
    }
    char title[512], base[256];
    model_basename(a->model, base, sizeof base);
    snprintf(title, sizeof title, "%s  %s  %d case%s per cell", a->task, base, a->cases, a->cases == 1 ? "" : "s");
    ks_heatmap_print(stdout, title, nD, dp, nL, lp, panels, nP, isatty(1));
    if (a->png) {
        if (ks_heatmap_png(a->png, title, nD, dp, nL, lp, panels, nP)) {
            fprintf(stderr, "kvsieve: eval: --png: %s\n", ks_heatmap_last_error());
            return -1;
        }
        printf("heatmap: %s\n", a->png);
    }
    return 0;
}

/* ---------------------------------------------------------------- one finished run */

typedef struct run_ctx {
    const eval_args *a;
    ks_model *m;
    progress *pg;
} run_ctx;

/* ks_eval's on_run: the case line, --show, the progress line; the test hook's SIGINT. */
static int on_run(void *user, const ks_eval_record *r, long done, long total) {
    run_ctx *x = user;
    const eval_args *a = x->a;
    progress *pg = x->pg;
    pg->done = done;
    (void)total;
    if (g_interrupt_after > 0 && done == g_interrupt_after) raise(SIGINT);
    double vk = r->value_kept;
    if (!a->quiet) {
        progress_clear(pg);
        fprintf(stderr, "[eval] %-12s L=%-6d depth=%-5g #%d  %5d tok  %s  expected %-14s got %-14s value kept %s  prefill %.2fs\n",
                r->policy_name, r->length, r->depth, r->index, r->tokens, r->correct ? "ok  " : "MISS", r->answer, r->output,
                isnan(vk) ? "-" : vk == 1 ? "all" : vk == 0 ? "none" : "part", r->prefill_s);
    }
    if (a->show) {
        progress_clear(pg);
        int n = r->tokens, nk = r->kept, vin = r->value_in, vn = r->value_n;
        printf("\n== %s  (%s, %d tokens, depth %g)  answer %s  ->  %s%s  prefill %.3f s, decode %.3f s\n", r->policy_name,
               a->task, n, r->depth, r->answer, r->output, r->correct ? "  correct" : "  WRONG", r->prefill_s, r->decode_s);
        if (nk < n) {
            printf("kept %d of %d prompt tokens (needle value %s):\n", nk, n,
                   vin == vn ? "kept" : vin ? "partly kept" : "NOT kept");
            show_kept(x->m, r->prompt_ids, r->kept_positions, nk, r->value_begin, r->value_end, isatty(1));
        } else printf("kept all %d prompt tokens\n", n);
        fflush(stdout);
    }
    progress_update(pg, 0);
    return 0;
}

/* ---------------------------------------------------------------- kvsieve eval */

/* A library message with its closing hint "(field)" (a ks_eval_opts field) named as this
 * command's option, then a newline, on stderr. */
static void print_with_options(const char *msg) {
    static const char *const map[][2] = {
        {" (seed)", " (--seed)"}, {" (cases)", " (--cases)"}, {" (lengths)", " (--lengths)"}, {" (depths)", " (--depths)"},
        {" (policies, in order)", " (--policy / --compare, in order)"}, {" (policies)", " (--policy / --compare)"},
        {" (parameters)", " (--set)"},
    };
    size_t n = strlen(msg);
    for (size_t i = 0; i < sizeof map / sizeof *map; i++) {
        size_t k = strlen(map[i][0]);
        if (n >= k && !strcmp(msg + n - k, map[i][0])) {
            fprintf(stderr, "%.*s%s\n", (int)(n - k), msg, map[i][1]);
            return;
        }
    }
    fprintf(stderr, "%s\n", msg);
}

int ks_cli_eval(int argc, char **argv) {
    eval_args a;
    int pr = parse_eval(argc, argv, &a);
    if (pr > 0) return ks_cli_help("eval"), 0;
    if (pr) return 2;

    /* the policies: --compare list, --policy, or full attention */
    char *plist = strdup(a.compare ? a.compare : a.policy ? a.policy : "full");
    const char *pnames[MAX_POL];
    int n_pol = 0;
    char *save = NULL;
    for (char *t = strtok_r(plist, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        if (n_pol == MAX_POL) { fprintf(stderr, "kvsieve: eval: at most %d policies\n", MAX_POL); free(plist); return 2; }
        for (int q = 0; q < n_pol; q++)
            if (!strcmp(pnames[q], t)) { fprintf(stderr, "kvsieve: eval: policy %s is named twice\n", t); free(plist); return 2; }
        pnames[n_pol++] = t;
    }
    if (!n_pol) { fprintf(stderr, "kvsieve: eval: no policy named\n"); free(plist); return 2; }

    ks_eval_opts eo;
    ks_eval_opts_default(&eo);
    eo.task = a.task;
    eo.lengths = a.lengths;
    eo.n_lengths = a.n_len;
    eo.depths = a.depths;
    eo.n_depths = a.n_dep;
    eo.cases = a.cases;
    eo.seed = a.seed;
    eo.policy_names = pnames;
    eo.n_policies = n_pol;
    eo.model_label = a.model;
    eo.interrupt = &g_eval_interrupt;
    /* the task name before anything loads */
    if (ks_eval_opts_check(&eo)) { free(plist); return ks_cli_fail("eval"), 2; }

    int rc = 0;
    ks_model *m = NULL;
    ks_policy *pols[MAX_POL] = {0};
    ks_eval *ev = NULL;
    double *scores = NULL;
    progress pg = {0};
    run_ctx ctx = {&a, NULL, &pg};
    struct sigaction old_int;
    int have_old = 0;

    /* ---- every check before the first case: output paths, model, policies (loaded, --set
     * applied, begin run against the model), lengths and haystack (ks_eval_create), the resume
     * file */
    if (a.out && ks_cli_check_writable("eval: --out", a.out)) { rc = 2; goto out; }
    if (a.png && ks_cli_check_writable("eval: --png", a.png)) { rc = 2; goto out; }
    if (ks_cli_model_open(a.model, &(ks_model_opts){.backend = a.backend}, &m)) { rc = ks_cli_fail("cannot load model"); goto out; }
    for (int p = 0; p < n_pol; p++) {
        if (ks_cli_policy_load(m, pnames[p], &pols[p])) { ks_cli_fail("eval: policy"); rc = 2; goto out; }
        if (ks_cli_apply_sets(pols[p], pnames[p], a.sets, a.n_sets, n_pol == 1)) { rc = 2; goto out; }
        if (ks_cli_check_policy(m, pols[p], "eval")) { rc = 2; goto out; }
    }
    eo.policies = pols;
    if (a.task && (!strcmp(a.task, "niah") || !strcmp(a.task, "multikey")))
        eo.corpora = a.corpora ? a.corpora : access("../shared/corpora", R_OK) == 0 ? "../shared/corpora" : ".data/corpora";
    ctx.m = m;
    eo.on_run = on_run;
    eo.user = &ctx;
    ks_status cst = ks_eval_create(m, &eo, &ev);
    if (cst) { /* the haystack's messages start "haystack: ", and the option that gives it is named */
        ks_cli_fail(!strncmp(ks_last_error(), "haystack: ", 10) ? "eval: haystack (--corpora)" : "eval");
        rc = cst == KS_ERR_ARG || cst == KS_ERR_POLICY ? 2 : 1;
        goto out;
    }
    if (a.resume && ks_eval_resume(ev, a.resume)) {
        fprintf(stderr, "kvsieve: eval: --resume ");
        print_with_options(ks_last_error());
        rc = 2;
        goto out;
    }
    long n_rec = ks_eval_n_runs(ev);
    scores = malloc(sizeof(double) * n_pol * a.n_len * a.n_dep);
    if (!scores) { fprintf(stderr, "kvsieve: eval: out of memory\n"); rc = 1; goto out; }

    /* ---- the runs */
    pg.resumed = ks_eval_n_done(ev);
    pg.total = n_rec - pg.resumed;
    pg.on = !a.quiet;
    pg.tty = isatty(2);
    pg.t0 = pg.last_print = ks_cli_now();
    if (pg.resumed && !a.quiet)
        fprintf(stderr, "[eval] resuming: %ld of %ld runs are in %s, %ld to go\n", pg.resumed, n_rec, a.resume, pg.total);
    g_eval_interrupt = 0;
    const char *ia = getenv("KS_EVAL_INTERRUPT_AFTER");
    g_interrupt_after = ia && *ia ? strtol(ia, NULL, 10) : 0;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_sigint;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESETHAND; /* a second Ctrl-C kills, as usual */
    have_old = sigaction(SIGINT, &sa, &old_int) == 0;
    ks_status st = ks_eval_run(ev);
    if (have_old) sigaction(SIGINT, &old_int, NULL);
    progress_clear(&pg);
    int interrupted = st == KS_ERR_INTERRUPTED;
    if (st && !interrupted) { rc = ks_cli_fail("eval"); goto out; } /* an error: nothing is written */
    if (!interrupted) progress_update(&pg, 1);

    /* ---- the results: complete, or what was finished when Ctrl-C came */
    if (interrupted)
        fprintf(stderr, "kvsieve: eval: interrupted: %ld of %ld runs finished%s%s%s\n", ks_eval_n_done(ev), n_rec,
                a.out ? ", written to " : " (no --out: they are only in the table)", a.out ? a.out : "",
                a.out ? " (--resume it to continue)" : "");
    if (print_results(&a, ev, pnames, pols, n_pol, scores)) rc = 1;
    if (a.out) {
        if (ks_eval_write_json(ev, a.out)) rc = ks_cli_fail("eval");
        else printf("results: %s\n", a.out);
    }
    if (interrupted) rc = 130;

out:
    free(scores);
    ks_eval_free(ev);
    for (int p = 0; p < n_pol; p++)
        if (pols[p]) ks_policy_free(pols[p]);
    ks_model_close(m);
    free(plist);
    return rc;
}
