/* ktest.h — the project's tiny C test harness. Every tests/test_*.c file defines tests
 * with KT_TEST(name) { ... }; they self-register and tests/ktest_main.c runs them all
 * (or those whose name or file contains one of the filters given on the command line), prints
 * each one's wall time, then the skipped and failed tests with their reasons and
 * "N passed, N failed, N skipped".
 *
 *   KT_TEST(name)              a test
 *   KT_SLOW_TEST(name)         a test of the slow tier: not run by `ks_tests --quick` (or with
 *                              KS_QUICK=1; `make check`), run by the full suite (`make test`)
 *   KT_CHECK(cond, fmt, ...)   fails the test (and returns from it) when cond is false
 *   KT_SKIP(fmt, ...)          marks the test skipped (e.g. ../shared absent) and returns
 *   KT_NEAR(a, b, tol)         |a-b| <= tol
 *   KT_ARG                     the argument of a test registered at run time (below)
 *
 * Tests known only at run time (one per file found, say) are registered by a generator:
 * KT_GENERATOR(name) { ... kt_register_ex(test_name, __FILE__, fn, flags, arg) ... } runs once
 * at the start of main, before filtering, so its tests are filtered, listed and counted like
 * the others. kt_register_ex copies the name; `arg` (owned by the caller, kept for the whole
 * run) is what KT_ARG gives the test.
 */
#ifndef KTEST_H
#define KTEST_H
#include <math.h>
#include <stdio.h>

/* One test's outcome: failed / skipped flags, and the first failure's or the skip's reason
 * (printed again in the summary). */
typedef struct kt_ctx {
    int failed, skipped;
    const void *arg; /* kt_register_ex's argument (NULL for KT_TEST) */
    char why[512];   /* the reason, "" when none was given */
} kt_ctx;
typedef void (*kt_fn)(kt_ctx *);
typedef void (*kt_gen)(void);

enum { KT_FLAG_SLOW = 1 }; /* the slow tier: left out by --quick */

void kt_register(const char *name, const char *file, kt_fn fn);
void kt_register_ex(const char *name, const char *file, kt_fn fn, int flags, const void *arg);
void kt_register_generator(kt_gen gen);
/* Records a failure (kind "FAIL") or a skip (kind "skip") in kt and prints it; the message of
 * the first one is kept as the test's reason. */
void kt_note(kt_ctx *kt, int skip, const char *file, int line, const char *cond, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));

#define KT_TEST_FLAGS_(name, flags)                                                    \
    static void kt_##name(kt_ctx *kt_);                                                \
    __attribute__((constructor)) static void kt_reg_##name(void) {                     \
        kt_register_ex(#name, __FILE__, kt_##name, flags, NULL);                       \
    }                                                                                  \
    static void kt_##name(kt_ctx *kt_)

#define KT_TEST(name) KT_TEST_FLAGS_(name, 0)
#define KT_SLOW_TEST(name) KT_TEST_FLAGS_(name, KT_FLAG_SLOW)

#define KT_GENERATOR(name)                                                             \
    static void kt_gen_##name(void);                                                   \
    __attribute__((constructor)) static void kt_greg_##name(void) {                    \
        kt_register_generator(kt_gen_##name);                                          \
    }                                                                                  \
    static void kt_gen_##name(void)

#define KT_ARG (kt_->arg)

#define KT_CHECK(cond, ...)                                                            \
    do {                                                                               \
        if (!(cond)) {                                                                 \
            kt_note(kt_, 0, __FILE__, __LINE__, #cond, __VA_ARGS__);                   \
            return;                                                                    \
        }                                                                              \
    } while (0)

#define KT_SKIP(...)                                                                   \
    do {                                                                               \
        kt_note(kt_, 1, __FILE__, __LINE__, NULL, __VA_ARGS__);                        \
        return;                                                                        \
    } while (0)

#define KT_NEAR(a, b, tol) (fabs((double)(a) - (double)(b)) <= (tol))

/* Path to ../shared as seen from the repository root (env KS_SHARED overrides). */
const char *kt_shared_dir(void);

#endif
