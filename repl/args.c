/* args.c — strict parsing of every number given on the kvsieve command line.
 *
 * atoi/atof accept "abc" as 0, wrap 99999999999 and take "nan" or "-1" for a temperature;
 * these helpers take a value only when the whole text is a number (no leading blanks, no
 * trailing junk), it fits the destination type, and it lies in the option's range. On
 * failure they print one line, "kvsieve: OPTION expects ..., got "TEXT"", naming the range,
 * and return -1, so that a caller writes `if (ks_arg_int(...)) return -1;`. */
#include "cli.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

/* Parse text[0..len) as a base-10 integer in [lo, hi], with an optional K (x1024) suffix when
 * allow_k. 0 on success. The text is copied so that strtoll stops at len, not at a comma. */
static int parse_ll(const char *text, size_t len, long long lo, long long hi, int allow_k, long long *out) {
    char buf[64];
    if (len == 0 || len >= sizeof buf) return -1;
    memcpy(buf, text, len);
    buf[len] = 0;
    if (!(isdigit((unsigned char)buf[0]) || ((buf[0] == '-' || buf[0] == '+') && isdigit((unsigned char)buf[1]))))
        return -1; /* strtoll would skip blanks and take "" as 0 */
    char *end;
    errno = 0;
    long long v = strtoll(buf, &end, 10);
    if (errno == ERANGE) return -1;
    if (allow_k && (*end == 'K' || *end == 'k')) {
        if (v > LLONG_MAX / 1024 || v < LLONG_MIN / 1024) return -1; /* the product would overflow */
        v *= 1024;
        end++;
    }
    if (*end || v < lo || v > hi) return -1;
    *out = v;
    return 0;
}

int ks_arg_int(const char *opt, const char *v, int lo, int hi, int *out) {
    long long x;
    if (!v || parse_ll(v, strlen(v), lo, hi, 0, &x)) {
        fprintf(stderr, "kvsieve: %s expects an integer in %d..%d, got \"%s\"\n", opt, lo, hi, v ? v : "");
        return -1;
    }
    *out = (int)x;
    return 0;
}

int ks_arg_u64(const char *opt, const char *v, uint64_t *out) {
    /* decimal or 0x-hex; strtoull would also take "-1" (as 2^64 - 1) and leading blanks */
    int ok = v && isdigit((unsigned char)v[0]);
    if (ok) {
        char *end;
        errno = 0;
        unsigned long long x = strtoull(v, &end, 0);
        ok = errno != ERANGE && !*end && end != v;
        if (ok) *out = (uint64_t)x;
    }
    if (!ok)
        fprintf(stderr, "kvsieve: %s expects an integer in 0..18446744073709551615 (decimal or 0x hex), got \"%s\"\n",
                opt, v ? v : "");
    return ok ? 0 : -1;
}

int ks_arg_double(const char *opt, const char *v, double lo, double hi, int lo_open, double *out) {
    int ok = v && *v && !isspace((unsigned char)v[0]);
    double x = 0;
    if (ok) {
        char *end;
        errno = 0;
        x = strtod(v, &end);
        /* NaN fails every comparison, so it never lies in a range; overflow is ERANGE with
         * +-HUGE_VAL (underflow to a tiny number is fine) */
        ok = !*end && end != v && isfinite(x) && (lo_open ? x > lo : x >= lo) && x <= hi;
    }
    if (!ok) {
        if (isinf(hi))
            fprintf(stderr, "kvsieve: %s expects a finite number %s %g, got \"%s\"\n", opt, lo_open ? ">" : ">=", lo,
                    v ? v : "");
        else
            fprintf(stderr, "kvsieve: %s expects a number in %c%g, %g], got \"%s\"\n", opt, lo_open ? '(' : '[', lo, hi,
                    v ? v : "");
        return -1;
    }
    *out = x;
    return 0;
}

int ks_arg_float(const char *opt, const char *v, double lo, double hi, int lo_open, float *out) {
    double x;
    if (ks_arg_double(opt, v, lo, hi, lo_open, &x)) return -1;
    *out = (float)x;
    return 0;
}

int ks_arg_int_list(const char *opt, const char *v, int lo, int hi, int allow_k, int *out, int max, int *n) {
    *n = 0;
    const char *p = v ? v : "";
    for (;;) {
        const char *e = strchr(p, ',');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        long long x;
        if (parse_ll(p, len, lo, hi, allow_k, &x)) {
            int list = v && strchr(v, ','); /* name the whole list only when it has several values */
            fprintf(stderr, "kvsieve: %s expects a comma-separated list of integers in %d..%d%s, got \"%.*s\"%s%s%s\n",
                    opt, lo, hi, allow_k ? " (K = x1024)" : "", (int)len, p, list ? " in \"" : "", list ? v : "",
                    list ? "\"" : "");
            return -1;
        }
        if (*n >= max) {
            fprintf(stderr, "kvsieve: %s takes at most %d values, got more in \"%s\"\n", opt, max, v);
            return -1;
        }
        out[(*n)++] = (int)x;
        if (!e) return 0;
        p = e + 1;
    }
}

