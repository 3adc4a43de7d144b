/* test_eval_api.c — kvsieve.h's eval grids (ks_eval_*) and ks_policy_check, through the public
 * header only, on the bundled model: options and their named errors, a small passkey grid under
 * full attention and GemFilter (records, cells, the on_run callback), a stop from on_run and the
 * run that goes on from there, the JSON file and a resume from it that equals an uninterrupted
 * grid, and resume files that do not fit (refused by name, nothing marked). */
#include "kvsieve.h"
#include "ktest.h"
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TINY "models/kvsieve-tiny"

static int have_tiny(void) {
    FILE *f = fopen(TINY "/model.safetensors", "rb");
    if (f) fclose(f);
    return f != NULL;
}

static const int LENS[] = {256};
static const double DEPS[] = {0, 0.5, 1};

/* passkey at 256 tokens, three depths, two cases per cell; policies as given */
static void grid_opts(ks_eval_opts *o, ks_policy *const *pols, const char *const *names, int n) {
    ks_eval_opts_default(o);
    o->task = "passkey";
    o->lengths = LENS;
    o->n_lengths = 1;
    o->depths = DEPS;
    o->n_depths = 3;
    o->cases = 2;
    o->policies = pols;
    o->policy_names = names;
    o->n_policies = n;
}

KT_TEST(eval_api_opts_default_and_check) {
    ks_eval_opts o;
    ks_eval_opts_default(&o);
    KT_CHECK(o.cases == 1 && o.seed == KS_EVAL_SEED && !o.task && !o.lengths && !o.n_policies && !o.on_run, "defaults");
    KT_CHECK(ks_eval_opts_check(&o) == KS_ERR_ARG, "no task");
    KT_CHECK(ks_eval_opts_check(NULL) == KS_ERR_ARG, "NULL options");
    o.task = "haystack";
    KT_CHECK(ks_eval_opts_check(&o) == KS_ERR_ARG && strstr(ks_last_error(), "haystack") &&
                 strstr(ks_last_error(), "passkey, niah, multikey, kv"),
             "unknown task named with the valid ones: %s", ks_last_error());
    o.task = "kv";
    KT_CHECK(ks_eval_opts_check(&o) == KS_OK, "defaults with a task: %s", ks_last_error());
    int bad_len[] = {512, 0};
    o.lengths = bad_len;
    o.n_lengths = 2;
    KT_CHECK(ks_eval_opts_check(&o) == KS_ERR_ARG && strstr(ks_last_error(), "length 0"), "%s", ks_last_error());
    o.lengths = NULL;
    KT_CHECK(ks_eval_opts_check(&o) == KS_ERR_ARG && strstr(ks_last_error(), "no lengths"), "%s", ks_last_error());
    o.n_lengths = 0;
    double bad_dep[] = {0.5, NAN};
    o.depths = bad_dep;
    o.n_depths = 2;
    KT_CHECK(ks_eval_opts_check(&o) == KS_ERR_ARG && strstr(ks_last_error(), "depth nan"), "%s", ks_last_error());
    bad_dep[1] = 1.5;
    KT_CHECK(ks_eval_opts_check(&o) == KS_ERR_ARG && strstr(ks_last_error(), "depth 1.5"), "%s", ks_last_error());
    o.n_depths = 0;
    o.cases = 0;
    KT_CHECK(ks_eval_opts_check(&o) == KS_ERR_ARG && strstr(ks_last_error(), "cases 0"), "%s", ks_last_error());
    o.cases = 1;
    o.n_policies = -1;
    KT_CHECK(ks_eval_opts_check(&o) == KS_ERR_ARG && strstr(ks_last_error(), "negative"), "%s", ks_last_error());
    ks_policy *two[2] = {NULL, NULL}; /* both full attention, both named "full" */
    o.policies = two;
    o.n_policies = 2;
    KT_CHECK(ks_eval_opts_check(&o) == KS_ERR_ARG && strstr(ks_last_error(), "full is named twice"), "%s", ks_last_error());
    const char *names[2] = {"a", "b"};
    o.policy_names = names;
    KT_CHECK(ks_eval_opts_check(&o) == KS_OK, "two named full-attention runs: %s", ks_last_error());
    o.n_policies = 0; /* one policy, "full", whatever the arrays hold */
    KT_CHECK(ks_eval_opts_check(&o) == KS_OK, "no policies: %s", ks_last_error());
    o.n_policies = 2;
    o.cases = 100000;
    int many[64];
    for (int i = 0; i < 64; i++) many[i] = 100 + i;
    double deps[11];
    for (int i = 0; i < 11; i++) deps[i] = i / 10.0;
    o.lengths = many;
    o.n_lengths = 64;
    o.depths = deps;
    o.n_depths = 11; /* 64 x 11 x 100000 x 2 runs */
    KT_CHECK(ks_eval_opts_check(&o) == KS_ERR_ARG && strstr(ks_last_error(), "runs is more than"), "%s", ks_last_error());
}

