/* test_repl.c — drives `kvsieve repl` through a pseudo-terminal as a person would.
 *
 *   repl_as_a_person_would   load stories260K, run a prompt with a policy, show the kept
 *                            tokens, interrupt a long run with Ctrl-C, carry on (../shared)
 *   repl_tab_completion      Tab on ks.NAME, on a method of a global tensor (t:nu), on a
 *                            policy name inside quotes, on a slash command; a double Tab lists
 *                            the candidates
 *   repl_pretty_print        nested tables with indentation, a depth and a size limit, tensors
 *                            by shape, a result with its summary, a streamed generate and its
 *                            timing line, `help` (without the slash)
 *   repl_chat_mode           /chat on, two turns (the second prompt holds the first turn), /chat
 *                            reset (back to the first prompt's length), /chat off (Lua again)
 * The last three run on the bundled models/kvsieve-tiny (from the repository root). Needs
 * KS_BIN (set by `make test`). HOME points at a temporary folder, so the history file of the
 * person running the tests is left alone. */
#include "ktest.h"
#include "testutil.h"

#include <errno.h>
#include <poll.h>
#include <pty.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

typedef struct term { int fd; pid_t pid; char buf[1 << 16]; size_t len; } term;

/* Read until `want` appears after offset `from` (or timeout). Returns 1 if seen. */
static int expect(term *t, size_t from, const char *want, double timeout_s) {
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        t->buf[t->len] = 0;
        if (strstr(t->buf + from, want)) return 1;
        struct timespec t1;
        clock_gettime(CLOCK_MONOTONIC, &t1);
        double el = (t1.tv_sec - t0.tv_sec) + 1e-9 * (t1.tv_nsec - t0.tv_nsec);
        if (el > timeout_s) return 0;
        struct pollfd p = {t->fd, POLLIN, 0};
        if (poll(&p, 1, 100) > 0) {
            ssize_t k = read(t->fd, t->buf + t->len, sizeof t->buf - 1 - t->len);
            if (k <= 0) return 0;
            t->len += (size_t)k;
            if (t->len > sizeof t->buf - 4096) { /* keep the tail */
                memmove(t->buf, t->buf + t->len / 2, t->len - t->len / 2);
                t->len -= t->len / 2;
                from = 0;
            }
        }
    }
}

static void type(term *t, const char *s) {
    ssize_t w = write(t->fd, s, strlen(s));
    (void)w;
}

KT_TEST(repl_as_a_person_would) {
    const char *bin = getenv("KS_BIN");
    if (!bin || !*bin) KT_SKIP("KS_BIN not set (run through make test)");
    char model[512];
    snprintf(model, sizeof model, "%s/models/stories260K", kt_shared_dir());
    if (access(model, R_OK)) KT_SKIP("%s absent", model);
    term t = {0};
    struct winsize ws = {40, 120, 0, 0};
    t.pid = forkpty(&t.fd, NULL, NULL, &ws);
    KT_CHECK(t.pid >= 0, "forkpty: %s", strerror(errno));
    if (t.pid == 0) {
        setenv("TERM", "dumb", 1);
        execl(bin, bin, "repl", "-m", model, (char *)NULL);
        _exit(127);
    }
    int ok = expect(&t, 0, "> ", 20);
    if (ok) {
        size_t at = t.len;
        /* a prompt with a policy, then the kept tokens for a person */
        type(&t, "r = s:generate('Once upon a time there was a little girl named Lily. She loved to play', "
                 "{n = 8, policy = 'streamingllm', set = {budget = 10, sinks = 2}})\n");
        ok = expect(&t, at, "> ", 30);
        at = t.len;
        if (ok) {
            type(&t, "ks.show_kept(r, m, {layer = 0, color = false})\n");
            ok = expect(&t, at, "Lily", 10) && expect(&t, at, "> ", 10);
        }
        if (ok) {
            at = t.len;
            type(&t, "#r:kept(0, 0)\n");
            ok = expect(&t, at, "17", 10); /* 10 kept after prefill + 7 decode rows */
        }
        if (ok) {
            /* a long run, interrupted with Ctrl-C */
            at = t.len;
            type(&t, "for i = 1, 1000 do s:generate('Once upon a time', {n = 400}) end\n");
            struct timespec d = {1, 0};
            nanosleep(&d, NULL);
            type(&t, "\x03");
            ok = expect(&t, at, "interrupted", 20);
        }
        if (ok) {
            at = t.len;
            type(&t, "1 + 41\n");
            ok = expect(&t, at, "42", 10);
        }
    }
    t.buf[t.len] = 0;
    type(&t, "os.exit(0)\n");
    int status = 0;
    for (int i = 0; i < 50 && waitpid(t.pid, &status, WNOHANG) == 0; i++) {
        struct timespec d = {0, 100000000};
        nanosleep(&d, NULL);
    }
    if (waitpid(t.pid, &status, WNOHANG) == 0) { kill(t.pid, SIGKILL); waitpid(t.pid, &status, 0); }
    close(t.fd);
    KT_CHECK(ok, "the REPL session did not go as expected; screen so far:\n%s", t.buf);
}