int ks_arg_ids(const char *opt, const char *v, int32_t **ids, int *n) {
    *ids = NULL;
    *n = 0;
    int cap = 0, k = 0;
    int32_t *a = NULL;
    const char *p = v ? v : "";
    for (;;) {
        while (*p == ',' || *p == ' ') p++; /* "1,2,3", "1 2 3" and "1, 2" alike */
        if (!*p) break;
        size_t len = strcspn(p, ", ");
        long long x;
        if (parse_ll(p, len, 0, INT32_MAX, 0, &x)) {
            fprintf(stderr, "kvsieve: %s expects token ids in 0..%d separated by commas, got \"%.*s\"\n", opt, INT32_MAX,
                    (int)len, p);
            free(a);
            return -1;
        }
        if (k == cap) {
            if (cap > INT_MAX / 4) { free(a); fprintf(stderr, "kvsieve: %s: too many ids\n", opt); return -1; }
            int nc = cap ? 2 * cap : 16;
            int32_t *w = realloc(a, sizeof *w * (size_t)nc);
            if (!w) { free(a); fprintf(stderr, "kvsieve: %s: out of memory\n", opt); return -1; }
            a = w;
            cap = nc;
        }
        a[k++] = (int32_t)x;
        p += len;
    }
    if (!k) {
        fprintf(stderr, "kvsieve: %s expects a comma-separated list of token ids, got \"%s\"\n", opt, v ? v : "");
        free(a);
        return -1;
    }
    *ids = a;
    *n = k;
    return 0;
}

/* ---------------------------------------------------------------- prompt files, policy checks */

#include "kvsieve.h"

int ks_cli_read_text(const char *path, char **out, size_t *n) {
    int is_stdin = !strcmp(path, "-");
    const char *name = is_stdin ? "stdin" : path;
    FILE *f = is_stdin ? stdin : fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "kvsieve: cannot read the prompt file %s: %s\n", path, strerror(errno));
        return -1;
    }
    size_t len = 0, cap = 1 << 16;
    char *b = malloc(cap);
    int err = 0;
    while (b) {
        if (cap - len < 2) { /* room for one more byte and the NUL */
            char *w = cap < ((size_t)1 << 40) ? realloc(b, cap * 2) : NULL;
            if (!w) { free(b); b = NULL; break; }
            b = w;
            cap *= 2;
        }
        size_t got = fread(b + len, 1, cap - 1 - len, f);
        len += got;
        if (got == 0) { err = ferror(f); break; }
    }
    int saved = errno;
    if (!is_stdin) fclose(f);
    if (!b) { fprintf(stderr, "kvsieve: the prompt in %s does not fit in memory\n", name); return -1; }
    if (err) {
        fprintf(stderr, "kvsieve: cannot read the prompt from %s: %s\n", name, strerror(saved));
        free(b);
        return -1;
    }
    b[len] = 0;
    const char *nul = memchr(b, 0, len);
    if (nul) {
        fprintf(stderr, "kvsieve: the prompt in %s holds a NUL byte (offset %zu): not text\n", name, (size_t)(nul - b));
        free(b);
        return -1;
    }
    /* one trailing newline is the file's end, not the prompt's (as an editor or echo writes it) */
    if (len && b[len - 1] == '\n') b[--len] = 0;
    if (len && b[len - 1] == '\r') b[--len] = 0;
    *out = b;
    if (n) *n = len;
    return 0;
}

int ks_cli_check_policy(ks_model *m, ks_policy *p, const char *what) {
    if (!p) return 0;
    if (ks_policy_check(p, m)) { ks_cli_fail(what); return -1; }
    return 0;
}

int ks_cli_apply_sets(ks_policy *p, const char *name, const char *const *sets, int n_sets, int strict) {
    for (int i = 0; i < n_sets; i++) {
        char key[256];
        const char *kk = sets[i], *eq = strchr(kk, '='), *dot = strchr(kk, '.');
        if (!eq || eq == kk || (size_t)(eq - kk) >= sizeof key) {
            fprintf(stderr, "kvsieve: --set expects [policy.]key=value, got \"%s\"\n", kk);
            return -1;
        }
        int scoped = dot && dot < eq;
        if (scoped) {
            if ((size_t)(dot - kk) != strlen(name) || strncmp(kk, name, (size_t)(dot - kk))) {
                if (!strict) continue; /* another policy's */
                fprintf(stderr, "kvsieve: --set %s: the policy is %s, not %.*s\n", sets[i], name, (int)(dot - kk), kk);
                return -1;
            }
            kk = dot + 1;
        }
        memcpy(key, kk, (size_t)(eq - kk));
        key[eq - kk] = 0;
        if (ks_policy_set(p, key, eq + 1) && (scoped || strict)) {
            ks_cli_fail("--set");
            return -1;
        }
    }
    return 0;
}

int ks_cli_check_writable(const char *what, const char *path) {
    if (access(path, F_OK) == 0) {
        if (access(path, W_OK) == 0) return 0;
        fprintf(stderr, "kvsieve: %s %s: cannot write: %s\n", what, path, strerror(errno));
        return -1;
    }
    FILE *f = fopen(path, "wb"); /* a new file: its folder must take it; removed again */
    if (!f) {
        fprintf(stderr, "kvsieve: %s %s: cannot write: %s\n", what, path, strerror(errno));
        return -1;
    }
    fclose(f);
    remove(path);
    return 0;
}

double ks_cli_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + t.tv_nsec * 1e-9;
}

size_t ks_cli_peak_rss(void) {
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) != 0) return 0;
    return (size_t)ru.ru_maxrss * 1024; /* Linux: kilobytes */
}