KT_TEST(eval_api_create_refuses_bad_grids) {
    if (!have_tiny()) KT_SKIP(TINY " absent");
    ks_model *m;
    KT_CHECK(ks_model_open(TINY, "cpu", &m) == KS_OK, "%s", ks_last_error());
    ks_eval_opts o;
    grid_opts(&o, NULL, NULL, 0);
    ks_eval *e = (ks_eval *)&o; /* must be cleared on failure */
    KT_CHECK(ks_eval_create(NULL, &o, &e) == KS_ERR_ARG && e == NULL, "NULL model");
    KT_CHECK(ks_eval_create(m, &o, NULL) == KS_ERR_ARG, "NULL out");
    int huge[] = {512, 1 << 20};
    o.lengths = huge;
    o.n_lengths = 2;
    KT_CHECK(ks_eval_create(m, &o, &e) == KS_ERR_ARG && strstr(ks_last_error(), "exceeds the model's context"), "%s",
             ks_last_error());
    grid_opts(&o, NULL, NULL, 0);
    /* no policies: one run per case under full attention, named "full" */
    KT_CHECK(ks_eval_create(m, &o, &e) == KS_OK && ks_eval_n_runs(e) == 6, "%s", ks_last_error());
    o.on_run = NULL;
    const int one_len[] = {200};
    ks_eval_free(e);
    o.lengths = one_len;
    o.n_depths = 1;
    o.cases = 1;
    KT_CHECK(ks_eval_create(m, &o, &e) == KS_OK && ks_eval_run(e) == KS_OK, "%s", ks_last_error());
    KT_CHECK(ks_eval_n_done(e) == 1 && !strcmp(ks_eval_record_at(e, 0)->policy_name, "full") &&
                 ks_eval_record_at(e, 0)->kept == ks_eval_record_at(e, 0)->tokens,
             "the one run, full attention");
    ks_eval_free(e);
    grid_opts(&o, NULL, NULL, 0);
    o.task = "niah";
    KT_CHECK(ks_eval_create(m, &o, &e) == KS_ERR_ARG && strstr(ks_last_error(), "corpora"), "niah without corpora: %s",
             ks_last_error());
    o.corpora = "/nonexistent/corpora";
    KT_CHECK(ks_eval_create(m, &o, &e) == KS_ERR_IO && strstr(ks_last_error(), "/nonexistent/corpora"), "%s", ks_last_error());
    /* a policy whose parameters the model cannot take: GemFilter's default layer 13 of 8 */
    ks_policy *gf;
    KT_CHECK(ks_policy_load(m, "gemfilter", &gf) == KS_OK, "%s", ks_last_error());
    KT_CHECK(ks_policy_check(gf, m) != KS_OK && strstr(ks_last_error(), "layer = 13"), "check: %s", ks_last_error());
    KT_CHECK(ks_policy_check(NULL, m) == KS_ERR_ARG && ks_policy_check(gf, NULL) == KS_ERR_ARG, "NULL arguments");
    grid_opts(&o, &gf, NULL, 1);
    KT_CHECK(ks_eval_create(m, &o, &e) != KS_OK && strstr(ks_last_error(), "layer = 13") && e == NULL, "%s", ks_last_error());
    KT_CHECK(ks_policy_set(gf, "layer", "2") == KS_OK && ks_policy_check(gf, m) == KS_OK, "layer 2 fits: %s", ks_last_error());
    KT_CHECK(ks_eval_create(m, &o, &e) == KS_OK && e, "%s", ks_last_error());
    KT_CHECK(ks_eval_n_runs(e) == 6 && ks_eval_n_done(e) == 0 && !ks_eval_record_at(e, 0), "a fresh 1x3x2x1 grid");
    ks_eval_cell c;
    KT_CHECK(ks_eval_cell_at(e, 1, 0, 0, &c) == KS_ERR_ARG && ks_eval_cell_at(e, 0, 0, 3, &c) == KS_ERR_ARG &&
                 ks_eval_cell_at(e, 0, 0, 0, NULL) == KS_ERR_ARG,
             "cells outside the grid");
    KT_CHECK(ks_eval_cell_at(e, 0, 0, 2, &c) == KS_OK && c.cases == 0 && isnan(c.exact_match) && isnan(c.value_kept),
             "an empty cell");
    KT_CHECK(ks_eval_run(NULL) == KS_ERR_ARG && ks_eval_write_json(NULL, "x") == KS_ERR_ARG &&
                 ks_eval_write_json(e, NULL) == KS_ERR_ARG && ks_eval_resume(e, NULL) == KS_ERR_ARG,
             "NULL arguments");
    KT_CHECK(ks_eval_n_runs(NULL) == 0 && !ks_eval_record_at(NULL, 0) && !ks_eval_record_at(e, -1) && !ks_eval_record_at(e, 6),
             "out of range");
    ks_eval_free(e);
    ks_eval_free(NULL);
    ks_policy_free(gf);
    ks_model_close(m);
}

