/* cmd_eval.c — `kvsieve eval`: a grid of long-context retrieval cases (core/tasks.h) run
 * under one or several policies, scored by exact match, written as JSON, a PNG heatmap
 * (repl/heatmap.h) and a table in the terminal.
 *
 *   kvsieve eval --model DIR --task passkey|niah|multikey|kv [--lengths 512,1K,4K]
 *                [--depths 0,0.5,1 | --depths 11] [--cases N] [--policy P | --compare a,b,c]
 *                [--set [policy.]key=value]... [--seed BASE] [--corpora DIR]
 *                [--out FILE.json] [--png FILE.png] [--backend cpu|cuda] [--quiet] [--show]
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
#include "heatmap.h"
#include "kvsieve.h"
#include "model.h"
#include "tasks.h"

#include <errno.h>
#include <math.h>
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
    const char *model, *task, *policy, *compare, *corpora, *out, *png, *backend;
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
#define NEED() do { if (!v) { fprintf(stderr, "kvsieve eval: option %s needs a value\n", o); return -1; } i++; } while (0)
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
        else if (!strcmp(o, "--backend")) { NEED(); a->backend = v; }
        else if (!strcmp(o, "-q") || !strcmp(o, "--quiet")) a->quiet = 1;
        else if (!strcmp(o, "--show")) a->show = 1;
        else { fprintf(stderr, "kvsieve eval: unknown option %s\n", o); return -1; }
#undef NEED
    }
    if (!a->model) { fprintf(stderr, "kvsieve eval: --model DIR is required\n"); return -1; }
    if (!a->task) { fprintf(stderr, "kvsieve eval: --task passkey|niah|multikey|kv is required\n"); return -1; }
    if (a->policy && a->compare) { fprintf(stderr, "kvsieve eval: give --policy P or --compare A,B,..., not both\n"); return -1; }
    return 0;
}

/* Apply --set: "NAME.key=value" to policy NAME only, "key=value" to every policy (an
 * unknown key is an error for a single --policy, skipped under --compare). */
