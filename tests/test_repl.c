/* test_repl.c — drives `kvsieve repl` through a pseudo-terminal as a person would: load
 * stories260K, run a prompt with a policy, show the kept tokens, interrupt a long run with
 * Ctrl-C, and carry on in the same REPL. Needs KS_BIN (set by `make test`) and ../shared. */
#include "ktest.h"

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
