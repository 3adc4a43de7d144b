/* ktest.h — the project's tiny C test harness. Every tests/test_*.c file defines tests
 * with KT_TEST(name) { ... }; they self-register and tests/ktest_main.c runs them all
 * (or those whose name contains argv[1]) and prints "N passed, N failed, N skipped".
 *
 *   KT_CHECK(cond, fmt, ...)   fails the test (and returns from it) when cond is false
 *   KT_SKIP(fmt, ...)          marks the test skipped (e.g. ../shared absent) and returns
 *   KT_NEAR(a, b, tol)         |a-b| <= tol
 */
#ifndef KTEST_H
#define KTEST_H
#include <math.h>
#include <stdio.h>

typedef struct kt_ctx { int failed, skipped; } kt_ctx;
typedef void (*kt_fn)(kt_ctx *);
void kt_register(const char *name, const char *file, kt_fn fn);

#define KT_TEST(name)                                                                  \
    static void kt_##name(kt_ctx *kt_);                                                \
    __attribute__((constructor)) static void kt_reg_##name(void) {                     \
        kt_register(#name, __FILE__, kt_##name);                                       \
    }                                                                                  \
    static void kt_##name(kt_ctx *kt_)

#define KT_CHECK(cond, ...)                                                            \
    do {                                                                               \
        if (!(cond)) {                                                                 \
            fprintf(stderr, "    FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);        \
            fprintf(stderr, __VA_ARGS__);                                              \
            fprintf(stderr, "\n");                                                     \
            kt_->failed = 1;                                                           \
            return;                                                                    \
        }                                                                              \
    } while (0)

#define KT_SKIP(...)                                                                   \
    do {                                                                               \
        fprintf(stderr, "    skip: ");                                                 \
        fprintf(stderr, __VA_ARGS__);                                                  \
        fprintf(stderr, "\n");                                                         \
        kt_->skipped = 1;                                                              \
        return;                                                                        \
    } while (0)

#define KT_NEAR(a, b, tol) (fabs((double)(a) - (double)(b)) <= (tol))

/* Path to ../shared as seen from the repository root (env KS_SHARED overrides). */
const char *kt_shared_dir(void);

#endif