/* ================================================================ the bundled model's REPL */

/* Start `kvsieve repl -m models/kvsieve-tiny` on a pty with HOME = home; 1 when its first
 * prompt came. */
static int start_tiny(term *t, const char *bin, const char *home) {
    struct winsize ws = {40, 200, 0, 0};
    t->len = 0;
    t->pid = forkpty(&t->fd, NULL, NULL, &ws);
    if (t->pid < 0) return 0;
    if (t->pid == 0) {
        setenv("TERM", "dumb", 1);
        setenv("HOME", home, 1);
        execl(bin, bin, "repl", "-m", "models/kvsieve-tiny", (char *)NULL);
        _exit(127);
    }
    return expect(t, 0, "> ", 20);
}

/* Leave the REPL and reap it. */
static void finish(term *t) {
    t->buf[t->len] = 0;
    type(t, "/quit\n");
    int status = 0;
    for (int i = 0; i < 50 && waitpid(t->pid, &status, WNOHANG) == 0; i++) {
        struct timespec d = {0, 100000000};
        nanosleep(&d, NULL);
    }
    if (waitpid(t->pid, &status, WNOHANG) == 0) { kill(t->pid, SIGKILL); waitpid(t->pid, &status, 0); }
    close(t->fd);
}

/* Type `in`, then wait for every string of want[] (after the typed text) and the next prompt. */
static int step(term *t, const char *in, const char *const *want, double timeout_s) {
    size_t at = t->len;
    type(t, in);
    for (int i = 0; want && want[i]; i++)
        if (!expect(t, at, want[i], timeout_s)) return 0;
    return expect(t, at, "> ", timeout_s);
}

static term g_t; /* 64 KiB: not on the stack */

