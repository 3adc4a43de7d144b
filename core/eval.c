/* eval.c — kvsieve.h's eval grids: options and their checks, the grid loop (task cases from
 * core/tasks.c, one greedy generation per run and policy, exact-match scoring, the needle's
 * value tokens kept), records and cells. The JSON file (written, resumed) is core/eval_json.c. */
#include "eval.h"

#include "common.h"
#include "engine.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static const int k_default_lengths[] = {512, 1024, 2048, 4096};
static const double k_default_depths[] = {0, 0.25, 0.5, 0.75, 1};
#define EVAL_MAX_RUNS (1L << 26) /* a grid larger than this is a typo, not a plan */

void ks_eval_opts_default(ks_eval_opts *o) {
    if (!o) return;
    memset(o, 0, sizeof *o);
    o->cases = 1;
    o->seed = KS_EVAL_SEED;
}

/* Policy p's name: the given one, else the policy's own, "full" for none (and for the one run of
 * a grid without policies). */
static const char *pol_name(const ks_eval_opts *o, int p) {
    if (!o->n_policies) return "full";
    if (o->policy_names && o->policy_names[p]) return o->policy_names[p];
    ks_policy *pol = o->policies ? o->policies[p] : NULL;
    return pol ? ks_policy_name(pol) : "full";
}

ks_status ks_eval_opts_check(const ks_eval_opts *o) {
    if (!o) return ks_errorf(KS_ERR_ARG, "eval: NULL options");
    ks_task_kind kind;
    if (ks_task_parse(o->task, &kind)) return KS_ERR_ARG;
    if (o->n_lengths < 0 || o->n_depths < 0 || o->n_policies < 0)
        return ks_errorf(KS_ERR_ARG, "eval: negative count (n_lengths %d, n_depths %d, n_policies %d)", o->n_lengths,
                         o->n_depths, o->n_policies);
    if (o->n_lengths && !o->lengths) return ks_errorf(KS_ERR_ARG, "eval: n_lengths %d with no lengths", o->n_lengths);
    if (o->n_depths && !o->depths) return ks_errorf(KS_ERR_ARG, "eval: n_depths %d with no depths", o->n_depths);
    for (int i = 0; i < o->n_lengths; i++)
        if (o->lengths[i] < 1 || o->lengths[i] > (1 << 30))
            return ks_errorf(KS_ERR_ARG, "eval: length %d is outside 1..%d", o->lengths[i], 1 << 30);
    for (int i = 0; i < o->n_depths; i++)
        if (!(o->depths[i] >= 0 && o->depths[i] <= 1)) return ks_errorf(KS_ERR_ARG, "eval: depth %g is outside [0, 1]", o->depths[i]);
    if (o->cases < 1 || o->cases > 100000) return ks_errorf(KS_ERR_ARG, "eval: cases %d is outside 1..100000", o->cases);
    int nP = o->n_policies ? o->n_policies : 1;
    for (int p = 0; p < nP; p++) {
        const char *a = pol_name(o, p);
        if (!*a) return ks_errorf(KS_ERR_ARG, "eval: policy %d has an empty name", p);
        for (int q = 0; q < p; q++)
            if (!strcmp(a, pol_name(o, q))) return ks_errorf(KS_ERR_ARG, "eval: policy %s is named twice", a);
    }
    double runs = (double)(o->n_lengths ? o->n_lengths : 4) * (o->n_depths ? o->n_depths : 5) * o->cases * nP;
    if (runs > EVAL_MAX_RUNS) return ks_errorf(KS_ERR_ARG, "eval: %.0f runs is more than %ld", runs, EVAL_MAX_RUNS);
    return KS_OK;
}

void ks_eval_free(ks_eval *e) {
    if (!e) return;
    long n = ks_eval_n_runs(e);
    for (long i = 0; e->rec && i < n; i++) { free(e->rec[i].answer); free(e->rec[i].output); }
    free(e->rec);
    for (int p = 0; e->pnames && p < e->nP; p++) free(e->pnames[p]);
    free(e->pnames);
    free(e->pols);
    free(e->lengths);
    free(e->depths);
    free(e->model_label);
    ks_haystack_free(e->hs);
    free(e);
}

