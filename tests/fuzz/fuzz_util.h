/* fuzz_util.h — helpers shared by the libFuzzer harnesses of tests/fuzz/ (header only; each
 * harness is one translation unit linked against the sanitized library build-fuzz/libkvsieve.a).
 *
 *   fz_workdir()          a private temp folder (mkdtemp under $TMPDIR or /tmp), made on first
 *                         use and removed at exit: harnesses that must hand the library a file
 *                         or a folder write the fuzz input there
 *   fz_write(dir, name, data, n)   write one file (0 on success)
 *   fz_clear(dir)         remove every file of the folder (one level), keep the folder
 *   fz_split(...)         cut an input into parts at a separator line (the multi-file harnesses:
 *                         config.json + safetensors, index + shards)
 *   fz_shared_dir()       ../shared as seen from the repository root, or $KS_SHARED (a test tool:
 *                         getenv is fine here, never in the library)
 *   fz_quiet()            silence the library's own stderr logging where it has a switch
 *
 * Harnesses run from the repository root (the Makefile's `fuzz` target does): the real files
 * they load at init (tokenizers, models) are found by relative paths. */
#ifndef KS_FUZZ_UTIL_H
#define KS_FUZZ_UTIL_H

#include <dirent.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char fz_dir_[512];

static void fz_rm_tree_(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    char p[1024];
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        struct stat sb;
        if (lstat(p, &sb) == 0 && S_ISDIR(sb.st_mode)) {
            fz_rm_tree_(p);
            rmdir(p);
        } else unlink(p);
    }
    closedir(d);
}

static void fz_cleanup_(void) {
    if (!fz_dir_[0]) return;
    fz_rm_tree_(fz_dir_);
    rmdir(fz_dir_);
}

/* The harness's private temp folder (aborts when none can be made: nothing to fuzz then). */
static inline const char *fz_workdir(void) {
    if (fz_dir_[0]) return fz_dir_;
    const char *t = getenv("TMPDIR");
    snprintf(fz_dir_, sizeof fz_dir_, "%s/ksfuzz-XXXXXX", t && *t ? t : "/tmp");
    if (!mkdtemp(fz_dir_)) {
        perror("fuzz: mkdtemp");
        abort();
    }
    atexit(fz_cleanup_);
    return fz_dir_;
}

static inline void fz_clear(const char *dir) { fz_rm_tree_(dir); }

static inline int fz_write(const char *dir, const char *name, const void *data, size_t n) {
    char p[1024];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    FILE *f = fopen(p, "wb");
    if (!f) return -1;
    size_t w = n ? fwrite(data, 1, n, f) : 0;
    int rc = fclose(f);
    return w == n && rc == 0 ? 0 : -1;
}

/* Split data at each occurrence of sep (not included in the parts) into at most max parts;
 * the last part takes the rest. Returns the number of parts (>= 1). */
static inline int fz_split(const uint8_t *data, size_t size, const char *sep, const uint8_t **part, size_t *len, int max) {
    size_t sl = strlen(sep), start = 0;
    int np = 0;
    for (size_t i = 0; np < max - 1 && i + sl <= size;) {
        if (!memcmp(data + i, sep, sl)) {
            part[np] = data + start;
            len[np++] = i - start;
            i += sl;
            start = i;
        } else i++;
    }
    part[np] = data + start;
    len[np++] = size - start;
    return np;
}

static inline const char *fz_shared_dir(void) {
    const char *e = getenv("KS_SHARED");
    return e && *e ? e : "../shared";
}

static inline int fz_exists(const char *path) { return access(path, R_OK) == 0; }

#endif