typedef struct seen {
    int calls, stop_after;
    long last_done, last_total;
    int ids_ok, kept_ok;
} seen;

static int count_runs(void *user, const ks_eval_record *r, long done, long total) {
    seen *s = user;
    s->calls++;
    s->last_done = done;
    s->last_total = total;
    /* the transient arrays: the prompt starts with BOS and holds `tokens` ids; kept is sorted */
    s->ids_ok += r->prompt_ids != NULL && r->tokens > 0;
    int sorted = r->kept_positions != NULL || r->kept == 0;
    for (int i = 1; sorted && i < r->kept; i++) sorted = r->kept_positions[i - 1] < r->kept_positions[i];
    s->kept_ok += sorted;
    return s->stop_after && s->calls == s->stop_after;
}

/* Records equal, timings aside. */
static int same_records(const ks_eval *a, const ks_eval *b, char *why, size_t n) {
    if (ks_eval_n_runs(a) != ks_eval_n_runs(b)) return snprintf(why, n, "run count"), 0;
    for (long i = 0; i < ks_eval_n_runs(a); i++) {
        const ks_eval_record *x = ks_eval_record_at(a, i), *y = ks_eval_record_at(b, i);
        if (!x || !y) return snprintf(why, n, "run %ld missing", i), 0;
        int eq = x->policy == y->policy && x->length == y->length && x->depth == y->depth && x->index == y->index &&
                 x->seed == y->seed && x->tokens == y->tokens && x->correct == y->correct && x->kept == y->kept &&
                 x->value_in == y->value_in && x->value_n == y->value_n && x->needle_begin == y->needle_begin &&
                 x->needle_end == y->needle_end && x->value_begin == y->value_begin && x->value_end == y->value_end &&
                 !strcmp(x->answer, y->answer) && !strcmp(x->output, y->output) && !strcmp(x->policy_name, y->policy_name);
        if (!eq) return snprintf(why, n, "run %ld differs", i), 0;
    }
    return 1;
}

