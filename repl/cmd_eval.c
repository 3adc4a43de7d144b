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
 * A case is (task, length L, depth d, index i): its seed is ks_task_case_seed(BASE, task, L,
 * d, i) and its prompt the longest one of at most L tokens (BOS included). Scoring: the
 * next len(tokens(answer)) greedy tokens must equal tokens(answer) (teacher-free exact
 * match, as tools/train/tasks.py defines it). Per case the harness also records which of
 * the needle's value tokens the policy kept: the restart set (GemFilter, two-pass ASL) or
 * else the union over KV heads of the last layer's resident prompt rows. --show prints, per
 * case and policy, the kept prompt text with the needle's value marked: the GemFilter paper's
 * Figure 1, live. */
#include "cli.h"
#include "common.h"
#include "engine.h"
#include "env_opts.h"
#include "heatmap.h"
#include "kvsieve.h"
#include "model.h"
#include "tasks.h"

#include "json.h"

#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The training run's held-out seed base: derive_seed(1234, 0xE7A1) (tools/train/README.md).
 * Training rows come from other streams, so these cases were never trained on. */
#define EVAL_BASE_SEED 0xf2cb78610a862fceull

#define MAX_AXIS 64
#define MAX_POL 16

typedef struct eval_args {
    const char *model, *task, *policy, *compare, *corpora, *out, *png, *backend, *resume;
    int lengths[MAX_AXIS], n_len;
    double depths[MAX_AXIS];
    int n_dep, cases, quiet, show;
    uint64_t seed;
    const char *sets[64];
    int n_sets;
} eval_args;

typedef struct cell_acc {
    int n, correct, n_kept;
    double kept_sum, prefill_sum;
    long long tokens_sum, kv_sum;
} cell_acc;

/* One finished (case, policy) run: what the JSON records of it. Runs are numbered in the order
 * the grid runs them: ((length * n_depths + depth) * cases + index) * n_policies + policy. A
 * resumed record comes from the --resume file; every number of it is recomputed the same way
 * (value_kept = vin / vn from the counts, not from the file's rounded text). */
typedef struct case_rec {
    int done, resumed;
    uint64_t seed;
    int tokens, correct, kept, vin, vn, has_vk;
    int needle[2], value[2];
    double prefill_s, decode_s;
    char *answer, *output;
} case_rec;

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
        snprintf(tok, sizeof tok, "%.*s", (int)KS_MIN(len, sizeof tok - 1), p);
        if (len >= sizeof tok || ks_arg_double(opt, tok, 0, 1, 0, &out[*n])) return -1;
        (*n)++;
        if (!p[len]) return 0;
        p += len + 1;
    }
}

static int parse_eval(int argc, char **argv, eval_args *a) {
    memset(a, 0, sizeof *a);
    a->cases = 1;
    a->seed = EVAL_BASE_SEED;
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

static void json_str(FILE *f, const char *s) {
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\') fprintf(f, "\\%c", *p);
        else if (*p == '\n') fputs("\\n", f);
        else if (*p == '\t') fputs("\\t", f);
        else if (*p < 0x20) fprintf(f, "\\u%04x", *p);
        else fputc(*p, f);
    }
    fputc('"', f);
}

