/* ktest_main.c — runs the registered tests; see ktest.h.
 *
 *   ks_tests [--quick] [--list] [FILTER...]
 *
 * FILTER: run only the tests whose name or source file contains one of them (default: all).
 * --quick (or env KS_QUICK set to anything but "" or "0"): leave out the slow tier
 * (KT_SLOW_TEST; `make check`). --list: print the selected tests (slow ones marked) and exit.
 * Each test prints "ok (1.2 s)", "skipped (...)" or "FAILED (...)"; the run ends with the
 * skipped and failed tests and their reasons, then "N passed, N failed, N skipped" (and how
 * many slow tests --quick left out). Exit status 1 when any test failed. */
#include "ktest.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define KT_MAX 4096
#define KT_MAX_GEN 64
typedef struct kt_test {
    const char *name, *file;
    kt_fn fn;
    int flags;
    const void *arg;
} kt_test;
static kt_test g_tests[KT_MAX];
static int g_n, g_dropped;
static kt_gen g_gens[KT_MAX_GEN];
static int g_ngen;

/* The slow tier, by name, for tests whose files use plain KT_TEST (new slow tests can use
 * KT_SLOW_TEST; a policy script can say "ktest: slow" in its header). The eval tests spawn the
 * CLI and run an evaluation grid over the NIAH task; the emulation test runs every policy twice
 * (emulated device and host); the four policy scripts replay every reference fixture case
 * (3-4 s each on an idle 2-core machine, 8-11 s on a busy one: most of `make check` otherwise).
 * The quick tier keeps the other policy scripts (full, gemfilter, noop, streamingllm), which
 * exercise the same runtime. `ks_tests --list` shows the tiers. */
static const char *const slow_names[] = {
    "eval_smoke_grid_two_policies",
    "eval_niah_show_marks_the_needle",
    "eval_bad_inputs_are_named_errors",
    "eval_gemfilter_keeps_the_needle",
    "eval_sigint_then_resume_equals_an_uninterrupted_run", /* an eval grid run twice (6 s on busy cores) */
    "lua_device_emulated_policies_match_host",
    "policy_asl",
    "policy_fastkv",
    "policy_snapkv",
    "policy_tokenselect",
};

void kt_register_ex(const char *name, const char *file, kt_fn fn, int flags, const void *arg) {
    for (size_t i = 0; i < sizeof slow_names / sizeof *slow_names; i++)
        if (!strcmp(name, slow_names[i])) flags |= KT_FLAG_SLOW;
    /* a full table must not lose tests silently: main fails the run (g_dropped) */
    if (g_n >= KT_MAX) { g_dropped++; return; }
    char *copy = strdup(name);
    if (!copy) { g_dropped++; return; }
    g_tests[g_n++] = (kt_test){copy, file, fn, flags, arg};
}

void kt_register(const char *name, const char *file, kt_fn fn) { kt_register_ex(name, file, fn, 0, NULL); }

void kt_register_generator(kt_gen gen) {
    if (g_ngen < KT_MAX_GEN) g_gens[g_ngen++] = gen;
    else g_dropped++;
}

void kt_note(kt_ctx *kt, int skip, const char *file, int line, const char *cond, const char *fmt, ...) {
    char msg[8192];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (skip) fprintf(stderr, "    skip: %s\n", msg);
    else fprintf(stderr, "    FAIL %s:%d: %s: %s\n", file, line, cond ? cond : "", msg);
    /* the first reason wins; the summary keeps its first line */
    if (!kt->why[0]) snprintf(kt->why, sizeof kt->why, "%.*s", (int)strcspn(msg, "\n"), msg);
    if (skip) kt->skipped = 1;
    else kt->failed = 1;
}