KT_TEST(eval_api_grid_stop_go_on_write_and_resume) {
    if (!have_tiny()) KT_SKIP(TINY " absent");
    ks_model *m;
    KT_CHECK(ks_model_open(TINY, "cpu", &m) == KS_OK, "%s", ks_last_error());
    ks_policy *gf;
    KT_CHECK(ks_policy_load(m, "gemfilter", &gf) == KS_OK, "%s", ks_last_error());
    KT_CHECK(!ks_policy_set(gf, "layer", "2") && !ks_policy_set(gf, "k", "64"), "%s", ks_last_error());
    ks_policy *pols[2] = {NULL, gf};
    const char *names[2] = {NULL, NULL}; /* "full" and the policy's own name */

    /* 1. the whole grid in one go: 12 runs */
    ks_eval_opts o;
    grid_opts(&o, pols, names, 2);
    seen s1 = {0};
    o.on_run = count_runs;
    o.user = &s1;
    ks_eval *ref;
    KT_CHECK(ks_eval_create(m, &o, &ref) == KS_OK, "%s", ks_last_error());
    KT_CHECK(ks_eval_run(ref) == KS_OK, "run: %s", ks_last_error());
    KT_CHECK(s1.calls == 12 && s1.last_done == 12 && s1.last_total == 12 && s1.ids_ok == 12 && s1.kept_ok == 12,
             "on_run: %d calls, done %ld of %ld", s1.calls, s1.last_done, s1.last_total);
    KT_CHECK(ks_eval_n_done(ref) == 12, "all done");
    int full_ok = 0;
    for (long i = 0; i < 12; i++) {
        const ks_eval_record *r = ks_eval_record_at(ref, i);
        KT_CHECK(r && r->policy == i % 2 && r->index == i / 2 % 2 && r->depth_index == i / 4 && r->length == 256,
                 "run %ld's place in the grid", i);
        KT_CHECK(!strcmp(r->policy_name, r->policy ? "gemfilter" : "full") && !r->resumed, "run %ld: %s", i, r->policy_name);
        KT_CHECK(r->tokens > 200 && r->tokens <= 256 && r->value_n >= 5 && r->value_n <= 6, "run %ld: %d tokens, %d value tokens",
                 i, r->tokens, r->value_n);
        KT_CHECK(r->value_begin >= r->needle_begin && r->value_end <= r->needle_end, "the value inside the needle");
        KT_CHECK(!r->prompt_ids && !r->kept_positions, "transient arrays cleared after on_run");
        if (r->policy == 0) {
            KT_CHECK(r->kept == r->tokens && r->value_kept == 1.0, "full attention keeps everything");
            KT_CHECK(r->correct == !strcmp(r->answer, r->output), "run %ld: correct %d, \"%s\" vs \"%s\"", i, r->correct, r->answer,
                     r->output);
            full_ok += r->correct;
        } else
            KT_CHECK(r->kept == 64 && r->value_kept == (double)r->value_in / r->value_n, "gemfilter keeps 64: %d", r->kept);
    }
    KT_CHECK(full_ok == 6, "full attention answered %d of 6", full_ok);
    ks_eval_cell c;
    KT_CHECK(ks_eval_cell_at(ref, 0, 0, 1, &c) == KS_OK && c.cases == 2 && c.correct == 2 && c.exact_match == 1.0 &&
                 c.n_value == 2 && c.value_kept == 1.0 && c.kept_sum == c.tokens_sum,
             "full's middle cell");
    KT_CHECK(ks_eval_cell_at(ref, 1, 0, 2, &c) == KS_OK && c.cases == 2 && c.kept_sum == 128, "gemfilter's last cell");

    /* 2. stopped by on_run after 5 runs, then run on to the end: the same records */
    seen s2 = {.stop_after = 5};
    o.user = &s2;
    ks_eval *e;
    KT_CHECK(ks_eval_create(m, &o, &e) == KS_OK, "%s", ks_last_error());
    KT_CHECK(ks_eval_run(e) == KS_ERR_INTERRUPTED && ks_eval_n_done(e) == 5, "stopped: %ld done", ks_eval_n_done(e));
    KT_CHECK(ks_eval_record_at(e, 4) && !ks_eval_record_at(e, 5), "runs 0-4 done, 5 not");
    char dir[256], path[512], why[512] = "";
    KT_CHECK(kt_tmpdir(dir, sizeof dir) == 0, "tmpdir");
    snprintf(path, sizeof path, "%s/part.json", dir);
    KT_CHECK(ks_eval_write_json(e, path) == KS_OK, "%s", ks_last_error());
    s2.stop_after = 0;
    KT_CHECK(ks_eval_run(e) == KS_OK && ks_eval_n_done(e) == 12 && s2.calls == 12 && s2.last_total == 12, "went on: %s",
             ks_last_error());
    KT_CHECK(same_records(e, ref, why, sizeof why), "stopped and gone on != one go: %s", why);
    ks_eval_free(e);

    /* 3. resumed from the partial file: 7 runs left, the same records in the end */
    seen s3 = {0};
    o.user = &s3;
    KT_CHECK(ks_eval_create(m, &o, &e) == KS_OK, "%s", ks_last_error());
    KT_CHECK(ks_eval_resume(e, path) == KS_OK && ks_eval_n_done(e) == 5, "resume: %s", ks_last_error());
    KT_CHECK(ks_eval_record_at(e, 0)->resumed && !strcmp(ks_eval_record_at(e, 0)->answer, ks_eval_record_at(ref, 0)->answer),
             "a resumed record");
    KT_CHECK(ks_eval_run(e) == KS_OK && s3.calls == 7 && s3.last_total == 7, "ran %d runs of %ld", s3.calls, s3.last_total);
    KT_CHECK(same_records(e, ref, why, sizeof why), "resumed != one go: %s", why);
    ks_eval_free(e);

    /* 4. files that do not fit this grid: refused by name, nothing marked */
    double other_deps[] = {0, 0.25, 1};
    ks_eval_opts o2 = o;
    o2.depths = other_deps;
    KT_CHECK(ks_eval_create(m, &o2, &e) == KS_OK, "%s", ks_last_error());
    KT_CHECK(ks_eval_resume(e, path) == KS_ERR_ARG && strstr(ks_last_error(), "depths differ") && strstr(ks_last_error(), path),
             "other depths: %s", ks_last_error());
    KT_CHECK(ks_eval_n_done(e) == 0, "nothing marked");
    ks_eval_free(e);
    KT_CHECK(ks_policy_set(gf, "k", "32") == KS_OK && ks_eval_create(m, &o, &e) == KS_OK, "%s", ks_last_error());
    KT_CHECK(ks_eval_resume(e, path) == KS_ERR_ARG && strstr(ks_last_error(), "gemfilter.k = 64 there, 32 here"), "%s",
             ks_last_error());
    KT_CHECK(ks_eval_n_done(e) == 0, "nothing marked");
    snprintf(why, sizeof why, "%s/missing.json", dir);
    KT_CHECK(ks_eval_resume(e, why) == KS_ERR_IO && strstr(ks_last_error(), "missing.json"), "%s", ks_last_error());
    KT_CHECK(kt_write_file(dir, "bad.json", "{\"lengths\": [256,") == 0, "write");
    snprintf(why, sizeof why, "%s/bad.json", dir);
    KT_CHECK(ks_eval_resume(e, why) == KS_ERR_FORMAT && strstr(ks_last_error(), "not an eval JSON"), "%s", ks_last_error());
    KT_CHECK(ks_eval_write_json(e, "/nonexistent/dir/r.json") == KS_ERR_IO && strstr(ks_last_error(), "cannot write"), "%s",
             ks_last_error());
    ks_eval_free(e);
    ks_eval_free(ref);
    kt_rmdir(dir);
    ks_policy_free(gf);
    ks_model_close(m);
}