KT_TEST(repl_tab_completion) {
    const char *bin = getenv("KS_BIN");
    if (!bin || !*bin) KT_SKIP("KS_BIN not set (run through make test)");
    char home[256];
    KT_CHECK(kt_tmpdir(home, sizeof home) == 0, "tmpdir");
    term *t = &g_t;
    int ok = start_tiny(t, bin, home);
    const char *fail = "the first prompt";
    /* ks.NAME: an unfinished name completes, and the call runs */
    if (ok && !(ok = step(t, "ks.sparkl\t({1, 5, 2, 8})\n", (const char *[]){"\xe2\x96\x81\xe2\x96\x85\xe2\x96\x82\xe2\x96\x88", NULL}, 10)))
        fail = "ks.sparkl<Tab>";
    /* a method of a global: t:nu<Tab> -> t:numel */
    if (ok && !(ok = step(t, "t = ks.tensor({4, 5, 6})\n", NULL, 10))) fail = "t = ...";
    if (ok && !(ok = step(t, "t:nu\t() * 10\n", (const char *[]){"30", NULL}, 10))) fail = "t:nu<Tab>";
    /* a policy name inside quotes (the policies folder's NAME.lua, NAME.test.lua left out);
     * readline closes the quote */
    if (ok && !(ok = step(t, "p = ks.policy('streamin\t)\n", NULL, 10))) fail = "'streamin<Tab>";
    if (ok && !(ok = step(t, "p.name\n", (const char *[]){"streamingllm", NULL}, 10))) fail = "p.name";
    /* a slash command */
    if (ok && !(ok = step(t, "/str\t off\n", (const char *[]){"streaming off", NULL}, 10))) fail = "/str<Tab>";
    /* test policies are not offered: only one candidate, so it completes */
    if (ok && !(ok = step(t, "q = 'snap\t\n", NULL, 10))) fail = "'snap<Tab>";
    if (ok && !(ok = step(t, "q\n", (const char *[]){"\r\nsnapkv\r\n", NULL}, 10))) fail = "'snap<Tab> (a test policy offered?)";
    /* the engine's own test policies (tests/policies/test_*.lua) are not names: 'test_r stays as typed */
    if (ok && !(ok = step(t, "q = 'test_r\t'\n", NULL, 10))) fail = "'test_r<Tab>";
    if (ok && !(ok = step(t, "q\n", (const char *[]){"\r\ntest_r\r\n", NULL}, 10))) fail = "'test_r<Tab> (a test policy offered?)";
    /* a double Tab lists the candidates; Ctrl-U drops the line */
    if (ok) {
        size_t at = t->len;
        type(t, "ks.so\t\t");
        ok = expect(t, at, "ks.softmax", 10) && expect(t, at, "ks.sort", 10);
        type(t, "\x15\n");
        ok = ok && expect(t, at, "> ", 10);
        if (!ok) fail = "ks.so<Tab><Tab>";
    }
    /* no file names: a word that names no Lua value completes to nothing */
    if (ok && !(ok = step(t, "x = 'Makef\t'\n", NULL, 10))) fail = "'Makef<Tab>";
    if (ok && !(ok = step(t, "x\n", (const char *[]){"Makef\r\n", NULL}, 10))) fail = "no file-name completion";
    finish(t);
    kt_rmdir(home);
    KT_CHECK(ok, "%s: the REPL did not answer as expected; screen so far:\n%s", fail, t->buf);
}

KT_TEST(repl_pretty_print) {
    const char *bin = getenv("KS_BIN");
    if (!bin || !*bin) KT_SKIP("KS_BIN not set (run through make test)");
    char home[256];
    KT_CHECK(kt_tmpdir(home, sizeof home) == 0, "tmpdir");
    term *t = &g_t;
    int ok = start_tiny(t, bin, home);
    const char *fail = "the first prompt";
    size_t at = t->len;
    /* nested tables: indentation, short lists inline, tensors by shape and values */
    if (ok && !(ok = step(t, "{a = 1, b = {c = 'x', d = {1, 2, 3}}, ks.tensor({1.5, 2})}\n",
                         (const char *[]){"\r\n  tensor(f32, [2]) [1.5, 2],", "\r\n  a = 1,", "\r\n  b = {",
                                          "\r\n    c = \"x\",", "\r\n    d = {1, 2, 3},", NULL}, 10)))
        fail = "a nested table";
    /* a depth limit and a size limit */
    if (ok && !(ok = step(t, "local t = {} local c = t for i = 1, 20 do c.x = {i} c = c.x end return t\n",
                         (const char *[]){"x = {... 2 items}", NULL}, 10)))
        fail = "a deep table";
    if (ok && !(ok = step(t, "local t = {} for i = 1, 100 do t[i] = {i, i} end return t\n",
                         (const char *[]){"... (100 items in all)", NULL}, 10)))
        fail = "a long table";
    /* a generate streams, then its timing line; the result prints with its summary */
    if (ok && !(ok = step(t, "s:generate('The grass is', {n = 4})\n",
                         (const char *[]){"-- 4 prompt tokens in ", "tok/s) | 4 generated in ",
                                          "result(4 prompt + 4 generated tokens)", "\r\n  prompt_tokens = 4,", NULL}, 20)))
        fail = "a generate";
    /* help without the slash */
    if (ok && !(ok = step(t, "help\n", (const char *[]){"stream = function(piece, id)", "ks.sparkline(", NULL}, 10)))
        fail = "help";
    t->buf[t->len] = 0;
    int raw = strstr(t->buf + at, "table: 0x") != NULL;
    finish(t);
    kt_rmdir(home);
    KT_CHECK(ok, "%s: the REPL did not answer as expected; screen so far:\n%s", fail, t->buf);
    KT_CHECK(!raw, "a table printed as its address:\n%s", t->buf);
}

