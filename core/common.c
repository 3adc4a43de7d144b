/* common.c — error recording, checked allocation, file reading, timing. */
#include "common.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static _Thread_local char g_err[2048];

const char *ks_last_error(void) { return g_err; }
void ks_clear_error(void) { g_err[0] = 0; }

ks_status ks_errorf(ks_status st, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_err, sizeof g_err, fmt, ap);
    va_end(ap);
    return st;
}

ks_status ks_error_prefix(ks_status st, const char *fmt, ...) {
    char old[sizeof g_err], pre[512];
    memcpy(old, g_err, sizeof old);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(pre, sizeof pre, fmt, ap);
    va_end(ap);
    size_t pl = strlen(pre);
    if (pl + 2 >= sizeof g_err) pl = sizeof g_err - 3;
    memcpy(g_err, pre, pl);
    g_err[pl] = ':';
    g_err[pl + 1] = ' ';
    size_t ol = strnlen(old, sizeof g_err - pl - 3);
    memcpy(g_err + pl + 2, old, ol);
    g_err[pl + 2 + ol] = 0;
    return st;
}

const char *ks_status_name(ks_status s) {
    static const char *names[] = {"ok", "io", "format", "shape", "dtype", "unsupported", "oom",
                                  "arg", "context", "policy", "interrupted", "device", "internal"};
    return (unsigned)s < sizeof names / sizeof names[0] ? names[s] : "unknown";
}

void *ks_malloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) ks_errorf(KS_ERR_OOM, "out of host memory (asked for %zu bytes)", n);
    return p;
}

void *ks_calloc(size_t n, size_t size) {
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (!p) ks_errorf(KS_ERR_OOM, "out of host memory (asked for %zu x %zu bytes)", n, size);
    return p;
}

void *ks_realloc(void *p, size_t n) {
    void *q = realloc(p, n ? n : 1);
    if (!q) ks_errorf(KS_ERR_OOM, "out of host memory (asked for %zu bytes)", n);
    return q;
}

char *ks_strdup(const char *s) {
    size_t n = strlen(s) + 1;
    char *p = ks_malloc(n);
    if (p) memcpy(p, s, n);
    return p;
}

ks_status ks_read_file(const char *path, char **data, size_t *len) {
    *data = NULL;
    if (len) *len = 0;
    FILE *f = fopen(path, "rb");
    if (!f) return ks_errorf(KS_ERR_IO, "cannot open %s: %s", path, strerror(errno));
    /* The size comes from fstat, not from fseek/ftell: on a directory (fopen succeeds on
     * Linux) ftell says LLONG_MAX and the buffer below would ask for 9.2e18 bytes; a pipe or
     * a device has no size at all. Only regular files are read whole. */
    struct stat sb;
    if (fstat(fileno(f), &sb) != 0) {
        int e = errno;
        fclose(f);
        return ks_errorf(KS_ERR_IO, "cannot stat %s: %s", path, strerror(e));
    }
    if (S_ISDIR(sb.st_mode)) { fclose(f); return ks_errorf(KS_ERR_IO, "%s is a directory, not a file", path); }
    if (!S_ISREG(sb.st_mode)) { fclose(f); return ks_errorf(KS_ERR_IO, "%s is not a regular file", path); }
    if (sb.st_size < 0 || (uint64_t)sb.st_size >= SIZE_MAX) {
        fclose(f);
        return ks_errorf(KS_ERR_IO, "cannot size %s", path);
    }
    size_t sz = (size_t)sb.st_size;
    char *buf = ks_malloc(sz + 1);
    if (!buf) { fclose(f); return ks_error_prefix(KS_ERR_OOM, "reading %s", path); }
    /* a file that shrank since fstat reads short: an error, not a half-read file */
    if (sz > 0 && fread(buf, 1, sz, f) != sz) {
        free(buf);
        fclose(f);
        return ks_errorf(KS_ERR_IO, "cannot read %s", path);
    }
    fclose(f);
    buf[sz] = 0;
    *data = buf;
    if (len) *len = sz;
    return KS_OK;
}

size_t ks_mem_limit(void) {
    /* physical memory, lowered by an address-space limit (ulimit -v) when one is set */
    long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
    uint64_t lim = (pages > 0 && psz > 0) ? (uint64_t)pages * (uint64_t)psz : 0;
    struct rlimit rl;
    if (getrlimit(RLIMIT_AS, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY && (!lim || (uint64_t)rl.rlim_cur < lim))
        lim = (uint64_t)rl.rlim_cur;
    return lim > SIZE_MAX ? SIZE_MAX : (size_t)lim;
}

double ks_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

size_t ks_peak_rss(void) {
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) != 0) return 0;
    return (size_t)ru.ru_maxrss * 1024; /* Linux: kilobytes */
}

float ks_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, mant = h & 0x3ff, u;
    if (exp == 0) {
        if (mant == 0) u = sign;
        else { /* subnormal: normalise */
            exp = 127 - 15 + 1;
            while (!(mant & 0x400)) { mant <<= 1; exp--; }
            mant &= 0x3ff;
            u = sign | (exp << 23) | (mant << 13);
        }
    } else if (exp == 31) u = sign | 0x7f800000u | (mant << 13);
    else u = sign | ((exp + 127 - 15) << 23) | (mant << 13);
    union { uint32_t u; float f; } v; v.u = u; return v.f;
}

uint16_t ks_f32_to_bf16(float f) {
    union { uint32_t u; float f; } v; v.f = f;
    if ((v.u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((v.u >> 16) | 0x40); /* NaN */
    uint32_t r = v.u + 0x7fffu + ((v.u >> 16) & 1);
    return (uint16_t)(r >> 16);
}