static int apply_sets(const eval_args *a, const char *pname, ks_policy *pol, int strict) {
    for (int i = 0; i < a->n_sets; i++) {
        char key[256];
        const char *kk = a->sets[i], *eq = strchr(kk, '='), *dot = strchr(kk, '.');
        if (!eq || eq == kk || (size_t)(eq - kk) >= sizeof key) {
            fprintf(stderr, "kvsieve eval: --set expects [policy.]key=value, got \"%s\"\n", kk);
            return -1;
        }
        int scoped = dot && dot < eq;
        if (scoped) {
            if ((size_t)(dot - kk) != strlen(pname) || strncmp(kk, pname, dot - kk)) continue;
            kk = dot + 1;
        }
        memcpy(key, kk, eq - kk);
        key[eq - kk] = 0;
        if (ks_policy_set(pol, key, eq + 1)) {
            if (scoped || strict) { ks_cli_fail("--set"); return -1; }
        }
    }
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

int ks_cli_eval(int argc, char **argv) {
    eval_args a;
    if (parse_eval(argc, argv, &a)) return 2;
    ks_task_kind kind;
    if (ks_task_parse(a.task, &kind)) return ks_cli_fail("eval");

    /* the policies: --compare list, --policy, or full attention */
    char *plist = strdup(a.compare ? a.compare : a.policy ? a.policy : "full");
    const char *pnames[MAX_POL];
    int n_pol = 0;
    char *save = NULL;
    for (char *t = strtok_r(plist, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        if (n_pol == MAX_POL) { fprintf(stderr, "kvsieve eval: at most %d policies\n", MAX_POL); free(plist); return 2; }
        pnames[n_pol++] = t;
    }
    if (!n_pol) { fprintf(stderr, "kvsieve eval: no policy named\n"); free(plist); return 2; }

    int rc = 0;
    ks_model *m = NULL;
    ks_haystack *hs = NULL;
    ks_policy *pols[MAX_POL] = {0};
    ks_session *s = NULL;
    FILE *jf = NULL;
    char *tmp_json = NULL;
    cell_acc *acc = NULL;
    double *scores = NULL;
    int nL = a.n_len, nD = a.n_dep;

    if (ks_model_open(a.model, a.backend, &m)) { rc = ks_cli_fail("cannot load model"); goto out; }
    if (!m->tok) { fprintf(stderr, "kvsieve eval: %s has no tokenizer.json\n", a.model); rc = 1; goto out; }
    for (int i = 0; i < nL; i++)
        if (a.lengths[i] + 64 > ks_model_max_context(m)) {
            fprintf(stderr, "kvsieve eval: length %d (+ the answer) exceeds the model's context of %d tokens\n",
                    a.lengths[i], ks_model_max_context(m));
            rc = 2;
            goto out;
        }
    if (kind == KS_TASK_NIAH || kind == KS_TASK_MULTIKEY) {
        const char *dir = a.corpora;
        if (!dir) dir = access("../shared/corpora", R_OK) == 0 ? "../shared/corpora" : ".data/corpora";
        if (ks_haystack_load(dir, &hs)) { rc = ks_cli_fail("haystack"); goto out; }
    }
    for (int p = 0; p < n_pol; p++) {
        if (ks_policy_load(m, pnames[p], &pols[p])) { rc = ks_cli_fail("policy"); goto out; }
        if (apply_sets(&a, pnames[p], pols[p], n_pol == 1)) { rc = 2; goto out; }
    }
    if (ks_session_create(m, &s)) { rc = ks_cli_fail("session"); goto out; }

    if (a.out) {
        /* written to FILE.tmp and renamed at the end: a failed run leaves no half file */
        size_t ln = strlen(a.out) + 5;
        tmp_json = malloc(ln);
        snprintf(tmp_json, ln, "%s.tmp", a.out);
        if (!(jf = fopen(tmp_json, "w"))) {
            fprintf(stderr, "kvsieve eval: cannot write %s: %s\n", tmp_json, strerror(errno));
            rc = 1;
            goto out;
        }
        fprintf(jf, "{\n  \"model\": ");
        json_str(jf, a.model);
        fprintf(jf, ",\n  \"task\": \"%s\",\n  \"backend\": \"%s\",\n  \"seed_base\": \"0x%016llx\",\n  \"cases_per_cell\": %d,\n  \"lengths\": [",
                ks_task_name(kind), m->be->name, (unsigned long long)a.seed, a.cases);
        for (int i = 0; i < nL; i++) fprintf(jf, "%s%d", i ? ", " : "", a.lengths[i]);
        fprintf(jf, "],\n  \"depths\": [");
        for (int i = 0; i < nD; i++) fprintf(jf, "%s%g", i ? ", " : "", a.depths[i]);
        fprintf(jf, "],\n  \"cases\": [\n");
    }

    acc = calloc((size_t)n_pol * nL * nD, sizeof *acc);
    scores = malloc(sizeof(double) * n_pol * nL * nD);
    if (!acc || !scores) { fprintf(stderr, "kvsieve eval: out of memory\n"); rc = 1; goto out; }

    int first_case = 1;
    for (int li = 0; li < nL && !rc; li++)
        for (int di = 0; di < nD && !rc; di++)
            for (int ci = 0; ci < a.cases && !rc; ci++) {
                int L = a.lengths[li];
                double d = a.depths[di];
                uint64_t seed = ks_task_case_seed(a.seed, kind, L, d, ci);
                ks_task_case tc;
                if (ks_task_make(kind, hs, m->tok, L, d, seed, &tc)) { rc = ks_cli_fail("task"); break; }
                int32_t *ids = NULL, *ans = NULL;
                int n = 0, na = 0;
                if (ks_tokenize(m, tc.prompt, 1, &ids, &n) || ks_tokenize(m, tc.answer, 0, &ans, &na)) {
                    rc = ks_cli_fail("tokenize");
                } else if (n != tc.n_tokens || na < 1) {
                    fprintf(stderr, "kvsieve eval: internal: case has %d tokens, the generator counted %d\n", n, tc.n_tokens);
                    rc = 1;
                }
                for (int p = 0; p < n_pol && !rc; p++) {
                    ks_session_set_policy(s, pols[p]);
                    ks_generate_opts o;
                    ks_generate_opts_default(&o);
                    o.max_new_tokens = na;
                    if (ks_generate_ids(s, ids, n, &o, NULL, NULL)) {
                        char what[160];
                        snprintf(what, sizeof what, "%s, length %d, depth %g, case %d", pnames[p], L, d, ci);
                        rc = ks_cli_fail(what);
                        break;
                    }
                    int ng;
                    const int32_t *gen = ks_result_ids(s, &ng);
                    int ok = ng >= na && !memcmp(gen, ans, sizeof(int32_t) * na);
                    int nk = 0;
                    int32_t *kept = kept_positions(s, m, n, &nk);
                    int vin = 0, vn = tc.value_tok_end - tc.value_tok_begin;
                    for (int t = tc.value_tok_begin; kept && t < tc.value_tok_end; t++) vin += contains(kept, nk, t);
                    double vk = vn > 0 && kept ? (double)vin / vn : NAN;
                    cell_acc *c = &acc[((size_t)p * nL + li) * nD + di];
                    c->n++;
                    c->correct += ok;
                    if (!isnan(vk)) { c->kept_sum += vk; c->n_kept++; }
                    c->prefill_sum += ks_result_prefill_seconds(s);
                    c->tokens_sum += n;
                    c->kv_sum += nk;
                    if (jf) {
                        fprintf(jf, "%s    {\"policy\": ", first_case ? "" : ",\n");
                        first_case = 0;
                        json_str(jf, pnames[p]);
                        fprintf(jf, ", \"length\": %d, \"depth\": %g, \"index\": %d, \"seed\": \"0x%016llx\", \"tokens\": %d, ",
                                L, d, ci, (unsigned long long)seed, n);
                        fputs("\"answer\": ", jf);
                        json_str(jf, tc.answer);
                        fputs(", \"output\": ", jf);
                        json_str(jf, ks_result_text(s));
                        fprintf(jf, ", \"correct\": %s, \"kept\": %d, \"value_kept\": ", ok ? "true" : "false", nk);
                        json_num(jf, vk);
                        fprintf(jf, ", \"needle_tokens\": [%d, %d], \"value_tokens\": [%d, %d], \"prefill_s\": %.4f}",
                                tc.needle_tok_begin, tc.needle_tok_end, tc.value_tok_begin, tc.value_tok_end,
                                ks_result_prefill_seconds(s));
                    }
                    if (!a.quiet)
                        fprintf(stderr, "[eval] %-12s L=%-6d depth=%-5g #%d  %5d tok  %s  expected %-14s got %-14s value kept %s  prefill %.2fs\n",
                                pnames[p], L, d, ci, n, ok ? "ok  " : "MISS", tc.answer, ks_result_text(s),
                                isnan(vk) ? "-" : vk == 1 ? "all" : vk == 0 ? "none" : "part", ks_result_prefill_seconds(s));
                    if (a.show) {
                        printf("\n== %s  (%s, %d tokens, depth %g)  answer %s  ->  %s%s%s  prefill %.3f s, decode %.3f s\n",
                               pnames[p], ks_task_name(kind), n, d, tc.answer, ks_result_text(s), ok ? "  correct" : "  WRONG",
                               "", ks_result_prefill_seconds(s), ks_result_decode_seconds(s));
                        if (kept && nk < n) {
                            printf("kept %d of %d prompt tokens (needle value %s):\n", nk, n,
                                   vin == vn ? "kept" : vin ? "partly kept" : "NOT kept");
                            show_kept(m, ids, kept, nk, tc.value_tok_begin, tc.value_tok_end, isatty(1));
                        } else printf("kept all %d prompt tokens\n", n);
                    }
                    free(kept);
                }
                free(ids);
                free(ans);
                ks_task_case_free(&tc);
            }
    if (rc) goto out;

    /* the grids: rows = depths, columns = lengths */
    char llab[MAX_AXIS][16], dlab[MAX_AXIS][16];
    const char *lp[MAX_AXIS], *dp[MAX_AXIS];
    for (int i = 0; i < nL; i++) { length_label(a.lengths[i], llab[i], sizeof llab[i]); lp[i] = llab[i]; }
    for (int i = 0; i < nD; i++) { snprintf(dlab[i], sizeof dlab[i], "%g%%", a.depths[i] * 100); dp[i] = dlab[i]; }
    ks_heat_panel panels[MAX_POL];
    char ptitle[MAX_POL][256];
    for (int p = 0; p < n_pol; p++) {
        int n = 0, cor = 0, nk = 0;
        double ks = 0, pf = 0;
        for (int li = 0; li < nL; li++)
            for (int di = 0; di < nD; di++) {
                cell_acc *c = &acc[((size_t)p * nL + li) * nD + di];
                scores[((size_t)p * nD + di) * nL + li] = c->n ? (double)c->correct / c->n : NAN;
                n += c->n; cor += c->correct; nk += c->n_kept; ks += c->kept_sum; pf += c->prefill_sum;
            }
        char pt[200];
        params_text(pols[p], pt, sizeof pt);
        snprintf(ptitle[p], sizeof ptitle[p], "%s %s  EM %.2f", pnames[p], pt, n ? (double)cor / n : 0.0);
        panels[p].title = ptitle[p];
        panels[p].score = scores + (size_t)p * nD * nL;
        printf("%-12s exact match %d/%d = %.3f | needle value tokens kept %.3f | mean prefill %.3f s\n", pnames[p], cor, n,
               n ? (double)cor / n : 0.0, nk ? ks / nk : NAN, n ? pf / n : 0.0);
    }
    char title[512];
    const char *mname = strrchr(a.model, '/');
    mname = mname && mname[1] ? mname + 1 : a.model;
    snprintf(title, sizeof title, "%s  %s  %d case%s per cell", ks_task_name(kind), mname, a.cases, a.cases == 1 ? "" : "s");
    ks_heatmap_print(stdout, title, nD, dp, nL, lp, panels, n_pol, isatty(1));
    if (a.png) {
        if (ks_heatmap_png(a.png, title, nD, dp, nL, lp, panels, n_pol)) { rc = ks_cli_fail("png"); goto out; }
        printf("heatmap: %s\n", a.png);
    }
    if (jf) {
        fprintf(jf, "\n  ],\n  \"policies\": [\n");
        for (int p = 0; p < n_pol; p++) {
            fprintf(jf, "    {\"name\": ");
            json_str(jf, pnames[p]);
            fputs(", \"params\": ", jf);
            json_params(jf, pols[p]);
            fputs(", \"cells\": [", jf);
            for (int li = 0; li < nL; li++)
                for (int di = 0; di < nD; di++) {
                    cell_acc *c = &acc[((size_t)p * nL + li) * nD + di];
                    fprintf(jf, "%s\n      {\"length\": %d, \"depth\": %g, \"cases\": %d, \"exact_match\": ", li || di ? "," : "",
                            a.lengths[li], a.depths[di], c->n);
                    json_num(jf, c->n ? (double)c->correct / c->n : NAN);
                    fputs(", \"value_kept\": ", jf);
                    json_num(jf, c->n_kept ? c->kept_sum / c->n_kept : NAN);
                    fprintf(jf, ", \"mean_tokens\": %.1f, \"mean_kept\": %.1f, \"mean_prefill_s\": %.4f}", c->n ? (double)c->tokens_sum / c->n : 0.0,
                            c->n ? (double)c->kv_sum / c->n : 0.0, c->n ? c->prefill_sum / c->n : 0.0);
                }
            fprintf(jf, "]}%s\n", p + 1 < n_pol ? "," : "");
        }
        fprintf(jf, "  ]\n}\n");
        int bad = ferror(jf);
        bad |= fclose(jf);
        jf = NULL;
        if (bad || rename(tmp_json, a.out)) {
            fprintf(stderr, "kvsieve eval: cannot write %s\n", a.out);
            rc = 1;
            goto out;
        }
        printf("results: %s\n", a.out);
    }

out:
    if (jf) { fclose(jf); remove(tmp_json); }
    free(tmp_json);
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
