/* eval_json.c — an eval grid as a JSON file (ks_eval_write_json) and back (ks_eval_resume):
 * the grid, every finished run in grid order, and per policy its parameters and cells. The
 * file is the one `kvsieve eval --out` has always written; --resume reads it. */
#include "eval.h"

#include "common.h"
#include "json.h"
#include "model.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

/* A policy's parameters as a JSON object of strings (none for full attention). */
static void json_params(FILE *f, const ks_policy *pol) {
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

ks_status ks_eval_write_json(const ks_eval *e, const char *path) {
    if (!e || !path || !*path) return ks_errorf(KS_ERR_ARG, "eval: NULL grid or empty path");
    size_t ln = strlen(path) + 5;
    char *tmp = ks_malloc(ln);
    if (!tmp) return KS_ERR_OOM;
    snprintf(tmp, ln, "%s.tmp", path);
    FILE *jf = fopen(tmp, "w");
    if (!jf) {
        ks_status st = ks_errorf(KS_ERR_IO, "cannot write %s: %s", tmp, strerror(errno));
        free(tmp);
        return st;
    }
    int complete = ks_eval_n_done(e) == ks_eval_n_runs(e);
    fprintf(jf, "{\n  \"model\": ");
    json_str(jf, e->model_label);
    fprintf(jf, ",\n  \"task\": \"%s\",\n  \"backend\": \"%s\",\n  \"seed_base\": \"0x%016llx\",\n  \"cases_per_cell\": %d,\n  \"complete\": %s,\n  \"lengths\": [",
            ks_task_name(e->kind), e->backend, (unsigned long long)e->seed, e->nC, complete ? "true" : "false");
    for (int i = 0; i < e->nL; i++) fprintf(jf, "%s%d", i ? ", " : "", e->lengths[i]);
    fprintf(jf, "],\n  \"depths\": [");
    for (int i = 0; i < e->nD; i++) fprintf(jf, "%s%g", i ? ", " : "", e->depths[i]);
    fprintf(jf, "],\n  \"cases\": [\n");
    int first = 1;
    long all = ks_eval_n_runs(e);
    for (long i = 0; i < all; i++) {
        if (!e->rec[i].done) continue;
        const ks_eval_record *r = &e->rec[i].r;
        fprintf(jf, "%s    {\"policy\": ", first ? "" : ",\n");
        first = 0;
        json_str(jf, r->policy_name);
        fprintf(jf, ", \"length\": %d, \"depth\": %g, \"index\": %d, \"seed\": \"0x%016llx\", \"tokens\": %d, ", r->length,
                r->depth, r->index, (unsigned long long)r->seed, r->tokens);
        fputs("\"answer\": ", jf);
        json_str(jf, r->answer);
        fputs(", \"output\": ", jf);
        json_str(jf, r->output);
        fprintf(jf, ", \"correct\": %s, \"kept\": %d, \"value_kept\": ", r->correct ? "true" : "false", r->kept);
        json_num(jf, r->value_kept);
        fprintf(jf, ", \"needle_tokens\": [%d, %d], \"value_tokens\": [%d, %d], \"prefill_s\": %.4f}", r->needle_begin,
                r->needle_end, r->value_begin, r->value_end, r->prefill_s);
    }
    fprintf(jf, "%s  ],\n  \"policies\": [\n", first ? "" : "\n");
    for (int p = 0; p < e->nP; p++) {
        fprintf(jf, "    {\"name\": ");
        json_str(jf, e->pnames[p]);
        fputs(", \"params\": ", jf);
        json_params(jf, e->pols[p]);
        fputs(", \"cells\": [", jf);
        for (int li = 0; li < e->nL; li++)
            for (int di = 0; di < e->nD; di++) {
                ks_eval_cell c;
                ks_eval_cell_at(e, p, li, di, &c);
                fprintf(jf, "%s\n      {\"length\": %d, \"depth\": %g, \"cases\": %d, \"exact_match\": ", li || di ? "," : "",
                        e->lengths[li], e->depths[di], c.cases);
                json_num(jf, c.exact_match);
                fputs(", \"value_kept\": ", jf);
                json_num(jf, c.value_kept);
                fprintf(jf, ", \"mean_tokens\": %.1f, \"mean_kept\": %.1f, \"mean_prefill_s\": %.4f}",
                        c.cases ? (double)c.tokens_sum / c.cases : 0.0, c.cases ? (double)c.kept_sum / c.cases : 0.0,
                        c.cases ? c.prefill_sum / c.cases : 0.0);
            }
        fprintf(jf, "]}%s\n", p + 1 < e->nP ? "," : "");
    }
    fprintf(jf, "  ]\n}\n");
    int bad = ferror(jf);
    bad |= fclose(jf);
    if (bad || rename(tmp, path)) {
        ks_status st = ks_errorf(KS_ERR_IO, "cannot write %s: %s", path, strerror(errno));
        remove(tmp);
        free(tmp);
        return st;
    }
    free(tmp);
    return KS_OK;
}

/* ---------------------------------------------------------------- resume */

/* The depth as the file writes it (%g): depths are compared in that form. */
static int same_depth(double a, double b) {
    char x[32], y[32];
    snprintf(x, sizeof x, "%g", a);
    snprintf(y, sizeof y, "%g", b);
    return !strcmp(x, y);
}

ks_status ks_eval_resume(ks_eval *e, const char *path) {
    if (!e || !path) return ks_errorf(KS_ERR_ARG, "eval: NULL grid or resume path");
    FILE *f = fopen(path, "rb");
    if (!f) return ks_errorf(KS_ERR_IO, "%s: %s", path, strerror(errno));
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
    if (!text) return ks_errorf(KS_ERR_OOM, "%s: out of memory", path);
    ks_json *j = ks_json_parse(text, n);
    free(text);
    if (!j) return ks_error_prefix(KS_ERR_FORMAT, "%s: not an eval JSON", path);
    ks_status st = KS_ERR_ARG;
    long all = ks_eval_n_runs(e), *slot = NULL; /* slot[i]: the case item of run i, or -1 */
    char buf[64], lab[256], flab[256];
    const ks_json *L = ks_json_get(j, "lengths"), *D = ks_json_get(j, "depths"), *C = ks_json_get(j, "cases"),
                  *P = ks_json_get(j, "policies");
#define BAD(...) do { st = ks_errorf(KS_ERR_ARG, __VA_ARGS__); goto out; } while (0)
    if (!L || L->type != KS_JSON_ARRAY || !D || D->type != KS_JSON_ARRAY || !C || C->type != KS_JSON_ARRAY || !P ||
        P->type != KS_JSON_ARRAY)
        BAD("%s: not an eval JSON (no lengths, depths, cases or policies)", path);
    if (strcmp(ks_json_str(j, "task", ""), ks_task_name(e->kind)))
        BAD("%s: task %s differs from this run's", path, ks_json_str(j, "task", "?"));
    const char *fm = ks_json_str(j, "model", "");
    ks_eval_basename(fm, flab, sizeof flab);
    ks_eval_basename(e->model_label, lab, sizeof lab);
    if (strcmp(fm, e->model_label) && strcmp(flab, lab)) BAD("%s: model %s differs from this run's", path, ks_json_str(j, "model", "?"));
    snprintf(buf, sizeof buf, "0x%016llx", (unsigned long long)e->seed);
    if (strcmp(ks_json_str(j, "seed_base", ""), buf))
        BAD("%s: seed base %s differs from this run's (seed)", path, ks_json_str(j, "seed_base", "?"));
    if (ks_json_int(j, "cases_per_cell", -1) != e->nC) BAD("%s: cases per cell differ from this run's (cases)", path);
    int same = L->len == (size_t)e->nL;
    for (int i = 0; same && i < e->nL; i++) same = L->items[i].type == KS_JSON_NUMBER && L->items[i].num == e->lengths[i];
    if (!same) BAD("%s: lengths differ from this run's (lengths)", path);
    same = D->len == (size_t)e->nD;
    for (int i = 0; same && i < e->nD; i++) same = D->items[i].type == KS_JSON_NUMBER && same_depth(e->depths[i], D->items[i].num);
    if (!same) BAD("%s: depths differ from this run's (depths)", path);
    if (P->len != (size_t)e->nP) BAD("%s: policies differ from this run's (policies)", path);
    for (int p = 0; p < e->nP; p++) {
        const ks_json *pp = &P->items[p], *params = ks_json_get(pp, "params");
        if (strcmp(ks_json_str(pp, "name", ""), e->pnames[p]))
            BAD("%s: policy %s differs from this run's (policies, in order)", path, ks_json_str(pp, "name", "?"));
        for (int i = 0; e->pols[p] && i < ks_policy_n_params(e->pols[p]); i++) {
            char v[256];
            const char *k = ks_policy_param_name(e->pols[p], i);
            if (ks_policy_get(e->pols[p], k, v, sizeof v)) continue;
            const char *fv = ks_json_str(params, k, NULL);
            if (!fv || strcmp(fv, v)) BAD("%s: parameter %s.%s = %s there, %s here (parameters)", path, e->pnames[p], k, fv ? fv : "(absent)", v);
        }
    }
    /* the runs: each one's place in the grid and its seed checked, before any is marked */
    if (!(slot = ks_malloc(sizeof *slot * (size_t)all))) { st = KS_ERR_OOM; goto out; }
    for (long i = 0; i < all; i++) slot[i] = -1;
    for (size_t i = 0; i < C->len; i++) {
        const ks_json *c = &C->items[i];
        const char *pn = ks_json_str(c, "policy", "");
        int p = 0, li = 0, di = 0;
        while (p < e->nP && strcmp(pn, e->pnames[p])) p++;
        int len = (int)ks_json_int(c, "length", -1);
        while (li < e->nL && e->lengths[li] != len) li++;
        double dep = ks_json_num(c, "depth", -1);
        while (di < e->nD && !same_depth(e->depths[di], dep)) di++;
        long ci = (long)ks_json_int(c, "index", -1);
        const ks_json *nt = ks_json_get(c, "needle_tokens"), *vt = ks_json_get(c, "value_tokens");
        if (p == e->nP || li == e->nL || di == e->nD || ci < 0 || ci >= e->nC || !nt || nt->len != 2 || !vt || vt->len != 2 ||
            !ks_json_str(c, "answer", NULL) || !ks_json_str(c, "output", NULL))
            BAD("%s: case %zu is not a run of this grid", path, i);
        uint64_t seed = ks_task_case_seed(e->seed, e->kind, len, e->depths[di], (int)ci);
        snprintf(buf, sizeof buf, "0x%016llx", (unsigned long long)seed);
        if (strcmp(ks_json_str(c, "seed", ""), buf)) BAD("%s: case %zu has another seed than this grid gives it", path, i);
        long k = ks_eval_index(e, li, di, (int)ci, p);
        if (slot[k] < 0 && !e->rec[k].done) slot[k] = (long)i; /* a duplicate: the first one counts */
    }
#undef BAD
    /* every record, then commit them all */
    for (long k = 0; k < all; k++) {
        if (slot[k] < 0) continue;
        const ks_json *c = &C->items[slot[k]], *nt = ks_json_get(c, "needle_tokens"), *vt = ks_json_get(c, "value_tokens");
        ks_eval_rec *x = &e->rec[k];
        ks_eval_record *r = &x->r;
        int ci = (int)(k / e->nP % e->nC), di = (int)(k / e->nP / e->nC % e->nD), li = (int)(k / e->nP / e->nC / e->nD);
        int p = (int)(k % e->nP);
        memset(r, 0, sizeof *r);
        r->policy = p, r->length_index = li, r->depth_index = di, r->index = ci;
        r->policy_name = e->pnames[p];
        r->length = e->lengths[li];
        r->depth = e->depths[di];
        r->seed = ks_task_case_seed(e->seed, e->kind, r->length, r->depth, ci);
        r->tokens = (int)ks_json_int(c, "tokens", 0);
        r->correct = ks_json_bool(c, "correct", 0);
        r->kept = (int)ks_json_int(c, "kept", 0);
        r->needle_begin = (int)nt->items[0].num, r->needle_end = (int)nt->items[1].num;
        r->value_begin = (int)vt->items[0].num, r->value_end = (int)vt->items[1].num;
        /* value_kept from the counts, not from the file's rounded text */
        r->value_n = r->value_end - r->value_begin;
        double vk = ks_json_num(c, "value_kept", NAN);
        int has = r->value_n > 0 && !isnan(vk);
        r->value_in = has ? (int)lround(vk * r->value_n) : 0;
        r->value_kept = has ? (double)r->value_in / r->value_n : NAN;
        r->prefill_s = ks_json_num(c, "prefill_s", 0);
        r->resumed = 1;
        x->answer = ks_strdup(ks_json_str(c, "answer", ""));
        x->output = ks_strdup(ks_json_str(c, "output", ""));
        if (!x->answer || !x->output) {
            free(x->answer);
            free(x->output);
            x->answer = x->output = NULL;
            /* undo the ones already taken: on error no run is marked */
            for (long q = 0; q < k; q++)
                if (slot[q] >= 0) {
                    free(e->rec[q].answer);
                    free(e->rec[q].output);
                    memset(&e->rec[q], 0, sizeof e->rec[q]);
                }
            st = KS_ERR_OOM;
            goto out;
        }
        r->answer = x->answer;
        r->output = x->output;
    }
    for (long k = 0; k < all; k++)
        if (slot[k] >= 0) e->rec[k].done = 1;
    st = KS_OK;
out:
    free(slot);
    ks_json_free(j);
    return st;
}