ks_status ks_eval_create(ks_model *m, const ks_eval_opts *o, ks_eval **out) {
    if (!out) return ks_errorf(KS_ERR_ARG, "eval: NULL output pointer");
    *out = NULL;
    if (!m) return ks_errorf(KS_ERR_ARG, "eval: NULL model");
    ks_status st = ks_eval_opts_check(o);
    if (st) return st;
    if (!m->tok) return ks_errorf(KS_ERR_IO, "%s has no tokenizer.json", m->dir);
    ks_eval *e = ks_calloc(1, sizeof *e);
    if (!e) return KS_ERR_OOM;
    ks_task_parse(o->task, &e->kind);
    e->m = m;
    e->nL = o->n_lengths ? o->n_lengths : (int)(sizeof k_default_lengths / sizeof *k_default_lengths);
    e->nD = o->n_depths ? o->n_depths : (int)(sizeof k_default_depths / sizeof *k_default_depths);
    e->nC = o->cases;
    e->nP = o->n_policies ? o->n_policies : 1;
    e->seed = o->seed;
    e->backend = m->be->name;
    e->interrupt = o->interrupt;
    e->on_run = o->on_run;
    e->user = o->user;
    e->lengths = ks_malloc(sizeof *e->lengths * e->nL);
    e->depths = ks_malloc(sizeof *e->depths * e->nD);
    e->pols = ks_calloc(e->nP, sizeof *e->pols);
    e->pnames = ks_calloc(e->nP, sizeof *e->pnames);
    e->model_label = ks_strdup(o->model_label ? o->model_label : m->dir);
    e->rec = ks_calloc((size_t)ks_eval_n_runs(e), sizeof *e->rec);
    if (!e->lengths || !e->depths || !e->pols || !e->pnames || !e->model_label || !e->rec) { st = KS_ERR_OOM; goto fail; }
    memcpy(e->lengths, o->n_lengths ? o->lengths : k_default_lengths, sizeof *e->lengths * e->nL);
    memcpy(e->depths, o->n_depths ? o->depths : k_default_depths, sizeof *e->depths * e->nD);
    for (int p = 0; p < e->nP; p++) {
        e->pols[p] = o->policies && o->n_policies ? o->policies[p] : NULL;
        if (!(e->pnames[p] = ks_strdup(pol_name(o, p)))) { st = KS_ERR_OOM; goto fail; }
    }
    /* every check before the first run: lengths against the context, the haystack, the policies */
    for (int i = 0; i < e->nL; i++)
        if (e->lengths[i] + 64 > m->cfg.max_pos) {
            st = ks_errorf(KS_ERR_ARG, "length %d (+ the answer) exceeds the model's context of %d tokens", e->lengths[i],
                           m->cfg.max_pos);
            goto fail;
        }
    if (e->kind == KS_TASK_NIAH || e->kind == KS_TASK_MULTIKEY) {
        if (!o->corpora) {
            st = ks_errorf(KS_ERR_ARG, "task %s needs a haystack: a corpora folder of *.txt files", ks_task_name(e->kind));
            goto fail;
        }
        if ((st = ks_haystack_load(o->corpora, &e->hs))) goto fail; /* its message names the folder */
    }
    for (int p = 0; p < e->nP; p++)
        if (e->pols[p] && (st = ks_policy_check(e->pols[p], m))) goto fail;
    *out = e;
    return KS_OK;
fail:
    ks_eval_free(e);
    return st;
}

long ks_eval_n_runs(const ks_eval *e) { return e ? (long)e->nL * e->nD * e->nC * e->nP : 0; }

long ks_eval_n_done(const ks_eval *e) {
    long n = 0, all = ks_eval_n_runs(e);
    for (long i = 0; i < all; i++) n += e->rec[i].done;
    return n;
}

const ks_eval_record *ks_eval_record_at(const ks_eval *e, long i) {
    if (!e || i < 0 || i >= ks_eval_n_runs(e) || !e->rec[i].done) return NULL;
    return &e->rec[i].r;
}