const char *kt_shared_dir(void) {
    const char *e = getenv("KS_SHARED");
    return e && *e ? e : "../shared";
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* every name of the slow list is a registered test (a renamed test would silently join the
 * quick tier) */
KT_TEST(ktest_slow_names_exist) {
    for (size_t i = 0; i < sizeof slow_names / sizeof *slow_names; i++) {
        int found = 0;
        for (int t = 0; t < g_n && !found; t++) found = !strcmp(g_tests[t].name, slow_names[i]);
        KT_CHECK(found, "slow_names lists %s, which is no test", slow_names[i]);
    }
}

/* the skipped or failed tests and their reasons, for the summary */
typedef struct { int test; char why[sizeof ((kt_ctx *)0)->why]; } kt_outcome;

static void print_list(const char *title, const kt_outcome *o, int n) {
    if (!n) return;
    printf("%s (%d):\n", title, n);
    for (int i = 0; i < n; i++) printf("  %-44s %s\n", g_tests[o[i].test].name, o[i].why[0] ? o[i].why : "(no reason given)");
}

int main(int argc, char **argv) {
    int quick = 0, list = 0, nfilt = 0;
    const char *e = getenv("KS_QUICK");
    if (e && *e && strcmp(e, "0")) quick = 1;
    const char **filt = calloc((size_t)argc + 1, sizeof *filt);
    if (!filt) return 2;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick")) quick = 1;
        else if (!strcmp(argv[i], "--list")) list = 1;
        else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            printf("usage: %s [--quick] [--list] [FILTER...]\n", argv[0]);
            free(filt);
            return 0;
        } else filt[nfilt++] = argv[i];
    }
    for (int g = 0; g < g_ngen; g++) g_gens[g]();

    kt_outcome *skipped = calloc((size_t)g_n + 1, sizeof *skipped), *failed = calloc((size_t)g_n + 1, sizeof *failed);
    if (!skipped || !failed) return 2;
    int pass = 0, fail = 0, skip = 0, left_out = 0, selected = 0;
    double t_all = now_s();
    for (int i = 0; i < g_n; i++) {
        const kt_test *t = &g_tests[i];
        int match = !nfilt;
        for (int f = 0; f < nfilt && !match; f++) match = strstr(t->name, filt[f]) || strstr(t->file, filt[f]);
        if (!match) continue;
        if (quick && (t->flags & KT_FLAG_SLOW)) { left_out++; continue; }
        selected++;
        if (list) { printf("%s%s\n", t->name, t->flags & KT_FLAG_SLOW ? " (slow)" : ""); continue; }
        kt_ctx ctx = {0};
        ctx.arg = t->arg;
        fprintf(stderr, "  %-44s ", t->name);
        fflush(stderr);
        double t0 = now_s();
        t->fn(&ctx);
        double dt = now_s() - t0;
        if (ctx.failed) {
            failed[fail].test = i;
            memcpy(failed[fail++].why, ctx.why, sizeof ctx.why);
            fprintf(stderr, "  %-44s FAILED (%.1f s)\n", t->name, dt);
        } else if (ctx.skipped) {
            skipped[skip].test = i;
            memcpy(skipped[skip++].why, ctx.why, sizeof ctx.why);
            fprintf(stderr, "skipped (%.1f s)\n", dt);
        } else {
            pass++;
            fprintf(stderr, "ok (%.1f s)\n", dt);
        }
    }
    if (list) {
        if (left_out) printf("(%d slow tests left out by --quick)\n", left_out);
    } else {
        fflush(stderr);
        print_list("skipped", skipped, skip);
        print_list("failed", failed, fail);
        if (g_dropped) printf("harness: %d tests could not be registered (KT_MAX %d)\n", g_dropped, KT_MAX);
        if (selected == 0 && !left_out) printf("no test matched the filter\n");
        printf("%d passed, %d failed, %d skipped", pass, fail, skip);
        if (left_out) printf("; %d slow tests not run (--quick)", left_out);
        printf(" (%.1f s)\n", now_s() - t_all);
    }
    free(skipped);
    free(failed);
    free(filt);
    return fail || g_dropped || (selected == 0 && !left_out && !list) ? 1 : 0;
}