/* The prompt token count of the chat turn `turn` after offset at, or -1. */
static int turn_prompt(term *t, size_t at, int turn) {
    char key[32];
    snprintf(key, sizeof key, "-- turn %d: ", turn);
    t->buf[t->len] = 0;
    const char *p = strstr(t->buf + at, key);
    int n = -1;
    if (!p || sscanf(p + strlen(key), "%d prompt tokens", &n) != 1) return -1;
    return n;
}

KT_TEST(repl_chat_mode) {
    const char *bin = getenv("KS_BIN");
    if (!bin || !*bin) KT_SKIP("KS_BIN not set (run through make test)");
    char home[256];
    KT_CHECK(kt_tmpdir(home, sizeof home) == 0, "tmpdir");
    term *t = &g_t;
    int ok = start_tiny(t, bin, home);
    const char *fail = "the first prompt";
    int n1 = -1, n2 = -1, n3 = -1;
    /* the bundled model has no chat tokens: plain turns, said so */
    if (ok && !(ok = step(t, "/chat on\n", (const char *[]){"chat on, template plain", "no chat template fits", NULL}, 10)))
        fail = "/chat on";
    if (ok && !(ok = step(t, "/chat opts {n = 12}\n", (const char *[]){"chat options {n = 12}", NULL}, 10))) fail = "/chat opts";
    size_t at = t->len;
    if (ok && !(ok = step(t, "Hello there.\n", (const char *[]){"-- turn 1: ", "chat> ", NULL}, 30))) fail = "turn 1";
    if (ok) n1 = turn_prompt(t, at, 1);
    at = t->len;
    if (ok && !(ok = step(t, "Tell me more.\n", (const char *[]){"-- turn 2: ", "chat> ", NULL}, 30))) fail = "turn 2";
    if (ok) n2 = turn_prompt(t, at, 2);
    /* the second prompt holds the first turn: its question, the reply and the new question */
    if (ok && !(ok = n1 > 3 && n2 > n1 + 3)) fail = "the conversation was not kept";
    if (ok && !(ok = step(t, "/chat\n", (const char *[]){"4 messages", NULL}, 10))) fail = "/chat status";
    if (ok && !(ok = step(t, "/chat reset\n", (const char *[]){"forgotten", NULL}, 10))) fail = "/chat reset";
    at = t->len;
    if (ok && !(ok = step(t, "Hello there.\n", (const char *[]){"-- turn 1: ", "chat> ", NULL}, 30))) fail = "turn 1 again";
    if (ok) n3 = turn_prompt(t, at, 1);
    if (ok && !(ok = n3 == n1)) fail = "/chat reset kept something";
    /* chat off: Lua again */
    if (ok && !(ok = step(t, "/chat off\n", (const char *[]){"chat off", NULL}, 10))) fail = "/chat off";
    if (ok && !(ok = step(t, "40 + 2\n", (const char *[]){"42", NULL}, 10))) fail = "Lua after chat";
    finish(t);
    kt_rmdir(home);
    KT_CHECK(ok, "%s (prompt tokens %d, %d, %d): the REPL did not answer as expected; screen so far:\n%s", fail, n1, n2, n3,
             t->buf);
}
