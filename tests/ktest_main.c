/* ktest_main.c — runs every registered KT_TEST; see ktest.h. */
#include "ktest.h"

#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define KT_MAX 2048
static struct { const char *name, *file; kt_fn fn; } g_tests[KT_MAX];
static int g_n;

void kt_register(const char *name, const char *file, kt_fn fn) {
    if (g_n < KT_MAX) { g_tests[g_n].name = name; g_tests[g_n].file = file; g_tests[g_n].fn = fn; g_n++; }
}

const char *kt_shared_dir(void) {
    const char *e = getenv("KS_SHARED");
    return e && *e ? e : "../shared";
}

static int cmp(const void *a, const void *b) {
    const char *fa = *(const char *const *)a, *fb = *(const char *const *)b;
    return strcmp(fa, fb);
}

int main(int argc, char **argv) {
    (void)cmp;
    int pass = 0, fail = 0, skip = 0;
    for (int i = 0; i < g_n; i++) {
        if (argc > 1 && !strstr(g_tests[i].name, argv[1]) && !strstr(g_tests[i].file, argv[1])) continue;
        kt_ctx ctx = {0, 0};
        fprintf(stderr, "  %-44s ", g_tests[i].name);
        fflush(stderr);
        g_tests[i].fn(&ctx);
        if (ctx.failed) { fail++; fprintf(stderr, "  %-44s FAILED\n", g_tests[i].name); }
        else if (ctx.skipped) { skip++; fprintf(stderr, "skipped\n"); }
        else { pass++; fprintf(stderr, "ok\n"); }
    }
    printf("%d passed, %d failed, %d skipped\n", pass, fail, skip);
    return fail ? 1 : 0;
}