static void json_num(FILE *f, double v) {
    if (isnan(v)) fputs("null", f);
    else fprintf(f, "%.6g", v);
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

static void json_params(FILE *f, ks_policy *pol) {
    fputc('{', f);
    for (int i = 0; pol && i < ks_policy_n_params(pol); i++) {
        char v[256];
        const char *k = ks_policy_param_name(pol, i);
        if (ks_policy_get(pol, k, v, sizeof v)) continue;
        fprintf(f, "%s", i ? ", " : "");
        json_str(f, k);
        fputs(": ", f);
        json_str(f, v);
    }
    fputc('}', f);
}

static int cmp_i32(const void *x, const void *y) {
    int32_t a = *(const int32_t *)x, b = *(const int32_t *)y;
    return (a > b) - (a < b);
}

/* The prompt positions the policy kept: the restart set, else the last layer's resident rows
 * (union over KV heads) below n_prompt. Returns a sorted malloc'd list; *n its length. */
static int32_t *kept_positions(ks_session *s, ks_model *m, int n_prompt, int *n) {
    const int32_t *r;
    int k = ks_result_restart(s, &r);
    *n = 0;
    if (k > 0) {
        int32_t *out = malloc(sizeof(int32_t) * k);
        if (!out) return NULL;
        memcpy(out, r, sizeof(int32_t) * k);
        qsort(out, k, sizeof(int32_t), cmp_i32);
        *n = k;
        return out;
    }
    char *seen = calloc(n_prompt, 1);
    if (!seen) return NULL;
    int last = ks_model_n_layers(m) - 1;
    for (int h = 0; h < ks_model_n_kv_heads(m); h++) {
        const int32_t *pos;
        int rows = ks_result_kept(s, last, h, &pos);
        for (int i = 0; i < rows; i++)
            if (pos[i] >= 0 && pos[i] < n_prompt) seen[pos[i]] = 1;
    }
    int32_t *out = malloc(sizeof(int32_t) * (n_prompt ? n_prompt : 1));
    if (out)
        for (int i = 0; i < n_prompt; i++)
            if (seen[i]) out[(*n)++] = i;
    free(seen);
    return out;
}

static int contains(const int32_t *sorted, int n, int32_t v) {
    int lo = 0, hi = n;
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (sorted[mid] < v) lo = mid + 1;
        else hi = mid;
    }
    return lo < n && sorted[lo] == v;
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
        int cut[4] = {a0, KS_MAX(a0, KS_MIN(vb, a1)), KS_MAX(a0, KS_MIN(ve, a1)), a1};
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
    double now = ks_now(), el = now - pg->t0;
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

/* ---------------------------------------------------------------- output paths, checked first */

/* Can PATH be written? An existing file must be writable; a new one is created and removed
 * again (its folder must exist and be writable). Prints "kvsieve: eval: OPT PATH: why". */
static int check_writable(const char *opt, const char *path) {
    if (access(path, F_OK) == 0) {
        if (access(path, W_OK) == 0) return 0;
        fprintf(stderr, "kvsieve: eval: %s %s: cannot write: %s\n", opt, path, strerror(errno));
        return -1;
    }
    FILE *f = fopen(path, "wb");
    if (!f) {
        fprintf(stderr, "kvsieve: eval: %s %s: cannot write: %s\n", opt, path, strerror(errno));
        return -1;
    }
    fclose(f);
    remove(path);
    return 0;
}

/* ---------------------------------------------------------------- the grid and its records */

typedef struct eval_grid {
    const eval_args *a;
    ks_task_kind kind;
    const char *backend;
    int nL, nD, nC, nP;
    const char **pnames;
    ks_policy **pols;
    case_rec *rec; /* nL * nD * nC * nP */
} eval_grid;

static size_t rec_index(const eval_grid *g, int li, int di, int ci, int p) {
    return (((size_t)li * g->nD + di) * g->nC + ci) * g->nP + p;
}

static const char *model_basename(const char *path) {
    const char *e = path + strlen(path);
    while (e > path && e[-1] == '/') e--; /* "models/x/" */
    const char *b = e;
    while (b > path && b[-1] != '/') b--;
    static char buf[256];
    snprintf(buf, sizeof buf, "%.*s", (int)KS_MIN((size_t)(e - b), sizeof buf - 1), b);
    return buf;
}

/* The cells from the finished records. */
static void accumulate(const eval_grid *g, cell_acc *acc) {
    memset(acc, 0, sizeof *acc * (size_t)g->nP * g->nL * g->nD);
    for (int li = 0; li < g->nL; li++)
        for (int di = 0; di < g->nD; di++)
            for (int ci = 0; ci < g->nC; ci++)
                for (int p = 0; p < g->nP; p++) {
                    const case_rec *r = &g->rec[rec_index(g, li, di, ci, p)];
                    if (!r->done) continue;
                    cell_acc *c = &acc[((size_t)p * g->nL + li) * g->nD + di];
                    c->n++;
                    c->correct += r->correct;
                    if (r->has_vk) { c->kept_sum += (double)r->vin / r->vn; c->n_kept++; }
                    c->prefill_sum += r->prefill_s;
                    c->tokens_sum += r->tokens;
                    c->kv_sum += r->kept;
                }
}

/* Write the JSON (FILE.tmp, renamed to FILE): the grid, every finished run in grid order, and
 * the cells. "complete" is false after an interrupt (then --resume FILE continues). */
static int write_json(const eval_grid *g, const cell_acc *acc, int complete) {
    const eval_args *a = g->a;
    size_t ln = strlen(a->out) + 5;
    char *tmp = malloc(ln);
    if (!tmp) { fprintf(stderr, "kvsieve: eval: out of memory\n"); return -1; }
    snprintf(tmp, ln, "%s.tmp", a->out);
    FILE *jf = fopen(tmp, "w");
    if (!jf) {
        fprintf(stderr, "kvsieve: eval: cannot write %s: %s\n", tmp, strerror(errno));
        free(tmp);
        return -1;
    }
    fprintf(jf, "{\n  \"model\": ");
    json_str(jf, a->model);
    fprintf(jf, ",\n  \"task\": \"%s\",\n  \"backend\": \"%s\",\n  \"seed_base\": \"0x%016llx\",\n  \"cases_per_cell\": %d,\n  \"complete\": %s,\n  \"lengths\": [",
            ks_task_name(g->kind), g->backend, (unsigned long long)a->seed, g->nC, complete ? "true" : "false");
    for (int i = 0; i < g->nL; i++) fprintf(jf, "%s%d", i ? ", " : "", a->lengths[i]);
    fprintf(jf, "],\n  \"depths\": [");
    for (int i = 0; i < g->nD; i++) fprintf(jf, "%s%g", i ? ", " : "", a->depths[i]);
    fprintf(jf, "],\n  \"cases\": [\n");
    int first = 1;
    for (int li = 0; li < g->nL; li++)
        for (int di = 0; di < g->nD; di++)
            for (int ci = 0; ci < g->nC; ci++)
                for (int p = 0; p < g->nP; p++) {
                    const case_rec *r = &g->rec[rec_index(g, li, di, ci, p)];
                    if (!r->done) continue;
                    fprintf(jf, "%s    {\"policy\": ", first ? "" : ",\n");
                    first = 0;
                    json_str(jf, g->pnames[p]);
                    fprintf(jf, ", \"length\": %d, \"depth\": %g, \"index\": %d, \"seed\": \"0x%016llx\", \"tokens\": %d, ",
                            a->lengths[li], a->depths[di], ci, (unsigned long long)r->seed, r->tokens);
                    fputs("\"answer\": ", jf);
                    json_str(jf, r->answer);
                    fputs(", \"output\": ", jf);
                    json_str(jf, r->output);
                    fprintf(jf, ", \"correct\": %s, \"kept\": %d, \"value_kept\": ", r->correct ? "true" : "false", r->kept);
                    json_num(jf, r->has_vk ? (double)r->vin / r->vn : NAN);
                    fprintf(jf, ", \"needle_tokens\": [%d, %d], \"value_tokens\": [%d, %d], \"prefill_s\": %.4f}", r->needle[0],
                            r->needle[1], r->value[0], r->value[1], r->prefill_s);
                }
    fprintf(jf, "%s  ],\n  \"policies\": [\n", first ? "" : "\n");
    for (int p = 0; p < g->nP; p++) {
        fprintf(jf, "    {\"name\": ");
        json_str(jf, g->pnames[p]);
        fputs(", \"params\": ", jf);
        json_params(jf, g->pols[p]);
        fputs(", \"cells\": [", jf);
        for (int li = 0; li < g->nL; li++)
            for (int di = 0; di < g->nD; di++) {
                const cell_acc *c = &acc[((size_t)p * g->nL + li) * g->nD + di];
                fprintf(jf, "%s\n      {\"length\": %d, \"depth\": %g, \"cases\": %d, \"exact_match\": ", li || di ? "," : "",
                        a->lengths[li], a->depths[di], c->n);
                json_num(jf, c->n ? (double)c->correct / c->n : NAN);
                fputs(", \"value_kept\": ", jf);
                json_num(jf, c->n_kept ? c->kept_sum / c->n_kept : NAN);
                fprintf(jf, ", \"mean_tokens\": %.1f, \"mean_kept\": %.1f, \"mean_prefill_s\": %.4f}",
                        c->n ? (double)c->tokens_sum / c->n : 0.0, c->n ? (double)c->kv_sum / c->n : 0.0,
                        c->n ? c->prefill_sum / c->n : 0.0);
            }
        fprintf(jf, "]}%s\n", p + 1 < g->nP ? "," : "");
    }
    fprintf(jf, "  ]\n}\n");
    int bad = ferror(jf);
    bad |= fclose(jf);
    if (bad || rename(tmp, a->out)) {
        fprintf(stderr, "kvsieve: eval: cannot write %s: %s\n", a->out, strerror(errno));
        remove(tmp);
        free(tmp);
        return -1;
    }
    free(tmp);
    return 0;
}

/* The table and the heatmap (terminal, and --png) of the finished runs; unfinished cells are
 * blank. */
static int print_results(const eval_grid *g, cell_acc *acc, double *scores) {
    const eval_args *a = g->a;
    int nL = g->nL, nD = g->nD;
    char llab[MAX_AXIS][16], dlab[MAX_AXIS][16];
    const char *lp[MAX_AXIS], *dp[MAX_AXIS];
    for (int i = 0; i < nL; i++) { length_label(a->lengths[i], llab[i], sizeof llab[i]); lp[i] = llab[i]; }
    for (int i = 0; i < nD; i++) { snprintf(dlab[i], sizeof dlab[i], "%g%%", a->depths[i] * 100); dp[i] = dlab[i]; }
    ks_heat_panel panels[MAX_POL];
    char ptitle[MAX_POL][256];
    for (int p = 0; p < g->nP; p++) {
        int n = 0, cor = 0, nk = 0;
        double ks = 0, pf = 0;
        for (int li = 0; li < nL; li++)
            for (int di = 0; di < nD; di++) {
                cell_acc *c = &acc[((size_t)p * nL + li) * nD + di];
                scores[((size_t)p * nD + di) * nL + li] = c->n ? (double)c->correct / c->n : NAN;
                n += c->n; cor += c->correct; nk += c->n_kept; ks += c->kept_sum; pf += c->prefill_sum;
            }
        char pt[200];
        params_text(g->pols[p], pt, sizeof pt);
        snprintf(ptitle[p], sizeof ptitle[p], "%s %s  EM %.2f", g->pnames[p], pt, n ? (double)cor / n : 0.0);
        panels[p].title = ptitle[p];
        panels[p].score = scores + (size_t)p * nD * nL;
        printf("%-12s exact match %d/%d = %.3f | needle value tokens kept %.3f | mean prefill %.3f s\n", g->pnames[p], cor,
               n, n ? (double)cor / n : 0.0, nk ? ks / nk : NAN, n ? pf / n : 0.0);
    }
    char title[512];
    snprintf(title, sizeof title, "%s  %s  %d case%s per cell", ks_task_name(g->kind), model_basename(a->model), g->nC,
             g->nC == 1 ? "" : "s");
    ks_heatmap_print(stdout, title, nD, dp, nL, lp, panels, g->nP, isatty(1));
    if (a->png) {
        if (ks_heatmap_png(a->png, title, nD, dp, nL, lp, panels, g->nP)) return ks_cli_fail("eval: --png"), -1;
        printf("heatmap: %s\n", a->png);
    }
    return 0;
}

/* ---------------------------------------------------------------- --resume */

static int resume_err(const char *file, const char *fmt, const char *what) {
    fprintf(stderr, "kvsieve: eval: --resume %s: ", file);
    fprintf(stderr, fmt, what);
    fputc('\n', stderr);
    return -1;
}

/* Read an earlier --out of this grid and mark its runs done. Everything that decides a run
 * (task, seed base, lengths, depths, cases per cell, the policies and each one's parameters,
 * the model's folder name) must match; the first difference is named. */
static int load_resume(eval_grid *g, ks_model *m) {
    const eval_args *a = g->a;
    const char *file = a->resume;
    FILE *f = fopen(file, "rb");
    if (!f) { fprintf(stderr, "kvsieve: eval: --resume %s: %s\n", file, strerror(errno)); return -1; }
    size_t cap = 1 << 16, n = 0;
    char *text = malloc(cap);
    for (size_t got; text; n += got) {
        if (cap - n < 1) {
            char *w = realloc(text, cap *= 2);
            if (!w) { free(text); text = NULL; break; }
            text = w;
        }
        if (!(got = fread(text + n, 1, cap - n, f))) break;
    }
    fclose(f);
    if (!text) { fprintf(stderr, "kvsieve: eval: --resume %s: out of memory\n", file); return -1; }
    ks_json *j = ks_json_parse(text, n);
    free(text);
    if (!j) { fprintf(stderr, "kvsieve: eval: --resume %s: not an eval JSON: %s\n", file, ks_last_error()); return -1; }
    int rc = -1;
    char buf[64];
    const ks_json *L = ks_json_get(j, "lengths"), *D = ks_json_get(j, "depths"), *C = ks_json_get(j, "cases"),
                  *P = ks_json_get(j, "policies");
    snprintf(buf, sizeof buf, "0x%016llx", (unsigned long long)a->seed);
    if (!L || L->type != KS_JSON_ARRAY || !D || D->type != KS_JSON_ARRAY || !C || C->type != KS_JSON_ARRAY || !P ||
        P->type != KS_JSON_ARRAY) {
        resume_err(file, "%s", "not an eval JSON (no lengths, depths, cases or policies)");
        goto out;
    }
    if (strcmp(ks_json_str(j, "task", ""), ks_task_name(g->kind))) {
        resume_err(file, "task %s differs from this run's", ks_json_str(j, "task", "?"));
        goto out;
    }
    if (strcmp(ks_json_str(j, "model", ""), a->model) &&
        strcmp(model_basename(ks_json_str(j, "model", "")), model_basename(a->model))) {
        resume_err(file, "model %s differs from this run's", ks_json_str(j, "model", "?"));
        goto out;
    }
    if (strcmp(ks_json_str(j, "seed_base", ""), buf)) {
        resume_err(file, "seed base %s differs from this run's (--seed)", ks_json_str(j, "seed_base", "?"));
        goto out;
    }
    if (ks_json_int(j, "cases_per_cell", -1) != g->nC) {
        resume_err(file, "%s", "cases per cell differ from this run's (--cases)");
        goto out;
    }
    int same = L->len == (size_t)g->nL;
    for (int i = 0; same && i < g->nL; i++) same = L->items[i].type == KS_JSON_NUMBER && L->items[i].num == a->lengths[i];
    if (!same) { resume_err(file, "%s", "lengths differ from this run's (--lengths)"); goto out; }
    same = D->len == (size_t)g->nD;
    for (int i = 0; same && i < g->nD; i++) {
        char x[32], y[32]; /* as written: %g */
        snprintf(x, sizeof x, "%g", a->depths[i]);
        snprintf(y, sizeof y, "%g", D->items[i].num);
        same = D->items[i].type == KS_JSON_NUMBER && !strcmp(x, y);
    }
    if (!same) { resume_err(file, "%s", "depths differ from this run's (--depths)"); goto out; }
    if (P->len != (size_t)g->nP) { resume_err(file, "%s", "policies differ from this run's (--policy / --compare)"); goto out; }
    for (int p = 0; p < g->nP; p++) {
        const ks_json *pp = &P->items[p], *params = ks_json_get(pp, "params");
        if (strcmp(ks_json_str(pp, "name", ""), g->pnames[p])) {
            resume_err(file, "policy %s differs from this run's (--policy / --compare, in order)", ks_json_str(pp, "name", "?"));
            goto out;
        }
        for (int i = 0; i < ks_policy_n_params(g->pols[p]); i++) {
            char v[256];
            const char *k = ks_policy_param_name(g->pols[p], i);
            if (ks_policy_get(g->pols[p], k, v, sizeof v)) continue;
            const char *fv = ks_json_str(params, k, NULL);
            if (!fv || strcmp(fv, v)) {
                char what[400];
                snprintf(what, sizeof what, "%s.%s = %s there, %s here (--set)", g->pnames[p], k, fv ? fv : "(absent)", v);
                resume_err(file, "parameter %s", what);
                goto out;
            }
        }
    }
    /* the runs: each one's place in the grid, its seed checked */
    long nres = 0;
    for (size_t i = 0; i < C->len; i++) {
        const ks_json *c = &C->items[i];
        const char *pn = ks_json_str(c, "policy", "");
        int p = 0, li = 0, di = 0;
        while (p < g->nP && strcmp(pn, g->pnames[p])) p++;
        int len = (int)ks_json_int(c, "length", -1);
        while (li < g->nL && a->lengths[li] != len) li++;
        double dep = ks_json_num(c, "depth", -1);
        char x[32], y[32];
        snprintf(y, sizeof y, "%g", dep);
        for (; di < g->nD; di++) {
            snprintf(x, sizeof x, "%g", a->depths[di]);
            if (!strcmp(x, y)) break;
        }
        long ci = (long)ks_json_int(c, "index", -1);
        const ks_json *nt = ks_json_get(c, "needle_tokens"), *vt = ks_json_get(c, "value_tokens");
        const char *ans = ks_json_str(c, "answer", NULL), *outp = ks_json_str(c, "output", NULL);
        if (p == g->nP || li == g->nL || di == g->nD || ci < 0 || ci >= g->nC || !nt || nt->len != 2 || !vt || vt->len != 2 ||
            !ans || !outp) {
            snprintf(buf, sizeof buf, "%zu", i);
            resume_err(file, "case %s is not a run of this grid", buf);
            goto out;
        }
        uint64_t seed = ks_task_case_seed(a->seed, g->kind, len, a->depths[di], (int)ci);
        snprintf(buf, sizeof buf, "0x%016llx", (unsigned long long)seed);
        if (strcmp(ks_json_str(c, "seed", ""), buf)) {
            snprintf(buf, sizeof buf, "%zu", i);
            resume_err(file, "case %s has another seed than this grid gives it", buf);
            goto out;
        }
        case_rec *r = &g->rec[rec_index(g, li, di, (int)ci, p)];
        if (r->done) continue; /* a duplicate: the first one counts */
        r->done = r->resumed = 1;
        r->seed = seed;
        r->tokens = (int)ks_json_int(c, "tokens", 0);
        r->correct = ks_json_bool(c, "correct", 0);
        r->kept = (int)ks_json_int(c, "kept", 0);
        r->needle[0] = (int)nt->items[0].num, r->needle[1] = (int)nt->items[1].num;
        r->value[0] = (int)vt->items[0].num, r->value[1] = (int)vt->items[1].num;
        r->vn = r->value[1] - r->value[0];
        double vk = ks_json_num(c, "value_kept", NAN);
        r->has_vk = r->vn > 0 && !isnan(vk);
        r->vin = r->has_vk ? (int)lround(vk * r->vn) : 0;
        r->prefill_s = ks_json_num(c, "prefill_s", 0);
        r->answer = strdup(ans);
        r->output = strdup(outp);
        if (!r->answer || !r->output) { fprintf(stderr, "kvsieve: eval: out of memory\n"); goto out; }
        nres++;
    }
    (void)m;
    rc = 0;
out:
    ks_json_free(j);
    return rc;
}

/* ---------------------------------------------------------------- one run */

/* Run case (li, di, ci) under every policy not yet done; fills the records. 0, or a status:
 * KS_ERR_INTERRUPTED after Ctrl-C (that run is dropped), else an error already printed. */
static int run_case(eval_grid *g, ks_model *m, ks_haystack *hs, ks_session *s, int li, int di, int ci, progress *pg) {
    const eval_args *a = g->a;
    int L = a->lengths[li];
    double d = a->depths[di];
    int todo = 0;
    for (int p = 0; p < g->nP; p++) todo += !g->rec[rec_index(g, li, di, ci, p)].done;
    if (!todo) return 0;
    uint64_t seed = ks_task_case_seed(a->seed, g->kind, L, d, ci);
    ks_task_case tc;
    if (ks_task_make(g->kind, hs, m->tok, L, d, seed, &tc)) { progress_clear(pg); return ks_cli_fail("eval: task"), KS_ERR_ARG; }
    int32_t *ids = NULL, *ans = NULL;
    int n = 0, na = 0, rc = 0;
    if (ks_tokenize(m, tc.prompt, 1, &ids, &n) || ks_tokenize(m, tc.answer, 0, &ans, &na)) {
        progress_clear(pg);
        rc = KS_ERR_ARG;
        ks_cli_fail("eval: tokenize");
    } else if (n != tc.n_tokens || na < 1) {
        progress_clear(pg);
        fprintf(stderr, "kvsieve: eval: internal: case has %d tokens, the generator counted %d\n", n, tc.n_tokens);
        rc = KS_ERR_INTERNAL;
    }
    for (int p = 0; p < g->nP && !rc; p++) {
        case_rec *r = &g->rec[rec_index(g, li, di, ci, p)];
        if (r->done) continue;
        ks_session_set_policy(s, g->pols[p]);
        ks_generate_opts o;
        ks_generate_opts_default(&o);
        o.max_new_tokens = na;
        ks_status st = ks_generate_ids(s, ids, n, &o, NULL, NULL);
        if (st == KS_ERR_INTERRUPTED || g_eval_interrupt) { rc = KS_ERR_INTERRUPTED; break; }
        if (st) {
            char what[200];
            snprintf(what, sizeof what, "eval: %s, length %d, depth %g, case %d", g->pnames[p], L, d, ci);
            progress_clear(pg);
            ks_cli_fail(what);
            rc = st;
            break;
        }
        int ng;
        const int32_t *gen = ks_result_ids(s, &ng);
        int ok = ng >= na && !memcmp(gen, ans, sizeof(int32_t) * na);
        int nk = 0;
        int32_t *kept = kept_positions(s, m, n, &nk);
        int vin = 0, vn = tc.value_tok_end - tc.value_tok_begin;
        for (int t = tc.value_tok_begin; kept && t < tc.value_tok_end; t++) vin += contains(kept, nk, t);
        r->seed = seed;
        r->tokens = n;
        r->correct = ok;
        r->kept = nk;
        r->vin = vin;
        r->vn = vn;
        r->has_vk = vn > 0 && kept;
        r->needle[0] = tc.needle_tok_begin, r->needle[1] = tc.needle_tok_end;
        r->value[0] = tc.value_tok_begin, r->value[1] = tc.value_tok_end;
        r->prefill_s = ks_result_prefill_seconds(s);
        r->decode_s = ks_result_decode_seconds(s);
        r->answer = strdup(tc.answer);
        r->output = strdup(ks_result_text(s));
        if (!r->answer || !r->output) {
            free(kept);
            progress_clear(pg);
            fprintf(stderr, "kvsieve: eval: out of memory\n");
            rc = KS_ERR_OOM;
            break;
        }
        r->done = 1;
        pg->done++;
        if (g_interrupt_after > 0 && pg->done == g_interrupt_after) raise(SIGINT);
        double vk = r->has_vk ? (double)vin / vn : NAN;
        if (!a->quiet) {
            progress_clear(pg);
            fprintf(stderr, "[eval] %-12s L=%-6d depth=%-5g #%d  %5d tok  %s  expected %-14s got %-14s value kept %s  prefill %.2fs\n",
                    g->pnames[p], L, d, ci, n, ok ? "ok  " : "MISS", tc.answer, r->output,
                    isnan(vk) ? "-" : vk == 1 ? "all" : vk == 0 ? "none" : "part", r->prefill_s);
        }
        if (a->show) {
            progress_clear(pg);
            printf("\n== %s  (%s, %d tokens, depth %g)  answer %s  ->  %s%s  prefill %.3f s, decode %.3f s\n", g->pnames[p],
                   ks_task_name(g->kind), n, d, tc.answer, r->output, ok ? "  correct" : "  WRONG", r->prefill_s, r->decode_s);
            if (kept && nk < n) {
                printf("kept %d of %d prompt tokens (needle value %s):\n", nk, n,
                       vin == vn ? "kept" : vin ? "partly kept" : "NOT kept");
                show_kept(m, ids, kept, nk, tc.value_tok_begin, tc.value_tok_end, isatty(1));
            } else printf("kept all %d prompt tokens\n", n);
            fflush(stdout);
        }
        free(kept);
        progress_update(pg, 0);
    }
    free(ids);
    free(ans);
    ks_task_case_free(&tc);
    return rc;
}

/* ---------------------------------------------------------------- kvsieve eval */

int ks_cli_eval(int argc, char **argv) {
    eval_args a;
    int pr = parse_eval(argc, argv, &a);
    if (pr > 0) return ks_cli_help("eval"), 0;
    if (pr) return 2;
    ks_task_kind kind;
    if (ks_task_parse(a.task, &kind)) return ks_cli_fail("eval"), 2;

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

    int rc = 0;
    ks_model *m = NULL;
    ks_haystack *hs = NULL;
    ks_policy *pols[MAX_POL] = {0};
    ks_session *s = NULL;
    cell_acc *acc = NULL;
    double *scores = NULL;
    eval_grid g = {&a, kind, "cpu", a.n_len, a.n_dep, a.cases, n_pol, pnames, pols, NULL};
    size_t n_rec = (size_t)g.nL * g.nD * g.nC * g.nP;
    progress pg = {0};
    struct sigaction old_int;
    int have_old = 0;

    /* ---- every check before the first case: output paths, model, lengths, haystack, policies
     * (loaded, --set applied, begin run against the model), the resume file */
    if (a.out && check_writable("--out", a.out)) { rc = 2; goto out; }
    if (a.png && check_writable("--png", a.png)) { rc = 2; goto out; }
    if (ks_cli_model_open(a.model, &(ks_model_opts){.backend = a.backend}, &m)) { rc = ks_cli_fail("cannot load model"); goto out; }
    g.backend = m->be->name;
    if (!m->tok) { fprintf(stderr, "kvsieve: eval: %s has no tokenizer.json\n", a.model); rc = 1; goto out; }
    for (int i = 0; i < g.nL; i++)
        if (a.lengths[i] + 64 > ks_model_max_context(m)) {
            fprintf(stderr, "kvsieve: eval: length %d (+ the answer) exceeds the model's context of %d tokens\n",
                    a.lengths[i], ks_model_max_context(m));
            rc = 2;
            goto out;
        }
    if (kind == KS_TASK_NIAH || kind == KS_TASK_MULTIKEY) {
        const char *dir = a.corpora;
        if (!dir) dir = access("../shared/corpora", R_OK) == 0 ? "../shared/corpora" : ".data/corpora";
        if (ks_haystack_load(dir, &hs)) { rc = ks_cli_fail("eval: haystack (--corpora)"); goto out; }
    }
    for (int p = 0; p < n_pol; p++) {
        if (ks_cli_policy_load(m, pnames[p], &pols[p])) { rc = ks_cli_fail("eval: policy"); rc = 2; goto out; }
        if (ks_cli_apply_sets(pols[p], pnames[p], a.sets, a.n_sets, n_pol == 1)) { rc = 2; goto out; }
        if (ks_cli_check_policy(m, pols[p], "eval")) { rc = 2; goto out; }
    }
    if (ks_session_create(m, &s)) { rc = ks_cli_fail("eval: session"); goto out; }
    g.rec = calloc(n_rec, sizeof *g.rec);
    acc = calloc((size_t)n_pol * g.nL * g.nD, sizeof *acc);
    scores = malloc(sizeof(double) * n_pol * g.nL * g.nD);
    if (!g.rec || !acc || !scores) { fprintf(stderr, "kvsieve: eval: out of memory\n"); rc = 1; goto out; }
    if (a.resume && load_resume(&g, m)) { rc = 2; goto out; }

    /* ---- the runs */
    for (size_t i = 0; i < n_rec; i++) pg.resumed += g.rec[i].done;
    pg.total = (long)n_rec - pg.resumed;
    pg.on = !a.quiet;
    pg.tty = isatty(2);
    pg.t0 = pg.last_print = ks_now();
    if (pg.resumed && !a.quiet)
        fprintf(stderr, "[eval] resuming: %ld of %zu runs are in %s, %ld to go\n", pg.resumed, n_rec, a.resume, pg.total);
    g_eval_interrupt = 0;
    const char *ia = getenv("KS_EVAL_INTERRUPT_AFTER");
    g_interrupt_after = ia && *ia ? strtol(ia, NULL, 10) : 0;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_sigint;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESETHAND; /* a second Ctrl-C kills, as usual */
    have_old = sigaction(SIGINT, &sa, &old_int) == 0;
    s->interrupt = &g_eval_interrupt;
    int interrupted = 0;
    for (int li = 0; li < g.nL && !rc && !interrupted; li++)
        for (int di = 0; di < g.nD && !rc && !interrupted; di++)
            for (int ci = 0; ci < g.nC && !rc && !interrupted; ci++) {
                int st = g_eval_interrupt ? KS_ERR_INTERRUPTED : run_case(&g, m, hs, s, li, di, ci, &pg);
                if (st == KS_ERR_INTERRUPTED) interrupted = 1;
                else if (st) rc = 1;
            }
    s->interrupt = NULL;
    if (have_old) sigaction(SIGINT, &old_int, NULL);
    progress_clear(&pg);
    if (rc) goto out; /* an error (printed): nothing is written */
    if (!interrupted) progress_update(&pg, 1);

    /* ---- the results: complete, or what was finished when Ctrl-C came */
    accumulate(&g, acc);
    if (interrupted) {
        long fin = 0;
        for (size_t i = 0; i < n_rec; i++) fin += g.rec[i].done;
        fprintf(stderr, "kvsieve: eval: interrupted: %ld of %zu runs finished%s%s%s\n", fin, n_rec,
                a.out ? ", written to " : " (no --out: they are only in the table)", a.out ? a.out : "",
                a.out ? " (--resume it to continue)" : "");
    }
    if (print_results(&g, acc, scores)) rc = 1;
    if (a.out) {
        if (write_json(&g, acc, !interrupted)) rc = 1;
        else printf("results: %s\n", a.out);
    }
    if (interrupted) rc = 130;

out:
    if (g.rec)
        for (size_t i = 0; i < n_rec; i++) { free(g.rec[i].answer); free(g.rec[i].output); }
    free(g.rec);
    free(acc);
    free(scores);
    ks_session_free(s);
    for (int p = 0; p < n_pol; p++)
        if (pols[p]) ks_policy_free(pols[p]);
    ks_haystack_free(hs);
    ks_model_close(m);
    free(plist);
    return rc;
}