ks_status ks_eval_cell_at(const ks_eval *e, int p, int li, int di, ks_eval_cell *out) {
    if (!e || !out) return ks_errorf(KS_ERR_ARG, "eval: NULL grid or cell");
    if (p < 0 || p >= e->nP || li < 0 || li >= e->nL || di < 0 || di >= e->nD)
        return ks_errorf(KS_ERR_ARG, "eval: cell (policy %d, length %d, depth %d) is outside the %dx%dx%d grid", p, li, di,
                         e->nP, e->nL, e->nD);
    memset(out, 0, sizeof *out);
    for (int ci = 0; ci < e->nC; ci++) {
        const ks_eval_rec *x = &e->rec[ks_eval_index(e, li, di, ci, p)];
        if (!x->done) continue;
        out->cases++;
        out->correct += x->r.correct;
        if (!isnan(x->r.value_kept)) { out->value_kept_sum += x->r.value_kept; out->n_value++; }
        out->prefill_sum += x->r.prefill_s;
        out->tokens_sum += x->r.tokens;
        out->kept_sum += x->r.kept;
    }
    out->exact_match = out->cases ? (double)out->correct / out->cases : NAN;
    out->value_kept = out->n_value ? out->value_kept_sum / out->n_value : NAN;
    return KS_OK;
}

void ks_eval_basename(const char *path, char *buf, size_t n) {
    const char *e = path + strlen(path);
    while (e > path && e[-1] == '/') e--; /* "models/x/" */
    const char *b = e;
    while (b > path && b[-1] != '/') b--;
    snprintf(buf, n, "%.*s", (int)KS_MIN((size_t)(e - b), n - 1), b);
}

/* ---------------------------------------------------------------- one case */

static int cmp_i32(const void *x, const void *y) {
    int32_t a = *(const int32_t *)x, b = *(const int32_t *)y;
    return (a > b) - (a < b);
}

/* The prompt positions the policy kept: the restart set, else the last layer's resident rows
 * (union over KV heads) below n_prompt. A sorted ks_malloc'd list (*n its length), NULL on OOM. */
static int32_t *kept_positions(const ks_session *s, const ks_model *m, int n_prompt, int *n) {
    const int32_t *r;
    int k = ks_result_restart(s, &r);
    *n = 0;
    if (k > 0) {
        int32_t *out = ks_malloc(sizeof(int32_t) * k);
        if (!out) return NULL;
        memcpy(out, r, sizeof(int32_t) * k);
        qsort(out, k, sizeof(int32_t), cmp_i32);
        *n = k;
        return out;
    }
    char *seen = ks_calloc(n_prompt ? n_prompt : 1, 1);
    int32_t *out = ks_malloc(sizeof(int32_t) * (n_prompt ? n_prompt : 1));
    if (!seen || !out) { free(seen); free(out); return NULL; }
    int last = m->cfg.n_layers - 1;
    for (int h = 0; h < m->cfg.n_kv_heads; h++) {
        const int32_t *pos;
        int rows = ks_result_kept(s, last, h, &pos);
        for (int i = 0; i < rows; i++)
            if (pos[i] >= 0 && pos[i] < n_prompt) seen[pos[i]] = 1;
    }
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

static int interrupted(const ks_eval *e) { return e->interrupt && *e->interrupt; }

/* Run case (li, di, ci) under every policy not yet done. KS_OK, KS_ERR_INTERRUPTED (the running
 * run is dropped), or the failure's status with its message. */
static ks_status run_case(ks_eval *e, ks_session *s, int li, int di, int ci, long total) {
    int L = e->lengths[li];
    double d = e->depths[di];
    int todo = 0;
    for (int p = 0; p < e->nP; p++) todo += !e->rec[ks_eval_index(e, li, di, ci, p)].done;
    if (!todo) return KS_OK;
    uint64_t seed = ks_task_case_seed(e->seed, e->kind, L, d, ci);
    ks_task_case tc;
    ks_status st = ks_task_make(e->kind, e->hs, e->m->tok, L, d, seed, &tc);
    if (st) return ks_error_prefix(st, "task");
    int32_t *ids = NULL, *ans = NULL;
    int n = 0, na = 0;
    if ((st = ks_tokenize(e->m, tc.prompt, 1, &ids, &n)) || (st = ks_tokenize(e->m, tc.answer, 0, &ans, &na)))
        ks_error_prefix(st, "tokenize");
    else if (n != tc.n_tokens || na < 1)
        st = ks_errorf(KS_ERR_INTERNAL, "internal: case has %d tokens, the generator counted %d", n, tc.n_tokens);
    for (int p = 0; p < e->nP && !st; p++) {
        ks_eval_rec *x = &e->rec[ks_eval_index(e, li, di, ci, p)];
        if (x->done) continue;
        if (interrupted(e)) { st = KS_ERR_INTERRUPTED; break; }
        ks_session_set_policy(s, e->pols[p]);
        ks_generate_opts o;
        ks_generate_opts_default(&o);
        o.max_new_tokens = na;
        st = ks_generate_ids(s, ids, n, &o, NULL, NULL);
        if (st == KS_ERR_INTERRUPTED || interrupted(e)) { st = ks_errorf(KS_ERR_INTERRUPTED, "eval interrupted"); break; }
        if (st) { ks_error_prefix(st, "%s, length %d, depth %g, case %d", e->pnames[p], L, d, ci); break; }
        int ng;
        const int32_t *gen = ks_result_ids(s, &ng);
        int nk = 0;
        int32_t *kept = kept_positions(s, e->m, n, &nk);
        x->answer = ks_strdup(tc.answer);
        x->output = ks_strdup(ks_result_text(s));
        if (!kept || !x->answer || !x->output) {
            free(kept);
            free(x->answer);
            free(x->output);
            x->answer = x->output = NULL;
            st = ks_error_prefix(KS_ERR_OOM, "eval");
            break;
        }
        ks_eval_record *r = &x->r;
        memset(r, 0, sizeof *r);
        r->policy = p, r->length_index = li, r->depth_index = di, r->index = ci;
        r->policy_name = e->pnames[p];
        r->length = L;
        r->depth = d;
        r->seed = seed;
        r->tokens = n;
        r->correct = ng >= na && !memcmp(gen, ans, sizeof(int32_t) * na);
        r->kept = nk;
        r->value_n = tc.value_tok_end - tc.value_tok_begin;
        for (int t = tc.value_tok_begin; t < tc.value_tok_end; t++) r->value_in += contains(kept, nk, t);
        r->value_kept = r->value_n > 0 ? (double)r->value_in / r->value_n : NAN;
        r->needle_begin = tc.needle_tok_begin, r->needle_end = tc.needle_tok_end;
        r->value_begin = tc.value_tok_begin, r->value_end = tc.value_tok_end;
        r->prefill_s = ks_result_prefill_seconds(s);
        r->decode_s = ks_result_decode_seconds(s);
        r->answer = x->answer;
        r->output = x->output;
        x->done = 1;
        e->done_here++;
        int stop = 0;
        if (e->on_run) {
            r->prompt_ids = ids;
            r->kept_positions = kept;
            stop = e->on_run(e->user, r, e->done_here, total);
            r->prompt_ids = r->kept_positions = NULL;
        }
        free(kept);
        if (stop) st = ks_errorf(KS_ERR_INTERRUPTED, "eval stopped by its on_run callback");
    }
    free(ids);
    free(ans);
    ks_task_case_free(&tc);
    return st;
}

ks_status ks_eval_run(ks_eval *e) {
    if (!e) return ks_errorf(KS_ERR_ARG, "eval: NULL grid");
    long all = ks_eval_n_runs(e), resumed = 0;
    for (long i = 0; i < all; i++) resumed += e->rec[i].r.resumed;
    long total = all - resumed;
    ks_session *s = NULL;
    ks_status st = KS_OK;
    if (ks_eval_n_done(e) == all) return KS_OK;
    if ((st = ks_session_create(e->m, &s))) return st;
    s->interrupt = e->interrupt;
    for (int li = 0; li < e->nL && !st; li++)
        for (int di = 0; di < e->nD && !st; di++)
            for (int ci = 0; ci < e->nC && !st; ci++) {
                int todo = 0;
                for (int p = 0; p < e->nP; p++) todo += !e->rec[ks_eval_index(e, li, di, ci, p)].done;
                if (!todo) continue;
                st = interrupted(e) ? ks_errorf(KS_ERR_INTERRUPTED, "eval interrupted") : run_case(e, s, li, di, ci, total);
            }
    s->interrupt = NULL;
    ks_session_free(s);
    /* a stop after the last run left nothing undone: the grid is complete */
    if (st == KS_ERR_INTERRUPTED && ks_eval_n_done(e) == all) st = KS_OK;
    return st;
}
